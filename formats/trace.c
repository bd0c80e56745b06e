/* The in-memory trace and the names of the contract's enumerations (include/memsim/trace.h). */
#include <memsim/trace.h>
#include <memsim/error.h>

#include "formats/formats-internal.h"

#include <stdio.h>
#include <string.h>

G_DEFINE_QUARK(memsim-error-quark, memsim_error)

struct MemsimTrace {
    MemsimTraceHeader header;
    GPtrArray *programs;     /* GArray of MemsimEvent per rank */
    GHashTable *string_index; /* string → index + 1 */
    /* The op table grows geometrically: `ops_cap` entries are allocated at `ops_buf`, valid
     * while the header still points there (a caller may have replaced the table). */
    MemsimOpInfo *ops_buf;
    guint32 ops_cap;
    /* where a rank's whole program goes instead (memsim_trace_set_sink, formats/spill.c) */
    MemsimTraceSink sink;
    void *sink_user;
    GDestroyNotify sink_destroy;
    /* The rank table likewise (a snapshot of thousands of devices adds a rank for each). */
    MemsimRankInfo *ranks_buf;
    guint32 ranks_cap;
};

MemsimTrace *memsim_trace_new(const char *name)
{
    MemsimTrace *t = g_new0(MemsimTrace, 1);
    t->header.name = g_strdup(name ? name : "");
    t->programs = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
    t->string_index = g_hash_table_new(g_str_hash, g_str_equal);
    return t;
}

void memsim_trace_header_clear(MemsimTraceHeader *h)
{
    if (!h)
        return;
    g_free(h->name);
    g_free(h->alloc_conf);
    for (guint32 i = 0; i < h->n_ranks; i++) {
        g_free(h->ranks[i].role);
        g_free(h->ranks[i].stream_handles);
    }
    g_free(h->ranks);
    for (guint32 i = 0; i < h->n_strings; i++)
        g_free(h->strings[i]);
    g_free(h->strings);
    g_free(h->ops);
    g_strfreev(h->warnings);
    memset(h, 0, sizeof *h);
}

void memsim_trace_header_copy(MemsimTraceHeader *dst, const MemsimTraceHeader *src)
{
    *dst = *src;
    dst->name = g_strdup(src->name);
    dst->alloc_conf = g_strdup(src->alloc_conf);
    dst->ranks = g_new0(MemsimRankInfo, src->n_ranks ? src->n_ranks : 1);
    for (guint32 i = 0; i < src->n_ranks; i++) {
        dst->ranks[i] = src->ranks[i];
        dst->ranks[i].role = g_strdup(src->ranks[i].role);
        dst->ranks[i].stream_handles =
            src->ranks[i].stream_handles
                ? g_memdup2(src->ranks[i].stream_handles,
                            sizeof(uint64_t) * src->ranks[i].n_streams)
                : NULL;
    }
    dst->strings = g_new0(char *, src->n_strings + 1);
    for (guint32 i = 0; i < src->n_strings; i++)
        dst->strings[i] = g_strdup(src->strings[i]);
    dst->ops = src->n_ops ? g_memdup2(src->ops, sizeof(MemsimOpInfo) * src->n_ops) : NULL;
    dst->warnings = g_strdupv(src->warnings);
}

void memsim_trace_free(MemsimTrace *t)
{
    if (!t)
        return;
    memsim_trace_header_clear(&t->header);
    g_ptr_array_unref(t->programs);
    g_hash_table_unref(t->string_index);
    if (t->sink_destroy)
        t->sink_destroy(t->sink_user);
    g_free(t);
}

void memsim_trace_set_sink(MemsimTrace *t, MemsimTraceSink sink, void *user,
                           GDestroyNotify destroy)
{
    if (t->sink_destroy)
        t->sink_destroy(t->sink_user);
    t->sink = sink;
    t->sink_user = user;
    t->sink_destroy = destroy;
}

void *memsim_trace_sink_user(MemsimTrace *t)
{
    return t->sink_user;
}

MemsimTraceHeader *memsim_trace_header(MemsimTrace *t)
{
    return &t->header;
}

guint32 memsim_trace_add_rank(MemsimTrace *t, guint32 device, guint32 multiplicity)
{
    MemsimTraceHeader *h = &t->header;
    guint32 cap = h->ranks && h->ranks == t->ranks_buf && h->n_ranks <= t->ranks_cap
                      ? t->ranks_cap
                      : h->n_ranks;
    if (h->n_ranks + 1 > cap) {
        cap = h->n_ranks < 4 ? 4 : h->n_ranks * 2;
        h->ranks = g_renew(MemsimRankInfo, h->ranks, cap);
        t->ranks_buf = h->ranks;
        t->ranks_cap = cap;
    }
    MemsimRankInfo *r = &h->ranks[h->n_ranks];
    memset(r, 0, sizeof *r);
    r->device = device;
    r->multiplicity = multiplicity ? multiplicity : 1;
    r->n_streams = 1;
    g_ptr_array_add(t->programs, g_array_new(FALSE, FALSE, sizeof(MemsimEvent)));
    return h->n_ranks++;
}

guint32 memsim_trace_intern(MemsimTrace *t, const char *s)
{
    gpointer v = g_hash_table_lookup(t->string_index, s);
    if (v)
        return GPOINTER_TO_UINT(v) - 1;
    MemsimTraceHeader *h = &t->header;
    h->strings = g_renew(char *, h->strings, h->n_strings + 2);
    h->strings[h->n_strings] = g_strdup(s);
    h->strings[h->n_strings + 1] = NULL;
    g_hash_table_insert(t->string_index, h->strings[h->n_strings],
                        GUINT_TO_POINTER(h->n_strings + 1));
    return h->n_strings++;
}

guint32 memsim_trace_add_op(MemsimTrace *t, const MemsimOpInfo *op)
{
    MemsimTraceHeader *h = &t->header;
    guint32 cap = h->ops && h->ops == t->ops_buf && h->n_ops <= t->ops_cap ? t->ops_cap : h->n_ops;
    if (h->n_ops + 1 > cap) {
        cap = h->n_ops < 16 ? 16 : h->n_ops * 2;
        h->ops = g_renew(MemsimOpInfo, h->ops, cap);
        t->ops_buf = h->ops;
        t->ops_cap = cap;
    }
    h->ops[h->n_ops] = *op;
    return h->n_ops++;
}

/* The rank's stream count grows to cover the streams its new events name. */
static void cover_streams(MemsimTrace *t, guint32 rank, const MemsimEvent *events, gsize n)
{
    MemsimRankInfo *r = &t->header.ranks[rank];
    for (gsize i = 0; i < n; i++) {
        guint32 need = (guint32)events[i].stream + 1;
        if (events[i].kind == MEMSIM_EV_WAIT && events[i].id + 1 > need)
            need = (guint32)events[i].id + 1;
        if (need > r->n_streams) {
            if (r->stream_handles) { /* keep the handle array as long as the stream count */
                r->stream_handles = g_renew(uint64_t, r->stream_handles, need);
                for (guint32 k = r->n_streams; k < need; k++)
                    r->stream_handles[k] = 0;
            }
            r->n_streams = need;
        }
    }
}

void memsim_trace_append(MemsimTrace *t, guint32 rank, const MemsimEvent *events, gsize n)
{
    g_assert(rank < t->header.n_ranks);
    cover_streams(t, rank, events, n);
    g_array_append_vals(g_ptr_array_index(t->programs, rank), events, (guint)n);
}

void memsim_trace_append_array(MemsimTrace *t, guint32 rank, GArray *events)
{
    g_assert(rank < t->header.n_ranks);
    g_assert(g_array_get_element_size(events) == sizeof(MemsimEvent));
    cover_streams(t, rank, (const MemsimEvent *)events->data, events->len);
    GArray *program = g_ptr_array_index(t->programs, rank);
    if (program->len == 0 && t->sink && t->sink(t, rank, events, t->sink_user)) {
        g_array_unref(events);
        return;
    }
    if (program->len == 0) {
        t->programs->pdata[rank] = events; /* taken as it is: no copy */
        g_array_unref(program);
        return;
    }
    g_array_append_vals(program, events->data, events->len);
    g_array_unref(events);
}

const MemsimEvent *memsim_trace_events(MemsimTrace *t, guint32 rank, gsize *n_events)
{
    g_assert(rank < t->header.n_ranks);
    GArray *a = g_ptr_array_index(t->programs, rank);
    *n_events = a->len;
    return (const MemsimEvent *)a->data;
}

static const char *const kind_names[MEMSIM_EV_KIND_MAX + 1] = {
    [MEMSIM_EV_ALLOC] = "alloc",
    [MEMSIM_EV_FREE] = "free",
    [MEMSIM_EV_USE] = "use",
    [MEMSIM_EV_OP] = "op",
    [MEMSIM_EV_WAIT] = "wait",
    [MEMSIM_EV_COLLECTIVE] = "collective",
    [MEMSIM_EV_EMPTY_CACHE] = "empty_cache",
    [MEMSIM_EV_MARK] = "mark",
    [MEMSIM_EV_SEG_ALLOC] = "segment_alloc",
    [MEMSIM_EV_SEG_FREE] = "segment_free",
    [MEMSIM_EV_SEG_MAP] = "segment_map",
    [MEMSIM_EV_SEG_UNMAP] = "segment_unmap",
    [MEMSIM_EV_OOM] = "oom",
    [MEMSIM_EV_INIT_SEGMENT] = "init_segment",
    [MEMSIM_EV_INIT_BLOCK] = "init_block",
    [MEMSIM_EV_REPEAT] = "repeat",
};

static const char *const category_names[MEMSIM_CAT_COUNT] = {
    [MEMSIM_CAT_OTHER] = "other",
    [MEMSIM_CAT_PARAMETER] = "parameter",
    [MEMSIM_CAT_GRADIENT] = "gradient",
    [MEMSIM_CAT_OPTIMIZER_STATE] = "optimizer_state",
    [MEMSIM_CAT_ACTIVATION] = "activation",
    [MEMSIM_CAT_TEMPORARY] = "temporary",
    [MEMSIM_CAT_COMM_BUFFER] = "comm_buffer",
    [MEMSIM_CAT_INPUT] = "input",
    [MEMSIM_CAT_KV_CACHE] = "kv_cache",
};

static const char *const phase_names[MEMSIM_PHASE_COUNT] = {
    [MEMSIM_PHASE_OTHER] = "other",
    [MEMSIM_PHASE_FORWARD] = "forward",
    [MEMSIM_PHASE_BACKWARD] = "backward",
    [MEMSIM_PHASE_OPTIMIZER] = "optimizer",
    [MEMSIM_PHASE_COMMUNICATION] = "communication",
};
static const char *const bound_names[MEMSIM_BOUND_COUNT] = {
    [MEMSIM_BOUND_UNKNOWN] = "unknown", [MEMSIM_BOUND_COMPUTE] = "compute",
    [MEMSIM_BOUND_MEMORY] = "memory",   [MEMSIM_BOUND_LATENCY] = "latency",
    [MEMSIM_BOUND_HOST] = "host",
};

static const char *const collective_names[MEMSIM_COLL_COUNT] = {
    [MEMSIM_COLL_ALL_REDUCE] = "all_reduce",
    [MEMSIM_COLL_ALL_GATHER] = "all_gather",
    [MEMSIM_COLL_REDUCE_SCATTER] = "reduce_scatter",
    [MEMSIM_COLL_BROADCAST] = "broadcast",
    [MEMSIM_COLL_SEND] = "send",
    [MEMSIM_COLL_RECV] = "recv",
    [MEMSIM_COLL_ALL_TO_ALL] = "all_to_all",
};

#define NAME_OF(table, v) ((unsigned)(v) < G_N_ELEMENTS(table) && table[v] ? table[v] : "?")

const char *memsim_event_kind_name(MemsimEventKind k)
{
    return NAME_OF(kind_names, k);
}
const char *memsim_category_name(MemsimCategory c)
{
    return NAME_OF(category_names, c);
}
const char *memsim_phase_name(MemsimPhase p)
{
    return NAME_OF(phase_names, p);
}
const char *memsim_collective_name(MemsimCollectiveKind k)
{
    return NAME_OF(collective_names, k);
}
const char *memsim_op_bound_name(MemsimOpBound b)
{
    return NAME_OF(bound_names, b);
}

/* ---- marks ---- */

#define BREAKDOWN_PREFIX "breakdown:"

uint32_t memsim_step_marks(const MemsimTraceHeader *h, const MemsimEvent *ev, gsize n)
{
    uint32_t k = 0;
    for (gsize i = 0; i < n; i++)
        if (ev[i].kind == MEMSIM_EV_MARK && ev[i].id < h->n_strings &&
            memsim_mark_parse(h->strings[ev[i].id], NULL, NULL) == MEMSIM_MARK_STEP)
            k++;
    return k;
}

MemsimMarkKind memsim_mark_parse(const char *text, uint32_t *step, const char **name)
{
    if (g_str_has_prefix(text, BREAKDOWN_PREFIX)) {
        if (name)
            *name = text + strlen(BREAKDOWN_PREFIX);
        return MEMSIM_MARK_BREAKDOWN;
    }
    unsigned n;
    int used = 0;
    /* "step N" (or "step N begin") opens a step; other "step N ..." marks do not */
    if (sscanf(text, "step %u%n", &n, &used) == 1 &&
        (text[used] == '\0' || strcmp(text + used, " begin") == 0)) {
        if (step)
            *step = n;
        return MEMSIM_MARK_STEP;
    }
    return MEMSIM_MARK_LABEL;
}

char *memsim_mark_step(uint32_t step)
{
    return g_strdup_printf("step %u", step);
}

char *memsim_mark_breakdown(const char *name)
{
    return g_strconcat(BREAKDOWN_PREFIX, name, NULL);
}

static int lookup(const char *const *table, int n, const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < n; i++)
        if (table[i] && strcmp(table[i], name) == 0)
            return i;
    return -1;
}

int memsim_event_kind_from_name(const char *n)
{
    return lookup(kind_names, G_N_ELEMENTS(kind_names), n);
}
int memsim_category_from_name(const char *n)
{
    return lookup(category_names, G_N_ELEMENTS(category_names), n);
}
int memsim_phase_from_name(const char *n)
{
    return lookup(phase_names, G_N_ELEMENTS(phase_names), n);
}
int memsim_collective_from_name(const char *n)
{
    return lookup(collective_names, G_N_ELEMENTS(collective_names), n);
}
int memsim_op_bound_from_name(const char *n)
{
    return lookup(bound_names, G_N_ELEMENTS(bound_names), n);
}
