/* The registry of allocator policies by name and the making of an instance from a spec
 * ("name:settings", include/memsim/alloc.h); the instance calls and the device are instance.c. */
#include <memsim/alloc.h>

#include <errno.h>
#include <math.h>
#include <string.h>

#include "sim/alloc/instance.h"
#include "sim/alloc/policies.h"

static const MemsimAllocOps *const *registry(void)
{
    static const MemsimAllocOps *table[16];
    static gsize init = 0;
    if (g_once_init_enter(&init)) {
        int n = 0;
        table[n++] = memsim_alloc_torch_ops();
        table[n++] = memsim_alloc_exact_ops();
        table[n++] = memsim_alloc_bfc_ops();
        table[n++] = memsim_alloc_buddy_ops();
        table[n++] = memsim_alloc_first_fit_ops();
        table[n++] = memsim_alloc_best_fit_ops();
        table[n++] = memsim_alloc_stitch_ops();
        table[n] = NULL;
        g_once_init_leave(&init, 1);
    }
    return table;
}

const MemsimAllocOps *const *memsim_alloc_registry(void)
{
    return registry();
}

const MemsimAllocOps *memsim_alloc_find(const char *name)
{
    for (const MemsimAllocOps *const *p = registry(); *p; p++)
        if (strcmp((*p)->name, name) == 0)
            return *p;
    return NULL;
}


MemsimAlloc *memsim_alloc_new(const MemsimAllocOps *ops, const char *settings, MemsimDevice *dev,
                              GError **error)
{
    MemsimAlloc *a = g_new0(MemsimAlloc, 1);
    a->ops = ops;
    if (!dev) {
        MemsimDevice d = MEMSIM_DEVICE_INIT;
        a->own_dev = d;
        dev = &a->own_dev;
    }
    a->dev = dev;
    a->state = ops->create(settings ? settings : "", dev, error);
    if (!a->state) {
        g_free(a);
        return NULL;
    }
    return a;
}

MemsimAlloc *memsim_alloc_new_from_spec(const char *spec, MemsimDevice *dev, GError **error)
{
    const char *colon = strchr(spec, ':');
    g_autofree char *name = colon ? g_strndup(spec, (gsize)(colon - spec)) : g_strdup(spec);
    const MemsimAllocOps *ops = memsim_alloc_find(name);
    if (!ops) {
        GString *known = g_string_new(NULL);
        for (const MemsimAllocOps *const *p = registry(); *p; p++)
            g_string_append_printf(known, "%s%s", known->len ? ", " : "", (*p)->name);
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "unknown allocator '%s' (known: %s)", name, known->str);
        g_string_free(known, TRUE);
        return NULL;
    }
    return memsim_alloc_new(ops, colon ? colon + 1 : "", dev, error);
}
