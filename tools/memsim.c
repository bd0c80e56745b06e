/* memsim — the command. Parses options, calls the library (include/memsim/), prints.
 *
 * Exit status: 0 success; 1 an answer of "does not fit" (a simulated OOM) or, for
 * `replay --verify`, a mismatch; 2 bad input or usage. */
#include <memsim/alloc.h>
#include <memsim/formats.h>
#include <memsim/sim.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EXIT_OK = 0, EXIT_NO = 1, EXIT_BAD = 2 };

static int report_error(const char *cmd, GError *error)
{
    fprintf(stderr, "memsim %s: %s\n", cmd, error ? error->message : "failed");
    if (error)
        g_error_free(error);
    return EXIT_BAD;
}

static GOptionContext *make_context(const char *cmd, const char *params, const char *summary,
                                    const char *description, GOptionEntry *entries)
{
    g_autofree char *ps = g_strdup_printf("%s %s", cmd, params);
    GOptionContext *ctx = g_option_context_new(ps);
    g_option_context_set_summary(ctx, summary);
    if (description)
        g_option_context_set_description(ctx, description);
    g_option_context_add_main_entries(ctx, entries, NULL);
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
    return TRUE;
}

/* ---- replay ---- */

static int cmd_replay(int argc, char **argv)
{
    gboolean verify = FALSE, json = FALSE, check = FALSE;
    char *allocator = NULL, *alloc_conf = NULL, *gpu_mem = NULL;
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
         "Device memory available to the allocator, e.g. 80GiB (default: unlimited)", "SIZE"},
        {"json", 0, 0, G_OPTION_ARG_NONE, &json, "Print JSON instead of a table", NULL},
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
        "  memsim replay run.mst --gpu-mem 40GiB --json\n",
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
    if (gpu_mem && !memsim_parse_size(gpu_mem, &o.capacity, &error)) {
        rc = report_error("replay", error);
        goto out;
    }
    /* The recorded settings first; with --alloc-conf, the what-if run beside it. */
    MemsimReport *base = memsim_replay_path(argv[1], &o, &error);
    if (!base) {
        rc = report_error("replay", error);
        goto out;
    }
    MemsimReport *alt = NULL;
    if (alloc_conf) {
        MemsimReplayOptions o2 = o;
        o2.alloc_conf = alloc_conf;
        o2.verify = FALSE;
        alt = memsim_replay_path(argv[1], &o2, &error);
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
        }
    }
    memsim_report_free(base);
    memsim_report_free(alt);
    rc = mismatch || oom ? EXIT_NO : EXIT_OK;
out:
    g_option_context_free(ctx);
    g_free(allocator);
    g_free(alloc_conf);
    g_free(gpu_mem);
    return rc;
}

/* ---- convert ---- */

static int cmd_convert(int argc, char **argv)
{
    GOptionEntry entries[] = {{NULL}};
    GOptionContext *ctx = make_context(
        "convert", "IN OUT",
        "Convert a trace between formats, chosen by the extension of OUT: .mst (binary), "
        ".txt/.mstt (text). IN may also be a PyTorch memory snapshot (.pickle).",
        "Examples:\n  memsim convert run.pickle run.mst\n  memsim convert run.mst run.txt\n",
        entries);
    int rc = EXIT_BAD;
    if (!parse(ctx, "convert", &argc, &argv))
        goto out;
    if (argc != 3) {
        fprintf(stderr, "memsim convert: expected IN and OUT (see memsim convert --help)\n");
        goto out;
    }
    GError *error = NULL;
    if (!memsim_convert(argv[1], argv[2], &error)) {
        rc = report_error("convert", error);
        goto out;
    }
    rc = EXIT_OK;
out:
    g_option_context_free(ctx);
    return rc;
}

/* ---- main ---- */

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} Command;

static const Command commands[] = {
    {"replay", cmd_replay, "replay a trace or a PyTorch snapshot through an allocator model"},
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
