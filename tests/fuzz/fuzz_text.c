/* libFuzzer target: the text trace reader (formats/text_read.c) on arbitrary bytes, and the
 * round trips of what it accepts (fuzz_trace.h).
 *
 *     tests/fuzz/run-fuzzer.sh text 600
 */
#include "fuzz_trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_trace(data, size, "fuzz.txt", MEMSIM_FORMAT_TEXT);
    return 0;
}
