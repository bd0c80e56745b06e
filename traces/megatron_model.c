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

typedef enum { GEMM_NONE, GEMM_TORCH, GEMM_TE } GemmKind;

/* The host's time for one call of a module, its ops' dispatch included, as published: the
 * CPU runtime of one forward pass measured on H100 hosts with BF16 and TP = 1
 * (NVIDIA/TransformerEngine pull request #1191, "Minor optimizations to reduce CPU overheads
 * in modules"): Megatron-core's ColumnParallelLinear 74 µs; TEColumnParallelLinear 140 µs,
 * 115 µs with that change (Transformer Engine 1.11 on; the development set ran 2.8 to 2.17).
 * The TE figure is taken for every TE module, whose forwards share that path
 * (transformer_engine/pytorch/module/base.py TransformerEngineBaseModule.prepare_forward, or
 * DotProductAttention's own argument checks and backend selection); Megatron's figure for its
 * linears (megatron/core/tensor_parallel/layers.py). Backward: no published figure; the
 * Functions' backwards (TE _Linear.backward, _LayerNormLinear.backward, FusedAttnFunc.backward;
 * Megatron LinearWithGradAccumulationAndAsyncCommunication.backward) run the same checks,
 * casts and launches in reverse in Python, and are taken to cost what the forward does. Other
 * modules get the per-op dispatch of their ops only (traces/gpus.c dispatch_us). */
#define TE_MODULE_US 115.0
#define MG_LINEAR_US 74.0

/* What its backward allocates beyond the input gradients: temporaries, freed when it returns. */
typedef struct {
    int n_tmp;
    DType tmp_dt[4];
    int64_t tmp_n[4];
    bool grad_in_place; /* the first input's gradient is written into the first saved tensor */
    uint32_t pass;      /* inputs (bits) whose gradient is the incoming one (a reference) */
    GemmKind gemm;      /* the cuBLAS workspace its GEMMs take */
    MgShared *mgs;
    double host_us;     /* the module's host time per backward call (0: its ops' dispatch) */
} FnBw;

#define PASS(i) (1u << (i))

/* Transformer Engine's cuBLAS workspace: one per process, made at the first TE GEMM
 * (transformer_engine/pytorch/cpp_extensions/gemm.py get_cublas_workspace: 32 MiB + 1 KiB
 * on Hopper and later). */
static void te_gemm(AgGraph *g, MgShared *mgs)
{
    gg_op(g, "te_general_gemm");
    if (!mgs || mgs->te_workspace)
        return;
    AgContext *c = gg_ctx(g);
    uint8_t cat = c->category;
    c->category = MEMSIM_CAT_OTHER;
    mgs->te_workspace = gt_empty(g, DT_U8, SHAPE(((int64_t)32 << 20) + 1024));
    c->category = cat;
}

static void gemm(AgGraph *g, GemmKind k, MgShared *mgs)
{
    if (k == GEMM_TORCH)
        gg_gemm(g);
    else if (k == GEMM_TE)
        te_gemm(g, mgs);
}

static void bw_fn(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    const FnBw *b = n->extra;
    AgTensor *tmp[4] = {0};
    uint64_t ops0 = gg_op_count(g);
    gg_op(g, n->name);
    gemm(g, b->gemm, b->mgs);
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
    if (b->host_us > 0)
        gg_host_module(g, "host:module backward", ops0, b->host_us);
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
        if (save[i])
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
    MgShared *mgs;
    bool te;           /* Transformer Engine modules */
    MgAttn attn;       /* the attention backend that runs (auto resolved) */
    int cp;
    int64_t s, b, h;   /* this rank's sequence, micro-batch, hidden */
    int64_t N, Nr;     /* tokens of a full-sequence activation, of the residual stream */
    int64_t np, ng, hd, ffn;
    DType adt;
    AgTensor *mask;    /* the data loader's attention mask, or NULL */
    AgTensor *freqs;   /* RoPE: the cached [s, 1, 1, hd] fp32 frequencies */
    bool output_layer; /* the linear being built is the output layer */
} St;

static AgTensor *t2(AgGraph *g, DType dt, int64_t a, int64_t b)
{
    return gt_empty(g, dt, SHAPE(a, b));
}

/* The persistent global buffer ("mpu": parallel_state.get_global_memory_buffer()): reused,
 * replaced by a larger one when a request exceeds it (megatron/core/utils.py GlobalMemoryBuffer). */
static void mpu_buffer(St *st, int64_t nbytes)
{
    MgShared *mgs = st->mgs;
    if (!mgs || (mgs->mpu && gt_nbytes(mgs->mpu) >= nbytes))
        return;
    AgGraph *g = st->md->g;
    AgContext *c = gg_ctx(g);
    uint8_t cat = c->category;
    c->category = MEMSIM_CAT_OTHER;
    gg_op(g, "GlobalMemoryBuffer.get_tensor");
    AgTensor *t = gt_empty(g, DT_BF16, SHAPE((nbytes + 1) / 2));
    c->category = cat;
    gt_unref(g, mgs->mpu);
    mgs->mpu = t;
}

/* The persistent dummy weight gradient of gradient-accumulation fusion: one bf16 tensor per
 * weight shape (TE module/base.py get_dummy_wgrad), made at the first backward that needs it. */
static AgTensor *dummy_wgrad(AgGraph *g, MgShared *mgs, const AgTensor *w)
{
    char key[64];
    g_snprintf(key, sizeof key, "%" G_GINT64_FORMAT "x%" G_GINT64_FORMAT "/%d", w->shape[0],
               w->nd > 1 ? w->shape[1] : 1, (int)w->dt);
    AgTensor *d = g_hash_table_lookup(mgs->dummy, key);
    if (!d) {
        AgContext *c = gg_ctx(g);
        uint8_t cat = c->category;
        c->category = MEMSIM_CAT_OTHER;
        d = gt_empty(g, w->dt, w->nd, w->shape);
        c->category = cat;
        g_hash_table_insert(mgs->dummy, g_strdup(key), d);
    }
    return gt_ref(d);
}

/* ---- linear layers ---- */

/* How a linear's backward runs (Megatron's LinearWithGradAccumulationAndAsyncCommunication,
 * TE's _Linear and _LayerNormLinear). */
typedef struct {
    GemmKind gemm;
    MgShared *mgs;
    bool fused_wgrad;  /* the weight gradient accumulates into main_grad; autograd gets the dummy */
    bool gather;       /* sequence parallel, column-parallel: the input re-gathered */
    bool gather_mpu;   /* … into the global buffer (Megatron) rather than a new tensor (TE) */
    bool ln;           /* TE LayerNormLinear: the norm's backward follows (its x, weights) */
    int defer;         /* the output layer's wgrad deferred for this many micro-batches (-1: no;
                        * 0: all) */
    int tp;
    int64_t rows, in;  /* the GEMM's rows (gathered), the input width */
    DType dt;
} LinBw;

static void bw_linear(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    const LinBw *lb = n->extra;
    uint64_t ops0 = gg_op_count(g);
    gg_op(g, n->name);
    AgTensor *gath = NULL;
    if (lb->gather && !lb->gather_mpu)
        gath = t2(g, lb->dt, lb->rows, lb->in); /* the input re-gathered (TE) */
    gemm(g, lb->gemm, lb->mgs);
    AgTensor *dg = t2(g, lb->dt, lb->rows, lb->in); /* dgrad */
    if (lb->gather) {
        /* reduce-scatter of the dgrad into a new [rows / tp, in] */
        AgTensor *d2 = t2(g, lb->dt, lb->rows / lb->tp, lb->in);
        gt_unref(g, dg);
        dg = d2;
    }
    bool deferred = lb->defer >= 0 && lb->mgs &&
                    (lb->defer == 0 || (int)lb->mgs->defer_grad->len < lb->defer);
    if (deferred) /* grad_output_buffer.append(grad_output): no wgrad GEMM now */
        g_ptr_array_add(lb->mgs->defer_grad, gt_ref(gin[0]));
    if (n->next[1].node) /* wgrad */
        gout[1] = lb->fused_wgrad || deferred ? dummy_wgrad(g, lb->mgs, n->in_meta[1])
                                  : gt_empty(g, n->in_meta[1]->dt, n->in_meta[1]->nd,
                                             n->in_meta[1]->shape);
    if (n->n_next > 2 && n->next[2].node) /* the bias: fused into the GEMM (TE) or summed */
        gout[2] = gt_empty(g, n->in_meta[2]->dt, n->in_meta[2]->nd, n->in_meta[2]->shape);
    gt_unref(g, gath);
    if (lb->ln) {
        /* tex.layernorm_bwd: dx, dgamma, dbeta; the dgrad then dies */
        if (n->next[0].node)
            gout[0] = gt_empty(g, n->in_meta[0]->dt, n->in_meta[0]->nd, n->in_meta[0]->shape);
        for (int i = 3; i < n->n_next; i++)
            if (n->next[i].node)
                gout[i] = gt_empty(g, n->in_meta[i]->dt, n->in_meta[i]->nd, n->in_meta[i]->shape);
        gt_unref(g, dg);
    } else if (n->next[0].node) {
        gout[0] = dg;
    } else {
        gt_unref(g, dg);
    }
    gg_host_module(g, "host:linear backward", ops0,
                   lb->gemm == GEMM_TE ? TE_MODULE_US : MG_LINEAR_US);
}

/* A linear on x [rows, in]: Megatron's (local spec, and the output layer of both specs) or
 * TE's. Column-parallel under sequence parallelism all-gathers its input: into the global
 * buffer (Megatron) or a new tensor freed after the GEMM (TE); it saves the local input either
 * way. Row-parallel reduce-scatters (sequence parallel) or all-reduces its output. The bias is
 * added inside (TE's GEMM epilogue), by a separate `output + bias` (Megatron), or returned for
 * a fused op (add_bias false). A TE LayerNormLinear (ln_w given) normalises x first: it saves
 * x, the local norm output and fp32 statistics. */
static AgTensor *linear(St *st, Lin *l, AgTensor *x, bool column, bool add_bias, bool te,
                        AgTensor *ln_w, AgTensor *ln_b)
{
    Model *md = st->md;
    AgGraph *g = md->g;
    const MgOptions *o = st->o;
    uint64_t ops0 = gg_op_count(g);
    int64_t rows = gt_numel(x) / l->in;
    bool gather = md->sp && column;
    AgTensor *lnout = NULL, *mu = NULL, *rs = NULL;
    if (ln_w) {
        gg_op(g, o->rms_norm ? "te_rmsnorm_fwd" : "te_layernorm_fwd");
        mu = o->rms_norm ? NULL : gt_empty(g, DT_F32, SHAPE(rows));
        rs = gt_empty(g, DT_F32, SHAPE(rows));
        lnout = t2(g, st->adt, rows, l->in);
    }
    AgTensor *gin = lnout ? lnout : x;
    AgTensor *gathered = NULL;
    if (gather) {
        uint64_t nb = (uint64_t)gt_nbytes(gin) * (uint64_t)md->tp;
        if (te)
            gathered = t2(g, st->adt, rows * md->tp, l->in);
        else
            mpu_buffer(st, (int64_t)nb);
        gg_collective(g, MEMSIM_COLL_ALL_GATHER, nb, 1, nn_tp_us(md, MEMSIM_COLL_ALL_GATHER, nb));
        rows *= md->tp;
    }
    GemmKind gk = te ? GEMM_TE : GEMM_TORCH;
    gemm(g, gk, st->mgs);
    gg_flops_tiles(g, 2.0 * (double)rows * (double)l->in * (double)l->out, 1, (double)rows,
                   (double)l->out);
    bool bias_in_gemm = te && add_bias && l->b;
    AgTensor *out = t2(g, st->adt, rows, l->out);
    gt_unref(g, gathered);
    if (gg_needs_grad(g, 2, (AgTensor *[]){x, l->w})) {
        AgNode *n = gn_new(g, ln_w ? "_LayerNormLinearBackward"
                           : te    ? "_LinearBackward"
                                   : "LinearWithGradAccumulationAndAsyncCommunicationBackward",
                           bw_linear, 1);
        gn_add_input(g, n, x);
        gn_add_input(g, n, l->w);
        if (bias_in_gemm || ln_w)
            gn_add_input(g, n, bias_in_gemm ? l->b : NULL);
        if (ln_w) {
            gn_add_input(g, n, ln_w);
            if (ln_b)
                gn_add_input(g, n, ln_b);
        }
        gn_save(g, n, x);
        gn_save(g, n, l->w);
        if (lnout) {
            gn_save(g, n, lnout);
            gn_save(g, n, rs);
            if (mu)
                gn_save(g, n, mu);
        }
        LinBw *lb = g_new(LinBw, 1);
        *lb = (LinBw){.gemm = gk, .mgs = st->mgs, .fused_wgrad = o->grad_accum_fusion,
                      .gather = gather, .gather_mpu = !te, .ln = ln_w != NULL, .tp = md->tp,
                      .rows = rows, .in = l->in, .dt = st->adt, .defer = -1};
        if (!column || te || ln_w || !st->output_layer || !o->defer_embedding_wgrad)
            ; /* only the output layer defers */
        else
            lb->defer = o->wgrad_deferral_limit;
        n->extra = lb;
        n->extra_free = g_free;
        gn_set_output(n, out, 0);
    }
    gt_unref(g, lnout);
    gt_unref(g, mu);
    gt_unref(g, rs);
    if (md->sp && !column) {
        /* reduce_scatter_to_sequence_parallel_region: a new [rows / tp, out] */
        AgTensor *r = t2(g, st->adt, rows / md->tp, l->out);
        gg_collective(g, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)gt_nbytes(out), 1,
                      nn_tp_us(md, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)gt_nbytes(out)));
        fn_record(g, "_ReduceScatterToSequenceParallelRegionBackward", &out, 1, NULL, 0, r, NULL);
        U(out);
        out = r;
        rows /= md->tp;
    } else if (!column && md->tp > 1) {
        gg_collective(g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(out), 1,
                      nn_tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(out)));
    }
    if (add_bias && l->b && !bias_in_gemm) {
        AgTensor *r = t2(g, st->adt, rows, l->out);
        gg_op(g, "add");
        AgTensor *ins3[2] = {out, l->b};
        fn_record(g, "AddBackward0", ins3, 2, NULL, 0, r, &(FnBw){.pass = PASS(0)});
        U(out);
        out = r;
    }
    gg_host_module(g, "host:linear forward", ops0, te ? TE_MODULE_US : MG_LINEAR_US);
    return out;
}

/* Megatron's fused LayerNorm or RMSNorm (apex FusedLayerNormAffineFunction; TE's LayerNorm op
 * for the final norm): saves the input, the weight(s) and fp32 statistics per token. */
static AgTensor *norm(St *st, AgTensor *x, AgTensor *w, AgTensor *bias)
{
    AgGraph *g = st->md->g;
    int64_t n = gt_numel(x) / x->shape[x->nd - 1];
    gg_op(g, st->o->rms_norm ? "fused_rms_norm" : "fused_layer_norm");
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    AgTensor *mu = st->o->rms_norm ? NULL : gt_empty(g, DT_F32, SHAPE(n));
    AgTensor *rs = gt_empty(g, DT_F32, SHAPE(n));
    AgTensor *in[3] = {x, w, bias};
    AgTensor *sv[4] = {x, w, rs, mu};
    fn_record(g, st->o->rms_norm ? "FusedRMSNormAffineFunctionBackward"
                                 : "FusedLayerNormAffineFunctionBackward",
              in, bias ? 3 : 2, sv, 4, out, NULL);
    gt_unref(g, mu);
    gt_unref(g, rs);
    return out;
}

/* bias-dropout-add (megatron/core/fusions/fused_bias_dropout.py): residual + dropout(x + bias);
 * the compiled train function saves the dropout mask (bool) and makes one output. */
static AgTensor *bda(St *st, AgTensor *x, AgTensor *bias, AgTensor *residual, double p)
{
    AgGraph *g = st->md->g;
    gg_op(g, "bias_dropout_add_fused_train");
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    AgTensor *mask = p > 0 ? gt_empty(g, DT_BOOL, x->nd, x->shape) : NULL;
    AgTensor *in[3] = {residual, x, bias};
    AgTensor *sv[1] = {mask};
    fn_record(g, "BiasDropoutAddBackward", in, bias ? 3 : 2, sv, 1, out,
              &(FnBw){.pass = PASS(0) | (p > 0 ? 0 : PASS(1))});
    gt_unref(g, mask);
    return out;
}

/* The unfused attention (Megatron's local DotProductAttention, TE's UnfusedDotProductAttention):
 * the scores by baddbmm into [b·np, s, s], the fused scale-mask-softmax (saved, backward in
 * place), dropout, bmm with v, the context permuted into a contiguous [N, np·hd]. */
static AgTensor *attn_unfused(St *st, AgTensor *q, AgTensor *k, AgTensor *v, bool local)
{
    Model *md = st->md;
    AgGraph *g = md->g;
    int64_t s = st->s, b = st->b, np = st->np, hd = st->hd, S = st->s * st->cp;
    double pdrop = md->m->attn_pdrop;
    int64_t sc_n = b * np * s * S;
    AgTensor *mres = NULL, *fullmask = NULL;
    if (local) {
        mpu_buffer(st, sc_n * dt_size(st->adt)); /* baddbmm's input: the global buffer */
    } else {
        /* get_full_mask: the causal mask OR'ed with the data loader's, [b, 1, s, S] bool; the
         * baddbmm input a fresh torch.empty */
        gg_op(g, "get_full_mask");
        fullmask = gt_empty(g, DT_BOOL, SHAPE(b, 1, s, S));
        mres = gt_empty(g, st->adt, SHAPE(b * np, s, S));
    }
    gg_op(g, "baddbmm");
    gg_gemm(g);
    gg_flops(g, 2.0 * (double)sc_n * hd);
    AgTensor *sc = gt_empty(g, st->adt, SHAPE(b * np, s, S));
    gt_unref(g, mres);
    AgTensor *in1[2] = {q, k};
    fn_record(g, "BaddbmmBackward0", in1, 2, in1, 2, sc, &(FnBw){.gemm = GEMM_TORCH});
    gg_op(g, local ? "scaled_upper_triang_masked_softmax" : "scaled_masked_softmax");
    AgTensor *pr = gt_empty(g, st->adt, SHAPE(b * np, s, S));
    AgTensor *sv2[1] = {pr};
    fn_record(g, "ScaledMaskedSoftmaxBackward", &sc, 1, sv2, 1, pr,
              &(FnBw){.grad_in_place = true});
    U(sc);
    gt_unref(g, fullmask);
    AgTensor *pd = op_dropout(g, pr, pdrop);
    U(pr);
    gg_op(g, "bmm");
    gg_gemm(g);
    gg_flops(g, 2.0 * (double)sc_n * hd);
    AgTensor *ctx = gt_empty(g, st->adt, SHAPE(b * np, s, hd));
    AgTensor *in3[2] = {pd, v};
    fn_record(g, "BmmBackward0", in3, 2, in3, 2, ctx, &(FnBw){.gemm = GEMM_TORCH});
    U(pd);
    /* permute to [s, b, np, hd], contiguous */
    AgTensor *out = t2(g, st->adt, st->N, np * hd);
    fn_record(g, "CloneBackward0", &ctx, 1, NULL, 0, out, &(FnBw){.pass = PASS(0)});
    U(ctx);
    return out;
}

/* Context parallelism, TE's p2p ring (context_parallel.py AttnFuncWithCPAndKVP2P): contiguous
 * q, k, v; K and V packed into a send buffer and a receive buffer; one attention per step, the
 * outputs merged in fp32; saved: q, the last K/V buffer, the output and fp32 softmax_lse. */
static AgTensor *attn_cp(St *st, AgTensor *q, AgTensor *k, AgTensor *v)
{
    Model *md = st->md;
    AgGraph *g = md->g;
    int64_t s = st->s, b = st->b, np = st->np, ng = st->ng, hd = st->hd;
    int64_t qn = s * b * np * hd, kvn = 2 * s * b * ng * hd;
    gg_op(g, "attn_forward_func_with_cp");
    AgTensor *qc = gt_empty(g, st->adt, SHAPE(qn));
    AgTensor *kc = gt_empty(g, st->adt, SHAPE(kvn / 2)), *vc = gt_empty(g, st->adt, SHAPE(kvn / 2));
    AgTensor *kv0 = gt_empty(g, st->adt, SHAPE(kvn));
    U(kc);
    U(vc);
    AgTensor *kv1 = gt_empty(g, st->adt, SHAPE(kvn));
    gg_collective(g, MEMSIM_COLL_SEND, (uint64_t)kvn * 2, 1, 0.0);
    AgTensor *o0 = gt_empty(g, st->adt, SHAPE(qn));
    AgTensor *l0 = gt_empty(g, DT_F32, SHAPE(b * np * s));
    AgTensor *o1 = gt_empty(g, st->adt, SHAPE(qn));
    AgTensor *l1 = gt_empty(g, DT_F32, SHAPE(b * np * s));
    AgTensor *lse = gt_empty(g, DT_F32, SHAPE(b * np * s));
    AgTensor *o32 = gt_empty(g, DT_F32, SHAPE(qn));
    AgTensor *out = t2(g, st->adt, st->N, np * hd);
    U(o32);
    U(o0);
    U(o1);
    U(l0);
    U(l1);
    U(kv0);
    AgTensor *in[3] = {q, k, v};
    AgTensor *sv[4] = {qc, kv1, out, lse};
    /* backward: dq, and two [2, K/V] buffers for the ring (kv and dkv) */
    fn_record(g, "AttnFuncWithCPAndKVP2PBackward", in, 3, sv, 4, out,
              &(FnBw){.n_tmp = 2, .tmp_dt = {st->adt, st->adt}, .tmp_n = {2 * kvn, 2 * kvn},
                      .host_us = TE_MODULE_US});
    U(qc);
    U(kv1);
    U(lse);
    return out;
}

static AgTensor *core_attention_ops(St *st, AgTensor *q, AgTensor *k, AgTensor *v);

/* Core attention on q [s, b, np, hd], k and v [s, b, ng, hd]; returns the context [N, np·hd].
 * TE's DotProductAttention is a TE module (its host time per call, TE_MODULE_US). */
static AgTensor *core_attention(St *st, AgTensor *q, AgTensor *k, AgTensor *v)
{
    uint64_t ops0 = gg_op_count(st->md->g);
    AgTensor *out = core_attention_ops(st, q, k, v);
    if (st->te)
        gg_host_module(st->md->g, "host:attention forward", ops0, TE_MODULE_US);
    return out;
}

static AgTensor *core_attention_ops(St *st, AgTensor *q, AgTensor *k, AgTensor *v)
{
    Model *md = st->md;
    AgGraph *g = md->g;
    int64_t s = st->s, b = st->b, np = st->np, ng = st->ng, hd = st->hd, S = s * st->cp;
    if (st->attn == MG_ATTN_LOCAL || st->attn == MG_ATTN_UNFUSED)
        return attn_unfused(st, q, k, v, st->attn == MG_ATTN_LOCAL);
    if (st->cp > 1)
        return attn_cp(st, q, k, v);
    gg_flops(g, 2.0 * (double)(b * np) * s * S * hd);
    if (st->attn == MG_ATTN_FLASH) {
        /* FlashAttention-2 through TE (backends.py FlashAttention): q, k, v transposed to bshd
         * copies; FlashAttnFunc saves them with its output and fp32 softmax_lse [b, np, s]; the
         * output copied back to sbhd */
        gg_op(g, "flash_attn_forward");
        AgTensor *qt = gt_empty(g, st->adt, SHAPE(b, s, np, hd));
        AgTensor *kt = gt_empty(g, st->adt, SHAPE(b, s, ng, hd));
        AgTensor *vt = gt_empty(g, st->adt, SHAPE(b, s, ng, hd));
        AgTensor *fo = gt_empty(g, st->adt, SHAPE(b, s, np, hd));
        AgTensor *lse = gt_empty(g, DT_F32, SHAPE(b, np, s));
        AgTensor *in[3] = {q, k, v};
        AgTensor *sv[5] = {qt, kt, vt, fo, lse};
        fn_record(g, "FlashAttnFuncBackward", in, 3, sv, 5, fo,
                  &(FnBw){.n_tmp = 2, .tmp_dt = {DT_F32, DT_F32},
                          .tmp_n = {b * np * ((s + 127) / 128 * 128),
                                    b * ((s + 127) / 128 * 128) * np * ((hd + 31) / 32 * 32)},
                          .host_us = TE_MODULE_US});
        U(qt);
        U(kt);
        U(vt);
        U(lse);
        AgTensor *out = t2(g, st->adt, st->N, np * hd);
        fn_record(g, "CloneBackward0", &fo, 1, NULL, 0, out, &(FnBw){.pass = PASS(0)});
        U(fo);
        return out;
    }
    /* cuDNN fused attention (TE FusedAttnFunc; the default on Hopper): the output, fp32 softmax
     * statistics [b, np, s, 1] and the RNG state saved with q, k, v */
    gg_op(g, "fused_attn_fwd");
    AgTensor *out = t2(g, st->adt, st->N, np * hd);
    AgTensor *stats = gt_empty(g, DT_F32, SHAPE(b, np, s, 1));
    AgTensor *rng = gt_empty(g, DT_I64, SHAPE(2));
    AgTensor *in[3] = {q, k, v};
    AgTensor *sv[5] = {q, k, v, out, stats};
    fn_record(g, "FusedAttnFuncBackward", in, 3, sv, 5, out, &(FnBw){.host_us = TE_MODULE_US});
    U(stats);
    U(rng);
    return out;
}

/* Rotary embedding on [s, b, heads, hd]: the fused kernel (TE) saves only the cached
 * frequencies; a new contiguous tensor. */
static AgTensor *rope(St *st, AgTensor *x)
{
    AgGraph *g = st->md->g;
    gg_op(g, "fused_apply_rotary_pos_emb");
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    AgTensor *sv[1] = {st->freqs};
    fn_record(g, "FusedRoPEFuncBackward", &x, 1, sv, 1, out, NULL);
    return out;
}

/* TE's fused/flash attention with RoPE takes q, k, v as separate contiguous tensors: v copied. */
static AgTensor *contiguous_copy(St *st, AgTensor *x)
{
    AgGraph *g = st->md->g;
    gg_op(g, "contiguous");
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    fn_record(g, "CloneBackward0", &x, 1, NULL, 0, out, &(FnBw){.pass = PASS(0)});
    return out;
}

typedef struct {
    Model *md;
    int layer;
} MgLayerArg;

/* A recomputed region's closure: the stage's state copied (the forward that made it has
 * returned by the time backward reruns it), with references to the mask and frequencies. */
typedef struct {
    St st;
    int64_t l0, l1;
} Region;

static void region_free(AgGraph *g, void *user)
{
    Region *r = user;
    gt_unref(g, r->st.mask);
    gt_unref(g, r->st.freqs);
    g_free(r);
}

static Region *region_new(const St *st, int64_t l0, int64_t l1)
{
    Region *r = g_new(Region, 1);
    r->st = *st;
    gt_ref(r->st.mask);
    gt_ref(r->st.freqs);
    r->l0 = l0;
    r->l1 = l1;
    return r;
}

static AgTensor *layer(AgGraph *g, void *user, AgTensor **inp, int nin);

/* Layers [l0, l1) under full recompute (tensor_parallel.checkpoint in
 * transformer_block.py _checkpointed_forward): only the group's input is kept. */
static AgTensor *layers_region(AgGraph *g, void *user, AgTensor **inp, int nin)
{
    Region *r = user;
    Model *md = r->st.md;
    void *outer = md->mg_stage;
    md->mg_stage = &r->st;
    AgContext *c = gg_ctx(g);
    int32_t old = c->layer;
    AgTensor *x = gt_ref(inp[0]);
    (void)nin;
    for (int64_t l = r->l0; l < r->l1; l++) {
        MgLayerArg la = {md, (int)l};
        c->layer = (int32_t)l;
        AgTensor *y = layer(g, &la, &x, 1);
        gt_unref(g, x);
        x = y;
    }
    c->layer = old;
    md->mg_stage = outer;
    return x;
}

static AgTensor *core_attention(St *st, AgTensor *q, AgTensor *k, AgTensor *v);

/* Selective recompute of the core attention (--recompute-granularity selective, the default
 * module core_attn: attention.py _checkpointed_attention_forward): q, k, v kept. */
static AgTensor *attn_region(AgGraph *g, void *user, AgTensor **inp, int nin)
{
    Region *r = user;
    Model *md = r->st.md;
    void *outer = md->mg_stage;
    md->mg_stage = &r->st;
    (void)nin;
    (void)g;
    AgTensor *out = core_attention(&r->st, inp[0], inp[1], inp[2]);
    md->mg_stage = outer;
    return out;
}

/* --test-mode with --qk-layernorm: Attention.run_realtime_tests (transformer/attention.py),
 * run by get_query_key_value_tensors in every forward: the four q/k norm parameters stacked,
 * all-gathered over the data-parallel group, then over the tensor-parallel group; for each
 * rank's copy an unbind and, per parameter, `assert torch.all(src == tgt)` (eq, all, and the
 * bool the assert reads: a host synchronization). Its 1-element-sized tensors are not
 * allocated here (the launch's warning says so). */
static void realtime_tests(St *st)
{
    Model *md = st->md;
    AgGraph *g = md->g;
    int dp = st->mgs && st->mgs->dp > 0 ? st->mgs->dp : 1;
    uint64_t bytes = (uint64_t)(4 * st->hd * dt_size(st->adt));
    gg_op(g, "stack");
    for (int grp = 0; grp < 2; grp++) {
        int n = grp == 0 ? dp : md->tp;
        for (int r = 0; r < n; r++)
            gg_op(g, "empty_like");
        gg_collective(g, MEMSIM_COLL_ALL_GATHER, bytes * (uint64_t)n, grp == 0 ? 3 : 1,
                      grp == 0 ? (st->mgs ? comm_link_us(st->mgs->dp_cost, MEMSIM_COLL_ALL_GATHER,
                                                         bytes * (uint64_t)n, n)
                                          : 0.0)
                               : nn_tp_us(md, MEMSIM_COLL_ALL_GATHER, bytes * (uint64_t)n));
        for (int r = 0; r < n; r++) {
            gg_op(g, "unbind");
            for (int k = 0; k < 4; k++) {
                gg_op(g, "eq");
                gg_op(g, "all");
                gg_op(g, "_local_scalar_dense");
                gg_host_wait(g, gg_ctx(g)->stream);
            }
        }
    }
}

static AgTensor *layer(AgGraph *g, void *user, AgTensor **inp, int nin)
{
    MgLayerArg *la = user;
    Model *md = la->md;
    St *st = md->mg_stage;
    const MgOptions *o = st->o;
    Layer *ly = &md->layers[la->layer];
    double pd = md->m->resid_pdrop;
    bool te = st->te;
    AgTensor *x = inp[0];
    (void)nin;
    /* attention: [LayerNorm +] QKV */
    AgTensor *qkv;
    if (te) {
        qkv = linear(st, &ly->qkv, x, true, true, true, ly->ln1_w, ly->ln1_b);
    } else {
        AgTensor *h1 = norm(st, x, ly->ln1_w, ly->ln1_b);
        qkv = linear(st, &ly->qkv, h1, true, true, false, NULL, NULL);
        U(h1);
    }
    int64_t s = st->s, b = st->b, np = st->np, ng = st->ng, hd = st->hd;
    AgTensor *q, *k, *v;
    split_qkv(md, qkv, s, b, np, ng, hd, &q, &k, &v);
    if (o->qk_norm) {
        AgTensor *qn = norm(st, q, ly->qn_w, ly->qn_b);
        AgTensor *kn = norm(st, k, ly->kn_w, ly->kn_b);
        U(q);
        U(k);
        q = qn;
        k = kn;
        if (o->test_mode)
            realtime_tests(st);
    }
    if (o->pos == MG_POS_ROPE) {
        AgTensor *qr = rope(st, q), *kr = rope(st, k);
        U(q);
        U(k);
        q = qr;
        k = kr;
    }
    if (te && st->attn != MG_ATTN_UNFUSED && (o->pos == MG_POS_ROPE || o->qk_norm)) {
        AgTensor *vc = contiguous_copy(st, v);
        U(v);
        v = vc;
    }
    U(qkv);
    AgTensor *ctx;
    if (o->recompute == MG_RECOMPUTE_SELECTIVE && gg_ctx(g)->grad_enabled && !gg_ctx(g)->ckpt) {
        AgTensor *qkv3[3] = {q, k, v};
        ctx = gg_checkpoint(g, attn_region, region_new(st, 0, 0), region_free, qkv3, 3);
    } else {
        ctx = core_attention(st, q, k, v);
    }
    U(q);
    U(k);
    U(v);
    AgTensor *pr = linear(st, &ly->o, ctx, false, false, te, NULL, NULL);
    U(ctx);
    AgTensor *x1 = bda(st, pr, ly->o.b, x, pd);
    U(pr);
    /* MLP: [LayerNorm +] fc1, the fused bias-activation, fc2 */
    bool fuse_bias = o->swiglu || o->bias_gelu_fusion;
    AgTensor *f1;
    if (te) {
        f1 = linear(st, &ly->up, x1, true, !fuse_bias, true, ly->ln2_w, ly->ln2_b);
    } else {
        AgTensor *h2 = norm(st, x1, ly->ln2_w, ly->ln2_b);
        f1 = linear(st, &ly->up, h2, true, !fuse_bias, false, NULL, NULL);
        U(h2);
    }
    int64_t I = st->ffn;
    gg_op(g, o->swiglu ? "bias_swiglu" : "bias_gelu");
    AgTensor *act = t2(g, st->adt, gt_numel(f1) / (o->swiglu ? 2 * I : I), I);
    AgTensor *ain[2] = {f1, fuse_bias ? ly->up.b : NULL};
    fn_record(g, o->swiglu ? "BiasSwiGLUFunctionBackward" : "GeLUFunctionBackward", ain,
              ain[1] ? 2 : 1, ain, 2, act, NULL);
    U(f1);
    AgTensor *f2 = linear(st, &ly->down, act, false, false, te, NULL, NULL);
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
    if (st->o->ce_fusion) {
        /* --cross-entropy-loss-fusion: the same steps compiled (fused_cross_entropy.py,
         * jit_fuser = torch.compile); the in-place subtract and exp on the fp32 logits, a graph
         * input, are functionalised: computed into a new [N, V] fp32 buffer, then copied back */
        AgTensor *fx = t2(g, DT_F32, N, V);
        U(fx);
    }
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
    St st = {.md = md, .o = o, .mgs = md->mgs, .b = md->B, .h = m->H, .np = m->nh, .ng = m->nkv,
             .hd = m->hd, .ffn = m->I, .adt = md->adt};
    st.te = o->impl == MG_IMPL_TE;
    st.attn = mg_attention_run(o);
    st.cp = o->cp > 1 ? o->cp : 1;
    st.s = md->S / st.cp;
    st.N = st.s * st.b;
    st.Nr = md->sp ? st.N / md->tp : st.N;
    md->mg_stage = &st;
    c->layer = -1;
    int64_t s = st.s, b = st.b, H = st.h;
    if (o->pos == MG_POS_ROPE && !md->mgs->freqs) {
        /* the rotary frequencies, computed once and cached (lru_cache on
         * RotaryEmbedding.forward): fp32 [s, 1, 1, hd] */
        uint8_t cat = c->category;
        c->category = MEMSIM_CAT_OTHER;
        md->mgs->freqs = op_new(g, "rotary_pos_emb", DT_F32, SHAPE(st.s, 1, 1, st.hd));
        c->category = cat;
    }
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
        st.mask = gg_leaf(g, DT_BOOL, SHAPE(b, 1, s, s * st.cp), false, MEMSIM_CAT_INPUT);
    if (o->pos == MG_POS_ROPE)
        st.freqs = gt_ref(md->mgs->freqs);
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
    bool full = o->recompute == MG_RECOMPUTE_FULL && c->grad_enabled;
    int64_t rn = o->recompute_layers > 0 ? o->recompute_layers : 1;
    for (int64_t l = md->l0; l < md->l1;) {
        c->layer = (int32_t)l;
        la.layer = (int)l;
        AgTensor *y;
        int64_t next = l + 1;
        if (full && o->recompute_method == MG_RECOMPUTE_UNIFORM) {
            /* groups of recompute_num_layers layers, each checkpointed */
            next = l + rn < md->l1 ? l + rn : md->l1;
            y = gg_checkpoint(g, layers_region, region_new(&st, l, next), region_free, &x, 1);
        } else if (full && l - md->l0 < rn) {
            /* block: the chunk's first recompute_num_layers layers, one by one */
            y = gg_checkpoint(g, layers_region, region_new(&st, l, next), region_free, &x, 1);
        } else {
            y = layer(g, &la, &x, 1);
        }
        U(x);
        x = y;
        l = next;
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
    if (o->defer_embedding_wgrad && md->mgs->defer_in &&
        (o->wgrad_deferral_limit == 0 ||
         (int)md->mgs->defer_in->len < o->wgrad_deferral_limit))
        g_ptr_array_add(md->mgs->defer_in, gt_ref(hf)); /* embedding_activation_buffer */
    st.output_layer = true;
    AgTensor *logits = linear(&st, &head, hf, true, false, false, NULL, NULL);
    st.output_layer = false;
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
