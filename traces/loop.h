/* Internal: the one training loop and the optimizer (traces/loop.c), shared by the run on one
 * GPU (traces/run.c), the data-parallel methods and Megatron's pipeline stages
 * (traces/distributed.c).
 *
 *     Optimizer o;
 *     optimizer_init(&o, run, rules);          // torch.optim as the run asks; a method may
 *     o.to_none = true;                        // change what its framework decides itself
 *     LoopHooks h = {.before_forward = gather_root, ..., .user = method};
 *     loop_train(&model, &o, &h);              // every step, micro-batch and optimizer step
 *     optimizer_clear(g, &o);
 *
 * A pipeline stage runs its own schedule of forwards and backwards and calls loop_mark_step
 * and loop_optimizer_step for the rest of the step.
 */
#ifndef MEMSIM_TRACES_LOOP_H
#define MEMSIM_TRACES_LOOP_H

#include "traces/models.h"

/* The optimizer (AUTOGRAD_MEMORY.md §9): its state, created lazily at the first step, and
 * the temporaries of its update, for whatever parameters the program hands it (the model's
 * on one GPU and with DDP, flat or sharded partitions with ZeRO, FSDP and Megatron). */
typedef struct {
    MemsimOptimizer kind;
    MemsimOptimizerImpl impl; /* for-loop, foreach or fused: never DEFAULT */
    bool step_tensor;         /* AdamW keeps state['step'] as a tensor (torch: fused, or CPU) */
    bool to_none;             /* zero_grad(set_to_none=True): gradients freed, else kept */
    bool plain_ops;           /* state and temporaries written as `empty` allocations */
    bool v113;                /* torch 1.13 (its foreach AdamW makes one more list) */
    GPtrArray *state;         /* AgTensor* (references) */
    bool initialised;
} Optimizer;

/* The implementation and the zero_grad a run gets from torch.optim: the one given, else the
 * version's default (1.13: for-loop and zero_grad in place; 2.x: foreach on CUDA and
 * set_to_none). */
/* The rules of the PyTorch version (and device, GPU) a run's program follows
 * (AUTOGRAD_MEMORY.md §12). */
AgRules run_rules(const MemsimRun *run);
/* The optimizer implementation and the zero_grad mode the run comes to (its settings, the
 * version's defaults, the method resolved from the run): for the run's description
 * (traces/settings.c). */
void optim_choice(const MemsimRun *run, MemsimMethod method, MemsimOptimizerImpl *impl,
                  gboolean *to_none);
MemsimOptimizerImpl optim_effective_impl(const MemsimRun *run, const AgRules *rules);
gboolean optim_effective_to_none(const MemsimRun *run, const AgRules *rules);

/* torch.optim as `run` asks for it (optimizer, implementation, zero_grad). */
void optimizer_init(Optimizer *o, const MemsimRun *run, const AgRules *rules);
/* Drops the state (at the end of the program). */
void optimizer_clear(AgGraph *g, Optimizer *o);
/* What the method's framework makes of the optimizer (DeepSpeed's FusedAdam for ZeRO with
 * AdamW, Megatron's distributed optimizer; both set the gradients to None): the one rule
 * for the programs and the run's description. */
void optimizer_for_method(Optimizer *o, MemsimMethod method);

/* What a method adds around the loop; every entry is optional (NULL: nothing). */
typedef struct {
    /* after the step's mark, before its first forward */
    void (*before_step)(void *user, int step);
    /* before each micro-batch's forward, the forward's context (phase, autocast) set */
    void (*before_forward)(void *user);
    /* after each micro-batch's backward */
    void (*after_backward)(void *user);
    /* in the optimizer phase, before the update: returns the parameters the optimizer steps,
     * their .grad set (the method keeps the array); NULL hook: the model's trainable ones */
    GPtrArray *(*before_optimizer)(void *user, int step);
    /* after the update and zero_grad */
    void (*after_optimizer)(void *user, int step);
    void *user;
    /* the loop goes on `n` micro-batches later without running them (a steady state,
     * MEMSIM_EV_REPEAT): the method counts them as run. A method with hooks but without this
     * one gets every micro-batch run. */
    void (*skip_microbatches)(void *user, int n);
} LoopHooks;

/* Whether the loop may emit a steady state (MEMSIM_EV_REPEAT) instead of running the middle
 * micro-batches that repeat: unless the environment has MEMSIM_NO_SKIP set (for comparing
 * with the full simulation). */
bool loop_skip_enabled(void);
/* Whether a run's program, by its resolved method and pipeline degree (memsim_run_resolve),
 * is a loop (loop_train: one GPU, DDP, ZeRO, FSDP; not a Megatron stage) whose repetitions are
 * generated once: then it generates at most LOOP_GENERATED micro-batches a step and
 * LOOP_GENERATED steps (the first ones, one repetition, the last). */
bool loop_repeats(MemsimMethod method, int pp);
#define LOOP_GENERATED 5

/* The units of one step (traces/loop.c): loop_steady_begin before each, `middle` for those
 * that may repeat (a REPEAT placeholder goes before them); loop_steady_end after a middle
 * one, with how many middle units follow it: when it repeats the unit before it, the REPEAT
 * says that many more, and it returns that many (the caller goes on after them), else 0. */
typedef struct {
    bool on;
    int n, cap; /* units noted (the last cap) */
    GgUnitState *start;
    guint *place;   /* their placeholders (G_MAXUINT: none) */
    uint32_t flags; /* the REPEAT's flags (MEMSIM_EVF_STEPS: units that hold repeats) */
} LoopSteady;
/* `reach`: how many units back the tensors a unit frees may have been made (the
 * micro-batches a pipeline stage holds in flight); the units noted reach that far and more. */
void loop_steady_init(LoopSteady *s, bool on, int reach);
void loop_steady_clear(LoopSteady *s);
void loop_steady_begin(AgGraph *g, LoopSteady *s, bool middle);
int loop_steady_end(AgGraph *g, LoopSteady *s, int left);

/* The training loop (traces/loop.c's header): run->steps steps of run->grad_accum
 * micro-batches of `md`, hooks may be NULL. Ends the program: the trace's final state is
 * what is alive then. */
void loop_train(Model *md, Optimizer *o, const LoopHooks *hooks);

/* The mark that opens step `step` (1-based). */
void loop_mark_step(AgGraph *g, int step);
/* The optimizer phase of a step: hooks->before_optimizer (else `params`), the update, the
 * model-state breakdown mark when `last`, zero_grad, hooks->after_optimizer. */
void loop_optimizer_step(AgGraph *g, Optimizer *o, const LoopHooks *hooks, GPtrArray *params,
                         int step, bool last);

#endif
