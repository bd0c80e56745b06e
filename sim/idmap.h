/* Internal: an open-addressing hash map from a 64-bit key to a small value, for the hot path
 * of replays (tensor id → live block). Linear probing with backward-shift deletion, so there
 * are no tombstones and a lookup stops at the first empty slot. Keys are stored plus one so
 * that 0 marks an empty slot (the key UINT64_MAX cannot be stored). Header-only. */
#ifndef MEMSIM_SIM_IDMAP_H
#define MEMSIM_SIM_IDMAP_H

#include <glib.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t addr;
    uint64_t size; /* block bytes charged to the tensor */
    uint64_t req;  /* bytes the program asked for */
    uint8_t category;
    uint16_t stream;
    uint32_t site; /* allocation site (replay.c), SITE_NONE without one */
} IdVal;

typedef struct {
    uint64_t key1; /* key + 1; 0 = empty */
    IdVal val;
} IdSlot;

typedef struct {
    IdSlot *slots;
    size_t mask; /* capacity − 1 */
    size_t n;
    size_t limit; /* capacity / 2: the n at which idmap_reserve grows the map */
    unsigned shift; /* 64 − log2(capacity) */
} IdMap;

/* The home slot of a key: Fibonacci hashing (the top bits of key × 2^64/φ), which spreads
 * the runs of consecutive ids that traces are made of evenly and costs a multiply. */
static inline size_t idmap_home(const IdMap *m, uint64_t k)
{
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> m->shift);
}

static inline void idmap_init(IdMap *m)
{
    m->mask = 15; /* small: a trace may have thousands of ranks; the map doubles as it fills */
    m->limit = 8;
    m->shift = 64 - 4;
    m->n = 0;
    m->slots = g_new0(IdSlot, m->mask + 1);
}

static inline void idmap_clear(IdMap *m)
{
    g_free(m->slots);
    m->slots = NULL;
}

static inline IdVal *idmap_get(const IdMap *m, uint64_t key)
{
    size_t i = idmap_home(m, key);
    for (;;) {
        IdSlot *s = &m->slots[i];
        if (s->key1 == key + 1)
            return &s->val;
        if (s->key1 == 0)
            return NULL;
        i = (i + 1) & m->mask;
    }
}

static inline void idmap_put_nogrow(IdMap *m, uint64_t key, const IdVal *v)
{
    size_t i = idmap_home(m, key);
    while (m->slots[i].key1 != 0)
        i = (i + 1) & m->mask;
    m->slots[i].key1 = key + 1;
    m->slots[i].val = *v;
    m->n++;
}

/* Room for one more key (load at most 1/2: short probe runs). */
static inline void idmap_reserve(IdMap *m)
{
    if (G_UNLIKELY(m->n >= m->limit)) { /* (n + 1) * 2 > capacity */
        IdSlot *old = m->slots;
        size_t cap = m->mask + 1;
        m->mask = cap * 2 - 1;
        m->limit = cap;
        m->shift--;
        m->slots = g_new0(IdSlot, cap * 2);
        m->n = 0;
        for (size_t i = 0; i < cap; i++)
            if (old[i].key1)
                idmap_put_nogrow(m, old[i].key1 - 1, &old[i].val);
        g_free(old);
    }
}

/* Inserts a key that is not present. */
static inline void idmap_put(IdMap *m, uint64_t key, const IdVal *v)
{
    idmap_reserve(m);
    idmap_put_nogrow(m, key, v);
}

/* The slot of key after idmap_reserve(): where it is (key1 == key + 1), or the empty slot
 * where idmap_fill() puts it, valid until the map next changes. One probe for a lookup
 * followed by an insertion. */
static inline IdSlot *idmap_slot(const IdMap *m, uint64_t key)
{
    size_t i = idmap_home(m, key);
    for (;;) {
        IdSlot *s = &m->slots[i];
        if (s->key1 == key + 1 || s->key1 == 0)
            return s;
        i = (i + 1) & m->mask;
    }
}

static inline void idmap_fill(IdMap *m, IdSlot *s, uint64_t key, const IdVal *v)
{
    s->key1 = key + 1;
    s->val = *v;
    m->n++;
}

/* Removes a key; returns FALSE if it was absent. */
static inline gboolean idmap_remove(IdMap *m, uint64_t key, IdVal *out)
{
    size_t i = idmap_home(m, key);
    for (;;) {
        if (m->slots[i].key1 == key + 1)
            break;
        if (m->slots[i].key1 == 0)
            return FALSE;
        i = (i + 1) & m->mask;
    }
    if (out)
        *out = m->slots[i].val;
    /* Backward-shift the cluster that follows. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->slots[j].key1 == 0)
            break;
        size_t home = idmap_home(m, m->slots[j].key1 - 1);
        /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].key1 = 0;
    m->n--;
    return TRUE;
}

/* Moves every key from `at` on down by `by` (a repeated unit's tensors taking back its
 * template's ids); FALSE when a moved key lands on one already there (the others are moved
 * all the same). */
static inline gboolean idmap_move_down(IdMap *m, uint64_t at, uint64_t by)
{
    if (!by)
        return TRUE;
    GArray *back = g_array_new(FALSE, FALSE, sizeof(IdSlot));
    for (size_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key1 && m->slots[i].key1 - 1 >= at)
            g_array_append_val(back, m->slots[i]);
    for (guint i = 0; i < back->len; i++)
        idmap_remove(m, g_array_index(back, IdSlot, i).key1 - 1, NULL);
    gboolean ok = TRUE;
    for (guint i = 0; i < back->len; i++) {
        const IdSlot *s = &g_array_index(back, IdSlot, i);
        if (idmap_get(m, s->key1 - 1 - by))
            ok = FALSE;
        else
            idmap_put(m, s->key1 - 1 - by, &s->val);
    }
    g_array_unref(back);
    return ok;
}

#endif
