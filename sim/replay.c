/* Replay: a trace's per-rank programs through one allocator instance per rank
 * (include/memsim/sim.h).
 *
 * Events are applied in program order. A tensor id maps to its live block (sim/idmap.h);
 * the block's size is what the allocator charged for it (the change in allocated bytes), so
 * the breakdown by category at the peak counts rounding and unsplit slack where it lies.
 *
 * Verification: recorded allocator actions (SEG_* and OOM events, the recorded address of an
 * ALLOC) precede in the program the event that caused them. They are queued; when the next
 * action (ALLOC, FREE, USE, EMPTY_CACHE) runs, what the policy reports through the device's
 * on_event hook is compared with the queue, in order, and the queue is emptied. The device's
 * segment_addr hook hands the recorded segment addresses back to the policy, so that the
 * address tie-break among equal-size free blocks is the real one (TORCH_ALLOCATOR.md §12).
 * A recorded address is only handed out if it overlaps no live simulated segment, so a
 * diverging model can never corrupt the policy's state.
 *
 * Time: the host issues each timed op (LAUNCH_US) onto its stream, which runs its ops in
 * order, each for its duration; WAIT orders streams (or blocks the host). Ranks meet at sends
 * and recvs that name their peer (MEMSIM_EVF_PEER): the k-th send from A to B pairs with the
 * k-th recv on B from A. A send is eager: it occupies its stream for its own duration and
 * leaves its start time on the channel A→B. A recv completes at max(its start, the send's
 * start) + the longer of the two durations; until the send is known, the receiving rank is
 * parked at the recv and the events fed for it wait (held) in memory. The ranks form a Kahn
 * network: each rank's times depend only on its own program and on what its channels carry,
 * in order, never on which rank the simulator runs first, so the answer is the same for any
 * interleaving. The simulator runs ranks one at a time, each until it parks or its events
 * run out, the lowest runnable rank first. A recv that no send will ever meet (a trace cut
 * short, a rank out of memory) completes on its own when nothing else can run
 * (memsim_replay_drain), the lowest such rank first. Other collectives meet no one: a rank
 * of a trace stands for symmetric ranks that reach their group's collectives together.
 * A rank's allocations and frees never wait for another rank, only its clock does, so the
 * memory of a rank changes with the meetings only through the time at which a block that was
 * used on another stream (record_stream) becomes free again.
 */
#include <memsim/formats.h>
#include <memsim/sim.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sim/alloc/instance.h"
#include "sim/idmap.h"
#include "sim/replay_bound.h"

typedef struct {
    memsim_addr_t addr, end;
} Range;

/* An allocation site's live blocks. */
typedef struct {
    int64_t bytes;
    int64_t count;
    uint8_t category, phase;
} SiteLive;

#define SITE_NONE UINT32_MAX

/* The step's work sums (MemsimStepPeaks) a repetition adds to: compute, memory-bound,
 * latency-bound, communication, host, bubble. */
#define N_SUMS 6

/* The memory states a rank's catching up keeps (memory_catch_up): periods of up to CUTS - 1
 * repetitions are found. */
#define CUTS 130
/* ... of which the last HIST are kept whole, so that a period shorter than HIST repetitions is
 * confirmed as soon as the state comes back (a longer one: one period later, when the state
 * taken at its return is compared with the next). */
#define HIST 24

typedef struct {
    MemsimReplay *rp;
    MemsimAlloc *alloc;
    /* The policy's live statistics when their address never changes (stats_live_fixed),
     * else NULL. */
    const MemsimAllocStats *stats_fixed;
    /* The policy's malloc and free with its state, for the short paths of run(). */
    MemsimAllocResult (*a_malloc)(void *state, memsim_size_t size, uint32_t stream,
                                  memsim_addr_t *addr);
    void (*a_free)(void *state, memsim_addr_t addr);
    void *a_state;
    MemsimDevice dev;
    IdMap tensors;
    gboolean stopped;
    int64_t cur_op;
    int64_t live_cat[MEMSIM_CAT_COUNT];
    int64_t live_req[MEMSIM_CAT_COUNT];
    /* the live tensors' requests each rounded up to 512 bytes, and its peak: what the `exact`
     * policy reserves (sim/alloc/exact.c), whatever the policy replayed */
    int64_t live_rounded, peak_rounded;
    GArray *breakdowns; /* MemsimBreakdown */
    int64_t last_allocated;
    int64_t best_allocated;
    int64_t best_reserved;
    MemsimRankReport rep;
    /* verification */
    GArray *expected;   /* MemsimEvent */
    GArray *claimed;    /* gboolean per expected entry */
    guint expected_from; /* expected entries before it are claimed or no segment's */
    GArray *emitted;    /* MemsimAllocEvent of the running action */
    GTree *segments;    /* Range* keyed by range, live simulated segments */
    memsim_addr_t bump;
    MemsimAllocEvent last_oom;
    gboolean saw_oom;
    GArray *steps;      /* MemsimStepPeaks */
    /* allocation sites: site_cur the live blocks now; site_peak[s] what site s held at the
     * latest peak of allocated bytes when s changed since (site_stamp[s] == epoch), else it
     * is site_cur[s]; each peak only bumps the epoch */
    GHashTable *stack_site; /* string index + 1 → site + 1 */
    GHashTable *site_index; /* site name → site + 1 */
    GPtrArray *site_names;
    GArray *site_cur, *site_peak, *site_stamp; /* SiteLive, SiteLive, uint64_t */
    uint64_t epoch;
    uint8_t cur_phase;
    uint16_t cur_stream; /* the stream of the event being applied */
    /* meetings with other ranks */
    GArray *held;        /* MemsimEvent fed while the rank was parked, not yet applied */
    gsize held_pos;
    gboolean waiting;    /* parked at a recv whose send is not known yet */
    uint32_t wait_peer;
    uint16_t wait_stream;
    uint64_t wait_event;
    double wait_start, wait_dur;
    /* the last OP event: a collective right after it on its stream is that op */
    uint64_t op_next;    /* the event index after it (UINT64_MAX: none yet) */
    uint16_t op_stream;
    double op_start, op_dur;
    /* timeline: the last OP's slice, noted when the rank's next event comes (a recv after
     * it may still move its end) */
    gboolean tl_held;
    uint64_t tl_event;
    int64_t tl_op;
    uint16_t tl_stream;
    double tl_start, tl_end;
    /* time: the host issues ops (LAUNCH_US each); each stream runs them in order */
    double cpu_us;
    GArray *gpu_free;   /* double per stream: when the stream is idle */
    GArray *last_end;   /* double per stream: end of the last op issued on it */
    GArray *wait_until; /* double per stream: pending waits on other streams */
    /* steady state: the unit a REPEAT announced, captured as it runs */
    GArray *unit;       /* MemsimEvent */
    uint64_t unit_len, unit_times, unit_from, unit_shift;
    uint64_t unit_index; /* the REPEAT's event (for messages) */
    uint32_t unit_mbs; /* the micro-batches a repetition runs on (unit_microbatches) */
    /* the step marks the unit holds (a whole step of a loop), and the steps the repetition
     * running has moved them on by (MEMSIM_EV_REPEAT: step N of the unit's r-th repetition is
     * step N + r × unit_steps) */
    uint32_t unit_steps, step_bump;
    gboolean capturing;
    int32_t mb_top; /* the highest micro-batch of the ops run */
    /* time the repetitions added without running (the clocks stay where the last one left
     * them, with the allocator's event tokens: only the reports add it) */
    double t_offset;
    /* what the allocator asked about stream events during a repetition (record_event's
     * tokens relative to the host, event_done's answers), hashed */
    gboolean ev_logging;
    uint64_t ev_hash;
    struct SteadyState *unit_pre; /* the state before the unit's first run, or NULL */
    /* the events since the last placeholder REPEAT (a unit that may be the template's
     * twin: repeat_skip_first), capturing while pre_on, and the clocks at its start */
    GArray *pre;
    gboolean pre_on, pre_ok;
    struct SteadyState *pre_clocks;
    struct RepeatRun *repeat;     /* repetitions under way, or NULL */
    /* a repeat of whole steps (MEMSIM_EVF_STEPS): its unit captured as written (the repeats
     * it holds unexpanded) while it first runs, then run again repetition by repetition, the
     * repeats inside each one handled as usual (outer_run); NULL when none */
    struct Outer *outer;
    uint32_t outer_bump; /* the steps the running repetition of `outer` moves step marks by */
    guint pump_depth;    /* > 0: run() is given a repetition's events, not the program's */
    double unit_pre_sums[N_SUMS];
    /* the cross-rank steady state: waiting at a repetition's boundary for the other ranks
     * (cross_cut), and the rank's part of the last two cuts */
    gboolean at_cut;
    struct RankCut *cuts;
    /* while watched: the clocks (clock_bit) that decided a max — the later of several times —
     * or were set from another time, since the last cut */
    gboolean watch, watch_over;
    uint64_t bound, written;
    gboolean memory_only; /* events change the memory alone (memory_catch_up) */
    /* the memory's prints (steady_print) at the last cuts of repeat run print_serial, by the
     * repetitions done then (print_done; UINT64_MAX: none) */
    uint64_t print_serial;
    uint64_t prints[CUTS], print_done[CUTS];
} RankSim;

static void outer_free(RankSim *r);
static gboolean outer_start(RankSim *r, const MemsimTraceHeader *h, guint32 rank, uint64_t index,
                            const MemsimEvent *ev, GError **error);

/* A clock's bit in RankSim.bound and .written: the host's, then the streams' (gpu_free,
 * last_end, wait_until); -1 past 64. */
#define CLK_FREE 0
#define CLK_END 1
#define CLK_WAIT 2
static inline int clock_bit(int kind, uint32_t stream)
{
    return stream < 21 ? 1 + 3 * (int)stream + kind : -1;
}

static inline void clock_note(RankSim *r, int bit, gboolean bound, gboolean written)
{
    if (bit < 0) {
        r->watch_over = TRUE;
        return;
    }
    if (bound)
        r->bound |= (uint64_t)1 << bit;
    if (written)
        r->written |= (uint64_t)1 << bit;
}

/* The start max(host, stream free, stream waits) = `start` on `stream`: each clock that is the
 * latest decided it. */
static void watch_start(RankSim *r, uint32_t stream, double cpu, double fr, double wu,
                        double start)
{
    clock_note(r, 0, cpu >= start, FALSE);
    clock_note(r, clock_bit(CLK_FREE, stream), fr >= start, FALSE);
    clock_note(r, clock_bit(CLK_WAIT, stream), wu >= start, FALSE);
}

/* clock = max(clock, other): the clock decides it when it is the later, else it is set. */
static void watch_max(RankSim *r, int bit, double clock, double other)
{
    clock_note(r, bit, clock >= other, other > clock);
}

typedef struct SteadyState SteadyState;
static void steady_pre(RankSim *r);
static void pre_mark(RankSim *r, const MemsimEvent *ev);
static void pre_capture(RankSim *r, const MemsimEvent *ev);
static void repeat_free(RankSim *r);
static void steady_clear(SteadyState *s);
static void cuts_free(RankSim *r);

/* Host-side cost of issuing one op (PyTorch eager dispatch + kernel launch). */
#define LAUNCH_US 10.0

/* A send no recv has met yet: when it started and how long it takes. */
typedef struct {
    double start, dur;
} Sent;

/* The sends from one rank to another, in order. */
typedef struct {
    GArray *sent; /* Sent */
    guint head;   /* the first not yet received */
} Channel;

struct MemsimReplay {
    MemsimTraceHeader header;
    MemsimReplayOptions opt;
    char *allocator;
    char *alloc_conf;
    memsim_size_t capacity;
    guint n_ranks;
    RankSim *ranks;
    GHashTable *channels; /* (from << 32 | to) → Channel*, created on the first send */
    gboolean woken;       /* a parked rank can go on */
    /* the cross-rank steady state (memsim_replay_trace only): ranks whose repeated unit meets
     * other ranks wait at its boundaries; the cuts where they all do, the last two kept */
    gboolean cross;
    uint64_t n_cuts;     /* cuts kept since the last skip (0: none) */
    uint64_t n_repeats;  /* repeat runs begun, for telling them apart */
    GArray *inflight[2]; /* InFlight of the last two cuts */
    /* memsim_replay_trace_bounded: the requested bytes past which the replay gives up
     * (G_MAXINT64: never), and whether an allocation passed them */
    int64_t requested_limit;
    gboolean over_limit;
    /* memsim_replay_trace_if_fits: the first allocation that fails, or that takes a rank's
     * reserved bytes past reserved_limit, ends the replay (as over_limit) */
    gboolean stop_at_oom;
    int64_t reserved_limit;
};

static void channel_free(gpointer p)
{
    Channel *c = p;
    g_array_unref(c->sent);
    g_free(c);
}

static gint range_cmp(gconstpointer a, gconstpointer b, gpointer user)
{
    const Range *x = a, *y = b;
    if (x->end <= y->addr)
        return -1;
    if (y->end <= x->addr)
        return 1;
    return 0; /* overlapping ranges compare equal: a lookup finds any overlap */
}

static void on_event(void *user, const MemsimAllocEvent *ev)
{
    RankSim *r = user;
    const MemsimReplayHooks *hk = r->rp->opt.hooks;
    if (hk && hk->on_action)
        hk->on_action(hk->user, (guint32)(r - r->rp->ranks), r->rep.n_events - 1, r->cur_op, ev);
    if (ev->kind == MEMSIM_AEV_SEG_ALLOC) {
        Range *g = g_new(Range, 1);
        g->addr = ev->addr;
        g->end = ev->addr + ev->size;
        g_tree_insert(r->segments, g, g);
    } else if (ev->kind == MEMSIM_AEV_SEG_FREE) {
        Range k = {ev->addr, ev->addr + ev->size};
        g_tree_remove(r->segments, &k);
    } else if (ev->kind == MEMSIM_AEV_OOM) {
        r->last_oom = *ev;
        r->saw_oom = TRUE;
    }
    if (r->rp->opt.verify &&
        (ev->kind == MEMSIM_AEV_SEG_ALLOC || ev->kind == MEMSIM_AEV_SEG_FREE ||
         ev->kind == MEMSIM_AEV_SEG_MAP || ev->kind == MEMSIM_AEV_SEG_UNMAP ||
         ev->kind == MEMSIM_AEV_ALLOC))
        g_array_append_val(r->emitted, *ev);
}

#define BUMP_BASE ((memsim_addr_t)1 << 56)
#define BUMP_ALIGN ((memsim_addr_t)2 << 20)

static memsim_addr_t segment_addr(void *user, memsim_size_t size, uint32_t stream)
{
    RankSim *r = user;
    const MemsimReplayHooks *hk = r->rp->opt.hooks;
    if (hk && hk->segment_addr)
        return hk->segment_addr(hk->user, (guint32)(r - r->rp->ranks), size, stream);
    gboolean *claimed = (gboolean *)r->claimed->data;
    /* (without --verify the list is never cleared: the scan starts past its settled head) */
    for (guint i = r->expected_from; i < r->expected->len; i++) {
        const MemsimEvent *e = &g_array_index(r->expected, MemsimEvent, i);
        if (claimed[i] || (e->kind != MEMSIM_EV_SEG_ALLOC && e->kind != MEMSIM_EV_SEG_MAP)) {
            if (i == r->expected_from)
                r->expected_from++;
            continue;
        }
        /* The first unclaimed recorded segment of this action: a normal segment must have
         * the requested size; an expandable reservation starts where its first map does. */
        if (e->kind == MEMSIM_EV_SEG_ALLOC) {
            if (e->size != size)
                break;
            Range k = {e->addr, e->addr + size};
            if (g_tree_lookup(r->segments, &k))
                break;
        }
        claimed[i] = TRUE;
        if (i == r->expected_from)
            r->expected_from++;
        return e->addr;
    }
    memsim_addr_t a = r->bump;
    r->bump += ((size + BUMP_ALIGN - 1) & ~(BUMP_ALIGN - 1)) + BUMP_ALIGN;
    return a;
}

static double *stream_slot(GArray *a, uint32_t stream)
{
    if (stream >= a->len)
        g_array_set_size(a, stream + 1);
    return &g_array_index(a, double, stream);
}

/* A cross-stream event recorded now on `stream` completes when that stream has finished the
 * work issued before it: the token is that end time (ns). */
static inline void ev_log(RankSim *r, uint64_t v)
{
    r->ev_hash = (r->ev_hash ^ v) * 0x100000001B3ull;
}

static uint64_t record_event(void *user, uint32_t stream)
{
    RankSim *r = user;
    uint64_t token = (uint64_t)(*stream_slot(r->last_end, stream) * 1000.0);
    if (G_UNLIKELY(r->ev_logging)) {
        ev_log(r, stream);
        /* relative to the host, to the ns (the token's own rounding moves with the clocks) */
        double ahead = *stream_slot(r->last_end, stream) - r->cpu_us;
        ev_log(r, ahead > 0 ? (uint64_t)llround(ahead * 1000.0) : 0);
    }
    return token;
}

/* Queried by the allocator at the host's current time. */
static gboolean event_done(void *user, uint32_t stream, uint64_t token)
{
    RankSim *r = user;
    gboolean done = (uint64_t)(r->cpu_us * 1000.0) >= token;
    if (G_UNLIKELY(r->ev_logging))
        ev_log(r, done ? 0x5EED : 0xD0E);
    return done;
}

static void rank_clear(RankSim *r)
{
    if (r->gpu_free)
        g_array_unref(r->gpu_free);
    if (r->last_end)
        g_array_unref(r->last_end);
    if (r->wait_until)
        g_array_unref(r->wait_until);
    if (r->held)
        g_array_unref(r->held);
    if (r->unit)
        g_array_unref(r->unit);
    if (r->unit_pre) {
        steady_clear(r->unit_pre);
        g_free(r->unit_pre);
    }
    if (r->pre_clocks) {
        steady_clear(r->pre_clocks);
        g_free(r->pre_clocks);
    }
    if (r->pre)
        g_array_unref(r->pre);
    repeat_free(r);
    outer_free(r);
    cuts_free(r);
    memsim_alloc_free_instance(r->alloc);
    idmap_clear(&r->tensors);
    if (r->expected)
        g_array_unref(r->expected);
    if (r->claimed)
        g_array_unref(r->claimed);
    if (r->emitted)
        g_array_unref(r->emitted);
    if (r->segments)
        g_tree_unref(r->segments);
    if (r->steps)
        g_array_unref(r->steps);
    if (r->stack_site)
        g_hash_table_unref(r->stack_site);
    if (r->site_index)
        g_hash_table_unref(r->site_index);
    if (r->site_names)
        g_ptr_array_unref(r->site_names);
    if (r->site_cur)
        g_array_unref(r->site_cur);
    if (r->site_peak)
        g_array_unref(r->site_peak);
    if (r->site_stamp)
        g_array_unref(r->site_stamp);
    for (guint k = 0; k < r->rep.n_sites_at_peak; k++)
        g_free(r->rep.sites_at_peak[k].site);
    g_free(r->rep.sites_at_peak);
    for (guint k = 0; k < r->rep.n_sites_at_oom; k++)
        g_free(r->rep.sites_at_oom[k].site);
    g_free(r->rep.sites_at_oom);
    if (r->breakdowns)
        g_array_unref(r->breakdowns);
    g_free(r->rep.role);
    g_free(r->rep.first_mismatch);
}

void memsim_replay_abort(MemsimReplay *rp)
{
    if (!rp)
        return;
    for (guint i = 0; i < rp->n_ranks; i++)
        rank_clear(&rp->ranks[i]);
    g_free(rp->ranks);
    if (rp->channels)
        g_hash_table_unref(rp->channels);
    for (int k = 0; k < 2; k++)
        if (rp->inflight[k])
            g_array_unref(rp->inflight[k]);
    memsim_trace_header_clear(&rp->header);
    g_free(rp->allocator);
    g_free(rp->alloc_conf);
    g_free(rp);
}

MemsimReplay *memsim_replay_new(const MemsimTraceHeader *header, const MemsimReplayOptions *opt,
                                GError **error)
{
    static const MemsimReplayOptions defaults = MEMSIM_REPLAY_OPTIONS_INIT;
    MemsimReplay *rp = g_new0(MemsimReplay, 1);
    rp->opt = opt ? *opt : defaults;
    rp->requested_limit = G_MAXINT64;
    rp->reserved_limit = G_MAXINT64;
    memsim_trace_header_copy(&rp->header, header);
    rp->capacity = rp->opt.capacity ? rp->opt.capacity : header->capacity;

    /* The policy and its settings: the torch policy takes the recorded settings unless told
     * otherwise. */
    const char *spec = rp->opt.allocator ? rp->opt.allocator : "torch";
    const char *colon = strchr(spec, ':');
    g_autofree char *name = colon ? g_strndup(spec, (gsize)(colon - spec)) : g_strdup(spec);
    GString *settings = g_string_new(colon ? colon + 1 : "");
    if (strcmp(name, "torch") == 0) {
        const char *conf = rp->opt.alloc_conf ? rp->opt.alloc_conf : header->alloc_conf;
        if (conf && *conf) {
            if (settings->len)
                g_string_prepend_c(settings, ',');
            g_string_prepend(settings, conf);
        }
        rp->alloc_conf = g_strdup(settings->str);
    }
    rp->allocator = settings->len ? g_strdup_printf("%s:%s", name, settings->str)
                                  : g_strdup(name);
    g_string_free(settings, TRUE);

    rp->n_ranks = header->n_ranks;
    rp->ranks = g_new0(RankSim, rp->n_ranks ? rp->n_ranks : 1);
    rp->channels = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, channel_free);
    for (guint i = 0; i < rp->n_ranks; i++) {
        RankSim *r = &rp->ranks[i];
        r->rp = rp;
        r->cur_op = -1;
        r->bump = BUMP_BASE;
        idmap_init(&r->tensors);
        r->expected = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
        r->claimed = g_array_new(FALSE, TRUE, sizeof(gboolean));
        r->emitted = g_array_new(FALSE, FALSE, sizeof(MemsimAllocEvent));
        r->segments = g_tree_new_full(range_cmp, NULL, g_free, NULL);
        r->steps = g_array_new(FALSE, TRUE, sizeof(MemsimStepPeaks));
        r->breakdowns = g_array_new(FALSE, TRUE, sizeof(MemsimBreakdown));
        MemsimDevice d = MEMSIM_DEVICE_INIT;
        r->dev = d;
        /* no capacity given: the rank's own recorded one (a snapshot's OOM), if any */
        /* (G_MAXUINT64: unlimited, even where the trace records a capacity) */
        memsim_size_t cap = rp->capacity ? rp->capacity : header->ranks[i].capacity;
        r->dev.capacity = cap == G_MAXUINT64 ? 0 : cap;
        r->rep.capacity = r->dev.capacity;
        r->dev.user = r;
        r->dev.on_event = on_event;
        r->dev.segment_addr = segment_addr;
        r->dev.record_event = record_event;
        if (!rp->opt.verify && !(rp->opt.hooks && rp->opt.hooks->on_action))
            /* blocks handed out and freed need no report then */
            r->dev.quiet = (1u << MEMSIM_AEV_ALLOC) | (1u << MEMSIM_AEV_FREE_COMPLETED);
        r->dev.event_done = event_done;
        r->gpu_free = g_array_new(FALSE, TRUE, sizeof(double));
        r->last_end = g_array_new(FALSE, TRUE, sizeof(double));
        r->wait_until = g_array_new(FALSE, TRUE, sizeof(double));
        r->held = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
        r->unit = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
        r->mb_top = -1;
        r->op_next = UINT64_MAX;
        r->rep.rank = header->ranks[i].device;
        r->rep.multiplicity = header->ranks[i].multiplicity;
        r->rep.role = g_strdup(header->ranks[i].role);
        r->rep.host_peak = header->ranks[i].host_peak;
        r->rep.peak_allocated_op = -1;
        r->rep.peak_op_layer = -1;
        r->rep.oom.op = -1;
        r->rep.recorded_oom.op = -1;
        r->rep.oom.layer = r->rep.recorded_oom.layer = -1;
        r->rep.verified = rp->opt.verify;
        r->rep.has_recorded_final = header->ranks[i].has_final;
        r->rep.recorded_final_reserved = header->ranks[i].final_reserved;
        r->rep.recorded_final_allocated = header->ranks[i].final_allocated;
        if (rp->opt.verify && header->ranks[i].n_inconsistent) {
            /* the recording contradicts itself: it cannot be what an allocator did */
            r->rep.verify_checked += header->ranks[i].n_inconsistent;
            r->rep.verify_mismatches += header->ranks[i].n_inconsistent;
            r->rep.first_mismatch = g_strdup_printf(
                "the recording contradicts its own state %" PRIu64 " time(s) (see the warnings)",
                header->ranks[i].n_inconsistent);
        }
        r->alloc = memsim_alloc_new_from_spec(rp->allocator, &r->dev, error);
        if (!r->alloc) {
            memsim_replay_abort(rp);
            return NULL;
        }
        r->a_malloc = r->alloc->ops->malloc;
        r->a_free = r->alloc->ops->free;
        r->a_state = r->alloc->state;
        if (r->alloc->ops->stats_live && r->alloc->ops->stats_live_fixed)
            r->stats_fixed = r->alloc->ops->stats_live(r->alloc->state);
    }
    if (rp->opt.timeline)
        memsim_timeline_begin(rp->opt.timeline, header, rp->allocator, rp->capacity);
    return rp;
}

static void mismatch(RankSim *r, uint64_t index, const MemsimEvent *ev, const char *fmt, ...)
    G_GNUC_PRINTF(4, 5);

static void mismatch(RankSim *r, uint64_t index, const MemsimEvent *ev, const char *fmt, ...)
{
    r->rep.verify_mismatches++;
    if (r->rep.first_mismatch)
        return;
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *what = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    r->rep.first_mismatch =
        g_strdup_printf("event %" PRIu64 " (%s t=%" PRIu64 " size=%" PRIu64 "): %s", index,
                        memsim_event_kind_name(ev->kind), ev->id, ev->size, what);
}

static MemsimAllocEventKind record_kind(uint8_t kind)
{
    switch (kind) {
    case MEMSIM_EV_SEG_ALLOC:
        return MEMSIM_AEV_SEG_ALLOC;
    case MEMSIM_EV_SEG_FREE:
        return MEMSIM_AEV_SEG_FREE;
    case MEMSIM_EV_SEG_MAP:
        return MEMSIM_AEV_SEG_MAP;
    default:
        return MEMSIM_AEV_SEG_UNMAP;
    }
}

static const char *aev_name(MemsimAllocEventKind k)
{
    switch (k) {
    case MEMSIM_AEV_SEG_ALLOC:
        return "segment_alloc";
    case MEMSIM_AEV_SEG_FREE:
        return "segment_free";
    case MEMSIM_AEV_SEG_MAP:
        return "segment_map";
    case MEMSIM_AEV_SEG_UNMAP:
        return "segment_unmap";
    case MEMSIM_AEV_ALLOC:
        return "alloc";
    case MEMSIM_AEV_FREE_COMPLETED:
        return "free_completed";
    case MEMSIM_AEV_OOM:
        return "oom";
    }
    return "?";
}

/* Compares what the policy did during one action with what was recorded before it. */
static void verify_action(RankSim *r, uint64_t index, const MemsimEvent *ev)
{
    guint j = 0;
    const MemsimAllocEvent *em = (const MemsimAllocEvent *)r->emitted->data;
    for (guint i = 0; i < r->expected->len; i++) {
        const MemsimEvent *rec = &g_array_index(r->expected, MemsimEvent, i);
        while (j < r->emitted->len && em[j].kind == MEMSIM_AEV_ALLOC)
            j++;
        r->rep.verify_checked++;
        MemsimAllocEventKind want = record_kind(rec->kind);
        if (j >= r->emitted->len) {
            mismatch(r, index, ev,
                     "expected %s at 0x%" PRIx64 " of %" PRIu64 " bytes, got nothing",
                     aev_name(want), rec->addr, rec->size);
            continue;
        }
        if (em[j].kind != want || em[j].addr != rec->addr || em[j].size != rec->size)
            mismatch(r, index, ev,
                     "expected %s at 0x%" PRIx64 " of %" PRIu64 " bytes, got %s at 0x%" PRIx64
                     " of %" PRIu64 " bytes",
                     aev_name(want), rec->addr, rec->size, aev_name(em[j].kind), em[j].addr,
                     em[j].size);
        j++;
    }
    for (; j < r->emitted->len; j++) {
        if (em[j].kind == MEMSIM_AEV_ALLOC)
            continue;
        r->rep.verify_checked++;
        mismatch(r, index, ev, "expected nothing more, got %s at 0x%" PRIx64 " of %" PRIu64
                 " bytes", aev_name(em[j].kind), em[j].addr, em[j].size);
    }
    if (ev->kind == MEMSIM_EV_ALLOC && (ev->flags & MEMSIM_EVF_ADDR)) {
        r->rep.verify_checked++;
        memsim_addr_t got = 0;
        gboolean found = FALSE;
        for (guint k = 0; k < r->emitted->len; k++)
            if (em[k].kind == MEMSIM_AEV_ALLOC) {
                got = em[k].addr;
                found = TRUE;
            }
        if (!found || got != ev->addr) {
            Range k = {ev->addr, ev->addr + 1};
            Range *seg = g_tree_lookup(r->segments, &k);
            if (found && seg)
                mismatch(r, index, ev,
                         "expected the block at 0x%" PRIx64 " (offset %" PRIu64
                         " in its segment), got 0x%" PRIx64 " (offset %" PRId64 ")",
                         ev->addr, ev->addr - seg->addr, got, (int64_t)(got - seg->addr));
            else
                mismatch(r, index, ev, "expected the block at 0x%" PRIx64 ", got %s0x%" PRIx64,
                         ev->addr, found ? "" : "none ", got);
        }
    }
    g_array_set_size(r->expected, 0);
    g_array_set_size(r->claimed, 0);
    r->expected_from = 0;
}

/* After the categories were updated: note the peaks `st` shows. */
static void track_peaks(RankSim *r, const MemsimTraceHeader *h, uint64_t index,
                        const MemsimAllocStats *st)
{
    if (st->allocated.current > r->best_allocated) {
        r->best_allocated = st->allocated.current;
        r->epoch++; /* the sites' peak is now */
        memcpy(r->rep.peak_by_category, r->live_cat, sizeof r->live_cat);
        memcpy(r->rep.peak_by_category_requested, r->live_req, sizeof r->live_req);
        r->rep.peak_allocated_event = index;
        r->rep.at_peak_allocated_reserved = (memsim_size_t)st->reserved.current;
        r->rep.at_peak_allocated_requested = (memsim_size_t)st->requested.current;
        r->rep.peak_allocated_op = r->cur_op;
        r->rep.peak_stream = r->cur_stream;
        if (r->cur_op >= 0 && (uint64_t)r->cur_op < h->n_ops) {
            const MemsimOpInfo *op = &h->ops[r->cur_op];
            g_strlcpy(r->rep.peak_op_name,
                      op->name < h->n_strings ? h->strings[op->name] : "?",
                      sizeof r->rep.peak_op_name);
            r->rep.peak_op_layer = op->layer;
            r->rep.peak_op_phase = op->phase;
        }
    }
    if (r->steps->len) {
        MemsimStepPeaks *sp = &g_array_index(r->steps, MemsimStepPeaks, r->steps->len - 1);
        if (st->allocated.current > sp->peak_allocated)
            sp->peak_allocated = st->allocated.current;
        if (st->reserved.current > sp->peak_reserved)
            sp->peak_reserved = st->reserved.current;
        if (st->allocated.current > sp->phase_peak_allocated[r->cur_phase])
            sp->phase_peak_allocated[r->cur_phase] = st->allocated.current;
        if (st->reserved.current > sp->phase_peak_reserved[r->cur_phase])
            sp->phase_peak_reserved[r->cur_phase] = st->reserved.current;
    }
    if (st->reserved.peak > r->best_reserved) {
        r->best_reserved = st->reserved.peak;
        r->rep.at_peak_reserved_allocated = (memsim_size_t)st->allocated.current;
        r->rep.at_peak_reserved_requested = (memsim_size_t)st->requested.current;
        r->rep.peak_reserved_event = index;
    }
    r->last_allocated = st->allocated.current;
}

/* track_peaks when something may change; most events only move last_allocated. */
static inline void note_peaks(RankSim *r, const MemsimTraceHeader *h, uint64_t index,
                              const MemsimAllocStats *st)
{
    if (st->allocated.current > r->best_allocated || st->reserved.peak > r->best_reserved ||
        r->steps->len)
        track_peaks(r, h, index, st);
    else
        r->last_allocated = st->allocated.current;
}

/* The site tables, made when a trace first names a site (most traces never do). */
static void sites_init(RankSim *r)
{
    if (r->site_cur)
        return;
    r->stack_site = g_hash_table_new(g_direct_hash, g_direct_equal);
    r->site_index = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    r->site_names = g_ptr_array_new_with_free_func(g_free);
    r->site_cur = g_array_new(FALSE, TRUE, sizeof(SiteLive));
    r->site_peak = g_array_new(FALSE, TRUE, sizeof(SiteLive));
    r->site_stamp = g_array_new(FALSE, TRUE, sizeof(uint64_t));
}

/* The site called `name`. */
static uint32_t site_named(RankSim *r, const char *name)
{
    sites_init(r);
    gpointer id = g_hash_table_lookup(r->site_index, name);
    if (!id) {
        g_ptr_array_add(r->site_names, g_strdup(name));
        id = GSIZE_TO_POINTER((gsize)r->site_names->len);
        g_hash_table_insert(r->site_index, g_strdup(name), id);
    }
    return (uint32_t)(GPOINTER_TO_SIZE(id) - 1);
}

/* The site of a stack (the string `aux` − 1 of the header): its first frame in no file
 * the skip lists name. */
static uint32_t site_of(RankSim *r, const MemsimTraceHeader *h, uint64_t aux)
{
    if (aux == 0 || aux > h->n_strings)
        return SITE_NONE;
    sites_init(r);
    gpointer v = g_hash_table_lookup(r->stack_site, GSIZE_TO_POINTER((gsize)aux));
    if (v)
        return (uint32_t)(GPOINTER_TO_SIZE(v) - 1);
    static const char *const always[] = {"/torch/", "/site-packages/", "/dist-packages/",
                                         "/lib/python3", "<frozen"};
    g_auto(GStrv) extra =
        r->rp->opt.frames_skip ? g_strsplit(r->rp->opt.frames_skip, ",", -1) : NULL;
    g_auto(GStrv) lines = g_strsplit(h->strings[aux - 1], "\n", -1);
    const char *site = "(library code only)";
    for (char **l = lines; *l && site[0] == '('; l++) {
        const char *colon = strrchr(*l, ':');
        g_autofree char *file = g_strndup(*l, colon ? (gsize)(colon - *l) : strlen(*l));
        gboolean skip = FALSE;
        for (gsize k = 0; k < G_N_ELEMENTS(always) && !skip; k++)
            skip = strstr(file, always[k]) != NULL;
        for (char **x = extra; x && *x && !skip; x++)
            skip = **x && strstr(file, *x) != NULL;
        if (!skip)
            site = *l;
    }
    uint32_t id = site_named(r, site);
    g_hash_table_insert(r->stack_site, GSIZE_TO_POINTER((gsize)aux),
                        GSIZE_TO_POINTER((gsize)id + 1));
    return id;
}

/* Site `s` gains (sign 1) or loses (-1) a block of `bytes`. */
static void site_move(RankSim *r, uint32_t s, uint64_t bytes, int sign, uint8_t category)
{
    if (s >= r->site_cur->len) {
        guint old = r->site_cur->len;
        g_array_set_size(r->site_cur, s + 1);
        g_array_set_size(r->site_peak, s + 1);
        g_array_set_size(r->site_stamp, s + 1);
        for (guint k = old; k <= s; k++) {
            SiteLive *c = &g_array_index(r->site_cur, SiteLive, k);
            c->category = category;
            c->phase = r->cur_phase;
        }
    }
    SiteLive *c = &g_array_index(r->site_cur, SiteLive, s);
    uint64_t *stamp = &g_array_index(r->site_stamp, uint64_t, s);
    if (*stamp < r->epoch) {
        g_array_index(r->site_peak, SiteLive, s) = *c; /* as it was at the latest peak */
        *stamp = r->epoch;
    }
    c->bytes += sign * (int64_t)bytes;
    c->count += sign;
}

static int cmp_site_bytes(const void *a, const void *b)
{
    const MemsimSite *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return strcmp(x->site, y->site);
}

/* The largest sites of `live` (SiteLive per site; at the peak, `peak` for those changed
 * since), MEMSIM_TOP_SITES at most. */
static MemsimSite *top_sites(RankSim *r, gboolean at_peak, uint32_t *n)
{
    GArray *all = g_array_new(FALSE, FALSE, sizeof(MemsimSite));
    for (guint s = 0; s < r->site_cur->len; s++) {
        const SiteLive *l = &g_array_index(r->site_cur, SiteLive, s);
        if (at_peak && g_array_index(r->site_stamp, uint64_t, s) == r->epoch && r->epoch)
            l = &g_array_index(r->site_peak, SiteLive, s);
        if (l->bytes <= 0)
            continue;
        MemsimSite x = {g_ptr_array_index(r->site_names, s), (memsim_size_t)l->bytes,
                        (uint64_t)l->count, l->category, l->phase};
        g_array_append_val(all, x);
    }
    g_array_sort(all, cmp_site_bytes);
    *n = MIN(all->len, MEMSIM_TOP_SITES);
    MemsimSite *out = g_new0(MemsimSite, *n ? *n : 1);
    for (guint k = 0; k < *n; k++) {
        out[k] = g_array_index(all, MemsimSite, k);
        out[k].site = g_strdup(out[k].site);
    }
    g_array_unref(all);
    return out;
}

/* The sites at the first OOM, once. */
static void note_oom_sites(RankSim *r, uint64_t index)
{
    if (r->rep.sites_at_oom || !r->site_cur || !r->site_cur->len)
        return;
    r->rep.sites_at_oom = top_sites(r, FALSE, &r->rep.n_sites_at_oom);
    r->rep.sites_oom_event = index;
}

/* A request rounded up to 512 bytes as the `exact` policy rounds it (exact_round; saturating
 * near 2^64 as it does). */
static inline memsim_size_t round_512(memsim_size_t size)
{
    if (size < 512)
        return 512;
    return size > UINT64_MAX - 511 ? UINT64_MAX : (size + 511) & ~(memsim_size_t)511;
}

/* A tensor joins the live set (its category's bytes, requested bytes and rounded peak). */
static inline void live_in(RankSim *r, const IdVal *v)
{
    r->live_cat[v->category] += (int64_t)v->size;
    r->live_req[v->category] += (int64_t)v->req;
    r->live_rounded += (int64_t)round_512(v->req);
    if (r->live_rounded > r->peak_rounded)
        r->peak_rounded = r->live_rounded;
}

/* A successful ALLOC: the tensor enters the id map at `slot` (from idmap_slot, after
 * idmap_reserve) charged with the change in allocated bytes. */
static inline void alloc_done(RankSim *r, const MemsimTraceHeader *h, uint64_t index,
                              const MemsimEvent *ev, IdSlot *slot, memsim_addr_t addr)
{
    const MemsimAllocStats *st =
        G_LIKELY(r->stats_fixed) ? r->stats_fixed : memsim_alloc_stats_live(r->alloc);
    IdVal v = {addr, (uint64_t)(st->allocated.current - r->last_allocated), ev->size,
               ev->category, ev->stream, SITE_NONE};
    if (G_UNLIKELY(ev->aux)) {
        v.site = site_of(r, h, ev->aux);
        if (v.site != SITE_NONE)
            site_move(r, v.site, v.size, 1, ev->category);
    }
    idmap_fill(&r->tensors, slot, ev->id, &v);
    live_in(r, &v);
    note_peaks(r, h, index, st);
    if (G_UNLIKELY(st->requested.current > r->rp->requested_limit ||
                   st->reserved.current > r->rp->reserved_limit))
        g_atomic_int_set(&r->rp->over_limit, TRUE); /* the caller gives up (over_limit) */
}

#define OVER_LIMIT_QUARK g_quark_from_static_string("memsim-replay-over-limit")

/* An allocation passed the bound of memsim_replay_trace_bounded: the replay stops as on an
 * error (every loop returns), which that function turns into its answer. */
static gboolean over_limit(GError **error)
{
    g_set_error_literal(error, OVER_LIMIT_QUARK, 0, "requested bytes over the bound");
    return FALSE;
}

/* An ALLOC the policy could not serve: the replay of this rank stops. */
static void out_of_memory(RankSim *r, const MemsimTraceHeader *h, uint64_t index,
                          const MemsimEvent *ev)
{
    MemsimAllocStats st = memsim_alloc_stats(r->alloc);
    MemsimOomInfo *o = &r->rep.oom;
    o->happened = TRUE;
    o->event_index = index;
    o->requested = ev->size;
    o->rounded = r->saw_oom ? r->last_oom.size : memsim_alloc_round_size(r->alloc, ev->size);
    o->device_free = r->saw_oom ? r->last_oom.addr : 0;
    o->allocated = (memsim_size_t)st.allocated.current;
    o->reserved = (memsim_size_t)st.reserved.current;
    o->stream = ev->stream;
    o->op = r->cur_op;
    o->layer = -1;
    if (r->cur_op >= 0 && (uint64_t)r->cur_op < h->n_ops) {
        const MemsimOpInfo *op = &h->ops[r->cur_op];
        g_strlcpy(o->op_name, op->name < h->n_strings ? h->strings[op->name] : "?",
                  sizeof o->op_name);
        o->layer = op->layer;
        o->phase = op->phase;
    }
    if (r->steps->len)
        o->step = g_array_index(r->steps, MemsimStepPeaks, r->steps->len - 1).step;
    note_oom_sites(r, index);
    r->stopped = TRUE;
    if (r->rp->stop_at_oom)
        g_atomic_int_set(&r->rp->over_limit, TRUE); /* the caller gives up (over_limit) */
}

/* A FREE of a live tensor (already out of the id map). */
static inline void free_done(RankSim *r, const IdVal *v)
{
    r->a_free(r->a_state, v->addr); /* memsim_alloc_free without the call */
    r->live_cat[v->category] -= (int64_t)v->size;
    r->live_req[v->category] -= (int64_t)v->req;
    r->live_rounded -= (int64_t)round_512(v->req);
    r->last_allocated -= (int64_t)v->size;
    if (G_UNLIKELY(v->site != SITE_NONE))
        site_move(r, v->site, v->size, -1, 0);
}

/* The short paths of run() and memory_rep for the events most of a trace is: an ALLOC of a
 * fresh id and a FREE of a live one; everything else (and every error) goes through step(). */
typedef enum {
    FAST_NO,   /* not one for the short path: step() takes it */
    FAST_DONE,
    FAST_OOM,  /* the policy could not serve it: the rank stops (out_of_memory) */
    FAST_OVER, /* memsim_replay_trace_bounded's bound was passed (over_limit) */
} FastWay;

static inline FastWay fast_alloc(RankSim *r, const MemsimTraceHeader *h, uint64_t index,
                                 const MemsimEvent *ev)
{
    if (!(ev->size - 1 < ((uint64_t)1 << 60) - 1 && ev->category < MEMSIM_CAT_COUNT &&
          ev->id != UINT64_MAX))
        return FAST_NO;
    idmap_reserve(&r->tensors);
    IdSlot *slot = idmap_slot(&r->tensors, ev->id);
    if (G_UNLIKELY(slot->key1 != 0))
        return FAST_NO;
    r->cur_stream = ev->stream;
    r->saw_oom = FALSE;
    memsim_addr_t addr = 0;
    if (G_UNLIKELY(r->a_malloc(r->a_state, ev->size, ev->stream, &addr) != MEMSIM_ALLOC_OK)) {
        out_of_memory(r, h, index, ev);
        return G_UNLIKELY(g_atomic_int_get(&r->rp->over_limit)) ? FAST_OVER : FAST_OOM;
    }
    alloc_done(r, h, index, ev, slot, addr);
    return G_UNLIKELY(g_atomic_int_get(&r->rp->over_limit)) ? FAST_OVER : FAST_DONE;
}

static inline gboolean fast_free(RankSim *r, const MemsimEvent *ev)
{
    IdVal v;
    if (G_UNLIKELY(!idmap_remove(&r->tensors, ev->id, &v)))
        return FALSE;
    r->cur_stream = ev->stream;
    free_done(r, &v);
    return TRUE;
}

/* An op of a repetition run again for its memory (memory_rep; not one outside the table):
 * step() took it once; what the memory's reports read (which op runs, its phase). */
static inline void memory_op(RankSim *r, const MemsimTraceHeader *h, uint64_t index,
                             const MemsimEvent *ev)
{
    r->cur_stream = ev->stream;
    const MemsimOpInfo *op = &h->ops[ev->id];
    r->cur_op = (int64_t)ev->id;
    if (op->microbatch > r->mb_top)
        r->mb_top = op->microbatch;
    if (op->phase != r->cur_phase) {
        r->cur_phase = op->phase < MEMSIM_PHASE_COUNT ? op->phase : 0;
        MemsimAllocStats st = memsim_alloc_stats(r->alloc);
        track_peaks(r, h, index, &st);
    }
}

static gboolean bad(GError **error, const MemsimTraceHeader *h, guint32 rank, uint64_t index,
                    const char *fmt, ...) G_GNUC_PRINTF(5, 6);

static gboolean bad(GError **error, const MemsimTraceHeader *h, guint32 rank, uint64_t index,
                    const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: rank %u, event %" PRIu64 ": %s",
                h->name && *h->name ? h->name : "trace", rank, index, msg);
    return FALSE;
}

/* A REPEAT's counts within what a replay takes: at most 2^40 events and repetitions, and ids
 * that its repetitions move stay below 2^64. */
static gboolean repeat_in_range(const MemsimTraceHeader *h, guint32 rank, uint64_t index,
                                const MemsimEvent *ev, GError **error)
{
    if (ev->aux > ((uint64_t)1 << 40) || ev->size > ((uint64_t)1 << 40) ||
        (ev->addr && (ev->aux + 1) > UINT64_MAX / ev->addr))
        return bad(error, h, rank, index,
                   "repeat of %" PRIu64 " events %" PRIu64 " times by %" PRIu64
                   " ids is out of range",
                   ev->size, ev->aux, ev->addr);
    return TRUE;
}

/* The timeline (opt.timeline): an op starts, or the figures after an action. */
static void timeline_note(RankSim *r, const MemsimTraceHeader *h, guint32 rank, uint64_t index,
                          const MemsimEvent *ev)
{
    MemsimTimeline *tl = r->rp->opt.timeline;
    if (ev->kind == MEMSIM_EV_OP) {
        /* a timed op just ended its stream's work; an untimed one runs at the host's time.
         * Noted with the next event: a recv right after it may end it later. */
        double dur = h->ops[r->cur_op].bound == MEMSIM_BOUND_HOST ? 0.0
                                                                   : h->ops[r->cur_op].duration_us;
        double end = dur > 0.0 ? *stream_slot(r->last_end, ev->stream) : r->cpu_us;
        r->tl_held = TRUE;
        r->tl_event = index;
        r->tl_op = r->cur_op;
        r->tl_stream = ev->stream;
        r->tl_start = dur > 0.0 ? end - dur : end;
        r->tl_end = end;
    } else if (ev->kind == MEMSIM_EV_ALLOC && r->stopped) {
        const MemsimOomInfo *o = &r->rep.oom;
        memsim_timeline_oom(tl, h, rank, index, r->cpu_us, r->cur_op, o->requested,
                            (int64_t)o->allocated, (int64_t)o->reserved, r->live_cat);
    } else if (ev->kind != MEMSIM_EV_USE) {
        MemsimAllocStats st = memsim_alloc_stats(r->alloc);
        memsim_timeline_sample(tl, h, rank, index, r->cpu_us, r->cur_op, st.allocated.current,
                               st.reserved.current, r->live_cat);
    }
}

/* The timeline's held op slice, now. */
static void timeline_flush_op(RankSim *r, const MemsimTraceHeader *h, guint32 rank)
{
    r->tl_held = FALSE;
    memsim_timeline_op(r->rp->opt.timeline, h, rank, r->tl_event, r->tl_op, r->tl_stream,
                       r->tl_start, r->tl_end);
}

static inline gboolean is_peer_recv(const MemsimEvent *ev)
{
    return ev->kind == MEMSIM_EV_COLLECTIVE && (ev->flags & MEMSIM_EVF_PEER) &&
           ev->aux == MEMSIM_COLL_RECV;
}

/* Rank `rank`'s recv (r->wait_*) meets a send that started at `start` and takes `dur`: the
 * recv's stream is busy until both have started and the longer of the two has run. */
static void recv_done(RankSim *r, const MemsimTraceHeader *h, guint32 rank, double start,
                      double dur)
{
    double end = MAX(r->wait_start, start) + MAX(r->wait_dur, dur);
    if (start > r->wait_start && r->steps->len) /* idle until the neighbour sent: a bubble */
        g_array_index(r->steps, MemsimStepPeaks, r->steps->len - 1).bubble_us +=
            start - r->wait_start;
    double *fr = stream_slot(r->gpu_free, r->wait_stream);
    double *le = stream_slot(r->last_end, r->wait_stream);
    if (G_UNLIKELY(r->watch)) {
        watch_max(r, clock_bit(CLK_FREE, r->wait_stream), *fr, end);
        watch_max(r, clock_bit(CLK_END, r->wait_stream), *le, end);
    }
    if (end > *fr)
        *fr = end;
    if (end > *le)
        *le = end;
    if (r->tl_held) {
        if (r->tl_event + 1 == r->wait_event && end > r->tl_end)
            r->tl_end = end;
        timeline_flush_op(r, h, rank);
    }
    if (r->waiting) {
        r->waiting = FALSE;
        r->rp->woken = TRUE;
    }
}

/* A send or recv with a peer (MEMSIM_EVF_PEER). Its start and duration are those of the
 * timed op right before it on its stream (how the generator writes a collective: the OP, then
 * the COLLECTIVE); without one it starts where its stream is and takes no time. */
static gboolean meet(RankSim *r, const MemsimTraceHeader *h, guint32 rank, uint64_t index,
                     const MemsimEvent *ev, GError **error)
{
    MemsimReplay *rp = r->rp;
    if (ev->aux != MEMSIM_COLL_SEND && ev->aux != MEMSIM_COLL_RECV)
        return bad(error, h, rank, index, "%s with a peer (only send and recv have one)",
                   memsim_collective_name(ev->aux));
    if (ev->addr >= rp->n_ranks || ev->addr == rank)
        return bad(error, h, rank, index,
                   "%s with peer %" PRIu64 ", not another rank of the trace (%u ranks)",
                   memsim_collective_name(ev->aux), ev->addr, rp->n_ranks);
    uint32_t peer = (uint32_t)ev->addr;
    double start, dur;
    if (r->op_next == index && r->op_stream == ev->stream) {
        start = r->op_start;
        dur = r->op_dur;
    } else {
        start = MAX(r->cpu_us, MAX(*stream_slot(r->gpu_free, ev->stream),
                                   *stream_slot(r->wait_until, ev->stream)));
        dur = 0.0;
        if (G_UNLIKELY(r->watch))
            watch_start(r, ev->stream, r->cpu_us, *stream_slot(r->gpu_free, ev->stream),
                        *stream_slot(r->wait_until, ev->stream), start);
    }
    if (ev->aux == MEMSIM_COLL_SEND) {
        RankSim *q = &rp->ranks[peer];
        if (q->waiting && q->wait_peer == rank) { /* it waits for this very send */
            recv_done(q, h, peer, start, dur);
            return TRUE;
        }
        gint64 key = (gint64)((uint64_t)rank << 32 | peer);
        Channel *c = g_hash_table_lookup(rp->channels, &key);
        if (!c) {
            c = g_new0(Channel, 1);
            c->sent = g_array_new(FALSE, FALSE, sizeof(Sent));
            g_hash_table_insert(rp->channels, g_memdup2(&key, sizeof key), c);
        }
        if (c->head == c->sent->len) {
            g_array_set_size(c->sent, 0);
            c->head = 0;
        }
        Sent sn = {start, dur};
        g_array_append_val(c->sent, sn);
        return TRUE;
    }
    r->wait_peer = peer;
    r->wait_stream = ev->stream;
    r->wait_event = index;
    r->wait_start = start;
    r->wait_dur = dur;
    gint64 key = (gint64)((uint64_t)peer << 32 | rank);
    Channel *c = g_hash_table_lookup(rp->channels, &key);
    if (c && c->head < c->sent->len) {
        Sent sn = g_array_index(c->sent, Sent, c->head++);
        recv_done(r, h, rank, sn.start, sn.dur);
    } else {
        r->waiting = TRUE; /* parked until the send comes */
    }
    return TRUE;
}

/* The first recorded OOM: what the recording says. */
static void record_oom(RankSim *r, uint64_t index, const MemsimEvent *ev)
{
    MemsimAllocStats st = memsim_alloc_stats(r->alloc);
    MemsimOomInfo *o = &r->rep.recorded_oom;
    o->happened = TRUE;
    o->event_index = index;
    o->requested = ev->size;
    o->rounded = ev->size;
    o->device_free = ev->addr;
    o->allocated = (memsim_size_t)st.allocated.current;
    o->reserved = (memsim_size_t)st.reserved.current;
    o->stream = ev->stream;
    o->op = r->cur_op;
}

/* The recorded OOM's request asked of the policy at the rank's capacity
 * (MemsimOomVerdict). The record carries the request as the allocator rounded it
 * (c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc: record_trace(OOM,
 * device_free, params.size(), ...)), which torch's rounding leaves as it is. */
static void replay_recorded_oom(RankSim *r, const MemsimTraceHeader *h, uint64_t index,
                                const MemsimEvent *ev)
{
    MemsimOomVerdict *v = &r->rep.oom_verdict;
    v->replayed = TRUE;
    v->event_index = index;
    v->rounded = ev->size;
    v->capacity = r->rep.capacity;
    memsim_addr_t addr = 0;
    r->saw_oom = FALSE;
    gboolean ok = ev->size > 0 &&
                  memsim_alloc_malloc(r->alloc, ev->size, ev->stream, &addr) == MEMSIM_ALLOC_OK;
    MemsimAllocStats st = memsim_alloc_stats(r->alloc);
    v->fits = ok;
    v->allocated = (memsim_size_t)st.allocated.current;
    v->reserved = (memsim_size_t)st.reserved.current;
    v->device_free = v->capacity > v->reserved ? v->capacity - v->reserved : 0;
    v->cached_free = v->reserved > v->allocated ? v->reserved - v->allocated : 0;
    if (ok) {
        v->margin = v->device_free;
        track_peaks(r, h, index, &st); /* the block counts while it lives */
        memsim_alloc_free(r->alloc, addr);
        r->last_allocated = memsim_alloc_stats(r->alloc).allocated.current;
    } else {
        note_oom_sites(r, index);
        memsim_size_t need = ev->size > 0 ? memsim_alloc_round_size(r->alloc, ev->size) : 0;
        v->margin = need > v->device_free ? need - v->device_free : 0;
        v->short_packed = v->margin > v->cached_free ? v->margin - v->cached_free : 0;
    }
}

static gboolean step(RankSim *r, const MemsimTraceHeader *h, guint32 rank, uint64_t index,
                     const MemsimEvent *ev, GError **error)
{
    r->cur_stream = ev->stream;
    const MemsimReplayHooks *hk = r->rp->opt.hooks;
    if (hk && hk->on_event)
        hk->on_event(hk->user, h, rank, index, ev);
    if (G_UNLIKELY(r->tl_held) && !is_peer_recv(ev))
        timeline_flush_op(r, h, rank);
    gboolean action = TRUE;
    switch (ev->kind) {
    case MEMSIM_EV_ALLOC: {
        if (ev->size == 0)
            return bad(error, h, rank, index, "alloc of tensor %" PRIu64 " has size 0", ev->id);
        if (ev->size >= ((uint64_t)1 << 60))
            return bad(error, h, rank, index,
                       "alloc of %" PRIu64 " bytes is beyond any device (≥ 2^60)", ev->size);
        if (ev->category >= MEMSIM_CAT_COUNT)
            return bad(error, h, rank, index, "category %u is out of range", ev->category);
        if (ev->id == UINT64_MAX || idmap_get(&r->tensors, ev->id))
            return bad(error, h, rank, index, "alloc of tensor %" PRIu64 ", which is live",
                       ev->id);
        memsim_addr_t addr = 0;
        r->saw_oom = FALSE;
        if (memsim_alloc_malloc(r->alloc, ev->size, ev->stream, &addr) != MEMSIM_ALLOC_OK) {
            out_of_memory(r, h, index, ev);
            if (G_UNLIKELY(g_atomic_int_get(&r->rp->over_limit)))
                return over_limit(error);
            break;
        }
        idmap_reserve(&r->tensors);
        alloc_done(r, h, index, ev, idmap_slot(&r->tensors, ev->id), addr);
        if (G_UNLIKELY(g_atomic_int_get(&r->rp->over_limit)))
            return over_limit(error);
        break;
    }
    case MEMSIM_EV_FREE: {
        IdVal v;
        if (!idmap_remove(&r->tensors, ev->id, &v))
            return bad(error, h, rank, index, "free of tensor %" PRIu64 ", which is not live",
                       ev->id);
        if (hk && hk->on_free) {
            MemsimReplayTensor t = {v.addr, v.req, v.stream, v.category};
            hk->on_free(hk->user, rank, index, r->cur_op, &t);
        }
        free_done(r, &v);
        break;
    }
    case MEMSIM_EV_USE: {
        IdVal *v = idmap_get(&r->tensors, ev->id);
        if (!v)
            return bad(error, h, rank, index, "use of tensor %" PRIu64 ", which is not live",
                       ev->id);
        memsim_alloc_record_stream(r->alloc, v->addr, ev->stream);
        break;
    }
    case MEMSIM_EV_EMPTY_CACHE:
        memsim_alloc_empty_cache(r->alloc);
        break;
    case MEMSIM_EV_INIT_SEGMENT: {
        if (!memsim_alloc_seed_segment(r->alloc, ev->addr, ev->size, ev->stream, (uint32_t)ev->aux,
                                       error))
            return FALSE;
        Range *g = g_new(Range, 1);
        g->addr = ev->addr;
        g->end = ev->addr + ev->size;
        if (g->end < g->addr || g_tree_lookup(r->segments, g)) {
            g_free(g);
            return bad(error, h, rank, index, "starting segment at 0x%" PRIx64
                       " overlaps another", ev->addr);
        }
        g_tree_insert(r->segments, g, g);
        MemsimAllocStats st = memsim_alloc_stats(r->alloc);
        track_peaks(r, h, index, &st);
        action = FALSE;
        break;
    }
    case MEMSIM_EV_INIT_BLOCK: {
        if (ev->id == UINT64_MAX || idmap_get(&r->tensors, ev->id))
            return bad(error, h, rank, index, "starting block of tensor %" PRIu64
                       ", which is live", ev->id);
        if (ev->category >= MEMSIM_CAT_COUNT)
            return bad(error, h, rank, index, "category %u is out of range", ev->category);
        int64_t before = memsim_alloc_stats(r->alloc).allocated.current;
        if (!memsim_alloc_seed_block(r->alloc, ev->addr, ev->aux, ev->size, ev->stream, error))
            return FALSE;
        MemsimAllocStats st = memsim_alloc_stats(r->alloc);
        IdVal v = {ev->addr, (uint64_t)(st.allocated.current - before), ev->size, ev->category,
                   ev->stream, SITE_NONE};
        v.site = site_named(r, "(before the trace)");
        site_move(r, v.site, v.size, 1, ev->category);
        idmap_put(&r->tensors, ev->id, &v);
        live_in(r, &v);
        track_peaks(r, h, index, &st);
        action = FALSE;
        break;
    }
    case MEMSIM_EV_OP: {
        if (ev->id >= h->n_ops)
            return bad(error, h, rank, index, "op %" PRIu64 " is not in the op table (%u ops)",
                       ev->id, h->n_ops);
        r->cur_op = (int64_t)ev->id;
        if (h->ops[ev->id].microbatch > r->mb_top)
            r->mb_top = h->ops[ev->id].microbatch;
        double dur = r->rp->opt.untimed || r->memory_only ? 0.0 : h->ops[ev->id].duration_us;
        if (h->ops[ev->id].bound == MEMSIM_BOUND_HOST) {
            /* host time without a kernel: the host's clock moves, no stream's */
            r->cpu_us += dur;
            if (r->steps->len)
                g_array_index(r->steps, MemsimStepPeaks, r->steps->len - 1).host_us += dur;
            dur = -1.0; /* neither dispatched nor run on a stream */
        }
        /* With a profile's dispatch cost (a generated trace), every op the program runs is
         * dispatched by the host, kernels or not (views, autograd nodes); without one, the
         * timed ops are charged LAUNCH_US. */
        if (dur == 0.0 && r->rp->opt.dispatch_us > 0 && !r->rp->opt.untimed &&
            !r->memory_only) {
            r->cpu_us += r->rp->opt.dispatch_us;
            if (r->steps->len)
                g_array_index(r->steps, MemsimStepPeaks, r->steps->len - 1).host_us +=
                    r->rp->opt.dispatch_us;
        }
        if (dur > 0.0) {
            double launch = r->rp->opt.dispatch_us > 0 ? r->rp->opt.dispatch_us : LAUNCH_US;
            r->cpu_us += launch;
            if (r->steps->len) {
                MemsimStepPeaks *cs =
                    &g_array_index(r->steps, MemsimStepPeaks, r->steps->len - 1);
                cs->host_us += launch;
                if (h->ops[ev->id].phase == MEMSIM_PHASE_COMMUNICATION)
                    cs->comm_us += dur;
                else if (h->ops[ev->id].bound == MEMSIM_BOUND_COMPUTE)
                    cs->compute_us += dur;
                else if (h->ops[ev->id].bound == MEMSIM_BOUND_LATENCY)
                    cs->latency_us += dur;
                else
                    cs->memory_us += dur;
            }
            double start = r->cpu_us;
            double *fr = stream_slot(r->gpu_free, ev->stream);
            double *wu = stream_slot(r->wait_until, ev->stream);
            if (*fr > start)
                start = *fr;
            if (*wu > start)
                start = *wu;
            if (G_UNLIKELY(r->watch)) {
                watch_start(r, ev->stream, r->cpu_us, *fr, *wu, start);
                clock_note(r, clock_bit(CLK_FREE, ev->stream), FALSE, TRUE);
                clock_note(r, clock_bit(CLK_END, ev->stream), FALSE, TRUE);
            }
            *fr = start + dur;
            *stream_slot(r->last_end, ev->stream) = start + dur;
            r->op_next = index + 1;
            r->op_stream = ev->stream;
            r->op_start = start;
            r->op_dur = dur;
        }
        if (h->ops[ev->id].phase != r->cur_phase) {
            r->cur_phase = h->ops[ev->id].phase < MEMSIM_PHASE_COUNT ? h->ops[ev->id].phase : 0;
            MemsimAllocStats st = memsim_alloc_stats(r->alloc);
            track_peaks(r, h, index, &st);
        }
        action = FALSE;
        break;
    }
    case MEMSIM_EV_SEG_ALLOC:
    case MEMSIM_EV_SEG_FREE:
    case MEMSIM_EV_SEG_MAP:
    case MEMSIM_EV_SEG_UNMAP: {
        g_array_append_val(r->expected, *ev);
        gboolean no = FALSE;
        g_array_append_val(r->claimed, no);
        return TRUE;
    }
    case MEMSIM_EV_OOM:
        if (!r->rep.recorded_oom.happened && r->rep.capacity) {
            record_oom(r, index, ev);
            replay_recorded_oom(r, h, index, ev);
            break; /* an action: what the policy did for it is verified */
        }
        if (!r->rep.recorded_oom.happened)
            record_oom(r, index, ev);
        return TRUE;
    case MEMSIM_EV_MARK: {
        if (ev->id >= h->n_strings)
            return bad(error, h, rank, index, "mark %" PRIu64 " is not in the string table",
                       ev->id);
        uint32_t step;
        const char *name;
        MemsimMarkKind kind = memsim_mark_parse(h->strings[ev->id], &step, &name);
        if (kind == MEMSIM_MARK_BREAKDOWN) {
            MemsimBreakdown bd;
            memset(&bd, 0, sizeof bd);
            g_strlcpy(bd.name, name, sizeof bd.name);
            memcpy(bd.allocated, r->live_cat, sizeof r->live_cat);
            memcpy(bd.requested, r->live_req, sizeof r->live_req);
            g_array_append_val(r->breakdowns, bd);
        } else if (kind == MEMSIM_MARK_STEP) {
            const uint64_t bump = (uint64_t)r->step_bump + r->outer_bump;
            if ((uint64_t)step + bump > G_MAXUINT32)
                return bad(error, h, rank, index, "a repetition moves step %u past %u", step,
                           G_MAXUINT32);
            MemsimStepPeaks sp = {.step = (uint32_t)(step + bump), .start_us = r->cpu_us};
            for (guint k = 0; k < r->last_end->len; k++)
                if (g_array_index(r->last_end, double, k) > sp.start_us)
                    sp.start_us = g_array_index(r->last_end, double, k);
            sp.start_us += r->t_offset;
            for (int p = 0; p < MEMSIM_PHASE_COUNT; p++)
                sp.phase_peak_allocated[p] = sp.phase_peak_reserved[p] = -1;
            g_array_append_val(r->steps, sp);
            MemsimAllocStats st = memsim_alloc_stats(r->alloc);
            track_peaks(r, h, index, &st);
        }
        return TRUE;
    }
    case MEMSIM_EV_WAIT: {
        if (ev->id >= 65536)
            return bad(error, h, rank, index, "wait on stream %" PRIu64 " (out of range)", ev->id);
        if (r->memory_only)
            return TRUE;
        double end = *stream_slot(r->last_end, (uint32_t)ev->id);
        if (G_UNLIKELY(r->watch)) {
            double *to = ev->flags & MEMSIM_EVF_HOST ? &r->cpu_us
                                                     : stream_slot(r->wait_until, ev->stream);
            clock_note(r, clock_bit(CLK_END, (uint32_t)ev->id), end >= *to, FALSE);
            watch_max(r, ev->flags & MEMSIM_EVF_HOST ? 0 : clock_bit(CLK_WAIT, ev->stream), *to,
                      end);
        }
        if (ev->flags & MEMSIM_EVF_HOST) {
            if (end > r->cpu_us)
                r->cpu_us = end; /* the host blocks (synchronize) */
        } else {
            double *wu = stream_slot(r->wait_until, ev->stream);
            if (end > *wu)
                *wu = end;
        }
        return TRUE;
    }
    case MEMSIM_EV_REPEAT:
        /* not an event of the program: the indices stay those of the events it stands for */
        r->rep.n_events--;
        if (ev->flags & MEMSIM_EVF_STEPS)
            return outer_start(r, h, rank, index, ev, error);
        if (r->capturing)
            return bad(error, h, rank, index, "repeat inside the unit of another repeat");
        pre_mark(r, ev);
        if (ev->aux > 0 && ev->size > 0) {
            if (!repeat_in_range(h, rank, index, ev, error))
                return FALSE;
            r->capturing = TRUE;
            r->unit_index = index;
            r->unit_len = ev->size;
            r->unit_times = ev->aux;
            r->unit_from = ev->id;
            r->unit_shift = ev->addr;
            g_array_set_size(r->unit, 0);
            steady_pre(r);
        }
        return TRUE;
    case MEMSIM_EV_COLLECTIVE:
        if (ev->aux >= MEMSIM_COLL_COUNT)
            return bad(error, h, rank, index, "collective kind %" PRIu64 " is out of range",
                       ev->aux);
        if (G_UNLIKELY(ev->flags & MEMSIM_EVF_PEER) && !r->memory_only)
            return meet(r, h, rank, index, ev, error);
        return TRUE;
    default:
        return bad(error, h, rank, index, "unknown event kind %u", ev->kind);
    }
    if (G_UNLIKELY(r->rp->opt.timeline))
        timeline_note(r, h, rank, index, ev);
    if (action && r->rp->opt.verify) {
        verify_action(r, index, ev);
        g_array_set_size(r->emitted, 0);
    } else if (r->rp->opt.verify) {
        g_array_set_size(r->emitted, 0);
    }
    if (r->rp->opt.check_invariants) {
        GError *e = NULL;
        if (!memsim_alloc_check(r->alloc, &e)) {
            g_error("%s: rank %u, event %" PRIu64 ": allocator invariant broken: %s",
                    h->name ? h->name : "trace", rank, index, e->message);
        }
    }
    return TRUE;
}

/* ---- steady state (MEMSIM_EV_REPEAT) ----
 *
 * A generated trace says that a unit (a micro-batch) runs again `times` more times, its own
 * tensors' ids moved by `shift` each time. The unit is captured as it runs; then each
 * repetition runs with its ids moved, and after each one the replay compares what decides
 * the next: the allocator's blocks (segments, free and allocated blocks, their streams and
 * sizes: the caching allocator's free sets are ordered by those alone), its statistics
 * (current values, peaks and counters), the live tensors (their blocks, with the unit's ids
 * taken back to the template's), the bytes by category, the peaks the report keeps, and
 * the clocks of the host and the streams relative to the host. When they are equal to what
 * they were before that repetition, every later repetition starts from the same state and
 * does the same: none raises a peak; each adds the same time. They are then added instead of
 * run. When the state drifts (the cache still settling), the repetitions run one by one. */

typedef struct {
    uint64_t id;
    IdVal v;
} LiveId;

struct SteadyState {
    GArray *blocks; /* MemsimBlockInfo */
    GArray *live;   /* LiveId, by id */
    MemsimAllocStats st;
    int64_t live_cat[MEMSIM_CAT_COUNT], live_req[MEMSIM_CAT_COUNT];
    int64_t best_allocated, best_reserved, last_allocated;
    uint64_t epoch;
    int64_t cur_op;
    uint8_t cur_phase;
    guint n_steps, n_breakdowns;
    MemsimStepPeaks step;
    double cpu_us;
    GArray *clocks; /* double: cpu_us, gpu_free, last_end, wait_until */
    guint n_clocks[3]; /* the lengths of the three arrays */
    gboolean pending; /* a block waits for a stream event: its token is an absolute time */
    uint64_t ev_hash; /* the stream events of the repetition that led here */
};

static void add_block(void *user, const MemsimBlockInfo *b)
{
    SteadyState *s = user;
    if (b->state == MEMSIM_BLOCK_PENDING_FREE)
        s->pending = TRUE;
    MemsimBlockInfo c;
    memset(&c, 0, sizeof c); /* the padding too: blocks are compared with memcmp */
    c.segment = b->segment;
    c.segment_size = b->segment_size;
    c.stream = b->stream;
    c.segment_flags = b->segment_flags;
    c.addr = b->addr;
    c.size = b->size;
    /* a free block's request is the last one it served: nothing reads it but a listing of
     * the blocks (a snapshot export), which a skipping replay does not make */
    c.requested = b->state == MEMSIM_BLOCK_FREE || b->state == MEMSIM_BLOCK_UNMAPPED
                      ? 0
                      : b->requested;
    c.state = b->state;
    g_array_append_val(s->blocks, c);
}

static gint live_cmp(gconstpointer a, gconstpointer b)
{
    const LiveId *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void clocks_add(GArray *c, GArray *a)
{
    g_array_append_vals(c, a->data, a->len);
}

/* The state after a repetition whose ids were moved by `moved`. */
static void steady_take(RankSim *r, SteadyState *s, uint64_t from, uint64_t moved)
{
    g_array_set_size(s->blocks, 0);
    g_array_set_size(s->live, 0);
    g_array_set_size(s->clocks, 0);
    s->pending = FALSE;
    memsim_alloc_foreach_block(r->alloc, add_block, s);
    s->st = memsim_alloc_stats(r->alloc);
    for (size_t i = 0; i <= r->tensors.mask; i++) {
        const IdSlot *sl = &r->tensors.slots[i];
        if (!sl->key1)
            continue;
        LiveId l = {sl->key1 - 1, sl->val};
        if (l.id >= from + moved)
            l.id -= moved;
        g_array_append_val(s->live, l);
    }
    g_array_sort(s->live, live_cmp);
    memcpy(s->live_cat, r->live_cat, sizeof s->live_cat);
    memcpy(s->live_req, r->live_req, sizeof s->live_req);
    s->best_allocated = r->best_allocated;
    s->best_reserved = r->best_reserved;
    s->last_allocated = r->last_allocated;
    s->epoch = r->epoch;
    s->cur_op = r->cur_op;
    s->cur_phase = r->cur_phase;
    s->n_steps = r->steps->len;
    s->n_breakdowns = r->breakdowns->len;
    memset(&s->step, 0, sizeof s->step);
    if (r->steps->len)
        s->step = g_array_index(r->steps, MemsimStepPeaks, r->steps->len - 1);
    s->cpu_us = r->cpu_us;
    s->ev_hash = r->ev_hash;
    g_array_append_val(s->clocks, r->cpu_us);
    GArray *arrays[3] = {r->gpu_free, r->last_end, r->wait_until};
    for (int c = 0; c < 3; c++) {
        clocks_add(s->clocks, arrays[c]);
        s->n_clocks[c] = arrays[c]->len;
    }
}

static gboolean live_equal(const GArray *a, const GArray *b)
{
    if (a->len != b->len)
        return FALSE;
    for (guint i = 0; i < a->len; i++) {
        const LiveId *x = &g_array_index(a, LiveId, i), *y = &g_array_index(b, LiveId, i);
        if (x->id != y->id || x->v.addr != y->v.addr || x->v.size != y->v.size ||
            x->v.req != y->v.req || x->v.category != y->v.category ||
            x->v.stream != y->v.stream || x->v.site != y->v.site)
            return FALSE;
    }
    return TRUE;
}

/* Whether the memory state after a repetition (b) is the one before it (a), b holding
 * `dsteps` more steps (a unit of whole steps) and its last step the peaks of a's. */
static gboolean steady_equal(const SteadyState *a, const SteadyState *b, uint64_t dsteps)
{
    return a->pending == b->pending && a->blocks->len == b->blocks->len &&
           !memcmp(a->blocks->data, b->blocks->data, a->blocks->len * sizeof(MemsimBlockInfo)) &&
           !memcmp(&a->st, &b->st, sizeof a->st) && live_equal(a->live, b->live) &&
           !memcmp(a->live_cat, b->live_cat, sizeof a->live_cat) &&
           !memcmp(a->live_req, b->live_req, sizeof a->live_req) &&
           a->best_allocated == b->best_allocated && a->best_reserved == b->best_reserved &&
           a->last_allocated == b->last_allocated && a->epoch == b->epoch &&
           a->cur_op == b->cur_op && a->cur_phase == b->cur_phase &&
           (uint64_t)a->n_steps + dsteps == b->n_steps &&
           a->n_breakdowns == b->n_breakdowns && a->step.peak_allocated == b->step.peak_allocated &&
           a->step.peak_reserved == b->step.peak_reserved &&
           !memcmp(a->step.phase_peak_allocated, b->step.phase_peak_allocated,
                   sizeof a->step.phase_peak_allocated) &&
           !memcmp(a->step.phase_peak_reserved, b->step.phase_peak_reserved,
                   sizeof a->step.phase_peak_reserved) &&
           !memcmp(a->n_clocks, b->n_clocks, sizeof a->n_clocks);
}

static inline gboolean near(double x, double y, double scale)
{
    double d = x - y, tol = 1e-9 * (1.0 + (scale > 0 ? scale : -scale));
    return d <= tol && d >= -tol;
}

/* Whether the clocks go on as they went over the last period (a → b; z → a the period
 * before). With blocks used on other streams (record_stream) a free waits for an event whose
 * completion the host's clock decides: the clocks must be the same relative to the host, so
 * that each wait ends as it did, and the allocator must have asked the same about the same
 * events (ev_hash). Without, time does not touch memory: each clock must have moved by what it
 * moved over the period before. */
static gboolean steady_clocks(const SteadyState *z, const SteadyState *a, const SteadyState *b,
                              uint64_t hash_ab, uint64_t hash_za, gboolean uses)
{
    const double *x = (const double *)a->clocks->data, *y = (const double *)b->clocks->data;
    if (uses) {
        /* a clock behind the host is as good as the host's: work issued from now on starts
         * at the host's time at the earliest, and an event recorded on it is done */
        for (guint k = 1; k < b->clocks->len; k++)
            if (!near(x[k] > x[0] ? x[k] - x[0] : 0.0, y[k] > y[0] ? y[k] - y[0] : 0.0, y[0]))
                return FALSE;
        return hash_ab == hash_za;
    }
    if (z->clocks->len != b->clocks->len || a->pending || b->pending)
        return FALSE;
    const double *w = (const double *)z->clocks->data;
    for (guint k = 0; k < b->clocks->len; k++)
        if (!near(x[k] - w[k], y[k] - x[k], y[k]))
            return FALSE;
    return TRUE;
}

static void steady_init(SteadyState *s)
{
    memset(s, 0, sizeof *s);
    s->blocks = g_array_new(FALSE, FALSE, sizeof(MemsimBlockInfo));
    s->live = g_array_new(FALSE, FALSE, sizeof(LiveId));
    s->clocks = g_array_new(FALSE, FALSE, sizeof(double));
}

static void steady_clear(SteadyState *s)
{
    g_array_unref(s->blocks);
    g_array_unref(s->live);
    g_array_unref(s->clocks);
}

/* Whether the replay may add repetitions instead of running them: nothing watches each
 * event (a timeline, verification, hooks, invariant checks), the policy is the caching
 * allocator whose state the blocks show (without garbage collection, whose block ages they do
 * not), and the unit meets no other rank and marks nothing. */
/* Whether the replay's options and policy let repetitions be added instead of run: nothing
 * watches each event, and the torch policy's state (without its garbage collection's ages)
 * is what steady_take compares. */
static gboolean steady_options_allow(const RankSim *r)
{
    const MemsimReplayOptions *o = &r->rp->opt;
    if (o->timeline || o->verify || o->hooks || o->check_invariants)
        return FALSE;
    return strcmp(memsim_alloc_ops(r->alloc)->name, "torch") == 0 &&
           !(r->rp->allocator && strstr(r->rp->allocator, "garbage_collection"));
}

static gboolean steady_may_skip(RankSim *r)
{
    if (!steady_options_allow(r))
        return FALSE;
    uint32_t marks = 0;
    for (guint i = 0; i < r->unit->len; i++) {
        uint8_t k = g_array_index(r->unit, MemsimEvent, i).kind;
        marks += k == MEMSIM_EV_MARK;
        if (k != MEMSIM_EV_ALLOC && k != MEMSIM_EV_FREE && k != MEMSIM_EV_USE &&
            k != MEMSIM_EV_OP && k != MEMSIM_EV_WAIT && k != MEMSIM_EV_COLLECTIVE &&
            k != MEMSIM_EV_MARK)
            return FALSE;
    }
    /* a step's marks only (unit_steps): the steps added are copies of the last ones */
    return marks == r->unit_steps;
}

/* Live tensors of the last repetition (ids ≥ from + moved) take back the template's ids. */
static gboolean steady_rename(RankSim *r, uint64_t from, uint64_t moved)
{
    return idmap_move_down(&r->tensors, from + moved, moved);
}

static gboolean run(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 rank,
                    const MemsimEvent *events, gsize n, gsize *used, GError **error);

static void step_sums(RankSim *r, double *v)
{
    memset(v, 0, N_SUMS * sizeof *v);
    if (!r->steps->len)
        return;
    const MemsimStepPeaks *sp = &g_array_index(r->steps, MemsimStepPeaks, r->steps->len - 1);
    v[0] = sp->compute_us;
    v[1] = sp->memory_us;
    v[2] = sp->latency_us;
    v[3] = sp->comm_us;
    v[4] = sp->host_us;
    v[5] = sp->bubble_us;
}

/* Adds `times` × (v − u) to the step's work sums. */
static void step_sums_add(RankSim *r, const double *u, const double *v, double times)
{
    if (!r->steps->len)
        return;
    MemsimStepPeaks *sp = &g_array_index(r->steps, MemsimStepPeaks, r->steps->len - 1);
    sp->compute_us += times * (v[0] - u[0]);
    sp->memory_us += times * (v[1] - u[1]);
    sp->latency_us += times * (v[2] - u[2]);
    sp->comm_us += times * (v[3] - u[3]);
    sp->host_us += times * (v[4] - u[4]);
    sp->bubble_us += times * (v[5] - u[5]);
}

/* The state before a unit's first run: the period before the first repetition's. */
static void steady_pre(RankSim *r)
{
    if (!r->unit_pre) {
        r->unit_pre = g_new(SteadyState, 1);
        steady_init(r->unit_pre);
    }
    steady_take(r, r->unit_pre, r->unit_from, 0);
    step_sums(r, r->unit_pre_sums);
}

/* The clocks alone (a placeholder's: repeat_skip_first's period before the template's). */
static void clocks_take(RankSim *r, SteadyState *s)
{
    g_array_set_size(s->clocks, 0);
    s->pending = FALSE;
    s->cpu_us = r->cpu_us;
    g_array_append_val(s->clocks, r->cpu_us);
    GArray *arrays[3] = {r->gpu_free, r->last_end, r->wait_until};
    for (int c = 0; c < 3; c++) {
        clocks_add(s->clocks, arrays[c]);
        s->n_clocks[c] = arrays[c]->len;
    }
}

/* The longest unit a placeholder's capture keeps (events). */
#define PRE_MAX (1u << 20)

/* A REPEAT outside a repeat: a placeholder (a unit boundary where no repeat was found, which
 * a generated trace puts before each middle unit) starts capturing the events after it; a
 * repeat ends that, noting whether what came between the two was one unit as long as its
 * (the REPEAT is captured last). */
static void pre_mark(RankSim *r, const MemsimEvent *ev)
{
    if (ev->aux > 0 && ev->size > 0) {
        r->pre_ok = r->pre_on && r->pre->len == ev->size + 1 && !r->outer && !r->repeat &&
                    !r->pump_depth;
        r->pre_on = FALSE;
        return;
    }
    r->pre_ok = FALSE;
    r->pre_on = FALSE;
    /* (a unit of a rank that meets others runs every repetition, or repeats with theirs:
     * cross_cut) */
    if (r->outer || r->repeat || r->pump_depth || r->rp->n_ranks != 1)
        return;
    if (!r->pre) {
        r->pre = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
        r->pre_clocks = g_new(SteadyState, 1);
        steady_init(r->pre_clocks);
    }
    g_array_set_size(r->pre, 0);
    clocks_take(r, r->pre_clocks);
    r->pre_on = TRUE;
}

static void pre_capture(RankSim *r, const MemsimEvent *ev)
{
    if (r->pre->len >= PRE_MAX)
        r->pre_on = FALSE;
    else
        g_array_append_val(r->pre, *ev);
}

/* The most steps a skip of whole steps adds (each a MemsimStepPeaks record). */
#define STEADY_MAX_STEPS ((uint64_t)1 << 20)

/* The states kept: after the last RING repetitions (periods of 1 and 2: a cache that settles
 * into two alternating layouts, e.g. a buffer that moves between two segments). */
#define RING 5

/* The repetitions of a captured unit, run as a rank's events are: they may park at a recv
 * (a pipeline's unit meets its neighbours) and go on where they stopped. */
typedef struct RepeatRun {
    uint64_t rep;  /* the repetition running (1-based) */
    guint pos;     /* its next event */
    gboolean may_skip, uses;
    SteadyState st[RING];
    double sums[RING][N_SUMS];
    uint64_t hashes[RING];
    MemsimEvent *buf;
    guint *mem, n_mem; /* the unit's events memory_rep reads (noted at its first run) */
    uint64_t index; /* the event whose capture completed the unit (for messages) */
    /* the unit meets other ranks and may be skipped with them (cross_cut): the rank waits at
     * the start of each repetition (held_rep: the one it last waited before) */
    gboolean cross;
    uint64_t held_rep;
    uint64_t serial; /* which repeat run of the replay (MemsimReplay.n_repeats) */
} RepeatRun;

static void repeat_free(RankSim *r)
{
    RepeatRun *q = r->repeat;
    if (!q)
        return;
    for (int k = 0; k < RING; k++)
        steady_clear(&q->st[k]);
    g_free(q->buf);
    g_free(q->mem);
    g_free(q);
    r->repeat = NULL;
    r->step_bump = 0;
    r->ev_logging = FALSE;
    r->watch = FALSE;
}

/* How many micro-batches a repetition of the unit moves on by: those its backward ops run (a
 * micro-batch of the loop, a 1F1B pair's one backward, an interleaved unit's group of g: its
 * backwards start at a group's first, its forwards run a warm-up later, across two groups
 * on some stages), at least 1. */
static uint32_t unit_microbatches(RankSim *r, const MemsimTraceHeader *h)
{
    GHashTable *seen = g_hash_table_new(NULL, NULL);
    for (guint i = 0; i < r->unit->len; i++) {
        const MemsimEvent *e = &g_array_index(r->unit, MemsimEvent, i);
        if (e->kind == MEMSIM_EV_OP && e->id < h->n_ops &&
            h->ops[e->id].phase == MEMSIM_PHASE_BACKWARD && h->ops[e->id].microbatch >= 0)
            g_hash_table_add(seen, GINT_TO_POINTER(h->ops[e->id].microbatch + 1));
    }
    uint32_t n = g_hash_table_size(seen);
    g_hash_table_unref(seen);
    return n ? n : 1;
}

/* The micro-batch (0-based) a unit completes: the lowest its ops run in (a pipeline's pair
 * runs a later micro-batch's forward and an earlier one's backward), -1 when none says; *top
 * (when not NULL) the highest, -1 likewise. */
static int32_t unit_microbatch(RankSim *r, const MemsimTraceHeader *h, int32_t *top)
{
    int32_t mb = -1, hi = -1;
    for (guint i = 0; i < r->unit->len; i++) {
        const MemsimEvent *e = &g_array_index(r->unit, MemsimEvent, i);
        if (e->kind != MEMSIM_EV_OP || e->id >= h->n_ops || h->ops[e->id].microbatch < 0)
            continue;
        int32_t m = h->ops[e->id].microbatch;
        if (mb < 0 || m < mb)
            mb = m;
        if (m > hi)
            hi = m;
    }
    if (top)
        *top = hi;
    return mb;
}

static gboolean repeat_skip_first(RankSim *r, const MemsimTraceHeader *h);

/* The captured unit has run once: its repetitions begin. */
static gboolean repeat_begin(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 rank,
                             uint64_t index, GError **error)
{
    RankSim *r = &rp->ranks[rank];
    r->capturing = FALSE;
    const guint K = r->unit->len;
    gboolean uses = FALSE, peer = FALSE;
    for (guint i = 0; i < K; i++) {
        const MemsimEvent *e = &g_array_index(r->unit, MemsimEvent, i);
        if (e->kind == MEMSIM_EV_INIT_SEGMENT || e->kind == MEMSIM_EV_INIT_BLOCK ||
            e->kind == MEMSIM_EV_REPEAT)
            return bad(error, h, rank, index,
                       "the unit of a repeat holds a %s event, which cannot repeat",
                       memsim_event_kind_name(e->kind));
        uses |= e->kind == MEMSIM_EV_USE;
        peer |= e->kind == MEMSIM_EV_COLLECTIVE && (e->flags & MEMSIM_EVF_PEER);
    }
    r->unit_mbs = unit_microbatches(r, h);
    r->unit_steps =
        memsim_step_marks(h, (const MemsimEvent *)(void *)r->unit->data, r->unit->len);
    if (r->unit_steps)
        r->rep.steady_steps_repeated += r->unit_times * r->unit_steps;
    else
        r->rep.steady_repeated += r->unit_times * r->unit_mbs;
    /* the repetitions' ops are the template's (its micro-batch): the micro-batches they run
     * on go as far as the template's plus unit_mbs for each (a loop's last micro-batch may
     * be one of them) */
    int32_t top;
    unit_microbatch(r, h, &top);
    if (top >= 0 && (int64_t)top + (int64_t)(r->unit_times * r->unit_mbs) > r->mb_top)
        r->mb_top = (int32_t)MIN((int64_t)top + (int64_t)(r->unit_times * r->unit_mbs),
                                 (int64_t)G_MAXINT32);
    RepeatRun *q = g_new0(RepeatRun, 1);
    r->repeat = q;
    q->rep = 1;
    q->index = index;
    q->uses = uses;
    /* a unit that meets other ranks runs every repetition (their clocks are tied to its);
     * with record_stream the later repetitions are added as time alone (t_offset): the clocks
     * stay with the allocator's event tokens, which holds for one rank, whose clock meets no
     * other's */
    q->may_skip = steady_may_skip(r) && !peer && !(uses && rp->n_ranks != 1);
    /* ... unless all the ranks it meets repeat with it: their cuts (cross_cut); a block used
     * on another stream would make the memory depend on the clocks the ranks share */
    q->cross = rp->cross && peer && !uses && steady_may_skip(r) && !r->unit_steps;
    r->watch = q->cross;
    r->bound = r->written = 0;
    r->watch_over = FALSE;
    q->serial = ++rp->n_repeats;
    for (int k = 0; k < RING; k++)
        steady_init(&q->st[k]);
    if (q->may_skip) {
        steady_take(r, &q->st[0], r->unit_from, 0);
        step_sums(r, q->sums[0]);
    }
    r->ev_logging = q->may_skip && uses;
    q->buf = g_new(MemsimEvent, K);
    if (repeat_skip_first(r, h))
        q->rep = r->unit_times + 1; /* (repeat_pump runs none and ends the repeat) */
    return TRUE;
}

/* Whether `n` repetitions of `s` steps each can be added as step records after state cur:
 * as many as a trace of a million steps holds, numbered below 2^32 (beyond, they run, where
 * a mark past 2^32 − 1 is refused). */
static gboolean steps_addable(const RankSim *r, const SteadyState *cur, uint64_t n, uint64_t s)
{
    return n <= STEADY_MAX_STEPS && s <= STEADY_MAX_STEPS && n * s <= STEADY_MAX_STEPS &&
           (uint64_t)cur->step.step + n * s <= G_MAXUINT32 && r->steps->len >= s;
}

/* Adds `n` step records, each the one `p` steps before it, p steps on and `d` µs later (the
 * steps of a period that repeats). */
static void steps_add(RankSim *r, uint64_t n, uint64_t p, double d)
{
    for (uint64_t j = 0; j < n; j++) {
        MemsimStepPeaks sp = g_array_index(r->steps, MemsimStepPeaks, r->steps->len - p);
        sp.step += (uint32_t)p;
        sp.start_us += d;
        g_array_append_val(r->steps, sp);
    }
}

/* Every clock `periods` more times as far as it went from state a to state b. */
static void clocks_advance(RankSim *r, const SteadyState *a, const SteadyState *b, double periods)
{
    const double *x = (const double *)a->clocks->data, *y = (const double *)b->clocks->data;
    r->cpu_us += periods * (y[0] - x[0]);
    GArray *clocks[3] = {r->gpu_free, r->last_end, r->wait_until};
    guint at = 1;
    for (int c = 0; c < 3; c++)
        for (guint k = 0; k < clocks[c]->len; k++, at++)
            g_array_index(clocks[c], double, k) += periods * (y[at] - x[at]);
}

/* Whether ops a and b are the same op but for the micro-batch (a repetition's are its
 * template's). */
static gboolean op_alike(const MemsimTraceHeader *h, int64_t a, int64_t b)
{
    if (a == b)
        return TRUE;
    if (a < 0 || b < 0 || (uint64_t)a >= h->n_ops || (uint64_t)b >= h->n_ops)
        return FALSE;
    const MemsimOpInfo *x = &h->ops[a], *y = &h->ops[b];
    return x->name == y->name && x->phase == y->phase && x->layer == y->layer &&
           x->duration_us == y->duration_us && x->bound == y->bound;
}

/* Right after the template's run (the unit's first): whether every repetition does what it
 * did, with no repetition run. The state before it (unit_pre) is taken as the state "after
 * repetition −1": its live tensors of the units' ids (from F − S on) one repetition on. When
 * that is the state after the template (blocks, statistics, live tensors, peaks) and the
 * template touches no tensor of [F − S, F) (which a repetition would take as it is), each
 * repetition starts where the one before started, relabelled, and its memory is the
 * template's. For the time the unit before the template must be the template's events one
 * repetition back (a placeholder before it, the ops the same but for the micro-batch): then
 * the periods z → a (that unit) and a → b (the template) are two runs of the unit, whose
 * clocks steady_clocks compares as it compares those of two repetitions. The repetitions are
 * then added as repeat_skip adds them, without the one it would run to compare. One rank,
 * no other stream's use of a block (record_stream: the allocator's questions about events),
 * no steps or peers in the unit. */
static gboolean repeat_skip_first(RankSim *r, const MemsimTraceHeader *h)
{
    RepeatRun *q = r->repeat;
    const uint64_t N = r->unit_times, K = r->unit->len, F = r->unit_from, S = r->unit_shift;
    const SteadyState *z = r->unit_pre, *b = &q->st[0];
    const gboolean twin = r->pre_ok;
    r->pre_ok = FALSE;
    if (!twin || !q->may_skip || q->uses || q->cross || r->unit_steps || r->outer || !z || !S ||
        F < S || !N || z->pending || b->pending || r->pre->len != K + 1)
        return FALSE;
    const MemsimEvent *unit = (const MemsimEvent *)(void *)r->unit->data;
    const MemsimEvent *before = (const MemsimEvent *)(void *)r->pre->data;
    for (guint i = 0; i < K; i++) {
        const MemsimEvent *e = &unit[i], *x = &before[i];
        const gboolean tensor = e->kind == MEMSIM_EV_ALLOC || e->kind == MEMSIM_EV_FREE ||
                                e->kind == MEMSIM_EV_USE;
        if (tensor && e->id >= F - S && e->id < F)
            return FALSE;
        /* the unit before: the same event, one repetition back */
        if (x->kind != e->kind || x->stream != e->stream || x->flags != e->flags ||
            x->category != e->category || x->size != e->size || x->addr != e->addr ||
            x->aux != e->aux)
            return FALSE;
        if (tensor ? e->id != (x->id >= F - S ? x->id + S : x->id)
            : e->kind == MEMSIM_EV_OP ? !op_alike(h, (int64_t)x->id, (int64_t)e->id)
                                      : x->id != e->id)
            return FALSE;
    }
    /* the memory: b's as it is against z's, z's unit tensors taken one repetition on */
    if (z->blocks->len != b->blocks->len || z->live->len != b->live->len ||
        memcmp(z->blocks->data, b->blocks->data, z->blocks->len * sizeof(MemsimBlockInfo)) ||
        memcmp(&z->st, &b->st, sizeof z->st) || memcmp(z->live_cat, b->live_cat, sizeof z->live_cat) ||
        memcmp(z->live_req, b->live_req, sizeof z->live_req) ||
        z->best_allocated != b->best_allocated || z->best_reserved != b->best_reserved ||
        z->last_allocated != b->last_allocated || z->epoch != b->epoch ||
        !op_alike(h, z->cur_op, b->cur_op) || z->cur_phase != b->cur_phase ||
        z->n_steps != b->n_steps || z->n_breakdowns != b->n_breakdowns ||
        z->step.peak_allocated != b->step.peak_allocated ||
        z->step.peak_reserved != b->step.peak_reserved ||
        memcmp(z->step.phase_peak_allocated, b->step.phase_peak_allocated,
               sizeof z->step.phase_peak_allocated) ||
        memcmp(z->step.phase_peak_reserved, b->step.phase_peak_reserved,
               sizeof z->step.phase_peak_reserved) ||
        memcmp(z->n_clocks, b->n_clocks, sizeof z->n_clocks) || z->clocks->len != b->clocks->len)
        return FALSE;
    GArray *moved = g_array_sized_new(FALSE, FALSE, sizeof(LiveId), z->live->len);
    for (guint i = 0; i < z->live->len; i++) {
        LiveId l = g_array_index(z->live, LiveId, i);
        if (l.id >= F - S)
            l.id += S;
        g_array_append_val(moved, l);
    }
    g_array_sort(moved, live_cmp);
    gboolean same = live_equal(moved, b->live);
    g_array_unref(moved);
    if (!same)
        return FALSE;
    /* the time: the unit before and the template moved each clock as far */
    if (!steady_clocks(r->pre_clocks, z, b, 0, 0, FALSE))
        return FALSE;
    /* every repetition does what the template did */
    clocks_advance(r, z, b, (double)N);
    r->rep.n_events += N * K;
    if (r->op_next != UINT64_MAX)
        r->op_next += N * K;
    step_sums_add(r, r->unit_pre_sums, q->sums[0], (double)N);
    if (!r->rep.steady_skipped) {
        int32_t mb = unit_microbatch(r, h, NULL);
        /* the template is micro-batch mb (0-based) */
        r->rep.steady_after = mb >= 0 ? (uint32_t)(mb + r->unit_mbs) : 0;
        r->rep.steady_step = b->n_steps ? b->step.step : 0;
    }
    r->rep.steady_skipped += N * r->unit_mbs;
    return TRUE;
}

/* After a whole repetition: whether the later ones can be added instead of run (and then
 * adds them). */
static gboolean repeat_skip(RankSim *r, const MemsimTraceHeader *h)
{
    RepeatRun *q = r->repeat;
    const uint64_t rep = q->rep, N = r->unit_times, K = r->unit->len;
    const uint64_t from = r->unit_from, moved = rep * r->unit_shift;
    SteadyState *cur = &q->st[rep % RING];
    steady_take(r, cur, from, moved);
    step_sums(r, q->sums[rep % RING]);
    q->hashes[rep % RING] = r->ev_hash;
    const gboolean uses = q->uses;
    uint64_t M = N - rep;
    guint p;
    for (p = 1; p <= 2; p++) {
        /* the period before the first is the template's own run (from unit_pre) */
        if (rep + 1 < 2 * p || M % p || (rep + 1 == 2 * p && !r->unit_pre))
            continue;
        const SteadyState *a = &q->st[(rep - p) % RING];
        const SteadyState *z = rep >= 2 * p ? &q->st[(rep - 2 * p) % RING] : r->unit_pre;
        uint64_t h_ab = 0, h_za = 0;
        for (guint j = 0; j < p; j++) {
            h_ab = h_ab * 31 + q->hashes[(rep - j) % RING];
            h_za = h_za * 31 + q->hashes[(rep - p - j) % RING];
        }
        /* the template's own questions were not logged: its period cannot be one */
        if (uses && rep - 2 * p + 1 < 1)
            continue;
        if (steady_equal(a, cur, (uint64_t)p * r->unit_steps) &&
            steady_clocks(z, a, cur, h_ab, h_za, uses))
            break;
    }
    if (p > 2)
        return FALSE;
    /* whole steps are added as records of their own */
    if (r->unit_steps && !steps_addable(r, cur, M, r->unit_steps))
        return FALSE;
    /* every later period does what this one did: each clock moves as it moved */
    const SteadyState *a = &q->st[(rep - p) % RING];
    double periods = (double)(M / p);
    const double *x = (const double *)a->clocks->data, *y = (const double *)cur->clocks->data;
    if (uses)
        r->t_offset += periods * (y[0] - x[0]);
    else
        clocks_advance(r, a, cur, periods);
    r->rep.n_events += M * K;
    if (r->op_next != UINT64_MAX)
        r->op_next += M * K;
    if (r->unit_steps) {
        steps_add(r, M * r->unit_steps, (uint64_t)p * r->unit_steps,
                  cur->step.start_us - a->step.start_us);
        r->rep.steady_steps_skipped += M * r->unit_steps;
        return TRUE;
    }
    step_sums_add(r, q->sums[(rep - p) % RING], q->sums[rep % RING], periods);
    if (!r->rep.steady_skipped) {
        int32_t mb = unit_microbatch(r, h, NULL);
        /* the template is micro-batch mb (0-based); `rep` more ran after it */
        r->rep.steady_after = mb >= 0 ? (uint32_t)(mb + (rep + 1) * r->unit_mbs) : 0;
        r->rep.steady_step = cur->n_steps ? cur->step.step : 0;
    }
    r->rep.steady_skipped += M * r->unit_mbs;
    return TRUE;
}

/* The events of repetition q->rep: the unit's, its own tensors' ids moved. */
static void repeat_fill(RankSim *r)
{
    RepeatRun *q = r->repeat;
    const uint64_t moved = q->rep * r->unit_shift, from = r->unit_from;
    r->step_bump = (uint32_t)MIN(q->rep * r->unit_steps, (uint64_t)G_MAXUINT32);
    for (guint i = 0; i < r->unit->len; i++) {
        q->buf[i] = g_array_index(r->unit, MemsimEvent, i);
        if ((q->buf[i].kind == MEMSIM_EV_ALLOC || q->buf[i].kind == MEMSIM_EV_FREE ||
             q->buf[i].kind == MEMSIM_EV_USE) &&
            q->buf[i].id >= from)
            q->buf[i].id += moved;
    }
}

/* Runs the repetitions until they end or the rank parks (r->repeat stays then). */
static gboolean repeat_pump(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 rank,
                            GError **error)
{
    RankSim *r = &rp->ranks[rank];
    RepeatRun *q = r->repeat;
    const guint K = r->unit->len;
    const uint64_t N = r->unit_times, from = r->unit_from, shift = r->unit_shift;
    gboolean ok = TRUE, done = FALSE;
    while (q->rep <= N) {
        if (q->pos == 0 && q->cross && q->held_rep != q->rep) {
            /* at a boundary: waits for the other ranks (cross_cut), then goes on */
            q->held_rep = q->rep;
            r->at_cut = TRUE;
            return TRUE;
        }
        if (q->pos == 0) {
            repeat_fill(r);
            r->ev_hash = 0xCBF29CE484222325ull;
        }
        gsize used;
        r->pump_depth++;
        gboolean ran = run(rp, h, rank, q->buf + q->pos, K - q->pos, &used, error);
        r->pump_depth--;
        if (!ran) {
            ok = FALSE;
            break;
        }
        q->pos += (guint)used;
        if (r->stopped) {
            r->rep.n_events += (N - q->rep) * K; /* counted, not applied */
            break;
        }
        if (r->waiting && q->pos < K)
            return TRUE; /* parked inside the repetition: it goes on from q->pos */
        q->pos = 0;
        if (q->may_skip && q->rep < N && repeat_skip(r, h)) {
            done = TRUE;
            break;
        }
        if (q->rep == N || r->waiting) {
            done = q->rep == N;
            if (!done) { /* parked at the repetition's last event: the next one follows */
                q->rep++;
                return TRUE;
            }
            break;
        }
        q->rep++;
    }
    (void)done;
    uint64_t moved = (q->rep <= N ? q->rep : N) * shift;
    if (ok && !r->stopped && !steady_rename(r, from, moved))
        ok = bad(error, h, rank, q->index, "a repeated unit leaves tensors whose ids collide");
    repeat_free(r);
    return ok;
}

/* ---- the steady state across ranks ----
 *
 * A unit that meets other ranks (a pipeline stage's forward-backward pair: its sends and recvs
 * name the neighbouring stages) cannot be added alone: its clocks are tied to theirs. Two
 * facts make it possible with them:
 *
 * 1. The ranks form a Kahn network (the top of this file): from a cut — each rank at some
 *    point of its program, with the messages sent before the sender's point and received
 *    after the receiver's — what every rank does next is a function of the ranks' states
 *    there and of those messages alone, whichever rank the simulator runs first. A rank whose
 *    repeated unit meets others waits at the start of each repetition (at_cut); when no rank
 *    can run and every rank waits so or has ended its program, the ranks are at a cut.
 *
 * 2. Without blocks used on other streams (record_stream: no USE in the unit and no block
 *    waiting for a stream event) time and memory do not touch: the clocks are maxima and sums
 *    of op durations and message times, which no allocation changes, and an allocation or a
 *    free is the same at any time. (An allocation that fails stops the rank, and with it its
 *    clocks: see memory_catch_up.)
 *
 * So the times repeat when a cut is the one before it, D later: each clock that decided
 * something (the later of several times: an op's start, a wait, a recv's end) moved by D,
 * every other either set from such times or moved by its own increments by less than D (the
 * host's dispatch costs, far behind the streams), what the next event takes from the last
 * timed op D later, and the messages in flight the same, their start times D later. From there
 * every later period does what this one did, D later: M of them are added, as many as every
 * rank still has repetitions for (each rank a_k repetitions a period): the clocks and the
 * messages in flight move by M D (a clock behind by its own increments), the step's work sums
 * by M times the period's. Each rank's memory then catches up alone with its M a_k
 * repetitions (memory_catch_up): they run for their allocations and frees only, until the
 * memory state repeats with a period of its own (the micro-batches a stage holds move through
 * the cache's blocks one by one: a stage holding n takes n + 1 repetitions, or a multiple, to
 * come back to the same blocks); the whole periods left are added, the rest run. */

typedef struct {
    gint64 key; /* the channel */
    guint pos;  /* its place in the channel's queue */
    Sent sent;
} InFlight;

/* A rank's time at a cut. */
typedef struct RankCut {
    gboolean at_cut; /* else the rank's program has ended */
    uint64_t serial; /* the repeat run */
    uint64_t done;   /* its repetitions done */
    GArray *clocks;  /* as SteadyState.clocks */
    guint n_clocks[3];
    double sums[N_SUMS];
    gboolean op_here; /* the last timed op is right before the next event */
    uint16_t op_stream;
    double op_start, op_dur;
    uint64_t bound, written; /* the clocks' since the cut before (RankSim.bound, .written) */
    gboolean over;
} RankCut;

static void cuts_free(RankSim *r)
{
    if (!r->cuts)
        return;
    for (int k = 0; k < 2; k++)
        g_array_unref(r->cuts[k].clocks);
    g_free(r->cuts);
    r->cuts = NULL;
}

static gint inflight_cmp(gconstpointer a, gconstpointer b)
{
    const InFlight *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static void inflight_take(MemsimReplay *rp, GArray *out)
{
    g_array_set_size(out, 0);
    GHashTableIter it;
    gpointer k, v;
    g_hash_table_iter_init(&it, rp->channels);
    while (g_hash_table_iter_next(&it, &k, &v)) {
        const Channel *c = v;
        for (guint i = c->head; i < c->sent->len; i++) {
            InFlight f = {*(const gint64 *)k, i - c->head, g_array_index(c->sent, Sent, i)};
            g_array_append_val(out, f);
        }
    }
    g_array_sort(out, inflight_cmp);
}

/* The bit of the k-th clock of a cut (host, gpu_free, last_end, wait_until). */
static int cut_clock_bit(const RankCut *x, guint k)
{
    if (k == 0)
        return 0;
    k--;
    for (int c = 0; c < 3; k -= x->n_clocks[c], c++)
        if (k < x->n_clocks[c])
            return clock_bit(c == 0 ? CLK_FREE : c == 1 ? CLK_END : CLK_WAIT, k);
    return -1;
}

/* How a clock went over the period from cut a to cut b, the network's times D later. */
typedef enum {
    CLOCK_BAD,    /* not as the period says */
    CLOCK_PERIOD, /* D later, or set over the period from times that are */
    CLOCK_BEHIND, /* moved by less than D by its own increments and decided nothing */
} ClockWay;

/* A clock that decided some max must be D later. One that decided nothing and moved by less
 * than D (or by D) was, at each comparison of the next period, further behind (or as far)
 * than at the same one of this period, where it lost: it loses there too. If it was set from
 * other times over this period it is what they are, D later, on the next; else it moved by
 * its own increments (the host's dispatch costs), which the next period adds again. */
static ClockWay clock_way(const RankCut *a, const RankCut *b, guint k, double D)
{
    const double x = g_array_index(a->clocks, double, k), y = g_array_index(b->clocks, double, k);
    const int bit = cut_clock_bit(b, k);
    if (bit < 0)
        return CLOCK_BAD;
    if (near(y - x, D, y))
        return CLOCK_PERIOD;
    if ((b->bound >> bit & 1) || y - x > D)
        return CLOCK_BAD;
    return b->written >> bit & 1 ? CLOCK_PERIOD : CLOCK_BEHIND;
}

/* Whether rank cut b is rank cut a, D later. */
static gboolean cut_clocks(const RankCut *a, const RankCut *b, double D)
{
    if (b->over || a->clocks->len != b->clocks->len ||
        memcmp(a->n_clocks, b->n_clocks, sizeof a->n_clocks))
        return FALSE;
    for (guint k = 0; k < b->clocks->len; k++)
        if (clock_way(a, b, k, D) == CLOCK_BAD)
            return FALSE;
    if (a->op_here != b->op_here)
        return FALSE;
    return !b->op_here || (a->op_stream == b->op_stream && a->op_dur == b->op_dur &&
                           near(b->op_start - a->op_start, D, b->op_start));
}

/* D: how far a clock that decided something moved (0 when none did). */
static double cut_period(MemsimReplay *rp, guint c, guint p)
{
    for (guint k = 0; k < rp->n_ranks; k++) {
        const RankCut *a = &rp->ranks[k].cuts[p], *b = &rp->ranks[k].cuts[c];
        if (!b->at_cut || a->clocks->len != b->clocks->len)
            continue;
        for (guint i = 0; i < b->clocks->len; i++) {
            int bit = cut_clock_bit(b, i);
            if (bit >= 0 && (b->bound >> bit & 1))
                return g_array_index(b->clocks, double, i) - g_array_index(a->clocks, double, i);
        }
    }
    return 0.0;
}

/* The clocks of a rank M periods on. */
static void cut_advance(RankSim *r, const RankCut *a, const RankCut *b, double D, double M)
{
    GArray *arrays[3] = {r->gpu_free, r->last_end, r->wait_until};
    for (guint k = 0; k < b->clocks->len; k++) {
        double *v = k == 0 ? &r->cpu_us : NULL;
        guint i = k - 1;
        for (int c = 0; c < 3 && !v; i -= b->n_clocks[c], c++)
            if (i < b->n_clocks[c])
                v = &g_array_index(arrays[c], double, i);
        const double x = g_array_index(a->clocks, double, k),
                     y = g_array_index(b->clocks, double, k);
        *v += M * (clock_way(a, b, k, D) == CLOCK_BEHIND ? y - x : D);
    }
    r->op_start += M * D;
}

/* Runs repetition q->rep of rank `rank` for its memory alone (memory_only: its clocks, work
 * sums and meetings are the network's, added apart): the unit's allocations, frees and ops
 * (the rest it only counts), each one's id moved as it goes instead of a copy of the unit
 * (repeat_fill) per repetition; anything else than a valid allocation, free or op goes
 * through step(), as in run(). */
static gboolean memory_rep(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 rank,
                           GError **error)
{
    RankSim *r = &rp->ranks[rank];
    RepeatRun *q = r->repeat;
    const MemsimEvent *unit = (const MemsimEvent *)r->unit->data;
    const guint K = r->unit->len;
    if (!q->mem) {
        q->mem = g_new(guint, K ? K : 1);
        for (guint i = 0; i < K; i++)
            if (unit[i].kind == MEMSIM_EV_ALLOC || unit[i].kind == MEMSIM_EV_FREE ||
                unit[i].kind == MEMSIM_EV_OP)
                q->mem[q->n_mem++] = i;
    }
    const uint64_t moved = q->rep * r->unit_shift, from = r->unit_from,
                   base = r->rep.n_events;
    gboolean ok = TRUE;
    r->memory_only = TRUE;
    for (guint k = 0; k < q->n_mem && !r->stopped; k++) {
        const guint i = q->mem[k];
        const uint64_t index = base + i;
        r->rep.n_events = index + 1;
        MemsimEvent ev = unit[i];
        if (ev.kind == MEMSIM_EV_OP && G_LIKELY(ev.id < h->n_ops)) {
            memory_op(r, h, index, &ev);
            continue;
        }
        if (ev.kind != MEMSIM_EV_OP && ev.id >= from)
            ev.id += moved;
        if (ev.kind == MEMSIM_EV_ALLOC) {
            FastWay w = fast_alloc(r, h, index, &ev);
            if (w == FAST_OVER) {
                ok = over_limit(error);
                break;
            }
            if (w != FAST_NO)
                continue; /* (after an OOM the rank has stopped: the loop ends) */
        } else if (ev.kind == MEMSIM_EV_FREE && fast_free(r, &ev)) {
            continue;
        }
        ok = step(r, h, rank, index, &ev, error);
        if (!ok)
            break;
    }
    if (ok) {
        /* run() leaves the stream of the last event it applied */
        if (!r->stopped && K)
            r->cur_stream = unit[K - 1].stream;
        r->rep.n_events = base + K;
    }
    r->memory_only = FALSE;
    q->rep++;
    return ok;
}

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

static void print_block(void *user, const MemsimBlockInfo *b)
{
    uint64_t *hsh = user;
    const gboolean idle = b->state == MEMSIM_BLOCK_FREE || b->state == MEMSIM_BLOCK_UNMAPPED;
    /* the segment is the block's when the block starts it, else known from the block before */
    uint64_t x = (*hsh ^ b->segment) * 0x100000001B3ull;
    x = (x ^ b->segment_size ^ (uint64_t)b->stream << 48) * 0x100000001B3ull;
    x = (x ^ b->addr ^ (uint64_t)b->segment_flags << 56) * 0x100000001B3ull;
    x = (x ^ b->size ^ (uint64_t)b->state << 58) * 0x100000001B3ull;
    *hsh = mix64(x ^ (idle ? 0 : b->requested));
}

/* A hash of what steady_equal compares (the ids taken back as steady_take takes them): equal
 * states have equal prints. */
static uint64_t steady_print(RankSim *r, uint64_t from, uint64_t moved)
{
    uint64_t hsh = 0x9E3779B97F4A7C15ull, live = 0;
    memsim_alloc_foreach_block(r->alloc, print_block, &hsh);
    for (size_t i = 0; i <= r->tensors.mask; i++) {
        const IdSlot *sl = &r->tensors.slots[i];
        if (!sl->key1)
            continue;
        uint64_t id = sl->key1 - 1;
        if (id >= from + moved)
            id -= moved;
        const IdVal *v = &sl->val;
        live += mix64(mix64(mix64(id ^ v->addr) ^ v->size) ^ v->req ^
                      ((uint64_t)v->category << 32 | (uint64_t)v->stream << 40) ^
                      (uint64_t)v->site << 8); /* the live set in any order */
    }
    MemsimAllocStats st = memsim_alloc_stats(r->alloc);
    hsh = mix64(hsh ^ live);
    G_STATIC_ASSERT(sizeof st % sizeof(uint64_t) == 0);
    uint64_t words[sizeof st / sizeof(uint64_t)];
    memcpy(words, &st, sizeof st);
    for (gsize i = 0; i < G_N_ELEMENTS(words); i++)
        hsh = mix64(hsh ^ words[i]);
    const int64_t w[] = {r->best_allocated, r->best_reserved, r->last_allocated,
                         (int64_t)r->epoch, r->cur_op, r->cur_phase, r->steps->len};
    for (gsize i = 0; i < G_N_ELEMENTS(w); i++)
        hsh = mix64(hsh ^ (uint64_t)w[i]);
    for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
        hsh = mix64(hsh ^ (uint64_t)r->live_cat[c] ^ (uint64_t)r->live_req[c] << 1);
    return hsh;
}

/* The memory of rank `rank` S repetitions on: they run for their allocations and frees until
 * the state after one is the state after an earlier one (steady_equal, the ids taken back: a
 * period of P repetitions), then the whole periods left are added and the rest run. Each
 * state is hashed (steady_print) and kept whole for HIST repetitions (two[2 ..]); when a
 * hash comes back after P repetitions the state is compared with the one kept, or, past the
 * states kept, taken and compared with the one P repetitions later. An allocation that fails
 * stops the rank (*stopped): its clocks would have stopped there too, which the network's
 * periods do not say. `two`: 2 + HIST states. */
static gboolean memory_catch_up(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 rank,
                                uint64_t S, SteadyState *two, gboolean *stopped, GError **error)
{
    RankSim *r = &rp->ranks[rank];
    RepeatRun *q = r->repeat;
    const uint64_t K = r->unit->len, start = q->rep - 1;
    /* the prints after repetition d (of this run) at [d % CUTS], those of the cuts before */
    uint64_t *prints = r->prints, *at = r->print_done;
    if (r->print_serial != q->serial)
        for (int l = 0; l < CUTS; l++)
            at[l] = UINT64_MAX;
    r->print_serial = q->serial;
    SteadyState *hist = two + 2, *now = &two[1];
    /* whole states are kept where a repetition costs far more than taking one (a unit of
     * many events over a small live set: an interleaved stage's group of micro-batches);
     * else a period is confirmed one period later, as the prints alone allow */
    const gboolean keep = K >= 3 * (uint64_t)(r->tensors.mask + 1);
    uint64_t hist_at[HIST]; /* the repetition each kept state follows (of this run) */
    for (int l = 0; l < HIST; l++)
        hist_at[l] = UINT64_MAX;
    uint64_t j = 0, cand = 0, cand_at = 0;
    for (;;) {
        const uint64_t d = start + j, moved = d * r->unit_shift;
        uint64_t P = 0;
        if (cand && j == cand_at + cand) {
            /* the candidate period, state by state */
            steady_take(r, &two[1], r->unit_from, moved);
            if (steady_equal(&two[0], &two[1], 0)) {
                P = cand;
                now = &two[1];
            }
            cand = 0;
        }
        if (at[d % CUTS] != d) {
            prints[d % CUTS] = steady_print(r, r->unit_from, moved);
            at[d % CUTS] = d;
        }
        if (!P && keep) {
            /* kept whole; a period within the states kept is confirmed at once */
            SteadyState *cur = &hist[d % HIST];
            steady_take(r, cur, r->unit_from, moved);
            hist_at[d % HIST] = d;
            for (uint64_t l = 1; l < HIST && l <= d && !P; l++) {
                const uint64_t e = d - l;
                if (hist_at[e % HIST] == e && at[e % CUTS] == e &&
                    prints[e % CUTS] == prints[d % CUTS] &&
                    steady_equal(&hist[e % HIST], cur, 0)) {
                    P = l;
                    now = cur;
                }
            }
        }
        for (uint64_t l = 1; l < CUTS && l <= d && !cand && !P; l++) {
            const uint64_t e = d - l;
            if (l < HIST && hist_at[e % HIST] == e)
                continue; /* compared whole above */
            if (at[e % CUTS] == e && prints[e % CUTS] == prints[d % CUTS]) {
                cand = l;
                cand_at = j;
                steady_take(r, &two[0], r->unit_from, moved);
            }
        }
        if (!P) {
            if (j == S)
                break;
            if (!memory_rep(rp, h, rank, error))
                return FALSE;
            j++;
            if (r->stopped) {
                *stopped = TRUE;
                return TRUE;
            }
            continue;
        }
        const uint64_t J = (S - j) / P * P;
        if (J && !r->rep.steady_skipped) {
            int32_t mb = unit_microbatch(r, h, NULL);
            /* the template completes micro-batch mb; start + j more ran after it */
            r->rep.steady_after =
                mb >= 0 ? (uint32_t)(mb + (start + j + 1) * r->unit_mbs) : 0;
            r->rep.steady_step = now->n_steps ? now->step.step : 0;
        }
        r->unit_times -= J; /* the ids go on from the last repetition run */
        r->rep.n_events += J * K;
        r->rep.steady_skipped += J * r->unit_mbs;
        for (j += J; j < S; j++) {
            if (!memory_rep(rp, h, rank, error))
                return FALSE;
            if (r->stopped) {
                *stopped = TRUE;
                return TRUE;
            }
        }
        break;
    }
    q->held_rep = q->rep; /* at a boundary: it goes on without waiting there again */
    return TRUE;
}

/* The ranks' memory catching up at a cut (memory_catch_up), M periods on: each rank alone,
 * its allocator, tensors and peaks its own, so the ranks run on as many threads as
 * MemsimReplayOptions.threads allows. The outcome is the one of running them in rank order:
 * the first rank that fails gives the error, the first that runs out of memory the restart
 * (what the ranks after it did is dropped with the replay in both cases). */
typedef struct {
    MemsimReplay *rp;
    const MemsimTraceHeader *h;
    guint c, p;
    uint64_t M;
    gint next; /* the next rank to take (in rank order) */
    gint halt; /* a rank failed or ran out of memory: the ranks after it are not taken */
    gboolean *ok, *stopped;
    GError **errors;
} CatchUp;

static void catch_up_rank(CatchUp *cu, guint k, SteadyState *ring)
{
    RankSim *r = &cu->rp->ranks[k];
    const RankCut *a = &r->cuts[cu->p], *b = &r->cuts[cu->c];
    cu->ok[k] = TRUE;
    if (b->at_cut)
        cu->ok[k] = memory_catch_up(cu->rp, cu->h, k, cu->M * (b->done - a->done), ring,
                                    &cu->stopped[k], &cu->errors[k]);
    if (!cu->ok[k] || cu->stopped[k])
        g_atomic_int_set(&cu->halt, TRUE);
}

static gpointer catch_up_worker(gpointer data)
{
    CatchUp *cu = data;
    SteadyState ring[2 + HIST];
    for (int j = 0; j < 2 + HIST; j++)
        steady_init(&ring[j]);
    for (;;) {
        /* (every rank before a halting one was taken before it: their outcomes are all
         * known when the threads are joined) */
        if (g_atomic_int_get(&cu->halt))
            break;
        gint k = g_atomic_int_add(&cu->next, 1);
        if (k >= (gint)cu->rp->n_ranks)
            break;
        catch_up_rank(cu, (guint)k, ring);
    }
    for (int j = 0; j < 2 + HIST; j++)
        steady_clear(&ring[j]);
    return NULL;
}

static gboolean catch_up_ranks(MemsimReplay *rp, const MemsimTraceHeader *h, guint c, guint p,
                               uint64_t M, gboolean *restart, GError **error)
{
    guint n = rp->n_ranks, busy = 0;
    for (guint k = 0; k < n; k++)
        busy += rp->ranks[k].cuts[c].at_cut;
    guint threads = rp->opt.threads ? rp->opt.threads : g_get_num_processors();
    threads = MIN(threads, busy);
    CatchUp cu = {rp, h, c, p, M, 0, FALSE, g_new0(gboolean, n), g_new0(gboolean, n),
                  g_new0(GError *, n)};
    /* this thread works too: threads − 1 more */
    GThread **t = threads > 1 ? g_new(GThread *, threads - 1) : NULL;
    for (guint i = 0; i + 1 < threads; i++)
        t[i] = g_thread_new("memsim-catch-up", catch_up_worker, &cu);
    catch_up_worker(&cu);
    for (guint i = 0; i + 1 < threads; i++)
        g_thread_join(t[i]);
    g_free(t);
    gboolean ok = TRUE;
    for (guint k = 0; k < n; k++) {
        if (!cu.ok[k]) {
            g_propagate_error(error, cu.errors[k]);
            cu.errors[k] = NULL;
            ok = FALSE;
            break;
        }
        if (cu.stopped[k]) {
            *restart = TRUE;
            break;
        }
    }
    for (guint k = 0; k < n; k++)
        g_clear_error(&cu.errors[k]);
    g_free(cu.ok);
    g_free(cu.stopped);
    g_free(cu.errors);
    return ok;
}

/* The ranks are at a cut (every one waits at a repetition's boundary or has ended): keeps its
 * times, and when they repeat those of the cut before, adds the periods every rank has room
 * for. *restart: a rank ran out of memory while catching up (the replay must run again
 * without skipping). */
static gboolean cross_cut(MemsimReplay *rp, const MemsimTraceHeader *h, gboolean *restart,
                          GError **error)
{
    const guint c = rp->n_cuts % 2, p = c ^ 1;
    gboolean same = rp->n_cuts > 0, any = FALSE;
    for (int k = 0; k < 2; k++)
        if (!rp->inflight[k])
            rp->inflight[k] = g_array_new(FALSE, FALSE, sizeof(InFlight));
    for (guint k = 0; k < rp->n_ranks; k++) {
        RankSim *r = &rp->ranks[k];
        if (!r->cuts) {
            r->cuts = g_new0(RankCut, 2);
            for (int j = 0; j < 2; j++)
                r->cuts[j].clocks = g_array_new(FALSE, FALSE, sizeof(double));
        }
        RankCut *x = &r->cuts[c];
        x->at_cut = r->at_cut && r->repeat && !r->stopped;
        same = same && x->at_cut == r->cuts[p].at_cut;
        if (!x->at_cut)
            continue;
        any = TRUE;
        const RepeatRun *q = r->repeat;
        x->serial = q->serial;
        x->done = q->rep - 1;
        g_array_set_size(x->clocks, 0);
        g_array_append_val(x->clocks, r->cpu_us);
        GArray *arrays[3] = {r->gpu_free, r->last_end, r->wait_until};
        for (int j = 0; j < 3; j++) {
            clocks_add(x->clocks, arrays[j]);
            x->n_clocks[j] = arrays[j]->len;
        }
        step_sums(r, x->sums);
        x->op_here = r->op_next == r->rep.n_events;
        x->op_stream = r->op_stream;
        x->op_start = r->op_start;
        x->op_dur = r->op_dur;
        x->bound = r->bound;
        x->written = r->written;
        x->over = r->watch_over;
        r->bound = r->written = 0;
        r->watch_over = FALSE;
        if (r->print_serial != q->serial) {
            for (int l = 0; l < CUTS; l++)
                r->print_done[l] = UINT64_MAX;
            r->print_serial = q->serial;
        }
        r->prints[x->done % CUTS] = steady_print(r, r->unit_from, x->done * r->unit_shift);
        r->print_done[x->done % CUTS] = x->done;
        same = same && x->serial == r->cuts[p].serial && x->done > r->cuts[p].done &&
               x->done - r->cuts[p].done <= r->unit_times - x->done;
    }
    inflight_take(rp, rp->inflight[c]);
    rp->n_cuts = any ? rp->n_cuts + 1 : 0;
    if (!same)
        return TRUE;
    const double D = cut_period(rp, c, p);
    uint64_t M = UINT64_MAX;
    for (guint k = 0; k < rp->n_ranks && same; k++) {
        RankSim *r = &rp->ranks[k];
        const RankCut *a = &r->cuts[p], *b = &r->cuts[c];
        if (!b->at_cut)
            continue;
        same = cut_clocks(a, b, D);
        M = MIN(M, (r->unit_times - b->done) / (b->done - a->done));
    }
    const GArray *fa = rp->inflight[p], *fb = rp->inflight[c];
    same = same && fa->len == fb->len && M && M != UINT64_MAX;
    for (guint i = 0; i < fb->len && same; i++) {
        const InFlight *x = &g_array_index(fa, InFlight, i), *y = &g_array_index(fb, InFlight, i);
        same = x->key == y->key && x->pos == y->pos && x->sent.dur == y->sent.dur &&
               near(y->sent.start - x->sent.start, D, y->sent.start);
    }
    if (!same)
        return TRUE;
    /* no block waits for a stream event: the memory does not depend on the clocks */
    SteadyState ring[2];
    for (int j = 0; j < 2; j++)
        steady_init(&ring[j]);
    for (guint k = 0; k < rp->n_ranks && same; k++) {
        RankSim *r = &rp->ranks[k];
        if (!r->cuts[c].at_cut)
            continue;
        steady_take(r, &ring[0], r->unit_from, r->cuts[c].done * r->unit_shift);
        same = !ring[0].pending;
    }
    for (int j = 0; j < 2; j++)
        steady_clear(&ring[j]);
    /* the memory of each rank, M periods on */
    gboolean ok = !same || catch_up_ranks(rp, h, c, p, M, restart, error);
    if (!same || !ok || *restart)
        return ok;
    /* the times M periods on: every rank's clocks and sums, the messages in flight */
    for (guint k = 0; k < rp->n_ranks; k++) {
        RankSim *r = &rp->ranks[k];
        const RankCut *a = &r->cuts[p], *b = &r->cuts[c];
        if (!b->at_cut)
            continue;
        step_sums_add(r, a->sums, b->sums, (double)M);
        cut_advance(r, a, b, D, (double)M);
        r->rep.steady_timed += M * (b->done - a->done) * r->unit_mbs;
        if (r->op_next != UINT64_MAX)
            r->op_next += M * (b->done - a->done) * r->unit->len;
    }
    GHashTableIter it;
    gpointer key, val;
    g_hash_table_iter_init(&it, rp->channels);
    while (g_hash_table_iter_next(&it, &key, &val)) {
        Channel *ch = val;
        for (guint i = ch->head; i < ch->sent->len; i++)
            g_array_index(ch->sent, Sent, i).start += (double)M * D;
    }
    rp->n_cuts = 0; /* the sums kept are those before the periods added */
    return TRUE;
}

/* No rank can run: the ranks waiting at a boundary go on, after a cut when every rank waits so
 * or has ended (ended[k]: rank k has no events left). FALSE when none was waiting. */
static gboolean cross_release(MemsimReplay *rp, const MemsimTraceHeader *h,
                              const gboolean *ended, gboolean *restart, gboolean *failed,
                              GError **error)
{
    gboolean any = FALSE, all = TRUE;
    for (guint32 k = 0; k < rp->n_ranks; k++) {
        RankSim *r = &rp->ranks[k];
        if (r->at_cut)
            any = TRUE;
        else if (r->waiting || r->repeat || !ended[k])
            all = FALSE;
    }
    if (!any)
        return FALSE;
    if (all && !cross_cut(rp, h, restart, error)) {
        *failed = TRUE;
        return TRUE;
    }
    for (guint32 k = 0; k < rp->n_ranks; k++)
        rp->ranks[k].at_cut = FALSE;
    return TRUE;
}

/* How many events of the program `n` events stand for: a REPEAT is none itself, its unit's
 * repetitions are theirs. */
static uint64_t events_counted(const MemsimEvent *ev, gsize n)
{
    uint64_t count = n;
    for (gsize i = 0; i < n; i++)
        if (G_UNLIKELY(ev[i].kind == MEMSIM_EV_REPEAT))
            count += (ev[i].aux > 0 && ev[i].size > 0 && !(ev[i].flags & MEMSIM_EVF_STEPS)
                          ? ev[i].aux * ev[i].size
                          : 0) -
                     1;
    return count;
}

/* ---- repeats of whole steps (MEMSIM_EVF_STEPS) ----
 *
 * A loop whose steps hold repeats of micro-batches repeats whole steps with a REPEAT flagged
 * MEMSIM_EVF_STEPS around them. Its unit is captured as written (the repeats inside it
 * unexpanded) while it first runs; each repetition then runs the unit again through run(),
 * its own ids moved (those of the repeats inside it too) and its step marks moved by the step
 * marks it holds, so that the repeats inside it expand and are skipped as they were the first
 * time. After each one the state is compared with the one before (steady_take, as for
 * micro-batches, the step count moved on); when it is the same and the clocks moved as they
 * did, the steps left are added: each a copy of the step before it, one step on. */

#define OUTER_RING 3

typedef struct Outer {
    GArray *unit; /* MemsimEvent, as written */
    uint64_t len, times, from, shift;
    uint64_t index;    /* the REPEAT's event (for messages) */
    uint64_t expanded; /* events one repetition stands for (events_counted) */
    uint32_t steps;    /* the step marks of the unit */
    gboolean capturing, may_skip;
    /* the state after repetition j (the unit's first run: 0, before it: −1) at [(j+1) % 3] */
    SteadyState st[OUTER_RING];
} Outer;

static void outer_free(RankSim *r)
{
    Outer *o = r->outer;
    if (!o)
        return;
    g_array_unref(o->unit);
    for (int k = 0; k < OUTER_RING; k++)
        steady_clear(&o->st[k]);
    g_free(o);
    r->outer = NULL;
    r->outer_bump = 0;
}

/* The unit of `ev` (aux > 0, size > 0, in range) to be captured. */
static Outer *outer_new(RankSim *r, const MemsimEvent *ev)
{
    Outer *o = g_new0(Outer, 1);
    o->unit = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
    o->len = ev->size;
    o->times = ev->aux;
    o->from = ev->id;
    o->shift = ev->addr;
    o->capturing = TRUE;
    for (int k = 0; k < OUTER_RING; k++)
        steady_init(&o->st[k]);
    r->outer = o;
    return o;
}

static gboolean outer_start(RankSim *r, const MemsimTraceHeader *h, guint32 rank, uint64_t index,
                            const MemsimEvent *ev, GError **error)
{
    if (ev->aux == 0 || ev->size == 0)
        return TRUE; /* a boundary: nothing repeats */
    if (r->outer || r->capturing || r->pump_depth)
        return bad(error, h, rank, index, "a repeat of steps inside another repeat");
    if (!repeat_in_range(h, rank, index, ev, error))
        return FALSE;
    Outer *o = outer_new(r, ev);
    o->index = index;
    steady_take(r, &o->st[0], o->from, 0);
    return TRUE;
}

/* A program's event while the unit is being captured. */
static inline void outer_capture(RankSim *r, const MemsimEvent *ev)
{
    Outer *o = r->outer;
    if (o->capturing && o->unit->len < o->len)
        g_array_append_val(o->unit, *ev);
}

static inline gboolean outer_captured(RankSim *r)
{
    return r->outer->capturing && r->outer->unit->len == r->outer->len;
}

/* The rank stopped: the program's events are counted (events_counted) but for the
 * repetitions of a repeat of steps, whose unit (the repeats it holds unexpanded) is captured
 * to its end here and its repetitions then counted. */
static void outer_count(RankSim *r, const MemsimEvent *ev, gsize n)
{
    if (r->pump_depth)
        return;
    for (gsize i = 0; i < n; i++) {
        Outer *o = r->outer;
        if (o && o->capturing) {
            g_array_append_val(o->unit, ev[i]);
            if (o->unit->len == o->len) {
                r->rep.n_events += o->times * events_counted((const MemsimEvent *)(void *)o->unit->data,
                                                             o->unit->len);
                outer_free(r);
            }
        } else if (!o && ev[i].kind == MEMSIM_EV_REPEAT && (ev[i].flags & MEMSIM_EVF_STEPS) &&
                   ev[i].aux > 0 && ev[i].size > 0 && ev[i].aux <= ((uint64_t)1 << 40) &&
                   ev[i].size <= ((uint64_t)1 << 40)) {
            outer_new(r, &ev[i]);
        }
    }
}

/* After repetition `rep`: whether the ones left can be added instead of run (and adds them). */
static gboolean outer_skip(RankSim *r, uint64_t rep)
{
    Outer *o = r->outer;
    SteadyState *cur = &o->st[(rep + 1) % OUTER_RING];
    const SteadyState *a = &o->st[rep % OUTER_RING], *z = &o->st[(rep + 2) % OUTER_RING];
    steady_take(r, cur, o->from, rep * o->shift);
    const uint64_t M = o->times - rep, S = o->steps;
    if (!steady_equal(a, cur, S) || !steady_clocks(z, a, cur, 0, 0, FALSE))
        return FALSE;
    if (!steps_addable(r, cur, M, S))
        return FALSE;
    clocks_advance(r, a, cur, (double)M);
    r->rep.n_events += M * o->expanded;
    if (r->op_next != UINT64_MAX)
        r->op_next += M * o->expanded;
    steps_add(r, M * S, S, cur->step.start_us - a->step.start_us);
    r->rep.steady_steps_skipped += M * S;
    return TRUE;
}

/* The unit has run once, captured: its repetitions. */
static gboolean outer_run(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 rank,
                          GError **error)
{
    RankSim *r = &rp->ranks[rank];
    Outer *o = r->outer;
    o->capturing = FALSE;
    if (r->capturing || r->repeat)
        return bad(error, h, rank, o->index,
                   "a repeat of steps ends inside the unit of a repeat it holds");
    const MemsimEvent *unit = (const MemsimEvent *)(void *)o->unit->data;
    const guint K = o->unit->len;
    o->may_skip = steady_options_allow(r);
    o->steps = memsim_step_marks(h, unit, K);
    for (guint i = 0; i < K; i++) {
        const MemsimEvent *e = &unit[i];
        if (e->kind == MEMSIM_EV_COLLECTIVE && (e->flags & MEMSIM_EVF_PEER))
            return bad(error, h, rank, o->index, "a repeat of steps holds a send or recv");
        if (e->kind == MEMSIM_EV_INIT_SEGMENT || e->kind == MEMSIM_EV_INIT_BLOCK)
            return bad(error, h, rank, o->index,
                       "the unit of a repeat holds a %s event, which cannot repeat",
                       memsim_event_kind_name(e->kind));
        if (e->kind != MEMSIM_EV_ALLOC && e->kind != MEMSIM_EV_FREE && e->kind != MEMSIM_EV_OP &&
            e->kind != MEMSIM_EV_WAIT && e->kind != MEMSIM_EV_COLLECTIVE &&
            e->kind != MEMSIM_EV_MARK && e->kind != MEMSIM_EV_REPEAT)
            o->may_skip = FALSE; /* record_stream: the clocks decide the memory */
    }
    uint32_t marks = 0;
    for (guint i = 0; i < K; i++)
        marks += unit[i].kind == MEMSIM_EV_MARK;
    if (marks != o->steps)
        o->may_skip = FALSE; /* a label or a breakdown is not added by copies */
    o->expanded = events_counted(unit, K);
    r->rep.steady_steps_repeated += o->times * o->steps;
    if (o->may_skip)
        steady_take(r, &o->st[1], o->from, 0);
    MemsimEvent *buf = g_new(MemsimEvent, K ? K : 1);
    gboolean ok = TRUE;
    uint64_t rep;
    for (rep = 1; rep <= o->times; rep++) {
        const uint64_t moved = rep * o->shift;
        for (guint i = 0; i < K; i++) {
            buf[i] = unit[i];
            if ((buf[i].kind == MEMSIM_EV_ALLOC || buf[i].kind == MEMSIM_EV_FREE ||
                 buf[i].kind == MEMSIM_EV_USE || buf[i].kind == MEMSIM_EV_REPEAT) &&
                buf[i].id >= o->from)
                buf[i].id += moved;
        }
        r->outer_bump = (uint32_t)MIN(rep * o->steps, (uint64_t)G_MAXUINT32);
        gsize used;
        r->pump_depth++;
        ok = run(rp, h, rank, buf, K, &used, error);
        r->pump_depth--;
        if (!ok)
            break;
        if (r->stopped) {
            r->rep.n_events += (o->times - rep) * o->expanded; /* counted, not applied */
            break;
        }
        if (r->capturing || r->repeat || r->waiting) {
            ok = bad(error, h, rank, o->index,
                     "a repetition of steps ends inside the unit of a repeat it holds");
            break;
        }
        if (o->may_skip && rep < o->times && outer_skip(r, rep))
            break;
    }
    g_free(buf);
    r->outer_bump = 0;
    const uint64_t moved = MIN(rep, o->times) * o->shift;
    if (ok && !r->stopped && !steady_rename(r, o->from, moved))
        ok = bad(error, h, rank, o->index, "a repeated unit leaves tensors whose ids collide");
    outer_free(r);
    return ok;
}

/* The rank stopped (out of memory): the events left are counted, not applied, with the
 * repetitions of a unit it was capturing. */
static void stop_count(RankSim *r, const MemsimEvent *ev, gsize n)
{
    if (r->capturing) {
        r->capturing = FALSE;
        r->rep.n_events += r->unit_times * r->unit_len;
    }
    outer_count(r, ev, n);
    r->rep.n_events += events_counted(ev, n);
}

/* Applies events of rank `rank` in program order until they run out or the rank parks at a
 * recv; *used: how many were taken (the recv included; on an error, the bad event too). */
static gboolean run(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 rank,
                    const MemsimEvent *events, gsize n, gsize *used, GError **error)
{
    RankSim *r = &rp->ranks[rank];
    /* Without a timeline, verification or invariant checks, valid allocations and frees take
     * the short paths below; everything else (and every error) goes through step(). */
    const gboolean plain =
        !rp->opt.timeline && !rp->opt.verify && !rp->opt.check_invariants && !rp->opt.hooks;
    *used = n;
    /* A stopped rank's events are counted, not applied. Only an ALLOC that fails stops a
     * rank, so the test is made at the start and after those (and after step()). */
    if (G_UNLIKELY(r->stopped)) {
        outer_count(r, events, n);
        r->rep.n_events += events_counted(events, n);
        return TRUE;
    }
    for (gsize i = 0; i < n; i++) {
        uint64_t index = r->rep.n_events++;
        const MemsimEvent *ev = &events[i];
        if (G_UNLIKELY(r->capturing))
            g_array_append_val(r->unit, *ev);
        if (G_UNLIKELY(r->pre_on))
            pre_capture(r, ev);
        if (G_UNLIKELY(r->outer != NULL) && !r->pump_depth)
            outer_capture(r, ev);
        if (plain && ev->kind == MEMSIM_EV_ALLOC) {
            FastWay w = fast_alloc(r, h, index, ev);
            if (w == FAST_DONE)
                goto next;
            if (w == FAST_OVER) {
                *used = i + 1;
                return over_limit(error);
            }
            if (w == FAST_OOM) {
                stop_count(r, events + i + 1, n - i - 1); /* counted, not applied */
                break;
            }
        } else if (plain && ev->kind == MEMSIM_EV_FREE) {
            if (G_LIKELY(fast_free(r, ev)))
                goto next;
        }
        if (!step(r, h, rank, index, ev, error)) {
            *used = i + 1;
            return FALSE;
        }
        if (G_UNLIKELY(r->waiting)) {
            *used = i + 1;
            break;
        }
        if (G_UNLIKELY(r->stopped)) {
            stop_count(r, events + i + 1, n - i - 1); /* counted, not applied */
            break;
        }
    next:
        if (G_UNLIKELY(r->capturing) && r->unit->len == r->unit_len) {
            if (!repeat_begin(rp, h, rank, index, error) || !repeat_pump(rp, h, rank, error)) {
                *used = i + 1;
                return FALSE;
            }
            if (G_UNLIKELY(r->stopped)) {
                stop_count(r, events + i + 1, n - i - 1); /* counted, not applied */
                break;
            }
            if (G_UNLIKELY(r->repeat || r->waiting)) { /* parked inside a repetition */
                *used = i + 1;
                break;
            }
        }
        if (G_UNLIKELY(r->outer != NULL) && !r->pump_depth && outer_captured(r)) {
            if (!outer_run(rp, h, rank, error)) {
                *used = i + 1;
                return FALSE;
            }
            if (G_UNLIKELY(r->stopped)) {
                stop_count(r, events + i + 1, n - i - 1); /* counted, not applied */
                break;
            }
        }
    }
    return TRUE;
}

/* Runs the held events of the ranks that can go on, the lowest rank first, until none can.
 * On an error, *failed is the rank whose event was bad. */
static gboolean run_held(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 *failed,
                         GError **error)
{
    while (rp->woken) {
        rp->woken = FALSE;
        for (guint32 k = 0; k < rp->n_ranks; k++) {
            RankSim *r = &rp->ranks[k];
            if (r->waiting || (r->held_pos == r->held->len && !r->repeat))
                continue;
            if (r->repeat) { /* repetitions parked at a recv go on first */
                if (!repeat_pump(rp, h, k, error)) {
                    *failed = k;
                    return FALSE;
                }
                rp->woken = TRUE;
                break;
            }
            gsize used;
            gboolean ok = run(rp, h, k, &g_array_index(r->held, MemsimEvent, r->held_pos),
                              r->held->len - r->held_pos, &used, error);
            r->held_pos += used;
            if (!ok) {
                *failed = k;
                return FALSE;
            }
            if (r->held_pos == r->held->len) {
                g_array_set_size(r->held, 0);
                r->held_pos = 0;
            }
            rp->woken = TRUE; /* it may have woken a lower rank: look again from rank 0 */
            break;
        }
    }
    return TRUE;
}

gboolean memsim_replay_feed(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 rank,
                            const MemsimEvent *events, gsize n, GError **error)
{
    if (rank >= rp->n_ranks) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: events for rank %u, but the header has %u ranks",
                    h->name ? h->name : "trace", rank, rp->n_ranks);
        return FALSE;
    }
    RankSim *r = &rp->ranks[rank];
    if (G_UNLIKELY(r->waiting || r->repeat)) {
        g_array_append_vals(r->held, events, n);
        if (r->waiting)
            return TRUE;
        guint32 failed;
        rp->woken = TRUE; /* repetitions that can go on: before these events */
        return run_held(rp, h, &failed, error);
    }
    gsize used;
    if (!run(rp, h, rank, events, n, &used, error))
        return FALSE;
    if (G_UNLIKELY(used < n))
        g_array_append_vals(r->held, events + used, n - used);
    guint32 failed;
    return G_LIKELY(!rp->woken) || run_held(rp, h, &failed, error);
}

/* The lowest parked rank, or NULL. */
static RankSim *first_waiting(MemsimReplay *rp, guint32 *rank)
{
    for (guint32 k = 0; k < rp->n_ranks; k++)
        if (rp->ranks[k].waiting) {
            *rank = k;
            return &rp->ranks[k];
        }
    return NULL;
}

/* memsim_replay_drain; on an error, *failed is the rank whose event was bad. */
static gboolean drain(MemsimReplay *rp, const MemsimTraceHeader *h, guint32 *failed,
                      GError **error)
{
    for (;;) {
        if (!run_held(rp, h, failed, error))
            return FALSE;
        guint32 k;
        RankSim *r = first_waiting(rp, &k);
        if (!r)
            return TRUE;
        recv_done(r, h, k, r->wait_start, 0.0); /* no send will come: it ends on its own */
    }
}

/* After the last event: a rank still capturing a repeat's unit ended inside it (the unit
 * the REPEAT announced is longer than what the trace holds after it). */
static gboolean ended_whole(MemsimReplay *rp, const MemsimTraceHeader *h, GError **error)
{
    for (guint32 k = 0; k < rp->n_ranks; k++) {
        RankSim *r = &rp->ranks[k];
        if (r->stopped)
            continue;
        if (r->outer && r->outer->capturing)
            return bad(error, h, k, r->outer->index,
                       "the trace ends inside the unit of this repeat of steps (%u of its %" PRIu64
                       " events)", r->outer->unit->len, r->outer->len);
        if (r->capturing)
            return bad(error, h, k, r->unit_index,
                       "the trace ends inside the unit of this repeat (%u of its %" PRIu64
                       " events)", r->unit->len, r->unit_len);
    }
    return TRUE;
}

gboolean memsim_replay_drain(MemsimReplay *rp, const MemsimTraceHeader *h, GError **error)
{
    guint32 failed;
    return drain(rp, h, &failed, error) && ended_whole(rp, h, error);
}

MemsimReport *memsim_replay_finish(MemsimReplay *rp)
{
    /* Events still held (the caller did not drain): a rank whose held events are
     * inconsistent stops at the bad one, the rest counted, not applied. */
    guint32 failed;
    GError *e = NULL;
    while (!drain(rp, &rp->header, &failed, &e)) {
        g_clear_error(&e);
        RankSim *r = &rp->ranks[failed];
        r->stopped = TRUE;
        r->rep.n_events += r->held->len - r->held_pos;
        g_array_set_size(r->held, 0);
        r->held_pos = 0;
    }
    MemsimReport *rep = g_new0(MemsimReport, 1);
    rep->source = g_strdup(rp->header.name);
    rep->allocator = g_strdup(rp->allocator);
    rep->alloc_conf = g_strdup(rp->alloc_conf);
    rep->capacity = rp->capacity;
    rep->warnings = g_strdupv(rp->header.warnings);
    rep->n_ranks = rp->n_ranks;
    rep->ranks = g_new0(MemsimRankReport, rp->n_ranks ? rp->n_ranks : 1);
    for (guint i = 0; i < rp->n_ranks; i++) {
        RankSim *r = &rp->ranks[i];
        if (rp->opt.verify && r->expected->len) {
            /* Records left without an action to explain them. */
            MemsimEvent none = {0};
            verify_action(r, r->rep.n_events, &none);
        }
        r->rep.stats = memsim_alloc_stats(r->alloc);
        r->rep.shape_final = memsim_alloc_shape(r->alloc);
        if (rp->opt.verify && r->rep.has_recorded_final && !r->rep.oom.happened) {
            MemsimEvent none = {0};
            r->rep.verify_checked += 2;
            if ((uint64_t)r->rep.stats.reserved.current != r->rep.recorded_final_reserved)
                mismatch(r, r->rep.n_events, &none,
                         "final reserved %" PRId64 " bytes, the snapshot says %" PRIu64,
                         r->rep.stats.reserved.current, r->rep.recorded_final_reserved);
            if ((uint64_t)r->rep.stats.allocated.current != r->rep.recorded_final_allocated)
                mismatch(r, r->rep.n_events, &none,
                         "final allocated %" PRId64 " bytes, the snapshot says %" PRIu64,
                         r->rep.stats.allocated.current, r->rep.recorded_final_allocated);
        }
        if (r->tl_held)
            timeline_flush_op(r, &rp->header, i);
        if (r->site_cur && r->site_cur->len)
            r->rep.sites_at_peak = top_sites(r, TRUE, &r->rep.n_sites_at_peak);
        r->rep.n_steps = r->steps->len;
        r->rep.steps = (MemsimStepPeaks *)g_array_free(r->steps, FALSE);
        r->steps = NULL;
        r->rep.n_breakdowns = r->breakdowns->len;
        r->rep.breakdowns = (MemsimBreakdown *)g_array_free(r->breakdowns, FALSE);
        r->breakdowns = NULL;
        if (r->rep.steady_skipped) /* the highest micro-batch an op ran in, plus one */
            r->rep.steady_of = (uint32_t)(r->mb_top + 1);
        r->rep.device_total = (memsim_size_t)r->rep.stats.reserved.peak;
        r->rep.rounded_peak = (memsim_size_t)r->peak_rounded;
        r->rep.time_us = r->cpu_us;
        for (guint k = 0; k < r->last_end->len; k++)
            if (g_array_index(r->last_end, double, k) > r->rep.time_us)
                r->rep.time_us = g_array_index(r->last_end, double, k);
        r->rep.time_us += r->t_offset;
        r->rep.fits = !r->rep.oom.happened &&
                      !(r->rep.oom_verdict.replayed && !r->rep.oom_verdict.fits);
        if (rp->opt.hooks && rp->opt.hooks->on_end)
            rp->opt.hooks->on_end(rp->opt.hooks->user, i, r->alloc);
        if (rp->opt.timeline)
            memsim_timeline_end(rp->opt.timeline, i, r->rep.n_events);
        rep->ranks[i] = r->rep;
        memset(&r->rep, 0, sizeof r->rep); /* ownership of role, steps, first_mismatch moved */
    }
    memsim_replay_abort(rp);
    return rep;
}

MemsimReport *memsim_replay_reader(MemsimTraceReader *rd, const char *path,
                                   const MemsimReplayOptions *opt, GError **error)
{
    MemsimReplay *rp = memsim_replay_new(memsim_trace_reader_header(rd), opt, error);
    if (!rp)
        return NULL;
    const MemsimEvent *ev;
    guint32 rank;
    gsize n;
    GError *e = NULL;
    while ((n = memsim_trace_reader_next(rd, &rank, &ev, &e)) > 0) {
        if (!memsim_replay_feed(rp, memsim_trace_reader_header(rd), rank, ev, n, &e))
            break;
    }
    if (!e)
        memsim_replay_drain(rp, memsim_trace_reader_header(rd), &e);
    if (e) {
        /* an inconsistency the replay found names the trace by its embedded name: the file
         * the user gave comes first */
        if (!g_str_has_prefix(e->message, path))
            g_prefix_error(&e, "%s: ", path);
        g_propagate_error(error, e);
        memsim_replay_abort(rp);
        return NULL;
    }
    return memsim_replay_finish(rp);
}

MemsimReport *memsim_replay_path(const char *path, const MemsimReplayOptions *opt, GError **error)
{
    MemsimTraceReader *rd = memsim_trace_reader_open(path, error);
    if (!rd)
        return NULL;
    MemsimReport *rep = memsim_replay_reader(rd, path, opt, error);
    memsim_trace_reader_free(rd);
    return rep;
}

/* memsim_replay_trace; `cross`: ranks whose repeated unit meets others may be skipped with
 * them (cross_cut). The bounds of memsim_replay_trace_bounded (requested_limit) and
 * memsim_replay_trace_if_fits (stop_at_oom, reserved_limit); G_MAXINT64 and FALSE: none. */
static MemsimReport *replay_trace(MemsimTrace *trace, const MemsimReplayOptions *opt,
                                  gboolean cross, int64_t requested_limit, gboolean stop_at_oom,
                                  int64_t reserved_limit, GError **error)
{
    MemsimTraceHeader *h = memsim_trace_header(trace);
    MemsimReplay *rp = memsim_replay_new(h, opt, error);
    if (!rp)
        return NULL;
    rp->requested_limit = requested_limit;
    rp->stop_at_oom = stop_at_oom;
    rp->reserved_limit = reserved_limit;
    /* The events are all here: each rank runs from where it parked, nothing is held. Ranks
     * whose repeated unit meets others may wait at its boundaries for a cut (cross_cut). */
    rp->cross = cross;
    gsize *pos = g_new0(gsize, h->n_ranks ? h->n_ranks : 1);
    gboolean *ended = g_new0(gboolean, h->n_ranks ? h->n_ranks : 1);
    for (;;) {
        guint32 k;
        gsize n = 0;
        const MemsimEvent *ev = NULL;
        for (k = 0; k < h->n_ranks; k++) {
            if (rp->ranks[k].waiting || rp->ranks[k].at_cut)
                continue;
            if (rp->ranks[k].repeat) /* repetitions parked at a recv go on first */
                break;
            ev = memsim_trace_events(trace, k, &n);
            if (pos[k] < n)
                break;
        }
        if (k < h->n_ranks && rp->ranks[k].repeat) {
            if (!repeat_pump(rp, h, k, error)) {
                g_free(pos);
                g_free(ended);
                memsim_replay_abort(rp);
                return NULL;
            }
            continue;
        }
        if (k < h->n_ranks) {
            gsize used;
            if (!run(rp, h, k, ev + pos[k], n - pos[k], &used, error)) {
                g_free(pos);
                g_free(ended);
                memsim_replay_abort(rp);
                return NULL;
            }
            pos[k] += used;
            continue;
        }
        for (k = 0; k < h->n_ranks; k++) {
            memsim_trace_events(trace, k, &n);
            ended[k] = pos[k] >= n;
        }
        gboolean failed = FALSE, restart = FALSE;
        if (cross_release(rp, h, ended, &restart, &failed, error)) {
            if (failed || restart) {
                g_free(pos);
                g_free(ended);
                memsim_replay_abort(rp);
                return failed ? NULL
                              : replay_trace(trace, opt, FALSE, requested_limit,
                                             stop_at_oom, reserved_limit, error);
            }
            continue;
        }
        RankSim *r = first_waiting(rp, &k);
        if (!r)
            break;
        recv_done(r, h, k, r->wait_start, 0.0); /* no send will come: it ends on its own */
    }
    g_free(pos);
    g_free(ended);
    if (!ended_whole(rp, h, error)) {
        memsim_replay_abort(rp);
        return NULL;
    }
    return memsim_replay_finish(rp);
}

MemsimReport *memsim_replay_trace(MemsimTrace *trace, const MemsimReplayOptions *opt,
                                  GError **error)
{
    return replay_trace(trace, opt, TRUE, G_MAXINT64, FALSE, G_MAXINT64, error);
}

/* replay_trace with a bound: NULL with *stopped set (and no error) where the bound ended it. */
static MemsimReport *replay_stopping(MemsimTrace *trace, const MemsimReplayOptions *opt,
                                     int64_t requested_limit, gboolean stop_at_oom,
                                     int64_t reserved_limit, gboolean *stopped, GError **error)
{
    GError *e = NULL;
    MemsimReport *rep =
        replay_trace(trace, opt, TRUE, requested_limit, stop_at_oom, reserved_limit, &e);
    *stopped = e && e->domain == OVER_LIMIT_QUARK;
    if (*stopped)
        g_clear_error(&e);
    else if (e)
        g_propagate_error(error, e);
    return rep;
}

MemsimReport *memsim_replay_trace_bounded(MemsimTrace *trace, const MemsimReplayOptions *opt,
                                          int64_t requested_limit, gboolean *over,
                                          GError **error)
{
    return replay_stopping(trace, opt, requested_limit, FALSE, G_MAXINT64, over, error);
}

MemsimReport *memsim_replay_trace_if_fits(MemsimTrace *trace, const MemsimReplayOptions *opt,
                                          int64_t reserved_limit, gboolean *misses,
                                          GError **error)
{
    return replay_stopping(trace, opt, G_MAXINT64, TRUE, reserved_limit, misses, error);
}
