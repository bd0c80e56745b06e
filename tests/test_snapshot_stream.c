/* The streaming snapshot reader (formats/snapshot_stream.c) against the reference reader
 * (pickle.c's object tree read by snapshot.c): the same trace, header and events, for every
 * real snapshot of ../shared/data/torch-snapshots and every snapshot of tests/data; the same
 * refusals for the bad ones; compressed copies (zstd, gzip, made here by the zstd and gzip
 * commands) read as the plain file. */
#include "formats/snapshot.h"
#include "testutil.h"

#include <memsim/formats.h>

#include <criterion/criterion.h>
#include <glib/gstdio.h>
#include <string.h>

static void same_trace(const char *what, MemsimTrace *a, MemsimTrace *b)
{
    MemsimTraceHeader *x = memsim_trace_header(a), *y = memsim_trace_header(b);
    cr_assert_eq(x->n_ranks, y->n_ranks, "%s: ranks %u vs %u", what, x->n_ranks, y->n_ranks);
    cr_assert_str_eq(x->alloc_conf ? x->alloc_conf : "-", y->alloc_conf ? y->alloc_conf : "-",
                     "%s: alloc_conf", what);
    cr_assert_eq(x->n_strings, y->n_strings, "%s: strings %u vs %u", what, x->n_strings,
                 y->n_strings);
    for (guint32 i = 0; i < x->n_strings; i++)
        cr_assert_str_eq(x->strings[i], y->strings[i], "%s: string %u", what, i);
    guint nw = x->warnings ? g_strv_length(x->warnings) : 0;
    cr_assert_eq(nw, y->warnings ? g_strv_length(y->warnings) : 0, "%s: warnings", what);
    for (guint i = 0; i < nw; i++) {
        /* (each names its file first: compared from the file's name on) */
        const char *wa = strstr(x->warnings[i], ": "), *wb = strstr(y->warnings[i], ": ");
        cr_assert(wa && wb, "%s: warning %u", what, i);
        cr_assert_str_eq(wa, wb, "%s: warning %u", what, i);
    }
    for (guint32 r = 0; r < x->n_ranks; r++) {
        MemsimRankInfo *p = &x->ranks[r], *q = &y->ranks[r];
        cr_assert(p->device == q->device && p->n_streams == q->n_streams &&
                      p->has_final == q->has_final && p->final_reserved == q->final_reserved &&
                      p->final_allocated == q->final_allocated && p->capacity == q->capacity &&
                      p->n_inconsistent == q->n_inconsistent,
                  "%s: rank %u's header", what, r);
        for (guint32 s = 0; s < p->n_streams; s++)
            cr_assert_eq(p->stream_handles[s], q->stream_handles[s], "%s: rank %u stream %u",
                         what, r, s);
        gsize n, m;
        const MemsimEvent *e = memsim_trace_events(a, r, &n), *f = memsim_trace_events(b, r, &m);
        cr_assert_eq(n, m, "%s: rank %u: %zu vs %zu events", what, r, n, m);
        for (gsize i = 0; i < n; i++)
            cr_assert(memcmp(&e[i], &f[i], sizeof e[i]) == 0,
                      "%s: rank %u event %zu: kind %u/%u id %" G_GUINT64_FORMAT "/%"
                      G_GUINT64_FORMAT " stream %u/%u", what, r, i, e[i].kind, f[i].kind,
                      e[i].id, f[i].id, e[i].stream, f[i].stream);
    }
}

/* The reader a replay reads (memsim_snapshot_reader: the entries kept packed, each rank's
 * events made chunk by chunk) gives the events of the whole trace `b`, and the trace it
 * hands over whole (memsim_trace_load) is `b` too. */
static void same_chunks(const char *path, MemsimTrace *b)
{
    GError *err = NULL;
    MemsimTraceReader *r = memsim_snapshot_reader(path, NULL, &err);
    cr_assert(r, "%s: %s", path, err ? err->message : "");
    const MemsimTraceHeader *h = memsim_trace_reader_header(r);
    cr_assert_eq(h->n_ranks, memsim_trace_header(b)->n_ranks, "%s: ranks", path);
    gsize *pos = g_new0(gsize, h->n_ranks + 1);
    guint32 rank, last = 0;
    const MemsimEvent *ev;
    gsize n;
    while ((n = memsim_trace_reader_next(r, &rank, &ev, &err)) > 0) {
        cr_assert(rank >= last && rank < h->n_ranks, "%s: rank %u after %u", path, rank, last);
        last = rank;
        gsize m;
        const MemsimEvent *want = memsim_trace_events(b, rank, &m);
        cr_assert_leq(pos[rank] + n, m, "%s: rank %u: more than %zu events", path, rank, m);
        cr_assert(memcmp(ev, want + pos[rank], n * sizeof *ev) == 0,
                  "%s: rank %u: a chunk from event %zu differs", path, rank, pos[rank]);
        pos[rank] += n;
    }
    cr_assert(!err, "%s: %s", path, err ? err->message : "");
    for (guint32 k = 0; k < h->n_ranks; k++) {
        gsize m;
        memsim_trace_events(b, k, &m);
        cr_assert_eq(pos[k], m, "%s: rank %u: %zu of %zu events", path, k, pos[k], m);
    }
    g_free(pos);
    memsim_trace_reader_free(r);
    MemsimTrace *whole = memsim_trace_load(path, &err);
    cr_assert(whole, "%s: %s", path, err ? err->message : "");
    same_trace(path, whole, b);
    memsim_trace_free(whole);
}

/* Both readers on one file: both refuse it, or both give the same trace. */
static void compare_file(const char *path, int *n_read)
{
    GError *e1 = NULL, *e2 = NULL;
    MemsimTrace *a = memsim_snapshot_load_tree(path, &e1);
    MemsimTrace *b = memsim_snapshot_read(path, NULL, &e2);
    cr_assert_eq(a != NULL, b != NULL, "%s: the reference %s, the streaming reader %s", path,
                 a ? "reads it" : e1->message, b ? "reads it" : e2->message);
    if (a) {
        same_trace(path, a, b);
        same_chunks(path, b);
        (*n_read)++;
    } else {
        cr_assert_eq(e1->code, e2->code, "%s: error codes differ: %s / %s", path, e1->message,
                     e2->message);
        cr_assert(g_str_has_prefix(e2->message, path), "%s: %s", path, e2->message);
    }
    g_clear_error(&e1);
    g_clear_error(&e2);
    memsim_trace_free(a);
    memsim_trace_free(b);
}

static int compare_dir(const char *dir)
{
    GDir *d = g_dir_open(dir, 0, NULL);
    cr_assert(d, "%s", dir);
    int n = 0, read = 0;
    const char *name;
    while ((name = g_dir_read_name(d))) {
        if (!g_str_has_suffix(name, ".pickle") && !g_str_has_suffix(name, ".pkl"))
            continue;
        g_autofree char *path = g_build_filename(dir, name, NULL);
        compare_file(path, &read);
        n++;
    }
    g_dir_close(d);
    cr_log_info("%s: %d files, %d read", dir, n, read);
    return n;
}

Test(snapshot_stream, agrees_on_the_real_snapshots)
{
    g_autofree char *dir = tu_shared_path_or_skip("torch-snapshots");
    if (!dir)
        return;
    cr_assert_geq(compare_dir(dir), 30);
}

Test(snapshot_stream, agrees_on_the_test_data)
{
    g_autofree char *bad = tu_test_data("bad");
    g_autofree char *good = tu_test_data("good");
    cr_assert_gt(compare_dir(bad) + compare_dir(good), 20);
}

/* A compressed copy reads as the plain file (by its first bytes, whatever its name): the
 * shipped snapshot with unknown actions, whose warnings name the file. */
Test(snapshot_stream, reads_zstd_and_gzip)
{
    g_autofree char *src = tu_test_data("bad/inconsistent-unknown-actions.exit0.pickle");
    g_autofree char *tmp = tu_tmpdir();
    g_autofree char *zst = g_build_filename(tmp, "s.pickle.zst", NULL);
    g_autofree char *gz = g_build_filename(tmp, "s.bin", NULL);
    g_autofree char *cmd = g_strdup_printf("zstd -q -c '%s' > '%s' && gzip -c '%s' > '%s'", src,
                                           zst, src, gz);
    if (system(cmd) != 0) {
        tu_note_skip("reads_zstd_and_gzip", "the zstd or gzip command failed");
        return;
    }
    GError *err = NULL;
    MemsimTrace *a = memsim_snapshot_read(src, NULL, &err);
    cr_assert(a, "%s", err ? err->message : "");
    const char *files[] = {zst, gz};
    for (int i = 0; i < 2; i++) {
        guint64 got = 0;
        MemsimSnapshotReadOptions o = {.bytes_read = &got};
        MemsimTrace *b = memsim_snapshot_read(files[i], &o, &err);
        cr_assert(b, "%s", err ? err->message : "");
        GStatBuf st;
        cr_assert_eq(g_stat(files[i], &st), 0);
        cr_assert_eq(got, (guint64)st.st_size, "%s: %" G_GUINT64_FORMAT " bytes read", files[i], got);
        same_trace(files[i], a, b);
        memsim_trace_free(b);
    }
    /* a cut compressed stream is refused */
    g_autofree char *cut = g_strdup_printf("head -c 200 '%s' > '%s.cut'", zst, zst);
    cr_assert_eq(system(cut), 0);
    g_autofree char *cutname = g_strdup_printf("%s.cut", zst);
    MemsimTrace *c = memsim_snapshot_read(cutname, NULL, &err);
    cr_assert_null(c);
    cr_assert(err && err->code == MEMSIM_ERROR_BAD_INPUT && strstr(err->message, cutname),
              "%s", err ? err->message : "");
    g_clear_error(&err);
    memsim_trace_free(a);
}

/* A compressed snapshot of many of the reading thread's chunks (a generated 2 MB one) reads
 * as the plain file, and one whose data goes wrong half-way is refused with the place named,
 * the thread stopped while it still has input to read. */
Test(snapshot_stream, reads_big_compressed_and_stops_on_error)
{
    const char *python = g_getenv("MEMSIM_PYTHON"), *root = g_getenv("MEMSIM_SOURCE_ROOT");
    cr_assert(python && root, "MEMSIM_PYTHON and MEMSIM_SOURCE_ROOT are set by meson");
    g_autofree char *tmp = tu_tmpdir();
    g_autofree char *src = g_build_filename(tmp, "s.pickle", NULL);
    g_autofree char *bad = g_build_filename(tmp, "bad.pickle", NULL);
    g_autofree char *gen = g_build_filename(root, "tools", "snapshot-gen.py", NULL);
    g_autofree char *cmd = g_strdup_printf(
        "'%s' '%s' '%s' --events 60000 >/dev/null && "
        "'%s' -c \"import sys; d = bytearray(open(sys.argv[1], 'rb').read()); "
        "d[len(d) * 2 // 3] = 0xff; open(sys.argv[2], 'wb').write(d)\" '%s' '%s' && "
        "zstd -q -f '%s' '%s' && gzip -k -f '%s' '%s'",
        python, gen, src, python, src, bad, src, bad, src, bad);
    if (system(cmd) != 0) {
        tu_note_skip("reads_big_compressed_and_stops_on_error",
                     "the generator, zstd or gzip failed");
        return;
    }
    GStatBuf st;
    cr_assert_eq(g_stat(src, &st), 0);
    cr_assert_gt(st.st_size, 1 << 20, "the generated snapshot: %lld bytes", (long long)st.st_size);
    GError *err = NULL;
    MemsimTrace *a = memsim_snapshot_read(src, NULL, &err);
    cr_assert(a, "%s", err ? err->message : "");
    const char *suffix[] = {".zst", ".gz"};
    for (int i = 0; i < 2; i++) {
        g_autofree char *z = g_strconcat(src, suffix[i], NULL);
        MemsimTrace *b = memsim_snapshot_read(z, NULL, &err);
        cr_assert(b, "%s: %s", z, err ? err->message : "");
        same_trace(z, a, b);
        memsim_trace_free(b);
        g_autofree char *zb = g_strconcat(bad, suffix[i], NULL);
        MemsimTrace *c = memsim_snapshot_read(zb, NULL, &err);
        cr_assert_null(c, "%s was read", zb);
        cr_assert(err && err->code == MEMSIM_ERROR_BAD_INPUT && strstr(err->message, zb) &&
                      strstr(err->message, "byte "),
                  "%s", err ? err->message : "");
        g_clear_error(&err);
    }
    memsim_trace_free(a);
}

/* Entries are applied on a thread of their own, a batch at a time: a snapshot whose entry
 * applied late fails (an alloc at an address still allocated, past the first batches) is
 * refused with that entry named, as one thread names it — also when the file ends early a
 * few entries later, which the parser meets before that entry's batch is applied (protocol 3:
 * no frames, whose lengths would tell the end first). */
Test(snapshot_stream, applying_entries_fails_at_the_first_bad_one)
{
    const char *python = g_getenv("MEMSIM_PYTHON");
    cr_assert(python, "MEMSIM_PYTHON is set by meson");
    g_autofree char *tmp = tu_tmpdir();
    g_autofree char *dup = g_build_filename(tmp, "dup.pickle", NULL);
    g_autofree char *cut = g_build_filename(tmp, "cut.pickle", NULL);
    g_autofree char *cmd = g_strdup_printf(
        "'%s' -c \"\n"
        "import pickle, sys\n"
        "seg = 4 << 20\n"
        "ev = [dict(action='segment_alloc', addr=0x7f0000000000 + i * seg, size=seg, stream=0)\n"
        "      for i in range(50)]\n"
        "for r in range(4000):\n"
        "    a = dict(action='alloc', addr=0x7f0000000000 + r %% 50 * seg, size=seg, stream=0)\n"
        "    ev.append(a)\n"
        "    if r == 3000:\n"
        "        ev.append(dict(a))\n"
        "    ev.append(dict(a, action='free_requested'))\n"
        "    ev.append(dict(a, action='free_completed'))\n"
        "d = pickle.dumps(dict(segments=[], device_traces=[ev]), protocol=3)\n"
        "open(sys.argv[1], 'wb').write(d)\n"
        "open(sys.argv[2], 'wb').write(d[:len(d) * 76 // 100])\n"
        "\" '%s' '%s'",
        python, dup, cut);
    cr_assert_eq(system(cmd), 0, "the test's snapshots could not be made");
    /* entry 9051: 50 segments, then 3 entries per alloc, the 3000th alloc's twin */
    const char *want = ": device_traces[0][9051]: alloc at 0x7f0000000000, which is still allocated";
    const char *files[] = {dup, cut};
    for (int i = 0; i < 2; i++) {
        GError *err = NULL;
        MemsimTrace *t = memsim_snapshot_read(files[i], NULL, &err);
        if (t)
            memsim_trace_free(t);
        cr_expect_null(t, "%s was read", files[i]);
        g_autofree char *msg = g_strdup(err ? err->message : "(no error)");
        g_clear_error(&err);
        cr_expect(g_str_has_prefix(msg, files[i]) && g_str_has_suffix(msg, want),
                  "%s (wanted %s%s)", msg, files[i], want);
    }
}
