/* The .mst trace file: streaming reader and writer (spec: formats/README.md; schema:
 * formats/mst.proto).
 *
 * A zstd stream holding a 12-byte preamble and then length-delimited Record messages: the
 * header, chunks of events of one rank stored as columns, and an end record. The header and
 * the rare small messages (ops, the end record) go through protobuf-c; chunks are encoded
 * and decoded by hand, because they are the bulk of the file: one fused loop over the
 * events reads every column at once, straight into MemsimEvent, with no per-event message
 * and no intermediate arrays. The hand-written coder produces and accepts exactly the
 * protobuf encoding of mst.proto's Chunk with each column written once, packed (the tests
 * check it against protobuf-c's own unpacking).
 *
 * Memory: the writer holds one chunk of events and its encoding; the reader holds the
 * decompressed bytes of about one record, the zstd window and one chunk of events. Neither
 * depends on the trace's length. Every length, count, index and varint read is bounds
 * checked; bad input is reported with the chunk, the event and the decompressed byte offset
 * of the record.
 */
#include "formats/formats-internal.h"
#include "formats/mst.pb-c.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <zstd.h>

#define MST_MAGIC "MEMSIMTR"
#define MST_MAJOR 1
#define MST_MINOR 0
#define MST_PREAMBLE 12
#define MST_MAX_RECORD (64u << 20) /* bytes in one record: above any chunk of valid size */
#define MST_ZSTD_LEVEL 3

/* Record fields (mst.proto). */
enum { REC_HEADER = 1, REC_CHUNK = 2, REC_END = 3 };

/* Chunk fields and the columns they hold. */
enum {
    CH_RANK = 1,
    CH_N_EVENTS = 2,
    CH_KIND = 3,
    CH_STREAM,
    CH_FLAGS,
    CH_CATEGORY,
    CH_ID,
    CH_SIZE,
    CH_ADDR,
    CH_AUX,
    CH_EXTRA_EVENT,
    CH_EXTRA_FIELD,
    CH_EXTRA_VALUE,
    CH_STRINGS = 14,
    CH_OPS = 15,
};
#define N_COLUMNS 11 /* fields 3 .. 13 */
#define COL(field) ((field)-CH_KIND)

static const char *const column_names[N_COLUMNS] = {
    "kind", "stream", "flags",       "category",    "id",          "size",
    "addr", "aux",    "extra_event", "extra_field", "extra_value",
};

/* Which kinds carry which fields in the columns; anything else non-zero is an extra. An
 * ALLOC carries addr only when its flags have MEMSIM_EVF_ADDR. */
enum { C_ID = 1, C_SIZE = 2, C_ADDR = 4, C_AUX = 8, C_CAT = 16, C_FLAGS = 32 };
static const uint8_t carries[16] = {
    [MEMSIM_EV_ALLOC] = C_ID | C_SIZE | C_ADDR | C_CAT | C_FLAGS,
    [MEMSIM_EV_FREE] = C_ID,
    [MEMSIM_EV_USE] = C_ID,
    [MEMSIM_EV_OP] = C_ID,
    [MEMSIM_EV_WAIT] = C_ID,
    [MEMSIM_EV_COLLECTIVE] = C_ID | C_SIZE | C_AUX,
    [MEMSIM_EV_EMPTY_CACHE] = C_FLAGS,
    [MEMSIM_EV_MARK] = C_ID,
    [MEMSIM_EV_SEG_ALLOC] = C_ADDR | C_SIZE,
    [MEMSIM_EV_SEG_FREE] = C_ADDR | C_SIZE,
    [MEMSIM_EV_SEG_MAP] = C_ADDR | C_SIZE,
    [MEMSIM_EV_SEG_UNMAP] = C_ADDR | C_SIZE,
    [MEMSIM_EV_OOM] = C_SIZE | C_ADDR,
    [MEMSIM_EV_INIT_SEGMENT] = C_ADDR | C_SIZE | C_AUX,
    [MEMSIM_EV_INIT_BLOCK] = C_ID | C_ADDR | C_SIZE | C_AUX | C_CAT,
};

/* Extra field codes, in the order an event's extras are written. */
enum { X_ID = 1, X_SIZE, X_ADDR, X_AUX, X_CATEGORY, X_FLAGS };
static const uint8_t extra_column_bit[7] = {0, C_ID, C_SIZE, C_ADDR, C_AUX, C_CAT, C_FLAGS};

static inline unsigned carried(const MemsimEvent *e)
{
    unsigned m = carries[e->kind & 15];
    if (e->kind == MEMSIM_EV_ALLOC && !(e->flags & MEMSIM_EVF_ADDR))
        m &= ~(unsigned)C_ADDR;
    return m;
}

static inline uint64_t zigzag(uint64_t delta)
{
    return (delta << 1) ^ (uint64_t)((int64_t)delta >> 63);
}

static inline uint64_t unzigzag(uint64_t v)
{
    return (v >> 1) ^ (uint64_t) - (int64_t)(v & 1);
}

/* ---- varints ---- */

static inline guint8 *put_varint(guint8 *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (guint8)(v | 0x80);
        v >>= 7;
    }
    *p++ = (guint8)v;
    return p;
}

static inline gsize varint_len(uint64_t v)
{
    gsize n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* NULL when the varint runs past `end` or is longer than 64 bits. */
static __attribute__((noinline)) const guint8 *get_varint_slow(const guint8 *p, const guint8 *end,
                                                               uint64_t *out)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (p >= end)
            return NULL;
        guint8 b = *p++;
        if (shift == 63 && b > 1)
            return NULL;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = x;
            return p;
        }
    }
    return NULL;
}

/* Away from the end of the buffer, up to ten bytes are read without bounds checks. A varint
 * of at most 8 bytes (values below 2^56) is decoded without a branch on its length: the
 * first byte below 0x80 ends it, and its 7-bit groups are gathered pairwise. */
static inline const guint8 *get_varint(const guint8 *p, const guint8 *end, uint64_t *out)
{
    if (G_LIKELY(end - p >= 10)) {
        uint64_t w;
        memcpy(&w, p, 8);
        w = GUINT64_FROM_LE(w);
        const uint64_t stop = ~w & 0x8080808080808080ull; /* bit 7 of each last-byte candidate */
        if (G_LIKELY(stop)) {
            const uint64_t x = w & (stop ^ (stop - 1)) & 0x7f7f7f7f7f7f7f7full;
            uint64_t y = (x & 0x007f007f007f007full) | ((x & 0x7f007f007f007f00ull) >> 1);
            y = (y & 0x00003fff00003fffull) | ((y & 0x3fff00003fff0000ull) >> 2);
            *out = (y & 0x000000000fffffffull) | ((y & 0x0fffffff00000000ull) >> 4);
            return p + ((unsigned)__builtin_ctzll(stop) >> 3) + 1;
        }
        uint64_t x = 0;
        for (unsigned i = 0; i < 9; i++) {
            guint8 b = p[i];
            x |= (uint64_t)(b & 0x7f) << (7 * i);
            if (b < 0x80) {
                *out = x;
                return p + i + 1;
            }
        }
        if (p[9] > 1)
            return NULL;
        *out = x | (uint64_t)p[9] << 63;
        return p + 10;
    }
    return get_varint_slow(p, end, out);
}

/* get_varint for values that mostly take at most four bytes (sizes): those in 32-bit
 * arithmetic, the rest as get_varint does. */
static inline const guint8 *get_varint4(const guint8 *p, const guint8 *end, uint64_t *out)
{
    if (G_LIKELY(end - p >= 4)) {
        uint32_t w;
        memcpy(&w, p, 4);
        w = GUINT32_FROM_LE(w);
        const uint32_t stop = ~w & 0x80808080u;
        if (G_LIKELY(stop)) {
            const uint32_t x = w & (stop ^ (stop - 1)) & 0x7f7f7f7fu;
            const uint32_t y = (x & 0x007f007fu) | ((x & 0x7f007f00u) >> 1);
            *out = (y & 0x3fffu) | ((y & 0x3fff0000u) >> 2);
            return p + ((unsigned)__builtin_ctz(stop) >> 3) + 1;
        }
    }
    return get_varint(p, end, out);
}

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

/* ======================================================================== writer ==== */

typedef struct {
    guint8 *p;
    gsize len, cap;
} Buf;

static void buf_reserve(Buf *b, gsize extra)
{
    if (b->cap - b->len >= extra)
        return;
    gsize cap = b->cap ? b->cap : 4096;
    while (cap - b->len < extra)
        cap *= 2;
    b->p = g_realloc(b->p, cap);
    b->cap = cap;
}

static void buf_varint(Buf *b, uint64_t v)
{
    buf_reserve(b, 10);
    b->len = (gsize)(put_varint(b->p + b->len, v) - b->p);
}

static void buf_bytes(Buf *b, const void *data, gsize len)
{
    buf_reserve(b, len);
    if (len)
        memcpy(b->p + b->len, data, len);
    b->len += len;
}

/* A length-delimited field: tag, length, bytes. */
static void buf_field(Buf *b, unsigned field, const void *data, gsize len)
{
    buf_varint(b, (uint64_t)field << 3 | 2);
    buf_varint(b, len);
    buf_bytes(b, data, len);
}

typedef struct {
    MemsimTraceWriter base;
    ZSTD_CCtx *cctx;
    guint8 *zout;
    gsize zout_cap;
    MemsimEvent *pend; /* the chunk being filled: events of pend_rank */
    gsize n_pend, pend_cap, chunk_events;
    guint32 pend_rank;
    /* The header's table sizes when the pending chunk got its first event: the strings and
     * ops below them go with that chunk, those declared later with the next one. */
    guint32 pend_strings, pend_ops;
    Buf col[N_COLUMNS];
    Buf body;
    guint64 n_chunks, total_events;
} MstWriter;

static gboolean compress_bytes(MstWriter *w, const void *data, gsize len, ZSTD_EndDirective mode,
                               GError **error)
{
    ZSTD_inBuffer in = {data, len, 0};
    for (;;) {
        ZSTD_outBuffer out = {w->zout, w->zout_cap, 0};
        size_t ret = ZSTD_compressStream2(w->cctx, &out, &in, mode);
        if (ZSTD_isError(ret)) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: zstd: %s", w->base.name,
                        ZSTD_getErrorName(ret));
            return FALSE;
        }
        if (out.pos && fwrite(w->zout, 1, out.pos, w->base.file) != out.pos) {
            int e = errno;
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: write error: %s", w->base.name,
                        g_strerror(e ? e : EIO));
            return FALSE;
        }
        if (mode == ZSTD_e_continue ? in.pos == in.size : ret == 0)
            return TRUE;
    }
}

/* Writes one record: its length, then a Record whose field `field` is `body`. */
static gboolean write_record(MstWriter *w, unsigned field, const Buf *body, GError **error)
{
    guint8 prefix[32];
    gsize rec_len = 1 + varint_len(body->len) + body->len;
    guint8 *p = put_varint(prefix, rec_len);
    *p++ = (guint8)(field << 3 | 2);
    p = put_varint(p, body->len);
    return compress_bytes(w, prefix, (gsize)(p - prefix), ZSTD_e_continue, error) &&
           compress_bytes(w, body->p, body->len, ZSTD_e_continue, error);
}

static void op_to_pb(const MemsimOpInfo *op, Memsim__Mst__Op *m)
{
    memsim__mst__op__init(m);
    m->has_name = m->has_phase = m->has_layer = m->has_microbatch = m->has_duration_us = TRUE;
    m->name = op->name;
    m->phase = op->phase;
    m->layer = op->layer;
    m->microbatch = op->microbatch;
    m->duration_us = op->duration_us;
}

static void buf_message(Buf *b, const ProtobufCMessage *m)
{
    gsize len = protobuf_c_message_get_packed_size(m);
    buf_reserve(b, len);
    b->len += protobuf_c_message_pack(m, b->p + b->len);
}

static gboolean write_header(MstWriter *w, GError **error)
{
    const MemsimTraceHeader *h = &w->base.header;
    Memsim__Mst__Header m = MEMSIM__MST__HEADER__INIT;
    m.name = h->name ? h->name : (char *)"";
    m.alloc_conf = h->alloc_conf;
    m.has_capacity = TRUE;
    m.capacity = h->capacity;
    Memsim__Mst__Rank *ranks = g_new0(Memsim__Mst__Rank, h->n_ranks + 1);
    Memsim__Mst__Rank **rank_ptrs = g_new0(Memsim__Mst__Rank *, h->n_ranks + 1);
    for (guint32 i = 0; i < h->n_ranks; i++) {
        const MemsimRankInfo *r = &h->ranks[i];
        Memsim__Mst__Rank *pr = &ranks[i];
        memsim__mst__rank__init(pr);
        pr->has_device = pr->has_multiplicity = pr->has_n_streams = TRUE;
        pr->device = r->device;
        pr->multiplicity = r->multiplicity;
        pr->role = r->role;
        pr->n_streams = r->n_streams;
        if (r->stream_handles) {
            pr->n_stream_handles = r->n_streams;
            pr->stream_handles = r->stream_handles;
        }
        if (r->has_final) {
            pr->has_has_final = pr->has_final_reserved = pr->has_final_allocated = TRUE;
            pr->has_final = TRUE;
            pr->final_reserved = r->final_reserved;
            pr->final_allocated = r->final_allocated;
        }
        rank_ptrs[i] = pr;
    }
    m.n_ranks = h->n_ranks;
    m.ranks = rank_ptrs;
    m.n_strings = h->n_strings;
    m.strings = h->strings;
    Memsim__Mst__Op *ops = g_new0(Memsim__Mst__Op, h->n_ops + 1);
    Memsim__Mst__Op **op_ptrs = g_new0(Memsim__Mst__Op *, h->n_ops + 1);
    for (guint32 i = 0; i < h->n_ops; i++) {
        op_to_pb(&h->ops[i], &ops[i]);
        op_ptrs[i] = &ops[i];
    }
    m.n_ops = h->n_ops;
    m.ops = op_ptrs;
    w->body.len = 0;
    buf_message(&w->body, &m.base);
    g_free(ranks);
    g_free(rank_ptrs);
    g_free(ops);
    g_free(op_ptrs);
    w->base.header_written = TRUE;
    w->base.written_strings = h->n_strings;
    w->base.written_ops = h->n_ops;
    return write_record(w, REC_HEADER, &w->body, error);
}

/* Encodes the pending events (possibly none) as one chunk, with the strings and ops below
 * `n_strings` and `n_ops` that no chunk has carried yet. */
static gboolean flush_chunk(MstWriter *w, guint32 n_strings, guint32 n_ops, GError **error)
{
    const MemsimEvent *ev = w->pend;
    const gsize n = w->n_pend;
    for (int c = 0; c < N_COLUMNS; c++) {
        w->col[c].len = 0;
        if (c < COL(CH_EXTRA_EVENT))
            buf_reserve(&w->col[c], n * 10 + 16);
    }
    guint8 *pk = w->col[COL(CH_KIND)].p, *ps = w->col[COL(CH_STREAM)].p;
    guint8 *pf = w->col[COL(CH_FLAGS)].p, *pc = w->col[COL(CH_CATEGORY)].p;
    guint8 *pi = w->col[COL(CH_ID)].p, *pz = w->col[COL(CH_SIZE)].p;
    guint8 *pa = w->col[COL(CH_ADDR)].p, *px = w->col[COL(CH_AUX)].p;
    uint64_t prev_id[16] = {0}, prev_addr[16] = {0};
    /* A column whose stored values are all zero is left out (readers take it as zeros). */
    uint64_t any_stream = 0, any_flags = 0, any_cat = 0, any_id = 0, any_size = 0, any_addr = 0,
             any_aux = 0;
    Buf *xe = &w->col[COL(CH_EXTRA_EVENT)], *xf = &w->col[COL(CH_EXTRA_FIELD)],
        *xv = &w->col[COL(CH_EXTRA_VALUE)];
#define EXTRA(field, value)                                                                        \
    do {                                                                                           \
        buf_varint(xe, i);                                                                         \
        buf_varint(xf, field);                                                                     \
        buf_varint(xv, value);                                                                     \
    } while (0)
    for (gsize i = 0; i < n; i++) {
        const MemsimEvent *e = &ev[i];
        const unsigned k = e->kind;
        const unsigned m = carried(e);
        pk = put_varint(pk, k);
        ps = put_varint(ps, e->stream);
        any_stream |= e->stream;
        if (m & C_ID) {
            uint64_t z = zigzag(e->id - prev_id[k]);
            prev_id[k] = e->id;
            pi = put_varint(pi, z);
            any_id |= z;
        } else if (e->id) {
            EXTRA(X_ID, e->id);
        }
        if (m & C_SIZE) {
            pz = put_varint(pz, e->size);
            any_size |= e->size;
        } else if (e->size) {
            EXTRA(X_SIZE, e->size);
        }
        if (m & C_ADDR) {
            uint64_t z = zigzag(e->addr - prev_addr[k]);
            prev_addr[k] = e->addr;
            pa = put_varint(pa, z);
            any_addr |= z;
        } else if (e->addr) {
            EXTRA(X_ADDR, e->addr);
        }
        if (m & C_AUX) {
            px = put_varint(px, e->aux);
            any_aux |= e->aux;
        } else if (e->aux) {
            EXTRA(X_AUX, e->aux);
        }
        if (m & C_CAT) {
            pc = put_varint(pc, e->category);
            any_cat |= e->category;
        } else if (e->category) {
            EXTRA(X_CATEGORY, e->category);
        }
        if (m & C_FLAGS) {
            pf = put_varint(pf, e->flags);
            any_flags |= e->flags;
        } else if (e->flags) {
            EXTRA(X_FLAGS, e->flags);
        }
    }
#undef EXTRA
    w->col[COL(CH_KIND)].len = (gsize)(pk - w->col[COL(CH_KIND)].p);
    w->col[COL(CH_STREAM)].len = any_stream ? (gsize)(ps - w->col[COL(CH_STREAM)].p) : 0;
    w->col[COL(CH_FLAGS)].len = any_flags ? (gsize)(pf - w->col[COL(CH_FLAGS)].p) : 0;
    w->col[COL(CH_CATEGORY)].len = any_cat ? (gsize)(pc - w->col[COL(CH_CATEGORY)].p) : 0;
    w->col[COL(CH_ID)].len = any_id ? (gsize)(pi - w->col[COL(CH_ID)].p) : 0;
    w->col[COL(CH_SIZE)].len = any_size ? (gsize)(pz - w->col[COL(CH_SIZE)].p) : 0;
    w->col[COL(CH_ADDR)].len = any_addr ? (gsize)(pa - w->col[COL(CH_ADDR)].p) : 0;
    w->col[COL(CH_AUX)].len = any_aux ? (gsize)(px - w->col[COL(CH_AUX)].p) : 0;

    Buf *b = &w->body;
    b->len = 0;
    buf_varint(b, CH_RANK << 3);
    buf_varint(b, w->pend_rank);
    buf_varint(b, CH_N_EVENTS << 3);
    buf_varint(b, n);
    for (int c = 0; c < N_COLUMNS; c++)
        if (w->col[c].len)
            buf_field(b, (unsigned)(c + CH_KIND), w->col[c].p, w->col[c].len);
    MemsimTraceHeader *h = &w->base.header;
    for (guint32 i = w->base.written_strings; i < n_strings; i++)
        buf_field(b, CH_STRINGS, h->strings[i], strlen(h->strings[i]));
    for (guint32 i = w->base.written_ops; i < n_ops; i++) {
        Memsim__Mst__Op m;
        op_to_pb(&h->ops[i], &m);
        buf_varint(b, CH_OPS << 3 | 2);
        buf_varint(b, protobuf_c_message_get_packed_size(&m.base));
        buf_message(b, &m.base);
    }
    w->base.written_strings = n_strings;
    w->base.written_ops = n_ops;
    w->n_chunks++;
    w->total_events += n;
    w->n_pend = 0;
    return write_record(w, REC_CHUNK, b, error);
}

static gboolean defs_pending(MstWriter *w)
{
    return w->base.written_strings < w->base.header.n_strings ||
           w->base.written_ops < w->base.header.n_ops;
}

static gboolean mst_write(MemsimTraceWriter *base, guint32 rank, const MemsimEvent *events, gsize n,
                          GError **error)
{
    MstWriter *w = (MstWriter *)base;
    if (!base->header_written && !write_header(w, error))
        return FALSE;
    /* A chunk holds one rank, and strings or ops declared since the last chunk go before
     * the events written after the declaration: close the chunk on either change, so the
     * file keeps the order in which events and declarations were given. */
    const MemsimTraceHeader *h = &base->header;
    if (w->n_pend &&
        (rank != w->pend_rank || h->n_strings != w->pend_strings || h->n_ops != w->pend_ops)) {
        if (!flush_chunk(w, w->pend_strings, w->pend_ops, error))
            return FALSE;
    }
    w->pend_rank = rank;
    while (n) {
        if (w->n_pend == 0) {
            w->pend_strings = h->n_strings;
            w->pend_ops = h->n_ops;
        }
        gsize m = MIN(n, w->chunk_events - w->n_pend);
        if (w->n_pend + m > w->pend_cap) { /* small traces stay small */
            w->pend_cap = MIN(MAX(w->n_pend + m, 2 * w->pend_cap), w->chunk_events);
            w->pend = g_renew(MemsimEvent, w->pend, w->pend_cap);
        }
        memcpy(w->pend + w->n_pend, events, m * sizeof *events);
        w->n_pend += m;
        events += m;
        n -= m;
        if (w->n_pend == w->chunk_events && !flush_chunk(w, w->pend_strings, w->pend_ops, error))
            return FALSE;
    }
    return TRUE;
}

static gboolean mst_finish(MemsimTraceWriter *base, GError **error)
{
    MstWriter *w = (MstWriter *)base;
    if (!base->header_written && !write_header(w, error))
        return FALSE;
    if (w->n_pend && !flush_chunk(w, w->pend_strings, w->pend_ops, error))
        return FALSE;
    if (defs_pending(w) && !flush_chunk(w, base->header.n_strings, base->header.n_ops, error))
        return FALSE;
    Memsim__Mst__End end = MEMSIM__MST__END__INIT;
    end.has_n_chunks = end.has_n_events = TRUE;
    end.n_chunks = w->n_chunks;
    end.n_events = w->total_events;
    w->body.len = 0;
    buf_message(&w->body, &end.base);
    return write_record(w, REC_END, &w->body, error) &&
           compress_bytes(w, NULL, 0, ZSTD_e_end, error);
}

static void mst_writer_clear(MemsimTraceWriter *base)
{
    MstWriter *w = (MstWriter *)base;
    ZSTD_freeCCtx(w->cctx);
    g_free(w->zout);
    g_free(w->pend);
    for (int c = 0; c < N_COLUMNS; c++)
        g_free(w->col[c].p);
    g_free(w->body.p);
}

static const MemsimWriterOps mst_writer_ops = {
    .write = mst_write,
    .finish = mst_finish,
    .clear = mst_writer_clear,
};

MemsimTraceWriter *memsim_mst_writer_new(FILE *file, gboolean close_file, const char *name,
                                         const MemsimTraceHeader *header, GError **error)
{
    MstWriter *w = (MstWriter *)memsim_trace_writer_alloc(
        sizeof(MstWriter), &mst_writer_ops, MEMSIM_FORMAT_MST, file, close_file, name, header);
    w->cctx = ZSTD_createCCtx();
    g_assert(w->cctx != NULL);
    ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, MST_ZSTD_LEVEL);
    ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 1);
    w->zout_cap = ZSTD_CStreamOutSize();
    w->zout = g_malloc(w->zout_cap);
    w->chunk_events = MEMSIM_CHUNK_EVENTS;
    guint8 pre[MST_PREAMBLE];
    memcpy(pre, MST_MAGIC, 8);
    pre[8] = MST_MAJOR & 0xff;
    pre[9] = MST_MAJOR >> 8;
    pre[10] = MST_MINOR & 0xff;
    pre[11] = MST_MINOR >> 8;
    if (!compress_bytes(w, pre, sizeof pre, ZSTD_e_continue, error)) {
        w->base.failed = TRUE;
        memsim_trace_writer_close(&w->base, NULL);
        return NULL;
    }
    return &w->base;
}

/* ======================================================================== reader ==== */

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
    op->name = m->name;
    op->phase = (uint8_t)m->phase;
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
    uint64_t prev_id[16] = {0}, prev_addr[16] = {0};
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
