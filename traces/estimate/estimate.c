/* The estimate (include/memsim/estimate.h): a run generated from a model and judged on a
 * device, the one judge step that estimate, plan, compare and the Python module share
 * (traces/estimate/judge.h).
 */
#include <memsim/estimate.h>

#include "traces/estimate/judge.h"
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
