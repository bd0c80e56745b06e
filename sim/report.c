/* Reports: freeing them, judging them on a device (memsim_device_capacity,
 * memsim_report_set_device), the JSON every command shares, and the human-readable table. */
#include "sim/sites.h"
#include <memsim/sim.h>

#include <inttypes.h>
#include <string.h>
#include <json-glib/json-glib.h>

#include "sim/export/json.h"

void memsim_report_free(MemsimReport *rep)
{
    if (!rep)
        return;
    for (guint i = 0; i < rep->n_ranks; i++) {
        g_free(rep->ranks[i].role);
        g_free(rep->ranks[i].first_mismatch);
        g_free(rep->ranks[i].steps);
        g_free(rep->ranks[i].breakdowns);
        for (guint k = 0; k < rep->ranks[i].n_sites_at_peak; k++)
            g_free(rep->ranks[i].sites_at_peak[k].site);
        g_free(rep->ranks[i].sites_at_peak);
        for (guint k = 0; k < rep->ranks[i].n_sites_at_oom; k++)
            g_free(rep->ranks[i].sites_at_oom[k].site);
        g_free(rep->ranks[i].sites_at_oom);
    }
    g_free(rep->run);
    g_free(rep->device);
    g_free(rep->ranks);
    g_strfreev(rep->warnings);
    g_free(rep->source);
    g_free(rep->allocator);
    g_free(rep->alloc_conf);
    g_free(rep);
}

void memsim_report_set_device(MemsimReport *rep, memsim_size_t gpu_mem, memsim_size_t context)
{
    rep->gpu_mem = gpu_mem;
    rep->context_bytes = context;
    for (guint i = 0; i < rep->n_ranks; i++) {
        MemsimRankReport *r = &rep->ranks[i];
        r->device_total = (memsim_size_t)r->stats.reserved.peak + context;
        r->fits = !r->oom.happened && (gpu_mem == 0 || r->device_total <= gpu_mem);
    }
}

gboolean memsim_device_capacity(memsim_size_t gpu_mem, memsim_size_t outside,
                                memsim_size_t *capacity, GError **error)
{
    if (gpu_mem && outside >= gpu_mem) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "gpu-mem: %" G_GUINT64_FORMAT " bytes leave nothing after the %" G_GUINT64_FORMAT
                    " bytes of CUDA context and libraries",
                    gpu_mem, outside);
        return FALSE;
    }
    *capacity = gpu_mem ? gpu_mem - outside : 0;
    return TRUE;
}

void memsim_step_time(const MemsimRankReport *r, guint k, MemsimStepTime *out)
{
    memset(out, 0, sizeof *out);
    if (k >= r->n_steps)
        return;
    const MemsimStepPeaks *sp = &r->steps[k];
    double end = k + 1 < r->n_steps ? r->steps[k + 1].start_us : r->time_us;
    if (!(end > sp->start_us))
        return;
    out->step_us = end - sp->start_us;
    out->compute_us = sp->compute_us;
    out->memory_us = sp->memory_us + sp->latency_us;
    out->comm_us = sp->comm_us;
    double gpu = out->compute_us + out->memory_us;
    double busy = gpu;
    if (sp->host_us > gpu) {
        out->overhead_us = sp->host_us - gpu;
        busy = sp->host_us;
    }
    if (busy > out->step_us) {
        /* streams overlapped (a second compute stream): scale the parts to the step */
        double f = out->step_us / busy;
        out->compute_us *= f;
        out->memory_us *= f;
        out->overhead_us *= f;
    } else {
        out->waiting_us = out->step_us - busy;
    }
    out->bubble_us = MIN(sp->bubble_us, out->waiting_us);
    out->exposed_comm_us = out->waiting_us - out->bubble_us;
}

static void add_int(JsonBuilder *b, const char *key, int64_t v)
{
    json_builder_set_member_name(b, key);
    json_builder_add_int_value(b, v);
}

static void add_sites(JsonBuilder *b, const MemsimSite *s, uint32_t n)
{
    json_builder_begin_array(b);
    for (uint32_t i = 0; i < n; i++) {
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "site");
        json_builder_add_string_value(b, s[i].site);
        add_int(b, "bytes", (int64_t)s[i].bytes);
        add_int(b, "count", (int64_t)s[i].count);
        json_builder_set_member_name(b, "category");
        json_builder_add_string_value(b, memsim_category_name(s[i].category));
        json_builder_set_member_name(b, "phase");
        json_builder_add_string_value(b, memsim_phase_name(s[i].phase));
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
}

/* A site as the text report shows it: the file's base name, its line and function. */
static const char *site_short(const char *site)
{
    const char *colon = strrchr(site, ':');
    const char *slash = NULL;
    for (const char *p = site; *p && (!colon || p < colon); p++)
        if (*p == '/')
            slash = p;
    return slash ? slash + 1 : site;
}

void report_text_sites(GString *s, const char *what, const MemsimSite *x, uint32_t n)
{
    if (!n)
        return;
    char b[32];
    g_string_append_printf(s, "  who holds the memory %s:\n", what);
    for (uint32_t i = 0; i < n; i++)
        g_string_append_printf(s, "    %12s in %6" PRIu64 " blocks  %s  (%s)\n",
                               memsim_format_bytes(x[i].bytes, b, sizeof b), x[i].count,
                               site_short(x[i].site), memsim_category_name(x[i].category));
}

static void add_oom(JsonBuilder *b, const char *key, const MemsimOomInfo *o, gboolean simulated,
                    memsim_size_t capacity)
{
    json_builder_set_member_name(b, key);
    if (!o->happened) {
        json_builder_add_null_value(b);
        return;
    }
    json_builder_begin_object(b);
    add_int(b, "event", (int64_t)o->event_index);
    add_int(b, "requested", (int64_t)o->requested);
    add_int(b, "rounded", (int64_t)o->rounded);
    add_int(b, "device_free", (int64_t)o->device_free);
    /* How much more the device would have needed for this request to succeed. */
    add_int(b, "shortfall",
            o->rounded > o->device_free ? (int64_t)(o->rounded - o->device_free) : 0);
    add_int(b, "allocated", (int64_t)o->allocated);
    add_int(b, "reserved", (int64_t)o->reserved);
    add_int(b, "stream", o->stream);
    add_int(b, "op", o->op);
    if (o->op_name[0]) {
        json_builder_set_member_name(b, "op_name");
        json_builder_add_string_value(b, o->op_name);
        json_builder_set_member_name(b, "phase");
        json_builder_add_string_value(b, memsim_phase_name(o->phase));
        add_int(b, "layer", o->layer);
    }
    add_int(b, "step", o->step);
    if (simulated && capacity)
        add_int(b, "capacity", (int64_t)capacity);
    json_builder_end_object(b);
}

char *memsim_report_to_json(const MemsimReport *rep)
{
    JsonBuilder *b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "source");
    json_builder_add_string_value(b, rep->source ? rep->source : "");
    json_builder_set_member_name(b, "allocator");
    json_builder_add_string_value(b, rep->allocator ? rep->allocator : "");
    json_builder_set_member_name(b, "alloc_conf");
    if (rep->alloc_conf)
        json_builder_add_string_value(b, rep->alloc_conf);
    else
        json_builder_add_null_value(b);
    json_builder_set_member_name(b, "capacity");
    if (rep->capacity)
        json_builder_add_int_value(b, (int64_t)rep->capacity);
    else
        json_builder_add_null_value(b);
    if (rep->run) {
        json_builder_set_member_name(b, "run");
        json_builder_add_string_value(b, rep->run);
    }
    json_builder_set_member_name(b, "device");
    if (rep->device)
        json_builder_add_string_value(b, rep->device);
    else
        json_builder_add_null_value(b);
    json_builder_set_member_name(b, "device_assumed");
    json_builder_add_boolean_value(b, rep->device_assumed);
    json_builder_set_member_name(b, "gpu_mem");
    if (rep->gpu_mem)
        json_builder_add_int_value(b, (int64_t)rep->gpu_mem);
    else
        json_builder_add_null_value(b);
    add_int(b, "context_bytes", (int64_t)rep->context_bytes);
    add_int(b, "nccl_bytes", (int64_t)rep->nccl_bytes);
    if (rep->time_model.gpu[0]) {
        /* step times are estimates: the assumptions behind them */
        const MemsimTimeModel *tm = &rep->time_model;
        json_builder_set_member_name(b, "time_model");
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "gpu");
        json_builder_add_string_value(b, tm->gpu);
        const char *nm[] = {"compute_efficiency", "bandwidth_efficiency", "kernel_us",
                            "dispatch_us", "network_gbs"};
        double v[] = {tm->compute_efficiency, tm->bandwidth_efficiency, tm->kernel_us,
                      tm->dispatch_us, tm->network_gbs};
        for (int q = 0; q < 5; q++) {
            json_builder_set_member_name(b, nm[q]);
            json_builder_add_double_value(b, v[q]);
        }
        add_int(b, "sms", tm->sms);
        json_builder_end_object(b);
    }
    if (rep->warnings) {
        json_builder_set_member_name(b, "warnings");
        json_builder_begin_array(b);
        for (char **w = rep->warnings; *w; w++)
            json_builder_add_string_value(b, *w);
        json_builder_end_array(b);
    }
    json_builder_set_member_name(b, "ranks");
    json_builder_begin_array(b);
    for (guint i = 0; i < rep->n_ranks; i++) {
        const MemsimRankReport *r = &rep->ranks[i];
        const MemsimAllocStats *s = &r->stats;
        json_builder_begin_object(b);
        add_int(b, "rank", r->rank);
        add_int(b, "multiplicity", r->multiplicity);
        if (r->role) {
            json_builder_set_member_name(b, "role");
            json_builder_add_string_value(b, r->role);
        }
        add_int(b, "peak_allocated", s->allocated.peak);
        add_int(b, "peak_reserved", s->reserved.peak);
        add_int(b, "peak_active", s->active.peak);
        add_int(b, "peak_requested", s->requested.peak);
        add_int(b, "final_allocated", s->allocated.current);
        add_int(b, "final_reserved", s->reserved.current);
        add_int(b, "final_active", s->active.current);
        add_int(b, "final_requested", s->requested.current);
        add_int(b, "n_events", (int64_t)r->n_events);
        add_int(b, "peak_segments", s->segments.peak);
        add_int(b, "n_device_alloc", (int64_t)s->n_device_alloc);
        add_int(b, "n_device_free", (int64_t)s->n_device_free);
        add_int(b, "n_alloc_retries", (int64_t)s->n_alloc_retries);
        add_int(b, "n_ooms", (int64_t)s->n_ooms);

        /* At the peak of allocated bytes: rounding = what blocks hold beyond their requests;
         * holes = cached bytes in free blocks (reserved − allocated). */
        json_builder_set_member_name(b, "fragmentation_at_peak");
        json_builder_begin_object(b);
        add_int(b, "event", (int64_t)r->peak_allocated_event);
        add_int(b, "reserved", (int64_t)r->at_peak_allocated_reserved);
        add_int(b, "allocated", s->allocated.peak);
        add_int(b, "requested", (int64_t)r->at_peak_allocated_requested);
        add_int(b, "rounding", s->allocated.peak - (int64_t)r->at_peak_allocated_requested);
        add_int(b, "holes", (int64_t)r->at_peak_allocated_reserved - s->allocated.peak);
        json_builder_end_object(b);
        json_builder_set_member_name(b, "at_peak_reserved");
        json_builder_begin_object(b);
        add_int(b, "event", (int64_t)r->peak_reserved_event);
        add_int(b, "reserved", s->reserved.peak);
        add_int(b, "allocated", (int64_t)r->at_peak_reserved_allocated);
        add_int(b, "requested", (int64_t)r->at_peak_reserved_requested);
        json_builder_end_object(b);

        add_int(b, "device_total", (int64_t)r->device_total);
        add_int(b, "host_peak", (int64_t)r->host_peak);
        if (r->steady_repeated || r->steady_steps_repeated) {
            json_builder_set_member_name(b, "steady_state");
            json_builder_begin_object(b);
            if (r->steady_repeated) {
                add_int(b, "repeated_microbatches", (int64_t)r->steady_repeated);
                add_int(b, "skipped_microbatches", (int64_t)r->steady_skipped);
            }
            if (r->steady_timed)
                add_int(b, "timed_microbatches", (int64_t)r->steady_timed);
            if (r->steady_skipped) {
                add_int(b, "after_microbatch", r->steady_after);
                add_int(b, "of", r->steady_of);
                add_int(b, "step", r->steady_step);
            }
            if (r->steady_steps_repeated) {
                add_int(b, "repeated_steps", (int64_t)r->steady_steps_repeated);
                add_int(b, "skipped_steps", (int64_t)r->steady_steps_skipped);
            }
            json_builder_end_object(b);
        }
        json_builder_set_member_name(b, "time_us");
        json_builder_add_double_value(b, r->time_us);
        json_builder_set_member_name(b, "fits");
        json_builder_add_boolean_value(b, r->fits);
        json_builder_set_member_name(b, "steps");
        json_builder_begin_array(b);
        for (guint k = 0; k < r->n_steps; k++) {
            const MemsimStepPeaks *sp = &r->steps[k];
            json_builder_begin_object(b);
            add_int(b, "step", sp->step);
            add_int(b, "peak_allocated", sp->peak_allocated);
            add_int(b, "peak_reserved", sp->peak_reserved);
            json_builder_set_member_name(b, "start_us");
            json_builder_add_double_value(b, sp->start_us);
            MemsimStepTime stt;
            memsim_step_time(r, k, &stt);
            if (stt.step_us > 0) {
                /* an estimate: the parts as memsim_step_time defines them */
                json_builder_set_member_name(b, "time_estimate");
                json_builder_begin_object(b);
                const char *nm[] = {"step_us",
                                    "compute_us",
                                    "memory_bound_us",
                                    "overhead_us",
                                    "exposed_comm_and_bubble_us",
                                    "exposed_communication_us",
                                    "bubble_us",
                                    "communication_us",
                                    "host_dispatch_us"};
                double v[] = {stt.step_us,     stt.compute_us,      stt.memory_us,
                              stt.overhead_us, stt.waiting_us,      stt.exposed_comm_us,
                              stt.bubble_us,   stt.comm_us,         r->steps[k].host_us};
                for (int q = 0; q < 9; q++) {
                    json_builder_set_member_name(b, nm[q]);
                    json_builder_add_double_value(b, v[q]);
                }
                json_builder_end_object(b);
            }
            json_builder_set_member_name(b, "phases");
            json_builder_begin_object(b);
            for (int p = 0; p < MEMSIM_PHASE_COUNT; p++) {
                if (sp->phase_peak_allocated[p] < 0)
                    continue;
                json_builder_set_member_name(b, memsim_phase_name(p));
                json_builder_begin_object(b);
                add_int(b, "peak_allocated", sp->phase_peak_allocated[p]);
                add_int(b, "peak_reserved", sp->phase_peak_reserved[p]);
                json_builder_end_object(b);
            }
            json_builder_end_object(b);
            json_builder_end_object(b);
        }
        json_builder_end_array(b);
        json_builder_set_member_name(b, "breakdowns");
        json_builder_begin_object(b);
        for (guint k = 0; k < r->n_breakdowns; k++) {
            json_builder_set_member_name(b, r->breakdowns[k].name);
            json_builder_begin_object(b);
            for (int c = 0; c < MEMSIM_CAT_COUNT; c++) {
                json_builder_set_member_name(b, memsim_category_name(c));
                json_builder_begin_object(b);
                add_int(b, "allocated", r->breakdowns[k].allocated[c]);
                add_int(b, "requested", r->breakdowns[k].requested[c]);
                json_builder_end_object(b);
            }
            json_builder_end_object(b);
        }
        json_builder_end_object(b);
        json_builder_set_member_name(b, "at_peak");
        json_builder_begin_object(b);
        add_int(b, "event", (int64_t)r->peak_allocated_event);
        json_builder_set_member_name(b, "op");
        json_builder_add_string_value(b, r->peak_op_name);
        json_builder_set_member_name(b, "phase");
        json_builder_add_string_value(b, memsim_phase_name(r->peak_op_phase));
        add_int(b, "layer", r->peak_op_layer);
        add_int(b, "stream", r->peak_stream);
        json_builder_set_member_name(b, "by_category");
        json_builder_begin_object(b);
        for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
            add_int(b, memsim_category_name(c), (int64_t)r->peak_by_category[c]);
        json_builder_end_object(b);
        json_builder_end_object(b);

        json_builder_set_member_name(b, "final_shape");
        json_builder_begin_object(b);
        add_int(b, "largest_free", (int64_t)r->shape_final.largest_free);
        add_int(b, "free_bytes", (int64_t)r->shape_final.free_bytes);
        add_int(b, "n_free_blocks", (int64_t)r->shape_final.n_free_blocks);
        add_int(b, "n_segments", (int64_t)r->shape_final.n_segments);
        json_builder_end_object(b);

        add_oom(b, "oom", &r->oom, TRUE, rep->capacity);
        add_oom(b, "recorded_oom", &r->recorded_oom, FALSE, 0);
        add_int(b, "capacity", (int64_t)r->capacity);
        if (r->n_sites_at_peak) {
            json_builder_set_member_name(b, "sites_at_peak");
            add_sites(b, r->sites_at_peak, r->n_sites_at_peak);
        }
        if (r->n_sites_at_oom) {
            json_builder_set_member_name(b, "sites_at_oom");
            json_builder_begin_object(b);
            add_int(b, "event", (int64_t)r->sites_oom_event);
            json_builder_set_member_name(b, "sites");
            add_sites(b, r->sites_at_oom, r->n_sites_at_oom);
            json_builder_end_object(b);
        }
        json_builder_set_member_name(b, "recorded_oom_replay");
        if (r->oom_verdict.replayed) {
            const MemsimOomVerdict *v = &r->oom_verdict;
            json_builder_begin_object(b);
            add_int(b, "event", (int64_t)v->event_index);
            add_int(b, "capacity", (int64_t)v->capacity);
            json_builder_set_member_name(b, "fits");
            json_builder_add_boolean_value(b, v->fits);
            /* fits: the headroom left with it; else the bytes the device lacked */
            add_int(b, "margin", (int64_t)v->margin);
            add_int(b, "device_free", (int64_t)v->device_free);
            add_int(b, "cached_free", (int64_t)v->cached_free);
            add_int(b, "short_even_packed", (int64_t)v->short_packed);
            add_int(b, "allocated", (int64_t)v->allocated);
            add_int(b, "reserved", (int64_t)v->reserved);
            json_builder_end_object(b);
        } else {
            json_builder_add_null_value(b);
        }
        if (r->has_recorded_final) {
            json_builder_set_member_name(b, "recorded_final");
            json_builder_begin_object(b);
            add_int(b, "reserved", (int64_t)r->recorded_final_reserved);
            add_int(b, "allocated", (int64_t)r->recorded_final_allocated);
            json_builder_end_object(b);
        }
        if (r->verified) {
            json_builder_set_member_name(b, "verify");
            json_builder_begin_object(b);
            add_int(b, "checked", (int64_t)r->verify_checked);
            add_int(b, "mismatches", (int64_t)r->verify_mismatches);
            json_builder_set_member_name(b, "first_mismatch");
            if (r->first_mismatch)
                json_builder_add_string_value(b, r->first_mismatch);
            else
                json_builder_add_null_value(b);
            json_builder_end_object(b);
        }
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_end_object(b);

    return json_builder_finish(b, TRUE, NULL);
}

/* Rotating buffers, so that one printf can format several sizes. */
static const char *fb(int64_t v)
{
    static _Thread_local char bufs[8][32];
    static _Thread_local unsigned n;
    return memsim_format_bytes(v < 0 ? 0 : (memsim_size_t)v, bufs[n++ % 8], 32);
}
#define FB(v) fb((int64_t)(v))

char *memsim_report_to_text(const MemsimReport *rep)
{
    GString *s = g_string_new(NULL);
    if (rep->run)
        g_string_append_printf(s, "run:       %s\n", rep->run);
    else
        g_string_append_printf(s, "source:    %s\n", rep->source ? rep->source : "");
    g_string_append_printf(s, "allocator: %s\n", rep->allocator ? rep->allocator : "");
    if (rep->gpu_mem && rep->run)
        g_string_append_printf(s, "device:    %s%s%s (%" G_GUINT64_FORMAT " bytes)%s\n",
                               rep->device ? rep->device : "", rep->device ? ", " : "",
                               FB(rep->gpu_mem), (guint64)rep->gpu_mem,
                               rep->device_assumed ? ", assumed: --gpu-mem or --gpu to change"
                                                   : "");
    if (rep->capacity)
        g_string_append_printf(s, "capacity:  %s\n", FB(rep->capacity));
    g_string_append(s, "\n");
    if (rep->run) {
        /* an estimate: one row per rank role, with what the device holds and whether it fits */
        g_string_append_printf(s, "%-8s %6s %12s %12s %12s %-5s  %s\n", "rank", "ranks",
                               "peak alloc", "peak reserv", "device total", "fits",
                               "op at the peak (phase, layer, stream)");
        for (guint i = 0; i < rep->n_ranks; i++) {
            const MemsimRankReport *r = &rep->ranks[i];
            const MemsimAllocStats *st = &r->stats;
            /* where it ran out, if it did: the replay of that rank stopped there */
            g_autofree char *where =
                r->oom.happened && r->oom.op_name[0]
                    ? g_strdup_printf("OOM at %s (%s, %d, %u)", r->oom.op_name,
                                      memsim_phase_name(r->oom.phase), r->oom.layer,
                                      r->oom.stream)
                : r->peak_op_name[0]
                    ? g_strdup_printf("%s (%s, %d, %u)", r->peak_op_name,
                                      memsim_phase_name(r->peak_op_phase), r->peak_op_layer,
                                      r->peak_stream)
                    : g_strdup("-");
            g_string_append_printf(s, "%-8u %6u %12s %12s %12s %-5s  %s\n", r->rank,
                                   r->multiplicity, FB(st->allocated.peak), FB(st->reserved.peak),
                                   FB(r->device_total),
                                   rep->gpu_mem ? (r->fits ? "yes" : "NO") : "-", where);
        }
    } else {
        g_string_append_printf(s, "%-6s %12s %12s %12s %12s %12s %12s %10s\n", "rank",
                               "peak alloc", "peak reserv", "peak active", "peak request",
                               "final alloc", "final reserv", "events");
        for (guint i = 0; i < rep->n_ranks; i++) {
            const MemsimRankReport *r = &rep->ranks[i];
            const MemsimAllocStats *st = &r->stats;
            g_autofree char *label = r->multiplicity > 1
                                         ? g_strdup_printf("%u×%u", r->rank, r->multiplicity)
                                         : g_strdup_printf("%u", r->rank);
            g_string_append_printf(s, "%-6s %12s %12s %12s %12s %12s %12s %10" PRIu64 "\n",
                                   label, FB(st->allocated.peak), FB(st->reserved.peak),
                                   FB(st->active.peak), FB(st->requested.peak),
                                   FB(st->allocated.current), FB(st->reserved.current),
                                   r->n_events);
        }
    }
    for (guint i = 0; i < rep->n_ranks; i++) {
        const MemsimRankReport *r = &rep->ranks[i];
        const MemsimAllocStats *st = &r->stats;
        if (r->role)
            g_string_append_printf(s, "\nrank %u — %s:\n", r->rank, r->role);
        else
            g_string_append_printf(s, "\nrank %u:\n", r->rank);
        int64_t holes = (int64_t)r->at_peak_allocated_reserved - st->allocated.peak;
        int64_t rounding = st->allocated.peak - (int64_t)r->at_peak_allocated_requested;
        g_string_append_printf(s,
                               "  fragmentation at the peak (event %" PRIu64 "): %s reserved, "
                               "%s allocated: %s in free holes, %s of rounding inside "
                               "blocks\n",
                               r->peak_allocated_event, FB(r->at_peak_allocated_reserved),
                               FB(st->allocated.peak), FB(holes), FB(rounding));
        if (r->peak_reserved_event != r->peak_allocated_event)
            g_string_append_printf(s,
                                   "  at peak reserved (event %" PRIu64 "): %s reserved, %s "
                                   "allocated\n",
                                   r->peak_reserved_event, FB(st->reserved.peak),
                                   FB(r->at_peak_reserved_allocated));
        g_string_append_printf(s, "  segments: peak %" PRId64 ", driver allocs %" PRIu64
                               ", frees %" PRIu64 ", retries %" PRIu64 "\n",
                               st->segments.peak, st->n_device_alloc, st->n_device_free,
                               st->n_alloc_retries);
        if (r->peak_op_name[0]) {
            g_string_append_printf(s, "  peak allocated %s%s at op %s (%s", FB(st->allocated.peak),
                                   r->oom.happened ? " before running out of memory" : "",
                                   r->peak_op_name, memsim_phase_name(r->peak_op_phase));
            if (r->peak_stream)
                g_string_append_printf(s, ", stream %u", r->peak_stream);
            if (r->peak_op_layer >= 0)
                g_string_append_printf(s, ", layer %d", r->peak_op_layer);
            g_string_append(s, "); live at that moment:\n");
            for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
                if (r->peak_by_category[c])
                    g_string_append_printf(s, "    %-16s %12s  %5.1f%%\n", memsim_category_name(c),
                                           FB(r->peak_by_category[c]),
                                           100.0 * (double)r->peak_by_category[c] /
                                               (double)(st->allocated.peak ? st->allocated.peak : 1));
        }
        for (guint k = 0; k < r->n_breakdowns; k++) {
            const MemsimBreakdown *bd = &r->breakdowns[k];
            g_string_append_printf(s, "  %s:", bd->name);
            for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
                if (bd->requested[c] && (c == MEMSIM_CAT_PARAMETER || c == MEMSIM_CAT_GRADIENT ||
                                         c == MEMSIM_CAT_OPTIMIZER_STATE))
                    g_string_append_printf(s, " %s %s", memsim_category_name(c),
                                           FB(bd->requested[c]));
            g_string_append(s, "\n");
        }
        for (guint k = 0; k < r->n_steps; k++) {
            const MemsimStepPeaks *sp = &r->steps[k];
            g_string_append_printf(s, "  step %u: peak allocated %s, reserved %s", sp->step,
                                   FB(sp->peak_allocated), FB(sp->peak_reserved));
            for (int p = 0; p < MEMSIM_PHASE_COUNT; p++)
                if (sp->phase_peak_allocated[p] >= 0 && p != MEMSIM_PHASE_OTHER)
                    g_string_append_printf(s, "; %s %s", memsim_phase_name(p),
                                           FB(sp->phase_peak_allocated[p]));
            /* simulated time: to the next step's start, the last step to the end */
            MemsimStepTime stt;
            memsim_step_time(r, k, &stt);
            if (stt.step_us > 0)
                g_string_append_printf(s,
                                       "; simulated time %.1f ms (an estimate: compute %.1f, "
                                       "memory-bound %.1f, host overhead %.1f, waiting %.1f)",
                                       stt.step_us / 1e3, stt.compute_us / 1e3,
                                       stt.memory_us / 1e3, stt.overhead_us / 1e3,
                                       stt.waiting_us / 1e3);
            g_string_append(s, "\n");
        }
        if (r->steady_skipped)
            g_string_append_printf(s, "  steady state after micro-batch %u of %u (step %u): %" PRIu64
                                   " repeated micro-batches generated once, %" PRIu64
                                   " of them not simulated one by one",
                                   r->steady_after, r->steady_of, r->steady_step,
                                   r->steady_repeated, r->steady_skipped);
        else if (r->steady_repeated)
            g_string_append_printf(s, "  steady state: %" PRIu64 " repeated micro-batches "
                                   "generated once, each simulated%s",
                                   r->steady_repeated, r->steady_timed ? " for its memory" : "");
        if (r->steady_timed)
            g_string_append_printf(s, ", the time of %" PRIu64 " of them added by the pipeline's "
                                   "periods",
                                   r->steady_timed);
        if (r->steady_repeated)
            g_string_append(s, "\n");
        if (r->steady_steps_skipped)
            g_string_append_printf(s, "  steady state: %" PRIu64 " repeated step%s generated once, "
                                   "%" PRIu64 " of them not simulated one by one\n",
                                   r->steady_steps_repeated,
                                   r->steady_steps_repeated == 1 ? "" : "s",
                                   r->steady_steps_skipped);
        else if (r->steady_steps_repeated)
            g_string_append_printf(s, "  steady state: %" PRIu64 " repeated step%s generated once, "
                                   "%s\n",
                                   r->steady_steps_repeated,
                                   r->steady_steps_repeated == 1 ? "" : "s",
                                   r->steady_steps_repeated == 1 ? "simulated" : "each simulated");
        if (r->host_peak)
            g_string_append_printf(s, "  host memory (offloaded state) at its most: %s\n",
                                   FB(r->host_peak));
        if (rep->context_bytes || rep->gpu_mem) {
            g_string_append_printf(s, "  device total (nvidia-smi): %s = peak reserved + %s "
                                   "CUDA context and libraries",
                                   FB(r->device_total), FB(rep->context_bytes - rep->nccl_bytes));
            if (rep->nccl_bytes)
                g_string_append_printf(s, " + %s NCCL", FB(rep->nccl_bytes));
            if (rep->gpu_mem && r->oom.happened) {
                const MemsimOomInfo *o = &r->oom;
                g_string_append_printf(s, "; DOES NOT FIT in %s: ran out of memory on rank %u",
                                       FB(rep->gpu_mem), r->rank);
                if (o->step)
                    g_string_append_printf(s, " in step %u", o->step);
                if (o->op_name[0]) {
                    g_string_append_printf(s, " at op %s (%s", o->op_name,
                                           memsim_phase_name(o->phase));
                    if (o->layer >= 0)
                        g_string_append_printf(s, ", layer %d", o->layer);
                    g_string_append(s, ")");
                }
                g_string_append_printf(s, ", short by %s\n",
                                       FB(o->rounded > o->device_free ? o->rounded - o->device_free
                                                                      : 0));
            } else if (rep->gpu_mem) {
                int64_t margin = (int64_t)rep->gpu_mem - (int64_t)r->device_total;
                g_string_append_printf(s, "; %s in %s: %s %s\n",
                                       r->fits ? "FITS" : "DOES NOT FIT", FB(rep->gpu_mem),
                                       margin >= 0 ? "margin" : "short by",
                                       FB(margin >= 0 ? margin : -margin));
            } else {
                g_string_append(s, "\n");
            }
        }
        if (r->oom.happened)
            g_string_append_printf(
                s, "  OUT OF MEMORY at event %" PRIu64 ": tried to allocate %s (%s rounded) "
                "with %s free on the device; short by %s; %s allocated, %s reserved\n",
                r->oom.event_index, FB(r->oom.requested), FB(r->oom.rounded),
                FB(r->oom.device_free),
                FB(r->oom.rounded > r->oom.device_free ? r->oom.rounded - r->oom.device_free : 0),
                FB(r->oom.allocated), FB(r->oom.reserved));
        if (r->recorded_oom.happened)
            g_string_append_printf(
                s, "  recorded OOM at event %" PRIu64 ": %s requested (rounded) with %s free "
                "on the device; short by %s; %s allocated, %s reserved at that point\n",
                r->recorded_oom.event_index, FB(r->recorded_oom.rounded),
                FB(r->recorded_oom.device_free),
                FB(r->recorded_oom.rounded > r->recorded_oom.device_free
                       ? r->recorded_oom.rounded - r->recorded_oom.device_free
                       : 0),
                FB(r->recorded_oom.allocated), FB(r->recorded_oom.reserved));
        if (r->oom_verdict.replayed) {
            const MemsimOomVerdict *v = &r->oom_verdict;
            if (v->fits)
                g_string_append_printf(s, "  the recorded OOM's request on %s: FITS, %s left "
                                       "free on the device with it (%s reserved)\n",
                                       FB(v->capacity), FB(v->margin), FB(v->reserved));
            else
                g_string_append_printf(s, "  the recorded OOM's request on %s: DOES NOT FIT, "
                                       "short by %s (%s free on the device); %s free in cached "
                                       "blocks: short by %s even if all of it were usable\n",
                                       FB(v->capacity), FB(v->margin), FB(v->device_free),
                                       FB(v->cached_free), FB(v->short_packed));
        }
        if (r->n_sites_at_peak) {
            g_autofree char *what =
                g_strdup_printf("at the peak (event %" PRIu64 ")", r->peak_allocated_event);
            report_text_sites(s, what, r->sites_at_peak, r->n_sites_at_peak);
        }
        if (r->n_sites_at_oom) {
            g_autofree char *what =
                g_strdup_printf("at the OOM (event %" PRIu64 ")", r->sites_oom_event);
            report_text_sites(s, what, r->sites_at_oom, r->n_sites_at_oom);
        }
        if (r->has_recorded_final)
            g_string_append_printf(s, "  recorded final: %s allocated, %s reserved\n",
                                   FB(r->recorded_final_allocated),
                                   FB(r->recorded_final_reserved));
        if (r->verified)
            g_string_append_printf(s, "  verify: %" PRIu64 " checks, %" PRIu64
                                   " mismatches%s%s\n",
                                   r->verify_checked, r->verify_mismatches,
                                   r->first_mismatch ? "; first: " : "",
                                   r->first_mismatch ? r->first_mismatch : "");
    }
    return g_string_free(s, FALSE);
}
