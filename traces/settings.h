/* Internal: the value parsers of the settings given as text (traces/run.c), shared by the run
 * settings (memsim_run_set) and the plan options (memsim_plan_options_set) so that both
 * accept and refuse alike, with the same messages. */
#ifndef MEMSIM_TRACES_SETTINGS_H
#define MEMSIM_TRACES_SETTINGS_H

#include <glib.h>
#include <memsim/gen.h>
#include <stdint.h>

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
 * no method (plan's sweep), one that some method refuses (traces/run.c). */
gboolean setting_check_distributed_loop(const MemsimRun *r, gboolean megatron, GError **error);

#endif
