/* What every trace format shares (formats/formats-internal.h): byte sources, the checks
 * every reader and writer applies to headers and events (memsim_header_check,
 * memsim_events_check), and the generic reader and writer that the formats (mst_*.c, text_*.c)
 * and the in-memory reader (reader.c) fill in through their ops. Because every format passes
 * through the same checks, a trace one format accepts is one the others can hold: that is
 * what makes text → .mst → text exact.
 */
#include "formats/formats-internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

void memsim_set_bad_input(GError **error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error_literal(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, msg);
    g_free(msg);
}

/* ---- byte sources ---- */

void memsim_source_init_memory(MemsimSource *s, const guint8 *data, gsize len)
{
    memset(s, 0, sizeof *s);
    s->data = data;
    s->len = len;
}

void memsim_source_init_file(MemsimSource *s, FILE *file)
{
    memset(s, 0, sizeof *s);
    s->file = file;
}

static gboolean source_read_raw(MemsimSource *s, guint8 *buf, gsize cap, gsize *got,
                                const char *name, GError **error)
{
    if (s->file) {
        gsize n = fread(buf, 1, cap, s->file);
        if (n < cap && ferror(s->file)) {
            int e = errno;
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: read error: %s", name,
                        g_strerror(e ? e : EIO));
            return FALSE;
        }
        *got = n;
        return TRUE;
    }
    gsize n = MIN(cap, s->len - s->pos);
    if (n)
        memcpy(buf, s->data + s->pos, n);
    s->pos += n;
    *got = n;
    return TRUE;
}

gboolean memsim_source_peek(MemsimSource *s, const guint8 **head, gsize *len, const char *name,
                            GError **error)
{
    while (s->head_len < sizeof s->head) {
        gsize got = 0;
        if (!source_read_raw(s, s->head + s->head_len, sizeof s->head - s->head_len, &got, name,
                             error))
            return FALSE;
        if (got == 0)
            break;
        s->head_len += got;
    }
    *head = s->head + s->head_pos;
    *len = s->head_len - s->head_pos;
    return TRUE;
}

gboolean memsim_source_read(MemsimSource *s, void *buf, gsize cap, gsize *got, const char *name,
                            GError **error)
{
    gsize from_head = MIN(cap, s->head_len - s->head_pos);
    if (from_head) {
        memcpy(buf, s->head + s->head_pos, from_head);
        s->head_pos += from_head;
        s->consumed += from_head;
        *got = from_head;
        return TRUE;
    }
    if (!source_read_raw(s, buf, cap, got, name, error))
        return FALSE;
    s->consumed += *got;
    return TRUE;
}

void memsim_source_clear(MemsimSource *s)
{
    if (s->file)
        fclose(s->file);
    memset(s, 0, sizeof *s);
}

/* ---- checks shared by all formats ---- */

char *memsim_rank_check(const MemsimRankInfo *r)
{
    if (r->multiplicity < 1)
        return g_strdup("multiplicity 0 (expected at least 1)");
    if (r->n_streams < 1 || r->n_streams > MEMSIM_MAX_STREAMS)
        return g_strdup_printf("%" PRIu32 " streams (expected 1 .. %u)", r->n_streams,
                               MEMSIM_MAX_STREAMS);
    return NULL;
}

char *memsim_ops_check(const MemsimTraceHeader *h, guint32 first_op)
{
    for (guint32 i = first_op; i < h->n_ops; i++) {
        const MemsimOpInfo *op = &h->ops[i];
        if (op->name >= h->n_strings)
            return g_strdup_printf("op %" PRIu32 ": name is string %" PRIu32
                                   ", not in the string table (%" PRIu32 " strings)",
                                   i, op->name, h->n_strings);
        if (op->phase >= MEMSIM_PHASE_COUNT)
            return g_strdup_printf("op %" PRIu32 ": phase %u out of range (expected 0 .. %d)", i,
                                   op->phase, MEMSIM_PHASE_COUNT - 1);
        if (!isfinite(op->duration_us) || op->duration_us < 0)
            return g_strdup_printf("op %" PRIu32 ": duration %g us (expected a finite number "
                                   ">= 0)",
                                   i, op->duration_us);
        if (op->bound >= MEMSIM_BOUND_COUNT)
            return g_strdup_printf("op %" PRIu32 ": bound %u out of range (expected 0 .. %d)", i,
                                   op->bound, MEMSIM_BOUND_COUNT - 1);
    }
    return NULL;
}

char *memsim_header_check(const MemsimTraceHeader *h)
{
    if (h->n_ranks > MEMSIM_MAX_RANKS || h->n_strings > MEMSIM_MAX_STRINGS ||
        h->n_ops > MEMSIM_MAX_OPS)
        return g_strdup_printf("%" PRIu32 " ranks, %" PRIu32 " strings, %" PRIu32
                               " ops (expected at most %u, %u, %u)",
                               h->n_ranks, h->n_strings, h->n_ops, MEMSIM_MAX_RANKS,
                               MEMSIM_MAX_STRINGS, MEMSIM_MAX_OPS);
    for (guint32 i = 0; i < h->n_ranks; i++) {
        char *why = memsim_rank_check(&h->ranks[i]);
        if (why) {
            char *m = g_strdup_printf("rank %" PRIu32 ": %s", i, why);
            g_free(why);
            return m;
        }
    }
    for (guint32 i = 0; i < h->n_strings; i++)
        g_assert(h->strings[i] != NULL);
    return memsim_ops_check(h, 0);
}

char *memsim_events_check(const MemsimTraceHeader *h, guint32 rank, const MemsimEvent *events,
                          gsize n, gsize *bad)
{
    g_assert(rank < h->n_ranks);
    const uint32_t n_streams = h->ranks[rank].n_streams;
    for (gsize i = 0; i < n; i++) {
        const MemsimEvent *e = &events[i];
        *bad = i;
        if (G_LIKELY(memsim_event_ok(h, n_streams, e)))
            continue;
        if ((unsigned)e->kind - 1u >= MEMSIM_EV_KIND_MAX)
            return g_strdup_printf("event kind %u out of range (expected 1 .. %d)", e->kind,
                                   MEMSIM_EV_KIND_MAX);
        if (e->stream >= n_streams)
            return g_strdup_printf("stream %u is not one of the rank's %" PRIu32 " streams",
                                   e->stream, n_streams);
        if (e->category >= MEMSIM_CAT_COUNT)
            return g_strdup_printf("category %u out of range (expected 0 .. %d)", e->category,
                                   MEMSIM_CAT_COUNT - 1);
        switch (e->kind) {
        case MEMSIM_EV_WAIT:
            if (e->id >= n_streams)
                return g_strdup_printf("wait on stream %" PRIu64 ", not one of the rank's %" PRIu32
                                       " streams",
                                       e->id, n_streams);
            break;
        case MEMSIM_EV_OP:
            if (e->id >= h->n_ops)
                return g_strdup_printf("op %" PRIu64 " is not in the op table (%" PRIu32 " ops)",
                                       e->id, h->n_ops);
            break;
        case MEMSIM_EV_MARK:
            if (e->id >= h->n_strings)
                return g_strdup_printf("mark names string %" PRIu64
                                       ", not in the string table (%" PRIu32 " strings)",
                                       e->id, h->n_strings);
            break;
        case MEMSIM_EV_COLLECTIVE:
            if (e->aux >= MEMSIM_COLL_COUNT)
                return g_strdup_printf("collective kind %" PRIu64 " out of range (expected 0 "
                                       ".. %d)",
                                       e->aux, MEMSIM_COLL_COUNT - 1);
            break;
        case MEMSIM_EV_SEG_ALLOC:
        case MEMSIM_EV_SEG_FREE:
        case MEMSIM_EV_SEG_MAP:
        case MEMSIM_EV_SEG_UNMAP:
        case MEMSIM_EV_INIT_SEGMENT:
            if (e->addr + e->size < e->addr)
                return g_strdup_printf("segment at 0x%" PRIx64 " of %" PRIu64
                                       " bytes reaches 2^64",
                                       e->addr, e->size);
            break;
        case MEMSIM_EV_INIT_BLOCK:
            if (e->addr + e->aux < e->addr)
                return g_strdup_printf("block at 0x%" PRIx64 " of %" PRIu64 " bytes reaches 2^64",
                                       e->addr, e->aux);
            break;
        default:
            break;
        }
        g_assert_not_reached(); /* memsim_event_ok and the messages disagree */
    }
    return NULL;
}

gboolean memsim_events_check_named(const MemsimTraceHeader *h, const char *name, guint32 rank,
                                   gsize at, const MemsimEvent *events, gsize n, GError **error)
{
    gsize bad;
    char *why = memsim_events_check(h, rank, events, n, &bad);
    if (!why)
        return TRUE;
    memsim_set_bad_input(error, "%s: rank %" PRIu32 ", event %" G_GSIZE_FORMAT ": %s", name, rank,
                         at + bad, why);
    g_free(why);
    return FALSE;
}

void memsim_header_append_string(MemsimTraceHeader *h, const char *s, gsize len)
{
    /* The array stays NULL-terminated like the in-memory trace's. Arrays come from several
     * owners, so their capacity is unknown: grow by one (realloc is amortised by libc). */
    h->strings = g_renew(char *, h->strings, (gsize)h->n_strings + 2);
    h->strings[h->n_strings++] = g_strndup(s, len);
    h->strings[h->n_strings] = NULL;
}

void memsim_header_append_op(MemsimTraceHeader *h, const MemsimOpInfo *op)
{
    h->ops = g_renew(MemsimOpInfo, h->ops, (gsize)h->n_ops + 1);
    h->ops[h->n_ops++] = *op;
}

/* ---- readers ---- */

MemsimTraceReader *memsim_trace_reader_alloc(gsize size, const MemsimReaderOps *ops,
                                             MemsimFormat format, MemsimSource *src,
                                             const char *name)
{
    g_assert(size >= sizeof(MemsimTraceReader));
    MemsimTraceReader *r = g_malloc0(size);
    r->ops = ops;
    r->format = format;
    r->name = g_strdup(name);
    if (src) {
        r->src = *src;
        memset(src, 0, sizeof *src);
    }
    return r;
}

void memsim_trace_reader_free(MemsimTraceReader *r)
{
    if (!r)
        return;
    if (r->ops && r->ops->clear)
        r->ops->clear(r);
    memsim_source_clear(&r->src);
    memsim_trace_header_clear(&r->header);
    g_clear_error(&r->failure);
    g_free(r->name);
    g_free(r);
}

const MemsimTraceHeader *memsim_trace_reader_header(MemsimTraceReader *r)
{
    return &r->header;
}

MemsimFormat memsim_trace_reader_format(MemsimTraceReader *r)
{
    return r->format;
}

gsize memsim_trace_reader_buffer_bytes(MemsimTraceReader *r)
{
    return r->ops->buffer_bytes ? r->ops->buffer_bytes(r) : 0;
}

gsize memsim_trace_reader_next(MemsimTraceReader *r, guint32 *rank, const MemsimEvent **events,
                               GError **error)
{
    if (r->failure) {
        if (error)
            *error = g_error_copy(r->failure);
        return 0;
    }
    if (r->done)
        return 0;
    GError *local = NULL;
    gsize n = r->ops->next(r, rank, events, &local);
    if (n == 0) {
        if (local) {
            r->failure = g_error_copy(local);
            g_propagate_error(error, local);
        } else {
            r->done = TRUE;
        }
    }
    return n;
}

MemsimTraceWriter *memsim_trace_writer_alloc(gsize size, const MemsimWriterOps *ops,
                                             MemsimFormat format, FILE *file, gboolean close_file,
                                             const char *name, const MemsimTraceHeader *header)
{
    g_assert(size >= sizeof(MemsimTraceWriter));
    MemsimTraceWriter *w = g_malloc0(size);
    w->ops = ops;
    w->format = format;
    w->file = file;
    w->close_file = close_file;
    w->name = g_strdup(name);
    memsim_trace_header_copy(&w->header, header);
    return w;
}

gboolean memsim_trace_writer_update_header(MemsimTraceWriter *w, const MemsimTraceHeader *header,
                                           GError **error)
{
    MemsimTraceHeader *h = &w->header;
    if (header->n_ranks != h->n_ranks || header->n_strings < h->n_strings ||
        header->n_ops < h->n_ops) {
        memsim_set_bad_input(error,
                             "%s: the new header does not extend the one given before (%" PRIu32
                             " ranks, %" PRIu32 " strings, %" PRIu32 " ops, then %" PRIu32
                             ", %" PRIu32 ", %" PRIu32 ")",
                             w->name, h->n_ranks, h->n_strings, h->n_ops, header->n_ranks,
                             header->n_strings, header->n_ops);
        return FALSE;
    }
    if (header->n_strings > MEMSIM_MAX_STRINGS || header->n_ops > MEMSIM_MAX_OPS) {
        memsim_set_bad_input(
            error, "%s: header: %" PRIu32 " strings, %" PRIu32 " ops (expected at most %u, %u)",
            w->name, header->n_strings, header->n_ops, MEMSIM_MAX_STRINGS, MEMSIM_MAX_OPS);
        return FALSE;
    }
    guint32 first_op = h->n_ops;
    for (guint32 i = h->n_strings; i < header->n_strings; i++)
        memsim_header_append_string(h, header->strings[i], strlen(header->strings[i]));
    for (guint32 i = h->n_ops; i < header->n_ops; i++)
        memsim_header_append_op(h, &header->ops[i]);
    char *why = memsim_ops_check(h, first_op);
    if (why) {
        memsim_set_bad_input(error, "%s: header: %s", w->name, why);
        g_free(why);
        h->n_ops = first_op; /* forget the bad ops */
        return FALSE;
    }
    return TRUE;
}

gboolean memsim_trace_writer_write(MemsimTraceWriter *w, guint32 rank, const MemsimEvent *events,
                                   gsize n, GError **error)
{
    if (w->failed) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: an earlier write failed", w->name);
        return FALSE;
    }
    if (rank >= w->header.n_ranks) {
        memsim_set_bad_input(error,
                             "%s: rank %" PRIu32 " out of range (the header has %" PRIu32 " ranks)",
                             w->name, rank, w->header.n_ranks);
        return FALSE;
    }
    if (n == 0)
        return TRUE;
    gsize bad;
    char *why = memsim_events_check(&w->header, rank, events, n, &bad);
    if (why) {
        memsim_set_bad_input(error,
                             "%s: rank %" PRIu32 ", event %" G_GUINT64_FORMAT " of the file: %s",
                             w->name, rank, w->n_events + bad, why);
        g_free(why);
        return FALSE;
    }
    if (!w->ops->write(w, rank, events, n, error)) {
        w->failed = TRUE;
        return FALSE;
    }
    w->n_events += n;
    return TRUE;
}

gboolean memsim_trace_writer_close(MemsimTraceWriter *w, GError **error)
{
    if (!w)
        return TRUE;
    gboolean ok = !w->failed;
    if (!ok)
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: an earlier write failed", w->name);
    if (ok)
        ok = w->ops->finish(w, error);
    if (ok && fflush(w->file) != 0) {
        int e = errno;
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: write error: %s", w->name,
                    g_strerror(e));
        ok = FALSE;
    }
    if (w->close_file && fclose(w->file) != 0 && ok) {
        int e = errno;
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: write error: %s", w->name,
                    g_strerror(e));
        ok = FALSE;
    }
    if (w->ops->clear)
        w->ops->clear(w);
    memsim_trace_header_clear(&w->header);
    g_free(w->name);
    g_free(w);
    return ok;
}

