/* Internal: the getters of the policies that sim/alloc/registry.c registers. Each policy is
 * one file under sim/alloc/ with everything static except its getter. */
#ifndef MEMSIM_SIM_ALLOC_POLICIES_H
#define MEMSIM_SIM_ALLOC_POLICIES_H

#include <memsim/alloc.h>

const MemsimAllocOps *memsim_alloc_torch_ops(void);
const MemsimAllocOps *memsim_alloc_exact_ops(void);
const MemsimAllocOps *memsim_alloc_bfc_ops(void);
const MemsimAllocOps *memsim_alloc_buddy_ops(void);
const MemsimAllocOps *memsim_alloc_first_fit_ops(void);
const MemsimAllocOps *memsim_alloc_best_fit_ops(void);
const MemsimAllocOps *memsim_alloc_stitch_ops(void);

#endif
