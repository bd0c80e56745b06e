/* memsim — the trace: the one contract between importers, the generator and the simulator.
 *
 *     MemsimTrace *t = memsim_trace_new("my run");
 *     guint32 r = memsim_trace_add_rank(t, 0, 1);              // device 0, multiplicity 1
 *     MemsimEvent ev = {.kind = MEMSIM_EV_ALLOC, .id = 1, .size = 4096,
 *                       .category = MEMSIM_CAT_ACTIVATION};
 *     memsim_trace_append(t, r, &ev, 1);
 *     ...
 *     memsim_trace_free(t);
 *
 * A trace is a header (MemsimTraceHeader) plus, for each rank, one ordered program of
 * events. Each event names the stream it runs on; the simulator splits a rank's program into
 * its per-stream programs. Tensors are named by integer ids, never by addresses; addresses
 * belong to the allocator. Events that only record what a real allocator did (the
 * MEMSIM_EV_SEG_* family, MEMSIM_EV_OOM, the recorded address of an ALLOC) are never
 * needed to simulate: they let `replay --verify` check the model against the recording.
 *
 * Streams are small per-rank indices ordered as the real stream handles are (the legacy
 * default stream, 0, first); the handle values themselves are kept in MemsimRankInfo.
 */
#ifndef MEMSIM_TRACE_H
#define MEMSIM_TRACE_H

#include <glib.h>

#include <memsim/api.h>
#include <stdint.h>

G_BEGIN_DECLS

/* Simulated addresses and sizes: integers, never host pointers. */
typedef uint64_t memsim_addr_t;
typedef uint64_t memsim_size_t;

typedef enum {
    MEMSIM_EV_ALLOC = 1,     /* id=tensor, size=requested bytes, stream, category; addr=recorded
                                address when flags has MEMSIM_EVF_ADDR; aux (snapshots) = the
                                string index + 1 of its Python stack ("FILE:LINE NAME" lines,
                                innermost first; the replay's allocation site), 0 = none */
    MEMSIM_EV_FREE = 2,      /* id=tensor: the program drops it (free_requested) */
    MEMSIM_EV_USE = 3,       /* id=tensor used on `stream` too (record_stream) */
    MEMSIM_EV_OP = 4,        /* id=op index into the header's op table; stream */
    MEMSIM_EV_WAIT = 5,      /* `stream` waits for stream `id`'s progress so far */
    MEMSIM_EV_COLLECTIVE = 6,/* size=bytes, id=group, aux=MemsimCollectiveKind; stream; a send
                                or recv with MEMSIM_EVF_PEER: addr=the rank at the other end */
    MEMSIM_EV_EMPTY_CACHE = 7, /* torch.cuda.empty_cache() */
    MEMSIM_EV_MARK = 8,      /* id=string index: step or phase boundary */
    /* What a real allocator was seen to do (imported recordings), checked by --verify. Each
     * one precedes, in program order, the ALLOC or EMPTY_CACHE event that caused it. */
    MEMSIM_EV_SEG_ALLOC = 9,   /* addr, size: cudaMalloc of a segment */
    MEMSIM_EV_SEG_FREE = 10,   /* addr, size: cudaFree of a segment */
    MEMSIM_EV_SEG_MAP = 11,    /* addr, size: pages mapped into an expandable segment */
    MEMSIM_EV_SEG_UNMAP = 12,  /* addr, size: pages unmapped */
    MEMSIM_EV_OOM = 13,        /* size=rounded request that failed, addr=device free bytes */
    /* The starting state of a trace that begins mid-run (ring buffer), before any other
     * event of the rank. */
    MEMSIM_EV_INIT_SEGMENT = 14, /* addr, size, stream; aux=MemsimSegmentFlags */
    MEMSIM_EV_INIT_BLOCK = 15,   /* id=tensor, addr, size=requested, aux=block bytes, stream:
                                    a block already allocated at the start */
    /* A steady state (generated traces): the next `size` events (a unit: one micro-batch)
     * run once and then `aux` more times, the r-th repetition with every tensor id ≥ `id`
     * (in ALLOC, FREE, USE) increased by r × `addr`. After the last repetition the ids its
     * live tensors got are taken back by aux × `addr`, so that the events after it name them
     * as they name the unit's. A unit may be whole steps: a "step N" MARK in the r-th
     * repetition names step N + r × (the step marks the unit holds), so that each repetition
     * is a step of its own. With MEMSIM_EVF_STEPS the unit may hold repeats of its own (a
     * step's micro-batches), written as they are: the `size` events count them unexpanded,
     * and each repetition moves their `id` as it moves tensor ids. aux = 0: the unit runs
     * once (a boundary, nothing repeats). A trace that ends before the unit does is refused
     * by the replay, naming the REPEAT. */
    MEMSIM_EV_REPEAT = 16,
} MemsimEventKind;

#define MEMSIM_EV_KIND_MAX 16

typedef enum {
    MEMSIM_EVF_ADDR = 1u << 0,     /* ALLOC: `addr` holds the recorded address */
    MEMSIM_EVF_INFERRED = 1u << 1, /* EMPTY_CACHE: inferred from recorded segment frees */
    MEMSIM_EVF_HOST = 1u << 2,     /* WAIT: the host blocks until stream `id` is done */
    MEMSIM_EVF_PEER = 1u << 3,     /* COLLECTIVE send/recv: `addr` is the peer, an index into
                                      the header's ranks; the k-th send from A to B meets the
                                      k-th recv on B from A */
    MEMSIM_EVF_STEPS = 1u << 4,    /* REPEAT: a unit of whole steps, which may hold repeats of
                                      its own (a step's micro-batches); it holds no send or
                                      recv and no other repeat of steps */
} MemsimEventFlags;

typedef enum {
    MEMSIM_SEGF_SMALL = 1u << 0,      /* belongs to the small pool */
    MEMSIM_SEGF_EXPANDABLE = 1u << 1, /* a mapped range of an expandable segment */
} MemsimSegmentFlags;

typedef enum {
    MEMSIM_CAT_OTHER = 0,
    MEMSIM_CAT_PARAMETER,
    MEMSIM_CAT_GRADIENT,
    MEMSIM_CAT_OPTIMIZER_STATE,
    MEMSIM_CAT_ACTIVATION,
    MEMSIM_CAT_TEMPORARY,
    MEMSIM_CAT_COMM_BUFFER,
    MEMSIM_CAT_INPUT,
    MEMSIM_CAT_KV_CACHE,
    MEMSIM_CAT_COUNT
} MemsimCategory;

typedef enum {
    MEMSIM_COLL_ALL_REDUCE = 0,
    MEMSIM_COLL_ALL_GATHER,
    MEMSIM_COLL_REDUCE_SCATTER,
    MEMSIM_COLL_BROADCAST,
    MEMSIM_COLL_SEND,
    MEMSIM_COLL_RECV,
    MEMSIM_COLL_ALL_TO_ALL,
    MEMSIM_COLL_COUNT
} MemsimCollectiveKind;

typedef enum {
    MEMSIM_PHASE_OTHER = 0,
    MEMSIM_PHASE_FORWARD,
    MEMSIM_PHASE_BACKWARD,
    MEMSIM_PHASE_OPTIMIZER,
    MEMSIM_PHASE_COMMUNICATION,
    MEMSIM_PHASE_COUNT
} MemsimPhase;

/* One event: 40 bytes, plain data. Field use per kind is listed in MemsimEventKind. */
typedef struct {
    uint8_t kind;     /* MemsimEventKind */
    uint8_t category; /* MemsimCategory (ALLOC, INIT_BLOCK) */
    uint16_t stream;  /* per-rank stream index */
    uint32_t flags;   /* MemsimEventFlags */
    uint64_t id;
    uint64_t size;
    uint64_t addr;
    uint64_t aux;
} MemsimEvent;

/* An operator of the op table (OP events refer to it by index). */
typedef struct {
    uint32_t name;       /* index into the header's string table */
    uint8_t phase;       /* MemsimPhase */
    int32_t layer;       /* -1 when not inside a layer */
    int32_t microbatch;  /* -1 when not applicable */
    double duration_us;  /* estimated duration on its stream; 0 when unknown */
    uint8_t bound;       /* MemsimOpBound: what sets the duration (generated traces) */
} MemsimOpInfo;

/* What set a generated op's duration (MemsimOpInfo.bound): its FLOPs at the achievable rate
 * (over its GEMM's waves), its memory traffic at the HBM bandwidth, or the shortest kernel;
 * UNKNOWN for recorded traces and untimed ops. HOST: no kernel — the duration is the host's
 * own time (a framework module's Python beyond the ops it dispatches), which the replay adds
 * to the host's clock, not to a stream. The trace formats carry it (`.mst` Op.bound, the text
 * format's opinfo bound=), so a written trace replays as the generated one does. */
typedef enum {
    MEMSIM_BOUND_UNKNOWN = 0,
    MEMSIM_BOUND_COMPUTE,
    MEMSIM_BOUND_MEMORY,
    MEMSIM_BOUND_LATENCY,
    MEMSIM_BOUND_HOST,
    MEMSIM_BOUND_COUNT
} MemsimOpBound;

typedef struct {
    uint32_t device;       /* device index (the `rank` of reports) */
    uint32_t multiplicity; /* how many identical ranks this program stands for */
    char *role;            /* e.g. "stage 0", or NULL */
    uint32_t n_streams;
    uint64_t *stream_handles; /* real handle value per stream index (snapshots), may be NULL */
    /* What the recording says the allocator held at its end (imported snapshots only), for
     * --verify; has_final is FALSE otherwise. */
    gboolean has_final;
    uint64_t final_reserved;
    uint64_t final_allocated;
    /* Generated traces: the most host (CPU) memory the rank's program holds at once —
     * parameters, gradients, optimizer state offloaded to the CPU (0 = none, or unknown). */
    uint64_t host_peak;
    /* Snapshots with a recorded OOM: the device bytes the allocator could have had — what it
     * held then plus what the driver reported free (the OOM record's device_free); 0 =
     * unknown. The replay's capacity for this rank when none is given. */
    uint64_t capacity;
    /* Snapshots: recorded facts that contradict the recording's own state (a free of an
     * address nothing holds, a block state that does not exist, a segment's allocated_size
     * beyond its size), imported anyway, each with a warning (MemsimTraceHeader.warnings);
     * --verify counts each as a mismatch. Not carried by the trace formats. */
    uint64_t n_inconsistent;
} MemsimRankInfo;

typedef struct {
    char *name;         /* where the trace came from */
    char *alloc_conf;   /* recorded allocator settings (PYTORCH_CUDA_ALLOC_CONF form), or NULL */
    uint64_t capacity;  /* device bytes available to the allocator, 0 = unknown */
    uint32_t n_ranks;
    MemsimRankInfo *ranks;
    uint32_t n_strings;
    char **strings;     /* op names, MARK texts */
    uint32_t n_ops;
    MemsimOpInfo *ops;
    /* What an importer found odd but read anyway (unknown trace actions, inconsistent
     * recorded state), one line each naming the file and the record; NULL-terminated, or
     * NULL for none. Not carried by the trace formats. */
    char **warnings;
} MemsimTraceHeader;

/* An in-memory trace: a header plus one event array per rank. */
typedef struct MemsimTrace MemsimTrace;

/* Returns a new empty trace; free it with memsim_trace_free(). `name` is copied. */
MEMSIM_API MemsimTrace *memsim_trace_new(const char *name);
/* Frees the trace, its header and its events (NULL is accepted). */
MEMSIM_API void memsim_trace_free(MemsimTrace *trace);
/* The header; owned by the trace, valid until it is freed or changed. */
MEMSIM_API MemsimTraceHeader *memsim_trace_header(MemsimTrace *trace);
/* Adds a rank with one stream; returns its index. */
MEMSIM_API guint32 memsim_trace_add_rank(MemsimTrace *trace, guint32 device, guint32 multiplicity);
/* Interns a string (copied; the same string gets the same index); returns its index. */
MEMSIM_API guint32 memsim_trace_intern(MemsimTrace *trace, const char *s);
/* Adds an op (copied); returns its index. */
MEMSIM_API guint32 memsim_trace_add_op(MemsimTrace *trace, const MemsimOpInfo *op);
/* Appends a copy of n events to a rank's program (the rank's n_streams grows to cover
 * them). `rank` must be one memsim_trace_add_rank() returned. */
MEMSIM_API void memsim_trace_append(MemsimTrace *trace, guint32 rank, const MemsimEvent *events, gsize n);
/* Appends a GArray of MemsimEvent as memsim_trace_append does, taking the caller's reference
 * to it: when the rank's program is still empty, the array becomes the program without a
 * copy (a generator's buffer handed over whole). */
MEMSIM_API void memsim_trace_append_array(MemsimTrace *trace, guint32 rank, GArray *events);
/* From now on a rank's whole program handed over at once (memsim_trace_append_array to an
 * empty program: what the generator does when a rank's program is complete) is written to a
 * file of its own in `dir` (which must exist) and dropped from memory, so that a trace of many
 * ranks holds one rank's events at a time; memsim_trace_save streams it back into its file,
 * memsim_trace_free deletes it. Such a rank's events are not in memory: memsim_trace_events
 * gives none. */
MEMSIM_API void memsim_trace_spill_to(MemsimTrace *trace, const char *dir);
/* The file rank's program went to, or NULL (in memory; or with `error` set, when writing one
 * failed: the first such error). Owned by the trace. */
MEMSIM_API const char *memsim_trace_spilled(MemsimTrace *trace, guint32 rank, GError **error);
/* The events of a rank and their count; owned by the trace, valid until the next append
 * to it or memsim_trace_free(). */
MEMSIM_API const MemsimEvent *memsim_trace_events(MemsimTrace *trace, guint32 rank, gsize *n_events);

/* Header helpers (shared by readers and the in-memory trace). clear frees everything the
 * header owns and zeroes it (NULL is accepted); copy makes `dst` (uninitialised or cleared:
 * its old contents are not freed) a deep copy of `src`, to be released with clear. */
MEMSIM_API void memsim_trace_header_clear(MemsimTraceHeader *h);
MEMSIM_API void memsim_trace_header_copy(MemsimTraceHeader *dst, const MemsimTraceHeader *src);

/* Value → name ("alloc", "activation", "forward", "all_reduce", ...): static strings, never
 * freed; "?" for a value out of range. */
MEMSIM_API const char *memsim_event_kind_name(MemsimEventKind kind);
MEMSIM_API const char *memsim_category_name(MemsimCategory cat);
MEMSIM_API const char *memsim_phase_name(MemsimPhase phase);
MEMSIM_API const char *memsim_collective_name(MemsimCollectiveKind kind);
MEMSIM_API const char *memsim_op_bound_name(MemsimOpBound bound);

/* What a MARK's text means to the replay and the reports. */
typedef enum {
    MEMSIM_MARK_LABEL,     /* a label only ("prefill", "decode", a recording's "snapshot") */
    MEMSIM_MARK_STEP,      /* "step N" (or "step N begin"): step N begins */
    MEMSIM_MARK_BREAKDOWN, /* "breakdown:NAME": the live bytes by category, kept as NAME */
} MemsimMarkKind;

/* The breakdowns the generator marks: the model state after the last optimizer step (the
 * planner reads it), and what a pipeline stage holds after its first forward. */
#define MEMSIM_BREAKDOWN_MODEL_STATE "model state at the optimizer step"
#define MEMSIM_BREAKDOWN_FIRST_FORWARD "after the first forward"

/* The kind of a mark's text; *step gets a step's number, *name a breakdown's name (pointing
 * into `text`). Either may be NULL. */
MEMSIM_API MemsimMarkKind memsim_mark_parse(const char *text, uint32_t *step, const char **name);
/* How many of the n events are MARKs that open a step ("step N"; a string index out of the
 * header's table counts as none): a unit of whole steps holds that many (MEMSIM_EV_REPEAT). */
MEMSIM_API uint32_t memsim_step_marks(const MemsimTraceHeader *h, const MemsimEvent *ev, gsize n);
/* The text of the mark that opens step N, or that asks for the breakdown NAME; newly
 * allocated (g_free). */
MEMSIM_API char *memsim_mark_step(uint32_t step);
MEMSIM_API char *memsim_mark_breakdown(const char *name);
/* Name → value; return -1 when unknown. */
MEMSIM_API int memsim_event_kind_from_name(const char *name);
MEMSIM_API int memsim_category_from_name(const char *name);
MEMSIM_API int memsim_phase_from_name(const char *name);
MEMSIM_API int memsim_collective_from_name(const char *name);
MEMSIM_API int memsim_op_bound_from_name(const char *name);

G_END_DECLS

#endif
