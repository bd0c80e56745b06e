/* memsim — a DeepSpeed run described by its ds_config.json.
 *
 *     MemsimDeepspeed *ds = memsim_deepspeed_load("ds_config.json", &err); // NULL: exit 2
 *     MemsimRun run = memsim_run_defaults();
 *     memsim_run_set(&run, "gpus", "8", &err);               // the world size, if not derived
 *     if (!memsim_deepspeed_apply(ds, &run, &err)) ...       // method, batch, precision, …
 *     MemsimReport *r = memsim_estimate(model, &run, &opt, &err);
 *
 * Every key that changes memory is mapped (zero_optimization's stage, buckets, overlap,
 * contiguous gradients, stage-3 prefetch, live, reuse and persistence limits, sub-groups,
 * offload_optimizer and offload_param to the CPU; fp16, bf16; the batch keys; the optimizer)
 * or refused (MEMSIM_ERROR_BAD_INPUT naming it) where memsim does not model it (NVMe offload,
 * ZeRO++ quantisation and hierarchical partitioning, MiCS, activation partitioning, …); keys
 * that contradict each other are refused naming them; keys that change no memory (logging,
 * monitors, the scheduler, …) are taken silently; a key memsim does not know is listed in
 * one warning line. "auto" (as Hugging Face's Trainer writes it) takes what the Trainer
 * would put there: the run's setting (batch, grad-accum, precision, optimizer) or, for the
 * bucket sizes, the model's hidden size (integrations/deepspeed.py
 * HfTrainerDeepSpeedConfig.trainer_config_finalize). */
#ifndef MEMSIM_DEEPSPEED_H
#define MEMSIM_DEEPSPEED_H

#include <memsim/gen.h>

G_BEGIN_DECLS

typedef struct MemsimDeepspeed MemsimDeepspeed;

/* Reads `path`. NULL with MEMSIM_ERROR_BAD_INPUT on error (an unreadable or malformed file, a
 * refused key, contradicting keys). */
MEMSIM_API MemsimDeepspeed *memsim_deepspeed_load(const char *path, GError **error);
/* The same with KEY=VALUE overrides over the file (NULL-terminated, may be NULL): a dotted
 * key ("zero_optimization.offload_optimizer.device=cpu"), the value read as JSON or else as a
 * string (memsim --deepspeed-set). */
MEMSIM_API MemsimDeepspeed *memsim_deepspeed_load_set(const char *path, const char *const *sets,
                                                      GError **error);
/* The KEY=VALUE overrides taken (NULL-terminated; owned by `ds`), or NULL for none. */
MEMSIM_API const char *const *memsim_deepspeed_sets_given(const MemsimDeepspeed *ds);
/* The same from JSON text; `where` names it in messages. */
MEMSIM_API MemsimDeepspeed *memsim_deepspeed_parse(const char *text, const char *where,
                                                   GError **error);
/* NULL is accepted. */
MEMSIM_API void memsim_deepspeed_free(MemsimDeepspeed *ds);
/* Whether the config decides run setting `key` (memsim_run_set's names: method, batch,
 * grad-accum, precision, optimizer, gpus): memsim_deepspeed_apply sets it, so the same
 * setting given to the run too is a contradiction for the caller to refuse. "gpus" is TRUE
 * when train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps are
 * all given as numbers (DeepSpeed's world size is then their quotient). */
MEMSIM_API gboolean memsim_deepspeed_sets(const MemsimDeepspeed *ds, const char *key);
/* Sets the run's settings from the config (the method from zero_optimization.stage, batch,
 * grad-accum, precision, optimizer; gpus where the batch keys give it) and points
 * run->deepspeed at `ds`, which must outlive the run's use. FALSE with MEMSIM_ERROR_BAD_INPUT
 * naming the keys when train_batch_size does not equal micro-batch × accumulation × the
 * run's GPUs (DeepSpeed's config.py _batch_assertion). */
MEMSIM_API gboolean memsim_deepspeed_apply(const MemsimDeepspeed *ds, MemsimRun *run,
                                           GError **error);
/* The warnings, one line each (NULL-terminated; owned by `ds`): the keys memsim does not
 * know (one line naming them all) and memory the run does not reach (the 16-bit gather at
 * save time). */
MEMSIM_API const char *const *memsim_deepspeed_warnings(const MemsimDeepspeed *ds);
/* The file's path (or `where`); owned by `ds`. */
MEMSIM_API const char *memsim_deepspeed_source(const MemsimDeepspeed *ds);

G_END_DECLS

#endif
