/* `replay --verify` checks the allocator model against every action a recording holds, and is
 * shown to fail: a real snapshot's allocator events (tests/data/good/snapshot-nesta.txt,
 * derived from a public repository's snapshot, see its header) verify with no mismatch, and
 * each mutation of the recording — a moved block, a missing segment_free, a changed request,
 * a free moved past the next allocation, a wrong final size — makes it exit 1 naming the
 * first mismatch. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

static char **fixture_lines(void)
{
    g_autofree char *path = tu_test_data("good/snapshot-nesta.txt");
    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(path, &text, NULL, NULL), "%s", path);
    return g_strsplit(text, "\n", -1);
}

/* Replays `lines` with --verify; returns the exit status and the verify line of stdout. */
static int verify(char **lines, char **verdict)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *path = g_build_filename(dir, "mutated.txt", NULL);
    g_autofree char *text = g_strjoinv("\n", lines);
    cr_assert(g_file_set_contents(path, text, -1, NULL));
    const char *argv[] = {"replay", path, "--verify", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    const char *v = out ? strstr(out, "verify: ") : NULL;
    *verdict = v ? g_strndup(v, strcspn(v, "\n")) : g_strdup(err ? err : "");
    return rc;
}

/* The index of the n-th line (0-based) starting with `prefix`, or -1. */
static int nth(char **lines, const char *prefix, int n)
{
    for (int i = 0; lines[i]; i++)
        if (g_str_has_prefix(lines[i], prefix) && n-- == 0)
            return i;
    return -1;
}

static void expect_mismatch(char **lines, const char *what, const char *needle)
{
    g_autofree char *v = NULL;
    int rc = verify(lines, &v);
    cr_expect_eq(rc, 1, "%s: exit %d, expected 1 (a mismatch): %s", what, rc, v);
    cr_expect(strstr(v, " 0 mismatches") == NULL && strstr(v, "first:"), "%s: %s", what, v);
    if (needle)
        cr_expect(strstr(v, needle), "%s: the mismatch does not say '%s': %s", what, needle, v);
}

Test(verify, recording_verifies)
{
    g_auto(GStrv) lines = fixture_lines();
    g_autofree char *v = NULL;
    cr_expect_eq(verify(lines, &v), 0, "%s", v);
    cr_expect(strstr(v, " 0 mismatches"), "%s", v);
    /* every alloc's address, every segment event, the OOM and the final totals */
    unsigned checks = 0;
    cr_expect(sscanf(v, "verify: %u checks", &checks) == 1 && checks >= 700, "%s", v);
}

Test(verify, moved_address_fails)
{
    g_auto(GStrv) lines = fixture_lines();
    int i = nth(lines, "alloc ", 9);
    cr_assert_geq(i, 0);
    char *a = strstr(lines[i], "addr=0x");
    cr_assert(a);
    guint64 addr = g_ascii_strtoull(a + 7, NULL, 16);
    char *moved = g_strdup_printf("%.*saddr=%#" G_GINT64_MODIFIER "x", (int)(a - lines[i]),
                                  lines[i], addr + 512);
    g_free(lines[i]);
    lines[i] = moved;
    expect_mismatch(lines, "a block moved by 512 bytes", "expected the block at");
}

Test(verify, missing_segment_free_fails)
{
    g_auto(GStrv) lines = fixture_lines();
    int i = nth(lines, "segment_free ", 0);
    cr_assert_geq(i, 0);
    g_free(lines[i]);
    lines[i] = g_strdup("");
    expect_mismatch(lines, "a segment_free dropped", "segment_free");
}

Test(verify, changed_size_fails)
{
    g_auto(GStrv) lines = fixture_lines();
    int i = nth(lines, "alloc ", 2);
    cr_assert(i >= 0 && strstr(lines[i], "size=393216"), "%s", i >= 0 ? lines[i] : "");
    g_auto(GStrv) parts = g_strsplit(lines[i], "size=393216", 2);
    g_free(lines[i]);
    lines[i] = g_strjoinv("size=1393216", parts);
    expect_mismatch(lines, "a request of 393216 bytes made 1393216", NULL);
}

Test(verify, reordered_free_fails)
{
    g_auto(GStrv) lines = fixture_lines();
    /* free t=134, then the alloc of 1 byte that takes its place */
    int i = -1;
    for (int k = 0; lines[k] && lines[k + 1]; k++)
        if (strcmp(lines[k], "free t=134") == 0 && g_str_has_prefix(lines[k + 1], "alloc t=135 "))
            i = k;
    cr_assert_geq(i, 0, "the fixture lost its free t=134");
    char *t = lines[i];
    lines[i] = lines[i + 1];
    lines[i + 1] = t;
    expect_mismatch(lines, "a free moved past the next alloc", "alloc t=135");
}

Test(verify, wrong_final_size_fails)
{
    g_auto(GStrv) lines = fixture_lines();
    int i = nth(lines, "rank 0 ", 0);
    cr_assert_geq(i, 0);
    g_auto(GStrv) parts = g_strsplit(lines[i], "final_reserved=22571646976", 2);
    cr_assert(parts[1], "%s", lines[i]);
    g_free(lines[i]);
    lines[i] = g_strjoinv("final_reserved=22571646464", parts);
    expect_mismatch(lines, "a final reserved total 512 bytes short", "final reserved");
}
