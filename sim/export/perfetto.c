/* The timeline as Chrome trace-event JSON, which ui.perfetto.dev and chrome://tracing load
 * (include/memsim/export.h). Format: the "Trace Event Format" document (JSON object form,
 * {"traceEvents": [...]}); ts and dur are in microseconds.
 *
 * A counter value is a step that holds until the next one. Each timeline bucket gives one
 * step at its first event, with the bucket's maximum: exact while the buckets hold one sample
 * each, the upper envelope once they have merged (the peak is never lower than shown).
 */
#include <memsim/export.h>

#include <json-glib/json-glib.h>
#include <string.h>

#include "sim/export/outfile.h"
#include "sim/export/json.h"

static void member_int(JsonBuilder *b, const char *key, int64_t v)
{
    json_builder_set_member_name(b, key);
    json_builder_add_int_value(b, v);
}

static void member_str(JsonBuilder *b, const char *key, const char *v)
{
    json_builder_set_member_name(b, key);
    json_builder_add_string_value(b, v);
}

static void member_ts(JsonBuilder *b, const char *key, gboolean has_time, double time_us,
                      uint64_t event)
{
    json_builder_set_member_name(b, key);
    if (has_time)
        json_builder_add_double_value(b, time_us);
    else
        json_builder_add_int_value(b, (int64_t)event);
}

static void begin_event(JsonBuilder *b, const char *ph, const char *name, uint32_t pid,
                        uint32_t tid)
{
    json_builder_begin_object(b);
    member_str(b, "ph", ph);
    member_str(b, "name", name);
    member_int(b, "pid", pid);
    member_int(b, "tid", tid);
}

static void metadata(JsonBuilder *b, const char *what, uint32_t pid, uint32_t tid,
                     const char *name)
{
    begin_event(b, "M", what, pid, tid);
    json_builder_set_member_name(b, "args");
    json_builder_begin_object(b);
    member_str(b, "name", name);
    json_builder_end_object(b);
    json_builder_end_object(b);
}

static void counter(JsonBuilder *b, const char *name, uint32_t pid, const MemsimTimelineRank *r,
                    double time_us, uint64_t event, const char *key, int64_t v)
{
    begin_event(b, "C", name, pid, 0);
    member_ts(b, "ts", r->has_time, time_us, event);
    json_builder_set_member_name(b, "args");
    json_builder_begin_object(b);
    member_int(b, key, v);
    json_builder_end_object(b);
    json_builder_end_object(b);
}

static void instant(JsonBuilder *b, const MemsimTimeline *tl, const MemsimTimelineRank *r,
                    const char *name, const MemsimTimelinePoint *p, gboolean oom)
{
    begin_event(b, "i", name, r->device, 0);
    member_str(b, "s", "p");
    member_ts(b, "ts", r->has_time, p->time_us, p->event);
    json_builder_set_member_name(b, "args");
    json_builder_begin_object(b);
    member_int(b, "event", (int64_t)p->event);
    member_str(b, "op", memsim_timeline_op_name(tl, p->op));
    member_int(b, "allocated", p->allocated);
    member_int(b, "reserved", p->reserved);
    if (oom)
        member_int(b, "requested", (int64_t)p->requested);
    else
        for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
            if (p->by_category[c])
                member_int(b, memsim_category_name(c), p->by_category[c]);
    json_builder_end_object(b);
    json_builder_end_object(b);
}

gboolean memsim_export_perfetto(const MemsimTimeline *tl, const char *path, GError **error)
{
    JsonBuilder *b = json_builder_new();
    json_builder_begin_object(b);
    member_str(b, "displayTimeUnit", "ms");
    json_builder_set_member_name(b, "otherData");
    json_builder_begin_object(b);
    member_str(b, "source", memsim_timeline_source(tl));
    member_str(b, "allocator", memsim_timeline_allocator(tl));
    member_int(b, "capacity", (int64_t)memsim_timeline_capacity(tl));
    json_builder_end_object(b);
    json_builder_set_member_name(b, "traceEvents");
    json_builder_begin_array(b);
    for (guint i = 0; i < memsim_timeline_n_ranks(tl); i++) {
        const MemsimTimelineRank *r = memsim_timeline_rank(tl, i);
        uint32_t pid = r->device;
        g_autofree char *pname =
            r->role ? g_strdup_printf("rank %u (%s)", r->device, r->role)
                    : g_strdup_printf("rank %u", r->device);
        metadata(b, "process_name", pid, 0, pname);
        for (uint32_t s = 0; s < MAX(r->n_streams, 1u); s++) {
            g_autofree char *tname = g_strdup_printf("stream %u", s);
            metadata(b, "thread_name", pid, s, tname);
        }
        gboolean present[MEMSIM_CAT_COUNT] = {FALSE};
        for (gsize k = 0; k < r->n_samples; k++)
            for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
                if (r->samples[k].by_category[c])
                    present[c] = TRUE;
        for (gsize k = 0; k < r->n_samples; k++) {
            const MemsimTimelineSample *s = &r->samples[k];
            counter(b, "allocated", pid, r, s->time_first_us, s->event_first, "bytes",
                    s->allocated_max);
            counter(b, "reserved", pid, r, s->time_first_us, s->event_first, "bytes",
                    s->reserved_max);
            begin_event(b, "C", "by category", pid, 0);
            member_ts(b, "ts", r->has_time, s->time_first_us, s->event_first);
            json_builder_set_member_name(b, "args");
            json_builder_begin_object(b);
            for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
                if (present[c])
                    member_int(b, memsim_category_name(c), s->by_category[c]);
            json_builder_end_object(b);
            json_builder_end_object(b);
        }
        for (gsize k = 0; k < r->n_slices; k++) {
            const MemsimTimelineSlice *sl = &r->slices[k];
            const char *op = memsim_timeline_op_name(tl, sl->op);
            g_autofree char *name = sl->n_ops > 1
                                        ? g_strdup_printf("%s (+%u ops)", *op ? op : "?",
                                                          sl->n_ops - 1)
                                        : g_strdup(*op ? op : "?");
            begin_event(b, "X", name, pid, sl->stream);
            member_str(b, "cat",
                       memsim_phase_name(sl->n_ops > 1 ? MEMSIM_PHASE_OTHER
                                                       : memsim_timeline_op_phase(tl, sl->op)));
            if (r->has_time) {
                member_ts(b, "ts", TRUE, sl->time_first_us, 0);
                json_builder_set_member_name(b, "dur");
                json_builder_add_double_value(b, MAX(sl->time_last_us - sl->time_first_us, 0.0));
            } else {
                member_ts(b, "ts", FALSE, 0, sl->event_first);
                member_int(b, "dur", (int64_t)(sl->event_last - sl->event_first + 1));
            }
            json_builder_set_member_name(b, "args");
            json_builder_begin_object(b);
            member_int(b, "first_event", (int64_t)sl->event_first);
            member_int(b, "ops", sl->n_ops);
            member_int(b, "max_allocated", sl->allocated_max);
            json_builder_end_object(b);
            json_builder_end_object(b);
        }
        if (r->has_peak) {
            instant(b, tl, r, "peak allocated", &r->peak_allocated, FALSE);
            instant(b, tl, r, "peak reserved", &r->peak_reserved, FALSE);
        }
        if (r->oom)
            instant(b, tl, r, "out of memory", &r->oom_point, TRUE);
    }
    json_builder_end_array(b);
    json_builder_end_object(b);

    gsize len = 0;
    char *text = json_builder_finish(b, FALSE, &len);
    MemsimOutFile o;
    gboolean ok = memsim_out_open(&o, path, error);
    if (ok) {
        memsim_out_write(&o, text, len);
        memsim_out_write(&o, "\n", 1);
        ok = memsim_out_close(&o, error);
    }
    g_free(text);
    return ok;
}
