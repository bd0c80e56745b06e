/* memsim — the estimate: a run generated from a model and judged on a device.
 *
 *     MemsimEstimateOptions o = MEMSIM_ESTIMATE_OPTIONS_INIT;
 *     o.gpu_mem = (memsim_size_t)80 << 30;
 *     MemsimReport *rep = memsim_estimate(model, &run, &o, &err);   // memsim/sim.h's report
 *
 * The one judge step of every command that answers "does it fit" (estimate, plan, compare
 * with a model, the Python module): the allocator gets the device's memory less what lies
 * outside it (CUDA context and libraries, NCCL's communicators), and a rank fits when it
 * never runs out and its device total stays within the device.
 */
#ifndef MEMSIM_ESTIMATE_H
#define MEMSIM_ESTIMATE_H

#include <memsim/gen.h>
#include <memsim/sim.h>

G_BEGIN_DECLS

/* How an estimate is replayed and judged. */
typedef struct {
    const char *allocator;      /* policy spec; NULL = "torch" */
    const char *alloc_conf;     /* PYTORCH_CUDA_ALLOC_CONF for the torch policy, or NULL */
    memsim_size_t gpu_mem;      /* device memory; 0 = the run's GPU profile's (run.gpu,
                                 * default a100-80gb), reported as assumed */
    memsim_size_t context_bytes;/* outside the allocator: CUDA context, libraries */
    memsim_size_t nccl_bytes;   /* per NCCL communicator; 0 = the measured defaults */
    const char *device;         /* (optional) the name gpu_mem came from, for the report */
} MemsimEstimateOptions;

#define MEMSIM_ESTIMATE_CONTEXT_DEFAULT ((memsim_size_t)500 << 20)
#define MEMSIM_ESTIMATE_OPTIONS_INIT {NULL, NULL, 0, MEMSIM_ESTIMATE_CONTEXT_DEFAULT, 0, NULL}

/* Generates the run's trace and replays it: the allocator sees gpu_mem − context_bytes.
 * Returns a new report (memsim_report_free) with the run described and each rank's device
 * total and fits set, or NULL with error. Thread-safe: distinct calls share nothing. */
MEMSIM_API MemsimReport *memsim_estimate(const MemsimModel *model, const MemsimRun *run,
                                     const MemsimEstimateOptions *opt, GError **error);
/* The same, recording the replay into `timeline` (memsim/timeline.h; may be NULL). */
MEMSIM_API MemsimReport *memsim_estimate_recorded(const MemsimModel *model, const MemsimRun *run,
                                              const MemsimEstimateOptions *opt,
                                              MemsimTimeline *timeline, GError **error);
/* NCCL's memory outside the allocator on each rank of `run`, as memsim_estimate adds it to
 * the device total: one communicator per process group the rank belongs to (DISTRIBUTED.md
 * §7.3), each `per_communicator` bytes, or with 0 the measured defaults (≈544 MB for a 2-rank
 * group, ≈688 MB for a larger one). 0 on one GPU. */
MEMSIM_API memsim_size_t memsim_estimate_nccl_bytes(const MemsimRun *run, memsim_size_t per_communicator);
/* Whether this machine has the host memory to generate and simulate `run` (checked before
 * either starts): a one-step probe of the fewest micro-batches is generated and its events
 * scaled to the run's steps and the micro-batches its programs generate (the pipeline's all,
 * the loop's repeated ones once); *need gets the bytes projected (from the run's shape alone,
 * with no probe, where even several times that is far below the memory there is; 0 for a run
 * small enough to need no probe, or whose probe its own rules refuse, such as a Megatron
 * launch's batch arithmetic). FALSE with a MEMSIM_ERROR_BAD_INPUT error giving the numbers when they
 * exceed what /proc/meminfo calls MemAvailable (or the environment's MEMSIM_HOST_MEMORY, bytes
 * or with a unit). */
MEMSIM_API gboolean memsim_estimate_host_check(const MemsimModel *model, const MemsimRun *run,
                                               memsim_size_t *need, GError **error);

G_END_DECLS

#endif
