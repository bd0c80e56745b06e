/* One property suite for every registered allocator policy (memsim_alloc_registry()), then
 * unit tests of the bfc policy against TensorFlow's source.
 *
 * Every policy runs the same scenarios: seeded random traces (sizes from 1 byte to 4 GiB,
 * several streams), hand-written edge cases, out of memory at a capacity, and every real
 * snapshot of the shared data. After every event the policy's own check() must pass, and the
 * test checks what it can see from outside, independently of the policy:
 *   - a block handed out does not overlap any live block (its extent is what the allocated
 *     statistic grew by);
 *   - requested and allocation counts equal the live requests; allocated <= reserved;
 *   - the last event of a malloc is its ALLOC (or OOM, with device free bytes and the
 *     rounded request); segment events add up to reserved where a policy's segment events
 *     are its device memory (not for exact, which has none, nor stitch, whose segment events
 *     are virtual ranges);
 *   - reserved never exceeds the capacity;
 *   - peak reserved >= the peak of the live requests rounded the policy's own way, and >= the
 *     `exact` policy's peak reserved when the policy rounds no finer than exact's 512 bytes
 *     (bfc rounds to 256, so only the first bound applies to it).
 */
#include <criterion/criterion.h>
#include <memsim/alloc.h>
#include <memsim/formats.h>
#include <memsim/sim.h>

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <string.h>

#include "testutil.h"

#define KiB ((memsim_size_t)1 << 10)
#define MiB ((memsim_size_t)1 << 20)
#define GiB ((memsim_size_t)1 << 30)

/* Criterion reports every passing assertion under --full-stats, which costs milliseconds
 * each: assert only when the condition fails. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            cr_assert_fail(__VA_ARGS__);                                                           \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* A device that records what the policy reports */

typedef struct {
    MemsimDevice dev;
    int64_t ev_reserved;  /* SEG_ALLOC + SEG_MAP - SEG_FREE - SEG_UNMAP */
    int64_t ev_requested; /* ALLOC - FREE_COMPLETED */
    uint64_t ev_ooms;
    MemsimAllocEvent last;
    GArray *seg_sizes; /* sizes of SEG_ALLOC events, in order */
    GArray *seg_frees; /* sizes of SEG_FREE events, in order */
} Rig;

static void rig_on_event(void *user, const MemsimAllocEvent *ev)
{
    Rig *r = user;
    r->last = *ev;
    switch (ev->kind) {
    case MEMSIM_AEV_SEG_ALLOC:
        g_array_append_val(r->seg_sizes, ev->size);
        r->ev_reserved += (int64_t)ev->size;
        break;
    case MEMSIM_AEV_SEG_MAP:
        r->ev_reserved += (int64_t)ev->size;
        break;
    case MEMSIM_AEV_SEG_FREE:
        g_array_append_val(r->seg_frees, ev->size);
        r->ev_reserved -= (int64_t)ev->size;
        break;
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

static void rig_init(Rig *r, memsim_size_t capacity)
{
    memset(r, 0, sizeof *r);
    MemsimDevice d = MEMSIM_DEVICE_INIT;
    r->dev = d;
    r->dev.capacity = capacity;
    r->dev.on_event = rig_on_event;
    r->dev.user = r;
    r->seg_sizes = g_array_new(FALSE, FALSE, sizeof(memsim_size_t));
    r->seg_frees = g_array_new(FALSE, FALSE, sizeof(memsim_size_t));
}

static void rig_clear(Rig *r)
{
    g_array_unref(r->seg_sizes);
    g_array_unref(r->seg_frees);
}

/* ---------------------------------------------------------------------------------------- */
/* A player: drives one policy instance through a program and checks after every event */

typedef struct {
    memsim_addr_t addr;
    memsim_size_t len; /* what the allocated statistic grew by: the block's extent */
    memsim_size_t req;
    gboolean live;
} Live;

typedef struct {
    char *spec;
    const MemsimAllocOps *ops;
    MemsimAlloc *a;
    Rig rig;
    memsim_size_t capacity;
    gboolean seg_events_are_reserved;
    GArray *ids;   /* Live, by id */
    GTree *ranges; /* live extents: addr → end */
    int64_t live_req, live_rounded, peak_rounded;
    int64_t n_live;
    gboolean coarser_than_exact; /* every request so far rounds to >= exact's rounding */
    uint64_t n_events, n_ooms;
} Player;

static gint addr_cmp(gconstpointer a, gconstpointer b, gpointer user)
{
    memsim_addr_t x = *(const memsim_addr_t *)a, y = *(const memsim_addr_t *)b;
    return x < y ? -1 : x > y;
}

static memsim_size_t exact_rounding(memsim_size_t n)
{
    return n <= 512 ? 512 : (n + 511) / 512 * 512;
}

static void player_start(Player *p, const char *spec, memsim_size_t capacity)
{
    memset(p, 0, sizeof *p);
    p->spec = g_strdup(spec);
    p->capacity = capacity;
    rig_init(&p->rig, capacity);
    GError *error = NULL;
    p->a = memsim_alloc_new_from_spec(spec, &p->rig.dev, &error);
    cr_assert(p->a, "%s: %s", spec, error ? error->message : "?");
    p->ops = memsim_alloc_ops(p->a);
    p->seg_events_are_reserved =
        strcmp(p->ops->name, "exact") != 0 && strcmp(p->ops->name, "stitch") != 0;
    p->ids = g_array_new(FALSE, TRUE, sizeof(Live));
    p->ranges = g_tree_new_full(addr_cmp, NULL, g_free, g_free);
    p->coarser_than_exact = TRUE;
}

static MemsimAllocStats player_stats(Player *p)
{
    return memsim_alloc_stats(p->a);
}

static void player_check_listing(Player *p);

static void player_verify(Player *p, const char *what)
{
    GError *error = NULL;
    CHECK(memsim_alloc_check(p->a, &error), "%s, %s (event %" G_GUINT64_FORMAT "): %s", p->spec,
          what, p->n_events, error ? error->message : "?");
    MemsimAllocStats st = player_stats(p);
    CHECK(st.requested.current == p->live_req && st.allocations.current == p->n_live,
          "%s, %s: requested %" G_GINT64_FORMAT " / %" G_GINT64_FORMAT
          " allocations, the program holds %" G_GINT64_FORMAT " / %" G_GINT64_FORMAT,
          p->spec, what, st.requested.current, st.allocations.current, p->live_req, p->n_live);
    CHECK(st.allocated.current <= st.reserved.current && st.allocated.current >= p->live_req,
          "%s, %s: allocated %" G_GINT64_FORMAT " outside [requested, reserved %" G_GINT64_FORMAT
          "]",
          p->spec, what, st.allocated.current, st.reserved.current);
    CHECK(p->rig.ev_requested == st.requested.current,
          "%s, %s: ALLOC/FREE_COMPLETED events say %" G_GINT64_FORMAT
          " requested, stats %" G_GINT64_FORMAT,
          p->spec, what, p->rig.ev_requested, st.requested.current);
    if (p->seg_events_are_reserved)
        CHECK(p->rig.ev_reserved == st.reserved.current,
              "%s, %s: segment events say %" G_GINT64_FORMAT " reserved, stats %" G_GINT64_FORMAT,
              p->spec, what, p->rig.ev_reserved, st.reserved.current);
    if (p->capacity) /* the peak too: not even for a moment inside an operation */
        CHECK(st.reserved.peak <= (int64_t)p->capacity,
              "%s, %s: reserved peaks at %" G_GINT64_FORMAT ", above the capacity", p->spec, what,
              st.reserved.peak);
    if (p->n_events % 32 == 0)
        player_check_listing(p);
}

/* The block listing (foreach_block) against the statistics: each segment listed as one run
 * of blocks that covers it, allocated blocks adding up to allocated bytes, mapped ones to
 * reserved bytes. */
typedef struct {
    memsim_addr_t seg, seg_end, next;
    int64_t allocated, mapped;
    gboolean broken;
    char why[160];
} Listing;

static void listing_block(void *user, const MemsimBlockInfo *b)
{
    Listing *l = user;
    if (l->broken)
        return;
    if (b->segment != l->seg) {
        if (l->next != l->seg_end) {
            l->broken = TRUE;
            g_snprintf(l->why, sizeof l->why, "segment 0x%" G_GINT64_MODIFIER "x not covered",
                       l->seg);
            return;
        }
        l->seg = l->next = b->segment;
        l->seg_end = b->segment + b->segment_size;
    }
    if (b->addr != l->next || b->addr + b->size > l->seg_end || b->size == 0) {
        l->broken = TRUE;
        g_snprintf(l->why, sizeof l->why, "block 0x%" G_GINT64_MODIFIER "x out of place", b->addr);
        return;
    }
    l->next += b->size;
    if (b->state == MEMSIM_BLOCK_ALLOCATED || b->state == MEMSIM_BLOCK_PENDING_FREE)
        l->allocated += (int64_t)b->size;
    if (b->state != MEMSIM_BLOCK_UNMAPPED)
        l->mapped += (int64_t)b->size;
}

static void player_check_listing(Player *p)
{
    Listing l = {0};
    if (!memsim_alloc_foreach_block(p->a, listing_block, &l))
        return;
    MemsimAllocStats st = player_stats(p);
    CHECK(!l.broken && l.next == l.seg_end, "%s: block listing: %s", p->spec,
          l.broken ? l.why : "the last segment is not covered");
    CHECK(l.allocated == st.allocated.current,
          "%s: listed blocks in use add up to %" G_GINT64_FORMAT ", allocated is %" G_GINT64_FORMAT,
          p->spec, l.allocated, st.allocated.current);
    /* exact lists nothing but its blocks; stitch's segment bytes are not all mapped. */
    if (p->seg_events_are_reserved)
        CHECK(l.mapped == st.reserved.current,
              "%s: listed mapped blocks add up to %" G_GINT64_FORMAT
              ", reserved is %" G_GINT64_FORMAT,
              p->spec, l.mapped, st.reserved.current);
}

static Live *player_live(Player *p, guint id)
{
    if (id >= p->ids->len)
        g_array_set_size(p->ids, id + 1);
    return &g_array_index(p->ids, Live, id);
}

static MemsimAllocResult player_alloc(Player *p, guint id, memsim_size_t size, uint32_t stream)
{
    p->n_events++;
    Live *l = player_live(p, id);
    CHECK(!l->live, "test bug: id %u is live", id);
    int64_t before = player_stats(p).allocated.current;
    uint64_t ooms = p->rig.ev_ooms;
    memsim_addr_t addr = 0;
    MemsimAllocResult res = memsim_alloc_malloc(p->a, size, stream, &addr);
    memsim_size_t rounded = memsim_alloc_round_size(p->a, size);
    if (res != MEMSIM_ALLOC_OK) {
        MemsimAllocStats st = player_stats(p);
        memsim_size_t held = (memsim_size_t)st.reserved.current;
        p->n_ooms++;
        CHECK(p->rig.ev_ooms == ooms + 1 && p->rig.last.kind == MEMSIM_AEV_OOM,
              "%s: malloc(%" G_GUINT64_FORMAT ") failed without an OOM event", p->spec, size);
        CHECK(p->rig.last.size == rounded,
              "%s: OOM event for %" G_GUINT64_FORMAT " bytes says %" G_GUINT64_FORMAT
              ", the rounded request is %" G_GUINT64_FORMAT,
              p->spec, size, p->rig.last.size, rounded);
        CHECK(p->rig.last.addr == (p->capacity > held ? p->capacity - held : 0),
              "%s: OOM event gives %" G_GUINT64_FORMAT
              " device free bytes, expected %" G_GUINT64_FORMAT,
              p->spec, p->rig.last.addr, p->capacity > held ? p->capacity - held : 0);
        player_verify(p, "after an OOM");
        return res;
    }
    int64_t after = player_stats(p).allocated.current;
    memsim_size_t len = (memsim_size_t)(after - before);
    CHECK(len >= size && len > 0,
          "%s: malloc(%" G_GUINT64_FORMAT ") charged %" G_GUINT64_FORMAT " bytes", p->spec, size,
          len);
    CHECK(p->rig.last.kind == MEMSIM_AEV_ALLOC && p->rig.last.addr == addr &&
              p->rig.last.size == size,
          "%s: malloc(%" G_GUINT64_FORMAT ") did not end with its ALLOC event", p->spec, size);
    /* No overlap with the live neighbours below and above. */
    GTreeNode *n = g_tree_upper_bound(p->ranges, &addr);
    CHECK(!n || addr + len <= *(memsim_addr_t *)g_tree_node_key(n),
          "%s: block 0x%" G_GINT64_MODIFIER "x (+%" G_GUINT64_FORMAT ") overlaps the live block "
          "above it",
          p->spec, addr, len);
    GTreeNode *below = n ? g_tree_node_previous(n) : g_tree_node_last(p->ranges);
    CHECK(!below || *(memsim_addr_t *)g_tree_node_value(below) <= addr,
          "%s: block 0x%" G_GINT64_MODIFIER "x overlaps the live block below it", p->spec, addr);
    memsim_addr_t *k = g_new(memsim_addr_t, 1), *v = g_new(memsim_addr_t, 1);
    *k = addr;
    *v = addr + len;
    g_tree_insert(p->ranges, k, v);
    l = player_live(p, id);
    l->addr = addr;
    l->len = len;
    l->req = size;
    l->live = TRUE;
    p->live_req += (int64_t)size;
    p->live_rounded += (int64_t)rounded;
    if (p->live_rounded > p->peak_rounded)
        p->peak_rounded = p->live_rounded;
    if (rounded < exact_rounding(size))
        p->coarser_than_exact = FALSE;
    p->n_live++;
    player_verify(p, "after a malloc");
    return res;
}

static void player_free(Player *p, guint id)
{
    p->n_events++;
    Live *l = player_live(p, id);
    CHECK(l->live, "test bug: id %u is not live", id);
    memsim_alloc_free(p->a, l->addr);
    g_tree_remove(p->ranges, &l->addr);
    l->live = FALSE;
    p->live_req -= (int64_t)l->req;
    p->live_rounded -= (int64_t)memsim_alloc_round_size(p->a, l->req);
    p->n_live--;
    player_verify(p, "after a free");
}

static void player_empty_cache(Player *p)
{
    p->n_events++;
    memsim_alloc_empty_cache(p->a);
    player_verify(p, "after empty_cache");
}

/* Frees what is live, empties the cache; returns the final statistics. */
static MemsimAllocStats player_end(Player *p)
{
    player_check_listing(p);
    for (guint id = 0; id < p->ids->len; id++)
        if (g_array_index(p->ids, Live, id).live)
            player_free(p, id);
    player_empty_cache(p);
    MemsimAllocStats st = player_stats(p);
    CHECK(st.allocated.current == 0 && st.requested.current == 0,
          "%s: bytes remain allocated after everything was freed", p->spec);
    CHECK(st.reserved.peak >= p->peak_rounded,
          "%s: peak reserved %" G_GINT64_FORMAT
          " below the peak of the rounded live requests %" G_GINT64_FORMAT,
          p->spec, st.reserved.peak, p->peak_rounded);
    memsim_alloc_free_instance(p->a);
    rig_clear(&p->rig);
    g_array_unref(p->ids);
    g_tree_unref(p->ranges);
    g_free(p->spec);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Programs: a list of steps that every policy runs */

typedef enum { OP_ALLOC, OP_FREE, OP_EMPTY } OpKind;

typedef struct {
    OpKind kind;
    guint id;
    memsim_size_t size;
    uint32_t stream;
} Op;

typedef struct {
    int64_t peak_reserved;
    int64_t peak_rounded;
    gboolean coarser;
    uint64_t n_ooms;
} Outcome;

/* Runs ops through `spec`; an ALLOC that runs out of memory leaves its id dead, and the
 * program's later FREE of it is skipped. */
static Outcome run_program(const char *spec, const Op *ops, gsize n, memsim_size_t capacity)
{
    Player p;
    player_start(&p, spec, capacity);
    for (gsize i = 0; i < n; i++) {
        switch (ops[i].kind) {
        case OP_ALLOC:
            player_alloc(&p, ops[i].id, ops[i].size, ops[i].stream);
            break;
        case OP_FREE:
            if (player_live(&p, ops[i].id)->live)
                player_free(&p, ops[i].id);
            break;
        case OP_EMPTY:
            player_empty_cache(&p);
            break;
        }
    }
    Outcome o = {0, p.peak_rounded, p.coarser_than_exact, p.n_ooms};
    MemsimAllocStats st = player_end(&p);
    o.peak_reserved = st.reserved.peak;
    return o;
}

/* Every policy runs the program; each must hold the peak bounds (see the file's header). */
static void run_everywhere(const char *name, const Op *ops, gsize n, memsim_size_t capacity)
{
    Outcome exact = run_program("exact", ops, n, capacity);
    for (const MemsimAllocOps *const *q = memsim_alloc_registry(); *q; q++) {
        Outcome o = run_program((*q)->name, ops, n, capacity);
        if (!capacity && o.coarser)
            CHECK(o.peak_reserved >= exact.peak_reserved,
                  "%s, %s: peak reserved %" G_GINT64_FORMAT " below exact's %" G_GINT64_FORMAT,
                  (*q)->name, name, o.peak_reserved, exact.peak_reserved);
    }
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Sizes from 1 byte to 4 GiB: a third tiny, most up to 64 MiB, some large. */
static memsim_size_t random_size(uint64_t *rng)
{
    uint64_t u = xorshift(rng) % 100;
    double f = (double)(xorshift(rng) % 1000000) / 1e6;
    if (u < 30)
        return 1 + xorshift(rng) % 4096;
    if (u < 75)
        return (memsim_size_t)exp2(12.0 + f * 14.0) + xorshift(rng) % 512; /* 4 KiB..64 MiB */
    if (u < 95)
        return (memsim_size_t)exp2(26.0 + f * 4.0); /* 64 MiB..1 GiB */
    return (memsim_size_t)exp2(30.0 + f * 2.0);     /* 1..4 GiB */
}

/* A seeded random program: allocations on `n_streams` streams, frees mostly in reverse order
 * (as a training step releases activations), some at random, an occasional empty_cache. */
static GArray *random_program(uint64_t seed, int n_ops, int n_streams)
{
    GArray *ops = g_array_new(FALSE, FALSE, sizeof(Op));
    GArray *live = g_array_new(FALSE, FALSE, sizeof(guint));
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    guint next_id = 0;
    for (int i = 0; i < n_ops; i++) {
        uint64_t u = xorshift(&rng) % 100;
        Op op = {OP_ALLOC, 0, 0, 0};
        if (u < 55 || live->len == 0) {
            op.id = next_id++;
            op.size = random_size(&rng);
            op.stream = (uint32_t)(xorshift(&rng) % (uint64_t)n_streams);
            g_array_append_val(live, op.id);
        } else if (u < 98) {
            guint k = u < 80 ? live->len - 1 : (guint)(xorshift(&rng) % live->len);
            op.kind = OP_FREE;
            op.id = g_array_index(live, guint, k);
            g_array_remove_index(live, k);
        } else {
            op.kind = OP_EMPTY;
        }
        g_array_append_val(ops, op);
    }
    g_array_unref(live);
    return ops;
}

/* ---------------------------------------------------------------------------------------- */
/* The property suite */

Test(policies, registry_order_and_tables)
{
    const MemsimAllocOps *const *r = memsim_alloc_registry();
    cr_assert(r[0] && strcmp(r[0]->name, "torch") == 0, "torch must come first");
    cr_assert(r[1] && strcmp(r[1]->name, "exact") == 0, "exact must come second");
    int n = 0;
    for (; r[n]; n++) {
        const MemsimAllocOps *o = r[n];
        cr_assert(o->create && o->destroy && o->malloc && o->free && o->stats && o->check &&
                      o->round_size && o->reset_peaks && o->shape,
                  "%s: a required or expected entry is missing", o->name);
        cr_assert(memsim_alloc_find(o->name) == o, "%s: not found by name", o->name);
        for (int k = 0; k < n; k++)
            cr_assert(strcmp(r[k]->name, o->name) != 0, "%s registered twice", o->name);
    }
    const char *wanted[] = {"bfc", "buddy", "first-fit", "best-fit", "stitch"};
    for (gsize i = 0; i < G_N_ELEMENTS(wanted); i++) {
        const MemsimAllocOps *o = memsim_alloc_find(wanted[i]);
        cr_assert(o, "%s is not registered", wanted[i]);
        cr_assert(o->settings_help && *o->settings_help, "%s has no settings_help", wanted[i]);
        cr_assert(o->seed_segment && o->seed_block, "%s cannot start from a recording", wanted[i]);
    }
}

Test(policies, random_traces, .timeout = 600)
{
    const uint64_t seeds[] = {1, 2, 3, 42, 2024};
    for (gsize i = 0; i < G_N_ELEMENTS(seeds); i++) {
        GArray *ops = random_program(seeds[i], 1500, 1 + (int)(seeds[i] % 4));
        g_autofree char *name = g_strdup_printf("random seed %" G_GUINT64_FORMAT, seeds[i]);
        run_everywhere(name, (Op *)ops->data, ops->len, 0);
        g_array_unref(ops);
    }
}

Test(policies, random_traces_at_capacity, .timeout = 600)
{
    /* The same programs on a 24 GiB device: some requests run out of memory, the policy must
     * say so properly and go on. */
    const uint64_t seeds[] = {5, 6, 7};
    for (gsize i = 0; i < G_N_ELEMENTS(seeds); i++) {
        GArray *ops = random_program(seeds[i], 1500, 3);
        g_autofree char *name =
            g_strdup_printf("random seed %" G_GUINT64_FORMAT " at 24 GiB", seeds[i]);
        run_everywhere(name, (Op *)ops->data, ops->len, 24 * GiB);
        g_array_unref(ops);
    }
}

static void add_alloc(GArray *ops, guint id, memsim_size_t size, uint32_t stream)
{
    Op op = {OP_ALLOC, id, size, stream};
    g_array_append_val(ops, op);
}

static void add_free(GArray *ops, guint id)
{
    Op op = {OP_FREE, id, 0, 0};
    g_array_append_val(ops, op);
}

Test(policies, tiny_sizes)
{
    /* Around every rounding edge: 256 (bfc), 512 (most), 1 KiB. */
    const memsim_size_t sizes[] = {1, 2, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025, 4095};
    GArray *ops = g_array_new(FALSE, FALSE, sizeof(Op));
    guint id = 0;
    for (int round = 0; round < 3; round++)
        for (gsize i = 0; i < G_N_ELEMENTS(sizes); i++)
            add_alloc(ops, id++, sizes[i], 0);
    for (guint k = 0; k < id; k += 2) /* every other one: holes between live blocks */
        add_free(ops, k);
    for (gsize i = 0; i < G_N_ELEMENTS(sizes); i++)
        add_alloc(ops, id++, sizes[i], 0);
    run_everywhere("tiny sizes", (Op *)ops->data, ops->len, 0);
    g_array_unref(ops);
}

Test(policies, powers_of_two)
{
    GArray *ops = g_array_new(FALSE, FALSE, sizeof(Op));
    guint id = 0;
    for (int e = 9; e <= 32; e++)
        add_alloc(ops, id++, (memsim_size_t)1 << e, 0);
    for (int e = 9; e <= 32; e += 3)
        add_free(ops, (guint)(e - 9));
    for (int e = 9; e <= 32; e++) /* one below and one above each power */
        add_alloc(ops, id++, ((memsim_size_t)1 << e) - 1, 0);
    for (int e = 9; e <= 32; e++)
        add_alloc(ops, id++, ((memsim_size_t)1 << e) + 1, 0);
    run_everywhere("powers of two", (Op *)ops->data, ops->len, 0);
    g_array_unref(ops);
}

Test(policies, huge_requests)
{
    /* Beyond any segment size and any real device: 64 GiB, 1 TiB, 2^48 bytes. */
    GArray *ops = g_array_new(FALSE, FALSE, sizeof(Op));
    add_alloc(ops, 0, 512, 0);
    add_alloc(ops, 1, 64 * GiB, 0);
    add_alloc(ops, 2, 1024 * GiB + 3, 1);
    add_alloc(ops, 3, (memsim_size_t)1 << 48, 0);
    add_free(ops, 2);
    add_alloc(ops, 4, 100 * GiB, 0); /* fits the freed TiB for the splitting policies */
    add_free(ops, 1);
    add_free(ops, 3);
    add_alloc(ops, 5, 3 * MiB, 0);
    run_everywhere("huge requests", (Op *)ops->data, ops->len, 0);
    g_array_unref(ops);
}

Test(policies, free_in_reverse)
{
    GArray *ops = g_array_new(FALSE, FALSE, sizeof(Op));
    uint64_t rng = 77;
    for (guint i = 0; i < 300; i++)
        add_alloc(ops, i, random_size(&rng) % (256 * MiB) + 1, 0);
    for (guint i = 300; i-- > 0;)
        add_free(ops, i);
    for (guint i = 300; i < 400; i++) /* the cache serves a second pass */
        add_alloc(ops, i, random_size(&rng) % (256 * MiB) + 1, 0);
    run_everywhere("free in reverse", (Op *)ops->data, ops->len, 0);
    g_array_unref(ops);
}

Test(policies, interleaved_streams)
{
    GArray *ops = g_array_new(FALSE, FALSE, sizeof(Op));
    uint64_t rng = 99;
    guint id = 0;
    for (int round = 0; round < 40; round++) {
        for (uint32_t s = 0; s < 8; s++)
            add_alloc(ops, id++, random_size(&rng) % (64 * MiB) + 1, s);
        /* free the blocks of odd streams from the previous round */
        if (round)
            for (uint32_t s = 1; s < 8; s += 2)
                add_free(ops, id - 16 + s);
    }
    run_everywhere("interleaved streams", (Op *)ops->data, ops->len, 0);
    g_array_unref(ops);
}

Test(policies, oom_at_capacity)
{
    for (const MemsimAllocOps *const *q = memsim_alloc_registry(); *q; q++) {
        /* bfc never gives memory back unless garbage collection is on (TF has no
         * empty_cache), so the last step needs it. */
        g_autofree char *spec = strcmp((*q)->name, "bfc") == 0
                                    ? g_strdup("bfc:garbage_collection=true")
                                    : g_strdup((*q)->name);
        Player p;
        player_start(&p, spec, 1 * GiB);
        /* A request beyond the device fails at once. */
        cr_assert_eq(player_alloc(&p, 0, 2 * GiB, 0), MEMSIM_ALLOC_OOM, "%s", (*q)->name);
        /* 100 MiB at a time until the device is full: at most 10 fit (minus what the policy
         * rounds and caches), and the 11th cannot. */
        guint id = 1;
        int ok = 0;
        while (id < 20 && player_alloc(&p, id, 100 * MiB, id % 2) == MEMSIM_ALLOC_OK) {
            id++;
            ok++;
        }
        cr_assert(ok >= 1 && ok <= 10 && id < 20, "%s: %d allocations of 100 MiB in 1 GiB",
                  (*q)->name, ok);
        /* Small requests still fit in what is left, or fail properly. */
        for (int i = 0; i < 50; i++)
            player_alloc(&p, 100 + (guint)i, 512 * KiB + (memsim_size_t)i, 0);
        /* After freeing everything and emptying the cache, the device is whole again. */
        for (guint k = 0; k < 150; k++)
            if (k < p.ids->len && g_array_index(p.ids, Live, k).live)
                player_free(&p, k);
        player_empty_cache(&p);
        cr_assert_eq(player_alloc(&p, 200, 900 * MiB, 0), MEMSIM_ALLOC_OK,
                     "%s: 900 MiB do not fit an emptied 1 GiB device", (*q)->name);
        cr_assert(p.n_ooms >= 2, "%s", (*q)->name);
        player_end(&p);
    }
}

Test(policies, settings_errors_name_the_key)
{
    for (const MemsimAllocOps *const *q = memsim_alloc_registry(); *q; q++) {
        GError *error = NULL;
        MemsimAlloc *a = memsim_alloc_new(*q, "no_such_key=1", NULL, &error);
        cr_assert(a == NULL && error, "%s accepted an unknown setting", (*q)->name);
        cr_assert(g_error_matches(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s", (*q)->name);
        cr_assert(strstr(error->message, "no_such_key"), "%s: '%s' does not name the key",
                  (*q)->name, error->message);
        g_error_free(error);
    }
    struct {
        const char *spec;
        const char *words[2]; /* the message names the key and what it accepts */
    } bad[] = {
        {"bfc:allow_growth=maybe", {"allow_growth", "true or false"}},
        {"bfc:garbage_collection=2", {"garbage_collection", "true or false"}},
        {"bfc:fragmentation_fraction=1.5", {"fragmentation_fraction", "[0, 1)"}},
        {"bfc:memory_fraction=0", {"memory_fraction", "(0, 1]"}},
        {"bfc:allow_growth=false", {"allow_growth=false", "capacity"}},
        {"buddy:segment_mb=48", {"segment_mb", "power of two"}},
        {"buddy:min_block=100", {"min_block", "power of two"}},
        {"first-fit:segment_mb=1", {"segment_mb", "between 2"}},
        {"best-fit:segment_mb=lots", {"segment_mb", "integer"}},
        {"stitch:granularity_mb=3", {"granularity_mb", "power of two"}},
        {"stitch:defrag_level=2", {"defrag_level", "0 or 1"}},
        {"stitch:fragment_limit_mb=-1", {"fragment_limit_mb", "integer"}},
        {"best-fit:segment_mb", {"key=value", "segment_mb"}},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        GError *error = NULL;
        MemsimAlloc *a = memsim_alloc_new_from_spec(bad[i].spec, NULL, &error);
        cr_assert(a == NULL && error, "'%s' was accepted", bad[i].spec);
        cr_assert(g_error_matches(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s", bad[i].spec);
        for (int w = 0; w < 2; w++)
            cr_assert(strstr(error->message, bad[i].words[w]), "'%s': '%s' does not say '%s'",
                      bad[i].spec, error->message, bad[i].words[w]);
        g_error_free(error);
    }
    const char *good[] = {"bfc:allow_growth=true,garbage_collection=true",
                          "bfc:fragmentation_fraction=0,memory_fraction=0.75",
                          "buddy:segment_mb=128,min_block=256",
                          "first-fit:segment_mb=20",
                          "best-fit:segment_mb=2",
                          "stitch:granularity_mb=4,fragment_limit_mb=32,defrag_level=1",
                          "stitch: granularity_mb : 2"};
    for (gsize i = 0; i < G_N_ELEMENTS(good); i++) {
        GError *error = NULL;
        MemsimAlloc *a = memsim_alloc_new_from_spec(good[i], NULL, &error);
        cr_assert(a, "'%s': %s", good[i], error ? error->message : "?");
        memsim_alloc_free_instance(a);
    }
}

Test(policies, settings_change_behaviour)
{
    /* Each setting is used: the same program gives another peak, and for the buddy and fit
     * policies the peak each setting's rule implies, worked out by hand. The program: 40
     * blocks of 3 MiB, every other one freed, then 40 blocks of 5 MiB. */
    GArray *ops = g_array_new(FALSE, FALSE, sizeof(Op));
    for (guint i = 0; i < 40; i++)
        add_alloc(ops, i, 3 * MiB, 0);
    for (guint i = 0; i < 40; i += 2)
        add_free(ops, i);
    for (guint i = 40; i < 80; i++)
        add_alloc(ops, i, 5 * MiB, 0);
    /* want: peak reserved in MiB, or 0 where only "differs from a" is asserted.
     * buddy (64 MiB arenas): 3 MiB takes a 4 MiB block, 16 to an arena: 3 arenas, the third
     *   half used (its upper 32 MiB one free block). The freed blocks cannot merge (each
     *   buddy is in use), so of the 40 8-MiB blocks for 5 MiB, 4 fit the third arena's free
     *   half and 36 take 5 new arenas of 8: 8 × 64 = 512.
     * buddy:segment_mb=1024: one arena holds everything (160 MiB, then 320 MiB): 1024.
     * buddy:segment_mb=2: each request its own arena of its power of two: 40 × 4 MiB, and the
     *   20 freed (cached) are too small for 8 MiB: 40 × 8 more: 160 + 320 = 480.
     * first-fit (64 MiB segments): 21 blocks of 3 MiB to a segment: 2 segments (the second
     *   with a 7 MiB tail); freed blocks leave 3 MiB holes, the first segment's last one
     *   joins its 1 MiB tail (4 MiB). Of the 5 MiB blocks one fits the 7 MiB tail, 39 take
     *   4 new segments of 12: 6 × 64 = 384.
     * first-fit:segment_mb=512: everything fits one segment: 512.
     * best-fit: the same holes; the smallest that holds 5 MiB is again the 7 MiB tail: 384.
     * best-fit:segment_mb=2: each 3 MiB request its own segment rounded up to 2 MiB (4 MiB),
     *   the freed ones cached but too small; each 5 MiB one its own 6 MiB: 160 + 240 = 400. */
    struct {
        const char *a, *b;
        int64_t want_a, want_b;
    } pairs[] = {
        {"buddy", "buddy:segment_mb=1024", 512, 1024},
        {"buddy", "buddy:segment_mb=2", 512, 480},
        {"first-fit", "first-fit:segment_mb=512", 384, 512},
        {"best-fit", "best-fit:segment_mb=2", 384, 400},
        {"stitch", "stitch:granularity_mb=8", 0, 0},
        {"stitch", "stitch:fragment_limit_mb=64", 0, 0},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(pairs); i++) {
        Outcome x = run_program(pairs[i].a, (Op *)ops->data, ops->len, 0);
        Outcome y = run_program(pairs[i].b, (Op *)ops->data, ops->len, 0);
        cr_expect(x.peak_reserved != y.peak_reserved, "%s and %s both peak at %" G_GINT64_FORMAT,
                  pairs[i].a, pairs[i].b, x.peak_reserved);
        if (pairs[i].want_a) {
            cr_expect_eq(x.peak_reserved, pairs[i].want_a * (int64_t)MiB, "%s: %" G_GINT64_FORMAT
                         " MiB", pairs[i].a, x.peak_reserved / (int64_t)MiB);
            cr_expect_eq(y.peak_reserved, pairs[i].want_b * (int64_t)MiB, "%s: %" G_GINT64_FORMAT
                         " MiB", pairs[i].b, y.peak_reserved / (int64_t)MiB);
        }
    }
    g_array_unref(ops);
}

/* ---------------------------------------------------------------------------------------- */
/* Real snapshots */

/* The segments a recording starts with (a snapshot taken mid-run): policies that cache keep
 * them, on top of what the program asks for. */
static int64_t initial_segments(MemsimTrace *t, guint32 rank)
{
    gsize n;
    const MemsimEvent *ev = memsim_trace_events(t, rank, &n);
    int64_t sum = 0;
    for (gsize i = 0; i < n; i++)
        if (ev[i].kind == MEMSIM_EV_INIT_SEGMENT)
            sum += (int64_t)ev[i].size;
    return sum;
}

/* Per rank, the peak of live requests rounded by `a` (recorded live blocks rounded to 256
 * bytes: every policy charges a recorded block at least its request rounded so). */
static GArray *trace_peak_rounded(MemsimTrace *t, MemsimAlloc *a)
{
    const MemsimTraceHeader *h = memsim_trace_header(t);
    GArray *peaks = g_array_new(FALSE, TRUE, sizeof(int64_t));
    g_array_set_size(peaks, h->n_ranks);
    for (guint32 rank = 0; rank < h->n_ranks; rank++) {
        GHashTable *live = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
        gsize n;
        const MemsimEvent *ev = memsim_trace_events(t, rank, &n);
        int64_t cur = 0, *pk = &g_array_index(peaks, int64_t, rank);
        for (gsize i = 0; i < n; i++) {
            int64_t key = (int64_t)ev[i].id, bytes = 0;
            if (ev[i].kind == MEMSIM_EV_ALLOC)
                bytes = (int64_t)memsim_alloc_round_size(a, ev[i].size);
            else if (ev[i].kind == MEMSIM_EV_INIT_BLOCK)
                bytes = (int64_t)((ev[i].size + 255) / 256 * 256);
            if (bytes) {
                int64_t *k = g_new(int64_t, 1), *v = g_new(int64_t, 1);
                *k = key;
                *v = bytes;
                g_hash_table_replace(live, k, v);
                cur += bytes;
                if (cur > *pk)
                    *pk = cur;
            } else if (ev[i].kind == MEMSIM_EV_FREE) {
                int64_t *v = g_hash_table_lookup(live, &key);
                if (v) {
                    cur -= *v;
                    g_hash_table_remove(live, &key);
                }
            }
        }
        g_hash_table_unref(live);
    }
    return peaks;
}

Test(policies, real_snapshots, .timeout = 600)
{
    const char *dir = tu_shared_data();
    if (!dir)
        cr_skip_test("shared data folder absent (MEMSIM_SHARED_DATA=%s): real-snapshot replays "
                     "through every policy skipped",
                     g_getenv("MEMSIM_SHARED_DATA") ? g_getenv("MEMSIM_SHARED_DATA") : "unset");
    g_autofree char *snaps = g_build_filename(dir, "torch-snapshots", NULL);
    GDir *d = g_dir_open(snaps, 0, NULL);
    if (!d)
        cr_skip_test("%s is absent: real-snapshot replays skipped", snaps);
    GPtrArray *files = g_ptr_array_new_with_free_func(g_free);
    const char *name;
    while ((name = g_dir_read_name(d)))
        if (g_str_has_suffix(name, ".pickle") || g_str_has_suffix(name, ".pkl"))
            g_ptr_array_add(files, g_build_filename(snaps, name, NULL));
    g_dir_close(d);
    g_ptr_array_sort(files, (GCompareFunc)g_strcmp0);
    cr_assert(files->len >= 20, "expected the 30 shared snapshots, found %u", files->len);
    const char *san = g_getenv("MEMSIM_SANITIZE");
    gboolean sanitized = san && *san && strcmp(san, "none") != 0;
    int replayed = 0;
    for (guint i = 0; i < files->len; i++) {
        const char *path = files->pdata[i];
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.allocator = "exact";
        o.capacity = G_MAXUINT64; /* unlimited, even where a snapshot records its device */
        GError *error = NULL;
        /* read once, replayed through every policy (memsim_replay_path would read it again) */
        MemsimTrace *trace = memsim_trace_load(path, &error);
        cr_assert(trace, "%s: %s", path, error ? error->message : "?");
        MemsimReport *exact = memsim_replay_trace(trace, &o, &error);
        cr_assert(exact, "%s: %s", path, error ? error->message : "?");
        guint k = 0;
        for (const MemsimAllocOps *const *q = memsim_alloc_registry(); *q; q++, k++) {
            o.allocator = (*q)->name;
            /* A broken invariant aborts with its message. The check walks every block after
             * every event: under the sanitizers (twenty times slower there) each policy
             * checks one snapshot in four, a different quarter for each policy; the normal
             * build checks them all. */
            o.check_invariants = !sanitized || (i + k) % 4 == 0;
            MemsimReport *rep = memsim_replay_trace(trace, &o, &error);
            cr_assert(rep, "%s through %s: %s", path, (*q)->name, error ? error->message : "?");
            MemsimAlloc *rounder = memsim_alloc_new(*q, "", NULL, NULL);
            GArray *bound = trace_peak_rounded(trace, rounder);
            gboolean coarser = TRUE;
            for (memsim_size_t s = 1; s < 4 * MiB; s = s * 3 + 1)
                if (memsim_alloc_round_size(rounder, s) < exact_rounding(s))
                    coarser = FALSE;
            memsim_alloc_free_instance(rounder);
            cr_assert_eq(rep->n_ranks, exact->n_ranks);
            for (guint r = 0; r < rep->n_ranks; r++) {
                const MemsimRankReport *x = &rep->ranks[r];
                cr_assert(!x->oom.happened, "%s through %s: OOM on an unlimited device", path,
                          (*q)->name);
                int64_t lb = r < bound->len ? g_array_index(bound, int64_t, r) : 0;
                CHECK(x->stats.reserved.peak >= lb && x->stats.allocated.peak >= lb,
                      "%s through %s, rank %u: peak reserved %" G_GINT64_FORMAT
                      " / allocated %" G_GINT64_FORMAT
                      " below the rounded live requests %" G_GINT64_FORMAT,
                      path, (*q)->name, r, x->stats.reserved.peak, x->stats.allocated.peak, lb);
                /* and from above: no policy reserves more than twice what the program
                 * holds rounded (exact's peak) plus 1 GiB — power-of-two blocks (buddy) and
                 * doubling regions (bfc) at most double it; a segment's slack is below 1 GiB */
                int64_t ub = 2 * exact->ranks[r].stats.reserved.peak + (int64_t)1024 * MiB +
                             initial_segments(trace, r);
                CHECK(x->stats.reserved.peak <= ub,
                      "%s through %s, rank %u: peak reserved %" G_GINT64_FORMAT
                      " above twice exact's %" G_GINT64_FORMAT " plus 1 GiB",
                      path, (*q)->name, r, x->stats.reserved.peak,
                      exact->ranks[r].stats.reserved.peak);
                if (coarser)
                    CHECK(x->stats.reserved.peak >= exact->ranks[r].stats.reserved.peak,
                          "%s through %s, rank %u: peak reserved %" G_GINT64_FORMAT
                          " below exact's %" G_GINT64_FORMAT,
                          path, (*q)->name, r, x->stats.reserved.peak,
                          exact->ranks[r].stats.reserved.peak);
            }
            g_array_unref(bound);
            memsim_report_free(rep);
            o.check_invariants = FALSE;
        }
        memsim_report_free(exact);
        memsim_trace_free(trace);
        replayed++;
    }
    cr_assert(replayed >= 20);
    g_ptr_array_unref(files);
}

/* ---------------------------------------------------------------------------------------- */
/* bfc against TensorFlow's source (third_party/xla/xla/tsl/framework/bfc_allocator.{h,cc}).
 * The policy file is compiled in here a second time, its getter renamed, to reach its static
 * functions; the public instance comes from the registry as everywhere else. */

#define memsim_alloc_bfc_ops test_copy_of_bfc_ops
#include "sim/alloc/bfc.c"
#undef memsim_alloc_bfc_ops

Test(bfc, rounded_bytes)
{
    /* RoundedBytes: kMinAllocationSize * ceil(bytes / kMinAllocationSize), 256 = 1 << 8. */
    cr_assert_eq(rounded_bytes(1), 256);
    cr_assert_eq(rounded_bytes(256), 256);
    cr_assert_eq(rounded_bytes(257), 512);
    cr_assert_eq(rounded_bytes(1000), 1024);
    cr_assert_eq(rounded_bytes(3 * MiB + 1), 3 * MiB + 256);
}

Test(bfc, bin_for_size)
{
    /* BinNumForSize: v = max(bytes, 256) >> kMinAllocationBits (8);
     * bin = min(kNumBins - 1, Log2Floor64(v)), kNumBins = 21. */
    cr_assert_eq(bin_for_size(1), 0);                       /* max(1, 256) >> 8 = 1, log2 = 0 */
    cr_assert_eq(bin_for_size(256), 0);                     /* 1 */
    cr_assert_eq(bin_for_size(511), 0);                     /* 511 >> 8 = 1 */
    cr_assert_eq(bin_for_size(512), 1);                     /* 2 */
    cr_assert_eq(bin_for_size(1023), 1);                    /* 3 */
    cr_assert_eq(bin_for_size(1024), 2);                    /* 4 */
    cr_assert_eq(bin_for_size(MiB), 12);                    /* 2^20 >> 8 = 2^12 */
    cr_assert_eq(bin_for_size(3 * MiB), 13);                /* 3 * 2^12, log2 floor 13 */
    cr_assert_eq(bin_for_size(256 * MiB - 1), 19);          /* (2^28 - 1) >> 8 = 2^20 - 1 */
    cr_assert_eq(bin_for_size(256 * MiB), 20);              /* 2^20: the last bin */
    cr_assert_eq(bin_for_size((memsim_size_t)1 << 40), 20); /* capped at kNumBins - 1 */
    /* The constructor's CHECKs: BinNumToSize(b) = 256 << b, and bin b holds
     * [256 << b, 512 << b). */
    for (int b = 0; b < N_BINS; b++) {
        memsim_size_t s = (memsim_size_t)256 << b;
        cr_assert_eq(bin_for_size(s), b);
        cr_assert_eq(bin_for_size(s + 255), b);
        cr_assert_eq(bin_for_size(s * 2 - 1), b);
        if (b + 1 < N_BINS)
            cr_assert_neq(bin_for_size(s * 2), b);
    }
}

static MemsimAlloc *bfc_on(Rig *r, const char *settings, memsim_size_t capacity)
{
    rig_init(r, capacity);
    GError *error = NULL;
    MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("bfc"), settings, &r->dev, &error);
    cr_assert(a, "%s", error ? error->message : "?");
    return a;
}

static memsim_addr_t bfc_mal(MemsimAlloc *a, memsim_size_t n)
{
    memsim_addr_t p = 0;
    cr_assert_eq(memsim_alloc_malloc(a, n, 0, &p), MEMSIM_ALLOC_OK);
    GError *error = NULL;
    cr_assert(memsim_alloc_check(a, &error), "%s", error ? error->message : "?");
    return p;
}

static int64_t allocated_now(MemsimAlloc *a)
{
    return memsim_alloc_stats(a).allocated.current;
}

Test(bfc, region_growth_and_split_rule)
{
    Rig r;
    MemsimAlloc *a = bfc_on(&r, "", 0);
    /* curr_region_allocation_bytes_ starts at RoundedBytes(min(limit, 2 MiB)) = 2 MiB.
     * 1 KiB: no chunk, Extend: 1 KiB <= 2 MiB, not increased: a 2 MiB region, then curr
     * doubles to 4 MiB. The chunk (2 MiB) >= 2 x 1 KiB: split, 1 KiB charged. */
    bfc_mal(a, KiB);
    cr_assert_eq(allocated_now(a), KiB);
    /* 2 MiB: the free rest (2 MiB - 1 KiB) is too small. Extend: 2 MiB <= curr (4 MiB), a
     * 4 MiB region, curr doubles to 8 MiB. 4 MiB >= 2 x 2 MiB: split. */
    bfc_mal(a, 2 * MiB);
    cr_assert_eq(allocated_now(a), KiB + 2 * MiB);
    /* 100 MiB: nothing fits. Extend doubles curr 8 -> 16 -> 32 -> 64 -> 128 MiB (increased,
     * so no doubling after): a 128 MiB region. The chunk (128 MiB) < 2 x 100 MiB and its
     * excess (28 MiB) < kMaxInternalFragmentation (128 MiB): NOT split, 128 MiB charged. */
    bfc_mal(a, 100 * MiB);
    cr_assert_eq(allocated_now(a), KiB + 2 * MiB + 128 * MiB);
    /* 100 MiB again: Extend, 100 MiB <= curr (128 MiB), not increased: a 128 MiB region,
     * then curr doubles to 256 MiB; again not split. */
    bfc_mal(a, 100 * MiB);
    cr_assert_eq(allocated_now(a), KiB + 2 * MiB + 256 * MiB);
    /* 1 MiB: the free chunks are the 2 MiB region's rest (2 MiB - 1 KiB) and the 4 MiB
     * region's rest (2 MiB); the smaller one fits. 2 MiB - 1 KiB < 2 x 1 MiB and the excess
     * (1 MiB - 1 KiB) < 128 MiB: not split, 2 MiB - 1 KiB charged. */
    int64_t before = allocated_now(a);
    bfc_mal(a, MiB);
    cr_assert_eq(allocated_now(a) - before, (int64_t)(2 * MiB - KiB));
    /* 300 MiB: Extend with curr = 256 MiB -> 512 MiB (increased): a 512 MiB region; the
     * excess 212 MiB >= 128 MiB: split. */
    bfc_mal(a, 300 * MiB);
    const memsim_size_t want[] = {2 * MiB, 4 * MiB, 128 * MiB, 128 * MiB, 512 * MiB};
    cr_assert_eq(r.seg_sizes->len, G_N_ELEMENTS(want));
    for (gsize i = 0; i < G_N_ELEMENTS(want); i++)
        cr_assert_eq(g_array_index(r.seg_sizes, memsim_size_t, i), want[i], "region %zu", i);
    cr_assert_eq(allocated_now(a), 4 * MiB + 256 * MiB + 300 * MiB);
    cr_assert_eq(memsim_alloc_stats(a).reserved.current, (int64_t)(774 * MiB));
    memsim_alloc_free_instance(a);
    rig_clear(&r);
}

Test(bfc, best_fit_and_no_split)
{
    Rig r;
    MemsimAlloc *a = bfc_on(&r, "", 0);
    /* One 2 MiB region: a | b (3 KiB) | c | d (2 KiB) | e | rest. */
    memsim_addr_t pa = bfc_mal(a, KiB), pb = bfc_mal(a, 3 * KiB), pc = bfc_mal(a, KiB);
    memsim_addr_t pd = bfc_mal(a, 2 * KiB), pe = bfc_mal(a, KiB);
    cr_assert(pb == pa + KiB && pc == pb + 3 * KiB && pd == pc + KiB && pe == pd + 2 * KiB,
              "requests keep the low end of the chunk they split");
    memsim_alloc_free(a, pb);
    memsim_alloc_free(a, pd);
    /* FindChunkPtr: the smallest chunk that fits, from the request's bin up: 2 KiB -> d. */
    cr_assert_eq(bfc_mal(a, 2 * KiB), pd);
    /* 2 KiB again: b (3 KiB) is the only fit. 3 KiB < 2 x 2 KiB and the excess 1 KiB < 128 MiB:
     * not split, the whole 3 KiB is charged (internal fragmentation). */
    int64_t before = allocated_now(a);
    cr_assert_eq(bfc_mal(a, 2 * KiB), pb);
    cr_assert_eq(allocated_now(a) - before, (int64_t)(3 * KiB));
    /* Coalescing: freeing c and then b and d merges them with each other (b | c | d). */
    memsim_alloc_free(a, pc);
    memsim_alloc_free(a, pb);
    memsim_alloc_free(a, pd);
    MemsimAllocShape sh = memsim_alloc_shape(a);
    cr_assert_eq(sh.n_free_blocks, 2); /* b..d, and the region's rest */
    /* 6 KiB (b + c + d = 3 + 1 + 2 KiB) fits exactly in the merged chunk at b. */
    cr_assert_eq(bfc_mal(a, 6 * KiB), pb);
    memsim_alloc_free_instance(a);
    rig_clear(&r);
}

Test(bfc, max_internal_fragmentation)
{
    /* allow_growth=false: curr = RoundedBytes(limit), so the first Extend takes the whole
     * memory limit as one region. */
    Rig r;
    MemsimAlloc *a = bfc_on(&r, "allow_growth=false", 400 * MiB);
    /* 250 MiB from a 400 MiB chunk: 400 < 500, but the excess 150 MiB >= 128 MiB: split. */
    bfc_mal(a, 250 * MiB);
    cr_assert_eq(allocated_now(a), (int64_t)(250 * MiB));
    cr_assert_eq(g_array_index(r.seg_sizes, memsim_size_t, 0), 400 * MiB);
    memsim_alloc_free_instance(a);
    rig_clear(&r);

    /* 200 MiB from 300 MiB: 300 < 400 and the excess 100 MiB < 128 MiB: not split. */
    a = bfc_on(&r, "allow_growth=false", 300 * MiB);
    bfc_mal(a, 200 * MiB);
    cr_assert_eq(allocated_now(a), (int64_t)(300 * MiB));
    memsim_alloc_free_instance(a);
    rig_clear(&r);

    /* fragmentation_fraction=0.5: max_internal_fragmentation_bytes_ = 0.5 x 400 MiB =
     * 200 MiB > the 150 MiB excess: not split. */
    a = bfc_on(&r, "allow_growth=false,fragmentation_fraction=0.5", 400 * MiB);
    bfc_mal(a, 250 * MiB);
    cr_assert_eq(allocated_now(a), (int64_t)(400 * MiB));
    memsim_alloc_free_instance(a);
    rig_clear(&r);
}

Test(bfc, garbage_collection)
{
    /* An 8 MiB device. 1 KiB: a 2 MiB region (curr -> 4 MiB); freed, the region is wholly
     * free. 7 MiB: no chunk; Extend: available = 8 - 2 = 6 MiB < 7 MiB: fails. */
    Rig r;
    MemsimAlloc *a = bfc_on(&r, "garbage_collection=false", 8 * MiB);
    memsim_addr_t p = bfc_mal(a, KiB);
    memsim_alloc_free(a, p);
    memsim_addr_t q;
    cr_assert_eq(memsim_alloc_malloc(a, 7 * MiB, 0, &q), MEMSIM_ALLOC_OOM);
    /* Without garbage collection that is the end: OOM with 6 MiB free on the device. */
    cr_assert(r.last.kind == MEMSIM_AEV_OOM && r.last.addr == 6 * MiB && r.last.size == 7 * MiB);
    memsim_alloc_free_instance(a);
    rig_clear(&r);

    /* With it, DeallocateFreeRegions frees the 2 MiB region (8 - 2 + 2 >= 7 MiB), then Extend:
     * 7 MiB > curr (4 MiB) -> 8 MiB, min(8 MiB, available 8 MiB): one 8 MiB region. The chunk
     * is < 2 x 7 MiB and its excess 1 MiB < 128 MiB: not split. */
    a = bfc_on(&r, "garbage_collection=true", 8 * MiB);
    p = bfc_mal(a, KiB);
    memsim_alloc_free(a, p);
    bfc_mal(a, 7 * MiB);
    cr_assert_eq(r.seg_frees->len, 1);
    cr_assert_eq(g_array_index(r.seg_frees, memsim_size_t, 0), 2 * MiB);
    cr_assert_eq(g_array_index(r.seg_sizes, memsim_size_t, 1), 8 * MiB);
    MemsimAllocStats st = memsim_alloc_stats(a);
    cr_assert(st.allocated.current == (int64_t)(8 * MiB) && st.n_device_free == 1 &&
              st.n_device_alloc == 2);
    memsim_alloc_free_instance(a);
    rig_clear(&r);
}

Test(bfc, memory_fraction_limits_growth)
{
    /* memory_fraction=0.5 of 64 MiB: a 32 MiB limit. 40 MiB exceeds the available 32 MiB:
     * Extend refuses before asking the device; OOM with the device's free bytes (64 MiB). */
    Rig r;
    MemsimAlloc *a = bfc_on(&r, "memory_fraction=0.5", 64 * MiB);
    memsim_addr_t q;
    cr_assert_eq(memsim_alloc_malloc(a, 40 * MiB, 0, &q), MEMSIM_ALLOC_OOM);
    cr_assert(r.last.kind == MEMSIM_AEV_OOM && r.last.addr == 64 * MiB);
    /* 20 MiB: curr 2 -> 4 -> 8 -> 16 -> 32 MiB, min(32, 32): one 32 MiB region. */
    bfc_mal(a, 20 * MiB);
    cr_assert_eq(g_array_index(r.seg_sizes, memsim_size_t, 0), 32 * MiB);
    memsim_alloc_free_instance(a);
    rig_clear(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* stitch: the mechanism, by hand */

Test(stitch, free_chunks_serve_a_larger_request)
{
    Rig r;
    rig_init(&r, 10 * MiB);
    GError *error = NULL;
    MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("stitch"), "", &r.dev, &error);
    cr_assert(a);
    memsim_addr_t p[4];
    for (int i = 0; i < 4; i++) /* four 2 MiB ranges: 8 MiB of a 10 MiB device */
        cr_assert_eq(memsim_alloc_malloc(a, 2 * MiB, 0, &p[i]), MEMSIM_ALLOC_OK);
    memsim_alloc_free(a, p[0]);
    memsim_alloc_free(a, p[2]);
    /* 4 MiB: no free block holds it, but the two free chunks do: stitched into a new virtual
     * range, no new memory. */
    memsim_addr_t s;
    cr_assert_eq(memsim_alloc_malloc(a, 4 * MiB, 0, &s), MEMSIM_ALLOC_OK);
    MemsimAllocStats st = memsim_alloc_stats(a);
    cr_assert_eq(st.reserved.current, (int64_t)(8 * MiB));
    cr_assert_eq(st.n_device_alloc, 4);
    cr_assert(memsim_alloc_check(a, &error), "%s", error ? error->message : "?");
    /* 4 MiB more: 2 MiB free (p[1]) + 2 MiB the device still has: stitched with 2 MiB new. */
    memsim_alloc_free(a, p[1]);
    memsim_addr_t t;
    cr_assert_eq(memsim_alloc_malloc(a, 4 * MiB, 0, &t), MEMSIM_ALLOC_OK);
    st = memsim_alloc_stats(a);
    cr_assert_eq(st.reserved.current, (int64_t)(10 * MiB));
    cr_assert_eq(st.reserved.peak, (int64_t)(10 * MiB), "the moved chunks count once");
    cr_assert_eq(st.n_device_alloc, 5);
    cr_assert(memsim_alloc_check(a, &error), "%s", error ? error->message : "?");
    /* Best fit with the same four blocks in one 8 MiB segment: the two 2 MiB holes are
     * apart, nothing can be given back, and 4 MiB more do not fit the device. */
    Player b;
    player_start(&b, "best-fit:segment_mb=8", 10 * MiB);
    for (guint i = 0; i < 4; i++)
        player_alloc(&b, i, 2 * MiB, 0);
    player_free(&b, 0);
    player_free(&b, 2);
    cr_assert_eq(player_alloc(&b, 4, 4 * MiB, 0), MEMSIM_ALLOC_OOM);
    player_end(&b);
    memsim_alloc_free_instance(a);
    rig_clear(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* buddy: rounding and merging, by hand */

Test(buddy, powers_of_two_and_merging)
{
    Rig r;
    rig_init(&r, 0);
    MemsimAlloc *a = memsim_alloc_new(memsim_alloc_find("buddy"), "", &r.dev, NULL);
    cr_assert_eq(memsim_alloc_round_size(a, 1), 512);
    cr_assert_eq(memsim_alloc_round_size(a, 513), 1024);
    cr_assert_eq(memsim_alloc_round_size(a, 3 * MiB), 4 * MiB);
    memsim_addr_t x, y, z;
    cr_assert_eq(memsim_alloc_malloc(a, 600, 0, &x), MEMSIM_ALLOC_OK);
    cr_assert_eq(memsim_alloc_malloc(a, 600, 0, &y), MEMSIM_ALLOC_OK);
    /* A 64 MiB arena halved down to 1 KiB: x at its base, y is x's buddy. */
    cr_assert_eq(y, x + KiB);
    cr_assert_eq(g_array_index(r.seg_sizes, memsim_size_t, 0), 64 * MiB);
    /* The 64 MiB arena (order 17 in 512-byte units) was halved down to order 1 (1 KiB),
     * leaving one free block of each order 1..16; y took the 1 KiB one: 15 remain. */
    cr_assert_eq(memsim_alloc_shape(a).n_free_blocks, 15);
    cr_assert_eq(memsim_alloc_malloc(a, 100 * MiB, 0, &z), MEMSIM_ALLOC_OK);
    cr_assert_eq(g_array_index(r.seg_sizes, memsim_size_t, 1), 128 * MiB);
    memsim_alloc_free(a, y);
    memsim_alloc_free(a, x);
    memsim_alloc_free(a, z);
    /* Everything merged back: one free block per arena. */
    cr_assert_eq(memsim_alloc_shape(a).n_free_blocks, 2);
    memsim_alloc_free_instance(a);
    rig_clear(&r);
}

/* ---------------------------------------------------------------------------------------- */
/* Comparing policies (sim/compare.c) and `memsim compare` */

static char **specs_of(const char *list)
{
    GError *error = NULL;
    char **v = memsim_compare_parse_specs(list, &error);
    cr_assert(v, "'%s': %s", list, error ? error->message : "?");
    return v;
}

Test(compare, parse_specs)
{
    g_auto(GStrv) a = specs_of("torch,torch:expandable_segments=True,bfc,buddy,exact");
    cr_assert_eq(g_strv_length(a), 5);
    cr_assert_str_eq(a[1], "torch:expandable_segments=True");
    /* A token that is not a policy name continues the settings before it. */
    g_auto(GStrv) b = specs_of("torch:expandable_segments=True,max_split_size_mb=128, bfc");
    cr_assert_eq(g_strv_length(b), 2);
    cr_assert_str_eq(b[0], "torch:expandable_segments=True,max_split_size_mb=128");
    cr_assert_str_eq(b[1], "bfc");
    /* Commas inside torch's [B:N,...] lists do not split. */
    g_auto(GStrv) c = specs_of("torch:roundup_power2_divisions=[256:1,512:2];stitch");
    cr_assert_eq(g_strv_length(c), 2);
    cr_assert_str_eq(c[0], "torch:roundup_power2_divisions=[256:1,512:2]");
    guint n = 0;
    while (memsim_alloc_registry()[n])
        n++;
    g_auto(GStrv) all = specs_of("all");
    cr_assert_eq(g_strv_length(all), n);
    const char *bad[] = {"", "nope", "torch,expandable_segments=True", " , "};
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        GError *error = NULL;
        cr_assert_null(memsim_compare_parse_specs(bad[i], &error), "'%s' accepted", bad[i]);
        cr_assert(g_error_matches(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT));
        cr_assert(strstr(error->message, "exact"), "'%s': the message lists the policies: %s",
                  bad[i], error->message);
        g_error_free(error);
    }
}

/* Two ranks: rank 0 keeps four 3 MiB tensors alive and frees every other one before asking
 * for 5 MiB ones; rank 1 allocates 1 GiB. */
static MemsimTrace *two_rank_trace(void)
{
    MemsimTrace *t = memsim_trace_new("two ranks");
    memsim_trace_add_rank(t, 0, 1);
    memsim_trace_add_rank(t, 1, 1);
    for (uint64_t id = 1; id <= 4; id++) {
        MemsimEvent e = {.kind = MEMSIM_EV_ALLOC, .id = id, .size = 3 * MiB};
        memsim_trace_append(t, 0, &e, 1);
    }
    for (uint64_t id = 1; id <= 4; id += 2) {
        MemsimEvent e = {.kind = MEMSIM_EV_FREE, .id = id};
        memsim_trace_append(t, 0, &e, 1);
    }
    for (uint64_t id = 5; id <= 6; id++) {
        MemsimEvent e = {.kind = MEMSIM_EV_ALLOC, .id = id, .size = 5 * MiB};
        memsim_trace_append(t, 0, &e, 1);
    }
    MemsimEvent big = {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = GiB};
    memsim_trace_append(t, 1, &big, 1);
    return t;
}

Test(compare, every_policy_on_a_trace)
{
    MemsimTrace *t = two_rank_trace();
    g_auto(GStrv) specs = specs_of("all,torch:expandable_segments=True");
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    GError *error = NULL;
    MemsimComparison *c = memsim_compare_trace(t, (const char *const *)specs, &o, &error);
    cr_assert(c, "%s", error ? error->message : "?");
    cr_assert_eq(c->n_runs, g_strv_length(specs));
    cr_assert_eq(c->baseline->n_ranks, 2);
    /* exact peaks: rank 0 at 4 x 3 MiB + ... = max(12, 6 + 10) = 16 MiB; rank 1 at 1 GiB. */
    cr_assert_eq(c->baseline->ranks[0].stats.reserved.peak, (int64_t)(16 * MiB));
    cr_assert_eq(c->baseline->ranks[1].stats.reserved.peak, (int64_t)GiB);
    for (guint i = 0; i < c->n_runs; i++) {
        cr_assert(c->runs[i].report, "%s: %s", c->runs[i].spec, c->runs[i].error);
        cr_assert_eq(c->runs[i].report->n_ranks, 2);
        for (guint k = 0; k < 2; k++)
            cr_assert(memsim_comparison_vs_exact(c, i, k) >= 1.0 ||
                          strcmp(c->runs[i].spec, "bfc") == 0,
                      "%s rank %u below exact", c->runs[i].spec, k);
        if (strcmp(c->runs[i].spec, "exact") == 0)
            cr_assert_float_eq(memsim_comparison_vs_exact(c, i, 0), 1.0, 1e-12);
    }
    /* JSON: the policies in order, each with the replay's rank entries. */
    g_autofree char *j = memsim_comparison_to_json(c);
    JsonParser *p = json_parser_new();
    cr_assert(json_parser_load_from_data(p, j, -1, NULL));
    JsonObject *root = json_node_get_object(json_parser_get_root(p));
    JsonArray *pol = json_object_get_array_member(root, "policies");
    cr_assert_eq(json_array_get_length(pol), c->n_runs);
    for (guint i = 0; i < c->n_runs; i++) {
        JsonObject *e = json_array_get_object_element(pol, i);
        cr_assert_str_eq(json_object_get_string_member(e, "allocator"), specs[i]);
        JsonArray *ranks = json_object_get_array_member(e, "ranks");
        cr_assert_eq(json_array_get_length(ranks), 2);
        JsonObject *r0 = json_array_get_object_element(ranks, 0);
        cr_assert_eq(json_object_get_int_member(r0, "peak_reserved"),
                     c->runs[i].report->ranks[0].stats.reserved.peak);
    }
    g_object_unref(p);
    g_autofree char *txt = memsim_comparison_to_text(c);
    cr_assert(strstr(txt, "stitch [rank 1]") && strstr(txt, "x exact"), "%s", txt);
    memsim_comparison_free(c);

    /* Bad settings fail the comparison and name the spec. */
    const char *bad[] = {"bfc:allow_growth=sometimes", NULL};
    c = memsim_compare_trace(t, bad, &o, &error);
    cr_assert(c == NULL && error && strstr(error->message, "bfc:allow_growth=sometimes"));
    g_clear_error(&error);

    /* At a 12 MiB capacity rank 1 runs out of memory everywhere, and its row says so. */
    o.capacity = 12 * MiB;
    const char *two[] = {"best-fit", "stitch", NULL};
    c = memsim_compare_trace(t, two, &o, &error);
    cr_assert(c, "%s", error ? error->message : "?");
    for (guint i = 0; i < c->n_runs; i++)
        cr_assert(c->runs[i].report->ranks[1].oom.happened, "%s", c->runs[i].spec);
    g_autofree char *txt2 = memsim_comparison_to_text(c);
    cr_assert(strstr(txt2, "event 0: 1024.00 MiB requested"), "%s", txt2);
    memsim_comparison_free(c);
    memsim_trace_free(t);
}

Test(compare, command)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *small = g_build_filename(dir, "two-ranks.mst", NULL);
    MemsimTrace *t = two_rank_trace();
    GError *error = NULL;
    cr_assert(memsim_trace_save(t, small, MEMSIM_FORMAT_AUTO, &error), "%s",
              error ? error->message : "?");
    memsim_trace_free(t);
    const char *argv1[] = {"compare", small, "--allocators", "all", "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv1, &out, &err);
    cr_assert_eq(rc, 0, "memsim compare: %s", err);
    JsonParser *p = json_parser_new();
    cr_assert(json_parser_load_from_data(p, out, -1, NULL), "not JSON: %s", out);
    JsonArray *pol =
        json_object_get_array_member(json_node_get_object(json_parser_get_root(p)), "policies");
    guint n = 0;
    while (memsim_alloc_registry()[n])
        n++;
    cr_assert_eq(json_array_get_length(pol), n);
    g_object_unref(p);
    g_unlink(small);

    const char *argv2[] = {"compare",      "--model",          "gpt2",      "--seq", "128",
                           "--allocators", "exact,bfc,stitch", "--gpu-mem", "2GiB",  NULL};
    g_autofree char *out2 = NULL, *err2 = NULL;
    rc = tu_run_memsim(argv2, &out2, &err2);
    cr_assert(rc == 0 || rc == 1, "memsim compare --model: %d %s", rc, err2);
    cr_assert(strstr(out2, "gpt2") && strstr(out2, "stitch") && strstr(out2, "bfc"), "%s", out2);

    const char *argv3[] = {"compare", small, "--allocators", "torch,nonsense", NULL};
    g_autofree char *out3 = NULL, *err3 = NULL;
    cr_assert_eq(tu_run_memsim(argv3, &out3, &err3), 2);
    cr_assert(strstr(err3, "nonsense"), "%s", err3);
    g_rmdir(dir);
    const char *argv4[] = {"compare", NULL};
    g_autofree char *err4 = NULL;
    cr_assert_eq(tu_run_memsim(argv4, NULL, &err4), 2);
}

/* Every policy reports a block's free on the stream the block was asked for (the exported
 * snapshot's free_completed entries carry it), as PyTorch's allocator does. */
static void keep_event(void *user, const MemsimAllocEvent *ev)
{
    g_array_append_val((GArray *)user, *ev);
}

Test(policies, frees_reported_on_the_blocks_stream)
{
    int n = 0;
    for (const MemsimAllocOps *const *q = memsim_alloc_registry(); *q; q++, n++) {
        GArray *evs = g_array_new(FALSE, FALSE, sizeof(MemsimAllocEvent));
        MemsimDevice dev = MEMSIM_DEVICE_INIT;
        dev.user = evs;
        dev.on_event = keep_event;
        GError *error = NULL;
        MemsimAlloc *a = memsim_alloc_new(*q, "", &dev, &error);
        cr_assert(a, "%s: %s", (*q)->name, error ? error->message : "?");
        memsim_addr_t p1 = 0, p2 = 0;
        cr_assert_eq(memsim_alloc_malloc(a, 3 * MiB, 3, &p1), MEMSIM_ALLOC_OK);
        cr_assert_eq(memsim_alloc_malloc(a, 4096, 0, &p2), MEMSIM_ALLOC_OK);
        memsim_alloc_free(a, p1);
        memsim_alloc_free(a, p2);
        int seen = 0;
        for (guint i = 0; i < evs->len; i++) {
            const MemsimAllocEvent *e = &g_array_index(evs, MemsimAllocEvent, i);
            if (e->kind != MEMSIM_AEV_FREE_COMPLETED)
                continue;
            cr_expect_eq(e->stream, e->addr == p1 ? 3u : 0u, "%s: the free of %s on stream %u",
                         (*q)->name, e->addr == p1 ? "the stream-3 block" : "the stream-0 block",
                         e->stream);
            seen++;
        }
        cr_expect_eq(seen, 2, "%s: %d frees reported", (*q)->name, seen);
        memsim_alloc_free_instance(a);
        g_array_unref(evs);
    }
    cr_expect_geq(n, 7, "only %d policies", n);
}
