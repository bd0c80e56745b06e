/* `meson install` into a DESTDIR: every installed piece is where users look for it, and the
 * example program (tools/examples/estimate_and_replay.c), compiled against the installed
 * headers with the installed memsim.pc and linked with the installed library (shared, then
 * static), prints exactly what the installed command prints with --json.
 *
 * The installed memsim.pc is relocatable (prefix=${pcfiledir}/...: meson's
 * pkgconfig.relocatable, a default of the top meson.build), so PKG_CONFIG_PATH alone
 * resolves it inside the DESTDIR; --define-prefix cannot, since it assumes libdir is
 * PREFIX/lib and Debian's is PREFIX/lib/x86_64-linux-gnu. */
#include <criterion/criterion.h>
#include <string.h>

#include "testutil.h"

typedef struct {
    char *destdir;  /* the DESTDIR */
    char *root;     /* DESTDIR + prefix: what a user's prefix holds */
    char *libdir;   /* DESTDIR + libdir */
    char *bindir, *includedir, *mandir, *datadir, *pythondir;
    char *tmp;
} Install;

static const char *env_or_fail(const char *name)
{
    const char *v = g_getenv(name);
    cr_assert(v != NULL && *v, "%s not set (run the tests through meson test)", name);
    return v;
}

static char *under(const char *destdir, const char *abs_path)
{
    return g_build_filename(destdir, abs_path, NULL);
}

/* meson install --destdir into a fresh folder. */
static void install(Install *in)
{
    in->tmp = tu_tmpdir();
    in->destdir = g_build_filename(in->tmp, "dest", NULL);
    const char *argv[] = {"meson", "install", "--no-rebuild", "--quiet", "-C",
                          env_or_fail("MEMSIM_BUILD_ROOT"), "--destdir", in->destdir, NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run(argv, NULL, &out, &err);
    cr_assert_eq(rc, 0, "meson install failed (%d):\n%s\n%s", rc, out, err);
    in->root = under(in->destdir, env_or_fail("MEMSIM_PREFIX"));
    in->libdir = under(in->destdir, env_or_fail("MEMSIM_INSTALL_LIBDIR"));
    in->bindir = under(in->destdir, env_or_fail("MEMSIM_INSTALL_BINDIR"));
    in->includedir = under(in->destdir, env_or_fail("MEMSIM_INSTALL_INCLUDEDIR"));
    in->mandir = under(in->destdir, env_or_fail("MEMSIM_INSTALL_MANDIR"));
    in->datadir = under(in->destdir, env_or_fail("MEMSIM_INSTALL_DATADIR"));
    const char *py = g_getenv("MEMSIM_INSTALL_PYTHONDIR");
    in->pythondir = py ? under(in->destdir, py) : NULL;
}

/* Removes the DESTDIR copy (tens of MB) and frees the paths. */
static void install_clear(Install *in)
{
    if (in->tmp) {
        const char *argv[] = {"rm", "-rf", in->tmp, NULL};
        cr_expect_eq(tu_run(argv, NULL, NULL, NULL), 0, "rm -rf %s", in->tmp);
    }
    g_free(in->destdir);
    g_free(in->root);
    g_free(in->libdir);
    g_free(in->bindir);
    g_free(in->includedir);
    g_free(in->mandir);
    g_free(in->datadir);
    g_free(in->pythondir);
    g_free(in->tmp);
}

static void expect_file(const char *dir, const char *name)
{
    g_autofree char *p = g_build_filename(dir, name, NULL);
    cr_expect(g_file_test(p, G_FILE_TEST_EXISTS), "not installed: %s", p);
}

Test(install, layout)
{
    Install in = {0};
    install(&in);
    expect_file(in.bindir, "memsim");
    expect_file(in.libdir, "libmemsim.so");
    expect_file(in.libdir, "libmemsim.so.0");
    expect_file(in.libdir, "libmemsim.a");
    expect_file(in.libdir, "pkgconfig/memsim.pc");
    const char *headers[] = {"error.h", "trace.h", "formats.h", "alloc.h", "sim.h", "gen.h"};
    for (gsize i = 0; i < G_N_ELEMENTS(headers); i++) {
        g_autofree char *h = g_build_filename("memsim", headers[i], NULL);
        expect_file(in.includedir, h);
    }
    expect_file(in.mandir, "man1/memsim.1");
    expect_file(in.datadir, "bash-completion/completions/memsim");
    if (in.pythondir) {
        expect_file(in.pythondir, "memsim/__init__.py");
        expect_file(in.pythondir, "memsim/recorder.py");
        expect_file(in.pythondir, "memsim/_paths.py");
        expect_file(in.pythondir, "memsim_record.py");
    }
    /* The installed command runs from its own library. */
    g_autofree char *bin = g_build_filename(in.bindir, "memsim", NULL);
    g_autofree char *ld = g_strdup_printf("LD_LIBRARY_PATH=%s", in.libdir);
    const char *env[] = {ld, NULL};
    const char *argv[] = {bin, "--version", NULL};
    g_autofree char *out = NULL;
    cr_expect_eq(tu_run(argv, env, &out, NULL), 0);
    cr_expect(g_str_has_prefix(out, "memsim "), "%s", out);
    install_clear(&in);
}

/* `pkg-config ARGS memsim` with the installed .pc; a newly allocated argv. */
/* The folder of the memsim.pc to use. The installed one when it is relocatable
 * (prefix=${pcfiledir}/...). A build folder configured before pkgconfig.relocatable became
 * the default installs one with an absolute prefix: a copy with the prefix moved into the
 * DESTDIR stands in for it (what --define-prefix would do with a plain lib/ libdir).
 * Newly allocated. */
static char *pc_dir(const Install *in)
{
    g_autofree char *pc = g_build_filename(in->libdir, "pkgconfig", "memsim.pc", NULL);
    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(pc, &text, NULL, NULL), "cannot read %s", pc);
    if (strstr(text, "prefix=${pcfiledir}"))
        return g_build_filename(in->libdir, "pkgconfig", NULL);
    cr_log_info("%s has an absolute prefix (meson configure -Dpkgconfig.relocatable=true "
                "makes it relocatable); testing a copy moved into the DESTDIR",
                pc);
    g_autofree char *old = g_strdup_printf("prefix=%s\n", env_or_fail("MEMSIM_PREFIX"));
    g_autofree char *new = g_strdup_printf("prefix=%s\n", in->root);
    cr_assert(g_str_has_prefix(text, old), "%s does not start with %s", pc, old);
    g_autofree char *moved = g_strconcat(new, text + strlen(old), NULL);
    char *dir = g_build_filename(in->tmp, "pc", NULL);
    g_autofree char *copy = g_build_filename(dir, "memsim.pc", NULL);
    cr_assert(g_mkdir_with_parents(dir, 0755) == 0 &&
              g_file_set_contents(copy, moved, -1, NULL));
    return dir;
}

/* `pkg-config ARGS memsim` with the installed .pc; a newly allocated argv. */
static char **pkg_config(const Install *in, const char *what)
{
    g_autofree char *dir = pc_dir(in);
    g_autofree char *pcpath = g_strdup_printf("PKG_CONFIG_PATH=%s", dir);
    const char *env[] = {pcpath, NULL};
    const char *argv[] = {"pkg-config", what, "--cflags", "--libs", "memsim", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run(argv, env, &out, &err);
    cr_assert_eq(rc, 0, "pkg-config %s failed: %s", what, err);
    cr_assert(strstr(out, in->destdir) != NULL, "memsim.pc does not resolve inside the DESTDIR: %s",
              out);
    char **flags = NULL;
    GError *error = NULL;
    cr_assert(g_shell_parse_argv(g_strstrip(out), NULL, &flags, &error), "%s",
              error ? error->message : "?");
    return flags;
}

/* Compiles the example: cc SRC -o EXE FLAGS... */
static void compile(const char *exe, char **flags)
{
    g_autofree char *src = g_build_filename(env_or_fail("MEMSIM_SOURCE_ROOT"), "tools",
                                            "examples", "estimate_and_replay.c", NULL);
    GPtrArray *argv = g_ptr_array_new();
    g_ptr_array_add(argv, (gpointer)env_or_fail("MEMSIM_CC"));
    g_ptr_array_add(argv, (gpointer) "-std=c11");
    g_ptr_array_add(argv, (gpointer) "-Wall");
    g_ptr_array_add(argv, (gpointer) "-Werror");
    /* A sanitized build installs a sanitized library: its users link the runtime too. */
    g_autofree char *fsan = NULL;
    const char *san = g_getenv("MEMSIM_SANITIZE");
    if (san && *san && strcmp(san, "none") != 0) {
        fsan = g_strdup_printf("-fsanitize=%s", san);
        g_ptr_array_add(argv, fsan);
    }
    g_ptr_array_add(argv, src);
    g_ptr_array_add(argv, (gpointer) "-o");
    g_ptr_array_add(argv, (gpointer)exe);
    for (char **f = flags; *f; f++)
        g_ptr_array_add(argv, *f);
    g_ptr_array_add(argv, NULL);
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run((const char *const *)argv->pdata, NULL, &out, &err);
    g_ptr_array_free(argv, TRUE);
    cr_assert_eq(rc, 0, "the example does not compile against the install:\n%s%s", out, err);
}

/* What the installed command prints: estimate --json, then replay --json TRACE. */
static char *expected_output(const Install *in, const char *trace)
{
    g_autofree char *bin = g_build_filename(in->bindir, "memsim", NULL);
    g_autofree char *ld = g_strdup_printf("LD_LIBRARY_PATH=%s", in->libdir);
    const char *env[] = {ld, NULL};
    const char *est[] = {bin, "estimate", "--model", "gpt2", "--batch", "2", "--seq", "256",
                         "--finetune", "lora", "--gpu-mem", "16GiB", "--json", NULL};
    g_autofree char *e_out = NULL, *e_err = NULL;
    int rc = tu_run(est, env, &e_out, &e_err);
    cr_assert_eq(rc, 0, "memsim estimate: %d %s", rc, e_err);
    const char *rep[] = {bin, "replay", trace, "--json", NULL};
    g_autofree char *r_out = NULL, *r_err = NULL;
    rc = tu_run(rep, env, &r_out, &r_err);
    cr_assert_eq(rc, 0, "memsim replay: %d %s", rc, r_err);
    return g_strconcat(e_out, r_out, NULL);
}

static char *example_output(const char *exe, const char *libdir, const char *trace)
{
    g_autofree char *ld = libdir ? g_strdup_printf("LD_LIBRARY_PATH=%s", libdir) : NULL;
    const char *env[] = {ld, NULL};
    const char *argv[] = {exe,          "gpt2",          trace,         "batch=2", "seq=256",
                          "finetune=lora", "gpu-mem=16GiB", NULL};
    char *out = NULL;
    g_autofree char *err = NULL;
    int rc = tu_run(argv, env, &out, &err);
    cr_assert_eq(rc, 0, "%s: exit %d: %s", exe, rc, err);
    return out;
}

static char *make_trace(const Install *in)
{
    char *trace = g_build_filename(in->tmp, "run.mst", NULL);
    const char *gen[] = {"gen", "--model", "opt-125m", "--seq", "128", "--steps", "1", "-o",
                         trace, NULL};
    g_autofree char *err = NULL;
    cr_assert_eq(tu_run_memsim(gen, NULL, &err), 0, "memsim gen: %s", err);
    return trace;
}

Test(install, example_against_installed_library)
{
    Install in = {0};
    install(&in);
    g_autofree char *trace = make_trace(&in);
    g_autofree char *expected = expected_output(&in, trace);

    /* Shared: -lmemsim from the installed .pc; the installed library at run time. */
    g_auto(GStrv) flags = pkg_config(&in, "--print-errors");
    g_autofree char *exe = g_build_filename(in.tmp, "estimate_and_replay", NULL);
    compile(exe, flags);
    g_autofree char *got = example_output(exe, in.libdir, trace);
    cr_expect_str_eq(got, expected, "the example and the command disagree");

    /* Static: libmemsim.a and the .pc's Requires.private / Libs.private. */
    g_auto(GStrv) sflags = pkg_config(&in, "--static");
    GPtrArray *fl = g_ptr_array_new();
    g_autofree char *archive = g_build_filename(in.libdir, "libmemsim.a", NULL);
    g_ptr_array_add(fl, archive);
    for (char **f = sflags; *f; f++)
        if (strcmp(*f, "-lmemsim") != 0)
            g_ptr_array_add(fl, *f);
    g_ptr_array_add(fl, NULL);
    g_autofree char *sexe = g_build_filename(in.tmp, "estimate_and_replay_static", NULL);
    compile(sexe, (char **)fl->pdata);
    g_ptr_array_free(fl, TRUE);
    g_autofree char *sgot = example_output(sexe, NULL, trace);
    cr_expect_str_eq(sgot, expected, "the statically linked example and the command disagree");
    install_clear(&in);
}

/* The example built in the tree (tests/meson.build) agrees with the build's command. */
Test(install, example_in_build_tree)
{
    g_autofree char *tmp = tu_tmpdir();
    Install in = {.tmp = tmp};
    g_autofree char *trace = make_trace(&in);
    const char *est[] = {"estimate", "--model",    "gpt2",          "--batch", "2", "--seq",
                         "256",      "--finetune", "lora", "--gpu-mem", "16GiB", "--json", NULL};
    g_autofree char *e_out = NULL;
    cr_assert_eq(tu_run_memsim(est, &e_out, NULL), 0);
    const char *rep[] = {"replay", trace, "--json", NULL};
    g_autofree char *r_out = NULL;
    cr_assert_eq(tu_run_memsim(rep, &r_out, NULL), 0);
    g_autofree char *expected = g_strconcat(e_out, r_out, NULL);
    g_autofree char *got = example_output(env_or_fail("MEMSIM_EXAMPLE"), NULL, trace);
    cr_expect_str_eq(got, expected);
    /* Bad input: the library's message, exit 2. */
    const char *bad[] = {env_or_fail("MEMSIM_EXAMPLE"), "gpt2", trace, "precision=fp8", NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(tu_run(bad, NULL, NULL, &err), 2);
    cr_expect(strstr(err, "precision: 'fp8' is not one of") != NULL, "%s", err);
    const char *rm[] = {"rm", "-rf", tmp, NULL};
    cr_expect_eq(tu_run(rm, NULL, NULL, NULL), 0);
}

/* The installed Python module finds the installed library by itself (no MEMSIM_LIBRARY). */
Test(install, python_module_finds_installed_library)
{
    const char *python = g_getenv("MEMSIM_PYTHON");
    if (!python)
        cr_skip_test("no python3 found at configure time");
    const char *san = g_getenv("MEMSIM_SANITIZE");
    if (san && *san && strcmp(san, "none") != 0)
        cr_skip_test("sanitized build (%s): python3 cannot load a sanitized library", san);
    Install in = {0};
    install(&in);
    cr_assert(in.pythondir);
    g_autofree char *pp = g_strdup_printf("PYTHONPATH=%s", in.pythondir);
    const char *env[] = {pp, "MEMSIM_LIBRARY=", NULL};
    const char *argv[] = {python, "-c",
                          "import memsim; print(memsim.library_path()); "
                          "print(memsim.estimate('gpt2', seq=64)['ranks'][0]['peak_allocated'])",
                          NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run(argv, env, &out, &err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_expect(g_str_has_prefix(out, in.destdir), "module loaded %s, not the installed library",
              out);
    install_clear(&in);
}
