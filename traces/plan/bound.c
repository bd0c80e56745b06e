/* A lower bound of a Megatron configuration's simulated step from a short run of the same
 * stage programs (the plan's search uses it where the cost model of traces/plan/cost.c is
 * too optimistic to rule a candidate out).
 *
 * The replay runs a rank's kernels on its stream one after another (sim/replay.c: an op
 * starts when its stream is free), and a pipeline stage starts its first forward when the
 * stage before it has sent it the activations, its last backward having sent the gradients
 * on (the p2p channels of a pipeline). So stage 0's step takes at least, for every stage s:
 *
 *     Σ_{s' < s} F(s')  +  m · W(s)  +  Σ_{s' < s} B(s')
 *
 * W(s) the kernel time of one micro-batch on stage s (all its ops, forward, backward and
 * recomputation, on the compute stream), m the micro-batches of the step, F(s') and B(s') the
 * forward and backward of the first model chunk of stage s' (the layers it holds over the
 * virtual stages, each layer at least the fastest layer of the stage; communication ops left
 * out). Megatron's schedules start a stage on its first chunk's forward of micro-batch 0 and
 * end it on the first chunk's backward of the last (schedules.py), and the step of rank 0 runs
 * from before its first forward to after its last backward, so the chain holds for 1F1B,
 * interleaved and GPipe alike. The plan's step is the slowest rank's: at least rank 0's.
 *
 * The stage programs come from the configuration itself run with few micro-batches (4, or pp
 * for the interleaved schedule, whose micro-batches come in groups of pp) and one step: the
 * micro-batches of a step run the same ops whatever their number (their shapes depend on the
 * micro-batch size), so W(s) is the least over those micro-batches. Few enough that no stage's
 * steady phase repeats (traces/distributed.c PipeSteady: five units at least), so that every
 * micro-batch is written out; a run that still holds a REPEAT gives no bound. Where the stages
 * between the first and the last hold alike layers, only stages 0, 1 and pp − 1 are made, stage
 * 1 standing for the others (short_stages). */
#include "traces/plan/sweep.h"

#include "traces/model.h"
#include "traces/models.h"
#include "sim/idmap.h"

#include <math.h>
#include <string.h>

#define BOUND_MICROBATCHES 4

typedef struct {
    double *mb;       /* kernel time per micro-batch */
    double *host;     /* the host's time per micro-batch */
    double *fwd, *bwd; /* per (micro-batch, layer) */
    gboolean *layer_seen;
} StageSums;

/* The bound of stage programs in `t` for m micro-batches, in µs (`whole`: only the largest
 * m · W(s), without the chain's fill and drain); 0 when it cannot say. */
static double chain_bound(MemsimTrace *t, const int *stage_of, int pp, int v, int m0, int m,
                          int n_layers, double dispatch_us, gboolean whole)
{
    const MemsimTraceHeader *h = memsim_trace_header(t);
    if (h->n_ranks < 1 || (int)h->n_ranks > pp || n_layers <= 0)
        return 0.0;
    const gsize cells = (gsize)m0 * (gsize)n_layers;
    double *F = g_new0(double, pp), *B = g_new0(double, pp), *W = g_new0(double, pp);
    double host = 0.0, tail = 0.0;
    StageSums s = {g_new(double, m0), g_new(double, m0), g_new(double, cells),
                   g_new(double, cells), g_new(gboolean, n_layers)};
    gboolean ok = TRUE;
    gboolean *made = g_new0(gboolean, pp);
    for (guint32 tr = 0; tr < h->n_ranks && ok; tr++) {
        const int r = stage_of[tr];
        memset(s.mb, 0, sizeof(double) * (gsize)m0);
        memset(s.host, 0, sizeof(double) * (gsize)m0);
        memset(s.fwd, 0, sizeof(double) * cells);
        memset(s.bwd, 0, sizeof(double) * cells);
        memset(s.layer_seen, 0, sizeof(gboolean) * (gsize)n_layers);
        gsize n;
        const MemsimEvent *ev = memsim_trace_events(t, tr, &n);
        double after = 0.0; /* kernel time since the last op of a micro-batch */
        for (gsize i = 0; i < n && ok; i++) {
            if (ev[i].kind == MEMSIM_EV_REPEAT) {
                ok = FALSE; /* micro-batches not written out */
                break;
            }
            if (ev[i].kind != MEMSIM_EV_OP || ev[i].id >= h->n_ops)
                continue;
            const MemsimOpInfo *op = &h->ops[ev[i].id];
            if (op->microbatch < 0) {
                if (ev[i].stream == 0 && op->bound != MEMSIM_BOUND_HOST && op->duration_us > 0)
                    after += op->duration_us;
                continue;
            }
            after = 0.0;
            if (op->microbatch >= m0) {
                ok = FALSE;
                break;
            }
            /* the host issues every op of every stream, kernel or not (sim/replay.c run():
             * the profile's dispatch cost each, a module's own host time instead) */
            s.host[op->microbatch] += op->bound == MEMSIM_BOUND_HOST ? op->duration_us : dispatch_us;
            if (ev[i].stream != 0 || op->bound == MEMSIM_BOUND_HOST || !(op->duration_us > 0))
                continue;
            s.mb[op->microbatch] += op->duration_us;
            if (op->layer < 0 || op->layer >= n_layers)
                continue;
            gsize c = (gsize)op->microbatch * (gsize)n_layers + (gsize)op->layer;
            if (op->phase == MEMSIM_PHASE_FORWARD) {
                s.fwd[c] += op->duration_us;
                s.layer_seen[op->layer] = TRUE;
            } else if (op->phase == MEMSIM_PHASE_BACKWARD) {
                s.bwd[c] += op->duration_us;
                s.layer_seen[op->layer] = TRUE;
            }
        }
        if (!ok)
            break;
        if (r == 0)
            tail = after;
        /* the least micro-batch, and the least layer of any micro-batch */
        double w = INFINITY, lf = INFINITY, lb = INFINITY, hw = INFINITY;
        int layers = 0;
        for (int k = 0; k < m0; k++) {
            w = MIN(w, s.mb[k]);
            hw = MIN(hw, s.host[k]);
        }
        host = MAX(host, hw);
        for (int l = 0; l < n_layers; l++) {
            if (!s.layer_seen[l])
                continue;
            layers++;
            for (int k = 0; k < m0; k++) {
                lf = MIN(lf, s.fwd[(gsize)k * (gsize)n_layers + (gsize)l]);
                lb = MIN(lb, s.bwd[(gsize)k * (gsize)n_layers + (gsize)l]);
            }
        }
        if (!(w > 0) || !isfinite(w)) {
            ok = FALSE;
            break;
        }
        W[r] = w;
        int chunk = layers / (v > 0 ? v : 1);
        F[r] = layers ? chunk * lf : 0.0;
        B[r] = layers ? chunk * lb : 0.0;
        made[r] = TRUE;
    }
    /* the stages left out run stage 1's program (short_run: alike middle stages) */
    for (int r = 0; r < pp && ok; r++) {
        if (made[r])
            continue;
        if (r == 0 || r == pp - 1 || !made[1]) {
            ok = FALSE;
            break;
        }
        W[r] = W[1];
        F[r] = F[1];
        B[r] = B[1];
    }
    g_free(made);
    double best = 0.0;
    if (ok) {
        double fill = 0.0, drain = 0.0;
        for (int r = 0; r < pp; r++) {
            best = MAX(best, (whole ? 0.0 : fill + drain) + (double)m * W[r]);
            fill += F[r];
            drain += B[r];
        }
        /* after its last backward stage 0 runs the step's end on its stream (the gradients'
         * reduction, the optimizer, the parameters' gather): the chain ends there */
        best = whole ? MAX(best, (double)m * W[0] + tail) : best + tail;
        /* and the host's: every stage's host issues its micro-batches' ops one after another */
        best = MAX(best, (double)m * host);
    }
    g_free(s.mb);
    g_free(s.host);
    g_free(s.fwd);
    g_free(s.bwd);
    g_free(s.layer_seen);
    g_free(F);
    g_free(B);
    g_free(W);
    return best;
}

/* The micro-batches of candidate j's short run (0: none): for its step, BOUND_MICROBATCHES
 * (pp for the interleaved schedule); for its memory (`full`), as many in flight as the run
 * holds where the schedule allows it with fewer (1F1B: pp; interleaved: 2 pp, whose warm-up
 * of 2 (pp - 1) + pp model chunks it then has in full; GPipe holds all m:
 * BOUND_MICROBATCHES). */
int plan_short_micro(const Group *g, int j, gboolean full)
{
    if (g->method != MEMSIM_METHOD_MEGATRON || j < 0 || j >= g->nb)
        return 0;
    const int m = g->n_micro[j], pp = g->pp > 0 ? g->pp : 1;
    const gboolean interleaved = g->schedule == MEMSIM_PP_INTERLEAVED && g->v > 1;
    int m0 = interleaved ? pp : MIN(m, BOUND_MICROBATCHES);
    if (full && interleaved && m >= 2 * pp)
        m0 = 2 * pp;
    else if (full && g->schedule == MEMSIM_PP_1F1B)
        m0 = MIN(m, MAX(pp, BOUND_MICROBATCHES));
    return m < m0 || m0 < 1 ? 0 : m0;
}

/* Whether layers a and b of the model are built and run alike in run r (what a layer's
 * program depends on besides its index: traces/families.c fam_build_layer, traces/models.c
 * model_stage_forward). */
static gboolean layers_alike(const MemsimModel *m, const MemsimRun *r, int64_t a, int64_t b)
{
    const gboolean sac = r->checkpointing == MEMSIM_CKPT_SAC_LAYER && r->sac_every > 0;
    return model_layer_is_sliding(m, a) == model_layer_is_sliding(m, b) &&
           model_layer_is_moe(m, a) == model_layer_is_moe(m, b) &&
           (!sac || ((a + 1) % r->sac_every == 0) == ((b + 1) % r->sac_every == 0));
}

/* The stages whose programs a short run makes (one flag per stage), or NULL for all. A
 * preset or config.json model's stages split its layers evenly (traces/distributed.c
 * megatron_program: chunk k of stage s holds layers [(k pp + s) per, + per)); only the first
 * stage holds the embedding and only the last the head and the loss, so where the layers of
 * the stages between them are alike layer for layer, those stages run the same ops for each
 * micro-batch, in an order that differs only by how many forwards they hold in flight. Stage 1
 * then stands for them in the chain bound (its kernel time per micro-batch, its first chunk's
 * forward and backward), and stages 0, 1 and pp − 1 are made. The memory check only asks
 * fewer stages (where one of them passes the limit, the run does). (A Megatron launch's own
 * model is made whole: its flags place layers stage by stage.) */
static gboolean *short_stages(const Sweep *sw, const Group *g, const MemsimRun *r)
{
    const MemsimModel *m = sw->model;
    const int pp = g->pp, v = r->pp_schedule == MEMSIM_PP_INTERLEAVED ? r->virtual_stages : 1;
    if (sw->all_stages || m->fam == FAM_MEGATRON || pp < 4 || v < 1 || m->L % ((int64_t)pp * v))
        return NULL;
    const int64_t per = m->L / ((int64_t)pp * v);
    for (int s = 2; s <= pp - 2; s++)
        for (int k = 0; k < v; k++)
            for (int64_t i = 0; i < per; i++)
                if (!layers_alike(m, r, ((int64_t)k * pp + 1) * per + i,
                                  ((int64_t)k * pp + s) * per + i))
                    return NULL;
    gboolean *on = g_new0(gboolean, pp);
    on[0] = on[1] = on[pp - 1] = TRUE;
    return on;
}

typedef struct {
    MemsimTrace *t;
    int m0;
    int *stage_of; /* the stage of each of the trace's ranks */
} ShortRun;

static void short_run_clear(ShortRun *s)
{
    memsim_trace_free(s->t);
    g_free(s->stage_of);
}

/* Candidate j's short run (FALSE when there is none): plan_short_micro's micro-batches, one
 * step (for its memory, as many as the run up to two), of the stages short_stages says. */
static gboolean short_run(const Sweep *sw, const Group *g, int j, gboolean full, ShortRun *out)
{
    memset(out, 0, sizeof *out);
    const int m0 = plan_short_micro(g, j, full);
    if (!m0)
        return FALSE;
    MemsimRun r;
    plan_candidate_run(sw, g, j, &r);
    r.microbatches = m0;
    /* (for its memory, as many steps as the run up to two: the second holds the optimizer
     * state the first step makes) */
    r.steps = full ? MIN(r.steps, 2) : 1;
    const int pp = g->pp > 0 ? g->pp : 1;
    g_autofree gboolean *on = short_stages(sw, g, &r);
    GError *e = NULL;
    MemsimTrace *t = memsim_generate_stages(sw->model, &r, on, &e);
    g_clear_error(&e);
    if (!t)
        return FALSE;
    out->t = t;
    out->m0 = m0;
    out->stage_of = g_new(int, pp);
    int n = 0;
    for (int s = 0; s < pp; s++)
        if (!on || on[s])
            out->stage_of[n++] = s;
    if ((guint32)n != memsim_trace_header(t)->n_ranks) {
        short_run_clear(out);
        return FALSE;
    }
    return TRUE;
}

static double stage_bound(const Sweep *sw, const Group *g, int j, gboolean whole)
{
    ShortRun sr;
    if (!short_run(sw, g, j, FALSE, &sr))
        return 0.0;
    const int m = g->n_micro[j], pp = g->pp > 0 ? g->pp : 1;
    const gboolean interleaved = g->schedule == MEMSIM_PP_INTERLEAVED && g->v > 1;
    /* (the plan replays with the profile's dispatch cost: traces/plan/plan.c replay_as) */
    double dispatch = sw->gpu ? sw->gpu->dispatch_us : 0.0;
    double us = chain_bound(sr.t, sr.stage_of, pp, interleaved ? g->v : 1, sr.m0, m,
                            sw->model->L, dispatch, whole);
    short_run_clear(&sr);
    /* (floating-point slack: stay below) */
    return us / 1e6 * (1.0 - 1e-9);
}

double plan_step_bound(const Sweep *sw, const Group *g, int j)
{
    return stage_bound(sw, g, j, FALSE);
}

/* Where the global batch is fixed, every b of a configuration runs b · m = the same
 * sequences per replica. A kernel's time at k b is at most k times its time at b (traces/
 * gpus.c, traces/autograd.c: FLOPs and bytes grow at most k-fold with the micro-batch, GEMM
 * waves ceil(k x) ≤ k ceil(x), the shortest kernel is a floor), so a micro-batch of b takes at
 * least b / B of one of B when b divides B, and m(b) · W(b) ≥ m(B) · W(B): the kernel time of
 * the step's micro-batches on the busiest stage at the largest b is a floor for all of them. */
double plan_step_floor(const Sweep *sw, const Group *g, int j)
{
    return stage_bound(sw, g, j, TRUE);
}

/* Whether rank `rank`'s live requests pass `limit` bytes at some point of its program: what
 * memsim_replay_trace_bounded asks at each allocation (sim/replay.c alloc_done: the policy's
 * requested bytes are its live requests), which needs no allocator, a rank's live tensors
 * being its own events' doing. A REPEAT's unit runs `times` more times after its template,
 * its own tensors' ids (from `from` on) moved by `shift` each time, and the last
 * repetition's tensors then take the template's ids back (sim/replay.c repeat_fill,
 * steady_rename). FALSE too where the program is not one this reads (a repeat inside a
 * unit): nothing is then settled by it. */
gboolean plan_rank_requested_over(MemsimTrace *t, guint32 rank, int64_t limit)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, rank, &n);
    IdMap live;
    idmap_init(&live);
    int64_t cur = 0;
    gboolean over = FALSE, sane = TRUE;
    for (gsize i = 0; i < n && !over && sane; i++) {
        gsize len = 1;
        uint64_t times = 0, from = 0, shift = 0;
        if (ev[i].kind == MEMSIM_EV_REPEAT) {
            if (!ev[i].size)
                continue; /* a unit that did not repeat: nothing follows it */
            len = (gsize)ev[i].size;
            times = ev[i].aux;
            from = ev[i].id;
            shift = ev[i].addr;
            if (len > n - i - 1 || times > ((uint64_t)1 << 32)) {
                sane = FALSE;
                break;
            }
            i++; /* the unit: its template, then the repetitions */
        }
        for (uint64_t rep = 0; rep <= times && !over && sane; rep++) {
            const uint64_t moved = rep * shift;
            for (gsize k = 0; k < len && !over; k++) {
                const MemsimEvent *e = &ev[i + k];
                if (e->kind == MEMSIM_EV_REPEAT) {
                    sane = FALSE;
                    break;
                }
                if (e->kind != MEMSIM_EV_ALLOC && e->kind != MEMSIM_EV_FREE)
                    continue;
                const uint64_t id = e->id >= from ? e->id + moved : e->id;
                IdVal v;
                if (e->kind == MEMSIM_EV_ALLOC) {
                    v = (IdVal){.req = e->size};
                    idmap_reserve(&live);
                    IdSlot *sl = idmap_slot(&live, id);
                    if (sl->key1) { /* allocated twice: not a program this reads */
                        sane = FALSE;
                        break;
                    }
                    idmap_fill(&live, sl, id, &v);
                    cur += (int64_t)e->size;
                    over = cur > limit;
                } else if (idmap_remove(&live, id, &v)) {
                    cur -= (int64_t)v.req;
                }
            }
        }
        if (times && !over && sane) {
            /* the last repetition's own tensors take the template's ids back */
            const uint64_t moved = times * shift;
            sane = idmap_move_down(&live, from + moved, moved);
        }
        i += len - 1;
    }
    idmap_clear(&live);
    return over && sane;
}

/* The short run asks for no more memory than the run: it is the same stage programs with
 * fewer micro-batches and at most as many steps (two). Megatron's schedules hold
 * min(warm-up + 1, m) micro-batches in flight on a stage (1F1B: pp - rank - 1 warm-up
 * forwards; interleaved: 2 (pp - rank - 1) + (v - 1) pp model chunks; GPipe: all m), never
 * fewer with more micro-batches, and every state of a step of the short run (its warm-up, its
 * steady pairs, its cool-down, its optimizer step) is a state of the same step of the run
 * with as many micro-batches in flight or more. So where some rank's requested bytes pass
 * `limit` in the short run, they do in the run (tests/test_plan_bound.c); the stages the
 * short run leaves out (short_stages) are only not asked. */
gboolean plan_short_run_over(const Sweep *sw, const Group *g, int j, int64_t limit)
{
    ShortRun sr;
    if (!short_run(sw, g, j, TRUE, &sr))
        return FALSE;
    gboolean over = FALSE;
    for (guint32 r = 0; r < memsim_trace_header(sr.t)->n_ranks && !over; r++)
        over = plan_rank_requested_over(sr.t, r, limit);
    short_run_clear(&sr);
    return over;
}
