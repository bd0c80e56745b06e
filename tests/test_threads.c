/* The library from several threads at once: tests/threads_check.c runs estimates of
 * different models (and replays) in GThreads and checks that each gives the JSON it gives
 * alone. Here it runs as it is, then, when valgrind is installed and the build is not
 * sanitized, under Helgrind, which reports data races that happened not to change a result.
 * (tools/run-tests.sh also runs it in a ThreadSanitizer build, build-tsan.) */
#include <criterion/criterion.h>
#include <string.h>

#include "testutil.h"

static int run_check(const char *const *prefix, const char *const *args, char **out,
                     char **err)
{
    const char *check = g_getenv("MEMSIM_THREADS_CHECK");
    cr_assert(check, "MEMSIM_THREADS_CHECK not set (run the tests through meson test)");
    GPtrArray *argv = g_ptr_array_new();
    for (const char *const *p = prefix; p && *p; p++)
        g_ptr_array_add(argv, (gpointer)*p);
    g_ptr_array_add(argv, (gpointer)check);
    for (const char *const *a = args; a && *a; a++)
        g_ptr_array_add(argv, (gpointer)*a);
    g_ptr_array_add(argv, NULL);
    g_auto(GStrv) envp = g_get_environ();
    /* Helgrind does not see GLib's futex-based locks inside g_slice; plain malloc it can. */
    envp = g_environ_setenv(envp, "G_SLICE", "always-malloc", TRUE);
    int status = 0;
    GError *error = NULL;
    gboolean ok = g_spawn_sync(NULL, (char **)argv->pdata, envp, G_SPAWN_SEARCH_PATH, NULL,
                               NULL, out, err, &status, &error);
    cr_assert(ok, "could not run %s: %s", check, error ? error->message : "?");
    g_ptr_array_free(argv, TRUE);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static const char *snapshot(void)
{
    static char path[4096];
    const char *d = tu_shared_data();
    if (!d)
        return NULL;
    g_snprintf(path, sizeof path, "%s/torch-snapshots/%s", d,
               "shreyansh26__MLSys-Experiments__profile_grad.pkl");
    return g_file_test(path, G_FILE_TEST_EXISTS) ? path : NULL;
}

Test(threads, concurrent_calls_give_serial_results)
{
    const char *args[] = {snapshot(), NULL};
    if (!args[0])
        tu_note_skip("threads/concurrent_calls_give_serial_results (the snapshot job)",
                     "the shared snapshot is absent: concurrent replays of a real snapshot not "
                     "run (the generated jobs run)");
    g_autofree char *out = NULL, *err = NULL;
    int rc = run_check(NULL, args, &out, &err);
    cr_log_info("%s", out);
    cr_assert_eq(rc, 0, "threads_check failed (%d):\n%s%s", rc, out, err);
    cr_expect(strstr(out, "two estimates: 2 jobs") && strstr(out, "four estimates: 4 jobs") &&
                  strstr(out, "replays and an estimate"),
              "%s", out);
}

Test(threads, helgrind_finds_no_race, .timeout = 600)
{
    const char *san = g_getenv("MEMSIM_SANITIZE");
    if (san && *san && strcmp(san, "none") != 0)
        cr_skip_test("sanitized build (%s): Helgrind cannot run it", san);
    g_autofree char *valgrind = g_find_program_in_path("valgrind");
    if (!valgrind)
        cr_skip_test("valgrind is not installed (tools/install-deps.sh installs it): the "
                     "concurrent calls were checked for equal results only");
    g_autofree char *supp = g_build_filename(g_getenv("MEMSIM_SOURCE_ROOT"), "tests",
                                             "helgrind.supp", NULL);
    g_autofree char *supp_arg = g_strdup_printf("--suppressions=%s", supp);
    const char *prefix[] = {valgrind, "--tool=helgrind", "--error-exitcode=3", "-q",
                            supp_arg, NULL};
    const char *args[] = {snapshot(), NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = run_check(prefix, args, &out, &err);
    cr_assert_eq(rc, 0, "helgrind (exit %d):\n%s%s", rc, out, err);
    cr_expect(strstr(out, "two estimates: 2 jobs, 2 concurrent round(s): same results") &&
                  strstr(out, "four estimates: 4 jobs, 1 concurrent round(s): same results"),
              "%s", out);
}
