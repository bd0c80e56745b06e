/* Internal: a Megatron-LM launch as memsim reads it (traces/megatron.c) — the flags that
 * change memory, with Megatron's own defaults applied (megatron/training/arguments.py), and
 * what the generator needs beyond a MemsimRun (traces/distributed.c, traces/models.c). */
#ifndef MEMSIM_TRACES_MEGATRON_H
#define MEMSIM_TRACES_MEGATRON_H

#include <memsim/megatron.h>
#include <stdbool.h>

typedef enum { MG_IMPL_TE, MG_IMPL_LOCAL } MgImpl;

/* --attention-backend (TE picks at run time for auto); local = --transformer-impl local */
typedef enum { MG_ATTN_AUTO, MG_ATTN_FLASH, MG_ATTN_FUSED, MG_ATTN_UNFUSED, MG_ATTN_LOCAL } MgAttn;

typedef enum { MG_POS_LEARNED, MG_POS_ROPE, MG_POS_NONE } MgPos;

typedef enum { MG_RECOMPUTE_NONE, MG_RECOMPUTE_FULL, MG_RECOMPUTE_SELECTIVE } MgRecompute;
typedef enum { MG_RECOMPUTE_UNIFORM, MG_RECOMPUTE_BLOCK } MgRecomputeMethod;

typedef struct {
    /* parallelism (tp, pp, dp, sequence parallel, micro-batches, virtual stages are in the
     * MemsimRun) */
    int cp;                          /* --context-parallel-size */
    int first_stage_layers;          /* --decoder-first-pipeline-num-layers (0 = even) */
    int last_stage_layers;           /* --decoder-last-pipeline-num-layers (0 = even) */
    bool embedding_in_split;         /* --account-for-embedding-in-pipeline-split */
    bool loss_in_split;              /* --account-for-loss-in-pipeline-split */
    int microbatch_group;            /* --microbatch-group-size-per-virtual-pipeline-stage
                                      * (0 = pp) */
    bool overlap_p2p_warmup_flush;   /* --overlap-p2p-communication-warmup-flush */
    int64_t global_batch;            /* --global-batch-size (0 = micro-batch × dp, arguments.py:702) */
    bool decrease_batch;             /* --decrease-batch-size-if-needed: the global batch rounded
                                      * down to a multiple of micro-batch × dp */
    /* precision */
    bool fp16;                       /* --fp16 (else --bf16, or fp32 with neither) */
    bool bf16;
    bool grads_fp32;                 /* main grads accumulated and reduced in fp32 */
    bool loss_scaling_dynamic;       /* fp16 without --loss-scale */
    /* optimizer and data parallelism */
    bool distributed_optimizer;      /* --use-distributed-optimizer */
    int optimizer_instances;         /* --num-distributed-optimizer-instances */
    bool overlap_grad_reduce;
    bool overlap_param_gather;
    bool overlap_param_gather_with_step; /* --overlap-param-gather-with-optimizer-step */
    int64_t bucket_size;             /* --ddp-bucket-size, elements (0 = unset) */
    bool grad_accum_fusion;          /* gradient-accumulation fusion (on unless
                                      * --no-gradient-accumulation-fusion) */
    double clip_grad;                /* --clip-grad (default 1.0) */
    bool log_params_norm;            /* --log-params-norm */
    bool log_num_zeros;              /* --log-num-zeros-in-grad */
    bool check_nan;                  /* check_for_nan_in_loss_and_grad: the loss and each grad
                                      * bucket's norm checked for NaN and Inf */
    bool test_mode;                  /* --test-mode */
    bool p2p_sync;                   /* the pipeline's p2p exchanges end in a device synchronize
                                      * (batched p2p: no interleaved p2p overlap) */
    /* layers */
    MgImpl impl;                     /* --transformer-impl */
    MgAttn attention;                /* --attention-backend, resolved */
    bool ce_fusion;                  /* --cross-entropy-loss-fusion */
    bool defer_embedding_wgrad;      /* --defer-embedding-wgrad-compute */
    int wgrad_deferral_limit;        /* --wgrad-deferral-limit */
    bool attention_mask;             /* the data loader builds the attention mask */
    bool rope_fusion;                /* fused RoPE kernels (on unless --no-rope-fusion) */
    bool bias_dropout_fusion;        /* on unless --no-bias-dropout-fusion */
    bool bias_gelu_fusion;           /* bias + activation fusion: on unless --no-bias-gelu-fusion
                                      * (--no-bias-swiglu-fusion with --swiglu), off without
                                      * biases (argument_utils.py:314-319, arguments.py:1605) */
    bool masked_softmax_fusion;      /* on unless --no-masked-softmax-fusion */
    bool softmax_fp32;               /* --attention-softmax-in-fp32 */
    bool qk_layer_scaling;           /* --apply-query-key-layer-scaling */
    MgRecompute recompute;           /* --recompute-granularity */
    MgRecomputeMethod recompute_method;
    int recompute_layers;            /* --recompute-num-layers (with full recomputation) */
    /* model shape beyond the MemsimModel's fields */
    MgPos pos;                       /* --position-embedding-type */
    bool rms_norm;                   /* --normalization RMSNorm */
    bool swiglu;                     /* --swiglu */
    bool qk_norm;                    /* --qk-layernorm */
    int64_t vocab;                   /* the tokenizer's size, before padding */
    int64_t vocab_divisor;           /* --make-vocab-size-divisible-by (128) */
    int64_t padded_vocab;            /* --padded-vocab-size (0 = vocab padded: mg_padded_vocab) */
    const char *tokenizer;           /* --tokenizer-type (static) */
    char *alloc_conf;                /* PYTORCH_CUDA_ALLOC_CONF of the environment, or NULL */
    int64_t cublas_workspace;        /* CUBLAS_WORKSPACE_CONFIG's bytes (0 = unset) */
} MgOptions;

struct MemsimMegatron {
    char *source;                    /* the file read */
    MemsimModel *model;              /* family "megatron" (traces/model.h FAM_MEGATRON) */
    MemsimRun run;                   /* the run's settings as memsim's own (no strings owned) */
    MgOptions o;
    GPtrArray *warnings;             /* char *: flags not modelled, each once; NULL-terminated */
    char *describe;                  /* what the run: line adds, for the launch's own run */
    int world;                       /* GPUs in all */
    bool world_given;                /* the launch gives it (else a default: 1, or 8 for a YAML) */
    char *world_source;              /* how: "torchrun --nproc-per-node 8 × --nnodes 1", … */
    int gpus_per_node;               /* the launcher's processes per node (0 = not given) */
    int64_t micro_batch;             /* --micro-batch-size */
    int virtual_stages;              /* model chunks per pipeline rank (1 = not interleaved) */
    char *virtual_flag;              /* the flag that set it, for messages (NULL: none) */
    bool overlap_p2p_comm;           /* the interleaved schedule overlaps its p2p (on unless
                                      * --no-overlap-p2p-communication, arguments.py:3118) */
};

/* The attention that runs: Megatron's unfused DotProductAttention with the local spec; with
 * TE the backend asked for, and for auto the one TE picks on Hopper when dropout is on and
 * FlashAttention-3 is out: cuDNN's fused attention (TE dot_product_attention/utils.py
 * get_attention_backend prefers FusedAttention over FlashAttention on sm90). */
static inline MgAttn mg_attention_run(const MgOptions *o)
{
    if (o->impl == MG_IMPL_LOCAL)
        return MG_ATTN_LOCAL;
    return o->attention == MG_ATTN_AUTO ? MG_ATTN_FUSED : o->attention;
}

/* The padded vocabulary at tensor-parallel degree tp (arguments.py:2441 and
 * build_tokenizer.py:133-145: divisible by make_vocab_size_divisible_by × tp), or
 * --padded-vocab-size as given. */
int64_t mg_padded_vocab(const MgOptions *o, int tp);

/* The transformer layers in model chunk `chunk` (of v) of pipeline stage `stage` (of pp), as
 * Megatron builds them (transformer_block.py:76-200: --decoder-first/last-pipeline-num-layers,
 * --account-for-embedding/loss-in-pipeline-split); -1 when the layers do not split so
 * (mg_check_run says why). */
int64_t mg_chunk_layers(const MgOptions *o, int64_t L, int pp, int v, int stage, int chunk);

/* FALSE with an error naming Megatron's flags when `run` (a Megatron launch's run, or a
 * planner's candidate around it) is a layout Megatron refuses: TP × PP × CP not dividing the
 * GPUs, TP not dividing the heads, layers that do not split into the stages (of run->pp, with
 * run->virtual_stages when interleaved), … mg_check_run adds the micro-batches: a global batch
 * that does not divide, an interleaved schedule's groups (memsim_run_check calls it for a run
 * with run->megatron). */
gboolean mg_check_layout(const struct MemsimMegatron *mg, const MemsimRun *run, GError **error);
gboolean mg_check_run(const struct MemsimMegatron *mg, const MemsimRun *run, GError **error);

/* The run settings memsim_megatron_apply sets: bits of MemsimRun.given by SettingId
 * (memsim_megatron_sets, in traces/settings.c, reads it by name). */
guint64 mg_sets_mask(const struct MemsimMegatron *mg);

/* What the run: line adds for `run` (newly allocated): the Megatron options used. */
char *mg_describe(const struct MemsimMegatron *mg, const MemsimRun *run);

#endif
