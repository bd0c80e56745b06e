/* The building blocks of the model families (traces/layers.h), written after the Hugging
 * Face modeling files and PyTorch's modules as HF_MODELS.md §2 and AUTOGRAD_MEMORY.md
 * describe them. Dimension letters: B batch, S sequence, H hidden, I MLP width, nh / nkv
 * heads, hd head dim.
 */
#include "traces/layers.h"

#include <math.h>
#include <string.h>

#define U(x) gt_unref(md->g, (x))

/* ---- parameters ---- */

static AgTensor *leaf(Model *md, DType dt, int nd, const int64_t *shape, bool trainable,
                      uint8_t cat)
{
    AgTensor *p = gg_leaf(md->g, dt, nd, shape, trainable, cat);
    g_ptr_array_add(md->leaves, p);
    if (trainable)
        g_ptr_array_add(md->trainable, p);
    return p;
}

AgTensor *nn_param(Model *md, DType dt, int nd, const int64_t *shape, bool trainable)
{
    return leaf(md, dt, nd, shape, trainable, MEMSIM_CAT_PARAMETER);
}

/* A registered buffer: not a parameter (rotary frequencies, causal tables). */
AgTensor *nn_buffer(Model *md, DType dt, int nd, const int64_t *shape)
{
    return leaf(md, dt, nd, shape, false, MEMSIM_CAT_OTHER);
}

bool nn_full_ft(const Model *md)
{
    return md->run->finetune == MEMSIM_FT_FULL && !md->run->inference;
}

static bool is_target(const Model *md, const char *name)
{
    if (md->run->finetune == MEMSIM_FT_FULL || md->run->inference)
        return false;
    for (char **t = md->run->lora_targets; t && *t; t++)
        if (strcmp(*t, name) == 0)
            return true;
    return false;
}

void nn_lin_make(Model *md, Lin *l, const char *name, int64_t out, int64_t in, bool bias,
                     bool conv1d)
{
    l->name = name;
    l->out = out;
    l->in = in;
    l->conv1d = conv1d;
    bool train = nn_full_ft(md);
    bool q4 = md->run->finetune == MEMSIM_FT_QLORA ||
              (md->run->inference && md->run->weights == MEMSIM_WEIGHTS_4BIT);
    bool i8 = md->run->inference && md->run->weights == MEMSIM_WEIGHTS_INT8;
    if (q4) {
        /* bitsandbytes NF4: two weights per byte, plus one fp32 absmax per 64 weights */
        l->quant4 = true;
        l->w = nn_param(md, DT_U8, SHAPE(out * in / 2), false);
        l->b = NULL;
        l->absmax = nn_param(md, DT_F32, SHAPE((out * in + 63) / 64), false); /* lives with w */
    } else if (i8) {
        l->w = nn_param(md, DT_U8, SHAPE(out, in), false);
    } else {
        l->w = conv1d ? nn_param(md, md->pdt, SHAPE(in, out), train)
                      : nn_param(md, md->pdt, SHAPE(out, in), train);
    }
    if (bias && !q4)
        l->b = nn_param(md, md->pdt, SHAPE(out), train);
    if (is_target(md, name)) {
        /* peft: adapters in fp32 (autocast_adapter_dtype), A [r, in], B [out, r] */
        int64_t r = md->run->lora_rank;
        l->lora_a = nn_param(md, DT_F32, SHAPE(r, in), true);
        l->lora_b = nn_param(md, DT_F32, SHAPE(out, r), true);
    }
}

/* ---- layers ---- */

/* A tensor-parallel collective of `bytes` (full size) over the tp ranks' ring. */
double comm_link_latency_us(CommLink link, MemsimCollectiveKind kind, int n)
{
    bool p2p = kind == MEMSIM_COLL_SEND || kind == MEMSIM_COLL_RECV;
    if (n <= 1 && !p2p)
        return 0.0;
    double steps = p2p ? 1.0 : kind == MEMSIM_COLL_ALL_REDUCE ? 2.0 * (n - 1) : (double)(n - 1);
    return link.base_us + steps * link.hop_us;
}

double comm_link_us(CommLink link, MemsimCollectiveKind kind, uint64_t bytes, int n)
{
    bool p2p = kind == MEMSIM_COLL_SEND || kind == MEMSIM_COLL_RECV;
    if (n <= 1 && !p2p)
        return 0.0;
    double f = p2p                              ? 1.0
               : kind == MEMSIM_COLL_ALL_REDUCE ? 2.0 * (n - 1) / n
                                                : (double)(n - 1) / n;
    return comm_link_latency_us(link, kind, n) + f * (double)bytes * link.us_per_byte;
}

double nn_tp_us(const Model *md, MemsimCollectiveKind kind, uint64_t bytes)
{
    return comm_link_us(md->comm_us_per_byte, kind, bytes, md->tp);
}

static AgTensor *lin_local(Model *md, Lin *l, AgTensor *x);

/* A tensor-parallel row-parallel layer's output is all-reduced in place (no nn_buffer). */
/* ---- sequence parallelism (Megatron; DISTRIBUTED.md §5.1) ---- */

/* The global memory buffer: one persistent [B, S, H] tensor that column-parallel inputs are
 * all-gathered into (re-allocated only for a larger size). */
static AgTensor *sp_buffer(Model *md, const AgTensor *x)
{
    int64_t n = md->B * md->S * x->shape[x->nd - 1];
    if (!md->sp_buf || gt_numel(md->sp_buf) < n) {
        gt_unref(md->g, md->sp_buf);
        AgContext *c = gg_ctx(md->g);
        uint8_t old = c->category;
        c->category = MEMSIM_CAT_COMM_BUFFER;
        md->sp_buf = op_new(md->g, "GlobalMemoryBuffer", x->dt, 1, (int64_t[]){n});
        c->category = old;
    }
    return md->sp_buf;
}

/* Column-parallel linear on a sequence-sharded input: the input is gathered into the global
 * buffer (not saved); autograd keeps the sharded input and the weight. Backward re-gathers
 * into the same nn_buffer, computes the full input gradient and reduce-scatters it into a new
 * sharded tensor, and computes the weight gradient. */
static void bw_sp_linear(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    const AgTensor *xs = n->in_meta[0], *w = n->in_meta[1];
    int64_t tp = n->iarg[0];
    if (n->next[0].node) {
        int64_t sh[GT_MAXDIM];
        memcpy(sh, xs->shape, sizeof sh);
        sh[1] *= tp;
        gg_op(g, "mm");
        gg_flops(g, 2.0 * (double)gt_numel(gin[0]) * (double)w->shape[1]);
        AgTensor *full = gt_empty(g, gin[0]->dt, xs->nd, sh);
        gg_collective(g, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)gt_nbytes(full), 1,
                      n->farg[1] + n->farg[0] * (double)gt_nbytes(full) * (tp - 1) / tp);
        gout[0] = gt_empty(g, gin[0]->dt, xs->nd, xs->shape);
        gt_unref(g, full);
    }
    if (n->next[1].node) {
        gg_op(g, "mm");
        gg_flops(g, 2.0 * (double)gt_numel(gin[0]) * (double)w->shape[1]);
        gout[1] = gt_empty(g, gin[0]->dt, w->nd, w->shape);
    }
    if (n->n_next > 2 && n->next[2].node) {
        gg_op(g, "sum");
        gout[2] = gt_empty(g, gin[0]->dt, n->in_meta[2]->nd, n->in_meta[2]->shape);
    }
}

AgTensor *nn_sp_column_linear(Model *md, Lin *l, AgTensor *x)
{
    AgGraph *g = md->g;
    sp_buffer(md, x);
    gg_collective(g, MEMSIM_COLL_ALL_GATHER, (uint64_t)gt_nbytes(x) * (uint64_t)md->tp, 1,
                  nn_tp_us(md, MEMSIM_COLL_ALL_GATHER, (uint64_t)gt_nbytes(x) * (uint64_t)md->tp));
    gg_op(g, "linear");
    gg_flops(g, 2.0 * (double)gt_numel(x) * (double)md->tp * (double)l->out);
    int64_t sh[GT_MAXDIM];
    memcpy(sh, x->shape, sizeof sh);
    sh[1] *= md->tp;
    sh[x->nd - 1] = l->out;
    AgTensor *out = gt_empty(g, x->dt, x->nd, sh);
    AgTensor *xs[3] = {x, l->w, l->b};
    if (gg_needs_grad(g, l->b ? 3 : 2, xs)) {
        AgNode *n = gn_new(g, "LinearWithGradAccumulationAndAsyncCommunicationBackward",
                           bw_sp_linear, 1);
        for (int i = 0; i < (l->b ? 3 : 2); i++)
            gn_add_input(g, n, xs[i]);
        n->iarg[0] = md->tp;
        n->farg[0] = md->comm_us_per_byte.us_per_byte;
        n->farg[1] = comm_link_latency_us(md->comm_us_per_byte, MEMSIM_COLL_REDUCE_SCATTER, md->tp);
        gn_save(g, n, x);
        gn_save(g, n, l->w);
        gn_set_output(n, out, 0);
    }
    return out;
}

/* Row-parallel output reduce-scattered into a new sequence-sharded tensor; its backward
 * all-gathers the gradient into a new full tensor. */
static void bw_sp_scatter(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    /* farg[0]: the ring's µs per byte of the full size */
    gg_collective(g, MEMSIM_COLL_ALL_GATHER, (uint64_t)gt_nbytes(n->in_meta[0]), 1,
                  n->farg[1] + n->farg[0] * (double)gt_nbytes(n->in_meta[0]));
    gout[0] = gt_empty(g, gin[0]->dt, n->in_meta[0]->nd, n->in_meta[0]->shape);
}

AgTensor *nn_sp_reduce_scatter(Model *md, AgTensor *full)
{
    AgGraph *g = md->g;
    gg_collective(g, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)gt_nbytes(full), 1,
                  nn_tp_us(md, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)gt_nbytes(full)));
    int64_t sh[GT_MAXDIM];
    memcpy(sh, full->shape, sizeof sh);
    sh[1] /= md->tp;
    AgTensor *out = gt_empty(g, full->dt, full->nd, sh);
    AgNode *n = gg_needs_grad(g, 1, &full) ? gn_new(g, "_ReduceScatterToSequenceParallelRegionBackward", bw_sp_scatter, 1) : NULL;
    if (n) {
        gn_add_input(g, n, full);
        n->farg[0] = md->comm_us_per_byte.us_per_byte * (md->tp - 1) / md->tp;
        n->farg[1] = comm_link_latency_us(md->comm_us_per_byte, MEMSIM_COLL_ALL_GATHER, md->tp);
        gn_set_output(n, out, 0);
    }
    return out;
}

AgTensor *nn_lin(Model *md, Lin *l, AgTensor *x)
{
    if (md->sp && !l->row_parallel && !l->lora_a && !l->quant4)
        return nn_sp_column_linear(md, l, x);
    AgTensor *out = lin_local(md, l, x);
    if (md->tp > 1 && l->row_parallel) {
        if (md->sp) {
            AgTensor *r = nn_sp_reduce_scatter(md, out);
            gt_unref(md->g, out);
            return r;
        }
        gg_collective(md->g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(out), 1,
                      nn_tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(out)));
    }
    return out;
}

static AgTensor *lin_local(Model *md, Lin *l, AgTensor *x)
{
    AgGraph *g = md->g;
    AgTensor *out;
    if (l->quant4) {
        /* dequantise to the compute dtype, use, drop (bitsandbytes MatMul4Bit) */
        DType cdt = md->adt == DT_F32 ? DT_BF16 : md->adt;
        AgTensor *w = op_new(g, "dequantize_4bit", cdt, SHAPE(l->out, l->in));
        AgTensor *xc = op_to(g, x, cdt);
        out = op_linear(g, xc, w, NULL);
        U(xc);
        U(w);
    } else if (l->w->dt == DT_U8) {
        AgTensor *w = op_new(g, "int8_dequantize", md->adt, SHAPE(l->out, l->in));
        out = op_linear(g, x, w, NULL);
        U(w);
    } else if (l->conv1d) {
        out = op_conv1d(g, x, l->w, l->b);
    } else {
        out = op_linear(g, x, l->w, l->b);
    }
    if (l->lora_a) {
        /* result + lora_B(lora_A(dropout(x))) * scaling (dropout 0: identity) */
        AgTensor *xa = op_to(g, x, l->lora_a->dt);
        AgTensor *a = op_linear(g, xa, l->lora_a, NULL);
        U(xa);
        AgTensor *b = op_linear(g, a, l->lora_b, NULL);
        U(a);
        AgTensor *s = op_scalar(g, BIN_MUL, b);
        U(b);
        AgTensor *r = op_binary(g, BIN_ADD, out, s);
        U(s);
        U(out);
        out = op_to(g, r, r->dt == md->adt || gg_ctx(g)->autocast ? r->dt : md->adt);
        U(r);
    }
    return out;
}

AgTensor *nn_rms_normalize(Model *md, AgTensor *x)
{
    AgGraph *g = md->g;
    AgTensor *x32 = op_to(g, x, DT_F32);
    AgTensor *p = op_unary(g, UN_SQUARE, x32);
    AgTensor *var = op_mean_lastdim(g, p);
    U(p);
    AgTensor *ve = op_scalar(g, BIN_ADD, var);
    U(var);
    AgTensor *r = op_unary(g, UN_RSQRT, ve);
    U(ve);
    AgTensor *y = op_binary(g, BIN_MUL, x32, r);
    U(r);
    U(x32);
    return y;
}

/* HF LlamaRMSNorm (§2.6): x.to(f32), pow, mean, +eps, rsqrt, mul, .to(dt), weight * y */
AgTensor *nn_rmsnorm(Model *md, AgTensor *x, AgTensor *w)
{
    AgGraph *g = md->g;
    DType in_dt = x->dt;
    AgTensor *y = nn_rms_normalize(md, x);
    AgTensor *yb = op_to(g, y, in_dt);
    U(y);
    AgTensor *out = op_binary(g, BIN_MUL, w, yb);
    U(yb);
    return out;
}

AgTensor *nn_layernorm(Model *md, AgTensor *x, AgTensor *w, AgTensor *b)
{
    return op_layer_norm(md->g, x, w, b);
}

static AgTensor *gelu_new(Model *md, AgTensor *x)
{
    /* 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) as Python evaluates it */
    AgGraph *g = md->g;
    AgTensor *half = op_scalar(g, BIN_MUL, x);
    AgTensor *cube = op_unary(g, UN_CUBE, x);
    AgTensor *c1 = op_scalar(g, BIN_MUL, cube);
    U(cube);
    AgTensor *sum = op_binary(g, BIN_ADD, x, c1);
    U(c1);
    AgTensor *c2 = op_scalar(g, BIN_MUL, sum);
    U(sum);
    AgTensor *t = op_unary(g, UN_TANH, c2);
    U(c2);
    AgTensor *onep = op_scalar(g, BIN_ADD, t);
    U(t);
    AgTensor *out = op_binary(g, BIN_MUL, half, onep);
    U(half);
    U(onep);
    return out;
}

AgTensor *nn_act(Model *md, AgTensor *x)
{
    const char *a = md->m->act;
    if (strcmp(a, "gelu_new") == 0 || strcmp(a, "gelu_fast") == 0 ||
        strcmp(a, "gelu_accurate") == 0)
        return gelu_new(md, x);
    if (strcmp(a, "relu") == 0)
        return op_unary(md->g, UN_RELU, x);
    if (strcmp(a, "gelu_pytorch_tanh") == 0)
        return op_unary(md->g, UN_GELU_TANH, x);
    if (strcmp(a, "gelu") == 0 || strcmp(a, "bloom_gelu") == 0)
        return op_unary(md->g, UN_GELU, x);
    return op_unary(md->g, UN_SILU, x); /* silu / swish */
}

/* Rotary cos/sin, once per forward under no_grad (§2.5): returns (1, S, rd) tensors; with
 * Qwen2-VL's multimodal rotary (Qwen2VLRotaryEmbedding.forward) (3, B, S, rd) ones, from
 * position ids (3, B, S) of the temporal, height and width grids (text-only: three copies of
 * the positions, get_rope_index). */
void nn_rotary(Model *md, int64_t rd, AgTensor *pos, AgTensor **cos, AgTensor **sin)
{
    AgGraph *g = md->g;
    AgContext *c = gg_ctx(g);
    bool ge = c->grad_enabled;
    int ac = c->autocast;
    c->grad_enabled = false;
    c->autocast = 0;
    int64_t S = md->S;
    AgTensor *pe, *fr, *frt;
    if (md->m->mrope) {
        /* position_ids[:, :, None, :].float(); inv_freq[None, None, :, None] expanded to
         * (3, B, rd/2, 1) @ that; .transpose(2, 3) */
        pe = op_new(g, "_to_copy", DT_F32, SHAPE(3, md->B, 1, S));
        fr = op_new(g, "matmul", DT_F32, SHAPE(3, md->B, rd / 2, S));
        frt = op_transpose(g, fr, 2, 3);
    } else {
        pe = op_new(g, "_to_copy", DT_F32, SHAPE(1, 1, S)); /* position_ids[:,None,:].float() */
        fr = op_new(g, "bmm", DT_F32, SHAPE(1, rd / 2, S)); /* inv_freq @ positions */
        frt = op_transpose(g, fr, 1, 2);
    }
    AgTensor *two[2] = {frt, frt};
    AgTensor *emb = op_cat(g, two, 2, -1);
    AgTensor *cs[2];
    for (int i = 0; i < 2; i++) {
        AgTensor *t = op_unary(g, i ? UN_SIN : UN_COS, emb);
        cs[i] = op_scalar(g, BIN_MUL, t); /* * attention_scaling */
        U(t);
    }
    c->autocast = ac;
    DType dt = md->adt; /* cos.to(x.dtype): the hidden stream's dtype */
    *cos = op_to(g, cs[0], dt);
    *sin = op_to(g, cs[1], dt);
    U(cs[0]);
    U(cs[1]);
    U(emb);
    U(frt);
    U(fr);
    U(pe);
    (void)pos;
    c->grad_enabled = ge;
}

/* The cos and sin one attention layer rotates with: the forward's (1, 1, S, rd) tables, or
 * under Qwen2-VL's multimodal rotary its own (B, 1, S, rd) ones
 * (modeling_qwen2_vl.py apply_multimodal_rotary_pos_emb: the (3, B, S, rd) tables split by
 * mrope_section * 2, the i-th piece taken from grid i % 3, torch.cat, unsqueeze(1)) — a new
 * pair per layer, which the products with q and k save for backward. New references. */
void nn_rope_tables(Model *md, const Fwd *f, AgTensor **cos4, AgTensor **sin4)
{
    if (!md->m->mrope) {
        *cos4 = gt_ref(f->cos4);
        *sin4 = gt_ref(f->sin4);
        return;
    }
    const AgTensor *t = f->cos4; /* (3, B, S, rd) */
    *cos4 = op_new(md->g, "cat", t->dt, SHAPE(t->shape[1], 1, t->shape[2], t->shape[3]));
    *sin4 = op_new(md->g, "cat", t->dt, SHAPE(t->shape[1], 1, t->shape[2], t->shape[3]));
}

static AgTensor *rotate_half(Model *md, AgTensor *x)
{
    AgGraph *g = md->g;
    int64_t d = x->shape[x->nd - 1];
    AgTensor *x1 = op_slice(g, x, -1, 0, d / 2);
    AgTensor *x2 = op_slice(g, x, -1, d / 2, d);
    AgTensor *n = op_unary(g, UN_NEG, x2);
    AgTensor *parts[2] = {n, x1};
    AgTensor *out = op_cat(g, parts, 2, -1);
    U(n);
    U(x1);
    U(x2);
    return out;
}

/* q * cos + rotate_half(q) * sin, with cos/sin unsqueezed to (1,1,S,rd) */
AgTensor *nn_apply_rope(Model *md, AgTensor *q, AgTensor *cos4, AgTensor *sin4)
{
    AgGraph *g = md->g;
    AgTensor *a = op_binary(g, BIN_MUL, q, cos4);
    AgTensor *rh = rotate_half(md, q);
    AgTensor *b = op_binary(g, BIN_MUL, rh, sin4);
    U(rh);
    AgTensor *out = op_binary(g, BIN_ADD, a, b);
    U(a);
    U(b);
    return out;
}

/* Partial rotary (NeoX): rotate the first rd dims, then cat with the rest. */
AgTensor *nn_apply_rope_partial(Model *md, AgTensor *q, int64_t rd, AgTensor *cos4,
                                    AgTensor *sin4)
{
    int64_t hd = q->shape[q->nd - 1];
    if (rd >= hd)
        return nn_apply_rope(md, q, cos4, sin4);
    AgGraph *g = md->g;
    AgTensor *qr = op_slice(g, q, -1, 0, rd);
    AgTensor *qp = op_slice(g, q, -1, rd, hd);
    AgTensor *e = nn_apply_rope(md, qr, cos4, sin4);
    AgTensor *parts[2] = {e, qp};
    AgTensor *out = op_cat(g, parts, 2, -1);
    U(e);
    U(qr);
    U(qp);
    return out;
}

/* HF repeat_kv: expand + reshape → a copy when n_rep > 1 (§5). [1.13] the full-range
 * slices of x[:, :, None, :, :] are recorded too. */
static AgTensor *repeat_kv(Model *md, AgTensor *x, int64_t nrep)
{
    AgGraph *g = md->g;
    if (nrep == 1)
        return gt_ref(x);
    int64_t B = x->shape[0], nkv = x->shape[1], S = x->shape[2], hd = x->shape[3];
    AgTensor *t = gt_ref(x);
    if (gg_rules(g)->full_slices_recorded) {
        for (int d = 0; d < 2; d++) {
            AgTensor *s = op_slice(g, t, d, 0, t->shape[d]);
            U(t);
            t = s;
        }
    }
    AgTensor *u = op_unsqueeze(g, t, 2);
    U(t);
    t = u;
    if (gg_rules(g)->full_slices_recorded) {
        for (int d = 3; d < 5; d++) {
            AgTensor *s = op_slice(g, t, d, 0, t->shape[d]);
            U(t);
            t = s;
        }
    }
    AgTensor *e = op_expand(g, t, SHAPE(B, nkv, nrep, S, hd));
    U(t);
    AgTensor *r = op_reshape(g, e, SHAPE(B, nkv * nrep, S, hd));
    U(e);
    return r;
}

/* ---- attention ---- */


/* The eager path (§2.7): q [B,nh,S,hd], k/v [B,nkv,S,hd] → output [B,S,nh,hd] contiguous. */
static AgTensor *attn_eager(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v,
                            bool scale, bool f32_softmax)
{
    AgGraph *g = md->g;
    int64_t nrep = q->shape[1] / k->shape[1];
    AgTensor *kr = repeat_kv(md, k, nrep), *vr = repeat_kv(md, v, nrep);
    AgTensor *kt = op_transpose(g, kr, 2, 3);
    U(kr);
    AgTensor *w = op_matmul(g, q, kt);
    U(kt);
    if (scale) {
        AgTensor *ws = op_scalar(g, BIN_MUL, w);
        U(w);
        w = ws;
    }
    if (md->m->attn_softcap > 0) {
        /* Gemma 2's eager_attention_forward: / softcap, tanh, * softcap */
        AgTensor *d = op_scalar(g, BIN_DIV, w);
        U(w);
        AgTensor *t = op_unary(g, UN_TANH, d);
        U(d);
        w = op_scalar(g, BIN_MUL, t);
        U(t);
    }
    if (f->mask) {
        AgTensor *wm = op_binary(g, BIN_ADD, w, f->mask);
        U(w);
        w = wm;
    }
    AgTensor *p = op_softmax(g, w, f32_softmax ? DT_F32 : w->dt);
    U(w);
    AgTensor *pd = op_to(g, p, q->dt);
    U(p);
    AgTensor *pdd = op_dropout(g, pd, md->m->attn_pdrop);
    U(pd);
    AgTensor *o = op_matmul(g, pdd, vr);
    U(pdd);
    U(vr);
    AgTensor *ot = op_transpose(g, o, 1, 2);
    U(o);
    AgTensor *oc = op_contiguous(g, ot);
    U(ot);
    return oc;
}

typedef enum { SDPA_FLASH, SDPA_EFFICIENT, SDPA_MATH } SdpaKind;

static void bw_sdpa(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    SdpaKind k = (SdpaKind)n->iarg[0];
    const AgTensor *q = n->in_meta[0], *kk = n->in_meta[1];
    int64_t B = q->shape[0], nh = q->shape[1], S = q->shape[2], hd = q->shape[3];
    gg_op(g, k == SDPA_FLASH ? "_flash_attention_backward" : "_efficient_attention_backward");
    /* causal: half of 4·B·nh·S²·hd per pass; backward 2.5 passes (dQ, dK, dV and the
     * recomputed scores) */
    gg_flops(g, 2.5 * 2.0 * (double)B * (double)nh * (double)S * (double)S * (double)hd);
    for (int i = 0; i < 3; i++)
        if (n->next[i].node)
            gout[i] = gt_empty(g, n->in_meta[i]->dt, n->in_meta[i]->nd, n->in_meta[i]->shape);
    AgTensor *tmp[4] = {0};
    int64_t S128 = (S + 127) / 128 * 128;
    if (k == SDPA_FLASH) {
        int64_t dr = hd <= 128 ? (hd + 31) / 32 * 32 : (hd + 63) / 64 * 64;
        tmp[0] = gt_empty(g, DT_F32, SHAPE(B, nh, S128));           /* softmax_d */
        tmp[1] = gt_empty(g, DT_F32, SHAPE(B, S128, nh, dr));       /* dq_accum */
        if (kk->shape[1] != nh) {                                   /* GQA expanded grads */
            tmp[2] = gt_empty(g, q->dt, SHAPE(B, S, nh, hd));
            tmp[3] = gt_empty(g, q->dt, SHAPE(B, S, nh, hd));
        }
    } else {
        tmp[0] = gt_empty(g, DT_F32, SHAPE(B, nh, S));              /* delta */
        if (kk->shape[1] != nh) {
            tmp[2] = gt_empty(g, q->dt, SHAPE(B, S, nh, hd));
            tmp[3] = gt_empty(g, q->dt, SHAPE(B, S, nh, hd));
        }
    }
    for (int i = 3; i >= 0; i--)
        gt_unref(g, tmp[i]);
}

/* F.scaled_dot_product_attention on CUDA, flash or memory-efficient kernel (§7.3, §7.4). */
static AgTensor *attn_sdpa_fused(Model *md, AgTensor *q, AgTensor *k, AgTensor *v, AgTensor *bias,
                                 SdpaKind kind)
{
    AgGraph *g = md->g;
    AgTensor *qc = op_autocast(g, q), *kc = op_autocast(g, k), *vc = op_autocast(g, v);
    /* an attn_mask given (bias: Fwd.bias_saved) is cast like q, k, v under autocast and saved:
     * _efficient_attention_backward takes attn_bias (derivatives.yaml) */
    AgTensor *bc = bias ? op_autocast(g, bias) : NULL;
    int64_t B = qc->shape[0], nh = qc->shape[1], S = qc->shape[2], hd = qc->shape[3];
    AgTensor *ob, *lse, *rng;
    /* op-level SAC keeps the kernel's whole output tuple (out, logsumexp, RNG state) */
    GgSacAction sac = gg_sac_policy(g, MEMSIM_SAC_SDPA);
    if (sac == GG_SAC_REUSE) {
        ob = gg_sac_take(g);
        lse = gg_sac_take(g);
        rng = gg_sac_take(g);
    } else {
        gg_op(g, kind == SDPA_FLASH ? "_scaled_dot_product_flash_attention"
                                    : "_scaled_dot_product_efficient_attention");
        gg_flops(g, 2.0 * (double)B * (double)nh * (double)S * (double)S * (double)hd);
        /* output laid out [B,S,nh,hd] and returned as a [B,nh,S,hd] view */
        ob = gt_empty(g, qc->dt, SHAPE(B, S, nh, vc->shape[3])); /* v's head dim (MLA) */
        int64_t Sl = kind == SDPA_FLASH ? S : (S + 31) / 32 * 32;
        lse = gt_empty(g, DT_F32, SHAPE(B, nh, Sl));
        rng = kind == SDPA_FLASH ? gt_empty(g, DT_I64, SHAPE(2)) : NULL;
        if (sac == GG_SAC_KEEP) {
            gg_sac_keep(g, ob);
            gg_sac_keep(g, lse);
            gg_sac_keep(g, rng);
        }
    }
    AgTensor *o = op_transpose(g, ob, 1, 2);
    U(ob);
    AgTensor *xs[3] = {qc, kc, vc};
    if (gg_needs_grad(g, 3, xs)) {
        AgNode *n = gn_new(g, kind == SDPA_FLASH ? "ScaledDotProductFlashAttentionBackward0"
                                                : "ScaledDotProductEfficientAttentionBackward0",
                           bw_sdpa, 1);
        for (int i = 0; i < 3; i++)
            gn_add_input(g, n, xs[i]);
        n->iarg[0] = kind;
        gn_save(g, n, qc);
        gn_save(g, n, kc);
        gn_save(g, n, vc);
        gn_save(g, n, o);
        gn_save(g, n, lse);
        if (rng)
            gn_save(g, n, rng);
        if (bc)
            gn_save(g, n, bc);
        /* o is a view: the node owns the output through it */
        o->grad_fn = NULL;
        gn_set_output(n, o, 0);
    }
    U(lse);
    U(rng);
    U(qc);
    U(kc);
    U(vc);
    U(bc);
    AgTensor *ot = op_transpose(g, o, 1, 2);
    U(o);
    AgTensor *oc = op_contiguous(g, ot);
    U(ot);
    return oc;
}

/* The SDPA math path (§7.2): fp16/bf16 inputs cast to fp32, q and kᵀ scaled, softmax,
 * matmul, cast back. */
AgTensor *nn_attn_sdpa_math(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v)
{
    AgGraph *g = md->g;
    AgTensor *qc = op_autocast(g, q), *kc = op_autocast(g, k), *vc = op_autocast(g, v);
    DType odt = qc->dt;
    AgTensor *q32 = op_to(g, qc, DT_F32), *k32 = op_to(g, kc, DT_F32), *v32 = op_to(g, vc, DT_F32);
    U(qc);
    U(kc);
    U(vc);
    int64_t nrep = q32->shape[1] / k32->shape[1];
    AgTensor *kr = repeat_kv(md, k32, nrep), *vr = repeat_kv(md, v32, nrep);
    U(k32);
    U(v32);
    AgTensor *qs = op_scalar(g, BIN_MUL, q32);
    U(q32);
    AgTensor *kt = op_transpose(g, kr, 2, 3);
    U(kr);
    AgTensor *ks = op_scalar(g, BIN_MUL, kt);
    U(kt);
    AgTensor *w = op_matmul(g, qs, ks);
    U(qs);
    U(ks);
    AgTensor *mask = f->mask ? gt_ref(f->mask)
                             : op_new(g, "tril", DT_F32, SHAPE(q->shape[2], q->shape[2]));
    AgTensor *wm = op_binary(g, BIN_ADD, w, mask); /* add_ in place; same memory */
    U(mask);
    U(w);
    AgTensor *p = op_softmax(g, wm, DT_F32);
    U(wm);
    AgTensor *pd = op_dropout(g, p, md->m->attn_pdrop);
    U(p);
    AgTensor *o = op_matmul(g, pd, vr);
    U(pd);
    U(vr);
    AgTensor *ob = op_to(g, o, odt);
    U(o);
    AgTensor *ot = op_transpose(g, ob, 1, 2);
    U(ob);
    AgTensor *oc = op_contiguous(g, ot);
    U(ot);
    return oc;
}

/* Attention core for q [B,nh,S,hd], k/v [B,nkv,S,hd]: returns [B,S,nh,hd] contiguous. */
static AgTensor *attention_core(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v,
                                bool scale)
{
    MemsimAttention a = md->run->attention;
    if (f->eager || a == MEMSIM_ATTN_EAGER || !gg_rules(md->g)->cuda)
        return attn_eager(md, f, q, k, v, scale, md->m->fam != FAM_GPT2);
    if (a == MEMSIM_ATTN_SDPA_MATH)
        return nn_attn_sdpa_math(md, f, q, k, v);
    DType cdt = gg_ctx(md->g)->autocast ? (DType)gg_ctx(md->g)->autocast : q->dt;
    bool flash_ok = (cdt == DT_BF16 || cdt == DT_F16) && !f->mask && q->shape[3] <= 256 &&
                    md->m->attn_pdrop == 0.0;
    if (a == MEMSIM_ATTN_FLASH || (a == MEMSIM_ATTN_SDPA && flash_ok)) {
        /* HF passes enable_gqa (no repeat) when there is no mask */
        return attn_sdpa_fused(md, q, k, v, NULL, SDPA_FLASH);
    }
    AgTensor *bias = f->bias_saved ? f->mask : NULL;
    if (q->shape[1] != k->shape[1]) {
        AgTensor *kr = repeat_kv(md, k, q->shape[1] / k->shape[1]);
        AgTensor *vr = repeat_kv(md, v, q->shape[1] / v->shape[1]);
        AgTensor *o = attn_sdpa_fused(md, q, kr, vr, bias, SDPA_EFFICIENT);
        U(kr);
        U(vr);
        return o;
    }
    return attn_sdpa_fused(md, q, k, v, bias, SDPA_EFFICIENT);
}

typedef struct {
    Model *md;
    Fwd f;     /* its own references to the mask */
    bool scale;
} AttnArg;

static AgTensor *attn_region(AgGraph *g, void *user, AgTensor **in, int n)
{
    AttnArg *a = user;
    return attention_core(a->md, &a->f, in[0], in[1], in[2], a->scale);
}

static void attn_arg_free(AgGraph *g, void *p)
{
    AttnArg *a = p;
    gt_unref(g, a->f.mask);
    g_free(a);
}

/* Selective checkpointing (Korthikanti et al. 2022): only the attention core — scores,
 * softmax, dropout, the product with V — is recomputed in backward; its inputs q, k, v are
 * kept. */
AgTensor *nn_attention(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v, bool scale)
{
    if (md->run->checkpointing != MEMSIM_CKPT_SELECTIVE || !gg_ctx(md->g)->grad_enabled)
        return attention_core(md, f, q, k, v, scale);
    AttnArg *a = g_new0(AttnArg, 1);
    a->md = md;
    a->f = *f;
    a->f.mask = gt_ref(f->mask);
    a->f.cos4 = a->f.sin4 = a->f.cos4_sw = a->f.sin4_sw = NULL;
    a->scale = scale;
    AgTensor *in[3] = {q, k, v};
    return gg_checkpoint(md->g, attn_region, a, attn_arg_free, in, 3);
}

/* The KV cache (HF_MODELS.md §2.2): DynamicLayer.update sets keys = cat([keys, k], -2), so
 * the first forward copies K and V (cat(empty, k)) and each later one (generation) makes the
 * longer copy from the past entry and the new K/V, the past entry dying with the update. */
void nn_cache_update(Model *md, AgTensor **k, AgTensor **v)
{
    if (!(md->run->use_cache < 0 ? md->m->use_cache : md->run->use_cache) ||
        md->run->checkpointing != MEMSIM_CKPT_NONE)
        return;
    AgGraph *g = md->g;
    uint8_t old = gg_ctx(g)->category;
    gg_ctx(g)->category = MEMSIM_CAT_KV_CACHE;
    /* K, then V: self.keys = cat(...) drops the old keys before the values are concatenated */
    guint at = md->cache->len;
    bool past = md->past && at + 1 < md->past->len;
    AgTensor **kv[2] = {k, v}, *cached[2];
    for (int j = 0; j < 2; j++) {
        AgTensor *parts[2] = {past ? md->past->pdata[at + j] : NULL, *kv[j]};
        cached[j] = op_cat(g, past ? parts : parts + 1, past ? 2 : 1, -2);
        if (past) {
            md->past->pdata[at + j] = NULL;
            gt_unref(g, parts[0]);
        }
    }
    gg_ctx(g)->category = old;
    /* the cache object (in the output's past_key_values) holds them; the layer's own K and V
     * live until update() returns */
    for (int j = 0; j < 2; j++) {
        g_ptr_array_add(md->cache, gt_ref(cached[j]));
        U(*kv[j]);
        *kv[j] = cached[j];
    }
}

