/* Unit tests of the `exact` allocator policy (sim/alloc/exact.c), the yardstick of the
 * reference comparisons: no caching, every request rounded up to a multiple of 512 bytes
 * (512 at least), each malloc one device allocation and each free one device free, so that
 * reserved memory always equals allocated memory.
 *
 * Every expected value is computed here from that rule, by hand in the comments next to the
 * literals or by ref_round() / the Model below (a ceiling division, not the policy's bit
 * mask), never copied from the program's output.
 */
#include <criterion/criterion.h>
#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/instance.h" /* the policy's state, for reset_peaks (no public wrapper) */
#include "testutil.h"

#define KiB ((memsim_size_t)1 << 10)
#define MiB ((memsim_size_t)1 << 20)
#define GiB ((memsim_size_t)1 << 30)

/* The rule: ceil(n / 512) × 512, and one 512-byte unit for anything under 512 (0 too). */
static memsim_size_t ref_round(memsim_size_t n)
{
    memsim_size_t units = n / 512 + (n % 512 != 0);
    return (units ? units : 1) * 512;
}

/* ---------------------------------------------------------------------------------------- */
/* The test device: records every event; cross-stream events never complete, so a policy that
 * waited for them before reusing a freed block would visibly keep it. */

typedef struct {
    MemsimDevice dev;
    GArray *ev; /* MemsimAllocEvent, in emission order */
    uint64_t n_record_event, n_event_done;
} Rig;

static uint64_t rig_record_event(void *user, uint32_t stream)
{
    (void)stream;
    Rig *r = user;
    return ++r->n_record_event;
}

static gboolean rig_event_done(void *user, uint32_t stream, uint64_t token)
{
    (void)stream;
    (void)token;
    Rig *r = user;
    r->n_event_done++;
    return FALSE;
}

static void rig_on_event(void *user, const MemsimAllocEvent *ev)
{
    Rig *r = user;
    g_array_append_val(r->ev, *ev);
}

static MemsimAlloc *rig_new(Rig *r, memsim_size_t capacity)
{
    memset(r, 0, sizeof *r);
    r->dev.capacity = capacity;
    r->dev.record_event = rig_record_event;
    r->dev.event_done = rig_event_done;
    r->dev.on_event = rig_on_event;
    r->dev.user = r;
    r->ev = g_array_new(FALSE, FALSE, sizeof(MemsimAllocEvent));
    GError *error = NULL;
    MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("exact"), NULL, &r->dev, &error);
    cr_assert(a, "exact: %s", error ? error->message : "?");
    cr_assert_null(error);
    return a;
}

static void rig_free(Rig *r, MemsimAlloc *a)
{
    memsim_alloc_free_instance(a);
    g_array_unref(r->ev);
}

static void checked(MemsimAlloc *a)
{
    GError *error = NULL;
    gboolean ok = memsim_alloc_check(a, &error);
    cr_assert(ok, "check: %s", error ? error->message : "?");
    cr_assert_null(error);
}

static memsim_addr_t mal(MemsimAlloc *a, memsim_size_t size, uint32_t stream)
{
    memsim_addr_t p = 0;
    cr_assert_eq(memsim_alloc_malloc(a, size, stream, &p), MEMSIM_ALLOC_OK,
                 "malloc(%" G_GUINT64_FORMAT ") failed", size);
    checked(a);
    return p;
}

static void fre(MemsimAlloc *a, memsim_addr_t p)
{
    memsim_alloc_free(a, p);
    checked(a);
}

static const MemsimAllocEvent *ev_at(Rig *r, guint i)
{
    cr_assert_lt(i, r->ev->len, "event %u of %u", i, r->ev->len);
    return &g_array_index(r->ev, MemsimAllocEvent, i);
}

/* The events of one kind since index `from`. */
static guint count_kind(Rig *r, guint from, MemsimAllocEventKind kind)
{
    guint n = 0;
    for (guint i = from; i < r->ev->len; i++)
        n += g_array_index(r->ev, MemsimAllocEvent, i).kind == kind;
    return n;
}

/* The last event of `kind`; fails when there is none since `from`. */
static const MemsimAllocEvent *last_of(Rig *r, guint from, MemsimAllocEventKind kind)
{
    for (guint i = r->ev->len; i > from; i--)
        if (g_array_index(r->ev, MemsimAllocEvent, i - 1).kind == kind)
            return &g_array_index(r->ev, MemsimAllocEvent, i - 1);
    cr_assert_fail("no event of kind %d since %u", kind, from);
    return NULL;
}

#define EXPECT_STAT(st, field, cur, pk)                                                            \
    do {                                                                                           \
        cr_assert_eq((st).field.current, (int64_t)(cur),                                           \
                     #field ".current: expected %" G_GINT64_FORMAT ", got %" G_GINT64_FORMAT,      \
                     (int64_t)(cur), (st).field.current);                                          \
        cr_assert_eq((st).field.peak, (int64_t)(pk),                                               \
                     #field ".peak: expected %" G_GINT64_FORMAT ", got %" G_GINT64_FORMAT,         \
                     (int64_t)(pk), (st).field.peak);                                              \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* A model of the rule, for sequences too long to follow by hand. */

typedef struct {
    int64_t cur, peak;
} Pair;

typedef struct {
    Pair bytes;    /* allocated = reserved = active */
    Pair req;      /* requested */
    Pair blocks;   /* live blocks = segments = allocations */
    uint64_t n_alloc, n_free, n_ooms;
    memsim_size_t capacity; /* 0 = unlimited */
} Model;

static void pair_add(Pair *p, int64_t n)
{
    p->cur += n;
    if (p->cur > p->peak)
        p->peak = p->cur;
}

/* Whether the rule lets `size` in; updates the model like the policy must. */
static gboolean model_malloc(Model *m, memsim_size_t size)
{
    memsim_size_t r = ref_round(size);
    if (m->capacity && (memsim_size_t)m->bytes.cur + r > m->capacity) {
        m->n_ooms++;
        return FALSE;
    }
    pair_add(&m->bytes, (int64_t)r);
    pair_add(&m->req, (int64_t)size);
    pair_add(&m->blocks, 1);
    m->n_alloc++;
    return TRUE;
}

static void model_free(Model *m, memsim_size_t size)
{
    m->bytes.cur -= (int64_t)ref_round(size);
    m->req.cur -= (int64_t)size;
    m->blocks.cur--;
    m->n_free++;
}

static void expect_model(MemsimAlloc *a, const Model *m)
{
    MemsimAllocStats st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, m->bytes.cur, m->bytes.peak);
    EXPECT_STAT(st, reserved, m->bytes.cur, m->bytes.peak);
    EXPECT_STAT(st, active, m->bytes.cur, m->bytes.peak);
    EXPECT_STAT(st, requested, m->req.cur, m->req.peak);
    EXPECT_STAT(st, segments, m->blocks.cur, m->blocks.peak);
    EXPECT_STAT(st, allocations, m->blocks.cur, m->blocks.peak);
    EXPECT_STAT(st, inactive_split, 0, 0);
    cr_assert_eq(st.n_device_alloc, m->n_alloc, "n_device_alloc %" G_GUINT64_FORMAT
                 ", expected %" G_GUINT64_FORMAT, st.n_device_alloc, m->n_alloc);
    cr_assert_eq(st.n_device_free, m->n_free, "n_device_free %" G_GUINT64_FORMAT
                 ", expected %" G_GUINT64_FORMAT, st.n_device_free, m->n_free);
    cr_assert_eq(st.n_ooms, m->n_ooms);
    cr_assert_eq(st.n_alloc_retries, 0);
    cr_assert_eq(st.n_sync_all_streams, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* The policy in the registry */

Test(exact_registry, found_by_name_and_spec)
{
    const MemsimAllocOps *ops = memsim_alloc_find("exact");
    cr_assert_not_null(ops);
    cr_assert_str_eq(ops->name, "exact");
    gboolean listed = FALSE;
    for (const MemsimAllocOps *const *p = memsim_alloc_registry(); *p; p++)
        listed |= *p == ops;
    cr_assert(listed, "exact is not in the registry");

    GError *error = NULL;
    MemsimAlloc *a = memsim_alloc_new_from_spec("exact", NULL, &error);
    cr_assert(a, "%s", error ? error->message : "?");
    cr_assert_eq(memsim_alloc_ops(a), ops);
    memsim_alloc_free_instance(a);
    a = memsim_alloc_new_from_spec("exact:", NULL, &error); /* empty settings = defaults */
    cr_assert(a, "%s", error ? error->message : "?");
    memsim_alloc_free_instance(a);
    memsim_alloc_free_instance(NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* Settings: `exact` takes none. */

Test(exact_settings, defaults_accepted)
{
    const char *fine[] = {NULL, ""};
    for (gsize i = 0; i < G_N_ELEMENTS(fine); i++) {
        GError *error = NULL;
        MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("exact"), fine[i], NULL, &error);
        cr_assert(a, "settings %s: %s", fine[i] ? "\"\"" : "NULL", error ? error->message : "?");
        cr_assert_null(error);
        cr_assert_eq(memsim_alloc_round_size(a, 1), 512);
        memsim_alloc_free_instance(a);
    }
}

Test(exact_settings, any_setting_refused)
{
    /* Settings other policies take, nonsense, and a lone separator. */
    const char *bad[] = {"x=1",
                         "garbage",
                         "expandable_segments=True",
                         "roundup_power2_divisions=4",
                         "max_split_size_mb=128"};
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        GError *error = NULL;
        MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("exact"), bad[i], NULL, &error);
        cr_assert_null(a, "settings '%s' accepted", bad[i]);
        cr_assert(g_error_matches(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT),
                  "settings '%s': %s", bad[i], error ? error->message : "no error");
        cr_assert(strstr(error->message, bad[i]) != NULL, "'%s': the message does not quote it: %s",
                  bad[i], error->message);
        cr_assert(strstr(error->message, "exact") != NULL, "'%s': the message does not name the "
                  "policy: %s", bad[i], error->message);
        g_error_free(error);
    }
    /* The same through a spec, PYTORCH_CUDA_ALLOC_CONF form included. */
    const char *specs[] = {"exact:max_split_size_mb=128", "exact:expandable_segments:True"};
    for (gsize i = 0; i < G_N_ELEMENTS(specs); i++) {
        GError *error = NULL;
        MemsimAlloc *a = memsim_alloc_new_from_spec(specs[i], NULL, &error);
        cr_assert_null(a, "spec '%s' accepted", specs[i]);
        cr_assert(g_error_matches(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "spec '%s': %s",
                  specs[i], error ? error->message : "no error");
        g_error_free(error);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Rounding */

Test(exact_round, multiples_of_512)
{
    MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("exact"), NULL, NULL, NULL);
    cr_assert_not_null(a);
    /* {request, rounded by hand} */
    static const memsim_size_t table[][2] = {
        {1, 512},
        {2, 512},
        {255, 512},
        {256, 512},
        {257, 512},
        {511, 512},
        {512, 512},
        {513, 1024},      /* 512 + 1: two units */
        {1000, 1024},
        {1024, 1024},
        {1025, 1536},
        {4095, 4096},
        {4096, 4096},
        {4097, 4608},     /* 8 units + 1 byte: 9 units */
        {1048577, 1049088}, /* 1 MiB + 1: 2049 units */
        {1073741823, 1073741824}, /* 1 GiB − 1 */
        {1073741824, 1073741824},
        {((memsim_size_t)1 << 40) + 3, ((memsim_size_t)1 << 40) + 512},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(table); i++) {
        memsim_size_t got = memsim_alloc_round_size(a, table[i][0]);
        cr_assert_eq(got, table[i][1],
                     "round_size(%" G_GUINT64_FORMAT ") = %" G_GUINT64_FORMAT ", expected %"
                     G_GUINT64_FORMAT, table[i][0], got, table[i][1]);
        cr_assert_eq(ref_round(table[i][0]), table[i][1], "the test's rule disagrees at %"
                     G_GUINT64_FORMAT, table[i][0]);
    }
    /* Every size of the first 4 units and around many boundaries follows the rule. */
    for (memsim_size_t n = 1; n <= 2048; n++)
        if (memsim_alloc_round_size(a, n) != ref_round(n))
            cr_assert_fail("round_size(%" G_GUINT64_FORMAT ")", n);
    for (memsim_size_t k = 1; k < 100000; k += 997)
        for (memsim_size_t d = 0; d < 3; d++) {
            memsim_size_t n = k * 512 - 1 + d;
            if (memsim_alloc_round_size(a, n) != ref_round(n))
                cr_assert_fail("round_size(%" G_GUINT64_FORMAT ")", n);
        }
    memsim_alloc_free_instance(a);
}

/* The bytes a malloc takes are the rounded ones: 1 → 512, 512 → 512, 513 → 1024. */
Test(exact_round, malloc_takes_the_rounded_size)
{
    static const memsim_size_t req[] = {1, 512, 513};
    static const int64_t rounded[] = {512, 512, 1024};
    for (gsize i = 0; i < G_N_ELEMENTS(req); i++) {
        Rig r;
        MemsimAlloc *a = rig_new(&r, 0);
        memsim_addr_t p = mal(a, req[i], 0);
        MemsimAllocStats st = memsim_alloc_stats(a);
        EXPECT_STAT(st, allocated, rounded[i], rounded[i]);
        EXPECT_STAT(st, reserved, rounded[i], rounded[i]);
        EXPECT_STAT(st, requested, req[i], req[i]);
        /* The ALLOC event reports the caller's bytes. */
        const MemsimAllocEvent *e = last_of(&r, 0, MEMSIM_AEV_ALLOC);
        cr_assert_eq(e->addr, p);
        cr_assert_eq(e->size, req[i]);
        fre(a, p);
        rig_free(&r, a);
    }
}

/* Fails if the policy rounded to 256 bytes: 100 → 512 (256 would give 256), 513 → 1024
 * (768), 300 → 512 (512 either way), so 2048 allocated in all where 256-byte rounding gives
 * 1536. */
Test(exact_round, granularity_is_512_not_256)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    memsim_addr_t p1 = mal(a, 100, 0);
    memsim_addr_t p2 = mal(a, 513, 0);
    memsim_addr_t p3 = mal(a, 300, 0);
    MemsimAllocStats st = memsim_alloc_stats(a);
    cr_assert_eq(st.allocated.current, 512 + 1024 + 512, "allocated %" G_GINT64_FORMAT,
                 st.allocated.current);
    cr_assert_eq(st.reserved.current, 2048);
    cr_assert_eq(memsim_alloc_round_size(a, 100), 512);
    cr_assert_eq(memsim_alloc_round_size(a, 700), 1024); /* 256-rounding: 768 */
    /* A capacity of 1536 bytes holds three 100-byte requests under 256-byte rounding (768),
     * but only three 512-byte blocks here: the fourth fails. */
    fre(a, p1);
    fre(a, p2);
    fre(a, p3);
    rig_free(&r, a);
    a = rig_new(&r, 1536);
    memsim_addr_t q[3];
    for (int i = 0; i < 3; i++)
        q[i] = mal(a, 100, 0);
    memsim_addr_t untouched = 0xdead;
    cr_assert_eq(memsim_alloc_malloc(a, 100, 0, &untouched), MEMSIM_ALLOC_OOM);
    cr_assert_eq(untouched, 0xdead);
    for (int i = 0; i < 3; i++)
        fre(a, q[i]);
    rig_free(&r, a);
}

/* alloc.h requires size > 0; the policy's rule rounds anything under 512, 0 included, up to
 * one 512-byte unit (round_size), and a 0-byte malloc takes that unit like any live tensor. */
Test(exact_round, zero_bytes)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    cr_assert_eq(memsim_alloc_round_size(a, 0), 512);
    memsim_addr_t p = mal(a, 0, 0);
    MemsimAllocStats st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 512, 512);
    EXPECT_STAT(st, reserved, 512, 512);
    EXPECT_STAT(st, requested, 0, 0);
    EXPECT_STAT(st, allocations, 1, 1);
    cr_assert_eq(st.n_device_alloc, 1);
    fre(a, p);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 0, 512);
    EXPECT_STAT(st, allocations, 0, 1);
    cr_assert_eq(st.n_device_free, 1);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* Current and peak after sequences worked out by hand */

Test(exact_stats, hand_sequence)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    MemsimAllocStats st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 0, 0);
    EXPECT_STAT(st, reserved, 0, 0);
    cr_assert_eq(st.n_device_alloc, 0);
    cr_assert_eq(st.n_device_free, 0);

    /* step            block   allocated  requested  blocks
     * a = malloc(1)     512        512          1       1
     * b = malloc(1000) 1024       1536       1001       2
     * c = malloc(4096) 4096       5632       5097       3
     * free(b)                     4608       4097       2
     * d = malloc(513)  1024       5632       4610       3   (allocated ties its peak)
     * e = malloc(600)  1024       6656       5210       4   <- peak blocks 4
     * free(a)                     6144       5209       3
     * free(c)                     2048       1113       2
     * f = malloc(5000) 5120       7168       6113       3   <- peak bytes 7168, requested 6113
     * free(d)                     6144       5600       2
     * free(e)                     5120       5000       1
     * free(f)                        0          0       0
     */
    memsim_addr_t pa = mal(a, 1, 0);
    memsim_addr_t pb = mal(a, 1000, 0);
    memsim_addr_t pc = mal(a, 4096, 0);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 5632, 5632);
    EXPECT_STAT(st, requested, 5097, 5097);
    fre(a, pb);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 4608, 5632);
    EXPECT_STAT(st, reserved, 4608, 5632);
    EXPECT_STAT(st, requested, 4097, 5097);
    memsim_addr_t pd = mal(a, 513, 0);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 5632, 5632);
    memsim_addr_t pe = mal(a, 600, 0);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 6656, 6656);
    EXPECT_STAT(st, requested, 5210, 5210);
    EXPECT_STAT(st, allocations, 4, 4);
    fre(a, pa);
    fre(a, pc);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 2048, 6656);
    EXPECT_STAT(st, requested, 1113, 5210);
    memsim_addr_t pf = mal(a, 5000, 0);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 7168, 7168);
    EXPECT_STAT(st, reserved, 7168, 7168);
    EXPECT_STAT(st, active, 7168, 7168);
    EXPECT_STAT(st, requested, 6113, 6113);
    EXPECT_STAT(st, allocations, 3, 4);
    EXPECT_STAT(st, segments, 3, 4);
    fre(a, pd);
    fre(a, pe);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 5120, 7168);
    EXPECT_STAT(st, requested, 5000, 6113);
    fre(a, pf);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 0, 7168);
    EXPECT_STAT(st, reserved, 0, 7168);
    EXPECT_STAT(st, active, 0, 7168);
    EXPECT_STAT(st, requested, 0, 6113);
    EXPECT_STAT(st, allocations, 0, 4);
    EXPECT_STAT(st, segments, 0, 4);
    EXPECT_STAT(st, inactive_split, 0, 0);
    /* Six mallocs, six frees: each one a driver call. */
    cr_assert_eq(st.n_device_alloc, 6);
    cr_assert_eq(st.n_device_free, 6);
    cr_assert_eq(st.n_ooms, 0);
    cr_assert_eq(st.n_alloc_retries, 0);
    /* One ALLOC and one FREE_COMPLETED event each, with the caller's bytes: they cancel. */
    cr_assert_eq(count_kind(&r, 0, MEMSIM_AEV_ALLOC), 6);
    cr_assert_eq(count_kind(&r, 0, MEMSIM_AEV_FREE_COMPLETED), 6);
    cr_assert_eq(count_kind(&r, 0, MEMSIM_AEV_OOM), 0);
    int64_t net = 0;
    for (guint i = 0; i < r.ev->len; i++) {
        const MemsimAllocEvent *e = ev_at(&r, i);
        if (e->kind == MEMSIM_AEV_ALLOC)
            net += (int64_t)e->size;
        else if (e->kind == MEMSIM_AEV_FREE_COMPLETED)
            net -= (int64_t)e->size;
    }
    cr_assert_eq(net, 0);
    rig_free(&r, a);
}

Test(exact_stats, reset_peaks_and_live_stats)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    const MemsimAllocStats *live = memsim_alloc_stats_live(a);
    memsim_addr_t p = mal(a, 3 * MiB, 0);   /* 3 MiB: a multiple of 512 */
    memsim_addr_t q = mal(a, 1 * MiB + 1, 0); /* 1 MiB + 512 */
    fre(a, p);
    MemsimAllocStats st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, MiB + 512, 4 * MiB + 512);
    cr_assert_not_null(a->ops->reset_peaks);
    a->ops->reset_peaks(a->state);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, MiB + 512, MiB + 512);
    EXPECT_STAT(st, reserved, MiB + 512, MiB + 512);
    EXPECT_STAT(st, active, MiB + 512, MiB + 512);
    EXPECT_STAT(st, requested, MiB + 1, MiB + 1);
    EXPECT_STAT(st, allocations, 1, 1);
    EXPECT_STAT(st, segments, 1, 1);
    /* Counters are not peaks: they stay. */
    cr_assert_eq(st.n_device_alloc, 2);
    cr_assert_eq(st.n_device_free, 1);
    /* A new peak after the reset: 1 MiB + 512 + 512. */
    memsim_addr_t s = mal(a, 10, 0);
    fre(a, s);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, MiB + 512, MiB + 1024);
    /* The live statistics: the same pointer for the instance's life, the same values. */
    cr_assert(memsim_alloc_ops(a)->stats_live_fixed);
    cr_assert_eq(memsim_alloc_stats_live(a), live);
    cr_assert(memcmp(live, &st, sizeof st) == 0);
    fre(a, q);
    cr_assert_eq(live->allocated.current, 0);
    rig_free(&r, a);
}

Test(exact_stats, shape_has_no_free_space)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    memsim_addr_t p[5];
    for (int i = 0; i < 5; i++)
        p[i] = mal(a, (memsim_size_t)(i + 1) * 1000, 0);
    fre(a, p[1]);
    fre(a, p[3]);
    /* Nothing is cached: no free block, no free byte; one device allocation per live block. */
    MemsimAllocShape sh = memsim_alloc_shape(a);
    cr_assert_eq(sh.largest_free, 0);
    cr_assert_eq(sh.free_bytes, 0);
    cr_assert_eq(sh.n_free_blocks, 0);
    cr_assert_eq(sh.n_segments, 3);
    fre(a, p[0]);
    fre(a, p[2]);
    fre(a, p[4]);
    sh = memsim_alloc_shape(a);
    cr_assert_eq(sh.n_segments, 0);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* No caching */

/* Fails if frees were cached: a cached block would keep reserved at 1 MiB after the free,
 * count no device free, and serve the second malloc from the cache (same address, no second
 * device allocation). */
Test(exact_cache, frees_go_back_to_the_device)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    memsim_addr_t p = mal(a, MiB, 0);
    fre(a, p);
    MemsimAllocStats st = memsim_alloc_stats(a);
    EXPECT_STAT(st, reserved, 0, MiB);
    EXPECT_STAT(st, allocated, 0, MiB);
    cr_assert_eq(st.n_device_free, 1);
    memsim_addr_t q = mal(a, MiB, 0);
    st = memsim_alloc_stats(a);
    cr_assert_eq(st.n_device_alloc, 2, "the second malloc was served from a cache");
    EXPECT_STAT(st, reserved, MiB, MiB);
    cr_assert_neq(q, p, "the freed address was handed out again");
    /* empty_cache has nothing to give back. */
    guint before = r.ev->len;
    memsim_alloc_empty_cache(a);
    MemsimAllocStats after = memsim_alloc_stats(a);
    cr_assert(memcmp(&after, &st, sizeof st) == 0, "empty_cache changed the statistics");
    cr_assert_eq(r.ev->len, before, "empty_cache emitted events");
    fre(a, q);
    /* Many cycles: reserved never holds more than the one live block. */
    for (int i = 0; i < 1000; i++) {
        memsim_addr_t x = mal(a, 4096, (uint32_t)(i % 3));
        fre(a, x);
        const MemsimAllocStats *l = memsim_alloc_stats_live(a);
        if (l->reserved.current != 0 || l->reserved.peak != (int64_t)MiB)
            cr_assert_fail("cycle %d: reserved %" G_GINT64_FORMAT " peak %" G_GINT64_FORMAT, i,
                           l->reserved.current, l->reserved.peak);
    }
    st = memsim_alloc_stats(a);
    cr_assert_eq(st.n_device_alloc, 1002);
    cr_assert_eq(st.n_device_free, 1002);
    rig_free(&r, a);
}

/* Live blocks never overlap, and an address is never handed out twice (the header: a bump
 * pointer, never reused). */
Test(exact_cache, addresses_unique_and_disjoint)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    GHashTable *seen = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    enum { N = 300 };
    memsim_addr_t addr[N];
    memsim_size_t size[N];
    for (int i = 0; i < N; i++) {
        size[i] = (memsim_size_t)(i * 37 % 5000) + 1;
        addr[i] = mal(a, size[i], (uint32_t)(i % 4));
        gint64 *k = g_new(gint64, 1);
        *k = (gint64)addr[i];
        cr_assert(!g_hash_table_contains(seen, k), "address 0x%" G_GINT64_MODIFIER "x twice",
                  addr[i]);
        g_hash_table_add(seen, k);
        if (i % 3 == 2) /* free some as we go: their addresses must not come back */
            fre(a, addr[i - 1]);
    }
    /* The live ones (never freed) do not overlap: sort by address, compare neighbours. */
    GArray *live = g_array_new(FALSE, FALSE, sizeof(int));
    for (int i = 0; i < N; i++)
        if (i % 3 != 1) /* the ones freed above */
            g_array_append_val(live, i);
    for (guint x = 0; x < live->len; x++)
        for (guint y = x + 1; y < live->len; y++) {
            int i = g_array_index(live, int, x), j = g_array_index(live, int, y);
            memsim_addr_t lo = MIN(addr[i], addr[j]), hi = MAX(addr[i], addr[j]);
            memsim_size_t lo_size = lo == addr[i] ? ref_round(size[i]) : ref_round(size[j]);
            if (lo + lo_size > hi)
                cr_assert_fail("blocks %d and %d overlap", i, j);
        }
    for (guint x = 0; x < live->len; x++)
        fre(a, addr[g_array_index(live, int, x)]);
    cr_assert_eq(memsim_alloc_stats(a).allocated.current, 0);
    g_array_unref(live);
    g_hash_table_unref(seen);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* Capacity */

Test(exact_oom, at_capacity)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 4 * KiB);
    memsim_addr_t p = mal(a, 3000, 0); /* 3072: 1024 left */
    MemsimAllocStats before = memsim_alloc_stats(a);

    /* 1025 rounds to 1536 > 1024 left: refused, *addr untouched, only n_ooms moves. */
    memsim_addr_t untouched = 0x1234;
    guint from = r.ev->len;
    cr_assert_eq(memsim_alloc_malloc(a, 1025, 0, &untouched), MEMSIM_ALLOC_OOM);
    cr_assert_eq(untouched, 0x1234);
    checked(a);
    MemsimAllocStats st = memsim_alloc_stats(a);
    cr_assert_eq(st.n_ooms, before.n_ooms + 1);
    st.n_ooms = before.n_ooms;
    cr_assert(memcmp(&st, &before, sizeof st) == 0, "an OOM changed the statistics");
    /* The OOM event: size = the rounded request, addr = the device's free bytes. */
    cr_assert_eq(count_kind(&r, from, MEMSIM_AEV_OOM), 1);
    cr_assert_eq(count_kind(&r, from, MEMSIM_AEV_ALLOC), 0);
    const MemsimAllocEvent *e = last_of(&r, from, MEMSIM_AEV_OOM);
    cr_assert_eq(e->size, 1536);
    cr_assert_eq(e->addr, 1024);

    /* 1024 fits exactly: reserved reaches the capacity. */
    memsim_addr_t q = mal(a, 1024, 1);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, reserved, 4096, 4096);
    /* Now even 1 byte (512) fails, with 0 bytes free. */
    from = r.ev->len;
    cr_assert_eq(memsim_alloc_malloc(a, 1, 0, &untouched), MEMSIM_ALLOC_OOM);
    e = last_of(&r, from, MEMSIM_AEV_OOM);
    cr_assert_eq(e->size, 512);
    cr_assert_eq(e->addr, 0);
    st = memsim_alloc_stats(a);
    cr_assert_eq(st.n_ooms, 2);
    cr_assert_eq(st.n_device_alloc, 2, "an OOM counted as a device allocation");
    EXPECT_STAT(st, allocated, 4096, 4096);
    /* A free makes room again: 3072 back, 3072 taken. */
    fre(a, p);
    memsim_addr_t s = mal(a, 3072, 0);
    fre(a, s);
    fre(a, q);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, reserved, 0, 4096);
    cr_assert_eq(st.n_device_alloc, 3);
    cr_assert_eq(st.n_device_free, 3);
    rig_free(&r, a);
}

/* The rounded size, not the request, is what must fit: a capacity of 1000 bytes (not a
 * multiple of 512) holds one 512-byte block; 600 bytes (1024) never fits. */
Test(exact_oom, rounded_size_must_fit)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 1000);
    memsim_addr_t untouched = 0;
    cr_assert_eq(memsim_alloc_malloc(a, 600, 0, &untouched), MEMSIM_ALLOC_OOM);
    memsim_addr_t p = mal(a, 500, 0);
    cr_assert_eq(memsim_alloc_malloc(a, 1, 0, &untouched), MEMSIM_ALLOC_OOM);
    const MemsimAllocEvent *e = last_of(&r, 0, MEMSIM_AEV_OOM);
    cr_assert_eq(e->addr, 1000 - 512);
    cr_assert_eq(e->size, 512);
    MemsimAllocStats st = memsim_alloc_stats(a);
    EXPECT_STAT(st, reserved, 512, 512);
    cr_assert_eq(st.n_ooms, 2);
    fre(a, p);
    /* Larger than the whole device on an empty one. */
    cr_assert_eq(memsim_alloc_malloc(a, 1001, 0, &untouched), MEMSIM_ALLOC_OOM);
    cr_assert_eq(memsim_alloc_stats(a).n_ooms, 3);
    rig_free(&r, a);
}

/* Requests no device can hold are refused, also on an unlimited device, and leave the
 * statistics alone; rounding them must not wrap past 2^64 into a small (or empty) block. */
Test(exact_oom, absurd_sizes_refused)
{
    static const memsim_size_t sizes[] = {
        UINT64_MAX,                /* rounds past 2^64: to 0 if it wraps */
        UINT64_MAX - 510,          /* the first size whose rounding wraps */
        UINT64_MAX - 600,          /* rounds to 2^64 − 512 */
        (memsim_size_t)1 << 63,    /* negative as an int64 */
        ((memsim_size_t)1 << 63) + 1,
    };
    for (int capped = 0; capped < 2; capped++) {
        Rig r;
        MemsimAlloc *a = rig_new(&r, capped ? GiB : 0);
        memsim_addr_t held = mal(a, 1024, 0);
        MemsimAllocStats before = memsim_alloc_stats(a);
        for (gsize i = 0; i < G_N_ELEMENTS(sizes); i++) {
            memsim_addr_t untouched = 0x77;
            MemsimAllocResult res = memsim_alloc_malloc(a, sizes[i], 0, &untouched);
            cr_assert_eq(res, MEMSIM_ALLOC_OOM,
                         "%s device: malloc(%" G_GUINT64_FORMAT ") succeeded at 0x%"
                         G_GINT64_MODIFIER "x", capped ? "1 GiB" : "unlimited", sizes[i],
                         untouched);
            cr_assert_eq(untouched, 0x77);
            checked(a);
            MemsimAllocStats st = memsim_alloc_stats(a);
            cr_assert_eq(st.n_ooms, before.n_ooms + i + 1);
            st.n_ooms = before.n_ooms;
            cr_assert(memcmp(&st, &before, sizeof st) == 0,
                      "malloc(%" G_GUINT64_FORMAT ") changed the statistics", sizes[i]);
        }
        fre(a, held);
        MemsimAllocStats st = memsim_alloc_stats(a);
        EXPECT_STAT(st, allocated, 0, 1024);
        cr_assert_eq(st.n_device_alloc, 1);
        cr_assert_eq(st.n_device_free, 1);
        rig_free(&r, a);
    }
}

/* A long random program against the model, with and without a capacity. */
Test(exact_oom, random_program_matches_the_rule)
{
    static const memsim_size_t edges[] = {1, 511, 512, 513, 1023, 1024, 1025, 4096, MiB - 1};
    for (int capped = 0; capped < 2; capped++) {
        Rig r;
        Model m = {.capacity = capped ? 24 * MiB : 0};
        MemsimAlloc *a = rig_new(&r, m.capacity);
        GRand *rng = g_rand_new_with_seed(1234 + (guint32)capped);
        GArray *addrs = g_array_new(FALSE, FALSE, sizeof(memsim_addr_t));
        GArray *sizes = g_array_new(FALSE, FALSE, sizeof(memsim_size_t));
        for (int step = 0; step < 20000; step++) {
            if (addrs->len && (g_rand_int_range(rng, 0, 100) < 45 || addrs->len > 200)) {
                guint k = (guint)g_rand_int_range(rng, 0, (gint32)addrs->len);
                memsim_alloc_free(a, g_array_index(addrs, memsim_addr_t, k));
                model_free(&m, g_array_index(sizes, memsim_size_t, k));
                g_array_remove_index_fast(addrs, k);
                g_array_remove_index_fast(sizes, k);
            } else {
                memsim_size_t size = g_rand_boolean(rng)
                                         ? edges[g_rand_int_range(rng, 0, G_N_ELEMENTS(edges))]
                                         : (memsim_size_t)g_rand_int_range(rng, 1, 2 * (gint32)MiB);
                memsim_addr_t p = 0;
                MemsimAllocResult res =
                    memsim_alloc_malloc(a, size, (uint32_t)g_rand_int_range(rng, 0, 4), &p);
                gboolean fits = model_malloc(&m, size);
                if ((res == MEMSIM_ALLOC_OK) != fits)
                    cr_assert_fail("step %d: malloc(%" G_GUINT64_FORMAT ") with %" G_GINT64_FORMAT
                                   " reserved: %s, the rule says %s",
                                   step, size, m.bytes.cur, res == MEMSIM_ALLOC_OK ? "ok" : "oom",
                                   fits ? "ok" : "oom");
                if (fits) {
                    g_array_append_val(addrs, p);
                    g_array_append_val(sizes, size);
                }
            }
            if (step % 64 == 0) {
                expect_model(a, &m);
                checked(a);
            }
        }
        if (capped)
            cr_assert_gt(m.n_ooms, 0, "the capped run never reached its capacity");
        while (addrs->len) {
            memsim_alloc_free(a, g_array_index(addrs, memsim_addr_t, addrs->len - 1));
            model_free(&m, g_array_index(sizes, memsim_size_t, addrs->len - 1));
            g_array_set_size(addrs, addrs->len - 1);
            g_array_set_size(sizes, sizes->len - 1);
        }
        expect_model(a, &m);
        checked(a);
        cr_assert_eq(m.bytes.cur, 0);
        g_array_unref(addrs);
        g_array_unref(sizes);
        g_rand_free(rng);
        rig_free(&r, a);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Streams. exact keeps nothing for later, so the stream a block was allocated or used on
 * cannot delay its release: a free completes at once, without recording or querying a
 * cross-stream event (the rig's events never complete). */

Test(exact_streams, free_after_use_on_another_stream_completes_at_once)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    memsim_addr_t p = mal(a, 4096, 0);
    memsim_alloc_record_stream(a, p, 5); /* also used on stream 5 */
    checked(a);
    guint from = r.ev->len;
    fre(a, p);
    MemsimAllocStats st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 0, 4096);
    EXPECT_STAT(st, active, 0, 4096); /* not pending */
    EXPECT_STAT(st, reserved, 0, 4096);
    cr_assert_eq(st.n_device_free, 1);
    cr_assert_eq(count_kind(&r, from, MEMSIM_AEV_FREE_COMPLETED), 1);
    const MemsimAllocEvent *e = last_of(&r, from, MEMSIM_AEV_FREE_COMPLETED);
    cr_assert_eq(e->addr, p);
    cr_assert_eq(e->size, 4096);
    cr_assert_eq(r.n_record_event, 0, "a stream event was recorded");
    cr_assert_eq(r.n_event_done, 0, "a stream event was waited for");
    rig_free(&r, a);
}

Test(exact_streams, one_pool_for_all_streams)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 8 * KiB);
    static const uint32_t streams[] = {0, 1, 7, 65535};
    memsim_addr_t p[4];
    for (int i = 0; i < 4; i++) {
        guint from = r.ev->len;
        p[i] = mal(a, 2000, streams[i]); /* 2048 each */
        const MemsimAllocEvent *e = last_of(&r, from, MEMSIM_AEV_ALLOC);
        cr_assert_eq(e->stream, streams[i]);
        cr_assert_eq(e->addr, p[i]);
    }
    /* 4 × 2048 = 8 KiB: the device is full whatever the stream. */
    MemsimAllocStats st = memsim_alloc_stats(a);
    EXPECT_STAT(st, reserved, 8192, 8192);
    memsim_addr_t untouched = 0;
    guint from = r.ev->len;
    cr_assert_eq(memsim_alloc_malloc(a, 1, 3, &untouched), MEMSIM_ALLOC_OOM);
    cr_assert_eq(last_of(&r, from, MEMSIM_AEV_OOM)->stream, 3);
    /* A block allocated on stream 7 freed while the program runs on stream 0 (the free call
     * names no stream): its bytes are available to any stream at once. */
    fre(a, p[2]);
    memsim_addr_t q = mal(a, 2048, 1);
    cr_assert_neq(q, p[2]);
    fre(a, q);
    fre(a, p[0]);
    fre(a, p[1]);
    fre(a, p[3]);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, reserved, 0, 8192);
    cr_assert_eq(r.n_record_event + r.n_event_done, 0);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* A recording that starts mid-run: seeded blocks count as live tensors (rounded by the same
 * rule, whatever block size the recording gives) without a device allocation. */

Test(exact_seed, seeded_blocks_count_as_live)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    GError *error = NULL;
    const memsim_addr_t seg = 0x7f0000000000;
    cr_assert(memsim_alloc_seed_segment(a, seg, 20 * MiB, 0, 0, &error), "%s",
              error ? error->message : "?");
    MemsimAllocStats st = memsim_alloc_stats(a);
    EXPECT_STAT(st, reserved, 0, 0); /* a segment holds nothing here */
    cr_assert(memsim_alloc_seed_block(a, seg, 2 * MiB, 1000, 0, &error), "%s",
              error ? error->message : "?");
    cr_assert(memsim_alloc_seed_block(a, seg + 2 * MiB, 4096, 4096, 1, &error), "%s",
              error ? error->message : "?");
    checked(a);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 1024 + 4096, 1024 + 4096); /* 1000 → 1024, not 2 MiB */
    EXPECT_STAT(st, reserved, 5120, 5120);
    EXPECT_STAT(st, requested, 5096, 5096);
    EXPECT_STAT(st, allocations, 2, 2);
    cr_assert_eq(st.n_device_alloc, 0, "seeding is not a driver call");
    /* The same address twice is inconsistent: refused, nothing counted. */
    cr_assert(!memsim_alloc_seed_block(a, seg, 512, 512, 0, &error));
    cr_assert(g_error_matches(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s",
              error ? error->message : "no error");
    g_clear_error(&error);
    MemsimAllocStats after = memsim_alloc_stats(a);
    cr_assert(memcmp(&after, &st, sizeof st) == 0);
    checked(a);
    /* Freeing a seeded block is a device free like any other. */
    fre(a, seg);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 4096, 5120);
    cr_assert_eq(st.n_device_free, 1);
    memsim_addr_t p = mal(a, 100, 0);
    fre(a, p);
    fre(a, seg + 2 * MiB);
    st = memsim_alloc_stats(a);
    EXPECT_STAT(st, allocated, 0, 5120);
    EXPECT_STAT(st, requested, 0, 5096);
    rig_free(&r, a);
}

/* A seeded block may sit where the policy would put its next block (recorded addresses are
 * arbitrary): the addresses handed out must still be new, and the seeded block must stay. */
Test(exact_seed, seeded_address_is_not_handed_out_again)
{
    /* Where a fresh instance puts its first two blocks. */
    Rig r;
    MemsimAlloc *a = rig_new(&r, 0);
    memsim_addr_t first = mal(a, 512, 0);
    memsim_addr_t second = mal(a, 512, 0);
    rig_free(&r, a);

    memsim_addr_t at[] = {first, second};
    for (gsize i = 0; i < G_N_ELEMENTS(at); i++) {
        a = rig_new(&r, 0);
        GError *error = NULL;
        cr_assert(memsim_alloc_seed_block(a, at[i], 1024, 1000, 0, &error), "%s",
                  error ? error->message : "?");
        memsim_addr_t p = mal(a, 512, 0);
        memsim_addr_t q = mal(a, 512, 0);
        cr_assert(p != at[i] && q != at[i],
                  "the seeded address 0x%" G_GINT64_MODIFIER "x was handed out again", at[i]);
        cr_assert_neq(p, q);
        MemsimAllocStats st = memsim_alloc_stats(a);
        EXPECT_STAT(st, allocated, 1024 + 512 + 512, 2048);
        EXPECT_STAT(st, allocations, 3, 3);
        fre(a, p);
        fre(a, at[i]);
        fre(a, q);
        st = memsim_alloc_stats(a);
        EXPECT_STAT(st, allocated, 0, 2048);
        EXPECT_STAT(st, requested, 0, 2024);
        cr_assert_eq(st.n_device_free, 3);
        rig_free(&r, a);
    }
}
