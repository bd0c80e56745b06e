/* The registry of allocator policies, the public wrapper that fills in optional entries,
 * and the default device behaviour (include/memsim/alloc.h). */
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

void memsim_alloc_free_instance(MemsimAlloc *a)
{
    if (!a)
        return;
    a->ops->destroy(a->state);
    g_free(a);
}

const MemsimAllocOps *memsim_alloc_ops(MemsimAlloc *a)
{
    return a->ops;
}

MemsimAllocResult memsim_alloc_malloc(MemsimAlloc *a, memsim_size_t size, uint32_t stream,
                                      memsim_addr_t *addr)
{
    return a->ops->malloc(a->state, size, stream, addr);
}

void memsim_alloc_free(MemsimAlloc *a, memsim_addr_t addr)
{
    a->ops->free(a->state, addr);
}

void memsim_alloc_record_stream(MemsimAlloc *a, memsim_addr_t addr, uint32_t stream)
{
    if (a->ops->record_stream)
        a->ops->record_stream(a->state, addr, stream);
}

void memsim_alloc_empty_cache(MemsimAlloc *a)
{
    if (a->ops->empty_cache)
        a->ops->empty_cache(a->state);
}

MemsimAllocStats memsim_alloc_stats(MemsimAlloc *a)
{
    return a->ops->stats(a->state);
}

const MemsimAllocStats *memsim_alloc_stats_live(MemsimAlloc *a)
{
    if (a->ops->stats_live)
        return a->ops->stats_live(a->state);
    a->copy = a->ops->stats(a->state);
    return &a->copy;
}

MemsimAllocShape memsim_alloc_shape(MemsimAlloc *a)
{
    MemsimAllocShape s = {0};
    if (a->ops->shape)
        s = a->ops->shape(a->state);
    return s;
}

gboolean memsim_alloc_check(MemsimAlloc *a, GError **error)
{
    return a->ops->check ? a->ops->check(a->state, error) : TRUE;
}

gboolean memsim_alloc_seed_segment(MemsimAlloc *a, memsim_addr_t addr, memsim_size_t size,
                                   uint32_t stream, uint32_t flags, GError **error)
{
    if (!a->ops->seed_segment) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "allocator '%s' cannot start from a recorded state", a->ops->name);
        return FALSE;
    }
    return a->ops->seed_segment(a->state, addr, size, stream, flags, error);
}

gboolean memsim_alloc_seed_block(MemsimAlloc *a, memsim_addr_t addr, memsim_size_t block_size,
                                 memsim_size_t requested, uint32_t stream, GError **error)
{
    if (!a->ops->seed_block) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "allocator '%s' cannot start from a recorded state", a->ops->name);
        return FALSE;
    }
    return a->ops->seed_block(a->state, addr, block_size, requested, stream, error);
}

memsim_size_t memsim_alloc_round_size(MemsimAlloc *a, memsim_size_t size)
{
    if (a->ops->round_size)
        return a->ops->round_size(a->state, size);
    return size < 512 ? 512 : (size + 511) & ~(memsim_size_t)511;
}

gboolean memsim_alloc_foreach_block(MemsimAlloc *a, MemsimBlockFunc fn, void *user)
{
    if (!a->ops->foreach_block)
        return FALSE;
    a->ops->foreach_block(a->state, fn, user);
    return TRUE;
}

/* ---- device ---- */

/* Far above any real 48-bit virtual address, so that simulated segments never meet the
 * recorded ones a replay may also use. */
#define DEFAULT_BASE ((memsim_addr_t)1 << 56)
#define ADDR_ALIGN ((memsim_addr_t)2 << 20)

memsim_addr_t memsim_device_segment_addr(MemsimDevice *dev, memsim_size_t size, uint32_t stream)
{
    if (dev->segment_addr)
        return dev->segment_addr(dev->user, size, stream);
    if (dev->next_addr == 0)
        dev->next_addr = DEFAULT_BASE;
    memsim_addr_t a = dev->next_addr;
    /* Leave a gap so that distinct segments are never address-adjacent. */
    dev->next_addr += ((size + ADDR_ALIGN - 1) & ~(ADDR_ALIGN - 1)) + ADDR_ALIGN;
    return a;
}

void memsim_device_emit(MemsimDevice *dev, MemsimAllocEventKind kind, memsim_addr_t addr,
                        memsim_size_t size, uint32_t stream)
{
    if (dev->on_event && !((dev->quiet >> kind) & 1u)) {
        MemsimAllocEvent ev = {kind, addr, size, stream};
        dev->on_event(dev->user, &ev);
    }
}

uint64_t memsim_device_record_event(MemsimDevice *dev, uint32_t stream)
{
    return dev->record_event ? dev->record_event(dev->user, stream) : 0;
}

gboolean memsim_device_event_done(MemsimDevice *dev, uint32_t stream, uint64_t token)
{
    return dev->event_done ? dev->event_done(dev->user, stream, token) : TRUE;
}
