/* The text form of traces (formats/text_*.c): canonical round trips through .mst, every
 * event field, header growth, and the errors for bad lines. */
#include "testutil.h"
#include "tracegen.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <string.h>

/* Reads a whole trace from memory into a MemsimTrace (the same way memsim_trace_load does,
 * via a temporary file). */
static MemsimTrace *load_memory(const char *data, gsize len, const char *ext)
{
    char *dir = tu_tmpdir();
    char *path = g_strdup_printf("%s/t%s", dir, ext);
    GError *err = NULL;
    TG_CHECK(g_file_set_contents(path, data, (gssize)len, &err), "cannot write %s", path);
    MemsimTrace *t = memsim_trace_load(path, &err);
    TG_CHECK(t != NULL, "%s", err ? err->message : "?");
    g_unlink(path);
    g_rmdir(dir);
    g_free(path);
    g_free(dir);
    return t;
}

/* The error message for a text, or NULL when it is accepted. */
static char *text_error(const char *text)
{
    GError *err = NULL;
    MemsimTraceReader *r = tg_open_memory(text, strlen(text), "in.txt", &err);
    if (r) {
        tg_drain(r, NULL, &err);
        memsim_trace_reader_free(r);
    }
    if (!err)
        return NULL;
    TG_CHECK(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s", err->message);
    char *m = g_strdup(err->message);
    g_error_free(err);
    return m;
}

#define HEAD "memsim-trace 1\nrank 0 streams=2\nstring 0 \"s\"\nopinfo 0 name=0\n@rank 0\n"

/* line 0: an error of the whole file, before any line is read. */
static void expect_error(const char *text, int line, const char *what)
{
    char *m = text_error(text);
    TG_CHECK(m != NULL, "accepted: %.300s", text);
    char *prefix = line ? g_strdup_printf("in.txt:%d: ", line) : g_strdup("in.txt: ");
    if (!g_str_has_prefix(m, prefix) || !strstr(m, what))
        cr_expect_fail("expected %s...%s..., got: %s", prefix, what, m);
    g_free(prefix);
    g_free(m);
}

static void expect_ok(const char *text)
{
    char *m = text_error(text);
    TG_CHECK(m == NULL, "rejected: %s", m);
}

static char *strip_comments(const char *text)
{
    GString *g = g_string_new(NULL);
    char **lines = g_strsplit(text, "\n", -1);
    for (char **l = lines; *l; l++) {
        if ((*l)[0] == '#')
            continue;
        g_string_append(g, *l);
        if (l[1])
            g_string_append_c(g, '\n');
    }
    g_strfreev(lines);
    return g_string_free(g, FALSE);
}

Test(text, small_is_canonical_through_mst)
{
    char *in = tu_test_data("good/small.txt");
    char *dir = tu_tmpdir();
    char *mst = g_build_filename(dir, "small.mst", NULL);
    char *out = g_build_filename(dir, "small.txt", NULL);
    GError *err = NULL;
    cr_assert(memsim_convert(in, mst, &err), "%s", err ? err->message : "?");
    cr_assert(memsim_convert(mst, out, &err), "%s", err ? err->message : "?");
    gsize n1, n2;
    char *a = tg_read_file(in, &n1), *b = tg_read_file(out, &n2);
    char *expected = strip_comments(a);
    cr_assert_str_eq(b, expected, "text → .mst → text changed the text");
    /* Every event kind is there. */
    MemsimTrace *t = memsim_trace_load(in, &err);
    cr_assert(t != NULL);
    gboolean seen[MEMSIM_EV_KIND_MAX + 1] = {FALSE};
    for (guint32 r = 0; r < memsim_trace_header(t)->n_ranks; r++) {
        gsize n;
        const MemsimEvent *ev = memsim_trace_events(t, r, &n);
        for (gsize i = 0; i < n; i++)
            seen[ev[i].kind] = TRUE;
    }
    for (int k = 1; k <= MEMSIM_EV_KIND_MAX; k++)
        cr_expect(seen[k], "small.txt lacks a %s event", memsim_event_kind_name(k));
    memsim_trace_free(t);
    g_free(expected);
    g_free(a);
    g_free(b);
    g_unlink(mst);
    g_unlink(out);
    g_rmdir(dir);
    g_free(in);
    g_free(dir);
    g_free(mst);
    g_free(out);
}

/* Every text file of tests/data/good is canonical (comments aside). */
Test(text, good_texts_are_canonical)
{
    char *gdir = tu_test_data("good");
    char *dir = tu_tmpdir();
    GDir *d = g_dir_open(gdir, 0, NULL);
    cr_assert(d != NULL);
    const char *f;
    while ((f = g_dir_read_name(d))) {
        if (!g_str_has_suffix(f, ".txt"))
            continue;
        char *in = g_build_filename(gdir, f, NULL);
        char *mst = g_build_filename(dir, "x.mst", NULL),
             *out = g_build_filename(dir, "x.txt", NULL);
        GError *err = NULL;
        cr_assert(memsim_convert(in, mst, &err), "%s", err ? err->message : "?");
        cr_assert(memsim_convert(mst, out, &err), "%s", err ? err->message : "?");
        gsize n1, n2;
        char *a = tg_read_file(in, &n1), *b = tg_read_file(out, &n2);
        char *expected = strip_comments(a);
        cr_expect_str_eq(b, expected, "%s is not canonical", f);
        g_free(expected);
        g_free(a);
        g_free(b);
        g_unlink(mst);
        g_unlink(out);
        g_free(in);
        g_free(mst);
        g_free(out);
    }
    g_dir_close(d);
    g_rmdir(dir);
    g_free(dir);
    g_free(gdir);
}

Test(text, good_mst_matches_good_text)
{
    GError *err = NULL;
    char *txt = tu_test_data("good/small.txt"), *mst = tu_test_data("good/small.mst");
    MemsimTrace *a = memsim_trace_load(txt, &err);
    cr_assert(a != NULL, "%s", err ? err->message : "?");
    MemsimTrace *b = memsim_trace_load(mst, &err);
    cr_assert(b != NULL, "%s", err ? err->message : "?");
    tg_assert_same_trace(a, b);
    memsim_trace_free(a);
    memsim_trace_free(b);
    g_free(txt);
    g_free(mst);
}

/* In memory → text → in memory is exact, and the text is a fixed point of text → .mst →
 * text, for random traces with every field and extreme values. */
Test(text, random_round_trips)
{
    for (guint32 seed = 1; seed <= 60; seed++) {
        MemsimTrace *t = tg_random_trace(seed, seed % 4, seed * 37);
        gsize n1, n2, n3;
        char *text = tg_save_memory(t, MEMSIM_FORMAT_TEXT, &n1);
        MemsimTrace *back = load_memory(text, n1, ".txt");
        tg_assert_same_trace(t, back);
        char *mst = tg_save_memory(back, MEMSIM_FORMAT_MST, &n2);
        MemsimTrace *back2 = load_memory(mst, n2, ".mst");
        tg_assert_same_trace(t, back2);
        char *text2 = tg_save_memory(back2, MEMSIM_FORMAT_TEXT, &n3);
        TG_CHECK(n1 == n3 && memcmp(text, text2, n1) == 0, "seed %u: text differs", seed);
        memsim_trace_free(t);
        memsim_trace_free(back);
        memsim_trace_free(back2);
        free(text);
        free(mst);
        free(text2);
    }
}

/* Strings and ops declared between events keep their place through .mst. */
Test(text, header_growth_keeps_its_place)
{
    const char *text = "memsim-trace 1\n"
                       "name \"\"\n"
                       "capacity 0\n"
                       "rank 0 device=0 multiplicity=1 streams=1\n"
                       "rank 1 device=1 multiplicity=1 streams=1\n"
                       "string 0 \"a\"\n"
                       "@rank 0\n"
                       "mark 0\n"
                       "string 1 \"b\"\n"
                       "mark 1\n"
                       "opinfo 0 name=1 phase=other layer=-1 microbatch=-1 duration_us=0\n"
                       "@rank 1\n"
                       "op 0\n"
                       "@rank 0\n"
                       "op 0\n"
                       "string 2 \"end\"\n";
    char *dir = tu_tmpdir();
    char *in = g_build_filename(dir, "in.txt", NULL), *mst = g_build_filename(dir, "x.mst", NULL),
         *out = g_build_filename(dir, "out.txt", NULL);
    GError *err = NULL;
    cr_assert(g_file_set_contents(in, text, -1, NULL));
    cr_assert(memsim_convert(in, mst, &err), "%s", err ? err->message : "?");
    cr_assert(memsim_convert(mst, out, &err), "%s", err ? err->message : "?");
    gsize n;
    char *back = tg_read_file(out, &n);
    cr_assert_str_eq(back, text);
    g_free(back);
    g_unlink(in);
    g_unlink(mst);
    g_unlink(out);
    g_rmdir(dir);
    g_free(in);
    g_free(mst);
    g_free(out);
    g_free(dir);
}

Test(text, empty_traces)
{
    expect_ok("memsim-trace 1\n");
    expect_ok("memsim-trace 1");
    expect_ok("memsim-trace 1\nrank 0\n");
    MemsimTrace *t = memsim_trace_new("empty");
    gsize n;
    char *text = tg_save_memory(t, MEMSIM_FORMAT_TEXT, &n);
    cr_assert_str_eq(text, "memsim-trace 1\nname \"empty\"\ncapacity 0\n");
    MemsimTrace *back = load_memory(text, n, ".txt");
    tg_assert_same_trace(t, back);
    memsim_trace_free(t);
    memsim_trace_free(back);
    free(text);
}

Test(text, hand_written_conveniences)
{
    /* Comments, blank lines, CRLF, keys in any order, defaults, quoted mark and op names. */
    const char *text = "memsim-trace 1   # version\r\n"
                       "\n"
                       "   # a comment line\n"
                       "rank 0 streams=2\r\n"
                       "opinfo 0 name=\"fwd\" phase=forward\n"
                       "@rank 0\n"
                       "alloc size=0x10 t=1 # stream and category default\n"
                       "mark \"step # 1\"\n"
                       "mark \"fwd\"\n"
                       "op 0 stream=1\n"
                       "\t\n";
    gsize n = strlen(text);
    MemsimTrace *t = load_memory(text, n, ".txt");
    MemsimTraceHeader *h = memsim_trace_header(t);
    cr_assert_eq(h->n_strings, 2);
    cr_assert_str_eq(h->strings[0], "fwd");
    cr_assert_str_eq(h->strings[1], "step # 1");
    cr_assert_eq(h->n_ops, 1);
    cr_assert_eq(h->ops[0].layer, -1);
    cr_assert_eq(h->ops[0].phase, MEMSIM_PHASE_FORWARD);
    cr_assert_eq(h->ranks[0].device, 0);
    cr_assert_eq(h->ranks[0].multiplicity, 1);
    gsize ne;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &ne);
    cr_assert_eq(ne, 4);
    cr_assert(ev[0].kind == MEMSIM_EV_ALLOC && ev[0].size == 16 && ev[0].id == 1 &&
              ev[0].stream == 0 && ev[0].category == MEMSIM_CAT_OTHER && ev[0].flags == 0);
    cr_assert(ev[1].kind == MEMSIM_EV_MARK && ev[1].id == 1);
    cr_assert(ev[2].kind == MEMSIM_EV_MARK && ev[2].id == 0);
    cr_assert(ev[3].kind == MEMSIM_EV_OP && ev[3].stream == 1);
    memsim_trace_free(t);
}

Test(text, numbers)
{
    expect_ok(HEAD "alloc t=18446744073709551615 size=0xffffffffffffffff\n");
    expect_ok(HEAD "alloc t=0 size=000123\n");
    expect_error(HEAD "alloc t=1 size=18446744073709551616\n", 6, "does not fit in 64 bits");
    expect_error(HEAD "alloc t=1 size=0x10000000000000000\n", 6, "does not fit in 64 bits");
    expect_error(HEAD "alloc t=1 size=99999999999999999999999\n", 6, "does not fit");
    expect_error(HEAD "alloc t=-1 size=1\n", 6, "negative");
    expect_error(HEAD "alloc t=1 size=+1\n", 6, "expected a number");
    expect_error(HEAD "alloc t=1 size=1e3\n", 6, "expected a number");
    expect_error(HEAD "alloc t=1 size=0x\n", 6, "expected a number");
    expect_error(HEAD "alloc t=1 size=\"1\"\n", 6, "expected a number");
    expect_error(HEAD "alloc t=1 size=1 stream=65536\n", 6, "out of range");
    expect_error(HEAD "alloc t=1 size=1 stream=2\n", 6, "not one of the rank's 2 streams");
    expect_error(HEAD "free t=1 flags=0x100000000\n", 6, "out of range");
    expect_error("memsim-trace 1\nopinfo 0 name=\"x\" layer=2147483648\n", 2, "out of range");
    expect_ok("memsim-trace 1\nopinfo 0 name=\"x\" layer=-2147483648 microbatch=2147483647\n");
    expect_error("memsim-trace 1\nopinfo 0 name=\"x\" duration_us=-1\n", 2, "finite number");
    expect_error("memsim-trace 1\nopinfo 0 name=\"x\" duration_us=nan\n", 2, "finite number");
    expect_error("memsim-trace 1\nopinfo 0 name=\"x\" duration_us=1x\n", 2, "finite number");
    expect_error("memsim-trace 1\ncapacity 18446744073709551616\n", 2, "64 bits");
}

Test(text, bad_lines)
{
    expect_error("", 0, "empty file");
    expect_error("memsim-trace 2\n", 1, "version 2 is not supported");
    expect_error("memsim-trace\n", 1, "memsim-trace 1");
    expect_error("hello\n", 0, "not a trace");
    expect_error(HEAD "allocate t=1 size=2\n", 6, "unknown event kind 'allocate'");
    expect_error(HEAD "alloc t=1\n", 6, "alloc needs size=");
    expect_error(HEAD "alloc t=1 size=2 colour=red\n", 6, "unknown key 'colour'");
    expect_error(HEAD "alloc t=1 size=2 size=3\n", 6, "given twice");
    expect_error(HEAD "alloc t=1 size=2 cat=weights\n", 6, "unknown category 'weights'");
    expect_error(HEAD "alloc t=1 size=2 extra\n", 6, "unexpected 'extra'");
    expect_error(HEAD "alloc t=1 size=\n", 6, "has no value");
    expect_error(HEAD "alloc t=1 =3\n", 6, "without a key");
    expect_error(HEAD "alloc t=1 size=2\"x\"\n", 6, "unexpected '\"' after \"2\"");
    expect_error(HEAD "free t=1 id=2\n", 6, "unknown key 'id'");
    expect_error(HEAD "op\n", 6, "op needs a number");
    expect_error(HEAD "op 1\n", 6, "not in the op table");
    expect_error(HEAD "mark 1\n", 6, "not defined");
    expect_error(HEAD "wait stream=0 on=2\n", 6, "wait on stream 2");
    expect_error(HEAD "collective all_sum bytes=1 group=0\n", 6, "unknown collective kind");
    expect_error(HEAD "segment_alloc addr=0xffffffffffffffff size=2\n", 6, "reaches 2^64");
    expect_error(HEAD "init_block t=1 addr=0xffffffffffffffff size=1 block=2\n", 6, "reaches 2^64");
    expect_error(HEAD "mark \"unterminated\n", 6, "unterminated string");
    expect_error(HEAD "mark \"bad \\q escape\"\n", 6, "unknown escape");
    expect_error(HEAD "mark \"nul \\x00\"\n", 6, "\\xHH");
    expect_error(HEAD "mark \"tab\tinside\"\n", 6, "control character");
    expect_error(HEAD "@rank 1\n", 6, "out of range");
    expect_error(HEAD "alloc t=1 size=1\nrank 1\n", 7, "belongs to the header");
    expect_error(HEAD "string 5 \"x\"\n", 6, "out of order");
    expect_error("memsim-trace 1\nalloc t=1 size=1\n", 2, "declares no rank");
    expect_error("memsim-trace 1\nname \"a\"\nname \"b\"\n", 3, "second name");
    expect_error("memsim-trace 1\nname a\n", 2, "quoted string");
    expect_error("memsim-trace 1\nrank 1\n", 2, "out of order");
    expect_error("memsim-trace 1\nrank 0 multiplicity=0\n", 2, "multiplicity 0");
    expect_error("memsim-trace 1\nrank 0 streams=0\n", 2, "0 streams");
    expect_error("memsim-trace 1\nrank 0 streams=2 handles=1\n", 2, "1 handles for 2 streams");
    expect_error("memsim-trace 1\nrank 0 handles=1,2\n", 2, "more handles");
    expect_error("memsim-trace 1\nrank 0 final_reserved=1\n", 2, "go together");
    expect_error("memsim-trace 1\nopinfo 0 phase=forward\n", 2, "needs name=");
    expect_error("memsim-trace 1\nopinfo 0 name=3\n", 2, "not defined");
    expect_error("memsim-trace 1\nopinfo 0 name=\"x\" phase=sideways\n", 2, "unknown phase");
    char nul[] = "memsim-trace 1\nrank 0\n@rank 0\nfree t=1\0\n";
    GError *err = NULL;
    MemsimTraceReader *r = tg_open_memory(nul, sizeof nul - 1, "in.txt", &err);
    cr_assert(r != NULL);
    cr_assert(!tg_drain(r, NULL, &err));
    cr_expect(strstr(err->message, "in.txt:4: NUL byte") != NULL, "%s", err->message);
    g_error_free(err);
    memsim_trace_reader_free(r);
    /* A line of over 1 MiB is refused, not buffered without end. */
    GString *g = g_string_new(HEAD "mark \"");
    for (int i = 0; i < (1 << 20) + 10; i++)
        g_string_append_c(g, 'x');
    g_string_append(g, "\"\n");
    expect_error(g->str, 6, "longer than");
    g_string_free(g, TRUE);
}

/* Fields a kind does not name are written with their raw names and read back. */
Test(text, raw_fields)
{
    MemsimTrace *t = memsim_trace_new("raw");
    memsim_trace_add_rank(t, 0, 1);
    MemsimEvent ev[] = {
        {.kind = MEMSIM_EV_FREE,
         .id = 1,
         .size = 2,
         .addr = 3,
         .aux = 4,
         .category = 5,
         .flags = 6},
        {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = 2, .addr = 3, .flags = 0},
        {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = 2, .addr = 0, .flags = MEMSIM_EVF_ADDR},
        {.kind = MEMSIM_EV_EMPTY_CACHE, .flags = MEMSIM_EVF_INFERRED | 8},
        {.kind = MEMSIM_EV_INIT_SEGMENT, .addr = 16, .size = 16, .aux = 1 | 16},
        {.kind = MEMSIM_EV_COLLECTIVE, .aux = MEMSIM_COLL_SEND, .size = 8, .id = 2, .addr = 1,
         .flags = MEMSIM_EVF_PEER},
        {.kind = MEMSIM_EV_COLLECTIVE, .aux = MEMSIM_COLL_RECV, .size = 8, .id = 2, .addr = 0,
         .flags = MEMSIM_EVF_PEER},
        {.kind = MEMSIM_EV_COLLECTIVE, .aux = MEMSIM_COLL_ALL_REDUCE, .size = 8, .addr = 3},
    };
    memsim_trace_append(t, 0, ev, G_N_ELEMENTS(ev));
    gsize n;
    char *text = tg_save_memory(t, MEMSIM_FORMAT_TEXT, &n);
    cr_assert(strstr(text, "free t=1 size=2 addr=0x3 aux=0x4 cat=temporary flags=0x6\n"), "%s",
              text);
    cr_assert(strstr(text, "alloc t=1 size=2 stream=0 cat=other addr=0x3 flags=0x0\n"), "%s", text);
    cr_assert(strstr(text, "alloc t=1 size=2 stream=0 cat=other addr=0x0\n"), "%s", text);
    cr_assert(strstr(text, "empty_cache inferred flags=0xa\n"), "%s", text);
    cr_assert(strstr(text, "init_segment addr=0x10 size=16 stream=0 small aux=0x11\n"), "%s", text);
    /* a send's or recv's peer: peer= (decimal) stands for MEMSIM_EVF_PEER, even peer 0 */
    cr_assert(strstr(text, "collective send bytes=8 group=2 peer=1 stream=0\n"), "%s", text);
    cr_assert(strstr(text, "collective recv bytes=8 group=2 peer=0 stream=0\n"), "%s", text);
    cr_assert(strstr(text, "collective all_reduce bytes=8 group=0 peer=3 stream=0 flags=0x0\n"),
              "%s", text);
    MemsimTrace *back = load_memory(text, n, ".txt");
    tg_assert_same_trace(t, back);
    gsize nm;
    char *mst = tg_save_memory(t, MEMSIM_FORMAT_MST, &nm); /* raw fields as .mst extras */
    MemsimTrace *back_mst = load_memory(mst, nm, ".mst");
    tg_assert_same_trace(t, back_mst);
    memsim_trace_free(back_mst);
    free(mst);
    memsim_trace_free(t);
    memsim_trace_free(back);
    free(text);
}

Test(text, bad_corpus)
{
    tg_check_bad_corpus(".txt");
}

/* The output format follows the extension: an unknown one is refused (exit 2, the known ones
 * listed, nothing written) instead of silently writing text; the known ones, in any case,
 * are written. */
static void expect_extensions_listed(const char *err)
{
    static const char *const ext[] = {".mst", ".txt", ".mstt", ".pickle", ".pkl"};
    for (gsize i = 0; i < G_N_ELEMENTS(ext); i++)
        cr_expect(strstr(err, ext[i]) != NULL, "the message does not list %s: %s", ext[i], err);
}

Test(text, unknown_output_extension, .timeout = 120)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *in = tu_test_data("good/small.mst");
    g_autofree char *xyz = g_build_filename(dir, "out.xyz", NULL);
    g_autofree char *bare = g_build_filename(dir, "out", NULL);
    const char *outs[] = {xyz, bare};
    for (gsize i = 0; i < G_N_ELEMENTS(outs); i++) {
        const char *conv[] = {"convert", in, outs[i], NULL};
        g_autofree char *err = NULL;
        int rc = tu_run_memsim(conv, NULL, &err);
        cr_expect_eq(rc, 2, "convert to %s: exit %d; %s", outs[i], rc, err);
        cr_expect(strstr(err, outs[i]) != NULL, "the message does not name %s: %s", outs[i], err);
        expect_extensions_listed(err);
        cr_expect(!g_file_test(outs[i], G_FILE_TEST_EXISTS), "%s was written", outs[i]);
    }
    const char *gen[] = {"gen", "--model", "gpt2", "--seq", "128", "-o", xyz, NULL};
    g_autofree char *gerr = NULL;
    int rc = tu_run_memsim(gen, NULL, &gerr);
    cr_expect_eq(rc, 2, "gen -o %s: exit %d; %s", xyz, rc, gerr);
    cr_expect(strstr(gerr, xyz) != NULL, "the message does not name %s: %s", xyz, gerr);
    expect_extensions_listed(gerr);
    cr_expect(!g_file_test(xyz, G_FILE_TEST_EXISTS), "%s was written", xyz);

    /* The library's convert and save refuse too; an explicit format still writes any name. */
    GError *error = NULL;
    cr_expect(!memsim_convert(in, xyz, &error));
    cr_expect(error && g_error_matches(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT) &&
                  strstr(error->message, ".mstt"),
              "%s", error ? error->message : "no error");
    g_clear_error(&error);
    MemsimTrace *t = memsim_trace_load(in, &error);
    cr_assert_not_null(t, "%s", error ? error->message : "?");
    cr_expect(!memsim_trace_save(t, xyz, MEMSIM_FORMAT_AUTO, &error));
    cr_expect(error && strstr(error->message, ".pkl"), "%s", error ? error->message : "?");
    g_clear_error(&error);
    cr_expect(!g_file_test(xyz, G_FILE_TEST_EXISTS), "%s was written", xyz);
    cr_expect(memsim_trace_save(t, xyz, MEMSIM_FORMAT_TEXT, &error), "%s",
              error ? error->message : "?");
    g_clear_error(&error);
    memsim_trace_free(t);
    g_unlink(xyz);

    /* Known extensions, any case, still convert. */
    static const char *const ok[] = {"a.mst", "b.txt", "c.mstt", "D.TXT", "e.Mst"};
    for (gsize i = 0; i < G_N_ELEMENTS(ok); i++) {
        g_autofree char *out = g_build_filename(dir, ok[i], NULL);
        const char *conv[] = {"convert", in, out, NULL};
        g_autofree char *err = NULL;
        cr_expect_eq(tu_run_memsim(conv, NULL, &err), 0, "convert to %s: %s", ok[i], err);
        cr_expect(g_file_test(out, G_FILE_TEST_IS_REGULAR), "%s not written", ok[i]);
        g_unlink(out);
    }
    g_rmdir(dir);
}

/* An error in a trace names the file given first; the trace's own name (its `name` line,
 * often the file it was converted from) may follow, never replace it. */
Test(text, convert_error_names_the_input, .timeout = 120)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *in = g_build_filename(dir, "in.txt", NULL);
    g_autofree char *out = g_build_filename(dir, "out.pickle", NULL);
    static const char text[] = "memsim-trace 1\n"
                               "name \"embedded-source.pickle\"\n"
                               "rank 0 device=0 multiplicity=1 streams=1\n"
                               "@rank 0\n"
                               "alloc t=1 size=4096\n"
                               "alloc t=1 size=4096\n";
    GError *error = NULL;
    cr_assert(g_file_set_contents(in, text, -1, &error), "%s", error ? error->message : "?");
    const char *argv[] = {"convert", in, out, NULL};
    g_autofree char *err = NULL;
    int rc = tu_run_memsim(argv, NULL, &err);
    g_autofree char *want = g_strdup_printf("memsim convert: %s: ", in);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, err);
    cr_expect(g_str_has_prefix(err, want), "the message does not start with %s: %s", in, err);
    cr_expect(strstr(err, "tensor 1") != NULL, "%s", err);
    cr_expect(!g_file_test(out, G_FILE_TEST_EXISTS), "%s was written", out);
    cr_expect(!memsim_convert(in, out, &error));
    cr_expect(error && g_str_has_prefix(error->message, in), "%s",
              error ? error->message : "no error");
    g_clear_error(&error);
    g_unlink(in);
    g_rmdir(dir);
}
