/* Internal: the end of every JSON document memsim writes with json-glib's builder. */
#ifndef MEMSIM_SIM_EXPORT_JSON_H
#define MEMSIM_SIM_EXPORT_JSON_H

#include <json-glib/json-glib.h>

/* The builder's document as text (pretty: indented), newly allocated (g_free); `len` (may be
 * NULL) gets its length. Consumes the builder. */
static inline char *json_builder_finish(JsonBuilder *b, gboolean pretty, gsize *len)
{
    JsonGenerator *g = json_generator_new();
    JsonNode *root = json_builder_get_root(b);
    json_generator_set_root(g, root);
    json_generator_set_pretty(g, pretty);
    char *out = json_generator_to_data(g, len);
    json_node_unref(root);
    g_object_unref(g);
    g_object_unref(b);
    return out;
}

#endif
