/* Trace files in general: format detection, the generic reader and writer, the checks
 * every format applies, loading, saving and conversion (include/memsim/formats.h).
 *
 * The formats themselves live in mst.c and text.c; PyTorch snapshots are imported whole by
 * snapshot.c and then read through the in-memory trace reader defined here. Every reader
 * and writer passes headers and events through the same checks (memsim_header_check,
 * memsim_events_check), so a trace one format accepts is one the others can hold: that is
 * what makes text → .mst → text exact.
 */
#include "formats/formats-internal.h"
#include "formats/snapshot.h"

#include <memsim/export.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include <glib/gstdio.h>

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

static gboolean is_zstd(const guint8 *p, gsize n)
{
    if (n < 4)
        return FALSE;
    uint32_t m = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return m == 0xFD2FB528u || (m & 0xFFFFFFF0u) == 0x184D2A50u; /* frame or skippable frame */
}

static gboolean is_text(const guint8 *p, gsize n)
{
    static const char magic[] = "memsim-trace";
    return n >= sizeof magic - 1 && memcmp(p, magic, sizeof magic - 1) == 0;
}

MemsimTraceReader *memsim_trace_reader_open_source(MemsimSource *src, const char *name,
                                                   MemsimFormat format, GError **error)
{
    if (format == MEMSIM_FORMAT_AUTO) {
        const guint8 *head;
        gsize n;
        if (!memsim_source_peek(src, &head, &n, name, error)) {
            memsim_source_clear(src);
            return NULL;
        }
        if (n == 0)
            memsim_set_bad_input(error,
                                 "%s: empty file (expected a .mst trace, a text trace or a "
                                 "PyTorch snapshot)",
                                 name);
        else if (is_zstd(head, n))
            format = MEMSIM_FORMAT_MST;
        else if (is_text(head, n))
            format = MEMSIM_FORMAT_TEXT;
        else if (memsim_snapshot_sniff(head, n))
            format = MEMSIM_FORMAT_SNAPSHOT;
        else
            memsim_set_bad_input(error,
                                 "%s: not a trace (expected a .mst file, which is a zstd "
                                 "stream; a text trace, whose first line is \"memsim-trace "
                                 "1\"; or a PyTorch snapshot pickle)",
                                 name);
        if (format == MEMSIM_FORMAT_AUTO) {
            memsim_source_clear(src);
            return NULL;
        }
    }
    switch (format) {
    case MEMSIM_FORMAT_MST:
        return memsim_mst_reader_new(src, name, error);
    case MEMSIM_FORMAT_TEXT:
        return memsim_text_reader_new(src, name, error);
    default:
        memsim_source_clear(src);
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "%s: snapshots are read from files only", name);
        return NULL;
    }
}

MemsimTraceReader *memsim_trace_reader_open(const char *path, GError **error)
{
    FILE *f = g_fopen(path, "rb");
    if (!f) {
        int e = errno;
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: cannot open: %s", path,
                    g_strerror(e));
        return NULL;
    }
    MemsimSource src;
    memsim_source_init_file(&src, f);
    const guint8 *head;
    gsize n;
    if (!memsim_source_peek(&src, &head, &n, path, error)) {
        memsim_source_clear(&src);
        return NULL;
    }
    if (n > 0 && !is_zstd(head, n) && !is_text(head, n) && memsim_snapshot_sniff(head, n)) {
        memsim_source_clear(&src);
        MemsimTrace *t = memsim_snapshot_load(path, error);
        if (!t)
            return NULL;
        return memsim_trace_reader_new_for_trace(t, TRUE, path, MEMSIM_FORMAT_SNAPSHOT);
    }
    return memsim_trace_reader_open_source(&src, path, MEMSIM_FORMAT_AUTO, error);
}

/* The in-memory trace as a stream: each rank's program in runs of MEMSIM_CHUNK_EVENTS. */
typedef struct {
    MemsimTraceReader base;
    MemsimTrace *trace;
    gboolean owned;
    guint32 rank;
    gsize pos;
} TraceReader;

static gsize trace_reader_next(MemsimTraceReader *base, guint32 *rank, const MemsimEvent **events,
                               GError **error)
{
    TraceReader *r = (TraceReader *)base;
    while (r->rank < base->header.n_ranks) {
        gsize n;
        const MemsimEvent *ev = memsim_trace_events(r->trace, r->rank, &n);
        if (r->pos < n) {
            gsize m = MIN(n - r->pos, (gsize)MEMSIM_CHUNK_EVENTS);
            gsize bad;
            char *why = memsim_events_check(&base->header, r->rank, ev + r->pos, m, &bad);
            if (why) {
                memsim_set_bad_input(error, "%s: rank %" PRIu32 ", event %" G_GSIZE_FORMAT ": %s",
                                     base->name, r->rank, r->pos + bad, why);
                g_free(why);
                return 0;
            }
            *rank = r->rank;
            *events = ev + r->pos;
            r->pos += m;
            return m;
        }
        r->rank++;
        r->pos = 0;
    }
    return 0;
}

static void trace_reader_clear(MemsimTraceReader *base)
{
    TraceReader *r = (TraceReader *)base;
    if (r->owned)
        memsim_trace_free(r->trace);
}

static const MemsimReaderOps trace_reader_ops = {
    .next = trace_reader_next,
    .clear = trace_reader_clear,
};

MemsimTraceReader *memsim_trace_reader_new_for_trace(MemsimTrace *trace, gboolean owned,
                                                     const char *name, MemsimFormat format)
{
    TraceReader *r = (TraceReader *)memsim_trace_reader_alloc(
        sizeof(TraceReader), &trace_reader_ops, format, NULL, name);
    r->trace = trace;
    r->owned = owned;
    memsim_trace_header_copy(&r->base.header, memsim_trace_header(trace));
    return &r->base;
}

/* Brings the trace's string and op tables up to the reader's. Strings are interned, but a
 * file may repeat a string: then the copy is appended as is, so indices stay the file's. */
static void sync_tables(MemsimTrace *t, const MemsimTraceHeader *src)
{
    MemsimTraceHeader *h = memsim_trace_header(t);
    for (guint32 i = h->n_strings; i < src->n_strings; i++) {
        if (memsim_trace_intern(t, src->strings[i]) != i)
            memsim_header_append_string(h, src->strings[i], strlen(src->strings[i]));
    }
    for (guint32 i = h->n_ops; i < src->n_ops; i++)
        memsim_trace_add_op(t, &src->ops[i]);
}

MemsimTrace *memsim_trace_load(const char *path, GError **error)
{
    MemsimTraceReader *r = memsim_trace_reader_open(path, error);
    if (!r)
        return NULL;
    if (r->format == MEMSIM_FORMAT_SNAPSHOT && ((TraceReader *)r)->owned) {
        /* Already in memory: hand the trace over. */
        TraceReader *tr = (TraceReader *)r;
        MemsimTrace *t = tr->trace;
        tr->owned = FALSE;
        gsize bad;
        char *why = NULL;
        for (guint32 k = 0; k < r->header.n_ranks && !why; k++) {
            gsize n;
            const MemsimEvent *ev = memsim_trace_events(t, k, &n);
            why = memsim_events_check(&r->header, k, ev, n, &bad);
            if (why)
                memsim_set_bad_input(error, "%s: rank %" PRIu32 ", event %" G_GSIZE_FORMAT ": %s",
                                     path, k, bad, why);
        }
        memsim_trace_reader_free(r);
        if (why) {
            g_free(why);
            memsim_trace_free(t);
            return NULL;
        }
        return t;
    }
    const MemsimTraceHeader *src = memsim_trace_reader_header(r);
    MemsimTrace *t = memsim_trace_new(src->name);
    MemsimTraceHeader *h = memsim_trace_header(t);
    h->alloc_conf = g_strdup(src->alloc_conf);
    h->capacity = src->capacity;
    for (guint32 i = 0; i < src->n_ranks; i++) {
        const MemsimRankInfo *s = &src->ranks[i];
        memsim_trace_add_rank(t, s->device, s->multiplicity);
        MemsimRankInfo *d = &h->ranks[i];
        d->role = g_strdup(s->role);
        d->n_streams = s->n_streams;
        d->stream_handles = s->stream_handles
                                ? g_memdup2(s->stream_handles, sizeof(uint64_t) * s->n_streams)
                                : NULL;
        d->has_final = s->has_final;
        d->final_reserved = s->final_reserved;
        d->final_allocated = s->final_allocated;
    }
    guint32 rank;
    const MemsimEvent *ev;
    gsize n;
    GError *local = NULL;
    while ((n = memsim_trace_reader_next(r, &rank, &ev, &local)) > 0) {
        sync_tables(t, memsim_trace_reader_header(r));
        memsim_trace_append(t, rank, ev, n);
    }
    sync_tables(t, memsim_trace_reader_header(r));
    memsim_trace_reader_free(r);
    if (local) {
        g_propagate_error(error, local);
        memsim_trace_free(t);
        return NULL;
    }
    return t;
}

MemsimFormat memsim_format_from_path(const char *path)
{
    g_autofree char *lower = g_ascii_strdown(path, -1);
    if (g_str_has_suffix(lower, ".mst"))
        return MEMSIM_FORMAT_MST;
    if (g_str_has_suffix(lower, ".txt") || g_str_has_suffix(lower, ".mstt"))
        return MEMSIM_FORMAT_TEXT;
    if (g_str_has_suffix(lower, ".pickle") || g_str_has_suffix(lower, ".pkl"))
        return MEMSIM_FORMAT_SNAPSHOT;
    return MEMSIM_FORMAT_AUTO;
}

/* ---- writers ---- */

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

MemsimTraceWriter *memsim_trace_writer_new_stream(FILE *file, gboolean close_file, const char *name,
                                                  MemsimFormat format,
                                                  const MemsimTraceHeader *header, GError **error)
{
    char *why = memsim_header_check(header);
    if (why) {
        memsim_set_bad_input(error, "%s: header: %s", name, why);
        g_free(why);
        if (close_file)
            fclose(file);
        return NULL;
    }
    switch (format) {
    case MEMSIM_FORMAT_MST:
        return memsim_mst_writer_new(file, close_file, name, header, error);
    case MEMSIM_FORMAT_TEXT:
        return memsim_text_writer_new(file, close_file, name, header, error);
    default:
        if (close_file)
            fclose(file);
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "%s: writing snapshots is not supported yet", name);
        return NULL;
    }
}

static MemsimFormat output_format(const char *path, MemsimFormat format)
{
    if (format != MEMSIM_FORMAT_AUTO)
        return format;
    format = memsim_format_from_path(path);
    return format == MEMSIM_FORMAT_AUTO ? MEMSIM_FORMAT_TEXT : format;
}

/* The format memsim_trace_save and memsim_convert write: `format`, or with AUTO the one the
 * extension names; an unknown extension is refused rather than written as text. */
static gboolean output_format_known(const char *path, MemsimFormat *format, GError **error)
{
    if (*format == MEMSIM_FORMAT_AUTO)
        *format = memsim_format_from_path(path);
    if (*format != MEMSIM_FORMAT_AUTO)
        return TRUE;
    memsim_set_bad_input(error,
                         "%s: unknown extension: the format written follows it (expected .mst "
                         "for binary, .txt or .mstt for text, .pickle or .pkl for a PyTorch "
                         "snapshot)",
                         path);
    return FALSE;
}

MemsimTraceWriter *memsim_trace_writer_new(const char *path, MemsimFormat format,
                                           const MemsimTraceHeader *header, GError **error)
{
    format = output_format(path, format);
    if (format == MEMSIM_FORMAT_SNAPSHOT) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "%s: writing snapshots is not supported yet", path);
        return NULL;
    }
    FILE *f = g_fopen(path, "wb");
    if (!f) {
        int e = errno;
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: cannot create: %s", path,
                    g_strerror(e));
        return NULL;
    }
    return memsim_trace_writer_new_stream(f, TRUE, path, format, header, error);
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

gboolean memsim_trace_save(MemsimTrace *trace, const char *path, MemsimFormat format,
                           GError **error)
{
    MemsimTraceHeader *h = memsim_trace_header(trace);
    if (!output_format_known(path, &format, error))
        return FALSE;
    if (format == MEMSIM_FORMAT_SNAPSHOT) /* replayed, then written */
        return memsim_export_snapshot_trace(trace, path, NULL, error);
    MemsimTraceWriter *w = memsim_trace_writer_new(path, format, h, error);
    if (!w)
        return FALSE;
    for (guint32 r = 0; r < h->n_ranks; r++) {
        gsize n;
        const MemsimEvent *ev = memsim_trace_events(trace, r, &n);
        if (!memsim_trace_writer_write(w, r, ev, n, error)) {
            memsim_trace_writer_close(w, NULL);
            return FALSE;
        }
    }
    return memsim_trace_writer_close(w, error);
}

/* An error about the trace that names neither file (the replay behind a snapshot export
 * names the trace by its header's name, the file it once came from) gets the input's path
 * first. */
static gboolean names(const char *message, const char *path)
{
    gsize n = strlen(path);
    return strncmp(message, path, n) == 0 && message[n] == ':';
}

static void name_input(GError **error, const char *in, const char *out)
{
    if (error && *error && (*error)->domain == MEMSIM_ERROR &&
        (*error)->code == MEMSIM_ERROR_BAD_INPUT && !names((*error)->message, in) &&
        !names((*error)->message, out))
        g_prefix_error(error, "%s: ", in);
}

gboolean memsim_convert(const char *in, const char *out, GError **error)
{
    MemsimFormat format = MEMSIM_FORMAT_AUTO;
    if (!output_format_known(out, &format, error))
        return FALSE;
    if (format == MEMSIM_FORMAT_SNAPSHOT) { /* replayed, then written */
        if (memsim_export_snapshot(in, out, NULL, error))
            return TRUE;
        name_input(error, in, out);
        return FALSE;
    }
    MemsimTraceReader *r = memsim_trace_reader_open(in, error);
    if (!r)
        return FALSE;
    MemsimTraceWriter *w =
        memsim_trace_writer_new(out, format, memsim_trace_reader_header(r), error);
    if (!w) {
        memsim_trace_reader_free(r);
        return FALSE;
    }
    guint32 rank;
    const MemsimEvent *ev;
    gsize n;
    GError *local = NULL;
    gboolean ok = TRUE;
    while (ok && (n = memsim_trace_reader_next(r, &rank, &ev, &local)) > 0) {
        ok = memsim_trace_writer_update_header(w, memsim_trace_reader_header(r), &local) &&
             memsim_trace_writer_write(w, rank, ev, n, &local);
    }
    ok =
        ok && !local && memsim_trace_writer_update_header(w, memsim_trace_reader_header(r), &local);
    memsim_trace_reader_free(r);
    if (!ok) {
        memsim_trace_writer_close(w, NULL);
        g_unlink(out); /* no half-written output */
        g_propagate_error(error, local);
        return FALSE;
    }
    if (!memsim_trace_writer_close(w, error)) {
        g_unlink(out);
        return FALSE;
    }
    return TRUE;
}
