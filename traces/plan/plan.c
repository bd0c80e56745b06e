/* `memsim plan` (include/memsim/plan.h): sweep the configurations of a run on a cluster,
 * simulate each the way `memsim estimate` does, rank those that fit by the cost model of
 * traces/plan/cost.c.
 *
 * The search space. A layout is a method with its degrees: DDP, ZeRO-1/2/3, FSDP
 * FULL_SHARD / SHARD_GRAD_OP / HYBRID_SHARD (across nodes only), Megatron tp × pp × dp (tp
 * within a node and dividing the heads, key/value heads and MLP width; pp dividing the
 * layers), one GPU, or LoRA/QLoRA replicas. Its members (configurations) add the schedule
 * (1F1B, interleaved with 2 virtual stages, GPipe on request) and the checkpointing mode
 * (none, selective, full). Each member takes the micro-batches b that divide its replica's
 * share of the global batch (without one: powers of two up to max_batch); going up from the
 * smallest b that fits, a larger one is chosen only when the cost model makes it more than
 * 2% faster (BATCH_GAIN); its allocator setting is the default, or expandable_segments when
 * only that fits. A layout's row is its fastest member's (ties: the first enumerated); rows
 * are ranked by tokens per second, then the smaller peak, then the enumeration order: a
 * total order, so the result does not depend on the thread count (the statistics do).
 *
 * The search. Layouts are spread over a GThreadPool, likeliest to give fast rows first (the
 * guess of their lightest members at the smallest b); within a layout one thread works alone.
 * A candidate's guess of its step is a lower bound of its simulated step: the cost model
 * (traces/plan/cost.c), raised where the search needs it, for Megatron layouts, to the bound
 * of a short run of the same stage programs (traces/plan/bound.c: the kernels of the step's
 * micro-batches on each stage, chained through the pipeline; with a fixed global batch, one
 * run at the largest b floors every b that divides it), and after a sibling's simulation to
 * its host dispatch time. The cost model is meant to stay below the simulation but does not
 * always (a Megatron launch's: twice above it): once a simulated Megatron step shows it above,
 * its guesses stop bounding anything (Sweep.model_over) and only the sound bounds prune; a
 * candidate with none is simulated.
 *   1. Memory bound: the model-state lower bound (below) plus the CUDA context and NCCL
 *      above the memory rules the layout out, unsimulated.
 *   2. Cost bound: a layout (or member, or micro-batch) whose best possible speed is below
 *      the threshold — the K-th best of the layouts' rows known to be possible (each
 *      layout's row is at least as fast as its choice among the b known to fit) — cannot
 *      enter the top K; nor can a member slower than its layout's best known row. The
 *      threshold only rises, so what it skips never shows, whatever the timing.
 *   3. Members are taken by what they could still reach. Whether the smallest b fits is
 *      settled by probing the middle of the member's chain of checkpointing modes (the peak
 *      of full ≤ selective ≤ none: a fit tells about the lighter ones, a miss about the
 *      heavier); then the probes aim at the smallest b that would change the choice and
 *      matter, galloping up and bisecting down, the peak assumed to grow with b.
 *   4. A Megatron probe first replays its short run (the same stage programs with as many
 *      micro-batches in flight where the schedule allows, at most two steps:
 *      traces/plan/bound.c) up to its requested bytes: past the device, the run is a miss
 *      without being generated. A probe generates the trace once and replays it through
 *      torch with the default settings (first without a memory limit where a miss would be
 *      measured anyway: below
 *      the capacity it is the same run, and its requested bytes bound every setting from
 *      below); when that does not fit, the `exact` policy (a lower bound of torch's peak under
 *      any setting: the live tensors rounded to 512 bytes, whose peak every replay reports
 *      as rounded_peak) must fit before expandable_segments is tried.
 * The assumptions (the peak grows with b and with less checkpointing) are checked against
 * MemsimPlanOptions.exhaustive, which simulates every member and micro-batch with both
 * settings (tests/test_plan.c). The closest misses are the members whose smallest b does
 * not fit and would beat the recommendation, fastest first; those only inferred to miss
 * are simulated at the end for their figures.
 *
 * The model-state lower bound per rank, from the tensors alive together at the optimizer
 * step (the closed forms tests/test_distributed.c checks; padding and ceilings left out so
 * that they stay below): DDP 2 p Ψ + Adam 2 p Ψ (p = 4 under autocast); ZeRO-1 2 c Ψ + 12
 * Ψ/N; ZeRO-2 c Ψ + 12 Ψ/N; ZeRO-3 c Ψ/N + 12 Ψ/N; FSDP 16 Ψ/N (HSDP: N = GPUs per node);
 * SHARD_GRAD_OP also c Ψ + 4 Ψ/N (every unit unsharded at the end of the forward); Megatron
 * (c + 4) Ψ/(tp pp) + 12 Ψ/(tp pp dp) (the largest stage holds at least the average); one
 * GPU, full fine-tuning, 2 p Ψ. c is the compute dtype's size.
 *
 * CPU offload of the optimizer state, the last resort when nothing fits: a run is replayed
 * without a memory limit and its device total minus the optimizer state allocated at the
 * optimizer step (the fp32 master and moments) must fit; that state is the host memory per
 * GPU. An approximation: the transfer buffers offloading needs, and pinned memory, are not
 * modelled, and `memsim estimate` cannot replay it.
 *
 * MIG (one GPU): each slice profile's memory as `nvidia-smi mig -lgip` lists it and its SMs;
 * the sweep runs per slice with the compute scaled by SMs / the GPU's SMs and the memory
 * bandwidth by the memory slices / 8.
 */
#include <memsim/plan.h>
#include <memsim/sim.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "traces/deepspeed.h"
#include "traces/estimate/judge.h"
#include "traces/plan/cost.h"
#include "traces/plan/sweep.h"
#include "traces/model.h"
#include "traces/settings.h"
#include "sim/replay_bound.h"

#define DEFAULT_MAX_BATCH 256
#define DEFAULT_TOP 5
#define DEFAULT_MISSES 5
#define BATCH_GAIN 1.02 /* a larger micro-batch must be 2% faster to be chosen */
#define SHORT_RATIO 4   /* a step is bounded from a short run of at most 1/4 of its micro-batches */

/* MIG slice profiles: traces/gpus.c (memsim_mig_profiles); each slice is a GPU profile of
 * its own (memsim_gpu_find("a100-40gb:1g.5gb")). */

MemsimPlanOptions memsim_plan_options_defaults(void)
{
    MemsimPlanOptions o = {0};
    o.gpus = 1;
    o.top = DEFAULT_TOP;
    o.misses = DEFAULT_MISSES;
    o.context_bytes = MEMSIM_ESTIMATE_CONTEXT_DEFAULT;
    return o;
}

gboolean memsim_plan_parse_list(const char *key, const char *value, guint *bits, GError **error)
{
    static const struct {
        const char *key, *word;
        guint bits;
    } words[] = {
        {"methods", "ddp", MEMSIM_PLAN_DDP},
        {"methods", "zero1", MEMSIM_PLAN_ZERO1},
        {"methods", "zero2", MEMSIM_PLAN_ZERO2},
        {"methods", "zero3", MEMSIM_PLAN_ZERO3},
        {"methods", "zero", MEMSIM_PLAN_ZERO1 | MEMSIM_PLAN_ZERO2 | MEMSIM_PLAN_ZERO3},
        {"methods", "fsdp", MEMSIM_PLAN_FSDP},
        {"methods", "fsdp-grad-op", MEMSIM_PLAN_FSDP_GRAD_OP},
        {"methods", "hsdp", MEMSIM_PLAN_HSDP},
        {"methods", "tp", MEMSIM_PLAN_TP},
        {"methods", "pp", MEMSIM_PLAN_PP},
        {"methods", "megatron", MEMSIM_PLAN_TP | MEMSIM_PLAN_PP},
        {"methods", "all", MEMSIM_PLAN_ALL},
        {"schedules", "1f1b", 1u << MEMSIM_PP_1F1B},
        {"schedules", "gpipe", 1u << MEMSIM_PP_GPIPE},
        {"schedules", "interleaved", 1u << MEMSIM_PP_INTERLEAVED},
        {"checkpointing", "none", 1u << MEMSIM_CKPT_NONE},
        {"checkpointing", "selective", 1u << MEMSIM_CKPT_SELECTIVE},
        {"checkpointing", "full", 1u << MEMSIM_CKPT_FULL},
    };
    g_auto(GStrv) parts = g_strsplit(value ? value : "", ",", -1);
    guint out = 0;
    for (char **p = parts; *p; p++) {
        char *w = g_strstrip(*p);
        gboolean found = FALSE;
        for (gsize i = 0; i < G_N_ELEMENTS(words) && !found; i++)
            if (strcmp(words[i].key, key) == 0 && g_ascii_strcasecmp(words[i].word, w) == 0) {
                out |= words[i].bits;
                found = TRUE;
            }
        if (!found) {
            GString *known = g_string_new(NULL);
            for (gsize i = 0; i < G_N_ELEMENTS(words); i++)
                if (strcmp(words[i].key, key) == 0)
                    g_string_append_printf(known, "%s%s", known->len ? ", " : "", words[i].word);
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: unknown '%s' (known: %s)",
                        key, w, known->str);
            g_string_free(known, TRUE);
            return FALSE;
        }
    }
    if (!out) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: empty list", key);
        return FALSE;
    }
    *bits = out;
    return TRUE;
}

/* ---- what memsim_estimate does after generating, on a trace we keep ---- */

/* How far a replay goes: all the way; until some rank's requested bytes pass what the device
 * leaves them (no memory limit: the sweep's gpu_mem less the context and NCCL,
 * needs_more_than's test, made at each allocation); until the run shows it does not fit (an
 * allocation fails, or some rank's reserved bytes pass what the device leaves them: the device
 * total report_fits judges), when only whether it fits is asked. */
typedef enum { WHOLE, UNTIL_OVER, UNTIL_MISS } Reach;

/* Replays `t` as memsim_estimate would with these settings (traces/estimate/judge.h);
 * `reserve` more bytes are kept off the allocator's capacity (the exact bound judges NCCL's
 * share up front). NULL where `reach` stops it short. */
static MemsimReport *replay_as(Sweep *sw, MemsimTrace *t, const MemsimRun *run,
                               const char *allocator, const char *alloc_conf,
                               memsim_size_t gpu_mem, memsim_size_t reserve, Reach reach)
{
    Judge j;
    GError *e = NULL;
    if (!judge_begin(&j, run, gpu_mem, sw->ctx, sw->opt.nccl_bytes, reserve, &e))
        g_error("plan: %s", e->message); /* the plan checked the context against the device */
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.allocator = allocator;
    o.alloc_conf = alloc_conf;
    o.capacity = j.capacity;
    o.dispatch_us = sw->gpu ? sw->gpu->dispatch_us : 0.0;
    o.threads = 1; /* the sweep's threads take the processors, a configuration each */
    gboolean over = FALSE;
    MemsimReport *rep =
        reach == UNTIL_OVER
            ? memsim_replay_trace_bounded(
                  t, &o, (int64_t)sw->gpu_mem - (int64_t)(j.context + j.nccl), &over, &e)
        : reach == UNTIL_MISS
            ? memsim_replay_trace_if_fits(
                  t, &o, (int64_t)sw->gpu_mem - (int64_t)(j.context + j.nccl), &over, &e)
                             : memsim_replay_trace(t, &o, &e);
    g_mutex_lock(&sw->lock);
    sw->n_replays++;
    g_mutex_unlock(&sw->lock);
    if (over)
        return NULL;
    if (!rep) {
        /* a generated trace that does not replay is a bug of the generator */
        g_error("plan: replaying a generated trace failed: %s", e->message);
    }
    judge_end(&j, rep);
    return rep;
}

static MemsimReport *replay(Sweep *sw, MemsimTrace *t, const MemsimRun *run, const char *allocator,
                            const char *alloc_conf, memsim_size_t gpu_mem, memsim_size_t reserve)
{
    return replay_as(sw, t, run, allocator, alloc_conf, gpu_mem, reserve, WHOLE);
}

/* replay() without a memory limit for a probe whose miss need not be measured. */
static MemsimReport *replay_unless_over(Sweep *sw, MemsimTrace *t, const MemsimRun *run)
{
    return replay_as(sw, t, run, NULL, NULL, 0, 0, UNTIL_OVER);
}

/* replay() where only whether the run fits is asked: NULL where it does not. */
static MemsimReport *replay_if_fits(Sweep *sw, MemsimTrace *t, const MemsimRun *run,
                                    const char *allocator, const char *alloc_conf,
                                    memsim_size_t reserve)
{
    return replay_as(sw, t, run, allocator, alloc_conf, sw->gpu_mem, reserve, UNTIL_MISS);
}

/* (NULL: a replay that showed a miss, replay_if_fits) */
static gboolean report_fits(const MemsimReport *rep)
{
    if (!rep)
        return FALSE;
    for (guint i = 0; i < rep->n_ranks; i++)
        if (!rep->ranks[i].fits)
            return FALSE;
    return TRUE;
}

static memsim_size_t optimizer_state_of(const MemsimRankReport *r)
{
    for (guint i = 0; i < r->n_breakdowns; i++)
        if (strcmp(r->breakdowns[i].name, MEMSIM_BREAKDOWN_MODEL_STATE) == 0)
            return (memsim_size_t)r->breakdowns[i].allocated[MEMSIM_CAT_OPTIMIZER_STATE];
    return 0;
}

static void probe_clear(Probe *p)
{
    for (guint32 i = 0; i < p->n_ranks; i++)
        g_free(p->ranks[i].role);
    g_free(p->ranks);
    g_free(p->error);
    memset(p, 0, sizeof *p);
}

/* Takes the figures of `rep` into `p`. */
static void probe_take(Probe *p, const MemsimReport *rep, gboolean offload)
{
    for (guint32 i = 0; i < p->n_ranks; i++)
        g_free(p->ranks[i].role);
    g_free(p->ranks);
    p->n_ranks = rep->n_ranks;
    p->ranks = g_new0(MemsimPlanRank, rep->n_ranks);
    p->peak = 0;
    p->host = 0;
    p->step_s = 0;
    for (guint i = 0; i < rep->n_ranks; i++) {
        const MemsimRankReport *r = &rep->ranks[i];
        MemsimPlanRank *o = &p->ranks[i];
        MemsimStepTime st;
        memsim_step_time(r, r->n_steps ? r->n_steps - 1 : 0, &st);
        if (!r->oom.happened && st.step_us / 1e6 > p->step_s) {
            p->step_s = st.step_us / 1e6;
            p->parts = st;
            p->host_s = r->steps[r->n_steps - 1].host_us / 1e6;
        }
        o->rank = r->rank;
        o->multiplicity = r->multiplicity;
        o->role = g_strdup(r->role ? r->role : "");
        o->peak_allocated = (memsim_size_t)r->stats.allocated.peak;
        o->peak_reserved = (memsim_size_t)r->stats.reserved.peak;
        o->device_total = r->device_total;
        o->optimizer_state = optimizer_state_of(r);
        memsim_size_t need = r->device_total;
        memsim_size_t host = o->optimizer_state;
        if (offload)
            need = need > o->optimizer_state ? need - o->optimizer_state : 0;
        else
            host = r->host_peak; /* simulated offload (a DeepSpeed config's) */
        if (need > p->peak)
            p->peak = need;
        if (host > p->host)
            p->host = host;
    }
}

/* ---- candidates ---- */

/* The run of configuration `g` at micro-batch index j. Strings are borrowed from sw->base. */
static double psi_of(const Sweep *sw)
{
    return (double)memsim_model_n_params(sw->model);
}

/* Bytes of model state that must be on the device together (see the file's header). */
static memsim_size_t state_bound(const Sweep *sw, const Group *g, gboolean with_optimizer)
{
    double psi = psi_of(sw);
    MemsimPrecision pr = sw->base.precision;
    double c = pr == MEMSIM_PREC_FP32 ? 4.0 : 2.0;
    double p = pr == MEMSIM_PREC_BF16 || pr == MEMSIM_PREC_FP16 ? 2.0 : 4.0;
    double N = sw->opt.gpus, o = with_optimizer ? 1.0 : 0.0, b = 0;
    switch (g->method) {
    case MEMSIM_METHOD_NONE:
        b = sw->base.finetune == MEMSIM_FT_FULL ? 2.0 * p * psi : 0.0;
        break;
    case MEMSIM_METHOD_DDP:
        b = 2.0 * p * psi + o * 2.0 * p * psi;
        break;
    case MEMSIM_METHOD_ZERO1:
        b = 2.0 * c * psi + o * 12.0 * psi / N;
        break;
    case MEMSIM_METHOD_ZERO2:
        b = c * psi + o * 12.0 * psi / N;
        break;
    case MEMSIM_METHOD_ZERO3:
        b = c * psi / N + o * 12.0 * psi / N;
        break;
    case MEMSIM_METHOD_FSDP:
    case MEMSIM_METHOD_HSDP:
    case MEMSIM_METHOD_FSDP_GRAD_OP: {
        int gpn = sw->base.gpus_per_node;
        double n = g->method == MEMSIM_METHOD_HSDP && gpn < N ? gpn : N;
        b = 8.0 * psi / n + o * 8.0 * psi / n;
        if (g->method == MEMSIM_METHOD_FSDP_GRAD_OP && c * psi + 4.0 * psi / n > b)
            b = c * psi + 4.0 * psi / n;
        break;
    }
    case MEMSIM_METHOD_MEGATRON: {
        /* a Megatron launch's distributed optimizer shards over dp × cp */
        int cp = sw->base.megatron ? sw->base.megatron->o.cp : 1;
        double stage = psi / ((double)g->tp * g->pp);
        b = (c + 4.0) * stage + o * 12.0 * stage / ((double)g->dp * cp);
        break;
    }
    default:
        break;
    }
    return (memsim_size_t)floor(b * 0.999); /* floating-point slack: stay below */
}

/* A rough peak at the smallest b, only to take first the layouts whose fast members likely
 * fit (their rows raise the threshold early); it decides nothing. The model-state bound plus
 * Korthikanti et al.'s activations per layer (s b H (10 + 24/tp) bytes, or the 2 s b H of its input
 * with full recomputation) times the layers in flight on the first stage. */
static double guess_peak(const Sweep *sw, const Group *g)
{
    double s = (double)sw->base.seq, b = (double)g->bs[0], H = (double)sw->model->H,
           L = (double)sw->model->L;
    double tp = g->method == MEMSIM_METHOD_MEGATRON ? g->tp : 1;
    double per = g->ckpt == MEMSIM_CKPT_FULL ? 2.0 * s * b * H : s * b * H * (10.0 + 24.0 / tp);
    double layers = L;
    if (g->method == MEMSIM_METHOD_MEGATRON && g->pp > 1) {
        double inflight =
            g->schedule == MEMSIM_PP_GPIPE ? g->n_micro[0] : MIN(g->n_micro[0], g->pp);
        layers = inflight * L / g->pp * (g->schedule == MEMSIM_PP_INTERLEAVED ? 1.5 : 1.0);
    }
    return (double)g->bound + per * layers;
}

static void cost_refresh(const Sweep *sw, Group *g, int j);

static void fill_costs(Sweep *sw, Group *g)
{
    g->best_tps = 0;
    for (int j = 0; j < g->nb; j++) {
        CostInput in = {0};
        in.model = sw->model;
        in.gpu = sw->gpu;
        in.compute_fraction = sw->compute_fraction;
        in.memory_fraction = sw->memory_fraction;
        in.efficiency = sw->opt.efficiency;
        in.network_gbs = sw->opt.network_gbs;
        in.gpus = sw->opt.gpus;
        in.gpus_per_node = sw->base.gpus_per_node;
        in.precision = sw->base.precision;
        in.finetune = sw->base.finetune;
        in.lora_rank = sw->base.lora_rank;
        in.seq = sw->base.seq;
        in.method = g->method;
        in.replicas = g->replicas;
        in.tp = g->tp;
        in.pp = g->pp;
        in.dp = g->dp;
        in.v = g->v;
        in.schedule = g->schedule;
        in.checkpointing = g->ckpt;
        in.batch = g->bs[j];
        in.n_micro = g->n_micro[j];
        in.offload = sw->offload || (sw->base.deepspeed && sw->base.deepspeed->z.offload_optimizer);
        /* (a phase starts afresh: nothing simulated or bounded yet) */
        g->cost[j] = (CostResult){0};
        cost_step(&in, &g->cost[j]);
        g->cost[j].model_step_s = g->cost[j].step_s;
        cost_refresh(sw, g, j); /* (without the model where it overestimated before) */
        if (g->cost[j].tokens_per_s > g->best_tps)
            g->best_tps = g->cost[j].tokens_per_s;
    }
}

/* Micro-batches of a configuration; FALSE when none (the global batch does not divide). */
static gboolean fill_batches(Sweep *sw, Group *g)
{
    int64_t G = sw->opt.global_batch, maxb = sw->opt.max_batch;
    GArray *bs = g_array_new(FALSE, FALSE, sizeof(int64_t));
    GArray *ms = g_array_new(FALSE, FALSE, sizeof(int));
    bool mega = g->method == MEMSIM_METHOD_MEGATRON;
    if (G) {
        int64_t per = G % g->replicas_n == 0 ? G / g->replicas_n : 0;
        for (int64_t b = 1; per && b <= per && (!maxb || b <= maxb); b++) {
            if (per % b)
                continue;
            int64_t m = per / b;
            if (m > (mega ? 65536 : 4096))
                continue;
            if (mega && g->schedule == MEMSIM_PP_INTERLEAVED && m % g->pp)
                continue;
            int mi = (int)m;
            g_array_append_val(bs, b);
            g_array_append_val(ms, mi);
        }
    } else {
        int m = mega ? g->pp : 1;
        for (int64_t b = 1; b <= (maxb ? maxb : DEFAULT_MAX_BATCH); b *= 2) {
            g_array_append_val(bs, b);
            g_array_append_val(ms, m);
        }
    }
    g->nb = (int)bs->len;
    g->bs = (int64_t *)g_array_free(bs, FALSE);
    g->n_micro = (int *)g_array_free(ms, FALSE);
    g->cost = g_new0(CostResult, g->nb ? g->nb : 1);
    g->probes = g_new0(Probe, g->nb ? g->nb : 1);
    g->row = -1;
    return g->nb > 0;
}

static void add_group(Sweep *sw, GArray *out, MemsimMethod meth, int tp, int pp, int dp,
                      MemsimPipeSchedule sched, int v, guint ckpts, guint64 *n_bad_batch)
{
    for (int k = 0; k < 3; k++) {
        static const MemsimCheckpointing order[] = {MEMSIM_CKPT_NONE, MEMSIM_CKPT_SELECTIVE,
                                                    MEMSIM_CKPT_FULL};
        MemsimCheckpointing ck = order[k];
        if (!(ckpts & (1u << ck)))
            continue;
        Group g = {0};
        g.method = meth;
        g.replicas = meth == MEMSIM_METHOD_NONE && sw->opt.gpus > 1;
        g.tp = tp;
        g.pp = pp;
        g.dp = dp;
        g.v = v;
        g.schedule = sched;
        g.ckpt = ck;
        g.replicas_n = meth == MEMSIM_METHOD_MEGATRON              ? dp
                       : meth == MEMSIM_METHOD_NONE && !g.replicas ? 1
                                                                   : sw->opt.gpus;
        if (!fill_batches(sw, &g)) {
            (*n_bad_batch)++;
            g_free(g.bs);
            g_free(g.n_micro);
            g_free(g.cost);
            g_free(g.probes);
            continue;
        }
        g.idx = (int)out->len;
        g_array_append_val(out, g);
    }
}

/* Whether tp × pp (× v) is a layout a Megatron launch's flags allow (traces/megatron.c). */
static gboolean megatron_layout_ok(const Sweep *sw, int tp, int pp, int v)
{
    MemsimRun r = sw->base;
    r.gpus = sw->opt.gpus;
    r.tp = tp;
    r.pp = pp;
    r.dp = 0;
    r.virtual_stages = v;
    r.pp_schedule = v > 1 ? MEMSIM_PP_INTERLEAVED : MEMSIM_PP_1F1B;
    r.sequence_parallel = sw->base.sequence_parallel && tp > 1;
    return mg_check_layout(sw->base.megatron, &r, NULL);
}

/* Every configuration of the sweep, in a fixed order. A Megatron launch (run->megatron) is
 * swept over Megatron's layouts only, each checked against the launch's flags, its context-
 * parallel degree kept. */
static gboolean enumerate(Sweep *sw, GError **error)
{
    const MemsimModel *m = sw->model;
    const MemsimPlanOptions *o = &sw->opt;
    const MemsimMegatron *mg = sw->base.megatron;
    guint meth = o->methods ? o->methods : MEMSIM_PLAN_ALL;
    guint ckpts = o->checkpointing ? o->checkpointing : 7u;
    guint scheds =
        o->schedules ? o->schedules : (1u << MEMSIM_PP_1F1B) | (1u << MEMSIM_PP_INTERLEAVED);
    int gpus = o->gpus, gpn = sw->base.gpus_per_node, cp = mg ? mg->o.cp : 1;
    guint64 bad = 0;
    GArray *out = g_array_new(FALSE, FALSE, sizeof(Group));
    if (mg) {
        if (!(meth & (MEMSIM_PLAN_TP | MEMSIM_PLAN_PP))) {
            g_array_unref(out);
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "methods: a Megatron-LM launch is planned over Megatron's layouts only "
                        "(tp, pp, megatron)");
            return FALSE;
        }
        meth &= MEMSIM_PLAN_TP | MEMSIM_PLAN_PP;
    }
    if (sw->base.deepspeed && o->methods) {
        guint bit = sw->base.method == MEMSIM_METHOD_ZERO1   ? MEMSIM_PLAN_ZERO1
                    : sw->base.method == MEMSIM_METHOD_ZERO2 ? MEMSIM_PLAN_ZERO2
                                                             : MEMSIM_PLAN_ZERO3;
        if (!(o->methods & bit)) {
            g_array_unref(out);
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "methods: the DeepSpeed config %s runs ZeRO stage %d (zero%d); the plan "
                        "keeps it",
                        sw->base.deepspeed->source, sw->base.deepspeed->z.stage,
                        sw->base.deepspeed->z.stage);
            return FALSE;
        }
    }
    if (sw->base.deepspeed) {
        /* a DeepSpeed config: its ZeRO stage, the micro-batch and the rest swept around it */
        add_group(sw, out, sw->base.method, 1, 1, gpus, MEMSIM_PP_1F1B, 1, ckpts, &bad);
    } else if (!mg && (gpus == 1 || sw->base.finetune != MEMSIM_FT_FULL)) {
        add_group(sw, out, MEMSIM_METHOD_NONE, 1, 1, gpus, MEMSIM_PP_1F1B, 1, ckpts, &bad);
    } else {
        static const struct {
            guint bit;
            MemsimMethod m;
        } dpm[] = {
            {MEMSIM_PLAN_DDP, MEMSIM_METHOD_DDP},
            {MEMSIM_PLAN_ZERO1, MEMSIM_METHOD_ZERO1},
            {MEMSIM_PLAN_ZERO2, MEMSIM_METHOD_ZERO2},
            {MEMSIM_PLAN_ZERO3, MEMSIM_METHOD_ZERO3},
            {MEMSIM_PLAN_FSDP, MEMSIM_METHOD_FSDP},
            {MEMSIM_PLAN_FSDP_GRAD_OP, MEMSIM_METHOD_FSDP_GRAD_OP},
            {MEMSIM_PLAN_HSDP, MEMSIM_METHOD_HSDP},
        };
        for (gsize i = 0; i < G_N_ELEMENTS(dpm); i++) {
            if (!(meth & dpm[i].bit))
                continue;
            /* HSDP within one node is FSDP */
            if (dpm[i].m == MEMSIM_METHOD_HSDP && (gpus <= gpn || gpus % gpn))
                continue;
            add_group(sw, out, dpm[i].m, 1, 1, gpus, MEMSIM_PP_1F1B, 1, ckpts, &bad);
        }
        for (int tp = 1; tp <= gpus && tp <= gpn; tp++) {
            if (gpus % tp || m->nh % tp || (m->nkv != 1 && m->nkv % tp) || m->I % tp)
                continue;
            for (int pp = 1; pp <= gpus / tp; pp++) {
                if ((gpus / tp) % pp || pp > m->L || (!mg && m->L % pp) ||
                    (gpus / tp / pp) % cp || (mg && !megatron_layout_ok(sw, tp, pp, 1)))
                    continue;
                int dp = gpus / (tp * pp * cp);
                if (pp == 1) {
                    if (meth & MEMSIM_PLAN_TP)
                        add_group(sw, out, MEMSIM_METHOD_MEGATRON, tp, 1, dp, MEMSIM_PP_1F1B, 1,
                                  ckpts, &bad);
                    continue;
                }
                if (!(meth & MEMSIM_PLAN_PP))
                    continue;
                static const MemsimPipeSchedule ss[] = {MEMSIM_PP_1F1B, MEMSIM_PP_INTERLEAVED,
                                                        MEMSIM_PP_GPIPE};
                for (gsize s = 0; s < G_N_ELEMENTS(ss); s++) {
                    if (!(scheds & (1u << ss[s])))
                        continue;
                    int v = ss[s] == MEMSIM_PP_INTERLEAVED ? 2 : 1;
                    if (mg ? !megatron_layout_ok(sw, tp, pp, v) : m->L % ((int64_t)pp * v))
                        continue;
                    add_group(sw, out, MEMSIM_METHOD_MEGATRON, tp, pp, dp, ss[s], v, ckpts, &bad);
                }
            }
        }
    }
    sw->n_groups = (int)out->len;
    sw->groups = (Group *)g_array_free(out, FALSE);
    GArray *fams = g_array_new(FALSE, TRUE, sizeof(Degrees));
    for (int i = 0; i < sw->n_groups; i++) {
        Group *g = &sw->groups[i];
        Degrees *last = fams->len ? &g_array_index(fams, Degrees, fams->len - 1) : NULL;
        const Group *h = last ? &sw->groups[last->first] : NULL;
        if (!h || h->method != g->method || h->tp != g->tp || h->pp != g->pp || h->dp != g->dp) {
            Degrees f = {i, 0, 0, 0, FALSE, FALSE, -1, FALSE};
            g_array_append_val(fams, f);
            last = &g_array_index(fams, Degrees, fams->len - 1);
        }
        last->n++;
        g->fam = (int)fams->len - 1;
    }
    sw->n_fams = (int)fams->len;
    sw->fams = (Degrees *)g_array_free(fams, FALSE);
    if (sw->n_groups == 0) {
        if (bad && o->global_batch)
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "global-batch: %" G_GINT64_FORMAT " sequences do not divide among the "
                        "data-parallel replicas of any configuration (%d GPUs%s)",
                        o->global_batch, gpus,
                        gpus > 1 && sw->base.finetune != MEMSIM_FT_FULL
                            ? ": LoRA/QLoRA replicas need a multiple of the GPU count"
                            : ": data-parallel methods need a multiple of the GPU count, "
                              "Megatron a multiple of gpus / (tp pp)");
        else
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "methods: no configuration of the chosen methods splits %s over %d GPUs "
                        "(tensor parallelism must divide the heads and MLP width, pipelines "
                        "the layers)",
                        memsim_model_name(m), gpus);
        return FALSE;
    }
    return TRUE;
}

/* ---- the search ---- */

/* The K-th best lower bound of a configuration's row so far (each configuration's row is at
 * least as fast as the fastest b known to fit it): rows below it cannot be in the top K. */
static double threshold(Sweep *sw)
{
    if (sw->K == G_MAXINT)
        return -1.0;
    g_mutex_lock(&sw->lock);
    double *best = g_newa(double, sw->K);
    int n = 0;
    for (int i = 0; i < sw->n_fams; i++) {
        double v = sw->known[i];
        if (v <= 0)
            continue;
        if (n < sw->K)
            n++;
        else if (v <= best[n - 1])
            continue;
        int k = n - 1;
        while (k > 0 && best[k - 1] < v) {
            best[k] = best[k - 1];
            k--;
        }
        best[k] = v;
    }
    double T = n >= sw->K ? best[sw->K - 1] : -1.0;
    g_mutex_unlock(&sw->lock);
    return T;
}

static void know(Sweep *sw, const Group *g, double tps)
{
    g_mutex_lock(&sw->lock);
    if (tps > sw->known[g->fam])
        sw->known[g->fam] = tps;
    g_mutex_unlock(&sw->lock);
}

static double known_of(Sweep *sw, const Degrees *f)
{
    g_mutex_lock(&sw->lock);
    double v = sw->known[f - sw->fams];
    g_mutex_unlock(&sw->lock);
    return v;
}

static void count(Sweep *sw, guint *counter)
{
    g_mutex_lock(&sw->lock);
    (*counter)++;
    g_mutex_unlock(&sw->lock);
}

/* Whether the cost model is known to overestimate a Megatron step of this sweep (a simulated
 * step came out below it): its guesses are then no bound, and only the sound ones (the
 * chain bound, the floor, a sibling's host time) are kept. */
static gboolean model_unsound(const Sweep *sw, const Group *g)
{
    return g->method == MEMSIM_METHOD_MEGATRON && g_atomic_int_get(&sw->model_over);
}

/* Candidate j's guess again (not simulated): the largest of the cost model (while it is
 * sound), a sibling's host time and the chain bound; none known: no bound at all. */
static void cost_refresh(const Sweep *sw, Group *g, int j)
{
    CostResult *c = &g->cost[j];
    if (!c->simulated) {
        c->step_s = MAX(MAX(model_unsound(sw, g) ? 0.0 : c->model_step_s, c->host_s), c->chain_s);
        c->tokens_per_s = c->step_s > 0 ? c->tokens / c->step_s : INFINITY;
    }
    g->best_tps = 0;
    for (int k = 0; k < g->nb; k++)
        g->best_tps = MAX(g->best_tps, g->cost[k].tokens_per_s);
}

/* Raises candidate j's guess to the chain bound of its stage programs (traces/plan/bound.c:
 * a lower bound of the simulated step, as the guess must stay), once. */
static void tighten(Sweep *sw, Group *g, int j)
{
    CostResult *c = &g->cost[j];
    if (c->chained || c->simulated || g->method != MEMSIM_METHOD_MEGATRON)
        return;
    c->chained = TRUE;
    /* a short run costs about what its micro-batches of the run cost: worth it for a run
     * several times as long */
    const int m0 = plan_short_micro(g, j, FALSE);
    if (!m0 || g->n_micro[j] < SHORT_RATIO * m0)
        return;
    c->chain_s = plan_step_bound(sw, g, j);
    count(sw, &sw->n_bounded);
    cost_refresh(sw, g, j);
}

/* Whether g's floor is still to be taken (floor_member): a Megatron member of a sweep with a
 * fixed global batch, not floored yet. */
static gboolean floor_pending(const Sweep *sw, const Group *g)
{
    return !g->floored && sw->opt.global_batch && g->method == MEMSIM_METHOD_MEGATRON;
}

/* With a fixed global batch: every candidate whose b divides the largest raised to the floor
 * of the largest (plan_step_floor), once; one short run bounds them all. */
static void floor_member(Sweep *sw, Group *g)
{
    if (!floor_pending(sw, g) || !g->nb)
        return;
    g->floored = TRUE;
    const int J = g->nb - 1;
    double f = plan_step_floor(sw, g, J);
    count(sw, &sw->n_bounded);
    for (int j = 0; j < g->nb; j++) {
        CostResult *c = &g->cost[j];
        if (g->bs[J] % g->bs[j] || c->simulated || f <= c->chain_s)
            continue;
        c->chain_s = f;
        cost_refresh(sw, g, j);
    }
}

/* Whether g's guess at j is final: simulated, or raised to its chain bound (or there is none
 * for its method). */
static gboolean settled(const Group *g, int j)
{
    return g->cost[j].simulated || g->cost[j].chained || g->method != MEMSIM_METHOD_MEGATRON;
}

/* What g's candidates [0, hi) could do, as far as `cut` needs: a settled guess of at least
 * `cut` (not always the fastest: enough to know the member can reach it), or the fastest
 * guess when it is below `cut` or settled. Guesses are raised (the member's floor first, then
 * candidate by candidate) fastest first until one of those holds. */
static double settled_best(Sweep *sw, Group *g, int hi, double cut)
{
    for (;;) {
        int best = -1;
        for (int j = 0; j < hi; j++)
            if (best < 0 || g->cost[j].tokens_per_s > g->cost[best].tokens_per_s)
                best = j;
        if (best < 0)
            return 0;
        const double top = g->cost[best].tokens_per_s;
        if (settled(g, best) || top < cut)
            return top;
        for (int j = 0; j < hi; j++)
            if (settled(g, j) && g->cost[j].tokens_per_s >= cut)
                return g->cost[j].tokens_per_s;
        if (floor_pending(sw, g))
            floor_member(sw, g); /* one run for many candidates */
        else
            tighten(sw, g, best);
    }
}

/* Whether the exact policy (sim/alloc/exact.c: the live tensors, each rounded up to 512
 * bytes) fits every rank of `u`, a whole replay without a memory limit, with NCCL's bytes
 * kept off the capacity as the plan judges it (replay_as with `reserve`): its peak is the
 * ranks' rounded_peak, whatever policy `u` replayed. */
static gboolean rounded_fits(const Sweep *sw, const MemsimReport *u, memsim_size_t nccl)
{
    if (sw->ctx + nccl >= sw->gpu_mem)
        return FALSE;
    const memsim_size_t cap = sw->gpu_mem - sw->ctx - nccl;
    for (guint i = 0; i < u->n_ranks; i++)
        if (u->ranks[i].rounded_peak > cap)
            return FALSE;
    return TRUE;
}

/* Whether the requested bytes of some rank (plus its context and NCCL) exceed the memory:
 * they bound from below what any allocator setting could reach. */
static gboolean needs_more_than(const MemsimReport *rep, memsim_size_t gpu_mem)
{
    for (guint i = 0; i < rep->n_ranks; i++) {
        const MemsimRankReport *r = &rep->ranks[i];
        memsim_size_t over = r->device_total - (memsim_size_t)r->stats.reserved.peak;
        if ((memsim_size_t)r->stats.requested.peak + over > gpu_mem)
            return TRUE;
    }
    return FALSE;
}

/* Generates the trace of member g at micro-batch index j and replays it as memsim estimate
 * would: through torch with the default settings and, when that does not fit, through the
 * exact policy (a lower bound of torch's peak under any setting) before expandable_segments.
 * The same run without a memory limit is replayed first: below the capacity it is the
 * limited run as well; above, it measures the miss, and its requested bytes bound every
 * setting, so that a run they do not fit is settled without the limited replays (the one
 * that runs out of memory simulates every micro-batch: the steady state's skipping stops
 * where an allocation fails). With `need`, a miss is measured in any case. */
static void probe(Sweep *sw, Group *g, int j, gboolean need)
{
    Probe *p = &g->probes[j];
    if (p->done && (!need || p->fits || p->measured || p->failed))
        return;
    MemsimRun r;
    plan_candidate_run(sw, g, j, &r);
    const int m0 = plan_short_micro(g, j, TRUE);
    if (!p->done && !need && !sw->opt.exhaustive && !sw->offload && m0 &&
        g->n_micro[j] >= 2 * m0 && /* (for its memory: the run's generation saved) */
        plan_short_run_over(sw, g, j,
                            (int64_t)sw->gpu_mem -
                                (int64_t)(sw->ctx + memsim_estimate_nccl_bytes(
                                                        &r, sw->opt.nccl_bytes)))) {
        /* its short run already asks for more than the device leaves it: so does the run
         * (a miss shown is measured later, probed with `need`) */
        p->done = TRUE;
        count(sw, &sw->n_pruned_exact);
        count(sw, &sw->n_short_over);
        return;
    }
    GError *e = NULL;
    MemsimTrace *t = memsim_generate(sw->model, &r, &e);
    count(sw, &sw->n_generated);
    if (!t) {
        p->done = p->failed = TRUE;
        p->error = g_strdup(e->message);
        g_error_free(e);
        return;
    }
    if (sw->offload && !sw->ds_offload) {
        /* no memory limit: the whole peak, minus the state that would live on the host */
        MemsimReport *rep = replay(sw, t, &r, NULL, NULL, 0, 0);
        probe_take(p, rep, TRUE);
        p->done = p->measured = TRUE;
        p->fits = p->peak <= sw->gpu_mem;
        memsim_report_free(rep);
        memsim_trace_free(t);
        return;
    }
    MemsimReport *rep = NULL;
    const memsim_size_t nccl = memsim_estimate_nccl_bytes(&r, sw->opt.nccl_bytes);
    /* whether the exact policy fits, known from the run without a memory limit */
    gboolean exact_known = FALSE, exact_fits = TRUE;
    if (!p->done && !sw->opt.exhaustive) {
        /* a miss that need not be measured stops where its requested bytes show it (it is
         * measured later if it is shown: probe with `need`) */
        MemsimReport *u = need ? replay(sw, t, &r, NULL, NULL, 0, 0)
                               : replay_unless_over(sw, t, &r);
        if (!u) {
            p->done = TRUE;
            count(sw, &sw->n_pruned_exact);
            memsim_trace_free(t);
            return;
        }
        gboolean below = TRUE;
        for (guint i = 0; i < u->n_ranks; i++)
            below &= (memsim_size_t)u->ranks[i].stats.reserved.peak <= sw->gpu_mem - sw->ctx;
        exact_known = TRUE;
        exact_fits = rounded_fits(sw, u, nccl);
        if (below) {
            memsim_report_set_device(u, sw->gpu_mem, u->context_bytes);
            rep = u;
        } else {
            probe_take(p, u, FALSE);
            p->measured = TRUE;
            /* (where even the exact policy does not fit, no setting does: torch's reserved
             * bytes are never below the live ones rounded as it rounds them) */
            if (needs_more_than(u, sw->gpu_mem) || !exact_fits) {
                p->done = TRUE;
                count(sw, &sw->n_pruned_exact);
            }
            memsim_report_free(u);
        }
    }
    if (!p->done) {
        p->done = TRUE;
        /* (measured: what it takes without a limit is known, only whether it fits is asked) */
        if (!rep)
            rep = p->measured ? replay_if_fits(sw, t, &r, NULL, NULL, 0)
                              : replay(sw, t, &r, NULL, NULL, sw->gpu_mem, 0);
        if (report_fits(rep)) {
            p->fits = p->measured = TRUE;
            probe_take(p, rep, FALSE);
            if (sw->opt.exhaustive && !sw->opt.no_expandable) /* every candidate, evaluated */
                memsim_report_free(
                    replay(sw, t, &r, NULL, "expandable_segments:True", sw->gpu_mem, 0));
        } else {
            gboolean try_exp = !sw->opt.no_expandable;
            if (try_exp && !sw->opt.exhaustive) {
                gboolean hopeless = sw->ctx + nccl >= sw->gpu_mem;
                if (!hopeless && exact_known) {
                    hopeless = !exact_fits;
                } else if (!hopeless) {
                    MemsimReport *ex = replay_if_fits(sw, t, &r, "exact", NULL, nccl);
                    hopeless = !report_fits(ex);
                    memsim_report_free(ex);
                }
                if (hopeless) {
                    try_exp = FALSE;
                    count(sw, &sw->n_pruned_exact);
                }
            }
            if (try_exp) {
                MemsimReport *x =
                    replay_if_fits(sw, t, &r, NULL, "expandable_segments:True", 0);
                if (report_fits(x)) {
                    p->fits = p->expandable = p->measured = TRUE;
                    probe_take(p, x, FALSE);
                }
                memsim_report_free(x);
            }
            if (!p->fits && !p->measured)
                probe_take(p, rep, FALSE); /* up to where it ran out */
        }
    }
    memsim_report_free(rep);
    if (g->method == MEMSIM_METHOD_MEGATRON && p->step_s > 0 &&
        g->cost[j].model_step_s > p->step_s && !g_atomic_int_get(&sw->model_over)) {
        /* the cost model guessed this step slower than its simulation: no bound here */
        g_atomic_int_set(&sw->model_over, TRUE);
        cost_refresh(sw, g, j); /* (every family takes it up when it next decides) */
    }
    if (p->fits && p->step_s > 0) {
        /* one time model: a configuration that was simulated takes its step time from the
         * simulation (what `memsim estimate` prints for its last step); the cost model
         * (traces/plan/cost.c) only orders the search among those not simulated yet */
        CostResult *c = &g->cost[j];
        c->step_s = p->step_s;
        c->tokens_per_s = c->tokens / c->step_s;
        c->simulated = TRUE;
        /* The cost model leaves out the host's dispatch of every op, and a step cannot end
         * before its host has issued its ops. The configuration's other micro-batch sizes
         * run the same ops per micro-batch (shapes change, not the graph): with m' micro-
         * batches instead of m their host time is at least this one's × min(1, m'/m), so
         * their cost-model step is raised to that bound. Both stay below what their
         * simulation can give (the cost model counts the FLOPs at the peak's efficiency,
         * without waves, launch floors or latency), so the search still only skips what
         * cannot beat what it found. */
        for (int k = 0; k < g->nb; k++) {
            CostResult *ck = &g->cost[k];
            if (ck->simulated)
                continue;
            ck->host_s = p->host_s * MIN(1.0, (double)g->n_micro[k] / g->n_micro[j]);
            cost_refresh(sw, g, k);
        }
    }
    if (need && !p->fits && !p->measured) {
        /* how much it needs: the same run without a memory limit */
        MemsimReport *u = replay(sw, t, &r, NULL, NULL, 0, 0);
        probe_take(p, u, FALSE);
        p->measured = TRUE;
        memsim_report_free(u);
    }
    memsim_trace_free(t);
}

static int ckpt_rank(MemsimCheckpointing c)
{
    return c == MEMSIM_CKPT_FULL ? 0 : c == MEMSIM_CKPT_SELECTIVE ? 1 : 2;
}

/* x's peak is at most y's (same family): less checkpointing or a schedule holding more
 * micro-batches only add memory. */
static gboolean mem_leq(const Group *x, const Group *y)
{
    return ckpt_rank(x->ckpt) <= ckpt_rank(y->ckpt) && x->schedule == y->schedule;
}

/* Tells the family what probing b of g showed. */
static void learn(Sweep *sw, Group *g, int64_t b, gboolean fits)
{
    Degrees *f = &sw->fams[g->fam];
    for (int i = f->first; i < f->first + f->n; i++) {
        Group *y = &sw->groups[i];
        if (fits && mem_leq(y, g) && b > y->fit_max)
            y->fit_max = b;
        if (!fits && mem_leq(g, y) && b < y->fail_min)
            y->fail_min = b;
    }
}

/* The index range the family's knowledge leaves open: [0, lo] fit, [hi, nb) do not. */
static void bounds(const Group *g, int *lo, int *hi)
{
    *lo = -1;
    *hi = g->nb;
    for (int j = 0; j < g->nb; j++) {
        if (g->bs[j] <= g->fit_max)
            *lo = j;
        if (g->bs[j] >= g->fail_min && *hi == g->nb)
            *hi = j;
    }
    if (*hi <= *lo) /* the peak did not grow as assumed: trust the larger fit */
        *hi = *lo + 1;
}

static int best_known(const Group *g, int lo, gboolean need_fit);

/* Each member's row will be at least as fast as its choice among the b known to fit. */
static void know_family(Sweep *sw, const Group *g)
{
    const Degrees *f = &sw->fams[g->fam];
    for (int i = f->first; i < f->first + f->n; i++) {
        const Group *y = &sw->groups[i];
        int lo, hi;
        bounds(y, &lo, &hi);
        /* the simulated ones: whichever b the member ends with, no simulated b that fits
         * beats it by more than BATCH_GAIN (best_known's rule) */
        double v = 0;
        for (int j = 0; j <= lo; j++)
            if (y->cost[j].simulated && y->probes[j].fits)
                v = MAX(v, y->cost[j].tokens_per_s);
        if (v > 0)
            know(sw, y, v / BATCH_GAIN);
    }
}

static void probe_learn(Sweep *sw, Group *g, int j)
{
    probe(sw, g, j, FALSE);
    if (g->probes[j].failed)
        return;
    learn(sw, g, g->bs[j], g->probes[j].fits);
    if (g->probes[j].fits)
        know_family(sw, g);
}

/* The chosen b among indices [0, lo] (those simulated to fit, when need_fit): going up from
 * the smallest, a larger b replaces the choice only when the cost model makes it more than
 * BATCH_GAIN faster — finer differences are below what the model can tell, and the smaller
 * micro-batch keeps more headroom. */
static int best_known(const Group *g, int lo, gboolean need_fit)
{
    int best = -1;
    for (int j = 0; j <= lo; j++) {
        if (need_fit && (!g->probes[j].done || !g->probes[j].fits))
            continue;
        if (best < 0 || g->cost[j].tokens_per_s > BATCH_GAIN * g->cost[best].tokens_per_s)
            best = j;
    }
    return best;
}

/* best_known among [0, lo] (assumed to fit) as the simulation would have it: going up,
 * a b not simulated yet whose guess (a bound: the simulation is never faster) could replace
 * the choice is simulated first, and the scan starts again. */
static int best_resolved(Sweep *sw, Group *g, int lo)
{
    for (;;) {
        int best = -1, need = -1;
        for (int j = 0; j <= lo && j < g->nb; j++) {
            const Probe *p = &g->probes[j];
            if (p->done && !p->fits)
                continue;
            double v = g->cost[j].tokens_per_s;
            if (best >= 0 && !(v > BATCH_GAIN * g->cost[best].tokens_per_s))
                continue;
            if (!p->done && best >= 0 && !settled(g, j)) {
                /* whether it could replace the choice, with its guess settled */
                tighten(sw, g, j);
                if (!(g->cost[j].tokens_per_s > BATCH_GAIN * g->cost[best].tokens_per_s))
                    continue;
            }
            if (!p->done) {
                need = j;
                break;
            }
            best = j;
        }
        if (need < 0)
            return best;
        probe_learn(sw, g, need);
    }
}

static void search_exhaustive(Sweep *sw, Group *g)
{
    for (int j = 0; j < g->nb; j++)
        probe(sw, g, j, FALSE);
    int best = best_known(g, g->nb - 1, TRUE);
    if (best >= 0)
        g->row = best;
    else
        g->miss = TRUE;
}

/* The best a member could still do: the fastest b not known to fail (settled down to
 * `cut`). */
static double upside(Sweep *sw, Group *g, double cut)
{
    int lo, hi;
    bounds(g, &lo, &hi);
    return settled_best(sw, g, hi, cut);
}

/* The best b of a member: aim at the smallest b that matters (one that would replace the
 * choice among the b known to fit, and beat `cutoff`: the top rows or a faster member),
 * galloping up or bisecting down; stop when none is left. */
static void refine(Sweep *sw, Group *g, double cutoff)
{
    int lo, hi;
    for (;;) {
        bounds(g, &lo, &hi);
        int bk = lo >= 0 ? best_resolved(sw, g, lo) : -1;
        bounds(g, &lo, &hi);
        double have = bk >= 0 ? g->cost[bk].tokens_per_s : 0;
        double cut = MAX(cutoff, threshold(sw));
        int k0 = -1;
        for (int k = lo + 1; k < hi && k0 < 0; k++) {
            if (!(g->cost[k].tokens_per_s > BATCH_GAIN * have && g->cost[k].tokens_per_s >= cut))
                continue;
            tighten(sw, g, k);
            if (g->cost[k].tokens_per_s > BATCH_GAIN * have && g->cost[k].tokens_per_s >= cut)
                k0 = k;
        }
        if (k0 < 0)
            break; /* nothing unresolved would replace the choice and matter */
        int j = hi == g->nb ? (lo <= 0 ? lo + 1 : 2 * lo) : (lo + hi) / 2;
        if (j < k0)
            j = k0;
        if (j >= hi)
            j = hi - 1;
        probe_learn(sw, g, j);
        if (j == 0 && !g->probes[0].fits) {
            g->miss = TRUE;
            return;
        }
    }
    /* every b up to lo fits by assumption; the choice among them is simulated */
    int row = lo >= 0 ? best_resolved(sw, g, lo) : -1;
    if (lo < 0 || (row >= 0 && g->cost[row].tokens_per_s < MAX(cutoff, threshold(sw)))) {
        g->pruned_cost = TRUE; /* it cannot matter */
        return;
    }
    if (row >= 0 && !g->probes[row].fits) /* the peak did not grow with b here: keep what was seen */
        row = best_known(g, lo, TRUE);
    if (row < 0) {
        g->miss = TRUE;
        return;
    }
    g->row = row;
    know(sw, g, g->cost[row].tokens_per_s);
}

static gboolean open_member(const Group *g)
{
    return g->row < 0 && !g->miss && !g->pruned_cost;
}

/* A family's row: its members taken by what they could still reach, fastest first; the
 * smallest b of a member is settled by bisecting its chain of checkpointing modes (full ≤
 * selective ≤ none: a probe in the middle tells about one end); a member that fits is
 * refined; members that cannot beat the family's best known row, or the top rows, stop. */
static void family_sound(Sweep *sw, Degrees *f);

static void family_search(Sweep *sw, Degrees *f)
{
    for (;;) {
        family_sound(sw, f);
        double T = threshold(sw), have = known_of(sw, f);
        Group *m = NULL;
        double mu = 0;
        for (int i = f->first; i < f->first + f->n; i++) {
            Group *g = &sw->groups[i];
            if (!open_member(g))
                continue;
            if (g->fail_min <= g->bs[0]) {
                g->miss = TRUE; /* a member needing less memory did not fit */
                continue;
            }
            double u = upside(sw, g, MAX(T, have));
            if (u < T || u < have) {
                g->pruned_cost = TRUE; /* slower than what is known to be possible */
                continue;
            }
            m = g;
        }
        if (!m)
            break;
        /* the fastest member first, by the guesses: each member that leads raised to its
         * floor first (one short run for all its b; the floors of the members order them
         * well enough, the search settles what decides) */
        for (;;) {
            int mj = -1;
            m = NULL;
            for (int i = f->first; i < f->first + f->n; i++) {
                Group *g = &sw->groups[i];
                if (!open_member(g) || g->fail_min <= g->bs[0])
                    continue;
                int lo, hi;
                bounds(g, &lo, &hi);
                for (int j = 0; j < hi; j++)
                    if (!m || g->cost[j].tokens_per_s > mu) {
                        m = g;
                        mj = j;
                        mu = g->cost[j].tokens_per_s;
                    }
            }
            if (!m || settled(m, mj) || !floor_pending(sw, m))
                break;
            floor_member(sw, m);
        }
        if (!m)
            break;
        if (m->fail_min <= m->bs[0]) {
            m->miss = TRUE;
            continue;
        }
        if (m->fit_max >= m->bs[0]) {
            refine(sw, m, have); /* its smallest b fits: aim at the b that matters */
            continue;
        }
        /* the smallest b of m that matters, unsettled: probe the middle of m's chain of
         * checkpointing modes at that b (or the lower of two), whose fit tells about the
         * lighter members and whose miss about the heavier */
        int lo, hi, j0 = 0;
        bounds(m, &lo, &hi);
        while (j0 < hi - 1) {
            if (m->cost[j0].tokens_per_s >= MAX(T, have))
                tighten(sw, m, j0);
            if (m->cost[j0].tokens_per_s >= MAX(T, have))
                break;
            j0++;
        }
        int64_t b = m->bs[j0];
        Group *chain[3];
        int at[3], n = 0;
        for (int rank = 0; rank < 3; rank++)
            for (int i = f->first; i < f->first + f->n; i++) {
                Group *g = &sw->groups[i];
                if (g->schedule != m->schedule || ckpt_rank(g->ckpt) != rank || !open_member(g) ||
                    g->fit_max >= b || g->fail_min <= b)
                    continue;
                for (int j = 0; j < g->nb; j++)
                    if (g->bs[j] == b) {
                        chain[n] = g;
                        at[n++] = j;
                    }
            }
        Group *g = chain[(n - 1) / 2];
        int j = at[(n - 1) / 2];
        probe(sw, g, j, FALSE); /* a miss shown is measured at the end (collect) */
        if (!g->probes[j].failed)
            learn(sw, g, b, g->probes[j].fits);
        if (g->probes[j].fits)
            know_family(sw, g);
        if (g->probes[j].failed)
            g->miss = TRUE; /* the generator refused it: no memory to learn from */
    }
}

/* A family's guesses redone without the cost model, once it is known to overestimate. */
static void family_sound(Sweep *sw, Degrees *f)
{
    if (f->sound || !g_atomic_int_get(&sw->model_over))
        return;
    f->sound = TRUE;
    f->best_tps = 0;
    for (int i = f->first; i < f->first + f->n; i++) {
        Group *g = &sw->groups[i];
        for (int j = 0; j < g->nb; j++)
            cost_refresh(sw, g, j);
        f->best_tps = MAX(f->best_tps, g->best_tps);
    }
}

/* The best a family's members could do, settled (settled_best) down to `cut`. */
static double family_best(Sweep *sw, const Degrees *f, double cut)
{
    double best = 0;
    for (int i = f->first; i < f->first + f->n && best < MAX(cut, 0); i++) {
        Group *g = &sw->groups[i];
        best = MAX(best, settled_best(sw, g, g->nb, cut));
    }
    return MAX(best, cut < 0 ? f->best_tps : 0);
}

static void worker(gpointer data, gpointer user)
{
    Sweep *sw = user;
    Degrees *f = data;
    if (sw->opt.exhaustive) {
        for (int i = f->first; i < f->first + f->n; i++)
            search_exhaustive(sw, &sw->groups[i]);
    } else if (f->pruned_bound) {
        for (int i = f->first; i < f->first + f->n; i++)
            sw->groups[i].miss = TRUE;
    } else if (family_sound(sw, f), family_best(sw, f, threshold(sw)) < threshold(sw)) {
        /* nothing of it can reach the top rows (whatever is probed later only raises the
         * threshold, so what is skipped here never shows) */
        f->pruned_cost = TRUE;
        for (int i = f->first; i < f->first + f->n; i++)
            sw->groups[i].pruned_cost = TRUE;
    } else {
        family_search(sw, f);
    }
    /* the family's row: its fastest member row (ties: the first enumerated) */
    f->row = -1;
    for (int i = f->first; i < f->first + f->n; i++) {
        const Group *g = &sw->groups[i];
        if (g->row >= 0 &&
            (f->row < 0 || g->cost[g->row].tokens_per_s >
                               sw->groups[f->row].cost[sw->groups[f->row].row].tokens_per_s))
            f->row = i;
    }
    g_mutex_lock(&sw->lock);
    sw->done++;
    if (sw->opt.progress)
        sw->opt.progress(sw->done, sw->total, sw->opt.progress_user);
    g_mutex_unlock(&sw->lock);
}

static int by_speed(gconstpointer a, gconstpointer b)
{
    const Degrees *x = *(Degrees *const *)a, *y = *(Degrees *const *)b;
    if (x->likely != y->likely)
        return x->likely > y->likely ? -1 : 1;
    if (x->best_tps != y->best_tps)
        return x->best_tps > y->best_tps ? -1 : 1;
    return x->first - y->first;
}

/* Runs fn on each item over the thread pool (in order on one thread). */
static void run_pool(Sweep *sw, GPtrArray *items, GFunc fn)
{
    int threads = sw->opt.threads > 0 ? sw->opt.threads : (int)g_get_num_processors();
    if (threads > (int)items->len)
        threads = items->len ? (int)items->len : 1;
    if (threads <= 1) {
        for (guint i = 0; i < items->len; i++)
            fn(items->pdata[i], sw);
        return;
    }
    GThreadPool *pool = g_thread_pool_new(fn, sw, threads, TRUE, NULL);
    for (guint i = 0; i < items->len; i++)
        g_thread_pool_push(pool, items->pdata[i], NULL);
    g_thread_pool_free(pool, FALSE, TRUE);
}

/* A shown miss measured: its smallest b without a memory limit. */
static void measure_miss(gpointer data, gpointer user)
{
    probe(user, data, 0, TRUE);
}

/* Longer replays first: a pipeline's stage runs each micro-batch's model chunks, the
 * interleaved schedule's repetitions each for its memory (the order of work only). */
static double work_of(const Group *g)
{
    if (!g->nb)
        return 0;
    double w = (double)g->n_micro[0] * (g->schedule == MEMSIM_PP_INTERLEAVED ? 4.0 * g->v : 1.0);
    return g->method == MEMSIM_METHOD_MEGATRON ? w * g->pp / MAX(g->tp, 1) : w;
}

static int by_work(gconstpointer a, gconstpointer b)
{
    const Group *x = *(Group *const *)a, *y = *(Group *const *)b;
    double wx = work_of(x), wy = work_of(y);
    if (wx != wy)
        return wx > wy ? -1 : 1;
    return x->idx - y->idx;
}

/* A miss's guess raised to its chain bound (a short run each: over the pool). */
static void tighten_miss(gpointer data, gpointer user)
{
    tighten(user, data, 0);
}

/* The rows (traces/plan/rows.c), the misses shown among them simulated first. */
static void collect(Sweep *sw, MemsimPlanRow **rows, guint *n_rows, MemsimPlanRow **misses,
                    guint *n_misses)
{
    /* the misses' guesses settled, whichever way the search went (shown_misses compares
     * them with the recommendation) */
    for (int k = 0; k < sw->n_fams; k++)
        family_sound(sw, &sw->fams[k]);
    GPtrArray *loose = g_ptr_array_new();
    for (int i = 0; i < sw->n_groups; i++)
        if (sw->groups[i].miss && sw->groups[i].nb)
            g_ptr_array_add(loose, &sw->groups[i]);
    run_pool(sw, loose, tighten_miss);
    g_ptr_array_unref(loose);
    /* measured, a miss shows its simulated speed, which may leave room for another: until
     * every miss shown is measured */
    for (;;) {
        GPtrArray *todo = plan_misses_to_measure(sw);
        const guint n = todo->len;
        g_ptr_array_sort(todo, by_work); /* the longest first: the threads end together */
        run_pool(sw, todo, measure_miss);
        g_ptr_array_unref(todo);
        if (!n)
            break;
    }
    plan_collect(sw, rows, n_rows, misses, n_misses);
}

/* A family's likely speed, for the order of the search only: its fastest member among those
 * that need the least memory (the most checkpointing swept), at the smallest b, the guesses
 * raised to their chain bounds fastest first until the fastest is settled. Families whose
 * lightest members are fast come first: they are the likeliest to give rows early, and their
 * rows raise the threshold that prunes the others. */
static void settle_likely(gpointer data, gpointer user)
{
    Sweep *sw = user;
    Degrees *f = data;
    if (f->pruned_bound)
        return;
    int lightest = 3;
    for (int i = f->first; i < f->first + f->n; i++)
        if (sw->groups[i].nb)
            lightest = MIN(lightest, ckpt_rank(sw->groups[i].ckpt));
    for (;;) {
        Group *best = NULL;
        for (int i = f->first; i < f->first + f->n; i++) {
            Group *g = &sw->groups[i];
            if (g->nb && ckpt_rank(g->ckpt) == lightest &&
                (!best || g->cost[0].tokens_per_s > best->cost[0].tokens_per_s))
                best = g;
        }
        if (!best || settled(best, 0)) {
            f->likely = best ? best->cost[0].tokens_per_s : 0;
            return;
        }
        tighten(sw, best, 0);
    }
}

/* Runs one phase (with or without offload) over every configuration. */
static void run_phase(Sweep *sw)
{
    for (int i = 0; i < sw->n_groups; i++) {
        Group *g = &sw->groups[i];
        for (int j = 0; j < g->nb; j++)
            probe_clear(&g->probes[j]);
        g->row = -1;
        g->miss = g->pruned_bound = g->pruned_cost = FALSE;
        g->fit_max = 0;
        g->fail_min = G_MAXINT64;
        g->floored = FALSE;
        fill_costs(sw, g);
        MemsimRun r;
        plan_candidate_run(sw, g, 0, &r);
        const MemsimDeepspeed *ds = sw->base.deepspeed;
        gboolean on_host = sw->offload || (ds && ds->z.offload_optimizer);
        g->bound = (ds && ds->z.offload_param ? 0 : state_bound(sw, g, !on_host)) + sw->ctx +
                   memsim_estimate_nccl_bytes(&r, sw->opt.nccl_bytes);
    }
    GPtrArray *order = g_ptr_array_new();
    for (int k = 0; k < sw->n_fams; k++) {
        Degrees *f = &sw->fams[k];
        f->best_tps = 0;
        f->pruned_bound = f->pruned_cost = FALSE;
        f->sound = FALSE;
        f->row = -1;
        sw->known[k] = 0;
        f->likely = 0;
        for (int i = f->first; i < f->first + f->n; i++) {
            Group *g = &sw->groups[i];
            if (g->nb && g->cost[0].tokens_per_s > f->likely &&
                guess_peak(sw, g) <= (double)sw->gpu_mem)
                f->likely = g->cost[0].tokens_per_s;
            if (g->best_tps > f->best_tps)
                f->best_tps = g->best_tps;
            if (!sw->opt.exhaustive && g->bound > sw->gpu_mem)
                f->pruned_bound = g->pruned_bound = TRUE;
        }
        if (f->pruned_bound)
            sw->n_pruned_bound += (guint)f->n;
        g_ptr_array_add(order, f);
    }
    sw->total = order->len;
    sw->done = 0;
    if (sw->opt.progress) /* the total, before the first layout is done */
        sw->opt.progress(0, sw->total, sw->opt.progress_user);
    if (!sw->opt.exhaustive)
        run_pool(sw, order, settle_likely);
    g_ptr_array_sort(order, by_speed);
    run_pool(sw, order, worker);
    g_ptr_array_unref(order);
    for (int i = 0; i < sw->n_groups; i++)
        if (sw->groups[i].pruned_cost)
            sw->n_pruned_cost++;
}

static void sweep_clear(Sweep *sw)
{
    for (int i = 0; i < sw->n_groups; i++) {
        Group *g = &sw->groups[i];
        for (int j = 0; j < g->nb; j++)
            probe_clear(&g->probes[j]);
        g_free(g->probes);
        g_free(g->bs);
        g_free(g->n_micro);
        g_free(g->cost);
    }
    g_free(sw->groups);
    g_free(sw->fams);
    g_free(sw->known);
    g_mutex_clear(&sw->lock);
}

/* One sweep at one memory size; fills the plan's rows and misses and adds statistics. */
static gboolean sweep_run(const MemsimModel *model, const MemsimPlanOptions *opt,
                          const MemsimGpu *gpu, memsim_size_t gpu_mem, double cfrac, double mfrac,
                          MemsimPlan *plan, MemsimPlanRow **rows, guint *n_rows,
                          MemsimPlanRow **misses, guint *n_misses, gboolean *offloaded,
                          GError **error)
{
    Sweep sw = {0};
    sw.model = model;
    sw.opt = *opt;
    sw.gpu = gpu;
    sw.gpu_name = gpu->name;
    sw.base = opt->run ? *opt->run : memsim_run_defaults();
    /* the time model's assumptions as the plan was given them: the simulated candidates
     * (and the commands that re-estimate them) take them as run settings */
    if (opt->efficiency > 0 && opt->efficiency != gpu->compute_efficiency)
        sw.base.compute_efficiency = opt->efficiency;
    if (opt->network_gbs > 0 && opt->network_gbs != gpu->network_gbs)
        sw.base.network_gbs = opt->network_gbs;
    if (opt->gpus_per_node > 0)
        sw.base.gpus_per_node = opt->gpus_per_node;
    if (sw.base.deepspeed && !sw.opt.global_batch) {
        /* its train_batch_size, or its micro-batch × accumulation × the GPUs */
        const MemsimDeepspeed *ds = sw.base.deepspeed;
        sw.opt.global_batch = ds->train_batch ? ds->train_batch
                              : ds->micro && ds->accum ? ds->micro * ds->accum * opt->gpus
                                                       : 0;
    }
    if (sw.base.megatron) {
        /* around a Megatron launch: its global batch and its recomputation, unless asked */
        if (!sw.opt.global_batch)
            sw.opt.global_batch = sw.base.megatron->o.global_batch;
        if (!sw.opt.checkpointing)
            sw.opt.checkpointing = 1u << sw.base.checkpointing;
    }
    sw.gpu_mem = gpu_mem;
    sw.ctx = opt->context_bytes;
    sw.compute_fraction = cfrac;
    sw.memory_fraction = mfrac;
    sw.K = opt->top > 0 ? opt->top : G_MAXINT;
    g_mutex_init(&sw.lock);
    if (!enumerate(&sw, error)) {
        sweep_clear(&sw);
        return FALSE;
    }
    sw.known = g_new0(double, sw.n_fams ? sw.n_fams : 1);
    for (int i = 0; i < sw.n_groups; i++)
        plan->n_candidates += (guint64)sw.groups[i].nb * (opt->no_expandable ? 1 : 2);
    plan->n_configs += (guint)sw.n_groups;
    run_phase(&sw);
    gboolean any = FALSE;
    for (int i = 0; i < sw.n_groups; i++)
        any |= sw.groups[i].row >= 0;
    *offloaded = FALSE;
    /* a DeepSpeed config offloads as it says: the last resort is its own offload_optimizer,
     * simulated (none when it already offloads, or when its optimizer cannot be offloaded) */
    const MemsimDeepspeed *bds = sw.base.deepspeed;
    if (bds && !bds->z.offload_optimizer)
        sw.ds_offload = ds_with_set(bds, "zero_optimization.offload_optimizer.device=cpu");
    if (!any && !opt->no_offload && sw.base.finetune == MEMSIM_FT_FULL &&
        (!bds || sw.ds_offload)) {
        /* the last resort: the optimizer state on the CPU */
        MemsimPlanRow *r0, *m0;
        guint nr0, nm0;
        collect(&sw, &r0, &nr0, &m0, &nm0); /* keep the misses of the real sweep */
        sw.offload = TRUE;
        run_phase(&sw);
        any = FALSE;
        for (int i = 0; i < sw.n_groups; i++)
            any |= sw.groups[i].row >= 0;
        if (any) {
            MemsimPlanRow *m1;
            guint nm1;
            collect(&sw, rows, n_rows, &m1, &nm1);
            for (guint i = 0; i < nm1; i++)
                plan_row_clear(&m1[i]);
            g_free(m1);
            *misses = m0;
            *n_misses = nm0;
            *offloaded = TRUE;
        } else {
            sw.offload = FALSE;
            *rows = r0;
            *n_rows = nr0;
            *misses = m0;
            *n_misses = nm0;
        }
        if (any) {
            for (guint i = 0; i < nr0; i++)
                plan_row_clear(&r0[i]);
            g_free(r0);
        }
    } else {
        collect(&sw, rows, n_rows, misses, n_misses);
    }
    plan->n_generated += sw.n_generated;
    plan->n_replays += sw.n_replays;
    plan->n_pruned_bound += sw.n_pruned_bound;
    plan->n_pruned_exact += sw.n_pruned_exact;
    plan->n_pruned_cost += sw.n_pruned_cost;
    plan->n_bounded += sw.n_bounded;
    plan->n_short_over += sw.n_short_over;
    sweep_clear(&sw);
    memsim_deepspeed_free(sw.ds_offload);
    return TRUE;
}

static char *describe_run(const MemsimModel *m, const MemsimRun *r)
{
    static const char *ft[] = {"full fine-tuning", "LoRA", "QLoRA"};
    GString *s = g_string_new(NULL);
    g_string_append_printf(s, "seq %" G_GINT64_FORMAT ", %s, %s, %s", r->seq,
                           setting_value_name(SETTING_PRECISION, (int)r->precision),
                           setting_value_name(SETTING_OPTIMIZER, (int)r->optimizer),
                           ft[r->finetune]);
    if (r->finetune != MEMSIM_FT_FULL)
        g_string_append_printf(s, " (rank %d)", r->lora_rank);
    g_string_append_printf(s, ", %d step(s) simulated, torch %s", r->steps,
                           r->torch_version ? r->torch_version : "2.8");
    if (r->megatron)
        g_string_append_printf(s, ", the Megatron-LM launch %s (its options kept, its layout "
                                  "swept)",
                               r->megatron->source);
    if (r->deepspeed)
        g_string_append_printf(s, ", the DeepSpeed config %s (its ZeRO stage and keys kept, "
                                  "the micro-batch swept)",
                               r->deepspeed->source);
    (void)m;
    return g_string_free(s, FALSE);
}

MemsimPlan *memsim_plan(const MemsimModel *model, const MemsimPlanOptions *opt_in, GError **error)
{
    MemsimPlanOptions opt = opt_in ? *opt_in : memsim_plan_options_defaults();
    gint64 t0 = g_get_monotonic_time();
    if (opt.gpus < 1) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "gpus: %d GPUs; a plan needs at least one", opt.gpus);
        return NULL;
    }
    const MemsimGpu *gpu = memsim_gpu_find(opt.gpu);
    if (!gpu) {
        g_autofree char *known = memsim_gpu_names();
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "gpu: unknown GPU '%s' (known: %s)", opt.gpu, known);
        return NULL;
    }
    if (opt.global_batch < 0 || opt.max_batch < 0 || opt.top < 0 || opt.misses < 0) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: must not be negative",
                    opt.global_batch < 0 ? "global-batch"
                    : opt.max_batch < 0  ? "max-batch"
                    : opt.top < 0        ? "top"
                                         : "misses");
        return NULL;
    }
    MemsimRun base = opt.run ? *opt.run : memsim_run_defaults();
    memsim_run_adapt(&base, model);
    if (!model_check_run(model, &base, error))
        return NULL;
    /* candidates on several GPUs run the distributed loop: what it does not model is refused
     * rather than planned as AdamW */
    if (opt.gpus > 1 && !base.inference && !setting_check_distributed_loop(&base, FALSE, error))
        return NULL;
    if (base.inference) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "inference: plan sweeps training configurations");
        return NULL;
    }
    bool learned = model->fam == FAM_GPT2 || model->fam == FAM_OPT || model->fam == FAM_GPTNEO;
    if (learned && base.seq > model->max_pos) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "seq: %" G_GINT64_FORMAT " tokens exceed the model's %" G_GINT64_FORMAT
                    " learned positions (max_position_embeddings)",
                    base.seq, model->max_pos);
        return NULL;
    }
    if (opt.mig && opt.gpus != 1) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "mig: MIG slices hold single-GPU jobs; use --gpus 1 (got %d)", opt.gpus);
        return NULL;
    }
    /* 0 = the default; anything else outside (0, 1] and (0, 1e6] (NaN included) is refused,
     * as memsim_plan_options_set refuses it */
    if (opt.efficiency != 0 && !(opt.efficiency > 0 && opt.efficiency <= 1)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "efficiency: %g is not a number in (0, 1]", opt.efficiency);
        return NULL;
    }
    if (opt.network_gbs != 0 && !(opt.network_gbs > 0 && opt.network_gbs <= 1e6)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "network-gbs: %g is not a number in (0, 1e+06]", opt.network_gbs);
        return NULL;
    }
    if (opt.efficiency <= 0)
        opt.efficiency = gpu->compute_efficiency;
    if (opt.network_gbs <= 0)
        opt.network_gbs = gpu->network_gbs;
    memsim_size_t gpu_mem = opt.gpu_mem ? opt.gpu_mem : gpu->memory;
    memsim_size_t capacity;
    if (!opt.mig && !memsim_device_capacity(gpu_mem, opt.context_bytes, &capacity, error))
        return NULL;
    MemsimPlan *plan = g_new0(MemsimPlan, 1);
    plan->model = g_strdup(memsim_model_name(model));
    plan->run = describe_run(model, &base);
    plan->gpu = g_strdup(gpu->name);
    {
        MemsimGpu tg = *gpu;
        tg.compute_efficiency = opt.efficiency;
        tg.network_gbs = opt.network_gbs;
        memsim_time_model_of(&tg, &plan->time_model);
    }
    plan->gpu_mem = gpu_mem;
    plan->gpus = opt.gpus;
    plan->gpus_per_node = opt.gpus_per_node > 0 ? opt.gpus_per_node : base.gpus_per_node;
    plan->global_batch = opt.global_batch ? opt.global_batch
                         : base.megatron      ? base.megatron->o.global_batch
                         : base.deepspeed && base.deepspeed->train_batch ? base.deepspeed->train_batch
                         : base.deepspeed && base.deepspeed->micro && base.deepspeed->accum
                             ? base.deepspeed->micro * base.deepspeed->accum * opt.gpus
                             : 0;
    plan->threads = opt.threads > 0 ? opt.threads : (int)g_get_num_processors();
    GPtrArray *notes = g_ptr_array_new_with_free_func(g_free);
    g_ptr_array_add(
        notes,
        g_strdup_printf(
            "step times are estimates, simulated as memsim estimate simulates them: per op the "
            "larger of its FLOPs over its GEMM waves at %.0f%% of the tensor-core peak and its "
            "memory traffic at %.0f%% of the HBM bandwidth, at least %g us a kernel, %g us of "
            "host dispatch per op, NCCL ring collectives (latency + bytes / bandwidth) on the "
            "GPU link within a node and %.0f GB/s per GPU between nodes, pipeline bubbles from "
            "the simulated schedule; a cost model (traces/plan/cost.c) only orders the search",
            opt.efficiency * 100, gpu->bandwidth_efficiency * 100, gpu->kernel_us,
            gpu->dispatch_us, opt.network_gbs));
    gboolean offloaded = FALSE;
    if (opt.mig) {
        GArray *mig = g_array_new(FALSE, TRUE, sizeof(MemsimPlanMig));
        for (const MemsimMigProfile *mp = memsim_mig_profiles(); mp->gpu; mp++) {
            if (strcmp(mp->gpu, gpu->name) != 0)
                continue;
            g_autofree char *slice_name = g_strdup_printf("%s:%s", mp->gpu, mp->name);
            const MemsimGpu *slice = memsim_gpu_find(slice_name);
            MemsimPlanMig e = {0};
            g_strlcpy(e.name, mp->name, sizeof e.name);
            e.memory = (memsim_size_t)mp->mem_mib << 20;
            e.sms = mp->sms;
            e.instances = mp->instances;
            MemsimPlanOptions o1 = opt;
            o1.top = 1;
            o1.misses = 64; /* every miss: the smallest need is the slice's */
            o1.no_offload = TRUE;
            MemsimPlanRow *rows = NULL, *misses = NULL;
            guint nr = 0, nm = 0;
            gboolean off = FALSE;
            /* the slice's own profile: its SMs and bandwidth (the cost model's fractions 1) */
            if (!sweep_run(model, &o1, slice, e.memory, 1.0, 1.0, plan, &rows, &nr, &misses,
                           &nm, &off, error)) {
                g_array_unref(mig);
                g_ptr_array_free(notes, TRUE);
                memsim_plan_free(plan);
                return NULL;
            }
            e.fits = nr > 0;
            if (nr > 0) {
                e.best = rows[0];
            } else if (nm > 0) {
                e.best = misses[0];
                misses[0] = (MemsimPlanRow){0};
            }
            for (guint k = 1; k < nr; k++)
                plan_row_clear(&rows[k]);
            for (guint k = 0; k < nm; k++)
                plan_row_clear(&misses[k]);
            g_free(rows);
            g_free(misses);
            g_array_append_val(mig, e);
        }
        if (mig->len == 0) {
            g_autofree char *names = NULL;
            GString *s = g_string_new(NULL);
            const char *last = "";
            for (const MemsimMigProfile *mp = memsim_mig_profiles(); mp->gpu; mp++)
                if (strcmp(mp->gpu, last) != 0) {
                    g_string_append_printf(s, "%s%s", s->len ? ", " : "", mp->gpu);
                    last = mp->gpu;
                }
            names = g_string_free(s, FALSE);
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "mig: %s has no MIG profiles here (MIG GPUs: %s)", gpu->name, names);
            g_array_unref(mig);
            g_ptr_array_free(notes, TRUE);
            memsim_plan_free(plan);
            return NULL;
        }
        plan->n_mig = mig->len;
        plan->mig = (MemsimPlanMig *)g_array_free(mig, FALSE);
        g_ptr_array_add(
            notes,
            g_strdup(
                "MIG: one job per slice; slice memory as nvidia-smi mig -lgip lists it, its SMs "
                "(GEMM waves) and peaks scaled by its SMs, memory bandwidth by its memory "
                "slices; the host's dispatch is each job's own"));
    } else {
        if (!sweep_run(model, &opt, gpu, gpu_mem, 1.0, 1.0, plan, &plan->rows, &plan->n_rows,
                       &plan->misses, &plan->n_misses, &offloaded, error)) {
            g_ptr_array_free(notes, TRUE);
            memsim_plan_free(plan);
            return NULL;
        }
    }
    if (opt.gpus > 1 && base.finetune != MEMSIM_FT_FULL)
        g_ptr_array_add(
            notes,
            g_strdup_printf(
                "%s runs on one GPU in the generator: %d GPUs are planned as independent "
                "data-parallel replicas (DDP-like; each GPU runs the single-GPU program; DDP's "
                "NCCL buffers and its all-reduce of the adapter gradients are not in the peaks)",
                base.finetune == MEMSIM_FT_LORA ? "LoRA" : "QLoRA", opt.gpus));
    if (offloaded && base.deepspeed)
        g_ptr_array_add(
            notes,
            g_strdup(
                "nothing fits on the GPUs alone: rows run the DeepSpeed config with "
                "zero_optimization.offload_optimizer.device=cpu, simulated (the fp32 partition, "
                "its gradient and Adam's state on the host), host memory per GPU as listed"));
    else if (offloaded)
        g_ptr_array_add(
            notes,
            g_strdup(
                "nothing fits on the GPUs alone: rows keep the optimizer state (fp32 master and "
                "moments) in CPU memory — the peak is the simulated one minus that state (an "
                "approximation: offload buffers are not modelled; memsim estimate shows the peak "
                "before subtracting), host memory per GPU as listed"));
    if (!opt.exhaustive)
        g_ptr_array_add(
            notes,
            g_strdup(
                "the largest micro-batch is found by bisection, assuming the peak grows with it"));
    g_ptr_array_add(notes, NULL);
    plan->notes = (char **)g_ptr_array_free(notes, FALSE);
    plan->elapsed_s = (double)(g_get_monotonic_time() - t0) / 1e6;
    return plan;
}

void memsim_plan_free(MemsimPlan *plan)
{
    if (!plan)
        return;
    for (guint i = 0; i < plan->n_rows; i++)
        plan_row_clear(&plan->rows[i]);
    for (guint i = 0; i < plan->n_misses; i++)
        plan_row_clear(&plan->misses[i]);
    for (guint i = 0; i < plan->n_mig; i++)
        plan_row_clear(&plan->mig[i].best);
    g_free(plan->rows);
    g_free(plan->misses);
    g_free(plan->mig);
    g_strfreev(plan->notes);
    g_free(plan->model);
    g_free(plan->run);
    g_free(plan->gpu);
    g_free(plan);
}
