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
 * The first GiB of the heap is also reserved at once, and its first 64 MiB advised for
 * transparent huge pages (madvise(2) MADV_HUGEPAGE; the kernel's default THP mode serves only
 * advised ranges): the memory a trace touches first then faults in 2 MiB at a time instead of
 * 4 KiB, and its accesses miss the TLB less. That is what one estimate touches; a plan's
 * hundreds of megabytes are touched about once each, and there 2 MiB pages cost more to fault
 * in than they save (on a 2-core VM, first touches of advised memory ran at 0.4 to 1.2 GB/s
 * against 2.9 GB/s for 4 KiB pages: the llama-2-70b plan at global batch 512 spent 1.2 to 1.6
 * s of system time with the whole GiB advised, 0.35 to 0.45 s with 64 MiB, and estimates of a
 * 7B model took 20% longer with none). The reservation is address space only: pages are backed
 * when touched. This is what glibc's glibc.malloc.hugetlb=1 tunable does for its heaps, which
 * a program cannot set for itself. The threads of a plan share that heap (one arena): glibc
 * would give each its own, mapped apart and not advised. */
static inline void memsim_tools_malloc_tune(void)
{
#ifdef __GLIBC__
    const size_t pad = (size_t)1 << 30;
    const uintptr_t huge = (uintptr_t)2 << 20;
    const size_t huge_part = (size_t)64 << 20;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_TOP_PAD, (int)pad); /* the next growth of the heap takes a GiB more */
    void *first = malloc(1 << 20); /* beyond the heap's start: it grows */
    uintptr_t lo = ((uintptr_t)first + huge - 1) & ~(huge - 1);
    uintptr_t hi = (uintptr_t)sbrk(0) & ~(huge - 1);
    /* (where the heap could not grow, malloc mapped the block elsewhere: nothing advised) */
    if (first && hi > lo && hi - lo <= pad + ((size_t)2 << 20))
        madvise((void *)lo, hi - lo < huge_part ? hi - lo : huge_part,
                MADV_HUGEPAGE); /* fails harmlessly without THP */
    free(first);
    mallopt(M_TOP_PAD, 128 << 10); /* glibc's default (DEFAULT_TOP_PAD) again */
#endif
}

#endif
