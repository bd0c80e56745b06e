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
 * The first GiB of the heap is also reserved at once and advised for transparent huge pages
 * (madvise(2) MADV_HUGEPAGE; the kernel's default THP mode serves only advised ranges): the
 * memory a trace touches first then faults in 2 MiB at a time instead of 4 KiB, and its
 * accesses miss the TLB less. The reservation is address space only: pages are backed when
 * touched. This is what glibc's glibc.malloc.hugetlb=1 tunable does for its heaps, which a
 * program cannot set for itself. The threads of a plan share that heap (one arena): glibc
 * would give each its own, mapped apart and not advised. */
static inline void memsim_tools_malloc_tune(void)
{
#ifdef __GLIBC__
    const size_t pad = (size_t)1 << 30;
    const uintptr_t huge = (uintptr_t)2 << 20;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_TOP_PAD, (int)pad); /* the next growth of the heap takes a GiB more */
    void *first = malloc(1 << 20); /* beyond the heap's start: it grows */
    uintptr_t lo = ((uintptr_t)first + huge - 1) & ~(huge - 1);
    uintptr_t hi = (uintptr_t)sbrk(0) & ~(huge - 1);
    /* (where the heap could not grow, malloc mapped the block elsewhere: nothing advised) */
    if (first && hi > lo && hi - lo <= pad + ((size_t)2 << 20))
        madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* fails harmlessly without THP */
    free(first);
    mallopt(M_TOP_PAD, 128 << 10); /* glibc's default (DEFAULT_TOP_PAD) again */
#endif
}

#endif
