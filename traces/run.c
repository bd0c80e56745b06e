/* Run semantics (include/memsim/gen.h): the training loop, the optimizers and the version
 * rules (AUTOGRAD_MEMORY.md §9, §12), and memsim_generate. The run's settings are read,
 * checked and described in traces/settings.c.
 *
 * The loop is the one HF's Trainer runs for each optimizer step:
 *     for each micro-batch: with autocast: loss = model(ids, labels=labels).loss
 *                           loss.backward()            (outputs dropped before backward)
 *     optimizer.step(); optimizer.zero_grad()
 * With keep-outputs the model output object is held until the next step's forward has
 * returned, as a hand-written `out = model(...)` loop does.
 */
#include <memsim/alloc.h>
#include <memsim/gen.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "traces/models.h"
#include "traces/settings.h"

/* The distributed programs (traces/distributed.c) run their own loop: AdamW's state as each
 * method shards it, gradients set to None, outputs dropped before backward, and Megatron's
 * micro-batches in place of accumulation. Settings given that say otherwise are refused. */
gboolean setting_check_distributed_loop(const MemsimRun *r, gboolean megatron, GError **error)
{
#define GIVEN(k) memsim_run_given(r, k)
    if (GIVEN("optimizer") && r->optimizer != MEMSIM_OPTIM_ADAMW)
        return setting_refuse(error, "optimizer: the distributed methods are modelled with "
                                     "AdamW, whose state they shard (one GPU takes the others)");
    if (GIVEN("optimizer-impl"))
        return setting_refuse(error, "optimizer-impl: the distributed methods step their own "
                                     "flat or sharded AdamW (one GPU takes the choice)");
    if (GIVEN("zero-grad") && !r->zero_grad_to_none)
        return setting_refuse(error, "zero-grad: the distributed methods free their gradients "
                                     "(set to None), as DeepSpeed, FSDP and Megatron do");
    if (GIVEN("keep-outputs") && r->keep_outputs)
        return setting_refuse(error, "keep-outputs: the distributed loops drop the output "
                                     "before backward (one GPU models holding it)");
    if (megatron && GIVEN("grad-accum") && r->grad_accum > 1)
        return setting_refuse(error, "grad-accum: a Megatron run accumulates over its "
                                     "micro-batches: give --microbatches");
#undef GIVEN
    return TRUE;
}

/* ---- versions ---- */

static AgRules rules_for(const MemsimRun *run)
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

static MemsimOptimizerImpl effective_impl(const MemsimRun *run, const AgRules *rules)
{
    if (run->optimizer_impl != MEMSIM_OPTIM_IMPL_DEFAULT)
        return run->optimizer_impl;
    /* 1.13: for-loop; 2.x: foreach on CUDA (§9.1) */
    return rules->v113 || !rules->cuda ? MEMSIM_OPTIM_IMPL_FOR_LOOP : MEMSIM_OPTIM_IMPL_FOREACH;
}

static gboolean effective_to_none(const MemsimRun *run, const AgRules *rules)
{
    return run->zero_grad_set ? run->zero_grad_to_none : !rules->v113;
}

/* For memsim_run_describe: what effective_impl and effective_to_none make of the run. */
void run_optimizer_choice(const MemsimRun *run, MemsimOptimizerImpl *impl, gboolean *to_none)
{
    AgRules rules = rules_for(run);
    *impl = effective_impl(run, &rules);
    *to_none = effective_to_none(run, &rules);
}

/* ---- optimizers (§9) ---- */

typedef struct {
    GPtrArray *state; /* AgTensor* state tensors (kept) */
    bool initialised;
} Optim;

static AgTensor *state_like(AgGraph *g, AgTensor *p, DType dt)
{
    AgContext *c = gg_ctx(g);
    uint8_t old = c->category;
    c->category = MEMSIM_CAT_OPTIMIZER_STATE;
    AgTensor *t = op_new(g, "zeros_like", dt, p->nd, p->shape);
    c->category = old;
    return t;
}

static void optimizer_step(Model *md, Optim *o, const AgRules *rules, bool last)
{
    AgGraph *g = md->g;
    const MemsimRun *run = md->run;
    GPtrArray *ps = md->trainable;
    MemsimOptimizerImpl impl = effective_impl(run, rules);
    gg_ctx(g)->category = MEMSIM_CAT_TEMPORARY;
    bool first = !o->initialised;
    o->initialised = true;
    switch (run->optimizer) {
    case MEMSIM_OPTIM_ADAMW:
        if (first) {
            /* lazy state, all of it before any update (§9.2) */
            for (guint i = 0; i < ps->len; i++) {
                AgTensor *p = ps->pdata[i];
                if (!p->grad)
                    continue;
                if (!rules->cuda || impl == MEMSIM_OPTIM_IMPL_FUSED) /* step: CPU / device */
                    g_ptr_array_add(o->state, state_like(g, &(AgTensor){.nd = 0}, DT_F32));
                g_ptr_array_add(o->state, state_like(g, p, p->dt));
                g_ptr_array_add(o->state, state_like(g, p, p->dt));
            }
        }
        if (impl == MEMSIM_OPTIM_IMPL_FOR_LOOP) {
            /* denom = (exp_avg_sq.sqrt() / bc2).add_(eps): sqrt and div alloc; the previous
             * denom dies when the name is rebound */
            AgTensor *denom = NULL;
            for (guint i = 0; i < ps->len; i++) {
                AgTensor *p = ps->pdata[i];
                if (!p->grad)
                    continue;
                AgTensor *sq = op_new(g, "sqrt", p->dt, p->nd, p->shape);
                AgTensor *d = op_new(g, "div", p->dt, p->nd, p->shape);
                gt_unref(g, sq);
                gt_unref(g, denom);
                denom = d;
            }
            gt_unref(g, denom);
        } else if (impl == MEMSIM_OPTIM_IMPL_FOREACH) {
            /* one list of sqrt per (device, dtype) group; 1.13 also a denom list */
            GPtrArray *l1 = g_ptr_array_new(), *l2 = g_ptr_array_new();
            for (guint i = 0; i < ps->len; i++) {
                AgTensor *p = ps->pdata[i];
                if (p->grad)
                    g_ptr_array_add(l1, op_new(g, "_foreach_sqrt", p->dt, p->nd, p->shape));
            }
            if (rules->v113)
                for (guint i = 0; i < ps->len; i++) {
                    AgTensor *p = ps->pdata[i];
                    if (p->grad)
                        g_ptr_array_add(l2, op_new(g, "_foreach_add", p->dt, p->nd, p->shape));
                }
            for (guint i = 0; i < l2->len; i++)
                gt_unref(g, l2->pdata[i]);
            for (guint i = 0; i < l1->len; i++)
                gt_unref(g, l1->pdata[i]);
            g_ptr_array_unref(l1);
            g_ptr_array_unref(l2);
        }
        /* fused: in place, no temporaries */
        break;
    case MEMSIM_OPTIM_ADAMW_8BIT:
        if (first)
            for (guint i = 0; i < ps->len; i++) {
                AgTensor *p = ps->pdata[i];
                if (!p->grad)
                    continue;
                int64_t n = 1;
                for (int d = 0; d < p->nd; d++)
                    n *= p->shape[d];
                if (n < 4096) { /* bitsandbytes keeps small tensors in 32-bit state */
                    g_ptr_array_add(o->state, state_like(g, p, DT_F32));
                    g_ptr_array_add(o->state, state_like(g, p, DT_F32));
                } else {
                    g_ptr_array_add(o->state, state_like(g, p, DT_U8));
                    g_ptr_array_add(o->state, state_like(g, p, DT_U8));
                    int64_t blocks = (n + 2047) / 2048;
                    g_ptr_array_add(o->state, state_like(g, &(AgTensor){.nd = 1, .shape = {blocks}},
                                                         DT_F32));
                    g_ptr_array_add(o->state, state_like(g, &(AgTensor){.nd = 1, .shape = {blocks}},
                                                         DT_F32));
                }
            }
        break;
    case MEMSIM_OPTIM_SGD_MOMENTUM:
        if (first) /* momentum_buffer = grad.clone() at the first step */
            for (guint i = 0; i < ps->len; i++) {
                AgTensor *p = ps->pdata[i];
                if (p->grad)
                    g_ptr_array_add(o->state, state_like(g, p, p->dt));
            }
        break;
    case MEMSIM_OPTIM_ADAFACTOR:
        /* transformers' Adafactor: factored second moments for matrices (row and column
         * means, fp32), a full one for vectors; update = grad**2 + eps and the approximated
         * update are full-size fp32 temporaries per parameter */
        for (guint i = 0; i < ps->len; i++) {
            AgTensor *p = ps->pdata[i];
            if (!p->grad)
                continue;
            if (first) {
                if (p->nd >= 2) {
                    g_ptr_array_add(o->state,
                                    state_like(g, &(AgTensor){.nd = 1, .shape = {p->shape[0]}},
                                               DT_F32));
                    g_ptr_array_add(o->state,
                                    state_like(g, &(AgTensor){.nd = 1, .shape = {p->shape[1]}},
                                               DT_F32));
                } else {
                    g_ptr_array_add(o->state, state_like(g, p, DT_F32));
                }
            }
            AgTensor *u = op_new(g, "pow", DT_F32, p->nd, p->shape);
            AgTensor *a = op_new(g, "mul", DT_F32, p->nd, p->shape);
            gt_unref(g, u);
            gt_unref(g, a);
        }
        break;
    case MEMSIM_OPTIM_SGD:
        break;
    }
    /* the model state after the update (the last step's), before zero_grad */
    if (last)
        gg_mark(g, "breakdown:model state at the optimizer step");
    /* zero_grad */
    if (effective_to_none(run, rules))
        for (guint i = 0; i < ps->len; i++) {
            AgTensor *p = ps->pdata[i];
            if (p->grad) {
                AgTensor *gr = p->grad;
                p->grad = NULL;
                gt_unref(g, gr);
            }
        }
}

/* ---- inference ---- */

static gboolean run_inference(Model *md, AgGraph *g, GError **error)
{
    /* generate(): the prompt (prefill), then one token at a time; no grad. With the cache
     * (use_cache, the default) each forward's layers extend the DynamicCache (cache_update in
     * traces/models.c: the prefill's copies, then cat(past, new) per token); without it every
     * token runs the whole sequence again. The forward computes the last position's logits
     * only (generate passes logits_to_keep=1), and generate takes an fp32 copy of them
     * (logits[:, -1, :].to(float32)) for the next token's choice (greedy: argmax). */
    AgContext *c = gg_ctx(g);
    c->grad_enabled = false;
    const MemsimModel *m = md->m;
    bool cache = md->run->use_cache < 0 ? m->use_cache : md->run->use_cache;
    int64_t B = md->run->batch, P = md->run->prompt, N = md->run->generate;
    md->last_logits_only = true;
    c->phase = MEMSIM_PHASE_FORWARD;
    for (int64_t t = 0; t <= N; t++) {
        if (t == 0)
            gg_mark(g, "prefill");
        else if (t == 1)
            gg_mark(g, "decode");
        md->S = t == 0 ? P : cache ? 1 : P + t;
        AgTensor *ids = gg_leaf(g, DT_I64, SHAPE(B, md->S), false, MEMSIM_CAT_INPUT);
        if (t > 0 && cache) {
            /* the past cache goes into this forward; each layer's update consumes its entry */
            GPtrArray *past = md->cache;
            md->past = past;
            md->cache = g_ptr_array_new();
        }
        AgTensor *logits = NULL;
        model_forward(md, ids, NULL, &logits);
        if (md->past) {
            for (guint i = 0; i < md->past->len; i++)
                gt_unref(g, md->past->pdata[i]); /* NULL where consumed */
            g_ptr_array_unref(md->past);
            md->past = NULL;
        }
        if (!cache)
            model_drop_output(md);
        AgTensor *next = op_new(g, "_to_copy", DT_F32, SHAPE(B, m->V));
        gt_unref(g, logits);
        gt_unref(g, ids);
        AgTensor *tok = op_new(g, "argmax", DT_I64, SHAPE(B));
        gt_unref(g, next);
        gt_unref(g, tok);
    }
    model_drop_output(md);
    (void)error;
    return TRUE;
}

/* ---- the trace ---- */

static bool learned_positions(const MemsimModel *m)
{
    return m->fam == FAM_GPT2 || m->fam == FAM_OPT || m->fam == FAM_GPTNEO;
}

void memsim_run_adapt(MemsimRun *run, const MemsimModel *m)
{
    if (!memsim_run_given(run, "seq") && learned_positions(m) && run->seq > m->max_pos)
        run->seq = m->max_pos;
}

/* The work a run asks for, bounded before any is done: the largest tensor it makes (the fp32
 * logits, an MLP activation, eager attention's scores), which no device holds beyond 2^50
 * bytes, and the events of its trace, which the generator keeps in memory (40 bytes each) —
 * about 600 per layer and micro-batch of training (and 150 more per MoE expert), 200 per layer
 * and token step of generation (measured on the presets: 526 for Llama-2-7B, 622 with
 * checkpointing, 1576 for Mixtral's 8 experts, 126 per decode step). */
#define MAX_TENSOR_BYTES 1125899906842624.0 /* 2^50 */
#define MAX_EVENTS 1.5e8                    /* 6 GB of events */

static gboolean within_bounds(const MemsimModel *m, const MemsimRun *run, GError **error)
{
    double B = (double)run->batch;
    double S = run->inference ? (double)(run->prompt + run->generate) : (double)run->seq;
    double width = MAX((double)m->V, (double)m->I);
    double largest = MAX(B * S * width * 4.0, B * (double)m->nh * S * S * 4.0);
    if (largest > MAX_TENSOR_BYTES) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: batch %" G_GINT64_FORMAT " × %.0f tokens makes a tensor of %.3g bytes, "
                    "beyond any device (2^50 bytes)",
                    run->inference ? "prompt + generate" : "seq", run->batch, S, largest);
        return FALSE;
    }
    double micro = (double)run->steps * run->grad_accum * (run->microbatches ? run->microbatches
                                                                              : 1);
    double per_layer = 600.0 + 150.0 * (double)m->n_experts;
    double events = run->inference ? (double)(run->generate + 1) * (double)m->L * 200.0
                                   : micro * (double)m->L * per_layer;
    if (events > MAX_EVENTS) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: about %.3g events to simulate (%.0f GB of trace held in memory), "
                    "beyond the %.3g this machine's memory allows: give fewer %s",
                    run->inference ? "generate" : "steps", events, events * 40.0 / 1e9,
                    MAX_EVENTS,
                    run->inference ? "generated tokens (--generate)"
                                   : "steps (--steps), micro-batches (--grad-accum, "
                                     "--microbatches) or layers");
        return FALSE;
    }
    return TRUE;
}

MemsimTrace *memsim_generate(const MemsimModel *m, const MemsimRun *run_in, GError **error)
{
    if (!memsim_run_check(run_in, error))
        return NULL;
    MemsimRun adapted = *run_in;
    memsim_run_adapt(&adapted, m);
    const MemsimRun *run = &adapted;
    bool learned_pos = learned_positions(m);
    int64_t len = run->inference ? run->prompt + run->generate : run->seq;
    if (learned_pos && len > m->max_pos) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: %" G_GINT64_FORMAT " tokens exceed the model's %" G_GINT64_FORMAT
                    " learned positions (max_position_embeddings)",
                    run->inference ? "prompt + generate" : "seq", len, m->max_pos);
        return NULL;
    }
    if (run->inference && run->finetune != MEMSIM_FT_FULL) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "finetune: inference takes no fine-tuning method");
        return NULL;
    }
    if (!within_bounds(m, run, error))
        return NULL;
    AgRules rules = rules_for(run);
    g_autofree char *desc = memsim_run_describe(run);
    g_autofree char *name = g_strdup_printf("%s: %s", m->name, desc);
    MemsimTrace *t = memsim_trace_new(name);
    MemsimRun eff = *run;
    g_auto(GStrv) split = NULL;
    if (run->finetune != MEMSIM_FT_FULL && !run->lora_targets) {
        split = g_strsplit(model_lora_default_targets(m->fam), ",", -1);
        eff.lora_targets = split;
    }
    if (run->gpus > 1 || run->method != MEMSIM_METHOD_NONE || run->tp > 1 || run->pp > 1) {
        if (!memsim_generate_distributed(m, &eff, t, &rules, error)) {
            memsim_trace_free(t);
            return NULL;
        }
        return t;
    }
    memsim_trace_add_rank(t, 0, 1);
    AgGraph *g = gg_new(t, 0, &rules);
    gg_set_gpu(g, memsim_gpu_find(run->gpu), run->precision == MEMSIM_PREC_FP32);
    Model md;
    if (!model_build(&md, g, m, &eff, error)) {
        model_clear(&md);
        gg_free(g);
        memsim_trace_free(t);
        return NULL;
    }
    AgContext *c = gg_ctx(g);
    if (eff.inference) {
        run_inference(&md, g, error);
    } else {
        int ac = run->precision == MEMSIM_PREC_BF16_MIXED   ? DT_BF16
                 : run->precision == MEMSIM_PREC_FP16_MIXED ? DT_F16
                                                            : 0;
        AgTensor *ids = gg_leaf(g, DT_I64, SHAPE(run->batch, run->seq), false, MEMSIM_CAT_INPUT);
        /* the collator's labels (DataCollatorForLanguageModeling: input_ids.clone()), a device
         * tensor of their own */
        AgTensor *labels =
            gg_leaf(g, DT_I64, SHAPE(run->batch, run->seq), false, MEMSIM_CAT_INPUT);
        Optim o = {g_ptr_array_new(), false};
        AgTensor *held = NULL, *held_loss = NULL;
        GPtrArray *held_cache = g_ptr_array_new();
        for (int step = 1; step <= run->steps; step++) {
            char mark[32];
            g_snprintf(mark, sizeof mark, "step %d", step);
            gg_mark(g, mark);
            for (int mb = 0; mb < run->grad_accum; mb++) {
                c->phase = MEMSIM_PHASE_FORWARD;
                c->microbatch = run->grad_accum > 1 ? mb : -1;
                c->category = MEMSIM_CAT_TEMPORARY;
                c->autocast = ac;
                AgTensor *logits = NULL;
                AgTensor *loss = model_forward(&md, ids, labels, &logits);
                c->autocast = 0;
                gg_autocast_clear(g); /* the autocast region ends */
                if (run->keep_outputs) {
                    /* out = model(...) rebinds: the previous output dies now */
                    gt_unref(g, held);
                    gt_unref(g, held_loss);
                    for (guint i = 0; i < held_cache->len; i++)
                        gt_unref(g, held_cache->pdata[i]);
                    g_ptr_array_set_size(held_cache, 0);
                    held = logits;
                    held_loss = gt_ref(loss);
                    for (guint i = 0; i < md.cache->len; i++)
                        g_ptr_array_add(held_cache, md.cache->pdata[i]);
                    g_ptr_array_set_size(md.cache, 0);
                } else {
                    gt_unref(g, logits);
                    model_drop_output(&md);
                }
                c->phase = MEMSIM_PHASE_BACKWARD;
                gg_backward(g, loss);
                gt_unref(g, loss);
            }
            c->microbatch = -1;
            c->phase = MEMSIM_PHASE_OPTIMIZER;
            gg_op(g, "optimizer.step");
            optimizer_step(&md, &o, &rules, step == run->steps);
            c->phase = MEMSIM_PHASE_OTHER;
        }
        /* the end of the program: what is alive stays alive in the trace */
        gg_teardown(g);
        gt_unref(g, held);
        gt_unref(g, held_loss);
        for (guint i = 0; i < held_cache->len; i++)
            gt_unref(g, held_cache->pdata[i]);
        g_ptr_array_unref(held_cache);
        for (guint i = 0; i < o.state->len; i++)
            gt_unref(g, o.state->pdata[i]);
        g_ptr_array_unref(o.state);
        gt_unref(g, labels);
        gt_unref(g, ids);
    }
    gg_teardown(g);
    model_clear(&md);
    gg_free(g);
    return t;
}
