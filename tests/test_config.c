/* The config.json reader (traces/config.c) against hostile and malformed configs: sizes whose
 * arithmetic overflows, layer counts no machine could simulate, nesting that would overflow
 * json-glib's recursive parser, values that must be refused instead of defaulted, and the
 * text tower of multimodal configs. Every refusal is exit status 2 from `memsim estimate`
 * with a message naming the field. */
#include <criterion/criterion.h>
#include <memsim/error.h>
#include <memsim/gen.h>
#include <string.h>

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
        cr_expect_lt(secs, tu_limit_s(), "%s layers: refused after %.1f s", layers[i], secs);
    }
    double mib = tu_children_peak_mib();
    cr_expect_lt(mib, tu_limit_mib(), "peak RSS %.0f MiB", mib);
    /* the work of a mixture of experts grows with layers × experts */
    REFUSED("{\"model_type\": \"mixtral\", \"vocab_size\": 1000, \"hidden_size\": 64, "
            "\"intermediate_size\": 128, \"num_hidden_layers\": 1000, "
            "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
            "\"num_local_experts\": 64}",
            "num_local_experts", "num_hidden_layers");
    /* at most 1024 experts (DeepSeek-V3 has 256) */
    REFUSED("{\"model_type\": \"mixtral\", \"vocab_size\": 1000, \"hidden_size\": 64, "
            "\"intermediate_size\": 128, \"num_hidden_layers\": 2, "
            "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
            "\"num_local_experts\": 2048}",
            "num_local_experts", "1024");
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
    cr_expect_lt(secs, tu_limit_s(), "refused after %.1f s", secs);
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
    /* Llama 3.2 Vision as published: cross-attention layers among the text layers */
    REFUSED("{\"model_type\": \"mllama\", \"text_config\": {\"model_type\": "
            "\"mllama_text_model\", " TOWER_FIELDS ", \"cross_attention_layers\": [1]}}",
            "text_config.cross_attention_layers", "cross-attention");
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

/* The table is tests/data/bad-configs.txt (its header gives the format), shared with the
 * Python module's test (tests/python/test_memsim.py). */
enum Kind {
    K_INT,  /* integer ≥ 1 */
    K_PROB, /* probability in [0, 1] */
    K_FRAC, /* (0, 1] */
    K_POS,  /* finite, > 0 */
    K_BOOL,
    K_ACT,  /* an activation's name */
    K_TYPE, /* model_type */
    N_KINDS
};
static const char *const kind_names[N_KINDS] = {"int",  "prob", "frac", "pos",
                                                "bool", "act",  "type"};
enum { REQ = 1, NUL = 2 /* null is Transformers' None, accepted */ };

typedef struct {
    char *name, *value;
    enum Kind kind;
    int flags;
} Field;

typedef struct {
    char *family;
    GArray *f; /* Field, in the config's order */
} Base;

typedef struct {
    GPtrArray *bases;        /* Base */
    GPtrArray *bad[N_KINDS]; /* JSON text; NULL stands for the field left out */
} Table;

static void field_clear(gpointer p)
{
    Field *f = p;
    g_free(f->name);
    g_free(f->value);
}

static void base_free(gpointer p)
{
    Base *b = p;
    g_free(b->family);
    g_array_unref(b->f);
    g_free(b);
}

static void table_free(Table *t)
{
    g_ptr_array_unref(t->bases);
    for (int k = 0; k < N_KINDS; k++)
        g_ptr_array_unref(t->bad[k]);
    g_free(t);
}

static enum Kind kind_of(const char *word, const char *line)
{
    for (int k = 0; k < N_KINDS; k++)
        if (strcmp(word, kind_names[k]) == 0)
            return (enum Kind)k;
    cr_assert_fail("bad-configs.txt: unknown kind '%s': %s", word, line);
    return N_KINDS;
}

/* Reads tests/data/bad-configs.txt; any line it does not understand fails the test. */
static Table *table_load(void)
{
    g_autofree char *path = tu_test_data("bad-configs.txt");
    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(path, &text, NULL, NULL), "%s", path);
    Table *t = g_new0(Table, 1);
    t->bases = g_ptr_array_new_with_free_func(base_free);
    for (int k = 0; k < N_KINDS; k++)
        t->bad[k] = g_ptr_array_new_with_free_func(g_free);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    gboolean ended = FALSE;
    for (char **l = lines; *l; l++) {
        const char *line = g_strstrip(*l);
        if (!*line || *line == '#')
            continue;
        cr_assert(!ended, "bad-configs.txt: a record after end: %s", line);
        g_autofree char *word = g_strstrip(g_strndup(line, strcspn(line, "|")));
        int parts = strcmp(word, "bad") == 0      ? 3
                    : strcmp(word, "family") == 0 ? 2
                    : strcmp(word, "field") == 0  ? 5
                                                  : 1;
        g_auto(GStrv) w = g_strsplit(line, "|", parts);
        cr_assert_eq(g_strv_length(w), (guint)parts, "bad-configs.txt: bad record: %s", line);
        for (char **p = w; *p; p++)
            g_strstrip(*p);
        if (strcmp(word, "end") == 0) {
            ended = TRUE;
        } else if (parts == 3) {
            const char *v = w[2];
            cr_assert(*v, "bad-configs.txt: no value: %s", line);
            g_ptr_array_add(t->bad[kind_of(w[1], line)],
                            strcmp(v, "absent") == 0 ? NULL : g_strdup(v));
        } else if (parts == 2) {
            Base *b = g_new0(Base, 1);
            b->family = g_strdup(w[1]);
            b->f = g_array_new(FALSE, TRUE, sizeof(Field));
            g_array_set_clear_func(b->f, field_clear);
            g_ptr_array_add(t->bases, b);
        } else if (parts == 5) {
            cr_assert(t->bases->len > 0, "bad-configs.txt: a field before any family: %s",
                      line);
            Field f = {.kind = kind_of(w[2], line)};
            if (strcmp(w[3], "-") != 0) {
                g_auto(GStrv) flags = g_strsplit(w[3], ",", -1);
                for (char **fl = flags; *fl; fl++) {
                    g_strstrip(*fl);
                    if (strcmp(*fl, "req") == 0)
                        f.flags |= REQ;
                    else if (strcmp(*fl, "null") == 0)
                        f.flags |= NUL;
                    else
                        cr_assert_fail("bad-configs.txt: unknown flag '%s': %s", *fl, line);
                }
            }
            cr_assert(*w[1] && *w[4], "bad-configs.txt: bad field: %s", line);
            f.name = g_strdup(w[1]);
            f.value = g_strdup(w[4]);
            Base *b = g_ptr_array_index(t->bases, t->bases->len - 1);
            g_array_append_val(b->f, f);
        } else {
            cr_assert_fail("bad-configs.txt: bad record: %s", line);
        }
    }
    cr_assert(ended, "bad-configs.txt: no end record (the file is cut short)");
    for (int k = 0; k < N_KINDS; k++)
        cr_assert_gt(t->bad[k]->len, 0, "bad-configs.txt: no bad values of kind %s",
                     kind_names[k]);
    return t;
}

/* The base config with `field` set to `value` (JSON text), or left out when value is NULL. */
static char *with_value(const Base *b, const char *field, const char *value)
{
    GString *s = g_string_new("{");
    gboolean first = TRUE;
    for (guint i = 0; i < b->f->len; i++) {
        const Field *f = &g_array_index(b->f, Field, i);
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
 * one config (llama's), which covers each kind but frac, and of gpt_neox's frac fields. */
Test(config, every_field_refuses_bad_values, .timeout = 240)
{
    Table *t = table_load();
    int cases = 0, commands = 0;
    gboolean llama = FALSE, neox = FALSE;
    unsigned all_kinds = 0; /* kinds with every bad value through the command */
    for (guint i = 0; i < t->bases->len; i++) {
        const Base *b = g_ptr_array_index(t->bases, i);
        gboolean all = strcmp(b->family, "llama") == 0;
        gboolean is_neox = strcmp(b->family, "gpt_neox") == 0;
        llama |= all;
        neox |= is_neox;
        /* the base itself is a good config */
        g_autofree char *good = with_value(b, "", NULL);
        g_autofree char *gerr = NULL;
        cr_expect_eq(estimate(good, NULL, &gerr), 0, "%s: %s", good, gerr);
        for (guint j = 0; j < b->f->len; j++) {
            const Field *f = &g_array_index(b->f, Field, j);
            const GPtrArray *vals = t->bad[f->kind];
            gboolean every = all || (is_neox && f->kind == K_FRAC);
            if (every)
                all_kinds |= 1u << f->kind;
            for (guint k = 0; k < vals->len; k++) {
                const char *v = g_ptr_array_index(vals, k);
                if (v && strcmp(v, "null") == 0 && (f->flags & NUL))
                    continue;
                if (!v && !(f->flags & REQ))
                    continue;
                g_autofree char *json = with_value(b, f->name, v);
                load_refused(json, f->name);
                /* (the sanitised build, 40 times slower per process, takes the command's
                 * path for llama's and gpt_neox's fields only; the library's for all) */
                if ((k == 0 && !tu_sanitized()) || every) {
                    REFUSED(json, f->name);
                    commands++;
                }
                cases++;
            }
        }
    }
    cr_log_info("%d bad configs refused, %d of them by the command", cases, commands);
    /* an empty, truncated or misread table fails here (1562 cases, 315 commands) */
    cr_expect(llama && neox, "bad-configs.txt: the llama and gpt_neox families");
    cr_expect_eq(all_kinds, (1u << N_KINDS) - 1,
                 "the command takes every bad value of each kind (%#x)", all_kinds);
    cr_expect_geq(cases, 1500, "bad-configs.txt gives %d cases", cases);
    cr_expect_geq(commands, tu_sanitized() ? 100 : 300, "%d cases through the command",
                  commands);
    table_free(t);
}
