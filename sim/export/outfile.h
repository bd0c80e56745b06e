/* Internal: writing an exported file. Output goes through stdio; the first write error is
 * kept and reported by close(), which also removes the half-written file. */
#ifndef MEMSIM_SIM_EXPORT_OUTFILE_H
#define MEMSIM_SIM_EXPORT_OUTFILE_H

#include <memsim/error.h>
#include <stdio.h>

typedef struct {
    FILE *f;
    char *path;
    int err; /* first errno, 0 = none */
    gboolean regular; /* a regular file: removed on failure (never a device or a pipe) */
} MemsimOutFile;

/* Creates `path`; FALSE with a MEMSIM_ERROR_IO error naming it on failure. */
gboolean memsim_out_open(MemsimOutFile *o, const char *path, GError **error);
void memsim_out_write(MemsimOutFile *o, const void *data, gsize len);
void memsim_out_printf(MemsimOutFile *o, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
/* Flushes and closes; on any error so far, removes the file and returns FALSE with error. */
gboolean memsim_out_close(MemsimOutFile *o, GError **error);
/* Closes and removes the file (another error happened). */
void memsim_out_abort(MemsimOutFile *o);

#endif
