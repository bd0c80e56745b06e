/* Writing exported files (sim/export/outfile.h). */
#include "sim/export/outfile.h"

#include <errno.h>
#include <stdarg.h>
#include <sys/stat.h>

#include <glib/gstdio.h>

gboolean memsim_out_open(MemsimOutFile *o, const char *path, GError **error)
{
    o->err = 0;
    o->path = g_strdup(path);
    o->f = g_fopen(path, "wb");
    if (!o->f) {
        int e = errno;
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: cannot create: %s", path,
                    g_strerror(e));
        g_free(o->path);
        o->path = NULL;
        return FALSE;
    }
    struct stat st;
    o->regular = fstat(fileno(o->f), &st) == 0 && S_ISREG(st.st_mode);
    setvbuf(o->f, NULL, _IOFBF, 1 << 16);
    return TRUE;
}

void memsim_out_write(MemsimOutFile *o, const void *data, gsize len)
{
    if (o->err || len == 0)
        return;
    if (fwrite(data, 1, len, o->f) != len)
        o->err = errno ? errno : EIO;
}

void memsim_out_printf(MemsimOutFile *o, const char *fmt, ...)
{
    if (o->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (vfprintf(o->f, fmt, ap) < 0)
        o->err = errno ? errno : EIO;
    va_end(ap);
}

gboolean memsim_out_close(MemsimOutFile *o, GError **error)
{
    if (fflush(o->f) != 0 && !o->err)
        o->err = errno ? errno : EIO;
    if (fclose(o->f) != 0 && !o->err)
        o->err = errno ? errno : EIO;
    o->f = NULL;
    gboolean ok = o->err == 0;
    if (!ok) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: write error: %s", o->path,
                    g_strerror(o->err));
        if (o->regular)
            g_unlink(o->path);
    }
    g_free(o->path);
    o->path = NULL;
    return ok;
}

void memsim_out_abort(MemsimOutFile *o)
{
    if (o->f)
        fclose(o->f);
    o->f = NULL;
    if (o->path && o->regular)
        g_unlink(o->path);
    g_free(o->path);
    o->path = NULL;
}
