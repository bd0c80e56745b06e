/* The .mst trace file: the streaming reader (spec: formats/README.md; schema:
 * formats/mst.proto; the file's layout and the varint coding: mst.h; the writer:
 * mst_write.c).
 *
 * The header and the rare small messages (ops, the end record) are decoded by protobuf-c;
 * chunks by hand, because they are the bulk of the file: one fused loop over the events
 * reads every column at once, straight into MemsimEvent, with no per-event message and no
 * intermediate arrays. It accepts exactly the protobuf encoding of mst.proto's Chunk with
 * each column written once, packed (the tests check it against protobuf-c's own unpacking).
 *
 * Memory: the decompressed bytes of about one record, the zstd window and one chunk of
 * events, whatever the trace's length. Every length, count, index and varint read is bounds
 * checked; bad input is reported with the chunk, the event and the decompressed byte offset
 * of the record.
 */
#include "formats/mst.h"
#include "formats/mst.pb-c.h"

#include <inttypes.h>
#include <string.h>
#include <zstd.h>

/* Column names for messages, by COL(field). */
static const char *const column_names[N_COLUMNS] = {
    "kind", "stream", "flags",       "category",    "id",          "size",
    "addr", "aux",    "extra_event", "extra_field", "extra_value",
};

/* The column (C_*) in which a kind would carry each extra field (X_*). */
static const uint8_t extra_column_bit[7] = {0, C_ID, C_SIZE, C_ADDR, C_AUX, C_CAT, C_FLAGS};

/* Skips one field's value of wire type `wt`; NULL when malformed. */
static const guint8 *skip_field(const guint8 *p, const guint8 *end, unsigned wt)
{
    uint64_t v;
    switch (wt) {
    case 0:
        return get_varint(p, end, &v);
    case 1:
        return (gsize)(end - p) >= 8 ? p + 8 : NULL;
    case 2:
        p = get_varint(p, end, &v);
        return p && v <= (uint64_t)(end - p) ? p + v : NULL;
    case 5:
        return (gsize)(end - p) >= 4 ? p + 4 : NULL;
    default:
        return NULL; /* groups (3, 4) are not used by memsim */
    }
}

typedef struct {
    MemsimTraceReader base;
    ZSTD_DCtx *dctx;
    guint8 *zin;
    gsize zin_cap;
    ZSTD_inBuffer in;
    gboolean src_eof;
    size_t last_ret; /* 0 when the last zstd frame is complete */
    guint8 *buf;     /* decompressed bytes [pos, len) not yet used; buf[0] is at buf_offset */
    gsize cap, pos, len;
    guint64 buf_offset;
    guint64 record;        /* index of the record being read (the header is record 0) */
    unsigned body;         /* its Record field (REC_*), 0 while unknown */
    guint64 record_offset; /* its decompressed byte offset */
    MemsimEvent *events;
    gsize events_cap;
    guint64 n_chunks, n_events;
    GArray *strings, *ops; /* Slice: a chunk's appended strings and ops */
} MstReader;

typedef struct {
    const guint8 *p;
    gsize len;
} Slice;

static void mst_fail(MstReader *r, GError **error, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

/* "FILE: chunk C (record R at byte B): what" */
static void mst_fail(MstReader *r, GError **error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    char *what = r->body == REC_CHUNK    ? g_strdup_printf("chunk %" G_GUINT64_FORMAT, r->n_chunks)
                 : r->body == REC_HEADER ? g_strdup("header")
                 : r->body == REC_END    ? g_strdup("end record")
                                         : g_strdup("record");
    memsim_set_bad_input(error,
                         "%s: %s (record %" G_GUINT64_FORMAT " at byte %" G_GUINT64_FORMAT
                         " of the decompressed stream): %s",
                         r->base.name, what, r->record, r->record_offset, msg);
    g_free(what);
    g_free(msg);
}

/* Makes `need` decompressed bytes available at buf + pos. Returns 1 when they are, 0 when
 * the stream ends cleanly first (after a complete zstd frame), -1 on error. */
static int fill(MstReader *r, gsize need, GError **error)
{
    while (r->len - r->pos < need) {
        if (r->cap - r->len < 65536) {
            /* A long stream gets a window of 1 MiB, so that moving the undecoded rest of a
             * record to the front happens once every few records, not every time. */
            if (r->buf_offset + r->pos > 0 && r->cap < (1u << 20)) {
                r->cap = 1u << 20;
                r->buf = g_realloc(r->buf, r->cap);
            }
        }
        if (r->cap - r->len < 65536) {
            if (r->pos) { /* drop what has been used */
                memmove(r->buf, r->buf + r->pos, r->len - r->pos);
                r->buf_offset += r->pos;
                r->len -= r->pos;
                r->pos = 0;
            }
            if (r->cap - r->len < 65536) {
                /* Grow with the data actually decompressed, never to a claimed length. */
                r->cap = MAX(r->cap * 2, r->len + 65536);
                r->buf = g_realloc(r->buf, r->cap);
            }
        }
        if (r->in.pos == r->in.size && !r->src_eof) {
            gsize got = 0;
            if (!memsim_source_read(&r->base.src, r->zin, r->zin_cap, &got, r->base.name, error))
                return -1;
            r->in.src = r->zin;
            r->in.size = got;
            r->in.pos = 0;
            if (got == 0)
                r->src_eof = TRUE;
        }
        ZSTD_outBuffer out = {r->buf + r->len, r->cap - r->len, 0};
        gsize in_before = r->in.pos;
        size_t ret = ZSTD_decompressStream(r->dctx, &out, &r->in);
        if (ZSTD_isError(ret)) {
            guint64 at = r->base.src.consumed - (r->in.size - r->in.pos);
            memsim_set_bad_input(error,
                                 "%s: corrupt zstd data near compressed byte %" G_GUINT64_FORMAT
                                 " (while reading record %" G_GUINT64_FORMAT "): %s",
                                 r->base.name, at, r->record, ZSTD_getErrorName(ret));
            return -1;
        }
        r->len += out.pos;
        if (out.pos == 0 && r->in.pos == in_before) {
            if (!r->src_eof && r->in.pos == r->in.size)
                continue; /* needs more input */
            if (!r->src_eof) {
                memsim_set_bad_input(error, "%s: corrupt zstd data (the decoder is stuck)",
                                     r->base.name);
                return -1;
            }
            if (r->last_ret != 0) {
                memsim_set_bad_input(error,
                                     "%s: truncated: the zstd stream ends inside a frame (while "
                                     "reading record %" G_GUINT64_FORMAT
                                     ", after %" G_GUINT64_FORMAT " decompressed bytes)",
                                     r->base.name, r->record, r->buf_offset + r->len);
                return -1;
            }
            return 0;
        }
        r->last_ret = ret;
    }
    return 1;
}

/* Reads the next record; sets *field to its body's Record field. Returns 1, 0 at a clean end
 * of the stream between records, -1 on error. */
static int read_record(MstReader *r, unsigned *field, const guint8 **body, gsize *body_len,
                       GError **error)
{
    r->record_offset = r->buf_offset + r->pos;
    r->body = 0;
    uint64_t len = 0;
    gsize hdr = 0;
    for (;;) {
        int rc = fill(r, hdr + 1, error);
        if (rc < 0)
            return -1;
        if (rc == 0) {
            if (hdr == 0)
                return 0;
            mst_fail(r, error, "truncated: the stream ends inside a record length");
            return -1;
        }
        guint8 b = r->buf[r->pos + hdr];
        if (hdr == 9 && b > 1) {
            mst_fail(r, error, "record length is not a valid varint");
            return -1;
        }
        len |= (uint64_t)(b & 0x7f) << (7 * hdr);
        hdr++;
        if (!(b & 0x80))
            break;
    }
    if (len > MST_MAX_RECORD) {
        mst_fail(r, error, "record of %" PRIu64 " bytes (expected at most %u)", len,
                 MST_MAX_RECORD);
        return -1;
    }
    int rc = fill(r, hdr + (gsize)len, error);
    if (rc < 0)
        return -1;
    if (rc == 0) {
        mst_fail(r, error,
                 "truncated: the record is %" PRIu64
                 " bytes but the stream ends after %" G_GSIZE_FORMAT,
                 len, r->len - r->pos - hdr);
        return -1;
    }
    const guint8 *p = r->buf + r->pos + hdr, *end = p + len;
    r->pos += hdr + (gsize)len;
    /* The Record message: exactly one known body; unknown fields are skipped. */
    *field = 0;
    while (p < end) {
        uint64_t tag;
        p = get_varint(p, end, &tag);
        if (!p)
            goto bad;
        unsigned f = (unsigned)MIN(tag >> 3, 1000u), wt = tag & 7;
        if (f >= REC_HEADER && f <= REC_END) {
            uint64_t n;
            if (wt != 2 || !(p = get_varint(p, end, &n)) || n > (uint64_t)(end - p))
                goto bad;
            if (*field) {
                mst_fail(r, error, "a record with two bodies (fields %u and %u)", *field, f);
                return -1;
            }
            *field = f;
            r->body = f;
            *body = p;
            *body_len = (gsize)n;
            p += n;
        } else if (!(p = skip_field(p, end, wt))) {
            goto bad;
        }
    }
    return 1;
bad:
    mst_fail(r, error, "the record does not decode as a protobuf Record message");
    return -1;
}

static gboolean op_from_pb(MstReader *r, const Memsim__Mst__Op *m, MemsimOpInfo *op, GError **error)
{
    if (m->phase >= MEMSIM_PHASE_COUNT) {
        mst_fail(r, error, "op phase %" PRIu32 " out of range (expected 0 .. %d)", m->phase,
                 MEMSIM_PHASE_COUNT - 1);
        return FALSE;
    }
    if (m->bound >= MEMSIM_BOUND_COUNT) {
        mst_fail(r, error, "op bound %" PRIu32 " out of range (expected 0 .. %d)", m->bound,
                 MEMSIM_BOUND_COUNT - 1);
        return FALSE;
    }
    op->name = m->name;
    op->phase = (uint8_t)m->phase;
    op->bound = (uint8_t)m->bound;
    op->layer = m->layer;
    op->microbatch = m->microbatch;
    op->duration_us = m->duration_us;
    return TRUE;
}

static gboolean read_header(MstReader *r, GError **error)
{
    int rc = fill(r, MST_PREAMBLE, error);
    if (rc < 0)
        return FALSE;
    if (rc == 0 || memcmp(r->buf + r->pos, MST_MAGIC, 8) != 0) {
        memsim_set_bad_input(error,
                             "%s: not a memsim trace: the decompressed stream does not start "
                             "with the magic \"" MST_MAGIC "\"",
                             r->base.name);
        return FALSE;
    }
    const guint8 *v = r->buf + r->pos + 8;
    unsigned major = v[0] | v[1] << 8, minor = v[2] | v[3] << 8;
    if (major != MST_MAJOR) {
        memsim_set_bad_input(error,
                             "%s: .mst format version %u.%u is not supported (this reader "
                             "reads version %d.x)",
                             r->base.name, major, minor, MST_MAJOR);
        return FALSE;
    }
    r->pos += MST_PREAMBLE;
    unsigned field;
    const guint8 *body = NULL;
    gsize len = 0;
    rc = read_record(r, &field, &body, &len, error);
    if (rc < 0)
        return FALSE;
    if (rc == 0 || field != REC_HEADER) {
        mst_fail(r, error, "expected the header record first");
        return FALSE;
    }
    /* Count the tables before protobuf-c allocates them. */
    guint64 count[7] = {0};
    for (const guint8 *p = body, *end = body + len; p && p < end;) {
        uint64_t tag;
        if (!(p = get_varint(p, end, &tag)))
            break;
        count[MIN(tag >> 3, 6u)]++;
        p = skip_field(p, end, tag & 7);
    }
    if (count[4] > MEMSIM_MAX_RANKS || count[5] > MEMSIM_MAX_STRINGS || count[6] > MEMSIM_MAX_OPS) {
        mst_fail(r, error,
                 "%" G_GUINT64_FORMAT " ranks, %" G_GUINT64_FORMAT " strings, %" G_GUINT64_FORMAT
                 " ops (expected at most %u, %u, %u)",
                 count[4], count[5], count[6], MEMSIM_MAX_RANKS, MEMSIM_MAX_STRINGS,
                 MEMSIM_MAX_OPS);
        return FALSE;
    }
    Memsim__Mst__Header *m = memsim__mst__header__unpack(NULL, len, body);
    if (!m) {
        mst_fail(r, error, "the header does not decode as a protobuf Header message");
        return FALSE;
    }
    MemsimTraceHeader *h = &r->base.header;
    gboolean ok = TRUE;
    h->name = g_strdup(m->name ? m->name : "");
    h->alloc_conf = g_strdup(m->alloc_conf);
    h->capacity = m->capacity;
    h->ranks = g_new0(MemsimRankInfo, m->n_ranks + 1);
    for (gsize i = 0; i < m->n_ranks && ok; i++) {
        const Memsim__Mst__Rank *pr = m->ranks[i];
        MemsimRankInfo *ri = &h->ranks[i];
        h->n_ranks++;
        ri->device = pr->device;
        ri->multiplicity = pr->multiplicity;
        ri->role = g_strdup(pr->role);
        ri->n_streams = pr->n_streams;
        ri->has_final = pr->has_final;
        ri->final_reserved = pr->final_reserved;
        ri->final_allocated = pr->final_allocated;
        ri->capacity = pr->capacity;
        char *why = memsim_rank_check(ri);
        if (!why && pr->n_stream_handles && pr->n_stream_handles != pr->n_streams)
            why = g_strdup_printf("%" G_GSIZE_FORMAT " stream handles for %" PRIu32
                                  " streams (expected none or one per stream)",
                                  pr->n_stream_handles, pr->n_streams);
        if (why) {
            mst_fail(r, error, "rank %" G_GSIZE_FORMAT ": %s", i, why);
            g_free(why);
            ok = FALSE;
        } else if (pr->n_stream_handles) {
            ri->stream_handles = g_memdup2(pr->stream_handles, sizeof(uint64_t) * ri->n_streams);
        }
    }
    for (gsize i = 0; i < m->n_strings && ok; i++)
        memsim_header_append_string(h, m->strings[i], strlen(m->strings[i]));
    for (gsize i = 0; i < m->n_ops && ok; i++) {
        MemsimOpInfo op;
        ok = op_from_pb(r, m->ops[i], &op, error);
        if (ok)
            memsim_header_append_op(h, &op);
    }
    if (ok) {
        char *why = memsim_ops_check(h, 0);
        if (why) {
            mst_fail(r, error, "%s", why);
            g_free(why);
            ok = FALSE;
        }
    }
    memsim__mst__header__free_unpacked(m, NULL);
    return ok;
}

/* The column loop's varint read: the one-byte case inline, the rest out of line through
 * `get` (get_varint, or get_varint4 for values known to fit in 32 bits). */
#define READ_WITH(get, p, end, v, col)                                                             \
    do {                                                                                           \
        if (G_LIKELY((p) < (end) && *(p) < 0x80)) {                                                \
            (v) = *(p)++;                                                                          \
        } else if (!((p) = get((p), (end), &(v)))) {                                               \
            bad_col = (col);                                                                       \
            goto bad_column;                                                                       \
        }                                                                                          \
    } while (0)
#define READ(p, end, v, col) READ_WITH(get_varint, p, end, v, col)

/* READ with the two-byte case inline too: for the id column, whose deltas of recent tensors
 * take one or two bytes (a test on the length there is predictable; on sizes it is not). */
#define READ12(p, end, v, col)                                                                     \
    do {                                                                                           \
        if (G_LIKELY((p) < (end) && *(p) < 0x80)) {                                                \
            (v) = *(p)++;                                                                          \
        } else if (G_LIKELY((end) - (p) >= 2 && (p)[1] < 0x80)) {                                  \
            (v) = ((p)[0] & 0x7fu) | (uint64_t)(p)[1] << 7;                                        \
            (p) += 2;                                                                              \
        } else if (!((p) = get_varint((p), (end), &(v)))) {                                        \
            bad_col = (col);                                                                       \
            goto bad_column;                                                                       \
        }                                                                                          \
    } while (0)

/* READ for the size column: its multi-byte values in 32-bit arithmetic (get_varint4). */
#define READ4(p, end, v, col) READ_WITH(get_varint4, p, end, v, col)

/* Decodes a chunk's body into r->events; returns the number of events or -1. */
static gssize decode_chunk(MstReader *r, const guint8 *p, const guint8 *end, guint32 *rank,
                           GError **error)
{
    MemsimTraceHeader *h = &r->base.header;
    uint64_t rank64 = 0, n64 = 0;
    Slice col[N_COLUMNS];
    memset(col, 0, sizeof col);
    gboolean seen[N_COLUMNS] = {FALSE};
    g_array_set_size(r->strings, 0);
    g_array_set_size(r->ops, 0);
    while (p < end) {
        uint64_t tag, v;
        if (!(p = get_varint(p, end, &tag)))
            goto bad_message;
        unsigned f = (unsigned)MIN(tag >> 3, 1000u), wt = tag & 7;
        if (f == CH_RANK || f == CH_N_EVENTS) {
            if (wt != 0 || !(p = get_varint(p, end, &v)))
                goto bad_message;
            if (v > G_MAXUINT32) {
                mst_fail(r, error, "%s %" PRIu64 " does not fit in 32 bits",
                         f == CH_RANK ? "rank" : "n_events", v);
                return -1;
            }
            *(f == CH_RANK ? &rank64 : &n64) = v;
        } else if (f >= CH_KIND && f <= CH_STRINGS + 1) {
            if (wt != 2) {
                mst_fail(r, error, "field %u has wire type %u (expected 2: %s)", f, wt,
                         f <= CH_EXTRA_VALUE ? "columns are packed" : "length-delimited");
                return -1;
            }
            if (!(p = get_varint(p, end, &v)) || v > (uint64_t)(end - p))
                goto bad_message;
            Slice s = {p, (gsize)v};
            p += v;
            if (f == CH_STRINGS) {
                if (h->n_strings + r->strings->len >= MEMSIM_MAX_STRINGS) {
                    mst_fail(r, error, "more than %u strings", MEMSIM_MAX_STRINGS);
                    return -1;
                }
                g_array_append_val(r->strings, s);
            } else if (f == CH_OPS) {
                if (h->n_ops + r->ops->len >= MEMSIM_MAX_OPS) {
                    mst_fail(r, error, "more than %u ops", MEMSIM_MAX_OPS);
                    return -1;
                }
                g_array_append_val(r->ops, s);
            } else {
                if (seen[COL(f)]) {
                    mst_fail(r, error, "column %s appears twice (expected once, packed)",
                             column_names[COL(f)]);
                    return -1;
                }
                seen[COL(f)] = TRUE;
                col[COL(f)] = s;
            }
        } else if (!(p = skip_field(p, end, wt))) {
            goto bad_message;
        }
    }
    static const guint8 nothing[1];
    for (int c = 0; c < N_COLUMNS; c++)
        if (!col[c].p)
            col[c].p = nothing; /* no arithmetic on NULL below */
    if (rank64 >= h->n_ranks) {
        mst_fail(r, error, "rank %" PRIu64 " out of range (the header has %" PRIu32 " ranks)",
                 rank64, h->n_ranks);
        return -1;
    }
    if (n64 > MEMSIM_MAX_CHUNK_EVENTS) {
        mst_fail(r, error, "%" PRIu64 " events (expected at most %u per chunk)", n64,
                 MEMSIM_MAX_CHUNK_EVENTS);
        return -1;
    }
    const gsize n = (gsize)n64;
    const guint32 rk = (guint32)rank64;
    *rank = rk;

    /* Table growth comes first: the chunk's events may use it. */
    for (guint i = 0; i < r->strings->len; i++) {
        Slice s = g_array_index(r->strings, Slice, i);
        if (memchr(s.p, 0, s.len)) {
            mst_fail(r, error, "appended string %u contains a NUL byte", i);
            return -1;
        }
        memsim_header_append_string(h, (const char *)s.p, s.len);
    }
    guint32 first_op = h->n_ops;
    for (guint i = 0; i < r->ops->len; i++) {
        Slice s = g_array_index(r->ops, Slice, i);
        Memsim__Mst__Op *m = memsim__mst__op__unpack(NULL, s.len, s.p);
        if (!m) {
            mst_fail(r, error, "appended op %u does not decode as a protobuf Op message", i);
            return -1;
        }
        MemsimOpInfo op;
        gboolean ok = op_from_pb(r, m, &op, error);
        memsim__mst__op__free_unpacked(m, NULL);
        if (!ok)
            return -1;
        memsim_header_append_op(h, &op);
    }
    char *why = memsim_ops_check(h, first_op);
    if (why) {
        mst_fail(r, error, "%s", why);
        g_free(why);
        return -1;
    }

    if (n > r->events_cap) {
        g_free(r->events);
        r->events_cap = MAX(n, 2 * r->events_cap);
        r->events = g_new(MemsimEvent, r->events_cap);
    }
    MemsimEvent *ev = r->events;
    const uint32_t n_streams = h->ranks[rk].n_streams;
    int bad_col = 0;
    gsize i = 0;
    /* Absent columns read as zeros: their pointer is NULL and they are skipped. */
#define COLUMN(name, field)                                                                        \
    const guint8 *name = col[COL(field)].len ? col[COL(field)].p : NULL;                           \
    const guint8 *const name##_end = col[COL(field)].p + col[COL(field)].len
    COLUMN(pk, CH_KIND);
    COLUMN(ps, CH_STREAM);
    COLUMN(pf, CH_FLAGS);
    COLUMN(pc, CH_CATEGORY);
    COLUMN(pi, CH_ID);
    COLUMN(pz, CH_SIZE);
    COLUMN(pa, CH_ADDR);
    COLUMN(px, CH_AUX);
#undef COLUMN
    if (!pk && n) {
        mst_fail(r, error, "no kind column for %" G_GSIZE_FORMAT " events", n);
        return -1;
    }
    uint64_t prev_id[32] = {0}, prev_addr[32] = {0};
    /* A column of one value per event that is as many bytes long holds one-byte values
     * only: read those without the varint test (a byte >= 0x80 there fails the range test,
     * since it would mean fewer values than events). */
    const gboolean kind_bytes = pk && (gsize)(pk_end - pk) == n;
    const gboolean stream_bytes = ps && (gsize)(ps_end - ps) == n;
    /* The carried fields whose column is present: one test per field and event. */
    const unsigned present = (pf ? C_FLAGS : 0) | (pc ? C_CAT : 0) | (pi ? C_ID : 0) |
                             (pz ? C_SIZE : 0) | (pa ? C_ADDR : 0) | (px ? C_AUX : 0);
    /* The common case first: kinds and streams in one byte each, no flags column (so an
     * ALLOC reads no address), and only ALLOC and FREE events, each read with what it
     * carries and nothing else tested. Any other event (or a bad stream) leaves this loop
     * before reading anything for it, for the general loop below; that one comes back here
     * after it. */
    const gboolean fast_ok = kind_bytes && (stream_bytes || !ps) && !pf;
    G_STATIC_ASSERT(MEMSIM_EV_FREE == MEMSIM_EV_ALLOC + 1);
    /* Without a stream column every stream reads as 0: index 0 of `nothing`. */
    const guint8 *const sb = ps ? ps : nothing;
    const gsize s_mask = ps ? ~(gsize)0 : 0;
    const unsigned s_lim = MIN(n_streams, 0x80u); /* a stream at or above it: general loop */
    gsize resume = 0;
fast:
    if (fast_ok) {
        for (; i < n; i++) {
            uint64_t v;
            const unsigned k = pk[i];
            const unsigned s = sb[i & s_mask];
            if (G_UNLIKELY(k - MEMSIM_EV_ALLOC > 1u || s >= s_lim))
                break;
            MemsimEvent *const e = &ev[i];
            *e = (MemsimEvent){.kind = (uint8_t)k, .stream = (uint16_t)s};
            if (k == MEMSIM_EV_FREE) {
                if (pi) {
                    READ12(pi, pi_end, v, COL(CH_ID));
                    prev_id[MEMSIM_EV_FREE] += unzigzag(v);
                    e->id = prev_id[MEMSIM_EV_FREE];
                }
                continue;
            }
            if (pc) {
                READ(pc, pc_end, v, COL(CH_CATEGORY));
                if (G_UNLIKELY(v >= MEMSIM_CAT_COUNT)) {
                    mst_fail(r, error,
                             "event %" G_GSIZE_FORMAT ": category %" PRIu64
                             " out of range (expected 0 .. %d)",
                             i, v, MEMSIM_CAT_COUNT - 1);
                    return -1;
                }
                e->category = (uint8_t)v;
            }
            if (pi) {
                READ12(pi, pi_end, v, COL(CH_ID));
                prev_id[MEMSIM_EV_ALLOC] += unzigzag(v);
                e->id = prev_id[MEMSIM_EV_ALLOC];
            }
            if (pz) {
                READ4(pz, pz_end, v, COL(CH_SIZE));
                e->size = v;
            }
        }
        resume = i;
    }
    for (; i < n; i++) {
        uint64_t v;
        MemsimEvent *const e = &ev[i];
        if (fast_ok && i > resume && (pk[i] == MEMSIM_EV_ALLOC || pk[i] == MEMSIM_EV_FREE))
            goto fast;
        if (kind_bytes)
            v = pk[i];
        else
            READ(pk, pk_end, v, COL(CH_KIND));
        if (G_UNLIKELY(v - 1 >= MEMSIM_EV_KIND_MAX)) {
            mst_fail(r, error,
                     "event %" G_GSIZE_FORMAT ": kind %" PRIu64 " out of range (expected 1 .. %d)",
                     i, v, MEMSIM_EV_KIND_MAX);
            return -1;
        }
        const unsigned k = (unsigned)v;
        *e = (MemsimEvent){.kind = (uint8_t)k};
        if (stream_bytes) {
            v = ps[i];
            if (G_UNLIKELY(v >= 0x80)) {
                bad_col = COL(CH_STREAM);
                goto bad_column;
            }
        } else if (ps) {
            READ(ps, ps_end, v, COL(CH_STREAM));
        }
        if (ps) {
            if (G_UNLIKELY(v >= n_streams)) {
                mst_fail(r, error,
                         "event %" G_GSIZE_FORMAT ": stream %" PRIu64 " is not one of rank %" PRIu32
                         "'s %" PRIu32 " streams",
                         i, v, rk, n_streams);
                return -1;
            }
            e->stream = (uint16_t)v;
        }
        /* The two commonest kinds first, with what they carry known (carries[]); neither
         * is among MEMSIM_KINDS_CHECKED. */
        if (k == MEMSIM_EV_FREE) {
            if (pi) {
                READ12(pi, pi_end, v, COL(CH_ID));
                prev_id[k] += unzigzag(v);
                e->id = prev_id[k];
            }
            continue;
        }
        const unsigned m = carries[k] & present;
        if (m & C_FLAGS) {
            READ(pf, pf_end, v, COL(CH_FLAGS));
            if (G_UNLIKELY(v > G_MAXUINT32)) {
                mst_fail(r, error,
                         "event %" G_GSIZE_FORMAT ": flags 0x%" PRIx64 " do not fit in 32 bits", i,
                         v);
                return -1;
            }
            e->flags = (uint32_t)v;
        }
        if (m & C_CAT) {
            READ(pc, pc_end, v, COL(CH_CATEGORY));
            if (G_UNLIKELY(v >= MEMSIM_CAT_COUNT)) {
                mst_fail(r, error,
                         "event %" G_GSIZE_FORMAT ": category %" PRIu64
                         " out of range (expected 0 .. %d)",
                         i, v, MEMSIM_CAT_COUNT - 1);
                return -1;
            }
            e->category = (uint8_t)v;
        }
        if (m & C_ID) {
            READ12(pi, pi_end, v, COL(CH_ID));
            prev_id[k] += unzigzag(v);
            e->id = prev_id[k];
        }
        if (m & C_SIZE) {
            READ(pz, pz_end, v, COL(CH_SIZE));
            e->size = v;
        }
        if ((m & C_ADDR) && (k != MEMSIM_EV_ALLOC || (e->flags & MEMSIM_EVF_ADDR))) {
            READ(pa, pa_end, v, COL(CH_ADDR));
            prev_addr[k] += unzigzag(v);
            e->addr = prev_addr[k];
        }
        if (m & C_AUX) {
            READ(px, px_end, v, COL(CH_AUX));
            e->aux = v;
        }
        if (G_UNLIKELY(((1u << k) & MEMSIM_KINDS_CHECKED) && !memsim_event_ok(h, n_streams, e)))
            goto bad_event;
    }
    if (kind_bytes)
        pk = pk_end;
    if (stream_bytes)
        ps = ps_end;
    {
        const guint8 *ends[][2] = {{pk, pk_end}, {ps, ps_end}, {pf, pf_end}, {pc, pc_end},
                                   {pi, pi_end}, {pz, pz_end}, {pa, pa_end}, {px, px_end}};
        for (int c = 0; c < 8; c++) {
            if (ends[c][0] && ends[c][0] != ends[c][1]) {
                mst_fail(r, error,
                         "column %s has values left over after its %" G_GSIZE_FORMAT
                         " events (columns of inconsistent lengths)",
                         column_names[c], n);
                return -1;
            }
        }
    }

    /* Extras: (event, field, value) triples, strictly increasing in (event, field). */
    if (seen[COL(CH_EXTRA_EVENT)] || seen[COL(CH_EXTRA_FIELD)] || seen[COL(CH_EXTRA_VALUE)]) {
        const guint8 *xe = col[COL(CH_EXTRA_EVENT)].p, *xe_end = xe + col[COL(CH_EXTRA_EVENT)].len;
        const guint8 *xf = col[COL(CH_EXTRA_FIELD)].p, *xf_end = xf + col[COL(CH_EXTRA_FIELD)].len;
        const guint8 *xv = col[COL(CH_EXTRA_VALUE)].p, *xv_end = xv + col[COL(CH_EXTRA_VALUE)].len;
        uint64_t last_key = 0;
        gboolean first = TRUE;
        while (xe < xe_end) {
            uint64_t idx, field, val;
            READ(xe, xe_end, idx, COL(CH_EXTRA_EVENT));
            READ(xf, xf_end, field, COL(CH_EXTRA_FIELD));
            READ(xv, xv_end, val, COL(CH_EXTRA_VALUE));
            if (idx >= n || field < X_ID || field > X_FLAGS) {
                mst_fail(r, error,
                         "extra value for event %" PRIu64 ", field %" PRIu64
                         " (expected an event below %" G_GSIZE_FORMAT " and a field 1 .. 6)",
                         idx, field, n);
                return -1;
            }
            uint64_t key = idx * 8 + field;
            if (!first && key <= last_key) {
                mst_fail(r, error,
                         "extra values out of order at event %" PRIu64
                         " (expected increasing event and field)",
                         idx);
                return -1;
            }
            first = FALSE;
            last_key = key;
            MemsimEvent *e = &ev[idx];
            if (carried(e) & extra_column_bit[field]) {
                mst_fail(r, error,
                         "event %" PRIu64 ": extra value for field %" PRIu64
                         ", which a %s event stores in its column",
                         idx, field, memsim_event_kind_name(e->kind));
                return -1;
            }
            switch (field) {
            case X_ID:
                e->id = val;
                break;
            case X_SIZE:
                e->size = val;
                break;
            case X_ADDR:
                e->addr = val;
                break;
            case X_AUX:
                e->aux = val;
                break;
            case X_CATEGORY:
                if (val >= MEMSIM_CAT_COUNT) {
                    mst_fail(r, error,
                             "event %" PRIu64 ": category %" PRIu64
                             " out of range (expected 0 .. %d)",
                             idx, val, MEMSIM_CAT_COUNT - 1);
                    return -1;
                }
                e->category = (uint8_t)val;
                break;
            case X_FLAGS:
                if (val > G_MAXUINT32) {
                    mst_fail(r, error,
                             "event %" PRIu64 ": flags 0x%" PRIx64 " do not fit in 32 bits", idx,
                             val);
                    return -1;
                }
                e->flags = (uint32_t)val;
                break;
            }
            if (!memsim_event_ok(h, n_streams, e)) {
                i = (gsize)idx;
                goto bad_event;
            }
        }
        if (xf != xf_end || xv != xv_end) {
            mst_fail(r, error,
                     "the extra_event, extra_field and extra_value columns differ "
                     "in length (columns of inconsistent lengths)");
            return -1;
        }
    }

    return (gssize)n;

bad_event:
    /* ev[i] failed the check; the shared check gives the message. */
    {
        gsize bad;
        why = memsim_events_check(h, rk, &ev[i], 1, &bad);
        mst_fail(r, error, "event %" G_GSIZE_FORMAT ": %s", i, why);
        g_free(why);
        return -1;
    }

bad_column:
    mst_fail(r, error,
             "event %" G_GSIZE_FORMAT ": column %s ends early or holds a malformed varint "
             "(columns of inconsistent lengths?)",
             i, column_names[bad_col]);
    return -1;
bad_message:
    mst_fail(r, error, "the chunk does not decode as a protobuf Chunk message");
    return -1;
}
#undef READ
#undef READ12
#undef READ4

static gsize mst_next(MemsimTraceReader *base, guint32 *rank, const MemsimEvent **events,
                      GError **error)
{
    MstReader *r = (MstReader *)base;
    for (;;) {
        unsigned field;
        const guint8 *body = NULL;
        gsize len = 0;
        r->record++;
        int rc = read_record(r, &field, &body, &len, error);
        if (rc < 0)
            return 0;
        if (rc == 0) {
            mst_fail(r, error, "truncated: the stream ends without an end record");
            return 0;
        }
        if (field == REC_CHUNK) {
            gssize n = decode_chunk(r, body, body + len, rank, error);
            if (n < 0)
                return 0;
            r->n_chunks++;
            r->n_events += (guint64)n;
            if (n == 0)
                continue; /* only table growth */
            *events = r->events;
            return (gsize)n;
        }
        if (field == REC_END) {
            Memsim__Mst__End *m = memsim__mst__end__unpack(NULL, len, body);
            if (!m) {
                mst_fail(r, error, "the end record does not decode as a protobuf End message");
                return 0;
            }
            gboolean match = m->n_chunks == r->n_chunks && m->n_events == r->n_events;
            uint64_t mc = m->n_chunks, me = m->n_events;
            memsim__mst__end__free_unpacked(m, NULL);
            if (!match) {
                mst_fail(r, error,
                         "the end record counts %" PRIu64 " chunks and %" PRIu64
                         " events, but the file holds %" G_GUINT64_FORMAT " and %" G_GUINT64_FORMAT,
                         mc, me, r->n_chunks, r->n_events);
                return 0;
            }
            rc = fill(r, 1, error);
            if (rc < 0)
                return 0;
            if (rc > 0) {
                r->record++;
                r->record_offset = r->buf_offset + r->pos;
                r->body = 0;
                mst_fail(r, error, "data after the end record");
                return 0;
            }
            return 0;
        }
        if (field == REC_HEADER) {
            mst_fail(r, error, "a second header record");
            return 0;
        }
        /* A record type from a later minor version: skipped. */
    }
}

static void mst_reader_clear(MemsimTraceReader *base)
{
    MstReader *r = (MstReader *)base;
    ZSTD_freeDCtx(r->dctx);
    g_free(r->zin);
    g_free(r->buf);
    g_free(r->events);
    if (r->strings)
        g_array_unref(r->strings);
    if (r->ops)
        g_array_unref(r->ops);
}

static gsize mst_buffer_bytes(MemsimTraceReader *base)
{
    MstReader *r = (MstReader *)base;
    return r->cap + r->zin_cap + r->events_cap * sizeof(MemsimEvent);
}

static const MemsimReaderOps mst_reader_ops = {
    .next = mst_next,
    .clear = mst_reader_clear,
    .buffer_bytes = mst_buffer_bytes,
};

MemsimTraceReader *memsim_mst_reader_new(MemsimSource *src, const char *name, GError **error)
{
    MstReader *r = (MstReader *)memsim_trace_reader_alloc(sizeof(MstReader), &mst_reader_ops,
                                                          MEMSIM_FORMAT_MST, src, name);
    r->dctx = ZSTD_createDCtx();
    g_assert(r->dctx != NULL);
    r->zin_cap = ZSTD_DStreamInSize();
    r->zin = g_malloc(r->zin_cap);
    r->in.src = r->zin;
    r->strings = g_array_new(FALSE, FALSE, sizeof(Slice));
    r->ops = g_array_new(FALSE, FALSE, sizeof(Slice));
    if (!read_header(r, error)) {
        memsim_trace_reader_free(&r->base);
        return NULL;
    }
    return &r->base;
}
