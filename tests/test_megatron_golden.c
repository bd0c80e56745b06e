/* Megatron-LM as its launches describe it: the model state per rank against Megatron's own
 * closed forms (megatron/training/theoretical_memory_usage.py) and an independent count of
 * what each pipeline stage holds, and the development set of real measurements
 * (../shared/data/megatron-golden: per-rank peaks Megatron logged on 8×H100). */
#include "testutil.h"

#include <criterion/criterion.h>
#include <json-glib/json-glib.h>
#include <memsim/estimate.h>
#include <memsim/megatron.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- the model state per rank ---- */

typedef struct {
    int tp, pp, dp;
    gboolean dist_opt, untie, swiglu, layernorm;
} Layout;

/* The launch: 8 layers, hidden 1024, 16 heads, no linear biases, RoPE (no position table),
 * GPT-2's tokenizer (50257 entries, padded to a multiple of 128 × TP). */
static char *launch(const Layout *l)
{
    return g_strdup_printf(
        "torchrun --nproc-per-node %d pretrain_gpt.py --num-layers 8 --hidden-size 1024 "
        "--num-attention-heads 16 --seq-length 512 --max-position-embeddings 512 "
        "--micro-batch-size 1 --global-batch-size %d --bf16 --disable-bias-linear "
        "--position-embedding-type rope --normalization %s --tensor-model-parallel-size %d "
        "--pipeline-model-parallel-size %d%s%s%s",
        l->tp * l->pp * l->dp, l->dp * l->pp, l->layernorm ? "LayerNorm" : "RMSNorm", l->tp,
        l->pp, l->dist_opt ? " --use-distributed-optimizer" : "",
        l->untie ? " --untie-embeddings-and-output-weights" : "", l->swiglu ? " --swiglu" : "");
}

/* Parameters on pipeline stage r, counted from Megatron's modules: per layer the fused QKV
 * (3h²/tp), the projection (h²/tp), fc1 (F h/tp, twice with SwiGLU) and fc2 (F h/tp), two norms
 * (h, 2h with LayerNorm's bias), replicated; the word embedding (V h/tp) on the first stage;
 * the final norm and the output layer (its own weight, or the tied copy when pp > 1) on the
 * last. */
static int64_t stage_params(const Layout *l, int r)
{
    int64_t h = 1024, F = 4 * h, L = 8, tp = l->tp;
    if (l->swiglu)
        F = (int64_t)((double)(4 * h) * 2 / 3 / 64) * 64; /* arguments.py: int(8h/3/64)·64 */
    int64_t mult = 128 * tp, V = (50257 + mult - 1) / mult * mult;
    int64_t norm = l->layernorm ? 2 * h : h;
    int64_t layer = (4 * h * h + (l->swiglu ? 3 : 2) * F * h) / tp + 2 * norm;
    int64_t n = layer * (L / l->pp);
    if (r == 0)
        n += V * h / tp;
    if (r == l->pp - 1) {
        n += norm;
        if (l->untie || l->pp > 1)
            n += V * h / tp;
    }
    return n;
}

/* Megatron's estimate of the most loaded rank's weights and optimizer state (bytes;
 * theoretical_memory_usage.py compute_weight_and_optimizer_memory): per layer
 * self_attn 2h²((1 + ng/np)(kv_channels·np/h)) + dense MLP 2hF(3/2 with SwiGLU), sharded
 * over TP and PP with the embedding; layer norms 2h·norm_size per layer and the final one
 * replicated; ×18 bytes, or 6 + 12/DP with the distributed optimizer. */
static double megatron_formula(const Layout *l)
{
    double h = 1024, L = 8, V, F = 4 * h;
    if (l->swiglu)
        F = (double)((int64_t)(4 * 1024 * 2 / 3 / 64) * 64);
    int64_t mult = 128 * l->tp;
    V = (double)((50257 + mult - 1) / mult * mult);
    double norm_size = l->layernorm ? 2 : 1;
    double attn = 2 * h * h * ((1 + 16.0 / 16.0) * (64 * 16 / h));
    double mlp = 2 * h * F * (l->swiglu ? 1.5 : 1);
    double sharded = ((attn + mlp) * L / l->pp + h * V) / l->tp;
    if (l->untie && l->pp == 1)
        sharded += h * V / l->tp;
    double replicated = (2 * h * norm_size * L + norm_size * h) / l->pp;
    double bytes = l->dist_opt ? 6 + 12.0 / l->dp : 18;
    return (sharded + replicated) * bytes;
}

/* The model state at the optimizer step of each stage: parameters, gradients, optimizer
 * state, in the bytes the program asked for (the allocator's rounding left out). */
static void model_state(const Layout *l, int64_t *out, int n_out)
{
    g_autofree char *text = launch(l);
    GError *error = NULL;
    MemsimMegatron *mg = memsim_megatron_parse(text, "layout", &error);
    cr_assert(mg, "%s: %s", text, error ? error->message : "");
    MemsimRun run = memsim_run_defaults();
    memsim_megatron_apply(mg, &run);
    MemsimEstimateOptions eo = MEMSIM_ESTIMATE_OPTIONS_INIT;
    MemsimReport *rep = memsim_estimate(memsim_megatron_model(mg), &run, &eo, &error);
    cr_assert(rep, "%s: %s", text, error ? error->message : "");
    cr_assert_eq((int)rep->n_ranks, l->pp, "one rank report per pipeline stage");
    for (int r = 0; r < n_out && r < (int)rep->n_ranks; r++) {
        const MemsimRankReport *rr = &rep->ranks[r];
        out[r] = -1;
        for (guint k = 0; k < rr->n_breakdowns; k++)
            if (strcmp(rr->breakdowns[k].name, MEMSIM_BREAKDOWN_MODEL_STATE) == 0)
                out[r] = rr->breakdowns[k].requested[MEMSIM_CAT_PARAMETER] +
                         rr->breakdowns[k].requested[MEMSIM_CAT_GRADIENT] +
                         rr->breakdowns[k].requested[MEMSIM_CAT_OPTIMIZER_STATE];
        cr_assert(out[r] >= 0, "no model-state breakdown on stage %d", r);
    }
    memsim_report_free(rep);
    memsim_run_clear(&run);
    memsim_megatron_free(mg);
}

Test(megatron_state, every_layout_holds_the_closed_forms)
{
    static const int tps[] = {1, 2, 4, 8}, pps[] = {1, 2, 4}, dps[] = {1, 2, 4};
    int checked = 0, formula = 0;
    for (int variant = 0; variant < 4; variant++)
        for (guint a = 0; a < G_N_ELEMENTS(tps); a++)
            for (guint b = 0; b < G_N_ELEMENTS(pps); b++)
                for (guint c = 0; c < G_N_ELEMENTS(dps); c++)
                    for (int d = 0; d < 2; d++) {
                        Layout l = {tps[a], pps[b], dps[c], d, variant & 1, variant == 2,
                                    variant == 3};
                        if (l.tp * l.pp * l.dp > 32 && variant)
                            continue; /* the large worlds once, with the default shape */
                        int64_t got[4];
                        model_state(&l, got, l.pp);
                        for (int r = 0; r < l.pp; r++) {
                            int64_t n = stage_params(&l, r);
                            /* no padding: every tensor is a multiple of 128 elements */
                            double want = l.dist_opt ? 6.0 * n + 12.0 * n / l.dp : 18.0 * n;
                            cr_expect_eq(got[r], (int64_t)want,
                                         "tp %d pp %d dp %d%s%s%s%s stage %d: %" G_GINT64_FORMAT
                                         " bytes of model state, want %.0f",
                                         l.tp, l.pp, l.dp, l.dist_opt ? " dist-opt" : "",
                                         l.untie ? " untied" : "", l.swiglu ? " swiglu" : "",
                                         l.layernorm ? " layernorm" : "", r, got[r], want);
                            checked++;
                        }
                        if (l.pp == 1) {
                            /* Megatron's formula is exact without a pipeline (it divides the
                             * final norm by pp) */
                            cr_expect_eq(got[0], (int64_t)megatron_formula(&l),
                                         "tp %d dp %d%s: %" G_GINT64_FORMAT
                                         " bytes against theoretical_memory_usage's %.0f",
                                         l.tp, l.dp, l.dist_opt ? " dist-opt" : "", got[0],
                                         megatron_formula(&l));
                            formula++;
                        }
                    }
    cr_log_info("%d stages against the count, %d layouts against Megatron's formula", checked,
                formula);
    cr_assert_gt(formula, 20);
}

/* ---- the development set ---- */

Test(megatron_golden, logged_rank_peaks_within_5_percent)
{
    g_autofree char *cases = tu_shared_path_or_skip("megatron-golden/cases.jsonl");
    const char *bench = g_getenv("MEMSIM_BENCH");
    cr_assert(bench, "MEMSIM_BENCH not set (run the tests through meson test)");
    const char *argv[] = {bench, "megatron", cases, "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run(argv, NULL, &out, &err);
    cr_assert_eq(rc, 0, "memsim-bench megatron: exit %d\n%s", rc, err);
    JsonParser *p = json_parser_new();
    cr_assert(json_parser_load_from_data(p, out, -1, NULL), "not JSON:\n%s", out);
    JsonObject *root = json_node_get_object(json_parser_get_root(p));
    JsonArray *arr = json_object_get_array_member(root, "cases");
    int n = (int)json_array_get_length(arr), refused = 0;
    cr_assert_gt(n, 0);
    fprintf(stderr, "%-74s %9s %9s %7s %9s %9s %7s\n", "case", "meas s1", "est s1", "err",
            "meas last", "est last", "err");
    for (int i = 0; i < n; i++) {
        JsonObject *c = json_array_get_object_element(arr, (guint)i);
        const char *name = json_object_get_string_member(c, "name");
        if (!json_object_get_boolean_member(c, "supported")) {
            const char *why = json_object_get_string_member(c, "reason");
            fprintf(stderr, "%-74.74s refused: %s\n", name, why);
            cr_expect(strstr(why, "not modelled") != NULL,
                      "%s: refused without naming a missing feature: %s", name, why);
            refused++;
            continue;
        }
        double e1 = json_object_get_double_member(c, "error_step1_pct");
        double el = json_object_get_double_member(c, "error_last_pct");
        fprintf(stderr, "%-74.74s %8.3fG %8.3fG %+6.2f%% %8.3fG %8.3fG %+6.2f%%\n", name,
                json_object_get_double_member(c, "measured_step1") / 1073741824.0,
                json_object_get_double_member(c, "estimated_step1") / 1073741824.0, e1,
                json_object_get_double_member(c, "measured_last") / 1073741824.0,
                json_object_get_double_member(c, "estimated_last") / 1073741824.0, el);
        cr_expect(fabs(e1) <= 5.0, "%s: step 1 off by %+.2f%%", name, e1);
        cr_expect(fabs(el) <= 5.0, "%s: last step off by %+.2f%%", name, el);
    }
    double mae = json_object_get_double_member(root, "mean_abs_error_last_pct");
    fprintf(stderr, "%d cases, %d refused; mean |error| %.2f%% (last step), %.2f%% (step 1)\n",
            n, refused, mae, json_object_get_double_member(root, "mean_abs_error_step1_pct"));
    cr_expect(mae <= 3.0, "mean absolute error %.2f%% over the cases memsim expresses", mae);
    cr_expect(refused * 10 <= n, "%d of %d cases refused (at most 10%%)", refused, n);
    g_object_unref(p);
}
