/* The HTML report (include/memsim/export.h): one self-contained page — inline CSS, the
 * timeline SVG inlined, no script, nothing fetched from the network. */
#include <memsim/export.h>

#include <inttypes.h>
#include <string.h>

#include "sim/export/outfile.h"

static const char css[] =
    "body{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif;margin:24px 32px;color:#1b1b1b;"
    "max-width:1240px}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:26px 0 8px}"
    "h3{font-size:14px;margin:16px 0 6px}"
    ".sub{color:#555;margin:0 0 14px}"
    "table{border-collapse:collapse;margin:6px 0 10px;font-size:13px}"
    "th,td{border:1px solid #d5d5d5;padding:4px 9px;text-align:right}"
    "th{background:#f2f2f2}td.l,th.l{text-align:left}"
    "dl{display:grid;grid-template-columns:max-content auto;gap:3px 14px;font-size:13px}"
    "dt{color:#555}dd{margin:0}"
    ".sw{display:inline-block;width:11px;height:11px;margin-right:6px;vertical-align:-1px}"
    ".bar{height:10px;display:inline-block;vertical-align:middle}"
    ".fit{color:#11722b;font-weight:bold}.nofit{color:#b00000;font-weight:bold}"
    ".plot svg{max-width:100%;height:auto;border:1px solid #e3e3e3}"
    "footer{margin-top:30px;color:#777;font-size:12px}";

static void esc(GString *s, const char *text)
{
    g_autofree char *e = g_markup_escape_text(text ? text : "", -1);
    g_string_append(s, e);
}

static const char *fb(memsim_size_t v, char *buf)
{
    return memsim_format_bytes(v, buf, 32);
}

static void row_dl(GString *s, const char *k, const char *v)
{
    g_string_append(s, "<dt>");
    esc(s, k);
    g_string_append(s, "</dt><dd>");
    esc(s, v);
    g_string_append(s, "</dd>\n");
}

static void rank_label(GString *s, const MemsimRankReport *r)
{
    g_string_append_printf(s, "%u", r->rank);
    if (r->multiplicity > 1)
        g_string_append_printf(s, " ×%u", r->multiplicity);
    if (r->role) {
        g_string_append(s, " (");
        esc(s, r->role);
        g_string_append(s, ")");
    }
}

static void breakdown(GString *s, const MemsimRankReport *r)
{
    char a[32], b[32];
    const MemsimAllocStats *st = &r->stats;
    g_string_append(s, "<h3>Rank ");
    rank_label(s, r);
    g_string_append_printf(s, ": live at the peak, %s allocated", fb((memsim_size_t)st->allocated.peak, a));
    if (r->peak_op_name[0]) {
        g_string_append(s, " — op <code>");
        esc(s, r->peak_op_name);
        g_string_append_printf(s, "</code> (%s", memsim_phase_name(r->peak_op_phase));
        if (r->peak_op_layer >= 0)
            g_string_append_printf(s, ", layer %d", r->peak_op_layer);
        g_string_append(s, ")");
    }
    g_string_append_printf(s, ", event %" PRIu64 "</h3>\n", r->peak_allocated_event);
    g_string_append(s, "<table><tr><th class=l>category</th><th>bytes (blocks)</th>"
                       "<th>requested</th><th>share</th><th class=l></th></tr>\n");
    double total = st->allocated.peak > 0 ? (double)st->allocated.peak : 1.0;
    for (int c = 0; c < MEMSIM_CAT_COUNT; c++) {
        if (!r->peak_by_category[c])
            continue;
        guint32 rgb = memsim_export_category_rgb(c);
        double pct = 100.0 * (double)r->peak_by_category[c] / total;
        g_string_append_printf(
            s, "<tr><td class=l><span class=sw style=\"background:#%06x\"></span>%s</td>"
               "<td>%s</td><td>%s</td><td>%.1f%%</td><td class=l><span class=bar "
               "style=\"background:#%06x;width:%.0fpx\"></span></td></tr>\n",
            rgb, memsim_category_name(c), fb(r->peak_by_category[c], a),
            fb(r->peak_by_category_requested[c], b), pct, rgb, pct * 2.4);
    }
    g_string_append(s, "</table>\n");
}

static char *render(const MemsimReport *rep, const MemsimTimeline *tl, const char *title,
                    const char *extra, GError **error)
{
    char a[32], b[32], c[32], d[32], e[32];
    g_autofree char *svg = NULL;
    if (tl && !(svg = memsim_export_timeline_svg(tl, title, error)))
        return NULL;
    const char *name = title ? title : rep->run ? "memsim estimate" : rep->source;
    GString *s = g_string_new("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>\n"
                              "<meta name=viewport content=\"width=device-width\">\n<title>");
    esc(s, name ? name : "memsim report");
    g_string_append_printf(s, "</title>\n<style>%s</style></head>\n<body>\n<h1>", css);
    esc(s, name ? name : "memsim report");
    g_string_append(s, "</h1>\n<p class=sub>GPU memory simulated by memsim");
    if (rep->allocator) {
        g_string_append(s, " through the <code>");
        esc(s, rep->allocator);
        g_string_append(s, "</code> allocator model");
    }
    g_string_append(s, "</p>\n");

    /* The run. */
    g_string_append(s, "<h2>Run</h2>\n<dl>\n");
    if (rep->run)
        row_dl(s, "run", rep->run);
    if (rep->source)
        row_dl(s, rep->run ? "model" : "trace", rep->source);
    if (rep->alloc_conf && *rep->alloc_conf)
        row_dl(s, "PYTORCH_CUDA_ALLOC_CONF", rep->alloc_conf);
    if (rep->gpu_mem)
        row_dl(s, "GPU memory", fb(rep->gpu_mem, a));
    if (rep->context_bytes)
        row_dl(s, "CUDA context and libraries", fb(rep->context_bytes, a));
    if (rep->capacity || rep->n_ranks == 0 || !rep->ranks[0].capacity)
        row_dl(s, "allocator capacity", rep->capacity ? fb(rep->capacity, a) : "unlimited");
    else {
        g_autofree char *cap = g_strdup_printf("%s, as recorded at its OOM",
                                               fb(rep->ranks[0].capacity, a));
        row_dl(s, "allocator capacity", cap);
    }
    g_string_append(s, "</dl>\n");

    /* Peaks. */
    g_string_append(s, "<h2>Peaks per rank</h2>\n<table id=peaks><tr><th class=l>rank</th>"
                       "<th>peak allocated</th><th>peak reserved</th><th>peak active</th>"
                       "<th>peak requested</th><th>device total</th><th>events</th>"
                       "<th class=l>verdict</th></tr>\n");
    for (guint i = 0; i < rep->n_ranks; i++) {
        const MemsimRankReport *r = &rep->ranks[i];
        const MemsimAllocStats *st = &r->stats;
        g_string_append(s, "<tr><td class=l>");
        rank_label(s, r);
        g_string_append_printf(
            s, "</td><td class=peak-allocated%s>%s</td><td class=peak-reserved>%s</td>"
               "<td>%s</td><td>%s</td><td>%s</td><td>%" PRIu64 "</td>",
            i == 0 ? " id=peak-allocated" : "", fb((memsim_size_t)st->allocated.peak, a),
            fb((memsim_size_t)st->reserved.peak, b), fb((memsim_size_t)st->active.peak, c),
            fb((memsim_size_t)st->requested.peak, d), fb(r->device_total, e), r->n_events);
        if (r->oom.happened)
            g_string_append_printf(s, "<td class='l nofit'>OUT OF MEMORY at event %" PRIu64
                                      " (%s requested)</td></tr>\n",
                                   r->oom.event_index, fb(r->oom.requested, a));
        else if (r->oom_verdict.replayed)
            g_string_append_printf(s, "<td class='l %s'>the recorded OOM at event %" PRIu64
                                      " (%s requested) %s on %s: %s %s</td></tr>\n",
                                   r->oom_verdict.fits ? "fit" : "nofit",
                                   r->oom_verdict.event_index, fb(r->oom_verdict.rounded, a),
                                   r->oom_verdict.fits ? "fits" : "does not fit",
                                   fb(r->oom_verdict.capacity, b),
                                   r->oom_verdict.fits ? "margin" : "short by",
                                   fb(r->oom_verdict.margin, c));
        else if (rep->gpu_mem)
            g_string_append_printf(s, "<td class='l %s'>%s in %s</td></tr>\n",
                                   r->fits ? "fit" : "nofit", r->fits ? "fits" : "does not fit",
                                   fb(rep->gpu_mem, a));
        else
            g_string_append(s, "<td class=l>no OOM</td></tr>\n");
    }
    g_string_append(s, "</table>\n");

    /* Breakdown at the peak, steps. */
    g_string_append(s, "<h2>At the peak</h2>\n");
    for (guint i = 0; i < rep->n_ranks && i < 16; i++)
        breakdown(s, &rep->ranks[i]);
    /* Who holds the memory (allocation sites), at the peak and at the OOM. */
    for (guint i = 0; i < rep->n_ranks && i < 16; i++) {
        const MemsimRankReport *r = &rep->ranks[i];
        for (int which = 0; which < 2; which++) {
            const MemsimSite *x = which ? r->sites_at_oom : r->sites_at_peak;
            uint32_t n = which ? r->n_sites_at_oom : r->n_sites_at_peak;
            if (!n)
                continue;
            g_string_append_printf(s, "<h3>Who holds the memory at the %s (rank %u, event %"
                                      PRIu64 ")</h3>\n<table class=sites><tr><th>bytes</th>"
                                      "<th>blocks</th><th class=l>allocation site</th>"
                                      "<th class=l>category</th></tr>\n",
                                   which ? "OOM" : "peak", r->rank,
                                   which ? r->sites_oom_event : r->peak_allocated_event);
            for (uint32_t k = 0; k < n; k++) {
                g_string_append_printf(s, "<tr><td>%s</td><td>%" PRIu64 "</td><td class=l>",
                                       fb(x[k].bytes, a), x[k].count);
                esc(s, x[k].site);
                g_string_append_printf(s, "</td><td class=l>%s</td></tr>\n",
                                       memsim_category_name(x[k].category));
            }
            g_string_append(s, "</table>\n");
        }
    }
    gboolean any_steps = FALSE;
    for (guint i = 0; i < rep->n_ranks; i++)
        any_steps |= rep->ranks[i].n_steps > 0;
    if (any_steps) {
        g_string_append(s, "<h2>Steps</h2>\n<table><tr><th class=l>rank</th><th>step</th>"
                           "<th>peak allocated</th><th>peak reserved</th>");
        for (int p = 1; p < MEMSIM_PHASE_COUNT; p++)
            g_string_append_printf(s, "<th>%s</th>", memsim_phase_name(p));
        g_string_append(s, "</tr>\n");
        for (guint i = 0; i < rep->n_ranks && i < 16; i++)
            for (guint k = 0; k < rep->ranks[i].n_steps; k++) {
                const MemsimStepPeaks *sp = &rep->ranks[i].steps[k];
                g_string_append(s, "<tr><td class=l>");
                rank_label(s, &rep->ranks[i]);
                g_string_append_printf(s, "</td><td>%u</td><td>%s</td><td>%s</td>", sp->step,
                                       fb((memsim_size_t)MAX(sp->peak_allocated, 0), a),
                                       fb((memsim_size_t)MAX(sp->peak_reserved, 0), b));
                for (int p = 1; p < MEMSIM_PHASE_COUNT; p++)
                    g_string_append_printf(
                        s, "<td>%s</td>",
                        sp->phase_peak_allocated[p] >= 0
                            ? fb((memsim_size_t)sp->phase_peak_allocated[p], a)
                            : "—");
                g_string_append(s, "</tr>\n");
            }
        g_string_append(s, "</table>\n");
    }
    if (extra)
        g_string_append_printf(s, "%s\n", extra);

    /* The timeline. */
    if (svg) {
        g_string_append(s, "<h2>Timeline</h2>\n<div class=plot>\n");
        const char *p = svg;
        if (g_str_has_prefix(p, "<?xml")) { /* no XML declaration inside HTML */
            const char *end = strstr(p, "?>");
            p = end ? end + 2 : p;
            while (*p == '\n' || *p == '\r')
                p++;
        }
        g_string_append(s, p);
        g_string_append(s, "</div>\n");
    }
    g_string_append(s, "<footer>memsim 0.1.0</footer>\n</body></html>\n");
    return g_string_free(s, FALSE);
}

gboolean memsim_export_html(const MemsimReport *rep, const MemsimTimeline *tl,
                            const char *title, const char *extra_html, const char *path,
                            GError **error)
{
    g_autofree char *html = render(rep, tl, title, extra_html, error);
    if (!html)
        return FALSE;
    MemsimOutFile o;
    if (!memsim_out_open(&o, path, error))
        return FALSE;
    memsim_out_write(&o, html, strlen(html));
    return memsim_out_close(&o, error);
}
