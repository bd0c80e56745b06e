/* The command: exit statuses, --help, and the JSON shape others build on. */
#include <criterion/criterion.h>
#include <json-glib/json-glib.h>
#include <string.h>

#include "testutil.h"

static JsonObject *parse_json(const char *text, JsonParser **keep)
{
    GError *error = NULL;
    JsonParser *p = json_parser_new();
    cr_assert(json_parser_load_from_data(p, text, -1, &error), "bad JSON: %s\n%s",
              error ? error->message : "?", text);
    *keep = p;
    return json_node_get_object(json_parser_get_root(p));
}

Test(cli, help_and_usage)
{
    const char *h[] = {"--help", NULL};
    g_autofree char *out = NULL;
    cr_expect_eq(tu_run_memsim(h, &out, NULL), 0);
    cr_expect(strstr(out, "replay") && strstr(out, "convert"));
    const char *rh[] = {"replay", "--help", NULL};
    g_autofree char *out2 = NULL;
    cr_expect_eq(tu_run_memsim(rh, &out2, NULL), 0);
    cr_expect(strstr(out2, "--verify") && strstr(out2, "--alloc-conf") && strstr(out2, "--json"));
    const char *bad[] = {"replay", NULL};
    cr_expect_eq(tu_run_memsim(bad, NULL, NULL), 2, "missing argument is a usage error");
    const char *unk[] = {"frobnicate", NULL};
    cr_expect_eq(tu_run_memsim(unk, NULL, NULL), 2);
    const char *opt[] = {"replay", "--no-such-flag", "x", NULL};
    cr_expect_eq(tu_run_memsim(opt, NULL, NULL), 2);
    const char *missing[] = {"replay", "/nonexistent/trace.mst", NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(tu_run_memsim(missing, NULL, &err), 2);
    cr_expect(strstr(err, "/nonexistent/trace.mst"), "names the file: %s", err);
    const char *badalloc[] = {"replay", "--allocator", "nosuch", "x.txt", NULL};
    cr_expect_eq(tu_run_memsim(badalloc, NULL, NULL), 2);
    const char *ahelp[] = {"replay", "--allocator", "help", NULL};
    g_autofree char *out3 = NULL;
    cr_expect_eq(tu_run_memsim(ahelp, &out3, NULL), 0);
    cr_expect(strstr(out3, "torch") && strstr(out3, "exact"), "%s", out3);
}

/* The JSON of replay --verify on a real snapshot: the names of the shape. */
Test(cli, replay_verify_json_shape)
{
    g_autofree char *path = tu_shared_path_or_skip(
        "torch-snapshots/shreyansh26__MLSys-Experiments__profile_grad.pkl");
    const char *argv[] = {"replay", path, "--verify", "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    JsonParser *p;
    JsonObject *root = parse_json(out, &p);
    JsonArray *ranks = json_object_get_array_member(root, "ranks");
    cr_assert_eq(json_array_get_length(ranks), 1);
    JsonObject *r = json_array_get_object_element(ranks, 0);
    const char *names[] = {"rank", "peak_allocated", "peak_reserved", "peak_active",
                           "peak_requested", "final_allocated", "final_reserved", "n_events",
                           "oom", "verify"};
    for (gsize i = 0; i < G_N_ELEMENTS(names); i++)
        cr_expect(json_object_has_member(r, names[i]), "missing %s", names[i]);
    cr_expect_eq(json_object_get_int_member(r, "rank"), 0);
    /* Python's pickle module says: 4439670784 bytes reserved in the segments at the end. */
    cr_expect_eq(json_object_get_int_member(r, "final_reserved"), 4439670784);
    cr_expect_eq(json_object_get_int_member(r, "final_allocated"), 3234779136);
    cr_expect(json_object_get_null_member(r, "oom"));
    JsonObject *v = json_object_get_object_member(r, "verify");
    cr_expect_eq(json_object_get_int_member(v, "mismatches"), 0);
    cr_expect_gt(json_object_get_int_member(v, "checked"), 12);
    cr_expect(json_object_get_null_member(v, "first_mismatch"));
    g_object_unref(p);
}

/* A simulated OOM under --gpu-mem is "does not fit": exit 1, and the JSON says where. */
Test(cli, replay_gpu_mem_oom)
{
    g_autofree char *path = tu_shared_path_or_skip(
        "torch-snapshots/shreyansh26__MLSys-Experiments__profile_grad.pkl");
    const char *argv[] = {"replay", path, "--gpu-mem", "1GiB", "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    JsonParser *p;
    JsonObject *root = parse_json(out, &p);
    JsonObject *r =
        json_array_get_object_element(json_object_get_array_member(root, "ranks"), 0);
    JsonObject *oom = json_object_get_object_member(r, "oom");
    cr_assert(oom != NULL);
    cr_expect_gt(json_object_get_int_member(oom, "shortfall"), 0);
    cr_expect_leq(json_object_get_int_member(r, "peak_reserved"), 1073741824);
    g_object_unref(p);
}

/* --alloc-conf replays the same requests under other settings, beside the recorded run. */
Test(cli, replay_alloc_conf_side_by_side)
{
    g_autofree char *path = tu_shared_path_or_skip(
        "torch-snapshots/Nesta-gitU__discrete_diffusion__memory_snapshot.json.pickle");
    const char *argv[] = {"replay", path, "--alloc-conf", "expandable_segments:True", "--json",
                          NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    cr_assert_eq(rc, 0, "exit %d: %s", rc, err);
    JsonParser *p;
    JsonObject *root = parse_json(out, &p);
    cr_expect_str_eq(json_object_get_string_member(root, "alloc_conf"),
                     "expandable_segments:True");
    JsonObject *rec = json_object_get_object_member(root, "recorded_settings");
    cr_assert(rec != NULL);
    JsonObject *r =
        json_array_get_object_element(json_object_get_array_member(root, "ranks"), 0);
    JsonObject *r0 =
        json_array_get_object_element(json_object_get_array_member(rec, "ranks"), 0);
    /* Same requests: the same bytes requested at the peak whatever the allocator does. */
    cr_expect_eq(json_object_get_int_member(r, "peak_requested"),
                 json_object_get_int_member(r0, "peak_requested"));
    /* Expandable segments split every block exactly: no unsplit slack, so its peak
     * allocated cannot exceed the recorded allocator's. */
    cr_expect_leq(json_object_get_int_member(r, "peak_allocated"),
                 json_object_get_int_member(r0, "peak_allocated"));
    g_object_unref(p);
    const char *text[] = {"replay", path, "--alloc-conf", "expandable_segments:True", NULL};
    g_autofree char *out2 = NULL;
    cr_expect_eq(tu_run_memsim(text, &out2, NULL), 0);
    cr_expect(strstr(out2, "what-if"), "%s", out2);
}
