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

#define MIN_BLOCK ((memsim_size_t)512)
#define SEG_ROUND (2 * KIT_MIB)

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

static inline memsim_size_t round_req(memsim_size_t n)
{
    return n <= MIN_BLOCK ? MIN_BLOCK : kit_round_up(n, MIN_BLOCK);
}

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

static inline gboolean is_split(const Blk *b)
{
    return b->prev || b->next;
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

static Blk *new_blk(Fit *f, Seg *s, memsim_addr_t ptr, memsim_size_t size)
{
    Blk *b = kit_slab_get(&f->blocks);
    b->ptr = ptr;
    b->size = size;
    b->seg = s;
    return b;
}

static Seg *add_seg(Fit *f, memsim_addr_t base, memsim_size_t size)
{
    Seg *s = kit_slab_get(&f->seg_slab);
    s->k.base = base;
    s->k.size = size;
    kit_segs_insert(&f->segs, &s->k);
    s->first = new_blk(f, s, base, size);
    free_insert(f, s->first);
    memsim_stat_add(&f->st.reserved, (int64_t)size);
    memsim_stat_add(&f->st.segments, 1);
    return s;
}

static inline gboolean device_has(const Fit *f, memsim_size_t n)
{
    memsim_size_t cap = f->dev->capacity, held = (memsim_size_t)f->st.reserved.current;
    return !cap || (held <= cap && n <= cap - held);
}

/* Gives every wholly free segment back to the device. */
static void release_free_segments(Fit *f)
{
    for (guint i = f->segs.n; i-- > 0;) {
        Seg *s = (Seg *)f->segs.v[i];
        if (s->n_used)
            continue;
        g_assert(s->first->next == NULL);
        free_remove(f, s->first);
        kit_slab_put(&f->blocks, s->first);
        kit_segs_remove(&f->segs, &s->k);
        memsim_stat_sub(&f->st.reserved, (int64_t)s->k.size);
        memsim_stat_sub(&f->st.segments, 1);
        f->st.n_device_free++;
        memsim_device_emit(f->dev, MEMSIM_AEV_SEG_FREE, s->k.base, s->k.size, 0);
        kit_slab_put(&f->seg_slab, s);
    }
}

/* A new segment able to hold n bytes, or FALSE when the device cannot provide one. */
static gboolean grow(Fit *f, memsim_size_t n, uint32_t stream)
{
    memsim_size_t want = MAX(f->segment_size, kit_round_up(n, SEG_ROUND));
    if (!device_has(f, want)) {
        release_free_segments(f);
        if (!device_has(f, want))
            want = kit_round_up(n, SEG_ROUND);
        if (!device_has(f, want))
            return FALSE;
    }
    memsim_addr_t base = kit_segment_addr(f->dev, &f->segs, want, stream);
    add_seg(f, base, want);
    f->st.n_device_alloc++;
    memsim_device_emit(f->dev, MEMSIM_AEV_SEG_ALLOC, base, want, stream);
    return TRUE;
}

/* b (free, out of the free set) keeps n bytes; the rest becomes a free block after it. */
static void split_blk(Fit *f, Blk *b, memsim_size_t n)
{
    Blk *rest = new_blk(f, b->seg, b->ptr + n, b->size - n);
    b->size = n;
    rest->prev = b;
    rest->next = b->next;
    if (b->next)
        b->next->prev = rest;
    b->next = rest;
    free_insert(f, rest);
}

static void use_blk(Fit *f, Blk *b, memsim_size_t requested)
{
    b->used = 1;
    b->requested = requested;
    b->seg->n_used++;
    kit_map_put(&f->live, b->ptr, b);
    memsim_stat_add(&f->st.allocated, (int64_t)b->size);
    memsim_stat_add(&f->st.active, (int64_t)b->size);
    memsim_stat_add(&f->st.requested, (int64_t)requested);
    memsim_stat_add(&f->st.allocations, 1);
}

/* ---------------------------------------------------------------------------------------- */
/* The policy */

static memsim_size_t fit_round(void *state, memsim_size_t size)
{
    return round_req(size);
}

static MemsimAllocResult fit_malloc(void *state, memsim_size_t size, uint32_t stream,
                                    memsim_addr_t *addr)
{
    Fit *f = state;
    memsim_size_t n = round_req(size);
    Blk *b = find_fit(f, n);
    if (!b) {
        if (!grow(f, n, stream)) {
            memsim_size_t cap = f->dev->capacity, held = (memsim_size_t)f->st.reserved.current;
            f->st.n_ooms++;
            memsim_device_emit(f->dev, MEMSIM_AEV_OOM, cap > held ? cap - held : 0, n, stream);
            return MEMSIM_ALLOC_OOM;
        }
        b = find_fit(f, n);
    }
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
    use_blk(f, b, size);
    *addr = b->ptr;
    memsim_device_emit(f->dev, MEMSIM_AEV_ALLOC, b->ptr, size, stream);
    return MEMSIM_ALLOC_OK;
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

static void fit_free(void *state, memsim_addr_t addr)
{
    Fit *f = state;
    Blk *b = kit_map_take(&f->live, addr);
    if (!b) {
        g_critical("first-fit: free of 0x%" G_GINT64_MODIFIER "x, which is not allocated", addr);
        return;
    }
    b->used = 0;
    b->seg->n_used--;
    memsim_stat_sub(&f->st.allocated, (int64_t)b->size);
    memsim_stat_sub(&f->st.active, (int64_t)b->size);
    memsim_stat_sub(&f->st.requested, (int64_t)b->requested);
    memsim_stat_sub(&f->st.allocations, 1);
    memsim_device_emit(f->dev, MEMSIM_AEV_FREE_COMPLETED, addr, b->requested, 0);
    release_blk(f, b);
}

static void fit_empty_cache(void *state)
{
    release_free_segments(state);
}

static MemsimAllocStats fit_stats(void *state)
{
    return ((Fit *)state)->st;
}

static void fit_reset_peaks(void *state)
{
    kit_reset_peaks(&((Fit *)state)->st);
}

static MemsimAllocShape fit_shape(void *state)
{
    Fit *f = state;
    MemsimAllocShape sh = {0};
    sh.n_segments = f->segs.n;
    for (guint i = 0; i < f->segs.n; i++)
        for (Blk *b = ((Seg *)f->segs.v[i])->first; b; b = b->next) {
            if (b->used)
                continue;
            sh.free_bytes += b->size;
            sh.n_free_blocks++;
            if (b->size > sh.largest_free)
                sh.largest_free = b->size;
        }
    return sh;
}

static void fit_foreach_block(void *state, MemsimBlockFunc fn, void *user)
{
    Fit *f = state;
    for (guint i = 0; i < f->segs.n; i++) {
        Seg *s = (Seg *)f->segs.v[i];
        for (Blk *b = s->first; b; b = b->next) {
            MemsimBlockInfo info = {.segment = s->k.base,
                                    .segment_size = s->k.size,
                                    .stream = 0,
                                    .segment_flags = 0,
                                    .addr = b->ptr,
                                    .size = b->size,
                                    .requested = b->used ? b->requested : 0,
                                    .state = b->used ? MEMSIM_BLOCK_ALLOCATED : MEMSIM_BLOCK_FREE};
            fn(user, &info);
        }
    }
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "first-fit: " __VA_ARGS__);       \
        return FALSE;                                                                              \
    } while (0)

static gboolean fit_check(void *state, GError **error)
{
    Fit *f = state;
    int64_t allocated = 0, requested = 0, reserved = 0, split = 0, n_used = 0, n_free = 0;
    for (guint i = 0; i < f->segs.n; i++) {
        Seg *s = (Seg *)f->segs.v[i];
        if (i && f->segs.v[i - 1]->base + f->segs.v[i - 1]->size > s->k.base)
            FAIL("segments 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER "x overlap",
                 f->segs.v[i - 1]->base, s->k.base);
        reserved += (int64_t)s->k.size;
        memsim_addr_t expect = s->k.base;
        uint64_t used = 0;
        Blk *prev = NULL;
        for (Blk *b = s->first; b; prev = b, b = b->next) {
            if (b->prev != prev || b->seg != s)
                FAIL("block 0x%" G_GINT64_MODIFIER "x: broken links", b->ptr);
            if (b->ptr != expect || b->size == 0 || b->size % MIN_BLOCK)
                FAIL("segment 0x%" G_GINT64_MODIFIER "x: block 0x%" G_GINT64_MODIFIER
                     "x of %" G_GUINT64_FORMAT " bytes where 0x%" G_GINT64_MODIFIER
                     "x was expected "
                     "(blocks must tile their segment in 512-byte units)",
                     s->k.base, b->ptr, b->size, expect);
            expect += b->size;
            if (b->used) {
                used++;
                allocated += (int64_t)b->size;
                requested += (int64_t)b->requested;
                if (kit_map_get(&f->live, b->ptr) != b)
                    FAIL("block 0x%" G_GINT64_MODIFIER "x in use but not in the address map",
                         b->ptr);
                if (round_req(b->requested) > b->size)
                    FAIL("block 0x%" G_GINT64_MODIFIER "x smaller than its request", b->ptr);
            } else {
                n_free++;
                if (prev && !prev->used)
                    FAIL("free blocks 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER
                         "x were not merged",
                         prev->ptr, b->ptr);
                if (!kit_tree_contains(f->free_root, &b->node))
                    FAIL("free block 0x%" G_GINT64_MODIFIER "x is not in the free set", b->ptr);
                if (is_split(b))
                    split += (int64_t)b->size;
            }
        }
        if (expect != s->k.base + s->k.size)
            FAIL("segment 0x%" G_GINT64_MODIFIER "x: blocks cover %" G_GUINT64_FORMAT
                 " of %" G_GUINT64_FORMAT " bytes",
                 s->k.base, expect - s->k.base, s->k.size);
        if (used != s->n_used)
            FAIL("segment 0x%" G_GINT64_MODIFIER "x counts %" G_GUINT64_FORMAT " blocks in use, "
                 "holds %" G_GUINT64_FORMAT,
                 s->k.base, s->n_used, used);
        n_used += (int64_t)used;
    }
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
    if ((int64_t)f->live.n != n_used)
        FAIL("address map holds %" G_GUINT64_FORMAT " blocks, segments %" G_GINT64_FORMAT,
             f->live.n, n_used);
    KitCheck cmp[] = {
        {"allocated", allocated, f->st.allocated.current},
        {"active", allocated, f->st.active.current},
        {"requested", requested, f->st.requested.current},
        {"reserved", reserved, f->st.reserved.current},
        {"segments", (int64_t)f->segs.n, f->st.segments.current},
        {"allocations", n_used, f->st.allocations.current},
        {"inactive_split", split, f->st.inactive_split.current},
    };
    return kit_check_stats("first-fit", &f->st, cmp, G_N_ELEMENTS(cmp), error);
}

/* ---------------------------------------------------------------------------------------- */
/* Seeding: recorded segments become segments of the arena; a live block keeps its address
 * and its request rounded to 512 bytes, the rest of the recorded block stays free. */

static gboolean fit_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                 uint32_t stream, uint32_t flags, GError **error)
{
    Fit *f = state;
    if (size == 0 || size % MIN_BLOCK || addr % MIN_BLOCK || kit_segs_overlap(&f->segs, addr, size))
        FAIL("cannot start from segment 0x%" G_GINT64_MODIFIER "x of %" G_GUINT64_FORMAT
             " bytes (empty, not in 512-byte units, or overlapping another)",
             addr, size);
    add_seg(f, addr, size);
    kit_reset_peaks(&f->st);
    return TRUE;
}

static gboolean fit_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                               memsim_size_t requested, uint32_t stream, GError **error)
{
    Fit *f = state;
    memsim_size_t n = round_req(requested ? requested : block_size);
    Seg *s = (Seg *)kit_segs_find(&f->segs, addr);
    Blk *b = s ? s->first : NULL;
    while (b && !(b->ptr <= addr && addr - b->ptr < b->size))
        b = b->next;
    if (!b || b->used || addr % MIN_BLOCK || addr + n > b->ptr + b->size)
        FAIL("seeded block 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT " bytes) does not "
             "lie inside one free block of a seeded segment",
             addr, n);
    free_remove(f, b);
    if (b->ptr < addr) {
        Blk *front = b;
        split_blk(f, front, addr - front->ptr);
        b = front->next;
        free_remove(f, b);
        free_insert(f, front);
    }
    if (b->size > n)
        split_blk(f, b, n);
    use_blk(f, b, requested);
    kit_reset_peaks(&f->st);
    return TRUE;
}

/* ---------------------------------------------------------------------------------------- */
/* Settings and life cycle */

static const char fit_settings_help[] =
    "segment_mb=N   the arena grows by segments of N MiB (integer >= 2; default 64); a larger "
    "request gets its own segment rounded up to 2 MiB";

static gboolean fit_setting(void *cfgp, const char *key, const char *value, GError **error)
{
    memsim_size_t *seg = cfgp;
    uint64_t v;
    if (strcmp(key, "segment_mb") != 0)
        FAIL("unknown setting '%s' (accepted: segment_mb)", key);
    if (!kit_parse_u64(value, &v) || v < 2 || v > ((uint64_t)1 << 30))
        FAIL("segment_mb must be an integer number of MiB between 2 and 2^30 (got '%s')", value);
    *seg = v * KIT_MIB;
    return TRUE;
}

static void *fit_create(const char *settings, MemsimDevice *dev, GError **error)
{
    memsim_size_t seg = 64 * KIT_MIB;
    if (!kit_parse_settings("first-fit", settings, "segment_mb", fit_setting, &seg, error))
        return NULL;
    Fit *f = g_new0(Fit, 1);
    f->dev = dev;
    f->segment_size = seg;
    kit_map_init(&f->live, 10);
    kit_slab_init(&f->blocks, sizeof(Blk));
    kit_slab_init(&f->seg_slab, sizeof(Seg));
    f->rng = 0x6C8E9CF5u;
    return f;
}

static void fit_destroy(void *state)
{
    Fit *f = state;
    if (!f)
        return;
    kit_map_clear(&f->live);
    kit_slab_clear(&f->blocks);
    kit_slab_clear(&f->seg_slab);
    kit_segs_clear(&f->segs);
    g_free(f);
}

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
