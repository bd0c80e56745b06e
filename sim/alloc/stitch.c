/* stitch — virtual-memory stitching in the style of GMLake, a research policy.
 *
 * Source: Guo et al., "GMLake: Efficient and Transparent GPU Memory Defragmentation for
 * Large-scale DNN Training with Virtual Memory Stitching", ASPLOS 2024; its code,
 * GMLake/src/CUDACachingAllocator.cpp in github.com/intelligent-machine-learning/glake (a
 * PyTorch 2.0 caching allocator whose large pool is built on the CUDA VMM API), and the
 * project's GMLake-tutorial.md for the settings. GMLake keeps PyTorch's small pool, but backs
 * every large block with 2 MiB physical chunks (kGranularity) mapped into a virtual range;
 * when no cached block fits a request, it "stitches" free blocks of any address into a new
 * virtual range (get_fused_fragmented_blocks: largest free blocks first until their sum covers
 * the request, the last one split), so that free memory scattered in holes serves one large
 * tensor without new physical memory.
 *
 * What is modelled:
 *   - Requests up to 1 MiB: PyTorch's small pool (512-byte rounding, 2 MiB cudaMalloc
 *     segments, best fit by (size, address), split, coalescing).
 *   - Larger requests round up to whole chunks (`granularity_mb`, default 2). A virtual range
 *     is a run of chunk slots; its blocks are in use, free (mapped, cached) or unmapped.
 *     In order: (1) the best-fitting free block, split at the low end (PyTorch's large rule:
 *     a remainder over 1 MiB is split off, always the case with whole chunks); (2) when
 *     defrag_level is 0 and the free chunks add up to the request: a stitch; (3) a new virtual
 *     range backed by new chunks, if the device has room; (4) a stitch of all free chunks plus
 *     new chunks for the shortfall, if that fits (GMLake's get_fused_fragmented_blocks at
 *     times 1 and 2, after its own retries); (5) empty the cache (as PyTorch's
 *     release_cached_blocks) and retry (3); (6) out of memory.
 *   - A stitch takes free blocks largest first, splitting the last so that only what is
 *     needed moves, unmaps their chunks from their old ranges and maps them, with any new
 *     chunks, into a new virtual range that the request gets whole. A range whose chunks are
 *     all gone releases its addresses. Stitching applies only to requests of at least
 *     `fragment_limit_mb` (0 here by default, so every large request may stitch; GMLake's
 *     fragLimit is 512 MiB in its tutorial and 32 MiB in its code).
 *   - A freed stitched block stays a cached free block of its own virtual range and is reused
 *     by best fit like any other (GMLake's free_fused_blocks).
 *   - Recorded segments of a recording that starts mid-run are plain cudaMalloc memory: they
 *     serve requests by best fit (small ones if flagged small) but are never stitched.
 * Simplified: GMLake maps a physical chunk into both its primitive block and the stitched
 * block at once and tracks both views; here a chunk belongs to one range at a time (it moves),
 * which reserves the same physical bytes. Not modelled: reuseLimit and the garbage collection
 * of stitched ranges (they only bound virtual-address use), streams (ignored), events.
 *
 * Statistics: reserved = physical bytes (mapped chunks + small and recorded segments), as
 * GMLake's reserved_bytes; allocated = active = bytes of blocks in use; segments = virtual
 * ranges + small and recorded segments; n_device_alloc = driver allocations of physical
 * memory (a cudaMalloc of a small segment, a batch of chunks for a new range or for a stitch's
 * shortfall); n_device_free = releases of physical memory; inactive_split = free blocks that
 * share their segment. Events: SEG_ALLOC / SEG_FREE give address ranges (a stitch is a
 * SEG_ALLOC of a new virtual range; its chunks may all be old ones).
 *
 * Data structures and cost (n = free blocks): blocks and segments come from slabs; three free
 * sets (small pool, virtual ranges, recorded segments), each ordered (size, address) in
 * size-class treaps with a bitmap of non-empty classes (sim/alloc/kit.h): best fit is a
 * lower_bound, O(log n); a stitch walks the free blocks from
 * the largest, O(k log n) for k blocks taken. Blocks in use are found by address in an
 * open-addressing map, O(1); the blocks of a segment form a doubly linked list in address
 * order (merging is O(1)). Segments are kept sorted by address.
 */
#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

#define MIN_BLOCK ((memsim_size_t)512)
#define SMALL_SIZE KIT_MIB          /* kSmallSize */
#define SMALL_SEGMENT (2 * KIT_MIB) /* kSmallBuffer */

enum { S_FREE = 0, S_USED, S_UNMAPPED };
enum { K_SMALL = 0, K_RANGE, K_RECORDED };

typedef struct SSeg SSeg;
typedef struct SBlk SBlk;

struct SBlk {
    KitNode node; /* its free set while free */
    memsim_addr_t ptr;
    memsim_size_t size;
    memsim_size_t requested;
    SBlk *prev, *next; /* address neighbours in the segment */
    SSeg *seg;
    uint8_t state;
    uint32_t stream; /* in use: the request's, reported with its free */
};

struct SSeg {
    KitSeg k;
    SBlk *first;
    uint64_t n_used;
    memsim_size_t mapped; /* physical bytes behind it */
    uint8_t kind;
};

typedef struct {
    memsim_size_t granularity;
    memsim_size_t fragment_limit;
    int defrag_level;
} StitchConfig;

typedef struct {
    MemsimDevice *dev;
    StitchConfig cfg;
    KitBins free_sets[3];           /* by segment kind, each ordered (size, address) */
    memsim_size_t free_range_bytes; /* free (mapped) bytes in virtual ranges: stitchable */
    KitAddrMap live;
    KitSlab blocks, seg_slab;
    KitSegs segs;
    uint32_t rng;
    MemsimAllocStats st;
} Stitch;

static gboolean blk_less(const KitNode *a, const KitNode *b)
{
    const SBlk *x = (const SBlk *)a, *y = (const SBlk *)b;
    if (x->size != y->size)
        return x->size < y->size;
    return x->ptr < y->ptr;
}

static memsim_size_t blk_size(const KitNode *n)
{
    return ((const SBlk *)n)->size;
}

static inline gboolean is_split(const SBlk *b)
{
    return b->prev || b->next;
}

static void free_insert(Stitch *s, SBlk *b)
{
    uint8_t k = b->seg->kind;
    b->state = S_FREE;
    b->node.prio = kit_prio(&s->rng);
    kit_bins_insert(&s->free_sets[k], &b->node, b->size, blk_less);
    if (k == K_RANGE)
        s->free_range_bytes += b->size;
    if (is_split(b))
        memsim_stat_add(&s->st.inactive_split, (int64_t)b->size);
}

static void free_remove(Stitch *s, SBlk *b)
{
    uint8_t k = b->seg->kind;
    kit_bins_remove(&s->free_sets[k], &b->node, b->size);
    if (k == K_RANGE)
        s->free_range_bytes -= b->size;
    if (is_split(b))
        memsim_stat_sub(&s->st.inactive_split, (int64_t)b->size);
}

static SBlk *lower_bound(const KitBins *set, memsim_size_t n)
{
    return (SBlk *)kit_bins_lower_bound(set, n, blk_size);
}

static SBlk *new_blk(Stitch *s, SSeg *g, memsim_addr_t ptr, memsim_size_t size, uint8_t state)
{
    SBlk *b = kit_slab_get(&s->blocks);
    b->ptr = ptr;
    b->size = size;
    b->seg = g;
    b->state = state;
    return b;
}

/* A segment of `size` bytes, all mapped, `fresh` of them new to the policy (the rest moved
 * from other ranges by a stitch). */
static SSeg *add_seg(Stitch *s, memsim_addr_t base, memsim_size_t size, uint8_t kind,
                     memsim_size_t fresh)
{
    SSeg *g = kit_slab_get(&s->seg_slab);
    g->k.base = base;
    g->k.size = size;
    g->kind = kind;
    g->mapped = size;
    kit_segs_insert(&s->segs, &g->k);
    g->first = new_blk(s, g, base, size, S_FREE);
    memsim_stat_add(&s->st.reserved, (int64_t)fresh);
    memsim_stat_add(&s->st.segments, 1);
    return g;
}

static void drop_seg(Stitch *s, SSeg *g, uint32_t stream)
{
    g_assert(g->first->next == NULL && g->n_used == 0 && g->mapped == 0);
    kit_slab_put(&s->blocks, g->first);
    kit_segs_remove(&s->segs, &g->k);
    memsim_stat_sub(&s->st.segments, 1);
    memsim_device_emit(s->dev, MEMSIM_AEV_SEG_FREE, g->k.base, g->k.size, stream);
    kit_slab_put(&s->seg_slab, g);
}

static inline memsim_size_t device_free(const Stitch *s)
{
    memsim_size_t cap = s->dev->capacity, held = (memsim_size_t)s->st.reserved.current;
    if (!cap)
        return UINT64_MAX;
    return cap > held ? cap - held : 0;
}

/* b (free, out of its set) keeps n bytes; the rest becomes a free block after it. */
static void split_blk(Stitch *s, SBlk *b, memsim_size_t n)
{
    SBlk *rest = new_blk(s, b->seg, b->ptr + n, b->size - n, S_FREE);
    b->size = n;
    rest->prev = b;
    rest->next = b->next;
    if (b->next)
        b->next->prev = rest;
    b->next = rest;
    free_insert(s, rest);
}

/* Folds b's next neighbour into b when both are in `state` (the neighbour is out of any
 * free set). */
static void absorb_next(Stitch *s, SBlk *b)
{
    SBlk *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    kit_slab_put(&s->blocks, n);
}

static void use_blk(Stitch *s, SBlk *b, memsim_size_t requested, uint32_t stream)
{
    b->state = S_USED;
    b->requested = requested;
    b->stream = stream;
    b->seg->n_used++;
    kit_map_put(&s->live, b->ptr, b);
    memsim_stat_add(&s->st.allocated, (int64_t)b->size);
    memsim_stat_add(&s->st.active, (int64_t)b->size);
    memsim_stat_add(&s->st.requested, (int64_t)requested);
    memsim_stat_add(&s->st.allocations, 1);
    memsim_device_emit(s->dev, MEMSIM_AEV_ALLOC, b->ptr, requested, stream);
}

/* A free block (out of its set) of a virtual range gives its chunks back: it becomes
 * unmapped, merges with unmapped neighbours, and the range goes when nothing is mapped. */
static void unmap_blk(Stitch *s, SBlk *b, uint32_t stream)
{
    SSeg *g = b->seg;
    b->state = S_UNMAPPED;
    g->mapped -= b->size;
    if (b->next && b->next->state == S_UNMAPPED)
        absorb_next(s, b);
    if (b->prev && b->prev->state == S_UNMAPPED)
        absorb_next(s, b->prev);
    if (g->mapped == 0)
        drop_seg(s, g, stream);
}

/* A new virtual range of `size` bytes handed out whole, with `fresh` bytes of new chunks. */
static SBlk *new_range(Stitch *s, memsim_size_t size, memsim_size_t fresh, uint32_t stream)
{
    memsim_addr_t base = kit_segment_addr(s->dev, &s->segs, size, stream);
    SSeg *g = add_seg(s, base, size, K_RANGE, fresh);
    if (fresh)
        s->st.n_device_alloc++;
    memsim_device_emit(s->dev, MEMSIM_AEV_SEG_ALLOC, base, size, stream);
    return g->first;
}

/* Stitches free chunks (largest blocks first) and `fresh` bytes of new ones into a new range
 * of `size` bytes. The caller made sure that enough are free. */
static SBlk *stitch(Stitch *s, memsim_size_t size, memsim_size_t fresh, uint32_t stream)
{
    memsim_size_t need = size - fresh;
    while (need) {
        SBlk *b = (SBlk *)kit_bins_last(&s->free_sets[K_RANGE]);
        g_assert(b != NULL);
        free_remove(s, b);
        if (b->size > need)
            split_blk(s, b, need); /* the low part moves, the rest stays cached */
        need -= b->size;
        unmap_blk(s, b, stream);
    }
    return new_range(s, size, fresh, stream);
}

/* Returns every cached byte to the device (PyTorch's release_cached_blocks; empty_cache):
 * wholly free small and recorded segments, and the chunks of every free block of a range. */
static void release_cached(Stitch *s)
{
    for (guint i = s->segs.n; i-- > 0;) {
        SSeg *g = (SSeg *)s->segs.v[i];
        if (g->kind != K_RANGE) {
            if (g->n_used)
                continue;
            free_remove(s, g->first);
            memsim_stat_sub(&s->st.reserved, (int64_t)g->mapped);
            g->mapped = 0;
            s->st.n_device_free++;
            drop_seg(s, g, 0);
            continue;
        }
        for (SBlk *b = g->first, *next; b; b = next) {
            next = b->next;
            if (b->state != S_FREE)
                continue;
            gboolean last = g->mapped == b->size;
            if (next && next->state == S_UNMAPPED)
                next = next->next; /* it will be folded into b */
            free_remove(s, b);
            memsim_stat_sub(&s->st.reserved, (int64_t)b->size);
            s->st.n_device_free++;
            unmap_blk(s, b, 0);
            if (last)
                break; /* the range is gone */
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The policy */

static memsim_size_t stitch_round(void *state, memsim_size_t size)
{
    Stitch *s = state;
    if (size <= SMALL_SIZE)
        return size <= MIN_BLOCK ? MIN_BLOCK : kit_round_up(size, MIN_BLOCK);
    return kit_round_up(size, s->cfg.granularity);
}

static MemsimAllocResult oom(Stitch *s, memsim_size_t rounded, uint32_t stream)
{
    memsim_size_t cap = s->dev->capacity, held = (memsim_size_t)s->st.reserved.current;
    s->st.n_ooms++;
    memsim_device_emit(s->dev, MEMSIM_AEV_OOM, cap > held ? cap - held : 0, rounded, stream);
    return MEMSIM_ALLOC_OOM;
}

/* Carves n bytes at the low end of free block b (out of its set); PyTorch's rule for large
 * blocks splits off a remainder over 1 MiB, for small ones any remainder. */
static SBlk *carve(Stitch *s, SBlk *b, memsim_size_t n)
{
    memsim_size_t rest = b->size - n;
    if (b->seg->kind == K_SMALL ? rest >= MIN_BLOCK : rest > SMALL_SIZE)
        split_blk(s, b, n);
    return b;
}

static SBlk *small_malloc(Stitch *s, memsim_size_t n, uint32_t stream)
{
    SBlk *b = lower_bound(&s->free_sets[K_SMALL], n);
    if (b) {
        free_remove(s, b);
        return carve(s, b, n);
    }
    if (device_free(s) < SMALL_SEGMENT)
        release_cached(s);
    if (device_free(s) < SMALL_SEGMENT)
        return NULL;
    memsim_addr_t base = kit_segment_addr(s->dev, &s->segs, SMALL_SEGMENT, stream);
    SSeg *g = add_seg(s, base, SMALL_SEGMENT, K_SMALL, SMALL_SEGMENT);
    s->st.n_device_alloc++;
    memsim_device_emit(s->dev, MEMSIM_AEV_SEG_ALLOC, base, SMALL_SEGMENT, stream);
    return carve(s, g->first, n);
}

static SBlk *large_malloc(Stitch *s, memsim_size_t n, uint32_t stream)
{
    SBlk *b = lower_bound(&s->free_sets[K_RANGE], n);
    SBlk *r = lower_bound(&s->free_sets[K_RECORDED], n);
    if (r && (!b || blk_less(&r->node, &b->node)))
        b = r;
    if (b) {
        free_remove(s, b);
        return carve(s, b, n);
    }
    gboolean stitchable = n >= s->cfg.fragment_limit;
    if (stitchable && s->cfg.defrag_level == 0 && s->free_range_bytes >= n)
        return stitch(s, n, 0, stream);
    if (device_free(s) >= n)
        return new_range(s, n, n, stream);
    if (stitchable && s->free_range_bytes + device_free(s) >= n)
        return stitch(s, n, n > s->free_range_bytes ? n - s->free_range_bytes : 0, stream);
    release_cached(s);
    if (device_free(s) >= n)
        return new_range(s, n, n, stream);
    return NULL;
}

static MemsimAllocResult stitch_malloc(void *state, memsim_size_t size, uint32_t stream,
                                       memsim_addr_t *addr)
{
    Stitch *s = state;
    memsim_size_t n = stitch_round(s, size);
    SBlk *b = size <= SMALL_SIZE ? small_malloc(s, n, stream) : large_malloc(s, n, stream);
    if (!b)
        return oom(s, n, stream);
    use_blk(s, b, size, stream);
    *addr = b->ptr;
    return MEMSIM_ALLOC_OK;
}

static void stitch_free(void *state, memsim_addr_t addr)
{
    Stitch *s = state;
    SBlk *b = kit_map_take(&s->live, addr);
    if (!b) {
        g_critical("stitch: free of 0x%" G_GINT64_MODIFIER "x, which is not allocated", addr);
        return;
    }
    b->state = S_FREE;
    b->seg->n_used--;
    memsim_stat_sub(&s->st.allocated, (int64_t)b->size);
    memsim_stat_sub(&s->st.active, (int64_t)b->size);
    memsim_stat_sub(&s->st.requested, (int64_t)b->requested);
    memsim_stat_sub(&s->st.allocations, 1);
    memsim_device_emit(s->dev, MEMSIM_AEV_FREE_COMPLETED, addr, b->requested, b->stream);
    if (b->next && b->next->state == S_FREE) {
        free_remove(s, b->next);
        absorb_next(s, b);
    }
    if (b->prev && b->prev->state == S_FREE) {
        SBlk *p = b->prev;
        free_remove(s, p);
        absorb_next(s, p);
        b = p;
    }
    free_insert(s, b);
}

static void stitch_empty_cache(void *state)
{
    release_cached(state);
}

static MemsimAllocStats stitch_stats(void *state)
{
    return ((Stitch *)state)->st;
}

static void stitch_reset_peaks(void *state)
{
    kit_reset_peaks(&((Stitch *)state)->st);
}

static MemsimAllocShape stitch_shape(void *state)
{
    Stitch *s = state;
    MemsimAllocShape sh = {0};
    sh.n_segments = s->segs.n;
    for (guint i = 0; i < s->segs.n; i++)
        for (SBlk *b = ((SSeg *)s->segs.v[i])->first; b; b = b->next) {
            if (b->state != S_FREE)
                continue;
            sh.free_bytes += b->size;
            sh.n_free_blocks++;
            if (b->size > sh.largest_free)
                sh.largest_free = b->size;
        }
    return sh;
}

/* A virtual range is listed as an expandable segment (mapped runs and unmapped holes), as a
 * snapshot of PyTorch's expandable segments shows one. */
static void stitch_foreach_block(void *state, MemsimBlockFunc fn, void *user)
{
    Stitch *s = state;
    static const uint32_t flags[] = {MEMSIM_SEGF_SMALL, MEMSIM_SEGF_EXPANDABLE, 0};
    static const uint32_t states[] = {MEMSIM_BLOCK_FREE, MEMSIM_BLOCK_ALLOCATED,
                                      MEMSIM_BLOCK_UNMAPPED};
    for (guint i = 0; i < s->segs.n; i++) {
        SSeg *g = (SSeg *)s->segs.v[i];
        for (SBlk *b = g->first; b; b = b->next) {
            MemsimBlockInfo info = {.segment = g->k.base,
                                    .segment_size = g->k.size,
                                    .stream = 0,
                                    .segment_flags = flags[g->kind],
                                    .addr = b->ptr,
                                    .size = b->size,
                                    .requested = b->state == S_USED ? b->requested : 0,
                                    .state = states[b->state]};
            fn(user, &info);
        }
    }
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "stitch: " __VA_ARGS__);          \
        return FALSE;                                                                              \
    } while (0)

static gboolean stitch_check(void *state, GError **error)
{
    Stitch *s = state;
    int64_t allocated = 0, requested = 0, reserved = 0, split = 0, n_used = 0;
    uint64_t n_free[3] = {0, 0, 0};
    memsim_size_t range_free = 0;
    for (guint i = 0; i < s->segs.n; i++) {
        SSeg *g = (SSeg *)s->segs.v[i];
        if (i && s->segs.v[i - 1]->base + s->segs.v[i - 1]->size > g->k.base)
            FAIL("segments 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER "x overlap",
                 s->segs.v[i - 1]->base, g->k.base);
        memsim_size_t unit = g->kind == K_RANGE ? s->cfg.granularity : MIN_BLOCK;
        memsim_addr_t expect = g->k.base;
        memsim_size_t mapped = 0;
        uint64_t used = 0;
        SBlk *prev = NULL;
        for (SBlk *b = g->first; b; prev = b, b = b->next) {
            if (b->prev != prev || b->seg != g)
                FAIL("block 0x%" G_GINT64_MODIFIER "x: broken links", b->ptr);
            if (b->ptr != expect || b->size == 0 || b->size % unit)
                FAIL("segment 0x%" G_GINT64_MODIFIER "x: block 0x%" G_GINT64_MODIFIER
                     "x of %" G_GUINT64_FORMAT " bytes where 0x%" G_GINT64_MODIFIER
                     "x was expected "
                     "(blocks must tile their segment in %" G_GUINT64_FORMAT "-byte units)",
                     g->k.base, b->ptr, b->size, expect, unit);
            expect += b->size;
            if (prev && prev->state == b->state && b->state != S_USED)
                FAIL("neighbours 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER "x, both "
                     "%s, were not merged",
                     prev->ptr, b->ptr, b->state == S_FREE ? "free" : "unmapped");
            switch (b->state) {
            case S_USED:
                used++;
                mapped += b->size;
                allocated += (int64_t)b->size;
                requested += (int64_t)b->requested;
                if (kit_map_get(&s->live, b->ptr) != b)
                    FAIL("block 0x%" G_GINT64_MODIFIER "x in use but not in the address map",
                         b->ptr);
                if (b->requested > b->size)
                    FAIL("block 0x%" G_GINT64_MODIFIER "x smaller than its request", b->ptr);
                break;
            case S_FREE:
                mapped += b->size;
                n_free[g->kind]++;
                if (g->kind == K_RANGE)
                    range_free += b->size;
                if (!kit_bins_contains(&s->free_sets[g->kind], &b->node, b->size))
                    FAIL("free block 0x%" G_GINT64_MODIFIER "x is not in its free set", b->ptr);
                if (is_split(b))
                    split += (int64_t)b->size;
                break;
            case S_UNMAPPED:
                if (g->kind != K_RANGE)
                    FAIL("unmapped block 0x%" G_GINT64_MODIFIER "x outside a virtual range",
                         b->ptr);
                break;
            default:
                FAIL("block 0x%" G_GINT64_MODIFIER "x in unknown state %d", b->ptr, b->state);
            }
        }
        if (expect != g->k.base + g->k.size)
            FAIL("segment 0x%" G_GINT64_MODIFIER "x: blocks cover %" G_GUINT64_FORMAT
                 " of %" G_GUINT64_FORMAT " bytes",
                 g->k.base, expect - g->k.base, g->k.size);
        if (mapped != g->mapped || mapped == 0)
            FAIL("segment 0x%" G_GINT64_MODIFIER "x: %" G_GUINT64_FORMAT " bytes mapped, "
                 "counted %" G_GUINT64_FORMAT " (a range with nothing mapped must be gone)",
                 g->k.base, mapped, g->mapped);
        if (used != g->n_used)
            FAIL("segment 0x%" G_GINT64_MODIFIER "x counts %" G_GUINT64_FORMAT " blocks in use, "
                 "holds %" G_GUINT64_FORMAT,
                 g->k.base, g->n_used, used);
        reserved += (int64_t)mapped;
        n_used += (int64_t)used;
    }
    /* Every free block of a segment was found in its set, so equal counts mean that the sets
     * hold nothing else. */
    for (int k = 0; k < 3; k++) {
        int64_t n = kit_bins_verify(&s->free_sets[k], blk_less, blk_size);
        if (n < 0)
            FAIL("free set %d: size classes are not well-formed trees sorted by (size, address)",
                 k);
        if ((uint64_t)n != n_free[k])
            FAIL("free set %d holds %" G_GINT64_FORMAT " blocks, segments have %" G_GUINT64_FORMAT
                 " free",
                 k, n, n_free[k]);
    }
    if (range_free != s->free_range_bytes)
        FAIL("%" G_GUINT64_FORMAT " free bytes in virtual ranges, counted %" G_GUINT64_FORMAT,
             range_free, s->free_range_bytes);
    if ((int64_t)s->live.n != n_used)
        FAIL("address map holds %" G_GUINT64_FORMAT " blocks, segments %" G_GINT64_FORMAT,
             s->live.n, n_used);
    KitCheck cmp[] = {
        {"allocated", allocated, s->st.allocated.current},
        {"active", allocated, s->st.active.current},
        {"requested", requested, s->st.requested.current},
        {"reserved", reserved, s->st.reserved.current},
        {"segments", (int64_t)s->segs.n, s->st.segments.current},
        {"allocations", n_used, s->st.allocations.current},
        {"inactive_split", split, s->st.inactive_split.current},
    };
    return kit_check_stats("stitch", &s->st, cmp, G_N_ELEMENTS(cmp), error);
}

/* ---------------------------------------------------------------------------------------- */
/* Seeding: recorded segments are cudaMalloc memory (small pool if flagged small); a live
 * block keeps its address and its request rounded to 512 bytes. */

static gboolean stitch_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                    uint32_t stream, uint32_t flags, GError **error)
{
    Stitch *s = state;
    if (size == 0 || size % MIN_BLOCK || addr % MIN_BLOCK || kit_segs_overlap(&s->segs, addr, size))
        FAIL("cannot start from segment 0x%" G_GINT64_MODIFIER "x of %" G_GUINT64_FORMAT
             " bytes (empty, not in 512-byte units, or overlapping another)",
             addr, size);
    SSeg *g = add_seg(s, addr, size, (flags & MEMSIM_SEGF_SMALL) ? K_SMALL : K_RECORDED, size);
    free_insert(s, g->first);
    kit_reset_peaks(&s->st);
    return TRUE;
}

static gboolean stitch_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                                  memsim_size_t requested, uint32_t stream, GError **error)
{
    Stitch *s = state;
    memsim_size_t n = kit_round_up(requested ? requested : block_size, MIN_BLOCK);
    SSeg *g = (SSeg *)kit_segs_find(&s->segs, addr);
    SBlk *b = g ? g->first : NULL;
    while (b && !(b->ptr <= addr && addr - b->ptr < b->size))
        b = b->next;
    if (!n || !b || b->state != S_FREE || g->kind == K_RANGE || addr % MIN_BLOCK ||
        addr + n > b->ptr + b->size)
        FAIL("seeded block 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT " bytes) does not "
             "lie inside one free block of a seeded segment",
             addr, n);
    free_remove(s, b);
    if (b->ptr < addr) {
        SBlk *front = b;
        split_blk(s, front, addr - front->ptr);
        b = front->next;
        free_remove(s, b);
        free_insert(s, front);
    }
    if (b->size > n)
        split_blk(s, b, n);
    b->state = S_USED;
    b->requested = requested;
    b->stream = stream;
    b->seg->n_used++;
    kit_map_put(&s->live, b->ptr, b);
    memsim_stat_add(&s->st.allocated, (int64_t)b->size);
    memsim_stat_add(&s->st.active, (int64_t)b->size);
    memsim_stat_add(&s->st.requested, (int64_t)requested);
    memsim_stat_add(&s->st.allocations, 1);
    kit_reset_peaks(&s->st);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Settings and life cycle */

static const char stitch_keys[] = "granularity_mb, fragment_limit_mb, defrag_level";

static const char stitch_settings_help[] =
    "granularity_mb=N      physical chunk size in MiB, a power of two from 2 to 1024 (default "
    "2, CUDA's VMM granularity); requests over 1 MiB round up to whole chunks\n"
    "fragment_limit_mb=N   only requests of at least N MiB may be stitched (default 0; "
    "GMLake's fragLimit: 512 in its tutorial, 32 in its code)\n"
    "defrag_level=0|1      0: stitch free chunks before asking the device for new ones "
    "(default, GMLake's tutorial); 1: only when the device is short (GMLake's code)";

static gboolean stitch_setting(void *cfgp, const char *key, const char *value, GError **error)
{
    StitchConfig *cfg = cfgp;
    uint64_t v;
    if (strcmp(key, "granularity_mb") == 0) {
        if (!kit_parse_u64(value, &v) || !kit_is_pow2(v) || v < 2 || v > 1024)
            FAIL("granularity_mb must be a power of two from 2 to 1024 (got '%s')", value);
        cfg->granularity = v * KIT_MIB;
    } else if (strcmp(key, "fragment_limit_mb") == 0) {
        if (!kit_parse_u64(value, &v) || v > ((uint64_t)1 << 30))
            FAIL("fragment_limit_mb must be an integer number of MiB (got '%s')", value);
        cfg->fragment_limit = v * KIT_MIB;
    } else if (strcmp(key, "defrag_level") == 0) {
        if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0)
            FAIL("defrag_level must be 0 or 1 (got '%s')", value);
        cfg->defrag_level = value[0] - '0';
    } else {
        FAIL("unknown setting '%s' (accepted: %s)", key, stitch_keys);
    }
    return TRUE;
}

static void *stitch_create(const char *settings, MemsimDevice *dev, GError **error)
{
    StitchConfig cfg = {2 * KIT_MIB, 0, 0};
    if (!kit_parse_settings("stitch", settings, stitch_keys, stitch_setting, &cfg, error))
        return NULL;
    Stitch *s = g_new0(Stitch, 1);
    s->dev = dev;
    s->cfg = cfg;
    kit_map_init(&s->live, 4);
    kit_slab_init(&s->blocks, sizeof(SBlk));
    kit_slab_init(&s->seg_slab, sizeof(SSeg));
    s->rng = 0x1B873593u;
    return s;
}

static void stitch_destroy(void *state)
{
    Stitch *s = state;
    if (!s)
        return;
    kit_map_clear(&s->live);
    kit_slab_clear(&s->blocks);
    kit_slab_clear(&s->seg_slab);
    kit_segs_clear(&s->segs);
    g_free(s);
}

static const MemsimAllocOps stitch_ops = {
    .name = "stitch",
    .description = "GMLake-style virtual memory stitching: 2 MiB physical chunks, free chunks "
                   "remapped into one range for a large request",
    .settings_help = stitch_settings_help,
    .create = stitch_create,
    .destroy = stitch_destroy,
    .malloc = stitch_malloc,
    .free = stitch_free,
    .empty_cache = stitch_empty_cache,
    .stats = stitch_stats,
    .shape = stitch_shape,
    .reset_peaks = stitch_reset_peaks,
    .check = stitch_check,
    .seed_segment = stitch_seed_segment,
    .seed_block = stitch_seed_block,
    .round_size = stitch_round,
    .foreach_block = stitch_foreach_block,
};

const MemsimAllocOps *memsim_alloc_stitch_ops(void)
{
    return &stitch_ops;
}
