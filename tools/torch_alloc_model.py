#!/usr/bin/python3
"""A plain Python model of PyTorch's CUDA caching allocator, and a replay of a memory
snapshot through it.

    /usr/bin/python3 tools/torch_alloc_model.py SNAPSHOT.pickle   # peak reserved/allocated

The model follows c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator) with its default
settings: requests rounded to 512 bytes (round_size); requests up to 1 MiB served from the
small pool, in 2 MiB segments, larger ones from the large pool, in 20 MiB segments below
10 MiB and in the request rounded up to 2 MiB above (get_allocation_size); the free block
of the request's pool and stream with the smallest (size, address) that fits
(get_free_block, best fit); a block split when the rest is at least 512 bytes in the small
pool or more than 1 MiB in the large one (should_split); a freed block merged with its free
neighbours in the segment (free_block, try_merge_blocks); empty_cache releasing every
segment that is one free block (release_cached_blocks). Memory is unlimited: no OOM, no
garbage collection, no expandable segments.

It is the straightforward version on purpose (sorted lists and bisect, one object per
block): tools/snapshot-gen.py uses it to give a synthetic snapshot its addresses, and
`memsim-bench snapshot` times it against memsim on the same file.
"""
import bisect
import pickle
import sys
import time

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20


def round_size(size):
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    return (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK


def allocation_size(size):
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


class Block:
    __slots__ = ("addr", "size", "stream", "small", "free", "prev", "next", "seg", "requested")

    def __init__(self, addr, size, stream, small, seg):
        self.addr = addr
        self.size = size
        self.stream = stream
        self.small = small
        self.free = True
        self.prev = None
        self.next = None
        self.seg = seg
        self.requested = 0


class Allocator:
    def __init__(self, base=0x7F0000000000):
        self.pools = {}  # (small, stream) -> sorted [(size, addr)]
        self.by_addr = {}  # addr -> Block (every block)
        self.segments = {}  # segment addr -> (size, stream, small)
        self.next_addr = base
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0
        self.log = None  # list to which (action, addr, size, stream) tuples are appended

    def _pool(self, small, stream):
        return self.pools.setdefault((small, stream), [])

    def _insert_free(self, b):
        bisect.insort(self._pool(b.small, b.stream), (b.size, b.addr))

    def _remove_free(self, b):
        pool = self._pool(b.small, b.stream)
        i = bisect.bisect_left(pool, (b.size, b.addr))
        del pool[i]

    def malloc(self, size, stream):
        """Returns the address of a block for `size` bytes on `stream`."""
        size = round_size(size)
        small = size <= K_SMALL_SIZE
        pool = self._pool(small, stream)
        i = bisect.bisect_left(pool, (size, 0))
        if i < len(pool):
            bsize, baddr = pool.pop(i)
            b = self.by_addr[baddr]
        else:
            seg_size = allocation_size(size)
            addr = self.next_addr
            self.next_addr += (seg_size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE
            b = Block(addr, seg_size, stream, small, addr)
            self.by_addr[addr] = b
            self.segments[addr] = (seg_size, stream, small)
            self.reserved += seg_size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            if self.log is not None:
                self.log.append(("segment_alloc", addr, seg_size, stream))
        rest = b.size - size
        if (small and rest >= K_MIN_BLOCK) or (not small and rest > K_SMALL_SIZE):
            r = Block(b.addr + size, rest, stream, small, b.seg)
            r.prev = b
            r.next = b.next
            if b.next:
                b.next.prev = r
            b.next = r
            b.size = size
            self.by_addr[r.addr] = r
            self._insert_free(r)
        b.free = False
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return b.addr

    def free(self, addr):
        b = self.by_addr.pop(addr)
        b.free = True
        self.allocated -= b.size
        p = b.prev
        if p is not None and p.free:
            self._remove_free(p)
            del self.by_addr[p.addr]
            b.addr = p.addr
            b.size += p.size
            b.prev = p.prev
            if p.prev is not None:
                p.prev.next = b
        n = b.next
        if n is not None and n.free:
            self._remove_free(n)
            del self.by_addr[n.addr]
            b.size += n.size
            b.next = n.next
            if n.next is not None:
                n.next.prev = b
        self.by_addr[b.addr] = b
        self._insert_free(b)
        return b

    def empty_cache(self):
        """Releases every segment that is one free block (release_cached_blocks)."""
        for seg, (size, stream, small) in sorted(self.segments.items()):
            b = self.by_addr.get(seg)
            if b is not None and b.free and b.size == size:
                self._remove_free(b)
                del self.by_addr[seg]
                del self.segments[seg]
                self.reserved -= size
                if self.log is not None:
                    self.log.append(("segment_free", seg, size, stream))

    def blocks_of(self, seg):
        b = self.by_addr[seg]
        while b is not None:
            yield b
            b = b.next


def replay(snapshot):
    """Replays the alloc / free_requested entries of device 0 (a trace that starts empty)
    through the model; returns (peak reserved, peak allocated, events)."""
    a = Allocator()
    where = {}  # recorded address -> model address
    n = 0
    releasing = False
    for e in snapshot["device_traces"][0]:
        act = e["action"]
        if act == "alloc":
            where[e["addr"]] = a.malloc(e["size"], e["stream"])
        elif act == "free_requested":
            a.free(where.pop(e["addr"]))
        elif act == "segment_free" and not releasing:
            a.empty_cache()  # a run of segment_free: the empty_cache that made it
        releasing = act == "segment_free"
        n += 1
    return a.peak_reserved, a.peak_allocated, n


def main(argv):
    if len(argv) != 2:
        print("usage: torch_alloc_model.py SNAPSHOT.pickle", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with open(argv[1], "rb") as f:
        snap = pickle.load(f)
    t1 = time.perf_counter()
    peak_r, peak_a, n = replay(snap)
    t2 = time.perf_counter()
    print("events %d peak_reserved %d peak_allocated %d load_s %.3f replay_s %.3f total_s %.3f"
          % (n, peak_r, peak_a, t1 - t0, t2 - t1, t2 - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
