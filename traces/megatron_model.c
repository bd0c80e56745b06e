/* Megatron-LM's GPTModel (megatron/core/models/gpt/gpt_model.py) as its layers allocate:
 * the local spec (--transformer-impl local: Megatron's own linears, fused LayerNorm, the
 * unfused DotProductAttention) and the Transformer Engine spec (fused LayerNorm+linear
 * modules, TE's attention backends), on the op library's autograd. Layout is sequence-first
 * [s, b, h]; s is this rank's sequence (seq / cp), and the residual stream holds s / tp of
 * it under sequence parallelism. Megatron-LM commit d98e8a64dd is cited by path:line. */
#include "traces/models.h"
#include "traces/layers.h"

#include <string.h>

#define U(x) gt_unref(md->g, (x))

/* ---- one autograd Function (torch.autograd.Function of Megatron or TE) ---- */

/* What its backward allocates beyond the input gradients: temporaries, freed when it returns. */
typedef struct {
    int n_tmp;
    DType tmp_dt[4];
    int64_t tmp_n[4];
    bool grad_in_place; /* the first input's gradient is written into the first saved tensor */
    uint32_t pass;      /* inputs (bits) whose gradient is the incoming one (a reference) */
} FnBw;

#define PASS(i) (1u << (i))

static void bw_fn(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    const FnBw *b = n->extra;
    AgTensor *tmp[4] = {0};
    gg_op(g, n->name);
    for (int i = 0; i < b->n_tmp; i++)
        tmp[i] = gt_empty(g, b->tmp_dt[i], 1, (int64_t[]){b->tmp_n[i]});
    for (int i = 0; i < n->n_next; i++) {
        if (!n->next[i].node)
            continue;
        if (i == 0 && b->grad_in_place)
            gout[i] = gt_ref(n->saved[0]);
        else if ((b->pass & PASS(i)) && gin[0])
            gout[i] = gt_ref(gin[0]);
        else
            gout[i] = gt_empty(g, n->in_meta[i]->dt, n->in_meta[i]->nd, n->in_meta[i]->shape);
    }
    for (int i = 0; i < b->n_tmp; i++)
        gt_unref(g, tmp[i]);
}

/* The split of the fused QKV output into views (SplitWithSizesBackward: the three gradients
 * concatenated into one new tensor). */
static void bw_split(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    (void)gin;
    gg_op(g, "cat");
    gout[0] = gt_empty(g, n->in_meta[0]->dt, n->in_meta[0]->nd, n->in_meta[0]->shape);
}

static void split_qkv(Model *md, AgTensor *qkv, int64_t s, int64_t b, int64_t np, int64_t ng,
                      int64_t hd, AgTensor **q, AgTensor **k, AgTensor **v)
{
    AgGraph *g = md->g;
    *q = gt_view_of(g, qkv, SHAPE(s, b, np, hd), NULL);
    *k = gt_view_of(g, qkv, SHAPE(s, b, ng, hd), NULL);
    *v = gt_view_of(g, qkv, SHAPE(s, b, ng, hd), NULL);
    if (!gg_needs_grad(g, 1, &qkv))
        return;
    AgNode *n = gn_new(g, "SplitWithSizesBackward0", bw_split, 3);
    gn_add_input(g, n, qkv);
    gn_set_output(n, *q, 0);
    gn_set_output(n, *k, 1);
    gn_set_output(n, *v, 2);
}

/* Records `out` (allocated by the caller) as the output of a Function of inputs `in`, saving
 * `save`. Inputs that need a gradient get one like themselves. */
static void fn_record(AgGraph *g, const char *name, AgTensor *const *in, int nin,
                      AgTensor *const *save, int nsave, AgTensor *out, const FnBw *bw)
{
    if (!gg_needs_grad(g, nin, in))
        return;
    AgNode *n = gn_new(g, name, bw_fn, 1);
    for (int i = 0; i < nin; i++)
        gn_add_input(g, n, in[i]);
    for (int i = 0; i < nsave; i++)
        gn_save(g, n, save[i]);
    FnBw *copy = g_new(FnBw, 1);
    *copy = bw ? *bw : (FnBw){0};
    n->extra = copy;
    n->extra_free = g_free;
    gn_set_output(n, out, 0);
}

/* ---- the stage ---- */

typedef struct {
    Model *md;
    const MgOptions *o;
    int64_t s, b, h;   /* this rank's sequence, micro-batch, hidden */
    int64_t N, Nr;     /* tokens of a full-sequence activation, of the residual stream */
    int64_t np, ng, hd, ffn;
    DType adt;
    AgTensor *mask;    /* the data loader's attention mask, or NULL */
    AgTensor *freqs;   /* RoPE: the [s, 1, 1, hd] fp32 frequencies */
} St;

static AgTensor *t2(AgGraph *g, DType dt, int64_t a, int64_t b)
{
    return gt_empty(g, dt, SHAPE(a, b));
}

/* The persistent global buffer ("mpu": parallel_state.get_global_memory_buffer()): reused,
 * replaced by a larger one when a request exceeds it (megatron/core/utils.py GlobalMemoryBuffer). */
static void mpu_buffer(Model *md, int64_t nbytes)
{
    AgTensor **buf = md->mg_mpu;
    if (!buf || (*buf && gt_nbytes(*buf) >= nbytes))
        return;
    AgGraph *g = md->g;
    AgContext *c = gg_ctx(g);
    uint8_t cat = c->category;
    c->category = MEMSIM_CAT_OTHER;
    gg_op(g, "GlobalMemoryBuffer.get_tensor");
    AgTensor *t = gt_empty(g, DT_BF16, SHAPE((nbytes + 1) / 2));
    c->category = cat;
    gt_unref(g, *buf);
    *buf = t;
}

/* Megatron's fused LayerNorm or RMSNorm on [Nr, h] (apex FusedLayerNormAffineFunction /
 * TE): saves the input, the weight(s) and fp32 statistics per token. */
static AgTensor *norm(St *st, AgTensor *x, AgTensor *w, AgTensor *bias)
{
    AgGraph *g = st->md->g;
    int64_t n = gt_numel(x) / st->h;
    gg_op(g, st->o->rms_norm ? "fused_rms_norm" : "fused_layer_norm");
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    AgTensor *mu = st->o->rms_norm ? NULL : gt_empty(g, DT_F32, SHAPE(n));
    AgTensor *rs = gt_empty(g, DT_F32, SHAPE(n));
    AgTensor *in[3] = {x, w, bias};
    AgTensor *sv[4] = {x, w, rs, mu};
    fn_record(g, st->o->rms_norm ? "FusedRMSNormAffineFunctionBackward"
                                 : "FusedLayerNormAffineFunctionBackward",
              in, bias ? 3 : 2, sv, mu ? 4 : 3, out, NULL);
    gt_unref(g, mu);
    gt_unref(g, rs);
    return out;
}

/* A column- or row-parallel linear (LinearWithGradAccumulationAndAsyncCommunication,
 * megatron/core/tensor_parallel/layers.py): saves its input and weight; the product, then
 * `output + bias` unless the bias is returned to a fused op. Backward: dgrad, then the weight
 * gradient (with gradient-accumulation fusion an empty tensor of the weight's shape, the
 * GEMM accumulating into main_grad), then the bias gradient. Under sequence parallelism a
 * column-parallel input is all-gathered into the global buffer (again in backward) and a
 * row-parallel output reduce-scattered. */
static AgTensor *linear(St *st, Lin *l, AgTensor *x, bool column, bool add_bias)
{
    Model *md = st->md;
    AgGraph *g = md->g;
    int64_t rows = gt_numel(x) / l->in;
    bool sp = md->sp;
    AgTensor *in = gt_ref(x);
    if (sp && column) {
        mpu_buffer(md, rows * md->tp * l->in * dt_size(x->dt));
        gg_collective(g, MEMSIM_COLL_ALL_GATHER, (uint64_t)gt_nbytes(x) * md->tp, 1,
                      nn_tp_us(md, MEMSIM_COLL_ALL_GATHER, (uint64_t)gt_nbytes(x) * md->tp));
        rows *= md->tp;
    }
    gg_op(g, "linear");
    gg_gemm(g);
    gg_flops(g, 2.0 * (double)rows * (double)l->in * (double)l->out);
    AgTensor *out = t2(g, st->adt, rows, l->out);
    AgTensor *ins[2] = {in, l->w};
    AgTensor *sv[2] = {in, l->w};
    fn_record(g, "LinearWithGradAccumulationAndAsyncCommunicationBackward", ins, 2, sv, 2, out,
              NULL);
    U(in);
    if (sp && !column) {
        /* reduce_scatter_to_sequence_parallel_region: a new [rows / tp, out] */
        AgTensor *r = t2(g, st->adt, rows / md->tp, l->out);
        gg_collective(g, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)gt_nbytes(out), 1,
                      nn_tp_us(md, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)gt_nbytes(out)));
        AgTensor *ins2[1] = {out};
        fn_record(g, "_ReduceScatterToSequenceParallelRegionBackward", ins2, 1, NULL, 0, r, NULL);
        U(out);
        out = r;
        rows /= md->tp;
    } else if (!column && md->tp > 1) {
        gg_collective(g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(out), 1,
                      nn_tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(out)));
    }
    if (add_bias && l->b) {
        AgTensor *r = t2(g, st->adt, rows, l->out);
        gg_op(g, "add");
        AgTensor *ins3[2] = {out, l->b};
        fn_record(g, "AddBackward0", ins3, 2, NULL, 0, r, &(FnBw){.pass = PASS(0)});
        U(out);
        out = r;
    }
    return out;
}

/* bias-dropout-add (megatron/core/fusions/fused_bias_dropout.py): residual + dropout(x + bias);
 * the jit-fused train kernel saves the dropout mask (bool) and makes one output. */
static AgTensor *bda(St *st, AgTensor *x, AgTensor *bias, AgTensor *residual, double p)
{
    AgGraph *g = st->md->g;
    gg_op(g, "bias_dropout_add_fused_train");
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    AgTensor *mask = p > 0 ? gt_empty(g, DT_BOOL, x->nd, x->shape) : NULL;
    AgTensor *in[3] = {residual, x, bias};
    AgTensor *sv[1] = {mask};
    fn_record(g, "BiasDropoutAddBackward", in, bias ? 3 : 2, sv, mask ? 1 : 0, out,
              &(FnBw){.pass = PASS(0) | (p > 0 ? 0 : PASS(1))});
    gt_unref(g, mask);
    return out;
}

/* Core attention on q [s, b, np, hd], k and v [s, b, ng, hd]; returns the context
 * [N, np·hd]. */
static AgTensor *core_attention(St *st, AgTensor *q, AgTensor *k, AgTensor *v)
{
    Model *md = st->md;
    AgGraph *g = md->g;
    const MgOptions *o = st->o;
    int64_t s = st->s, b = st->b, np = st->np, hd = st->hd;
    double pdrop = md->m->attn_pdrop;
    MgAttn a = o->attention;
    if (a == MG_ATTN_AUTO)
        a = MG_ATTN_FLASH;
    if (a == MG_ATTN_LOCAL || a == MG_ATTN_UNFUSED) {
        /* DotProductAttention (megatron/core/transformer/dot_product_attention.py): the
         * scores by baddbmm into [b·np, s, s] (its input buffer the global buffer), the fused
         * scale-mask-softmax, dropout, and bmm with v */
        AgTensor *qc = gt_empty(g, st->adt, SHAPE(s, b * np, hd)); /* query.reshape: a copy */
        if (a == MG_ATTN_LOCAL)
            mpu_buffer(md, b * np * s * s * dt_size(st->adt));
        gg_op(g, "baddbmm");
        gg_gemm(g);
        gg_flops(g, 2.0 * (double)(b * np) * s * s * hd);
        AgTensor *sc = gt_empty(g, st->adt, SHAPE(b * np, s, s));
        AgTensor *in1[2] = {qc, k};
        AgTensor *sv1[2] = {qc, k};
        fn_record(g, "BaddbmmBackward0", in1, 2, sv1, 2, sc, NULL);
        U(qc);
        gg_op(g, "scaled_upper_triang_masked_softmax");
        AgTensor *pr = gt_empty(g, st->adt, SHAPE(b * np, s, s));
        AgTensor *sv2[1] = {pr};
        fn_record(g, "ScaledUpperTriangMaskedSoftmaxBackward", &sc, 1, sv2, 1, pr,
                  &(FnBw){.grad_in_place = true});
        U(sc);
        AgTensor *pd = op_dropout(g, pr, pdrop);
        U(pr);
        gg_op(g, "bmm");
        gg_gemm(g);
        gg_flops(g, 2.0 * (double)(b * np) * s * s * hd);
        AgTensor *ctx = gt_empty(g, st->adt, SHAPE(b * np, s, hd));
        AgTensor *in3[2] = {pd, v};
        AgTensor *sv3[2] = {pd, v};
        fn_record(g, "BmmBackward0", in3, 2, sv3, 2, ctx, NULL);
        U(pd);
        /* permute to [s, b, np, hd] and view [s, b, h]: a contiguous copy */
        AgTensor *out = gt_empty(g, st->adt, SHAPE(st->N, np * hd));
        fn_record(g, "CloneBackward0", &ctx, 1, NULL, 0, out, &(FnBw){.pass = PASS(0)});
        U(ctx);
        return out;
    }
    /* flash / fused (cuDNN): the output and fp32 softmax statistics [b, np, s] saved with
     * q, k, v (and the RNG state) */
    gg_op(g, a == MG_ATTN_FLASH ? "flash_attn_forward" : "fused_attn_fwd");
    gg_flops(g, 2.0 * (double)(b * np) * s * s * hd);
    AgTensor *out = gt_empty(g, st->adt, SHAPE(st->N, np * hd));
    AgTensor *lse = gt_empty(g, DT_F32, SHAPE(b, np, s));
    AgTensor *in[3] = {q, k, v};
    AgTensor *sv[5] = {q, k, v, out, lse};
    fn_record(g, a == MG_ATTN_FLASH ? "FlashAttnFuncBackward" : "FusedAttnFuncBackward", in, 3,
              sv, 5, out, NULL);
    U(lse);
    return out;
}

/* Rotary embedding on [s, b, heads, hd]: the fused kernel (TE / apex) saves only the
 * frequencies; a new tensor. */
static AgTensor *rope(St *st, AgTensor *x)
{
    AgGraph *g = st->md->g;
    gg_op(g, "fused_apply_rotary_pos_emb");
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    AgTensor *sv[1] = {st->freqs};
    fn_record(g, "FusedRoPEFuncBackward", &x, 1, sv, 1, out, NULL);
    return out;
}

typedef struct {
    Model *md;
    int layer;
} MgLayerArg;

static AgTensor *layer(AgGraph *g, void *user, AgTensor **inp, int nin)
{
    MgLayerArg *la = user;
    Model *md = la->md;
    St *st = md->mg_stage;
    const MgOptions *o = st->o;
    Layer *ly = &md->layers[la->layer];
    double pd = md->m->resid_pdrop;
    AgTensor *x = inp[0];
    (void)nin;
    /* attention */
    AgTensor *h1 = norm(st, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qkv = linear(st, &ly->qkv, h1, true, true);
    U(h1);
    int64_t s = st->s, b = st->b, np = st->np, ng = st->ng, hd = st->hd;
    /* split into query, key, value views */
    AgTensor *q, *k, *v;
    split_qkv(md, qkv, s, b, np, ng, hd, &q, &k, &v);
    if (o->qk_norm) {
        AgTensor *qn = norm(st, q, ly->qn_w, ly->qn_b);
        AgTensor *kn = norm(st, k, ly->kn_w, ly->kn_b);
        U(q);
        U(k);
        q = qn;
        k = kn;
    }
    if (o->pos == MG_POS_ROPE) {
        AgTensor *qr = rope(st, q), *kr = rope(st, k);
        U(q);
        U(k);
        q = qr;
        k = kr;
    }
    U(qkv);
    AgTensor *ctx = core_attention(st, q, k, v);
    U(q);
    U(k);
    U(v);
    AgTensor *pr = linear(st, &ly->o, ctx, false, false);
    U(ctx);
    AgTensor *x1 = bda(st, pr, ly->o.b, x, pd);
    U(pr);
    /* MLP */
    AgTensor *h2 = norm(st, x1, ly->ln2_w, ly->ln2_b);
    bool fuse_bias = o->swiglu || o->bias_gelu_fusion;
    AgTensor *f1 = linear(st, &ly->up, h2, true, !fuse_bias);
    U(h2);
    int64_t I = st->ffn;
    gg_op(g, o->swiglu ? "bias_swiglu" : "bias_gelu");
    AgTensor *act = t2(g, st->adt, gt_numel(f1) / (o->swiglu ? 2 * I : I), I);
    AgTensor *ain[2] = {f1, fuse_bias ? ly->up.b : NULL};
    AgTensor *asv[2] = {f1, ain[1]};
    fn_record(g, o->swiglu ? "BiasSwiGLUFunctionBackward" : "GeLUFunctionBackward", ain,
              ain[1] ? 2 : 1, asv, ain[1] ? 2 : 1, act, NULL);
    U(f1);
    AgTensor *f2 = linear(st, &ly->down, act, false, false);
    U(act);
    AgTensor *out = bda(st, f2, ly->down.b, x1, pd);
    U(f2);
    U(x1);
    return out;
}

/* ---- parameters ---- */

static AgTensor *vecp(Model *md, int64_t n)
{
    return nn_param(md, md->pdt, SHAPE(n), true);
}

gboolean mg_build(Model *md, const MemsimModel *m, int64_t l0, int64_t l1, GError **error)
{
    const MgOptions *o = m->mg;
    int tp = md->tp;
    int64_t H = m->H, hd = m->hd;
    /* m is this rank's part (heads, query groups, MLP width already divided by tp) */
    int64_t np = m->nh, ng = m->nkv, I = m->I;
    int64_t V = mg_padded_vocab(o, tp) / tp;
    bool bias = m->mlp_bias;
    (void)error;
    md->local.V = V;
    if (md->first)
        md->wte = nn_param(md, md->pdt, SHAPE(V, H), true);
    if (md->first && o->pos == MG_POS_LEARNED)
        md->wpe = nn_param(md, md->pdt, SHAPE(m->max_pos, H), true);
    md->layers = g_new0(Layer, m->L);
    for (int64_t l = l0; l < l1; l++) {
        Layer *ly = &md->layers[l];
        ly->ln1_w = vecp(md, H);
        ly->ln1_b = o->rms_norm ? NULL : vecp(md, H);
        nn_lin_make(md, &ly->qkv, "linear_qkv", (np + 2 * ng) * hd, H, bias, false);
        if (o->qk_norm) {
            ly->qn_w = vecp(md, hd);
            ly->qn_b = o->rms_norm ? NULL : vecp(md, hd);
            ly->kn_w = vecp(md, hd);
            ly->kn_b = o->rms_norm ? NULL : vecp(md, hd);
        }
        nn_lin_make(md, &ly->o, "linear_proj", H, np * hd, bias, false);
        ly->ln2_w = vecp(md, H);
        ly->ln2_b = o->rms_norm ? NULL : vecp(md, H);
        nn_lin_make(md, &ly->up, "linear_fc1", o->swiglu ? 2 * I : I, H, bias, false);
        nn_lin_make(md, &ly->down, "linear_fc2", H, I, bias, false);
        ly->o.row_parallel = ly->down.row_parallel = true;
    }
    if (md->last) {
        md->norm_w = vecp(md, H);
        md->norm_b = o->rms_norm ? NULL : vecp(md, H);
        /* the output layer: its own weight, or (tied) a copy of the word embedding that the
         * embedding group all-reduces (megatron/core/models/common/language_module) */
        if (!md->first || !m->tie)
            md->lm_head = nn_param(md, md->pdt, SHAPE(V, H), true);
    }
    return TRUE;
}

/* ---- the stage's forward ---- */

/* Megatron's vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py)
 * on logits [N, V/tp]: an fp32 copy normalised in place and saved; the loss [N] fp32. Its
 * backward writes the gradient into the saved softmax and returns it. */
static AgTensor *cross_entropy(St *st, AgTensor *logits, AgTensor *labels)
{
    Model *md = st->md;
    AgGraph *g = md->g;
    int64_t N = gt_numel(logits) / logits->shape[logits->nd - 1];
    int64_t V = logits->shape[logits->nd - 1];
    gg_op(g, "vocab_parallel_cross_entropy");
    AgTensor *l32 = t2(g, DT_F32, N, V); /* vocab_parallel_logits.float() */
    AgTensor *small[4];
    for (int i = 0; i < 4; i++) /* max, masked target, predicted logits, sum-exp: [N] */
        small[i] = gt_empty(g, DT_F32, SHAPE(N));
    if (md->tp > 1)
        gg_collective(g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)N * 4 * 3, 1,
                      nn_tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)N * 4 * 3));
    AgTensor *loss = gt_empty(g, DT_F32, SHAPE(N));
    for (int i = 0; i < 4; i++)
        gt_unref(g, small[i]);
    AgTensor *in[1] = {logits};
    AgTensor *sv[2] = {l32, labels};
    fn_record(g, "_VocabParallelCrossEntropyBackward", in, 1, sv, 2, loss, NULL);
    U(l32);
    return loss;
}

AgTensor *mg_stage_forward(Model *md, AgTensor *x_in, AgTensor **hidden_out)
{
    AgGraph *g = md->g;
    const MemsimModel *m = md->m;
    const MgOptions *o = m->mg;
    AgContext *c = gg_ctx(g);
    St st = {.md = md, .o = o, .b = md->B, .h = m->H, .np = m->nh, .ng = m->nkv, .hd = m->hd,
             .ffn = m->I, .adt = md->adt};
    st.s = md->S / o->cp;
    st.N = st.s * st.b;
    st.Nr = md->sp ? st.N / md->tp : st.N;
    md->mg_stage = &st;
    c->layer = -1;
    int64_t s = st.s, b = st.b, H = st.h;
    /* the micro-batch (pretrain_gpt.py get_batch): tokens and positions on the first stage,
     * labels and the loss mask on the last, the attention mask on both */
    AgTensor *tokens = NULL, *pos = NULL, *labels = NULL, *lmask = NULL;
    if (md->first) {
        tokens = gg_leaf(g, DT_I64, SHAPE(b, s), false, MEMSIM_CAT_INPUT);
        pos = gg_leaf(g, DT_I64, SHAPE(b, s), false, MEMSIM_CAT_INPUT);
    }
    if (md->last) {
        labels = gg_leaf(g, DT_I64, SHAPE(b, s), false, MEMSIM_CAT_INPUT);
        lmask = gg_leaf(g, DT_F32, SHAPE(b, s), false, MEMSIM_CAT_INPUT);
    }
    if (o->attention_mask && (md->first || md->last))
        st.mask = gg_leaf(g, DT_BOOL, SHAPE(b, 1, s * o->cp, s * o->cp), false, MEMSIM_CAT_INPUT);
    if (o->pos == MG_POS_ROPE)
        st.freqs = op_new(g, "rotary_pos_emb", DT_F32, SHAPE(s, 1, 1, st.hd));
    AgTensor *x;
    if (md->first) {
        /* VocabParallelEmbedding (+ learned positions), then the embedding dropout */
        AgTensor *e = op_embedding(g, md->wte, tokens);
        if (md->tp > 1)
            gg_collective(g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(e), 1,
                          nn_tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(e)));
        if (md->wpe) {
            AgTensor *pe = op_embedding(g, md->wpe, pos);
            AgTensor *sum = op_binary(g, BIN_ADD, e, pe);
            U(pe);
            U(e);
            e = sum;
        }
        /* transpose to [s, b, h] and make contiguous; under sequence parallelism scatter */
        AgTensor *t = t2(g, md->adt, st.Nr, H);
        fn_record(g, md->sp ? "_ScatterToSequenceParallelRegionBackward" : "CloneBackward0", &e, 1,
                  NULL, 0, t, md->sp ? NULL : &(FnBw){.pass = PASS(0)});
        U(e);
        x = op_dropout(g, t, m->embd_pdrop);
        U(t);
    } else {
        x = gt_ref(x_in);
    }
    MgLayerArg la = {md, 0};
    for (int64_t l = md->l0; l < md->l1; l++) {
        c->layer = (int32_t)l;
        la.layer = (int)l;
        AgTensor *y = layer(g, &la, &x, 1);
        U(x);
        x = y;
    }
    c->layer = -1;
    U(tokens);
    U(pos);
    if (!md->last) {
        U(st.mask);
        U(st.freqs);
        md->mg_stage = NULL;
        *hidden_out = x;
        return NULL;
    }
    AgTensor *hf = norm(&st, x, md->norm_w, md->norm_b);
    U(x);
    Lin head = {.w = md->lm_head ? md->lm_head : md->wte, .in = H, .out = md->local.V};
    AgTensor *logits = linear(&st, &head, hf, true, false);
    U(hf);
    AgTensor *loss = cross_entropy(&st, logits, labels);
    U(logits);
    /* loss_func: (losses * loss_mask).sum() over the micro-batch */
    AgTensor *lm = op_binary(g, BIN_MUL, loss, lmask);
    U(loss);
    AgTensor *tot = op_new(g, "sum", DT_F32, SHAPE(1));
    AgTensor *tin[1] = {lm};
    fn_record(g, "SumBackward0", tin, 1, NULL, 0, tot, &(FnBw){.pass = PASS(0)});
    U(lm);
    U(labels);
    U(lmask);
    U(st.mask);
    U(st.freqs);
    md->mg_stage = NULL;
    return tot;
}
