/* buddy — the binary buddy system, for comparison.
 *
 * Algorithm (Knowlton, "A Fast Storage Allocator", CACM 8(10), 1965; Knuth, TAOCP vol. 1
 * §2.5, Algorithms R and S): memory comes in arenas of `segment_mb` (default 64 MiB, a power
 * of two) taken from the device on demand; a request larger than an arena gets an arena of
 * its own, its size rounded up to a power of two. Every block is a power of two times
 * `min_block` (default 512 bytes) and starts at a multiple of its size from the arena's base.
 * A request takes a block of the smallest order that holds it: the first free block of that
 * order, else one of the next larger order halved as often as needed, the upper halves going
 * to the free lists. A freed block merges with its buddy (the other half of its parent,
 * address = base + (offset XOR size)) as long as the buddy is free and whole, and the result
 * merges again. Wholly free arenas stay cached; they go back to the device on empty_cache, or
 * when the device is short for a new arena (then the new arena also shrinks to the request if
 * that is what still fits). Streams are ignored. Internal fragmentation is the rounding to a
 * power of two: below 50% of each block, 25% expected for sizes spread evenly in log scale.
 *
 * Starting from a recording (seed_segment/seed_block): a recorded segment need not be a power
 * of two, so it is covered by the aligned powers of two of its size's binary digits (20 MiB =
 * 16 MiB + 4 MiB), each a root that never merges beyond itself; a recorded live block keeps
 * its address and its request rounded to 512 bytes as one "pinned" block; the free space
 * around it becomes aligned buddy blocks, and when it is freed it is cut into the fewest
 * aligned blocks, which merge as usual.
 *
 * Statistics: allocated = active = bytes of blocks in use (powers of two); reserved = arena
 * bytes; segments = arenas; n_device_alloc / n_device_free = arenas taken / released;
 * inactive_split = free blocks smaller than the root they lie in.
 *
 * Data structures and cost (L = log2(largest / min_block), at most 52): one intrusive doubly
 * linked free list per order (LIFO) and a 64-bit word of non-empty orders, so the smallest
 * usable order is one count-trailing-zeros; every block, free or in use, is found by address
 * in an open-addressing map, which answers "is my buddy free and whole?" in O(1). malloc and
 * free are O(L) (one map operation per split or merge level); blocks come from a slab.
 */
#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

#define MAX_ORDERS 64
#define SEG_ROUND (2 * KIT_MIB)

typedef struct BArena BArena;
typedef struct BBlk BBlk;

enum { B_FREE = 0, B_USED };

struct BBlk {
    BBlk *lprev, *lnext; /* free list of its order */
    BBlk *aprev, *anext; /* address neighbours in the arena */
    memsim_addr_t ptr;
    memsim_size_t requested;
    BArena *arena;
    memsim_size_t pinned; /* a recorded block (seeded): its size in bytes; 0 otherwise */
    uint8_t order;        /* size = min_block << order (unless pinned) */
    uint8_t root;         /* order of the root it lies in: it never merges beyond */
    uint8_t state;
    uint32_t stream;      /* in use: the request's, reported with its free */
};

struct BArena {
    KitSeg k;
    BBlk *first;     /* blocks in address order */
    uint64_t n_used; /* blocks in use, pieces included */
};

typedef struct {
    MemsimDevice *dev;
    memsim_size_t segment_size;
    memsim_size_t min_block;
    int min_shift;
    BBlk *lists[MAX_ORDERS];
    uint64_t list_bits;
    KitAddrMap blocks; /* every block by address */
    KitSlab blk_slab, arena_slab;
    KitSegs arenas;
    uint64_t n_free;
    MemsimAllocStats st;
} Buddy;

static inline memsim_size_t bsize(const Buddy *a, int order)
{
    return a->min_block << order;
}

static inline memsim_size_t blk_bytes(const Buddy *a, const BBlk *b)
{
    return b->pinned ? b->pinned : bsize(a, b->order);
}

/* The order of the root that covers offset `off` of an arena of `size` bytes. */
static int root_at(const Buddy *a, memsim_size_t size, memsim_size_t off)
{
    memsim_size_t units = size >> a->min_shift, start = 0;
    for (int o = 63; o >= 0; o--)
        if (units >> o & 1) {
            if (off < start + bsize(a, o))
                return o;
            start += bsize(a, o);
        }
    return -1;
}

/* The largest aligned buddy block at p that ends by `end` (p and end in min_block units
 * of the arena at base). */
static int largest_at(const Buddy *a, memsim_addr_t base, memsim_addr_t p, memsim_addr_t end,
                      int max_order)
{
    int o = max_order;
    while (((p - base) & (bsize(a, o) - 1)) || p + bsize(a, o) > end)
        o--;
    return o;
}

/* The smallest order whose block holds n bytes. */
static inline int order_for(const Buddy *a, memsim_size_t n)
{
    if (n <= a->min_block)
        return 0;
    memsim_size_t units = (n + a->min_block - 1) >> a->min_shift;
    return 64 - __builtin_clzll(units - 1);
}

static void list_push(Buddy *a, BBlk *b)
{
    b->state = B_FREE;
    b->lprev = NULL;
    b->lnext = a->lists[b->order];
    if (b->lnext)
        b->lnext->lprev = b;
    a->lists[b->order] = b;
    a->list_bits |= 1ull << b->order;
    a->n_free++;
    if (b->order < b->root)
        memsim_stat_add(&a->st.inactive_split, (int64_t)bsize(a, b->order));
}

static void list_remove(Buddy *a, BBlk *b)
{
    if (b->lprev)
        b->lprev->lnext = b->lnext;
    else
        a->lists[b->order] = b->lnext;
    if (b->lnext)
        b->lnext->lprev = b->lprev;
    if (!a->lists[b->order])
        a->list_bits &= ~(1ull << b->order);
    b->lprev = b->lnext = NULL;
    a->n_free--;
    if (b->order < b->root)
        memsim_stat_sub(&a->st.inactive_split, (int64_t)bsize(a, b->order));
}

/* A new block at ptr, placed after `after` in the arena's address order (first if NULL). */
static BBlk *new_blk(Buddy *a, BArena *ar, memsim_addr_t ptr, int order, int root, BBlk *after)
{
    BBlk *b = kit_slab_get(&a->blk_slab);
    b->ptr = ptr;
    b->arena = ar;
    b->order = (uint8_t)order;
    b->root = (uint8_t)root;
    b->aprev = after;
    b->anext = after ? after->anext : ar->first;
    if (b->anext)
        b->anext->aprev = b;
    if (after)
        after->anext = b;
    else
        ar->first = b;
    kit_map_put(&a->blocks, ptr, b);
    return b;
}

static void drop_blk(Buddy *a, BBlk *b)
{
    if (b->aprev)
        b->aprev->anext = b->anext;
    else
        b->arena->first = b->anext;
    if (b->anext)
        b->anext->aprev = b->aprev;
    kit_map_take(&a->blocks, b->ptr);
    kit_slab_put(&a->blk_slab, b);
}

/* An arena covered by the aligned powers of two of its size's binary digits (one root when
 * the size is a power of two). */
static BArena *add_arena(Buddy *a, memsim_addr_t base, memsim_size_t size)
{
    BArena *ar = kit_slab_get(&a->arena_slab);
    ar->k.base = base;
    ar->k.size = size;
    kit_segs_insert(&a->arenas, &ar->k);
    memsim_size_t off = 0, units = size >> a->min_shift;
    BBlk *last = NULL;
    for (int o = 63; o >= 0; o--)
        if (units >> o & 1) {
            last = new_blk(a, ar, base + off, o, o, last);
            list_push(a, last);
            off += bsize(a, o);
        }
    kit_stats_segment_add(&a->st, size);
    return ar;
}

static void release_free_arenas(Buddy *a)
{
    for (guint i = a->arenas.n; i-- > 0;) {
        BArena *ar = (BArena *)a->arenas.v[i];
        if (ar->n_used)
            continue;
        /* Nothing in use: every root is whole and free. */
        while (ar->first) {
            BBlk *b = ar->first;
            g_assert(b->state == B_FREE && b->order == b->root);
            list_remove(a, b);
            drop_blk(a, b);
        }
        kit_segs_remove(&a->arenas, &ar->k);
        kit_stats_segment_sub(&a->st, ar->k.size);
        a->st.n_device_free++;
        memsim_device_emit(a->dev, MEMSIM_AEV_SEG_FREE, ar->k.base, ar->k.size, 0);
        kit_slab_put(&a->arena_slab, ar);
    }
}

static gboolean grow(Buddy *a, int order, uint32_t stream)
{
    memsim_size_t need = bsize(a, order);
    memsim_size_t want = MAX(a->segment_size, need);
    if (!kit_device_has(a->dev, &a->st, want)) {
        release_free_arenas(a);
        if (!kit_device_has(a->dev, &a->st, want))
            want = need;
        if (!kit_device_has(a->dev, &a->st, want))
            return FALSE;
    }
    memsim_addr_t base = kit_segment_addr(a->dev, &a->arenas, want, stream);
    add_arena(a, base, want);
    a->st.n_device_alloc++;
    memsim_device_emit(a->dev, MEMSIM_AEV_SEG_ALLOC, base, want, stream);
    return TRUE;
}

/* b (free, off its list) is halved until it has `order`; the upper halves become free. */
static void split_down(Buddy *a, BBlk *b, int order)
{
    while (b->order > order) {
        b->order--;
        list_push(a, new_blk(a, b->arena, b->ptr + bsize(a, b->order), b->order, b->root, b));
    }
}

static void mark_used(Buddy *a, BBlk *b, memsim_size_t requested, uint32_t stream)
{
    b->state = B_USED;
    b->requested = requested;
    b->stream = stream;
    b->arena->n_used++;
    kit_stats_alloc(&a->st, blk_bytes(a, b), requested);
}

/* b (a buddy block, not free) becomes free and merges with its buddies as far as its root
 * allows. */
static void merge_free(Buddy *a, BBlk *b)
{
    memsim_addr_t base = b->arena->k.base;
    while (b->order < b->root) {
        memsim_size_t size = bsize(a, b->order);
        BBlk *q = kit_map_get(&a->blocks, base + ((b->ptr - base) ^ size));
        if (!q || q->state != B_FREE || q->order != b->order)
            break;
        list_remove(a, q);
        BBlk *gone = q->ptr < b->ptr ? b : q;
        if (gone == b)
            b = q;
        drop_blk(a, gone);
        b->order++;
    }
    list_push(a, b);
}

/* ---------------------------------------------------------------------------------------- */
/* The policy */

static memsim_size_t buddy_round(void *state, memsim_size_t size)
{
    Buddy *a = state;
    return bsize(a, order_for(a, size));
}

static MemsimAllocResult buddy_malloc(void *state, memsim_size_t size, uint32_t stream,
                                      memsim_addr_t *addr)
{
    Buddy *a = state;
    int k = order_for(a, size);
    if (k + a->min_shift >= 62) {
        a->st.n_ooms++;
        memsim_device_emit(a->dev, MEMSIM_AEV_OOM, 0, size, stream);
        return MEMSIM_ALLOC_OOM;
    }
    uint64_t usable = a->list_bits & ~((1ull << k) - 1);
    if (!usable) {
        if (!grow(a, k, stream))
            return kit_oom(a->dev, &a->st, bsize(a, k), stream);
        usable = a->list_bits & ~((1ull << k) - 1);
    }
    BBlk *b = a->lists[__builtin_ctzll(usable)];
    list_remove(a, b);
    split_down(a, b, k);
    mark_used(a, b, size, stream);
    *addr = b->ptr;
    memsim_device_emit(a->dev, MEMSIM_AEV_ALLOC, b->ptr, size, stream);
    return MEMSIM_ALLOC_OK;
}

static void buddy_free(void *state, memsim_addr_t addr)
{
    Buddy *a = state;
    BBlk *b = kit_map_get(&a->blocks, addr);
    if (!b || b->state != B_USED) {
        g_critical("buddy: free of 0x%" G_GINT64_MODIFIER "x, which is not allocated", addr);
        return;
    }
    kit_stats_free(&a->st, blk_bytes(a, b), b->requested);
    b->arena->n_used--;
    memsim_device_emit(a->dev, MEMSIM_AEV_FREE_COMPLETED, addr, b->requested, b->stream);
    if (!b->pinned) {
        merge_free(a, b);
        return;
    }
    /* A recorded block: cut into the fewest aligned buddy blocks, then each merges. The
     * pieces are all cut before any merges, so that none merges with a piece still held. */
    BArena *ar = b->arena;
    memsim_addr_t p = b->ptr, end = b->ptr + b->pinned;
    b->pinned = 0;
    GPtrArray *pieces = g_ptr_array_new();
    for (BBlk *piece = b, *prev = NULL; p < end; prev = piece) {
        int root = root_at(a, ar->k.size, p - ar->k.base);
        int o = largest_at(a, ar->k.base, p, end, root);
        if (prev)
            piece = new_blk(a, ar, p, o, root, prev);
        piece->state = B_USED; /* until its turn to merge */
        piece->order = (uint8_t)o;
        piece->root = (uint8_t)root;
        g_ptr_array_add(pieces, piece);
        p += bsize(a, o);
    }
    for (guint i = 0; i < pieces->len; i++)
        merge_free(a, pieces->pdata[i]);
    g_ptr_array_free(pieces, TRUE);
}

static void buddy_empty_cache(void *state)
{
    release_free_arenas(state);
}

static MemsimAllocStats buddy_stats(void *state)
{
    return ((Buddy *)state)->st;
}

static void buddy_reset_peaks(void *state)
{
    kit_reset_peaks(&((Buddy *)state)->st);
}

static MemsimAllocShape buddy_shape(void *state)
{
    Buddy *a = state;
    MemsimAllocShape sh = {0};
    sh.n_segments = a->arenas.n;
    for (int o = 0; o < MAX_ORDERS; o++)
        for (BBlk *b = a->lists[o]; b; b = b->lnext)
            kit_shape_add_free(&sh, bsize(a, o));
    return sh;
}

static void buddy_foreach_block(void *state, MemsimBlockFunc fn, void *user)
{
    Buddy *a = state;
    for (guint i = 0; i < a->arenas.n; i++) {
        BArena *ar = (BArena *)a->arenas.v[i];
        for (BBlk *b = ar->first; b; b = b->anext) {
            gboolean used = b->state == B_USED;
            MemsimBlockInfo info = {.segment = ar->k.base,
                                    .segment_size = ar->k.size,
                                    .stream = 0,
                                    .segment_flags = 0,
                                    .addr = b->ptr,
                                    .size = blk_bytes(a, b),
                                    .requested = used ? b->requested : 0,
                                    .state = used ? MEMSIM_BLOCK_ALLOCATED : MEMSIM_BLOCK_FREE};
            fn(user, &info);
        }
    }
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "buddy: " __VA_ARGS__);           \
        return FALSE;                                                                              \
    } while (0)

static gboolean buddy_check(void *state, GError **error)
{
    Buddy *a = state;
    int64_t allocated = 0, requested = 0, reserved = 0, split = 0, n_alloc = 0;
    uint64_t n_blocks = 0, n_free = 0;
    for (guint i = 0; i < a->arenas.n; i++) {
        BArena *ar = (BArena *)a->arenas.v[i];
        memsim_addr_t base = ar->k.base, end = base + ar->k.size;
        if (i && a->arenas.v[i - 1]->base + a->arenas.v[i - 1]->size > base)
            FAIL("arenas 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER "x overlap",
                 a->arenas.v[i - 1]->base, base);
        if (ar->k.size % a->min_block)
            FAIL("arena 0x%" G_GINT64_MODIFIER "x is not a whole number of blocks", base);
        reserved += (int64_t)ar->k.size;
        uint64_t used = 0;
        /* Blocks tile the arena: walk it in address order, root by root (the binary digits
         * of its size, largest first). */
        memsim_size_t units = ar->k.size >> a->min_shift;
        int root = 64;
        memsim_addr_t root_end = base, p = base;
        BBlk *prev = NULL;
        for (BBlk *b = ar->first; b; prev = b, b = b->anext) {
            if (p >= end)
                FAIL("arena 0x%" G_GINT64_MODIFIER "x: blocks beyond its end", base);
            while (p >= root_end) {
                do
                    root--;
                while (root >= 0 && !(units >> root & 1));
                root_end += bsize(a, root);
            }
            memsim_size_t size = blk_bytes(a, b);
            n_blocks++;
            if (b->arena != ar || b->ptr != p || b->aprev != prev)
                FAIL("arena 0x%" G_GINT64_MODIFIER "x: block 0x%" G_GINT64_MODIFIER "x where "
                     "0x%" G_GINT64_MODIFIER "x was expected (blocks must tile their arena)",
                     base, b->ptr, p);
            if (b->pinned ? (b->state != B_USED || (p - base) % a->min_block ||
                             size % a->min_block || p + size > end)
                          : (((p - base) & (size - 1)) || b->order > b->root || b->root != root ||
                             p + size > root_end))
                FAIL("block 0x%" G_GINT64_MODIFIER "x of order %d is not an aligned part of "
                     "root order %d",
                     p, b->order, b->root);
            if (b->state == B_FREE) {
                n_free++;
                if (b->order < b->root) {
                    split += (int64_t)size;
                    /* A whole buddy is the neighbour on the side its offset bit says. */
                    BBlk *q = ((p - base) & size) ? b->aprev : b->anext;
                    if (q && q->state == B_FREE && q->order == b->order && !q->pinned)
                        FAIL("free buddies 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER
                             "x were not merged",
                             p, q->ptr);
                }
            } else {
                if (kit_map_get(&a->blocks, p) != b)
                    FAIL("block 0x%" G_GINT64_MODIFIER "x in use is not in the address map", p);
                used++;
                allocated += (int64_t)size;
                if (b->state != B_USED)
                    FAIL("block 0x%" G_GINT64_MODIFIER "x in unknown state %d", p, b->state);
                n_alloc++;
                requested += (int64_t)b->requested;
                if (size < b->requested)
                    FAIL("block 0x%" G_GINT64_MODIFIER "x smaller than its request", p);
            }
            p += size;
        }
        if (p != end)
            FAIL("arena 0x%" G_GINT64_MODIFIER "x: blocks cover %" G_GUINT64_FORMAT
                 " of %" G_GUINT64_FORMAT " bytes",
                 base, p - base, ar->k.size);
        if (used != ar->n_used)
            FAIL("arena 0x%" G_GINT64_MODIFIER "x counts %" G_GUINT64_FORMAT " blocks in use, "
                 "holds %" G_GUINT64_FORMAT,
                 base, ar->n_used, used);
    }
    uint64_t listed = 0;
    for (int o = 0; o < MAX_ORDERS; o++) {
        if (((a->list_bits >> o) & 1) != (a->lists[o] != NULL))
            FAIL("order bitmap disagrees with the list of order %d", o);
        BBlk *prev = NULL;
        for (BBlk *b = a->lists[o]; b; prev = b, b = b->lnext) {
            listed++;
            if (b->lprev != prev || b->order != o || b->state != B_FREE ||
                kit_map_get(&a->blocks, b->ptr) != b)
                FAIL("free list of order %d holds a wrong block 0x%" G_GINT64_MODIFIER "x", o,
                     b->ptr);
        }
    }
    if (listed != n_free || listed != a->n_free)
        FAIL("free lists hold %" G_GUINT64_FORMAT " blocks (counted %" G_GUINT64_FORMAT
             "), arenas have %" G_GUINT64_FORMAT " free",
             listed, a->n_free, n_free);
    if (a->blocks.n != n_blocks)
        FAIL("address map holds %" G_GUINT64_FORMAT " blocks, arenas %" G_GUINT64_FORMAT,
             a->blocks.n, n_blocks);
    KitRecount r = {allocated, requested, reserved, (int64_t)a->arenas.n, n_alloc, split};
    return kit_check_recount("buddy", &a->st, &r, error);
}

/* ---------------------------------------------------------------------------------------- */
/* Seeding */

static gboolean buddy_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                   uint32_t stream, uint32_t flags, GError **error)
{
    Buddy *a = state;
    if (!kit_segs_can_seed(&a->arenas, "buddy", addr, size, a->min_block, error))
        return FALSE;
    add_arena(a, addr, size);
    kit_reset_peaks(&a->st);
    return TRUE;
}

/* The free block that holds address p of arena ar, or NULL (p is in a block in use). */
static BBlk *free_block_at(Buddy *a, BArena *ar, memsim_addr_t p)
{
    memsim_size_t off = p - ar->k.base;
    for (int o = 0; o < MAX_ORDERS && bsize(a, o) <= ar->k.size; o++) {
        BBlk *b = kit_map_get(&a->blocks, ar->k.base + off / bsize(a, o) * bsize(a, o));
        if (b && b->state == B_FREE && b->order == o)
            return b;
    }
    return NULL;
}

static gboolean buddy_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                                 memsim_size_t requested, uint32_t stream, GError **error)
{
    Buddy *a = state;
    memsim_size_t n = kit_round_up(requested ? requested : block_size, a->min_block);
    BArena *ar = (BArena *)kit_segs_find(&a->arenas, addr);
    if (!n || !ar || addr % a->min_block || addr + n > ar->k.base + ar->k.size)
        goto bad;
    /* Check that the whole range is free first, so that a failure changes nothing. */
    for (memsim_addr_t p = addr; p < addr + n;) {
        BBlk *f = free_block_at(a, ar, p);
        if (!f)
            goto bad;
        p = f->ptr + bsize(a, f->order);
    }
    /* Carve the range out of the free blocks, as the fewest aligned blocks, and fold those
     * into one block in use (one object instead of many: the recording has it as one). */
    BBlk *head = NULL;
    for (memsim_addr_t p = addr; p < addr + n;) {
        BBlk *f = free_block_at(a, ar, p);
        int o = largest_at(a, ar->k.base, p, addr + n, f->order);
        list_remove(a, f);
        while (f->ptr < p || f->order > o) {
            /* Halve f, keep the half that holds p, free the other. */
            f->order--;
            memsim_size_t half = bsize(a, f->order);
            BBlk *upper = new_blk(a, ar, f->ptr + half, f->order, f->root, f);
            if (p >= upper->ptr) {
                list_push(a, f);
                f = upper;
            } else {
                list_push(a, upper);
            }
        }
        p += bsize(a, f->order);
        if (!head) {
            head = f;
            head->state = B_USED;
        } else {
            drop_blk(a, f);
        }
    }
    head->pinned = n;
    mark_used(a, head, requested, stream);
    kit_reset_peaks(&a->st);
    return TRUE;
bad:
    FAIL("seeded block 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT " bytes) does not lie "
         "in free space of a seeded segment",
         addr, n);
}

/* ---------------------------------------------------------------------------------------- */
/* Settings and life cycle */

typedef struct {
    memsim_size_t segment, min_block;
} BuddyConfig;

static const char buddy_settings_help[] =
    "segment_mb=N   arenas of N MiB, a power of two (default 64); a larger request gets an "
    "arena of its own rounded up to a power of two\n"
    "min_block=N    the smallest block in bytes, a power of two from 256 to 1048576 (default "
    "512)";

static gboolean buddy_setting(void *cfgp, const char *key, const char *value, GError **error)
{
    BuddyConfig *cfg = cfgp;
    uint64_t v;
    if (strcmp(key, "segment_mb") == 0) {
        if (!num_parse_u64(value, &v) || !num_is_pow2(v) || v > ((uint64_t)1 << 30))
            FAIL("segment_mb must be a power of two number of MiB up to 2^30 (got '%s')", value);
        cfg->segment = v * KIT_MIB;
    } else if (strcmp(key, "min_block") == 0) {
        if (!num_parse_u64(value, &v) || !num_is_pow2(v) || v < 256 || v > KIT_MIB)
            FAIL("min_block must be a power of two from 256 to 1048576 bytes (got '%s')", value);
        cfg->min_block = v;
    } else {
        FAIL("unknown setting '%s' (accepted: segment_mb, min_block)", key);
    }
    return TRUE;
}

static void *buddy_create(const char *settings, MemsimDevice *dev, GError **error)
{
    BuddyConfig cfg = {64 * KIT_MIB, 512};
    if (!kit_parse_settings("buddy", settings, "segment_mb, min_block", buddy_setting, &cfg, error))
        return NULL;
    Buddy *a = g_new0(Buddy, 1);
    a->dev = dev;
    a->segment_size = cfg.segment;
    a->min_block = cfg.min_block;
    a->min_shift = __builtin_ctzll(cfg.min_block);
    kit_map_init(&a->blocks, 4);
    kit_slab_init(&a->blk_slab, sizeof(BBlk));
    kit_slab_init(&a->arena_slab, sizeof(BArena));
    return a;
}

static void buddy_destroy(void *state)
{
    Buddy *a = state;
    if (!a)
        return;
    kit_map_clear(&a->blocks);
    kit_slab_clear(&a->blk_slab);
    kit_slab_clear(&a->arena_slab);
    kit_segs_clear(&a->arenas);
    g_free(a);
}

static const MemsimAllocOps buddy_ops = {
    .name = "buddy",
    .description = "binary buddy system: power-of-two blocks from 512 B in 64 MiB arenas",
    .settings_help = buddy_settings_help,
    .create = buddy_create,
    .destroy = buddy_destroy,
    .malloc = buddy_malloc,
    .free = buddy_free,
    .empty_cache = buddy_empty_cache,
    .stats = buddy_stats,
    .shape = buddy_shape,
    .reset_peaks = buddy_reset_peaks,
    .check = buddy_check,
    .seed_segment = buddy_seed_segment,
    .seed_block = buddy_seed_block,
    .round_size = buddy_round,
    .foreach_block = buddy_foreach_block,
};

const MemsimAllocOps *memsim_alloc_buddy_ops(void)
{
    return &buddy_ops;
}
