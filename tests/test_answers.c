/* Answers a new user checks by hand: each number here against a closed form computed in the
 * test, each refusal by its exit status and a message naming what was wrong. */
#include <criterion/criterion.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

/* Runs memsim with argv (NULL-terminated), expects exit `want`, returns the parsed JSON of
 * stdout (with --json in argv) or NULL. */
static JsonParser *run_json(const char *const *argv, int want)
{
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    cr_assert_eq(rc, want, "exit %d, expected %d: %s", rc, want, err);
    JsonParser *p = json_parser_new();
    GError *e = NULL;
    cr_assert(json_parser_load_from_data(p, out, -1, &e), "bad JSON: %s", e ? e->message : "");
    return p;
}

static JsonObject *rank0(JsonParser *p)
{
    JsonObject *root = json_node_get_object(json_parser_get_root(p));
    return json_array_get_object_element(json_object_get_array_member(root, "ranks"), 0);
}

static int64_t at_peak(JsonObject *r, const char *category)
{
    JsonObject *ap = json_object_get_object_member(r, "at_peak");
    return json_object_get_int_member(json_object_get_object_member(ap, "by_category"), category);
}

/* Runs memsim; NULL when it exits 2 with a message on stderr holding every one of `words`
 * (NULL-terminated) and no sanitizer report, else what is wrong (newly allocated). */
static char *not_refused(const char *const *argv, const char *const *words)
{
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    g_autofree char *cmd = g_strjoinv(" ", (char **)argv);
    if (rc != 2)
        return g_strdup_printf("memsim %s: exit %d, expected 2; stderr: %s", cmd, rc, err);
    for (int i = 0; words[i]; i++)
        if (!err || !strstr(err, words[i]))
            return g_strdup_printf("memsim %s: the message does not name '%s': %s", cmd,
                                   words[i], err);
    if (err && (strstr(err, "Sanitizer") || strstr(err, "runtime error")))
        return g_strdup_printf("memsim %s: sanitizer report: %s", cmd, err);
    return NULL;
}

static void expect_refused(const char *const *argv, const char *const *words)
{
    g_autofree char *why = not_refused(argv, words);
    cr_expect(!why, "%s", why);
}

#define ARGV(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The KV cache of generation: K and V of every layer for every token so far,
 * 2 · layers · kv_heads · head_dim · tokens · bytes (Llama-2-7B: 32 layers, 32 KV heads of
 * 128, bf16). At the prefill's peak it holds the prompt; when decoding dominates, the
 * prompt and the generated tokens, plus at most one layer's old K while its update runs. */
Test(answers, kv_cache_counted_once)
{
    const int64_t L = 32, nkv = 32, hd = 128, bytes = 2;
    const int64_t per_token = 2 * L * nkv * hd * bytes;
    JsonParser *p = run_json(ARGV("estimate", "--model", "llama-2-7b", "--inference", "--prompt",
                                  "4096", "--generate", "16", "--json"),
                             0);
    int64_t kv = at_peak(rank0(p), "kv_cache");
    cr_expect(kv >= per_token * 4096 && kv <= per_token * (4096 + 16),
              "prefill-bound: %" G_GINT64_FORMAT " bytes of cache, expected %" G_GINT64_FORMAT
              " to %" G_GINT64_FORMAT,
              kv, per_token * 4096, per_token * 4112);
    g_object_unref(p);
    p = run_json(ARGV("estimate", "--model", "llama-2-7b", "--inference", "--prompt", "16",
                      "--generate", "512", "--json"),
                 0);
    kv = at_peak(rank0(p), "kv_cache");
    int64_t lo = per_token * (16 + 511), hi = per_token * (16 + 512) + nkv * hd * bytes * 528;
    cr_expect(kv >= lo && kv <= hi,
              "decode-bound: %" G_GINT64_FORMAT " bytes, expected %" G_GINT64_FORMAT
              " to %" G_GINT64_FORMAT,
              kv, lo, hi);
    g_object_unref(p);
    /* Mistral-7B (8 KV heads of 128) with 4-bit weights at an 8k prompt: 1 GiB */
    p = run_json(ARGV("estimate", "--model", "mistral-7b", "--inference", "--weights", "4bit",
                      "--prompt", "8192", "--generate", "1", "--json"),
                 0);
    kv = at_peak(rank0(p), "kv_cache");
    int64_t m = 2 * 32 * 8 * 128 * 2;
    cr_expect(kv >= m * 8192 && kv <= m * 8193, "mistral: %" G_GINT64_FORMAT, kv);
    g_object_unref(p);
    /* without the cache nothing is cached: every token runs the whole sequence again */
    p = run_json(ARGV("estimate", "--model", "llama-2-7b", "--inference", "--prompt", "1024",
                      "--generate", "4", "--use-cache", "false", "--json"),
                 0);
    cr_expect_eq(at_peak(rank0(p), "kv_cache"), 0);
    g_object_unref(p);
}

/* Settings a run would ignore are refused, naming them (exit 2). */
Test(answers, ignored_settings_refused)
{
    static const struct {
        const char *argv[12];
        const char *word;
    } cases[] = {
        {{"estimate", "--model", "gpt2", "--seq", "128", "--gpu", "h300"}, "h300"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--weights", "4bit"}, "weights"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--prompt", "64"}, "prompt"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--generate", "64"}, "generate"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--sequence-parallel"},
         "sequence-parallel"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--microbatches", "4"}, "microbatches"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--gpu-mem", "0"}, "gpu-mem"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--gpu-mem", "h300"}, "gpu-mem"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--lora-rank", "8"}, "lora-rank"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--pp-schedule", "gpipe"},
         "pp-schedule"},
        {{"estimate", "--model", "gpt2", "--seq", "128", "--tp", "2"}, "gpus"},
        {{"estimate", "--model", "mistral-7b", "--inference", "--weights", "4bit", "--seq",
          "8192"},
         "--prompt"},
        {{"estimate", "--model", "gpt2", "--inference", "--checkpointing", "full"},
         "checkpointing"},
        {{"estimate", "--model", "gpt2", "--inference", "--optimizer", "sgd"}, "optimizer"},
        {{"gen", "--model", "gpt2", "--seq", "128", "--prompt", "5", "-o", "/dev/null"},
         "prompt"},
        {{"plan", "--model", "gpt2", "--seq", "128", "--efficiency", "nan"}, "efficiency"},
        {{"plan", "--model", "gpt2", "--seq", "128", "--efficiency", "inf"}, "efficiency"},
        {{"plan", "--model", "gpt2", "--seq", "128", "--efficiency", "0"}, "efficiency"},
        {{"plan", "--model", "gpt2", "--seq", "128", "--efficiency", "-1"}, "efficiency"},
        {{"plan", "--model", "gpt2", "--seq", "128", "--efficiency", "5"}, "efficiency"},
        {{"plan", "--model", "gpt2", "--seq", "128", "--network-gbs", "-1"}, "network-gbs"},
        {{"plan", "--model", "gpt2", "--seq", "128", "--gpu-mem", "0"}, "gpu-mem"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++)
        expect_refused(cases[i].argv, (const char *const[]){cases[i].word, NULL});
}

/* --gpu-mem takes a card's name: the bytes its profile gives, printed. */
Test(answers, gpu_mem_names_a_card)
{
    JsonParser *p = run_json(ARGV("estimate", "--model", "gpt2", "--seq", "128", "--gpu-mem",
                                  "h100-80gb", "--json"),
                             0);
    JsonObject *root = json_node_get_object(json_parser_get_root(p));
    /* nvidia-smi's total for an H100 SXM 80GB: 81559 MiB */
    cr_expect_eq(json_object_get_int_member(root, "gpu_mem"), (int64_t)81559 << 20);
    cr_expect_str_eq(json_object_get_string_member(root, "device"), "h100-80gb");
    cr_expect(!json_object_get_boolean_member(root, "device_assumed"));
    g_object_unref(p);
    const char *argv[] = {"estimate", "--model", "gpt2", "--seq", "128", "--gpu-mem", "H100-80GB",
                          NULL};
    g_autofree char *out = NULL;
    cr_expect_eq(tu_run_memsim(argv, &out, NULL), 0);
    cr_expect(strstr(out, "device:    h100-80gb") && strstr(out, "85520809984 bytes"), "%s", out);
}

/* Without --gpu-mem the --gpu profile (default a100-80gb, 80 GiB) is judged, and said to be
 * assumed. */
Test(answers, default_device_gives_a_verdict)
{
    JsonParser *p =
        run_json(ARGV("estimate", "--model", "gpt2", "--seq", "128", "--json"), 0);
    JsonObject *root = json_node_get_object(json_parser_get_root(p));
    cr_expect_eq(json_object_get_int_member(root, "gpu_mem"), (int64_t)80 << 30);
    cr_expect_str_eq(json_object_get_string_member(root, "device"), "a100-80gb");
    cr_expect(json_object_get_boolean_member(root, "device_assumed"));
    cr_expect(json_object_get_boolean_member(rank0(p), "fits"));
    g_object_unref(p);
    const char *argv[] = {"estimate", "--model", "gpt2", "--seq", "128", "--gpu", "v100-16gb",
                          NULL};
    g_autofree char *out = NULL;
    cr_expect_eq(tu_run_memsim(argv, &out, NULL), 0);
    cr_expect(strstr(out, "v100-16gb") && strstr(out, "assumed") && strstr(out, "FITS in"),
              "%s", out);
    /* Llama-2-7B full fine-tuning does not fit a 16 GB card: exit 1 without --gpu-mem */
    const char *big[] = {"estimate", "--model", "llama-2-7b", "--seq", "128", "--gpu", "v100-16gb",
                         NULL};
    cr_expect_eq(tu_run_memsim(big, NULL, NULL), 1);
}

/* GPT-2 has 1024 learned positions: with no --seq the run takes the model's context, and
 * says so. */
Test(answers, default_seq_is_the_models_context)
{
    const char *argv[] = {"estimate", "--model", "gpt2", NULL};
    g_autofree char *out = NULL, *err = NULL;
    cr_assert_eq(tu_run_memsim(argv, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "seq 1024 (the model's context)"), "%s", out);
    const char *given[] = {"estimate", "--model", "gpt2", "--seq", "2048", NULL};
    expect_refused(given, (const char *const[]){"max_position_embeddings", NULL});
}

/* Out of memory: the verdict names where (rank, step, op, phase, layer) and does not claim a
 * margin; the table's op column points to the same op. */
Test(answers, oom_says_where)
{
    const char *argv[] = {"estimate", "--model", "llama-2-7b", "--batch", "4", "--seq", "2048",
                          "--gpu-mem", "h100-80gb", NULL};
    g_autofree char *out = NULL, *err = NULL;
    cr_assert_eq(tu_run_memsim(argv, &out, &err), 1, "%s", err);
    cr_expect(!strstr(out, "margin"), "%s", out);
    const char *v = strstr(out, "DOES NOT FIT in 79.65 GiB: ran out of memory on rank 0 in step 1 "
                                "at op ");
    cr_assert(v, "%s", out);
    /* "at op NAME (PHASE, layer N)" in the verdict and "OOM at NAME (PHASE, N, stream)" in
     * the table */
    char name[96] = "", phase[32] = "";
    int layer = -2;
    cr_assert_eq(sscanf(strstr(v, "at op ") + 6, "%95s (%31[a-z], layer %d)", name, phase, &layer),
                 3, "%s", v);
    g_autofree char *col = g_strdup_printf("OOM at %s (%s, %d, ", name, phase, layer);
    cr_expect(strstr(out, col), "the table's op column is not '%s': %s", col, out);
    JsonParser *p = run_json(ARGV("estimate", "--model", "llama-2-7b", "--batch", "4", "--seq",
                                  "2048", "--gpu-mem", "h100-80gb", "--json"),
                             1);
    JsonObject *oom = json_object_get_object_member(rank0(p), "oom");
    cr_assert(oom);
    cr_expect_str_eq(json_object_get_string_member(oom, "op_name"), name);
    cr_expect_str_eq(json_object_get_string_member(oom, "phase"), phase);
    cr_expect_eq(json_object_get_int_member(oom, "layer"), layer);
    cr_expect_eq(json_object_get_int_member(oom, "step"), 1);
    g_object_unref(p);
}

/* Help text holds … and × whatever the locale: the command sets its locale (C.UTF-8 where
 * the environment's is plain C). */
Test(answers, help_prints_its_characters)
{
    const char *argv[] = {"env", "-u", "LANG", "-u", "LC_ALL", "-u", "LC_CTYPE",
                          g_getenv("MEMSIM_BIN"), "plan", "--help", NULL};
    g_autofree char *out = NULL;
    cr_assert_eq(tu_run(argv, NULL, &out, NULL), 0);
    cr_expect(strstr(out, "--gpus \xc3\x97 --gpu"), "× is not printed: %.300s", out);
    cr_expect(!strstr(out, "--gpus ? --gpu"), "%s", out);
}

/* The bad-settings table (tests/data/bad-settings.txt): every run flag and plan option with
 * values it must refuse — negative, zero, huge, NaN, wrong type, empty — and settings a run
 * would ignore. Each: exit 2, a message naming the setting, no sanitizer report. */
Test(answers, bad_settings_table, .timeout = 240)
{
    g_autofree char *path = tu_test_data("bad-settings.txt");
    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(path, &text, NULL, NULL), "%s", path);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    int n = 0;
    for (char **l = lines; *l; l++) {
        if (!**l || **l == '#')
            continue;
        g_auto(GStrv) f = g_strsplit(*l, "|", 3);
        cr_assert(f[0] && f[1] && f[2], "bad table line: %s", *l);
        g_auto(GStrv) args = g_strsplit(g_strstrip(f[1]), " ", -1);
        GPtrArray *argv = g_ptr_array_new();
        g_ptr_array_add(argv, g_strstrip(f[0]));
        for (char **a = args; *a; a++)
            g_ptr_array_add(argv, strcmp(*a, "''") == 0 ? "" : *a);
        g_ptr_array_add(argv, NULL);
        expect_refused((const char *const *)argv->pdata,
                       (const char *const[]){g_strstrip(f[2]), NULL});
        g_ptr_array_free(argv, TRUE);
        n++;
    }
    cr_expect_gt(n, 100, "the table has %d cases", n);
    /* the check itself fails where it should: a good setting, and a refusal naming another */
    g_autofree char *good = not_refused(ARGV("estimate", "--model", "gpt2", "--seq", "128"),
                                        (const char *const[]){"seq", NULL});
    cr_expect(good && strstr(good, "exit 0"), "a good run passed as refused: %s", good);
    g_autofree char *other = not_refused(ARGV("estimate", "--model", "gpt2", "--batch", "0"),
                                         (const char *const[]){"seq", NULL});
    cr_expect(other && strstr(other, "does not name 'seq'"), "%s", other);
}

/* Hostile inputs end quickly and small: exit 2 within 5 s of CPU and 500 MB (the children's
 * CPU time and largest resident set, getrusage). */
static void expect_bounded(const char *const *argv, const char *word)
{
    double c0 = tu_children_cpu_s();
    expect_refused(argv, (const char *const[]){word, NULL});
    double secs = tu_children_cpu_s() - c0, mib = tu_children_peak_mib();
    cr_expect(secs < tu_limit_s(), "%s %s: %.2f s of CPU", argv[0], argv[2], secs);
    cr_expect(mib < tu_limit_mib(), "%s %s: %.0f MiB resident", argv[0], argv[2], mib);
}

Test(answers, hostile_inputs_bounded, .timeout = 120)
{
    g_autofree char *dir = tu_tmpdir();
    /* 100,000 nested brackets in a config */
    g_autofree char *nested = g_build_filename(dir, "nested.json", NULL);
    GString *s = g_string_new(NULL);
    for (int i = 0; i < 100000; i++)
        g_string_append(s, "{\"a\":");
    g_string_append(s, "1");
    for (int i = 0; i < 100000; i++)
        g_string_append_c(s, '}');
    cr_assert(g_file_set_contents(nested, s->str, (gssize)s->len, NULL));
    g_string_free(s, TRUE);
    expect_bounded(ARGV("estimate", "--model", nested, "--seq", "128"), "nest");
    /* 10^9 layers */
    g_autofree char *layers = g_build_filename(dir, "layers.json", NULL);
    cr_assert(g_file_set_contents(
        layers,
        "{\"model_type\": \"llama\", \"hidden_size\": 4096, \"intermediate_size\": 11008, "
        "\"num_attention_heads\": 32, \"num_key_value_heads\": 32, \"num_hidden_layers\": "
        "1000000000, \"vocab_size\": 32000, \"max_position_embeddings\": 4096, "
        "\"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-5}",
        -1, NULL));
    expect_bounded(ARGV("estimate", "--model", layers, "--seq", "128"), "num_hidden_layers");
    /* a 20 MB pickle of Nones: PROTO 2, EMPTY_LIST, MARK, N × NONE, APPENDS, STOP */
    g_autofree char *nones = g_build_filename(dir, "nones.pickle", NULL);
    GByteArray *b = tu_none_flood_pickle(20u << 20, 0);
    cr_assert(g_file_set_contents(nones, (const char *)b->data, b->len, NULL));
    g_byte_array_free(b, TRUE);
    expect_bounded(ARGV("replay", nones), "nones.pickle");
}

/* A text trace that declares 20,000 ranks (a 700 KB header) replays within 5 s of CPU and 500 MB:
 * a rank nothing happens on costs little (it took 1.2 GB and 6 s). Under the sanitizers,
 * whose allocations cost 40 times more, 2,000 ranks within 20 s and 2 GB. */
Test(answers, many_declared_ranks_bounded, .timeout = 300)
{
    int n = tu_sanitized() ? 2000 : 20000;
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *path = g_build_filename(dir, "ranks.txt", NULL);
    GString *s = g_string_new("memsim-trace 1\nname \"many ranks\"\n");
    for (int r = 0; r < n; r++)
        g_string_append_printf(s, "rank %d device=%d multiplicity=1 streams=1\n", r, r);
    g_string_append(s, "@rank 0\nalloc t=1 size=512 stream=0 cat=other\n");
    cr_assert(g_file_set_contents(path, s->str, (gssize)s->len, NULL));
    g_string_free(s, TRUE);
    double c0 = tu_children_cpu_s();
    const char *argv[] = {"replay", path, "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    cr_expect_eq(tu_run_memsim(argv, &out, &err), 0, "%s", err);
    double secs = tu_children_cpu_s() - c0, mib = tu_children_peak_mib();
    cr_expect(secs < tu_limit_s(), "%.2f s of CPU", secs);
    cr_expect(mib < tu_limit_mib(), "%.0f MiB resident", mib);
    g_autofree char *last = g_strdup_printf("\"rank\" : %d", n - 1);
    cr_expect(out && strstr(out, last), "every rank reported");
}

/* The README's ZeRO-3 example: Llama-2-13B at batch 4 on 8 GPUs does not fit in 80 GiB, and
 * the command says so with exit status 1 — the model state alone is (2 + 2 + 12)Ψ/8 bytes
 * (Rajbhandari et al. 2020) = 24.2 GiB, and the gathered layers and activations of batch 4 ×
 * 2048 tokens fill the rest. */
Test(answers, zero3_13b_batch_4_does_not_fit)
{
    const char *argv[] = {"estimate", "--model", "llama-2-13b", "--gpus", "8", "--method", "zero3",
                          "--batch", "4", "--gpu-mem", "80GiB", NULL};
    g_autofree char *out = NULL, *err = NULL;
    cr_expect_eq(tu_run_memsim(argv, &out, &err), 1, "%s%s", out, err);
    cr_expect(out && strstr(out, "DOES NOT FIT in 80.00 GiB"), "%s", out);
}

/* An inconsistency found while replaying a text trace names the file given first, not only
 * the name the trace carries inside. */
Test(answers, trace_errors_name_the_file_given)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *path = g_build_filename(dir, "given.txt", NULL);
    cr_assert(g_file_set_contents(path,
                                  "memsim-trace 1\nname \"embedded.pickle\"\n"
                                  "rank 0 device=0 multiplicity=1 streams=1\n@rank 0\n"
                                  "alloc t=1 size=512 stream=0 cat=other\n"
                                  "alloc t=1 size=512 stream=0 cat=other\n",
                                  -1, NULL));
    const char *argv[] = {"replay", path, NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(tu_run_memsim(argv, NULL, &err), 2);
    g_autofree char *want = g_strdup_printf("memsim replay: %s: ", path);
    cr_expect(err && g_str_has_prefix(err, want), "the message does not start with the file: %s",
              err);
}

/* With expandable segments the report counts the mapped ranges as segments (a segment is one
 * contiguous mapped range, as snapshots list them): at least one while anything is mapped,
 * never more than the page mappings made. */
Test(answers, expandable_segments_counted)
{
    JsonParser *p = run_json(ARGV("estimate", "--model", "gpt2", "--batch", "2", "--seq", "512",
                                  "--alloc-conf", "expandable_segments:True", "--json"),
                             0);
    JsonObject *r = rank0(p);
    int64_t segs = json_object_get_int_member(r, "peak_segments");
    int64_t maps = json_object_get_int_member(r, "n_device_alloc");
    cr_expect(segs >= 1 && segs <= maps, "peak_segments %" G_GINT64_FORMAT ", %" G_GINT64_FORMAT
              " mappings", segs, maps);
    g_object_unref(p);
}
