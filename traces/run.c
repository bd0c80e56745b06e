/* Run semantics (include/memsim/gen.h): the version rules (AUTOGRAD_MEMORY.md §12),
 * inference, and memsim_generate, which runs one GPU's training through the training loop
 * of traces/loop.c and hands runs on several GPUs to traces/distributed.c. The run's
 * settings are read, checked and described in traces/settings.c.
 */
#include <memsim/alloc.h>
#include <memsim/gen.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "traces/hf_versions.h"
#include "traces/loop.h"
#include "traces/models.h"
#include "traces/settings.h"

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
    /* a Transformers release before the model's SDPA class leaves attn_implementation at
     * eager (traces/hf_versions.c, the sdpa-default rows) */
    if (!memsim_run_given(run, "attention") && !hf_sdpa_default(run, m))
        run->attention = MEMSIM_ATTN_EAGER;
    /* Megatron accumulates over its micro-batches (forward_backward_func runs them, the
     * gradients summed in the grad buffer): --grad-accum N without --microbatches is N
     * micro-batches (setting_check_distributed_loop refuses the two disagreeing) */
    bool megatron = run->method == MEMSIM_METHOD_MEGATRON ||
                    (run->method == MEMSIM_METHOD_NONE && (run->tp > 1 || run->pp > 1));
    if (megatron && !run->inference && !run->microbatches &&
        (run->grad_accum > 1 || memsim_run_given(run, "grad-accum")))
        run->microbatches = run->grad_accum;
}

/* The work a run asks for, bounded before any is done: the largest tensor it makes (the fp32
 * logits, an MLP activation, eager attention's scores), which no device holds beyond 2^50
 * bytes, and the events of its trace, which the generator keeps in memory (40 bytes each) —
 * about 600 per layer and micro-batch of training (and 150 more per MoE expert), 200 per layer
 * and token step of generation (measured on the presets: 526 for Llama-2-7B, 622 with
 * checkpointing, 1576 for Mixtral's 8 experts, 126 per decode step). */
#define MAX_TENSOR_BYTES 1125899906842624.0 /* 2^50 */
#define MAX_EVENTS 1.5e8                    /* 6 GB of events */

double model_run_events(const MemsimModel *m, const MemsimRun *run)
{
    /* Megatron's micro-batches are its accumulation (memsim_generate); a loop generates a few
     * of its micro-batches and steps when they repeat (loop_repeats) */
    double per_step = (double)(run->microbatches ? run->microbatches : run->grad_accum);
    double steps = (double)run->steps;
    MemsimResolvedRun rr = memsim_run_resolve(run);
    if (loop_repeats(rr.method, rr.pp)) {
        per_step = MIN(per_step, (double)LOOP_GENERATED);
        steps = MIN(steps, (double)LOOP_GENERATED);
    }
    double micro = steps * per_step;
    /* the Llama-derived families run their routed experts as one grouped computation
     * (traces/families.c moe): no events per expert */
    double per_layer = 600.0 + 150.0 * (fam_modern(m) ? 0.0 : (double)m->n_experts);
    return run->inference ? (double)(run->generate + 1) * (double)m->L * 200.0
                          : micro * (double)m->L * per_layer;
}

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
    double events = model_run_events(m, run);
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

gboolean model_check_run(const MemsimModel *m, const MemsimRun *run, GError **error)
{
    if (run->moe_imbalance > 1 && !m->n_experts) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "moe-imbalance: %s has no routed experts (the routing of a mixture of "
                    "experts)",
                    m->name);
        return FALSE;
    }
    if (run->moe_imbalance > 1 && fam_modern(m)) {
        /* integrations/moe.py grouped_mm_experts_forward, the experts_implementation that
         * PreTrainedModel.get_correct_experts_implementation picks by default */
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "moe-imbalance: %s (model_type '%s') runs its routed experts as one grouped "
                    "GEMM over the T·k token slots (Transformers' default grouped_mm experts "
                    "backend), whose buffers have the same sizes under any routing: the "
                    "imbalance would not change the estimate (it applies to Mixtral's experts, "
                    "run one by one on their own tokens)",
                    m->name, m->model_type ? m->model_type : memsim_model_family(m));
        return FALSE;
    }
    return TRUE;
}

static MemsimTrace *generate(const MemsimModel *m, const MemsimRun *run_in, const char *spill,
                             const gboolean *stages, GError **error);

MemsimTrace *memsim_generate(const MemsimModel *m, const MemsimRun *run_in, GError **error)
{
    return generate(m, run_in, NULL, NULL, error);
}

MemsimTrace *memsim_generate_spilling(const MemsimModel *m, const MemsimRun *run_in,
                                      const char *dir, GError **error)
{
    return generate(m, run_in, dir, NULL, error);
}

MemsimTrace *memsim_generate_stages(const MemsimModel *m, const MemsimRun *run_in,
                                    const gboolean *stages, GError **error)
{
    return generate(m, run_in, NULL, stages, error);
}

static MemsimTrace *generate(const MemsimModel *m, const MemsimRun *run_in, const char *spill,
                             const gboolean *stages, GError **error)
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
    if (!model_check_run(m, run, error))
        return NULL;
    if (memsim_run_given(run, "transformers-version") && !hf_any_rule(m)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "transformers-version: memsim models no difference between Transformers "
                    "releases for model_type '%s' (traces/transformers_versions.md lists those "
                    "it does)",
                    m->model_type ? m->model_type : memsim_model_family(m));
        return NULL;
    }
    int first = 0;
    if (!hf_model_type_exists(run, m, &first)) {
        /* traces/hf_versions.c, the model-type rows: AutoConfig of that release has no such
         * model_type */
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "transformers-version: %d.%d has no model_type '%s' (first in %d.%d; "
                    "traces/transformers_versions.md)",
                    run->transformers_version / 1000, run->transformers_version % 1000,
                    m->model_type, first / 1000, first % 1000);
        return NULL;
    }
    AgRules rules = run_rules(run);
    g_autofree char *desc = memsim_run_describe(run);
    g_autofree char *name = g_strdup_printf("%s: %s", m->name, desc);
    MemsimTrace *t = memsim_trace_new(name);
    if (spill)
        memsim_trace_spill_to(t, spill);
    MemsimRun eff = *run;
    g_auto(GStrv) split = NULL;
    if (run->finetune != MEMSIM_FT_FULL && !run->lora_targets) {
        const char *def = fam_modern(m) ? fam_lora_default_targets(m)
                                        : model_lora_default_targets(m->fam);
        if (!def) { /* peft has no default target modules for this family */
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "lora-targets: peft has no default target modules for a %s model: "
                        "name them (modules: %s)",
                        memsim_model_family(m), fam_module_names(m));
            memsim_trace_free(t);
            return NULL;
        }
        split = g_strsplit(def, ",", -1);
        eff.lora_targets = split;
    }
    if (memsim_run_resolve(run).distributed) {
        if (!memsim_generate_distributed(m, &eff, t, &rules, stages, error)) {
            memsim_trace_free(t);
            return NULL;
        }
        return t;
    }
    memsim_trace_add_rank(t, 0, 1);
    AgGraph *g = gg_new(t, 0, &rules);
    MemsimGpu gbuf;
    gg_set_gpu(g, run_gpu(run, &gbuf), run->precision == MEMSIM_PREC_FP32);
    Model md;
    if (!model_build(&md, g, m, &eff, error)) {
        model_clear(&md);
        gg_free(g);
        memsim_trace_free(t);
        return NULL;
    }
    if (eff.inference) {
        run_inference(&md, g, error);
    } else {
        Optimizer o;
        optimizer_init(&o, &eff, &rules);
        loop_train(&md, &o, NULL);
        optimizer_clear(g, &o);
    }
    gg_teardown(g);
    model_clear(&md);
    gg_free(g);
    return t;
}
