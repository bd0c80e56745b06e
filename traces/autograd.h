/* Internal: a small symbolic autograd over shapes, emitting the allocation trace.
 *
 *     AgGraph *g = gg_new(trace, rank, &rules);
 *     AgTensor *w = gg_leaf(g, DT_F32, 2, (int64_t[]){O, H}, true, MEMSIM_CAT_PARAMETER);
 *     AgTensor *x = gg_leaf(g, DT_F32, 3, (int64_t[]){B, S, H}, false, MEMSIM_CAT_INPUT);
 *     AgTensor *y = op_linear(g, x, w, NULL);   // traces/ops.h: allocs, saves, records a node
 *     gt_unref(g, x);                           // Python drops its reference
 *     gg_backward(g, loss);                     // the engine of AUTOGRAD_MEMORY.md §1
 *
 * Tensors are reference-counted objects over reference-counted storages, exactly as Python
 * variables, autograd's saved variables and gradient buffers hold them in PyTorch: a
 * storage is allocated (ALLOC event) when an op creates it and freed (FREE event) when its
 * last reference goes. Nothing about lifetimes is written per model: model code drops its
 * Python references where the Python code would, and the engine releases saved tensors and
 * gradient buffers where autograd does (AUTOGRAD_MEMORY.md §1.2–1.6).
 *
 * Shapes and strides are tracked (strides decide whether a reshape copies and whether a
 * gradient can be stolen or accumulated in place), dtypes too (autocast, upcasts).
 */
#ifndef MEMSIM_TRACES_AUTOGRAD_H
#define MEMSIM_TRACES_AUTOGRAD_H

#include <memsim/gen.h>
#include <memsim/trace.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum { DT_F32, DT_F16, DT_BF16, DT_I64, DT_I32, DT_BOOL, DT_U8, DT_COUNT } DType;

static inline int64_t dt_size(DType d)
{
    static const int64_t s[DT_COUNT] = {4, 2, 2, 8, 4, 1, 1};
    return s[d];
}

#define GT_MAXDIM 6

typedef struct AgStorage {
    uint64_t id;
    uint64_t nbytes;
    int refs;
    uint8_t category;
    bool resident;  /* FALSE while its memory is released (a resharded FlatParameter) */
    uint16_t stream;
    size_t event; /* index of its ALLOC event, to re-categorise it later */
} AgStorage;

struct AgNode;

typedef struct AgTensor { /* a new field needs its initial value in tensor_alloc */
    int refs;
    AgStorage *st;
    int nd;
    int64_t shape[GT_MAXDIM];
    int64_t stride[GT_MAXDIM];
    DType dt;
    bool requires_grad;
    struct AgNode *grad_fn; /* producer (non-leaf) */
    int out_nr;
    struct AgNode *acc;     /* leaf that requires grad: its AccumulateGrad node */
    struct AgTensor *grad;  /* leaf: .grad */
    bool is_leaf;
    /* a parameter autograd sees as a view, not a leaf, in forward (FSDP1's FlatParameter
     * views): autocast casts it at every use instead of caching the cast */
    bool view_in_forward;
} AgTensor;

/* What differs between PyTorch releases (AUTOGRAD_MEMORY.md §12). */
typedef struct {
    bool v113;                  /* torch 1.13 semantics */
    bool mean_saves_input;      /* mean(dim) saves self */
    bool embedding_saves_weight;
    bool accumulate_inplace;    /* InputBuffer accumulates in place when allowed */
    bool matmul_always_folds;
    bool full_slices_recorded;  /* x[:, :, None] records SliceBackward nodes */
    bool checkpoint_early_stop;
    bool cuda;                  /* CUDA kernels (else CPU: e.g. dropout keeps a float noise) */
    uint64_t cublas_workspace;  /* bytes per (cuBLAS handle, stream), from the allocator */
} AgRules;

typedef struct AgGraph AgGraph;

/* A backward function: reads the node's saved tensors and incoming grads (grad_in[i] may be
 * NULL when that output got no gradient), writes one new reference (or NULL) per next edge
 * into grad_out. Temporaries it makes must be freed before it returns. */
typedef void (*AgBackwardFn)(AgGraph *g, struct AgNode *n, AgTensor **grad_in, AgTensor **grad_out);

#define GN_MAXNEXT 16
#define GN_MAXSAVED 8
#define GN_MAXOUT 4

typedef struct AgEdge {
    struct AgNode *node;
    int input_nr;
} AgEdge;

typedef struct AgNode {
    /* Hot fields first: the backward touches each node once, long after it was made, and
     * mark_deps walks every node reachable from its root. */
    uint64_t seq;
    const char *name;
    AgBackwardFn fn;
    int32_t layer; /* the layer whose forward made it, for reports */
    int n_next;
    int deps;
    uint32_t mark; /* the backward pass that last counted this node's dependencies */
    int n_saved;
    int n_out;
    AgTensor *leaf; /* AccumulateGrad: the parameter (not a reference) */
    struct AgCkpt *ckpt; /* the region whose holders this node has */
    AgTensor *buf[GN_MAXOUT];
    AgEdge next[GN_MAXNEXT];
    AgTensor *saved[GN_MAXSAVED];
    /* shape/dtype of each differentiable input, for the grads backward allocates */
    AgTensor *in_meta[GN_MAXNEXT]; /* metadata copies (no storage) */
    int64_t iarg[4];
    double farg[2];
    bool queued;
    int8_t module; /* the module whose forward made it (AgContext.module) */
    void *extra; /* op data owned by the node (freed with g_free) */
    void (*extra_free)(void *);
} AgNode;

typedef struct {
    MemsimPhase phase;
    int32_t layer;
    int8_t module;    /* a model's own tag of the module running outside its layers (0: none):
                       * the backward calls pre_backward_module when it changes */
    int32_t microbatch;
    uint8_t category; /* category for the next allocations (MEMSIM_CAT_*) */
    bool grad_enabled;
    bool in_backward;
    int autocast;     /* 0 off, else the DType of autocast (DT_BF16 / DT_F16) */
    struct AgCkpt *ckpt; /* the checkpointed region being run, if any */
    uint16_t stream;     /* the current stream: where new storages are allocated */
    bool meta_params;    /* parameter leaves get no storage yet (meta device, zero.Init) */
} AgContext;

/* Hooks of a distributed method (all optional). */
typedef struct {
    /* after AccumulateGrad has updated leaf->grad */
    void (*post_accumulate)(struct AgGraph *g, void *user, struct AgTensor *leaf);
    /* the backward engine is about to run the first node of `layer` (pre-backward of the
     * layer's module), and has finished the backward of the layer before it */
    void (*pre_backward_layer)(struct AgGraph *g, void *user, int32_t layer);
    void *user;
    /* the backward engine is about to run the first node made under another module tag
     * (AgContext.module) than the node before it */
    void (*pre_backward_module)(struct AgGraph *g, void *user, int module);
} AgHooks;

/* A checkpointed region (torch.utils.checkpoint, non-reentrant; AUTOGRAD_MEMORY.md §10.1):
 * its first forward keeps no saved tensor (each save becomes an empty holder); the first
 * backward node of the region that needs one reruns `fn` on the kept inputs, and each
 * recomputed save fills its holder, to be freed when the consuming node releases it. */
typedef struct AgTensor *(*AgRegionFn)(struct AgGraph *g, void *user, struct AgTensor **inputs,
                                       int n_inputs);
typedef void (*AgRegionFree)(struct AgGraph *g, void *user);
typedef struct AgCkpt {
    AgRegionFn fn;
    void *user;
    AgRegionFree user_free; /* frees user when the region dies (it may hold references) */
    struct AgTensor *inputs[4];
    int n_inputs;
    bool recomputing;
    bool recomputed;
    GArray *holders; /* (AgNode*, slot) in save order */
    guint next_holder;
    int live_holders;
    int32_t layer;
    int8_t module;
    /* op-level selective checkpointing (torch/utils/checkpoint.py
     * create_selective_checkpoint_contexts with torchtitan's policy): the MemsimSacOp bits of
     * the ops whose outputs are MUST_SAVE (0: a plain checkpoint), the mm counts of the first
     * forward and of the recomputation (torchtitan's meta["forward_mm_count"] and
     * ["recompute_mm_count"]), and the outputs kept by the first forward, oldest first
     * (_CachingTorchDispatchMode's storage, popped by _CachedTorchDispatchMode) */
    guint sac_ops;
    int mm_count[2];
    GQueue *kept;
} AgCkpt;

AgGraph *gg_new(MemsimTrace *trace, guint32 rank, const AgRules *rules);
void gg_free(AgGraph *g);
AgContext *gg_ctx(AgGraph *g);
const AgRules *gg_rules(AgGraph *g);
MemsimTrace *gg_trace(AgGraph *g);

/* Ops and marks: OP events name the running op (its phase and layer from the context). */
void gg_op(AgGraph *g, const char *name);
void gg_mark(AgGraph *g, const char *text);
/* A mark asking the replay for the live bytes by category, kept as `name`
 * (MEMSIM_BREAKDOWN_*, memsim_mark_breakdown). */
void gg_mark_breakdown(AgGraph *g, const char *name);

/* New tensors. Shapes are given as arrays of nd sizes. The tensor has one reference. */
AgTensor *gt_empty(AgGraph *g, DType dt, int nd, const int64_t *shape);
/* A view of t (one new reference to a tensor sharing t's storage). */
AgTensor *gt_view_of(AgGraph *g, AgTensor *t, int nd, const int64_t *shape, const int64_t *stride);
/* Metadata-only copy (no storage), for node in_meta. */
AgTensor *gt_meta(AgGraph *g, AgTensor *t);
AgTensor *gt_ref(AgTensor *t);
void gt_unref(AgGraph *g, AgTensor *t);
/* Sets the category of t's storage (and of its ALLOC event). */
void gt_set_category(AgGraph *g, AgTensor *t, uint8_t cat);

int64_t gt_numel(const AgTensor *t);
int64_t gt_nbytes(const AgTensor *t);
bool gt_is_contiguous(const AgTensor *t);
bool gt_is_dense(const AgTensor *t); /* non-overlapping and dense, any order */
void gt_contiguous_strides(int nd, const int64_t *shape, int64_t *stride);
/* Strides of a view of t with a new shape, if one exists (PyTorch's computeStride). */
bool gt_view_strides(const AgTensor *t, int nd, const int64_t *shape, int64_t *stride);

/* Parameters and inputs (leaves). With ctx.meta_params a parameter's storage is created
 * non-resident (no allocation): the method materialises it itself. */
AgTensor *gg_leaf(AgGraph *g, DType dt, int nd, const int64_t *shape, bool requires_grad,
                 uint8_t category);

/* Nodes. */
AgNode *gn_new(AgGraph *g, const char *name, AgBackwardFn fn, int n_out);
/* Adds the edge for input x (to its producer or accumulator); returns FALSE and adds a null
 * edge when x needs no gradient. */
bool gn_add_input(AgGraph *g, AgNode *n, AgTensor *x);
/* Saves x (a new reference; its storage then counts as an activation). */
void gn_save(AgGraph *g, AgNode *n, AgTensor *x);
/* Makes out the n-th output of node n. */
void gn_set_output(AgNode *n, AgTensor *out, int nr);
/* Whether any input needs a gradient (grad mode on and one input requires grad). */
bool gg_needs_grad(AgGraph *g, int n, AgTensor *const *xs);

/* Runs backward from a scalar loss (allocates the root gradient, ones_like(loss)). */
void gg_backward(AgGraph *g, AgTensor *loss);
/* Runs backward from `out` with the given gradient (a reference it takes; NULL = ones). */
void gg_backward_with(AgGraph *g, AgTensor *out, AgTensor *grad);

/* A storage made directly (flat buffers of distributed methods); resident or not yet. One
 * reference; gg_storage_unref drops it. */
AgStorage *gg_storage_new(AgGraph *g, uint64_t nbytes, bool resident);
void gg_storage_unref(AgGraph *g, AgStorage *st);
/* A leaf tensor viewing a given storage (parameters inside a flat buffer). */
AgTensor *gg_leaf_in(AgGraph *g, AgStorage *st, DType dt, int nd, const int64_t *shape,
                     bool requires_grad);
void gg_record_stream_storage(AgGraph *g, AgStorage *st, uint16_t stream);
/* The host blocks until stream `on` has finished its work so far. */
void gg_host_wait(AgGraph *g, uint16_t on);
/* Host (CPU) memory the program takes (delta > 0) or gives back (< 0): offloaded parameters,
 * gradients, optimizer state; its peak becomes the rank's MemsimRankInfo.host_peak. */
void gg_host(AgGraph *g, int64_t delta);

/* Steady state (MEMSIM_EV_REPEAT; traces/loop.c): the program's position and live set at a
 * unit's boundary. */
typedef struct {
    guint event;      /* events so far */
    uint64_t storage; /* the next storage id */
    guint cost;       /* op cost records so far */
    int64_t live_n, live_bytes, host;
} GgUnitState;
void gg_unit_state(AgGraph *g, GgUnitState *u);
/* A unit starts: gg_unit_repeats sees the units before it as they were here. */
void gg_unit_mark(AgGraph *g);
/* Emits a REPEAT of nothing (a unit boundary); returns its index for gg_repeat_set. */
guint gg_repeat_placeholder(AgGraph *g);
/* Whether unit b (events and ids from `b` to `b_end`) is unit a (from `a` to `a_end`) again:
 * the same events, ops and costs, the ids of tensors made since `before` (the unit before a)
 * moved by as many ids as a made, the others the same, and the live set the same at a's, b's
 * start and b's end. */
bool gg_unit_repeats(AgGraph *g, const GgUnitState *before, const GgUnitState *a,
                     const GgUnitState *a_end, const GgUnitState *b, const GgUnitState *b_end);
/* Makes the placeholder a REPEAT of the `len` events after it, `times` more times. */
void gg_repeat_set(AgGraph *g, guint placeholder, guint len, uint64_t times, uint64_t from,
                   uint64_t shift, uint32_t flags);

/* An op with an estimated duration on the current stream. */
void gg_op_timed(AgGraph *g, const char *name, double duration_us);
/* OP events emitted so far (ops, timed ops, collectives; not gg_host_us). */
uint64_t gg_op_count(const AgGraph *g);
/* Host time with no kernel (MEMSIM_BOUND_HOST): `us` on the host's clock (nothing in untimed
 * traces or for us <= 0). */
void gg_host_us(AgGraph *g, const char *name, double us);
/* A framework module whose measured host time per call is `module_us` (dispatch of the ops it
 * runs included): the host time beyond the dispatch the replay already charges for the ops
 * emitted since gg_op_count gave `ops_before`. */
void gg_host_module(AgGraph *g, const char *name, uint64_t ops_before, double module_us);

/* Runs fn(inputs) as a checkpointed region; returns its output (a new reference). The
 * region keeps references to the inputs, and `user` (the rest of the closure: masks,
 * rotary tables), until its holders are all consumed; then user_free(user) runs. */
AgTensor *gg_checkpoint(AgGraph *g, AgRegionFn fn, void *user, AgRegionFree user_free,
                        AgTensor **inputs, int n);

/* The same with op-level selective checkpointing: the outputs of the ops in `sac_ops`
 * (MemsimSacOp bits; aten.mm: all but every second one) are kept from the first forward and
 * reused by the recomputation (torch.utils.checkpoint with create_selective_checkpoint_contexts,
 * torchtitan's SelectiveAC policy). */
AgTensor *gg_checkpoint_sac(AgGraph *g, guint sac_ops, AgRegionFn fn, void *user,
                            AgRegionFree user_free, AgTensor **inputs, int n);

/* What an op of kind `op` (a MemsimSacOp bit) does about its outputs in the current region:
 * GG_SAC_RUN (not kept, or no SAC region: run as usual), GG_SAC_KEEP (the first forward of a
 * region that keeps it: run, then hand each output to gg_sac_keep, in order) or GG_SAC_REUSE
 * (the recomputation: allocate and compute nothing, take each output from gg_sac_take, in
 * the same order). Each call counts an mm of the region's pass. */
typedef enum { GG_SAC_RUN, GG_SAC_KEEP, GG_SAC_REUSE } GgSacAction;
GgSacAction gg_sac_policy(AgGraph *g, guint op);
/* The region keeps a detached alias of t (t's storage then counts as an activation). */
void gg_sac_keep(AgGraph *g, AgTensor *t);
/* The oldest kept output (a new reference, a detached alias of the forward's tensor). */
AgTensor *gg_sac_take(AgGraph *g);

/* The autocast cast cache (AUTOGRAD_MEMORY.md §8.2): the low-precision copy of a trainable
 * fp32 leaf, made at first use in the region. gg_autocast_clear drops the cache's references
 * at the region's exit. */
AgTensor *gg_autocast_cached(AgGraph *g, AgTensor *leaf);
void gg_autocast_store(AgGraph *g, AgTensor *leaf, AgTensor *copy);
void gg_autocast_clear(AgGraph *g);

void gg_set_hooks(AgGraph *g, const AgHooks *hooks);

/* Releases a storage's memory while the tensors over it live on (FlatParameter resharding,
 * Megatron's deallocate_output_tensor): a FREE event now. */
void gg_storage_release(AgGraph *g, AgStorage *st);
/* Gives a released storage memory again (a new ALLOC, on the current stream). */
void gg_storage_restore(AgGraph *g, AgStorage *st);
/* record_stream(t, stream): t's memory is reusable only once `stream` has passed this
 * point (a USE event). */
void gg_record_stream(AgGraph *g, AgTensor *t, uint16_t stream);
/* `stream` waits for `on`'s work so far (wait_stream / events). */
void gg_wait_stream(AgGraph *g, uint16_t stream, uint16_t on);
/* A collective of `bytes` on the current stream among `group` (an id shared by the ranks
 * that meet), with an estimated duration. */
void gg_collective(AgGraph *g, MemsimCollectiveKind kind, uint64_t bytes, uint64_t group,
                   double duration_us);
/* A send or recv (gg_collective) with the trace rank at the other end (MEMSIM_EVF_PEER). */
void gg_p2p(AgGraph *g, MemsimCollectiveKind kind, uint64_t bytes, uint64_t group,
            uint32_t peer, double duration_us);

/* Op durations (TORCH's time model in sim/replay.c): with rates set, every op of gg_op gets a
 * duration, the larger of its FLOPs (gg_flops) at `flops_per_us` and its memory traffic at
 * `bytes_per_us`, the traffic counted as twice the bytes the op allocates (outputs written,
 * inputs of the same order read). Ops named "empty" and ops that allocate nothing and do no
 * FLOPs stay untimed (views, in-place bookkeeping). Rates of 0: no durations. */
void gg_set_rates(AgGraph *g, double flops_per_us, double bytes_per_us);
/* Adds `traffic` bytes read and written by the last op (gg_op) to its memory-bound time: an
 * in-place op, whose output allocates nothing. */
void gg_bytes(AgGraph *g, double traffic);
/* Adds `flops` to the op being run (the last gg_op). */
void gg_flops(AgGraph *g, double flops);
/* Adds a GEMM's `flops` to the op being run, charged by its waves: `batch` GEMMs whose output
 * is rows × cols, in tiles over the GPU's SMs (gg_set_gpu; none set: the FLOPs as they are). */
void gg_flops_tiles(AgGraph *g, double flops, double batch, double rows, double cols);
/* The rates of a GPU profile: half the tensor-core (fp32: the fp32) peak and 80% of the HBM
 * bandwidth (traces/gpus.c). */
void gg_set_gpu(AgGraph *g, const MemsimGpu *gpu, bool fp32);

/* A GEMM is about to run: the first one on the forward thread and the first on the autograd
 * thread each get a cuBLAS workspace from the caching allocator, kept for the process
 * (DISTRIBUTED.md §7.2). */
void gg_gemm(AgGraph *g);

/* From now on storages die silently (the end of the program: what is alive stays in the
 * trace's final state). */
void gg_teardown(AgGraph *g);

/* Emits ALLOC/FREE events for a storage made outside ops (e.g. optimizer state). */
uint64_t gg_next_storage_id(AgGraph *g);

#endif
