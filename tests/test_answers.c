/* Answers a new user checks by hand: each number here against a closed form computed in the
 * test, each refusal by its exit status and a message naming what was wrong. */
#include <criterion/criterion.h>
#include <json-glib/json-glib.h>
#include <math.h>
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

/* Runs memsim, expects exit 2 and a message on stderr holding every one of `words`
 * (NULL-terminated). */
static void expect_refused(const char *const *argv, const char *const *words)
{
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    g_autofree char *cmd = g_strjoinv(" ", (char **)argv);
    cr_expect_eq(rc, 2, "memsim %s: exit %d, expected 2; stderr: %s", cmd, rc, err);
    for (int i = 0; words[i]; i++)
        cr_expect(err && strstr(err, words[i]), "memsim %s: the message does not name '%s': %s",
                  cmd, words[i], err);
    cr_expect(!err || (!strstr(err, "Sanitizer") && !strstr(err, "runtime error")),
              "memsim %s: sanitizer report: %s", cmd, err);
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
