/* PyTorch memory snapshot → memsim trace (formats/snapshot.h).
 *
 * The snapshot schema is the one of TORCH_ALLOCATOR.md §11: `segments` (all devices, each
 * with its `blocks`), `device_traces` (one list of trace entries per device, oldest first)
 * and `allocator_settings`; the legacy layout (blocks without `address`, a `history` list
 * instead) is read too. The file is untrusted: every field is type- and range-checked and
 * an error names the file and the record (e.g. "device_traces[0][42].size").
 *
 * Each trace entry becomes events of the trace contract:
 *   alloc          → ALLOC (new tensor id, recorded address kept for --verify)
 *   free_requested → FREE of the tensor at that address
 *   free_completed → nothing (the model decides when memory becomes reusable)
 *   segment_alloc / segment_map → SEG_ALLOC / SEG_MAP records before the ALLOC they serve
 *   segment_free / segment_unmap runs → SEG_FREE / SEG_UNMAP records, then one inferred
 *                    EMPTY_CACHE (the OOM path releases exactly what empty_cache releases, so
 *                    both readings of such a run leave the same state)
 *   oom            → OOM record; snapshot → MARK
 *   user_defined   → nothing (annotations); any other action → skipped, with one warning
 *                    per action and its count (MemsimTraceHeader.warnings)
 *
 * What contradicts the recording's own state — a free of an address no segment holds, a
 * block state torch does not have, a segment's allocated_size beyond its size — is read
 * anyway with a warning, and counted (MemsimRankInfo.n_inconsistent) for --verify to report
 * as mismatches; a recorded OOM gives the rank its capacity (what the allocator held then
 * plus the driver's device_free).
 *
 * Ring buffers make many traces begin mid-run. The starting state is rebuilt by walking the
 * trace backwards from the final segments: segments freed in the trace existed at the start
 * and those allocated in it did not; blocks freed before being allocated were live at the
 * start. A live block's size is known from the final state when it survives; otherwise it
 * is its rounded request, or the whole space up to the next live block when the remainder
 * would have been too small to split off (large pool: ≤ 1 MiB; TORCH_ALLOCATOR.md §3.4).
 */
#include "formats/snapshot.h"
#include "formats/torch_settings.h"

#include <memsim/error.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define SMALL_SEGMENT ((uint64_t)2 << 20) /* kSmallBuffer: only small-pool segments have it */
#define ONE_MIB ((uint64_t)1 << 20)
/* Device indices are below this, and device_traces has at most this many lists: each device
 * becomes a rank, and a rank costs the replay tens of KiB however small its trace. */
#define MAX_DEVICES 4096u


typedef struct {
    const char *file;
    GError **error;
    MemsimSnapOdd *odd;   /* the odd facts met */
    MemsimTrace *t;       /* where stacks are interned */
} Ctx;


/* Notes an odd fact of kind `kind` at `where`; `device` >= 0 counts it as an inconsistency of
 * that device's recording (--verify then reports a mismatch). */
static void odd(Ctx *c, int64_t device, const char *kind, const char *where, const char *fmt,
                ...) G_GNUC_PRINTF(5, 6);

static void odd(Ctx *c, int64_t device, const char *kind, const char *where, const char *fmt,
                ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    memsim_snap_odd_note(c->odd, device, kind, where, msg);
}

static gboolean fail(Ctx *c, const char *where, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static gboolean fail(Ctx *c, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(c->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s: %s", c->file, where,
                msg);
    return FALSE;
}

/* " (byte N)" where the value was made, or nothing for a shared value (None, a bool, a
 * small int); in `buf`. */
static const char *at_byte(const MemsimPyValue *v, char buf[40])
{
    if (v->offset == MEMSIM_PY_NO_OFFSET)
        return "";
    g_snprintf(buf, 40, " (byte %" G_GUINT64_FORMAT ")", v->offset);
    return buf;
}

/* An integer field that must be present, non-negative and (optionally) positive. */
static gboolean get_u64(Ctx *c, const MemsimPyValue *d, const char *key, const char *where,
                        gboolean required, uint64_t *out)
{
    const MemsimPyValue *v = memsim_py_dict_get(d, key);
    if (!v) {
        if (!required)
            return TRUE;
        return fail(c, where, "missing key '%s'", key);
    }
    char buf[40];
    if (v->type == MEMSIM_PY_BIGINT)
        return fail(c, where, "'%s' does not fit in 64 bits%s", key, at_byte(v, buf));
    if (v->type != MEMSIM_PY_INT)
        return fail(c, where, "'%s' is a %s, expected an int%s", key,
                    memsim_py_type_name(v->type), at_byte(v, buf));
    if (v->v.i < 0)
        return fail(c, where, "'%s' is negative (%" G_GINT64_FORMAT ")", key, v->v.i);
    *out = (uint64_t)v->v.i;
    return TRUE;
}

static const char *get_str(const MemsimPyValue *d, const char *key)
{
    const MemsimPyValue *v = memsim_py_dict_get(d, key);
    return v && v->type == MEMSIM_PY_STR ? v->v.str.data : NULL;
}

static gboolean expect(Ctx *c, const MemsimPyValue *v, MemsimPyType t, const char *where)
{
    if (!v)
        return fail(c, where, "missing");
    char buf[40];
    if (v->type != t && !(t == MEMSIM_PY_LIST && v->type == MEMSIM_PY_TUPLE))
        return fail(c, where, "is a %s, expected a %s%s", memsim_py_type_name(v->type),
                    memsim_py_type_name(t), at_byte(v, buf));
    return TRUE;
}

/* A record (segment, block, trace entry, a device's trace or a segment's blocks) that the
 * pickle holds more than once, through memo references, is refused: PyTorch makes each one
 * a new object, and a shared one would let a few bytes stand for any number of records. */
static gboolean once(Ctx *c, const MemsimPyValue *v, const char *where)
{
    if (!v->repeated || v->offset == MEMSIM_PY_NO_OFFSET) /* the reader's own empty tuple */
        return TRUE;
    char buf[40];
    return fail(c, where, "this %s%s appears more than once (through memo references): a "
                "snapshot writes each record once", memsim_py_type_name(v->type),
                at_byte(v, buf));
}

typedef struct {
    uint64_t addr, size, requested;
    gboolean allocated;
    gboolean pending; /* active_pending_free: freed by the program, its memory not yet back */
} Block;

typedef struct {
    uint64_t device, addr, size, stream;
    gboolean small, expandable;
    uint64_t allocated_size;
    GArray *blocks; /* Block */
} Segment;

static void segment_clear(gpointer p)
{
    Segment *s = p;
    if (s->blocks)
        g_array_unref(s->blocks);
}

/* ---- allocator settings → PYTORCH_CUDA_ALLOC_CONF string ---- */

static char *settings_string(Ctx *c, const MemsimPyValue *s)
{
    if (!s || s->type != MEMSIM_PY_DICT)
        return NULL;
    const char *conf = get_str(s, "PYTORCH_CUDA_ALLOC_CONF");
    GString *g = g_string_new(NULL);
    /* The recorded fields are the settings in force; the environment string may hold keys
     * the fields do not show, so start from it and let the fields win. */
    const MemsimPyValue *v;
    if ((v = memsim_py_dict_get(s, "expandable_segments")) && v->type == MEMSIM_PY_BOOL)
        g_string_append_printf(g, "%sexpandable_segments:%s", g->len ? "," : "",
                               v->v.b ? "True" : "False");
    if ((v = memsim_py_dict_get(s, "max_split_size")) && v->type == MEMSIM_PY_INT && v->v.i > 0)
        g_string_append_printf(g, "%smax_split_size_mb:%" G_GINT64_FORMAT, g->len ? "," : "",
                               v->v.i >> 20);
    if ((v = memsim_py_dict_get(s, "garbage_collection_threshold")) &&
        v->type == MEMSIM_PY_FLOAT && v->v.f > 0) {
        char buf[G_ASCII_DTOSTR_BUF_SIZE];
        g_string_append_printf(g, "%sgarbage_collection_threshold:%s", g->len ? "," : "",
                               g_ascii_dtostr(buf, sizeof buf, v->v.f));
    }
    if ((v = memsim_py_dict_get(s, "roundup_power2_divisions")) && v->type == MEMSIM_PY_DICT) {
        /* Keys "1".."32768" (2^i ↔ table entry i, i.e. sizes from 2^i MiB). */
        GString *list = g_string_new(NULL);
        gboolean any = FALSE;
        for (gsize i = 0; i < v->v.dict.n; i++) {
            const MemsimPyValue *k = v->v.dict.keys[i], *d = v->v.dict.values[i];
            if (k->type != MEMSIM_PY_STR || d->type != MEMSIM_PY_INT || d->v.i < 0)
                continue;
            if (d->v.i > 0)
                any = TRUE;
            g_string_append_printf(list, "%s%s:%" G_GINT64_FORMAT, list->len ? "," : "",
                                   k->v.str.data, d->v.i);
        }
        if (any)
            g_string_append_printf(g, "%sroundup_power2_divisions:[%s]", g->len ? "," : "",
                                   list->str);
        g_string_free(list, TRUE);
    }
    if (conf && *conf) {
        /* Keys only the environment string carries (e.g. max_non_split_rounding_mb). */
        g_auto(GStrv) parts = g_strsplit(conf, ",", -1);
        for (char **p = parts; *p; p++) {
            g_autofree char *t = g_strstrip(g_strdup(*p));
            if (g_str_has_prefix(t, "max_non_split_rounding_mb") ||
                g_str_has_prefix(t, "per_process_memory_fraction"))
                g_string_append_printf(g, "%s%s", g->len ? "," : "", t);
        }
    }
    (void)c;
    if (g->len == 0) {
        g_string_free(g, TRUE);
        return conf && *conf ? g_strdup(conf) : NULL;
    }
    return g_string_free(g, FALSE);
}

/* ---- segments ---- */

static gboolean read_segments(Ctx *c, const MemsimPyValue *segs, GArray *out)
{
    if (!expect(c, segs, MEMSIM_PY_LIST, "segments"))
        return FALSE;
    for (gsize i = 0; i < segs->v.seq.n; i++) {
        char where[64];
        g_snprintf(where, sizeof where, "segments[%zu]", i);
        const MemsimPyValue *s = segs->v.seq.items[i];
        if (!expect(c, s, MEMSIM_PY_DICT, where) || !once(c, s, where))
            return FALSE;
        Segment seg = {0};
        if (!get_u64(c, s, "device", where, FALSE, &seg.device) ||
            !get_u64(c, s, "address", where, TRUE, &seg.addr) ||
            !get_u64(c, s, "total_size", where, TRUE, &seg.size) ||
            !get_u64(c, s, "stream", where, FALSE, &seg.stream) ||
            !get_u64(c, s, "allocated_size", where, FALSE, &seg.allocated_size))
            return FALSE;
        if (seg.size == 0 || seg.addr + seg.size < seg.addr)
            return fail(c, where, "segment of %" G_GUINT64_FORMAT " bytes at 0x%" G_GINT64_MODIFIER
                        "x is empty or wraps around", seg.size, seg.addr);
        if (seg.allocated_size > seg.size)
            odd(c, (int64_t)seg.device, "segments whose allocated_size exceeds their size", where,
                "allocated_size %" G_GUINT64_FORMAT " > total_size %" G_GUINT64_FORMAT,
                seg.allocated_size, seg.size);
        const char *type = get_str(s, "segment_type");
        seg.small = type ? strcmp(type, "small") == 0 : seg.size == SMALL_SEGMENT;
        const MemsimPyValue *e = memsim_py_dict_get(s, "is_expandable");
        seg.expandable = e && e->type == MEMSIM_PY_BOOL && e->v.b;
        const MemsimPyValue *blocks = memsim_py_dict_get(s, "blocks");
        char bwhere[80];
        g_snprintf(bwhere, sizeof bwhere, "%s.blocks", where);
        if (!expect(c, blocks, MEMSIM_PY_LIST, bwhere) || !once(c, blocks, bwhere))
            return FALSE;
        seg.blocks = g_array_new(FALSE, FALSE, sizeof(Block));
        uint64_t at = seg.addr;
        for (gsize j = 0; j < blocks->v.seq.n; j++) {
            g_snprintf(bwhere, sizeof bwhere, "%s.blocks[%zu]", where, j);
            const MemsimPyValue *b = blocks->v.seq.items[j];
            Block blk = {0};
            if (!expect(c, b, MEMSIM_PY_DICT, bwhere) || !once(c, b, bwhere) ||
                !get_u64(c, b, "size", bwhere, TRUE, &blk.size) ||
                !get_u64(c, b, "requested_size", bwhere, FALSE, &blk.requested)) {
                g_array_unref(seg.blocks);
                return FALSE;
            }
            blk.addr = at;
            if (!get_u64(c, b, "address", bwhere, FALSE, &blk.addr)) {
                g_array_unref(seg.blocks);
                return FALSE;
            }
            const char *state = get_str(b, "state");
            if (!state) {
                g_array_unref(seg.blocks);
                return fail(c, bwhere, "missing or non-string 'state'");
            }
            blk.allocated = strcmp(state, "inactive") != 0;
            blk.pending = strcmp(state, "active_pending_free") == 0;
            /* c10/cuda/CUDACachingAllocator.h BlockInfo and torch/csrc/cuda/Module.cpp
             * _cuda_memorySnapshot: a block is active_allocated, active_pending_free or
             * inactive */
            if (blk.allocated && !blk.pending && strcmp(state, "active_allocated") != 0)
                odd(c, (int64_t)seg.device, "blocks in a state that does not exist", bwhere,
                    "state '%.64s' (expected active_allocated, active_pending_free or "
                    "inactive), read as allocated", state);
            if (blk.addr != at || blk.size == 0 || blk.addr + blk.size > seg.addr + seg.size) {
                g_array_unref(seg.blocks);
                return fail(c, bwhere,
                            "block at 0x%" G_GINT64_MODIFIER "x of %" G_GUINT64_FORMAT
                            " bytes does not tile its segment (expected it at 0x%"
                            G_GINT64_MODIFIER "x)",
                            blk.addr, blk.size, at);
            }
            at += blk.size;
            g_array_append_val(seg.blocks, blk);
        }
        if (blocks->v.seq.n && at != seg.addr + seg.size) {
            g_array_unref(seg.blocks);
            return fail(c, where, "blocks cover %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT
                        " bytes", at - seg.addr, seg.size);
        }
        g_array_append_val(out, seg);
    }
    return TRUE;
}

/* ---- trace entries ---- */

typedef enum {
    A_ALLOC,
    A_FREE_REQUESTED,
    A_FREE_COMPLETED,
    A_SEGMENT_ALLOC,
    A_SEGMENT_FREE,
    A_SEGMENT_MAP,
    A_SEGMENT_UNMAP,
    A_OOM,
    A_SNAPSHOT,
    A_OTHER,
} Action;

typedef struct {
    Action action;
    uint64_t addr, size, stream;
    uint32_t stack;   /* alloc: its Python stack's string index + 1, 0 = none */
    uint8_t category; /* alloc: what its frames say it is */
    gsize index;      /* in its device's list (entries of unknown actions are not kept) */
} Entry;

/* An alloc's frames (innermost first): its Python frames as one interned string, one
 * "FILE:LINE NAME" a line (a stack is stored once however many allocs share it; the replay
 * picks the allocation site from it), and the category they show: optimizer state when a
 * frame under torch/optim/ comes before any of the program's own, a gradient made by
 * autograd's AccumulateGrad
 * (torch/csrc/autograd/functions/accumulate_grad.h). */
static void read_frames(Ctx *c, const MemsimPyValue *e, Entry *en)
{
    const MemsimPyValue *fr = memsim_py_dict_get(e, "frames");
    if (!fr || fr->type != MEMSIM_PY_LIST)
        return; /* recorded without stacks: no sites */
    GString *s = NULL;
    gboolean user = FALSE; /* a frame of the program's own code was met */
    for (gsize i = 0; i < fr->v.seq.n; i++) {
        const MemsimPyValue *f = fr->v.seq.items[i];
        if (f->type != MEMSIM_PY_DICT)
            continue;
        const char *file = get_str(f, "filename"), *name = get_str(f, "name");
        const MemsimPyValue *line = memsim_py_dict_get(f, "line");
        if (name && (strstr(name, "AccumulateGrad") || strstr(name, "accumulate_grad")) &&
            en->category == MEMSIM_CAT_OTHER)
            en->category = MEMSIM_CAT_GRADIENT;
        if (!file || !g_str_has_suffix(file, ".py"))
            continue; /* C++ frames are never the program's own */
        /* the optimizer's own allocation, not the program's code that an optimizer's
         * closure runs (Lightning's training step runs inside optimizer.step) */
        if (!user && strstr(file, "/torch/optim/") && en->category == MEMSIM_CAT_OTHER)
            en->category = MEMSIM_CAT_OPTIMIZER_STATE;
        /* torch/nn/modules/module.py Module._apply: a module's parameters and buffers moved
         * or cast (model.to(device), .half()) */
        if (!user && strstr(file, "/torch/nn/modules/module.py") && name &&
            strcmp(name, "_apply") == 0 && en->category == MEMSIM_CAT_OTHER)
            en->category = MEMSIM_CAT_PARAMETER;
        if (!strstr(file, "/torch/") && !strstr(file, "/site-packages/") &&
            !strstr(file, "/dist-packages/") && !strstr(file, "/lib/python3"))
            user = TRUE;
        if (!s)
            s = g_string_new(NULL);
        else if (s->len > 65536)
            break; /* deep enough */
        g_string_append_printf(s, "%s%s:%" G_GINT64_FORMAT " %s", s->len ? "\n" : "", file,
                               line && line->type == MEMSIM_PY_INT ? line->v.i : 0,
                               name ? name : "?");
    }
    /* an alloc without Python frames (the backward pass's, made by autograd's threads)
     * still has a site */
    en->stack = memsim_trace_intern(c->t, s ? s->str : "(no frames)") + 1;
    if (s)
        g_string_free(s, TRUE);
}

static Action parse_action(const char *a)
{
    static const struct {
        const char *name;
        Action a;
    } t[] = {
        {"alloc", A_ALLOC},
        {"free_requested", A_FREE_REQUESTED},
        {"free_completed", A_FREE_COMPLETED},
        {"segment_alloc", A_SEGMENT_ALLOC},
        {"segment_free", A_SEGMENT_FREE},
        {"segment_map", A_SEGMENT_MAP},
        {"segment_unmap", A_SEGMENT_UNMAP},
        {"oom", A_OOM},
        {"snapshot", A_SNAPSHOT},
        {"free", A_FREE_REQUESTED}, /* very old recordings */
    };
    for (gsize i = 0; i < G_N_ELEMENTS(t); i++)
        if (strcmp(a, t[i].name) == 0)
            return t[i].a;
    return A_OTHER;
}

static gboolean read_entries(Ctx *c, const MemsimPyValue *list, gsize dev, GArray *out)
{
    char where[80];
    g_snprintf(where, sizeof where, "device_traces[%zu]", dev);
    if (!expect(c, list, MEMSIM_PY_LIST, where) || !once(c, list, where))
        return FALSE;
    for (gsize i = 0; i < list->v.seq.n; i++) {
        g_snprintf(where, sizeof where, "device_traces[%zu][%zu]", dev, i);
        const MemsimPyValue *e = list->v.seq.items[i];
        if (!expect(c, e, MEMSIM_PY_DICT, where) || !once(c, e, where))
            return FALSE;
        const char *action = get_str(e, "action");
        if (!action)
            return fail(c, where, "missing or non-string 'action'");
        /* the whole string is the action ("free\0..." is no "free") */
        Entry en = {strlen(action) == memsim_py_dict_get(e, "action")->v.str.len
                        ? parse_action(action)
                        : A_OTHER,
                    0, 0, 0, 0, MEMSIM_CAT_OTHER, i};
        if (en.action == A_OTHER) {
            /* torch/csrc/cuda/Module.cpp _cuda_memorySnapshot: "user_defined" entries
             * (annotations) carry no allocator action; anything else is unknown here */
            if (strcmp(action, "user_defined") != 0) {
                g_autofree char *kind =
                    g_strdup_printf("trace entries of the unknown action '%.64s' skipped", action);
                odd(c, -1, kind, where, "action '%.64s'", action);
            }
            continue;
        }
        if (!get_u64(c, e, "size", where, en.action != A_SNAPSHOT, &en.size) ||
            !get_u64(c, e, "stream", where, FALSE, &en.stream))
            return FALSE;
        if (en.action == A_OOM) {
            if (!get_u64(c, e, "device_free", where, FALSE, &en.addr))
                return FALSE;
        } else if (en.action != A_SNAPSHOT &&
                   !get_u64(c, e, "addr", where, TRUE, &en.addr)) {
            return FALSE;
        }
        if (en.action != A_SNAPSHOT && en.action != A_OOM && en.addr + en.size < en.addr)
            return fail(c, where, "range at 0x%" G_GINT64_MODIFIER "x of %" G_GUINT64_FORMAT
                        " bytes wraps around", en.addr, en.size);
        if (en.size >= ((uint64_t)1 << 60) && en.action != A_SNAPSHOT)
            return fail(c, where, "size %" G_GUINT64_FORMAT " is beyond any device (≥ 2^60)",
                        en.size);
        if (en.action == A_ALLOC && c->t)
            read_frames(c, e, &en);
        g_array_append_val(out, en);
    }
    return TRUE;
}

/* ---- one device ---- */

typedef struct {
    uint64_t size;      /* block size, 0 = unknown */
    uint64_t requested;
} Live;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static guint16 stream_index(GArray *handles, uint64_t h)
{
    for (guint i = 0; i < handles->len; i++)
        if (g_array_index(handles, uint64_t, i) == h)
            return (guint16)i;
    g_assert_not_reached();
}

typedef struct {
    uint64_t addr, size, stream;
    gboolean small, expandable;
} StartSeg;

static gboolean build_device(Ctx *c, MemsimTrace *t, guint32 device, GArray *segs,
                             GArray *entries, const TorchSettings *rounder, uint64_t max_split)
{
    guint32 rank = memsim_trace_add_rank(t, device, 1);
    MemsimRankInfo *ri = &memsim_trace_header(t)->ranks[rank];

    /* Streams, ordered by handle value as the allocator orders them. */
    GArray *handles = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    GHashTable *seen = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
#define ADD_STREAM(h)                                                                          \
    do {                                                                                       \
        uint64_t h_ = (h);                                                                     \
        if (!g_hash_table_contains(seen, &h_)) {                                               \
            g_array_append_val(handles, h_);                                                   \
            g_hash_table_add(seen, g_memdup2(&h_, sizeof h_));                                 \
        }                                                                                      \
    } while (0)
    ADD_STREAM(0);
    uint64_t final_reserved = 0, final_allocated = 0;
    for (guint i = 0; i < segs->len; i++) {
        Segment *s = &g_array_index(segs, Segment, i);
        if (s->device != device)
            continue;
        ADD_STREAM(s->stream);
        final_reserved += s->size;
        for (guint j = 0; j < s->blocks->len; j++) {
            Block *b = &g_array_index(s->blocks, Block, j);
            if (b->allocated)
                final_allocated += b->size;
        }
    }
    for (guint i = 0; i < entries->len; i++)
        ADD_STREAM(g_array_index(entries, Entry, i).stream);
    g_hash_table_unref(seen);
#undef ADD_STREAM
    g_array_sort(handles, cmp_u64);
    if (handles->len > 65535) {
        g_array_unref(handles);
        return fail(c, "device_traces", "more than 65535 streams on device %u", device);
    }
    ri->n_streams = handles->len;
    ri->stream_handles = g_memdup2(handles->data, sizeof(uint64_t) * handles->len);
    ri->has_final = TRUE;
    ri->final_reserved = final_reserved;
    ri->final_allocated = final_allocated;

    gboolean ok = FALSE;
    GHashTable *seg_at = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    GHashTable *live = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    /* blocks the program freed whose memory is not back yet (freed while used on another
     * stream): live before their free_requested, or from the start when the trace holds none */
    GHashTable *pending = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    GHashTable *ids = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    GArray *events = g_array_new(FALSE, TRUE, sizeof(MemsimEvent));
    GArray *start = g_array_new(FALSE, FALSE, sizeof(StartSeg));
    int64_t mapped = 0;
    uint64_t capacity = 0; /* recorded at the first OOM, see below */
    gboolean any_expandable = FALSE;

    /* Final state. */
    for (guint i = 0; i < segs->len; i++) {
        Segment *s = &g_array_index(segs, Segment, i);
        if (s->device != device)
            continue;
        if (s->expandable && entries->len > 0) {
            any_expandable = TRUE;
            mapped += (int64_t)s->size;
        } else {
            /* (a state-only snapshot seeds expandable runs as they are) */
            StartSeg ss = {s->addr, s->size, s->stream, s->small, s->expandable};
            g_hash_table_insert(seg_at, g_memdup2(&s->addr, 8), g_memdup2(&ss, sizeof ss));
        }
        for (guint j = 0; j < s->blocks->len; j++) {
            Block *b = &g_array_index(s->blocks, Block, j);
            if (!b->allocated)
                continue;
            Live l = {b->size, b->requested};
            g_hash_table_insert(b->pending ? pending : live, g_memdup2(&b->addr, 8),
                                g_memdup2(&l, sizeof l));
        }
    }

    /* Walk back to the start. */
    for (guint k = entries->len; k-- > 0;) {
        Entry *e = &g_array_index(entries, Entry, k);
        char where[80];
        g_snprintf(where, sizeof where, "device_traces[%u][%zu]", device, e->index);
        switch (e->action) {
        case A_ALLOC:
            if (!g_hash_table_remove(live, &e->addr)) {
                fail(c, where, "alloc at 0x%" G_GINT64_MODIFIER "x is neither freed later nor "
                     "live at the end", e->addr);
                goto out;
            }
            break;
        case A_FREE_REQUESTED: {
            if (g_hash_table_contains(live, &e->addr)) {
                fail(c, where, "free of 0x%" G_GINT64_MODIFIER "x, which is live again before "
                     "any alloc", e->addr);
                goto out;
            }
            g_hash_table_remove(pending, &e->addr);
            Live l = {0, e->size};
            g_hash_table_insert(live, g_memdup2(&e->addr, 8), g_memdup2(&l, sizeof l));
            break;
        }
        case A_SEGMENT_ALLOC:
            if (!g_hash_table_remove(seg_at, &e->addr)) {
                fail(c, where, "segment_alloc at 0x%" G_GINT64_MODIFIER "x of a segment that "
                     "neither exists at the end nor is freed later", e->addr);
                goto out;
            }
            break;
        case A_SEGMENT_FREE: {
            StartSeg ss = {e->addr, e->size, e->stream, e->size == SMALL_SEGMENT, FALSE};
            g_hash_table_insert(seg_at, g_memdup2(&e->addr, 8), g_memdup2(&ss, sizeof ss));
            break;
        }
        case A_SEGMENT_MAP:
            any_expandable = TRUE;
            mapped -= (int64_t)e->size;
            break;
        case A_SEGMENT_UNMAP:
            any_expandable = TRUE;
            mapped += (int64_t)e->size;
            break;
        default:
            break;
        }
    }
    if (any_expandable && mapped != 0) {
        g_set_error(c->error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "%s: device %u: the trace of an expandable-segments allocator begins with "
                    "%" G_GINT64_FORMAT " bytes already mapped; rebuilding that starting state "
                    "is not supported",
                    c->file, device, mapped);
        goto out;
    }

    /* Blocks pending free since before the trace's window: live at the start. */
    {
        GHashTableIter it;
        gpointer k, v;
        g_hash_table_iter_init(&it, pending);
        while (g_hash_table_iter_next(&it, &k, &v)) {
            g_hash_table_insert(live, g_memdup2(k, 8), g_memdup2(v, sizeof(Live)));
            g_hash_table_iter_remove(&it);
        }
    }

    /* Starting segments in address order, with their live blocks. */
    {
        GHashTableIter it;
        gpointer key, val;
        g_hash_table_iter_init(&it, seg_at);
        while (g_hash_table_iter_next(&it, &key, &val))
            g_array_append_val(start, *(StartSeg *)val);
        g_array_sort(start, cmp_u64); /* addr is the first field */
        GArray *addrs = g_array_new(FALSE, FALSE, sizeof(uint64_t));
        g_hash_table_iter_init(&it, live);
        while (g_hash_table_iter_next(&it, &key, &val))
            g_array_append_val(addrs, *(uint64_t *)key);
        g_array_sort(addrs, cmp_u64);
        uint64_t next_id = 1;
        guint bi = 0;
        for (guint i = 0; i < start->len; i++) {
            StartSeg *s = &g_array_index(start, StartSeg, i);
            if (i + 1 < start->len && s->addr + s->size > g_array_index(start, StartSeg, i + 1).addr) {
                fail(c, "segments", "device %u: segments at 0x%" G_GINT64_MODIFIER "x and 0x%"
                     G_GINT64_MODIFIER "x overlap", device, s->addr,
                     g_array_index(start, StartSeg, i + 1).addr);
                g_array_unref(addrs);
                goto out;
            }
            MemsimEvent ev = {.kind = MEMSIM_EV_INIT_SEGMENT,
                              .stream = stream_index(handles, s->stream),
                              .addr = s->addr,
                              .size = s->size,
                              .aux = (s->small ? MEMSIM_SEGF_SMALL : 0) |
                                     (s->expandable ? MEMSIM_SEGF_EXPANDABLE : 0)};
            g_array_append_val(events, ev);
            uint64_t end = s->addr + s->size;
            /* A block freed in the trace that no segment holds (a free of an address
             * nothing holds): left out, its free skipped with a warning below. */
            while (bi < addrs->len && g_array_index(addrs, uint64_t, bi) < s->addr)
                bi++;
            while (bi < addrs->len && g_array_index(addrs, uint64_t, bi) < end) {
                uint64_t a = g_array_index(addrs, uint64_t, bi);
                Live *l = g_hash_table_lookup(live, &a);
                uint64_t next = bi + 1 < addrs->len && g_array_index(addrs, uint64_t, bi + 1) < end
                                    ? g_array_index(addrs, uint64_t, bi + 1)
                                    : end;
                uint64_t size = l->size;
                if (size == 0) {
                    uint64_t r = torch_settings_round(rounder, l->requested ? l->requested : 1);
                    size = r;
                    if (!s->small && !s->expandable && next - a >= r &&
                        (next - a - r <= ONE_MIB || r >= max_split))
                        size = next - a;
                }
                if (a + size > next) {
                    fail(c, "device_traces", "device %u: block at 0x%" G_GINT64_MODIFIER
                         "x (%" G_GUINT64_FORMAT " bytes requested), live at the start, "
                         "overlaps the next block or its segment's end", device, a,
                         l->requested);
                    g_array_unref(addrs);
                    goto out;
                }
                /* live before the trace: the model's parameters, as far as can be told */
                MemsimEvent b = {.kind = MEMSIM_EV_INIT_BLOCK,
                                 .category = MEMSIM_CAT_PARAMETER,
                                 .stream = stream_index(handles, s->stream),
                                 .id = next_id,
                                 .addr = a,
                                 .size = l->requested,
                                 .aux = size};
                g_array_append_val(events, b);
                g_hash_table_insert(ids, g_memdup2(&a, 8), g_memdup2(&next_id, 8));
                next_id++;
                bi++;
            }
        }
        g_array_unref(addrs);

        /* Forward: the events. `held`: the bytes the allocator holds from the driver as the
         * trace goes, for the capacity of a recorded OOM. */
        uint64_t held = 0;
        for (guint i = 0; i < start->len; i++)
            held += g_array_index(start, StartSeg, i).size;
        guint32 snapshot_mark = memsim_trace_intern(t, "snapshot");
        for (guint k = 0; k < entries->len; k++) {
            Entry *e = &g_array_index(entries, Entry, k);
            char where[80];
            g_snprintf(where, sizeof where, "device_traces[%u][%zu]", device, e->index);
            MemsimEvent ev = {.stream = stream_index(handles, e->stream)};
            switch (e->action) {
            case A_ALLOC:
                if (g_hash_table_contains(ids, &e->addr)) {
                    fail(c, where, "alloc at 0x%" G_GINT64_MODIFIER "x, which is still "
                         "allocated", e->addr);
                    goto out;
                }
                if (e->size == 0) {
                    fail(c, where, "alloc of 0 bytes (such requests never reach the allocator)");
                    goto out;
                }
                ev.kind = MEMSIM_EV_ALLOC;
                ev.id = next_id;
                ev.size = e->size;
                ev.addr = e->addr;
                ev.flags = MEMSIM_EVF_ADDR;
                ev.aux = e->stack;        /* the replay's allocation site */
                ev.category = e->category;
                g_hash_table_insert(ids, g_memdup2(&e->addr, 8), g_memdup2(&next_id, 8));
                next_id++;
                break;
            case A_FREE_REQUESTED: {
                uint64_t *id = g_hash_table_lookup(ids, &e->addr);
                if (!id) {
                    odd(c, device, "frees of an address no segment holds, skipped", where,
                        "free of 0x%" G_GINT64_MODIFIER "x", e->addr);
                    continue;
                }
                ev.kind = MEMSIM_EV_FREE;
                ev.id = *id;
                g_hash_table_remove(ids, &e->addr);
                break;
            }
            case A_SEGMENT_ALLOC:
                ev.kind = MEMSIM_EV_SEG_ALLOC;
                held += e->size;
                break;
            case A_SEGMENT_FREE:
                ev.kind = MEMSIM_EV_SEG_FREE;
                held -= MIN(held, e->size);
                break;
            case A_SEGMENT_MAP:
                ev.kind = MEMSIM_EV_SEG_MAP;
                held += e->size;
                break;
            case A_SEGMENT_UNMAP:
                ev.kind = MEMSIM_EV_SEG_UNMAP;
                held -= MIN(held, e->size);
                break;
            case A_OOM:
                ev.kind = MEMSIM_EV_OOM;
                /* c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc records
                 * the OOM with cudaMemGetInfo's device_free after releasing its cached
                 * blocks: the allocator could have had what it held then plus that. */
                if (!capacity && held + e->addr >= held)
                    capacity = held + e->addr;
                break;
            case A_SNAPSHOT:
                ev.kind = MEMSIM_EV_MARK;
                ev.id = snapshot_mark;
                break;
            default:
                continue;
            }
            if (ev.kind >= MEMSIM_EV_SEG_ALLOC && ev.kind <= MEMSIM_EV_OOM) {
                ev.addr = e->addr;
                ev.size = e->size;
            }
            g_array_append_val(events, ev);
            /* A run of releases ends: the empty_cache (or OOM-path release) that made it. */
            if (e->action == A_SEGMENT_FREE || e->action == A_SEGMENT_UNMAP) {
                Action nx = A_OTHER;
                for (guint m = k + 1; m < entries->len; m++) {
                    nx = g_array_index(entries, Entry, m).action;
                    break;
                }
                if (nx != A_SEGMENT_FREE && nx != A_SEGMENT_UNMAP) {
                    MemsimEvent ec = {.kind = MEMSIM_EV_EMPTY_CACHE,
                                      .flags = MEMSIM_EVF_INFERRED,
                                      .stream = ev.stream};
                    g_array_append_val(events, ec);
                }
            }
        }
    }
    memsim_trace_header(t)->ranks[rank].capacity = capacity;
    memsim_trace_append(t, rank, (MemsimEvent *)events->data, events->len);
    ok = TRUE;
out:
    g_array_unref(handles);
    g_hash_table_unref(seg_at);
    g_hash_table_unref(live);
    g_hash_table_unref(pending);
    g_hash_table_unref(ids);
    g_array_unref(events);
    g_array_unref(start);
    return ok;
}


static MemsimTrace *from_pickle(Ctx *cp, MemsimPyDoc *doc, const char *name)
{
    Ctx c = *cp; /* (its tables are shared) */
    (void)name;
    const MemsimPyValue *root = memsim_pickle_root(doc);
    const MemsimPyValue *segs = NULL, *traces = NULL, *settings = NULL;
    if (root->type == MEMSIM_PY_LIST) {
        segs = root; /* torch.cuda.memory_snapshot(): the segments alone */
    } else if (root->type == MEMSIM_PY_DICT) {
        segs = memsim_py_dict_get(root, "segments");
        traces = memsim_py_dict_get(root, "device_traces");
        settings = memsim_py_dict_get(root, "allocator_settings");
        if (!segs) {
            fail(&c, "top level", "no 'segments' key: not a PyTorch memory snapshot");
            return NULL;
        }
    } else {
        fail(&c, "top level", "is a %s, expected the dict of a PyTorch memory snapshot",
             memsim_py_type_name(root->type));
        return NULL;
    }

    MemsimTrace *t = c.t;
    memsim_trace_intern(t, "snapshot"); /* string 0, before the stacks */
    GArray *seg_list = g_array_new(FALSE, FALSE, sizeof(Segment));
    g_array_set_clear_func(seg_list, segment_clear);
    GPtrArray *per_dev = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
    TorchSettings rounder;
    GArray **dev_segs = NULL; /* n_dev entries once set */
    guint n_dev = 0;
    gboolean ok = FALSE;

    if (!read_segments(&c, segs, seg_list))
        goto out;
    if (traces) {
        if (!expect(&c, traces, MEMSIM_PY_LIST, "device_traces"))
            goto out;
        if (traces->v.seq.n > MAX_DEVICES) {
            fail(&c, "device_traces", "%zu lists: more devices than %u", (size_t)traces->v.seq.n,
                 MAX_DEVICES);
            goto out;
        }
        for (gsize d = 0; d < traces->v.seq.n; d++) {
            GArray *en = g_array_new(FALSE, FALSE, sizeof(Entry));
            g_ptr_array_add(per_dev, en);
            if (!read_entries(&c, traces->v.seq.items[d], d, en))
                goto out;
        }
    }
    if (settings && settings->type != MEMSIM_PY_DICT) {
        fail(&c, "allocator_settings", "is a %s, expected a dict",
             memsim_py_type_name(settings->type));
        goto out;
    }
    MemsimTraceHeader *h = memsim_trace_header(t);
    h->alloc_conf = settings_string(&c, settings);

    /* The rounding rule of the recorded settings, to size blocks of the starting state. */
    {
        GError *e2 = NULL;
        if (!torch_settings_parse(h->alloc_conf, &rounder, &e2)) {
            fail(&c, "allocator_settings", "%s", e2->message);
            g_error_free(e2);
            goto out;
        }
    }
    uint64_t max_split = UINT64_MAX;
    const MemsimPyValue *ms = settings ? memsim_py_dict_get(settings, "max_split_size") : NULL;
    if (ms && ms->type == MEMSIM_PY_INT && ms->v.i > 0)
        max_split = (uint64_t)ms->v.i;

    /* Ranks: the devices that have a trace; when none has one, those with segments. */
    gboolean any_trace = FALSE;
    for (guint d = 0; d < per_dev->len; d++)
        if (((GArray *)g_ptr_array_index(per_dev, d))->len)
            any_trace = TRUE;
    n_dev = per_dev->len;
    for (guint i = 0; i < seg_list->len; i++) {
        uint64_t dv = g_array_index(seg_list, Segment, i).device;
        if (dv >= MAX_DEVICES) {
            fail(&c, "segments", "device index %" G_GUINT64_FORMAT " is out of range (expected "
                 "below %u)", dv, MAX_DEVICES);
            goto out;
        }
        if (dv + 1 > n_dev)
            n_dev = (guint)dv + 1;
    }
    /* Each device's segments, in their order (copies sharing the blocks of seg_list), so
     * that the work stays linear in the segments whatever the number of devices. */
    dev_segs = g_new0(GArray *, n_dev);
    for (guint i = 0; i < seg_list->len; i++) {
        Segment *s = &g_array_index(seg_list, Segment, i);
        if (!dev_segs[s->device])
            dev_segs[s->device] = g_array_new(FALSE, FALSE, sizeof(Segment));
        g_array_append_val(dev_segs[s->device], *s);
    }
    GArray *empty = g_array_new(FALSE, FALSE, sizeof(Entry));
    GArray *no_segs = g_array_new(FALSE, FALSE, sizeof(Segment));
    for (guint d = 0; d < n_dev; d++) {
        GArray *en = d < per_dev->len ? g_ptr_array_index(per_dev, d) : empty;
        if (any_trace ? en->len == 0 : !dev_segs[d])
            continue;
        if (!build_device(&c, t, d, dev_segs[d] ? dev_segs[d] : no_segs, en, &rounder,
                          max_split)) {
            g_array_unref(empty);
            g_array_unref(no_segs);
            goto out;
        }
    }
    g_array_unref(empty);
    g_array_unref(no_segs);
    ok = TRUE;
out:
    for (guint d = 0; dev_segs && d < n_dev; d++)
        if (dev_segs[d])
            g_array_unref(dev_segs[d]);
    g_free(dev_segs);
    g_array_unref(seg_list);
    g_ptr_array_unref(per_dev);
    return ok ? t : NULL; /* the caller frees c.t on a failure */
}

MemsimTrace *memsim_snapshot_from_pickle(MemsimPyDoc *doc, const char *name, GError **error)
{
    MemsimSnapOdd o;
    memsim_snap_odd_init(&o);
    Ctx c = {name, error, &o, memsim_trace_new(name)};
    MemsimTrace *t = from_pickle(&c, doc, name);
    if (t)
        memsim_snap_odd_finish(&o, t, name);
    else
        memsim_trace_free(c.t);
    memsim_snap_odd_clear(&o);
    return t;
}

MemsimTrace *memsim_snapshot_load_tree(const char *path, GError **error)
{
    MemsimPyDoc *doc = memsim_pickle_load_file(path, error);
    if (!doc)
        return NULL;
    MemsimTrace *t = memsim_snapshot_from_pickle(doc, path, error);
    memsim_pickle_free(doc);
    return t;
}
