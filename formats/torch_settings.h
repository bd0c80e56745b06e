/* Internal: PyTorch's CUDA caching allocator settings (PYTORCH_CUDA_ALLOC_CONF, as a trace
 * or a snapshot records them): the parser and the rounding of a request they imply
 * (TORCH_ALLOCATOR.md §2, §3.1). The torch policy (sim/alloc/torch.c) runs on them, and the
 * snapshot importer (formats/snapshot.c) needs the rounding to size the blocks a recording
 * starts with. */
#ifndef MEMSIM_FORMATS_TORCH_SETTINGS_H
#define MEMSIM_FORMATS_TORCH_SETTINGS_H

#include <memsim/error.h>
#include <memsim/trace.h>

#define TORCH_MIB ((memsim_size_t)1 << 20)
#define TORCH_MIN_BLOCK ((memsim_size_t)512)        /* kMinBlockSize */
#define TORCH_MIN_LARGE_ALLOC (10 * TORCH_MIB)      /* kMinLargeAlloc */
#define TORCH_LARGE_BUFFER (20 * TORCH_MIB)         /* kLargeBuffer */
#define TORCH_DIV_INTERVALS 16                      /* roundup_power2_divisions' table */
#define TORCH_UNLIMITED UINT64_MAX

typedef struct {
    memsim_size_t max_split_size; /* TORCH_UNLIMITED = default */
    memsim_size_t max_non_split_rounding;
    memsim_size_t large_segment; /* kLargeBuffer unless large_segment_size_mb */
    double gc_threshold;         /* 0 = off */
    double fraction;             /* per_process_memory_fraction; >= 1 = off */
    gboolean expandable;
    gboolean any_div;
    uint64_t div[TORCH_DIV_INTERVALS];
} TorchSettings;

/* Parses `settings` ("key:value,..." or key=value; NULL or "" for the defaults) into `c`.
 * FALSE with a MEMSIM_ERROR_BAD_INPUT error ("torch settings: ...") naming what is wrong,
 * MEMSIM_ERROR_UNSUPPORTED for backend:cudaMallocAsync. */
gboolean torch_settings_parse(const char *settings, TorchSettings *c, GError **error);

/* round_size: the bytes a request of `size` takes under the settings (512-byte multiples,
 * or one of roundup_power2_divisions' steps). */
static inline memsim_size_t torch_settings_round(const TorchSettings *c, memsim_size_t size)
{
    if (size < TORCH_MIN_BLOCK)
        return TORCH_MIN_BLOCK;
    if (c->any_div) {
        int lg = 63 - __builtin_clzll(size);
        int idx = lg - 20;
        idx = idx < 0 ? 0 : idx > TORCH_DIV_INTERVALS - 1 ? TORCH_DIV_INTERVALS - 1 : idx;
        uint64_t d = c->div[idx];
        if (d > 1 && size > TORCH_MIN_BLOCK * d) {
            if ((size & (size - 1)) == 0)
                return size;
            memsim_size_t floor2 = (memsim_size_t)1 << lg;
            memsim_size_t step = floor2 >> (63 - __builtin_clzll(d));
            if (step == 0)
                return floor2 << 1;
            memsim_size_t down = size & ~(step - 1);
            return down == size ? size : down + step;
        }
    }
    return (size + TORCH_MIN_BLOCK - 1) & ~(TORCH_MIN_BLOCK - 1);
}

#endif
