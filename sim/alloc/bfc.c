/* bfc — TensorFlow's best-fit-with-coalescing allocator, as XLA (and so JAX) and TensorFlow
 * use it for GPU memory.
 *
 * Source: tsl::BFCAllocator, third_party/xla/xla/tsl/framework/bfc_allocator.{h,cc} in the
 * TensorFlow repository (formerly tensorflow/core/common_runtime/bfc_allocator.cc), read at
 * the 2025 version; JAX's options come from xla/pjrt/gpu/gpu_helpers.cc (CreateBFCAllocator:
 * allow_growth = !preallocate, garbage_collection left at its default, false) and
 * TensorFlow's from GPUBFCAllocator (garbage collection on unless
 * TF_ENABLE_GPU_GARBAGE_COLLECTION=false). What is reproduced, decision by decision:
 *
 *   RoundedBytes     requests round up to a multiple of kMinAllocationSize = 256 bytes.
 *   BinNumForSize    21 bins (kNumBins); bin b holds free chunks of [256 << b, 512 << b),
 *                    bin 20 everything from 256 MiB: b = min(20, floor(log2(max(n, 256) >> 8))).
 *                    Each bin is a set ordered by (size, address).
 *   FindChunkPtr     from the request's bin upward, the first chunk of a bin's order that is
 *                    large enough: the smallest fitting chunk, lowest address among equals.
 *                    It is split (SplitChunk: the request keeps the low end, the remainder
 *                    goes back to a bin without coalescing) only when
 *                    chunk >= 2 x rounded  or  chunk - rounded >= max_internal_fragmentation
 *                    (128 MiB, or fragmentation_fraction x memory limit when that is > 0);
 *                    otherwise the whole chunk is handed out (internal fragmentation).
 *   Extend           on a miss: fail if rounded > (limit - pool bytes) rounded down to 256;
 *                    double curr_region_allocation_bytes_ until it covers the request; take
 *                    min(curr, available) from the device, backing off by 0.9x (in float,
 *                    as TF does) while the device refuses and the size still covers the
 *                    request; if curr was not doubled for this request, double it now for
 *                    the next one. curr starts at 2 MiB with allow_growth (the whole limit
 *                    without: the first Extend then takes one region of the whole limit).
 *   Regions          every Extend adds an AllocationRegion covered by chunks; regions never
 *                    coalesce (the simulated device never returns adjacent ranges, and TF's
 *                    GPU sub-allocator does not support coalescing either).
 *   DeallocateRaw    marks the chunk free and merges it with a free next, then a free
 *                    previous neighbour in the same region (TryToCoalesce).
 *   Garbage collection  after a failed Extend, if enabled: when some regions hold no chunk
 *                    in use and limit - pool + their bytes >= rounded, free them all
 *                    (DeallocateFreeRegions) and Extend again.
 *   OOM              when all of that fails (MEMSIM_AEV_OOM, addr = device free bytes).
 * Not modelled: timestamped chunks (freed_at_count, SetSafeFrontier: only used with a timing
 * counter), alignment above 256 bytes, spatial partitioning (off by default), the retry
 * helper's sleeping (a single-threaded replay has nobody to wait for). TF has no
 * empty_cache; neither does this policy. Streams are ignored: BFC does not know them.
 *
 * With an unlimited device (capacity 0) the memory limit is taken as unlimited, so region
 * sizes keep doubling as TF's would on a very large device: peak reserved is then up to about
 * twice what the program needs. Give --gpu-mem for a realistic figure.
 *
 * Statistics: allocated = active = TF's bytes_in_use (chunk bytes); reserved = pool_bytes
 * (regions); segments = regions; n_device_alloc / n_device_free = regions added / freed by
 * garbage collection; n_alloc_retries = garbage-collection attempts; inactive_split = free
 * chunks that share their region with other chunks.
 *
 * Data structures and cost (n = free chunks, m = chunks in use): chunks and regions come from
 * slabs; each bin is an intrusive treap ordered (size, address) and a 21-bit word marks the
 * non-empty bins, so a search is one lower_bound in the request's bin or the first node of the
 * next non-empty bin: O(log n). Chunks in use are found by address in an open-addressing map,
 * O(1); neighbours are a doubly linked list per region, so coalescing is O(1) plus the bin
 * updates. Garbage collection, check() and shape() walk everything.
 */
#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

#define MIN_ALLOC ((memsim_size_t)256) /* kMinAllocationSize */
#define N_BINS 21                      /* kNumBins */
#define DEFAULT_MAX_FRAG ((int64_t)128 << 20)
#define INITIAL_REGION (2 * KIT_MIB)
#define UNLIMITED ((memsim_size_t)1 << 62)

typedef struct Region Region;
typedef struct Chunk Chunk;

struct Chunk {
    KitNode node; /* bin links while free; first so that a node is its chunk */
    memsim_addr_t ptr;
    memsim_size_t size;
    memsim_size_t requested;
    Chunk *prev, *next; /* address neighbours in the region */
    Region *region;
    int8_t bin; /* -1 (kInvalidBinNum) unless free and in a bin */
    uint8_t in_use;
    uint32_t stream; /* in use: the request's, reported with its free */
};

struct Region {
    KitSeg seg; /* base, size */
    Chunk *first;
    uint64_t n_in_use;
};

typedef struct {
    gboolean allow_growth;
    gboolean gc;
    double frag_fraction;
    double memory_fraction;
} BfcConfig;

typedef struct {
    MemsimDevice *dev;
    BfcConfig cfg;
    memsim_size_t memory_limit;
    memsim_size_t curr_region; /* curr_region_allocation_bytes_ */
    int64_t max_frag;          /* max_internal_fragmentation_bytes_ */
    KitNode *bins[N_BINS];
    uint32_t bin_bits;
    KitAddrMap live;
    KitSlab chunks, region_slab;
    KitSegs regions;
    uint32_t rng;
    MemsimAllocStats st;
} Bfc;

/* ---------------------------------------------------------------------------------------- */
/* Sizes and bins */

static inline memsim_size_t rounded_bytes(memsim_size_t n)
{
    return (n + MIN_ALLOC - 1) / MIN_ALLOC * MIN_ALLOC;
}

static inline int bin_for_size(memsim_size_t n)
{
    uint64_t v = (n < MIN_ALLOC ? MIN_ALLOC : n) >> 8;
    int b = 63 - __builtin_clzll(v);
    return b < N_BINS - 1 ? b : N_BINS - 1;
}

static gboolean chunk_less(const KitNode *a, const KitNode *b)
{
    const Chunk *x = (const Chunk *)a, *y = (const Chunk *)b;
    if (x->size != y->size)
        return x->size < y->size;
    return x->ptr < y->ptr;
}

static inline gboolean is_split(const Chunk *c)
{
    return c->prev || c->next;
}

/* InsertFreeChunkIntoBin */
static void bin_insert(Bfc *a, Chunk *c)
{
    int b = bin_for_size(c->size);
    c->bin = (int8_t)b;
    c->node.prio = kit_prio(&a->rng);
    kit_tree_insert(&a->bins[b], &c->node, chunk_less, NULL);
    a->bin_bits |= 1u << b;
    if (is_split(c))
        memsim_stat_add(&a->st.inactive_split, (int64_t)c->size);
}

/* RemoveFreeChunkFromBin */
static void bin_remove(Bfc *a, Chunk *c)
{
    int b = c->bin;
    kit_tree_remove(&a->bins[b], &c->node, NULL);
    if (!a->bins[b])
        a->bin_bits &= ~(1u << b);
    c->bin = -1;
    if (is_split(c))
        memsim_stat_sub(&a->st.inactive_split, (int64_t)c->size);
}

/* The smallest free chunk of at least `rounded` bytes, lowest address first (FindChunkPtr's
 * search), or NULL. */
static Chunk *find_chunk(Bfc *a, memsim_size_t rounded)
{
    int b = bin_for_size(rounded);
    Chunk *best = NULL;
    for (KitNode *n = a->bins[b]; n;) {
        Chunk *c = (Chunk *)n;
        if (c->size >= rounded) {
            best = c;
            n = n->left;
        } else {
            n = n->right;
        }
    }
    if (best)
        return best;
    uint32_t higher = a->bin_bits & ~((2u << b) - 1);
    if (!higher)
        return NULL;
    return (Chunk *)kit_tree_first(a->bins[__builtin_ctz(higher)]);
}

/* ---------------------------------------------------------------------------------------- */
/* Chunks and regions */

static Chunk *new_chunk(Bfc *a, Region *r, memsim_addr_t ptr, memsim_size_t size)
{
    Chunk *c = kit_slab_get(&a->chunks);
    c->ptr = ptr;
    c->size = size;
    c->region = r;
    c->bin = -1;
    return c;
}

static Region *add_region(Bfc *a, memsim_addr_t base, memsim_size_t size)
{
    Region *r = kit_slab_get(&a->region_slab);
    r->seg.base = base;
    r->seg.size = size;
    kit_segs_insert(&a->regions, &r->seg);
    r->first = new_chunk(a, r, base, size);
    bin_insert(a, r->first);
    memsim_stat_add(&a->st.reserved, (int64_t)size);
    memsim_stat_add(&a->st.segments, 1);
    return r;
}

/* SplitChunk: c (free, out of its bin) keeps `n` bytes; the rest becomes a free chunk. */
static void split_chunk(Bfc *a, Chunk *c, memsim_size_t n)
{
    Chunk *rest = new_chunk(a, c->region, c->ptr + n, c->size - n);
    c->size = n;
    rest->prev = c;
    rest->next = c->next;
    if (c->next)
        c->next->prev = rest;
    c->next = rest;
    bin_insert(a, rest);
}

/* Merge: c2 (c1's next) is folded into c1; both free and out of their bins. */
static void merge_chunks(Bfc *a, Chunk *c1, Chunk *c2)
{
    c1->next = c2->next;
    if (c2->next)
        c2->next->prev = c1;
    c1->size += c2->size;
    kit_slab_put(&a->chunks, c2);
}

/* TryToCoalesce; the result is out of its bin. */
static Chunk *coalesce(Bfc *a, Chunk *c)
{
    if (c->next && !c->next->in_use) {
        bin_remove(a, c->next);
        merge_chunks(a, c, c->next);
    }
    if (c->prev && !c->prev->in_use) {
        Chunk *p = c->prev;
        bin_remove(a, p);
        merge_chunks(a, p, c);
        c = p;
    }
    return c;
}

static inline gboolean device_has(const Bfc *a, memsim_size_t n)
{
    memsim_size_t cap = a->dev->capacity;
    return !cap || ((memsim_size_t)a->st.reserved.current <= cap &&
                    n <= cap - (memsim_size_t)a->st.reserved.current);
}

/* Extend */
static gboolean extend(Bfc *a, memsim_size_t rounded, uint32_t stream)
{
    memsim_size_t pool = (memsim_size_t)a->st.reserved.current;
    memsim_size_t available = pool < a->memory_limit ? a->memory_limit - pool : 0;
    available = available / MIN_ALLOC * MIN_ALLOC;
    if (rounded > available)
        return FALSE;
    gboolean increased = FALSE;
    while (rounded > a->curr_region) {
        a->curr_region *= 2;
        increased = TRUE;
    }
    memsim_size_t bytes = MIN(a->curr_region, available);
    /* The sub-allocator (cudaMalloc) refuses what the device cannot hold: TF backs off by
     * kBackpedalFactor, a float, so the product is computed in float as it is there. */
    while (!device_has(a, bytes)) {
        bytes = rounded_bytes((memsim_size_t)((float)bytes * 0.9f));
        if (bytes < rounded)
            return FALSE;
    }
    if (!increased && a->curr_region < UNLIMITED)
        a->curr_region *= 2;
    memsim_addr_t base = kit_segment_addr(a->dev, &a->regions, bytes, stream);
    add_region(a, base, bytes);
    a->st.n_device_alloc++;
    memsim_device_emit(a->dev, MEMSIM_AEV_SEG_ALLOC, base, bytes, stream);
    return TRUE;
}

static void drop_region(Bfc *a, Region *r)
{
    Chunk *c = r->first;
    g_assert(c->next == NULL && !c->in_use); /* a wholly free region is one chunk */
    bin_remove(a, c);
    kit_slab_put(&a->chunks, c);
    kit_segs_remove(&a->regions, &r->seg);
    memsim_stat_sub(&a->st.reserved, (int64_t)r->seg.size);
    memsim_stat_sub(&a->st.segments, 1);
    kit_slab_put(&a->region_slab, r);
}

/* DeallocateFreeRegions */
static gboolean deallocate_free_regions(Bfc *a, memsim_size_t rounded, uint32_t stream)
{
    if (!a->cfg.gc)
        return FALSE;
    a->st.n_alloc_retries++;
    memsim_size_t free_bytes = 0;
    for (guint i = 0; i < a->regions.n; i++) {
        Region *r = (Region *)a->regions.v[i];
        if (r->n_in_use == 0)
            free_bytes += r->seg.size;
    }
    if (free_bytes == 0)
        return FALSE;
    memsim_size_t pool = (memsim_size_t)a->st.reserved.current;
    if (rounded > a->memory_limit - pool + free_bytes)
        return FALSE;
    for (guint i = a->regions.n; i-- > 0;) {
        Region *r = (Region *)a->regions.v[i];
        if (r->n_in_use)
            continue;
        memsim_addr_t base = r->seg.base;
        memsim_size_t size = r->seg.size;
        drop_region(a, r);
        a->st.n_device_free++;
        memsim_device_emit(a->dev, MEMSIM_AEV_SEG_FREE, base, size, stream);
    }
    return TRUE;
}

/* The chunk (out of its bin) becomes in use for a request of `requested` bytes. */
static void use_chunk(Bfc *a, Chunk *c, memsim_size_t requested, uint32_t stream)
{
    c->in_use = 1;
    c->requested = requested;
    c->stream = stream;
    c->region->n_in_use++;
    kit_map_put(&a->live, c->ptr, c);
    memsim_stat_add(&a->st.allocated, (int64_t)c->size);
    memsim_stat_add(&a->st.active, (int64_t)c->size);
    memsim_stat_add(&a->st.requested, (int64_t)requested);
    memsim_stat_add(&a->st.allocations, 1);
}

/* ---------------------------------------------------------------------------------------- */
/* The policy */

static memsim_size_t bfc_round(void *state, memsim_size_t size)
{
    return rounded_bytes(size);
}

/* AllocateRawInternal */
static MemsimAllocResult bfc_malloc(void *state, memsim_size_t size, uint32_t stream,
                                    memsim_addr_t *addr)
{
    Bfc *a = state;
    if (size == 0) { /* TF hands out nullptr without touching the pool */
        *addr = 0;
        return MEMSIM_ALLOC_OK;
    }
    memsim_size_t rounded = rounded_bytes(size);
    Chunk *c = find_chunk(a, rounded);
    if (!c && extend(a, rounded, stream))
        c = find_chunk(a, rounded);
    if (!c && deallocate_free_regions(a, rounded, stream) && extend(a, rounded, stream))
        c = find_chunk(a, rounded);
    if (!c) {
        memsim_size_t cap = a->dev->capacity, held = (memsim_size_t)a->st.reserved.current;
        a->st.n_ooms++;
        memsim_device_emit(a->dev, MEMSIM_AEV_OOM, cap > held ? cap - held : 0, rounded, stream);
        return MEMSIM_ALLOC_OOM;
    }
    bin_remove(a, c);
    /* Split only into two reasonably large pieces, and never waste more than
     * max_internal_fragmentation_bytes on padding (FindChunkPtr). */
    if (c->size >= rounded * 2 || (int64_t)(c->size - rounded) >= a->max_frag)
        split_chunk(a, c, rounded);
    use_chunk(a, c, size, stream);
    *addr = c->ptr;
    memsim_device_emit(a->dev, MEMSIM_AEV_ALLOC, c->ptr, size, stream);
    return MEMSIM_ALLOC_OK;
}

/* DeallocateRawInternal */
static void bfc_free(void *state, memsim_addr_t addr)
{
    Bfc *a = state;
    if (addr == 0)
        return;
    Chunk *c = kit_map_take(&a->live, addr);
    if (!c) {
        g_critical("bfc: free of 0x%" G_GINT64_MODIFIER "x, which is not allocated", addr);
        return;
    }
    c->in_use = 0;
    c->region->n_in_use--;
    memsim_stat_sub(&a->st.allocated, (int64_t)c->size);
    memsim_stat_sub(&a->st.active, (int64_t)c->size);
    memsim_stat_sub(&a->st.requested, (int64_t)c->requested);
    memsim_stat_sub(&a->st.allocations, 1);
    memsim_device_emit(a->dev, MEMSIM_AEV_FREE_COMPLETED, addr, c->requested, c->stream);
    bin_insert(a, coalesce(a, c));
}

static MemsimAllocStats bfc_stats(void *state)
{
    return ((Bfc *)state)->st;
}

static void bfc_reset_peaks(void *state)
{
    kit_reset_peaks(&((Bfc *)state)->st);
}

static MemsimAllocShape bfc_shape(void *state)
{
    Bfc *a = state;
    MemsimAllocShape sh = {0};
    sh.n_segments = a->regions.n;
    for (guint i = 0; i < a->regions.n; i++)
        for (Chunk *c = ((Region *)a->regions.v[i])->first; c; c = c->next) {
            if (c->in_use)
                continue;
            sh.free_bytes += c->size;
            sh.n_free_blocks++;
            if (c->size > sh.largest_free)
                sh.largest_free = c->size;
        }
    return sh;
}

static void bfc_foreach_block(void *state, MemsimBlockFunc fn, void *user)
{
    Bfc *a = state;
    for (guint i = 0; i < a->regions.n; i++) {
        Region *r = (Region *)a->regions.v[i];
        for (Chunk *c = r->first; c; c = c->next) {
            MemsimBlockInfo info = {.segment = r->seg.base,
                                    .segment_size = r->seg.size,
                                    .stream = 0,
                                    .segment_flags = 0,
                                    .addr = c->ptr,
                                    .size = c->size,
                                    .requested = c->in_use ? c->requested : 0,
                                    .state =
                                        c->in_use ? MEMSIM_BLOCK_ALLOCATED : MEMSIM_BLOCK_FREE};
            fn(user, &info);
        }
    }
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "bfc: " __VA_ARGS__);             \
        return FALSE;                                                                              \
    } while (0)

static gboolean bfc_check(void *state, GError **error)
{
    Bfc *a = state;
    int64_t allocated = 0, requested = 0, reserved = 0, split = 0, n_use = 0, n_free = 0;
    for (guint i = 0; i < a->regions.n; i++) {
        Region *r = (Region *)a->regions.v[i];
        if (i && a->regions.v[i - 1]->base + a->regions.v[i - 1]->size > r->seg.base)
            FAIL("regions 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER "x overlap",
                 a->regions.v[i - 1]->base, r->seg.base);
        reserved += (int64_t)r->seg.size;
        memsim_addr_t expect = r->seg.base;
        uint64_t in_use = 0;
        Chunk *prev = NULL;
        for (Chunk *c = r->first; c; prev = c, c = c->next) {
            if (c->prev != prev || c->region != r)
                FAIL("chunk 0x%" G_GINT64_MODIFIER "x: broken links", c->ptr);
            if (c->ptr != expect || c->size == 0 || c->size % MIN_ALLOC)
                FAIL("region 0x%" G_GINT64_MODIFIER "x: chunk 0x%" G_GINT64_MODIFIER
                     "x of %" G_GUINT64_FORMAT " bytes where 0x%" G_GINT64_MODIFIER
                     "x was expected "
                     "(chunks must tile their region in 256-byte units)",
                     r->seg.base, c->ptr, c->size, expect);
            expect += c->size;
            if (c->in_use) {
                in_use++;
                n_use++;
                allocated += (int64_t)c->size;
                requested += (int64_t)c->requested;
                if (c->bin != -1 || kit_map_get(&a->live, c->ptr) != c)
                    FAIL("chunk 0x%" G_GINT64_MODIFIER "x in use but not (only) in the address "
                         "map",
                         c->ptr);
                if (rounded_bytes(c->requested) > c->size)
                    FAIL("chunk 0x%" G_GINT64_MODIFIER "x smaller than its request", c->ptr);
            } else {
                n_free++;
                if (prev && !prev->in_use)
                    FAIL("free chunks 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER
                         "x were not coalesced",
                         prev->ptr, c->ptr);
                if (c->bin != bin_for_size(c->size) ||
                    !kit_tree_contains(a->bins[c->bin], &c->node))
                    FAIL("free chunk 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT
                         " bytes) is not in bin %d",
                         c->ptr, c->size, bin_for_size(c->size));
                if (is_split(c))
                    split += (int64_t)c->size;
            }
        }
        if (expect != r->seg.base + r->seg.size)
            FAIL("region 0x%" G_GINT64_MODIFIER "x: chunks cover %" G_GUINT64_FORMAT
                 " of %" G_GUINT64_FORMAT " bytes",
                 r->seg.base, expect - r->seg.base, r->seg.size);
        if (in_use != r->n_in_use)
            FAIL("region 0x%" G_GINT64_MODIFIER "x counts %" G_GUINT64_FORMAT " chunks in use, "
                 "holds %" G_GUINT64_FORMAT,
                 r->seg.base, r->n_in_use, in_use);
    }
    int64_t binned = 0;
    for (int b = 0; b < N_BINS; b++) {
        int64_t n = kit_tree_verify(a->bins[b], chunk_less);
        if (n < 0)
            FAIL("bin %d is not a well-formed tree sorted by (size, address)", b);
        if (((a->bin_bits >> b) & 1) != (a->bins[b] != NULL))
            FAIL("bin bitmap disagrees with bin %d", b);
        for (KitNode *x = kit_tree_first(a->bins[b]); x; x = kit_tree_next(x))
            if (((Chunk *)x)->bin != b || ((Chunk *)x)->in_use)
                FAIL("bin %d holds chunk 0x%" G_GINT64_MODIFIER "x of another bin or in use", b,
                     ((Chunk *)x)->ptr);
        binned += n;
    }
    if (binned != n_free)
        FAIL("bins hold %" G_GINT64_FORMAT " chunks, regions have %" G_GINT64_FORMAT " free",
             binned, n_free);
    if ((int64_t)a->live.n != n_use)
        FAIL("address map holds %" G_GUINT64_FORMAT " chunks, regions %" G_GINT64_FORMAT, a->live.n,
             n_use);
    if (reserved > (int64_t)a->memory_limit)
        FAIL("regions hold %" G_GINT64_FORMAT " bytes, above the memory limit", reserved);
    KitCheck cmp[] = {
        {"allocated", allocated, a->st.allocated.current},
        {"active", allocated, a->st.active.current},
        {"requested", requested, a->st.requested.current},
        {"reserved", reserved, a->st.reserved.current},
        {"segments", (int64_t)a->regions.n, a->st.segments.current},
        {"allocations", n_use, a->st.allocations.current},
        {"inactive_split", split, a->st.inactive_split.current},
    };
    return kit_check_stats("bfc", &a->st, cmp, G_N_ELEMENTS(cmp), error);
}

/* ---------------------------------------------------------------------------------------- */
/* Seeding: a recording that starts mid-run. Its segments become regions (they do not change
 * curr_region_allocation_bytes_, which only Extend moves); a live block becomes a chunk in
 * use of its request rounded to 256 bytes, the rest of the recorded block stays free. */

static gboolean bfc_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                 uint32_t stream, uint32_t flags, GError **error)
{
    Bfc *a = state;
    if (size == 0 || size % MIN_ALLOC || addr % MIN_ALLOC ||
        kit_segs_overlap(&a->regions, addr, size))
        FAIL("cannot start from segment 0x%" G_GINT64_MODIFIER "x of %" G_GUINT64_FORMAT
             " bytes (empty, not in 256-byte units, or overlapping another)",
             addr, size);
    add_region(a, addr, size);
    kit_reset_peaks(&a->st);
    return TRUE;
}

static gboolean bfc_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                               memsim_size_t requested, uint32_t stream, GError **error)
{
    Bfc *a = state;
    memsim_size_t n = rounded_bytes(requested ? requested : block_size);
    Region *r = (Region *)kit_segs_find(&a->regions, addr);
    Chunk *f = r ? r->first : NULL;
    while (f && !(f->ptr <= addr && addr - f->ptr < f->size))
        f = f->next;
    if (!n || !f || f->in_use || addr % MIN_ALLOC || addr + n > f->ptr + f->size)
        FAIL("seeded block 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT " bytes) does not "
             "lie inside one free chunk of a seeded segment",
             addr, n);
    bin_remove(a, f);
    if (f->ptr < addr) {
        Chunk *front = f;
        split_chunk(a, front, addr - front->ptr);
        f = front->next;
        bin_remove(a, f);
        bin_insert(a, front);
    }
    if (f->size > n)
        split_chunk(a, f, n);
    use_chunk(a, f, requested, stream);
    kit_reset_peaks(&a->st);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Settings and life cycle */

static const char bfc_keys[] =
    "allow_growth, garbage_collection, fragmentation_fraction, memory_fraction";

static const char bfc_settings_help[] =
    "allow_growth=true|false         grow by regions of doubling size from 2 MiB (default "
    "true); false: one region of the whole memory limit, taken at the first allocation (needs "
    "a device capacity; JAX's default preallocation)\n"
    "garbage_collection=true|false   when growth fails, free the regions that hold nothing and "
    "retry (default false, as XLA/JAX; TensorFlow's GPU allocator turns it on)\n"
    "fragmentation_fraction=F        split a chunk when its excess over the request is at "
    "least F x memory limit (0 <= F < 1; default 0, meaning 128 MiB; needs a capacity when > "
    "0)\n"
    "memory_fraction=F               memory limit = F x device capacity (0 < F <= 1; default "
    "1; XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 in JAX)";

static gboolean bfc_setting(void *cfgp, const char *key, const char *value, GError **error)
{
    BfcConfig *cfg = cfgp;
    double d;
    if (strcmp(key, "allow_growth") == 0 || strcmp(key, "garbage_collection") == 0) {
        gboolean *dst = key[0] == 'a' ? &cfg->allow_growth : &cfg->gc;
        if (!kit_parse_bool(value, dst))
            FAIL("%s must be true or false (got '%s')", key, value);
    } else if (strcmp(key, "fragmentation_fraction") == 0) {
        if (!kit_parse_double(value, &d) || !(d >= 0.0 && d < 1.0))
            FAIL("fragmentation_fraction must be a number in [0, 1) (got '%s')", value);
        cfg->frag_fraction = d;
    } else if (strcmp(key, "memory_fraction") == 0) {
        if (!kit_parse_double(value, &d) || !(d > 0.0 && d <= 1.0))
            FAIL("memory_fraction must be a number in (0, 1] (got '%s')", value);
        cfg->memory_fraction = d;
    } else {
        FAIL("unknown setting '%s' (accepted: %s)", key, bfc_keys);
    }
    return TRUE;
}

static void *bfc_create(const char *settings, MemsimDevice *dev, GError **error)
{
    BfcConfig cfg = {TRUE, FALSE, 0.0, 1.0};
    if (!kit_parse_settings("bfc", settings, bfc_keys, bfc_setting, &cfg, error))
        return NULL;
    if (!dev->capacity && (!cfg.allow_growth || cfg.frag_fraction > 0.0)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "bfc settings: %s needs a device capacity (the device is unlimited; give "
                    "--gpu-mem)",
                    !cfg.allow_growth ? "allow_growth=false" : "fragmentation_fraction");
        return NULL;
    }
    Bfc *a = g_new0(Bfc, 1);
    a->dev = dev;
    a->cfg = cfg;
    a->memory_limit =
        dev->capacity ? (memsim_size_t)((double)dev->capacity * cfg.memory_fraction) : UNLIMITED;
    a->curr_region = cfg.allow_growth ? rounded_bytes(MIN(a->memory_limit, INITIAL_REGION))
                                      : rounded_bytes(a->memory_limit);
    a->max_frag = cfg.frag_fraction > 0.0 ? (int64_t)(cfg.frag_fraction * (double)a->memory_limit)
                                          : DEFAULT_MAX_FRAG;
    kit_map_init(&a->live, 4);
    kit_slab_init(&a->chunks, sizeof(Chunk));
    kit_slab_init(&a->region_slab, sizeof(Region));
    a->rng = 0x2545F491u;
    return a;
}

static void bfc_destroy(void *state)
{
    Bfc *a = state;
    if (!a)
        return;
    kit_map_clear(&a->live);
    kit_slab_clear(&a->chunks);
    kit_slab_clear(&a->region_slab);
    kit_segs_clear(&a->regions);
    g_free(a);
}

static const MemsimAllocOps bfc_ops = {
    .name = "bfc",
    .description = "TensorFlow/XLA best-fit with coalescing (256 B rounding, 21 bins, doubling "
                   "regions), as JAX uses it",
    .settings_help = bfc_settings_help,
    .create = bfc_create,
    .destroy = bfc_destroy,
    .malloc = bfc_malloc,
    .free = bfc_free,
    .stats = bfc_stats,
    .shape = bfc_shape,
    .reset_peaks = bfc_reset_peaks,
    .check = bfc_check,
    .seed_segment = bfc_seed_segment,
    .seed_block = bfc_seed_block,
    .round_size = bfc_round,
    .foreach_block = bfc_foreach_block,
};

const MemsimAllocOps *memsim_alloc_bfc_ops(void)
{
    return &bfc_ops;
}
