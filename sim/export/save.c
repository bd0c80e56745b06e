/* Saving and converting trace files (include/memsim/formats.h: memsim_trace_save,
 * memsim_convert). The trace formats are written by formats/; a PyTorch snapshot is what the
 * torch policy does with the trace, so it is replayed first (snapshot.c here).
 */
#include <memsim/export.h>
#include <memsim/formats.h>

#include <string.h>

#include <glib/gstdio.h>

#include "formats/formats-internal.h"

gboolean memsim_trace_save(MemsimTrace *trace, const char *path, MemsimFormat format,
                           GError **error)
{
    MemsimTraceHeader *h = memsim_trace_header(trace);
    if (!memsim_trace_output_format(path, &format, error))
        return FALSE;
    if (format == MEMSIM_FORMAT_SNAPSHOT) { /* replayed, then written */
        for (guint32 r = 0; r < h->n_ranks; r++)
            if (memsim_trace_spilled(trace, r, NULL)) {
                g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                            "%s: a snapshot is written from a trace held in memory; rank %u's "
                            "program went to a file (memsim_trace_spill_to)",
                            path, r);
                return FALSE;
            }
        return memsim_export_snapshot_trace(trace, path, NULL, error);
    }
    MemsimTraceWriter *w = memsim_trace_writer_new(path, format, h, error);
    if (!w)
        return FALSE;
    GError *spill_error = NULL;
    for (guint32 r = 0; r < h->n_ranks; r++) {
        const char *spilled = memsim_trace_spilled(trace, r, &spill_error);
        if (spill_error) {
            g_propagate_error(error, spill_error);
            memsim_trace_writer_close(w, NULL);
            return FALSE;
        }
        if (spilled) { /* streamed back from its own file, a chunk at a time */
            MemsimTraceReader *rd = memsim_trace_reader_open(spilled, error);
            gboolean ok = rd != NULL;
            guint32 rank;
            const MemsimEvent *ev;
            gsize n;
            GError *e = NULL;
            while (ok && (n = memsim_trace_reader_next(rd, &rank, &ev, &e)) > 0)
                ok = memsim_trace_writer_write(w, r, ev, n, &e);
            if (ok && e)
                ok = FALSE;
            if (e)
                g_propagate_error(error, e);
            memsim_trace_reader_free(rd);
            if (!ok) {
                memsim_trace_writer_close(w, NULL);
                return FALSE;
            }
            continue;
        }
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
    if (!memsim_trace_output_format(out, &format, error))
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
