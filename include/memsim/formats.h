/* memsim — trace files: the .mst binary form, the line-based text form, PyTorch snapshots.
 *
 *     g_autoptr(GError) err = NULL;
 *     MemsimTraceReader *r = memsim_trace_reader_open("run.mst", &err);   // any format
 *     const MemsimEvent *ev; gsize n; guint32 rank;
 *     while ((n = memsim_trace_reader_next(r, &rank, &ev, &err)) > 0)
 *         ... consume n events of `rank` ...
 *     if (err) ... bad input ...
 *     memsim_trace_reader_free(r);
 *
 *     MemsimTraceWriter *w = memsim_trace_writer_new("out.mst", MEMSIM_FORMAT_AUTO, hdr, &err);
 *     memsim_trace_writer_write(w, rank, events, n, &err);
 *     memsim_trace_writer_close(w, &err);    // flushes, then frees
 *
 * Readers stream: memory depends on the chunk size, not on the trace length. The header is
 * read first; op and string tables may grow as chunks arrive, so re-read
 * memsim_trace_reader_header() after each call. All readers reject what they cannot read
 * with a MEMSIM_ERROR_BAD_INPUT whose message names the file and the record, line or byte
 * offset. The formats themselves are specified in formats/README.md.
 */
#ifndef MEMSIM_FORMATS_H
#define MEMSIM_FORMATS_H

#include <memsim/error.h>
#include <memsim/trace.h>

G_BEGIN_DECLS

typedef enum {
    MEMSIM_FORMAT_AUTO = 0, /* by content when reading, by file extension when writing */
    MEMSIM_FORMAT_MST,      /* .mst: zstd stream of length-delimited protobuf messages */
    MEMSIM_FORMAT_TEXT,     /* .txt / .mstt: one event a line */
    MEMSIM_FORMAT_SNAPSHOT, /* .pickle / .pkl: PyTorch memory snapshot (read only here) */
} MemsimFormat;

/* Guesses a format from a file name's extension; MEMSIM_FORMAT_AUTO if unknown. */
MEMSIM_API MemsimFormat memsim_format_from_path(const char *path);

typedef struct MemsimTraceReader MemsimTraceReader;

/* Opens a trace of any supported format (detected from the content). Returns NULL and sets
 * error on failure. Free with memsim_trace_reader_free(). */
MEMSIM_API MemsimTraceReader *memsim_trace_reader_open(const char *path, GError **error);
/* The same, keeping *bytes_read (may be NULL; read from another thread for a progress
 * display) at the bytes of the file read so far while a PyTorch snapshot — plain, .zst or
 * .gz, which is read whole when opened — is read; other formats are read as the reader
 * goes and leave it alone. */
MEMSIM_API MemsimTraceReader *memsim_trace_reader_open_counted(const char *path, guint64 *bytes_read,
                                                    GError **error);
/* The header; owned by the reader, may change after each memsim_trace_reader_next(). */
MEMSIM_API const MemsimTraceHeader *memsim_trace_reader_header(MemsimTraceReader *r);
/* Next run of events, all of one rank. Returns the number of events (> 0) and points *events
 * at them (owned by the reader, valid until the next call); 0 at the end or on error (error
 * set). */
MEMSIM_API gsize memsim_trace_reader_next(MemsimTraceReader *r, guint32 *rank, const MemsimEvent **events,
                               GError **error);
/* The format being read (never MEMSIM_FORMAT_AUTO). */
MEMSIM_API MemsimFormat memsim_trace_reader_format(MemsimTraceReader *r);
/* Closes the file and frees the reader, its header and its events (NULL is accepted). */
MEMSIM_API void memsim_trace_reader_free(MemsimTraceReader *r);

/* Reads a whole trace of any format into memory. Returns a new trace (memsim_trace_free)
 * or NULL with error set. */
MEMSIM_API MemsimTrace *memsim_trace_load(const char *path, GError **error);
/* The same, counting the bytes read as memsim_trace_reader_open_counted() does. */
MEMSIM_API MemsimTrace *memsim_trace_load_counted(const char *path, guint64 *bytes_read, GError **error);

typedef struct MemsimTraceWriter MemsimTraceWriter;

/* Creates `path` and writes the header. format AUTO picks by extension (.mst → binary, else
 * text). The header is copied. Returns NULL and sets error on failure. */
MEMSIM_API MemsimTraceWriter *memsim_trace_writer_new(const char *path, MemsimFormat format,
                                           const MemsimTraceHeader *header, GError **error);
/* Declares strings and ops added to the header since the last write (they are written before
 * the next events). `header` must extend the one given before. */
MEMSIM_API gboolean memsim_trace_writer_update_header(MemsimTraceWriter *w, const MemsimTraceHeader *header,
                                           GError **error);
/* Writes n events of `rank` (copied or encoded before it returns). FALSE with a
 * MEMSIM_ERROR_IO error when the file cannot be written; the writer must still be closed. */
MEMSIM_API gboolean memsim_trace_writer_write(MemsimTraceWriter *w, guint32 rank, const MemsimEvent *events,
                                   gsize n, GError **error);
/* Flushes and closes the file, then frees the writer (also on failure). */
MEMSIM_API gboolean memsim_trace_writer_close(MemsimTraceWriter *w, GError **error);

/* Writes a whole in-memory trace to `path` (format AUTO: by extension). FALSE with error
 * set when it cannot be written. */
MEMSIM_API gboolean memsim_trace_save(MemsimTrace *trace, const char *path, MemsimFormat format,
                           GError **error);

/* Converts the trace `in` (any readable format) into `out`, whose format follows its
 * extension (.pickle: the trace replayed through the torch policy, as a PyTorch snapshot;
 * memsim/export.h). FALSE with error set (naming the file and the record) on bad input or
 * when `out` cannot be written. */
MEMSIM_API gboolean memsim_convert(const char *in, const char *out, GError **error);

G_END_DECLS

#endif
