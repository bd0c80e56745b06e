/* Internal: the arena that bfc, best-fit, first-fit and stitch are built on (sim/alloc/arena.c):
 * blocks that tile address-ordered segments, each block free, in use or unmapped, linked to
 * its address neighbours; blocks in use found by address; the statistics, the shape, the block
 * listing, the invariant walk, seeding from a recording and the free path, once. What differs
 * between the policies is their free set (how free blocks are filed and found), given by a
 * table of functions (ArenaOps), and their malloc (bfc's regions, stitch's stitching); best-fit
 * and first-fit share a malloc too (arena_fit_*: segments of segment_mb taken as needed).
 *
 * A policy's state starts with an Arena, its blocks with an ArenaBlock and its segments with
 * an ArenaSeg, so that a pointer to one is a pointer to the other; it may add fields after
 * them (ArenaOps gives the sizes). The calls in order:
 *
 *     arena_init(&p->a, &my_arena_ops, dev);             in create
 *     s = arena_seg_add(&p->a, base, size, size, 0);      a segment: one free block
 *     my_free_insert(&p->a, s->first);                    filed in the free set
 *     my_free_remove(&p->a, b);                           b, found by the policy, leaves it
 *     arena_split(&p->a, b, n);                           b keeps n bytes, the rest is filed
 *     arena_use(&p->a, b, size, stream);                  handed out
 *     arena_free(p, addr);                                back, merged with free neighbours
 *     arena_check(p, error);                              every invariant
 *     arena_destroy(p);
 *
 * The shared MemsimAllocOps entries (arena_free, arena_stats, arena_shape, ...) take the
 * policy's state, whose first member is the Arena.
 */
#ifndef MEMSIM_SIM_ALLOC_ARENA_H
#define MEMSIM_SIM_ALLOC_ARENA_H

#include <memsim/alloc.h>

#include "sim/alloc/kit.h"

typedef struct Arena Arena;
typedef struct ArenaBlock ArenaBlock;
typedef struct ArenaSeg ArenaSeg;

typedef enum {
    ARENA_FREE = 0, /* in the policy's free set */
    ARENA_USED,     /* handed out, in the address map */
    ARENA_UNMAPPED, /* no memory behind it (stitch's virtual ranges) */
} ArenaBlockState;

struct ArenaBlock {
    KitNode node; /* the free set's links while free */
    memsim_addr_t ptr;
    memsim_size_t size;
    memsim_size_t requested;
    ArenaBlock *prev, *next; /* address neighbours in the segment */
    ArenaSeg *seg;
    uint32_t stream; /* in use: the request's, reported with its free */
    uint8_t state;   /* ArenaBlockState */
};

struct ArenaSeg {
    KitSeg k;
    ArenaBlock *first; /* blocks in address order */
    uint64_t n_used;   /* blocks in use */
    uint32_t flags;    /* MemsimSegmentFlags, for the block listing */
};

typedef struct {
    const char *name;   /* the policy's, for messages */
    memsim_size_t unit; /* blocks tile their segments in multiples of it; seeded segments
                         * and blocks are aligned to it */
    gsize block_size;   /* sizeof the policy's block (an ArenaBlock first) */
    gsize seg_size;     /* sizeof the policy's segment (an ArenaSeg first) */
    uint32_t seed;      /* of the treap priorities drawn from Arena.rng */
    /* The free set. free_insert files a free block that is out of the set, free_remove takes
     * one out; both count it in inactive_split when it shares its segment
     * (arena_split_counted). free_holds: whether the set holds free block b; free_verify:
     * whether the set is well formed and holds n_free blocks (FALSE with an error). */
    void (*free_insert)(Arena *a, ArenaBlock *b);
    void (*free_remove)(Arena *a, ArenaBlock *b);
    gboolean (*free_holds)(Arena *a, ArenaBlock *b);
    gboolean (*free_verify)(Arena *a, int64_t n_free, GError **error);
    /* (optional) A block just freed (free, out of the set) joins the set. Default: merged with
     * its free neighbours (the next, then the previous), the union filed. */
    void (*release)(Arena *a, ArenaBlock *b);
    /* (arena_fit_malloc only) The policy's choice among the free blocks of at least n bytes,
     * or NULL; and (optional) the block of n bytes at the low end of that choice, out of the
     * set, the rest staying free, in the set. Default for carve: the choice leaves the set
     * and what it has beyond n bytes comes back as a block of its own (arena_split). */
    ArenaBlock *(*find_fit)(Arena *a, memsim_size_t n);
    ArenaBlock *(*carve)(Arena *a, ArenaBlock *b, memsim_size_t n);
} ArenaOps;

struct Arena {
    const ArenaOps *ops;
    MemsimDevice *dev;
    KitAddrMap live; /* blocks in use by address */
    KitSlab blocks, seg_slab;
    KitSegs segs;
    uint32_t rng;
    memsim_size_t segment_size; /* arena_fit_malloc's growth step (segment_mb) */
    MemsimAllocStats st;
};

static inline gboolean arena_is_split(const ArenaBlock *b)
{
    return b->prev || b->next;
}

/* The inactive_split count of a free block entering (+1) or leaving (-1) the free set. */
static inline void arena_split_counted(Arena *a, const ArenaBlock *b, int sign)
{
    if (!arena_is_split(b))
        return;
    if (sign > 0)
        memsim_stat_add(&a->st.inactive_split, (int64_t)b->size);
    else
        memsim_stat_sub(&a->st.inactive_split, (int64_t)b->size);
}

/* The (size, address) order of free blocks and a block's size, for KitBins and trees: best
 * fit takes the first block of at least a size. */
static inline gboolean arena_by_size(const KitNode *a, const KitNode *b)
{
    const ArenaBlock *x = (const ArenaBlock *)a, *y = (const ArenaBlock *)b;
    if (x->size != y->size)
        return x->size < y->size;
    return x->ptr < y->ptr;
}

static inline memsim_size_t arena_size_of(const KitNode *n)
{
    return ((const ArenaBlock *)n)->size;
}

/* A new block (free, unlinked) of segment s; the caller links it. */
static inline ArenaBlock *arena_block_new(Arena *a, ArenaSeg *s, memsim_addr_t ptr,
                                          memsim_size_t size)
{
    ArenaBlock *b = kit_slab_get(&a->blocks);
    b->ptr = ptr;
    b->size = size;
    b->seg = s;
    return b;
}

/* b's next neighbour is folded into b (both out of the set, or both unmapped). */
static inline void arena_absorb_next(Arena *a, ArenaBlock *b)
{
    ArenaBlock *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    kit_slab_put(&a->blocks, n);
}

/* b (free, out of the set) keeps n bytes; the rest becomes a free block after it, filed. */
static KIT_HOT void arena_split(Arena *a, ArenaBlock *b, memsim_size_t n)
{
    ArenaBlock *rest = arena_block_new(a, b->seg, b->ptr + n, b->size - n);
    b->size = n;
    rest->prev = b;
    rest->next = b->next;
    if (b->next)
        b->next->prev = rest;
    b->next = rest;
    a->ops->free_insert(a, rest);
}

/* b (out of the set) is handed out for a request of `requested` bytes: in the address map
 * and the statistics. The ALLOC event is the caller's. */
static KIT_HOT void arena_use(Arena *a, ArenaBlock *b, memsim_size_t requested, uint32_t stream)
{
    b->state = ARENA_USED;
    b->requested = requested;
    b->stream = stream;
    b->seg->n_used++;
    kit_map_put(&a->live, b->ptr, b);
    kit_stats_alloc(&a->st, b->size, requested);
}

/* Life cycle. arena_destroy is MemsimAllocOps.destroy for a state that holds nothing else to
 * free (accepts NULL). */
void arena_init(Arena *a, const ArenaOps *ops, MemsimDevice *dev);
void arena_destroy(void *state);

/* A new segment with flags (MemsimSegmentFlags) covered by one free block, s->first, out of
 * the free set; `fresh` of its bytes count as newly reserved. */
ArenaSeg *arena_seg_add(Arena *a, memsim_addr_t base, memsim_size_t size, memsim_size_t fresh,
                        uint32_t flags);
/* Segment s, one block (free or unmapped, out of the free set), goes: out of the segments
 * statistic, reported (SEG_FREE on stream). Its reserved bytes are the caller's. */
void arena_seg_drop(Arena *a, ArenaSeg *s, uint32_t stream);
/* Segment s, wholly free, goes back to the device (out of the free set, reserved and
 * segments, n_device_free, SEG_FREE on stream). */
void arena_seg_release(Arena *a, ArenaSeg *s, uint32_t stream);
/* Every segment with no block in use goes back to the device, highest address first. */
void arena_release_free(Arena *a, uint32_t stream);

/* MemsimAllocOps entries. arena_free: the block goes back (FREE_COMPLETED) and joins the free
 * set (ArenaOps.release). */
void arena_free(void *state, memsim_addr_t addr);
MemsimAllocStats arena_stats(void *state);
/* The statistics in the state: the same pointer for the instance's life (stats_live_fixed),
 * so a replay reads them after each event without a copy. */
const MemsimAllocStats *arena_stats_live(void *state);
void arena_reset_peaks(void *state);
MemsimAllocShape arena_shape(void *state);
void arena_foreach_block(void *state, MemsimBlockFunc fn, void *user);

/* The invariants of the blocks, segments, address map and statistics (reserved = bytes not
 * unmapped), and the free set's (free_holds, free_verify). FALSE with a message naming the
 * first broken one. */
gboolean arena_check(void *state, GError **error);

/* Seeding. arena_seed_segment: a recorded segment (aligned, not overlapping), or NULL with an
 * error; its block is out of the free set. arena_seed_find: the free block of a seeded
 * segment that holds [addr, addr + n) with addr aligned, or NULL. arena_seed_block: that
 * range of b becomes a block in use, the rest stays free; peaks reset. */
ArenaSeg *arena_seed_segment(Arena *a, memsim_addr_t addr, memsim_size_t size, uint32_t flags,
                             GError **error);
ArenaBlock *arena_seed_find(Arena *a, memsim_addr_t addr, memsim_size_t n);
void arena_seed_block(Arena *a, ArenaBlock *b, memsim_addr_t addr, memsim_size_t n,
                      memsim_size_t requested, uint32_t stream);

/* The policy that best-fit and first-fit share: requests rounded up to 512 bytes (the unit),
 * served by the free set's find_fit and carve; the arena grows by segments of segment_mb
 * (default 64 MiB), a larger request getting a segment of its own rounded up to 2 MiB; wholly
 * free segments stay cached until empty_cache, or until the device is short for a new segment
 * (then the new segment also shrinks to the request if that is what still fits). Recorded
 * segments become segments of the arena; a recorded live block keeps its address and its
 * request rounded to 512 bytes. arena_fit_create: a new zeroed state of state_size bytes (an
 * Arena first) with its settings, freed by arena_destroy; or NULL with an error. */
extern const char arena_fit_settings_help[];
void *arena_fit_create(gsize state_size, const ArenaOps *ops, const char *settings,
                       MemsimDevice *dev, GError **error);
memsim_size_t arena_fit_round(void *state, memsim_size_t size);
MemsimAllocResult arena_fit_malloc(void *state, memsim_size_t size, uint32_t stream,
                                   memsim_addr_t *addr);
void arena_fit_empty_cache(void *state);
gboolean arena_fit_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                uint32_t stream, uint32_t flags, GError **error);
gboolean arena_fit_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                              memsim_size_t requested, uint32_t stream, GError **error);

#endif
