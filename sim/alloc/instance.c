/* An allocator instance behind its table of operations (include/memsim/alloc.h): the public
 * calls, which fill in the optional entries, and the default device behaviour the policies
 * draw on (segment addresses, reporting what they do, stream events). The registry of the
 * policies by name is registry.c. */
#include <memsim/alloc.h>

#include <string.h>

#include "sim/alloc/instance.h"

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
