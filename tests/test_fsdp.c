/* FSDP as real jobs configure it, against closed forms counted here from PyTorch's code:
 * FSDP1 (torch/distributed/fsdp/_flat_param.py) and FSDP2 (fsdp/_fully_shard/_fsdp_param.py)
 * under every sharding strategy and mixed-precision policy, with and without CPU offload.
 *
 * The model is tests/data/tiny-llama.json: H 256, MLP 688, 4 heads and 2 KV heads of 64,
 * 4 layers, vocabulary 1001, the head untied; every Linear weight is [out, in]:
 *   a layer  q [256, 256], k [128, 256], v [128, 256], o [256, 256],
 *            gate [688, 256], up [688, 256], down [256, 688], two norms [256]
 *   the root embed [1001, 256], norm [256], lm_head [1001, 256]
 *
 * FSDP1: one FlatParameter per layer and one for the root; each rank keeps
 * S = ⌈numel/N⌉ of each (FlatParamHandle._get_shard: chunk 0's size, padded), in fp32 (the
 * parameters' dtype; MixedPrecision only changes what is gathered); NO_SHARD keeps it all.
 * FSDP2: each parameter its own Shard(0), dim 0 padded to a multiple of N
 * (_get_dim0_padded_size): ⌈d0/N⌉ × the rest per parameter.
 * The optimizer (torch.optim.AdamW) holds two fp32 moments per shard element; the gradient
 * shard is fp32 whatever reduce_dtype was (cast back: _cast_grad_to_param_dtype, foreach_reduce).
 * CPU offload (CPUOffload(offload_params=True), CPUOffloadPolicy): shards, gradients and the
 * optimizer's state in host memory, none of it on the GPU: 4 + 4 + 8 bytes per shard element.
 *
 * The gathered parameters: besides the shards, backward holds the root and two layers (the
 * one computing and the one BACKWARD_PRE prefetched) unsharded, each N·S elements of
 * param_dtype (FSDP1: _full_param_padded; FSDP2: the unsharded parameters copied out of the
 * all-gather output, which is a communication buffer of its own). */
#include <criterion/criterion.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <memsim/trace.h>
#include <string.h>

#include "testutil.h"

#define H 256
#define KV 128
#define F 688
#define V 1001
#define L 4

static int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* FSDP1: the elements of each FlatParameter */
static int64_t layer_numel(void)
{
    return 2LL * H * H + 2LL * KV * H + 3LL * F * H + 2 * H;
}

static int64_t root_numel(void)
{
    return 2LL * V * H + H;
}

/* FSDP2: this rank's shard of a layer's / the root's parameters, each padded on dim 0 */
static int64_t layer_shard2(int64_t N)
{
    return 2 * cdiv(H, N) * H + 2 * cdiv(KV, N) * H + 2 * cdiv(F, N) * H + cdiv(H, N) * F +
           2 * cdiv(H, N);
}

static int64_t root_shard2(int64_t N)
{
    return 2 * cdiv(V, N) * H + cdiv(H, N);
}

static const MemsimBreakdown *state_of(const MemsimRankReport *r)
{
    for (guint i = 0; i < r->n_breakdowns; i++)
        if (strcmp(r->breakdowns[i].name, MEMSIM_BREAKDOWN_MODEL_STATE) == 0)
            return &r->breakdowns[i];
    cr_assert_fail("no model-state breakdown");
    return NULL;
}

typedef struct {
    const char *version, *sharding, *param, *reduce, *offload;
} Case;

static void check_case(const Case *k)
{
    g_autofree char *model = tu_test_data("tiny-llama.json");
    bool hybrid = strcmp(k->sharding, "hybrid") == 0;
    bool no_shard = strcmp(k->sharding, "no-shard") == 0;
    bool v2 = strcmp(k->version, "2") == 0;
    bool off = strcmp(k->offload, "true") == 0;
    /* 6 GPUs in nodes of 3: FULL_SHARD and SHARD_GRAD_OP shard over all 6, HYBRID_SHARD
     * within a node (3), NO_SHARD not at all; 256, 688, 1001 and the FlatParameters are not
     * multiples of 3 or 6, so the padding shows */
    int64_t N = no_shard ? 1 : hybrid ? 3 : 6;
    const char *settings[] = {"gpus", "6", "gpus-per-node", "3", "method", "fsdp", "seq", "64",
                              "fsdp-version", k->version, "fsdp-sharding", k->sharding,
                              "fsdp-param-dtype", k->param, "fsdp-reduce-dtype", k->reduce,
                              "fsdp-offload", k->offload, NULL};
    int64_t Sl = v2 ? layer_shard2(N) : cdiv(layer_numel(), N);
    int64_t Sr = v2 ? root_shard2(N) : cdiv(root_numel(), N);
    int64_t S = L * Sl + Sr;
    int64_t gp = strcmp(k->param, "fp32") == 0 ? 4 : 2;
    MemsimTrace *t = tu_generate(model, settings);
    GError *error = NULL;
    MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
    cr_assert(rep, "%s", error ? error->message : "?");
    const MemsimRankReport *r = &rep->ranks[0];
    const MemsimBreakdown *b = state_of(r);
    int64_t want_p = off ? 0 : 4 * S, want_g = off ? 0 : 4 * S, want_o = off ? 0 : 8 * S;
    int64_t want_host = off ? 16 * S : 0;
    cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], want_p,
                 "FSDP%s %s param %s reduce %s offload %s: parameters %" G_GINT64_FORMAT
                 " want %" G_GINT64_FORMAT,
                 k->version, k->sharding, k->param, k->reduce, k->offload,
                 b->requested[MEMSIM_CAT_PARAMETER], want_p);
    cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], want_g,
                 "FSDP%s %s param %s reduce %s offload %s: gradients %" G_GINT64_FORMAT
                 " want %" G_GINT64_FORMAT,
                 k->version, k->sharding, k->param, k->reduce, k->offload,
                 b->requested[MEMSIM_CAT_GRADIENT], want_g);
    cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], want_o,
                 "FSDP%s %s param %s reduce %s offload %s: optimizer %" G_GINT64_FORMAT
                 " want %" G_GINT64_FORMAT,
                 k->version, k->sharding, k->param, k->reduce, k->offload,
                 b->requested[MEMSIM_CAT_OPTIMIZER_STATE], want_o);
    cr_expect_eq((int64_t)r->host_peak, want_host,
                 "FSDP%s %s param %s reduce %s offload %s: host %" G_GINT64_FORMAT
                 " want %" G_GINT64_FORMAT,
                 k->version, k->sharding, k->param, k->reduce, k->offload,
                 (int64_t)r->host_peak, want_host);
    if (!no_shard && strcmp(k->sharding, "grad-op") != 0) {
        /* backward: the shards, the root and two layers unsharded in param_dtype */
        int64_t want_bw = (off ? 0 : 4 * S) + gp * N * Sr + 2 * gp * N * Sl;
        int64_t bw = tu_peak_live(t, MEMSIM_CAT_PARAMETER, MEMSIM_PHASE_BACKWARD);
        cr_expect_eq(bw, want_bw,
                     "FSDP%s %s param %s offload %s: backward holds %" G_GINT64_FORMAT
                     " parameter bytes, want %" G_GINT64_FORMAT,
                     k->version, k->sharding, k->param, k->offload, bw, want_bw);
    }
    memsim_report_free(rep);
    memsim_trace_free(t);
}

Test(fsdp, model_state_per_rank, .timeout = 300)
{
    const char *versions[] = {"1", "2"};
    const char *shardings[] = {"full", "grad-op", "hybrid", "no-shard"};
    const char *params[] = {"bf16", "fp32"};
    const char *reduces[] = {"fp32", "bf16"};
    const char *offloads[] = {"false", "true"};
    for (gsize a = 0; a < G_N_ELEMENTS(versions); a++)
        for (gsize s = 0; s < G_N_ELEMENTS(shardings); s++)
            for (gsize p = 0; p < G_N_ELEMENTS(params); p++)
                for (gsize r = 0; r < G_N_ELEMENTS(reduces); r++)
                    for (gsize o = 0; o < G_N_ELEMENTS(offloads); o++) {
                        Case k = {versions[a], shardings[s], params[p], reduces[r], offloads[o]};
                        /* FSDP2 has no NO_SHARD; offload with NO_SHARD is refused */
                        if (strcmp(k.sharding, "no-shard") == 0 &&
                            (a == 1 || strcmp(k.offload, "true") == 0))
                            continue;
                        check_case(&k);
                    }
}

/* The run keeps the model output (logits) through backward, the loss computed outside the
 * model: FSDP's loop holds the [B, T, V] logits one step longer, so the peak grows. */
Test(fsdp, keep_outputs_is_honoured, .timeout = 300)
{
    g_autofree char *model = tu_test_data("tiny-llama.json");
    const char *versions[] = {"1", "2"};
    for (gsize a = 0; a < G_N_ELEMENTS(versions); a++) {
        MemsimTrace *t[2];
        const char *keep[] = {"false", "true"};
        for (int i = 0; i < 2; i++) {
            const char *settings[] = {"gpus", "2", "method", "fsdp", "seq", "64",
                                      "fsdp-version", versions[a], "keep-outputs", keep[i], NULL};
            t[i] = tu_generate(model, settings);
        }
        gsize n0, n1;
        memsim_trace_events(t[0], 0, &n0);
        memsim_trace_events(t[1], 0, &n1);
        cr_expect(n0 != n1 || memcmp(memsim_trace_events(t[0], 0, &n0),
                                     memsim_trace_events(t[1], 0, &n1),
                                     n0 * sizeof(MemsimEvent)) != 0,
                  "FSDP%s: keep-outputs changes nothing", versions[a]);
        memsim_trace_free(t[0]);
        memsim_trace_free(t[1]);
    }
}

/* The parameter bytes rank 0's program holds when its first backward op of the last step
 * runs (ALLOC to FREE, the program's view). */
static int64_t params_at_backward_start(MemsimTrace *t)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    MemsimTraceHeader *h = memsim_trace_header(t);
    GHashTable *size = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    int64_t live = 0, at = -1;
    int prev = -1;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind == MEMSIM_EV_OP) {
            int ph = h->ops[ev[i].id].phase;
            if (ph == MEMSIM_PHASE_BACKWARD && prev == MEMSIM_PHASE_FORWARD)
                at = live; /* the last step's overwrites the first's */
            if (ph == MEMSIM_PHASE_FORWARD || ph == MEMSIM_PHASE_BACKWARD)
                prev = ph;
        } else if (ev[i].kind == MEMSIM_EV_ALLOC && ev[i].category == MEMSIM_CAT_PARAMETER) {
            int64_t *k = g_new(int64_t, 1);
            *k = (int64_t)ev[i].id;
            g_hash_table_insert(size, k, GSIZE_TO_POINTER((gsize)ev[i].size));
            live += (int64_t)ev[i].size;
        } else if (ev[i].kind == MEMSIM_EV_FREE) {
            int64_t k = (int64_t)ev[i].id;
            gpointer v;
            if (g_hash_table_lookup_extended(size, &k, NULL, &v)) {
                live -= (int64_t)GPOINTER_TO_SIZE(v);
                g_hash_table_remove(size, &k);
            }
        }
    }
    g_hash_table_unref(size);
    return at;
}

/* FSDP2's reshard_after_forward between forward and backward (_fsdp_param.py
 * to_sharded_post_forward, _fsdp_init.py _get_post_forward_mesh_info), N = 8, bf16
 * parameters: besides the fp32 shards (4·S) and the root (never resharded after forward:
 * 2·N·Sr), True keeps nothing of the layers, False every layer unsharded (2·N·Sl each), k
 * a 1/k share of each (2·N·Sl/k). */
Test(fsdp, reshard_after_forward_keeps, .timeout = 300)
{
    g_autofree char *model = tu_test_data("tiny-llama.json");
    const int64_t N = 8, Sl = layer_shard2(N), Sr = root_shard2(N), S = L * Sl + Sr;
    struct {
        const char *raf;
        int64_t layers;
    } want[] = {{"true", 0}, {"false", L * 2 * N * Sl}, {"2", L * 2 * N * Sl / 2},
                {"4", L * 2 * N * Sl / 4}};
    for (gsize i = 0; i < G_N_ELEMENTS(want); i++) {
        const char *settings[] = {"gpus", "8", "method", "fsdp", "seq", "64", "fsdp-version", "2",
                                  "fsdp-reshard-after-forward", want[i].raf, NULL};
        MemsimTrace *t = tu_generate(model, settings);
        int64_t got = params_at_backward_start(t), w = 4 * S + 2 * N * Sr + want[i].layers;
        cr_expect_eq(got, w, "reshard_after_forward=%s: %" G_GINT64_FORMAT " parameter bytes "
                     "when backward starts, want %" G_GINT64_FORMAT, want[i].raf, got, w);
        memsim_trace_free(t);
    }
}

/* LoRA (peft's default targets q_proj and v_proj, rank 16) under FSDP1, N = 6, the base in
 * bf16 and peft's adapters in fp32. lora_A is [16, in], lora_B [out, 16]: per layer q's
 * 16·256 + 256·16 and v's 16·256 + 128·16.
 *   --fsdp-wrap layer  one FlatParameter per layer with use_orig_params (the adapters take
 *                      the base's bf16, each parameter aligned to 16 bytes: every size here
 *                      is a multiple of 8 elements): ⌈(F + A)/N⌉ bf16; its gradient covers
 *                      the whole unit (bf16); Adam in bf16 on ⌈A/N⌉ per layer
 *   --fsdp-wrap lora   peft's fsdp_auto_wrap_policy (lambda_policy_fn: every leaf module whose
 *                      weight requires grad is a unit; the decoder layers another): the
 *                      frozen layer ⌈F/N⌉ bf16 without a gradient, each adapter ⌈a/N⌉ fp32
 *                      with an fp32 gradient and two fp32 moments */
Test(fsdp, lora_wrap_policy, .timeout = 300)
{
    g_autofree char *model = tu_test_data("tiny-llama.json");
    const int64_t N = 6, r = 16;
    const int64_t a[] = {r * H, H * r, r * H, KV * r};
    int64_t A = 0, Sa = 0;
    for (gsize i = 0; i < G_N_ELEMENTS(a); i++) {
        A += a[i];
        Sa += cdiv(a[i], N);
    }
    int64_t Fl = layer_numel(), Sr = cdiv(root_numel(), N);
    struct {
        const char *wrap;
        int64_t param, grad, opt;
    } want[] = {
        {"layer", 2 * (L * cdiv(Fl + A, N) + Sr), 2 * L * cdiv(Fl + A, N), 4 * L * cdiv(A, N)},
        {"lora", 2 * (L * cdiv(Fl, N) + Sr) + 4 * L * Sa, 4 * L * Sa, 8 * L * Sa},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(want); i++) {
        const char *settings[] = {"gpus", "6", "method", "fsdp", "seq", "64", "finetune", "lora",
                                  "fsdp-wrap", want[i].wrap, NULL};
        MemsimTrace *t = tu_generate(model, settings);
        GError *error = NULL;
        MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
        cr_assert(rep, "%s", error ? error->message : "?");
        const MemsimBreakdown *b = state_of(&rep->ranks[0]);
        cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], want[i].param,
                     "wrap %s: parameters %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT,
                     want[i].wrap, b->requested[MEMSIM_CAT_PARAMETER], want[i].param);
        cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], want[i].grad,
                     "wrap %s: gradients %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT,
                     want[i].wrap, b->requested[MEMSIM_CAT_GRADIENT], want[i].grad);
        cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], want[i].opt,
                     "wrap %s: optimizer %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT,
                     want[i].wrap, b->requested[MEMSIM_CAT_OPTIMIZER_STATE], want[i].opt);
        memsim_report_free(rep);
        memsim_trace_free(t);
    }
}

/* --fsdp-wrap size:N, FSDP1's size_based_auto_wrap_policy (torch/distributed/fsdp/wrap.py
 * _recursive_wrap): a module with at least N parameters not yet wrapped is recursed into and
 * its children wrapped first; it is wrapped itself when its remainder is at least N (never a
 * ModuleList). Counted on tiny-llama (a layer 725,504: attention 196,608, MLP 528,384; the
 * embedding and lm_head 256,256 each) and on the same with a vocabulary of 8001 (embedding
 * and lm_head 2,048,256 each). */
static char *write_config(const char *dir, const char *name, int vocab, bool tied)
{
    char *path = g_build_filename(dir, name, NULL);
    g_autofree char *text = g_strdup_printf(
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
        "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"num_hidden_layers\": %d, \"vocab_size\": %d, "
        "\"max_position_embeddings\": 2048, \"rms_norm_eps\": 1e-05, "
        "\"tie_word_embeddings\": %s, \"torch_dtype\": \"float32\"}",
        H, F, L, vocab, tied ? "true" : "false");
    cr_assert(g_file_set_contents(path, text, -1, NULL));
    return path;
}

static int64_t peak_of(const char *model, const char *wrap)
{
    const char *settings[] = {"gpus", "6", "method", "fsdp", "seq", "64", "fsdp-wrap", wrap, NULL};
    MemsimTrace *t = tu_generate(model, settings);
    GError *error = NULL;
    MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
    cr_assert(rep, "%s", error ? error->message : "?");
    int64_t p = rep->ranks[0].stats.allocated.peak;
    memsim_report_free(rep);
    memsim_trace_free(t);
    return p;
}

Test(fsdp, size_wrap_policy, .timeout = 300)
{
    g_autofree char *model = tu_test_data("tiny-llama.json");
    const int64_t N = 6;
    const int64_t attn = 2LL * H * H + 2LL * KV * H, mlp = 3LL * F * H;
    const int64_t T = layer_numel(), E = (int64_t)V * H;
    cr_assert_eq(T, attn + mlp + 2 * H);
    /* N in (MLP, T]: the layers are units, the embedding, norm and lm_head (E + H + E) stay
     * in the root — the units of --fsdp-wrap layer, the same program */
    g_autofree char *mid = g_strdup_printf("size:%" G_GINT64_FORMAT, mlp + 1);
    cr_expect_eq(peak_of(model, mid), peak_of(model, "layer"));
    /* N above every module: only the root, as --fsdp-wrap model */
    g_autofree char *big = g_strdup_printf("size:%" G_GINT64_FORMAT, L * T + 2 * E + H + 1);
    cr_expect_eq(peak_of(model, big), peak_of(model, "model"));
    /* N above T, below the base model's remainder: no layer unit, the base model one
     * (embedding, layers, norm: E + L·T + H), lm_head (E < N) in the root */
    g_autofree char *base = g_strdup_printf("size:%" G_GINT64_FORMAT, T + 1);
    {
        const char *settings[] = {"gpus", "6", "method", "fsdp", "seq", "64", "fsdp-wrap", base,
                                  NULL};
        MemsimTrace *t = tu_generate(model, settings);
        /* parameter storage: the base model's and the root's shards, fp32 (state), and in
         * backward both gathered in bf16: the root's pre-backward hook (on the loss)
         * prefetches the unit before it in the post-forward order, the base model, while the
         * root's lm_head computes its gradients (_runtime_utils.py _pre_backward_hook,
         * _get_handle_to_prefetch) */
        int64_t Sb = cdiv(E + L * T + H, N), Sr = cdiv(E, N);
        int64_t want_bw = 4 * (Sb + Sr) + 2 * N * (Sb + Sr);
        cr_expect_eq(tu_peak_live(t, MEMSIM_CAT_PARAMETER, MEMSIM_PHASE_BACKWARD), want_bw, "base unit: backward holds %" G_GINT64_FORMAT
                     " parameter bytes, want %" G_GINT64_FORMAT, tu_peak_live(t, MEMSIM_CAT_PARAMETER, MEMSIM_PHASE_BACKWARD), want_bw);
        memsim_trace_free(t);
    }
    /* a vocabulary of 8001 and N in (MLP, T]: units for each layer, the embedding and
     * lm_head; the root keeps the norm. Backward holds the shards and, at most, the root,
     * one layer and the embedding (BACKWARD_PRE from layer 0 prefetches it; lm_head was
     * resharded by its post-backward hook before layer 3's prefetch of layer 2) */
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *big_vocab = write_config(dir, "vocab.json", 8001, false);
    {
        const char *settings[] = {"gpus", "6", "method", "fsdp", "seq", "64", "fsdp-wrap", mid,
                                  NULL};
        MemsimTrace *t = tu_generate(big_vocab, settings);
        int64_t Sl = cdiv(T, N), Se = cdiv(8001LL * H, N), Sr = cdiv(H, N);
        int64_t S = L * Sl + 2 * Se + Sr;
        int64_t want_bw = 4 * S + 2 * N * (Sr + Se + Sl);
        cr_expect_eq(tu_peak_live(t, MEMSIM_CAT_PARAMETER, MEMSIM_PHASE_BACKWARD), want_bw, "embedding/head units: backward holds %"
                     G_GINT64_FORMAT " parameter bytes, want %" G_GINT64_FORMAT,
                     tu_peak_live(t, MEMSIM_CAT_PARAMETER, MEMSIM_PHASE_BACKWARD), want_bw);
        memsim_trace_free(t);
    }
    /* refusals, exit 2: units inside a layer (the message gives the range of N with one
     * unit per layer), and a tied embedding in a unit apart from the lm_head using it */
    g_autofree char *small = g_strdup_printf("size:%" G_GINT64_FORMAT, mlp);
    g_autofree char *tied = write_config(dir, "tied.json", 8001, true);
    g_autofree char *range = g_strdup_printf("from %" G_GINT64_FORMAT " to %" G_GINT64_FORMAT,
                                             mlp + 1, T);
    struct {
        const char *model, *wrap, *want;
    } bad[] = {{model, small, range}, {tied, mid, "tied"}};
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        char *out = NULL, *err = NULL;
        const char *argv[] = {"estimate", "--model", bad[i].model, "--gpus", "6", "--method",
                              "fsdp", "--seq", "64", "--fsdp-wrap", bad[i].wrap, NULL};
        cr_expect_eq(tu_run_memsim(argv, &out, &err), 2, "%s", err);
        cr_expect(err && strstr(err, bad[i].want), "%s: %s", bad[i].wrap, err);
        g_free(out);
        g_free(err);
    }
}
