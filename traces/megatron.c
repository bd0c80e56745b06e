/* A Megatron-LM launch (include/memsim/megatron.h): its flags, read from the launch's text
 * (traces/launch.c), taken as Megatron's argparse takes them, Megatron's defaults applied and its
 * checks made, and the result mapped to a MemsimModel (family megatron), a MemsimRun and
 * MgOptions.
 *
 * The source of every rule is Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553; a
 * file:line below is at that commit (megatron/training/arguments.py unless another file is
 * named; argument_utils.py is megatron/training/argument_utils.py, training_config.py
 * megatron/training/config/training_config.py, transformer_config.py, model_parallel_config.py,
 * transformer_block.py and schedules.py are under megatron/core/).
 *
 * The world size: torchrun's (or python -m torch.distributed.run's) --nproc-per-node ×
 * --nnodes; else WORLD_SIZE, which Megatron itself reads (arguments.py:144); else
 * GPUS_PER_NODE × NUM_NODES, the names of Megatron's example scripts and CI harness; else 1,
 * and 8 for a test's YAML as the harness runs it (_run_training.sh:201-202), which the caller
 * may change (memsim_megatron_set_gpus). A launch that gives its world size is checked as it is
 * read; another when its world size is known (memsim_run_check).
 *
 * Every flag memsim knows is in one table, flags[], with what memsim does with it: MAPPED into
 * the model, the run or MgOptions; NEUTRAL, memory-neutral (paths, the learning-rate schedule,
 * logging, checkpoint formats, seeds, …) and accepted silently; SMALL, a small change of
 * memory memsim does not model, accepted with a warning; REFUSED, a change memsim does not
 * model (fp8, MoE, multi-latent attention, …), refused naming the flag; REMOVED, a flag
 * Megatron itself refuses. A flag in no table is named in one warning and ignored.
 */
#include "traces/megatron.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "traces/launch.h"
#include "traces/model.h"
#include "traces/settings.h"

#define UNSET (-1)

static gboolean bad(GError **error, const char *where, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static gboolean bad(GError **error, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s", where, msg);
    return FALSE;
}

/* ---- Megatron's flags ---- */

/* What argparse gives a flag memsim reads (names as arguments.py's dest; UNSET = None). */
typedef struct {
    /* the model (arguments.py:2278-2462, transformer_config.py:65-260) */
    int64_t num_layers, encoder_num_layers, hidden_size, ffn_hidden_size, num_attention_heads;
    int64_t num_query_groups, kv_channels, max_position_embeddings, vocab_size, padded_vocab_size;
    int64_t make_vocab_size_divisible_by, seq_length, encoder_seq_length;
    bool group_query_attention, swiglu, untie, add_bias_linear, add_qkv_bias, qk_layernorm;
    bool use_rotary_position_embeddings, add_position_embedding;
    char *normalization, *position_embedding_type, *tokenizer_type;
    double rotary_percent, hidden_dropout, attention_dropout;
    /* parallelism (model_parallel_config.py:55-100, arguments.py:3089-3232) */
    int64_t tp, pp, cp, nlpvs, nvspr, first, last, mb_group;
    bool sequence_parallel, account_emb, account_loss, warmup_flush, overlap_p2p_comm;
    /* the batch (training_config.py:11-15, 42) */
    int64_t micro_batch_size, global_batch_size;
    bool decrease_batch;
    /* precision (arguments.py:3050-3087, model_parallel_config.py:177-180) */
    bool bf16, fp16, accumulate_fp32, grad_reduce_bf16;
    double loss_scale;
    /* the optimizer and data parallelism */
    char *optimizer, *ckpt_format;
    bool distributed_optimizer, overlap_grad_reduce, overlap_param_gather;
    bool overlap_param_gather_with_step, grad_accum_fusion, log_params_norm, log_num_zeros;
    bool check_nan;
    int64_t optimizer_instances, ddp_bucket_size;
    double clip_grad;
    /* recomputation (transformer_config.py:532-557, arguments.py:2869) */
    char *recompute_granularity, *recompute_method;
    int64_t recompute_num_layers;
    bool recompute_activations;
    /* the layers' implementation */
    char *transformer_impl, *attention_backend, *ce_fusion_impl;
    bool softmax_fp32, qk_layer_scaling, masked_softmax_fusion, bias_dropout_fusion;
    bool bias_gelu_fusion, bias_swiglu_fusion, rope_fusion, ce_fusion, defer_embedding_wgrad;
    bool attention_mask, deterministic;
    int64_t wgrad_deferral_limit;
} Args;

/* argparse's defaults (None is UNSET). */
static void args_init(Args *a)
{
    memset(a, 0, sizeof *a);
    int64_t *unset[] = {&a->num_layers,
                        &a->encoder_num_layers,
                        &a->hidden_size,
                        &a->ffn_hidden_size,
                        &a->num_attention_heads,
                        &a->kv_channels,
                        &a->max_position_embeddings,
                        &a->vocab_size,
                        &a->padded_vocab_size,
                        &a->seq_length,
                        &a->encoder_seq_length,
                        &a->nlpvs,
                        &a->nvspr,
                        &a->first,
                        &a->last,
                        &a->mb_group,
                        &a->micro_batch_size,
                        &a->global_batch_size,
                        &a->ddp_bucket_size,
                        &a->recompute_num_layers};
    for (gsize i = 0; i < G_N_ELEMENTS(unset); i++)
        *unset[i] = UNSET;
    a->num_query_groups = 1;               /* transformer_config.py:175-177 (argparse default 1) */
    a->make_vocab_size_divisible_by = 128; /* arguments.py:2441 */
    a->add_bias_linear = true;             /* transformer_config.py:212-213 */
    a->add_position_embedding = true;      /* arguments.py:2436 (--no-position-embedding) */
    a->rotary_percent = 1.0;               /* arguments.py:2420 */
    a->hidden_dropout = 0.1;               /* transformer_config.py:188 */
    a->attention_dropout = 0.1;            /* transformer_config.py:191 */
    a->tp = a->pp = a->cp = 1;             /* model_parallel_config.py:55, 83, 100 */
    a->overlap_p2p_comm = true;            /* arguments.py:3118 (--no-overlap-p2p-communication) */
    a->loss_scale = -1.0;                  /* arguments.py:3055: None, dynamic scaling */
    a->optimizer_instances = 1;            /* arguments.py:3216 */
    a->grad_accum_fusion = true;           /* arguments.py:2944 */
    a->check_nan = true;                   /* arguments.py:2872 (--no-check-for-nan-in-loss-and-grad) */
    a->clip_grad = 1.0;                    /* arguments.py:2615 */
    a->masked_softmax_fusion = a->bias_dropout_fusion = a->bias_gelu_fusion = true; /* :2887-2901 */
    a->bias_swiglu_fusion = a->rope_fusion = true; /* :2895, 2902 */
    a->attention_mask = true;                      /* arguments.py:3332 */
}

static void args_clear(Args *a)
{
    char **s[] = {&a->normalization,     &a->position_embedding_type,
                  &a->tokenizer_type,    &a->optimizer,
                  &a->ckpt_format,       &a->recompute_granularity,
                  &a->recompute_method,  &a->transformer_impl,
                  &a->attention_backend, &a->ce_fusion_impl};
    for (gsize i = 0; i < G_N_ELEMENTS(s); i++)
        g_clear_pointer(s[i], g_free);
}

/* What a flag takes after it. */
typedef enum {
    TAKES_NONE, /* store_true / store_false */
    TAKES_ONE,
    TAKES_LIST, /* nargs='+' or '*' */
    TAKES_ANY,  /* a flag memsim only accepts: whatever follows up to the next flag */
} Takes;

typedef enum {
    ROLE_MAPPED,  /* read into the model, the run or MgOptions */
    ROLE_NEUTRAL, /* does not change memory: accepted silently */
    ROLE_SMALL,   /* changes memory a little, not modelled: accepted with a warning */
    ROLE_REFUSED, /* changes memory in a way memsim does not model: refused */
    ROLE_REMOVED, /* a flag Megatron itself refuses */
} Role;

typedef enum { V_INT, V_NUM, V_STR, V_TRUE, V_FALSE } ValueKind;

typedef struct {
    const char *name; /* without "--", words joined by '-'; a trailing '*' matches a prefix */
    Takes takes;
    Role role;
    ValueKind kind; /* MAPPED: how the value is stored at offset */
    size_t offset;
    int64_t min, max;           /* V_INT: the bounds memsim takes */
    const char *const *choices; /* V_STR: argparse's choices (NULL = any) */
    const char *why;            /* SMALL, REFUSED: what is not modelled; REMOVED: Megatron's word */
    const char *harmless;       /* REFUSED: a value that changes nothing (the default) */
} Flag;

#define CHOICES(...) ((const char *const[]){__VA_ARGS__, NULL})
#define AT(f) offsetof(Args, f)
#define INT(n, f, lo, hi)                                                                          \
    {                                                                                              \
        n, TAKES_ONE, ROLE_MAPPED, V_INT, AT(f), lo, hi, NULL, NULL, NULL                          \
    }
#define NUM(n, f)                                                                                  \
    {                                                                                              \
        n, TAKES_ONE, ROLE_MAPPED, V_NUM, AT(f), 0, 0, NULL, NULL, NULL                            \
    }
#define STR(n, f, ...)                                                                             \
    {                                                                                              \
        n, TAKES_ONE, ROLE_MAPPED, V_STR, AT(f), 0, 0, CHOICES(__VA_ARGS__), NULL, NULL            \
    }
#define ON(n, f)                                                                                   \
    {                                                                                              \
        n, TAKES_NONE, ROLE_MAPPED, V_TRUE, AT(f), 0, 0, NULL, NULL, NULL                          \
    }
#define OFF(n, f)                                                                                  \
    {                                                                                              \
        n, TAKES_NONE, ROLE_MAPPED, V_FALSE, AT(f), 0, 0, NULL, NULL, NULL                         \
    }
#define NEUTRAL(n)                                                                                 \
    {                                                                                              \
        n, TAKES_ANY, ROLE_NEUTRAL, 0, 0, 0, 0, NULL, NULL, NULL                                   \
    }
#define SMALL(n, why)                                                                              \
    {                                                                                              \
        n, TAKES_ANY, ROLE_SMALL, 0, 0, 0, 0, NULL, why, NULL                                      \
    }
#define REFUSED(n, why)                                                                            \
    {                                                                                              \
        n, TAKES_ANY, ROLE_REFUSED, 0, 0, 0, 0, NULL, why, NULL                                    \
    }
#define REFUSED_UNLESS(n, ok, why)                                                                 \
    {                                                                                              \
        n, TAKES_ANY, ROLE_REFUSED, 0, 0, 0, 0, NULL, why, ok                                      \
    }
#define REMOVED(n, why)                                                                            \
    {                                                                                              \
        n, TAKES_ANY, ROLE_REMOVED, 0, 0, 0, 0, NULL, why, NULL                                    \
    }

#define BIG ((int64_t)1 << 40)
#define TOKENIZERS                                                                                 \
    "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",   \
        "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",    \
        "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"

/* Every Megatron flag memsim knows (training_config.py:698-711 for the tokenizers). Exact names
 * are looked up before prefixes. */
static const Flag flags[] = {
    /* ---- mapped: the model ---- */
    INT("num-layers", num_layers, 1, 10000),
    INT("encoder-num-layers", encoder_num_layers, 1, 10000),
    INT("hidden-size", hidden_size, 1, (int64_t)1 << 20),
    INT("ffn-hidden-size", ffn_hidden_size, 1, (int64_t)1 << 22),
    INT("num-attention-heads", num_attention_heads, 1, (int64_t)1 << 16),
    INT("num-query-groups", num_query_groups, 1, (int64_t)1 << 16),
    INT("kv-channels", kv_channels, 1, (int64_t)1 << 16),
    INT("max-position-embeddings", max_position_embeddings, 1, (int64_t)1 << 26),
    INT("vocab-size", vocab_size, 1, (int64_t)1 << 24),
    INT("padded-vocab-size", padded_vocab_size, 1, (int64_t)1 << 24),
    INT("make-vocab-size-divisible-by", make_vocab_size_divisible_by, 1, (int64_t)1 << 20),
    INT("seq-length", seq_length, 1, (int64_t)1 << 24),
    INT("encoder-seq-length", encoder_seq_length, 1, (int64_t)1 << 24),
    ON("group-query-attention", group_query_attention),
    ON("swiglu", swiglu),
    ON("untie-embeddings-and-output-weights", untie),
    OFF("disable-bias-linear", add_bias_linear),
    ON("add-qkv-bias", add_qkv_bias),
    ON("qk-layernorm", qk_layernorm),
    ON("use-rotary-position-embeddings", use_rotary_position_embeddings),
    OFF("no-position-embedding", add_position_embedding),
    STR("normalization", normalization, "LayerNorm", "RMSNorm"),
    STR("position-embedding-type", position_embedding_type, "learned_absolute", "rope", "yarn",
        "mrope", "relative", "none"),
    STR("tokenizer-type", tokenizer_type, TOKENIZERS),
    NUM("rotary-percent", rotary_percent),
    NUM("hidden-dropout", hidden_dropout),
    NUM("attention-dropout", attention_dropout),
    /* ---- mapped: parallelism and the batch ---- */
    INT("tensor-model-parallel-size", tp, 1, 1 << 20),
    INT("pipeline-model-parallel-size", pp, 1, 1 << 20),
    INT("context-parallel-size", cp, 1, 1 << 20),
    INT("num-layers-per-virtual-pipeline-stage", nlpvs, 1, 10000),
    INT("num-virtual-stages-per-pipeline-rank", nvspr, 1, 1024),
    INT("decoder-first-pipeline-num-layers", first, 1, 10000),
    INT("decoder-last-pipeline-num-layers", last, 1, 10000),
    INT("microbatch-group-size-per-virtual-pipeline-stage", mb_group, 1, 1 << 16),
    ON("sequence-parallel", sequence_parallel),
    ON("account-for-embedding-in-pipeline-split", account_emb),
    ON("account-for-loss-in-pipeline-split", account_loss),
    ON("overlap-p2p-communication-warmup-flush", warmup_flush),
    OFF("no-overlap-p2p-communication", overlap_p2p_comm),
    INT("micro-batch-size", micro_batch_size, 1, 1 << 20),
    INT("global-batch-size", global_batch_size, 1, BIG),
    ON("decrease-batch-size-if-needed", decrease_batch),
    /* ---- mapped: precision, optimizer, data parallelism ---- */
    ON("bf16", bf16),
    ON("fp16", fp16),
    NUM("loss-scale", loss_scale),
    ON("accumulate-allreduce-grads-in-fp32", accumulate_fp32),
    ON("grad-reduce-in-bf16", grad_reduce_bf16),
    STR("optimizer", optimizer, "adam", "sgd", "muon", "dist_muon", "lion", "soap",
        "adaptive_muon"),
    ON("use-distributed-optimizer", distributed_optimizer),
    INT("num-distributed-optimizer-instances", optimizer_instances, 1, 1 << 20),
    ON("overlap-grad-reduce", overlap_grad_reduce),
    ON("overlap-param-gather", overlap_param_gather),
    ON("overlap-param-gather-with-optimizer-step", overlap_param_gather_with_step),
    INT("ddp-bucket-size", ddp_bucket_size, 1, BIG),
    OFF("no-gradient-accumulation-fusion", grad_accum_fusion),
    NUM("clip-grad", clip_grad),
    ON("log-params-norm", log_params_norm),
    ON("log-num-zeros-in-grad", log_num_zeros),
    STR("ckpt-format", ckpt_format, "torch", "torch_dist", "torch_dcp", "fsdp_dtensor"),
    /* ---- mapped: recomputation and the layers' implementation ---- */
    STR("recompute-granularity", recompute_granularity, "full", "selective"),
    STR("recompute-method", recompute_method, "uniform", "block"),
    INT("recompute-num-layers", recompute_num_layers, 0, 10000),
    ON("recompute-activations", recompute_activations),
    STR("transformer-impl", transformer_impl, "local", "transformer_engine", "inference_optimized"),
    STR("attention-backend", attention_backend, "flash", "fused", "unfused", "local", "auto"),
    ON("attention-softmax-in-fp32", softmax_fp32),
    ON("apply-query-key-layer-scaling", qk_layer_scaling),
    OFF("no-masked-softmax-fusion", masked_softmax_fusion),
    OFF("no-bias-dropout-fusion", bias_dropout_fusion),
    OFF("no-bias-gelu-fusion", bias_gelu_fusion),
    OFF("no-bias-swiglu-fusion", bias_swiglu_fusion),
    OFF("no-rope-fusion", rope_fusion),
    ON("cross-entropy-loss-fusion", ce_fusion),
    STR("cross-entropy-fusion-impl", ce_fusion_impl, "native", "te"),
    ON("defer-embedding-wgrad-compute", defer_embedding_wgrad),
    INT("wgrad-deferral-limit", wgrad_deferral_limit, 0, 1 << 20),
    OFF("no-create-attention-mask-in-dataloader", attention_mask),
    ON("deterministic-mode", deterministic),

    /* ---- memory-neutral: data, tokenizer files, schedules, logging, checkpoints, seeds ---- */
    NEUTRAL("data-path"),
    NEUTRAL("train-data-path"),
    NEUTRAL("valid-data-path"),
    NEUTRAL("test-data-path"),
    NEUTRAL("data-args-path"),
    NEUTRAL("per-split-data-args-path"),
    NEUTRAL("per-dataset-sequences-path"),
    NEUTRAL("data-cache-path"),
    NEUTRAL("split"),
    NEUTRAL("mock-data"),
    NEUTRAL("num-workers"),
    NEUTRAL("num-dataset-builder-threads"),
    NEUTRAL("dataloader-type"),
    NEUTRAL("dataloader-fast-cache-load"),
    NEUTRAL("dataloader-defer-npy-index-mmap"),
    NEUTRAL("no-mmap-bin-files"),
    NEUTRAL("object-storage-cache-path"),
    NEUTRAL("mid-level-dataset-surplus"),
    NEUTRAL("eod-mask-loss"),
    NEUTRAL("reset-position-ids"),
    NEUTRAL("allow-ambiguous-pad-tokens"),
    NEUTRAL("vocab-file"),
    NEUTRAL("merge-file"),
    NEUTRAL("tokenizer-model"),
    NEUTRAL("tokenizer-metadata"),
    NEUTRAL("tokenizer-hf-*"),
    NEUTRAL("trust-remote-code"),
    NEUTRAL("null-tokenizer-eod-id"),
    NEUTRAL("null-tokenizer-pad-id"),
    NEUTRAL("train-iters"),
    NEUTRAL("train-samples"),
    NEUTRAL("exit-interval"),
    NEUTRAL("exit-duration-in-mins"),
    NEUTRAL("exit-signal-handler"),
    NEUTRAL("exit-on-missing-checkpoint"),
    NEUTRAL("eval-iters"),
    NEUTRAL("eval-interval"),
    NEUTRAL("skip-train"),
    NEUTRAL("full-validation"),
    NEUTRAL("seed"),
    NEUTRAL("data-parallel-random-init"),
    NEUTRAL("te-rng-tracker"),
    NEUTRAL("init-method-std"),
    NEUTRAL("init-method-xavier-uniform"),
    NEUTRAL("embedding-init-method-std"),
    NEUTRAL("no-initialization"),
    NEUTRAL("use-cpu-initialization"),
    NEUTRAL("manual-gc"),
    NEUTRAL("manual-gc-interval"),
    NEUTRAL("manual-gc-eval"),
    NEUTRAL("rerun-mode"),
    OFF("no-check-for-nan-in-loss-and-grad", check_nan),
    NEUTRAL("check-for-large-grads"),
    NEUTRAL("check-for-spiky-loss"),
    NEUTRAL("result-rejected-tracker-filename"),
    NEUTRAL("calculate-per-token-loss"),
    NEUTRAL("iterations-to-skip"),
    NEUTRAL("check-weight-hash-across-dp-replicas-interval"),
    NEUTRAL("distributed-backend"),
    NEUTRAL("distributed-timeout-minutes"),
    NEUTRAL("local-rank"),
    NEUTRAL("disable-gloo-process-groups"),
    NEUTRAL("no-align-param-gather"),
    NEUTRAL("no-align-grad-reduce"),
    NEUTRAL("ddp-average-in-collective"),
    NEUTRAL("no-gradient-reduce-div-fusion"),
    /* --use-mcore-models: ignored, mcore models are the default (arguments.py:2949-2952) */
    NEUTRAL("use-mcore-models"),
    /* --use-flash-attn: nothing under megatron/ reads use_flash_attn at this commit */
    NEUTRAL("use-flash-attn"),
    NEUTRAL("no-persist-layer-norm"),
    NEUTRAL("apply-layernorm-1p"),
    NEUTRAL("norm-epsilon"),
    NEUTRAL("rotary-base"),
    NEUTRAL("rotary-interleaved"),
    NEUTRAL("rotary-seq-len-interpolation-factor"),
    NEUTRAL("use-rope-scaling"),
    NEUTRAL("rope-scaling-factor"),
    NEUTRAL("openai-gelu"),
    NEUTRAL("disable-bf16-reduced-precision-matmul"),
    NEUTRAL("initial-loss-scale"),
    NEUTRAL("min-loss-scale"),
    NEUTRAL("loss-scale-window"),
    NEUTRAL("hysteresis"),
    NEUTRAL("finetune"),
    NEUTRAL("pretrained-checkpoint"),
    NEUTRAL("load"),
    NEUTRAL("save"),
    NEUTRAL("save-interval"),
    NEUTRAL("persistent-save-interval"),
    NEUTRAL("save-retain-interval"),
    NEUTRAL("non-persistent-*"),
    NEUTRAL("no-load-optim"),
    NEUTRAL("no-load-rng"),
    NEUTRAL("no-save-optim"),
    NEUTRAL("no-save-rng"),
    NEUTRAL("ckpt-*"),
    NEUTRAL("dist-ckpt-*"),
    NEUTRAL("async-save"),
    NEUTRAL("async-strategy"),
    NEUTRAL("async-ckpt-*"),
    NEUTRAL("use-persistent-ckpt-worker"),
    NEUTRAL("use-dist-ckpt"),
    NEUTRAL("auto-detect-ckpt-format"),
    NEUTRAL("verify-integrity"),
    NEUTRAL("override-opt-param-scheduler"),
    NEUTRAL("use-checkpoint-opt-param-scheduler"),
    NEUTRAL("no-ckpt-fully-parallel-save"),
    NEUTRAL("lr"),
    NEUTRAL("lr-*"),
    NEUTRAL("min-lr"),
    NEUTRAL("decoupled-lr"),
    NEUTRAL("decoupled-min-lr"),
    NEUTRAL("weight-decay"),
    NEUTRAL("start-weight-decay"),
    NEUTRAL("end-weight-decay"),
    NEUTRAL("weight-decay-incr-style"),
    NEUTRAL("apply-wd-to-qk-layernorm"),
    NEUTRAL("adam-beta1"),
    NEUTRAL("adam-beta2"),
    NEUTRAL("adam-eps"),
    NEUTRAL("sgd-momentum"),
    NEUTRAL("log-*"),
    NEUTRAL("tensorboard-*"),
    NEUTRAL("timing-log-level"),
    NEUTRAL("timing-log-option"),
    NEUTRAL("wandb-*"),
    NEUTRAL("logging-level"),
    NEUTRAL("profile"),
    NEUTRAL("profile-step-start"),
    NEUTRAL("profile-step-end"),
    NEUTRAL("profile-ranks"),
    NEUTRAL("use-pytorch-profiler"),
    NEUTRAL("record-memory-history"),
    NEUTRAL("memory-snapshot-path"),
    NEUTRAL("nvtx-ranges"),
    NEUTRAL("straggler-*"),
    NEUTRAL("no-barrier-with-level-1-timing"),
    NEUTRAL("barrier-with-l1-time"),

    /* ---- small changes of memory, not modelled: warned ---- */
    SMALL("reset-attention-mask", "a per-sample attention mask"),
    SMALL("dataloader-inter-document-masking", "per-document attention"),
    SMALL("rampup-batch-size", "memsim models the final global batch"),
    SMALL("test-mode", "real-time attention tests"),
    SMALL("ddp-num-buckets", "the bucket count"),
    SMALL("ddp-pad-buckets-for-high-nccl-busbw", "bucket padding"),
    SMALL("ddp-reduce-scatter-with-fp32-accumulation", "the all-to-all reduce-scatter's buffers"),
    SMALL("use-nccl-ub", "NCCL user-buffer registration"),

    /* ---- changes memory in ways memsim does not model: refused ---- */
    REFUSED("fp8-*", "fp8 training"),
    REFUSED("fp4-*", "fp4 training"),
    REFUSED("te-precision-config-file", "per-module precision"),
    REFUSED("first-last-layers-bf16", "fp8 training"),
    REFUSED_UNLESS("num-experts", "0", "mixture-of-experts layers"),
    REFUSED("moe-*", "mixture-of-experts layers"),
    REFUSED_UNLESS("expert-model-parallel-size", "1", "expert parallelism"),
    REFUSED("expert-tensor-parallel-size", "expert tensor parallelism"),
    REFUSED("multi-latent-attention", "multi-latent attention"),
    REFUSED("q-lora-rank", "multi-latent attention"),
    REFUSED("kv-lora-rank", "multi-latent attention"),
    REFUSED("qk-head-dim", "multi-latent attention"),
    REFUSED("qk-pos-emb-head-dim", "multi-latent attention"),
    REFUSED("v-head-dim", "multi-latent attention"),
    REFUSED("mla-*", "multi-latent attention"),
    REFUSED("rope-type", "multi-latent attention's rotary variants"),
    REFUSED_UNLESS("mtp-num-layers", "0", "multi-token prediction"),
    REFUSED("mtp-*", "multi-token prediction"),
    REFUSED("tp-comm-overlap", "TP communication overlap, with Transformer Engine's userbuffers"),
    REFUSED("tp-comm-*", "TP communication overlap, with Transformer Engine's userbuffers"),
    REFUSED_UNLESS("cuda-graph-impl", "none", "CUDA graphs and their private memory pools"),
    REFUSED("cuda-graph-*", "CUDA graphs and their private memory pools"),
    REFUSED("enable-cuda-graph", "CUDA graphs and their private memory pools"),
    REFUSED("external-cuda-graph", "CUDA graphs and their private memory pools"),
    REFUSED("hybrid-*", "hybrid (Mamba) layers"),
    REFUSED("mamba-*", "Mamba layers"),
    REFUSED("is-hybrid-model", "hybrid (Mamba) layers"),
    REFUSED("pipeline-model-parallel-layout", "a custom pipeline layout"),
    REFUSED("hierarchical-context-parallel-sizes", "hierarchical context parallelism"),
    REFUSED_UNLESS("cp-comm-type", "p2p", "context-parallel communication other than p2p"),
    REFUSED("hybrid-context-parallel", "hybrid context parallelism"),
    REFUSED("use-megatron-fsdp", "Megatron-FSDP"),
    REFUSED("megatron-fsdp-*", "Megatron-FSDP"),
    REFUSED("use-torch-fsdp2", "torch FSDP2"),
    REFUSED("fsdp-*", "FSDP"),
    REFUSED("data-parallel-sharding-strategy", "Megatron-FSDP"),
    REFUSED("outer-dp-sharding-strategy", "Megatron-FSDP"),
    REFUSED("optimizer-cpu-offload", "optimizer offload"),
    REFUSED("optimizer-offload-fraction", "optimizer offload"),
    REFUSED("use-precision-aware-optimizer", "the precision-aware optimizer"),
    REFUSED("main-grads-dtype", "the precision-aware optimizer"),
    REFUSED("main-params-dtype", "the precision-aware optimizer"),
    REFUSED("exp-avg-dtype", "the precision-aware optimizer"),
    REFUSED("exp-avg-sq-dtype", "the precision-aware optimizer"),
    REFUSED_UNLESS("cpu-offloading-num-layers", "0", "activation offloading"),
    REFUSED("cpu-offloading", "activation offloading"),
    REFUSED("fine-grained-activation-offloading", "activation offloading"),
    REFUSED("offload-modules", "activation offloading"),
    REFUSED("distribute-saved-activations", "distributed saved activations"),
    REFUSED_UNLESS("recompute-modules", "core_attn",
                   "recomputation of modules other than the "
                   "core attention"),
    REFUSED_UNLESS("empty-unused-memory-level", "0", "torch.cuda.empty_cache() every iteration"),
    REFUSED("fp32-residual-connection", "an fp32 residual stream"),
    REFUSED("fp16-lm-cross-entropy", "the loss in fp16"),
    REFUSED("output-logit-dtype", "the logits in another dtype"),
    REFUSED("squared-relu", "activations other than GeLU and SwiGLU"),
    REFUSED("quick-geglu", "activations other than GeLU and SwiGLU"),
    REFUSED("use-te-activation-func", "Transformer Engine's activation modules"),
    REFUSED("window-size", "sliding-window attention"),
    REFUSED("window-attn-skip-freq", "sliding-window attention"),
    REFUSED("spec", "a custom layer spec"),
    REFUSED("heterogeneous-*", "heterogeneous layers"),
    REFUSED("yaml-cfg", "a YAML arguments file: give its flags instead"),
    REFUSED("use-checkpoint-args", "a model shape read from the checkpoint"),
    REFUSED("experimental-attention-variant", "experimental attention"),
    REFUSED("linear-attention-*", "linear attention"),
    REFUSED("enable-mhc-connections", "hyper-connections"),
    REFUSED("mhc-*", "hyper-connections"),
    REFUSED("delay-wgrad-compute", "delayed weight-gradient computation"),
    REFUSED("qk-clip", "QK clipping"),
    REFUSED("qk-l2-norm", "QK L2 normalisation"),
    REFUSED("attention-output-gate", "gated attention"),
    REFUSED_UNLESS("softmax-type", "vanilla", "learnable-softmax attention"),
    REFUSED("kitchen-*", "Kitchen quantisation"),
    REFUSED("perform-rl-step", "reinforcement learning"),
    REFUSED("freeze-all-layers", "frozen layers"),
    REFUSED("step-batch-size-schedule", "a global batch that changes during training"),
    REFUSED("decoder-num-layers", "an encoder-decoder model"),
    REFUSED("decoder-seq-length", "an encoder-decoder model"),

    /* ---- flags Megatron refuses itself (arguments.py:590-606) ---- */
    REMOVED("batch-size", "--batch-size is no longer valid, use --micro-batch-size"),
    REMOVED("warmup", "--warmup is no longer valid, use --lr-warmup-fraction"),
    REMOVED("model-parallel-size",
            "--model-parallel-size is no longer valid, use --tensor-model-parallel-size"),
    REMOVED("checkpoint-activations", "--checkpoint-activations is no longer valid, use "
                                      "--recompute-activations or --recompute-granularity"),
};

/* A flag's entry, or NULL. `name` is without "--", '_' spelt '-'. */
static const Flag *flag_find(const char *name)
{
    for (gsize i = 0; i < G_N_ELEMENTS(flags); i++)
        if (strcmp(flags[i].name, name) == 0)
            return &flags[i];
    for (gsize i = 0; i < G_N_ELEMENTS(flags); i++) {
        gsize n = strlen(flags[i].name);
        if (flags[i].name[n - 1] == '*' && strncmp(flags[i].name, name, n - 1) == 0)
            return &flags[i];
    }
    return NULL;
}

/* torchrun's flags (torch/distributed/run.py), and ft_launcher's. */
static const struct {
    const char *name;
    bool value;
} launcher_flags[] = {
    {"nproc-per-node", true}, {"nnodes", true},       {"node-rank", true},
    {"master-addr", true},    {"master-port", true},  {"rdzv-backend", true},
    {"rdzv-endpoint", true},  {"rdzv-id", true},      {"rdzv-conf", true},
    {"standalone", false},    {"max-restarts", true}, {"monitor-interval", true},
    {"start-method", true},   {"role", true},         {"module", false},
    {"no-python", false},     {"run-path", false},    {"log-dir", true},
    {"redirects", true},      {"tee", true},          {"local-ranks-filter", true},
    {"local-addr", true},     {"logs-specs", true},   {"use-env", false},
    {"rdzv-timeout", true},   {"ft-*", true},         {"ignore-missing-fault-tol-cfg", false},
};

static int launcher_flag(const char *name)
{
    for (gsize i = 0; i < G_N_ELEMENTS(launcher_flags); i++) {
        const char *f = launcher_flags[i].name;
        gsize n = strlen(f);
        if (strcmp(f, name) == 0 || (f[n - 1] == '*' && strncmp(f, name, n - 1) == 0))
            return (int)i;
    }
    return -1;
}

/* "--Foo_bar=x" → "foo-bar" (the spelling of the table) and "x" (NULL without '='). */
static char *flag_name(const char *word, char **value)
{
    const char *p = word + 2;
    const char *eq = strchr(p, '=');
    char *name = eq ? g_strndup(p, (gsize)(eq - p)) : g_strdup(p);
    for (char *q = name; *q; q++)
        if (*q == '_')
            *q = '-';
    *value = eq ? g_strdup(eq + 1) : NULL;
    return name;
}

/* ---- the launcher: the world size ---- */

typedef struct {
    int64_t nproc, nnodes; /* UNSET when not given */
    bool launcher;         /* torchrun, ft_launcher, python -m torch.distributed.run/launch */
} Launcher;

static gboolean launcher_value(Launch *l, Launcher *out, const char *name, const char *v,
                               GError **error)
{
    if (strcmp(name, "nproc-per-node") != 0 && strcmp(name, "nnodes") != 0)
        return TRUE;
    bool nodes = name[1] == 'n';
    /* --nnodes MIN:MAX is elastic: the same count at both ends is a count */
    g_auto(GStrv) range = g_strsplit(v, ":", 2);
    char *end = NULL;
    int64_t x = g_ascii_strtoll(range[0], &end, 10);
    bool ok = *range[0] && !*end && x >= 1 && x <= (1 << 20);
    if (ok && range[1]) {
        int64_t y = g_ascii_strtoll(range[1], &end, 10);
        ok = !*end && y == x;
    }
    if (!ok)
        return bad(error, l->where, "--%s %s: memsim needs the count (%s)", name, v,
                   nodes ? "an elastic range of nodes has none fixed"
                         : "'gpu', 'auto' and the like are decided at run time");
    *(nodes ? &out->nnodes : &out->nproc) = x;
    return TRUE;
}

/* The launcher's words: torchrun [flags], ft_launcher [flags], python [-m torch.distributed.run
 * [flags]] … */
static gboolean launcher_read(Launch *l, Launcher *out, GError **error)
{
    GPtrArray *w = l->launcher;
    out->nproc = out->nnodes = UNSET;
    if (!w->len)
        return TRUE;
    g_autofree char *first = g_path_get_basename(w->pdata[0]);
    guint i = 1;
    if (g_str_has_prefix(w->pdata[0], "--")) {
        /* torchrun's flags read among the program's (a script's DISTRIBUTED_ARGS) */
        out->launcher = true;
        i = 0;
    } else if (g_str_has_prefix(first, "python")) {
        while (i < w->len && ((char *)w->pdata[i])[0] == '-' && ((char *)w->pdata[i])[1] != '-') {
            const char *o = w->pdata[i++];
            if (strcmp(o, "-m") == 0 && i < w->len) {
                const char *mod = w->pdata[i++];
                if (strcmp(mod, "torch.distributed.run") == 0 ||
                    strcmp(mod, "torch.distributed.launch") == 0)
                    out->launcher = true;
                else
                    launch_unknown(l, mod);
                break;
            }
            if ((strcmp(o, "-W") == 0 || strcmp(o, "-X") == 0) && i < w->len)
                i++;
        }
        if (!out->launcher) {
            for (; i < w->len; i++)
                launch_unknown(l, w->pdata[i]);
            return TRUE;
        }
    } else if (strcmp(first, "torchrun") == 0 || strcmp(first, "ft_launcher") == 0) {
        out->launcher = true;
    } else {
        g_autofree char *what = g_strdup_printf("the launcher '%s'", first);
        launch_unknown(l, what);
        return TRUE;
    }
    for (; i < w->len; i++) {
        const char *x = w->pdata[i];
        if (!g_str_has_prefix(x, "--")) {
            if (strcmp(x, "-m") != 0 && strcmp(x, "-r") != 0 && strcmp(x, "-t") != 0)
                launch_unknown(l, x);
            else if (strcmp(x, "-m") != 0)
                i++;
            continue;
        }
        g_autofree char *v = NULL;
        g_autofree char *name = flag_name(x, &v);
        int k = launcher_flag(name);
        if (k < 0) {
            launch_unknown(l, x);
            continue;
        }
        if (launcher_flags[k].value && !v && i + 1 < w->len)
            v = g_strdup(w->pdata[++i]);
        if (v && !launcher_value(l, out, name, v, error))
            return FALSE;
    }
    return TRUE;
}

/* ---- Megatron's argv ---- */

typedef struct {
    Args a;
    GHashTable *given;  /* char * (flag name) → the value as given ("" for none) */
    GPtrArray *refused; /* char *: "why\t--flag" */
    GPtrArray *small;   /* char *: "--flag (why)" */
} Parsed;

static gboolean store(Launch *l, Parsed *p, const Flag *f, const char *v, GError **error)
{
    char *field = (char *)&p->a + f->offset;
    switch (f->kind) {
    case V_TRUE:
    case V_FALSE:
        *(bool *)field = f->kind == V_TRUE;
        return TRUE;
    case V_INT: {
        char *end = NULL;
        errno = 0;
        int64_t x = g_ascii_strtoll(v, &end, 10);
        if (!*v || *end || errno || x < f->min || x > f->max)
            return bad(error, l->where,
                       "--%s: '%s' is not an integer in [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
                       "]%s",
                       f->name, v, f->min, f->max,
                       strchr(v, '$') ? " (a variable the launch does not set?)" : "");
        *(int64_t *)field = x;
        return TRUE;
    }
    case V_NUM: {
        char *end = NULL;
        double x = g_ascii_strtod(v, &end);
        if (!*v || *end || !isfinite(x))
            return bad(error, l->where, "--%s: '%s' is not a number", f->name, v);
        *(double *)field = x;
        return TRUE;
    }
    case V_STR:
        if (f->choices && !g_strv_contains(f->choices, v)) {
            g_autofree char *list = g_strjoinv(", ", (char **)f->choices);
            return bad(error, l->where, "--%s: '%s' is not one of %s", f->name, v, list);
        }
        g_free(*(char **)field);
        *(char **)field = g_strdup(v);
        return TRUE;
    }
    g_assert_not_reached();
}

static void list_add(GPtrArray *list, const char *item)
{
    for (guint i = 0; i < list->len; i++)
        if (strcmp(list->pdata[i], item) == 0)
            return;
    g_ptr_array_add(list, g_strdup(item));
}

/* Megatron's flags in l->args, as argparse takes them: --flag value or --flag=value, '_' or '-'
 * between words, the last of a repeated flag winning; torchrun's flags among them (a script's
 * DISTRIBUTED_ARGS array read with the others) go to the launcher. */
static gboolean args_read(Launch *l, Parsed *p, GError **error)
{
    GPtrArray *w = l->args;
    for (guint i = 0; i < w->len; i++) {
        const char *x = w->pdata[i];
        if (!g_str_has_prefix(x, "--") || !x[2])
            return bad(error, l->where,
                       "'%s'%s%s%s: a word that is no flag's value (Megatron's "
                       "argparse refuses it)",
                       x, i ? " after " : "", i ? (const char *)w->pdata[i - 1] : "",
                       i ? "" : " before any flag");
        g_autofree char *v = NULL;
        g_autofree char *name = flag_name(x, &v);
        const Flag *f = flag_find(name);
        if (!f && launcher_flag(name) >= 0) {
            g_ptr_array_add(l->launcher, g_strdup(x));
            if (!v && launcher_flags[launcher_flag(name)].value && i + 1 < w->len &&
                !g_str_has_prefix(w->pdata[i + 1], "--"))
                g_ptr_array_add(l->launcher, g_strdup(w->pdata[++i]));
            continue;
        }
        Takes takes = f ? f->takes : TAKES_ANY;
        g_autoptr(GString) values = g_string_new(v);
        guint nv = v ? 1 : 0;
        if (takes == TAKES_NONE && v)
            return bad(error, l->where, "--%s takes no value (given '%s')", name, v);
        if (takes == TAKES_ONE && !v) {
            if (i + 1 >= w->len || g_str_has_prefix(w->pdata[i + 1], "--"))
                return bad(error, l->where, "--%s: expected a value", name);
            g_string_assign(values, w->pdata[++i]);
            nv = 1;
        }
        if (takes == TAKES_LIST || takes == TAKES_ANY)
            while (!v && i + 1 < w->len && !g_str_has_prefix(w->pdata[i + 1], "--")) {
                g_string_append_printf(values, "%s%s", nv ? " " : "", (char *)w->pdata[++i]);
                nv++;
            }
        if (!f) {
            g_autofree char *dashed = g_strdup_printf("--%s", name);
            launch_unknown(l, dashed);
            continue;
        }
        g_hash_table_replace(p->given, g_strdup(name), g_strdup(values->str));
        g_autofree char *what = g_strdup_printf("--%s", name);
        switch (f->role) {
        case ROLE_MAPPED:
            if (!store(l, p, f, values->str, error))
                return FALSE;
            break;
        case ROLE_NEUTRAL:
            break;
        case ROLE_SMALL: {
            g_autofree char *s = g_strdup_printf("%s (%s)", what, f->why);
            list_add(p->small, s);
            break;
        }
        case ROLE_REFUSED:
            if (f->harmless && strcmp(values->str, f->harmless) == 0)
                break;
            /* "why\t--flag": grouped by why in the message */
            {
                g_autofree char *s = g_strdup_printf("%s\t%s", f->why, what);
                list_add(p->refused, s);
            }
            break;
        case ROLE_REMOVED:
            return bad(error, l->where, "%s (arguments.py:590-606)", f->why);
        }
    }
    return TRUE;
}

static bool given(const Parsed *p, const char *name)
{
    return g_hash_table_contains(p->given, name);
}

/* ---- the environment ---- */

/* CUBLAS_WORKSPACE_CONFIG (":SIZE:COUNT", repeated): PyTorch's workspace per handle and stream
 * is the sum of SIZE KiB × COUNT (aten/src/ATen/cuda/CublasHandlePool.cpp,
 * parseChosenWorkspaceSize). 0 when it does not parse. */
static int64_t cublas_bytes(const char *v)
{
    int64_t total = 0;
    const char *p = v;
    while (*p) {
        char *end;
        if (*p != ':' || !g_ascii_isdigit(p[1]))
            return 0;
        int64_t size = g_ascii_strtoll(p + 1, &end, 10);
        if (*end != ':' || !g_ascii_isdigit(end[1]))
            return 0;
        int64_t count = g_ascii_strtoll(end + 1, &end, 10);
        if (size > (1 << 24) || count > (1 << 16))
            return 0;
        total += size * 1024 * count;
        p = end;
    }
    return total;
}

static const char *env_get(const Launch *l, const char *name)
{
    return g_hash_table_lookup(l->env, name);
}

/* A script variable or the environment's (the world size's names may be either). */
static const char *var_get(const Launch *l, const char *name)
{
    const char *v = g_hash_table_lookup(l->env, name);
    return v ? v : g_hash_table_lookup(l->vars, name);
}

static gboolean count_of(const Launch *l, const char *name, const char *v, int64_t *out,
                         GError **error)
{
    char *end;
    int64_t x = g_ascii_strtoll(v, &end, 10);
    if (!*v || *end || x < 1 || x > (1 << 20))
        return bad(error, l->where, "%s=%s: not a count of GPUs or nodes%s", name, v,
                   strchr(v, '$') ? " (a variable the script does not set?)" : "");
    *out = x;
    return TRUE;
}

/* The world size: the launcher's, WORLD_SIZE, GPUS_PER_NODE × NUM_NODES, or a default. */
static gboolean world_of(MemsimMegatron *mg, const Launch *l, const Launcher *lr, GError **error)
{
    int64_t gpn = UNSET, nodes = 1;
    const char *v;
    if (lr->launcher) {
        int64_t n = lr->nproc != UNSET ? lr->nproc : 1, m = lr->nnodes != UNSET ? lr->nnodes : 1;
        mg->world = (int)MIN(n * m, 1 << 20);
        mg->world_given = true;
        mg->gpus_per_node = (int)n;
        mg->world_source = g_strdup_printf(
            "--nproc-per-node %" G_GINT64_FORMAT " × --nnodes %" G_GINT64_FORMAT, n, m);
        return TRUE;
    }
    if ((v = var_get(l, "WORLD_SIZE"))) {
        int64_t n;
        if (!count_of(l, "WORLD_SIZE", v, &n, error))
            return FALSE;
        mg->world = (int)n;
        mg->world_given = true;
        mg->world_source = g_strdup_printf("WORLD_SIZE=%" G_GINT64_FORMAT, n);
        return TRUE;
    }
    if ((v = var_get(l, "GPUS_PER_NODE"))) {
        if (!count_of(l, "GPUS_PER_NODE", v, &gpn, error))
            return FALSE;
        if ((v = var_get(l, "NUM_NODES")) && !count_of(l, "NUM_NODES", v, &nodes, error))
            return FALSE;
        mg->world = (int)MIN(gpn * nodes, 1 << 20);
        mg->world_given = true;
        mg->gpus_per_node = (int)gpn;
        mg->world_source = g_strdup_printf(
            "GPUS_PER_NODE=%" G_GINT64_FORMAT " × NUM_NODES=%" G_GINT64_FORMAT, gpn, nodes);
        return TRUE;
    }
    if (l->yaml) {
        /* tests/functional_tests/shell_test_utils/_run_training.sh:201-202 */
        mg->world = 8;
        mg->gpus_per_node = 8;
        mg->world_source = g_strdup("the CI harness's default, 8 GPUs on 1 node: "
                                    "_run_training.sh:201-202");
        return TRUE;
    }
    mg->world = 1;
    mg->world_source = g_strdup("no launcher, WORLD_SIZE or GPUS_PER_NODE");
    return TRUE;
}

/* ---- Megatron's defaults and checks (validate_args), into the model and MgOptions ---- */

static const char *const recompute_names[] = {"none", "full", "selective"};
static const char *const attention_names[] = {"auto", "flash", "fused", "unfused", "local"};

static gboolean resolve(MemsimMegatron *mg, Launch *l, Parsed *p, GError **error)
{
    Args *a = &p->a;
    MgOptions *o = &mg->o;
    const char *w = l->where;
    if (p->refused->len) {
        /* "not modelled: fp8 training (--fp8-format, --fp8-recipe); …", by what in order */
        GString *msg = g_string_new(NULL);
        for (guint i = 0; i < p->refused->len; i++) {
            const char *e = p->refused->pdata[i], *tab = strchr(e, '\t');
            gsize n = (gsize)(tab - e);
            bool first = true;
            for (guint k = 0; k < i && first; k++)
                first = strncmp(p->refused->pdata[k], e, n + 1) != 0;
            if (!first)
                continue;
            g_string_append_printf(msg, "%s%.*s (", msg->len ? "; " : "", (int)n, e);
            for (guint k = i; k < p->refused->len; k++)
                if (strncmp(p->refused->pdata[k], e, n + 1) == 0)
                    g_string_append_printf(msg, "%s%s", k == i ? "" : ", ",
                                           (char *)p->refused->pdata[k] + n + 1);
            g_string_append_c(msg, ')');
        }
        gboolean r =
            bad(error, w, "not modelled: %s; memsim would answer for another run", msg->str);
        g_string_free(msg, TRUE);
        return r;
    }
    /* the model's shape: arguments.py:1306-1317 */
    if (a->num_layers != UNSET && a->encoder_num_layers != UNSET)
        return bad(error, w,
                   "--num-layers and --encoder-num-layers: give one "
                   "(arguments.py:1306-1307)");
    if (a->num_layers == UNSET)
        a->num_layers = a->encoder_num_layers;
    static const struct {
        const char *flag;
        size_t at;
    } required[] = {{"num-layers", AT(num_layers)},
                    {"hidden-size", AT(hidden_size)},
                    {"num-attention-heads", AT(num_attention_heads)},
                    {"max-position-embeddings", AT(max_position_embeddings)},
                    {"micro-batch-size", AT(micro_batch_size)}};
    for (gsize i = 0; i < G_N_ELEMENTS(required); i++)
        if (*(int64_t *)((char *)a + required[i].at) == UNSET)
            return bad(error, w, "--%s is missing; Megatron requires it (arguments.py:%s)",
                       required[i].flag, i < 4 ? "1314-1317" : "693");
    if (a->seq_length != UNSET && a->encoder_seq_length != UNSET)
        return bad(error, w,
                   "--seq-length and --encoder-seq-length: give one "
                   "(arguments.py:1346-1347)");
    if (a->seq_length == UNSET)
        a->seq_length = a->encoder_seq_length;
    if (a->seq_length == UNSET)
        return bad(error, w,
                   "--seq-length is missing; Megatron requires it (arguments.py:1349-1351)");
    if (a->max_position_embeddings < a->seq_length)
        return bad(error, w,
                   "--max-position-embeddings %" G_GINT64_FORMAT " is below --seq-length "
                   "%" G_GINT64_FORMAT " (arguments.py:1353-1356)",
                   a->max_position_embeddings, a->seq_length);
    /* precision: arguments.py:1194-1217 */
    if (a->fp16 && a->bf16)
        return bad(error, w, "--fp16 and --bf16: give one (arguments.py:1196, 1205)");
    /* positions: arguments.py:1626-1634 */
    if (a->use_rotary_position_embeddings) {
        g_free(a->position_embedding_type);
        a->position_embedding_type = g_strdup("rope");
    }
    const char *pos = a->position_embedding_type ? a->position_embedding_type : "learned_absolute";
    if (!a->add_position_embedding && strcmp(pos, "rope") != 0)
        return bad(error, w,
                   "--no-position-embedding is deprecated, use --position-embedding-type "
                   "(arguments.py:1633-1634)");
    if (strcmp(pos, "learned_absolute") && strcmp(pos, "rope") && strcmp(pos, "none"))
        return bad(error, w,
                   "not modelled: --position-embedding-type %s (memsim would answer for a "
                   "different run)",
                   pos);
    o->pos = !strcmp(pos, "rope")   ? MG_POS_ROPE
             : !strcmp(pos, "none") ? MG_POS_NONE
                                    : MG_POS_LEARNED;
    if (a->rotary_percent <= 0 || a->rotary_percent > 1)
        return bad(error, w, "--rotary-percent %g: expected a fraction in (0, 1]",
                   a->rotary_percent);
    if (a->hidden_dropout < 0 || a->hidden_dropout > 1 || a->attention_dropout < 0 ||
        a->attention_dropout > 1)
        return bad(error, w, "--%s: a dropout probability is in [0, 1]",
                   a->hidden_dropout < 0 || a->hidden_dropout > 1 ? "hidden-dropout"
                                                                  : "attention-dropout");
    /* the layers' implementation: transformer_config.py:151, 1314 */
    const char *impl = a->transformer_impl ? a->transformer_impl : "transformer_engine";
    if (!strcmp(impl, "inference_optimized"))
        return bad(error, w,
                   "not modelled: --transformer-impl inference_optimized (an inference "
                   "layer set)");
    o->impl = !strcmp(impl, "local") ? MG_IMPL_LOCAL : MG_IMPL_TE;
    const char *backend = a->attention_backend ? a->attention_backend : "auto";
    if (!strcmp(backend, "local"))
        return bad(error, w,
                   "--attention-backend local needs --spec local (arguments.py:436-437), "
                   "which memsim does not model; --transformer-impl local is Megatron's "
                   "own attention");
    o->attention = o->impl == MG_IMPL_LOCAL      ? MG_ATTN_LOCAL
                   : !strcmp(backend, "flash")   ? MG_ATTN_FLASH
                   : !strcmp(backend, "fused")   ? MG_ATTN_FUSED
                   : !strcmp(backend, "unfused") ? MG_ATTN_UNFUSED
                                                 : MG_ATTN_AUTO;
    /* heads and widths: arguments.py:1320-1333, argument_utils.py:330-333 */
    int64_t H = a->hidden_size, nh = a->num_attention_heads;
    if (a->kv_channels == UNSET && H % nh)
        return bad(error, w,
                   "--hidden-size %" G_GINT64_FORMAT " is not divisible by "
                   "--num-attention-heads %" G_GINT64_FORMAT
                   " and --kv-channels is not given (arguments.py:1331-1333)",
                   H, nh);
    int64_t hd = a->kv_channels != UNSET ? a->kv_channels : H / nh;
    int64_t nkv = nh;
    if (a->group_query_attention)
        nkv = a->num_query_groups;
    else if (given(p, "num-query-groups"))
        launch_note(l,
                    "--num-query-groups %" G_GINT64_FORMAT
                    " without --group-query-attention: ignored, "
                    "as Megatron ignores it (argument_utils.py:330-333)",
                    a->num_query_groups);
    if (nh % nkv)
        return bad(error, w,
                   "--num-attention-heads %" G_GINT64_FORMAT " is not divisible by "
                   "--num-query-groups %" G_GINT64_FORMAT,
                   nh, nkv);
    int64_t I = a->ffn_hidden_size;
    if (I == UNSET)
        I = a->swiglu ? (int64_t)((4.0 * (double)H * 2.0 / 3.0) / 64.0) * 64 : 4 * H;
    if (I < 1)
        return bad(error, w,
                   "--swiglu with --hidden-size %" G_GINT64_FORMAT
                   " makes an FFN of %" G_GINT64_FORMAT
                   " (int(8h/3 / 64) × 64, arguments.py:1320-1327): give "
                   "--ffn-hidden-size",
                   H, I);
    /* the vocabulary: pretrain_gpt.py:527, build_tokenizer.py:26-152 */
    o->tokenizer = "GPT2BPETokenizer";
    if (a->tokenizer_type) {
        static const char *const names[] = {TOKENIZERS, NULL};
        for (gsize i = 0; names[i]; i++)
            if (!strcmp(names[i], a->tokenizer_type))
                o->tokenizer = names[i];
    }
    if (!strcmp(o->tokenizer, "GPT2BPETokenizer")) {
        /* GPT-2's vocab.json: 50257 tokens */
        o->vocab = 50257;
        if (a->vocab_size != UNSET)
            launch_note(l,
                        "--vocab-size %" G_GINT64_FORMAT " ignored: GPT2BPETokenizer reads its "
                        "vocabulary from --vocab-file (GPT-2's: 50257 tokens)",
                        a->vocab_size);
    } else if (a->vocab_size != UNSET) {
        o->vocab = a->vocab_size;
    } else if (a->padded_vocab_size != UNSET) {
        o->vocab = a->padded_vocab_size;
    } else {
        return bad(error, w,
                   "--tokenizer-type %s: its vocabulary comes from %s, which memsim "
                   "cannot read offline; give --vocab-size",
                   o->tokenizer,
                   !strcmp(o->tokenizer, "NullTokenizer") ? "--vocab-size (missing)"
                                                          : "the tokenizer's files");
    }
    o->vocab_divisor = a->make_vocab_size_divisible_by;
    o->padded_vocab = a->padded_vocab_size != UNSET ? a->padded_vocab_size : 0;
    if (o->padded_vocab && o->padded_vocab < o->vocab)
        return bad(error, w,
                   "--padded-vocab-size %" G_GINT64_FORMAT
                   " is below the vocabulary's %" G_GINT64_FORMAT " tokens",
                   o->padded_vocab, o->vocab);
    /* the model is bounded as a config.json is (traces/config.c): at 2 bytes a parameter,
     * under 1 PiB */
    double params = (double)a->num_layers * ((double)H * (double)(nh + 2 * nkv) * (double)hd +
                                             (double)H * nh * hd + 3.0 * (double)H * (double)I) +
                    2.0 * (double)mg_padded_vocab(o, 1) * (double)H +
                    (double)a->max_position_embeddings * (double)H;
    if (params * 2 > (double)((int64_t)1 << 50))
        return bad(error, w,
                   "the model is too large: %.3g parameters (--num-layers %" G_GINT64_FORMAT
                   ", --hidden-size %" G_GINT64_FORMAT ") take more than 1 PiB at 2 "
                   "bytes each",
                   params, a->num_layers, H);
    /* parallelism */
    if (a->sequence_parallel && a->tp == 1) {
        launch_note(
            l, "--sequence-parallel dropped: it needs --tensor-model-parallel-size above 1, as "
               "Megatron says (arguments.py:1433-1440)");
        a->sequence_parallel = false;
    }
    if (a->cp > 1 && a->seq_length % (2 * a->cp))
        return bad(error, w,
                   "--seq-length %" G_GINT64_FORMAT " is not a multiple of 2 × "
                   "--context-parallel-size %" G_GINT64_FORMAT " (arguments.py:1335-1338)",
                   a->seq_length, a->cp);
    /* the batch: arguments.py:693-705 */
    if (a->global_batch_size != UNSET && a->global_batch_size < 1)
        return bad(error, w, "--global-batch-size must be positive (arguments.py:705)");
    /* virtual pipeline stages: arguments.py:929-1012 */
    if (a->nlpvs != UNSET && a->nvspr != UNSET)
        return bad(error, w,
                   "--num-layers-per-virtual-pipeline-stage and "
                   "--num-virtual-stages-per-pipeline-rank: give one "
                   "(arguments.py:929-940)");
    mg->virtual_stages = 1;
    if (a->nlpvs != UNSET) {
        if (a->first != UNSET || a->last != UNSET)
            return bad(error, w,
                       "--num-layers-per-virtual-pipeline-stage with "
                       "--decoder-first/last-pipeline-num-layers: use "
                       "--num-virtual-stages-per-pipeline-rank for uneven pipelines "
                       "(arguments.py:954-956)");
        int64_t n = a->num_layers + a->account_emb + a->account_loss;
        if (n % a->pp)
            return bad(error, w,
                       "--num-layers %" G_GINT64_FORMAT "%s is not divisible by "
                       "--pipeline-model-parallel-size %" G_GINT64_FORMAT " (arguments.py:967-969)",
                       a->num_layers, n != a->num_layers ? " (with the embedding/loss stages)" : "",
                       a->pp);
        if ((n / a->pp) % a->nlpvs)
            return bad(error, w,
                       "%" G_GINT64_FORMAT " layers per pipeline stage are not divisible "
                       "by --num-layers-per-virtual-pipeline-stage %" G_GINT64_FORMAT
                       " (arguments.py:970-974)",
                       n / a->pp, a->nlpvs);
        mg->virtual_stages = (int)(n / a->pp / a->nlpvs);
        mg->virtual_flag =
            g_strdup_printf("--num-layers-per-virtual-pipeline-stage %" G_GINT64_FORMAT, a->nlpvs);
    } else if (a->nvspr != UNSET) {
        mg->virtual_stages = (int)a->nvspr;
        mg->virtual_flag =
            g_strdup_printf("--num-virtual-stages-per-pipeline-rank %" G_GINT64_FORMAT, a->nvspr);
    }
    if (mg->virtual_stages == 1) /* arguments.py:976-977, 1010-1013 */
        a->overlap_p2p_comm = false;
    mg->overlap_p2p_comm = a->overlap_p2p_comm;
    /* batched p2p, then a device synchronize after each exchange: batch_p2p_comm = not
     * overlap_p2p_comm (training/argument_utils.py:307), batch_p2p_sync True (no flag sets it;
     * core/model_parallel_config.py:395); pipeline_parallel/p2p_communication.py
     * P2PCommunicator._communicate calls torch.cuda.synchronize() when both hold */
    mg->o.p2p_sync = !a->overlap_p2p_comm;
    if (a->warmup_flush && !a->overlap_p2p_comm)
        return bad(error, w,
                   "--overlap-p2p-communication-warmup-flush needs the interleaved "
                   "schedule's p2p overlap (%s; model_parallel_config.py:570-575, "
                   "arguments.py:1010-1013)",
                   mg->virtual_stages > 1 ? "--no-overlap-p2p-communication is given"
                                          : "no virtual pipeline stages are given");
    if ((a->first != UNSET || a->last != UNSET) && (a->account_emb || a->account_loss))
        return bad(error, w,
                   "--decoder-first/last-pipeline-num-layers with "
                   "--account-for-embedding/loss-in-pipeline-split: give one "
                   "(transformer_config.py:2230-2239)");
    /* the optimizer and data parallelism: arguments.py:1024-1075, 1726 */
    const char *opt = a->optimizer ? a->optimizer : "adam";
    if (strcmp(opt, "adam") != 0)
        return bad(error, w, "not modelled: --optimizer %s (memsim's Megatron program steps Adam)",
                   opt);
    if (a->overlap_param_gather && !a->distributed_optimizer)
        return bad(error, w,
                   "--overlap-param-gather needs --use-distributed-optimizer "
                   "(arguments.py:1024-1027)");
    if (a->overlap_param_gather && !a->overlap_grad_reduce)
        return bad(error, w,
                   "--overlap-param-gather needs --overlap-grad-reduce "
                   "(arguments.py:1028-1029)");
    if (a->overlap_param_gather_with_step) {
        const char *why = !a->distributed_optimizer  ? "--use-distributed-optimizer"
                          : !a->overlap_param_gather ? "--overlap-param-gather"
                          : mg->virtual_stages == 1  ? "virtual pipeline stages"
                          : a->ckpt_format && !strcmp(a->ckpt_format, "torch")
                              ? NULL
                              : "--ckpt-format torch (distributed checkpoints are not supported "
                                "with it)";
        if (why)
            return bad(error, w,
                       "--overlap-param-gather-with-optimizer-step needs %s "
                       "(arguments.py:1066-1075)",
                       why);
    }
    if (a->optimizer_instances > 1 && !a->distributed_optimizer)
        return bad(error, w,
                   "--num-distributed-optimizer-instances %" G_GINT64_FORMAT " needs "
                   "--use-distributed-optimizer",
                   a->optimizer_instances);
    /* recomputation: arguments.py:607-608, 1425-1428; transformer_config.py:1901-1932 */
    const char *gran = a->recompute_activations ? "selective" : a->recompute_granularity;
    o->recompute = MG_RECOMPUTE_NONE;
    if (gran && !strcmp(gran, "selective")) {
        if (a->recompute_method)
            return bad(error, w,
                       "--recompute-method with selective recomputation: Megatron "
                       "refuses it (arguments.py:1425-1428)");
        if (a->recompute_num_layers != UNSET)
            return bad(error, w,
                       "--recompute-num-layers with selective recomputation: Megatron "
                       "refuses it (transformer_config.py:1926-1932)");
        o->recompute = MG_RECOMPUTE_SELECTIVE;
    } else if (gran) {
        if (!a->recompute_method)
            return bad(error, w,
                       "--recompute-granularity full needs --recompute-method uniform or "
                       "block (transformer_config.py:1908-1917)");
        if (a->recompute_num_layers == UNSET)
            return bad(error, w,
                       "--recompute-granularity full needs --recompute-num-layers "
                       "(transformer_config.py:1919-1925)");
        o->recompute = MG_RECOMPUTE_FULL;
        o->recompute_method =
            !strcmp(a->recompute_method, "block") ? MG_RECOMPUTE_BLOCK : MG_RECOMPUTE_UNIFORM;
        o->recompute_layers = (int)a->recompute_num_layers;
    }
    /* fusions: arguments.py:1605-1610, 1628-1629, 1697-1702, 1714-1715; argument_utils.py:314-319
     */
    if (a->ce_fusion && a->ce_fusion_impl && !strcmp(a->ce_fusion_impl, "te"))
        return bad(error, w,
                   "--cross-entropy-loss-fusion with --cross-entropy-fusion-impl te: "
                   "Megatron refuses it (arguments.py:1697-1702)");
    if (a->defer_embedding_wgrad && !a->grad_accum_fusion)
        return bad(error, w,
                   "--defer-embedding-wgrad-compute with "
                   "--no-gradient-accumulation-fusion (model_parallel_config.py:550-553)");
    /* --deterministic-mode: megatron/training/determinism.py:24-32, 54-57, 133-140 */
    if (a->deterministic) {
        const char *cw = env_get(l, "CUBLAS_WORKSPACE_CONFIG");
        const char *nv = env_get(l, "NVTE_ALLOW_NONDETERMINISTIC_ALGO");
        if (a->ce_fusion)
            return bad(error, w,
                       "--deterministic-mode with --cross-entropy-loss-fusion "
                       "(determinism.py:24, 133-140)");
        if (cw && strcmp(cw, ":4096:8") && strcmp(cw, ":16:8"))
            return bad(error, w,
                       "--deterministic-mode with CUBLAS_WORKSPACE_CONFIG=%s (it takes "
                       ":4096:8 or :16:8: determinism.py:54-57)",
                       cw);
        if (nv && strcmp(nv, "0"))
            return bad(error, w,
                       "--deterministic-mode with NVTE_ALLOW_NONDETERMINISTIC_ALGO=%s "
                       "(it takes 0: determinism.py:54-57)",
                       nv);
        if (!cw)
            g_hash_table_replace(l->env, g_strdup("CUBLAS_WORKSPACE_CONFIG"), g_strdup(":4096:8"));
    }
    /* the environment */
    if (env_get(l, "PYTORCH_NO_CUDA_MEMORY_CACHING") &&
        strcmp(env_get(l, "PYTORCH_NO_CUDA_MEMORY_CACHING"), "0") != 0)
        return bad(error, w,
                   "not modelled: PYTORCH_NO_CUDA_MEMORY_CACHING (no caching "
                   "allocator)");
    const char *conf = env_get(l, "PYTORCH_CUDA_ALLOC_CONF");
    conf = conf ? conf : env_get(l, "PYTORCH_ALLOC_CONF");
    o->alloc_conf = conf && *conf ? g_strdup(conf) : NULL;
    const char *cw = env_get(l, "CUBLAS_WORKSPACE_CONFIG");
    if (cw && !(o->cublas_workspace = cublas_bytes(cw)))
        launch_note(
            l,
            "CUBLAS_WORKSPACE_CONFIG=%s is not :SIZE:COUNT pairs; PyTorch warns and keeps its "
            "default workspace, and so does memsim",
            cw);
    /* MgOptions */
    o->cp = (int)a->cp;
    o->first_stage_layers = a->first != UNSET ? (int)a->first : 0;
    o->last_stage_layers = a->last != UNSET ? (int)a->last : 0;
    o->embedding_in_split = a->account_emb;
    o->loss_in_split = a->account_loss;
    o->microbatch_group = a->mb_group != UNSET ? (int)a->mb_group : 0;
    o->overlap_p2p_warmup_flush = a->warmup_flush;
    o->global_batch = a->global_batch_size != UNSET ? a->global_batch_size : 0;
    o->decrease_batch = a->decrease_batch;
    o->fp16 = a->fp16;
    o->bf16 = a->bf16;
    o->grads_fp32 = a->bf16 ? !a->grad_reduce_bf16 : a->fp16 ? a->accumulate_fp32 : true;
    o->loss_scaling_dynamic = a->fp16 && a->loss_scale <= 0;
    o->distributed_optimizer = a->distributed_optimizer;
    o->optimizer_instances = (int)a->optimizer_instances;
    o->overlap_grad_reduce = a->overlap_grad_reduce;
    o->overlap_param_gather = a->overlap_param_gather;
    o->overlap_param_gather_with_step = a->overlap_param_gather_with_step;
    o->bucket_size = a->ddp_bucket_size != UNSET ? a->ddp_bucket_size : 0;
    o->grad_accum_fusion = a->grad_accum_fusion;
    o->clip_grad = a->clip_grad;
    o->log_params_norm = a->log_params_norm;
    o->log_num_zeros = a->log_num_zeros;
    /* off with fp16's dynamic loss scaling, whose NaNs signal the scaler (arguments.py:1199-1203) */
    o->check_nan = a->check_nan && !o->loss_scaling_dynamic;
    /* --test-mode: Attention.run_realtime_tests in every forward (transformer/attention.py);
     * its tensors are 1-element blocks, the memory of which stays unmodelled (the warning) */
    o->test_mode = given(p, "test-mode");
    o->ce_fusion = a->ce_fusion;
    o->defer_embedding_wgrad = a->defer_embedding_wgrad;
    o->wgrad_deferral_limit = (int)a->wgrad_deferral_limit;
    o->attention_mask = a->attention_mask;
    o->rope_fusion = a->rope_fusion && o->pos == MG_POS_ROPE;
    o->bias_dropout_fusion = a->bias_dropout_fusion;
    o->bias_gelu_fusion =
        a->swiglu ? a->bias_swiglu_fusion : a->add_bias_linear && a->bias_gelu_fusion;
    o->masked_softmax_fusion = a->masked_softmax_fusion;
    o->softmax_fp32 = a->softmax_fp32 || a->qk_layer_scaling;
    o->qk_layer_scaling = a->qk_layer_scaling;
    o->rms_norm = a->normalization && !strcmp(a->normalization, "RMSNorm");
    o->swiglu = a->swiglu;
    o->qk_norm = a->qk_layernorm;
    mg->micro_batch = a->micro_batch_size;
    /* the model: traces/model.h, family megatron */
    MemsimModel *m = g_new0(MemsimModel, 1);
    mg->model = m;
    m->name =
        g_strdup_printf("megatron-gpt (%" G_GINT64_FORMAT " layers, hidden %" G_GINT64_FORMAT ")",
                        a->num_layers, H);
    m->model_type = g_strdup("megatron-gpt");
    m->fam = FAM_MEGATRON;
    m->V = o->vocab;
    m->H = H;
    m->L = a->num_layers;
    m->nh = nh;
    m->nkv = nkv;
    m->hd = hd;
    m->I = I;
    m->max_pos = a->max_position_embeddings;
    m->tie = !a->untie;
    m->qkv_bias = a->add_bias_linear || a->add_qkv_bias;
    m->o_bias = m->mlp_bias = a->add_bias_linear;
    g_strlcpy(m->act, a->swiglu ? "swiglu" : "gelu", sizeof m->act);
    m->embd_pdrop = m->resid_pdrop = a->hidden_dropout;
    m->attn_pdrop = a->attention_dropout;
    m->rotary_pct = a->rotary_percent;
    m->pre_ln = true;
    m->use_cache = false;
    m->mg = o;
    return TRUE;
}

/* ---- the run ---- */

int64_t mg_padded_vocab(const MgOptions *o, int tp)
{
    if (o->padded_vocab)
        return o->padded_vocab;
    /* arguments.py:2441 and build_tokenizer.py:133-145: the vocabulary padded to a multiple of
     * make_vocab_size_divisible_by × tp */
    int64_t mult = (o->vocab_divisor ? o->vocab_divisor : 128) * (int64_t)tp;
    return (o->vocab + mult - 1) / mult * mult;
}

static int64_t global_batch_of(const MgOptions *o, int64_t micro, int dp)
{
    int64_t unit = micro * dp;
    if (!o->global_batch)
        return unit;               /* arguments.py:702-704 */
    if (o->decrease_batch && unit) /* num_microbatches_calculator.py:368-371, 299-301 */
        return o->global_batch / unit * unit;
    return o->global_batch;
}

/* The launch's run at `world` GPUs (mg->run; no strings). */
static void run_for(MemsimMegatron *mg, int world)
{
    const MgOptions *o = &mg->o;
    MemsimRun *r = &mg->run;
    int tp = r->tp, pp = r->pp;
    int64_t split = (int64_t)tp * pp * o->cp;
    r->gpus = world;
    r->dp = world % split ? 0 : (int)(world / split);
    int64_t G = global_batch_of(o, r->batch, r->dp);
    int64_t unit = r->batch * r->dp;
    r->microbatches =
        unit && G % unit == 0 && G / unit >= 1 && G / unit <= (1 << 16) ? (int)(G / unit) : 0;
    r->gpus_per_node = mg->gpus_per_node ? mg->gpus_per_node : 8;
    mg->world = world;
}

static void run_init(MemsimMegatron *mg, const Args *a)
{
    const MgOptions *o = &mg->o;
    MemsimRun *r = &mg->run;
    memset(r, 0, sizeof *r);
    r->batch = a->micro_batch_size;
    r->seq = a->seq_length;
    r->method = MEMSIM_METHOD_MEGATRON;
    r->tp = (int)a->tp;
    r->pp = (int)a->pp;
    r->virtual_stages = mg->virtual_stages;
    r->pp_schedule = mg->virtual_stages > 1 ? MEMSIM_PP_INTERLEAVED : MEMSIM_PP_1F1B;
    r->sequence_parallel = a->sequence_parallel;
    r->precision = a->bf16   ? MEMSIM_PREC_BF16_MIXED
                   : a->fp16 ? MEMSIM_PREC_FP16_MIXED
                             : MEMSIM_PREC_FP32;
    r->optimizer = MEMSIM_OPTIM_ADAMW;
    r->checkpointing = o->recompute == MG_RECOMPUTE_FULL        ? MEMSIM_CKPT_FULL
                       : o->recompute == MG_RECOMPUTE_SELECTIVE ? MEMSIM_CKPT_SELECTIVE
                                                                : MEMSIM_CKPT_NONE;
    /* memsim's attention paths: TE's flash and fused (cuDNN) kernels keep O(s) state, the
     * unfused and local ones the [b, heads, s, s] scores; auto is TE's choice at run time */
    r->attention = o->attention == MG_ATTN_FLASH   ? MEMSIM_ATTN_FLASH
                   : o->attention == MG_ATTN_FUSED ? MEMSIM_ATTN_MEM_EFFICIENT
                   : o->attention == MG_ATTN_AUTO  ? MEMSIM_ATTN_SDPA
                                                   : MEMSIM_ATTN_EAGER;
    r->cublas_workspace = (memsim_size_t)o->cublas_workspace;
    r->megatron = mg;
}

guint64 mg_sets_mask(const MemsimMegatron *mg)
{
    guint64 m = 0;
    SettingId ids[] = {SETTING_BATCH,
                       SETTING_SEQ,
                       SETTING_METHOD,
                       SETTING_TP,
                       SETTING_PP,
                       SETTING_DP,
                       SETTING_MICROBATCHES,
                       SETTING_PP_SCHEDULE,
                       SETTING_VIRTUAL_STAGES,
                       SETTING_SEQUENCE_PARALLEL,
                       SETTING_PRECISION,
                       SETTING_OPTIMIZER,
                       SETTING_ATTENTION,
                       SETTING_CHECKPOINTING};
    for (gsize i = 0; i < G_N_ELEMENTS(ids); i++)
        m |= (guint64)1 << ids[i];
    if (mg->world_given)
        m |= (guint64)1 << SETTING_GPUS;
    if (mg->gpus_per_node && mg->world_given && mg->world > 1)
        m |= (guint64)1 << SETTING_GPUS_PER_NODE;
    if (mg->o.cublas_workspace)
        m |= (guint64)1 << SETTING_CUBLAS_WORKSPACE;
    return m;
}

void memsim_megatron_apply(const MemsimMegatron *mg, MemsimRun *run)
{
    g_return_if_fail(mg && run);
    const MemsimRun *r = &mg->run;
    run->batch = r->batch;
    run->seq = r->seq;
    run->gpus = r->gpus;
    run->method = r->method;
    run->tp = r->tp;
    run->pp = r->pp;
    run->dp = r->dp;
    run->microbatches = r->microbatches;
    run->pp_schedule = r->pp_schedule;
    run->virtual_stages = r->virtual_stages;
    run->sequence_parallel = r->sequence_parallel;
    run->precision = r->precision;
    run->optimizer = r->optimizer;
    run->attention = r->attention;
    run->checkpointing = r->checkpointing;
    run->gpus_per_node = r->gpus_per_node;
    if (r->cublas_workspace)
        run->cublas_workspace = r->cublas_workspace;
    run->megatron = mg;
    run->given |= mg_sets_mask(mg);
}

/* ---- the layout's checks, for the launch's run and a planner's candidates ---- */

int64_t mg_chunk_layers(const MgOptions *o, int64_t L, int pp, int v, int stage, int chunk)
{
    int64_t per; /* transformer layers on this pipeline rank, before the embedding/loss */
    if (o->first_stage_layers || o->last_stage_layers) {
        /* transformer_block.py:104-143 */
        int64_t rest = L, stages = pp;
        if (o->first_stage_layers) {
            rest -= o->first_stage_layers;
            stages--;
        }
        if (o->last_stage_layers) {
            rest -= o->last_stage_layers;
            stages--;
        }
        if (stages < 0 || rest < 0 || (stages == 0) != (rest == 0) || (stages && rest % stages))
            return -1;
        per = stages ? rest / stages : 0;
        if (stage == 0 && o->first_stage_layers)
            per = o->first_stage_layers;
        if (stage == pp - 1 && o->last_stage_layers)
            per = o->last_stage_layers;
    } else {
        /* transformer_block.py:144-159 */
        int64_t n = L + o->embedding_in_split + o->loss_in_split;
        if (n % pp)
            return -1;
        per = n / pp;
    }
    int64_t here = per;
    if (v > 1 && pp > 1) { /* transformer_block.py:161-182 */
        if (per % v)
            return -1;
        here = per / v;
    }
    /* transformer_block.py:185-200: the embedding (loss) takes a layer's place in the first
     * (last) chunk */
    if (o->embedding_in_split && stage == 0 && chunk == 0)
        here--;
    if (o->loss_in_split && stage == pp - 1 && chunk == (v > 1 && pp > 1 ? v : 1) - 1)
        here--;
    return here;
}

/* "--tensor-model-parallel-size 2" etc. for messages */
static const char *const layout_flags[] = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size"};

static gboolean refuse(GError **error, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

static gboolean refuse(GError **error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s", msg);
    return FALSE;
}

gboolean mg_check_layout(const MemsimMegatron *mg, const MemsimRun *run, GError **error)
{
    const MgOptions *o = &mg->o;
    const MemsimModel *m = mg->model;
    int tp = run->tp > 0 ? run->tp : 1, pp = run->pp > 0 ? run->pp : 1, cp = o->cp;
    int64_t split = (int64_t)tp * pp * cp;
    const char *src = run->gpus == mg->world ? mg->world_source : "the run's GPUs";
    if (run->gpus % split)
        return refuse(error,
                      "megatron: %d GPU%s (%s) %s not divisible by %s %d × %s %d × %s %d = "
                      "%" G_GINT64_FORMAT " (arguments.py:432-434)%s",
                      run->gpus, run->gpus == 1 ? "" : "s", src, run->gpus == 1 ? "is" : "are",
                      layout_flags[0], tp, layout_flags[1], pp, layout_flags[2], cp, split,
                      mg->world_given ? "" : "; memsim --gpus gives the world size");
    int dp = (int)(run->gpus / split);
    if (run->dp && run->dp != dp)
        return refuse(error,
                      "dp: %d is not the %d GPUs / (tp %d × pp %d × cp %d) = %d of the "
                      "Megatron launch",
                      run->dp, run->gpus, tp, pp, cp, dp);
    if (m->nh % tp) /* transformer_config.py:1445-1449 */
        return refuse(error,
                      "megatron: --num-attention-heads %" G_GINT64_FORMAT " is not "
                      "divisible by %s %d (transformer_config.py:1445-1449)",
                      m->nh, layout_flags[0], tp);
    if (m->nkv % tp) {
        if (tp % m->nkv == 0)
            return refuse(error,
                          "megatron: not modelled: --num-query-groups %" G_GINT64_FORMAT
                          " below %s %d (Megatron replicates the key/value heads; "
                          "memsim splits them)",
                          m->nkv, layout_flags[0], tp);
        return refuse(error,
                      "megatron: --num-query-groups %" G_GINT64_FORMAT " is neither a "
                      "multiple nor a divisor of %s %d (transformer_config.py:1461-1467)",
                      m->nkv, layout_flags[0], tp);
    }
    if (m->I % tp) /* ColumnParallelLinear: divide() (tensor_parallel/layers.py:1038) */
        return refuse(error,
                      "megatron: --ffn-hidden-size %" G_GINT64_FORMAT " is not divisible by "
                      "%s %d (tensor_parallel/layers.py:1038)",
                      m->I, layout_flags[0], tp);
    if (o->padded_vocab && o->padded_vocab % tp) /* tensor_parallel/utils.py:114-118 */
        return refuse(error,
                      "megatron: --padded-vocab-size %" G_GINT64_FORMAT " is not divisible "
                      "by %s %d (tensor_parallel/utils.py:114-118)",
                      o->padded_vocab, layout_flags[0], tp);
    if (run->sequence_parallel && (tp < 2 || (run->seq / cp) % tp))
        return refuse(error,
                      "megatron: --sequence-parallel needs --seq-length %" G_GINT64_FORMAT
                      " / --context-parallel-size %d divisible by %s %d "
                      "(tensor_parallel/mappings.py:72-74)",
                      run->seq, cp, layout_flags[0], tp);
    if (((int64_t)dp * cp) % o->optimizer_instances) /* parallel_state.py:922-926 */
        return refuse(error,
                      "megatron: --num-distributed-optimizer-instances %d does not divide "
                      "dp %d × cp %d (parallel_state.py:922-926)",
                      o->optimizer_instances, dp, cp);
    int v = run->pp_schedule == MEMSIM_PP_INTERLEAVED ? MAX(run->virtual_stages, 1) : 1;
    const char *vf =
        mg->virtual_flag && v == mg->virtual_stages ? mg->virtual_flag : "virtual pipeline stages";
    if (v > 1 && pp < (mg->overlap_p2p_comm ? 2 : 3)) /* arguments.py:1000-1009 */
        return refuse(error, "megatron: %s need %s above %d%s (arguments.py:1000-1009)", vf,
                      layout_flags[1], mg->overlap_p2p_comm ? 1 : 2,
                      mg->overlap_p2p_comm ? "" : " with --no-overlap-p2p-communication");
    if (o->overlap_param_gather_with_step && v == 1)
        return refuse(error, "megatron: --overlap-param-gather-with-optimizer-step needs virtual "
                             "pipeline stages (arguments.py:1070-1072)");
    if (o->defer_embedding_wgrad && pp == 1) /* model_parallel_config.py:545-548 */
        return refuse(error,
                      "megatron: --defer-embedding-wgrad-compute needs %s above 1 "
                      "(model_parallel_config.py:545-548)",
                      layout_flags[1]);
    int chunks = v > 1 && pp > 1 ? v : 1;
    for (int s = 0; s < pp; s++)
        for (int c = 0; c < chunks; c++)
            if (mg_chunk_layers(o, m->L, pp, v, s, c) < 0) {
                const char *how = o->first_stage_layers || o->last_stage_layers
                                      ? " with --decoder-first/last-pipeline-num-layers "
                                        "(transformer_config.py:2296-2370)"
                                  : o->embedding_in_split || o->loss_in_split
                                      ? " with --account-for-embedding/loss-in-pipeline-split "
                                        "(transformer_config.py:2371-2411)"
                                      : " (arguments.py:990-998, transformer_block.py:155-182)";
                if (v > 1)
                    return refuse(error,
                                  "megatron: --num-layers %" G_GINT64_FORMAT ": the layers "
                                  "do not split into %s %d × %s%s",
                                  m->L, layout_flags[1], pp, vf, how);
                return refuse(error,
                              "megatron: --num-layers %" G_GINT64_FORMAT ": the layers do "
                              "not split into %s %d%s",
                              m->L, layout_flags[1], pp, how);
            }
    return TRUE;
}

gboolean mg_check_run(const MemsimMegatron *mg, const MemsimRun *run, GError **error)
{
    if (!mg_check_layout(mg, run, error))
        return FALSE;
    const MgOptions *o = &mg->o;
    int tp = run->tp > 0 ? run->tp : 1, pp = run->pp > 0 ? run->pp : 1, cp = o->cp;
    int dp = (int)(run->gpus / ((int64_t)tp * pp * cp));
    if (run->pp_schedule == MEMSIM_PP_INTERLEAVED) { /* schedules.py:1160-1180 */
        int M = run->microbatches, G = o->microbatch_group ? o->microbatch_group : pp;
        if (M && (G > M || G < pp))
            return refuse(error,
                          "megatron: --microbatch-group-size-per-virtual-pipeline-stage %d "
                          "is outside [%s %d, %d micro-batches] (schedules.py:1160-1168)",
                          G, layout_flags[1], pp, M);
        if (M && M % G && M % G < pp)
            return refuse(error,
                          "megatron: %d micro-batches leave a last group of %d, below %s %d "
                          "(--microbatch-group-size-per-virtual-pipeline-stage %d; "
                          "schedules.py:1172-1180)",
                          M, M % G, layout_flags[1], pp, G);
    }
    /* without --global-batch-size Megatron takes micro-batch × dp (arguments.py:702-704): one
     * micro-batch per step at the launch's layout, whatever a planner's candidate takes */
    int64_t G = global_batch_of(o, run->batch, dp);
    int64_t unit = run->batch * dp;
    if (unit && G % unit == 0 && G / unit > (1 << 16))
        return refuse(error,
                      "megatron: --global-batch-size %" G_GINT64_FORMAT " makes %" G_GINT64_FORMAT
                      " micro-batches of --micro-batch-size %" G_GINT64_FORMAT " per step; memsim "
                      "simulates at most 65536",
                      G, G / unit, run->batch);
    if (run->microbatches < 1 || (o->global_batch && unit * run->microbatches != G))
        return refuse(error,
                      "megatron: --global-batch-size %" G_GINT64_FORMAT " is not divisible "
                      "by --micro-batch-size %" G_GINT64_FORMAT " × dp %d (%d GPU%s / (tp %d "
                      "× pp %d × cp %d); num_microbatches_calculator.py:380-385)",
                      G, run->batch, dp, run->gpus, run->gpus == 1 ? "" : "s", tp, pp, cp);
    return TRUE;
}

gboolean memsim_megatron_set_gpus(MemsimMegatron *mg, int gpus, GError **error)
{
    g_return_val_if_fail(mg, FALSE);
    if (mg->world_given)
        return bad(error, mg->source,
                   "--gpus %d: the launch gives its world size (%s); give one "
                   "of them",
                   gpus, mg->world_source);
    if (gpus < 1)
        return bad(error, mg->source, "--gpus %d: at least one GPU", gpus);
    run_for(mg, gpus);
    g_free(mg->world_source);
    mg->world_source = g_strdup_printf("--gpus %d", gpus);
    if (mg->gpus_per_node > gpus || !mg->gpus_per_node)
        mg->gpus_per_node = MIN(gpus, 8);
    mg->run.gpus_per_node = mg->gpus_per_node;
    g_free(mg->describe);
    mg->describe = mg_describe(mg, &mg->run);
    if (!mg_check_run(mg, &mg->run, error)) {
        g_prefix_error(error, "%s: ", mg->source);
        return FALSE;
    }
    return TRUE;
}

/* ---- the description ---- */

static const char *on(bool b)
{
    return b ? "on" : "off";
}

char *mg_describe(const MemsimMegatron *mg, const MemsimRun *run)
{
    const MgOptions *o = &mg->o;
    GString *s = g_string_new("megatron: ");
    int tp = run->tp > 0 ? run->tp : 1, pp = run->pp > 0 ? run->pp : 1;
    int dp = (int)(run->gpus / ((int64_t)tp * pp * o->cp));
    MgAttn runs = mg_attention_run(o);
    if (o->impl == MG_IMPL_LOCAL)
        g_string_append_printf(s, "local, attention unfused (DotProductAttention), cp %d", o->cp);
    else if (runs != o->attention)
        g_string_append_printf(s, "te, attention %s: %s, cp %d", attention_names[o->attention],
                               attention_names[runs], o->cp);
    else
        g_string_append_printf(s, "te, attention %s, cp %d", attention_names[runs], o->cp);
    if (pp == 1 || run->pp_schedule == MEMSIM_PP_INTERLEAVED)
        g_string_append_printf(s, ", %d micro-batches", run->microbatches);
    if (run->pp_schedule == MEMSIM_PP_INTERLEAVED)
        g_string_append_printf(s, " (%d virtual stages, groups of %d)", run->virtual_stages,
                               o->microbatch_group ? o->microbatch_group : pp);
    g_string_append_printf(s, ", global batch %" G_GINT64_FORMAT,
                           (int64_t)run->batch * dp * run->microbatches);
    if (o->first_stage_layers || o->last_stage_layers)
        g_string_append_printf(s, ", stage layers first %d last %d", o->first_stage_layers,
                               o->last_stage_layers);
    if (o->embedding_in_split || o->loss_in_split)
        g_string_append_printf(s, ", %s%s%s in the pipeline split",
                               o->embedding_in_split ? "embedding" : "",
                               o->embedding_in_split && o->loss_in_split ? " and " : "",
                               o->loss_in_split ? "loss" : "");
    if (o->overlap_p2p_warmup_flush)
        g_string_append(s, ", p2p overlap in warmup/flush");
    g_string_append_printf(s, ", vocab %" G_GINT64_FORMAT " padded to %" G_GINT64_FORMAT " (%s)",
                           o->vocab, mg_padded_vocab(o, tp), o->tokenizer);
    g_string_append_printf(s, ", %s", o->rms_norm ? "RMSNorm" : "LayerNorm");
    g_string_append_printf(s, ", %s",
                           o->pos == MG_POS_ROPE   ? "rope"
                           : o->pos == MG_POS_NONE ? "no positions"
                                                   : "learned positions");
    if (o->qk_norm)
        g_string_append(s, ", qk-layernorm");
    g_string_append_printf(s, ", grads %s", o->grads_fp32 ? "fp32" : o->bf16 ? "bf16" : "fp16");
    if (o->fp16)
        g_string_append(s,
                        o->loss_scaling_dynamic ? ", dynamic loss scale" : ", static loss scale");
    if (o->distributed_optimizer)
        g_string_append_printf(s, ", distributed optimizer (%d instance%s)", o->optimizer_instances,
                               o->optimizer_instances == 1 ? "" : "s");
    else
        g_string_append(s, ", distributed optimizer off");
    g_string_append_printf(s, ", overlap grad-reduce %s, param-gather %s%s",
                           on(o->overlap_grad_reduce), on(o->overlap_param_gather),
                           o->overlap_param_gather_with_step ? " (with the step)" : "");
    if (o->bucket_size)
        g_string_append_printf(s, ", bucket %" G_GINT64_FORMAT, o->bucket_size);
    g_string_append_printf(s, ", grad-accum fusion %s", on(o->grad_accum_fusion));
    g_string_append_printf(s, ", recompute %s", recompute_names[o->recompute]);
    if (o->recompute == MG_RECOMPUTE_FULL)
        g_string_append_printf(s, " %s %d",
                               o->recompute_method == MG_RECOMPUTE_BLOCK ? "block" : "uniform",
                               o->recompute_layers);
    g_string_append_printf(s, ", fusions bias-act %s, bias-dropout %s, masked-softmax %s",
                           on(o->bias_gelu_fusion), on(o->bias_dropout_fusion),
                           on(o->masked_softmax_fusion));
    if (o->pos == MG_POS_ROPE)
        g_string_append_printf(s, ", rope %s", on(o->rope_fusion));
    g_string_append_printf(s, ", cross-entropy %s", on(o->ce_fusion));
    g_string_append_printf(s, ", softmax fp32 %s", on(o->softmax_fp32));
    if (o->defer_embedding_wgrad)
        g_string_append_printf(s, ", embedding wgrad deferred (limit %d)", o->wgrad_deferral_limit);
    g_string_append_printf(s, ", mask from the loader %s", on(o->attention_mask));
    g_string_append_printf(s, ", clip-grad %g", o->clip_grad);
    if (o->log_params_norm || o->log_num_zeros)
        g_string_append_printf(s, ", logs%s%s", o->log_params_norm ? " params-norm" : "",
                               o->log_num_zeros ? " zeros-in-grad" : "");
    if (o->cublas_workspace)
        g_string_append_printf(s, ", cuBLAS workspace %" G_GINT64_FORMAT " MiB",
                               o->cublas_workspace >> 20);
    if (o->alloc_conf)
        g_string_append_printf(s, ", PYTORCH_CUDA_ALLOC_CONF=%s", o->alloc_conf);
    return g_string_free(s, FALSE);
}

/* ---- the public calls ---- */

static void warnings_make(MemsimMegatron *mg, Launch *l, Parsed *p)
{
    mg->warnings = g_ptr_array_new_with_free_func(g_free);
    if (l->unknown->len) {
        g_ptr_array_add(l->unknown, NULL);
        g_autofree char *list = g_strjoinv(", ", (char **)l->unknown->pdata);
        g_ptr_array_add(mg->warnings,
                        g_strdup_printf("%s: not known: %s; ignored", mg->source, list));
    }
    if (p->small->len) {
        g_ptr_array_add(p->small, NULL);
        g_autofree char *list = g_strjoinv(", ", (char **)p->small->pdata);
        g_ptr_array_add(
            mg->warnings,
            g_strdup_printf("%s: not modelled (small changes of memory): %s", mg->source, list));
    }
    for (guint i = 0; i < l->notes->len; i++)
        g_ptr_array_add(mg->warnings,
                        g_strdup_printf("%s: %s", mg->source, (char *)l->notes->pdata[i]));
    g_ptr_array_add(mg->warnings, NULL);
}

MemsimMegatron *memsim_megatron_parse(const char *text, const char *where, GError **error)
{
    g_return_val_if_fail(text, NULL);
    where = where ? where : "megatron launch";
    Launch l;
    launch_init(&l, where);
    Parsed p = {.given = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free),
                .refused = g_ptr_array_new_with_free_func(g_free),
                .small = g_ptr_array_new_with_free_func(g_free)};
    args_init(&p.a);
    MemsimMegatron *mg = g_new0(MemsimMegatron, 1);
    mg->source = g_strdup(where);
    Launcher lr = {UNSET, UNSET, false};
    gboolean ok = launch_read(&l, text, strlen(text), error) && args_read(&l, &p, error) &&
                  launcher_read(&l, &lr, error) && world_of(mg, &l, &lr, error) &&
                  resolve(mg, &l, &p, error);
    if (ok) {
        run_init(mg, &p.a);
        run_for(mg, mg->world);
        mg->describe = mg_describe(mg, &mg->run);
        /* a launch that gives its world size is checked now; else when the world size is
         * known (memsim_megatron_set_gpus, memsim_run_check) */
        ok = !mg->world_given || mg_check_run(mg, &mg->run, error);
        if (!ok)
            g_prefix_error(error, "%s: ", where);
    }
    if (ok)
        warnings_make(mg, &l, &p);
    args_clear(&p.a);
    g_hash_table_unref(p.given);
    g_ptr_array_unref(p.refused);
    g_ptr_array_unref(p.small);
    launch_clear(&l);
    if (!ok) {
        memsim_megatron_free(mg);
        return NULL;
    }
    return mg;
}

MemsimMegatron *memsim_megatron_load(const char *path, GError **error)
{
    g_return_val_if_fail(path, NULL);
    g_autofree char *text = NULL;
    gsize len = 0;
    GError *e = NULL;
    if (!g_file_get_contents(path, &text, &len, &e)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s", e->message);
        g_error_free(e);
        return NULL;
    }
    if (strlen(text) != len)
        return bad(error, path, "holds a NUL byte: not a text file"), NULL;
    return memsim_megatron_parse(text, path, error);
}

void memsim_megatron_free(MemsimMegatron *mg)
{
    if (!mg)
        return;
    g_free(mg->source);
    if (mg->model) { /* made here (resolve), so freed here */
        g_free(mg->model->name);
        g_free(mg->model->model_type);
        g_free(mg->model);
    }
    g_free(mg->o.alloc_conf);
    if (mg->warnings)
        g_ptr_array_unref(mg->warnings);
    g_free(mg->describe);
    g_free(mg->world_source);
    g_free(mg->virtual_flag);
    g_free(mg);
}

const MemsimModel *memsim_megatron_model(const MemsimMegatron *mg)
{
    g_return_val_if_fail(mg, NULL);
    return mg->model;
}

const char *const *memsim_megatron_warnings(const MemsimMegatron *mg)
{
    g_return_val_if_fail(mg, NULL);
    return (const char *const *)mg->warnings->pdata;
}

const char *memsim_megatron_alloc_conf(const MemsimMegatron *mg)
{
    g_return_val_if_fail(mg, NULL);
    return mg->o.alloc_conf;
}
