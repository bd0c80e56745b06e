/* memsim — errors.
 *
 * Bad input (a malformed file, an impossible configuration) is reported through a GError in
 * the MEMSIM_ERROR domain whose message names the file and the record, line or byte offset
 * and what was expected. A broken invariant is a bug and asserts instead.
 */
#ifndef MEMSIM_ERROR_H
#define MEMSIM_ERROR_H

#include <glib.h>

G_BEGIN_DECLS

#define MEMSIM_ERROR (memsim_error_quark())

typedef enum {
    MEMSIM_ERROR_BAD_INPUT,   /* malformed or unsupported input: exit status 2 */
    MEMSIM_ERROR_IO,          /* the file could not be read or written: exit status 2 */
    MEMSIM_ERROR_UNSUPPORTED, /* valid input that this version does not model: exit status 2 */
} MemsimErrorCode;

GQuark memsim_error_quark(void);

G_END_DECLS

#endif
