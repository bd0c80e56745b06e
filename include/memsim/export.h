/* memsim — exporters: what a replay recorded, in forms people and other tools read.
 *
 *     MemsimTimeline *tl = memsim_timeline_new(0);
 *     MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
 *     o.timeline = tl;
 *     MemsimReport *rep = memsim_replay_path("run.mst", &o, &err);
 *     memsim_export_timeline_plot(tl, NULL, "run.svg", &err);     // or .png, .pdf
 *     memsim_export_perfetto(tl, "run.json", &err);               // ui.perfetto.dev
 *     memsim_export_timeline_csv(tl, "run.csv", &err);
 *     memsim_export_html(rep, tl, NULL, NULL, "report.html", &err);
 *     memsim_export_snapshot("run.mst", "run.pickle", NULL, &err); // PyTorch snapshot
 *
 * Every function returns FALSE with a MEMSIM_ERROR_IO error naming the file when it cannot
 * be written (and leaves no half-written file behind), or MEMSIM_ERROR_BAD_INPUT when the
 * input is wrong. Sizes are bounded by the timeline's bucket count, not by the trace length,
 * except the snapshot, which holds every allocator action.
 */
#ifndef MEMSIM_EXPORT_H
#define MEMSIM_EXPORT_H

#include <memsim/error.h>
#include <memsim/sim.h>
#include <memsim/timeline.h>

G_BEGIN_DECLS

/* The colour of a category in every plot and table, 0xRRGGBB. */
MEMSIM_API guint32 memsim_export_category_rgb(MemsimCategory cat);
/* The colour of the peak marker, 0xRRGGBB (no category uses it). */
#define MEMSIM_EXPORT_PEAK_RGB 0xdc143cu

/* The timeline drawn with cairo: one panel per rank (at most 16), memory over the event
 * index (or the simulated time), stacked by category; reserved bytes as a line; the peak,
 * the OOM point and the device capacity marked. The format follows the extension of `path`:
 * .svg, .png or .pdf. `title` may be NULL (then the trace's name). An SVG stays under 2 MB
 * whatever the trace length. */
MEMSIM_API gboolean memsim_export_timeline_plot(const MemsimTimeline *tl, const char *title,
                                     const char *path, GError **error);
/* The same SVG, in memory: newly allocated, g_free() it. NULL with error set on failure. */
MEMSIM_API char *memsim_export_timeline_svg(const MemsimTimeline *tl, const char *title, GError **error);

/* Chrome trace-event JSON (loads in ui.perfetto.dev and chrome://tracing): per rank (pid =
 * device) counter tracks "allocated", "reserved" and "by category" ("ph":"C"), op slices per
 * stream (tid = stream, "ph":"X", cat = phase), instants ("ph":"i") at the peak and at the
 * OOM. ts is the simulated time in µs when the trace has one, else the event index. */
MEMSIM_API gboolean memsim_export_perfetto(const MemsimTimeline *tl, const char *path, GError **error);

/* CSV, one row per timeline bucket, header first:
 *   rank,event,op,phase,allocated,reserved,<one column per category>,event_first,
 *   event_last,allocated_min,reserved_min,samples
 * `event`, `op` and the categories are those of the bucket's max allocated; `allocated` and
 * `reserved` are the bucket's maxima. */
MEMSIM_API gboolean memsim_export_timeline_csv(const MemsimTimeline *tl, const char *path, GError **error);

/* One self-contained HTML page (no network): the run, peaks per rank, the breakdown by
 * category at the peak, the timeline SVG inlined. `tl` may be NULL (no plot); `title` may be
 * NULL; `extra_html` (may be NULL) is inserted as is after the tables. */
MEMSIM_API gboolean memsim_export_html(const MemsimReport *report, const MemsimTimeline *tl,
                            const char *title, const char *extra_html, const char *path,
                            GError **error);

/* PyTorch memory snapshot (the schema of torch.cuda.memory._dump_snapshot, as a pickle of
 * plain dict/list/str/int/float/bool/None/tuple, protocol 2): the trace is replayed through
 * the torch policy and what the policy does becomes `device_traces` (alloc, free_requested,
 * free_completed, segment_alloc/free/map/unmap, oom; frames = the running op), its final
 * layout becomes `segments`, its settings `allocator_settings`. alloc_conf: the
 * PYTORCH_CUDA_ALLOC_CONF settings to replay under (NULL = the trace's own). A rank that runs
 * out of memory (capacity: the trace's) stops there, as the program would. */
MEMSIM_API gboolean memsim_export_snapshot(const char *trace_path, const char *out, const char *alloc_conf,
                                GError **error);
/* The same from an in-memory trace (borrowed, not changed). */
MEMSIM_API gboolean memsim_export_snapshot_trace(MemsimTrace *trace, const char *out,
                                      const char *alloc_conf, GError **error);

G_END_DECLS

#endif
