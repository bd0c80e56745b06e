/* The steady state (MEMSIM_EV_REPEAT, traces/loop.c, sim/replay.c): a run estimated with the
 * repeated micro-batches generated once and, where the allocator's state repeats (and, in a
 * pipeline, the stages' clocks and the messages between them), added instead of simulated,
 * against the same run generated and simulated micro-batch by micro-batch
 * (MEMSIM_NO_SKIP=1). Every rank's peaks (allocated, reserved, active, requested)
 * are equal to the byte, and so are the op at the peak, the bytes by category there, every
 * step's peaks, the breakdowns and the event indices; the simulated time agrees but for the
 * rounding of its sums. */
#include <criterion/criterion.h>
#include <math.h>
#include <memsim/estimate.h>
#include <memsim/formats.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "traces/models.h"

typedef struct {
    const char *name;
    const char *model;
    const char *settings[24]; /* key, value, ..., NULL */
    const char *alloc_conf;
    gboolean repeats;      /* the generator must find a repeating micro-batch */
    gboolean skips;        /* the replay must add some repetitions instead of simulating them */
    memsim_size_t gpu_mem; /* 0: room enough, no rank runs out of memory */
} Case;

#define GA(n) "grad-accum", #n
#define SMALL "seq", "128"

static const Case cases[] = {
    /* one GPU, 1 to 256 micro-batches */
    {"1gpu ga1", "gpt2", {SMALL, GA(1), NULL}, NULL, FALSE, FALSE, 0},
    {"1gpu ga2", "gpt2", {SMALL, GA(2), NULL}, NULL, FALSE, FALSE, 0},
    {"1gpu ga4", "gpt2", {SMALL, GA(4), NULL}, NULL, FALSE, FALSE, 0},
    {"1gpu ga5", "gpt2", {SMALL, GA(5), NULL}, NULL, TRUE, FALSE, 0},
    {"1gpu ga6", "gpt2", {SMALL, GA(6), NULL}, NULL, TRUE, FALSE, 0},
    {"1gpu ga8", "gpt2", {SMALL, GA(8), NULL}, NULL, TRUE, FALSE, 0},
    {"1gpu ga16", "gpt2", {SMALL, GA(16), NULL}, NULL, TRUE, FALSE, 0},
    {"1gpu ga64", "gpt2", {SMALL, GA(64), NULL}, NULL, TRUE, FALSE, 0},
    {"1gpu ga256", "gpt2", {SMALL, GA(256), NULL}, NULL, TRUE, FALSE, 0},
    {"1gpu ga256 3 steps", "gpt2", {SMALL, GA(256), "steps", "3", NULL}, NULL, TRUE, FALSE, 0},
    {"1gpu ga16 ckpt", "gpt2", {SMALL, GA(16), "checkpointing", "full", NULL}, NULL, TRUE, FALSE,
     0},
    {"1gpu ga64 ckpt", "gpt2", {SMALL, GA(64), "checkpointing", "full", NULL}, NULL, TRUE, FALSE,
     0},
    {"1gpu ga16 expandable", "gpt2", {SMALL, GA(16), NULL}, "expandable_segments:True", TRUE, FALSE,
     0},
    {"1gpu ga64 ckpt expandable", "gpt2", {SMALL, GA(64), "checkpointing", "full", NULL},
     "expandable_segments:True", TRUE, FALSE, 0},
    {"1gpu ga8 keep-outputs", "gpt2", {SMALL, GA(8), "keep-outputs", "true", NULL}, NULL, TRUE,
     FALSE, 0},
    {"1gpu ga8 fp32 sgd", "gpt2",
     {SMALL, GA(8), "precision", "fp32", "optimizer", "sgd-momentum", NULL}, NULL, TRUE, FALSE, 0},
    {"1gpu ga8 zero_grad in place", "gpt2", {SMALL, GA(8), "zero-grad", "zero", NULL}, NULL, TRUE,
     FALSE, 0},
    {"1gpu ga8 lora", "llama-3.2-1b", {SMALL, GA(8), "finetune", "lora", "lora-rank", "8", NULL},
     NULL, TRUE, FALSE, 0},
    /* a GPU-bound run (the host dispatches ahead of the GPU): the micro-batch before the
     * template is its twin in time too, and no repetition runs */
    {"1gpu ga64 7b lora", "llama-2-7b", {"seq", "1024", "finetune", "lora", GA(64), NULL}, NULL,
     TRUE, TRUE, 0},
    {"1gpu ga12 llama ckpt", "llama-3.2-1b", {SMALL, GA(12), "checkpointing", "full", NULL}, NULL,
     TRUE, FALSE, 0},
    {"1gpu ga8 max_split", "gpt2", {SMALL, GA(8), NULL}, "max_split_size_mb:64", TRUE, FALSE, 0},
    /* data parallel with accumulation */
    {"ddp ga8", "gpt2", {SMALL, GA(8), "gpus", "4", "method", "ddp", NULL}, NULL, TRUE, FALSE, 0},
    {"ddp ga32 ckpt", "gpt2",
     {SMALL, GA(32), "gpus", "4", "method", "ddp", "checkpointing", "full", NULL}, NULL, TRUE,
     FALSE, 0},
    {"ddp ga16 expandable", "gpt2", {SMALL, GA(16), "gpus", "2", "method", "ddp", NULL},
     "expandable_segments:True", TRUE, FALSE, 0},
    {"zero1 ga8", "gpt2", {SMALL, GA(8), "gpus", "4", "method", "zero1", NULL}, NULL, TRUE, FALSE,
     0},
    {"zero2 ga8", "gpt2", {SMALL, GA(8), "gpus", "4", "method", "zero2", NULL}, NULL, TRUE, FALSE,
     0},
    {"zero2 ga16 ckpt expandable", "gpt2",
     {SMALL, GA(16), "gpus", "4", "method", "zero2", "checkpointing", "full", NULL},
     "expandable_segments:True", TRUE, FALSE, 0},
    {"zero3 ga8", "gpt2", {SMALL, GA(8), "gpus", "4", "method", "zero3", NULL}, NULL, TRUE, FALSE,
     0},
    {"zero3 ga32 ckpt", "gpt2",
     {SMALL, GA(32), "gpus", "8", "method", "zero3", "checkpointing", "full", NULL}, NULL, TRUE,
     FALSE, 0},
    {"fsdp ga8", "gpt2", {SMALL, GA(8), "gpus", "4", "method", "fsdp", NULL}, NULL, TRUE, FALSE, 0},
    {"fsdp ga16 ckpt", "gpt2",
     {SMALL, GA(16), "gpus", "4", "method", "fsdp", "checkpointing", "full", NULL}, NULL, TRUE,
     FALSE, 0},
    {"fsdp ga16 expandable", "gpt2", {SMALL, GA(16), "gpus", "4", "method", "fsdp", NULL},
     "expandable_segments:True", TRUE, FALSE, 0},
    {"fsdp2 ga8", "gpt2", {SMALL, GA(8), "gpus", "4", "method", "fsdp", "fsdp-version", "2", NULL},
     NULL, TRUE, FALSE, 0},
    {"fsdp-grad-op ga8", "gpt2", {SMALL, GA(8), "gpus", "4", "method", "fsdp-grad-op", NULL}, NULL,
     TRUE, FALSE, 0},
    {"hsdp ga8", "gpt2", {SMALL, GA(8), "gpus", "16", "method", "hsdp", "gpus-per-node", "8", NULL},
     NULL, TRUE, FALSE, 0},
    /* pipelines: 1F1B's steady forward-backward pairs repeat; they meet the neighbouring
     * stages, and the pipeline's periods are added for all its stages at once
     * (sim/replay.c cross_cut), each stage's memory catching up until it repeats */
    {"1f1b pp2 mb4", "gpt2", {SMALL, "gpus", "2", "pp", "2", "microbatches", "4", NULL}, NULL,
     FALSE, FALSE, 0},
    {"1f1b pp2 mb8", "gpt2", {SMALL, "gpus", "2", "pp", "2", "microbatches", "8", NULL}, NULL, TRUE,
     TRUE, 0},
    {"1f1b pp2 mb8 expandable", "gpt2", {SMALL, "gpus", "2", "pp", "2", "microbatches", "8", NULL},
     "expandable_segments:True", TRUE, TRUE, 0},
    {"1f1b pp2 mb8 ckpt", "gpt2",
     {SMALL, "gpus", "2", "pp", "2", "microbatches", "8", "checkpointing", "full", NULL}, NULL,
     TRUE, TRUE, 0},
    {"1f1b pp4 mb8", "gpt2", {SMALL, "gpus", "4", "pp", "4", "microbatches", "8", NULL}, NULL, TRUE,
     FALSE, 0},
    {"1f1b pp4 mb16 ckpt", "gpt2",
     {SMALL, "gpus", "4", "pp", "4", "microbatches", "16", "checkpointing", "full", NULL}, NULL,
     TRUE, TRUE, 0},
    {"1f1b pp2 mb64", "gpt2", {SMALL, "gpus", "2", "pp", "2", "microbatches", "64", NULL}, NULL,
     TRUE, TRUE, 0},
    {"1f1b pp2 mb64 ckpt expandable", "gpt2",
     {SMALL, "gpus", "2", "pp", "2", "microbatches", "64", "checkpointing", "full", NULL},
     "expandable_segments:True", TRUE, TRUE, 0},
    {"1f1b pp4 mb64", "gpt2", {SMALL, "gpus", "4", "pp", "4", "microbatches", "64", NULL}, NULL,
     TRUE, TRUE, 0},
    {"1f1b pp4 mb64 expandable", "gpt2",
     {SMALL, "gpus", "4", "pp", "4", "microbatches", "64", NULL}, "expandable_segments:True", TRUE,
     TRUE, 0},
    {"1f1b pp8 mb64", "llama-3.2-1b", {SMALL, "gpus", "8", "pp", "8", "microbatches", "64", NULL},
     NULL, TRUE, TRUE, 0},
    {"1f1b pp2 mb256", "gpt2", {SMALL, "gpus", "2", "pp", "2", "microbatches", "256", NULL}, NULL,
     TRUE, TRUE, 0},
    {"1f1b pp4 mb256 expandable", "gpt2",
     {SMALL, "gpus", "4", "pp", "4", "microbatches", "256", NULL}, "expandable_segments:True", TRUE,
     TRUE, 0},
    {"1f1b pp8 mb256", "llama-3.2-1b", {SMALL, "gpus", "8", "pp", "8", "microbatches", "256", NULL},
     NULL, TRUE, TRUE, 0},
    {"1f1b tp2 pp2 dp2 mb256", "gpt2",
     {SMALL, "gpus", "8", "tp", "2", "pp", "2", "microbatches", "256", NULL}, NULL, TRUE, TRUE, 0},
    /* Llama's rotary tables are saved by the recomputation of each layer, a unit after the
     * one that made them on stage 2 of 4 (autograd.c gg_unit_repeats sees the unit before
     * as it was at its end) */
    {"1f1b pp4 mb32 llama ckpt", "llama-3.2-1b",
     {SMALL, "gpus", "4", "pp", "4", "microbatches", "32", "checkpointing", "full", NULL}, NULL,
     TRUE, TRUE, 0},
    /* stage 0 holds 15 micro-batches: a unit frees what the one 16 before made, and its
     * blocks come back every 16 units */
    {"1f1b pp16 mb64", "llama-3.2-1b",
     {SMALL, "gpus", "16", "pp", "16", "microbatches", "64", NULL}, NULL, TRUE, TRUE, 0},
    {"1f1b pp16 mb64 ckpt", "llama-3.2-1b",
     {SMALL, "gpus", "16", "pp", "16", "microbatches", "64", "checkpointing", "full", NULL},
     NULL, TRUE, TRUE, 0},
    /* a device a little too small: stage 0's cache grows in the steady phase, the allocator
     * frees its cached blocks and retries, and the stages run out of memory later */
    {"1f1b pp4 mb64 short of memory", "llama-3.2-1b",
     {"seq", "512", "gpus", "4", "pp", "4", "microbatches", "64", NULL}, NULL, TRUE, FALSE,
     5457838080},
    {"gpipe pp2 mb8 expandable", "gpt2",
     {SMALL, "gpus", "2", "pp", "2", "pp-schedule", "gpipe", "microbatches", "8", NULL},
     "expandable_segments:True", FALSE, FALSE, 0},
    {"interleaved pp2 v2 mb64", "gpt2",
     {SMALL, "gpus", "2", "pp", "2", "pp-schedule", "interleaved", "virtual-stages", "2",
      "microbatches", "64", NULL},
     NULL, TRUE, TRUE, 0},
    {"interleaved pp2 v2 mb64 ckpt expandable", "gpt2",
     {SMALL, "gpus", "2", "pp", "2", "pp-schedule", "interleaved", "virtual-stages", "2",
      "microbatches", "64", "checkpointing", "full", NULL},
     "expandable_segments:True", TRUE, TRUE, 0},
    {"interleaved pp4 v3 mb256", "gpt2",
     {SMALL, "gpus", "4", "pp", "4", "pp-schedule", "interleaved", "virtual-stages", "3",
      "microbatches", "256", NULL},
     NULL, TRUE, TRUE, 0},
    {"interleaved pp2 v2 mb8", "gpt2",
     {SMALL, "gpus", "2", "pp", "2", "pp-schedule", "interleaved", "virtual-stages", "2",
      "microbatches", "8", NULL},
     NULL, FALSE, FALSE, 0},
};

static MemsimReport *estimate(const Case *c, gboolean full)
{
    MemsimModel *m = memsim_model_load(c->model, NULL);
    cr_assert(m != NULL, "%s", c->model);
    MemsimRun run = memsim_run_defaults();
    for (int i = 0; c->settings[i]; i += 2)
        tu_set(&run, c->settings[i], c->settings[i + 1]);
    memsim_run_adapt(&run, m);
    MemsimEstimateOptions o = MEMSIM_ESTIMATE_OPTIONS_INIT;
    o.alloc_conf = c->alloc_conf;
    o.gpu_mem = c->gpu_mem ? c->gpu_mem : (memsim_size_t)1 << 40; /* room: no run stops */
    if (full)
        g_setenv("MEMSIM_NO_SKIP", "1", TRUE);
    else
        g_unsetenv("MEMSIM_NO_SKIP");
    GError *err = NULL;
    MemsimReport *rep = memsim_estimate(m, &run, &o, &err);
    g_unsetenv("MEMSIM_NO_SKIP");
    cr_assert(rep != NULL, "%s: %s", c->name, err ? err->message : "?");
    memsim_run_clear(&run);
    memsim_model_free(m);
    return rep;
}

#define SAME(field)                                                                                \
    cr_expect_eq(a->field, b->field, "%s, rank %u: " #field " %lld (skip-ahead) != %lld (full)",   \
                 c->name, k, (long long)(a->field), (long long)(b->field))

static void compare(const Case *c, const MemsimReport *skip, const MemsimReport *full)
{
    cr_assert_eq(skip->n_ranks, full->n_ranks, "%s: ranks", c->name);
    for (guint k = 0; k < skip->n_ranks; k++) {
        const MemsimRankReport *a = &skip->ranks[k], *b = &full->ranks[k];
        SAME(stats.allocated.peak);
        SAME(stats.reserved.peak);
        SAME(stats.active.peak);
        SAME(stats.requested.peak);
        SAME(stats.allocated.current);
        SAME(stats.reserved.current);
        SAME(stats.segments.peak);
        SAME(stats.n_device_alloc);
        SAME(stats.n_device_free);
        SAME(stats.n_alloc_retries);
        SAME(n_events);
        SAME(peak_allocated_event);
        SAME(peak_reserved_event);
        SAME(at_peak_allocated_reserved);
        SAME(at_peak_allocated_requested);
        SAME(at_peak_reserved_allocated);
        SAME(peak_op_layer);
        SAME(peak_op_phase);
        SAME(peak_stream);
        SAME(oom.happened);
        SAME(fits);
        SAME(device_total);
        SAME(host_peak);
        cr_expect_str_eq(a->peak_op_name, b->peak_op_name, "%s, rank %u: op at the peak", c->name,
                         k);
        for (int cat = 0; cat < MEMSIM_CAT_COUNT; cat++) {
            SAME(peak_by_category[cat]);
            SAME(peak_by_category_requested[cat]);
        }
        SAME(n_steps);
        for (guint s = 0; s < a->n_steps && s < b->n_steps; s++) {
            SAME(steps[s].step);
            cr_expect(fabs(a->steps[s].start_us - b->steps[s].start_us) <=
                          1e-9 * (1.0 + fabs(b->steps[s].start_us)),
                      "%s, rank %u: step %u starts at %.17g != %.17g", c->name, k,
                      b->steps[s].step, a->steps[s].start_us, b->steps[s].start_us);
            SAME(steps[s].peak_allocated);
            SAME(steps[s].peak_reserved);
            for (int p = 0; p < MEMSIM_PHASE_COUNT; p++) {
                SAME(steps[s].phase_peak_allocated[p]);
                SAME(steps[s].phase_peak_reserved[p]);
            }
        }
        SAME(n_breakdowns);
        for (guint s = 0; s < a->n_breakdowns && s < b->n_breakdowns; s++)
            cr_expect(memcmp(&a->breakdowns[s], &b->breakdowns[s], sizeof a->breakdowns[s]) == 0,
                      "%s, rank %u: breakdown %s", c->name, k, a->breakdowns[s].name);
        double tol = 1e-9 * (1.0 + fabs(b->time_us));
        cr_expect(fabs(a->time_us - b->time_us) <= tol, "%s, rank %u: time %.17g != %.17g", c->name,
                  k, a->time_us, b->time_us);
        cr_expect_eq(b->steady_repeated, 0, "%s: the full simulation repeated", c->name);
        cr_expect_eq(b->steady_steps_repeated, 0, "%s: the full simulation repeated steps",
                     c->name);
    }
}

Test(steady, skip_ahead_is_the_full_simulation, .timeout = 600)
{
    guint n_repeat = 0, n_skip = 0, n_first = 0;
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        const Case *c = &cases[i];
        MemsimReport *skip = estimate(c, FALSE), *full = estimate(c, TRUE);
        compare(c, skip, full);
        uint64_t repeated = 0, skipped = 0, timed = 0;
        for (guint k = 0; k < skip->n_ranks; k++) {
            repeated += skip->ranks[k].steady_repeated;
            skipped += skip->ranks[k].steady_skipped;
            timed += skip->ranks[k].steady_timed;
        }
        if (c->skips)
            cr_expect(skipped > 0, "%s: every repetition simulated", c->name);
        /* a pipeline's stages: their time is added together */
        if (c->skips && (g_str_has_prefix(c->name, "1f1b") ||
                         g_str_has_prefix(c->name, "interleaved")))
            cr_expect(timed > 0, "%s: no pipeline period added", c->name);
        /* a pipeline's periods are added only where every stage repeats */
        for (guint k = 0; k < skip->n_ranks && c->skips && c->repeats; k++)
            cr_expect(skip->ranks[k].steady_repeated > 0, "%s: rank %u repeats nothing", c->name,
                      k);
        if (c->repeats)
            cr_expect(repeated > 0, "%s: no micro-batch repeated", c->name);
        else
            cr_expect_eq(repeated, 0, "%s: %llu micro-batches repeated", c->name,
                         (unsigned long long)repeated);
        n_repeat += repeated > 0;
        n_skip += skipped > 0;
        /* every repetition added, none run: the unit before the template was its twin
         * (sim/replay.c repeat_skip_first) */
        n_first += repeated > 0 && skipped == repeated;
        cr_log_info("%-28s repeated %6llu skipped %6llu timed %6llu", c->name,
                    (unsigned long long)repeated, (unsigned long long)skipped,
                    (unsigned long long)timed);
        memsim_report_free(skip);
        memsim_report_free(full);
    }
    cr_log_info("%zu configurations: %u with repeated micro-batches, %u with some not simulated, "
                "%u with none", G_N_ELEMENTS(cases), n_repeat, n_skip, n_first);
    cr_expect_geq(n_first, 3, "%u configurations add every repetition", n_first);
}

/* Whole steps as the unit (traces/loop.c): on one GPU and with DDP, ZeRO and FSDP, the steps
 * between the first (which makes the optimizer's state) and the last (which marks the model
 * state) repeat; the step marks of a repetition name the steps it stands for, and a step
 * whose micro-batches repeat is a repeat of steps holding theirs (MEMSIM_EVF_STEPS). Against
 * the step-by-step simulation, as above, each step's number and start included. */
static const Case step_cases[] = {
    {"6 steps", "gpt2", {SMALL, "steps", "6", NULL}, NULL, TRUE, TRUE, 0},
    {"12 steps ga2", "gpt2", {SMALL, GA(2), "steps", "12", NULL}, NULL, TRUE, TRUE, 0},
    {"10 steps ga4 ckpt", "gpt2", {SMALL, GA(4), "steps", "10", "checkpointing", "full", NULL},
     NULL, TRUE, TRUE, 0},
    {"8 steps keep-outputs", "gpt2", {SMALL, "steps", "8", "keep-outputs", "true", NULL}, NULL,
     TRUE, FALSE, 0},
    {"9 steps expandable", "gpt2", {SMALL, "steps", "9", NULL}, "expandable_segments:True", TRUE,
     TRUE, 0},
    {"10 steps fp32 sgd", "gpt2",
     {SMALL, "steps", "10", "precision", "fp32", "optimizer", "sgd-momentum", NULL}, NULL, TRUE,
     TRUE, 0},
    {"7 steps zero_grad in place", "gpt2", {SMALL, "steps", "7", "zero-grad", "zero", NULL}, NULL,
     TRUE, TRUE, 0},
    {"8 steps torch 1.13", "gpt2", {SMALL, "steps", "8", "torch-version", "1.13", NULL}, NULL,
     TRUE, TRUE, 0},
    {"8 steps lora", "llama-3.2-1b",
     {SMALL, "steps", "8", "finetune", "lora", "lora-rank", "8", NULL}, NULL, TRUE, TRUE, 0},
    {"30 steps qlora ckpt", "llama-3.2-1b",
     {SMALL, "steps", "30", "finetune", "qlora", "checkpointing", "full", NULL}, NULL, TRUE, TRUE,
     0},
    {"8 steps ddp", "gpt2", {SMALL, "steps", "8", "gpus", "2", "method", "ddp", NULL}, NULL, TRUE,
     TRUE, 0},
    {"8 steps ddp keep-outputs", "gpt2",
     {SMALL, "steps", "8", "gpus", "2", "method", "ddp", "keep-outputs", "true", NULL}, NULL, TRUE,
     FALSE, 0},
    {"8 steps ddp lora", "gpt2",
     {SMALL, "steps", "8", "gpus", "4", "method", "ddp", "finetune", "lora", NULL}, NULL, TRUE,
     TRUE, 0},
    {"8 steps zero1", "gpt2", {SMALL, "steps", "8", "gpus", "4", "method", "zero1", NULL}, NULL,
     TRUE, TRUE, 0},
    {"8 steps zero2 ga2", "gpt2",
     {SMALL, GA(2), "steps", "8", "gpus", "4", "method", "zero2", NULL}, NULL, TRUE, TRUE, 0},
    {"9 steps zero3", "gpt2", {SMALL, "steps", "9", "gpus", "4", "method", "zero3", NULL}, NULL,
     TRUE, TRUE, 0},
    {"8 steps fsdp", "gpt2", {SMALL, "steps", "8", "gpus", "4", "method", "fsdp", NULL}, NULL,
     TRUE, FALSE, 0},
    {"8 steps fsdp ckpt", "gpt2",
     {SMALL, "steps", "8", "gpus", "4", "method", "fsdp", "checkpointing", "full", NULL}, NULL,
     TRUE, TRUE, 0},
    {"7 steps hsdp", "gpt2", {SMALL, "steps", "7", "gpus", "16", "method", "hsdp", NULL}, NULL,
     TRUE, FALSE, 0},
    /* steps whose micro-batches repeat: repeats of steps holding repeats */
    {"8 steps ga8", "gpt2", {SMALL, GA(8), "steps", "8", NULL}, NULL, TRUE, TRUE, 0},
    {"10 steps ga16 ckpt", "gpt2",
     {SMALL, GA(16), "steps", "10", "checkpointing", "full", NULL}, NULL, TRUE, TRUE, 0},
    {"9 steps ga64 expandable", "gpt2", {SMALL, GA(64), "steps", "9", NULL},
     "expandable_segments:True", TRUE, TRUE, 0},
    {"8 steps ga8 keep-outputs", "gpt2",
     {SMALL, GA(8), "steps", "8", "keep-outputs", "true", NULL}, NULL, TRUE, FALSE, 0},
    {"8 steps ga6 lora", "llama-3.2-1b",
     {SMALL, GA(6), "steps", "8", "finetune", "lora", "lora-rank", "8", NULL}, NULL, TRUE, TRUE,
     0},
    {"8 steps ddp ga8", "gpt2", {SMALL, GA(8), "steps", "8", "gpus", "2", "method", "ddp", NULL},
     NULL, TRUE, TRUE, 0},
    {"9 steps zero3 ga6", "gpt2",
     {SMALL, GA(6), "steps", "9", "gpus", "4", "method", "zero3", NULL}, NULL, TRUE, FALSE, 0},
    {"8 steps fsdp ga8 ckpt", "gpt2",
     {SMALL, GA(8), "steps", "8", "gpus", "4", "method", "fsdp", "checkpointing", "full", NULL},
     NULL, TRUE, FALSE, 0},
    /* out of memory in step 1: the repeat of steps is counted, not run */
    {"8 steps ga8 out of memory", "gpt2", {SMALL, GA(8), "steps", "8", NULL}, NULL, FALSE, FALSE,
     (memsim_size_t)2200 << 20},
    /* none: too few steps; a pipeline */
    {"4 steps", "gpt2", {SMALL, "steps", "4", NULL}, NULL, FALSE, FALSE, 0},
    {"4 steps ga8", "gpt2", {SMALL, GA(8), "steps", "4", NULL}, NULL, FALSE, FALSE, 0},
    {"8 steps 1f1b pp2", "gpt2",
     {SMALL, "steps", "8", "gpus", "2", "pp", "2", "microbatches", "4", NULL}, NULL, FALSE, FALSE,
     0},
};

Test(steady, whole_steps_repeat_exactly, .timeout = 600)
{
    for (gsize i = 0; i < G_N_ELEMENTS(step_cases); i++) {
        const Case *c = &step_cases[i];
        MemsimReport *skip = estimate(c, FALSE), *full = estimate(c, TRUE);
        compare(c, skip, full);
        uint64_t repeated = 0, skipped = 0;
        for (guint k = 0; k < skip->n_ranks; k++) {
            repeated += skip->ranks[k].steady_steps_repeated;
            skipped += skip->ranks[k].steady_steps_skipped;
        }
        if (c->repeats)
            cr_expect(repeated > 0, "%s: no step repeated", c->name);
        else
            cr_expect_eq(repeated, 0, "%s: %llu steps repeated", c->name,
                         (unsigned long long)repeated);
        if (c->skips)
            cr_expect(skipped > 0, "%s: every repeated step simulated", c->name);
        if (c->gpu_mem)
            cr_expect(skip->ranks[0].oom.happened, "%s: no rank ran out of memory", c->name);
        cr_log_info("%-28s steps repeated %4llu skipped %4llu", c->name,
                    (unsigned long long)repeated, (unsigned long long)skipped);
        memsim_report_free(skip);
        memsim_report_free(full);
    }
}

/* A repetition's step marks name the steps it stands for: a written trace whose unit starts
 * step 2^32 − 4 repeats it twice into steps 2^32 − 3 and 2^32 − 2 (the second added, not run);
 * one that starts 2^32 − 2 would reach 2^32 and is refused, naming the event. */
static char *step_trace(const char *dir, const char *name, const char *first)
{
    g_autofree char *text = g_strdup_printf(
        "memsim-trace 1\n"
        "rank 0 device=0 multiplicity=1 streams=1\n"
        "string 0 \"step %s\"\n"
        "@rank 0\n"
        "repeat events=3 times=2 from=1 shift=1\n"
        "mark 0\n"
        "alloc t=1 size=4096 stream=0 cat=activation\n"
        "free t=1\n",
        first);
    char *path = g_build_filename(dir, name, NULL);
    cr_assert(g_file_set_contents(path, text, -1, NULL));
    return path;
}

Test(steady, repeated_step_numbers, .timeout = 60)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *good = step_trace(dir, "good.txt", "4294967292");
    g_autofree char *bad = step_trace(dir, "bad.txt", "4294967294");
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    GError *err = NULL;
    MemsimReport *rep = memsim_replay_path(good, &o, &err);
    cr_assert(rep != NULL, "%s", err ? err->message : "?");
    const MemsimRankReport *r = &rep->ranks[0];
    cr_assert_eq(r->n_steps, 3);
    for (guint s = 0; s < 3; s++)
        cr_expect_eq(r->steps[s].step, 4294967292u + s);
    cr_expect_eq(r->steady_steps_repeated, 2);
    cr_expect_eq(r->steady_steps_skipped, 1);
    memsim_report_free(rep);
    rep = memsim_replay_path(bad, &o, &err);
    cr_assert(rep == NULL, "a step past 2^32 - 1 was accepted");
    cr_expect(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s", err->message);
    cr_expect(strstr(err->message, "past 4294967295") != NULL, "%s", err->message);
    g_error_free(err);
}

/* A written repeat of steps holding a repeat of micro-batches replays as the same program
 * written out (tests/data/good/nested-repeats*.txt): every peak, step and event count. */
Test(steady, nested_repeats_are_the_program_written_out, .timeout = 60)
{
    g_autofree char *nested = tu_test_data("good/nested-repeats.txt");
    g_autofree char *flat = tu_test_data("good/nested-repeats-expanded.txt");
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    GError *err = NULL;
    MemsimReport *a = memsim_replay_path(nested, &o, &err);
    cr_assert(a != NULL, "%s", err ? err->message : "?");
    MemsimReport *b = memsim_replay_path(flat, &o, &err);
    cr_assert(b != NULL, "%s", err ? err->message : "?");
    const Case c = {.name = "nested-repeats.txt"};
    compare(&c, a, b);
    cr_expect_eq(a->ranks[0].n_steps, 6);
    cr_expect_eq(a->ranks[0].n_events, 50);
    cr_expect_eq(a->ranks[0].steady_steps_repeated, 3);
    cr_expect_gt(a->ranks[0].steady_steps_skipped, 0);
    memsim_report_free(a);
    memsim_report_free(b);
}

/* A run whose simulation would need more host memory than there is is refused before it
 * starts, with the numbers (MEMSIM_HOST_MEMORY stands for the machine's MemAvailable); one that
 * fits goes on. */
Test(steady, host_memory_is_checked_up_front, .timeout = 300)
{
    const char *big[] = {
        "estimate", "--model",        "llama-2-70b", "--gpus", "64",   "--tp",  "8",         "--pp",
        "4",        "--microbatches", "256",         "--seq",  "4096", "--gpu", "h100-80gb", NULL};
    const char *env[] = {"MEMSIM_HOST_MEMORY=64MiB", NULL};
    const char *bin = g_getenv("MEMSIM_BIN");
    cr_assert(bin != NULL);
    GPtrArray *argv = g_ptr_array_new();
    g_ptr_array_add(argv, (gpointer)bin);
    for (int i = 0; big[i]; i++)
        g_ptr_array_add(argv, (gpointer)big[i]);
    g_ptr_array_add(argv, NULL);
    char *out = NULL, *err = NULL;
    double t0 = tu_children_cpu_s();
    int rc = tu_run((const char *const *)argv->pdata, env, &out, &err);
    double cpu = tu_children_cpu_s() - t0;
    cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
    cr_expect(strstr(err, "host memory") && strstr(err, "64.00 MiB") &&
                  strstr(err, "256 micro-batches generated per step"),
              "%s", err);
    cr_expect(cpu < 10 * (tu_sanitized() ? 4 : 1), "refused after %.1f s of CPU", cpu);
    g_free(out);
    g_free(err);
    /* the same machine takes a single GPU's 256 micro-batches: their repetitions are generated
     * once */
    const char *small[] = {bin,   "estimate",     "--model", "gpt2", "--seq",
                           "128", "--grad-accum", "256",     NULL};
    rc = tu_run(small, env, &out, &err);
    cr_expect(rc == 0 || rc == 1, "exit %d: %s", rc, err);
    cr_expect(strstr(out, "steady state after micro-batch"), "%s", out);
    g_free(out);
    g_free(err);
    g_ptr_array_unref(argv);
}

/* The host-memory check skips its probe where several times the events estimated from the
 * run's shape (model_run_events) are far below the memory there is: every preset's probe,
 * under each method, holds fewer events than MODEL_EVENTS_MARGIN times that estimate. */
Test(steady, events_are_bounded_by_the_shape, .timeout = 600)
{
    static const char *const variants[][12] = {
        {NULL},
        {"checkpointing", "full", NULL},
        {"finetune", "lora", NULL},
        {"gpus", "4", "method", "ddp", NULL},
        {"gpus", "4", "method", "zero3", "checkpointing", "full", NULL},
        {"gpus", "4", "method", "fsdp", NULL},
        {"gpus", "8", "tp", "2", "pp", "4", "microbatches", "4", NULL},
        {"gpus", "8", "pp", "8", "microbatches", "8", "checkpointing", "full", NULL},
        {"gpus", "4", "pp", "2", "microbatches", "2", "pp-schedule", "interleaved",
         "virtual-stages", "2", NULL},
    };
    char **presets = memsim_model_presets();
    double worst = 0;
    const char *worst_model = NULL;
    int n = 0;
    for (char **p = presets; *p; p++) {
        MemsimModel *m = memsim_model_load(*p, NULL);
        cr_assert(m, "%s", *p);
        for (gsize v = 0; v < G_N_ELEMENTS(variants); v++) {
            MemsimRun run = memsim_run_defaults();
            tu_set(&run, "seq", "256");
            tu_set(&run, "steps", "1");
            for (int k = 0; variants[v][k]; k += 2)
                tu_set(&run, variants[v][k], variants[v][k + 1]);
            GError *e = NULL;
            MemsimTrace *t = memsim_generate(m, &run, &e);
            if (!t) { /* a run the model refuses (heads over tp, layers over pp) */
                g_clear_error(&e);
                continue;
            }
            uint64_t events = 0;
            for (guint32 k = 0; k < memsim_trace_header(t)->n_ranks; k++) {
                gsize len = 0;
                memsim_trace_events(t, k, &len);
                events += len;
            }
            memsim_trace_free(t);
            MemsimRun adapted = run;
            memsim_run_adapt(&adapted, m);
            double shape = model_run_events(m, &adapted), ratio = (double)events / shape;
            cr_expect(ratio < MODEL_EVENTS_MARGIN, "%s, variant %zu: %" G_GUINT64_FORMAT
                      " events, %.0f estimated", *p, v, events, shape);
            if (ratio > worst) {
                worst = ratio;
                worst_model = *p;
            }
            n++;
        }
        memsim_model_free(m);
    }
    cr_log_info("%d runs: at most %.2f times the estimate (%s)", n, worst, worst_model ? worst_model : "-");
    cr_expect_gt(n, 400);
    g_strfreev(presets);
}

/* `gen` streams: each rank's program goes to a file of its own once complete (the trace holds
 * one rank's events at a time) and is streamed back into the output; the file is the one the
 * whole trace in memory makes, byte for byte. */
Test(steady, spilled_ranks_make_the_same_file, .timeout = 300)
{
    g_setenv("MEMSIM_NO_SKIP", "1", TRUE);
    MemsimModel *m = memsim_model_load("gpt2", NULL);
    MemsimRun run = memsim_run_defaults();
    tu_set(&run, "seq", "128");
    tu_set(&run, "gpus", "4");
    tu_set(&run, "pp", "4");
    tu_set(&run, "microbatches", "8");
    char *dir = tu_tmpdir();
    GError *err = NULL;
    MemsimTrace *whole = memsim_generate(m, &run, &err);
    cr_assert(whole, "%s", err ? err->message : "?");
    MemsimTrace *spilled = memsim_generate_spilling(m, &run, dir, &err);
    cr_assert(spilled, "%s", err ? err->message : "?");
    g_unsetenv("MEMSIM_NO_SKIP");
    for (guint32 r = 0; r < memsim_trace_header(spilled)->n_ranks; r++) {
        gsize n = 1;
        memsim_trace_events(spilled, r, &n);
        cr_expect_eq(n, 0, "rank %u kept %zu events in memory", r, n);
        cr_expect(memsim_trace_spilled(spilled, r, NULL) != NULL, "rank %u not spilled", r);
    }
    const char *formats[] = {"a.mst", "a.txt"};
    for (gsize k = 0; k < G_N_ELEMENTS(formats); k++) {
        char *p1 = g_strdup_printf("%s/whole-%s", dir, formats[k]);
        char *p2 = g_strdup_printf("%s/spilled-%s", dir, formats[k]);
        cr_assert(memsim_trace_save(whole, p1, MEMSIM_FORMAT_AUTO, &err), "%s", err->message);
        cr_assert(memsim_trace_save(spilled, p2, MEMSIM_FORMAT_AUTO, &err), "%s", err->message);
        gchar *a, *b;
        gsize na, nb;
        cr_assert(g_file_get_contents(p1, &a, &na, NULL) && g_file_get_contents(p2, &b, &nb, NULL));
        cr_expect(na == nb && memcmp(a, b, na) == 0, "%s: the files differ (%zu, %zu bytes)",
                  formats[k], na, nb);
        g_free(a);
        g_free(b);
        g_unlink(p1);
        g_unlink(p2);
        g_free(p1);
        g_free(p2);
    }
    memsim_trace_free(whole);
    memsim_trace_free(spilled); /* deletes the ranks' files */
    cr_expect(g_rmdir(dir) == 0, "%s is not empty", dir);
    g_free(dir);
    memsim_run_clear(&run);
    memsim_model_free(m);
}

/* A pipeline's stages catch up with the steady state on threads of their own
 * (MemsimReplayOptions.threads, sim/replay.c catch_up_ranks): one thread, two and four give
 * the same report, to the byte of its JSON. */
Test(steady, catch_up_threads_give_one_answer, .timeout = 300)
{
    MemsimModel *m = memsim_model_load("gpt2", NULL);
    cr_assert(m != NULL);
    MemsimRun run = memsim_run_defaults();
    const char *set[] = {"seq", "256", "gpus", "4", "method", "megatron", "pp", "4",
                         "microbatches", "64", NULL};
    for (int i = 0; set[i]; i += 2)
        tu_set(&run, set[i], set[i + 1]);
    memsim_run_adapt(&run, m);
    GError *err = NULL;
    MemsimTrace *t = memsim_generate(m, &run, &err);
    cr_assert(t, "%s", err ? err->message : "?");
    char *json[3] = {NULL};
    const guint threads[] = {1, 2, 4};
    for (gsize i = 0; i < G_N_ELEMENTS(threads); i++) {
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.threads = threads[i];
        MemsimReport *rep = memsim_replay_trace(t, &o, &err);
        cr_assert(rep, "%u thread(s): %s", threads[i], err ? err->message : "?");
        /* the stages' time was added by periods, and their memory caught up */
        guint timed = 0;
        for (guint k = 0; k < rep->n_ranks; k++)
            timed += rep->ranks[k].steady_timed > 0;
        cr_assert_eq(timed, rep->n_ranks, "%u thread(s): %u of %u stages caught up",
                     threads[i], timed, rep->n_ranks);
        json[i] = memsim_report_to_json(rep);
        memsim_report_free(rep);
    }
    for (gsize i = 1; i < G_N_ELEMENTS(threads); i++)
        cr_expect_str_eq(json[i], json[0], "%u threads give another report than one",
                         threads[i]);
    for (gsize i = 0; i < G_N_ELEMENTS(threads); i++)
        g_free(json[i]);
    memsim_trace_free(t);
    memsim_run_clear(&run);
    memsim_model_free(m);
}

/* A trace that ends before the unit a repeat announced is refused, naming the repeat, by the
 * library (an in-memory trace and a streamed file alike) and by the command (exit 2): it was
 * replayed as if the unit were whole. */
Test(steady, trace_ending_inside_a_unit_is_refused, .timeout = 60)
{
    g_autofree char *dir = tu_tmpdir();
    const char *const texts[2] = {
        "memsim-trace 1\n"
        "rank 0 device=0 multiplicity=1 streams=1\n"
        "@rank 0\n"
        "alloc t=1 size=4096 stream=0 cat=activation\n"
        "repeat events=3 times=2 from=2 shift=1\n"
        "alloc t=2 size=4096 stream=0 cat=activation\n"
        "free t=2\n",
        "memsim-trace 1\n"
        "rank 0 device=0 multiplicity=1 streams=1\n"
        "string 0 \"step 1\"\n"
        "string 1 \"step 2\"\n"
        "@rank 0\n"
        "mark 0\n"
        "alloc t=1 size=4096 stream=0 cat=activation\n"
        "repeat events=9 times=3 from=2 shift=2 steps\n"
        "mark 1\n"
        "alloc t=2 size=4096 stream=0 cat=activation\n"
        "free t=2\n",
    };
    const char *const says[2] = {"event 1: the trace ends inside the unit of this repeat (2 of "
                                 "its 3 events)",
                                 "event 2: the trace ends inside the unit of this repeat of "
                                 "steps (3 of its 9 events)"};
    for (int i = 0; i < 2; i++) {
        g_autofree char *name = g_strdup_printf("cut-%d.txt", i);
        g_autofree char *path = g_build_filename(dir, name, NULL);
        cr_assert(g_file_set_contents(path, texts[i], -1, NULL));
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        GError *err = NULL;
        MemsimReport *rep = memsim_replay_path(path, &o, &err);
        cr_expect(rep == NULL, "%s: replayed", name);
        cr_expect(err && g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT) &&
                      strstr(err->message, says[i]),
                  "%s: %s", name, err ? err->message : "no error");
        g_clear_error(&err);
        memsim_report_free(rep);
        /* in memory */
        MemsimTrace *t = memsim_trace_load(path, &err);
        cr_assert(t, "%s: %s", name, err ? err->message : "?");
        rep = memsim_replay_trace(t, &o, &err);
        cr_expect(rep == NULL, "%s: replayed in memory", name);
        cr_expect(err && strstr(err->message, says[i]), "%s: %s", name,
                  err ? err->message : "no error");
        g_clear_error(&err);
        memsim_report_free(rep);
        memsim_trace_free(t);
        const char *argv[] = {"replay", path, NULL};
        g_autofree char *out = NULL, *msg = NULL;
        int rc = tu_run_memsim(argv, &out, &msg);
        cr_expect_eq(rc, 2, "%s: memsim replay exited %d", name, rc);
        cr_expect(strstr(msg, says[i]), "%s: [%s]", name, msg);
    }
}
