/* Internal: the model families' parameters and forward passes, written after the Hugging
 * Face implementations (HF_MODELS.md §2–3), on the op library. */
#ifndef MEMSIM_TRACES_MODELS_H
#define MEMSIM_TRACES_MODELS_H

#include "traces/model.h"
#include "traces/ops.h"

/* A linear layer: weight [out, in] (nn.Linear) or [in, out] (GPT-2 Conv1D), optional
 * bias, optional LoRA adapters, optional 4-bit base weight. */
typedef struct {
    AgTensor *w, *b;
    AgTensor *lora_a, *lora_b;
    AgTensor *absmax;  /* QLoRA: the fp32 absmax of the packed weight (not a reference) */
    bool conv1d;
    bool quant4;   /* QLoRA: w holds the packed 4-bit weight; dequantised per use */
    bool row_parallel; /* tensor parallelism: input split, output all-reduced */
    int64_t out, in;
    const char *name;
} Lin;

typedef struct {
    Lin q, k, v, o, qkv;     /* qkv: fused projections (GPT-2, NeoX, BLOOM, Falcon) */
    Lin gate, up, down;      /* MLP (Llama: gate/up/down; others: up = fc1, down = fc2) */
    AgTensor *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    AgTensor *qn_w, *qn_b, *kn_w, *kn_b; /* Megatron --qk-layernorm */
    AgTensor *router;        /* MoE */
    Lin *experts;            /* MoE: 3 per expert (gate, up, down) */
    /* Llama-derived families (traces/families.c) */
    AgTensor *ln3_w, *ln4_w; /* Gemma 2/3: pre_feedforward_layernorm, post_feedforward_layernorm */
    Lin q_a, q_b, kv_a, kv_b; /* DeepSeek MLA: q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj */
    AgTensor *q_a_ln, *kv_a_ln;
    Lin sh_gate, sh_up, sh_down, sh_g; /* shared experts; Qwen2-MoE's shared_expert_gate */
    AgTensor *router_b;      /* DeepSeek-V3 e_score_correction_bias */
    AgTensor *gate_up_w, *down_w; /* the routed experts, fused: [E, 2 I, H], [E, H, I] */
    bool moe;                /* this layer has routed experts */
} Layer;

/* The modules of a causal LM outside its layers, as AgContext.module tags: the ops of the
 * CausalLM wrapper itself (the loss, the logits' upcast) carry MODULE_ROOT; the base model's
 * (position embeddings, masks, the final norm) and its layers' MODULE_BASE; the token
 * embedding's MODULE_EMBED; the output projection's MODULE_HEAD. */
enum { MODULE_ROOT = 0, MODULE_BASE = 1, MODULE_EMBED = 2, MODULE_HEAD = 3 };

/* A group's link for collectives' durations (comm_link_us in traces/layers.h): µs per byte at
 * the link's reached bandwidth, NCCL's base latency and its latency per ring step. */
typedef struct {
    double us_per_byte, base_us, hop_us;
} CommLink;

typedef struct Model {
    AgGraph *g;
    const MemsimModel *m;
    const MemsimRun *run;
    DType pdt;       /* parameter dtype */
    DType adt;       /* dtype of the residual stream / module outputs */
    GPtrArray *trainable; /* optimizer order */
    GPtrArray *leaves;    /* every parameter and buffer (references) */
    AgTensor *wte, *wpe, *lm_head, *lm_bias, *norm_w, *norm_b, *proj_in, *proj_out;
    bool final_norm;               /* this part ends with the model's final norm */
    AgTensor *emb_ln_w, *emb_ln_b; /* BLOOM word_embeddings_layernorm */
    AgTensor *inv_freq;   /* rotary buffer */
    Layer *layers;
    double lora_scaling;
    /* this rank's part of the model (pipeline stage, tensor-parallel shard) */
    int tp;               /* tensor-parallel degree (1 = none) */
    bool sp;              /* sequence parallelism: norms, dropouts, residuals on S/tp tokens */
    AgTensor *sp_buf;     /* the global gather buffer (sequence parallelism) */
    int64_t l0, l1;       /* layers [l0, l1) */
    bool first, last;     /* holds the embedding / the head and loss */
    CommLink comm_us_per_byte; /* the tensor-parallel group's link */
    MemsimModel local;    /* the config with heads, widths and vocabulary divided by tp */
    /* (optional) called before and after each layer's forward (distributed methods) */
    void (*layer_hook)(struct Model *md, int32_t layer, bool pre);
    /* (optional) called before and after the forward of the modules outside the layers
     * (ModelModule): the base model around everything but the head, the token embedding, the
     * output projection; their ops carry the tag in AgContext.module for the backward */
    void (*module_hook)(struct Model *md, int module, bool pre);
    GPtrArray *cache;     /* the DynamicCache of the last forward: K/V per layer (references) */
    GPtrArray *past;      /* generation: the cache before this forward (K, V per layer, the
                           * references handed over); each layer's update concatenates its
                           * entry with the new K/V and drops it, as DynamicLayer.update does */
    bool last_logits_only; /* generation: lm_head on the last position (logits_to_keep=1) */
    int64_t B, S;
    /* Megatron (traces/megatron_model.c): what the process's chunks share, and the forward in
     * progress */
    struct MgShared *mgs;
    void *mg_stage;
} Model;

/* Creates every parameter and buffer (in module registration order). FALSE with error for
 * a bad LoRA target. */
gboolean model_build(Model *md, AgGraph *g, const MemsimModel *m, const MemsimRun *run,
                     GError **error);
/* One forward of the causal-LM with labels: returns the loss (new reference); *logits gets
 * the logits the output object holds (new reference). */
AgTensor *model_forward(Model *md, AgTensor *ids, AgTensor *labels, AgTensor **logits);
/* One forward of this rank's part: the first stage embeds `ids`, the others start from
 * `x_in`; the last stage returns the loss (and *logits), the others return NULL and set
 * *hidden_out (the activation to send on). */
AgTensor *model_stage_forward(Model *md, AgTensor *ids, AgTensor *x_in, AgTensor *labels,
                              AgTensor **logits_out, AgTensor **hidden_out);
/* Like model_build for one pipeline stage and tensor-parallel rank. */
gboolean model_build_part(Model *md, AgGraph *g, const MemsimModel *m, const MemsimRun *run,
                          int tp, int64_t l0, int64_t l1, GError **error);
void model_clear(Model *md);
/* What a Megatron process's model chunks share: the global memory buffer ("mpu"), Transformer
 * Engine's cuBLAS workspace, the persistent dummy weight gradients of gradient-accumulation
 * fusion (one per weight shape). */
typedef struct MgShared {
    AgTensor *mpu;
    AgTensor *te_workspace;
    AgTensor *freqs;   /* RoPE's cached frequencies */
    GHashTable *dummy;
    /* --defer-embedding-wgrad-compute: the output layer's inputs and output gradients kept for
     * the drain after the last backward of the step (references) */
    GPtrArray *defer_in, *defer_grad; /* "outxin" → AgTensor* (a reference) */
    int dp;            /* the data-parallel group's size and link (--test-mode's gathers) */
    CommLink dp_cost;
} MgShared;

/* Like model_build_part with the stage's ends given: a Megatron chunk may hold no layer but
 * the embedding or the loss (--account-for-*-in-pipeline-split). */
gboolean model_build_chunk(Model *md, AgGraph *g, const MemsimModel *m, const MemsimRun *run,
                           int tp, int64_t l0, int64_t l1, bool first, bool last,
                           GError **error);
/* Megatron's GPTModel (traces/megatron_model.c): its parameters for layers [l0, l1), and one
 * forward of the chunk (the loss on the last stage; else NULL and *hidden_out). */
gboolean mg_build(Model *md, const MemsimModel *m, int64_t l0, int64_t l1, GError **error);
AgTensor *mg_stage_forward(Model *md, AgTensor *x_in, AgTensor **hidden_out);
/* Drops the model output object's references: the KV cache it holds. */
void model_drop_output(Model *md);
/* The per-rank programs of a distributed run (traces/distributed.c). `stages` (Megatron: one
 * flag per pipeline stage; NULL = all): the stages whose programs are made, in stage order,
 * each as it is in the whole run (a stage's program does not depend on the others'). */
gboolean memsim_generate_distributed(const MemsimModel *m, const MemsimRun *run, MemsimTrace *t,
                                     const AgRules *rules, const gboolean *stages,
                                     GError **error);
/* memsim_generate with only some of a Megatron run's pipeline stages (`stages`, one flag per
 * stage; NULL = all): for the planner's bounds (traces/plan/bound.c), which read stage
 * programs one by one and never replay such a trace. */
MemsimTrace *memsim_generate_stages(const MemsimModel *m, const MemsimRun *run,
                                    const gboolean *stages, GError **error);
/* The events a run's trace holds over all its ranks, estimated from its shape before any is
 * generated (an adapted run, memsim_run_adapt): about 600 per layer and micro-batch of
 * training, 150 more per routed expert run one by one, 200 per layer and token step of
 * generation; a loop's generated micro-batches and steps only (loop_repeats). */
double model_run_events(const MemsimModel *m, const MemsimRun *run);
/* What the estimate may be off by: every preset's trace, under each method, holds fewer events
 * than this many times it (tests/test_steady.c events_are_bounded_by_the_shape). */
#define MODEL_EVENTS_MARGIN 4.0

/* The Llama-derived families (traces/families.c): a layer's parameters in registration
 * order, its forward, and the model's own extras. */
struct Fwd;
/* The token rows expert e of E takes of T tokens routed to K experts each, the most-loaded
 * (the last) at `imbalance` times the uniform share (traces/models.c). */
int64_t model_expert_rows(int64_t T, int64_t K, int64_t E, double imbalance, int64_t e);
bool fam_modern(const MemsimModel *m);
void fam_build_layer(Model *md, Layer *ly, int64_t l);
AgTensor *fam_layer(Model *md, struct Fwd *f, Layer *ly, AgTensor *x);
AgTensor *fam_norm(Model *md, AgTensor *x, AgTensor *w, AgTensor *b);
AgTensor *fam_embed_scale(Model *md, AgTensor *x);
AgTensor *fam_final_softcap(Model *md, AgTensor *logits);
int64_t fam_rotary_dim(const MemsimModel *m);
const char *fam_module_names(const MemsimModel *m);
const char *fam_lora_default_targets(const MemsimModel *m); /* NULL: none */

/* peft's default LoRA target modules for a family (comma-separated). */
const char *model_lora_default_targets(Family f);

#endif
