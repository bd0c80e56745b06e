/* The config.json reader (traces/config.c) against hostile and malformed configs: sizes whose
 * arithmetic overflows, layer counts no machine could simulate, nesting that would overflow
 * json-glib's recursive parser, values that must be refused instead of defaulted, and the
 * text tower of multimodal configs. Every refusal is exit status 2 from `memsim estimate`
 * with a message naming the field. */
#include <criterion/criterion.h>
#include <memsim/error.h>
#include <memsim/gen.h>
#include <string.h>
#include <sys/resource.h>

#include "testutil.h"
#include "traces/model.h"

/* Writes `text` to config.json in this test's temporary folder (each test runs in a process
 * of its own); returns its path. */
static char *write_config(const char *text, gssize len)
{
    static char *dir;
    if (!dir)
        dir = tu_tmpdir();
    char *path = g_build_filename(dir, "config.json", NULL);
    cr_assert(g_file_set_contents(path, text, len, NULL));
    return path;
}

/* memsim estimate --model <json> (a small run); exit status, stdout and stderr. */
static int estimate(const char *json, char **out, char **err)
{
    g_autofree char *path = write_config(json, -1);
    const char *argv[] = {"estimate", "--model", path, "--seq", "64", NULL};
    return tu_run_memsim(argv, out, err);
}

/* `json` is refused with exit status 2 and a message that names each of the NULL-terminated
 * strings. */
static void refused_naming(const char *json, const char *const *names)
{
    g_autofree char *err = NULL;
    int rc = estimate(json, NULL, &err);
    cr_expect_eq(rc, 2, "%.300s: exit %d (%s)", json, rc, err);
    cr_expect(g_str_has_prefix(err, "memsim estimate: "), "%.300s: %s", json, err);
    for (const char *const *n = names; *n; n++)
        cr_expect(strstr(err, *n) != NULL, "%.300s: the message names '%s': %s", json, *n, err);
}

#define REFUSED(json, ...) refused_naming((json), (const char *const[]){__VA_ARGS__, NULL})

/* The bounds on a refusal's time and memory; the sanitizers' shadow memory and slower code:
 * 4× (as tests/test_answers.c). */
static double limit_s(void)
{
    const char *san = g_getenv("MEMSIM_SANITIZE");
    return san && *san && strcmp(san, "none") != 0 ? 20.0 : 5.0;
}

static long limit_kib(void)
{
    return limit_s() > 5.0 ? 2000 * 1024 : 500 * 1024;
}

/* `json` is refused by the library with a MEMSIM_ERROR_BAD_INPUT error (exit status 2 from
 * the command) naming `name`. */
static void load_refused(const char *json, const char *name)
{
    g_autofree char *path = write_config(json, -1);
    GError *error = NULL;
    MemsimModel *m = memsim_model_load(path, &error);
    cr_expect(m == NULL, "%.300s: accepted", json);
    memsim_model_free(m);
    if (!error)
        return;
    cr_expect(error->domain == MEMSIM_ERROR && error->code == MEMSIM_ERROR_BAD_INPUT,
              "%.300s: %s", json, error->message);
    cr_expect(strstr(error->message, name) != NULL, "%.300s: the message names '%s': %s", json,
              name, error->message);
    g_error_free(error);
}

/* A small Llama config with `extra` (",\"key\": value" pairs, or "") appended. */
static char *small_llama(const char *extra)
{
    return g_strdup_printf("{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 64, "
                           "\"intermediate_size\": 128, \"num_hidden_layers\": 2, "
                           "\"num_attention_heads\": 4, \"num_key_value_heads\": 2%s}",
                           extra);
}

/* ---- 1. size arithmetic ---- */

static char *llama_2_7b_with(const char *field, const char *value)
{
    static const char *const base[][2] = {
        {"model_type", "\"llama\""},       {"vocab_size", "32000"},
        {"hidden_size", "4096"},           {"intermediate_size", "11008"},
        {"num_hidden_layers", "32"},       {"num_attention_heads", "32"},
        {"num_key_value_heads", "32"},     {"max_position_embeddings", "4096"},
        {"hidden_act", "\"silu\""},        {"rms_norm_eps", "1e-05"},
        {"tie_word_embeddings", "false"},  {"use_cache", "true"},
    };
    GString *s = g_string_new("{");
    for (gsize i = 0; i < G_N_ELEMENTS(base); i++)
        g_string_append_printf(s, "%s\"%s\": %s", i ? ", " : "", base[i][0],
                               strcmp(base[i][0], field) == 0 ? value : base[i][1]);
    g_string_append(s, "}");
    return g_string_free(s, FALSE);
}

Test(config, sizes_that_overflow_are_refused)
{
    /* vocab × hidden wrapped to 0: reported as a 6.5 B model */
    g_autofree char *v = llama_2_7b_with("vocab_size", "4611686018427387904");
    REFUSED(v, "vocab_size", "too large");
    g_autofree char *h = llama_2_7b_with("hidden_size", "1099511627776");
    REFUSED(h, "hidden_size", "too large");
    g_autofree char *i = llama_2_7b_with("intermediate_size", "1099511627776");
    REFUSED(i, "intermediate_size", "too large");
    /* beyond 64 bits in the JSON text itself (json-glib wraps it to -1) */
    g_autofree char *w = llama_2_7b_with("vocab_size", "99999999999999999999999");
    REFUSED(w, "vocab_size", "too large");
    /* every field within its bound, but the parameters alone take more than 1 PiB */
    g_autofree char *big = g_strdup(
        "{\"model_type\": \"llama\", \"vocab_size\": 32000, \"hidden_size\": 1048576, "
        "\"intermediate_size\": 4194304, \"num_hidden_layers\": 10000, "
        "\"num_attention_heads\": 8192, \"num_key_value_heads\": 8192}");
    REFUSED(big, "num_hidden_layers", "PiB");
    g_autofree char *moe = g_strdup(
        "{\"model_type\": \"mixtral\", \"vocab_size\": 32000, \"hidden_size\": 1048576, "
        "\"intermediate_size\": 4194304, \"num_hidden_layers\": 200, "
        "\"num_attention_heads\": 8192, \"num_key_value_heads\": 8192, "
        "\"num_local_experts\": 64}");
    REFUSED(moe, "num_hidden_layers", "PiB");
    /* past 64 bits: 2^16 heads of 2^16 dimensions in 10000 layers */
    REFUSED("{\"model_type\": \"llama\", \"vocab_size\": 32000, \"hidden_size\": 1048576, "
            "\"intermediate_size\": 4194304, \"num_hidden_layers\": 10000, "
            "\"num_attention_heads\": 65536, \"head_dim\": 65536}",
            "num_hidden_layers", "2^63");
    /* GPT-Neo's per-layer max_pos² causal-mask buffers (past 64 bits with 10000 layers) */
    REFUSED("{\"model_type\": \"gpt_neo\", \"vocab_size\": 1000, \"hidden_size\": 64, "
            "\"num_layers\": 10000, \"num_heads\": 4, \"max_position_embeddings\": 67108864}",
            "max_position_embeddings");
    REFUSED("{\"model_type\": \"gpt_neo\", \"vocab_size\": 1000, \"hidden_size\": 64, "
            "\"num_layers\": 100, \"num_heads\": 4, \"max_position_embeddings\": 67108864}",
            "max_position_embeddings");
    /* the largest real shapes still load */
    GError *error = NULL;
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *path = g_build_filename(dir, "config.json", NULL);
    cr_assert(g_file_set_contents(
        path,
        "{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 16384, "
        "\"intermediate_size\": 53248, \"num_hidden_layers\": 126, \"num_attention_heads\": 128, "
        "\"num_key_value_heads\": 8, \"max_position_embeddings\": 131072}",
        -1, NULL));
    MemsimModel *m = memsim_model_load(path, &error);
    cr_assert(m, "Llama 3.1 405B: %s", error ? error->message : "?");
    cr_expect_eq(memsim_model_n_params(m), 405853388800, "%" G_GINT64_FORMAT,
                 memsim_model_n_params(m));
    memsim_model_free(m);
}

/* ---- 2. bounded work ---- */

Test(config, layer_counts_beyond_any_model_are_refused_at_once)
{
    const char *layers[] = {"1000000000", "1000000", "100000", "10001"};
    for (gsize i = 0; i < G_N_ELEMENTS(layers); i++) {
        g_autofree char *extra = g_strdup_printf(", \"num_hidden_layers\": %s", layers[i]);
        g_autofree char *json = g_strdup_printf(
            "{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 64, "
            "\"intermediate_size\": 128, \"num_attention_heads\": 4, "
            "\"num_key_value_heads\": 2%s}",
            extra);
        g_autofree char *err = NULL;
        gint64 t0 = g_get_monotonic_time();
        int rc = estimate(json, NULL, &err);
        double secs = (double)(g_get_monotonic_time() - t0) / 1e6;
        cr_expect_eq(rc, 2, "%s layers: exit %d (%s)", layers[i], rc, err);
        cr_expect(strstr(err, "num_hidden_layers") && strstr(err, layers[i]) &&
                      strstr(err, "10000"),
                  "the message names the field, the value and the limit: %s", err);
        cr_expect_lt(secs, limit_s(), "%s layers: refused after %.1f s", layers[i], secs);
    }
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_CHILDREN, &ru), 0);
    cr_expect_lt(ru.ru_maxrss, limit_kib(), "peak RSS %ld KiB", ru.ru_maxrss);
    /* the work of a mixture of experts grows with layers × experts */
    REFUSED("{\"model_type\": \"mixtral\", \"vocab_size\": 1000, \"hidden_size\": 64, "
            "\"intermediate_size\": 128, \"num_hidden_layers\": 1000, "
            "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
            "\"num_local_experts\": 64}",
            "num_local_experts", "num_hidden_layers");
    /* the generator's MoE block takes at most 64 experts */
    REFUSED("{\"model_type\": \"mixtral\", \"vocab_size\": 1000, \"hidden_size\": 64, "
            "\"intermediate_size\": 128, \"num_hidden_layers\": 2, "
            "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
            "\"num_local_experts\": 256}",
            "num_local_experts", "64");
}

/* ---- 3. nesting ---- */

static void nested_refused(const char *unit)
{
    gsize n = 200000 / strlen(unit);
    GString *s = g_string_sized_new(200001);
    for (gsize i = 0; i < n; i++)
        g_string_append(s, unit);
    g_autofree char *path = write_config(s->str, (gssize)s->len);
    g_string_free(s, TRUE);
    const char *argv[] = {"estimate", "--model", path, NULL};
    g_autofree char *err = NULL;
    gint64 t0 = g_get_monotonic_time();
    int rc = tu_run_memsim(argv, NULL, &err);
    double secs = (double)(g_get_monotonic_time() - t0) / 1e6;
    cr_expect_eq(rc, 2, "%s × %zu: exit %d (%s)", unit, n, rc, err);
    cr_expect(strstr(err, path) && strstr(err, "64") && strstr(err, "nested"),
              "the message names the file and the depth: %s", err);
    cr_expect_lt(secs, limit_s(), "refused after %.1f s", secs);
}

Test(config, deep_nesting_is_refused_before_parsing)
{
    nested_refused("{\"a\":");
    nested_refused("[");
    nested_refused("[{\"x\": 1, \"y\":");
}

Test(config, brackets_inside_strings_do_not_count)
{
    GString *brackets = g_string_new(NULL);
    for (int i = 0; i < 1000; i++)
        g_string_append(brackets, i % 3 ? "[{" : "\\\"[");
    g_autofree char *extra = g_strdup_printf(
        ", \"note\": \"%s\", \"rope_scaling\": {\"a\": {\"b\": [[[{\"c\": null}]]]}}",
        brackets->str);
    g_string_free(brackets, TRUE);
    g_autofree char *json = small_llama(extra);
    g_autofree char *err = NULL;
    cr_expect_eq(estimate(json, NULL, &err), 0, "%s", err);
}

Test(config, oversized_file_is_refused)
{
    gsize n = 17 << 20;
    char *text = g_malloc(n + 64);
    memcpy(text, "{\"pad\": \"", 9);
    memset(text + 9, 'x', n);
    memcpy(text + 9 + n, "\"}", 3);
    g_autofree char *path = write_config(text, -1);
    g_free(text);
    const char *argv[] = {"estimate", "--model", path, NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(tu_run_memsim(argv, NULL, &err), 2, "%s", err);
    cr_expect(strstr(err, path) && strstr(err, "MiB"), "%s", err);
}

/* ---- 4. values refused instead of defaulted ---- */

Test(config, values_once_accepted_silently)
{
    g_autofree char *kv0 = small_llama(", \"num_key_value_heads\": 0");
    REFUSED(kv0, "num_key_value_heads");
    g_autofree char *hnull = small_llama(", \"hidden_size\": null");
    REFUSED(hnull, "hidden_size", "null");
    REFUSED("{\"model_type\": \"llama\"}", "vocab_size", "hidden_size", "intermediate_size",
            "num_hidden_layers", "num_attention_heads");
    REFUSED("{\"model_type\": \"gpt2\"}", "vocab_size", "n_embd", "n_layer", "n_head");
    g_autofree char *act = small_llama(", \"hidden_act\": \"weird\"");
    REFUSED(act, "hidden_act", "weird", "silu", "gelu_new", "gelu_pytorch_tanh", "relu");
    g_autofree char *theta = small_llama(", \"rope_theta\": 0");
    REFUSED(theta, "rope_theta");
    g_autofree char *eps = small_llama(", \"rms_norm_eps\": -1e-6");
    REFUSED(eps, "rms_norm_eps");
    REFUSED("{\"model_type\": \"gpt2\", \"vocab_size\": 100, \"n_embd\": 64, \"n_layer\": 2, "
            "\"n_head\": 4, \"attn_pdrop\": 1.5}",
            "attn_pdrop");
    REFUSED("{\"model_type\": \"gpt_neox\", \"vocab_size\": 100, \"hidden_size\": 64, "
            "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 256, "
            "\"rotary_pct\": 0}",
            "rotary_pct");
    /* the values of a null that Transformers itself gives a meaning stay accepted */
    g_autofree char *ok = small_llama(", \"head_dim\": null, \"rope_scaling\": null");
    g_autofree char *err = NULL;
    cr_expect_eq(estimate(ok, NULL, &err), 0, "%s", err);
    g_autofree char *err2 = NULL;
    cr_expect_eq(estimate("{\"model_type\": \"gpt2\", \"vocab_size\": 100, \"n_embd\": 64, "
                          "\"n_layer\": 2, \"n_head\": 4, \"n_inner\": null}",
                          NULL, &err2),
                 0, "%s", err2);
}

/* A sliding_window of null is Mistral's "no window", not its class default of 4096. */
Test(config, null_sliding_window_means_none)
{
    g_autofree char *dir = tu_tmpdir();
    const char *json[] = {
        "{\"model_type\": \"mistral\", \"vocab_size\": 1000, \"hidden_size\": 64, "
        "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"sliding_window\": null}",
        "{\"model_type\": \"mistral\", \"vocab_size\": 1000, \"hidden_size\": 64, "
        "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2}",
    };
    for (gsize i = 0; i < G_N_ELEMENTS(json); i++) {
        g_autofree char *path = g_build_filename(dir, i ? "b.json" : "a.json", NULL);
        cr_assert(g_file_set_contents(path, json[i], -1, NULL));
        GError *error = NULL;
        MemsimModel *m = memsim_model_load(path, &error);
        cr_assert(m, "%s", error ? error->message : "?");
        cr_expect_eq(m->sliding_window, i ? 4096 : 0, "%s: window %" G_GINT64_FORMAT, json[i],
                     m->sliding_window);
        memsim_model_free(m);
    }
}

/* ---- 5. multimodal configs: the text tower ---- */

#define TOWER_FIELDS                                                                          \
    "\"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128, "                \
    "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2"

static int64_t params_of(const char *json, const char **family)
{
    g_autofree char *path = write_config(json, -1);
    GError *error = NULL;
    MemsimModel *m = memsim_model_load(path, &error);
    cr_assert(m, "%s: %s", json, error ? error->message : "?");
    int64_t n = memsim_model_n_params(m);
    static char fam[32];
    g_strlcpy(fam, memsim_model_family(m), sizeof fam);
    *family = fam;
    memsim_model_free(m);
    return n;
}

Test(config, multimodal_text_tower_is_read_and_said)
{
    static const struct {
        const char *top, *tower, *as;
    } cases[] = {
        {"mllama", "mllama_text_model", "llama"},
        {"llava", "llama", "llama"},
        {"llava_next", "mistral", "mistral"},
        {"qwen2_vl", "qwen2_vl_text", "qwen2"},
        {"qwen2_5_vl", "qwen2_5_vl_text", "qwen2"},
        {"some_vlm", "my_text_model", "llama"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *json = g_strdup_printf(
            "{\"model_type\": \"%s\", \"vision_config\": {\"hidden_size\": 32}, "
            "\"text_config\": {\"model_type\": \"%s\", " TOWER_FIELDS "}}",
            cases[i].top, cases[i].tower);
        g_autofree char *err = NULL, *out = NULL;
        int rc = estimate(json, &out, &err);
        cr_expect_eq(rc, 0, "%s: exit %d (%s)", cases[i].top, rc, err);
        cr_expect(strstr(err, "text_config") && strstr(err, cases[i].tower) &&
                      strstr(err, "memsim: "),
                  "%s: a warning says the text tower was read: %s", cases[i].top, err);
        if (rc != 0)
            continue;
        /* the same numbers as the plain text model */
        g_autofree char *plain =
            g_strdup_printf("{\"model_type\": \"%s\", " TOWER_FIELDS "}", cases[i].as);
        const char *fam = NULL, *fam2 = NULL;
        cr_expect_eq(params_of(json, &fam), params_of(plain, &fam2), "%s", cases[i].top);
        cr_expect_str_eq(fam, fam2);
    }
}

Test(config, multimodal_text_tower_not_modelled_is_refused)
{
    /* Gemma 3 as published: its text_config leaves heads and vocabulary to the class */
    REFUSED("{\"model_type\": \"gemma3\", \"text_config\": {\"hidden_size\": 2560, "
            "\"intermediate_size\": 10240, \"model_type\": \"gemma3_text\", "
            "\"num_hidden_layers\": 34, \"sliding_window\": 1024}, "
            "\"vision_config\": {\"hidden_size\": 1152}}",
            "text_config", "gemma3_text");
    /* a known family's tower still gives its sizes: never the top level's defaults */
    REFUSED("{\"model_type\": \"llava\", \"text_config\": {\"model_type\": \"llama\"}}",
            "text_config.vocab_size", "text_config.hidden_size");
    REFUSED("{\"model_type\": \"llava\", \"text_config\": {\"model_type\": \"llama\", "
            TOWER_FIELDS ", \"num_key_value_heads\": 0}}",
            "text_config.num_key_value_heads");
    REFUSED("{\"model_type\": \"llava\", \"text_config\": [1]}", "text_config");
    REFUSED("{\"model_type\": \"llava\", \"vocab_size\": 1000}", "model_type", "llava");
}

/* ---- every field the reader takes, with bad values ---- */

enum Kind {
    K_INT,  /* integer ≥ 1 */
    K_PROB, /* probability in [0, 1] */
    K_FRAC, /* (0, 1] */
    K_POS,  /* finite, > 0 */
    K_BOOL,
    K_ACT,  /* an activation's name */
    K_TYPE, /* model_type */
};
enum { REQ = 1, NUL = 2 /* null is Transformers' None, accepted */ };

typedef struct {
    const char *name, *value;
    enum Kind kind;
    int flags;
} Field;

typedef struct {
    const char *family;
    Field f[24];
} Base;

#define TYPE(t) {"model_type", "\"" t "\"", K_TYPE, REQ}
#define LN_EPS {"layer_norm_epsilon", "1e-5", K_POS, 0}
static const Base bases[] = {
    {"llama",
     {TYPE("llama"), {"vocab_size", "1000", K_INT, REQ}, {"hidden_size", "64", K_INT, REQ},
      {"intermediate_size", "128", K_INT, REQ}, {"num_hidden_layers", "2", K_INT, REQ},
      {"num_attention_heads", "4", K_INT, REQ}, {"num_key_value_heads", "2", K_INT, NUL},
      {"head_dim", "16", K_INT, NUL}, {"max_position_embeddings", "256", K_INT, 0},
      {"hidden_act", "\"silu\"", K_ACT, 0}, {"tie_word_embeddings", "false", K_BOOL, 0},
      {"attention_bias", "false", K_BOOL, 0}, {"mlp_bias", "false", K_BOOL, 0},
      {"attention_dropout", "0.0", K_PROB, 0}, {"use_cache", "true", K_BOOL, 0},
      {"rope_theta", "10000.0", K_POS, 0}, {"rms_norm_eps", "1e-6", K_POS, 0}}},
    {"mistral",
     {TYPE("mistral"), {"vocab_size", "1000", K_INT, REQ}, {"hidden_size", "64", K_INT, REQ},
      {"intermediate_size", "128", K_INT, REQ}, {"num_hidden_layers", "2", K_INT, REQ},
      {"num_attention_heads", "4", K_INT, REQ}, {"num_key_value_heads", "2", K_INT, NUL},
      {"max_position_embeddings", "256", K_INT, 0}, {"sliding_window", "128", K_INT, NUL},
      {"hidden_act", "\"silu\"", K_ACT, 0}, {"attention_dropout", "0.0", K_PROB, 0}}},
    {"qwen2",
     {TYPE("qwen2"), {"vocab_size", "1000", K_INT, REQ}, {"hidden_size", "64", K_INT, REQ},
      {"intermediate_size", "128", K_INT, REQ}, {"num_hidden_layers", "2", K_INT, REQ},
      {"num_attention_heads", "4", K_INT, REQ}, {"num_key_value_heads", "2", K_INT, NUL},
      {"use_sliding_window", "false", K_BOOL, 0}, {"sliding_window", "128", K_INT, NUL}}},
    {"mixtral",
     {TYPE("mixtral"), {"vocab_size", "1000", K_INT, REQ}, {"hidden_size", "64", K_INT, REQ},
      {"intermediate_size", "128", K_INT, REQ}, {"num_hidden_layers", "2", K_INT, REQ},
      {"num_attention_heads", "4", K_INT, REQ}, {"num_key_value_heads", "2", K_INT, NUL},
      {"num_local_experts", "4", K_INT, 0}, {"num_experts_per_tok", "2", K_INT, 0},
      {"sliding_window", "128", K_INT, NUL}}},
    {"gpt2",
     {TYPE("gpt2"), {"vocab_size", "1000", K_INT, REQ}, {"n_embd", "64", K_INT, REQ},
      {"n_layer", "2", K_INT, REQ}, {"n_head", "4", K_INT, REQ},
      {"n_positions", "256", K_INT, 0}, {"n_inner", "256", K_INT, NUL},
      {"activation_function", "\"gelu_new\"", K_ACT, 0}, {"embd_pdrop", "0.1", K_PROB, 0},
      {"attn_pdrop", "0.1", K_PROB, 0}, {"resid_pdrop", "0.1", K_PROB, 0},
      {"tie_word_embeddings", "true", K_BOOL, 0}, {"use_cache", "true", K_BOOL, 0}, LN_EPS}},
    {"opt",
     {TYPE("opt"), {"vocab_size", "1000", K_INT, REQ}, {"hidden_size", "64", K_INT, REQ},
      {"num_hidden_layers", "2", K_INT, REQ}, {"num_attention_heads", "4", K_INT, REQ},
      {"ffn_dim", "256", K_INT, REQ}, {"max_position_embeddings", "256", K_INT, 0},
      {"word_embed_proj_dim", "64", K_INT, NUL}, {"do_layer_norm_before", "true", K_BOOL, 0},
      {"activation_function", "\"relu\"", K_ACT, 0}, {"dropout", "0.1", K_PROB, 0},
      {"attention_dropout", "0.0", K_PROB, 0}, {"enable_bias", "true", K_BOOL, 0},
      {"tie_word_embeddings", "true", K_BOOL, 0}, {"use_cache", "true", K_BOOL, 0}}},
    {"bloom",
     {TYPE("bloom"), {"vocab_size", "1000", K_INT, REQ}, {"hidden_size", "64", K_INT, REQ},
      {"n_layer", "2", K_INT, REQ}, {"n_head", "4", K_INT, REQ},
      {"hidden_dropout", "0.0", K_PROB, 0}, {"attention_dropout", "0.0", K_PROB, 0},
      {"tie_word_embeddings", "true", K_BOOL, 0}, {"use_cache", "true", K_BOOL, 0}, LN_EPS}},
    {"gpt_neox",
     {TYPE("gpt_neox"), {"vocab_size", "1000", K_INT, REQ}, {"hidden_size", "64", K_INT, REQ},
      {"num_hidden_layers", "2", K_INT, REQ}, {"num_attention_heads", "4", K_INT, REQ},
      {"intermediate_size", "256", K_INT, REQ}, {"max_position_embeddings", "256", K_INT, 0},
      {"hidden_act", "\"gelu\"", K_ACT, 0}, {"attention_dropout", "0.0", K_PROB, 0},
      {"hidden_dropout", "0.0", K_PROB, 0}, {"tie_word_embeddings", "false", K_BOOL, 0},
      {"use_parallel_residual", "true", K_BOOL, 0}, {"attention_bias", "true", K_BOOL, 0},
      {"use_cache", "true", K_BOOL, 0}, {"rotary_pct", "0.25", K_FRAC, 0},
      {"partial_rotary_factor", "0.25", K_FRAC, 0}, {"rotary_emb_base", "10000", K_POS, 0},
      {"layer_norm_eps", "1e-5", K_POS, 0}}},
    {"falcon",
     {TYPE("falcon"), {"vocab_size", "1000", K_INT, REQ}, {"hidden_size", "64", K_INT, REQ},
      {"num_hidden_layers", "2", K_INT, REQ}, {"num_attention_heads", "4", K_INT, REQ},
      {"num_kv_heads", "2", K_INT, NUL}, {"ffn_hidden_size", "256", K_INT, NUL},
      {"multi_query", "true", K_BOOL, 0}, {"alibi", "false", K_BOOL, 0},
      {"new_decoder_architecture", "true", K_BOOL, 0}, {"parallel_attn", "true", K_BOOL, 0},
      {"bias", "false", K_BOOL, 0}, {"max_position_embeddings", "256", K_INT, 0},
      {"tie_word_embeddings", "true", K_BOOL, 0}, {"use_cache", "true", K_BOOL, 0},
      {"rope_theta", "10000.0", K_POS, 0}, LN_EPS}},
    {"gpt_neo",
     {TYPE("gpt_neo"), {"vocab_size", "1000", K_INT, REQ}, {"hidden_size", "64", K_INT, REQ},
      {"num_layers", "2", K_INT, REQ}, {"num_heads", "4", K_INT, REQ},
      {"intermediate_size", "256", K_INT, NUL}, {"max_position_embeddings", "256", K_INT, 0},
      {"window_size", "64", K_INT, 0}, {"activation_function", "\"gelu_new\"", K_ACT, 0},
      {"embed_dropout", "0.0", K_PROB, 0}, {"attention_dropout", "0.0", K_PROB, 0},
      {"resid_dropout", "0.0", K_PROB, 0}, {"tie_word_embeddings", "true", K_BOOL, 0},
      {"use_cache", "true", K_BOOL, 0}, LN_EPS}},
    {"codegen",
     {TYPE("codegen"), {"vocab_size", "1000", K_INT, REQ}, {"n_embd", "64", K_INT, REQ},
      {"n_layer", "2", K_INT, REQ}, {"n_head", "4", K_INT, REQ},
      {"n_positions", "256", K_INT, 0}, {"rotary_dim", "8", K_INT, 0},
      {"n_inner", "256", K_INT, NUL}, {"activation_function", "\"gelu_new\"", K_ACT, 0},
      {"embd_pdrop", "0.0", K_PROB, 0}, {"attn_pdrop", "0.0", K_PROB, 0},
      {"resid_pdrop", "0.0", K_PROB, 0}, {"tie_word_embeddings", "false", K_BOOL, 0},
      {"use_cache", "true", K_BOOL, 0}, LN_EPS}},
};

/* The bad values of each kind (JSON text); "null" is left out where it is Transformers'
 * None, and NULL stands for the field left out (bad where it is required). */
static const char *const bad_int[] = {"-1", "0", "-9223372036854775808", "2.5", "64.0", "1e400",
                                      "\"8\"", "true", "[8]", "{}", "4611686018427387904",
                                      "99999999999999999999999", "null"};
static const char *const bad_prob[] = {"-0.1", "1.5", "1e400", "-1e400", "NaN", "Infinity",
                                       "-Infinity", "\"0.1\"", "true", "[0.1]", "null"};
static const char *const bad_frac[] = {"0", "-0.5", "1.5", "NaN", "1e400", "\"x\"", "false",
                                       "null"};
static const char *const bad_pos[] = {"0", "-1", "-1e-6", "1e400", "NaN", "\"x\"", "true",
                                      "null"};
static const char *const bad_bool[] = {"1", "0", "\"true\"", "[true]", "null"};
static const char *const bad_act[] = {"\"weird\"", "\"\"", "\"swiglu\"", "1", "true",
                                      "[\"silu\"]", "null"};
static const char *const bad_type[] = {"\"weird\"", "\"\"", "1", "null", "[\"llama\"]"};

/* The base config with `field` set to `value` (JSON text), or left out when value is NULL. */
static char *with_value(const Base *b, const char *field, const char *value)
{
    GString *s = g_string_new("{");
    gboolean first = TRUE;
    for (const Field *f = b->f; f->name; f++) {
        const char *v = strcmp(f->name, field) == 0 ? value : f->value;
        if (!v)
            continue;
        g_string_append_printf(s, "%s\"%s\": %s", first ? "" : ", ", f->name, v);
        first = FALSE;
    }
    g_string_append(s, "}");
    return g_string_free(s, FALSE);
}

/* Every bad value through the library, and through the command (exit status 2 and the
 * message on stderr) the first bad value of each field and every bad value of the fields of
 * one config, which covers each kind. */
Test(config, every_field_refuses_bad_values, .timeout = 240)
{
    int cases = 0, commands = 0;
    cr_assert_str_eq(bases[7].family, "gpt_neox");
    for (gsize i = 0; i < G_N_ELEMENTS(bases); i++) {
        const Base *b = &bases[i];
        /* the base itself is a good config */
        g_autofree char *good = with_value(b, "", NULL);
        g_autofree char *gerr = NULL;
        cr_expect_eq(estimate(good, NULL, &gerr), 0, "%s: %s", good, gerr);
        for (const Field *f = b->f; f->name; f++) {
            const char *const *vals = NULL;
            gsize n = 0;
            switch (f->kind) {
#define VALS(a)                                                                                \
    vals = a;                                                                                  \
    n = G_N_ELEMENTS(a);                                                                       \
    break
            case K_INT:
                VALS(bad_int);
            case K_PROB:
                VALS(bad_prob);
            case K_FRAC:
                VALS(bad_frac);
            case K_POS:
                VALS(bad_pos);
            case K_BOOL:
                VALS(bad_bool);
            case K_ACT:
                VALS(bad_act);
            case K_TYPE:
                VALS(bad_type);
#undef VALS
            }
            for (gsize k = 0; k <= n; k++) {
                const char *v = k < n ? vals[k] : NULL;
                if (v && strcmp(v, "null") == 0 && (f->flags & NUL))
                    continue;
                if (!v && !(f->flags & REQ))
                    continue;
                g_autofree char *json = with_value(b, f->name, v);
                load_refused(json, f->name);
                if (k == 0 || b == &bases[0] || (b == &bases[7] && f->kind == K_FRAC)) {
                    REFUSED(json, f->name);
                    commands++;
                }
                cases++;
            }
        }
    }
    cr_log_info("%d bad configs refused, %d of them by the command", cases, commands);
}
