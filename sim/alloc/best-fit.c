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
 * Data structures and cost (n = free blocks): blocks and segments come from slabs; the free
 * blocks are ordered (size, address) in size-class treaps with a bitmap of non-empty classes
 * (sim/alloc/kit.h), so a search is a lower_bound in one small tree or the first block of the
 * next non-empty class, O(log n); blocks in use are found by address in an open-addressing map,
 * O(1); the blocks of a segment form a doubly linked list in address order, so merging is O(1) plus
 * tree updates. Segments are kept sorted by address (binary search) for seeding and checking.
 */
#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

typedef struct Seg Seg;
typedef struct Blk Blk;

struct Blk {
    KitNode node; /* free set links while free */
    memsim_addr_t ptr;
    memsim_size_t size;
    memsim_size_t requested;
    Blk *prev, *next; /* address neighbours in the segment */
    Seg *seg;
    uint8_t used;
    uint32_t stream; /* in use: the request's, reported with its free */
};

struct Seg {
    KitSeg k;
    Blk *first;
    uint64_t n_used;
};

typedef struct {
    MemsimDevice *dev;
    memsim_size_t segment_size;
    KitBins free; /* free blocks by (size, address) */
    KitAddrMap live;
    KitSlab blocks, seg_slab;
    KitSegs segs;
    uint32_t rng;
    MemsimAllocStats st;
} Fit;

#define ARENA_NAME "best-fit"
#include "sim/alloc/arena.h"

/* ---------------------------------------------------------------------------------------- */
/* The free set: size-class treaps ordered (size, address) */

static gboolean blk_less(const KitNode *a, const KitNode *b)
{
    const Blk *x = (const Blk *)a, *y = (const Blk *)b;
    if (x->size != y->size)
        return x->size < y->size;
    return x->ptr < y->ptr;
}

static memsim_size_t blk_size(const KitNode *n)
{
    return ((const Blk *)n)->size;
}

static void free_insert(Fit *f, Blk *b)
{
    b->node.prio = kit_prio(&f->rng);
    kit_bins_insert(&f->free, &b->node, b->size, blk_less);
    if (is_split(b))
        memsim_stat_add(&f->st.inactive_split, (int64_t)b->size);
}

static void free_remove(Fit *f, Blk *b)
{
    kit_bins_remove(&f->free, &b->node, b->size);
    if (is_split(b))
        memsim_stat_sub(&f->st.inactive_split, (int64_t)b->size);
}

/* Best fit: the smallest free block of at least n bytes, lowest address among equals. */
static Blk *find_fit(Fit *f, memsim_size_t n)
{
    return (Blk *)kit_bins_lower_bound(&f->free, n, blk_size);
}

/* b leaves the set; what it has beyond n bytes comes back as a block of its own. */
static Blk *carve(Fit *f, Blk *b, memsim_size_t n)
{
    free_remove(f, b);
    if (b->size > n)
        split_blk(f, b, n);
    return b;
}

/* Merges a free block that is out of the free set with its free neighbours, then puts the
 * union in the set. */
static void release_blk(Fit *f, Blk *b)
{
    Blk *n = b->next;
    if (n && !n->used) {
        free_remove(f, n);
        b->size += n->size;
        b->next = n->next;
        if (n->next)
            n->next->prev = b;
        kit_slab_put(&f->blocks, n);
    }
    Blk *p = b->prev;
    if (p && !p->used) {
        free_remove(f, p);
        p->size += b->size;
        p->next = b->next;
        if (b->next)
            b->next->prev = p;
        kit_slab_put(&f->blocks, b);
        b = p;
    }
    free_insert(f, b);
}

static gboolean free_set_holds(Fit *f, Blk *b)
{
    return kit_bins_contains(&f->free, &b->node, b->size);
}

static gboolean free_set_verify(Fit *f, int64_t n_free, GError **error)
{
    /* Every free block of a segment was found in the set, so equal counts mean that the set
     * holds nothing else. */
    int64_t in_set = kit_bins_verify(&f->free, blk_less, blk_size);
    if (in_set < 0)
        FAIL("the free set's size classes are not well-formed trees sorted by (size, address)");
    if (in_set != n_free)
        FAIL("the free set holds %" G_GINT64_FORMAT " blocks, segments have %" G_GINT64_FORMAT
             " free",
             in_set, n_free);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* The policy (sim/alloc/arena.h) */

static const MemsimAllocOps best_fit_ops = {
    .name = "best-fit",
    .description = "textbook best fit with coalescing over an address-ordered arena of "
                   "64 MiB segments",
    .settings_help = fit_settings_help,
    .create = fit_create,
    .destroy = fit_destroy,
    .malloc = fit_malloc,
    .free = fit_free,
    .empty_cache = fit_empty_cache,
    .stats = fit_stats,
    .shape = fit_shape,
    .reset_peaks = fit_reset_peaks,
    .check = fit_check,
    .seed_segment = fit_seed_segment,
    .seed_block = fit_seed_block,
    .round_size = fit_round,
    .foreach_block = fit_foreach_block,
};

const MemsimAllocOps *memsim_alloc_best_fit_ops(void)
{
    return &best_fit_ops;
}
