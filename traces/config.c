/* config.json → MemsimModel (traces/model.h), with each family's defaults as in the
 * Hugging Face configuration classes (HF_MODELS.md §3), and the shipped presets
 * (the JSON files in traces/models/, compiled into the library as a GResource).
 *
 * A config.json is untrusted input. Before json-glib parses it, its size and nesting are
 * bounded (read_config, scan_json). Then every field the reader takes is checked for its type
 * and range; null is refused except where Transformers gives it a meaning (num_key_value_heads:
 * as many as the attention heads; sliding_window: no window; n_inner: 4 × hidden; ...); the
 * sizes of the model (vocabulary, hidden size, layers, heads, MLP width where the family has
 * one) are required, never taken from a default; and the model's bytes and the work of
 * simulating it are bounded (the bounds below). A multimodal config's text model
 * (text_config) is read when memsim models its family. Every refusal is a
 * MEMSIM_ERROR_BAD_INPUT error naming the file and the field. */
#include "traces/model.h"

#include <errno.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "traces/presets-resource.h"

/* ---- bounds ----
 * What a config.json may ask for. Each bound admits every published model with room to spare
 * (the largest today: hidden size 53248, Llama 3.1 405B's 16384; vocabularies up to about
 * 256000; 126 layers; 128 heads of at most 256 dimensions; contexts of 10M positions) and
 * keeps the work of simulating the model within a few GB and seconds: the generator keeps
 * about 110 KB of trace per layer, and 35 KB more per layer and expert of a mixture of
 * experts (two training steps). A value beyond its bound is refused naming the field, the
 * value and the bound. */
typedef struct {
    int64_t hi;
    const char *why;
} Bound;

static const Bound B_VOCAB = {(int64_t)1 << 24, "published vocabularies stay below 300000"};
static const Bound B_HIDDEN = {(int64_t)1 << 20, "published hidden sizes stay below 60000"};
static const Bound B_WIDTH = {(int64_t)1 << 22, "published MLP widths stay below 300000"};
static const Bound B_LAYERS = {10000, "published models have at most a few hundred layers, "
                                      "and each layer is simulated op by op"};
static const Bound B_HEADS = {(int64_t)1 << 16, "published models have at most a few hundred "
                                                "heads of at most 256 dimensions"};
static const Bound B_POS = {(int64_t)1 << 26, "published contexts reach about 10M positions"};
static const Bound B_EXPERTS = {1024, "published mixtures of experts have at most a few hundred "
                                      "experts (DeepSeek-V3: 256)"};
/* layers × experts of a mixture of experts (Mixtral 8x22B has 56 × 8 = 448) */
#define MAX_EXPERT_LAYERS 16384
/* The model's own bytes, its parameters at 2 bytes each and its buffers: beyond 2^50 bytes
 * (1 PiB), more than any device holds. This also keeps the sizes computed from the model far
 * inside 64 bits (16 bytes of training state per parameter: at most 2^53). */
#define MAX_MODEL_BYTES ((int64_t)1 << 50)
/* JSON nesting: json-glib's parser recurses once per level (a config.json nests 3 or 4) */
#define MAX_DEPTH 64
/* a config.json is a few KB */
#define MAX_FILE_BYTES ((gsize)16 << 20)

/* ---- reading fields ---- */

typedef struct {
    const char *file;
    const char *prefix; /* "text_config." for a multimodal config's text model, else "" */
    JsonObject *o;
    GHashTable *huge;   /* field path → the text of an integer beyond 64 bits (scan_json) */
    GString *missing;   /* required fields absent, named together */
    GHashTable *used;   /* a field's common name → the name the config used (n_embd, ...) */
    GError **error;
    bool preset;        /* a shipped preset: what its reading assumes is documented, not said */
} Cfg;

static gboolean vbad(Cfg *c, const char *field, const char *role, const char *fmt, va_list ap)
    G_GNUC_PRINTF(4, 0);

static gboolean vbad(Cfg *c, const char *field, const char *role, const char *fmt, va_list ap)
{
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    if (role && strcmp(role, field) != 0)
        g_set_error(c->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: field '%s%s' (%s): %s",
                    c->file, c->prefix, field, role, msg);
    else
        g_set_error(c->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: field '%s%s': %s",
                    c->file, c->prefix, field, msg);
    return FALSE;
}

static gboolean bad(Cfg *c, const char *field, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static gboolean bad_as(Cfg *c, const char *field, const char *role, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);
static gboolean bad_role(Cfg *c, const char *role, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

/* `field` as the config spells it. */
static gboolean bad(Cfg *c, const char *field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vbad(c, field, NULL, fmt, ap);
    va_end(ap);
    return FALSE;
}

/* `field` as the config spells it, and its common name `role` if that differs. */
static gboolean bad_as(Cfg *c, const char *field, const char *role, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vbad(c, field, role, fmt, ap);
    va_end(ap);
    return FALSE;
}

/* The field of common name `role` (hidden_size, ...) as the config named it. */
static const char *used_name(Cfg *c, const char *role)
{
    const char *n = g_hash_table_lookup(c->used, role);
    return n ? n : role;
}

static gboolean bad_role(Cfg *c, const char *role, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vbad(c, used_name(c, role), role, fmt, ap);
    va_end(ap);
    return FALSE;
}

/* A JSON value in words, for messages. */
static char *describe(JsonNode *v)
{
    switch (JSON_NODE_TYPE(v)) {
    case JSON_NODE_OBJECT:
        return g_strdup("an object");
    case JSON_NODE_ARRAY:
        return g_strdup("an array");
    case JSON_NODE_NULL:
        return g_strdup("null");
    default:
        break;
    }
    GType t = json_node_get_value_type(v);
    if (t == G_TYPE_BOOLEAN)
        return g_strdup(json_node_get_boolean(v) ? "true" : "false");
    if (t == G_TYPE_STRING)
        return g_strdup_printf("the string \"%.40s\"", json_node_get_string(v));
    if (t == G_TYPE_DOUBLE) {
        double x = json_node_get_double(v);
        /* 4096.0: said with its fraction, which makes it no integer */
        return isfinite(x) && x == floor(x) && fabs(x) < 1e15 ? g_strdup_printf("%.1f", x)
                                                              : g_strdup_printf("%g", x);
    }
    if (t == G_TYPE_INT64)
        return g_strdup_printf("%" G_GINT64_FORMAT, json_node_get_int(v));
    return g_strdup("a value of another type");
}

enum {
    OPTIONAL = 0,
    REQUIRED = 1, /* a size of the model: absent is refused (naming every size absent) */
    NULLABLE = 2, /* null is Transformers' None, which has a meaning for the field (*out = 0) */
};

/* The first of `names` the config has, with its node; NULL if none. The name is recorded
 * under the field's common name `role` (NULL: names[0]) for later messages. */
static const char *member(Cfg *c, const char *const *names, const char *role, JsonNode **v)
{
    for (const char *const *n = names; *n; n++)
        if (json_object_has_member(c->o, *n)) {
            *v = json_object_get_member(c->o, *n);
            g_hash_table_insert(c->used, (gpointer)(role ? role : names[0]), (gpointer)*n);
            return *n;
        }
    return NULL;
}

/* The field's text if it holds an integer beyond 64 bits (which json-glib wraps silently). */
static const char *huge_literal(Cfg *c, const char *name)
{
    if (!c->huge)
        return NULL;
    g_autofree char *path = g_strconcat(c->prefix, name, NULL);
    return g_hash_table_lookup(c->huge, path);
}

static void note_missing(Cfg *c, const char *const *names)
{
    g_string_append_printf(c->missing, "%s'%s%s'", c->missing->len ? ", " : "", c->prefix,
                           names[0]);
    for (const char *const *n = names + 1; *n; n++)
        g_string_append_printf(c->missing, " (or '%s%s')", c->prefix, *n);
}

/* An integer field in [1, b->hi], under the first of its alias `names` present: `def` when
 * absent (noted as missing when REQUIRED), 0 for null when NULLABLE. */
static gboolean get_int(Cfg *c, const char *const *names, const char *role, int flags,
                        int64_t def, const Bound *b, int64_t *out)
{
    JsonNode *v = NULL;
    const char *n = member(c, names, role, &v);
    *out = def;
    if (!n) {
        if (flags & REQUIRED)
            note_missing(c, names);
        return TRUE;
    }
    const char *lit = huge_literal(c, n);
    if (lit && lit[0] == '-')
        return bad_as(c, n, role, "must be a positive integer (got %s)", lit);
    if (lit)
        return bad_as(c, n, role,
                      "%s is too large: beyond 64-bit integers, and memsim takes at most "
                      "%" G_GINT64_FORMAT " (%s)",
                      lit, b->hi, b->why);
    if (JSON_NODE_HOLDS_NULL(v) && (flags & NULLABLE)) {
        *out = 0;
        return TRUE;
    }
    if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_INT64) {
        g_autofree char *d = describe(v);
        return bad_as(c, n, role, "expected an integer from 1 to %" G_GINT64_FORMAT ", got %s",
                      b->hi, d);
    }
    int64_t x = json_node_get_int(v);
    if (x < 1)
        return bad_as(c, n, role, "must be a positive integer (got %" G_GINT64_FORMAT ")", x);
    if (x > b->hi)
        return bad_as(c, n, role,
                      "%" G_GINT64_FORMAT " is too large: memsim takes at most %" G_GINT64_FORMAT
                      " (%s)",
                      x, b->hi, b->why);
    *out = x;
    return TRUE;
}

/* The ranges of the floating-point fields. */
typedef enum {
    R_PROB,     /* a probability: [0, 1] */
    R_FRACTION, /* (0, 1] */
    R_POSITIVE, /* (0, inf) */
} Range;

static const char *const range_words[] = {"a probability in [0, 1]", "a fraction in (0, 1]",
                                          "a positive number"};

/* A number field (integer or not), finite and within `r`; `def` when absent. */
static gboolean get_double(Cfg *c, const char *name, double def, Range r, double *out)
{
    *out = def;
    if (!json_object_has_member(c->o, name))
        return TRUE;
    JsonNode *v = json_object_get_member(c->o, name);
    const char *lit = huge_literal(c, name);
    if (lit)
        return bad(c, name, "expected %s, got %s", range_words[r], lit);
    if (!JSON_NODE_HOLDS_VALUE(v) || (json_node_get_value_type(v) != G_TYPE_DOUBLE &&
                                      json_node_get_value_type(v) != G_TYPE_INT64)) {
        g_autofree char *d = describe(v);
        return bad(c, name, "expected %s, got %s", range_words[r], d);
    }
    double x = json_node_get_double(v);
    bool ok = isfinite(x) && (r == R_PROB       ? x >= 0.0 && x <= 1.0
                              : r == R_FRACTION ? x > 0.0 && x <= 1.0
                                                : x > 0.0);
    if (!ok)
        return bad(c, name, "expected %s, got %g", range_words[r], x);
    *out = x;
    return TRUE;
}

static gboolean get_bool(Cfg *c, const char *name, bool def, bool *out)
{
    *out = def;
    if (!json_object_has_member(c->o, name))
        return TRUE;
    JsonNode *v = json_object_get_member(c->o, name);
    if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_BOOLEAN) {
        g_autofree char *d = describe(v);
        return bad(c, name, "expected true or false, got %s", d);
    }
    *out = json_node_get_boolean(v);
    return TRUE;
}

/* A string field under the first of `names` present; `def` when absent. */
static gboolean get_str(Cfg *c, const char *const *names, const char *def, char *out, gsize len)
{
    JsonNode *v = NULL;
    const char *n = member(c, names, NULL, &v);
    if (!n) {
        g_strlcpy(out, def, len);
        return TRUE;
    }
    if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_STRING) {
        g_autofree char *d = describe(v);
        return bad(c, n, "expected a string, got %s", d);
    }
    const char *s = json_node_get_string(v);
    if (strlen(s) >= len)
        return bad(c, n, "'%.40s…' is longer than any name memsim knows", s);
    g_strlcpy(out, s, len);
    return TRUE;
}

/* The activations the generator models (act() in traces/models.c), as Transformers' ACT2FN
 * names them; any other is refused rather than simulated as something else. */
static const char *const activations[] = {"gelu",          "gelu_new", "gelu_fast",
                                          "gelu_accurate", "gelu_pytorch_tanh", "relu",
                                          "silu",          "swish",    NULL};

static gboolean get_act(Cfg *c, const char *const *names, const char *def, char *out, gsize len)
{
    if (!get_str(c, names, def, out, len))
        return FALSE;
    if (g_strv_contains(activations, out))
        return TRUE;
    g_autofree char *known = g_strjoinv(", ", (char **)activations);
    JsonNode *v = NULL;
    return bad(c, member(c, names, NULL, &v), "unknown activation '%s' (memsim models: %s)", out,
               known);
}

#define N(...) ((const char *const[]){__VA_ARGS__, NULL})
#define INT(names, role, flags, def, bound, out) get_int(c, names, role, flags, def, bound, out)
#define PROB(name, def, out) get_double(c, name, def, R_PROB, out)
#define BOOL(name, def, out) get_bool(c, name, def, out)

/* ---- the model's size, every product and sum checked ---- */

/* Products and sums of sizes (none negative) that saturate at INT64_MAX instead of wrapping,
 * so that a size past 64 bits still compares as the largest. */
typedef struct {
    bool over; /* a product or a sum went past 64 bits */
} Ck;

/* The product (mul) or the sum of v[0..n). */
static int64_t ck_fold(Ck *k, const int64_t *v, gsize n, bool mul)
{
    int64_t r = mul ? 1 : 0;
    for (gsize i = 0; i < n; i++)
        if (mul ? __builtin_mul_overflow(r, v[i], &r) : __builtin_add_overflow(r, v[i], &r)) {
            k->over = true;
            r = INT64_MAX;
        }
    return r;
}

#define CK_ARGS(...)                                                                           \
    (const int64_t[]){__VA_ARGS__}, sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)
#define P(...) ck_fold(&k, CK_ARGS(__VA_ARGS__), true)
#define S(...) ck_fold(&k, CK_ARGS(__VA_ARGS__), false)

typedef struct {
    int64_t params;  /* tied weights counted once */
    int64_t layers;  /* the parameters of the layers */
    int64_t other;   /* embeddings, final norm, head */
    int64_t buffers; /* bytes of the registered buffers that grow with the context */
    int64_t inactive; /* a mixture of experts: the routed experts a token does not use */
} Size;

/* The layers with routed experts (the others have the dense MLP): DeepSeek's first
 * first_k_dense_replace layers are dense (DeepseekV3DecoderLayer: layer_idx >=
 * first_k_dense_replace); Qwen2-MoE's layer l is sparse when (l + 1) % decoder_sparse_step
 * == 0 (Qwen2MoeDecoderLayer). */
gboolean model_layer_is_moe(const MemsimModel *m, int64_t l)
{
    if (m->fam != FAM_MIXTRAL || l < m->first_dense)
        return FALSE;
    return m->moe_every <= 1 || (l + 1) % m->moe_every == 0;
}

/* The layer types of the configuration classes: Mistral's and Mixtral's layers all slide when
 * sliding_window is set; Qwen2Config's layer_types slide from max_window_layers on (with
 * use_sliding_window); Gemma2Config's every even layer, Gemma3TextConfig's all but every
 * sliding_window_pattern-th. */
gboolean model_layer_is_sliding(const MemsimModel *m, int64_t l)
{
    if ((m->fam != FAM_LLAMA && m->fam != FAM_MIXTRAL) || !m->sliding_window || l < m->sw_from)
        return FALSE;
    return m->sw_pattern == 0 || (l + 1) % m->sw_pattern != 0;
}

static int64_t model_moe_layers(const MemsimModel *m)
{
    int64_t n = 0;
    for (int64_t l = 0; l < m->L; l++)
        n += model_layer_is_moe(m, l);
    return n;
}

/* FALSE if a count goes past 64 bits (it is then INT64_MAX). */
static gboolean model_size(const MemsimModel *m, Size *z)
{
    Ck k = {false};
    int64_t H = m->H, V = m->V, I = m->I, L = m->L, nh = m->nh, nkv = m->nkv, hd = m->hd;
    int64_t per_layer = 0, other = 0, buffers = 0;
    z->inactive = 0;
    switch (m->fam) {
    case FAM_LLAMA:
    case FAM_MIXTRAL: {
        int64_t attn;
        if (m->kv_lora) {
            /* DeepseekV2Attention / DeepseekV3Attention (multi-head latent attention):
             * q_a_proj, q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa,
             * kv_a_layernorm, kv_b_proj, o_proj; attention_bias on q_a, kv_a and o */
            int64_t q = m->q_lora ? S(P(H, m->q_lora), m->q_lora, P(m->q_lora, nh, hd))
                                  : P(H, nh, hd);
            attn = S(q, P(H, S(m->kv_lora, m->qk_rope)), m->kv_lora,
                     P(m->kv_lora, nh, S(m->qk_nope, m->v_hd)), P(nh, m->v_hd, H),
                     m->qkv_bias ? S(m->q_lora, m->kv_lora, m->qk_rope, H) : 0);
        } else {
            attn = S(P(H, nh, hd), P(2, H, nkv, hd), P(nh, hd, H),
                     m->qkv_bias ? S(P(nh, hd), P(2, nkv, hd)) : 0, m->o_bias ? H : 0,
                     m->qk_norm == 1 ? P(2, hd) : m->qk_norm == 2 ? P(S(nh, nkv), hd) : 0);
        }
        int64_t dense = m->plain_mlp ? S(P(2, H, I), m->mlp_bias ? S(I, H) : 0)
                                     : S(P(3, H, I), m->mlp_bias ? S(P(2, I), H) : 0);
        /* OlmoLayerNorm has no parameters */
        int64_t norms = m->np_norms ? 0 : P(m->sandwich ? 4 : 2, m->ln_norms ? 2 : 1, H);
        int64_t n_moe = m->fam == FAM_MIXTRAL ? model_moe_layers(m) : 0;
        int64_t moe = 0;
        if (n_moe) {
            int64_t EI = m->moe_I ? m->moe_I : I;
            /* DeepSeek-V3's e_score_correction_bias is a buffer, not a parameter (it is in the
             * checkpoint, not in model.parameters()) */
            moe = S(P(m->n_experts, 3, H, EI), P(m->n_experts, H), P(3, H, m->shared_I),
                    m->shared_gate ? H : 0);
            z->inactive = P(n_moe, m->n_experts - m->top_k, 3, H, EI);
        }
        per_layer = 0;
        z->layers = S(P(S(attn, norms), L), P(n_moe, moe), P(L - n_moe, dense));
        other = S(P(V, H), m->np_norms ? 0 : m->ln_norms ? P(2, H) : H, m->tie ? 0 : P(V, H));
        break;
    }
    case FAM_GPT2:
        per_layer = S(P(4, H), P(H, 3, H), P(3, H), P(H, H), H, P(H, I), I, P(I, H), H);
        other = S(P(V, H), P(m->max_pos, H), P(2, H), m->tie ? 0 : P(V, H));
        break;
    case FAM_OPT: {
        int64_t b = m->qkv_bias ? 1 : 0;
        per_layer = S(P(4, S(P(H, H), P(b, H))), P(4, H), P(I, H), P(b, I), P(H, I), P(b, H));
        other = S(P(V, m->wep), P(S(m->max_pos, 2), H), m->tie ? 0 : P(V, m->wep));
        if (m->wep != H)
            other = S(other, P(2, H, m->wep));
        if (m->pre_ln)
            other = S(other, P(2, H));
        break;
    }
    case FAM_BLOOM:
        per_layer = S(P(4, H), P(3, H, H), P(3, H), P(H, H), H, P(4, H, H), P(4, H), P(4, H, H), H);
        other = S(P(V, H), P(4, H), m->tie ? 0 : P(V, H));
        break;
    case FAM_NEOX: {
        int64_t b = m->qkv_bias ? 1 : 0;
        per_layer = S(P(4, H), P(3, H, H), P(b, 3, H), P(H, H), P(b, H), P(I, H), I, P(H, I), H);
        other = S(P(V, H), P(2, H), m->tie ? 0 : P(V, H));
        break;
    }
    case FAM_FALCON: {
        int64_t qkv = m->falcon_new_arch ? P(S(P(2, nkv), nh), hd)
                      : nkv == 1         ? S(H, P(2, hd))
                                         : P(3, H);
        int64_t b = m->qkv_bias ? 1 : 0;
        int64_t norms = m->falcon_new_arch ? P(4, H) : m->parallel_residual ? P(2, H) : P(4, H);
        per_layer = S(P(qkv, H), P(b, qkv), P(H, H), P(b, H), P(I, H), P(b, I), P(H, I), P(b, H),
                      norms);
        other = S(P(V, H), P(2, H), m->tie ? 0 : P(V, H));
        break;
    }
    case FAM_GPTNEO:
        per_layer = S(P(4, H), P(3, H, H), P(H, H), H, P(I, H), I, P(H, I), H);
        other = S(P(V, H), P(m->max_pos, H), P(2, H), m->tie ? 0 : P(V, H));
        /* each layer's causal-mask buffer: bool [max_pos, max_pos] */
        buffers = P(L, m->max_pos, m->max_pos);
        break;
    case FAM_CODEGEN:
        per_layer = S(P(2, H), P(3, H, H), P(H, H), P(I, H), I, P(H, I), H);
        other = S(P(V, H), P(2, H), m->tie ? 0 : S(P(V, H), V));
        /* each layer's fp32 sinusoid table [max_pos, rotary_dim] */
        buffers = P(L, m->max_pos, m->rotary_dim, 4);
        break;
    case FAM_MEGATRON: {
        /* GPTModel (megatron/core/models/gpt): norms with a bias unless RMSNorm; the fused
         * QKV [(nh + 2 nkv) hd, H]; fc1 twice as wide with SwiGLU; biases unless
         * --disable-bias-linear; the vocabulary padded (mg_padded_vocab at tp 1) */
        const MgOptions *o = m->mg;
        int64_t nv = o->rms_norm ? 1 : 2; /* vectors per norm */
        int64_t b = m->mlp_bias ? 1 : 0;
        int64_t qkv = P(S(nh, P(2, nkv)), hd);
        int64_t fc1 = o->swiglu ? P(2, I) : I;
        per_layer = S(P(2, nv, H), P(qkv, H), P(b, qkv), P(H, nh, hd), P(b, H), P(fc1, H),
                      P(b, fc1), P(H, I), P(b, H), o->qk_norm ? P(2, nv, hd) : 0);
        int64_t Vp = mg_padded_vocab(o, 1);
        other = S(P(Vp, H), o->pos == MG_POS_LEARNED ? P(m->max_pos, H) : 0, P(nv, H),
                  m->tie ? 0 : P(Vp, H));
        break;
    }
    default:
        g_assert_not_reached();
    }
    if (m->fam != FAM_LLAMA && m->fam != FAM_MIXTRAL)
        z->layers = P(per_layer, L);
    z->other = other;
    z->params = S(z->layers, other);
    z->buffers = buffers;
    return !k.over;
}

#undef P
#undef S

/* ---- the families ---- */

static const struct {
    const char *type;
    Family fam;
} types[] = {
    {"llama", FAM_LLAMA},     {"mistral", FAM_LLAMA},   {"qwen2", FAM_LLAMA},
    {"gpt2", FAM_GPT2},       {"opt", FAM_OPT},         {"bloom", FAM_BLOOM},
    {"gpt_neox", FAM_NEOX},   {"falcon", FAM_FALCON},   {"gpt_neo", FAM_GPTNEO},
    {"codegen", FAM_CODEGEN}, {"mixtral", FAM_MIXTRAL},
    /* Llama-derived decoders, each read by read_modern */
    {"qwen3", FAM_LLAMA},     {"olmo2", FAM_LLAMA},     {"phi3", FAM_LLAMA},
    {"gemma", FAM_LLAMA},     {"gemma2", FAM_LLAMA},    {"gemma3_text", FAM_LLAMA},
    {"qwen2_moe", FAM_MIXTRAL}, {"qwen3_moe", FAM_MIXTRAL},
    {"deepseek_v2", FAM_MIXTRAL}, {"deepseek_v3", FAM_MIXTRAL}, {"starcoder2", FAM_LLAMA},
    {"olmo", FAM_LLAMA},
};

static const char *family_names[FAM_COUNT] = {"llama", "gpt2",   "opt",     "bloom",  "gpt_neox",
                                              "falcon", "gpt_neo", "codegen", "mixtral",
                                              "megatron"};

static gboolean family_of(const char *type, Family *fam)
{
    for (gsize i = 0; i < G_N_ELEMENTS(types); i++)
        if (strcmp(types[i].type, type) == 0) {
            *fam = types[i].fam;
            return TRUE;
        }
    return FALSE;
}

static char *known_types(void)
{
    GString *k = g_string_new(NULL);
    for (gsize i = 0; i < G_N_ELEMENTS(types); i++)
        g_string_append_printf(k, "%s%s", i ? ", " : "", types[i].type);
    return g_string_free(k, FALSE);
}

/* rope_scaling / rope_parameters types Transformers' ROPE_INIT_FUNCTIONS know
 * (modeling_rope_utils.py): each changes only how inv_freq and attention_scaling are
 * computed at init (HF_MODELS.md §2.5), not the forward's tensors. */
static const char *const rope_types[] = {"default", "linear", "dynamic", "yarn", "longrope",
                                         "llama3",  "mrope",  "su",      "proportional", NULL};

/* One rope object's type (rope_type, or the legacy type): a type memsim does not know is
 * said, with what was assumed. */
static gboolean check_rope_type(Cfg *c, JsonObject *o, const char *path)
{
    const char *tk = json_object_has_member(o, "rope_type") ? "rope_type"
                     : json_object_has_member(o, "type")    ? "type"
                                                            : NULL;
    if (!tk)
        return TRUE;
    JsonNode *t = json_object_get_member(o, tk);
    if (!JSON_NODE_HOLDS_VALUE(t) || json_node_get_value_type(t) != G_TYPE_STRING) {
        g_autofree char *d = describe(t);
        g_autofree char *f = g_strdup_printf("%s.%s", path, tk);
        return bad(c, f, "expected a string, got %s", d);
    }
    const char *type = json_node_get_string(t);
    if (!g_strv_contains(rope_types, type)) {
        g_autofree char *known = g_strjoinv(", ", (char **)rope_types);
        fprintf(stderr,
                "memsim: %s: field '%s%s.%s': rope type '%.40s' is not one memsim knows "
                "(%s); assumed, as for those, that it changes only the values of the "
                "rotary frequencies (the same tensors: inv_freq, cos and sin)\n",
                c->file, c->prefix, path, tk, type, known);
    }
    return TRUE;
}

/* A rope_scaling (legacy) or rope_parameters object, and rope_parameters' objects per layer
 * type. */
static gboolean check_rope(Cfg *c)
{
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    for (gsize i = 0; i < G_N_ELEMENTS(keys); i++) {
        if (!json_object_has_member(c->o, keys[i]))
            continue;
        JsonNode *v = json_object_get_member(c->o, keys[i]);
        if (JSON_NODE_HOLDS_NULL(v))
            continue;
        if (!JSON_NODE_HOLDS_OBJECT(v)) {
            g_autofree char *d = describe(v);
            return bad(c, keys[i], "expected an object or null, got %s", d);
        }
        JsonObject *o = json_node_get_object(v);
        /* rope_parameters per layer type (Gemma 3, and the configs of Transformers v5: one
         * object for "full_attention", one for "sliding_attention") are each checked */
        static const char *const layer_types[] = {"full_attention", "sliding_attention"};
        for (gsize j = 0; j < G_N_ELEMENTS(layer_types); j++) {
            JsonNode *lv = json_object_get_member(o, layer_types[j]);
            if (!lv || JSON_NODE_HOLDS_NULL(lv))
                continue;
            g_autofree char *path = g_strdup_printf("%s.%s", keys[i], layer_types[j]);
            if (!JSON_NODE_HOLDS_OBJECT(lv)) {
                g_autofree char *d = describe(lv);
                return bad(c, path, "expected an object or null, got %s", d);
            }
            if (!check_rope_type(c, json_node_get_object(lv), path))
                return FALSE;
        }
        if (!check_rope_type(c, o, keys[i]))
            return FALSE;
    }
    return TRUE;
}

/* Gemma 2's and Gemma 3's layer_types (Gemma2Config, Gemma3TextConfig: one of
 * "sliding_attention", "full_attention" per layer; the newer configs write it instead of, or
 * beside, sliding_window_pattern): taken when it is the layers' arrangement with one full layer
 * every p (p from its first full layer), the form memsim models; any other is refused. */
static gboolean read_layer_types(Cfg *c, MemsimModel *m)
{
    JsonNode *v = json_object_get_member(c->o, "layer_types");
    if (!v || JSON_NODE_HOLDS_NULL(v))
        return TRUE;
    JsonArray *a = JSON_NODE_HOLDS_ARRAY(v) ? json_node_get_array(v) : NULL;
    if (!a || (int64_t)json_array_get_length(a) != m->L) {
        g_autofree char *d = describe(v);
        return bad(c, "layer_types",
                   "expected a list of %" G_GINT64_FORMAT " layer types "
                   "(num_hidden_layers), got %s",
                   m->L, d);
    }
    int64_t first_full = -1;
    for (guint l = 0; l < json_array_get_length(a); l++) {
        JsonNode *e = json_array_get_element(a, l);
        const char *s = JSON_NODE_HOLDS_VALUE(e) && json_node_get_value_type(e) == G_TYPE_STRING
                            ? json_node_get_string(e)
                            : NULL;
        if (!s || (strcmp(s, "sliding_attention") != 0 && strcmp(s, "full_attention") != 0)) {
            g_autofree char *d = describe(e);
            return bad(c, "layer_types",
                       "entry %u: expected \"sliding_attention\" or "
                       "\"full_attention\", got %s",
                       l, d);
        }
        if (first_full < 0 && strcmp(s, "full_attention") == 0)
            first_full = l;
    }
    m->sw_pattern = first_full < 0 ? 0 : (int)(first_full + 1);
    if (!m->sliding_window && first_full != 0)
        return bad(c, "layer_types", "sliding layers without a sliding_window");
    for (guint l = 0; l < json_array_get_length(a); l++) {
        bool full = strcmp(json_array_get_string_element(a, l), "full_attention") == 0;
        if (m->sliding_window && full == (bool)model_layer_is_sliding(m, l))
            return bad(c, "layer_types",
                       "layer %u is %s: memsim models one full-attention "
                       "layer every %d (every layer sliding but those)",
                       l, full ? "full_attention" : "sliding_attention", m->sw_pattern);
    }
    return TRUE;
}

/* A nullable positive number (Gemma 2's softcaps, OLMo's clip_qkv): null as 0 (none),
 * absent as `def`. */
static gboolean get_softcap(Cfg *c, const char *name, double def, double *out)
{
    if (json_object_has_member(c->o, name) &&
        JSON_NODE_HOLDS_NULL(json_object_get_member(c->o, name))) {
        *out = 0;
        return TRUE;
    }
    return get_double(c, name, def, R_POSITIVE, out);
}

/* The Llama-derived families read with their own configuration classes' defaults
 * (transformers models/<type>/configuration_<type>.py); sizes are required as for Llama. */
static gboolean read_modern(Cfg *c, MemsimModel *m, const char *type, bool strict)
{
    bool qwen3 = strcmp(type, "qwen3") == 0, olmo2 = strcmp(type, "olmo2") == 0;
    bool phi3 = strcmp(type, "phi3") == 0, gemma1 = strcmp(type, "gemma") == 0;
    bool gemma2 = strcmp(type, "gemma2") == 0, gemma3 = strcmp(type, "gemma3_text") == 0;
    bool q2moe = strcmp(type, "qwen2_moe") == 0, q3moe = strcmp(type, "qwen3_moe") == 0;
    bool ds2 = strcmp(type, "deepseek_v2") == 0, ds3 = strcmp(type, "deepseek_v3") == 0;
    bool sc2 = strcmp(type, "starcoder2") == 0, olmo = strcmp(type, "olmo") == 0;
    bool gemma = gemma1 || gemma2 || gemma3, ds = ds2 || ds3;
    g_strlcpy(m->arch, type, sizeof m->arch);
    if (gemma3)
        g_strlcpy(m->arch, "gemma3", sizeof m->arch);
    int64_t max_pos = qwen3 || q3moe ? 40960 : q2moe ? 8192 : phi3 || sc2 ? 4096
                      : gemma ? 8192 : ds3 ? 4096 : 2048;
    bool tie_def = gemma || sc2; /* Gemma's and StarCoder2's classes tie; the others do not */
    /* num_key_value_heads when absent: GemmaConfig 16, Gemma2Config 4, Gemma3TextConfig 4,
     * Qwen3MoeConfig 4, Qwen3Config 32, Qwen2MoeConfig 16; None (= heads) otherwise */
    int64_t nkv_def = gemma1 ? 16 : gemma2 || gemma3 || q3moe ? 4 : qwen3 ? 32 : q2moe ? 16 : 0;
    /* head_dim: Gemma 256, Qwen3 128 (its class default); the others H / nh */
    int64_t hd_def = gemma ? 256 : qwen3 || q3moe ? 128 : 0;
    bool ok = INT(N("vocab_size"), NULL, REQUIRED, 0, &B_VOCAB, &m->V) &&
              INT(N("hidden_size"), NULL, REQUIRED, 0, &B_HIDDEN, &m->H) &&
              INT(N("intermediate_size"), NULL, q3moe ? OPTIONAL : REQUIRED,
                  q3moe ? 6144 : 0, &B_WIDTH, &m->I) &&
              INT(N("num_hidden_layers"), NULL, REQUIRED, 0, &B_LAYERS, &m->L) &&
              INT(N("num_attention_heads"), NULL, REQUIRED, 0, &B_HEADS, &m->nh) &&
              INT(N("num_key_value_heads"), NULL, NULLABLE | (strict ? REQUIRED : 0), nkv_def,
                  &B_HEADS, &m->nkv) &&
              INT(N("head_dim"), NULL, NULLABLE, hd_def, &B_HEADS, &m->hd) &&
              INT(N("max_position_embeddings"), NULL, OPTIONAL, max_pos, &B_POS, &m->max_pos) &&
              BOOL("tie_word_embeddings", tie_def, &m->tie) &&
              BOOL("attention_bias", false, &m->qkv_bias) &&
              PROB("attention_dropout", 0.0, &m->attn_pdrop) &&
              BOOL("use_cache", true, &m->use_cache) && check_rope(c);
    if (!ok)
        return FALSE;
    m->o_bias = m->qkv_bias;
    /* Gemma's MLP reads hidden_activation (GemmaMLP: ACT2FN[config.hidden_activation]); the
     * others hidden_act */
    ok = gemma ? get_act(c, N("hidden_activation"), "gelu_pytorch_tanh", m->act, sizeof m->act)
               : get_act(c, N("hidden_act"), sc2 ? "gelu_pytorch_tanh" : "silu", m->act,
                         sizeof m->act);
    if (!ok)
        return FALSE;
    if (sc2) {
        /* Starcoder2Config / modular_starcoder2.py: nn.LayerNorm norms, use_bias on every
         * linear, c_fc/c_proj MLP, residual_dropout after o_proj and c_proj,
         * embedding_dropout after the embedding, Mistral's sliding window */
        bool bias = true;
        int64_t w = 0;
        ok = BOOL("use_bias", true, &bias) && PROB("residual_dropout", 0.0, &m->resid_pdrop) &&
             PROB("embedding_dropout", 0.0, &m->embd_pdrop) &&
             INT(N("sliding_window"), NULL, NULLABLE, 0, &B_POS, &w) &&
             get_double(c, "norm_epsilon", 1e-5, R_POSITIVE, &(double){0});
        if (!ok)
            return FALSE;
        m->qkv_bias = m->o_bias = m->mlp_bias = bias;
        m->ln_norms = m->plain_mlp = true;
        m->sliding_window = w;
    }
    if (olmo) {
        /* OlmoConfig / modular_olmo.py: OlmoLayerNorm (no parameters, eps fixed at 1e-5),
         * clip_qkv (None: no clamp) clamping q, k and v in place (OlmoAttention.forward) */
        m->np_norms = true;
        if (!get_softcap(c, "clip_qkv", 0.0, &m->clip_qkv))
            return FALSE;
    }
    if (qwen3 || q3moe || gemma3)
        m->qk_norm = 1; /* Qwen3Attention / Gemma3Attention q_norm, k_norm over head_dim */
    if (olmo2)
        m->qk_norm = 2; /* Olmo2Attention q_norm [nh·hd], k_norm [nkv·hd] */
    m->post_norms = olmo2;
    m->gemma = gemma;
    m->sandwich = gemma2 || gemma3;
    if (q2moe) {
        m->qkv_bias = true; /* Qwen2MoeAttention: q, k, v with bias, o_proj without */
        m->o_bias = false;
    }
    if (phi3) {
        m->fused_qkv = m->fused_gate_up = true;
        ok = PROB("resid_pdrop", 0.0, &m->resid_pdrop) && PROB("embd_pdrop", 0.0, &m->embd_pdrop);
        if (!ok)
            return FALSE;
        double prf = 1.0;
        if (!get_double(c, "partial_rotary_factor", 1.0, R_FRACTION, &prf))
            return FALSE;
        m->rotary_pct = prf;
    }
    if (gemma2 &&
        (!get_softcap(c, "final_logit_softcapping", 30.0, &m->final_softcap) ||
         !get_softcap(c, "attn_logit_softcapping", 50.0, &m->attn_softcap)))
        return FALSE;
    if (gemma3 &&
        (!get_softcap(c, "final_logit_softcapping", 0.0, &m->final_softcap) ||
         !get_softcap(c, "attn_logit_softcapping", 0.0, &m->attn_softcap)))
        return FALSE;
    if (gemma3) {
        /* Gemma3TextModel: rotary_emb_local, a second RotaryEmbedding on rope_local_base_freq
         * (rope_parameters["sliding_attention"] in newer configs), whose tables every forward
         * makes and the sliding layers rotate with; its base changes their values only */
        double local = 0;
        bool bidir = false;
        if (!get_double(c, "rope_local_base_freq", 10000.0, R_POSITIVE, &local) ||
            !BOOL("use_bidirectional_attention", false, &bidir))
            return FALSE;
        /* Gemma3Attention.is_causal = not use_bidirectional_attention (EmbeddingGemma): the
         * masks are built otherwise */
        if (bidir)
            return bad(c, "use_bidirectional_attention",
                       "bidirectional attention (an encoder's masks) is not modelled");
        m->rope_local = true;
    }
    if (gemma2 || gemma3) {
        /* the attention's scaling (query_pre_attn_scalar ** -0.5): a value, no tensor */
        double qpas = 0;
        if (!get_double(c, "query_pre_attn_scalar", 256.0, R_POSITIVE, &qpas))
            return FALSE;
        int64_t w = 0, pattern = 2;
        if (!INT(N("sliding_window"), NULL, NULLABLE, gemma3 ? 4096 : 4096, &B_POS, &w) ||
            (gemma3 && !INT(N("sliding_window_pattern"), NULL, OPTIONAL, 6, &B_LAYERS, &pattern)))
            return FALSE;
        m->sliding_window = w;
        m->sw_pattern = (int)pattern;
        if (!read_layer_types(c, m))
            return FALSE;
    }
    if (q2moe || q3moe) {
        int64_t mlp_only = 0;
        ok = INT(N("num_experts"), NULL, OPTIONAL, q2moe ? 60 : 128, &B_EXPERTS, &m->n_experts) &&
             INT(N("num_experts_per_tok"), NULL, OPTIONAL, q2moe ? 4 : 8, &B_EXPERTS, &m->top_k) &&
             INT(N("moe_intermediate_size"), NULL, REQUIRED, 0, &B_WIDTH, &m->moe_I) &&
             INT(N("decoder_sparse_step"), NULL, OPTIONAL, 1, &B_LAYERS, &m->moe_every) &&
             BOOL("norm_topk_prob", false, &m->norm_topk);
        if (ok && q2moe)
            ok = INT(N("shared_expert_intermediate_size"), NULL, REQUIRED, 0, &B_WIDTH,
                     &m->shared_I);
        if (!ok)
            return FALSE;
        m->shared_gate = q2moe;
        if (json_object_has_member(c->o, "mlp_only_layers")) {
            JsonNode *v = json_object_get_member(c->o, "mlp_only_layers");
            if (!JSON_NODE_HOLDS_ARRAY(v) || json_array_get_length(json_node_get_array(v)) > 0)
                mlp_only = 1;
        }
        if (mlp_only)
            return bad(c, "mlp_only_layers",
                       "dense layers among the sparse ones are not modelled (memsim takes an "
                       "empty list)");
    }
    if (ds) {
        int64_t shared = 0, freq = 1, q_lora = 0;
        ok = INT(N("n_routed_experts"), NULL, NULLABLE, ds3 ? 256 : 0, &B_EXPERTS,
                 &m->n_experts) &&
             INT(N("num_experts_per_tok"), NULL, NULLABLE, ds3 ? 8 : 0, &B_EXPERTS, &m->top_k) &&
             INT(N("n_shared_experts"), NULL, NULLABLE, ds3 ? 1 : 0, &B_EXPERTS, &shared) &&
             INT(N("moe_intermediate_size"), NULL, REQUIRED, 0, &B_WIDTH, &m->moe_I) &&
             INT(N("moe_layer_freq"), NULL, OPTIONAL, 1, &B_LAYERS, &freq) &&
             INT(N("kv_lora_rank"), NULL, REQUIRED, 0, &B_WIDTH, &m->kv_lora) &&
             INT(N("q_lora_rank"), NULL, NULLABLE, 1536, &B_WIDTH, &q_lora) &&
             INT(N("qk_nope_head_dim"), NULL, REQUIRED, 0, &B_HEADS, &m->qk_nope) &&
             INT(N("qk_rope_head_dim"), NULL, REQUIRED, 0, &B_HEADS, &m->qk_rope) &&
             INT(N("v_head_dim"), NULL, REQUIRED, 0, &B_HEADS, &m->v_hd) &&
             BOOL("norm_topk_prob", ds3, &m->norm_topk);
        if (!ok)
            return FALSE;
        JsonNode *fk = json_object_get_member(c->o, "first_k_dense_replace");
        if (fk && JSON_NODE_HOLDS_VALUE(fk) && json_node_get_value_type(fk) == G_TYPE_INT64 &&
            json_node_get_int(fk) == 0)
            m->first_dense = 0; /* 0 is a meaning here: no dense layer */
        else if (!INT(N("first_k_dense_replace"), NULL, OPTIONAL, ds3 ? 3 : 0, &B_LAYERS,
                      &m->first_dense))
            return FALSE;
        if (freq != 1)
            return bad(c, "moe_layer_freq",
                       "%" G_GINT64_FORMAT ": only every layer after the dense ones being "
                       "sparse (1) is modelled",
                       freq);
        if (!m->n_experts || !m->top_k)
            return bad(c, m->n_experts ? "num_experts_per_tok" : "n_routed_experts",
                       "a DeepSeek config without routed experts is not modelled");
        m->q_lora = q_lora;
        m->shared_I = shared * m->moe_I;
        m->router_bias = ds3; /* DeepseekV3TopkRouter.e_score_correction_bias */
        m->nkv = m->nh;       /* MLA: every head has its own K and V */
        m->hd = m->qk_nope + m->qk_rope;
        g_strlcpy(m->arch, ds3 ? "deepseek_v3" : "deepseek_v2", sizeof m->arch);
    }
    return TRUE;
}

/* The fields of family `fam`, with the defaults of model type `type`'s configuration class.
 * `strict`: the config is a text model read as `type` (a multimodal config's text_config of
 * another model type), whose class defaults may differ: num_key_value_heads is required too. */
static gboolean read_family(Cfg *c, MemsimModel *m, Family fam, const char *type, bool strict)
{
    m->fam = fam;
    m->rotary_pct = 1.0;
    m->pre_ln = true;
    bool ok = true;
    static const char *const modern[] = {"qwen3",       "olmo2",       "phi3",       "gemma",
                                         "gemma2",      "gemma3_text", "qwen2_moe",  "qwen3_moe",
                                         "deepseek_v2", "deepseek_v3", "starcoder2", "olmo",
                                         NULL};
    if (g_strv_contains(modern, type)) {
        if (!read_modern(c, m, type, strict))
            return FALSE;
        goto positive;
    }
    switch (m->fam) {
    case FAM_LLAMA:
    case FAM_MIXTRAL: {
        bool mistral = strcmp(type, "mistral") == 0, qwen = strcmp(type, "qwen2") == 0;
        bool mix = m->fam == FAM_MIXTRAL;
        int64_t window = 0;
        ok = INT(N("vocab_size"), NULL, REQUIRED, 0, &B_VOCAB, &m->V) &&
             INT(N("hidden_size"), NULL, REQUIRED, 0, &B_HIDDEN, &m->H) &&
             INT(N("intermediate_size"), NULL, REQUIRED, 0, &B_WIDTH, &m->I) &&
             INT(N("num_hidden_layers"), NULL, REQUIRED, 0, &B_LAYERS, &m->L) &&
             INT(N("num_attention_heads"), NULL, REQUIRED, 0, &B_HEADS, &m->nh) &&
             /* None: as many as the attention heads (set in finish) */
             INT(N("num_key_value_heads"), NULL, NULLABLE | (strict ? REQUIRED : 0),
                 (mistral || mix) ? 8 : qwen ? 32 : 0, &B_HEADS, &m->nkv) &&
             /* None: hidden_size / num_attention_heads */
             INT(N("head_dim"), NULL, NULLABLE, 0, &B_HEADS, &m->hd) &&
             INT(N("max_position_embeddings"), NULL, OPTIONAL,
                 mistral || mix ? 131072 : qwen ? 32768 : 2048, &B_POS, &m->max_pos) &&
             get_act(c, N("hidden_act"), "silu", m->act, sizeof m->act) &&
             BOOL("tie_word_embeddings", false, &m->tie) &&
             BOOL("attention_bias", false, &m->qkv_bias) &&
             BOOL("mlp_bias", false, &m->mlp_bias) &&
             PROB("attention_dropout", 0.0, &m->attn_pdrop) &&
             BOOL("use_cache", true, &m->use_cache) &&
             /* Mistral, Qwen2, Mixtral; None: no sliding window */
             (!(mistral || qwen || mix) ||
              INT(N("sliding_window"), NULL, NULLABLE, mistral || qwen ? 4096 : 0, &B_POS,
                  &window));
        if (!ok)
            return FALSE;
        m->o_bias = m->qkv_bias;
        if (qwen) {
            m->qkv_bias = true; /* Qwen2: q, k, v always have biases, o_proj none */
            m->o_bias = false;
            bool sw = false;
            if (!BOOL("use_sliding_window", false, &sw))
                return FALSE;
            m->sliding_window = sw ? window : 0;
            int64_t from = 28;
            if (sw && json_object_has_member(c->o, "max_window_layers") &&
                JSON_NODE_HOLDS_VALUE(json_object_get_member(c->o, "max_window_layers")) &&
                json_node_get_value_type(json_object_get_member(c->o, "max_window_layers")) ==
                    G_TYPE_INT64 &&
                json_object_get_int_member(c->o, "max_window_layers") == 0)
                from = 0; /* every layer slides */
            else if (sw && !INT(N("max_window_layers"), NULL, OPTIONAL, 28, &B_LAYERS, &from))
                return FALSE;
            m->sw_from = from;
        } else if (mistral || mix) {
            m->sliding_window = window;
        }
        if (mix && (!INT(N("num_local_experts", "num_experts"), "num_local_experts", OPTIONAL, 8,
                         &B_EXPERTS, &m->n_experts) ||
                    !INT(N("num_experts_per_tok"), NULL, OPTIONAL, 2, &B_EXPERTS, &m->top_k)))
            return FALSE;
        break;
    }
    case FAM_GPT2:
        ok = INT(N("vocab_size"), NULL, REQUIRED, 0, &B_VOCAB, &m->V) &&
             INT(N("n_embd", "hidden_size"), "hidden_size", REQUIRED, 0, &B_HIDDEN, &m->H) &&
             INT(N("n_layer", "num_hidden_layers"), "num_hidden_layers", REQUIRED, 0, &B_LAYERS,
                 &m->L) &&
             INT(N("n_head", "num_attention_heads"), "num_attention_heads", REQUIRED, 0, &B_HEADS,
                 &m->nh) &&
             INT(N("n_positions", "max_position_embeddings"), "max_position_embeddings",
                 OPTIONAL, 1024, &B_POS, &m->max_pos) &&
             /* None: 4 × n_embd */
             INT(N("n_inner"), "intermediate_size", NULLABLE, 0, &B_WIDTH, &m->I) &&
             get_act(c, N("activation_function"), "gelu_new", m->act, sizeof m->act) &&
             PROB("embd_pdrop", 0.1, &m->embd_pdrop) && PROB("attn_pdrop", 0.1, &m->attn_pdrop) &&
             PROB("resid_pdrop", 0.1, &m->resid_pdrop) &&
             BOOL("tie_word_embeddings", true, &m->tie) && BOOL("use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        if (!m->I)
            m->I = 4 * m->H;
        m->qkv_bias = m->o_bias = m->mlp_bias = true;
        break;
    case FAM_OPT:
        ok = INT(N("vocab_size"), NULL, REQUIRED, 0, &B_VOCAB, &m->V) &&
             INT(N("hidden_size"), NULL, REQUIRED, 0, &B_HIDDEN, &m->H) &&
             INT(N("num_hidden_layers"), NULL, REQUIRED, 0, &B_LAYERS, &m->L) &&
             INT(N("num_attention_heads"), NULL, REQUIRED, 0, &B_HEADS, &m->nh) &&
             INT(N("ffn_dim"), "intermediate_size", REQUIRED, 0, &B_WIDTH, &m->I) &&
             INT(N("max_position_embeddings"), NULL, OPTIONAL, 2048, &B_POS, &m->max_pos) &&
             /* None: hidden_size */
             INT(N("word_embed_proj_dim"), NULL, NULLABLE, 0, &B_HIDDEN, &m->wep) &&
             BOOL("do_layer_norm_before", true, &m->pre_ln) &&
             get_act(c, N("activation_function"), "relu", m->act, sizeof m->act) &&
             PROB("dropout", 0.1, &m->resid_pdrop) &&
             PROB("attention_dropout", 0.0, &m->attn_pdrop) &&
             BOOL("enable_bias", true, &m->qkv_bias) &&
             BOOL("tie_word_embeddings", true, &m->tie) && BOOL("use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        m->o_bias = m->mlp_bias = m->qkv_bias;
        if (!m->wep)
            m->wep = m->H;
        break;
    case FAM_BLOOM:
        ok = INT(N("vocab_size"), NULL, REQUIRED, 0, &B_VOCAB, &m->V) &&
             INT(N("n_embed", "hidden_size"), "hidden_size", REQUIRED, 0, &B_HIDDEN, &m->H) &&
             INT(N("n_layer", "num_hidden_layers"), "num_hidden_layers", REQUIRED, 0, &B_LAYERS,
                 &m->L) &&
             INT(N("n_head", "num_attention_heads"), "num_attention_heads", REQUIRED, 0, &B_HEADS,
                 &m->nh) &&
             PROB("hidden_dropout", 0.0, &m->resid_pdrop) &&
             PROB("attention_dropout", 0.0, &m->attn_pdrop) &&
             BOOL("tie_word_embeddings", true, &m->tie) && BOOL("use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        m->I = 4 * m->H;
        m->qkv_bias = m->o_bias = m->mlp_bias = true;
        g_strlcpy(m->act, "bloom_gelu", sizeof m->act);
        break;
    case FAM_NEOX: {
        double pct = 0.25;
        ok = INT(N("vocab_size"), NULL, REQUIRED, 0, &B_VOCAB, &m->V) &&
             INT(N("hidden_size"), NULL, REQUIRED, 0, &B_HIDDEN, &m->H) &&
             INT(N("num_hidden_layers"), NULL, REQUIRED, 0, &B_LAYERS, &m->L) &&
             INT(N("num_attention_heads"), NULL, REQUIRED, 0, &B_HEADS, &m->nh) &&
             INT(N("intermediate_size"), NULL, REQUIRED, 0, &B_WIDTH, &m->I) &&
             INT(N("max_position_embeddings"), NULL, OPTIONAL, 2048, &B_POS, &m->max_pos) &&
             get_act(c, N("hidden_act"), "gelu", m->act, sizeof m->act) &&
             PROB("attention_dropout", 0.0, &m->attn_pdrop) &&
             PROB("hidden_dropout", 0.0, &m->resid_pdrop) &&
             BOOL("tie_word_embeddings", false, &m->tie) &&
             BOOL("use_parallel_residual", true, &m->parallel_residual) &&
             BOOL("attention_bias", true, &m->qkv_bias) && BOOL("use_cache", true, &m->use_cache) &&
             /* partial_rotary_factor, the newer name, wins over rotary_pct */
             get_double(c, "rotary_pct", 0.25, R_FRACTION, &pct) &&
             get_double(c, "partial_rotary_factor", pct, R_FRACTION, &m->rotary_pct);
        if (!ok)
            return FALSE;
        m->o_bias = m->qkv_bias;
        m->mlp_bias = true;
        break;
    }
    case FAM_FALCON: {
        bool mq = true, alibi = false, bias = false, par = true;
        int64_t ffn = 0, kv = 0;
        ok = INT(N("vocab_size"), NULL, REQUIRED, 0, &B_VOCAB, &m->V) &&
             INT(N("n_embed", "hidden_size"), "hidden_size", REQUIRED, 0, &B_HIDDEN, &m->H) &&
             INT(N("num_hidden_layers", "n_layer"), "num_hidden_layers", REQUIRED, 0, &B_LAYERS,
                 &m->L) &&
             INT(N("num_attention_heads", "n_head"), "num_attention_heads", REQUIRED, 0, &B_HEADS,
                 &m->nh) &&
             /* None: as many as the attention heads */
             INT(N("num_kv_heads", "n_head_kv"), "num_key_value_heads", NULLABLE, 0, &B_HEADS,
                 &kv) &&
             /* None: 4 × hidden_size */
             INT(N("ffn_hidden_size"), "intermediate_size", NULLABLE, 0, &B_WIDTH, &ffn) &&
             BOOL("multi_query", true, &mq) && BOOL("alibi", false, &alibi) &&
             BOOL("new_decoder_architecture", false, &m->falcon_new_arch) &&
             BOOL("parallel_attn", true, &par) && BOOL("bias", false, &bias) &&
             INT(N("max_position_embeddings"), NULL, OPTIONAL, 2048, &B_POS, &m->max_pos) &&
             BOOL("tie_word_embeddings", true, &m->tie) && BOOL("use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        if (alibi)
            return bad(c, "alibi", "ALiBi Falcon models are not modelled yet");
        m->I = ffn ? ffn : 4 * m->H;
        if (m->falcon_new_arch)
            m->nkv = kv ? kv : m->nh;
        else
            m->nkv = mq ? 1 : m->nh;
        m->parallel_residual = par || m->falcon_new_arch;
        m->qkv_bias = m->o_bias = m->mlp_bias = bias;
        g_strlcpy(m->act, "gelu", sizeof m->act);
        break;
    }
    case FAM_GPTNEO:
        ok = INT(N("vocab_size"), NULL, REQUIRED, 0, &B_VOCAB, &m->V) &&
             INT(N("hidden_size"), NULL, REQUIRED, 0, &B_HIDDEN, &m->H) &&
             INT(N("num_layers", "num_hidden_layers"), "num_hidden_layers", REQUIRED, 0,
                 &B_LAYERS, &m->L) &&
             INT(N("num_heads", "num_attention_heads"), "num_attention_heads", REQUIRED, 0,
                 &B_HEADS, &m->nh) &&
             /* None: 4 × hidden_size */
             INT(N("intermediate_size"), NULL, NULLABLE, 0, &B_WIDTH, &m->I) &&
             INT(N("max_position_embeddings"), NULL, OPTIONAL, 2048, &B_POS, &m->max_pos) &&
             INT(N("window_size"), NULL, OPTIONAL, 256, &B_POS, &m->sliding_window) &&
             get_act(c, N("activation_function"), "gelu_new", m->act, sizeof m->act) &&
             PROB("embed_dropout", 0.0, &m->embd_pdrop) &&
             PROB("attention_dropout", 0.0, &m->attn_pdrop) &&
             PROB("resid_dropout", 0.0, &m->resid_pdrop) &&
             BOOL("tie_word_embeddings", true, &m->tie) && BOOL("use_cache", true, &m->use_cache);
        if (!ok)
            return FALSE;
        if (!m->I)
            m->I = 4 * m->H;
        m->o_bias = m->mlp_bias = true;
        break;
    case FAM_CODEGEN:
        ok = INT(N("vocab_size"), NULL, REQUIRED, 0, &B_VOCAB, &m->V) &&
             INT(N("n_embd", "hidden_size"), "hidden_size", REQUIRED, 0, &B_HIDDEN, &m->H) &&
             INT(N("n_layer", "num_hidden_layers"), "num_hidden_layers", REQUIRED, 0, &B_LAYERS,
                 &m->L) &&
             INT(N("n_head", "num_attention_heads"), "num_attention_heads", REQUIRED, 0, &B_HEADS,
                 &m->nh) &&
             INT(N("n_positions", "max_position_embeddings"), "max_position_embeddings",
                 OPTIONAL, 2048, &B_POS, &m->max_pos) &&
             INT(N("rotary_dim"), NULL, OPTIONAL, 64, &B_HEADS, &m->rotary_dim) &&
             /* None: 4 × n_embd */
             INT(N("n_inner"), "intermediate_size", NULLABLE, 0, &B_WIDTH, &m->I) &&
             get_act(c, N("activation_function"), "gelu_new", m->act, sizeof m->act) &&
             PROB("embd_pdrop", 0.0, &m->embd_pdrop) && PROB("attn_pdrop", 0.0, &m->attn_pdrop) &&
             PROB("resid_pdrop", 0.0, &m->resid_pdrop) &&
             BOOL("tie_word_embeddings", false, &m->tie) && BOOL("use_cache", true, &m->use_cache);
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
    if ((m->fam == FAM_LLAMA || m->fam == FAM_MIXTRAL) && !check_rope(c))
        return FALSE;
positive:;
    /* fields no size depends on, checked where given: Transformers fails on these too */
    static const char *const positive[] = {"rope_theta", "rotary_emb_base", "rms_norm_eps",
                                           "layer_norm_eps", "layer_norm_epsilon"};
    for (gsize i = 0; i < G_N_ELEMENTS(positive); i++) {
        double unused;
        if (!get_double(c, positive[i], 1.0, R_POSITIVE, &unused))
            return FALSE;
    }
    return TRUE;
}

/* The values derived from others, the checks across fields, the sizes missing, and the
 * bounds on the model's bytes and work. The checks between fields given come before the
 * message naming the sizes missing. */
static gboolean finish(Cfg *c, MemsimModel *m, const char *type)
{
    if (!m->nkv)
        m->nkv = m->nh;
    if (!m->hd && m->H && m->nh) {
        if (m->H % m->nh != 0)
            return bad_role(c, "num_attention_heads",
                            "%" G_GINT64_FORMAT " heads do not divide hidden_size %" G_GINT64_FORMAT,
                            m->nh, m->H);
        m->hd = m->H / m->nh;
    }
    if (m->nh && m->nkv && m->nh % m->nkv != 0)
        return bad_role(c, "num_key_value_heads",
                        "%" G_GINT64_FORMAT " key/value heads do not divide %" G_GINT64_FORMAT
                        " attention heads",
                        m->nkv, m->nh);
    if (m->fam == FAM_MIXTRAL && m->top_k > m->n_experts)
        return bad(c, "num_experts_per_tok",
                   "%" G_GINT64_FORMAT " experts per token, of %" G_GINT64_FORMAT
                   " experts (num_local_experts)",
                   m->top_k, m->n_experts);
    if (m->fam == FAM_CODEGEN && m->hd && m->rotary_dim > m->hd)
        return bad(c, "rotary_dim",
                   "%" G_GINT64_FORMAT " is more than head_dim %" G_GINT64_FORMAT
                   " (n_embd / n_head)",
                   m->rotary_dim, m->hd);
    if (c->missing->len) {
        g_set_error(c->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: missing %s: a %s config must give the model's sizes (memsim does not "
                    "fill them in from a default model)",
                    c->file, c->missing->str, type);
        return FALSE;
    }
    /* the layers of a rotary model rotate at least one pair of dimensions */
    if (m->fam == FAM_NEOX && (int64_t)((double)m->hd * m->rotary_pct) < 2)
        return bad(c, "rotary_pct",
                   "%g of head_dim %" G_GINT64_FORMAT " rotates no pair of dimensions",
                   m->rotary_pct, m->hd);
    /* CodeGen's attention splits q, k, v into 4 groups (mp_num = 4) */
    if (m->fam == FAM_CODEGEN && m->nh % 4 != 0)
        return bad_role(c, "num_attention_heads",
                        "CodeGen splits its heads into 4 groups: %" G_GINT64_FORMAT
                        " is not a multiple of 4",
                        m->nh);
    if (m->fam == FAM_MIXTRAL && m->L * m->n_experts > MAX_EXPERT_LAYERS)
        return bad_role(c, "num_local_experts",
                        "%" G_GINT64_FORMAT " experts in each of %" G_GINT64_FORMAT
                        " layers (num_hidden_layers) are %" G_GINT64_FORMAT
                        " expert blocks to simulate: memsim takes at most %d (layers × experts)",
                        m->n_experts, m->L, m->L * m->n_experts, MAX_EXPERT_LAYERS);
    Size z;
    bool counted = model_size(m, &z);
    int64_t bytes = INT64_MAX;
    if (counted && (__builtin_mul_overflow(z.params, 2, &bytes) ||
                    __builtin_add_overflow(bytes, z.buffers, &bytes)))
        bytes = INT64_MAX;
    if (bytes <= MAX_MODEL_BYTES)
        return TRUE;
    if (z.buffers > MAX_MODEL_BYTES / 2)
        return bad_role(c, "max_position_embeddings",
                        "%" G_GINT64_FORMAT " positions make the buffers of the %" G_GINT64_FORMAT
                        " layers (%s) more than 1 PiB (2^50 bytes), beyond any device",
                        m->max_pos, m->L,
                        m->fam == FAM_GPTNEO ? "bool [max_position_embeddings]² causal masks"
                                             : "fp32 [max_position_embeddings, rotary_dim] tables");
    GString *sizes = g_string_new(NULL);
    g_string_append_printf(sizes,
                           "%s %" G_GINT64_FORMAT ", %s %" G_GINT64_FORMAT ", %s %" G_GINT64_FORMAT
                           ", %s %" G_GINT64_FORMAT,
                           used_name(c, "vocab_size"), m->V, used_name(c, "hidden_size"), m->H,
                           used_name(c, "intermediate_size"), m->I,
                           used_name(c, "num_hidden_layers"), m->L);
    if (m->fam == FAM_MIXTRAL)
        g_string_append_printf(sizes, ", %s %" G_GINT64_FORMAT, used_name(c, "num_local_experts"),
                               m->n_experts);
    /* named after the larger part: the layers or the embeddings */
    g_autofree char *count = z.params == INT64_MAX ? g_strdup("more than 2^63")
                                                   : g_strdup_printf("%.3g", (double)z.params);
    bad_role(c, z.layers >= z.other ? "num_hidden_layers" : "vocab_size",
             "the model is too large: %s parameters (%s) take more than 1 PiB (2^50 bytes) at "
             "2 bytes each, beyond any device",
             count, sizes->str);
    g_string_free(sizes, TRUE);
    return FALSE;
}

/* A multimodal config's text model, under text_config, of a model type memsim models
 * directly, or read as another: */
static const struct {
    const char *type, *as;
} towers[] = {
    {"mllama_text_model", "llama"}, /* Llama 3.2 Vision (without cross-attention layers) */
    {"qwen2_vl_text", "qwen2"},     /* Qwen2-VL, Qwen2.5-VL: Qwen2 with multimodal rotary */
    {"qwen2_5_vl_text", "qwen2"},
};

/* Qwen2-VL's and Qwen2.5-VL's text model: Qwen2's decoder whose attention rotates with the
 * multimodal rotary (modeling_qwen2_vl.py Qwen2VLRotaryEmbedding, apply_multimodal_rotary_pos_emb:
 * rope_scaling / rope_parameters "mrope_section", three widths that split each half of the
 * rotary dimension among the temporal, height and width grids). Its layout in memory does not
 * depend on the split, only that the widths cover half the head dimension, which is checked:
 * Transformers' products with q and k would fail otherwise. `sec` gets the widths as text (or
 * says they were not given). */
static bool has_mrope(Cfg *c)
{
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    for (gsize i = 0; i < G_N_ELEMENTS(keys); i++) {
        JsonNode *v = json_object_get_member(c->o, keys[i]);
        if (v && JSON_NODE_HOLDS_OBJECT(v) &&
            json_object_has_member(json_node_get_object(v), "mrope_section"))
            return true;
    }
    return false;
}

static gboolean read_mrope(Cfg *c, const MemsimModel *m, char *sec, gsize len)
{
    static const char *const keys[] = {"rope_scaling", "rope_parameters"};
    for (gsize i = 0; i < G_N_ELEMENTS(keys); i++) {
        JsonNode *v = json_object_get_member(c->o, keys[i]);
        if (!v || !JSON_NODE_HOLDS_OBJECT(v))
            continue;
        JsonNode *s = json_object_get_member(json_node_get_object(v), "mrope_section");
        if (!s)
            continue;
        g_autofree char *f = g_strdup_printf("%s.mrope_section", keys[i]);
        JsonArray *a = JSON_NODE_HOLDS_ARRAY(s) ? json_node_get_array(s) : NULL;
        int64_t sum = 0;
        GString *t = g_string_new("[");
        for (guint k = 0; a && k < json_array_get_length(a); k++) {
            JsonNode *e = json_array_get_element(a, k);
            if (!JSON_NODE_HOLDS_VALUE(e) || json_node_get_value_type(e) != G_TYPE_INT64 ||
                json_node_get_int(e) < 1 || json_node_get_int(e) > (1 << 16)) {
                a = NULL;
                break;
            }
            sum += json_node_get_int(e);
            g_string_append_printf(t, "%s%" G_GINT64_FORMAT, k ? ", " : "", json_node_get_int(e));
        }
        g_string_append(t, "]");
        g_strlcpy(sec, t->str, len);
        g_string_free(t, TRUE);
        if (!a || json_array_get_length(a) != 3) {
            g_autofree char *d = describe(s);
            return bad(c, f, "expected three positive widths (temporal, height, width), got %s", d);
        }
        if (2 * sum != m->hd)
            return bad(c, f,
                       "%s covers %" G_GINT64_FORMAT " of the rotary dimension, not the "
                       "head dimension %" G_GINT64_FORMAT " (each width counts twice)",
                       sec, 2 * sum, m->hd);
        return TRUE;
    }
    /* not given: the model's attention reads it (Qwen2VLAttention: rope_scaling["mrope_section"]);
     * its split does not change the tensors, so the multimodal rotary is assumed and said */
    g_strlcpy(sec, "not given: the multimodal rotary assumed", len);
    return TRUE;
}

/* Any other text model is read as a Llama decoder when it gives the fields of one. */
static bool llama_shaped(JsonObject *o)
{
    static const char *const fields[] = {"vocab_size",          "hidden_size",
                                         "intermediate_size",   "num_hidden_layers",
                                         "num_attention_heads", "num_key_value_heads"};
    for (gsize i = 0; i < G_N_ELEMENTS(fields); i++)
        if (!json_object_has_member(o, fields[i]))
            return false;
    return true;
}

/* The text model of a multimodal config (model type `top`, not one memsim models). */
static gboolean parse_text_config(Cfg *c, MemsimModel *m, const char *top)
{
    JsonNode *tn = json_object_get_member(c->o, "text_config");
    if (!JSON_NODE_HOLDS_OBJECT(tn)) {
        g_autofree char *d = describe(tn);
        return bad(c, "text_config", "expected an object (the text model's config), got %s", d);
    }
    g_autoptr(GHashTable) used = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GString) missing = g_string_new(NULL);
    Cfg t = {c->file,  "text_config.", json_node_get_object(tn), c->huge, missing, used,
             c->error, c->preset};
    char type[64];
    if (!get_str(&t, N("model_type"), "", type, sizeof type))
        return FALSE;
    /* Llama 3.2 Vision's text model interleaves cross-attention layers (MllamaCrossAttention-
     * DecoderLayer: gated cross-attention on the image states, with q/k norms), which a
     * text-only forward skips (modeling_mllama.py MllamaTextModel.forward) while their
     * parameters stay: neither is a Llama layer */
    if (strcmp(type, "mllama_text_model") == 0 &&
        json_object_has_member(t.o, "cross_attention_layers")) {
        JsonNode *x = json_object_get_member(t.o, "cross_attention_layers");
        if (!JSON_NODE_HOLDS_ARRAY(x) || json_array_get_length(json_node_get_array(x)) > 0)
            return bad(&t, "cross_attention_layers",
                       "Llama 3.2 Vision's cross-attention layers (skipped by a text-only "
                       "forward, their parameters kept) are not modelled: read as Llama layers "
                       "they would be counted and run as self-attention");
    }
    const char *as = NULL;
    bool strict = false;
    Family fam;
    if (family_of(type, &fam)) {
        as = type;
    } else {
        for (gsize i = 0; i < G_N_ELEMENTS(towers); i++)
            if (strcmp(towers[i].type, type) == 0)
                as = towers[i].as;
        if (!as && llama_shaped(t.o))
            as = "llama";
        strict = true;
    }
    if (!as) {
        g_autofree char *known = known_types();
        return bad(&t, "model_type",
                   "the text model '%s' of this '%s' config is not a family memsim models "
                   "(known: %s; a text model of another type is read as a Llama decoder when "
                   "it gives vocab_size, hidden_size, intermediate_size, num_hidden_layers, "
                   "num_attention_heads and num_key_value_heads)",
                   *type ? type : "(no model_type)", top, known);
    }
    bool known = family_of(as, &fam);
    g_assert(known);
    if (!read_family(&t, m, fam, as, strict) || !finish(&t, m, as))
        return FALSE;
    m->model_type = g_strdup(*type ? type : as);
    char sec[64] = "";
    if (strcmp(type, "qwen2_vl_text") == 0 || strcmp(type, "qwen2_5_vl_text") == 0) {
        /* the rotary's parameters under text_config, or still at the top level */
        if (!read_mrope(has_mrope(&t) || !has_mrope(c) ? &t : c, m, sec, sizeof sec))
            return FALSE;
        m->mrope = true;
    }
    if (!c->preset)
        fprintf(stderr,
                "memsim: %s: a '%s' config: its text model (text_config, model_type '%s') is read "
                "as a %s decoder%s%s%s%s; its other towers (vision, audio) are not counted\n",
                c->file, top, *type ? type : "none", as,
                strcmp(as, type) != 0 ? ", its layers counted as that family's" : "",
                m->mrope ? " with the multimodal rotary (mrope_section " : "", sec,
                m->mrope ? ": each layer cuts its own cos and sin from the three position grids' "
                           "tables, positions of text only)"
                         : "");
    return TRUE;
}

/* Qwen2-VL and Qwen2.5-VL configs as released: the text model's fields at the top level beside
 * vision_config (Qwen2VLConfig before the text_config split), read as Qwen2's decoder with the
 * multimodal rotary; the vision tower is not counted. */
static gboolean parse_vl_top(Cfg *c, MemsimModel *m, const char *top)
{
    char sec[64] = "";
    if (!read_family(c, m, FAM_LLAMA, "qwen2", true) || !finish(c, m, "qwen2") ||
        !read_mrope(c, m, sec, sizeof sec))
        return FALSE;
    m->mrope = true;
    m->model_type = g_strdup(top);
    if (!c->preset)
        fprintf(
            stderr,
            "memsim: %s: a '%s' config: its text model (the top-level fields) is read as a qwen2 "
            "decoder with the multimodal rotary (mrope_section %s: each layer cuts its own cos "
            "and sin from the three position grids' tables, positions of text only); its vision "
            "tower (vision_config) is not counted\n",
            c->file, top, sec);
    return TRUE;
}

/* The `architectures` classes memsim models: the causal-LM heads of its model types (a
 * sequence-classification or encoder head computes something else), and the multimodal
 * classes whose text tower it reads. */
static const char *const architectures[] = {"LlamaForCausalLM",
                                            "MistralForCausalLM",
                                            "Qwen2ForCausalLM",
                                            "GPT2LMHeadModel",
                                            "OPTForCausalLM",
                                            "BloomForCausalLM",
                                            "GPTNeoXForCausalLM",
                                            "FalconForCausalLM",
                                            "RWForCausalLM",
                                            "GPTNeoForCausalLM",
                                            "CodeGenForCausalLM",
                                            "MixtralForCausalLM",
                                            "Qwen3ForCausalLM",
                                            "Olmo2ForCausalLM",
                                            "Phi3ForCausalLM",
                                            "GemmaForCausalLM",
                                            "Gemma2ForCausalLM",
                                            "Gemma3ForCausalLM",
                                            "Qwen2MoeForCausalLM",
                                            "Qwen3MoeForCausalLM",
                                            "DeepseekV2ForCausalLM",
                                            "DeepseekV3ForCausalLM",
                                            "MllamaForConditionalGeneration",
                                            "Qwen2VLForConditionalGeneration",
                                            "Qwen2_5_VLForConditionalGeneration",
                                            "LlavaForConditionalGeneration",
                                            "LlavaNextForConditionalGeneration",
                                            "Gemma3ForConditionalGeneration",
                                            "Starcoder2ForCausalLM",
                                            "OlmoForCausalLM",
                                            NULL};

static gboolean check_architectures(Cfg *c)
{
    if (!json_object_has_member(c->o, "architectures"))
        return TRUE;
    JsonNode *v = json_object_get_member(c->o, "architectures");
    if (JSON_NODE_HOLDS_NULL(v))
        return TRUE;
    if (!JSON_NODE_HOLDS_ARRAY(v)) {
        g_autofree char *d = describe(v);
        return bad(c, "architectures", "expected a list of class names, got %s", d);
    }
    JsonArray *a = json_node_get_array(v);
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonNode *e = json_array_get_element(a, i);
        if (!JSON_NODE_HOLDS_VALUE(e) || json_node_get_value_type(e) != G_TYPE_STRING) {
            g_autofree char *d = describe(e);
            return bad(c, "architectures", "expected class names, got %s", d);
        }
        const char *name = json_node_get_string(e);
        if (!g_strv_contains(architectures, name)) {
            g_autofree char *known = g_strjoinv(", ", (char **)architectures);
            return bad(c, "architectures",
                       "unknown architecture '%.60s' (memsim models the causal language models "
                       "%s)",
                       name, known);
        }
    }
    return TRUE;
}

static gboolean parse(Cfg *c, MemsimModel *m)
{
    if (!check_architectures(c))
        return FALSE;
    char type[64];
    if (!get_str(c, N("model_type"), "", type, sizeof type))
        return FALSE;
    if (!*type)
        return bad(c, "model_type", "missing: cannot tell the model family");
    Family fam;
    if (!family_of(type, &fam)) {
        if (json_object_has_member(c->o, "text_config"))
            return parse_text_config(c, m, type);
        if (strcmp(type, "qwen2_vl") == 0 || strcmp(type, "qwen2_5_vl") == 0)
            return parse_vl_top(c, m, type);
        g_autofree char *known = known_types();
        return bad(c, "model_type", "unknown model type '%s' (known: %s)", type, known);
    }
    m->model_type = g_strdup(type);
    return read_family(c, m, fam, type, false) && finish(c, m, type);
}

/* ---- the file ---- */

/* The key path of the value at `depth` (keys of the enclosing objects, joined by '.'). */
typedef struct {
    const char *key;
    gsize len;
    bool object;
} Level;

static char *key_path(const Level *st, int depth)
{
    GString *p = g_string_new(NULL);
    for (int d = 1; d <= depth; d++)
        if (st[d].object && st[d].key)
            g_string_append_printf(p, "%s%.*s", p->len ? "." : "", (int)st[d].len, st[d].key);
    if (!p->len)
        g_string_append(p, "(top level)");
    char *s = g_utf8_make_valid(p->str, -1);
    g_string_free(p, TRUE);
    return s;
}

/* One pass over the text before json-glib parses it (its parser recurses once per nesting
 * level, and some 100000 brackets overflow the stack): nesting deeper than MAX_DEPTH is
 * refused; NaN and Infinity, which Python's json writes but JSON has not, are refused naming
 * their field; integers beyond 64 bits, which json-glib wraps silently, are noted in `huge`
 * by key path for the readers to refuse. Strings are skipped, escapes included. */
static gboolean scan_json(const char *file, const char *s, gsize len, GHashTable *huge,
                          GError **error)
{
    Level st[MAX_DEPTH + 1] = {{NULL, 0, false}};
    int depth = 0;
    const char *str = NULL; /* the last string: a key when ':' follows */
    gsize slen = 0;
    for (gsize i = 0; i < len; i++) {
        char ch = s[i];
        if (ch == '"') {
            gsize j = i + 1;
            while (j < len && s[j] != '"')
                j += s[j] == '\\' ? 2 : 1;
            str = s + i + 1;
            slen = MIN(j, len) - (i + 1);
            i = j;
            continue;
        }
        switch (ch) {
        case '{':
        case '[':
            if (depth == MAX_DEPTH) {
                g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                            "%s: JSON nested more than %d levels deep (at byte %" G_GSIZE_FORMAT
                            "): not a config.json, which nests a few",
                            file, MAX_DEPTH, i);
                return FALSE;
            }
            depth++;
            st[depth] = (Level){NULL, 0, ch == '{'};
            break;
        case '}':
        case ']':
            if (depth > 0)
                depth--;
            break;
        case ':':
            if (st[depth].object && str) {
                st[depth].key = str;
                st[depth].len = slen;
            }
            break;
        case ',':
            st[depth].key = NULL;
            break;
        default:
            if (ch == '-' || g_ascii_isalnum(ch)) {
                gsize j = i + 1;
                while (j < len && (g_ascii_isalnum(s[j]) || s[j] == '.' || s[j] == '-' ||
                                   s[j] == '+'))
                    j++;
                const char *tok = s + i;
                gsize n = j - i;
                const char *mag = tok[0] == '-' ? tok + 1 : tok;
                gsize mlen = tok[0] == '-' ? n - 1 : n;
                if (mlen && (mag[0] == 'N' || mag[0] == 'I')) {
                    g_autofree char *path = key_path(st, depth);
                    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                                "%s: field '%s': %.*s is not a JSON number (Python's json "
                                "writes it for a value that is not finite): expected a finite "
                                "number",
                                file, path, (int)MIN(n, 16), tok);
                    return FALSE;
                }
                bool integer = mlen > 0;
                for (gsize k = 0; k < mlen; k++)
                    integer = integer && g_ascii_isdigit(mag[k]);
                while (integer && mlen > 1 && mag[0] == '0') {
                    mag++;
                    mlen--;
                }
                if (integer && huge &&
                    (mlen > 19 || (mlen == 19 && memcmp(mag, "9223372036854775807", 19) > 0)))
                    g_hash_table_insert(huge, key_path(st, depth),
                                        g_strndup(tok, MIN(n, 40)));
                i = j - 1;
            }
        }
    }
    return TRUE;
}

/* The file's text, at most MAX_FILE_BYTES (newly allocated, NUL-terminated). */
static char *read_config(const char *path, gsize *len, GError **error)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: cannot open: %s", path,
                    g_strerror(e));
        return NULL;
    }
    GByteArray *b = g_byte_array_new();
    guint8 chunk[65536];
    size_t n;
    while (b->len <= MAX_FILE_BYTES && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        g_byte_array_append(b, chunk, (guint)n);
    int e = ferror(f) ? errno : 0;
    fclose(f);
    if (e || b->len > MAX_FILE_BYTES) {
        if (e)
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: cannot read: %s", path,
                        g_strerror(e));
        else
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "%s: larger than %" G_GSIZE_FORMAT
                        " MiB: not a config.json, which takes a few KB",
                        path, MAX_FILE_BYTES >> 20);
        g_byte_array_free(b, TRUE);
        return NULL;
    }
    *len = b->len;
    g_byte_array_append(b, (const guint8 *)"", 1);
    return (char *)g_byte_array_free(b, FALSE);
}

static MemsimModel *load_json(JsonParser *p, const char *file, const char *name,
                              GHashTable *huge, GError **error)
{
    JsonNode *root = json_parser_get_root(p);
    if (!root || !JSON_NODE_HOLDS_OBJECT(root)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: expected a JSON object (a Hugging Face config.json)", file);
        return NULL;
    }
    g_autoptr(GHashTable) used = g_hash_table_new(g_str_hash, g_str_equal);
    g_autoptr(GString) missing = g_string_new(NULL);
    Cfg c = {file, "", json_node_get_object(root), huge, missing, used, error, huge == NULL};
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
        return load_json(p, rpath + strlen("/org/memsim/models/"), name_or_path, NULL, error);
    }
    if (!g_file_test(name_or_path, G_FILE_TEST_EXISTS)) {
        g_auto(GStrv) names = memsim_model_presets();
        g_autofree char *list = g_strjoinv(", ", names);
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "'%s' is neither a preset nor a config.json file (presets: %s)",
                    name_or_path, list);
        return NULL;
    }
    gsize len = 0;
    g_autofree char *text = read_config(name_or_path, &len, error);
    if (!text)
        return NULL;
    g_autoptr(GHashTable) huge = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    if (!scan_json(name_or_path, text, len, huge, error))
        return NULL;
    if (!json_parser_load_from_data(p, text, (gssize)len, &e)) {
        /* json-glib names the text "<data>": the file instead */
        const char *msg = e->message;
        bool data = g_str_has_prefix(msg, "<data>:");
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: not valid JSON: %s%s%s",
                    name_or_path, data ? name_or_path : "", data ? ":" : "",
                    data ? msg + strlen("<data>:") : msg);
        g_error_free(e);
        return NULL;
    }
    return load_json(p, name_or_path, name_or_path, huge, error);
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
    return m->arch[0] ? m->arch : family_names[m->fam];
}

void memsim_model_counts(const MemsimModel *m, MemsimModelCounts *out)
{
    Size z;
    gboolean ok = model_size(m, &z);
    g_assert(ok && "the loader refuses a model whose parameter count overflows");
    memset(out, 0, sizeof *out);
    out->params = z.params;
    out->active = z.params - z.inactive;
    out->tied = m->tie;
    if (m->fam == FAM_MEGATRON) {
        int64_t Vp = mg_padded_vocab(m->mg, 1);
        out->embedding = Vp * m->H + (m->mg->pos == MG_POS_LEARNED ? m->max_pos * m->H : 0);
        out->lm_head = m->tie ? 0 : Vp * m->H;
        return;
    }
    int64_t E = m->fam == FAM_OPT ? m->wep : m->H;
    out->embedding = m->V * E;
    if (m->fam == FAM_GPT2 || m->fam == FAM_GPTNEO)
        out->embedding += m->max_pos * m->H;
    if (m->fam == FAM_OPT)
        out->embedding += (m->max_pos + 2) * m->H;
    out->lm_head = m->tie ? 0 : m->V * E + (m->fam == FAM_CODEGEN ? m->V : 0);
}

char *memsim_json_with_model(const char *text, const MemsimModel *m)
{
    g_autoptr(JsonParser) p = json_parser_new();
    g_autoptr(JsonParser) mp = json_parser_new();
    g_autofree char *mj = memsim_model_to_json(m);
    if (!json_parser_load_from_data(p, text, -1, NULL) ||
        !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(p)) ||
        !json_parser_load_from_data(mp, mj, -1, NULL))
        return g_strdup(text);
    JsonObject *o = json_node_get_object(json_parser_get_root(p));
    json_object_set_member(o, "model", json_node_copy(json_parser_get_root(mp)));
    g_autoptr(JsonGenerator) gen = json_generator_new();
    json_generator_set_pretty(gen, TRUE);
    json_generator_set_root(gen, json_parser_get_root(p));
    return json_generator_to_data(gen, NULL);
}

char *memsim_model_to_json(const MemsimModel *m)
{
    MemsimModelCounts k;
    memsim_model_counts(m, &k);
    g_autoptr(JsonBuilder) b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "name");
    json_builder_add_string_value(b, m->name ? m->name : "");
    json_builder_set_member_name(b, "family");
    json_builder_add_string_value(b, memsim_model_family(m));
    json_builder_set_member_name(b, "model_type");
    json_builder_add_string_value(b, m->model_type ? m->model_type : "");
    json_builder_set_member_name(b, "params");
    json_builder_add_int_value(b, k.params);
    json_builder_set_member_name(b, "active_params");
    json_builder_add_int_value(b, k.active);
    json_builder_set_member_name(b, "embedding_params");
    json_builder_add_int_value(b, k.embedding);
    json_builder_set_member_name(b, "lm_head_params");
    json_builder_add_int_value(b, k.lm_head);
    json_builder_set_member_name(b, "tied_embeddings");
    json_builder_add_boolean_value(b, k.tied);
    if (m->fam == FAM_MIXTRAL) {
        json_builder_set_member_name(b, "experts");
        json_builder_add_int_value(b, m->n_experts);
        json_builder_set_member_name(b, "experts_per_token");
        json_builder_add_int_value(b, m->top_k);
    }
    json_builder_end_object(b);
    g_autoptr(JsonGenerator) gen = json_generator_new();
    g_autoptr(JsonNode) root = json_builder_get_root(b);
    json_generator_set_root(gen, root);
    return json_generator_to_data(gen, NULL);
}

int64_t memsim_model_n_params(const MemsimModel *m)
{
    Size z;
    gboolean ok = model_size(m, &z);
    g_assert(ok && "the loader refuses a model whose parameter count overflows");
    return z.params;
}
