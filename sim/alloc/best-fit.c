/* best-fit — the textbook best-fit allocator with coalescing, for comparison.
 *
 * Algorithm (Knuth, TAOCP vol. 1 §2.5; Wilson, Johnstone, Neely and Boles, "Dynamic Storage
 * Allocation: A Survey and Critical Review", IWMM 1995, §3.3): a request rounded up to 512
 * bytes takes the smallest free block that holds it, the lowest address among equals; the
 * block is split and the request keeps its low end. A freed block merges at once with free
 * address neighbours. The arena is address-ordered and grows by segments of `segment_mb`
 * (default 64 MiB) taken from the device; a request larger than that gets a segment of its own
 * rounded up to 2 MiB. Segments that become wholly free stay cached; they go back to the
 * device on empty_cache, or when the device is short for a new segment (then the new segment
 * also shrinks to the request if that is what still fits). Streams are ignored.
 * Wilson et al. measured best fit among the lowest-fragmentation policies on real programs;
 * its worst case is still unbounded (Robson: a factor of log2 of the largest/smallest size).
 *
 * Statistics: allocated = active = bytes of blocks in use; reserved = segment bytes; segments
 * = segments; n_device_alloc / n_device_free = segments taken / released; inactive_split =
 * free blocks that share their segment with other blocks.
 *
 * Data structures and cost (n = free blocks): the free blocks are ordered (size, address) in
 * size-class treaps with a bitmap of non-empty classes (sim/alloc/kit.h), so a search is a
 * lower_bound in one small tree or the first block of the next non-empty class, O(log n). The
 * rest (segments, blocks, growth, merging, statistics, seeding, settings) is the arena that
 * first-fit shares (sim/alloc/arena.c): blocks in use found by address in O(1), the blocks of
 * a segment a doubly linked list in address order, so merging is O(1) plus tree updates.
 */
#include <memsim/alloc.h>

#include "sim/alloc/arena.h"
#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

typedef struct {
    Arena a;
    KitBins free; /* free blocks by (size, address) */
} BestFit;

/* ---------------------------------------------------------------------------------------- */
/* The free set: size-class treaps ordered (size, address) */

static void free_insert(Arena *a, ArenaBlock *b)
{
    BestFit *f = (BestFit *)a;
    b->node.prio = kit_prio(&a->rng);
    kit_bins_insert(&f->free, &b->node, b->size, arena_by_size);
    arena_split_counted(a, b, +1);
}

static void free_remove(Arena *a, ArenaBlock *b)
{
    BestFit *f = (BestFit *)a;
    kit_bins_remove(&f->free, &b->node, b->size);
    arena_split_counted(a, b, -1);
}

/* Best fit: the smallest free block of at least n bytes, lowest address among equals. */
static ArenaBlock *find_fit(Arena *a, memsim_size_t n)
{
    return (ArenaBlock *)kit_bins_lower_bound(&((BestFit *)a)->free, n, arena_size_of);
}

static gboolean free_holds(Arena *a, ArenaBlock *b)
{
    return kit_bins_contains(&((BestFit *)a)->free, &b->node, b->size);
}

static gboolean free_verify(Arena *a, int64_t n_free, GError **error)
{
    /* Every free block of a segment was found in the set, so equal counts mean that the set
     * holds nothing else. */
    int64_t in_set = kit_bins_verify(&((BestFit *)a)->free, arena_by_size, arena_size_of);
    if (in_set < 0) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "best-fit: the free set's size classes are not well-formed trees sorted by "
                    "(size, address)");
        return FALSE;
    }
    if (in_set != n_free) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "best-fit: the free set holds %" G_GINT64_FORMAT " blocks, segments have "
                    "%" G_GINT64_FORMAT " free",
                    in_set, n_free);
        return FALSE;
    }
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* The policy (sim/alloc/arena.c) */

static const ArenaOps best_fit_arena = {
    .name = "best-fit",
    .unit = 512,
    .block_size = sizeof(ArenaBlock),
    .seg_size = sizeof(ArenaSeg),
    .seed = 0x6C8E9CF5u,
    .free_insert = free_insert,
    .free_remove = free_remove,
    .free_holds = free_holds,
    .free_verify = free_verify,
    .find_fit = find_fit,
};

static void *best_fit_create(const char *settings, MemsimDevice *dev, GError **error)
{
    return arena_fit_create(sizeof(BestFit), &best_fit_arena, settings, dev, error);
}

static const MemsimAllocOps best_fit_ops = {
    .name = "best-fit",
    .description = "textbook best fit with coalescing over an address-ordered arena of "
                   "64 MiB segments",
    .settings_help = arena_fit_settings_help,
    .create = best_fit_create,
    .destroy = arena_destroy,
    .malloc = arena_fit_malloc,
    .free = arena_free,
    .empty_cache = arena_fit_empty_cache,
    .stats = arena_stats,
    .stats_live = arena_stats_live,
    .stats_live_fixed = TRUE,
    .shape = arena_shape,
    .reset_peaks = arena_reset_peaks,
    .check = arena_check,
    .seed_segment = arena_fit_seed_segment,
    .seed_block = arena_fit_seed_block,
    .round_size = arena_fit_round,
    .foreach_block = arena_foreach_block,
};

const MemsimAllocOps *memsim_alloc_best_fit_ops(void)
{
    return &best_fit_ops;
}
