/* estimate_and_replay — the library's public API from a program of one's own.
 *
 *     estimate_and_replay MODEL TRACE [KEY=VALUE...]
 *
 * Estimates one GPU's peak memory for a run of MODEL (a preset or a config.json), with the
 * run settings given as KEY=VALUE (the names of memsim's run flags without "--", e.g.
 * batch=2 seq=4096 finetune=lora; gpu-mem=80GiB is the device memory), then replays TRACE
 * (.mst, text, or a PyTorch snapshot pickle) through the default allocator model. Prints
 * each report's JSON on its own, exactly what `memsim estimate --json` and `memsim replay
 * --json TRACE` print.
 *
 * Only <memsim/gen.h> and <memsim/sim.h> are used; build it against an installed memsim:
 *
 *     cc estimate_and_replay.c $(pkg-config --cflags --libs memsim) -o estimate_and_replay
 *
 * Exit status: 0 success, 2 bad input (the message names what was wrong).
 */
#include <memsim/estimate.h>
#include <memsim/gen.h>
#include <memsim/sim.h>

#include <stdio.h>
#include <string.h>

static int fail(GError *error)
{
    fprintf(stderr, "estimate_and_replay: %s\n", error->message);
    g_error_free(error);
    return 2;
}

/* The run settings and the estimate options from KEY=VALUE arguments. */
static gboolean parse_settings(int argc, char **argv, MemsimRun *run,
                               MemsimEstimateOptions *eo, GError **error)
{
    for (int i = 0; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!eq) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "'%s': expected KEY=VALUE", argv[i]);
            return FALSE;
        }
        g_autofree char *key = g_strndup(argv[i], (gsize)(eq - argv[i]));
        const char *value = eq + 1;
        gboolean ok;
        if (strcmp(key, "gpu-mem") == 0)
            ok = memsim_parse_size(value, &eo->gpu_mem, error);
        else
            ok = memsim_run_set(run, key, value, error);
        if (!ok)
            return FALSE;
    }
    return TRUE;
}

static int estimate(const char *model_name, int argc, char **argv)
{
    GError *error = NULL;
    MemsimRun run = memsim_run_defaults();
    MemsimEstimateOptions eo = MEMSIM_ESTIMATE_OPTIONS_INIT;
    MemsimModel *model = NULL;
    MemsimReport *rep = NULL;
    int rc = 0;
    if (!parse_settings(argc, argv, &run, &eo, &error) ||
        !(model = memsim_model_load(model_name, &error)) ||
        !(rep = memsim_estimate(model, &run, &eo, &error))) {
        rc = fail(error);
    } else {
        /* the report with the model (family, parameter counts), as the command prints it */
        g_autofree char *report = memsim_report_to_json(rep);
        g_autofree char *json = memsim_json_with_model(report, model);
        printf("%s\n", json);
    }
    memsim_report_free(rep);
    memsim_model_free(model);
    memsim_run_clear(&run);
    return rc;
}

static int replay(const char *path)
{
    GError *error = NULL;
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    MemsimReport *rep = memsim_replay_path(path, &o, &error);
    if (!rep)
        return fail(error);
    g_autofree char *json = memsim_report_to_json(rep);
    printf("%s\n", json);
    memsim_report_free(rep);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: estimate_and_replay MODEL TRACE [KEY=VALUE...]\n");
        return 2;
    }
    int rc = estimate(argv[1], argc - 3, argv + 3);
    if (rc == 0)
        rc = replay(argv[2]);
    return rc;
}
