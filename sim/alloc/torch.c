/* torch — an exact model of PyTorch's CUDA caching allocator ("native" backend) for one
 * device, written from TORCH_ALLOCATOR.md (the project's behavioural spec, itself written
 * from c10/cuda/CUDACachingAllocator.cpp; "§" below refers to its sections).
 *
 * Implemented:
 *   §2    settings: PYTORCH_CUDA_ALLOC_CONF syntax (key:value, lists in [...], whitespace
 *         ignored) and the key=value form; see parse_settings().
 *   §3    malloc in the real order: process_events, round_size (with
 *         roundup_power2_divisions), pool choice, get_allocation_size, get_free_block
 *         (best fit keyed (stream, size, addr), expandable xsize walk, both oversize
 *         rules), then GC, alloc_block, release_available_cached_blocks + retry,
 *         release_cached_blocks + retry (num_alloc_retries), OOM; should_split and
 *         alloc_found_block (carving at the low end, stale requested sizes, inactive_split).
 *   §4    release_cached_blocks (empty_cache), release_available_cached_blocks,
 *         release_block.
 *   §5    free, record_stream, events (per-stream FIFOs, head-of-line), free_block merging.
 *   §6    garbage_collection_threshold (age clock per pool, average-age passes).
 *   §7    per_process_memory_fraction (newest semantics: active only if < 1; the fraction
 *         is of MemsimDevice.capacity).
 *   §8    expandable segments: VA reservations, find_expandable_block, map_block with page
 *         rounding, merges, page-wise unmapping in release_cached_blocks, VA release.
 *   §9    statistics (aggregate only, as MemsimAllocStats asks). One departure: with
 *         expandable segments PyTorch leaves its `segment` stat at 0 (§8.1); here `segments`
 *         counts the maximal mapped runs of the VA reservations instead (a segment is one
 *         contiguous mapped range, §1; what a snapshot lists, §8.5; what shape() counts),
 *         kept up to date at each map and unmap.
 * Not implemented: private pools and graph capture (§10), runtime changes of settings.
 *
 * Device model: cudaMalloc(n) (or mapping n bytes of pages) fails iff the bytes held by the
 * allocator plus n exceed MemsimDevice.capacity (when non-zero). The OOM event carries
 * device free bytes = capacity - bytes held (0 when the capacity is unlimited).
 *
 * Determinism choices where PyTorch is not deterministic (§12.1):
 *   - process_events and synchronize_and_free_events visit the per-stream event FIFOs in
 *     increasing stream index (PyTorch walks a hash map);
 *   - insert_events records the events of one block in increasing stream index (this cannot
 *     change any result: each stream gets at most one event per block).
 *   - segment and VA base addresses come from memsim_device_segment_addr(), so a replay can
 *     feed the recorded ones.
 *
 * Data structures and costs (n = free blocks of one stream in a pool):
 *   - Block objects come from a slab (a free list of fixed-size objects carved from
 *     4096-object chunks, 64-byte aligned, the fields a search reads in the first cache
 *     line): no malloc per event. Stream-use nodes and segments come from slabs too.
 *   - Each pool keeps its free mapped blocks ordered (stream, size, addr) as, per stream, 1664
 *     size classes (monotone in the size: exact below 32 KiB, then 32 per power of two), a
 *     two-level bitmap of the non-empty classes, and in each class an intrusive treap
 *     (randomized balanced binary search tree with parent pointers) keyed (size, addr).
 *     lower_bound = class lookup + a search in one small treap + a bitmap scan (two ctz);
 *     insert/remove touch one small treap (O(log k) expected, k = blocks in the class) and
 *     the bitmap; successor/predecessor in the global order are O(1) amortized. The first
 *     version used one treap per pool; the classes halved the cost per event (profile: the
 *     descent of a deep tree was most of it). Streams 0..63 find their classes by direct
 *     index, others by binary search in the stream-sorted array.
 *   - A second treap per pool keyed (stream, addr) holds the unmapped ranges of expandable
 *     segments (used only when mapping and unmapping).
 *   - Allocated blocks are found by address through the open-addressing hash map the
 *     comparison policies use (KitAddrMap in sim/alloc/kit.h: linear probing, backward-shift
 *     deletion, load <= 1/2): O(1) expected per free.
 *   - Blocks of a segment form a doubly linked list in address order (merging is O(1)).
 *   - Event FIFOs are ring buffers in an array sorted by stream.
 * A malloc or free that hits the cache costs two to four class-treap operations and one hash
 * operation. The paths are inlined (the calls cost more than the small bodies) and avoid
 * branches on data where a mispredicted branch costs more than the work: a malloc and free
 * of the bench's synthetic trace (memsim-bench replay, 1M events) take about 250 torch
 * instructions per event and 490 with decoding and the replay (callgrind), against 690 before.
 * empty_cache and garbage collection walk the pools (O(n)); check() and shape() walk
 * everything.
 */
#include <memsim/alloc.h>

#include <string.h>

#include "formats/torch_settings.h"
#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

/* For the few helpers of the malloc and free paths whose calls cost more than their bodies. */
#define ALWAYS_INLINE inline __attribute__((always_inline))

#define MIB ((memsim_size_t)1 << 20)
#define GIB ((memsim_size_t)1 << 30)

/* §2 constants. */
#define K_MIN_BLOCK ((memsim_size_t)512)
#define K_SMALL_SIZE MIB
#define K_SMALL_BUFFER (2 * MIB)
#define K_MIN_LARGE_ALLOC (10 * MIB)
#define K_ROUND_LARGE (2 * MIB)
#define K_LARGE_BUFFER (20 * MIB)
#define K_MAX_REQUEST ((memsim_size_t)1 << 60)
#define K_DIV_INTERVALS 16
#define UNLIMITED UINT64_MAX
/* The device size assumed for an expandable VA reservation when the capacity is unlimited
 * (an 80 GiB GPU, the commonest large one). */
#define DEFAULT_VA_DEVICE (80 * GIB)

/* ---------------------------------------------------------------------------------------- */
/* Objects */

typedef struct TBlock TBlock;
typedef struct TSegment TSegment;
typedef struct StreamBins StreamBins;
typedef struct UseNode UseNode;

typedef enum {
    ST_FREE = 0,  /* mapped, free, in its pool's tree */
    ST_UNMAPPED,  /* unmapped range of an expandable segment, in the pool's unmapped tree */
    ST_ALLOCATED, /* handed out, in the address map */
    ST_PENDING,   /* freed by the caller, waiting for stream events (still "active") */
} BlockState;

/* The fields a tree search touches come first: with 64-byte aligned objects they share one
 * cache line. */
struct TBlock {
    memsim_addr_t ptr;
    memsim_size_t size;
    TBlock *left, *right, *parent; /* treap links (a pool bin or the unmapped tree) */
    StreamBins *sb;                /* its stream's set while in a pool's free set */
    uint32_t stream;
    uint32_t prio;
    uint16_t cls;            /* size class while in a pool's free set */
    uint8_t state;
    uint8_t small;           /* pool */
    uint8_t exp;             /* lies in an expandable segment */
    TBlock *prev, *next;     /* address neighbours within the segment */
    memsim_size_t requested; /* last request served by this object (stale when free) */
    TSegment *seg;
    UseNode *uses;    /* record_stream set, sorted by stream */
    uint64_t gc_base; /* pool clock when inserted into the pool (§6) */
    uint32_t event_count;
};

struct TSegment {
    memsim_addr_t base;
    memsim_size_t size; /* normal: segment bytes; expandable: VA reservation bytes */
    memsim_size_t page; /* expandable page size; 0 for a normal segment */
    TBlock *first;
    TSegment *prev_seg, *next_seg;
    uint32_t stream;
    uint8_t small;
    uint8_t exp;
};

struct UseNode {
    UseNode *next;
    uint32_t stream;
};

/* The free mapped blocks of one stream in one pool, ordered (size, ptr): size classes that
 * are monotone in the size, a treap per class, and a two-level bitmap of non-empty classes
 * (jemalloc's eset idea). Classes: exact for sizes below 32 KiB (in 512-byte units), then 32
 * per power of two. */
struct StreamBins {
    uint32_t stream;
    uint64_t n; /* blocks */
    KitClassMap map;
    TBlock *bins[KIT_N_CLASSES];
};

typedef struct {
    StreamBins **sets; /* sorted by stream; never removed */
    uint32_t n_sets, cap_sets;
    StreamBins *direct[64]; /* the sets of streams 0..63, for a lookup without search */
    StreamBins *last;       /* the set of a stream >= 64 looked up last */
    TBlock *uroot;          /* unmapped ranges by (stream, ptr) */
    uint64_t clock;         /* get_free_blocks_call_count (§6) */
    uint64_t n_free;
    gboolean small;
} TPool;

typedef struct {
    uint64_t token;
    TBlock *block;
} TEvent;

typedef struct {
    uint32_t stream;
    uint32_t head, len, cap;
    TEvent *ring;
} EvQueue;

typedef TorchSettings TorchConfig; /* formats/torch_settings.h */

typedef struct {
    MemsimDevice *dev;
    TorchConfig cfg;
    TPool pools[2]; /* [0] large, [1] small: indexed by TBlock.small */
    KitAddrMap live; /* allocated blocks by address */
    KitSlab block_slab, seg_slab, use_slab;
    TSegment *segs; /* every segment and VA reservation */
    EvQueue *queues;
    uint32_t n_queues, cap_queues;
    uint64_t n_events;   /* outstanding events, all streams */
    memsim_size_t total; /* total_allocated_memory: bytes cudaMalloc'ed + mapped */
    MemsimAllocStats st;
    MemsimStat n_inactive_split; /* inactive_split (count); bytes are st.inactive_split */
    uint32_t rng;
    GPtrArray *scratch;
} Torch;

/* ---------------------------------------------------------------------------------------- */
/* Treap with parent pointers. Pool trees order (stream, size, ptr); unmapped trees order
 * (stream, ptr). Keys are unique because addresses are. Max-heap on prio. */

static inline gboolean node_lt(const TBlock *a, const TBlock *b, gboolean by_addr)
{
    if (a->stream != b->stream)
        return a->stream < b->stream;
    if (!by_addr && a->size != b->size)
        return a->size < b->size;
    return a->ptr < b->ptr;
}

static inline void tree_rotate_up(TBlock **root, TBlock *x)
{
    TBlock *p = x->parent, *g = p->parent;
    if (p->left == x) {
        p->left = x->right;
        if (x->right)
            x->right->parent = p;
        x->right = p;
    } else {
        p->right = x->left;
        if (x->left)
            x->left->parent = p;
        x->left = p;
    }
    p->parent = x;
    x->parent = g;
    if (!g)
        *root = x;
    else if (g->left == p)
        g->left = x;
    else
        g->right = x;
}

/* Hangs n at `link` under p, then restores the heap order. */
static inline void tree_attach(TBlock **root, TBlock *p, TBlock **link, TBlock *n)
{
    n->left = n->right = NULL;
    n->parent = p;
    *link = n;
    while (n->parent && n->parent->prio < n->prio)
        tree_rotate_up(root, n);
}

static inline void tree_insert(TBlock **root, TBlock *n, gboolean by_addr)
{
    TBlock *p = NULL, **link = root;
    while (*link) {
        p = *link;
        link = node_lt(n, p, by_addr) ? &p->left : &p->right;
    }
    tree_attach(root, p, link, n);
}

/* Inside a pool bin all blocks share the stream: the key is (size, ptr), compared without
 * branches. */
static inline int bin_lt(const TBlock *a, const TBlock *b)
{
    return (a->size < b->size) | ((a->size == b->size) & (a->ptr < b->ptr));
}

static inline void bin_insert(TBlock **root, TBlock *n)
{
    TBlock *p = NULL, **link = root;
    while (*link) {
        p = *link;
        link = bin_lt(n, p) ? &p->left : &p->right;
    }
    tree_attach(root, p, link, n);
}

/* First block of a bin with size >= size. */
static inline TBlock *bin_lower_bound(TBlock *cur, memsim_size_t size)
{
    TBlock *res = NULL;
    while (cur) {
        int lt = cur->size < size;
        res = lt ? res : cur;
        cur = lt ? cur->right : cur->left;
    }
    return res;
}

static inline void tree_remove(TBlock **root, TBlock *n)
{
    while (n->left && n->right)
        tree_rotate_up(root, n->left->prio > n->right->prio ? n->left : n->right);
    TBlock *c = n->left ? n->left : n->right, *p = n->parent;
    if (c)
        c->parent = p;
    if (!p)
        *root = c;
    else if (p->left == n)
        p->left = c;
    else
        p->right = c;
    n->left = n->right = n->parent = NULL;
}

static TBlock *tree_first(TBlock *n)
{
    if (!n)
        return NULL;
    while (n->left)
        n = n->left;
    return n;
}

static TBlock *tree_last(TBlock *n)
{
    if (!n)
        return NULL;
    while (n->right)
        n = n->right;
    return n;
}

static TBlock *tree_next(TBlock *n)
{
    if (n->right)
        return tree_first(n->right);
    while (n->parent && n->parent->right == n)
        n = n->parent;
    return n->parent;
}

static TBlock *tree_prev(TBlock *n)
{
    if (n->left)
        return tree_last(n->left);
    while (n->parent && n->parent->left == n)
        n = n->parent;
    return n->parent;
}

/* First block with stream >= `stream` in an unmapped tree. */
static TBlock *utree_lower_bound(TBlock *cur, uint32_t stream)
{
    TBlock *res = NULL;
    while (cur) {
        if (cur->stream < stream) {
            cur = cur->right;
        } else {
            res = cur;
            cur = cur->left;
        }
    }
    return res;
}

/* ---------------------------------------------------------------------------------------- */
/* Pool free sets: the (stream, size, ptr) order as per-stream size-class bins (the classes and
 * their bitmap: kit.h) */

static inline StreamBins *bins_find(TPool *pool, uint32_t stream)
{
    if (G_LIKELY(stream < G_N_ELEMENTS(pool->direct)))
        return pool->direct[stream];
    if (pool->last && pool->last->stream == stream)
        return pool->last;
    uint32_t lo = 0, hi = pool->n_sets;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (pool->sets[mid]->stream < stream)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < pool->n_sets && pool->sets[lo]->stream == stream)
        return pool->last = pool->sets[lo];
    return NULL;
}

/* A stream's first free block in this pool: its set. */
static StreamBins *bins_add(TPool *pool, uint32_t stream)
{
    StreamBins *sb;
    uint32_t lo = 0;
    while (lo < pool->n_sets && pool->sets[lo]->stream < stream)
        lo++;
    if (pool->n_sets == pool->cap_sets) {
        pool->cap_sets = pool->cap_sets ? 2 * pool->cap_sets : 4;
        pool->sets = g_renew(StreamBins *, pool->sets, pool->cap_sets);
    }
    memmove(&pool->sets[lo + 1], &pool->sets[lo], (pool->n_sets - lo) * sizeof *pool->sets);
    pool->n_sets++;
    sb = g_new0(StreamBins, 1);
    sb->stream = stream;
    pool->sets[lo] = sb;
    if (stream < G_N_ELEMENTS(pool->direct))
        pool->direct[stream] = sb;
    return pool->last = sb;
}

static inline StreamBins *bins_get(TPool *pool, uint32_t stream)
{
    StreamBins *sb = bins_find(pool, stream);
    return G_LIKELY(sb) ? sb : bins_add(pool, stream);
}

static ALWAYS_INLINE void fs_insert(TPool *pool, TBlock *b)
{
    StreamBins *sb = bins_get(pool, b->stream);
    unsigned c = kit_size_class(b->size);
    b->sb = sb;
    b->cls = (uint16_t)c;
    bin_insert(&sb->bins[c], b);
    kit_class_mark(&sb->map, c);
    sb->n++;
    pool->n_free++;
}

static ALWAYS_INLINE void fs_remove(TPool *pool, TBlock *b)
{
    StreamBins *sb = b->sb; /* bins_find(pool, b->stream), noted by fs_insert */
    unsigned c = b->cls;
    tree_remove(&sb->bins[c], b);
    kit_class_unmark(&sb->map, c, sb->bins[c] == NULL);
    sb->n--;
    pool->n_free--;
}

/* b (in the pool) takes the key (size, ptr): out of its class and into the new one, with the
 * stream's set looked up once and the counts left alone. */
static ALWAYS_INLINE void fs_rekey(TPool *pool, TBlock *b, memsim_addr_t ptr, memsim_size_t size)
{
    StreamBins *sb = b->sb;
    unsigned c = b->cls;
    tree_remove(&sb->bins[c], b);
    kit_class_unmark(&sb->map, c, sb->bins[c] == NULL);
    b->ptr = ptr;
    b->size = size;
    c = kit_size_class(size);
    b->cls = (uint16_t)c;
    bin_insert(&sb->bins[c], b);
    kit_class_mark(&sb->map, c);
}

/* The first block of `stream` with size >= size, or NULL. */
static ALWAYS_INLINE TBlock *fs_lower_bound(TPool *pool, uint32_t stream, memsim_size_t size)
{
    StreamBins *sb = bins_find(pool, stream);
    if (!sb || !sb->n)
        return NULL;
    unsigned c = kit_size_class(size);
    if (sb->bins[c]) {
        TBlock *b = bin_lower_bound(sb->bins[c], size);
        if (b)
            return b;
    }
    int c2 = kit_class_from(&sb->map, c + 1);
    return c2 < 0 ? NULL : tree_first(sb->bins[c2]);
}

static TBlock *fs_next_in_stream(TPool *pool, TBlock *b)
{
    TBlock *n = tree_next(b);
    if (n)
        return n;
    StreamBins *sb = bins_find(pool, b->stream);
    int c = kit_class_from(&sb->map, kit_size_class(b->size) + 1);
    return c < 0 ? NULL : tree_first(sb->bins[c]);
}

static TBlock *fs_prev_in_stream(TPool *pool, TBlock *b)
{
    TBlock *n = tree_prev(b);
    if (n)
        return n;
    StreamBins *sb = bins_find(pool, b->stream);
    int c = kit_class_before(&sb->map, kit_size_class(b->size));
    return c < 0 ? NULL : tree_last(sb->bins[c]);
}

static TBlock *fs_last_in_stream(TPool *pool, uint32_t stream)
{
    StreamBins *sb = bins_find(pool, stream);
    int c = sb ? kit_class_before(&sb->map, KIT_N_CLASSES) : -1;
    return c < 0 ? NULL : tree_last(sb->bins[c]);
}

static TBlock *fs_first_from_set(TPool *pool, uint32_t i)
{
    for (; i < pool->n_sets; i++) {
        int c = kit_class_from(&pool->sets[i]->map, 0);
        if (c >= 0)
            return tree_first(pool->sets[i]->bins[c]);
    }
    return NULL;
}

/* The whole pool in (stream, size, ptr) order. */
static TBlock *fs_first(TPool *pool)
{
    return fs_first_from_set(pool, 0);
}

static TBlock *fs_next(TPool *pool, TBlock *b)
{
    TBlock *n = fs_next_in_stream(pool, b);
    if (n)
        return n;
    uint32_t i = 0;
    while (pool->sets[i]->stream != b->stream)
        i++;
    return fs_first_from_set(pool, i + 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Small helpers */

static inline void emit(Torch *t, MemsimAllocEventKind kind, memsim_addr_t addr, memsim_size_t size,
                        uint32_t stream)
{
    /* The quiet test here too: a replay asks for no ALLOC and FREE_COMPLETED reports, and
     * this runs twice per malloc and free. */
    if (t->dev->on_event && !((t->dev->quiet >> kind) & 1u))
        memsim_device_emit(t->dev, kind, addr, size, stream);
}

static inline uint32_t next_prio(Torch *t)
{
    uint32_t x = t->rng;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    t->rng = x;
    return x;
}

static inline TPool *pool_of(Torch *t, const TBlock *b)
{
    return &t->pools[b->small];
}

static inline gboolean is_split(const TBlock *b)
{
    return (b->prev != NULL) | (b->next != NULL);
}

static inline gboolean fraction_active(const Torch *t)
{
    return t->cfg.fraction < 1.0 && t->dev->capacity > 0;
}

static inline memsim_size_t allowed_maximum(const Torch *t)
{
    return (memsim_size_t)(t->cfg.fraction * (double)t->dev->capacity);
}

static inline gboolean gc_active(const Torch *t)
{
    return fraction_active(t) && t->cfg.gc_threshold > 0.0;
}

/* Whether the driver can provide n more bytes (the device capacity model). */
static inline gboolean device_has(const Torch *t, memsim_size_t n)
{
    return t->dev->capacity == 0 || t->total + n <= t->dev->capacity;
}

/* memsim_stat_add or memsim_stat_sub by the sign of delta, without a branch on it: after a
 * decrease the peak test cannot pass. */
static inline void stat_change(MemsimStat *s, int64_t delta)
{
    s->current += delta;
    s->peak = s->current > s->peak ? s->current : s->peak;
}

static ALWAYS_INLINE TBlock *block_make(Torch *t, TSegment *seg, memsim_addr_t ptr,
                                        memsim_size_t size, BlockState state)
{
    TBlock *b = kit_slab_get_raw(&t->block_slab);
    b->ptr = ptr;
    b->size = size;
    b->requested = 0;
    b->prev = b->next = NULL;
    b->left = b->right = b->parent = NULL;
    b->seg = seg;
    b->uses = NULL;
    b->gc_base = 0;
    b->stream = seg->stream;
    b->prio = next_prio(t);
    b->event_count = 0;
    b->state = (uint8_t)state;
    b->small = seg->small;
    b->exp = seg->exp;
    return b;
}

static TBlock *new_block(Torch *t, TSegment *seg, memsim_addr_t ptr, memsim_size_t size,
                         BlockState state)
{
    return block_make(t, seg, ptr, size, state);
}

static void drop_block(Torch *t, TBlock *b)
{
    kit_slab_put(&t->block_slab, b);
}

static TSegment *new_segment(Torch *t, memsim_addr_t base, memsim_size_t size, uint32_t stream,
                             gboolean small, memsim_size_t page)
{
    TSegment *s = kit_slab_get_raw(&t->seg_slab);
    s->base = base;
    s->size = size;
    s->page = page;
    s->first = NULL;
    s->stream = stream;
    s->small = (uint8_t)small;
    s->exp = page != 0;
    s->prev_seg = NULL;
    s->next_seg = t->segs;
    if (t->segs)
        t->segs->prev_seg = s;
    t->segs = s;
    return s;
}

static void drop_segment(Torch *t, TSegment *s)
{
    if (s->prev_seg)
        s->prev_seg->next_seg = s->next_seg;
    else
        t->segs = s->next_seg;
    if (s->next_seg)
        s->next_seg->prev_seg = s->prev_seg;
    kit_slab_put(&t->seg_slab, s);
}

/* Puts `n` just before `at` in at's segment. */
static void link_before(TBlock *n, TBlock *at)
{
    n->prev = at->prev;
    n->next = at;
    if (at->prev)
        at->prev->next = n;
    else
        at->seg->first = n;
    at->prev = n;
}

/* Puts `n` just after `at`. */
static void link_after(TBlock *n, TBlock *at)
{
    n->prev = at;
    n->next = at->next;
    if (at->next)
        at->next->prev = n;
    at->next = n;
}

/* insert_into_blocks: a free mapped block enters its pool; its GC age restarts. */
static inline void pool_insert(TPool *pool, TBlock *b)
{
    b->state = ST_FREE;
    b->gc_base = pool->clock;
    fs_insert(pool, b);
}

static inline void upool_insert(TPool *pool, TBlock *b)
{
    b->state = ST_UNMAPPED;
    tree_insert(&pool->uroot, b, TRUE);
}

/* try_merge_blocks: dst (not in any tree, mapped state `mapped`) absorbs src if src is a free
 * block of the same mapped state. Returns the absorbed size (0 = no merge). */
static memsim_size_t try_merge(Torch *t, TBlock *dst, TBlock *src, gboolean mapped)
{
    if (!src)
        return 0;
    if (mapped ? src->state != ST_FREE : src->state != ST_UNMAPPED)
        return 0;
    TPool *pool = pool_of(t, src);
    if (mapped)
        fs_remove(pool, src);
    else
        tree_remove(&pool->uroot, src);
    if (dst->prev == src) {
        dst->ptr = src->ptr;
        dst->prev = src->prev;
        if (dst->prev)
            dst->prev->next = dst;
        else
            dst->seg->first = dst;
    } else {
        dst->next = src->next;
        if (dst->next)
            dst->next->prev = dst;
    }
    memsim_size_t sz = src->size;
    dst->size += sz;
    drop_block(t, src);
    return sz;
}

/* ---------------------------------------------------------------------------------------- */
/* §3.1 rounding, §3 step 3 segment size */

static inline memsim_size_t round_size_cfg(const TorchConfig *c, memsim_size_t size)
{
    return torch_settings_round(c, size);
}

static memsim_size_t torch_round_size(void *state, memsim_size_t size)
{
    return round_size_cfg(&((Torch *)state)->cfg, size);
}

static inline memsim_size_t allocation_size(const Torch *t, memsim_size_t size)
{
    if (size <= K_SMALL_SIZE)
        return K_SMALL_BUFFER;
    if (size < K_MIN_LARGE_ALLOC)
        return t->cfg.large_segment;
    return (size + K_ROUND_LARGE - 1) / K_ROUND_LARGE * K_ROUND_LARGE;
}

static inline memsim_size_t page_size(const Torch *t, gboolean small)
{
    return small ? K_SMALL_BUFFER : t->cfg.large_segment;
}

/* VA reserved for one expandable segment: ceil((total + total/8) / page) pages (§8.1). */
static memsim_size_t va_size(const Torch *t, memsim_size_t page)
{
    memsim_size_t total = t->dev->capacity ? t->dev->capacity : DEFAULT_VA_DEVICE;
    return (total + total / 8 + page - 1) / page * page;
}

/* ---------------------------------------------------------------------------------------- */
/* §5 events */

static EvQueue *queue_for(Torch *t, uint32_t stream)
{
    uint32_t lo = 0, hi = t->n_queues;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (t->queues[mid].stream < stream)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < t->n_queues && t->queues[lo].stream == stream)
        return &t->queues[lo];
    if (t->n_queues == t->cap_queues) {
        t->cap_queues = t->cap_queues ? 2 * t->cap_queues : 4;
        t->queues = g_renew(EvQueue, t->queues, t->cap_queues);
    }
    memmove(&t->queues[lo + 1], &t->queues[lo], (t->n_queues - lo) * sizeof(EvQueue));
    t->n_queues++;
    EvQueue *q = &t->queues[lo];
    memset(q, 0, sizeof *q);
    q->stream = stream;
    return q;
}

static void queue_push(EvQueue *q, uint64_t token, TBlock *b)
{
    if (q->len == q->cap) {
        uint32_t cap = q->cap ? 2 * q->cap : 8;
        TEvent *ring = g_new(TEvent, cap);
        for (uint32_t i = 0; i < q->len; i++)
            ring[i] = q->ring[(q->head + i) % q->cap];
        g_free(q->ring);
        q->ring = ring;
        q->cap = cap;
        q->head = 0;
    }
    q->ring[(q->head + q->len) % q->cap] = (TEvent){token, b};
    q->len++;
}

static TEvent queue_pop(EvQueue *q)
{
    TEvent e = q->ring[q->head];
    q->head = (q->head + 1) % q->cap;
    q->len--;
    return e;
}

static void free_block(Torch *t, TBlock *b);

/* insert_events: one event per recorded stream; the block stays active until all complete. */
static void insert_events(Torch *t, TBlock *b)
{
    UseNode *u = b->uses;
    b->uses = NULL;
    while (u) {
        UseNode *next = u->next;
        uint64_t token = memsim_device_record_event(t->dev, u->stream);
        b->event_count++;
        queue_push(queue_for(t, u->stream), token, b);
        t->n_events++;
        kit_slab_put(&t->use_slab, u);
        u = next;
    }
}

/* process_events (§5.3): each FIFO is popped while its head event has completed. */
static void process_events(Torch *t)
{
    for (uint32_t i = 0; i < t->n_queues; i++) {
        EvQueue *q = &t->queues[i];
        while (q->len) {
            TEvent *e = &q->ring[q->head];
            if (!memsim_device_event_done(t->dev, q->stream, e->token))
                break;
            TEvent ev = queue_pop(q);
            t->n_events--;
            if (--ev.block->event_count == 0)
                free_block(t, ev.block);
        }
    }
}

/* synchronize_and_free_events (§4.1 step 1): wait for every event. */
static void synchronize_and_free_events(Torch *t)
{
    t->st.n_sync_all_streams++;
    for (uint32_t i = 0; i < t->n_queues; i++) {
        EvQueue *q = &t->queues[i];
        while (q->len) {
            TEvent ev = queue_pop(q);
            t->n_events--;
            if (--ev.block->event_count == 0)
                free_block(t, ev.block);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* §5.2 free_block */

static ALWAYS_INLINE void free_block_inline(Torch *t, TBlock *b)
{
    emit(t, MEMSIM_AEV_FREE_COMPLETED, b->ptr, b->requested, b->stream);
    memsim_size_t original_size = b->size;
    memsim_size_t requested = b->requested;
    int64_t d_blocks = 0, d_bytes = 0;
    TPool *pool = pool_of(t, b);
    /* try_merge_blocks with prev, then next, inlined (the neighbours share b's pool). */
    TBlock *prev = b->prev, *next = b->next;
    if (prev && prev->state == ST_FREE) {
        fs_remove(pool, prev);
        b->ptr = prev->ptr;
        b->prev = prev->prev;
        if (b->prev)
            b->prev->next = b;
        else
            b->seg->first = b;
        b->size += prev->size;
        d_blocks -= 1;
        d_bytes -= (int64_t)prev->size;
        drop_block(t, prev);
    }
    if (next && next->state == ST_FREE) {
        fs_remove(pool, next);
        b->next = next->next;
        if (b->next)
            b->next->prev = b;
        b->size += next->size;
        d_blocks -= 1;
        d_bytes -= (int64_t)next->size;
        drop_block(t, next);
    }
    b->state = ST_FREE; /* pool_insert */
    b->gc_base = pool->clock;
    fs_insert(pool, b);
    if (is_split(b)) {
        d_blocks += 1;
        d_bytes += (int64_t)b->size;
    }
    if (!b->exp) {
        stat_change(&t->n_inactive_split, d_blocks);
        stat_change(&t->st.inactive_split, d_bytes);
    }
    memsim_stat_sub(&t->st.active, (int64_t)original_size);
    memsim_stat_sub(&t->st.requested, (int64_t)requested);
}

static void free_block(Torch *t, TBlock *b)
{
    free_block_inline(t, b);
}

/* ---------------------------------------------------------------------------------------- */
/* §4 releasing memory */

/* release_block: cudaFree of a whole, free, non-expandable segment. */
static void release_block(Torch *t, TBlock *b)
{
    g_assert(!b->exp && !is_split(b) && b->state == ST_FREE);
    t->st.n_device_free++;
    emit(t, MEMSIM_AEV_SEG_FREE, b->ptr, b->size, b->stream);
    t->total -= b->size;
    memsim_stat_sub(&t->st.segments, 1);
    memsim_stat_sub(&t->st.reserved, (int64_t)b->size);
    fs_remove(pool_of(t, b), b);
    drop_segment(t, b->seg);
    drop_block(t, b);
}

/* Whether a block (of an expandable segment) is mapped; NULL is not. */
static inline gboolean is_mapped(const TBlock *b)
{
    return b && b->state != ST_UNMAPPED;
}

/* unmap_block (§8.4): unmaps the whole pages inside a free expandable block. */
static void unmap_block(Torch *t, TBlock *b)
{
    TSegment *seg = b->seg;
    memsim_size_t page = seg->page;
    memsim_size_t off = b->ptr - seg->base;
    memsim_size_t begin = (off + page - 1) / page;
    memsim_size_t end = (off + b->size) / page;
    if (begin >= end)
        return;
    memsim_addr_t uptr = seg->base + begin * page;
    memsim_size_t usize = (end - begin) * page;
    TPool *pool = pool_of(t, b);
    fs_remove(pool, b);
    memsim_size_t before = uptr - b->ptr;
    /* The run loses its middle: what stays mapped on either side is a run of its own. */
    int64_t runs = (before > 0 || is_mapped(b->prev)) +
                   (before + usize < b->size || is_mapped(b->next));
    if (runs > 1)
        memsim_stat_add(&t->st.segments, runs - 1);
    else if (runs < 1)
        memsim_stat_sub(&t->st.segments, 1);
    if (before > 0) {
        TBlock *f = new_block(t, seg, b->ptr, before, ST_FREE);
        link_before(f, b);
        pool_insert(pool, f);
    }
    memsim_size_t after = b->size - before - usize;
    if (after > 0) {
        TBlock *f = new_block(t, seg, uptr + usize, after, ST_FREE);
        link_after(f, b);
        pool_insert(pool, f);
    }
    b->ptr = uptr;
    b->size = usize;
    b->state = ST_UNMAPPED;
    try_merge(t, b, b->prev, FALSE);
    try_merge(t, b, b->next, FALSE);
    upool_insert(pool, b);
    t->total -= usize;
    memsim_stat_sub(&t->st.reserved, (int64_t)usize);
    t->st.n_device_free++;
    emit(t, MEMSIM_AEV_SEG_UNMAP, uptr, usize, b->stream);
}

/* release_expandable_segment: the VA reservation is entirely unmapped; give it back. */
static void release_va(Torch *t, TBlock *b)
{
    tree_remove(&pool_of(t, b)->uroot, b);
    drop_segment(t, b->seg);
    drop_block(t, b);
}

/* release_blocks: whole free segments in pool order, then page-wise unmapping of the free
 * expandable blocks gathered in the same order. */
static void release_blocks(Torch *t, TPool *pool)
{
    GPtrArray *to_unmap = t->scratch;
    g_ptr_array_set_size(to_unmap, 0);
    for (TBlock *b = fs_first(pool), *n; b; b = n) {
        n = fs_next(pool, b);
        if (b->exp)
            g_ptr_array_add(to_unmap, b);
        else if (!is_split(b))
            release_block(t, b);
    }
    for (guint i = 0; i < to_unmap->len; i++) {
        TBlock *b = to_unmap->pdata[i];
        unmap_block(t, b);
        if (b->state == ST_UNMAPPED && !is_split(b))
            release_va(t, b);
    }
    g_ptr_array_set_size(to_unmap, 0);
}

/* release_cached_blocks (§4.1): the body of empty_cache. */
static void release_cached_blocks(Torch *t)
{
    synchronize_and_free_events(t);
    release_blocks(t, &t->pools[0]);
    release_blocks(t, &t->pools[1]);
}

/* release_available_cached_blocks (§4.2). */
static gboolean release_available_cached_blocks(Torch *t, TPool *pool, uint32_t stream,
                                                memsim_size_t size)
{
    memsim_size_t mss = t->cfg.max_split_size;
    if (mss == UNLIMITED)
        return FALSE;
    memsim_size_t key = size < mss ? mss : size;
    TBlock *it = fs_lower_bound(pool, stream, key);
    if (!it || it->exp) {
        /* No single block is large enough: free oversize blocks from the largest down. (The
         * walk stops at the stream's first block: PyTorch's set iterator would step into the
         * previous stream, whose blocks fail its stream test.) */
        it = it ? fs_prev_in_stream(pool, it) : fs_last_in_stream(pool, stream);
        if (!it)
            return FALSE;
        memsim_size_t released = 0;
        while (it && released < key && it->size >= mss) {
            TBlock *cur = it;
            it = fs_prev_in_stream(pool, cur);
            /* A free oversize block is a whole segment unless it is expandable (or a seeded
             * state broke that rule): only whole segments can be cudaFree'd. */
            if (!cur->exp && !is_split(cur)) {
                released += cur->size;
                release_block(t, cur);
            }
        }
        return released >= key;
    }
    if (is_split(it))
        return FALSE; /* only reachable from a seeded state; see above */
    release_block(t, it);
    return TRUE;
}

/* garbage_collect_cached_blocks (§6). */
static void garbage_collect(Torch *t)
{
    memsim_size_t limit = (memsim_size_t)(t->cfg.gc_threshold * (double)allowed_maximum(t));
    if (t->total <= limit)
        return;
    memsim_size_t target = t->total - limit;
    TPool *pool = &t->pools[0];
    uint64_t total_age = 0;
    int64_t count = 0;
    for (TBlock *b = fs_first(pool); b; b = fs_next(pool, b)) {
        if (!is_split(b)) {
            total_age += pool->clock - b->gc_base;
            count++;
        }
    }
    if (count == 0)
        return;
    memsim_size_t reclaimed = 0;
    gboolean freed = TRUE;
    while (reclaimed < target && freed && count > 0) {
        double threshold = (double)total_age / (double)count;
        freed = FALSE;
        for (TBlock *b = fs_first(pool), *n; b; b = n) {
            n = fs_next(pool, b);
            uint64_t age = pool->clock - b->gc_base;
            if (!is_split(b) && !b->exp && (double)age >= threshold) {
                freed = TRUE;
                reclaimed += b->size;
                total_age -= age;
                count--;
                release_block(t, b);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* §8 expandable segments */

/* The segment count (§9 departure, see the top): mapping [ptr, ptr + size) inside the
 * unmapped block u makes a new mapped run, less one for each mapped neighbour it touches. */
static void count_mapped_run(Torch *t, const TBlock *u, memsim_addr_t ptr, memsim_size_t size)
{
    int64_t d = 1 - (ptr == u->ptr && is_mapped(u->prev)) -
                (ptr + size == u->ptr + u->size && is_mapped(u->next));
    if (d > 0)
        memsim_stat_add(&t->st.segments, d);
    else if (d < 0)
        memsim_stat_sub(&t->st.segments, -d);
}

/* map_block: maps the pages covering [b->ptr, b->ptr + size) of an unmapped block; the
 * mapped part becomes a free block merged with its free neighbours. */
static gboolean map_block(Torch *t, TBlock *b, memsim_size_t size)
{
    TSegment *seg = b->seg;
    memsim_size_t page = seg->page;
    memsim_size_t off = b->ptr - seg->base;
    memsim_size_t msize = ((off + size + page - 1) / page - off / page) * page;
    if (msize == 0 || !device_has(t, msize))
        return FALSE;
    count_mapped_run(t, b, b->ptr, msize);
    TPool *pool = pool_of(t, b);
    memsim_addr_t mptr = b->ptr;
    tree_remove(&pool->uroot, b);
    if (msize < b->size) {
        TBlock *rest = new_block(t, seg, b->ptr + msize, b->size - msize, ST_UNMAPPED);
        link_after(rest, b);
        upool_insert(pool, rest);
        b->size = msize;
    }
    b->state = ST_FREE;
    try_merge(t, b, b->prev, TRUE);
    try_merge(t, b, b->next, TRUE);
    pool_insert(pool, b);
    t->total += msize;
    memsim_stat_add(&t->st.reserved, (int64_t)msize);
    t->st.n_device_alloc++;
    emit(t, MEMSIM_AEV_SEG_MAP, mptr, msize, b->stream);
    return TRUE;
}

static inline gboolean allocatable(const TBlock *b)
{
    return b && (b->state == ST_FREE || b->state == ST_UNMAPPED);
}

/* find_expandable_block: the lowest-address run of free + unmapped space of this stream and
 * pool that holds `size`, else a new VA reservation. */
static TBlock *find_expandable_block(Torch *t, TPool *pool, uint32_t stream, memsim_size_t size)
{
    for (TBlock *c = utree_lower_bound(pool->uroot, stream); c && c->stream == stream;
         c = tree_next(c)) {
        TBlock *cand = allocatable(c->prev) ? c->prev : c;
        memsim_size_t bytes = 0;
        for (TBlock *x = cand; bytes < size && allocatable(x); x = x->next)
            bytes += x->size;
        if (bytes >= size)
            return cand;
    }
    memsim_size_t page = page_size(t, pool->small);
    memsim_size_t va = va_size(t, page);
    memsim_addr_t base = memsim_device_segment_addr(t->dev, va, stream);
    TSegment *seg = new_segment(t, base, va, stream, pool->small, page);
    TBlock *b = new_block(t, seg, base, va, ST_UNMAPPED);
    seg->first = b;
    upool_insert(pool, b);
    return b;
}

static TBlock *try_allocate_expandable_block(Torch *t, TPool *pool, uint32_t stream,
                                             memsim_size_t size)
{
    TBlock *c = find_expandable_block(t, pool, stream, size);
    if (c->state == ST_UNMAPPED && !map_block(t, c, MIN(c->size, size)))
        return NULL;
    while (c->size < size) {
        TBlock *n = c->next;
        /* Only when a request exceeds the whole VA reservation (unlimited capacity). */
        if (!n || n->state != ST_UNMAPPED)
            return NULL;
        if (!map_block(t, n, MIN(size - c->size, n->size)))
            return NULL;
        c = n;
    }
    return c; /* still in the pool */
}

/* ---------------------------------------------------------------------------------------- */
/* §3 malloc */

/* get_free_block (§3.2). */
static TBlock *get_free_block(Torch *t, TPool *pool, uint32_t stream, memsim_size_t size)
{
    if (G_UNLIKELY(gc_active(t)))
        pool->clock++;
    TBlock *b = fs_lower_bound(pool, stream, size);
    if (!b)
        return NULL;
    if (G_UNLIKELY(b->exp)) {
        if (t->cfg.expandable) {
            /* Prefer a block that does not border unmapped space when one fits. */
#define XSIZE(x) ((x)->size + ((x)->next && (x)->next->state == ST_UNMAPPED ? (x)->next->size : 0))
            TBlock *n = fs_next_in_stream(pool, b);
            while (b->exp && n && XSIZE(n) < XSIZE(b)) {
                b = n;
                n = fs_next_in_stream(pool, n);
            }
#undef XSIZE
        } else {
            /* Expandable segments exist (seeded) but are disabled: skip them. */
            do
                b = fs_next_in_stream(pool, b);
            while (b && b->exp);
            if (!b)
                return NULL;
        }
    }
    memsim_size_t mss = t->cfg.max_split_size;
    if (size < mss && b->size >= mss)
        return NULL;
    if (size >= mss && b->size >= size + t->cfg.max_non_split_rounding)
        return NULL;
    return b; /* still in the pool: alloc_found_block takes it out */
}

/* alloc_block (§3.3): a new segment (in no pool) or mapped pages (a block still in the
 * pool). */
static TBlock *alloc_block(Torch *t, TPool *pool, uint32_t stream, memsim_size_t size,
                           memsim_size_t alloc_size, gboolean retry)
{
    if (retry)
        t->st.n_alloc_retries++;
    if (fraction_active(t) && t->total + alloc_size > allowed_maximum(t))
        return NULL;
    if (t->cfg.expandable)
        return try_allocate_expandable_block(t, pool, stream, size);
    if (!device_has(t, alloc_size))
        return NULL;
    memsim_addr_t base = memsim_device_segment_addr(t->dev, alloc_size, stream);
    TSegment *seg = new_segment(t, base, alloc_size, stream, pool->small, 0);
    TBlock *b = new_block(t, seg, base, alloc_size, ST_FREE);
    seg->first = b;
    t->total += alloc_size;
    memsim_stat_add(&t->st.segments, 1);
    memsim_stat_add(&t->st.reserved, (int64_t)alloc_size);
    t->st.n_device_alloc++;
    emit(t, MEMSIM_AEV_SEG_ALLOC, base, alloc_size, stream);
    return b;
}

static inline gboolean should_split(const Torch *t, const TBlock *b, memsim_size_t size)
{
    memsim_size_t remaining = b->size - size;
    if (b->small || t->cfg.expandable)
        return remaining >= K_MIN_BLOCK;
    return size < t->cfg.max_split_size && remaining > K_SMALL_SIZE;
}

/* alloc_found_block (§3.4): carve `size` bytes at the low end of b. */
static TBlock *alloc_found_block(Torch *t, TPool *pool, TBlock *b, gboolean in_pool,
                                 memsim_size_t size, memsim_size_t orig)
{
    gboolean already_split = is_split(b);
    if (should_split(t, b, size)) {
        TBlock *rem = b;
        b = block_make(t, rem->seg, rem->ptr, size, ST_ALLOCATED);
        link_before(b, rem);
        /* The remainder goes back to the pool (pool_insert) with a fresh GC age. */
        if (in_pool) {
            fs_rekey(pool, rem, rem->ptr + size, rem->size - size);
        } else {
            rem->ptr += size;
            rem->size -= size;
            rem->state = ST_FREE;
            fs_insert(pool, rem);
        }
        rem->gc_base = pool->clock;
        if (!b->exp) {
            if (already_split) {
                memsim_stat_sub(&t->st.inactive_split, (int64_t)size);
            } else {
                memsim_stat_add(&t->st.inactive_split, (int64_t)rem->size);
                memsim_stat_add(&t->n_inactive_split, 1);
            }
        }
    } else {
        if (in_pool)
            fs_remove(pool, b);
        if (already_split && !b->exp) {
            memsim_stat_sub(&t->st.inactive_split, (int64_t)b->size);
            memsim_stat_sub(&t->n_inactive_split, 1);
        }
    }
    b->state = ST_ALLOCATED;
    b->requested = orig;
    kit_map_put(&t->live, b->ptr, b);
    emit(t, MEMSIM_AEV_ALLOC, b->ptr, orig, b->stream);
    kit_stats_alloc(&t->st, b->size, orig);
    return b;
}

static MemsimAllocResult torch_malloc(void *state, memsim_size_t orig, uint32_t stream,
                                      memsim_addr_t *addr)
{
    Torch *t = state;
    /* PyTorch answers a 0-byte request with a null pointer without entering the allocator,
     * and throws for absurd sizes before doing anything. */
    if (orig == 0) {
        *addr = 0;
        return MEMSIM_ALLOC_OK;
    }
    if (orig >= K_MAX_REQUEST)
        return MEMSIM_ALLOC_OOM;
    if (t->n_events)
        process_events(t);
    memsim_size_t size = round_size_cfg(&t->cfg, orig);
    TPool *pool = &t->pools[size <= K_SMALL_SIZE];
    TBlock *b = get_free_block(t, pool, stream, size);
    gboolean in_pool = TRUE;
    if (G_UNLIKELY(!b)) {
        memsim_size_t alloc_size = allocation_size(t, size);
        if (gc_active(t))
            garbage_collect(t);
        b = alloc_block(t, pool, stream, size, alloc_size, FALSE);
        if (!b && release_available_cached_blocks(t, pool, stream, size))
            b = alloc_block(t, pool, stream, size, alloc_size, FALSE);
        if (!b) {
            release_cached_blocks(t);
            b = alloc_block(t, pool, stream, size, alloc_size, TRUE);
        }
        if (!b) {
            memsim_size_t cap = t->dev->capacity;
            emit(t, MEMSIM_AEV_OOM, cap > t->total ? cap - t->total : 0, size, stream);
            t->st.n_ooms++;
            return MEMSIM_ALLOC_OOM;
        }
        in_pool = b->seg->exp; /* mapped pages are in the pool, a new segment is not */
    }
    b = alloc_found_block(t, pool, b, in_pool, size, orig);
    *addr = b->ptr;
    return MEMSIM_ALLOC_OK;
}

/* §5.1 */
static void torch_free(void *state, memsim_addr_t addr)
{
    Torch *t = state;
    if (addr == 0)
        return;
    TBlock *b = kit_map_take(&t->live, addr);
    if (!b) {
        g_critical("torch: free of 0x%" G_GINT64_MODIFIER "x, which is not allocated", addr);
        return;
    }
    b->state = ST_PENDING;
    memsim_stat_sub(&t->st.allocations, 1);
    memsim_stat_sub(&t->st.allocated, (int64_t)b->size);
    if (b->uses)
        insert_events(t, b);
    else
        free_block_inline(t, b);
}

static void torch_record_stream(void *state, memsim_addr_t addr, uint32_t stream)
{
    Torch *t = state;
    TBlock *b = kit_map_get(&t->live, addr);
    if (!b) {
        g_critical("torch: record_stream on 0x%" G_GINT64_MODIFIER "x, which is not allocated",
                   addr);
        return;
    }
    if (stream == b->stream)
        return;
    UseNode **link = &b->uses;
    while (*link && (*link)->stream < stream)
        link = &(*link)->next;
    if (*link && (*link)->stream == stream)
        return;
    UseNode *u = kit_slab_get_raw(&t->use_slab);
    u->stream = stream;
    u->next = *link;
    *link = u;
}

static void torch_empty_cache(void *state)
{
    release_cached_blocks(state);
}

/* ---------------------------------------------------------------------------------------- */
/* Stats, shape */

static MemsimAllocStats torch_stats(void *state)
{
    return ((Torch *)state)->st;
}

static const MemsimAllocStats *torch_stats_live(void *state)
{
    return &((Torch *)state)->st;
}

static void reset_peaks(Torch *t)
{
    kit_reset_peaks(&t->st);
    t->n_inactive_split.peak = t->n_inactive_split.current;
}

static void torch_reset_peaks(void *state)
{
    reset_peaks(state);
}

static MemsimAllocShape torch_shape(void *state)
{
    Torch *t = state;
    MemsimAllocShape sh = {0};
    for (TSegment *s = t->segs; s; s = s->next_seg) {
        gboolean in_run = FALSE;
        if (!s->exp)
            sh.n_segments++;
        for (TBlock *b = s->first; b; b = b->next) {
            if (b->state == ST_FREE)
                kit_shape_add_free(&sh, b->size);
            /* An expandable reservation counts one segment per mapped run, as snapshots
             * show it (§8.5). */
            if (s->exp) {
                gboolean mapped = b->state != ST_UNMAPPED;
                if (mapped && !in_run)
                    sh.n_segments++;
                in_run = mapped;
            }
        }
    }
    return sh;
}

/* ---------------------------------------------------------------------------------------- */
/* check() */

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "torch: " __VA_ARGS__);           \
        return FALSE;                                                                              \
    } while (0)

static gboolean check_node(TPool *pool, const char *what, TBlock *b, TBlock *prev,
                           gboolean unmapped, GError **error)
{
    const char *pname = pool->small ? "small" : "large";
    if (b->left && (b->left->parent != b || b->left->prio > b->prio))
        FAIL("%s pool %s: bad left link at 0x%" G_GINT64_MODIFIER "x", pname, what, b->ptr);
    if (b->right && (b->right->parent != b || b->right->prio > b->prio))
        FAIL("%s pool %s: bad right link at 0x%" G_GINT64_MODIFIER "x", pname, what, b->ptr);
    if (prev && !node_lt(prev, b, unmapped))
        FAIL("%s pool %s not sorted at 0x%" G_GINT64_MODIFIER "x", pname, what, b->ptr);
    if (b->state != (unmapped ? ST_UNMAPPED : ST_FREE))
        FAIL("%s pool %s holds block 0x%" G_GINT64_MODIFIER "x in state %d", pname, what, b->ptr,
             b->state);
    if ((gboolean)b->small != pool->small)
        FAIL("%s pool %s holds block 0x%" G_GINT64_MODIFIER "x of the other pool", pname, what,
             b->ptr);
    return TRUE;
}

/* The unmapped tree, then the free set: links, heap order, bins, bitmaps, global order. */
static gboolean check_pool(TPool *pool, uint64_t *n_free, uint64_t *n_unmapped, GError **error)
{
    const char *pname = pool->small ? "small" : "large";
    *n_free = *n_unmapped = 0;
    if (pool->uroot && pool->uroot->parent)
        FAIL("%s pool unmapped set: root has a parent", pname);
    TBlock *prev = NULL;
    for (TBlock *b = tree_first(pool->uroot); b; prev = b, b = tree_next(b)) {
        (*n_unmapped)++;
        if (!check_node(pool, "unmapped set", b, prev, TRUE, error))
            return FALSE;
    }
    for (uint32_t i = 0; i < pool->n_sets; i++) {
        StreamBins *sb = pool->sets[i];
        if (i && pool->sets[i - 1]->stream >= sb->stream)
            FAIL("%s pool: stream sets not sorted", pname);
        uint64_t n = 0;
        for (unsigned c = 0; c < KIT_N_CLASSES; c++) {
            gboolean bit = (sb->map.bits[c >> 6] >> (c & 63)) & 1;
            if (bit != (sb->bins[c] != NULL))
                FAIL("%s pool stream %u: bitmap disagrees with class %u", pname, sb->stream, c);
            if (sb->bins[c] && sb->bins[c]->parent)
                FAIL("%s pool stream %u: class %u root has a parent", pname, sb->stream, c);
            for (TBlock *b = tree_first(sb->bins[c]); b; b = tree_next(b)) {
                n++;
                if (b->stream != sb->stream || kit_size_class(b->size) != c)
                    FAIL("%s pool: block 0x%" G_GINT64_MODIFIER "x filed under stream %u class "
                         "%u",
                         pname, b->ptr, sb->stream, c);
            }
        }
        for (unsigned w = 0; w < KIT_N_WORDS; w++)
            if (((sb->map.summary >> w) & 1) != (sb->map.bits[w] != 0))
                FAIL("%s pool stream %u: summary bitmap wrong", pname, sb->stream);
        if (n != sb->n)
            FAIL("%s pool stream %u counts %" G_GUINT64_FORMAT " blocks, holds %" G_GUINT64_FORMAT,
                 pname, sb->stream, sb->n, n);
    }
    prev = NULL;
    for (TBlock *b = fs_first(pool); b; prev = b, b = fs_next(pool, b)) {
        (*n_free)++;
        if (!check_node(pool, "free set", b, prev, FALSE, error))
            return FALSE;
    }
    if (*n_free != pool->n_free)
        FAIL("%s pool counts %" G_GUINT64_FORMAT " free blocks, holds %" G_GUINT64_FORMAT, pname,
             pool->n_free, *n_free);
    return TRUE;
}

static gboolean in_tree(const TBlock *b, const TBlock *root)
{
    while (b->parent)
        b = b->parent;
    return b == root;
}

static gboolean in_free_set(TPool *pool, const TBlock *b)
{
    StreamBins *sb = bins_find(pool, b->stream);
    return sb && in_tree(b, sb->bins[kit_size_class(b->size)]);
}

static gboolean torch_check(void *state, GError **error)
{
    Torch *t = state;
    int64_t allocated = 0, active = 0, requested = 0, reserved = 0, split_bytes = 0;
    int64_t split_count = 0, segments = 0, n_alloc = 0;
    uint64_t free_count[2] = {0, 0}, unmapped_count[2] = {0, 0}, pending_events = 0;
    for (TSegment *s = t->segs; s; s = s->next_seg) {
        if (s->prev_seg ? s->prev_seg->next_seg != s : t->segs != s)
            FAIL("segment list broken at 0x%" G_GINT64_MODIFIER "x", s->base);
        if (!s->exp)
            segments++;
        else
            for (TBlock *b = s->first; b; b = b->next)
                segments += is_mapped(b) && !is_mapped(b->prev);
        memsim_addr_t expect = s->base;
        TBlock *prev = NULL;
        if (!s->first || s->first->prev)
            FAIL("segment 0x%" G_GINT64_MODIFIER "x: bad first block", s->base);
        for (TBlock *b = s->first; b; prev = b, b = b->next) {
            if (b->prev != prev)
                FAIL("block 0x%" G_GINT64_MODIFIER "x: prev link broken", b->ptr);
            if (b->seg != s || b->stream != s->stream || b->small != s->small || b->exp != s->exp)
                FAIL("block 0x%" G_GINT64_MODIFIER
                     "x disagrees with its segment 0x%" G_GINT64_MODIFIER "x",
                     b->ptr, s->base);
            if (b->ptr != expect)
                FAIL("segment 0x%" G_GINT64_MODIFIER "x: block at 0x%" G_GINT64_MODIFIER
                     "x, expected 0x%" G_GINT64_MODIFIER "x (blocks must tile the segment)",
                     s->base, b->ptr, expect);
            if (b->size == 0)
                FAIL("block 0x%" G_GINT64_MODIFIER "x has size 0", b->ptr);
            expect += b->size;
            if (prev && ((prev->state == ST_FREE && b->state == ST_FREE) ||
                         (prev->state == ST_UNMAPPED && b->state == ST_UNMAPPED)))
                FAIL("adjacent free blocks 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER
                     "x were not merged",
                     prev->ptr, b->ptr);
            if (b->event_count && b->state != ST_PENDING)
                FAIL("block 0x%" G_GINT64_MODIFIER "x has events but is not pending", b->ptr);
            if (b->uses && b->state != ST_ALLOCATED)
                FAIL("block 0x%" G_GINT64_MODIFIER "x has stream uses but is not allocated",
                     b->ptr);
            TPool *pool = pool_of(t, b);
            switch (b->state) {
            case ST_FREE:
                free_count[b->small]++;
                if (!in_free_set(pool, b))
                    FAIL("free block 0x%" G_GINT64_MODIFIER "x is not in its pool", b->ptr);
                if (!s->exp && is_split(b)) {
                    split_count++;
                    split_bytes += (int64_t)b->size;
                }
                reserved += (int64_t)b->size;
                break;
            case ST_UNMAPPED:
                if (!s->exp)
                    FAIL("unmapped block 0x%" G_GINT64_MODIFIER "x in a normal segment", b->ptr);
                unmapped_count[b->small]++;
                if (!in_tree(b, pool->uroot))
                    FAIL("unmapped block 0x%" G_GINT64_MODIFIER "x is not in its pool", b->ptr);
                break;
            case ST_ALLOCATED:
                if (kit_map_get(&t->live, b->ptr) != b)
                    FAIL("allocated block 0x%" G_GINT64_MODIFIER "x missing from the address "
                         "map",
                         b->ptr);
                n_alloc++;
                allocated += (int64_t)b->size;
                active += (int64_t)b->size;
                requested += (int64_t)b->requested;
                reserved += (int64_t)b->size;
                break;
            case ST_PENDING:
                if (b->event_count == 0)
                    FAIL("pending block 0x%" G_GINT64_MODIFIER "x has no events", b->ptr);
                pending_events += b->event_count;
                active += (int64_t)b->size;
                requested += (int64_t)b->requested;
                reserved += (int64_t)b->size;
                break;
            default:
                FAIL("block 0x%" G_GINT64_MODIFIER "x in unknown state %d", b->ptr, b->state);
            }
            if (b->state == ST_UNMAPPED && ((b->ptr - s->base) % s->page || b->size % s->page))
                FAIL("unmapped range 0x%" G_GINT64_MODIFIER "x is not made of whole pages", b->ptr);
        }
        if (expect != s->base + s->size)
            FAIL("segment 0x%" G_GINT64_MODIFIER "x: blocks cover %" G_GUINT64_FORMAT
                 " bytes of %" G_GUINT64_FORMAT,
                 s->base, expect - s->base, s->size);
    }
    TPool *pools[2] = {&t->pools[0], &t->pools[1]};
    for (int i = 0; i < 2; i++) {
        uint64_t n, nu;
        if (!check_pool(pools[i], &n, &nu, error))
            return FALSE;
        if (n != free_count[pools[i]->small])
            FAIL("%s pool holds %" G_GUINT64_FORMAT
                 " free blocks, segments have %" G_GUINT64_FORMAT,
                 pools[i]->small ? "small" : "large", n, free_count[pools[i]->small]);
        if (nu != unmapped_count[pools[i]->small])
            FAIL("%s pool holds %" G_GUINT64_FORMAT
                 " unmapped ranges, segments have %" G_GUINT64_FORMAT,
                 pools[i]->small ? "small" : "large", nu, unmapped_count[pools[i]->small]);
    }
    uint64_t queued = 0;
    for (uint32_t i = 0; i < t->n_queues; i++) {
        if (i && t->queues[i - 1].stream >= t->queues[i].stream)
            FAIL("event queues not sorted by stream");
        queued += t->queues[i].len;
    }
    if (queued != t->n_events || pending_events != t->n_events)
        FAIL("%" G_GUINT64_FORMAT " events counted, %" G_GUINT64_FORMAT
             " queued, %" G_GUINT64_FORMAT " awaited by blocks",
             t->n_events, queued, pending_events);
    if ((uint64_t)n_alloc != t->live.n)
        FAIL("address map holds %" G_GUINT64_FORMAT " blocks, segments %" G_GINT64_FORMAT,
             t->live.n, n_alloc);
    const MemsimAllocStats *st = &t->st;
    KitCheck cmp[] = {
        {"allocated", allocated, st->allocated.current},
        {"active", active, st->active.current},
        {"requested", requested, st->requested.current},
        {"reserved", reserved, st->reserved.current},
        {"reserved (total_allocated_memory)", reserved, (int64_t)t->total},
        {"inactive_split bytes", split_bytes, st->inactive_split.current},
        {"inactive_split count", split_count, t->n_inactive_split.current},
        {"segments", segments, st->segments.current},
        {"allocations", n_alloc, st->allocations.current},
    };
    if (!kit_check_stats("torch", st, cmp, G_N_ELEMENTS(cmp), error))
        return FALSE;
    if (!(allocated <= active && active <= reserved))
        FAIL("allocated <= active <= reserved violated");
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Seeding: the state at the start of a recording that begins mid-run */

static TSegment *segment_containing(Torch *t, memsim_addr_t addr)
{
    for (TSegment *s = t->segs; s; s = s->next_seg)
        if (addr >= s->base && addr - s->base < s->size)
            return s;
    return NULL;
}

static TSegment *segment_overlapping(Torch *t, memsim_addr_t addr, memsim_size_t size)
{
    for (TSegment *s = t->segs; s; s = s->next_seg)
        if (addr < s->base + s->size && s->base < addr + size)
            return s;
    return NULL;
}

/* A seeded expandable VA reservation starts at its first seeded run and is as large as a
 * real one, so it may cover space that later seeds show belongs to something else: give
 * that space back when its tail is still unmapped. */
static gboolean shrink_seeded_vas(Torch *t, memsim_addr_t addr, memsim_size_t size)
{
    for (TSegment *s = t->segs; s; s = s->next_seg) {
        if (!s->exp || !(addr < s->base + s->size && s->base < addr + size))
            continue;
        if (addr <= s->base)
            return FALSE;
        memsim_size_t keep = (addr - s->base) / s->page * s->page;
        TBlock *last = s->first;
        while (last->next)
            last = last->next;
        if (last->state != ST_UNMAPPED || last->ptr > s->base + keep)
            return FALSE;
        TPool *pool = pool_of(t, last);
        tree_remove(&pool->uroot, last);
        if (last->ptr == s->base + keep) {
            if (last->prev)
                last->prev->next = NULL;
            drop_block(t, last);
        } else {
            last->size = s->base + keep - last->ptr;
            upool_insert(pool, last);
        }
        s->size = keep;
    }
    return TRUE;
}

static gboolean seed_expandable(Torch *t, memsim_addr_t addr, memsim_size_t size, uint32_t stream,
                                gboolean small, GError **error)
{
    memsim_size_t page = page_size(t, small);
    if (size % page) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "torch: expandable segment 0x%" G_GINT64_MODIFIER "x of %" G_GUINT64_FORMAT
                    " bytes is not a whole number of %" G_GUINT64_FORMAT "-byte pages",
                    addr, size, page);
        return FALSE;
    }
    TSegment *seg = segment_containing(t, addr);
    if (seg && !(seg->exp && seg->stream == stream && seg->small == small &&
                 (addr - seg->base) % page == 0 && addr + size <= seg->base + seg->size)) {
        if (!seg->exp || !shrink_seeded_vas(t, addr, size))
            goto overlap;
        seg = NULL;
    }
    if (!seg) {
        if (!shrink_seeded_vas(t, addr, size) || segment_overlapping(t, addr, size))
            goto overlap;
        memsim_size_t va = va_size(t, page);
        if (va < size)
            va = size;
        /* Stop below the next segment up, if any. */
        for (TSegment *s = t->segs; s; s = s->next_seg)
            if (s->base > addr && s->base - addr < va)
                va = (s->base - addr) / page * page;
        seg = new_segment(t, addr, va, stream, small, page);
        TBlock *u = new_block(t, seg, addr, va, ST_UNMAPPED);
        seg->first = u;
        upool_insert(pool_of(t, u), u);
    }
    TBlock *u = seg->first;
    while (u && !(u->ptr <= addr && addr + size <= u->ptr + u->size))
        u = u->next;
    if (!u || u->state != ST_UNMAPPED)
        goto overlap;
    count_mapped_run(t, u, addr, size);
    TPool *pool = pool_of(t, u);
    tree_remove(&pool->uroot, u);
    if (u->ptr < addr) {
        TBlock *f = new_block(t, seg, u->ptr, addr - u->ptr, ST_UNMAPPED);
        link_before(f, u);
        upool_insert(pool, f);
    }
    if (addr + size < u->ptr + u->size) {
        TBlock *r = new_block(t, seg, addr + size, u->ptr + u->size - addr - size, ST_UNMAPPED);
        link_after(r, u);
        upool_insert(pool, r);
    }
    u->ptr = addr;
    u->size = size;
    u->state = ST_FREE;
    try_merge(t, u, u->prev, TRUE);
    try_merge(t, u, u->next, TRUE);
    pool_insert(pool, u);
    t->total += size;
    memsim_stat_add(&t->st.reserved, (int64_t)size);
    reset_peaks(t);
    return TRUE;
overlap:
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                "torch: seeded segment 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT
                " bytes) overlaps another segment",
                addr, size);
    return FALSE;
}

static gboolean torch_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                   uint32_t stream, uint32_t flags, GError **error)
{
    Torch *t = state;
    gboolean small = (flags & MEMSIM_SEGF_SMALL) != 0;
    if (size == 0 || addr + size < addr) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "torch: seeded segment 0x%" G_GINT64_MODIFIER
                    "x has an invalid size %" G_GUINT64_FORMAT,
                    addr, size);
        return FALSE;
    }
    if (flags & MEMSIM_SEGF_EXPANDABLE)
        return seed_expandable(t, addr, size, stream, small, error);
    if (!shrink_seeded_vas(t, addr, size) || segment_overlapping(t, addr, size)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "torch: seeded segment 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT
                    " bytes) overlaps another segment",
                    addr, size);
        return FALSE;
    }
    TSegment *seg = new_segment(t, addr, size, stream, small, 0);
    TBlock *b = new_block(t, seg, addr, size, ST_FREE);
    seg->first = b;
    pool_insert(pool_of(t, b), b);
    t->total += size;
    memsim_stat_add(&t->st.segments, 1);
    memsim_stat_add(&t->st.reserved, (int64_t)size);
    reset_peaks(t);
    return TRUE;
}

static gboolean torch_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                                 memsim_size_t requested, uint32_t stream, GError **error)
{
    Torch *t = state;
    TSegment *seg = block_size ? segment_containing(t, addr) : NULL;
    TBlock *f = seg ? seg->first : NULL;
    while (f && !(f->ptr <= addr && addr - f->ptr < f->size))
        f = f->next;
    if (!f || f->state != ST_FREE || addr + block_size > f->ptr + f->size) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "torch: seeded block 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT
                    " bytes) does not lie inside one free block of a seeded segment",
                    addr, block_size);
        return FALSE;
    }
    if (seg->stream != stream) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "torch: seeded block 0x%" G_GINT64_MODIFIER "x is on stream %u but its "
                    "segment 0x%" G_GINT64_MODIFIER "x is on stream %u",
                    addr, stream, seg->base, seg->stream);
        return FALSE;
    }
    TPool *pool = pool_of(t, f);
    fs_remove(pool, f);
    if (!f->exp && is_split(f)) {
        memsim_stat_sub(&t->n_inactive_split, 1);
        memsim_stat_sub(&t->st.inactive_split, (int64_t)f->size);
    }
    TBlock *pieces[2] = {NULL, NULL};
    if (f->ptr < addr) {
        pieces[0] = new_block(t, seg, f->ptr, addr - f->ptr, ST_FREE);
        link_before(pieces[0], f);
    }
    if (addr + block_size < f->ptr + f->size) {
        pieces[1] =
            new_block(t, seg, addr + block_size, f->ptr + f->size - addr - block_size, ST_FREE);
        link_after(pieces[1], f);
    }
    for (int i = 0; i < 2; i++) {
        if (!pieces[i])
            continue;
        pool_insert(pool, pieces[i]);
        if (!f->exp) {
            memsim_stat_add(&t->n_inactive_split, 1);
            memsim_stat_add(&t->st.inactive_split, (int64_t)pieces[i]->size);
        }
    }
    f->ptr = addr;
    f->size = block_size;
    f->state = ST_ALLOCATED;
    f->requested = requested;
    kit_map_put(&t->live, f->ptr, f);
    kit_stats_alloc(&t->st, block_size, requested);
    reset_peaks(t);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* §2 settings */

static const char torch_settings_help[] =
    "max_split_size_mb=N             blocks of N MiB or more are never split, and a smaller "
    "request never takes one (N >= 20; default unlimited)\n"
    "max_non_split_rounding_mb=N     a request >= max_split_size may take a cached block less "
    "than N MiB larger (N >= 20; default 20)\n"
    "roundup_power2_divisions=N      round requests up to one of N steps between powers of "
    "two; also [B:N,...,>:N] per size interval starting at B MiB ('>' = the intervals after "
    "the last boundary, newest PyTorch semantics)\n"
    "garbage_collection_threshold=T  with a memory fraction, free old cached segments when "
    "usage exceeds T of the allowed memory (0 < T < 1)\n"
    "expandable_segments=True|False  grow per-stream virtual reservations by mapping pages "
    "(20 MiB large, 2 MiB small) instead of cudaMalloc segments\n"
    "per_process_memory_fraction=F   cap the allocator at F x device capacity (0 <= F <= 1; "
    "active only when F < 1; needs a capacity)\n"
    "large_segment_size_mb=N         segment size for 1-10 MiB requests and large page size "
    "(N > 10; default 20)\n"
    "backend=native                  cudaMallocAsync is not modelled\n"
    "release_lock_on_cudamalloc=B, graph_capture_record_stream_reuse=B, pinned_*=...  "
    "accepted, no effect\n"
    "Both PYTORCH_CUDA_ALLOC_CONF's key:value and key=value are accepted.";

/* ---------------------------------------------------------------------------------------- */
/* Life cycle */

static void *torch_create(const char *settings, MemsimDevice *dev, GError **error)
{
    TorchConfig cfg;
    if (!torch_settings_parse(settings, &cfg, error))
        return NULL;
    if (cfg.fraction < 1.0 && dev->capacity == 0) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "torch settings: per_process_memory_fraction:%g needs a device capacity "
                    "(the device is unlimited)",
                    cfg.fraction);
        return NULL;
    }
    Torch *t = g_new0(Torch, 1);
    t->dev = dev;
    t->cfg = cfg;
    t->pools[1].small = TRUE;
    t->pools[0].small = FALSE;
    kit_map_init(&t->live, 4);
    /* Whole cache lines for a block (the fields a search reads share the first). */
    kit_slab_init_aligned(&t->block_slab, sizeof(TBlock), 64);
    kit_slab_init_aligned(&t->seg_slab, sizeof(TSegment), sizeof(void *));
    kit_slab_init_aligned(&t->use_slab, sizeof(UseNode), sizeof(void *));
    t->rng = 0x9E3779B9u;
    t->scratch = g_ptr_array_new();
    return t;
}

static void torch_destroy(void *state)
{
    Torch *t = state;
    if (!t)
        return;
    for (uint32_t i = 0; i < t->n_queues; i++)
        g_free(t->queues[i].ring);
    g_free(t->queues);
    kit_map_clear(&t->live);
    TPool *pools[2] = {&t->pools[0], &t->pools[1]};
    for (int i = 0; i < 2; i++) {
        for (uint32_t k = 0; k < pools[i]->n_sets; k++)
            g_free(pools[i]->sets[k]);
        g_free(pools[i]->sets);
    }
    kit_slab_clear(&t->block_slab);
    kit_slab_clear(&t->seg_slab);
    kit_slab_clear(&t->use_slab);
    g_ptr_array_unref(t->scratch);
    g_free(t);
}

/* The layout, as a snapshot's `segments` show it (TORCH_ALLOCATOR.md §11.2). */
static void torch_foreach_block(void *state, MemsimBlockFunc fn, void *user)
{
    Torch *t = state;
    for (TSegment *s = t->segs; s; s = s->next_seg)
        for (TBlock *b = s->first; b; b = b->next) {
            MemsimBlockInfo info = {
                .segment = s->base,
                .segment_size = s->size,
                .stream = s->stream,
                .segment_flags = (s->small ? MEMSIM_SEGF_SMALL : 0u) |
                                 (s->exp ? MEMSIM_SEGF_EXPANDABLE : 0u),
                .addr = b->ptr,
                .size = b->size,
                .requested = b->requested,
                .state = b->state == ST_ALLOCATED  ? MEMSIM_BLOCK_ALLOCATED
                         : b->state == ST_PENDING  ? MEMSIM_BLOCK_PENDING_FREE
                         : b->state == ST_UNMAPPED ? MEMSIM_BLOCK_UNMAPPED
                                                   : MEMSIM_BLOCK_FREE,
            };
            fn(user, &info);
        }
}

static const MemsimAllocOps torch_ops = {
    .name = "torch",
    .description = "PyTorch's CUDA caching allocator (native backend), modelled exactly",
    .settings_help = torch_settings_help,
    .create = torch_create,
    .destroy = torch_destroy,
    .malloc = torch_malloc,
    .free = torch_free,
    .record_stream = torch_record_stream,
    .empty_cache = torch_empty_cache,
    .stats = torch_stats,
    .stats_live = torch_stats_live,
    .stats_live_fixed = TRUE,
    .shape = torch_shape,
    .reset_peaks = torch_reset_peaks,
    .check = torch_check,
    .seed_segment = torch_seed_segment,
    .seed_block = torch_seed_block,
    .round_size = torch_round_size,
    .foreach_block = torch_foreach_block,
};

const MemsimAllocOps *memsim_alloc_torch_ops(void)
{
    return &torch_ops;
}
