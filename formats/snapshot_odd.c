/* The odd facts a snapshot reader reads anyway (formats/snapshot.h MemsimSnapOdd): one
 * warning line per kind with its count and the first one's place, and each device's count of
 * inconsistencies (--verify reports them as a mismatch). Shared by the streaming reader
 * (snapshot_stream.c) and the reference reader (snapshot.c), which must say the same. */
#include "formats/snapshot.h"

typedef struct {
    char *kind;  /* e.g. "entries of the unknown action 'foo' skipped" */
    char *first; /* where the first one is, and what it says */
    uint64_t count;
} Odd;

static void odd_clear(gpointer x)
{
    Odd *o = x;
    g_free(o->kind);
    g_free(o->first);
}

void memsim_snap_odd_init(MemsimSnapOdd *o)
{
    o->odd = g_array_new(FALSE, FALSE, sizeof(Odd));
    g_array_set_clear_func(o->odd, odd_clear);
    o->by_kind = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    o->per_dev = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
}

void memsim_snap_odd_note(MemsimSnapOdd *o, int64_t device, const char *kind, const char *where,
                          const char *msg)
{
    gpointer idx;
    if (g_hash_table_lookup_extended(o->by_kind, kind, NULL, &idx)) {
        g_array_index(o->odd, Odd, GPOINTER_TO_UINT(idx)).count++;
    } else {
        Odd d = {g_strdup(kind), g_strdup_printf("%s: %s", where, msg), 1};
        g_hash_table_insert(o->by_kind, g_strdup(kind), GUINT_TO_POINTER(o->odd->len));
        g_array_append_val(o->odd, d);
    }
    if (device >= 0) {
        uint64_t *n = g_hash_table_lookup(o->per_dev, &device);
        if (!n) {
            n = g_new0(uint64_t, 1);
            g_hash_table_insert(o->per_dev, g_memdup2(&device, sizeof device), n);
        }
        (*n)++;
    }
}

void memsim_snap_odd_finish(const MemsimSnapOdd *o, MemsimTrace *t, const char *file)
{
    MemsimTraceHeader *h = memsim_trace_header(t);
    if (o->odd->len) {
        h->warnings = g_new0(char *, o->odd->len + 1);
        for (guint i = 0; i < o->odd->len; i++) {
            const Odd *d = &g_array_index(o->odd, Odd, i);
            h->warnings[i] = g_strdup_printf("%s: %" G_GUINT64_FORMAT " %s (first: %s)", file,
                                             d->count, d->kind, d->first);
        }
    }
    for (guint32 i = 0; i < h->n_ranks; i++) {
        int64_t d = h->ranks[i].device;
        uint64_t *n = g_hash_table_lookup(o->per_dev, &d);
        h->ranks[i].n_inconsistent = n ? *n : 0;
    }
}

void memsim_snap_odd_clear(MemsimSnapOdd *o)
{
    g_array_unref(o->odd);
    g_hash_table_unref(o->by_kind);
    g_hash_table_unref(o->per_dev);
}
