/* memsim — replaying traces through an allocator policy, and the report.
 *
 *     MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
 *     o.verify = TRUE;
 *     MemsimReport *rep = memsim_replay_path("run.pickle", &o, &err);
 *     printf("%" G_GINT64_FORMAT "\n", rep->ranks[0].stats.reserved.peak);
 *     char *json = memsim_report_to_json(rep);     // g_free() it
 *     memsim_report_free(rep);
 *
 * Streaming use: memsim_replay_new(header) → memsim_replay_feed(rank, events) for each run
 * of events (in program order) → memsim_replay_drain() → memsim_replay_finish(). Memory
 * depends on the live blocks, not on the trace length, except where ranks meet: a rank parked
 * at a recv (MEMSIM_EVF_PEER) holds the events fed for it until the matching send comes. Each
 * rank owns one allocator instance. Within a rank, events are applied in program order; ops
 * with durations advance a simulated clock per stream, and ranks meet at sends and recvs that
 * name their peer (sim/replay.c); a single-stream or program-ordered trace needs no clock.
 */
#ifndef MEMSIM_SIM_H
#define MEMSIM_SIM_H

#include <memsim/formats.h>
#include <memsim/alloc.h>
#include <memsim/timeline.h>
#include <memsim/trace.h>
#include <memsim/units.h>

G_BEGIN_DECLS

typedef struct {
    /* Policy spec, "name[:settings]"; NULL = "torch". */
    const char *allocator;
    /* PYTORCH_CUDA_ALLOC_CONF string for the torch policy; NULL = the trace's recorded
     * settings (if any). Ignored by other policies. */
    const char *alloc_conf;
    /* Device bytes available to the allocator; 0 = the trace's capacity (a snapshot's: each
     * rank's recorded at its OOM), else unlimited; G_MAXUINT64 = unlimited whatever the
     * trace records. */
    memsim_size_t capacity;
    /* Check each recorded allocator action against the model. */
    gboolean verify;
    /* Run the policy's invariant checker after every event (slow; for tests). */
    gboolean check_invariants;
    /* (optional) Records the memory over the replay (memsim/timeline.h); not owned. */
    MemsimTimeline *timeline;
    /* (optional) Observers of the replay, event by event (the snapshot export); not owned. */
    const struct MemsimReplayHooks *hooks;
    /* Ignore the ops' durations: every stream's work is done as soon as it is issued, as a
     * recording without timing (a snapshot) shows it. */
    gboolean untimed;
    /* The host's time to issue one timed op, µs (the GPU profile's dispatch_us); 0 = 10. */
    double dispatch_us;
    /* Allocation sites (snapshots, whose allocs carry their Python stacks): the site is the
     * first frame whose file name contains none of these comma-separated texts, beside
     * those always skipped (/torch/, /site-packages/, /dist-packages/, /lib/python3,
     * <frozen); NULL = those alone. */
    const char *frames_skip;
    /* Threads for the ranks' memory where a pipeline's steady state is added by periods
     * (each rank's allocator catching up alone); 0 = one per processor, 1 = the calling
     * thread only. The answer is the same. */
    guint threads;
} MemsimReplayOptions;

#define MEMSIM_REPLAY_OPTIONS_INIT {NULL, NULL, 0, FALSE, FALSE, NULL, NULL, FALSE, 0.0, NULL, 0}

/* Live bytes of one allocation site (MemsimRankReport.sites_at_peak). */
typedef struct {
    char *site;           /* "FILE:LINE FUNCTION", or "(before the trace)" */
    memsim_size_t bytes;  /* block bytes live */
    uint64_t count;       /* live blocks */
    uint8_t category;     /* MemsimCategory of its first allocation */
    uint8_t phase;        /* MemsimPhase running at its first allocation */
} MemsimSite;

/* How many sites a report keeps, the largest first. */
#define MEMSIM_TOP_SITES 10

/* A live tensor of a replay: its block's address, the bytes the program asked for, the
 * stream it was allocated on and its category. */
typedef struct {
    memsim_addr_t addr;
    memsim_size_t requested;
    uint32_t stream;
    uint8_t category;
} MemsimReplayTensor;

/* What a replay tells an observer (MemsimReplayOptions.hooks). Every member may be NULL;
 * `index` is the event's index in its rank's program and `op` the op running (-1: none). */
typedef struct MemsimReplayHooks {
    void *user;
    /* Each event of a rank's program as it comes, before it is checked and applied. */
    void (*on_event)(void *user, const MemsimTraceHeader *header, guint32 rank, uint64_t index,
                     const MemsimEvent *ev);
    /* A FREE of a live tensor, before its block goes back to the policy. */
    void (*on_free)(void *user, guint32 rank, uint64_t index, int64_t op,
                    const MemsimReplayTensor *tensor);
    /* Each action the rank's policy reports (memsim/alloc.h: segments, blocks, OOM). */
    void (*on_action)(void *user, guint32 rank, uint64_t index, int64_t op,
                      const MemsimAllocEvent *ev);
    /* The address of the policy's next segment. NULL: the address the recording gave it,
     * where the trace has one, else fresh addresses from 2^56 up. */
    memsim_addr_t (*segment_addr)(void *user, guint32 rank, memsim_size_t size,
                                  uint32_t stream);
    /* At the end, the rank's policy with its final layout (memsim_alloc_foreach_block),
     * before it is freed. */
    void (*on_end)(void *user, guint32 rank, MemsimAlloc *alloc);
} MemsimReplayHooks;

typedef struct {
    gboolean happened;
    uint64_t event_index;    /* index of the event in the rank's program */
    memsim_size_t requested; /* the caller's request */
    memsim_size_t rounded;   /* the rounded request the allocator could not place */
    memsim_size_t device_free; /* what the device had left */
    memsim_size_t allocated; /* allocated bytes at that moment */
    memsim_size_t reserved;  /* reserved bytes at that moment */
    uint32_t stream;
    int64_t op;              /* the op running then, -1 if unknown */
    /* where: that op's name ("" if none), layer (-1 none), phase, and the step (0 before
     * the first step mark) */
    char op_name[96];
    int32_t layer;
    uint8_t phase;
    uint32_t step;
} MemsimOomInfo;

/* A recorded OOM (recorded_oom) replayed as the allocation it was: the failed request is
 * asked of the policy at the rank's capacity. The replay goes on after it either way (the
 * recorded program did: it caught the error); a request that is served is freed again at
 * once, as the program never held it. */
typedef struct {
    gboolean replayed;         /* a recorded OOM was replayed on a known capacity */
    gboolean fits;             /* the policy served the request */
    uint64_t event_index;
    memsim_size_t rounded;     /* the recorded (rounded) request */
    memsim_size_t capacity;    /* the rank's device bytes it was asked on */
    memsim_size_t allocated;   /* with the request (fits), or when it failed */
    memsim_size_t reserved;
    memsim_size_t device_free; /* capacity − reserved then */
    memsim_size_t cached_free; /* reserved − allocated then: free bytes in cached blocks */
    /* fits: capacity − reserved with the request placed (the headroom left); else the bytes
     * the device lacked: the request rounded as the policy rounds it − device_free */
    memsim_size_t margin;
    /* not fits: what would still lack if every free cached byte were usable too (0: none) */
    memsim_size_t short_packed;
} MemsimOomVerdict;

/* Peaks between two "step N" marks, overall and per phase of the running op. */
typedef struct {
    uint32_t step;
    int64_t peak_allocated;
    int64_t peak_reserved;
    int64_t phase_peak_allocated[MEMSIM_PHASE_COUNT]; /* -1 = the phase did not run */
    int64_t phase_peak_reserved[MEMSIM_PHASE_COUNT];
    double start_us; /* simulated time when the step began: the host's and every stream's
                      * work so far done (0 without op durations) */
    /* The step's work by what set each op's duration (MemsimOpBound), µs summed over its
     * streams: compute-bound, memory-bound and at the shortest kernel; collectives' time; the
     * host's dispatch of the timed ops. */
    double compute_us, memory_us, latency_us, comm_us, host_us;
    double bubble_us; /* a pipeline stage's recvs waiting for their neighbour's send */
} MemsimStepPeaks;

/* Live bytes by category at a "breakdown:NAME" mark (e.g. the model state at the
 * optimizer step). */
typedef struct {
    char name[64];
    int64_t allocated[MEMSIM_CAT_COUNT]; /* block bytes */
    int64_t requested[MEMSIM_CAT_COUNT]; /* the program's bytes */
} MemsimBreakdown;

/* The time model's assumptions behind a generated trace's durations (traces/gpus.c): the GPU
 * profile, the fractions of its tensor-core peak and bandwidths reached, its SMs (GEMM
 * waves), the shortest kernel, the host's dispatch per op, the per-GPU network bandwidth.
 * gpu[0] == 0: none (a recorded trace). */
typedef struct {
    char gpu[40];
    double compute_efficiency, bandwidth_efficiency;
    int sms;
    double kernel_us, dispatch_us, network_gbs;
} MemsimTimeModel;

typedef struct {
    uint32_t rank;           /* device index */
    uint32_t multiplicity;
    char *role;
    uint64_t n_events;
    MemsimAllocStats stats;  /* current = at the end */
    /* At the moment of peak reserved: */
    memsim_size_t at_peak_reserved_allocated;
    memsim_size_t at_peak_reserved_requested;
    uint64_t peak_reserved_event; /* event index */
    /* At the moment of peak allocated (where fragmentation is reported): */
    uint64_t peak_allocated_event;
    memsim_size_t at_peak_allocated_reserved;
    memsim_size_t at_peak_allocated_requested;
    int64_t peak_allocated_op;                            /* op index or -1 */
    char peak_op_name[96];                                /* that op's name ("" if none) */
    int32_t peak_op_layer;
    uint16_t peak_stream;                                 /* the stream of that allocation */
    uint8_t peak_op_phase;                                /* MemsimPhase */
    memsim_size_t peak_by_category[MEMSIM_CAT_COUNT];     /* live bytes (rounded) */
    memsim_size_t peak_by_category_requested[MEMSIM_CAT_COUNT];
    MemsimAllocShape shape_final;                         /* free-space shape at the end */
    MemsimOomInfo oom;          /* the first simulated OOM (the rank stops there) */
    MemsimOomInfo recorded_oom; /* an OOM the recording itself contains (snapshots) */
    MemsimOomVerdict oom_verdict; /* that OOM's request replayed at `capacity` */
    memsim_size_t capacity;     /* this rank's device bytes for the allocator, 0 = unlimited */
    /* --verify */
    gboolean verified;
    uint64_t verify_checked;
    uint64_t verify_mismatches;
    char *first_mismatch;
    uint32_t n_steps;
    MemsimStepPeaks *steps;
    uint32_t n_breakdowns;
    MemsimBreakdown *breakdowns;
    /* Device total = peak reserved + what the allocator does not see (report's overhead). */
    memsim_size_t device_total;
    double time_us;             /* simulated time at the end (0 without op durations) */
    gboolean fits;              /* no OOM and device_total ≤ the report's gpu_mem */
    /* The recording's own final figures (snapshots), when known. */
    gboolean has_recorded_final;
    memsim_size_t recorded_final_reserved;
    memsim_size_t recorded_final_allocated;
    /* The program's host (CPU) memory at its most, from the trace (offload); 0 = none. */
    memsim_size_t host_peak;
    /* Who holds the memory (traces whose allocs name their site: snapshots): the largest
     * sites at the peak of allocated bytes, and at the first OOM (simulated, or the recorded
     * one that does not fit). */
    uint32_t n_sites_at_peak;
    MemsimSite *sites_at_peak;
    uint32_t n_sites_at_oom;
    MemsimSite *sites_at_oom;
    uint64_t sites_oom_event;
    /* Steady state (generated traces' MEMSIM_EV_REPEAT): micro-batches the trace gives as
     * repetitions of the one before them (steady_repeated), and how many of those the replay
     * did not run one by one because the allocator's state, the live tensors and the clocks
     * relative to the host were the same after a repetition as before it (steady_skipped:
     * their peaks are the last simulated one's, their time and counts added; a pipeline
     * stage's repetitions, whose time is added with the other stages', count here when their
     * memory was not run either). The first point where that happened: after micro-batch
     * steady_after (1-based) of steady_of, in step steady_step; 0 when nothing was skipped.
     * steady_timed: the repetitions of a pipeline stage whose time was added with the other
     * stages' (their memory run alone, or added as steady_skipped says). */
    uint64_t steady_repeated;
    uint64_t steady_skipped;
    uint32_t steady_after, steady_of, steady_step;
    uint64_t steady_timed;
    /* Whole steps the trace gives as repetitions of the one before them (a loop whose steps
     * between the first and the last repeat), and how many of those were not run one by one
     * (as steady_skipped says of micro-batches: their peaks are the last simulated step's,
     * each gets that step's figures, its time added). */
    uint64_t steady_steps_repeated, steady_steps_skipped;
    /* The peak of the live tensors' requested bytes, each rounded up to 512: what the `exact`
     * policy would reserve at its peak on the same program (a lower bound of any policy's
     * peak reserved), whichever policy was replayed. Up to where the rank stopped. */
    memsim_size_t rounded_peak;
} MemsimRankReport;

typedef struct MemsimReport {
    char *source;       /* trace name */
    char *allocator;    /* the policy spec used */
    char *alloc_conf;   /* the settings used (torch), or NULL */
    memsim_size_t capacity; /* 0 = unlimited */
    memsim_size_t gpu_mem;        /* the device's memory, 0 = not given */
    memsim_size_t context_bytes;  /* outside the allocator: CUDA context, libraries, NCCL */
    memsim_size_t nccl_bytes;     /* of which NCCL's communicators */
    char *run;                    /* the run description (generated traces) */
    char *device;                 /* what gpu_mem is: a GPU profile's name, or NULL */
    gboolean device_assumed;      /* gpu_mem is the run's GPU profile, not given */
    uint32_t n_ranks;
    MemsimRankReport *ranks;
    MemsimTimeModel time_model; /* what the op durations assumed (generated traces) */
    /* What the trace's importer found odd but read anyway (MemsimTraceHeader.warnings), one
     * line each; NULL-terminated, or NULL for none. */
    char **warnings;
} MemsimReport;

typedef struct MemsimReplay MemsimReplay;

/* Returns a new replay for the ranks of `header` (copied), or NULL with error set (bad
 * allocator spec or settings). */
MEMSIM_API MemsimReplay *memsim_replay_new(const MemsimTraceHeader *header, const MemsimReplayOptions *opt,
                                GError **error);
/* Feeds the next events of `rank` in program order. `header` is the current header (its op
 * and string tables may have grown). FALSE with error set on an inconsistent trace (a FREE of
 * an unknown tensor, an ALLOC of a live one, ...), naming the rank and event index. */
MEMSIM_API gboolean memsim_replay_feed(MemsimReplay *rp, const MemsimTraceHeader *header, guint32 rank,
                            const MemsimEvent *events, gsize n, GError **error);
/* After the last feed: runs the events still held for parked ranks (a recv that no send will
 * meet completes on its own, the lowest rank first). `header` as for feed. FALSE with error
 * set on an inconsistent trace, as feed, or one that ends inside the unit of a REPEAT. */
MEMSIM_API gboolean memsim_replay_drain(MemsimReplay *rp, const MemsimTraceHeader *header, GError **error);
/* Ends the replay, frees it and returns the report (free with memsim_report_free). Events
 * still held (no memsim_replay_drain) are run against the header given to
 * memsim_replay_new(); a rank whose held events are inconsistent stops at the bad one. */
MEMSIM_API MemsimReport *memsim_replay_finish(MemsimReplay *rp);
/* Frees a replay without a report: after a feed failed, or to give up (NULL is accepted). */
MEMSIM_API void memsim_replay_abort(MemsimReplay *rp);

/* The allocator's share of a device of `gpu_mem` bytes (0: unlimited, then 0) when `outside`
 * bytes lie outside it (CUDA context, libraries): FALSE with a MEMSIM_ERROR_BAD_INPUT error
 * ("gpu-mem: ...") when they take it all. */
MEMSIM_API gboolean memsim_device_capacity(memsim_size_t gpu_mem, memsim_size_t outside,
                                memsim_size_t *capacity, GError **error);
/* Sets the device figures of a report (gpu_mem may be 0) and recomputes device_total and
 * fits of every rank. */
MEMSIM_API void memsim_report_set_device(MemsimReport *report, memsim_size_t gpu_mem,
                              memsim_size_t context_bytes);

/* Opens any trace file (.mst, text, PyTorch snapshot pickle), replays it and returns a new
 * report (memsim_report_free), or NULL with error set: the file cannot be read, is malformed
 * (the message names the file and the record), or the allocator spec is bad. A simulated
 * OOM is not an error: it is in the report (ranks[i].oom). `opt` may be NULL (defaults). */
MEMSIM_API MemsimReport *memsim_replay_path(const char *path, const MemsimReplayOptions *opt,
                                 GError **error);
/* As memsim_replay_path, for what an open reader (memsim/formats.h) reads from where it is;
 * `path` names it in messages. The reader stays the caller's. */
MEMSIM_API MemsimReport *memsim_replay_reader(MemsimTraceReader *reader, const char *path,
                                   const MemsimReplayOptions *opt, GError **error);
/* Replays an in-memory trace (borrowed, not changed); as memsim_replay_path. */
MEMSIM_API MemsimReport *memsim_replay_trace(MemsimTrace *trace, const MemsimReplayOptions *opt,
                                  GError **error);

/* Frees a report and everything it points to (NULL is accepted). */
MEMSIM_API void memsim_report_free(MemsimReport *report);
/* The report as JSON ({"source", "allocator", ..., "ranks": [...]}: what the command prints
 * with --json); newly allocated, g_free() it. */
MEMSIM_API char *memsim_report_to_json(const MemsimReport *report);
/* The report as a human-readable table (what the command prints); newly allocated,
 * g_free() it. */
MEMSIM_API char *memsim_report_to_text(const MemsimReport *report);

/* ---- Comparing policies (sim/compare.c) ----
 *
 *     char **specs = memsim_compare_parse_specs("torch,torch:expandable_segments=True,bfc", &err);
 *     MemsimComparison *c = memsim_compare_path("run.pickle", (const char *const *)specs, &o,
 *                                               &err);          // o: capacity, alloc_conf...
 *     char *table = memsim_comparison_to_text(c);             // g_free() it
 *     memsim_comparison_free(c); g_strfreev(specs);
 */

/* One policy's replay of the compared trace. */
typedef struct {
    char *spec;           /* the policy spec, "name[:settings]" */
    MemsimReport *report; /* its replay; NULL when it could not replay this trace */
    char *error;          /* why not (NULL when report is set) */
} MemsimCompareRun;

typedef struct {
    char *source;            /* the trace's name */
    memsim_size_t capacity;  /* device bytes for the allocator; 0 = unlimited */
    guint n_runs;
    MemsimCompareRun *runs;  /* in the order of the specs */
    MemsimReport *baseline;  /* `exact` on an unlimited device: the ratios' denominator */
} MemsimComparison;

/* Splits a list of policy specs: comma- (or semicolon-) separated, where a token that does
 * not start with a policy name continues the previous spec's settings
 * ("torch:expandable_segments=True,max_split_size_mb=128,bfc" is two specs); "all" stands for
 * every registered policy. Returns a new NULL-terminated array (free with g_strfreev), or
 * NULL with error set (an unknown name, an empty list). */
MEMSIM_API char **memsim_compare_parse_specs(const char *list, GError **error);
/* Replays the trace through each spec with the options `opt` (its allocator is ignored;
 * capacity 0 = the trace's). Bad settings, or a trace that even `exact` cannot replay, fail
 * the comparison (NULL, error set); a policy that cannot replay this trace gets an error in
 * its run instead. Returns a new comparison (free with memsim_comparison_free). */
MEMSIM_API MemsimComparison *memsim_compare_trace(MemsimTrace *trace, const char *const *specs,
                                       const MemsimReplayOptions *opt, GError **error);
/* The same on a trace file of any format (read once). */
MEMSIM_API MemsimComparison *memsim_compare_path(const char *path, const char *const *specs,
                                      const MemsimReplayOptions *opt, GError **error);
/* Sets the device figures of every run's report (memsim_report_set_device). */
MEMSIM_API void memsim_comparison_set_device(MemsimComparison *c, memsim_size_t gpu_mem,
                                  memsim_size_t context_bytes);
/* Peak reserved of run `run`, rank `rank`, divided by the baseline's; 0 when unknown. */
MEMSIM_API double memsim_comparison_vs_exact(const MemsimComparison *c, guint run, guint rank);
MEMSIM_API void memsim_comparison_free(MemsimComparison *c);
/* {"source", "capacity", "baseline", "policies": [{"allocator", "error", "ranks": [the rank
 * entries of memsim_report_to_json], "peak_reserved_vs_exact": [per rank]}]}. Newly
 * allocated; g_free() it. */
MEMSIM_API char *memsim_comparison_to_json(const MemsimComparison *c);
/* One row per policy (and rank): peak reserved and allocated, fragmentation at the peak of
 * reserved, driver calls, the ratio to exact, the OOM point. Newly allocated; g_free() it. */
MEMSIM_API char *memsim_comparison_to_text(const MemsimComparison *c);


/* The simulated time of step k of a rank (to the next step's start, the last step to the
 * end of the replay) and its parts, an estimate: compute-bound kernels, memory-bound ones
 * (with those at the shortest kernel time), the host's dispatch beyond the GPU's work
 * (overhead), and the rest, when the streams waited on collectives or a pipeline neighbour
 * (exposed communication and bubble); step = compute + memory + overhead + waiting, and
 * waiting = bubble (a stage's recvs waiting for their neighbour's send, at most the
 * waiting) + exposed communication.
 * comm_us is all collective time, overlapped or not. Zeros without op durations. */
typedef struct {
    double step_us, compute_us, memory_us, overhead_us, waiting_us, comm_us;
    double bubble_us, exposed_comm_us; /* waiting_us split: on a pipeline neighbour, else */
} MemsimStepTime;
MEMSIM_API void memsim_step_time(const MemsimRankReport *r, guint k, MemsimStepTime *out);

G_END_DECLS

#endif
