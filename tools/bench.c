/* memsim-bench — speed figures measured on this machine (not a test).
 *
 *   memsim-bench estimate [--model M] [--seq N] [--repeat R] [--allocator SPEC]
 *       Times `memsim estimate` for a preset (default llama-2-70b at seq 4096, two steps,
 *       through torch): generating the trace, replaying it, in total; best of R runs (default
 *       5); reports generated events per second. CPU time of this process, one core.
 *
 *   memsim-bench replay [--events N] [--allocator SPEC] [--keep FILE.mst] [--repeat R]
 *       Writes a synthetic single-stream trace of N events (default 10 million) to a
 *       temporary .mst, then times (1) reading it alone, (2) reading + simulating it through
 *       the allocator (default torch), R times each (default 3). Prints events per second and
 *       the peak resident memory of each run, so that memory can be seen not to grow with
 *       the trace length, then the median and the best rate.
 *
 *   memsim-bench export [--events N] [--keep FILE.mst]
 *       Exports of a replay of the synthetic trace (default 10 million events), at N/10 and
 *       N events: the replay alone, the replay recording a timeline (its cost per event),
 *       then the Perfetto JSON, SVG, PNG and CSV written from the timeline, with file sizes.
 *       Exports depend on the timeline's bucket count, not on the trace length; the replay
 *       with a timeline must stay linear. CPU time of this process.
 *
 *   memsim-bench compare [--events N] [--allocators LIST|all]
 *       Writes the synthetic trace of N events (default 10 million) once and loads it into
 *       memory, then replays it through each policy (default torch, exact, bfc, buddy,
 *       best-fit; `all` = every registered policy) and prints events per second of the replay
 *       alone: the policy plus the replay's bookkeeping, without decoding the file. CPU time
 *       of this process, one core.
 *
 *   memsim-bench plan [--model M] [--gpus N] [--gpu G] [--seq N] [--top K] [--threads T]
 *                     [--exhaustive]
 *       Times `memsim plan` (default llama-2-70b on 64 × h100-80gb, seq 4096: every method and
 *       degree, micro-batch bisection, the three checkpointing modes, expandable_segments):
 *       wall and CPU time, traces generated and replays, candidates simulated per second.
 *       With --exhaustive also the sweep without pruning or bisection (minutes), the speed-up
 *       and whether both rank the same rows.
 *
 *   memsim-bench megatron [CASES.jsonl] [--json] [--time]
 *       The Megatron-LM development set (default ../shared/data/megatron-golden/cases.jsonl
 *       beside the source tree): each case's launch flags and environment, as a command line,
 *       through memsim_megatron_parse; the estimated peak allocated of the rank Megatron logs
 *       (global rank world_size − 1: the last pipeline stage) at step 1 and at the last step
 *       measured, against the `mem-max-allocated-bytes` Megatron logged; the errors, their mean
 *       absolute value, the estimate's time; the cases memsim refuses, with the reason. --json
 *       prints the same as one JSON object (tests/test_megatron_golden.c reads it). --time
 *       prints the iteration times instead: the measured median (iteration_time_median_s), the
 *       simulated step of the slowest rank (Megatron's interval timer ends at a barrier), the
 *       error, and that step's parts: compute, memory-bound, exposed host time, waiting
 *       (collectives, pipeline), and the host's time in all.
 *
 *   memsim-bench snapshot [--events N] [--big-mb M] [--file F] [--big-file F] [--keep DIR]
 *                         [--repeat R] [--python-big] [--schema 2.0|2.1]
 *       Issue 17's speed figures for PyTorch memory snapshots. Makes (or takes) a synthetic
 *       snapshot of N trace entries (default 895,000: 33 MB) and one of about M MB (default
 *       350; 0: none) with tools/snapshot-gen.py (fixed seed, in the given schema: torch
 *       2.0's entries by default, 2.1's with time_us and frames; kept in DIR and reused),
 *       then measures, R times each (default 5; the Python ones 3, or once on the big file,
 *       only with --python-big): `memsim replay FILE` end to end as a child process (wall,
 *       CPU, peak RSS), the plain Python model of the allocator on the same file
 *       (tools/torch_alloc_model.py: pickle.load, then its replay), and Python's pickle.load
 *       of the file alone; medians, the ratios, whether both models give the same peaks, and
 *       the acceptance lines (≥ 25× the Python model end to end and ≥ 5× pickle.load, in
 *       wall time, with the CPU ratios, all of memsim's threads counted, beside them; < 100
 *       MB on the N-entry file; < 5 s and < 500 MB on the big one). The first line names the
 *       machine (CPU model, processors): the ratios depend on it. Beside them, the part of
 *       memsim's time that is reading alone: a child process (this program, `snapshot-read
 *       FILE`) that opens the snapshot as `memsim replay` does (read, parse, the events
 *       coded) and replays nothing; against it, the time the 25× line leaves for the whole.
 *
 *   memsim-bench families [--seq N] [--repeat R] [--limit S]
 *       For each model family, its largest preset (by parameter count) through `memsim
 *       estimate` with the run defaults (and --seq if given): generate + replay through torch,
 *       best of R runs (default 3), CPU time of this process. Exit status 1 if one takes more
 *       than S seconds (default 0.3).
 *
 *   memsim-bench steady [--repeat R] [--plan-repeat P] [--full] [--no-plans]
 *       The steady state (micro-batches that repeat generated once, added instead of simulated
 *       where the allocator's state repeats): each measurement in a child process of its own,
 *       the median of R runs (default 5; P for the plans, default 1) of its wall time, CPU time
 *       and peak resident memory. `estimate` of llama-2-7b at seq 1024, LoRA, with --grad-accum
 *       1 and 256 (the bound: 256 within 2× of 1, judged on the median ratio of R pairs of
 *       runs made in alternation) and with 50 steps (no bound: the steps that repeat);
 *       llama-2-70b on 64 × h100-80gb as tp 8, pp 4, dp 2 with 256 micro-batches (bound:
 *       0.5 s, 100 MB); `plan --global-batch` for llama-2-70b on 64 GPUs at 512 and 2048
 *       (bound 5 s) and llama-3.1-405b on 1024 GPUs at 4096 (bound 30 s). With --full each
 *       estimate is also run with MEMSIM_NO_SKIP=1, the full simulation, and the speed-up
 *       printed. Exit status 1 when a bound is not met. The first line names the machine
 *       (CPU model, processors).
 *
 * `estimate --megatron-args FILE` times a Megatron launch instead of a preset.
 *
 * The synthetic program looks like training: activations pile up through a "forward" pass
 * and are released in reverse through a "backward" pass, with short-lived temporaries in
 * between and sizes spread from 512 B to 256 MiB (log-uniform), from a fixed seed.
 */
#include <memsim/estimate.h>
#include <memsim/export.h>
#include <memsim/formats.h>
#include <memsim/gen.h>
#include <memsim/megatron.h>
#include <memsim/plan.h>
#include <memsim/sim.h>

#include <json-glib/json-glib.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <glib/gstdio.h>
#include <inttypes.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "malloc_tune.h"

static long peak_rss_kib(void)
{
    /* VmHWM of this process (the high-water mark; reset before each phase). */
    FILE *f = fopen("/proc/self/status", "r");
    long kib = -1;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0)
            kib = strtol(line + 6, NULL, 10);
    if (f)
        fclose(f);
    return kib;
}

static void reset_peak_rss(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static uint64_t synth_size(uint64_t *rng)
{
    /* log-uniform in [2^9, 2^28] */
    double e = 9.0 + (double)(xorshift(rng) % 1000000) / 1000000.0 * 19.0;
    return (uint64_t)__builtin_exp2(e);
}

static gboolean write_synthetic(const char *path, uint64_t n_events, GError **error)
{
    MemsimTrace *t = memsim_trace_new("synthetic training-like trace");
    memsim_trace_add_rank(t, 0, 1);
    MemsimTraceWriter *w =
        memsim_trace_writer_new(path, MEMSIM_FORMAT_MST, memsim_trace_header(t), error);
    memsim_trace_free(t);
    if (!w)
        return FALSE;
    enum { CHUNK = 65536 };
    MemsimEvent *buf = g_new0(MemsimEvent, CHUNK);
    gsize nb = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull, next_id = 1, written = 0;
    GArray *acts = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    gboolean ok = TRUE;
#define PUT(...)                                                                               \
    do {                                                                                       \
        MemsimEvent e_ = {__VA_ARGS__};                                                        \
        buf[nb++] = e_;                                                                        \
        written++;                                                                             \
        if (nb == CHUNK) {                                                                     \
            if (!memsim_trace_writer_write(w, 0, buf, nb, error))                              \
                ok = FALSE;                                                                    \
            nb = 0;                                                                            \
        }                                                                                      \
    } while (0)
    while (written < n_events && ok) {
        /* forward: 200 layers, each keeps 4 activations and frees 2 temporaries */
        for (int layer = 0; layer < 200 && written < n_events; layer++) {
            for (int k = 0; k < 4; k++) {
                uint64_t id = next_id++;
                PUT(.kind = MEMSIM_EV_ALLOC, .id = id, .size = synth_size(&rng),
                    .category = MEMSIM_CAT_ACTIVATION);
                g_array_append_val(acts, id);
            }
            uint64_t t1 = next_id++, t2 = next_id++;
            PUT(.kind = MEMSIM_EV_ALLOC, .id = t1, .size = synth_size(&rng),
                .category = MEMSIM_CAT_TEMPORARY);
            PUT(.kind = MEMSIM_EV_ALLOC, .id = t2, .size = synth_size(&rng),
                .category = MEMSIM_CAT_TEMPORARY);
            PUT(.kind = MEMSIM_EV_FREE, .id = t1);
            PUT(.kind = MEMSIM_EV_FREE, .id = t2);
        }
        /* backward: gradients as temporaries, activations released in reverse */
        while (acts->len && written < n_events) {
            uint64_t g = next_id++;
            PUT(.kind = MEMSIM_EV_ALLOC, .id = g, .size = synth_size(&rng),
                .category = MEMSIM_CAT_GRADIENT);
            PUT(.kind = MEMSIM_EV_FREE, .id = g_array_index(acts, uint64_t, acts->len - 1));
            g_array_set_size(acts, acts->len - 1);
            PUT(.kind = MEMSIM_EV_FREE, .id = g);
        }
    }
    if (ok && nb)
        ok = memsim_trace_writer_write(w, 0, buf, nb, error);
    g_free(buf);
    g_array_unref(acts);
    if (!memsim_trace_writer_close(w, ok ? error : NULL))
        ok = FALSE;
    return ok;
#undef PUT
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The options of a model benchmark parsed, its model (default llama-2-70b) loaded and its run
 * set up at `seq`; NULL after printing the error. `model` and `seq` are read after parsing,
 * through the pointers the entries fill. */
static MemsimModel *setup(const char *name, const GOptionEntry *entries, int *argc, char ***argv,
                          char *const *model, const gint64 *seq, MemsimRun *run)
{
    GOptionContext *ctx = g_option_context_new(name);
    g_option_context_add_main_entries(ctx, entries, NULL);
    GError *error = NULL;
    gboolean ok = g_option_context_parse(ctx, argc, argv, &error);
    g_option_context_free(ctx);
    MemsimModel *m = ok ? memsim_model_load(*model ? *model : "llama-2-70b", &error) : NULL;
    if (!m) {
        fprintf(stderr, "memsim-bench: %s\n", error->message);
        g_error_free(error);
        return NULL;
    }
    *run = memsim_run_defaults();
    char sq[32];
    g_snprintf(sq, sizeof sq, "%" G_GINT64_FORMAT, *seq);
    memsim_run_set(run, "seq", sq, NULL);
    return m;
}

static int bench_estimate(int argc, char **argv)
{
    char *model = NULL, *allocator = NULL, *mgargs = NULL;
    char **sets = NULL;
    gint64 seq = 4096;
    gint repeat = 5;
    GOptionEntry entries[] = {
        {"megatron-args", 0, 0, G_OPTION_ARG_FILENAME, &mgargs,
         "A Megatron-LM launch (command line, script or model_config.yaml) instead of --model",
         "FILE"},
        {"set", 0, 0, G_OPTION_ARG_STRING_ARRAY, &sets,
         "A run setting, e.g. --set gpus=64 --set tp=8 (repeatable)", "KEY=VALUE"},
        {"model", 0, 0, G_OPTION_ARG_STRING, &model, "Preset (default llama-2-70b)", "M"},
        {"seq", 0, 0, G_OPTION_ARG_INT64, &seq, "Sequence length (default 4096)", "N"},
        {"repeat", 0, 0, G_OPTION_ARG_INT, &repeat, "Runs; the best is reported (default 5)", "R"},
        {"allocator", 0, 0, G_OPTION_ARG_STRING, &allocator, "Policy (default torch)", "SPEC"},
        {NULL}};
    GError *error = NULL;
    MemsimRun run;
    MemsimModel *m = setup("estimate", entries, &argc, &argv, &model, &seq, &run);
    if (!m)
        return 2;
    MemsimMegatron *mg = NULL;
    if (mgargs) {
        mg = memsim_megatron_load(mgargs, &error);
        if (!mg) {
            fprintf(stderr, "memsim-bench: %s\n", error->message);
            return 2;
        }
        memsim_run_clear(&run);
        run = memsim_run_defaults();
        memsim_megatron_apply(mg, &run);
    }
    const MemsimModel *model_used = mg ? memsim_megatron_model(mg) : m;
    for (char **kv = sets; kv && *kv; kv++) {
        g_auto(GStrv) p = g_strsplit(*kv, "=", 2);
        if (!p[0] || !p[1] || !memsim_run_set(&run, p[0], p[1], &error)) {
            fprintf(stderr, "memsim-bench: --set %s: %s\n", *kv, error ? error->message : "KEY=VALUE");
            return 2;
        }
    }
    g_strfreev(sets);
    double best_gen = 1e9, best_sim = 1e9, best_total = 1e9;
    gsize n_events = 0;
    for (int i = 0; i < repeat; i++) {
        double t0 = cpu_seconds();
        MemsimTrace *t = memsim_generate(model_used, &run, &error);
        if (!t) {
            fprintf(stderr, "memsim-bench: %s\n", error->message);
            return 2;
        }
        double t1 = cpu_seconds();
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.allocator = allocator;
        MemsimReport *rep = memsim_replay_trace(t, &o, &error);
        double t2 = cpu_seconds();
        n_events = 0;
        for (guint32 k = 0; k < memsim_trace_header(t)->n_ranks; k++) {
            gsize nk;
            memsim_trace_events(t, k, &nk);
            n_events += nk;
        }
        memsim_report_free(rep);
        memsim_trace_free(t);
        double t3 = cpu_seconds();
        if (t1 - t0 < best_gen)
            best_gen = t1 - t0;
        if (t2 - t1 < best_sim)
            best_sim = t2 - t1;
        if (t3 - t0 < best_total)
            best_total = t3 - t0;
    }
    g_autofree char *desc = memsim_run_describe(&run);
    printf("estimate %s, %s, %s: %zu events\n", memsim_model_name(model_used), desc,
           allocator ? allocator : "torch", n_events);
    printf("  generate: %7.1f ms  (%.1f M events/s)\n", best_gen * 1e3,
           (double)n_events / best_gen / 1e6);
    printf("  simulate: %7.1f ms  (%.1f M events/s)\n", best_sim * 1e3,
           (double)n_events / best_sim / 1e6);
    printf("  total:    %7.1f ms  (best of %d, CPU time of one core)\n", best_total * 1e3, repeat);
    memsim_run_clear(&run);
    memsim_megatron_free(mg);
    g_free(mgargs);
    memsim_model_free(m);
    g_free(model);
    g_free(allocator);
    return 0;
}

/* ---- families ---- */

static int bench_families(int argc, char **argv)
{
    gint64 seq = 0;
    gint repeat = 3;
    gdouble limit = 0.3;
    GOptionEntry entries[] = {
        {"seq", 0, 0, G_OPTION_ARG_INT64, &seq, "Sequence length (default: the run default)", "N"},
        {"repeat", 0, 0, G_OPTION_ARG_INT, &repeat, "Runs; the best is reported (default 3)", "R"},
        {"limit", 0, 0, G_OPTION_ARG_DOUBLE, &limit, "Seconds allowed (default 0.3)", "S"},
        {NULL}};
    GOptionContext *ctx = g_option_context_new("families");
    g_option_context_add_main_entries(ctx, entries, NULL);
    GError *error = NULL;
    if (!g_option_context_parse(ctx, &argc, &argv, &error)) {
        fprintf(stderr, "memsim-bench: %s\n", error->message);
        g_option_context_free(ctx);
        return 2;
    }
    g_option_context_free(ctx);
    /* the largest preset of each family */
    g_auto(GStrv) names = memsim_model_presets();
    g_autoptr(GHashTable) largest = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    g_autoptr(GHashTable) count = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    for (char **n = names; *n; n++) {
        MemsimModel *m = memsim_model_load(*n, NULL);
        const char *fam = memsim_model_family(m);
        int64_t *c = g_hash_table_lookup(count, fam);
        if (!c || *c < memsim_model_n_params(m)) {
            int64_t *nc = g_new(int64_t, 1);
            *nc = memsim_model_n_params(m);
            g_hash_table_replace(count, g_strdup(fam), nc);
            g_hash_table_replace(largest, g_strdup(fam), g_strdup(*n));
        }
        memsim_model_free(m);
    }
    GList *fams = g_list_sort(g_hash_table_get_keys(largest), (GCompareFunc)strcmp);
    int rc = 0;
    double worst = 0;
    for (GList *l = fams; l; l = l->next) {
        const char *preset = g_hash_table_lookup(largest, l->data);
        MemsimModel *m = memsim_model_load(preset, &error);
        MemsimRun run = memsim_run_defaults();
        if (seq > 0) {
            char sq[32];
            g_snprintf(sq, sizeof sq, "%" G_GINT64_FORMAT, seq);
            memsim_run_set(&run, "seq", sq, NULL);
        }
        double best = 1e9;
        gsize n_events = 0;
        for (int i = 0; i < repeat; i++) {
            double t0 = cpu_seconds();
            MemsimTrace *t = memsim_generate(m, &run, &error);
            if (!t) {
                fprintf(stderr, "memsim-bench: %s: %s\n", preset, error->message);
                return 2;
            }
            n_events = 0;
            for (guint32 k = 0; k < memsim_trace_header(t)->n_ranks; k++) {
                gsize nk;
                memsim_trace_events(t, k, &nk);
                n_events += nk;
            }
            MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
            memsim_report_free(rep);
            memsim_trace_free(t);
            double dt = cpu_seconds() - t0;
            if (dt < best)
                best = dt;
        }
        if (best > worst)
            worst = best;
        printf("%-12s %-18s %9zu events %8.1f ms%s\n", (const char *)l->data, preset, n_events,
               best * 1e3, best > limit ? "  (over the limit)" : "");
        if (best > limit)
            rc = 1;
        memsim_run_clear(&run);
        memsim_model_free(m);
    }
    printf("slowest: %.1f ms (limit %.0f ms; best of %d, CPU time of one core)\n", worst * 1e3,
           limit * 1e3, repeat);
    g_list_free(fams);
    return rc;
}

/* ---- export ---- */

static double file_mib(const char *path)
{
    GStatBuf sb;
    return g_stat(path, &sb) == 0 ? (double)sb.st_size / 1048576.0 : -1;
}

/* One size: replay without and with a timeline, then each export; FALSE on an error. */
static gboolean bench_export_one(const char *trace, const char *dir, uint64_t n_events,
                                 GError **error)
{
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    double t0 = cpu_seconds();
    MemsimReport *rep = memsim_replay_path(trace, &o, error);
    if (!rep)
        return FALSE;
    double t1 = cpu_seconds();
    memsim_report_free(rep);
    MemsimTimeline *tl = memsim_timeline_new(16384);
    o.timeline = tl;
    rep = memsim_replay_path(trace, &o, error);
    double t2 = cpu_seconds();
    if (!rep) {
        memsim_timeline_free(tl);
        return FALSE;
    }
    printf("%10" PRIu64 " events: replay %.2f s; with a timeline %.2f s (%+.1f ns/event), "
           "%zu buckets kept\n",
           n_events, t1 - t0, t2 - t1, ((t2 - t1) - (t1 - t0)) * 1e9 / (double)n_events,
           memsim_timeline_rank(tl, 0)->n_samples);
    static const char *const names[] = {"run.json", "run.svg", "run.png", "run.csv"};
    gboolean ok = TRUE;
    for (gsize i = 0; ok && i < G_N_ELEMENTS(names); i++) {
        g_autofree char *path = g_build_filename(dir, names[i], NULL);
        double a = cpu_seconds();
        if (i == 0)
            ok = memsim_export_perfetto(tl, path, error);
        else if (i == 3)
            ok = memsim_export_timeline_csv(tl, path, error);
        else
            ok = memsim_export_timeline_plot(tl, NULL, path, error);
        double b = cpu_seconds();
        if (ok)
            printf("            %-9s %.3f s, %.2f MiB\n", names[i] + 4, b - a, file_mib(path));
        g_unlink(path);
    }
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    return ok;
}

static int bench_export(int argc, char **argv)
{
    gint64 n_events = 10000000;
    char *keep = NULL;
    GOptionEntry entries[] = {
        {"events", 0, 0, G_OPTION_ARG_INT64, &n_events, "Events in the synthetic trace", "N"},
        {"keep", 0, 0, G_OPTION_ARG_FILENAME, &keep, "Keep the N-event trace here", "FILE"},
        {NULL}};
    GOptionContext *ctx = g_option_context_new("export");
    g_option_context_add_main_entries(ctx, entries, NULL);
    GError *error = NULL;
    if (!g_option_context_parse(ctx, &argc, &argv, &error) || argc != 1 || n_events < 10) {
        fprintf(stderr, "usage: memsim-bench export [--events N] [--keep FILE.mst]\n%s\n",
                error ? error->message : "");
        g_option_context_free(ctx);
        return 2;
    }
    g_option_context_free(ctx);
    g_autofree char *dir = g_dir_make_tmp("memsim-bench-XXXXXX", &error);
    if (!dir) {
        fprintf(stderr, "memsim-bench: %s\n", error->message);
        return 2;
    }
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        uint64_t n = k == 0 ? (uint64_t)n_events / 10 : (uint64_t)n_events;
        g_autofree char *trace = keep && k == 1 ? g_strdup(keep)
                                                : g_build_filename(dir, "synthetic.mst", NULL);
        if (!write_synthetic(trace, n, &error) || !bench_export_one(trace, dir, n, &error)) {
            fprintf(stderr, "memsim-bench: %s\n", error->message);
            rc = 2;
        }
        if (!(keep && k == 1))
            g_unlink(trace);
    }
    g_rmdir(dir);
    g_free(keep);
    return rc;
}

static int bench_compare(int argc, char **argv)
{
    gint64 n_events = 10000000;
    char *list = NULL;
    GOptionEntry entries[] = {
        {"events", 0, 0, G_OPTION_ARG_INT64, &n_events, "Events in the synthetic trace", "N"},
        {"allocators", 0, 0, G_OPTION_ARG_STRING, &list,
         "Comma-separated policies, or all (default torch,exact,bfc,buddy,best-fit)", "LIST"},
        {NULL}};
    GOptionContext *ctx = g_option_context_new("compare");
    g_option_context_add_main_entries(ctx, entries, NULL);
    GError *error = NULL;
    if (!g_option_context_parse(ctx, &argc, &argv, &error) || argc != 1 || n_events <= 0) {
        fprintf(stderr, "usage: memsim-bench compare [--events N] [--allocators LIST|all]\n%s\n",
                error ? error->message : "");
        g_option_context_free(ctx);
        return 2;
    }
    g_option_context_free(ctx);
    char **specs = memsim_compare_parse_specs(list ? list : "torch,exact,bfc,buddy,best-fit",
                                              &error);
    g_autofree char *dir = specs ? g_dir_make_tmp("memsim-bench-XXXXXX", &error) : NULL;
    g_autofree char *path = dir ? g_build_filename(dir, "synthetic.mst", NULL) : NULL;
    MemsimTrace *t = NULL;
    if (!dir || !write_synthetic(path, (uint64_t)n_events, &error) ||
        !(t = memsim_trace_load(path, &error))) {
        fprintf(stderr, "memsim-bench: %s\n", error->message);
        return 2;
    }
    g_unlink(path);
    g_rmdir(dir);
    gsize n = 0;
    memsim_trace_events(t, 0, &n);
    printf("synthetic trace: %zu events in memory; replay alone, CPU time of one core\n", n);
    printf("%-12s %10s %12s %14s %14s\n", "policy", "seconds", "M events/s", "peak alloc.",
           "peak reserved");
    int rc = 0;
    for (char **spec = specs; *spec; spec++) {
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.allocator = *spec;
        double t0 = cpu_seconds();
        MemsimReport *rep = memsim_replay_trace(t, &o, &error);
        double t1 = cpu_seconds();
        if (!rep) {
            fprintf(stderr, "memsim-bench: %s: %s\n", *spec, error->message);
            g_clear_error(&error);
            rc = 2;
            continue;
        }
        char a[32], b[32];
        printf("%-12s %10.3f %12.1f %14s %14s\n", *spec, t1 - t0, (double)n / (t1 - t0) / 1e6,
               memsim_format_bytes((memsim_size_t)rep->ranks[0].stats.allocated.peak, a, 32),
               memsim_format_bytes((memsim_size_t)rep->ranks[0].stats.reserved.peak, b, 32));
        memsim_report_free(rep);
    }
    memsim_trace_free(t);
    g_strfreev(specs);
    g_free(list);
    return rc;
}

static double wall_seconds(void)
{
    return (double)g_get_monotonic_time() / 1e6;
}

static int bench_plan(int argc, char **argv)
{
    char *model = NULL, *gpu = NULL;
    gint gpus = 64, top = 0, threads = 0;
    gint64 seq = 4096;
    gboolean exhaustive = FALSE;
    GOptionEntry entries[] = {
        {"model", 0, 0, G_OPTION_ARG_STRING, &model, "Preset (default llama-2-70b)", "M"},
        {"gpus", 0, 0, G_OPTION_ARG_INT, &gpus, "GPUs (default 64)", "N"},
        {"gpu", 0, 0, G_OPTION_ARG_STRING, &gpu, "GPU profile (default h100-80gb)", "G"},
        {"seq", 0, 0, G_OPTION_ARG_INT64, &seq, "Sequence length (default 4096)", "N"},
        {"top", 0, 0, G_OPTION_ARG_INT, &top, "Rows ranked (default: plan's)", "K"},
        {"threads", 0, 0, G_OPTION_ARG_INT, &threads, "Threads (default: one per core)", "T"},
        {"exhaustive", 0, 0, G_OPTION_ARG_NONE, &exhaustive,
         "Also run the sweep without pruning and bisection (slow)", NULL},
        {NULL}};
    GError *error = NULL;
    MemsimRun run;
    MemsimModel *m = setup("plan", entries, &argc, &argv, &model, &seq, &run);
    if (!m)
        return 2;
    MemsimPlanOptions o = memsim_plan_options_defaults();
    o.run = &run;
    o.gpus = gpus;
    o.gpu = gpu ? gpu : "h100-80gb";
    o.threads = threads;
    if (top > 0)
        o.top = top;
    MemsimPlan *runs[2] = {NULL, NULL};
    double wall[2] = {0, 0}, cpu[2] = {0, 0};
    for (int k = 0; k < (exhaustive ? 2 : 1); k++) {
        MemsimPlanOptions ok = o;
        ok.exhaustive = k == 1;
        double w0 = wall_seconds(), c0 = cpu_seconds();
        runs[k] = memsim_plan(m, &ok, &error);
        wall[k] = wall_seconds() - w0;
        cpu[k] = cpu_seconds() - c0;
        if (!runs[k]) {
            fprintf(stderr, "memsim-bench: %s\n", error->message);
            return 2;
        }
        const MemsimPlan *p = runs[k];
        printf("plan %s on %d × %s, seq %" G_GINT64_FORMAT ", top %d%s:\n", memsim_model_name(m),
               gpus, o.gpu, seq, o.top, k ? ", exhaustive" : "");
        printf("  %u configurations, %" G_GUINT64_FORMAT " candidates with micro-batches and "
               "allocator settings\n", p->n_configs, p->n_candidates);
        printf("  %u traces generated, %u replays, %u steps bounded from short runs; pruned %u "
               "configurations by the memory bound, %u by the cost model, %u replays by the "
               "exact bound\n",
               p->n_generated, p->n_replays, p->n_bounded, p->n_pruned_bound, p->n_pruned_cost,
               p->n_pruned_exact);
        printf("  wall %.2f s, CPU %.2f s on %d thread(s): %.1f candidates simulated per second "
               "(%.1f replays per second)\n",
               wall[k], cpu[k], p->threads, p->n_generated / wall[k], p->n_replays / wall[k]);
        if (p->n_rows)
            printf("  recommended: %s, %.0f tokens/s\n", p->rows[0].label, p->rows[0].tokens_per_s);
    }
    int rc = 0;
    if (exhaustive) {
        gboolean same = runs[0]->n_rows == MIN(runs[1]->n_rows, (guint)o.top);
        for (guint i = 0; same && i < runs[0]->n_rows; i++)
            same = strcmp(runs[0]->rows[i].label, runs[1]->rows[i].label) == 0 &&
                   runs[0]->rows[i].batch == runs[1]->rows[i].batch &&
                   runs[0]->rows[i].checkpointing == runs[1]->rows[i].checkpointing &&
                   runs[0]->rows[i].peak == runs[1]->rows[i].peak;
        printf("speed-up from pruning and bisection: %.1f× wall, %.1f× traces; same top rows: "
               "%s\n",
               wall[1] / wall[0], (double)runs[1]->n_generated / runs[0]->n_generated,
               same ? "yes" : "NO");
        rc = same ? 0 : 1;
    }
    memsim_plan_free(runs[0]);
    memsim_plan_free(runs[1]);
    memsim_run_clear(&run);
    memsim_model_free(m);
    g_free(model);
    g_free(gpu);
    return rc;
}

/* ---- the steady state ---- */

typedef struct {
    const char *name;
    const char *model;
    const char *settings[16]; /* key, value, ..., NULL */
    gboolean plan;
    int gpus;                 /* plan */
    int64_t global_batch;     /* plan */
    double max_s, max_mib;    /* bounds (0: none) */
} SteadyCase;

/* The machine the figures are from (they vary by machine): the CPU's model and how many
 * processors this process may use. */
static void print_machine(void)
{
    g_autofree char *info = NULL;
    const char *model = "unknown CPU";
    g_autofree char *name = NULL;
    if (g_file_get_contents("/proc/cpuinfo", &info, NULL, NULL)) {
        char *m = strstr(info, "model name");
        char *colon = m ? strchr(m, ':') : NULL;
        if (colon) {
            name = g_strstrip(g_strndup(colon + 1, strcspn(colon + 1, "\n")));
            if (*name)
                model = name;
        }
    }
    printf("machine: %s, %u processor(s)\n", model, g_get_num_processors());
}

/* One measurement in a child process: its wall and CPU seconds and peak resident MiB; FALSE
 * when it failed. */
static gboolean steady_once(const SteadyCase *c, gboolean full, double *wall, double *cpu,
                            double *mib)
{
    double w0 = wall_seconds();
    pid_t pid = fork();
    if (pid < 0)
        return FALSE;
    if (pid == 0) {
        if (full)
            g_setenv("MEMSIM_NO_SKIP", "1", TRUE);
        else
            g_unsetenv("MEMSIM_NO_SKIP");
        GError *error = NULL;
        MemsimModel *m = memsim_model_load(c->model, &error);
        if (!m)
            _exit(3);
        MemsimRun run = memsim_run_defaults();
        for (int i = 0; c->settings[i]; i += 2)
            if (!memsim_run_set(&run, c->settings[i], c->settings[i + 1], &error)) {
                fprintf(stderr, "memsim-bench: %s\n", error->message);
                _exit(3);
            }
        if (c->plan) {
            MemsimPlanOptions o = memsim_plan_options_defaults();
            o.run = &run;
            o.gpus = c->gpus;
            o.gpu = "h100-80gb";
            o.global_batch = c->global_batch;
            MemsimPlan *p = memsim_plan(m, &o, &error);
            if (!p) {
                fprintf(stderr, "memsim-bench: %s\n", error->message);
                _exit(3);
            }
            memsim_plan_free(p);
        } else {
            memsim_run_adapt(&run, m);
            MemsimEstimateOptions o = MEMSIM_ESTIMATE_OPTIONS_INIT;
            MemsimReport *rep = memsim_estimate(m, &run, &o, &error);
            if (!rep) {
                fprintf(stderr, "memsim-bench: %s\n", error->message);
                _exit(3);
            }
            /* a replay stops where a rank runs out of memory: such a run is not timed whole */
            for (guint k = 0; k < rep->n_ranks; k++)
                if (rep->ranks[k].oom.happened) {
                    fprintf(stderr, "memsim-bench: %s: rank %u runs out of memory in step %u: "
                            "the run is not simulated whole\n", c->name, k,
                            rep->ranks[k].oom.step);
                    _exit(3);
                }
            memsim_report_free(rep);
        }
        _exit(0);
    }
    int status = 0;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return FALSE;
    *wall = wall_seconds() - w0;
    *cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
    *mib = (double)ru.ru_maxrss / 1024.0;
    return TRUE;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The medians of `repeat` measurements; FALSE when one failed. */
static gboolean steady_measure(const SteadyCase *c, gboolean full, int repeat, double *wall,
                               double *cpu, double *mib)
{
    double w[64], u[64], r[64];
    if (repeat > 64)
        repeat = 64;
    for (int i = 0; i < repeat; i++)
        if (!steady_once(c, full, &w[i], &u[i], &r[i]))
            return FALSE;
    *wall = median(w, repeat);
    *cpu = median(u, repeat);
    *mib = median(r, repeat);
    return TRUE;
}

static int bench_steady(int argc, char **argv)
{
    gint repeat = 5, plan_repeat = 1;
    gboolean full = FALSE, no_plans = FALSE;
    GOptionEntry entries[] = {
        {"repeat", 0, 0, G_OPTION_ARG_INT, &repeat, "Runs of each estimate (default 5)", "R"},
        {"plan-repeat", 0, 0, G_OPTION_ARG_INT, &plan_repeat, "Runs of each plan (default 1)",
         "P"},
        {"full", 0, 0, G_OPTION_ARG_NONE, &full,
         "Also run each estimate as the full simulation (MEMSIM_NO_SKIP=1)", NULL},
        {"no-plans", 0, 0, G_OPTION_ARG_NONE, &no_plans, "Leave the plans out", NULL},
        {NULL}};
    GOptionContext *ctx = g_option_context_new("steady");
    g_option_context_add_main_entries(ctx, entries, NULL);
    GError *error = NULL;
    gboolean ok = g_option_context_parse(ctx, &argc, &argv, &error);
    g_option_context_free(ctx);
    if (!ok || repeat < 1 || plan_repeat < 1) {
        fprintf(stderr, "memsim-bench: %s\n", error ? error->message : "--repeat must be ≥ 1");
        return 2;
    }
/* LoRA: the run fits an 80 GB GPU and so simulates both steps whole (a full fine-tuning of
 * the 7B model runs out of memory at its first optimizer step, where a replay stops) */
#define SEVEN "seq", "1024", "finetune", "lora"
#define SEVENTY "seq", "4096", "gpu", "h100-80gb", "gpus", "64", "tp", "8", "pp", "4"
    static const SteadyCase cases[] = {
        {"estimate llama-2-7b seq 1024 LoRA, grad-accum 1", "llama-2-7b", {SEVEN, NULL}, FALSE, 0,
         0, 0, 0},
        {"estimate llama-2-7b seq 1024 LoRA, grad-accum 256", "llama-2-7b",
         {SEVEN, "grad-accum", "256", NULL}, FALSE, 0, 0, 0, 0},
        {"estimate llama-2-7b seq 1024 LoRA, 50 steps", "llama-2-7b", {SEVEN, "steps", "50", NULL},
         FALSE, 0, 0, 0, 0},
        {"estimate llama-2-70b tp 8 pp 4 dp 2, 256 micro-batches", "llama-2-70b",
         {SEVENTY, "microbatches", "256", NULL}, FALSE, 0, 0, 0.5, 100},
        {"plan llama-2-70b, 64 × h100-80gb, global batch 512", "llama-2-70b",
         {"seq", "4096", NULL}, TRUE, 64, 512, 5, 0},
        {"plan llama-2-70b, 64 × h100-80gb, global batch 2048", "llama-2-70b",
         {"seq", "4096", NULL}, TRUE, 64, 2048, 5, 0},
        {"plan llama-3.1-405b, 1024 × h100-80gb, global batch 4096", "llama-3.1-405b",
         {"seq", "4096", NULL}, TRUE, 1024, 4096, 30, 0},
    };
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line as it is measured: the plans take long */
    print_machine();
    int rc = 0;
    /* The two grad-accum cases run in alternation, a pair at a time: a run takes milliseconds,
     * and this machine's speed drifts from one second to the next (the medians of two blocks
     * of runs measured apart gave ratios from 1.9× to 3.7×); the bound is judged on the median
     * of the pairs' ratios, which that drift leaves alone. Their lines show the medians of
     * the same runs. */
    double pw[2][64], pu[2][64], pr[2][64], pair_wall[64], pair_cpu[64];
    const int n_pairs = repeat > 64 ? 64 : repeat;
    gboolean paired = TRUE;
    for (int k = 0; k < n_pairs && paired; k++) {
        paired = steady_once(&cases[0], FALSE, &pw[0][k], &pu[0][k], &pr[0][k]) &&
                 steady_once(&cases[1], FALSE, &pw[1][k], &pu[1][k], &pr[1][k]);
        /* (a CPU time of 0, too short for the kernel's accounting, fails the bound) */
        pair_wall[k] = pw[0][k] > 0 ? pw[1][k] / pw[0][k] : INFINITY;
        pair_cpu[k] = pu[0][k] > 0 ? pu[1][k] / pu[0][k] : INFINITY;
    }
    printf("%-58s %9s %9s %9s %s\n", "", "wall s", "CPU s", "MiB", "");
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        const SteadyCase *c = &cases[i];
        if (c->plan && no_plans)
            continue;
        int n = c->plan ? plan_repeat : repeat;
        double w, u, r;
        gboolean measured;
        if (i < 2) {
            measured = paired;
            if (measured) {
                w = median(pw[i], n_pairs);
                u = median(pu[i], n_pairs);
                r = median(pr[i], n_pairs);
            }
        } else {
            measured = steady_measure(c, FALSE, n, &w, &u, &r);
        }
        if (!measured) {
            printf("%-58s failed\n", c->name);
            rc = 1;
            continue;
        }
        GString *verdict = g_string_new("");
        if (i == 1) {
            const double rw = median(pair_wall, n_pairs), ru = median(pair_cpu, n_pairs);
            gboolean good = rw <= 2 && ru <= 2;
            g_string_append_printf(verdict,
                                   "%.2f× wall, %.2f× CPU of grad-accum 1, median of %d "
                                   "alternating pairs (bound 2×): %s",
                                   rw, ru, n_pairs, good ? "ok" : "OVER");
            rc |= !good;
        }
        if (c->max_s > 0) {
            gboolean good = w <= c->max_s && (c->max_mib <= 0 || r <= c->max_mib);
            g_string_append_printf(verdict, "bound %.1f s", c->max_s);
            if (c->max_mib > 0)
                g_string_append_printf(verdict, ", %.0f MB", c->max_mib);
            g_string_append_printf(verdict, ": %s", good ? "ok" : "OVER");
            rc |= !good;
        }
        printf("%-58s %9.3f %9.3f %9.1f %s\n", c->name, w, u, r, verdict->str);
        g_string_free(verdict, TRUE);
        if (full && !c->plan) {
            double fw, fu, fr;
            if (steady_measure(c, TRUE, 1, &fw, &fu, &fr))
                printf("%-58s %9.3f %9.3f %9.1f speed-up %.1f× wall, %.1f× CPU, %.1f× memory\n",
                       "  the same, full simulation (MEMSIM_NO_SKIP=1, one run)", fw, fu, fr,
                       fw / w, fu / u, fr / r);
        }
    }
    printf("(median of %d runs of each estimate, %d of each plan; wall, CPU of the child "
           "process, its peak resident memory)\n",
           repeat, plan_repeat);
    return rc;
}

/* ---- the Megatron-LM development set ---- */

/* A case's launch as a command line: its environment, then pretrain_gpt.py and its flags. */
static char *case_command_line(JsonObject *c)
{
    GString *s = g_string_new(NULL);
    JsonObject *env = json_object_get_object_member(c, "env");
    GList *keys = json_object_get_members(env);
    for (GList *k = keys; k; k = k->next) {
        g_autofree char *v = g_shell_quote(json_object_get_string_member(env, k->data));
        g_string_append_printf(s, "%s=%s ", (char *)k->data, v);
    }
    g_list_free(keys);
    g_string_append_printf(s, "torchrun --nproc-per-node %" G_GINT64_FORMAT " pretrain_gpt.py",
                           json_object_get_int_member(c, "gpus"));
    JsonObject *args = json_object_get_object_member(c, "model_args");
    keys = json_object_get_members(args);
    for (GList *k = keys; k; k = k->next) {
        JsonNode *n = json_object_get_member(args, k->data);
        g_string_append_printf(s, " %s", (char *)k->data);
        if (json_node_get_value_type(n) == G_TYPE_STRING) {
            g_autofree char *v = g_shell_quote(json_node_get_string(n));
            g_string_append_printf(s, " %s", v);
        }
    }
    g_list_free(keys);
    return g_string_free(s, FALSE);
}

/* mem_max_allocated_bytes at the first and at the last step measured. */
static void case_measured(JsonObject *c, double *first, double *last, int *n_steps)
{
    JsonObject *m = json_object_get_object_member(c, "mem_max_allocated_bytes");
    GList *keys = json_object_get_members(m);
    gint64 lo = G_MAXINT64, hi = -1;
    *n_steps = 0;
    for (GList *k = keys; k; k = k->next) {
        gint64 st = g_ascii_strtoll(k->data, NULL, 10);
        double v = json_node_get_double(json_object_get_member(m, k->data));
        if (st < lo) {
            lo = st;
            *first = v;
        }
        if (st > hi) {
            hi = st;
            *last = v;
        }
        (*n_steps)++;
    }
    g_list_free(keys);
}

static int bench_megatron(int argc, char **argv)
{
    gboolean json = FALSE, time_table = FALSE;
    GOptionEntry entries[] = {
        {"json", 0, 0, G_OPTION_ARG_NONE, &json, "One JSON object", NULL},
        {"time", 0, 0, G_OPTION_ARG_NONE, &time_table,
         "The iteration times: measured median, estimated, and the estimate's parts", NULL},
        {NULL}};
    GOptionContext *ctx = g_option_context_new("megatron [CASES.jsonl]");
    g_option_context_add_main_entries(ctx, entries, NULL);
    GError *error = NULL;
    gboolean ok = g_option_context_parse(ctx, &argc, &argv, &error);
    g_option_context_free(ctx);
    if (!ok || argc > 2) {
        fprintf(stderr, "usage: memsim-bench megatron [CASES.jsonl] [--json] [--time]\n%s\n",
                error ? error->message : "");
        return 2;
    }
    g_autofree char *path = argc == 2 ? g_strdup(argv[1])
                                      : g_build_filename(MEMSIM_SOURCE_ROOT, "..", "shared", "data",
                                                         "megatron-golden", "cases.jsonl", NULL);
    g_autofree char *text = NULL;
    if (!g_file_get_contents(path, &text, NULL, &error)) {
        fprintf(stderr, "memsim-bench: %s\n", error->message);
        return 2;
    }
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    JsonBuilder *b = json_builder_new();
    json_builder_begin_object(b);
    json_builder_set_member_name(b, "cases");
    json_builder_begin_array(b);
    double sum_abs = 0, worst = 0, sum_abs1 = 0, t_sum = 0;
    int t_n = 0, t_within = 0;
    int n = 0, n_refused = 0, n_cases = 0;
    if (!json && time_table)
        printf("%-60s %8s %8s %8s %8s %8s %8s %8s %8s\n", "case (slowest rank; ms per iteration)",
               "measured", "estimate", "error", "compute", "memory", "host", "waiting",
               "host all");
    if (!json && !time_table)
        printf("%-74s %5s %9s %9s %7s %9s %9s %7s %7s\n", "case (logged rank)", "logs",
               "meas s1", "est s1", "err", "meas", "est", "err", "ms");
    for (char **l = lines; *l; l++) {
        if (!**l)
            continue;
        JsonParser *p = json_parser_new();
        if (!json_parser_load_from_data(p, *l, -1, &error)) {
            fprintf(stderr, "memsim-bench: %s: %s\n", path, error->message);
            return 2;
        }
        JsonObject *c = json_node_get_object(json_parser_get_root(p));
        const char *name = json_object_get_string_member(c, "name");
        n_cases++;
        g_autofree char *cmd = case_command_line(c);
        double m1 = 0, mlast = 0;
        int n_steps = 0;
        case_measured(c, &m1, &mlast, &n_steps);
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "name");
        json_builder_add_string_value(b, name);
        json_builder_set_member_name(b, "measured_step1");
        json_builder_add_double_value(b, m1);
        json_builder_set_member_name(b, "measured_last");
        json_builder_add_double_value(b, mlast);
        double t0 = wall_seconds();
        MemsimMegatron *mg = memsim_megatron_parse(cmd, name, &error);
        MemsimReport *rep = NULL;
        if (mg) {
            MemsimRun run = memsim_run_defaults();
            memsim_megatron_apply(mg, &run);
            /* the steps Megatron measured: one, or the first and a steady one */
            memsim_run_set(&run, "steps", n_steps > 1 ? "2" : "1", NULL);
            memsim_run_set(&run, "gpu", "h100-80gb", NULL);
            MemsimEstimateOptions eo = MEMSIM_ESTIMATE_OPTIONS_INIT;
            eo.alloc_conf = memsim_megatron_alloc_conf(mg);
            rep = memsim_estimate(memsim_megatron_model(mg), &run, &eo, &error);
            memsim_run_clear(&run);
        }
        double ms = (wall_seconds() - t0) * 1e3;
        json_builder_set_member_name(b, "supported");
        json_builder_add_boolean_value(b, rep != NULL);
        if (!rep) {
            n_refused++;
            json_builder_set_member_name(b, "reason");
            json_builder_add_string_value(b, error->message);
            if (!json)
                printf("%-74.74s refused: %s\n", name, error->message);
            g_clear_error(&error);
        } else {
            const MemsimRankReport *rr = &rep->ranks[rep->n_ranks - 1];
            double e1 = rr->n_steps ? (double)rr->steps[0].peak_allocated : 0;
            double elast = (double)rr->stats.allocated.peak;
            double err1 = 100.0 * (e1 - m1) / m1, err = 100.0 * (elast - mlast) / mlast;
            sum_abs += fabs(err);
            sum_abs1 += fabs(err1);
            if (fabs(err) > worst)
                worst = fabs(err);
            if (fabs(err1) > worst)
                worst = fabs(err1);
            n++;
            json_builder_set_member_name(b, "estimated_step1");
            json_builder_add_double_value(b, e1);
            json_builder_set_member_name(b, "estimated_last");
            json_builder_add_double_value(b, elast);
            json_builder_set_member_name(b, "error_step1_pct");
            json_builder_add_double_value(b, err1);
            json_builder_set_member_name(b, "error_last_pct");
            json_builder_add_double_value(b, err);
            json_builder_set_member_name(b, "ms");
            json_builder_add_double_value(b, ms);
            double tmed = json_object_has_member(c, "iteration_time_median_s") &&
                                  !JSON_NODE_HOLDS_NULL(json_object_get_member(c, "iteration_time_median_s"))
                              ? json_object_get_double_member(c, "iteration_time_median_s")
                              : 0;
            /* Megatron's iteration time is the interval timer's, stopped and restarted with a
             * barrier (training.py training_log: timers('interval-time').elapsed(barrier=True)):
             * the slowest rank's step. Its parts are that rank's. */
            MemsimStepTime stt;
            memsim_step_time(rr, rr->n_steps ? rr->n_steps - 1 : 0, &stt);
            double host_us = rr->n_steps ? rr->steps[rr->n_steps - 1].host_us : 0;
            for (guint q = 0; q < rep->n_ranks; q++) {
                const MemsimRankReport *rq = &rep->ranks[q];
                MemsimStepTime sq;
                memsim_step_time(rq, rq->n_steps ? rq->n_steps - 1 : 0, &sq);
                if (sq.step_us > stt.step_us) {
                    stt = sq;
                    host_us = rq->steps[rq->n_steps - 1].host_us;
                }
            }
            if (time_table) {
                double test = stt.step_us / 1e6;
                double terr = tmed > 0 ? 100.0 * (test - tmed) / tmed : 0;
                if (tmed > 0) {
                    t_n++;
                    t_sum += fabs(terr);
                    if (fabs(terr) <= 25.0)
                        t_within++;
                }
                if (!json) {
                    if (tmed > 0)
                        printf("%-60.60s %8.1f %8.1f %+7.1f%%", name, tmed * 1e3, test * 1e3, terr);
                    else
                        printf("%-60.60s %8s %8.1f %8s", name, "-", test * 1e3, "");
                    printf(" %8.1f %8.1f %8.1f %8.1f %8.1f\n", stt.compute_us / 1e3,
                           stt.memory_us / 1e3, stt.overhead_us / 1e3, stt.waiting_us / 1e3,
                           host_us / 1e3);
                }
            }
            json_builder_set_member_name(b, "iteration_time_median_s");
            json_builder_add_double_value(b, tmed);
            json_builder_set_member_name(b, "estimated_iteration_s");
            json_builder_add_double_value(b, stt.step_us / 1e6);
            json_builder_set_member_name(b, "estimated_parts_s");
            json_builder_begin_object(b);
            json_builder_set_member_name(b, "compute");
            json_builder_add_double_value(b, stt.compute_us / 1e6);
            json_builder_set_member_name(b, "memory_bound");
            json_builder_add_double_value(b, stt.memory_us / 1e6);
            json_builder_set_member_name(b, "host_overhead");
            json_builder_add_double_value(b, stt.overhead_us / 1e6);
            json_builder_set_member_name(b, "exposed_comm_and_bubble");
            json_builder_add_double_value(b, stt.waiting_us / 1e6);
            json_builder_set_member_name(b, "host_total");
            json_builder_add_double_value(b, host_us / 1e6);
            json_builder_end_object(b);
            if (!json && !time_table)
                printf("%-74.74s %5d %8.3fG %8.3fG %+6.2f%% %8.3fG %8.3fG %+6.2f%% %7.1f\n", name,
                       n_steps, m1 / 1073741824.0, e1 / 1073741824.0, err1,
                       mlast / 1073741824.0, elast / 1073741824.0, err, ms);
            memsim_report_free(rep);
        }
        json_builder_end_object(b);
        memsim_megatron_free(mg);
        g_object_unref(p);
    }
    json_builder_end_array(b);
    json_builder_set_member_name(b, "mean_abs_error_last_pct");
    json_builder_add_double_value(b, n ? sum_abs / n : 0);
    json_builder_set_member_name(b, "mean_abs_error_step1_pct");
    json_builder_add_double_value(b, n ? sum_abs1 / n : 0);
    json_builder_set_member_name(b, "worst_abs_error_pct");
    json_builder_add_double_value(b, worst);
    json_builder_set_member_name(b, "time_mean_abs_error_pct");
    json_builder_add_double_value(b, t_n ? t_sum / t_n : 0);
    json_builder_set_member_name(b, "time_within_25pct");
    json_builder_add_int_value(b, t_within);
    json_builder_set_member_name(b, "time_cases");
    json_builder_add_int_value(b, t_n);
    json_builder_set_member_name(b, "refused");
    json_builder_add_int_value(b, n_refused);
    json_builder_set_member_name(b, "n_cases");
    json_builder_add_int_value(b, n_cases);
    json_builder_end_object(b);
    if (json) {
        JsonGenerator *gen = json_generator_new();
        JsonNode *root = json_builder_get_root(b);
        json_generator_set_root(gen, root);
        json_generator_set_pretty(gen, TRUE);
        g_autofree char *out = json_generator_to_data(gen, NULL);
        printf("%s\n", out);
        json_node_unref(root);
        g_object_unref(gen);
    } else if (time_table) {
        printf("%d cases: %d estimated, %d refused; iteration time (an estimate) within 25%% of "
               "the median in %d of %d, mean |error| %.1f%%\n",
               n_cases, n, n_refused, t_within, t_n, t_n ? t_sum / t_n : 0);
    } else {
        printf("%d cases: %d estimated, %d refused; mean |error| %.2f%% at the last step, "
               "%.2f%% at step 1; worst %.2f%%\n",
               n_cases, n, n_refused, n ? sum_abs / n : 0, n ? sum_abs1 / n : 0, worst);
    }
    g_object_unref(b);
    return 0;
}

/* ---- snapshot ---- */

typedef struct {
    double wall, cpu; /* seconds */
    long rss_kib;     /* peak resident set of the child */
    char *out;        /* its stdout */
} Child;

/* Runs argv with stdout captured and stderr passed through; the child's own wall, CPU time
 * and peak RSS (wait4). FALSE when it cannot start or exits with a status. */
static gboolean run_child(char **argv, Child *c)
{
    memset(c, 0, sizeof *c);
    int fds[2];
    if (pipe(fds) != 0)
        return FALSE;
    gint64 t0 = g_get_monotonic_time();
    pid_t pid = fork();
    if (pid < 0)
        return FALSE;
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    GString *out = g_string_new(NULL);
    char buf[65536];
    ssize_t got;
    while ((got = read(fds[0], buf, sizeof buf)) > 0)
        g_string_append_len(out, buf, got);
    close(fds[0]);
    int status = 0;
    struct rusage ru;
    wait4(pid, &status, 0, &ru);
    c->wall = (double)(g_get_monotonic_time() - t0) / 1e6;
    c->cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
             (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
    c->rss_kib = ru.ru_maxrss;
    c->out = g_string_free(out, FALSE);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "memsim-bench: %s exited with status %d\n", argv[0],
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return FALSE;
    }
    return TRUE;
}


/* A number after `key` in a line of text ("key 123"), or -1. */
static double number_after(const char *text, const char *key)
{
    const char *k = text ? strstr(text, key) : NULL;
    return k ? g_ascii_strtod(k + strlen(key), NULL) : -1;
}

typedef struct {
    double wall, cpu, rss_mib; /* medians */
    double read_wall, read_cpu; /* medians of reading alone (snapshot-read) */
    double py_model, py_load;  /* medians of CPU seconds, -1 when not run */
    double py_model_wall;      /* median of the Python model's wall seconds */
    double py_load_wall;       /* median of pickle.load's wall seconds (in the interpreter) */
    double peak_reserved, peak_allocated, py_reserved, py_allocated;
    double mib;
} SnapFigures;

/* Runs argv `repeat` times (each run's line printed after `label`): the medians of its wall
 * and CPU seconds and peak RSS (MiB), and the last run's stdout in *out (NULL: dropped).
 * FALSE when a run fails. */
static gboolean time_runs(char **argv, int repeat, const char *label, double *wall, double *cpu,
                          double *rss_mib, char **out)
{
    double *w = g_new(double, (gsize)repeat), *u = g_new(double, (gsize)repeat),
           *r = g_new(double, (gsize)repeat);
    gboolean ok = TRUE;
    for (int k = 0; k < repeat; k++) {
        Child c;
        ok = run_child(argv, &c);
        if (!ok) {
            g_free(c.out);
            break;
        }
        w[k] = c.wall;
        u[k] = c.cpu;
        r[k] = (double)c.rss_kib / 1024.0;
        printf("  %s: %.3f s wall, %.3f s CPU, peak RSS %.1f MiB\n", label, c.wall, c.cpu, r[k]);
        if (out && k == repeat - 1)
            *out = c.out;
        else
            g_free(c.out);
    }
    if (ok) {
        *wall = median(w, repeat);
        *cpu = median(u, repeat);
        *rss_mib = median(r, repeat);
    }
    g_free(w);
    g_free(u);
    g_free(r);
    return ok;
}

static gboolean bench_snapshot_file(const char *memsim, const char *self, const char *file,
                                    int repeat, gboolean python, SnapFigures *f)
{
    memset(f, 0, sizeof *f);
    f->py_model = f->py_load = -1;
    GStatBuf st;
    if (g_stat(file, &st) != 0) {
        fprintf(stderr, "memsim-bench: %s: cannot read\n", file);
        return FALSE;
    }
    f->mib = (double)st.st_size / 1048576.0;
    printf("%s: %.1f MiB\n", file, f->mib);
    repeat = MAX(repeat, 1);
    char *replay[] = {(char *)memsim, "replay", "--json", (char *)file, NULL};
    char *out = NULL;
    if (!time_runs(replay, repeat, "memsim replay", &f->wall, &f->cpu, &f->rss_mib, &out))
        return FALSE;
    f->peak_reserved = number_after(out, "\"peak_reserved\" : ");
    f->peak_allocated = number_after(out, "\"peak_allocated\" : ");
    g_free(out);
    char *read_alone[] = {(char *)self, "snapshot-read", (char *)file, NULL};
    double read_rss;
    if (!time_runs(read_alone, repeat, "reading alone (no replay)", &f->read_wall, &f->read_cpu,
                   &read_rss, NULL))
        return FALSE;
    if (python) {
        int pr = MIN(repeat, 3);
        double *model = g_new(double, (gsize)pr), *load = g_new(double, (gsize)pr),
               *model_wall = g_new(double, (gsize)pr), *load_wall = g_new(double, (gsize)pr);
        g_autofree char *script = g_build_filename(MEMSIM_SOURCE_ROOT, "tools",
                                                   "torch_alloc_model.py", NULL);
        for (int k = 0; k < pr; k++) {
            char *argv[] = {"/usr/bin/python3", script, (char *)file, NULL};
            Child c;
            if (!run_child(argv, &c))
                return FALSE;
            model[k] = c.cpu;
            model_wall[k] = c.wall;
            f->py_reserved = number_after(c.out, "peak_reserved ");
            f->py_allocated = number_after(c.out, "peak_allocated ");
            printf("  Python model (pickle.load + its replay): %.3f s wall, %.3f s CPU, peak RSS "
                   "%.1f MiB\n", c.wall, c.cpu, (double)c.rss_kib / 1024.0);
            g_free(c.out);
            char *argv2[] = {"/usr/bin/python3", "-c",
                             "import pickle, sys, time\n"
                             "w = time.perf_counter()\n"
                             "t = time.process_time()\n"
                             "with open(sys.argv[1], 'rb') as f:\n"
                             "    pickle.load(f)\n"
                             "print('load_cpu', time.process_time() - t)\n"
                             "print('load_wall', time.perf_counter() - w)\n",
                             (char *)file, NULL};
            if (!run_child(argv2, &c))
                return FALSE;
            load[k] = number_after(c.out, "load_cpu ");
            load_wall[k] = number_after(c.out, "load_wall ");
            printf("  pickle.load alone: %.3f s wall, %.3f s CPU (in the interpreter; %.3f s "
                   "wall for the process), peak RSS %.1f MiB\n", load_wall[k], load[k], c.wall,
                   (double)c.rss_kib / 1024.0);
            g_free(c.out);
        }
        f->py_model = median(model, pr);
        f->py_model_wall = median(model_wall, pr);
        f->py_load = median(load, pr);
        f->py_load_wall = median(load_wall, pr);
        g_free(load_wall);
        g_free(model_wall);
        g_free(model);
        g_free(load);
    }
    return TRUE;
}

static int bench_snapshot(int argc, char **argv)
{
    gint64 n_events = 895000;
    double big_mb = 350;
    char *file = NULL, *big_file = NULL, *keep = NULL, *schema = NULL;
    gint repeat = 5;
    gboolean python_big = FALSE;
    GOptionEntry entries[] = {
        {"events", 0, 0, G_OPTION_ARG_INT64, &n_events, "Entries of the synthetic snapshot", "N"},
        {"big-mb", 0, 0, G_OPTION_ARG_DOUBLE, &big_mb, "Size of the big one (0: none)", "M"},
        {"file", 0, 0, G_OPTION_ARG_FILENAME, &file, "Take this snapshot instead", "F"},
        {"big-file", 0, 0, G_OPTION_ARG_FILENAME, &big_file, "Take this big one instead", "F"},
        {"keep", 0, 0, G_OPTION_ARG_FILENAME, &keep, "Keep (and reuse) the files here", "DIR"},
        {"schema", 0, 0, G_OPTION_ARG_STRING, &schema,
         "The generator's schema: 2.0 (default; 895,000 entries make 33 MB) or 2.1 (time_us "
         "and frames; 53 MB)", "S"},
        {"repeat", 0, 0, G_OPTION_ARG_INT, &repeat, "Runs of memsim (default 5)", "R"},
        {"python-big", 0, 0, G_OPTION_ARG_NONE, &python_big,
         "Also run Python on the big file (minutes, GBs)", NULL},
        {NULL}};
    GOptionContext *ctx = g_option_context_new("- PyTorch snapshot speed (issue 17)");
    g_option_context_add_main_entries(ctx, entries, NULL);
    GError *error = NULL;
    if (!g_option_context_parse(ctx, &argc, &argv, &error)) {
        fprintf(stderr, "memsim-bench snapshot: %s\n", error->message);
        return 2;
    }
    g_option_context_free(ctx);
    if (repeat < 1)
        repeat = 1;
    if (!schema)
        schema = g_strdup("2.0");
    if (strcmp(schema, "2.0") != 0 && strcmp(schema, "2.1") != 0) {
        fprintf(stderr, "memsim-bench snapshot: --schema %s: 2.0 or 2.1\n", schema);
        return 2;
    }
    g_autofree char *self = g_file_read_link("/proc/self/exe", NULL);
    g_autofree char *bindir = self ? g_path_get_dirname(self) : g_strdup(".");
    g_autofree char *memsim = g_build_filename(bindir, "memsim", NULL);
    g_autofree char *gen = g_build_filename(MEMSIM_SOURCE_ROOT, "tools", "snapshot-gen.py", NULL);
    g_autofree char *dir = keep ? g_strdup(keep) : g_dir_make_tmp("memsim-bench-XXXXXX", &error);
    if (!dir || g_mkdir_with_parents(dir, 0755) != 0) {
        fprintf(stderr, "memsim-bench snapshot: no directory for the files\n");
        return 2;
    }
    g_autofree char *small = file ? g_strdup(file)
                                  : g_strdup_printf("%s/snapshot-%" G_GINT64_FORMAT "-%s.pickle",
                                                    dir, n_events, schema);
    g_autofree char *big = big_file ? g_strdup(big_file)
                         : big_mb > 0 ? g_strdup_printf("%s/snapshot-%.0fMB-%s.pickle", dir, big_mb,
                                                        schema)
                                      : NULL;
    for (int i = 0; i < 2; i++) {
        const char *path = i ? big : small;
        if (!path || g_file_test(path, G_FILE_TEST_EXISTS))
            continue;
        char arg[64];
        if (i)
            g_snprintf(arg, sizeof arg, "--mb=%.0f", big_mb);
        else
            g_snprintf(arg, sizeof arg, "--events=%" G_GINT64_FORMAT, n_events);
        g_autofree char *sarg = g_strdup_printf("--schema=%s", schema);
        char *gv[] = {"/usr/bin/python3", gen, (char *)path, arg, sarg, NULL};
        Child c;
        printf("generating %s ...\n", path);
        fflush(stdout);
        if (!run_child(gv, &c))
            return 2;
        printf("  %s  (%.1f s)\n", g_strstrip(c.out), c.wall);
        g_free(c.out);
    }

    SnapFigures s, b;
    print_machine();
    if (!bench_snapshot_file(memsim, self, small, repeat, TRUE, &s))
        return 2;
    /* Faster is in wall time (memsim reads, parses and replays on up to four threads; the
     * Python ones run on one); the CPU ratios, all of memsim's threads counted, are shown
     * beside it. */
    double vs_model = s.py_model_wall / s.wall, vs_model_cpu = s.py_model / s.cpu,
           vs_load = s.py_load_wall / s.wall, vs_load_cpu = s.py_load / s.cpu;
    printf("\n%s (medians):\n"
           "  memsim replay end to end: %.3f s wall, %.3f s CPU, peak RSS %.1f MiB\n"
           "    of which reading alone:  %.3f s wall, %.3f s CPU (the 25x line leaves %.3f s "
           "for the whole)\n"
           "  Python model:             %.3f s wall, %.3f s CPU -> memsim %.1fx faster (wall), "
           "%.1fx (CPU)\n"
           "  pickle.load alone:        %.3f s wall, %.3f s CPU -> memsim %.1fx faster (wall), "
           "%.1fx (CPU)\n"
           "  peaks: memsim reserved %.0f allocated %.0f; Python model reserved %.0f allocated "
           "%.0f (%s)\n",
           small, s.wall, s.cpu, s.rss_mib, s.read_wall, s.read_cpu, s.py_model_wall / 25,
           s.py_model_wall, s.py_model, vs_model, vs_model_cpu,
           s.py_load_wall, s.py_load, vs_load, vs_load_cpu, s.peak_reserved, s.peak_allocated,
           s.py_reserved, s.py_allocated,
           s.peak_reserved == s.py_reserved && s.peak_allocated == s.py_allocated ? "the same"
                                                                                   : "DIFFERENT");
    gboolean ok = vs_model >= 25 && vs_load >= 5 && s.rss_mib < 100;
    printf("  acceptance: >= 25x the Python model end to end: %s; >= 5x pickle.load: %s; peak "
           "RSS < 100 MB: %s\n",
           vs_model >= 25 ? "yes" : "NO", vs_load >= 5 ? "yes" : "NO",
           s.rss_mib < 100 ? "yes" : "NO");
    if (big) {
        if (!bench_snapshot_file(memsim, self, big, MIN(repeat, 3), python_big, &b))
            return 2;
        printf("\n%s (medians): memsim replay %.3f s wall, %.3f s CPU, peak RSS %.1f MiB "
               "(reading alone %.3f s wall)", big, b.wall, b.cpu, b.rss_mib, b.read_wall);
        if (b.py_model > 0)
            printf("; Python model %.3f s CPU (%.1fx), pickle.load %.3f s CPU (%.1fx)",
                   b.py_model, b.py_model / b.cpu, b.py_load, b.py_load / b.cpu);
        printf("\n  acceptance: < 5 s: %s; < 500 MB: %s\n", b.wall < 5 ? "yes" : "NO",
               b.rss_mib < 500 ? "yes" : "NO");
        ok = ok && b.wall < 5 && b.rss_mib < 500;
    }
    if (!keep) { /* the generated files only */
        if (!file)
            g_remove(small);
        if (big && !big_file)
            g_remove(big);
        g_rmdir(dir);
    }
    g_free(file);
    g_free(big_file);
    g_free(keep);
    g_free(schema);
    return ok ? 0 : 1;
}

/* `snapshot-read FILE`: the snapshot opened as `memsim replay` opens it, nothing replayed
 * (the child `snapshot` times). */
static int bench_snapshot_read(const char *path)
{
    GError *error = NULL;
    MemsimTraceReader *r = memsim_trace_reader_open(path, &error);
    if (!r) {
        fprintf(stderr, "memsim-bench snapshot-read: %s\n", error->message);
        g_error_free(error);
        return 2;
    }
    memsim_trace_reader_free(r);
    return 0;
}

int main(int argc, char **argv)
{
    memsim_tools_malloc_tune(); /* as the memsim command runs */
    if (argc == 3 && strcmp(argv[1], "snapshot-read") == 0)
        return bench_snapshot_read(argv[2]);
    if (argc >= 2 && strcmp(argv[1], "megatron") == 0)
        return bench_megatron(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "estimate") == 0)
        return bench_estimate(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "compare") == 0)
        return bench_compare(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "export") == 0)
        return bench_export(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "families") == 0)
        return bench_families(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "plan") == 0)
        return bench_plan(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "steady") == 0)
        return bench_steady(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "snapshot") == 0)
        return bench_snapshot(argc - 1, argv + 1);
    gint64 n_events = 10000000;
    char *allocator = NULL, *keep = NULL;
    gint repeat = 3;
    GOptionEntry entries[] = {
        {"events", 0, 0, G_OPTION_ARG_INT64, &n_events, "Events in the synthetic trace", "N"},
        {"allocator", 0, 0, G_OPTION_ARG_STRING, &allocator, "Policy (default torch)", "SPEC"},
        {"keep", 0, 0, G_OPTION_ARG_FILENAME, &keep, "Write the trace here and keep it", "FILE"},
        {"repeat", 0, 0, G_OPTION_ARG_INT, &repeat, "Runs of each phase (default 3)", "R"},
        {NULL}};
    GOptionContext *ctx = g_option_context_new("replay");
    g_option_context_add_main_entries(ctx, entries, NULL);
    GError *error = NULL;
    if (!g_option_context_parse(ctx, &argc, &argv, &error) || argc != 2 ||
        strcmp(argv[1], "replay") != 0) {
        fprintf(stderr,
                "usage: memsim-bench "
                "replay|estimate|compare|export|plan|megatron|families|steady|snapshot "
                "[OPTIONS] (the file's header says what each measures)\n"
                "       memsim-bench replay [--events N] [--allocator SPEC] [--keep F] "
                "[--repeat R]\n%s\n",
                error ? error->message : "");
        return 2;
    }
    if (repeat < 1)
        repeat = 1;
    g_option_context_free(ctx);

    g_autofree char *dir = NULL;
    g_autofree char *path = NULL;
    if (keep) {
        path = g_strdup(keep);
    } else {
        dir = g_dir_make_tmp("memsim-bench-XXXXXX", &error);
        path = g_build_filename(dir, "synthetic.mst", NULL);
    }
    gint64 t0 = g_get_monotonic_time();
    if (!write_synthetic(path, (uint64_t)n_events, &error)) {
        fprintf(stderr, "memsim-bench: %s\n", error->message);
        return 2;
    }
    gint64 t1 = g_get_monotonic_time();
    GStatBuf sb;
    g_stat(path, &sb);
    printf("trace: %" G_GINT64_FORMAT " events, %.1f MiB on disk (%.2f bytes/event), written in "
           "%.2f s\n",
           n_events, (double)sb.st_size / 1048576.0, (double)sb.st_size / (double)n_events,
           (double)(t1 - t0) / 1e6);

    /* Each phase runs `repeat` times: CPU speed on a shared machine varies from run to run,
     * so each run is printed, then the median and the best. */
    double *read_rate = g_new(double, repeat), *sim_rate = g_new(double, repeat);
    for (int k = 0; k < repeat; k++) {
        /* (1) reading alone */
        reset_peak_rss();
        t0 = g_get_monotonic_time();
        double c0 = cpu_seconds();
        MemsimTraceReader *r = memsim_trace_reader_open(path, &error);
        if (!r) {
            fprintf(stderr, "memsim-bench: %s\n", error->message);
            return 2;
        }
        const MemsimEvent *ev;
        guint32 rank;
        gsize n, total = 0;
        uint64_t sink = 0;
        while ((n = memsim_trace_reader_next(r, &rank, &ev, &error)) > 0) {
            total += n;
            sink += ev[n - 1].size;
        }
        memsim_trace_reader_free(r);
        t1 = g_get_monotonic_time();
        double c1 = cpu_seconds();
        if (error) {
            fprintf(stderr, "memsim-bench: %s\n", error->message);
            return 2;
        }
        double read_s = (double)(t1 - t0) / 1e6, read_cpu = c1 - c0;
        read_rate[k] = (double)total / read_cpu / 1e6;
        printf("read .mst:            %.3f s wall, %.3f s CPU  %6.1f M events/s (CPU)  peak RSS "
               "%ld KiB (checksum %" PRIu64 ")\n",
               read_s, read_cpu, read_rate[k], peak_rss_kib(), sink % 1000);

        /* (2) reading + simulating */
        reset_peak_rss();
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.allocator = allocator;
        t0 = g_get_monotonic_time();
        c0 = cpu_seconds();
        MemsimReport *rep = memsim_replay_path(path, &o, &error);
        t1 = g_get_monotonic_time();
        c1 = cpu_seconds();
        if (!rep) {
            fprintf(stderr, "memsim-bench: %s\n", error->message);
            return 2;
        }
        double sim_s = (double)(t1 - t0) / 1e6, sim_cpu = c1 - c0;
        sim_rate[k] = (double)rep->ranks[0].n_events / sim_cpu / 1e6;
        char a[32], b[32];
        printf("read + simulate (%s): %.3f s wall, %.3f s CPU  %6.1f M events/s (CPU)  peak "
               "RSS %ld KiB  (peak allocated %s, peak reserved %s)\n",
               rep->allocator, sim_s, sim_cpu, sim_rate[k], peak_rss_kib(),
               memsim_format_bytes((memsim_size_t)rep->ranks[0].stats.allocated.peak, a, 32),
               memsim_format_bytes((memsim_size_t)rep->ranks[0].stats.reserved.peak, b, 32));
        memsim_report_free(rep);
    }
    if (repeat > 1) {
        qsort(read_rate, (size_t)repeat, sizeof(double), cmp_double);
        qsort(sim_rate, (size_t)repeat, sizeof(double), cmp_double);
        printf("%d runs, M events/s (CPU), median / best: read .mst %.1f / %.1f; read + "
               "simulate %.1f / %.1f\n",
               repeat, read_rate[repeat / 2], read_rate[repeat - 1], sim_rate[repeat / 2],
               sim_rate[repeat - 1]);
    }
    g_free(read_rate);
    g_free(sim_rate);
    if (!keep) {
        g_remove(path);
        g_rmdir(dir);
    }
    g_free(allocator);
    g_free(keep);
    return 0;
}
