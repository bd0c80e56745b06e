/* The Python module (tools/python/memsim): tests/python/test_memsim.py, run with Debian's
 * /usr/bin/python3 (the one meson found at configure time), checks that estimate, replay,
 * compare and models return exactly what the command prints with --json, and that bad input
 * raises memsim.Error with the command's message. This test runs it and checks its verdict.
 *
 * The module mirrors three C structs with ctypes (tools/python/memsim/__init__.py); the
 * asserts below fail the build when one of them changes without the module. */
#include <criterion/criterion.h>
#include <memsim/estimate.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <string.h>

#include "testutil.h"

/* _Run: an opaque 4096-byte buffer that memsim_run_defaults() fills. */
G_STATIC_ASSERT(sizeof(MemsimRun) <= 4096);
/* _EstimateOptions: allocator, alloc_conf, gpu_mem, context_bytes, nccl_bytes. */
G_STATIC_ASSERT(sizeof(MemsimEstimateOptions) == 3 * sizeof(char *) + 3 * sizeof(uint64_t));
G_STATIC_ASSERT(G_STRUCT_OFFSET(MemsimEstimateOptions, device) == 40);
G_STATIC_ASSERT(G_STRUCT_OFFSET(MemsimEstimateOptions, nccl_bytes) == 32);
/* _ReplayOptions: allocator, alloc_conf, capacity, verify, check_invariants, timeline,
 * hooks, untimed, dispatch_us, frames_skip, threads. */
G_STATIC_ASSERT(G_STRUCT_OFFSET(MemsimReplayOptions, verify) == 24);
G_STATIC_ASSERT(G_STRUCT_OFFSET(MemsimReplayOptions, timeline) == 32);
G_STATIC_ASSERT(G_STRUCT_OFFSET(MemsimReplayOptions, hooks) == 40);
G_STATIC_ASSERT(G_STRUCT_OFFSET(MemsimReplayOptions, untimed) == 48);
G_STATIC_ASSERT(G_STRUCT_OFFSET(MemsimReplayOptions, dispatch_us) == 56);
G_STATIC_ASSERT(G_STRUCT_OFFSET(MemsimReplayOptions, frames_skip) == 64);
G_STATIC_ASSERT(G_STRUCT_OFFSET(MemsimReplayOptions, threads) == 72);
G_STATIC_ASSERT(sizeof(MemsimReplayOptions) == 80);

Test(python, module_matches_command, .timeout = 600)
{
    const char *python = g_getenv("MEMSIM_PYTHON");
    if (!python)
        cr_skip_test("no python3 found at configure time: Python module not tested");
    const char *san = g_getenv("MEMSIM_SANITIZE");
    if (san && *san && strcmp(san, "none") != 0)
        cr_skip_test("sanitized build (%s): python3 cannot load a sanitized library (the "
                     "normal build tests the module)", san);
    const char *src = g_getenv("MEMSIM_SOURCE_ROOT");
    cr_assert(src && g_getenv("MEMSIM_LIBRARY") && g_getenv("MEMSIM_BIN"),
              "run the tests through meson test");
    g_autofree char *script = g_build_filename(src, "tests", "python", "test_memsim.py", NULL);
    g_autofree char *pypath = g_build_filename(src, "tools", "python", NULL);
    g_auto(GStrv) envp = g_get_environ();
    envp = g_environ_setenv(envp, "PYTHONPATH", pypath, TRUE);
    envp = g_environ_setenv(envp, "PYTHONDONTWRITEBYTECODE", "1", TRUE);
    const char *argv[] = {python, script, "-v", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int status = 0;
    GError *error = NULL;
    cr_assert(g_spawn_sync(NULL, (char **)argv, envp, G_SPAWN_DEFAULT, NULL, NULL, &out, &err,
                           &status, &error),
              "could not run %s: %s", python, error ? error->message : "?");
    /* unittest reports on stderr; show it either way (skips say why). */
    cr_log_info("%s%s", out, err);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "test_memsim.py failed:\n%s%s",
              out, err);
    cr_expect(strstr(err, "\nOK") != NULL, "no OK verdict:\n%s", err);
    /* unittest's skips (-v: "test_x (...) ... skipped 'why'") are listed as skips too */
    g_auto(GStrv) lines = g_strsplit(err, "\n", -1);
    for (char **l = lines; *l; l++) {
        char *at = strstr(*l, " ... skipped ");
        if (at) {
            g_autofree char *what = g_strdup_printf("python/%.*s", (int)(at - *l), *l);
            tu_note_skip(what, at + strlen(" ... skipped "));
        }
    }
    /* The module loaded the build's library, not some other installed copy. */
    cr_expect(strstr(out, g_getenv("MEMSIM_LIBRARY")) != NULL, "%s", out);
}
