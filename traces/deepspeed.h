/* Internal: a DeepSpeed config as memsim reads it (traces/deepspeed.c) — the keys that change
 * memory with DeepSpeed's defaults applied (deepspeed/runtime/zero/config.py
 * DeepSpeedZeroConfig, zero/offload_config.py), for traces/distributed.c. */
#ifndef MEMSIM_TRACES_DEEPSPEED_H
#define MEMSIM_TRACES_DEEPSPEED_H

#include <memsim/deepspeed.h>
#include <stdbool.h>

#define DS_AUTO (-1) /* a size left to Hugging Face's Trainer: from the model's hidden size */

typedef struct {
    int stage;                       /* zero_optimization.stage (1–3; 0 is refused) */
    int64_t reduce_bucket;           /* reduce_bucket_size, elements (5e8; auto: h²) */
    int64_t allgather_bucket;        /* allgather_bucket_size (5e8; no memory on torch ≥ 1.13) */
    bool contiguous_gradients;       /* True */
    bool overlap_comm;               /* None → stage == 3 (overlap_comm_valid) */
    bool reduce_scatter;             /* True */
    int64_t prefetch_bucket;         /* stage3_prefetch_bucket_size (5e7; auto: 0.9 h²) */
    int64_t max_live;                /* stage3_max_live_parameters (1e9) */
    int64_t max_reuse;               /* stage3_max_reuse_distance (1e9) */
    int64_t persist_threshold;       /* stage3_param_persistence_threshold (1e5; auto: 10 h) */
    int64_t model_persist_threshold; /* stage3_model_persistence_threshold (sys.maxsize) */
    int64_t sub_group;               /* sub_group_size (1e9) */
    bool offload_optimizer;          /* offload_optimizer.device cpu */
    bool offload_optimizer_pin;      /* offload_optimizer.pin_memory */
    bool offload_param;              /* offload_param.device cpu (stage 3) */
    bool offload_param_pin;          /* offload_param.pin_memory */
} DsZero;

struct MemsimDeepspeed {
    char *source;
    char *text;  /* the file's JSON */
    char **sets; /* the KEY=VALUE overrides taken (NULL-terminated), or NULL */
    DsZero z;
    int64_t micro, accum, train_batch; /* 0 = not given or auto */
    bool precision_set, optimizer_set;
    MemsimPrecision precision;
    MemsimOptimizer optimizer;
    int comm_dtype, accum_dtype; /* communication_data_type, data_types.grad_accum_dtype:
                                  * 0 not given, 16 fp16, 17 bf16, 32 fp32 */
    double clip;                 /* gradient_clipping (0 = none) */
    GPtrArray *warnings;         /* char*, NULL-terminated */
};

/* The sizes a Trainer's "auto" leaves to the model: hidden size h (integrations/deepspeed.py
 * trainer_config_finalize: reduce_bucket_size h², stage3_prefetch_bucket_size 0.9 h²,
 * stage3_param_persistence_threshold 10 h). */
DsZero ds_zero_resolved(const struct MemsimDeepspeed *ds, int64_t hidden);

/* The config with one more KEY=VALUE over it (the planner's offload), or NULL if that is
 * refused. */
struct MemsimDeepspeed *ds_with_set(const struct MemsimDeepspeed *ds, const char *set);

/* The run settings memsim_deepspeed_apply sets: bits of MemsimRun.given by SettingId
 * (memsim_deepspeed_sets, in traces/settings.c, reads it by name). */
guint64 ds_sets_mask(const struct MemsimDeepspeed *ds);

/* What the run: line adds (newly allocated): the ZeRO options used. */
char *ds_describe(const struct MemsimDeepspeed *ds);

#endif
