/* Internal, header-only: the building blocks the policies of sim/alloc/ share (bfc.c,
 * best-fit.c, first-fit.c, buddy.c, stitch.c; torch.c uses the slab, the address map, the
 * size classes, the statistics and the number parsers; exact.c the statistics). Each policy
 * keeps its algorithm in its own file; what lives here is mechanism that would otherwise be
 * copied into each (the arena that bfc, best-fit, first-fit and stitch are built on, made of
 * these parts, is sim/alloc/arena.c):
 *
 *   KitSlab     fixed-size objects carved from 4096-object chunks: no malloc per event.
 *   KitAddrMap  open-addressing hash map address → object (linear probing, backward-shift
 *               deletion, load <= 1/2): O(1) expected; the free() path of every policy.
 *   KitNode     intrusive treap (randomised balanced search tree with parent pointers) with an
 *               optional augmentation callback; the caller supplies the order.
 *   size classes  monotone in the size, with a two-level bitmap of the non-empty ones.
 *   KitBins     free objects ordered (size, address) in size-class treaps: best fit without
 *               deep trees.
 *   KitSegs     the policy's segments sorted by base address (binary search): which segment
 *               holds an address, whether a new or recorded one would overlap, ordered walks
 *               for check().
 *   kit_segment_addr()  memsim_device_segment_addr() guarded against overlap.
 *   kit_stats_*()  the statistics' bookkeeping (a block handed out or back, a segment taken
 *               or released), the device's room, the OOM answer, shape and check helpers.
 *   kit_parse_settings()  "key=value,key=value" (':' also accepted) with named errors.
 *
 * Everything is static inline: the hot parts must inline into each policy's malloc and free,
 * and each policy file stays self-contained at link time.
 */
#ifndef MEMSIM_SIM_ALLOC_KIT_H
#define MEMSIM_SIM_ALLOC_KIT_H

#include <memsim/alloc.h>

#include "formats/numbers.h"

#include <stdlib.h>
#include <string.h>

#define KIT_KIB ((memsim_size_t)1 << 10)
#define KIT_MIB ((memsim_size_t)1 << 20)
#define KIT_GIB ((memsim_size_t)1 << 30)

static inline memsim_size_t kit_round_up(memsim_size_t v, memsim_size_t to)
{
    return (v + to - 1) / to * to;
}


/* ---------------------------------------------------------------------------------------- */
/* Slab */

#define KIT_SLAB_CHUNK 4096

typedef struct {
    gsize obj_size;
    void *free;
    char *bump, *bump_end; /* the newest chunk's objects never handed out */
    GPtrArray *chunks;
} KitSlab;

/* Objects of obj_size bytes rounded up to a multiple of `align` (a power of two up to 64),
 * in chunks aligned to 64 bytes: with align 64, an object starts a cache line. */
static inline void kit_slab_init_aligned(KitSlab *s, gsize obj_size, gsize align)
{
    s->obj_size = obj_size < sizeof(void *) ? sizeof(void *) : obj_size;
    s->obj_size = (s->obj_size + align - 1) / align * align;
    s->free = NULL;
    s->bump = s->bump_end = NULL;
    s->chunks = g_ptr_array_new_with_free_func(free);
}

static inline void kit_slab_init(KitSlab *s, gsize obj_size)
{
    kit_slab_init_aligned(s, obj_size, 16);
}

/* Out of line: the malloc paths that reach it stay small. A chunk's objects are handed out
 * in order as they are needed, so its pages are touched only when used (a short trace that
 * needs a few blocks does not fault in half a megabyte). */
static G_GNUC_NO_INLINE void *kit_slab_grow(KitSlab *s)
{
    gsize bytes = (s->obj_size * KIT_SLAB_CHUNK + 63) / 64 * 64;
    char *chunk = aligned_alloc(64, bytes);
    if (!chunk)
        g_error("out of host memory");
    g_ptr_array_add(s->chunks, chunk);
    s->bump = chunk + s->obj_size;
    s->bump_end = chunk + s->obj_size * KIT_SLAB_CHUNK;
    return chunk;
}

/* An object as it was left (the caller sets every field). */
static inline void *kit_slab_get_raw(KitSlab *s)
{
    void *o = s->free;
    if (G_LIKELY(o)) {
        s->free = *(void **)o;
        return o;
    }
    if (G_LIKELY(s->bump != s->bump_end)) {
        o = s->bump;
        s->bump += s->obj_size;
        return o;
    }
    return kit_slab_grow(s);
}

/* A zeroed object. */
static inline void *kit_slab_get(KitSlab *s)
{
    void *o = kit_slab_get_raw(s);
    memset(o, 0, s->obj_size);
    return o;
}

static inline void kit_slab_put(KitSlab *s, void *o)
{
    *(void **)o = s->free;
    s->free = o;
}

static inline void kit_slab_clear(KitSlab *s)
{
    if (s->chunks)
        g_ptr_array_unref(s->chunks);
    s->chunks = NULL;
    s->free = NULL;
    s->bump = s->bump_end = NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Address map */

typedef struct {
    memsim_addr_t key;
    void *val; /* NULL = empty slot */
} KitSlot;

typedef struct {
    KitSlot *slots;
    uint64_t mask;
    uint64_t n;
    uint64_t limit; /* (mask + 1) / 2: the n at which an insertion grows the map first */
    int bits;
    int shift; /* 64 - bits */
} KitAddrMap;

/* The map's operations are on the malloc and free paths of every policy: inlined always. */
#define KIT_HOT inline __attribute__((always_inline))

static KIT_HOT uint64_t kit_map_home(const KitAddrMap *m, memsim_addr_t key)
{
    /* Addresses are multiples of 256 at least: drop the zero bits before mixing. */
    return ((key >> 8) * 0x9E3779B97F4A7C15ull) >> m->shift;
}

static inline void kit_map_init(KitAddrMap *m, int bits)
{
    m->bits = bits;
    m->shift = 64 - bits;
    m->mask = ((uint64_t)1 << bits) - 1;
    m->limit = (m->mask + 1) / 2;
    m->n = 0;
    m->slots = g_new0(KitSlot, m->mask + 1);
}

static inline void kit_map_clear(KitAddrMap *m)
{
    g_free(m->slots);
    m->slots = NULL;
}

static KIT_HOT void kit_map_put_raw(KitAddrMap *m, memsim_addr_t key, void *val)
{
    uint64_t i = kit_map_home(m, key);
    while (m->slots[i].val)
        i = (i + 1) & m->mask;
    m->slots[i].key = key;
    m->slots[i].val = val;
    m->n++;
}

static inline void kit_map_grow(KitAddrMap *m)
{
    KitSlot *old = m->slots;
    uint64_t old_n = m->mask + 1;
    kit_map_init(m, m->bits + 1);
    for (uint64_t i = 0; i < old_n; i++)
        if (old[i].val)
            kit_map_put_raw(m, old[i].key, old[i].val);
    g_free(old);
}

/* Inserts key → val; the key must not be present. */
static KIT_HOT void kit_map_put(KitAddrMap *m, memsim_addr_t key, void *val)
{
    if (G_UNLIKELY(m->n >= m->limit)) /* (n + 1) * 2 > capacity */
        kit_map_grow(m);
    kit_map_put_raw(m, key, val);
}

static KIT_HOT int64_t kit_map_slot(const KitAddrMap *m, memsim_addr_t key)
{
    uint64_t i = kit_map_home(m, key);
    while (m->slots[i].val) {
        if (m->slots[i].key == key)
            return (int64_t)i;
        i = (i + 1) & m->mask;
    }
    return -1;
}

static KIT_HOT void *kit_map_get(const KitAddrMap *m, memsim_addr_t key)
{
    int64_t i = kit_map_slot(m, key);
    return i < 0 ? NULL : m->slots[i].val;
}

/* Removes key and returns its value (NULL if absent). */
static KIT_HOT void *kit_map_take(KitAddrMap *m, memsim_addr_t key)
{
    int64_t found = kit_map_slot(m, key);
    if (found < 0)
        return NULL;
    uint64_t i = (uint64_t)found;
    void *v = m->slots[i].val;
    /* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (!m->slots[j].val)
            break;
        uint64_t k = kit_map_home(m, m->slots[j].key);
        gboolean movable = (j > i) ? (k <= i || k > j) : (k <= i && k > j);
        if (movable) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].val = NULL;
    m->n--;
    return v;
}

/* ---------------------------------------------------------------------------------------- */
/* Treap with parent pointers. The caller embeds KitNode as the first member of its object,
 * gives insertion an order (`less`) and, for augmented trees, a `fix` callback that recomputes
 * a node's summary from its children (NULL when the tree carries none). Max-heap on prio. */

typedef struct KitNode KitNode;
struct KitNode {
    KitNode *left, *right, *parent;
    uint32_t prio;
};

typedef gboolean (*KitLess)(const KitNode *a, const KitNode *b);
typedef void (*KitFix)(KitNode *n);

static inline uint32_t kit_prio(uint32_t *rng)
{
    uint32_t x = *rng;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *rng = x;
}

static inline void kit_fix_up(KitNode *n, KitFix fix)
{
    for (; n; n = n->parent)
        fix(n);
}

static inline void kit_rotate_up(KitNode **root, KitNode *x, KitFix fix)
{
    KitNode *p = x->parent, *g = p->parent;
    if (p->left == x) {
        p->left = x->right;
        if (x->right)
            x->right->parent = p;
        x->right = p;
    } else {
        p->right = x->left;
        if (x->left)
            x->left->parent = p;
        x->left = p;
    }
    p->parent = x;
    x->parent = g;
    if (!g)
        *root = x;
    else if (g->left == p)
        g->left = x;
    else
        g->right = x;
    if (fix) {
        fix(p);
        fix(x);
    }
}

static inline void kit_tree_insert(KitNode **root, KitNode *n, KitLess less, KitFix fix)
{
    KitNode *p = NULL, **link = root;
    while (*link) {
        p = *link;
        link = less(n, p) ? &p->left : &p->right;
    }
    n->left = n->right = NULL;
    n->parent = p;
    *link = n;
    if (fix)
        kit_fix_up(n, fix);
    while (n->parent && n->parent->prio < n->prio)
        kit_rotate_up(root, n, fix);
}

static inline void kit_tree_remove(KitNode **root, KitNode *n, KitFix fix)
{
    while (n->left && n->right)
        kit_rotate_up(root, n->left->prio > n->right->prio ? n->left : n->right, fix);
    KitNode *c = n->left ? n->left : n->right, *p = n->parent;
    if (c)
        c->parent = p;
    if (!p)
        *root = c;
    else if (p->left == n)
        p->left = c;
    else
        p->right = c;
    n->left = n->right = n->parent = NULL;
    if (fix && p)
        kit_fix_up(p, fix);
}

static inline KitNode *kit_tree_first(KitNode *n)
{
    if (!n)
        return NULL;
    while (n->left)
        n = n->left;
    return n;
}

static inline KitNode *kit_tree_last(KitNode *n)
{
    if (!n)
        return NULL;
    while (n->right)
        n = n->right;
    return n;
}

static inline KitNode *kit_tree_next(KitNode *n)
{
    if (n->right)
        return kit_tree_first(n->right);
    while (n->parent && n->parent->right == n)
        n = n->parent;
    return n->parent;
}

static inline KitNode *kit_tree_prev(KitNode *n)
{
    if (n->left)
        return kit_tree_last(n->left);
    while (n->parent && n->parent->left == n)
        n = n->parent;
    return n->parent;
}

/* Whether n hangs under root (by parent links). */
static inline gboolean kit_tree_contains(const KitNode *root, const KitNode *n)
{
    while (n->parent)
        n = n->parent;
    return n == root;
}

/* Links and heap order of a whole tree, and that an in-order walk is sorted by `less`.
 * Returns the number of nodes, or -1 when something is broken. */
static inline int64_t kit_tree_verify(KitNode *root, KitLess less)
{
    if (root && root->parent)
        return -1;
    int64_t n = 0;
    KitNode *prev = NULL;
    for (KitNode *x = kit_tree_first(root); x; prev = x, x = kit_tree_next(x)) {
        if (x->left && (x->left->parent != x || x->left->prio > x->prio))
            return -1;
        if (x->right && (x->right->parent != x || x->right->prio > x->prio))
            return -1;
        if (prev && !less(prev, x))
            return -1;
        n++;
    }
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* Size classes: monotone in the size, exact below 32 KiB in 512-byte steps, then 32 per power
 * of two; a two-level bitmap (a word per 64 classes, a summary bit per word) marks the
 * non-empty ones. KitBins below and torch's per-stream free sets are built on them. */

#define KIT_N_CLASSES 1664
#define KIT_N_WORDS (KIT_N_CLASSES / 64)

/* q = size / 512; with sh = max(0, floor(log2 q) - 5), class = 32 sh + (q >> sh): the
 * identity below 64, then [32 (sh + 1), 32 (sh + 2)) for q in [2^(sh+5), 2^(sh+6)). No
 * branch: the class is computed on every malloc and free of torch. */
static inline unsigned kit_size_class(memsim_size_t size)
{
    uint64_t q = size >> 9;
    unsigned sh = 58 - (unsigned)__builtin_clzll(q | 32); /* floor(log2(q | 32)) - 5 */
    return (sh << 5) + (unsigned)(q >> sh);
}

/* q < 2^55 → sh <= 49 → class < 32 x 51. */
G_STATIC_ASSERT(32 * 51 <= KIT_N_CLASSES && KIT_N_WORDS <= 63);

/* Which classes are non-empty. */
typedef struct {
    uint64_t summary; /* bit w: bits[w] != 0 */
    uint64_t bits[KIT_N_WORDS];
} KitClassMap;

static inline void kit_class_mark(KitClassMap *m, unsigned c)
{
    m->bits[c >> 6] |= 1ull << (c & 63);
    m->summary |= 1ull << (c >> 6);
}

/* Clears class c's bit when `empty`; without a branch, since whether a class empties is
 * data, not a pattern. */
static inline void kit_class_unmark(KitClassMap *m, unsigned c, gboolean empty)
{
    m->bits[c >> 6] &= ~((uint64_t)(empty != 0) << (c & 63));
    m->summary &= ~((uint64_t)(m->bits[c >> 6] == 0) << (c >> 6));
}

/* First non-empty class >= c, or -1. */
static inline int kit_class_from(const KitClassMap *m, unsigned c)
{
    if (c >= KIT_N_CLASSES)
        return -1;
    unsigned w = c >> 6;
    uint64_t b = m->bits[w] & (~0ull << (c & 63));
    if (b)
        return (int)(w * 64 + (unsigned)__builtin_ctzll(b));
    uint64_t sm = m->summary & (~0ull << (w + 1));
    if (!sm)
        return -1;
    w = (unsigned)__builtin_ctzll(sm);
    return (int)(w * 64 + (unsigned)__builtin_ctzll(m->bits[w]));
}

/* Last non-empty class < c, or -1. */
static inline int kit_class_before(const KitClassMap *m, unsigned c)
{
    if (c == 0)
        return -1;
    c--;
    unsigned w = c >> 6, bit = c & 63;
    uint64_t b = m->bits[w] & (bit == 63 ? ~0ull : (2ull << bit) - 1);
    if (b)
        return (int)(w * 64 + 63 - (unsigned)__builtin_clzll(b));
    uint64_t sm = m->summary & ((1ull << w) - 1);
    if (!sm)
        return -1;
    w = 63 - (unsigned)__builtin_clzll(sm);
    return (int)(w * 64 + 63 - (unsigned)__builtin_clzll(m->bits[w]));
}

/* ---------------------------------------------------------------------------------------- */
/* Size-class bins: a set of free objects ordered (size, address) split into the size
 * classes, a treap per class (jemalloc's eset idea). A lower_bound is a search in one small
 * tree or the first node of the next non-empty class, which keeps the trees shallow when
 * there are many free blocks. Sizes are multiples of 512. The caller gives the order
 * (`less`, by size then address) and the size of a node. */

typedef memsim_size_t (*KitSizeOf)(const KitNode *n);

typedef struct {
    uint64_t n;
    KitClassMap map;
    KitNode *bins[KIT_N_CLASSES];
} KitBins;

static inline void kit_bins_insert(KitBins *b, KitNode *x, memsim_size_t size, KitLess less)
{
    unsigned c = kit_size_class(size);
    kit_tree_insert(&b->bins[c], x, less, NULL);
    kit_class_mark(&b->map, c);
    b->n++;
}

static inline void kit_bins_remove(KitBins *b, KitNode *x, memsim_size_t size)
{
    unsigned c = kit_size_class(size);
    kit_tree_remove(&b->bins[c], x, NULL);
    kit_class_unmark(&b->map, c, b->bins[c] == NULL);
    b->n--;
}

/* The first node with size >= n (the smallest such, lowest address among equals), or NULL. */
static inline KitNode *kit_bins_lower_bound(const KitBins *b, memsim_size_t n, KitSizeOf size_of)
{
    unsigned c = kit_size_class(n);
    KitNode *best = NULL;
    for (KitNode *x = b->bins[c]; x;) {
        if (size_of(x) >= n) {
            best = x;
            x = x->left;
        } else {
            x = x->right;
        }
    }
    if (best)
        return best;
    int c2 = kit_class_from(&b->map, c + 1);
    return c2 < 0 ? NULL : kit_tree_first(b->bins[c2]);
}

/* The largest node (the highest address among equals), or NULL. */
static inline KitNode *kit_bins_last(const KitBins *b)
{
    int c = kit_class_before(&b->map, KIT_N_CLASSES);
    return c < 0 ? NULL : kit_tree_last(b->bins[c]);
}

/* Whether x is filed in b under the class of `size`. */
static inline gboolean kit_bins_contains(const KitBins *b, const KitNode *x, memsim_size_t size)
{
    return kit_tree_contains(b->bins[kit_size_class(size)], x);
}

/* Trees, classes and bitmaps of the whole set. Returns the number of nodes, or -1 when
 * something is broken. */
static inline int64_t kit_bins_verify(const KitBins *b, KitLess less, KitSizeOf size_of)
{
    int64_t n = 0;
    for (unsigned c = 0; c < KIT_N_CLASSES; c++) {
        if (((b->map.bits[c >> 6] >> (c & 63)) & 1) != (b->bins[c] != NULL))
            return -1;
        int64_t k = kit_tree_verify(b->bins[c], less);
        if (k < 0)
            return -1;
        for (KitNode *x = kit_tree_first(b->bins[c]); x; x = kit_tree_next(x))
            if (kit_size_class(size_of(x)) != c)
                return -1;
        n += k;
    }
    for (unsigned w = 0; w < KIT_N_WORDS; w++)
        if (((b->map.summary >> w) & 1) != (b->map.bits[w] != 0))
            return -1;
    return (uint64_t)n == b->n ? n : -1;
}

/* ---------------------------------------------------------------------------------------- */
/* Segments sorted by base address. The policy's segment struct starts with KitSeg. */

typedef struct {
    memsim_addr_t base;
    memsim_size_t size;
} KitSeg;

typedef struct {
    KitSeg **v;
    guint n, cap;
    memsim_addr_t private_next; /* see kit_segment_addr() */
} KitSegs;

/* Index of the first segment whose end is above addr. */
static inline guint kit_segs_lower(const KitSegs *s, memsim_addr_t addr)
{
    guint lo = 0, hi = s->n;
    while (lo < hi) {
        guint mid = (lo + hi) / 2;
        if (s->v[mid]->base + s->v[mid]->size <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static inline KitSeg *kit_segs_find(const KitSegs *s, memsim_addr_t addr)
{
    guint i = kit_segs_lower(s, addr);
    if (i < s->n && s->v[i]->base <= addr)
        return s->v[i];
    return NULL;
}

static inline gboolean kit_segs_overlap(const KitSegs *s, memsim_addr_t addr, memsim_size_t size)
{
    if (addr + size < addr)
        return TRUE;
    guint i = kit_segs_lower(s, addr);
    return i < s->n && s->v[i]->base < addr + size;
}

static inline void kit_segs_insert(KitSegs *s, KitSeg *g)
{
    guint i = kit_segs_lower(s, g->base);
    g_assert(i == s->n || s->v[i]->base >= g->base + g->size);
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 16;
        s->v = g_renew(KitSeg *, s->v, s->cap);
    }
    memmove(&s->v[i + 1], &s->v[i], (s->n - i) * sizeof *s->v);
    s->v[i] = g;
    s->n++;
}

static inline void kit_segs_remove(KitSegs *s, KitSeg *g)
{
    guint i = kit_segs_lower(s, g->base);
    g_assert(i < s->n && s->v[i] == g);
    memmove(&s->v[i], &s->v[i + 1], (s->n - i - 1) * sizeof *s->v);
    s->n--;
}

static inline void kit_segs_clear(KitSegs *s)
{
    g_free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

/* Whether a recorded segment can be taken as it is: not empty, in whole units (a power of
 * two) at an aligned address, overlapping none of segs. FALSE with an error naming it. */
static inline gboolean kit_segs_can_seed(const KitSegs *segs, const char *policy,
                                         memsim_addr_t addr, memsim_size_t size, memsim_size_t unit,
                                         GError **error)
{
    if (size == 0 || size % unit || addr % unit || kit_segs_overlap(segs, addr, size)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: cannot start from segment 0x%" G_GINT64_MODIFIER "x of %" G_GUINT64_FORMAT
                    " bytes (empty, not in %" G_GUINT64_FORMAT
                    "-byte units, or overlapping another)",
                    policy, addr, size, unit);
        return FALSE;
    }
    return TRUE;
}

/* An address for a new segment of `size` bytes. The device's hook decides, as for every
 * policy; but a replay hands back recorded addresses when the recording has an allocator
 * action pending (that is how the torch policy is verified), and a recorded expandable
 * mapping carries no size, so the address may fall inside a segment this policy already
 * holds. Such an address, or a misaligned one, is replaced by one from a private range far
 * above any device address, so that two live segments of one policy never overlap. */
#define KIT_PRIVATE_BASE ((memsim_addr_t)1 << 61)
#define KIT_ALIGN ((memsim_addr_t)2 << 20)

static inline memsim_addr_t kit_segment_addr(MemsimDevice *dev, KitSegs *s, memsim_size_t size,
                                             uint32_t stream)
{
    memsim_addr_t a = memsim_device_segment_addr(dev, size, stream);
    if (a && (a & 511) == 0 && !kit_segs_overlap(s, a, size))
        return a;
    if (s->private_next < KIT_PRIVATE_BASE)
        s->private_next = KIT_PRIVATE_BASE;
    do {
        a = s->private_next;
        s->private_next += kit_round_up(size, KIT_ALIGN) + KIT_ALIGN;
    } while (kit_segs_overlap(s, a, size));
    return a;
}

/* ---------------------------------------------------------------------------------------- */
/* Statistics: the bookkeeping of MemsimAllocStats that the policies share. A block handed out
 * counts its bytes as allocated and active and its request as requested; a segment taken
 * from the device counts its bytes as reserved. */

static inline void kit_stats_alloc(MemsimAllocStats *st, memsim_size_t size,
                                   memsim_size_t requested)
{
    memsim_stat_add(&st->allocations, 1);
    memsim_stat_add(&st->allocated, (int64_t)size);
    memsim_stat_add(&st->active, (int64_t)size);
    memsim_stat_add(&st->requested, (int64_t)requested);
}

static inline void kit_stats_free(MemsimAllocStats *st, memsim_size_t size, memsim_size_t requested)
{
    memsim_stat_sub(&st->allocated, (int64_t)size);
    memsim_stat_sub(&st->active, (int64_t)size);
    memsim_stat_sub(&st->requested, (int64_t)requested);
    memsim_stat_sub(&st->allocations, 1);
}

static inline void kit_stats_segment_add(MemsimAllocStats *st, memsim_size_t size)
{
    memsim_stat_add(&st->reserved, (int64_t)size);
    memsim_stat_add(&st->segments, 1);
}

static inline void kit_stats_segment_sub(MemsimAllocStats *st, memsim_size_t size)
{
    memsim_stat_sub(&st->reserved, (int64_t)size);
    memsim_stat_sub(&st->segments, 1);
}

/* Whether the device can provide n more bytes to a policy holding st->reserved bytes. */
static inline gboolean kit_device_has(const MemsimDevice *dev, const MemsimAllocStats *st,
                                      memsim_size_t n)
{
    memsim_size_t cap = dev->capacity, held = (memsim_size_t)st->reserved.current;
    return !cap || (held <= cap && n <= cap - held);
}

/* The answer to a request of `size` bytes (as rounded) that the device cannot serve: counted,
 * and reported with the device's free bytes (0 when unlimited). */
static inline MemsimAllocResult kit_oom(MemsimDevice *dev, MemsimAllocStats *st, memsim_size_t size,
                                        uint32_t stream)
{
    memsim_size_t cap = dev->capacity, held = (memsim_size_t)st->reserved.current;
    st->n_ooms++;
    memsim_device_emit(dev, MEMSIM_AEV_OOM, cap > held ? cap - held : 0, size, stream);
    return MEMSIM_ALLOC_OOM;
}

/* Counts a free block of `size` bytes into a shape. */
static inline void kit_shape_add_free(MemsimAllocShape *sh, memsim_size_t size)
{
    sh->free_bytes += size;
    sh->n_free_blocks++;
    if (size > sh->largest_free)
        sh->largest_free = size;
}

static inline void kit_reset_peaks(MemsimAllocStats *st)
{
    MemsimStat *all[] = {&st->allocated,      &st->reserved, &st->active,     &st->requested,
                         &st->inactive_split, &st->segments, &st->allocations};
    for (gsize i = 0; i < G_N_ELEMENTS(all); i++)
        all[i]->peak = all[i]->current;
}

typedef struct {
    const char *name;
    int64_t recount, stat;
} KitCheck;

/* Compares recounted figures with the running statistics; FALSE with a message naming the
 * first one that differs. Also checks that no peak is below its current value. */
static inline gboolean kit_check_stats(const char *policy, const MemsimAllocStats *st,
                                       const KitCheck *c, gsize n, GError **error)
{
    for (gsize i = 0; i < n; i++)
        if (c[i].recount != c[i].stat) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "%s: stat %s is %" G_GINT64_FORMAT " but a recount gives %" G_GINT64_FORMAT,
                        policy, c[i].name, c[i].stat, c[i].recount);
            return FALSE;
        }
    const MemsimStat *pk[] = {&st->allocated,      &st->reserved, &st->active,     &st->requested,
                              &st->inactive_split, &st->segments, &st->allocations};
    for (gsize i = 0; i < G_N_ELEMENTS(pk); i++)
        if (pk[i]->peak < pk[i]->current || pk[i]->current < 0) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "%s: a statistic is negative or above its peak", policy);
            return FALSE;
        }
    return TRUE;
}

/* What a check() recounted by walking the blocks, for the statistics that every policy but
 * torch keeps alike (active = allocated: no block waits for stream events). */
typedef struct {
    int64_t allocated, requested, reserved, segments, allocations, inactive_split;
} KitRecount;

static inline gboolean kit_check_recount(const char *policy, const MemsimAllocStats *st,
                                         const KitRecount *r, GError **error)
{
    KitCheck cmp[] = {
        {"allocated", r->allocated, st->allocated.current},
        {"active", r->allocated, st->active.current},
        {"requested", r->requested, st->requested.current},
        {"reserved", r->reserved, st->reserved.current},
        {"segments", r->segments, st->segments.current},
        {"allocations", r->allocations, st->allocations.current},
        {"inactive_split", r->inactive_split, st->inactive_split.current},
    };
    return kit_check_stats(policy, st, cmp, G_N_ELEMENTS(cmp), error);
}

/* ---------------------------------------------------------------------------------------- */
/* Settings: "key=value,key=value"; ':' may stand for '=' (PYTORCH_CUDA_ALLOC_CONF habit);
 * spaces around tokens are ignored. `apply` is called per pair and sets error itself. */

typedef gboolean (*KitSettingFn)(void *cfg, const char *key, const char *value, GError **error);

static inline gboolean kit_parse_settings(const char *policy, const char *settings,
                                          const char *keys, KitSettingFn apply, void *cfg,
                                          GError **error)
{
    if (!settings || !*settings)
        return TRUE;
    g_auto(GStrv) pairs = g_strsplit(settings, ",", -1);
    for (char **p = pairs; *p; p++) {
        char *pair = g_strstrip(*p);
        if (!*pair)
            continue;
        char *sep = strpbrk(pair, "=:");
        if (!sep) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "%s settings: expected key=value at '%s' (keys: %s)", policy, pair, keys);
            return FALSE;
        }
        *sep = '\0';
        if (!apply(cfg, g_strstrip(pair), g_strstrip(sep + 1), error))
            return FALSE;
    }
    return TRUE;
}

static inline gboolean kit_parse_bool(const char *v, gboolean *out)
{
    if (!g_ascii_strcasecmp(v, "true") || !strcmp(v, "1")) {
        *out = TRUE;
        return TRUE;
    }
    if (!g_ascii_strcasecmp(v, "false") || !strcmp(v, "0")) {
        *out = FALSE;
        return TRUE;
    }
    return FALSE;
}

#endif
