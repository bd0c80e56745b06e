/* The command's progress bar: see progress.h. */
#include "progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static gboolean quiet;

void progress_set_quiet(gboolean q)
{
    quiet = q;
}

/* n in the counter's unit, short: "912", "12.3 k", "4.56 M" (counts) or "12.3 MB". */
static void amount(char *buf, gsize size, double n, ProgressUnit kind)
{
    static const char *const si[] = {"", " k", " M", " G", " T"};
    static const char *const bytes[] = {" B", " kB", " MB", " GB", " TB"};
    int i = 0;
    while (n >= 1000 && i < 4) {
        n /= 1000;
        i++;
    }
    const char *suffix = kind == PROGRESS_BYTES ? bytes[i] : si[i];
    if (i == 0 && (n >= 10 || n == (double)(guint64)n))
        g_snprintf(buf, size, "%.0f%s", n, suffix);
    else if (i == 0)
        g_snprintf(buf, size, "%.1f%s", n, suffix);
    else
        g_snprintf(buf, size, "%.*f%s", n < 10 ? 2 : n < 100 ? 1 : 0, n, suffix);
}

static void duration(char *buf, gsize size, double s)
{
    if (s < 60)
        g_snprintf(buf, size, "%.0f s", s);
    else if (s < 3600)
        g_snprintf(buf, size, "%d min %02d s", (int)(s / 60), (int)s % 60);
    else
        g_snprintf(buf, size, "%d h %02d min", (int)(s / 3600), (int)(s / 60) % 60);
}

static void draw(Progress *p, double secs)
{
    const char *phase = __atomic_load_n(&p->phase, __ATOMIC_RELAXED);
    char line[256], took[32];
    duration(took, sizeof took, secs);
    if (!p->count) {
        g_snprintf(line, sizeof line, "memsim: %s… %s", phase, took);
    } else {
        guint64 done = __atomic_load_n(p->count, __ATOMIC_RELAXED);
        guint64 total = p->total ? __atomic_load_n(p->total, __ATOMIC_RELAXED) : 0;
        const char *unit = p->kind == PROGRESS_COUNT && p->unit ? p->unit : "";
        const char *sep = *unit ? " " : "";
        char d[32], t[32], r[32];
        double rate = secs > 0 ? (double)done / secs : 0;
        amount(d, sizeof d, (double)done, p->kind);
        amount(r, sizeof r, rate, p->kind);
        if (total && done <= total) {
            char bar[31], eta[32];
            int fill = (int)(done * 30 / total);
            for (int i = 0; i < 30; i++)
                bar[i] = i < fill ? '#' : '.';
            bar[30] = '\0';
            amount(t, sizeof t, (double)total, p->kind);
            if (rate > 0)
                duration(eta, sizeof eta, (double)(total - done) / rate);
            else
                g_strlcpy(eta, "?", sizeof eta);
            g_snprintf(line, sizeof line, "memsim: %s [%s] %s/%s%s%s, %s%s%s/s, ETA %s, %s",
                       phase, bar, d, t, sep, unit, r, sep, unit, eta, took);
        } else {
            g_snprintf(line, sizeof line, "memsim: %s… %s%s%s, %s%s%s/s, %s", phase, d, sep,
                       unit, r, sep, unit, took);
        }
    }
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
}

/* How long work runs before the bar shows: a second, or MEMSIM_PROGRESS_DELAY_MS (which also
 * redraws it that often, when under a quarter of a second). */
static gint64 first_delay_us(void)
{
    const char *env = g_getenv("MEMSIM_PROGRESS_DELAY_MS");
    char *end;
    if (env && *env) {
        guint64 ms = g_ascii_strtoull(env, &end, 10);
        if (!*end && ms <= 3600000)
            return (gint64)ms * 1000;
    }
    return 1000000;
}

static gpointer progress_main(gpointer data)
{
    Progress *p = data;
    gint64 start = g_get_monotonic_time(), delay = first_delay_us();
    /* redrawn four times a second, or as often as a shorter first delay says (10 ms at
     * least: a test's short work still shows the bar with its total) */
    gint64 every = MAX(MIN(delay, 250000), 10000);
    g_mutex_lock(&p->lock);
    while (!p->done) {
        gint64 until = g_get_monotonic_time() + (p->shown ? every : delay);
        while (!p->done && g_cond_wait_until(&p->cond, &p->lock, until))
            ;
        if (p->done)
            break;
        draw(p, (double)(g_get_monotonic_time() - start) / 1e6);
        p->shown = TRUE;
    }
    if (p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    g_mutex_unlock(&p->lock);
    return NULL;
}

void progress_start(Progress *p, const char *phase, const char *unit, ProgressUnit kind,
                    const guint64 *count, const guint64 *total)
{
    memset(p, 0, sizeof *p);
    if (quiet || !isatty(STDERR_FILENO))
        return;
    g_mutex_init(&p->lock);
    g_cond_init(&p->cond);
    p->phase = phase;
    p->unit = unit;
    p->kind = kind;
    p->count = count;
    p->total = total;
    if (first_delay_us() == 0) { /* no delay: the first line now, before the work starts */
        draw(p, 0);
        p->shown = TRUE;
    }
    p->thread = g_thread_new("progress", progress_main, p);
}

void progress_phase(Progress *p, const char *phase)
{
    __atomic_store_n(&p->phase, phase, __ATOMIC_RELAXED);
}

void progress_stop(Progress *p)
{
    if (!p->thread)
        return;
    g_mutex_lock(&p->lock);
    p->done = TRUE;
    g_cond_signal(&p->cond);
    g_mutex_unlock(&p->lock);
    g_thread_join(p->thread);
    g_mutex_clear(&p->lock);
    g_cond_clear(&p->cond);
    p->thread = NULL;
}
