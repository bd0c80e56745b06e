/* The in-memory trace (include/memsim/trace.h, formats/trace.c): creating a trace, ranks,
 * the string table (interning) and the op table, appending events, the stream count that
 * grows to cover them, header copies, the enumerations' names, the documented misuse, the
 * invariants the writers and readers enforce, and round trips of a hand-built trace through
 * the .mst and text writers and readers (include/memsim/formats.h), field by field.
 */
#include <criterion/criterion.h>
#include <memsim/formats.h>
#include <memsim/trace.h>

#include <glib/gstdio.h>
#include <signal.h>
#include <string.h>

#include "testutil.h"

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

/* ---------------------------------------------------------------------------------------- */
/* Helpers */

static const MemsimEvent *events_of(MemsimTrace *t, guint32 rank, gsize *n)
{
    *n = 12345; /* must be overwritten */
    return memsim_trace_events(t, rank, n);
}

static void assert_same_event(const MemsimEvent *want, const MemsimEvent *got, const char *where,
                              guint32 rank, gsize i)
{
#define SAME(f)                                                                                    \
    cr_assert_eq((uint64_t)got->f, (uint64_t)want->f,                                              \
                 "%s: rank %u event %zu: " #f " %" G_GUINT64_FORMAT ", expected %" G_GUINT64_FORMAT, \
                 where, rank, i, (uint64_t)got->f, (uint64_t)want->f)
    SAME(kind);
    SAME(category);
    SAME(stream);
    SAME(flags);
    SAME(id);
    SAME(size);
    SAME(addr);
    SAME(aux);
#undef SAME
}

static void assert_same_str(const char *want, const char *got, const char *what, const char *where)
{
    if (!want) {
        cr_assert_null(got, "%s: %s is '%s', expected none", where, what, got);
        return;
    }
    cr_assert_not_null(got, "%s: %s missing, expected '%s'", where, what, want);
    cr_assert_str_eq(got, want, "%s: %s differs", where, what);
}

/* Every header field, one by one. */
static void assert_same_header(const MemsimTraceHeader *want, const MemsimTraceHeader *got,
                               const char *where)
{
    assert_same_str(want->name, got->name, "name", where);
    assert_same_str(want->alloc_conf, got->alloc_conf, "alloc_conf", where);
    cr_assert_eq(got->capacity, want->capacity, "%s: capacity", where);
    cr_assert_eq(got->n_ranks, want->n_ranks, "%s: n_ranks", where);
    for (guint32 i = 0; i < want->n_ranks; i++) {
        const MemsimRankInfo *x = &want->ranks[i], *y = &got->ranks[i];
        cr_assert_eq(y->device, x->device, "%s: rank %u device", where, i);
        cr_assert_eq(y->multiplicity, x->multiplicity, "%s: rank %u multiplicity", where, i);
        cr_assert_eq(y->n_streams, x->n_streams, "%s: rank %u n_streams %u, expected %u", where, i,
                     y->n_streams, x->n_streams);
        assert_same_str(x->role, y->role, "role", where);
        cr_assert_eq(y->stream_handles == NULL, x->stream_handles == NULL,
                     "%s: rank %u stream handles presence", where, i);
        for (guint32 s = 0; x->stream_handles && s < x->n_streams; s++)
            cr_assert_eq(y->stream_handles[s], x->stream_handles[s], "%s: rank %u handle %u",
                         where, i, s);
        cr_assert_eq(!!y->has_final, !!x->has_final, "%s: rank %u has_final", where, i);
        cr_assert_eq(y->final_reserved, x->final_reserved, "%s: rank %u final_reserved", where,
                     i);
        cr_assert_eq(y->final_allocated, x->final_allocated, "%s: rank %u final_allocated",
                     where, i);
    }
    cr_assert_eq(got->n_strings, want->n_strings, "%s: n_strings %u, expected %u", where,
                 got->n_strings, want->n_strings);
    for (guint32 i = 0; i < want->n_strings; i++)
        cr_assert_str_eq(got->strings[i], want->strings[i], "%s: string %u", where, i);
    cr_assert_eq(got->n_ops, want->n_ops, "%s: n_ops", where);
    for (guint32 i = 0; i < want->n_ops; i++) {
        const MemsimOpInfo *x = &want->ops[i], *y = &got->ops[i];
        cr_assert_eq(y->name, x->name, "%s: op %u name", where, i);
        cr_assert_eq(y->phase, x->phase, "%s: op %u phase", where, i);
        cr_assert_eq(y->layer, x->layer, "%s: op %u layer", where, i);
        cr_assert_eq(y->microbatch, x->microbatch, "%s: op %u microbatch", where, i);
        cr_assert(memcmp(&y->duration_us, &x->duration_us, sizeof(double)) == 0,
                  "%s: op %u duration %.17g, expected %.17g", where, i, y->duration_us,
                  x->duration_us);
    }
}

static void assert_same_trace(MemsimTrace *want, MemsimTrace *got, const char *where)
{
    assert_same_header(memsim_trace_header(want), memsim_trace_header(got), where);
    for (guint32 r = 0; r < memsim_trace_header(want)->n_ranks; r++) {
        gsize nw, ng;
        const MemsimEvent *ew = events_of(want, r, &nw);
        const MemsimEvent *eg = events_of(got, r, &ng);
        cr_assert_eq(ng, nw, "%s: rank %u has %zu events, expected %zu", where, r, ng, nw);
        for (gsize i = 0; i < nw; i++)
            assert_same_event(&ew[i], &eg[i], where, r, i);
    }
}

/* A file in a fresh temporary folder; remove_tmp() removes both. */
static char *tmp_file(const char *name)
{
    char *dir = tu_tmpdir();
    char *path = g_build_filename(dir, name, NULL);
    g_free(dir);
    return path;
}

static void remove_tmp(char *path)
{
    g_unlink(path);
    char *dir = g_path_get_dirname(path);
    g_rmdir(dir);
    g_free(dir);
    g_free(path);
}

/* ---------------------------------------------------------------------------------------- */
/* Creating and freeing */

Test(trace_new, empty_with_its_name_copied)
{
    char name[] = "my run";
    MemsimTrace *t = memsim_trace_new(name);
    cr_assert_not_null(t);
    name[0] = 'X'; /* the trace holds its own copy */
    MemsimTraceHeader *h = memsim_trace_header(t);
    cr_assert_not_null(h);
    cr_assert_str_eq(h->name, "my run");
    cr_assert_null(h->alloc_conf);
    cr_assert_eq(h->capacity, 0);
    cr_assert_eq(h->n_ranks, 0);
    cr_assert_eq(h->n_strings, 0);
    cr_assert_eq(h->n_ops, 0);
    cr_assert_eq(memsim_trace_header(t), h, "the header moved without a change");
    memsim_trace_free(t);
}

Test(trace_new, null_is_accepted_by_free_and_clear)
{
    memsim_trace_free(NULL);
    memsim_trace_header_clear(NULL);
}

/* Fields a caller sets on the header (as readers and generators do) belong to the trace and
 * are freed with it (AddressSanitizer's leak check sees the rest). */
Test(trace_new, caller_set_fields_are_owned)
{
    MemsimTrace *t = memsim_trace_new("owned");
    memsim_trace_add_rank(t, 0, 1);
    MemsimTraceHeader *h = memsim_trace_header(t);
    h->alloc_conf = g_strdup("expandable_segments:True");
    h->capacity = 80 * GiB;
    h->ranks[0].role = g_strdup("stage 0");
    h->ranks[0].n_streams = 2;
    h->ranks[0].stream_handles = g_new0(uint64_t, 2);
    h->ranks[0].stream_handles[1] = 0x7f3a00001234;
    cr_assert_eq(memsim_trace_header(t)->capacity, 80 * GiB);
    memsim_trace_free(t);
}

/* ---------------------------------------------------------------------------------------- */
/* Ranks */

Test(trace_ranks, indices_and_fields)
{
    MemsimTrace *t = memsim_trace_new("ranks");
    cr_assert_eq(memsim_trace_add_rank(t, 0, 1), 0);
    cr_assert_eq(memsim_trace_add_rank(t, 5, 8), 1);
    cr_assert_eq(memsim_trace_add_rank(t, 5, 1), 2); /* the same device again: its own rank */
    MemsimTraceHeader *h = memsim_trace_header(t);
    cr_assert_eq(h->n_ranks, 3);
    static const guint32 device[] = {0, 5, 5}, mult[] = {1, 8, 1};
    for (guint32 r = 0; r < 3; r++) {
        cr_assert_eq(h->ranks[r].device, device[r]);
        cr_assert_eq(h->ranks[r].multiplicity, mult[r]);
        cr_assert_eq(h->ranks[r].n_streams, 1, "a new rank has one stream");
        cr_assert_null(h->ranks[r].role);
        cr_assert_null(h->ranks[r].stream_handles);
        cr_assert(!h->ranks[r].has_final);
        cr_assert_eq(h->ranks[r].final_reserved, 0);
        cr_assert_eq(h->ranks[r].final_allocated, 0);
        gsize n;
        events_of(t, r, &n);
        cr_assert_eq(n, 0, "rank %u starts with %zu events", r, n);
    }
    memsim_trace_free(t);
}

Test(trace_ranks, many)
{
    MemsimTrace *t = memsim_trace_new("many");
    for (guint32 r = 0; r < 1000; r++) {
        cr_assert_eq(memsim_trace_add_rank(t, 1000 - r, r + 1), r);
        MemsimEvent ev = {.kind = MEMSIM_EV_ALLOC, .id = r, .size = 512};
        memsim_trace_append(t, r, &ev, 1);
    }
    MemsimTraceHeader *h = memsim_trace_header(t);
    for (guint32 r = 0; r < 1000; r++) {
        cr_assert_eq(h->ranks[r].device, 1000 - r);
        cr_assert_eq(h->ranks[r].multiplicity, r + 1);
        gsize n;
        const MemsimEvent *ev = events_of(t, r, &n);
        cr_assert_eq(n, 1);
        cr_assert_eq(ev[0].id, r);
    }
    memsim_trace_free(t);
}

/* ---------------------------------------------------------------------------------------- */
/* The string table */

Test(trace_strings, same_string_same_index)
{
    MemsimTrace *t = memsim_trace_new("strings");
    char buf[16];
    strcpy(buf, "linear");
    cr_assert_eq(memsim_trace_intern(t, buf), 0);
    cr_assert_eq(memsim_trace_intern(t, "softmax"), 1);
    strcpy(buf, "XXXXXX"); /* the table holds a copy */
    cr_assert_eq(memsim_trace_intern(t, "linear"), 0, "the same text from another buffer");
    cr_assert_eq(memsim_trace_intern(t, ""), 2);
    cr_assert_eq(memsim_trace_intern(t, "linea"), 3, "a prefix is another string");
    cr_assert_eq(memsim_trace_intern(t, "linear "), 4);
    cr_assert_eq(memsim_trace_intern(t, "Linear"), 5);
    cr_assert_eq(memsim_trace_intern(t, "step 1\t\"q\"\\ é"), 6);
    cr_assert_eq(memsim_trace_intern(t, ""), 2);
    cr_assert_eq(memsim_trace_intern(t, "softmax"), 1);
    cr_assert_eq(memsim_trace_intern(t, "step 1\t\"q\"\\ é"), 6);
    MemsimTraceHeader *h = memsim_trace_header(t);
    cr_assert_eq(h->n_strings, 7);
    static const char *want[] = {"linear", "softmax", "", "linea", "linear ", "Linear",
                                 "step 1\t\"q\"\\ é"};
    for (guint32 i = 0; i < 7; i++)
        cr_assert_str_eq(h->strings[i], want[i], "string %u", i);
    memsim_trace_free(t);
}

Test(trace_strings, many_strings_keep_their_indices)
{
    MemsimTrace *t = memsim_trace_new("strings");
    /* (The table grows by one entry per string: kept small for AddressSanitizer, whose
     * realloc copies every time.) */
    enum { N = 4000 };
    for (guint32 i = 0; i < N; i++) {
        char s[32];
        g_snprintf(s, sizeof s, "op_%u", i);
        guint32 k = memsim_trace_intern(t, s);
        if (k != i)
            cr_assert_fail("string %u got index %u", i, k);
    }
    /* Again, in another order: the first indices come back; nothing is added. */
    for (guint32 i = N; i-- > 0;) {
        char s[32];
        g_snprintf(s, sizeof s, "op_%u", i);
        guint32 k = memsim_trace_intern(t, s);
        if (k != i)
            cr_assert_fail("string %u interned again got index %u", i, k);
    }
    MemsimTraceHeader *h = memsim_trace_header(t);
    cr_assert_eq(h->n_strings, N);
    cr_assert_str_eq(h->strings[0], "op_0");
    cr_assert_str_eq(h->strings[N - 1], "op_3999");
    memsim_trace_free(t);
}

/* ---------------------------------------------------------------------------------------- */
/* The op table */

Test(trace_ops, copied_with_consecutive_indices)
{
    MemsimTrace *t = memsim_trace_new("ops");
    guint32 name = memsim_trace_intern(t, "matmul");
    enum { N = 1000 }; /* past any initial capacity, several growths */
    for (guint32 i = 0; i < N; i++) {
        MemsimOpInfo op = {.name = name,
                           .phase = (uint8_t)(i % MEMSIM_PHASE_COUNT),
                           .layer = i % 7 == 0 ? -1 : (int32_t)i,
                           .microbatch = i % 2 ? G_MININT32 : G_MAXINT32,
                           .duration_us = i * 0.25};
        guint32 k = memsim_trace_add_op(t, &op);
        if (k != i)
            cr_assert_fail("op %u got index %u", i, k);
        op.layer = 12345; /* the table holds a copy */
    }
    MemsimTraceHeader *h = memsim_trace_header(t);
    cr_assert_eq(h->n_ops, N);
    for (guint32 i = 0; i < N; i++) {
        const MemsimOpInfo *op = &h->ops[i];
        if (op->name != name || op->phase != i % MEMSIM_PHASE_COUNT ||
            op->layer != (i % 7 == 0 ? -1 : (int32_t)i) ||
            op->microbatch != (i % 2 ? G_MININT32 : G_MAXINT32) || op->duration_us != i * 0.25)
            cr_assert_fail("op %u differs", i);
    }
    /* Strings and ops are separate tables. */
    cr_assert_eq(h->n_strings, 1);
    memsim_trace_free(t);
}

/* ---------------------------------------------------------------------------------------- */
/* Events */

Test(trace_events, appended_copies_in_order_per_rank)
{
    MemsimTrace *t = memsim_trace_new("events");
    guint32 r0 = memsim_trace_add_rank(t, 0, 1);
    guint32 r1 = memsim_trace_add_rank(t, 1, 1);
    MemsimEvent batch[3] = {
        {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = 4096, .category = MEMSIM_CAT_ACTIVATION},
        {.kind = MEMSIM_EV_ALLOC, .id = 2, .size = 8192, .category = MEMSIM_CAT_PARAMETER},
        {.kind = MEMSIM_EV_FREE, .id = 1},
    };
    memsim_trace_append(t, r0, batch, 3);
    batch[0].id = 99; /* the trace holds a copy */
    MemsimEvent other = {.kind = MEMSIM_EV_EMPTY_CACHE};
    memsim_trace_append(t, r1, &other, 1);
    memsim_trace_append(t, r0, batch, 0); /* nothing */
    MemsimEvent last = {.kind = MEMSIM_EV_FREE, .id = 2};
    memsim_trace_append(t, r0, &last, 1);

    gsize n;
    const MemsimEvent *ev = events_of(t, r0, &n);
    cr_assert_eq(n, 4);
    cr_assert_eq(ev[0].kind, MEMSIM_EV_ALLOC);
    cr_assert_eq(ev[0].id, 1);
    cr_assert_eq(ev[0].size, 4096);
    cr_assert_eq(ev[0].category, MEMSIM_CAT_ACTIVATION);
    cr_assert_eq(ev[1].id, 2);
    cr_assert_eq(ev[1].size, 8192);
    cr_assert_eq(ev[1].category, MEMSIM_CAT_PARAMETER);
    cr_assert_eq(ev[2].kind, MEMSIM_EV_FREE);
    cr_assert_eq(ev[2].id, 1);
    cr_assert_eq(ev[3].kind, MEMSIM_EV_FREE);
    cr_assert_eq(ev[3].id, 2);
    ev = events_of(t, r1, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(ev[0].kind, MEMSIM_EV_EMPTY_CACHE);
    memsim_trace_free(t);
}

Test(trace_events, long_program)
{
    MemsimTrace *t = memsim_trace_new("long");
    guint32 r = memsim_trace_add_rank(t, 0, 1);
    enum { N = 200000 };
    MemsimEvent chunk[1000];
    for (guint32 base = 0; base < N; base += 1000) {
        for (guint32 i = 0; i < 1000; i++)
            chunk[i] = (MemsimEvent){.kind = MEMSIM_EV_ALLOC, .id = base + i, .size = 512};
        memsim_trace_append(t, r, chunk, 1000);
    }
    gsize n;
    const MemsimEvent *ev = events_of(t, r, &n);
    cr_assert_eq(n, N);
    for (gsize i = 0; i < n; i++)
        if (ev[i].id != i)
            cr_assert_fail("event %zu has id %" G_GUINT64_FORMAT, i, ev[i].id);
    memsim_trace_free(t);
}

/* "the rank's n_streams grows to cover them": the stream an event runs on, and the stream a
 * WAIT waits for; it never shrinks, and another rank is not touched. */
Test(trace_events, stream_count_grows_to_cover_events)
{
    MemsimTrace *t = memsim_trace_new("streams");
    guint32 r0 = memsim_trace_add_rank(t, 0, 1);
    guint32 r1 = memsim_trace_add_rank(t, 1, 1);
    MemsimEvent ev = {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = 512, .stream = 3};
    memsim_trace_append(t, r0, &ev, 1);
    cr_assert_eq(memsim_trace_header(t)->ranks[r0].n_streams, 4);
    MemsimEvent wait = {.kind = MEMSIM_EV_WAIT, .stream = 0, .id = 6};
    memsim_trace_append(t, r0, &wait, 1);
    cr_assert_eq(memsim_trace_header(t)->ranks[r0].n_streams, 7, "WAIT on stream 6");
    MemsimEvent low = {.kind = MEMSIM_EV_FREE, .id = 1, .stream = 1};
    memsim_trace_append(t, r0, &low, 1);
    cr_assert_eq(memsim_trace_header(t)->ranks[r0].n_streams, 7, "the count shrank");
    cr_assert_eq(memsim_trace_header(t)->ranks[r1].n_streams, 1, "another rank grew");
    /* The largest stream index there is. */
    MemsimEvent top = {.kind = MEMSIM_EV_OP, .stream = UINT16_MAX};
    memsim_trace_append(t, r1, &top, 1);
    cr_assert_eq(memsim_trace_header(t)->ranks[r1].n_streams, 65536);
    memsim_trace_free(t);
}

/* A rank with stream handles keeps one handle per stream: new streams get handle 0, the old
 * handles stay. */
Test(trace_events, stream_handles_grow_with_the_count)
{
    MemsimTrace *t = memsim_trace_new("handles");
    guint32 r = memsim_trace_add_rank(t, 0, 1);
    MemsimRankInfo *ri = &memsim_trace_header(t)->ranks[r];
    ri->n_streams = 2;
    ri->stream_handles = g_new(uint64_t, 2);
    ri->stream_handles[0] = 0;
    ri->stream_handles[1] = 0x7f3a00001234;
    MemsimEvent ev[] = {{.kind = MEMSIM_EV_USE, .id = 1, .stream = 1},
                        {.kind = MEMSIM_EV_USE, .id = 1, .stream = 4}};
    memsim_trace_append(t, r, ev, 2);
    ri = &memsim_trace_header(t)->ranks[r];
    cr_assert_eq(ri->n_streams, 5);
    cr_assert_eq(ri->stream_handles[0], 0);
    cr_assert_eq(ri->stream_handles[1], 0x7f3a00001234);
    for (int s = 2; s < 5; s++)
        cr_assert_eq(ri->stream_handles[s], 0, "handle %d", s);
    memsim_trace_free(t);
}

/* append_array: an empty program takes the array itself (no copy); a non-empty one gets a
 * copy appended, and the array's reference is taken either way. */
Test(trace_events, append_array_takes_the_array)
{
    MemsimTrace *t = memsim_trace_new("arrays");
    guint32 r = memsim_trace_add_rank(t, 0, 1);
    GArray *a = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
    for (guint32 i = 0; i < 10; i++) {
        MemsimEvent e = {.kind = MEMSIM_EV_ALLOC, .id = i, .size = 512, .stream = 2};
        g_array_append_val(a, e);
    }
    const void *data = a->data;
    memsim_trace_append_array(t, r, a);
    gsize n;
    const MemsimEvent *ev = events_of(t, r, &n);
    cr_assert_eq(n, 10);
    cr_assert_eq((const void *)ev, data, "the array was copied");
    cr_assert_eq(memsim_trace_header(t)->ranks[r].n_streams, 3, "streams covered");
    GArray *b = g_array_new(FALSE, FALSE, sizeof(MemsimEvent));
    for (guint32 i = 0; i < 5; i++) {
        MemsimEvent e = {.kind = MEMSIM_EV_FREE, .id = i};
        g_array_append_val(b, e);
    }
    memsim_trace_append_array(t, r, b);
    MemsimEvent one = {.kind = MEMSIM_EV_EMPTY_CACHE};
    memsim_trace_append(t, r, &one, 1);
    ev = events_of(t, r, &n);
    cr_assert_eq(n, 16);
    for (guint32 i = 0; i < 10; i++)
        cr_assert(ev[i].kind == MEMSIM_EV_ALLOC && ev[i].id == i, "event %u", i);
    for (guint32 i = 0; i < 5; i++)
        cr_assert(ev[10 + i].kind == MEMSIM_EV_FREE && ev[10 + i].id == i, "event %u", 10 + i);
    cr_assert_eq(ev[15].kind, MEMSIM_EV_EMPTY_CACHE);
    /* An empty array on a non-empty program changes nothing. */
    memsim_trace_append_array(t, r, g_array_new(FALSE, FALSE, sizeof(MemsimEvent)));
    events_of(t, r, &n);
    cr_assert_eq(n, 16);
    memsim_trace_free(t);
}

/* ---------------------------------------------------------------------------------------- */
/* Misuse the header names: a rank that add_rank did not return (the library asserts). */

Test(trace_misuse, append_to_a_rank_never_added, .signal = SIGABRT)
{
    MemsimTrace *t = memsim_trace_new("misuse");
    memsim_trace_add_rank(t, 0, 1);
    MemsimEvent ev = {.kind = MEMSIM_EV_FREE, .id = 1};
    memsim_trace_append(t, 1, &ev, 1);
}

Test(trace_misuse, append_array_to_a_rank_never_added, .signal = SIGABRT)
{
    MemsimTrace *t = memsim_trace_new("misuse");
    memsim_trace_append_array(t, 0, g_array_new(FALSE, FALSE, sizeof(MemsimEvent)));
}

Test(trace_misuse, events_of_a_rank_never_added, .signal = SIGABRT)
{
    MemsimTrace *t = memsim_trace_new("misuse");
    memsim_trace_add_rank(t, 0, 1);
    gsize n;
    memsim_trace_events(t, 7, &n);
}

Test(trace_misuse, append_array_of_other_elements, .signal = SIGABRT)
{
    MemsimTrace *t = memsim_trace_new("misuse");
    memsim_trace_add_rank(t, 0, 1);
    memsim_trace_append_array(t, 0, g_array_new(FALSE, FALSE, sizeof(uint64_t)));
}

/* ---------------------------------------------------------------------------------------- */
/* Header copies */

static MemsimTrace *build_trace(void);

Test(trace_header, copy_is_deep_and_clear_zeroes)
{
    MemsimTrace *t = build_trace();
    const MemsimTraceHeader *src = memsim_trace_header(t);
    MemsimTraceHeader copy;
    memset(&copy, 0xa5, sizeof copy); /* uninitialised: nothing of it is read */
    memsim_trace_header_copy(&copy, src);
    assert_same_header(src, &copy, "copy");
    /* Nothing is shared. */
    cr_assert_neq(copy.name, src->name);
    cr_assert_neq(copy.alloc_conf, src->alloc_conf);
    cr_assert_neq(copy.ranks, src->ranks);
    cr_assert_neq(copy.ranks[0].role, src->ranks[0].role);
    cr_assert_neq(copy.ranks[0].stream_handles, src->ranks[0].stream_handles);
    cr_assert_neq(copy.strings, src->strings);
    cr_assert_neq(copy.strings[0], src->strings[0]);
    cr_assert_neq(copy.ops, src->ops);
    copy.name[0] = '#';
    copy.ranks[0].role[0] = '#';
    copy.ranks[0].stream_handles[1] = 1;
    copy.strings[0][0] = '#';
    copy.ops[0].layer = 999;
    cr_assert_str_eq(src->name, "hand-built \"trace\"\twith\\escapes");
    cr_assert_str_eq(src->ranks[0].role, "stage 0");
    cr_assert_eq(src->ranks[0].stream_handles[1], 0x7f3a00001234);
    cr_assert_str_eq(src->strings[0], "linear");
    cr_assert_eq(src->ops[0].layer, 3);
    memsim_trace_header_clear(&copy);
    MemsimTraceHeader zero;
    memset(&zero, 0, sizeof zero);
    cr_assert(memcmp(&copy, &zero, sizeof zero) == 0, "clear did not zero the header");
    memsim_trace_header_clear(&copy); /* cleared twice: nothing to free */
    /* An empty header copies too. */
    MemsimTrace *e = memsim_trace_new("");
    memsim_trace_header_copy(&copy, memsim_trace_header(e));
    assert_same_header(memsim_trace_header(e), &copy, "empty copy");
    memsim_trace_header_clear(&copy);
    memsim_trace_free(e);
    memsim_trace_free(t);
}

/* ---------------------------------------------------------------------------------------- */
/* Names of the enumerations */

Test(trace_names, both_ways)
{
    /* The examples the header gives. */
    cr_assert_str_eq(memsim_event_kind_name(MEMSIM_EV_ALLOC), "alloc");
    cr_assert_str_eq(memsim_category_name(MEMSIM_CAT_ACTIVATION), "activation");
    cr_assert_str_eq(memsim_phase_name(MEMSIM_PHASE_FORWARD), "forward");
    cr_assert_str_eq(memsim_collective_name(MEMSIM_COLL_ALL_REDUCE), "all_reduce");
    /* Every value has its own name, which maps back to it. */
    GHashTable *seen = g_hash_table_new(g_str_hash, g_str_equal);
    for (int k = 1; k <= MEMSIM_EV_KIND_MAX; k++) {
        const char *n = memsim_event_kind_name((MemsimEventKind)k);
        cr_assert(strcmp(n, "?") != 0, "kind %d has no name", k);
        cr_assert(!g_hash_table_contains(seen, n), "kind name '%s' twice", n);
        g_hash_table_add(seen, (gpointer)n);
        cr_assert_eq(memsim_event_kind_from_name(n), k, "'%s'", n);
    }
    g_hash_table_remove_all(seen);
    for (int c = 0; c < MEMSIM_CAT_COUNT; c++) {
        const char *n = memsim_category_name((MemsimCategory)c);
        cr_assert(strcmp(n, "?") != 0 && !g_hash_table_contains(seen, n), "category %d", c);
        g_hash_table_add(seen, (gpointer)n);
        cr_assert_eq(memsim_category_from_name(n), c, "'%s'", n);
    }
    g_hash_table_remove_all(seen);
    for (int p = 0; p < MEMSIM_PHASE_COUNT; p++) {
        const char *n = memsim_phase_name((MemsimPhase)p);
        cr_assert(strcmp(n, "?") != 0 && !g_hash_table_contains(seen, n), "phase %d", p);
        g_hash_table_add(seen, (gpointer)n);
        cr_assert_eq(memsim_phase_from_name(n), p, "'%s'", n);
    }
    g_hash_table_remove_all(seen);
    for (int c = 0; c < MEMSIM_COLL_COUNT; c++) {
        const char *n = memsim_collective_name((MemsimCollectiveKind)c);
        cr_assert(strcmp(n, "?") != 0 && !g_hash_table_contains(seen, n), "collective %d", c);
        g_hash_table_add(seen, (gpointer)n);
        cr_assert_eq(memsim_collective_from_name(n), c, "'%s'", n);
    }
    g_hash_table_unref(seen);
}

Test(trace_names, out_of_range_and_unknown)
{
    cr_assert_str_eq(memsim_event_kind_name((MemsimEventKind)0), "?");
    cr_assert_str_eq(memsim_event_kind_name((MemsimEventKind)(MEMSIM_EV_KIND_MAX + 1)), "?");
    cr_assert_str_eq(memsim_event_kind_name((MemsimEventKind)255), "?");
    cr_assert_str_eq(memsim_category_name(MEMSIM_CAT_COUNT), "?");
    cr_assert_str_eq(memsim_category_name((MemsimCategory)1000), "?");
    cr_assert_str_eq(memsim_phase_name(MEMSIM_PHASE_COUNT), "?");
    cr_assert_str_eq(memsim_collective_name(MEMSIM_COLL_COUNT), "?");
    cr_assert_str_eq(memsim_collective_name((MemsimCollectiveKind)-1), "?");
    static const char *unknown[] = {"", "?", "ALLOC", "alloc ", "nope", "kv-cache"};
    for (gsize i = 0; i < G_N_ELEMENTS(unknown); i++) {
        cr_assert_eq(memsim_event_kind_from_name(unknown[i]), -1, "'%s'", unknown[i]);
        cr_assert_eq(memsim_category_from_name(unknown[i]), -1, "'%s'", unknown[i]);
        cr_assert_eq(memsim_phase_from_name(unknown[i]), -1, "'%s'", unknown[i]);
        cr_assert_eq(memsim_collective_from_name(unknown[i]), -1, "'%s'", unknown[i]);
    }
    cr_assert_eq(memsim_event_kind_from_name(NULL), -1);
    cr_assert_eq(memsim_category_from_name(NULL), -1);
    cr_assert_eq(memsim_phase_from_name(NULL), -1);
    cr_assert_eq(memsim_collective_from_name(NULL), -1);
}

/* ---------------------------------------------------------------------------------------- */
/* A hand-built trace: two ranks, every header field, every event kind and flag, extreme
 * values, fields a kind does not use. */

static MemsimTrace *build_trace(void)
{
    MemsimTrace *t = memsim_trace_new("hand-built \"trace\"\twith\\escapes");
    MemsimTraceHeader *h = memsim_trace_header(t);
    h->alloc_conf = g_strdup("expandable_segments:True,max_split_size_mb:128");
    h->capacity = 80 * GiB;
    guint32 r0 = memsim_trace_add_rank(t, 3, 4);
    guint32 r1 = memsim_trace_add_rank(t, 7, 1);
    h = memsim_trace_header(t);
    h->ranks[r0].role = g_strdup("stage 0");
    h->ranks[r0].n_streams = 3;
    h->ranks[r0].stream_handles = g_new(uint64_t, 3);
    h->ranks[r0].stream_handles[0] = 0;
    h->ranks[r0].stream_handles[1] = 0x7f3a00001234;
    h->ranks[r0].stream_handles[2] = UINT64_MAX;
    h->ranks[r0].has_final = TRUE;
    h->ranks[r0].final_reserved = 20 * MiB;
    h->ranks[r0].final_allocated = 1024;
    guint32 s_linear = memsim_trace_intern(t, "linear");
    guint32 s_step = memsim_trace_intern(t, "step 1");
    guint32 s_odd = memsim_trace_intern(t, "late \"x\" \\ # é\t");
    MemsimOpInfo ops[] = {
        {.name = s_linear, .phase = MEMSIM_PHASE_FORWARD, .layer = 3, .microbatch = -1,
         .duration_us = 12.5},
        {.name = s_step, .phase = MEMSIM_PHASE_BACKWARD, .layer = -1, .microbatch = 2,
         .duration_us = 0.1},
        {.name = s_odd, .phase = MEMSIM_PHASE_COMMUNICATION, .layer = G_MAXINT32,
         .microbatch = G_MININT32, .duration_us = 1.0 / 3},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(ops); i++)
        cr_assert_eq(memsim_trace_add_op(t, &ops[i]), i);

    const uint64_t seg = 0x7f0000000000;
    MemsimEvent e0[] = {
        {.kind = MEMSIM_EV_INIT_SEGMENT, .addr = seg, .size = 20 * MiB, .aux = MEMSIM_SEGF_SMALL},
        {.kind = MEMSIM_EV_INIT_BLOCK, .id = 1, .addr = seg, .size = 1000, .aux = 1024,
         .category = MEMSIM_CAT_PARAMETER},
        {.kind = MEMSIM_EV_OP, .id = 0},
        {.kind = MEMSIM_EV_SEG_ALLOC, .addr = seg + 20 * MiB, .size = 2 * MiB},
        {.kind = MEMSIM_EV_SEG_MAP, .addr = seg + 22 * MiB, .size = 2 * MiB, .stream = 1},
        {.kind = MEMSIM_EV_ALLOC, .id = 2, .size = 4096, .stream = 1,
         .category = MEMSIM_CAT_ACTIVATION, .flags = MEMSIM_EVF_ADDR, .addr = seg + 20 * MiB},
        {.kind = MEMSIM_EV_USE, .id = 2, .stream = 2},
        {.kind = MEMSIM_EV_WAIT, .stream = 0, .id = 1},
        {.kind = MEMSIM_EV_WAIT, .stream = 0, .id = 2, .flags = MEMSIM_EVF_HOST},
        {.kind = MEMSIM_EV_COLLECTIVE, .size = MiB, .id = 2, .aux = MEMSIM_COLL_ALL_GATHER,
         .stream = 1},
        {.kind = MEMSIM_EV_COLLECTIVE, .size = 4096, .id = 0, .aux = MEMSIM_COLL_SEND,
         .flags = MEMSIM_EVF_PEER, .addr = 1, .stream = 2},
        {.kind = MEMSIM_EV_MARK, .id = s_step},
        {.kind = MEMSIM_EV_OP, .id = 2, .stream = 2},
        {.kind = MEMSIM_EV_OOM, .size = UINT64_MAX, .addr = MiB},
        {.kind = MEMSIM_EV_FREE, .id = 2},
        {.kind = MEMSIM_EV_FREE, .id = 1, .stream = 1},
        {.kind = MEMSIM_EV_SEG_UNMAP, .addr = seg + 22 * MiB, .size = 2 * MiB},
        {.kind = MEMSIM_EV_SEG_FREE, .addr = seg + 20 * MiB, .size = 2 * MiB},
        {.kind = MEMSIM_EV_EMPTY_CACHE, .flags = MEMSIM_EVF_INFERRED},
        /* Extremes: the largest id and size, a segment whose last byte is 2^64 - 2 (one
         * reaching 2^64 itself is refused, as formats/README.md says). */
        {.kind = MEMSIM_EV_ALLOC, .id = UINT64_MAX - 1, .size = UINT64_MAX,
         .category = MEMSIM_CAT_KV_CACHE},
        {.kind = MEMSIM_EV_SEG_ALLOC, .addr = UINT64_MAX - 2 * MiB, .size = 2 * MiB},
        /* Fields the kind does not use are kept too. */
        {.kind = MEMSIM_EV_FREE, .id = UINT64_MAX - 1, .size = 7, .flags = 0x100, .aux = 9},
    };
    memsim_trace_append(t, r0, e0, G_N_ELEMENTS(e0));
    MemsimEvent e1[] = {
        {.kind = MEMSIM_EV_OP, .id = 1},
        {.kind = MEMSIM_EV_MARK, .id = s_odd},
        {.kind = MEMSIM_EV_ALLOC, .id = 3, .size = (uint64_t)1 << 40,
         .category = MEMSIM_CAT_COMM_BUFFER},
        {.kind = MEMSIM_EV_COLLECTIVE, .size = 4096, .id = 0, .aux = MEMSIM_COLL_RECV,
         .flags = MEMSIM_EVF_PEER, .addr = 0},
        {.kind = MEMSIM_EV_COLLECTIVE, .size = 0, .id = UINT64_MAX,
         .aux = MEMSIM_COLL_ALL_TO_ALL},
        {.kind = MEMSIM_EV_FREE, .id = 3},
        {.kind = MEMSIM_EV_EMPTY_CACHE},
        {.kind = MEMSIM_EV_REPEAT}, /* a unit's boundary: nothing repeats */
    };
    memsim_trace_append(t, r1, e1, G_N_ELEMENTS(e1));
    return t;
}

Test(trace_build, what_was_built_is_there)
{
    MemsimTrace *t = build_trace();
    MemsimTraceHeader *h = memsim_trace_header(t);
    cr_assert_eq(h->n_ranks, 2);
    cr_assert_eq(h->n_strings, 3);
    cr_assert_eq(h->n_ops, 3);
    cr_assert_eq(h->ranks[0].n_streams, 3);
    cr_assert_eq(h->ranks[1].n_streams, 1);
    gsize n0, n1;
    const MemsimEvent *e0 = events_of(t, 0, &n0);
    events_of(t, 1, &n1);
    cr_assert_eq(n0, 22);
    cr_assert_eq(n1, 8);
    /* Every kind appears. */
    guint32 kinds = 0;
    for (guint32 r = 0; r < 2; r++) {
        gsize n;
        const MemsimEvent *ev = events_of(t, r, &n);
        for (gsize i = 0; i < n; i++)
            kinds |= 1u << ev[i].kind;
    }
    for (int k = 1; k <= MEMSIM_EV_KIND_MAX; k++)
        cr_assert(kinds & (1u << k), "kind %s is missing", memsim_event_kind_name(k));
    /* The documented invariants hold: op and string indices in range, waits on the rank's
     * streams, names of ops in the string table. */
    for (guint32 r = 0; r < 2; r++) {
        gsize n;
        const MemsimEvent *ev = events_of(t, r, &n);
        for (gsize i = 0; i < n; i++) {
            cr_assert_lt(ev[i].stream, h->ranks[r].n_streams);
            if (ev[i].kind == MEMSIM_EV_OP)
                cr_assert_lt(ev[i].id, h->n_ops);
            if (ev[i].kind == MEMSIM_EV_MARK)
                cr_assert_lt(ev[i].id, h->n_strings);
            if (ev[i].kind == MEMSIM_EV_WAIT)
                cr_assert_lt(ev[i].id, h->ranks[r].n_streams);
        }
    }
    for (guint32 i = 0; i < h->n_ops; i++)
        cr_assert_lt(h->ops[i].name, h->n_strings);
    cr_assert_eq(e0[5].addr, 0x7f0000000000 + 20 * MiB);
    memsim_trace_free(t);
}

/* ---------------------------------------------------------------------------------------- */
/* Round trips through the files */

typedef struct {
    const char *file;
    MemsimFormat format; /* given to the writer (AUTO: by extension) */
    MemsimFormat read_as;
} FileCase;

static const FileCase file_cases[] = {
    {"rt.mst", MEMSIM_FORMAT_AUTO, MEMSIM_FORMAT_MST},
    {"rt.txt", MEMSIM_FORMAT_AUTO, MEMSIM_FORMAT_TEXT},
    {"rt.mstt", MEMSIM_FORMAT_AUTO, MEMSIM_FORMAT_TEXT},
    {"rt.bin", MEMSIM_FORMAT_MST, MEMSIM_FORMAT_MST},       /* the format given wins */
    {"rt-binary.txt", MEMSIM_FORMAT_MST, MEMSIM_FORMAT_MST},
};

Test(trace_roundtrip, save_and_load_every_field)
{
    MemsimTrace *t = build_trace();
    for (gsize c = 0; c < G_N_ELEMENTS(file_cases); c++) {
        char *path = tmp_file(file_cases[c].file);
        GError *err = NULL;
        cr_assert(memsim_trace_save(t, path, file_cases[c].format, &err), "%s: %s",
                  file_cases[c].file, err ? err->message : "?");
        MemsimTraceReader *r = memsim_trace_reader_open(path, &err);
        cr_assert(r, "%s: %s", file_cases[c].file, err ? err->message : "?");
        cr_assert_eq(memsim_trace_reader_format(r), file_cases[c].read_as, "%s: format %d",
                     file_cases[c].file, memsim_trace_reader_format(r));
        memsim_trace_reader_free(r);
        MemsimTrace *back = memsim_trace_load(path, &err);
        cr_assert(back, "%s: %s", file_cases[c].file, err ? err->message : "?");
        cr_assert_null(err);
        assert_same_trace(t, back, file_cases[c].file);
        memsim_trace_free(back);
        remove_tmp(path);
    }
    memsim_trace_free(t);
}

/* .mst → memory → text → memory → .mst: the same trace each time, and the two .mst files
 * are the same bytes. */
Test(trace_roundtrip, chained_through_both_formats)
{
    MemsimTrace *t = build_trace();
    char *a = tmp_file("a.mst"), *b = tmp_file("b.txt"), *c = tmp_file("c.mst");
    GError *err = NULL;
    cr_assert(memsim_trace_save(t, a, MEMSIM_FORMAT_AUTO, &err), "%s", err ? err->message : "?");
    MemsimTrace *ta = memsim_trace_load(a, &err);
    cr_assert(ta, "%s", err ? err->message : "?");
    cr_assert(memsim_trace_save(ta, b, MEMSIM_FORMAT_AUTO, &err), "%s", err ? err->message : "?");
    MemsimTrace *tb = memsim_trace_load(b, &err);
    cr_assert(tb, "%s", err ? err->message : "?");
    assert_same_trace(t, tb, "mst then text");
    cr_assert(memsim_trace_save(tb, c, MEMSIM_FORMAT_AUTO, &err), "%s", err ? err->message : "?");
    gchar *da, *dc;
    gsize la, lc;
    cr_assert(g_file_get_contents(a, &da, &la, NULL));
    cr_assert(g_file_get_contents(c, &dc, &lc, NULL));
    cr_assert(la == lc && memcmp(da, dc, la) == 0, "the .mst files differ (%zu, %zu bytes)", la,
              lc);
    /* memsim_convert does the same. */
    char *d = tmp_file("d.txt");
    cr_assert(memsim_convert(a, d, &err), "%s", err ? err->message : "?");
    MemsimTrace *td = memsim_trace_load(d, &err);
    cr_assert(td, "%s", err ? err->message : "?");
    assert_same_trace(t, td, "converted");
    memsim_trace_free(td);
    g_free(da);
    g_free(dc);
    memsim_trace_free(ta);
    memsim_trace_free(tb);
    memsim_trace_free(t);
    remove_tmp(a);
    remove_tmp(b);
    remove_tmp(c);
    remove_tmp(d);
}

/* A writer fed in pieces: events of both ranks interleaved, strings and ops declared after
 * the first events (memsim_trace_writer_update_header); a streaming reader sees them arrive
 * and ends with the whole header. */
Test(trace_roundtrip, streamed_with_a_growing_header)
{
    static const char *files[] = {"stream.mst", "stream.txt"};
    for (gsize f = 0; f < G_N_ELEMENTS(files); f++) {
        MemsimTrace *t = memsim_trace_new("streamed");
        memsim_trace_add_rank(t, 0, 1);
        memsim_trace_add_rank(t, 1, 2);
        MemsimOpInfo op = {.name = memsim_trace_intern(t, "first"), .layer = -1,
                           .microbatch = -1};
        memsim_trace_add_op(t, &op);
        char *path = tmp_file(files[f]);
        GError *err = NULL;
        MemsimTraceWriter *w =
            memsim_trace_writer_new(path, MEMSIM_FORMAT_AUTO, memsim_trace_header(t), &err);
        cr_assert(w, "%s", err ? err->message : "?");
        /* The expected trace is built alongside: same header, events appended as written. */
        MemsimEvent a[] = {{.kind = MEMSIM_EV_OP, .id = 0},
                           {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = 512}};
        cr_assert(memsim_trace_writer_write(w, 0, a, 2, &err), "%s", err ? err->message : "?");
        memsim_trace_append(t, 0, a, 2);
        MemsimEvent b[] = {{.kind = MEMSIM_EV_ALLOC, .id = 2, .size = 1024}};
        cr_assert(memsim_trace_writer_write(w, 1, b, 1, &err), "%s", err ? err->message : "?");
        memsim_trace_append(t, 1, b, 1);
        /* New strings and an op; the events that use them come after the update. */
        guint32 late = memsim_trace_intern(t, "late");
        MemsimOpInfo op2 = {.name = late, .phase = MEMSIM_PHASE_OPTIMIZER, .layer = 2,
                            .microbatch = 0, .duration_us = 3.5};
        guint32 k = memsim_trace_add_op(t, &op2);
        cr_assert(memsim_trace_writer_update_header(w, memsim_trace_header(t), &err), "%s",
                  err ? err->message : "?");
        MemsimEvent c[] = {{.kind = MEMSIM_EV_OP, .id = k},
                           {.kind = MEMSIM_EV_MARK, .id = late},
                           {.kind = MEMSIM_EV_FREE, .id = 1}};
        cr_assert(memsim_trace_writer_write(w, 0, c, 3, &err), "%s", err ? err->message : "?");
        memsim_trace_append(t, 0, c, 3);
        MemsimEvent d[] = {{.kind = MEMSIM_EV_FREE, .id = 2}};
        cr_assert(memsim_trace_writer_write(w, 1, d, 1, &err), "%s", err ? err->message : "?");
        memsim_trace_append(t, 1, d, 1);
        cr_assert(memsim_trace_writer_close(w, &err), "%s", err ? err->message : "?");

        /* Streaming: each run is of one rank; an OP or MARK names an entry of the header as
         * it is after that run. */
        MemsimTraceReader *r = memsim_trace_reader_open(path, &err);
        cr_assert(r, "%s", err ? err->message : "?");
        MemsimTrace *got = memsim_trace_new("streamed");
        memsim_trace_add_rank(got, 0, 1);
        memsim_trace_add_rank(got, 1, 2);
        guint32 rank;
        const MemsimEvent *ev;
        gsize n;
        while ((n = memsim_trace_reader_next(r, &rank, &ev, &err)) > 0) {
            cr_assert_lt(rank, 2);
            const MemsimTraceHeader *rh = memsim_trace_reader_header(r);
            for (gsize i = 0; i < n; i++) {
                if (ev[i].kind == MEMSIM_EV_OP)
                    cr_assert_lt(ev[i].id, rh->n_ops, "%s: op before its declaration", files[f]);
                if (ev[i].kind == MEMSIM_EV_MARK)
                    cr_assert_lt(ev[i].id, rh->n_strings, "%s: string before its declaration",
                                 files[f]);
            }
            memsim_trace_append(got, rank, ev, n);
        }
        cr_assert_null(err, "%s: %s", files[f], err ? err->message : "?");
        assert_same_header(memsim_trace_header(t), memsim_trace_reader_header(r), files[f]);
        for (guint32 k2 = 0; k2 < 2; k2++) {
            gsize nw, ng;
            const MemsimEvent *ew = events_of(t, k2, &nw);
            const MemsimEvent *eg = events_of(got, k2, &ng);
            cr_assert_eq(ng, nw, "%s: rank %u", files[f], k2);
            for (gsize i = 0; i < nw; i++)
                assert_same_event(&ew[i], &eg[i], files[f], k2, i);
        }
        memsim_trace_reader_free(r);
        /* Loading the whole file gives the same trace. */
        MemsimTrace *loaded = memsim_trace_load(path, &err);
        cr_assert(loaded, "%s", err ? err->message : "?");
        assert_same_trace(t, loaded, files[f]);
        memsim_trace_free(loaded);
        memsim_trace_free(got);
        memsim_trace_free(t);
        remove_tmp(path);
    }
}

Test(trace_roundtrip, empty_traces)
{
    for (int k = 0; k < 2; k++) {
        MemsimTrace *t = memsim_trace_new(k ? "one empty rank" : "");
        if (k)
            memsim_trace_add_rank(t, 9, 3);
        static const char *files[] = {"empty.mst", "empty.txt"};
        for (gsize f = 0; f < G_N_ELEMENTS(files); f++) {
            char *path = tmp_file(files[f]);
            GError *err = NULL;
            cr_assert(memsim_trace_save(t, path, MEMSIM_FORMAT_AUTO, &err), "%s",
                      err ? err->message : "?");
            MemsimTrace *back = memsim_trace_load(path, &err);
            cr_assert(back, "%s: %s", files[f], err ? err->message : "?");
            assert_same_trace(t, back, files[f]);
            memsim_trace_free(back);
            remove_tmp(path);
        }
        memsim_trace_free(t);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The invariants the header documents, which the in-memory trace does not check but every
 * writer and reader does: a file never holds a trace that breaks them. */

typedef struct {
    const char *what;
    MemsimEvent ev;
    const char *message; /* a part of the error message */
} BadEvent;

Test(trace_invariants, writers_refuse_events_that_break_them)
{
    /* One rank of one stream, 2 strings, 1 op. */
    const BadEvent bad[] = {
        {"an op index past the op table", {.kind = MEMSIM_EV_OP, .id = 1}, "op table"},
        {"a huge op index", {.kind = MEMSIM_EV_OP, .id = UINT64_MAX}, "op table"},
        {"a mark past the string table", {.kind = MEMSIM_EV_MARK, .id = 2}, "string table"},
        {"category out of range",
         {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = 1, .category = MEMSIM_CAT_COUNT},
         "category"},
        {"collective kind out of range",
         {.kind = MEMSIM_EV_COLLECTIVE, .aux = MEMSIM_COLL_COUNT},
         "collective"},
        {"kind 0", {.kind = 0}, "kind"},
        {"kind past the last", {.kind = MEMSIM_EV_KIND_MAX + 1}, "kind"},
        {"a segment past 2^64", {.kind = MEMSIM_EV_SEG_ALLOC, .addr = UINT64_MAX, .size = 2},
         "2^64"},
        {"a block past 2^64",
         {.kind = MEMSIM_EV_INIT_BLOCK, .addr = UINT64_MAX - 511, .aux = 1024},
         "2^64"},
    };
    static const char *files[] = {"bad.mst", "bad.txt"};
    for (gsize f = 0; f < G_N_ELEMENTS(files); f++)
        for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
            MemsimTrace *t = memsim_trace_new("bad");
            memsim_trace_add_rank(t, 0, 1);
            memsim_trace_intern(t, "a");
            MemsimOpInfo op = {.name = memsim_trace_intern(t, "b"), .layer = -1,
                               .microbatch = -1};
            memsim_trace_add_op(t, &op);
            /* Valid events first, including the last valid index of each table. */
            MemsimEvent good[] = {{.kind = MEMSIM_EV_OP, .id = 0},
                                  {.kind = MEMSIM_EV_MARK, .id = 1},
                                  {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = 1,
                                   .category = MEMSIM_CAT_COUNT - 1},
                                  {.kind = MEMSIM_EV_COLLECTIVE, .aux = MEMSIM_COLL_COUNT - 1},
                                  {.kind = MEMSIM_EV_SEG_ALLOC, .addr = UINT64_MAX - 1,
                                   .size = 1}};
            memsim_trace_append(t, 0, good, G_N_ELEMENTS(good));
            /* The in-memory trace takes anything. */
            memsim_trace_append(t, 0, &bad[i].ev, 1);
            gsize n;
            events_of(t, 0, &n);
            cr_assert_eq(n, G_N_ELEMENTS(good) + 1);
            char *path = tmp_file(files[f]);
            GError *err = NULL;
            cr_assert(!memsim_trace_save(t, path, MEMSIM_FORMAT_AUTO, &err), "%s: %s accepted",
                      files[f], bad[i].what);
            cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s: %s: %s",
                      files[f], bad[i].what, err ? err->message : "no error");
            cr_assert(strstr(err->message, path) != NULL, "%s: no file name in: %s", bad[i].what,
                      err->message);
            cr_assert(strstr(err->message, "rank 0, event 5") != NULL,
                      "%s: the message does not name the event: %s", bad[i].what, err->message);
            cr_assert(strstr(err->message, bad[i].message) != NULL, "%s: %s", bad[i].what,
                      err->message);
            g_error_free(err);
            remove_tmp(path);
            memsim_trace_free(t);
        }
}

Test(trace_invariants, writers_refuse_headers_that_break_them)
{
    static const char *files[] = {"badh.mst", "badh.txt"};
    for (gsize f = 0; f < G_N_ELEMENTS(files); f++)
        for (int k = 0; k < 5; k++) {
            MemsimTrace *t = memsim_trace_new("bad header");
            memsim_trace_add_rank(t, 0, 1);
            MemsimOpInfo op = {.name = memsim_trace_intern(t, "x"), .layer = -1,
                               .microbatch = -1};
            const char *want = NULL;
            switch (k) {
            case 0: /* an op's name must be in the string table */
                op.name = 1;
                want = "string table";
                break;
            case 1:
                op.phase = MEMSIM_PHASE_COUNT;
                want = "phase";
                break;
            case 2:
                op.duration_us = -1;
                want = "duration";
                break;
            case 3: /* a rank has at least one stream */
                memsim_trace_header(t)->ranks[0].n_streams = 0;
                want = "streams";
                break;
            case 4: /* a rank stands for at least one */
                memsim_trace_header(t)->ranks[0].multiplicity = 0;
                want = "multiplicity";
                break;
            }
            memsim_trace_add_op(t, &op);
            char *path = tmp_file(files[f]);
            GError *err = NULL;
            cr_assert(!memsim_trace_save(t, path, MEMSIM_FORMAT_AUTO, &err), "%s: case %d accepted",
                      files[f], k);
            cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s %d: %s",
                      files[f], k, err ? err->message : "no error");
            cr_assert(strstr(err->message, want) != NULL, "%s %d: %s", files[f], k, err->message);
            g_error_free(err);
            remove_tmp(path);
            memsim_trace_free(t);
        }
}

/* Readers refuse a file that breaks them: a hand-written text trace whose op, mark, wait or
 * stream index is out of range (one rank of 2 streams, 1 string, 1 op). */
Test(trace_invariants, readers_refuse_files_that_break_them)
{
    static const struct {
        const char *line;
        const char *message;
    } bad[] = {
        {"op 1", "op table"},
        {"mark 1", "string 1"},
        {"wait stream=0 on=2", "wait on stream 2"},
        {"free t=1 stream=2", "stream 2"},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(bad); i++) {
        char *text = g_strdup_printf("memsim-trace 1\n"
                                     "name \"bad\"\n"
                                     "rank 0 device=0 multiplicity=1 streams=2\n"
                                     "string 0 \"x\"\n"
                                     "opinfo 0 name=0 phase=forward layer=-1 microbatch=-1 "
                                     "duration_us=0\n"
                                     "@rank 0\n"
                                     "op 0\n"
                                     "mark 0\n"
                                     "wait stream=1 on=0\n"
                                     "%s\n",
                                     bad[i].line);
        char *path = tmp_file("bad.txt");
        cr_assert(g_file_set_contents(path, text, -1, NULL));
        GError *err = NULL;
        MemsimTrace *t = memsim_trace_load(path, &err);
        cr_assert_null(t, "'%s' accepted", bad[i].line);
        cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "'%s': %s",
                  bad[i].line, err ? err->message : "no error");
        cr_assert(strstr(err->message, path) != NULL, "'%s': no file name: %s", bad[i].line,
                  err->message);
        cr_assert(strstr(err->message, bad[i].message) != NULL, "'%s': %s", bad[i].line,
                  err->message);
        g_error_free(err);
        /* The file without the bad line loads. */
        char *cut = strstr(text, bad[i].line);
        *cut = 0;
        cr_assert(g_file_set_contents(path, text, -1, NULL));
        t = memsim_trace_load(path, &err);
        cr_assert(t, "the good part: %s", err ? err->message : "?");
        gsize n;
        events_of(t, 0, &n);
        cr_assert_eq(n, 3);
        memsim_trace_free(t);
        remove_tmp(path);
        g_free(text);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Writer and reader arguments */

Test(trace_files, bad_arguments)
{
    MemsimTrace *t = build_trace();
    const MemsimTraceHeader *h = memsim_trace_header(t);
    GError *err = NULL;
    /* A folder that does not exist: an I/O error naming the file. */
    cr_assert_null(memsim_trace_writer_new("/nonexistent/dir/x.mst", MEMSIM_FORMAT_AUTO, h, &err));
    cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_IO), "%s", err->message);
    cr_assert(strstr(err->message, "/nonexistent/dir/x.mst"), "%s", err->message);
    g_clear_error(&err);
    cr_assert(!memsim_trace_save(t, "/nonexistent/dir/x.txt", MEMSIM_FORMAT_AUTO, &err));
    cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_IO), "%s", err->message);
    g_clear_error(&err);
    /* Snapshots are not written by a trace writer. */
    char *pk = tmp_file("x.pickle");
    cr_assert_null(memsim_trace_writer_new(pk, MEMSIM_FORMAT_AUTO, h, &err));
    cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED), "%s", err->message);
    g_clear_error(&err);
    remove_tmp(pk);
    /* A rank the header does not have; a header that does not extend the first one. */
    char *path = tmp_file("args.mst");
    MemsimTraceWriter *w = memsim_trace_writer_new(path, MEMSIM_FORMAT_AUTO, h, &err);
    cr_assert(w, "%s", err ? err->message : "?");
    MemsimEvent ev = {.kind = MEMSIM_EV_FREE, .id = 1};
    cr_assert(!memsim_trace_writer_write(w, 2, &ev, 1, &err));
    cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s", err->message);
    cr_assert(strstr(err->message, "rank 2"), "%s", err->message);
    g_clear_error(&err);
    MemsimTrace *fewer = memsim_trace_new("fewer");
    memsim_trace_add_rank(fewer, 0, 1);
    cr_assert(!memsim_trace_writer_update_header(w, memsim_trace_header(fewer), &err));
    cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s", err->message);
    g_clear_error(&err);
    memsim_trace_free(fewer);
    /* Still usable: nothing was written by the refused calls. */
    cr_assert(memsim_trace_writer_write(w, 1, &ev, 1, &err), "%s", err ? err->message : "?");
    cr_assert(memsim_trace_writer_close(w, &err), "%s", err ? err->message : "?");
    MemsimTrace *back = memsim_trace_load(path, &err);
    cr_assert(back, "%s", err ? err->message : "?");
    gsize n;
    events_of(back, 0, &n);
    cr_assert_eq(n, 0);
    const MemsimEvent *e1 = events_of(back, 1, &n);
    cr_assert_eq(n, 1);
    assert_same_event(&ev, &e1[0], "args.mst", 1, 0);
    memsim_trace_free(back);
    remove_tmp(path);
    /* A file that is missing, and one that is no trace. */
    cr_assert_null(memsim_trace_load("/nonexistent/x.mst", &err));
    cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_IO), "%s", err->message);
    g_clear_error(&err);
    char *junk = tmp_file("junk.mst");
    cr_assert(g_file_set_contents(junk, "\x01\x02 not a trace", -1, NULL));
    cr_assert_null(memsim_trace_load(junk, &err));
    cr_assert(g_error_matches(err, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT), "%s",
              err ? err->message : "no error");
    cr_assert(strstr(err->message, junk), "%s", err->message);
    g_clear_error(&err);
    remove_tmp(junk);
    memsim_trace_reader_free(NULL);
    memsim_trace_free(t);
}

/* memsim_step_marks counts the MARKs that open a step ("step N", "step N begin"), not labels,
 * breakdowns or other events, and no mark whose string is outside the table. */
Test(trace_marks, step_marks_count_the_steps_only)
{
    MemsimTrace *t = memsim_trace_new("marks");
    const guint32 s1 = memsim_trace_intern(t, "step 1");
    const guint32 s2 = memsim_trace_intern(t, "step 2 begin");
    const guint32 label = memsim_trace_intern(t, "prefill");
    g_autofree char *bd = memsim_mark_breakdown("x");
    const guint32 brk = memsim_trace_intern(t, bd);
    const MemsimEvent ev[] = {
        {.kind = MEMSIM_EV_MARK, .id = s1},    {.kind = MEMSIM_EV_MARK, .id = label},
        {.kind = MEMSIM_EV_ALLOC, .id = s1},   {.kind = MEMSIM_EV_MARK, .id = brk},
        {.kind = MEMSIM_EV_MARK, .id = s2},    {.kind = MEMSIM_EV_MARK, .id = 1000},
    };
    const MemsimTraceHeader *h = memsim_trace_header(t);
    cr_expect_eq(memsim_step_marks(h, ev, G_N_ELEMENTS(ev)), 2);
    cr_expect_eq(memsim_step_marks(h, ev, 1), 1);
    cr_expect_eq(memsim_step_marks(h, ev + 1, 3), 0);
    memsim_trace_free(t);
}
