/* Trace files in general (include/memsim/formats.h): format detection, opening a reader on
 * any file, the in-memory trace as a reader, loading a whole trace, and writers chosen by
 * format or extension.
 *
 * The formats themselves live in mst_*.c and text_*.c, on the shared base of stream.c; PyTorch
 * snapshots are imported whole by snapshot.c and then read through the in-memory reader
 * defined here. Saving a trace as a snapshot replays it, so that lives with the replay
 * (sim/export/save.c).
 */
#include "formats/formats-internal.h"
#include "formats/snapshot.h"

#include <errno.h>
#include <string.h>

#include <glib/gstdio.h>

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
    return memsim_trace_reader_open_counted(path, NULL, error);
}

static gboolean is_gzip(const guint8 *p, gsize n)
{
    return n >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

MemsimTraceReader *memsim_trace_reader_open_counted(const char *path, guint64 *bytes_read,
                                                    GError **error)
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
    /* A snapshot by its first bytes, also compressed (zstd, like .mst, or gzip): then by the
     * first bytes inside. */
    if (n > 0 && ((!is_zstd(head, n) && !is_text(head, n) && memsim_snapshot_sniff(head, n)) ||
                  ((is_zstd(head, n) || is_gzip(head, n)) && memsim_snapshot_sniff_path(path)))) {
        memsim_source_clear(&src);
        MemsimSnapshotReadOptions o = {.bytes_read = bytes_read};
        return memsim_snapshot_reader(path, &o, error);
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
            if (!memsim_events_check_named(&base->header, base->name, r->rank, r->pos,
                                           ev + r->pos, m, error))
                return 0;
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
    return memsim_trace_load_counted(path, NULL, error);
}

MemsimTrace *memsim_trace_load_counted(const char *path, guint64 *bytes_read, GError **error)
{
    MemsimTraceReader *r = memsim_trace_reader_open_counted(path, bytes_read, error);
    if (!r)
        return NULL;
    MemsimTrace *t = r->format == MEMSIM_FORMAT_SNAPSHOT ? memsim_snapshot_reader_take(r) : NULL;
    if (t) {
        /* Read whole already: each rank's events made at once, not chunk by chunk. */
        gboolean ok = TRUE;
        for (guint32 k = 0; k < r->header.n_ranks && ok; k++) {
            gsize n;
            const MemsimEvent *ev = memsim_trace_events(t, k, &n);
            ok = memsim_events_check_named(&r->header, path, k, 0, ev, n, error);
        }
        memsim_trace_reader_free(r);
        if (!ok) {
            memsim_trace_free(t);
            return NULL;
        }
        return t;
    }
    const MemsimTraceHeader *src = memsim_trace_reader_header(r);
    t = memsim_trace_new(src->name);
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
        d->capacity = s->capacity;
        d->n_inconsistent = s->n_inconsistent;
    }
    h->warnings = g_strdupv(src->warnings);
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

gboolean memsim_trace_output_format(const char *path, MemsimFormat *format, GError **error)
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

