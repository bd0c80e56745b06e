/* The symbolic autograd engine (traces/autograd.h).
 *
 * Written from AUTOGRAD_MEMORY.md §1: nodes save tensors (holding their storages), the
 * backward runs ready nodes highest sequence number first with AccumulateGrad always first
 * (§1.2), gradients with several producers meet in input buffers (§1.3), each node's
 * incoming gradients die when it returns and its saved tensors are released right after
 * (§1.4), AccumulateGrad steals, clones or adds in place (§1.5). Nodes are reference-counted
 * like PyTorch's shared_ptr<Node>: a node lives while a tensor has it as grad_fn or another
 * node has an edge to it, and releases its saved tensors when it dies unreleased.
 */
#include "traces/autograd.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define AG_POOL_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AG_POOL_MALLOC 1
#endif
#endif

/* Tensors, storages and nodes are made and dropped by the million: each kind comes from a
 * free list of its graph, carved from 64 KiB blocks that gg_free releases together. Under
 * AddressSanitizer every object is its own malloc, so that a use after free or a leak is
 * still reported. */
typedef struct PoolBlock {
    struct PoolBlock *next;
    max_align_t pad[]; /* objects start here */
} PoolBlock;

typedef struct {
    gsize size;        /* object size, a multiple of the pointer size */
    void *free;        /* freed objects, linked through their first word */
    PoolBlock *blocks;
    char *cur, *end;   /* the newest block's unused tail */
} Pool;

#define POOL_BLOCK_BYTES (64 * 1024)

static void pool_init(Pool *p, gsize size)
{
    memset(p, 0, sizeof *p);
    p->size = (size + sizeof(void *) - 1) / sizeof(void *) * sizeof(void *);
}

/* An object with undefined contents. */
static inline void *pool_alloc(Pool *p)
{
#ifdef AG_POOL_MALLOC
    return g_malloc(p->size);
#else
    void *o = p->free;
    if (o) {
        p->free = *(void **)o;
    } else {
        if ((gsize)(p->end - p->cur) < p->size) {
            PoolBlock *b = g_malloc(POOL_BLOCK_BYTES);
            b->next = p->blocks;
            p->blocks = b;
            p->cur = (char *)b->pad;
            p->end = (char *)b + POOL_BLOCK_BYTES;
        }
        o = p->cur;
        p->cur += p->size;
    }
    return o;
#endif
}

static inline void *pool_alloc0(Pool *p)
{
    return memset(pool_alloc(p), 0, p->size);
}

static inline void pool_free(Pool *p, void *o)
{
#ifdef AG_POOL_MALLOC
    g_free(o);
#else
    *(void **)o = p->free;
    p->free = o;
#endif
}

static void pool_clear(Pool *p)
{
    while (p->blocks) {
        PoolBlock *b = p->blocks;
        p->blocks = b->next;
        g_free(b);
    }
    p->free = NULL;
    p->cur = p->end = NULL;
}

/* Ops are interned by (name pointer, phase, layer, micro-batch): names are string
 * literals, so pointer identity is enough (a duplicate entry would only repeat a name).
 * An open-addressed table, its keys inline. */
typedef struct {
    const char *name; /* NULL: an empty slot */
    int32_t phase, layer, microbatch;
    guint32 idx;
} OpKey;

typedef struct {
    OpKey *slots;
    guint32 mask; /* slot count - 1 (a power of two) */
    guint32 n;
} OpTable;

/* Op names' string indices by name pointer (a few dozen literals), each hit checked against
 * the string table: interning hashes the whole string. Open-addressed, at most half full. */
typedef struct {
    const char *name; /* NULL: an empty slot */
    guint32 idx;
} NameSlot;

typedef struct {
    NameSlot *slots;
    guint32 mask, n;
} NameTable;

typedef struct {
    guint pos;        /* the OP event */
    guint32 op;       /* its op-table entry (the event is not read back: long evicted) */
    double flops, bytes;
} OpCost;

/* A stack of nodes (also the backward's ready heap). */
typedef struct {
    struct AgNode **v;
    guint len, cap;
} NodeStack;

static inline void ns_push(NodeStack *s, struct AgNode *n)
{
    if (G_UNLIKELY(s->len == s->cap)) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = g_renew(struct AgNode *, s->v, s->cap);
    }
    s->v[s->len++] = n;
}

struct AgGraph {
    MemsimTrace *trace;
    guint32 rank;
    AgRules rules;
    AgContext ctx;
    /* MemsimEvent, handed to the trace by gg_free: the first n_events are written, the
     * array's length is its capacity (appends stay inline) */
    GArray *events;
    guint n_events;
    uint64_t next_storage;
    uint64_t next_seq;
    OpTable op_index;      /* (name, phase, layer, micro-batch) → op index */
    NameTable names;       /* op name → string index */
    NodeStack heap;        /* ready nodes */
    GHashTable *cast_cache; /* leaf → its low-precision copy (a reference) */
    GPtrArray *cast_order;  /* the cached copies in insertion order: released in that order */
    bool teardown;
    AgHooks hooks;
    AgTensor *workspace[2]; /* cuBLAS workspaces: forward thread, autograd thread */
    int64_t host_now, host_peak; /* host (CPU) bytes the program holds: offloaded state */
    int32_t bw_layer; /* layer of the last backward node run (for pre_backward_layer) */
    int bw_module;    /* module tag of the last backward node run (pre_backward_module) */
    uint32_t pass;    /* backward passes so far */
    NodeStack stack; /* scratch for mark_deps */
    NodeStack dying; /* scratch for node_unref: nodes whose last reference went */
    Pool tensors, storages, nodes;
    /* op durations (gg_set_rates): one record per op of gg_op, costed at gg_free */
    double flops_per_us, bytes_per_us;
    double kernel_us; /* the shortest kernel */
    double dispatch_us; /* the host's dispatch of one op (the replay's; gg_host_module) */
    uint64_t n_ops;     /* OP events so far (gg_op_count) */
    int sms;          /* 0: no wave quantization */
    OpCost *costs;    /* n_costs of cap_costs */
    guint n_costs, cap_costs;
    bool costing;     /* the last op is the last record's (allocations add to it) */
    /* the storages allocated now (ALLOC without its FREE), for gg_unit_state */
    int64_t live_n, live_bytes;
    /* categories changed since gg_unit_mark of events before it (Recat, in order): what
     * gg_unit_repeats takes back to see the unit before as it was at its end */
    GArray *recat;
    guint recat_from;
};

typedef struct {
    guint event;
    uint8_t old;
} Recat;

static inline guint32 opkey_hash(const char *name, int32_t phase, int32_t layer, int32_t mb)
{
    /* mixed well: keys differ by one in layer or micro-batch, and the table probes linearly */
    uint64_t h = (uint64_t)(guintptr)name;
    h = (h ^ (uint32_t)phase) * 0x9E3779B97F4A7C15u;
    h = (h ^ (uint32_t)layer) * 0xC2B2AE3D27D4EB4Fu;
    h = (h ^ (uint32_t)mb) * 0x9E3779B97F4A7C15u;
    return (guint32)(h >> 32);
}

static inline guint32 name_hash(const char *name)
{
    uint64_t h = (uint64_t)(guintptr)name * 0x9E3779B97F4A7C15u;
    return (guint32)(h >> 32);
}

static guint32 intern_name(AgGraph *g, const char *name)
{
    NameTable *t = &g->names;
    if (!t->slots) {
        t->slots = g_new0(NameSlot, 256);
        t->mask = 255;
    }
    guint32 j = name_hash(name) & t->mask;
    while (t->slots[j].name) {
        if (t->slots[j].name == name) {
            /* the string a pointer names could have changed (a reused buffer): checked */
            guint32 idx = t->slots[j].idx;
            if (strcmp(memsim_trace_header(g->trace)->strings[idx], name) == 0)
                return idx;
            t->slots[j].idx = memsim_trace_intern(g->trace, name);
            return t->slots[j].idx;
        }
        j = (j + 1) & t->mask;
    }
    guint32 idx = memsim_trace_intern(g->trace, name);
    t->slots[j] = (NameSlot){name, idx};
    if (++t->n * 2 > t->mask) {
        guint32 cap = (t->mask + 1) * 2;
        NameSlot *old = t->slots;
        t->slots = g_new0(NameSlot, cap);
        for (guint32 i = 0; i <= t->mask; i++) {
            if (!old[i].name)
                continue;
            guint32 k = name_hash(old[i].name) & (cap - 1);
            while (t->slots[k].name)
                k = (k + 1) & (cap - 1);
            t->slots[k] = old[i];
        }
        t->mask = cap - 1;
        g_free(old);
    }
    return idx;
}

static void optable_grow(OpTable *t)
{
    guint32 cap = t->slots ? (t->mask + 1) * 2 : 4096;
    OpKey *old = t->slots;
    guint32 old_cap = old ? t->mask + 1 : 0;
    t->slots = g_new0(OpKey, cap);
    t->mask = cap - 1;
    for (guint32 i = 0; i < old_cap; i++) {
        if (!old[i].name)
            continue;
        guint32 j = opkey_hash(old[i].name, old[i].phase, old[i].layer, old[i].microbatch) & t->mask;
        while (t->slots[j].name)
            j = (j + 1) & t->mask;
        t->slots[j] = old[i];
    }
    g_free(old);
}

/* Node reference counts live beside the public fields. */
typedef struct {
    int refs; /* first: beside the node's hot fields */
    AgNode n;
} AgNodeBox;

#define NODE_BOX(node) ((AgNodeBox *)((char *)(node) - offsetof(AgNodeBox, n)))
#define NODE_REFS(node) (NODE_BOX(node)->refs)

static void node_unref(AgGraph *g, AgNode *n);

AgGraph *gg_new(MemsimTrace *trace, guint32 rank, const AgRules *rules)
{
    AgGraph *g = g_new0(AgGraph, 1);
    g->trace = trace;
    g->rank = rank;
    g->rules = *rules;
    g->ctx.phase = MEMSIM_PHASE_OTHER;
    g->ctx.layer = -1;
    g->ctx.microbatch = -1;
    g->ctx.category = MEMSIM_CAT_TEMPORARY;
    g->ctx.grad_enabled = true;
    /* the ranks of one trace are alike: room for as many events as the largest rank made so
     * far, and an eighth more, spares the array its copies while it grows */
    guint reserve = 4096;
    for (guint32 r = 0; r < memsim_trace_header(trace)->n_ranks; r++) {
        gsize n = 0;
        memsim_trace_events(trace, r, &n);
        if (n + n / 8 > reserve)
            reserve = (guint)(n + n / 8);
    }
    g->events = g_array_sized_new(FALSE, FALSE, sizeof(MemsimEvent), reserve);
    g_array_set_size(g->events, reserve);
    g->next_storage = 1;
    g->next_seq = 1;
    optable_grow(&g->op_index);
    g->cast_cache = g_hash_table_new(NULL, NULL);
    g->cast_order = g_ptr_array_new();
    pool_init(&g->tensors, sizeof(AgTensor));
    pool_init(&g->storages, sizeof(AgStorage));
    pool_init(&g->nodes, sizeof(AgNodeBox));
    return g;
}

void gg_set_rates(AgGraph *g, double flops_per_us, double bytes_per_us)
{
    g->flops_per_us = flops_per_us;
    g->bytes_per_us = bytes_per_us;
}

void gg_set_gpu(AgGraph *g, const MemsimGpu *gpu, bool fp32)
{
    if (!gpu) {
        gg_set_rates(g, 0.0, 0.0);
        return;
    }
    /* TFLOP/s = 1e6 FLOP/µs; GB/s = 1e3 B/µs */
    gg_set_rates(g, gpu->compute_efficiency * (fp32 ? gpu->fp32_tflops : gpu->bf16_tflops) * 1e6,
                 gpu->bandwidth_efficiency * gpu->hbm_gbs * 1e3);
    g->sms = gpu->sms;
    g->kernel_us = gpu->kernel_us;
    g->dispatch_us = gpu->dispatch_us;
}

/* Wave quantization (NVIDIA's "Matrix Multiplication Background User's Guide", §"Wave
 * Quantization"): a GEMM's output is cut into tiles of TILE_M × TILE_N (the guide's 256 × 128
 * example tile of cuBLAS's tensor-core kernels), one thread block per tile, and the blocks run
 * in waves of one per SM; a wave that is not full takes as long as a full one. The op is
 * charged the FLOPs of its waves: ⌈tiles / SMs⌉ · SMs · 2 · TILE_M · TILE_N · K. */
#define TILE_M 256.0
#define TILE_N 128.0

void gg_flops_tiles(AgGraph *g, double flops, double batch, double rows, double cols)
{
    if (!g->costing)
        return;
    double q = flops;
    if (g->sms > 0 && batch > 0 && rows > 0 && cols > 0) {
        double k = flops / (2.0 * batch * rows * cols);
        double tiles = batch * ceil(rows / TILE_M) * ceil(cols / TILE_N);
        double waves = ceil(tiles / g->sms);
        double wq = waves * g->sms * 2.0 * TILE_M * TILE_N * k;
        if (wq > q)
            q = wq;
    }
    g->costs[g->n_costs - 1].flops += q;
}

void gg_bytes(AgGraph *g, double traffic)
{
    if (g->costing)
        g->costs[g->n_costs - 1].bytes += traffic / 2.0; /* apply_costs counts 2 × bytes */
}

void gg_flops(AgGraph *g, double flops)
{
    if (g->costing)
        g->costs[g->n_costs - 1].flops += flops;
}

/* Gives each costed op its duration: a copy of its op-table entry with the duration, shared
 * by the ops of equal entry and duration (an open-addressed table of (entry, duration) →
 * copy, at most half full). */
typedef struct {
    uint64_t op;
    uint64_t dur;  /* the duration's bits (positive: equal bits ⇔ equal values) */
    guint32 idx1;  /* the copy's index + 1; 0: an empty slot */
} TimedSlot;

static inline guint32 timed_hash(uint64_t op, uint64_t bits)
{
    uint64_t hash = (op * 0x9E3779B97F4A7C15u) ^ (bits * 0xC2B2AE3D27D4EB4Fu);
    return (guint32)(hash ^ (hash >> 29));
}

static TimedSlot *timed_grow(TimedSlot *old, guint32 old_cap, guint32 cap)
{
    TimedSlot *t = g_new0(TimedSlot, cap);
    for (guint32 i = 0; i < old_cap; i++) {
        if (!old[i].idx1)
            continue;
        guint32 k = timed_hash(old[i].op, old[i].dur) & (cap - 1);
        while (t[k].idx1)
            k = (k + 1) & (cap - 1);
        t[k] = old[i];
    }
    g_free(old);
    return t;
}

static void apply_costs(AgGraph *g)
{
    if (!g->n_costs)
        return;
    MemsimTraceHeader *h = memsim_trace_header(g->trace);
    /* sized once for every op that can get a duration (no rehashing as it fills) */
    guint64 want = 2 * (guint64)MIN(g->n_costs, h->n_ops) + 2;
    guint32 cap = 1024, n = 0;
    while (cap < want && cap < (1u << 30))
        cap *= 2;
    TimedSlot *timed = g_new0(TimedSlot, cap);
    MemsimEvent *ev = (MemsimEvent *)g->events->data;
    for (guint i = 0; i < g->n_costs; i++) {
        const OpCost *c = &g->costs[i];
        double t = c->flops / g->flops_per_us;
        double m = 2.0 * c->bytes / g->bytes_per_us;
        double dur = t > m ? t : m;
        if (!(dur > 0.0))
            continue;
        uint8_t bound = t > m ? MEMSIM_BOUND_COMPUTE : MEMSIM_BOUND_MEMORY;
        if (dur < g->kernel_us) {
            dur = g->kernel_us;
            bound = MEMSIM_BOUND_LATENCY;
        }
        uint64_t op = c->op, bits;
        memcpy(&bits, &dur, sizeof bits);
        guint32 k = timed_hash(op, bits) & (cap - 1);
        while (timed[k].idx1 && (timed[k].op != op || timed[k].dur != bits))
            k = (k + 1) & (cap - 1);
        if (timed[k].idx1) {
            ev[c->pos].id = timed[k].idx1 - 1;
            continue;
        }
        MemsimOpInfo info = h->ops[op];
        info.duration_us = dur;
        info.bound = bound;
        guint32 idx = memsim_trace_add_op(g->trace, &info);
        h = memsim_trace_header(g->trace);
        timed[k] = (TimedSlot){op, bits, idx + 1};
        ev[c->pos].id = idx;
        if (++n * 2 > cap) {
            timed = timed_grow(timed, cap, cap * 2);
            cap *= 2;
        }
    }
    g_free(timed);
}

void gg_free(AgGraph *g)
{
    if (!g)
        return;
    g->teardown = true;
    if (g->host_peak > 0)
        memsim_trace_header(g->trace)->ranks[g->rank].host_peak = (uint64_t)g->host_peak;
    for (int i = 0; i < 2; i++)
        gt_unref(g, g->workspace[i]);
    apply_costs(g);
    g_free(g->costs);
    if (g->recat)
        g_array_unref(g->recat);
    g_array_set_size(g->events, g->n_events);
    memsim_trace_append_array(g->trace, g->rank, g->events);
    g->events = NULL;
    g_free(g->op_index.slots);
    g_free(g->names.slots);
    g_free(g->heap.v);
    g_assert(g_hash_table_size(g->cast_cache) == 0);
    g_hash_table_unref(g->cast_cache);
    g_ptr_array_unref(g->cast_order);
    g_free(g->stack.v);
    g_free(g->dying.v);
    pool_clear(&g->tensors);
    pool_clear(&g->storages);
    pool_clear(&g->nodes);
    g_free(g);
}

AgContext *gg_ctx(AgGraph *g)
{
    return &g->ctx;
}

const AgRules *gg_rules(AgGraph *g)
{
    return &g->rules;
}

MemsimTrace *gg_trace(AgGraph *g)
{
    return g->trace;
}

static inline void emit(AgGraph *g, const MemsimEvent *ev)
{
    if (G_UNLIKELY(g->n_events == g->events->len))
        g_array_set_size(g->events, g->events->len * 2);
    ((MemsimEvent *)g->events->data)[g->n_events++] = *ev;
    if (ev->kind == MEMSIM_EV_ALLOC) {
        g->live_n++;
        g->live_bytes += (int64_t)ev->size;
        if (g->costing)
            g->costs[g->n_costs - 1].bytes += (double)ev->size;
    }
}

/* A FREE of a storage of `nbytes`. */
static inline void emit_free(AgGraph *g, const AgStorage *st)
{
    MemsimEvent ev = {.kind = MEMSIM_EV_FREE, .id = st->id, .stream = st->stream};
    emit(g, &ev);
    g->live_n--;
    g->live_bytes -= (int64_t)st->nbytes;
}

void gg_op(AgGraph *g, const char *name)
{
    OpTable *tab = &g->op_index;
    int32_t phase = g->ctx.phase, layer = g->ctx.layer, mb = g->ctx.microbatch;
    guint32 j = opkey_hash(name, phase, layer, mb) & tab->mask;
    guint32 idx;
    for (;;) {
        OpKey *k = &tab->slots[j];
        if (!k->name) {
            MemsimOpInfo op = {.name = intern_name(g, name),
                               .phase = (uint8_t)phase,
                               .layer = layer,
                               .microbatch = mb};
            idx = memsim_trace_add_op(g->trace, &op);
            *k = (OpKey){name, phase, layer, mb, idx};
            if (++tab->n * 2 > tab->mask)
                optable_grow(tab);
            break;
        }
        if (k->name == name && k->phase == phase && k->layer == layer && k->microbatch == mb) {
            idx = k->idx;
            break;
        }
        j = (j + 1) & tab->mask;
    }
    MemsimEvent ev = {.kind = MEMSIM_EV_OP, .id = idx, .stream = g->ctx.stream};
    emit(g, &ev);
    g->n_ops++;
    g->costing = g->flops_per_us > 0.0 && (name[0] != 'e' || strcmp(name, "empty") != 0);
    if (g->costing) {
        if (g->n_costs == g->cap_costs) {
            g->cap_costs = g->cap_costs ? 2 * g->cap_costs : 1024;
            g->costs = g_renew(OpCost, g->costs, g->cap_costs);
        }
        g->costs[g->n_costs++] = (OpCost){g->n_events - 1, idx, 0.0, 0.0};
    }
}

void gg_mark(AgGraph *g, const char *text)
{
    MemsimEvent ev = {.kind = MEMSIM_EV_MARK, .id = memsim_trace_intern(g->trace, text)};
    emit(g, &ev);
}

void gg_mark_breakdown(AgGraph *g, const char *name)
{
    g_autofree char *text = memsim_mark_breakdown(name);
    gg_mark(g, text);
}

uint64_t gg_next_storage_id(AgGraph *g)
{
    return g->next_storage++;
}

/* ---- tensors ---- */

int64_t gt_numel(const AgTensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->nd; i++)
        n *= t->shape[i];
    return n;
}

int64_t gt_nbytes(const AgTensor *t)
{
    return gt_numel(t) * dt_size(t->dt);
}

void gt_contiguous_strides(int nd, const int64_t *shape, int64_t *stride)
{
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
}

bool gt_is_contiguous(const AgTensor *t)
{
    int64_t s = 1;
    for (int i = t->nd - 1; i >= 0; i--) {
        if (t->shape[i] == 1)
            continue;
        if (t->stride[i] != s)
            return false;
        s *= t->shape[i];
    }
    return true;
}

bool gt_is_dense(const AgTensor *t)
{
    /* Non-overlapping and dense in some dimension order: sort dims by stride. */
    int idx[GT_MAXDIM], n = 0;
    for (int i = 0; i < t->nd; i++)
        if (t->shape[i] != 1)
            idx[n++] = i;
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && t->stride[idx[b]] < t->stride[idx[b - 1]]; b--) {
            int tmp = idx[b];
            idx[b] = idx[b - 1];
            idx[b - 1] = tmp;
        }
    int64_t s = 1;
    for (int k = 0; k < n; k++) {
        if (t->stride[idx[k]] != s)
            return false;
        s *= t->shape[idx[k]];
    }
    return true;
}

bool gt_view_strides(const AgTensor *t, int nd, const int64_t *shape, int64_t *stride)
{
    /* PyTorch's computeStride: walk the old dims in chunks that are contiguous among
     * themselves and map the new dims onto them. */
    int64_t numel = gt_numel(t);
    if (numel == 0) {
        gt_contiguous_strides(nd, shape, stride);
        return true;
    }
    int view_d = nd - 1;
    int64_t chunk_base_stride = t->nd ? t->stride[t->nd - 1] : 1;
    int64_t tensor_numel = 1, view_numel = 1;
    for (int tensor_d = t->nd - 1; tensor_d >= 0; tensor_d--) {
        tensor_numel *= t->shape[tensor_d];
        if (tensor_d == 0 ||
            (t->shape[tensor_d - 1] != 1 &&
             t->stride[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                stride[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel)
                return false;
            if (tensor_d > 0) {
                chunk_base_stride = t->stride[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

/* A tensor of one reference, no storage; contiguous unless `stride` is given. */
static AgTensor *tensor_alloc(AgGraph *g, int nd, const int64_t *shape, const int64_t *stride,
                              DType dt)
{
    g_assert(nd >= 0 && nd <= GT_MAXDIM);
    AgTensor *t = pool_alloc(&g->tensors);
    /* field by field: a compound literal becomes a `rep stos`, slow to start at this size */
    t->refs = 1;
    t->st = NULL;
    t->nd = nd;
    t->dt = dt;
    t->requires_grad = false;
    t->grad_fn = NULL;
    t->out_nr = 0;
    t->acc = NULL;
    t->grad = NULL;
    t->is_leaf = false;
    t->view_in_forward = false;
    memset(t->shape, 0, sizeof t->shape);
    memset(t->stride, 0, sizeof t->stride);
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        g_assert(shape[i] >= 0);
        t->shape[i] = shape[i];
        t->stride[i] = stride ? stride[i] : s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
    return t;
}

AgTensor *gt_empty(AgGraph *g, DType dt, int nd, const int64_t *shape)
{
    AgTensor *t = tensor_alloc(g, nd, shape, NULL, dt);
    AgStorage *st = pool_alloc0(&g->storages);
    st->id = g->next_storage++;
    st->nbytes = (uint64_t)gt_nbytes(t);
    st->refs = 1;
    st->category = g->ctx.category;
    st->resident = true;
    st->stream = g->ctx.stream;
    t->st = st;
    if (st->nbytes > 0) {
        st->event = g->n_events;
        MemsimEvent ev = {.kind = MEMSIM_EV_ALLOC, .id = st->id, .size = st->nbytes,
                          .category = st->category, .stream = st->stream};
        emit(g, &ev);
    }
    return t;
}

AgTensor *gt_view_of(AgGraph *g, AgTensor *t, int nd, const int64_t *shape, const int64_t *stride)
{
    AgTensor *v = tensor_alloc(g, nd, shape, stride, t->dt);
    v->st = t->st;
    if (v->st)
        v->st->refs++;
    return v;
}

AgTensor *gt_meta(AgGraph *g, AgTensor *t)
{
    return tensor_alloc(g, t->nd, t->shape, t->stride, t->dt);
}

AgTensor *gt_ref(AgTensor *t)
{
    if (t)
        t->refs++;
    return t;
}

static void storage_unref(AgGraph *g, AgStorage *st)
{
    if (!st || --st->refs > 0)
        return;
    if (st->nbytes > 0 && st->resident && !g->teardown)
        emit_free(g, st);
    pool_free(&g->storages, st);
}

void gt_unref(AgGraph *g, AgTensor *t)
{
    if (!t || --t->refs > 0)
        return;
    storage_unref(g, t->st);
    if (t->grad_fn)
        node_unref(g, t->grad_fn);
    if (t->acc)
        node_unref(g, t->acc);
    if (t->grad)
        gt_unref(g, t->grad);
    pool_free(&g->tensors, t);
}

void gt_set_category(AgGraph *g, AgTensor *t, uint8_t cat)
{
    if (!t || !t->st || t->st->nbytes == 0)
        return;
    MemsimEvent *ev = &g_array_index(g->events, MemsimEvent, t->st->event);
    if (t->st->event < g->recat_from && ev->category != cat) {
        Recat r = {t->st->event, ev->category};
        g_array_append_val(g->recat, r);
    }
    t->st->category = cat;
    ev->category = cat;
}

AgTensor *gg_leaf(AgGraph *g, DType dt, int nd, const int64_t *shape, bool requires_grad,
                 uint8_t category)
{
    uint8_t old = g->ctx.category;
    g->ctx.category = category;
    AgTensor *t;
    if (g->ctx.meta_params && category == MEMSIM_CAT_PARAMETER) {
        t = tensor_alloc(g, nd, shape, NULL, dt);
        t->st = gg_storage_new(g, (uint64_t)gt_nbytes(t), false);
    } else {
        t = gt_empty(g, dt, nd, shape);
    }
    g->ctx.category = old;
    t->is_leaf = true;
    t->requires_grad = requires_grad;
    return t;
}

/* ---- nodes ---- */

AgNode *gn_new(AgGraph *g, const char *name, AgBackwardFn fn, int n_out)
{
    g_assert(n_out >= 1 && n_out <= GN_MAXOUT);
    AgNodeBox *b = pool_alloc0(&g->nodes);
    b->n.seq = g->next_seq++;
    b->n.name = name;
    b->n.fn = fn;
    b->n.n_out = n_out;
    b->n.layer = g->ctx.layer;
    b->n.module = g->ctx.module;
    b->refs = 0;
    return &b->n;
}

static AgNode *accumulator(AgGraph *g, AgTensor *leaf)
{
    if (!leaf->acc) {
        AgNodeBox *b = pool_alloc0(&g->nodes);
        b->n.seq = UINT64_MAX;
        b->n.name = "AccumulateGrad";
        b->n.n_out = 1;
        b->n.leaf = leaf;
        b->refs = 1; /* held by the leaf */
        leaf->acc = &b->n;
    }
    return leaf->acc;
}

bool gn_add_input(AgGraph *g, AgNode *n, AgTensor *x)
{
    g_assert(n->n_next < GN_MAXNEXT);
    int i = n->n_next++;
    n->in_meta[i] = x ? gt_meta(g, x) : NULL;
    if (!x || !x->requires_grad) {
        n->next[i].node = NULL;
        return false;
    }
    AgNode *to = x->is_leaf ? accumulator(g, x) : x->grad_fn;
    if (!to) {
        n->next[i].node = NULL;
        return false;
    }
    n->next[i].node = to;
    n->next[i].input_nr = x->is_leaf ? 0 : x->out_nr;
    NODE_REFS(to)++;
    return true;
}

typedef struct {
    AgNode *node;
    int slot;
} Holder;

void gn_save(AgGraph *g, AgNode *n, AgTensor *x)
{
    g_assert(n->n_saved < GN_MAXSAVED);
    if (!x)
        return;
    AgCkpt *ck = g->ctx.ckpt;
    if (ck && !ck->recomputing) {
        /* first forward of a checkpointed region: an empty holder */
        Holder h = {n, n->n_saved};
        n->saved[n->n_saved++] = NULL;
        n->ckpt = ck;
        g_array_append_val(ck->holders, h);
        ck->live_holders++;
        return;
    }
    if (ck && ck->recomputing) {
        /* recomputation: the k-th save fills the k-th holder of the original forward */
        if (ck->next_holder < ck->holders->len) {
            Holder *h = &g_array_index(ck->holders, Holder, ck->next_holder++);
            if (h->node)
                h->node->saved[h->slot] = gt_ref(x);
            if (x->st && x->st->category == MEMSIM_CAT_TEMPORARY)
                gt_set_category(g, x, MEMSIM_CAT_ACTIVATION);
        }
        return;
    }
    n->saved[n->n_saved++] = gt_ref(x);
    /* A storage an op keeps for backward is an activation unless it is something more
     * specific already (a parameter, an input). */
    if (x->st && x->st->category == MEMSIM_CAT_TEMPORARY)
        gt_set_category(g, x, MEMSIM_CAT_ACTIVATION);
}

void gn_set_output(AgNode *n, AgTensor *out, int nr)
{
    out->grad_fn = n;
    out->out_nr = nr;
    out->requires_grad = true;
    out->is_leaf = false;
    NODE_REFS(n)++;
}

bool gg_needs_grad(AgGraph *g, int n, AgTensor *const *xs)
{
    if (!g->ctx.grad_enabled)
        return false;
    for (int i = 0; i < n; i++)
        if (xs[i] && xs[i]->requires_grad)
            return true;
    return false;
}

static void ckpt_holder_done(AgGraph *g, AgCkpt *ck)
{
    if (--ck->live_holders > 0)
        return;
    for (int i = 0; i < ck->n_inputs; i++)
        gt_unref(g, ck->inputs[i]);
    /* outputs kept for a recomputation that never came */
    if (ck->kept) {
        AgTensor *t;
        while ((t = g_queue_pop_head(ck->kept)))
            gt_unref(g, t);
        g_queue_free(ck->kept);
    }
    if (ck->user_free)
        ck->user_free(g, ck->user);
    g_array_unref(ck->holders);
    g_free(ck);
}

static void node_release_saved(AgGraph *g, AgNode *n)
{
    AgCkpt *ck = n->ckpt;
    int holders = 0;
    for (int i = 0; i < n->n_saved; i++)
        gt_unref(g, n->saved[i]);
    if (ck) {
        for (guint k = 0; k < ck->holders->len; k++) {
            Holder *h = &g_array_index(ck->holders, Holder, k);
            if (h->node == n) {
                h->node = NULL;
                holders++;
            }
        }
    }
    n->n_saved = 0;
    n->ckpt = NULL;
    while (ck && holders-- > 0)
        ckpt_holder_done(g, ck);
}

static void recompute(AgGraph *g, AgCkpt *ck)
{
    AgContext saved = g->ctx;
    g->ctx.ckpt = ck;
    g->ctx.grad_enabled = true;
    g->ctx.in_backward = false;
    g->ctx.layer = ck->layer;
    g->ctx.module = ck->module;
    g->ctx.category = MEMSIM_CAT_TEMPORARY;
    ck->recomputing = true;
    ck->next_holder = 0;
    ck->mm_count[1] = 0;
    AgTensor *out = ck->fn(g, ck->user, ck->inputs, ck->n_inputs);
    gt_unref(g, out); /* the recomputed graph is discarded */
    ck->recomputing = false;
    ck->recomputed = true;
    g->ctx = saved;
}

AgTensor *gg_checkpoint(AgGraph *g, AgRegionFn fn, void *user, AgRegionFree user_free,
                        AgTensor **inputs, int n)
{
    return gg_checkpoint_sac(g, 0, fn, user, user_free, inputs, n);
}

GgSacAction gg_sac_policy(AgGraph *g, guint op)
{
    AgCkpt *ck = g->ctx.ckpt;
    if (!ck || !ck->sac_ops || g->ctx.in_backward)
        return GG_SAC_RUN;
    int pass = ck->recomputing ? 1 : 0;
    /* torchtitan SelectiveAC._wrap_block's policy: each aten.mm counts in its pass; the
     * ops of the save list are MUST_SAVE, except every second mm; the rest PREFER_RECOMPUTE */
    if (op == MEMSIM_SAC_MM)
        ck->mm_count[pass]++;
    if (!(ck->sac_ops & op) || (op == MEMSIM_SAC_MM && ck->mm_count[pass] % 2 == 0))
        return GG_SAC_RUN;
    return pass ? GG_SAC_REUSE : GG_SAC_KEEP;
}

void gg_sac_keep(AgGraph *g, AgTensor *t)
{
    AgCkpt *ck = g->ctx.ckpt;
    g_assert(ck && ck->sac_ops && !ck->recomputing);
    if (!ck->kept)
        ck->kept = g_queue_new();
    /* _CachingTorchDispatchMode stores the output detached (a new tensor, same storage) */
    g_queue_push_tail(ck->kept, t ? gt_view_of(g, t, t->nd, t->shape, t->stride) : NULL);
    if (t && t->st && t->st->category == MEMSIM_CAT_TEMPORARY)
        gt_set_category(g, t, MEMSIM_CAT_ACTIVATION);
}

AgTensor *gg_sac_take(AgGraph *g)
{
    AgCkpt *ck = g->ctx.ckpt;
    g_assert(ck && ck->recomputing && ck->kept && !g_queue_is_empty(ck->kept));
    return g_queue_pop_head(ck->kept);
}

AgTensor *gg_checkpoint_sac(AgGraph *g, guint sac_ops, AgRegionFn fn, void *user,
                            AgRegionFree user_free, AgTensor **inputs, int n)
{
    g_assert(n <= 4);
    if (!g->ctx.grad_enabled) {
        AgTensor *out = fn(g, user, inputs, n);
        if (user_free)
            user_free(g, user);
        return out;
    }
    AgCkpt *ck = g_new0(AgCkpt, 1);
    ck->fn = fn;
    ck->user = user;
    ck->user_free = user_free;
    ck->n_inputs = n;
    ck->layer = g->ctx.layer;
    ck->module = g->ctx.module;
    ck->sac_ops = sac_ops;
    ck->holders = g_array_new(FALSE, FALSE, sizeof(Holder));
    for (int i = 0; i < n; i++) {
        ck->inputs[i] = gt_ref(inputs[i]);
        /* kept for the recomputation in backward (torch/utils/checkpoint.py: the
         * non-reentrant _CheckpointFrame.save_inputs stores them as saved tensors, the
         * reentrant CheckpointFunction.forward ctx.save_for_backward(*tensor_inputs)): an
         * activation from the checkpoint on, not only once the recomputation's first op
         * saves one again (gn_save) */
        if (inputs[i] && inputs[i]->st && inputs[i]->st->category == MEMSIM_CAT_TEMPORARY)
            gt_set_category(g, inputs[i], MEMSIM_CAT_ACTIVATION);
    }
    ck->live_holders = 1; /* the region itself, until its forward ends */
    AgCkpt *outer = g->ctx.ckpt;
    g->ctx.ckpt = ck;
    AgTensor *out = fn(g, user, inputs, n);
    g->ctx.ckpt = outer;
    ckpt_holder_done(g, ck);
    return out;
}

static void node_unref(AgGraph *g, AgNode *n)
{
    /* Nodes to drop a reference of, on the graph's scratch stack above `base` (releasing a
     * node's saved tensors can come back here). */
    NodeStack *stack = &g->dying;
    guint base = stack->len;
    for (;;) {
        if (--NODE_REFS(n) == 0) {
            node_release_saved(g, n);
            for (int i = 0; i < n->n_out; i++)
                if (n->buf[i]) {
                    gt_unref(g, n->buf[i]);
                    n->buf[i] = NULL;
                }
            for (int i = 0; i < n->n_next; i++) {
                if (n->in_meta[i])
                    pool_free(&g->tensors, n->in_meta[i]);
                if (n->next[i].node)
                    ns_push(stack, n->next[i].node);
            }
            if (n->extra_free)
                n->extra_free(n->extra);
            pool_free(&g->nodes, NODE_BOX(n));
        }
        if (stack->len == base)
            break;
        n = stack->v[--stack->len];
    }
}

/* ---- backward ---- */

static void heap_push(AgGraph *g, AgNode *n)
{
    NodeStack *h = &g->heap;
    ns_push(h, n);
    guint i = h->len - 1;
    while (i > 0) {
        guint p = (i - 1) / 2;
        AgNode *a = h->v[p], *b = h->v[i];
        if (a->seq >= b->seq)
            break;
        h->v[p] = b;
        h->v[i] = a;
        i = p;
    }
}

static AgNode *heap_pop(AgGraph *g)
{
    NodeStack *h = &g->heap;
    AgNode *top = h->v[0];
    h->v[0] = h->v[h->len - 1];
    h->len--;
    guint i = 0;
    for (;;) {
        guint l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->len && h->v[l]->seq > h->v[m]->seq)
            m = l;
        if (r < h->len && h->v[r]->seq > h->v[m]->seq)
            m = r;
        if (m == i)
            break;
        AgNode *tmp = h->v[m];
        h->v[m] = h->v[i];
        h->v[i] = tmp;
        i = m;
    }
    return top;
}

/* The input buffer of a node: the first gradient is kept as is, later ones accumulated
 * (§1.3): in place when the rules allow and the buffer holds the only reference to a dense
 * tensor, else out of place (a new tensor, then both operands released). */
static void buffer_add(AgGraph *g, AgNode *n, int slot, AgTensor *t)
{
    g_assert(slot < n->n_out);
    AgTensor *old = n->buf[slot];
    if (!old) {
        n->buf[slot] = t;
        return;
    }
    if (g->rules.accumulate_inplace && old->refs == 1 && old->st && old->st->refs == 1 &&
        gt_is_dense(old) && old->st->nbytes == (uint64_t)gt_nbytes(old)) {
        gt_unref(g, t);
        return;
    }
    gg_op(g, "add");
    AgTensor *sum = gt_empty(g, old->dt, old->nd, old->shape);
    n->buf[slot] = sum;
    gt_unref(g, old);
    gt_unref(g, t);
}

static void accumulate_grad(AgGraph *g, AgNode *n, AgTensor *grad)
{
    AgTensor *p = n->leaf;
    if (!grad)
        return;
    gg_op(g, "AccumulateGrad");
    if (!p->grad) {
        bool same_layout = grad->nd == p->nd;
        for (int i = 0; same_layout && i < p->nd; i++)
            same_layout = grad->shape[i] == p->shape[i] &&
                          (p->shape[i] == 1 || grad->stride[i] == p->stride[i]);
        if (grad->refs == 1 && grad->st && grad->st->refs == 1 &&
            grad->st->nbytes == (uint64_t)gt_nbytes(grad) && same_layout) {
            p->grad = grad; /* stolen */
        } else {
            p->grad = gt_empty(g, p->dt, p->nd, p->shape); /* layout-obeying clone */
            gt_unref(g, grad);
        }
        gt_set_category(g, p->grad, MEMSIM_CAT_GRADIENT);
    } else {
        gt_unref(g, grad); /* .grad += grad in place */
    }
    if (g->hooks.post_accumulate)
        g->hooks.post_accumulate(g, g->hooks.user, p);
}

static void mark_deps(AgGraph *g, AgNode *root)
{
    /* Count, for each node reachable from root, the edges that point to it; a node is
     * visited once per pass (its mark is the pass number). */
    uint32_t pass = ++g->pass;
    NodeStack *stack = &g->stack;
    stack->len = 0;
    ns_push(stack, root);
    root->mark = pass;
    root->deps = 0;
    while (stack->len) {
        AgNode *n = stack->v[--stack->len];
        for (int i = 0; i < n->n_next; i++) {
            AgNode *m = n->next[i].node;
            if (!m)
                continue;
            if (m->mark != pass) {
                m->mark = pass;
                m->deps = 0;
                ns_push(stack, m);
            }
            m->deps++;
        }
    }
}

void gg_backward(AgGraph *g, AgTensor *loss)
{
    gg_backward_with(g, loss, NULL);
}

void gg_backward_with(AgGraph *g, AgTensor *loss, AgTensor *grad)
{
    AgNode *root = loss->grad_fn;
    if (!root) {
        gt_unref(g, grad);
        return;
    }
    AgContext saved = g->ctx;
    g->ctx.in_backward = true;
    g->ctx.grad_enabled = false;
    g->ctx.phase = MEMSIM_PHASE_BACKWARD;
    g->ctx.category = MEMSIM_CAT_TEMPORARY;
    g->ctx.layer = -1;
    NODE_REFS(root)++; /* the engine holds the graph task's root */
    g->bw_layer = -2;
    g->bw_module = -1;
    mark_deps(g, root);
    AgTensor *go = grad;
    if (!go) {
        gg_op(g, "ones_like");
        go = gt_empty(g, loss->dt, loss->nd, loss->shape);
    }
    buffer_add(g, root, loss->out_nr, go);
    heap_push(g, root);
    while (g->heap.len) {
        AgNode *n = heap_pop(g);
        AgTensor *in[GN_MAXOUT] = {0};
        for (int i = 0; i < n->n_out; i++) {
            in[i] = n->buf[i];
            n->buf[i] = NULL;
        }
        if (n->leaf) {
            accumulate_grad(g, n, in[0]);
            continue;
        }
        if (n->module != g->bw_module) {
            if (g->hooks.pre_backward_module)
                g->hooks.pre_backward_module(g, g->hooks.user, n->module);
            g->bw_module = n->module;
        }
        if (n->layer != g->bw_layer) {
            if (n->layer >= 0 && g->hooks.pre_backward_layer)
                g->hooks.pre_backward_layer(g, g->hooks.user, n->layer);
            g->bw_layer = n->layer;
        }
        g->ctx.layer = n->layer;
        gg_op(g, n->name);
        AgTensor *out[GN_MAXNEXT] = {0};
        bool any = false;
        for (int i = 0; i < n->n_out; i++)
            any |= in[i] != NULL;
        if (n->ckpt && !n->ckpt->recomputed)
            recompute(g, n->ckpt);
        if (any && n->fn)
            n->fn(g, n, in, out);
        for (int i = 0; i < n->n_out; i++)
            gt_unref(g, in[i]);
        node_release_saved(g, n);
        for (int i = 0; i < n->n_next; i++) {
            AgNode *m = n->next[i].node;
            if (!m) {
                gt_unref(g, out[i]);
                continue;
            }
            if (out[i])
                buffer_add(g, m, n->next[i].input_nr, out[i]);
            if (--m->deps == 0)
                heap_push(g, m);
        }
    }
    node_unref(g, root);
    g->ctx = saved;
}

AgTensor *gg_autocast_cached(AgGraph *g, AgTensor *leaf)
{
    return g_hash_table_lookup(g->cast_cache, leaf);
}

void gg_autocast_store(AgGraph *g, AgTensor *leaf, AgTensor *copy)
{
    g_hash_table_insert(g->cast_cache, leaf, gt_ref(copy));
    g_ptr_array_add(g->cast_order, copy);
}

void gg_autocast_clear(AgGraph *g)
{
    /* in insertion order, so the trace does not depend on where objects were allocated */
    g_hash_table_remove_all(g->cast_cache);
    for (guint i = 0; i < g->cast_order->len; i++)
        gt_unref(g, g->cast_order->pdata[i]);
    g_ptr_array_set_size(g->cast_order, 0);
}

void gg_teardown(AgGraph *g)
{
    g->teardown = true;
}

void gg_set_hooks(AgGraph *g, const AgHooks *hooks)
{
    g->hooks = *hooks;
}

void gg_storage_release(AgGraph *g, AgStorage *st)
{
    if (!st->resident)
        return;
    if (st->nbytes > 0)
        emit_free(g, st);
    st->resident = false;
}

void gg_storage_restore(AgGraph *g, AgStorage *st)
{
    if (st->resident)
        return;
    g->costing = false; /* not an op's output */
    st->resident = true;
    st->id = g->next_storage++;
    st->stream = g->ctx.stream;
    if (st->nbytes > 0) {
        st->event = g->n_events;
        MemsimEvent ev = {.kind = MEMSIM_EV_ALLOC, .id = st->id, .size = st->nbytes,
                          .category = st->category, .stream = st->stream};
        emit(g, &ev);
    }
}

void gg_record_stream(AgGraph *g, AgTensor *t, uint16_t stream)
{
    if (!t || !t->st || !t->st->resident || t->st->nbytes == 0 || t->st->stream == stream)
        return;
    MemsimEvent ev = {.kind = MEMSIM_EV_USE, .id = t->st->id, .stream = stream};
    emit(g, &ev);
}

void gg_wait_stream(AgGraph *g, uint16_t stream, uint16_t on)
{
    if (stream == on)
        return;
    MemsimEvent ev = {.kind = MEMSIM_EV_WAIT, .stream = stream, .id = on};
    emit(g, &ev);
}

void gg_collective(AgGraph *g, MemsimCollectiveKind kind, uint64_t bytes, uint64_t group,
                   double duration_us)
{
    MemsimOpInfo op = {.name = memsim_trace_intern(g->trace, memsim_collective_name(kind)),
                       .phase = MEMSIM_PHASE_COMMUNICATION,
                       .layer = g->ctx.layer,
                       .microbatch = g->ctx.microbatch,
                       .duration_us = duration_us};
    guint32 idx = memsim_trace_add_op(g->trace, &op);
    MemsimEvent oe = {.kind = MEMSIM_EV_OP, .id = idx, .stream = g->ctx.stream};
    g->costing = false;
    emit(g, &oe);
    g->n_ops++;
    MemsimEvent ev = {.kind = MEMSIM_EV_COLLECTIVE, .stream = g->ctx.stream, .size = bytes,
                      .id = group, .aux = kind};
    emit(g, &ev);
}

void gg_p2p(AgGraph *g, MemsimCollectiveKind kind, uint64_t bytes, uint64_t group,
            uint32_t peer, double duration_us)
{
    gg_collective(g, kind, bytes, group, duration_us);
    MemsimEvent *ev = &g_array_index(g->events, MemsimEvent, g->n_events - 1);
    ev->addr = peer;
    ev->flags |= MEMSIM_EVF_PEER;
}

AgStorage *gg_storage_new(AgGraph *g, uint64_t nbytes, bool resident)
{
    AgStorage *st = pool_alloc0(&g->storages);
    st->id = g->next_storage++;
    st->nbytes = nbytes;
    st->refs = 1;
    st->category = g->ctx.category;
    st->stream = g->ctx.stream;
    st->resident = false;
    if (resident)
        gg_storage_restore(g, st);
    return st;
}

void gg_storage_unref(AgGraph *g, AgStorage *st)
{
    storage_unref(g, st);
}

AgTensor *gg_leaf_in(AgGraph *g, AgStorage *st, DType dt, int nd, const int64_t *shape,
                     bool requires_grad)
{
    AgTensor *t = tensor_alloc(g, nd, shape, NULL, dt);
    t->st = st;
    st->refs++;
    t->is_leaf = true;
    t->requires_grad = requires_grad;
    return t;
}

void gg_record_stream_storage(AgGraph *g, AgStorage *st, uint16_t stream)
{
    if (!st || !st->resident || st->nbytes == 0 || st->stream == stream)
        return;
    MemsimEvent ev = {.kind = MEMSIM_EV_USE, .id = st->id, .stream = stream};
    emit(g, &ev);
}

void gg_host_wait(AgGraph *g, uint16_t on)
{
    MemsimEvent ev = {.kind = MEMSIM_EV_WAIT, .stream = g->ctx.stream, .id = on,
                      .flags = MEMSIM_EVF_HOST};
    emit(g, &ev);
}

void gg_op_timed(AgGraph *g, const char *name, double duration_us)
{
    MemsimOpInfo op = {.name = memsim_trace_intern(g->trace, name),
                       .phase = (uint8_t)g->ctx.phase,
                       .layer = g->ctx.layer,
                       .microbatch = g->ctx.microbatch,
                       .duration_us = duration_us};
    guint32 idx = memsim_trace_add_op(g->trace, &op);
    MemsimEvent oe = {.kind = MEMSIM_EV_OP, .id = idx, .stream = g->ctx.stream};
    g->costing = false;
    emit(g, &oe);
    g->n_ops++;
}

uint64_t gg_op_count(const AgGraph *g)
{
    return g->n_ops;
}

void gg_host_us(AgGraph *g, const char *name, double us)
{
    if (!(us > 0.0) || !(g->flops_per_us > 0.0))
        return; /* untimed traces carry no host time */
    MemsimOpInfo op = {.name = memsim_trace_intern(g->trace, name),
                       .phase = (uint8_t)g->ctx.phase,
                       .layer = g->ctx.layer,
                       .microbatch = g->ctx.microbatch,
                       .duration_us = us,
                       .bound = MEMSIM_BOUND_HOST};
    guint32 idx = memsim_trace_add_op(g->trace, &op);
    MemsimEvent oe = {.kind = MEMSIM_EV_OP, .id = idx, .stream = g->ctx.stream};
    g->costing = false;
    emit(g, &oe);
}

void gg_host_module(AgGraph *g, const char *name, uint64_t ops_before, double module_us)
{
    double inner = (double)(g->n_ops - ops_before) * g->dispatch_us;
    gg_host_us(g, name, module_us - inner);
}

void gg_host(AgGraph *g, int64_t delta)
{
    g->host_now += delta;
    if (g->host_now > g->host_peak)
        g->host_peak = g->host_now;
}

void gg_gemm(AgGraph *g)
{
    int thread = g->ctx.in_backward ? 1 : 0;
    if (!g->rules.cuda || !g->rules.cublas_workspace || g->workspace[thread])
        return;
    uint8_t old = g->ctx.category;
    g->ctx.category = MEMSIM_CAT_OTHER;
    g->workspace[thread] = gt_empty(g, DT_U8, 1, (int64_t[]){(int64_t)g->rules.cublas_workspace});
    g->ctx.category = old;
}

/* ---- steady state (traces/loop.c) ---- */

void gg_unit_state(AgGraph *g, GgUnitState *u)
{
    u->event = g->n_events;
    u->storage = g->next_storage;
    u->cost = g->n_costs;
    u->live_n = g->live_n;
    u->live_bytes = g->live_bytes;
    u->host = g->host_now;
}

void gg_unit_mark(AgGraph *g)
{
    if (!g->recat)
        g->recat = g_array_new(FALSE, FALSE, sizeof(Recat));
    g_array_set_size(g->recat, 0);
    g->recat_from = g->n_events;
}

guint gg_repeat_placeholder(AgGraph *g)
{
    MemsimEvent ev = {.kind = MEMSIM_EV_REPEAT};
    emit(g, &ev);
    return g->n_events - 1;
}

/* Whether two ops' table entries are the same op but for the micro-batch. */
static bool same_op(const MemsimTraceHeader *h, uint64_t a, uint64_t b)
{
    const MemsimOpInfo *x = &h->ops[a], *y = &h->ops[b];
    return x->name == y->name && x->phase == y->phase && x->layer == y->layer &&
           x->duration_us == y->duration_us && x->bound == y->bound;
}

/* Whether mark `y` is step mark `x` moved by the step marks of unit a (len events from
 * a->event): "step N" to "step N + d", alike but for the number. */
static bool step_mark_moved(const MemsimTraceHeader *h, const MemsimEvent *ev,
                            const GgUnitState *a, guint len, uint64_t x, uint64_t y)
{
    uint32_t sx, sy;
    if (x >= h->n_strings || y >= h->n_strings ||
        memsim_mark_parse(h->strings[x], &sx, NULL) != MEMSIM_MARK_STEP ||
        memsim_mark_parse(h->strings[y], &sy, NULL) != MEMSIM_MARK_STEP)
        return false;
    const uint32_t d = memsim_step_marks(h, ev + a->event, len);
    if ((uint64_t)sx + d != sy)
        return false;
    /* the same words after the number ("step N" or "step N begin") */
    g_autofree char *xs = memsim_mark_step(sx);
    g_autofree char *ys = memsim_mark_step(sy);
    const char *X = h->strings[x], *Y = h->strings[y];
    return g_str_has_prefix(X, xs) && g_str_has_prefix(Y, ys) &&
           strcmp(X + strlen(xs), Y + strlen(ys)) == 0;
}

/* Whether b's events are a's (cat_a: a's categories, when not the events' own), the ids of
 * tensors made from `from` on moved by `shift`. */
static bool unit_events_repeat(AgGraph *g, const MemsimTraceHeader *h, const MemsimEvent *ev,
                               uint64_t from, const GgUnitState *a, const GgUnitState *b,
                               guint len, uint64_t shift, const uint8_t *cat_a)
{
    for (guint i = 0; i < len; i++) {
        const MemsimEvent *x = &ev[a->event + i], *y = &ev[b->event + i];
        const uint8_t xc = cat_a ? cat_a[i] : x->category;
        if (x->kind != y->kind || x->stream != y->stream || x->flags != y->flags ||
            xc != y->category || x->size != y->size || x->addr != y->addr || x->aux != y->aux)
            return false;
        switch (x->kind) {
        case MEMSIM_EV_ALLOC:
        case MEMSIM_EV_FREE:
        case MEMSIM_EV_USE:
            /* ids from `before`'s unit on are the units' own: b's are a's moved by `shift`;
             * older ones (parameters, gradients, what the step holds) are the same */
            if (y->id != (x->id >= from ? x->id + shift : x->id))
                return false;
            /* an id of `before`'s unit in b: no id of a's moves onto it */
            if (y->id >= from && y->id < from + shift)
                return false;
            break;
        case MEMSIM_EV_OP:
            if (!same_op(h, x->id, y->id))
                return false;
            break;
        case MEMSIM_EV_REPEAT:
            /* a unit inside the unit (the micro-batches of a step): the same repeat, from
             * the same tensor (moved as an id) */
            if (y->id != (x->id >= from ? x->id + shift : x->id))
                return false;
            break;
        case MEMSIM_EV_MARK:
            /* a step's mark in b names the step as many steps on as a holds (a repetition's
             * marks are moved so: MEMSIM_EV_REPEAT) */
            if (x->id < h->n_strings &&
                memsim_mark_parse(h->strings[x->id], NULL, NULL) == MEMSIM_MARK_STEP) {
                if (!step_mark_moved(h, ev, a, len, x->id, y->id))
                    return false;
            } else if (x->id != y->id) {
                return false;
            }
            break;
        default:
            if (x->id != y->id)
                return false;
        }
    }
    return true;
}

bool gg_unit_repeats(AgGraph *g, const GgUnitState *before, const GgUnitState *a,
                     const GgUnitState *a_end, const GgUnitState *b, const GgUnitState *b_end)
{
    guint len = a_end->event - a->event;
    uint64_t shift = b->storage - a->storage;
    if (b_end->event - b->event != len || b_end->storage - b->storage != shift ||
        b_end->cost - b->cost != a_end->cost - a->cost)
        return false;
    /* the live set is the same at the three boundaries (count, bytes, host bytes) */
    if (a->live_n != b->live_n || b->live_n != b_end->live_n || a->live_bytes != b->live_bytes ||
        b->live_bytes != b_end->live_bytes || a->host != b->host || b->host != b_end->host)
        return false;
    const MemsimTraceHeader *h = memsim_trace_header(g->trace);
    const MemsimEvent *ev = (const MemsimEvent *)g->events->data;
    /* a's categories as they were at its end: an op after it may have changed one (a
     * checkpointed region's recomputation saves a tensor of a's forward: gn_save); b's
     * change there in turn, by the same ops again */
    uint8_t *cat_a = NULL;
    if (g->recat && g->recat->len && g->recat_from <= b->event) {
        cat_a = g_malloc(len);
        for (guint i = 0; i < len; i++)
            cat_a[i] = ev[a->event + i].category;
        for (guint k = g->recat->len; k-- > 0;) {
            const Recat *r = &g_array_index(g->recat, Recat, k);
            if (r->event >= a->event && r->event < a_end->event)
                cat_a[r->event - a->event] = r->old;
        }
    }
    bool same = unit_events_repeat(g, h, ev, before->storage, a, b, len, shift, cat_a);
    g_free(cat_a);
    if (!same)
        return false;
    for (guint i = 0; i < a_end->cost - a->cost; i++) {
        const OpCost *x = &g->costs[a->cost + i], *y = &g->costs[b->cost + i];
        if (x->flops != y->flops || x->bytes != y->bytes || y->pos - x->pos != b->event - a->event)
            return false;
    }
    return true;
}

void gg_repeat_set(AgGraph *g, guint placeholder, guint len, uint64_t times, uint64_t from,
                   uint64_t shift, uint32_t flags)
{
    MemsimEvent *ev = &((MemsimEvent *)g->events->data)[placeholder];
    g_assert(ev->kind == MEMSIM_EV_REPEAT);
    ev->size = len;
    ev->aux = times;
    ev->id = from;
    ev->addr = shift;
    ev->flags = flags;
}
