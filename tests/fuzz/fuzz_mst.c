/* libFuzzer target: the .mst reader (formats/mst_read.c) on arbitrary bytes, and the round
 * trips of what it accepts (fuzz_trace.h).
 *
 *     tests/fuzz/run-fuzzer.sh mst 600
 */
#include "fuzz_trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_trace(data, size, "fuzz.mst", MEMSIM_FORMAT_MST);
    return 0;
}
