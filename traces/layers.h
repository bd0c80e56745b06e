/* Internal: the building blocks of the model families (traces/layers.c) — parameters and
 * LoRA-wrapped linears, tensor and sequence parallelism, norms, activations, rotary
 * embeddings, the attention paths and the KV cache — used by traces/models.c. */
#ifndef MEMSIM_TRACES_LAYERS_H
#define MEMSIM_TRACES_LAYERS_H

#include "traces/models.h"

/* What one forward pass shares across its layers. */
typedef struct Fwd {
    AgTensor *mask;   /* eager: additive (B,1,S,S) in the activation dtype; NULL = causal */
    AgTensor *cos4, *sin4;
    AgTensor *mask_sw; /* the sliding-window layers' mask, when it differs from `mask` */
    bool eager;
} Fwd;

AgTensor *nn_param(Model *md, DType dt, int nd, const int64_t *shape, bool trainable);
AgTensor *nn_buffer(Model *md, DType dt, int nd, const int64_t *shape);
bool nn_full_ft(const Model *md);
void nn_lin_make(Model *md, Lin *l, const char *name, int64_t out, int64_t in, bool bias,
                     bool conv1d);
double nn_tp_us(const Model *md, MemsimCollectiveKind kind, uint64_t bytes);
AgTensor *nn_sp_column_linear(Model *md, Lin *l, AgTensor *x);
AgTensor *nn_sp_reduce_scatter(Model *md, AgTensor *full);
AgTensor *nn_lin(Model *md, Lin *l, AgTensor *x);
AgTensor *nn_rmsnorm(Model *md, AgTensor *x, AgTensor *w);
AgTensor *nn_layernorm(Model *md, AgTensor *x, AgTensor *w, AgTensor *b);
AgTensor *nn_act(Model *md, AgTensor *x);
void nn_rotary(Model *md, int64_t rd, AgTensor *pos, AgTensor **cos, AgTensor **sin);
AgTensor *nn_apply_rope(Model *md, AgTensor *q, AgTensor *cos4, AgTensor *sin4);
AgTensor *nn_apply_rope_partial(Model *md, AgTensor *q, int64_t rd, AgTensor *cos4,
                                    AgTensor *sin4);
AgTensor *nn_attn_sdpa_math(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v);
AgTensor *nn_attention(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v, bool scale);
void nn_cache_update(Model *md, AgTensor **k, AgTensor **v);

#endif
