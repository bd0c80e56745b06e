/* The timeline as CSV (include/memsim/export.h): one row per bucket, RFC 4180 quoting. */
#include <memsim/export.h>

#include <inttypes.h>
#include <string.h>

#include "sim/export/outfile.h"

static void csv_string(MemsimOutFile *o, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) {
        memsim_out_write(o, s, strlen(s));
        return;
    }
    memsim_out_write(o, "\"", 1);
    for (const char *p = s; *p; p++) {
        if (*p == '"')
            memsim_out_write(o, "\"", 1);
        memsim_out_write(o, p, 1);
    }
    memsim_out_write(o, "\"", 1);
}

gboolean memsim_export_timeline_csv(const MemsimTimeline *tl, const char *path, GError **error)
{
    MemsimOutFile o;
    if (!memsim_out_open(&o, path, error))
        return FALSE;
    memsim_out_printf(&o, "rank,event,op,phase,allocated,reserved");
    for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
        memsim_out_printf(&o, ",%s", memsim_category_name(c));
    memsim_out_printf(&o, ",event_first,event_last,allocated_min,reserved_min,samples\n");
    for (guint i = 0; i < memsim_timeline_n_ranks(tl); i++) {
        const MemsimTimelineRank *r = memsim_timeline_rank(tl, i);
        for (gsize k = 0; k < r->n_samples; k++) {
            const MemsimTimelineSample *s = &r->samples[k];
            memsim_out_printf(&o, "%u,%" PRIu64 ",", r->device, s->event_at_max);
            csv_string(&o, memsim_timeline_op_name(tl, s->op_at_max));
            memsim_out_printf(&o, ",%s,%" PRId64 ",%" PRId64,
                              s->op_at_max >= 0
                                  ? memsim_phase_name(memsim_timeline_op_phase(tl, s->op_at_max))
                                  : "",
                              s->allocated_max, s->reserved_max);
            for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
                memsim_out_printf(&o, ",%" PRId64, s->by_category[c]);
            memsim_out_printf(&o, ",%" PRIu64 ",%" PRIu64 ",%" PRId64 ",%" PRId64 ",%u\n",
                              s->event_first, s->event_last, s->allocated_min, s->reserved_min,
                              s->n_samples);
        }
    }
    return memsim_out_close(&o, error);
}
