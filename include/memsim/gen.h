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
 * (a GLib key file, group [run]): batch, seq, steps, grad-accum, precision, optimizer,
 * optimizer-impl, zero-grad, attention, checkpointing, finetune, lora-rank, lora-targets,
 * torch-version, use-cache, inference, prompt, generate, weights.
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

typedef enum { MEMSIM_CKPT_NONE, MEMSIM_CKPT_FULL, MEMSIM_CKPT_SELECTIVE } MemsimCheckpointing;

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
    MemsimFinetune finetune;
    int lora_rank;
    char **lora_targets;        /* NULL = q_proj,v_proj style defaults of the family */
    char *torch_version;        /* e.g. "2.8", "1.13"; NULL = newest modelled */
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
    gboolean fsdp_wrap_model;   /* one FSDP unit for the whole model (default: per layer) */
    int gpus_per_node;          /* HSDP and link speeds (default 8) */
    char *gpu;                  /* GPU profile name (default a100-80gb) */
    memsim_size_t cublas_workspace; /* bytes per cuBLAS handle and stream; 0 = the default */
    guint64 given;              /* one bit per setting memsim_run_set took (memsim_run_given) */
} MemsimRun;

/* The defaults a current PyTorch + Transformers user gets without asking. The run owns its
 * strings (lora_targets, torch_version, gpu): release them with memsim_run_clear(). */
MemsimRun memsim_run_defaults(void);
/* Frees the strings the run owns and sets them to NULL (the other fields stay). */
void memsim_run_clear(MemsimRun *run);
/* Sets one setting by name (flag spelling without "--"; the value is copied); FALSE with a
 * MEMSIM_ERROR_BAD_INPUT error for an unknown key or a bad value ("precision: 'fp8' is not
 * one of ..."), leaving the run as it was. */
gboolean memsim_run_set(MemsimRun *run, const char *key, const char *value, GError **error);
/* Whether the setting `key` was given (set through memsim_run_set or a run file). */
gboolean memsim_run_given(const MemsimRun *run, const char *key);
/* The settings taken together: FALSE with a MEMSIM_ERROR_BAD_INPUT error naming the setting
 * for one that this run would ignore (--seq with --inference, --weights without it,
 * --microbatches without --pp, ...) or a GPU profile that does not exist. memsim_generate
 * (and so memsim_estimate and plan) checks this first. */
gboolean memsim_run_check(const MemsimRun *run, GError **error);
/* Reads the [run] group of a GLib key file with the same keys, in the file's order; FALSE
 * with an error naming the file (and the key) on the first bad one. */
gboolean memsim_run_load_file(MemsimRun *run, const char *path, GError **error);
/* One line describing the run, including every default that applied. Newly allocated. */
char *memsim_run_describe(const MemsimRun *run);

typedef struct MemsimModel MemsimModel;

/* A preset name (see memsim_model_presets) or the path of a config.json. Returns a new
 * model (memsim_model_free) or NULL with an error: an unknown name (listing the presets), an
 * unreadable or malformed config, an unsupported architecture. A model is only read by the
 * functions below: one model may serve several threads at once. */
MemsimModel *memsim_model_load(const char *name_or_path, GError **error);
/* NULL is accepted. */
void memsim_model_free(MemsimModel *model);
/* The preset name (or the config's path) and the family ("llama", "gpt2", ...); owned by
 * the model. */
const char *memsim_model_name(const MemsimModel *model);
const char *memsim_model_family(const MemsimModel *model);
/* Parameter count implied by the config (tied weights counted once). */
int64_t memsim_model_n_params(const MemsimModel *model);
/* NULL-terminated list of preset names; free with g_strfreev. */
char **memsim_model_presets(void);

/* Applies the run defaults that depend on the model and the method: a sequence length that
 * was not given is cut to the context of a model with learned positions when shorter (GPT-2:
 * 1024); a Megatron run given --grad-accum but not --microbatches gets that many
 * micro-batches (its accumulation). */
void memsim_run_adapt(MemsimRun *run, const MemsimModel *model);

/* Generates the trace of `run` (one rank per distinct GPU program; a single GPU unless the
 * run says otherwise). Returns a new trace (memsim_trace_free) or NULL with error for a run
 * the model cannot take (e.g. a tensor-parallel degree that does not divide the heads). */
MemsimTrace *memsim_generate(const MemsimModel *model, const MemsimRun *run, GError **error);

/* A GPU's public figures (traces/gpus.c). */
typedef struct {
    const char *name;         /* "a100-80gb", "h100-80gb", "h200", ... */
    memsim_size_t memory;     /* bytes, as nvidia-smi reports the total */
    double bf16_tflops;       /* dense tensor-core peak */
    double fp32_tflops;
    double hbm_gbs;           /* memory bandwidth, GB/s */
    double link_gbs;          /* GPU-to-GPU bandwidth per direction, GB/s */
} MemsimGpu;

/* Every profile, ending with an entry whose name is NULL. Static; do not free. */
const MemsimGpu *memsim_gpus(void);
/* The profile of a name (NULL = the default, a100-80gb), or NULL if unknown. */
const MemsimGpu *memsim_gpu_find(const char *name);
/* "a100-40gb, a100-80gb, ..." — newly allocated, g_free() it. */
char *memsim_gpu_names(void);
/* A device's memory as the user names it: a GPU profile ("h100-80gb": the bytes nvidia-smi
 * reports for the card) or a size ("80GiB", "80GB", bytes). *profile (may be NULL) gets the
 * profile's name, or NULL for a size. FALSE with a MEMSIM_ERROR_BAD_INPUT error naming `key`
 * for anything else, and for 0 bytes. */
gboolean memsim_parse_gpu_mem(const char *key, const char *text, memsim_size_t *bytes,
                              const char **profile, GError **error);

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

struct MemsimReport;
struct MemsimTimeline;

/* Generates the run's trace and replays it: the allocator sees gpu_mem − context_bytes.
 * Returns a new report (memsim_report_free) with the run described and each rank's device
 * total and fits set, or NULL with error. Thread-safe: distinct calls share nothing. */
struct MemsimReport *memsim_estimate(const MemsimModel *model, const MemsimRun *run,
                                     const MemsimEstimateOptions *opt, GError **error);
/* The same, recording the replay into `timeline` (memsim/timeline.h; may be NULL). */
struct MemsimReport *memsim_estimate_recorded(const MemsimModel *model, const MemsimRun *run,
                                              const MemsimEstimateOptions *opt,
                                              struct MemsimTimeline *timeline, GError **error);
/* NCCL's memory outside the allocator on each rank of `run`, as memsim_estimate adds it to
 * the device total: one communicator per process group the rank belongs to (DISTRIBUTED.md
 * §7.3), each `per_communicator` bytes, or with 0 the measured defaults (≈544 MB for a 2-rank
 * group, ≈688 MB for a larger one). 0 on one GPU. */
memsim_size_t memsim_estimate_nccl_bytes(const MemsimRun *run, memsim_size_t per_communicator);

G_END_DECLS

#endif
