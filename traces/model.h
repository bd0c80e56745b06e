/* Internal: a model as the generator sees it — the config.json fields that change memory,
 * with each family's defaults applied (HF_MODELS.md §3). Dimension letters as there:
 * V vocab, H hidden, L layers, nh heads, nkv key/value heads, hd head dim, I MLP width. */
#ifndef MEMSIM_TRACES_MODEL_H
#define MEMSIM_TRACES_MODEL_H

#include <memsim/gen.h>
#include "traces/megatron.h"
#include <stdbool.h>

typedef enum {
    FAM_LLAMA, /* llama, mistral, qwen2 (and gemma-like variants by config) */
    FAM_GPT2,
    FAM_OPT,
    FAM_BLOOM,
    FAM_NEOX,
    FAM_FALCON,
    FAM_GPTNEO,
    FAM_CODEGEN,
    FAM_MIXTRAL,
    FAM_MEGATRON, /* Megatron-LM's GPTModel, built from its launch flags (traces/megatron.c) */
    FAM_COUNT
} Family;

struct MemsimModel {
    char *name;
    char *model_type;
    Family fam;
    int64_t V, H, L, nh, nkv, hd, I, max_pos;
    bool tie;
    bool qkv_bias;   /* bias on q, k, v (Llama attention_bias, Qwen2 always) */
    bool o_bias;     /* bias on the attention output */
    bool mlp_bias;
    char act[32];    /* hidden_act / activation_function */
    double embd_pdrop, attn_pdrop, resid_pdrop; /* dropout probabilities */
    bool use_cache;
    double rotary_pct;      /* NeoX partial rotary (1.0 = full) */
    bool parallel_residual; /* NeoX, Falcon parallel_attn, GPT-J style */
    bool pre_ln;            /* OPT do_layer_norm_before */
    int64_t wep;            /* OPT word_embed_proj_dim */
    int64_t n_experts, top_k;
    int64_t sliding_window; /* 0 = none */
    bool falcon_new_arch;
    int64_t rotary_dim;     /* CodeGen / GPT-J rotary_dim (0 = none) */
    const MgOptions *mg;    /* FAM_MEGATRON: the launch's options (owned by its MemsimMegatron) */
    /* Llama-derived families (traces/families.c; FAM_LLAMA, or FAM_MIXTRAL with experts) */
    char arch[24];          /* the family as reported (qwen3, gemma2, phi3, ...); "" = fam's */
    int qk_norm;            /* RMSNorm on q and k: 0 none, 1 per head [hd] (Qwen3, Gemma 3),
                             * 2 over the projection [nh·hd] (OLMo-2) */
    bool gemma;             /* GemmaRMSNorm (1 + w, in fp32) and the √H-scaled embedding */
    bool sandwich;          /* Gemma 2/3: norms before and after attention and MLP (4) */
    bool post_norms;        /* OLMo-2: norms after attention and MLP only (no pre-norm) */
    bool rope_local;        /* Gemma 3: the sliding layers rotate with tables of their own
                             * (rope_local_base_freq: Gemma3TextModel.rotary_emb_local) */
    bool mrope;             /* Qwen2-VL's text model: the multimodal rotary (rope_scaling mrope) */
    bool np_norms;          /* OLMo: OlmoLayerNorm, F.layer_norm in fp32 without weight or bias */
    double clip_qkv;        /* OLMo: q, k and v clamped in place to ±clip_qkv (0 = none) */
    double final_softcap;   /* Gemma 2: tanh soft-capping of the logits (0 = none) */
    double attn_softcap;    /* Gemma 2: of the attention scores (eager only) */
    bool ln_norms;          /* StarCoder2: nn.LayerNorm (weight and bias) for every norm */
    bool plain_mlp;         /* StarCoder2: c_proj(act(c_fc(x))), with mlp_bias */
    bool fused_qkv;         /* Phi-3: qkv_proj [(nh + 2 nkv) hd, H] */
    bool fused_gate_up;     /* Phi-3: gate_up_proj [2 I, H] */
    int64_t moe_I;          /* routed experts' width (moe_intermediate_size; 0 = I) */
    int64_t shared_I;       /* the shared experts' total width (0 = none) */
    bool shared_gate;       /* Qwen2-MoE: sigmoid(shared_expert_gate(x)) * shared_expert(x) */
    int64_t first_dense;    /* DeepSeek: first_k_dense_replace layers use the dense MLP */
    int64_t moe_every;      /* Qwen2-MoE decoder_sparse_step (layer l is MoE when
                             * (l + 1) % moe_every == 0); 0 or 1 = every layer */
    bool norm_topk;         /* routing weights renormalised over the top k */
    bool router_bias;       /* DeepSeek-V3: e_score_correction_bias [E] */
    int64_t sw_from;        /* Qwen2: the first sliding layer (max_window_layers) */
    int sw_pattern;         /* layer l slides when (l + 1) % sw_pattern != 0 (Gemma 2: 2,
                             * Gemma 3: sliding_window_pattern); 0 = every layer from sw_from */
    /* DeepSeek multi-head latent attention (0 = none) */
    int64_t kv_lora, q_lora, qk_nope, qk_rope, v_hd;
};

/* Whether layer l attends through the sliding window (traces/config.c). */
gboolean model_layer_is_sliding(const MemsimModel *m, int64_t l);
/* The run settings that depend on the model, checked for it (traces/run.c: --moe-imbalance
 * needs experts run one by one); FALSE with MEMSIM_ERROR_BAD_INPUT naming the setting. Called by
 * memsim_generate and by the planner before its sweep. */
gboolean model_check_run(const MemsimModel *m, const MemsimRun *run, GError **error);

/* Whether layer l has routed experts (traces/config.c). */
gboolean model_layer_is_moe(const MemsimModel *m, int64_t l);

#endif
