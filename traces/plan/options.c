/* Plan options from text (include/memsim/plan.h): the keys are the flags of `memsim plan`
 * without "--", so that bindings (the Python module) and the command set them alike. */
#include <memsim/alloc.h>
#include <memsim/plan.h>

#include <string.h>

#include "traces/settings.h"

MemsimPlanOptions *memsim_plan_options_new(void)
{
    MemsimPlanOptions *o = g_new(MemsimPlanOptions, 1);
    *o = memsim_plan_options_defaults();
    return o;
}

void memsim_plan_options_free(MemsimPlanOptions *o)
{
    g_free(o);
}

void memsim_plan_options_use_run(MemsimPlanOptions *o, const MemsimRun *run)
{
    o->run = run;
    if (run) {
        o->gpus = run->gpus;
        o->gpu = run->gpu;
        o->gpus_per_node = run->gpus_per_node;
        if (run->compute_efficiency > 0)
            o->efficiency = run->compute_efficiency;
        if (run->network_gbs > 0)
            o->network_gbs = run->network_gbs;
    }
}

static gboolean real(const char *key, const char *v, double lo, double hi, double *out,
                     GError **error)
{
    char *end = NULL;
    double x = g_ascii_strtod(v, &end);
    if (!*v || *end || !(x > lo && x <= hi)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: '%s' is not a number in (%g, %g]", key, v, lo, hi);
        return FALSE;
    }
    *out = x;
    return TRUE;
}

const char *const *memsim_plan_option_keys(void)
{
    static const char *const keys[] = {
        "global-batch", "gpu-mem", "mig", "methods", "schedules", "checkpointing-modes",
        "max-batch", "no-expandable", "no-offload", "top", "misses", "exhaustive", "threads",
        "cuda-context", "nccl-mem", "efficiency", "network-gbs", NULL};
    return keys;
}

gboolean memsim_plan_options_set(MemsimPlanOptions *o, const char *key, const char *v,
                                 GError **error)
{
    int64_t x;
    double d;
    g_return_val_if_fail(o && key && v, FALSE);
    if (strcmp(key, "global-batch") == 0) {
        if (!setting_int(key, v, 0, G_MAXINT64 / 2, &x, error))
            return FALSE;
        o->global_batch = x;
    } else if (strcmp(key, "max-batch") == 0) {
        if (!setting_int(key, v, 0, 1 << 20, &x, error))
            return FALSE;
        o->max_batch = x;
    } else if (strcmp(key, "top") == 0 || strcmp(key, "misses") == 0 ||
               strcmp(key, "threads") == 0) {
        if (!setting_int(key, v, 0, 1 << 16, &x, error))
            return FALSE;
        *(key[0] == 't' ? key[1] == 'o' ? &o->top : &o->threads : &o->misses) = (int)x;
    } else if (strcmp(key, "gpu-mem") == 0) {
        if (!memsim_parse_gpu_mem("gpu-mem", v, &o->gpu_mem, NULL, error))
            return FALSE;
    } else if (strcmp(key, "cuda-context") == 0) {
        if (!memsim_parse_size_of(key, v, &o->context_bytes, error))
            return FALSE;
    } else if (strcmp(key, "nccl-mem") == 0) {
        if (!memsim_parse_size_of(key, v, &o->nccl_bytes, error))
            return FALSE;
    } else if (strcmp(key, "methods") == 0 || strcmp(key, "schedules") == 0) {
        if (!memsim_plan_parse_list(key, v, key[0] == 'm' ? &o->methods : &o->schedules, error))
            return FALSE;
    } else if (strcmp(key, "checkpointing-modes") == 0) {
        if (!memsim_plan_parse_list("checkpointing", v, &o->checkpointing, error))
            return FALSE;
    } else if (strcmp(key, "mig") == 0) {
        if (!setting_bool(key, v, &o->mig, error))
            return FALSE;
    } else if (strcmp(key, "exhaustive") == 0) {
        if (!setting_bool(key, v, &o->exhaustive, error))
            return FALSE;
    } else if (strcmp(key, "no-expandable") == 0) {
        if (!setting_bool(key, v, &o->no_expandable, error))
            return FALSE;
    } else if (strcmp(key, "no-offload") == 0) {
        if (!setting_bool(key, v, &o->no_offload, error))
            return FALSE;
    } else if (strcmp(key, "efficiency") == 0) {
        if (!real(key, v, 0.0, 1.0, &d, error))
            return FALSE;
        o->efficiency = d;
    } else if (strcmp(key, "network-gbs") == 0) {
        if (!real(key, v, 0.0, 1e6, &d, error))
            return FALSE;
        o->network_gbs = d;
    } else {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "unknown plan option '%s'", key);
        return FALSE;
    }
    return TRUE;
}
