/* Internal: the step-time cost model of `memsim plan` (every formula is listed at the top
 * of traces/plan/cost.c). */
#ifndef MEMSIM_TRACES_COST_H
#define MEMSIM_TRACES_COST_H

#include <memsim/gen.h>

typedef struct {
    const MemsimModel *model;
    const MemsimGpu *gpu;
    double compute_fraction; /* MIG: the slice's SMs / the GPU's SMs; 1 = whole GPU */
    double memory_fraction;  /* MIG: the slice's share of HBM bandwidth; 1 = whole GPU */
    double efficiency;       /* of the tensor-core peak */
    double network_gbs;      /* per GPU between nodes */
    int gpus, gpus_per_node;
    MemsimPrecision precision;
    MemsimFinetune finetune;
    int lora_rank;
    int64_t seq;
    /* the configuration */
    MemsimMethod method; /* NONE: one GPU or replicas */
    gboolean replicas;
    int tp, pp, dp, v; /* megatron degrees and virtual stages */
    MemsimPipeSchedule schedule;
    MemsimCheckpointing checkpointing;
    int64_t batch; /* micro-batch */
    int n_micro;   /* micro-batches per step per replica */
    gboolean offload;
} CostInput;

typedef struct {
    double compute_s;   /* forward + backward */
    double recompute_s; /* checkpointing */
    double bubble_s;    /* pipeline idle time */
    double comm_s;      /* exposed collectives: data-parallel, TP, pipeline p2p */
    double optimizer_s; /* the optimizer step (on the CPU with offload) */
    double other_s;     /* QLoRA dequantisation traffic */
    double step_s;
    double tokens; /* per step, all replicas */
    double tokens_per_s;
    gboolean simulated; /* step_s is the simulation's (the configuration was replayed) */
    double model_step_s; /* the cost model's own step_s */
    double chain_s;      /* a lower bound of the simulated step from the stage programs
                            (traces/plan/bound.c; 0: none) */
    gboolean chained;    /* chain_s was looked for */
    double host_s;       /* a sibling's host dispatch time, scaled (traces/plan/plan.c) */
} CostResult;

/* Fills `out` for the configuration of `in`. */
void cost_step(const CostInput *in, CostResult *out);

#endif
