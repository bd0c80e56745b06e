/* Internal: the judge step of an estimate, for the estimate itself and the planner, which
 * replays traces it keeps (traces/plan/). */
#ifndef MEMSIM_TRACES_ESTIMATE_JUDGE_H
#define MEMSIM_TRACES_ESTIMATE_JUDGE_H

#include <memsim/estimate.h>

/* A run judged on a device of gpu_mem bytes (0: unlimited). */
typedef struct {
    memsim_size_t gpu_mem;
    memsim_size_t context;  /* CUDA context and libraries */
    memsim_size_t nccl;     /* NCCL's communicators (memsim_estimate_nccl_bytes) */
    memsim_size_t capacity; /* what the allocator may take; 0 = unlimited */
} Judge;

/* Before the replay: the capacity for the allocator, `reserve` more bytes kept off it (the
 * planner's exact bound judges NCCL's share up front). FALSE with an error when the context
 * leaves nothing (memsim_device_capacity). */
gboolean judge_begin(Judge *j, const MemsimRun *run, memsim_size_t gpu_mem,
                     memsim_size_t context, memsim_size_t nccl_per, memsim_size_t reserve,
                     GError **error);
/* After it: each rank's device total (peak reserved + context + NCCL) and whether it fits. */
void judge_end(const Judge *j, MemsimReport *rep);

#endif
