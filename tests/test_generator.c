/* The generator: presets against published parameter counts, the model-state bytes those
 * counts imply, run settings, and bad configs. */
#include <criterion/criterion.h>
#include <memsim/formats.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <math.h>
#include <string.h>

#include "testutil.h"

/* Parameter counts as published for each checkpoint (Hugging Face model cards and
 * repository metadata; the Llama 2 / Mixtral / GPT-2 figures are also those quoted in
 * HF_MODELS.md). Tied embeddings count once. */
static const struct {
    const char *preset;
    int64_t params;
} published[] = {
    {"bloom-560m", 559214592},      {"bloom-1b7", 1722408960},
    {"bloom-7b1", 7069016064},      {"falcon-7b", 6921720704},
    {"falcon-40b", 41303293952},    {"gpt-neo-125m", 125198592},
    {"gpt-neo-1.3b", 1315575808},   {"gpt-neo-2.7b", 2651307520},
    {"gpt-neox-20b", 20554567680},  {"gpt2", 124439808},
    {"gpt2-medium", 354823168},     {"gpt2-large", 774030080},
    {"gpt2-xl", 1557611200},        {"llama-7b", 6738415616},
    {"llama-2-7b", 6738415616},     {"llama-2-13b", 13015864320},
    {"llama-2-70b", 68976648192},   {"llama-3-8b", 8030261248},
    {"llama-3-70b", 70553706496},   {"mistral-7b", 7241732096},
    {"mixtral-8x7b", 46702792704},  {"opt-125m", 125239296},
    {"opt-350m", 331196416},        {"opt-1.3b", 1315758080},
    {"opt-2.7b", 2651596800},       {"opt-6.7b", 6658473984},
    {"opt-13b", 12853473280},       {"pythia-410m", 405334016},
    {"pythia-1.4b", 1414647808},    {"pythia-6.9b", 6857302016},
    {"qwen2-7b", 7615616512},
    /* model.safetensors.index.json "total_size" / 2 (bf16 checkpoints): Llama 3.1 8B
     * 16060522496, Llama 3.1 / 3.3 70B 141107412992, Llama 3.1 405B 811706777600, Qwen2.5-7B
     * 15231233024 */
    {"llama-3.1-8b", 8030261248},   {"llama-3.1-70b", 70553706496},
    {"llama-3.3-70b", 70553706496}, {"llama-3.1-405b", 405853388800},
    {"qwen2.5-7b", 7615616512},
    /* OLMo 1 (allenai/OLMo-1B-hf, allenai/OLMo-7B-hf; fp32 checkpoints): the HF pages'
     * safetensors counts 1.18B and 6.89B, and to the unit the sum of the released tensors'
     * sizes as public code that loads them records it (sum(p.numel()) of OLMo-1B 1176764416
     * with its tied embedding; total_params 6888095744 of the OLMo-7B shapes) */
    {"olmo-1b", 1176764416},        {"olmo-7b", 6888095744},
    /* Qwen2-VL, the text model only (the presets are the released configs, whose vision
     * tower memsim does not count): Qwen2-VL-7B-Instruct's index total_size 16582751232 / 2
     * = 8291375616 less its vision tower, 675759104 (Qwen2VisionTransformerPretrainedModel of
     * vision_config: patch_embed Conv3d 3·2·14·14·1280, 32 blocks of 19677440 — two
     * LayerNorms, qkv 1280·3840 + 3840, proj 1280² + 1280, fc1 1280·5120 + 5120, fc2 5120·1280
     * + 1280 — and the merger: ln_q 2·1280, 5120² + 5120, 5120·3584 + 3584; the paper's
     * "675M" ViT); Qwen2-VL-2B-Instruct's count of its checkpoint's tensors, 2208985600 (as
     * public evaluation code lists it beside the 7B's 8291375616), less 665271296 (the
     * merger's last linear 5120·1536 + 1536) */
    {"qwen2-vl-7b", 7615616512},    {"qwen2-vl-2b", 1543714304},
};

/* Counts published to a stated number of digits: the model card's figure (or the Hugging
 * Face page's safetensors count, where the card gives none), `digit` the unit of its last
 * digit. Cards round (Qwen3-8B: 8.19B is "8.2B") or cut (Qwen3-30B-A3B: 3.35B activated is
 * "3.3B"), so a count agrees when it rounds or cuts to the figure: within
 * [figure - digit/2, figure + digit). `active` likewise for a mixture of experts (0: not
 * stated). Gemma 2's technical report states its non-embedding counts exactly (embedding
 * here: the 256000-row table of the released checkpoints). */
static const struct {
    const char *preset;
    double params, digit, active, active_digit;
    bool active_without_embedding; /* DeepSeek's cards count the activated parameters
                                    * without the input embedding */
    const char *source;
} published_digits[] = {
    {"llama-3.2-1b", 1.23e9, 0.01e9, 0, 0, false, "HF page: 1.23B params (safetensors)"},
    {"llama-3.2-3b", 3.21e9, 0.01e9, 0, 0, false, "HF page: 3.21B params (safetensors)"},
    {"qwen2.5-0.5b", 0.49e9, 0.01e9, 0, 0, false, "Qwen2.5-0.5B card: 0.49B"},
    {"qwen2.5-14b", 14.7e9, 0.1e9, 0, 0, false, "Qwen2.5-14B card: 14.7B"},
    {"qwen2.5-72b", 72.7e9, 0.1e9, 0, 0, false, "Qwen2.5-72B card: 72.7B"},
    {"qwen3-0.6b", 0.6e9, 0.1e9, 0, 0, false, "Qwen3-0.6B card: 0.6B"},
    {"qwen3-8b", 8.2e9, 0.1e9, 0, 0, false, "Qwen3-8B card: 8.2B"},
    {"qwen3-32b", 32.8e9, 0.1e9, 0, 0, false, "Qwen3-32B card: 32.8B"},
    {"qwen3-30b-a3b", 30.5e9, 0.1e9, 3.3e9, 0.1e9, false,
     "Qwen3-30B-A3B card: 30.5B total, 3.3B activated"},
    {"qwen3-235b-a22b", 235e9, 1e9, 22e9, 1e9, false,
     "Qwen3-235B-A22B card: 235B total, 22B activated"},
    {"qwen1.5-moe-a2.7b", 14.3e9, 0.1e9, 2.7e9, 0.1e9, false,
     "Qwen1.5-MoE-A2.7B card: 14.3B total, 2.7B activated"},
    {"mistral-nemo-12b", 12.2e9, 0.1e9, 0, 0, false, "HF page: 12.2B params (safetensors)"},
    {"gemma-2b", 2.51e9, 0.01e9, 0, 0, false, "HF page: 2.51B params (safetensors)"},
    {"gemma-7b", 8.54e9, 0.01e9, 0, 0, false, "HF page: 8.54B params (safetensors)"},
    {"gemma-2-2b", 2614341888, 1, 0, 0, false,
     "Gemma 2 report: 2,024,517,888 non-embedding + 256000 x 2304 embedding"},
    {"gemma-2-9b", 9241705984, 1, 0, 0, false,
     "Gemma 2 report: 8,324,201,984 non-embedding + 256000 x 3584 embedding"},
    {"gemma-2-27b", 27227128320, 1, 0, 0, false,
     "Gemma 2 report: 26,047,480,320 non-embedding + 256000 x 4608 embedding"},
    {"gemma-3-1b", 1.0e9, 0.1e9, 0, 0, false, "HF page: 1B params (safetensors)"},
    {"phi-3-mini-4k", 3.8e9, 0.1e9, 0, 0, false, "Phi-3-mini-4k card: 3.8B"},
    {"phi-3-medium-4k", 14e9, 1e9, 0, 0, false, "Phi-3-medium-4k card: 14B"},
    {"phi-4", 14.7e9, 0.1e9, 0, 0, false, "HF page: 14.7B params (safetensors)"},
    {"starcoder2-3b", 3.03e9, 0.01e9, 0, 0, false, "HF page: 3.03B params (safetensors)"},
    {"starcoder2-7b", 7.17e9, 0.01e9, 0, 0, false,
     "HF page: 7.17B params (safetensors; the head tied to the embedding)"},
    {"starcoder2-15b", 16e9, 1e9, 0, 0, false,
     "HF page: 16B params (safetensors; an untied head)"},
    /* Gemma 3 4B/12B/27B, the text model only (the released checkpoints are
     * Gemma3ForConditionalGeneration; their presets are its text_config): the technical
     * report's non-embedding counts, to the million, plus the embedding of the released
     * vocabulary, 262208 rows (text_config.vocab_size), tied */
    {"gemma-3-4b", 3209e6 + 262208.0 * 2560, 1e6, 0, 0, false,
     "Gemma 3 report: 3,209M non-embedding + 262208 x 2560 embedding"},
    {"gemma-3-12b", 10759e6 + 262208.0 * 3840, 1e6, 0, 0, false,
     "Gemma 3 report: 10,759M non-embedding + 262208 x 3840 embedding"},
    {"gemma-3-27b", 25600e6 + 262208.0 * 5376, 1e6, 0, 0, false,
     "Gemma 3 report: 25,600M non-embedding + 262208 x 5376 embedding"},
    {"olmo-2-7b", 7.3e9, 0.1e9, 0, 0, false, "HF page: 7.3B params (safetensors)"},
    {"olmo-2-13b", 13.7e9, 0.1e9, 0, 0, false, "HF page: 13.7B params (safetensors)"},
    {"deepseek-v2-lite", 15.7e9, 0.1e9, 2.4e9, 0.1e9, true,
     "DeepSeek-V2-Lite card: 15.7B total, 2.4B activated"},
    {"deepseek-v2", 236e9, 1e9, 21e9, 1e9, true,
     "DeepSeek-V2 card: 236B total, 21B activated"},
    {"deepseek-v3", 671e9, 1e9, 37e9, 1e9, true,
     "DeepSeek-V3 card: 671B total (685B with the multi-token prediction module, which "
     "DeepseekV3ForCausalLM does not build), 37B activated"},
};

/* CodeGen has no exact published count; its checkpoints are fp16 files of 5.69 GB (2B) and
 * 14.3 GB (6B) that also hold one 2048×2048 bool mask buffer per layer, and the 350M one is
 * named for its size. The counts must agree with those files within their rounding. */
static const struct {
    const char *preset;
    double file_bytes, buffer_bytes, tolerance;
} approx[] = {
    {"codegen-2b", 5.69e9, 32 * 4194304.0, 0.01},
    {"codegen-6b", 14.3e9, 33 * 4194304.0, 0.01},
};

static bool agrees(int64_t got, double figure, double digit)
{
    return (double)got >= figure - digit / 2 && (double)got < figure + digit;
}

Test(generator, presets_match_published_counts)
{
    g_auto(GStrv) names = memsim_model_presets();
    int checked = 0;
    for (char **n = names; *n; n++) {
        GError *error = NULL;
        MemsimModel *m = memsim_model_load(*n, &error);
        cr_assert(m, "%s: %s", *n, error ? error->message : "?");
        int64_t got = memsim_model_n_params(m);
        gboolean known = FALSE;
        for (gsize i = 0; i < G_N_ELEMENTS(published); i++)
            if (strcmp(published[i].preset, *n) == 0) {
                cr_expect_eq(got, published[i].params, "%s: %" G_GINT64_FORMAT
                             " parameters, published %" G_GINT64_FORMAT,
                             *n, got, published[i].params);
                known = TRUE;
                checked++;
            }
        for (gsize i = 0; i < G_N_ELEMENTS(published_digits); i++)
            if (strcmp(published_digits[i].preset, *n) == 0) {
                MemsimModelCounts k;
                memsim_model_counts(m, &k);
                cr_expect_eq(k.params, got);
                cr_expect(agrees(got, published_digits[i].params, published_digits[i].digit),
                          "%s: %" G_GINT64_FORMAT " parameters; %s", *n, got,
                          published_digits[i].source);
                if (published_digits[i].active > 0) {
                    int64_t a = k.active - (published_digits[i].active_without_embedding
                                                ? k.embedding
                                                : 0);
                    cr_expect(agrees(a, published_digits[i].active,
                                     published_digits[i].active_digit),
                              "%s: %" G_GINT64_FORMAT " active parameters; %s", *n, a,
                              published_digits[i].source);
                } else {
                    cr_expect_eq(k.active, got, "%s: a dense model uses all its parameters",
                                 *n);
                }
                known = TRUE;
                checked++;
            }
        for (gsize i = 0; i < G_N_ELEMENTS(approx); i++)
            if (strcmp(approx[i].preset, *n) == 0) {
                double want = (approx[i].file_bytes - approx[i].buffer_bytes) / 2.0;
                cr_expect(got > want * (1 - approx[i].tolerance) &&
                              got < want * (1 + approx[i].tolerance),
                          "%s: %" G_GINT64_FORMAT " parameters, the checkpoint implies %.0f", *n,
                          got, want);
                known = TRUE;
                checked++;
            }
        if (strcmp(*n, "codegen-350m") == 0) {
            cr_expect(got > 340e6 && got < 360e6, "codegen-350m: %" G_GINT64_FORMAT, got);
            known = TRUE;
            checked++;
        }
        cr_expect(known, "preset %s has no published parameter count in this test", *n);
        memsim_model_free(m);
    }
    cr_expect_eq(checked, (int)g_strv_length(names));
    /* every published count above names a preset that exists (an empty list checks nothing) */
    cr_expect_geq(checked, (int)G_N_ELEMENTS(published) + (int)G_N_ELEMENTS(approx) +
                               (int)G_N_ELEMENTS(published_digits));
}

static MemsimReport *estimate(const char *model, const char *const *settings, GError **error)
{
    MemsimModel *m = memsim_model_load(model, error);
    if (!m)
        return NULL;
    MemsimRun run = memsim_run_defaults();
    for (const char *const *s = settings; s && *s; s += 2) {
        gboolean ok = memsim_run_set(&run, s[0], s[1], error);
        cr_assert(ok, "%s=%s: %s", s[0], s[1], ok ? "" : (*error)->message);
    }
    MemsimTrace *t = memsim_generate(m, &run, error);
    MemsimReport *rep = NULL;
    if (t) {
        rep = memsim_replay_trace(t, NULL, error);
        memsim_trace_free(t);
    }
    memsim_run_clear(&run);
    memsim_model_free(m);
    return rep;
}

static const MemsimBreakdown *model_state(const MemsimRankReport *r)
{
    for (guint i = 0; i < r->n_breakdowns; i++)
        if (strstr(r->breakdowns[i].name, "model state"))
            return &r->breakdowns[i];
    return NULL;
}

/* Every preset at batch 1, seq 2048 (or the model's learned positions, if fewer),
 * bf16-mixed, AdamW, full fine-tuning: fp32 master parameters (4 bytes each), fp32
 * gradients (4) and two fp32 Adam moments (8) — exactly what the count implies. */
Test(generator, model_state_bytes_of_every_preset, .timeout = 240)
{
    g_auto(GStrv) names = memsim_model_presets();
    cr_assert_geq(g_strv_length(names), G_N_ELEMENTS(published), "only %u presets",
                  g_strv_length(names));
    for (char **n = names; *n; n++) {
        GError *error = NULL;
        MemsimModel *m = memsim_model_load(*n, &error);
        cr_assert(m);
        int64_t N = memsim_model_n_params(m);
        memsim_model_free(m);
        const char *seq = g_str_has_prefix(*n, "gpt2") ? "1024" : "2048";
        const char *settings[] = {"batch", "1", "seq", seq, "precision", "bf16-mixed",
                                  "optimizer", "adamw", "finetune", "full", NULL};
        MemsimReport *rep = estimate(*n, settings, &error);
        cr_assert(rep, "%s: %s", *n, error ? error->message : "?");
        const MemsimBreakdown *bd = model_state(&rep->ranks[0]);
        cr_assert(bd, "%s: no model-state breakdown", *n);
        cr_expect_eq(bd->requested[MEMSIM_CAT_PARAMETER], 4 * N, "%s parameters", *n);
        cr_expect_eq(bd->requested[MEMSIM_CAT_GRADIENT], 4 * N, "%s gradients", *n);
        cr_expect_eq(bd->requested[MEMSIM_CAT_OPTIMIZER_STATE], 8 * N, "%s optimizer state", *n);
        /* and the peak holds at least the model state */
        cr_expect_geq(rep->ranks[0].stats.allocated.peak, 16 * N, "%s peak", *n);
        memsim_report_free(rep);
    }
}

/* Other precisions and optimizers change the implied bytes as they should. */
Test(generator, model_state_follows_precision_and_optimizer)
{
    GError *error = NULL;
    MemsimModel *m = memsim_model_load("opt-125m", &error);
    int64_t N = memsim_model_n_params(m);
    memsim_model_free(m);
    struct {
        const char *prec, *opt;
        int64_t p, g, o;
    } cases[] = {
        {"bf16", "adamw", 2, 2, 4},          /* state in the parameter dtype */
        {"fp32", "sgd-momentum", 4, 4, 4},   /* one momentum buffer */
        {"fp32", "sgd", 4, 4, 0},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        const char *settings[] = {"precision", cases[i].prec, "optimizer", cases[i].opt,
                                  "seq", "256", NULL};
        MemsimReport *rep = estimate("opt-125m", settings, &error);
        cr_assert(rep, "%s", error ? error->message : "?");
        const MemsimBreakdown *bd = model_state(&rep->ranks[0]);
        cr_assert(bd);
        cr_expect_eq(bd->requested[MEMSIM_CAT_PARAMETER], cases[i].p * N, "%s/%s", cases[i].prec,
                     cases[i].opt);
        cr_expect_eq(bd->requested[MEMSIM_CAT_GRADIENT], cases[i].g * N);
        cr_expect_eq(bd->requested[MEMSIM_CAT_OPTIMIZER_STATE], cases[i].o * N);
        memsim_report_free(rep);
    }
}

/* Step 1 creates the optimizer state, so step 2's forward starts higher. */
Test(generator, step_two_is_the_steady_state)
{
    GError *error = NULL;
    const char *settings[] = {"seq", "512", NULL};
    MemsimReport *rep = estimate("gpt2", settings, &error);
    cr_assert(rep, "%s", error ? error->message : "?");
    const MemsimRankReport *r = &rep->ranks[0];
    cr_assert_eq(r->n_steps, 2);
    cr_expect_gt(r->steps[1].phase_peak_allocated[MEMSIM_PHASE_FORWARD],
                 r->steps[0].phase_peak_allocated[MEMSIM_PHASE_FORWARD]);
    cr_expect(r->peak_op_name[0] != '\0', "the op at the peak is named");
    memsim_report_free(rep);
}

Test(generator, lora_and_checkpointing_lower_the_peak)
{
    GError *error = NULL;
    const char *full[] = {"seq", "1024", "batch", "2", NULL};
    const char *lora[] = {"seq", "1024", "batch", "2", "finetune", "lora", "lora-rank", "8", NULL};
    const char *ckpt[] = {"seq", "1024", "batch", "2", "checkpointing", "full", NULL};
    MemsimReport *a = estimate("opt-350m", full, &error);
    MemsimReport *b = estimate("opt-350m", lora, &error);
    MemsimReport *c = estimate("opt-350m", ckpt, &error);
    cr_assert(a && b && c, "%s", error ? error->message : "?");
    cr_expect_lt(b->ranks[0].stats.allocated.peak, a->ranks[0].stats.allocated.peak);
    cr_expect_lt(c->ranks[0].stats.allocated.peak, a->ranks[0].stats.allocated.peak);
    memsim_report_free(a);
    memsim_report_free(b);
    memsim_report_free(c);
}

static void expect_bad_config(const char *json, const char *field)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *path = g_build_filename(dir, "config.json", NULL);
    cr_assert(g_file_set_contents(path, json, -1, NULL));
    const char *argv[] = {"estimate", "--model", path, NULL};
    g_autofree char *err = NULL;
    int rc = tu_run_memsim(argv, NULL, &err);
    cr_expect_eq(rc, 2, "%s: exit %d (%s)", json, rc, err);
    cr_expect(strstr(err, field) != NULL, "the message names '%s': %s", field, err);
}

Test(generator, bad_configs_name_the_field)
{
    expect_bad_config("{\"model_type\": \"llama\", \"hidden_size\": 100, \"num_attention_heads\": 7}",
                      "num_attention_heads");
    expect_bad_config("{\"model_type\": \"llama\", \"num_attention_heads\": 32, "
                      "\"num_key_value_heads\": 5}",
                      "num_key_value_heads");
    expect_bad_config("{\"model_type\": \"transformer-xl\"}", "model_type");
    expect_bad_config("{\"model_type\": \"gpt2\", \"n_embd\": -768}", "hidden_size");
    expect_bad_config("{\"model_type\": \"opt\", \"num_hidden_layers\": \"twelve\"}",
                      "num_hidden_layers");
    expect_bad_config("[1, 2, 3]", "config.json");
    expect_bad_config("{\"model_type\": ", "config.json");
    /* a LoRA target that does not exist */
    const char *argv[] = {"estimate", "--model", "llama-2-7b", "--finetune", "lora",
                          "--lora-targets", "c_attn", NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(tu_run_memsim(argv, NULL, &err), 2);
    cr_expect(strstr(err, "lora-targets") && strstr(err, "c_attn"), "%s", err);
    /* a sequence longer than the learned positions */
    const char *argv2[] = {"estimate", "--model", "gpt2", "--seq", "2048", NULL};
    g_autofree char *err2 = NULL;
    cr_expect_eq(tu_run_memsim(argv2, NULL, &err2), 2);
    cr_expect(strstr(err2, "max_position_embeddings"), "%s", err2);
    const char *argv3[] = {"estimate", "--model", "gpt2", "--precision", "fp8", NULL};
    g_autofree char *err3 = NULL;
    cr_expect_eq(tu_run_memsim(argv3, NULL, &err3), 2);
    cr_expect(strstr(err3, "precision"), "%s", err3);
}

/* The JSON of estimate extends the replay JSON. */
Test(generator, estimate_json_shape)
{
    const char *argv[] = {"estimate", "--model", "opt-125m", "--seq", "256", "--gpu-mem", "8GiB",
                          "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    cr_assert_eq(tu_run_memsim(argv, &out, &err), 0, "%s", err);
    const char *keys[] = {"\"ranks\"", "\"peak_allocated\"", "\"peak_reserved\"", "\"steps\"",
                          "\"at_peak\"", "\"by_category\"", "\"fits\" : true", "\"device_total\""};
    for (gsize i = 0; i < G_N_ELEMENTS(keys); i++)
        cr_expect(strstr(out, keys[i]), "missing %s", keys[i]);
    const char *small[] = {"estimate", "--model", "opt-1.3b", "--gpu-mem", "4GiB", NULL};
    g_autofree char *out2 = NULL;
    cr_expect_eq(tu_run_memsim(small, &out2, NULL), 1, "does not fit: exit 1");
    cr_expect(strstr(out2, "DOES NOT FIT") || strstr(out2, "OUT OF MEMORY"), "%s", out2);
}

/* The same run gives the same trace, event for event (nothing depends on where objects sit
 * in host memory). */
Test(generator, deterministic)
{
    g_autofree char *dir = tu_tmpdir();
    char *texts[2];
    for (int i = 0; i < 2; i++) {
        GError *error = NULL;
        MemsimModel *m = memsim_model_load("llama-2-7b", &error);
        MemsimRun run = memsim_run_defaults();
        memsim_run_set(&run, "seq", "128", &error);
        memsim_run_set(&run, "gpus", "4", &error);
        memsim_run_set(&run, "method", "fsdp", &error);
        MemsimTrace *t = memsim_generate(m, &run, &error);
        cr_assert(t, "%s", error ? error->message : "?");
        g_autofree char *path = g_strdup_printf("%s/t%d.txt", dir, i);
        cr_assert(memsim_trace_save(t, path, MEMSIM_FORMAT_TEXT, &error));
        cr_assert(g_file_get_contents(path, &texts[i], NULL, NULL));
        memsim_trace_free(t);
        memsim_run_clear(&run);
        memsim_model_free(m);
    }
    cr_expect(strcmp(texts[0], texts[1]) == 0, "two generations differ");
    g_free(texts[0]);
    g_free(texts[1]);
}

/* Op durations: every op that allocates (but "empty") or is a GEMM carries a duration, so
 * the replay's streams advance. One step of Llama-2-7B on the default A100-80GB does
 * 6 · Ψm · tokens GEMM FLOPs, Ψm the matrix parameters (7 projections of the 32 layers and
 * the head: 32 · (4·4096² + 3·4096·11008) + 32000·4096); against NVIDIA's published bf16
 * tensor-core peak of the A100 (312 TFLOP/s) the step's model FLOPs utilisation must fall in
 * the range published for LLM training on A100s: 30% to 60% (Llama 2, Touvron et al. 2023,
 * Table 2: 184,320 GPU-hours for 2T tokens of the 7B model, 39%; PaLM, Chowdhery et al. 2022,
 * Table 3: 46.2%; Megatron-LM, Narayanan et al. 2021: 52% for GPT-3 175B). */
Test(generator, op_durations_and_step_time, .timeout = 120)
{
    GError *error = NULL;
    MemsimModel *m = memsim_model_load("llama-2-7b", &error);
    MemsimRun run = memsim_run_defaults();
    cr_assert(memsim_run_set(&run, "seq", "1024", &error));
    cr_assert(memsim_run_set(&run, "batch", "4", &error));
    MemsimTrace *t = memsim_generate(m, &run, &error);
    cr_assert(t, "%s", error ? error->message : "?");
    MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    int64_t op = -1, untimed = 0, timed = 0;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind == MEMSIM_EV_OP) {
            op = (int64_t)ev[i].id;
        } else if (ev[i].kind == MEMSIM_EV_ALLOC && op >= 0) {
            const MemsimOpInfo *o = &h->ops[op];
            if (strcmp(h->strings[o->name], "empty") != 0) {
                if (o->duration_us > 0)
                    timed++;
                else
                    untimed++;
            }
            op = -1;
        }
    }
    cr_expect_gt(timed, 1000);
    cr_expect_eq(untimed, 0, "%" G_GINT64_FORMAT " allocating ops without a duration", untimed);
    MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
    cr_assert(rep);
    const MemsimRankReport *r = &rep->ranks[0];
    cr_assert_eq(r->n_steps, 2);
    double step_s = (r->time_us - r->steps[1].start_us) / 1e6;
    double psi_m = 32.0 * (4.0 * 4096 * 4096 + 3.0 * 4096 * 11008) + 32000.0 * 4096;
    double mfu = 6.0 * psi_m * 4 * 1024 / step_s / 312e12;
    cr_expect(mfu >= 0.30 && mfu <= 0.60, "step %.3f s: %.1f%% of the A100's peak", step_s,
              100 * mfu);
    memsim_report_free(rep);
    memsim_trace_free(t);
    memsim_run_clear(&run);
    memsim_model_free(m);
}
