/* The Llama-derived families of current Transformers (traces/models.h, fam_*): Qwen3,
 * Qwen2-MoE, Qwen3-MoE, Gemma 1/2/3, Phi-3, OLMo-2, DeepSeek-V2/V3. Each is Llama's decoder
 * (traces/models.c llama_layer) with its own differences, written after its modeling file
 * (huggingface/transformers src/transformers/models/<type>/modeling_<type>.py; the function
 * named at each block), with the same ops in the same order and Python variables dropped
 * where the Python code drops them. docs: traces/README.md "Llama-derived families".
 */
#include "traces/layers.h"

#include <math.h>
#include <string.h>

#define U(x) gt_unref(md->g, (x))

bool fam_modern(const MemsimModel *m)
{
    return m->arch[0] != '\0';
}

/* The rotary width: DeepSeek rotates qk_rope_head_dim of each head (DeepseekV3RotaryEmbedding
 * is built on it); Phi-3 partial_rotary_factor of head_dim (Phi3RotaryEmbedding). */
int64_t fam_rotary_dim(const MemsimModel *m)
{
    if (m->kv_lora)
        return m->qk_rope;
    return (int64_t)((double)m->hd * m->rotary_pct);
}

/* The Linear modules a LoRA target may name (peft matches module names), and peft's default
 * targets (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: q_proj,
 * v_proj for these; qkv_proj for phi3). DeepSeek's attention has no q_proj when q_lora_rank
 * is set and no v_proj: peft has no default for it, so targets must be given. The routed
 * experts are parameters, not Linear modules: no LoRA target. */
const char *fam_module_names(const MemsimModel *m)
{
    if (m->kv_lora)
        return m->q_lora ? "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,gate_proj,"
                           "up_proj,down_proj"
                         : "q_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,gate_proj,up_proj,"
                           "down_proj";
    if (m->fused_qkv)
        return "qkv_proj,o_proj,gate_up_proj,down_proj";
    if (m->plain_mlp)
        return "q_proj,k_proj,v_proj,o_proj,c_fc,c_proj";
    if (m->shared_gate)
        return "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,shared_expert_gate";
    return "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
}

const char *fam_lora_default_targets(const MemsimModel *m)
{
    if (m->kv_lora)
        return NULL;
    return m->fused_qkv ? "qkv_proj" : "q_proj,v_proj";
}

static AgTensor *vecp(Model *md, int64_t n)
{
    return nn_param(md, md->pdt, SHAPE(n), nn_full_ft(md));
}

/* ---- parameters, in registration order ---- */

void fam_build_layer(Model *md, Layer *ly, int64_t l)
{
    const MemsimModel *m = md->m;
    int64_t H = m->H, I = m->I, nh = m->nh, nkv = m->nkv, hd = m->hd;
    bool tr = nn_full_ft(md);
    ly->moe = model_layer_is_moe(m, l);
    /* self_attn */
    if (m->kv_lora) {
        /* DeepseekV3Attention.__init__ */
        if (m->q_lora) {
            nn_lin_make(md, &ly->q_a, "q_a_proj", m->q_lora, H, m->qkv_bias, false);
            ly->q_a_ln = vecp(md, m->q_lora);
            nn_lin_make(md, &ly->q_b, "q_b_proj", nh * hd, m->q_lora, false, false);
        } else {
            nn_lin_make(md, &ly->q, "q_proj", nh * hd, H, false, false);
        }
        nn_lin_make(md, &ly->kv_a, "kv_a_proj_with_mqa", m->kv_lora + m->qk_rope, H, m->qkv_bias,
                    false);
        ly->kv_a_ln = vecp(md, m->kv_lora);
        nn_lin_make(md, &ly->kv_b, "kv_b_proj", nh * (m->qk_nope + m->v_hd), m->kv_lora, false,
                    false);
        nn_lin_make(md, &ly->o, "o_proj", H, nh * m->v_hd, m->qkv_bias, false);
    } else if (m->fused_qkv) {
        /* Phi3Attention.__init__: o_proj, then qkv_proj */
        nn_lin_make(md, &ly->o, "o_proj", H, nh * hd, false, false);
        nn_lin_make(md, &ly->qkv, "qkv_proj", (nh + 2 * nkv) * hd, H, false, false);
    } else {
        nn_lin_make(md, &ly->q, "q_proj", nh * hd, H, m->qkv_bias, false);
        nn_lin_make(md, &ly->k, "k_proj", nkv * hd, H, m->qkv_bias, false);
        nn_lin_make(md, &ly->v, "v_proj", nkv * hd, H, m->qkv_bias, false);
        nn_lin_make(md, &ly->o, "o_proj", H, nh * hd, m->o_bias, false);
        if (m->qk_norm == 1) {
            ly->qn_w = vecp(md, hd);
            ly->kn_w = vecp(md, hd);
        } else if (m->qk_norm == 2) {
            ly->qn_w = vecp(md, nh * hd);
            ly->kn_w = vecp(md, nkv * hd);
        }
    }
    /* mlp */
    if (ly->moe) {
        int64_t E = m->n_experts, EI = m->moe_I ? m->moe_I : I;
        /* Qwen2MoeSparseMoeBlock: gate, experts, shared_expert, shared_expert_gate;
         * DeepseekV3MoE: experts, gate (weight, e_score_correction_bias), shared_experts */
        ly->router = nn_param(md, md->pdt, SHAPE(E, H), tr);
        if (m->router_bias)
            ly->router_b = nn_buffer(md, DT_F32, SHAPE(E));
        /* the experts as current Transformers holds them (Qwen2MoeExperts, DeepseekV3NaiveMoe):
         * gate_up_proj [E, 2 I, H] and down_proj [E, H, I], two parameters */
        ly->gate_up_w = nn_param(md, md->pdt, SHAPE(E, 2 * EI, H), tr);
        ly->down_w = nn_param(md, md->pdt, SHAPE(E, H, EI), tr);
        if (m->shared_I) {
            nn_lin_make(md, &ly->sh_gate, "gate_proj", m->shared_I, H, false, false);
            nn_lin_make(md, &ly->sh_up, "up_proj", m->shared_I, H, false, false);
            nn_lin_make(md, &ly->sh_down, "down_proj", H, m->shared_I, false, false);
        }
        if (m->shared_gate)
            nn_lin_make(md, &ly->sh_g, "shared_expert_gate", 1, H, false, false);
    } else if (m->plain_mlp) {
        nn_lin_make(md, &ly->up, "c_fc", I, H, m->mlp_bias, false);
        nn_lin_make(md, &ly->down, "c_proj", H, I, m->mlp_bias, false);
    } else if (m->fused_gate_up) {
        nn_lin_make(md, &ly->up, "gate_up_proj", 2 * I, H, false, false);
        nn_lin_make(md, &ly->down, "down_proj", H, I, false, false);
    } else {
        nn_lin_make(md, &ly->gate, "gate_proj", I, H, m->mlp_bias, false);
        nn_lin_make(md, &ly->up, "up_proj", I, H, m->mlp_bias, false);
        nn_lin_make(md, &ly->down, "down_proj", H, I, m->mlp_bias, false);
    }
    /* norms (StarCoder2: nn.LayerNorm, weight then bias; OLMo's have no parameters) */
    if (m->np_norms)
        return;
    ly->ln1_w = vecp(md, H);
    if (m->ln_norms)
        ly->ln1_b = vecp(md, H);
    ly->ln2_w = vecp(md, H);
    if (m->ln_norms)
        ly->ln2_b = vecp(md, H);
    if (m->sandwich) {
        ly->ln3_w = vecp(md, H);
        ly->ln4_w = vecp(md, H);
    }
}

/* ---- norms ---- */

/* GemmaRMSNorm.forward (modeling_gemma.py): _norm(x.float()) * (1.0 + weight.float()), then
 * type_as(x): x.float(), pow, mean, + eps, rsqrt, x * rsqrt (saved), weight.float(), 1 + w
 * (saved), the product, the cast back. */
static AgTensor *gemma_rmsnorm(Model *md, AgTensor *x, AgTensor *w)
{
    AgGraph *g = md->g;
    DType in_dt = x->dt;
    AgTensor *y = nn_rms_normalize(md, x);
    AgTensor *w32 = op_to(g, w, DT_F32);
    AgTensor *w1 = op_scalar(g, BIN_ADD, w32);
    U(w32);
    AgTensor *o = op_binary(g, BIN_MUL, y, w1);
    U(y);
    U(w1);
    AgTensor *out = op_to(g, o, in_dt);
    U(o);
    return out;
}

/* Olmo2RMSNorm.forward (modeling_olmo2.py): x.to(f32), pow, mean, + eps, rsqrt, x * rsqrt,
 * weight * that (in fp32), then .to(input_dtype). */
static AgTensor *olmo2_rmsnorm(Model *md, AgTensor *x, AgTensor *w)
{
    AgGraph *g = md->g;
    DType in_dt = x->dt;
    AgTensor *y = nn_rms_normalize(md, x);
    AgTensor *o = op_binary(g, BIN_MUL, w, y);
    U(y);
    AgTensor *out = op_to(g, o, in_dt);
    U(o);
    return out;
}

/* OlmoLayerNorm.forward (modular_olmo.py): F.layer_norm(x.to(float32), shape, None, None,
 * eps=1e-5).to(orig_dtype) — casts that are no-ops on the fp32 residual stream of mixed
 * precision; native_layer_norm saves its input, mean and rstd, and has no weight to save. */
static AgTensor *olmo_layernorm(Model *md, AgTensor *x)
{
    AgGraph *g = md->g;
    AgTensor *x32 = op_to(g, x, DT_F32);
    AgTensor *y = op_layer_norm(g, x32, NULL, NULL);
    U(x32);
    AgTensor *out = op_to(g, y, x->dt);
    U(y);
    return out;
}

AgTensor *fam_norm(Model *md, AgTensor *x, AgTensor *w, AgTensor *b)
{
    if (md->m->np_norms)
        return olmo_layernorm(md, x);
    if (md->m->ln_norms)
        return nn_layernorm(md, x, w, b);
    if (md->m->gemma)
        return gemma_rmsnorm(md, x, w);
    if (md->m->post_norms)
        return olmo2_rmsnorm(md, x, w);
    return nn_rmsnorm(md, x, w);
}

/* GemmaTextScaledWordEmbedding.forward: embedding(ids) * embed_scale.to(weight.dtype) — the
 * 0-d buffer cast (a new 0-d tensor), then the product. */
AgTensor *fam_embed_scale(Model *md, AgTensor *x)
{
    if (!md->m->gemma)
        return gt_ref(x);
    AgTensor *sc = op_new(md->g, "_to_copy", x->dt, 0, NULL);
    AgTensor *y = op_scalar(md->g, BIN_MUL, x);
    U(sc);
    return y;
}

/* Gemma2ForCausalLM.forward: logits / cap, tanh (its output saved), * cap. */
AgTensor *fam_final_softcap(Model *md, AgTensor *logits)
{
    if (md->m->final_softcap <= 0)
        return gt_ref(logits);
    AgGraph *g = md->g;
    AgTensor *d = op_scalar(g, BIN_DIV, logits);
    AgTensor *t = op_unary(g, UN_TANH, d);
    U(d);
    AgTensor *out = op_scalar(g, BIN_MUL, t);
    U(t);
    return out;
}

/* ---- attention ---- */

/* ClampBackward1 (derivatives.yaml clamp: clamp_backward in FunctionsManual.cpp):
 * where((self >= min).logical_and_(self <= max), grad, 0) — two bool masks, the second freed
 * by the in-place and, then the gradient. */
static void bw_clamp(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    const AgTensor *m = n->in_meta[0];
    gg_op(g, "ge");
    AgTensor *ge = gt_empty(g, DT_BOOL, m->nd, m->shape);
    gg_op(g, "le");
    AgTensor *le = gt_empty(g, DT_BOOL, m->nd, m->shape);
    gg_op(g, "logical_and_");
    gt_unref(g, le);
    gg_op(g, "where");
    gout[0] = gt_empty(g, gin[0]->dt, m->nd, m->shape);
    gt_unref(g, ge);
}

/* OlmoAttention.forward: q, k, v .clamp_(min=-clip_qkv, max=clip_qkv) in place on the
 * projections' outputs. Under autograd an in-place op whose derivative reads self saves a
 * clone of it first (tools/autograd/gen_variable_type.py save_variables: original_self =
 * self.clone()), so the clamped tensor and the saved pre-clamp copy are both held: the same
 * bytes, for the same times, as the out-of-place clamp made here that saves its input. Without
 * grad nothing is allocated. */
static AgTensor *clip(Model *md, AgTensor *x)
{
    AgGraph *g = md->g;
    if (md->m->clip_qkv <= 0 || !gg_needs_grad(g, 1, &x))
        return gt_ref(x);
    gg_op(g, "clamp_");
    gg_flops(g, (double)gt_numel(x));
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    AgNode *n = gn_new(g, "ClampBackward1", bw_clamp, 1);
    gn_add_input(g, n, x);
    gn_save(g, n, x);
    gn_set_output(n, out, 0);
    return out;
}

static AgTensor *heads(Model *md, AgTensor *x, int64_t n, int64_t d)
{
    AgTensor *v = op_view(md->g, x, SHAPE(md->B, md->S, n, d));
    AgTensor *t = op_transpose(md->g, v, 1, 2);
    U(v);
    return t;
}

/* Phi-3's apply_rotary_pos_emb (modeling_phi3.py): q[..., :rd] rotated, then
 * cat([rotated, q[..., rd:]], -1) — a copy even when rd is the whole head. */
static AgTensor *phi3_rope(Model *md, AgTensor *q, AgTensor *cos4, AgTensor *sin4)
{
    AgGraph *g = md->g;
    int64_t hd = q->shape[3], rd = cos4->shape[3];
    AgTensor *qr = op_slice(g, q, -1, 0, rd), *qp = op_slice(g, q, -1, rd, hd);
    AgTensor *e = nn_apply_rope(md, qr, cos4, sin4);
    AgTensor *parts[2] = {e, qp};
    AgTensor *out = op_cat(g, parts, 2, -1);
    U(e);
    U(qr);
    U(qp);
    return out;
}

/* DeepSeek's apply_rotary_pos_emb_interleave (modeling_deepseek_v3.py): q.view(b,h,s,d/2,2)
 * .transpose(4,3).reshape(b,h,s,d) (a copy), then Llama's rotation. */
static AgTensor *rope_interleave(Model *md, AgTensor *q, AgTensor *cos4, AgTensor *sin4)
{
    AgGraph *g = md->g;
    int64_t b = q->shape[0], h = q->shape[1], s = q->shape[2], d = q->shape[3];
    AgTensor *v = op_view(g, q, SHAPE(b, h, s, d / 2, 2));
    AgTensor *t = op_transpose(g, v, 4, 3);
    U(v);
    AgTensor *r = op_reshape(g, t, SHAPE(b, h, s, d));
    U(t);
    AgTensor *out = nn_apply_rope(md, r, cos4, sin4);
    U(r);
    return out;
}

/* DeepseekV3Attention.forward: multi-head latent attention. */
static AgTensor *mla_attn(Model *md, Fwd *f, Layer *ly, AgTensor *x)
{
    AgGraph *g = md->g;
    const MemsimModel *m = md->m;
    int64_t B = md->B, S = md->S, nh = m->nh, nope = m->qk_nope, rope = m->qk_rope;
    AgTensor *qs;
    if (m->q_lora) {
        AgTensor *qa = nn_lin(md, &ly->q_a, x);
        AgTensor *qn = nn_rmsnorm(md, qa, ly->q_a_ln);
        U(qa);
        qs = nn_lin(md, &ly->q_b, qn);
        U(qn);
    } else {
        qs = nn_lin(md, &ly->q, x);
    }
    AgTensor *q4 = heads(md, qs, nh, nope + rope);
    U(qs);
    AgTensor *qparts[2];
    op_split_sizes(g, q4, -1, (int64_t[]){nope, rope}, qparts, 2);
    U(q4);
    AgTensor *ckv = nn_lin(md, &ly->kv_a, x);
    AgTensor *kparts[2];
    op_split_sizes(g, ckv, -1, (int64_t[]){m->kv_lora, rope}, kparts, 2);
    U(ckv);
    AgTensor *kn = nn_rmsnorm(md, kparts[0], ly->kv_a_ln);
    U(kparts[0]);
    AgTensor *kb = nn_lin(md, &ly->kv_b, kn);
    U(kn);
    AgTensor *kb4 = heads(md, kb, nh, nope + m->v_hd);
    U(kb);
    AgTensor *kv[2];
    op_split_sizes(g, kb4, -1, (int64_t[]){nope, m->v_hd}, kv, 2);
    U(kb4);
    AgTensor *krot = op_view(g, kparts[1], SHAPE(B, 1, S, rope));
    U(kparts[1]);
    AgTensor *qr = rope_interleave(md, qparts[1], f->cos4, f->sin4);
    AgTensor *kr = rope_interleave(md, krot, f->cos4, f->sin4);
    U(qparts[1]);
    U(krot);
    AgTensor *kre = op_expand(g, kr, SHAPE(B, nh, S, rope));
    U(kr);
    AgTensor *qc[2] = {qparts[0], qr}, *kc[2] = {kv[0], kre};
    AgTensor *q = op_cat(g, qc, 2, -1);
    AgTensor *k = op_cat(g, kc, 2, -1);
    U(qparts[0]);
    U(qr);
    U(kv[0]);
    U(kre);
    AgTensor *v = kv[1];
    nn_cache_update(md, &k, &v);
    AgTensor *o = nn_attention(md, f, q, k, v, true);
    U(q);
    U(k);
    U(v);
    AgTensor *om = op_reshape(g, o, SHAPE(B, S, nh * m->v_hd));
    U(o);
    AgTensor *out = nn_lin(md, &ly->o, om);
    U(om);
    return out;
}

/* Qwen3Attention / Gemma3Attention / Olmo2Attention / Phi3Attention / GemmaAttention.forward */
static AgTensor *attn(Model *md, Fwd *f, Layer *ly, AgTensor *x)
{
    AgGraph *g = md->g;
    const MemsimModel *m = md->m;
    int64_t nh = m->nh, nkv = m->nkv, hd = m->hd;
    AgTensor *q, *k, *v;
    if (m->fused_qkv) {
        /* qkv = qkv_proj(x); q = qkv[..., :nh·hd]; k, v the next slices */
        AgTensor *qkv = nn_lin(md, &ly->qkv, x);
        int64_t a = nh * hd, b = a + nkv * hd, c = b + nkv * hd;
        AgTensor *qs = op_slice(g, qkv, -1, 0, a), *ks = op_slice(g, qkv, -1, a, b);
        AgTensor *vs = op_slice(g, qkv, -1, b, c);
        U(qkv);
        q = heads(md, qs, nh, hd);
        k = heads(md, ks, nkv, hd);
        v = heads(md, vs, nkv, hd);
        U(qs);
        U(ks);
        U(vs);
    } else if (m->qk_norm == 2) {
        /* Olmo2: q_norm(q_proj(x)), k_norm(k_proj(x)) over the whole projection */
        AgTensor *qp = nn_lin(md, &ly->q, x);
        AgTensor *qn = olmo2_rmsnorm(md, qp, ly->qn_w);
        U(qp);
        AgTensor *kp = nn_lin(md, &ly->k, x);
        AgTensor *kn = olmo2_rmsnorm(md, kp, ly->kn_w);
        U(kp);
        AgTensor *vp = nn_lin(md, &ly->v, x);
        q = heads(md, qn, nh, hd);
        k = heads(md, kn, nkv, hd);
        v = heads(md, vp, nkv, hd);
        U(qn);
        U(kn);
        U(vp);
    } else if (m->qk_norm == 1) {
        /* q_norm(q_proj(x).view(B, S, -1, hd)).transpose(1, 2), the same for k */
        AgTensor *t[2];
        Lin *lin[2] = {&ly->q, &ly->k};
        AgTensor *nw[2] = {ly->qn_w, ly->kn_w};
        int64_t n[2] = {nh, nkv};
        for (int i = 0; i < 2; i++) {
            AgTensor *p = nn_lin(md, lin[i], x);
            AgTensor *pv = op_view(g, p, SHAPE(md->B, md->S, n[i], hd));
            U(p);
            AgTensor *pn = fam_norm(md, pv, nw[i], NULL);
            U(pv);
            t[i] = op_transpose(g, pn, 1, 2);
            U(pn);
        }
        q = t[0];
        k = t[1];
        AgTensor *vp = nn_lin(md, &ly->v, x);
        v = heads(md, vp, nkv, hd);
        U(vp);
    } else {
        AgTensor *qp = nn_lin(md, &ly->q, x), *kp = nn_lin(md, &ly->k, x);
        AgTensor *vp = nn_lin(md, &ly->v, x);
        if (m->clip_qkv > 0) {
            AgTensor *t[3] = {clip(md, qp), clip(md, kp), clip(md, vp)};
            U(qp);
            U(kp);
            U(vp);
            qp = t[0], kp = t[1], vp = t[2];
        }
        q = heads(md, qp, nh, hd);
        k = heads(md, kp, nkv, hd);
        v = heads(md, vp, nkv, hd);
        U(qp);
        U(kp);
        U(vp);
    }
    AgTensor *qe, *ke;
    if (m->fused_qkv) {
        qe = phi3_rope(md, q, f->cos4, f->sin4);
        ke = phi3_rope(md, k, f->cos4, f->sin4);
    } else {
        qe = nn_apply_rope(md, q, f->cos4, f->sin4);
        ke = nn_apply_rope(md, k, f->cos4, f->sin4);
    }
    U(q);
    U(k);
    nn_cache_update(md, &ke, &v);
    AgTensor *o = nn_attention(md, f, qe, ke, v, true);
    U(qe);
    U(ke);
    U(v);
    AgTensor *om = op_reshape(g, o, SHAPE(md->B, md->S, nh * hd));
    U(o);
    AgTensor *out = nn_lin(md, &ly->o, om);
    U(om);
    return out;
}

/* ---- MLPs ---- */

/* LlamaMLP / GemmaMLP: down(act(gate(x)) * up(x)) */
static AgTensor *mlp(Model *md, Lin *gate, Lin *up, Lin *down, AgTensor *x)
{
    AgTensor *gt = nn_lin(md, gate, x);
    AgTensor *a = nn_act(md, gt);
    U(gt);
    AgTensor *u = nn_lin(md, up, x);
    AgTensor *h = op_binary(md->g, BIN_MUL, a, u);
    U(a);
    U(u);
    AgTensor *out = nn_lin(md, down, h);
    U(h);
    return out;
}

/* Starcoder2MLP.forward: c_proj(act(c_fc(x))) */
static AgTensor *plain_mlp(Model *md, Layer *ly, AgTensor *x)
{
    AgTensor *h = nn_lin(md, &ly->up, x);
    AgTensor *a = nn_act(md, h);
    U(h);
    AgTensor *out = nn_lin(md, &ly->down, a);
    U(a);
    return out;
}

/* Phi3MLP.forward: gate, up = gate_up_proj(x).chunk(2, -1); up * act(gate); down_proj */
static AgTensor *phi3_mlp(Model *md, Layer *ly, AgTensor *x)
{
    AgGraph *g = md->g;
    AgTensor *gu = nn_lin(md, &ly->up, x);
    AgTensor *p[2];
    op_split(g, gu, -1, md->m->I, p, 2);
    U(gu);
    AgTensor *a = nn_act(md, p[0]);
    AgTensor *h = op_binary(g, BIN_MUL, p[1], a);
    U(p[0]);
    U(p[1]);
    U(a);
    AgTensor *out = nn_lin(md, &ly->down, h);
    U(h);
    return out;
}

/* The grouped GEMM of the experts (integrations/moe.py grouped_mm_experts_forward:
 * torch._grouped_mm over the token rows sorted by expert, with offsets): x [N, K] against
 * w [E, O, K] → [N, O]; it saves x and w, and its backward makes dx [N, K] and dw [E, O, K]
 * (a batched matmul of equal groups allocates the same). */
static void bw_gmm(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    for (int i = 0; i < 2; i++)
        if (n->next[i].node) {
            gg_op(g, "_grouped_mm");
            gg_gemm(g);
            gout[i] = gt_empty(g, gin[0]->dt, n->in_meta[i]->nd, n->in_meta[i]->shape);
        }
}

static AgTensor *grouped_mm(Model *md, AgTensor *x, AgTensor *w)
{
    AgGraph *g = md->g;
    AgTensor *xc = op_autocast(g, x), *wc = op_autocast(g, w);
    int64_t N = xc->shape[0], K = xc->shape[1], O = wc->shape[1];
    gg_op(g, "_grouped_mm");
    gg_gemm(g);
    gg_flops(g, 2.0 * (double)N * (double)K * (double)O);
    AgTensor *out = gt_empty(g, xc->dt, SHAPE(N, O));
    AgTensor *in[2] = {xc, wc};
    if (gg_needs_grad(g, 2, in)) {
        AgNode *n = gn_new(g, "GroupedMmBackward0", bw_gmm, 1);
        gn_add_input(g, n, xc);
        gn_add_input(g, n, wc);
        gn_save(g, n, xc);
        gn_save(g, n, wc);
        gn_set_output(n, out, 0);
    }
    U(xc);
    U(wc);
    return out;
}

/* Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock / DeepseekV3MoE forward: router logits,
 * softmax in fp32 (DeepSeek-V3: sigmoid), top-k, the renormalisation when norm_topk_prob;
 * then the routed experts as one grouped computation over the T·k token slots (the
 * grouped_mm experts backend; routing only decides which rows meet which expert, so the
 * sizes do not depend on it): the gathered rows, gate_up, act(gate) * up, down, the routing
 * weights' product, index_add_ into the output; then the shared experts (Qwen2-MoE: gated by
 * sigmoid(shared_expert_gate(x))) added. */
static AgTensor *moe(Model *md, Layer *ly, AgTensor *x)
{
    AgGraph *g = md->g;
    const MemsimModel *m = md->m;
    int64_t T = md->B * md->S, E = m->n_experts, K = m->top_k, H = m->H;
    int64_t EI = m->moe_I ? m->moe_I : m->I, slots = T * K;
    AgTensor *x2 = op_view(g, x, SHAPE(T, H));
    Lin rl = {.w = ly->router, .out = E, .in = H};
    AgTensor *logits = nn_lin(md, &rl, x2);
    AgTensor *l32 = op_to(g, logits, DT_F32);
    U(logits);
    AgTensor *probs = m->router_bias ? op_unary(g, UN_SIGMOID, l32) : op_softmax(g, l32, DT_F32);
    U(l32);
    AgTensor *topv = op_topk(g, probs, K);
    U(probs);
    if (m->norm_topk) {
        AgTensor *ssum = op_new(g, "sum", DT_F32, SHAPE(T, 1));
        AgTensor *nv = op_binary(g, BIN_DIV, topv, ssum);
        U(ssum);
        U(topv);
        topv = nv;
    }
    AgTensor *wflat = op_view(g, topv, SHAPE(slots, 1));
    U(topv);
    AgTensor *xs = op_gather_rows(g, x2, slots);
    AgTensor *gu = grouped_mm(md, xs, ly->gate_up_w);
    U(xs);
    AgTensor *p[2];
    op_split(g, gu, -1, EI, p, 2);
    U(gu);
    AgTensor *a = nn_act(md, p[0]);
    U(p[0]);
    AgTensor *h = op_binary(g, BIN_MUL, a, p[1]);
    U(a);
    U(p[1]);
    AgTensor *y = grouped_mm(md, h, ly->down_w);
    U(h);
    AgTensor *w = op_gather_rows(g, wflat, slots);
    U(wflat);
    AgTensor *yw = op_binary(g, BIN_MUL, y, w);
    U(y);
    U(w);
    AgTensor *yc = op_to(g, yw, x2->dt);
    U(yw);
    AgTensor *acc = op_index_add(g, x2->dt, T, H, &yc, 1);
    U(yc);
    if (m->shared_I) {
        AgTensor *sh = mlp(md, &ly->sh_gate, &ly->sh_up, &ly->sh_down, x2);
        if (m->shared_gate) {
            AgTensor *gl = nn_lin(md, &ly->sh_g, x2);
            AgTensor *sg = op_unary(g, UN_SIGMOID, gl);
            U(gl);
            AgTensor *t = op_binary(g, BIN_MUL, sg, sh);
            U(sg);
            U(sh);
            sh = t;
        }
        AgTensor *s2 = op_binary(g, BIN_ADD, acc, sh);
        U(acc);
        U(sh);
        acc = s2;
    }
    U(x2);
    AgTensor *out = op_view(g, acc, SHAPE(md->B, md->S, H));
    U(acc);
    return out;
}

/* ---- the decoder layer ---- */

static AgTensor *add(Model *md, AgTensor *a, AgTensor *b)
{
    return op_binary(md->g, BIN_ADD, a, b);
}

/* LlamaDecoderLayer, with Gemma2DecoderLayer's sandwich norms, Olmo2DecoderLayer's post-norms
 * and Phi3DecoderLayer's residual dropouts */
AgTensor *fam_layer(Model *md, Fwd *f, Layer *ly, AgTensor *x)
{
    const MemsimModel *m = md->m;
    AgTensor *h = m->post_norms ? gt_ref(x) : fam_norm(md, x, ly->ln1_w, ly->ln1_b);
    AgTensor *a = m->kv_lora ? mla_attn(md, f, ly, h) : attn(md, f, ly, h);
    U(h);
    if (m->sandwich || m->post_norms) {
        AgTensor *t = fam_norm(md, a, m->post_norms ? ly->ln1_w : ly->ln2_w, NULL);
        U(a);
        a = t;
    }
    if (m->resid_pdrop > 0) {
        AgTensor *t = op_dropout(md->g, a, m->resid_pdrop);
        U(a);
        a = t;
    }
    AgTensor *x1 = add(md, x, a);
    U(a);
    AgTensor *h2 = m->post_norms ? gt_ref(x1)
                                 : fam_norm(md, x1, m->sandwich ? ly->ln3_w : ly->ln2_w,
                                            m->sandwich ? NULL : ly->ln2_b);
    AgTensor *mo = ly->moe            ? moe(md, ly, h2)
                   : m->plain_mlp     ? plain_mlp(md, ly, h2)
                   : m->fused_gate_up ? phi3_mlp(md, ly, h2)
                                      : mlp(md, &ly->gate, &ly->up, &ly->down, h2);
    U(h2);
    if (m->sandwich || m->post_norms) {
        AgTensor *t = fam_norm(md, mo, m->post_norms ? ly->ln2_w : ly->ln4_w, NULL);
        U(mo);
        mo = t;
    }
    if (m->resid_pdrop > 0) {
        AgTensor *t = op_dropout(md->g, mo, m->resid_pdrop);
        U(mo);
        mo = t;
    }
    AgTensor *out = add(md, x1, mo);
    U(mo);
    U(x1);
    return out;
}
