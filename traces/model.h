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
};

#endif
