/* The bad-input corpus: every file under tests/data/bad/ whose name contains ".exitN." must
 * make `memsim replay FILE` exit with status N, print a message naming the file, and never
 * crash (in the sanitizer build a report would also fail the test). */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <string.h>

#include "testutil.h"

Test(badinput, corpus, .timeout = 300)
{
    g_autofree char *dir = tu_test_data("bad");
    GError *error = NULL;
    GDir *d = g_dir_open(dir, 0, &error);
    cr_assert(d, "%s", error ? error->message : "?");
    const char *name;
    int n = 0;
    while ((name = g_dir_read_name(d))) {
        const char *tag = strstr(name, ".exit");
        if (!tag)
            continue;
        int want = tag[5] - '0';
        g_autofree char *path = g_build_filename(dir, name, NULL);
        const char *argv[] = {"replay", path, "--json", NULL};
        g_autofree char *out = NULL, *err = NULL;
        int rc = tu_run_memsim(argv, &out, &err);
        cr_expect_eq(rc, want, "%s: exit %d, expected %d; stderr: %s", name, rc, want, err);
        cr_expect(strstr(err, name) != NULL, "%s: the message does not name the file: %s", name,
                  err);
        cr_expect(!strstr(err, "Sanitizer") && !strstr(err, "runtime error"),
                  "%s: sanitizer report: %s", name, err);
        n++;
    }
    g_dir_close(d);
    cr_expect_gt(n, 20, "the corpus has only %d files", n);
}

/* A 20 MB pickle of Nones (PROTO 2, EMPTY_LIST, MARK, N × NONE, APPENDS, STOP, or the same
 * in runs of 1000 as Python's pickle.dumps([None] * N) writes it): refused with exit 2 and
 * the file named, in a few seconds and well under 500 MB (it took 1.28 GB and 6 s). */
static void none_flood(gsize n, gsize batch)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *path = g_build_filename(dir, batch ? "nones-batched.pickle" : "nones.pickle",
                                             NULL);
    GByteArray *b = tu_none_flood_pickle(n, batch);
    GError *error = NULL;
    cr_assert(g_file_set_contents(path, (const char *)b->data, b->len, &error), "%s",
              error ? error->message : "?");
    g_byte_array_free(b, TRUE);

    const char *argv[] = {"replay", path, NULL};
    g_autofree char *err = NULL;
    gint64 t0 = g_get_monotonic_time();
    int rc = tu_run_memsim(argv, NULL, &err);
    double secs = (double)(g_get_monotonic_time() - t0) / 1e6, mib = tu_children_peak_mib();
    g_unlink(path);
    g_rmdir(dir);
    cr_log_info("%zu Nones%s: exit %d in %.2f s, peak RSS %.0f MiB", (size_t)n,
                batch ? " in runs" : "", rc, secs, mib);
    cr_expect_eq(rc, 2, "exit %d; stderr: %s", rc, err);
    cr_expect(strstr(err, path) != NULL, "the message does not name the file: %s", err);
    if (tu_sanitized())
        return; /* sanitizers multiply time and memory */
    cr_expect_lt(secs, 5.0, "%.2f s", secs);
    cr_expect_lt(mib, 500.0, "peak RSS %.0f MiB", mib);
}

Test(badinput, none_flood_pickle, .timeout = 120)
{
    none_flood(20000000, 0);
}

Test(badinput, none_flood_pickle_batched, .timeout = 120)
{
    none_flood(20000000, 1000);
}

/* Snapshots that contradict themselves (tests/data/bad/inconsistent-*, written by
 * make_bad_pickles.py): read with a warning naming the file and the record, and under
 * --verify a mismatch (exit 1); unknown trace actions: one warning line per kind with its
 * count, and the replay goes on (exit 0 even under --verify; "user_defined" annotations are
 * no allocator action and pass silently). */
static int run_verify(const char *file, char **out, char **err)
{
    g_autofree char *path = tu_test_data(file);
    const char *argv[] = {"replay", path, "--verify", NULL};
    return tu_run_memsim(argv, out, err);
}

Test(badinput, inconsistent_snapshots_warn_and_fail_verify)
{
    static const struct {
        const char *file, *warning;
    } cases[] = {
        {"bad/inconsistent-free-unknown-address.exit0.pickle",
         "1 frees of an address no segment holds, skipped (first: device_traces[0][5]: free of "
         "0x1000)"},
        {"bad/inconsistent-block-state.exit0.pickle",
         "1 blocks in a state that does not exist (first: segments[0].blocks[0]: state "
         "'active_awaiting_godot'"},
        {"bad/inconsistent-allocated-size.exit0.pickle",
         "1 segments whose allocated_size exceeds their size (first: segments[0]: allocated_size "
         "4194304 > total_size 2097152)"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *out = NULL, *err = NULL;
        int rc = run_verify(cases[i].file, &out, &err);
        cr_expect_eq(rc, 1, "%s: exit %d, expected 1; %s", cases[i].file, rc, err);
        cr_expect(strstr(err, "memsim: warning: ") && strstr(err, cases[i].file) &&
                      strstr(err, cases[i].warning),
                  "%s: %s", cases[i].file, err);
        cr_expect(strstr(out, "1 mismatches; first: the recording contradicts its own state"),
                  "%s: %s", cases[i].file, out);
    }
}

Test(badinput, unknown_actions_one_warning_per_kind)
{
    g_autofree char *out = NULL, *err = NULL;
    int rc = run_verify("bad/inconsistent-unknown-actions.exit0.pickle", &out, &err);
    cr_expect_eq(rc, 0, "%s", err);
    g_auto(GStrv) lines = g_strsplit(err, "\n", -1);
    int n = 0;
    for (char **l = lines; *l; l++)
        n += g_str_has_prefix(*l, "memsim: warning: ");
    cr_expect_eq(n, 2, "one line per unknown action: %s", err);
    cr_expect(strstr(err, "3 trace entries of the unknown action 'frobnicate' skipped"), "%s", err);
    cr_expect(strstr(err, "1 trace entries of the unknown action 'alloc_v2' skipped"), "%s", err);
    cr_expect(!strstr(err, "user_defined"), "%s", err);
    cr_expect(strstr(out, " 0 mismatches"), "%s", out);
}
