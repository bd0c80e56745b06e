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

static char *config(void)
{
    g_autofree char *dir = tu_tmpdir();
    char *path = g_build_filename(dir, "config.json", NULL);
    cr_assert(g_file_set_contents(path, LLAMA, -1, NULL));
    return path;
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

Test(hf_versions, logits_upcast_in_the_model_before_4_46)
{
    g_autofree char *cfg = config();
    const char *versions[] = {"4.44", "4.45", "4.45.2", "4.46", "4.57", NULL};
    uint64_t shifted = (uint64_t)B * (S - 1) * V * 4; /* fp32 [B, S-1, V] */
    uint64_t low = (uint64_t)B * S * V * 2;           /* bf16 [B, S, V]: lm_head under autocast */
    for (const char **v = versions; *v; v++) {
        MemsimTrace *t = gen(cfg, *v, NULL);
        gboolean before = strcmp(*v, "4.46") < 0;
        /* before: the contiguous shifted copy and the log-softmax of its rows */
        cr_expect_eq(forward_allocs(t, shifted), before ? 2 : 0, "%s: %d [B, S-1, V] fp32", *v,
                     forward_allocs(t, shifted));
        /* the bf16 logits are made either way (autocast's lm_head) */
        cr_expect_geq(forward_allocs(t, low), 1, "%s", *v);
        memsim_trace_free(t);
    }
    MemsimTrace *newest = gen(cfg, NULL, NULL);
    cr_expect_eq(forward_allocs(newest, shifted), 0);
    memsim_trace_free(newest);
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
}

/* The page renders the table: one row per rule, in order, with its name, release, families
 * and upstream file. */
Test(hf_versions, page_matches_the_table)
{
    g_autofree char *path = g_build_filename(g_getenv("MEMSIM_SOURCE_ROOT"), "traces",
                                             "transformers_versions.md", NULL);
    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(path, &text, NULL, NULL), "%s", path);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    guint row = 0;
    for (char **l = lines; *l; l++) {
        if (!g_str_has_prefix(*l, "| ") || g_str_has_prefix(*l, "| rule "))
            continue;
        g_auto(GStrv) cells = g_strsplit(*l + 1, "|", -1);
        cr_assert_geq(g_strv_length(cells), 4, "%s", *l);
        for (char **c = cells; *c; c++)
            g_strstrip(*c);
        const HfRule *r = hf_rule(row);
        cr_assert(r, "the page has more rows than the table: %s", *l);
        g_autofree char *since = g_strdup_printf("%d.%d", r->since / 1000, r->since % 1000);
        cr_expect_str_eq(cells[0], r->name);
        cr_expect_str_eq(cells[1], since, "%s", r->name);
        cr_expect_str_eq(cells[2], r->families, "%s", r->name);
        cr_expect_str_eq(cells[3], r->upstream, "%s", r->name);
        row++;
    }
    cr_expect_eq(row, N_HF_RULES, "the page has %u rows, the table %d", row, N_HF_RULES);
}
