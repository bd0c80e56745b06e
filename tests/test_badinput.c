/* The bad-input corpus: every file under tests/data/bad/ whose name contains ".exitN." must
 * make `memsim replay FILE` exit with status N, print a message naming the file, and never
 * crash (in the sanitizer build a report would also fail the test). */
#include <criterion/criterion.h>
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
