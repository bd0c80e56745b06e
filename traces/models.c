/* The model families (traces/models.h), written after the Hugging Face modeling files as
 * HF_MODELS.md §2–3 describes them: the same ops in the same order, and Python variables
 * dropped where the Python code drops them. Dimension letters: B batch, S sequence, H
 * hidden, V vocabulary, I MLP width, nh / nkv heads, hd head dim.
 */
#include "traces/hf_versions.h"
#include "traces/layers.h"

#include <math.h>
#include <string.h>

#define U(x) gt_unref(md->g, (x))

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
    gt_unref(g, la->own.mask_sw);
    gt_unref(g, la->own.cos4);
    gt_unref(g, la->own.sin4);
    gt_unref(g, la->own.cos4_sw);
    gt_unref(g, la->own.sin4_sw);
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
    AgTensor *qp = nn_lin(md, &ly->q, x), *kp = nn_lin(md, &ly->k, x), *vp = nn_lin(md, &ly->v, x);
    AgTensor *q = split_heads(md, qp, m->nh), *k = split_heads(md, kp, m->nkv);
    AgTensor *v = split_heads(md, vp, m->nkv);
    U(qp);
    U(kp);
    U(vp);
    AgTensor *cos4, *sin4;
    nn_rope_tables(md, f, &cos4, &sin4);
    AgTensor *qe = nn_apply_rope(md, q, cos4, sin4);
    AgTensor *ke = nn_apply_rope(md, k, cos4, sin4);
    U(cos4);
    U(sin4);
    U(q);
    U(k);
    nn_cache_update(md, &ke, &v);
    Fwd fa = *f;
    AgTensor *cm = NULL;
    if (f->mask_indexed) {
        /* Transformers 4.38 (traces/hf_versions.c causal-mask-max-pos), LlamaSdpaAttention and
         * LlamaAttention: causal_mask = attention_mask[:, :, cache_position, :kv_len], an
         * advanced-indexing copy of the model's (B,1,P,P) mask */
        cm = op_new(md->g, "index", f->mask->dt, SHAPE(md->B, 1, md->S, ke->shape[2]));
        fa.mask = cm;
        fa.mask_indexed = false;
    }
    AgTensor *o = nn_attention(md, &fa, qe, ke, v, true);
    U(cm);
    U(qe);
    U(ke);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *out = nn_lin(md, &ly->o, om);
    U(om);
    return out;
}

static AgTensor *llama_mlp(Model *md, Layer *ly, AgTensor *x)
{
    AgTensor *gt = nn_lin(md, &ly->gate, x);
    AgTensor *a = nn_act(md, gt);
    U(gt);
    AgTensor *up = nn_lin(md, &ly->up, x);
    AgTensor *h = op_binary(md->g, BIN_MUL, a, up);
    U(a);
    U(up);
    AgTensor *out = nn_lin(md, &ly->down, h);
    U(h);
    return out;
}

/* The token rows expert e takes of the T·k slots under the run's routing assumption
 * (MemsimRun.moe_imbalance, f). MixtralSparseMoeBlock.forward runs each expert hit, in index
 * order, on the rows torch.where(expert_mask[expert_idx]) selects, so its gathered input,
 * gate, up, product and output are [n_e, ·] and what its backward saves scales with n_e.
 * Uniform (f = 1): T·k / E rows each, the remainder one row more to the first experts. Under
 * f > 1 the most-loaded expert takes min(T, ⌈f · T·k / E⌉) rows (a token meets an expert at
 * most once: top-k picks k distinct experts) and the other E - 1 share the rest evenly, the
 * first ones one row more (never more than T: at most the uniform share). The most-loaded
 * expert is put last in the loop, where its buffers meet the most of the others' saved
 * activations: its forward runs after theirs, and its backward first (the output's
 * index_add_ chain is unwound from the last expert), while theirs are all still held. */
int64_t model_expert_rows(int64_t T, int64_t K, int64_t E, double f, int64_t e)
{
    int64_t slots = T * K;
    if (f <= 1 || E == 1)
        return slots / E + (e < slots % E ? 1 : 0);
    int64_t hot = MAX((slots + E - 1) / E, (int64_t)ceil(f * (double)slots / (double)E));
    hot = MIN(hot, MIN(T, slots));
    if (e == E - 1)
        return hot;
    int64_t rest = slots - hot, others = E - 1;
    return rest / others + (e < rest % others ? 1 : 0);
}

/* Mixtral's sparse MoE block (HF_MODELS.md §3.9), eager experts, each on its rows of the
 * token slots (model_expert_rows: uniform unless --moe-imbalance). */
static AgTensor *moe_mlp(Model *md, Layer *ly, AgTensor *x)
{
    AgGraph *g = md->g;
    const MemsimModel *m = md->m;
    int64_t T = md->B * md->S, E = m->n_experts, K = m->top_k, H = m->H;
    AgTensor *x2 = op_view(g, x, SHAPE(T, H));
    Lin rl = {.w = ly->router, .out = E, .in = H};
    AgTensor *logits = nn_lin(md, &rl, x2);
    AgTensor *l32 = op_to(g, logits, DT_F32);
    AgTensor *probs = op_softmax(g, l32, DT_F32);
    U(l32);
    AgTensor *topv = op_topk(g, probs, K);
    U(probs);
    AgTensor *ssum = op_new(g, "sum", DT_F32, SHAPE(T, 1)); /* values /= sum, in place */
    U(ssum);
    AgTensor *wflat = op_view(g, topv, SHAPE(T * K, 1));
    U(topv);
    AgTensor *outs[64];
    int nout = 0;
    g_assert(E <= 64);
    for (int64_t e = 0; e < E; e++) {
        int64_t ne = model_expert_rows(T, K, E, md->run->moe_imbalance, e);
        if (ne == 0)
            continue;
        AgTensor *xe = op_gather_rows(g, x2, ne);
        AgTensor *gte = nn_lin(md, &ly->experts[3 * e], xe);
        AgTensor *a = nn_act(md, gte);
        U(gte);
        AgTensor *up = nn_lin(md, &ly->experts[3 * e + 1], xe);
        AgTensor *h = op_binary(g, BIN_MUL, a, up);
        U(a);
        U(up);
        AgTensor *y = nn_lin(md, &ly->experts[3 * e + 2], h);
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
    /* a sliding-window layer attends through its own mask (create_sliding_window_causal_mask) */
    Fwd lf = *la->f;
    if (lf.mask_sw && model_layer_is_sliding(md->m, la->layer))
        lf.mask = lf.mask_sw;
    /* Gemma3DecoderLayer: position_embeddings_local for a sliding layer */
    if (lf.cos4_sw && model_layer_is_sliding(md->m, la->layer)) {
        lf.cos4 = lf.cos4_sw;
        lf.sin4 = lf.sin4_sw;
    }
    if (fam_modern(md->m))
        return fam_layer(md, &lf, ly, x);
    AgTensor *h = nn_rmsnorm(md, x, ly->ln1_w);
    AgTensor *a = llama_attn(md, &lf, ly, h);
    U(h);
    AgTensor *x1 = op_binary(g, BIN_ADD, x, a);
    U(a);
    AgTensor *h2 = nn_rmsnorm(md, x1, ly->ln2_w);
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
    AgTensor *h = nn_layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qkv = nn_lin(md, &ly->qkv, h);
    U(h);
    AgTensor *parts[3];
    op_split(g, qkv, 2, m->nh * m->hd, parts, 3);
    U(qkv);
    AgTensor *q = split_heads(md, parts[0], m->nh), *k = split_heads(md, parts[1], m->nh);
    AgTensor *v = split_heads(md, parts[2], m->nh);
    for (int i = 0; i < 3; i++)
        U(parts[i]);
    nn_cache_update(md, &k, &v);
    AgTensor *o = nn_attention(md, la->f, q, k, v, true);
    U(q);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = nn_lin(md, &ly->o, om);
    U(om);
    AgTensor *ad = op_dropout(g, ap, m->resid_pdrop);
    U(ap);
    AgTensor *x1 = op_binary(g, BIN_ADD, ad, x);
    U(ad);
    AgTensor *h2 = nn_layernorm(md, x1, ly->ln2_w, ly->ln2_b);
    AgTensor *f1 = nn_lin(md, &ly->up, h2);
    U(h2);
    AgTensor *a = nn_act(md, f1);
    U(f1);
    AgTensor *f2 = nn_lin(md, &ly->down, a);
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
    AgTensor *h = m->pre_ln ? nn_layernorm(md, x, ly->ln1_w, ly->ln1_b) : gt_ref(x);
    AgTensor *qp = nn_lin(md, &ly->q, h);
    AgTensor *qs = op_scalar(g, BIN_MUL, qp); /* q_proj(h) * scaling */
    U(qp);
    AgTensor *kp = nn_lin(md, &ly->k, h), *vp = nn_lin(md, &ly->v, h);
    U(h);
    AgTensor *q = split_heads(md, qs, m->nh), *k = split_heads(md, kp, m->nh);
    AgTensor *v = split_heads(md, vp, m->nh);
    U(qs);
    U(kp);
    U(vp);
    nn_cache_update(md, &k, &v);
    AgTensor *o = nn_attention(md, la->f, q, k, v, true); /* eager: * 1.0 */
    U(q);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = nn_lin(md, &ly->o, om);
    U(om);
    AgTensor *ad = op_dropout(g, ap, m->resid_pdrop);
    U(ap);
    AgTensor *x1 = op_binary(g, BIN_ADD, x, ad);
    U(ad);
    if (!m->pre_ln) {
        AgTensor *t = nn_layernorm(md, x1, ly->ln1_w, ly->ln1_b);
        U(x1);
        x1 = t;
    }
    int64_t T = md->B * md->S;
    AgTensor *x2 = op_reshape(g, x1, SHAPE(T, m->H));
    U(x1);
    AgTensor *h2 = m->pre_ln ? nn_layernorm(md, x2, ly->ln2_w, ly->ln2_b) : gt_ref(x2);
    AgTensor *f1 = nn_lin(md, &ly->up, h2);
    U(h2);
    AgTensor *a = nn_act(md, f1);
    U(f1);
    AgTensor *f2 = nn_lin(md, &ly->down, a);
    U(a);
    AgTensor *fd = op_dropout(g, f2, m->resid_pdrop);
    U(f2);
    AgTensor *s = op_binary(g, BIN_ADD, x2, fd);
    U(fd);
    U(x2);
    if (!m->pre_ln) {
        AgTensor *t = nn_layernorm(md, s, ly->ln2_w, ly->ln2_b);
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
    AgTensor *h = nn_layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qkv = nn_lin(md, &ly->qkv, h);
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
    AgTensor *q = nn_apply_rope_partial(md, p[0], rd, la->f->cos4, la->f->sin4);
    AgTensor *k = nn_apply_rope_partial(md, p[1], rd, la->f->cos4, la->f->sin4);
    U(p[0]);
    U(p[1]);
    AgTensor *v = p[2];
    nn_cache_update(md, &k, &v);
    AgTensor *o = nn_attention(md, la->f, q, k, v, true);
    U(q);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *attn = nn_lin(md, &ly->o, om);
    U(om);
    AgTensor *out;
    if (m->parallel_residual) {
        AgTensor *h2 = nn_layernorm(md, x, ly->ln2_w, ly->ln2_b);
        AgTensor *f1 = nn_lin(md, &ly->up, h2);
        U(h2);
        AgTensor *a = nn_act(md, f1);
        U(f1);
        AgTensor *f2 = nn_lin(md, &ly->down, a);
        U(a);
        AgTensor *s = op_binary(g, BIN_ADD, f2, attn);
        U(f2);
        U(attn);
        out = op_binary(g, BIN_ADD, s, x);
        U(s);
    } else {
        AgTensor *x1 = op_binary(g, BIN_ADD, attn, x);
        U(attn);
        AgTensor *h2 = nn_layernorm(md, x1, ly->ln2_w, ly->ln2_b);
        AgTensor *f1 = nn_lin(md, &ly->up, h2);
        U(h2);
        AgTensor *a = nn_act(md, f1);
        U(f1);
        AgTensor *f2 = nn_lin(md, &ly->down, a);
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
    AgTensor *h = nn_layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qkv = nn_lin(md, &ly->qkv, h);
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
    nn_cache_update(md, &k, &v);
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
    AgTensor *ap = nn_lin(md, &ly->o, om);
    U(om);
    AgTensor *x1 = op_binary(g, BIN_ADD, x, ap);
    U(ap);
    AgTensor *h2 = nn_layernorm(md, x1, ly->ln2_w, ly->ln2_b);
    AgTensor *f1 = nn_lin(md, &ly->up, h2);
    U(h2);
    AgTensor *a = nn_act(md, f1);
    U(f1);
    AgTensor *f2 = nn_lin(md, &ly->down, a);
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
    AgTensor *ha = nn_layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *hm = m->falcon_new_arch ? nn_layernorm(md, x, ly->ln2_w, ly->ln2_b) : gt_ref(ha);
    AgTensor *qkv = nn_lin(md, &ly->qkv, ha);
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
    AgTensor *qe = nn_apply_rope(md, qt, la->f->cos4, la->f->sin4);
    AgTensor *ke = nn_apply_rope(md, kt, la->f->cos4, la->f->sin4);
    U(qt);
    U(kt);
    nn_cache_update(md, &ke, &vt);
    /* a mask is always materialised (§3.6): SDPA cannot use flash; multi-query falls to math */
    Fwd f2 = *la->f;
    AgTensor *o;
    if (nkv == 1 && gg_rules(g)->cuda && md->run->attention != MEMSIM_ATTN_EAGER)
        o = nn_attn_sdpa_math(md, &f2, qe, ke, vt);
    else
        o = nn_attention(md, &f2, qe, ke, vt, true);
    U(qe);
    U(ke);
    U(vt);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = nn_lin(md, &ly->o, om);
    U(om);
    AgTensor *f1 = nn_lin(md, &ly->up, hm);
    U(hm);
    AgTensor *a = nn_act(md, f1);
    U(f1);
    AgTensor *f2o = nn_lin(md, &ly->down, a);
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
    AgTensor *h = nn_layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qp = nn_lin(md, &ly->q, h), *kp = nn_lin(md, &ly->k, h), *vp = nn_lin(md, &ly->v, h);
    U(h);
    AgTensor *q = split_heads(md, qp, m->nh), *k = split_heads(md, kp, m->nh);
    AgTensor *v = split_heads(md, vp, m->nh);
    U(qp);
    U(kp);
    U(vp);
    nn_cache_update(md, &k, &v);
    AgTensor *o = neo_attn_core(md, la->f, q, k, v, false);
    U(q);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = nn_lin(md, &ly->o, om);
    U(om);
    AgTensor *x1 = op_binary(g, BIN_ADD, ap, x);
    U(ap);
    AgTensor *h2 = nn_layernorm(md, x1, ly->ln2_w, ly->ln2_b);
    AgTensor *f1 = nn_lin(md, &ly->up, h2);
    U(h2);
    AgTensor *a = nn_act(md, f1);
    U(f1);
    AgTensor *f2 = nn_lin(md, &ly->down, a);
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
    AgTensor *h = nn_layernorm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *qkv = nn_lin(md, &ly->qkv, h);
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
        AgTensor *rr = nn_apply_rope_partial(md, hidx, rd, cos4, sin4);
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
    nn_cache_update(md, &k, &v);
    AgTensor *o = neo_attn_core(md, la->f, rot[0], k, v, true);
    U(rot[0]);
    U(k);
    U(v);
    AgTensor *om = merge_heads(md, o);
    U(o);
    AgTensor *ap = nn_lin(md, &ly->o, om);
    U(om);
    AgTensor *f1 = nn_lin(md, &ly->up, h);
    U(h);
    AgTensor *a = nn_act(md, f1);
    U(f1);
    AgTensor *f2 = nn_lin(md, &ly->down, a);
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
    return nn_param(md, md->pdt, SHAPE(n), nn_full_ft(md));
}

gboolean model_build(Model *md, AgGraph *g, const MemsimModel *m, const MemsimRun *run,
                     GError **error)
{
    return model_build_part(md, g, m, run, 1, 0, m->L, error);
}

gboolean model_build_part(Model *md, AgGraph *g, const MemsimModel *full, const MemsimRun *run,
                          int tp, int64_t l0, int64_t l1, GError **error)
{
    return model_build_chunk(md, g, full, run, tp, l0, l1, l0 == 0, l1 == full->L, error);
}

gboolean model_build_chunk(Model *md, AgGraph *g, const MemsimModel *full, const MemsimRun *run,
                           int tp, int64_t l0, int64_t l1, bool first, bool last,
                           GError **error)
{
    memset(md, 0, sizeof *md);
    md->g = g;
    md->leaves = g_ptr_array_new();
    md->tp = tp;
    md->l0 = l0;
    md->l1 = l1;
    md->first = first;
    md->last = last;
    md->sp = run->sequence_parallel && tp > 1;
    if (md->sp && full->fam != FAM_GPT2 && full->fam != FAM_LLAMA &&
        full->fam != FAM_MEGATRON) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "sequence-parallel: modelled for the llama and gpt2 families only (not %s)",
                    memsim_model_family(full));
        return FALSE;
    }
    /* tensor parallelism of the Llama-derived families: their experts, latent attention and
     * projection-wide q/k norms are not split here */
    if (fam_modern(full) && tp > 1 &&
        (full->fam == FAM_MIXTRAL || full->kv_lora || full->qk_norm == 2 || md->sp)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "tensor parallelism%s of a %s model is not modelled (its %s)",
                    md->sp ? " with sequence parallelism" : "", memsim_model_family(full),
                    full->fam == FAM_MIXTRAL ? "experts" : full->kv_lora ? "latent attention"
                    : full->qk_norm == 2 ? "q/k norms over the whole projection"
                                         : "layers");
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
        const char *mods = fam_modern(m) ? fam_module_names(m) : module_names(m->fam);
        g_auto(GStrv) known = g_strsplit(mods, ",", -1);
        for (char **t = run->lora_targets; t && *t; t++) {
            if (!g_strv_contains((const char *const *)known, *t)) {
                g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                            "lora-targets: module '%s' does not exist in a %s model (modules: "
                            "%s)",
                            *t, memsim_model_family(m), mods);
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
    if (m->fam == FAM_MEGATRON)
        return mg_build(md, m, l0, l1, error);
    int64_t V = m->V, H = m->H, I = m->I, L = m->L, nh = m->nh, nkv = m->nkv, hd = m->hd;
    int64_t A = nh * hd; /* attention width on this rank (H, or H/tp) */
    bool tr = nn_full_ft(md);
    /* the first stage holds the embedding; with tied weights the last stage holds its own
     * copy for the output layer */
    if (md->first || (md->last && m->tie))
        md->wte = nn_param(md, md->pdt, SHAPE(V, m->fam == FAM_OPT ? m->wep : H), tr);
    if (md->first && (m->fam == FAM_GPT2 || m->fam == FAM_GPTNEO))
        md->wpe = nn_param(md, md->pdt, SHAPE(m->max_pos, H), tr);
    if (md->first && m->fam == FAM_OPT) {
        md->wpe = nn_param(md, md->pdt, SHAPE(m->max_pos + 2, H), tr);
        if (m->wep != H) {
            md->proj_out = nn_param(md, md->pdt, SHAPE(m->wep, H), tr);
            md->proj_in = nn_param(md, md->pdt, SHAPE(H, m->wep), tr);
        }
    }
    if (md->first && m->fam == FAM_BLOOM) {
        md->emb_ln_w = vec(md, H); /* word_embeddings_layernorm */
        md->emb_ln_b = vec(md, H);
    }
    md->layers = g_new0(Layer, L);
    for (int64_t l = l0; l < l1; l++) {
        Layer *ly = &md->layers[l];
        if (fam_modern(m)) {
            fam_build_layer(md, ly, l);
            continue;
        }
        switch (m->fam) {
        case FAM_LLAMA:
        case FAM_MIXTRAL:
            nn_lin_make(md, &ly->q, "q_proj", nh * hd, H, m->qkv_bias, false);
            nn_lin_make(md, &ly->k, "k_proj", nkv * hd, H, m->qkv_bias, false);
            nn_lin_make(md, &ly->v, "v_proj", nkv * hd, H, m->qkv_bias, false);
            nn_lin_make(md, &ly->o, "o_proj", H, nh * hd, m->o_bias, false);
            if (m->fam == FAM_MIXTRAL) {
                ly->router = nn_param(md, md->pdt, SHAPE(m->n_experts, H), tr);
                ly->experts = g_new0(Lin, 3 * m->n_experts);
                for (int64_t e = 0; e < m->n_experts; e++) {
                    nn_lin_make(md, &ly->experts[3 * e], "w1", I, H, false, false);
                    nn_lin_make(md, &ly->experts[3 * e + 1], "w3", I, H, false, false);
                    nn_lin_make(md, &ly->experts[3 * e + 2], "w2", H, I, false, false);
                }
            } else {
                nn_lin_make(md, &ly->gate, "gate_proj", I, H, m->mlp_bias, false);
                nn_lin_make(md, &ly->up, "up_proj", I, H, m->mlp_bias, false);
                nn_lin_make(md, &ly->down, "down_proj", H, I, m->mlp_bias, false);
            }
            ly->ln1_w = vec(md, H);
            ly->ln2_w = vec(md, H);
            break;
        case FAM_GPT2:
            ly->ln1_w = vec(md, H);
            ly->ln1_b = vec(md, H);
            nn_lin_make(md, &ly->qkv, "c_attn", 3 * A, H, true, true);
            nn_lin_make(md, &ly->o, "c_proj", H, A, true, true);
            ly->ln2_w = vec(md, H);
            ly->ln2_b = vec(md, H);
            nn_lin_make(md, &ly->up, "c_fc", I, H, true, true);
            nn_lin_make(md, &ly->down, "c_proj", H, I, true, true);
            break;
        case FAM_OPT:
        case FAM_GPTNEO:
            nn_lin_make(md, &ly->k, "k_proj", A, H, m->qkv_bias, false);
            nn_lin_make(md, &ly->v, "v_proj", A, H, m->qkv_bias, false);
            nn_lin_make(md, &ly->q, "q_proj", A, H, m->qkv_bias, false);
            nn_lin_make(md, &ly->o, "out_proj", H, A, m->o_bias, false);
            ly->ln1_w = vec(md, H);
            ly->ln1_b = vec(md, H);
            nn_lin_make(md, &ly->up, m->fam == FAM_OPT ? "fc1" : "c_fc", I, H, m->mlp_bias, false);
            nn_lin_make(md, &ly->down, m->fam == FAM_OPT ? "fc2" : "c_proj", H, I, m->mlp_bias,
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
            nn_lin_make(md, &ly->qkv, "query_key_value", qkv_out, H, m->qkv_bias, false);
            nn_lin_make(md, &ly->o, "dense", H, A, m->o_bias, false);
            nn_lin_make(md, &ly->up, "dense_h_to_4h", I, H, m->mlp_bias, false);
            nn_lin_make(md, &ly->down, "dense_4h_to_h", H, I, m->mlp_bias, false);
            break;
        }
        case FAM_CODEGEN:
            ly->ln1_w = vec(md, H);
            ly->ln1_b = vec(md, H);
            nn_lin_make(md, &ly->qkv, "qkv_proj", 3 * A, H, false, false);
            nn_lin_make(md, &ly->o, "out_proj", H, A, false, false);
            nn_lin_make(md, &ly->up, "fc_in", I, H, true, false);
            nn_lin_make(md, &ly->down, "fc_out", H, I, true, false);
            /* per-layer sinusoid table nn_buffer, fp32 */
            nn_buffer(md, DT_F32, SHAPE(m->max_pos, m->rotary_dim));
            break;
        default:
            g_assert_not_reached();
        }
        if (m->fam == FAM_GPTNEO) /* per-layer causal bias nn_buffer, bool (max_pos²) */
            nn_buffer(md, DT_BOOL, SHAPE(1, 1, m->max_pos, m->max_pos));
    }
    if (!md->last || (m->fam == FAM_OPT && !m->pre_ln)) {
        /* no final norm here */
    } else {
        md->final_norm = true;
        if (!m->np_norms) /* OlmoModel.norm: an OlmoLayerNorm, without parameters */
            md->norm_w = vec(md, H);
        if ((m->fam != FAM_LLAMA && m->fam != FAM_MIXTRAL) || m->ln_norms)
            md->norm_b = vec(md, H);
    }
    if (md->last && !m->tie)
        md->lm_head = nn_param(md, md->pdt, SHAPE(V, m->fam == FAM_OPT ? m->wep : H), tr);
    if (md->last && m->fam == FAM_CODEGEN)
        md->lm_bias = nn_param(md, md->pdt, SHAPE(V), tr);
    if (tp > 1)
        for (int64_t l = l0; l < l1; l++) {
            Layer *ly = &md->layers[l];
            ly->o.row_parallel = ly->down.row_parallel = true;
        }
    if (m->fam == FAM_LLAMA || m->fam == FAM_MIXTRAL || m->fam == FAM_NEOX ||
        m->fam == FAM_FALCON) {
        int64_t rd = m->fam == FAM_NEOX ? (int64_t)(hd * m->rotary_pct)
                     : fam_modern(m)    ? fam_rotary_dim(m)
                                        : hd;
        md->inv_freq = nn_buffer(md, DT_F32, SHAPE(rd / 2));
        /* Transformers 4.38 (traces/hf_versions.c causal-mask-max-pos): LlamaModel.__init__
         * registers causal_mask = triu(full((P, P), True), 1), P = max_position_embeddings */
        if (md->first && hf_within(run, m, HF_CAUSAL_MASK_MAX_POS))
            nn_buffer(md, DT_BOOL, SHAPE(m->max_pos, m->max_pos));
        if (!gg_rules(g)->v113)
            nn_buffer(md, DT_F32, SHAPE(rd / 2)); /* original_inv_freq clone */
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
                  nn_tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)N * 4 * 3));
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
    if (md->first && md->module_hook)
        md->module_hook(md, MODULE_BASE, true);
    c->module = MODULE_BASE;
    if (md->first) {
        if (md->module_hook)
            md->module_hook(md, MODULE_EMBED, true);
        c->module = MODULE_EMBED;
        x = op_embedding(g, md->wte, ids);
        c->module = MODULE_BASE;
        if (md->module_hook)
            md->module_hook(md, MODULE_EMBED, false);
        if (md->tp > 1) /* vocab-parallel embedding: masked lookup, then all-reduce */
            gg_collective(g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(x), 1,
                          nn_tp_us(md, MEMSIM_COLL_ALL_REDUCE, (uint64_t)gt_nbytes(x)));
        if (m->gemma) { /* GemmaTextScaledWordEmbedding (traces/families.c) */
            AgTensor *t = fam_embed_scale(md, x);
            U(x);
            x = t;
        }
        if (fam_modern(m) && m->embd_pdrop > 0) { /* StarCoder2's embedding_dropout */
            AgTensor *t = op_dropout(g, x, m->embd_pdrop);
            U(x);
            x = t;
        }
    } else {
        x = gt_ref(x_in);
    }
    /* position ids: arange(S) + past (0) → (1, S) */
    AgTensor *ar = op_new(g, "arange", DT_I64, SHAPE(S));
    AgTensor *pos = op_new(g, "add", DT_I64, SHAPE(1, S));
    U(ar);
    /* the causal mask: eager materialises an additive (B,1,S,S); SDPA uses is_causal,
     * except Falcon (always a bool mask) */
    bool mask_max_pos = hf_within(md->run, m, HF_CAUSAL_MASK_MAX_POS);
    AgTensor *cmask = mask_max_pos ? NULL : op_new(g, "le", DT_BOOL, SHAPE(1, 1, S, S));
    if (mask_max_pos) {
        /* Transformers 4.38's LlamaModel._update_causal_mask: causal_mask[None, None]
         * .repeat(B, 1, 1, 1).to(dtype) * min_dtype at the buffer's size P (grown to S when
         * S > P), dtype the embeddings' (traces/hf_versions.c causal-mask-max-pos) */
        int64_t P = m->max_pos > S ? m->max_pos : S;
        AgTensor *rep = op_new(g, "repeat", DT_BOOL, SHAPE(B, 1, P, P));
        AgTensor *cv = op_new(g, "_to_copy", md->adt, SHAPE(B, 1, P, P));
        U(rep);
        f.mask = op_new(g, "mul", md->adt, SHAPE(B, 1, P, P));
        U(cv);
        f.mask_indexed = f.bias_saved = true;
    } else if (f.eager || m->fam == FAM_BLOOM) {
        f.mask = op_new(g, "where", c->autocast && md->adt == DT_F32 ? DT_F32 : md->adt,
                        SHAPE(B, 1, S, S));
    } else if (m->fam == FAM_FALCON) {
        f.mask = op_new(g, "vmap_mask", DT_BOOL, SHAPE(B, 1, S, S));
    }
    U(cmask);
    /* Sliding-window layers (model_layer_is_sliding): the model builds their mask with
     * create_sliding_window_causal_mask beside the full one when both kinds of layer exist
     * (Gemma2Model.forward's causal_mask_mapping, Qwen2Model's), both alive for the forward;
     * for SDPA it is a bool (B,1,S,S) once the sequence reaches the window (masking_utils
     * sdpa_mask: the causal skip needs kv_length < sliding_window), else None. */
    AgTensor *mask2 = NULL;
    bool any_sw = false, any_full = false;
    for (int64_t l = md->l0; l < md->l1; l++) {
        if (model_layer_is_sliding(m, l))
            any_sw = true;
        else
            any_full = true;
    }
    if (any_sw && f.mask && any_full && m->fam != FAM_FALCON) {
        AgTensor *c2 = op_new(g, "le", DT_BOOL, SHAPE(1, 1, S, S));
        mask2 = op_new(g, "where", f.mask->dt, SHAPE(B, 1, S, S));
        U(c2);
        f.mask_sw = mask2;
    } else if (any_sw && !f.mask && S >= m->sliding_window) {
        AgTensor *c2 = op_new(g, "le", DT_BOOL, SHAPE(1, 1, S, S));
        mask2 = op_new(g, "and", DT_BOOL, SHAPE(1, 1, S, S));
        U(c2);
        AgTensor *e = op_expand(g, mask2, SHAPE(B, 1, S, S));
        U(mask2);
        mask2 = e;
        f.mask_sw = mask2;
    }
    AgTensor *cos = NULL, *sin = NULL;
    if (md->inv_freq) {
        int64_t rd = m->fam == FAM_NEOX ? (int64_t)(m->hd * m->rotary_pct)
                     : fam_modern(m)    ? fam_rotary_dim(m)
                                        : m->hd;
        nn_rotary(md, rd, pos, &cos, &sin);
        /* the multimodal rotary's (3, B, S, rd) tables are cut per layer (nn_rope_tables) */
        f.cos4 = m->mrope ? gt_ref(cos) : op_unsqueeze(g, cos, 1);
        f.sin4 = m->mrope ? gt_ref(sin) : op_unsqueeze(g, sin, 1);
        if (m->rope_local) {
            /* Gemma3TextModel.forward: position_embeddings_local = self.rotary_emb_local(...),
             * the same ops on rope_local_base_freq's inv_freq, every forward */
            AgTensor *cl, *sl;
            nn_rotary(md, rd, pos, &cl, &sl);
            f.cos4_sw = op_unsqueeze(g, cl, 1);
            f.sin4_sw = op_unsqueeze(g, sl, 1);
            U(cl);
            U(sl);
        }
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
        AgTensor *t = nn_layernorm(md, x, md->emb_ln_w, md->emb_ln_b);
        U(x);
        x = t;
        /* ALiBi: (B·nh, 1, S) in the model dtype, kept for the forward */
        AgTensor *alibi = op_new(g, "build_alibi_tensor", md->adt, SHAPE(B * m->nh, 1, S));
        U(alibi);
    }
    if (md->sp && md->first) {
        /* scatter_to_sequence_parallel_region: the residual stream is S/tp tokens */
        AgTensor *t = nn_sp_reduce_scatter(md, x);
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
        /* Which layers are checkpointed: all with full checkpointing (HF's
         * GradientCheckpointingLayer, torchtitan's FullAC) and op-level SAC (torchtitan's
         * SelectiveAC wraps each TransformerBlock); every N-th with layer SAC
         * (torchtitan/distributed/activation_checkpoint.py _apply_layer_sac: the blocks are
         * counted from 1 and block k is wrapped when k % N == 0). */
        MemsimCheckpointing ck = md->run->checkpointing;
        bool wrap = ck == MEMSIM_CKPT_FULL || ck == MEMSIM_CKPT_SAC_OP ||
                    (ck == MEMSIM_CKPT_SAC_LAYER && md->run->sac_every > 0 &&
                     (l + 1) % md->run->sac_every == 0);
        if (wrap && c->grad_enabled) {
            /* the checkpoint keeps the layer's arguments (mask, cos/sin) with its inputs */
            LayerArg *ca = g_new0(LayerArg, 1);
            *ca = la;
            ca->own = f;
            gt_ref(f.mask);
            gt_ref(f.mask_sw);
            gt_ref(f.cos4);
            gt_ref(f.sin4);
            gt_ref(f.cos4_sw);
            gt_ref(f.sin4_sw);
            ca->f = &ca->own;
            y = gg_checkpoint_sac(g, ck == MEMSIM_CKPT_SAC_OP ? md->run->sac_ops : 0, fn, ca,
                                  layer_arg_free, &x, 1);
        } else
            y = fn(g, &la, &x, 1);
        U(x);
        x = y;
        if (md->layer_hook)
            md->layer_hook(md, (int32_t)l, false);
    }
    c->layer = -1;
    if (!md->last) {
        U(mask2);
        U(f.mask);
        U(f.cos4);
        U(f.sin4);
        U(f.cos4_sw);
        U(f.sin4_sw);
        U(cos);
        U(sin);
        U(pos);
        *hidden_out = x;
        c->module = MODULE_ROOT;
        return NULL;
    }
    if (md->final_norm) {
        AgTensor *t = fam_modern(m) ? fam_norm(md, x, md->norm_w, md->norm_b)
                      : (m->fam == FAM_LLAMA || m->fam == FAM_MIXTRAL)
                          ? nn_rmsnorm(md, x, md->norm_w)
                          : nn_layernorm(md, x, md->norm_w, md->norm_b);
        U(x);
        x = t;
    }
    if (md->proj_out) {
        AgTensor *t = op_linear(g, x, md->proj_out, NULL);
        U(x);
        x = t;
    }
    /* the model's locals (mask, cos/sin, position ids) die when its forward returns */
    U(mask2);
    U(f.mask);
    U(f.cos4);
    U(f.sin4);
    U(f.cos4_sw);
    U(f.sin4_sw);
    U(cos);
    U(sin);
    U(pos);
    c->module = MODULE_ROOT;
    if (md->module_hook)
        md->module_hook(md, MODULE_BASE, false);
    /* lm_head(hidden[:, slice(-0, None), :]) — a full-range slice, recorded in 1.13 */
    AgTensor *hs = md->last_logits_only            ? op_slice(g, x, 1, S - 1, S)
                   : gg_rules(g)->full_slices_recorded ? op_slice(g, x, 1, 0, S)
                                                       : gt_ref(x);
    /* the base model's output (hidden_states, last_hidden_state) is the CausalLM forward's
     * local until it returns: alive through the loss, saved or not */
    AgTensor *last_hidden = x;
    AgTensor *w = md->lm_head ? md->lm_head : md->wte;
    AgTensor *logits;
    if (md->module_hook)
        md->module_hook(md, MODULE_HEAD, true);
    c->module = MODULE_HEAD;
    if (md->sp) {
        Lin head = {.w = w, .b = md->lm_bias, .out = w->shape[0], .in = w->shape[1]};
        logits = nn_sp_column_linear(md, &head, hs);
    } else {
        logits = op_linear(g, hs, w, md->lm_bias);
    }
    c->module = MODULE_ROOT;
    if (md->module_hook)
        md->module_hook(md, MODULE_HEAD, false);
    U(hs);
    if (m->final_softcap > 0) { /* Gemma 2's logit soft-capping (traces/families.c) */
        AgTensor *t = fam_final_softcap(md, logits);
        U(logits);
        logits = t;
    }
    /* Transformers before 4.46 (traces/hf_versions.c logits-not-upcast): LlamaForCausalLM.forward
     * returns lm_head(...).float(), the low-precision logits dropped at once */
    bool upcast_in_model = hf_before(md->run, m, HF_LOGITS_NOT_UPCAST) && md->tp == 1 && !md->sp;
    if (upcast_in_model) {
        AgTensor *lf = op_to(g, logits, DT_F32);
        U(logits);
        logits = lf;
    }
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
    if (upcast_in_model) {
        /* 4.45's loss in the forward: shift_logits = logits[..., :-1, :].contiguous() (a fp32
         * copy), shift_labels = labels[..., 1:].contiguous(), CrossEntropyLoss on their views */
        AgTensor *sv = op_slice(g, logits, 1, 0, S - 1);
        AgTensor *sh = op_contiguous(g, sv);
        U(sv);
        AgTensor *sl = op_new(g, "clone", DT_I64, SHAPE(B, S - 1));
        AgTensor *l2 = op_view(g, sh, SHAPE(B * (S - 1), V));
        U(sh);
        AgTensor *t1 = op_view(g, sl, SHAPE(B * (S - 1)));
        U(sl);
        AgTensor *loss = op_cross_entropy(g, l2, t1);
        U(l2);
        U(t1);
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
