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
