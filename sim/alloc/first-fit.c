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
 * Data structures and cost (n = free blocks): blocks and segments come from slabs; the free
 * blocks form one intrusive treap ordered by address in which every node also holds the
 * largest free size of its subtree, so the lowest-addressed block that fits is found in one
 * descent, O(log n) (the classic augmented search tree; a linear free-list scan would be
 * O(n)). Carving the low end of a block or growing one by a merge keeps its place in the
 * address order, so those update the node in place and only refresh the sizes up its path.
 * Blocks in use are found by address in an open-addressing map, O(1); the blocks of a segment
 * form a doubly linked list in address order. Segments are kept sorted by address.
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
    memsim_size_t max; /* the largest free size in this node's subtree */
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
    KitNode *free_root;
    uint64_t n_free;
    KitAddrMap live;
    KitSlab blocks, seg_slab;
    KitSegs segs;
    uint32_t rng;
    MemsimAllocStats st;
} Fit;

#define ARENA_NAME "first-fit"
#include "sim/alloc/arena.h"

/* ---------------------------------------------------------------------------------------- */
/* The free set: one treap by address, each node holding its subtree's largest size */

static gboolean blk_less(const KitNode *a, const KitNode *b)
{
    return ((const Blk *)a)->ptr < ((const Blk *)b)->ptr;
}

static void blk_fix(KitNode *x)
{
    Blk *b = (Blk *)x;
    memsim_size_t m = b->size;
    if (x->left && ((Blk *)x->left)->max > m)
        m = ((Blk *)x->left)->max;
    if (x->right && ((Blk *)x->right)->max > m)
        m = ((Blk *)x->right)->max;
    b->max = m;
}

static void free_insert(Fit *f, Blk *b)
{
    b->node.prio = kit_prio(&f->rng);
    kit_tree_insert(&f->free_root, &b->node, blk_less, blk_fix);
    f->n_free++;
    if (is_split(b))
        memsim_stat_add(&f->st.inactive_split, (int64_t)b->size);
}

static void free_remove(Fit *f, Blk *b)
{
    kit_tree_remove(&f->free_root, &b->node, blk_fix);
    f->n_free--;
    if (is_split(b))
        memsim_stat_sub(&f->st.inactive_split, (int64_t)b->size);
}

/* First fit: the free block of lowest address that holds n bytes. A subtree whose largest
 * size is below n is skipped whole. */
static Blk *find_fit(Fit *f, memsim_size_t n)
{
    KitNode *x = f->free_root;
    if (!x || ((Blk *)x)->max < n)
        return NULL;
    for (;;) {
        if (x->left && ((Blk *)x->left)->max >= n)
            x = x->left;
        else if (((Blk *)x)->size >= n)
            return (Blk *)x;
        else
            x = x->right;
    }
}

/* The request takes the low end of b. */
static Blk *carve(Fit *f, Blk *b, memsim_size_t n)
{
    if (b->size > n) {
        /* The request takes the low end as a new block before b; b keeps the tail, which
         * stays where b was in the address order. */
        Blk *u = new_blk(f, b->seg, b->ptr, n);
        if (is_split(b))
            memsim_stat_sub(&f->st.inactive_split, (int64_t)b->size);
        u->prev = b->prev;
        u->next = b;
        if (b->prev)
            b->prev->next = u;
        else
            b->seg->first = u;
        b->prev = u;
        b->ptr += n;
        b->size -= n;
        memsim_stat_add(&f->st.inactive_split, (int64_t)b->size);
        kit_fix_up(&b->node, blk_fix);
        b = u;
    } else {
        free_remove(f, b);
    }
    return b;
}

/* Puts a block that was just freed into the free set, merged with its free neighbours. A free
 * neighbour already in the set absorbs it where it stands: the union keeps that neighbour's
 * place in the address order, so only the subtree sizes above it change. */
static void release_blk(Fit *f, Blk *b)
{
    Blk *p = b->prev, *n = b->next;
    gboolean p_free = p && !p->used, n_free = n && !n->used;
    if (p_free) {
        Blk *after = b->next;
        memsim_size_t size = p->size + b->size;
        if (n_free) {
            free_remove(f, n);
            size += n->size;
            after = n->next;
            kit_slab_put(&f->blocks, n);
        }
        if (is_split(p))
            memsim_stat_sub(&f->st.inactive_split, (int64_t)p->size);
        p->next = after;
        if (after)
            after->prev = p;
        p->size = size;
        if (is_split(p))
            memsim_stat_add(&f->st.inactive_split, (int64_t)p->size);
        kit_fix_up(&p->node, blk_fix);
        kit_slab_put(&f->blocks, b);
    } else if (n_free) {
        if (is_split(n))
            memsim_stat_sub(&f->st.inactive_split, (int64_t)n->size);
        n->prev = b->prev;
        if (b->prev)
            b->prev->next = n;
        else
            b->seg->first = n;
        n->ptr = b->ptr;
        n->size += b->size;
        if (is_split(n))
            memsim_stat_add(&f->st.inactive_split, (int64_t)n->size);
        kit_fix_up(&n->node, blk_fix);
        kit_slab_put(&f->blocks, b);
    } else {
        free_insert(f, b);
    }
}

static gboolean free_set_holds(Fit *f, Blk *b)
{
    return kit_tree_contains(f->free_root, &b->node);
}

static gboolean free_set_verify(Fit *f, int64_t n_free, GError **error)
{
    int64_t in_tree = kit_tree_verify(f->free_root, blk_less);
    if (in_tree < 0)
        FAIL("the free set is not a well-formed tree sorted by address");
    for (KitNode *x = kit_tree_first(f->free_root); x; x = kit_tree_next(x)) {
        Blk *b = (Blk *)x;
        if (b->used)
            FAIL("the free set holds block 0x%" G_GINT64_MODIFIER "x, which is in use", b->ptr);
        memsim_size_t m = b->max;
        blk_fix(x);
        if (m != b->max)
            FAIL("block 0x%" G_GINT64_MODIFIER "x records %" G_GUINT64_FORMAT " as its "
                 "subtree's largest size, which is %" G_GUINT64_FORMAT,
                 b->ptr, m, b->max);
    }
    if (in_tree != n_free || (uint64_t)n_free != f->n_free)
        FAIL("the free set holds %" G_GINT64_FORMAT " blocks (counted %" G_GUINT64_FORMAT
             "), segments have %" G_GINT64_FORMAT,
             in_tree, f->n_free, n_free);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* The policy (sim/alloc/arena.h) */

static const MemsimAllocOps first_fit_ops = {
    .name = "first-fit",
    .description = "textbook address-ordered first fit with coalescing over an arena of "
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

const MemsimAllocOps *memsim_alloc_first_fit_ops(void)
{
    return &first_fit_ops;
}
