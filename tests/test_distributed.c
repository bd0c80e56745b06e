/* Distributed methods: model-state bytes per rank against the closed forms of DeepSpeed's ZeRO
 * paper, FSDP's flat-parameter padding and Megatron's sharding; pipeline schedules on the
 * simulated timeline; streams; bad combinations. */
#include <criterion/criterion.h>
#include <memsim/gen.h>
#include <math.h>
#include <memsim/formats.h>
#include <memsim/sim.h>
#include <string.h>
#include <glib/gstdio.h>

#include "testutil.h"

static MemsimReport *run_dist(const char *model, const char *const *settings, MemsimTrace **keep)
{
    GError *error = NULL;
    MemsimTrace *t = tu_generate(model, settings);
    MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
    cr_assert(rep, "%s", error ? error->message : "?");
    if (keep)
        *keep = t;
    else
        memsim_trace_free(t);
    return rep;
}

static const MemsimBreakdown *state_of(const MemsimRankReport *r)
{
    for (guint i = 0; i < r->n_breakdowns; i++)
        if (strstr(r->breakdowns[i].name, "model state"))
            return &r->breakdowns[i];
    cr_assert_fail("no model-state breakdown");
    return NULL;
}


/* ZeRO (Rajbhandari et al. 2020, §5): with Ψ parameters, N ranks and mixed-precision Adam
 * (K = 12 bytes of fp32 master + two moments per parameter):
 *   stage 1: 2Ψ + 2Ψ + KΨ/N;  stage 2: 2Ψ + (2 + K)Ψ/N;  stage 3: (2 + 2 + K)Ψ/N
 * with Ψ padded to a multiple of 2N elements (DeepSpeed's flat-buffer alignment). DDP keeps
 * everything (fp32 parameters under autocast): 4Ψ + 4Ψ gradients + 4Ψ buckets + 8Ψ Adam. */
Test(distributed, zero_and_ddp_closed_forms, .timeout = 300)
{
    const char *model = "opt-125m";
    /* facebook/opt-125m's published parameter count (its checkpoint's tensors, the embedding
     * tied to the head counted once; test_generator lists the presets' published counts) */
    int64_t psi = 125239296;
    const int Ns[] = {2, 4, 8};
    for (gsize k = 0; k < G_N_ELEMENTS(Ns); k++) {
        int N = Ns[k];
        char gpus[8];
        g_snprintf(gpus, sizeof gpus, "%d", N);
        int64_t pad = (psi + 2 * N - 1) / (2 * N) * (2 * N);
        struct {
            const char *method;
            int64_t param, grad, opt;
        } want[] = {
            {"ddp", 4 * psi, 4 * psi, 8 * psi},
            {"zero1", 2 * pad, 2 * psi, 12 * pad / N},
            {"zero2", 2 * pad, 2 * pad / N, 12 * pad / N},
            {"zero3", 2 * pad / N, 2 * pad / N, 12 * pad / N},
        };
        for (gsize i = 0; i < G_N_ELEMENTS(want); i++) {
            const char *settings[] = {"gpus", gpus, "method", want[i].method, "seq", "128", NULL};
            MemsimReport *rep = run_dist(model, settings, NULL);
            cr_assert_eq(rep->n_ranks, 1, "data-parallel ranks share one role");
            cr_expect_eq(rep->ranks[0].multiplicity, (uint32_t)N);
            const MemsimBreakdown *b = state_of(&rep->ranks[0]);
            cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], want[i].param, "%s N=%d params %"
                         G_GINT64_FORMAT " want %" G_GINT64_FORMAT, want[i].method, N,
                         b->requested[MEMSIM_CAT_PARAMETER], want[i].param);
            cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], want[i].grad, "%s N=%d grads %"
                         G_GINT64_FORMAT " want %" G_GINT64_FORMAT, want[i].method, N,
                         b->requested[MEMSIM_CAT_GRADIENT], want[i].grad);
            cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], want[i].opt, "%s N=%d optim",
                         want[i].method, N);
            if (strcmp(want[i].method, "ddp") == 0) /* the rebuilt buckets hold every grad */
                cr_expect_eq(b->requested[MEMSIM_CAT_COMM_BUFFER], 4 * psi);
            memsim_report_free(rep);
        }
    }
}

/* FSDP FULL_SHARD: one FlatParameter per decoder layer plus the root; each rank keeps
 * S = ⌈numel/N⌉ of every unit (the shard padded to chunk 0's size): fp32 shard, fp32
 * gradient shard, two fp32 Adam moments. The units of Llama-2-7B, from its config: a layer
 * holds 4·4096² + 3·4096·11008 + 2·4096 elements; the root the embedding, the final norm
 * and the untied head: 2·32000·4096 + 4096. */
Test(distributed, fsdp_flat_parameter_padding, .timeout = 300)
{
    int64_t layer = 4LL * 4096 * 4096 + 3LL * 4096 * 11008 + 2 * 4096;
    int64_t root = 2LL * 32000 * 4096 + 4096;
    const int Ns[] = {3, 8};
    for (gsize k = 0; k < G_N_ELEMENTS(Ns); k++) {
        int N = Ns[k];
        int64_t S = 32 * ((layer + N - 1) / N) + (root + N - 1) / N;
        char gpus[8];
        g_snprintf(gpus, sizeof gpus, "%d", N);
        const char *settings[] = {"gpus", gpus, "method", "fsdp", "seq", "64", "steps", "1",
                                  NULL};
        MemsimReport *rep = run_dist("llama-2-7b", settings, NULL);
        const MemsimBreakdown *b = state_of(&rep->ranks[0]);
        cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], 4 * S, "N=%d: %" G_GINT64_FORMAT
                     " want %" G_GINT64_FORMAT, N, b->requested[MEMSIM_CAT_PARAMETER], 4 * S);
        cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], 4 * S);
        cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], 8 * S);
        memsim_report_free(rep);
    }
}

/* Megatron with TP t, PP p, DP d and the distributed optimizer: bf16 parameters (2 bytes),
 * an fp32 main-grad buffer (4) and fp32 main parameters + two Adam moments (12) split over d
 * (Megatron's theoretical_memory_usage: 6 + 12/d bytes per parameter, with the fp32 grads).
 * Llama-2-70B per layer on one TP rank (H 8192, 64 heads, 8 kv heads, head 128, MLP 28672):
 * q and o 8192·1024 each, k and v 8192·128 each, MLP 3·8192·3584, two norms 8192; the
 * vocabulary is padded to a multiple of 128·t (32768) and split: 4096·8192 per rank; the
 * last stage adds the final norm and the head. */
Test(distributed, megatron_sharding, .timeout = 300)
{
    const char *settings[] = {"gpus", "64", "tp", "8", "pp", "4", "dp", "2", "microbatches", "4",
                              "seq", "256", "steps", "1", NULL};
    MemsimReport *rep = run_dist("llama-2-70b", settings, NULL);
    cr_assert_eq(rep->n_ranks, 4, "one role per pipeline stage");
    int64_t layer = 2LL * 8192 * 1024 + 2LL * 8192 * 128 + 3LL * 8192 * 3584 + 2 * 8192;
    int64_t emb = 4096LL * 8192;
    for (guint s = 0; s < 4; s++) {
        const MemsimRankReport *r = &rep->ranks[s];
        cr_expect_eq(r->multiplicity, 16);
        int64_t psi = 20 * layer + (s == 0 ? emb : 0) + (s == 3 ? emb + 8192 : 0);
        const MemsimBreakdown *b = state_of(r);
        cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], 2 * psi, "stage %u", s);
        cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], 4 * psi, "stage %u", s);
        cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], 12 * ((psi + 1) / 2), "stage %u",
                     s);
    }
    memsim_report_free(rep);
}

/* The most (micro-batch, chunk) activations stage 0 holds at once on its timeline: forwards
 * begun and backwards not yet begun, read off its program. `per_chunk` = layers per chunk
 * (L / (p·v)), `p` = stages. */
static int max_inflight(MemsimTrace *t, int64_t per_chunk, int p)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    MemsimTraceHeader *h = memsim_trace_header(t);
    GHashTable *fwd = g_hash_table_new(NULL, NULL), *bwd = g_hash_table_new(NULL, NULL);
    int best = 0;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind != MEMSIM_EV_OP)
            continue;
        const MemsimOpInfo *op = &h->ops[ev[i].id];
        if (op->microbatch < 0 || op->layer < 0)
            continue;
        int chunk = (int)(op->layer / per_chunk) / p;
        gpointer key = GINT_TO_POINTER(op->microbatch * 64 + chunk + 1);
        if (op->phase == MEMSIM_PHASE_FORWARD)
            g_hash_table_add(fwd, key);
        else if (op->phase == MEMSIM_PHASE_BACKWARD)
            g_hash_table_add(bwd, key);
        int now = (int)g_hash_table_size(fwd) - (int)g_hash_table_size(bwd);
        if (now > best)
            best = now;
    }
    g_hash_table_unref(fwd);
    g_hash_table_unref(bwd);
    return best;
}

/* p = 4 stages, m = 8 micro-batches of Llama-2-7B (32 layers). DISTRIBUTED.md §5.3: 1F1B's
 * first stage holds min(p, m) = 4 micro-batches (warm-up p − 1 = 3, plus one); GPipe holds
 * all m = 8; interleaved with v = 2 chunks holds warm-up 2(p − 1) + (v − 1)p = 10 chunks plus
 * one = 11 chunk-micro-batches of L/(p·v) = 4 layers — 44 layers' worth against 1F1B's
 * 4 × 8 = 32: the documented extra factor 1 + (p − 1)/(p·v) = 1.375. */
Test(distributed, pipeline_schedules_in_flight, .timeout = 300)
{
    const char *one[] = {"gpus", "4", "pp", "4", "microbatches", "8", "pp-schedule", "1f1b",
                         "seq", "256", "steps", "1", NULL};
    const char *gpipe[] = {"gpus", "4", "pp", "4", "microbatches", "8", "pp-schedule", "gpipe",
                           "seq", "256", "steps", "1", NULL};
    const char *inter[] = {"gpus", "4", "pp", "4", "microbatches", "8", "pp-schedule",
                           "interleaved", "virtual-stages", "2", "seq", "256", "steps", "1", NULL};
    MemsimTrace *t1 = NULL, *t2 = NULL, *t3 = NULL;
    MemsimReport *a = run_dist("llama-2-7b", one, &t1);
    MemsimReport *b = run_dist("llama-2-7b", gpipe, &t2);
    MemsimReport *c = run_dist("llama-2-7b", inter, &t3);
    cr_expect_eq(max_inflight(t1, 8, 4), 4, "1F1B stage 0");
    cr_expect_eq(max_inflight(t2, 8, 4), 8, "GPipe stage 0");
    int fi = max_inflight(t3, 4, 4);
    cr_expect_eq(fi, 11, "interleaved stage 0: %d chunk-micro-batches", fi);
    cr_expect_eq(fi * 4 * 1000 / (4 * 8), 1375, "the interleaving factor");
    /* GPipe's first stage reaches a higher backward peak than 1F1B's */
    cr_expect_gt(b->ranks[0].steps[0].phase_peak_allocated[MEMSIM_PHASE_BACKWARD],
                 a->ranks[0].steps[0].phase_peak_allocated[MEMSIM_PHASE_BACKWARD]);
    memsim_report_free(a);
    memsim_report_free(b);
    memsim_report_free(c);
    memsim_trace_free(t1);
    memsim_trace_free(t2);
    memsim_trace_free(t3);
}

/* TORCH_ALLOCATOR.md §3.2 and §5.3: a free block is reusable only by its own stream. A
 * 64 MiB buffer gathered on stream 1 (as FSDP's all-gather destination), used on stream 0
 * (record_stream) and freed, then a 64 MiB allocation on stream 0: on two streams the second
 * request cannot take the cached block and gets a new segment — 128 MiB reserved; on one
 * stream it reuses it — 64 MiB. The spec predicts exactly 64 MiB more. */
Test(distributed, second_stream_raises_reserved_by_the_spec_amount)
{
    const uint64_t MiB64 = 64ull << 20;
    for (int streams = 1; streams <= 2; streams++) {
        MemsimTrace *t = memsim_trace_new("two streams");
        memsim_trace_add_rank(t, 0, 1);
        uint16_t s1 = streams == 2 ? 1 : 0;
        MemsimEvent ev[] = {
            {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = MiB64, .stream = s1},
            {.kind = MEMSIM_EV_USE, .id = 1, .stream = 0},
            {.kind = MEMSIM_EV_FREE, .id = 1},
            {.kind = MEMSIM_EV_ALLOC, .id = 2, .size = MiB64, .stream = 0},
            {.kind = MEMSIM_EV_FREE, .id = 2},
        };
        memsim_trace_append(t, 0, ev, G_N_ELEMENTS(ev));
        GError *error = NULL;
        MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
        cr_assert(rep, "%s", error ? error->message : "?");
        cr_expect_eq((uint64_t)rep->ranks[0].stats.reserved.peak, streams * MiB64,
                     "%d stream(s): reserved %" G_GINT64_FORMAT, streams,
                     rep->ranks[0].stats.reserved.peak);
        memsim_report_free(rep);
        memsim_trace_free(t);
    }
}

/* The same FSDP trace, its communication streams folded onto the compute stream, reserves
 * less: the gathered buffers no longer sit in pools the compute stream cannot use. */
Test(distributed, fsdp_streams_cost_reserved_memory, .timeout = 300)
{
    const char *settings[] = {"gpus", "4", "method", "fsdp", "seq", "256", NULL};
    MemsimTrace *t = NULL;
    MemsimReport *two = run_dist("opt-350m", settings, &t);
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    MemsimTrace *flat = memsim_trace_new("one stream");
    memsim_trace_add_rank(flat, 0, 1);
    MemsimTraceHeader *h = memsim_trace_header(t);
    for (guint32 i = 0; i < h->n_strings; i++)
        memsim_trace_intern(flat, h->strings[i]);
    for (guint32 i = 0; i < h->n_ops; i++)
        memsim_trace_add_op(flat, &h->ops[i]);
    GArray *a = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
    for (gsize i = 0; i < n; i++) {
        MemsimEvent e = ev[i];
        if (e.kind == MEMSIM_EV_USE || e.kind == MEMSIM_EV_WAIT)
            continue;
        e.stream = 0;
        g_array_append_val(a, e);
    }
    memsim_trace_append(flat, 0, (MemsimEvent *)a->data, a->len);
    g_array_unref(a);
    GError *error = NULL;
    MemsimReport *one = memsim_replay_trace(flat, NULL, &error);
    cr_assert(one, "%s", error ? error->message : "?");
    cr_expect_gt(two->ranks[0].stats.reserved.peak, one->ranks[0].stats.reserved.peak,
                 "two streams %" G_GINT64_FORMAT ", one %" G_GINT64_FORMAT,
                 two->ranks[0].stats.reserved.peak, one->ranks[0].stats.reserved.peak);
    memsim_report_free(one);
    memsim_report_free(two);
    memsim_trace_free(flat);
    memsim_trace_free(t);
}

static void expect_conflict(const char *const *argv, const char *needle)
{
    g_autofree char *err = NULL;
    int rc = tu_run_memsim(argv, NULL, &err);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, err);
    cr_expect(strstr(err, needle) != NULL, "the message names %s: %s", needle, err);
}

Test(distributed, bad_combinations)
{
    const char *a[] = {"estimate", "--model", "llama-2-7b", "--gpus", "8", "--tp", "3", NULL};
    expect_conflict(a, "tp");
    const char *b[] = {"estimate", "--model", "gpt2", "--seq", "512", "--gpus", "64", "--pp", "64",
                       NULL};
    expect_conflict(b, "pp");
    const char *c[] = {"estimate", "--model", "llama-2-7b", "--gpus", "8", "--tp", "2",
                       "--pp", "2", "--dp", "3", NULL};
    expect_conflict(c, "gpus");
    const char *d[] = {"estimate", "--model", "llama-2-7b", "--gpus", "8", NULL};
    expect_conflict(d, "method");
    const char *e[] = {"estimate", "--model", "llama-2-7b", "--gpus", "8", "--method", "fsdp",
                       "--gpu", "tpu-v5", NULL};
    expect_conflict(e, "a100-80gb");
    const char *f[] = {"estimate", "--model", "llama-2-7b", "--gpus", "8", "--tp", "8",
                       "--finetune", "lora", NULL};
    expect_conflict(f, "Megatron-LM has no LoRA");
}

/* Activation bytes of one transformer layer, measured as the difference between a 2-layer
 * and a 1-layer model after the first forward (what a layer adds), for a GPT layer as
 * Korthikanti et al. 2022 count it: 16-bit activations, 1-byte dropout masks, GeLU MLP of
 * 4h, dropout 0.1, eager attention. */
static int64_t layer_bytes(int64_t h, int64_t a, int t, const char *ckpt, gboolean sp)
{
    int64_t bytes[2];
    for (int L = 1; L <= 2; L++) {
        g_autofree char *dir = tu_tmpdir();
        g_autofree char *cfg = g_build_filename(dir, "config.json", NULL);
        g_autofree char *json = g_strdup_printf(
            "{\"model_type\": \"gpt2\", \"vocab_size\": 51200, \"n_embd\": %" G_GINT64_FORMAT
            ", \"n_head\": %" G_GINT64_FORMAT ", \"n_layer\": %d, \"n_positions\": 2048, "
            "\"activation_function\": \"gelu\", \"resid_pdrop\": 0.1, \"embd_pdrop\": 0.1, "
            "\"attn_pdrop\": 0.1, \"use_cache\": false}",
            h, a, L);
        cr_assert(g_file_set_contents(cfg, json, -1, NULL));
        char ts[8];
        g_snprintf(ts, sizeof ts, "%d", t);
        const char *settings[] = {"gpus", ts, "method", "megatron", "tp", ts, "microbatches", "1",
                                  "batch", "1", "seq", "2048", "attention", "eager", "steps", "1",
                                  "checkpointing", ckpt, "sequence-parallel",
                                  sp ? "true" : "false", NULL};
        MemsimReport *rep = run_dist(cfg, settings, NULL);
        const MemsimRankReport *r = &rep->ranks[0];
        const MemsimBreakdown *b = NULL;
        for (guint i = 0; i < r->n_breakdowns; i++)
            if (strstr(r->breakdowns[i].name, "first forward"))
                b = &r->breakdowns[i];
        cr_assert(b);
        bytes[L - 1] = b->requested[MEMSIM_CAT_ACTIVATION] + b->requested[MEMSIM_CAT_TEMPORARY] +
                       b->requested[MEMSIM_CAT_COMM_BUFFER] + b->requested[MEMSIM_CAT_KV_CACHE];
        memsim_report_free(rep);
    }
    return bytes[1] - bytes[0];
}

/* Table 2 of Korthikanti et al. 2022 (bytes per layer), at the GPT-3 175B size the paper
 * uses (h 12288, a 96, s 2048, micro-batch 1, t 8):
 *   no parallelism                 sbh(34 + 5as/h)
 *   tensor parallel                sbh(10 + 24/t + 5as/(ht))
 *   tensor + sequence parallel     sbh(34/t + 5as/(ht))
 *   tensor parallel + selective    sbh(10 + 24/t)
 *   tensor + sequence + selective  sbh(34/t)
 *   full recompute                 2sbh
 * The generated layer saves what the paper counts plus LayerNorm's fp32 mean and rstd per
 * token (2 norms × 8 bytes = 16 bytes per token, not in the paper's sum): 0.01% here. */
Test(distributed, korthikanti_table_2, .timeout = 600)
{
    const double s = 2048, b = 1, h = 12288, a = 96, t = 8;
    struct {
        int t;
        const char *ckpt;
        gboolean sp;
        double want;
    } rows[] = {
        {1, "none", FALSE, s * b * h * (34 + 5 * a * s / h)},
        {8, "none", FALSE, s * b * h * (10 + 24 / t + 5 * a * s / (h * t))},
        {8, "none", TRUE, s * b * h * (34 / t + 5 * a * s / (h * t))},
        {8, "selective", FALSE, s * b * h * (10 + 24 / t)},
        {8, "selective", TRUE, s * b * h * (34 / t)},
        {8, "full", FALSE, s * b * h * 2},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(rows); i++) {
        int64_t got = layer_bytes((int64_t)h, (int64_t)a, rows[i].t, rows[i].ckpt, rows[i].sp);
        double e = ((double)got - rows[i].want) / rows[i].want;
        /* 0.1%: the paper's formulas leave out only buffers of a few bytes per token, and a
         * dropout mask (sbh bytes) would be 3% of 34sbh */
        cr_expect(e > -0.001 && e < 0.001, "t=%d %s%s: %" G_GINT64_FORMAT " bytes, paper %.0f (%+.3f%%)",
                  rows[i].t, rows[i].ckpt, rows[i].sp ? " +SP" : "", got, rows[i].want, 100 * e);
        cr_log_info("t=%d %s%s: %+.4f%%", rows[i].t, rows[i].ckpt, rows[i].sp ? " +SP" : "", 100 * e);
    }
}

/* ZeRO-3 and FSDP FULL_SHARD gather one decoder layer at a time: besides this rank's
 * partition, at most the layer computing and the one prefetched (DISTRIBUTED.md §2.4.3,
 * §3.5) plus the root unit are gathered — in forward, in backward, and in the recompute
 * forward of full checkpointing. Llama-2-7B on N = 8, from its config: a layer holds
 * 4·4096² + 3·4096·11008 + 2·4096 elements, the root 2·32000·4096 + 4096; gathered in bf16
 * and padded to a multiple of N. The partition: ZeRO-3's bf16 lp_param_buffer of Ψ padded to
 * 2N over N; FSDP's fp32 shards of ⌈numel/N⌉ per unit. The whole step, parameter
 * materialisation included, holds at most one unit in fp32 besides: the model is never
 * whole on the GPU. */
Test(distributed, sharded_parameters_gathered_per_layer, .timeout = 300)
{
    const int N = 8;
    int64_t layer = 4LL * 4096 * 4096 + 3LL * 4096 * 11008 + 2 * 4096;
    int64_t root = 2LL * 32000 * 4096 + 4096;
    int64_t psi = 32 * layer + root;
    int64_t gl = 2 * N * ((layer + N - 1) / N), gr = 2 * N * ((root + N - 1) / N);
    const char *methods[] = {"zero3", "fsdp"};
    const char *ckpts[] = {"none", "full"};
    for (gsize i = 0; i < G_N_ELEMENTS(methods); i++)
        for (gsize j = 0; j < G_N_ELEMENTS(ckpts); j++) {
            int64_t part = strcmp(methods[i], "zero3") == 0
                               ? 2 * ((psi + 2 * N - 1) / (2 * N) * (2 * N)) / N
                               : 4 * (32 * ((layer + N - 1) / N) + (root + N - 1) / N);
            const char *settings[] = {"gpus", "8", "method", methods[i], "seq", "256",
                                      "checkpointing", ckpts[j], NULL};
            MemsimTrace *t = NULL;
            MemsimReport *rep = run_dist("llama-2-7b", settings, &t);
            int64_t bw = tu_peak_live(t, MEMSIM_CAT_PARAMETER, MEMSIM_PHASE_BACKWARD);
            int64_t fw = tu_peak_live(t, MEMSIM_CAT_PARAMETER, MEMSIM_PHASE_FORWARD);
            int64_t any = tu_peak_live(t, MEMSIM_CAT_PARAMETER, -1);
            int64_t bound = part + gr + 2 * gl;
            cr_expect(bw <= bound, "%s %s: backward holds %" G_GINT64_FORMAT " parameter bytes, "
                      "partition + root + 2 layers = %" G_GINT64_FORMAT, methods[i], ckpts[j], bw,
                      bound);
            cr_expect(fw <= bound, "%s %s: forward holds %" G_GINT64_FORMAT ", bound %"
                      G_GINT64_FORMAT, methods[i], ckpts[j], fw, bound);
            cr_expect(bw >= part + gr + gl, "%s %s: backward gathers a layer besides the root",
                      methods[i], ckpts[j]);
            cr_expect(any <= part + 4 * root + gr + 2 * gl, "%s %s: %" G_GINT64_FORMAT
                      " parameter bytes at once", methods[i], ckpts[j], any);
            memsim_report_free(rep);
            memsim_trace_free(t);
        }
}

/* LoRA and QLoRA under the data-parallel methods, Llama-2-7B on N = 8 (H 4096, MLP 11008,
 * vocabulary 32000, 32 layers), peft's default targets q_proj and v_proj at rank r = 16:
 * A = r·(in + out) = 16·(4096 + 4096) per adapted linear, two per layer. The frozen base:
 * per layer 4·4096² + 3·4096·11008 linear weights W and two norms of 4096; the root the
 * embedding, the head and the final norm. Every one of these counts divides by 64, so
 * partitions and the NF4 absmax (one fp32 per 64 weights) come out exact.
 *   ddp    bf16 base + fp32 adapters; fp32 grads, buckets, two Adam moments of the adapters
 *   zero1/2  bf16 base (not the optimizer's: not partitioned) + the flat bf16 adapters (padded
 *          to 2N); fp32 master + Adam on 1/N; stage 1 full bf16 grads, stage 2 1/N
 *   zero3  every parameter partitioned: ⌈numel/N⌉ bf16 each; the optimizer as above
 *   fsdp   use_orig_params: one bf16 FlatParameter per layer (adapters cast to the base's
 *          dtype) and the root; each rank keeps ⌈numel/N⌉, gradient shards of the same size
 *          for the units that train (the flat gradient covers the frozen part too), Adam in
 *          bf16 on the even share of each unit's adapters
 * QLoRA packs each W into numel/2 bytes (+ numel/16 bytes of absmax, kept whole on every rank;
 * with ZeRO-3/FSDP the packed bytes are sharded as bf16 elements, numel/4). */
Test(distributed, lora_and_qlora_model_state, .timeout = 300)
{
    const int64_t N = 8, r = 16, L = 32;
    int64_t W = 4LL * 4096 * 4096 + 3LL * 4096 * 11008, norms = 2 * 4096;
    int64_t root = 2LL * 32000 * 4096 + 4096;
    int64_t Al = 2 * r * (4096 + 4096), A = L * Al;
    int64_t Ap = (A + 2 * N - 1) / (2 * N) * (2 * N);
    int64_t base16 = 2 * (L * (W + norms) + root);            /* LoRA's bf16 base */
    int64_t base4 = L * (W / 2 + W / 16 + 2 * norms) + 2 * root; /* QLoRA's */
    int64_t Sl = (W + norms + Al + N - 1) / N, Sr = (root + N - 1) / N;
    int64_t Sq = (W / 4 + norms + Al + N - 1) / N;
    struct {
        const char *ft, *method;
        int64_t param, grad, opt;
    } want[] = {
        {"lora", "ddp", base16 + 4 * A, 4 * A, 8 * A},
        {"lora", "zero1", base16 + 2 * Ap, 2 * A, 12 * Ap / N},
        {"lora", "zero2", base16 + 2 * Ap, 2 * Ap / N, 12 * Ap / N},
        {"lora", "zero3", 2 * Ap / N + 2 * (L * (W + norms) + root) / N, 2 * Ap / N, 12 * Ap / N},
        {"lora", "fsdp", 2 * (L * Sl + Sr), 2 * L * Sl, 4 * L * ((Al + N - 1) / N)},
        {"qlora", "ddp", base4 + 4 * A, 4 * A, 8 * A},
        {"qlora", "zero2", base4 + 2 * Ap, 2 * Ap / N, 12 * Ap / N},
        {"qlora", "zero3", 2 * Ap / N + 2 * (L * (W / 4 + norms) + root) / N + L * W / 16,
         2 * Ap / N, 12 * Ap / N},
        {"qlora", "fsdp", 2 * (L * Sq + Sr) + L * W / 16, 2 * L * Sq, 4 * L * ((Al + N - 1) / N)},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(want); i++) {
        const char *settings[] = {"gpus", "8", "method", want[i].method, "finetune", want[i].ft,
                                  "seq", "128", NULL};
        MemsimReport *rep = run_dist("llama-2-7b", settings, NULL);
        const MemsimBreakdown *b = state_of(&rep->ranks[0]);
        cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], want[i].param,
                     "%s %s params %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT, want[i].ft,
                     want[i].method, b->requested[MEMSIM_CAT_PARAMETER], want[i].param);
        cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], want[i].grad,
                     "%s %s grads %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT, want[i].ft,
                     want[i].method, b->requested[MEMSIM_CAT_GRADIENT], want[i].grad);
        cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], want[i].opt,
                     "%s %s optimizer %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT, want[i].ft,
                     want[i].method, b->requested[MEMSIM_CAT_OPTIMIZER_STATE], want[i].opt);
        memsim_report_free(rep);
    }
}

/* Collectives carry durations from the profile's links: ZeRO-3 on 8 GPUs of one node gathers
 * a Llama-2-7B layer (bf16, padded to N), moving (N − 1)/N of its bytes over each GPU's link;
 * the bus bandwidth that implies must be what NCCL measures on an A100 node: between 200 and
 * 300 GB/s (NVLink 3's published 300 GB/s per direction is the ceiling; nccl-tests' all_gather
 * on DGX A100 reports about 230 GB/s bus bandwidth). Megatron's TP and pipeline collectives
 * are timed too. Replaying the same trace twice gives the same time. */
Test(distributed, collectives_take_link_time, .timeout = 300)
{
    const int N = 8;
    int64_t layer = 4LL * 4096 * 4096 + 3LL * 4096 * 11008 + 2 * 4096;
    double gl = 2.0 * N * (double)((layer + N - 1) / N);
    double moved = (N - 1.0) / N * gl; /* bytes over each GPU's link */
    const char *zero3[] = {"gpus", "8", "method", "zero3", "seq", "128", "steps", "1", NULL};
    const char *mega[] = {"gpus", "8", "tp", "2", "pp", "2", "dp", "2", "seq", "128",
                          "sequence-parallel", "true", "steps", "1", NULL};
    const char *const *runs[] = {zero3, mega};
    for (gsize k = 0; k < G_N_ELEMENTS(runs); k++) {
        MemsimTrace *t = NULL;
        MemsimReport *rep = run_dist("llama-2-7b", runs[k], &t);
        MemsimTraceHeader *h = memsim_trace_header(t);
        int colls = 0, untimed = 0, layer_gathers = 0;
        for (guint r = 0; r < h->n_ranks; r++) {
            gsize n;
            const MemsimEvent *ev = memsim_trace_events(t, r, &n);
            for (gsize i = 1; i < n; i++) {
                if (ev[i].kind != MEMSIM_EV_COLLECTIVE || ev[i].size == 0)
                    continue;
                cr_assert_eq(ev[i - 1].kind, MEMSIM_EV_OP);
                double d = h->ops[ev[i - 1].id].duration_us;
                colls++;
                untimed += d <= 0;
                if (k == 0 && ev[i].aux == MEMSIM_COLL_ALL_GATHER && ev[i].size == (uint64_t)gl) {
                    double busbw = moved / d / 1e3; /* GB/s */
                    cr_expect(busbw >= 200 && busbw <= 300,
                              "layer gather %.3f µs: %.1f GB/s of bus bandwidth", d, busbw);
                    layer_gathers++;
                }
            }
        }
        cr_expect_gt(colls, 10);
        cr_expect_eq(untimed, 0, "%d of %d collectives untimed", untimed, colls);
        if (k == 0)
            cr_expect_gt(layer_gathers, 32);
        MemsimReport *again = memsim_replay_trace(t, NULL, NULL);
        for (guint r = 0; r < rep->n_ranks; r++) {
            cr_expect_gt(rep->ranks[r].time_us, 0.0);
            cr_expect_eq(rep->ranks[r].time_us, again->ranks[r].time_us);
            cr_expect_eq(rep->ranks[r].stats.allocated.peak, again->ranks[r].stats.allocated.peak);
        }
        memsim_report_free(again);
        memsim_report_free(rep);
        memsim_trace_free(t);
    }
}

/* ---- pipelines on one clock: stages meet at their sends and recvs ---- */

/* Op times of one pipeline stage, summed from the durations in the trace's op table: the
 * forward and the backward compute of each micro-batch, and the transfer of a send. */
typedef struct {
    double fwd[16], bwd[16];
    int fwd_ops;              /* timed forward ops of micro-batch 0 */
    double p2p;
    uint64_t first_fwd_event; /* the OP event of the first forward op of micro-batch 0 */
    int sends, recvs;         /* with a peer */
} StageTimes;

static void stage_times(MemsimTrace *t, guint32 rank, StageTimes *st)
{
    memset(st, 0, sizeof *st);
    st->first_fwd_event = UINT64_MAX;
    MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, rank, &n);
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind == MEMSIM_EV_COLLECTIVE && (ev[i].flags & MEMSIM_EVF_PEER)) {
            cr_assert_eq(ev[i - 1].kind, MEMSIM_EV_OP, "a send or recv right after its op");
            st->p2p = h->ops[ev[i - 1].id].duration_us;
            cr_assert_lt(ev[i].addr, h->n_ranks);
            st->sends += ev[i].aux == MEMSIM_COLL_SEND;
            st->recvs += ev[i].aux == MEMSIM_COLL_RECV;
        }
        if (ev[i].kind != MEMSIM_EV_OP)
            continue;
        const MemsimOpInfo *op = &h->ops[ev[i].id];
        if (op->microbatch < 0 || op->microbatch >= 16)
            continue;
        if (op->phase == MEMSIM_PHASE_FORWARD) {
            st->fwd[op->microbatch] += op->duration_us;
            st->fwd_ops += op->microbatch == 0 && op->duration_us > 0;
            if (op->microbatch == 0 && st->first_fwd_event == UINT64_MAX)
                st->first_fwd_event = i;
        } else if (op->phase == MEMSIM_PHASE_BACKWARD) {
            st->bwd[op->microbatch] += op->duration_us;
        }
    }
}

/* When the op of event `event` of rank `rank` started on its stream, from the timeline. */
static double op_start(MemsimTimeline *tl, guint rank, uint64_t event)
{
    const MemsimTimelineRank *r = memsim_timeline_rank(tl, rank);
    for (gsize i = 0; i < r->n_slices; i++)
        if (r->slices[i].event_first == event) {
            cr_assert_eq(r->slices[i].n_ops, 1);
            return r->slices[i].time_first_us;
        }
    cr_assert_fail("no slice for event %" G_GUINT64_FORMAT " of rank %u", event, rank);
    return 0;
}

/* The same trace without the peers of its sends and recvs (as traces were written before
 * stages met): each stage on its own clock. */
static MemsimTrace *without_peers(MemsimTrace *t)
{
    MemsimTraceHeader *h = memsim_trace_header(t);
    MemsimTrace *u = memsim_trace_new(h->name);
    for (guint32 i = 0; i < h->n_strings; i++)
        cr_assert_eq(memsim_trace_intern(u, h->strings[i]), i);
    for (guint32 i = 0; i < h->n_ops; i++)
        memsim_trace_add_op(u, &h->ops[i]);
    for (guint32 r = 0; r < h->n_ranks; r++) {
        memsim_trace_add_rank(u, h->ranks[r].device, h->ranks[r].multiplicity);
        memsim_trace_header(u)->ranks[r].role = g_strdup(h->ranks[r].role);
    }
    for (guint32 r = 0; r < h->n_ranks; r++) {
        gsize n;
        const MemsimEvent *ev = memsim_trace_events(t, r, &n);
        MemsimEvent *copy = g_memdup2(ev, n * sizeof *ev);
        for (gsize i = 0; i < n; i++)
            if (copy[i].kind == MEMSIM_EV_COLLECTIVE) {
                copy[i].flags &= ~(uint32_t)MEMSIM_EVF_PEER;
                copy[i].addr = 0;
            }
        memsim_trace_append(u, r, copy, n);
        g_free(copy);
    }
    return u;
}

/* p = 4 stages of Llama-2-7B (8 layers each), m = 8 micro-batches, one step. With F_s and B_s
 * the forward and backward compute of a micro-batch on stage s and d a transfer (all summed
 * from the op table), the first micro-batch reaches stage s after the forwards of the stages
 * before it and their sends: stage s's first forward starts Σ_{1≤k<s} (F_k(0) + d) after stage
 * 1's, whose host issues far ahead of its GPU, so that its stream runs its ops back to back;
 * stage 1's starts F_0(0) + d after stage 0's, plus at most the host's launch cost (10 µs an
 * op) where stage 0's first ops are shorter than their launch. The last
 * stage cannot start before that and must then run all m micro-batches, and the last
 * gradient must go back through every stage: stage 0's step takes at least
 * Σ_{k<p−1} (F_k(0) + d) + Σ_mb (F_{p−1} + B_{p−1})(mb) + Σ_{k<p−1} (B_k(m − 1) + d) — with
 * equal stages (m + p − 1)(F + B), the bubble (p − 1)/m over the m(F + B) of the work. The
 * same holds for GPipe. Without the peers (each stage on its own clock) stage 0 took only its
 * own work, below the bound. */
Test(distributed, pipeline_bubble, .timeout = 300)
{
    const char *schedules[] = {"1f1b", "gpipe"};
    enum { P = 4, M = 8 };
    /* the schedule's events one by one: no repeated pair given once (MEMSIM_EV_REPEAT) */
    g_setenv("MEMSIM_NO_SKIP", "1", TRUE);
    for (gsize k = 0; k < G_N_ELEMENTS(schedules); k++) {
        const char *settings[] = {"gpus", "4", "pp", "4", "microbatches", "8", "pp-schedule",
                                  schedules[k], "seq", "4096", "steps", "1", NULL};
        GError *error = NULL;
        MemsimModel *m = memsim_model_load("llama-2-7b", &error);
        MemsimRun run = memsim_run_defaults();
        for (const char *const *s = settings; *s; s += 2)
            cr_assert(memsim_run_set(&run, s[0], s[1], &error));
        MemsimTrace *t = memsim_generate(m, &run, &error);
        cr_assert(t, "%s", error ? error->message : "?");
        cr_assert_eq(memsim_trace_header(t)->n_ranks, (guint32)P);
        StageTimes st[P];
        for (guint32 s = 0; s < P; s++) {
            stage_times(t, s, &st[s]);
            /* 1F1B and GPipe: a recv of each micro-batch's input and of its output's gradient,
             * except at the ends of the pipeline */
            cr_expect_eq(st[s].recvs, (s > 0) * M + (s < P - 1) * M, "stage %u recvs", s);
            cr_expect_eq(st[s].sends, st[s].recvs);
            cr_assert_gt(st[s].p2p, 0.0);
        }
        MemsimTimeline *tl = memsim_timeline_new(1u << 16);
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.timeline = tl;
        MemsimReport *rep = memsim_replay_trace(t, &o, &error);
        cr_assert(rep, "%s", error ? error->message : "?");

        double d = st[0].p2p, after1 = 0.0, drain = 0.0;
        double t0 = op_start(tl, 0, st[0].first_fwd_event);
        double t1 = op_start(tl, 1, st[1].first_fwd_event);
        cr_expect(t1 - t0 >= st[0].fwd[0] + d - 1e-6 &&
                  t1 - t0 <= st[0].fwd[0] + d + 10.0 * st[0].fwd_ops,
                  "%s: stage 1's first forward starts %.3f µs after stage 0's, want %.3f + "
                  "launches", schedules[k], t1 - t0, st[0].fwd[0] + d);
        for (guint32 s = 2; s < P; s++) {
            after1 += st[s - 1].fwd[0] + d;
            double got = op_start(tl, s, st[s].first_fwd_event) - t1;
            cr_expect(fabs(got - after1) <= 1e-9 * after1 + 1e-6,
                      "%s: stage %u's first forward starts %.3f µs after stage 1's, want %.3f",
                      schedules[k], s, got, after1);
        }
        double fill = st[0].fwd[0] + d + after1;
        for (guint32 s = 0; s + 1 < P; s++)
            drain += st[s].bwd[M - 1] + d;
        /* with stages of nearly equal cost: about (p − 1) stage forwards */
        double one = st[1].fwd[0] + d;
        cr_expect(fabs(fill - (P - 1) * one) < 0.02 * fill, "%s: fill %.1f µs vs 3 × %.1f",
                  schedules[k], fill, one);
        double work = 0.0, fb_min = G_MAXDOUBLE;
        for (int mb = 0; mb < M; mb++)
            work += st[P - 1].fwd[mb] + st[P - 1].bwd[mb];
        for (guint32 s = 0; s < P; s++)
            fb_min = MIN(fb_min, st[s].fwd[0] + st[s].bwd[0]);
        double bound = fill + work + drain;
        const MemsimRankReport *r0 = &rep->ranks[0];
        cr_assert_eq(r0->n_steps, 1);
        double step0 = r0->time_us - r0->steps[0].start_us;
        cr_expect_geq(step0, bound, "%s: stage 0's step %.1f µs, at least %.1f", schedules[k],
                      step0, bound);
        cr_expect_geq(step0, (M + P - 1) * fb_min, "%s: stage 0's step %.1f µs, (m + p − 1) × "
                      "%.1f", schedules[k], step0, fb_min);

        /* each stage on its own clock: no bubble, and the memory is the same */
        MemsimTrace *u = without_peers(t);
        MemsimReport *alone = memsim_replay_trace(u, NULL, &error);
        cr_assert(alone, "%s", error ? error->message : "?");
        double alone0 = alone->ranks[0].time_us - alone->ranks[0].steps[0].start_us;
        cr_expect_lt(alone0, (M + P - 1) * fb_min, "%s: stage 0 alone %.1f µs", schedules[k],
                     alone0);
        for (guint32 s = 0; s < P; s++) {
            cr_expect_eq(alone->ranks[s].stats.allocated.peak, rep->ranks[s].stats.allocated.peak);
            cr_expect_eq(alone->ranks[s].stats.reserved.peak, rep->ranks[s].stats.reserved.peak);
            cr_expect_leq(alone->ranks[s].time_us, rep->ranks[s].time_us);
        }
        memsim_report_free(alone);
        memsim_trace_free(u);
        memsim_report_free(rep);
        memsim_timeline_free(tl);
        memsim_trace_free(t);
        memsim_run_clear(&run);
        memsim_model_free(m);
    }
}

/* Feeds the ranks of `t` in an order of its own: chunks of `chunk` events, the ranks taken
 * from the last to the first, round after round. */
static char *replay_fed(MemsimTrace *t, gsize chunk)
{
    MemsimTraceHeader *h = memsim_trace_header(t);
    GError *error = NULL;
    MemsimReplay *rp = memsim_replay_new(h, NULL, &error);
    cr_assert(rp);
    gsize *pos = g_new0(gsize, h->n_ranks);
    for (gboolean more = TRUE; more;) {
        more = FALSE;
        for (guint32 r = h->n_ranks; r-- > 0;) {
            gsize n;
            const MemsimEvent *ev = memsim_trace_events(t, r, &n);
            gsize take = MIN(chunk, n - pos[r]);
            if (!take)
                continue;
            cr_assert(memsim_replay_feed(rp, h, r, ev + pos[r], take, &error), "%s",
                      error ? error->message : "?");
            pos[r] += take;
            more = TRUE;
        }
    }
    cr_assert(memsim_replay_drain(rp, h, &error));
    g_free(pos);
    MemsimReport *rep = memsim_replay_finish(rp);
    char *json = memsim_report_to_json(rep);
    memsim_report_free(rep);
    return json;
}

/* The same pipeline trace replayed twice gives the same report, to the last digit of every
 * time; and so does feeding its ranks in another order (the last stage first, in small
 * chunks; a whole rank at a time), since a recv meets the sends of its peer in their order
 * whichever rank the simulator runs first. Interleaved 1F1B, where the last stage sends on
 * to the first. */
Test(distributed, pipeline_replay_is_repeatable, .timeout = 300)
{
    const char *settings[] = {"gpus", "8", "tp", "2", "pp", "4", "microbatches", "8",
                              "pp-schedule", "interleaved", "virtual-stages", "2", "seq", "256",
                              "sequence-parallel", "true", "steps", "2", NULL};
    MemsimTrace *t = NULL;
    MemsimReport *a = run_dist("llama-2-7b", settings, &t);
    MemsimReport *b = memsim_replay_trace(t, NULL, NULL);
    g_autofree char *ja = memsim_report_to_json(a);
    g_autofree char *jb = memsim_report_to_json(b);
    cr_expect_str_eq(ja, jb);
    g_autofree char *jc = replay_fed(t, 1000);
    cr_expect_str_eq(ja, jc, "fed the last stage first, 1000 events at a time");
    g_autofree char *jd = replay_fed(t, G_MAXSIZE);
    cr_expect_str_eq(ja, jd, "fed one whole rank at a time, the last first");
    /* stage 0 waits for the last stage's chunk outputs: longer than on its own clock */
    MemsimTrace *u = without_peers(t);
    MemsimReport *alone = memsim_replay_trace(u, NULL, NULL);
    cr_expect_gt(a->ranks[0].time_us, alone->ranks[0].time_us * 1.05);
    memsim_report_free(alone);
    memsim_trace_free(u);
    memsim_report_free(a);
    memsim_report_free(b);
    memsim_trace_free(t);
}

/* tests/data/good/pipeline.txt, timed by hand (its comment): stage 0 ends at 630 µs, stage 1
 * at 430 µs, stage 0's recv spans 120-430 µs on the timeline; read from text and from .mst
 * (fed rank by rank, stage 0 first, so that stage 0 waits with its events held); without the
 * peers both end at 330 µs. */
Test(distributed, two_stages_by_hand)
{
    g_autofree char *txt = tu_test_data("good/pipeline.txt");
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *mst = g_build_filename(dir, "pipeline.mst", NULL);
    GError *error = NULL;
    cr_assert(memsim_convert(txt, mst, &error), "%s", error ? error->message : "?");
    const char *paths[] = {txt, mst};
    for (gsize k = 0; k < G_N_ELEMENTS(paths); k++) {
        MemsimTimeline *tl = memsim_timeline_new(0);
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.timeline = tl;
        MemsimReport *rep = memsim_replay_path(paths[k], &o, &error);
        cr_assert(rep, "%s", error ? error->message : "?");
        cr_expect_eq(rep->ranks[0].time_us, 630.0, "%s: stage 0 %.1f", paths[k],
                     rep->ranks[0].time_us);
        cr_expect_eq(rep->ranks[1].time_us, 430.0, "%s: stage 1 %.1f", paths[k],
                     rep->ranks[1].time_us);
        cr_expect_eq(rep->ranks[0].stats.allocated.peak, 2048);
        /* stage 0's op slices: forward, send, recv (waiting included), backward */
        const MemsimTimelineRank *r0 = memsim_timeline_rank(tl, 0);
        const double want[][2] = {{10, 110}, {110, 120}, {120, 430}, {430, 630}};
        cr_assert_eq(r0->n_slices, G_N_ELEMENTS(want));
        for (gsize i = 0; i < r0->n_slices; i++)
            cr_expect(r0->slices[i].time_first_us == want[i][0] &&
                          r0->slices[i].time_last_us == want[i][1],
                      "slice %zu: %.1f-%.1f µs, want %.0f-%.0f", i, r0->slices[i].time_first_us,
                      r0->slices[i].time_last_us, want[i][0], want[i][1]);
        memsim_report_free(rep);
        memsim_timeline_free(tl);
    }
    MemsimTrace *t = memsim_trace_load(txt, &error);
    cr_assert(t, "%s", error ? error->message : "?");
    MemsimTrace *u = without_peers(t);
    MemsimReport *alone = memsim_replay_trace(u, NULL, &error);
    cr_assert(alone);
    cr_expect_eq(alone->ranks[0].time_us, 330.0);
    cr_expect_eq(alone->ranks[1].time_us, 330.0);
    memsim_report_free(alone);
    memsim_trace_free(u);
    memsim_trace_free(t);
    g_unlink(mst);
    g_rmdir(dir);
}
