/* The .mst trace file: the streaming writer (spec: formats/README.md; schema:
 * formats/mst.proto; the file's layout and the varint coding: mst.h; the reader: mst_read.c).
 *
 * Events are gathered into chunks of one rank, closed when full (MEMSIM_CHUNK_EVENTS), at a
 * change of rank or when strings or ops are declared, so that declarations keep their place
 * among the events. The header and the rare small messages (ops, the end record) go through
 * protobuf-c; chunks are encoded by hand, because they are the bulk of the file: one loop
 * over the events writes every column at once, producing exactly the protobuf encoding of
 * mst.proto's Chunk with each column written once, packed. Everything goes into one zstd
 * frame with a content checksum.
 *
 * Memory: one chunk of events and its encoding, whatever the trace's length.
 */
#include "formats/mst.h"
#include "formats/mst.pb-c.h"

#include <errno.h>
#include <string.h>
#include <zstd.h>

#define MST_ZSTD_LEVEL 3

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
    m->has_bound = op->bound != MEMSIM_BOUND_UNKNOWN;
    m->bound = op->bound;
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
        if (r->capacity) {
            pr->has_capacity = TRUE;
            pr->capacity = r->capacity;
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
    uint64_t prev_id[32] = {0}, prev_addr[32] = {0};
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
