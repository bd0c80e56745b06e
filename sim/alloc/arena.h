/* Internal: the address-ordered arena that the best-fit and first-fit policies share
 * (best-fit.c, first-fit.c). The two differ only in their free set, its search and how a
 * block leaves it or comes back; everything else is here once: segments from the device and
 * back (release_free_segments, grow), splitting, statistics, shape, the block listing, the
 * invariant checker's walk over the segments, seeding from recorded segments and blocks,
 * the segment_mb setting and the life cycle.
 *
 * A policy file defines, before including this header:
 *   ARENA_NAME   the policy's name (a string literal), for messages;
 *   Blk          a block: KitNode node (first), ptr, size, requested, prev, next (address
 *                neighbours in the segment), seg, used, and whatever its free set needs;
 *   Seg          a segment: KitSeg k, Blk *first, uint64_t n_used;
 *   Fit          the instance: dev, segment_size, live, blocks, seg_slab, segs, rng, st and
 *                its free set (zero-initialised memory is an empty set);
 * and, after it, the free-set operations declared below. The functions here are static: each
 * policy file gets its own copy, typed with its own Blk and Fit, and stays self-contained at
 * link time like the users of kit.h. (They need the policy's types, which is why they are not
 * in kit.h, whose parts know nothing of a policy's objects.)
 */
#ifndef MEMSIM_SIM_ALLOC_ARENA_H
#define MEMSIM_SIM_ALLOC_ARENA_H

#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/kit.h"

#define MIN_BLOCK ((memsim_size_t)512)
#define SEG_ROUND (2 * KIT_MIB)

/* The free set, defined by the policy. */
/* Puts a free block (out of the set) into the set; counts it as inactive split if split. */
static void free_insert(Fit *f, Blk *b);
/* Takes a block out of the set, undoing free_insert's count. */
static void free_remove(Fit *f, Blk *b);
/* The policy's choice among the free blocks of at least n bytes, or NULL. */
static Blk *find_fit(Fit *f, memsim_size_t n);
/* b, found by find_fit, serves n bytes: returns the block of n bytes at b's low end, out of
 * the set (the rest of b stays free, in the set). */
static Blk *carve(Fit *f, Blk *b, memsim_size_t n);
/* A block just freed (out of the set) joins the set, merged with its free neighbours. */
static void release_blk(Fit *f, Blk *b);
/* For check(): whether the set holds free block b, and whether the set is well formed and
 * holds n_free blocks (FALSE with an error saying what is wrong). */
static gboolean free_set_holds(Fit *f, Blk *b);
static gboolean free_set_verify(Fit *f, int64_t n_free, GError **error);

static inline memsim_size_t round_req(memsim_size_t n)
{
    return n <= MIN_BLOCK ? MIN_BLOCK : kit_round_up(n, MIN_BLOCK);
}

static inline gboolean is_split(const Blk *b)
{
    return b->prev || b->next;
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

static void use_blk(Fit *f, Blk *b, memsim_size_t requested, uint32_t stream)
{
    b->used = 1;
    b->requested = requested;
    b->stream = stream;
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
    b = carve(f, b, n);
    use_blk(f, b, size, stream);
    *addr = b->ptr;
    memsim_device_emit(f->dev, MEMSIM_AEV_ALLOC, b->ptr, size, stream);
    return MEMSIM_ALLOC_OK;
}

static void fit_free(void *state, memsim_addr_t addr)
{
    Fit *f = state;
    Blk *b = kit_map_take(&f->live, addr);
    if (!b) {
        g_critical(ARENA_NAME ": free of 0x%" G_GINT64_MODIFIER "x, which is not allocated", addr);
        return;
    }
    b->used = 0;
    b->seg->n_used--;
    memsim_stat_sub(&f->st.allocated, (int64_t)b->size);
    memsim_stat_sub(&f->st.active, (int64_t)b->size);
    memsim_stat_sub(&f->st.requested, (int64_t)b->requested);
    memsim_stat_sub(&f->st.allocations, 1);
    memsim_device_emit(f->dev, MEMSIM_AEV_FREE_COMPLETED, addr, b->requested, b->stream);
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
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, ARENA_NAME ": " __VA_ARGS__);     \
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
                if (!free_set_holds(f, b))
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
    if (!free_set_verify(f, n_free, error))
        return FALSE;
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
    return kit_check_stats(ARENA_NAME, &f->st, cmp, G_N_ELEMENTS(cmp), error);
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
    use_blk(f, b, requested, stream);
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
    if (!kit_parse_settings(ARENA_NAME, settings, "segment_mb", fit_setting, &seg, error))
        return NULL;
    Fit *f = g_new0(Fit, 1);
    f->dev = dev;
    f->segment_size = seg;
    kit_map_init(&f->live, 4);
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

#endif
