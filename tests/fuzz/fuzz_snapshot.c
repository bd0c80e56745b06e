/* libFuzzer target: the streaming snapshot reader (formats/snapshot_stream.c: the pickle
 * opcodes, the fast path of trace entries, the records, the starting state) and the replay
 * behind it, on arbitrary bytes.
 *
 *     tests/fuzz/run-fuzzer.sh snapshot 600
 *
 * Each input either gives a trace, which is then replayed under --verify (warnings,
 * inconsistencies, a recorded OOM at its capacity included), or is refused with a
 * MEMSIM_ERROR_BAD_INPUT / MEMSIM_ERROR_UNSUPPORTED naming the input. Anything else aborts,
 * so that libFuzzer records the input; AddressSanitizer, UBSan and LeakSanitizer catch the
 * rest. (fuzz_pickle covers pickle.c, the reference reader's tree.)
 */
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
