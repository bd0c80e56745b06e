/* The model families (traces/models.h), written after the Hugging Face modeling files as
 * HF_MODELS.md §2–3 describes them: the same ops in the same order, and Python variables
 * dropped where the Python code drops them. Dimension letters: B batch, S sequence, H
 * hidden, V vocabulary, I MLP width, nh / nkv heads, hd head dim.
 */
#include "traces/models.h"

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

static AgTensor *param(Model *md, DType dt, int nd, const int64_t *shape, bool trainable)
{
    return leaf(md, dt, nd, shape, trainable, MEMSIM_CAT_PARAMETER);
}

/* A registered buffer: not a parameter (rotary frequencies, causal tables). */
static AgTensor *buffer(Model *md, DType dt, int nd, const int64_t *shape)
{
    return leaf(md, dt, nd, shape, false, MEMSIM_CAT_OTHER);
}

static bool full_ft(const Model *md)
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

static void lin_make(Model *md, Lin *l, const char *name, int64_t out, int64_t in, bool bias,
                     bool conv1d)
{
    l->name = name;
    l->out = out;
    l->in = in;
    l->conv1d = conv1d;
    bool train = full_ft(md);
    bool q4 = md->run->finetune == MEMSIM_FT_QLORA ||
              (md->run->inference && md->run->weights == MEMSIM_WEIGHTS_4BIT);
    bool i8 = md->run->inference && md->run->weights == MEMSIM_WEIGHTS_INT8;
    if (q4) {
        /* bitsandbytes NF4: two weights per byte, plus one fp32 absmax per 64 weights */
        l->quant4 = true;
        l->w = param(md, DT_U8, SHAPE(out * in / 2), false);
        l->b = NULL;
        l->absmax = param(md, DT_F32, SHAPE((out * in + 63) / 64), false); /* lives with w */
    } else if (i8) {
        l->w = param(md, DT_U8, SHAPE(out, in), false);
    } else {
        l->w = conv1d ? param(md, md->pdt, SHAPE(in, out), train)
                      : param(md, md->pdt, SHAPE(out, in), train);
    }
    if (bias && !q4)
        l->b = param(md, md->pdt, SHAPE(out), train);
    if (is_target(md, name)) {
        /* peft: adapters in fp32 (autocast_adapter_dtype), A [r, in], B [out, r] */
        int64_t r = md->run->lora_rank;
        l->lora_a = param(md, DT_F32, SHAPE(r, in), true);
        l->lora_b = param(md, DT_F32, SHAPE(out, r), true);
    }
}

/* ---- layers ---- */

/* A tensor-parallel collective of `bytes` (full size) over the tp ranks' ring. */
static double tp_us(const Model *md, MemsimCollectiveKind kind, uint64_t bytes)
{
    int t = md->tp;
    double f = kind == MEMSIM_COLL_ALL_REDUCE ? 2.0 * (t - 1) / t : (double)(t - 1) / t;
    return t > 1 ? f * (double)bytes * md->comm_us_per_byte : 0.0;
}

static AgTensor *lin_local(Model *md, Lin *l, AgTensor *x);

/* A tensor-parallel row-parallel layer's output is all-reduced in place (no buffer). */
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
 * into the same buffer, computes the full input gradient and reduce-scatters it into a new
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
                      n->farg[0] * (double)gt_nbytes(full) * (tp - 1) / tp);
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

static AgTensor *sp_column_linear(Model *md, Lin *l, AgTensor *x)
{
    AgGraph *g = md->g;
    sp_buffer(md, x);
    gg_collective(g, MEMSIM_COLL_ALL_GATHER, (uint64_t)gt_nbytes(x) * (uint64_t)md->tp, 1,
                  tp_us(md, MEMSIM_COLL_ALL_GATHER, (uint64_t)gt_nbytes(x) * (uint64_t)md->tp));
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
        n->farg[0] = md->comm_us_per_byte;
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
                  n->farg[0] * (double)gt_nbytes(n->in_meta[0]));
    gout[0] = gt_empty(g, gin[0]->dt, n->in_meta[0]->nd, n->in_meta[0]->shape);
}

static AgTensor *sp_reduce_scatter(Model *md, AgTensor *full)
{
    AgGraph *g = md->g;
    gg_collective(g, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)gt_nbytes(full), 1,
                  tp_us(md, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)gt_nbytes(full)));
    int64_t sh[GT_MAXDIM];
    memcpy(sh, full->shape, sizeof sh);
    sh[1] /= md->tp;
    AgTensor *out = gt_empty(g, full->dt, full->nd, sh);
    AgNode *n = gg_needs_grad(g, 1, &full) ? gn_new(g, "_ReduceScatterToSequenceParallelRegionBackward", bw_sp_scatter, 1) : NULL;
    if (n) {
        gn_add_input(g, n, full);
        n->farg[0] = tp_us(md, MEMSIM_COLL_ALL_GATHER, 1000000) / 1e6;
        gn_set_output(n, out, 0);
    }
    return out;
}

static AgTensor *lin(Model *md, Lin *l, AgTensor *x)
{
    if (md->sp && !l->row_parallel && !l->lora_a && !l->quant4)
        return sp_column_linear(md, l, x);
    AgTensor *out = lin_local(md, l, x);
    if (md->tp > 1 && l->row_parallel) {
        if (md->sp) {
            AgTensor *r = sp_reduce_scatter(md, out);
            gt_unref(md->g, out);
            return r;
        }
        gg_collective(md->g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(out), 1,
                      tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(out)));
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

/* HF LlamaRMSNorm (§2.6): x.to(f32), pow, mean, +eps, rsqrt, mul, .to(dt), weight * y */
static AgTensor *rmsnorm(Model *md, AgTensor *x, AgTensor *w)
{
    AgGraph *g = md->g;
    DType in_dt = x->dt;
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
    AgTensor *yb = op_to(g, y, in_dt);
    U(y);
    AgTensor *out = op_binary(g, BIN_MUL, w, yb);
    U(yb);
    return out;
}

static AgTensor *layernorm(Model *md, AgTensor *x, AgTensor *w, AgTensor *b)
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

static AgTensor *act(Model *md, AgTensor *x)
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

/* Rotary cos/sin, once per forward under no_grad (§2.5): returns (1, S, rd) tensors. */
static void rotary(Model *md, int64_t rd, AgTensor *pos, AgTensor **cos, AgTensor **sin)
{
    AgGraph *g = md->g;
    AgContext *c = gg_ctx(g);
    bool ge = c->grad_enabled;
    int ac = c->autocast;
    c->grad_enabled = false;
    c->autocast = 0;
    int64_t S = md->S;
    AgTensor *pe = op_new(g, "_to_copy", DT_F32, SHAPE(1, 1, S)); /* position_ids[:,None,:].float() */
    AgTensor *fr = op_new(g, "bmm", DT_F32, SHAPE(1, rd / 2, S)); /* inv_freq @ positions */
    AgTensor *frt = op_transpose(g, fr, 1, 2);
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
static AgTensor *apply_rope(Model *md, AgTensor *q, AgTensor *cos4, AgTensor *sin4)
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
static AgTensor *apply_rope_partial(Model *md, AgTensor *q, int64_t rd, AgTensor *cos4,
                                    AgTensor *sin4)
{
    int64_t hd = q->shape[q->nd - 1];
    if (rd >= hd)
        return apply_rope(md, q, cos4, sin4);
    AgGraph *g = md->g;
    AgTensor *qr = op_slice(g, q, -1, 0, rd);
    AgTensor *qp = op_slice(g, q, -1, rd, hd);
    AgTensor *e = apply_rope(md, qr, cos4, sin4);
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

typedef struct {
    AgTensor *mask;   /* eager: additive (B,1,S,S) in the activation dtype; NULL = causal */
    AgTensor *cos4, *sin4;
    bool eager;
} Fwd;

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
static AgTensor *attn_sdpa_fused(Model *md, AgTensor *q, AgTensor *k, AgTensor *v, SdpaKind kind)
{
    AgGraph *g = md->g;
    AgTensor *qc = op_autocast(g, q), *kc = op_autocast(g, k), *vc = op_autocast(g, v);
    int64_t B = qc->shape[0], nh = qc->shape[1], S = qc->shape[2], hd = qc->shape[3];
    gg_op(g, kind == SDPA_FLASH ? "_scaled_dot_product_flash_attention"
                                : "_scaled_dot_product_efficient_attention");
    gg_flops(g, 2.0 * (double)B * (double)nh * (double)S * (double)S * (double)hd);
    /* output laid out [B,S,nh,hd] and returned as a [B,nh,S,hd] view */
    AgTensor *ob = gt_empty(g, qc->dt, SHAPE(B, S, nh, hd));
    AgTensor *o = op_transpose(g, ob, 1, 2);
    U(ob);
    int64_t Sl = kind == SDPA_FLASH ? S : (S + 31) / 32 * 32;
    AgTensor *lse = gt_empty(g, DT_F32, SHAPE(B, nh, Sl));
    AgTensor *rng = kind == SDPA_FLASH ? gt_empty(g, DT_I64, SHAPE(2)) : NULL;
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
        /* o is a view: the node owns the output through it */
        o->grad_fn = NULL;
        gn_set_output(n, o, 0);
    }
    U(lse);
    U(rng);
    U(qc);
    U(kc);
    U(vc);
    AgTensor *ot = op_transpose(g, o, 1, 2);
    U(o);
    AgTensor *oc = op_contiguous(g, ot);
    U(ot);
    return oc;
}

/* The SDPA math path (§7.2): fp16/bf16 inputs cast to fp32, q and kᵀ scaled, softmax,
 * matmul, cast back. */
static AgTensor *attn_sdpa_math(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v)
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
        return attn_sdpa_math(md, f, q, k, v);
    DType cdt = gg_ctx(md->g)->autocast ? (DType)gg_ctx(md->g)->autocast : q->dt;
    bool flash_ok = (cdt == DT_BF16 || cdt == DT_F16) && !f->mask && q->shape[3] <= 256 &&
                    md->m->attn_pdrop == 0.0;
    if (a == MEMSIM_ATTN_FLASH || (a == MEMSIM_ATTN_SDPA && flash_ok)) {
        /* HF passes enable_gqa (no repeat) when there is no mask */
        return attn_sdpa_fused(md, q, k, v, SDPA_FLASH);
    }
    if (q->shape[1] != k->shape[1]) {
        AgTensor *kr = repeat_kv(md, k, q->shape[1] / k->shape[1]);
        AgTensor *vr = repeat_kv(md, v, q->shape[1] / v->shape[1]);
        AgTensor *o = attn_sdpa_fused(md, q, kr, vr, SDPA_EFFICIENT);
        U(kr);
        U(vr);
        return o;
    }
    return attn_sdpa_fused(md, q, k, v, SDPA_EFFICIENT);
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
static AgTensor *attention(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v, bool scale)
{
    if (md->run->checkpointing != MEMSIM_CKPT_SELECTIVE || !gg_ctx(md->g)->grad_enabled)
        return attention_core(md, f, q, k, v, scale);
    AttnArg *a = g_new0(AttnArg, 1);
    a->md = md;
    a->f = *f;
    a->f.mask = gt_ref(f->mask);
    a->f.cos4 = a->f.sin4 = NULL;
    a->scale = scale;
    AgTensor *in[3] = {q, k, v};
    return gg_checkpoint(md->g, attn_region, a, attn_arg_free, in, 3);
}

/* The KV cache (HF_MODELS.md §2.2): DynamicLayer.update sets keys = cat([keys, k], -2), so
 * the first forward copies K and V (cat(empty, k)) and each later one (generation) makes the
 * longer copy from the past entry and the new K/V, the past entry dying with the update. */
static void cache_update(Model *md, AgTensor **k, AgTensor **v)
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

/* ---- decoder layers ---- */

typedef struct {
    Model *md;
    Fwd *f;
    int layer;
    Fwd own; /* a checkpointed region's copy of the forward's tensors (references) */
} LayerArg;

static void layer_arg_free(AgGraph *g, void *p)
{
    LayerArg *la = p;
    gt_unref(g, la->own.mask);
    gt_unref(g, la->own.cos4);
    gt_unref(g, la->own.sin4);
    g_free(la);
}

static AgTensor *split_heads(Model *md, AgTensor *x, int64_t heads)
{
    /* .view(B, S, heads, hd).transpose(1, 2) */
    AgTensor *v = op_view(md->g, x, SHAPE(md->B, md->S, heads, md->m->hd));
    AgTensor *t = op_transpose(md->g, v, 1, 2);
    U(v);
    return t;
}

static AgTensor *merge_heads(Model *md, AgTensor *o)
{
    /* attn_output.reshape(B, S, -1) of a contiguous [B,S,nh,hd] */
    return op_reshape(md->g, o, SHAPE(md->B, md->S, md->m->nh * md->m->hd));
}

static AgTensor *llama_attn(Model *md, Fwd *f, Layer *ly, AgTensor *x)
{
    const MemsimModel *m = md->m;
    AgTensor *qp = lin(md, &ly->q, x), *kp = lin(md, &ly->k, x), *vp = lin(md, &ly->v, x);
    AgTensor *q = split_heads(md, qp, m->nh), *k = split_heads(md, kp, m->nkv);
    AgTensor *v = split_heads(md, vp, m->nkv);
    U(qp);
    U(kp);
    U(vp);
    AgTensor *qe = apply_rope(md, q, f->cos4, f->sin4);
    AgTensor *ke = apply_rope(md, k, f->cos4, f->sin4);
    U(q);
    U(k);
    cache_update(md, &ke, &v);
    AgTensor *o = attention(md, f, qe, ke, v, true);
    U(qe);
    U(ke);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *out = lin(md, &ly->o, om);
    U(om);
    return out;
}

static AgTensor *llama_mlp(Model *md, Layer *ly, AgTensor *x)
{
    AgTensor *gt = lin(md, &ly->gate, x);
    AgTensor *a = act(md, gt);
    U(gt);
    AgTensor *up = lin(md, &ly->up, x);
    AgTensor *h = op_binary(md->g, BIN_MUL, a, up);
    U(a);
    U(up);
    AgTensor *out = lin(md, &ly->down, h);
    U(h);
    return out;
}

/* Mixtral's sparse MoE block (HF_MODELS.md §3.9), eager experts, with routing assumed
 * uniform: each expert gets S·k/E of the token slots. */
static AgTensor *moe_mlp(Model *md, Layer *ly, AgTensor *x)
{
    AgGraph *g = md->g;
    const MemsimModel *m = md->m;
    int64_t T = md->B * md->S, E = m->n_experts, K = m->top_k, H = m->H;
    AgTensor *x2 = op_view(g, x, SHAPE(T, H));
    Lin rl = {.w = ly->router, .out = E, .in = H};
    AgTensor *logits = lin(md, &rl, x2);
    AgTensor *l32 = op_to(g, logits, DT_F32);
    AgTensor *probs = op_softmax(g, l32, DT_F32);
    U(l32);
    AgTensor *topv = op_topk(g, probs, K);
    U(probs);
    AgTensor *ssum = op_new(g, "sum", DT_F32, SHAPE(T, 1)); /* values /= sum, in place */
    U(ssum);
    AgTensor *wflat = op_view(g, topv, SHAPE(T * K, 1));
    U(topv);
    int64_t slots = T * K;
    AgTensor *outs[64];
    int nout = 0;
    g_assert(E <= 64);
    for (int64_t e = 0; e < E; e++) {
        int64_t ne = slots / E + (e < slots % E ? 1 : 0);
        if (ne == 0)
            continue;
        AgTensor *xe = op_gather_rows(g, x2, ne);
        AgTensor *gte = lin(md, &ly->experts[3 * e], xe);
        AgTensor *a = act(md, gte);
        U(gte);
        AgTensor *up = lin(md, &ly->experts[3 * e + 1], xe);
        AgTensor *h = op_binary(g, BIN_MUL, a, up);
        U(a);
        U(up);
        AgTensor *y = lin(md, &ly->experts[3 * e + 2], h);
        U(h);
        U(xe);
        AgTensor *w = op_gather_rows(g, wflat, ne);
        AgTensor *yw = op_binary(g, BIN_MUL, y, w); /* dt × f32 → f32 */
        U(y);
        U(w);
        outs[nout++] = op_to(g, yw, x2->dt);
        U(yw);
    }
    U(wflat);
    U(logits);
    /* final_hidden_states.index_add_ of every expert's rows */
    AgTensor *acc = NULL;
    for (int i = 0; i < nout; i += GN_MAXNEXT) {
        int n = nout - i < GN_MAXNEXT ? nout - i : GN_MAXNEXT;
        AgTensor *part = op_index_add(g, x2->dt, T, H, outs + i, n);
        if (acc) {
            AgTensor *s2 = op_binary(g, BIN_ADD, acc, part);
            U(acc);
            U(part);
            acc = s2;
        } else {
            acc = part;
        }
    }
    for (int i = 0; i < nout; i++)
        U(outs[i]);
    U(x2);
    AgTensor *out = op_view(g, acc, SHAPE(md->B, md->S, H));
    U(acc);
    return out;
}

static AgTensor *llama_layer(AgGraph *g, void *user, AgTensor **in, int n)
{
    LayerArg *la = user;
    Model *md = la->md;
    Layer *ly = &md->layers[la->layer];
    AgTensor *x = in[0];
    AgTensor *h = rmsnorm(md, x, ly->ln1_w);
    AgTensor *a = llama_attn(md, la->f, ly, h);
    U(h);
    AgTensor *x1 = op_binary(g, BIN_ADD, x, a);
    U(a);
    AgTensor *h2 = rmsnorm(md, x1, ly->ln2_w);
    AgTensor *mo = md->m->fam == FAM_MIXTRAL ? moe_mlp(md, ly, h2) : llama_mlp(md, ly, h2);
    U(h2);
    AgTensor *out = op_binary(g, BIN_ADD, x1, mo);
    U(mo);
    U(x1);
    return out;
}

static AgTensor *gpt2_layer(AgGraph *g, void *user, AgTensor **in, int n)
{
    LayerArg *la = user;
    Model *md = la->md;
    const MemsimModel *m = md->m;
    Layer *ly = &md->layers[la->layer];
    AgTensor *x = in[0];
    AgTensor *h = layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qkv = lin(md, &ly->qkv, h);
    U(h);
    AgTensor *parts[3];
    op_split(g, qkv, 2, m->nh * m->hd, parts, 3);
    U(qkv);
    AgTensor *q = split_heads(md, parts[0], m->nh), *k = split_heads(md, parts[1], m->nh);
    AgTensor *v = split_heads(md, parts[2], m->nh);
    for (int i = 0; i < 3; i++)
        U(parts[i]);
    cache_update(md, &k, &v);
    AgTensor *o = attention(md, la->f, q, k, v, true);
    U(q);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = lin(md, &ly->o, om);
    U(om);
    AgTensor *ad = op_dropout(g, ap, m->resid_pdrop);
    U(ap);
    AgTensor *x1 = op_binary(g, BIN_ADD, ad, x);
    U(ad);
    AgTensor *h2 = layernorm(md, x1, ly->ln2_w, ly->ln2_b);
    AgTensor *f1 = lin(md, &ly->up, h2);
    U(h2);
    AgTensor *a = act(md, f1);
    U(f1);
    AgTensor *f2 = lin(md, &ly->down, a);
    U(a);
    AgTensor *fd = op_dropout(g, f2, m->resid_pdrop);
    U(f2);
    AgTensor *out = op_binary(g, BIN_ADD, x1, fd);
    U(fd);
    U(x1);
    return out;
}

static AgTensor *opt_layer(AgGraph *g, void *user, AgTensor **in, int n)
{
    LayerArg *la = user;
    Model *md = la->md;
    const MemsimModel *m = md->m;
    Layer *ly = &md->layers[la->layer];
    AgTensor *x = in[0];
    AgTensor *h = m->pre_ln ? layernorm(md, x, ly->ln1_w, ly->ln1_b) : gt_ref(x);
    AgTensor *qp = lin(md, &ly->q, h);
    AgTensor *qs = op_scalar(g, BIN_MUL, qp); /* q_proj(h) * scaling */
    U(qp);
    AgTensor *kp = lin(md, &ly->k, h), *vp = lin(md, &ly->v, h);
    U(h);
    AgTensor *q = split_heads(md, qs, m->nh), *k = split_heads(md, kp, m->nh);
    AgTensor *v = split_heads(md, vp, m->nh);
    U(qs);
    U(kp);
    U(vp);
    cache_update(md, &k, &v);
    AgTensor *o = attention(md, la->f, q, k, v, true); /* eager: * 1.0 */
    U(q);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = lin(md, &ly->o, om);
    U(om);
    AgTensor *ad = op_dropout(g, ap, m->resid_pdrop);
    U(ap);
    AgTensor *x1 = op_binary(g, BIN_ADD, x, ad);
    U(ad);
    if (!m->pre_ln) {
        AgTensor *t = layernorm(md, x1, ly->ln1_w, ly->ln1_b);
        U(x1);
        x1 = t;
    }
    int64_t T = md->B * md->S;
    AgTensor *x2 = op_reshape(g, x1, SHAPE(T, m->H));
    U(x1);
    AgTensor *h2 = m->pre_ln ? layernorm(md, x2, ly->ln2_w, ly->ln2_b) : gt_ref(x2);
    AgTensor *f1 = lin(md, &ly->up, h2);
    U(h2);
    AgTensor *a = act(md, f1);
    U(f1);
    AgTensor *f2 = lin(md, &ly->down, a);
    U(a);
    AgTensor *fd = op_dropout(g, f2, m->resid_pdrop);
    U(f2);
    AgTensor *s = op_binary(g, BIN_ADD, x2, fd);
    U(fd);
    U(x2);
    if (!m->pre_ln) {
        AgTensor *t = layernorm(md, s, ly->ln2_w, ly->ln2_b);
        U(s);
        s = t;
    }
    AgTensor *out = op_view(g, s, SHAPE(md->B, md->S, m->H));
    U(s);
    return out;
}

static AgTensor *neox_layer(AgGraph *g, void *user, AgTensor **in, int n)
{
    LayerArg *la = user;
    Model *md = la->md;
    const MemsimModel *m = md->m;
    Layer *ly = &md->layers[la->layer];
    AgTensor *x = in[0];
    AgTensor *h = layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qkv = lin(md, &ly->qkv, h);
    U(h);
    /* view(B,S,nh,3hd).transpose(1,2).chunk(3,-1) */
    AgTensor *v4 = op_view(g, qkv, SHAPE(md->B, md->S, m->nh, 3 * m->hd));
    U(qkv);
    AgTensor *t4 = op_transpose(g, v4, 1, 2);
    U(v4);
    AgTensor *p[3];
    op_split(g, t4, 3, m->hd, p, 3);
    U(t4);
    int64_t rd = (int64_t)(m->hd * m->rotary_pct);
    AgTensor *q = apply_rope_partial(md, p[0], rd, la->f->cos4, la->f->sin4);
    AgTensor *k = apply_rope_partial(md, p[1], rd, la->f->cos4, la->f->sin4);
    U(p[0]);
    U(p[1]);
    AgTensor *v = p[2];
    cache_update(md, &k, &v);
    AgTensor *o = attention(md, la->f, q, k, v, true);
    U(q);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *attn = lin(md, &ly->o, om);
    U(om);
    AgTensor *out;
    if (m->parallel_residual) {
        AgTensor *h2 = layernorm(md, x, ly->ln2_w, ly->ln2_b);
        AgTensor *f1 = lin(md, &ly->up, h2);
        U(h2);
        AgTensor *a = act(md, f1);
        U(f1);
        AgTensor *f2 = lin(md, &ly->down, a);
        U(a);
        AgTensor *s = op_binary(g, BIN_ADD, f2, attn);
        U(f2);
        U(attn);
        out = op_binary(g, BIN_ADD, s, x);
        U(s);
    } else {
        AgTensor *x1 = op_binary(g, BIN_ADD, attn, x);
        U(attn);
        AgTensor *h2 = layernorm(md, x1, ly->ln2_w, ly->ln2_b);
        AgTensor *f1 = lin(md, &ly->up, h2);
        U(h2);
        AgTensor *a = act(md, f1);
        U(f1);
        AgTensor *f2 = lin(md, &ly->down, a);
        U(a);
        out = op_binary(g, BIN_ADD, f2, x1);
        U(f2);
        U(x1);
    }
    return out;
}

/* BLOOM (§3.4): fused qkv interleaved per head, ALiBi baddbmm, eager softmax in fp32. */
static AgTensor *bloom_layer(AgGraph *g, void *user, AgTensor **in, int n)
{
    LayerArg *la = user;
    Model *md = la->md;
    const MemsimModel *m = md->m;
    Layer *ly = &md->layers[la->layer];
    AgTensor *x = in[0];
    int64_t B = md->B, S = md->S, nh = m->nh, hd = m->hd;
    AgTensor *h = layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qkv = lin(md, &ly->qkv, h);
    U(h);
    AgTensor *v5 = op_view(g, qkv, SHAPE(B, S, nh, 3, hd));
    U(qkv);
    AgTensor *parts[3];
    for (int i = 0; i < 3; i++) {
        AgTensor *s = op_slice(g, v5, 3, i, i + 1);
        AgTensor *r = op_reshape(g, s, SHAPE(B, S, nh, hd));
        U(s);
        parts[i] = op_transpose(g, r, 1, 2);
        U(r);
    }
    U(v5);
    AgTensor *k = parts[1], *v = parts[2];
    cache_update(md, &k, &v);
    AgTensor *q3 = op_reshape(g, parts[0], SHAPE(B * nh, S, hd));
    AgTensor *k3 = op_reshape(g, k, SHAPE(B * nh, S, hd));
    AgTensor *v3 = op_reshape(g, v, SHAPE(B * nh, S, hd));
    U(parts[0]);
    U(k);
    U(v);
    AgTensor *kt = op_transpose(g, k3, 1, 2);
    U(k3);
    AgTensor *sc = op_matmul(g, q3, kt); /* alibi.baddbmm(q, kᵀ): one new (B·nh,S,S) */
    U(q3);
    U(kt);
    AgTensor *s4 = op_view(g, sc, SHAPE(B, nh, S, S));
    U(sc);
    AgTensor *sm = op_binary(g, BIN_ADD, s4, la->f->mask);
    U(s4);
    AgTensor *p = op_softmax(g, sm, DT_F32);
    U(sm);
    AgTensor *pd = op_to(g, p, md->adt == DT_F32 && gg_ctx(g)->autocast ? (DType)gg_ctx(g)->autocast
                                                                         : md->adt);
    U(p);
    AgTensor *pdd = op_dropout(g, pd, m->attn_pdrop);
    U(pd);
    AgTensor *p3 = op_view(g, pdd, SHAPE(B * nh, S, S));
    U(pdd);
    AgTensor *o3 = op_matmul(g, p3, v3);
    U(p3);
    U(v3);
    AgTensor *o4 = op_view(g, o3, SHAPE(B, nh, S, hd));
    U(o3);
    AgTensor *op_ = op_permute(g, o4, (int[]){0, 2, 1, 3});
    U(o4);
    AgTensor *om = op_reshape(g, op_, SHAPE(B, S, nh * hd));
    U(op_);
    AgTensor *ap = lin(md, &ly->o, om);
    U(om);
    AgTensor *x1 = op_binary(g, BIN_ADD, x, ap);
    U(ap);
    AgTensor *h2 = layernorm(md, x1, ly->ln2_w, ly->ln2_b);
    AgTensor *f1 = lin(md, &ly->up, h2);
    U(h2);
    AgTensor *a = act(md, f1);
    U(f1);
    AgTensor *f2 = lin(md, &ly->down, a);
    U(a);
    AgTensor *out = op_binary(g, BIN_ADD, x1, f2);
    U(f2);
    U(x1);
    return out;
}

/* Falcon (§3.6): one fused qkv; multi-query k/v are advanced-indexing copies; parallel
 * attention and MLP on the same LayerNorm output (two with the new architecture). */
static AgTensor *falcon_layer(AgGraph *g, void *user, AgTensor **in, int n)
{
    LayerArg *la = user;
    Model *md = la->md;
    const MemsimModel *m = md->m;
    Layer *ly = &md->layers[la->layer];
    AgTensor *x = in[0];
    int64_t B = md->B, S = md->S, nh = m->nh, nkv = m->nkv, hd = m->hd;
    AgTensor *ha = layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *hm = m->falcon_new_arch ? layernorm(md, x, ly->ln2_w, ly->ln2_b) : gt_ref(ha);
    AgTensor *qkv = lin(md, &ly->qkv, ha);
    U(ha);
    AgTensor *q, *k, *v;
    if (m->falcon_new_arch) {
        /* view(B,S,nkv,g+2,hd); q = [..., :-2, :]; k, v = [..., [-2], :] (index copies),
         * broadcast to q's shape; flatten(2,3) makes three (B,S,nh,hd) copies */
        int64_t grp = nh / nkv;
        AgTensor *v5 = op_view(g, qkv, SHAPE(B, S, nkv, grp + 2, hd));
        AgTensor *qs = op_slice(g, v5, 3, 0, grp);
        AgTensor *ks = op_slice(g, v5, 3, grp, grp + 1), *vs = op_slice(g, v5, 3, grp + 1, grp + 2);
        U(v5);
        AgTensor *kc = op_clone(g, ks), *vc = op_clone(g, vs);
        U(ks);
        U(vs);
        AgTensor *ke = op_expand(g, kc, SHAPE(B, S, nkv, grp, hd));
        AgTensor *ve = op_expand(g, vc, SHAPE(B, S, nkv, grp, hd));
        U(kc);
        U(vc);
        q = op_reshape(g, qs, SHAPE(B, S, nh, hd));
        k = op_reshape(g, ke, SHAPE(B, S, nh, hd));
        v = op_reshape(g, ve, SHAPE(B, S, nh, hd));
        U(qs);
        U(ke);
        U(ve);
    } else if (nkv == 1) {
        AgTensor *v4 = op_view(g, qkv, SHAPE(B, S, nh + 2, hd));
        q = op_slice(g, v4, 2, 0, nh);
        AgTensor *ks = op_slice(g, v4, 2, nh, nh + 1), *vs = op_slice(g, v4, 2, nh + 1, nh + 2);
        k = op_clone(g, ks); /* [..., [-2], :]: advanced indexing copies */
        v = op_clone(g, vs);
        U(ks);
        U(vs);
        U(v4);
    } else {
        AgTensor *v5 = op_view(g, qkv, SHAPE(B, S, nh, 3 * hd));
        AgTensor *p[3];
        op_split(g, v5, 3, hd, p, 3);
        U(v5);
        q = p[0];
        k = p[1];
        v = p[2];
    }
    U(qkv);
    AgTensor *qt = op_transpose(g, q, 1, 2), *kt = op_transpose(g, k, 1, 2);
    AgTensor *vt = op_transpose(g, v, 1, 2);
    U(q);
    U(k);
    U(v);
    AgTensor *qe = apply_rope(md, qt, la->f->cos4, la->f->sin4);
    AgTensor *ke = apply_rope(md, kt, la->f->cos4, la->f->sin4);
    U(qt);
    U(kt);
    cache_update(md, &ke, &vt);
    /* a mask is always materialised (§3.6): SDPA cannot use flash; multi-query falls to math */
    Fwd f2 = *la->f;
    AgTensor *o;
    if (nkv == 1 && gg_rules(g)->cuda && md->run->attention != MEMSIM_ATTN_EAGER)
        o = attn_sdpa_math(md, &f2, qe, ke, vt);
    else
        o = attention(md, &f2, qe, ke, vt, true);
    U(qe);
    U(ke);
    U(vt);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = lin(md, &ly->o, om);
    U(om);
    AgTensor *f1 = lin(md, &ly->up, hm);
    U(hm);
    AgTensor *a = act(md, f1);
    U(f1);
    AgTensor *f2o = lin(md, &ly->down, a);
    U(a);
    AgTensor *s = op_binary(g, BIN_ADD, f2o, ap); /* mlp_output += attention_output */
    U(f2o);
    U(ap);
    AgTensor *out = op_binary(g, BIN_ADD, x, s);
    U(s);
    return out;
}

/* GPT-Neo (§3.7) and CodeGen (§3.8): eager attention computed in fp32. */
static AgTensor *neo_attn_core(Model *md, Fwd *f, AgTensor *q, AgTensor *k, AgTensor *v,
                               bool scale)
{
    AgGraph *g = md->g;
    AgTensor *q32 = op_to(g, q, DT_F32), *k32 = op_to(g, k, DT_F32);
    AgTensor *kt = op_transpose(g, k32, 2, 3);
    U(k32);
    AgTensor *w = op_matmul(g, q32, kt);
    U(q32);
    U(kt);
    AgTensor *cm = op_new(g, "where", DT_BOOL, SHAPE(1, 1, md->S, md->S));
    AgTensor *wc = op_where_const(g, cm, w);
    U(cm);
    U(w);
    AgTensor *wm = op_binary(g, BIN_ADD, wc, f->mask);
    U(wc);
    if (scale) {
        AgTensor *t = op_scalar(g, BIN_DIV, wm);
        U(wm);
        wm = t;
    }
    AgTensor *p = op_softmax(g, wm, DT_F32);
    U(wm);
    AgTensor *pd = op_to(g, p, v->dt);
    U(p);
    AgTensor *pdd = op_dropout(g, pd, md->m->attn_pdrop);
    U(pd);
    AgTensor *o = op_matmul(g, pdd, v);
    U(pdd);
    AgTensor *op_ = op_permute(g, o, (int[]){0, 2, 1, 3});
    U(o);
    AgTensor *oc = op_contiguous(g, op_);
    U(op_);
    return oc;
}

static AgTensor *neo_layer(AgGraph *g, void *user, AgTensor **in, int n)
{
    LayerArg *la = user;
    Model *md = la->md;
    const MemsimModel *m = md->m;
    Layer *ly = &md->layers[la->layer];
    AgTensor *x = in[0];
    AgTensor *h = layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qp = lin(md, &ly->q, h), *kp = lin(md, &ly->k, h), *vp = lin(md, &ly->v, h);
    U(h);
    AgTensor *q = split_heads(md, qp, m->nh), *k = split_heads(md, kp, m->nh);
    AgTensor *v = split_heads(md, vp, m->nh);
    U(qp);
    U(kp);
    U(vp);
    cache_update(md, &k, &v);
    AgTensor *o = neo_attn_core(md, la->f, q, k, v, false);
    U(q);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = lin(md, &ly->o, om);
    U(om);
    AgTensor *x1 = op_binary(g, BIN_ADD, ap, x);
    U(ap);
    AgTensor *h2 = layernorm(md, x1, ly->ln2_w, ly->ln2_b);
    AgTensor *f1 = lin(md, &ly->up, h2);
    U(h2);
    AgTensor *a = act(md, f1);
    U(f1);
    AgTensor *f2 = lin(md, &ly->down, a);
    U(a);
    AgTensor *out = op_binary(g, BIN_ADD, x1, f2);
    U(f2);
    U(x1);
    return out;
}

static AgTensor *codegen_layer(AgGraph *g, void *user, AgTensor **in, int n)
{
    LayerArg *la = user;
    Model *md = la->md;
    const MemsimModel *m = md->m;
    Layer *ly = &md->layers[la->layer];
    AgTensor *x = in[0];
    int64_t B = md->B, S = md->S, nh = m->nh, hd = m->hd, rd = m->rotary_dim;
    AgTensor *h = layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qkv = lin(md, &ly->qkv, h);
    /* reshape(B,S,4,3H/4) and split(H/4) into q, v, k; each reshaped to (B,S,nh,hd): a copy,
     * the dims do not merge */
    AgTensor *r4 = op_view(g, qkv, SHAPE(B, S, 4, 3 * m->nh * m->hd / 4));
    AgTensor *parts[3];
    op_split(g, r4, 3, m->nh * m->hd / 4, parts, 3);
    U(r4);
    U(qkv);
    AgTensor *heads[3];
    for (int i = 0; i < 3; i++) {
        heads[i] = op_reshape(g, parts[i], SHAPE(B, S, nh, hd));
        U(parts[i]);
    }
    /* sin/cos gathered from the layer's fp32 table, repeat_interleave'd to (1,S,1,rd) */
    AgContext *c = gg_ctx(g);
    bool ge = c->grad_enabled;
    c->grad_enabled = false;
    AgTensor *sincos = op_new(g, "index", DT_F32, SHAPE(1, S, rd));
    AgTensor *sin4 = op_new(g, "repeat_interleave", DT_F32, SHAPE(1, S, 1, rd));
    AgTensor *cos4 = op_new(g, "repeat_interleave", DT_F32, SHAPE(1, S, 1, rd));
    c->grad_enabled = ge;
    /* k then q: the rotated part is fp32 (dt × fp32), so the cat with the pass-through
     * promotes the whole head to fp32 */
    AgTensor *rot[2];
    for (int i = 1; i >= 0; i--) {
        AgTensor *hidx = heads[i == 0 ? 0 : 2]; /* split order: q, v, k */
        AgTensor *rr = apply_rope_partial(md, hidx, rd, cos4, sin4);
        rot[i] = op_permute(g, rr, (int[]){0, 2, 1, 3});
        U(rr);
    }
    U(sin4);
    U(cos4);
    U(sincos);
    U(heads[0]);
    U(heads[2]);
    AgTensor *v = op_permute(g, heads[1], (int[]){0, 2, 1, 3});
    U(heads[1]);
    AgTensor *k = rot[1];
    cache_update(md, &k, &v);
    AgTensor *o = neo_attn_core(md, la->f, rot[0], k, v, true);
    U(rot[0]);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = lin(md, &ly->o, om);
    U(om);
    AgTensor *f1 = lin(md, &ly->up, h);
    U(h);
    AgTensor *a = act(md, f1);
    U(f1);
    AgTensor *f2 = lin(md, &ly->down, a);
    U(a);
    AgTensor *s = op_binary(g, BIN_ADD, ap, f2);
    U(ap);
    U(f2);
    AgTensor *out = op_binary(g, BIN_ADD, s, x);
    U(s);
    return out;
}

/* ---- building ---- */

const char *model_lora_default_targets(Family f)
{
    switch (f) {
    case FAM_GPT2:
        return "c_attn";
    case FAM_BLOOM:
    case FAM_NEOX:
    case FAM_FALCON:
        return "query_key_value";
    case FAM_CODEGEN:
        return "qkv_proj";
    default:
        return "q_proj,v_proj";
    }
}

static const char *module_names(Family f)
{
    switch (f) {
    case FAM_GPT2:
        return "c_attn,c_proj,c_fc";
    case FAM_OPT:
        return "q_proj,k_proj,v_proj,out_proj,fc1,fc2";
    case FAM_BLOOM:
        return "query_key_value,dense,dense_h_to_4h,dense_4h_to_h";
    case FAM_NEOX:
        return "query_key_value,dense,dense_h_to_4h,dense_4h_to_h";
    case FAM_FALCON:
        return "query_key_value,dense,dense_h_to_4h,dense_4h_to_h";
    case FAM_GPTNEO:
        return "q_proj,k_proj,v_proj,out_proj,c_fc,c_proj";
    case FAM_CODEGEN:
        return "qkv_proj,out_proj,fc_in,fc_out";
    case FAM_MIXTRAL:
        return "q_proj,k_proj,v_proj,o_proj,w1,w2,w3";
    default:
        return "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
    }
}

static AgTensor *vec(Model *md, int64_t n)
{
    return param(md, md->pdt, SHAPE(n), full_ft(md));
}

gboolean model_build(Model *md, AgGraph *g, const MemsimModel *m, const MemsimRun *run,
                     GError **error)
{
    return model_build_part(md, g, m, run, 1, 0, m->L, error);
}

gboolean model_build_part(Model *md, AgGraph *g, const MemsimModel *full, const MemsimRun *run,
                          int tp, int64_t l0, int64_t l1, GError **error)
{
    memset(md, 0, sizeof *md);
    md->g = g;
    md->leaves = g_ptr_array_new();
    md->tp = tp;
    md->l0 = l0;
    md->l1 = l1;
    md->first = l0 == 0;
    md->last = l1 == full->L;
    md->sp = run->sequence_parallel && tp > 1;
    if (md->sp && full->fam != FAM_GPT2 && full->fam != FAM_LLAMA) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "sequence-parallel: modelled for the llama and gpt2 families only (not %s)",
                    memsim_model_family(full));
        return FALSE;
    }
    /* Megatron splits heads, the MLP width and the (padded) vocabulary over the TP ranks */
    md->local = *full;
    if (tp > 1) {
        md->local.nh /= tp;
        md->local.nkv = full->nkv == 1 ? 1 : full->nkv / tp;
        md->local.I /= tp;
        int64_t mult = 128 * (int64_t)tp;
        md->local.V = (full->V + mult - 1) / mult * mult / tp;
    }
    const MemsimModel *m = &md->local;
    md->m = m;
    md->run = run;
    md->B = run->batch;
    md->S = run->seq;
    /* Mixed precision keeps fp32 master weights for what is trained; a frozen model (LoRA,
     * QLoRA, inference) is loaded in the low-precision dtype, as peft and current
     * Transformers (dtype="auto") do, and only the adapters are fp32. */
    bool frozen = run->finetune != MEMSIM_FT_FULL || run->inference;
    switch (run->precision) {
    case MEMSIM_PREC_BF16:
        md->pdt = md->adt = DT_BF16;
        break;
    case MEMSIM_PREC_FP16:
        md->pdt = md->adt = DT_F16;
        break;
    case MEMSIM_PREC_BF16_MIXED:
        md->pdt = md->adt = frozen ? DT_BF16 : DT_F32;
        break;
    case MEMSIM_PREC_FP16_MIXED:
        md->pdt = md->adt = frozen ? DT_F16 : DT_F32;
        break;
    default:
        md->pdt = md->adt = DT_F32;
        break;
    }
    /* LoRA targets must exist */
    if (run->finetune != MEMSIM_FT_FULL && !run->inference) {
        g_auto(GStrv) known = g_strsplit(module_names(m->fam), ",", -1);
        for (char **t = run->lora_targets; t && *t; t++) {
            if (!g_strv_contains((const char *const *)known, *t)) {
                g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                            "lora-targets: module '%s' does not exist in a %s model (modules: "
                            "%s)",
                            *t, memsim_model_family(m), module_names(m->fam));
                return FALSE;
            }
        }
        if (run->lora_rank <= 0) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "lora-rank: must be positive (got %d)", run->lora_rank);
            return FALSE;
        }
        md->lora_scaling = 2.0;
    }
    md->trainable = g_ptr_array_new();
    md->cache = g_ptr_array_new();
    int64_t V = m->V, H = m->H, I = m->I, L = m->L, nh = m->nh, nkv = m->nkv, hd = m->hd;
    int64_t A = nh * hd; /* attention width on this rank (H, or H/tp) */
    bool tr = full_ft(md);
    /* the first stage holds the embedding; with tied weights the last stage holds its own
     * copy for the output layer */
    if (md->first || (md->last && m->tie))
        md->wte = param(md, md->pdt, SHAPE(V, m->fam == FAM_OPT ? m->wep : H), tr);
    if (md->first && (m->fam == FAM_GPT2 || m->fam == FAM_GPTNEO))
        md->wpe = param(md, md->pdt, SHAPE(m->max_pos, H), tr);
    if (md->first && m->fam == FAM_OPT) {
        md->wpe = param(md, md->pdt, SHAPE(m->max_pos + 2, H), tr);
        if (m->wep != H) {
            md->proj_out = param(md, md->pdt, SHAPE(m->wep, H), tr);
            md->proj_in = param(md, md->pdt, SHAPE(H, m->wep), tr);
        }
    }
    if (md->first && m->fam == FAM_BLOOM) {
        md->emb_ln_w = vec(md, H); /* word_embeddings_layernorm */
        md->emb_ln_b = vec(md, H);
    }
    md->layers = g_new0(Layer, L);
    for (int64_t l = l0; l < l1; l++) {
        Layer *ly = &md->layers[l];
        switch (m->fam) {
        case FAM_LLAMA:
        case FAM_MIXTRAL:
            lin_make(md, &ly->q, "q_proj", nh * hd, H, m->qkv_bias, false);
            lin_make(md, &ly->k, "k_proj", nkv * hd, H, m->qkv_bias, false);
            lin_make(md, &ly->v, "v_proj", nkv * hd, H, m->qkv_bias, false);
            lin_make(md, &ly->o, "o_proj", H, nh * hd, m->o_bias, false);
            if (m->fam == FAM_MIXTRAL) {
                ly->router = param(md, md->pdt, SHAPE(m->n_experts, H), tr);
                ly->experts = g_new0(Lin, 3 * m->n_experts);
                for (int64_t e = 0; e < m->n_experts; e++) {
                    lin_make(md, &ly->experts[3 * e], "w1", I, H, false, false);
                    lin_make(md, &ly->experts[3 * e + 1], "w3", I, H, false, false);
                    lin_make(md, &ly->experts[3 * e + 2], "w2", H, I, false, false);
                }
            } else {
                lin_make(md, &ly->gate, "gate_proj", I, H, m->mlp_bias, false);
                lin_make(md, &ly->up, "up_proj", I, H, m->mlp_bias, false);
                lin_make(md, &ly->down, "down_proj", H, I, m->mlp_bias, false);
            }
            ly->ln1_w = vec(md, H);
            ly->ln2_w = vec(md, H);
            break;
        case FAM_GPT2:
            ly->ln1_w = vec(md, H);
            ly->ln1_b = vec(md, H);
            lin_make(md, &ly->qkv, "c_attn", 3 * A, H, true, true);
            lin_make(md, &ly->o, "c_proj", H, A, true, true);
            ly->ln2_w = vec(md, H);
            ly->ln2_b = vec(md, H);
            lin_make(md, &ly->up, "c_fc", I, H, true, true);
            lin_make(md, &ly->down, "c_proj", H, I, true, true);
            break;
        case FAM_OPT:
        case FAM_GPTNEO:
            lin_make(md, &ly->k, "k_proj", A, H, m->qkv_bias, false);
            lin_make(md, &ly->v, "v_proj", A, H, m->qkv_bias, false);
            lin_make(md, &ly->q, "q_proj", A, H, m->qkv_bias, false);
            lin_make(md, &ly->o, "out_proj", H, A, m->o_bias, false);
            ly->ln1_w = vec(md, H);
            ly->ln1_b = vec(md, H);
            lin_make(md, &ly->up, m->fam == FAM_OPT ? "fc1" : "c_fc", I, H, m->mlp_bias, false);
            lin_make(md, &ly->down, m->fam == FAM_OPT ? "fc2" : "c_proj", H, I, m->mlp_bias,
                     false);
            ly->ln2_w = vec(md, H);
            ly->ln2_b = vec(md, H);
            break;
        case FAM_BLOOM:
        case FAM_NEOX:
        case FAM_FALCON: {
            int64_t qkv_out = 3 * A;
            if (m->fam == FAM_FALCON)
                qkv_out = m->falcon_new_arch ? (2 * nkv + nh) * hd : nkv == 1 ? A + 2 * hd : 3 * A;
            ly->ln1_w = vec(md, H);
            ly->ln1_b = vec(md, H);
            if (m->fam != FAM_FALCON || m->falcon_new_arch || !m->parallel_residual) {
                ly->ln2_w = vec(md, H);
                ly->ln2_b = vec(md, H);
            }
            lin_make(md, &ly->qkv, "query_key_value", qkv_out, H, m->qkv_bias, false);
            lin_make(md, &ly->o, "dense", H, A, m->o_bias, false);
            lin_make(md, &ly->up, "dense_h_to_4h", I, H, m->mlp_bias, false);
            lin_make(md, &ly->down, "dense_4h_to_h", H, I, m->mlp_bias, false);
            break;
        }
        case FAM_CODEGEN:
            ly->ln1_w = vec(md, H);
            ly->ln1_b = vec(md, H);
            lin_make(md, &ly->qkv, "qkv_proj", 3 * A, H, false, false);
            lin_make(md, &ly->o, "out_proj", H, A, false, false);
            lin_make(md, &ly->up, "fc_in", I, H, true, false);
            lin_make(md, &ly->down, "fc_out", H, I, true, false);
            /* per-layer sinusoid table buffer, fp32 */
            buffer(md, DT_F32, SHAPE(m->max_pos, m->rotary_dim));
            break;
        default:
            g_assert_not_reached();
        }
        if (m->fam == FAM_GPTNEO) /* per-layer causal bias buffer, bool (max_pos²) */
            buffer(md, DT_BOOL, SHAPE(1, 1, m->max_pos, m->max_pos));
    }
    if (!md->last || (m->fam == FAM_OPT && !m->pre_ln)) {
        /* no final norm here */
    } else {
        md->norm_w = vec(md, H);
        if (m->fam != FAM_LLAMA && m->fam != FAM_MIXTRAL)
            md->norm_b = vec(md, H);
    }
    if (md->last && !m->tie)
        md->lm_head = param(md, md->pdt, SHAPE(V, m->fam == FAM_OPT ? m->wep : H), tr);
    if (md->last && m->fam == FAM_CODEGEN)
        md->lm_bias = param(md, md->pdt, SHAPE(V), tr);
    if (tp > 1)
        for (int64_t l = l0; l < l1; l++) {
            Layer *ly = &md->layers[l];
            ly->o.row_parallel = ly->down.row_parallel = true;
        }
    if (m->fam == FAM_LLAMA || m->fam == FAM_MIXTRAL || m->fam == FAM_NEOX ||
        m->fam == FAM_FALCON) {
        int64_t rd = m->fam == FAM_NEOX ? (int64_t)(hd * m->rotary_pct) : hd;
        md->inv_freq = buffer(md, DT_F32, SHAPE(rd / 2));
        if (!gg_rules(g)->v113)
            buffer(md, DT_F32, SHAPE(rd / 2)); /* original_inv_freq clone */
    }
    return TRUE;
}

void model_drop_output(Model *md)
{
    for (guint i = 0; i < md->cache->len; i++)
        gt_unref(md->g, md->cache->pdata[i]);
    g_ptr_array_set_size(md->cache, 0);
}

void model_clear(Model *md)
{
    gt_unref(md->g, md->sp_buf);
    md->sp_buf = NULL;
    if (md->cache) {
        model_drop_output(md);
        g_ptr_array_unref(md->cache);
    }
    if (md->leaves) {
        for (guint i = 0; i < md->leaves->len; i++)
            gt_unref(md->g, md->leaves->pdata[i]);
        g_ptr_array_unref(md->leaves);
    }
    if (md->trainable)
        g_ptr_array_unref(md->trainable);
    if (md->layers) {
        for (int64_t l = md->l0; l < md->l1; l++)
            g_free(md->layers[l].experts);
        g_free(md->layers);
    }
}

/* ---- the model forward ---- */

AgTensor *model_forward(Model *md, AgTensor *ids, AgTensor *labels, AgTensor **logits_out)
{
    return model_stage_forward(md, ids, NULL, labels, logits_out, NULL);
}

/* Megatron's vocab-parallel cross entropy (DISTRIBUTED.md §5.2) on logits [N, V/t]: an fp32
 * copy, normalised in place and saved; backward writes the gradient into it and returns it. */
static void bw_vocab_ce(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gout[0] = gt_ref(n->saved[0]); /* in place into the saved softmax */
}

static AgTensor *vocab_parallel_ce(Model *md, AgTensor *logits)
{
    AgGraph *g = md->g;
    int64_t N = logits->shape[0];
    AgTensor *l32 = op_to(g, logits, DT_F32);
    gg_op(g, "vocab_parallel_cross_entropy");
    AgTensor *small[4];
    for (int i = 0; i < 4; i++) /* max, masked target, predicted logits, sum-exp: [N] */
        small[i] = gt_empty(g, DT_F32, SHAPE(N));
    gg_collective(g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)N * 4 * 3, 1,
                  tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)N * 4 * 3));
    AgTensor *loss = gt_empty(g, DT_F32, SHAPE(N));
    for (int i = 0; i < 4; i++)
        gt_unref(g, small[i]);
    AgNode *n = gn_new(g, "_VocabParallelCrossEntropyBackward", bw_vocab_ce, 1);
    gn_add_input(g, n, l32);
    gn_save(g, n, l32);
    gn_set_output(n, loss, 0);
    gt_unref(g, l32);
    return loss; /* per token; its mean's backward is an expand (no allocation) */
}

AgTensor *model_stage_forward(Model *md, AgTensor *ids, AgTensor *x_in, AgTensor *labels,
                              AgTensor **logits_out, AgTensor **hidden_out)
{
    AgGraph *g = md->g;
    const MemsimModel *m = md->m;
    AgContext *c = gg_ctx(g);
    int64_t B = md->B, S = md->S, H = m->H, V = m->V;
    Fwd f = {0};
    bool eager = md->run->attention == MEMSIM_ATTN_EAGER || !gg_rules(g)->cuda ||
                 m->fam == FAM_BLOOM || m->fam == FAM_GPTNEO || m->fam == FAM_CODEGEN;
    f.eager = eager && (m->fam == FAM_BLOOM || m->fam == FAM_GPTNEO || m->fam == FAM_CODEGEN ||
                        md->run->attention == MEMSIM_ATTN_EAGER || !gg_rules(g)->cuda);
    c->layer = -1;
    if (logits_out)
        *logits_out = NULL;
    if (hidden_out)
        *hidden_out = NULL;

    AgTensor *x;
    if (md->first) {
        x = op_embedding(g, md->wte, ids);
        if (md->tp > 1) /* vocab-parallel embedding: masked lookup, then all-reduce */
            gg_collective(g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(x), 1,
                          tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(x)));
    } else {
        x = gt_ref(x_in);
    }
    /* position ids: arange(S) + past (0) → (1, S) */
    AgTensor *ar = op_new(g, "arange", DT_I64, SHAPE(S));
    AgTensor *pos = op_new(g, "add", DT_I64, SHAPE(1, S));
    U(ar);
    /* the causal mask: eager materialises an additive (B,1,S,S); SDPA uses is_causal,
     * except Falcon (always a bool mask) */
    AgTensor *cmask = op_new(g, "le", DT_BOOL, SHAPE(1, 1, S, S));
    if (f.eager || m->fam == FAM_BLOOM) {
        f.mask = op_new(g, "where", c->autocast && md->adt == DT_F32 ? DT_F32 : md->adt,
                        SHAPE(B, 1, S, S));
    } else if (m->fam == FAM_FALCON) {
        f.mask = op_new(g, "vmap_mask", DT_BOOL, SHAPE(B, 1, S, S));
    }
    U(cmask);
    AgTensor *cos = NULL, *sin = NULL;
    if (md->inv_freq) {
        int64_t rd = m->fam == FAM_NEOX ? (int64_t)(m->hd * m->rotary_pct) : m->hd;
        rotary(md, rd, pos, &cos, &sin);
        f.cos4 = op_unsqueeze(g, cos, 1);
        f.sin4 = op_unsqueeze(g, sin, 1);
    }
    if (!md->first) {
        /* later pipeline stages start from the received activation */
    } else if (m->fam == FAM_GPT2 || m->fam == FAM_GPTNEO) {
        AgTensor *pe = op_embedding(g, md->wpe, pos);
        AgTensor *s = op_binary(g, BIN_ADD, x, pe);
        U(pe);
        U(x);
        x = op_dropout(g, s, m->embd_pdrop);
        U(s);
    } else if (m->fam == FAM_OPT) {
        /* positions from the attention mask: cumsum, * mask, - 1, + 2 */
        AgTensor *ones = op_new(g, "ones", DT_F32, SHAPE(B, S));
        AgTensor *cs = op_new(g, "cumsum", DT_F32, SHAPE(B, S));
        AgTensor *pm = op_new(g, "mul", DT_F32, SHAPE(B, S));
        U(cs);
        AgTensor *pm1 = op_new(g, "sub", DT_F32, SHAPE(B, S));
        U(pm);
        AgTensor *pl = op_new(g, "_to_copy", DT_I64, SHAPE(B, S));
        U(pm1);
        AgTensor *p2 = op_new(g, "add", DT_I64, SHAPE(B, S));
        AgTensor *pe = op_embedding(g, md->wpe, p2);
        U(p2);
        U(pl);
        if (md->proj_in) {
            AgTensor *t = op_linear(g, x, md->proj_in, NULL);
            U(x);
            x = t;
        }
        AgTensor *s = op_binary(g, BIN_ADD, x, pe);
        U(pe);
        U(x);
        x = s;
        U(ones);
    } else if (m->fam == FAM_BLOOM) {
        AgTensor *t = layernorm(md, x, md->emb_ln_w, md->emb_ln_b);
        U(x);
        x = t;
        /* ALiBi: (B·nh, 1, S) in the model dtype, kept for the forward */
        AgTensor *alibi = op_new(g, "build_alibi_tensor", md->adt, SHAPE(B * m->nh, 1, S));
        U(alibi);
    }
    if (md->sp && md->first) {
        /* scatter_to_sequence_parallel_region: the residual stream is S/tp tokens */
        AgTensor *t = sp_reduce_scatter(md, x);
        U(x);
        x = t;
    }
    LayerArg la = {md, &f, 0, {0}};
    AgRegionFn fn;
    switch (m->fam) {
    case FAM_GPT2:
        fn = gpt2_layer;
        break;
    case FAM_OPT:
        fn = opt_layer;
        break;
    case FAM_NEOX:
        fn = neox_layer;
        break;
    case FAM_BLOOM:
        fn = bloom_layer;
        break;
    case FAM_FALCON:
        fn = falcon_layer;
        break;
    case FAM_GPTNEO:
        fn = neo_layer;
        break;
    case FAM_CODEGEN:
        fn = codegen_layer;
        break;
    default:
        fn = llama_layer;
        break;
    }
    for (int64_t l = md->l0; l < md->l1; l++) {
        c->layer = (int32_t)l;
        la.layer = (int)l;
        if (md->layer_hook)
            md->layer_hook(md, (int32_t)l, true);
        AgTensor *y;
        if (md->run->checkpointing == MEMSIM_CKPT_FULL && c->grad_enabled) {
            /* the checkpoint keeps the layer's arguments (mask, cos/sin) with its inputs */
            LayerArg *ca = g_new0(LayerArg, 1);
            *ca = la;
            ca->own = f;
            gt_ref(f.mask);
            gt_ref(f.cos4);
            gt_ref(f.sin4);
            ca->f = &ca->own;
            y = gg_checkpoint(g, fn, ca, layer_arg_free, &x, 1);
        } else
            y = fn(g, &la, &x, 1);
        U(x);
        x = y;
        if (md->layer_hook)
            md->layer_hook(md, (int32_t)l, false);
    }
    c->layer = -1;
    if (!md->last) {
        U(f.mask);
        U(f.cos4);
        U(f.sin4);
        U(cos);
        U(sin);
        U(pos);
        *hidden_out = x;
        return NULL;
    }
    if (md->norm_w) {
        AgTensor *t = (m->fam == FAM_LLAMA || m->fam == FAM_MIXTRAL)
                          ? rmsnorm(md, x, md->norm_w)
                          : layernorm(md, x, md->norm_w, md->norm_b);
        U(x);
        x = t;
    }
    if (md->proj_out) {
        AgTensor *t = op_linear(g, x, md->proj_out, NULL);
        U(x);
        x = t;
    }
    /* the model's locals (mask, cos/sin, position ids) die when its forward returns */
    U(f.mask);
    U(f.cos4);
    U(f.sin4);
    U(cos);
    U(sin);
    U(pos);
    /* lm_head(hidden[:, slice(-0, None), :]) — a full-range slice, recorded in 1.13 */
    AgTensor *hs = md->last_logits_only            ? op_slice(g, x, 1, S - 1, S)
                   : gg_rules(g)->full_slices_recorded ? op_slice(g, x, 1, 0, S)
                                                       : gt_ref(x);
    /* the base model's output (hidden_states, last_hidden_state) is the CausalLM forward's
     * local until it returns: alive through the loss, saved or not */
    AgTensor *last_hidden = x;
    AgTensor *w = md->lm_head ? md->lm_head : md->wte;
    AgTensor *logits;
    if (md->sp) {
        Lin head = {.w = w, .b = md->lm_bias, .out = w->shape[0], .in = w->shape[1]};
        logits = sp_column_linear(md, &head, hs);
    } else {
        logits = op_linear(g, hs, w, md->lm_bias);
    }
    U(hs);
    *logits_out = logits;
    if (!labels) {
        U(last_hidden);
        return NULL;
    }
    if (md->tp > 1) {
        AgTensor *l2 = op_view(g, logits, SHAPE(B * S, V));
        AgTensor *loss = vocab_parallel_ce(md, l2);
        U(l2);
        U(last_hidden);
        return loss;
    }
    /* ForCausalLMLoss (§2.11): logits.float(), labels padded and shifted, cross entropy */
    AgTensor *lf = op_to(g, logits, DT_F32);
    AgTensor *lp = op_new(g, "constant_pad_nd", DT_I64, SHAPE(B, S + 1));
    AgTensor *sl = op_new(g, "clone", DT_I64, SHAPE(B, S)); /* [..., 1:].contiguous() */
    AgTensor *l2 = op_view(g, lf, SHAPE(B * S, V));
    U(lf);
    AgTensor *t1 = op_view(g, sl, SHAPE(B * S));
    U(sl);
    AgTensor *loss = op_cross_entropy(g, l2, t1);
    U(l2);
    U(t1);
    U(lp); /* the padded labels live until the loss function returns */
    U(last_hidden);
    (void)H;
    return loss;
}
