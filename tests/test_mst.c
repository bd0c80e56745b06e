/* The .mst trace file (formats/mst_*.c): round trips with every field and extreme values,
 * conformance of the hand-coded chunks with protobuf-c and the spec, header growth, many
 * ranks, empty traces, streaming with bounded memory, and the bad-input corpus.
 *
 * The binary files of tests/data/bad/mst-*.exit2.mst are made by bad_files[] below;
 * regenerate them with
 *     MEMSIM_REGENERATE=1 meson test -C build test_mst
 * (the test then writes them into the source tree's tests/data/bad).
 * (The decode speed is memsim-bench replay's to measure, not a test's.)
 */
#include "testutil.h"
#include "tracegen.h"

#include "formats/mst.pb-c.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <string.h>
#include <zstd.h>

/* ---- raw building blocks for hand-made files ---- */

static void raw_varint(GByteArray *b, uint64_t v)
{
    while (v >= 0x80) {
        guint8 c = (guint8)(v | 0x80);
        g_byte_array_append(b, &c, 1);
        v >>= 7;
    }
    guint8 c = (guint8)v;
    g_byte_array_append(b, &c, 1);
}

static void raw_preamble(GByteArray *b, const char *magic, unsigned major, unsigned minor)
{
    g_byte_array_append(b, (const guint8 *)magic, 8);
    guint8 v[4] = {major & 0xff, major >> 8, minor & 0xff, minor >> 8};
    g_byte_array_append(b, v, 4);
}

/* A record: its length, then a Record with `field` = body. */
static void raw_record(GByteArray *b, unsigned field, const GByteArray *body)
{
    GByteArray *rec = g_byte_array_new();
    raw_varint(rec, field << 3 | 2);
    raw_varint(rec, body->len);
    g_byte_array_append(rec, body->data, body->len);
    raw_varint(b, rec->len);
    g_byte_array_append(b, rec->data, rec->len);
    g_byte_array_unref(rec);
}

static void pb_varint_field(GByteArray *b, unsigned field, uint64_t v)
{
    raw_varint(b, field << 3);
    raw_varint(b, v);
}

static void pb_packed_field(GByteArray *b, unsigned field, const uint64_t *v, gsize n)
{
    GByteArray *p = g_byte_array_new();
    for (gsize i = 0; i < n; i++)
        raw_varint(p, v[i]);
    raw_varint(b, field << 3 | 2);
    raw_varint(b, p->len);
    g_byte_array_append(b, p->data, p->len);
    g_byte_array_unref(p);
}

static GByteArray *pack_message(const ProtobufCMessage *m)
{
    GByteArray *b = g_byte_array_new();
    g_byte_array_set_size(b, (guint)protobuf_c_message_get_packed_size(m));
    protobuf_c_message_pack(m, b->data);
    return b;
}

/* The header of the hand-made files: 2 ranks of 2 streams, 1 string, 1 op; tweakable. */
typedef struct {
    uint32_t multiplicity;
    uint32_t op_name;
} HeaderSpec;

static GByteArray *pb_header(HeaderSpec spec)
{
    Memsim__Mst__Header h = MEMSIM__MST__HEADER__INIT;
    h.name = (char *)"hand-made";
    Memsim__Mst__Rank ranks[2], *rp[2];
    for (int i = 0; i < 2; i++) {
        memsim__mst__rank__init(&ranks[i]);
        ranks[i].has_device = ranks[i].has_multiplicity = ranks[i].has_n_streams = TRUE;
        ranks[i].device = (uint32_t)i;
        ranks[i].multiplicity = spec.multiplicity ? spec.multiplicity : 1;
        ranks[i].n_streams = 2;
        rp[i] = &ranks[i];
    }
    if (spec.multiplicity == G_MAXUINT32)
        ranks[1].multiplicity = 0;
    h.n_ranks = 2;
    h.ranks = rp;
    char *strings[] = {(char *)"linear"};
    h.n_strings = 1;
    h.strings = strings;
    Memsim__Mst__Op op = MEMSIM__MST__OP__INIT, *opp = &op;
    op.has_name = TRUE;
    op.name = spec.op_name;
    h.n_ops = 1;
    h.ops = &opp;
    return pack_message(&h.base);
}

static GByteArray *pb_end(uint64_t n_chunks, uint64_t n_events)
{
    Memsim__Mst__End e = MEMSIM__MST__END__INIT;
    e.has_n_chunks = e.has_n_events = TRUE;
    e.n_chunks = n_chunks;
    e.n_events = n_events;
    return pack_message(&e.base);
}

/* A chunk of rank `rank`: ALLOC t=1 size=4096, OP 0, FREE t=1 (ids delta coded per kind). */
static GByteArray *pb_chunk_basic(uint64_t rank)
{
    GByteArray *c = g_byte_array_new();
    pb_varint_field(c, 1, rank);
    pb_varint_field(c, 2, 3);
    uint64_t kinds[] = {MEMSIM_EV_ALLOC, MEMSIM_EV_OP, MEMSIM_EV_FREE};
    uint64_t ids[] = {2, 0, 2}; /* zigzag(1), zigzag(0), zigzag(1) */
    uint64_t sizes[] = {4096};
    pb_packed_field(c, 3, kinds, 3);
    pb_packed_field(c, 7, ids, 3);
    pb_packed_field(c, 8, sizes, 1);
    return c;
}

static GBytes *compress(const GByteArray *raw)
{
    ZSTD_CCtx *z = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(z, ZSTD_c_checksumFlag, 1);
    gsize cap = ZSTD_compressBound(raw->len);
    guint8 *out = g_malloc(cap);
    size_t n = ZSTD_compress2(z, out, cap, raw->data, raw->len);
    cr_assert(!ZSTD_isError(n));
    ZSTD_freeCCtx(z);
    return g_bytes_new_take(out, n);
}

/* A valid file made of the hand-made pieces: header, one basic chunk per rank, end. */
static GByteArray *raw_valid(void)
{
    GByteArray *raw = g_byte_array_new();
    raw_preamble(raw, "MEMSIMTR", 1, 0);
    GByteArray *h = pb_header((HeaderSpec){0});
    raw_record(raw, 1, h);
    for (int r = 0; r < 2; r++) {
        GByteArray *c = pb_chunk_basic((uint64_t)r);
        raw_record(raw, 2, c);
        g_byte_array_unref(c);
    }
    GByteArray *e = pb_end(2, 6);
    raw_record(raw, 3, e);
    g_byte_array_unref(h);
    g_byte_array_unref(e);
    return raw;
}

/* ---- the bad files ---- */

/* A file from a header (spec), chunks (built by `chunk`), and an end record. */
static GBytes *file_with_chunk(HeaderSpec hs, GByteArray *chunk, uint64_t end_events)
{
    GByteArray *raw = g_byte_array_new();
    raw_preamble(raw, "MEMSIMTR", 1, 0);
    GByteArray *h = pb_header(hs);
    raw_record(raw, 1, h);
    raw_record(raw, 2, chunk);
    GByteArray *e = pb_end(1, end_events);
    raw_record(raw, 3, e);
    GBytes *z = compress(raw);
    g_byte_array_unref(h);
    g_byte_array_unref(e);
    g_byte_array_unref(chunk);
    g_byte_array_unref(raw);
    return z;
}

static GByteArray *chunk_of(uint64_t rank, const uint64_t *kinds, gsize n, int col,
                            const uint64_t *vals, gsize n_vals)
{
    GByteArray *c = g_byte_array_new();
    pb_varint_field(c, 1, rank);
    pb_varint_field(c, 2, n);
    pb_packed_field(c, 3, kinds, n);
    if (col)
        pb_packed_field(c, (unsigned)col, vals, n_vals);
    return c;
}

static GBytes *bad_truncated(void)
{
    GByteArray *raw = raw_valid();
    GBytes *z = compress(raw);
    g_byte_array_unref(raw);
    gsize n;
    const guint8 *d = g_bytes_get_data(z, &n);
    GBytes *cut = g_bytes_new(d, n / 2);
    g_bytes_unref(z);
    return cut;
}

static GBytes *bad_corrupt_zstd(void)
{
    GByteArray *raw = raw_valid();
    GBytes *z = compress(raw);
    g_byte_array_unref(raw);
    gsize n;
    const guint8 *src = g_bytes_get_data(z, &n);
    guint8 *d = g_memdup2(src, n);
    for (gsize i = n / 2; i < n / 2 + 4 && i < n; i++)
        d[i] ^= 0x5a;
    g_bytes_unref(z);
    return g_bytes_new_take(d, n);
}

static GBytes *bad_wrong_magic(void)
{
    GByteArray *raw = raw_valid();
    memcpy(raw->data, "MEMSIMXX", 8);
    GBytes *z = compress(raw);
    g_byte_array_unref(raw);
    return z;
}

static GBytes *bad_future_version(void)
{
    GByteArray *raw = raw_valid();
    raw->data[8] = 2;
    GBytes *z = compress(raw);
    g_byte_array_unref(raw);
    return z;
}

static GBytes *bad_columns(void)
{
    uint64_t kinds[] = {MEMSIM_EV_ALLOC, MEMSIM_EV_FREE, MEMSIM_EV_FREE};
    uint64_t ids[] = {2, 2};
    return file_with_chunk((HeaderSpec){0}, chunk_of(0, kinds, 3, 7, ids, 2), 3);
}

static GBytes *bad_columns_left_over(void)
{
    uint64_t kinds[] = {MEMSIM_EV_FREE, MEMSIM_EV_FREE};
    uint64_t ids[] = {2, 2, 2};
    return file_with_chunk((HeaderSpec){0}, chunk_of(0, kinds, 2, 7, ids, 3), 2);
}

static GBytes *bad_rank(void)
{
    return file_with_chunk((HeaderSpec){0}, pb_chunk_basic(2), 3);
}

static GBytes *bad_kind(void)
{
    uint64_t kinds[] = {MEMSIM_EV_FREE, MEMSIM_EV_KIND_MAX + 1};
    uint64_t ids[] = {2};
    return file_with_chunk((HeaderSpec){0}, chunk_of(0, kinds, 2, 7, ids, 1), 2);
}

static GBytes *bad_stream(void)
{
    uint64_t kinds[] = {MEMSIM_EV_EMPTY_CACHE, MEMSIM_EV_EMPTY_CACHE};
    uint64_t streams[] = {1, 2};
    return file_with_chunk((HeaderSpec){0}, chunk_of(0, kinds, 2, 4, streams, 2), 2);
}

static GBytes *bad_op_index(void)
{
    uint64_t kinds[] = {MEMSIM_EV_OP};
    uint64_t ids[] = {6}; /* zigzag(3) */
    return file_with_chunk((HeaderSpec){0}, chunk_of(0, kinds, 1, 7, ids, 1), 1);
}

static GBytes *bad_mark_string(void)
{
    uint64_t kinds[] = {MEMSIM_EV_MARK};
    uint64_t ids[] = {18}; /* zigzag(9) */
    return file_with_chunk((HeaderSpec){0}, chunk_of(0, kinds, 1, 7, ids, 1), 1);
}

static GBytes *bad_op_unknown_string(void)
{
    return file_with_chunk((HeaderSpec){.op_name = 5}, pb_chunk_basic(0), 3);
}

static GBytes *bad_multiplicity(void)
{
    return file_with_chunk((HeaderSpec){.multiplicity = G_MAXUINT32}, pb_chunk_basic(0), 3);
}

static GBytes *bad_segment_overflow(void)
{
    uint64_t kinds[] = {MEMSIM_EV_SEG_ALLOC};
    uint64_t addrs[] = {2}; /* zigzag(1) */
    GByteArray *c = chunk_of(0, kinds, 1, 9, addrs, 1);
    uint64_t sizes[] = {UINT64_MAX};
    pb_packed_field(c, 8, sizes, 1);
    return file_with_chunk((HeaderSpec){0}, c, 1);
}

static GBytes *bad_varint(void)
{
    GByteArray *c = g_byte_array_new();
    pb_varint_field(c, 1, 0);
    pb_varint_field(c, 2, 1);
    uint64_t kinds[] = {MEMSIM_EV_ALLOC};
    pb_packed_field(c, 3, kinds, 1);
    /* size: an 11-byte varint */
    static const guint8 big[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    raw_varint(c, 8 << 3 | 2);
    raw_varint(c, sizeof big);
    g_byte_array_append(c, big, sizeof big);
    return file_with_chunk((HeaderSpec){0}, c, 1);
}

static GBytes *bad_not_protobuf(void)
{
    GByteArray *c = g_byte_array_new();
    static const guint8 junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x42};
    g_byte_array_append(c, junk, sizeof junk);
    return file_with_chunk((HeaderSpec){0}, c, 0);
}

static GBytes *bad_header_not_protobuf(void)
{
    GByteArray *raw = g_byte_array_new();
    raw_preamble(raw, "MEMSIMTR", 1, 0);
    GByteArray *h = g_byte_array_new();
    static const guint8 junk[] = {0x22, 0x05, 0x08}; /* ranks: length 5, only 1 byte */
    g_byte_array_append(h, junk, sizeof junk);
    raw_record(raw, 1, h);
    GBytes *z = compress(raw);
    g_byte_array_unref(h);
    g_byte_array_unref(raw);
    return z;
}

static GBytes *bad_no_end(void)
{
    GByteArray *raw = raw_valid();
    GByteArray *e = pb_end(2, 6);
    g_byte_array_set_size(raw, raw->len - e->len - 3); /* drop the end record */
    GBytes *z = compress(raw);
    g_byte_array_unref(e);
    g_byte_array_unref(raw);
    return z;
}

static GBytes *bad_trailing(void)
{
    GByteArray *raw = raw_valid();
    GByteArray *c = pb_chunk_basic(0);
    raw_record(raw, 2, c);
    GBytes *z = compress(raw);
    g_byte_array_unref(c);
    g_byte_array_unref(raw);
    return z;
}

static GBytes *bad_end_counts(void)
{
    return file_with_chunk((HeaderSpec){0}, pb_chunk_basic(0), 4);
}

static GBytes *bad_record_length(void)
{
    GByteArray *raw = g_byte_array_new();
    raw_preamble(raw, "MEMSIMTR", 1, 0);
    raw_varint(raw, (uint64_t)1 << 40);
    GBytes *z = compress(raw);
    g_byte_array_unref(raw);
    return z;
}

static GBytes *bad_two_headers(void)
{
    GByteArray *raw = g_byte_array_new();
    raw_preamble(raw, "MEMSIMTR", 1, 0);
    GByteArray *h = pb_header((HeaderSpec){0});
    raw_record(raw, 1, h);
    raw_record(raw, 1, h);
    GBytes *z = compress(raw);
    g_byte_array_unref(h);
    g_byte_array_unref(raw);
    return z;
}

static GBytes *bad_chunk_first(void)
{
    GByteArray *raw = g_byte_array_new();
    raw_preamble(raw, "MEMSIMTR", 1, 0);
    GByteArray *c = pb_chunk_basic(0);
    raw_record(raw, 2, c);
    GBytes *z = compress(raw);
    g_byte_array_unref(c);
    g_byte_array_unref(raw);
    return z;
}

static GBytes *bad_too_many_events(void)
{
    GByteArray *c = g_byte_array_new();
    pb_varint_field(c, 1, 0);
    pb_varint_field(c, 2, (uint64_t)1 << 21);
    return file_with_chunk((HeaderSpec){0}, c, (uint64_t)1 << 21);
}

static GBytes *bad_extras_order(void)
{
    uint64_t kinds[] = {MEMSIM_EV_FREE, MEMSIM_EV_FREE};
    GByteArray *c = chunk_of(0, kinds, 2, 0, NULL, 0);
    uint64_t ev[] = {1, 0}, field[] = {2, 2}, val[] = {5, 5};
    pb_packed_field(c, 11, ev, 2);
    pb_packed_field(c, 12, field, 2);
    pb_packed_field(c, 13, val, 2);
    return file_with_chunk((HeaderSpec){0}, c, 2);
}

static GBytes *bad_string_nul(void)
{
    uint64_t kinds[] = {MEMSIM_EV_FREE};
    GByteArray *c = chunk_of(0, kinds, 1, 0, NULL, 0);
    raw_varint(c, 14 << 3 | 2);
    raw_varint(c, 3);
    g_byte_array_append(c, (const guint8 *)"a\0b", 3);
    return file_with_chunk((HeaderSpec){0}, c, 1);
}

static GBytes *bad_empty_stream(void)
{
    GByteArray *raw = g_byte_array_new();
    GBytes *z = compress(raw);
    g_byte_array_unref(raw);
    return z;
}

typedef struct {
    const char *name; /* under tests/data/bad */
    GBytes *(*make)(void);
    const char *expect; /* in the message */
} BadFile;

static const BadFile bad_files[] = {
    {"mst-truncated.exit2.mst", bad_truncated, "truncated"},
    {"mst-corrupt-zstd.exit2.mst", bad_corrupt_zstd, ""},
    {"mst-wrong-magic.exit2.mst", bad_wrong_magic, "magic"},
    {"mst-future-version.exit2.mst", bad_future_version, "version 2.0 is not supported"},
    {"mst-bad-columns.exit2.mst", bad_columns, "column id ends early"},
    {"mst-columns-left-over.exit2.mst", bad_columns_left_over, "column id has values left over"},
    {"mst-rank-out-of-range.exit2.mst", bad_rank, "rank 2 out of range"},
    {"mst-bad-kind.exit2.mst", bad_kind, "event 1: kind 17 out of range"},
    {"mst-stream-out-of-range.exit2.mst", bad_stream, "event 1: stream 2"},
    {"mst-op-out-of-range.exit2.mst", bad_op_index, "op 3 is not in the op table"},
    {"mst-mark-unknown-string.exit2.mst", bad_mark_string, "not in the string table"},
    {"mst-op-unknown-string.exit2.mst", bad_op_unknown_string, "not in the string table"},
    {"mst-multiplicity-zero.exit2.mst", bad_multiplicity, "rank 1: multiplicity 0"},
    {"mst-segment-overflow.exit2.mst", bad_segment_overflow, "reaches 2^64"},
    {"mst-varint-overflow.exit2.mst", bad_varint, "malformed varint"},
    {"mst-not-protobuf.exit2.mst", bad_not_protobuf, "does not decode"},
    {"mst-header-not-protobuf.exit2.mst", bad_header_not_protobuf, "protobuf Header"},
    {"mst-no-end-record.exit2.mst", bad_no_end, "without an end record"},
    {"mst-trailing-data.exit2.mst", bad_trailing, "data after the end record"},
    {"mst-end-counts.exit2.mst", bad_end_counts, "end record counts"},
    {"mst-record-too-long.exit2.mst", bad_record_length, "expected at most"},
    {"mst-two-headers.exit2.mst", bad_two_headers, "second header"},
    {"mst-chunk-before-header.exit2.mst", bad_chunk_first, "expected the header record first"},
    {"mst-too-many-events.exit2.mst", bad_too_many_events, "per chunk"},
    {"mst-extras-out-of-order.exit2.mst", bad_extras_order, "out of order"},
    {"mst-string-nul.exit2.mst", bad_string_nul, "NUL byte"},
    {"mst-empty-stream.exit2.mst", bad_empty_stream, "magic"},
};

/* The error message for bytes read as a .mst from memory, or NULL when accepted. */
static char *mst_error(const guint8 *data, gsize len, const char *name)
{
    GError *err = NULL;
    MemsimTraceReader *r = tg_open_memory((const char *)data, len, name, &err);
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

Test(mst, hand_made_valid_file_reads)
{
    GByteArray *raw = raw_valid();
    GBytes *z = compress(raw);
    gsize n;
    const guint8 *d = g_bytes_get_data(z, &n);
    char *m = mst_error(d, n, "valid.mst");
    cr_assert(m == NULL, "%s", m);
    g_bytes_unref(z);
    g_byte_array_unref(raw);
}

Test(mst, bad_files_fail_as_expected)
{
    gboolean regen = g_getenv("MEMSIM_REGENERATE") != NULL;
    for (gsize i = 0; i < G_N_ELEMENTS(bad_files); i++) {
        const BadFile *b = &bad_files[i];
        GBytes *z = b->make();
        gsize n;
        const guint8 *d = g_bytes_get_data(z, &n);
        char *rel = g_build_filename("bad", b->name, NULL);
        char *path = tu_test_data(rel);
        if (regen) {
            GError *err = NULL;
            cr_assert(g_file_set_contents(path, (const char *)d, (gssize)n, &err), "%s",
                      err ? err->message : "?");
        }
        char *m = mst_error(d, n, b->name);
        TG_CHECK(m != NULL, "%s: accepted", b->name);
        if (!strstr(m, b->expect) || !strstr(m, b->name))
            cr_expect_fail("%s: expected '%s' in: %s", b->name, b->expect, m);
        cr_log_info("%s", m);
        g_free(m);
        /* The committed file fails the same way. */
        GError *err = NULL;
        MemsimTrace *t = memsim_trace_load(path, &err);
        TG_CHECK(t == NULL, "%s: accepted", path);
        if (!strstr(err->message, b->expect) || !strstr(err->message, b->name))
            cr_expect_fail("%s: expected '%s' in: %s", path, b->expect, err->message);
        g_error_free(err);
        g_free(rel);
        g_free(path);
        g_bytes_unref(z);
    }
}

Test(mst, bad_corpus)
{
    tg_check_bad_corpus(".mst");
}

Test(mst, good_corpus)
{
    char *dir = tu_test_data("good");
    GDir *d = g_dir_open(dir, 0, NULL);
    cr_assert(d != NULL);
    const char *f;
    int n = 0;
    while ((f = g_dir_read_name(d))) {
        if (!g_str_has_suffix(f, ".mst") && !g_str_has_suffix(f, ".txt"))
            continue;
        char *path = g_build_filename(dir, f, NULL);
        GError *err = NULL;
        MemsimTrace *t = memsim_trace_load(path, &err);
        cr_expect(t != NULL, "%s: %s", f, err ? err->message : "?");
        if (err)
            g_error_free(err);
        memsim_trace_free(t);
        g_free(path);
        n++;
    }
    g_dir_close(d);
    g_free(dir);
    cr_assert(n >= 2);
}

/* In memory → .mst → in memory is exact for random traces (all kinds, extreme values,
 * fields a kind does not use, 0 to 7 ranks). */
Test(mst, random_round_trips)
{
    for (guint32 seed = 1; seed <= 80; seed++) {
        MemsimTrace *t = tg_random_trace(seed, seed % 8, (gsize)seed * seed * 3);
        gsize n;
        char *mst = tg_save_memory(t, MEMSIM_FORMAT_MST, &n);
        GError *err = NULL;
        char *dir = tu_tmpdir();
        char *path = g_build_filename(dir, "rt.mst", NULL);
        TG_CHECK(g_file_set_contents(path, mst, (gssize)n, NULL), "write");
        MemsimTrace *loaded = memsim_trace_load(path, &err);
        TG_CHECK(loaded != NULL, "seed %u: %s", seed, err ? err->message : "?");
        tg_assert_same_trace(t, loaded);
        memsim_trace_free(loaded);
        g_unlink(path);
        g_rmdir(dir);
        g_free(path);
        g_free(dir);
        memsim_trace_free(t);
        free(mst);
    }
}

/* ---- conformance: the file decodes with protobuf-c and means what the spec says ---- */

static guint8 *decompress_all(const char *data, gsize len, gsize *out_len)
{
    ZSTD_DCtx *d = ZSTD_createDCtx();
    GByteArray *out = g_byte_array_new();
    ZSTD_inBuffer in = {data, len, 0};
    guint8 buf[65536];
    while (in.pos < in.size) {
        ZSTD_outBuffer o = {buf, sizeof buf, 0};
        size_t r = ZSTD_decompressStream(d, &o, &in);
        cr_assert(!ZSTD_isError(r), "%s", ZSTD_getErrorName(r));
        g_byte_array_append(out, buf, (guint)o.pos);
    }
    ZSTD_freeDCtx(d);
    *out_len = out->len;
    return g_byte_array_free(out, FALSE);
}

static gboolean spec_carries(unsigned kind, char field, uint32_t flags)
{
    switch (field) {
    case 'i':
        return kind == MEMSIM_EV_ALLOC || kind == MEMSIM_EV_FREE || kind == MEMSIM_EV_USE ||
               kind == MEMSIM_EV_OP || kind == MEMSIM_EV_WAIT || kind == MEMSIM_EV_COLLECTIVE ||
               kind == MEMSIM_EV_MARK || kind == MEMSIM_EV_INIT_BLOCK;
    case 's':
        return kind == MEMSIM_EV_ALLOC || kind == MEMSIM_EV_COLLECTIVE ||
               (kind >= MEMSIM_EV_SEG_ALLOC && kind <= MEMSIM_EV_INIT_BLOCK);
    case 'a':
        return (kind == MEMSIM_EV_ALLOC && (flags & MEMSIM_EVF_ADDR)) ||
               (kind >= MEMSIM_EV_SEG_ALLOC && kind <= MEMSIM_EV_INIT_BLOCK);
    case 'x':
        return kind == MEMSIM_EV_COLLECTIVE || kind == MEMSIM_EV_INIT_SEGMENT ||
               kind == MEMSIM_EV_INIT_BLOCK;
    case 'c':
        return kind == MEMSIM_EV_ALLOC || kind == MEMSIM_EV_INIT_BLOCK;
    default: /* flags */
        return kind == MEMSIM_EV_ALLOC || kind == MEMSIM_EV_EMPTY_CACHE;
    }
}

Test(mst, chunks_conform_to_schema_and_spec)
{
    for (guint32 seed = 100; seed < 115; seed++) {
        MemsimTrace *t = tg_random_trace(seed, 1 + seed % 3, 3000);
        gsize n, len;
        char *mst = tg_save_memory(t, MEMSIM_FORMAT_MST, &n);
        guint8 *raw = decompress_all(mst, n, &len);
        cr_assert(len >= 12 && memcmp(raw, "MEMSIMTR\x01\x00\x01\x00", 12) == 0);
        gsize pos = 12, cursor[8] = {0}, n_chunks = 0, n_events = 0;
        gboolean ended = FALSE;
        while (pos < len) {
            uint64_t rl = 0;
            for (int s = 0;; s += 7) {
                rl |= (uint64_t)(raw[pos] & 0x7f) << s;
                if (!(raw[pos++] & 0x80))
                    break;
            }
            Memsim__Mst__Record *rec = memsim__mst__record__unpack(NULL, rl, raw + pos);
            TG_CHECK(rec != NULL, "record at %zu does not decode with protobuf-c", pos);
            pos += rl;
            TG_CHECK(!!rec->header + !!rec->chunk + !!rec->end == 1, "one body per record");
            if (rec->end) {
                TG_CHECK(rec->end->n_chunks == n_chunks && rec->end->n_events == n_events,
                         "end counts");
                ended = TRUE;
            }
            if (rec->chunk) {
                const Memsim__Mst__Chunk *c = rec->chunk;
                TG_CHECK(c->n_kind == c->n_events, "kind column length");
                TG_CHECK(c->n_stream == 0 || c->n_stream == c->n_events, "stream column");
                TG_CHECK(c->n_events <= MEMSIM_CHUNK_EVENTS, "chunk size");
                gsize ne;
                const MemsimEvent *ev = memsim_trace_events(t, c->rank, &ne);
                uint64_t prev_id[16] = {0}, prev_addr[16] = {0};
                gsize ci = 0, cf = 0, cc = 0, cs = 0, ca = 0, cx = 0, ce = 0;
                for (gsize i = 0; i < c->n_events; i++) {
                    MemsimEvent e = {.kind = (uint8_t)c->kind[i]};
                    e.stream = c->n_stream ? (uint16_t)c->stream[i] : 0;
                    unsigned k = e.kind;
                    if (spec_carries(k, 'f', 0))
                        e.flags = c->n_flags ? c->flags[cf++] : 0;
                    if (spec_carries(k, 'c', 0))
                        e.category = c->n_category ? (uint8_t)c->category[cc++] : 0;
                    if (spec_carries(k, 'i', 0))
                        e.id = prev_id[k] += c->n_id ? (uint64_t)c->id[ci++] : 0;
                    if (spec_carries(k, 's', 0))
                        e.size = c->n_size ? c->size[cs++] : 0;
                    if (spec_carries(k, 'a', e.flags))
                        e.addr = prev_addr[k] += c->n_addr ? (uint64_t)c->addr[ca++] : 0;
                    if (spec_carries(k, 'x', 0))
                        e.aux = c->n_aux ? c->aux[cx++] : 0;
                    while (ce < c->n_extra_event && c->extra_event[ce] == i) {
                        uint64_t v = c->extra_value[ce];
                        switch (c->extra_field[ce]) {
                        case 1:
                            e.id = v;
                            break;
                        case 2:
                            e.size = v;
                            break;
                        case 3:
                            e.addr = v;
                            break;
                        case 4:
                            e.aux = v;
                            break;
                        case 5:
                            e.category = (uint8_t)v;
                            break;
                        default:
                            e.flags = (uint32_t)v;
                            break;
                        }
                        ce++;
                    }
                    gsize at = cursor[c->rank]++;
                    TG_CHECK(at < ne && memcmp(&e, &ev[at], sizeof e) == 0,
                             "seed %u rank %u event %zu differs from the spec's reading", seed,
                             c->rank, at);
                }
                TG_CHECK((!c->n_id || ci == c->n_id) && (!c->n_size || cs == c->n_size) &&
                             (!c->n_addr || ca == c->n_addr) && (!c->n_aux || cx == c->n_aux) &&
                             (!c->n_flags || cf == c->n_flags) &&
                             (!c->n_category || cc == c->n_category) && ce == c->n_extra_event,
                         "column lengths");
                n_chunks++;
                n_events += c->n_events;
            }
            memsim__mst__record__free_unpacked(rec, NULL);
        }
        TG_CHECK(ended, "no end record");
        for (guint32 r = 0; r < memsim_trace_header(t)->n_ranks; r++) {
            gsize ne;
            memsim_trace_events(t, r, &ne);
            TG_CHECK(cursor[r] == ne, "rank %u: %zu of %zu events", r, cursor[r], ne);
        }
        g_free(raw);
        free(mst);
        memsim_trace_free(t);
    }
}

/* Strings and ops declared between writes arrive with the chunk whose events follow them;
 * ranks interleave in the order written. */
Test(mst, header_growth_and_interleaved_ranks)
{
    MemsimTrace *t = memsim_trace_new("growth");
    for (int r = 0; r < 5; r++)
        memsim_trace_add_rank(t, (guint32)r, 1);
    memsim_trace_intern(t, "first");
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    GError *err = NULL;
    MemsimTraceWriter *w = memsim_trace_writer_new_stream(f, TRUE, "growth.mst", MEMSIM_FORMAT_MST,
                                                          memsim_trace_header(t), &err);
    cr_assert(w != NULL);
    /* Expected: a list of (rank, events, n_strings after) */
    GRand *rng = g_rand_new_with_seed(7);
    GArray *order = g_array_new(FALSE, FALSE, sizeof(guint32));
    GArray *want_strings = g_array_new(FALSE, FALSE, sizeof(guint32));
    GArray *all = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
    for (int step = 0; step < 300; step++) {
        guint32 r = (guint32)g_rand_int_range(rng, 0, 5);
        if (g_rand_int_range(rng, 0, 4) == 0) {
            char s[32];
            snprintf(s, sizeof s, "s%d", step);
            memsim_trace_intern(t, s);
            MemsimOpInfo op = {.name = memsim_trace_header(t)->n_strings - 1, .layer = step};
            memsim_trace_add_op(t, &op);
            cr_assert(memsim_trace_writer_update_header(w, memsim_trace_header(t), &err));
        }
        int n = g_rand_int_range(rng, 1, 40000);
        MemsimEvent *ev = g_new0(MemsimEvent, n);
        for (int i = 0; i < n; i++) {
            ev[i].kind = MEMSIM_EV_MARK;
            ev[i].id = memsim_trace_header(t)->n_strings - 1; /* the newest string */
        }
        cr_assert(memsim_trace_writer_write(w, r, ev, (gsize)n, &err), "%s",
                  err ? err->message : "?");
        g_array_append_vals(all, ev, (guint)n);
        for (int i = 0; i < n; i++) {
            g_array_append_val(order, r);
            guint32 ns = memsim_trace_header(t)->n_strings;
            g_array_append_val(want_strings, ns);
        }
        g_free(ev);
    }
    memsim_trace_intern(t, "after the last event");
    cr_assert(memsim_trace_writer_update_header(w, memsim_trace_header(t), &err));
    cr_assert(memsim_trace_writer_close(w, &err), "%s", err ? err->message : "?");

    MemsimTraceReader *r = tg_open_memory(buf, blen, "growth.mst", &err);
    cr_assert(r != NULL, "%s", err ? err->message : "?");
    guint32 rank;
    const MemsimEvent *ev;
    gsize n, at = 0;
    while ((n = memsim_trace_reader_next(r, &rank, &ev, &err)) > 0) {
        const MemsimTraceHeader *h = memsim_trace_reader_header(r);
        for (gsize i = 0; i < n; i++, at++) {
            TG_CHECK(at < all->len, "too many events");
            TG_CHECK(g_array_index(order, guint32, at) == rank, "event %zu: rank", at);
            TG_CHECK(memcmp(&ev[i], &g_array_index(all, MemsimEvent, at), sizeof *ev) == 0,
                     "event %zu differs", at);
            /* Exactly the strings declared before the event are known. */
            TG_CHECK(h->n_strings == g_array_index(want_strings, guint32, at),
                     "event %zu: %u strings known, expected %u", at, h->n_strings,
                     g_array_index(want_strings, guint32, at));
            TG_CHECK(h->n_ops == h->n_strings - 1, "ops");
        }
    }
    cr_assert(err == NULL, "%s", err ? err->message : "?");
    cr_assert_eq(at, all->len);
    cr_assert_eq(memsim_trace_reader_header(r)->n_strings, memsim_trace_header(t)->n_strings);
    cr_assert_str_eq(memsim_trace_reader_header(r)->strings[memsim_trace_header(t)->n_strings - 1],
                     "after the last event");
    memsim_trace_reader_free(r);
    free(buf);
    g_array_unref(order);
    g_array_unref(want_strings);
    g_array_unref(all);
    g_rand_free(rng);
    memsim_trace_free(t);
}

Test(mst, empty_traces)
{
    /* No ranks; ranks without events; only tables. */
    for (int k = 0; k < 3; k++) {
        MemsimTrace *t = memsim_trace_new(k ? "ranks" : "");
        for (int r = 0; r < k; r++)
            memsim_trace_add_rank(t, (guint32)r, 2);
        if (k == 2) {
            memsim_trace_intern(t, "x");
            MemsimOpInfo op = {0};
            memsim_trace_add_op(t, &op);
        }
        gsize n;
        char *mst = tg_save_memory(t, MEMSIM_FORMAT_MST, &n);
        GError *err = NULL;
        MemsimTraceReader *r = tg_open_memory(mst, n, "empty.mst", &err);
        cr_assert(r != NULL, "%s", err ? err->message : "?");
        guint64 ne;
        cr_assert(tg_drain(r, &ne, &err), "%s", err ? err->message : "?");
        cr_assert_eq(ne, 0);
        tg_assert_same_header(memsim_trace_header(t), memsim_trace_reader_header(r));
        memsim_trace_reader_free(r);
        free(mst);
        memsim_trace_free(t);
    }
}

/* A 5M-event trace streams through a writer and a reader whose buffers stay the size of a
 * chunk. */
Test(mst, streaming_large_trace_bounded_memory, .timeout = 600)
{
    const gsize total = 5000000;
    MemsimTrace *hdr = tg_realistic_trace_header(2);
    char *dir = tu_tmpdir();
    char *path = g_build_filename(dir, "large.mst", NULL);
    GError *err = NULL;
    MemsimTraceWriter *w =
        memsim_trace_writer_new(path, MEMSIM_FORMAT_AUTO, memsim_trace_header(hdr), &err);
    cr_assert(w != NULL, "%s", err ? err->message : "?");
    TgRealistic gen = {.rng = g_rand_new_with_seed(42)};
    MemsimEvent batch[1000];
    for (gsize done = 0; done < total; done += G_N_ELEMENTS(batch)) {
        for (gsize i = 0; i < G_N_ELEMENTS(batch); i++)
            batch[i] = tg_realistic(&gen);
        TG_CHECK(memsim_trace_writer_write(w, (guint32)(done / 250000 % 2), batch,
                                           G_N_ELEMENTS(batch), &err),
                 "%s", err ? err->message : "?");
    }
    cr_assert(memsim_trace_writer_close(w, &err), "%s", err ? err->message : "?");
    g_rand_free(gen.rng);

    MemsimTraceReader *r = memsim_trace_reader_open(path, &err);
    cr_assert(r != NULL, "%s", err ? err->message : "?");
    TgRealistic check = {.rng = g_rand_new_with_seed(42)};
    guint32 rank;
    const MemsimEvent *ev;
    gsize n, seen = 0, most = 0;
    while ((n = memsim_trace_reader_next(r, &rank, &ev, &err)) > 0) {
        TG_CHECK(n <= MEMSIM_CHUNK_EVENTS, "a run of %zu events", n);
        TG_CHECK(rank == seen / 250000 % 2, "rank at %zu", seen);
        for (gsize i = 0; i < n; i++) {
            MemsimEvent want = tg_realistic(&check);
            TG_CHECK(memcmp(&want, &ev[i], sizeof want) == 0, "event %zu differs", seen + i);
        }
        seen += n;
        gsize b = memsim_trace_reader_buffer_bytes(r);
        most = MAX(most, b);
    }
    cr_assert(err == NULL, "%s", err ? err->message : "?");
    cr_assert_eq(seen, total);
    /* One chunk of events (16384 × 40 bytes) plus its decoded bytes and zstd's input. */
    cr_assert(most <= 4u << 20, "reader held %zu bytes", most);
    cr_log_info("5M events: reader buffers peaked at %zu bytes", most);
    struct stat st;
    g_stat(path, &st);
    cr_log_info("5M events: %lld bytes on disk (%.2f bytes/event)", (long long)st.st_size,
                (double)st.st_size / (double)total);
    memsim_trace_reader_free(r);
    g_rand_free(check.rng);
    g_unlink(path);
    g_rmdir(dir);
    g_free(path);
    g_free(dir);
    memsim_trace_free(hdr);
}

Test(mst, writer_refuses_bad_events_and_headers)
{
    MemsimTrace *t = memsim_trace_new("w");
    memsim_trace_add_rank(t, 0, 1);
    gsize n;
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    GError *err = NULL;
    MemsimTraceWriter *w = memsim_trace_writer_new_stream(f, TRUE, "w.mst", MEMSIM_FORMAT_MST,
                                                          memsim_trace_header(t), &err);
    cr_assert(w != NULL);
    MemsimEvent bad[] = {
        {.kind = 0},
        {.kind = MEMSIM_EV_KIND_MAX + 1},
        {.kind = MEMSIM_EV_FREE, .stream = 1},
        {.kind = MEMSIM_EV_OP, .id = 0},
        {.kind = MEMSIM_EV_MARK, .id = 0},
        {.kind = MEMSIM_EV_WAIT, .id = 1},
        {.kind = MEMSIM_EV_COLLECTIVE, .aux = MEMSIM_COLL_COUNT},
        {.kind = MEMSIM_EV_ALLOC, .category = MEMSIM_CAT_COUNT},
        {.kind = MEMSIM_EV_SEG_MAP, .addr = 1, .size = UINT64_MAX},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        cr_assert(!memsim_trace_writer_write(w, 0, &bad[i], 1, &err), "event %zu accepted", i);
        cr_assert(strstr(err->message, "w.mst: rank 0, event 0") != NULL, "%s", err->message);
        g_clear_error(&err);
    }
    cr_assert(!memsim_trace_writer_write(w, 1, bad, 1, &err));
    cr_assert(strstr(err->message, "rank 1 out of range"), "%s", err->message);
    g_clear_error(&err);
    MemsimTrace *smaller = memsim_trace_new("w");
    cr_assert(!memsim_trace_writer_update_header(w, memsim_trace_header(smaller), &err));
    g_clear_error(&err);
    memsim_trace_free(smaller);
    cr_assert(memsim_trace_writer_close(w, &err), "%s", err ? err->message : "?");
    free(buf);
    char *dir = tu_tmpdir();
    /* A bad header is refused. */
    memsim_trace_header(t)->ranks[0].n_streams = 0;
    char *out = g_build_filename(dir, "x.mst", NULL);
    cr_assert(!memsim_trace_save(t, out, MEMSIM_FORMAT_AUTO, &err));
    cr_assert(strstr(err->message, "0 streams"), "%s", err->message);
    g_clear_error(&err);
    g_unlink(out);
    g_rmdir(dir);
    g_free(out);
    g_free(dir);
    (void)n;
    memsim_trace_free(t);
}

Test(mst, formats_by_name_and_content)
{
    cr_assert_eq(memsim_format_from_path("a.mst"), MEMSIM_FORMAT_MST);
    cr_assert_eq(memsim_format_from_path("A.MST"), MEMSIM_FORMAT_MST);
    cr_assert_eq(memsim_format_from_path("a.txt"), MEMSIM_FORMAT_TEXT);
    cr_assert_eq(memsim_format_from_path("a.mstt"), MEMSIM_FORMAT_TEXT);
    cr_assert_eq(memsim_format_from_path("a.pickle"), MEMSIM_FORMAT_SNAPSHOT);
    cr_assert_eq(memsim_format_from_path("a.pkl"), MEMSIM_FORMAT_SNAPSHOT);
    cr_assert_eq(memsim_format_from_path("a.json"), MEMSIM_FORMAT_AUTO);
    /* Content wins over the name. */
    char *txt = tu_test_data("good/small.txt");
    char *dir = tu_tmpdir();
    char *odd = g_build_filename(dir, "really-text.mst", NULL);
    GError *err = NULL;
    gsize n;
    char *data = tg_read_file(txt, &n);
    cr_assert(g_file_set_contents(odd, data, (gssize)n, NULL));
    MemsimTraceReader *r = memsim_trace_reader_open(odd, &err);
    cr_assert(r != NULL, "%s", err ? err->message : "?");
    cr_assert_eq(memsim_trace_reader_format(r), MEMSIM_FORMAT_TEXT);
    memsim_trace_reader_free(r);
    /* Missing files are I/O errors naming the file. */
    cr_assert(memsim_trace_reader_open("/nonexistent/x.mst", &err) == NULL);
    cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_IO));
    cr_assert(strstr(err->message, "/nonexistent/x.mst"));
    g_clear_error(&err);
    g_unlink(odd);
    g_rmdir(dir);
    g_free(odd);
    g_free(dir);
    g_free(data);
    g_free(txt);
}

