/* The timeline plot (include/memsim/export.h): drawn once with cairo, written as SVG, PNG or
 * PDF by the surface the extension picks.
 *
 * Each rank gets a panel: memory over the simulated time (the event index when the trace's
 * ops have no durations), the live bytes stacked by category (the bucket maxima: the
 * envelope, so that no peak is shaved off), reserved bytes as a line over them, the peak as a
 * ring (its centre on the top of the stack) with its op, the OOM point as a
 * dashed vertical line, the capacity as a dashed horizontal one. The timeline's buckets are
 * first folded into at most one column per horizontal pixel, and the number of columns is
 * cut further so that ranks × series × columns stays under POINT_BUDGET: that is what keeps
 * the SVG small (well under 2 MB) whatever the trace length.
 */
#include <memsim/export.h>

#include <cairo-pdf.h>
#include <cairo-svg.h>
#include <cairo.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include <glib/gstdio.h>
#include <gmodule.h>

#include "sim/export/outfile.h"

/* ---- cairo, loaded when a plot is drawn ----
 *
 * libcairo pulls in a dozen libraries (pixman, fontconfig, freetype, png, X11, xcb, ...):
 * linked, they cost every process ~10 ms of start-up, more than a whole `memsim estimate` of
 * a small model. They are opened here, the first time a plot is drawn; the names below are
 * its functions from then on. */
#define CAIRO_FUNCS(X) \
    X(arc) \
    X(clip) \
    X(close_path) \
    X(create) \
    X(destroy) \
    X(fill) \
    X(image_surface_create) \
    X(line_to) \
    X(move_to) \
    X(new_sub_path) \
    X(paint) \
    X(pdf_surface_create_for_stream) \
    X(rectangle) \
    X(restore) \
    X(save) \
    X(select_font_face) \
    X(set_dash) \
    X(set_font_size) \
    X(set_line_join) \
    X(set_line_width) \
    X(set_source_rgb) \
    X(set_source_rgba) \
    X(show_text) \
    X(status) \
    X(status_to_string) \
    X(stroke) \
    X(surface_destroy) \
    X(surface_finish) \
    X(surface_flush) \
    X(surface_status) \
    X(surface_write_to_png_stream) \
    X(svg_surface_create_for_stream) \
    X(svg_surface_set_document_unit) \
    X(text_extents)

#define X(f) static __typeof__(cairo_##f) *p_cairo_##f;
CAIRO_FUNCS(X)
#undef X

static gboolean cairo_load(GError **error)
{
    static gsize done = 0;
    static char *failed = NULL;
    if (g_once_init_enter(&done)) {
        GModule *m = g_module_open("libcairo.so.2", G_MODULE_BIND_LAZY | G_MODULE_BIND_LOCAL);
        const char *missing = NULL;
#define X(f)                                                                                 \
    if (m && !missing && !g_module_symbol(m, "cairo_" #f, (gpointer *)&p_cairo_##f))      \
        missing = "cairo_" #f;
        CAIRO_FUNCS(X)
#undef X
        if (!m)
            failed = g_strdup_printf("cannot open libcairo.so.2 (Debian: libcairo2): %s",
                                     g_module_error());
        else if (missing)
            failed = g_strdup_printf("libcairo.so.2 has no %s", missing);
        g_once_init_leave(&done, 1);
    }
    if (failed) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "plots: %s", failed);
        return FALSE;
    }
    return TRUE;
}

#define cairo_arc (*p_cairo_arc)
#define cairo_clip (*p_cairo_clip)
#define cairo_close_path (*p_cairo_close_path)
#define cairo_create (*p_cairo_create)
#define cairo_destroy (*p_cairo_destroy)
#define cairo_fill (*p_cairo_fill)
#define cairo_image_surface_create (*p_cairo_image_surface_create)
#define cairo_line_to (*p_cairo_line_to)
#define cairo_move_to (*p_cairo_move_to)
#define cairo_new_sub_path (*p_cairo_new_sub_path)
#define cairo_paint (*p_cairo_paint)
#define cairo_pdf_surface_create_for_stream (*p_cairo_pdf_surface_create_for_stream)
#define cairo_rectangle (*p_cairo_rectangle)
#define cairo_restore (*p_cairo_restore)
#define cairo_save (*p_cairo_save)
#define cairo_select_font_face (*p_cairo_select_font_face)
#define cairo_set_dash (*p_cairo_set_dash)
#define cairo_set_font_size (*p_cairo_set_font_size)
#define cairo_set_line_join (*p_cairo_set_line_join)
#define cairo_set_line_width (*p_cairo_set_line_width)
#define cairo_set_source_rgb (*p_cairo_set_source_rgb)
#define cairo_set_source_rgba (*p_cairo_set_source_rgba)
#define cairo_show_text (*p_cairo_show_text)
#define cairo_status (*p_cairo_status)
#define cairo_status_to_string (*p_cairo_status_to_string)
#define cairo_stroke (*p_cairo_stroke)
#define cairo_surface_destroy (*p_cairo_surface_destroy)
#define cairo_surface_finish (*p_cairo_surface_finish)
#define cairo_surface_flush (*p_cairo_surface_flush)
#define cairo_surface_status (*p_cairo_surface_status)
#define cairo_surface_write_to_png_stream (*p_cairo_surface_write_to_png_stream)
#define cairo_svg_surface_create_for_stream (*p_cairo_svg_surface_create_for_stream)
#define cairo_svg_surface_set_document_unit (*p_cairo_svg_surface_set_document_unit)
#define cairo_text_extents (*p_cairo_text_extents)

#define PLOT_W 1200.0
#define MARGIN_L 84.0
#define MARGIN_R 30.0
#define TITLE_H 62.0
#define LEGEND_H 34.0
#define PANEL_TITLE_H 26.0
#define PANEL_PLOT_H 230.0
#define PANEL_AXIS_H 44.0
#define PANEL_H (PANEL_TITLE_H + PANEL_PLOT_H + PANEL_AXIS_H)
#define MAX_PANELS 16
#define POINT_BUDGET 40000

static const guint32 category_rgb[MEMSIM_CAT_COUNT] = {
    [MEMSIM_CAT_OTHER] = 0x9e9e9e,
    [MEMSIM_CAT_PARAMETER] = 0x1f77b4,
    [MEMSIM_CAT_GRADIENT] = 0xff7f0e,
    [MEMSIM_CAT_OPTIMIZER_STATE] = 0x2ca02c,
    [MEMSIM_CAT_ACTIVATION] = 0x9467bd,
    [MEMSIM_CAT_TEMPORARY] = 0x17becf,
    [MEMSIM_CAT_COMM_BUFFER] = 0x8c564b,
    [MEMSIM_CAT_INPUT] = 0xbcbd22,
    [MEMSIM_CAT_KV_CACHE] = 0xe377c2,
};

/* Bottom first: what lives through the whole run lies at the bottom. */
static const MemsimCategory stack_order[MEMSIM_CAT_COUNT] = {
    MEMSIM_CAT_PARAMETER,  MEMSIM_CAT_OPTIMIZER_STATE, MEMSIM_CAT_GRADIENT,
    MEMSIM_CAT_INPUT,      MEMSIM_CAT_KV_CACHE,        MEMSIM_CAT_ACTIVATION,
    MEMSIM_CAT_COMM_BUFFER, MEMSIM_CAT_TEMPORARY,      MEMSIM_CAT_OTHER,
};

#define OOM_RGB 0xb00000
#define CAPACITY_RGB 0x555555
#define RESERVED_RGB 0x111111

guint32 memsim_export_category_rgb(MemsimCategory cat)
{
    return cat < MEMSIM_CAT_COUNT ? category_rgb[cat] : 0x000000;
}

static void set_rgb(cairo_t *cr, guint32 rgb)
{
    cairo_set_source_rgb(cr, ((rgb >> 16) & 255) / 255.0, ((rgb >> 8) & 255) / 255.0,
                         (rgb & 255) / 255.0);
}

/* ---- scales and labels ---- */

typedef struct {
    double div;       /* bytes per unit */
    const char *name; /* "GiB" ... */
} Unit;

static Unit unit_for(double bytes)
{
    if (bytes >= 2.0 * (1 << 30))
        return (Unit){1073741824.0, "GiB"};
    if (bytes >= 2.0 * (1 << 20))
        return (Unit){1048576.0, "MiB"};
    if (bytes >= 2.0 * 1024)
        return (Unit){1024.0, "KiB"};
    return (Unit){1.0, "B"};
}

/* A round step giving about `n` ticks over [0, span]. */
static double nice_step(double span, int n)
{
    if (span <= 0)
        return 1;
    double raw = span / n, mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    double m = f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10;
    return m * mag;
}

static void fmt_num(char *buf, gsize len, double v)
{
    if (fabs(v - round(v)) < 1e-9)
        g_snprintf(buf, len, "%.0f", v);
    else
        g_snprintf(buf, len, "%.3g", v);
}

static void fmt_count(char *buf, gsize len, double v)
{
    char n[32];
    if (v >= 1e6) {
        fmt_num(n, sizeof n, v / 1e6);
        g_snprintf(buf, len, "%sM", n);
    } else if (v >= 1e3) {
        fmt_num(n, sizeof n, v / 1e3);
        g_snprintf(buf, len, "%sk", n);
    } else {
        fmt_num(buf, len, v);
    }
}

static void fmt_bytes(char *buf, gsize len, double bytes)
{
    memsim_format_bytes(bytes < 0 ? 0 : (memsim_size_t)bytes, buf, len);
}

/* ---- text ---- */

static void font(cairo_t *cr, double size, gboolean bold)
{
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
}

static double text_width(cairo_t *cr, const char *s)
{
    cairo_text_extents_t e;
    cairo_text_extents(cr, s, &e);
    return e.x_advance;
}

/* align: 0 left, 0.5 centre, 1 right; y is the baseline. */
static void text_at(cairo_t *cr, double x, double y, double align, const char *s)
{
    cairo_move_to(cr, x - align * text_width(cr, s), y);
    cairo_show_text(cr, s);
}

/* Shortens to at most `max` characters (UTF-8 aware) with an ellipsis. */
static char *shorten(const char *s, glong max)
{
    if (!g_utf8_validate(s, -1, NULL))
        return g_utf8_make_valid(s, -1);
    if (g_utf8_strlen(s, -1) <= max)
        return g_strdup(s);
    char *head = g_utf8_substring(s, 0, max - 1);
    char *r = g_strconcat(head, "…", NULL);
    g_free(head);
    return r;
}

/* Shows `s` at (x, y) within `width`: a smaller font first (down to `min_size`), then cut
 * with an ellipsis. */
static void fit_text(cairo_t *cr, double x, double y, double width, const char *s, double size,
                     double min_size, gboolean bold)
{
    for (; size > min_size; size -= 1) {
        font(cr, size, bold);
        if (text_width(cr, s) <= width)
            break;
    }
    font(cr, size, bold);
    if (text_width(cr, s) <= width) {
        text_at(cr, x, y, 0, s);
        return;
    }
    glong n = g_utf8_strlen(s, -1);
    char *t = NULL;
    while (n > 1) {
        g_free(t);
        char *head = g_utf8_substring(s, 0, --n);
        t = g_strconcat(head, "…", NULL);
        g_free(head);
        if (text_width(cr, t) <= width)
            break;
    }
    text_at(cr, x, y, 0, t ? t : s);
    g_free(t);
}

/* ---- one rank's columns ---- */

typedef struct {
    gboolean any;
    int64_t allocated, reserved;
    int64_t cat[MEMSIM_CAT_COUNT];
} Col;

/* Where a bucket's max is drawn: the moment of that max, on the same clock as the peak
 * marker, so that the column holding the peak is the one under the marker. */
static double sample_x(const MemsimTimelineRank *r, const MemsimTimelineSample *s)
{
    return r->has_time ? s->time_at_max_us : (double)s->event_at_max;
}

static double point_x(const MemsimTimelineRank *r, const MemsimTimelinePoint *p)
{
    return r->has_time ? p->time_us : (double)p->event;
}

static double x_max(const MemsimTimelineRank *r)
{
    double m = 1;
    if (r->has_time) {
        /* the simulated time, to the end of the run (the last op's work done) */
        m = MAX(m, r->end_us);
        for (gsize i = 0; i < r->n_samples; i++)
            m = MAX(m, r->samples[i].time_last_us);
        if (r->oom)
            m = MAX(m, r->oom_point.time_us);
    } else {
        m = MAX(m, (double)(r->n_events ? r->n_events - 1 : 0));
        if (r->n_samples)
            m = MAX(m, (double)r->samples[r->n_samples - 1].event_last);
    }
    return m;
}

typedef struct {
    const MemsimTimeline *tl;
    const char *title;
    guint n_panels;
    guint n_ranks;
    gboolean cats_present[MEMSIM_CAT_COUNT];
    gboolean any_oom, any_capacity;
    guint n_cols;
    double width, height;
} Layout;

static void layout(Layout *L, const MemsimTimeline *tl, const char *title)
{
    memset(L, 0, sizeof *L);
    L->tl = tl;
    L->title = title;
    L->n_ranks = tl ? memsim_timeline_n_ranks(tl) : 0;
    L->n_panels = MIN(L->n_ranks, MAX_PANELS);
    for (guint i = 0; i < L->n_panels; i++) {
        const MemsimTimelineRank *r = memsim_timeline_rank(tl, i);
        for (gsize k = 0; k < r->n_samples; k++)
            for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
                if (r->samples[k].by_category[c] > 0)
                    L->cats_present[c] = TRUE;
        if (r->oom)
            L->any_oom = TRUE;
    }
    L->any_capacity = tl && memsim_timeline_capacity(tl) > 0;
    int n_series = 2;
    for (int c = 0; c < MEMSIM_CAT_COUNT; c++)
        n_series += L->cats_present[c];
    double plot_w = PLOT_W - MARGIN_L - MARGIN_R;
    guint budget = POINT_BUDGET / (MAX(L->n_panels, 1) * (guint)n_series * 2);
    L->n_cols = (guint)MIN(plot_w, (double)MAX(budget, 16u));
    L->width = PLOT_W;
    L->height = TITLE_H + LEGEND_H + MAX(L->n_panels, 1) * PANEL_H +
                (L->n_ranks > L->n_panels ? 24.0 : 0.0) + 8.0;
}

/* The peak marker: a ring, open in the middle so that the top of the stack shows right up to
 * the point it marks (a filled dot would hide the last pixels of a one-column spike). */
#define PEAK_RING_R 5.5
#define PEAK_RING_W 3.0
static void peak_ring(cairo_t *cr, double x, double y)
{
    cairo_new_sub_path(cr);
    cairo_arc(cr, x, y, PEAK_RING_R, 0, 2 * G_PI);
    set_rgb(cr, MEMSIM_EXPORT_PEAK_RGB);
    cairo_set_line_width(cr, PEAK_RING_W);
    cairo_stroke(cr);
}

static void legend(cairo_t *cr, const Layout *L, double y)
{
    double x = MARGIN_L;
    font(cr, 12, FALSE);
    for (int k = 0; k < MEMSIM_CAT_COUNT; k++) {
        MemsimCategory c = stack_order[k];
        if (!L->cats_present[c])
            continue;
        set_rgb(cr, category_rgb[c]);
        cairo_rectangle(cr, x, y - 10, 14, 12);
        cairo_fill(cr);
        set_rgb(cr, 0x222222);
        const char *name = memsim_category_name(c);
        text_at(cr, x + 19, y, 0, name);
        x += 19 + text_width(cr, name) + 16;
    }
    /* reserved line */
    set_rgb(cr, RESERVED_RGB);
    cairo_set_line_width(cr, 1.6);
    cairo_move_to(cr, x, y - 4);
    cairo_line_to(cr, x + 22, y - 4);
    cairo_stroke(cr);
    set_rgb(cr, 0x222222);
    text_at(cr, x + 27, y, 0, "reserved");
    x += 27 + text_width(cr, "reserved") + 16;
    /* peak marker */
    peak_ring(cr, x + 6, y - 4);
    set_rgb(cr, 0x222222);
    text_at(cr, x + 16, y, 0, "peak allocated");
    x += 16 + text_width(cr, "peak allocated") + 16;
    if (L->any_capacity) {
        static const double dash[] = {6, 4};
        set_rgb(cr, CAPACITY_RGB);
        cairo_set_dash(cr, dash, 2, 0);
        cairo_move_to(cr, x, y - 4);
        cairo_line_to(cr, x + 22, y - 4);
        cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        set_rgb(cr, 0x222222);
        text_at(cr, x + 27, y, 0, "capacity");
        x += 27 + text_width(cr, "capacity") + 16;
    }
    if (L->any_oom) {
        static const double dash[] = {4, 3};
        set_rgb(cr, OOM_RGB);
        cairo_set_dash(cr, dash, 2, 0);
        cairo_move_to(cr, x + 6, y - 12);
        cairo_line_to(cr, x + 6, y + 2);
        cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        set_rgb(cr, 0x222222);
        text_at(cr, x + 14, y, 0, "out of memory");
    }
}

/* A label on a translucent white box, so that it reads over the areas. */
static void boxed_text(cairo_t *cr, double x, double y, double align, const char *s)
{
    double w = text_width(cr, s);
    double x0 = x - align * w;
    cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
    cairo_rectangle(cr, x0 - 3, y - 12, w + 6, 16);
    cairo_fill(cr);
    set_rgb(cr, 0x111111);
    cairo_move_to(cr, x0, y);
    cairo_show_text(cr, s);
}

static void panel(cairo_t *cr, const Layout *L, guint rank, double top)
{
    const MemsimTimeline *tl = L->tl;
    const MemsimTimelineRank *r = memsim_timeline_rank(tl, rank);
    double px0 = MARGIN_L, px1 = PLOT_W - MARGIN_R;
    double py0 = top + PANEL_TITLE_H, py1 = py0 + PANEL_PLOT_H; /* py1: the baseline */
    char a[64], b[64];

    /* Title of the panel. */
    GString *t = g_string_new(NULL);
    g_string_append_printf(t, "rank %u", r->device);
    if (r->multiplicity > 1)
        g_string_append_printf(t, " (×%u)", r->multiplicity);
    if (r->role)
        g_string_append_printf(t, " — %s", r->role);
    if (r->has_peak) {
        fmt_bytes(a, sizeof a, (double)r->peak_allocated.allocated);
        fmt_bytes(b, sizeof b, (double)r->peak_reserved.reserved);
        g_string_append_printf(t, ":  peak allocated %s,  peak reserved %s", a, b);
    }
    set_rgb(cr, 0x111111);
    fit_text(cr, px0, top + 17, px1 - px0, t->str, 13, 11, TRUE);
    g_string_free(t, TRUE);

    double xmax = x_max(r);
    double ymax_data = 0;
    for (gsize i = 0; i < r->n_samples; i++)
        ymax_data = MAX(ymax_data, (double)MAX(r->samples[i].reserved_max,
                                               r->samples[i].allocated_max));
    if (r->oom)
        ymax_data = MAX(ymax_data, (double)r->oom_point.reserved);
    memsim_size_t capacity = memsim_timeline_capacity(tl);
    /* The capacity joins the scale only when it is near the data: far above, it would
     * flatten the curves, and a label says where it is. */
    gboolean cap_in = capacity > 0 && (double)capacity <= 2.0 * MAX(ymax_data, 1.0);
    double ymax = MAX(ymax_data, cap_in ? (double)capacity : 0.0);
    if (ymax <= 0)
        ymax = 1 << 20;
    Unit u = unit_for(ymax);
    double ystep = nice_step(ymax * 1.06 / u.div, 5) * u.div;
    ymax = ceil(ymax * 1.06 / ystep) * ystep;
#define X(v) (px0 + (px1 - px0) * ((v) / xmax))
#define Y(v) (py1 - (py1 - py0) * ((double)(v) / ymax))

    /* Frame and grid. */
    cairo_set_source_rgb(cr, 0.985, 0.985, 0.985);
    cairo_rectangle(cr, px0, py0, px1 - px0, py1 - py0);
    cairo_fill(cr);
    cairo_set_line_width(cr, 1);
    font(cr, 11, FALSE);
    for (double v = 0; v <= ymax * (1 + 1e-9); v += ystep) {
        double y = round(Y(v)) + 0.5;
        cairo_set_source_rgb(cr, 0.86, 0.86, 0.86);
        cairo_move_to(cr, px0, y);
        cairo_line_to(cr, px1, y);
        cairo_stroke(cr);
        char n[32];
        fmt_num(n, sizeof n, v / u.div);
        g_snprintf(a, sizeof a, "%s %s", n, u.name);
        set_rgb(cr, 0x333333);
        text_at(cr, px0 - 6, y + 4, 1, a);
    }
    /* x: the simulated time in ms (s for long runs) when the trace's ops have durations;
     * else the only clock there is, the event index */
    double xdiv = xmax >= 1e7 ? 1e6 : 1e3;
    double xstep = r->has_time ? nice_step(xmax / xdiv, 8) * xdiv : nice_step(xmax, 8);
    for (double v = 0; v <= xmax * (1 + 1e-9); v += xstep) {
        double x = round(X(v)) + 0.5;
        cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
        cairo_move_to(cr, x, py1);
        cairo_line_to(cr, x, py1 + 4);
        cairo_stroke(cr);
        if (r->has_time) {
            char n[32];
            fmt_num(n, sizeof n, v / xdiv);
            g_snprintf(a, sizeof a, "%s", n);
        } else {
            fmt_count(a, sizeof a, v);
        }
        set_rgb(cr, 0x333333);
        text_at(cr, x, py1 + 16, 0.5, a);
    }
    set_rgb(cr, 0x333333);
    text_at(cr, (px0 + px1) / 2, py1 + 34, 0.5,
            !r->has_time     ? "event index (the trace's ops have no durations)"
            : xdiv == 1e6    ? "simulated time (s)"
                             : "simulated time (ms)");

    /* Columns. */
    guint n = L->n_cols;
    Col *cols = g_new0(Col, n);
    gboolean present[MEMSIM_CAT_COUNT] = {FALSE};
    for (gsize i = 0; i < r->n_samples; i++) {
        const MemsimTimelineSample *s = &r->samples[i];
        double x = sample_x(r, s);
        guint c = (guint)CLAMP(x / xmax * n, 0.0, (double)(n - 1));
        Col *col = &cols[c];
        if (!col->any || s->allocated_max > col->allocated) {
            col->allocated = s->allocated_max;
            memcpy(col->cat, s->by_category, sizeof col->cat);
        }
        col->reserved = col->any ? MAX(col->reserved, s->reserved_max) : s->reserved_max;
        col->any = TRUE;
        for (int k = 0; k < MEMSIM_CAT_COUNT; k++)
            if (s->by_category[k] > 0)
                present[k] = TRUE;
    }

    /* Stacked areas: each cumulative band from the baseline, top category first, so that
     * the lower ones paint over; one path per category. Steps hold a value until the next
     * column that has one. */
    cairo_save(cr);
    cairo_rectangle(cr, px0, py0 - 1, px1 - px0, py1 - py0 + 1);
    cairo_clip(cr);
    int top_k = -1;
    for (int k = 0; k < MEMSIM_CAT_COUNT; k++)
        if (present[stack_order[k]])
            top_k = k;
    for (int k = top_k; k >= 0; k--) {
        MemsimCategory cat = stack_order[k];
        if (!present[cat])
            continue;
        gboolean started = FALSE;
        double last_y = py1;
        for (guint c = 0; c < n; c++) {
            if (!cols[c].any)
                continue;
            int64_t cum = 0;
            for (int j = 0; j <= k; j++)
                cum += cols[c].cat[stack_order[j]];
            double x = px0 + (px1 - px0) * (double)c / n, y = Y(cum);
            if (!started) {
                cairo_move_to(cr, x, py1);
                started = TRUE;
            } else {
                cairo_line_to(cr, x, last_y);
            }
            cairo_line_to(cr, x, y);
            last_y = y;
        }
        if (!started)
            continue;
        cairo_line_to(cr, px1, last_y);
        cairo_line_to(cr, px1, py1);
        cairo_close_path(cr);
        set_rgb(cr, category_rgb[cat]);
        cairo_fill(cr);
    }

    /* Reserved: a line over the areas. */
    {
        gboolean started = FALSE;
        double last_y = py1;
        for (guint c = 0; c < n; c++) {
            if (!cols[c].any)
                continue;
            double x = px0 + (px1 - px0) * (double)c / n, y = Y(cols[c].reserved);
            if (!started) {
                cairo_move_to(cr, x, y);
                started = TRUE;
            } else {
                cairo_line_to(cr, x, last_y);
                cairo_line_to(cr, x, y);
            }
            last_y = y;
        }
        if (started) {
            cairo_line_to(cr, px1, last_y);
            set_rgb(cr, RESERVED_RGB);
            cairo_set_line_width(cr, 1.5);
            cairo_set_line_join(cr, CAIRO_LINE_JOIN_BEVEL);
            cairo_stroke(cr);
        }
    }
    cairo_restore(cr);
    g_free(cols);

    /* Capacity. */
    font(cr, 11, FALSE);
    if (capacity > 0) {
        fmt_bytes(b, sizeof b, (double)capacity);
        if (cap_in) {
            static const double dash[] = {6, 4};
            double y = round(Y(capacity)) + 0.5;
            set_rgb(cr, CAPACITY_RGB);
            cairo_set_line_width(cr, 1.2);
            cairo_set_dash(cr, dash, 2, 0);
            cairo_move_to(cr, px0, y);
            cairo_line_to(cr, px1, y);
            cairo_stroke(cr);
            cairo_set_dash(cr, NULL, 0, 0);
            g_snprintf(a, sizeof a, "capacity %s", b);
            boxed_text(cr, px0 + 6, y - 4, 0, a);
        } else {
            g_snprintf(a, sizeof a, "capacity %s (above the plot)", b);
            boxed_text(cr, px1 - 4, py0 + 14, 1, a);
        }
    }

    /* OOM. */
    if (r->oom) {
        static const double dash[] = {4, 3};
        double x = round(X(point_x(r, &r->oom_point))) + 0.5;
        set_rgb(cr, OOM_RGB);
        cairo_set_line_width(cr, 1.6);
        cairo_set_dash(cr, dash, 2, 0);
        cairo_move_to(cr, x, py0);
        cairo_line_to(cr, x, py1);
        cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        fmt_bytes(b, sizeof b, (double)r->oom_point.requested);
        g_autofree char *op = shorten(memsim_timeline_op_name(tl, r->oom_point.op), 40);
        g_snprintf(a, sizeof a, "OUT OF MEMORY: %s requested%s%s", b, *op ? " in " : "", op);
        font(cr, 11, TRUE);
        gboolean left = x > (px0 + px1) / 2;
        double w = text_width(cr, a);
        double x0 = left ? x - 6 - w : x + 6;
        cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
        cairo_rectangle(cr, x0 - 3, py0 + 30 - 12, w + 6, 16);
        cairo_fill(cr);
        set_rgb(cr, OOM_RGB);
        cairo_move_to(cr, x0, py0 + 30);
        cairo_show_text(cr, a);
    }

    /* The peak: a marker, its size and op beside it. */
    if (r->has_peak) {
        double x = X(point_x(r, &r->peak_allocated)), y = Y(r->peak_allocated.allocated);
        g_autofree char *op = shorten(memsim_timeline_op_name(tl, r->peak_allocated.op), 48);
        fmt_bytes(b, sizeof b, (double)r->peak_allocated.allocated);
        if (*op)
            g_snprintf(a, sizeof a, "peak %s at %s", b, op);
        else
            g_snprintf(a, sizeof a, "peak %s (event %" G_GUINT64_FORMAT ")", b,
                       r->peak_allocated.event);
        font(cr, 12, TRUE);
        gboolean left = x > px0 + (px1 - px0) * 0.6;
        double ly = MAX(y - 10, py0 + 14);
        boxed_text(cr, left ? x - 12 : x + 12, ly, left ? 1 : 0, a);
        peak_ring(cr, x, y);
    } else {
        font(cr, 12, FALSE);
        set_rgb(cr, 0x666666);
        text_at(cr, (px0 + px1) / 2, (py0 + py1) / 2, 0.5, "no allocations");
    }

    /* Axes. */
    set_rgb(cr, 0x444444);
    cairo_set_line_width(cr, 1);
    cairo_move_to(cr, px0 + 0.5, py0);
    cairo_line_to(cr, px0 + 0.5, py1 + 0.5);
    cairo_line_to(cr, px1, py1 + 0.5);
    cairo_stroke(cr);
#undef X
#undef Y
}

static void draw(cairo_t *cr, const Layout *L)
{
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    const MemsimTimeline *tl = L->tl;
    const char *src = tl ? memsim_timeline_source(tl) : "";
    g_autofree char *title = shorten(L->title ? L->title : (*src ? src : "memsim"), 400);
    set_rgb(cr, 0x111111);
    fit_text(cr, MARGIN_L, 28, PLOT_W - MARGIN_L - MARGIN_R, title, 18, 13, TRUE);
    font(cr, 12, FALSE);
    set_rgb(cr, 0x555555);
    GString *sub = g_string_new("memory over the run");
    if (tl && *memsim_timeline_allocator(tl))
        g_string_append_printf(sub, " · allocator %s", memsim_timeline_allocator(tl));
    if (tl && memsim_timeline_capacity(tl)) {
        char b[64];
        fmt_bytes(b, sizeof b, (double)memsim_timeline_capacity(tl));
        g_string_append_printf(sub, " · capacity %s", b);
    }
    g_string_append(sub, " · live bytes by category, stacked (maximum per pixel)");
    fit_text(cr, MARGIN_L, 48, PLOT_W - MARGIN_L - MARGIN_R, sub->str, 12, 12, FALSE);
    g_string_free(sub, TRUE);
    legend(cr, L, TITLE_H + 18);
    double top = TITLE_H + LEGEND_H;
    if (L->n_panels == 0) {
        font(cr, 13, FALSE);
        set_rgb(cr, 0x666666);
        text_at(cr, PLOT_W / 2, top + PANEL_H / 2, 0.5, "no ranks");
    }
    for (guint i = 0; i < L->n_panels; i++)
        panel(cr, L, i, top + i * PANEL_H);
    if (L->n_ranks > L->n_panels) {
        char a[96];
        g_snprintf(a, sizeof a, "… and %u more ranks (see the CSV or Perfetto export)",
                   L->n_ranks - L->n_panels);
        font(cr, 12, FALSE);
        set_rgb(cr, 0x555555);
        text_at(cr, MARGIN_L, top + L->n_panels * PANEL_H + 16, 0, a);
    }
}

/* ---- surfaces ---- */

typedef enum { OUT_SVG, OUT_PNG, OUT_PDF } OutKind;

static cairo_status_t write_file(void *closure, const unsigned char *data, unsigned int len)
{
    MemsimOutFile *o = closure;
    memsim_out_write(o, data, len);
    return o->err ? CAIRO_STATUS_WRITE_ERROR : CAIRO_STATUS_SUCCESS;
}

static cairo_status_t write_string(void *closure, const unsigned char *data, unsigned int len)
{
    g_string_append_len(closure, (const char *)data, len);
    return CAIRO_STATUS_SUCCESS;
}

static gboolean finish(cairo_surface_t *s, cairo_t *cr, const char *what, GError **error)
{
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    cairo_surface_finish(s);
    if (st == CAIRO_STATUS_SUCCESS)
        st = cairo_surface_status(s);
    cairo_surface_destroy(s);
    if (st != CAIRO_STATUS_SUCCESS) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: cannot draw the plot: %s", what,
                    cairo_status_to_string(st));
        return FALSE;
    }
    return TRUE;
}

static cairo_surface_t *svg_surface(cairo_write_func_t fn, void *closure, const Layout *L)
{
    cairo_surface_t *s = cairo_svg_surface_create_for_stream(fn, closure, L->width, L->height);
    cairo_svg_surface_set_document_unit(s, CAIRO_SVG_UNIT_PX);
    return s;
}

char *memsim_export_timeline_svg(const MemsimTimeline *tl, const char *title, GError **error)
{
    if (!cairo_load(error))
        return NULL;
    Layout L;
    layout(&L, tl, title);
    GString *out = g_string_new(NULL);
    cairo_surface_t *s = svg_surface(write_string, out, &L);
    cairo_t *cr = cairo_create(s);
    draw(cr, &L);
    if (!finish(s, cr, "SVG", error)) {
        g_string_free(out, TRUE);
        return NULL;
    }
    return g_string_free(out, FALSE);
}

gboolean memsim_export_timeline_plot(const MemsimTimeline *tl, const char *title,
                                     const char *path, GError **error)
{
    OutKind kind;
    if (g_str_has_suffix(path, ".svg") || g_str_has_suffix(path, ".SVG"))
        kind = OUT_SVG;
    else if (g_str_has_suffix(path, ".png") || g_str_has_suffix(path, ".PNG"))
        kind = OUT_PNG;
    else if (g_str_has_suffix(path, ".pdf") || g_str_has_suffix(path, ".PDF"))
        kind = OUT_PDF;
    else {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: unknown plot format (the name must end in .svg, .png or .pdf)", path);
        return FALSE;
    }
    if (!cairo_load(error))
        return FALSE;
    Layout L;
    layout(&L, tl, title);
    MemsimOutFile o;
    if (!memsim_out_open(&o, path, error))
        return FALSE;
    cairo_surface_t *s;
    if (kind == OUT_SVG)
        s = svg_surface(write_file, &o, &L);
    else if (kind == OUT_PDF)
        s = cairo_pdf_surface_create_for_stream(write_file, &o, L.width, L.height);
    else
        s = cairo_image_surface_create(CAIRO_FORMAT_RGB24, (int)L.width, (int)L.height);
    cairo_t *cr = cairo_create(s);
    draw(cr, &L);
    if (kind == OUT_PNG) {
        cairo_surface_flush(s);
        cairo_status_t st = cairo_surface_write_to_png_stream(s, write_file, &o);
        if (st != CAIRO_STATUS_SUCCESS && !o.err) {
            cairo_destroy(cr);
            cairo_surface_destroy(s);
            memsim_out_abort(&o);
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: cannot write the PNG: %s",
                        path, cairo_status_to_string(st));
            return FALSE;
        }
    }
    GError *e = NULL;
    if (!finish(s, cr, path, &e)) {
        if (o.err) {
            g_error_free(e);
            return memsim_out_close(&o, error); /* names the write error */
        }
        memsim_out_abort(&o);
        g_propagate_error(error, e);
        return FALSE;
    }
    return memsim_out_close(&o, error);
}
