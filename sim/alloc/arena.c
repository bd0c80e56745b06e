/* The arena that bfc, best-fit, first-fit and stitch are built on, and the malloc that
 * best-fit and first-fit share (the interface and its use: sim/alloc/arena.h).
 *
 * Data structures and cost: blocks and segments come from slabs (no malloc per event); the
 * blocks of a segment form a doubly linked list in address order, so splitting and merging
 * are O(1) plus the free set's work; blocks in use are found by address in an open-addressing
 * map, O(1); segments are kept sorted by address (binary search) for seeding and checking.
 * The free set is the policy's (ArenaOps); the malloc and free paths call it through the
 * table. shape(), foreach_block() and check() walk every block.
 *
 * The functions on the malloc and free paths are inlined always (a call costs more than their
 * bodies): merge_free into arena_free here, arena_split and arena_use (arena.h) into each
 * policy's malloc.
 */
#include "sim/alloc/arena.h"

#include <stdarg.h>
#include <string.h>

#define SEG_ROUND (2 * KIT_MIB)

/* Sets a BAD_INPUT error "<policy>: <message>" and returns FALSE. */
static gboolean fail(const Arena *a, GError **error, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static gboolean fail(const Arena *a, GError **error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s", a->ops->name, msg);
    return FALSE;
}

/* ---------------------------------------------------------------------------------------- */
/* Life cycle */

void arena_init(Arena *a, const ArenaOps *ops, MemsimDevice *dev)
{
    a->ops = ops;
    a->dev = dev;
    kit_map_init(&a->live, 4);
    kit_slab_init(&a->blocks, ops->block_size);
    kit_slab_init(&a->seg_slab, ops->seg_size);
    a->rng = ops->seed;
}

void arena_destroy(void *state)
{
    Arena *a = state;
    if (!a)
        return;
    kit_map_clear(&a->live);
    kit_slab_clear(&a->blocks);
    kit_slab_clear(&a->seg_slab);
    kit_segs_clear(&a->segs);
    g_free(a);
}

/* ---------------------------------------------------------------------------------------- */
/* Blocks and segments */

ArenaSeg *arena_seg_add(Arena *a, memsim_addr_t base, memsim_size_t size, memsim_size_t fresh,
                        uint32_t flags)
{
    ArenaSeg *s = kit_slab_get(&a->seg_slab);
    s->k.base = base;
    s->k.size = size;
    s->flags = flags;
    kit_segs_insert(&a->segs, &s->k);
    s->first = arena_block_new(a, s, base, size);
    kit_stats_segment_add(&a->st, fresh);
    return s;
}

void arena_seg_drop(Arena *a, ArenaSeg *s, uint32_t stream)
{
    g_assert(s->first->next == NULL && s->n_used == 0);
    kit_slab_put(&a->blocks, s->first);
    kit_segs_remove(&a->segs, &s->k);
    memsim_stat_sub(&a->st.segments, 1);
    memsim_device_emit(a->dev, MEMSIM_AEV_SEG_FREE, s->k.base, s->k.size, stream);
    kit_slab_put(&a->seg_slab, s);
}

void arena_seg_release(Arena *a, ArenaSeg *s, uint32_t stream)
{
    g_assert(s->first->next == NULL && s->first->state == ARENA_FREE);
    a->ops->free_remove(a, s->first);
    memsim_stat_sub(&a->st.reserved, (int64_t)s->k.size);
    a->st.n_device_free++;
    arena_seg_drop(a, s, stream);
}

void arena_release_free(Arena *a, uint32_t stream)
{
    for (guint i = a->segs.n; i-- > 0;) {
        ArenaSeg *s = (ArenaSeg *)a->segs.v[i];
        if (!s->n_used)
            arena_seg_release(a, s, stream);
    }
}

static KIT_HOT void merge_free(Arena *a, ArenaBlock *b)
{
    ArenaBlock *n = b->next;
    if (n && n->state == ARENA_FREE) {
        a->ops->free_remove(a, n);
        arena_absorb_next(a, b);
    }
    ArenaBlock *p = b->prev;
    if (p && p->state == ARENA_FREE) {
        a->ops->free_remove(a, p);
        arena_absorb_next(a, p);
        b = p;
    }
    a->ops->free_insert(a, b);
}

/* ---------------------------------------------------------------------------------------- */
/* MemsimAllocOps entries */

void arena_free(void *state, memsim_addr_t addr)
{
    Arena *a = state;
    ArenaBlock *b = kit_map_take(&a->live, addr);
    if (!b) {
        g_critical("%s: free of 0x%" G_GINT64_MODIFIER "x, which is not allocated", a->ops->name,
                   addr);
        return;
    }
    b->state = ARENA_FREE;
    b->seg->n_used--;
    kit_stats_free(&a->st, b->size, b->requested);
    memsim_device_emit(a->dev, MEMSIM_AEV_FREE_COMPLETED, addr, b->requested, b->stream);
    if (a->ops->release)
        a->ops->release(a, b);
    else
        merge_free(a, b);
}

MemsimAllocStats arena_stats(void *state)
{
    return ((Arena *)state)->st;
}

const MemsimAllocStats *arena_stats_live(void *state)
{
    return &((Arena *)state)->st;
}

void arena_reset_peaks(void *state)
{
    kit_reset_peaks(&((Arena *)state)->st);
}

MemsimAllocShape arena_shape(void *state)
{
    Arena *a = state;
    MemsimAllocShape sh = {0};
    sh.n_segments = a->segs.n;
    for (guint i = 0; i < a->segs.n; i++)
        for (ArenaBlock *b = ((ArenaSeg *)a->segs.v[i])->first; b; b = b->next)
            if (b->state == ARENA_FREE)
                kit_shape_add_free(&sh, b->size);
    return sh;
}

void arena_foreach_block(void *state, MemsimBlockFunc fn, void *user)
{
    static const uint32_t states[] = {MEMSIM_BLOCK_FREE, MEMSIM_BLOCK_ALLOCATED,
                                      MEMSIM_BLOCK_UNMAPPED};
    Arena *a = state;
    for (guint i = 0; i < a->segs.n; i++) {
        ArenaSeg *s = (ArenaSeg *)a->segs.v[i];
        for (ArenaBlock *b = s->first; b; b = b->next) {
            MemsimBlockInfo info = {.segment = s->k.base,
                                    .segment_size = s->k.size,
                                    .stream = 0,
                                    .segment_flags = s->flags,
                                    .addr = b->ptr,
                                    .size = b->size,
                                    .requested = b->state == ARENA_USED ? b->requested : 0,
                                    .state = states[b->state]};
            fn(user, &info);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Invariants */

gboolean arena_check(void *state, GError **error)
{
    Arena *a = state;
    memsim_size_t unit = a->ops->unit;
    KitRecount r = {0};
    int64_t n_free = 0;
    for (guint i = 0; i < a->segs.n; i++) {
        ArenaSeg *s = (ArenaSeg *)a->segs.v[i];
        if (i && a->segs.v[i - 1]->base + a->segs.v[i - 1]->size > s->k.base)
            return fail(a, error,
                        "segments 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER "x overlap",
                        a->segs.v[i - 1]->base, s->k.base);
        memsim_addr_t expect = s->k.base;
        uint64_t used = 0;
        ArenaBlock *prev = NULL;
        for (ArenaBlock *b = s->first; b; prev = b, b = b->next) {
            if (b->prev != prev || b->seg != s)
                return fail(a, error, "block 0x%" G_GINT64_MODIFIER "x: broken links", b->ptr);
            if (b->ptr != expect || b->size == 0 || b->size % unit)
                return fail(a, error,
                            "segment 0x%" G_GINT64_MODIFIER "x: block 0x%" G_GINT64_MODIFIER
                            "x of %" G_GUINT64_FORMAT " bytes where 0x%" G_GINT64_MODIFIER
                            "x was expected (blocks must tile their segment in "
                            "%" G_GUINT64_FORMAT "-byte units)",
                            s->k.base, b->ptr, b->size, expect, unit);
            expect += b->size;
            if (prev && prev->state == b->state && b->state != ARENA_USED)
                return fail(a, error,
                            "neighbours 0x%" G_GINT64_MODIFIER "x and 0x%" G_GINT64_MODIFIER
                            "x, both %s, were not merged",
                            prev->ptr, b->ptr, b->state == ARENA_FREE ? "free" : "unmapped");
            switch (b->state) {
            case ARENA_USED:
                used++;
                r.allocated += (int64_t)b->size;
                r.requested += (int64_t)b->requested;
                r.reserved += (int64_t)b->size;
                if (kit_map_get(&a->live, b->ptr) != b)
                    return fail(a, error,
                                "block 0x%" G_GINT64_MODIFIER "x in use but not in the address "
                                "map",
                                b->ptr);
                /* Sizes are whole units: the same as its rounded request being larger. */
                if (b->requested > b->size)
                    return fail(a, error,
                                "block 0x%" G_GINT64_MODIFIER "x smaller than its request", b->ptr);
                break;
            case ARENA_FREE:
                n_free++;
                r.reserved += (int64_t)b->size;
                if (!a->ops->free_holds(a, b))
                    return fail(a, error,
                                "free block 0x%" G_GINT64_MODIFIER "x is not in the free set",
                                b->ptr);
                if (arena_is_split(b))
                    r.inactive_split += (int64_t)b->size;
                break;
            case ARENA_UNMAPPED:
                break;
            default:
                return fail(a, error, "block 0x%" G_GINT64_MODIFIER "x in unknown state %d", b->ptr,
                            b->state);
            }
        }
        if (expect != s->k.base + s->k.size)
            return fail(a, error,
                        "segment 0x%" G_GINT64_MODIFIER "x: blocks cover %" G_GUINT64_FORMAT
                        " of %" G_GUINT64_FORMAT " bytes",
                        s->k.base, expect - s->k.base, s->k.size);
        if (used != s->n_used)
            return fail(a, error,
                        "segment 0x%" G_GINT64_MODIFIER "x counts %" G_GUINT64_FORMAT
                        " blocks in use, holds %" G_GUINT64_FORMAT,
                        s->k.base, s->n_used, used);
        r.allocations += (int64_t)used;
    }
    if (!a->ops->free_verify(a, n_free, error))
        return FALSE;
    if ((int64_t)a->live.n != r.allocations)
        return fail(a, error,
                    "address map holds %" G_GUINT64_FORMAT " blocks, segments %" G_GINT64_FORMAT,
                    a->live.n, r.allocations);
    r.segments = (int64_t)a->segs.n;
    return kit_check_recount(a->ops->name, &a->st, &r, error);
}

/* ---------------------------------------------------------------------------------------- */
/* Seeding */

ArenaSeg *arena_seed_segment(Arena *a, memsim_addr_t addr, memsim_size_t size, uint32_t flags,
                             GError **error)
{
    if (!kit_segs_can_seed(&a->segs, a->ops->name, addr, size, a->ops->unit, error))
        return NULL;
    return arena_seg_add(a, addr, size, size, flags);
}

ArenaBlock *arena_seed_find(Arena *a, memsim_addr_t addr, memsim_size_t n)
{
    ArenaSeg *s = (ArenaSeg *)kit_segs_find(&a->segs, addr);
    ArenaBlock *b = s ? s->first : NULL;
    while (b && !(b->ptr <= addr && addr - b->ptr < b->size))
        b = b->next;
    if (!n || !b || b->state != ARENA_FREE || addr % a->ops->unit || addr + n > b->ptr + b->size)
        return NULL;
    return b;
}

void arena_seed_block(Arena *a, ArenaBlock *b, memsim_addr_t addr, memsim_size_t n,
                      memsim_size_t requested, uint32_t stream)
{
    a->ops->free_remove(a, b);
    if (b->ptr < addr) {
        ArenaBlock *front = b;
        arena_split(a, front, addr - front->ptr);
        b = front->next;
        a->ops->free_remove(a, b);
        a->ops->free_insert(a, front);
    }
    if (b->size > n)
        arena_split(a, b, n);
    arena_use(a, b, requested, stream);
    kit_reset_peaks(&a->st);
}

/* ---------------------------------------------------------------------------------------- */
/* The policy of best-fit and first-fit */

static inline memsim_size_t round_request(const Arena *a, memsim_size_t n)
{
    memsim_size_t unit = a->ops->unit;
    return n <= unit ? unit : kit_round_up(n, unit);
}

memsim_size_t arena_fit_round(void *state, memsim_size_t size)
{
    return round_request(state, size);
}

/* A new segment able to hold n bytes, or FALSE when the device cannot provide one. */
static gboolean grow(Arena *a, memsim_size_t n, uint32_t stream)
{
    memsim_size_t want = MAX(a->segment_size, kit_round_up(n, SEG_ROUND));
    if (!kit_device_has(a->dev, &a->st, want)) {
        arena_release_free(a, 0);
        if (!kit_device_has(a->dev, &a->st, want))
            want = kit_round_up(n, SEG_ROUND);
        if (!kit_device_has(a->dev, &a->st, want))
            return FALSE;
    }
    memsim_addr_t base = kit_segment_addr(a->dev, &a->segs, want, stream);
    ArenaSeg *s = arena_seg_add(a, base, want, want, 0);
    a->ops->free_insert(a, s->first);
    a->st.n_device_alloc++;
    memsim_device_emit(a->dev, MEMSIM_AEV_SEG_ALLOC, base, want, stream);
    return TRUE;
}

MemsimAllocResult arena_fit_malloc(void *state, memsim_size_t size, uint32_t stream,
                                   memsim_addr_t *addr)
{
    Arena *a = state;
    memsim_size_t n = round_request(a, size);
    ArenaBlock *b = a->ops->find_fit(a, n);
    if (!b) {
        if (!grow(a, n, stream))
            return kit_oom(a->dev, &a->st, n, stream);
        b = a->ops->find_fit(a, n);
    }
    if (a->ops->carve) {
        b = a->ops->carve(a, b, n);
    } else {
        a->ops->free_remove(a, b);
        if (b->size > n)
            arena_split(a, b, n);
    }
    arena_use(a, b, size, stream);
    *addr = b->ptr;
    memsim_device_emit(a->dev, MEMSIM_AEV_ALLOC, b->ptr, size, stream);
    return MEMSIM_ALLOC_OK;
}

void arena_fit_empty_cache(void *state)
{
    arena_release_free(state, 0);
}

gboolean arena_fit_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                uint32_t stream, uint32_t flags, GError **error)
{
    Arena *a = state;
    ArenaSeg *s = arena_seed_segment(a, addr, size, 0, error);
    if (!s)
        return FALSE;
    a->ops->free_insert(a, s->first);
    kit_reset_peaks(&a->st);
    return TRUE;
}

gboolean arena_fit_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                              memsim_size_t requested, uint32_t stream, GError **error)
{
    Arena *a = state;
    memsim_size_t n = round_request(a, requested ? requested : block_size);
    ArenaBlock *b = arena_seed_find(a, addr, n);
    if (!b)
        return fail(a, error,
                    "seeded block 0x%" G_GINT64_MODIFIER "x (%" G_GUINT64_FORMAT " bytes) does "
                    "not lie inside one free block of a seeded segment",
                    addr, n);
    arena_seed_block(a, b, addr, n, requested, stream);
    return TRUE;
}

const char arena_fit_settings_help[] =
    "segment_mb=N   the arena grows by segments of N MiB (integer >= 2; default 64); a larger "
    "request gets its own segment rounded up to 2 MiB";

typedef struct {
    const char *name;
    memsim_size_t segment_size;
} FitConfig;

static gboolean fit_setting(void *cfgp, const char *key, const char *value, GError **error)
{
    FitConfig *cfg = cfgp;
    uint64_t v;
    if (strcmp(key, "segment_mb") != 0) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: unknown setting '%s' (accepted: segment_mb)", cfg->name, key);
        return FALSE;
    }
    if (!num_parse_u64(value, &v) || v < 2 || v > ((uint64_t)1 << 30)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: segment_mb must be an integer number of MiB between 2 and 2^30 (got "
                    "'%s')",
                    cfg->name, value);
        return FALSE;
    }
    cfg->segment_size = v * KIT_MIB;
    return TRUE;
}

void *arena_fit_create(gsize state_size, const ArenaOps *ops, const char *settings,
                       MemsimDevice *dev, GError **error)
{
    FitConfig cfg = {ops->name, 64 * KIT_MIB};
    if (!kit_parse_settings(ops->name, settings, "segment_mb", fit_setting, &cfg, error))
        return NULL;
    Arena *a = g_malloc0(state_size);
    arena_init(a, ops, dev);
    a->segment_size = cfg.segment_size;
    return a;
}
