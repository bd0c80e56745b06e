/* Test helpers for the trace formats: seeded random traces that use every event kind,
 * every header field and extreme values, a realistic alloc/free stream, and a trace
 * comparison. Included by test_mst.c and test_text.c (static functions, no object file).
 */
#ifndef MEMSIM_TESTS_TRACEGEN_H
#define MEMSIM_TESTS_TRACEGEN_H

#include "formats/formats-internal.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An assertion that reaches Criterion only when it fails: Criterion reports every passing
 * assertion to its runner under --full-stats, which costs milliseconds each. */
#define TG_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            cr_assert_fail(__VA_ARGS__);                                                           \
    } while (0)

/* A 64-bit value drawn to hit edges: 0, 1, small, 32-bit, 64-bit, 2^63, 2^64-1. */
static inline uint64_t tg_value(GRand *rng)
{
    switch (g_rand_int_range(rng, 0, 9)) {
    case 0:
        return 0;
    case 1:
        return 1;
    case 2:
        return (uint64_t)g_rand_int_range(rng, 0, 1000);
    case 3:
        return g_rand_int(rng);
    case 4:
        return UINT64_MAX;
    case 5:
        return UINT64_MAX - (uint64_t)g_rand_int_range(rng, 0, 3);
    case 6:
        return (uint64_t)1 << 63;
    default:
        return (uint64_t)g_rand_int(rng) << 32 | g_rand_int(rng);
    }
}

static inline double tg_double(GRand *rng)
{
    static const double some[] = {0, 0.1, 1, 12.5, 1e-300, 4.9e-324, 1e300, 1.0 / 3, 123456.789};
    if (g_rand_boolean(rng))
        return some[g_rand_int_range(rng, 0, G_N_ELEMENTS(some))];
    return g_rand_double_range(rng, 0, 1e6);
}

/* A string of random bytes 1..255 (escapes, UTF-8 fragments, quotes, '#'). */
static inline char *tg_string(GRand *rng)
{
    int n = g_rand_int_range(rng, 0, 12);
    char *s = g_malloc(n + 1);
    for (int i = 0; i < n; i++)
        s[i] = (char)g_rand_int_range(rng, 1, 256);
    s[n] = 0;
    return s;
}

/* One random valid event of `rank` in trace `t`; unused fields get values too at times. */
static inline MemsimEvent tg_event(GRand *rng, const MemsimTraceHeader *h, guint32 rank)
{
    const guint32 n_streams = h->ranks[rank].n_streams;
    MemsimEvent e = {0};
    for (;;) {
        e.kind = (uint8_t)g_rand_int_range(rng, 1, MEMSIM_EV_KIND_MAX + 1);
        if ((e.kind == MEMSIM_EV_OP && h->n_ops == 0) ||
            (e.kind == MEMSIM_EV_MARK && h->n_strings == 0))
            continue;
        break;
    }
    e.stream = (uint16_t)g_rand_int_range(rng, 0, (gint32)n_streams);
    gboolean odd = g_rand_int_range(rng, 0, 8) == 0; /* fields the kind does not use */
    if (odd) {
        e.id = tg_value(rng);
        e.size = tg_value(rng);
        e.addr = tg_value(rng);
        e.aux = tg_value(rng);
        e.category = (uint8_t)g_rand_int_range(rng, 0, MEMSIM_CAT_COUNT);
        e.flags = g_rand_int(rng);
    }
    switch (e.kind) {
    case MEMSIM_EV_ALLOC:
        e.id = tg_value(rng);
        e.size = tg_value(rng);
        e.category = (uint8_t)g_rand_int_range(rng, 0, MEMSIM_CAT_COUNT);
        if (!odd)
            e.flags = g_rand_boolean(rng) ? MEMSIM_EVF_ADDR : 0;
        if (e.flags & MEMSIM_EVF_ADDR)
            e.addr = tg_value(rng);
        break;
    case MEMSIM_EV_FREE:
    case MEMSIM_EV_USE:
        e.id = tg_value(rng);
        break;
    case MEMSIM_EV_OP:
        e.id = (uint64_t)g_rand_int_range(rng, 0, (gint32)h->n_ops);
        break;
    case MEMSIM_EV_WAIT:
        e.id = (uint64_t)g_rand_int_range(rng, 0, (gint32)n_streams);
        break;
    case MEMSIM_EV_COLLECTIVE:
        e.size = tg_value(rng);
        e.id = tg_value(rng);
        e.aux = (uint64_t)g_rand_int_range(rng, 0, MEMSIM_COLL_COUNT);
        break;
    case MEMSIM_EV_EMPTY_CACHE:
        if (!odd)
            e.flags = g_rand_boolean(rng) ? MEMSIM_EVF_INFERRED : 0;
        break;
    case MEMSIM_EV_MARK:
        e.id = (uint64_t)g_rand_int_range(rng, 0, (gint32)h->n_strings);
        break;
    case MEMSIM_EV_INIT_SEGMENT:
        if (!odd)
            e.aux = (uint64_t)g_rand_int_range(rng, 0, 4);
        /* fall through */
    case MEMSIM_EV_SEG_ALLOC:
    case MEMSIM_EV_SEG_FREE:
    case MEMSIM_EV_SEG_MAP:
    case MEMSIM_EV_SEG_UNMAP:
        e.addr = tg_value(rng);
        e.size = tg_value(rng);
        if (e.addr + e.size < e.addr)
            e.addr = UINT64_MAX - e.size;
        break;
    case MEMSIM_EV_OOM:
        e.size = tg_value(rng);
        e.addr = tg_value(rng);
        break;
    case MEMSIM_EV_INIT_BLOCK:
        e.id = tg_value(rng);
        e.size = tg_value(rng);
        e.aux = tg_value(rng);
        e.addr = tg_value(rng);
        if (e.addr + e.aux < e.addr)
            e.addr = UINT64_MAX - e.aux;
        e.category = (uint8_t)g_rand_int_range(rng, 0, MEMSIM_CAT_COUNT);
        break;
    }
    return e;
}

static inline void tg_add_strings_ops(GRand *rng, MemsimTrace *t, int n_strings, int n_ops)
{
    for (int i = 0; i < n_strings; i++) {
        char *s = tg_string(rng);
        char *u = g_strdup_printf("%s#%d", s, memsim_trace_header(t)->n_strings);
        memsim_trace_intern(t, u);
        g_free(s);
        g_free(u);
    }
    MemsimTraceHeader *h = memsim_trace_header(t);
    for (int i = 0; i < n_ops && h->n_strings; i++) {
        static const int32_t ints[] = {-1, 0, 7, G_MAXINT32, G_MININT32};
        MemsimOpInfo op = {
            .name = (uint32_t)g_rand_int_range(rng, 0, (gint32)h->n_strings),
            .phase = (uint8_t)g_rand_int_range(rng, 0, MEMSIM_PHASE_COUNT),
            .layer = ints[g_rand_int_range(rng, 0, G_N_ELEMENTS(ints))],
            .microbatch = ints[g_rand_int_range(rng, 0, G_N_ELEMENTS(ints))],
            .duration_us = tg_double(rng),
        };
        op.bound = (uint8_t)g_rand_int_range(rng, 0, MEMSIM_BOUND_COUNT);
        memsim_trace_add_op(t, &op);
    }
}

/* A random trace: `n_ranks` ranks with every header feature, `n_events` events in all. */
static inline MemsimTrace *tg_random_trace(guint32 seed, guint32 n_ranks, gsize n_events)
{
    GRand *rng = g_rand_new_with_seed(seed);
    char *name = tg_string(rng);
    MemsimTrace *t = memsim_trace_new(name);
    g_free(name);
    MemsimTraceHeader *h = memsim_trace_header(t);
    if (g_rand_boolean(rng))
        h->alloc_conf = tg_string(rng);
    h->capacity = tg_value(rng);
    for (guint32 r = 0; r < n_ranks; r++) {
        memsim_trace_add_rank(t, g_rand_int(rng), g_rand_int_range(rng, 1, 1000));
        h = memsim_trace_header(t);
        MemsimRankInfo *ri = &h->ranks[r];
        ri->n_streams = g_rand_int_range(rng, 0, 10) == 0 ? MEMSIM_MAX_STREAMS
                                                          : (guint32)g_rand_int_range(rng, 1, 5);
        if (g_rand_boolean(rng))
            ri->role = tg_string(rng);
        if (ri->n_streams < 100 && g_rand_boolean(rng)) {
            ri->stream_handles = g_new(uint64_t, ri->n_streams);
            for (guint32 s = 0; s < ri->n_streams; s++)
                ri->stream_handles[s] = tg_value(rng);
        }
        if (g_rand_boolean(rng)) {
            ri->has_final = TRUE;
            ri->final_reserved = tg_value(rng);
            ri->final_allocated = tg_value(rng);
        }
    }
    tg_add_strings_ops(rng, t, g_rand_int_range(rng, 0, 6), g_rand_int_range(rng, 0, 6));
    h = memsim_trace_header(t);
    for (gsize i = 0; i < n_events && n_ranks; i++) {
        guint32 r = (guint32)g_rand_int_range(rng, 0, (gint32)n_ranks);
        MemsimEvent e = tg_event(rng, h, r);
        memsim_trace_append(t, r, &e, 1);
    }
    g_rand_free(rng);
    return t;
}

/* A realistic stream: ops, allocations with rising ids and a few sizes, frees of recent
 * tensors, record_stream, waits and collectives on a second stream. Call with i = 0, 1, ...
 * and the same state. */
typedef struct {
    GRand *rng;
    uint64_t next_id;
    uint64_t live[64];
    int n_live;
} TgRealistic;

static inline MemsimEvent tg_realistic(TgRealistic *s)
{
    static const uint64_t sizes[] = {512, 4096, 65536, 1 << 20, 16777216, 50331648, 8192 * 4096};
    MemsimEvent e = {0};
    guint32 x = g_rand_int_range(s->rng, 0, 100);
    if (x < 8) {
        e.kind = MEMSIM_EV_OP;
        e.id = (uint64_t)g_rand_int_range(s->rng, 0, 4);
    } else if (x < 52 || s->n_live == 0) {
        e.kind = MEMSIM_EV_ALLOC;
        e.id = s->next_id++;
        e.size = sizes[g_rand_int_range(s->rng, 0, G_N_ELEMENTS(sizes))] *
                 (uint64_t)g_rand_int_range(s->rng, 1, 4);
        e.category = (uint8_t)g_rand_int_range(s->rng, 0, MEMSIM_CAT_COUNT);
        if (s->n_live == 64) { /* forget the oldest: it is freed later in real programs */
            memmove(s->live, s->live + 1, sizeof s->live - sizeof s->live[0]);
            s->n_live--;
        }
        s->live[s->n_live++] = e.id;
    } else if (x < 94) {
        e.kind = MEMSIM_EV_FREE;
        int k = s->n_live - 1 - g_rand_int_range(s->rng, 0, MIN(s->n_live, 4));
        e.id = s->live[k];
        memmove(s->live + k, s->live + k + 1, sizeof s->live[0] * (gsize)(s->n_live - k - 1));
        s->n_live--;
    } else if (x < 97) {
        e.kind = MEMSIM_EV_USE;
        e.id = s->live[s->n_live - 1];
        e.stream = 1;
    } else if (x < 99) {
        e.kind = MEMSIM_EV_WAIT;
        e.stream = 1;
        e.id = 0;
    } else {
        e.kind = MEMSIM_EV_COLLECTIVE;
        e.stream = 1;
        e.size = 1 << 26;
        e.id = 1;
        e.aux = MEMSIM_COLL_ALL_GATHER;
    }
    return e;
}

/* A header for tg_realistic streams: ranks with two streams, four ops. */
static inline MemsimTrace *tg_realistic_trace_header(guint32 n_ranks)
{
    MemsimTrace *t = memsim_trace_new("realistic");
    for (guint32 r = 0; r < n_ranks; r++) {
        memsim_trace_add_rank(t, r, 1);
        memsim_trace_header(t)->ranks[r].n_streams = 2;
    }
    static const char *const names[] = {"linear", "softmax", "matmul", "all_gather"};
    for (int i = 0; i < 4; i++) {
        MemsimOpInfo op = {.name = memsim_trace_intern(t, names[i]),
                           .phase = 1,
                           .layer = i,
                           .microbatch = -1,
                           .duration_us = 10};
        memsim_trace_add_op(t, &op);
    }
    return t;
}

static inline void tg_assert_same_header(const MemsimTraceHeader *a, const MemsimTraceHeader *b)
{
    TG_CHECK(strcmp(a->name ? a->name : "", b->name ? b->name : "") == 0, "names differ");
    TG_CHECK((a->alloc_conf == NULL) == (b->alloc_conf == NULL), "alloc_conf presence differs");
    if (a->alloc_conf)
        TG_CHECK(strcmp(a->alloc_conf, b->alloc_conf) == 0, "alloc_conf differs");
    TG_CHECK(a->capacity == b->capacity, "%s differs", "a->capacity");
    TG_CHECK(a->n_ranks == b->n_ranks, "%s differs", "a->n_ranks");
    for (guint32 i = 0; i < a->n_ranks; i++) {
        const MemsimRankInfo *x = &a->ranks[i], *y = &b->ranks[i];
        TG_CHECK(x->device == y->device, "rank %u device", i);
        TG_CHECK(x->multiplicity == y->multiplicity, "rank %u multiplicity", i);
        TG_CHECK(x->n_streams == y->n_streams, "rank %u streams", i);
        TG_CHECK((x->role == NULL) == (y->role == NULL), "rank %u role presence", i);
        if (x->role)
            TG_CHECK(strcmp(x->role, y->role) == 0, "rank %u role", i);
        TG_CHECK((x->stream_handles == NULL) == (y->stream_handles == NULL),
                 "rank %u handles presence", i);
        if (x->stream_handles)
            TG_CHECK(
                memcmp(x->stream_handles, y->stream_handles, sizeof(uint64_t) * x->n_streams) == 0,
                "rank %u handles", i);
        TG_CHECK(!!x->has_final == !!y->has_final, "rank %u has_final", i);
        TG_CHECK(x->final_reserved == y->final_reserved, "%s differs", "x->final_reserved");
        TG_CHECK(x->final_allocated == y->final_allocated, "%s differs", "x->final_allocated");
    }
    TG_CHECK(a->n_strings == b->n_strings, "%s differs", "a->n_strings");
    for (guint32 i = 0; i < a->n_strings; i++)
        if (strcmp(a->strings[i], b->strings[i]) != 0)
            cr_assert_fail("string %u differs", i);
    TG_CHECK(a->n_ops == b->n_ops, "%s differs", "a->n_ops");
    for (guint32 i = 0; i < a->n_ops; i++) {
        const MemsimOpInfo *x = &a->ops[i], *y = &b->ops[i];
        if (!(x->name == y->name && x->phase == y->phase && x->layer == y->layer &&
              x->microbatch == y->microbatch && x->bound == y->bound &&
              memcmp(&x->duration_us, &y->duration_us, sizeof(double)) == 0))
            cr_assert_fail("op %u differs", i);
    }
}

static inline void tg_assert_same_trace(MemsimTrace *a, MemsimTrace *b)
{
    tg_assert_same_header(memsim_trace_header(a), memsim_trace_header(b));
    for (guint32 r = 0; r < memsim_trace_header(a)->n_ranks; r++) {
        gsize na, nb;
        const MemsimEvent *ea = memsim_trace_events(a, r, &na);
        const MemsimEvent *eb = memsim_trace_events(b, r, &nb);
        TG_CHECK(na == nb, "rank %u: %zu events, then %zu", r, na, nb);
        /* Assertions are counted one by one (--full-stats): compare first. */
        for (gsize i = 0; i < na; i++)
            if (memcmp(&ea[i], &eb[i], sizeof ea[i]) != 0)
                cr_assert_fail("rank %u event %zu differs: kind %u/%u id %lu/%lu size %lu/%lu addr "
                               "%lu/%lu aux %lu/%lu flags %x/%x cat %u/%u stream %u/%u",
                               r, i, ea[i].kind, eb[i].kind, ea[i].id, eb[i].id, ea[i].size,
                               eb[i].size, ea[i].addr, eb[i].addr, ea[i].aux, eb[i].aux,
                               ea[i].flags, eb[i].flags, ea[i].category, eb[i].category,
                               ea[i].stream, eb[i].stream);
    }
}

/* Writes a trace to memory in `format`; returns the bytes (newly allocated). */
static inline char *tg_save_memory(MemsimTrace *t, MemsimFormat format, gsize *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    GError *err = NULL;
    MemsimTraceWriter *w =
        memsim_trace_writer_new_stream(f, TRUE, "mem", format, memsim_trace_header(t), &err);
    TG_CHECK(w != NULL, "%s", err ? err->message : "?");
    for (guint32 r = 0; r < memsim_trace_header(t)->n_ranks; r++) {
        gsize ne;
        const MemsimEvent *ev = memsim_trace_events(t, r, &ne);
        TG_CHECK(memsim_trace_writer_write(w, r, ev, ne, &err), "%s", err ? err->message : "?");
    }
    TG_CHECK(memsim_trace_writer_close(w, &err), "%s", err ? err->message : "?");
    *len = n;
    return buf;
}

static inline MemsimTraceReader *tg_open_memory(const char *data, gsize len, const char *name,
                                                GError **err)
{
    MemsimSource src;
    memsim_source_init_memory(&src, (const guint8 *)data, len);
    return memsim_trace_reader_open_source(&src, name, MEMSIM_FORMAT_AUTO, err);
}

static inline char *tg_read_file(const char *path, gsize *len)
{
    char *data = NULL;
    GError *err = NULL;
    cr_assert(g_file_get_contents(path, &data, len, &err), "%s", err ? err->message : "?");
    return data;
}

/* Runs a reader to its end; returns FALSE with *error set on bad input. */
static inline gboolean tg_drain(MemsimTraceReader *r, guint64 *n_events, GError **error)
{
    guint32 rank;
    const MemsimEvent *ev;
    gsize n;
    guint64 total = 0;
    GError *local = NULL;
    while ((n = memsim_trace_reader_next(r, &rank, &ev, &local)) > 0)
        total += n;
    if (n_events)
        *n_events = total;
    if (local) {
        g_propagate_error(error, local);
        return FALSE;
    }
    return TRUE;
}

/* Every file of tests/data/bad with extension `ext` must fail with a BAD_INPUT error that
 * names the file. */
static inline void tg_check_bad_corpus(const char *ext)
{
    char *dir = tu_test_data("bad");
    GDir *d = g_dir_open(dir, 0, NULL);
    cr_assert(d != NULL, "cannot open %s", dir);
    int checked = 0;
    const char *f;
    while ((f = g_dir_read_name(d))) {
        if (!g_str_has_suffix(f, ext))
            continue;
        char *path = g_build_filename(dir, f, NULL);
        GError *err = NULL;
        MemsimTraceReader *r = memsim_trace_reader_open(path, &err);
        gboolean ok = r != NULL && tg_drain(r, NULL, &err);
        memsim_trace_reader_free(r);
        cr_assert(!ok, "%s was accepted", f);
        cr_assert(err != NULL);
        cr_expect(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT),
                  "%s: not a bad-input error: %s", f, err->message);
        cr_expect(strstr(err->message, f) != NULL, "%s: message does not name the file: %s", f,
                  err->message);
        cr_log_info("%s: %s", f, err->message);
        g_error_free(err);
        g_free(path);
        checked++;
    }
    g_dir_close(d);
    g_free(dir);
    cr_assert(checked > 0, "no %s files in tests/data/bad", ext);
}

#endif
