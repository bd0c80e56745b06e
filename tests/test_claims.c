/* Claims of README.md (and of the --help text behind them) that no other test checked. Every
 * expected figure is computed here from a closed form or a published number, never copied
 * from the program's output.
 *
 *   claim                                                          test
 *   1. HSDP shards within a node of --gpus-per-node GPUs:          claims/hsdp_shards_within_a_node
 *      FSDP's closed form with N = gpus-per-node, not the world
 *   2. fsdp-grad-op (SHARD_GRAD_OP) keeps the parameters gathered  claims/fsdp_grad_op_keeps_params_gathered
 *      from forward to backward; model state sharded as FSDP's
 *   3. --fsdp-wrap model gathers every parameter at once, --fsdp-  claims/fsdp_wrap_model_gathers_everything
 *      wrap layer at most a few layers
 *   4. --cublas-workspace: an allocation of exactly that size per  claims/cublas_workspace_size_and_peak
 *      cuBLAS handle and stream; default 8519680 bytes, 32 MiB on
 *      H100/H200; the peak moves by the workspaces live at it
 *   5. --grad-accum N: model state as with 1, the same micro-      claims/grad_accum_does_not_multiply_memory
 *      batch activations, no N-fold peak; forward/backward time
 *      about N-fold
 *   6. tools/memsim-record.py --demo records a small model with    claims/recorder_demo_replays
 *      Debian's python3 + torch (CPU) to a trace memsim replays
 *   7. convert, compare and gen on bad files: exit 2, the file     claims/bad_files_convert_compare_gen
 *      named
 *   (support for 1-3: the FSDP unit sizes of OPT-125m used there   claims/opt125m_units_add_up
 *      add up to its published parameter count)
 */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <math.h>
#include <stdlib.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <memsim/trace.h>
#include <string.h>

#include "testutil.h"

/* ---- helpers ---- */

static MemsimReport *replay(MemsimTrace *t)
{
    GError *error = NULL;
    MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
    cr_assert(rep, "%s", error ? error->message : "?");
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

/* The most bytes of category `cat` the program of rank 0 holds (requested sizes, allocated
 * and not yet freed) at any event while the op running is in one of the phases of the mask
 * (1 << MemsimPhase), read off the trace itself, whatever the allocator. */
static int64_t max_live(MemsimTrace *t, uint8_t cat, unsigned phases)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    const MemsimTraceHeader *h = memsim_trace_header(t);
    GHashTable *size_of = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    int64_t live = 0, best = 0;
    int phase = MEMSIM_PHASE_OTHER;
    for (gsize i = 0; i < n; i++) {
        const MemsimEvent *e = &ev[i];
        if (e->kind == MEMSIM_EV_OP) {
            cr_assert_lt(e->id, h->n_ops);
            phase = h->ops[e->id].phase;
        } else if (e->kind == MEMSIM_EV_ALLOC && e->category == cat) {
            int64_t *k = g_new(int64_t, 1), *v = g_new(int64_t, 1);
            *k = (int64_t)e->id;
            *v = (int64_t)e->size;
            g_hash_table_replace(size_of, k, v);
            live += *v;
        } else if (e->kind == MEMSIM_EV_FREE) {
            int64_t k = (int64_t)e->id;
            int64_t *v = g_hash_table_lookup(size_of, &k);
            if (v) {
                live -= *v;
                g_hash_table_remove(size_of, &k);
            }
        }
        if ((phases >> phase) & 1u)
            best = MAX(best, live);
    }
    g_hash_table_unref(size_of);
    return best;
}

#define FWD_BWD ((1u << MEMSIM_PHASE_FORWARD) | (1u << MEMSIM_PHASE_BACKWARD))
#define BWD (1u << MEMSIM_PHASE_BACKWARD)

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* OPT-125m (facebook/opt-125m's config.json: hidden 768, 12 layers, FFN 3072, vocabulary
 * 50272, 2048 positions + OPT's offset of 2, tied head). FSDP's units (DISTRIBUTED.md §3.2):
 * one FlatParameter per decoder layer — q, k, v, out projections with biases, fc1, fc2, two
 * LayerNorms — and the root: token and position embeddings, the final LayerNorm. Together
 * they are the published 125,239,296 parameters. */
#define OPT_H 768LL
#define OPT_L 12LL
#define OPT_LAYER (4 * (OPT_H * OPT_H + OPT_H) + (OPT_H * 3072 + 3072) + (3072 * OPT_H + OPT_H) \
                   + 4 * OPT_H)
#define OPT_ROOT (50272LL * OPT_H + 2050LL * OPT_H + 2 * OPT_H)
#define OPT_PSI 125239296LL

/* S: the elements each rank keeps of every unit, ⌈numel/N⌉ per FlatParameter */
static int64_t opt_shard(int64_t N)
{
    return OPT_L * ceil_div(OPT_LAYER, N) + ceil_div(OPT_ROOT, N);
}

static void expect_fsdp_state(const MemsimReport *rep, int64_t N, const char *what)
{
    int64_t S = opt_shard(N);
    const MemsimBreakdown *b = state_of(&rep->ranks[0]);
    cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], 4 * S,
                 "%s: parameters %" G_GINT64_FORMAT ", FSDP with N = %" G_GINT64_FORMAT
                 " wants 4S = %" G_GINT64_FORMAT, what, b->requested[MEMSIM_CAT_PARAMETER], N,
                 4 * S);
    cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], 4 * S,
                 "%s: gradients %" G_GINT64_FORMAT ", want 4S = %" G_GINT64_FORMAT, what,
                 b->requested[MEMSIM_CAT_GRADIENT], 4 * S);
    cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], 8 * S,
                 "%s: optimizer state %" G_GINT64_FORMAT ", want 8S = %" G_GINT64_FORMAT, what,
                 b->requested[MEMSIM_CAT_OPTIMIZER_STATE], 8 * S);
}

Test(claims, opt125m_units_add_up)
{
    /* the unit sizes above are the published count: otherwise the closed forms below test
     * nothing */
    cr_assert_eq(OPT_L * OPT_LAYER + OPT_ROOT, OPT_PSI);
    GError *error = NULL;
    MemsimModel *m = memsim_model_load("opt-125m", &error);
    cr_assert(m, "%s", error ? error->message : "?");
    cr_expect_eq(memsim_model_n_params(m), OPT_PSI);
    memsim_model_free(m);
}

/* ---- 1. HSDP ---- */

/* HYBRID_SHARD: each node of --gpus-per-node GPUs shards the model (FSDP's closed form with
 * N = gpus-per-node: S = Σ ⌈unit/N⌉ elements per rank, fp32 shard 4S, fp32 gradient shard 4S,
 * two Adam moments 8S), the nodes replicate it. 16 GPUs, 8 per node = FSDP on 8; and not FSDP
 * on 16. Again with 10 GPUs, 5 per node, where ⌈·/5⌉ pads every unit. */
Test(claims, hsdp_shards_within_a_node, .timeout = 120)
{
    static const struct {
        const char *gpus, *per_node;
        int64_t N;
    } cases[] = {{"16", "8", 8}, {"10", "5", 5}};
    for (gsize k = 0; k < G_N_ELEMENTS(cases); k++) {
        const char *hs[] = {"gpus", cases[k].gpus, "gpus-per-node", cases[k].per_node, "method",
                            "hsdp", "seq", "128", "steps", "1", NULL};
        MemsimTrace *t = tu_generate("opt-125m", hs);
        MemsimReport *rep = replay(t);
        cr_assert_eq(rep->n_ranks, 1);
        cr_expect_eq(rep->ranks[0].multiplicity, (uint32_t)atoi(cases[k].gpus));
        g_autofree char *what = g_strdup_printf("hsdp %s GPUs, %s per node", cases[k].gpus,
                                                cases[k].per_node);
        expect_fsdp_state(rep, cases[k].N, what);

        /* FSDP over the whole world shards further: a different (smaller) state */
        const char *fs[] = {"gpus", cases[k].gpus, "method", "fsdp", "seq", "128", "steps", "1",
                            NULL};
        MemsimTrace *tf = tu_generate("opt-125m", fs);
        MemsimReport *frep = replay(tf);
        int64_t world = atoi(cases[k].gpus);
        g_autofree char *fwhat = g_strdup_printf("fsdp %s GPUs", cases[k].gpus);
        expect_fsdp_state(frep, world, fwhat);
        cr_expect_neq(state_of(&rep->ranks[0])->requested[MEMSIM_CAT_PARAMETER],
                      state_of(&frep->ranks[0])->requested[MEMSIM_CAT_PARAMETER],
                      "%s: HSDP's shards equal FSDP's over the world", what);
        memsim_report_free(frep);
        memsim_trace_free(tf);
        memsim_report_free(rep);
        memsim_trace_free(t);
    }
}

/* ---- 2. SHARD_GRAD_OP ---- */

/* DISTRIBUTED.md §3.5: FULL_SHARD reshards every unit but the root after its forward and
 * gathers it again for backward, holding the unit computing and the one prefetched; with
 * SHARD_GRAD_OP the units stay gathered from their forward to their backward. With 8 ranks,
 * bf16 gathers of S_u·N elements per unit (S_u = ⌈unit/N⌉) beside the fp32 shards (4S), the
 * parameter bytes live at the start of backward are 4S + 2N·(S_root + L·S_layer) for
 * SHARD_GRAD_OP — every unit — and at most 4S + 2N·(S_root + 2·S_layer) for FULL_SHARD: the
 * difference is at least 2N·(L − 2)·S_layer. The model state is FSDP's. */
Test(claims, fsdp_grad_op_keeps_params_gathered, .timeout = 120)
{
    const int64_t N = 8;
    int64_t S = opt_shard(N), s_layer = ceil_div(OPT_LAYER, N), s_root = ceil_div(OPT_ROOT, N);
    const char *go[] = {"gpus", "8", "method", "fsdp-grad-op", "seq", "128", "steps", "1", NULL};
    const char *fs[] = {"gpus", "8", "method", "fsdp", "seq", "128", "steps", "1", NULL};
    MemsimTrace *tg = tu_generate("opt-125m", go), *tf = tu_generate("opt-125m", fs);
    MemsimReport *rg = replay(tg), *rf = replay(tf);
    expect_fsdp_state(rg, N, "fsdp-grad-op");
    expect_fsdp_state(rf, N, "fsdp");

    int64_t grad_op = max_live(tg, MEMSIM_CAT_PARAMETER, BWD);
    int64_t full = max_live(tf, MEMSIM_CAT_PARAMETER, BWD);
    int64_t want_grad_op = 4 * S + 2 * N * (s_root + OPT_L * s_layer);
    int64_t full_hi = 4 * S + 2 * N * (s_root + 2 * s_layer);
    int64_t full_lo = 4 * S + 2 * N * (s_root + s_layer);
    cr_expect_eq(grad_op, want_grad_op,
                 "SHARD_GRAD_OP: %" G_GINT64_FORMAT " parameter bytes live in backward, want "
                 "the shards and every unit gathered: %" G_GINT64_FORMAT, grad_op, want_grad_op);
    cr_expect(full >= full_lo && full <= full_hi,
              "FULL_SHARD: %" G_GINT64_FORMAT " parameter bytes live in backward, want the root "
              "and one or two layers gathered: %" G_GINT64_FORMAT "..%" G_GINT64_FORMAT, full,
              full_lo, full_hi);
    cr_expect_geq(grad_op - full, 2 * N * (OPT_L - 2) * s_layer,
                  "SHARD_GRAD_OP holds %" G_GINT64_FORMAT " bytes more than FULL_SHARD, want "
                  "at least the %lld other layers: %" G_GINT64_FORMAT, grad_op - full,
                  OPT_L - 2, 2 * N * (OPT_L - 2) * s_layer);
    memsim_report_free(rg);
    memsim_report_free(rf);
    memsim_trace_free(tg);
    memsim_trace_free(tf);
}

/* ---- 3. --fsdp-wrap model vs layer ---- */

/* One FlatParameter for the whole model: S = ⌈Ψ/N⌉ per rank, and its forward gathers all of
 * it — S·N elements in the run's compute dtype (bf16 under bf16-mixed, fp32 under fp32)
 * beside the fp32 shard: at least the whole model in that dtype. Per-layer wrapping holds the
 * root and at most two layers gathered at once. N = 5 pads. */
Test(claims, fsdp_wrap_model_gathers_everything, .timeout = 120)
{
    const int64_t N = 5;
    static const struct {
        const char *precision;
        int64_t bytes; /* of the gathered dtype */
    } precs[] = {{"bf16-mixed", 2}, {"fp32", 4}};
    for (gsize k = 0; k < G_N_ELEMENTS(precs); k++) {
        int64_t B = precs[k].bytes;
        const char *wm[] = {"gpus", "5", "method", "fsdp", "fsdp-wrap", "model", "precision",
                            precs[k].precision, "seq", "128", "steps", "1", NULL};
        MemsimTrace *t = tu_generate("opt-125m", wm);
        MemsimReport *rep = replay(t);
        int64_t S = ceil_div(OPT_PSI, N);
        const MemsimBreakdown *b = state_of(&rep->ranks[0]);
        cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], 4 * S, "%s: one unit's shard",
                     precs[k].precision);
        cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], 4 * S);
        cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], 8 * S);
        int64_t got = max_live(t, MEMSIM_CAT_PARAMETER, FWD_BWD);
        cr_expect_eq(got, 4 * S + B * S * N,
                     "%s, wrap model: %" G_GINT64_FORMAT " parameter bytes live, want the "
                     "shard and the whole padded model gathered: %" G_GINT64_FORMAT,
                     precs[k].precision, got, 4 * S + B * S * N);
        cr_expect_geq(got, B * OPT_PSI, "%s: less than the whole model in %lld-byte elements",
                      precs[k].precision, (long long)B);
        memsim_report_free(rep);
        memsim_trace_free(t);

        const char *wl[] = {"gpus", "5", "method", "fsdp", "fsdp-wrap", "layer", "precision",
                            precs[k].precision, "seq", "128", "steps", "1", NULL};
        MemsimTrace *tl = tu_generate("opt-125m", wl);
        int64_t SL = opt_shard(N);
        int64_t hi = 4 * SL + B * N * (ceil_div(OPT_ROOT, N) + 2 * ceil_div(OPT_LAYER, N));
        int64_t lo = 4 * SL + B * N * (ceil_div(OPT_ROOT, N) + ceil_div(OPT_LAYER, N));
        int64_t per_layer = max_live(tl, MEMSIM_CAT_PARAMETER, FWD_BWD);
        cr_expect(per_layer >= lo && per_layer <= hi,
                  "%s, wrap layer: %" G_GINT64_FORMAT " parameter bytes live, want the root and "
                  "one or two layers gathered: %" G_GINT64_FORMAT "..%" G_GINT64_FORMAT,
                  precs[k].precision, per_layer, lo, hi);
        cr_expect_lt(per_layer, B * OPT_PSI);
        memsim_trace_free(tl);
    }
}

/* ---- 4. cuBLAS workspaces ---- */

/* CUBLAS_WORKSPACE_CONFIG's default ":4096:2:16:8" (PyTorch's CublasHandlePool.cpp) before
 * Hopper, 32 MiB on sm90 (PR #89027). */
#define WS_DEFAULT (4096LL * 1024 * 2 + 16LL * 1024 * 8)
#define WS_HOPPER (32LL << 20)

/* The workspace allocations of a trace (category "other", exactly `size` bytes), and how many
 * of them come before event `before`. */
static int count_workspaces(MemsimTrace *t, int64_t size, uint64_t before, int *before_count)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    int all = 0, early = 0;
    for (gsize i = 0; i < n; i++)
        if (ev[i].kind == MEMSIM_EV_ALLOC && ev[i].category == MEMSIM_CAT_OTHER &&
            (int64_t)ev[i].size == size) {
            all++;
            early += i < before;
        }
    if (before_count)
        *before_count = early;
    return all;
}

/* Each cuBLAS handle (the forward's thread, the autograd thread) gets one workspace on the
 * compute stream, of exactly the size given, its default the CUBLAS_WORKSPACE_CONFIG default
 * of the GPU; and the peak moves by (workspaces live at the peak) × (the change in size): the
 * program's requested bytes under the torch policy, and the allocated bytes under `exact`
 * (512-byte rounding, no caching; the sizes here are multiples of 512). The torch policy's
 * allocated bytes may move by more, by its block-splitting rule (a large block is not split
 * when less than 1 MiB would remain: TORCH_ALLOCATOR.md), so they are not compared. */
Test(claims, cublas_workspace_size_and_peak, .timeout = 120)
{
    static const struct {
        const char *gpu, *ws;
        int64_t size;
    } cases[] = {
        {"a100-80gb", NULL, WS_DEFAULT},
        {"h100-80gb", NULL, WS_HOPPER},
        {"h200", NULL, WS_HOPPER},
        {"a100-80gb", "64MiB", 64LL << 20},
        {"a100-80gb", "2097152", 2LL << 20},
        {"h100-80gb", "1MiB", 1LL << 20},
    };
    int64_t peak_req[3] = {0}, peak_exact[3] = {0};
    int live_req[3] = {0}, live_exact[3] = {0};
    int ia = 0;
    for (gsize k = 0; k < G_N_ELEMENTS(cases); k++) {
        const char *s[] = {"seq", "128", "steps", "1", "gpu", cases[k].gpu,
                           cases[k].ws ? "cublas-workspace" : NULL, cases[k].ws, NULL};
        MemsimTrace *t = tu_generate("gpt2", s);
        MemsimReport *rep = replay(t);
        int early = 0;
        int found = count_workspaces(t, cases[k].size, rep->ranks[0].peak_allocated_event, &early);
        cr_expect_eq(found, 2, "%s, workspace %s: %d allocations of %" G_GINT64_FORMAT
                     " bytes, want one per cuBLAS handle (forward and autograd threads)",
                     cases[k].gpu, cases[k].ws ? cases[k].ws : "default", found, cases[k].size);
        /* nothing else of category "other" of another size stands in for it, and each
         * workspace is on the compute stream */
        gsize n;
        const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
        for (gsize i = 0; i < n; i++)
            if (ev[i].kind == MEMSIM_EV_ALLOC && ev[i].category == MEMSIM_CAT_OTHER) {
                cr_expect_eq((int64_t)ev[i].size, cases[k].size,
                             "%s: an 'other' allocation of %" G_GUINT64_FORMAT " bytes",
                             cases[k].gpu, (guint64)ev[i].size);
                cr_expect_eq(ev[i].stream, 0);
            }
        if (strcmp(cases[k].gpu, "a100-80gb") == 0) {
            peak_req[ia] = rep->ranks[0].stats.requested.peak;
            live_req[ia] = early;
            MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
            o.allocator = "exact";
            GError *error = NULL;
            MemsimReport *ex = memsim_replay_trace(t, &o, &error);
            cr_assert(ex, "%s", error ? error->message : "?");
            peak_exact[ia] = ex->ranks[0].stats.allocated.peak;
            count_workspaces(t, cases[k].size, ex->ranks[0].peak_allocated_event,
                             &live_exact[ia]);
            memsim_report_free(ex);
            ia++;
        }
        memsim_report_free(rep);
        memsim_trace_free(t);
    }
    cr_assert_eq(ia, 3);
    const int64_t sizes[3] = {WS_DEFAULT, 64LL << 20, 2LL << 20};
    for (int j = 0; j < 3; j++) {
        cr_expect_gt(live_req[j], 0, "no workspace live at the peak");
        cr_expect_gt(live_exact[j], 0, "no workspace live at exact's peak");
    }
    for (int j = 1; j < 3; j++) {
        cr_expect_eq(live_req[j], live_req[0], "the workspaces live at the peak");
        int64_t want = live_req[0] * (sizes[j] - sizes[0]);
        cr_expect_eq(peak_req[j] - peak_req[0], want,
                     "workspace %" G_GINT64_FORMAT " vs %" G_GINT64_FORMAT ": peak requested "
                     "moved by %" G_GINT64_FORMAT ", want %d × the difference = %"
                     G_GINT64_FORMAT, sizes[j], sizes[0], peak_req[j] - peak_req[0],
                     live_req[0], want);
        cr_expect_eq(live_exact[j], live_exact[0]);
        int64_t want_ex = live_exact[0] * (sizes[j] - sizes[0]);
        cr_expect_eq(peak_exact[j] - peak_exact[0], want_ex,
                     "exact: peak allocated moved by %" G_GINT64_FORMAT ", want %d × the "
                     "difference = %" G_GINT64_FORMAT, peak_exact[j] - peak_exact[0],
                     live_exact[0], want_ex);
    }
}

/* ---- 5. gradient accumulation ---- */

/* Simulated time from the start of step `step` (1-based) to the next step's start or the end. */
static double step_time(const MemsimRankReport *r, guint step)
{
    cr_assert_leq(step, r->n_steps);
    double end = step < r->n_steps ? r->steps[step].start_us : r->time_us;
    return end - r->steps[step - 1].start_us;
}

/* Summed durations of the ops of a phase in the program (the cost model's figures). */
static double phase_us(MemsimTrace *t, int phase)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    const MemsimTraceHeader *h = memsim_trace_header(t);
    double us = 0.0;
    for (gsize i = 0; i < n; i++)
        if (ev[i].kind == MEMSIM_EV_OP && h->ops[ev[i].id].phase == phase)
            us += h->ops[ev[i].id].duration_us;
    return us;
}

/* GPT-2 (124,439,808 parameters, published), bf16-mixed AdamW on one GPU, batch 2, seq 128:
 * fp32 parameters 4Ψ, gradients 4Ψ, Adam 8Ψ at the step, with any number of micro-batches —
 * the gradients accumulate in place. Each micro-batch's activations are freed by its
 * backward, so the most activation bytes live is one micro-batch's whichever N. With
 * zero_grad(set_to_none=True) (the default) the gradients of the first micro-batch are new,
 * those of the later ones are added to live gradients: accumulation can add to the peak at
 * most the 4Ψ bytes of one gradient set, far from N-fold. With set_to_none=False the
 * gradients live through every step's forward and backward with or without accumulation, and
 * a step of N micro-batches peaks where a step of one does: the two peaks (requested bytes)
 * differ by less than one micro-batch's inputs (input ids and labels, 2 × b × s int64; the
 * generator reuses them, a data loader would bring new ones). The forward and backward run N
 * times: the step's time less its optimizer grows N-fold (within 10%). */
Test(claims, grad_accum_does_not_multiply_memory, .timeout = 120)
{
    const int64_t psi = 124439808, inputs = 2 * 2 * 128 * 8;
    const int N = 4;
    const char *one[] = {"seq", "128", "batch", "2", "steps", "2", "grad-accum", "1", NULL};
    const char *four[] = {"seq", "128", "batch", "2", "steps", "2", "grad-accum", "4", NULL};
    MemsimTrace *t1 = tu_generate("gpt2", one), *t4 = tu_generate("gpt2", four);
    MemsimReport *r1 = replay(t1), *r4 = replay(t4);
    for (int k = 0; k < 2; k++) {
        const MemsimBreakdown *b = state_of(&(k ? r4 : r1)->ranks[0]);
        cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], 4 * psi, "grad-accum %d", k ? N : 1);
        cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], 4 * psi, "grad-accum %d: gradients %"
                     G_GINT64_FORMAT ", want 4Ψ = %" G_GINT64_FORMAT, k ? N : 1,
                     b->requested[MEMSIM_CAT_GRADIENT], 4 * psi);
        cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], 8 * psi, "grad-accum %d",
                     k ? N : 1);
    }
    int64_t act1 = max_live(t1, MEMSIM_CAT_ACTIVATION, FWD_BWD);
    int64_t act4 = max_live(t4, MEMSIM_CAT_ACTIVATION, FWD_BWD);
    cr_expect_gt(act1, 0);
    cr_expect_eq(act4, act1, "activations live: %" G_GINT64_FORMAT " with %d micro-batches, %"
                 G_GINT64_FORMAT " with one", act4, N, act1);
    int64_t p1 = r1->ranks[0].stats.requested.peak, p4 = r4->ranks[0].stats.requested.peak;
    cr_expect_geq(p4, p1);
    cr_expect_leq(p4 - p1, 4 * psi,
                  "peak requested %" G_GINT64_FORMAT " with %d micro-batches, %" G_GINT64_FORMAT
                  " with one: more than one gradient set (%" G_GINT64_FORMAT ") apart",
                  p4, N, p1, 4 * psi);
    cr_expect_lt(p4, p1 + (N - 1) * act1, "the peak grew by N − 1 micro-batches' activations");

    /* time: the last step of each, its optimizer ops' own durations set apart */
    double opt1 = phase_us(t1, MEMSIM_PHASE_OPTIMIZER) / 2.0;
    double opt4 = phase_us(t4, MEMSIM_PHASE_OPTIMIZER) / 2.0;
    cr_expect(fabs(opt4 - opt1) <= 1e-6 * opt1, "the optimizer's ops: %.1f vs %.1f µs", opt4,
              opt1);
    double fb1 = step_time(&r1->ranks[0], 2) - opt1, fb4 = step_time(&r4->ranks[0], 2) - opt4;
    cr_assert_gt(fb1, 0.0);
    cr_log_info("grad-accum %d: peak requested %" G_GINT64_FORMAT " (one: %" G_GINT64_FORMAT
                "), activations %" G_GINT64_FORMAT ", forward + backward %.1f µs (one: %.1f)",
                N, p4, p1, act4, fb4, fb1);
    cr_expect(fabs(fb4 / fb1 - N) <= 0.1 * N,
              "forward + backward of a step: %.1f µs with %d micro-batches, %.1f with one "
              "(ratio %.2f, want about %d)", fb4, N, fb1, fb4 / fb1, N);
    memsim_report_free(r1);
    memsim_report_free(r4);
    memsim_trace_free(t1);
    memsim_trace_free(t4);

    /* gradients kept between steps: the same peak */
    const char *one_z[] = {"seq", "128", "batch", "2", "steps", "2", "grad-accum", "1",
                           "zero-grad", "zero", NULL};
    const char *four_z[] = {"seq", "128", "batch", "2", "steps", "2", "grad-accum", "4",
                            "zero-grad", "zero", NULL};
    t1 = tu_generate("gpt2", one_z);
    t4 = tu_generate("gpt2", four_z);
    r1 = replay(t1);
    r4 = replay(t4);
    p1 = r1->ranks[0].stats.requested.peak;
    p4 = r4->ranks[0].stats.requested.peak;
    cr_expect_gt(p1, 16 * psi, "the peak %" G_GINT64_FORMAT " is below the model state",
                 p1);
    cr_expect_lt(llabs(p4 - p1), inputs,
                 "zero_grad to zeros: peak requested %" G_GINT64_FORMAT " with %d micro-batches, %"
                 G_GINT64_FORMAT " with one, want less than one micro-batch's inputs (%"
                 G_GINT64_FORMAT ") apart", p4, N, p1, inputs);
    memsim_report_free(r1);
    memsim_report_free(r4);
    memsim_trace_free(t1);
    memsim_trace_free(t4);
}

/* ---- 6. the recorder's demo ---- */

/* `/usr/bin/python3 tools/memsim-record.py --demo step.txt` records two AdamW steps of its MLP
 * (Linear 256→512, GELU, Linear 512→256, GELU, Linear 256→10; fp32; inputs x [64, 256] fp32
 * and y [64] int64) and `memsim replay step.txt --allocator exact` reads it. From the model:
 * P = 256·512 + 512 + 512·256 + 256 + 256·10 + 10 parameters, 4P bytes; at the optimizer step
 * gradients 4P and Adam's two moments 8P plus state["step"], one 4-byte float tensor for each
 * of the 6 parameter tensors; at the end the gradients are gone (zero_grad to None). */
Test(claims, recorder_demo_replays, .timeout = 120)
{
    const char *py = "/usr/bin/python3";
    const char *probe[] = {py, "-c", "import torch", NULL};
    int rc = g_file_test(py, G_FILE_TEST_IS_EXECUTABLE) ? tu_run(probe, NULL, NULL, NULL) : -1;
    if (rc != 0)
        cr_skip_test("%s cannot import torch (Debian package python3-torch): the recorder's "
                     "demo is not run", py);
    const char *root = g_getenv("MEMSIM_SOURCE_ROOT");
    cr_assert(root, "MEMSIM_SOURCE_ROOT not set (run the tests through meson test)");
    g_autofree char *script = g_build_filename(root, "tools", "memsim-record.py", NULL);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *out = g_build_filename(dir, "step.txt", NULL);
    const char *rec[] = {py, script, "--demo", out, NULL};
    g_autofree char *rout = NULL, *rerr = NULL;
    rc = tu_run(rec, NULL, &rout, &rerr);
    cr_assert_eq(rc, 0, "the demo exited %d: %s%s", rc, rout, rerr);

    const char *argv[] = {"replay", out, "--allocator", "exact", NULL};
    g_autofree char *mout = NULL, *merr = NULL;
    rc = tu_run_memsim(argv, &mout, &merr);
    cr_expect_eq(rc, 0, "memsim replay exited %d: %s", rc, merr);

    const int64_t P = 256 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10;
    const int64_t inputs = 64 * 256 * 4 + 64 * 8, steps = 6 * 4;
    GError *error = NULL;
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.allocator = "exact";
    MemsimReport *rep = memsim_replay_path(out, &o, &error);
    cr_assert(rep, "%s", error ? error->message : "?");
    cr_assert_eq(rep->n_ranks, 1);
    const MemsimRankReport *r = &rep->ranks[0];
    cr_expect_eq(r->n_steps, 2, "two steps recorded, %u read", r->n_steps);
    cr_expect_eq((int64_t)r->peak_by_category_requested[MEMSIM_CAT_PARAMETER], 4 * P,
                 "parameters at the peak: %" G_GUINT64_FORMAT ", want 4P = %" G_GINT64_FORMAT,
                 (guint64)r->peak_by_category_requested[MEMSIM_CAT_PARAMETER], 4 * P);
    cr_expect_eq((int64_t)r->peak_by_category_requested[MEMSIM_CAT_INPUT], inputs);
    cr_expect_geq(r->stats.requested.peak, 16 * P + steps + inputs,
                  "peak %" G_GINT64_FORMAT " below parameters, gradients, Adam and inputs: %"
                  G_GINT64_FORMAT, r->stats.requested.peak, 16 * P + steps + inputs);
    cr_expect_eq(r->stats.requested.current, 12 * P + steps + inputs,
                 "live at the end: %" G_GINT64_FORMAT ", want parameters, Adam and inputs: %"
                 G_GINT64_FORMAT, r->stats.requested.current, 12 * P + steps + inputs);
    memsim_report_free(rep);
    g_unlink(out);
    g_rmdir(dir);
}

/* ---- 7. bad files to convert, compare and gen ---- */

static void expect_bad(const char *const *argv, const char *named, const char *what)
{
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    cr_expect_eq(rc, 2, "%s: exit %d, want 2; stderr: %s", what, rc, err);
    cr_expect(err && strstr(err, named) != NULL, "%s: the message does not name %s: %s", what,
              named, err);
    cr_expect(err && !strstr(err, "Sanitizer") && !strstr(err, "runtime error"),
              "%s: sanitizer report: %s", what, err);
}

Test(claims, bad_files_convert_compare_gen, .timeout = 120)
{
    static const char *const bad[] = {
        "bad/mst-truncated.exit2.mst",          /* a truncated .mst */
        "bad/pickle-corrupt-opcode.exit2.pickle", /* a corrupt pickle */
        "bad/pickle-truncated.exit2.pickle",
        "bad/text-garbage-line.exit2.txt",      /* a text trace with a syntax error */
        "bad/text-unterminated-string.exit2.txt",
    };
    g_autofree char *dir = tu_tmpdir();
    for (gsize k = 0; k < G_N_ELEMENTS(bad); k++) {
        g_autofree char *in = tu_test_data(bad[k]);
        cr_assert(g_file_test(in, G_FILE_TEST_IS_REGULAR), "%s is missing", in);
        const char *outs[] = {"out.mst", "out.txt", "out.pickle"};
        for (gsize j = 0; j < G_N_ELEMENTS(outs); j++) {
            g_autofree char *out = g_build_filename(dir, outs[j], NULL);
            const char *conv[] = {"convert", in, out, NULL};
            g_autofree char *what = g_strdup_printf("convert %s %s", bad[k], outs[j]);
            expect_bad(conv, in, what);
            g_unlink(out);
        }
        const char *cmp[] = {"compare", in, NULL};
        g_autofree char *what = g_strdup_printf("compare %s", bad[k]);
        expect_bad(cmp, in, what);
    }
    /* gen into a folder that does not exist */
    static const char *const outs[] = {"run.mst", "run.txt"};
    for (gsize j = 0; j < G_N_ELEMENTS(outs); j++) {
        g_autofree char *missing = g_build_filename(dir, "no-such-folder", outs[j], NULL);
        const char *gen[] = {"gen", "--model", "gpt2", "--seq", "64", "--steps", "1", "-o",
                             missing, NULL};
        g_autofree char *what = g_strdup_printf("gen -o %s", missing);
        expect_bad(gen, missing, what);
        g_autofree char *parent = g_path_get_dirname(missing);
        cr_expect(!g_file_test(parent, G_FILE_TEST_EXISTS), "gen created %s", parent);
    }
    g_rmdir(dir);
}
