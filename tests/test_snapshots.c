/* The torch policy against the 20 real PyTorch snapshots that carry a trace
 * (../shared/data/torch-snapshots, see its README), and against their allocator facts
 * shipped in tests/data/snapshots/ (made by tools/snapshot-fixture.sh, see the README
 * there), so that a checkout without ../shared runs every exactness test too.
 *
 * Every recorded allocator action must be reproduced: each alloc's address (hence its offset
 * in its segment), each segment_alloc, each segment_free in order, each segment_map/unmap
 * range, and the final reserved and allocated bytes.
 *
 * The golden figures below were read from the files with Python's own pickle module (a
 * restricted Unpickler refusing every global), independently of memsim:
 *   /usr/bin/python3: d = U(open(f, 'rb')).load(); count d['device_traces'][i][*]['action'];
 *   reserved = sum of segments' total_size, allocated = sum of allocated_size, per device.
 */
#include <criterion/criterion.h>
#include <string.h>
#include <memsim/formats.h>
#include <memsim/sim.h>

#include "testutil.h"

typedef struct {
    const char *file;
    unsigned n_devices;
    unsigned n_alloc, n_segment_alloc, n_segment_free, n_segment_map, n_segment_unmap;
    struct {
        unsigned device;
        uint64_t reserved, allocated;
    } dev[3];
} Golden;

static const Golden goldens[] = {
    {"Constructor-Sun__code_location__memory_snapshot.pickle", 3, 3025, 0, 0, 293, 6,
     {{0, 8541700096, 8094645248}, {1, 84202749952, 403507712}, {2, 21883781120, 20230674944}}},
    {"JasperSolt__EoR_NN__snapshot.pickle", 1, 1935, 7, 0, 0, 0, {{0, 134217728, 48760832}}},
    {"MAGMA27__assignment2-systems__memory_snapshot.pickle", 1, 1721, 0, 0, 0, 0,
     {{0, 14180941824, 1377753600}}},
    {"Maphsge4__select_n__snapshot@1f2f548.pickle", 1, 1497, 13, 0, 0, 0,
     {{0, 2776629248, 1875182080}}},
    {"MercuryB1__SQAttn__cuda_memory_snapshot.pickle", 1, 2912, 420, 420, 0, 0,
     {{0, 230686720, 215105536}}},
    {"Nesta-gitU__discrete_diffusion__memory_snapshot.json.pickle", 1, 576, 126, 6, 0, 0,
     {{0, 22571646976, 22536960512}}},
    {"Wedsonlin__assignment2-systems__results_medium_128_inference_memory_snapshot.pickle", 1,
     1280, 0, 0, 0, 0, {{0, 1763704832, 1703276544}}},
    {"Wedsonlin__assignment2-systems__results_medium_128_training_memory_snapshot.pickle", 1,
     6526, 0, 0, 0, 0, {{0, 7235174400, 6816891392}}},
    {"bcrafton__assignment2-systems__memory_snapshot.pickle", 1, 2162, 0, 0, 0, 0,
     {{0, 4238344192, 3072871424}}},
    {"cranberrii__ftcourse__memory_snapshot.pickle", 1, 3505, 152, 0, 0, 0,
     {{0, 6471811072, 2297283072}}},
    {"kkaitlyn111__cs336-a2-systems__memory_ctx128_forward.pickle", 1, 2058, 289, 0, 0, 0,
     {{0, 19667091456, 19498420224}}},
    {"kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle", 1, 6770, 494, 0, 0, 0,
     {{0, 61111009280, 54873829888}}},
    {"kkaitlyn111__cs336-a2-systems__memory_files_memory_ctx128_forward_mixed.pickle", 1, 2703,
     461, 0, 0, 0, {{0, 24245174272, 24018738176}}},
    {"kkaitlyn111__cs336-a2-systems__memory_files_memory_ctx512_fullstep_.pickle", 1, 6769, 589,
     790, 0, 0, {{0, 62830673920, 54798180864}}},
    {"kkaitlyn111__cs336-a2-systems__memory_small_forward.pickle", 1, 2998, 3, 0, 0, 0,
     {{0, 1107296256, 1043817472}}},
    {"notHanmin__assignment2-systems__memory_snapshot_forward.pickle", 1, 4138, 0, 0, 0, 0,
     {{0, 47234154496, 44607570432}}},
    {"shreyansh26__MLSys-Experiments__profile_grad.pkl", 1, 12, 7, 0, 0, 0,
     {{0, 4439670784, 3234779136}}},
    {"shreyansh26__MLSys-Experiments__profile_no_grad.pkl", 1, 12, 7, 0, 0, 0,
     {{0, 4439670784, 3234779136}}},
    {"silmont2000__assignment2-systems__mem_snapshot.pickle", 1, 36, 9, 0, 0, 0,
     {{0, 3781165056, 31719936}}},
    {"silmont2000__assignment2-systems__memory_forward_fp32_128.pickle", 1, 681, 0, 0, 0, 0,
     {{0, 610271232, 525286400}}},
};

/* The fixture's file: the snapshot's name with .mst for its .pickle/.pkl/.json.pickle. */
static char *fixture_path(const char *file)
{
    g_autofree char *base = g_strdup(file);
    const char *const ends[] = {".pickle", ".pkl", ".json"};
    for (gsize i = 0; i < G_N_ELEMENTS(ends); i++)
        if (g_str_has_suffix(base, ends[i]))
            base[strlen(base) - strlen(ends[i])] = '\0';
    g_autofree char *rel = g_strconcat("snapshots/", base, ".mst", NULL);
    return tu_test_data(rel);
}

/* `original`: the snapshot in ../shared (skipped where absent); else the shipped fixture. */
static void check_golden_from(const Golden *g, gboolean invariants, gboolean original)
{
    g_autofree char *rel = g_build_filename("torch-snapshots", g->file, NULL);
    g_autofree char *path = original ? tu_shared_path_or_skip(rel) : fixture_path(g->file);
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.verify = TRUE;
    o.check_invariants = invariants;
    GError *error = NULL;
    MemsimReport *rep = memsim_replay_path(path, &o, &error);
    cr_assert(rep != NULL, "%s: %s", g->file, error ? error->message : "?");
    cr_assert_eq(rep->n_ranks, g->n_devices, "%s: %u ranks, expected %u", g->file, rep->n_ranks,
                 g->n_devices);
    uint64_t checked = 0;
    for (unsigned i = 0; i < rep->n_ranks; i++) {
        const MemsimRankReport *r = &rep->ranks[i];
        cr_expect_eq(r->rank, g->dev[i].device);
        cr_expect_eq(r->verify_mismatches, 0, "%s device %u: %" G_GUINT64_FORMAT
                     " mismatches, first: %s",
                     g->file, r->rank, r->verify_mismatches, r->first_mismatch);
        cr_expect_eq((uint64_t)r->stats.reserved.current, g->dev[i].reserved,
                     "%s device %u: final reserved %" G_GINT64_FORMAT ", snapshot %" G_GUINT64_FORMAT,
                     g->file, r->rank, r->stats.reserved.current, g->dev[i].reserved);
        cr_expect_eq((uint64_t)r->stats.allocated.current, g->dev[i].allocated,
                     "%s device %u: final allocated %" G_GINT64_FORMAT ", snapshot %"
                     G_GUINT64_FORMAT,
                     g->file, r->rank, r->stats.allocated.current, g->dev[i].allocated);
        cr_expect(r->stats.allocated.peak <= r->stats.reserved.peak);
        cr_expect(r->stats.reserved.peak >= r->stats.reserved.current);
        checked += r->verify_checked;
    }
    /* One check per alloc address, per recorded driver action, plus the two final figures
     * per device: the verification really looked at every recorded event. */
    uint64_t want = g->n_alloc + g->n_segment_alloc + g->n_segment_free + g->n_segment_map +
                    g->n_segment_unmap + 2u * g->n_devices;
    cr_expect_eq(checked, want, "%s: %" G_GUINT64_FORMAT " checks, expected %" G_GUINT64_FORMAT,
                 g->file, checked, want);
    memsim_report_free(rep);
}

static void check_golden(const Golden *g, gboolean invariants)
{
    check_golden_from(g, invariants, FALSE);
}

#define GOLDEN_TEST(i, name)                                                                   \
    Test(snapshots, name, .timeout = 120)                                                      \
    {                                                                                          \
        check_golden_from(&goldens[i], FALSE, FALSE);                                          \
    }                                                                                          \
    Test(snapshots, name##_original, .timeout = 120)                                           \
    {                                                                                          \
        check_golden_from(&goldens[i], FALSE, TRUE);                                           \
    }

GOLDEN_TEST(0, constructor_sun_expandable_3gpu)
GOLDEN_TEST(1, jaspersolt)
GOLDEN_TEST(2, magma27)
GOLDEN_TEST(3, maphsge4)
GOLDEN_TEST(4, mercuryb1_empty_cache)
GOLDEN_TEST(5, nesta_oom)
GOLDEN_TEST(6, wedsonlin_inference)
GOLDEN_TEST(7, wedsonlin_training)
GOLDEN_TEST(8, bcrafton)
GOLDEN_TEST(9, cranberrii)
GOLDEN_TEST(10, kkaitlyn_ctx128_forward)
GOLDEN_TEST(11, kkaitlyn_ctx128_fullstep)
GOLDEN_TEST(12, kkaitlyn_ctx128_forward_mixed)
GOLDEN_TEST(13, kkaitlyn_ctx512_fullstep)
GOLDEN_TEST(14, kkaitlyn_small_forward)
GOLDEN_TEST(15, nothanmin)
GOLDEN_TEST(16, shreyansh_grad)
GOLDEN_TEST(17, shreyansh_no_grad)
GOLDEN_TEST(18, silmont_mem)
GOLDEN_TEST(19, silmont_forward)

/* The allocator's own invariant checker after every event, on a few varied traces. */
Test(snapshots, invariants_hold_throughout, .timeout = 300)
{
    check_golden(&goldens[5], TRUE);  /* from empty, OOM path, empty_cache */
    check_golden(&goldens[4], TRUE);  /* repeated empty_cache */
    check_golden(&goldens[1], TRUE);  /* mid-run start */
    check_golden(&goldens[0], TRUE);  /* expandable, 3 devices */
}

/* The recorded OOM of the Nesta-gitU trace is reported where it happened. */
Test(snapshots, recorded_oom_is_reported)
{
    g_autofree char *path = fixture_path(goldens[5].file);
    GError *error = NULL;
    MemsimReport *rep = memsim_replay_path(path, NULL, &error);
    cr_assert(rep != NULL, "%s", error ? error->message : "?");
    cr_assert(rep->ranks[0].recorded_oom.happened);
    cr_expect_gt(rep->ranks[0].recorded_oom.rounded, rep->ranks[0].recorded_oom.device_free,
                 "an OOM asks for more than the device had free");
    cr_expect(!rep->ranks[0].oom.happened, "no simulated OOM without --gpu-mem");
    memsim_report_free(rep);
}

static void drop_sites(MemsimReport *rep)
{
    for (guint k = 0; k < rep->n_ranks; k++) {
        MemsimRankReport *r = &rep->ranks[k];
        for (guint j = 0; j < r->n_sites_at_peak; j++)
            g_free(r->sites_at_peak[j].site);
        for (guint j = 0; j < r->n_sites_at_oom; j++)
            g_free(r->sites_at_oom[j].site);
        g_clear_pointer(&r->sites_at_peak, g_free);
        g_clear_pointer(&r->sites_at_oom, g_free);
        r->n_sites_at_peak = r->n_sites_at_oom = 0;
        r->sites_oom_event = 0;
    }
}

/* Snapshot → .mst → replay, and the shipped fixture, give the same report as the snapshot
 * itself. */
Test(snapshots, mst_round_trip_same_results, .timeout = 300)
{
    g_autofree char *dir = tu_tmpdir();
    for (gsize i = 0; i < G_N_ELEMENTS(goldens); i++) {
        g_autofree char *rel = g_build_filename("torch-snapshots", goldens[i].file, NULL);
        g_autofree char *path = tu_shared_path_or_skip(rel);
        g_autofree char *mst = g_build_filename(dir, "t.mst", NULL);
        GError *error = NULL;
        cr_assert(memsim_convert(path, mst, &error), "%s: %s", goldens[i].file,
                  error ? error->message : "?");
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.verify = TRUE;
        MemsimReport *a = memsim_replay_path(path, &o, &error);
        cr_assert(a, "%s", error ? error->message : "?");
        MemsimReport *b = memsim_replay_path(mst, &o, &error);
        cr_assert(b, "%s", error ? error->message : "?");
        /* The source name differs; everything else must be identical. */
        g_free(b->source);
        b->source = g_strdup(a->source);
        char *ja = memsim_report_to_json(a);
        g_autofree char *jb = memsim_report_to_json(b);
        cr_expect_str_eq(ja, jb, "%s: reports differ after .mst round trip", goldens[i].file);
        /* The shipped fixture holds the same allocator facts: the same report, but for the
         * allocation sites (it keeps no frames). */
        drop_sites(a);
        g_free(ja);
        ja = memsim_report_to_json(a);
        g_autofree char *fx = fixture_path(goldens[i].file);
        MemsimReport *c = memsim_replay_path(fx, &o, &error);
        cr_assert(c, "%s", error ? error->message : "?");
        g_free(c->source);
        c->source = g_strdup(a->source);
        drop_sites(c);
        g_autofree char *jc = memsim_report_to_json(c);
        cr_expect_str_eq(ja, jc, "%s: the fixture's report differs (run tools/snapshot-fixture.sh)",
                         goldens[i].file);
        g_free(ja);
        memsim_report_free(a);
        memsim_report_free(b);
        memsim_report_free(c);
    }
}

/* The recorded OOM of the Nesta-gitU trace, replayed as the allocation it was.
 * Figures read with Python's pickle module (a restricted Unpickler) from the source file:
 * device_traces[0][1117] is {'action': 'oom', 'size': 402653184, 'device_free': 264634368};
 * the segments held then (Σ segment_alloc − Σ segment_free before it, from an empty start)
 * are 23297261568 bytes, so the device had 23297261568 + 264634368 = 23561895936 bytes for
 * the allocator, and the request was 402653184 − 264634368 = 138018816 bytes short. Its event
 * index in memsim's program is 911 (the 1117 entries less the free_completed ones, plus one
 * inferred empty_cache per run of segment_free). */
#define NESTA_CAPACITY ((memsim_size_t)23561895936)
#define NESTA_SHORT ((memsim_size_t)138018816)
#define NESTA_EVENT 911

static MemsimReport *nesta(gboolean original, const char *alloc_conf, memsim_size_t capacity)
{
    g_autofree char *path = original ? tu_shared_path_or_skip(
                                           "torch-snapshots/" "Nesta-gitU__discrete_diffusion__"
                                           "memory_snapshot.json.pickle")
                                     : fixture_path(goldens[5].file);
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.alloc_conf = alloc_conf;
    o.capacity = capacity;
    o.verify = alloc_conf == NULL;
    GError *error = NULL;
    MemsimReport *rep = memsim_replay_path(path, &o, &error);
    cr_assert(rep != NULL, "%s", error ? error->message : "?");
    return rep;
}

static void check_nesta_oom(gboolean original)
{
    /* torch at the recorded capacity (the default): the same event, the same shortfall, and
     * the replay is still exact (it goes on after the OOM, as the program did). */
    MemsimReport *rep = nesta(original, NULL, 0);
    const MemsimRankReport *r = &rep->ranks[0];
    cr_expect_eq(r->capacity, NESTA_CAPACITY, "capacity %" G_GUINT64_FORMAT, r->capacity);
    cr_assert(r->oom_verdict.replayed);
    cr_expect(!r->oom_verdict.fits);
    cr_expect_eq(r->oom_verdict.event_index, NESTA_EVENT);
    cr_expect_eq(r->recorded_oom.event_index, NESTA_EVENT);
    cr_expect_eq(r->oom_verdict.margin, NESTA_SHORT, "short by %" G_GUINT64_FORMAT,
                 r->oom_verdict.margin);
    cr_expect_eq(r->oom_verdict.device_free, r->recorded_oom.device_free);
    /* what sat in free holes could not have made up the difference */
    cr_expect(r->oom_verdict.cached_free > 0 && r->oom_verdict.cached_free < NESTA_SHORT);
    cr_expect_eq(r->oom_verdict.short_packed, NESTA_SHORT - r->oom_verdict.cached_free);
    cr_expect(!r->oom.happened, "nothing else fails");
    cr_expect(!r->fits, "the run did not fit its device");
    cr_expect_eq(r->verify_mismatches, 0, "%s", r->first_mismatch);
    memsim_report_free(rep);

    /* expandable segments on the same device: still does not fit */
    rep = nesta(original, "expandable_segments:True", 0);
    r = &rep->ranks[0];
    cr_assert(r->oom_verdict.replayed);
    cr_expect(!r->oom_verdict.fits, "expandable segments would not have saved it");
    cr_expect(r->oom_verdict.short_packed > 0 && r->oom_verdict.margin > 0);
    cr_expect_eq(r->oom_verdict.capacity, NESTA_CAPACITY);
    memsim_report_free(rep);

    /* a device with the shortfall and more: it fits, and the margin is what is left */
    rep = nesta(original, NULL, NESTA_CAPACITY + NESTA_SHORT + ((memsim_size_t)64 << 20));
    r = &rep->ranks[0];
    cr_assert(r->oom_verdict.replayed);
    cr_expect(r->oom_verdict.fits);
    cr_expect_eq(r->oom_verdict.margin, (memsim_size_t)64 << 20, "margin %" G_GUINT64_FORMAT,
                 r->oom_verdict.margin);
    cr_expect(r->fits);
    memsim_report_free(rep);
}

Test(snapshots, recorded_oom_replayed)
{
    check_nesta_oom(FALSE);
}

Test(snapshots, recorded_oom_replayed_original)
{
    check_nesta_oom(TRUE);
}

/* The CLI says so: replay, its what-if, compare per policy, and the HTML report. */
Test(snapshots, recorded_oom_in_every_output, .timeout = 120)
{
    g_autofree char *path = fixture_path(goldens[5].file);
    g_autofree char *out = NULL, *err = NULL;
    const char *replay[] = {"replay", path, NULL};
    cr_expect_eq(tu_run_memsim(replay, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "the recorded OOM's request on 21.94 GiB: DOES NOT FIT, short by "
                          "131.62 MiB"), "%s", out);
    g_free(out);
    g_free(err);
    const char *whatif[] = {"replay", path, "--alloc-conf", "expandable_segments:True", NULL};
    cr_expect_eq(tu_run_memsim(whatif, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "the recorded OOM's request (event 911) on 21.94 GiB: still DOES NOT "
                          "FIT with the what-if settings"), "%s", out);
    g_free(out);
    g_free(err);
    const char *cmp[] = {"compare", path, "--allocators", "torch,torch:expandable_segments=True",
                         NULL};
    cr_expect_eq(tu_run_memsim(cmp, &out, &err), 0, "%s", err);
    cr_expect(strstr(out, "event 911 (the recorded OOM): short by 131.62 MiB"), "%s", out);
    cr_expect(strstr(out, "torch:expandable_segments=True event 911 on 21.94 GiB: does not fit"),
              "%s", out);
    g_free(out);
    g_free(err);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *html = g_build_filename(dir, "r.html", NULL);
    const char *rep[] = {"replay", path, "--report", html, NULL};
    cr_expect_eq(tu_run_memsim(rep, &out, &err), 0, "%s", err);
    g_autofree char *page = NULL;
    cr_assert(g_file_get_contents(html, &page, NULL, NULL));
    cr_expect(strstr(page, "the recorded OOM at event 911 (384.00 MiB requested) does not fit on "
                           "21.94 GiB: short by 131.62 MiB"));
    cr_expect(!strstr(page, "no OOM"));
}

/* Who holds the memory: the top allocation site at the peak of two real snapshots that start
 * from an empty allocator, against an independent reader in Python (Debian's python3, its
 * pickle module with every global refused): it follows the trace's alloc and free_requested
 * entries, takes the moment the live requested bytes are at their most, and groups the live
 * allocations by their first Python frame outside torch and installed packages ("(no
 * frames)" for an allocation without any Python frame, as autograd's own). */
static const char site_reader[] =
    "import pickle, sys\n"
    "class U(pickle.Unpickler):\n"
    "    def find_class(self, m, n): raise pickle.UnpicklingError('global')\n"
    "d = U(open(sys.argv[1], 'rb')).load()\n"
    "SKIP = ('/torch/', '/site-packages/', '/dist-packages/', '/lib/python3', '<frozen')\n"
    "def site(e):\n"
    "    if not any(f['filename'].endswith('.py') for f in e['frames']):\n"
    "        return '(no frames)'\n"
    "    for f in e['frames']:\n"
    "        fn = f['filename']\n"
    "        if fn.endswith('.py') and not any(k in fn for k in SKIP):\n"
    "            return '%s:%d %s' % (fn, f['line'], f['name'])\n"
    "    return '(library code only)'\n"
    "live, total, best, at = {}, 0, -1, None\n"
    "for e in d['device_traces'][0]:\n"
    "    if e['action'] == 'alloc':\n"
    "        live[e['addr']] = (e['size'], site(e)); total += e['size']\n"
    "        if total > best:\n"
    "            best = total; at = dict(live)\n"
    "    elif e['action'] == 'free_requested' and e['addr'] in live:\n"
    "        total -= live.pop(e['addr'])[0]\n"
    "by = {}\n"
    "for size, s in at.values(): by[s] = by.get(s, 0) + size\n"
    "print(max(by.items(), key=lambda kv: kv[1])[0])\n";

static void check_top_site(const char *file, gboolean user_code)
{
    g_autofree char *rel = g_build_filename("torch-snapshots", file, NULL);
    g_autofree char *path = tu_shared_path_or_skip(rel);
    if (!g_file_test("/usr/bin/python3", G_FILE_TEST_IS_EXECUTABLE))
        cr_skip_test("/usr/bin/python3 absent: the independent reader cannot run");
    const char *argv[] = {"/usr/bin/python3", "-c", site_reader, path, NULL};
    g_autofree char *out = NULL, *err = NULL;
    gint status = 0;
    GError *error = NULL;
    cr_assert(g_spawn_sync(NULL, (char **)argv, NULL, 0, NULL, NULL, &out, &err, &status, &error),
              "%s", error ? error->message : "?");
    cr_assert(g_spawn_check_wait_status(status, NULL), "python: %s", err);
    g_strchomp(out);
    MemsimReport *rep = memsim_replay_path(path, NULL, &error);
    cr_assert(rep, "%s", error ? error->message : "?");
    const MemsimRankReport *r = &rep->ranks[0];
    cr_assert_gt(r->n_sites_at_peak, 0);
    if (user_code)
        cr_expect(out[0] == '/' && strstr(out, ".py:"),
                  "%s: the top site is no frame of the program's: %s", file, out);
    cr_expect_str_eq(r->sites_at_peak[0].site, out, "%s: memsim's top site %s, Python's %s", file,
                     r->sites_at_peak[0].site, out);
    memsim_report_free(rep);
}

Test(snapshots, top_site_at_peak_nesta, .timeout = 120)
{
    check_top_site("Nesta-gitU__discrete_diffusion__memory_snapshot.json.pickle", TRUE);
}

Test(snapshots, top_site_at_peak_shreyansh, .timeout = 120)
{
    check_top_site("shreyansh26__MLSys-Experiments__profile_grad.pkl", TRUE);
}

Test(snapshots, top_site_at_peak_silmont, .timeout = 120)
{
    /* its peak is in the backward pass: autograd's allocations, without Python frames */
    check_top_site("silmont2000__assignment2-systems__mem_snapshot.pickle", FALSE);
}

/* compare names who holds the memory too: at the peak (the same under both torch settings
 * here, so once) and at each policy's OOM, as replay does; the top site is the one the
 * independent reader above finds (dit.py:125). */
Test(snapshots, compare_lists_the_sites, .timeout = 120)
{
    g_autofree char *dir = tu_shared_path_or_skip("torch-snapshots");
    if (!dir)
        return;
    g_autofree char *path =
        g_build_filename(dir, "Nesta-gitU__discrete_diffusion__memory_snapshot.json.pickle", NULL);
    g_autofree char *out = NULL, *err = NULL;
    const char *cmp[] = {"compare", path, "--allocators", "torch,bfc", NULL};
    /* (exit status 1: bfc runs out before the recorded point) */
    cr_expect_eq(tu_run_memsim(cmp, &out, &err), 1, "%s", err);
    const char *oom = strstr(out, "who holds the memory at the OOM (event 911) under torch:\n");
    cr_assert(oom, "%s", out);
    /* its first line: the largest site */
    const char *line = strchr(oom, '\n') + 1;
    const char *end = strchr(line, '\n');
    g_autofree char *first = g_strndup(line, end ? (gsize)(end - line) : strlen(line));
    cr_expect(strstr(first, "dit.py:125 forward"), "%s", first);
    cr_expect(strstr(out, "who holds the memory at the OOM (event 907) under bfc:"), "%s", out);
}
