/* The progress bar: drawn on stderr when stderr is a terminal (a pseudo-terminal here),
 * never otherwise, never with --quiet, and standard output (--json) the same either way. */
#define _XOPEN_SOURCE 600
#include "testutil.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    int status;
    GString *out, *err;
} Ran;

/* Runs memsim with `args`, stdout to a pipe and stderr to a pseudo-terminal (tty) or to a
 * pipe, the bar's delay set to 0 ms so that it draws at once. */
static Ran run(const char *const *args, gboolean tty)
{
    const char *bin = g_getenv("MEMSIM_BIN");
    cr_assert(bin, "MEMSIM_BIN not set (run the tests through meson test)");
    int out[2], err[2] = {-1, -1};
    cr_assert_eq(pipe(out), 0);
    if (tty) {
        int master = posix_openpt(O_RDWR | O_NOCTTY);
        cr_assert_geq(master, 0, "posix_openpt");
        cr_assert_eq(grantpt(master), 0);
        cr_assert_eq(unlockpt(master), 0);
        int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
        cr_assert_geq(slave, 0, "open the pty's slave");
        err[0] = master;
        err[1] = slave;
    } else {
        cr_assert_eq(pipe(err), 0);
    }
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork");
    if (pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        close(out[0]);
        close(out[1]);
        close(err[0]);
        close(err[1]);
        setenv("MEMSIM_PROGRESS_DELAY_MS", "0", 1);
        GPtrArray *argv = g_ptr_array_new();
        g_ptr_array_add(argv, (gpointer)bin);
        for (const char *const *a = args; *a; a++)
            g_ptr_array_add(argv, (gpointer)*a);
        g_ptr_array_add(argv, NULL);
        execv(bin, (char **)argv->pdata);
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    Ran r = {0, g_string_new(NULL), g_string_new(NULL)};
    struct pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    GString *into[2] = {r.out, r.err};
    int open_fds = 2;
    while (open_fds > 0) {
        cr_assert_geq(poll(fds, 2, 60000), 1, "memsim wrote nothing for a minute");
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd < 0 || !fds[i].revents)
                continue;
            char buf[4096];
            ssize_t n = read(fds[i].fd, buf, sizeof buf);
            if (n > 0) {
                g_string_append_len(into[i], buf, n);
            } else { /* EOF, or EIO from the master once the slave's last holder exits */
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    cr_assert_eq(waitpid(pid, &r.status, 0), pid);
    return r;
}

static void ran_clear(Ran *r)
{
    g_string_free(r->out, TRUE);
    g_string_free(r->err, TRUE);
}

/* The plan's JSON with its one wall-clock field (elapsed_s) blanked (one thread: the search
 * statistics depend on the threads' timing otherwise, the ranking does not). */
static char *without_elapsed(const char *json)
{
    g_autoptr(GRegex) re = g_regex_new("\"elapsed_s\" : [0-9.e+-]+", 0, 0, NULL);
    return g_regex_replace_literal(re, json, -1, 0, "\"elapsed_s\" : X", 0, NULL);
}

#define PLAN "plan", "--model", "opt-125m", "--gpus", "2", "--gpu", "a10g", "--seq", "512", \
             "--global-batch", "16", "--threads", "1", "--json"

Test(progress, plan_bar_on_a_terminal_only)
{
    const char *args[] = {PLAN, NULL};
    Ran tty = run(args, TRUE), pipe_ = run(args, FALSE);
    cr_assert(WIFEXITED(tty.status) && WEXITSTATUS(tty.status) == 0, "plan under a pty failed");
    cr_assert(WIFEXITED(pipe_.status) && WEXITSTATUS(pipe_.status) == 0, "plan failed");

    /* On the terminal: the bar, "memsim: planning [###...] done/total layouts", drawn over
     * itself with \r and cleared at the end. */
    cr_expect(strstr(tty.err->str, "memsim: planning"), "no bar on the pty: [%s]", tty.err->str);
    g_autoptr(GRegex) bar =
        g_regex_new("memsim: planning \\[[#.]{30}\\] [0-9]+/[0-9]+ layouts, [0-9.]+ "
                    "layouts/s, ETA ",
                    0, 0, NULL);
    cr_expect(g_regex_match(bar, tty.err->str, 0, NULL), "no bar with a total: [%s]",
              tty.err->str);
    cr_expect(g_str_has_suffix(tty.err->str, "\r\033[K"), "the bar's line is not cleared");

    /* Through a pipe: nothing on stderr. */
    cr_expect_eq(pipe_.err->len, 0, "stderr without a terminal: [%s]", pipe_.err->str);

    /* Standard output identical byte for byte but for the wall-clock elapsed_s. */
    cr_assert_gt(tty.out->len, 1000);
    cr_expect(!strchr(tty.out->str, '\r') && !strstr(tty.out->str, "memsim: planning"));
    g_autofree char *a = without_elapsed(tty.out->str), *b = without_elapsed(pipe_.out->str);
    cr_expect_str_eq(a, b, "--json differs with the bar on");
    ran_clear(&tty);
    ran_clear(&pipe_);
}

Test(progress, quiet_turns_it_off)
{
    const char *args[] = {PLAN, "--quiet", NULL};
    Ran r = run(args, TRUE);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    cr_expect_eq(r.err->len, 0, "stderr with --quiet on a pty: [%s]", r.err->str);
    cr_expect_gt(r.out->len, 1000);
    ran_clear(&r);
}

/* replay counts events without a known total: "memsim: replaying… N events, R events/s" */
Test(progress, replay_counts_events)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *trace = g_build_filename(dir, "t.mst", NULL);
    const char *gen[] = {"gen", "--model", "opt-125m", "--batch", "2", "--seq", "256", "-o",
                         trace, "--quiet", NULL};
    Ran g = run(gen, TRUE);
    cr_assert(WIFEXITED(g.status) && WEXITSTATUS(g.status) == 0, "gen: %s", g.err->str);
    cr_expect_eq(g.err->len, 0, "gen --quiet drew on the pty: [%s]", g.err->str);
    const char *replay[] = {"replay", trace, NULL};
    Ran r = run(replay, TRUE);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "replay: %s", r.err->str);
    g_autoptr(GRegex) line =
        g_regex_new("memsim: replaying… [0-9.]+( [kM])? events, [0-9.]+( [kM])? events/s", 0,
                    0, NULL);
    cr_expect(g_regex_match(line, r.err->str, 0, NULL), "no replay progress: [%s]", r.err->str);
    cr_expect(strstr(r.out->str, "peak"), "no report: %s", r.out->str);
    ran_clear(&g);
    ran_clear(&r);
    g_autofree char *rm = g_strdup_printf("rm -rf '%s'", dir);
    cr_assert_eq(system(rm), 0);
}
