/* DeepSpeed configs (--deepspeed-config): the model state per rank on the GPU and on the host
 * against DeepSpeed's own formulas, the docs' example configs, "auto", warnings and refusals,
 * and the plan's re-check command.
 *
 * The independent source of the closed forms is DeepSpeed's memory estimators:
 *   deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs:
 *     no offload  GPU 2Ψ + 18Ψ/N  (2 bf16 params; per rank 2 bf16 grads + 4 fp32 grads
 *                                   + 4 fp32 params + 8 Adam states)
 *     cpu offload GPU 2Ψ,          host max(4N, 16)Ψ × 1.5 per node: the model state is the
 *                                   16Ψ, i.e. 16Ψ/N per rank (fp32 params, fp32 grads, Adam)
 *   deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs (zero_init):
 *     no offload  GPU 4·largest_layer + 18Ψ/N
 *     offload_optimizer      GPU 4·largest_layer + 2Ψ/N, host 16Ψ per node
 *     offload_param as well  GPU 4·largest_layer,        host 18Ψ per node
 * (the additional_buffer_factor 1.5 and the 4N fp32 copies a node loads are not model state).
 * At the optimizer step no layer is gathered, so largest_layer drops out; the 2Ψ/N bf16
 * gradient partition goes with the optimizer to the host in stage 3 (stage3.py __init__:
 * grad_partitions_flat_buffer on self.device, the CPU with offload_optimizer). Ψ is padded
 * to a multiple of 2N elements (the flat buffer's alignment). */
#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <memsim/deepspeed.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <string.h>

#include "testutil.h"

/* facebook/opt-125m's published parameter count (test_distributed.c) */
#define PSI 125239296LL

static const MemsimBreakdown *state_of(const MemsimRankReport *r)
{
    for (guint i = 0; i < r->n_breakdowns; i++)
        if (strstr(r->breakdowns[i].name, "model state"))
            return &r->breakdowns[i];
    cr_assert_fail("no model-state breakdown");
    return NULL;
}

/* The report of `model` on `gpus` GPUs under the config `json` (extra settings as pairs). */
static MemsimReport *run_config(const char *model, const char *json, int gpus,
                                const char *const *settings)
{
    GError *error = NULL;
    MemsimDeepspeed *ds = memsim_deepspeed_parse(json, "test.json", &error);
    cr_assert(ds, "%s", error ? error->message : "?");
    MemsimRun run = memsim_run_defaults();
    char g[16];
    g_snprintf(g, sizeof g, "%d", gpus);
    cr_assert(memsim_run_set(&run, "gpus", g, &error));
    cr_assert(memsim_run_set(&run, "seq", "128", &error));
    for (int i = 0; settings && settings[i]; i += 2)
        cr_assert(memsim_run_set(&run, settings[i], settings[i + 1], &error), "%s", error->message);
    cr_assert(memsim_deepspeed_apply(ds, &run, &error), "%s", error ? error->message : "?");
    MemsimModel *m = memsim_model_load(model, &error);
    cr_assert(m);
    MemsimTrace *t = memsim_generate(m, &run, &error);
    cr_assert(t, "%s", error ? error->message : "?");
    MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
    cr_assert(rep, "%s", error ? error->message : "?");
    memsim_trace_free(t);
    memsim_model_free(m);
    memsim_run_clear(&run);
    memsim_deepspeed_free(ds);
    return rep;
}

/* The largest parameter of OPT-125m: the token embedding, vocab_size × hidden (50272 × 768;
 * its config.json), which the LM head shares. */
#define LARGEST (50272LL * 768)

Test(deepspeed, zero_closed_forms_with_and_without_offload, .timeout = 300)
{
    const int Ns[] = {2, 4};
    for (gsize k = 0; k < G_N_ELEMENTS(Ns); k++) {
        int N = Ns[k];
        int64_t pad = (PSI + 2 * N - 1) / (2 * N) * (2 * N), part = pad / N;
        struct {
            const char *json;
            int64_t param, grad, opt, host;
        } want[] = {
            /* stage 1 (the ZeRO paper's P_os): 2Ψ + 2Ψ + 12Ψ/N */
            {"{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":1}}", 2 * pad, 2 * PSI,
             12 * part, 0},
            /* stage 1 with overlap_comm: its gradient hooks reduce at the accumulation
             * boundary as stage 2's do (stage_1_and_2.py create_reduce_and_remove_grad_hooks
             * for partition_gradients or overlap_comm): the owned 2Ψ/N stay, copied into
             * grads_in_partition */
            {"{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":1,"
             "\"overlap_comm\":true}}",
             2 * pad, 2 * part, 12 * part, 0},
            /* stage 2: estimate_zero2 2Ψ + 18Ψ/N: 2Ψ/N bf16 grads, 12Ψ/N fp32 params and Adam
             * (the 4Ψ/N fp32 grads are the step's own, checked below) */
            {"{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":2}}", 2 * pad, 2 * part,
             12 * part, 0},
            /* stage 2 + ZeRO-Offload: GPU 2Ψ (+ temp_grad_buffer_for_gpu_offload, the largest
             * parameter in bf16, stage_1_and_2.py __init__); host 16Ψ/N (+ the host staging
             * buffer temp_grad_buffer_for_cpu_offload, the largest parameter in bf16) */
            {"{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":2,"
             "\"offload_optimizer\":{\"device\":\"cpu\",\"pin_memory\":true}}}",
             2 * pad, 2 * LARGEST, 0, 16 * part + 2 * LARGEST},
            /* stage 1 + offload: the same */
            {"{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":1,"
             "\"offload_optimizer\":{\"device\":\"cpu\"}}}",
             2 * pad, 2 * PSI + 2 * LARGEST, 0, 16 * part + 2 * LARGEST},
            /* stage 3 (no persistent parameters): 18Ψ/N = 2 + 2 + 12 */
            {"{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":3,"
             "\"stage3_param_persistence_threshold\":0}}",
             2 * part, 2 * part, 12 * part, 0},
            /* stage 3 + offload_optimizer: GPU 2Ψ/N; host 16Ψ/N + the 2Ψ/N gradient partition,
             * and at its most the bf16 conversion of the updated fp32 partition on its way
             * back to the GPU (2Ψ/N; stage3.py _reassign_or_swap_out_partitioned_parameters
             * copy_s host fp32 into the GPU's bf16, and a blocking copy converts on the CPU:
             * aten/src/ATen/native/cuda/Copy.cu copy_kernel_cuda) */
            {"{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":3,"
             "\"stage3_param_persistence_threshold\":0,"
             "\"offload_optimizer\":{\"device\":\"cpu\"}}}",
             2 * part, 0, 0, 18 * part + 2 * part},
            /* stage 3 + offload_param and offload_optimizer: GPU nothing at the step; host
             * 18Ψ/N + the 2Ψ/N gradient partition */
            {"{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":3,"
             "\"stage3_param_persistence_threshold\":0,"
             "\"offload_optimizer\":{\"device\":\"cpu\"},\"offload_param\":{\"device\":\"cpu\"}}}",
             0, 0, 0, 20 * part},
        };
        for (gsize i = 0; i < G_N_ELEMENTS(want); i++) {
            MemsimReport *rep = run_config("opt-125m", want[i].json, N, NULL);
            cr_assert_eq(rep->n_ranks, 1);
            cr_expect_eq(rep->ranks[0].multiplicity, (uint32_t)N);
            const MemsimBreakdown *b = state_of(&rep->ranks[0]);
            cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], want[i].param,
                         "#%zu N=%d params %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT, i, N,
                         b->requested[MEMSIM_CAT_PARAMETER], want[i].param);
            cr_expect_eq(b->requested[MEMSIM_CAT_GRADIENT], want[i].grad,
                         "#%zu N=%d grads %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT, i, N,
                         b->requested[MEMSIM_CAT_GRADIENT], want[i].grad);
            cr_expect_eq(b->requested[MEMSIM_CAT_OPTIMIZER_STATE], want[i].opt,
                         "#%zu N=%d optim %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT, i, N,
                         b->requested[MEMSIM_CAT_OPTIMIZER_STATE], want[i].opt);
            cr_expect_eq((int64_t)rep->ranks[0].host_peak, want[i].host,
                         "#%zu N=%d host %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT, i, N,
                         (int64_t)rep->ranks[0].host_peak, want[i].host);
            /* without offload the step holds the 4Ψ/N fp32 gradient (estimate_zero2's
             * 4_grads_32bit) beside the state */
            if (want[i].opt)
                cr_expect_geq(b->requested[MEMSIM_CAT_TEMPORARY], 4 * part, "#%zu N=%d", i, N);
            memsim_report_free(rep);
        }
    }
}

/* Gradient accumulation with ZeRO-Offload: each owned gradient accumulates in a host buffer
 * of the parameter dtype (stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu): 2Ψ/N more
 * on the host. */
Test(deepspeed, offload_accumulation_host_buffer, .timeout = 300)
{
    int N = 2;
    int64_t part = (PSI + 2 * N - 1) / (2 * N) * (2 * N) / N;
    MemsimReport *rep = run_config(
        "opt-125m",
        "{\"bf16\":{\"enabled\":true},\"gradient_accumulation_steps\":2,"
        "\"train_micro_batch_size_per_gpu\":1,"
        "\"zero_optimization\":{\"stage\":2,\"offload_optimizer\":{\"device\":\"cpu\"}}}",
        N, NULL);
    cr_expect_eq((int64_t)rep->ranks[0].host_peak, 18 * part + 2 * LARGEST);
    memsim_report_free(rep);
}

/* ZeRO-3's persistent parameters (parameter_offload.py mark_persistent_parameters: numel ≤
 * stage3_param_persistence_threshold stay gathered, whole, on every rank). In OPT-125m
 * (its modeling code; hidden 768, ffn 3072, 12 layers) those of at most 1e5 elements are, per
 * layer, the q, k, v, out_proj and fc2 biases (5 × 768), fc1's bias (3072) and the two layer
 * norms' weights and biases (4 × 768), and the final layer norm's two (2 × 768); the position
 * embedding (2050 × 768) is larger. At the step they are the parameters beside the 2Ψ/N
 * partitions. */
Test(deepspeed, zero3_persistence_threshold, .timeout = 300)
{
    int N = 2;
    int64_t part = (PSI + 2 * N - 1) / (2 * N) * (2 * N) / N;
    int64_t persistent = 12 * (9 * 768 + 3072) + 2 * 768;
    MemsimReport *rep = run_config(
        "opt-125m", "{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":3}}", N, NULL);
    const MemsimBreakdown *b = state_of(&rep->ranks[0]);
    cr_expect_eq(b->requested[MEMSIM_CAT_PARAMETER], 2 * part + 2 * persistent,
                 "%" G_GINT64_FORMAT " want %" G_GINT64_FORMAT, b->requested[MEMSIM_CAT_PARAMETER],
                 2 * part + 2 * persistent);
    memsim_report_free(rep);
}

/* Hugging Face's "auto" (integrations/deepspeed.py trainer_config_finalize): reduce_bucket_size
 * becomes hidden², stage3_prefetch_bucket_size 0.9·hidden², the persistence threshold
 * 10·hidden; the batch and precision come from the run. The auto config and the same config
 * with those numbers written out give the same run. */
Test(deepspeed, auto_is_what_the_trainer_fills_in, .timeout = 300)
{
    const char *autoc =
        "{\"bf16\":{\"enabled\":\"auto\"},\"fp16\":{\"enabled\":\"auto\"},"
        "\"train_micro_batch_size_per_gpu\":\"auto\",\"gradient_accumulation_steps\":\"auto\","
        "\"train_batch_size\":\"auto\",\"gradient_clipping\":\"auto\","
        "\"zero_optimization\":{\"stage\":3,\"reduce_bucket_size\":\"auto\","
        "\"stage3_prefetch_bucket_size\":\"auto\",\"stage3_param_persistence_threshold\":\"auto\"}"
        "}";
    const char *numbers =
        "{\"bf16\":{\"enabled\":true},\"train_micro_batch_size_per_gpu\":2,"
        "\"gradient_accumulation_steps\":2,\"train_batch_size\":8,"
        "\"zero_optimization\":{\"stage\":3,\"reduce_bucket_size\":589824,"
        "\"stage3_prefetch_bucket_size\":530841,\"stage3_param_persistence_threshold\":7680}}";
    const char *settings[] = {"batch", "2", "grad-accum", "2", NULL};
    MemsimReport *a = run_config("opt-125m", autoc, 2, settings);
    MemsimReport *b = run_config("opt-125m", numbers, 2, NULL);
    cr_expect_eq(a->ranks[0].stats.allocated.peak, b->ranks[0].stats.allocated.peak);
    cr_expect_eq(a->ranks[0].stats.reserved.peak, b->ranks[0].stats.reserved.peak);
    cr_expect_eq(a->ranks[0].n_events, b->ranks[0].n_events);
    memsim_report_free(a);
    memsim_report_free(b);
}

/* The docs' example configs (tests/data/deepspeed/, written after DeepSpeed's and
 * Transformers' documentation) run through the command. */
Test(deepspeed, example_configs_run, .timeout = 300)
{
    struct {
        const char *file;
        const char *extra[6];
        const char *expect; /* on the run line */
    } cases[] = {
        {"zero2-offload.json", {NULL}, "offload_optimizer cpu (pinned)"},
        {"zero3-offload.json", {"--gpus", "4", NULL}, "offload_param cpu (pinned)"},
        {"hf-trainer-zero3-auto.json", {"--gpus", "2", "--batch", "2", NULL}, "prefetch auto"},
        {"hf-trainer-zero2-auto.json",
         {"--gpus", "2", "--precision", "fp16-mixed", NULL},
         "fp16-mixed"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *rel = g_strconcat("deepspeed/", cases[i].file, NULL);
        g_autofree char *path = tu_test_data(rel);
        GPtrArray *a = g_ptr_array_new();
        const char *fixed[] = {"estimate",           "--model", "opt-125m",  "--seq", "128",
                               "--deepspeed-config", path,      "--gpu-mem", "80GiB"};
        for (gsize k = 0; k < G_N_ELEMENTS(fixed); k++)
            g_ptr_array_add(a, (gpointer)fixed[k]);
        for (int k = 0; cases[i].extra[k]; k++)
            g_ptr_array_add(a, (gpointer)cases[i].extra[k]);
        g_ptr_array_add(a, NULL);
        char *out = NULL, *err = NULL;
        int rc = tu_run_memsim((const char *const *)a->pdata, &out, &err);
        cr_expect_eq(rc, 0, "%s: rc %d: %s", cases[i].file, rc, err);
        cr_expect(strstr(out, cases[i].expect), "%s: %s", cases[i].file, out);
        if (strstr(cases[i].file, "offload"))
            cr_expect(strstr(out, "host memory (offloaded state)"), "%s", cases[i].file);
        g_free(out);
        g_free(err);
        g_ptr_array_unref(a);
    }
}

static int run_text(const char *json, const char *const *extra, char **err)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *path = g_build_filename(dir, "ds_config.json", NULL);
    cr_assert(g_file_set_contents(path, json, -1, NULL));
    GPtrArray *a = g_ptr_array_new();
    const char *fixed[] = {"estimate",           "--model", "opt-125m", "--seq", "128",
                           "--deepspeed-config", path};
    for (gsize k = 0; k < G_N_ELEMENTS(fixed); k++)
        g_ptr_array_add(a, (gpointer)fixed[k]);
    for (int k = 0; extra && extra[k]; k++)
        g_ptr_array_add(a, (gpointer)extra[k]);
    g_ptr_array_add(a, NULL);
    char *out = NULL;
    int rc = tu_run_memsim((const char *const *)a->pdata, &out, err);
    g_free(out);
    g_ptr_array_unref(a);
    g_unlink(path);
    g_rmdir(dir);
    return rc;
}

/* Keys memsim does not know: one warning line naming them all; the run goes on. */
Test(deepspeed, unknown_keys_one_warning, .timeout = 120)
{
    char *err = NULL;
    int rc = run_text("{\"zero_optimization\":{\"stage\":2,\"my_bucket\":3},\"steps_per_print\":"
                      "10,\"flops_profiler\":{\"enabled\":false},\"frobnicate\":true}",
                      (const char *[]){"--gpus", "2", NULL}, &err);
    cr_expect_eq(rc, 0, "%s", err);
    int lines = 0;
    char **l = g_strsplit(err, "\n", -1);
    for (char **p = l; *p; p++) {
        if (strstr(*p, "warning") && strstr(*p, "does not know")) {
            lines++;
            cr_expect(strstr(*p, "zero_optimization.my_bucket") && strstr(*p, "frobnicate"), "%s",
                      *p);
            cr_expect(!strstr(*p, "steps_per_print"), "%s", *p);
        }
    }
    g_strfreev(l);
    cr_expect_eq(lines, 1, "%s", err);
    g_free(err);
}

/* Contradictions and what is not modelled: exit 2, naming the keys. */
Test(deepspeed, refusals_exit_2_naming_the_keys, .timeout = 120)
{
    struct {
        const char *json;
        const char *extra[5];
        const char *names[3];
    } cases[] = {
        {"{\"fp16\":{\"enabled\":true},\"bf16\":{\"enabled\":true},\"zero_optimization\":{"
         "\"stage\":2}}",
         {NULL},
         {"fp16.enabled", "bf16.enabled"}},
        {"{\"zero_optimization\":{\"stage\":2,\"offload_param\":{\"device\":\"cpu\"}}}",
         {NULL},
         {"offload_param", "stage"}},
        {"{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":4,"
         "\"gradient_accumulation_steps\":2,\"zero_optimization\":{\"stage\":1}}",
         {"--gpus", "8", NULL},
         {"train_batch_size", "train_micro_batch_size_per_gpu"}},
        {"{\"train_batch_size\":30,\"train_micro_batch_size_per_gpu\":4,"
         "\"gradient_accumulation_steps\":2,\"zero_optimization\":{\"stage\":1}}",
         {NULL},
         {"train_batch_size", "gradient_accumulation_steps"}},
        {"{\"train_micro_batch_size_per_gpu\":4,\"zero_optimization\":{\"stage\":2}}",
         {"--batch", "2", NULL},
         {"--batch", "deepspeed-config"}},
        {"{\"zero_optimization\":{\"stage\":3}}", {"--method", "zero2", NULL}, {"method"}},
        {"{\"zero_optimization\":{\"stage\":3,\"offload_param\":{\"device\":\"nvme\"}}}",
         {NULL},
         {"offload_param.device", "nvme"}},
        {"{\"zero_optimization\":{\"stage\":3,\"zero_quantized_weights\":true}}",
         {NULL},
         {"zero_quantized_weights"}},
        {"{\"zero_optimization\":{\"stage\":3,\"zero_hpz_partition_size\":8}}",
         {NULL},
         {"zero_hpz_partition_size"}},
        {"{\"zero_optimization\":{\"stage\":0}}", {NULL}, {"stage"}},
        {"{\"zero_optimization\":{\"stage\":2},\"optimizer\":{\"type\":\"Lamb\"}}",
         {NULL},
         {"optimizer.type", "Lamb"}},
        {"{\"zero_optimization\":{\"stage\":2,\"sub_group_size\":\"auto\"}}",
         {NULL},
         {"sub_group_size", "auto"}},
        {"{\"zero_optimization\":{\"stage\":2},\"activation_checkpointing\":"
         "{\"partition_activations\":true}}",
         {NULL},
         {"partition_activations"}},
        {"{\"zero_optimization\":{\"stage\":2},\"bf16\":{\"enabled\":true},"
         "\"communication_data_type\":\"fp32\"}",
         {NULL},
         {"communication_data_type"}},
        {"{\"zero_optimization\":{\"stage\":3,\"offload_optimizer\":{\"device\":\"cpu\","
         "\"ratio\":0.3}}}",
         {NULL},
         {"ratio"}},
        {"{\"zero_optimization\":{\"stage\":2,\"offload_optimizer\":{\"device\":\"cpu\","
         "\"ratio\":0.3}}}",
         {NULL},
         {"ratio", "stage"}},
        {"{\"zero_optimization\":{\"stage\":2", {NULL}, {"not JSON"}},
        {"[1, 2]", {NULL}, {"JSON object"}},
        {"{\"zero_optimization\":3}", {NULL}, {"zero_optimization", "object"}},
        {"{\"zero_optimization\":{\"stage\":2.5}}", {NULL}, {"zero_optimization.stage", "integer"}},
        {"{\"zero_optimization\":{\"stage\":2,\"overlap_comm\":\"yes\"}}",
         {NULL},
         {"overlap_comm", "true or false"}},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        char *err = NULL;
        int rc = run_text(cases[i].json, cases[i].extra, &err);
        cr_expect_eq(rc, 2, "#%zu rc %d: %s", i, rc, err);
        for (int k = 0; cases[i].names[k]; k++)
            cr_expect(strstr(err, cases[i].names[k]), "#%zu: '%s' not in: %s", i, cases[i].names[k],
                      err);
        cr_expect(!strstr(err, "CRITICAL") && !strstr(err, "Segmentation"), "#%zu: %s", i, err);
        g_free(err);
    }
}

/* The plan keeps the config's stage: --methods without it is refused. */
Test(deepspeed, plan_keeps_the_stage, .timeout = 120)
{
    g_autofree char *path = tu_test_data("deepspeed/hf-trainer-zero2-auto.json");
    char *out = NULL, *err = NULL;
    const char *argv[] = {"plan", "--model",   "opt-125m",   "--gpus",
                          "2",    "--seq",     "128",        "--deepspeed-config",
                          path,   "--methods", "zero3,fsdp", NULL};
    cr_expect_eq(tu_run_memsim(argv, &out, &err), 2, "%s", err);
    cr_expect(strstr(err, "methods") && strstr(err, "stage 2"), "%s", err);
    g_free(out);
    g_free(err);
}

/* The plan keeps the config; when nothing fits on the GPUs it runs the config with
 * offload_optimizer to the CPU, and its recommendation's command reproduces the row. */
Test(deepspeed, plan_offload_recheck_reproduces_the_row, .timeout = 600)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *path = g_build_filename(dir, "ds_config.json", NULL);
    cr_assert(g_file_set_contents(
        path,
        "{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":2,\"overlap_comm\":true},"
        "\"train_micro_batch_size_per_gpu\":1,\"gradient_accumulation_steps\":4}",
        -1, NULL));
    char *out = NULL, *err = NULL;
    const char *argv[] = {"plan",  "--model",   "opt-2.7b", "--gpus", "2",
                          "--gpu", "v100-16gb", "--seq",    "512",    "--deepspeed-config",
                          path,    "--json",    NULL};
    int rc = tu_run_memsim(argv, &out, &err);
    cr_assert_eq(rc, 0, "%s", err);
    g_autoptr(JsonParser) p = json_parser_new();
    cr_assert(json_parser_load_from_data(p, out, -1, NULL));
    JsonObject *root = json_node_get_object(json_parser_get_root(p));
    JsonObject *rec = json_object_get_object_member(root, "recommended");
    cr_assert(rec);
    cr_expect(json_object_get_boolean_member(rec, "offload"));
    const char *cmd = json_object_get_string_member(rec, "command");
    cr_expect(strstr(cmd, "--deepspeed-set zero_optimization.offload_optimizer.device=cpu"), "%s",
              cmd);
    int64_t peak = json_object_get_int_member(rec, "peak_bytes");
    int64_t host = json_object_get_int_member(rec, "host_bytes");
    /* the command, with --json, run as printed */
    g_autofree char *full = g_strconcat(cmd, " --json", NULL);
    char **words = NULL;
    cr_assert(g_shell_parse_argv(full, NULL, &words, NULL));
    char *o2 = NULL, *e2 = NULL;
    rc = tu_run_memsim((const char *const *)words + 1, &o2, &e2);
    cr_assert_eq(rc, 0, "%s: %s", cmd, e2);
    g_autoptr(JsonParser) p2 = json_parser_new();
    cr_assert(json_parser_load_from_data(p2, o2, -1, NULL));
    JsonArray *ranks =
        json_object_get_array_member(json_node_get_object(json_parser_get_root(p2)), "ranks");
    JsonObject *r0 = json_array_get_object_element(ranks, 0);
    cr_expect_eq(json_object_get_int_member(r0, "device_total"), peak, "%s", o2);
    cr_expect_eq(json_object_get_int_member(r0, "host_peak"), host);
    g_strfreev(words);
    g_free(out);
    g_free(err);
    g_free(o2);
    g_free(e2);
    g_unlink(path);
    g_rmdir(dir);
}

/* ZeRO-3's first step records the module trace: nothing is prefetched and every layer is
 * released after its forward (partitioned_param_coordinator.py: prefetch and the reuse rule
 * need a complete trace). With stage3_prefetch_bucket_size 0 and stage3_max_reuse_distance 0
 * the second step runs the same way, so its forward peaks as the first's plus Adam's moments
 * (made at the first step); with the defaults
 * (50M-element prefetch, 1e9 reuse distance) the second step's forward holds more gathered
 * layers and peaks higher. */
Test(deepspeed, zero3_trace_prefetch_and_reuse, .timeout = 300)
{
    const char *none = "{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":3,"
                       "\"stage3_prefetch_bucket_size\":0,\"stage3_max_reuse_distance\":0}}";
    const char *dflt = "{\"bf16\":{\"enabled\":true},\"zero_optimization\":{\"stage\":3}}";
    MemsimReport *a = run_config("opt-125m", none, 2, NULL);
    MemsimReport *b = run_config("opt-125m", dflt, 2, NULL);
    cr_assert_geq(a->ranks[0].n_steps, 2);
    cr_assert_geq(b->ranks[0].n_steps, 2);
    const MemsimStepPeaks *a1 = &a->ranks[0].steps[0], *a2 = &a->ranks[0].steps[1];
    const MemsimStepPeaks *b1 = &b->ranks[0].steps[0], *b2 = &b->ranks[0].steps[1];
    /* the same program but for Adam's two moments, made at the first step (8Ψ/N), and the
     * cuBLAS workspace of the backward thread's handle, made at its first GEMM (PyTorch's
     * CublasHandlePool.cpp: one per handle and stream; ":4096:2:16:8" = 8,519,680 bytes
     * before Hopper) */
    int64_t part = (PSI + 3) / 4 * 4 / 2;
    int64_t ws = 4096LL * 1024 * 2 + 16LL * 1024 * 8;
    cr_expect_eq(a2->phase_peak_allocated[MEMSIM_PHASE_FORWARD] -
                     a1->phase_peak_allocated[MEMSIM_PHASE_FORWARD],
                 8 * part + ws, "%" G_GINT64_FORMAT,
                 a2->phase_peak_allocated[MEMSIM_PHASE_FORWARD] -
                     a1->phase_peak_allocated[MEMSIM_PHASE_FORWARD]);
    cr_expect_eq(a1->phase_peak_allocated[MEMSIM_PHASE_FORWARD],
                 b1->phase_peak_allocated[MEMSIM_PHASE_FORWARD], "the first steps are the same");
    cr_expect_gt(b2->phase_peak_allocated[MEMSIM_PHASE_FORWARD],
                 a2->phase_peak_allocated[MEMSIM_PHASE_FORWARD]);
    memsim_report_free(a);
    memsim_report_free(b);
}

/* `memsim gen` takes a DeepSpeed config and a Megatron launch as estimate does: the trace it
 * writes replays to the estimate's own peak (the same program, written out). */
static int64_t json_peak(const char *out)
{
    const char *k = strstr(out ? out : "", "\"peak_allocated\"");
    cr_assert(k, "no peak_allocated in %s", out);
    return g_ascii_strtoll(strchr(k, ':') + 1, NULL, 10);
}

Test(deepspeed, gen_takes_the_config_and_the_launch, .timeout = 300)
{
    g_autofree char *ds = tu_test_data("deepspeed/hf-trainer-zero2-auto.json");
    /* a small launch: the sanitised build runs every step of it */
    g_autofree char *launch = tu_test_data("megatron/run.txt");
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *trace = g_build_filename(dir, "run.mst", NULL);
    const char *src[][8] = {
        {"--model", "opt-125m", "--gpus", "2", "--seq", "128", "--deepspeed-config", ds},
        {"--megatron-args", launch, NULL},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(src); i++) {
        GPtrArray *gen = g_ptr_array_new(), *est = g_ptr_array_new();
        g_ptr_array_add(gen, "gen");
        g_ptr_array_add(est, "estimate");
        for (int k = 0; k < 8 && src[i][k]; k++) {
            g_ptr_array_add(gen, (gpointer)src[i][k]);
            g_ptr_array_add(est, (gpointer)src[i][k]);
        }
        g_ptr_array_add(gen, "-o");
        g_ptr_array_add(gen, trace);
        g_ptr_array_add(gen, NULL);
        g_ptr_array_add(est, "--alloc-conf");
        g_ptr_array_add(est, "expandable_segments:False");
        g_ptr_array_add(est, "--json");
        g_ptr_array_add(est, NULL);
        char *out = NULL, *err = NULL;
        cr_assert_eq(tu_run_memsim((const char *const *)gen->pdata, &out, &err), 0, "%s", err);
        g_free(out);
        g_free(err);
        cr_assert_eq(tu_run_memsim((const char *const *)est->pdata, &out, &err), 0, "%s", err);
        int64_t want = json_peak(out);
        g_free(out);
        g_free(err);
        const char *rp[] = {"replay", trace, "--json", NULL};
        cr_assert_eq(tu_run_memsim(rp, &out, &err), 0, "%s", err);
        cr_expect_eq(json_peak(out), want, "%s: the written trace replays to %" G_GINT64_FORMAT
                     ", the estimate %" G_GINT64_FORMAT, src[i][0], json_peak(out), want);
        g_free(out);
        g_free(err);
        g_ptr_array_unref(gen);
        g_ptr_array_unref(est);
    }
}
