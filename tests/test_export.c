/* Exports: every output is read back by an independent reader — GLib's GMarkupParser for the
 * SVG, cairo's PNG loader for the PNG, json-glib for the Perfetto trace, a plain CSV split,
 * and Python's own pickle module (every global refused) and torch.cuda._memory_viz for the
 * snapshot — and checked against the replay's report. A snapshot written by memsim must
 * replay under `memsim replay --verify` with no mismatch, for generated and real traces. */
#include <criterion/criterion.h>
#include <cairo.h>
#include <errno.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <memsim/export.h>
#include <memsim/formats.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <memsim/timeline.h>
#include <string.h>

#include <glib/gstdio.h>

#include "testutil.h"

/* ---- helpers ---- */

static MemsimTrace *gen_trace(const char *model, const char *seq)
{
    GError *e = NULL;
    MemsimModel *m = memsim_model_load(model, &e);
    cr_assert(m, "%s", e ? e->message : "?");
    MemsimRun run = memsim_run_defaults();
    cr_assert(memsim_run_set(&run, "seq", seq, &e), "%s", e ? e->message : "?");
    MemsimTrace *t = memsim_generate(m, &run, &e);
    cr_assert(t, "%s", e ? e->message : "?");
    memsim_run_clear(&run);
    memsim_model_free(m);
    return t;
}

static MemsimReport *replay_tl(MemsimTrace *t, MemsimTimeline *tl, memsim_size_t capacity)
{
    MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
    o.timeline = tl;
    o.capacity = capacity;
    GError *e = NULL;
    MemsimReport *rep = memsim_replay_trace(t, &o, &e);
    cr_assert(rep, "%s", e ? e->message : "?");
    return rep;
}

static uint64_t xs(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* A training-like program on each of `n_ranks` ranks: ops of every phase, tensors of every
 * category piling up and going away, from a fixed seed. */
static MemsimTrace *synthetic_timed(guint n_ranks, guint n_ops, double duration_us)
{
    MemsimTrace *t = memsim_trace_new("synthetic export test");
    for (guint r = 0; r < n_ranks; r++)
        memsim_trace_add_rank(t, r, 1);
    guint32 ops[16];
    for (int i = 0; i < 16; i++) {
        char name[32];
        g_snprintf(name, sizeof name, "layers.%d.op", i);
        MemsimOpInfo op = {memsim_trace_intern(t, name), (uint8_t)(1 + i % 3), i, -1,
                           duration_us, 0};
        ops[i] = memsim_trace_add_op(t, &op);
    }
    for (guint r = 0; r < n_ranks; r++) {
        GArray *ev = g_array_new(FALSE, TRUE, sizeof(MemsimEvent));
        uint64_t rng = 0x9e3779b97f4a7c15ull + r, next = 1;
        GArray *live = g_array_new(FALSE, FALSE, sizeof(uint64_t));
        for (guint k = 0; k < n_ops; k++) {
            MemsimEvent op = {.kind = MEMSIM_EV_OP, .id = ops[k % 16]};
            g_array_append_val(ev, op);
            gboolean grow = (k / 500) % 2 == 0;
            for (int j = 0; j < 3; j++) {
                if ((grow && xs(&rng) % 4 != 0) || live->len == 0) {
                    MemsimEvent a = {.kind = MEMSIM_EV_ALLOC,
                                     .id = next,
                                     .size = 512 + xs(&rng) % (8 << 20),
                                     .category = (uint8_t)(xs(&rng) % MEMSIM_CAT_COUNT)};
                    g_array_append_val(ev, a);
                    g_array_append_val(live, next);
                    next++;
                } else {
                    guint i = (guint)(xs(&rng) % live->len);
                    MemsimEvent f = {.kind = MEMSIM_EV_FREE,
                                     .id = g_array_index(live, uint64_t, i)};
                    g_array_append_val(ev, f);
                    g_array_remove_index_fast(live, i);
                }
            }
        }
        memsim_trace_append(t, r, (MemsimEvent *)ev->data, ev->len);
        g_array_unref(ev);
        g_array_unref(live);
    }
    return t;
}

static MemsimTrace *synthetic(guint n_ranks, guint n_ops)
{
    return synthetic_timed(n_ranks, n_ops, 0.0);
}

static char *tmp_path(const char *dir, const char *name)
{
    return g_build_filename(dir, name, NULL);
}

/* Runs /usr/bin/python3 with a script and arguments; returns its exit status, stdout. */
static int run_python(const char *script, const char *arg, char **out, char **err)
{
    const char *argv[] = {"/usr/bin/python3", "-c", script, arg, NULL};
    int status = 0;
    GError *e = NULL;
    gboolean ok = g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_DEFAULT, NULL, NULL, out, err,
                               &status, &e);
    cr_assert(ok, "cannot run /usr/bin/python3: %s", e ? e->message : "?");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static JsonNode *parse_json(const char *text)
{
    GError *e = NULL;
    JsonParser *p = json_parser_new();
    cr_assert(json_parser_load_from_data(p, text, -1, &e), "bad JSON: %s\n%.500s",
              e ? e->message : "?", text);
    JsonNode *root = json_node_copy(json_parser_get_root(p));
    g_object_unref(p);
    return root;
}

/* ---- the timeline itself ---- */

/* Buckets stay bounded, and min, max and the peak survive every merge: checked against a
 * brute-force pass over the same random samples. */
Test(timeline, bounded_and_exact_peak)
{
    MemsimTrace *t = memsim_trace_new("unit");
    memsim_trace_add_rank(t, 0, 1);
    MemsimTimeline *tl = memsim_timeline_new(64);
    memsim_timeline_begin(tl, memsim_trace_header(t), "torch", 0);
    uint64_t rng = 42;
    int64_t peak = -1, peak_res = -1, lo = INT64_MAX;
    uint64_t peak_ev = 0;
    int64_t cat[MEMSIM_CAT_COUNT] = {0};
    const uint64_t n = 1000003;
    for (uint64_t i = 0; i < n; i++) {
        int64_t a = (int64_t)(xs(&rng) % 1000000), r = a + (int64_t)(xs(&rng) % 1000);
        cat[MEMSIM_CAT_ACTIVATION] = a;
        memsim_timeline_sample(tl, memsim_trace_header(t), 0, i * 2, 0.0, -1, a, r, cat);
        if (a > peak) {
            peak = a;
            peak_ev = i * 2;
        }
        peak_res = MAX(peak_res, r);
        lo = MIN(lo, a);
    }
    memsim_timeline_end(tl, 0, n * 2);
    const MemsimTimelineRank *rk = memsim_timeline_rank(tl, 0);
    cr_assert_leq(rk->n_samples, 64);
    cr_assert_geq(rk->n_samples, 32);
    cr_expect_eq(rk->peak_allocated.allocated, peak);
    cr_expect_eq(rk->peak_allocated.event, peak_ev);
    cr_expect_eq(rk->peak_reserved.reserved, peak_res);
    int64_t bmax = -1, bmin = INT64_MAX, bres = -1;
    uint64_t covered = 0, prev_last = 0;
    for (gsize i = 0; i < rk->n_samples; i++) {
        const MemsimTimelineSample *s = &rk->samples[i];
        bmax = MAX(bmax, s->allocated_max);
        bmin = MIN(bmin, s->allocated_min);
        bres = MAX(bres, s->reserved_max);
        cr_expect_eq(s->by_category[MEMSIM_CAT_ACTIVATION], s->allocated_max,
                     "categories are those of the bucket's max");
        cr_expect_leq(s->event_first, s->event_at_max);
        cr_expect_leq(s->event_at_max, s->event_last);
        if (i)
            cr_expect_gt(s->event_first, prev_last, "buckets in order, disjoint");
        prev_last = s->event_last;
        covered += s->n_samples;
    }
    cr_expect_eq(covered, n);
    cr_expect_eq(bmax, peak);
    cr_expect_eq(bmin, lo);
    cr_expect_eq(bres, peak_res);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* The replay's timeline agrees with its report. */
Test(timeline, agrees_with_the_report)
{
    MemsimTrace *t = gen_trace("gpt2", "128");
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    cr_assert_eq(memsim_timeline_n_ranks(tl), rep->n_ranks);
    const MemsimTimelineRank *r = memsim_timeline_rank(tl, 0);
    cr_expect_eq(r->peak_allocated.allocated, rep->ranks[0].stats.allocated.peak);
    cr_expect_eq(r->peak_reserved.reserved, rep->ranks[0].stats.reserved.peak);
    cr_expect_eq(r->peak_allocated.event, rep->ranks[0].peak_allocated_event);
    cr_expect_str_eq(memsim_timeline_op_name(tl, r->peak_allocated.op), rep->ranks[0].peak_op_name);
    cr_expect_eq(r->n_events, rep->ranks[0].n_events);
    cr_expect_gt(r->n_slices, 10);
    int64_t sum = 0;
    for (int c = 0; c < MEMSIM_CAT_COUNT; c++) {
        cr_expect_eq((uint64_t)r->peak_allocated.by_category[c], rep->ranks[0].peak_by_category[c]);
        sum += r->peak_allocated.by_category[c];
    }
    cr_expect_eq(sum, r->peak_allocated.allocated);
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* ---- SVG ---- */

typedef struct {
    int n_svg;
    double width, height;
    int series[MEMSIM_CAT_COUNT]; /* category-coloured areas in the panels */
    int reserved_lines;
} SvgCount;

static gboolean parse_rgb(const char *style, const char *key, int rgb[3])
{
    const char *p = strstr(style, key);
    if (!p)
        return FALSE;
    double r, g, b;
    if (sscanf(p + strlen(key), "rgb(%lf%%,%lf%%,%lf%%)", &r, &g, &b) != 3)
        return FALSE;
    rgb[0] = (int)lround(r * 2.55);
    rgb[1] = (int)lround(g * 2.55);
    rgb[2] = (int)lround(b * 2.55);
    return TRUE;
}

static void svg_start(GMarkupParseContext *ctx, const char *name, const char **an,
                      const char **av, gpointer user, GError **error)
{
    SvgCount *c = user;
    if (strcmp(name, "svg") == 0) {
        c->n_svg++;
        for (int i = 0; an[i]; i++) {
            if (strcmp(an[i], "width") == 0)
                c->width = g_ascii_strtod(av[i], NULL);
            if (strcmp(an[i], "height") == 0)
                c->height = g_ascii_strtod(av[i], NULL);
        }
        return;
    }
    if (strcmp(name, "path") != 0)
        return;
    const char *style = "", *d = "";
    for (int i = 0; an[i]; i++) {
        if (strcmp(an[i], "style") == 0)
            style = av[i];
        if (strcmp(an[i], "d") == 0)
            d = av[i];
    }
    /* Only what lies in the panels, below the title and the legend (which show the same
     * colours as keys): the first point of the path tells. */
    double x0, y0;
    if (sscanf(d, " M %lf %lf", &x0, &y0) != 2 || y0 < 100)
        return;
    int rgb[3];
    if (parse_rgb(style, "fill:", rgb)) {
        guint32 v = (guint32)(rgb[0] << 16 | rgb[1] << 8 | rgb[2]);
        for (int k = 0; k < MEMSIM_CAT_COUNT; k++)
            if (memsim_export_category_rgb(k) == v)
                c->series[k]++;
    } else if (parse_rgb(style, "stroke:", rgb) && strstr(style, "stroke-width:1.5;")) {
        c->reserved_lines++;
    }
}

static SvgCount parse_svg(const char *text, gsize len)
{
    SvgCount c = {0};
    GMarkupParser p = {svg_start, NULL, NULL, NULL, NULL};
    GMarkupParseContext *ctx = g_markup_parse_context_new(&p, 0, &c, NULL);
    GError *e = NULL;
    cr_assert(g_markup_parse_context_parse(ctx, text, (gssize)len, &e) &&
                  g_markup_parse_context_end_parse(ctx, &e),
              "the SVG is not well-formed XML: %s", e ? e->message : "?");
    g_markup_parse_context_free(ctx);
    return c;
}

/* One area per category present and one reserved line per rank, all parsed back. */
Test(svg, series_per_rank)
{
    MemsimTrace *t = synthetic(3, 3000);
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *svg = tmp_path(dir, "t.svg");
    GError *e = NULL;
    cr_assert(memsim_export_timeline_plot(tl, "synthetic", svg, &e), "%s", e ? e->message : "");
    g_autofree char *text = NULL;
    gsize len = 0;
    cr_assert(g_file_get_contents(svg, &text, &len, NULL));
    SvgCount c = parse_svg(text, len);
    cr_expect_eq(c.n_svg, 1);
    cr_expect_eq(c.width, 1200);
    cr_expect_gt(c.height, 3 * 250);
    int expected[MEMSIM_CAT_COUNT] = {0};
    for (guint r = 0; r < memsim_timeline_n_ranks(tl); r++) {
        const MemsimTimelineRank *rk = memsim_timeline_rank(tl, r);
        gboolean present[MEMSIM_CAT_COUNT] = {FALSE};
        for (gsize i = 0; i < rk->n_samples; i++)
            for (int k = 0; k < MEMSIM_CAT_COUNT; k++)
                present[k] |= rk->samples[i].by_category[k] > 0;
        for (int k = 0; k < MEMSIM_CAT_COUNT; k++)
            expected[k] += present[k];
    }
    for (int k = 0; k < MEMSIM_CAT_COUNT; k++)
        cr_expect_eq(c.series[k], expected[k], "%s: %d areas drawn, %d expected",
                     memsim_category_name(k), c.series[k], expected[k]);
    cr_expect_eq(expected[MEMSIM_CAT_ACTIVATION], 3);
    cr_expect_eq(c.reserved_lines, 3);
    /* The in-memory SVG is the same drawing. */
    g_autofree char *mem = memsim_export_timeline_svg(tl, "synthetic", &e);
    cr_assert(mem);
    cr_expect_eq(strlen(mem), len);
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* Under 2 MB whatever the trace: 40 ranks (more than are drawn) of 300 000 events each. */
Test(svg, size_bounded, .timeout = 300)
{
    MemsimTrace *t = synthetic(40, 75000);
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    cr_assert_geq(rep->ranks[0].n_events, 300000);
    g_autofree char *svg = memsim_export_timeline_svg(tl, NULL, NULL);
    cr_assert(svg);
    cr_expect_lt(strlen(svg), 2u << 20, "SVG of %zu bytes", strlen(svg));
    SvgCount c = parse_svg(svg, strlen(svg));
    cr_expect_eq(c.reserved_lines, 16, "at most 16 panels, %d reserved lines", c.reserved_lines);
    cr_expect(strstr(svg, "<svg"));
    for (guint r = 0; r < 40; r++)
        cr_expect_leq(memsim_timeline_rank(tl, r)->n_samples, 4096);
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* ---- the plot's time axis and its peak ---- */

static MemsimTrace *gen_trace_batch(const char *model, const char *batch, const char *seq)
{
    GError *e = NULL;
    MemsimModel *m = memsim_model_load(model, &e);
    cr_assert(m, "%s", e ? e->message : "?");
    MemsimRun run = memsim_run_defaults();
    cr_assert(memsim_run_set(&run, "batch", batch, &e), "%s", e ? e->message : "?");
    cr_assert(memsim_run_set(&run, "seq", seq, &e), "%s", e ? e->message : "?");
    MemsimTrace *t = memsim_generate(m, &run, &e);
    cr_assert(t, "%s", e ? e->message : "?");
    memsim_run_clear(&run);
    memsim_model_free(m);
    return t;
}

/* The SVG's panel: the outline of the stack (the first category area drawn, the cumulative
 * top band) and the centre of the peak marker. */
typedef struct {
    GArray *top; /* double: x0, y0, x1, y1, ... */
    double marker_x, marker_y;
    gboolean have_marker;
} SvgPeak;

static void path_points(const char *d, GArray *out)
{
    const char *p = d;
    while (*p) {
        while (*p == ' ' || *p == 'M' || *p == 'L' || *p == 'C' || *p == 'Z')
            p++;
        if (!*p)
            break;
        char *end;
        double x = g_ascii_strtod(p, &end);
        cr_assert(end != p, "unexpected path data at \"%.20s\"", p);
        p = end;
        double y = g_ascii_strtod(p, &end);
        cr_assert(end != p, "unexpected path data at \"%.20s\"", p);
        p = end;
        g_array_append_val(out, x);
        g_array_append_val(out, y);
    }
}

static void svg_peak_start(GMarkupParseContext *ctx, const char *name, const char **an,
                           const char **av, gpointer user, GError **error)
{
    SvgPeak *c = user;
    if (strcmp(name, "path") != 0)
        return;
    const char *style = "", *d = "";
    for (int i = 0; an[i]; i++) {
        if (strcmp(an[i], "style") == 0)
            style = av[i];
        if (strcmp(an[i], "d") == 0)
            d = av[i];
    }
    double x0, y0;
    int rgb[3];
    if (sscanf(d, " M %lf %lf", &x0, &y0) != 2 || y0 < 100)
        return;
    if ((parse_rgb(style, "fill:", rgb) || parse_rgb(style, "stroke:", rgb)) &&
        (guint32)(rgb[0] << 16 | rgb[1] << 8 | rgb[2]) == MEMSIM_EXPORT_PEAK_RGB) {
        /* a circle (filled or a ring): the centre of its bounding box */
        GArray *pts = g_array_new(FALSE, FALSE, sizeof(double));
        path_points(d, pts);
        double lo[2] = {INFINITY, INFINITY}, hi[2] = {-INFINITY, -INFINITY};
        for (guint i = 0; i < pts->len; i++) {
            double v = g_array_index(pts, double, i);
            lo[i % 2] = MIN(lo[i % 2], v);
            hi[i % 2] = MAX(hi[i % 2], v);
        }
        g_array_unref(pts);
        c->marker_x = (lo[0] + hi[0]) / 2;
        c->marker_y = (lo[1] + hi[1]) / 2;
        c->have_marker = TRUE;
        return;
    }
    if (c->top->len || !parse_rgb(style, "fill:", rgb))
        return;
    guint32 v = (guint32)(rgb[0] << 16 | rgb[1] << 8 | rgb[2]);
    for (int k = 0; k < MEMSIM_CAT_COUNT; k++)
        if (memsim_export_category_rgb(k) == v) {
            path_points(d, c->top);
            return;
        }
}

static SvgPeak svg_peak(const MemsimTimeline *tl)
{
    g_autofree char *svg = memsim_export_timeline_svg(tl, NULL, NULL);
    cr_assert(svg);
    SvgPeak c = {.top = g_array_new(FALSE, FALSE, sizeof(double))};
    GMarkupParser p = {svg_peak_start, NULL, NULL, NULL, NULL};
    GMarkupParseContext *ctx = g_markup_parse_context_new(&p, 0, &c, NULL);
    GError *e = NULL;
    cr_assert(g_markup_parse_context_parse(ctx, svg, -1, &e) &&
                  g_markup_parse_context_end_parse(ctx, &e),
              "the SVG is not well-formed XML: %s", e ? e->message : "?");
    g_markup_parse_context_free(ctx);
    cr_assert(c.have_marker, "no peak marker");
    cr_assert_gt(c.top->len, 8, "no stacked area");
    return c;
}

/* The stack's top at x: the horizontal step that covers it. */
static double stack_top_at(const GArray *pts, double x)
{
    const double *p = (const double *)pts->data;
    guint n = pts->len / 2;
    double best = NAN;
    for (guint i = 0; i + 1 < n; i++) {
        double xa = p[2 * i], ya = p[2 * i + 1], xb = p[2 * i + 2], yb = p[2 * i + 3];
        if (fabs(ya - yb) < 1e-9 && xa <= x + 1e-3 && x + 1e-3 < xb)
            best = isnan(best) ? ya : MIN(best, ya);
    }
    return best;
}

/* With op durations, the x axis is the simulated time: it ends at the report's time, the
 * peak sits inside the step the report puts it in, and the stacked categories reach the
 * peak marker. (The host's clock, which issues ops 10 µs apart, is far shorter than the
 * streams' work for this run.) */
Test(svg, simulated_time_axis_and_stack_reaches_peak, .timeout = 120)
{
    MemsimTrace *t = gen_trace_batch("gpt2", "8", "1024");
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    const MemsimRankReport *rr = &rep->ranks[0];
    const MemsimTimelineRank *r = memsim_timeline_rank(tl, 0);
    cr_assert(r->has_time);
    cr_assert_gt(rr->time_us, 0);
    cr_assert(r->n_samples > 0);
    double col = rr->time_us / 1000.0; /* about one column of the plot */
    double last = r->samples[r->n_samples - 1].time_last_us;
    cr_expect(fabs(last - rr->time_us) <= col,
              "the last sample is at %.1f µs, the run ends at %.1f µs", last, rr->time_us);
    for (gsize i = 0; i < r->n_samples; i++)
        cr_expect_leq(r->samples[i].time_last_us, rr->time_us + 1e-6);
    cr_expect(fabs(r->end_us - rr->time_us) <= 1e-9 * rr->time_us,
              "the timeline ends at %.1f µs, the run at %.1f µs", r->end_us, rr->time_us);
    /* the peak lies in the step whose peak is the run's peak, in simulated time */
    cr_assert_geq(rr->n_steps, 2);
    guint ps = rr->n_steps;
    for (guint k = 0; k < rr->n_steps && ps == rr->n_steps; k++)
        if (rr->steps[k].peak_allocated == rr->stats.allocated.peak)
            ps = k;
    cr_assert_lt(ps, rr->n_steps);
    double t0 = rr->steps[ps].start_us;
    double t1 = ps + 1 < rr->n_steps ? rr->steps[ps + 1].start_us : rr->time_us;
    cr_expect(r->peak_allocated.time_us >= t0 && r->peak_allocated.time_us <= t1,
              "peak at %.1f µs, its step %u runs from %.1f to %.1f µs",
              r->peak_allocated.time_us, rr->steps[ps].step, t0, t1);

    /* The drawing. */
    SvgPeak c = svg_peak(tl);
    /* the panel: x from 84 to 1170 over [0, the run's end] */
    double want_x = 84 + (1200 - 84 - 30) * r->peak_allocated.time_us / rr->time_us;
    cr_expect(fabs(c.marker_x - want_x) < 0.5, "marker at x=%.2f, the peak's time is at x=%.2f",
              c.marker_x, want_x);
    double top = stack_top_at(c.top, c.marker_x);
    cr_expect(!isnan(top) && fabs(top - c.marker_y) < 0.05,
              "the stack's top at the peak's x (%.2f) is at y=%.2f, the marker at y=%.2f",
              c.marker_x, top, c.marker_y);
    g_array_unref(c.top);
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* Without op durations the axis is the event index, and the stack still reaches the peak. */
Test(svg, event_axis_and_stack_reaches_peak)
{
    MemsimTrace *t = synthetic(1, 3000);
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    const MemsimTimelineRank *r = memsim_timeline_rank(tl, 0);
    cr_assert(!r->has_time);
    SvgPeak c = svg_peak(tl);
    double want_x = 84 + (1200 - 84 - 30) * (double)r->peak_allocated.event /
                             (double)(rep->ranks[0].n_events - 1);
    cr_expect(fabs(c.marker_x - want_x) < 0.5, "marker at x=%.2f, the peak's event is at x=%.2f",
              c.marker_x, want_x);
    double top = stack_top_at(c.top, c.marker_x);
    cr_expect(!isnan(top) && fabs(top - c.marker_y) < 0.05,
              "the stack's top at the peak's x (%.2f) is at y=%.2f, the marker at y=%.2f",
              c.marker_x, top, c.marker_y);
    g_array_unref(c.top);
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* ---- PNG and PDF ---- */

/* The PNG has the plot's size, and the peak marker's colour sits where the peak is. */
Test(png, size_and_peak_marker)
{
    MemsimTrace *t = gen_trace("gpt2", "128");
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *png = tmp_path(dir, "t.png");
    g_autofree char *pdf = tmp_path(dir, "t.pdf");
    GError *e = NULL;
    cr_assert(memsim_export_timeline_plot(tl, NULL, png, &e), "%s", e ? e->message : "");
    cr_assert(memsim_export_timeline_plot(tl, NULL, pdf, &e), "%s", e ? e->message : "");
    cairo_surface_t *s = cairo_image_surface_create_from_png(png);
    cr_assert_eq(cairo_surface_status(s), CAIRO_STATUS_SUCCESS, "cannot read the PNG back");
    int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
    /* 1200 wide; a 62 px title, a 34 px legend, 300 px per rank and a margin */
    cr_expect_eq(w, 1200);
    cr_expect_eq(h, 62 + 34 + 300 + 8);
    cairo_surface_flush(s);
    const unsigned char *px = cairo_image_surface_get_data(s);
    int stride = cairo_image_surface_get_stride(s);
    long n = 0;
    double sx = 0;
    for (int y = 100; y < h; y++) /* below the legend, whose key uses the colour too */
        for (int x = 0; x < w; x++) {
            guint32 v = *(const guint32 *)(px + y * stride + x * 4) & 0xffffff;
            if (v == MEMSIM_EXPORT_PEAK_RGB) {
                n++;
                sx += x;
            }
        }
    cr_expect_gt(n, 50, "%ld pixels of the peak marker's colour", n);
    const MemsimTimelineRank *r = memsim_timeline_rank(tl, 0);
    /* the x axis: simulated time for a trace with op durations (generated ones), else events */
    double xmax = (double)MAX(r->n_events - 1, r->samples[r->n_samples - 1].event_last);
    double at = (double)r->peak_allocated.event;
    if (r->has_time) {
        xmax = rep->ranks[0].time_us; /* the run's simulated end */
        at = r->peak_allocated.time_us;
    }
    double want = 84 + (1200 - 84 - 30) * at / xmax;
    cr_expect(n && fabs(sx / n - want) < 4, "marker at x=%.1f, the peak is at x=%.1f",
              n ? sx / n : -1, want);
    cairo_surface_destroy(s);
    g_autofree char *head = NULL;
    gsize len = 0;
    cr_assert(g_file_get_contents(pdf, &head, &len, NULL));
    cr_expect(len > 1000 && memcmp(head, "%PDF-", 5) == 0, "not a PDF");
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* The marker does not hide what it marks: just below its centre the stack's colours show,
 * not the marker's nor the background (a filled dot, or a white halo, covered the top of the
 * one-column spike at the peak, so that the stack seemed to stop below the peak). */
Test(png, stack_visible_under_peak_marker)
{
    MemsimTrace *t = gen_trace_batch("gpt2", "2", "512");
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    SvgPeak c = svg_peak(tl);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *png = tmp_path(dir, "t.png");
    GError *e = NULL;
    cr_assert(memsim_export_timeline_plot(tl, NULL, png, &e), "%s", e ? e->message : "");
    cairo_surface_t *s = cairo_image_surface_create_from_png(png);
    cr_assert_eq(cairo_surface_status(s), CAIRO_STATUS_SUCCESS, "cannot read the PNG back");
    cairo_surface_flush(s);
    const unsigned char *px = cairo_image_surface_get_data(s);
    int stride = cairo_image_surface_get_stride(s);
    int cx = (int)floor(c.marker_x), cy = (int)floor(c.marker_y);
    int stack = 0;
    for (int y = cy + 1; y <= cy + 3; y++)
        for (int x = cx - 1; x <= cx + 1; x++) {
            guint32 v = *(const guint32 *)(px + y * stride + x * 4) & 0xffffff;
            int r = (int)(v >> 16), g = (int)((v >> 8) & 255), b = (int)(v & 255);
            int pr = MEMSIM_EXPORT_PEAK_RGB >> 16, pg = (MEMSIM_EXPORT_PEAK_RGB >> 8) & 255,
                pb = MEMSIM_EXPORT_PEAK_RGB & 255;
            gboolean background = abs(r - 251) + abs(g - 251) + abs(b - 251) < 60;
            gboolean marker = abs(r - pr) + abs(g - pg) + abs(b - pb) < 90;
            stack += !background && !marker;
        }
    cr_expect_gt(stack, 0, "nothing of the stack shows just below the marker's centre (%d, %d)",
                 cx, cy);
    cairo_surface_destroy(s);
    g_array_unref(c.top);
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* An OOM is drawn (a dashed line of its colour) and the capacity too. */
Test(png, oom_marked)
{
    MemsimTrace *t = gen_trace("gpt2", "128");
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, (memsim_size_t)1 << 30);
    cr_assert(rep->ranks[0].oom.happened);
    const MemsimTimelineRank *r = memsim_timeline_rank(tl, 0);
    cr_assert(r->oom);
    cr_expect_eq(r->oom_point.event, rep->ranks[0].oom.event_index);
    cr_expect_eq(r->oom_point.requested, rep->ranks[0].oom.requested);
    g_autofree char *svg = memsim_export_timeline_svg(tl, NULL, NULL);
    cr_assert(svg);
    cr_expect(strstr(svg, "stroke:rgb(69.019608%,0%,0%)"), "no OOM line in the SVG");
    cr_expect(strstr(svg, "stroke-dasharray"), "no dashed line (capacity, OOM)");
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* ---- Perfetto JSON and CSV ---- */

typedef struct {
    int64_t peak_allocated;
    int64_t csv_max;
} Pair;

/* Counters per rank, slices, the peak instant; the CSV's column maximum equals the JSON's
 * peak, and its categories sum to the allocated column. */
Test(perfetto, counters_slices_instants_and_csv)
{
    MemsimTrace *t = synthetic(2, 2000);
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *json = tmp_path(dir, "t.json");
    g_autofree char *csv = tmp_path(dir, "t.csv");
    GError *e = NULL;
    cr_assert(memsim_export_perfetto(tl, json, &e), "%s", e ? e->message : "");
    cr_assert(memsim_export_timeline_csv(tl, csv, &e), "%s", e ? e->message : "");

    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(json, &text, NULL, NULL));
    JsonNode *root = parse_json(text);
    JsonArray *evs = json_object_get_array_member(json_node_get_object(root), "traceEvents");
    cr_assert(evs);
    int counters[2] = {0}, slices[2] = {0}, instants[2] = {0};
    int64_t max_alloc[2] = {-1, -1}, peak_instant[2] = {-1, -1};
    for (guint i = 0; i < json_array_get_length(evs); i++) {
        JsonObject *o = json_array_get_object_element(evs, i);
        const char *ph = json_object_get_string_member(o, "ph");
        const char *name = json_object_get_string_member(o, "name");
        int64_t pid = json_object_get_int_member(o, "pid");
        cr_assert(pid >= 0 && pid < 2, "pid %ld", (long)pid);
        cr_assert(json_object_has_member(o, "tid"));
        if (strcmp(ph, "M") != 0)
            cr_assert(json_object_has_member(o, "ts"), "event %u has no ts", i);
        JsonObject *args = json_object_has_member(o, "args")
                               ? json_object_get_object_member(o, "args")
                               : NULL;
        if (strcmp(ph, "C") == 0 && strcmp(name, "allocated") == 0) {
            counters[pid]++;
            max_alloc[pid] = MAX(max_alloc[pid], json_object_get_int_member(args, "bytes"));
        } else if (strcmp(ph, "X") == 0) {
            slices[pid]++;
            cr_expect_geq(json_object_get_int_member(o, "dur"), 1);
        } else if (strcmp(ph, "i") == 0 && strcmp(name, "peak allocated") == 0) {
            instants[pid]++;
            peak_instant[pid] = json_object_get_int_member(args, "allocated");
            cr_expect_str_eq(json_object_get_string_member(o, "s"), "p");
        }
    }
    for (int r = 0; r < 2; r++) {
        const MemsimTimelineRank *rk = memsim_timeline_rank(tl, r);
        cr_expect_eq(counters[r], (int)rk->n_samples, "rank %d", r);
        cr_expect_gt(slices[r], 100);
        cr_expect_eq(instants[r], 1);
        cr_expect_eq(max_alloc[r], rep->ranks[r].stats.allocated.peak);
        cr_expect_eq(peak_instant[r], rep->ranks[r].stats.allocated.peak);
    }
    json_node_unref(root);

    /* CSV */
    g_autofree char *ctext = NULL;
    cr_assert(g_file_get_contents(csv, &ctext, NULL, NULL));
    g_auto(GStrv) lines = g_strsplit(ctext, "\n", -1);
    g_auto(GStrv) head = g_strsplit(lines[0], ",", -1);
    int col_alloc = -1, col_rank = -1, col_cat0 = -1;
    for (int i = 0; head[i]; i++) {
        if (strcmp(head[i], "allocated") == 0)
            col_alloc = i;
        if (strcmp(head[i], "rank") == 0)
            col_rank = i;
        if (strcmp(head[i], memsim_category_name(0)) == 0)
            col_cat0 = i;
    }
    cr_assert(col_alloc >= 0 && col_rank >= 0 && col_cat0 >= 0, "header: %s", lines[0]);
    int64_t csv_max[2] = {-1, -1};
    int rows[2] = {0};
    for (int i = 1; lines[i] && *lines[i]; i++) {
        g_auto(GStrv) f = g_strsplit(lines[i], ",", -1); /* no op name has a comma here */
        int r = atoi(f[col_rank]);
        cr_assert(r == 0 || r == 1);
        int64_t a = g_ascii_strtoll(f[col_alloc], NULL, 10), sum = 0;
        for (int k = 0; k < MEMSIM_CAT_COUNT; k++)
            sum += g_ascii_strtoll(f[col_cat0 + k], NULL, 10);
        cr_expect_eq(sum, a, "row %d: categories sum to %ld, allocated %ld", i, (long)sum,
                     (long)a);
        csv_max[r] = MAX(csv_max[r], a);
        rows[r]++;
    }
    for (int r = 0; r < 2; r++) {
        cr_expect_eq(csv_max[r], peak_instant[r], "CSV max against the JSON peak, rank %d", r);
        cr_expect_eq(rows[r], (int)memsim_timeline_rank(tl, r)->n_samples);
    }
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* Ops with durations: the simulated clock becomes the time axis; each op's slice lasts its
 * duration, and time never goes back. */
Test(perfetto, simulated_time)
{
    MemsimTrace *t = synthetic_timed(1, 400, 250.0);
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    const MemsimTimelineRank *r = memsim_timeline_rank(tl, 0);
    cr_assert(r->has_time);
    cr_assert_eq(r->n_slices, 400);
    for (gsize i = 0; i < r->n_slices; i++) {
        cr_expect(fabs(r->slices[i].time_last_us - r->slices[i].time_first_us - 250.0) < 1e-6);
        if (i)
            cr_expect_geq(r->slices[i].time_first_us, r->slices[i - 1].time_last_us);
    }
    for (gsize i = 1; i < r->n_samples; i++)
        cr_expect_geq(r->samples[i].time_first_us, r->samples[i - 1].time_last_us);
    /* samples lie at the end of the running op's work: within the run, never past its end */
    cr_expect_gt(r->samples[r->n_samples - 1].time_last_us, 0);
    cr_expect_leq(r->samples[r->n_samples - 1].time_last_us,
                  r->slices[r->n_slices - 1].time_last_us);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *json = tmp_path(dir, "t.json");
    GError *e = NULL;
    cr_assert(memsim_export_perfetto(tl, json, &e), "%s", e ? e->message : "");
    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(json, &text, NULL, NULL));
    JsonNode *root = parse_json(text);
    JsonArray *evs = json_object_get_array_member(json_node_get_object(root), "traceEvents");
    int n = 0;
    for (guint i = 0; i < json_array_get_length(evs); i++) {
        JsonObject *o = json_array_get_object_element(evs, i);
        if (strcmp(json_object_get_string_member(o, "ph"), "X") == 0) {
            cr_expect(fabs(json_object_get_double_member(o, "dur") - 250.0) < 1e-6);
            n++;
        }
    }
    cr_expect_eq(n, 400);
    json_node_unref(root);
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* ---- errors ---- */

Test(errors, unwritable_paths)
{
    MemsimTrace *t = gen_trace("gpt2", "64");
    MemsimTimeline *tl = memsim_timeline_new(0);
    MemsimReport *rep = replay_tl(t, tl, 0);
    const char *missing = "/nonexistent-dir/x";
    const char *exts[] = {".svg", ".png", ".pdf", ".json", ".csv", ".html", ".pickle"};
    for (gsize i = 0; i < G_N_ELEMENTS(exts); i++) {
        g_autofree char *p = g_strconcat(missing, exts[i], NULL);
        GError *e = NULL;
        gboolean ok;
        if (i < 3)
            ok = memsim_export_timeline_plot(tl, NULL, p, &e);
        else if (i == 3)
            ok = memsim_export_perfetto(tl, p, &e);
        else if (i == 4)
            ok = memsim_export_timeline_csv(tl, p, &e);
        else if (i == 5)
            ok = memsim_export_html(rep, tl, NULL, NULL, p, &e);
        else
            ok = memsim_export_snapshot_trace(t, p, NULL, &e);
        cr_expect(!ok, "%s written?", p);
        cr_expect(e && e->domain == MEMSIM_ERROR && e->code == MEMSIM_ERROR_IO, "%s: %s", p,
                  e ? e->message : "no error");
        cr_expect(e && strstr(e->message, p), "names the file: %s", e ? e->message : "");
        g_clear_error(&e);
    }
    /* A full device: the write error is reported, and the device is left alone. */
    if (g_file_test("/dev/full", G_FILE_TEST_EXISTS)) {
        GError *e = NULL;
        cr_expect(!memsim_export_perfetto(tl, "/dev/full", &e));
        cr_expect(e && e->code == MEMSIM_ERROR_IO && strstr(e->message, "/dev/full"));
        g_clear_error(&e);
        cr_expect(!memsim_export_snapshot_trace(t, "/dev/full", NULL, &e));
        g_clear_error(&e);
        cr_expect(g_file_test("/dev/full", G_FILE_TEST_EXISTS));
    }
    GError *e = NULL;
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *bad = tmp_path(dir, "t.jpg");
    cr_expect(!memsim_export_timeline_plot(tl, NULL, bad, &e));
    cr_expect(e && e->code == MEMSIM_ERROR_BAD_INPUT);
    g_clear_error(&e);
    cr_expect(!g_file_test(bad, G_FILE_TEST_EXISTS));
    memsim_report_free(rep);
    memsim_timeline_free(tl);
    memsim_trace_free(t);
}

/* ---- the snapshot pickle ---- */

/* Loads the pickle with Python's own module, refusing every global, and summarises it. */
static const char restricted_loader[] =
    "import json, pickle, sys\n"
    "class R(pickle.Unpickler):\n"
    "    def find_class(self, module, name):\n"
    "        raise pickle.UnpicklingError('global %s.%s refused' % (module, name))\n"
    "d = R(open(sys.argv[1], 'rb')).load()\n"
    "ok = (dict, list, str, int, float, bool, type(None), tuple)\n"
    "def plain(v):\n"
    "    if not isinstance(v, ok): return False\n"
    "    if isinstance(v, dict): return all(isinstance(k, str) and plain(x) for k, x in v.items())\n"
    "    if isinstance(v, (list, tuple)): return all(plain(x) for x in v)\n"
    "    return True\n"
    "segs = d['segments']\n"
    "acts = {}\n"
    "named = 0\n"
    "# the trace a viewer plays (MemoryViz), replayed as PyTorch's actions mean: alloc adds the\n"
    "# block, free_completed returns it, segment_alloc/segment_free reserve and release\n"
    "alloc = reserved = peak_alloc = peak_reserved = 0\n"
    "live = {}\n"
    "consistent = True  # a recording that starts mid-run may free what it never saw made\n"
    "for dev in d['device_traces']:\n"
    "    for e in dev:\n"
    "        acts[e['action']] = acts.get(e['action'], 0) + 1\n"
    "        a = e['action']\n"
    "        if a == 'alloc':\n"
    "            consistent &= e['addr'] not in live\n"
    "            live[e['addr']] = e['size']; alloc += e['size']\n"
    "        elif a == 'free_completed':\n"
    "            consistent &= live.pop(e['addr'], None) == e['size']\n"
    "            alloc -= e['size']\n"
    "        elif a in ('segment_alloc', 'segment_map'):\n"
    "            reserved += e['size']\n"
    "        elif a in ('segment_free', 'segment_unmap'):\n"
    "            reserved -= e['size']\n"
    "        peak_alloc = max(peak_alloc, alloc); peak_reserved = max(peak_reserved, reserved)\n"
    "        assert set(e) >= {'action', 'size', 'stream', 'time_us', 'frames'}, e\n"
    "        if e['frames']:\n"
    "            f = e['frames'][0]\n"
    "            assert f['filename'] == 'memsim' and f['line'] == 0 and f['name'], f\n"
    "            named += 1\n"
    "for s in segs:\n"
    "    assert set(s) >= {'device', 'address', 'total_size', 'allocated_size', 'active_size',\n"
    "        'requested_size', 'stream', 'segment_type', 'segment_pool_id', 'is_expandable',\n"
    "        'frames', 'blocks'}, s.keys()\n"
    "    at = s['address']\n"
    "    for b in s['blocks']:\n"
    "        assert b['address'] == at and set(b) >= {'size', 'requested_size', 'state', 'frames'}\n"
    "        at += b['size']\n"
    "    assert at == s['address'] + s['total_size'], 'blocks do not tile their segment'\n"
    "    assert s['allocated_size'] == sum(b['size'] for b in s['blocks'] if b['state'] == 'active_allocated')\n"
    "print(json.dumps({'plain': plain(d), 'keys': sorted(d),\n"
    "  'reserved': sum(s['total_size'] for s in segs),\n"
    "  'allocated': sum(b['size'] for s in segs for b in s['blocks'] if b['state'] != 'inactive'),\n"
    "  'segments': len(segs), 'actions': acts, 'named_frames': named,\n"
    "  'devices': len(d['device_traces']),\n"
    "  'trace': {'consistent': consistent, 'final_allocated': alloc, 'final_reserved': reserved,\n"
    "            'peak_allocated': peak_alloc, 'peak_reserved': peak_reserved},\n"
    "  'settings': sorted(d['allocator_settings'])}))\n";

static JsonObject *python_summary(const char *pickle_path, JsonNode **keep)
{
    g_autofree char *out = NULL, *err = NULL;
    int rc = run_python(restricted_loader, pickle_path, &out, &err);
    cr_assert_eq(rc, 0, "Python could not load %s:\n%s", pickle_path, err);
    *keep = parse_json(out);
    return json_node_get_object(*keep);
}

static JsonObject *replay_verify_json(const char *path, JsonNode **keep)
{
    const char *argv[] = {"replay", path, "--verify", "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    cr_assert_eq(rc, 0, "memsim replay --verify %s: exit %d\n%s", path, rc, err);
    *keep = parse_json(out);
    return json_node_get_object(*keep);
}

static int64_t count_events(MemsimTrace *t, MemsimEventKind kind)
{
    int64_t n = 0;
    MemsimTraceHeader *h = memsim_trace_header(t);
    for (guint r = 0; r < h->n_ranks; r++) {
        gsize k;
        const MemsimEvent *ev = memsim_trace_events(t, r, &k);
        for (gsize i = 0; i < k; i++)
            n += ev[i].kind == kind;
    }
    return n;
}

/* A generated trace (the command line's gen → convert path): Python reads it with every
 * global refused; it holds what the replay did; replaying it verifies with no mismatch. */
Test(snapshot, generated_trace_round_trip, .timeout = 300)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *mst = tmp_path(dir, "x.mst");
    g_autofree char *pkl = tmp_path(dir, "x.pickle");
    g_autofree char *pkl2 = tmp_path(dir, "y.pickle");
    const char *gen[] = {"gen", "--model", "gpt2", "--seq", "256", "-o", mst, NULL};
    g_autofree char *err = NULL;
    cr_assert_eq(tu_run_memsim(gen, NULL, &err), 0, "%s", err);
    const char *conv[] = {"convert", mst, pkl, NULL};
    g_autofree char *err2 = NULL;
    cr_assert_eq(tu_run_memsim(conv, NULL, &err2), 0, "%s", err2);
    const char *gen2[] = {"gen", "--model", "gpt2", "--seq", "256", "-o", pkl2, NULL};
    g_autofree char *err3 = NULL;
    cr_assert_eq(tu_run_memsim(gen2, NULL, &err3), 0, "%s", err3);

    GError *e = NULL;
    MemsimTrace *t = memsim_trace_load(mst, &e);
    cr_assert(t, "%s", e ? e->message : "");
    MemsimReport *rep = replay_tl(t, NULL, 0);

    JsonNode *k1, *k2;
    JsonObject *py = python_summary(pkl, &k1);
    cr_expect(json_object_get_boolean_member(py, "plain"), "only plain values");
    cr_expect_eq(json_object_get_int_member(py, "reserved"), rep->ranks[0].stats.reserved.current);
    cr_expect_eq(json_object_get_int_member(py, "allocated"),
                 rep->ranks[0].stats.allocated.current);
    JsonObject *acts = json_object_get_object_member(py, "actions");
    cr_expect_eq(json_object_get_int_member(acts, "alloc"), count_events(t, MEMSIM_EV_ALLOC));
    cr_expect_eq(json_object_get_int_member(acts, "free_requested"),
                 count_events(t, MEMSIM_EV_FREE));
    cr_expect_eq(json_object_get_int_member(acts, "free_completed"),
                 count_events(t, MEMSIM_EV_FREE));
    cr_expect_eq(json_object_get_int_member(acts, "segment_alloc"),
                 (int64_t)rep->ranks[0].stats.n_device_alloc);
    cr_expect_gt(json_object_get_int_member(py, "named_frames"), 1000, "frames name the ops");
    cr_expect_eq(json_object_get_int_member(py, "devices"), 1);
    /* the device trace, played back in Python, ends and peaks where the replay did (a trace
     * entry's size is the caller's request, as in PyTorch's record_trace: its sum is the
     * requested bytes, not the blocks') */
    JsonObject *tr = json_object_get_object_member(py, "trace");
    cr_expect(json_object_get_boolean_member(tr, "consistent"),
              "the device trace allocates a live block or frees one it never made");
    cr_expect_eq(json_object_get_int_member(tr, "final_allocated"),
                 rep->ranks[0].stats.requested.current);
    cr_expect_eq(json_object_get_int_member(tr, "final_reserved"),
                 rep->ranks[0].stats.reserved.current);
    cr_expect_eq(json_object_get_int_member(tr, "peak_allocated"),
                 rep->ranks[0].stats.requested.peak);
    cr_expect_eq(json_object_get_int_member(tr, "peak_reserved"),
                 rep->ranks[0].stats.reserved.peak);

    JsonObject *v = replay_verify_json(pkl, &k2);
    JsonObject *r0 = json_array_get_object_element(json_object_get_array_member(v, "ranks"), 0);
    JsonObject *vv = json_object_get_object_member(r0, "verify");
    cr_expect_eq(json_object_get_int_member(vv, "mismatches"), 0, "%s",
                 json_object_get_null_member(vv, "first_mismatch")
                     ? ""
                     : json_object_get_string_member(vv, "first_mismatch"));
    cr_expect_gt(json_object_get_int_member(vv, "checked"), 100);
    cr_expect_eq(json_object_get_int_member(r0, "peak_reserved"), rep->ranks[0].stats.reserved.peak);
    cr_expect_eq(json_object_get_int_member(r0, "peak_allocated"),
                 rep->ranks[0].stats.allocated.peak);

    /* gen -o x.pickle writes a snapshot directly (the generator's trace, not read back). */
    JsonNode *k3;
    JsonObject *v2 = replay_verify_json(pkl2, &k3);
    JsonObject *r2 = json_array_get_object_element(json_object_get_array_member(v2, "ranks"), 0);
    cr_expect_eq(json_object_get_int_member(json_object_get_object_member(r2, "verify"),
                                            "mismatches"),
                 0);
    json_node_unref(k3);
    json_node_unref(k1);
    json_node_unref(k2);
    memsim_report_free(rep);
    memsim_trace_free(t);
}

/* Real recordings (a long single-device trace, and an expandable-segments one on three
 * devices) written back as snapshots verify with no mismatch, and keep the final state. */
static void real_round_trip(const char *name)
{
    g_autofree char *rel = g_build_filename("torch-snapshots", name, NULL);
    g_autofree char *src = tu_shared_path_or_skip(rel);
    if (!g_file_test(src, G_FILE_TEST_EXISTS))
        cr_skip_test("%s is absent: real-snapshot round trip skipped", src);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *pkl = tmp_path(dir, "rt.pickle");
    const char *conv[] = {"convert", src, pkl, NULL};
    g_autofree char *err = NULL;
    cr_assert_eq(tu_run_memsim(conv, NULL, &err), 0, "%s", err);
    JsonNode *k0, *k1, *k2;
    JsonObject *orig = replay_verify_json(src, &k0);
    JsonObject *back = replay_verify_json(pkl, &k1);
    JsonArray *ro = json_object_get_array_member(orig, "ranks"),
              *rb = json_object_get_array_member(back, "ranks");
    cr_assert_eq(json_array_get_length(rb), json_array_get_length(ro));
    int64_t reserved = 0, allocated = 0;
    for (guint i = 0; i < json_array_get_length(rb); i++) {
        JsonObject *a = json_array_get_object_element(ro, i), *b = json_array_get_object_element(rb, i);
        JsonObject *vb = json_object_get_object_member(b, "verify");
        cr_expect_eq(json_object_get_int_member(vb, "mismatches"), 0, "rank %u: %s", i,
                     json_object_get_null_member(vb, "first_mismatch")
                         ? ""
                         : json_object_get_string_member(vb, "first_mismatch"));
        cr_expect_gt(json_object_get_int_member(vb, "checked"), 100);
        const char *same[] = {"peak_allocated", "peak_reserved", "final_allocated",
                              "final_reserved"};
        for (gsize k = 0; k < G_N_ELEMENTS(same); k++)
            cr_expect_eq(json_object_get_int_member(b, same[k]),
                         json_object_get_int_member(a, same[k]), "rank %u %s", i, same[k]);
        reserved += json_object_get_int_member(b, "final_reserved");
        allocated += json_object_get_int_member(b, "final_allocated");
    }
    JsonObject *py = python_summary(pkl, &k2);
    cr_expect(json_object_get_boolean_member(py, "plain"));
    cr_expect_eq(json_object_get_int_member(py, "reserved"), reserved);
    cr_expect_eq(json_object_get_int_member(py, "allocated"), allocated);
    json_node_unref(k0);
    json_node_unref(k1);
    json_node_unref(k2);
}

Test(snapshot, real_trace_round_trip, .timeout = 300)
{
    real_round_trip("kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle");
}

Test(snapshot, real_expandable_three_devices_round_trip, .timeout = 300)
{
    real_round_trip("Constructor-Sun__code_location__memory_snapshot.pickle");
}

Test(snapshot, real_with_oom_round_trip, .timeout = 300)
{
    real_round_trip("Nesta-gitU__discrete_diffusion__memory_snapshot.json.pickle");
}

/* PyTorch's own viewer module reads the segments and finds memsim's final figures. */
Test(snapshot, torch_memory_viz_stats, .timeout = 300)
{
    g_autofree char *probe_out = NULL, *probe_err = NULL;
    if (run_python("import torch.cuda._memory_viz", "", &probe_out, &probe_err) != 0)
        cr_skip_test("python3-torch is absent (import torch.cuda._memory_viz failed): "
                     "_memory_viz check skipped");
    MemsimTrace *t = gen_trace("gpt2", "256");
    MemsimReport *rep = replay_tl(t, NULL, 0);
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *pkl = tmp_path(dir, "g.pickle");
    GError *e = NULL;
    cr_assert(memsim_export_snapshot_trace(t, pkl, NULL, &e), "%s", e ? e->message : "");
    /* _memory_viz.stats: per block state, the bytes; total_size: every segment. */
    static const char script[] =
        "import pickle, sys\n"
        "from torch.cuda import _memory_viz as v\n"
        "d = pickle.load(open(sys.argv[1], 'rb'))\n"
        "st = v.stats(d['segments'])\n"
        "a = st.get('active_allocated', v.Bytes(0))\n"
        "print(int(st['total_size'].value), int(a.value), int(st['segments']))\n"
        "v.segments(d['segments'], format_flamegraph=lambda lines: lines)\n"
        "v.memory(d['segments'], format_flamegraph=lambda lines: lines)\n";
    g_autofree char *out = NULL, *err = NULL;
    int rc = run_python(script, pkl, &out, &err);
    cr_assert_eq(rc, 0, "_memory_viz failed:\n%s", err);
    long long total = -1, alloc = -1, segs = -1;
    cr_assert_eq(sscanf(out, "%lld %lld %lld", &total, &alloc, &segs), 3, "%s", out);
    cr_expect_eq(total, rep->ranks[0].stats.reserved.current);
    cr_expect_eq(alloc, rep->ranks[0].stats.allocated.current);
    cr_expect_eq(segs, (long long)rep->ranks[0].shape_final.n_segments);
    memsim_report_free(rep);
    memsim_trace_free(t);
}

/* A corrupted export is caught: one block's address moved in the exported snapshot's device
 * trace (rewritten with Python's own pickle module) makes `replay --verify` exit 1. */
Test(snapshot, corrupted_export_is_caught, .timeout = 300)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *pkl = tmp_path(dir, "x.pickle");
    g_autofree char *bad = tmp_path(dir, "bad.pickle");
    const char *gen[] = {"gen", "--model", "gpt2", "--seq", "128", "-o", pkl, NULL};
    g_autofree char *err = NULL;
    cr_assert_eq(tu_run_memsim(gen, NULL, &err), 0, "%s", err);
    g_autofree char *script = g_strdup_printf(
        "import pickle, sys\n"
        "d = pickle.load(open(sys.argv[1], 'rb'))\n"
        "tr = d['device_traces'][0]\n"
        "# a block that is freed later, moved by 512 bytes in all its entries: the recording\n"
        "# stays consistent, the allocator's placement no longer matches it\n"
        "freed = {e['addr'] for e in tr if e['action'] == 'free_completed'}\n"
        "allocs = [i for i, e in enumerate(tr) if e['action'] == 'alloc' and e['addr'] in freed]\n"
        "i = allocs[len(allocs) // 2]\n"
        "a = tr[i]['addr']\n"
        "for e in tr[i:]:\n"
        "    if e['addr'] == a and e['action'] in ('alloc', 'free_requested', 'free_completed'):\n"
        "        e['addr'] = a + 512\n"
        "        if e['action'] == 'free_completed':\n"
        "            break\n"
        "pickle.dump(d, open('%s', 'wb'), protocol=2)\n",
        bad);
    g_autofree char *out = NULL, *perr = NULL;
    cr_assert_eq(run_python(script, pkl, &out, &perr), 0, "%s", perr);
    const char *ok[] = {"replay", pkl, "--verify", NULL};
    cr_expect_eq(tu_run_memsim(ok, NULL, NULL), 0, "the export itself verifies");
    const char *argv[] = {"replay", bad, "--verify", NULL};
    g_autofree char *vout = NULL, *verr = NULL;
    int rc = tu_run_memsim(argv, &vout, &verr);
    cr_expect_eq(rc, 1, "a moved block in the export: exit %d\n%s%s", rc, vout, verr);
    cr_expect(vout && strstr(vout, "first:"), "the mismatch is named: %s", vout);
}

/* The snapshot of a multi-stream run (ZeRO-3's and FSDP's communication streams, blocks
 * used on another stream) is made untimed: a snapshot has no timing, so replaying the file
 * with --verify reproduces every recorded action. A timed replay of the same trace has a
 * clock; the untimed one does not. */
Test(snapshot, multi_stream_exports_verify)
{
    static const char *const methods[] = {"zero3", "fsdp"};
    for (gsize i = 0; i < G_N_ELEMENTS(methods); i++) {
        g_autofree char *dir = tu_tmpdir();
        g_autofree char *pkl = tmp_path(dir, "x.pickle");
        const char *gen[] = {"gen",    "--model", "gpt2", "--gpus", "2",  "--method",
                             methods[i], "--seq",  "128",  "-o",     pkl, NULL};
        g_autofree char *err = NULL;
        cr_assert_eq(tu_run_memsim(gen, NULL, &err), 0, "%s: %s", methods[i], err);
        const char *argv[] = {"replay", pkl, "--verify", NULL};
        g_autofree char *out = NULL, *verr = NULL;
        cr_expect_eq(tu_run_memsim(argv, &out, &verr), 0, "%s: %s%s", methods[i], out, verr);
        cr_expect(out && strstr(out, " 0 mismatches"), "%s: %s", methods[i], out);

        const char *const settings[] = {"gpus", "2", "method", methods[i], "seq", "128", NULL};
        MemsimTrace *t = tu_generate("gpt2", settings);
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        GError *e = NULL;
        MemsimReport *timed = memsim_replay_trace(t, &o, &e);
        cr_assert(timed, "%s", e ? e->message : "");
        o.untimed = TRUE;
        MemsimReport *untimed = memsim_replay_trace(t, &o, &e);
        cr_assert(untimed, "%s", e ? e->message : "");
        cr_expect_gt(timed->ranks[0].time_us, 0.0, "%s: the trace has op durations", methods[i]);
        cr_expect_eq(untimed->ranks[0].time_us, 0.0, "%s: untimed, no clock", methods[i]);
        memsim_report_free(timed);
        memsim_report_free(untimed);
        memsim_trace_free(t);
    }
}

/* A block freed while another stream still uses it stays "active_pending_free" until the
 * allocator next processes its events; a snapshot taken before that lists it so, with its
 * free_requested in the trace and no free_completed. Such a file is read (it was refused as
 * "live again before any alloc"): the program freed the block, the allocator still holds it. */
Test(snapshot, pending_free_at_the_end)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *txt = tmp_path(dir, "pending.txt");
    g_autofree char *pkl = tmp_path(dir, "pending.pickle");
    cr_assert(g_file_set_contents(txt,
                                  "memsim-trace 1\nname \"pending\"\ncapacity 0\n"
                                  "rank 0 device=0 multiplicity=1 streams=2\n@rank 0\n"
                                  "alloc t=1 size=1048576 stream=0 cat=activation\n"
                                  "use t=1 stream=1\nfree t=1\n",
                                  -1, NULL));
    const char *conv[] = {"convert", txt, pkl, NULL};
    g_autofree char *cerr = NULL;
    cr_assert_eq(tu_run_memsim(conv, NULL, &cerr), 0, "%s", cerr);
    g_autofree char *script = g_strdup_printf(
        "import pickle, sys\n"
        "d = pickle.load(open(sys.argv[1], 'rb'))\n"
        "print([e['action'] for e in d['device_traces'][0]])\n"
        "print(sorted(b['state'] for s in d['segments'] for b in s['blocks']))\n");
    g_autofree char *pout = NULL, *perr = NULL;
    cr_assert_eq(run_python(script, pkl, &pout, &perr), 0, "%s", perr);
    cr_expect(strstr(pout, "'free_requested']") && !strstr(pout, "free_completed"),
              "the free is requested, not completed: %s", pout);
    cr_expect(strstr(pout, "'active_pending_free'"), "the block is pending: %s", pout);
    const char *argv[] = {"replay", pkl, "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    cr_assert_eq(tu_run_memsim(argv, &out, &err), 0, "%s", err);
    /* the allocator still holds the block at the end, as the snapshot says */
    const char *fin = out ? strstr(out, "\"recorded_final\"") : NULL;
    cr_expect(fin && strstr(fin, "\"allocated\" : 1048576"), "%s", out);
}

/* ---- the command ---- */

Test(cli, replay_and_estimate_exports)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *mst = tmp_path(dir, "x.mst");
    const char *gen[] = {"gen", "--model", "gpt2", "--seq", "128", "-o", mst, NULL};
    cr_assert_eq(tu_run_memsim(gen, NULL, NULL), 0);
    const char *outs[] = {"t.svg", "t.json", "t.csv", "r.html", "e.png", "e.csv", "e.html",
                          "e.pdf"};
    g_autofree char *svg = tmp_path(dir, outs[0]), *json = tmp_path(dir, outs[1]),
                    *csv = tmp_path(dir, outs[2]), *html = tmp_path(dir, outs[3]),
                    *png = tmp_path(dir, outs[4]), *ecsv = tmp_path(dir, outs[5]),
                    *ehtml = tmp_path(dir, outs[6]), *epdf = tmp_path(dir, outs[7]);
    const char *rp[] = {"replay", mst, "--timeline", svg, "--perfetto", json, "--csv", csv,
                        "--report", html, NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(tu_run_memsim(rp, NULL, &err), 0, "%s", err);
    const char *es[] = {"estimate", "--model", "gpt2", "--seq", "128", "--timeline", png,
                        "--csv", ecsv, "--report", ehtml, NULL};
    g_autofree char *err2 = NULL;
    cr_expect_eq(tu_run_memsim(es, NULL, &err2), 0, "%s", err2);
    const char *es2[] = {"estimate", "--model", "gpt2", "--seq", "128", "--timeline", epdf, NULL};
    cr_expect_eq(tu_run_memsim(es2, NULL, NULL), 0);
    const char *files[] = {svg, json, csv, html, png, ecsv, ehtml, epdf};
    for (gsize i = 0; i < G_N_ELEMENTS(files); i++) {
        GStatBuf st;
        cr_expect(g_stat(files[i], &st) == 0 && st.st_size > 100, "%s missing", files[i]);
    }
    g_autofree char *page = NULL;
    cr_assert(g_file_get_contents(ehtml, &page, NULL, NULL));
    cr_expect(strstr(page, "<svg") && strstr(page, "id=peak-allocated") &&
                  !strstr(page, "<?xml") && !strstr(page, "<script"),
              "the report inlines its SVG and runs no script");
    /* fetches nothing: no src/href/url()/@import to a network address (the inline SVG's
     * xmlns URI is a name, not a fetch) */
    g_autoptr(GRegex) fetch = g_regex_new(
        "((src|href|xlink:href|action)\\s*=\\s*[\"']?\\s*(https?:)?//)|(url\\(\\s*[\"']?\\s*(https?:)?//)|@import",
        G_REGEX_CASELESS, 0, NULL);
    cr_assert(fetch);
    cr_expect(!g_regex_match(fetch, page, 0, NULL), "the report fetches from the network");
    cr_expect(g_regex_match_simple("(src|href)\\s*=\\s*\"https://x", "<img src=\"https://x/a.png\">",
                                   G_REGEX_CASELESS, 0) &&
                  g_regex_match(fetch, "<img src=\"https://cdn.example/a.png\">", 0, NULL) &&
                  g_regex_match(fetch, "<link href='//cdn.example/s.css'>", 0, NULL),
              "the fetch pattern finds https:// and protocol-relative fetches");
    const char *bad[] = {"replay", mst, "--timeline", "/nonexistent-dir/t.svg", NULL};
    g_autofree char *err3 = NULL;
    cr_expect_eq(tu_run_memsim(bad, NULL, &err3), 2);
    cr_expect(strstr(err3, "/nonexistent-dir/t.svg"), "%s", err3);
    const char *help[] = {"replay", "--help", NULL};
    g_autofree char *out = NULL;
    cr_expect_eq(tu_run_memsim(help, &out, NULL), 0);
    cr_expect(strstr(out, "--timeline") && strstr(out, "--perfetto") && strstr(out, "--csv"));
}
