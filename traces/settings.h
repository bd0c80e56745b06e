/* Internal: the run settings (traces/settings.c) by number, and the value parsers of the
 * settings given as text, shared by the run settings (memsim_run_set) and the plan options
 * (memsim_plan_options_set) so that both accept and refuse alike, with the same messages. */
#ifndef MEMSIM_TRACES_SETTINGS_H
#define MEMSIM_TRACES_SETTINGS_H

#include <glib.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <stdint.h>

/* The run settings, in the order of the table (memsim_run_setting_info) and of the bits of
 * MemsimRun.given. */
typedef enum {
    SETTING_BATCH,
    SETTING_SEQ,
    SETTING_STEPS,
    SETTING_GRAD_ACCUM,
    SETTING_PRECISION,
    SETTING_OPTIMIZER,
    SETTING_OPTIMIZER_IMPL,
    SETTING_ZERO_GRAD,
    SETTING_ATTENTION,
    SETTING_CHECKPOINTING,
    SETTING_SAC_OPS,
    SETTING_FINETUNE,
    SETTING_LORA_RANK,
    SETTING_LORA_TARGETS,
    SETTING_TORCH_VERSION,
    SETTING_TRANSFORMERS_VERSION,
    SETTING_USE_CACHE,
    SETTING_INFERENCE,
    SETTING_PROMPT,
    SETTING_GENERATE,
    SETTING_WEIGHTS,
    SETTING_KEEP_OUTPUTS,
    SETTING_DEVICE,
    SETTING_GPUS,
    SETTING_METHOD,
    SETTING_TP,
    SETTING_PP,
    SETTING_DP,
    SETTING_PP_SCHEDULE,
    SETTING_MICROBATCHES,
    SETTING_VIRTUAL_STAGES,
    SETTING_SEQUENCE_PARALLEL,
    SETTING_FSDP_WRAP,
    SETTING_FSDP_VERSION,
    SETTING_FSDP_SHARDING,
    SETTING_FSDP_PARAM_DTYPE,
    SETTING_FSDP_REDUCE_DTYPE,
    SETTING_FSDP_OUTPUT_DTYPE,
    SETTING_FSDP_OFFLOAD,
    SETTING_FSDP_LIMIT_ALL_GATHERS,
    SETTING_FSDP_BACKWARD_PREFETCH,
    SETTING_FSDP_USE_ORIG_PARAMS,
    SETTING_FSDP_RESHARD_AFTER_FORWARD,
    SETTING_ZERO_REDUNDANCY,
    SETTING_GPUS_PER_NODE,
    SETTING_GPU,
    SETTING_CUBLAS_WORKSPACE,
    SETTING_EFFICIENCY,
    SETTING_NETWORK_GBS,
    SETTING_MOE_IMBALANCE,
    N_SETTINGS
} SettingId;

/* The GPU profile of a run (run->gpu, NULL: the default) with the run's time-model settings
 * (--efficiency, --network-gbs) applied: `buf` when they change it, else the profile; NULL
 * for an unknown name. */
const MemsimGpu *run_gpu(const MemsimRun *run, MemsimGpu *buf);
/* The time model's assumptions of a profile (traces/gpus.c), for reports. */
void memsim_time_model_of(const MemsimGpu *gpu, MemsimTimeModel *out);

/* The key of a setting: "grad-accum" (the command's flag without "--"). */
const char *setting_name(SettingId id);
/* The name of value `value` (the C enum's) of an enumerated setting, as it is given. */
const char *setting_value_name(SettingId id, int value);

/* An integer in [lo, hi]; else FALSE with "KEY: 'V' is not an integer in [lo, hi]". */
gboolean setting_int(const char *key, const char *v, int64_t lo, int64_t hi, int64_t *out,
                     GError **error);
/* false, true, no, yes, 0 or 1 (any case); else FALSE with "KEY: 'V' is not one of ...". */
gboolean setting_bool(const char *key, const char *v, gboolean *out, GError **error);
/* Sets a MEMSIM_ERROR_BAD_INPUT error with the formatted message (which names the setting)
 * and returns FALSE: settings that do not go together. */
gboolean setting_refuse(GError **error, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* FALSE with an error naming the setting when a run on several GPUs (`megatron`: a Megatron
 * run) was given a loop setting its method's framework decides itself or does not take; with
 * no method (plan's sweep), one that some method refuses. */
gboolean setting_check_distributed_loop(const MemsimRun *r, gboolean megatron, GError **error);


#endif
