/* libFuzzer target: the restricted pickle reader (formats/pickle.c) on arbitrary bytes.
 *
 *     tests/fuzz/run-fuzzer.sh pickle 600
 *
 * Each input must either load, giving a tree that a recursive consumer can walk (no cycle,
 * bounded depth, NUL-terminated strings), or be refused with a MEMSIM_ERROR_BAD_INPUT
 * naming the byte offset. Anything else aborts, so that libFuzzer records the input;
 * AddressSanitizer, UBSan and LeakSanitizer catch the rest.
 */
#include "formats/pickle.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Recursion is the point: consumers recurse, and the reader promises depth <= 10000. */
static size_t walk(const MemsimPyValue *v, unsigned depth)
{
    if (depth > 10000)
        abort();
    size_t n = 1;
    switch (v->type) {
    case MEMSIM_PY_LIST:
    case MEMSIM_PY_TUPLE:
        for (gsize i = 0; i < v->v.seq.n; i++)
            n += walk(v->v.seq.items[i], depth + 1);
        break;
    case MEMSIM_PY_DICT:
        for (gsize i = 0; i < v->v.dict.n; i++)
            n += walk(v->v.dict.keys[i], depth + 1) + walk(v->v.dict.values[i], depth + 1);
        break;
    case MEMSIM_PY_STR:
    case MEMSIM_PY_BYTES:
        /* Touch every byte, so that a bad length is an out-of-bounds read. */
        if (strlen(v->v.str.data) > v->v.str.len || v->v.str.data[v->v.str.len] != '\0')
            abort();
        break;
    case MEMSIM_PY_NONE:
    case MEMSIM_PY_BOOL:
    case MEMSIM_PY_INT:
    case MEMSIM_PY_BIGINT:
    case MEMSIM_PY_FLOAT:
        break;
    default:
        abort();
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    GError *err = NULL;
    MemsimPyDoc *doc = memsim_pickle_load(data, size, "fuzz", &err);
    if (doc) {
        if (err)
            abort();
        const MemsimPyValue *root = memsim_pickle_root(doc);
        if (walk(root, 1) == 0)
            abort();
        /* What the snapshot importer asks first. */
        (void)memsim_py_dict_get(root, "segments");
        (void)memsim_py_dict_get(root, "device_traces");
        memsim_pickle_free(doc);
        return 0;
    }
    if (!err || err->domain != MEMSIM_ERROR || err->code != MEMSIM_ERROR_BAD_INPUT ||
        !g_str_has_prefix(err->message, "fuzz: byte "))
        abort();
    g_error_free(err);
    return 0;
}
