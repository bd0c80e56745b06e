/* PyTorch's CUDA caching allocator settings (formats/torch_settings.h): the parser of
 * PYTORCH_CUDA_ALLOC_CONF, as c10/cuda/CUDAAllocatorConfig.cpp reads it (TORCH_ALLOCATOR.md
 * §2): key:value pairs (key=value too), lists in [...], whitespace ignored. */
#include "formats/torch_settings.h"

#include <string.h>

#include "formats/numbers.h"

static const char *const known_keys =
    "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, "
    "garbage_collection_threshold, expandable_segments, per_process_memory_fraction, "
    "large_segment_size_mb, backend, release_lock_on_cudamalloc, "
    "graph_capture_record_stream_reuse, pinned_use_cuda_host_register, "
    "pinned_num_register_threads, pinned_use_background_threads, "
    "pinned_reserve_segment_size_mb";

/* The tokens of a setting string: ',', ':', '[' and ']' are tokens of their own ('=' reads as
 * ':'), whitespace is dropped everywhere, everything else accumulates into words. */
static GPtrArray *tokenize(const char *s)
{
    GPtrArray *toks = g_ptr_array_new_with_free_func(g_free);
    GString *word = g_string_new(NULL);
    for (const char *p = s; *p; p++) {
        char c = *p == '=' ? ':' : *p;
        if (c == ',' || c == ':' || c == '[' || c == ']') {
            if (word->len)
                g_ptr_array_add(toks, g_strdup(word->str));
            g_string_truncate(word, 0);
            g_ptr_array_add(toks, g_strndup(&c, 1));
        } else if (!g_ascii_isspace(c)) {
            g_string_append_c(word, c);
        }
    }
    if (word->len)
        g_ptr_array_add(toks, g_strdup(word->str));
    g_string_free(word, TRUE);
    return toks;
}

typedef struct {
    GPtrArray *toks;
    guint i;
    GError **error;
} Parser;

static const char *tok(Parser *p, guint i)
{
    return i < p->toks->len ? p->toks->pdata[i] : NULL;
}

static gboolean tok_is(Parser *p, guint i, const char *s)
{
    const char *x = tok(p, i);
    return x && strcmp(x, s) == 0;
}

#define BAD(p, ...)                                                                                \
    do {                                                                                           \
        g_set_error((p)->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,                              \
                    "torch settings: " __VA_ARGS__);                                               \
        return FALSE;                                                                              \
    } while (0)

static const char *const div_help =
    "roundup_power2_divisions takes a power of two N (every size interval) or a list "
    "[B:N, ..., >:N] where each boundary B is a power of two in MiB, '>' covers the "
    "intervals after the last boundary, and each N is 0 or a power of two";

static gboolean parse_divisions(Parser *p, TorchSettings *c)
{
    for (int k = 0; k < TORCH_DIV_INTERVALS; k++)
        c->div[k] = 0;
    if (!tok_is(p, p->i, "[")) {
        uint64_t v;
        if (!num_parse_u64(tok(p, p->i), &v) || !num_is_pow2(v))
            BAD(p, "%s (got '%s')", div_help, tok(p, p->i) ? tok(p, p->i) : "");
        for (int k = 0; k < TORCH_DIV_INTERVALS; k++)
            c->div[k] = v;
        return TRUE;
    }
    gboolean first = TRUE;
    size_t last_index = 0;
    p->i++;
    while (!tok_is(p, p->i, "]")) {
        const char *bound = tok(p, p->i);
        uint64_t v;
        if (!bound || !tok_is(p, p->i + 1, ":") || !num_parse_u64(tok(p, p->i + 2), &v) ||
            (v && !num_is_pow2(v)))
            BAD(p, "%s (bad entry at '%s')", div_help, bound ? bound : "end of settings");
        if (strcmp(bound, ">") == 0) {
            /* Newest PyTorch: '>' fills the intervals after the last boundary. */
            for (size_t k = last_index + 1; k < TORCH_DIV_INTERVALS; k++)
                c->div[k] = v;
        } else {
            uint64_t b;
            if (!num_parse_u64(bound, &b) || !num_is_pow2(b))
                BAD(p, "%s (boundary '%s' is not a power of two)", div_help, bound);
            size_t index = (size_t)(63 - __builtin_clzll(b));
            if (index > TORCH_DIV_INTERVALS - 1)
                index = TORCH_DIV_INTERVALS - 1;
            if (first) {
                for (size_t k = 0; k < index; k++)
                    c->div[k] = v;
                first = FALSE;
            }
            c->div[index] = v;
            last_index = index;
        }
        p->i += 3;
        if (tok_is(p, p->i, ","))
            p->i++;
        else if (!tok_is(p, p->i, "]"))
            BAD(p, "%s (expected ',' or ']' after an entry)", div_help);
    }
    return TRUE;
}

static gboolean parse_bool(Parser *p, const char *key, gboolean *out)
{
    const char *v = tok(p, p->i);
    if (v && strcmp(v, "True") == 0)
        *out = TRUE;
    else if (v && strcmp(v, "False") == 0)
        *out = FALSE;
    else
        BAD(p, "%s must be True or False (got '%s')", key, v ? v : "");
    return TRUE;
}

gboolean torch_settings_parse(const char *settings, TorchSettings *c, GError **error)
{
    memset(c, 0, sizeof *c);
    c->max_split_size = TORCH_UNLIMITED;
    c->max_non_split_rounding = TORCH_LARGE_BUFFER;
    c->large_segment = TORCH_LARGE_BUFFER;
    c->fraction = 1.0;
    g_autoptr(GPtrArray) toks = tokenize(settings ? settings : "");
    Parser ps = {toks, 0, error}, *p = &ps;
    uint64_t split_mb = 0;
    for (; p->i < toks->len; p->i++) {
        const char *key = tok(p, p->i);
        if (!tok_is(p, p->i + 1, ":") || !tok(p, p->i + 2))
            BAD(p, "expected key:value or key=value at '%s' (keys: %s)", key, known_keys);
        p->i += 2;
        const char *val = tok(p, p->i);
        uint64_t u;
        double d;
        gboolean flag;
        if (strcmp(key, "max_split_size_mb") == 0) {
            if (!num_parse_u64(val, &u) || u < TORCH_LARGE_BUFFER / TORCH_MIB)
                BAD(p,
                    "max_split_size_mb must be an integer number of MiB >= %" G_GUINT64_FORMAT
                    " (got '%s')",
                    TORCH_LARGE_BUFFER / TORCH_MIB, val);
            split_mb = u;
            c->max_split_size = u > UINT64_MAX / TORCH_MIB ? TORCH_UNLIMITED - 1 : u * TORCH_MIB;
        } else if (strcmp(key, "max_non_split_rounding_mb") == 0) {
            if (!num_parse_u64(val, &u) || u < TORCH_LARGE_BUFFER / TORCH_MIB)
                BAD(p,
                    "max_non_split_rounding_mb must be an integer number of MiB >= "
                    "%" G_GUINT64_FORMAT " (got '%s')",
                    TORCH_LARGE_BUFFER / TORCH_MIB, val);
            c->max_non_split_rounding = u > UINT64_MAX / TORCH_MIB ? UINT64_MAX / 2 : u * TORCH_MIB;
        } else if (strcmp(key, "large_segment_size_mb") == 0) {
            if (!num_parse_u64(val, &u) || u <= TORCH_MIN_LARGE_ALLOC / TORCH_MIB || u > 1u << 20)
                BAD(p,
                    "large_segment_size_mb must be an integer number of MiB > %" G_GUINT64_FORMAT
                    " (got '%s')",
                    TORCH_MIN_LARGE_ALLOC / TORCH_MIB, val);
            c->large_segment = u * TORCH_MIB;
        } else if (strcmp(key, "roundup_power2_divisions") == 0) {
            if (!parse_divisions(p, c))
                return FALSE;
        } else if (strcmp(key, "garbage_collection_threshold") == 0) {
            if (!num_parse_double(val, &d) || !(d > 0.0 && d < 1.0))
                BAD(p, "garbage_collection_threshold must be a number in (0, 1) (got '%s')", val);
            c->gc_threshold = d;
        } else if (strcmp(key, "expandable_segments") == 0) {
            if (!parse_bool(p, key, &c->expandable))
                return FALSE;
        } else if (strcmp(key, "per_process_memory_fraction") == 0) {
            if (!num_parse_double(val, &d) || !(d >= 0.0 && d <= 1.0))
                BAD(p, "per_process_memory_fraction must be a number in [0, 1] (got '%s')", val);
            c->fraction = d;
        } else if (strcmp(key, "backend") == 0) {
            if (strcmp(val, "cudaMallocAsync") == 0) {
                g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                            "torch settings: backend:cudaMallocAsync is a different allocator "
                            "that this policy does not model (accepted: backend:native)");
                return FALSE;
            }
            if (strcmp(val, "native") != 0)
                BAD(p, "backend must be native or cudaMallocAsync (got '%s')", val);
        } else if (strcmp(key, "release_lock_on_cudamalloc") == 0 ||
                   strcmp(key, "graph_capture_record_stream_reuse") == 0 ||
                   strcmp(key, "pinned_use_cuda_host_register") == 0 ||
                   strcmp(key, "pinned_use_background_threads") == 0) {
            if (!parse_bool(p, key, &flag))
                return FALSE; /* accepted; no effect on a single-threaded simulation */
        } else if (strcmp(key, "pinned_num_register_threads") == 0 ||
                   strcmp(key, "pinned_reserve_segment_size_mb") == 0) {
            if (!num_parse_u64(val, &u))
                BAD(p, "%s must be an integer (got '%s')", key, val);
        } else {
            BAD(p, "unknown key '%s' (keys: %s)", key, known_keys);
        }
        if (p->i + 1 < toks->len) {
            p->i++;
            if (!tok_is(p, p->i, ","))
                BAD(p, "expected ',' after the value of %s, got '%s'", key, tok(p, p->i));
        }
    }
    if (split_mb && c->max_split_size < c->large_segment)
        BAD(p, "max_split_size_mb must be >= large_segment_size_mb (%" G_GUINT64_FORMAT ")",
            c->large_segment / TORCH_MIB);
    c->any_div = FALSE;
    for (int k = 0; k < TORCH_DIV_INTERVALS; k++)
        if (c->div[k] > 1)
            c->any_div = TRUE;
    return TRUE;
}

