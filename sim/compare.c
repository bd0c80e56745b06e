/* Comparing allocator policies on one trace (include/memsim/sim.h, "Comparing policies").
 *
 * Each policy replays the same in-memory trace (loaded once) with the same options; the
 * `exact` policy on an unlimited device replays it too, as the lower bound that the peak
 * reserved bytes of the others are divided by. A policy that cannot replay the trace (it
 * cannot start from a recording's state, say) gets an error in its row; a trace that even
 * `exact` cannot replay is bad input and fails the whole comparison.
 */
#include <memsim/formats.h>
#include <memsim/sim.h>

#include <json-glib/json-glib.h>
#include <string.h>

#include "sim/export/json.h"
#include "sim/sites.h"

/* A token of the list starts a new policy when the part before its first ':' is a policy
 * name (or "all"); otherwise it continues the settings of the previous one, so that
 * "torch:expandable_segments=True,max_split_size_mb=128,bfc" is two policies. */
static gboolean starts_policy(const char *tok)
{
    const char *colon = strchr(tok, ':');
    g_autofree char *name = colon ? g_strndup(tok, (gsize)(colon - tok)) : g_strdup(tok);
    g_strstrip(name);
    return strcmp(name, "all") == 0 || memsim_alloc_find(name) != NULL;
}

static char *known_policies(void)
{
    GString *s = g_string_new(NULL);
    for (const MemsimAllocOps *const *p = memsim_alloc_registry(); *p; p++)
        g_string_append_printf(s, "%s%s", s->len ? ", " : "", (*p)->name);
    return g_string_free(s, FALSE);
}

char **memsim_compare_parse_specs(const char *list, GError **error)
{
    GPtrArray *specs = g_ptr_array_new_with_free_func(g_free);
    /* Split at ',' and ';' outside brackets (torch's [B:N,...] lists). */
    GPtrArray *toks = g_ptr_array_new_with_free_func(g_free);
    int depth = 0;
    const char *start = list ? list : "";
    for (const char *p = start;; p++) {
        if (*p == '[')
            depth++;
        else if (*p == ']' && depth > 0)
            depth--;
        if (*p == '\0' || ((*p == ',' || *p == ';') && depth == 0)) {
            char *t = g_strstrip(g_strndup(start, (gsize)(p - start)));
            if (*t)
                g_ptr_array_add(toks, t);
            else
                g_free(t);
            if (*p == '\0')
                break;
            start = p + 1;
        }
    }
    for (guint i = 0; i < toks->len; i++) {
        const char *t = toks->pdata[i];
        if (strcmp(t, "all") == 0) {
            for (const MemsimAllocOps *const *p = memsim_alloc_registry(); *p; p++)
                g_ptr_array_add(specs, g_strdup((*p)->name));
        } else if (starts_policy(t)) {
            g_ptr_array_add(specs, g_strdup(t));
        } else if (specs->len && strchr(specs->pdata[specs->len - 1], ':')) {
            char *prev = specs->pdata[specs->len - 1];
            specs->pdata[specs->len - 1] = g_strdup_printf("%s,%s", prev, t);
            g_free(prev);
        } else {
            g_autofree char *known = known_policies();
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "'%s' is not an allocator policy (known: %s, or all; settings follow "
                        "a name and a colon: bfc:allow_growth=false)",
                        t, known);
            g_ptr_array_unref(toks);
            g_ptr_array_unref(specs);
            return NULL;
        }
    }
    g_ptr_array_unref(toks);
    if (specs->len == 0) {
        g_autofree char *known = known_policies();
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "no allocator policy to compare (give a comma-separated list of: %s, or "
                    "all)",
                    known);
        g_ptr_array_unref(specs);
        return NULL;
    }
    g_ptr_array_add(specs, NULL);
    return (char **)g_ptr_array_free(specs, FALSE);
}

void memsim_comparison_free(MemsimComparison *c)
{
    if (!c)
        return;
    for (guint i = 0; i < c->n_runs; i++) {
        g_free(c->runs[i].spec);
        memsim_report_free(c->runs[i].report);
        g_free(c->runs[i].error);
    }
    g_free(c->runs);
    memsim_report_free(c->baseline);
    g_free(c->source);
    g_free(c);
}

MemsimComparison *memsim_compare_trace(MemsimTrace *trace, const char *const *specs,
                                       const MemsimReplayOptions *opt, GError **error)
{
    static const MemsimReplayOptions defaults = MEMSIM_REPLAY_OPTIONS_INIT;
    MemsimReplayOptions o = opt ? *opt : defaults;
    const MemsimTraceHeader *h = memsim_trace_header(trace);
    memsim_size_t capacity = o.capacity ? o.capacity : h->capacity;
    guint n = 0;
    while (specs && specs[n])
        n++;
    /* Bad settings are the user's mistake, not a property of one policy: refuse them first. */
    for (guint i = 0; i < n; i++) {
        MemsimDevice dev = MEMSIM_DEVICE_INIT;
        dev.capacity = capacity;
        GError *e = NULL;
        MemsimAlloc *a = memsim_alloc_new_from_spec(specs[i], &dev, &e);
        if (!a) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "allocator '%s': %s", specs[i],
                        e->message);
            g_error_free(e);
            return NULL;
        }
        memsim_alloc_free_instance(a);
    }
    MemsimReplayOptions base = o;
    base.allocator = "exact";
    base.capacity = G_MAXUINT64; /* unlimited, even when the trace names a capacity */
    base.verify = FALSE;
    MemsimReport *baseline = memsim_replay_trace(trace, &base, error);
    if (!baseline)
        return NULL;
    MemsimComparison *c = g_new0(MemsimComparison, 1);
    c->source = g_strdup(h->name ? h->name : "trace");
    c->capacity = capacity;
    c->baseline = baseline;
    c->n_runs = n;
    c->runs = g_new0(MemsimCompareRun, n ? n : 1);
    for (guint i = 0; i < n; i++) {
        MemsimCompareRun *r = &c->runs[i];
        r->spec = g_strdup(specs[i]);
        MemsimReplayOptions ro = o;
        ro.allocator = specs[i];
        ro.verify = FALSE;
        GError *e = NULL;
        r->report = memsim_replay_trace(trace, &ro, &e);
        if (!r->report) {
            r->error = g_strdup(e->message);
            g_error_free(e);
        }
    }
    return c;
}

MemsimComparison *memsim_compare_path(const char *path, const char *const *specs,
                                      const MemsimReplayOptions *opt, GError **error)
{
    MemsimTrace *t = memsim_trace_load(path, error);
    if (!t)
        return NULL;
    MemsimComparison *c = memsim_compare_trace(t, specs, opt, error);
    memsim_trace_free(t);
    return c;
}

void memsim_comparison_set_device(MemsimComparison *c, memsim_size_t gpu_mem,
                                  memsim_size_t context_bytes)
{
    for (guint i = 0; i < c->n_runs; i++)
        if (c->runs[i].report)
            memsim_report_set_device(c->runs[i].report, gpu_mem, context_bytes);
}

double memsim_comparison_vs_exact(const MemsimComparison *c, guint run, guint rank)
{
    const MemsimReport *r = run < c->n_runs ? c->runs[run].report : NULL;
    if (!r || rank >= r->n_ranks || rank >= c->baseline->n_ranks ||
        c->baseline->ranks[rank].stats.reserved.peak <= 0)
        return 0.0;
    return (double)r->ranks[rank].stats.reserved.peak /
           (double)c->baseline->ranks[rank].stats.reserved.peak;
}

/* ---------------------------------------------------------------------------------------- */
/* Output */

char *memsim_comparison_to_json(const MemsimComparison *c)
{
    JsonBuilder *b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "source");
    json_builder_add_string_value(b, c->source);
    json_builder_set_member_name(b, "capacity");
    if (c->capacity)
        json_builder_add_int_value(b, (int64_t)c->capacity);
    else
        json_builder_add_null_value(b);
    json_builder_set_member_name(b, "baseline");
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "allocator");
    json_builder_add_string_value(b, "exact");
    json_builder_set_member_name(b, "peak_reserved");
    json_builder_begin_array(b);
    for (guint k = 0; k < c->baseline->n_ranks; k++)
        json_builder_add_int_value(b, c->baseline->ranks[k].stats.reserved.peak);
    json_builder_end_array(b);
    json_builder_end_object(b);
    json_builder_set_member_name(b, "policies");
    json_builder_begin_array(b);
    for (guint i = 0; i < c->n_runs; i++) {
        const MemsimCompareRun *r = &c->runs[i];
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "allocator");
        json_builder_add_string_value(b, r->spec);
        json_builder_set_member_name(b, "error");
        if (r->error)
            json_builder_add_string_value(b, r->error);
        else
            json_builder_add_null_value(b);
        json_builder_set_member_name(b, "ranks");
        /* The rank entries exactly as a replay's JSON has them. */
        JsonNode *ranks = NULL;
        if (r->report) {
            g_autofree char *j = memsim_report_to_json(r->report);
            JsonParser *p = json_parser_new();
            if (json_parser_load_from_data(p, j, -1, NULL)) {
                JsonObject *o = json_node_get_object(json_parser_get_root(p));
                if (json_object_has_member(o, "ranks"))
                    ranks = json_node_copy(json_object_get_member(o, "ranks"));
            }
            g_object_unref(p);
        }
        if (ranks) {
            json_builder_add_value(b, ranks);
        } else {
            json_builder_begin_array(b);
            json_builder_end_array(b);
        }
        json_builder_set_member_name(b, "peak_reserved_vs_exact");
        json_builder_begin_array(b);
        for (guint k = 0; r->report && k < r->report->n_ranks; k++)
            json_builder_add_double_value(b, memsim_comparison_vs_exact(c, i, k));
        json_builder_end_array(b);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_end_object(b);
    return json_builder_finish(b, TRUE, NULL);
}

char *memsim_comparison_to_text(const MemsimComparison *c)
{
    GString *s = g_string_new(NULL);
    char b1[32], b2[32], b3[32], b4[32];
    g_string_append_printf(s, "source:    %s\n", c->source);
    /* without --gpu-mem, a rank's recorded capacity (a snapshot's OOM) is its device */
    GString *recorded = g_string_new(NULL);
    for (guint k = 0; !c->capacity && c->n_runs && k < c->baseline->n_ranks; k++)
        for (guint i = 0; i < c->n_runs; i++)
            if (c->runs[i].report && k < c->runs[i].report->n_ranks &&
                c->runs[i].report->ranks[k].capacity) {
                g_string_append_printf(
                    recorded, "%srank %u: %s", recorded->len ? ", " : "",
                    c->runs[i].report->ranks[k].rank,
                    memsim_format_bytes(c->runs[i].report->ranks[k].capacity, b1, sizeof b1));
                break;
            }
    if (c->capacity)
        g_string_append_printf(s, "device:    %s for the allocator\n",
                               memsim_format_bytes(c->capacity, b1, sizeof b1));
    else if (recorded->len)
        g_string_append_printf(s, "device:    as recorded at its OOM (%s), other ranks "
                                  "unlimited\n", recorded->str);
    else
        g_string_append(s, "device:    unlimited (give --gpu-mem to see who runs out)\n");
    g_string_free(recorded, TRUE);
    int width = 10;
    gboolean multi = c->baseline->n_ranks > 1;
    for (guint i = 0; i < c->n_runs; i++) {
        int w = (int)strlen(c->runs[i].spec) + (multi ? 9 : 0);
        if (w > width)
            width = w;
    }
    g_string_append_printf(s, "\n%-*s %14s %14s %11s %11s %13s %8s  %s\n", width, "policy",
                           "peak reserved", "peak alloc.", "rounding", "holes", "driver a / f",
                           "x exact", "out of memory");
    for (guint i = 0; i < c->n_runs; i++) {
        const MemsimCompareRun *r = &c->runs[i];
        if (!r->report) {
            g_string_append_printf(s, "%-*s cannot replay this trace: %s\n", width, r->spec,
                                   r->error);
            continue;
        }
        for (guint k = 0; k < r->report->n_ranks; k++) {
            const MemsimRankReport *x = &r->report->ranks[k];
            g_autofree char *label =
                multi ? g_strdup_printf("%s [rank %u]", r->spec, x->rank) : g_strdup(r->spec);
            memsim_size_t reserved = (memsim_size_t)x->stats.reserved.peak;
            memsim_size_t alloc_at = x->at_peak_reserved_allocated;
            memsim_size_t req_at = x->at_peak_reserved_requested;
            g_autofree char *drv = g_strdup_printf("%" G_GUINT64_FORMAT " / %" G_GUINT64_FORMAT,
                                                   x->stats.n_device_alloc, x->stats.n_device_free);
            /* A run cut short by an OOM has no comparable peak. */
            double ratio = x->oom.happened ? 0.0 : memsim_comparison_vs_exact(c, i, k);
            g_autofree char *rs = ratio > 0 ? g_strdup_printf("%.3f", ratio) : g_strdup("-");
            g_autofree char *oom = NULL;
            if (x->oom.happened)
                oom = g_strdup_printf("event %" G_GUINT64_FORMAT ": %s requested, %s free",
                                      x->oom.event_index,
                                      memsim_format_bytes(x->oom.rounded, b1, sizeof b1),
                                      memsim_format_bytes(x->oom.device_free, b2, sizeof b2));
            else if (x->oom_verdict.replayed && !x->oom_verdict.fits)
                oom = g_strdup_printf("event %" G_GUINT64_FORMAT " (the recorded OOM): short "
                                      "by %s",
                                      x->oom_verdict.event_index,
                                      memsim_format_bytes(x->oom_verdict.margin, b1, sizeof b1));
            else if (!x->fits)
                oom = g_strdup("no, but the device total exceeds --gpu-mem");
            else
                oom = g_strdup("-");
            g_string_append_printf(
                s, "%-*s %14s %14s %11s %11s %13s %8s  %s\n", width, label,
                memsim_format_bytes(reserved, b1, sizeof b1),
                memsim_format_bytes((memsim_size_t)x->stats.allocated.peak, b2, sizeof b2),
                memsim_format_bytes(alloc_at > req_at ? alloc_at - req_at : 0, b3, sizeof b3),
                memsim_format_bytes(reserved > alloc_at ? reserved - alloc_at : 0, b4, sizeof b4),
                drv, rs, oom);
        }
    }
    /* The recording's own OOM, replayed under each policy. */
    gboolean any = FALSE;
    for (guint i = 0; i < c->n_runs; i++) {
        const MemsimReport *rep = c->runs[i].report;
        for (guint k = 0; rep && k < rep->n_ranks; k++) {
            const MemsimRankReport *x = &rep->ranks[k];
            const MemsimOomVerdict *v = &x->oom_verdict;
            if (!v->replayed)
                continue;
            if (!any)
                g_string_append_printf(s, "\nThe recorded OOM (%s requested) replayed as the "
                                          "allocation it was, per policy:\n",
                                       memsim_format_bytes(v->rounded, b1, sizeof b1));
            any = TRUE;
            g_autofree char *label = multi ? g_strdup_printf("%s [rank %u]", c->runs[i].spec,
                                                             x->rank)
                                           : g_strdup(c->runs[i].spec);
            if (v->fits)
                g_string_append_printf(s, "%-*s event %" G_GUINT64_FORMAT " on %s: fits, %s "
                                          "left free on the device",
                                       width, label, v->event_index,
                                       memsim_format_bytes(v->capacity, b1, sizeof b1),
                                       memsim_format_bytes(v->margin, b2, sizeof b2));
            else
                g_string_append_printf(s, "%-*s event %" G_GUINT64_FORMAT " on %s: does not fit, "
                                          "short by %s; %s free in cached blocks, short by %s "
                                          "even if all were usable",
                                       width, label, v->event_index,
                                       memsim_format_bytes(v->capacity, b1, sizeof b1),
                                       memsim_format_bytes(v->margin, b2, sizeof b2),
                                       memsim_format_bytes(v->cached_free, b3, sizeof b3),
                                       memsim_format_bytes(v->short_packed, b4, sizeof b4));
            if (x->oom.happened)
                g_string_append_printf(s, "; next failure at event %" G_GUINT64_FORMAT "\n",
                                       x->oom.event_index);
            else
                g_string_append(s, "; no further failure\n");
        }
    }
    /* Who holds the memory (snapshots, whose allocations name their site): at the peak of
     * allocated bytes, shown once when every policy that reaches it has the same sites, and
     * at each policy's OOM. */
    for (guint k = 0; k < c->baseline->n_ranks; k++) {
        const MemsimRankReport *first = NULL;
        gboolean same = TRUE;
        for (guint i = 0; i < c->n_runs; i++) {
            const MemsimReport *rep = c->runs[i].report;
            if (!rep || k >= rep->n_ranks || !rep->ranks[k].n_sites_at_peak)
                continue;
            const MemsimRankReport *x = &rep->ranks[k];
            if (!first) {
                first = x;
                continue;
            }
            same = same && x->n_sites_at_peak == first->n_sites_at_peak;
            for (uint32_t j = 0; same && j < x->n_sites_at_peak; j++)
                same = x->sites_at_peak[j].bytes == first->sites_at_peak[j].bytes &&
                       x->sites_at_peak[j].count == first->sites_at_peak[j].count &&
                       strcmp(x->sites_at_peak[j].site, first->sites_at_peak[j].site) == 0;
        }
        if (!first)
            continue;
        g_autofree char *rank = multi ? g_strdup_printf(" [rank %u]", first->rank) : g_strdup("");
        if (same) {
            g_autofree char *what = g_strdup_printf("at the peak (event %" G_GUINT64_FORMAT
                                                    ")%s, under every policy",
                                                    first->peak_allocated_event, rank);
            g_string_append_c(s, '\n');
            report_text_sites(s, what, first->sites_at_peak, first->n_sites_at_peak);
        }
        for (guint i = 0; i < c->n_runs; i++) {
            const MemsimReport *rep = c->runs[i].report;
            if (!rep || k >= rep->n_ranks)
                continue;
            const MemsimRankReport *x = &rep->ranks[k];
            if (!same && x->n_sites_at_peak) {
                g_autofree char *what = g_strdup_printf("at the peak (event %" G_GUINT64_FORMAT
                                                        ")%s under %s",
                                                        x->peak_allocated_event, rank,
                                                        c->runs[i].spec);
                g_string_append_c(s, '\n');
                report_text_sites(s, what, x->sites_at_peak, x->n_sites_at_peak);
            }
            if (x->n_sites_at_oom) {
                g_autofree char *what = g_strdup_printf("at the OOM (event %" G_GUINT64_FORMAT
                                                        ")%s under %s",
                                                        x->sites_oom_event, rank,
                                                        c->runs[i].spec);
                g_string_append_c(s, '\n');
                report_text_sites(s, what, x->sites_at_oom, x->n_sites_at_oom);
            }
        }
    }
    g_string_append(s, "\nAt the moment of peak reserved: rounding = allocated - requested "
                       "(inside blocks), holes = reserved - allocated (free cached memory).\n"
                       "driver a / f = the policy's allocations and frees of device memory; "
                       "x exact = peak reserved / that of `exact`\n(no caching, 512-byte "
                       "rounding) on an unlimited device.\n");
    return g_string_free(s, FALSE);
}
