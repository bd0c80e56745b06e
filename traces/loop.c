/* The one training loop (traces/loop.h) and the optimizer, for every program: one GPU, DDP,
 * ZeRO-1/2/3, FSDP and HSDP through loop_train; Megatron's pipeline stages through
 * loop_mark_step and loop_optimizer_step around their schedule.
 *
 * The loop is the one HF's Trainer runs for each optimizer step:
 *     for each micro-batch: with autocast: loss = model(ids, labels=labels).loss
 *                           loss.backward()            (outputs dropped before backward)
 *     optimizer.step(); optimizer.zero_grad()
 * With keep-outputs the model output object is held until the next step's forward has
 * returned, as a hand-written `out = model(...)` loop does. A distributed method adds its
 * collectives and buffers through the hooks (LoopHooks) and hands the optimizer what it holds
 * as the optimizer's parameters: the model's on one GPU and with DDP (torch.optim on full
 * replicas), the flat fp32 partition with ZeRO (DeepSpeed wraps the optimizer around it), the
 * FlatParameter shards with FSDP, the fp32 main-parameter shard with Megatron.
 *
 * The optimizer (AUTOGRAD_MEMORY.md §9): AdamW (torch.optim.AdamW; its for-loop, foreach and
 * fused implementations differ in temporaries, §9.1), SGD with and without momentum,
 * transformers' Adafactor, bitsandbytes' 8-bit AdamW; the state is created lazily at the
 * first step (§9.2), so step 1 and step 2 have different peaks.
 */
#include "traces/loop.h"

#include <stdio.h>
#include <string.h>

MemsimOptimizerImpl optim_effective_impl(const MemsimRun *run, const AgRules *rules)
{
    if (run->optimizer_impl != MEMSIM_OPTIM_IMPL_DEFAULT)
        return run->optimizer_impl;
    /* 1.13: for-loop; 2.x: foreach on CUDA (§9.1) */
    return rules->v113 || !rules->cuda ? MEMSIM_OPTIM_IMPL_FOR_LOOP : MEMSIM_OPTIM_IMPL_FOREACH;
}

gboolean optim_effective_to_none(const MemsimRun *run, const AgRules *rules)
{
    return run->zero_grad_set ? run->zero_grad_to_none : !rules->v113;
}

void optimizer_init(Optimizer *o, const MemsimRun *run, const AgRules *rules)
{
    *o = (Optimizer){0};
    o->kind = run->optimizer;
    o->impl = optim_effective_impl(run, rules);
    o->step_tensor = !rules->cuda || o->impl == MEMSIM_OPTIM_IMPL_FUSED; /* on CPU / device */
    o->to_none = optim_effective_to_none(run, rules);
    o->v113 = rules->v113;
    o->state = g_ptr_array_new();
}

void optimizer_for_method(Optimizer *o, MemsimMethod method)
{
    switch (method) {
    case MEMSIM_METHOD_ZERO1:
    case MEMSIM_METHOD_ZERO2:
    case MEMSIM_METHOD_ZERO3:
        /* AdamW is the config's optimizer, DeepSpeed's FusedAdam: multi-tensor, in place, the
         * step count kept on the host; any other is the client's torch optimizer (HF's
         * Trainer passes its own, with zero_allow_untested_optimizer), wrapped around the
         * flat partition. The engine zeroes the gradients itself after each step
         * (engine.py _take_model_step → zero_grad(set_to_none=True)). */
        if (o->kind == MEMSIM_OPTIM_ADAMW) {
            o->impl = MEMSIM_OPTIM_IMPL_FUSED;
            o->step_tensor = false;
        }
        o->to_none = true;
        break;
    case MEMSIM_METHOD_MEGATRON:
        /* the distributed optimizer wraps apex/TE FusedAdam (multi-tensor, in place, the step
         * count on the host); its zero_grad sets the main parameters' gradients to None, the
         * grad buffer is zeroed in place (zero_grad_buffer) */
        o->impl = MEMSIM_OPTIM_IMPL_FUSED;
        o->step_tensor = false;
        o->to_none = true;
        break;
    default: /* one GPU, DDP and FSDP step torch.optim as the settings and version say */
        break;
    }
}

void optimizer_clear(AgGraph *g, Optimizer *o)
{
    for (guint i = 0; i < o->state->len; i++)
        gt_unref(g, o->state->pdata[i]);
    g_ptr_array_unref(o->state);
    o->state = NULL;
}

/* ---- the update ---- */

/* A state tensor shaped like p (torch: zeros_like), kept by the optimizer. */
static void add_state(AgGraph *g, Optimizer *o, const AgTensor *p, DType dt)
{
    AgContext *c = gg_ctx(g);
    uint8_t old = c->category;
    c->category = MEMSIM_CAT_OPTIMIZER_STATE;
    g_ptr_array_add(o->state,
                    op_new(g, o->plain_ops ? "empty" : "zeros_like", dt, p->nd, p->shape));
    c->category = old;
}

/* A temporary of the update, made by the op `name`. */
static AgTensor *temporary(AgGraph *g, const Optimizer *o, const char *name, DType dt,
                           const AgTensor *p)
{
    return op_new(g, o->plain_ops ? "empty" : name, dt, p->nd, p->shape);
}

static void adamw(AgGraph *g, Optimizer *o, GPtrArray *ps, bool first)
{
    if (first) {
        /* lazy state, all of it before any update (§9.2) */
        for (guint i = 0; i < ps->len; i++) {
            AgTensor *p = ps->pdata[i];
            if (!p->grad)
                continue;
            if (o->step_tensor)
                add_state(g, o, &(AgTensor){.nd = 0}, DT_F32);
            add_state(g, o, p, p->dt);
            add_state(g, o, p, p->dt);
        }
    }
    if (o->impl == MEMSIM_OPTIM_IMPL_FOR_LOOP) {
        /* denom = (exp_avg_sq.sqrt() / bc2).add_(eps): sqrt and div alloc; the previous
         * denom dies when the name is rebound */
        AgTensor *denom = NULL;
        for (guint i = 0; i < ps->len; i++) {
            AgTensor *p = ps->pdata[i];
            if (!p->grad)
                continue;
            AgTensor *sq = temporary(g, o, "sqrt", p->dt, p);
            AgTensor *d = temporary(g, o, "div", p->dt, p);
            gt_unref(g, sq);
            gt_unref(g, denom);
            denom = d;
        }
        gt_unref(g, denom);
    } else if (o->impl == MEMSIM_OPTIM_IMPL_FOREACH) {
        /* one list of sqrt per (device, dtype) group; 1.13 also a denom list */
        GPtrArray *l1 = g_ptr_array_new(), *l2 = g_ptr_array_new();
        for (guint i = 0; i < ps->len; i++) {
            AgTensor *p = ps->pdata[i];
            if (p->grad)
                g_ptr_array_add(l1, temporary(g, o, "_foreach_sqrt", p->dt, p));
        }
        if (o->v113)
            for (guint i = 0; i < ps->len; i++) {
                AgTensor *p = ps->pdata[i];
                if (p->grad)
                    g_ptr_array_add(l2, temporary(g, o, "_foreach_add", p->dt, p));
            }
        for (guint i = 0; i < l2->len; i++)
            gt_unref(g, l2->pdata[i]);
        for (guint i = 0; i < l1->len; i++)
            gt_unref(g, l1->pdata[i]);
        g_ptr_array_unref(l1);
        g_ptr_array_unref(l2);
    }
    /* fused: in place, no temporaries */
}

static void adamw_8bit(AgGraph *g, Optimizer *o, GPtrArray *ps, bool first)
{
    if (!first)
        return;
    for (guint i = 0; i < ps->len; i++) {
        AgTensor *p = ps->pdata[i];
        if (!p->grad)
            continue;
        int64_t n = gt_numel(p);
        if (n < 4096) { /* bitsandbytes keeps small tensors in 32-bit state */
            add_state(g, o, p, DT_F32);
            add_state(g, o, p, DT_F32);
        } else {
            add_state(g, o, p, DT_U8);
            add_state(g, o, p, DT_U8);
            int64_t blocks = (n + 2047) / 2048;
            add_state(g, o, &(AgTensor){.nd = 1, .shape = {blocks}}, DT_F32);
            add_state(g, o, &(AgTensor){.nd = 1, .shape = {blocks}}, DT_F32);
        }
    }
}

/* transformers' Adafactor: factored second moments for matrices (row and column means, fp32),
 * a full one for vectors (a flat 1-D partition is a vector); update = grad**2 + eps and the
 * approximated update are full-size fp32 temporaries per parameter */
static void adafactor(AgGraph *g, Optimizer *o, GPtrArray *ps, bool first)
{
    for (guint i = 0; i < ps->len; i++) {
        AgTensor *p = ps->pdata[i];
        if (!p->grad)
            continue;
        if (first) {
            if (p->nd >= 2) {
                add_state(g, o, &(AgTensor){.nd = 1, .shape = {p->shape[0]}}, DT_F32);
                add_state(g, o, &(AgTensor){.nd = 1, .shape = {p->shape[1]}}, DT_F32);
            } else {
                add_state(g, o, p, DT_F32);
            }
        }
        AgTensor *u = temporary(g, o, "pow", DT_F32, p);
        AgTensor *a = temporary(g, o, "mul", DT_F32, p);
        gt_unref(g, u);
        gt_unref(g, a);
    }
}

static void update(AgGraph *g, Optimizer *o, GPtrArray *ps)
{
    gg_ctx(g)->category = MEMSIM_CAT_TEMPORARY;
    bool first = !o->initialised;
    o->initialised = true;
    switch (o->kind) {
    case MEMSIM_OPTIM_ADAMW:
        adamw(g, o, ps, first);
        break;
    case MEMSIM_OPTIM_ADAMW_8BIT:
        adamw_8bit(g, o, ps, first);
        break;
    case MEMSIM_OPTIM_SGD_MOMENTUM:
        if (first) /* momentum_buffer = grad.clone() at the first step */
            for (guint i = 0; i < ps->len; i++) {
                AgTensor *p = ps->pdata[i];
                if (p->grad)
                    add_state(g, o, p, p->dt);
            }
        break;
    case MEMSIM_OPTIM_ADAFACTOR:
        adafactor(g, o, ps, first);
        break;
    case MEMSIM_OPTIM_SGD:
        break;
    }
}

/* optimizer.zero_grad(): set_to_none frees the gradients; in place they stay (zeroed) and
 * the next backward accumulates into them. */
static void zero_grad(AgGraph *g, const Optimizer *o, GPtrArray *ps)
{
    if (!o->to_none)
        return;
    for (guint i = 0; i < ps->len; i++) {
        AgTensor *p = ps->pdata[i];
        if (p->grad) {
            AgTensor *gr = p->grad;
            p->grad = NULL;
            gt_unref(g, gr);
        }
    }
}

/* ---- the loop ---- */

void loop_mark_step(AgGraph *g, int step)
{
    g_autofree char *mark = memsim_mark_step((uint32_t)step);
    gg_mark(g, mark);
}

void loop_optimizer_step(AgGraph *g, Optimizer *o, const LoopHooks *hooks, GPtrArray *params,
                         int step, bool last)
{
    AgContext *c = gg_ctx(g);
    c->microbatch = -1;
    c->phase = MEMSIM_PHASE_OPTIMIZER;
    gg_op(g, "optimizer.step");
    if (hooks && hooks->before_optimizer)
        params = hooks->before_optimizer(hooks->user, step);
    update(g, o, params);
    /* the model state after the update (the last step's), before zero_grad */
    if (last)
        gg_mark_breakdown(g, MEMSIM_BREAKDOWN_MODEL_STATE);
    zero_grad(g, o, params);
    if (hooks && hooks->after_optimizer)
        hooks->after_optimizer(hooks->user, step);
    c->phase = MEMSIM_PHASE_OTHER;
}

/* The output object a keep-outputs loop holds until the next forward has returned. */
typedef struct {
    AgTensor *logits, *loss;
    GPtrArray *cache; /* the KV cache it holds (references) */
} Held;

static void held_drop(AgGraph *g, Held *h)
{
    gt_unref(g, h->logits);
    gt_unref(g, h->loss);
    h->logits = h->loss = NULL;
    for (guint i = 0; i < h->cache->len; i++)
        gt_unref(g, h->cache->pdata[i]);
    g_ptr_array_set_size(h->cache, 0);
}

bool loop_skip_enabled(void)
{
    const char *e = g_getenv("MEMSIM_NO_SKIP");
    return !e || !*e || strcmp(e, "0") == 0;
}

bool loop_repeats(MemsimMethod method, int pp)
{
    return loop_skip_enabled() && method != MEMSIM_METHOD_MEGATRON && pp == 1;
}

/* ---- the steady state (MEMSIM_EV_REPEAT) ----
 *
 * A unit (a micro-batch of the loop, a forward-backward pair of a pipeline's steady phase) in
 * the middle of a step is a function of what is alive at its start: when unit k's events are
 * unit k-1's again — the same events, ops and costs, the ids of the tensors the last L + 1
 * units made moved by as many as a unit makes — and the live set is the same at its start and
 * end, the units that follow up to the last middle one are unit k again: a REPEAT before unit
 * k says so, and the program goes on after them. L is how many units back a unit reaches (the
 * loop's tensors die within the next micro-batch; a 1F1B stage's in-flight micro-batches
 * within its warm-up). */

void loop_steady_init(LoopSteady *s, bool on, int reach)
{
    memset(s, 0, sizeof *s);
    s->on = on;
    /* unit k-1-L made what unit k frees: L up to n - 2 */
    s->cap = MAX(16, reach + 4);
    if (on) {
        s->start = g_new(GgUnitState, s->cap);
        s->place = g_new(guint, s->cap);
    }
}

void loop_steady_clear(LoopSteady *s)
{
    g_free(s->start);
    g_free(s->place);
    s->start = NULL;
    s->place = NULL;
    s->on = false;
}

void loop_steady_begin(AgGraph *g, LoopSteady *s, bool middle)
{
    if (!s->on)
        return;
    /* a boundary REPEAT before each middle unit */
    guint ph = middle ? gg_repeat_placeholder(g) : G_MAXUINT;
    if (s->n == s->cap) {
        memmove(&s->start[0], &s->start[1], (size_t)(s->cap - 1) * sizeof s->start[0]);
        memmove(&s->place[0], &s->place[1], (size_t)(s->cap - 1) * sizeof s->place[0]);
        s->n--;
    }
    gg_unit_state(g, &s->start[s->n]);
    gg_unit_mark(g);
    s->place[s->n] = ph;
    s->n++;
}

int loop_steady_end(AgGraph *g, LoopSteady *s, int left)
{
    int n = s->n;
    if (!s->on || left < 1 || n < 3 || s->place[n - 1] == G_MAXUINT ||
        s->place[n - 2] == G_MAXUINT)
        return 0;
    GgUnitState end;
    gg_unit_state(g, &end);
    const GgUnitState *b = &s->start[n - 1];
    /* unit k-1 ends where unit k's REPEAT is */
    GgUnitState a_end = *b;
    a_end.event = s->place[n - 1];
    uint64_t shift = end.storage - b->storage;
    for (int L = 0; L <= n - 2; L++) {
        /* every unit from k-1-L on made as many ids */
        const GgUnitState *before = &s->start[n - 2 - L];
        if (s->start[n - 1 - L].storage - before->storage != shift)
            break;
        if (!gg_unit_repeats(g, before, &s->start[n - 2], &a_end, b, &end))
            continue;
        gg_repeat_set(g, s->place[n - 1], end.event - b->event, (uint64_t)left,
                      s->start[n - 1 - L].storage, shift, s->flags);
        s->on = false;
        return left;
    }
    return 0;
}

void loop_train(Model *md, Optimizer *o, const LoopHooks *hooks)
{
    AgGraph *g = md->g;
    AgContext *c = gg_ctx(g);
    const MemsimRun *run = md->run;
    int ac = run->precision == MEMSIM_PREC_BF16_MIXED   ? DT_BF16
             : run->precision == MEMSIM_PREC_FP16_MIXED ? DT_F16
                                                        : 0;
    AgTensor *ids = gg_leaf(g, DT_I64, SHAPE(run->batch, run->seq), false, MEMSIM_CAT_INPUT);
    /* the collator's labels (DataCollatorForLanguageModeling: input_ids.clone()), a device
     * tensor of their own */
    AgTensor *labels = gg_leaf(g, DT_I64, SHAPE(run->batch, run->seq), false, MEMSIM_CAT_INPUT);
    Held held = {NULL, NULL, g_ptr_array_new()};
    /* Whole steps as units (one GPU, and the methods whose hooks count skipped micro-batches:
     * DDP, ZeRO, FSDP): step 1 makes the optimizer's state, the last marks the model state,
     * the ones between repeat when their programs do (DDP rebuilds its buckets at step 2,
     * DeepSpeed prefetches from step 2 on: step 3 is the first that can repeat). A step whose
     * micro-batches repeat holds their REPEAT: its own is then a repeat of steps, which the
     * replay runs with the repeats inside it. A step's tensors die within the next (a held
     * output). */
    const bool mb_units = loop_skip_enabled() && run->grad_accum >= 5 &&
                          (!hooks || hooks->skip_microbatches);
    LoopSteady steps;
    loop_steady_init(&steps,
                     loop_skip_enabled() && (!hooks || hooks->skip_microbatches) &&
                         run->steps >= 5,
                     1);
    /* steps that hold a repeat of micro-batches repeat as steps (MEMSIM_EVF_STEPS) */
    steps.flags = mb_units ? MEMSIM_EVF_STEPS : 0;
    for (int step = 1; step <= run->steps; step++) {
        loop_steady_begin(g, &steps, step >= 2 && step < run->steps);
        loop_mark_step(g, step);
        if (hooks && hooks->before_step)
            hooks->before_step(hooks->user, step);
        LoopSteady steady;
        /* a micro-batch's tensors die within the next */
        loop_steady_init(&steady, mb_units, 1);
        const int last = run->grad_accum - 1;
        /* without a method's hooks the last micro-batch is like the middle ones (what follows
         * it, the optimizer step, is outside the unit) */
        const int end = hooks ? last : last + 1;
        for (int mb = 0; mb < run->grad_accum; mb++) {
            /* the first micro-batch makes the gradients and the method's buffers; the last is
             * the accumulation boundary (DDP's no_sync ends, DeepSpeed's
             * is_gradient_accumulation_boundary) */
            loop_steady_begin(g, &steady, mb >= 1 && mb < end);
            c->phase = MEMSIM_PHASE_FORWARD;
            c->microbatch = run->grad_accum > 1 ? mb : -1;
            c->category = MEMSIM_CAT_TEMPORARY;
            c->autocast = ac;
            if (hooks && hooks->before_forward)
                hooks->before_forward(hooks->user);
            AgTensor *logits = NULL;
            AgTensor *loss = model_forward(md, ids, labels, &logits);
            c->autocast = 0;
            gg_autocast_clear(g); /* the autocast region ends */
            if (run->keep_outputs) {
                /* out = model(...) rebinds: the previous output dies now */
                held_drop(g, &held);
                held.logits = logits;
                held.loss = gt_ref(loss);
                for (guint i = 0; i < md->cache->len; i++)
                    g_ptr_array_add(held.cache, md->cache->pdata[i]);
                g_ptr_array_set_size(md->cache, 0);
            } else {
                gt_unref(g, logits);
                model_drop_output(md);
            }
            c->phase = MEMSIM_PHASE_BACKWARD;
            gg_backward(g, loss);
            gt_unref(g, loss);
            if (hooks && hooks->after_backward)
                hooks->after_backward(hooks->user);
            int skip = mb >= 2 ? loop_steady_end(g, &steady, end - 1 - mb) : 0;
            if (skip > 0) {
                if (hooks)
                    hooks->skip_microbatches(hooks->user, skip);
                mb += skip;
            }
        }
        loop_steady_clear(&steady);
        loop_optimizer_step(g, o, hooks, md->trainable, step, step == run->steps);
        /* steps step + 1 .. step + skip repeat this one: the last one follows them */
        if (step >= 3)
            step += loop_steady_end(g, &steps, run->steps - 1 - step);
    }
    loop_steady_clear(&steps);
    /* the end of the program: what is alive stays alive in the trace */
    gg_teardown(g);
    held_drop(g, &held);
    g_ptr_array_unref(held.cache);
    gt_unref(g, labels);
    gt_unref(g, ids);
}

/* ---- the version rules ---- */

AgRules run_rules(const MemsimRun *run)
{
    int maj = 2, min = 8;
    if (run->torch_version)
        sscanf(run->torch_version, "%d.%d", &maj, &min);
    bool v113 = maj == 1;
    AgRules r = {0};
    r.v113 = v113;
    r.mean_saves_input = v113;
    r.embedding_saves_weight = v113;
    r.accumulate_inplace = !v113;
    r.matmul_always_folds = v113;
    r.full_slices_recorded = v113;
    r.checkpoint_early_stop = !v113;
    r.cuda = !run->device_cpu;
    /* CUBLAS_WORKSPACE_CONFIG's default: 4096 KiB × 2 + 16 KiB × 8 before Hopper, 32 MiB on
     * Hopper (sm90) — DISTRIBUTED.md §7.2 */
    bool hopper = run->gpu && (g_str_has_prefix(run->gpu, "h100") || g_str_has_prefix(run->gpu, "h200"));
    r.cublas_workspace = run->cublas_workspace ? run->cublas_workspace
                         : hopper              ? 33554432ull
                                               : 8519680ull;
    return r;
}

/* The optimizer implementation and the zero_grad mode the run comes to (its settings, the
 * version's defaults): for the run's description (traces/settings.c). */
void optim_choice(const MemsimRun *run, MemsimMethod method, MemsimOptimizerImpl *impl,
                  gboolean *to_none)
{
    AgRules rules = run_rules(run);
    Optimizer o;
    optimizer_init(&o, run, &rules);
    optimizer_for_method(&o, method);
    *impl = o.impl;
    *to_none = o.to_none;
    g_ptr_array_unref(o.state);
}
