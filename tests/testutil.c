#include "testutil.h"

#include <criterion/criterion.h>
#include <memsim/gen.h>
#include <criterion/hooks.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* Skips are visible: each skipped test is printed with its reason (and appended to
 * $MEMSIM_SKIP_LOG, which tools/run-tests.sh lists and counts), and a suite all of whose tests
 * were skipped exits 77, which meson reports as SKIP rather than OK. */
void tu_note_skip(const char *what, const char *why)
{
    fprintf(stderr, "SKIP %s: %s\n", what, why);
    const char *log = getenv("MEMSIM_SKIP_LOG");
    FILE *f = log && *log ? fopen(log, "a") : NULL;
    if (f) {
        fprintf(f, "%s: %s\n", what, why);
        fclose(f);
    }
}

ReportHook(POST_TEST)(struct criterion_test_stats *st)
{
    if (st->test_status != CR_STATUS_SKIPPED)
        return;
    char what[256];
    snprintf(what, sizeof what, "%s/%s", st->test->category, st->test->name);
    tu_note_skip(what, st->message && *st->message ? st->message : "no reason given");
}

ReportHook(POST_ALL)(struct criterion_global_stats *st)
{
    if (st->nb_tests > 0 && st->tests_skipped == st->nb_tests) {
        fprintf(stderr, "SKIP: every test of this suite was skipped\n");
        fflush(NULL);
        _Exit(77);
    }
}

const char *tu_shared_data(void)
{
    const char *d = g_getenv("MEMSIM_SHARED_DATA");
    if (!d || !g_file_test(d, G_FILE_TEST_IS_DIR))
        return NULL;
    return d;
}

char *tu_shared_path_or_skip(const char *relative)
{
    const char *d = tu_shared_data();
    if (!d) {
        cr_skip_test("shared data folder absent (MEMSIM_SHARED_DATA=%s): real-snapshot test "
                     "skipped",
                     g_getenv("MEMSIM_SHARED_DATA") ? g_getenv("MEMSIM_SHARED_DATA") : "unset");
        return NULL;
    }
    return g_build_filename(d, relative, NULL);
}

char *tu_test_data(const char *relative)
{
    const char *d = g_getenv("MEMSIM_TEST_DATA");
    cr_assert(d != NULL, "MEMSIM_TEST_DATA not set (run the tests through meson test)");
    return g_build_filename(d, relative, NULL);
}

int tu_run(const char *const *argv, const char *const *env, char **out, char **err)
{
    g_auto(GStrv) envp = g_get_environ();
    for (const char *const *e = env; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        g_autofree char *k = g_strndup(*e, (gsize)(eq - *e));
        envp = g_environ_setenv(envp, k, eq + 1, TRUE);
    }
    int status = 0;
    GError *error = NULL;
    char *o = NULL, *e = NULL;
    gboolean ok = g_spawn_sync(NULL, (char **)argv, envp, G_SPAWN_SEARCH_PATH, NULL, NULL, &o,
                               &e, &status, &error);
    cr_assert(ok, "could not run %s: %s", argv[0], error ? error->message : "?");
    if (out)
        *out = o;
    else
        g_free(o);
    if (err)
        *err = e;
    else
        g_free(e);
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int tu_run_memsim(const char *const *argv, char **out, char **err)
{
    const char *bin = g_getenv("MEMSIM_BIN");
    cr_assert(bin != NULL, "MEMSIM_BIN not set (run the tests through meson test)");
    GPtrArray *args = g_ptr_array_new();
    g_ptr_array_add(args, (gpointer)bin);
    for (const char *const *a = argv; *a; a++)
        g_ptr_array_add(args, (gpointer)*a);
    g_ptr_array_add(args, NULL);
    int rc = tu_run((const char *const *)args->pdata, NULL, out, err);
    g_ptr_array_free(args, TRUE);
    return rc;
}

char *tu_tmpdir(void)
{
    GError *error = NULL;
    char *d = g_dir_make_tmp("memsim-test-XXXXXX", &error);
    cr_assert(d != NULL, "mkdtemp: %s", error ? error->message : "?");
    return d;
}

gboolean tu_sanitized(void)
{
    const char *s = g_getenv("MEMSIM_SANITIZE");
    return s && *s && strcmp(s, "none") != 0;
}

MemsimTrace *tu_generate(const char *model, const char *const *settings)
{
    GError *error = NULL;
    MemsimModel *m = memsim_model_load(model, &error);
    cr_assert(m, "%s: %s", model, error ? error->message : "?");
    MemsimRun run = memsim_run_defaults();
    for (const char *const *s = settings; s && *s; s += 2) {
        gboolean ok = memsim_run_set(&run, s[0], s[1], &error);
        cr_assert(ok, "%s=%s: %s", s[0], s[1], ok ? "" : error->message);
    }
    MemsimTrace *t = memsim_generate(m, &run, &error);
    cr_assert(t, "%s: %s", model, error ? error->message : "?");
    memsim_run_clear(&run);
    memsim_model_free(m);
    return t;
}

double tu_limit_s(void)
{
    return tu_sanitized() ? 20.0 : 5.0;
}

double tu_limit_mib(void)
{
    return tu_sanitized() ? 2000.0 : 500.0;
}

double tu_children_peak_mib(void)
{
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_CHILDREN, &ru), 0);
    return (double)ru.ru_maxrss / 1024.0;
}

double tu_children_cpu_s(void)
{
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_CHILDREN, &ru), 0);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

GByteArray *tu_none_flood_pickle(gsize n, gsize batch)
{
    GByteArray *b = g_byte_array_sized_new((guint)(n + n / (batch ? batch : n) * 2 + 16));
    g_byte_array_append(b, (const guint8 *)"\x80\x02]", 3);
    for (gsize done = 0; done < n;) {
        gsize run = batch ? MIN(batch, n - done) : n;
        g_byte_array_append(b, (const guint8 *)"(", 1);
        guint len = b->len;
        g_byte_array_set_size(b, len + (guint)run);
        memset(b->data + len, 'N', run);
        g_byte_array_append(b, (const guint8 *)"e", 1);
        done += run;
    }
    g_byte_array_append(b, (const guint8 *)".", 1);
    return b;
}

/* ---- comparisons with real recordings ---- */

#define REFERENCE_PYTHON "/usr/bin/python3"

char *tu_record_reference(const char *script)
{
    if (!g_file_test(REFERENCE_PYTHON, G_FILE_TEST_IS_EXECUTABLE)) {
        cr_skip_test("%s is absent: cannot record the PyTorch reference", REFERENCE_PYTHON);
        return NULL;
    }
    const char *probe[] = {REFERENCE_PYTHON, "-c", "import torch", NULL};
    int st = 0;
    g_spawn_sync(NULL, (char **)probe, NULL, G_SPAWN_STDERR_TO_DEV_NULL, NULL, NULL, NULL, NULL,
                 &st, NULL);
    if (!g_spawn_check_wait_status(st, NULL)) {
        cr_skip_test("python3-torch is not installed (apt-get install python3-torch): the "
                     "PyTorch reference cannot be recorded");
        return NULL;
    }
    char *dir = tu_tmpdir();
    g_autofree char *path =
        g_build_filename(g_getenv("MEMSIM_SOURCE_ROOT"), "tests", "reference", script, NULL);
    const char *argv[] = {REFERENCE_PYTHON, path, dir, NULL};
    g_autofree char *out = NULL, *err = NULL;
    GError *error = NULL;
    gboolean ok = g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_DEFAULT, NULL, NULL, &out, &err,
                               &st, &error);
    cr_assert(ok && g_spawn_check_wait_status(st, NULL), "recording failed: %s\n%s",
              error ? error->message : "", err);
    return dir;
}

MemsimModel *tu_case_load(JsonObject *c, const char *dir, MemsimRun *run)
{
    const char *name = json_object_get_string_member(c, "case");
    g_autoptr(JsonGenerator) gen = json_generator_new();
    json_generator_set_root(gen, json_object_get_member(c, "config"));
    g_autofree char *cfg = g_strdup_printf("%s/%s.config.json", dir, name);
    cr_assert(json_generator_to_file(gen, cfg, NULL));
    GError *error = NULL;
    MemsimModel *m = memsim_model_load(cfg, &error);
    cr_assert(m, "%s: %s", name, error ? error->message : "?");
    static const char *const sizes[] = {"batch", "seq", "steps"};
    for (gsize i = 0; i < G_N_ELEMENTS(sizes); i++) {
        char buf[32];
        g_snprintf(buf, sizeof buf, "%" G_GINT64_FORMAT, json_object_get_int_member(c, sizes[i]));
        tu_set(run, sizes[i], buf);
    }
    return m;
}

void tu_set(MemsimRun *run, const char *key, const char *value)
{
    GError *e = NULL;
    gboolean ok = memsim_run_set(run, key, value, &e);
    cr_assert(ok, "%s=%s: %s", key, value, ok ? "" : e->message);
}

const MemsimStepPeaks *tu_step_of(const MemsimRankReport *r, uint32_t step)
{
    for (guint i = 0; i < r->n_steps; i++)
        if (r->steps[i].step == step)
            return &r->steps[i];
    return NULL;
}

void tu_category_peaks(MemsimTrace *t, guint32 rank,
                       TuPhasePeak peaks[TU_MAX_STEPS][MEMSIM_PHASE_COUNT])
{
    memset(peaks, 0, sizeof(TuPhasePeak) * TU_MAX_STEPS * MEMSIM_PHASE_COUNT);
    MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, rank, &n);
    GHashTable *live = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    TuPhasePeak now = {0};
    int step = 0, phase = -1;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind == MEMSIM_EV_OP && ev[i].id < h->n_ops) {
            int ph = h->ops[ev[i].id].phase;
            if (ph == MEMSIM_PHASE_FORWARD && phase != MEMSIM_PHASE_FORWARD)
                step++;
            phase = ph;
        } else if (ev[i].kind == MEMSIM_EV_ALLOC) {
            int c = ev[i].category == MEMSIM_CAT_KV_CACHE ||
                            ev[i].category == MEMSIM_CAT_TEMPORARY ||
                            ev[i].category == MEMSIM_CAT_COMM_BUFFER
                        ? MEMSIM_CAT_ACTIVATION
                        : ev[i].category;
            int64_t *k = g_new(int64_t, 1), *v = g_new(int64_t, 2);
            *k = (int64_t)ev[i].id;
            v[0] = (int64_t)ev[i].size;
            v[1] = c;
            g_hash_table_replace(live, k, v);
            now.total += v[0];
            now.cat[c] += v[0];
            if (step > 0 && step < TU_MAX_STEPS && phase >= 0 &&
                now.total > peaks[step][phase].total)
                peaks[step][phase] = now;
        } else if (ev[i].kind == MEMSIM_EV_FREE) {
            int64_t k = (int64_t)ev[i].id;
            int64_t *v = g_hash_table_lookup(live, &k);
            if (v) {
                now.total -= v[0];
                now.cat[v[1]] -= v[0];
                g_hash_table_remove(live, &k);
            }
        }
    }
    g_hash_table_unref(live);
}

/* The most bytes of category `cat` the program of rank 0 holds at once (between its ALLOC
 * and FREE events, the program's view), over the events of `phase` (or all, with -1). */
int64_t tu_peak_live(MemsimTrace *t, uint8_t cat, int phase)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    MemsimTraceHeader *h = memsim_trace_header(t);
    GHashTable *size = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    int64_t live = 0, best = 0;
    int cur = -1;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind == MEMSIM_EV_OP) {
            cur = h->ops[ev[i].id].phase;
        } else if (ev[i].kind == MEMSIM_EV_ALLOC && ev[i].category == cat) {
            int64_t *k = g_new(int64_t, 1);
            *k = (int64_t)ev[i].id;
            g_hash_table_insert(size, k, GSIZE_TO_POINTER((gsize)ev[i].size));
            live += (int64_t)ev[i].size;
        } else if (ev[i].kind == MEMSIM_EV_FREE) {
            int64_t k = (int64_t)ev[i].id;
            gpointer v;
            if (g_hash_table_lookup_extended(size, &k, NULL, &v)) {
                live -= (int64_t)GPOINTER_TO_SIZE(v);
                g_hash_table_remove(size, &k);
            }
        }
        if ((phase < 0 || cur == phase) && live > best)
            best = live;
    }
    g_hash_table_unref(size);
    return best;
}
