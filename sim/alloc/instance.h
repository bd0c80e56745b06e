/* Internal: the layout of a MemsimAlloc, for the replay's hot path, which calls the policy's
 * malloc and free directly instead of through memsim_alloc_malloc and memsim_alloc_free. */
#ifndef MEMSIM_SIM_ALLOC_INSTANCE_H
#define MEMSIM_SIM_ALLOC_INSTANCE_H

#include <memsim/alloc.h>

struct MemsimAlloc {
    const MemsimAllocOps *ops;
    void *state;
    MemsimDevice *dev;
    MemsimDevice own_dev;
    MemsimAllocStats copy; /* memsim_alloc_stats_live for policies without stats_live */
};

#endif
