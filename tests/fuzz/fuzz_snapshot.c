/* libFuzzer target: the streaming snapshot reader (formats/snapshot_stream.c: the pickle
 * opcodes, the fast path of trace entries, the records, the starting state) and the replay
 * behind it, on arbitrary bytes; and the reference reader (pickle.c's tree read by
 * snapshot.c) beside it: where both read an input, they must give the same trace.
 *
 *     tests/fuzz/run-fuzzer.sh snapshot 600
 *
 * Each input either gives a trace, which is then replayed under --verify (warnings,
 * inconsistencies, a recorded OOM at its capacity included), or is refused with a
 * MEMSIM_ERROR_BAD_INPUT / MEMSIM_ERROR_UNSUPPORTED naming the input. Anything else aborts,
 * so that libFuzzer records the input; AddressSanitizer, UBSan and LeakSanitizer catch the
 * rest. (fuzz_pickle covers pickle.c, the reference reader's tree.)
 */
#include "formats/pickle.h"
#include "formats/snapshot.h"

#include <memsim/error.h>
#include <memsim/sim.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The reference reader's trace equals the streaming one's (header, warnings, events). */
static void same_as_reference(const uint8_t *data, size_t size, MemsimTrace *b)
{
    GError *err = NULL;
    MemsimPyDoc *doc = memsim_pickle_load(data, size, "fuzz", &err);
    MemsimTrace *a = doc ? memsim_snapshot_from_pickle(doc, "fuzz", &err) : NULL;
    memsim_pickle_free(doc);
    g_clear_error(&err);
    if (!a)
        return; /* the readers may differ on what they refuse */
    MemsimTraceHeader *x = memsim_trace_header(a), *y = memsim_trace_header(b);
    if (x->n_ranks != y->n_ranks || x->n_strings != y->n_strings ||
        g_strcmp0(x->alloc_conf, y->alloc_conf) != 0)
        abort();
    for (guint32 i = 0; i < x->n_strings; i++)
        if (strcmp(x->strings[i], y->strings[i]) != 0)
            abort();
    guint nw = x->warnings ? g_strv_length(x->warnings) : 0;
    if (nw != (y->warnings ? g_strv_length(y->warnings) : 0))
        abort();
    for (guint i = 0; i < nw; i++)
        if (strcmp(x->warnings[i], y->warnings[i]) != 0)
            abort();
    for (guint32 r = 0; r < x->n_ranks; r++) {
        const MemsimRankInfo *p = &x->ranks[r], *q = &y->ranks[r];
        if (p->device != q->device || p->n_streams != q->n_streams ||
            p->capacity != q->capacity || p->n_inconsistent != q->n_inconsistent ||
            p->final_reserved != q->final_reserved || p->final_allocated != q->final_allocated)
            abort();
        gsize n, m;
        const MemsimEvent *e = memsim_trace_events(a, r, &n), *f = memsim_trace_events(b, r, &m);
        if (n != m)
            abort();
        for (gsize i = 0; i < n; i++)
            if (e[i].kind != f[i].kind || e[i].id != f[i].id || e[i].size != f[i].size ||
                e[i].addr != f[i].addr || e[i].aux != f[i].aux || e[i].stream != f[i].stream ||
                e[i].flags != f[i].flags || e[i].category != f[i].category)
                abort();
    }
    memsim_trace_free(a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    GError *err = NULL;
    MemsimTrace *t = memsim_snapshot_read_bytes(data, size, "fuzz", &err);
    if (!t) {
        if (!err || err->domain != MEMSIM_ERROR ||
            (err->code != MEMSIM_ERROR_BAD_INPUT && err->code != MEMSIM_ERROR_UNSUPPORTED) ||
            !g_str_has_prefix(err->message, "fuzz: "))
            abort();
        g_error_free(err);
        return 0;
    }
    for (char **w = memsim_trace_header(t)->warnings; w && *w; w++)
        if (!g_str_has_prefix(*w, "fuzz: "))
            abort();
    same_as_reference(data, size, t);
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.verify = TRUE;
    MemsimReport *rep = memsim_replay_trace(t, &o, &err);
    if (rep)
        memsim_report_free(rep);
    else
        g_clear_error(&err); /* an inconsistent program is refused, never a crash */
    memsim_trace_free(t);
    return 0;
}
