/* Internal: what the trace formats share (formats/stream.c, mst_*.c, text_*.c, reader.c).
 *
 * A reader or writer is a small base struct followed by its format's state; the base holds
 * the display name used in messages, the header and a table of the format's operations.
 * stream.c keeps the base and the checks that every format applies to headers and events, so
 * that a trace that one format accepts the others accept too; reader.c detects formats and
 * opens files (include/memsim/formats.h).
 *
 *     MemsimSource src;
 *     memsim_source_init_memory(&src, data, len);          // or _init_file
 *     MemsimTraceReader *r = memsim_trace_reader_open_source(&src, "fuzz.mst",
 *                                                            MEMSIM_FORMAT_AUTO, &err);
 *
 * formats/, sim/export/save.c, the tests and the fuzzers include this header.
 */
#ifndef MEMSIM_FORMATS_INTERNAL_H
#define MEMSIM_FORMATS_INTERNAL_H

#include <memsim/formats.h>

#include <stdio.h>

/* Events per chunk the writers aim for, and the most a reader accepts in one chunk (a bound
 * on reader memory: about 40 bytes per event plus the chunk's encoded bytes). */
#define MEMSIM_CHUNK_EVENTS 16384
#define MEMSIM_MAX_CHUNK_EVENTS (1u << 20)
/* Streams per rank: stream indices are uint16_t. */
#define MEMSIM_MAX_STREAMS 65536u
/* Table sizes readers accept (and writers write): far above real traces, low enough that a
 * small hostile file cannot make a reader allocate gigabytes. */
#define MEMSIM_MAX_RANKS 65536u
#define MEMSIM_MAX_STRINGS (1u << 22)
#define MEMSIM_MAX_OPS (1u << 22)

/* A byte source: a file or a memory buffer (not owned). */
typedef struct {
    FILE *file; /* owned: closed by memsim_source_clear() */
    const guint8 *data;
    gsize len, pos;
    guint64 consumed; /* bytes returned so far, for messages */
    guint8 head[16];  /* bytes peeked at by format detection, returned first */
    gsize head_len, head_pos;
} MemsimSource;

void memsim_source_init_memory(MemsimSource *s, const guint8 *data, gsize len);
/* Takes ownership of `file`. */
void memsim_source_init_file(MemsimSource *s, FILE *file);
/* Reads up to `cap` bytes; returns how many (0 at the end). FALSE with error on a read
 * error. */
gboolean memsim_source_read(MemsimSource *s, void *buf, gsize cap, gsize *got, const char *name,
                            GError **error);
/* Reads the first bytes ahead (up to 16) without consuming them; *head points at them. */
gboolean memsim_source_peek(MemsimSource *s, const guint8 **head, gsize *len, const char *name,
                            GError **error);
void memsim_source_clear(MemsimSource *s);

typedef struct {
    gsize (*next)(MemsimTraceReader *r, guint32 *rank, const MemsimEvent **events, GError **error);
    void (*clear)(MemsimTraceReader *r);         /* frees the format's state, not the base */
    gsize (*buffer_bytes)(MemsimTraceReader *r); /* bytes held for the current chunk */
} MemsimReaderOps;

struct MemsimTraceReader {
    const MemsimReaderOps *ops;
    MemsimFormat format;
    char *name; /* file name for messages */
    MemsimTraceHeader header;
    MemsimSource src;
    GError *failure; /* the first error, repeated by later calls */
    gboolean done;
};

typedef struct {
    gboolean (*write)(MemsimTraceWriter *w, guint32 rank, const MemsimEvent *events, gsize n,
                      GError **error);
    gboolean (*finish)(MemsimTraceWriter *w, GError **error); /* flush everything */
    void (*clear)(MemsimTraceWriter *w);                      /* frees the format's state */
} MemsimWriterOps;

struct MemsimTraceWriter {
    const MemsimWriterOps *ops;
    MemsimFormat format;
    char *name; /* file name for messages */
    FILE *file; /* owned when close_file */
    gboolean close_file;
    /* The header as declared so far; the file holds the first `written_strings` strings and
     * `written_ops` ops (once `header_written`). */
    MemsimTraceHeader header;
    gboolean header_written;
    guint32 written_strings, written_ops;
    guint64 n_events; /* events written so far, for messages */
    gboolean failed;
};

/* Opens a reader on a source (taken over, also on failure). format AUTO detects it from the
 * first bytes; snapshots cannot be read from a source. */
MemsimTraceReader *memsim_trace_reader_open_source(MemsimSource *src, const char *name,
                                                   MemsimFormat format, GError **error);
/* A reader over an in-memory trace, rank by rank in runs of MEMSIM_CHUNK_EVENTS; takes the
 * trace over when `owned`. */
MemsimTraceReader *memsim_trace_reader_new_for_trace(MemsimTrace *trace, gboolean owned,
                                                     const char *name, MemsimFormat format);
/* Bytes the reader holds for the chunk being read (event buffer, decoded and undecoded
 * bytes): bounded by the chunk size, whatever the trace length. */
gsize memsim_trace_reader_buffer_bytes(MemsimTraceReader *r);

/* A writer to an open stream (format MST or TEXT); closes `file` on close when close_file.
 */
MemsimTraceWriter *memsim_trace_writer_new_stream(FILE *file, gboolean close_file, const char *name,
                                                  MemsimFormat format,
                                                  const MemsimTraceHeader *header, GError **error);

/* Format implementations (mst_read.c, mst_write.c, text_read.c, text_write.c). A reader
 * takes the source over (also on failure), reads the header and returns NULL with error set
 * on bad input. */
MemsimTraceReader *memsim_mst_reader_new(MemsimSource *src, const char *name, GError **error);
MemsimTraceReader *memsim_text_reader_new(MemsimSource *src, const char *name, GError **error);
MemsimTraceWriter *memsim_mst_writer_new(FILE *file, gboolean close_file, const char *name,
                                         const MemsimTraceHeader *header, GError **error);
MemsimTraceWriter *memsim_text_writer_new(FILE *file, gboolean close_file, const char *name,
                                          const MemsimTraceHeader *header, GError **error);

/* For the implementations: a zeroed struct of `size` bytes whose first member is the base,
 * set up (the source is taken over; the header is copied). */
MemsimTraceReader *memsim_trace_reader_alloc(gsize size, const MemsimReaderOps *ops,
                                             MemsimFormat format, MemsimSource *src,
                                             const char *name);
MemsimTraceWriter *memsim_trace_writer_alloc(gsize size, const MemsimWriterOps *ops,
                                             MemsimFormat format, FILE *file, gboolean close_file,
                                             const char *name, const MemsimTraceHeader *header);

/* Checks shared by all formats. They return NULL when fine, else a newly allocated
 * description of what is wrong ("stream 3 is not below the rank's 2 streams"). */
char *memsim_rank_check(const MemsimRankInfo *rank);
/* Ops from `first_op` on, against the header's strings. */
char *memsim_ops_check(const MemsimTraceHeader *h, guint32 first_op);
char *memsim_header_check(const MemsimTraceHeader *h);
/* The kinds whose fields are checked beyond kind, stream and category. */
#define MEMSIM_KINDS_CHECKED                                                                       \
    ((1u << MEMSIM_EV_WAIT) | (1u << MEMSIM_EV_OP) | (1u << MEMSIM_EV_MARK) |                      \
     (1u << MEMSIM_EV_COLLECTIVE) | (1u << MEMSIM_EV_SEG_ALLOC) | (1u << MEMSIM_EV_SEG_FREE) |     \
     (1u << MEMSIM_EV_SEG_MAP) | (1u << MEMSIM_EV_SEG_UNMAP) | (1u << MEMSIM_EV_INIT_SEGMENT) |    \
     (1u << MEMSIM_EV_INIT_BLOCK))

/* The test of memsim_events_check for one event, without the message: for decoders' inner
 * loops. */
static inline gboolean memsim_event_ok(const MemsimTraceHeader *h, uint32_t n_streams,
                                       const MemsimEvent *e)
{
    if ((unsigned)e->kind - 1u >= MEMSIM_EV_KIND_MAX || e->stream >= n_streams ||
        e->category >= MEMSIM_CAT_COUNT)
        return FALSE;
    if (!((1u << e->kind) & MEMSIM_KINDS_CHECKED))
        return TRUE;
    switch (e->kind) {
    case MEMSIM_EV_WAIT:
        return e->id < n_streams;
    case MEMSIM_EV_OP:
        return e->id < h->n_ops;
    case MEMSIM_EV_MARK:
        return e->id < h->n_strings;
    case MEMSIM_EV_COLLECTIVE:
        return e->aux < MEMSIM_COLL_COUNT;
    case MEMSIM_EV_INIT_BLOCK:
        return e->addr + e->aux >= e->addr;
    default: /* segments */
        return e->addr + e->size >= e->addr;
    }
}

/* Events of `rank` (< h->n_ranks); sets *bad to the index of the first bad one. */
char *memsim_events_check(const MemsimTraceHeader *h, guint32 rank, const MemsimEvent *events,
                          gsize n, gsize *bad);
/* The same as an error (MEMSIM_ERROR_BAD_INPUT) naming `name`, the rank and the bad event's
 * index in the rank's program (`at`: that of events[0]); FALSE when one is bad. */
gboolean memsim_events_check_named(const MemsimTraceHeader *h, const char *name, guint32 rank,
                                   gsize at, const MemsimEvent *events, gsize n, GError **error);

/* Header growth: appends strings / ops (copies). */
void memsim_header_append_string(MemsimTraceHeader *h, const char *s, gsize len);
void memsim_header_append_op(MemsimTraceHeader *h, const MemsimOpInfo *op);

/* The format memsim_trace_save and memsim_convert write: `format`, or with AUTO the one the
 * extension names; an unknown extension is refused rather than written as text. */
gboolean memsim_trace_output_format(const char *path, MemsimFormat *format, GError **error);

/* Where a rank's whole program handed over at once (memsim_trace_append_array to an empty
 * program) goes instead of memory: TRUE when the sink took it (the trace then drops the
 * events). The trace frees `user` with `destroy`. (formats/spill.c: memsim_trace_spill_to) */
typedef gboolean (*MemsimTraceSink)(MemsimTrace *t, guint32 rank, GArray *events, void *user);
void memsim_trace_set_sink(MemsimTrace *t, MemsimTraceSink sink, void *user,
                           GDestroyNotify destroy);
void *memsim_trace_sink_user(MemsimTrace *t);

/* Sets a MEMSIM_ERROR_BAD_INPUT error. */
void memsim_set_bad_input(GError **error, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

#endif
