/* The estimate (include/memsim/estimate.h): a run generated from a model and judged on a
 * device, the one judge step that estimate, plan, compare and the Python module share
 * (traces/estimate/judge.h).
 */
#include <memsim/estimate.h>

#include "traces/estimate/judge.h"
#include "traces/loop.h"
#include "traces/models.h"

#include <stdio.h>
#include <string.h>
#include "traces/settings.h"

memsim_size_t memsim_estimate_nccl_bytes(const MemsimRun *run, memsim_size_t per)
{
    memsim_size_t nccl = 0;
    if (run->gpus > 1) {
        MemsimResolvedRun rr = memsim_run_resolve(run);
        int groups[3] = {rr.dp, rr.tp, rr.pp > 1 ? 2 : 1};
        for (int i = 0; i < 3; i++)
            if (groups[i] > 1)
                nccl += per              ? per
                        : groups[i] == 2 ? (memsim_size_t)544000000
                                         : (memsim_size_t)688000000;
    }
    return nccl;
}

gboolean judge_begin(Judge *j, const MemsimRun *run, memsim_size_t gpu_mem,
                     memsim_size_t context, memsim_size_t nccl_per, memsim_size_t reserve,
                     GError **error)
{
    j->gpu_mem = gpu_mem;
    j->context = context;
    j->nccl = memsim_estimate_nccl_bytes(run, nccl_per);
    /* (NCCL's share is judged afterwards, with the device total; `reserve` is kept off) */
    if (!memsim_device_capacity(gpu_mem, context, &j->capacity, error))
        return FALSE;
    if (j->capacity)
        j->capacity -= MIN(reserve, j->capacity - 1);
    return TRUE;
}

void judge_end(const Judge *j, MemsimReport *rep)
{
    memsim_report_set_device(rep, j->gpu_mem, j->context + j->nccl);
    rep->nccl_bytes = j->nccl;
}

MemsimReport *memsim_estimate(const MemsimModel *m, const MemsimRun *run,
                              const MemsimEstimateOptions *opt, GError **error)
{
    return memsim_estimate_recorded(m, run, opt, NULL, error);
}

MemsimReport *memsim_estimate_recorded(const MemsimModel *m, const MemsimRun *run,
                                       const MemsimEstimateOptions *opt,
                                       MemsimTimeline *timeline, GError **error)
{
    static const MemsimEstimateOptions defaults = MEMSIM_ESTIMATE_OPTIONS_INIT;
    if (!opt)
        opt = &defaults;
    /* without gpu_mem, the run's GPU profile (default a100-80gb) is the device judged */
    memsim_size_t gpu_mem = opt->gpu_mem;
    const MemsimGpu *profile = memsim_gpu_find(run->gpu);
    if (!gpu_mem && profile)
        gpu_mem = profile->memory;
    Judge j;
    if (!judge_begin(&j, run, gpu_mem, opt->context_bytes, opt->nccl_bytes, 0, error))
        return NULL;
    MemsimTrace *t = memsim_generate(m, run, error);
    if (!t)
        return NULL;
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.allocator = opt->allocator;
    o.alloc_conf = opt->alloc_conf;
    o.capacity = j.capacity;
    o.timeline = timeline;
    o.dispatch_us = profile ? profile->dispatch_us : 0.0;
    MemsimReport *rep = memsim_replay_trace(t, &o, error);
    memsim_trace_free(t);
    if (!rep)
        return NULL;
    g_free(rep->source);
    rep->source = g_strdup(memsim_model_name(m));
    MemsimRun adapted = *run;
    memsim_run_adapt(&adapted, m);
    rep->run = memsim_run_describe(&adapted);
    judge_end(&j, rep);
    MemsimGpu gbuf;
    const MemsimGpu *tg = run_gpu(run, &gbuf);
    if (tg)
        memsim_time_model_of(tg, &rep->time_model);
    if (!opt->gpu_mem && profile) {
        rep->device = g_strdup(profile->name);
        rep->device_assumed = TRUE;
    } else if (opt->gpu_mem && opt->device) {
        rep->device = g_strdup(opt->device);
    }
    return rep;
}

/* ---- the host memory a run takes ---- */

/* The host's memory that a simulation may use: MEMSIM_HOST_MEMORY (bytes, or with a unit) when
 * set, else what /proc/meminfo calls MemAvailable; 0 when unknown. */
static memsim_size_t host_available(GError **error, gboolean *ok)
{
    *ok = TRUE;
    const char *env = g_getenv("MEMSIM_HOST_MEMORY");
    if (env && *env) {
        memsim_size_t v = 0;
        if (!memsim_parse_size_of("MEMSIM_HOST_MEMORY", env, &v, error))
            *ok = FALSE;
        return v;
    }
    g_autofree char *text = NULL;
    if (!g_file_get_contents("/proc/meminfo", &text, NULL, NULL))
        return 0;
    const char *line = strstr(text, "MemAvailable:");
    unsigned long long kib = 0;
    if (!line || sscanf(line, "MemAvailable: %llu kB", &kib) != 1)
        return 0;
    return (memsim_size_t)kib * 1024;
}

gboolean memsim_estimate_host_check(const MemsimModel *m, const MemsimRun *run,
                                    memsim_size_t *need, GError **error)
{
    *need = 0;
    MemsimRun r = *run;
    memsim_run_adapt(&r, m);
    if (r.inference)
        return TRUE;
    MemsimResolvedRun rr = memsim_run_resolve(&r);
    /* the micro-batches each rank's program generates per step: a pipeline's all of them; the
     * loop's at most the first three, one repetition and the last when the middle ones repeat
     * (traces/loop.c) */
    int64_t per_step = rr.pp > 1 ? rr.microbatches : r.grad_accum;
    if (rr.pp == 1 && loop_skip_enabled() && per_step > 5)
        per_step = 5;
    /* a loop's steps from the third on repeat the second (traces/loop.c) */
    int64_t steps = loop_repeats(rr.method, rr.pp) ? MIN(r.steps, LOOP_GENERATED) : r.steps;
    int64_t probe_units = rr.pp > 1 ? rr.pp : 1;
    if (steps * per_step <= 8 * probe_units)
        return TRUE; /* small: no more than its trace at one or two micro-batches a step */
    gboolean ok;
    memsim_size_t avail = host_available(error, &ok);
    if (!ok)
        return FALSE;
    /* far below the memory there is by the estimate from the run's shape alone (the presets'
     * traces hold at most twice as many events: tests/test_steady.c), no probe is needed */
    const double shape = model_run_events(m, &r) * (double)sizeof(MemsimEvent) * 1.5;
    if (avail && MODEL_EVENTS_MARGIN * shape <= (double)avail) {
        *need = (memsim_size_t)shape;
        return TRUE;
    }
    /* a probe: one step of the fewest micro-batches, its events counted */
    MemsimRun probe = r;
    probe.steps = 1;
    probe.grad_accum = 1;
    if (rr.pp > 1)
        probe.microbatches = rr.pp;
    MemsimTrace *t = memsim_generate(m, &probe, NULL);
    if (!t)
        return TRUE; /* a probe the run's own rules refuse (a Megatron launch's batch
                      * arithmetic): nothing projected; the run itself says what is wrong */
    uint64_t events = 0;
    for (guint32 k = 0; k < memsim_trace_header(t)->n_ranks; k++) {
        gsize n = 0;
        memsim_trace_events(t, k, &n);
        events += n;
    }
    memsim_trace_free(t);
    double projected = (double)events * (double)steps * (double)per_step / (double)probe_units;
    /* the trace's events (40 bytes each) and half as much again: the generator's array grows
     * by doubling, the replay's state, the op table */
    double bytes = projected * (double)sizeof(MemsimEvent) * 1.5;
    *need = (memsim_size_t)bytes;
    if (avail && bytes > (double)avail) {
        char b[32], a[32];
        memsim_format_bytes((memsim_size_t)bytes, b, sizeof b);
        memsim_format_bytes(avail, a, sizeof a);
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "this run's simulation would need about %s of host memory (%.0f events: %d "
                    "step(s) × %" G_GINT64_FORMAT " micro-batches generated per step × %.0f events "
                    "each over all ranks, from a one-step probe of %" G_GINT64_FORMAT
                    "), more than the %s this machine has available (MemAvailable, or "
                    "MEMSIM_HOST_MEMORY); fewer micro-batches (--grad-accum, --microbatches) or "
                    "steps would fit",
                    b, projected, (int)steps, per_step, (double)events / (double)probe_units,
                    probe_units, a);
        return FALSE;
    }
    return TRUE;
}
