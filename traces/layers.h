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
    AgTensor *cos4_sw, *sin4_sw; /* their rotary tables, when they have their own (Gemma 3) */
    bool eager;
    /* Transformers 4.38's Llama (traces/hf_versions.c causal-mask-max-pos): `mask` is the
     * (B,1,P,P) mask of max_position_embeddings P that each attention indexes
     * (mask[:, :, cache_position, :S], a copy), and SDPA takes that copy as attn_mask and saves
     * it for backward (bias_saved) */
    bool mask_indexed;
    bool bias_saved;
} Fwd;

AgTensor *nn_param(Model *md, DType dt, int nd, const int64_t *shape, bool trainable);
AgTensor *nn_buffer(Model *md, DType dt, int nd, const int64_t *shape);
bool nn_full_ft(const Model *md);
void nn_lin_make(Model *md, Lin *l, const char *name, int64_t out, int64_t in, bool bias,
                     bool conv1d);
/* A collective among n ranks over `link` moving `bytes` (the full, unsharded size), as NCCL's
 * Ring algorithm takes it (NVIDIA/nccl src/graph/tuning.cc ncclTopoTuneModel with
 * ncclTopoGetAlgoTime): the latency baseLat + nsteps · hwLat, nsteps = 2(n − 1) for an
 * all-reduce, n − 1 for an all-gather or reduce-scatter, 1 for a send or recv; plus the bytes
 * at the ring's algorithm bandwidth, busBw · n / nsteps (all-reduce 2(n − 1)/n of the bytes
 * per link, all-gather and reduce-scatter (n − 1)/n, send/recv all of them). */
double comm_link_us(CommLink link, MemsimCollectiveKind kind, uint64_t bytes, int n);
/* Its latency part alone. */
double comm_link_latency_us(CommLink link, MemsimCollectiveKind kind, int n);
double nn_tp_us(const Model *md, MemsimCollectiveKind kind, uint64_t bytes);
AgTensor *nn_sp_column_linear(Model *md, Lin *l, AgTensor *x);
AgTensor *nn_sp_reduce_scatter(Model *md, AgTensor *full);
AgTensor *nn_lin(Model *md, Lin *l, AgTensor *x);
/* The part every RMSNorm shares: x.to(f32), pow, mean, + eps, rsqrt, x * rsqrt (fp32; the
 * variants differ in how the weight is applied and where they cast back). */
AgTensor *nn_rms_normalize(Model *md, AgTensor *x);
AgTensor *nn_rmsnorm(Model *md, AgTensor *x, AgTensor *w);
AgTensor *nn_layernorm(Model *md, AgTensor *x, AgTensor *w, AgTensor *b);
AgTensor *nn_act(Model *md, AgTensor *x);
void nn_rotary(Model *md, int64_t rd, AgTensor *pos, AgTensor **cos, AgTensor **sin);
void nn_rope_tables(Model *md, const struct Fwd *f, AgTensor **cos4, AgTensor **sin4);
AgTensor *nn_apply_rope(Model *md, AgTensor *q, AgTensor *cos4, AgTensor *sin4);
AgTensor *nn_apply_rope_partial(Model *md, AgTensor *q, int64_t rd, AgTensor *cos4,
                                    AgTensor *sin4);
AgTensor *nn_attn_sdpa_math(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v);
AgTensor *nn_attention(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v, bool scale);
void nn_cache_update(Model *md, AgTensor **k, AgTensor **v);

#endif
