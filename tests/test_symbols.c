/* What libmemsim.so exports is the public API and nothing else: every name `nm -D
 * --defined-only` lists is a memsim_* function declared MEMSIM_API in include/memsim/, and
 * every such declaration is exported. And the source tree keeps its floors
 * (tools/layers.py: no file uses one of a floor above it, no circles between files). */
#include <criterion/criterion.h>

#include <string.h>

#include "testutil.h"

/* The names declared MEMSIM_API in the public headers. */
static GHashTable *declared(void)
{
    GHashTable *names = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_autofree char *dir = g_build_filename(g_getenv("MEMSIM_SOURCE_ROOT"), "include",
                                            "memsim", NULL);
    GDir *d = g_dir_open(dir, 0, NULL);
    cr_assert(d, "cannot list %s", dir);
    g_autoptr(GRegex) re = g_regex_new("^MEMSIM_API [^(]*\\b(\\w+)\\(", G_REGEX_MULTILINE, 0,
                                       NULL);
    const char *f;
    while ((f = g_dir_read_name(d))) {
        if (!g_str_has_suffix(f, ".h"))
            continue;
        g_autofree char *path = g_build_filename(dir, f, NULL);
        g_autofree char *text = NULL;
        cr_assert(g_file_get_contents(path, &text, NULL, NULL), "cannot read %s", path);
        GMatchInfo *m = NULL;
        g_regex_match(re, text, 0, &m);
        while (g_match_info_matches(m)) {
            g_hash_table_add(names, g_match_info_fetch(m, 1));
            g_match_info_next(m, NULL);
        }
        g_match_info_free(m);
    }
    g_dir_close(d);
    return names;
}

Test(symbols, shared_library_exports_only_the_public_api, .timeout = 120)
{
    const char *lib = g_getenv("MEMSIM_LIBRARY");
    cr_assert(lib && g_getenv("MEMSIM_SOURCE_ROOT"));
    const char *argv[] = {"nm", "-D", "--defined-only", lib, NULL};
    char *out = NULL, *err = NULL;
    int rc = tu_run(argv, NULL, &out, &err);
    cr_assert_eq(rc, 0, "nm failed: %s", err);
    g_autoptr(GHashTable) decl = declared();
    cr_assert_gt(g_hash_table_size(decl), 100, "only %u MEMSIM_API declarations found",
                 g_hash_table_size(decl));
    g_autoptr(GHashTable) exported = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_auto(GStrv) lines = g_strsplit(out, "\n", -1);
    for (char **l = lines; *l; l++) {
        g_auto(GStrv) f = g_strsplit_set(*l, " \t", -1);
        guint n = g_strv_length(f);
        if (n < 3 || !*f[n - 1])
            continue;
        const char *name = f[n - 1];
        cr_expect(g_str_has_prefix(name, "memsim_"), "libmemsim.so exports %s (type %s)", name,
                  f[n - 2]);
        cr_expect(g_hash_table_contains(decl, name),
                  "libmemsim.so exports %s, which no header declares MEMSIM_API", name);
        g_hash_table_add(exported, g_strdup(name));
    }
    GHashTableIter it;
    gpointer k;
    g_hash_table_iter_init(&it, decl);
    while (g_hash_table_iter_next(&it, &k, NULL))
        cr_expect(g_hash_table_contains(exported, k),
                  "%s is declared MEMSIM_API but libmemsim.so does not export it",
                  (const char *)k);
    g_free(out);
    g_free(err);
}

Test(layers, no_file_uses_a_floor_above_it_and_no_circles, .timeout = 120)
{
    const char *python = g_getenv("MEMSIM_PYTHON");
    if (!python) {
        tu_note_skip("layers", "no python3 found at configure time: tools/layers.py not run");
        cr_skip_test("no python3");
    }
    g_autofree char *script = g_build_filename(g_getenv("MEMSIM_SOURCE_ROOT"), "tools",
                                               "layers.py", NULL);
    const char *argv[] = {python, script, "--build", g_getenv("MEMSIM_BUILD_ROOT"), NULL};
    char *out = NULL, *err = NULL;
    int rc = tu_run(argv, NULL, &out, &err);
    cr_assert_eq(rc, 0, "tools/layers.py (exit %d):\n%s%s", rc, out, err);
    /* it did look at the objects: the summary names the symbol uses */
    cr_assert(strstr(out, "symbol uses from"), "%s", out);
    cr_assert(strstr(out, " 0 against the floors, 0 circles"), "%s", out);
    g_free(out);
    g_free(err);
}
