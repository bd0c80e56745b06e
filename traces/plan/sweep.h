/* Internal: the planner's sweep (traces/plan/plan.c), shared with the rows it makes
 * (traces/plan/rows.c). */
#ifndef MEMSIM_TRACES_PLAN_SWEEP_H
#define MEMSIM_TRACES_PLAN_SWEEP_H

#include <memsim/estimate.h>
#include <memsim/plan.h>
#include <memsim/sim.h>

#include "traces/plan/cost.h"

typedef struct {
    gboolean done;
    gboolean failed;     /* the generator refused it (the message is kept) */
    gboolean fits;       /* under some allocator setting (or with offload) */
    gboolean expandable; /* fits only with expandable_segments */
    gboolean measured;   /* the figures are a full replay (fits, or the miss measured
                            without a memory limit) */
    memsim_size_t peak;  /* largest device total (offload: minus the optimizer state) */
    memsim_size_t host;  /* offload: largest optimizer state */
    uint32_t n_ranks;
    MemsimPlanRank *ranks;
    char *error;
    double step_s; /* the simulated time of the run's last step (slowest rank); 0: none */
    MemsimStepTime parts; /* that rank's step, its parts */
    double host_s;        /* that step's host dispatch (a lower bound of its time) */
} Probe;

typedef struct {
    int idx; /* enumeration order: the last tie-break */
    MemsimMethod method;
    gboolean replicas;
    int tp, pp, dp, v;
    MemsimPipeSchedule schedule;
    MemsimCheckpointing ckpt;
    int replicas_n; /* data-parallel replicas */
    int nb;
    int64_t *bs;         /* micro-batches, ascending */
    int *n_micro;        /* micro-batches per step at each b */
    CostResult *cost;    /* at each b */
    double best_tps;     /* the best any b could do */
    memsim_size_t bound; /* lower bound of the device total (state + context + NCCL) */
    gboolean pruned_bound, pruned_cost;
    Probe *probes;
    int row;          /* the chosen b, or −1 */
    gboolean miss;    /* b = bs[0] does not fit */
    int fam;          /* its family (same method and degrees) */
    int64_t fit_max;  /* largest b known to fit (0: none), by its own probes or
                         inferred from a family member that needs more memory */
    int64_t fail_min; /* smallest b known not to fit (G_MAXINT64: none) */
    gboolean floored; /* the candidates were raised to plan_step_floor at the largest b */
} Group;

/* Configurations with the same method and degrees: their peaks are ordered by the
 * checkpointing mode (full ≤ selective ≤ none) and the schedule (1F1B ≤ interleaved,
 * 1F1B ≤ GPipe), so what one probe shows about one member says something of the others. */
typedef struct {
    int first, n;    /* groups[first .. first + n) */
    double best_tps; /* the best any member could do */
    double likely;   /* its fastest member at the smallest b guessed to fit (the order only) */
    gboolean pruned_bound;
    gboolean pruned_cost; /* could not reach the top rows */
    int row;              /* the member whose row is the family's, or −1 */
    gboolean sound;       /* its guesses redone without the cost model (Sweep.model_over) */
} Degrees;

typedef struct {
    const MemsimModel *model;
    MemsimPlanOptions opt;
    const MemsimGpu *gpu;
    const char *gpu_name;
    MemsimRun base;
    memsim_size_t gpu_mem, ctx;
    double compute_fraction, memory_fraction;
    gboolean offload; /* the offload phase */
    /* a DeepSpeed config's offload phase: the config with offload_optimizer.device=cpu,
     * simulated as it is (traces/deepspeed.c ds_with_set) */
    struct MemsimDeepspeed *ds_offload;
    int K;            /* rows that matter (G_MAXINT = all) */
    double *known;    /* per family: the fastest row known to be possible (0: none) */
    Group *groups;
    int n_groups;
    Degrees *fams;
    int n_fams;
    GMutex lock;
    guint done, total;
    guint n_generated, n_replays, n_pruned_exact, n_pruned_cost, n_pruned_bound;
    guint n_bounded;    /* chain bounds computed (traces/plan/bound.c) */
    guint n_short_over; /* probes settled by their short run's requested bytes */
    gint model_over;    /* the cost model overestimated a simulated Megatron step */
    gboolean all_stages; /* short runs make every pipeline stage (bound.c short_stages; the
                            tests compare) */
} Sweep;

extern const char *const plan_method_names[];
extern const char *const plan_ckpt_names[];
extern const char *const plan_sched_names[];

/* The run of candidate `j` (its micro-batch) of group `g`. */
void plan_candidate_run(const Sweep *sw, const Group *g, int j, MemsimRun *r);
/* A lower bound of the simulated step of candidate `j` of Megatron group `g`, in seconds,
 * from a short run of its stage programs (traces/plan/bound.c); 0 when there is none. */
double plan_step_bound(const Sweep *sw, const Group *g, int j);
/* Only the kernel time of the busiest stage's micro-batches at candidate j: with a fixed
 * global batch, a lower bound of the step at every candidate b that divides bs[j]. */
double plan_step_floor(const Sweep *sw, const Group *g, int j);
/* The micro-batches of candidate j's short run: for its step (plan_step_bound) or, `full`,
 * for its memory (plan_short_run_over); 0 when there is none. */
int plan_short_micro(const Group *g, int j, gboolean full);
/* Whether candidate j's short run (plan_step_bound's) already has some rank request more than
 * `limit` bytes: then the run does too. */
gboolean plan_short_run_over(const Sweep *sw, const Group *g, int j, int64_t limit);
/* Whether rank `rank` of a generated trace has live requests over `limit` bytes at some point
 * (what memsim_replay_trace_bounded asks, read off the events: plan_short_run_over's test). */
gboolean plan_rank_requested_over(MemsimTrace *t, guint32 rank, int64_t limit);
/* The rows that fit, best first, and the closest misses (newly allocated). */
void plan_collect(Sweep *sw, MemsimPlanRow **rows_out, guint *n_rows, MemsimPlanRow **miss_out,
                    guint *n_misses);
void plan_row_clear(MemsimPlanRow *r);
/* The misses plan_collect will show that are not measured yet (Group *): the sweep simulates
 * them before collecting. Free the array (not the groups). */
GPtrArray *plan_misses_to_measure(const Sweep *sw);

#endif
