/* memsim — generating traces from a Hugging Face config and a run description.
 *
 *     MemsimModel *m = memsim_model_load("llama-3-8b", &err);      // preset or config.json
 *     MemsimRun run = memsim_run_defaults();
 *     memsim_run_set(&run, "batch", "2", &err);
 *     memsim_run_set(&run, "precision", "bf16-mixed", &err);
 *     MemsimTrace *t = memsim_generate(m, &run, &err);             // per-op allocations
 *     MemsimReport *rep = memsim_replay_trace(t, &opts, &err);     // through an allocator
 *     memsim_trace_free(t); memsim_model_free(m); memsim_run_clear(&run);
 *
 * Run settings have the same names as the command's flags and the keys of a run file
 * (a GLib key file, group [run]). memsim_run_setting_info() lists them, each with its value's
 * kind, its default and its help (the table in traces/settings.c).
 */
#ifndef MEMSIM_GEN_H
#define MEMSIM_GEN_H

#include <memsim/error.h>
#include <memsim/trace.h>

G_BEGIN_DECLS

typedef enum {
    MEMSIM_PREC_FP32,
    MEMSIM_PREC_BF16_MIXED, /* autocast bf16, fp32 master weights */
    MEMSIM_PREC_FP16_MIXED, /* autocast fp16, fp32 master weights */
    MEMSIM_PREC_BF16,       /* everything in bf16 */
    MEMSIM_PREC_FP16,       /* everything in fp16 */
} MemsimPrecision;

typedef enum {
    MEMSIM_OPTIM_ADAMW,
    MEMSIM_OPTIM_SGD,
    MEMSIM_OPTIM_SGD_MOMENTUM,
    MEMSIM_OPTIM_ADAFACTOR,
    MEMSIM_OPTIM_ADAMW_8BIT,
} MemsimOptimizer;

typedef enum {
    MEMSIM_OPTIM_IMPL_DEFAULT, /* what the torch version picks (1.13: for-loop; 2.x: foreach) */
    MEMSIM_OPTIM_IMPL_FOR_LOOP,
    MEMSIM_OPTIM_IMPL_FOREACH,
    MEMSIM_OPTIM_IMPL_FUSED,
} MemsimOptimizerImpl;

typedef enum {
    MEMSIM_ATTN_SDPA, /* the default: SDPA picks flash / mem-efficient / math */
    MEMSIM_ATTN_EAGER,
    MEMSIM_ATTN_SDPA_MATH,
    MEMSIM_ATTN_FLASH,
    MEMSIM_ATTN_MEM_EFFICIENT,
} MemsimAttention;

/* NONE, FULL (every decoder layer recomputed: HF gradient_checkpointing, torchtitan full AC,
 * Megatron --recompute-granularity full), SELECTIVE (Megatron's: the attention core only),
 * SAC_OP (torchtitan's op-level selective AC: the outputs of the ops of MemsimRun.sac_ops are
 * kept, every second mm recomputed, the rest recomputed), SAC_LAYER (torchtitan's layer SAC:
 * every sac_every-th decoder layer fully checkpointed). */
typedef enum {
    MEMSIM_CKPT_NONE,
    MEMSIM_CKPT_FULL,
    MEMSIM_CKPT_SELECTIVE,
    MEMSIM_CKPT_SAC_OP,
    MEMSIM_CKPT_SAC_LAYER,
} MemsimCheckpointing;

/* The ops whose outputs op-level SAC keeps (bits of MemsimRun.sac_ops), as torchtitan names
 * them: aten.mm (every second one recomputed), aten.addmm, aten.bmm, the SDPA kernels
 * (flash, memory-efficient, cuDNN) and aten.topk. */
typedef enum {
    MEMSIM_SAC_MM = 1 << 0,
    MEMSIM_SAC_ADDMM = 1 << 1,
    MEMSIM_SAC_BMM = 1 << 2,
    MEMSIM_SAC_SDPA = 1 << 3,
    MEMSIM_SAC_TOPK = 1 << 4,
} MemsimSacOp;

typedef enum {
    MEMSIM_METHOD_NONE,     /* one GPU, or Megatron-style tp/pp/dp given as degrees */
    MEMSIM_METHOD_DDP,
    MEMSIM_METHOD_ZERO1,
    MEMSIM_METHOD_ZERO2,
    MEMSIM_METHOD_ZERO3,
    MEMSIM_METHOD_FSDP,     /* FULL_SHARD */
    MEMSIM_METHOD_FSDP_GRAD_OP, /* SHARD_GRAD_OP */
    MEMSIM_METHOD_HSDP,     /* HYBRID_SHARD */
    MEMSIM_METHOD_MEGATRON, /* TP × PP × DP, distributed optimizer on the DP axis */
} MemsimMethod;

typedef enum { MEMSIM_PP_1F1B, MEMSIM_PP_GPIPE, MEMSIM_PP_INTERLEAVED } MemsimPipeSchedule;
typedef enum { MEMSIM_FT_FULL, MEMSIM_FT_LORA, MEMSIM_FT_QLORA } MemsimFinetune;
typedef enum { MEMSIM_WEIGHTS_DEFAULT, MEMSIM_WEIGHTS_INT8, MEMSIM_WEIGHTS_4BIT } MemsimWeights;

typedef struct {
    int64_t batch;
    int64_t seq;
    int steps;
    int grad_accum;
    MemsimPrecision precision;
    MemsimOptimizer optimizer;
    MemsimOptimizerImpl optimizer_impl;
    gboolean zero_grad_to_none; /* zero_grad(set_to_none=True); default: the version's */
    gboolean zero_grad_set;     /* whether zero_grad_to_none was given */
    MemsimAttention attention;
    MemsimCheckpointing checkpointing;
    int sac_every;              /* SAC_LAYER: every N-th layer checkpointed (sac-layer:N) */
    guint sac_ops;              /* SAC_OP: MemsimSacOp bits of the ops whose outputs are kept */
    MemsimFinetune finetune;
    int lora_rank;
    char **lora_targets;        /* NULL = q_proj,v_proj style defaults of the family */
    char *torch_version;        /* e.g. "2.8", "1.13"; NULL = newest modelled */
    int transformers_version;   /* Transformers release, major·1000 + minor; 0 = newest */
    int use_cache;              /* -1 = the config's, 0 or 1 */
    gboolean inference;
    int64_t prompt;             /* inference: prompt tokens */
    int64_t generate;           /* inference: generated tokens */
    MemsimWeights weights;      /* inference weight quantisation */
    gboolean keep_outputs;      /* the loop holds the model output until the next step's */
    gboolean device_cpu;        /* CPU kernels (for comparing with CPU recordings) */
    /* distribution (DISTRIBUTED.md): gpus = tp × pp × dp */
    int gpus;                   /* 1 = one GPU */
    MemsimMethod method;
    int tp, pp, dp;             /* 0 = derived */
    MemsimPipeSchedule pp_schedule;
    int microbatches;           /* pipeline micro-batches per step (0 = pp) */
    int virtual_stages;         /* interleaved 1F1B: chunks per stage */
    gboolean sequence_parallel;
    int fsdp_wrap_model;        /* 0 a unit per decoder layer (default), 1 one for the model,
                                 * 2 peft's LoRA policy (the layers, each adapter its own),
                                 * 3 size_based_auto_wrap_policy */
    int64_t fsdp_wrap_min_params; /* its min_num_params (3 only) */
    gboolean zero_redundancy;   /* DDP with torch's ZeroRedundancyOptimizer around the optimizer */
    int gpus_per_node;          /* HSDP and link speeds (default 8) */
    /* FSDP (DISTRIBUTED.md §3, §4): the API, its ShardingStrategy, MixedPrecision (an index
     * of fp32, bf16, fp16; the precision's when not given), CPU offload, FSDP1's rate limiter,
     * backward prefetch and use_orig_params, FSDP2's reshard_after_forward */
    int fsdp_version;           /* 0: FSDP1 (FullyShardedDataParallel), 1: FSDP2 (fully_shard) */
    int fsdp_sharding;          /* 0 full, 1 grad-op, 2 hybrid, 3 no-shard (with --method fsdp) */
    int fsdp_param_dtype, fsdp_reduce_dtype;
    int fsdp_output_dtype;      /* FSDP2 MixedPrecisionPolicy output_dtype (fp32, bf16, fp16) */
    gboolean fsdp_offload;
    gboolean fsdp_limit_all_gathers;
    int fsdp_backward_prefetch; /* 0 BACKWARD_PRE, 1 BACKWARD_POST, 2 none */
    gboolean fsdp_use_orig_params;
    int fsdp_reshard_after_forward; /* 1 True, 0 False, k ≥ 2: to groups of k ranks */
    char *gpu;                  /* GPU profile name (default a100-80gb) */
    /* The time model's assumptions, instead of the GPU profile's: the fraction of the
     * tensor-core peak a GEMM's waves reach, and the per-GPU bandwidth between nodes (GB/s);
     * 0 = the profile's (0.5, 25). */
    double compute_efficiency;
    double network_gbs;
    /* The routing a mixture of experts is assumed to get, for the models whose experts run
     * one by one on their own tokens: the most-loaded expert takes moe_imbalance times the
     * uniform share of the T·k token slots (at most the T tokens), the rest spread evenly
     * over the other experts; 1 (or 0) = uniform. */
    double moe_imbalance;
    memsim_size_t cublas_workspace; /* bytes per cuBLAS handle and stream; 0 = the default */
    guint64 given;              /* one bit per setting memsim_run_set took (memsim_run_given) */
    /* a Megatron-LM launch (include/memsim/megatron.h: memsim_megatron_apply), or NULL */
    const struct MemsimMegatron *megatron;
    /* a DeepSpeed config (include/memsim/deepspeed.h: memsim_deepspeed_apply), or NULL */
    const struct MemsimDeepspeed *deepspeed;
} MemsimRun;

/* The defaults a current PyTorch + Transformers user gets without asking (each setting's
 * default_value, memsim_run_setting_info). The run owns its strings (lora_targets,
 * torch_version, gpu): release them with memsim_run_clear(). */
MEMSIM_API MemsimRun memsim_run_defaults(void);
/* Frees the strings the run owns and sets them to NULL (the other fields stay). */
MEMSIM_API void memsim_run_clear(MemsimRun *run);
/* Sets one setting by name (flag spelling without "--"; the value is copied); FALSE with a
 * MEMSIM_ERROR_BAD_INPUT error for an unknown key or a bad value ("precision: 'fp8' is not
 * one of ..."), leaving the run as it was. */
MEMSIM_API gboolean memsim_run_set(MemsimRun *run, const char *key, const char *value, GError **error);
/* Whether the setting `key` was given (set through memsim_run_set or a run file). */
MEMSIM_API gboolean memsim_run_given(const MemsimRun *run, const char *key);
/* The settings taken together: FALSE with a MEMSIM_ERROR_BAD_INPUT error naming the setting
 * for one that this run would ignore (--seq with --inference, --weights without it,
 * --microbatches without --pp, ...) or a GPU profile that does not exist. memsim_generate
 * (and so memsim_estimate and plan) checks this first. */
MEMSIM_API gboolean memsim_run_check(const MemsimRun *run, GError **error);
/* Reads the [run] group of a GLib key file with the same keys, in the file's order; FALSE
 * with an error naming the file (and the key) on the first bad one. */
MEMSIM_API gboolean memsim_run_load_file(MemsimRun *run, const char *path, GError **error);
/* One line describing the run, including every default that applied. Newly allocated. */
MEMSIM_API char *memsim_run_describe(const MemsimRun *run);

/* What a run setting's value is. */
typedef enum {
    MEMSIM_SETTING_KIND_INT,    /* a decimal integer in [min, max] */
    MEMSIM_SETTING_KIND_ENUM,   /* one of `values` (any case) */
    MEMSIM_SETTING_KIND_BOOL,   /* false, true, no, yes, 0 or 1 (any case) */
    MEMSIM_SETTING_KIND_SIZE,   /* bytes, or with a unit: 32MiB, 1GB (memsim_parse_size_of) */
    MEMSIM_SETTING_KIND_STRING, /* a name the setting checks: a torch release, a GPU profile */
    MEMSIM_SETTING_KIND_LIST,   /* names, comma-separated */
} MemsimSettingKind;

/* Which runs a setting applies to; memsim_run_check refuses it, given to another. */
typedef enum {
    MEMSIM_SETTING_SCOPE_ANY,       /* training and inference */
    MEMSIM_SETTING_SCOPE_TRAINING,  /* not with inference */
    MEMSIM_SETTING_SCOPE_INFERENCE, /* only with inference */
} MemsimSettingScope;

/* One run setting, as memsim_run_set, a run file and the command (--help-run) take it. */
typedef struct {
    const char *name;          /* "grad-accum": the key, and the flag without "--" */
    const char *arg;           /* the value's name in --help-run ("N"); NULL for a flag that
                                * takes none (it means true) */
    const char *help;          /* the line of --help-run */
    MemsimSettingKind kind;
    int64_t min, max;          /* MEMSIM_SETTING_KIND_INT: the bounds */
    const char *const *values; /* MEMSIM_SETTING_KIND_ENUM: the names, NULL-terminated, in the
                                * order of the C enum; else NULL */
    const char *default_value; /* what memsim_run_defaults sets, as it would be given; NULL
                                * where the run leaves it unset and it is decided later (the
                                * help says how: the torch version's, the model's, from the
                                * other settings) */
    MemsimSettingScope scope;
} MemsimRunSetting;

/* The i-th run setting, in the order of --help-run; NULL past the last. Static: do not free. */
MEMSIM_API const MemsimRunSetting *memsim_run_setting_info(guint i);

/* A run's distribution with its defaults applied: what the settings given come to. */
typedef struct {
    MemsimMethod method;  /* megatron where --tp or --pp above 1 came without a method */
    int tp, pp, dp;       /* the degrees: tp and pp 1 when not given, dp gpus / (tp × pp)
                           * (rounded down; 0 when tp × pp exceeds the GPUs) */
    int microbatches;     /* pipeline micro-batches per step: pp when not given */
    gboolean distributed; /* several GPUs, a method or a degree: one program per rank */
} MemsimResolvedRun;

/* The distribution `run` describes, its defaults applied (none of it checked: see
 * memsim_run_check). */
MEMSIM_API MemsimResolvedRun memsim_run_resolve(const MemsimRun *run);

typedef struct MemsimModel MemsimModel;

/* A preset name (see memsim_model_presets) or the path of a config.json. Returns a new
 * model (memsim_model_free) or NULL with an error: an unknown name (listing the presets), an
 * unreadable or malformed config, an unsupported architecture. A model is only read by the
 * functions below: one model may serve several threads at once. */
MEMSIM_API MemsimModel *memsim_model_load(const char *name_or_path, GError **error);
/* NULL is accepted. */
MEMSIM_API void memsim_model_free(MemsimModel *model);
/* The preset name (or the config's path) and the family ("llama", "gpt2", ...); owned by
 * the model. */
MEMSIM_API const char *memsim_model_name(const MemsimModel *model);
MEMSIM_API const char *memsim_model_family(const MemsimModel *model);
/* Parameter count implied by the config (tied weights counted once). */
MEMSIM_API int64_t memsim_model_n_params(const MemsimModel *model);
/* The model's parameter counts: all of them (tied weights once), those one token's forward
 * uses (a mixture of experts: all but the routed experts it is not sent to; else all), the
 * input embedding tables (tokens, and learned positions where the family has them) and the
 * separate LM head (0 when tied to the embedding). */
typedef struct {
    int64_t params, active, embedding, lm_head;
    gboolean tied;
} MemsimModelCounts;
MEMSIM_API void memsim_model_counts(const MemsimModel *model, MemsimModelCounts *out);
/* The model as a JSON object (name, family, model_type, the counts above), newly allocated. */
MEMSIM_API char *memsim_model_to_json(const MemsimModel *model);
/* A JSON object's text (a report's, a plan's) with the model added under "model", as
 * `memsim estimate --json` and `memsim plan --json` print it; newly allocated (the text
 * itself, copied, when it is not a JSON object). */
MEMSIM_API char *memsim_json_with_model(const char *json_object, const MemsimModel *model);
/* NULL-terminated list of preset names; free with g_strfreev. */
MEMSIM_API char **memsim_model_presets(void);

/* Applies the run defaults that depend on the model and the method: a sequence length that
 * was not given is cut to the context of a model with learned positions when shorter (GPT-2:
 * 1024); a Megatron run given --grad-accum but not --microbatches gets that many
 * micro-batches (its accumulation). */
MEMSIM_API void memsim_run_adapt(MemsimRun *run, const MemsimModel *model);

/* Generates the trace of `run` (one rank per distinct GPU program; a single GPU unless the
 * run says otherwise). Returns a new trace (memsim_trace_free) or NULL with error for a run
 * the model cannot take (e.g. a tensor-parallel degree that does not divide the heads). */
MEMSIM_API MemsimTrace *memsim_generate(const MemsimModel *model, const MemsimRun *run, GError **error);
/* The same, each rank's program written to a file of its own in `dir` (an existing folder) as
 * soon as it is complete and dropped from memory (memsim_trace_spill_to): the trace holds one
 * rank's events at a time, for memsim_trace_save to stream into the output file. */
MEMSIM_API MemsimTrace *memsim_generate_spilling(const MemsimModel *model, const MemsimRun *run,
                                                 const char *dir, GError **error);

/* A GPU's public figures (traces/gpus.c). */
typedef struct {
    const char *name;         /* "a100-80gb", "h100-80gb", "h200", ... */
    memsim_size_t memory;     /* bytes, as nvidia-smi reports the total */
    double bf16_tflops;       /* dense tensor-core peak */
    double fp32_tflops;
    double hbm_gbs;           /* memory bandwidth, GB/s */
    double link_gbs;          /* GPU-to-GPU bandwidth per direction, GB/s */
    /* What the time models assume is reached: the fraction of the tensor-core peak a GEMM
     * gets, the fraction of the HBM and link bandwidths a kernel or collective gets, and the
     * per-GPU bandwidth between nodes (GB/s: one 200 Gb/s NIC per GPU). */
    double compute_efficiency;
    double bandwidth_efficiency;
    double network_gbs;
    /* The time model's per-kernel and per-op terms (traces/gpus.c gives each its source):
     * streaming multiprocessors (a GEMM's tiles run in waves of this many), the shortest a
     * kernel takes on the GPU (launch to completion), the host's time to dispatch one eager
     * PyTorch op, and NCCL's latencies: a collective's base and each ring step's over the
     * GPU-to-GPU link and over the network, µs. */
    int sms;
    double kernel_us;
    double dispatch_us;
    double nccl_base_us;
    double link_hop_us;
    double network_hop_us;
} MemsimGpu;

/* A MIG slice profile of a GPU (traces/gpus.c): `nvidia-smi mig -lgip`'s memory and SMs, its
 * memory slices of 8 and how many fit on one GPU. memsim_gpu_find("GPU:NAME") gives the
 * slice as a GPU profile of its own. */
typedef struct {
    const char *gpu;
    const char *name;
    int mem_mib;
    int sms;
    int mem_slices;
    int instances;
} MemsimMigProfile;

/* Every MIG slice profile, ending with an entry whose gpu is NULL. Static. */
MEMSIM_API const MemsimMigProfile *memsim_mig_profiles(void);

/* Every profile, ending with an entry whose name is NULL. Static; do not free. */
MEMSIM_API const MemsimGpu *memsim_gpus(void);
/* The profile of a name (NULL = the default, a100-80gb; "a100-40gb:1g.5gb" a MIG slice), or
 * NULL if unknown. */
MEMSIM_API const MemsimGpu *memsim_gpu_find(const char *name);
/* "a100-40gb, a100-80gb, ..." — newly allocated, g_free() it. */
MEMSIM_API char *memsim_gpu_names(void);
/* A device's memory as the user names it: a GPU profile ("h100-80gb": the bytes nvidia-smi
 * reports for the card) or a size ("80GiB", "80GB", bytes). *profile (may be NULL) gets the
 * profile's name, or NULL for a size. FALSE with a MEMSIM_ERROR_BAD_INPUT error naming `key`
 * for anything else, and for 0 bytes. */
MEMSIM_API gboolean memsim_parse_gpu_mem(const char *key, const char *text, memsim_size_t *bytes,
                              const char **profile, GError **error);

G_END_DECLS

#endif
