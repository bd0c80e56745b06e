/* memsim — a Megatron-LM launch described by Megatron's own flags.
 *
 *     MemsimMegatron *mg = memsim_megatron_load("train.sh", &err);   // NULL, exit 2 on bad input
 *     MemsimRun run = memsim_run_defaults();
 *     memsim_megatron_set_gpus(mg, 16, &err);           // only for a launch that does not say
 *     memsim_megatron_apply(mg, &run);                  // tp, pp, dp, batch, seq, precision …
 *     MemsimReport *r = memsim_estimate(memsim_megatron_model(mg), &run, &opt, &err);
 *
 * The file is a command line (`torchrun … pretrain_gpt.py --num-layers 12 …`), a shell
 * script's argument list (`MODEL_ARGS=( … )`, `GPT_ARGS="…"`, line continuations), or a
 * Megatron functional test's model_config.yaml (its MODEL_ARGS and ENV_VARS maps). Every flag
 * that changes memory is mapped, or refused (MEMSIM_ERROR_BAD_INPUT naming it) where memsim
 * does not model it (fp8, MoE, …); flags that contradict each other are refused naming them;
 * a flag memsim does not know is listed in a warning. Flags left out take Megatron's defaults
 * (megatron/training/arguments.py). */
#ifndef MEMSIM_MEGATRON_H
#define MEMSIM_MEGATRON_H

#include <memsim/gen.h>

G_BEGIN_DECLS

typedef struct MemsimMegatron MemsimMegatron;

/* Reads `path` (see above). NULL with MEMSIM_ERROR_BAD_INPUT on error, an unreadable file too. */
MEMSIM_API MemsimMegatron *memsim_megatron_load(const char *path, GError **error);
/* The same from text; `where` names it in messages. */
MEMSIM_API MemsimMegatron *memsim_megatron_parse(const char *text, const char *where, GError **error);
/* NULL is accepted. */
MEMSIM_API void memsim_megatron_free(MemsimMegatron *mg);
/* The model the flags build (family "megatron"); owned by `mg`. */
MEMSIM_API const MemsimModel *memsim_megatron_model(const MemsimMegatron *mg);
/* Sets the run's settings from the launch (batch = micro-batch, seq, gpus, tp, pp, dp,
 * micro-batches, schedule, precision, …) and points run->megatron at `mg`, which must outlive
 * the run's use. */
MEMSIM_API void memsim_megatron_apply(const MemsimMegatron *mg, MemsimRun *run);
/* Whether the launch decides run setting `key` (memsim_run_set's names: tp, pp, dp, batch,
 * seq, microbatches, precision, …): memsim_megatron_apply sets it, so the same setting given
 * to the run too is a contradiction for the caller to refuse. "gpus" is TRUE only when the
 * launch gives its world size (torchrun's --nproc-per-node × --nnodes, WORLD_SIZE, or
 * GPUS_PER_NODE × NUM_NODES). */
MEMSIM_API gboolean memsim_megatron_sets(const MemsimMegatron *mg, const char *key);
/* The world size of a launch that does not give it (a model_config.yaml, whose harness runs 8
 * GPUs on one node; a command line without a launcher: 1 GPU). FALSE with
 * MEMSIM_ERROR_BAD_INPUT naming both when the launch gives it itself, or naming the flags that
 * do not fit `gpus` (TP × PP × CP not dividing it, a global batch that does not divide). */
MEMSIM_API gboolean memsim_megatron_set_gpus(MemsimMegatron *mg, int gpus, GError **error);
/* The warnings, one line each (NULL-terminated; owned by `mg`): the flags memsim does not
 * know (one line naming them all), small changes of memory it does not model, and what
 * Megatron itself would say (sequence parallelism dropped at TP 1, a flag it ignores). */
MEMSIM_API const char *const *memsim_megatron_warnings(const MemsimMegatron *mg);
/* PYTORCH_CUDA_ALLOC_CONF of the launch's environment, or NULL; owned by `mg`. */
MEMSIM_API const char *memsim_megatron_alloc_conf(const MemsimMegatron *mg);

G_END_DECLS

#endif
