/* memsim — allocator policies.
 *
 *     const MemsimAllocOps *ops = memsim_alloc_find("torch");
 *     MemsimDevice dev = MEMSIM_DEVICE_INIT;       // unlimited capacity, bump addresses
 *     MemsimAlloc *a = memsim_alloc_new(ops, "expandable_segments:True", &dev, &err);
 *     memsim_addr_t p;
 *     if (memsim_alloc_malloc(a, 4096, 0, &p) == MEMSIM_ALLOC_OK) memsim_alloc_free(a, p);
 *     MemsimAllocStats st = memsim_alloc_stats(a);
 *     memsim_alloc_free_instance(a);
 *
 * A policy models one device's allocator on integer addresses; it never allocates the
 * memory it simulates. It asks the device (MemsimDevice) for segments and reports what it
 * does through the device's `on_event` hook: that is how `replay --verify` compares it with
 * a recorded trace and how reports learn when the driver was called.
 *
 * Policies are registered by name (memsim_alloc_registry()); each lives in one file of
 * sim/alloc/ and exports one function returning its const table of operations.
 * A policy instance is not thread-safe; distinct instances are independent.
 */
#ifndef MEMSIM_ALLOC_H
#define MEMSIM_ALLOC_H

#include <memsim/error.h>
#include <memsim/trace.h>
#include <memsim/units.h>

G_BEGIN_DECLS

typedef enum {
    MEMSIM_AEV_SEG_ALLOC = 1, /* addr, size: a new driver segment */
    MEMSIM_AEV_SEG_FREE,      /* addr, size: a segment returned to the driver */
    MEMSIM_AEV_SEG_MAP,       /* addr, size: pages mapped (expandable) */
    MEMSIM_AEV_SEG_UNMAP,     /* addr, size: pages unmapped */
    MEMSIM_AEV_ALLOC,         /* addr, size=requested: a block handed out */
    MEMSIM_AEV_FREE_COMPLETED,/* addr, size=requested: a block became reusable */
    MEMSIM_AEV_OOM,           /* size=rounded request, addr=device free bytes */
} MemsimAllocEventKind;

typedef struct {
    MemsimAllocEventKind kind;
    memsim_addr_t addr;
    memsim_size_t size;
    uint32_t stream;
} MemsimAllocEvent;

/* The device a policy allocates from. All hooks are optional (NULL = the default). */
typedef struct {
    /* Bytes the driver can hand out in total (segments + mapped pages); 0 = unlimited. */
    memsim_size_t capacity;
    /* Address for a new segment (or an expandable VA reservation) of `size` bytes.
     * Default: an increasing bump pointer aligned to 2 MiB. */
    memsim_addr_t (*segment_addr)(void *user, memsim_size_t size, uint32_t stream);
    /* Records a cross-stream event on `stream` for a freed block; returns a token. */
    uint64_t (*record_event)(void *user, uint32_t stream);
    /* Whether the event `token` recorded on `stream` has completed. Default: every event
     * completes before the next allocator call (TORCH_ALLOCATOR.md §5.3). */
    gboolean (*event_done)(void *user, uint32_t stream, uint64_t token);
    /* Called for each allocator action. */
    void (*on_event)(void *user, const MemsimAllocEvent *ev);
    void *user;
    /* Private: the default bump pointer. */
    memsim_addr_t next_addr;
    /* Kinds (bit 1 << MemsimAllocEventKind) on_event does not want; a hot path skips them. */
    uint32_t quiet;
} MemsimDevice;

#define MEMSIM_DEVICE_INIT {0, NULL, NULL, NULL, NULL, NULL, 0, 0}

typedef enum {
    MEMSIM_ALLOC_OK = 0,
    MEMSIM_ALLOC_OOM, /* the device could not provide the memory */
} MemsimAllocResult;

/* A {current, peak} pair (bytes or counts). */
typedef struct {
    int64_t current;
    int64_t peak;
} MemsimStat;

/* Statistics in PyTorch's vocabulary (TORCH_ALLOCATOR.md §9). */
typedef struct {
    MemsimStat allocated;      /* bytes of blocks handed out (rounded) */
    MemsimStat reserved;       /* bytes obtained from the driver */
    MemsimStat active;         /* allocated + freed blocks waiting for stream events */
    MemsimStat requested;      /* callers' un-rounded bytes */
    MemsimStat inactive_split; /* bytes of free blocks inside partly used segments */
    MemsimStat segments;       /* driver segments (count) */
    MemsimStat allocations;    /* live blocks (count) */
    uint64_t n_device_alloc;   /* cudaMalloc / map calls */
    uint64_t n_device_free;    /* cudaFree / unmap calls */
    uint64_t n_alloc_retries;
    uint64_t n_ooms;
    uint64_t n_sync_all_streams;
} MemsimAllocStats;

/* Free-space shape at a moment (computed on demand; may walk every block). */
typedef struct {
    memsim_size_t largest_free;  /* largest free block */
    memsim_size_t free_bytes;    /* reserved − allocated in free blocks */
    uint64_t n_free_blocks;
    uint64_t n_segments;
} MemsimAllocShape;

/* A block as a policy's foreach_block lists it (the layout a snapshot's `segments` show). */
typedef enum {
    MEMSIM_BLOCK_FREE = 0,     /* cached, reusable */
    MEMSIM_BLOCK_ALLOCATED,    /* handed out */
    MEMSIM_BLOCK_PENDING_FREE, /* freed by the program, waiting for stream events */
    MEMSIM_BLOCK_UNMAPPED,     /* a range of an expandable segment with no pages mapped */
} MemsimBlockState;

typedef struct {
    memsim_addr_t segment;      /* its segment's base (expandable: the VA reservation's) */
    memsim_size_t segment_size; /* (expandable: the whole reservation) */
    uint32_t stream;            /* the segment's stream */
    uint32_t segment_flags;     /* MemsimSegmentFlags */
    memsim_addr_t addr;
    memsim_size_t size;
    memsim_size_t requested;    /* the last request it served (stale when free, 0 if none) */
    uint32_t state;             /* MemsimBlockState */
} MemsimBlockInfo;

typedef void (*MemsimBlockFunc)(void *user, const MemsimBlockInfo *block);

typedef struct MemsimAllocOps {
    const char *name;
    const char *description;
    /* The settings it accepts, one per line "key=value  meaning" (may be NULL). */
    const char *settings_help;
    /* Returns new state, or NULL with error set for bad settings. `dev` outlives the state. */
    void *(*create)(const char *settings, MemsimDevice *dev, GError **error);
    void (*destroy)(void *state);
    /* Allocates `size` (> 0) bytes on `stream`. */
    MemsimAllocResult (*malloc)(void *state, memsim_size_t size, uint32_t stream,
                                memsim_addr_t *addr);
    void (*free)(void *state, memsim_addr_t addr);
    /* (optional) record_stream: the block at addr is also used on `stream`. Default: no-op. */
    void (*record_stream)(void *state, memsim_addr_t addr, uint32_t stream);
    /* (optional) empty_cache. Default: no-op. */
    void (*empty_cache)(void *state);
    MemsimAllocStats (*stats)(void *state);
    /* (optional) Free-space shape. Default: zeros. */
    MemsimAllocShape (*shape)(void *state);
    /* (optional) Sets every peak to its current value. */
    void (*reset_peaks)(void *state);
    /* (optional) Checks every internal invariant; FALSE with a message if one is broken. */
    gboolean (*check)(void *state, GError **error);
    /* (optional) Starting state of a recording that begins mid-run: a segment that exists,
     * then the blocks allocated in it. FALSE with error if the policy cannot represent it. */
    gboolean (*seed_segment)(void *state, memsim_addr_t addr, memsim_size_t size,
                             uint32_t stream, uint32_t segment_flags, GError **error);
    gboolean (*seed_block)(void *state, memsim_addr_t addr, memsim_size_t block_size,
                           memsim_size_t requested, uint32_t stream, GError **error);
    /* (optional) The size a request is rounded to. Default: up to a multiple of 512. */
    memsim_size_t (*round_size)(void *state, memsim_size_t size);
    /* (optional) The live statistics, without a copy (valid until the next call on the
     * instance). Default: stats() copied into the instance. */
    const MemsimAllocStats *(*stats_live)(void *state);
    /* (optional) TRUE when stats_live returns the same pointer for the instance's lifetime,
     * so that a caller may keep it and read it after each operation. */
    gboolean stats_live_fixed;
    /* (optional) Calls fn for every block: the blocks of one segment one after another, in
     * address order, covering it; segments in any order. Default: the policy cannot list
     * its blocks (memsim_alloc_foreach_block returns FALSE). */
    void (*foreach_block)(void *state, MemsimBlockFunc fn, void *user);
} MemsimAllocOps;

/* The registry: a NULL-terminated array of every policy; static, never freed. Safe to call
 * from any thread (initialised once). */
MEMSIM_API const MemsimAllocOps *const *memsim_alloc_registry(void);
/* Finds a policy by name; NULL if unknown. The table is static. */
MEMSIM_API const MemsimAllocOps *memsim_alloc_find(const char *name);

/* An instance of a policy, with the optional entries filled by defaults. */
typedef struct MemsimAlloc MemsimAlloc;

/* Parses "name" or "name:key=value,..." (for `torch`, also the PYTORCH_CUDA_ALLOC_CONF form
 * "name:key:value,..."). Returns a new instance or NULL with error set. `dev` must outlive
 * the instance; a NULL dev means an unlimited device owned by the instance. */
MEMSIM_API MemsimAlloc *memsim_alloc_new_from_spec(const char *spec, MemsimDevice *dev, GError **error);
/* An instance of `ops` (from the registry) with its settings string ("key=value,..."; NULL
 * or "" = the defaults). Returns a new instance (memsim_alloc_free_instance) or NULL with a
 * MEMSIM_ERROR_BAD_INPUT error naming the bad setting. `dev` as above. */
MEMSIM_API MemsimAlloc *memsim_alloc_new(const MemsimAllocOps *ops, const char *settings, MemsimDevice *dev,
                              GError **error);
/* Frees the instance and its state (not a caller's `dev`); NULL is accepted. */
MEMSIM_API void memsim_alloc_free_instance(MemsimAlloc *a);
/* The policy's table (static). */
MEMSIM_API const MemsimAllocOps *memsim_alloc_ops(MemsimAlloc *a);
/* The operations of MemsimAllocOps, with the defaults of its optional entries. malloc:
 * `size` > 0; MEMSIM_ALLOC_OOM (and *addr untouched) when the device cannot provide the
 * memory. free, record_stream: `addr` must be a live block malloc returned (anything else
 * is the caller's bug: policies assert or log a critical warning). An instance is not
 * thread-safe: one thread at a time. */
MEMSIM_API MemsimAllocResult memsim_alloc_malloc(MemsimAlloc *a, memsim_size_t size, uint32_t stream,
                                      memsim_addr_t *addr);
MEMSIM_API void memsim_alloc_free(MemsimAlloc *a, memsim_addr_t addr);
MEMSIM_API void memsim_alloc_record_stream(MemsimAlloc *a, memsim_addr_t addr, uint32_t stream);
MEMSIM_API void memsim_alloc_empty_cache(MemsimAlloc *a);
MEMSIM_API MemsimAllocStats memsim_alloc_stats(MemsimAlloc *a);
/* The statistics without a copy: owned by the instance, valid until its next call. */
MEMSIM_API const MemsimAllocStats *memsim_alloc_stats_live(MemsimAlloc *a);
MEMSIM_API MemsimAllocShape memsim_alloc_shape(MemsimAlloc *a);
/* TRUE when every invariant holds (or the policy has no checker); FALSE with a message
 * naming the broken one. */
MEMSIM_API gboolean memsim_alloc_check(MemsimAlloc *a, GError **error);
/* The starting state of a recording that begins mid-run: FALSE with
 * MEMSIM_ERROR_UNSUPPORTED when the policy cannot start from one, or with BAD_INPUT when the
 * state is inconsistent (a block outside its segment, an overlap). */
MEMSIM_API gboolean memsim_alloc_seed_segment(MemsimAlloc *a, memsim_addr_t addr, memsim_size_t size,
                                   uint32_t stream, uint32_t segment_flags, GError **error);
MEMSIM_API gboolean memsim_alloc_seed_block(MemsimAlloc *a, memsim_addr_t addr, memsim_size_t block_size,
                                 memsim_size_t requested, uint32_t stream, GError **error);
/* The size a request of `size` bytes takes (default: up to a multiple of 512). */
MEMSIM_API memsim_size_t memsim_alloc_round_size(MemsimAlloc *a, memsim_size_t size);
/* Lists the blocks (see MemsimAllocOps.foreach_block); FALSE if the policy cannot. */
MEMSIM_API gboolean memsim_alloc_foreach_block(MemsimAlloc *a, MemsimBlockFunc fn, void *user);

/* Helpers for policies: ask the device for an address (its hook, or the default bump
 * pointer), report an event to its on_event hook, record and query a stream event (the
 * defaults of MemsimDevice). */
MEMSIM_API memsim_addr_t memsim_device_segment_addr(MemsimDevice *dev, memsim_size_t size, uint32_t stream);
MEMSIM_API void memsim_device_emit(MemsimDevice *dev, MemsimAllocEventKind kind, memsim_addr_t addr,
                        memsim_size_t size, uint32_t stream);
MEMSIM_API uint64_t memsim_device_record_event(MemsimDevice *dev, uint32_t stream);
MEMSIM_API gboolean memsim_device_event_done(MemsimDevice *dev, uint32_t stream, uint64_t token);

/* Stat helpers: increase updates the peak. */
static inline void memsim_stat_add(MemsimStat *s, int64_t n)
{
    s->current += n;
    if (s->current > s->peak)
        s->peak = s->current;
}
static inline void memsim_stat_sub(MemsimStat *s, int64_t n)
{
    s->current -= n;
}

G_END_DECLS

#endif
