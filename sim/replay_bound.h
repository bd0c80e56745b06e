/* Internal: a replay that gives up once a rank's requested bytes pass a bound (the planner's
 * exact test of a run no allocator setting can fit, traces/plan/plan.c). */
#ifndef MEMSIM_SIM_REPLAY_BOUND_H
#define MEMSIM_SIM_REPLAY_BOUND_H

#include <memsim/sim.h>

/* memsim_replay_trace, except that when some rank's requested bytes (the allocator's
 * statistic, requested.current) exceed `requested_limit` after an allocation, the replay
 * stops there: NULL with *over set and no error. The report of a replay that completes is
 * memsim_replay_trace's: then no rank's requested peak exceeded the limit. */
MemsimReport *memsim_replay_trace_bounded(MemsimTrace *trace, const MemsimReplayOptions *opt,
                                          int64_t requested_limit, gboolean *over,
                                          GError **error);

/* memsim_replay_trace, except that the first allocation that fails on some rank, or that
 * takes some rank's reserved bytes past `reserved_limit`, ends the replay: NULL with *misses
 * set and no error. A rank's memory is its own events' doing, so the whole replay runs out of
 * memory there too, or reserves more than that: this answers whether a run fits a device
 * (no failed allocation, the reserved peak within what the device leaves the allocator)
 * without running the rest, nor again step by step, as a replay must whose rank runs out
 * while a pipeline's steady state is added by periods. The report of a replay that completes
 * is memsim_replay_trace's. */
MemsimReport *memsim_replay_trace_if_fits(MemsimTrace *trace, const MemsimReplayOptions *opt,
                                          int64_t reserved_limit, gboolean *misses,
                                          GError **error);

#endif
