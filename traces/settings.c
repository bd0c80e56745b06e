/* Run settings (include/memsim/gen.h): one table of every setting a run takes — its key (the
 * command's flag without "--", a run file's [run] key), the name and help of its value in
 * --help-run, its kind and bounds, its default and the runs it applies to — and what reads
 * it: memsim_run_defaults, memsim_run_set and the run file reader, memsim_run_check's
 * refusals of settings a run would ignore, memsim_run_describe, and memsim_run_setting_info
 * for the command's options, the bindings and the documentation's tests.
 *
 * A setting of a plain kind (an integer, a name among several, a boolean, a size) is parsed
 * by its kind and stored into its field of MemsimRun; the few that are not (zero-grad sets
 * two fields, the torch version and the GPU are checked names, LoRA targets a list) have a
 * setter of their own. Settings are numbered by SettingId (traces/settings.h), which is the
 * bit of MemsimRun.given.
 */
#include <memsim/alloc.h>
#include <memsim/gen.h>

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "traces/hf_versions.h"
#include "traces/loop.h"
#include "traces/megatron.h"
#include "traces/deepspeed.h"
#include "traces/settings.h"

typedef struct Setting Setting;

struct Setting {
    MemsimRunSetting info;
    /* The field a setting of a plain kind is stored into (the index of a name, 0 or 1 for a
     * boolean): an int, an enum or a gboolean of 4 bytes, an int64_t or a memsim_size_t. */
    size_t offset, size;
    /* (optional) Parses and stores the value instead; FALSE with an error naming the key. */
    gboolean (*set)(MemsimRun *r, const Setting *s, const char *v, GError **error);
    /* (optional) The refusal when given to a run it does not apply to (default: "KEY: an
     * inference run has no KEY", "KEY: only with --inference"). */
    const char *refusal;
};

/* The fields a plain setting stores into by kind: 4 bytes for enums and gbooleans. */
G_STATIC_ASSERT(sizeof(MemsimPrecision) == sizeof(int) && sizeof(MemsimOptimizer) == sizeof(int));
G_STATIC_ASSERT(sizeof(MemsimOptimizerImpl) == sizeof(int) &&
                sizeof(MemsimAttention) == sizeof(int));
G_STATIC_ASSERT(sizeof(MemsimCheckpointing) == sizeof(int) &&
                sizeof(MemsimFinetune) == sizeof(int));
G_STATIC_ASSERT(sizeof(MemsimWeights) == sizeof(int) && sizeof(MemsimMethod) == sizeof(int));
G_STATIC_ASSERT(sizeof(MemsimPipeSchedule) == sizeof(int) && sizeof(gboolean) == sizeof(int));
G_STATIC_ASSERT(N_SETTINGS <= 64); /* the bits of MemsimRun.given */

static gboolean set_zero_grad(MemsimRun *r, const Setting *s, const char *v, GError **error);
static gboolean set_lora_targets(MemsimRun *r, const Setting *s, const char *v, GError **error);
static gboolean set_torch_version(MemsimRun *r, const Setting *s, const char *v, GError **error);
static gboolean set_gpu(MemsimRun *r, const Setting *s, const char *v, GError **error);
static gboolean set_real(MemsimRun *r, const Setting *s, const char *v, GError **error);
static gboolean set_checkpointing(MemsimRun *r, const Setting *s, const char *v, GError **error);
static gboolean set_fsdp_wrap(MemsimRun *r, const Setting *s, const char *v, GError **error);
static gboolean set_transformers_version(MemsimRun *r, const Setting *s, const char *v,
                                         GError **error);
static gboolean set_sac_ops(MemsimRun *r, const Setting *s, const char *v, GError **error);
static gboolean set_reshard_after_forward(MemsimRun *r, const Setting *s, const char *v,
                                          GError **error);

#define KEY(k, a) .info.name = (k), .info.arg = (a)
#define HELP(h) .info.help = (h)
#define DEFAULT(v) .info.default_value = (v)
#define TRAINING .info.scope = MEMSIM_SETTING_SCOPE_TRAINING
#define INFERENCE .info.scope = MEMSIM_SETTING_SCOPE_INFERENCE
#define INT(lo, hi) .info.kind = MEMSIM_SETTING_KIND_INT, .info.min = (lo), .info.max = (hi)
#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})
#define ENUM(...) .info.kind = MEMSIM_SETTING_KIND_ENUM, .info.values = NAMES(__VA_ARGS__)
#define BOOL .info.kind = MEMSIM_SETTING_KIND_BOOL
#define SIZE .info.kind = MEMSIM_SETTING_KIND_SIZE
#define STRING(fn) .info.kind = MEMSIM_SETTING_KIND_STRING, .set = (fn)
#define LIST(fn) .info.kind = MEMSIM_SETTING_KIND_LIST, .set = (fn)
#define FIELD(f) .offset = offsetof(MemsimRun, f), .size = sizeof(((MemsimRun *)NULL)->f)

/* In the order of --help-run. The help is the command's, word for word; tests/test_config.c
 * checks that a default it names is default_value, tests/test_manpage.c that the man page
 * and the bash completion have every setting and value. */
static const Setting settings[N_SETTINGS] = {
    [SETTING_BATCH] = {KEY("batch", "N"), INT(1, 1 << 20), DEFAULT("1"), FIELD(batch),
                       HELP("Micro-batch size (default 1)")},
    [SETTING_SEQ] = {KEY("seq", "N"), INT(1, 1 << 24), DEFAULT("2048"), FIELD(seq), TRAINING,
                     HELP("Sequence length (default 2048)"),
                     .refusal = "seq: an inference run takes --prompt (the prompt's tokens) and "
                                "--generate (the tokens generated), not --seq"},
    [SETTING_STEPS] = {KEY("steps", "N"), INT(1, 1000), DEFAULT("2"), FIELD(steps), TRAINING,
                       HELP("Optimizer steps simulated (default 2: step 1 creates the state)")},
    [SETTING_GRAD_ACCUM] = {KEY("grad-accum", "N"), INT(1, 4096), DEFAULT("1"), FIELD(grad_accum),
                            TRAINING, HELP("Micro-batches per optimizer step (default 1)")},
    [SETTING_PRECISION] = {KEY("precision", "P"),
                           ENUM("fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp16"),
                           DEFAULT("bf16-mixed"), FIELD(precision),
                           HELP("fp32, bf16-mixed (default), fp16-mixed, bf16, fp16")},
    [SETTING_OPTIMIZER] = {KEY("optimizer", "O"),
                           ENUM("adamw", "sgd", "sgd-momentum", "adafactor", "adamw-8bit"),
                           DEFAULT("adamw"), FIELD(optimizer), TRAINING,
                           HELP("adamw (default), sgd, sgd-momentum, adafactor, adamw-8bit")},
    [SETTING_OPTIMIZER_IMPL] = {KEY("optimizer-impl", "I"),
                                ENUM("default", "for-loop", "foreach", "fused"), DEFAULT("default"),
                                FIELD(optimizer_impl), TRAINING,
                                HELP("default (1.13: for-loop; 2.x: foreach), for-loop, foreach, "
                                     "fused")},
    [SETTING_ZERO_GRAD] = {KEY("zero-grad", "Z"), ENUM("zero", "none"), .set = set_zero_grad,
                           TRAINING,
                           HELP("none (set_to_none=True; default in 2.x) or zero (in place)")},
    [SETTING_ATTENTION] = {KEY("attention", "A"),
                           ENUM("sdpa", "eager", "sdpa-math", "flash", "mem-efficient"),
                           DEFAULT("sdpa"), FIELD(attention),
                           HELP("sdpa (default), eager, sdpa-math, flash, mem-efficient")},
    [SETTING_CHECKPOINTING] = {KEY("checkpointing", "C"),
                               ENUM("none", "full", "selective", "sac-op", "sac-layer"),
                               .set = set_checkpointing, DEFAULT("none"), TRAINING,
                               HELP("none (default), full, selective (Megatron's), sac-op, "
                                    "sac-layer[:N] (torchtitan's)")},
    [SETTING_SAC_OPS] = {KEY("sac-ops", "LIST"), LIST(set_sac_ops), DEFAULT("mm,addmm,bmm,sdpa,topk"),
                         TRAINING,
                         HELP("Ops whose outputs sac-op keeps, of mm (every other one), "
                              "addmm, bmm, sdpa, topk: mm,addmm,bmm,sdpa,topk (default: "
                              "torchtitan's)")},
    [SETTING_FINETUNE] = {KEY("finetune", "F"), ENUM("full", "lora", "qlora"), DEFAULT("full"),
                          FIELD(finetune), TRAINING, HELP("full (default), lora, qlora")},
    [SETTING_LORA_RANK] = {KEY("lora-rank", "R"), INT(1, 65536), DEFAULT("16"), FIELD(lora_rank),
                           TRAINING, HELP("LoRA rank (default 16)")},
    [SETTING_LORA_TARGETS] = {KEY("lora-targets", "LIST"), LIST(set_lora_targets), TRAINING,
                              HELP("LoRA target modules, comma-separated (default: peft's)")},
    [SETTING_TORCH_VERSION] = {KEY("torch-version", "V"), STRING(set_torch_version),
                               HELP("PyTorch release whose semantics apply: 1.13, 2.0 … 2.9 "
                                    "(default 2.8)")},
    [SETTING_TRANSFORMERS_VERSION] = {KEY("transformers-version", "V"),
                                      STRING(set_transformers_version),
                                      HELP("Hugging Face Transformers release whose modelling "
                                           "code applies: 4.31 … 5.x (default: the newest "
                                           "modelled; traces/transformers_versions.md)")},
    [SETTING_USE_CACHE] = {KEY("use-cache", "BOOL"), BOOL, FIELD(use_cache),
                           HELP("Override the config's use_cache (a KV cache in training)")},
    [SETTING_INFERENCE] = {KEY("inference", NULL), BOOL, DEFAULT("false"), FIELD(inference),
                           HELP("Inference: a prompt, then generated tokens with a KV cache")},
    [SETTING_PROMPT] = {KEY("prompt", "N"), INT(1, 1 << 24), DEFAULT("512"), FIELD(prompt),
                        INFERENCE, HELP("Inference prompt tokens (default 512)")},
    [SETTING_GENERATE] = {KEY("generate", "N"), INT(0, 1 << 24), DEFAULT("128"), FIELD(generate),
                          INFERENCE, HELP("Inference generated tokens (default 128)")},
    [SETTING_WEIGHTS] = {KEY("weights", "W"), ENUM("default", "int8", "4bit"), DEFAULT("default"),
                         FIELD(weights), INFERENCE,
                         HELP("Inference weights: default (the precision), int8, 4bit")},
    [SETTING_KEEP_OUTPUTS] = {KEY("keep-outputs", "BOOL"), BOOL, DEFAULT("false"),
                              FIELD(keep_outputs), TRAINING,
                              HELP("The loop keeps the model output until the next step "
                                   "(default false: Trainer)")},
    [SETTING_DEVICE] = {KEY("device", "D"), ENUM("cuda", "cpu"), DEFAULT("cuda"), FIELD(device_cpu),
                        HELP("cuda (default) or cpu kernels (to compare with CPU recordings)")},
    [SETTING_GPUS] = {KEY("gpus", "N"), INT(1, 1 << 20), DEFAULT("1"), FIELD(gpus),
                      HELP("GPUs in all (default 1)")},
    [SETTING_METHOD] = {KEY("method", "M"),
                        ENUM("none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op",
                             "hsdp", "megatron"),
                        FIELD(method), TRAINING,
                        HELP("ddp, zero1, zero2, zero3, fsdp, fsdp-grad-op, hsdp, megatron "
                             "(default: megatron when --tp/--pp are given, else none)")},
    [SETTING_TP] = {KEY("tp", "T"), INT(1, 1 << 20), FIELD(tp), TRAINING,
                    HELP("Tensor-parallel degree (Megatron)")},
    [SETTING_PP] = {KEY("pp", "P"), INT(1, 1 << 20), FIELD(pp), TRAINING,
                    HELP("Pipeline-parallel degree (Megatron)")},
    [SETTING_DP] = {KEY("dp", "D"), INT(1, 1 << 20), FIELD(dp), TRAINING,
                    HELP("Data-parallel degree (default gpus / (tp × pp))")},
    [SETTING_PP_SCHEDULE] = {KEY("pp-schedule", "S"), ENUM("1f1b", "gpipe", "interleaved"),
                             DEFAULT("1f1b"), FIELD(pp_schedule), TRAINING,
                             HELP("1f1b (default), gpipe, interleaved")},
    [SETTING_MICROBATCHES] = {KEY("microbatches", "M"), INT(1, 1 << 16), FIELD(microbatches),
                              TRAINING, HELP("Micro-batches per step for pipelines (default pp)")},
    [SETTING_VIRTUAL_STAGES] = {KEY("virtual-stages", "V"), INT(1, 1024), DEFAULT("1"),
                                FIELD(virtual_stages), TRAINING,
                                HELP("Model chunks per stage for the interleaved schedule")},
    [SETTING_SEQUENCE_PARALLEL] = {KEY("sequence-parallel", NULL), BOOL, DEFAULT("false"),
                                   FIELD(sequence_parallel), TRAINING,
                                   HELP("Megatron sequence parallelism")},
    [SETTING_FSDP_WRAP] = {KEY("fsdp-wrap", "W"), ENUM("layer", "model", "lora", "size"),
                           .set = set_fsdp_wrap, DEFAULT("layer"), TRAINING,
                           HELP("layer (default: one unit per decoder layer), model, lora "
                                "(peft's fsdp_auto_wrap_policy: the layers, and each trained "
                                "adapter a unit of its own), or size[:N] "
                                "(size_based_auto_wrap_policy with min_num_params N, 1e8 when left out)")},
    [SETTING_FSDP_VERSION] = {KEY("fsdp-version", "V"), ENUM("1", "2"), DEFAULT("1"),
                              FIELD(fsdp_version), TRAINING,
                              HELP("FSDP API: 1 (default here: FullyShardedDataParallel, "
                                   "FlatParameters) or 2 (fully_shard, per-parameter DTensor "
                                   "shards; torch's recommended API since 2.6)")},
    [SETTING_FSDP_SHARDING] = {KEY("fsdp-sharding", "S"),
                               ENUM("full", "grad-op", "hybrid", "no-shard"), DEFAULT("full"),
                               FIELD(fsdp_sharding), TRAINING,
                               HELP("ShardingStrategy with --method fsdp: full (default), "
                                    "grad-op, hybrid, no-shard (--method fsdp-grad-op and hsdp "
                                    "are grad-op and hybrid)")},
    [SETTING_FSDP_PARAM_DTYPE] = {KEY("fsdp-param-dtype", "DT"), ENUM("fp32", "bf16", "fp16"),
                                  FIELD(fsdp_param_dtype), TRAINING,
                                  HELP("MixedPrecision param_dtype: fp32, bf16, fp16 (default: "
                                       "the precision's; fp32 with a -mixed precision is "
                                       "torch.autocast on fp32 parameters)")},
    [SETTING_FSDP_REDUCE_DTYPE] = {KEY("fsdp-reduce-dtype", "DT"), ENUM("fp32", "bf16", "fp16"),
                                   FIELD(fsdp_reduce_dtype), TRAINING,
                                   HELP("MixedPrecision reduce_dtype: fp32, bf16, fp16 "
                                        "(default: the param dtype)")},
    [SETTING_FSDP_OUTPUT_DTYPE] = {KEY("fsdp-output-dtype", "DT"), ENUM("fp32", "bf16", "fp16"),
                                   FIELD(fsdp_output_dtype), TRAINING,
                                   HELP("FSDP2 MixedPrecisionPolicy output_dtype: fp32, bf16, "
                                        "fp16 (default: none, outputs left as computed)")},
    [SETTING_FSDP_OFFLOAD] = {KEY("fsdp-offload", "BOOL"), BOOL, DEFAULT("false"),
                              FIELD(fsdp_offload), TRAINING,
                              HELP("CPUOffload(offload_params=True) / CPUOffloadPolicy: shards, "
                                   "gradients and the optimizer on the host (default false)")},
    [SETTING_FSDP_LIMIT_ALL_GATHERS] = {KEY("fsdp-limit-all-gathers", "BOOL"), BOOL,
                                        DEFAULT("true"), FIELD(fsdp_limit_all_gathers), TRAINING,
                                        HELP("FSDP1's rate limiter: at most two all-gathers in "
                                             "flight (default true)")},
    [SETTING_FSDP_BACKWARD_PREFETCH] = {KEY("fsdp-backward-prefetch", "P"),
                                        ENUM("pre", "post", "none"), DEFAULT("pre"),
                                        FIELD(fsdp_backward_prefetch), TRAINING,
                                        HELP("FSDP1 BackwardPrefetch: pre (default), post, "
                                             "none")},
    [SETTING_FSDP_USE_ORIG_PARAMS] = {KEY("fsdp-use-orig-params", "BOOL"), BOOL,
                                      FIELD(fsdp_use_orig_params), TRAINING,
                                      HELP("FSDP1 use_orig_params: each parameter padded to 16 "
                                           "bytes in its FlatParameter (default false; true "
                                           "with LoRA)")},
    [SETTING_FSDP_RESHARD_AFTER_FORWARD] = {KEY("fsdp-reshard-after-forward", "R"),
                                            STRING(set_reshard_after_forward), DEFAULT("true"),
                                            TRAINING,
                                            HELP("FSDP2 reshard_after_forward: true (default), "
                                                 "false, or K: to groups of K ranks (the root "
                                                 "is kept either way)")},
    [SETTING_ZERO_REDUNDANCY] = {KEY("zero-redundancy", "BOOL"), BOOL, DEFAULT("false"),
                                 FIELD(zero_redundancy), TRAINING,
                                 HELP("DDP with torch's ZeroRedundancyOptimizer: each rank's "
                                      "optimizer state for its share of whole parameters "
                                      "(default false)")},
    [SETTING_GPUS_PER_NODE] = {KEY("gpus-per-node", "N"), INT(1, 1024), DEFAULT("8"),
                               FIELD(gpus_per_node),
                               HELP("GPUs per node (HSDP's shard group; default 8)")},
    [SETTING_GPU] = {KEY("gpu", "NAME"), STRING(set_gpu),
                     HELP("GPU profile for op durations (default a100-80gb)")},
    [SETTING_CUBLAS_WORKSPACE] = {KEY("cublas-workspace", "SIZE"), SIZE, FIELD(cublas_workspace),
                                  HELP("cuBLAS workspace per handle and stream, in the allocator "
                                       "(default 8519680 bytes; 32MiB on H100/H200)")},
    [SETTING_EFFICIENCY] = {KEY("efficiency", "F"), STRING(set_real), FIELD(compute_efficiency),
                            HELP("Fraction of the tensor-core peak a GEMM's full waves reach in "
                                 "the time model (default 0.5)")},
    [SETTING_NETWORK_GBS] = {KEY("network-gbs", "GBS"), STRING(set_real), FIELD(network_gbs),
                             HELP("Per-GPU bandwidth between nodes in GB/s for the time model "
                                  "(default 25)")},
    [SETTING_MOE_IMBALANCE] = {KEY("moe-imbalance", "F"), STRING(set_real), DEFAULT("1"),
                               FIELD(moe_imbalance),
                               HELP("Routing of a mixture of experts run expert by expert: "
                                    "the most-loaded expert gets F (>= 1) times the uniform "
                                    "share of the token slots, at most every token (default 1: "
                                    "uniform)")},
};

const MemsimRunSetting *memsim_run_setting_info(guint i)
{
    return i < N_SETTINGS ? &settings[i].info : NULL;
}

const char *setting_name(SettingId id)
{
    g_assert(id < N_SETTINGS);
    return settings[id].info.name;
}

const char *setting_value_name(SettingId id, int value)
{
    g_assert(id < N_SETTINGS && settings[id].info.values);
    const char *const *v = settings[id].info.values;
    for (int i = 0; v[i]; i++)
        if (i == value)
            return v[i];
    g_assert_not_reached();
}

static gboolean given(const MemsimRun *r, SettingId id)
{
    return r->given >> id & 1;
}

static int setting_find(const char *key)
{
    for (int i = 0; i < N_SETTINGS; i++)
        if (strcmp(settings[i].info.name, key) == 0)
            return i;
    return -1;
}

gboolean memsim_run_given(const MemsimRun *run, const char *key)
{
    int i = setting_find(key);
    return i >= 0 && given(run, (SettingId)i);
}

/* include/memsim/megatron.h: here, where the settings' names are, so that traces/megatron.c
 * uses nothing of this file (which uses it) */
gboolean memsim_megatron_sets(const MemsimMegatron *mg, const char *key)
{
    g_return_val_if_fail(mg && key, FALSE);
    int i = setting_find(key);
    return i >= 0 && (mg_sets_mask(mg) >> i & 1);
}

/* include/memsim/deepspeed.h: here for the same reason */
gboolean memsim_deepspeed_sets(const MemsimDeepspeed *ds, const char *key)
{
    g_return_val_if_fail(ds && key, FALSE);
    int i = setting_find(key);
    return i >= 0 && (ds_sets_mask(ds) >> i & 1);
}

/* ---- values from text ---- */

static gboolean pick(const char *key, const char *v, const char *const *names, int *out,
                     GError **error)
{
    for (int i = 0; names[i]; i++)
        if (g_ascii_strcasecmp(v, names[i]) == 0) {
            *out = i;
            return TRUE;
        }
    g_autofree char *list = g_strjoinv(", ", (char **)names);
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: '%s' is not one of %s", key, v,
                list);
    return FALSE;
}

gboolean setting_int(const char *key, const char *v, int64_t lo, int64_t hi, int64_t *out,
                     GError **error)
{
    char *end = NULL;
    gint64 x = g_ascii_strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: '%s' is not an integer in [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "]",
                    key, v, lo, hi);
        return FALSE;
    }
    *out = x;
    return TRUE;
}

gboolean setting_bool(const char *key, const char *v, gboolean *out, GError **error)
{
    int i;
    static const char *const names[] = {"false", "true", "no", "yes", "0", "1", NULL};
    if (!pick(key, v, names, &i, error))
        return FALSE;
    *out = i % 2;
    return TRUE;
}

gboolean setting_refuse(GError **error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s", msg);
    return FALSE;
}

/* FALSE with the known profiles listed for a GPU name memsim has no profile of. */
static gboolean gpu_known(const char *name, GError **error)
{
    if (memsim_gpu_find(name))
        return TRUE;
    g_autofree char *known = memsim_gpu_names();
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: unknown GPU '%s' (known: %s)",
                setting_name(SETTING_GPU), name, known);
    return FALSE;
}

/* ---- the setters of the settings that are not plain ---- */

static gboolean set_zero_grad(MemsimRun *r, const Setting *s, const char *v, GError **error)
{
    int i;
    if (!pick(s->info.name, v, s->info.values, &i, error))
        return FALSE;
    r->zero_grad_to_none = i == 1;
    r->zero_grad_set = TRUE;
    return TRUE;
}

static gboolean set_lora_targets(MemsimRun *r, const Setting *s, const char *v, GError **error)
{
    g_strfreev(r->lora_targets);
    r->lora_targets = g_strsplit(v, ",", -1);
    for (char **t = r->lora_targets; *t; t++)
        g_strstrip(*t);
    return TRUE;
}

/* Splits a value NAME[:COUNT] whose COUNT only the name `takes` accepts: the name (to free)
 * and COUNT (NULL when none; it points into the name's allocation); NULL and an error when
 * another name has a count. */
static char *name_and_count(const Setting *s, const char *v, const char *takes,
                            const char **count, GError **error)
{
    char *name = g_strdup(v);
    char *colon = strchr(name, ':');
    *count = NULL;
    if (!colon)
        return name;
    *colon = '\0';
    if (g_ascii_strcasecmp(name, takes) != 0) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: '%s': only %s takes a count (%s:N)", s->info.name, v, takes, takes);
        g_free(name);
        return NULL;
    }
    *count = colon + 1;
    return name;
}

/* none, full, selective, sac-op, or sac-layer[:N]: torchtitan's layer SAC checkpoints every
 * N-th TransformerBlock (torchtitan/distributed/activation_checkpoint.py _apply_layer_sac,
 * selective_ac_option = "N", default "2" in its config). */
static gboolean set_checkpointing(MemsimRun *r, const Setting *s, const char *v, GError **error)
{
    int i;
    int every = 2;
    const char *count;
    g_autofree char *name = name_and_count(s, v, "sac-layer", &count, error);
    if (!name)
        return FALSE;
    if (count) {
        int64_t n;
        if (!setting_int(s->info.name, count, 1, 1 << 20, &n, error))
            return FALSE;
        every = (int)n;
    }
    if (!pick(s->info.name, name, s->info.values, &i, error))
        return FALSE;
    r->checkpointing = (MemsimCheckpointing)i;
    r->sac_every = i == MEMSIM_CKPT_SAC_LAYER ? every : 0;
    return TRUE;
}

/* layer, model, lora, or size[:N]: torch.distributed.fsdp.wrap.size_based_auto_wrap_policy
 * with min_num_params N (its default int(1e8)); N as digits or as 1e8. */
static gboolean set_fsdp_wrap(MemsimRun *r, const Setting *s, const char *v, GError **error)
{
    int i;
    int64_t min_params = 100000000;
    const char *n;
    g_autofree char *name = name_and_count(s, v, "size", &n, error);
    if (!name)
        return FALSE;
    if (n) {
        char *end = NULL;
        double x = g_ascii_strtod(n, &end);
        if (!*n || *end || !(x >= 1 && x <= 1e15) || x != (double)(int64_t)x) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "%s: '%s': N is a whole number of parameters from 1 to 1e15 "
                        "(digits or 1e8)", s->info.name, v);
            return FALSE;
        }
        min_params = (int64_t)x;
    }
    if (!pick(s->info.name, name, s->info.values, &i, error))
        return FALSE;
    r->fsdp_wrap_model = i;
    r->fsdp_wrap_min_params = i == 3 ? min_params : 0;
    return TRUE;
}

/* The names of MemsimSacOp's bits, in bit order. */
static const char *const sac_op_names[] = {"mm", "addmm", "bmm", "sdpa", "topk", NULL};

static gboolean set_sac_ops(MemsimRun *r, const Setting *s, const char *v, GError **error)
{
    g_auto(GStrv) parts = g_strsplit(v, ",", -1);
    guint bits = 0;
    for (char **p = parts; *p; p++) {
        int i;
        g_strstrip(*p);
        if (!**p)
            continue;
        if (!pick(s->info.name, *p, sac_op_names, &i, error))
            return FALSE;
        bits |= 1u << i;
    }
    r->sac_ops = bits;
    return TRUE;
}

static gboolean set_torch_version(MemsimRun *r, const Setting *s, const char *v, GError **error)
{
    int maj = 0, min = 0;
    if (sscanf(v, "%d.%d", &maj, &min) != 2 || maj < 1 || (maj == 1 && min < 13) || maj > 2) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: '%s' is not a modelled release (1.13, or 2.0 to 2.9)", s->info.name, v);
        return FALSE;
    }
    g_free(r->torch_version);
    r->torch_version = g_strdup(v);
    return TRUE;
}

static gboolean set_transformers_version(MemsimRun *r, const Setting *s, const char *v,
                                         GError **error)
{
    int x;
    if (!hf_version_parse(v, &x)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: '%s' is not a modelled release (4.31 or later, as MAJOR.MINOR)",
                    s->info.name, v);
        return FALSE;
    }
    r->transformers_version = x;
    return TRUE;
}

static gboolean set_gpu(MemsimRun *r, const Setting *s, const char *v, GError **error)
{
    g_autofree char *name = g_ascii_strdown(v, -1);
    if (!gpu_known(name, error))
        return FALSE;
    g_free(r->gpu);
    r->gpu = g_steal_pointer(&name);
    return TRUE;
}

/* A real number: the time model's efficiency in (0, 1] and network-gbs in (0, 1e6]; the
 * MoE imbalance in [1, 1e6] (a factor over the uniform share, which the token count caps). */
static gboolean set_real(MemsimRun *r, const Setting *s, const char *v, GError **error)
{
    gboolean factor = s == &settings[SETTING_MOE_IMBALANCE];
    double lo = factor ? 1.0 : 0.0;
    double hi = s == &settings[SETTING_EFFICIENCY] ? 1.0 : 1e6;
    char *end = NULL;
    double d = g_ascii_strtod(v, &end);
    if (!*v || *end || !(factor ? d >= lo && d <= hi : d > lo && d <= hi)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: '%s' is not a number in %s%g, %g]", s->info.name, v, factor ? "[" : "(",
                    lo, hi);
        return FALSE;
    }
    *(double *)((char *)r + s->offset) = d;
    return TRUE;
}

const MemsimGpu *run_gpu(const MemsimRun *run, MemsimGpu *buf)
{
    const MemsimGpu *g = memsim_gpu_find(run->gpu);
    if (!g || (run->compute_efficiency <= 0 && run->network_gbs <= 0))
        return g;
    *buf = *g;
    if (run->compute_efficiency > 0)
        buf->compute_efficiency = run->compute_efficiency;
    if (run->network_gbs > 0)
        buf->network_gbs = run->network_gbs;
    return buf;
}

/* FSDP2's reshard_after_forward (_fully_shard.py fully_shard, _fsdp_init.py
 * _get_post_forward_mesh_info): True, False, or an int k, the parameters resharded after
 * forward to groups of k ranks (k = 1 is refused: torch warns that it means world size 1,
 * not True). */
static gboolean set_reshard_after_forward(MemsimRun *r, const Setting *s, const char *v,
                                          GError **error)
{
    gboolean b;
    int64_t k;
    if (setting_bool(s->info.name, v, &b, NULL) && g_ascii_isalpha(v[0])) {
        r->fsdp_reshard_after_forward = b;
        return TRUE;
    }
    if (!setting_int(s->info.name, v, 2, 1 << 20, &k, NULL)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: '%s' is not true, false or a group size of 2 or more", s->info.name, v);
        return FALSE;
    }
    r->fsdp_reshard_after_forward = (int)k;
    return TRUE;
}

/* Stores x into the field of a plain setting. */
static void store(MemsimRun *r, const Setting *s, int64_t x)
{
    char *field = (char *)r + s->offset;
    if (s->size == sizeof(int64_t)) {
        memcpy(field, &x, sizeof x);
    } else {
        g_assert(s->size == sizeof(int));
        int i = (int)x;
        memcpy(field, &i, sizeof i);
    }
}

/* Parses `v` and sets it on the run (not marking it given); FALSE with an error naming the key,
 * the run as it was. */
static gboolean set_value(MemsimRun *r, const Setting *s, const char *v, GError **error)
{
    const MemsimRunSetting *in = &s->info;
    int64_t x;
    int i;
    gboolean b;
    memsim_size_t bytes;
    if (s->set)
        return s->set(r, s, v, error);
    switch (in->kind) {
    case MEMSIM_SETTING_KIND_INT:
        if (!setting_int(in->name, v, in->min, in->max, &x, error))
            return FALSE;
        break;
    case MEMSIM_SETTING_KIND_ENUM:
        if (!pick(in->name, v, in->values, &i, error))
            return FALSE;
        x = i;
        break;
    case MEMSIM_SETTING_KIND_BOOL:
        if (!setting_bool(in->name, v, &b, error))
            return FALSE;
        x = b;
        break;
    case MEMSIM_SETTING_KIND_SIZE:
        if (!memsim_parse_size_of(in->name, v, &bytes, error))
            return FALSE;
        g_assert(s->size == sizeof bytes);
        memcpy((char *)r + s->offset, &bytes, sizeof bytes);
        return TRUE;
    default:
        g_assert_not_reached();
    }
    store(r, s, x);
    return TRUE;
}

/* ---- the run ---- */

MemsimRun memsim_run_defaults(void)
{
    MemsimRun r = {0};
    r.use_cache = -1; /* the config's */
    for (int i = 0; i < N_SETTINGS; i++)
        if (settings[i].info.default_value &&
            !set_value(&r, &settings[i], settings[i].info.default_value, NULL))
            g_error("run setting %s: its default '%s' is refused", settings[i].info.name,
                    settings[i].info.default_value);
    return r;
}

void memsim_run_clear(MemsimRun *r)
{
    g_strfreev(r->lora_targets);
    g_free(r->torch_version);
    g_free(r->gpu);
    r->lora_targets = NULL;
    r->torch_version = NULL;
    r->gpu = NULL;
}

gboolean memsim_run_set(MemsimRun *r, const char *key, const char *v, GError **error)
{
    int i = setting_find(key);
    if (i < 0) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "unknown run setting '%s'", key);
        return FALSE;
    }
    if (!v) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: no value", key);
        return FALSE;
    }
    if (!set_value(r, &settings[i], v, error))
        return FALSE;
    r->given |= (guint64)1 << i;
    return TRUE;
}

gboolean memsim_run_load_file(MemsimRun *r, const char *path, GError **error)
{
    g_autoptr(GKeyFile) kf = g_key_file_new();
    GError *e = NULL;
    if (!g_key_file_load_from_file(kf, path, G_KEY_FILE_NONE, &e)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s", path, e->message);
        g_error_free(e);
        return FALSE;
    }
    gsize n = 0;
    g_auto(GStrv) keys = g_key_file_get_keys(kf, "run", &n, &e);
    if (!keys) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s", path, e->message);
        g_error_free(e);
        return FALSE;
    }
    for (gsize i = 0; i < n; i++) {
        g_autofree char *v = g_key_file_get_string(kf, "run", keys[i], NULL);
        GError *e2 = NULL;
        if (!memsim_run_set(r, keys[i], v ? v : "", &e2)) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: [run] %s", path,
                        e2->message);
            g_error_free(e2);
            return FALSE;
        }
    }
    return TRUE;
}

MemsimResolvedRun memsim_run_resolve(const MemsimRun *run)
{
    MemsimResolvedRun rr = {0};
    rr.tp = run->tp ? run->tp : 1;
    rr.pp = run->pp ? run->pp : 1;
    /* in 64 bits: tp × pp may exceed an int (both up to 2^20) */
    rr.dp = run->dp ? run->dp : (int)(run->gpus / ((int64_t)rr.tp * rr.pp));
    rr.microbatches = run->microbatches ? run->microbatches : rr.pp;
    rr.method = run->method == MEMSIM_METHOD_NONE && (rr.tp > 1 || rr.pp > 1)
                    ? MEMSIM_METHOD_MEGATRON
                    : run->method;
    rr.distributed = run->gpus > 1 || rr.method != MEMSIM_METHOD_NONE;
    return rr;
}

/* The settings of the runs `r` is not (training-only ones given to an inference run, and the
 * other way round), the first in the table's order refused. */
static gboolean check_scope(const MemsimRun *r, GError **error)
{
    MemsimSettingScope other =
        r->inference ? MEMSIM_SETTING_SCOPE_TRAINING : MEMSIM_SETTING_SCOPE_INFERENCE;
    for (int i = 0; i < N_SETTINGS; i++) {
        const Setting *s = &settings[i];
        if (s->info.scope != other || !given(r, (SettingId)i))
            continue;
        if (s->refusal)
            return setting_refuse(error, "%s", s->refusal);
        if (r->inference)
            return setting_refuse(error,
                                  "%s: an inference run has no %s (it is a training setting)",
                                  s->info.name, s->info.name);
        return setting_refuse(error, "%s: only with --inference (training takes --seq)",
                              s->info.name);
    }
    return TRUE;
}

/* The distributed programs run the training loop of traces/loop.c, each method stepping the
 * optimizer on what it holds (DDP: torch.optim on the replica; ZeRO: DeepSpeed around the
 * flat fp32 partition; FSDP: torch.optim on the shards; Megatron: the distributed optimizer
 * on the main-parameter shard). A setting that a method's framework decides itself, or does
 * not take, is refused naming it. Without a method (plan's sweep over every method, whose
 * model-state bounds are AdamW's), whatever some method refuses is refused. */
gboolean setting_check_distributed_loop(const MemsimRun *r, gboolean megatron, GError **error)
{
    bool zero = !megatron && (r->method == MEMSIM_METHOD_ZERO1 ||
                              r->method == MEMSIM_METHOD_ZERO2 ||
                              r->method == MEMSIM_METHOD_ZERO3);
    bool sweep = !megatron && r->method == MEMSIM_METHOD_NONE;
    const char *who = megatron ? "Megatron-LM" : zero ? "DeepSpeed" : "a sweep over the methods";
    if (megatron && r->optimizer != MEMSIM_OPTIM_ADAMW)
        return setting_refuse(error, "optimizer: Megatron-LM's distributed optimizer takes only "
                                     "Adam (distrib_optimizer.py asserts it)");
    if (sweep && r->optimizer != MEMSIM_OPTIM_ADAMW)
        return setting_refuse(error, "optimizer: without --method, a run on several GPUs is "
                                     "planned over every method with AdamW's model state "
                                     "(Megatron-LM takes only Adam): give --method");
    if ((zero || megatron || sweep) && r->optimizer_impl != MEMSIM_OPTIM_IMPL_DEFAULT)
        return setting_refuse(error, "optimizer-impl: %s steps its own fused Adam "
                                     "(DeepSpeed's FusedAdam, apex/TE FusedAdam in Megatron-LM); "
                                     "DDP and FSDP take the choice",
                              who);
    if ((zero || megatron || sweep) && r->zero_grad_set && !r->zero_grad_to_none)
        return setting_refuse(error, "zero-grad: %s sets the gradients to None itself after "
                                     "each step (DeepSpeed's engine: zero_grad(set_to_none=True); "
                                     "Megatron-LM: the main grads, its grad buffer zeroed in "
                                     "place); DDP and FSDP take the choice",
                              who);
    if ((megatron || sweep) && r->keep_outputs)
        return setting_refuse(error, "keep-outputs: %s runs Megatron-LM's pipeline schedule, "
                                     "which frees each micro-batch's output itself (the data-"
                                     "parallel methods take it)",
                              megatron ? "a Megatron run" : "a sweep over the methods");
    if (megatron && r->microbatches &&
        (r->grad_accum > 1 || memsim_run_given(r, "grad-accum")) &&
        r->grad_accum != r->microbatches)
        return setting_refuse(error, "grad-accum: a Megatron run accumulates over its "
                                     "micro-batches: --grad-accum %d and --microbatches %d "
                                     "disagree (give one of them)",
                              r->grad_accum, r->microbatches);
    return TRUE;
}

/* The FSDP settings against the method and each other: what FSDP1 and FSDP2 take
 * (torch/distributed/fsdp/api.py for FSDP1; fsdp/_fully_shard/_fsdp_api.py and
 * _fully_shard.py fully_shard for FSDP2), and what memsim does not model, refused by name. */
static gboolean fsdp_check(const MemsimRun *r, GError **error)
{
    bool fsdp = r->method == MEMSIM_METHOD_FSDP || r->method == MEMSIM_METHOD_FSDP_GRAD_OP ||
                r->method == MEMSIM_METHOD_HSDP;
    bool v2 = r->fsdp_version == 1;
    for (int i = SETTING_FSDP_VERSION; i <= SETTING_FSDP_RESHARD_AFTER_FORWARD; i++)
        if (given(r, (SettingId)i) && !fsdp)
            return setting_refuse(error, "%s: only with --method fsdp, fsdp-grad-op or hsdp",
                                  setting_name((SettingId)i));
    if (given(r, SETTING_FSDP_SHARDING) && r->method != MEMSIM_METHOD_FSDP)
        return setting_refuse(error, "fsdp-sharding: with --method fsdp (--method %s already "
                                     "names its sharding strategy)",
                              setting_value_name(SETTING_METHOD, r->method));
    bool no_shard = r->method == MEMSIM_METHOD_FSDP && r->fsdp_sharding == 3;
    if (v2 && no_shard)
        return setting_refuse(error, "fsdp-sharding: FSDP2 has no NO_SHARD (fully_shard always "
                                     "shards; replicate() is DDP's): give --method ddp, or "
                                     "--fsdp-version 1");
    if (v2 && given(r, SETTING_FSDP_LIMIT_ALL_GATHERS))
        return setting_refuse(error, "fsdp-limit-all-gathers: FSDP1's rate limiter; FSDP2 has none "
                                     "(its all-gathers wait on the previous group's copy-out)");
    if (v2 && given(r, SETTING_FSDP_BACKWARD_PREFETCH))
        return setting_refuse(error, "fsdp-backward-prefetch: FSDP1's BackwardPrefetch; FSDP2 "
                                     "prefetches one group in backward (set_modules_to_backward_"
                                     "prefetch is not modelled)");
    if (v2 && given(r, SETTING_FSDP_USE_ORIG_PARAMS))
        return setting_refuse(error, "fsdp-use-orig-params: FSDP1's; FSDP2 always keeps the "
                                     "original parameters (per-parameter DTensors)");
    if (!v2 && given(r, SETTING_FSDP_RESHARD_AFTER_FORWARD))
        return setting_refuse(error, "fsdp-reshard-after-forward: FSDP2's; with FSDP1 give "
                                     "--fsdp-sharding grad-op (SHARD_GRAD_OP keeps the "
                                     "parameters from forward to backward)");
    if (v2 && r->fsdp_reshard_after_forward > 1) {
        /* _fsdp_init.py _get_post_forward_mesh_info: k must divide the shard group */
        int shard = r->method == MEMSIM_METHOD_HSDP || r->fsdp_sharding == 2
                        ? (r->gpus_per_node < r->gpus ? r->gpus_per_node : r->gpus)
                        : r->gpus;
        if (r->fsdp_reshard_after_forward >= shard || shard % r->fsdp_reshard_after_forward)
            return setting_refuse(error, "fsdp-reshard-after-forward: %d must divide the shard "
                                         "group of %d ranks and be smaller than it",
                                  r->fsdp_reshard_after_forward, shard);
    }
    if (!v2 && given(r, SETTING_FSDP_OUTPUT_DTYPE))
        return setting_refuse(error, "fsdp-output-dtype: FSDP2's MixedPrecisionPolicy "
                                     "output_dtype; FSDP1's MixedPrecision has none: give "
                                     "--fsdp-version 2");
    if (v2 && given(r, SETTING_FSDP_OUTPUT_DTYPE)) {
        /* the dtype the blocks compute in: param_dtype, else the precision's */
        int pdt = given(r, SETTING_FSDP_PARAM_DTYPE) ? r->fsdp_param_dtype
                  : r->precision == MEMSIM_PREC_BF16 || r->precision == MEMSIM_PREC_BF16_MIXED ? 1
                  : r->precision == MEMSIM_PREC_FP16 || r->precision == MEMSIM_PREC_FP16_MIXED ? 2
                                                                                              : 0;
        /* _fsdp_state.py _post_forward casts each block's outputs to output_dtype (t.to: no
         * new tensor when it is the dtype already); the next block's pre_forward casts them
         * back to param_dtype, but the root's own modules after the last block (norm, output
         * projection) take the cast activation as it is: F.linear of it against weights in
         * param_dtype raises a dtype mismatch without autocast */
        if (r->fsdp_output_dtype != pdt)
            return setting_refuse(error, "fsdp-output-dtype: %s outputs from blocks computing in "
                                         "%s reach the root's norm and output projection uncast "
                                         "(F.linear raises a dtype mismatch); only the blocks' "
                                         "own dtype (%s) is modelled",
                                  setting_value_name(SETTING_FSDP_OUTPUT_DTYPE,
                                                     r->fsdp_output_dtype),
                                  setting_value_name(SETTING_FSDP_OUTPUT_DTYPE, pdt),
                                  setting_value_name(SETTING_FSDP_OUTPUT_DTYPE, pdt));
    }
    if (fsdp && r->fsdp_wrap_model == 3 && v2)
        return setting_refuse(error, "fsdp-wrap: size is FSDP1's size_based_auto_wrap_policy; "
                                     "FSDP2's fully_shard takes no auto-wrap policy (give layer "
                                     "or model)");
    if (fsdp && r->fsdp_wrap_model == 3 && r->finetune != MEMSIM_FT_FULL)
        return setting_refuse(error, "fsdp-wrap: size with LoRA/QLoRA (size-based units mixing "
                                     "frozen and trained parameters) is not modelled: give lora "
                                     "or layer");
    if (fsdp && r->fsdp_wrap_model == 2 && r->finetune == MEMSIM_FT_FULL)
        return setting_refuse(error, "fsdp-wrap: lora wraps the trained adapters apart (peft "
                                     "fsdp_auto_wrap_policy); give --finetune lora or qlora");
    if (v2 && r->finetune != MEMSIM_FT_FULL)
        return setting_refuse(error, "finetune: FSDP2 with LoRA/QLoRA (per-parameter shards of "
                                     "a frozen base) is not modelled: give --fsdp-version 1");
    if (fsdp && given(r, SETTING_FSDP_USE_ORIG_PARAMS) && !r->fsdp_use_orig_params &&
        r->finetune != MEMSIM_FT_FULL && r->fsdp_wrap_model != 2)
        return setting_refuse(error, "fsdp-use-orig-params: false with LoRA: a FlatParameter "
                                     "mixing frozen and trained parameters needs "
                                     "use_orig_params=True (_flat_param.py _init_flat_param_"
                                     "attributes)");
    if (fsdp && given(r, SETTING_FSDP_PARAM_DTYPE) && r->fsdp_param_dtype == 0 &&
        (r->precision == MEMSIM_PREC_BF16 || r->precision == MEMSIM_PREC_FP16))
        return setting_refuse(error, "fsdp-param-dtype: fp32 with --precision %s: the model is "
                                     "cast to half precision; give --precision fp32 or %s-mixed "
                                     "(torch.autocast on fp32 parameters)",
                              setting_value_name(SETTING_PRECISION, r->precision),
                              r->precision == MEMSIM_PREC_BF16 ? "bf16" : "fp16");
    if (fsdp && r->fsdp_offload && no_shard)
        return setting_refuse(error, "fsdp-offload: CPU offload with NO_SHARD is not modelled");
    if (fsdp && r->fsdp_offload && r->optimizer != MEMSIM_OPTIM_ADAMW &&
        r->optimizer != MEMSIM_OPTIM_SGD && r->optimizer != MEMSIM_OPTIM_SGD_MOMENTUM)
        return setting_refuse(error, "fsdp-offload: the optimizer steps on the CPU; memsim "
                                     "models AdamW and SGD there, not %s",
                              setting_value_name(SETTING_OPTIMIZER, r->optimizer));
    if (fsdp && r->fsdp_offload && r->finetune != MEMSIM_FT_FULL)
        return setting_refuse(error, "fsdp-offload: CPU offload with LoRA/QLoRA is not modelled");
    return TRUE;
}

gboolean memsim_run_check(const MemsimRun *r, GError **error)
{
#define GIVEN(id) given(r, SETTING_##id)
    if (r->gpu && !gpu_known(r->gpu, error))
        return FALSE;
    if (!check_scope(r, error))
        return FALSE;
    /* a Megatron-LM launch: its layout against Megatron's own checks (traces/megatron.c), which
     * name its flags */
    if (r->megatron && !mg_check_run(r->megatron, r, error))
        return FALSE;
    /* a DeepSpeed config: its ZeRO stage is the method; what it does not cover is refused */
    if (r->deepspeed) {
        const DsZero *z = &r->deepspeed->z;
        MemsimMethod want = z->stage == 1   ? MEMSIM_METHOD_ZERO1
                            : z->stage == 2 ? MEMSIM_METHOD_ZERO2
                                            : MEMSIM_METHOD_ZERO3;
        if (r->inference)
            return setting_refuse(error, "inference: --deepspeed-config %s describes training",
                                  r->deepspeed->source);
        if (r->method != want)
            return setting_refuse(error, "method: %s with --deepspeed-config %s, whose "
                                         "zero_optimization.stage is %d",
                                  setting_value_name(SETTING_METHOD, r->method), r->deepspeed->source,
                                  z->stage);
        /* gradients reduced or accumulated in another dtype than the parameters' */
        int pdt = r->precision == MEMSIM_PREC_FP32                                           ? 32
                  : r->precision == MEMSIM_PREC_FP16 || r->precision == MEMSIM_PREC_FP16_MIXED ? 16
                                                                                              : 17;
        const char *dk = r->deepspeed->comm_dtype && r->deepspeed->comm_dtype != pdt
                             ? "communication_data_type"
                         : r->deepspeed->accum_dtype && r->deepspeed->accum_dtype != pdt
                             ? "data_types.grad_accum_dtype"
                             : NULL;
        if (dk)
            return setting_refuse(error, "%s (--deepspeed-config %s): gradients reduced or "
                                         "accumulated in another dtype than the parameters' (%s) "
                                         "are not modelled",
                                  dk, r->deepspeed->source,
                                  pdt == 32 ? "fp32" : pdt == 16 ? "fp16" : "bf16");
        if ((z->offload_optimizer || z->offload_param) && r->finetune != MEMSIM_FT_FULL)
            return setting_refuse(error, "finetune: %s with the offload of --deepspeed-config %s "
                                         "is not modelled (full fine-tuning is)",
                                  setting_value_name(SETTING_FINETUNE, r->finetune), r->deepspeed->source);
    }
    if ((GIVEN(LORA_RANK) || GIVEN(LORA_TARGETS)) && r->finetune == MEMSIM_FT_FULL)
        return setting_refuse(
            error, "%s: only with --finetune lora or qlora",
            setting_name(GIVEN(LORA_RANK) ? SETTING_LORA_RANK : SETTING_LORA_TARGETS));
    MemsimResolvedRun rr = memsim_run_resolve(r);
    gboolean megatron = rr.method == MEMSIM_METHOD_MEGATRON;
    if (GIVEN(TRANSFORMERS_VERSION) && (megatron || r->megatron))
        return setting_refuse(error, "transformers-version: a Megatron run is Megatron-LM's "
                                     "model code, not Transformers'");
    if (GIVEN(SAC_OPS) && r->checkpointing != MEMSIM_CKPT_SAC_OP)
        return setting_refuse(error, "sac-ops: only with --checkpointing sac-op");
    if ((r->checkpointing == MEMSIM_CKPT_SAC_OP || r->checkpointing == MEMSIM_CKPT_SAC_LAYER) &&
        (megatron || r->megatron))
        return setting_refuse(error,
                              "checkpointing: %s is torchtitan's checkpoint wrapper around each "
                              "TransformerBlock; a Megatron run recomputes as Megatron-LM does "
                              "(--recompute-granularity: full or selective)",
                              setting_value_name(SETTING_CHECKPOINTING, r->checkpointing));
    if (GIVEN(SEQUENCE_PARALLEL) && r->sequence_parallel && rr.tp < 2)
        return setting_refuse(error,
                              "sequence-parallel: needs tensor parallelism (--tp 2 or more)");
    if (GIVEN(MICROBATCHES) && !megatron)
        return setting_refuse(error, "microbatches: Megatron's micro-batches per step need "
                                     "--method megatron or --tp/--pp (elsewhere accumulation is "
                                     "--grad-accum)");
    if (GIVEN(PP_SCHEDULE) && !megatron)
        return setting_refuse(error, "pp-schedule: needs a Megatron run (--pp 2 or more)");
    if (GIVEN(VIRTUAL_STAGES) && r->virtual_stages > 1 && r->pp_schedule != MEMSIM_PP_INTERLEAVED)
        return setting_refuse(error, "virtual-stages: only with --pp-schedule interleaved");
    if (GIVEN(FSDP_WRAP) && r->method != MEMSIM_METHOD_FSDP &&
        r->method != MEMSIM_METHOD_FSDP_GRAD_OP && r->method != MEMSIM_METHOD_HSDP)
        return setting_refuse(error, "fsdp-wrap: only with --method fsdp, fsdp-grad-op or hsdp");
    if (!fsdp_check(r, error))
        return FALSE;
    /* torch.distributed.optim.ZeroRedundancyOptimizer wraps a torch.optim optimizer of DDP's
     * replicas; DeepSpeed's and FSDP's sharding are --method zero1/2/3 and fsdp */
    if (GIVEN(ZERO_REDUNDANCY) && r->zero_redundancy && rr.method != MEMSIM_METHOD_DDP)
        return setting_refuse(error, "zero-redundancy: torch's ZeroRedundancyOptimizer wraps the "
                                     "optimizer of a DDP run: only with --method ddp (DeepSpeed's "
                                     "ZeRO is --method zero1/zero2/zero3)");
    if (rr.distributed && !r->inference && !setting_check_distributed_loop(r, megatron, error))
        return FALSE;
    if (r->gpus < 2 && (rr.tp > 1 || rr.pp > 1 || rr.dp > 1))
        return setting_refuse(error, "gpus: --tp, --pp and --dp describe a run on several GPUs: "
                                     "give --gpus (tp × pp × dp)");
    if (GIVEN(GPUS_PER_NODE) && r->gpus < 2)
        return setting_refuse(error,
                              "gpus-per-node: a run on one GPU has no nodes to span: give --gpus");
#undef GIVEN
    return TRUE;
}

/* The name of value `i` of an ENUM setting. */
static const char *value_name(SettingId id, int i)
{
    g_assert(settings[id].info.kind == MEMSIM_SETTING_KIND_ENUM && i >= 0 &&
             i < (int)g_strv_length((char **)settings[id].info.values));
    return settings[id].info.values[i];
}

char *memsim_run_describe(const MemsimRun *run)
{
    GString *s = g_string_new(NULL);
    if (run->inference) {
        g_string_append_printf(s,
                               "inference: batch %" G_GINT64_FORMAT ", prompt %" G_GINT64_FORMAT
                               ", generate %" G_GINT64_FORMAT ", %s weights, attention %s",
                               run->batch, run->prompt, run->generate,
                               run->weights == MEMSIM_WEIGHTS_4BIT ? "4-bit"
                               : run->weights == MEMSIM_WEIGHTS_INT8
                                   ? "int8"
                                   : value_name(SETTING_PRECISION, run->precision),
                               value_name(SETTING_ATTENTION, run->attention));
    } else {
        MemsimOptimizerImpl impl;
        gboolean to_none;
        optim_choice(run, memsim_run_resolve(run).method, &impl, &to_none);
        g_string_append_printf(
            s,
            "batch %" G_GINT64_FORMAT ", seq %" G_GINT64_FORMAT "%s, %d step(s), grad-accum %d, "
            "%s, %s (%s), zero_grad %s",
            run->batch, run->seq,
            /* memsim_run_adapt cut a sequence that was not given */
            !given(run, SETTING_SEQ) && run->seq != memsim_run_defaults().seq
                ? " (the model's context)"
                : "",
            run->steps, run->grad_accum, value_name(SETTING_PRECISION, run->precision),
            value_name(SETTING_OPTIMIZER, run->optimizer), value_name(SETTING_OPTIMIZER_IMPL, impl),
            to_none ? "to None" : "in place");
        /* a Megatron launch says its attention and recomputation in its own part */
        if (!run->megatron) {
            g_string_append_printf(s, ", attention %s, checkpointing %s",
                                   value_name(SETTING_ATTENTION, run->attention),
                                   value_name(SETTING_CHECKPOINTING, run->checkpointing));
            if (run->checkpointing == MEMSIM_CKPT_SAC_LAYER)
                g_string_append_printf(s, ":%d", run->sac_every);
            if (run->checkpointing == MEMSIM_CKPT_SAC_OP) {
                g_string_append(s, " (keeps");
                const char *sep = " ";
                for (int i = 0; sac_op_names[i]; i++)
                    if (run->sac_ops >> i & 1) {
                        g_string_append_printf(s, "%s%s", sep,
                                               i == 0 ? "every other mm" : sac_op_names[i]);
                        sep = ", ";
                    }
                g_string_append(s, *sep == ' ' ? " nothing)" : ")");
            }
            g_string_append_printf(s, ", finetune %s", value_name(SETTING_FINETUNE, run->finetune));
        }
        if (run->finetune != MEMSIM_FT_FULL) {
            g_autofree char *t = run->lora_targets ? g_strjoinv(",", run->lora_targets) : NULL;
            g_string_append_printf(s, " (rank %d, targets %s)", run->lora_rank, t ? t : "default");
        }
    }
    MemsimResolvedRun rr = memsim_run_resolve(run);
    if (rr.distributed) {
        g_string_append_printf(s, ", %d GPUs: %s", run->gpus,
                               value_name(SETTING_METHOD, rr.method));
        if (rr.method == MEMSIM_METHOD_DDP && run->zero_redundancy)
            g_string_append(s, " + ZeroRedundancyOptimizer");
        if (rr.method == MEMSIM_METHOD_MEGATRON) {
            g_string_append_printf(s, " tp %d × pp %d × dp %d", rr.tp, rr.pp, rr.dp);
            if (rr.pp > 1)
                g_string_append_printf(s, ", %s, %d micro-batches",
                                       value_name(SETTING_PP_SCHEDULE, run->pp_schedule),
                                       rr.microbatches);
            if (run->sequence_parallel)
                g_string_append(s, ", sequence parallel");
        }
        if ((rr.method == MEMSIM_METHOD_FSDP || rr.method == MEMSIM_METHOD_FSDP_GRAD_OP ||
             rr.method == MEMSIM_METHOD_HSDP) &&
            (run->given >> SETTING_FSDP_VERSION & ((1u << (SETTING_FSDP_RESHARD_AFTER_FORWARD -
                                                           SETTING_FSDP_VERSION + 1)) - 1) ||
             run->fsdp_wrap_model == 3)) {
            /* the FSDP configuration, when any of it was given */
            g_string_append_printf(s, " (FSDP%d", run->fsdp_version + 1);
            if (given(run, SETTING_FSDP_SHARDING))
                g_string_append_printf(s, ", %s", value_name(SETTING_FSDP_SHARDING,
                                                             run->fsdp_sharding));
            if (given(run, SETTING_FSDP_PARAM_DTYPE))
                g_string_append_printf(s, ", param %s", value_name(SETTING_FSDP_PARAM_DTYPE,
                                                                   run->fsdp_param_dtype));
            if (given(run, SETTING_FSDP_OUTPUT_DTYPE))
                g_string_append_printf(s, ", output %s", value_name(SETTING_FSDP_OUTPUT_DTYPE,
                                                                    run->fsdp_output_dtype));
            if (run->fsdp_wrap_model == 3)
                g_string_append_printf(s, ", size-based wrap at %" G_GINT64_FORMAT " parameters",
                                       run->fsdp_wrap_min_params);
            if (given(run, SETTING_FSDP_REDUCE_DTYPE))
                g_string_append_printf(s, ", reduce %s", value_name(SETTING_FSDP_REDUCE_DTYPE,
                                                                    run->fsdp_reduce_dtype));
            if (run->fsdp_offload)
                g_string_append(s, ", CPU offload");
            if (given(run, SETTING_FSDP_RESHARD_AFTER_FORWARD) && !run->fsdp_reshard_after_forward)
                g_string_append(s, ", no reshard after forward");
            if (run->fsdp_reshard_after_forward > 1)
                g_string_append_printf(s, ", reshard after forward to %d",
                                       run->fsdp_reshard_after_forward);
            if (given(run, SETTING_FSDP_BACKWARD_PREFETCH))
                g_string_append_printf(s, ", backward prefetch %s",
                                       value_name(SETTING_FSDP_BACKWARD_PREFETCH,
                                                  run->fsdp_backward_prefetch));
            if (given(run, SETTING_FSDP_LIMIT_ALL_GATHERS) && !run->fsdp_limit_all_gathers)
                g_string_append(s, ", no all-gather limit");
            if (given(run, SETTING_FSDP_USE_ORIG_PARAMS) && run->fsdp_use_orig_params)
                g_string_append(s, ", use_orig_params");
            g_string_append(s, ")");
        }
    }
    if (run->moe_imbalance > 1)
        g_string_append_printf(s, ", MoE imbalance %g", run->moe_imbalance);
    g_string_append_printf(s, ", torch %s%s", run->torch_version ? run->torch_version : "2.8",
                           run->device_cpu ? " (CPU kernels)" : "");
    if (run->transformers_version)
        g_string_append_printf(s, ", transformers %d.%d", run->transformers_version / 1000,
                               run->transformers_version % 1000);
    if (run->megatron) {
        g_autofree char *mg = mg_describe(run->megatron, run);
        g_string_append_printf(s, "; %s", mg);
    }
    if (run->deepspeed) {
        g_autofree char *ds = ds_describe(run->deepspeed);
        g_string_append_printf(s, "; %s", ds);
    }
    return g_string_free(s, FALSE);
}
