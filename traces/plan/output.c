/* `memsim plan` results as text, JSON and CSV (include/memsim/plan.h). The text is what a
 * person reads first: the ranked table, the closest misses, the recommendation with the
 * command that re-estimates it, the notes; MIG plans lead with the slice table. */
#include <memsim/plan.h>
#include <memsim/sim.h>

#include <json-glib/json-glib.h>
#include <string.h>

#include "sim/export/json.h"

static const char *method_key[] = {"none", "ddp",          "zero1", "zero2",   "zero3",
                                   "fsdp", "fsdp-grad-op", "hsdp",  "megatron"};
static const char *ckpt_key[] = {"none", "full", "selective"};
static const char *sched_key[] = {"1f1b", "gpipe", "interleaved"};

static const char *fb(memsim_size_t b, char *buf)
{
    return memsim_format_bytes(b, buf, 32);
}

/* "-1.25 GiB" for a signed headroom. */
static const char *fsigned(int64_t v, char *buf)
{
    char tmp[32];
    memsim_format_bytes((memsim_size_t)(v < 0 ? -v : v), tmp, sizeof tmp);
    g_snprintf(buf, 32, "%s%s", v < 0 ? "-" : "", tmp);
    return buf;
}

/* 1234567 → "1,234,567" */
static const char *fnum(double v, char *buf)
{
    char raw[32];
    g_snprintf(raw, sizeof raw, "%.0f", v);
    int n = (int)strlen(raw), o = 0;
    for (int i = 0; i < n; i++) {
        buf[o++] = raw[i];
        if (raw[i] != '-' && (n - i - 1) % 3 == 0 && i != n - 1)
            buf[o++] = ',';
    }
    buf[o] = '\0';
    return buf;
}

static const char *fsecs(double s, char *buf)
{
    if (s >= 100)
        g_snprintf(buf, 32, "%.0f s", s);
    else if (s >= 1)
        g_snprintf(buf, 32, "%.2f s", s);
    else
        g_snprintf(buf, 32, "%.0f ms", s * 1e3);
    return buf;
}

static const char *alloc_word(const MemsimPlanRow *r)
{
    return r->offload ? "offload" : r->expandable ? "expandable" : "default";
}

static void row_line(GString *s, int rank, const MemsimPlanRow *r)
{
    char a[32], b[32], c[32], d[32];
    if (rank > 0)
        g_string_append_printf(s, "%3d  ", rank);
    else
        g_string_append(s, "     ");
    g_string_append_printf(s, "%-33s %4" G_GINT64_FORMAT " %5d  %-9s  %-10s %9s %12s  %s%10s %11s",
                           r->label, r->batch, r->grad_accum, ckpt_key[r->checkpointing],
                           r->bound_only ? "-" : alloc_word(r), fsecs(r->step_s, a),
                           fnum(r->tokens_per_s, b), r->bound_only ? "≥" : " ", fb(r->peak, c),
                           fsigned(r->headroom, d));
    if (r->offload) {
        char h[32];
        g_string_append_printf(s, "  (host %s)", fb(r->host_bytes, h));
    }
    g_string_append_c(s, '\n');
}

static void header_line(GString *s)
{
    g_string_append_printf(s, "%3s  %-33s %4s %5s  %-9s  %-10s %9s %12s  %10s %11s\n", "#",
                           "configuration", "mb", "accum", "ckpt", "alloc", "step", "tokens/s",
                           "peak/GPU", "headroom");
}

static void describe_row(GString *s, const MemsimPlanRow *r)
{
    char a[32], b[32], c[32], d[32];
    g_string_append_printf(
        s,
        "%s, micro-batch %" G_GINT64_FORMAT " × %d %s (%" G_GINT64_FORMAT
        " sequences per step), checkpointing %s, %s allocator: %s per "
        "step, %s tokens/s, %s per GPU (%s headroom)",
        r->label, r->batch, r->grad_accum, r->pp > 1 ? "micro-batches" : "accumulation",
        r->global_batch, ckpt_key[r->checkpointing],
        r->expandable ? "expandable_segments" : "default", fsecs(r->step_s, a),
        fnum(r->tokens_per_s, b), fb(r->peak, c), fb((memsim_size_t)r->headroom, d));
    if (r->offload) {
        char h[32];
        g_string_append_printf(s, ", optimizer state on the CPU: %s host memory per GPU",
                               fb(r->host_bytes, h));
    }
}

static void ranks_lines(GString *s, const MemsimPlanRow *r)
{
    if (r->n_ranks <= 1)
        return;
    g_string_append(s, "  per rank:\n");
    for (guint32 i = 0; i < r->n_ranks; i++) {
        char a[32];
        g_string_append_printf(s, "    rank %-4u ×%-4u %10s  %s\n", r->ranks[i].rank,
                               r->ranks[i].multiplicity, fb(r->ranks[i].device_total, a),
                               r->ranks[i].role);
    }
}

static void sweep_line(GString *s, const MemsimPlan *p)
{
    g_string_append_printf(s,
                           "sweep:    %u configurations, %" G_GUINT64_FORMAT
                           " candidates with micro-batches and allocator settings; %u traces "
                           "generated, %u replays, %u steps bounded from short runs; pruned: %u "
                           "by the memory bound, %u replays by the exact allocator's bound, %u "
                           "by the cost model; %.2f s on %d thread(s)\n",
                           p->n_configs, p->n_candidates, p->n_generated, p->n_replays,
                           p->n_bounded, p->n_pruned_bound, p->n_pruned_exact, p->n_pruned_cost,
                           p->elapsed_s, p->threads);
}

char *memsim_plan_to_text(const MemsimPlan *p)
{
    GString *s = g_string_new(NULL);
    char a[32];
    g_string_append_printf(s, "model:    %s; %s\n", p->model, p->run);
    g_string_append_printf(s, "cluster:  %d × %s, %s each, %d per node\n", p->gpus, p->gpu,
                           fb(p->gpu_mem, a), p->gpus_per_node);
    if (p->global_batch)
        g_string_append_printf(s, "batch:    %" G_GINT64_FORMAT " sequences per step\n",
                               p->global_batch);
    else
        g_string_append(s, "batch:    free: one micro-batch per replica and step (pipelines: "
                           "pp micro-batches); ranked by tokens per second\n");
    sweep_line(s, p);
    if (p->n_mig) {
        g_string_append_printf(s, "\nMIG slices of %s, one job per slice:\n", p->gpu);
        g_string_append_printf(
            s, "  %-9s %10s %4s %8s  %-4s %4s %5s  %-9s  %-10s %10s %11s %12s %13s\n", "slice",
            "memory", "SMs", "jobs/GPU", "fits", "mb", "accum", "ckpt", "alloc", "peak", "headroom",
            "tokens/s/job", "tokens/s/GPU");
        const MemsimPlanMig *best = NULL, *small = NULL;
        for (guint i = 0; i < p->n_mig; i++) {
            const MemsimPlanMig *m = &p->mig[i];
            const MemsimPlanRow *r = &m->best;
            char b[32], c[32], d[32], e[32];
            g_string_append_printf(s, "  %-9s %10s %4d %8d  %-4s ", m->name, fb(m->memory, a),
                                   m->sms, m->instances, m->fits ? "yes" : "no");
            if (m->fits)
                g_string_append_printf(
                    s, "%4" G_GINT64_FORMAT " %5d  %-9s  %-10s %10s %11s %12s %13s\n", r->batch,
                    r->grad_accum, ckpt_key[r->checkpointing], alloc_word(r), fb(r->peak, b),
                    fsigned(r->headroom, c), fnum(r->tokens_per_s, d),
                    fnum(r->tokens_per_s * m->instances, e));
            else if (r->label)
                g_string_append_printf(s, "%4s %5s  %-9s  %-10s %s%9s %11s\n", "", "", "", "",
                                       r->bound_only ? "≥" : " ", fb(r->peak, b),
                                       fsigned(r->headroom, c));
            else
                g_string_append(s, "\n");
            if (m->fits) {
                double tp = r->tokens_per_s * m->instances;
                if (!best || tp > best->best.tokens_per_s * best->instances)
                    best = m;
                if (!small || m->memory < small->memory)
                    small = m;
            }
        }
        if (!best) {
            g_string_append(s, "\nthe job fits in no slice\n");
        } else {
            g_string_append_printf(s, "\nsmallest slice that fits: %s (%d job%s per GPU)\n",
                                   small->name, small->instances, small->instances > 1 ? "s" : "");
            g_string_append_printf(s, "recommended: %s slices, %d job%s per GPU: ", best->name,
                                   best->instances, best->instances > 1 ? "s" : "");
            describe_row(s, &best->best);
            g_string_append_printf(s, "\n  %s\n  %s\n", best->best.command, best->best.recipe);
        }
    } else if (p->n_rows == 0) {
        g_string_append(s, "\nnothing fits\n");
    } else {
        g_string_append_printf(s, "\nconfigurations that fit, fastest first (%u shown):\n",
                               p->n_rows);
        header_line(s);
        for (guint i = 0; i < p->n_rows; i++)
            row_line(s, (int)i + 1, &p->rows[i]);
    }
    if (p->n_misses) {
        g_string_append_printf(s,
                               "\nclosest that do not fit%s (peak at the smallest "
                               "micro-batch; headroom negative: the miss):\n",
                               p->n_rows ? ", each faster than #1" : "");
        header_line(s);
        for (guint i = 0; i < p->n_misses; i++)
            row_line(s, 0, &p->misses[i]);
    }
    if (!p->n_mig && p->n_rows) {
        const MemsimPlanRow *r = &p->rows[0];
        g_string_append(s, "\nrecommended: ");
        describe_row(s, r);
        g_string_append_printf(s, "\n  %s\n  %s\n", r->command, r->recipe);
        ranks_lines(s, r);
    }
    if (p->notes && *p->notes) {
        g_string_append(s, "\nnotes:\n");
        for (char **n = p->notes; *n; n++)
            g_string_append_printf(s, "  - %s\n", *n);
    }
    return g_string_free(s, FALSE);
}

/* ---- JSON ---- */

static void jint(JsonBuilder *b, const char *k, int64_t v)
{
    json_builder_set_member_name(b, k);
    json_builder_add_int_value(b, v);
}

static void jdbl(JsonBuilder *b, const char *k, double v)
{
    json_builder_set_member_name(b, k);
    json_builder_add_double_value(b, v);
}

static void jstr(JsonBuilder *b, const char *k, const char *v)
{
    json_builder_set_member_name(b, k);
    if (v)
        json_builder_add_string_value(b, v);
    else
        json_builder_add_null_value(b);
}

static void jbool(JsonBuilder *b, const char *k, gboolean v)
{
    json_builder_set_member_name(b, k);
    json_builder_add_boolean_value(b, v);
}

static void json_row(JsonBuilder *b, const MemsimPlanRow *r)
{
    json_builder_begin_object(b);
    jstr(b, "label", r->label);
    jstr(b, "method", r->replicas ? "replicas" : method_key[r->method]);
    jint(b, "tp", r->tp);
    jint(b, "pp", r->pp);
    jint(b, "dp", r->dp);
    jstr(b, "pp_schedule", r->pp > 1 ? sched_key[r->schedule] : NULL);
    jint(b, "virtual_stages", r->virtual_stages);
    jint(b, "micro_batch", r->batch);
    jint(b, "grad_accum", r->grad_accum);
    jint(b, "global_batch", r->global_batch);
    jstr(b, "checkpointing", ckpt_key[r->checkpointing]);
    jstr(b, "alloc_conf", r->expandable ? "expandable_segments:True" : NULL);
    jbool(b, "offload", r->offload);
    jint(b, "host_bytes", (int64_t)r->host_bytes);
    jdbl(b, "step_s", r->step_s);
    jdbl(b, "tokens_per_s", r->tokens_per_s);
    jdbl(b, "compute_s", r->compute_s);
    jdbl(b, "comm_s", r->comm_s);
    jdbl(b, "bubble_s", r->bubble_s);
    jdbl(b, "optimizer_s", r->optimizer_s);
    json_builder_set_member_name(b, "time_simulated");
    json_builder_add_boolean_value(b, r->time_simulated);
    if (r->time_simulated) {
        /* an estimate: the simulated step's parts (memsim_step_time) */
        json_builder_set_member_name(b, "time_estimate");
        json_builder_begin_object(b);
        jdbl(b, "step_s", r->step_s);
        jdbl(b, "compute_s", r->sim_compute_s);
        jdbl(b, "memory_bound_s", r->sim_memory_s);
        jdbl(b, "overhead_s", r->sim_overhead_s);
        jdbl(b, "exposed_comm_and_bubble_s", r->sim_waiting_s);
        jdbl(b, "exposed_communication_s", r->sim_waiting_s - r->sim_bubble_s);
        jdbl(b, "bubble_s", r->sim_bubble_s);
        json_builder_end_object(b);
    }
    jint(b, "peak_bytes", (int64_t)r->peak);
    jint(b, "headroom_bytes", r->headroom);
    jbool(b, "bound_only", r->bound_only);
    json_builder_set_member_name(b, "ranks");
    json_builder_begin_array(b);
    for (guint32 i = 0; i < r->n_ranks; i++) {
        const MemsimPlanRank *k = &r->ranks[i];
        json_builder_begin_object(b);
        jint(b, "rank", k->rank);
        jint(b, "multiplicity", k->multiplicity);
        jstr(b, "role", k->role);
        jint(b, "peak_allocated", (int64_t)k->peak_allocated);
        jint(b, "peak_reserved", (int64_t)k->peak_reserved);
        jint(b, "device_total", (int64_t)k->device_total);
        jint(b, "optimizer_state", (int64_t)k->optimizer_state);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    jstr(b, "command", r->command);
    jstr(b, "recipe", r->recipe);
    json_builder_end_object(b);
}

char *memsim_plan_to_json(const MemsimPlan *p)
{
    JsonBuilder *b = json_builder_new();
    json_builder_begin_object(b);
    jstr(b, "model", p->model);
    jstr(b, "run", p->run);
    jstr(b, "gpu", p->gpu);
    if (p->time_model.gpu[0]) {
        /* the step times are estimates: what they assumed */
        json_builder_set_member_name(b, "time_model");
        json_builder_begin_object(b);
        jdbl(b, "compute_efficiency", p->time_model.compute_efficiency);
        jdbl(b, "bandwidth_efficiency", p->time_model.bandwidth_efficiency);
        jdbl(b, "kernel_us", p->time_model.kernel_us);
        jdbl(b, "dispatch_us", p->time_model.dispatch_us);
        jdbl(b, "network_gbs", p->time_model.network_gbs);
        jint(b, "sms", p->time_model.sms);
        json_builder_end_object(b);
    }
    jint(b, "gpu_mem", (int64_t)p->gpu_mem);
    jint(b, "gpus", p->gpus);
    jint(b, "gpus_per_node", p->gpus_per_node);
    jint(b, "global_batch", p->global_batch);
    json_builder_set_member_name(b, "rows");
    json_builder_begin_array(b);
    for (guint i = 0; i < p->n_rows; i++)
        json_row(b, &p->rows[i]);
    json_builder_end_array(b);
    json_builder_set_member_name(b, "misses");
    json_builder_begin_array(b);
    for (guint i = 0; i < p->n_misses; i++)
        json_row(b, &p->misses[i]);
    json_builder_end_array(b);
    json_builder_set_member_name(b, "recommended");
    if (p->n_rows)
        json_row(b, &p->rows[0]);
    else
        json_builder_add_null_value(b);
    json_builder_set_member_name(b, "mig");
    json_builder_begin_array(b);
    for (guint i = 0; i < p->n_mig; i++) {
        const MemsimPlanMig *m = &p->mig[i];
        json_builder_begin_object(b);
        jstr(b, "slice", m->name);
        jint(b, "memory", (int64_t)m->memory);
        jint(b, "sms", m->sms);
        jint(b, "instances", m->instances);
        jbool(b, "fits", m->fits);
        json_builder_set_member_name(b, "best");
        if (m->best.label)
            json_row(b, &m->best);
        else
            json_builder_add_null_value(b);
        json_builder_end_object(b);
    }
    json_builder_end_array(b);
    json_builder_set_member_name(b, "notes");
    json_builder_begin_array(b);
    for (char **n = p->notes; n && *n; n++)
        json_builder_add_string_value(b, *n);
    json_builder_end_array(b);
    json_builder_set_member_name(b, "sweep");
    json_builder_begin_object(b);
    jint(b, "configurations", p->n_configs);
    jint(b, "candidates", (int64_t)p->n_candidates);
    jint(b, "generated", p->n_generated);
    jint(b, "replays", p->n_replays);
    jint(b, "steps_bounded", p->n_bounded);
    jint(b, "misses_from_short_runs", p->n_short_over);
    jint(b, "pruned_by_memory_bound", p->n_pruned_bound);
    jint(b, "replays_pruned_by_exact_bound", p->n_pruned_exact);
    jint(b, "pruned_by_cost", p->n_pruned_cost);
    jint(b, "threads", p->threads);
    jdbl(b, "elapsed_s", p->elapsed_s);
    json_builder_end_object(b);
    json_builder_end_object(b);
    return json_builder_finish(b, TRUE, NULL);
}

/* ---- CSV ---- */

static void csv_field(GString *s, const char *v)
{
    if (!v)
        return;
    if (strpbrk(v, ",\"\n")) {
        g_string_append_c(s, '"');
        for (const char *c = v; *c; c++) {
            if (*c == '"')
                g_string_append_c(s, '"');
            g_string_append_c(s, *c);
        }
        g_string_append_c(s, '"');
    } else {
        g_string_append(s, v);
    }
}

static void csv_row(GString *s, const char *kind, int rank, const char *slice,
                    const MemsimPlanRow *r)
{
    g_string_append_printf(s, "%s,%d,", kind, rank);
    csv_field(s, slice);
    g_string_append_c(s, ',');
    csv_field(s, r->label);
    g_string_append_printf(s,
                           ",%s,%d,%d,%d,%s,%d,%" G_GINT64_FORMAT ",%d,%" G_GINT64_FORMAT
                           ",%s,%s,%d,%.6g,%.6g,%" G_GUINT64_FORMAT ",%" G_GINT64_FORMAT
                           ",%" G_GUINT64_FORMAT ",%d,",
                           r->replicas ? "replicas" : method_key[r->method], r->tp, r->pp, r->dp,
                           r->pp > 1 ? sched_key[r->schedule] : "", r->virtual_stages, r->batch,
                           r->grad_accum, r->global_batch, ckpt_key[r->checkpointing],
                           r->expandable ? "expandable_segments:True" : "", r->offload, r->step_s,
                           r->tokens_per_s, r->peak, r->headroom, r->host_bytes, r->bound_only);
    csv_field(s, r->command);
    g_string_append_c(s, '\n');
}

char *memsim_plan_to_csv(const MemsimPlan *p)
{
    GString *s = g_string_new("kind,rank,slice,label,method,tp,pp,dp,pp_schedule,virtual_stages,"
                              "micro_batch,grad_accum,global_batch,checkpointing,alloc_conf,"
                              "offload,step_s,tokens_per_s,peak_bytes,headroom_bytes,host_bytes,"
                              "bound_only,command\n");
    for (guint i = 0; i < p->n_rows; i++)
        csv_row(s, "fit", (int)i + 1, NULL, &p->rows[i]);
    for (guint i = 0; i < p->n_misses; i++)
        csv_row(s, "miss", 0, NULL, &p->misses[i]);
    for (guint i = 0; i < p->n_mig; i++)
        if (p->mig[i].best.label)
            csv_row(s, p->mig[i].fits ? "mig" : "mig-miss", 0, p->mig[i].name, &p->mig[i].best);
    return g_string_free(s, FALSE);
}
