/* memsim — errors.
 *
 * Bad input (a malformed file, an impossible configuration) is reported through a GError in
 * the MEMSIM_ERROR domain whose message names the file and the record, line or byte offset
 * and what was expected. A broken invariant is a bug and asserts instead.
 *
 * Conventions of every public header (include/memsim/ *.h):
 *
 *   Errors. A function taking `GError **error` reports failure by its return value (FALSE,
 *   NULL, or 0 where stated) and sets *error, unless `error` is NULL; the caller frees the
 *   error with g_error_free() (or g_autoptr(GError)). Its message is what the command
 *   prints after "memsim CMD: ". On failure nothing is returned that needs freeing and no
 *   file is left half-written.
 *
 *   Ownership. "Newly allocated" strings are freed with g_free(), string vectors with
 *   g_strfreev(); each opaque handle has its own _free() (or _close(), _finish()), which
 *   accepts NULL. A `const` pointer returned by a getter is owned by the object it came from
 *   and valid until that object changes or is freed. Arguments are borrowed: the library
 *   copies what it keeps (a header given to a writer or a replay), except where a comment
 *   says a pointer must outlive something (a MemsimDevice, a MemsimTimeline).
 *
 *   Threads. The library has no mutable global state (the policy registry is initialised
 *   once, thread-safely). Calls on distinct objects may run in different threads at the
 *   same time (tests/threads_check.c checks estimates and replays). One object (a trace, a
 *   reader or writer, a replay, an allocator instance, a timeline) is used by one thread at
 *   a time; objects only read — a MemsimModel, a const MemsimRun, a finished MemsimReport —
 *   may be shared by threads that only read them.
 */
#ifndef MEMSIM_ERROR_H
#define MEMSIM_ERROR_H

#include <glib.h>

#include <memsim/api.h>

G_BEGIN_DECLS

#define MEMSIM_ERROR (memsim_error_quark())

typedef enum {
    MEMSIM_ERROR_BAD_INPUT,   /* malformed or unsupported input: exit status 2 */
    MEMSIM_ERROR_IO,          /* the file could not be read or written: exit status 2 */
    MEMSIM_ERROR_UNSUPPORTED, /* valid input that this version does not model: exit status 2 */
} MemsimErrorCode;

/* The domain of every error the library sets (MEMSIM_ERROR). */
MEMSIM_API GQuark memsim_error_quark(void);

G_END_DECLS

#endif
