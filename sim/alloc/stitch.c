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
 * Data structures and cost (n = free blocks): three free sets (small pool, virtual ranges,
 * recorded segments), each ordered (size, address) in size-class treaps with a bitmap of
 * non-empty classes (sim/alloc/kit.h): best fit is a lower_bound, O(log n); a stitch walks
 * the free blocks from the largest, O(k log n) for k blocks taken. Segments, blocks (free, in
 * use or unmapped), the free path, statistics and seeding are the arena that bfc, best-fit
 * and first-fit share (sim/alloc/arena.c): blocks in use found by address in O(1), the blocks
 * of a segment a doubly linked list in address order (merging is O(1)).
 */
#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/arena.h"
#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

#define MIN_BLOCK ((memsim_size_t)512)
#define SMALL_SIZE KIT_MIB          /* kSmallSize */
#define SMALL_SEGMENT (2 * KIT_MIB) /* kSmallBuffer */

enum { K_SMALL = 0, K_RANGE, K_RECORDED };

/* How a segment of each kind is listed: a virtual range as an expandable segment (mapped runs
 * and unmapped holes), as a snapshot of PyTorch's expandable segments shows one. */
static const uint32_t kind_flags[] = {MEMSIM_SEGF_SMALL, MEMSIM_SEGF_EXPANDABLE, 0};

/* A segment: small pool, virtual range or recorded. */
typedef struct {
    ArenaSeg s;
    memsim_size_t mapped; /* physical bytes behind it */
    uint8_t kind;
} SSeg;

typedef struct {
    memsim_size_t granularity;
    memsim_size_t fragment_limit;
    int defrag_level;
} StitchConfig;

typedef struct {
    Arena a;
    StitchConfig cfg;
    KitBins free_sets[3];           /* by segment kind, each ordered (size, address) */
    memsim_size_t free_range_bytes; /* free (mapped) bytes in virtual ranges: stitchable */
} Stitch;

static inline SSeg *sseg(const ArenaBlock *b)
{
    return (SSeg *)b->seg;
}

/* ---------------------------------------------------------------------------------------- */
/* The free sets: one per segment kind, size-class treaps ordered (size, address) */

static void free_insert(Arena *a, ArenaBlock *b)
{
    Stitch *s = (Stitch *)a;
    uint8_t k = sseg(b)->kind;
    b->node.prio = kit_prio(&a->rng);
    kit_bins_insert(&s->free_sets[k], &b->node, b->size, arena_by_size);
    if (k == K_RANGE)
        s->free_range_bytes += b->size;
    arena_split_counted(a, b, +1);
}

static void free_remove(Arena *a, ArenaBlock *b)
{
    Stitch *s = (Stitch *)a;
    uint8_t k = sseg(b)->kind;
    kit_bins_remove(&s->free_sets[k], &b->node, b->size);
    if (k == K_RANGE)
        s->free_range_bytes -= b->size;
    arena_split_counted(a, b, -1);
}

static gboolean free_holds(Arena *a, ArenaBlock *b)
{
    return kit_bins_contains(&((Stitch *)a)->free_sets[sseg(b)->kind], &b->node, b->size);
}

static gboolean free_verify(Arena *a, int64_t n_free, GError **error)
{
    /* Every free block of a segment was found in its own set, so equal counts mean that the
     * sets hold nothing else. */
    int64_t in_sets = 0;
    for (int k = 0; k < 3; k++) {
        int64_t n = kit_bins_verify(&((Stitch *)a)->free_sets[k], arena_by_size, arena_size_of);
        if (n < 0) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "stitch: free set %d: size classes are not well-formed trees sorted by "
                        "(size, address)",
                        k);
            return FALSE;
        }
        in_sets += n;
    }
    if (in_sets != n_free) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "stitch: the free sets hold %" G_GINT64_FORMAT " blocks, segments have "
                    "%" G_GINT64_FORMAT " free",
                    in_sets, n_free);
        return FALSE;
    }
    return TRUE;
}

static ArenaBlock *lower_bound(const KitBins *set, memsim_size_t n)
{
    return (ArenaBlock *)kit_bins_lower_bound(set, n, arena_size_of);
}

/* ---------------------------------------------------------------------------------------- */
/* Segments, ranges and stitches */

static inline memsim_size_t device_free(const Stitch *s)
{
    memsim_size_t cap = s->a.dev->capacity, held = (memsim_size_t)s->a.st.reserved.current;
    if (!cap)
        return UINT64_MAX;
    return cap > held ? cap - held : 0;
}

/* A segment of `size` bytes, all mapped, `fresh` of them new to the policy (the rest moved
 * from other ranges by a stitch); its block is out of the free sets. */
static SSeg *add_seg(Stitch *s, memsim_addr_t base, memsim_size_t size, uint8_t kind,
                     memsim_size_t fresh)
{
    SSeg *g = (SSeg *)arena_seg_add(&s->a, base, size, fresh, kind_flags[kind]);
    g->kind = kind;
    g->mapped = size;
    return g;
}

/* A free block (out of its set) of a virtual range gives its chunks back: it becomes
 * unmapped, merges with unmapped neighbours, and the range goes when nothing is mapped. */
static void unmap_blk(Stitch *s, ArenaBlock *b, uint32_t stream)
{
    SSeg *g = sseg(b);
    b->state = ARENA_UNMAPPED;
    g->mapped -= b->size;
    if (b->next && b->next->state == ARENA_UNMAPPED)
        arena_absorb_next(&s->a, b);
    if (b->prev && b->prev->state == ARENA_UNMAPPED)
        arena_absorb_next(&s->a, b->prev);
    if (g->mapped == 0)
        arena_seg_drop(&s->a, &g->s, stream);
}

/* A new virtual range of `size` bytes handed out whole, with `fresh` bytes of new chunks. */
static ArenaBlock *new_range(Stitch *s, memsim_size_t size, memsim_size_t fresh, uint32_t stream)
{
    memsim_addr_t base = kit_segment_addr(s->a.dev, &s->a.segs, size, stream);
    SSeg *g = add_seg(s, base, size, K_RANGE, fresh);
    if (fresh)
        s->a.st.n_device_alloc++;
    memsim_device_emit(s->a.dev, MEMSIM_AEV_SEG_ALLOC, base, size, stream);
    return g->s.first;
}

/* Stitches free chunks (largest blocks first) and `fresh` bytes of new ones into a new range
 * of `size` bytes. The caller made sure that enough are free. */
static ArenaBlock *stitch(Stitch *s, memsim_size_t size, memsim_size_t fresh, uint32_t stream)
{
    memsim_size_t need = size - fresh;
    while (need) {
        ArenaBlock *b = (ArenaBlock *)kit_bins_last(&s->free_sets[K_RANGE]);
        g_assert(b != NULL);
        free_remove(&s->a, b);
        if (b->size > need)
            arena_split(&s->a, b, need); /* the low part moves, the rest stays cached */
        need -= b->size;
        unmap_blk(s, b, stream);
    }
    return new_range(s, size, fresh, stream);
}

/* Returns every cached byte to the device (PyTorch's release_cached_blocks; empty_cache):
 * wholly free small and recorded segments, and the chunks of every free block of a range. */
static void release_cached(Stitch *s)
{
    for (guint i = s->a.segs.n; i-- > 0;) {
        SSeg *g = (SSeg *)s->a.segs.v[i];
        if (g->kind != K_RANGE) {
            if (!g->s.n_used)
                arena_seg_release(&s->a, &g->s, 0);
            continue;
        }
        for (ArenaBlock *b = g->s.first, *next; b; b = next) {
            next = b->next;
            if (b->state != ARENA_FREE)
                continue;
            gboolean last = g->mapped == b->size;
            if (next && next->state == ARENA_UNMAPPED)
                next = next->next; /* it will be folded into b */
            free_remove(&s->a, b);
            memsim_stat_sub(&s->a.st.reserved, (int64_t)b->size);
            s->a.st.n_device_free++;
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

/* Carves n bytes at the low end of free block b (out of its set); PyTorch's rule for large
 * blocks splits off a remainder over 1 MiB, for small ones any remainder. */
static ArenaBlock *carve(Stitch *s, ArenaBlock *b, memsim_size_t n)
{
    memsim_size_t rest = b->size - n;
    if (sseg(b)->kind == K_SMALL ? rest >= MIN_BLOCK : rest > SMALL_SIZE)
        arena_split(&s->a, b, n);
    return b;
}

static ArenaBlock *small_malloc(Stitch *s, memsim_size_t n, uint32_t stream)
{
    ArenaBlock *b = lower_bound(&s->free_sets[K_SMALL], n);
    if (b) {
        free_remove(&s->a, b);
        return carve(s, b, n);
    }
    if (device_free(s) < SMALL_SEGMENT)
        release_cached(s);
    if (device_free(s) < SMALL_SEGMENT)
        return NULL;
    memsim_addr_t base = kit_segment_addr(s->a.dev, &s->a.segs, SMALL_SEGMENT, stream);
    SSeg *g = add_seg(s, base, SMALL_SEGMENT, K_SMALL, SMALL_SEGMENT);
    s->a.st.n_device_alloc++;
    memsim_device_emit(s->a.dev, MEMSIM_AEV_SEG_ALLOC, base, SMALL_SEGMENT, stream);
    return carve(s, g->s.first, n);
}

static ArenaBlock *large_malloc(Stitch *s, memsim_size_t n, uint32_t stream)
{
    ArenaBlock *b = lower_bound(&s->free_sets[K_RANGE], n);
    ArenaBlock *r = lower_bound(&s->free_sets[K_RECORDED], n);
    if (r && (!b || arena_by_size(&r->node, &b->node)))
        b = r;
    if (b) {
        free_remove(&s->a, b);
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
    ArenaBlock *b = size <= SMALL_SIZE ? small_malloc(s, n, stream) : large_malloc(s, n, stream);
    if (!b)
        return kit_oom(s->a.dev, &s->a.st, n, stream);
    arena_use(&s->a, b, size, stream);
    *addr = b->ptr;
    memsim_device_emit(s->a.dev, MEMSIM_AEV_ALLOC, b->ptr, size, stream);
    return MEMSIM_ALLOC_OK;
}

static void stitch_empty_cache(void *state)
{
    release_cached(state);
}

/* The arena's walk, then what is stitch's own: each segment's mapped bytes, chunk-sized
 * blocks in ranges, unmapped blocks only there, the stitchable bytes. */
static gboolean stitch_check(void *state, GError **error)
{
    Stitch *s = state;
    if (!arena_check(&s->a, error))
        return FALSE;
    memsim_size_t range_free = 0;
    for (guint i = 0; i < s->a.segs.n; i++) {
        SSeg *g = (SSeg *)s->a.segs.v[i];
        memsim_size_t mapped = 0;
        for (ArenaBlock *b = g->s.first; b; b = b->next) {
            if (g->kind == K_RANGE && b->size % s->cfg.granularity) {
                g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                            "stitch: block 0x%" G_GINT64_MODIFIER "x of a virtual range is not "
                            "whole chunks of %" G_GUINT64_FORMAT " bytes",
                            b->ptr, s->cfg.granularity);
                return FALSE;
            }
            if (b->state == ARENA_UNMAPPED && g->kind != K_RANGE) {
                g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                            "stitch: unmapped block 0x%" G_GINT64_MODIFIER "x outside a "
                            "virtual range",
                            b->ptr);
                return FALSE;
            }
            if (b->state != ARENA_UNMAPPED)
                mapped += b->size;
            if (b->state == ARENA_FREE && g->kind == K_RANGE)
                range_free += b->size;
        }
        if (mapped != g->mapped || mapped == 0) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "stitch: segment 0x%" G_GINT64_MODIFIER "x: %" G_GUINT64_FORMAT
                        " bytes mapped, counted %" G_GUINT64_FORMAT
                        " (a range with nothing mapped must be gone)",
                        g->s.k.base, mapped, g->mapped);
            return FALSE;
        }
    }
    if (range_free != s->free_range_bytes) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "stitch: %" G_GUINT64_FORMAT " free bytes in virtual ranges, counted "
                    "%" G_GUINT64_FORMAT,
                    range_free, s->free_range_bytes);
        return FALSE;
    }
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Seeding: recorded segments are cudaMalloc memory (small pool if flagged small); a live
 * block keeps its address and its request rounded to 512 bytes. */

static gboolean stitch_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                    uint32_t stream, uint32_t flags, GError **error)
{
    Stitch *s = state;
    uint8_t kind = (flags & MEMSIM_SEGF_SMALL) ? K_SMALL : K_RECORDED;
    SSeg *g = (SSeg *)arena_seed_segment(&s->a, addr, size, kind_flags[kind], error);
    if (!g)
        return FALSE;
    g->kind = kind;
    g->mapped = size;
    free_insert(&s->a, g->s.first);
    kit_reset_peaks(&s->a.st);
    return TRUE;
}

static gboolean stitch_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                                  memsim_size_t requested, uint32_t stream, GError **error)
{
    Stitch *s = state;
    memsim_size_t n = kit_round_up(requested ? requested : block_size, MIN_BLOCK);
    ArenaBlock *b = arena_seed_find(&s->a, addr, n);
    if (!b || sseg(b)->kind == K_RANGE) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "stitch: seeded block 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT
                    " bytes) does not lie inside one free block of a seeded segment",
                    addr, n);
        return FALSE;
    }
    arena_seed_block(&s->a, b, addr, n, requested, stream);
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

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "stitch: " __VA_ARGS__);          \
        return FALSE;                                                                              \
    } while (0)

static gboolean stitch_setting(void *cfgp, const char *key, const char *value, GError **error)
{
    StitchConfig *cfg = cfgp;
    uint64_t v;
    if (strcmp(key, "granularity_mb") == 0) {
        if (!num_parse_u64(value, &v) || !num_is_pow2(v) || v < 2 || v > 1024)
            FAIL("granularity_mb must be a power of two from 2 to 1024 (got '%s')", value);
        cfg->granularity = v * KIT_MIB;
    } else if (strcmp(key, "fragment_limit_mb") == 0) {
        if (!num_parse_u64(value, &v) || v > ((uint64_t)1 << 30))
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

static const ArenaOps stitch_arena = {
    .name = "stitch",
    .unit = MIN_BLOCK,
    .block_size = sizeof(ArenaBlock),
    .seg_size = sizeof(SSeg),
    .seed = 0x1B873593u,
    .free_insert = free_insert,
    .free_remove = free_remove,
    .free_holds = free_holds,
    .free_verify = free_verify,
};

static void *stitch_create(const char *settings, MemsimDevice *dev, GError **error)
{
    StitchConfig cfg = {2 * KIT_MIB, 0, 0};
    if (!kit_parse_settings("stitch", settings, stitch_keys, stitch_setting, &cfg, error))
        return NULL;
    Stitch *s = g_new0(Stitch, 1);
    arena_init(&s->a, &stitch_arena, dev);
    s->cfg = cfg;
    return s;
}

static const MemsimAllocOps stitch_ops = {
    .name = "stitch",
    .description = "GMLake-style virtual memory stitching: 2 MiB physical chunks, free chunks "
                   "remapped into one range for a large request",
    .settings_help = stitch_settings_help,
    .create = stitch_create,
    .destroy = arena_destroy,
    .malloc = stitch_malloc,
    .free = arena_free,
    .empty_cache = stitch_empty_cache,
    .stats = arena_stats,
    .stats_live = arena_stats_live,
    .stats_live_fixed = TRUE,
    .shape = arena_shape,
    .reset_peaks = arena_reset_peaks,
    .check = stitch_check,
    .seed_segment = stitch_seed_segment,
    .seed_block = stitch_seed_block,
    .round_size = stitch_round,
    .foreach_block = arena_foreach_block,
};

const MemsimAllocOps *memsim_alloc_stitch_ops(void)
{
    return &stitch_ops;
}
