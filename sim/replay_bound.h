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

#endif
