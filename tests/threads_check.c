/* threads_check — the library from several threads at once. Each scenario runs its jobs
 * (estimates of different models, replays of traces) one after the other, keeps their JSON,
 * then runs them all at once in GThreads and checks that every result is the same.
 * gen.h promises that distinct memsim_estimate calls share nothing; sim.h the same of
 * replays.
 *
 *     threads_check [--quick] [SNAPSHOT]
 *
 * A program of its own (not a Criterion test) so that it runs under ThreadSanitizer (the
 * build-tsan of tools/run-tests.sh) and under Helgrind (tests/test_threads.c), which do not
 * get along with Criterion's forked, sandboxed workers. --quick: only the first scenario,
 * once (for Helgrind, which is slow). SNAPSHOT: a real PyTorch snapshot to replay with
 * --verify beside the others. Exit status 0 when every concurrent result matches. */
#include <memsim/formats.h>
#include <memsim/estimate.h>
#include <memsim/gen.h>
#include <memsim/sim.h>

#include <glib/gstdio.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *model;
    const char *const *settings; /* key, value, ..., NULL */
    const char *trace;           /* or NULL: an estimate */
    GThread *thread;
    char *json;                  /* the result, newly allocated */
    char *error;                 /* or the error message */
} Job;

static const char *job_name(const Job *job)
{
    return job->trace ? job->trace : job->model;
}

static void job_finish(Job *job, MemsimReport *rep, GError *error)
{
    if (rep) {
        job->json = memsim_report_to_json(rep);
        memsim_report_free(rep);
    } else {
        job->error = g_strdup(error ? error->message : "failed");
        g_clear_error(&error);
    }
}

static gpointer job_run(gpointer data)
{
    Job *job = data;
    GError *error = NULL;
    if (job->trace) {
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.verify = TRUE;
        job_finish(job, memsim_replay_path(job->trace, &o, &error), error);
        return NULL;
    }
    MemsimRun run = memsim_run_defaults();
    MemsimModel *m = NULL;
    MemsimReport *rep = NULL;
    gboolean ok = TRUE;
    for (const char *const *s = job->settings; ok && s && *s; s += 2)
        ok = memsim_run_set(&run, s[0], s[1], &error);
    if (ok && (m = memsim_model_load(job->model, &error))) {
        MemsimEstimateOptions eo = MEMSIM_ESTIMATE_OPTIONS_INIT;
        eo.gpu_mem = (memsim_size_t)24 << 30;
        rep = memsim_estimate(m, &run, &eo, &error);
    }
    job_finish(job, rep, error);
    memsim_model_free(m);
    memsim_run_clear(&run);
    return NULL;
}

/* Serial results, then `rounds` concurrent runs compared with them. Returns the number of
 * failures (each printed). */
static int check_concurrent(const char *scenario, Job *jobs, gsize n, int rounds)
{
    int failures = 0;
    char **serial = g_new0(char *, n + 1);
    for (gsize i = 0; i < n; i++) {
        job_run(&jobs[i]);
        if (!jobs[i].json) {
            printf("%s: %s fails on its own: %s\n", scenario, job_name(&jobs[i]), jobs[i].error);
            g_free(jobs[i].error);
            jobs[i].error = NULL;
            g_strfreev(serial);
            return 1;
        }
        serial[i] = jobs[i].json;
        jobs[i].json = NULL;
    }
    for (int r = 0; r < rounds; r++) {
        for (gsize i = 0; i < n; i++)
            jobs[i].thread = g_thread_new("memsim-job", job_run, &jobs[i]);
        for (gsize i = 0; i < n; i++)
            g_thread_join(jobs[i].thread);
        for (gsize i = 0; i < n; i++) {
            if (!jobs[i].json) {
                printf("%s, round %d: %s failed: %s\n", scenario, r, job_name(&jobs[i]),
                       jobs[i].error);
                failures++;
            } else if (strcmp(jobs[i].json, serial[i]) != 0) {
                printf("%s, round %d: %s: the concurrent result differs from the serial one\n",
                       scenario, r, job_name(&jobs[i]));
                failures++;
            }
            g_clear_pointer(&jobs[i].json, g_free);
            g_clear_pointer(&jobs[i].error, g_free);
        }
    }
    g_strfreev(serial);
    printf("%s: %zu jobs, %d concurrent round(s): %s\n", scenario, (size_t)n, rounds,
           failures ? "FAILED" : "same results");
    return failures;
}

/* Generates a small trace and writes it in both formats. */
static gboolean write_traces(const char *mst, const char *txt)
{
    GError *error = NULL;
    MemsimRun run = memsim_run_defaults();
    MemsimModel *m = memsim_model_load("opt-125m", &error);
    MemsimTrace *t = NULL;
    gboolean ok = m && memsim_run_set(&run, "seq", "128", &error) &&
                  (t = memsim_generate(m, &run, &error)) &&
                  memsim_trace_save(t, mst, MEMSIM_FORMAT_AUTO, &error) &&
                  memsim_trace_save(t, txt, MEMSIM_FORMAT_AUTO, &error);
    if (!ok) {
        printf("cannot write the traces: %s\n", error ? error->message : "?");
        g_clear_error(&error);
    }
    memsim_trace_free(t);
    memsim_model_free(m);
    memsim_run_clear(&run);
    return ok;
}

int main(int argc, char **argv)
{
    gboolean quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    const char *snapshot = argc > 1 + quick ? argv[1 + quick] : NULL;
    int failures = 0;

    static const char *const small[] = {"seq", "256", "batch", "2", NULL};
    static const char *const lora[] = {"seq", "128", "finetune", "lora", "checkpointing", "full",
                                       NULL};
    Job two[] = {
        {.model = "gpt2", .settings = small},
        {.model = "opt-125m", .settings = lora},
    };
    if (quick) {
        static const char *const tiny[] = {"seq", "64", "steps", "1", NULL};
        two[0].settings = two[1].settings = tiny;
    }
    failures += check_concurrent("two estimates", two, G_N_ELEMENTS(two), quick ? 1 : 2);
    if (quick)
        return failures ? 1 : 0;

    /* Four at once, two of them of the same model. */
    static const char *const a[] = {"seq", "128", NULL};
    static const char *const b[] = {"seq", "128", "precision", "fp32", "optimizer", "sgd", NULL};
    Job four[] = {
        {.model = "gpt2", .settings = a},
        {.model = "gpt2", .settings = b},
        {.model = "pythia-410m", .settings = a},
        {.model = "bloom-560m", .settings = b},
    };
    failures += check_concurrent("four estimates", four, G_N_ELEMENTS(four), 1);

    /* Pipelines whose stages' memory catches up with the steady state on threads of their
     * own (MemsimReplayOptions.threads), two at once. */
    static const char *const pipe[] = {"gpus", "4", "method", "megatron", "pp", "4",
                                       "microbatches", "64", "seq", "256", NULL};
    static const char *const pipe_full[] = {"gpus", "4", "method", "megatron", "pp", "4",
                                            "microbatches", "64", "seq", "256",
                                            "checkpointing", "full", NULL};
    Job pipes[] = {
        {.model = "gpt2", .settings = pipe},
        {.model = "gpt2", .settings = pipe_full},
    };
    failures += check_concurrent("two pipelines", pipes, G_N_ELEMENTS(pipes), 1);

    /* Replays (the .mst, text and snapshot readers, the torch policy, --verify) beside an
     * estimate. */
    GError *error = NULL;
    char *tmp = g_dir_make_tmp("memsim-threads-XXXXXX", &error);
    if (!tmp) {
        printf("mkdtemp: %s\n", error->message);
        return 1;
    }
    char *mst = g_build_filename(tmp, "run.mst", NULL);
    char *txt = g_build_filename(tmp, "run.txt", NULL);
    /* a snapshot of the run through the torch policy: its reader reads the file and makes
     * the replay's chunks on threads of its own */
    char *pkl = g_build_filename(tmp, "run.pickle", NULL);
    if (write_traces(mst, txt) && memsim_convert(mst, pkl, &error)) {
        Job mixed[] = {
            {.trace = mst},
            {.trace = txt},
            {.trace = pkl},
            {.model = "gpt2", .settings = a},
            {.trace = snapshot},
        };
        failures += check_concurrent("replays and an estimate", mixed,
                                     G_N_ELEMENTS(mixed) - (snapshot ? 0 : 1), 2);
    } else {
        if (error)
            printf("cannot write the snapshot: %s\n", error->message);
        g_clear_error(&error);
        failures++;
    }
    g_remove(mst);
    g_remove(txt);
    g_remove(pkl);
    g_free(pkl);
    g_rmdir(tmp);
    g_free(mst);
    g_free(txt);
    g_free(tmp);
    return failures ? 1 : 0;
}
