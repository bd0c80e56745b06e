/* The C library's allocator settings of the command-line tools. */
#ifndef MEMSIM_TOOLS_MALLOC_TUNE_H
#define MEMSIM_TOOLS_MALLOC_TUNE_H

#ifdef __GLIBC__
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

/* A run generates and replays traces one after another (a plan hundreds, an estimate two: the
 * host-memory probe and the run), each building arrays of megabytes and freeing them. With
 * glibc's defaults such blocks go back to the kernel (mmap above a threshold that starts at
 * 128 KiB, the heap's top trimmed past twice that), so the next trace faults in fresh zeroed
 * pages for the same sizes. Blocks up to 32 MiB (glibc's largest mmap threshold on 64-bit)
 * taken from the heap, and a heap kept up to 1 GiB, serve the next trace from the memory the
 * last one freed.
 *
 * The first 256 MiB of the heap are also reserved at once and advised for transparent huge
 * pages (madvise(2) MADV_HUGEPAGE; the kernel's default THP mode serves only advised ranges):
 * the memory a trace touches first then faults in 2 MiB at a time instead of 4 KiB. The
 * reservation is address space only: pages are backed when touched. This is what glibc's
 * glibc.malloc.hugetlb=1 tunable does for the heap, which a program cannot set for itself. */
static inline void memsim_tools_malloc_tune(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    const uintptr_t huge = (uintptr_t)2 << 20;
    mallopt(M_TOP_PAD, 256 << 20); /* the next growth of the heap takes 256 MiB more */
    void *first = malloc(1 << 20); /* beyond the heap's start: it grows */
    uintptr_t lo = ((uintptr_t)first + huge - 1) & ~(huge - 1);
    uintptr_t hi = (uintptr_t)sbrk(0) & ~(huge - 1);
    if (first && hi > lo)
        madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* fails harmlessly without THP */
    free(first);
    mallopt(M_TOP_PAD, 128 << 10); /* glibc's default (DEFAULT_TOP_PAD) again */
#endif
}

#endif
