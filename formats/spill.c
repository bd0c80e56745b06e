/* A trace whose ranks' programs go to files of their own once complete
 * (include/memsim/trace.h: memsim_trace_spill_to), so that a trace of many ranks holds one
 * rank's events at a time: `memsim gen` of a large run. memsim_trace_save streams them back.
 */
#include <memsim/formats.h>
#include <memsim/trace.h>

#include <glib/gstdio.h>

#include "formats/formats-internal.h"

typedef struct {
    char *dir;
    GPtrArray *paths; /* per rank: its file, or NULL */
    GError *error;    /* the first failure to write one */
} Spill;

static void spill_free(void *p)
{
    Spill *s = p;
    for (guint i = 0; i < s->paths->len; i++)
        if (s->paths->pdata[i])
            g_unlink(s->paths->pdata[i]);
    g_ptr_array_unref(s->paths);
    g_clear_error(&s->error);
    g_free(s->dir);
    g_free(s);
}

/* A rank's whole program into its own .mst (the trace's header so far, with that rank alone);
 * FALSE when it could not be written: the events stay in memory then. */
static gboolean spill_rank(MemsimTrace *t, guint32 rank, GArray *events, void *user)
{
    Spill *s = user;
    if (s->error || (rank < s->paths->len && s->paths->pdata[rank]))
        return FALSE;
    char *path = g_strdup_printf("%s/rank-%u.mst", s->dir, rank);
    MemsimTraceHeader h;
    memsim_trace_header_copy(&h, memsim_trace_header(t));
    for (guint32 i = 0; i < h.n_ranks; i++)
        if (i != rank) {
            g_free(h.ranks[i].role);
            g_free(h.ranks[i].stream_handles);
        }
    h.ranks[0] = h.ranks[rank];
    h.n_ranks = 1;
    GError *e = NULL;
    MemsimTraceWriter *w = memsim_trace_writer_new(path, MEMSIM_FORMAT_MST, &h, &e);
    gboolean ok = w && memsim_trace_writer_write(w, 0, (const MemsimEvent *)events->data,
                                                 events->len, &e);
    if (w)
        ok = memsim_trace_writer_close(w, ok ? &e : NULL) && ok;
    memsim_trace_header_clear(&h);
    if (!ok) {
        s->error = e;
        g_unlink(path);
        g_free(path);
        return FALSE;
    }
    if (s->paths->len <= rank)
        g_ptr_array_set_size(s->paths, rank + 1);
    s->paths->pdata[rank] = path;
    return TRUE;
}

void memsim_trace_spill_to(MemsimTrace *trace, const char *dir)
{
    Spill *s = g_new0(Spill, 1);
    s->dir = g_strdup(dir);
    s->paths = g_ptr_array_new_with_free_func(g_free);
    memsim_trace_set_sink(trace, spill_rank, s, spill_free);
}

const char *memsim_trace_spilled(MemsimTrace *trace, guint32 rank, GError **error)
{
    Spill *s = memsim_trace_sink_user(trace);
    if (!s)
        return NULL;
    if (s->error) {
        if (error)
            *error = g_error_copy(s->error);
        return NULL;
    }
    return rank < s->paths->len ? s->paths->pdata[rank] : NULL;
}
