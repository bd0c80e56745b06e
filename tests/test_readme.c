/* The README's shown outputs are what the command prints: every fenced block that starts with
 * "$ memsim ..." (continued by trailing backslashes) is run and its output compared line by
 * line, numbers exact. A "..." line stands for any lines; the wall time of a plan's sweep
 * ("0.05 s on 2 thread(s)") is the one figure not compared. Snapshots named without a folder
 * are read from the shared data (../shared/data/torch-snapshots). */
#include <criterion/criterion.h>
#include <string.h>

#include "testutil.h"

typedef struct {
    int line;       /* of the command in README.md */
    char *command;  /* without "$ " and the continuations joined */
    GPtrArray *expected;
} Block;

static void block_free(gpointer p)
{
    Block *b = p;
    g_free(b->command);
    g_ptr_array_unref(b->expected);
    g_free(b);
}

static char *readme(void)
{
    const char *src = g_getenv("MEMSIM_SOURCE_ROOT");
    cr_assert(src, "MEMSIM_SOURCE_ROOT not set (run the tests through meson test)");
    g_autofree char *path = g_build_filename(src, "README.md", NULL);
    char *text = NULL;
    cr_assert(g_file_get_contents(path, &text, NULL, NULL), "%s", path);
    return text;
}

static GPtrArray *blocks(const char *text)
{
    GPtrArray *out = g_ptr_array_new_with_free_func(block_free);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    for (int i = 0; lines[i]; i++) {
        if (strcmp(lines[i], "```") != 0 || !lines[i + 1] ||
            !g_str_has_prefix(lines[i + 1], "$ memsim "))
            continue;
        Block *b = g_new0(Block, 1);
        b->line = i + 2;
        GString *cmd = g_string_new(lines[i + 1] + 2);
        int j = i + 1;
        while (cmd->len && cmd->str[cmd->len - 1] == '\\' && lines[j + 1]) {
            g_string_truncate(cmd, cmd->len - 1);
            g_string_append(cmd, g_strstrip(lines[++j]));
        }
        b->command = g_string_free(cmd, FALSE);
        b->expected = g_ptr_array_new_with_free_func(g_free);
        for (j++; lines[j] && strcmp(lines[j], "```") != 0; j++)
            g_ptr_array_add(b->expected, g_strdup(lines[j]));
        g_ptr_array_add(out, b);
        i = j;
    }
    return out;
}

/* The one figure that is not the program's answer: the sweep's wall time and threads. */
static char *normalise(const char *line)
{
    g_autoptr(GRegex) re = g_regex_new("[0-9.]+ s on [0-9]+ thread\\(s\\)", 0, 0, NULL);
    return g_regex_replace_literal(re, line, -1, 0, "T s on N thread(s)", 0, NULL);
}

/* Whether got[gi..] matches want[wi..], "..." matching any run of lines. */
static gboolean matches(char **got, guint ng, guint gi, GPtrArray *want, guint wi, guint *bad)
{
    for (; wi < want->len; wi++, gi++) {
        const char *w = want->pdata[wi];
        if (strcmp(w, "...") == 0) {
            for (guint k = gi; k <= ng; k++)
                if (matches(got, ng, k, want, wi + 1, bad))
                    return TRUE;
            return FALSE;
        }
        if (gi >= ng) {
            *bad = MAX(*bad, wi);
            return FALSE;
        }
        g_autofree char *a = normalise(got[gi]), *b = normalise(w);
        if (strcmp(a, b) != 0) {
            *bad = MAX(*bad, wi);
            return FALSE;
        }
    }
    return gi == ng;
}

static void check_block(const Block *b, int *ran, int *skipped)
{
    g_auto(GStrv) words = NULL;
    GError *e = NULL;
    cr_assert(g_shell_parse_argv(b->command, NULL, &words, &e), "README.md:%d: %s", b->line,
              e ? e->message : "");
    GPtrArray *argv = g_ptr_array_new_with_free_func(g_free);
    for (char **w = words + 1; *w; w++) { /* words[0] is "memsim" */
        if ((g_str_has_suffix(*w, ".pickle") || g_str_has_suffix(*w, ".pkl")) &&
            !strchr(*w, '/')) {
            const char *d = tu_shared_data();
            if (!d) {
                g_autofree char *what = g_strdup_printf("readme/README.md:%d", b->line);
                g_autofree char *why =
                    g_strdup_printf("the shared data is absent: %s not run", b->command);
                tu_note_skip(what, why);
                (*skipped)++;
                g_ptr_array_unref(argv);
                return;
            }
            g_ptr_array_add(argv, g_build_filename(d, "torch-snapshots", *w, NULL));
        } else if (g_str_has_prefix(*w, "tools/examples/")) {
            /* a file the project ships, named from the top of the source tree */
            g_ptr_array_add(argv, g_build_filename(g_getenv("MEMSIM_SOURCE_ROOT"), *w, NULL));
        } else {
            g_ptr_array_add(argv, g_strdup(*w));
        }
    }
    g_ptr_array_add(argv, NULL);
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim((const char *const *)argv->pdata, &out, &err);
    g_ptr_array_unref(argv);
    cr_expect(rc == 0 || rc == 1, "README.md:%d: %s: exit %d: %s", b->line, b->command, rc, err);
    /* the output without its final newline */
    gsize n = strlen(out);
    if (n && out[n - 1] == '\n')
        out[n - 1] = '\0';
    g_auto(GStrv) got = g_strsplit(out, "\n", -1);
    guint bad = 0;
    cr_expect(matches(got, g_strv_length(got), 0, b->expected, 0, &bad),
              "README.md:%d: %s: the output differs from the README at its line %u (\"%s\"); "
              "the command prints:\n%s",
              b->line, b->command, b->line + 1 + bad,
              bad < b->expected->len ? (char *)b->expected->pdata[bad] : "(end)", out);
    (*ran)++;
}

Test(readme, shown_outputs_are_the_commands)
{
    g_autofree char *text = readme();
    g_autoptr(GPtrArray) bs = blocks(text);
    int ran = 0, skipped = 0;
    for (guint i = 0; i < bs->len; i++)
        check_block(bs->pdata[i], &ran, &skipped);
    cr_log_info("%d README commands compared, %d skipped", ran, skipped);
    cr_expect_geq(ran, 4, "only %d README commands were compared", ran);
}

/* The first of the README's two commands ends with the estimate whose output it shows. */
Test(readme, first_command_is_the_one_shown)
{
    g_autofree char *text = readme();
    const char *first = strstr(text, "tools/install-deps.sh && meson setup build && ninja -C build "
                                     "&& build/tools/memsim ");
    cr_assert(first, "the README's first command is not install, build, run");
    const char *args = strstr(first, "build/tools/memsim ") + strlen("build/tools/memsim ");
    g_autofree char *line = g_strndup(args, strcspn(args, "\n"));
    g_autofree char *shown = g_strdup_printf("```\n$ memsim %s\n", line);
    cr_expect(strstr(text, shown), "no fenced block shows the output of: memsim %s", line);
}
