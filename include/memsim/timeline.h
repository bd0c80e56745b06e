/* memsim — the memory timeline of a replay, in bounded memory.
 *
 *     MemsimTimeline *tl = memsim_timeline_new(0);          // default bucket count
 *     MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
 *     o.timeline = tl;                                       // the replay records into it
 *     MemsimReport *rep = memsim_replay_path("run.mst", &o, &err);
 *     const MemsimTimelineRank *r = memsim_timeline_rank(tl, 0);
 *     for (gsize i = 0; i < r->n_samples; i++) ... r->samples[i].allocated_max ...
 *     memsim_export_timeline_plot(tl, "Title", "run.svg", &err);   // memsim/export.h
 *     memsim_timeline_free(tl);
 *
 * The replay adds one sample after every event that changes the allocator's figures (ALLOC,
 * FREE, EMPTY_CACHE, the starting state of a recording). Samples go into at most
 * `max_buckets` buckets per rank: each bucket covers a run of consecutive samples (all
 * buckets of a rank cover the same number, a power of two); when the buckets are full,
 * neighbouring pairs merge and the run length doubles. A bucket keeps the min and the max of
 * allocated and reserved bytes over its run, the event of its max allocated and the live
 * bytes by category at that moment, so the peak is never lost, however long the trace.
 * The exact peak points (allocated and reserved) and the OOM point are kept beside the
 * buckets. Op slices (which op ran on which stream, over which events) are bounded the same
 * way: merged pairs are named after the op that held the most memory.
 *
 * Memory: O(max_buckets × (ranks + streams)), whatever the trace length; adding a sample is
 * O(1) amortised. Time: the replay's simulated time (µs) is kept beside the event index;
 * has_time says whether the trace's ops carry durations (else it stays 0 and the event index
 * is the only clock). A sample's time is the simulated time of the memory state it records:
 * the end of the work of the latest op issued on any stream (the figures after an op's
 * allocations and frees hold once its work is done), or the host's time when that is later
 * (after a synchronize). It never goes back, so where streams overlap a sample may sit at the
 * end of another stream's op; the last sample lies at the run's simulated end.
 */
#ifndef MEMSIM_TIMELINE_H
#define MEMSIM_TIMELINE_H

#include <memsim/trace.h>

G_BEGIN_DECLS

typedef struct MemsimTimeline MemsimTimeline;

/* One bucket: a run of consecutive samples. */
typedef struct {
    uint64_t event_first, event_last; /* events of its first and last samples */
    double time_first_us, time_last_us; /* simulated time of those events */
    uint64_t event_at_max;            /* the event of the max allocated */
    double time_at_max_us;            /* and its simulated time */
    int64_t op_at_max;                /* the op running then, -1 if none */
    int64_t allocated_min, allocated_max;
    int64_t reserved_min, reserved_max;
    int64_t by_category[MEMSIM_CAT_COUNT]; /* live bytes by category at the max allocated */
    uint32_t n_samples;
} MemsimTimelineSample;

/* An op's run on a stream: from its OP event to the next OP event of the stream (events), from
 * its start to its end on the stream (time). */
typedef struct {
    uint64_t event_first, event_last;
    double time_first_us, time_last_us;
    int64_t op;         /* the op, or (merged) the op that held the most memory */
    uint32_t n_ops;     /* ops merged into this slice */
    uint32_t stream;
    int64_t allocated_max; /* the most allocated bytes seen while it ran */
} MemsimTimelineSlice;

/* One exact moment. */
typedef struct {
    uint64_t event;
    double time_us;
    int64_t op;
    int64_t allocated, reserved;
    int64_t by_category[MEMSIM_CAT_COUNT];
    memsim_size_t requested; /* the OOM point: the request that failed */
} MemsimTimelinePoint;

typedef struct {
    uint32_t device;       /* the rank's device index */
    uint32_t multiplicity;
    char *role;            /* or NULL */
    uint64_t n_events;
    gboolean has_time;     /* samples carry a simulated time */
    double end_us;         /* simulated time at the end: the last op's work done (0 without
                            * time); the replay's MemsimRankReport.time_us */
    gsize n_samples;
    const MemsimTimelineSample *samples;
    gsize n_slices;        /* all streams, each stream's slices in order */
    const MemsimTimelineSlice *slices;
    uint32_t n_streams;
    gboolean has_peak;     /* at least one sample */
    MemsimTimelinePoint peak_allocated; /* first moment of the most allocated bytes */
    MemsimTimelinePoint peak_reserved;
    gboolean oom;
    MemsimTimelinePoint oom_point;
} MemsimTimelineRank;

/* A new, empty timeline keeping at most `max_buckets` buckets per rank (rounded up to an
 * even number ≥ 16; 0 = 4096). Free with memsim_timeline_free(). */
MEMSIM_API MemsimTimeline *memsim_timeline_new(guint max_buckets);
/* Frees the timeline and everything it recorded (NULL is accepted). */
MEMSIM_API void memsim_timeline_free(MemsimTimeline *tl);

/* The ranks recorded (0 before a replay). */
MEMSIM_API guint memsim_timeline_n_ranks(const MemsimTimeline *tl);
/* The recorded figures of a rank; owned by the timeline, valid until it changes. */
MEMSIM_API const MemsimTimelineRank *memsim_timeline_rank(const MemsimTimeline *tl, guint rank);
/* The name of an op ("" when unknown or op < 0) and its phase; owned by the timeline. */
MEMSIM_API const char *memsim_timeline_op_name(const MemsimTimeline *tl, int64_t op);
MEMSIM_API MemsimPhase memsim_timeline_op_phase(const MemsimTimeline *tl, int64_t op);
/* Where the trace came from, and the device capacity the replay used (0 = unlimited). */
MEMSIM_API const char *memsim_timeline_source(const MemsimTimeline *tl);
MEMSIM_API memsim_size_t memsim_timeline_capacity(const MemsimTimeline *tl);
/* The allocator spec of the replay that recorded it ("" if none). */
MEMSIM_API const char *memsim_timeline_allocator(const MemsimTimeline *tl);

/* ---- recording: called by the replay (sim/replay.c) ---- */

/* Starts a recording for the ranks of `header`; a timeline records one replay (a second
 * begin clears the first). */
MEMSIM_API void memsim_timeline_begin(MemsimTimeline *tl, const MemsimTraceHeader *header,
                           const char *allocator, memsim_size_t capacity);
/* The figures after event `event` of `rank`; `time_us` is the host's time when the allocator
 * was called (the sample is stamped with the later of it and the end of the latest op's work,
 * see above); by_category: live bytes per category. */
MEMSIM_API void memsim_timeline_sample(MemsimTimeline *tl, const MemsimTraceHeader *header, guint32 rank,
                            uint64_t event, double time_us, int64_t op, int64_t allocated,
                            int64_t reserved, const int64_t *by_category);
/* An OP event: op `op` runs on `stream` from start_us to end_us (equal when it has no
 * duration). */
MEMSIM_API void memsim_timeline_op(MemsimTimeline *tl, const MemsimTraceHeader *header, guint32 rank,
                        uint64_t event, int64_t op, uint32_t stream, double start_us,
                        double end_us);
/* The rank ran out of memory at `event` asking for `requested` bytes. */
MEMSIM_API void memsim_timeline_oom(MemsimTimeline *tl, const MemsimTraceHeader *header, guint32 rank,
                         uint64_t event, double time_us, int64_t op, memsim_size_t requested,
                         int64_t allocated, int64_t reserved, const int64_t *by_category);
/* The rank's program ended after n_events events. */
MEMSIM_API void memsim_timeline_end(MemsimTimeline *tl, guint32 rank, uint64_t n_events);

G_END_DECLS

#endif
