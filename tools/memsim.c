/* memsim — the command. Parses options, calls the library (include/memsim/), prints.
 *
 * Exit status: 0 success; 1 an answer of "does not fit" (a simulated OOM) or, for
 * `replay --verify`, a mismatch; 2 bad input or usage. */
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <memsim/alloc.h>
#include <memsim/export.h>
#include <memsim/formats.h>
#include <memsim/estimate.h>
#include <memsim/gen.h>
#include <memsim/deepspeed.h>
#include <memsim/megatron.h>
#include <memsim/plan.h>
#include <memsim/sim.h>

#include "malloc_tune.h"
#include "progress.h"

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

enum { EXIT_OK = 0, EXIT_NO = 1, EXIT_BAD = 2 };

/* A JSON object text (a report, a plan; freed) with the model added under "model". */
static char *json_with_model(char *text, const MemsimModel *m)
{
    char *out = memsim_json_with_model(text, m);
    g_free(text);
    return out;
}

static int report_error(const char *cmd, GError *error)
{
    fprintf(stderr, "memsim %s: %s\n", cmd, error ? error->message : "failed");
    if (error)
        g_error_free(error);
    return EXIT_BAD;
}

/* Every command's --quiet. */
static gboolean quiet;
static GOptionEntry quiet_entries[] = {
    {"quiet", 'q', 0, G_OPTION_ARG_NONE, &quiet,
     "No progress bar on stderr (shown otherwise when stderr is a terminal and the work takes "
     "over a second)",
     NULL},
    {NULL}};

static GOptionContext *make_context(const char *cmd, const char *params, const char *summary,
                                    const char *description, GOptionEntry *entries)
{
    g_autofree char *ps = g_strdup_printf("%s %s", cmd, params);
    GOptionContext *ctx = g_option_context_new(ps);
    g_option_context_set_summary(ctx, summary);
    if (description)
        g_option_context_set_description(ctx, description);
    g_option_context_add_main_entries(ctx, entries, NULL);
    g_option_context_add_main_entries(ctx, quiet_entries, NULL);
    return ctx;
}

/* Parses; on a usage error prints it and returns FALSE. */
static gboolean parse(GOptionContext *ctx, const char *cmd, int *argc, char ***argv)
{
    GError *error = NULL;
    if (!g_option_context_parse(ctx, argc, argv, &error)) {
        fprintf(stderr, "memsim %s: %s (see memsim %s --help)\n", cmd, error->message, cmd);
        g_error_free(error);
        return FALSE;
    }
    progress_set_quiet(quiet);
    return TRUE;
}

/* A PyTorch snapshot is read whole before anything else happens: over this size, the bar
 * shows the bytes read while it is. */
#define BIG_INPUT ((guint64)50 << 20)

static guint64 file_size(const char *path)
{
    GStatBuf st;
    return g_stat(path, &st) == 0 ? (guint64)st.st_size : 0;
}

/* memsim_replay_path, counting bytes read (a big snapshot) and events for the progress line. */
static MemsimReport *replay_file(const char *path, const MemsimReplayOptions *o, GError **error)
{
    guint64 bytes = 0, size = file_size(path);
    Progress rd_pr;
    progress_start(&rd_pr, "reading", NULL, PROGRESS_BYTES, size > BIG_INPUT ? &bytes : NULL,
                   size > BIG_INPUT ? &size : NULL);
    MemsimTraceReader *rd = memsim_trace_reader_open_counted(path, &bytes, error);
    progress_stop(&rd_pr);
    if (!rd)
        return NULL;
    MemsimReplay *rp = memsim_replay_new(memsim_trace_reader_header(rd), o, error);
    if (!rp) {
        memsim_trace_reader_free(rd);
        return NULL;
    }
    guint64 count = 0;
    Progress pr;
    progress_start(&pr, "replaying", "events", PROGRESS_COUNT, &count, NULL);
    const MemsimEvent *ev;
    guint32 rank;
    gsize n;
    GError *e = NULL;
    while ((n = memsim_trace_reader_next(rd, &rank, &ev, &e)) > 0) {
        if (!memsim_replay_feed(rp, memsim_trace_reader_header(rd), rank, ev, n, &e))
            break;
        __atomic_store_n(&count, count + n, __ATOMIC_RELAXED);
    }
    if (!e) /* ranks parked at a recv run what they hold */
        memsim_replay_drain(rp, memsim_trace_reader_header(rd), &e);
    progress_stop(&pr);
    memsim_trace_reader_free(rd);
    if (e) {
        /* the replay names the trace by its embedded name: the file given comes first */
        if (!g_str_has_prefix(e->message, path))
            g_prefix_error(&e, "%s: ", path);
        g_propagate_error(error, e);
        memsim_replay_abort(rp);
        return NULL;
    }
    return memsim_replay_finish(rp);
}

/* ---- exports: --timeline, --perfetto, --csv, --report ---- */

typedef struct {
    char *timeline, *perfetto, *csv, *report;
} Exports;

/* --deepspeed-config FILE and --deepspeed-set KEY=VALUE (estimate and plan) */
#define DEEPSPEED_ENTRIES(conf, sets)                                                            \
    {"deepspeed-config", 0, 0, G_OPTION_ARG_FILENAME, &(conf),                                   \
     "A DeepSpeed ds_config.json: its ZeRO stage is the method, its batch, precision, "         \
     "optimizer, buckets and offload are the run's",                                             \
     "FILE"},                                                                                    \
        {"deepspeed-set", 0, 0, G_OPTION_ARG_STRING_ARRAY, &(sets),                              \
         "A key of the DeepSpeed config over the file's (repeatable)", "KEY=VALUE"}

#define EXPORT_ENTRIES(x)                                                                        \
    {"timeline", 0, 0, G_OPTION_ARG_FILENAME, &(x).timeline,                                     \
     "Draw the memory over the run to FILE (.svg, .png or .pdf)", "FILE"},                       \
        {"perfetto", 0, 0, G_OPTION_ARG_FILENAME, &(x).perfetto,                                 \
         "Write a Chrome/Perfetto trace (JSON) of the memory and the ops to FILE", "FILE"},      \
        {"csv", 0, 0, G_OPTION_ARG_FILENAME, &(x).csv,                                           \
         "Write the memory timeline as CSV to FILE", "FILE"},                                    \
        {"report", 0, 0, G_OPTION_ARG_FILENAME, &(x).report,                                     \
         "Write a self-contained HTML report (tables and the timeline) to FILE", "FILE"}

/* A timeline when some export needs one (Perfetto gets finer buckets), else NULL. */
static MemsimTimeline *exports_timeline(const Exports *x)
{
    if (!x->timeline && !x->perfetto && !x->csv && !x->report)
        return NULL;
    return memsim_timeline_new(x->perfetto || x->csv ? 16384 : 0);
}

/* Writes what was asked; FALSE (message printed) on the first failure. */
static gboolean exports_write(const char *cmd, const Exports *x, const MemsimReport *rep,
                              const MemsimTimeline *tl, const char *title)
{
    GError *error = NULL;
    Progress pr;
    progress_start(&pr, "writing", NULL, PROGRESS_COUNT, NULL, NULL);
    gboolean ok = (!x->timeline || memsim_export_timeline_plot(tl, title, x->timeline, &error)) &&
                  (!x->perfetto || memsim_export_perfetto(tl, x->perfetto, &error)) &&
                  (!x->csv || memsim_export_timeline_csv(tl, x->csv, &error)) &&
                  (!x->report || memsim_export_html(rep, tl, title, NULL, x->report, &error));
    progress_stop(&pr);
    if (!ok)
        report_error(cmd, error);
    return ok;
}

static void exports_clear(Exports *x)
{
    g_free(x->timeline);
    g_free(x->perfetto);
    g_free(x->csv);
    g_free(x->report);
}

/* ---- replay ---- */

static int cmd_replay(int argc, char **argv)
{
    gboolean verify = FALSE, json = FALSE, check = FALSE;
    char *allocator = NULL, *alloc_conf = NULL, *gpu_mem = NULL, *frames_skip = NULL;
    Exports ex = {0};
    MemsimTimeline *tl = NULL;
    GOptionEntry entries[] = {
        {"verify", 0, 0, G_OPTION_ARG_NONE, &verify,
         "Check the allocator model against every recorded event (exit 1 on a mismatch)", NULL},
        {"alloc-conf", 0, 0, G_OPTION_ARG_STRING, &alloc_conf,
         "Replay under these PYTORCH_CUDA_ALLOC_CONF settings instead of the recorded ones, "
         "side by side with the recorded run",
         "CONF"},
        {"allocator", 0, 0, G_OPTION_ARG_STRING, &allocator,
         "Allocator policy, name[:key=value,...] (default torch; 'help' lists them)", "SPEC"},
        {"gpu-mem", 0, 0, G_OPTION_ARG_STRING, &gpu_mem,
         "Device memory available to the allocator, a size (80GiB) or a GPU name (default: the "
         "trace's recorded capacity, else unlimited)", "SIZE|GPU"},
        {"frames-skip", 0, 0, G_OPTION_ARG_STRING, &frames_skip,
         "Snapshots: who holds the memory is the first frame of each allocation in a file "
         "whose name contains none of these comma-separated texts, nor /torch/, "
         "/site-packages/, /dist-packages/, /lib/python3 or <frozen",
         "TEXT,..."},
        {"json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON instead of a table", NULL},
        EXPORT_ENTRIES(ex),
        {"check", 0, G_OPTION_FLAG_HIDDEN, G_OPTION_ARG_NONE, &check,
         "Check allocator invariants after every event (slow)", NULL},
        {NULL}};
    GOptionContext *ctx = make_context(
        "replay", "TRACE",
        "Replay a trace (.mst, text, or a PyTorch memory snapshot pickle) through an allocator "
        "model and report, per device, peak allocated / reserved / active / requested bytes, "
        "fragmentation at the peak and any out-of-memory point.",
        "Examples:\n"
        "  memsim replay run.pickle\n"
        "  memsim replay run.pickle --verify\n"
        "  memsim replay run.pickle --alloc-conf \"expandable_segments:True\"\n"
        "  memsim replay run.mst --gpu-mem 40GiB --json\n"
        "  memsim replay run.mst --timeline run.svg --perfetto run.json\n",
        entries);
    int rc = EXIT_BAD;
    if (!parse(ctx, "replay", &argc, &argv))
        goto out;
    if (allocator && strcmp(allocator, "help") == 0) {
        for (const MemsimAllocOps *const *p = memsim_alloc_registry(); *p; p++) {
            printf("%-10s %s\n", (*p)->name, (*p)->description);
            if ((*p)->settings_help) {
                g_auto(GStrv) lines = g_strsplit((*p)->settings_help, "\n", -1);
                for (char **l = lines; *l; l++)
                    if (**l)
                        printf("             %s\n", *l);
            }
        }
        rc = EXIT_OK;
        goto out;
    }
    if (argc != 2) {
        fprintf(stderr, "memsim replay: expected one trace file (see memsim replay --help)\n");
        goto out;
    }
    GError *error = NULL;
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.allocator = allocator;
    o.verify = verify;
    o.check_invariants = check;
    o.frames_skip = frames_skip;
    if (gpu_mem && !memsim_parse_gpu_mem("gpu-mem", gpu_mem, &o.capacity, NULL, &error)) {
        rc = report_error("replay", error);
        goto out;
    }
    /* The recorded settings first; with --alloc-conf, the what-if run beside it. */
    o.timeline = tl = exports_timeline(&ex);
    MemsimReport *base = replay_file(argv[1], &o, &error);
    if (!base) {
        rc = report_error("replay", error);
        goto out;
    }
    for (char **w = base->warnings; w && *w; w++)
        fprintf(stderr, "memsim: warning: %s\n", *w);
    MemsimReport *alt = NULL;
    if (alloc_conf) {
        MemsimReplayOptions o2 = o;
        o2.alloc_conf = alloc_conf;
        o2.verify = FALSE;
        o2.timeline = NULL;
        alt = replay_file(argv[1], &o2, &error);
        if (!alt) {
            memsim_report_free(base);
            rc = report_error("replay", error);
            goto out;
        }
    }
    gboolean mismatch = FALSE, oom = FALSE;
    for (guint i = 0; i < base->n_ranks; i++) {
        mismatch |= base->ranks[i].verify_mismatches > 0;
        oom |= base->ranks[i].oom.happened;
    }
    for (guint i = 0; alt && i < alt->n_ranks; i++)
        oom |= alt->ranks[i].oom.happened;
    if (tl && !exports_write("replay", &ex, base, tl, NULL)) {
        memsim_report_free(base);
        memsim_report_free(alt);
        goto out;
    }
    if (json) {
        g_autofree char *j = memsim_report_to_json(alt ? alt : base);
        if (alt) {
            /* {"ranks": [...what-if...], "recorded_settings": {the base report}} */
            g_autofree char *jb = memsim_report_to_json(base);
            gsize len = strlen(j);
            while (len && (j[len - 1] == '}' || j[len - 1] == '\n' || j[len - 1] == ' '))
                len--;
            printf("%.*s,\n  \"recorded_settings\" : %s\n}\n", (int)len, j, jb);
        } else {
            printf("%s\n", j);
        }
    } else {
        g_autofree char *t = memsim_report_to_text(base);
        fputs(t, stdout);
        if (alt) {
            char a[32], b[32], c[32], d[32];
            printf("\nwhat-if: %s\n", alt->allocator);
            printf("%-6s %16s %16s %16s %16s\n", "rank", "reserved (rec.)", "reserved (what-if)",
                   "allocated (rec.)", "allocated (what-if)");
            for (guint i = 0; i < alt->n_ranks && i < base->n_ranks; i++)
                printf("%-6u %16s %16s %16s %16s%s\n", alt->ranks[i].rank,
                       memsim_format_bytes((memsim_size_t)base->ranks[i].stats.reserved.peak, a, 32),
                       memsim_format_bytes((memsim_size_t)alt->ranks[i].stats.reserved.peak, b, 32),
                       memsim_format_bytes((memsim_size_t)base->ranks[i].stats.allocated.peak, c,
                                           32),
                       memsim_format_bytes((memsim_size_t)alt->ranks[i].stats.allocated.peak, d,
                                           32),
                       alt->ranks[i].oom.happened ? "  OOM" : "");
            printf("(peaks; the what-if run replays the same request stream)\n");
            for (guint i = 0; i < alt->n_ranks; i++) {
                const MemsimOomVerdict *v = &alt->ranks[i].oom_verdict;
                if (!v->replayed)
                    continue;
                if (v->fits)
                    printf("rank %u: the recorded OOM's request (event %" G_GUINT64_FORMAT
                           ") on %s: FITS with the what-if settings, %s left free on the device\n",
                           alt->ranks[i].rank, v->event_index,
                           memsim_format_bytes(v->capacity, a, 32),
                           memsim_format_bytes(v->margin, b, 32));
                else
                    printf("rank %u: the recorded OOM's request (event %" G_GUINT64_FORMAT
                           ") on %s: still DOES NOT FIT with the what-if settings, short by %s; "
                           "%s free in cached blocks: short by %s even if all of it were usable\n",
                           alt->ranks[i].rank, v->event_index,
                           memsim_format_bytes(v->capacity, a, 32),
                           memsim_format_bytes(v->margin, b, 32),
                           memsim_format_bytes(v->cached_free, c, 32),
                           memsim_format_bytes(v->short_packed, d, 32));
                if (alt->ranks[i].oom.happened)
                    printf("rank %u: the next failure with the what-if settings: out of memory "
                           "at event %" G_GUINT64_FORMAT "\n",
                           alt->ranks[i].rank, alt->ranks[i].oom.event_index);
                else
                    printf("rank %u: no further failure with the what-if settings\n",
                           alt->ranks[i].rank);
            }
        }
    }
    memsim_report_free(base);
    memsim_report_free(alt);
    rc = mismatch || oom ? EXIT_NO : EXIT_OK;
out:
    g_option_context_free(ctx);
    g_free(allocator);
    g_free(frames_skip);
    g_free(alloc_conf);
    g_free(gpu_mem);
    exports_clear(&ex);
    memsim_timeline_free(tl);
    return rc;
}

/* ---- convert ---- */

static int cmd_convert(int argc, char **argv)
{
    GOptionEntry entries[] = {{NULL}};
    GOptionContext *ctx = make_context(
        "convert", "IN OUT",
        "Convert a trace between formats, chosen by the extension of OUT: .mst (binary), "
        ".txt/.mstt (text), .pickle (a PyTorch memory snapshot of what the torch allocator "
        "model does with the trace, loadable by torch.cuda._memory_viz and pytorch.org/"
        "memory_viz). IN may also be a PyTorch memory snapshot (.pickle).",
        "Examples:\n  memsim convert run.pickle run.mst\n  memsim convert run.mst run.txt\n"
        "  memsim convert run.mst run.pickle\n",
        entries);
    int rc = EXIT_BAD;
    if (!parse(ctx, "convert", &argc, &argv))
        goto out;
    if (argc != 3) {
        fprintf(stderr, "memsim convert: expected IN and OUT (see memsim convert --help)\n");
        goto out;
    }
    GError *error = NULL;
    Progress pr;
    progress_start(&pr, "converting", NULL, PROGRESS_COUNT, NULL, NULL);
    gboolean ok = memsim_convert(argv[1], argv[2], &error);
    progress_stop(&pr);
    if (!ok) {
        rc = report_error("convert", error);
        goto out;
    }
    rc = EXIT_OK;
out:
    g_option_context_free(ctx);
    return rc;
}

/* ---- the run description, shared by estimate and gen ---- */

static gboolean run_option(const gchar *name, const gchar *value, gpointer data, GError **error)
{
    MemsimRun *run = data;
    while (*name == '-')
        name++;
    if (strcmp(name, "run") == 0)
        return memsim_run_load_file(run, value, error);
    return memsim_run_set(run, name, value ? value : "true", error);
}

/* The run options: --run FILE, then every run setting (memsim_run_setting_info) with its
 * value's name and help; a setting without a value's name is a flag meaning true. */
static GOptionGroup *run_group(MemsimRun *run)
{
    GOptionGroup *grp = g_option_group_new("run", "Run description:", "Show the run options",
                                           run, NULL);
    GOptionEntry file[] = {
        {"run", 0, 0, G_OPTION_ARG_CALLBACK, (gpointer)(guintptr)run_option,
         "Read settings from the [run] group of a key file (same keys)", "FILE"},
        {NULL}};
    g_option_group_add_entries(grp, file);
    const MemsimRunSetting *s;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++) {
        GOptionEntry e[] = {{s->name, 0, s->arg ? 0 : G_OPTION_FLAG_NO_ARG,
                             G_OPTION_ARG_CALLBACK, (gpointer)(guintptr)run_option, s->help,
                             s->arg},
                            {NULL}};
        g_option_group_add_entries(grp, e); /* copies the entry */
    }
    return grp;
}

/* ---- a Megatron-LM launch: --megatron-args ---- */

/* Reads the launch at `path` for `cmd`: it replaces --model and the run settings it sets (a
 * run setting given as well is refused, naming both); --gpus gives the world size of a launch
 * that does not; the device's settings still apply. Its warnings go to stderr. NULL, the
 * message printed, on bad input. */
static MemsimMegatron *megatron_launch(const char *cmd, const char *path, const char *model,
                                       MemsimRun *run)
{
    GError *error = NULL;
    if (model) {
        fprintf(stderr, "memsim %s: --model and --megatron-args: give one (the launch %s "
                        "describes the model)\n",
                cmd, path);
        return NULL;
    }
    MemsimMegatron *mg = memsim_megatron_load(path, &error);
    if (!mg) {
        report_error(cmd, error);
        return NULL;
    }
    for (const char *const *w = memsim_megatron_warnings(mg); *w; w++)
        fprintf(stderr, "memsim: warning: %s\n", *w);
    const MemsimRunSetting *s;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++)
        if (memsim_run_given(run, s->name) && memsim_megatron_sets(mg, s->name)) {
            fprintf(stderr, "memsim %s: --%s and --megatron-args %s: the launch sets %s itself; "
                            "give one of them\n",
                    cmd, s->name, path, s->name);
            memsim_megatron_free(mg);
            return NULL;
        }
    if (memsim_run_given(run, "gpus") && !memsim_megatron_set_gpus(mg, run->gpus, &error)) {
        report_error(cmd, error);
        memsim_megatron_free(mg);
        return NULL;
    }
    memsim_megatron_apply(mg, run);
    return mg;
}

/* ---- a DeepSpeed config: --deepspeed-config ---- */

/* Reads the config at `path` (with --deepspeed-set overrides) for `cmd`: it sets the method,
 * the batch keys, the precision and the optimizer it gives (a run setting given as well is
 * refused, naming both); its warnings go to stderr. NULL, the message printed, on bad
 * input. */
static MemsimDeepspeed *deepspeed_config(const char *cmd, const char *path, char **sets,
                                         MemsimRun *run)
{
    GError *error = NULL;
    MemsimDeepspeed *ds = memsim_deepspeed_load_set(path, (const char *const *)sets, &error);
    if (!ds) {
        report_error(cmd, error);
        return NULL;
    }
    for (const char *const *w = memsim_deepspeed_warnings(ds); *w; w++)
        fprintf(stderr, "memsim: warning: %s\n", *w);
    const MemsimRunSetting *s;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++)
        if (memsim_run_given(run, s->name) && strcmp(s->name, "gpus") != 0 &&
            memsim_deepspeed_sets(ds, s->name)) {
            fprintf(stderr, "memsim %s: --%s and --deepspeed-config %s: the config sets %s "
                            "itself; give one of them\n",
                    cmd, s->name, path, s->name);
            memsim_deepspeed_free(ds);
            return NULL;
        }
    if (!memsim_deepspeed_apply(ds, run, &error)) {
        report_error(cmd, error);
        memsim_deepspeed_free(ds);
        return NULL;
    }
    return ds;
}

/* ---- estimate ---- */

/* The run's sources besides --model: a Megatron-LM launch (its model into *m) or a DeepSpeed
 * config with its overrides, read into the run for `cmd`. FALSE, the message printed, on bad
 * input. */
static gboolean run_sources(const char *cmd, const char *model, const char *megatron,
                            const char *dsconf, char **dssets, MemsimRun *run,
                            MemsimMegatron **mg, MemsimDeepspeed **ds, const MemsimModel **m)
{
    if (megatron) {
        if (!(*mg = megatron_launch(cmd, megatron, model, run)))
            return FALSE;
        *m = memsim_megatron_model(*mg);
    }
    if (!dsconf && dssets) {
        fprintf(stderr, "memsim %s: --deepspeed-set needs --deepspeed-config\n", cmd);
        return FALSE;
    }
    if (dsconf && megatron) {
        fprintf(stderr, "memsim %s: --megatron-args and --deepspeed-config: give one\n", cmd);
        return FALSE;
    }
    return !dsconf || (*ds = deepspeed_config(cmd, dsconf, dssets, run)) != NULL;
}

static int cmd_estimate(int argc, char **argv)
{
    char *model = NULL, *allocator = NULL, *alloc_conf = NULL, *gpu_mem = NULL,
         *context = NULL, *nccl = NULL, *megatron = NULL, *dsconf = NULL;
    char **dssets = NULL;
    gboolean json = FALSE;
    MemsimRun run = memsim_run_defaults();
    Exports ex = {0};
    MemsimTimeline *tl = NULL;
    GOptionEntry entries[] = {
        {"model", 0, 0, G_OPTION_ARG_STRING, &model,
         "A preset (see memsim models) or a config.json", "MODEL"},
        {"megatron-args", 0, 0, G_OPTION_ARG_FILENAME, &megatron,
         "A Megatron-LM launch instead of --model and the run options it sets: a command line, "
         "a shell script or a test's model_config.yaml", "FILE"},
        DEEPSPEED_ENTRIES(dsconf, dssets),
        {"gpu-mem", 0, 0, G_OPTION_ARG_STRING, &gpu_mem,
         "Device memory, a size (80GiB) or a GPU (h100-80gb); default: the --gpu profile's",
         "SIZE|GPU"},
        {"cuda-context", 0, 0, G_OPTION_ARG_STRING, &context,
         "Memory outside the allocator: CUDA context, libraries (default 500MiB)", "SIZE"},
        {"nccl-mem", 0, 0, G_OPTION_ARG_STRING, &nccl,
         "NCCL memory per communicator (default 544MB for 2 ranks, 688MB for more)", "SIZE"},
        {"allocator", 0, 0, G_OPTION_ARG_STRING, &allocator,
         "Allocator policy (default torch)", "SPEC"},
        {"alloc-conf", 0, 0, G_OPTION_ARG_STRING, &alloc_conf,
         "PYTORCH_CUDA_ALLOC_CONF settings for the torch policy", "CONF"},
        {"json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL},
        EXPORT_ENTRIES(ex),
        {NULL}};
    GOptionContext *ctx = make_context(
        "estimate", "",
        "Estimate one GPU's peak memory for a training (or inference) run of a Hugging Face "
        "model: the run's per-operator allocations are generated from the config and replayed "
        "through the allocator model.",
        "Defaults are what a current PyTorch + Transformers user gets without asking: bf16 "
        "mixed precision, AdamW (foreach), zero_grad to None, SDPA attention, no "
        "checkpointing, full fine-tuning, torch 2.8, and the Trainer's loop.\n\n"
        "Examples:\n"
        "  memsim estimate --model llama-3-8b --batch 2 --seq 4096 --precision bf16-mixed \\\n"
        "      --finetune lora --lora-rank 16 --checkpointing full --gpu-mem 80GiB\n"
        "  memsim estimate --model ./config.json --batch 8 --seq 512 --optimizer adamw\n"
        "  memsim estimate --model gpt2 --seq 1024 --report report.html --timeline run.png\n"
        "  memsim estimate --megatron-args train.sh --gpu h100-80gb\n"
        "  memsim estimate --model llama-2-7b --gpus 8 --deepspeed-config ds_config.json\n",
        entries);
    g_option_context_add_group(ctx, run_group(&run));
    int rc = EXIT_BAD;
    GError *error = NULL;
    MemsimModel *owned = NULL;
    const MemsimModel *m = NULL;
    MemsimMegatron *mg = NULL;
    MemsimDeepspeed *ds = NULL;
    MemsimReport *rep = NULL;
    if (!parse(ctx, "estimate", &argc, &argv))
        goto out;
    if (argc != 1 || (!model && !megatron)) {
        fprintf(stderr, "memsim estimate: --model (or --megatron-args) is required (see memsim "
                        "estimate --help)\n");
        goto out;
    }
    if (!run_sources("estimate", model, megatron, dsconf, dssets, &run, &mg, &ds, &m))
        goto out;
    MemsimEstimateOptions eo = MEMSIM_ESTIMATE_OPTIONS_INIT;
    eo.allocator = allocator;
    eo.alloc_conf = alloc_conf ? alloc_conf : mg ? memsim_megatron_alloc_conf(mg) : NULL;
    tl = exports_timeline(&ex);
    Progress pr;
    progress_start(&pr, "estimating", NULL, PROGRESS_COUNT, NULL, NULL);
    if ((gpu_mem && !memsim_parse_gpu_mem("gpu-mem", gpu_mem, &eo.gpu_mem, &eo.device, &error)) ||
        (context && !memsim_parse_size_of("cuda-context", context, &eo.context_bytes, &error)) ||
        (nccl && !memsim_parse_size_of("nccl-mem", nccl, &eo.nccl_bytes, &error)) ||
        (!m && !(m = owned = memsim_model_load(model, &error))) ||
        !memsim_estimate_host_check(m, &run, &(memsim_size_t){0}, &error) ||
        !(rep = memsim_estimate_recorded(m, &run, &eo, tl, &error))) {
        progress_stop(&pr);
        rc = report_error("estimate", error);
        goto out;
    }
    progress_stop(&pr);
    if (tl) {
        g_autofree char *title = g_strdup_printf("%s: %s", memsim_model_name(m), rep->run);
        if (!exports_write("estimate", &ex, rep, tl, title))
            goto out;
    }
    if (json) {
        g_autofree char *j = json_with_model(memsim_report_to_json(rep), m);
        printf("%s\n", j);
    } else {
        g_autofree char *txt = memsim_report_to_text(rep);
        printf("model:     %s (%s, %.2f B parameters)\n", memsim_model_name(m),
               memsim_model_family(m), (double)memsim_model_n_params(m) / 1e9);
        fputs(txt, stdout);
    }
    rc = EXIT_OK;
    for (guint i = 0; i < rep->n_ranks; i++)
        if (!rep->ranks[i].fits)
            rc = EXIT_NO;
out:
    memsim_report_free(rep);
    memsim_model_free(owned);
    memsim_run_clear(&run);
    memsim_megatron_free(mg);
    memsim_deepspeed_free(ds);
    g_option_context_free(ctx);
    g_free(model);
    g_free(megatron);
    g_free(dsconf);
    g_strfreev(dssets);
    g_free(allocator);
    g_free(alloc_conf);
    g_free(gpu_mem);
    g_free(context);
    g_free(nccl);
    exports_clear(&ex);
    memsim_timeline_free(tl);
    return rc;
}

/* ---- gen ---- */

static int cmd_gen(int argc, char **argv)
{
    char *model = NULL, *out_path = NULL, *megatron = NULL, *dsconf = NULL;
    char **dssets = NULL;
    gboolean json = FALSE;
    MemsimRun run = memsim_run_defaults();
    GOptionEntry entries[] = {
        {"model", 0, 0, G_OPTION_ARG_STRING, &model, "A preset or a config.json", "MODEL"},
        {"megatron-args", 0, 0, G_OPTION_ARG_FILENAME, &megatron,
         "A Megatron-LM launch instead of --model and the run options it sets: a command line, "
         "a shell script or a test's model_config.yaml", "FILE"},
        DEEPSPEED_ENTRIES(dsconf, dssets),
        {"json", 0, 0, G_OPTION_ARG_NONE, &json,
         "Print what was written, with the model (family, parameter counts), as JSON", NULL},
        {"output", 'o', 0, G_OPTION_ARG_FILENAME, &out_path,
         "Where to write the trace (.mst, .txt, or .pickle: a PyTorch memory snapshot of "
         "the run through the torch allocator model)", "FILE"},
        {NULL}};
    GOptionContext *ctx = make_context(
        "gen", "", "Generate the per-operator allocation trace of a run and write it to a file.",
        "Example:\n  memsim gen --model opt-1.3b --batch 4 --seq 512 -o run.mst && memsim replay "
        "run.mst\n",
        entries);
    g_option_context_add_group(ctx, run_group(&run));
    int rc = EXIT_BAD;
    GError *error = NULL;
    MemsimModel *owned = NULL;
    const MemsimModel *m = NULL;
    MemsimMegatron *mg = NULL;
    MemsimDeepspeed *ds = NULL;
    MemsimTrace *t = NULL;
    g_autofree char *spill = NULL; /* each rank's program, written as soon as it is complete */
    if (!parse(ctx, "gen", &argc, &argv))
        goto out;
    if (argc != 1 || (!model && !megatron) || !out_path) {
        fprintf(stderr, "memsim gen: --model (or --megatron-args) and -o are required (see "
                        "memsim gen --help)\n");
        goto out;
    }
    if (!run_sources("gen", model, megatron, dsconf, dssets, &run, &mg, &ds, &m))
        goto out;
    Progress pr;
    progress_start(&pr, "generating", NULL, PROGRESS_COUNT, NULL, NULL);
    gboolean ok =
        (m || (m = owned = memsim_model_load(model, &error))) &&
        memsim_estimate_host_check(m, &run, &(memsim_size_t){0}, &error) &&
        /* a snapshot is the replay of the trace in memory; the trace formats stream */
        (memsim_format_from_path(out_path) == MEMSIM_FORMAT_SNAPSHOT ||
         (spill = g_dir_make_tmp("memsim-gen-XXXXXX", &error))) &&
        (t = spill ? memsim_generate_spilling(m, &run, spill, &error)
                   : memsim_generate(m, &run, &error));
    progress_phase(&pr, "writing");
    ok = ok && memsim_trace_save(t, out_path, MEMSIM_FORMAT_AUTO, &error);
    progress_stop(&pr);
    if (!ok) {
        rc = report_error("gen", error);
        goto out;
    }
    if (json) {
        g_autoptr(JsonBuilder) b = json_builder_new();
        json_builder_begin_object(b);
        json_builder_set_member_name(b, "output");
        json_builder_add_string_value(b, out_path);
        json_builder_end_object(b);
        g_autoptr(JsonGenerator) gen = json_generator_new();
        g_autoptr(JsonNode) root = json_builder_get_root(b);
        json_generator_set_root(gen, root);
        g_autofree char *j = json_with_model(json_generator_to_data(gen, NULL), m);
        printf("%s\n", j);
    }
    rc = EXIT_OK;
out:
    memsim_trace_free(t); /* (deletes the ranks' files) */
    if (spill)
        g_rmdir(spill);
    memsim_model_free(owned);
    memsim_run_clear(&run);
    memsim_megatron_free(mg);
    memsim_deepspeed_free(ds);
    g_option_context_free(ctx);
    g_free(model);
    g_free(megatron);
    g_free(dsconf);
    g_strfreev(dssets);
    g_free(out_path);
    return rc;
}

/* ---- models ---- */

static int cmd_models(int argc, char **argv)
{
    gboolean json = FALSE;
    GOptionEntry entries[] = {{"json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL},
                              {NULL}};
    GOptionContext *ctx = make_context("models", "", "List the model presets.", NULL, entries);
    int rc = EXIT_BAD;
    char **names = NULL;
    if (!parse(ctx, "models", &argc, &argv))
        goto out;
    names = memsim_model_presets();
    if (json)
        printf("[");
    for (char **n = names; *n; n++) {
        GError *error = NULL;
        MemsimModel *m = memsim_model_load(*n, &error);
        g_assert(m != NULL);
        if (json) {
            /* the model object of estimate/plan --json, with "parameters" kept for the
             * readers of the earlier listing */
            g_autofree char *mj = memsim_model_to_json(m);
            printf("%s{\"parameters\": %" G_GINT64_FORMAT ", %s", n == names ? "" : ", ",
                   memsim_model_n_params(m), mj + 1);
        }
        else
            printf("%-16s %-9s %8.2f B parameters\n", *n, memsim_model_family(m),
                   (double)memsim_model_n_params(m) / 1e9);
        memsim_model_free(m);
    }
    if (json)
        printf("]\n");
    rc = EXIT_OK;
out:
    g_strfreev(names);
    g_option_context_free(ctx);
    return rc;
}

/* ---- compare ---- */

static int cmd_compare(int argc, char **argv)
{
    char *model = NULL, *allocators = NULL, *gpu_mem = NULL, *context = NULL;
    gboolean json = FALSE;
    MemsimRun run = memsim_run_defaults();
    GOptionEntry entries[] = {
        {"allocators", 0, 0, G_OPTION_ARG_STRING, &allocators,
         "Policies to compare, comma-separated, each name[:key=value,...], or all (default "
         "all)", "LIST"},
        {"model", 0, 0, G_OPTION_ARG_STRING, &model,
         "Compare on the generated trace of a run of this model (a preset or a config.json) "
         "instead of a trace file", "MODEL"},
        {"gpu-mem", 0, 0, G_OPTION_ARG_STRING, &gpu_mem,
         "Device memory, e.g. 80GiB: where each policy runs out (default: the trace's recorded "
         "capacity, else unlimited)", "SIZE"},
        {"cuda-context", 0, 0, G_OPTION_ARG_STRING, &context,
         "With --model: memory outside the allocator (default 500MiB; a trace file: 0)", "SIZE"},
        {"json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL},
        {NULL}};
    GOptionContext *ctx = make_context(
        "compare", "[TRACE]",
        "Replay one trace (.mst, text, a PyTorch snapshot pickle, or a run generated with "
        "--model) through several allocator policies, side by side: peak reserved and "
        "allocated bytes, fragmentation at the peak, driver calls, the ratio to the `exact` "
        "lower bound, and where each runs out of memory at --gpu-mem.",
        "Examples:\n"
        "  memsim compare run.pickle --allocators torch,torch:expandable_segments=True,bfc,buddy,"
        "exact\n"
        "  memsim compare --model llama-2-7b --batch 4 --seq 2048 --allocators all --gpu-mem "
        "80GiB\n"
        "  memsim replay --allocator help      (the policies and their settings)\n",
        entries);
    g_option_context_add_group(ctx, run_group(&run));
    int rc = EXIT_BAD;
    GError *error = NULL;
    MemsimModel *m = NULL;
    MemsimTrace *t = NULL;
    MemsimComparison *c = NULL;
    char **specs = NULL, *text = NULL;
    if (!parse(ctx, "compare", &argc, &argv))
        goto out;
    if ((model != NULL) == (argc == 2) || argc > 2) {
        fprintf(stderr, "memsim compare: give one trace file or --model (see memsim compare "
                        "--help)\n");
        goto out;
    }
    memsim_size_t gpu = 0, ctxb = model ? MEMSIM_ESTIMATE_CONTEXT_DEFAULT : 0;
    if ((gpu_mem && !memsim_parse_gpu_mem("gpu-mem", gpu_mem, &gpu, NULL, &error)) ||
        (context && !memsim_parse_size_of("cuda-context", context, &ctxb, &error)) ||
        !(specs = memsim_compare_parse_specs(allocators ? allocators : "all", &error))) {
        rc = report_error("compare", error);
        goto out;
    }
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    if (!memsim_device_capacity(gpu, ctxb, &o.capacity, &error)) {
        rc = report_error("compare", error);
        goto out;
    }
    Progress pr;
    guint64 bytes = 0, size = model ? 0 : file_size(argv[1]);
    progress_start(&pr, model ? "generating" : "reading", NULL, PROGRESS_BYTES,
                   size > BIG_INPUT ? &bytes : NULL, size > BIG_INPUT ? &size : NULL);
    gboolean ok = model ? (m = memsim_model_load(model, &error)) &&
                              (t = memsim_generate(m, &run, &error))
                        : (t = memsim_trace_load_counted(argv[1], &bytes, &error)) != NULL;
    progress_phase(&pr, "comparing");
    ok = ok && (c = memsim_compare_trace(t, (const char *const *)specs, &o, &error));
    progress_stop(&pr);
    if (!ok) {
        rc = report_error("compare", error);
        goto out;
    }
    if (m) {
        g_free(c->source);
        g_autofree char *desc = memsim_run_describe(&run);
        c->source = g_strdup_printf("%s, %s", memsim_model_name(m), desc);
    }
    for (char **w = memsim_trace_header(t)->warnings; w && *w; w++)
        fprintf(stderr, "memsim: warning: %s\n", *w);
    memsim_comparison_set_device(c, gpu, ctxb);
    text = json ? memsim_comparison_to_json(c) : memsim_comparison_to_text(c);
    fputs(text, stdout);
    if (json)
        putchar('\n');
    rc = EXIT_OK;
    for (guint i = 0; i < c->n_runs; i++)
        for (guint k = 0; c->runs[i].report && k < c->runs[i].report->n_ranks; k++)
            if (!c->runs[i].report->ranks[k].fits)
                rc = EXIT_NO;
out:
    g_free(text);
    memsim_comparison_free(c);
    memsim_trace_free(t);
    memsim_model_free(m);
    memsim_run_clear(&run);
    g_strfreev(specs);
    g_option_context_free(ctx);
    g_free(model);
    g_free(allocators);
    g_free(gpu_mem);
    g_free(context);
    return rc;
}

/* ---- plan ---- */

static guint64 plan_done, plan_total;

static void plan_progress(guint done, guint total, gpointer user)
{
    __atomic_store_n(&plan_total, (guint64)total, __ATOMIC_RELAXED);
    __atomic_store_n(&plan_done, (guint64)done, __ATOMIC_RELAXED);
}

static int cmd_plan(int argc, char **argv)
{
    char *model = NULL, *gpu_mem = NULL, *context = NULL, *nccl = NULL, *methods = NULL,
         *schedules = NULL, *ckpts = NULL, *megatron = NULL,
         *dsconf = NULL;
    char **dssets = NULL;
    gint64 global_batch = 0, max_batch = 0;
    gint top = 5, misses = 5, threads = 0;
    gboolean json = FALSE, csv = FALSE, mig = FALSE, exhaustive = FALSE, no_exp = FALSE,
             no_offload = FALSE;
    MemsimRun run = memsim_run_defaults();
    GOptionEntry entries[] = {
        {"model", 0, 0, G_OPTION_ARG_STRING, &model,
         "A preset (see memsim models) or a config.json", "MODEL"},
        {"megatron-args", 0, 0, G_OPTION_ARG_FILENAME, &megatron,
         "A Megatron-LM launch as the model and batch: its parallel layout is swept around it",
         "FILE"},
        DEEPSPEED_ENTRIES(dsconf, dssets),
        {"global-batch", 0, 0, G_OPTION_ARG_INT64, &global_batch,
         "Sequences per optimizer step (default: one micro-batch per replica and step)", "N"},
        {"gpu-mem", 0, 0, G_OPTION_ARG_STRING, &gpu_mem,
         "Device memory (default: the --gpu profile's)", "SIZE"},
        {"mig", 0, 0, G_OPTION_ARG_NONE, &mig,
         "Which MIG slices of the --gpu a single-GPU job fits in, and how many per GPU", NULL},
        {"methods", 0, 0, G_OPTION_ARG_STRING, &methods,
         "ddp, zero1, zero2, zero3, zero, fsdp, fsdp-grad-op, hsdp, tp (Megatron tp × dp), "
         "pp (Megatron with a pipeline), megatron, all (default all)", "LIST"},
        {"schedules", 0, 0, G_OPTION_ARG_STRING, &schedules,
         "Pipeline schedules: 1f1b, interleaved, gpipe (default 1f1b,interleaved)", "LIST"},
        {"checkpointing-modes", 0, 0, G_OPTION_ARG_STRING, &ckpts,
         "Checkpointing swept: none, selective, full (default all three)", "LIST"},
        {"max-batch", 0, 0, G_OPTION_ARG_INT64, &max_batch,
         "Largest micro-batch tried (default 256, or the per-replica batch)", "N"},
        {"no-expandable", 0, 0, G_OPTION_ARG_NONE, &no_exp,
         "Leave PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True out of the sweep", NULL},
        {"no-offload", 0, 0, G_OPTION_ARG_NONE, &no_offload,
         "Never fall back to CPU offload of the optimizer state", NULL},
        {"top", 0, 0, G_OPTION_ARG_INT, &top, "Layouts ranked (default 5; 0: all)", "N"},
        {"misses", 0, 0, G_OPTION_ARG_INT, &misses, "Closest misses shown (default 5)", "N"},
        {"exhaustive", 0, 0, G_OPTION_ARG_NONE, &exhaustive,
         "Simulate every candidate and micro-batch: no pruning, no bisection (slow; a check)",
         NULL},
        {"threads", 0, 0, G_OPTION_ARG_INT, &threads, "Worker threads (default: one per core)",
         "N"},
        {"cuda-context", 0, 0, G_OPTION_ARG_STRING, &context,
         "Memory outside the allocator: CUDA context, libraries (default 500MiB)", "SIZE"},
        {"nccl-mem", 0, 0, G_OPTION_ARG_STRING, &nccl,
         "NCCL memory per communicator (default 544MB for 2 ranks, 688MB for more)", "SIZE"},
        {"json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL},
        {"csv", 0, 0, G_OPTION_ARG_NONE, &csv, "Print CSV (one line per row)", NULL},
        {NULL}};
    GOptionContext *ctx = make_context(
        "plan", "",
        "Sweep the distributed methods and their degrees, micro-batches, activation "
        "checkpointing and allocator settings of a run on --gpus × --gpu, simulate each "
        "candidate as memsim estimate does, and rank the layouts that fit by estimated tokens "
        "per second; then the closest misses, the recommendation and the command that "
        "re-estimates it.",
        "The run options set what the plan keeps (seq, precision, optimizer, finetune, ...); "
        "--gpus, --gpu and --gpus-per-node describe the cluster. Step times are estimates: each "
        "configuration shown is simulated as memsim estimate simulates it (op durations by "
        "roofline and GEMM waves, host dispatch, NCCL collectives), a cost model only orders "
        "the search. Exit status: 0 something fits, 1 nothing "
        "fits, 2 bad input.\n\n"
        "Examples:\n"
        "  memsim plan --model llama-3-8b --gpus 8 --gpu a100-40gb --seq 4096 --global-batch 64\n"
        "  memsim plan --model mistral-7b --gpus 1 --gpu h200 --mig\n"
        "  memsim plan --model llama-2-70b --gpus 16 --gpu h100-80gb --seq 4096 --finetune qlora\n"
        "  memsim plan --megatron-args model_config.yaml --gpu h100-80gb\n"
        "  memsim plan --model llama-2-7b --gpus 8 --deepspeed-config ds_config.json\n",
        entries);
    g_option_context_add_group(ctx, run_group(&run));
    int rc = EXIT_BAD;
    GError *error = NULL;
    MemsimModel *owned = NULL;
    const MemsimModel *m = NULL;
    MemsimMegatron *mg = NULL;
    MemsimDeepspeed *ds = NULL;
    MemsimPlan *plan = NULL;
    MemsimPlanOptions o = memsim_plan_options_defaults();
    if (!parse(ctx, "plan", &argc, &argv))
        goto out;
    if (argc != 1 || (!model && !megatron)) {
        fprintf(stderr, "memsim plan: --model (or --megatron-args) is required (see memsim plan "
                        "--help)\n");
        goto out;
    }
    if (megatron && global_batch) {
        fprintf(stderr, "memsim plan: --global-batch and --megatron-args %s: the launch sets the "
                        "global batch itself; give one of them\n",
                megatron);
        goto out;
    }
    if (!run_sources("plan", model, megatron, dsconf, dssets, &run, &mg, &ds, &m))
        goto out;
    memsim_plan_options_use_run(&o, &run);
    o.global_batch = global_batch;
    o.max_batch = max_batch;
    o.mig = mig;
    o.top = top;
    o.misses = misses;
    o.exhaustive = exhaustive;
    o.no_expandable = no_exp;
    o.no_offload = no_offload;
    o.threads = threads;
    o.progress = plan_progress;
    if ((gpu_mem && !memsim_plan_options_set(&o, "gpu-mem", gpu_mem, &error)) ||
        (context && !memsim_plan_options_set(&o, "cuda-context", context, &error)) ||
        (nccl && !memsim_plan_options_set(&o, "nccl-mem", nccl, &error)) ||
        (methods && !memsim_plan_options_set(&o, "methods", methods, &error)) ||
        (schedules && !memsim_plan_options_set(&o, "schedules", schedules, &error)) ||
        (ckpts && !memsim_plan_options_set(&o, "checkpointing-modes", ckpts, &error)) ||
        (!m && !(m = owned = memsim_model_load(model, &error)))) {
        rc = report_error("plan", error);
        goto out;
    }
    Progress pr;
    progress_start(&pr, "planning", "layouts", PROGRESS_COUNT, &plan_done, &plan_total);
    plan = memsim_plan(m, &o, &error);
    progress_stop(&pr);
    if (!plan) {
        rc = report_error("plan", error);
        goto out;
    }
    char *text = json ? json_with_model(memsim_plan_to_json(plan), m)
                 : csv ? memsim_plan_to_csv(plan)
                       : memsim_plan_to_text(plan);
    fputs(text, stdout);
    g_free(text);
    if (json)
        fputc('\n', stdout);
    gboolean any = plan->n_rows > 0;
    for (guint i = 0; i < plan->n_mig; i++)
        any |= plan->mig[i].fits;
    rc = any ? EXIT_OK : EXIT_NO;
out:
    memsim_plan_free(plan);
    memsim_model_free(owned);
    memsim_run_clear(&run);
    memsim_megatron_free(mg);
    memsim_deepspeed_free(ds);
    g_option_context_free(ctx);
    g_free(model);
    g_free(megatron);
    g_free(dsconf);
    g_strfreev(dssets);
    g_free(gpu_mem);
    g_free(context);
    g_free(nccl);
    g_free(methods);
    g_free(schedules);
    g_free(ckpts);
    return rc;
}

/* ---- main ---- */

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} Command;

static const Command commands[] = {
    {"estimate", cmd_estimate, "one run's peak memory on a GPU, from a model config"},
    {"plan", cmd_plan, "the fastest configuration that fits on a cluster, swept and simulated"},
    {"gen", cmd_gen, "write the generated trace of a run to a file"},
    {"models", cmd_models, "list the model presets"},
    {"replay", cmd_replay, "replay a trace or a PyTorch snapshot through an allocator model"},
    {"compare", cmd_compare, "one trace through several allocator policies, side by side"},
    {"convert", cmd_convert, "convert a trace between .mst, text and snapshot formats"},
};

static void usage(FILE *f)
{
    fprintf(f, "Usage: memsim COMMAND [OPTIONS...]\n\n"
               "How much GPU memory a run takes, simulated through PyTorch's allocator.\n\n"
               "Commands:\n");
    for (gsize i = 0; i < G_N_ELEMENTS(commands); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nRun 'memsim COMMAND --help' for a command's options.\n"
               "Exit status: 0 success, 1 does not fit / verify mismatch, 2 bad input.\n");
}

int main(int argc, char **argv)
{
    /* the user's locale for text (help and messages hold … and ×), with C numbers (JSON
     * and tables print with a point); where that locale is not UTF-8 (plain C), C.UTF-8 */
    setlocale(LC_ALL, "");
    setlocale(LC_NUMERIC, "C");
    if (!g_get_charset(NULL))
        setlocale(LC_CTYPE, "C.UTF-8");
    g_set_prgname("memsim");
    memsim_tools_malloc_tune();
    if (argc < 2) {
        usage(stderr);
        return EXIT_BAD;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("memsim 0.1.0\n");
        return EXIT_OK;
    }
    for (gsize i = 0; i < G_N_ELEMENTS(commands); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "memsim: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return EXIT_BAD;
}
