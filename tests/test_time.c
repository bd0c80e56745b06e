/* The time model of generated traces, against the formulas it follows, computed here from
 * public figures: a GEMM's waves (NVIDIA's "Matrix Multiplication Background User's Guide",
 * wave quantization: 256 × 128 output tiles, one per SM per wave; A100: 108 SMs, 312 dense
 * bf16 TFLOP/s, 2039 GB/s on the 80 GB card) and NCCL's Ring latency (NVIDIA/nccl
 * src/graph/tuning.cc: baseLat 8.4 µs, hwLat 3.4 µs per NVLink step for the Simple
 * protocol); the replay's step parts add up to the step; a MIG slice is a profile of its
 * own. */
#include <criterion/criterion.h>
#include <math.h>
#include <memsim/estimate.h>
#include <memsim/formats.h>
#include <memsim/gen.h>
#include <memsim/megatron.h>
#include <memsim/sim.h>
#include <glib/gstdio.h>
#include <string.h>

#include "testutil.h"

#define A100_SMS 108
#define A100_BF16 312e12
#define A100_HBM 2039e9
#define A100_NVLINK 300e9 /* per direction */
#define EFF 0.5           /* of the tensor-core peak (traces/gpus.c) */
#define BW_EFF 0.8        /* of the bandwidths */

static MemsimTrace *generate(const char *model, const char *const *settings)
{
    GError *error = NULL;
    MemsimModel *m = memsim_model_load(model, &error);
    cr_assert(m, "%s", error ? error->message : "");
    MemsimRun run = memsim_run_defaults();
    for (const char *const *s = settings; *s; s += 2)
        cr_assert(memsim_run_set(&run, s[0], s[1], &error), "%s: %s", s[0],
                  error ? error->message : "");
    MemsimTrace *t = memsim_generate(m, &run, &error);
    cr_assert(t, "%s", error ? error->message : "");
    memsim_run_clear(&run);
    memsim_model_free(m);
    return t;
}

/* The time of one GEMM whose output is rows × cols with reduction k: its waves of tiles. */
static double gemm_us(double rows, double cols, double k)
{
    double tiles = ceil(rows / 256.0) * ceil(cols / 128.0);
    double waves = ceil(tiles / A100_SMS);
    return waves * A100_SMS * 2.0 * 256 * 128 * k / (EFF * A100_BF16) * 1e6;
}

/* GPT-2's first layer at batch 4 × 128 tokens (M = 512): c_attn 768 → 2304, attn c_proj
 * 768 → 768, c_fc 768 → 3072 each fill one wave (36, 6 and 48 tiles), as does the MLP's
 * c_proj 3072 → 768 with K = 3072: the forward addmms take their wave's time, not their
 * FLOPs' (11.6 µs for c_attn's 1.8 GFLOP at 156 TFLOP/s). */
Test(time, gemm_waves)
{
    const char *settings[] = {"batch", "4", "seq", "128", "steps", "1", "gpu", "a100-80gb", NULL};
    MemsimTrace *t = generate("gpt2", settings);
    MemsimTraceHeader *h = memsim_trace_header(t);
    double want_k768 = gemm_us(512, 2304, 768), want_k3072 = gemm_us(512, 768, 3072);
    cr_assert(fabs(gemm_us(512, 3072, 768) - want_k768) < 1e-9, "one wave each");
    int n = 0, n768 = 0, n3072 = 0;
    gsize n_ev = 0;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n_ev);
    for (gsize e = 0; e < n_ev; e++) {
        if (ev[e].kind != MEMSIM_EV_OP)
            continue;
        guint32 i = (guint32)ev[e].id;
        const MemsimOpInfo *op = &h->ops[i];
        if (op->layer != 0 || op->phase != MEMSIM_PHASE_FORWARD ||
            strcmp(h->strings[op->name], "addmm") != 0 || op->duration_us <= 0)
            continue;
        n++;
        cr_expect_eq(op->bound, MEMSIM_BOUND_COMPUTE, "addmm %u: compute-bound", i);
        if (fabs(op->duration_us - want_k768) < 1e-6 * want_k768)
            n768++;
        else if (fabs(op->duration_us - want_k3072) < 1e-6 * want_k3072)
            n3072++;
        else
            cr_expect(FALSE, "addmm %u: %.4f us, want %.4f or %.4f", i, op->duration_us,
                      want_k768, want_k3072);
    }
    cr_expect_eq(n, 4, "GPT-2's layer has four Conv1D addmms (got %d)", n);
    cr_expect_eq(n768, 3);
    cr_expect_eq(n3072, 1);
    memsim_trace_free(t);
}

/* DDP on 2 GPUs of an A100 node: each gradient bucket's all-reduce takes NCCL's Ring
 * latency, 8.4 + 2 (n − 1) · 3.4 µs, plus 2 (n − 1)/n of its bytes over NVLink at 80%. */
Test(time, nccl_ring_latency)
{
    const char *settings[] = {"batch", "1",   "seq", "128", "steps",     "1",
                              "gpus",  "2",   "method", "ddp", "gpu", "a100-80gb", NULL};
    MemsimTrace *t = generate("gpt2", settings);
    MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n_ev = 0;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n_ev);
    int n = 0;
    for (gsize i = 1; i < n_ev; i++) {
        if (ev[i].kind != MEMSIM_EV_COLLECTIVE || ev[i].aux != MEMSIM_COLL_ALL_REDUCE)
            continue;
        cr_assert_eq(ev[i - 1].kind, MEMSIM_EV_OP, "a collective follows its op");
        double got = h->ops[ev[i - 1].id].duration_us;
        double want = 8.4 + 2 * (2 - 1) * 3.4 +
                      2.0 * (2 - 1) / 2 * (double)ev[i].size / (BW_EFF * A100_NVLINK) * 1e6;
        cr_expect(fabs(got - want) < 1e-6 * want, "all-reduce of %" G_GUINT64_FORMAT
                  " bytes: %.4f us, want %.4f", ev[i].size, got, want);
        n++;
    }
    cr_expect_gt(n, 0, "DDP all-reduces its buckets");
    memsim_trace_free(t);
}

/* A step's parts are its time: compute + memory-bound + host overhead + waiting. */
Test(time, step_parts_add_up)
{
    GError *error = NULL;
    MemsimModel *m = memsim_model_load("gpt2", &error);
    cr_assert(m);
    MemsimRun run = memsim_run_defaults();
    memsim_run_set(&run, "batch", "2", NULL);
    memsim_run_set(&run, "seq", "256", NULL);
    memsim_run_set(&run, "gpu", "h100-80gb", NULL);
    MemsimEstimateOptions eo = MEMSIM_ESTIMATE_OPTIONS_INIT;
    MemsimReport *rep = memsim_estimate(m, &run, &eo, &error);
    cr_assert(rep, "%s", error ? error->message : "");
    const MemsimRankReport *r = &rep->ranks[0];
    cr_assert_gt(r->n_steps, 0);
    for (guint k = 0; k < r->n_steps; k++) {
        MemsimStepTime st;
        memsim_step_time(r, k, &st);
        cr_expect_gt(st.step_us, 0);
        double sum = st.compute_us + st.memory_us + st.overhead_us + st.waiting_us;
        cr_expect(fabs(sum - st.step_us) < 1e-6 * st.step_us, "step %u: %.3f != %.3f", k, sum,
                  st.step_us);
        cr_expect(fabs(st.bubble_us + st.exposed_comm_us - st.waiting_us) < 1e-9 * st.step_us);
        cr_expect_eq(st.bubble_us, 0, "one GPU has no pipeline");
    }
    memsim_report_free(rep);
    memsim_run_clear(&run);
    memsim_model_free(m);
}

/* A pipeline's stages wait on each other: 1F1B over 4 stages of GPT-2 with 8 micro-batches,
 * every stage but the slowest spends part of its step waiting for a neighbour (bubble), and
 * all stages take the same step time (they meet every micro-batch). */
Test(time, pipeline_bubble_from_the_schedule)
{
    GError *error = NULL;
    MemsimModel *m = memsim_model_load("gpt2", &error);
    cr_assert(m);
    MemsimRun run = memsim_run_defaults();
    const char *kv[] = {"gpus", "4", "method", "megatron", "tp", "1", "pp", "4",
                        "microbatches", "8", "seq", "512", NULL};
    for (const char *const *s = kv; *s; s += 2)
        cr_assert(memsim_run_set(&run, s[0], s[1], &error), "%s", s[0]);
    MemsimEstimateOptions eo = MEMSIM_ESTIMATE_OPTIONS_INIT;
    MemsimReport *rep = memsim_estimate(m, &run, &eo, &error);
    cr_assert(rep, "%s", error ? error->message : "");
    cr_assert_eq(rep->n_ranks, 4);
    double step0 = 0;
    int waited = 0;
    for (guint i = 0; i < rep->n_ranks; i++) {
        const MemsimRankReport *r = &rep->ranks[i];
        MemsimStepTime st;
        memsim_step_time(r, r->n_steps - 1, &st);
        if (i == 0)
            step0 = st.step_us;
        cr_expect(fabs(st.step_us - step0) < 1e-6 * step0, "stage %u: %.1f us, stage 0 %.1f", i,
                  st.step_us, step0);
        waited += st.bubble_us > 0;
    }
    cr_expect_geq(waited, 3, "only %d stages waited on a neighbour", waited);
    memsim_report_free(rep);
    memsim_run_clear(&run);
    memsim_model_free(m);
}

/* A MIG slice is a profile: nvidia-smi mig -lgip's memory and SMs for A100-SXM4-40GB's
 * 1g.5gb (4864 MiB, 14 SMs), peaks scaled by 14/108, bandwidth by one memory slice of 8. */
Test(time, mig_slice_profile)
{
    const MemsimGpu *g = memsim_gpu_find("a100-40gb"), *s = memsim_gpu_find("a100-40gb:1g.5gb");
    cr_assert(g && s);
    cr_expect_eq(s->memory, (memsim_size_t)4864 << 20);
    cr_expect_eq(s->sms, 14);
    cr_expect(fabs(s->bf16_tflops - 312.0 * 14 / 108) < 1e-9);
    cr_expect(fabs(s->hbm_gbs - 1555.0 / 8) < 1e-9);
    cr_expect_null(memsim_gpu_find("a100-40gb:9g.99gb"));
    cr_expect_null(memsim_gpu_find("h100-80gb:1g.5gb"));
}

/* A small Megatron launch (2 layers, micro-batch 2 of global 4, one GPU, H100, one step):
 * its parsed launch and run in *mg and *run, and its generated trace. */
static MemsimTrace *small_launch(MemsimMegatron **mg, MemsimRun *run)
{
    GError *error = NULL;
    const char *cmd = "torchrun --nproc-per-node 1 pretrain_gpt.py --num-layers 2 "
                      "--hidden-size 256 --num-attention-heads 4 --seq-length 256 "
                      "--max-position-embeddings 256 --micro-batch-size 2 "
                      "--global-batch-size 4 --bf16 --vocab-file v.json --merge-file m.txt";
    *mg = memsim_megatron_parse(cmd, "test", &error);
    cr_assert(*mg, "%s", error ? error->message : "");
    *run = memsim_run_defaults();
    memsim_megatron_apply(*mg, run);
    memsim_run_set(run, "steps", "1", NULL);
    memsim_run_set(run, "gpu", "h100-80gb", NULL);
    MemsimTrace *t = memsim_generate(memsim_megatron_model(*mg), run, &error);
    cr_assert(t, "%s", error ? error->message : "");
    return t;
}

/* A Megatron launch's module calls carry their published host time (Transformer Engine pull
 * request #1191: 115 µs per TE module forward): one TE linear-module forward per linear
 * Megatron's TransformerLayer runs (megatron/core/transformer/attention.py linear_qkv,
 * linear_proj; mlp.py linear_fc1, linear_fc2: four per layer) per micro-batch, and the output
 * layer's (Megatron's own ColumnParallelLinear, gpt_model.py output_layer) once per
 * micro-batch; each is host time only, which the replay puts on the host's clock. */
Test(time, megatron_module_host_time)
{
    GError *error = NULL;
    MemsimMegatron *mg;
    MemsimRun run;
    MemsimTrace *t = small_launch(&mg, &run);
    MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n = 0;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    int fwd = 0, bwd = 0;
    double host = 0;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind != MEMSIM_EV_OP || h->ops[ev[i].id].bound != MEMSIM_BOUND_HOST)
            continue;
        const MemsimOpInfo *op = &h->ops[ev[i].id];
        cr_expect_gt(op->duration_us, 0);
        cr_expect_leq(op->duration_us, 115.0, "%s: %.1f us", h->strings[op->name],
                      op->duration_us);
        host += op->duration_us;
        fwd += strcmp(h->strings[op->name], "host:linear forward") == 0;
        bwd += strcmp(h->strings[op->name], "host:linear backward") == 0;
    }
    int micro = 2; /* global 4 / (micro-batch 2 × one rank) */
    cr_expect_eq(fwd, micro * (2 * 4 + 1), "linear forwards: %d", fwd);
    cr_expect_eq(bwd, micro * (2 * 4 + 1), "linear backwards: %d", bwd);
    MemsimEstimateOptions eo = MEMSIM_ESTIMATE_OPTIONS_INIT;
    MemsimReport *rep = memsim_estimate(memsim_megatron_model(mg), &run, &eo, &error);
    cr_assert(rep, "%s", error ? error->message : "");
    const MemsimRankReport *r = &rep->ranks[0];
    cr_assert_eq(r->n_steps, 1);
    cr_expect_geq(r->steps[0].host_us, host, "the step's host time %.1f us lacks the modules' %.1f",
                  r->steps[0].host_us, host);
    memsim_report_free(rep);
    memsim_trace_free(t);
    memsim_run_clear(&run);
    memsim_megatron_free(mg);
}

/* A written trace keeps its host-only ops (Op.bound in .mst, opinfo bound= in text): its
 * replay puts the same time on the host's clock as the replay of the generated trace. */
Test(time, host_ops_survive_the_trace_formats)
{
    GError *error = NULL;
    MemsimMegatron *mg;
    MemsimRun run;
    MemsimTrace *t = small_launch(&mg, &run);
    const MemsimTraceHeader *h = memsim_trace_header(t);
    guint32 host_ops = 0;
    for (guint32 i = 0; i < h->n_ops; i++)
        host_ops += h->ops[i].bound == MEMSIM_BOUND_HOST;
    cr_assert_gt(host_ops, 0, "the launch's trace has no host-only op");
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    MemsimReport *base = memsim_replay_trace(t, &o, &error);
    cr_assert(base, "%s", error ? error->message : "");
    cr_assert_gt(base->ranks[0].steps[0].host_us, 0);
    g_autofree char *dir = tu_tmpdir();
    const char *names[] = {"t.mst", "t.txt"};
    for (gsize k = 0; k < G_N_ELEMENTS(names); k++) {
        g_autofree char *path = g_build_filename(dir, names[k], NULL);
        cr_assert(memsim_trace_save(t, path, MEMSIM_FORMAT_AUTO, &error), "%s",
                  error ? error->message : "");
        MemsimTrace *back = memsim_trace_load(path, &error);
        cr_assert(back, "%s: %s", names[k], error ? error->message : "");
        const MemsimTraceHeader *hb = memsim_trace_header(back);
        cr_assert_eq(hb->n_ops, h->n_ops);
        for (guint32 i = 0; i < h->n_ops; i++)
            cr_expect_eq(hb->ops[i].bound, h->ops[i].bound, "%s: op %u's bound", names[k], i);
        MemsimReport *rep = memsim_replay_trace(back, &o, &error);
        cr_assert(rep, "%s", error ? error->message : "");
        cr_expect_eq(rep->ranks[0].steps[0].host_us, base->ranks[0].steps[0].host_us,
                     "%s: host %.3f us, generated %.3f us", names[k],
                     rep->ranks[0].steps[0].host_us, base->ranks[0].steps[0].host_us);
        memsim_report_free(rep);
        memsim_trace_free(back);
        g_unlink(path);
    }
    g_rmdir(dir);
    memsim_report_free(base);
    memsim_trace_free(t);
    memsim_run_clear(&run);
    memsim_megatron_free(mg);
}

/* The host's synchronizations of a 1F1B pipeline (core/pipeline_parallel/schedules.py
 * forward_backward_pipelining_without_interleaving, with batched p2p: p2p_communication.py
 * _communicate ends in torch.cuda.synchronize()), counted from the schedule for pp = 2 and
 * m = 4 micro-batches. Stage 0: one warm-up forward and its send_forward (1), three steady
 * send_forward_recv_backward (3; its send_backward_recv_forward are no-ops on the first
 * stage), one cool-down recv_backward (1): m + 1 = 5. Stage 1 (last): the recv_forward
 * before the steady loop (1), three send_backward_recv_forward and the last send_backward
 * (4; its send_forward_recv_backward are no-ops on the last stage): m + 1 = 5. */
Test(time, megatron_p2p_synchronize)
{
    GError *error = NULL;
    const char *cmd = "torchrun --nproc-per-node 2 pretrain_gpt.py --num-layers 2 "
                      "--hidden-size 256 --num-attention-heads 4 --seq-length 256 "
                      "--max-position-embeddings 256 --micro-batch-size 1 "
                      "--global-batch-size 4 --pipeline-model-parallel-size 2 --bf16 "
                      "--vocab-file v.json --merge-file m.txt";
    MemsimMegatron *mg = memsim_megatron_parse(cmd, "test", &error);
    cr_assert(mg, "%s", error ? error->message : "");
    MemsimRun run = memsim_run_defaults();
    memsim_megatron_apply(mg, &run);
    memsim_run_set(&run, "steps", "1", NULL);
    memsim_run_set(&run, "gpu", "h100-80gb", NULL);
    MemsimTrace *t = memsim_generate(memsim_megatron_model(mg), &run, &error);
    cr_assert(t, "%s", error ? error->message : "");
    MemsimTraceHeader *h = memsim_trace_header(t);
    cr_assert_eq(h->n_ranks, 2);
    for (guint32 r = 0; r < 2; r++) {
        gsize n = 0;
        const MemsimEvent *ev = memsim_trace_events(t, r, &n);
        int syncs = 0;
        for (gsize i = 0; i < n; i++)
            if (ev[i].kind == MEMSIM_EV_OP &&
                strcmp(h->strings[h->ops[ev[i].id].name], "torch.cuda.synchronize (p2p)") == 0) {
                syncs++;
                cr_expect(i + 1 < n && ev[i + 1].kind == MEMSIM_EV_WAIT &&
                              (ev[i + 1].flags & MEMSIM_EVF_HOST),
                          "stage %u: a synchronize the host does not wait on", r);
            }
        cr_expect_eq(syncs, 4 + 1, "stage %u: %d synchronizes", r, syncs);
    }
    memsim_trace_free(t);
    memsim_run_clear(&run);
    memsim_megatron_free(mg);
}
