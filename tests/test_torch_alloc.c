/* Unit tests of the `torch` allocator policy (sim/alloc/torch.c).
 *
 * Every expected value is derived by hand from /work/shared/TORCH_ALLOCATOR.md ("§" refers to
 * its sections), never from running the code; the derivation is in the comment next to it.
 * A test drives the allocator through a MemsimDevice whose hooks record the emitted events,
 * hand out scripted segment addresses and decide when cross-stream events complete.
 */
#include <criterion/criterion.h>
#include <memsim/alloc.h>

#include <math.h>
#include <string.h>

#include "testutil.h"

#define KiB ((memsim_size_t)1 << 10)
#define MiB ((memsim_size_t)1 << 20)
#define GiB ((memsim_size_t)1 << 30)

/* ---------------------------------------------------------------------------------------- */
/* The test device */

typedef struct {
    MemsimDevice dev;
    GArray *ev;      /* MemsimAllocEvent, in emission order */
    gboolean manual; /* events complete only when the test says so */
    uint64_t next_token;
    uint64_t done_upto[8]; /* per stream: tokens <= this have completed */
    uint64_t n_recorded;
    memsim_addr_t scripted[16]; /* segment addresses to hand out first, in order */
    int n_scripted, next_scripted;
    memsim_size_t asked[16]; /* sizes asked of segment_addr */
    int n_asked;
    memsim_addr_t bump;
    /* What the events say (the stress test compares it with the stats). */
    int64_t ev_reserved;  /* SEG_ALLOC + SEG_MAP - SEG_FREE - SEG_UNMAP */
    int64_t ev_requested; /* ALLOC - FREE_COMPLETED */
    uint64_t ev_ooms;
} Rig;

static memsim_addr_t rig_segment_addr(void *user, memsim_size_t size, uint32_t stream)
{
    Rig *r = user;
    if (r->n_asked < 16)
        r->asked[r->n_asked++] = size;
    if (r->next_scripted < r->n_scripted)
        return r->scripted[r->next_scripted++];
    memsim_addr_t a = r->bump;
    r->bump += (size + (4 * MiB - 1)) / (2 * MiB) * (2 * MiB) + 2 * MiB;
    return a;
}

static uint64_t rig_record_event(void *user, uint32_t stream)
{
    Rig *r = user;
    r->n_recorded++;
    return ++r->next_token;
}

static gboolean rig_event_done(void *user, uint32_t stream, uint64_t token)
{
    Rig *r = user;
    return !r->manual || token <= r->done_upto[stream % 8];
}

static void rig_on_event(void *user, const MemsimAllocEvent *ev)
{
    Rig *r = user;
    g_array_append_val(r->ev, *ev);
    switch (ev->kind) {
    case MEMSIM_AEV_SEG_ALLOC:
    case MEMSIM_AEV_SEG_MAP:
        r->ev_reserved += (int64_t)ev->size;
        break;
    case MEMSIM_AEV_SEG_FREE:
    case MEMSIM_AEV_SEG_UNMAP:
        r->ev_reserved -= (int64_t)ev->size;
        break;
    case MEMSIM_AEV_ALLOC:
        r->ev_requested += (int64_t)ev->size;
        break;
    case MEMSIM_AEV_FREE_COMPLETED:
        r->ev_requested -= (int64_t)ev->size;
        break;
    case MEMSIM_AEV_OOM:
        r->ev_ooms++;
        break;
    }
}

static MemsimAlloc *rig_new(Rig *r, const char *settings, memsim_size_t capacity)
{
    memset(r, 0, sizeof *r);
    r->dev.capacity = capacity;
    r->dev.segment_addr = rig_segment_addr;
    r->dev.record_event = rig_record_event;
    r->dev.event_done = rig_event_done;
    r->dev.on_event = rig_on_event;
    r->dev.user = r;
    r->ev = g_array_new(FALSE, FALSE, sizeof(MemsimAllocEvent));
    r->bump = (memsim_addr_t)0x7f0000000000ull;
    GError *error = NULL;
    MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("torch"), settings, &r->dev, &error);
    cr_assert(a, "settings '%s': %s", settings, error ? error->message : "?");
    return a;
}

static void rig_free(Rig *r, MemsimAlloc *a)
{
    memsim_alloc_free_instance(a);
    g_array_unref(r->ev);
}

static void script(Rig *r, int n, const memsim_addr_t *addrs)
{
    for (int i = 0; i < n; i++)
        r->scripted[r->n_scripted++] = addrs[i];
}

static void checked(MemsimAlloc *a)
{
    GError *error = NULL;
    cr_assert(memsim_alloc_check(a, &error), "check: %s", error ? error->message : "?");
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

static const char *kind_name(MemsimAllocEventKind k)
{
    static const char *names[] = {"?",         "SEG_ALLOC", "SEG_FREE",       "SEG_MAP",
                                  "SEG_UNMAP", "ALLOC",     "FREE_COMPLETED", "OOM"};
    return (unsigned)k < G_N_ELEMENTS(names) ? names[k] : "?";
}

typedef struct {
    MemsimAllocEventKind kind;
    memsim_addr_t addr;
    memsim_size_t size;
} Ev;

/* The events emitted since index `from` must be exactly `want`. */
static void expect_events(Rig *r, guint from, const Ev *want, guint n)
{
    GString *got = g_string_new(NULL);
    for (guint i = from; i < r->ev->len; i++) {
        MemsimAllocEvent *e = &g_array_index(r->ev, MemsimAllocEvent, i);
        g_string_append_printf(got, "  %s 0x%" G_GINT64_MODIFIER "x %" G_GUINT64_FORMAT "\n",
                               kind_name(e->kind), e->addr, e->size);
    }
    cr_assert_eq(r->ev->len - from, n, "expected %u events, got %u:\n%s", n, r->ev->len - from,
                 got->str);
    for (guint i = 0; i < n; i++) {
        MemsimAllocEvent *e = &g_array_index(r->ev, MemsimAllocEvent, from + i);
        cr_assert(e->kind == want[i].kind && e->addr == want[i].addr && e->size == want[i].size,
                  "event %u: expected %s 0x%" G_GINT64_MODIFIER "x %" G_GUINT64_FORMAT ", got:\n%s",
                  i, kind_name(want[i].kind), want[i].addr, want[i].size, got->str);
    }
    g_string_free(got, TRUE);
}

#define EXPECT(r, from, ...)                                                                       \
    do {                                                                                           \
        const Ev want_[] = {__VA_ARGS__};                                                          \
        expect_events((r), (from), want_, G_N_ELEMENTS(want_));                                    \
    } while (0)

#define EXPECT_NONE(r, from) expect_events((r), (from), NULL, 0)

static MemsimAllocStats stats(MemsimAlloc *a)
{
    return memsim_alloc_stats(a);
}

/* ---------------------------------------------------------------------------------------- */
/* §3.1 round_size */

static memsim_size_t rnd(const char *settings, memsim_size_t size)
{
    GError *error = NULL;
    MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("torch"), settings, NULL, &error);
    cr_assert(a, "%s", error ? error->message : "?");
    memsim_size_t r = memsim_alloc_round_size(a, size);
    memsim_alloc_free_instance(a);
    return r;
}

Test(torch_round, default_512)
{
    /* Below 512 → 512; otherwise up to a multiple of 512. */
    cr_assert_eq(rnd("", 1), 512);
    cr_assert_eq(rnd("", 511), 512);
    cr_assert_eq(rnd("", 512), 512);
    cr_assert_eq(rnd("", 513), 1024);
    cr_assert_eq(rnd("", 1200), 1536);
    cr_assert_eq(rnd("", 700 * KiB), 700 * KiB); /* 716800 = 1400 x 512 */
    cr_assert_eq(rnd("", 3 * MiB + 1), 3 * MiB + 512);
}

Test(torch_round, divisions_single)
{
    /* d=2: 1200 > 512*2 → floor2 = 1024, step 512 → 1536 (the spec's example). */
    cr_assert_eq(rnd("roundup_power2_divisions:2", 1200), 1536);
    /* 1000 <= 1024 = 512*d → plain 512 rounding → 1024. */
    cr_assert_eq(rnd("roundup_power2_divisions:2", 1000), 1024);
    /* 3 MiB + 1: floor2 2 MiB, step 1 MiB → 4 MiB. 3 MiB exactly is a step multiple. */
    cr_assert_eq(rnd("roundup_power2_divisions:2", 3 * MiB + 1), 4 * MiB);
    cr_assert_eq(rnd("roundup_power2_divisions:2", 3 * MiB), 3 * MiB);
    /* Powers of two are unchanged. */
    cr_assert_eq(rnd("roundup_power2_divisions:2", 64 * MiB), 64 * MiB);
    /* d=4: 700 KiB: floor2 512 KiB, step 128 KiB → 768 KiB (the spec's example). */
    cr_assert_eq(rnd("roundup_power2_divisions:4", 700 * KiB), 768 * KiB);
    /* 5 MiB + 1: floor2 4 MiB, step 1 MiB → 6 MiB. */
    cr_assert_eq(rnd("roundup_power2_divisions:4", 5 * MiB + 1), 6 * MiB);
    /* 2000 <= 2048 = 512*4 → 512 rounding → 2048. */
    cr_assert_eq(rnd("roundup_power2_divisions:4", 2000), 2048);
    /* d=1 means no power-of-two rounding. */
    cr_assert_eq(rnd("roundup_power2_divisions:1", 3 * MiB + 1), 3 * MiB + 512);
}

Test(torch_round, divisions_list)
{
    /* [64:2,256:4,>:8]: 64 → index 6, and being first it also fills 0..5 with 2;
     * 256 → index 8 = 4; index 7 keeps the default 0; '>' (newest) fills 9..15 with 8. */
    const char *s = "roundup_power2_divisions:[64:2,256:4,>:8]";
    /* index 0 (d=2): 1 MiB + 1 → floor2 1 MiB, step 512 KiB → 1.5 MiB. */
    cr_assert_eq(rnd(s, MiB + 1), MiB + 512 * KiB);
    /* index 6 (d=2): 100 MiB + 1 → floor2 64 MiB, step 32 MiB → 128 MiB. */
    cr_assert_eq(rnd(s, 100 * MiB + 1), 128 * MiB);
    /* index 7 (d=0): plain 512 rounding. */
    cr_assert_eq(rnd(s, 200 * MiB + 1), 200 * MiB + 512);
    /* index 8 (d=4): 260 MiB + 1 → floor2 256 MiB, step 64 MiB → 320 MiB. (The older
     * semantics, where '>' overwrote the last boundary's entry, would give d=8 → 288 MiB.) */
    cr_assert_eq(rnd(s, 260 * MiB + 1), 320 * MiB);
    /* index 9 (d=8): 600 MiB + 1 → floor2 512 MiB, step 64 MiB → 640 MiB. */
    cr_assert_eq(rnd(s, 600 * MiB + 1), 640 * MiB);
    /* index 15 covers everything >= 32 GiB (d=8): 40 GiB + 1 → step 4 GiB → 44 GiB. */
    cr_assert_eq(rnd(s, 40 * GiB + 1), 44 * GiB);
}

Test(torch_round, divisions_list_edges)
{
    /* '>' alone: no explicit boundary, so it fills entries 1..15; entry 0 (< 2 MiB) stays 0. */
    cr_assert_eq(rnd("roundup_power2_divisions:[>:4]", 700 * KiB), 700 * KiB);
    /* index 1 (d=4): 3 MiB + 1 → floor2 2 MiB, step 512 KiB → 3.5 MiB. */
    cr_assert_eq(rnd("roundup_power2_divisions:[>:4]", 3 * MiB + 1), 3 * MiB + 512 * KiB);
    /* [1:4,>:8]: entry 0 = 4, entries 1..15 = 8: 3 MiB + 1 → step 256 KiB → 3.25 MiB. */
    cr_assert_eq(rnd("roundup_power2_divisions:[1:4,>:8]", 3 * MiB + 1), 3 * MiB + 256 * KiB);
    cr_assert_eq(rnd("roundup_power2_divisions:[1:4,>:8]", 700 * KiB), 768 * KiB);
    /* A boundary beyond the table (65536 MiB → index 16) is clamped to 15 and, being first,
     * fills 0..14: every size uses d=2. */
    cr_assert_eq(rnd("roundup_power2_divisions:[65536:2]", 3 * MiB + 1), 4 * MiB);
    cr_assert_eq(rnd("roundup_power2_divisions:[65536:2]", 40 * GiB + 1), 48 * GiB);
    /* Whitespace is ignored anywhere; 0 disables an interval. */
    cr_assert_eq(rnd(" roundup_power2_divisions : [ 1 : 0 , > : 2 ] ", 3 * MiB + 1), 4 * MiB);
    cr_assert_eq(rnd(" roundup_power2_divisions : [ 1 : 0 , > : 2 ] ", 1200), 1536);
}

/* ---------------------------------------------------------------------------------------- */
/* §3 step 3: segment sizes; §3.4 splitting */

/* The size of the segment the first malloc(size) creates, and the block it allocates. */
static void first_segment(memsim_size_t size, memsim_size_t *seg, memsim_size_t *allocated)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    mal(a, size, 0);
    MemsimAllocEvent *e = &g_array_index(r.ev, MemsimAllocEvent, 0);
    cr_assert_eq(e->kind, MEMSIM_AEV_SEG_ALLOC);
    *seg = e->size;
    *allocated = (memsim_size_t)stats(a).allocated.current;
    rig_free(&r, a);
}

Test(torch_segments, sizes)
{
    static const struct {
        memsim_size_t request, segment, block;
    } cases[] = {
        /* <= 1 MiB (rounded) → small pool, 2 MiB segments, split (>= 512 left). */
        {1, 2 * MiB, 512},
        {MiB, 2 * MiB, MiB},
        /* 1 MiB + 1 rounds to 1 MiB + 512 > 1 MiB → large, 20 MiB; 19 MiB - 512 left > 1 MiB
         * → split. */
        {MiB + 1, 20 * MiB, MiB + 512},
        /* 10 MiB - 512 < 10 MiB → 20 MiB segment, split. */
        {10 * MiB - 512, 20 * MiB, 10 * MiB - 512},
        /* 10 MiB - 511 rounds to exactly 10 MiB → segment of 10 MiB, nothing left. */
        {10 * MiB - 511, 10 * MiB, 10 * MiB},
        {10 * MiB, 10 * MiB, 10 * MiB},
        /* 10 MiB + 1 → 10 MiB + 512 → segment rounded to 2 MiB = 12 MiB; 2 MiB - 512 left
         * > 1 MiB → split. */
        {10 * MiB + 1, 12 * MiB, 10 * MiB + 512},
        /* 11 MiB → 12 MiB segment, exactly 1 MiB left: not > 1 MiB → whole 12 MiB block. */
        {11 * MiB, 12 * MiB, 12 * MiB},
        /* 19 MiB → 20 MiB, 1 MiB left → whole; 19.5 MiB → 20 MiB, 0.5 MiB left → whole. */
        {19 * MiB, 20 * MiB, 20 * MiB},
        {19 * MiB + 512 * KiB, 20 * MiB, 20 * MiB},
        /* 18.5 MiB → 20 MiB, 1.5 MiB left → split. */
        {18 * MiB + 512 * KiB, 20 * MiB, 18 * MiB + 512 * KiB},
        /* 100 MiB + 1 → 100 MiB + 512 → 102 MiB; 2 MiB - 512 left → split. */
        {100 * MiB + 1, 102 * MiB, 100 * MiB + 512},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        memsim_size_t seg, blk;
        first_segment(cases[i].request, &seg, &blk);
        cr_assert_eq(seg, cases[i].segment,
                     "request %" G_GUINT64_FORMAT ": segment %" G_GUINT64_FORMAT, cases[i].request,
                     seg);
        cr_assert_eq(blk, cases[i].block, "request %" G_GUINT64_FORMAT ": block %" G_GUINT64_FORMAT,
                     cases[i].request, blk);
    }
}

Test(torch_split, small_pool)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    /* 1 MiB → small 2 MiB segment S, carved at its low end; 1 MiB left is one inactive split
     * block. */
    memsim_addr_t p = mal(a, MiB, 0);
    memsim_addr_t S = g_array_index(r.ev, MemsimAllocEvent, 0).addr;
    cr_assert_eq(p, S);
    cr_assert_eq(stats(a).inactive_split.current, (int64_t)MiB);
    /* 1 MiB - 512 from the 1 MiB remainder: 512 left >= 512 → split. */
    memsim_addr_t q = mal(a, MiB - 512, 0);
    cr_assert_eq(q, S + MiB);
    cr_assert_eq(stats(a).inactive_split.current, 512);
    /* 512 takes the last 512-byte block whole: no inactive split left, no new segment. */
    memsim_addr_t s = mal(a, 512, 0);
    cr_assert_eq(s, S + 2 * MiB - 512);
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.inactive_split.current, 0);
    cr_assert_eq(st.allocated.current, (int64_t)(2 * MiB));
    cr_assert_eq(st.n_device_alloc, 1);
    rig_free(&r, a);
}

Test(torch_split, large_pool_cached)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    /* 5 MiB → 20 MiB segment split 5 + 15; freeing merges it back into one 20 MiB block. */
    memsim_addr_t p = mal(a, 5 * MiB, 0);
    cr_assert_eq(stats(a).inactive_split.current, (int64_t)(15 * MiB));
    fre(a, p);
    cr_assert_eq(stats(a).inactive_split.current, 0);
    /* 19.5 MiB placed in the cached 20 MiB block: 0.5 MiB left is not > 1 MiB → the caller
     * keeps all 20 MiB; no new segment. */
    memsim_addr_t q = mal(a, 19 * MiB + 512 * KiB, 0);
    cr_assert_eq(q, p);
    cr_assert_eq(stats(a).allocated.current, (int64_t)(20 * MiB));
    cr_assert_eq(stats(a).requested.current, (int64_t)(19 * MiB + 512 * KiB));
    cr_assert_eq(stats(a).n_device_alloc, 1);
    fre(a, q);
    /* 18 MiB from the cached 20 MiB: 2 MiB left > 1 MiB → split. */
    q = mal(a, 18 * MiB, 0);
    cr_assert_eq(stats(a).allocated.current, (int64_t)(18 * MiB));
    cr_assert_eq(stats(a).inactive_split.current, (int64_t)(2 * MiB));
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* §3.2 best fit, streams */

Test(torch_fit, best_fit_then_lowest_address)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    const memsim_addr_t HI = 0x200000000ull, LO = 0x100000000ull;
    script(&r, 2, (memsim_addr_t[]){HI, LO});
    /* a: 20 MiB segment at HI, split 5 + 15; b takes the 15 MiB remainder whole. */
    memsim_addr_t pa = mal(a, 5 * MiB, 0), pb = mal(a, 15 * MiB, 0);
    cr_assert_eq(pa, HI);
    cr_assert_eq(pb, HI + 5 * MiB);
    /* Nothing free: c gets a new segment, which the device places at LO (lower). */
    memsim_addr_t pc = mal(a, 5 * MiB, 0), pd = mal(a, 15 * MiB, 0);
    cr_assert_eq(pc, LO);
    cr_assert_eq(pd, LO + 5 * MiB);
    /* Two free 15 MiB blocks: HI+5 MiB (freed first) and LO+5 MiB. Equal sizes → the lower
     * address wins regardless of age. */
    fre(a, pb);
    fre(a, pd);
    memsim_addr_t pe = mal(a, 15 * MiB, 0);
    cr_assert_eq(pe, LO + 5 * MiB);
    /* Free e and c: LO merges into a whole 20 MiB block. Free blocks: HI+5 (15 MiB) and LO
     * (20 MiB). A 14 MiB request takes the smallest that fits (HI+5), not the lowest address;
     * 1 MiB left is not > 1 MiB → whole 15 MiB block. */
    fre(a, pe);
    fre(a, pc);
    guint n0 = r.ev->len;
    memsim_addr_t pf = mal(a, 14 * MiB, 0);
    cr_assert_eq(pf, HI + 5 * MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_ALLOC, HI + 5 * MiB, 14 * MiB});
    cr_assert_eq(stats(a).allocated.current, (int64_t)(20 * MiB)); /* 5 (a) + 15 (f) */
    rig_free(&r, a);
}

Test(torch_fit, no_cross_stream_reuse)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    memsim_addr_t p = mal(a, 5 * MiB, 0);
    fre(a, p);
    /* Stream 1 never reuses stream 0's cached 20 MiB segment: a second segment is created. */
    guint n0 = r.ev->len;
    memsim_addr_t q = mal(a, 5 * MiB, 1);
    memsim_addr_t S1 = g_array_index(r.ev, MemsimAllocEvent, n0).addr;
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_ALLOC, S1, 20 * MiB}, {MEMSIM_AEV_ALLOC, S1, 5 * MiB});
    cr_assert_neq(S1, p);
    cr_assert_eq(q, S1);
    cr_assert_eq(stats(a).reserved.current, (int64_t)(40 * MiB));
    /* Stream 0 does reuse its own. */
    memsim_addr_t s = mal(a, 5 * MiB, 0);
    cr_assert_eq(s, p);
    cr_assert_eq(stats(a).n_device_alloc, 2);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* §5 record_stream and events */

Test(torch_streams, record_stream_defers_reuse)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    r.manual = TRUE;
    memsim_addr_t p = mal(a, MiB, 0);
    memsim_addr_t S = p; /* first block of the small 2 MiB segment */
    /* Used on stream 1 (twice: a set, one event) and on its own stream (ignored). */
    memsim_alloc_record_stream(a, p, 1);
    memsim_alloc_record_stream(a, p, 1);
    memsim_alloc_record_stream(a, p, 0);
    guint n0 = r.ev->len;
    fre(a, p);
    /* free(): allocated drops at once, the block stays active until stream 1's event
     * completes; no free_completed yet; exactly one event recorded. */
    EXPECT_NONE(&r, n0);
    cr_assert_eq(r.n_recorded, 1);
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.allocated.current, 0);
    cr_assert_eq(st.active.current, (int64_t)MiB);
    cr_assert_eq(st.requested.current, (int64_t)MiB);
    /* The event is not done: the next malloc cannot reuse p and takes the 1 MiB remainder. */
    memsim_addr_t q = mal(a, MiB, 0);
    cr_assert_eq(q, S + MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_ALLOC, S + MiB, MiB});
    /* Stream 1 passes the event: the next malloc first retires it (free_completed with p's
     * address and requested size), then carves 512 bytes from p's now free 1 MiB block. */
    r.done_upto[1] = 1;
    n0 = r.ev->len;
    memsim_addr_t s = mal(a, 512, 0);
    cr_assert_eq(s, S);
    EXPECT(&r, n0, {MEMSIM_AEV_FREE_COMPLETED, S, MiB}, {MEMSIM_AEV_ALLOC, S, 512});
    st = stats(a);
    /* active = q (1 MiB) + s (512); the 1 MiB - 512 rest of p is inactive split. */
    cr_assert_eq(st.active.current, (int64_t)(MiB + 512));
    cr_assert_eq(st.inactive_split.current, (int64_t)(MiB - 512));
    rig_free(&r, a);
}

Test(torch_streams, default_device_completes_at_next_malloc)
{
    /* Without hooks every event completes before the next allocator call (§5.3). */
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    r.dev.record_event = NULL;
    r.dev.event_done = NULL;
    memsim_addr_t p = mal(a, MiB, 0);
    memsim_alloc_record_stream(a, p, 2);
    guint n0 = r.ev->len;
    fre(a, p);
    EXPECT_NONE(&r, n0);
    memsim_addr_t q = mal(a, 2 * KiB, 0);
    EXPECT(&r, n0, {MEMSIM_AEV_FREE_COMPLETED, p, MiB}, {MEMSIM_AEV_ALLOC, p, 2 * KiB});
    cr_assert_eq(q, p);
    rig_free(&r, a);
}

Test(torch_streams, fifo_head_of_line)
{
    /* Two blocks wait on stream 1: the FIFO is popped only while its head is done. */
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    r.manual = TRUE;
    memsim_addr_t p = mal(a, 512 * KiB, 0), q = mal(a, 512 * KiB, 0);
    memsim_alloc_record_stream(a, p, 1);
    memsim_alloc_record_stream(a, q, 1);
    fre(a, p); /* token 1 */
    fre(a, q); /* token 2 */
    /* Only token 2 "done" (out of order): the head (token 1) blocks, nothing retires. */
    r.done_upto[1] = 0;
    guint n0 = r.ev->len;
    mal(a, 512, 0);
    cr_assert_eq(g_array_index(r.ev, MemsimAllocEvent, n0).kind, MEMSIM_AEV_ALLOC);
    r.done_upto[1] = 2;
    n0 = r.ev->len;
    memsim_addr_t s = mal(a, 512, 0);
    /* Both retire in FIFO order; q merges with p into [p, p + 1 MiB). The segment is then
     * [p: 1 MiB free][512 allocated][1 MiB - 512 free]: best fit for 512 is the smaller free
     * block, right after the 512 bytes allocated above. */
    EXPECT(&r, n0, {MEMSIM_AEV_FREE_COMPLETED, p, 512 * KiB},
           {MEMSIM_AEV_FREE_COMPLETED, q, 512 * KiB}, {MEMSIM_AEV_ALLOC, p + MiB + 512, 512});
    cr_assert_eq(s, p + MiB + 512);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* §3.2 step 4 and §4.2: max_split_size */

Test(torch_max_split, small_request_avoids_oversize_block)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "max_split_size_mb:40", 0);
    memsim_addr_t p = mal(a, 50 * MiB, 0); /* 50 MiB segment, >= 40 MiB: oversize */
    fre(a, p);
    /* 12 MiB < 40 MiB may not take the 50 MiB block → new 12 MiB segment. */
    guint n0 = r.ev->len;
    memsim_addr_t q = mal(a, 12 * MiB, 0);
    cr_assert_neq(q, p);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_ALLOC, q, 12 * MiB}, {MEMSIM_AEV_ALLOC, q, 12 * MiB});
    cr_assert_eq(stats(a).reserved.current, (int64_t)(62 * MiB));
    fre(a, q);
    /* 45 MiB >= 40: the 50 MiB block wastes 5 < 20 MiB → taken, never split (size >=
     * max_split_size) → allocated 50 MiB. */
    n0 = r.ev->len;
    memsim_addr_t s = mal(a, 45 * MiB, 0);
    cr_assert_eq(s, p);
    EXPECT(&r, n0, {MEMSIM_AEV_ALLOC, p, 45 * MiB});
    cr_assert_eq(stats(a).allocated.current, (int64_t)(50 * MiB));
    rig_free(&r, a);
}

Test(torch_max_split, oversize_request_waste_limit)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "max_split_size_mb:40", 0);
    memsim_addr_t p = mal(a, 70 * MiB, 0);
    fre(a, p);
    /* 50 MiB: the 70 MiB block is >= 50 + 20 → refused → new 50 MiB segment. */
    guint n0 = r.ev->len;
    memsim_addr_t q = mal(a, 50 * MiB, 0);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_ALLOC, q, 50 * MiB}, {MEMSIM_AEV_ALLOC, q, 50 * MiB});
    fre(a, q);
    /* 50.5 MiB: the 50 MiB block is too small; 70 < 50.5 + 20 → the 70 MiB block is taken. */
    n0 = r.ev->len;
    memsim_addr_t s = mal(a, 50 * MiB + 512 * KiB, 0);
    cr_assert_eq(s, p);
    EXPECT(&r, n0, {MEMSIM_AEV_ALLOC, p, 50 * MiB + 512 * KiB});
    rig_free(&r, a);
}

Test(torch_max_split, non_split_rounding_setting)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "max_split_size_mb:40,max_non_split_rounding_mb:30", 0);
    memsim_addr_t p = mal(a, 70 * MiB, 0);
    fre(a, p);
    /* With 30 MiB tolerance, a 50 MiB request takes the 70 MiB block (70 < 80). */
    memsim_addr_t q = mal(a, 50 * MiB, 0);
    cr_assert_eq(q, p);
    rig_free(&r, a);
}

Test(torch_max_split, release_available_one_block)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "max_split_size_mb:40", 100 * MiB);
    memsim_addr_t x = mal(a, 80 * MiB, 0);
    fre(a, x);
    /* 30 MiB may not take the oversize 80 MiB block; cudaMalloc(30) fails (80 + 30 > 100).
     * release_available_cached_blocks: key = max(30, 40) = 40 → the first block >= 40 is the
     * 80 MiB one → released alone; the retry succeeds. No synchronisation, no counted retry. */
    guint n0 = r.ev->len;
    memsim_addr_t q = mal(a, 30 * MiB, 0);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_FREE, x, 80 * MiB}, {MEMSIM_AEV_SEG_ALLOC, q, 30 * MiB},
           {MEMSIM_AEV_ALLOC, q, 30 * MiB});
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.n_sync_all_streams, 0);
    cr_assert_eq(st.n_alloc_retries, 0);
    cr_assert_eq(st.reserved.current, (int64_t)(30 * MiB));
    /* The peak saw 80 MiB (nothing higher: the failed cudaMalloc added nothing). */
    cr_assert_eq(st.reserved.peak, (int64_t)(80 * MiB));
    rig_free(&r, a);
}

Test(torch_max_split, release_available_largest_first)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "max_split_size_mb:40", 120 * MiB);
    memsim_addr_t x = mal(a, 44 * MiB, 0), y = mal(a, 50 * MiB, 0);
    fre(a, x);
    fre(a, y);
    /* 60 MiB: no cached block >= 60; cudaMalloc fails (94 + 60 > 120). Key 60: no block
     * >= 60 → back up to the largest of this stream (50 MiB) and walk down releasing oversize
     * blocks until 60 are released: 50 (50 < 60), then 44 (94 >= 60) → true; retry OK. */
    guint n0 = r.ev->len;
    memsim_addr_t z = mal(a, 60 * MiB, 0);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_FREE, y, 50 * MiB}, {MEMSIM_AEV_SEG_FREE, x, 44 * MiB},
           {MEMSIM_AEV_SEG_ALLOC, z, 60 * MiB}, {MEMSIM_AEV_ALLOC, z, 60 * MiB});
    cr_assert_eq(stats(a).n_sync_all_streams, 0);
    rig_free(&r, a);
}

Test(torch_max_split, release_available_insufficient_then_release_cached)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "max_split_size_mb:40", 100 * MiB);
    memsim_addr_t x = mal(a, 44 * MiB, 0), y = mal(a, 12 * MiB, 0);
    fre(a, x);
    fre(a, y);
    /* 50 MiB: cached 12 and 44 are too small; 56 + 50 > 100 fails. Key 50: back up to 44
     * (oversize, this stream) → released (44 < 50); next is 12 < 40 → stop → false, but the
     * 44 MiB stay released. Then release_cached_blocks frees the whole 12 MiB segment, and
     * the counted retry succeeds. */
    guint n0 = r.ev->len;
    memsim_addr_t z = mal(a, 50 * MiB, 0);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_FREE, x, 44 * MiB}, {MEMSIM_AEV_SEG_FREE, y, 12 * MiB},
           {MEMSIM_AEV_SEG_ALLOC, z, 50 * MiB}, {MEMSIM_AEV_ALLOC, z, 50 * MiB});
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.n_sync_all_streams, 1);
    cr_assert_eq(st.n_alloc_retries, 1);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* §6 garbage collection */

#define GC_SETTINGS "garbage_collection_threshold:0.5,per_process_memory_fraction:0.5"

Test(torch_gc, releases_oldest_single_pass)
{
    Rig r;
    /* allowed = 0.5 x 400 MiB = 200 MiB; GC limit = 0.5 x 200 = 100 MiB. The large pool's
     * clock ticks at every get_free_block of the large pool. */
    MemsimAlloc *a = rig_new(&r, GC_SETTINGS, 400 * MiB);
    memsim_addr_t pa = mal(a, 40 * MiB, 0); /* clock 1: miss, total 40 */
    memsim_addr_t pb = mal(a, 20 * MiB, 0); /* clock 2: miss, total 60 */
    memsim_addr_t pc = mal(a, 22 * MiB, 0); /* clock 3: miss, total 82 */
    fre(a, pa);                             /* a cached at clock 3 */
    mal(a, 42 * MiB, 0); /* clock 4: a (40) too small; GC: 82 <= 100 → nothing; total 124 */
    fre(a, pb);          /* cached at clock 4 */
    fre(a, pc);          /* cached at clock 4 */
    /* clock 5: 50 MiB misses. GC: total 124 > 100 → target 24. Ages b 1, c 1, a 2 → mean
     * 4/3. One pass in pool order (20, 22, 40): only a (age 2) is released; 40 >= 24 → stop.
     * Then cudaMalloc(50): 84 + 50 <= 200. */
    guint n0 = r.ev->len;
    memsim_addr_t pe = mal(a, 50 * MiB, 0);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_FREE, pa, 40 * MiB}, {MEMSIM_AEV_SEG_ALLOC, pe, 50 * MiB},
           {MEMSIM_AEV_ALLOC, pe, 50 * MiB});
    cr_assert_eq(stats(a).reserved.current, (int64_t)(134 * MiB));
    rig_free(&r, a);
}

Test(torch_gc, threshold_age_loop)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, GC_SETTINGS, 400 * MiB);
    memsim_addr_t pa = mal(a, 12 * MiB, 0); /* clock 1, total 12 */
    memsim_addr_t pb = mal(a, 14 * MiB, 0); /* clock 2, total 26 */
    memsim_addr_t pc = mal(a, 16 * MiB, 0); /* clock 3, total 42 */
    fre(a, pa);                             /* cached at clock 3 */
    mal(a, 72 * MiB, 0); /* clock 4: miss; GC: 42 <= 100 → nothing; total 114 */
    fre(a, pb);          /* cached at clock 4 */
    fre(a, pc);          /* cached at clock 4 */
    /* clock 5: 50 MiB misses. GC: 114 > 100 → target 14. Ages a 2, b 1, c 1: mean 4/3 →
     * pass 1 releases a only (12 < 14, go on); mean of the rest 2/2 = 1 → pass 2 releases b
     * and c (pool order 14, 16). Then cudaMalloc(50): 72 + 50 <= 200. */
    guint n0 = r.ev->len;
    memsim_addr_t py = mal(a, 50 * MiB, 0);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_FREE, pa, 12 * MiB}, {MEMSIM_AEV_SEG_FREE, pb, 14 * MiB},
           {MEMSIM_AEV_SEG_FREE, pc, 16 * MiB}, {MEMSIM_AEV_SEG_ALLOC, py, 50 * MiB},
           {MEMSIM_AEV_ALLOC, py, 50 * MiB});
    rig_free(&r, a);
}

Test(torch_gc, needs_a_fraction)
{
    /* Same steps without a memory fraction: GC never runs (§6: only with an active
     * fraction), so the 50 MiB request simply gets a new segment. */
    Rig r;
    MemsimAlloc *a = rig_new(&r, "garbage_collection_threshold:0.5", 400 * MiB);
    memsim_addr_t pa = mal(a, 12 * MiB, 0), pb = mal(a, 14 * MiB, 0), pc = mal(a, 16 * MiB, 0);
    fre(a, pa);
    mal(a, 72 * MiB, 0);
    fre(a, pb);
    fre(a, pc);
    guint n0 = r.ev->len;
    memsim_addr_t py = mal(a, 50 * MiB, 0);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_ALLOC, py, 50 * MiB}, {MEMSIM_AEV_ALLOC, py, 50 * MiB});
    rig_free(&r, a);
}

Test(torch_gc, fraction_limits_cudamalloc)
{
    Rig r;
    /* allowed = 0.5 x 100 MiB = 50 MiB: the second 30 MiB segment would make 60 > 50 → fails
     * without a driver call, nothing to release → OOM with device free = 100 - 30 MiB. */
    MemsimAlloc *a = rig_new(&r, "per_process_memory_fraction:0.5", 100 * MiB);
    mal(a, 30 * MiB, 0);
    guint n0 = r.ev->len;
    memsim_addr_t p;
    cr_assert_eq(memsim_alloc_malloc(a, 30 * MiB, 0, &p), MEMSIM_ALLOC_OOM);
    checked(a);
    EXPECT(&r, n0, {MEMSIM_AEV_OOM, 70 * MiB, 30 * MiB});
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.n_ooms, 1);
    cr_assert_eq(st.n_alloc_retries, 1);
    cr_assert_eq(st.n_sync_all_streams, 1);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* §3 step 5 / §4.1: the OOM path, empty_cache */

Test(torch_oom, release_cached_order_then_oom)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 100 * MiB);
    const memsim_addr_t A1 = 0x1000000000ull, A2 = 0x2000000000ull, A3 = 0x4000000000ull,
                        A4 = 0x3000000000ull, B1 = 0x5000000000ull, B2 = 0x6000000000ull,
                        C = 0x7000000000ull, W = 0x8000000000ull;
    script(&r, 8, (memsim_addr_t[]){A1, A2, A3, A4, B1, B2, C, W});
    memsim_addr_t x1 = mal(a, 12 * MiB, 1); /* A1, stream 1 */
    memsim_addr_t x2 = mal(a, 14 * MiB, 0); /* A2 */
    memsim_addr_t x3 = mal(a, 12 * MiB, 0); /* A3 */
    memsim_addr_t x4 = mal(a, 12 * MiB, 0); /* A4: lower address than A3 */
    memsim_addr_t y1 = mal(a, 1000, 0);     /* B1, small */
    memsim_addr_t y2 = mal(a, 1000, 1);     /* B2, small, stream 1 */
    memsim_addr_t z = mal(a, 5 * MiB, 0);   /* C: 20 MiB, 15 MiB split off and free */
    cr_assert_eq(z, C);
    memsim_addr_t all[] = {x1, x2, x3, x4, y1, y2};
    for (gsize i = 0; i < G_N_ELEMENTS(all); i++)
        fre(a, all[i]);
    cr_assert_eq(stats(a).reserved.current, (int64_t)(74 * MiB));
    /* 50 MiB: nothing cached fits; 74 + 50 > 100 → cudaMalloc fails; release_available is a
     * no-op (max_split_size unlimited); release_cached_blocks frees whole free segments, large
     * pool first in (stream, size, address) order: (0, 12, A4), (0, 12, A3), (0, 14, A2) —
     * C's free 15 MiB is split and stays — then (1, 12, A1); then the small pool: (0, B1),
     * (1, B2). The counted retry: 20 + 50 <= 100. */
    guint n0 = r.ev->len;
    memsim_addr_t w = mal(a, 50 * MiB, 0);
    cr_assert_eq(w, W);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_FREE, A4, 12 * MiB}, {MEMSIM_AEV_SEG_FREE, A3, 12 * MiB},
           {MEMSIM_AEV_SEG_FREE, A2, 14 * MiB}, {MEMSIM_AEV_SEG_FREE, A1, 12 * MiB},
           {MEMSIM_AEV_SEG_FREE, B1, 2 * MiB}, {MEMSIM_AEV_SEG_FREE, B2, 2 * MiB},
           {MEMSIM_AEV_SEG_ALLOC, W, 50 * MiB}, {MEMSIM_AEV_ALLOC, W, 50 * MiB});
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.n_alloc_retries, 1);
    cr_assert_eq(st.n_sync_all_streams, 1);
    cr_assert_eq(st.reserved.current, (int64_t)(70 * MiB));
    cr_assert_eq(st.reserved.peak, (int64_t)(74 * MiB));
    cr_assert_eq(st.segments.current, 2);
    /* 40 MiB: only C's split 15 MiB is free; 70 + 40 > 100; nothing releasable → OOM with
     * device free = 100 - 70 = 30 MiB and the rounded size. */
    n0 = r.ev->len;
    memsim_addr_t v;
    cr_assert_eq(memsim_alloc_malloc(a, 40 * MiB, 0, &v), MEMSIM_ALLOC_OOM);
    checked(a);
    EXPECT(&r, n0, {MEMSIM_AEV_OOM, 30 * MiB, 40 * MiB});
    st = stats(a);
    cr_assert_eq(st.n_ooms, 1);
    cr_assert_eq(st.n_alloc_retries, 2);
    cr_assert_eq(st.n_sync_all_streams, 2);
    rig_free(&r, a);
}

Test(torch_oom, rounded_size_in_oom_event)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 10 * MiB);
    memsim_addr_t p;
    /* 1.5 MiB → large pool, 20 MiB segment > 10 MiB capacity → OOM, size = rounded 1.5 MiB,
     * device free = 10 MiB. */
    cr_assert_eq(memsim_alloc_malloc(a, MiB + 512 * KiB - 100, 0, &p), MEMSIM_ALLOC_OOM);
    EXPECT(&r, 0, {MEMSIM_AEV_OOM, 10 * MiB, MiB + 512 * KiB});
    checked(a);
    rig_free(&r, a);
}

Test(torch_oom, empty_cache_order_with_pending_event)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    r.manual = TRUE;
    const memsim_addr_t SA = 0x1000000000ull, SB = 0x2000000000ull, SC = 0x3000000000ull;
    script(&r, 3, (memsim_addr_t[]){SA, SB, SC});
    memsim_addr_t pa = mal(a, 12 * MiB, 0); /* SA: 12 MiB segment */
    memsim_addr_t pb = mal(a, 1000, 0);     /* SB: small */
    memsim_addr_t pc = mal(a, 14 * MiB, 1); /* SC: stream 1 */
    memsim_alloc_record_stream(a, pa, 1);
    fre(a, pa); /* pending: its event on stream 1 is not done */
    fre(a, pb);
    fre(a, pc);
    guint n0 = r.ev->len;
    memsim_alloc_empty_cache(a);
    checked(a);
    /* Synchronise first: pa completes (free_completed), then large pool in order
     * (0, 12, SA), (1, 14, SC), then the small pool (0, SB). */
    EXPECT(&r, n0, {MEMSIM_AEV_FREE_COMPLETED, SA, 12 * MiB}, {MEMSIM_AEV_SEG_FREE, SA, 12 * MiB},
           {MEMSIM_AEV_SEG_FREE, SC, 14 * MiB}, {MEMSIM_AEV_SEG_FREE, SB, 2 * MiB});
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.reserved.current, 0);
    cr_assert_eq(st.active.current, 0);
    cr_assert_eq(st.n_sync_all_streams, 1);
    cr_assert_eq(st.n_device_free, 3);
    rig_free(&r, a);
}

Test(torch_oom, empty_cache_keeps_split_segments)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    memsim_addr_t p = mal(a, 5 * MiB, 0);
    memsim_addr_t q = mal(a, 5 * MiB, 0); /* same segment, p + 5 MiB */
    cr_assert_eq(q, p + 5 * MiB);
    fre(a, p);
    guint n0 = r.ev->len;
    memsim_alloc_empty_cache(a);
    /* The segment still holds q: nothing is released; 5 + 10 MiB are inactive split. */
    EXPECT_NONE(&r, n0);
    cr_assert_eq(stats(a).reserved.current, (int64_t)(20 * MiB));
    cr_assert_eq(stats(a).inactive_split.current, (int64_t)(15 * MiB));
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* §8 expandable segments */

Test(torch_expandable, real_example_and_unmap_all)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "expandable_segments:True", 0);
    const memsim_addr_t B = 0x10000000000ull, B2 = 0x40000000000ull;
    script(&r, 2, (memsim_addr_t[]){B, B2});
    /* 16 MiB in the large pool: a new VA reservation of ceil(1.125 x 80 GiB / 20 MiB) = 4608
     * pages = 90 GiB (capacity unlimited → the 80 GiB default); map one 20 MiB page at its
     * base; allocate 16 MiB there. */
    memsim_addr_t pa = mal(a, 16 * MiB, 0);
    cr_assert_eq(r.asked[0], 90 * GiB);
    cr_assert_eq(pa, B);
    EXPECT(&r, 0, {MEMSIM_AEV_SEG_MAP, B, 20 * MiB}, {MEMSIM_AEV_ALLOC, B, 16 * MiB});
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.reserved.current, (int64_t)(20 * MiB));
    /* PyTorch's segment stat is not used (§8.1); the model counts the mapped run (§1, §8.5:
     * see segments_are_mapped_runs) */
    cr_assert_eq(st.segments.current, 1);
    cr_assert_eq(st.n_device_alloc, 1);
    /* Next 16 MiB: the 4 MiB free tail plus unmapped space → map one more page; the
     * allocation starts at base + 16 MiB (the real trace example of §8.2). */
    guint n0 = r.ev->len;
    memsim_addr_t pb = mal(a, 16 * MiB, 0);
    cr_assert_eq(pb, B + 16 * MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_MAP, B + 20 * MiB, 20 * MiB},
           {MEMSIM_AEV_ALLOC, B + 16 * MiB, 16 * MiB});
    st = stats(a);
    cr_assert_eq(st.reserved.current, (int64_t)(40 * MiB));
    cr_assert_eq(st.allocated.current, (int64_t)(32 * MiB)); /* split at >= 512: exact sizes */
    cr_assert_eq(st.inactive_split.current, 0);              /* not counted for expandable */
    MemsimAllocShape sh = memsim_alloc_shape(a);
    cr_assert_eq(sh.largest_free, 8 * MiB);
    cr_assert_eq(sh.n_free_blocks, 1);
    cr_assert_eq(sh.n_segments, 1);
    /* Free both: one free block [B, B + 40 MiB). empty_cache unmaps its two whole pages in one
     * call; the reservation is then entirely unmapped and released (no event). */
    fre(a, pa);
    fre(a, pb);
    n0 = r.ev->len;
    memsim_alloc_empty_cache(a);
    checked(a);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_UNMAP, B, 40 * MiB});
    st = stats(a);
    cr_assert_eq(st.reserved.current, 0);
    cr_assert_eq(st.n_device_free, 1);
    cr_assert_eq(memsim_alloc_shape(a).n_segments, 0);
    /* A new request needs a new reservation. */
    n0 = r.ev->len;
    mal(a, 16 * MiB, 0);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_MAP, B2, 20 * MiB}, {MEMSIM_AEV_ALLOC, B2, 16 * MiB});
    rig_free(&r, a);
}

/* The segment count with expandable segments. A segment is one contiguous range obtained from
 * the driver: with expandable segments, one contiguous *mapped* range of a VA reservation
 * (§1), which is also what a snapshot lists as a segment (§8.5); each page mapping is a
 * driver allocation (num_device_alloc, §8.2 step 4). PyTorch's own `segment` stat is left
 * at 0 in this mode (§8.1), which would make the report's "segments: peak" 0 beside dozens
 * of driver allocations; the model counts the mapped runs instead. */
static void same_as_shape(MemsimAlloc *a)
{
    cr_assert_eq(stats(a).segments.current, (int64_t)memsim_alloc_shape(a).n_segments,
                 "segments %" G_GINT64_FORMAT ", the layout shows %" G_GUINT64_FORMAT,
                 stats(a).segments.current, memsim_alloc_shape(a).n_segments);
}

Test(torch_expandable, segments_are_mapped_runs)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "expandable_segments:True", 0);
    const memsim_addr_t B = 0x10000000000ull, S = 0x30000000000ull;
    script(&r, 2, (memsim_addr_t[]){B, S});
    /* 20 MiB (large pool): a new reservation at B, page 0 mapped, the block is the whole
     * page (nothing left to split off). One mapped run → 1 segment. */
    memsim_addr_t pa = mal(a, 20 * MiB, 0);
    cr_assert_eq(pa, B);
    cr_assert_eq(stats(a).segments.current, 1);
    same_as_shape(a);
    /* 20 MiB twice more: no free block; the lowest unmapped range [B+20, ...) has an allocated
     * predecessor, so it is the candidate; one page is mapped right after the run, which
     * grows: still 1 segment, 3 driver allocations. */
    memsim_addr_t pb = mal(a, 20 * MiB, 0);
    memsim_addr_t pc = mal(a, 20 * MiB, 0);
    cr_assert_eq(pb, B + 20 * MiB);
    cr_assert_eq(pc, B + 40 * MiB);
    cr_assert_eq(stats(a).segments.current, 1);
    cr_assert_eq(stats(a).n_device_alloc, 3);
    same_as_shape(a);
    /* 1000 bytes (small pool): a reservation of its own at S, one 2 MiB page → 2 segments. */
    memsim_addr_t ps = mal(a, 1000, 0);
    cr_assert_eq(ps, S);
    cr_assert_eq(stats(a).segments.current, 2);
    same_as_shape(a);
    /* Free the middle page's block and empty the cache: [B+20, B+40) holds one whole page and
     * is unmapped; the small pool's free rest [S+1024, S+2 MiB) holds no whole page. The
     * large reservation's mapped space is now two runs, [B, B+20) and [B+40, B+60): with the
     * small one, 3 segments, the peak. */
    fre(a, pb);
    guint n0 = r.ev->len;
    memsim_alloc_empty_cache(a);
    checked(a);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_UNMAP, B + 20 * MiB, 20 * MiB});
    cr_assert_eq(stats(a).segments.current, 3);
    cr_assert_eq(stats(a).segments.peak, 3);
    same_as_shape(a);
    /* 20 MiB: the hole is the lowest unmapped range and fits: page 1 is mapped again and
     * joins both runs into one → 2 segments; the peak stays 3. */
    n0 = r.ev->len;
    memsim_addr_t pd = mal(a, 20 * MiB, 0);
    cr_assert_eq(pd, B + 20 * MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_MAP, B + 20 * MiB, 20 * MiB},
           {MEMSIM_AEV_ALLOC, B + 20 * MiB, 20 * MiB});
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.segments.current, 2);
    cr_assert_eq(st.segments.peak, 3);
    cr_assert_eq(st.n_device_alloc, 5);
    cr_assert_eq(st.n_device_free, 1);
    same_as_shape(a);
    /* Everything freed and the cache emptied: every page unmapped, both reservations given
     * back → 0 segments. */
    fre(a, pa);
    fre(a, pc);
    fre(a, pd);
    fre(a, ps);
    memsim_alloc_empty_cache(a);
    checked(a);
    cr_assert_eq(stats(a).segments.current, 0);
    cr_assert_eq(stats(a).reserved.current, 0);
    same_as_shape(a);
    rig_free(&r, a);
}

Test(torch_expandable, unmap_whole_pages_only_and_refill_holes)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "expandable_segments:True", 0);
    const memsim_addr_t B = 0x10000000000ull;
    script(&r, 1, (memsim_addr_t[]){B});
    memsim_addr_t pa = mal(a, 16 * MiB, 0); /* B, maps page 0 */
    memsim_addr_t pb = mal(a, 16 * MiB, 0); /* B + 16, maps page 1 */
    /* 30 MiB: the 8 MiB free tail at B+32 + unmapped space. Map min(22 MiB, ...) from B+40,
     * rounded to pages [2, ceil(62/20) = 4) = 40 MiB; merged with the tail → 48 MiB block at
     * B+32; 30 MiB carved → the free rest is [B+62, B+80). */
    guint n0 = r.ev->len;
    memsim_addr_t pc = mal(a, 30 * MiB, 0);
    cr_assert_eq(pc, B + 32 * MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_MAP, B + 40 * MiB, 40 * MiB},
           {MEMSIM_AEV_ALLOC, B + 32 * MiB, 30 * MiB});
    fre(a, pb);
    fre(a, pa); /* free [B, B+32) */
    /* empty_cache, pool order (18 MiB @ B+62), (32 MiB @ B): the first holds no whole page
     * (ceil(62/20) = 4 = floor(80/20)); the second holds page 0 only → unmap [B, B+20); the
     * 12 MiB [B+20, B+32) stays mapped and free. */
    n0 = r.ev->len;
    memsim_alloc_empty_cache(a);
    checked(a);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_UNMAP, B, 20 * MiB});
    cr_assert_eq(stats(a).reserved.current, (int64_t)(60 * MiB));
    MemsimAllocShape sh = memsim_alloc_shape(a);
    cr_assert_eq(sh.n_free_blocks, 2);
    cr_assert_eq(sh.largest_free, 18 * MiB);
    cr_assert_eq(sh.n_segments, 1); /* one mapped run [B+20, B+80) */
    /* 16 MiB: best fit among free mapped blocks (12 @ B+20, 18 @ B+62) → B+62; it borders
     * unmapped space but no other block fits, so it is taken. No mapping. */
    n0 = r.ev->len;
    memsim_addr_t pd = mal(a, 16 * MiB, 0);
    cr_assert_eq(pd, B + 62 * MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_ALLOC, B + 62 * MiB, 16 * MiB});
    /* 24 MiB: free blocks 12 and 2 MiB are too small. find_expandable_block walks unmapped
     * ranges by address: [B, B+20) first; its run with the free 12 MiB after it holds 32 MiB
     * >= 24 → map page 0 again (the hole is refilled first), merge → [B, B+32), carve. */
    n0 = r.ev->len;
    memsim_addr_t pe = mal(a, 24 * MiB, 0);
    cr_assert_eq(pe, B);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_MAP, B, 20 * MiB}, {MEMSIM_AEV_ALLOC, B, 24 * MiB});
    rig_free(&r, a);
}

Test(torch_expandable, xsize_walk_prefers_block_not_bordering_unmapped)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "expandable_segments:True", 0);
    const memsim_addr_t B = 0x10000000000ull;
    script(&r, 1, (memsim_addr_t[]){B});
    mal(a, 20 * MiB, 0);                    /* B: page 0, whole */
    memsim_addr_t py = mal(a, 20 * MiB, 0); /* B+20: page 1 */
    mal(a, 20 * MiB, 0);                    /* B+40: page 2 (a guard) */
    memsim_addr_t pw = mal(a, 2 * MiB, 0);  /* B+60: page 3, free rest X = [B+62, 18 MiB) */
    cr_assert_eq(py, B + 20 * MiB);
    cr_assert_eq(pw, B + 60 * MiB);
    fre(a, py); /* Y = [B+20, 20 MiB), between allocated blocks */
    /* 16 MiB: lower bound finds X (18 MiB) first; xsize(X) = 18 MiB + the unmapped rest of
     * the reservation, xsize(Y) = 20 MiB < xsize(X) → walk on to Y and take it. */
    guint n0 = r.ev->len;
    memsim_addr_t pm = mal(a, 16 * MiB, 0);
    cr_assert_eq(pm, B + 20 * MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_ALLOC, B + 20 * MiB, 16 * MiB});
    rig_free(&r, a);
}

Test(torch_expandable, free_tail_starts_the_candidate)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "expandable_segments:True", 0);
    const memsim_addr_t B = 0x10000000000ull;
    script(&r, 1, (memsim_addr_t[]){B});
    mal(a, 2 * MiB, 0); /* B, page 0 mapped, free tail [B+2, 18 MiB) */
    /* 21 MiB: the tail is too small. find_expandable_block starts the candidate at the free
     * block before the unmapped range, so only min(21 - 18, ...) = 3 MiB more are mapped,
     * rounded to one page: [B+20, B+40). (Starting at the unmapped range itself would map
     * ceil(21/20) = 2 pages.) The merged block [B+2, 38 MiB) gives 21 MiB at B+2. */
    guint n0 = r.ev->len;
    memsim_addr_t p = mal(a, 21 * MiB, 0);
    cr_assert_eq(p, B + 2 * MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_MAP, B + 20 * MiB, 20 * MiB},
           {MEMSIM_AEV_ALLOC, B + 2 * MiB, 21 * MiB});
    cr_assert_eq(stats(a).reserved.current, (int64_t)(40 * MiB));
    rig_free(&r, a);
}

Test(torch_expandable, splits_any_remainder)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "expandable_segments:True", 0);
    /* 19.5 MiB in a 20 MiB page: with expandable segments the large pool splits whenever
     * >= 512 bytes remain (§3.4), so allocated is the rounded request, not 20 MiB. */
    memsim_addr_t p = mal(a, 19 * MiB + 512 * KiB, 0);
    cr_assert_eq(stats(a).allocated.current, (int64_t)(19 * MiB + 512 * KiB));
    cr_assert_eq(stats(a).inactive_split.current, 0);
    /* A 1.5 MiB request (large pool) does not fit in the 0.5 MiB rest. */
    guint n0 = r.ev->len;
    memsim_addr_t q = mal(a, MiB + 512 * KiB, 0);
    /* Candidate: the free 0.5 MiB tail before the unmapped range; map min(1 MiB, ...) → one
     * page; the allocation starts at the tail. */
    cr_assert_eq(q, p + 19 * MiB + 512 * KiB);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_MAP, p + 20 * MiB, 20 * MiB},
           {MEMSIM_AEV_ALLOC, q, MiB + 512 * KiB});
    rig_free(&r, a);
}

Test(torch_expandable, small_pool_pages)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "expandable_segments:True", 8 * GiB);
    const memsim_addr_t B = 0x10000000000ull;
    script(&r, 1, (memsim_addr_t[]){B});
    /* Small pool pages are 2 MiB; reservation = ceil(9 GiB / 2 MiB) pages = 9 GiB. */
    memsim_addr_t p = mal(a, 1000, 0);
    cr_assert_eq(r.asked[0], 9 * GiB);
    EXPECT(&r, 0, {MEMSIM_AEV_SEG_MAP, B, 2 * MiB}, {MEMSIM_AEV_ALLOC, B, 1000});
    cr_assert_eq(p, B);
    rig_free(&r, a);
}

Test(torch_expandable, capacity_limits_mapping)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "expandable_segments:True", 50 * MiB);
    const memsim_addr_t B = 0x10000000000ull;
    script(&r, 1, (memsim_addr_t[]){B});
    mal(a, 30 * MiB, 0); /* maps 2 pages = 40 MiB */
    /* 15 MiB: free tail 10 MiB at B+30 + unmapped; mapping one more page (60 > 50) fails;
     * empty_cache has nothing to unmap (the tail holds no whole page) → OOM, device free =
     * 50 - 40 = 10 MiB. */
    guint n0 = r.ev->len;
    memsim_addr_t p;
    cr_assert_eq(memsim_alloc_malloc(a, 15 * MiB, 0, &p), MEMSIM_ALLOC_OOM);
    checked(a);
    EXPECT(&r, n0, {MEMSIM_AEV_OOM, 10 * MiB, 15 * MiB});
    /* 10 MiB fits in the tail. */
    memsim_addr_t q = mal(a, 10 * MiB, 0);
    cr_assert_eq(q, B + 30 * MiB);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* §9 statistics */

Test(torch_stats, invariants_and_peaks)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    memsim_addr_t p = mal(a, 3 * MiB + 100, 0); /* 3 MiB + 512 in a 20 MiB segment */
    memsim_addr_t q = mal(a, 700, 0);           /* 1024 in a 2 MiB small segment */
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.allocated.current, (int64_t)(3 * MiB + 512 + 1024));
    cr_assert_eq(st.requested.current, (int64_t)(3 * MiB + 100 + 700));
    cr_assert_eq(st.reserved.current, (int64_t)(22 * MiB));
    /* Inactive split: 20 - 3 MiB - 512 plus 2 MiB - 1024, two blocks. */
    cr_assert_eq(st.inactive_split.current, (int64_t)(17 * MiB - 512 + 2 * MiB - 1024));
    cr_assert_eq(st.allocations.current, 2);
    cr_assert_eq(st.segments.current, 2);
    fre(a, p);
    fre(a, q);
    st = stats(a);
    cr_assert_eq(st.allocated.current, 0);
    cr_assert_eq(st.allocated.peak, (int64_t)(3 * MiB + 512 + 1024));
    cr_assert_eq(st.inactive_split.current, 0);
    cr_assert_eq(st.inactive_split.peak, (int64_t)(17 * MiB - 512 + 2 * MiB - 1024));
    cr_assert_eq(st.reserved.current, (int64_t)(22 * MiB));
    cr_assert(st.allocated.current <= st.active.current &&
              st.active.current <= st.reserved.current);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* §2 settings */

static void expect_bad(const char *settings, int code, const char *must_mention)
{
    MemsimDevice dev = MEMSIM_DEVICE_INIT;
    dev.capacity = GiB;
    GError *error = NULL;
    MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("torch"), settings, &dev, &error);
    cr_assert_null(a, "settings '%s' were accepted", settings);
    cr_assert(error && error->domain == MEMSIM_ERROR && error->code == code,
              "settings '%s': wrong error %s", settings, error ? error->message : "(none)");
    cr_assert(strstr(error->message, must_mention), "settings '%s': message '%s' lacks '%s'",
              settings, error->message, must_mention);
    g_error_free(error);
}

Test(torch_settings, errors)
{
    const int BAD = MEMSIM_ERROR_BAD_INPUT;
    expect_bad("max_split_size_mb:10", BAD, "max_split_size_mb");
    expect_bad("max_split_size_mb:10", BAD, ">= 20");
    expect_bad("max_split_size_mb:abc", BAD, "max_split_size_mb");
    expect_bad("max_non_split_rounding_mb:5", BAD, "max_non_split_rounding_mb");
    expect_bad("garbage_collection_threshold:1.0", BAD, "(0, 1)");
    expect_bad("garbage_collection_threshold:0", BAD, "garbage_collection_threshold");
    expect_bad("garbage_collection_threshold:-0.5", BAD, "garbage_collection_threshold");
    expect_bad("roundup_power2_divisions:3", BAD, "power of two");
    expect_bad("roundup_power2_divisions:0", BAD, "roundup_power2_divisions");
    expect_bad("roundup_power2_divisions:[256:3]", BAD, "roundup_power2_divisions");
    expect_bad("roundup_power2_divisions:[100:4]", BAD, "'100' is not a power of two");
    expect_bad("roundup_power2_divisions:[256:4", BAD, "roundup_power2_divisions");
    expect_bad("expandable_segments:yes", BAD, "True or False");
    expect_bad("expandable_segments:true", BAD, "expandable_segments");
    expect_bad("per_process_memory_fraction:1.5", BAD, "[0, 1]");
    expect_bad("no_such_key:1", BAD, "unknown key 'no_such_key'");
    expect_bad("max_split_size_mb", BAD, "key:value");
    expect_bad("max_split_size_mb:64;expandable_segments:True", BAD, "max_split_size_mb");
    expect_bad("backend:cudaMallocAsync", MEMSIM_ERROR_UNSUPPORTED, "cudaMallocAsync");
    expect_bad("backend:magic", BAD, "native");
    /* A fraction needs a capacity to be a fraction of. */
    GError *error = NULL;
    MemsimDevice dev = MEMSIM_DEVICE_INIT;
    cr_assert_null(memsim_alloc_new(memsim_alloc_find("torch"), "per_process_memory_fraction:0.5",
                                    &dev, &error));
    cr_assert(strstr(error->message, "capacity"));
    g_error_free(error);
}

Test(torch_settings, accepted_forms)
{
    const char *ok[] = {
        "",
        "backend:native",
        "expandable_segments:False",
        "max_split_size_mb:128,garbage_collection_threshold:0.6",
        " max_split_size_mb : 128 , roundup_power2_divisions : [ 256 : 4 , > : 8 ] ",
        ("release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,"
         "pinned_num_register_threads:8,pinned_use_background_threads:False"),
        "per_process_memory_fraction:1.0",
        "max_split_size_mb=128,expandable_segments=True",
        "roundup_power2_divisions=[1=2,>=4]",
        "max_non_split_rounding_mb:64,",
    };
    for (gsize i = 0; i < G_N_ELEMENTS(ok); i++) {
        GError *error = NULL;
        MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("torch"), ok[i], NULL, &error);
        cr_assert(a, "'%s' refused: %s", ok[i], error ? error->message : "?");
        memsim_alloc_free_instance(a);
    }
    /* The spec form through the registry: torch:key=value,... behaves as configured. */
    GError *error = NULL;
    Rig r;
    memset(&r, 0, sizeof r);
    r.ev = g_array_new(FALSE, FALSE, sizeof(MemsimAllocEvent));
    r.dev.on_event = rig_on_event;
    r.dev.user = &r;
    MemsimAlloc *a = memsim_alloc_new_from_spec(
        "torch:expandable_segments=True,max_split_size_mb=128", &r.dev, &error);
    cr_assert(a, "%s", error ? error->message : "?");
    memsim_addr_t p;
    cr_assert_eq(memsim_alloc_malloc(a, 16 * MiB, 0, &p), MEMSIM_ALLOC_OK);
    cr_assert_eq(g_array_index(r.ev, MemsimAllocEvent, 0).kind, MEMSIM_AEV_SEG_MAP);
    rig_free(&r, a);
    cr_assert_not_null(memsim_alloc_find("torch")->settings_help);
}

/* ---------------------------------------------------------------------------------------- */
/* Seeding a recording that begins mid-run */

Test(torch_seed, normal_segment_and_block)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    const memsim_addr_t X = 0x100000000ull;
    GError *error = NULL;
    cr_assert(memsim_alloc_seed_segment(a, X, 20 * MiB, 0, 0, &error));
    cr_assert(memsim_alloc_seed_block(a, X + 2 * MiB, 4 * MiB, 3000000, 0, &error));
    checked(a);
    /* Free pieces [X, +2) and [X+6, +14) are inactive split. */
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.reserved.current, (int64_t)(20 * MiB));
    cr_assert_eq(st.segments.current, 1);
    cr_assert_eq(st.allocated.current, (int64_t)(4 * MiB));
    cr_assert_eq(st.active.current, (int64_t)(4 * MiB));
    cr_assert_eq(st.requested.current, 3000000);
    cr_assert_eq(st.inactive_split.current, (int64_t)(16 * MiB));
    cr_assert_eq(st.inactive_split.peak, st.inactive_split.current);
    cr_assert_eq(st.n_device_alloc, 0);
    cr_assert_eq(r.ev->len, 0);
    /* 2 MiB: best fit is the 2 MiB piece at X; taken whole. */
    cr_assert_eq(mal(a, 2 * MiB, 0), X);
    cr_assert_eq(stats(a).inactive_split.current, (int64_t)(14 * MiB));
    /* Freeing the seeded block reports its recorded requested size and merges forward. */
    guint n0 = r.ev->len;
    fre(a, X + 2 * MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_FREE_COMPLETED, X + 2 * MiB, 3000000});
    cr_assert_eq(stats(a).inactive_split.current, (int64_t)(18 * MiB));
    rig_free(&r, a);
}

Test(torch_seed, small_pool_and_errors)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "", 0);
    const memsim_addr_t X = 0x100000000ull, Y = 0x200000000ull;
    GError *error = NULL;
    cr_assert(memsim_alloc_seed_segment(a, X, 20 * MiB, 0, 0, &error));
    cr_assert(memsim_alloc_seed_segment(a, Y, 2 * MiB, 1, MEMSIM_SEGF_SMALL, &error));
    cr_assert(memsim_alloc_seed_block(a, X, 4 * MiB, 4 * MiB, 0, &error));
    cr_assert(memsim_alloc_seed_block(a, Y, 512, 100, 1, &error));
    checked(a);
    /* Overlapping an allocated block, outside any segment, wrong stream, overlapping
     * segments: all refused. */
    cr_assert_not(memsim_alloc_seed_block(a, X + 2 * MiB, 4 * MiB, 1, 0, &error));
    g_clear_error(&error);
    cr_assert_not(memsim_alloc_seed_block(a, 0x300000000ull, 512, 1, 0, &error));
    g_clear_error(&error);
    cr_assert_not(memsim_alloc_seed_block(a, X + 8 * MiB, 512, 1, 1, &error));
    g_clear_error(&error);
    cr_assert_not(memsim_alloc_seed_block(a, X + 18 * MiB, 4 * MiB, 1, 0, &error));
    g_clear_error(&error);
    cr_assert_not(memsim_alloc_seed_segment(a, X + 10 * MiB, 20 * MiB, 0, 0, &error));
    g_clear_error(&error);
    checked(a);
    /* The small segment serves small requests of stream 1 only. */
    cr_assert_eq(mal(a, 512, 1), Y + 512);
    rig_free(&r, a);
}

Test(torch_seed, expandable_run)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, "expandable_segments:True", 0);
    const memsim_addr_t B = 0x10000000000ull;
    GError *error = NULL;
    /* A mapped run of 40 MiB (two pages) with 16 MiB allocated at its start. */
    cr_assert(memsim_alloc_seed_segment(a, B, 40 * MiB, 0, MEMSIM_SEGF_EXPANDABLE, &error), "%s",
              error ? error->message : "");
    cr_assert(memsim_alloc_seed_block(a, B, 16 * MiB, 16 * MiB, 0, &error));
    checked(a);
    cr_assert_eq(stats(a).reserved.current, (int64_t)(40 * MiB));
    /* 16 MiB from the free [B+16, 24 MiB): no mapping. */
    cr_assert_eq(mal(a, 16 * MiB, 0), B + 16 * MiB);
    /* 16 MiB more: 8 MiB free tail + unmapped space → map page 2 at B+40. */
    guint n0 = r.ev->len;
    cr_assert_eq(mal(a, 16 * MiB, 0), B + 32 * MiB);
    EXPECT(&r, n0, {MEMSIM_AEV_SEG_MAP, B + 40 * MiB, 20 * MiB},
           {MEMSIM_AEV_ALLOC, B + 32 * MiB, 16 * MiB});
    /* A run that is not whole pages is refused. */
    cr_assert_not(memsim_alloc_seed_segment(a, 0x90000000000ull, 30 * MiB, 0,
                                            MEMSIM_SEGF_EXPANDABLE, &error));
    g_clear_error(&error);
    rig_free(&r, a);
}

/* ---------------------------------------------------------------------------------------- */
/* Seeded random stress: check() after every step, and the emitted events must account for
 * reserved and requested bytes exactly. */

static memsim_size_t random_size(GRand *g)
{
    double u = g_rand_double(g);
    if (u < 0.5) /* small pool */
        return (memsim_size_t)g_rand_int_range(g, 1, 1 << 20);
    if (u < 0.9) /* 1..64 MiB */
        return (memsim_size_t)g_rand_int_range(g, 1 << 20, 64 << 20) +
               (g_rand_boolean(g) ? 0 : 511);
    /* up to 4 GiB, log-uniform */
    double lg = g_rand_double_range(g, 26.0, 32.0);
    return (memsim_size_t)exp2(lg);
}

static void stress(const char *settings, memsim_size_t capacity, guint32 seed, int steps)
{
    Rig r;
    MemsimAlloc *a = rig_new(&r, settings, capacity);
    r.manual = TRUE;
    GRand *g = g_rand_new_with_seed(seed);
    GArray *live = g_array_new(FALSE, FALSE, sizeof(memsim_addr_t));
    for (int i = 0; i < steps; i++) {
        double u = g_rand_double(g);
        if (u < 0.55 || live->len == 0) {
            memsim_size_t size = random_size(g);
            uint32_t stream = (uint32_t)g_rand_int_range(g, 0, 3);
            memsim_addr_t p = 0;
            uint64_t ooms = r.ev_ooms;
            MemsimAllocResult res = memsim_alloc_malloc(a, size, stream, &p);
            MemsimAllocEvent *last = &g_array_index(r.ev, MemsimAllocEvent, r.ev->len - 1);
            if (res == MEMSIM_ALLOC_OK) {
                g_array_append_val(live, p);
                cr_assert(last->kind == MEMSIM_AEV_ALLOC && last->addr == p && last->size == size &&
                              last->stream == stream,
                          "seed %u step %d: the last event is not this ALLOC", seed, i);
            } else {
                cr_assert(r.ev_ooms == ooms + 1 && last->kind == MEMSIM_AEV_OOM,
                          "seed %u step %d: OOM without its event", seed, i);
            }
        } else if (u < 0.90) {
            /* Mostly LIFO, sometimes any live block. */
            guint k = g_rand_boolean(g) ? live->len - 1
                                        : (guint)g_rand_int_range(g, 0, (gint32)live->len);
            memsim_addr_t p = g_array_index(live, memsim_addr_t, k);
            g_array_remove_index_fast(live, k);
            memsim_alloc_free(a, p);
        } else if (u < 0.95) {
            guint k = (guint)g_rand_int_range(g, 0, (gint32)live->len);
            memsim_alloc_record_stream(a, g_array_index(live, memsim_addr_t, k),
                                       (uint32_t)g_rand_int_range(g, 0, 3));
        } else if (u < 0.98) {
            /* Let some streams progress. */
            uint32_t s = (uint32_t)g_rand_int_range(g, 0, 3);
            uint64_t lag = (uint64_t)g_rand_int_range(g, 0, 3);
            r.done_upto[s] = r.next_token > lag ? r.next_token - lag : 0;
        } else {
            memsim_alloc_empty_cache(a);
        }
        GError *error = NULL;
        cr_assert(memsim_alloc_check(a, &error), "%s seed %u step %d: %s", settings, seed, i,
                  error ? error->message : "?");
        MemsimAllocStats st = stats(a);
        cr_assert_eq(r.ev_reserved, st.reserved.current,
                     "%s seed %u step %d: segment events say %" G_GINT64_FORMAT
                     " reserved, stats %" G_GINT64_FORMAT,
                     settings, seed, i, r.ev_reserved, st.reserved.current);
        cr_assert_eq(r.ev_requested, st.requested.current,
                     "%s seed %u step %d: alloc/free events disagree with requested", settings,
                     seed, i);
        if (capacity)
            cr_assert(st.reserved.current <= (int64_t)capacity);
    }
    /* Drain: free everything, empty the cache: nothing may remain. */
    for (guint k = 0; k < live->len; k++)
        memsim_alloc_free(a, g_array_index(live, memsim_addr_t, k));
    memsim_alloc_empty_cache(a);
    checked(a);
    MemsimAllocStats st = stats(a);
    cr_assert_eq(st.allocated.current, 0);
    cr_assert_eq(st.active.current, 0);
    cr_assert_eq(st.reserved.current, 0, "%s seed %u: %" G_GINT64_FORMAT " left reserved", settings,
                 seed, st.reserved.current);
    g_array_unref(live);
    g_rand_free(g);
    rig_free(&r, a);
}

static const char *const stress_settings[] = {
    "",
    "expandable_segments:True",
    "max_split_size_mb:64,garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
    "roundup_power2_divisions:[1:4,64:8,>:2],max_non_split_rounding_mb:40",
    "expandable_segments:True,per_process_memory_fraction:0.7,garbage_collection_threshold:0.5",
    "max_split_size_mb:20,roundup_power2_divisions:4",
};

Test(torch_stress, random, .timeout = 600)
{
    for (gsize c = 0; c < G_N_ELEMENTS(stress_settings); c++)
        for (guint32 seed = 1; seed <= 4; seed++)
            stress(stress_settings[c], 24 * GiB, seed, 3000);
}

Test(torch_stress, random_unlimited, .timeout = 600)
{
    for (guint32 seed = 11; seed <= 13; seed++) {
        stress("", 0, seed, 2000);
        stress("expandable_segments:True", 0, seed, 2000);
    }
}
