/* Placeholder until the torch policy lands. */
#include "sim/alloc/policies.h"
const MemsimAllocOps *memsim_alloc_torch_ops(void) { return memsim_alloc_exact_ops(); }
