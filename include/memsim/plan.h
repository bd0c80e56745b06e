/* memsim — planning: the fastest configuration that fits, found by sweeping and simulating.
 *
 *     MemsimRun run = memsim_run_defaults();                 // seq, precision, finetune, ...
 *     memsim_run_set(&run, "seq", "4096", &err);
 *     MemsimPlanOptions o = memsim_plan_options_defaults();
 *     o.run = &run;
 *     o.gpus = 8;
 *     o.gpu = "a100-40gb";
 *     o.global_batch = 64;
 *     MemsimPlan *p = memsim_plan(model, &o, &err);          // NULL with err on bad input
 *     char *txt = memsim_plan_to_text(p);                    // or _to_json, _to_csv
 *     g_free(txt);
 *     memsim_plan_free(p);
 *
 * The sweep covers the distributed methods of the generator (DDP, ZeRO-1/2/3, FSDP
 * FULL_SHARD / SHARD_GRAD_OP / HYBRID_SHARD, Megatron tp × pp × dp with the 1F1B and
 * interleaved schedules, GPipe on request) with degrees that divide the GPU count, the
 * micro-batch (largest that fits, by bisection), activation checkpointing (none, selective,
 * full) and the allocator setting (expandable_segments). A row is a layout (a method with
 * its degrees) with its fastest configuration. Each candidate is generated and replayed
 * exactly as `memsim estimate` would (the row's `command` re-runs it); candidates that
 * cannot fit are pruned first by lower bounds on memory, and candidates that cannot reach
 * the top rows by the cost model (traces/plan.c states the assumptions). Step times come
 * from the documented cost model of traces/plan/cost.c: a ranking aid, not a promise. LoRA and
 * QLoRA are single-GPU programs in the generator: with gpus > 1 they are planned as
 * independent data-parallel replicas.
 */
#ifndef MEMSIM_PLAN_H
#define MEMSIM_PLAN_H

#include <memsim/gen.h>
#include <memsim/sim.h>

G_BEGIN_DECLS

/* Which families the sweep may use (MemsimPlanOptions.methods). */
typedef enum {
    MEMSIM_PLAN_DDP = 1 << 0,
    MEMSIM_PLAN_ZERO1 = 1 << 1,
    MEMSIM_PLAN_ZERO2 = 1 << 2,
    MEMSIM_PLAN_ZERO3 = 1 << 3,
    MEMSIM_PLAN_FSDP = 1 << 4,
    MEMSIM_PLAN_FSDP_GRAD_OP = 1 << 5,
    MEMSIM_PLAN_HSDP = 1 << 6,
    MEMSIM_PLAN_TP = 1 << 7, /* Megatron without pipeline: tp × dp (tp = 1 included) */
    MEMSIM_PLAN_PP = 1 << 8, /* Megatron with a pipeline: tp × pp × dp, pp > 1 */
    MEMSIM_PLAN_ALL = (1 << 9) - 1,
} MemsimPlanMethods;

typedef struct {
    /* The run whose settings the plan keeps (seq, steps, precision, optimizer, attention,
     * finetune, LoRA, torch version, cuBLAS workspace); NULL = memsim_run_defaults(). Its
     * batch, grad-accum, checkpointing and distribution are what the plan chooses. Borrowed. */
    const MemsimRun *run;
    int gpus;                    /* GPUs in all, ≥ 1 */
    const char *gpu;             /* GPU profile (memsim_gpu_names()); NULL = a100-80gb */
    memsim_size_t gpu_mem;       /* device memory; 0 = the profile's */
    int gpus_per_node;           /* 0 = 8 */
    int64_t global_batch;        /* sequences per optimizer step; 0 = one micro-batch per
                                    replica and step (pipelines: pp micro-batches) */
    guint methods;               /* MemsimPlanMethods; 0 = all */
    guint checkpointing;         /* bits 1 << MemsimCheckpointing; 0 = none, selective, full */
    guint schedules;             /* bits 1 << MemsimPipeSchedule; 0 = 1f1b and interleaved */
    int64_t max_batch;           /* largest micro-batch tried; 0 = 256 (or the per-replica batch) */
    gboolean no_expandable;      /* leave expandable_segments out of the sweep */
    gboolean no_offload;         /* never fall back to CPU offload of the optimizer state */
    gboolean mig;                /* one GPU: which MIG slices the job fits in */
    int top;                     /* ranked layouts kept (default 5); 0 = every one */
    int misses;                  /* closest misses kept (default 5) */
    gboolean exhaustive;         /* every candidate and micro-batch, nothing pruned, no
                                    bisection (slow; to check the pruned sweep) */
    int threads;                 /* 0 = one per processor */
    memsim_size_t context_bytes; /* CUDA context and libraries (MEMSIM_ESTIMATE_CONTEXT_DEFAULT) */
    memsim_size_t nccl_bytes;    /* per NCCL communicator; 0 = the measured defaults */
    double efficiency;           /* fraction of the tensor-core peak reached; 0 = 0.5 */
    double network_gbs;          /* per-GPU bandwidth between nodes, GB/s; 0 = 25 */
    /* (optional) Called from the worker threads, one at a time, after each configuration;
     * `done` of `total`. */
    void (*progress)(guint done, guint total, gpointer user);
    gpointer progress_user;
} MemsimPlanOptions;

/* One simulated rank role of a configuration (all ranks of a role are alike). */
typedef struct {
    uint32_t rank; /* its first device */
    uint32_t multiplicity;
    char *role;
    memsim_size_t peak_allocated;
    memsim_size_t peak_reserved;
    memsim_size_t device_total;    /* peak reserved + context + NCCL: what nvidia-smi shows */
    memsim_size_t optimizer_state; /* allocated at the optimizer step (offload) */
} MemsimPlanRank;

/* A layout's row: its fastest configuration (schedule, checkpointing) and micro-batch; or,
 * among the misses, one configuration at its smallest micro-batch. */
typedef struct {
    char *label;         /* "zero3", "megatron tp 2 pp 4 dp 1 (interleaved)", ... */
    MemsimMethod method; /* NONE: one GPU, or independent replicas */
    gboolean replicas;   /* LoRA/QLoRA on several GPUs: single-GPU programs, DDP-like */
    int tp, pp, dp;      /* dp: data-parallel replicas (all GPUs for ZeRO/FSDP/DDP) */
    MemsimPipeSchedule schedule;
    int virtual_stages;
    int64_t batch;        /* micro-batch per replica */
    int grad_accum;       /* micro-batches per step (pipelines: --microbatches) */
    int64_t global_batch; /* sequences per step */
    MemsimCheckpointing checkpointing;
    gboolean expandable;      /* needs PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True */
    gboolean offload;         /* optimizer state on the CPU (approximation, see notes) */
    memsim_size_t host_bytes; /* offload: host memory per GPU */
    /* the step time (simulated when time_simulated, else the cost model's) */
    double step_s, tokens_per_s;
    /* the cost model's parts (traces/plan/cost.c) */
    double compute_s, comm_s, bubble_s, optimizer_s;
    /* memory: peak = the largest device total over ranks */
    memsim_size_t peak;
    int64_t headroom;    /* gpu_mem − peak; negative: misses by that much */
    gboolean bound_only; /* a miss known from a lower bound only (not simulated) */
    uint32_t n_ranks;
    MemsimPlanRank *ranks;
    char *command; /* the `memsim estimate` command that re-estimates it */
    char *recipe;  /* the same settings in DeepSpeed / FSDP / Megatron words */
    /* The simulated step (memsim_step_time, the slowest rank's last step) when the row was
     * replayed and fits: step_s is then its time, and these its parts; else FALSE and step_s
     * is the cost model's. */
    gboolean time_simulated;
    double sim_compute_s, sim_memory_s, sim_overhead_s, sim_waiting_s;
    double sim_bubble_s; /* of the waiting, on a pipeline neighbour */
} MemsimPlanRow;

/* A MIG slice profile and what fits in it (MemsimPlanOptions.mig). */
typedef struct {
    char name[16];        /* "1g.10gb" */
    memsim_size_t memory; /* usable memory as nvidia-smi mig -lgip lists it */
    int sms;              /* its streaming multiprocessors */
    int instances;        /* how many one GPU holds at once */
    gboolean fits;
    MemsimPlanRow best; /* the fastest configuration in the slice (when it fits) */
} MemsimPlanMig;

typedef struct {
    char *model;
    char *run; /* the kept run settings, described */
    char *gpu;
    memsim_size_t gpu_mem;
    int gpus, gpus_per_node;
    int64_t global_batch; /* 0 = free */
    guint n_rows;         /* layouts that fit, fastest first (at most `top`) */
    MemsimPlanRow *rows;
    guint n_misses; /* configurations that do not fit at their smallest
                       micro-batch and would beat rows[0] (all, when nothing
                       fits): the fastest `misses` of them, by how much they miss */
    MemsimPlanRow *misses;
    guint n_mig;
    MemsimPlanMig *mig;
    char **notes; /* NULL-terminated: assumptions that applied */
    /* the sweep */
    guint n_configs;      /* configurations (method, degrees, schedule, checkpointing) */
    guint64 n_candidates; /* × micro-batches × allocator settings */
    guint n_generated;    /* traces generated */
    guint n_replays;      /* replays through an allocator */
    guint n_pruned_bound; /* configurations ruled out by the model-state lower bound */
    guint n_pruned_exact; /* replays saved by the exact allocator's lower bound */
    guint n_pruned_cost;  /* configurations that could not reach the top rows */
    guint n_bounded;      /* candidates whose step was bounded from their stage programs */
    guint n_short_over;   /* of n_pruned_exact: misses shown by a short run of the stage
                             programs, the run itself not generated */
    int threads;
    double elapsed_s; /* wall-clock seconds */
    MemsimTimeModel time_model; /* what the simulated step times assumed (the whole GPU's) */
} MemsimPlan;

/* The defaults: top 5, 5 misses, all methods, the three checkpointing modes, 1F1B and
 * interleaved, expandable_segments swept, offload as the last resort. */
MEMSIM_API MemsimPlanOptions memsim_plan_options_defaults(void);

/* Parses a comma-separated list into the bits of `key`: "methods" (ddp, zero1, zero2,
 * zero3, fsdp, fsdp-grad-op, hsdp, tp, pp, megatron = tp and pp, zero = the three stages,
 * all), "schedules" (1f1b, gpipe, interleaved) or "checkpointing" (none, selective, full).
 * FALSE with an error naming the unknown word. */
MEMSIM_API gboolean memsim_plan_parse_list(const char *key, const char *value, guint *bits, GError **error);

/* For bindings that cannot lay out the struct: new options at the defaults (free with
 * memsim_plan_options_free). */
MEMSIM_API MemsimPlanOptions *memsim_plan_options_new(void);
MEMSIM_API void memsim_plan_options_free(MemsimPlanOptions *opt);
/* Sets one option from text; `key` is the flag of `memsim plan` without "--" (global-batch,
 * gpu-mem, mig, methods, schedules, checkpointing-modes, max-batch, no-expandable,
 * no-offload, top, misses, exhaustive, threads, cuda-context, nccl-mem, efficiency,
 * network-gbs; flags take true/false). FALSE with a MEMSIM_ERROR_BAD_INPUT error naming the
 * key and the bad value, leaving the options as they were. */
MEMSIM_API gboolean memsim_plan_options_set(MemsimPlanOptions *opt, const char *key, const char *value,
                                 GError **error);
/* The keys memsim_plan_options_set accepts, NULL-terminated (static; do not free). */
MEMSIM_API const char *const *memsim_plan_option_keys(void);
/* Plans for `run` (borrowed; NULL = the defaults): sets opt->run and takes the cluster from
 * the run's gpus, gpu and gpus-per-node (memsim_run_set keys). */
MEMSIM_API void memsim_plan_options_use_run(MemsimPlanOptions *opt, const MemsimRun *run);

/* Sweeps, simulates and ranks. Returns a new plan (memsim_plan_free), or NULL with a
 * MEMSIM_ERROR_BAD_INPUT error naming the bad option (no GPUs, an unknown GPU, a global
 * batch no candidate can divide, no MIG profiles for the GPU, ...). A plan with no rows is
 * not an error: nothing fits. Thread-safe like memsim_estimate. */
MEMSIM_API MemsimPlan *memsim_plan(const MemsimModel *model, const MemsimPlanOptions *opt, GError **error);
MEMSIM_API void memsim_plan_free(MemsimPlan *plan);

/* The plan as a table (ranked rows, closest misses, the recommendation and its command),
 * as JSON, or as CSV (one line per row and miss). Newly allocated; g_free() them. */
MEMSIM_API char *memsim_plan_to_text(const MemsimPlan *plan);
MEMSIM_API char *memsim_plan_to_json(const MemsimPlan *plan);
MEMSIM_API char *memsim_plan_to_csv(const MemsimPlan *plan);

G_END_DECLS

#endif
