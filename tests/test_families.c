/* The Llama-derived families read from config.json (traces/config.c read_modern,
 * traces/families.c): refusal of unknown model types and architectures with the known list,
 * the warning for a rope type memsim does not know, the model in the JSON of estimate, gen,
 * plan and models, each family's forward generated and its parameters in the model state,
 * and the combinations refused. Parameter counts against published figures are in
 * test_generator (presets_match_published_counts); peaks against PyTorch recordings in
 * test_reference_families. */
#include <criterion/criterion.h>
#include <json-glib/json-glib.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <string.h>

#include "testutil.h"

static char *write_config(const char *text)
{
    static char *dir;
    static int n;
    if (!dir)
        dir = tu_tmpdir();
    char *path = g_strdup_printf("%s/config%d.json", dir, n++);
    cr_assert(g_file_set_contents(path, text, -1, NULL));
    return path;
}

static int run(const char *const *argv, char **out, char **err)
{
    return tu_run_memsim(argv, out, err);
}

#define SMALL                                                                                  \
    "\"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128, "                \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2"

Test(families, unknown_model_type_and_architecture_refused_with_the_known_list)
{
    g_autofree char *a = write_config("{\"model_type\": \"mamba2\", " SMALL "}");
    const char *argv[] = {"estimate", "--model", a, "--seq", "64", NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(run(argv, NULL, &err), 2, "%s", err);
    cr_expect(strstr(err, "model_type") && strstr(err, "mamba2") && strstr(err, "qwen3") &&
                  strstr(err, "starcoder2") &&
                  strstr(err, "deepseek_v3") && strstr(err, "gemma2"),
              "%s", err);
    g_autofree char *b = write_config(
        "{\"model_type\": \"qwen2\", \"architectures\": [\"Qwen2ForSequenceClassification\"], "
        SMALL "}");
    const char *argv2[] = {"estimate", "--model", b, "--seq", "64", NULL};
    g_autofree char *err2 = NULL;
    cr_expect_eq(run(argv2, NULL, &err2), 2, "%s", err2);
    cr_expect(strstr(err2, "architectures") && strstr(err2, "Qwen2ForSequenceClassification") &&
                  strstr(err2, "Qwen2ForCausalLM"),
              "%s", err2);
    g_autofree char *c = write_config("{\"model_type\": \"qwen3\", \"architectures\": \"x\", "
                                      SMALL "}");
    const char *argv3[] = {"estimate", "--model", c, "--seq", "64", NULL};
    g_autofree char *err3 = NULL;
    cr_expect_eq(run(argv3, NULL, &err3), 2, "%s", err3);
    cr_expect(strstr(err3, "architectures"), "%s", err3);
}

Test(families, unknown_rope_type_warns_and_says_what_was_assumed)
{
    g_autofree char *p = write_config(
        "{\"model_type\": \"llama\", " SMALL
        ", \"rope_scaling\": {\"rope_type\": \"banana\", \"factor\": 4.0}}");
    const char *argv[] = {"estimate", "--model", p, "--seq", "64", NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(run(argv, NULL, &err), 0, "%s", err);
    cr_expect(strstr(err, "rope_scaling.rope_type") && strstr(err, "banana") &&
                  strstr(err, "assumed") && strstr(err, "llama3"),
              "%s", err);
    /* a known one is quiet */
    g_autofree char *q = write_config(
        "{\"model_type\": \"llama\", " SMALL
        ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}");
    const char *argv2[] = {"estimate", "--model", q, "--seq", "64", NULL};
    g_autofree char *err2 = NULL;
    cr_expect_eq(run(argv2, NULL, &err2), 0, "%s", err2);
    cr_expect(!strstr(err2, "rope"), "%s", err2);
    g_autofree char *r = write_config("{\"model_type\": \"qwen3\", " SMALL
                                      ", \"rope_scaling\": [1]}");
    const char *argv3[] = {"estimate", "--model", r, "--seq", "64", NULL};
    g_autofree char *err3 = NULL;
    cr_expect_eq(run(argv3, NULL, &err3), 2, "%s", err3);
    cr_expect(strstr(err3, "rope_scaling"), "%s", err3);
}

static JsonObject *model_of(JsonParser *p, const char *text)
{
    cr_assert(json_parser_load_from_data(p, text, -1, NULL), "%.300s", text);
    JsonNode *root = json_parser_get_root(p);
    if (JSON_NODE_HOLDS_ARRAY(root))
        return NULL;
    JsonObject *o = json_node_get_object(root);
    cr_assert(json_object_has_member(o, "model"), "%.300s", text);
    return json_object_get_object_member(o, "model");
}

/* The counts written by hand from the config: Qwen3-30B-A3B's 48 layers of attention
 * (q 2048x4096, k and v 2048x512, o 4096x2048, q_norm and k_norm 128 each), router 128x2048,
 * 128 experts of 3 x 2048 x 768, two norms; embedding and head 151936 x 2048 each; final
 * norm. Active: 8 of the 128 experts. */
static void expect_qwen3_moe(JsonObject *m)
{
    int64_t attn = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 256;
    int64_t experts = (int64_t)128 * 3 * 2048 * 768;
    int64_t layer = attn + 128 * 2048 + experts + 2 * 2048;
    int64_t emb = (int64_t)151936 * 2048;
    int64_t total = 48 * layer + 2 * emb + 2048;
    int64_t active = total - (int64_t)48 * 120 * 3 * 2048 * 768;
    cr_expect_str_eq(json_object_get_string_member(m, "family"), "qwen3_moe");
    cr_expect_eq(json_object_get_int_member(m, "params"), total);
    cr_expect_eq(json_object_get_int_member(m, "active_params"), active);
    cr_expect_eq(json_object_get_int_member(m, "embedding_params"), emb);
    cr_expect_eq(json_object_get_int_member(m, "lm_head_params"), emb);
    cr_expect_eq(json_object_get_int_member(m, "experts"), 128);
    cr_expect_eq(json_object_get_int_member(m, "experts_per_token"), 8);
}

Test(families, json_of_estimate_gen_plan_and_models_carries_the_model, .timeout = 300)
{
    g_autoptr(JsonParser) p = json_parser_new();
    const char *est[] = {"estimate", "--model", "qwen3-30b-a3b", "--seq", "128", "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    run(est, &out, &err);
    expect_qwen3_moe(model_of(p, out));
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *mst = g_build_filename(dir, "t.mst", NULL);
    const char *gen[] = {"gen", "--model", "qwen3-30b-a3b", "--seq", "128", "-o", mst, "--json",
                         NULL};
    g_autofree char *out2 = NULL, *err2 = NULL;
    cr_expect_eq(run(gen, &out2, &err2), 0, "%s", err2);
    expect_qwen3_moe(model_of(p, out2));
    const char *plan[] = {"plan", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "256",
                          "--json", NULL};
    g_autofree char *out3 = NULL, *err3 = NULL;
    run(plan, &out3, &err3);
    expect_qwen3_moe(model_of(p, out3));
    /* a dense tied model: all parameters active, no separate head */
    const char *g3[] = {"estimate", "--model", "gemma-2-2b", "--seq", "64", "--json", NULL};
    g_autofree char *out4 = NULL;
    run(g3, &out4, NULL);
    JsonObject *m = model_of(p, out4);
    cr_expect_eq(json_object_get_int_member(m, "params"),
                 json_object_get_int_member(m, "active_params"));
    cr_expect_eq(json_object_get_int_member(m, "lm_head_params"), 0);
    cr_expect(json_object_get_boolean_member(m, "tied_embeddings"));
    cr_expect_eq(json_object_get_int_member(m, "embedding_params"), (int64_t)256000 * 2304);
    /* models --json: the same object for every preset */
    const char *models[] = {"models", "--json", NULL};
    g_autofree char *out5 = NULL;
    cr_expect_eq(run(models, &out5, NULL), 0);
    cr_assert(json_parser_load_from_data(p, out5, -1, NULL));
    JsonArray *a = json_node_get_array(json_parser_get_root(p));
    int found = 0;
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonObject *o = json_array_get_object_element(a, i);
        cr_expect(json_object_has_member(o, "params") && json_object_has_member(o, "family") &&
                  json_object_has_member(o, "active_params") &&
                  json_object_has_member(o, "embedding_params") &&
                  json_object_has_member(o, "lm_head_params"));
        cr_expect_eq(json_object_get_int_member(o, "params"),
                     json_object_get_int_member(o, "parameters"));
        if (strcmp(json_object_get_string_member(o, "name"), "qwen3-30b-a3b") == 0) {
            expect_qwen3_moe(o);
            found++;
        }
    }
    cr_expect_eq(found, 1);
}

/* Each family's forward is generated, and the model state is what its parameter count
 * implies (fp32 master weights, gradients and two Adam moments: 16 bytes a parameter). */
Test(families, every_family_generates_its_model_state, .timeout = 120)
{
    static const char *configs[] = {
        "{\"model_type\": \"qwen3\", " SMALL ", \"head_dim\": 16}",
        "{\"model_type\": \"olmo2\", " SMALL "}",
        "{\"model_type\": \"olmo\", " SMALL "}",
        "{\"model_type\": \"olmo\", " SMALL ", \"clip_qkv\": 8.0}",
        "{\"model_type\": \"phi3\", " SMALL "}",
        "{\"model_type\": \"starcoder2\", " SMALL ", \"sliding_window\": 32, "
        "\"residual_dropout\": 0.1, \"embedding_dropout\": 0.1}",
        "{\"model_type\": \"gemma\", " SMALL ", \"head_dim\": 16}",
        "{\"model_type\": \"gemma2\", " SMALL ", \"head_dim\": 16}",
        "{\"model_type\": \"gemma3_text\", " SMALL ", \"head_dim\": 16}",
        "{\"model_type\": \"qwen2_moe\", " SMALL ", \"moe_intermediate_size\": 32, "
        "\"shared_expert_intermediate_size\": 64, \"num_experts\": 8, \"num_experts_per_tok\": 2}",
        "{\"model_type\": \"qwen3_moe\", " SMALL ", \"head_dim\": 16, "
        "\"moe_intermediate_size\": 32, \"num_experts\": 8, \"num_experts_per_tok\": 2}",
        "{\"model_type\": \"deepseek_v2\", " SMALL ", \"moe_intermediate_size\": 32, "
        "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_shared_experts\": 2, "
        "\"first_k_dense_replace\": 1, \"q_lora_rank\": null, \"kv_lora_rank\": 16, "
        "\"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16}",
        "{\"model_type\": \"deepseek_v3\", " SMALL ", \"moe_intermediate_size\": 32, "
        "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_shared_experts\": 1, "
        "\"first_k_dense_replace\": 1, \"q_lora_rank\": 32, \"kv_lora_rank\": 16, "
        "\"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16}",
    };
    for (gsize i = 0; i < G_N_ELEMENTS(configs); i++) {
        g_autofree char *path = write_config(configs[i]);
        GError *error = NULL;
        MemsimModel *m = memsim_model_load(path, &error);
        cr_assert(m, "%s: %s", configs[i], error ? error->message : "?");
        MemsimRun r = memsim_run_defaults();
        cr_assert(memsim_run_set(&r, "seq", "64", &error));
        cr_assert(memsim_run_set(&r, "precision", "bf16-mixed", &error));
        MemsimTrace *t = memsim_generate(m, &r, &error);
        cr_assert(t, "%s: %s", configs[i], error ? error->message : "?");
        MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
        cr_assert(rep);
        const MemsimRankReport *rk = &rep->ranks[0];
        const MemsimBreakdown *bd = NULL;
        for (guint k = 0; k < rk->n_breakdowns; k++)
            if (strstr(rk->breakdowns[k].name, "model state"))
                bd = &rk->breakdowns[k];
        cr_assert(bd, "%s", configs[i]);
        int64_t n = memsim_model_n_params(m);
        cr_expect_eq(bd->requested[MEMSIM_CAT_PARAMETER], 4 * n, "%s", memsim_model_family(m));
        cr_expect_eq(bd->requested[MEMSIM_CAT_GRADIENT], 4 * n, "%s", memsim_model_family(m));
        cr_expect_eq(bd->requested[MEMSIM_CAT_OPTIMIZER_STATE], 8 * n, "%s",
                     memsim_model_family(m));
        memsim_report_free(rep);
        memsim_trace_free(t);
        memsim_run_clear(&r);
        memsim_model_free(m);
    }
}

Test(families, what_is_not_modelled_is_refused)
{
    /* DeepSeek: peft has no default LoRA targets */
    const char *lora[] = {"estimate", "--model", "deepseek-v2-lite", "--finetune", "lora", NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(run(lora, NULL, &err), 2, "%s", err);
    cr_expect(strstr(err, "lora-targets") && strstr(err, "kv_b_proj"), "%s", err);
    /* Phi-3's default is its fused qkv_proj; q_proj does not exist there */
    const char *phi[] = {"estimate", "--model", "phi-3-mini-4k", "--finetune", "lora",
                         "--lora-targets", "q_proj", NULL};
    g_autofree char *err2 = NULL;
    cr_expect_eq(run(phi, NULL, &err2), 2, "%s", err2);
    cr_expect(strstr(err2, "qkv_proj"), "%s", err2);
    /* tensor parallelism of the experts */
    const char *tp[] = {"estimate", "--model", "qwen3-30b-a3b", "--gpus", "2", "--method",
                        "megatron", "--tp", "2", NULL};
    g_autofree char *err3 = NULL;
    int rc = run(tp, NULL, &err3);
    cr_expect(rc == 2 || rc == 3, "exit %d: %s", rc, err3);
    cr_expect(strstr(err3, "experts"), "%s", err3);
    /* dense layers among sparse ones (mlp_only_layers) */
    g_autofree char *p = write_config("{\"model_type\": \"qwen3_moe\", " SMALL
                                      ", \"moe_intermediate_size\": 32, \"mlp_only_layers\": [1]}");
    const char *mo[] = {"estimate", "--model", p, "--seq", "64", NULL};
    g_autofree char *err4 = NULL;
    cr_expect_eq(run(mo, NULL, &err4), 2, "%s", err4);
    cr_expect(strstr(err4, "mlp_only_layers"), "%s", err4);
}

static int64_t forward_peak(const char *config, const char *seq)
{
    g_autofree char *path = write_config(config);
    GError *error = NULL;
    MemsimModel *m = memsim_model_load(path, &error);
    cr_assert(m, "%s", error ? error->message : "?");
    MemsimRun r = memsim_run_defaults();
    cr_assert(memsim_run_set(&r, "seq", seq, &error));
    cr_assert(memsim_run_set(&r, "precision", "bf16", &error));
    MemsimTrace *t = memsim_generate(m, &r, &error);
    cr_assert(t, "%s", error ? error->message : "?");
    MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
    const MemsimRankReport *rk = &rep->ranks[0];
    int64_t peak = rk->steps[rk->n_steps - 1].phase_peak_allocated[MEMSIM_PHASE_FORWARD];
    memsim_report_free(rep);
    memsim_trace_free(t);
    memsim_run_clear(&r);
    memsim_model_free(m);
    return peak;
}

/* Mistral's sliding window under SDPA (bf16): once the sequence reaches the window the model
 * hands SDPA a bool (1,1,S,S) mask (expanded to B), so flash cannot run and the GQA keys and
 * values are repeated (repeat_kv: enable_gqa only without a mask) and saved, in each of the 2
 * layers: 2 × 2 × [1, 4, 64, 16] bf16 copies more than the same model without a window. */
Test(families, sliding_window_mask_from_the_window_on)
{
    const char *w = "{\"model_type\": \"mistral\", " SMALL ", \"sliding_window\": 64}";
    const char *nw = "{\"model_type\": \"mistral\", " SMALL ", \"sliding_window\": null}";
    cr_expect_eq(forward_peak(w, "63"), forward_peak(nw, "63"), "below the window: no mask");
    int64_t extra = forward_peak(w, "64") - forward_peak(nw, "64");
    int64_t kv = (int64_t)1 * 4 * 64 * 16 * 2; /* one repeated K or V, bf16 */
    /* less the flash kernel's saved RNG state (one 512-byte block a layer) */
    cr_expect_geq(extra, 2 * 2 * kv - 2 * 512, "%" G_GINT64_FORMAT, extra);
    cr_expect_leq(extra, 2 * 2 * kv + 64 * 64, "%" G_GINT64_FORMAT, extra);
}

/* --moe-imbalance on Mixtral's eager experts (MixtralSparseMoeBlock.forward: each expert on
 * the rows torch.where(expert_mask[e]) selects). T = 4096 tokens, k = 1 of E = 4 experts,
 * I = 4000: uniform, 1024 rows each; at 2, the most-loaded expert ⌈2 · 4096 / 4⌉ = 2048 rows
 * and the other three the 2048 left, 683, 683, 682. Each expert's gate projection is one
 * [rows, I] bf16 tensor (bf16-mixed autocast), so the trace allocates rows · I · 2 bytes for
 * it; the peak rises by at least the hot expert's one extra [1024, I] buffer. */
/* The forward's peak of live activations (and, with `temporaries`, the peak of temporaries
 * added) of one step of `m` at seq 64. */
static int64_t forward_live(MemsimModel *m, gboolean temporaries)
{
    GError *error = NULL;
    MemsimRun r = memsim_run_defaults();
    tu_set(&r, "seq", "64");
    tu_set(&r, "steps", "1");
    MemsimTrace *t = memsim_generate(m, &r, &error);
    cr_assert(t, "%s", error ? error->message : "?");
    int64_t live = tu_peak_live(t, MEMSIM_CAT_ACTIVATION, MEMSIM_PHASE_FORWARD);
    if (temporaries)
        live += tu_peak_live(t, MEMSIM_CAT_TEMPORARY, MEMSIM_PHASE_FORWARD);
    memsim_trace_free(t);
    memsim_run_clear(&r);
    return live;
}

static int64_t count_allocs(MemsimTrace *t, int64_t size)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    int64_t c = 0;
    for (gsize i = 0; i < n; i++)
        c += ev[i].kind == MEMSIM_EV_ALLOC && (int64_t)ev[i].size == size;
    return c;
}

Test(families, moe_imbalance_gives_the_hot_expert_its_rows_and_uniform_is_the_default)
{
    g_autofree char *path = write_config(
        "{\"model_type\": \"mixtral\", \"vocab_size\": 256, \"hidden_size\": 64, "
        "\"intermediate_size\": 4000, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"num_local_experts\": 4, \"num_experts_per_tok\": 1}");
    GError *error = NULL;
    MemsimModel *m = memsim_model_load(path, &error);
    cr_assert(m, "%s", error ? error->message : "?");
    const int64_t I = 4000, row = I * 2;
    const char *f[] = {NULL, "1", "2"};
    MemsimTrace *t[3];
    int64_t peak[3];
    gsize n_events[3];
    for (int i = 0; i < 3; i++) {
        MemsimRun r = memsim_run_defaults();
        tu_set(&r, "seq", "4096");
        if (f[i])
            tu_set(&r, "moe-imbalance", f[i]);
        t[i] = memsim_generate(m, &r, &error);
        cr_assert(t[i], "%s", error ? error->message : "?");
        memsim_trace_events(t[i], 0, &n_events[i]);
        peak[i] = tu_peak_live(t[i], MEMSIM_CAT_ACTIVATION, -1) +
                  tu_peak_live(t[i], MEMSIM_CAT_TEMPORARY, -1);
        memsim_run_clear(&r);
    }
    /* uniform, whether given or not: the same trace */
    cr_expect_eq(n_events[1], n_events[0]);
    cr_expect_eq(peak[1], peak[0]);
    cr_expect_gt(count_allocs(t[0], 1024 * row), 0);
    cr_expect_eq(count_allocs(t[0], 2048 * row), 0);
    /* at 2: the hot expert's 2048 rows and the others' 683 and 682, no uniform 1024 */
    cr_expect_gt(count_allocs(t[2], 2048 * row), 0);
    cr_expect_gt(count_allocs(t[2], 683 * row), 0);
    cr_expect_gt(count_allocs(t[2], 682 * row), 0);
    cr_expect_eq(count_allocs(t[2], 1024 * row), 0);
    cr_expect_geq(peak[2] - peak[0], (2048 - 1024) * row,
                  "peak %" G_GINT64_FORMAT " → %" G_GINT64_FORMAT, peak[0], peak[2]);
    for (int i = 0; i < 3; i++)
        memsim_trace_free(t[i]);
    memsim_model_free(m);
}

/* --moe-imbalance is refused, exit 2, for a model without routed experts and for the
 * families whose experts run as one grouped GEMM over the T·k slots (integrations/moe.py
 * grouped_mm_experts_forward: sizes independent of the routing); below 1 it is no factor. */
Test(families, moe_imbalance_refused_where_it_changes_nothing)
{
    const char *cases[][3] = {
        {"gpt2", "2", "no routed experts"},
        {"qwen3-30b-a3b", "2", "grouped"},
        {"deepseek-v2-lite", "1.5", "grouped"},
        {"mixtral-8x7b", "0.5", "[1"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        const char *argv[] = {"estimate", "--model",         cases[i][0], "--seq",
                              "64",       "--moe-imbalance", cases[i][1], NULL};
        g_autofree char *err = NULL;
        cr_expect_eq(run(argv, NULL, &err), 2, "%s: %s", cases[i][0], err);
        cr_expect(err && strstr(err, "moe-imbalance") && strstr(err, cases[i][2]), "%s: %s",
                  cases[i][0], err);
    }
}

/* OLMo (modular_olmo.py): OlmoLayerNorm has no parameters, so a layer is q, k, v, o and the
 * SwiGLU MLP only (4 H² + 3 H I with H = 64, I = 128 and as many key/value heads as heads)
 * and the model adds the embedding (and the head when untied); clip_qkv's clamp_ keeps a
 * pre-clamp copy of q, k and v per layer for backward (gen_variable_type.py original_self),
 * 3 · B · S · H bf16 values a layer more at the end of the forward. */
Test(families, olmo_has_no_norm_parameters_and_clip_qkv_keeps_copies)
{
    const int64_t V = 1000, H = 64, I = 128, L = 2, S = 64;
    g_autofree char *plain = write_config(
        "{\"model_type\": \"olmo\", \"vocab_size\": 1000, \"hidden_size\": 64, "
        "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4}");
    g_autofree char *clipped = write_config(
        "{\"model_type\": \"olmo\", \"vocab_size\": 1000, \"hidden_size\": 64, "
        "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"clip_qkv\": 8}");
    GError *error = NULL;
    MemsimModel *a = memsim_model_load(plain, &error);
    cr_assert(a, "%s", error ? error->message : "?");
    MemsimModel *b = memsim_model_load(clipped, &error);
    cr_assert(b, "%s", error ? error->message : "?");
    cr_expect_eq(memsim_model_n_params(a), L * (4 * H * H + 3 * H * I) + 2 * V * H);
    int64_t fwd[2];
    MemsimModel *ms[2] = {a, b};
    for (int i = 0; i < 2; i++)
        fwd[i] = forward_live(ms[i], FALSE);
    cr_expect_eq(fwd[1] - fwd[0], L * 3 * S * H * 2,
                 "forward activations %" G_GINT64_FORMAT " → %" G_GINT64_FORMAT, fwd[0], fwd[1]);
    memsim_model_free(a);
    memsim_model_free(b);
}

/* Qwen2-VL as released (model_type qwen2_vl, the text model's fields at the top level beside
 * vision_config) and as newer Transformers nest it (text_config of qwen2_vl_text): Qwen2's
 * decoder, said on stderr with the multimodal rotary it assumes. That rotary
 * (modeling_qwen2_vl.py) makes (3, B, S, hd) cos and sin tables for the three position grids
 * instead of Llama's (1, S, hd), and each layer cuts its own (B, 1, S, hd) pair from them
 * (apply_multimodal_rotary_pos_emb: split, cat), which the products with q and k save. At the
 * forward's peak (the loss, the decoder's tables gone) Qwen2 holds its one (1, S, hd) cos and
 * sin pair, saved by every layer, and Qwen2-VL each layer's own (B, 1, S, hd) pair: L · 2 · B·S·hd
 * - 2 · S·hd more values, fp32 (cos.to(x.dtype): the hidden stream's dtype under bf16-mixed
 * autocast). A mrope_section not covering half the head dimension is refused. */
Test(families, qwen2_vl_reads_the_text_model_with_the_multimodal_rotary)
{
    const int64_t L = 2, S = 64, hd = 16, B = 1;
#define VLSIZES                                                                                    \
    "\"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128, "                      \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2"
    g_autofree char *q2 = write_config("{\"model_type\": \"qwen2\", " VLSIZES "}");
    g_autofree char *top =
        write_config("{\"model_type\": \"qwen2_vl\", \"architectures\": "
                     "[\"Qwen2VLForConditionalGeneration\"], " VLSIZES
                     ", \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [2, 3, 3]}, "
                     "\"vision_config\": {\"depth\": 2, \"embed_dim\": 32}}");
    g_autofree char *nested = write_config(
        "{\"model_type\": \"qwen2_vl\", \"vision_config\": {\"depth\": 2}, \"text_config\": "
        "{\"model_type\": \"qwen2_vl_text\", " VLSIZES ", \"rope_parameters\": "
        "{\"rope_type\": \"default\", \"mrope_section\": [2, 3, 3]}}}");
    const char *paths[] = {q2, top, nested};
    int64_t fwd[3];
    for (int i = 0; i < 3; i++) {
        const char *argv[] = {"estimate", "--model", paths[i], "--seq", "64", NULL};
        g_autofree char *err = NULL;
        cr_expect_eq(run(argv, NULL, &err), 0, "%s", err);
        if (i > 0)
            cr_expect(err && strstr(err, "qwen2_vl") && strstr(err, "multimodal rotary") &&
                          strstr(err, "[2, 3, 3]") && strstr(err, "not counted"),
                      "%s", err);
        GError *error = NULL;
        MemsimModel *m = memsim_model_load(paths[i], &error);
        cr_assert(m, "%s", error ? error->message : "?");
        fwd[i] = forward_live(m, TRUE);
        if (i > 0)
            cr_expect_eq(
                memsim_model_n_params(m),
                (int64_t)(2 * 1000 * 64 + 64 +
                          L * (64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 128)));
        memsim_model_free(m);
    }
    int64_t want = (L * 2 * B * S * hd - 2 * S * hd) * 4;
    cr_expect_eq(fwd[1] - fwd[0], want, "%" G_GINT64_FORMAT " → %" G_GINT64_FORMAT, fwd[0], fwd[1]);
    cr_expect_eq(fwd[2], fwd[1]);
    g_autofree char *bad =
        write_config("{\"model_type\": \"qwen2_vl\", " VLSIZES
                     ", \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [16, 24, 24]}}");
    const char *argv[] = {"estimate", "--model", bad, "--seq", "64", NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(run(argv, NULL, &err), 2, "%s", err);
    cr_expect(err && strstr(err, "rope_scaling.mrope_section"), "%s", err);
#undef VLSIZES
}

/* Gemma 3's local rotary (Gemma3TextModel: rotary_emb_local on rope_local_base_freq; every
 * forward makes position_embeddings_global and _local, Gemma3DecoderLayer takes the local
 * pair in a sliding layer). Two layers with sliding_window_pattern 2 (layer 0 slides, layer 1
 * does not) keep both pairs to the loss, saved by the layers' products; with pattern 1 no
 * layer slides and the local pair dies with the decoder: 2 · S · hd fp32 values apart at the
 * forward's peak (the window, 4096, is beyond the sequence: no sliding mask either way). An
 * unknown rope type under rope_parameters' per-layer-type objects is said with its path. A
 * layer_types list (the newer configs') is the arrangement: [sliding, full] is pattern 2;
 * [full, sliding], which no pattern makes, is refused naming it. */
Test(families, gemma3_sliding_layers_rotate_with_their_own_tables)
{
    const int64_t S = 64, hd = 16;
#define G3 "{\"model_type\": \"gemma3_text\", " SMALL ", \"head_dim\": 16, "
    g_autofree char *two = write_config(G3 "\"sliding_window_pattern\": 2}");
    g_autofree char *one = write_config(G3 "\"sliding_window_pattern\": 1}");
    g_autofree char *typed =
        write_config(G3 "\"layer_types\": [\"sliding_attention\", \"full_attention\"]}");
    g_autofree char *unmodelled =
        write_config(G3 "\"layer_types\": [\"full_attention\", \"sliding_attention\"]}");
    g_autofree char *odd =
        write_config(G3 "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\"}, "
                        "\"sliding_attention\": {\"rope_type\": \"wavelet\"}}}");
#undef G3
    const char *paths[] = {two, one, typed};
    int64_t fwd[3];
    for (int i = 0; i < 3; i++) {
        GError *error = NULL;
        MemsimModel *m = memsim_model_load(paths[i], &error);
        cr_assert(m, "%s", error ? error->message : "?");
        fwd[i] = forward_live(m, TRUE);
        memsim_model_free(m);
    }
    cr_expect_eq(fwd[0] - fwd[1], 2 * S * hd * 4, "%" G_GINT64_FORMAT " vs %" G_GINT64_FORMAT,
                 fwd[0], fwd[1]);
    cr_expect_eq(fwd[2], fwd[0]);
    const char *argv2[] = {"estimate", "--model", unmodelled, "--seq", "64", NULL};
    g_autofree char *err2 = NULL;
    cr_expect_eq(run(argv2, NULL, &err2), 2, "%s", err2);
    cr_expect(err2 && strstr(err2, "layer_types"), "%s", err2);
    const char *argv[] = {"estimate", "--model", odd, "--seq", "64", NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(run(argv, NULL, &err), 0, "%s", err);
    cr_expect(err && strstr(err, "rope_parameters.sliding_attention.rope_type") &&
                  strstr(err, "wavelet"),
              "%s", err);
}
