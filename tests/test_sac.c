/* torchtitan's selective activation checkpointing (--checkpointing sac-op, sac-layer[:N]).
 *
 * sac-op: what a decoder layer keeps from its forward is the outputs of the ops torchtitan's
 * SelectiveAC policy marks MUST_SAVE (torchtitan/distributed/activation_checkpoint.py
 * SelectiveAC._wrap_block: the ops of the save set, except every second aten.mm of the pass).
 * Counted here from that policy for a Llama layer (q, k, v, o, gate, up, down projections in
 * that order: mm 1, 3, 5 and 7 are kept — q, v, gate, down — and the attention kernel's
 * outputs), the bytes a sac-op run holds at the end of its forward beyond a fully checkpointed
 * one must be exactly those. The same with a CPU recording of real PyTorch (Debian's 1.13,
 * tests/reference/hf_models.py sac_checkpoint: the policy written by hand under a dispatch
 * mode): the recorded kept bytes equal the count, and the generated ones and the peaks are
 * within 1% of the recording.
 *
 * sac-layer:N: torchtitan's _apply_layer_sac wraps block k (counted from 1) when k % N == 0. */
#include <criterion/criterion.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <math.h>
#include <string.h>

#include "testutil.h"

#define PYTHON "/usr/bin/python3"

/* tests/reference/record_reference.py's LLAMA: hidden 128, 4 heads of 32, 2 KV heads, MLP
 * 344, 2 layers, vocabulary 1000 */
static const char LLAMA[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 1000,"
    " \"hidden_size\": 128, \"intermediate_size\": 344, \"num_hidden_layers\": %d,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"hidden_act\": \"silu\","
    " \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0,"
    " \"tie_word_embeddings\": false, \"attention_bias\": false, \"mlp_bias\": false,"
    " \"attention_dropout\": 0.0, \"initializer_range\": 0.02, \"use_cache\": true,"
    " \"torch_dtype\": \"float32\"}";
enum { H = 128, NH = 4, NKV = 2, HD = 32, I = 344 };

static char *llama_config(int layers)
{
    g_autofree char *dir = tu_tmpdir();
    char *path = g_build_filename(dir, "config.json", NULL);
    g_autofree char *text = g_strdup_printf(LLAMA, layers);
    cr_assert(g_file_set_contents(path, text, -1, NULL));
    return path;
}

/* Requested bytes live when the first backward op of the trace's rank 0 begins: what the
 * forward of step 1 leaves for the backward. */
static int64_t live_at_backward(MemsimTrace *t)
{
    MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    GHashTable *live = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    int64_t now = 0;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind == MEMSIM_EV_OP && ev[i].id < h->n_ops &&
            h->ops[ev[i].id].phase == MEMSIM_PHASE_BACKWARD)
            break;
        if (ev[i].kind == MEMSIM_EV_ALLOC) {
            int64_t *k = g_new(int64_t, 1), *v = g_new(int64_t, 1);
            *k = (int64_t)ev[i].id;
            *v = (int64_t)ev[i].size;
            g_hash_table_replace(live, k, v);
            now += *v;
        } else if (ev[i].kind == MEMSIM_EV_FREE) {
            int64_t k = (int64_t)ev[i].id;
            int64_t *v = g_hash_table_lookup(live, &k);
            if (v) {
                now -= *v;
                g_hash_table_remove(live, &k);
            }
        }
    }
    g_hash_table_unref(live);
    return now;
}

static int64_t live_with(const char *cfg, const char *const *common, const char *ckpt)
{
    const char *s[40];
    int k = 0;
    for (const char *const *c = common; *c; c++)
        s[k++] = *c;
    s[k++] = "checkpointing";
    s[k++] = ckpt;
    s[k] = NULL;
    MemsimTrace *t = tu_generate(cfg, s);
    int64_t v = live_at_backward(t);
    memsim_trace_free(t);
    return v;
}

/* Per layer, what torchtitan's policy keeps, for T tokens of element size e: mm 1 (q_proj),
 * mm 3 (v_proj), mm 5 (gate_proj), mm 7 (down_proj). */
static int64_t kept_mm(int64_t T, int64_t e)
{
    return T * (NH * HD) * e + T * (NKV * HD) * e + T * I * e + T * H * e;
}

/* GPU defaults (bf16 autocast, SDPA's flash kernel): the four mm outputs in bf16 and the
 * flash kernel's output tuple — out [B,S,nh,hd] bf16, logsumexp [B,nh,S] fp32, the Philox
 * seed and offset (two int64) — as aten._scaled_dot_product_flash_attention returns them. */
Test(sac, op_level_keeps_the_policys_outputs_gpu)
{
    g_autofree char *cfg = llama_config(2);
    const int64_t B = 2, S = 64, T = B * S;
    const char *common[] = {"batch", "2", "seq", "64", "steps", "1", NULL};
    int64_t full = live_with(cfg, common, "full"), sac = live_with(cfg, common, "sac-op");
    int64_t per_layer = kept_mm(T, 2) + T * NH * HD * 2 + B * NH * S * 4 + 2 * 8;
    cr_expect_eq(sac - full, 2 * per_layer,
                 "sac-op keeps %" G_GINT64_FORMAT " bytes more than full, the policy %" G_GINT64_FORMAT,
                 sac - full, 2 * per_layer);
    /* with only mm in the save set, the attention kernel is recomputed */
    const char *mm_only[] = {"batch", "2", "seq", "64", "steps", "1", "sac-ops", "mm", NULL};
    int64_t sac_mm = live_with(cfg, mm_only, "sac-op");
    cr_expect_eq(sac_mm - full, 2 * kept_mm(T, 2));
    /* an empty save set is full checkpointing */
    const char *none[] = {"batch", "2", "seq", "64", "steps", "1", "sac-ops", "", NULL};
    cr_expect_eq(live_with(cfg, none, "sac-op"), full);
}

/* CPU kernels, fp32, eager attention (what torch 1.13 records): the mm outputs and both
 * bmm outputs of the attention (scores [B·nh, S, S], context [B·nh, S, hd]). */
static int64_t cpu_eager_kept(int64_t B, int64_t S, int layers)
{
    int64_t T = B * S;
    return layers * (kept_mm(T, 4) + B * NH * S * S * 4 + B * NH * S * HD * 4);
}

static const char *const cpu_run[] = {"batch", "2", "seq", "64", "steps", "2",
                                      "precision", "fp32", "optimizer-impl", "for-loop",
                                      "zero-grad", "none", "attention", "eager",
                                      "torch-version", "1.13", "device", "cpu", NULL};

Test(sac, op_level_keeps_the_policys_outputs_cpu)
{
    g_autofree char *cfg = llama_config(2);
    int64_t full = live_with(cfg, cpu_run, "full"), sac = live_with(cfg, cpu_run, "sac-op");
    cr_expect_eq(sac - full, cpu_eager_kept(2, 64, 2));
}

/* Layer SAC: sac-layer:1 is full checkpointing; on 4 layers sac-layer:2 checkpoints blocks 2
 * and 4 (counted from 1), so half the layers keep what an unwrapped layer keeps; sac-layer:5
 * wraps none. */
Test(sac, layer_sac_every_nth_block)
{
    g_autofree char *cfg = llama_config(4);
    const char *common[] = {"batch", "2", "seq", "64", "steps", "1", "use-cache", "false", NULL};
    int64_t none = live_with(cfg, common, "none"), full = live_with(cfg, common, "full");
    cr_expect_eq(live_with(cfg, common, "sac-layer:1"), full);
    cr_expect_eq(live_with(cfg, common, "sac-layer:5"), none);
    cr_expect_eq(live_with(cfg, common, "sac-layer:2") - full, (none - full) / 2);
    cr_expect_eq(live_with(cfg, common, "sac-layer"), live_with(cfg, common, "sac-layer:2"),
                 "torchtitan's selective_ac_option defaults to 2");
}

Test(sac, refusals)
{
    MemsimRun run = memsim_run_defaults();
    GError *e = NULL;
    cr_expect_not(memsim_run_set(&run, "checkpointing", "sac-layer:0", &e));
    g_clear_error(&e);
    cr_expect_not(memsim_run_set(&run, "checkpointing", "full:2", &e));
    g_clear_error(&e);
    cr_expect_not(memsim_run_set(&run, "sac-ops", "mm,conv", &e));
    cr_expect(e && strstr(e->message, "sac-ops"), "%s", e ? e->message : "");
    g_clear_error(&e);
    /* the save set only with sac-op */
    cr_assert(memsim_run_set(&run, "sac-ops", "mm", &e));
    cr_expect_not(memsim_run_check(&run, &e));
    cr_expect(e && strstr(e->message, "sac-ops"), "%s", e ? e->message : "");
    g_clear_error(&e);
    cr_assert(memsim_run_set(&run, "checkpointing", "sac-op", &e));
    cr_expect(memsim_run_check(&run, &e), "%s", e ? e->message : "");
    /* a Megatron run recomputes as Megatron-LM does */
    cr_assert(memsim_run_set(&run, "gpus", "2", &e));
    cr_assert(memsim_run_set(&run, "tp", "2", &e));
    cr_expect_not(memsim_run_check(&run, &e));
    cr_expect(e && strstr(e->message, "checkpointing"), "%s", e ? e->message : "");
    g_clear_error(&e);
    memsim_run_clear(&run);
}

/* The data-parallel methods take torchtitan's SAC as they take full checkpointing (the
 * wrapper is inside each FSDP unit / DeepSpeed's module): each runs, and keeps more than full
 * checkpointing and less than none. */
Test(sac, distributed_methods)
{
    g_autofree char *cfg = llama_config(2);
    const char *methods[] = {"ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", NULL};
    for (const char **m = methods; *m; m++) {
        const char *common[] = {"batch", "2", "seq", "64", "steps", "1", "gpus", "2",
                                "method", *m, NULL};
        int64_t full = live_with(cfg, common, "full"), sac = live_with(cfg, common, "sac-op");
        cr_expect_eq(sac - full, 2 * (kept_mm(128, 2) + 128 * NH * HD * 2 + 2 * NH * 64 * 4 + 16),
                     "%s: sac-op keeps %" G_GINT64_FORMAT " bytes more than full", *m, sac - full);
        live_with(cfg, common, "sac-layer:2");
    }
}

/* ---- against a CPU recording of torch 1.13 ---- */

static gboolean have_torch(void)
{
    if (!g_file_test(PYTHON, G_FILE_TEST_IS_EXECUTABLE))
        return FALSE;
    const char *probe[] = {PYTHON, "-c", "import torch", NULL};
    int st = 0;
    g_spawn_sync(NULL, (char **)probe, NULL, G_SPAWN_STDERR_TO_DEV_NULL, NULL, NULL, NULL, NULL,
                 &st, NULL);
    return g_spawn_check_wait_status(st, NULL);
}

static const MemsimStepPeaks *step_of(const MemsimRankReport *r, uint32_t step)
{
    for (guint i = 0; i < r->n_steps; i++)
        if (r->steps[i].step == step)
            return &r->steps[i];
    return NULL;
}

Test(sac_recorded, op_level_against_torch_1_13, .timeout = 300)
{
    if (!have_torch())
        cr_skip_test("%s with torch is absent (apt-get install python3-torch): the sac-op "
                     "recording cannot be made", PYTHON);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *script = g_build_filename(g_getenv("MEMSIM_SOURCE_ROOT"), "tests",
                                               "reference", "record_reference.py", NULL);
    const char *argv[] = {PYTHON, script, dir, "--case", "llama_gqa_sacop_b2_s64", "--case",
                          "llama_gqa_ckpt_b2_s64", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int st = 0;
    cr_assert(g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_DEFAULT, NULL, NULL, &out, &err,
                           &st, NULL) &&
                  g_spawn_check_wait_status(st, NULL),
              "recording failed: %s", err);
    GError *e = NULL;
    g_autofree char *sac_path = g_build_filename(dir, "llama_gqa_sacop_b2_s64.txt", NULL);
    g_autofree char *full_path = g_build_filename(dir, "llama_gqa_ckpt_b2_s64.txt", NULL);
    MemsimTrace *rs = memsim_trace_load(sac_path, &e), *rf = memsim_trace_load(full_path, &e);
    cr_assert(rs && rf, "%s", e ? e->message : "");
    int64_t kept_rec = live_at_backward(rs) - live_at_backward(rf);
    int64_t policy = cpu_eager_kept(2, 64, 2);
    /* PyTorch itself keeps what the policy says */
    cr_expect_eq(kept_rec, policy, "recorded: %" G_GINT64_FORMAT " bytes kept, policy %" G_GINT64_FORMAT,
                 kept_rec, policy);

    g_autofree char *cfg = llama_config(2);
    int64_t kept_gen = live_with(cfg, cpu_run, "sac-op") - live_with(cfg, cpu_run, "full");
    cr_expect_leq(fabs((double)(kept_gen - kept_rec)) / (double)kept_rec, 0.01,
                  "generated %" G_GINT64_FORMAT " kept bytes, recorded %" G_GINT64_FORMAT,
                  kept_gen, kept_rec);

    /* each step's peak allocated, replayed through `exact` */
    const char *s[40];
    int k = 0;
    for (const char *const *c = cpu_run; *c; c++)
        s[k++] = *c;
    s[k++] = "checkpointing";
    s[k++] = "sac-op";
    s[k] = NULL;
    MemsimTrace *gt = tu_generate(cfg, s);
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.allocator = "exact";
    MemsimReport *a = memsim_replay_trace(gt, &o, &e), *b = memsim_replay_trace(rs, &o, &e);
    cr_assert(a && b, "%s", e ? e->message : "");
    for (uint32_t step = 1; step <= 2; step++) {
        const MemsimStepPeaks *sa = step_of(&a->ranks[0], step), *sb = step_of(&b->ranks[0], step);
        cr_assert(sa && sb);
        double d = ((double)sa->peak_allocated - (double)sb->peak_allocated) /
                   (double)sb->peak_allocated;
        cr_expect_leq(fabs(d), 0.01, "step %u: generated %" G_GINT64_FORMAT ", recorded %" G_GINT64_FORMAT,
                      step, sa->peak_allocated, sb->peak_allocated);
        for (int ph = MEMSIM_PHASE_FORWARD; ph <= MEMSIM_PHASE_BACKWARD; ph++) {
            double pd = ((double)sa->phase_peak_allocated[ph] - (double)sb->phase_peak_allocated[ph]) /
                        (double)sb->phase_peak_allocated[ph];
            cr_expect_leq(fabs(pd), 0.01, "step %u %s: %+.3f%%", step, memsim_phase_name(ph),
                          100 * pd);
        }
    }
    memsim_report_free(a);
    memsim_report_free(b);
    memsim_trace_free(gt);
    memsim_trace_free(rs);
    memsim_trace_free(rf);
}
