/* A progress bar on stderr for the command's long work: phase, done/total, rate, ETA.
 *
 * Shown only when stderr is a terminal and --quiet is not given, and only once the work has
 * run for a second; redrawn four times a second from its own thread, which reads the
 * counters the work updates (plain guint64s, read relaxed-atomically). Standard output is
 * never touched, so --json and other output stay byte for byte what they are without it. */
#ifndef MEMSIM_TOOLS_PROGRESS_H
#define MEMSIM_TOOLS_PROGRESS_H

#include <glib.h>

typedef enum {
    PROGRESS_COUNT, /* plain counts: "1,234 events" */
    PROGRESS_BYTES, /* bytes: "12.3 MB" */
} ProgressUnit;

typedef struct {
    GThread *thread;
    GMutex lock;
    GCond cond;
    gboolean done, shown;
    const char *phase; /* "replaying", "planning", ... (static strings) */
    const char *unit;  /* with PROGRESS_COUNT: what is counted ("events", "layouts") */
    ProgressUnit kind;
    const guint64 *count; /* done so far, or NULL (elapsed time only) */
    const guint64 *total; /* with count: the whole (0 while unknown), or NULL */
} Progress;

/* Turns the bar off for the process (the commands' --quiet). */
void progress_set_quiet(gboolean quiet);

/* Starts a bar for `phase` (a static string). `count` and `total` may be NULL; both are read
 * while the work runs. Does nothing where stderr is no terminal or --quiet was given. */
void progress_start(Progress *p, const char *phase, const char *unit, ProgressUnit kind,
                    const guint64 *count, const guint64 *total);

/* A new phase name (a static string) for a running bar. */
void progress_phase(Progress *p, const char *phase);

/* Stops the thread and clears the bar's line. */
void progress_stop(Progress *p);

#endif
