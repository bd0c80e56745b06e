/* Internal: the op library — what each PyTorch operator allocates, saves for backward and
 * allocates in backward (AUTOGRAD_MEMORY.md §2–§7, §10). Every op takes borrowed tensors
 * and returns a new reference; model code unrefs its variables where Python drops them.
 */
#ifndef MEMSIM_TRACES_OPS_H
#define MEMSIM_TRACES_OPS_H

#include "traces/autograd.h"

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

typedef enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV } BinKind;
typedef enum {
    UN_NEG,
    UN_RSQRT,
    UN_EXP,
    UN_TANH,
    UN_SIGMOID,
    UN_RELU,
    UN_SILU,
    UN_GELU,
    UN_GELU_TANH,
    UN_SQUARE, /* pow(x, 2) */
    UN_CUBE,   /* pow(x, 3) */
    UN_COS,
    UN_SIN,
} UnKind;

/* Autocast: the dtype an op of the lower-precision list runs in for x (casting a copy). */
AgTensor *op_autocast(AgGraph *g, AgTensor *x);

AgTensor *op_to(AgGraph *g, AgTensor *x, DType dt);
AgTensor *op_contiguous(AgGraph *g, AgTensor *x);
AgTensor *op_clone(AgGraph *g, AgTensor *x);
AgTensor *op_view(AgGraph *g, AgTensor *x, int nd, const int64_t *shape);
AgTensor *op_reshape(AgGraph *g, AgTensor *x, int nd, const int64_t *shape);
AgTensor *op_transpose(AgGraph *g, AgTensor *x, int d0, int d1);
AgTensor *op_permute(AgGraph *g, AgTensor *x, const int *perm);
AgTensor *op_unsqueeze(AgGraph *g, AgTensor *x, int dim);
AgTensor *op_expand(AgGraph *g, AgTensor *x, int nd, const int64_t *shape);
AgTensor *op_slice(AgGraph *g, AgTensor *x, int dim, int64_t start, int64_t end);
/* split into equal pieces of `size` along dim: returns n new references in out. */
void op_split(AgGraph *g, AgTensor *x, int dim, int64_t size, AgTensor **out, int n);
AgTensor *op_cat(AgGraph *g, AgTensor **xs, int n, int dim);
void op_split_sizes(AgGraph *g, AgTensor *x, int dim, const int64_t *sizes, AgTensor **out,
                    int nout);

AgTensor *op_binary(AgGraph *g, BinKind k, AgTensor *a, AgTensor *b);
AgTensor *op_scalar(AgGraph *g, BinKind k, AgTensor *a); /* a (op) python scalar */
AgTensor *op_unary(AgGraph *g, UnKind k, AgTensor *x);
AgTensor *op_mean_lastdim(AgGraph *g, AgTensor *x); /* mean(-1, keepdim=True) */
AgTensor *op_where_const(AgGraph *g, AgTensor *cond, AgTensor *x); /* masked_fill / where(c,x,k) */
AgTensor *op_dropout(AgGraph *g, AgTensor *x, double p);

AgTensor *op_embedding(AgGraph *g, AgTensor *weight, AgTensor *ids);
AgTensor *op_linear(AgGraph *g, AgTensor *x, AgTensor *w, AgTensor *b);
/* GPT-2 Conv1D: addmm(b, x.view(-1, nx), W) with W [nx, nf]. */
AgTensor *op_conv1d(AgGraph *g, AgTensor *x, AgTensor *w, AgTensor *b);
AgTensor *op_matmul(AgGraph *g, AgTensor *a, AgTensor *b); /* batched N-D @ N-D */
AgTensor *op_softmax(AgGraph *g, AgTensor *x, DType dt);  /* softmax(-1, dtype=dt) */
AgTensor *op_layer_norm(AgGraph *g, AgTensor *x, AgTensor *w, AgTensor *b);
/* cross_entropy(logits [N,V], labels [N]) = log_softmax + nll_loss; returns the 0-d loss */
AgTensor *op_cross_entropy(AgGraph *g, AgTensor *logits, AgTensor *labels);

/* x[idx] for n row indices of a 2-D x: a copy (n, cols); backward: zeros of x's size with
 * the rows put back (index_put). */
AgTensor *op_gather_rows(AgGraph *g, AgTensor *x, int64_t n);
/* zeros(rows, cols).index_add_(0, idx_i, srcs[i]) for each i; backward: index_select per
 * source. */
AgTensor *op_index_add(AgGraph *g, DType dt, int64_t rows, int64_t cols, AgTensor **srcs, int n);
/* torch.topk(x, k, dim=-1): values (and int64 indices, not returned) allocated; backward:
 * zeros of x's size with the values scattered back. */
AgTensor *op_topk(AgGraph *g, AgTensor *x, int64_t k);

/* Plain allocations with no autograd (arange, ones, zeros, full, comparisons, ...). */
AgTensor *op_new(AgGraph *g, const char *name, DType dt, int nd, const int64_t *shape);

#endif
