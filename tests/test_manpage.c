/* The documentation that ships with the command: the man page (tools/memsim.1) renders
 * without a warning and names every subcommand and every flag the command accepts (and no
 * flag it does not), and every run setting (memsim_run_setting_info) with its value's name
 * and values; the bash completion (tools/completion/memsim.bash) offers them. */
#include <criterion/criterion.h>
#include <memsim/gen.h>
#include <string.h>

#include "testutil.h"

static char *source_path(const char *rel)
{
    const char *src = g_getenv("MEMSIM_SOURCE_ROOT");
    cr_assert(src, "MEMSIM_SOURCE_ROOT not set (run the tests through meson test)");
    return g_build_filename(src, rel, NULL);
}

/* The subcommands, from `memsim --help` ("Commands:" then "  name   summary" lines). */
static char **subcommands(void)
{
    const char *argv[] = {"--help", NULL};
    g_autofree char *out = NULL;
    cr_assert_eq(tu_run_memsim(argv, &out, NULL), 0);
    GPtrArray *names = g_ptr_array_new();
    const char *p = strstr(out, "Commands:\n");
    cr_assert(p, "%s", out);
    g_auto(GStrv) lines = g_strsplit(p, "\n", -1);
    for (char **l = lines + 1; *l && g_str_has_prefix(*l, "  "); l++) {
        g_auto(GStrv) words = g_strsplit_set(g_strstrip(*l), " ", 2);
        g_ptr_array_add(names, g_strdup(words[0]));
    }
    g_ptr_array_add(names, NULL);
    cr_assert_gt(names->len, 4, "%s", out);
    return (char **)g_ptr_array_free(names, FALSE);
}

/* The long flags of `memsim CMD --help-all`: option lines "  [-x, ]--name[=ARG]  ...". */
static char **flags(const char *cmd)
{
    const char *argv[] = {cmd, "--help-all", NULL};
    g_autofree char *out = NULL;
    cr_assert_eq(tu_run_memsim(argv, &out, NULL), 0, "memsim %s --help-all", cmd);
    GPtrArray *names = g_ptr_array_new();
    g_auto(GStrv) lines = g_strsplit(out, "\n", -1);
    for (char **l = lines; *l; l++) {
        const char *s = *l;
        if (!g_str_has_prefix(s, "  "))
            continue;
        s += strspn(s, " ");
        if (s[0] == '-' && s[1] != '-' && s[2] == ',')
            s += 3 + strspn(s + 3, " ");
        if (!g_str_has_prefix(s, "--"))
            continue;
        gsize n = strspn(s, "-abcdefghijklmnopqrstuvwxyz0123456789");
        g_ptr_array_add(names, g_strndup(s, n));
    }
    g_ptr_array_add(names, NULL);
    return (char **)g_ptr_array_free(names, FALSE);
}

/* Whether `word` occurs in `text` as a whole flag (not as the start of a longer one). */
static gboolean has_flag(const char *text, const char *word)
{
    gsize n = strlen(word);
    for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
        char before = p == text ? ' ' : p[-1];
        char after = p[n];
        if (before != '-' && !g_ascii_isalnum(before) && after != '-' && after != '_' &&
            !g_ascii_isalnum(after))
            return TRUE;
    }
    return FALSE;
}

/* The page as man renders it at 80 columns in the C locale (plain ASCII). */
static char *rendered(void)
{
    g_autofree char *page = source_path("tools/memsim.1");
    const char *argv[] = {"man", "-l", page, NULL};
    const char *env[] = {"MANWIDTH=80", "LC_ALL=C", "MANPAGER=cat", "PAGER=cat", NULL};
    char *out = NULL;
    g_autofree char *err = NULL;
    cr_assert_eq(tu_run(argv, env, &out, &err), 0, "man -l: %s", err);
    return out;
}

static void skip_without_man(void)
{
    g_autofree char *man = g_find_program_in_path("man");
    if (!man)
        cr_skip_test("man is not installed (tools/install-deps.sh installs man-db)");
}

Test(manpage, renders_without_warnings)
{
    skip_without_man();
    g_autofree char *page = source_path("tools/memsim.1");
    const char *locales[] = {"LC_ALL=C", "LC_ALL=C.UTF-8"};
    for (gsize i = 0; i < G_N_ELEMENTS(locales); i++) {
        const char *argv[] = {"man", "--warnings", "-l", page, NULL};
        const char *env[] = {"MANWIDTH=80", locales[i], "MANPAGER=cat", "PAGER=cat", NULL};
        g_autofree char *out = NULL, *err = NULL;
        cr_expect_eq(tu_run(argv, env, &out, &err), 0);
        cr_expect_str_empty(err, "man --warnings (%s) says:\n%s", locales[i], err);
        cr_expect_gt(strlen(out), 1000);
    }
}

Test(manpage, sections)
{
    skip_without_man();
    g_autofree char *text = rendered();
    const char *sections[] = {"NAME",        "SYNOPSIS", "DESCRIPTION", "COMMANDS",
                              "RUN OPTIONS", "OPTIONS",  "EXIT STATUS", "ENVIRONMENT",
                              "FILES",       "EXAMPLES", "SEE ALSO"};
    for (gsize i = 0; i < G_N_ELEMENTS(sections); i++) {
        g_autofree char *heading = g_strdup_printf("\n%s\n", sections[i]);
        cr_expect(strstr(text, heading), "no section %s", sections[i]);
    }
}

Test(manpage, every_subcommand_and_flag)
{
    skip_without_man();
    g_autofree char *text = rendered();
    g_auto(GStrv) cmds = subcommands();
    GHashTable *known = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_hash_table_add(known, g_strdup("--version"));
    for (char **c = cmds; *c; c++) {
        /* A subsection "memsim CMD ..." of COMMANDS. */
        g_autofree char *heading = g_strdup_printf("\n   memsim %s", *c);
        cr_expect(strstr(text, heading), "subcommand %s has no subsection", *c);
        g_auto(GStrv) fl = flags(*c);
        for (char **f = fl; *f; f++) {
            cr_expect(has_flag(text, *f), "memsim %s %s is not in the man page", *c, *f);
            g_hash_table_add(known, g_strdup(*f));
        }
    }
    /* And nothing the command does not accept (a flag removed or renamed), outside the
     * section on Megatron-LM launches, which names Megatron's and torchrun's flags. */
    const char *mg_from = strstr(text, "\nMEGATRON-LM LAUNCHES\n");
    const char *mg_to = mg_from ? strstr(mg_from + 1, "\n\n") : NULL;
    cr_expect(mg_from, "the man page has no MEGATRON-LM LAUNCHES section");
    while (mg_to && mg_to[2] == ' ') /* its paragraphs, up to the next heading */
        mg_to = strstr(mg_to + 2, "\n\n");
    for (const char *p = strstr(text, "--"); p; p = strstr(p + 2, "--")) {
        if (p > text && (g_ascii_isalnum(p[-1]) || p[-1] == '-'))
            continue;
        if (mg_from && p > mg_from && (!mg_to || p < mg_to))
            continue;
        gsize n = strspn(p + 2, "-abcdefghijklmnopqrstuvwxyz0123456789");
        if (n == 0)
            continue;
        g_autofree char *f = g_strndup(p, n + 2);
        cr_expect(g_hash_table_contains(known, f),
                  "the man page names %s, which no subcommand "
                  "accepts",
                  f);
    }
    g_hash_table_unref(known);
}

/* The entries of the man page's RUN OPTIONS section, from its source: each ".TP" followed by
 * ".BI --NAME= ARG" or ".B --NAME" (dashes unescaped), to its paragraph (the lines up to the
 * next ".TP", ".PP" or ".SH"). Keys are "NAME=ARG" or "NAME". */
static GHashTable *run_options_of_page(void)
{
    g_autofree char *path = source_path("tools/memsim.1");
    g_autofree char *page = NULL;
    cr_assert(g_file_get_contents(path, &page, NULL, NULL), "%s", path);
    const char *start = strstr(page, "\n.SH RUN OPTIONS\n");
    cr_assert(start, "no RUN OPTIONS section in %s", path);
    start += 1;
    const char *end = strstr(start + 1, "\n.SH ");
    g_autofree char *section = g_strndup(start, end ? (gsize)(end - start) : strlen(start));
    g_auto(GStrv) parts = g_strsplit(section, "\\-", -1);
    g_autofree char *plain = g_strjoinv("-", parts);
    g_auto(GStrv) lines = g_strsplit(plain, "\n", -1);
    GHashTable *entries = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    for (char **l = lines; *l; l++) {
        if (strcmp(*l, ".TP") != 0 || !l[1])
            continue;
        char *key = NULL;
        if (g_str_has_prefix(l[1], ".BI --")) {
            g_auto(GStrv) w = g_strsplit(l[1] + strlen(".BI --"), " ", -1);
            cr_expect(g_strv_length(w) == 2, "RUN OPTIONS: %s", l[1]);
            key = g_strconcat(w[0], w[1], NULL);
        } else if (g_str_has_prefix(l[1], ".B --")) {
            key = g_strdup(l[1] + strlen(".B --"));
        } else {
            continue;
        }
        GString *par = g_string_new(NULL);
        for (char **p = l + 2; *p && !g_str_has_prefix(*p, ".TP") && !g_str_has_prefix(*p, ".PP") &&
                               !g_str_has_prefix(*p, ".SH");
             p++)
            g_string_append_printf(par, "%s\n", *p);
        g_hash_table_insert(entries, key, g_string_free(par, FALSE));
    }
    return entries;
}

/* Every run setting has its entry in RUN OPTIONS, with the value's name --help-run gives it,
 * and an entry that names each of its values; the section has no other option but --run. */
Test(manpage, every_run_setting)
{
    g_autoptr(GHashTable) entries = run_options_of_page();
    g_autoptr(GHashTable) known = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    g_hash_table_add(known, g_strdup("run=FILE"));
    const MemsimRunSetting *s;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++) {
        char *key = s->arg ? g_strdup_printf("%s=%s", s->name, s->arg) : g_strdup(s->name);
        g_hash_table_add(known, key);
        const char *par = g_hash_table_lookup(entries, key);
        cr_expect(par, "the man page's RUN OPTIONS has no --%s", key);
        for (const char *const *v = s->values; par && v && *v; v++)
            cr_expect(has_flag(par, *v), "the man page's --%s does not name %s:\n%s", key, *v, par);
    }
    GHashTableIter it;
    gpointer key;
    g_hash_table_iter_init(&it, entries);
    while (g_hash_table_iter_next(&it, &key, NULL))
        cr_expect(g_hash_table_contains(known, key),
                  "the man page's RUN OPTIONS has --%s, which is no run setting (or not with "
                  "this value's name)",
                  (const char *)key);
}

/* ---- bash completion ---- */

/* COMPREPLY for the words typed so far (the last one being completed), one per line. */
static char *complete(const char *const *words)
{
    g_autofree char *bash = g_find_program_in_path("bash");
    if (!bash)
        cr_skip_test("bash is not installed");
    g_autofree char *script = source_path("tools/completion/memsim.bash");
    GString *cmd = g_string_new(NULL);
    g_autofree char *qs = g_shell_quote(script);
    g_autofree char *qb = g_shell_quote(g_getenv("MEMSIM_BIN"));
    g_string_append_printf(cmd, "source %s; COMP_WORDS=(%s", qs, qb);
    int n = 0;
    for (const char *const *w = words; *w; w++, n++) {
        g_autofree char *q = g_shell_quote(*w);
        g_string_append_printf(cmd, " %s", q);
    }
    g_string_append_printf(cmd, "); COMP_CWORD=%d; _memsim; printf '%%s\\n' \"${COMPREPLY[@]}\"",
                           n);
    const char *argv[] = {"bash", "--norc", "--noprofile", "-c", cmd->str, NULL};
    char *out = NULL;
    g_autofree char *err = NULL;
    int rc = tu_run(argv, NULL, &out, &err);
    cr_assert_eq(rc, 0, "bash: %s", err);
    cr_expect_str_empty(err, "completion printed errors: %s", err);
    g_string_free(cmd, TRUE);
    return out;
}

static gboolean has_line(const char *text, const char *line)
{
    g_autofree char *l = g_strdup_printf("\n%s\n", line);
    g_autofree char *t = g_strdup_printf("\n%s", text);
    return strstr(t, l) != NULL;
}

Test(completion, subcommands_and_flags)
{
    g_auto(GStrv) cmds = subcommands();
    const char *none[] = {"", NULL};
    g_autofree char *all = complete(none);
    for (char **c = cmds; *c; c++) {
        cr_expect(has_line(all, *c), "subcommand %s not offered:\n%s", *c, all);
        const char *w[] = {*c, "--", NULL};
        g_autofree char *offered = complete(w);
        g_auto(GStrv) fl = flags(*c);
        for (char **f = fl; *f; f++) {
            g_autofree char *with_arg = g_strdup_printf("%s=", *f);
            cr_expect(has_line(offered, *f) || has_line(offered, with_arg),
                      "memsim %s: %s not offered:\n%s", *c, *f, offered);
        }
    }
}

/* What --help says of a default, the man page says too: replay's --gpu-mem. */
Test(manpage, defaults_agree)
{
    const char *argv[] = {"replay", "--help", NULL};
    g_autofree char *out = NULL;
    cr_assert_eq(tu_run_memsim(argv, &out, NULL), 0);
    g_autofree char *page_path = source_path("tools/memsim.1");
    g_autofree char *page = NULL;
    cr_assert(g_file_get_contents(page_path, &page, NULL, NULL));
    const char *line = strstr(out, "--gpu-mem");
    cr_assert(line, "%s", out);
    cr_expect(strstr(line, "recorded capacity") && !strstr(line, "(default: unlimited)"),
              "replay --help: %.200s", line);
    cr_expect(strstr(page, "(default: the trace's recorded capacity, else unlimited)"),
              "the man page's replay --gpu-mem default differs");
}

Test(completion, values)
{
    const char *m[] = {"estimate", "--model", "llama-3-", NULL};
    g_autofree char *models = complete(m);
    cr_expect(has_line(models, "llama-3-8b") && has_line(models, "llama-3-70b"), "%s", models);
    const char *m2[] = {"estimate", "--model=gpt2-", NULL};
    g_autofree char *models2 = complete(m2);
    cr_expect(has_line(models2, "gpt2-xl"), "%s", models2);
    const char *p[] = {"gen", "--precision", "", NULL};
    g_autofree char *prec = complete(p);
    cr_expect(has_line(prec, "bf16-mixed") && has_line(prec, "fp32"), "%s", prec);
    const char *a[] = {"replay", "--allocator", "", NULL};
    g_autofree char *alloc = complete(a);
    cr_expect(has_line(alloc, "torch") && has_line(alloc, "exact"), "%s", alloc);
    /* --model takes a preset or a config.json: no placeholder word, and paths complete */
    const char *mm[] = {"estimate", "--model", "", NULL};
    g_autofree char *mall = complete(mm);
    cr_expect(has_line(mall, "gpt2") && !strstr(mall, "__file__"), "%s", mall);
    g_autofree char *cdir = tu_test_data("good");
    g_autofree char *cprefix = g_build_filename(cdir, "sma", NULL);
    g_autofree char *cwant = g_build_filename(cdir, "small.mst", NULL);
    const char *mp[] = {"estimate", "--model", cprefix, NULL};
    g_autofree char *mfiles = complete(mp);
    cr_expect(has_line(mfiles, cwant), "--model does not complete paths: %s", mfiles);
    const char *gm[] = {"estimate", "--gpu-mem", "h100", NULL};
    g_autofree char *gmem = complete(gm);
    cr_expect(has_line(gmem, "h100-80gb"), "%s", gmem);
    /* Trace paths: files. */
    g_autofree char *dir = tu_test_data("good");
    g_autofree char *prefix = g_build_filename(dir, "sma", NULL);
    g_autofree char *want = g_build_filename(dir, "small.mst", NULL);
    const char *t[] = {"replay", prefix, NULL};
    g_autofree char *files = complete(t);
    cr_expect(has_line(files, want), "%s", files);
    /* Options whose argument is a FILE: files too. */
    const char *o[] = {"gen", "-o", prefix, NULL};
    g_autofree char *ofiles = complete(o);
    cr_expect(has_line(ofiles, want), "%s", ofiles);
    const char *r[] = {"replay", "--report", prefix, NULL};
    g_autofree char *rfiles = complete(r);
    cr_expect(has_line(rfiles, want), "%s", rfiles);
}

/* COMPREPLY for `memsim estimate --NAME ''`, as a set. */
static GHashTable *values_offered(const char *name)
{
    g_autofree char *opt = g_strdup_printf("--%s", name);
    const char *w[] = {"estimate", opt, "", NULL};
    g_autofree char *out = complete(w);
    g_auto(GStrv) lines = g_strsplit(out, "\n", -1);
    GHashTable *set = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (char **l = lines; *l; l++)
        if (**l)
            g_hash_table_add(set, g_strdup(*l));
    return set;
}

/* The values the completion offers for a run setting are the ones it takes: an enumeration's
 * names, true and false, the GPU profiles, releases the torch version accepts. */
Test(completion, run_setting_values)
{
    const MemsimRunSetting *s;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++) {
        if (!s->arg)
            continue; /* a flag: no value */
        g_autoptr(GHashTable) offered = values_offered(s->name);
        if (s->kind == MEMSIM_SETTING_KIND_ENUM || s->kind == MEMSIM_SETTING_KIND_BOOL) {
            const char *const tf[] = {"true", "false", NULL};
            const char *const *values = s->values ? s->values : tf;
            for (const char *const *v = values; *v; v++)
                cr_expect(g_hash_table_contains(offered, *v), "--%s: %s not offered", s->name, *v);
            cr_expect_eq(g_hash_table_size(offered), g_strv_length((char **)values),
                         "--%s: the completion offers other values", s->name);
        } else if (strcmp(s->name, "gpu") == 0) {
            for (const MemsimGpu *g = memsim_gpus(); g->name; g++)
                cr_expect(g_hash_table_contains(offered, g->name), "--gpu: %s not offered",
                          g->name);
        }
        GHashTableIter it;
        gpointer v;
        g_hash_table_iter_init(&it, offered);
        while (g_hash_table_iter_next(&it, &v, NULL)) {
            MemsimRun r = memsim_run_defaults();
            GError *error = NULL;
            cr_expect(memsim_run_set(&r, s->name, v, &error), "--%s %s offered, refused: %s",
                      s->name, (const char *)v, error ? error->message : "");
            g_clear_error(&error);
            memsim_run_clear(&r);
        }
    }
}
