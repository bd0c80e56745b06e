/* libFuzzer target: the snapshot importer (formats/snapshot.c) and the replay behind it, on
 * arbitrary bytes.
 *
 *     tests/fuzz/run-fuzzer.sh snapshot 600
 *
 * Each input that the restricted pickle reader accepts is imported as a PyTorch memory
 * snapshot; an import either gives a trace, which is then replayed under --verify (warnings,
 * inconsistencies, a recorded OOM at its capacity included), or is refused with a
 * MEMSIM_ERROR_BAD_INPUT / MEMSIM_ERROR_UNSUPPORTED naming the input. Anything else aborts,
 * so that libFuzzer records the input; AddressSanitizer, UBSan and LeakSanitizer catch the
 * rest.
 */
#include "formats/pickle.h"
#include "formats/snapshot.h"

#include <memsim/error.h>
#include <memsim/sim.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    GError *err = NULL;
    MemsimPyDoc *doc = memsim_pickle_load(data, size, "fuzz", &err);
    if (!doc) {
        g_clear_error(&err);
        return 0;
    }
    MemsimTrace *t = memsim_snapshot_from_pickle(doc, "fuzz", &err);
    memsim_pickle_free(doc);
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
