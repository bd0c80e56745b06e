/* first-fit — the textbook first-fit allocator with coalescing, for comparison.
 *
 * Algorithm (Knuth, TAOCP vol. 1 §2.5, Algorithm A; Wilson, Johnstone, Neely and Boles,
 * "Dynamic Storage Allocation: A Survey and Critical Review", IWMM 1995, §3.4, address-ordered
 * first fit): a request rounded up to 512 bytes takes the free block of lowest address that
 * holds it; the block is split and the request keeps its low end. A freed block merges at once
 * with free address neighbours. The arena is address-ordered (segments by their device
 * address, blocks within them) and grows by segments of `segment_mb` (default 64 MiB); a
 * request larger than that gets a segment of its own rounded up to 2 MiB. Segments that become
 * wholly free stay cached; they go back to the device on empty_cache, or when the device is
 * short for a new segment (then the new segment also shrinks to the request if that is what
 * still fits). Streams are ignored. Wilson et al. found address-ordered first fit about as
 * good as best fit on real programs; it tends to pile small blocks at low addresses.
 *
 * Statistics: allocated = active = bytes of blocks in use; reserved = segment bytes; segments
 * = segments; n_device_alloc / n_device_free = segments taken / released; inactive_split =
 * free blocks that share their segment with other blocks.
 *
 * Data structures and cost (n = free blocks): the free blocks form one intrusive treap ordered
 * by address in which every node also holds the largest free size of its subtree, so the
 * lowest-addressed block that fits is found in one descent, O(log n) (the classic augmented
 * search tree; a linear free-list scan would be O(n)). Carving the low end of a block or
 * growing one by a merge keeps its place in the address order, so those update the node in
 * place and only refresh the sizes up its path. The rest (segments, blocks, growth,
 * statistics, seeding, settings) is the arena that best-fit shares (sim/alloc/arena.c): blocks
 * in use found by address in O(1), the blocks of a segment a doubly linked list in address
 * order.
 */
#include <memsim/alloc.h>

#include "sim/alloc/arena.h"
#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

typedef struct {
    ArenaBlock b;
    memsim_size_t max; /* the largest free size in this node's subtree */
} FfBlock;

typedef struct {
    Arena a;
    KitNode *free_root;
    uint64_t n_free;
} FirstFit;

/* ---------------------------------------------------------------------------------------- */
/* The free set: one treap by address, each node holding its subtree's largest size */

static inline FfBlock *ff(const KitNode *x)
{
    return (FfBlock *)x;
}

static gboolean blk_less(const KitNode *a, const KitNode *b)
{
    return ff(a)->b.ptr < ff(b)->b.ptr;
}

static void blk_fix(KitNode *x)
{
    memsim_size_t m = ff(x)->b.size;
    if (x->left && ff(x->left)->max > m)
        m = ff(x->left)->max;
    if (x->right && ff(x->right)->max > m)
        m = ff(x->right)->max;
    ff(x)->max = m;
}

static void free_insert(Arena *a, ArenaBlock *b)
{
    FirstFit *f = (FirstFit *)a;
    b->node.prio = kit_prio(&a->rng);
    kit_tree_insert(&f->free_root, &b->node, blk_less, blk_fix);
    f->n_free++;
    arena_split_counted(a, b, +1);
}

static void free_remove(Arena *a, ArenaBlock *b)
{
    FirstFit *f = (FirstFit *)a;
    kit_tree_remove(&f->free_root, &b->node, blk_fix);
    f->n_free--;
    arena_split_counted(a, b, -1);
}

/* First fit: the free block of lowest address that holds n bytes. A subtree whose largest
 * size is below n is skipped whole. */
static ArenaBlock *find_fit(Arena *a, memsim_size_t n)
{
    KitNode *x = ((FirstFit *)a)->free_root;
    if (!x || ff(x)->max < n)
        return NULL;
    for (;;) {
        if (x->left && ff(x->left)->max >= n)
            x = x->left;
        else if (ff(x)->b.size >= n)
            return &ff(x)->b;
        else
            x = x->right;
    }
}

/* The request takes the low end of b. */
static ArenaBlock *carve(Arena *a, ArenaBlock *b, memsim_size_t n)
{
    if (b->size > n) {
        /* The request takes the low end as a new block before b; b keeps the tail, which
         * stays where b was in the address order. */
        ArenaBlock *u = arena_block_new(a, b->seg, b->ptr, n);
        arena_split_counted(a, b, -1);
        u->prev = b->prev;
        u->next = b;
        if (b->prev)
            b->prev->next = u;
        else
            b->seg->first = u;
        b->prev = u;
        b->ptr += n;
        b->size -= n;
        arena_split_counted(a, b, +1);
        kit_fix_up(&b->node, blk_fix);
        b = u;
    } else {
        free_remove(a, b);
    }
    return b;
}

/* Puts a block that was just freed into the free set, merged with its free neighbours. A free
 * neighbour already in the set absorbs it where it stands: the union keeps that neighbour's
 * place in the address order, so only the subtree sizes above it change. */
static void release(Arena *a, ArenaBlock *b)
{
    ArenaBlock *p = b->prev, *n = b->next;
    gboolean p_free = p && p->state == ARENA_FREE, n_free = n && n->state == ARENA_FREE;
    if (p_free) {
        if (n_free) {
            free_remove(a, n);
            arena_absorb_next(a, b);
        }
        arena_split_counted(a, p, -1);
        arena_absorb_next(a, p);
        arena_split_counted(a, p, +1);
        kit_fix_up(&p->node, blk_fix);
    } else if (n_free) {
        arena_split_counted(a, n, -1);
        n->prev = b->prev;
        if (b->prev)
            b->prev->next = n;
        else
            b->seg->first = n;
        n->ptr = b->ptr;
        n->size += b->size;
        arena_split_counted(a, n, +1);
        kit_fix_up(&n->node, blk_fix);
        kit_slab_put(&a->blocks, b);
    } else {
        free_insert(a, b);
    }
}

static gboolean free_holds(Arena *a, ArenaBlock *b)
{
    return kit_tree_contains(((FirstFit *)a)->free_root, &b->node);
}

static gboolean free_verify(Arena *a, int64_t n_free, GError **error)
{
    FirstFit *f = (FirstFit *)a;
    int64_t in_tree = kit_tree_verify(f->free_root, blk_less);
    if (in_tree < 0) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "first-fit: the free set is not a well-formed tree sorted by address");
        return FALSE;
    }
    for (KitNode *x = kit_tree_first(f->free_root); x; x = kit_tree_next(x)) {
        ArenaBlock *b = &ff(x)->b;
        if (b->state != ARENA_FREE) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "first-fit: the free set holds block 0x%" G_GINT64_MODIFIER "x, which "
                        "is not free",
                        b->ptr);
            return FALSE;
        }
        memsim_size_t m = ff(x)->max;
        blk_fix(x);
        if (m != ff(x)->max) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "first-fit: block 0x%" G_GINT64_MODIFIER "x records %" G_GUINT64_FORMAT
                        " as its subtree's largest size, which is %" G_GUINT64_FORMAT,
                        b->ptr, m, ff(x)->max);
            return FALSE;
        }
    }
    if (in_tree != n_free || (uint64_t)n_free != f->n_free) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "first-fit: the free set holds %" G_GINT64_FORMAT " blocks (counted "
                    "%" G_GUINT64_FORMAT "), segments have %" G_GINT64_FORMAT,
                    in_tree, f->n_free, n_free);
        return FALSE;
    }
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* The policy (sim/alloc/arena.c) */

static const ArenaOps first_fit_arena = {
    .name = "first-fit",
    .unit = 512,
    .block_size = sizeof(FfBlock),
    .seg_size = sizeof(ArenaSeg),
    .seed = 0x6C8E9CF5u,
    .free_insert = free_insert,
    .free_remove = free_remove,
    .free_holds = free_holds,
    .free_verify = free_verify,
    .release = release,
    .find_fit = find_fit,
    .carve = carve,
};

static void *first_fit_create(const char *settings, MemsimDevice *dev, GError **error)
{
    return arena_fit_create(sizeof(FirstFit), &first_fit_arena, settings, dev, error);
}

static const MemsimAllocOps first_fit_ops = {
    .name = "first-fit",
    .description = "textbook address-ordered first fit with coalescing over an arena of "
                   "64 MiB segments",
    .settings_help = arena_fit_settings_help,
    .create = first_fit_create,
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

const MemsimAllocOps *memsim_alloc_first_fit_ops(void)
{
    return &first_fit_ops;
}
