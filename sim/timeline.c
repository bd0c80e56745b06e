/* The memory timeline of a replay (include/memsim/timeline.h).
 *
 * Downsampling by pairwise merging: a rank holds at most K buckets, each covering `width`
 * consecutive samples. A sample joins the last bucket while it has fewer than `width`
 * samples, else opens a new bucket; when all K are in use, buckets 2j and 2j+1 merge into j
 * and `width` doubles. Every bucket keeps min, max and the moment of the max, so the
 * envelope and the peak survive any number of merges; each sample costs O(1) amortised
 * (a merge pass over K buckets happens once every K/2 new buckets). Op slices use the same
 * scheme per stream, one op per slot until the first merge.
 */
#include <memsim/timeline.h>

#include <string.h>

#define DEFAULT_BUCKETS 4096

typedef struct {
    GArray *slices; /* MemsimTimelineSlice, at most K */
    uint64_t width; /* ops per slot */
    MemsimTimelineSlice open;
    gboolean has_open;
} StreamSlices;

typedef struct {
    MemsimTimelineRank pub;
    GArray *samples; /* MemsimTimelineSample, at most K */
    uint64_t width;  /* samples per bucket */
    GArray *streams; /* StreamSlices by stream index */
    GArray *flat;    /* MemsimTimelineSlice: every stream's slices, built by end() */
    uint32_t cur_stream; /* stream of the running op */
    double clock_us;     /* the latest end of an op's work: the simulated time of samples */
    gboolean ended;
} RankTL;

typedef struct {
    const char *name;
    uint8_t phase;
} OpName;

struct MemsimTimeline {
    guint k;
    char *source;
    char *allocator;
    memsim_size_t capacity;
    guint n_ranks;
    RankTL *ranks;
    GArray *ops; /* OpName by op index, filled up to the highest op seen */
    GStringChunk *strings;
};

MemsimTimeline *memsim_timeline_new(guint max_buckets)
{
    MemsimTimeline *tl = g_new0(MemsimTimeline, 1);
    guint k = max_buckets ? max_buckets : DEFAULT_BUCKETS;
    if (k < 16)
        k = 16;
    tl->k = (k + 1) & ~1u;
    tl->ops = g_array_new(FALSE, TRUE, sizeof(OpName));
    tl->strings = g_string_chunk_new(4096);
    return tl;
}

static void clear_ranks(MemsimTimeline *tl)
{
    for (guint i = 0; i < tl->n_ranks; i++) {
        RankTL *r = &tl->ranks[i];
        g_array_unref(r->samples);
        for (guint s = 0; s < r->streams->len; s++)
            g_array_unref(g_array_index(r->streams, StreamSlices, s).slices);
        g_array_unref(r->streams);
        if (r->flat)
            g_array_unref(r->flat);
        g_free(r->pub.role);
    }
    g_free(tl->ranks);
    tl->ranks = NULL;
    tl->n_ranks = 0;
}

void memsim_timeline_free(MemsimTimeline *tl)
{
    if (!tl)
        return;
    clear_ranks(tl);
    g_array_unref(tl->ops);
    g_string_chunk_free(tl->strings);
    g_free(tl->source);
    g_free(tl->allocator);
    g_free(tl);
}

void memsim_timeline_begin(MemsimTimeline *tl, const MemsimTraceHeader *h, const char *allocator,
                           memsim_size_t capacity)
{
    clear_ranks(tl);
    g_array_set_size(tl->ops, 0);
    g_free(tl->source);
    g_free(tl->allocator);
    tl->source = g_strdup(h->name ? h->name : "");
    tl->allocator = g_strdup(allocator ? allocator : "");
    tl->capacity = capacity;
    tl->n_ranks = h->n_ranks;
    tl->ranks = g_new0(RankTL, h->n_ranks ? h->n_ranks : 1);
    for (guint i = 0; i < h->n_ranks; i++) {
        RankTL *r = &tl->ranks[i];
        r->pub.device = h->ranks[i].device;
        r->pub.multiplicity = h->ranks[i].multiplicity;
        r->pub.role = g_strdup(h->ranks[i].role);
        r->pub.peak_allocated.op = r->pub.peak_reserved.op = r->pub.oom_point.op = -1;
        r->pub.peak_allocated.allocated = r->pub.peak_reserved.reserved = -1;
        r->samples = g_array_sized_new(FALSE, TRUE, sizeof(MemsimTimelineSample), tl->k);
        r->width = 1;
        r->streams = g_array_new(FALSE, TRUE, sizeof(StreamSlices));
    }
}

/* Names ops up to `op` from the header (the op table only grows). */
static void name_ops(MemsimTimeline *tl, const MemsimTraceHeader *h, int64_t op)
{
    if (op < 0 || (guint64)op < tl->ops->len || (guint64)op >= h->n_ops)
        return;
    guint from = tl->ops->len;
    g_array_set_size(tl->ops, (guint)op + 1);
    for (guint i = from; i <= (guint)op; i++) {
        const MemsimOpInfo *o = &h->ops[i];
        OpName *n = &g_array_index(tl->ops, OpName, i);
        n->name = g_string_chunk_insert_const(
            tl->strings, o->name < h->n_strings && h->strings[o->name] ? h->strings[o->name] : "?");
        n->phase = o->phase < MEMSIM_PHASE_COUNT ? o->phase : MEMSIM_PHASE_OTHER;
    }
}

static void merge_sample(MemsimTimelineSample *a, const MemsimTimelineSample *b)
{
    a->event_last = b->event_last;
    a->time_last_us = b->time_last_us;
    if (b->allocated_max > a->allocated_max) {
        a->allocated_max = b->allocated_max;
        a->event_at_max = b->event_at_max;
        a->time_at_max_us = b->time_at_max_us;
        a->op_at_max = b->op_at_max;
        memcpy(a->by_category, b->by_category, sizeof a->by_category);
    }
    a->allocated_min = MIN(a->allocated_min, b->allocated_min);
    a->reserved_min = MIN(a->reserved_min, b->reserved_min);
    a->reserved_max = MAX(a->reserved_max, b->reserved_max);
    a->n_samples += b->n_samples;
}

static void set_point(MemsimTimelinePoint *p, uint64_t event, double time, int64_t op,
                      int64_t allocated, int64_t reserved, const int64_t *by_category)
{
    p->event = event;
    p->time_us = time;
    p->op = op;
    p->allocated = allocated;
    p->reserved = reserved;
    if (by_category)
        memcpy(p->by_category, by_category, sizeof p->by_category);
}

static void slice_merge(MemsimTimelineSlice *a, const MemsimTimelineSlice *b)
{
    a->event_last = b->event_last;
    a->time_last_us = b->time_last_us;
    if (b->allocated_max > a->allocated_max) {
        a->allocated_max = b->allocated_max;
        a->op = b->op;
    }
    a->n_ops += b->n_ops;
}

void memsim_timeline_sample(MemsimTimeline *tl, const MemsimTraceHeader *h, guint32 rank,
                            uint64_t event, double time_us, int64_t op, int64_t allocated,
                            int64_t reserved, const int64_t *by_category)
{
    g_return_if_fail(rank < tl->n_ranks);
    RankTL *r = &tl->ranks[rank];
    double now = MAX(time_us, r->clock_us);
    if (op >= 0 && (guint64)op >= tl->ops->len)
        name_ops(tl, h, op);
    if (allocated > r->pub.peak_allocated.allocated) {
        set_point(&r->pub.peak_allocated, event, now, op, allocated, reserved, by_category);
        r->pub.has_peak = TRUE;
    }
    if (reserved > r->pub.peak_reserved.reserved)
        set_point(&r->pub.peak_reserved, event, now, op, allocated, reserved, by_category);
    if (r->cur_stream < r->streams->len) {
        StreamSlices *ss = &g_array_index(r->streams, StreamSlices, r->cur_stream);
        if (ss->has_open && allocated > ss->open.allocated_max)
            ss->open.allocated_max = allocated;
    }

    GArray *a = r->samples;
    if (a->len) {
        MemsimTimelineSample *last = &g_array_index(a, MemsimTimelineSample, a->len - 1);
        if (last->n_samples < r->width) {
            last->event_last = event;
            last->time_last_us = now;
            if (allocated > last->allocated_max) {
                last->allocated_max = allocated;
                last->event_at_max = event;
                last->time_at_max_us = now;
                last->op_at_max = op;
                memcpy(last->by_category, by_category, sizeof last->by_category);
            }
            last->allocated_min = MIN(last->allocated_min, allocated);
            last->reserved_min = MIN(last->reserved_min, reserved);
            last->reserved_max = MAX(last->reserved_max, reserved);
            last->n_samples++;
            return;
        }
    }
    if (a->len == tl->k) {
        MemsimTimelineSample *s = (MemsimTimelineSample *)a->data;
        for (guint j = 0; j < tl->k / 2; j++) {
            s[j] = s[2 * j];
            merge_sample(&s[j], &s[2 * j + 1]);
        }
        g_array_set_size(a, tl->k / 2);
        r->width *= 2;
    }
    MemsimTimelineSample s = {
        .event_first = event,
        .event_last = event,
        .time_first_us = now,
        .time_last_us = now,
        .event_at_max = event,
        .time_at_max_us = now,
        .op_at_max = op,
        .allocated_min = allocated,
        .allocated_max = allocated,
        .reserved_min = reserved,
        .reserved_max = reserved,
        .n_samples = 1,
    };
    memcpy(s.by_category, by_category, sizeof s.by_category);
    g_array_append_val(a, s);
}

static void push_slice(MemsimTimeline *tl, StreamSlices *ss)
{
    GArray *a = ss->slices;
    if (a->len) {
        MemsimTimelineSlice *last = &g_array_index(a, MemsimTimelineSlice, a->len - 1);
        if (last->n_ops < ss->width) {
            slice_merge(last, &ss->open);
            ss->has_open = FALSE;
            return;
        }
    }
    if (a->len == tl->k) {
        MemsimTimelineSlice *s = (MemsimTimelineSlice *)a->data;
        for (guint j = 0; j < tl->k / 2; j++) {
            s[j] = s[2 * j];
            slice_merge(&s[j], &s[2 * j + 1]);
        }
        g_array_set_size(a, tl->k / 2);
        ss->width *= 2;
    }
    g_array_append_val(a, ss->open);
    ss->has_open = FALSE;
}

void memsim_timeline_op(MemsimTimeline *tl, const MemsimTraceHeader *h, guint32 rank,
                        uint64_t event, int64_t op, uint32_t stream, double start_us,
                        double end_us)
{
    g_return_if_fail(rank < tl->n_ranks);
    RankTL *r = &tl->ranks[rank];
    if (op >= 0 && (guint64)op >= tl->ops->len)
        name_ops(tl, h, op);
    if (end_us > start_us)
        r->pub.has_time = TRUE;
    if (MAX(end_us, start_us) > r->clock_us)
        r->clock_us = MAX(end_us, start_us);
    if (stream >= r->streams->len) {
        guint from = r->streams->len;
        g_array_set_size(r->streams, stream + 1);
        for (guint s = from; s <= stream; s++) {
            StreamSlices *ss = &g_array_index(r->streams, StreamSlices, s);
            ss->slices = g_array_new(FALSE, TRUE, sizeof(MemsimTimelineSlice));
            ss->width = 1;
        }
        r->pub.n_streams = r->streams->len;
    }
    StreamSlices *ss = &g_array_index(r->streams, StreamSlices, stream);
    if (ss->has_open) {
        ss->open.event_last = event > ss->open.event_first ? event - 1 : event;
        push_slice(tl, ss);
    }
    MemsimTimelineSlice s = {
        .event_first = event,
        .event_last = event,
        .time_first_us = start_us,
        .time_last_us = MAX(end_us, start_us),
        .op = op,
        .n_ops = 1,
        .stream = stream,
        .allocated_max = 0,
    };
    ss->open = s;
    ss->has_open = TRUE;
    r->cur_stream = stream;
}

void memsim_timeline_oom(MemsimTimeline *tl, const MemsimTraceHeader *h, guint32 rank,
                         uint64_t event, double time_us, int64_t op, memsim_size_t requested,
                         int64_t allocated, int64_t reserved, const int64_t *by_category)
{
    g_return_if_fail(rank < tl->n_ranks);
    RankTL *r = &tl->ranks[rank];
    if (op >= 0 && (guint64)op >= tl->ops->len)
        name_ops(tl, h, op);
    if (r->pub.oom)
        return;
    r->pub.oom = TRUE;
    set_point(&r->pub.oom_point, event, MAX(time_us, r->clock_us), op, allocated, reserved,
              by_category);
    r->pub.oom_point.requested = requested;
}

void memsim_timeline_end(MemsimTimeline *tl, guint32 rank, uint64_t n_events)
{
    g_return_if_fail(rank < tl->n_ranks);
    RankTL *r = &tl->ranks[rank];
    r->pub.n_events = n_events;
    if (r->flat)
        g_array_unref(r->flat);
    r->flat = g_array_new(FALSE, FALSE, sizeof(MemsimTimelineSlice));
    for (guint s = 0; s < r->streams->len; s++) {
        StreamSlices *ss = &g_array_index(r->streams, StreamSlices, s);
        if (ss->has_open) {
            ss->open.event_last = MAX(n_events ? n_events - 1 : 0, ss->open.event_first);
            push_slice(tl, ss);
        }
        g_array_append_vals(r->flat, ss->slices->data, ss->slices->len);
    }
    r->pub.end_us = r->clock_us;
    if (r->samples->len)
        r->pub.end_us = MAX(r->pub.end_us, g_array_index(r->samples, MemsimTimelineSample,
                                                         r->samples->len - 1).time_last_us);
    if (r->pub.oom)
        r->pub.end_us = MAX(r->pub.end_us, r->pub.oom_point.time_us);
    if (!r->pub.has_time)
        r->pub.end_us = 0;
    r->ended = TRUE;
}

guint memsim_timeline_n_ranks(const MemsimTimeline *tl)
{
    return tl->n_ranks;
}

const MemsimTimelineRank *memsim_timeline_rank(const MemsimTimeline *tl, guint rank)
{
    g_return_val_if_fail(rank < tl->n_ranks, NULL);
    RankTL *r = &tl->ranks[rank];
    r->pub.n_samples = r->samples->len;
    r->pub.samples = (const MemsimTimelineSample *)r->samples->data;
    r->pub.n_slices = r->flat ? r->flat->len : 0;
    r->pub.slices = r->flat ? (const MemsimTimelineSlice *)r->flat->data : NULL;
    return &r->pub;
}

const char *memsim_timeline_op_name(const MemsimTimeline *tl, int64_t op)
{
    if (op < 0 || (guint64)op >= tl->ops->len)
        return "";
    const char *n = g_array_index(tl->ops, OpName, op).name;
    return n ? n : "";
}

MemsimPhase memsim_timeline_op_phase(const MemsimTimeline *tl, int64_t op)
{
    if (op < 0 || (guint64)op >= tl->ops->len)
        return MEMSIM_PHASE_OTHER;
    return (MemsimPhase)g_array_index(tl->ops, OpName, op).phase;
}

const char *memsim_timeline_source(const MemsimTimeline *tl)
{
    return tl->source ? tl->source : "";
}

const char *memsim_timeline_allocator(const MemsimTimeline *tl)
{
    return tl->allocator ? tl->allocator : "";
}

memsim_size_t memsim_timeline_capacity(const MemsimTimeline *tl)
{
    return tl->capacity;
}
