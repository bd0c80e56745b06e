/* config.json → MemsimModel (traces/model.h), with each family's defaults as in the
 * Hugging Face configuration classes (HF_MODELS.md §3), and the shipped presets
 * (the JSON files in traces/models/, compiled into the library as a GResource). */
#include "traces/model.h"

#include <json-glib/json-glib.h>
#include <string.h>

#include "traces/presets-resource.h"

typedef struct {
    const char *file;
    JsonObject *o;
    GError **error;
} Cfg;

static gboolean bad(Cfg *c, const char *field, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static gboolean bad(Cfg *c, const char *field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(c->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: field '%s': %s", c->file,
                field, msg);
    return FALSE;
}

/* An integer field (first of the alias names present), or `def` when absent or null. */
static gboolean get_int(Cfg *c, const char *const *names, int64_t def, int64_t *out)
{
    for (const char *const *n = names; *n; n++) {
        if (!json_object_has_member(c->o, *n))
            continue;
        JsonNode *v = json_object_get_member(c->o, *n);
        if (JSON_NODE_HOLDS_NULL(v))
            continue;
        if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_INT64)
            return bad(c, *n, "expected an integer");
        *out = json_node_get_int(v);
        return TRUE;
    }
    *out = def;
    return TRUE;
}

static gboolean get_double(Cfg *c, const char *name, double def, double *out)
{
    *out = def;
    if (!json_object_has_member(c->o, name))
        return TRUE;
    JsonNode *v = json_object_get_member(c->o, name);
    if (JSON_NODE_HOLDS_NULL(v))
        return TRUE;
    if (!JSON_NODE_HOLDS_VALUE(v) || (json_node_get_value_type(v) != G_TYPE_DOUBLE &&
                                      json_node_get_value_type(v) != G_TYPE_INT64))
        return bad(c, name, "expected a number");
    *out = json_node_get_double(v);
    return TRUE;
}

static gboolean get_bool(Cfg *c, const char *name, bool def, bool *out)
{
    *out = def;
    if (!json_object_has_member(c->o, name))
        return TRUE;
    JsonNode *v = json_object_get_member(c->o, name);
    if (JSON_NODE_HOLDS_NULL(v))
        return TRUE;
    if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_BOOLEAN)
        return bad(c, name, "expected true or false");
    *out = json_node_get_boolean(v);
    return TRUE;
}

static gboolean get_str(Cfg *c, const char *const *names, const char *def, char *out,
                        gsize len)
{
    for (const char *const *n = names; *n; n++) {
        if (!json_object_has_member(c->o, *n))
            continue;
        JsonNode *v = json_object_get_member(c->o, *n);
        if (JSON_NODE_HOLDS_NULL(v))
            continue;
        if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_STRING)
            return bad(c, *n, "expected a string");
        g_strlcpy(out, json_node_get_string(v), len);
        return TRUE;
    }
    g_strlcpy(out, def, len);
    return TRUE;
}

#define N(...) ((const char *const[]){__VA_ARGS__, NULL})

static gboolean positive(Cfg *c, const char *field, int64_t v)
{
    if (v <= 0)
        return bad(c, field, "must be a positive integer (got %" G_GINT64_FORMAT ")", v);
    return TRUE;
}

static const struct {
    const char *type;
    Family fam;
} types[] = {
    {"llama", FAM_LLAMA},     {"mistral", FAM_LLAMA},   {"qwen2", FAM_LLAMA},
    {"gpt2", FAM_GPT2},       {"opt", FAM_OPT},         {"bloom", FAM_BLOOM},
    {"gpt_neox", FAM_NEOX},   {"falcon", FAM_FALCON},   {"gpt_neo", FAM_GPTNEO},
    {"codegen", FAM_CODEGEN}, {"mixtral", FAM_MIXTRAL},
};

static const char *family_names[FAM_COUNT] = {"llama", "gpt2",   "opt",     "bloom",  "gpt_neox",
                                              "falcon", "gpt_neo", "codegen", "mixtral"};

static gboolean parse(Cfg *c, MemsimModel *m)
{
    char type[64];
    if (!get_str(c, N("model_type"), "", type, sizeof type))
        return FALSE;
    if (!*type)
        return bad(c, "model_type", "missing: cannot tell the model family");
    gboolean found = FALSE;
    for (gsize i = 0; i < G_N_ELEMENTS(types); i++)
        if (strcmp(types[i].type, type) == 0) {
            m->fam = types[i].fam;
            found = TRUE;
        }
    if (!found) {
        GString *k = g_string_new(NULL);
        for (gsize i = 0; i < G_N_ELEMENTS(types); i++)
            g_string_append_printf(k, "%s%s", i ? ", " : "", types[i].type);
        bad(c, "model_type", "unknown model type '%s' (known: %s)", type, k->str);
        g_string_free(k, TRUE);
        return FALSE;
    }
    m->model_type = g_strdup(type);
    m->rotary_pct = 1.0;
    m->pre_ln = true;
    int64_t h = 0;
    bool ok = true;
    switch (m->fam) {
    case FAM_LLAMA:
    case FAM_MIXTRAL: {
        bool mistral = strcmp(type, "mistral") == 0, qwen = strcmp(type, "qwen2") == 0;
        bool mix = m->fam == FAM_MIXTRAL;
        ok = get_int(c, N("vocab_size"), qwen ? 151936 : 32000, &m->V) &&
             get_int(c, N("hidden_size"), qwen ? 4096 : 4096, &m->H) &&
             get_int(c, N("intermediate_size"), qwen ? 22016 : (mistral || mix) ? 14336 : 11008,
                     &m->I) &&
             get_int(c, N("num_hidden_layers"), 32, &m->L) &&
             get_int(c, N("num_attention_heads"), 32, &m->nh) &&
             get_int(c, N("num_key_value_heads"), (mistral || mix) ? 8 : qwen ? 32 : 0, &m->nkv) &&
             get_int(c, N("head_dim"), 0, &m->hd) &&
             get_int(c, N("max_position_embeddings"),
                     mistral || mix ? 131072 : qwen ? 32768 : 2048, &m->max_pos) &&
             get_str(c, N("hidden_act"), "silu", m->act, sizeof m->act) &&
             get_bool(c, "tie_word_embeddings", false, &m->tie) &&
             get_bool(c, "attention_bias", false, &m->qkv_bias) &&
             get_bool(c, "mlp_bias", false, &m->mlp_bias) &&
             get_double(c, "attention_dropout", 0.0, &m->attn_pdrop) &&
             get_bool(c, "use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        m->o_bias = m->qkv_bias;
        if (qwen) {
            m->qkv_bias = true; /* Qwen2: q, k, v always have biases, o_proj none */
            m->o_bias = false;
            bool sw = false;
            if (!get_bool(c, "use_sliding_window", false, &sw))
                return FALSE;
            if (sw && !get_int(c, N("sliding_window"), 4096, &m->sliding_window))
                return FALSE;
        } else if (mistral || mix) {
            if (!get_int(c, N("sliding_window"), mistral ? 4096 : 0, &m->sliding_window))
                return FALSE;
        }
        if (mix && (!get_int(c, N("num_local_experts", "num_experts"), 8, &m->n_experts) ||
                    !get_int(c, N("num_experts_per_tok"), 2, &m->top_k)))
            return FALSE;
        break;
    }
    case FAM_GPT2:
        ok = get_int(c, N("vocab_size"), 50257, &m->V) &&
             get_int(c, N("n_embd", "hidden_size"), 768, &m->H) &&
             get_int(c, N("n_layer", "num_hidden_layers"), 12, &m->L) &&
             get_int(c, N("n_head", "num_attention_heads"), 12, &m->nh) &&
             get_int(c, N("n_positions", "max_position_embeddings"), 1024, &m->max_pos) &&
             get_int(c, N("n_inner"), 0, &m->I) &&
             get_str(c, N("activation_function"), "gelu_new", m->act, sizeof m->act) &&
             get_double(c, "embd_pdrop", 0.1, &m->embd_pdrop) &&
             get_double(c, "attn_pdrop", 0.1, &m->attn_pdrop) &&
             get_double(c, "resid_pdrop", 0.1, &m->resid_pdrop) &&
             get_bool(c, "tie_word_embeddings", true, &m->tie) &&
             get_bool(c, "use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        if (!m->I)
            m->I = 4 * m->H;
        m->qkv_bias = m->o_bias = m->mlp_bias = true;
        break;
    case FAM_OPT:
        ok = get_int(c, N("vocab_size"), 50272, &m->V) &&
             get_int(c, N("hidden_size"), 768, &m->H) &&
             get_int(c, N("num_hidden_layers"), 12, &m->L) &&
             get_int(c, N("num_attention_heads"), 12, &m->nh) &&
             get_int(c, N("ffn_dim"), 3072, &m->I) &&
             get_int(c, N("max_position_embeddings"), 2048, &m->max_pos) &&
             get_int(c, N("word_embed_proj_dim"), 0, &m->wep) &&
             get_bool(c, "do_layer_norm_before", true, &m->pre_ln) &&
             get_str(c, N("activation_function"), "relu", m->act, sizeof m->act) &&
             get_double(c, "dropout", 0.1, &m->resid_pdrop) &&
             get_double(c, "attention_dropout", 0.0, &m->attn_pdrop) &&
             get_bool(c, "enable_bias", true, &m->qkv_bias) &&
             get_bool(c, "tie_word_embeddings", true, &m->tie) &&
             get_bool(c, "use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        m->o_bias = m->mlp_bias = m->qkv_bias;
        if (!m->wep)
            m->wep = m->H;
        break;
    case FAM_BLOOM:
        ok = get_int(c, N("vocab_size"), 250880, &m->V) &&
             get_int(c, N("n_embed", "hidden_size"), 64, &m->H) &&
             get_int(c, N("n_layer", "num_hidden_layers"), 2, &m->L) &&
             get_int(c, N("n_head", "num_attention_heads"), 8, &m->nh) &&
             get_double(c, "hidden_dropout", 0.0, &m->resid_pdrop) &&
             get_double(c, "attention_dropout", 0.0, &m->attn_pdrop) &&
             get_bool(c, "tie_word_embeddings", true, &m->tie) &&
             get_bool(c, "use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        m->I = 4 * m->H;
        m->qkv_bias = m->o_bias = m->mlp_bias = true;
        g_strlcpy(m->act, "bloom_gelu", sizeof m->act);
        break;
    case FAM_NEOX:
        ok = get_int(c, N("vocab_size"), 50432, &m->V) &&
             get_int(c, N("hidden_size"), 6144, &m->H) &&
             get_int(c, N("num_hidden_layers"), 44, &m->L) &&
             get_int(c, N("num_attention_heads"), 64, &m->nh) &&
             get_int(c, N("intermediate_size"), 24576, &m->I) &&
             get_int(c, N("max_position_embeddings"), 2048, &m->max_pos) &&
             get_str(c, N("hidden_act"), "gelu", m->act, sizeof m->act) &&
             get_double(c, "attention_dropout", 0.0, &m->attn_pdrop) &&
             get_double(c, "hidden_dropout", 0.0, &m->resid_pdrop) &&
             get_bool(c, "tie_word_embeddings", false, &m->tie) &&
             get_bool(c, "use_parallel_residual", true, &m->parallel_residual) &&
             get_bool(c, "attention_bias", true, &m->qkv_bias) &&
             get_bool(c, "use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        {
            double pct = 0.25, tmp;
            if (!get_double(c, "rotary_pct", 0.25, &tmp))
                return FALSE;
            pct = tmp;
            if (!get_double(c, "partial_rotary_factor", pct, &tmp))
                return FALSE;
            m->rotary_pct = tmp;
            if (!(m->rotary_pct > 0.0 && m->rotary_pct <= 1.0))
                return bad(c, "rotary_pct", "must be in (0, 1]");
        }
        m->o_bias = m->qkv_bias;
        m->mlp_bias = true;
        break;
    case FAM_FALCON: {
        bool mq = true, alibi = false, bias = false, par = true;
        int64_t ffn = 0;
        ok = get_int(c, N("vocab_size"), 65024, &m->V) &&
             get_int(c, N("n_embed", "hidden_size"), 4544, &m->H) &&
             get_int(c, N("num_hidden_layers", "n_layer"), 32, &m->L) &&
             get_int(c, N("num_attention_heads", "n_head"), 71, &m->nh) &&
             get_int(c, N("num_kv_heads", "n_head_kv"), 0, &m->nkv) &&
             get_int(c, N("ffn_hidden_size"), 0, &ffn) &&
             get_bool(c, "multi_query", true, &mq) && get_bool(c, "alibi", false, &alibi) &&
             get_bool(c, "new_decoder_architecture", false, &m->falcon_new_arch) &&
             get_bool(c, "parallel_attn", true, &par) && get_bool(c, "bias", false, &bias) &&
             get_int(c, N("max_position_embeddings"), 2048, &m->max_pos) &&
             get_bool(c, "tie_word_embeddings", true, &m->tie) &&
             get_bool(c, "use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        if (alibi)
            return bad(c, "alibi", "ALiBi Falcon models are not modelled yet");
        m->I = ffn ? ffn : 4 * m->H;
        if (m->falcon_new_arch) {
            if (!m->nkv)
                m->nkv = m->nh;
        } else {
            m->nkv = mq ? 1 : m->nh;
        }
        m->parallel_residual = par || m->falcon_new_arch;
        m->qkv_bias = m->o_bias = m->mlp_bias = bias;
        g_strlcpy(m->act, "gelu", sizeof m->act);
        break;
    }
    case FAM_GPTNEO:
        ok = get_int(c, N("vocab_size"), 50257, &m->V) &&
             get_int(c, N("hidden_size"), 2048, &m->H) &&
             get_int(c, N("num_layers", "num_hidden_layers"), 24, &m->L) &&
             get_int(c, N("num_heads", "num_attention_heads"), 16, &m->nh) &&
             get_int(c, N("intermediate_size"), 0, &m->I) &&
             get_int(c, N("max_position_embeddings"), 2048, &m->max_pos) &&
             get_int(c, N("window_size"), 256, &m->sliding_window) &&
             get_str(c, N("activation_function"), "gelu_new", m->act, sizeof m->act) &&
             get_double(c, "embed_dropout", 0.0, &m->embd_pdrop) &&
             get_double(c, "attention_dropout", 0.0, &m->attn_pdrop) &&
             get_double(c, "resid_dropout", 0.0, &m->resid_pdrop) &&
             get_bool(c, "tie_word_embeddings", true, &m->tie) &&
             get_bool(c, "use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        if (!m->I)
            m->I = 4 * m->H;
        m->o_bias = m->mlp_bias = true;
        break;
    case FAM_CODEGEN:
        ok = get_int(c, N("vocab_size"), 50400, &m->V) &&
             get_int(c, N("n_embd", "hidden_size"), 4096, &m->H) &&
             get_int(c, N("n_layer", "num_hidden_layers"), 28, &m->L) &&
             get_int(c, N("n_head", "num_attention_heads"), 16, &m->nh) &&
             get_int(c, N("n_positions", "max_position_embeddings"), 2048, &m->max_pos) &&
             get_int(c, N("rotary_dim"), 64, &m->rotary_dim) &&
             get_int(c, N("n_inner"), 0, &m->I) &&
             get_str(c, N("activation_function"), "gelu_new", m->act, sizeof m->act) &&
             get_double(c, "embd_pdrop", 0.0, &m->embd_pdrop) &&
             get_double(c, "attn_pdrop", 0.0, &m->attn_pdrop) &&
             get_double(c, "resid_pdrop", 0.0, &m->resid_pdrop) &&
             get_bool(c, "tie_word_embeddings", false, &m->tie) &&
             get_bool(c, "use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        if (!m->I)
            m->I = 4 * m->H;
        m->mlp_bias = true;
        m->parallel_residual = true;
        break;
    default:
        g_assert_not_reached();
    }
    (void)h;
    if (!positive(c, "vocab_size", m->V) || !positive(c, "hidden_size", m->H) ||
        !positive(c, "num_hidden_layers", m->L) || !positive(c, "num_attention_heads", m->nh) ||
        !positive(c, "intermediate_size", m->I))
        return FALSE;
    if (m->nkv < 0 || m->hd < 0)
        return bad(c, m->nkv < 0 ? "num_key_value_heads" : "head_dim", "must not be negative");
    if (!m->nkv)
        m->nkv = m->nh;
    if (!m->hd) {
        if (m->H % m->nh != 0)
            return bad(c, "num_attention_heads",
                       "%" G_GINT64_FORMAT " heads do not divide hidden_size %" G_GINT64_FORMAT,
                       m->nh, m->H);
        m->hd = m->H / m->nh;
    }
    if (m->nh % m->nkv != 0)
        return bad(c, "num_key_value_heads",
                   "%" G_GINT64_FORMAT " key/value heads do not divide %" G_GINT64_FORMAT
                   " attention heads",
                   m->nkv, m->nh);
    if (m->fam == FAM_MIXTRAL && (m->n_experts <= 0 || m->top_k <= 0 || m->top_k > m->n_experts))
        return bad(c, "num_experts_per_tok", "needs 0 < num_experts_per_tok ≤ num_local_experts");
    if (m->fam == FAM_CODEGEN && (m->rotary_dim <= 0 || m->rotary_dim > m->hd))
        return bad(c, "rotary_dim", "must be in (0, head_dim]");
    return TRUE;
}

static MemsimModel *load_json(JsonParser *p, const char *file, const char *name,
                              GError **error)
{
    JsonNode *root = json_parser_get_root(p);
    if (!root || !JSON_NODE_HOLDS_OBJECT(root)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: expected a JSON object (a Hugging Face config.json)", file);
        return NULL;
    }
    Cfg c = {file, json_node_get_object(root), error};
    MemsimModel *m = g_new0(MemsimModel, 1);
    m->name = g_strdup(name);
    if (!parse(&c, m)) {
        memsim_model_free(m);
        return NULL;
    }
    return m;
}

static GResource *presets(void)
{
    return memsim_presets_get_resource();
}

char **memsim_model_presets(void)
{
    char **names = g_resources_enumerate_children("/org/memsim/models/", 0, NULL);
    if (!names)
        return g_new0(char *, 1);
    for (char **n = names; *n; n++)
        if (g_str_has_suffix(*n, ".json"))
            (*n)[strlen(*n) - 5] = '\0';
    /* sorted, for stable listings */
    gsize len = g_strv_length(names);
    for (gsize i = 1; i < len; i++)
        for (gsize j = i; j > 0 && strcmp(names[j], names[j - 1]) < 0; j--) {
            char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    (void)presets;
    return names;
}

MemsimModel *memsim_model_load(const char *name_or_path, GError **error)
{
    g_autoptr(JsonParser) p = json_parser_new();
    GError *e = NULL;
    g_autofree char *rpath = g_strdup_printf("/org/memsim/models/%s.json", name_or_path);
    presets(); /* registers the resource */
    GBytes *bytes = g_resources_lookup_data(rpath, 0, NULL);
    if (bytes) {
        gsize len;
        const char *data = g_bytes_get_data(bytes, &len);
        gboolean ok = json_parser_load_from_data(p, data, (gssize)len, &e);
        g_bytes_unref(bytes);
        g_assert(ok && "a shipped preset does not parse");
        return load_json(p, rpath + strlen("/org/memsim/models/"), name_or_path, error);
    }
    if (!g_file_test(name_or_path, G_FILE_TEST_EXISTS)) {
        g_auto(GStrv) names = memsim_model_presets();
        g_autofree char *list = g_strjoinv(", ", names);
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "'%s' is neither a preset nor a config.json file (presets: %s)",
                    name_or_path, list);
        return NULL;
    }
    if (!json_parser_load_from_file(p, name_or_path, &e)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: not valid JSON: %s",
                    name_or_path, e->message);
        g_error_free(e);
        return NULL;
    }
    return load_json(p, name_or_path, name_or_path, error);
}

void memsim_model_free(MemsimModel *m)
{
    if (!m)
        return;
    g_free(m->name);
    g_free(m->model_type);
    g_free(m);
}

const char *memsim_model_name(const MemsimModel *m)
{
    return m->name;
}

const char *memsim_model_family(const MemsimModel *m)
{
    return family_names[m->fam];
}

int64_t memsim_model_n_params(const MemsimModel *m)
{
    int64_t H = m->H, V = m->V, I = m->I, L = m->L, nh = m->nh, nkv = m->nkv, hd = m->hd;
    int64_t per_layer = 0, other = 0;
    switch (m->fam) {
    case FAM_LLAMA:
    case FAM_MIXTRAL: {
        int64_t attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H;
        if (m->qkv_bias)
            attn += nh * hd + 2 * nkv * hd;
        if (m->o_bias)
            attn += H;
        int64_t mlp = m->fam == FAM_MIXTRAL ? m->n_experts * 3 * H * I + m->n_experts * H
                                            : 3 * H * I + (m->mlp_bias ? 2 * I + H : 0);
        per_layer = attn + mlp + 2 * H;
        other = V * H + H + (m->tie ? 0 : V * H);
        break;
    }
    case FAM_GPT2:
        per_layer = 4 * H + (H * 3 * H + 3 * H) + (H * H + H) + (H * I + I) + (I * H + H);
        other = V * H + m->max_pos * H + 2 * H + (m->tie ? 0 : V * H);
        break;
    case FAM_OPT: {
        int64_t b = m->qkv_bias ? 1 : 0;
        per_layer = 4 * (H * H + b * H) + 4 * H + (I * H + b * I) + (H * I + b * H);
        other = V * m->wep + (m->max_pos + 2) * H + (m->tie ? 0 : V * m->wep);
        if (m->wep != H)
            other += 2 * H * m->wep;
        if (m->pre_ln)
            other += 2 * H;
        break;
    }
    case FAM_BLOOM:
        per_layer = 4 * H + (3 * H * H + 3 * H) + (H * H + H) + (4 * H * H + 4 * H) +
                    (4 * H * H + H);
        other = V * H + 4 * H + (m->tie ? 0 : V * H);
        break;
    case FAM_NEOX: {
        int64_t b = m->qkv_bias ? 1 : 0;
        per_layer = 4 * H + (3 * H * H + b * 3 * H) + (H * H + b * H) + (I * H + I) + (H * I + H);
        other = V * H + 2 * H + (m->tie ? 0 : V * H);
        break;
    }
    case FAM_FALCON: {
        int64_t qkv = m->falcon_new_arch ? (2 * nkv + nh) * hd : nkv == 1 ? H + 2 * hd : 3 * H;
        int64_t b = m->qkv_bias ? 1 : 0;
        int64_t norms = m->falcon_new_arch ? 4 * H : m->parallel_residual ? 2 * H : 4 * H;
        per_layer = qkv * H + b * qkv + H * H + b * H + I * H + b * I + H * I + b * H + norms;
        other = V * H + 2 * H + (m->tie ? 0 : V * H);
        break;
    }
    case FAM_GPTNEO:
        per_layer = 4 * H + 3 * H * H + (H * H + H) + (I * H + I) + (H * I + H);
        other = V * H + m->max_pos * H + 2 * H + (m->tie ? 0 : V * H);
        break;
    case FAM_CODEGEN:
        per_layer = 2 * H + 3 * H * H + H * H + (I * H + I) + (H * I + H);
        other = V * H + 2 * H + (m->tie ? 0 : V * H + V);
        break;
    default:
        g_assert_not_reached();
    }
    return per_layer * L + other;
}
