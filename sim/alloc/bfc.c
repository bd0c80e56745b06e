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
 * Data structures and cost (n = free chunks, m = chunks in use): each bin is an intrusive
 * treap ordered (size, address) and a 21-bit word marks the non-empty bins, so a search is one
 * lower_bound in the request's bin or the first node of the next non-empty bin: O(log n).
 * Chunks and regions are the blocks and segments of the arena that best-fit, first-fit and
 * stitch share (sim/alloc/arena.c), which also holds the free path (DeallocateRawInternal),
 * the statistics and seeding: chunks in use are found by address in O(1), neighbours are a
 * doubly linked list per region, so coalescing is O(1) plus the bin updates. Garbage
 * collection, check() and shape() walk everything.
 */
#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/arena.h"
#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

#define MIN_ALLOC ((memsim_size_t)256) /* kMinAllocationSize */
#define N_BINS 21                      /* kNumBins */
#define DEFAULT_MAX_FRAG ((int64_t)128 << 20)
#define INITIAL_REGION (2 * KIT_MIB)
#define UNLIMITED ((memsim_size_t)1 << 62)

/* TF's words for the arena's blocks and segments. */
typedef ArenaBlock Chunk;
typedef ArenaSeg Region;

typedef struct {
    gboolean allow_growth;
    gboolean gc;
    double frag_fraction;
    double memory_fraction;
} BfcConfig;

typedef struct {
    Arena a;
    BfcConfig cfg;
    memsim_size_t memory_limit;
    memsim_size_t curr_region; /* curr_region_allocation_bytes_ */
    int64_t max_frag;          /* max_internal_fragmentation_bytes_ */
    KitNode *bins[N_BINS];
    uint32_t bin_bits;
} Bfc;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "bfc: " __VA_ARGS__);             \
        return FALSE;                                                                              \
    } while (0)

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

/* InsertFreeChunkIntoBin. A chunk's size does not change while it is in its bin, so the bin
 * is found again from the size (TF keeps it in the chunk as bin_num). */
static void bin_insert(Arena *arena, Chunk *c)
{
    Bfc *a = (Bfc *)arena;
    int b = bin_for_size(c->size);
    c->node.prio = kit_prio(&arena->rng);
    kit_tree_insert(&a->bins[b], &c->node, arena_by_size, NULL);
    a->bin_bits |= 1u << b;
    arena_split_counted(arena, c, +1);
}

/* RemoveFreeChunkFromBin */
static void bin_remove(Arena *arena, Chunk *c)
{
    Bfc *a = (Bfc *)arena;
    int b = bin_for_size(c->size);
    kit_tree_remove(&a->bins[b], &c->node, NULL);
    if (!a->bins[b])
        a->bin_bits &= ~(1u << b);
    arena_split_counted(arena, c, -1);
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

static gboolean bin_holds(Arena *arena, Chunk *c)
{
    return kit_tree_contains(((Bfc *)arena)->bins[bin_for_size(c->size)], &c->node);
}

static gboolean bins_verify(Arena *arena, int64_t n_free, GError **error)
{
    Bfc *a = (Bfc *)arena;
    int64_t binned = 0;
    for (int b = 0; b < N_BINS; b++) {
        int64_t n = kit_tree_verify(a->bins[b], arena_by_size);
        if (n < 0)
            FAIL("bin %d is not a well-formed tree sorted by (size, address)", b);
        if (((a->bin_bits >> b) & 1) != (a->bins[b] != NULL))
            FAIL("bin bitmap disagrees with bin %d", b);
        for (KitNode *x = kit_tree_first(a->bins[b]); x; x = kit_tree_next(x))
            if (bin_for_size(((Chunk *)x)->size) != b || ((Chunk *)x)->state != ARENA_FREE)
                FAIL("bin %d holds chunk 0x%" G_GINT64_MODIFIER "x of another bin or in use", b,
                     ((Chunk *)x)->ptr);
        binned += n;
    }
    if (binned != n_free)
        FAIL("bins hold %" G_GINT64_FORMAT " chunks, regions have %" G_GINT64_FORMAT " free",
             binned, n_free);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Regions */

/* Extend */
static gboolean extend(Bfc *a, memsim_size_t rounded, uint32_t stream)
{
    memsim_size_t pool = (memsim_size_t)a->a.st.reserved.current;
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
    while (!kit_device_has(a->a.dev, &a->a.st, bytes)) {
        bytes = rounded_bytes((memsim_size_t)((float)bytes * 0.9f));
        if (bytes < rounded)
            return FALSE;
    }
    if (!increased && a->curr_region < UNLIMITED)
        a->curr_region *= 2;
    memsim_addr_t base = kit_segment_addr(a->a.dev, &a->a.segs, bytes, stream);
    Region *r = arena_seg_add(&a->a, base, bytes, bytes, 0);
    bin_insert(&a->a, r->first);
    a->a.st.n_device_alloc++;
    memsim_device_emit(a->a.dev, MEMSIM_AEV_SEG_ALLOC, base, bytes, stream);
    return TRUE;
}

/* DeallocateFreeRegions */
static gboolean deallocate_free_regions(Bfc *a, memsim_size_t rounded, uint32_t stream)
{
    if (!a->cfg.gc)
        return FALSE;
    a->a.st.n_alloc_retries++;
    memsim_size_t free_bytes = 0;
    for (guint i = 0; i < a->a.segs.n; i++) {
        Region *r = (Region *)a->a.segs.v[i];
        if (r->n_used == 0)
            free_bytes += r->k.size;
    }
    if (free_bytes == 0)
        return FALSE;
    memsim_size_t pool = (memsim_size_t)a->a.st.reserved.current;
    if (rounded > a->memory_limit - pool + free_bytes)
        return FALSE;
    arena_release_free(&a->a, stream);
    return TRUE;
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
    if (!c)
        return kit_oom(a->a.dev, &a->a.st, rounded, stream);
    bin_remove(&a->a, c);
    /* Split only into two reasonably large pieces, and never waste more than
     * max_internal_fragmentation_bytes on padding (FindChunkPtr). */
    if (c->size >= rounded * 2 || (int64_t)(c->size - rounded) >= a->max_frag)
        arena_split(&a->a, c, rounded); /* SplitChunk */
    arena_use(&a->a, c, size, stream);
    *addr = c->ptr;
    memsim_device_emit(a->a.dev, MEMSIM_AEV_ALLOC, c->ptr, size, stream);
    return MEMSIM_ALLOC_OK;
}

/* DeallocateRawInternal: the chunk is freed and coalesced with its free neighbours, next
 * then previous (TryToCoalesce), by the arena. */
static void bfc_free(void *state, memsim_addr_t addr)
{
    if (addr == 0)
        return;
    arena_free(state, addr);
}

static gboolean bfc_check(void *state, GError **error)
{
    Bfc *a = state;
    if (!arena_check(&a->a, error))
        return FALSE;
    if (a->a.st.reserved.current > (int64_t)a->memory_limit)
        FAIL("regions hold %" G_GINT64_FORMAT " bytes, above the memory limit",
             a->a.st.reserved.current);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Seeding: a recording that starts mid-run. Its segments become regions (they do not change
 * curr_region_allocation_bytes_, which only Extend moves); a live block becomes a chunk in
 * use of its request rounded to 256 bytes, the rest of the recorded block stays free. */

static gboolean bfc_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                 uint32_t stream, uint32_t flags, GError **error)
{
    Bfc *a = state;
    Region *r = arena_seed_segment(&a->a, addr, size, 0, error);
    if (!r)
        return FALSE;
    bin_insert(&a->a, r->first);
    kit_reset_peaks(&a->a.st);
    return TRUE;
}

static gboolean bfc_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                               memsim_size_t requested, uint32_t stream, GError **error)
{
    Bfc *a = state;
    memsim_size_t n = rounded_bytes(requested ? requested : block_size);
    Chunk *c = arena_seed_find(&a->a, addr, n);
    if (!c)
        FAIL("seeded block 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT " bytes) does not "
             "lie inside one free chunk of a seeded segment",
             addr, n);
    arena_seed_block(&a->a, c, addr, n, requested, stream);
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
        if (!num_parse_double(value, &d) || !(d >= 0.0 && d < 1.0))
            FAIL("fragmentation_fraction must be a number in [0, 1) (got '%s')", value);
        cfg->frag_fraction = d;
    } else if (strcmp(key, "memory_fraction") == 0) {
        if (!num_parse_double(value, &d) || !(d > 0.0 && d <= 1.0))
            FAIL("memory_fraction must be a number in (0, 1] (got '%s')", value);
        cfg->memory_fraction = d;
    } else {
        FAIL("unknown setting '%s' (accepted: %s)", key, bfc_keys);
    }
    return TRUE;
}

static const ArenaOps bfc_arena = {
    .name = "bfc",
    .unit = MIN_ALLOC,
    .block_size = sizeof(Chunk),
    .seg_size = sizeof(Region),
    .seed = 0x2545F491u,
    .free_insert = bin_insert,
    .free_remove = bin_remove,
    .free_holds = bin_holds,
    .free_verify = bins_verify,
};

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
    arena_init(&a->a, &bfc_arena, dev);
    a->cfg = cfg;
    a->memory_limit =
        dev->capacity ? (memsim_size_t)((double)dev->capacity * cfg.memory_fraction) : UNLIMITED;
    a->curr_region = cfg.allow_growth ? rounded_bytes(MIN(a->memory_limit, INITIAL_REGION))
                                      : rounded_bytes(a->memory_limit);
    a->max_frag = cfg.frag_fraction > 0.0 ? (int64_t)(cfg.frag_fraction * (double)a->memory_limit)
                                          : DEFAULT_MAX_FRAG;
    return a;
}

static const MemsimAllocOps bfc_ops = {
    .name = "bfc",
    .description = "TensorFlow/XLA best-fit with coalescing (256 B rounding, 21 bins, doubling "
                   "regions), as JAX uses it",
    .settings_help = bfc_settings_help,
    .create = bfc_create,
    .destroy = arena_destroy,
    .malloc = bfc_malloc,
    .free = bfc_free,
    .stats = arena_stats,
    .stats_live = arena_stats_live,
    .stats_live_fixed = TRUE,
    .shape = arena_shape,
    .reset_peaks = arena_reset_peaks,
    .check = bfc_check,
    .seed_segment = bfc_seed_segment,
    .seed_block = bfc_seed_block,
    .round_size = bfc_round,
    .foreach_block = arena_foreach_block,
};

const MemsimAllocOps *memsim_alloc_bfc_ops(void)
{
    return &bfc_ops;
}
