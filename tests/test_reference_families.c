/* The Llama-derived families against real PyTorch: training steps of small Qwen2, Gemma-2,
 * Phi-3, OLMo (with clip_qkv), Mixtral (experts one by one, uniform and under
 * --moe-imbalance's routing) and DeepSeek-V2-style (multi-head latent attention + mixture of
 * experts) models (tests/reference/hf_families.py, written after the Transformers modeling files)
 * are recorded at test time with Debian's python3-torch (1.13, CPU, fp32, eager attention, for-loop
 * AdamW, two steps each; tests/reference/record_families.py). The generator's trace for the same
 * config and run (--torch-version 1.13, CPU kernels), replayed through `exact`, must match
 * the recording replayed through `exact`: each step's peak allocated within 1%, each phase's
 * (forward, backward, optimizer) within 2%. */
#include <criterion/criterion.h>
#include <json-glib/json-glib.h>
#include <memsim/formats.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <math.h>
#include <string.h>

#include "testutil.h"

#define STEP_BOUND 0.01
#define PHASE_BOUND 0.02

static char *record_all(void)
{
    return tu_record_reference("record_families.py");
}

/* The number of comparisons off by more than the bounds (each reported). */
static int compare_case(const char *dir, const char *json_path, double *worst)
{
    GError *error = NULL;
    g_autoptr(JsonParser) p = json_parser_new();
    cr_assert(json_parser_load_from_file(p, json_path, &error), "%s", json_path);
    JsonObject *c = json_node_get_object(json_parser_get_root(p));
    const char *name = json_object_get_string_member(c, "case");
    MemsimRun run = memsim_run_defaults();
    MemsimModel *m = tu_case_load(c, dir, &run);
    tu_set(&run, "precision", "fp32");
    tu_set(&run, "optimizer", "adamw");
    tu_set(&run, "optimizer-impl", "for-loop");
    tu_set(&run, "zero-grad", "none");
    tu_set(&run, "attention", "eager");
    tu_set(&run, "torch-version", "1.13");
    tu_set(&run, "device", "cpu");
    /* mixtral_imbN_*: recorded with the routing --moe-imbalance N assumes */
    const char *imb = strstr(name, "_imb");
    if (imb) {
        char f[8] = "";
        g_strlcpy(f, imb + 4, MIN(sizeof f, strcspn(imb + 4, "_") + 1));
        tu_set(&run, "moe-imbalance", f);
    }
    MemsimTrace *t = memsim_generate(m, &run, &error);
    cr_assert(t, "%s: %s", name, error ? error->message : "?");
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.allocator = "exact";
    MemsimReport *ours = memsim_replay_trace(t, &o, &error);
    cr_assert(ours, "%s: %s", name, error ? error->message : "?");
    g_autofree char *trace = g_build_filename(dir, json_object_get_string_member(c, "trace"), NULL);
    MemsimReport *real = memsim_replay_path(trace, &o, &error);
    cr_assert(real, "%s: %s", name, error ? error->message : "?");
    const MemsimRankReport *a = &ours->ranks[0], *b = &real->ranks[0];
    int off = 0;
    for (uint32_t s = 1; s <= (uint32_t)run.steps; s++) {
        const MemsimStepPeaks *sa = tu_step_of(a, s), *sb = tu_step_of(b, s);
        cr_assert(sa && sb, "%s: step %u missing", name, s);
        double e = ((double)sa->peak_allocated - (double)sb->peak_allocated) /
                   (double)sb->peak_allocated;
        *worst = fmax(*worst, fabs(e));
        if (fabs(e) > STEP_BOUND) {
            off++;
            cr_expect_fail("%s step %u: generated %" G_GINT64_FORMAT ", recorded %" G_GINT64_FORMAT
                           " (%+.2f%%)",
                           name, s, sa->peak_allocated, sb->peak_allocated, 100 * e);
        }
        cr_log_info("%s step %u: %+.3f%%", name, s, 100 * e);
        for (int ph = MEMSIM_PHASE_FORWARD; ph <= MEMSIM_PHASE_OPTIMIZER; ph++) {
            double pe = ((double)sa->phase_peak_allocated[ph] -
                         (double)sb->phase_peak_allocated[ph]) /
                        (double)sb->phase_peak_allocated[ph];
            if (fabs(pe) > PHASE_BOUND) {
                off++;
                cr_expect_fail("%s step %u %s: generated %" G_GINT64_FORMAT
                               ", recorded %" G_GINT64_FORMAT " (%+.2f%%)",
                               name, s, memsim_phase_name(ph), sa->phase_peak_allocated[ph],
                               sb->phase_peak_allocated[ph], 100 * pe);
            }
            cr_log_info("%s step %u %s: %+.3f%%", name, s, memsim_phase_name(ph), 100 * pe);
        }
    }
    memsim_report_free(ours);
    memsim_report_free(real);
    memsim_trace_free(t);
    memsim_run_clear(&run);
    memsim_model_free(m);
    return off;
}

Test(reference_families, generator_matches_pytorch_1_13, .timeout = 600)
{
    g_autofree char *dir = record_all();
    GDir *d = g_dir_open(dir, 0, NULL);
    cr_assert(d);
    const char *f;
    int cases = 0;
    double worst = 0;
    const char *families[] = {"qwen2", "gemma2", "phi3", "olmo", "deepseek_v2", "mixtral"};
    gboolean seen[G_N_ELEMENTS(families)] = {FALSE};
    while ((f = g_dir_read_name(d))) {
        if (!g_str_has_suffix(f, ".json") || g_str_has_suffix(f, ".config.json"))
            continue;
        g_autofree char *path = g_build_filename(dir, f, NULL);
        compare_case(dir, path, &worst);
        cases++;
        for (gsize i = 0; i < G_N_ELEMENTS(families); i++)
            seen[i] |= g_str_has_prefix(f, families[i]) && f[strlen(families[i])] == '_';
    }
    g_dir_close(d);
    for (gsize i = 0; i < G_N_ELEMENTS(families); i++)
        cr_expect(seen[i], "no recorded %s case", families[i]);
    cr_expect_geq(cases, 14, "only %d recorded cases", cases);
    cr_log_info("%d cases, worst step peak %.3f%%", cases, 100 * worst);
}
