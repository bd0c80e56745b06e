/* memsim — sizes as people write and read them. */
#ifndef MEMSIM_UNITS_H
#define MEMSIM_UNITS_H

#include <memsim/error.h>
#include <memsim/trace.h>

G_BEGIN_DECLS

/* Parses "80GiB", "40GB", "1.5TiB", "123456" into bytes. FALSE with a
 * MEMSIM_ERROR_BAD_INPUT error quoting `text` when it is not a size. */
MEMSIM_API gboolean memsim_parse_size(const char *text, memsim_size_t *bytes, GError **error);
/* The same for the value of a setting or flag: the error starts with "KEY: ". */
MEMSIM_API gboolean memsim_parse_size_of(const char *key, const char *text, memsim_size_t *bytes,
                              GError **error);
/* "12.50 GiB" style; writes into buf (at least 32 bytes) and returns it. Reentrant. */
MEMSIM_API const char *memsim_format_bytes(memsim_size_t bytes, char *buf, gsize len);

G_END_DECLS

#endif
