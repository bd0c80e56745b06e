/* Shared by the libFuzzer targets of the trace formats (fuzz_mst.c, fuzz_text.c).
 *
 * An input must either be refused with a MEMSIM_ERROR_BAD_INPUT naming the input ("fuzz.mst:
 * ..." / "fuzz.txt:LINE: ...") or be read to its end. A trace that is read must then survive
 * the round trips: written in the other format and read back it gives the same header and
 * the same events in the same order, and canonical text written twice is the same bytes;
 * replayed through torch it gives a report or a bad-input error.
 * Anything else aborts, so that libFuzzer records the input; ASan, UBSan and LeakSanitizer
 * catch the rest.
 */
#ifndef MEMSIM_FUZZ_TRACE_H
#define MEMSIM_FUZZ_TRACE_H

#include "formats/formats-internal.h"

#include <memsim/sim.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Round trips only for traces up to this many events (a small input may decompress to a
 * long trace; reading it is still checked). */
#define FUZZ_MAX_EVENTS 100000

typedef struct {
    GArray *events; /* MemsimEvent */
    GArray *ranks;  /* guint32 per event */
    MemsimTraceHeader header;
    char *out; /* what the writer wrote */
    size_t out_len;
} Pumped;

static void pumped_clear(Pumped *p)
{
    if (p->events)
        g_array_unref(p->events);
    if (p->ranks)
        g_array_unref(p->ranks);
    memsim_trace_header_clear(&p->header);
    free(p->out);
    memset(p, 0, sizeof *p);
}

static MemsimTraceReader *fuzz_open(const char *data, size_t len, const char *name,
                                    MemsimFormat format, GError **error)
{
    MemsimSource src;
    memsim_source_init_memory(&src, (const guint8 *)data, len);
    return memsim_trace_reader_open_source(&src, name, format, error);
}

/* Reads r to its end, writing what it reads to an `out` writer in memory (unless out is
 * AUTO) and keeping the events. Frees r. FALSE with *error on bad input. */
static gboolean pump(MemsimTraceReader *r, MemsimFormat out, Pumped *p, GError **error)
{
    memset(p, 0, sizeof *p);
    p->events = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
    p->ranks = g_array_new(FALSE, FALSE, sizeof(guint32));
    MemsimTraceWriter *w = NULL;
    FILE *f = NULL;
    if (out != MEMSIM_FORMAT_AUTO) {
        f = open_memstream(&p->out, &p->out_len);
        GError *werr = NULL;
        w = memsim_trace_writer_new_stream(f, TRUE, "roundtrip", out, memsim_trace_reader_header(r),
                                           &werr);
        if (!w) /* a header a reader accepted must be writable */
            abort();
    }
    guint32 rank;
    const MemsimEvent *ev;
    gsize n;
    GError *local = NULL;
    while ((n = memsim_trace_reader_next(r, &rank, &ev, &local)) > 0) {
        if (p->events->len + n <= FUZZ_MAX_EVENTS) {
            g_array_append_vals(p->events, ev, (guint)n);
            for (gsize i = 0; i < n; i++)
                g_array_append_val(p->ranks, rank);
        }
        if (w && (!memsim_trace_writer_update_header(w, memsim_trace_reader_header(r), NULL) ||
                  !memsim_trace_writer_write(w, rank, ev, n, NULL)))
            abort(); /* events a reader accepted must be writable */
    }
    if (!local)
        memsim_trace_header_copy(&p->header, memsim_trace_reader_header(r));
    if (w) {
        if (!local && !memsim_trace_writer_update_header(w, memsim_trace_reader_header(r), NULL))
            abort();
        if (!memsim_trace_writer_close(w, NULL) && !local)
            abort();
    }
    memsim_trace_reader_free(r);
    if (local) {
        g_propagate_error(error, local);
        return FALSE;
    }
    return TRUE;
}

static void check_error(GError *err, const char *name)
{
    if (!err || err->domain != MEMSIM_ERROR || err->code != MEMSIM_ERROR_BAD_INPUT ||
        !g_str_has_prefix(err->message, name))
        abort();
    g_error_free(err);
}

static void same_header(const MemsimTraceHeader *a, const MemsimTraceHeader *b)
{
    if (strcmp(a->name, b->name) || (!a->alloc_conf != !b->alloc_conf) ||
        (a->alloc_conf && strcmp(a->alloc_conf, b->alloc_conf)) || a->capacity != b->capacity ||
        a->n_ranks != b->n_ranks || a->n_strings != b->n_strings || a->n_ops != b->n_ops)
        abort();
    for (guint32 i = 0; i < a->n_ranks; i++) {
        const MemsimRankInfo *x = &a->ranks[i], *y = &b->ranks[i];
        if (x->device != y->device || x->multiplicity != y->multiplicity ||
            x->n_streams != y->n_streams || !x->role != !y->role ||
            (x->role && strcmp(x->role, y->role)) || !x->stream_handles != !y->stream_handles ||
            (x->stream_handles &&
             memcmp(x->stream_handles, y->stream_handles, sizeof(uint64_t) * x->n_streams)) ||
            !x->has_final != !y->has_final || x->final_reserved != y->final_reserved ||
            x->final_allocated != y->final_allocated)
            abort();
    }
    for (guint32 i = 0; i < a->n_strings; i++)
        if (strcmp(a->strings[i], b->strings[i]))
            abort();
    for (guint32 i = 0; i < a->n_ops; i++) {
        const MemsimOpInfo *x = &a->ops[i], *y = &b->ops[i];
        if (x->name != y->name || x->phase != y->phase || x->layer != y->layer ||
            x->microbatch != y->microbatch || memcmp(&x->duration_us, &y->duration_us, 8))
            abort();
    }
}

static void same_events(const Pumped *a, const Pumped *b)
{
    if (a->events->len != b->events->len)
        abort();
    if (a->events->len &&
        (memcmp(a->events->data, b->events->data, a->events->len * sizeof(MemsimEvent)) ||
         memcmp(a->ranks->data, b->ranks->data, a->ranks->len * sizeof(guint32))))
        abort();
}

/* A replay may run for at most this many events, repetitions counted (a REPEAT of 2^40
 * repetitions is a valid trace that takes that long). */
#define FUZZ_MAX_REPLAYED 2000000

/* Replays an accepted trace through torch: it ends with a report or refuses the trace as bad
 * input (an inconsistency the reader cannot see: a free of a tensor never allocated, a repeat
 * whose step would pass 2^32 − 1); nothing else. */
static void replay_pumped(const Pumped *p)
{
    double total = 0;
    for (guint i = 0; i < p->events->len; i++) {
        const MemsimEvent *e = &g_array_index(p->events, MemsimEvent, i);
        total += e->kind == MEMSIM_EV_REPEAT && e->aux > 0 ? (double)e->aux * (double)e->size : 1;
    }
    if (total > FUZZ_MAX_REPLAYED)
        return;
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.threads = 1;
    GError *err = NULL;
    MemsimReplay *rp = memsim_replay_new(&p->header, &o, &err);
    if (!rp) {
        if (!err || err->domain != MEMSIM_ERROR || err->code != MEMSIM_ERROR_BAD_INPUT)
            abort();
        g_error_free(err);
        return;
    }
    const MemsimEvent *ev = (const MemsimEvent *)(void *)p->events->data;
    const guint32 *rk = (const guint32 *)(void *)p->ranks->data;
    gboolean ok = TRUE;
    for (guint i = 0; i < p->events->len && ok;) {
        guint j = i;
        while (j < p->events->len && rk[j] == rk[i])
            j++;
        ok = memsim_replay_feed(rp, &p->header, rk[i], ev + i, j - i, &err);
        i = j;
    }
    if (ok)
        ok = memsim_replay_drain(rp, &p->header, &err);
    if (!ok) {
        if (!err || err->domain != MEMSIM_ERROR || err->code != MEMSIM_ERROR_BAD_INPUT)
            abort();
        g_error_free(err);
        memsim_replay_abort(rp);
        return;
    }
    memsim_report_free(memsim_replay_finish(rp));
}

/* Reads the input in `format`; when accepted, checks the round trips through the other
 * format and replays it. */
static void fuzz_trace(const uint8_t *data, size_t size, const char *name, MemsimFormat format)
{
    const MemsimFormat other = format == MEMSIM_FORMAT_MST ? MEMSIM_FORMAT_TEXT : MEMSIM_FORMAT_MST;
    GError *err = NULL;
    MemsimTraceReader *r = fuzz_open((const char *)data, size, name, format, &err);
    if (!r) {
        check_error(err, name);
        return;
    }
    Pumped p0, p1, p2, p3;
    if (!pump(r, other, &p0, &err)) {
        check_error(err, name);
        pumped_clear(&p0);
        return;
    }
    if (p0.events->len >= FUZZ_MAX_EVENTS) {
        pumped_clear(&p0);
        return;
    }
    /* input → other format → this format → other format: the same trace each time, and
     * for text the same bytes. */
    r = fuzz_open(p0.out, p0.out_len, "roundtrip", other, NULL);
    if (!r || !pump(r, format, &p1, NULL))
        abort();
    same_header(&p0.header, &p1.header);
    same_events(&p0, &p1);
    r = fuzz_open(p1.out, p1.out_len, "roundtrip", format, NULL);
    if (!r || !pump(r, MEMSIM_FORMAT_TEXT, &p2, NULL))
        abort();
    same_header(&p0.header, &p2.header);
    same_events(&p0, &p2);
    const Pumped *text = format == MEMSIM_FORMAT_MST ? &p0 : &p1;
    r = fuzz_open(text->out, text->out_len, "roundtrip", MEMSIM_FORMAT_TEXT, NULL);
    if (!r || !pump(r, MEMSIM_FORMAT_TEXT, &p3, NULL))
        abort();
    if (p3.out_len != text->out_len || (p3.out_len && memcmp(p3.out, text->out, p3.out_len)))
        abort(); /* canonical text is a fixed point */
    replay_pumped(&p0);
    pumped_clear(&p0);
    pumped_clear(&p1);
    pumped_clear(&p2);
    pumped_clear(&p3);
}

#endif
