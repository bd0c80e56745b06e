/* Internal: a launch's text read (traces/launch.c) — a command line, a shell script, or a
 * Megatron functional test's model_config.yaml — into the program's flags, its environment and
 * its launcher's words, for traces/megatron.c to take as Megatron's argparse would. */
#ifndef MEMSIM_TRACES_LAUNCH_H
#define MEMSIM_TRACES_LAUNCH_H

#include <glib.h>
#include <stdbool.h>

typedef struct {
    const char *where;   /* names the text in messages */
    GPtrArray *args;     /* char *: the program's flags and values, in order */
    GHashTable *env;     /* char * → char *: the program's environment */
    GHashTable *vars;    /* char * → char *: script variables (WORLD_SIZE, GPUS_PER_NODE, …) */
    GPtrArray *launcher; /* char *: the launcher's words (torchrun and its flags) */
    bool yaml;
    GPtrArray *unknown; /* char *: words memsim does not know (each once) */
    GPtrArray *notes;   /* char *: other warnings */
} Launch;

void launch_init(Launch *l, const char *where);
void launch_clear(Launch *l);
/* Reads `text` (len bytes) by its form: a YAML with a top-level MODEL_ARGS or ENV_VARS key,
 * else a command line or shell script. FALSE with MEMSIM_ERROR_BAD_INPUT naming l->where. */
gboolean launch_read(Launch *l, const char *text, gsize len, GError **error);
/* Notes a word memsim does not know (each once), for the warning that lists them. */
void launch_unknown(Launch *l, const char *what);
/* Notes another warning (each once). */
void launch_note(Launch *l, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

#endif
