/* The C library's allocator settings of the command-line tools. */
#ifndef MEMSIM_TOOLS_MALLOC_TUNE_H
#define MEMSIM_TOOLS_MALLOC_TUNE_H

#ifdef __GLIBC__
#include <malloc.h>
#endif

/* A run generates and replays traces one after another (a plan hundreds, an estimate two: the
 * host-memory probe and the run), each building arrays of megabytes and freeing them. With
 * glibc's defaults such blocks go back to the kernel (mmap above a threshold that starts at
 * 128 KiB, the heap's top trimmed past twice that), so the next trace faults in fresh zeroed
 * pages for the same sizes. Blocks up to 32 MiB (glibc's largest mmap threshold on 64-bit)
 * taken from the heap, and a heap kept up to 1 GiB, serve the next trace from the memory the
 * last one freed. */
static inline void memsim_tools_malloc_tune(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

#endif
