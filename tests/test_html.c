/* The HTML report in a real browser (slow tier): headless Chromium renders the page that
 * `memsim estimate --report` writes, offline, to a DOM and to a screenshot. The DOM must show
 * the peak figure that the JSON report gives; the screenshot must be the page, with the
 * timeline's peak marker drawn. With MEMSIM_UPDATE_SCREENSHOT=1 the screenshot is kept as
 * tests/data/report-screenshot.png (the README shows it). */
#include <criterion/criterion.h>
#include <cairo.h>
#include <json-glib/json-glib.h>
#include <memsim/export.h>
#include <memsim/sim.h>
#include <string.h>

#include <glib/gstdio.h>

#include "testutil.h"

static char *find_chromium(void)
{
    const char *names[] = {"chromium", "chromium-browser", "google-chrome"};
    for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
        char *p = g_find_program_in_path(names[i]);
        if (p)
            return p;
    }
    return NULL;
}

/* Runs the browser (under a time limit) and returns its exit status and stdout. */
static int run_browser(const char *chromium, const char *profile, const char *mode,
                       const char *url, char **out)
{
    g_autofree char *user_dir = g_strdup_printf("--user-data-dir=%s", profile);
    const char *argv[] = {"timeout",        "180",
                          chromium,         "--headless",
                          "--no-sandbox",   "--disable-gpu",
                          "--hide-scrollbars", "--disable-dev-shm-usage",
                          "--no-first-run", user_dir,
                          "--window-size=1280,2000",
                          mode,             url,
                          NULL};
    int status = 0;
    GError *e = NULL;
    g_autofree char *err = NULL;
    gboolean ok = g_spawn_sync(NULL, (char **)argv, NULL, G_SPAWN_SEARCH_PATH, NULL, NULL, out,
                               &err, &status, &e);
    cr_assert(ok, "cannot run %s: %s", chromium, e ? e->message : "?");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

Test(html, chromium_renders_the_report, .timeout = 600)
{
    g_autofree char *chromium = find_chromium();
    if (!chromium)
        cr_skip_test("chromium is absent (Debian package chromium): browser test skipped");
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *html = g_build_filename(dir, "report.html", NULL);
    const char *argv[] = {"estimate", "--model", "gpt2", "--seq", "512", "--gpu-mem", "8GiB",
                          "--report", html, "--json", NULL};
    g_autofree char *json = NULL, *err = NULL;
    cr_assert_eq(tu_run_memsim(argv, &json, &err), 0, "%s", err);
    GError *e = NULL;
    JsonParser *p = json_parser_new();
    cr_assert(json_parser_load_from_data(p, json, -1, &e));
    JsonObject *r = json_array_get_object_element(
        json_object_get_array_member(json_node_get_object(json_parser_get_root(p)), "ranks"), 0);
    char peak[32];
    memsim_format_bytes((memsim_size_t)json_object_get_int_member(r, "peak_allocated"), peak,
                        sizeof peak);
    g_object_unref(p);

    g_autofree char *url = g_filename_to_uri(html, NULL, NULL);
    g_autofree char *profile = g_build_filename(dir, "profile", NULL);
    g_autofree char *dom = NULL;
    cr_assert_eq(run_browser(chromium, profile, "--dump-dom", url, &dom), 0, "chromium failed");
    cr_assert(dom && strstr(dom, "</html>"), "the page did not load");
    g_autofree char *want = g_strdup_printf("id=\"peak-allocated\">%s<", peak);
    cr_expect(strstr(dom, want), "the DOM does not show the peak %s", peak);
    cr_expect(strstr(dom, "<svg"), "the timeline is not in the page");

    g_autofree char *shot = g_build_filename(dir, "screenshot.png", NULL);
    g_autofree char *mode = g_strdup_printf("--screenshot=%s", shot);
    g_autofree char *ignored = NULL;
    cr_assert_eq(run_browser(chromium, profile, mode, url, &ignored), 0, "chromium failed");
    cairo_surface_t *s = cairo_image_surface_create_from_png(shot);
    cr_assert_eq(cairo_surface_status(s), CAIRO_STATUS_SUCCESS, "no screenshot");
    int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
    cr_expect(w == 1280 && h == 2000, "screenshot %dx%d", w, h);
    cairo_surface_flush(s);
    const unsigned char *px = cairo_image_surface_get_data(s);
    int stride = cairo_image_surface_get_stride(s);
    long marker = 0, ink = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            guint32 v = *(const guint32 *)(px + y * stride + x * 4) & 0xffffff;
            marker += v == MEMSIM_EXPORT_PEAK_RGB;
            ink += v != 0xffffff;
        }
    cairo_surface_destroy(s);
    cr_expect_gt(marker, 30, "the peak marker is not on the screenshot (%ld pixels)", marker);
    cr_expect_gt(ink, 50000, "the screenshot is nearly blank");

    if (g_strcmp0(g_getenv("MEMSIM_UPDATE_SCREENSHOT"), "1") == 0) {
        const char *root = g_getenv("MEMSIM_SOURCE_ROOT");
        cr_assert(root, "MEMSIM_SOURCE_ROOT is not set");
        g_autofree char *dst = g_build_filename(root, "tests", "data", "report-screenshot.png",
                                                NULL);
        g_autofree char *data = NULL;
        gsize len = 0;
        cr_assert(g_file_get_contents(shot, &data, &len, NULL));
        cr_assert(g_file_set_contents(dst, data, (gssize)len, &e), "%s",
                  e ? e->message : "?");
    }
}
