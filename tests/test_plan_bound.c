/* The plan's lower bound of a Megatron configuration's step (traces/plan/bound.c) stays below
 * the step the replay simulates, over models, degrees, schedules, checkpointing modes,
 * micro-batch sizes and counts, and is close to it (it decides which candidates are
 * simulated: a loose bound only costs time, one above the simulation would lose rows, which
 * tests/test_plan.c's comparison with the exhaustive sweep would show as well). The floor that
 * one short run gives every micro-batch size of a fixed global batch stays below each of
 * their simulated steps. */
#include <criterion/criterion.h>
#include <memsim/plan.h>
#include <memsim/sim.h>
#include <string.h>

#include "testutil.h"
#include "sim/replay_bound.h"
#include "traces/plan/sweep.h"

typedef struct {
    const char *model;
    const char *seq;
    int tp, pp, dp;
    MemsimPipeSchedule sched;
    int v;
    MemsimCheckpointing ckpt;
    int64_t b;
    int m;
} Case;

/* The slowest rank's last step as the plan takes it (traces/plan/plan.c probe_take), in s. */
static double simulated_step(const MemsimModel *model, const MemsimRun *r, const MemsimGpu *gpu)
{
    GError *e = NULL;
    MemsimTrace *t = memsim_generate(model, r, &e);
    cr_assert(t, "generate: %s", e ? e->message : "?");
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.dispatch_us = gpu->dispatch_us;
    o.threads = 1;
    MemsimReport *rep = memsim_replay_trace(t, &o, &e);
    cr_assert(rep, "replay: %s", e ? e->message : "?");
    double step = 0;
    for (guint i = 0; i < rep->n_ranks; i++) {
        const MemsimRankReport *rr = &rep->ranks[i];
        MemsimStepTime st;
        memsim_step_time(rr, rr->n_steps ? rr->n_steps - 1 : 0, &st);
        step = MAX(step, st.step_us / 1e6);
    }
    memsim_report_free(rep);
    memsim_trace_free(t);
    return step;
}

/* A sweep and a group of one configuration at the micro-batches bs[k], n_micro[k]. */
typedef struct {
    Sweep sw;
    Group g;
    MemsimModel *model;
    const MemsimGpu *gpu;
    int64_t b1; /* one_single's micro-batch */
    int m1;
} One;

static void one_init(One *o, const Case *c, int gpus, const int64_t *bs, const int *ms, int nb)
{
    memset(o, 0, sizeof *o);
    GError *e = NULL;
    o->model = memsim_model_load(c->model, &e);
    cr_assert(o->model, "%s: %s", c->model, e ? e->message : "?");
    o->gpu = memsim_gpu_find("h100-80gb");
    cr_assert(o->gpu);
    o->sw.model = o->model;
    o->sw.base = memsim_run_defaults();
    cr_assert(memsim_run_set(&o->sw.base, "seq", c->seq, &e), "%s", e ? e->message : "");
    cr_assert(memsim_run_set(&o->sw.base, "finetune", "full", &e), "%s", e ? e->message : "");
    o->sw.gpu_name = "h100-80gb";
    o->sw.gpu = o->gpu;
    o->sw.opt.gpus = gpus;
    o->g.method = MEMSIM_METHOD_MEGATRON;
    o->g.tp = c->tp;
    o->g.pp = c->pp;
    o->g.dp = c->dp;
    o->g.v = c->v;
    o->g.schedule = c->sched;
    o->g.ckpt = c->ckpt;
    o->g.nb = nb;
    o->g.bs = (int64_t *)bs;
    o->g.n_micro = (int *)ms;
}

/* One configuration at its own micro-batch (c->b, c->m): `r` its run. */
static void one_setup(One *o, const Case *c, MemsimRun *r)
{
    one_init(o, c, c->tp * c->pp * c->dp, NULL, NULL, 1);
    o->b1 = c->b;
    o->m1 = c->m;
    o->g.bs = &o->b1;
    o->g.n_micro = &o->m1;
    plan_candidate_run(&o->sw, &o->g, 0, r);
}

/* one_setup, and the run's trace (NULL with `error` set when the generator refuses the
 * layout). */
static MemsimTrace *one_single(One *o, const Case *c, MemsimRun *r, GError **error)
{
    one_setup(o, c, r);
    return memsim_generate(o->model, r, error);
}

static void one_clear(One *o)
{
    memsim_run_clear(&o->sw.base);
    memsim_model_free(o->model);
}

/* memsim_replay_trace of case i's trace, which must replay. */
static MemsimReport *replay_case(MemsimTrace *t, const MemsimReplayOptions *o, gsize i)
{
    GError *e = NULL;
    MemsimReport *rep = memsim_replay_trace(t, o, &e);
    cr_assert(rep, "case %zu: %s", i, e ? e->message : "?");
    return rep;
}

/* The largest requested (or reserved) peak over the report's ranks. */
static int64_t largest_peak(const MemsimReport *rep, gboolean reserved)
{
    int64_t peak = 0;
    for (guint k = 0; k < rep->n_ranks; k++)
        peak = MAX(peak, reserved ? rep->ranks[k].stats.reserved.peak
                                  : rep->ranks[k].stats.requested.peak);
    return peak;
}

static const char *sched_name(MemsimPipeSchedule s)
{
    return s == MEMSIM_PP_INTERLEAVED ? "interleaved" : s == MEMSIM_PP_GPIPE ? "gpipe" : "1f1b";
}

static const char *ckpt_name(MemsimCheckpointing c)
{
    return c == MEMSIM_CKPT_FULL ? "full" : c == MEMSIM_CKPT_SELECTIVE ? "selective" : "none";
}

Test(plan_bound, below_the_simulated_step_and_close, .timeout = 600)
{
    const Case cases[] = {
        {"llama-2-70b", "4096", 8, 4, 2, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_FULL, 1, 64},
        {"llama-2-70b", "4096", 8, 4, 2, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 2, 16},
        {"llama-2-70b", "4096", 2, 8, 4, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_FULL, 1, 32},
        {"llama-2-70b", "4096", 4, 8, 2, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_SELECTIVE, 2, 16},
        {"llama-2-70b", "2048", 1, 16, 4, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_SELECTIVE, 1, 48},
        {"llama-2-70b", "2048", 8, 2, 4, MEMSIM_PP_GPIPE, 1, MEMSIM_CKPT_FULL, 1, 8},
        {"llama-2-70b", "2048", 8, 1, 8, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 1, 12},
        {"llama-2-13b", "2048", 2, 4, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 1, 4},
        {"llama-2-13b", "2048", 2, 4, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 1, 7},
        {"llama-2-13b", "1024", 1, 2, 4, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_NONE, 4, 8},
        {"llama-2-13b", "1024", 4, 2, 1, MEMSIM_PP_GPIPE, 1, MEMSIM_CKPT_SELECTIVE, 2, 6},
        {"llama-2-7b", "1024", 1, 8, 1, MEMSIM_PP_INTERLEAVED, 4, MEMSIM_CKPT_FULL, 1, 16},
        {"llama-2-7b", "4096", 2, 2, 2, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_FULL, 1, 3},
        {"llama-2-7b", "512", 1, 4, 2, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 8, 128},
        {"mistral-7b", "4096", 4, 2, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_SELECTIVE, 1, 9},
        {"llama-3-8b", "2048", 2, 4, 1, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_SELECTIVE, 1, 12},
        {"gemma-2-9b", "2048", 2, 3, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 1, 6},
        {"gemma-3-4b", "2048", 1, 2, 2, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_SELECTIVE, 2, 5},
        {"gpt2-xl", "1024", 2, 4, 1, MEMSIM_PP_INTERLEAVED, 3, MEMSIM_CKPT_NONE, 2, 8},
        {"falcon-7b", "2048", 1, 4, 2, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_FULL, 1, 10},
    };
    const gsize n = tu_sanitized() ? 6 : G_N_ELEMENTS(cases);
    int bounded = 0;
    for (gsize i = 0; i < n; i++) {
        const Case *c = &cases[i];
        One o;
        MemsimRun r;
        GError *e = NULL;
        MemsimTrace *probe = one_single(&o, c, &r, &e);
        if (!probe) {
            /* a layout the generator refuses (heads, layers): nothing to bound */
            cr_log_info("case %zu (%s): %s", i, c->model, e->message);
            g_clear_error(&e);
            one_clear(&o);
            continue;
        }
        memsim_trace_free(probe);
        double bound = plan_step_bound(&o.sw, &o.g, 0);
        double step = simulated_step(o.model, &r, o.gpu);
        cr_log_info("%s seq %s tp%d pp%d dp%d %s v%d %s b%" G_GINT64_FORMAT " m%d: bound %.4f s, "
                    "simulated %.4f s (%.2f%%)",
                    c->model, c->seq, c->tp, c->pp, c->dp, sched_name(c->sched), c->v,
                    ckpt_name(c->ckpt), c->b, c->m, bound, step, 100.0 * bound / step);
        cr_expect_gt(step, 0, "case %zu: a simulated step", i);
        cr_expect_leq(bound, step, "case %zu (%s tp%d pp%d %s %s): the bound %.6f s is above the "
                      "simulated step %.6f s", i, c->model, c->tp, c->pp, sched_name(c->sched),
                      ckpt_name(c->ckpt), bound, step);
        /* close: within 10% (the fill and drain of the chain count the first chunk only, the
         * step's optimizer and data-parallel collectives not at all) */
        cr_expect_geq(bound, 0.9 * step, "case %zu (%s tp%d pp%d %s): the bound %.4f s is loose "
                      "against %.4f s", i, c->model, c->tp, c->pp, sched_name(c->sched), bound,
                      step);
        bounded++;
        one_clear(&o);
    }
    cr_expect_geq(bounded, (int)n - 3, "most cases bounded (%d of %zu)", bounded, n);
}

Test(plan_bound, floor_below_every_micro_batch_size, .timeout = 600)
{
    /* a fixed global batch: b · m = 32 sequences per replica */
    const Case cases[] = {
        {"llama-2-70b", "4096", 8, 4, 2, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_FULL, 0, 0},
        {"llama-2-13b", "1024", 2, 4, 1, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_SELECTIVE, 0, 0},
        {"llama-2-7b", "512", 1, 2, 4, MEMSIM_PP_GPIPE, 1, MEMSIM_CKPT_NONE, 0, 0},
    };
    const int64_t bs[] = {1, 2, 4, 8};
    const int ms[] = {32, 16, 8, 4};
    const gsize n = tu_sanitized() ? 1 : G_N_ELEMENTS(cases);
    for (gsize i = 0; i < n; i++) {
        const Case *c = &cases[i];
        One o;
        one_init(&o, c, c->tp * c->pp * c->dp, bs, ms, 4);
        double floor = plan_step_floor(&o.sw, &o.g, 3);
        cr_expect_gt(floor, 0, "case %zu: a floor", i);
        for (int j = 0; j < 4; j++) {
            if (c->sched == MEMSIM_PP_INTERLEAVED && ms[j] % c->pp)
                continue;
            MemsimRun r;
            plan_candidate_run(&o.sw, &o.g, j, &r);
            double step = simulated_step(o.model, &r, o.gpu);
            cr_log_info("%s %s b%" G_GINT64_FORMAT " m%d: floor %.4f s, simulated %.4f s",
                        c->model, sched_name(c->sched), bs[j], ms[j], floor, step);
            cr_expect_leq(floor, step, "case %zu, b %" G_GINT64_FORMAT ": the floor %.6f s is "
                          "above the simulated step %.6f s", i, bs[j], floor, step);
        }
        one_clear(&o);
    }
}

/* Each rank's rounded_peak, from a replay through torch, is the peak the `exact` policy
 * reserves on the same program (the plan judges the exact bound from it instead of a replay
 * of its own): single GPU with gradient accumulation and the steady state's skipping, FSDP,
 * ZeRO, 1F1B and interleaved pipelines whose repetitions run for their memory alone. */
Test(plan_bound, rounded_peak_is_the_exact_policy_peak, .timeout = 600)
{
    const char *const runs[][20] = {
        {"llama-3.2-1b", "batch", "2", "seq", "512", "grad-accum", "8", NULL},
        {"llama-3.2-1b", "batch", "1", "seq", "256", "steps", "6", "finetune", "lora", NULL},
        {"gpt2", "batch", "4", "seq", "128", "gpus", "4", "method", "fsdp", "grad-accum", "3",
         NULL},
        {"gpt2", "batch", "2", "seq", "128", "gpus", "2", "method", "zero2", NULL},
        {"llama-2-7b", "seq", "1024", "gpus", "8", "method", "megatron", "tp", "2", "pp", "4",
         "microbatches", "24", NULL},
        {"llama-2-7b", "seq", "1024", "gpus", "8", "method", "megatron", "tp", "1", "pp", "4",
         "pp-schedule", "interleaved", "virtual-stages", "2", "microbatches", "16", NULL},
    };
    const gsize n = tu_sanitized() ? 3 : G_N_ELEMENTS(runs);
    for (gsize i = 0; i < n; i++) {
        MemsimTrace *t = tu_generate(runs[i][0], runs[i] + 1);
        MemsimReport *rep[2];
        const char *policy[2] = {"torch", "exact"};
        for (int k = 0; k < 2; k++) {
            MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
            o.allocator = policy[k];
            o.threads = 1;
            GError *e = NULL;
            rep[k] = memsim_replay_trace(t, &o, &e);
            cr_assert(rep[k], "%s: %s", policy[k], e ? e->message : "?");
        }
        cr_assert_eq(rep[0]->n_ranks, rep[1]->n_ranks);
        for (guint r = 0; r < rep[0]->n_ranks; r++) {
            cr_log_info("%s case %zu rank %u: rounded peak %" G_GUINT64_FORMAT ", exact reserved "
                        "peak %" G_GINT64_FORMAT, runs[i][0], i, r, rep[0]->ranks[r].rounded_peak,
                        rep[1]->ranks[r].stats.reserved.peak);
            cr_expect_eq(rep[0]->ranks[r].rounded_peak,
                         (memsim_size_t)rep[1]->ranks[r].stats.reserved.peak,
                         "%s case %zu rank %u: rounded peak %" G_GUINT64_FORMAT " against the "
                         "exact policy's %" G_GINT64_FORMAT, runs[i][0], i, r,
                         rep[0]->ranks[r].rounded_peak, rep[1]->ranks[r].stats.reserved.peak);
            cr_expect_eq(rep[1]->ranks[r].rounded_peak,
                         (memsim_size_t)rep[1]->ranks[r].stats.reserved.peak);
        }
        memsim_report_free(rep[0]);
        memsim_report_free(rep[1]);
        memsim_trace_free(t);
    }
}

/* The short run of a candidate's stage programs (fewer micro-batches, one step) never asks
 * for more memory than the run: the plan takes a short run over the device's limit for a run
 * over it (plan_short_run_over). It asks for most of it (its warm-up holds as many
 * micro-batches where the schedule allows), or the check would rarely settle anything. */
Test(plan_bound, short_run_asks_no_more_than_the_run, .timeout = 600)
{
    const Case cases[] = {
        {"llama-2-7b", "2048", 2, 4, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 1, 16},
        {"llama-2-7b", "1024", 1, 8, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_SELECTIVE, 2, 32},
        {"llama-2-13b", "1024", 2, 4, 1, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_NONE, 1, 16},
        {"llama-2-13b", "1024", 1, 2, 2, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_FULL, 2, 4},
        {"llama-2-7b", "1024", 2, 2, 2, MEMSIM_PP_GPIPE, 1, MEMSIM_CKPT_NONE, 1, 8},
        {"llama-3-8b", "2048", 4, 1, 2, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 2, 6},
        {"gemma-2-9b", "1024", 2, 3, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_FULL, 1, 9},
    };
    const gsize n = tu_sanitized() ? 2 : G_N_ELEMENTS(cases);
    for (gsize i = 0; i < n; i++) {
        const Case *c = &cases[i];
        One o;
        MemsimRun r;
        GError *e = NULL;
        MemsimTrace *t = one_single(&o, c, &r, &e);
        cr_assert(t, "case %zu: %s", i, e ? e->message : "?");
        MemsimReplayOptions ro = MEMSIM_REPLAY_OPTIONS_INIT;
        ro.threads = 1;
        MemsimReport *rep = replay_case(t, &ro, i);
        const int64_t peak = largest_peak(rep, FALSE);
        memsim_report_free(rep);
        memsim_trace_free(t);
        gboolean over_at_peak = plan_short_run_over(&o.sw, &o.g, 0, peak);
        gboolean over_below = plan_short_run_over(&o.sw, &o.g, 0, peak / 10 * 9);
        cr_log_info("%s %s pp%d m%d: run's requested peak %" G_GINT64_FORMAT ", short run over "
                    "it: %d, over 90%% of it: %d", c->model, sched_name(c->sched), c->pp, c->m,
                    peak, over_at_peak, over_below);
        cr_expect(!over_at_peak, "case %zu (%s %s pp%d): the short run asks for more than the "
                  "run's requested peak %" G_GINT64_FORMAT, i, c->model, sched_name(c->sched),
                  c->pp, peak);
        if (c->sched != MEMSIM_PP_GPIPE)
            cr_expect(over_below, "case %zu (%s %s pp%d): the short run stays under 90%% of the "
                      "run's requested peak", i, c->model, sched_name(c->sched), c->pp);
        one_clear(&o);
    }
}

/* A short run makes only stages 0, 1 and pp − 1 where the stages between hold alike layers
 * (traces/plan/bound.c short_stages): the bounds it gives equal those of the short run of
 * every stage, to the bit, and so does its answer to whether some rank's requested bytes
 * pass a limit, at limits around the largest stage's requested peak. Also where the stages
 * are not alike (a mixture of experts whose first dense layers reach into stage 1; Gemma 2's
 * alternating sliding layers over stages of 7: every stage is then made) and where
 * they are through a pattern (Gemma 3's one global layer in 6, over stages of 12). */
Test(plan_bound, stages_left_out_change_nothing, .timeout = 600)
{
    /* DeepSeek-V2-Lite cut to 24 layers whose first 4 are dense (first_k_dense_replace), its
     * dense MLP narrower than its experts: stage 1 of 8 holds a dense layer where the stages
     * after it hold none, so its stages are made whole */
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *moe = g_build_filename(dir, "config.json", NULL);
    cr_assert(g_file_set_contents(
        moe,
        "{\"model_type\": \"deepseek_v2\", \"vocab_size\": 102400, \"hidden_size\": 2048, "
        "\"intermediate_size\": 2816, \"moe_intermediate_size\": 1408, "
        "\"n_routed_experts\": 64, \"n_shared_experts\": 2, \"num_experts_per_tok\": 6, "
        "\"num_hidden_layers\": 24, \"num_attention_heads\": 16, \"num_key_value_heads\": 16, "
        "\"q_lora_rank\": null, \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, "
        "\"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"first_k_dense_replace\": 4, "
        "\"moe_layer_freq\": 1, \"max_position_embeddings\": 163840, "
        "\"tie_word_embeddings\": false}",
        -1, NULL));
    const Case cases[] = {
        {moe, "2048", 1, 8, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 1, 16},
        {"llama-2-70b", "4096", 1, 16, 4, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_FULL, 1, 64},
        {"llama-2-70b", "4096", 2, 8, 4, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_SELECTIVE, 1, 32},
        {"llama-2-13b", "2048", 2, 4, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 2, 16},
        {"llama-2-7b", "1024", 1, 8, 1, MEMSIM_PP_INTERLEAVED, 4, MEMSIM_CKPT_FULL, 1, 16},
        {"mixtral-8x7b", "2048", 2, 8, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_FULL, 1, 16},
        {"gemma-2-9b", "2048", 1, 6, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 1, 24},
        {"gemma-3-12b", "2048", 2, 4, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_SELECTIVE, 1, 16},
    };
    for (gsize i = 0; i < (tu_sanitized() ? 2 : G_N_ELEMENTS(cases)); i++) {
        const Case *c = &cases[i];
        One o;
        MemsimRun r;
        one_setup(&o, c, &r);
        double b[2], f[2];
        for (int all = 0; all < 2; all++) {
            o.sw.all_stages = all;
            b[all] = plan_step_bound(&o.sw, &o.g, 0);
            f[all] = plan_step_floor(&o.sw, &o.g, 0);
        }
        cr_log_info("%s pp%d %s: bound %.6f s, floor %.6f s", c->model, c->pp,
                    sched_name(c->sched), b[0], f[0]);
        cr_expect(b[0] > 0, "case %zu (%s): no bound", i, c->model);
        cr_expect(b[0] == b[1] && f[0] == f[1],
                  "case %zu (%s pp%d): bound %.9f and floor %.9f from stages 0, 1 and pp - 1, "
                  "%.9f and %.9f from every stage",
                  i, c->model, c->pp, b[0], f[0], b[1], f[1]);
        /* the short run's largest requested peak over its stages, found by bisection on the
         * whole run's answer; the partial run must answer alike around it */
        o.sw.all_stages = TRUE;
        int64_t lo = 0, hi = (int64_t)1 << 44;
        while (hi - lo > 1) {
            int64_t mid = lo + (hi - lo) / 2;
            if (plan_short_run_over(&o.sw, &o.g, 0, mid))
                lo = mid;
            else
                hi = mid;
        }
        cr_expect(lo > 0, "case %zu: the short run asks for nothing", i);
        const int64_t limits[] = {lo - ((int64_t)1 << 30), lo, hi, hi + ((int64_t)1 << 30)};
        for (gsize k = 0; k < G_N_ELEMENTS(limits); k++) {
            o.sw.all_stages = TRUE;
            gboolean want = plan_short_run_over(&o.sw, &o.g, 0, limits[k]);
            o.sw.all_stages = FALSE;
            gboolean got = plan_short_run_over(&o.sw, &o.g, 0, limits[k]);
            cr_expect_eq(got, want, "case %zu (%s pp%d), limit %" G_GINT64_FORMAT ": over %d "
                         "from stages 0, 1 and pp - 1, %d from every stage",
                         i, c->model, c->pp, limits[k], got, want);
        }
        one_clear(&o);
    }
}

/* Whether a run fits, from a replay that stops at the first allocation that fails or that
 * takes a rank's reserved bytes past the limit (sim/replay_bound.h
 * memsim_replay_trace_if_fits, which the plan asks where only that is asked): the answer of
 * the whole replay, around the run's peak, with the torch policy and expandable segments, for
 * pipelines whose stages catch their memory up alone (1F1B, interleaved) and one GPU; where
 * it fits, the same report. */
Test(plan_bound, stopping_at_a_miss_answers_as_the_whole_replay, .timeout = 600)
{
    const Case cases[] = {
        {"llama-2-13b", "2048", 2, 4, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_NONE, 1, 32},
        {"llama-2-7b", "1024", 1, 8, 1, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_FULL, 1, 64},
        {"llama-2-7b", "2048", 1, 2, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_SELECTIVE, 2, 16},
    };
    const char *confs[] = {NULL, "expandable_segments:True"};
    for (gsize i = 0; i < (tu_sanitized() ? 1 : G_N_ELEMENTS(cases)); i++) {
        const Case *c = &cases[i];
        One o;
        MemsimRun r;
        GError *e = NULL;
        MemsimTrace *t = one_single(&o, c, &r, &e);
        cr_assert(t, "case %zu: %s", i, e ? e->message : "?");
        MemsimReplayOptions ro = MEMSIM_REPLAY_OPTIONS_INIT;
        ro.threads = 1;
        MemsimReport *free_run = replay_case(t, &ro, i);
        const int64_t peak = largest_peak(free_run, TRUE);
        memsim_report_free(free_run);
        const int64_t gib = (int64_t)1 << 30;
        /* (capacity, reserved limit): the allocator's device, and what the judge leaves it */
        const int64_t caps[][2] = {{peak * 4 / 5, peak * 4 / 5}, {peak - gib, peak - gib},
                                   {peak + gib, peak - gib / 2}, {peak + gib, peak},
                                   {peak + 2 * gib, peak + 2 * gib}};
        int misses = 0, fits = 0;
        for (gsize q = 0; q < G_N_ELEMENTS(confs); q++)
            for (gsize k = 0; k < G_N_ELEMENTS(caps); k++) {
                ro.alloc_conf = confs[q];
                ro.capacity = (memsim_size_t)caps[k][0];
                MemsimReport *whole = replay_case(t, &ro, i);
                gboolean want = TRUE;
                for (guint n = 0; n < whole->n_ranks; n++)
                    want &= !whole->ranks[n].oom.happened &&
                            whole->ranks[n].stats.reserved.peak <= caps[k][1];
                gboolean miss = FALSE;
                MemsimReport *fast = memsim_replay_trace_if_fits(t, &ro, caps[k][1], &miss, &e);
                cr_assert(fast || miss, "case %zu: %s", i, e ? e->message : "?");
                cr_expect_eq(miss, !want, "case %zu (%s pp%d %s), capacity %" G_GINT64_FORMAT
                             ", limit %" G_GINT64_FORMAT ": stopped short %d, the whole replay "
                             "fits %d", i, c->model, c->pp, confs[q] ? confs[q] : "torch",
                             caps[k][0], caps[k][1], miss, want);
                if (fast && want) {
                    cr_expect_eq(fast->n_ranks, whole->n_ranks);
                    for (guint n = 0; n < MIN(fast->n_ranks, whole->n_ranks); n++) {
                        cr_expect_eq(fast->ranks[n].stats.reserved.peak,
                                     whole->ranks[n].stats.reserved.peak, "case %zu rank %u", i, n);
                        cr_expect_eq(fast->ranks[n].stats.allocated.peak,
                                     whole->ranks[n].stats.allocated.peak, "case %zu rank %u", i, n);
                        cr_expect_eq(fast->ranks[n].time_us, whole->ranks[n].time_us,
                                     "case %zu rank %u", i, n);
                    }
                }
                misses += miss;
                fits += !miss;
                memsim_report_free(fast);
                memsim_report_free(whole);
            }
        cr_log_info("%s pp%d %s: %d fits, %d misses", c->model, c->pp, sched_name(c->sched),
                    fits, misses);
        cr_expect(misses > 0 && fits > 0, "case %zu: no capacity on each side of the peak", i);
        memsim_trace_free(t);
        one_clear(&o);
    }
}

/* The short run's memory answer (traces/plan/bound.c plan_rank_requested_over, which reads the
 * live requests off the events, running a REPEAT's unit again with its ids moved) is the
 * replay's: over a limit one byte below the requested peak that memsim_replay_trace gives the
 * same short run, not over at that peak, rank by rank and for the run; with stages whose
 * steady phase repeats (1F1B pp 16 with 16 micro-batches: stages 4 and later) and without. */
Test(plan_bound, short_run_memory_is_the_replays, .timeout = 600)
{
    const Case cases[] = {
        {"llama-2-70b", "4096", 1, 16, 4, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_FULL, 1, 64},
        {"llama-2-7b", "1024", 1, 8, 1, MEMSIM_PP_INTERLEAVED, 2, MEMSIM_CKPT_NONE, 1, 32},
        {"llama-2-13b", "2048", 2, 4, 1, MEMSIM_PP_1F1B, 1, MEMSIM_CKPT_SELECTIVE, 2, 16},
    };
    for (gsize i = 0; i < (tu_sanitized() ? 1 : G_N_ELEMENTS(cases)); i++) {
        const Case *c = &cases[i];
        One o;
        MemsimRun r;
        one_setup(&o, c, &r);
        o.sw.all_stages = TRUE; /* the short run as the replay below makes it */
        const int m0 = plan_short_micro(&o.g, 0, TRUE);
        cr_assert(m0 > 0, "case %zu: no short run", i);
        r.microbatches = m0;
        r.steps = MIN(r.steps, 2);
        GError *e = NULL;
        MemsimTrace *t = memsim_generate(o.model, &r, &e);
        cr_assert(t, "case %zu: %s", i, e ? e->message : "?");
        gboolean repeats = FALSE;
        for (guint32 k = 0; k < memsim_trace_header(t)->n_ranks; k++) {
            gsize n;
            const MemsimEvent *ev = memsim_trace_events(t, k, &n);
            for (gsize x = 0; x < n; x++)
                repeats |= ev[x].kind == MEMSIM_EV_REPEAT && ev[x].aux > 0;
        }
        MemsimReplayOptions ro = MEMSIM_REPLAY_OPTIONS_INIT;
        ro.threads = 1;
        MemsimReport *rep = replay_case(t, &ro, i);
        const int64_t peak = largest_peak(rep, FALSE);
        for (guint k = 0; k < rep->n_ranks; k++) {
            /* rank by rank: those whose units repeat too */
            const int64_t pk = rep->ranks[k].stats.requested.peak;
            cr_expect(plan_rank_requested_over(t, k, pk - 1) && !plan_rank_requested_over(t, k, pk),
                      "case %zu rank %u: the replay's requested peak %" G_GINT64_FORMAT
                      " is not where the events pass the limit", i, k, pk);
        }
        memsim_report_free(rep);
        memsim_trace_free(t);
        cr_log_info("%s pp%d %s m0 %d: requested peak %" G_GINT64_FORMAT "%s", c->model, c->pp,
                    sched_name(c->sched), m0, peak, repeats ? " (units repeat)" : "");
        cr_expect(plan_short_run_over(&o.sw, &o.g, 0, peak - 1),
                  "case %zu: not over one byte below the replay's requested peak", i);
        cr_expect(!plan_short_run_over(&o.sw, &o.g, 0, peak),
                  "case %zu: over the replay's requested peak", i);
        if (i == 0)
            cr_expect(repeats, "case 0: no stage's steady phase repeats");
        one_clear(&o);
    }
}
