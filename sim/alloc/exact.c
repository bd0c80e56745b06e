/* exact — the lower bound: no caching, no segments, every live tensor rounded up to 512 bytes.
 *
 * Reserved memory always equals allocated memory, so no policy can have a lower peak
 * reserved on the same request stream (each rounds requests to at least 512 bytes).
 * Addresses are handed out by a bump pointer and never reused, so they stay unique.
 *
 * Data structure: a hash table address → block; O(1) per malloc and free.
 */
#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/kit.h"
#include "sim/alloc/policies.h"

typedef struct {
    memsim_size_t size;
    memsim_size_t requested;
    uint32_t stream; /* the request's, reported with its free */
} ExactBlock;

typedef struct {
    MemsimDevice *dev;
    GHashTable *live; /* addr → ExactBlock* */
    memsim_addr_t next;
    gboolean seeded; /* some live blocks sit at recorded addresses */
    MemsimAllocStats st;
} Exact;

static memsim_size_t exact_round(void *state, memsim_size_t size)
{
    (void)state;
    if (size < 512)
        return 512;
    return (size + 511) & ~(memsim_size_t)511;
}

static void *exact_create(const char *settings, MemsimDevice *dev, GError **error)
{
    if (settings && *settings) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "allocator 'exact' takes no settings (got '%s')", settings);
        return NULL;
    }
    Exact *e = g_new0(Exact, 1);
    e->dev = dev;
    e->live = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    e->next = (memsim_addr_t)1 << 40;
    return e;
}

static void exact_destroy(void *state)
{
    Exact *e = state;
    g_hash_table_unref(e->live);
    g_free(e);
}

/* Every block is a segment of its own, taken from the device and given back. */
static void account_alloc(Exact *e, memsim_size_t size, memsim_size_t requested)
{
    kit_stats_segment_add(&e->st, size);
    kit_stats_alloc(&e->st, size, requested);
    e->st.n_device_alloc++;
}

static void account_free(Exact *e, memsim_size_t size, memsim_size_t requested)
{
    kit_stats_segment_sub(&e->st, size);
    kit_stats_free(&e->st, size, requested);
    e->st.n_device_free++;
}

static MemsimAllocResult exact_malloc(void *state, memsim_size_t size, uint32_t stream,
                                      memsim_addr_t *addr)
{
    Exact *e = state;
    /* What the device has left, without wrapping: an unlimited device ends where the int64
     * statistics would overflow, and a request within 511 bytes of 2^64 saturates instead of
     * rounding around to 0. */
    memsim_size_t cap = e->dev->capacity ? e->dev->capacity : (memsim_size_t)INT64_MAX;
    memsim_size_t held = (memsim_size_t)e->st.reserved.current;
    memsim_size_t left = held < cap ? cap - held : 0;
    memsim_size_t r = size > UINT64_MAX - 511 ? UINT64_MAX : exact_round(e, size);
    if (r > left) {
        e->st.n_ooms++;
        memsim_device_emit(e->dev, MEMSIM_AEV_OOM, left, r, stream);
        return MEMSIM_ALLOC_OOM;
    }
    if (G_UNLIKELY(e->seeded)) {
        /* A recorded block may sit where the bump pointer is: step over it, so that no
         * address is live twice. */
        ExactBlock *in;
        gint64 at = (gint64)e->next;
        while ((in = g_hash_table_lookup(e->live, &at)) != NULL)
            at = (gint64)(e->next += in->size);
    }
    ExactBlock *b = g_new(ExactBlock, 1);
    b->size = r;
    b->requested = size;
    b->stream = stream;
    gint64 *key = g_new(gint64, 1);
    *key = (gint64)e->next;
    g_hash_table_insert(e->live, key, b);
    *addr = e->next;
    e->next += r;
    account_alloc(e, r, size);
    memsim_device_emit(e->dev, MEMSIM_AEV_ALLOC, *addr, size, stream);
    return MEMSIM_ALLOC_OK;
}

static void exact_free(void *state, memsim_addr_t addr)
{
    Exact *e = state;
    gint64 key = (gint64)addr;
    ExactBlock *b = g_hash_table_lookup(e->live, &key);
    g_assert(b != NULL);
    account_free(e, b->size, b->requested);
    memsim_device_emit(e->dev, MEMSIM_AEV_FREE_COMPLETED, addr, b->requested, b->stream);
    g_hash_table_remove(e->live, &key);
}

static MemsimAllocStats exact_stats(void *state)
{
    return ((Exact *)state)->st;
}

static const MemsimAllocStats *exact_stats_live(void *state)
{
    return &((Exact *)state)->st;
}

static void exact_reset_peaks(void *state)
{
    kit_reset_peaks(&((Exact *)state)->st);
}

static MemsimAllocShape exact_shape(void *state)
{
    Exact *e = state;
    MemsimAllocShape s = {0};
    s.n_segments = g_hash_table_size(e->live);
    return s;
}

static gboolean exact_check(void *state, GError **error)
{
    Exact *e = state;
    int64_t sum = 0, req = 0;
    GHashTableIter it;
    gpointer k, v;
    g_hash_table_iter_init(&it, e->live);
    while (g_hash_table_iter_next(&it, &k, &v)) {
        sum += (int64_t)((ExactBlock *)v)->size;
        req += (int64_t)((ExactBlock *)v)->requested;
    }
    if (sum != e->st.allocated.current || sum != e->st.reserved.current ||
        req != e->st.requested.current) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "exact: recount %" G_GINT64_FORMAT " bytes (%" G_GINT64_FORMAT
                    " requested), stats say %" G_GINT64_FORMAT " (%" G_GINT64_FORMAT ")",
                    sum, req, e->st.allocated.current, e->st.requested.current);
        return FALSE;
    }
    return TRUE;
}

static gboolean exact_seed_segment(void *state, memsim_addr_t addr, memsim_size_t size,
                                   uint32_t stream, uint32_t flags, GError **error)
{
    return TRUE; /* segments do not exist here; only live blocks count */
}

static gboolean exact_seed_block(void *state, memsim_addr_t addr, memsim_size_t block_size,
                                 memsim_size_t requested, uint32_t stream, GError **error)
{
    Exact *e = state;
    ExactBlock *b = g_new(ExactBlock, 1);
    b->size = exact_round(e, requested);
    b->requested = requested;
    b->stream = stream;
    gint64 *key = g_new(gint64, 1);
    *key = (gint64)addr;
    if (g_hash_table_contains(e->live, key)) {
        g_free(key);
        g_free(b);
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "two blocks recorded at address 0x%" G_GINT64_MODIFIER "x", addr);
        return FALSE;
    }
    g_hash_table_insert(e->live, key, b);
    e->seeded = TRUE;
    account_alloc(e, b->size, requested);
    e->st.n_device_alloc--; /* seeded, not a driver call */
    return TRUE;
}

static const MemsimAllocOps exact_ops = {
    .name = "exact",
    .description = "no caching, each live tensor rounded to 512 bytes: the lower bound",
    .settings_help = NULL,
    .create = exact_create,
    .destroy = exact_destroy,
    .malloc = exact_malloc,
    .free = exact_free,
    .stats = exact_stats,
    .stats_live = exact_stats_live,
    .stats_live_fixed = TRUE,
    .shape = exact_shape,
    .reset_peaks = exact_reset_peaks,
    .check = exact_check,
    .seed_segment = exact_seed_segment,
    .seed_block = exact_seed_block,
    .round_size = exact_round,
};

const MemsimAllocOps *memsim_alloc_exact_ops(void)
{
    return &exact_ops;
}
