/* The op library (traces/ops.h): allocations, saved tensors and backward allocations of each
 * operator, from AUTOGRAD_MEMORY.md. Section numbers below refer to that file.
 *
 * Conventions: every op first emits an OP event with its ATen-style name. A backward
 * function allocates the gradients it returns (or passes an incoming gradient on with a new
 * reference) and frees its temporaries before returning; the engine then drops the incoming
 * gradients and the node's saved tensors (§1.4).
 */
#include "traces/ops.h"

#include <string.h>

/* ---- helpers ---- */

static AgTensor *alloc_like(AgGraph *g, const AgTensor *m)
{
    return gt_empty(g, m->dt, m->nd, m->shape);
}

static AgTensor *alloc_like_dt(AgGraph *g, const AgTensor *m, DType dt)
{
    return gt_empty(g, dt, m->nd, m->shape);
}

static bool same_shape(const AgTensor *a, const AgTensor *b)
{
    if (a->nd != b->nd)
        return false;
    for (int i = 0; i < a->nd; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

/* The node for an op whose inputs are xs, or NULL when no gradient is needed. */
static AgNode *node_for(AgGraph *g, const char *name, AgBackwardFn fn, int n, AgTensor *const *xs,
                       int n_out)
{
    if (!gg_needs_grad(g, n, xs))
        return NULL;
    AgNode *nd = gn_new(g, name, fn, n_out);
    for (int i = 0; i < n; i++)
        gn_add_input(g, nd, xs[i]);
    return nd;
}

static bool needs(const AgNode *n, int i)
{
    return n->next[i].node != NULL;
}

/* sum_to: reduces grad to the shape of meta (a broadcast input); returns a new reference
 * (the same tensor when no reduction is needed). */
static AgTensor *sum_to(AgGraph *g, AgTensor *grad, const AgTensor *meta)
{
    if (same_shape(grad, meta))
        return gt_ref(grad);
    gg_op(g, "sum");
    return alloc_like_dt(g, meta, grad->dt);
}

static DType promote(DType a, DType b)
{
    if (a == b)
        return a;
    if (a == DT_F32 || b == DT_F32)
        return DT_F32;
    if ((a == DT_BF16 && b == DT_F16) || (a == DT_F16 && b == DT_BF16))
        return DT_F32;
    if (a == DT_BF16 || b == DT_BF16)
        return DT_BF16;
    if (a == DT_F16 || b == DT_F16)
        return DT_F16;
    if (a == DT_I64 || b == DT_I64)
        return DT_I64;
    return a;
}

AgTensor *op_new(AgGraph *g, const char *name, DType dt, int nd, const int64_t *shape)
{
    gg_op(g, name);
    return gt_empty(g, dt, nd, shape);
}

/* Output strides following the first operand's memory order (TensorIterator's rule when
 * operands disagree: the first one wins). */
static void follow_layout(AgTensor *out, const AgTensor *like)
{
    if (!same_shape(out, like) || !gt_is_dense(like) || gt_is_contiguous(like))
        return;
    int idx[GT_MAXDIM];
    for (int i = 0; i < out->nd; i++)
        idx[i] = i;
    /* dims from innermost (smallest stride) to outermost */
    for (int a = 1; a < out->nd; a++)
        for (int b = a; b > 0 && like->stride[idx[b]] < like->stride[idx[b - 1]]; b--) {
            int t = idx[b];
            idx[b] = idx[b - 1];
            idx[b - 1] = t;
        }
    int64_t s = 1;
    for (int k = 0; k < out->nd; k++) {
        out->stride[idx[k]] = s;
        s *= out->shape[idx[k]];
    }
}

/* ---- casts (§4.4) ---- */

static void bw_to(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gout[0] = alloc_like(g, n->in_meta[0]);
}

AgTensor *op_to(AgGraph *g, AgTensor *x, DType dt)
{
    if (x->dt == dt)
        return gt_ref(x);
    gg_op(g, "_to_copy");
    AgTensor *out = gt_empty(g, dt, x->nd, x->shape);
    follow_layout(out, x);
    AgNode *n = node_for(g, "ToCopyBackward0", bw_to, 1, &x, 1);
    if (n)
        gn_set_output(n, out, 0);
    return out;
}

AgTensor *op_autocast(AgGraph *g, AgTensor *x)
{
    int ac = gg_ctx(g)->autocast;
    if (!ac || x->dt == (DType)ac || (x->dt != DT_F32 && x->dt != DT_F16 && x->dt != DT_BF16))
        return gt_ref(x);
    /* cached for trainable fp32 leaves only; everything else is cast at every use */
    bool cacheable = x->dt == DT_F32 && x->requires_grad && x->is_leaf && !x->view_in_forward;
    if (cacheable) {
        AgTensor *c = gg_autocast_cached(g, x);
        if (c)
            return gt_ref(c);
    }
    AgTensor *c = op_to(g, x, (DType)ac);
    if (cacheable)
        gg_autocast_store(g, x, c);
    return c;
}

/* ---- views and copies (§5) ---- */

static void bw_pass(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gout[0] = gt_ref(gin[0]);
}

AgTensor *op_clone(AgGraph *g, AgTensor *x)
{
    gg_op(g, "clone");
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    AgNode *n = node_for(g, "CloneBackward0", bw_pass, 1, &x, 1);
    if (n)
        gn_set_output(n, out, 0);
    return out;
}

AgTensor *op_contiguous(AgGraph *g, AgTensor *x)
{
    if (gt_is_contiguous(x))
        return gt_ref(x);
    return op_clone(g, x);
}

/* view/_reshape_alias/_unsafe_view backward: grad.reshape(input sizes) — a view when the
 * incoming gradient allows it, else a copy (§2.4). */
static void bw_reshape(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    const AgTensor *m = n->in_meta[0];
    int64_t st[GT_MAXDIM];
    if (gt_view_strides(gin[0], m->nd, m->shape, st)) {
        gout[0] = gt_view_of(g, gin[0], m->nd, m->shape, st);
    } else {
        gg_op(g, "_reshape_copy");
        gout[0] = alloc_like_dt(g, m, gin[0]->dt);
    }
}

static AgTensor *view_node(AgGraph *g, AgTensor *x, AgTensor *v, const char *name, AgBackwardFn fn)
{
    AgNode *n = node_for(g, name, fn, 1, &x, 1);
    if (n)
        gn_set_output(n, v, 0);
    return v;
}

AgTensor *op_view(AgGraph *g, AgTensor *x, int nd, const int64_t *shape)
{
    int64_t st[GT_MAXDIM];
    bool ok = gt_view_strides(x, nd, shape, st);
    g_assert(ok && "view of a tensor whose strides do not allow it");
    AgTensor *v = gt_view_of(g, x, nd, shape, st);
    return view_node(g, x, v, "ViewBackward0", bw_reshape);
}

AgTensor *op_reshape(AgGraph *g, AgTensor *x, int nd, const int64_t *shape)
{
    int64_t st[GT_MAXDIM];
    if (gt_view_strides(x, nd, shape, st)) {
        AgTensor *v = gt_view_of(g, x, nd, shape, st);
        return view_node(g, x, v, gg_rules(g)->v113 ? "ReshapeAliasBackward0" : "ViewBackward0",
                         bw_reshape);
    }
    AgTensor *c = op_clone(g, x);
    /* clone gives a contiguous tensor, so the unsafe view always views */
    AgTensor *v = gt_view_of(g, c, nd, shape, NULL);
    view_node(g, c, v, "UnsafeViewBackward0", bw_reshape);
    gt_unref(g, c);
    return v;
}

static void bw_transpose(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    AgTensor *gr = gin[0];
    int d0 = (int)n->iarg[0], d1 = (int)n->iarg[1];
    int64_t sh[GT_MAXDIM], st[GT_MAXDIM];
    memcpy(sh, gr->shape, sizeof sh);
    memcpy(st, gr->stride, sizeof st);
    int64_t t = sh[d0];
    sh[d0] = sh[d1];
    sh[d1] = t;
    t = st[d0];
    st[d0] = st[d1];
    st[d1] = t;
    gout[0] = gt_view_of(g, gr, gr->nd, sh, st);
}

AgTensor *op_transpose(AgGraph *g, AgTensor *x, int d0, int d1)
{
    if (d0 < 0)
        d0 += x->nd;
    if (d1 < 0)
        d1 += x->nd;
    int64_t sh[GT_MAXDIM], st[GT_MAXDIM];
    memcpy(sh, x->shape, sizeof sh);
    memcpy(st, x->stride, sizeof st);
    int64_t t = sh[d0];
    sh[d0] = sh[d1];
    sh[d1] = t;
    t = st[d0];
    st[d0] = st[d1];
    st[d1] = t;
    AgTensor *v = gt_view_of(g, x, x->nd, sh, st);
    AgNode *n = node_for(g, "TransposeBackward0", bw_transpose, 1, &x, 1);
    if (n) {
        n->iarg[0] = d0;
        n->iarg[1] = d1;
        gn_set_output(n, v, 0);
    }
    return v;
}

static void bw_permute(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    AgTensor *gr = gin[0];
    const int *perm = n->extra;
    int64_t sh[GT_MAXDIM], st[GT_MAXDIM];
    for (int i = 0; i < gr->nd; i++) {
        sh[perm[i]] = gr->shape[i];
        st[perm[i]] = gr->stride[i];
    }
    gout[0] = gt_view_of(g, gr, gr->nd, sh, st);
}

AgTensor *op_permute(AgGraph *g, AgTensor *x, const int *perm)
{
    int64_t sh[GT_MAXDIM], st[GT_MAXDIM];
    for (int i = 0; i < x->nd; i++) {
        sh[i] = x->shape[perm[i]];
        st[i] = x->stride[perm[i]];
    }
    AgTensor *v = gt_view_of(g, x, x->nd, sh, st);
    AgNode *n = node_for(g, "PermuteBackward0", bw_permute, 1, &x, 1);
    if (n) {
        n->extra = g_memdup2(perm, sizeof(int) * x->nd);
        n->extra_free = g_free;
        gn_set_output(n, v, 0);
    }
    return v;
}

static void bw_unsqueeze(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    const AgTensor *m = n->in_meta[0];
    int dim = (int)n->iarg[0];
    int64_t st[GT_MAXDIM];
    for (int i = 0, j = 0; i < gin[0]->nd; i++)
        if (i != dim)
            st[j++] = gin[0]->stride[i];
    gout[0] = gt_view_of(g, gin[0], m->nd, m->shape, st);
}

AgTensor *op_unsqueeze(AgGraph *g, AgTensor *x, int dim)
{
    if (dim < 0)
        dim += x->nd + 1;
    int64_t sh[GT_MAXDIM], st[GT_MAXDIM];
    for (int i = 0, j = 0; i <= x->nd; i++) {
        if (i == dim) {
            sh[i] = 1;
            st[i] = j < x->nd ? x->stride[j] * x->shape[j] : 1;
        } else {
            sh[i] = x->shape[j];
            st[i] = x->stride[j];
            j++;
        }
    }
    AgTensor *v = gt_view_of(g, x, x->nd + 1, sh, st);
    AgNode *n = node_for(g, "UnsqueezeBackward0", bw_unsqueeze, 1, &x, 1);
    if (n) {
        n->iarg[0] = dim;
        gn_set_output(n, v, 0);
    }
    return v;
}

static void bw_expand(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gout[0] = sum_to(g, gin[0], n->in_meta[0]);
}

AgTensor *op_expand(AgGraph *g, AgTensor *x, int nd, const int64_t *shape)
{
    int64_t st[GT_MAXDIM];
    int off = nd - x->nd;
    for (int i = 0; i < nd; i++) {
        int j = i - off;
        if (j < 0 || (x->shape[j] == 1 && shape[i] != 1))
            st[i] = 0;
        else
            st[i] = x->stride[j];
    }
    AgTensor *v = gt_view_of(g, x, nd, shape, st);
    AgNode *n = node_for(g, "ExpandBackward0", bw_expand, 1, &x, 1);
    if (n)
        gn_set_output(n, v, 0);
    return v;
}

/* slice_backward: zeros of the full input size, then the gradient copied in (§5). */
static void bw_slice(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gg_op(g, "slice_backward");
    gout[0] = alloc_like_dt(g, n->in_meta[0], gin[0]->dt);
}

AgTensor *op_slice(AgGraph *g, AgTensor *x, int dim, int64_t start, int64_t end)
{
    if (dim < 0)
        dim += x->nd;
    if (end > x->shape[dim])
        end = x->shape[dim];
    int64_t sh[GT_MAXDIM];
    memcpy(sh, x->shape, sizeof sh);
    sh[dim] = end - start;
    AgTensor *v = gt_view_of(g, x, x->nd, sh, x->stride);
    AgNode *n = node_for(g, "SliceBackward0", bw_slice, 1, &x, 1);
    if (n)
        gn_set_output(n, v, 0);
    return v;
}

/* split backward: one node waits for every piece, then cat allocates the full input size
 * (missing pieces are zeros first). */
static void bw_split(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    for (int i = 0; i < n->n_out; i++)
        if (!gin[i]) {
            gg_op(g, "zeros");
            gin[i] = gt_empty(g, n->in_meta[0]->dt, 0, NULL); /* placeholder, freed below */
        }
    gg_op(g, "cat");
    gout[0] = alloc_like_dt(g, n->in_meta[0], n->in_meta[0]->dt);
}

void op_split(AgGraph *g, AgTensor *x, int dim, int64_t size, AgTensor **out, int nout)
{
    if (dim < 0)
        dim += x->nd;
    AgNode *n = node_for(g, "SplitBackward0", bw_split, 1, &x, nout);
    for (int k = 0; k < nout; k++) {
        int64_t sh[GT_MAXDIM];
        memcpy(sh, x->shape, sizeof sh);
        sh[dim] = size;
        out[k] = gt_view_of(g, x, x->nd, sh, x->stride);
        if (n)
            gn_set_output(n, out[k], k);
    }
}

/* torch.split with sizes: views; backward as split's (one cat of the input's size). */
void op_split_sizes(AgGraph *g, AgTensor *x, int dim, const int64_t *sizes, AgTensor **out,
                    int nout)
{
    if (dim < 0)
        dim += x->nd;
    AgNode *n = node_for(g, "SplitWithSizesBackward0", bw_split, 1, &x, nout);
    for (int k = 0; k < nout; k++) {
        int64_t sh[GT_MAXDIM];
        memcpy(sh, x->shape, sizeof sh);
        sh[dim] = sizes[k];
        out[k] = gt_view_of(g, x, x->nd, sh, x->stride);
        if (n)
            gn_set_output(n, out[k], k);
    }
}

/* cat backward: narrow views of the gradient, no allocation (§5). */
static void bw_cat(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    int dim = (int)n->iarg[0];
    for (int i = 0; i < n->n_next; i++) {
        if (!needs(n, i))
            continue;
        const AgTensor *m = n->in_meta[i];
        int64_t sh[GT_MAXDIM];
        memcpy(sh, gin[0]->shape, sizeof sh);
        sh[dim] = m->shape[dim];
        gout[i] = gt_view_of(g, gin[0], gin[0]->nd, sh, gin[0]->stride);
    }
}

AgTensor *op_cat(AgGraph *g, AgTensor **xs, int n, int dim)
{
    if (dim < 0)
        dim += xs[0]->nd;
    gg_op(g, "cat");
    int64_t sh[GT_MAXDIM];
    memcpy(sh, xs[0]->shape, sizeof sh);
    sh[dim] = 0;
    DType dt = xs[0]->dt;
    for (int i = 0; i < n; i++) {
        sh[dim] += xs[i]->shape[dim];
        dt = promote(dt, xs[i]->dt);
    }
    AgTensor *out = gt_empty(g, dt, xs[0]->nd, sh);
    AgNode *nd = node_for(g, "CatBackward0", bw_cat, n, xs, 1);
    if (nd) {
        nd->iarg[0] = dim;
        gn_set_output(nd, out, 0);
    }
    return out;
}

/* ---- element-wise (§4.1, §4.2) ---- */

static void bw_binary(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    BinKind k = (BinKind)n->iarg[0];
    AgTensor *gr = gin[0];
    for (int i = 0; i < 2; i++) {
        if (!needs(n, i))
            continue;
        const AgTensor *m = n->in_meta[i];
        AgTensor *full;
        if (k == BIN_ADD || (k == BIN_SUB && i == 0)) {
            full = gt_ref(gr); /* add passes grad through */
        } else if (k == BIN_DIV && i == 1) {
            /* -grad * ((a / b) / b): temporaries in sequence (§4.1) */
            gg_op(g, "div");
            AgTensor *t1 = alloc_like(g, gr);
            gg_op(g, "div");
            AgTensor *t2 = alloc_like(g, gr);
            gt_unref(g, t1);
            gg_op(g, "neg");
            AgTensor *t3 = alloc_like(g, gr);
            gg_op(g, "mul");
            full = alloc_like(g, gr);
            gt_unref(g, t2);
            gt_unref(g, t3);
        } else {
            gg_op(g, k == BIN_SUB ? "neg" : k == BIN_DIV ? "div" : "mul");
            full = alloc_like(g, gr);
        }
        AgTensor *red = sum_to(g, full, m);
        gt_unref(g, full);
        if (red->dt != m->dt) { /* grad of a promoted input: cast back */
            gg_op(g, "_to_copy");
            AgTensor *c = alloc_like(g, m);
            gt_unref(g, red);
            red = c;
        }
        gout[i] = red;
    }
}

AgTensor *op_binary(AgGraph *g, BinKind k, AgTensor *a, AgTensor *b)
{
    static const char *names[] = {"add", "sub", "mul", "div"};
    static const char *bw_names[] = {"AddBackward0", "SubBackward0", "MulBackward0",
                                     "DivBackward0"};
    gg_op(g, names[k]);
    int nd = a->nd > b->nd ? a->nd : b->nd;
    int64_t sh[GT_MAXDIM];
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->nd), ib = i - (nd - b->nd);
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        sh[i] = sa > sb ? sa : sb;
    }
    /* 0-dim tensors (wrapped scalars) do not take part in promotion */
    DType dt = a->nd == 0 ? b->dt : b->nd == 0 ? a->dt : promote(a->dt, b->dt);
    AgTensor *out = gt_empty(g, dt, nd, sh);
    follow_layout(out, same_shape(out, a) ? a : b);
    AgTensor *xs[2] = {a, b};
    AgNode *n = node_for(g, bw_names[k], bw_binary, 2, xs, 1);
    if (n) {
        n->iarg[0] = k;
        if (k == BIN_MUL) {
            if (needs(n, 0))
                gn_save(g, n, b);
            if (needs(n, 1))
                gn_save(g, n, a);
        } else if (k == BIN_DIV) {
            if (needs(n, 0) || needs(n, 1))
                gn_save(g, n, b);
            if (needs(n, 1))
                gn_save(g, n, a);
        }
        gn_set_output(n, out, 0);
    }
    return out;
}

static void bw_scalar(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    BinKind k = (BinKind)n->iarg[0];
    if (k == BIN_ADD || k == BIN_SUB) {
        gout[0] = gt_ref(gin[0]);
        return;
    }
    gg_op(g, "mul");
    gout[0] = alloc_like(g, gin[0]);
}

AgTensor *op_scalar(AgGraph *g, BinKind k, AgTensor *a)
{
    static const char *names[] = {"add", "sub", "mul", "div"};
    static const char *bw_names[] = {"AddBackward1", "SubBackward1", "MulBackward1",
                                     "DivBackward1"};
    gg_op(g, names[k]);
    AgTensor *out = gt_empty(g, a->dt, a->nd, a->shape);
    follow_layout(out, a);
    AgNode *n = node_for(g, bw_names[k], bw_scalar, 1, &a, 1);
    if (n) {
        n->iarg[0] = k;
        gn_set_output(n, out, 0);
    }
    return out;
}

static void bw_unary(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    UnKind k = (UnKind)n->iarg[0];
    AgTensor *gr = gin[0];
    const AgTensor *m = n->in_meta[0];
    switch (k) {
    case UN_SQUARE:
    case UN_CUBE: {
        /* pow_backward: self.pow(e-1) (alloc), * e (alloc), grad * that (alloc) */
        gg_op(g, "pow");
        AgTensor *t1 = alloc_like(g, m);
        gg_op(g, "mul");
        AgTensor *t2 = alloc_like(g, m);
        gt_unref(g, t1);
        gg_op(g, "mul");
        gout[0] = alloc_like(g, m);
        gt_unref(g, t2);
        break;
    }
    case UN_RSQRT: {
        /* -0.5 * grad * result.pow(3): pow (alloc), -0.5*grad (alloc), product (alloc) */
        gg_op(g, "pow");
        AgTensor *t1 = alloc_like(g, m);
        gg_op(g, "mul");
        AgTensor *t2 = alloc_like(g, gr);
        gg_op(g, "mul");
        gout[0] = alloc_like(g, m);
        gt_unref(g, t1);
        gt_unref(g, t2);
        break;
    }
    case UN_COS:
    case UN_SIN: {
        gg_op(g, k == UN_COS ? "sin" : "cos");
        AgTensor *t1 = alloc_like(g, m);
        gg_op(g, "mul");
        gout[0] = alloc_like(g, m);
        gt_unref(g, t1);
        break;
    }
    default:
        gg_op(g, "unary_backward");
        gout[0] = alloc_like(g, m);
        break;
    }
}

AgTensor *op_unary(AgGraph *g, UnKind k, AgTensor *x)
{
    static const char *names[] = {"neg",  "rsqrt", "exp",  "tanh", "sigmoid", "relu", "silu",
                                  "gelu", "gelu",  "pow",  "pow",  "cos",     "sin"};
    static const char *bw_names[] = {"NegBackward0",     "RsqrtBackward0", "ExpBackward0",
                                     "TanhBackward0",    "SigmoidBackward0", "ReluBackward0",
                                     "SiluBackward0",    "GeluBackward0",  "GeluBackward0",
                                     "PowBackward0",     "PowBackward0",   "CosBackward0",
                                     "SinBackward0"};
    gg_op(g, names[k]);
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    follow_layout(out, x);
    AgNode *n = node_for(g, bw_names[k], bw_unary, 1, &x, 1);
    if (n) {
        n->iarg[0] = k;
        switch (k) {
        case UN_RSQRT:
        case UN_EXP:
        case UN_TANH:
        case UN_SIGMOID:
        case UN_RELU:
            gn_save(g, n, out); /* saves result */
            break;
        case UN_NEG:
            break;
        default:
            gn_save(g, n, x); /* saves self */
            break;
        }
        gn_set_output(n, out, 0);
    }
    return out;
}

/* mean(-1, keepdim): [1.13] saves self; backward expands / n: alloc full (§4.3). */
static void bw_mean(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gg_op(g, "div");
    gout[0] = alloc_like(g, n->in_meta[0]);
}

AgTensor *op_mean_lastdim(AgGraph *g, AgTensor *x)
{
    gg_op(g, "mean");
    int64_t sh[GT_MAXDIM];
    memcpy(sh, x->shape, sizeof sh);
    sh[x->nd - 1] = 1;
    AgTensor *out = gt_empty(g, x->dt, x->nd, sh);
    AgNode *n = node_for(g, "MeanBackward1", bw_mean, 1, &x, 1);
    if (n) {
        if (gg_rules(g)->mean_saves_input)
            gn_save(g, n, x);
        gn_set_output(n, out, 0);
    }
    return out;
}

/* masked_fill / where(cond, x, const): saves the condition; backward 1 alloc (§6.6). */
static void bw_where(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    if (!needs(n, 0))
        return;
    gg_op(g, "where");
    AgTensor *full = alloc_like(g, gin[0]);
    gout[0] = sum_to(g, full, n->in_meta[0]);
    gt_unref(g, full);
}

AgTensor *op_where_const(AgGraph *g, AgTensor *cond, AgTensor *x)
{
    gg_op(g, "where");
    int nd = cond->nd > x->nd ? cond->nd : x->nd;
    int64_t sh[GT_MAXDIM];
    for (int i = 0; i < nd; i++) {
        int ic = i - (nd - cond->nd), ix = i - (nd - x->nd);
        int64_t sc = ic >= 0 ? cond->shape[ic] : 1, sx = ix >= 0 ? x->shape[ix] : 1;
        sh[i] = sc > sx ? sc : sx;
    }
    AgTensor *out = gt_empty(g, x->dt, nd, sh);
    AgNode *n = node_for(g, "WhereBackward0", bw_where, 1, &x, 1);
    if (n) {
        gn_save(g, n, cond);
        gn_set_output(n, out, 0);
    }
    return out;
}

/* dropout (§6.5): p == 0 returns the input; CUDA: output + bool mask (saved); CPU: a float
 * noise tensor of the input size (saved by the multiply). */
static void bw_dropout(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gg_op(g, "native_dropout_backward");
    gout[0] = alloc_like(g, n->in_meta[0]);
}

AgTensor *op_dropout(AgGraph *g, AgTensor *x, double p)
{
    if (p <= 0.0 || !gg_ctx(g)->grad_enabled)
        return gt_ref(x);
    if (!gg_rules(g)->cuda) {
        gg_op(g, "bernoulli_");
        AgTensor *noise = gt_empty(g, x->dt, x->nd, x->shape);
        AgTensor *out = op_binary(g, BIN_MUL, x, noise);
        gt_unref(g, noise);
        return out;
    }
    gg_op(g, "native_dropout");
    AgTensor *out = gt_empty(g, x->dt, x->nd, x->shape);
    AgTensor *mask = gt_empty(g, DT_BOOL, x->nd, x->shape);
    AgNode *n = node_for(g, "NativeDropoutBackward0", bw_dropout, 1, &x, 2);
    if (n) {
        gn_save(g, n, mask);
        gn_set_output(n, out, 0);
    }
    gt_unref(g, mask);
    return out;
}

/* ---- embedding (§3) ---- */

static void bw_embedding(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    const AgTensor *w = n->in_meta[0];
    AgTensor *gr = gin[0];
    AgTensor *c = NULL;
    if (!gt_is_contiguous(gr)) {
        gg_op(g, "contiguous");
        c = alloc_like(g, gr);
    }
    int64_t nidx = gt_numel(gr) / (gr->nd ? gr->shape[gr->nd - 1] : 1);
    int64_t V = w->shape[0], D = w->shape[1];
    if (gg_rules(g)->cuda && nidx > 3072) {
        /* sort-based kernel: sorted/orig indices, range, segment bookkeeping and the fp32
         * partial sums per segment (§3) */
        int64_t mn = nidx < V ? nidx : V;
        int64_t partials = nidx / 10 + mn;
        gg_op(g, "embedding_dense_backward");
        AgTensor *tmp[8];
        int nt = 0;
        tmp[nt++] = gt_empty(g, DT_I64, SHAPE(nidx));
        tmp[nt++] = gt_empty(g, DT_I64, SHAPE(nidx));
        tmp[nt++] = gt_empty(g, DT_I64, SHAPE(nidx));
        gout[0] = gt_empty(g, w->dt, w->nd, w->shape);
        tmp[nt++] = gt_empty(g, DT_I64, SHAPE(nidx));
        tmp[nt++] = gt_empty(g, DT_I64, SHAPE(mn));
        tmp[nt++] = gt_empty(g, DT_I64, SHAPE(mn));
        tmp[nt++] = gt_empty(g, DT_I64, SHAPE(partials));
        tmp[nt++] = gt_empty(g, gr->dt == DT_F32 ? DT_F32 : DT_F32, SHAPE(partials, D));
        for (int i = nt - 1; i >= 0; i--)
            gt_unref(g, tmp[i]);
    } else {
        gg_op(g, "embedding_dense_backward");
        gout[0] = gt_empty(g, w->dt, w->nd, w->shape);
    }
    gt_unref(g, c);
}

AgTensor *op_embedding(AgGraph *g, AgTensor *weight, AgTensor *ids)
{
    gg_op(g, "embedding");
    int64_t sh[GT_MAXDIM];
    memcpy(sh, ids->shape, sizeof(int64_t) * ids->nd);
    sh[ids->nd] = weight->shape[1];
    AgTensor *out = gt_empty(g, weight->dt, ids->nd + 1, sh);
    AgNode *n = node_for(g, "EmbeddingBackward0", bw_embedding, 1, &weight, 1);
    if (n) {
        gn_save(g, n, ids);
        if (gg_rules(g)->embedding_saves_weight)
            gn_save(g, n, weight);
        gn_set_output(n, out, 0);
    }
    return out;
}

/* ---- matrix products (§2) ---- */

/* Each GEMM opens its op (gg_op) before gg_gemm: the cuBLAS workspace the first GEMM of a
 * thread allocates belongs to that GEMM, not to the op before it. */

/* mm/addmm backward (§2.4): mat1 grad [M,K], then mat2 grad [K,N] (returned as the
 * transpose of a contiguous [N,K] when mat2 is Wᵀ), then the bias reduced to [N]. Inputs:
 * 0 = bias (addmm only), 1 = mat1, 2 = mat2. */
static void bw_mm(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    AgTensor *gr = gin[0];
    int bias = n->iarg[0] ? 1 : 0;
    int i1 = bias, i2 = bias + 1;
    /* [M,K] @ [K,N] = [M,N]: each gradient GEMM is 2·M·K·N FLOPs */
    double mkn = (double)gt_numel(gr) * (double)n->in_meta[i2]->shape[0];
    if (needs(n, i1)) {
        const AgTensor *m1 = n->in_meta[i1];
        double c1 = (double)m1->shape[m1->nd - 1];
        gg_op(g, "mm");
        gg_gemm(g);
        gg_flops_tiles(g, 2.0 * mkn, 1, (double)gt_numel(m1) / c1, c1);
        gout[i1] = alloc_like_dt(g, n->in_meta[i1], gr->dt);
    }
    if (needs(n, i2)) {
        const AgTensor *m2 = n->in_meta[i2];
        double c2 = (double)m2->shape[m2->nd - 1];
        gg_op(g, "mm");
        gg_gemm(g);
        gg_flops_tiles(g, 2.0 * mkn, 1, (double)gt_numel(m2) / c2, c2);
        AgTensor *t = gt_empty(g, gr->dt, SHAPE(m2->shape[1], m2->shape[0]));
        /* the transpose view of a row-major [N,K]: mat2's layout */
        gout[i2] = gt_view_of(g, t, 2, m2->shape, (int64_t[]){1, m2->shape[0]});
        gt_unref(g, t);
    }
    if (bias && needs(n, 0)) {
        gg_op(g, "sum");
        gout[0] = gt_empty(g, gr->dt, n->in_meta[0]->nd, n->in_meta[0]->shape);
    }
}

/* w is [O, H] (nn.Linear); x is [*, H]. */
AgTensor *op_linear(AgGraph *g, AgTensor *x, AgTensor *w, AgTensor *b)
{
    AgTensor *xc = op_autocast(g, x), *wc = op_autocast(g, w), *bc = b ? op_autocast(g, b) : NULL;
    int64_t O = wc->shape[0], H = wc->shape[1];
    int64_t M = gt_numel(xc) / H;
    AgTensor *wt = op_transpose(g, wc, 0, 1);
    AgTensor *x2;
    int64_t st[GT_MAXDIM];
    bool fold_view = gt_view_strides(xc, SHAPE(M, H), st);
    if (xc->nd == 2) {
        x2 = gt_ref(xc);
    } else if (bc && gt_is_contiguous(xc)) {
        x2 = op_view(g, xc, SHAPE(M, H));
    } else {
        /* matmul: fold the leading dims (§2.2); a copy when they do not view */
        bool fold = gg_rules(g)->matmul_always_folds || wc->requires_grad || fold_view;
        (void)fold; /* the broadcast-bmm branch allocates the same output */
        x2 = op_reshape(g, xc, SHAPE(M, H));
    }
    bool addmm = bc && (xc->nd == 2 || gt_is_contiguous(xc));
    AgTensor *out2;
    GgSacAction sac = gg_sac_policy(g, addmm ? MEMSIM_SAC_ADDMM : MEMSIM_SAC_MM);
    if (sac == GG_SAC_REUSE) {
        out2 = gg_sac_take(g);
    } else {
        gg_op(g, addmm ? "addmm" : "mm");
        gg_gemm(g);
        gg_flops_tiles(g, 2.0 * (double)M * (double)H * (double)O, 1, (double)M, (double)O);
        out2 = gt_empty(g, promote(xc->dt, wc->dt), SHAPE(M, O));
        if (sac == GG_SAC_KEEP)
            gg_sac_keep(g, out2);
    }
    AgTensor *xs3[3] = {bc, x2, wt};
    AgNode *n = addmm ? node_for(g, "AddmmBackward0", bw_mm, 3, xs3, 1)
                     : node_for(g, "MmBackward0", bw_mm, 2, xs3 + 1, 1);
    if (n) {
        n->iarg[0] = addmm;
        int i1 = addmm ? 1 : 0;
        if (needs(n, i1 + 1))
            gn_save(g, n, x2); /* mat1 saved only when mat2 needs a gradient */
        if (needs(n, i1))
            gn_save(g, n, wt);
        gn_set_output(n, out2, 0);
    }
    AgTensor *out;
    if (xc->nd == 2) {
        out = gt_ref(out2);
    } else {
        int64_t sh[GT_MAXDIM];
        memcpy(sh, xc->shape, sizeof sh);
        sh[xc->nd - 1] = O;
        out = addmm ? op_view(g, out2, xc->nd, sh) : op_reshape(g, out2, xc->nd, sh);
    }
    gt_unref(g, out2);
    gt_unref(g, x2);
    gt_unref(g, wt);
    if (bc && !addmm) {
        /* out.add_(b) in place: the node is rebased onto an AddBackward */
        AgTensor *r = op_binary(g, BIN_ADD, out, bc);
        gt_unref(g, out);
        out = r;
    }
    gt_unref(g, xc);
    gt_unref(g, wc);
    gt_unref(g, bc);
    return out;
}

AgTensor *op_conv1d(AgGraph *g, AgTensor *x, AgTensor *w, AgTensor *b)
{
    /* Conv1D: addmm(bias, x.view(-1, nx), W) with W [nx, nf] used as is (row-major). */
    AgTensor *xc = op_autocast(g, x), *wc = op_autocast(g, w), *bc = op_autocast(g, b);
    int64_t nx = wc->shape[0], nf = wc->shape[1];
    int64_t M = gt_numel(xc) / nx;
    AgTensor *x2 = op_view(g, xc, SHAPE(M, nx));
    AgTensor *out2;
    GgSacAction sac = gg_sac_policy(g, MEMSIM_SAC_ADDMM);
    if (sac == GG_SAC_REUSE) {
        out2 = gg_sac_take(g);
    } else {
        gg_op(g, "addmm");
        gg_gemm(g);
        gg_flops_tiles(g, 2.0 * (double)M * (double)nx * (double)nf, 1, (double)M, (double)nf);
        out2 = gt_empty(g, promote(xc->dt, wc->dt), SHAPE(M, nf));
        if (sac == GG_SAC_KEEP)
            gg_sac_keep(g, out2);
    }
    AgTensor *xs3[3] = {bc, x2, wc};
    AgNode *n = node_for(g, "AddmmBackward0", bw_mm, 3, xs3, 1);
    if (n) {
        n->iarg[0] = 1;
        if (needs(n, 2))
            gn_save(g, n, x2);
        if (needs(n, 1))
            gn_save(g, n, wc);
        gn_set_output(n, out2, 0);
    }
    int64_t sh[GT_MAXDIM];
    memcpy(sh, xc->shape, sizeof sh);
    sh[xc->nd - 1] = nf;
    AgTensor *out = op_view(g, out2, xc->nd, sh);
    gt_unref(g, out2);
    gt_unref(g, x2);
    gt_unref(g, xc);
    gt_unref(g, wc);
    gt_unref(g, bc);
    return out;
}

/* bmm backward: grad.bmm(mat2ᵀ) then selfᵀ.bmm(grad), one alloc each (§2.4). */
static void bw_bmm(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    /* [b,n,k] @ [b,k,p]: each gradient is 2·b·n·k·p FLOPs */
    const AgTensor *a = n->in_meta[0], *b = n->in_meta[1];
    double bnkp = (double)gt_numel(a) * (double)b->shape[b->nd - 1];
    for (int i = 0; i < 2; i++)
        if (needs(n, i)) {
            const AgTensor *mi = n->in_meta[i];
            double r = (double)mi->shape[mi->nd - 2], c = (double)mi->shape[mi->nd - 1];
            gg_op(g, "bmm");
            gg_gemm(g);
            gg_flops_tiles(g, 2.0 * bnkp, (double)gt_numel(mi) / (r * c), r, c);
            gout[i] = alloc_like_dt(g, n->in_meta[i], gin[0]->dt);
        }
}

/* 4-D @ 4-D (§2.3): each side expand → reshape [B·h, ·, ·] (a copy when the batch dims do
 * not merge), bmm, _unsafe_view back. */
AgTensor *op_matmul(AgGraph *g, AgTensor *a, AgTensor *b)
{
    AgTensor *ac = op_autocast(g, a), *bc = op_autocast(g, b);
    g_assert(ac->nd == bc->nd && ac->nd >= 3);
    int nd = ac->nd;
    int64_t batch = 1;
    for (int i = 0; i < nd - 2; i++)
        batch *= ac->shape[i];
    int64_t n_ = ac->shape[nd - 2], k_ = ac->shape[nd - 1], p_ = bc->shape[nd - 1];
    AgTensor *a3 = op_reshape(g, ac, SHAPE(batch, n_, k_));
    AgTensor *b3 = op_reshape(g, bc, SHAPE(batch, k_, p_));
    AgTensor *out3;
    GgSacAction sac = gg_sac_policy(g, MEMSIM_SAC_BMM);
    if (sac == GG_SAC_REUSE) {
        out3 = gg_sac_take(g);
    } else {
        gg_op(g, "bmm");
        gg_gemm(g);
        gg_flops_tiles(g, 2.0 * (double)batch * (double)n_ * (double)k_ * (double)p_, (double)batch,
                           (double)n_, (double)p_);
        out3 = gt_empty(g, promote(ac->dt, bc->dt), SHAPE(batch, n_, p_));
        if (sac == GG_SAC_KEEP)
            gg_sac_keep(g, out3);
    }
    AgTensor *xs[2] = {a3, b3};
    AgNode *n = node_for(g, "BmmBackward0", bw_bmm, 2, xs, 1);
    if (n) {
        if (needs(n, 1))
            gn_save(g, n, a3);
        if (needs(n, 0))
            gn_save(g, n, b3);
        gn_set_output(n, out3, 0);
    }
    int64_t sh[GT_MAXDIM];
    memcpy(sh, ac->shape, sizeof sh);
    sh[nd - 1] = p_;
    AgTensor *out = op_reshape(g, out3, nd, sh);
    gt_unref(g, out3);
    gt_unref(g, a3);
    gt_unref(g, b3);
    gt_unref(g, ac);
    gt_unref(g, bc);
    return out;
}

/* ---- softmax, norms, loss (§6) ---- */

static void bw_softmax(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gg_op(g, "_softmax_backward_data");
    gout[0] = alloc_like(g, n->in_meta[0]);
}

AgTensor *op_softmax(AgGraph *g, AgTensor *x, DType dt)
{
    AgTensor *xin;
    if (dt != x->dt && !(gg_rules(g)->cuda && x->dt == DT_F16 && dt == DT_F32))
        xin = op_to(g, x, dt); /* bf16 (and every non-Half case) copies first */
    else
        xin = gt_ref(x);
    gg_op(g, "_softmax");
    AgTensor *out = gt_empty(g, dt, xin->nd, xin->shape);
    AgNode *n = node_for(g, "SoftmaxBackward0", bw_softmax, 1, &xin, 1);
    if (n) {
        gn_save(g, n, out);
        gn_set_output(n, out, 0);
    }
    gt_unref(g, xin);
    return out;
}

static void bw_layer_norm(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gg_op(g, "native_layer_norm_backward");
    for (int i = 0; i < n->n_next; i++)
        if (needs(n, i))
            gout[i] = alloc_like(g, n->in_meta[i]);
}

AgTensor *op_layer_norm(AgGraph *g, AgTensor *x, AgTensor *w, AgTensor *b)
{
    /* under autocast layer_norm runs in fp32 (§8.1) */
    AgTensor *xin = gg_ctx(g)->autocast ? op_to(g, x, DT_F32) : gt_ref(x);
    gg_op(g, "native_layer_norm");
    AgTensor *out = gt_empty(g, xin->dt, xin->nd, xin->shape);
    int64_t sh[GT_MAXDIM];
    memcpy(sh, xin->shape, sizeof sh);
    sh[xin->nd - 1] = 1;
    DType acc = DT_F32;
    AgTensor *mean = gt_empty(g, acc, xin->nd, sh);
    AgTensor *rstd = gt_empty(g, acc, xin->nd, sh);
    AgTensor *xs[3] = {xin, w, b};
    AgNode *n = node_for(g, "NativeLayerNormBackward0", bw_layer_norm, 3, xs, 3);
    if (n) {
        gn_save(g, n, xin);
        gn_save(g, n, w);
        gn_save(g, n, b);
        gn_save(g, n, mean);
        gn_save(g, n, rstd);
        gn_set_output(n, out, 0);
    }
    gt_unref(g, mean);
    gt_unref(g, rstd);
    gt_unref(g, xin);
    return out;
}

static void bw_log_softmax(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gg_op(g, "_log_softmax_backward_data");
    gout[0] = alloc_like(g, n->in_meta[0]);
}

static void bw_nll(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    /* a full [N, V] zeros tensor with one non-zero per row (§6.2) */
    gg_op(g, "nll_loss_backward");
    gout[0] = alloc_like(g, n->in_meta[0]);
}

AgTensor *op_cross_entropy(AgGraph *g, AgTensor *logits, AgTensor *labels)
{
    /* log_softmax in the input dtype (the dtype argument), nll_loss in fp32 under autocast */
    gg_op(g, "_log_softmax");
    AgTensor *L = gt_empty(g, logits->dt, logits->nd, logits->shape);
    AgNode *n1 = node_for(g, "LogSoftmaxBackward0", bw_log_softmax, 1, &logits, 1);
    if (n1) {
        gn_save(g, n1, L);
        gn_set_output(n1, L, 0);
    }
    AgTensor *Lin = gg_ctx(g)->autocast ? op_to(g, L, DT_F32) : gt_ref(L);
    gg_op(g, "nll_loss_forward");
    AgTensor *loss = gt_empty(g, DT_F32, 0, NULL);
    AgTensor *tw = gt_empty(g, DT_F32, 0, NULL);
    AgNode *n2 = node_for(g, "NllLossBackward0", bw_nll, 1, &Lin, 1);
    if (n2) {
        gn_save(g, n2, Lin);
        gn_save(g, n2, labels);
        gn_save(g, n2, tw);
        gn_set_output(n2, loss, 0);
    }
    gt_unref(g, tw);
    gt_unref(g, Lin);
    gt_unref(g, L);
    return loss;
}

/* ---- indexing (MoE dispatch, multi-query heads) ---- */

static void bw_zeros_like_input(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    gg_op(g, n->name[0] == 'T' ? "value_selecting_reduction_backward" : "index_put_");
    gout[0] = alloc_like_dt(g, n->in_meta[0], gin[0]->dt);
}

AgTensor *op_gather_rows(AgGraph *g, AgTensor *x, int64_t n)
{
    gg_op(g, "index");
    AgTensor *out = gt_empty(g, x->dt, SHAPE(n, x->shape[x->nd - 1]));
    AgNode *nd = node_for(g, "IndexBackward0", bw_zeros_like_input, 1, &x, 1);
    if (nd) {
        AgTensor *idx = gt_empty(g, DT_I64, SHAPE(n));
        gn_save(g, nd, idx);
        gt_unref(g, idx);
        gn_set_output(nd, out, 0);
    }
    return out;
}

static void bw_index_add(AgGraph *g, AgNode *n, AgTensor **gin, AgTensor **gout)
{
    for (int i = 0; i < n->n_next; i++)
        if (needs(n, i)) {
            gg_op(g, "index_select");
            gout[i] = alloc_like_dt(g, n->in_meta[i], gin[0]->dt);
        }
}

AgTensor *op_index_add(AgGraph *g, DType dt, int64_t rows, int64_t cols, AgTensor **srcs, int n)
{
    g_assert(n <= GN_MAXNEXT);
    gg_op(g, "zeros");
    AgTensor *out = gt_empty(g, dt, SHAPE(rows, cols));
    gg_op(g, "index_add_");
    AgNode *nd = node_for(g, "IndexAddBackward0", bw_index_add, n, srcs, 1);
    if (nd) {
        /* derivatives.yaml index_add: source's gradient is
         * grad.index_select(dim, index).expand_as(source), so IndexAddBackward0 keeps source
         * (a SavedVariable, unpacked in its apply) until the backward */
        for (int i = 0; i < n; i++)
            if (needs(nd, i))
                gn_save(g, nd, srcs[i]);
        gn_set_output(nd, out, 0);
    }
    return out;
}

AgTensor *op_topk(AgGraph *g, AgTensor *x, int64_t k)
{
    int64_t sh[GT_MAXDIM];
    memcpy(sh, x->shape, sizeof sh);
    sh[x->nd - 1] = k;
    AgTensor *vals, *idx;
    GgSacAction sac = gg_sac_policy(g, MEMSIM_SAC_TOPK);
    if (sac == GG_SAC_REUSE) {
        vals = gg_sac_take(g);
        idx = gg_sac_take(g);
    } else {
        gg_op(g, "topk");
        vals = gt_empty(g, x->dt, x->nd, sh);
        idx = gt_empty(g, DT_I64, x->nd, sh);
        if (sac == GG_SAC_KEEP) {
            gg_sac_keep(g, vals);
            gg_sac_keep(g, idx);
        }
    }
    AgNode *nd = node_for(g, "TopkBackward0", bw_zeros_like_input, 1, &x, 1);
    if (nd) {
        gn_save(g, nd, idx);
        gn_set_output(nd, vals, 0);
    }
    gt_unref(g, idx);
    return vals;
}
