/* --transformers-version: the one table of what differs between Transformers releases
 * (traces/hf_versions.c) is what traces/transformers_versions.md says, and each of its rows
 * shows in the generated trace on both sides of its release:
 *
 *   sdpa-default (4.36): before, LlamaAttention's eager path (its fp32 softmax of [B, nh, S, S]
 *   scores); since, SDPA's flash kernel;
 *   logits-not-upcast (4.46): before, LlamaForCausalLM.forward's loss shifts a fp32 copy of
 *   the logits, [B, S-1, V] (and log-softmaxes that many rows); since, ForCausalLMLoss upcasts
 *   all B·S rows and pads the labels, so no [B, S-1, V] tensor is made. */
#include <criterion/criterion.h>
#include <memsim/gen.h>
#include <string.h>

#include "testutil.h"
#include "traces/hf_versions.h"

static const char LLAMA[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 1000,"
    " \"hidden_size\": 128, \"intermediate_size\": 344, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"hidden_act\": \"silu\","
    " \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0,"
    " \"tie_word_embeddings\": false, \"use_cache\": true, \"torch_dtype\": \"float32\"}";
enum { B = 2, S = 64, V = 1000, NH = 4 };

/* The same sizes under the other model_types the table lists (config.c maps mistral and qwen2
 * to the llama family); Mixtral with 4 experts, 2 per token; GPT-NeoX with partial rotary. */
static const char MISTRAL[] =
    "{\"model_type\": \"mistral\", \"vocab_size\": 1000, \"hidden_size\": 128,"
    " \"intermediate_size\": 344, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"hidden_act\": \"silu\", \"max_position_embeddings\": 512,"
    " \"sliding_window\": null, \"tie_word_embeddings\": false, \"use_cache\": true}";
static const char QWEN2[] =
    "{\"model_type\": \"qwen2\", \"vocab_size\": 1000, \"hidden_size\": 128,"
    " \"intermediate_size\": 344, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"hidden_act\": \"silu\", \"max_position_embeddings\": 512,"
    " \"tie_word_embeddings\": false, \"use_cache\": true}";
static const char MIXTRAL[] =
    "{\"model_type\": \"mixtral\", \"vocab_size\": 1000, \"hidden_size\": 128,"
    " \"intermediate_size\": 344, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"max_position_embeddings\": 512, \"num_local_experts\": 4,"
    " \"num_experts_per_tok\": 2, \"tie_word_embeddings\": false, \"use_cache\": true}";
static const char NEOX[] =
    "{\"model_type\": \"gpt_neox\", \"vocab_size\": 1000, \"hidden_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 512,"
    " \"rotary_pct\": 0.25, \"max_position_embeddings\": 512, \"hidden_act\": \"gelu\","
    " \"use_parallel_residual\": true, \"tie_word_embeddings\": false, \"use_cache\": true}";

static char *config_of(const char *json)
{
    g_autofree char *dir = tu_tmpdir();
    char *path = g_build_filename(dir, "config.json", NULL);
    cr_assert(g_file_set_contents(path, json, -1, NULL));
    return path;
}

static char *config(void)
{
    return config_of(LLAMA);
}

static MemsimTrace *gen(const char *cfg, const char *version, const char *attention)
{
    const char *s[16] = {"batch", "2", "seq", "64", "steps", "1"};
    int k = 6;
    if (version) {
        s[k++] = "transformers-version";
        s[k++] = version;
    }
    if (attention) {
        s[k++] = "attention";
        s[k++] = attention;
    }
    s[k] = NULL;
    return tu_generate(cfg, s);
}

/* Forward allocations of `size` bytes in rank 0. */
static int forward_allocs(MemsimTrace *t, uint64_t size)
{
    MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    int phase = -1, count = 0;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind == MEMSIM_EV_OP && ev[i].id < h->n_ops)
            phase = h->ops[ev[i].id].phase;
        else if (ev[i].kind == MEMSIM_EV_ALLOC && phase == MEMSIM_PHASE_FORWARD &&
                 ev[i].size == size)
            count++;
    }
    return count;
}

/* Allocations of `size` bytes anywhere in rank 0's trace (the model's buffers included). */
static int allocs(MemsimTrace *t, uint64_t size)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    int count = 0;
    for (gsize i = 0; i < n; i++)
        count += ev[i].kind == MEMSIM_EV_ALLOC && ev[i].size == size;
    return count;
}

/* Forward allocations of `size` bytes that are freed in backward (kept for it). */
static int kept_for_backward(MemsimTrace *t, uint64_t size)
{
    MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    g_autoptr(GHashTable) fwd = g_hash_table_new(g_int64_hash, g_int64_equal);
    int phase = -1, count = 0;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind == MEMSIM_EV_OP && ev[i].id < h->n_ops)
            phase = h->ops[ev[i].id].phase;
        else if (ev[i].kind == MEMSIM_EV_ALLOC && phase == MEMSIM_PHASE_FORWARD &&
                 ev[i].size == size)
            g_hash_table_add(fwd, (gpointer)&ev[i].id);
        else if (ev[i].kind == MEMSIM_EV_FREE && phase == MEMSIM_PHASE_BACKWARD &&
                 g_hash_table_contains(fwd, &ev[i].id))
            count++;
    }
    return count;
}

/* OP events named `name` in rank 0's forward. */
static int forward_ops(MemsimTrace *t, const char *name)
{
    MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    int count = 0;
    for (gsize i = 0; i < n; i++)
        count += ev[i].kind == MEMSIM_EV_OP && ev[i].id < h->n_ops &&
                 h->ops[ev[i].id].phase == MEMSIM_PHASE_FORWARD &&
                 strcmp(h->strings[h->ops[ev[i].id].name], name) == 0;
    return count;
}

static gboolean has_op(MemsimTrace *t, const char *name)
{
    MemsimTraceHeader *h = memsim_trace_header(t);
    for (guint32 i = 0; i < h->n_ops; i++)
        if (strcmp(h->strings[h->ops[i].name], name) == 0)
            return TRUE;
    return FALSE;
}

Test(hf_versions, sdpa_default_since_4_36)
{
    g_autofree char *cfg = config();
    MemsimTrace *old = gen(cfg, "4.35", NULL), *now = gen(cfg, "4.36", NULL),
                *newest = gen(cfg, NULL, NULL), *asked = gen(cfg, "4.35", "sdpa");
    /* eager: the fp32 softmax of the scores, [B, nh, S, S], per layer */
    int64_t scores = (int64_t)B * NH * S * S * 4;
    cr_expect(has_op(old, "_softmax") && forward_allocs(old, scores) >= 2, "4.35: eager attention");
    cr_expect(!has_op(old, "_scaled_dot_product_flash_attention"));
    cr_expect(has_op(now, "_scaled_dot_product_flash_attention") && !has_op(now, "_softmax"),
              "4.36: SDPA (flash)");
    cr_expect(has_op(newest, "_scaled_dot_product_flash_attention"));
    /* an attention given is taken as given */
    cr_expect(has_op(asked, "_scaled_dot_product_flash_attention"));
    memsim_trace_free(old);
    memsim_trace_free(now);
    memsim_trace_free(newest);
    memsim_trace_free(asked);
}

/* sdpa-default-mistral (4.37) and sdpa-default-gpt-neox (4.42): eager attention's fp32
 * softmax of the [B, nh, S, S] scores before, SDPA after; a release between the llama row and
 * these keeps Llama on SDPA and the others on eager (each model_type has its own row). */
Test(hf_versions, sdpa_default_per_model_type)
{
    struct {
        const char *json, *type, *last_eager, *first_sdpa;
    } rows[] = {
        {MISTRAL, "mistral", "4.36", "4.37"},
        {MIXTRAL, "mixtral", "4.36", "4.37"},
        {NEOX, "gpt_neox", "4.41", "4.42"},
    };
    int64_t scores = (int64_t)B * NH * S * S * 4;
    for (size_t i = 0; i < G_N_ELEMENTS(rows); i++) {
        g_autofree char *cfg = config_of(rows[i].json);
        MemsimTrace *old = gen(cfg, rows[i].last_eager, NULL);
        MemsimTrace *now = gen(cfg, rows[i].first_sdpa, NULL);
        MemsimTrace *newest = gen(cfg, NULL, NULL);
        MemsimTrace *asked = gen(cfg, rows[i].last_eager, "sdpa");
        cr_expect(has_op(old, "_softmax") && forward_allocs(old, scores) >= 2, "%s %s: eager",
                  rows[i].type, rows[i].last_eager);
        cr_expect(!has_op(old, "_scaled_dot_product_flash_attention"), "%s", rows[i].type);
        /* (Mixtral's router has a softmax of its own in each of the 2 layers) */
        int router = rows[i].json == MIXTRAL ? 2 : 0;
        cr_expect(has_op(now, "_scaled_dot_product_flash_attention") &&
                      forward_ops(now, "_softmax") == router,
                  "%s %s: SDPA (flash)", rows[i].type, rows[i].first_sdpa);
        cr_expect(has_op(newest, "_scaled_dot_product_flash_attention"), "%s", rows[i].type);
        cr_expect(has_op(asked, "_scaled_dot_product_flash_attention"), "%s", rows[i].type);
        memsim_trace_free(old);
        memsim_trace_free(now);
        memsim_trace_free(newest);
        memsim_trace_free(asked);
    }
    /* 4.36: Llama already on SDPA, Mistral still eager */
    g_autofree char *llama = config(), *mistral = config_of(MISTRAL);
    MemsimTrace *l = gen(llama, "4.36", NULL), *m = gen(mistral, "4.36", NULL);
    cr_expect(has_op(l, "_scaled_dot_product_flash_attention"));
    cr_expect(has_op(m, "_softmax") && !has_op(m, "_scaled_dot_product_flash_attention"));
    memsim_trace_free(l);
    memsim_trace_free(m);
}

Test(hf_versions, logits_upcast_in_the_model_before_4_46)
{
    /* LlamaForCausalLM only: Mistral's, Qwen2's and Mixtral's copies of it are not modelled
     * (their move to loss_function is not pinned to a release) and run the newest code (Qwen2
     * is left out: the releases here have it) */
    const char *jsons[] = {LLAMA, MISTRAL, MIXTRAL};
    const char *versions[] = {"4.44", "4.45", "4.45.2", "4.46", "4.57", NULL};
    uint64_t shifted = (uint64_t)B * (S - 1) * V * 4; /* fp32 [B, S-1, V] */
    uint64_t low = (uint64_t)B * S * V * 2;           /* bf16 [B, S, V]: lm_head under autocast */
    for (size_t j = 0; j < G_N_ELEMENTS(jsons); j++) {
        g_autofree char *cfg = config_of(jsons[j]);
        for (const char **v = versions; *v; v++) {
            MemsimTrace *t = gen(cfg, *v, NULL);
            gboolean before = jsons[j] == LLAMA && strcmp(*v, "4.46") < 0;
            /* before: the contiguous shifted copy and the log-softmax of its rows */
            cr_expect_eq(forward_allocs(t, shifted), before ? 2 : 0,
                         "config %zu, %s: %d [B, S-1, V] fp32", j, *v, forward_allocs(t, shifted));
            /* the bf16 logits are made either way (autocast's lm_head) */
            cr_expect_geq(forward_allocs(t, low), 1, "config %zu, %s", j, *v);
            memsim_trace_free(t);
        }
        MemsimTrace *newest = gen(cfg, NULL, NULL);
        cr_expect_eq(forward_allocs(newest, shifted), 0, "config %zu", j);
        memsim_trace_free(newest);
    }
}

/* causal-mask-max-pos (4.38 only): LlamaModel's (P, P) bool buffer, P = max_position_embeddings
 * (512 here); each forward repeats it to (B,1,P,P) bool, casts it to the embeddings' dtype
 * (fp32: bf16-mixed keeps fp32 parameters) and multiplies by min_dtype, two fp32 (B,1,P,P);
 * each of the L = 2 layers indexes a (B,1,S,S) copy that SDPA (no flash with a mask) casts to
 * bf16 under autocast and saves for backward. 4.37 and 4.39: none of it, flash. Mistral's
 * model of 4.38 had no such buffer (the row lists llama only). */
Test(hf_versions, causal_mask_max_pos_in_4_38)
{
    enum { P = 512, L = 2 };
    /* without GQA, so that K and V (B,S,4·32) differ in size from the (B,1,S,S) bias */
    g_autofree char *mha = g_strdup(LLAMA);
    memcpy(strstr(mha, "\"num_key_value_heads\": 2") + 23, "4", 1);
    g_autofree char *cfg = config_of(mha), *mistral = config_of(MISTRAL);
    uint64_t buffer = (uint64_t)P * P, rep = (uint64_t)B * P * P, mask = rep * 4;
    uint64_t bias = (uint64_t)B * S * S * 2; /* bf16 (B,1,S,S) */
    const char *versions[] = {"4.37", "4.38", "4.38.2", "4.39", NULL};
    /* other bf16 tensors of the bias's size kept for backward, if any: those of 4.37 */
    MemsimTrace *t0 = gen(cfg, "4.37", NULL);
    int others = kept_for_backward(t0, bias);
    memsim_trace_free(t0);
    for (const char **v = versions; *v; v++) {
        MemsimTrace *t = gen(cfg, *v, NULL);
        gboolean in = g_str_has_prefix(*v, "4.38");
        cr_expect_eq(allocs(t, buffer), in ? 1 : 0, "%s: the (P, P) buffer", *v);
        cr_expect_eq(forward_allocs(t, rep), in ? 1 : 0, "%s: the repeat", *v);
        cr_expect_eq(forward_allocs(t, mask), in ? 2 : 0, "%s: .to(dtype), * min_dtype", *v);
        cr_expect_eq(forward_ops(t, "index"), in ? L : 0, "%s: a copy per layer", *v);
        cr_expect_eq(kept_for_backward(t, bias) - others, in ? L : 0,
                     "%s: %d masks saved by SDPA", *v, kept_for_backward(t, bias) - others);
        cr_expect_eq(has_op(t, "_scaled_dot_product_flash_attention"), !in, "%s: flash", *v);
        cr_expect_eq(has_op(t, "_scaled_dot_product_efficient_attention"), in, "%s", *v);
        memsim_trace_free(t);
    }
    MemsimTrace *m = gen(mistral, "4.38", NULL);
    cr_expect_eq(allocs(m, buffer), 0);
    cr_expect_eq(forward_ops(m, "index"), 0);
    memsim_trace_free(m);
}

Test(hf_versions, refusals)
{
    MemsimRun run = memsim_run_defaults();
    GError *e = NULL;
    const char *bad[] = {"4.30", "3.5", "6.0", "4", "4.45.x", "latest", "", NULL};
    for (const char **b = bad; *b; b++) {
        cr_expect_not(memsim_run_set(&run, "transformers-version", *b, &e), "%s taken", *b);
        cr_expect(e && strstr(e->message, "transformers-version"), "%s", *b);
        g_clear_error(&e);
    }
    cr_expect(memsim_run_set(&run, "transformers-version", "5.2", &e));
    memsim_run_clear(&run);
    /* a model type before its first release is refused, naming both; from that release on
     * it runs (model-type-mistral 4.34, model-type-mixtral 4.36, model-type-qwen2 4.37) */
    struct {
        const char *json, *type, *missing, *first;
    } types[] = {
        {MISTRAL, "mistral", "4.33", "4.34"},
        {MIXTRAL, "mixtral", "4.35", "4.36"},
        {QWEN2, "qwen2", "4.36", "4.37"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(types); i++) {
        g_autofree char *cfg = config_of(types[i].json);
        MemsimModel *m = memsim_model_load(cfg, &e);
        cr_assert(m, "%s", e ? e->message : "");
        MemsimRun r = memsim_run_defaults();
        cr_assert(memsim_run_set(&r, "transformers-version", types[i].missing, &e));
        MemsimTrace *t = memsim_generate(m, &r, &e);
        cr_expect_null(t, "%s %s", types[i].type, types[i].missing);
        cr_expect(e && e->code == MEMSIM_ERROR_BAD_INPUT && strstr(e->message, types[i].type) &&
                      strstr(e->message, types[i].first),
                  "%s", e ? e->message : "(no error)");
        g_clear_error(&e);
        memsim_trace_free(t);
        cr_assert(memsim_run_set(&r, "transformers-version", types[i].first, &e));
        t = memsim_generate(m, &r, &e);
        cr_expect(t, "%s %s: %s", types[i].type, types[i].first, e ? e->message : "");
        g_clear_error(&e);
        memsim_trace_free(t);
        memsim_run_clear(&r);
        memsim_model_free(m);
    }
}

/* The page renders the table: one row per rule, in order, with its name, releases (since,
 * until), model types and upstream file. */
Test(hf_versions, page_matches_the_table)
{
    g_autofree char *path = g_build_filename(g_getenv("MEMSIM_SOURCE_ROOT"), "traces",
                                             "transformers_versions.md", NULL);
    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(path, &text, NULL, NULL), "%s", path);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    guint row = 0;
    gboolean in_table = FALSE; /* the first table, headed "| rule " (the page has others) */
    for (char **l = lines; *l; l++) {
        if (g_str_has_prefix(*l, "| rule ")) {
            in_table = TRUE;
            continue;
        }
        if (in_table && !g_str_has_prefix(*l, "|"))
            break;
        if (!in_table || !g_str_has_prefix(*l, "| "))
            continue;
        g_auto(GStrv) cells = g_strsplit(*l + 1, "|", -1);
        cr_assert_geq(g_strv_length(cells), 4, "%s", *l);
        for (char **c = cells; *c; c++)
            g_strstrip(*c);
        const HfRule *r = hf_rule(row);
        cr_assert(r, "the page has more rows than the table: %s", *l);
        g_autofree char *since = g_strdup_printf("%d.%d", r->since / 1000, r->since % 1000);
        g_autofree char *until = r->until ? g_strdup_printf("%d.%d", r->until / 1000,
                                                            r->until % 1000)
                                          : g_strdup("-");
        cr_assert_geq(g_strv_length(cells), 5, "%s", *l);
        cr_expect_str_eq(cells[0], r->name);
        cr_expect_str_eq(cells[1], since, "%s", r->name);
        cr_expect_str_eq(cells[2], until, "%s", r->name);
        cr_expect_str_eq(cells[3], r->families, "%s", r->name);
        cr_expect_str_eq(cells[4], r->upstream, "%s", r->name);
        row++;
    }
    cr_expect_eq(row, N_HF_RULES, "the page has %u rows, the table %d", row, N_HF_RULES);
}
