/* Export as a PyTorch memory snapshot (include/memsim/export.h, memsim_export_snapshot).
 *
 * What it writes is what torch.cuda.memory._dump_snapshot writes (TORCH_ALLOCATOR.md §11.2),
 * for what memsim's torch policy does with the trace: the trace is replayed (sim/replay.c,
 * through its hooks) and every action the policy reports becomes a trace entry, in order (segment_alloc before the alloc it serves, free_requested before the
 * free_completed it causes, the releases of an empty_cache or an OOM path, the oom itself);
 * the policy's final layout, listed by its foreach_block operation, becomes `segments` (an
 * expandable reservation gives one segment per run of mapped blocks, §8.5). Every entry's
 * frames name the op running at that moment: [{"name": op, "filename": "memsim", "line": 0}].
 * Segment addresses are the policy's own (a bump pointer above any segment the trace starts
 * with), and time_us is the event index. The replay ignores the ops' durations (a snapshot
 * has none: a block used on another stream comes back at the next chance, as in a replay of
 * the file), so replaying the file with `memsim replay --verify` reproduces every recorded
 * action.
 *
 * The pickle is protocol 2 made of plain values only (dict, list, str, int, float, bool,
 * None, tuple), so that Python's pickle module loads it with every global refused. Repeated
 * strings and each op's frames list are written once and then fetched from the memo
 * (BINPUT/BINGET), as Python's own pickler does for shared objects. Each rank's trace entries
 * go to a temporary file while the trace streams in (ranks may interleave), and are copied
 * into the output at the end: memory stays bounded by the live blocks, not the trace length.
 */
#include <memsim/export.h>
#include <memsim/formats.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <glib/gstdio.h>

#include <memsim/sim.h>

#include "formats/torch_settings.h"
#include "sim/export/outfile.h"

/* ---- pickle opcodes (protocol 2) ---- */

#define OP_PROTO 0x80
#define OP_STOP '.'
#define OP_MARK '('
#define OP_EMPTY_DICT '}'
#define OP_EMPTY_LIST ']'
#define OP_APPEND 'a'
#define OP_APPENDS 'e'
#define OP_SETITEMS 'u'
#define OP_BINUNICODE 'X'
#define OP_BININT 'J'
#define OP_BININT1 'K'
#define OP_BININT2 'M'
#define OP_LONG1 0x8a
#define OP_BINFLOAT 'G'
#define OP_NEWTRUE 0x88
#define OP_NEWFALSE 0x89
#define OP_NONE 'N'
#define OP_TUPLE2 0x86
#define OP_BINPUT 'q'
#define OP_LONG_BINPUT 'r'
#define OP_BINGET 'h'
#define OP_LONG_BINGET 'j'

#define BATCH 1000 /* items per APPENDS, as Python's pickler */

typedef struct {
    MemsimOutFile *out;
    GHashTable *memo;  /* string → memo index + 1, this writer's own */
    uint32_t *counter; /* memo indices, shared by every writer of one file */
    GArray *frames;    /* guint32 per op: memo index + 1 of its frames list */
} PWriter;

static void pw_init(PWriter *w, MemsimOutFile *out, uint32_t *counter)
{
    w->out = out;
    w->memo = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    w->counter = counter;
    w->frames = g_array_new(FALSE, TRUE, sizeof(guint32));
}

static void pw_clear(PWriter *w)
{
    if (w->memo)
        g_hash_table_unref(w->memo);
    if (w->frames)
        g_array_unref(w->frames);
    w->memo = NULL;
    w->frames = NULL;
}

static inline void pw_byte(PWriter *w, guint8 b)
{
    memsim_out_write(w->out, &b, 1);
}

static void pw_u32(PWriter *w, uint32_t v)
{
    guint8 b[4] = {v & 255, (v >> 8) & 255, (v >> 16) & 255, v >> 24};
    memsim_out_write(w->out, b, 4);
}

static uint32_t pw_put(PWriter *w)
{
    uint32_t idx = (*w->counter)++;
    if (idx < 256) {
        pw_byte(w, OP_BINPUT);
        pw_byte(w, (guint8)idx);
    } else {
        pw_byte(w, OP_LONG_BINPUT);
        pw_u32(w, idx);
    }
    return idx;
}

static void pw_get(PWriter *w, uint32_t idx)
{
    if (idx < 256) {
        pw_byte(w, OP_BINGET);
        pw_byte(w, (guint8)idx);
    } else {
        pw_byte(w, OP_LONG_BINGET);
        pw_u32(w, idx);
    }
}

static void pw_str(PWriter *w, const char *s)
{
    gpointer v = g_hash_table_lookup(w->memo, s);
    if (v) {
        pw_get(w, GPOINTER_TO_UINT(v) - 1);
        return;
    }
    g_autofree char *valid = g_utf8_validate(s, -1, NULL) ? NULL : g_utf8_make_valid(s, -1);
    const char *t = valid ? valid : s;
    gsize len = strlen(t);
    pw_byte(w, OP_BINUNICODE);
    pw_u32(w, (uint32_t)len);
    memsim_out_write(w->out, t, len);
    uint32_t idx = pw_put(w);
    g_hash_table_insert(w->memo, g_strdup(s), GUINT_TO_POINTER(idx + 1));
}

static void pw_int(PWriter *w, int64_t v)
{
    if (v >= 0 && v < 256) {
        pw_byte(w, OP_BININT1);
        pw_byte(w, (guint8)v);
    } else if (v >= 0 && v < 65536) {
        pw_byte(w, OP_BININT2);
        pw_byte(w, v & 255);
        pw_byte(w, (v >> 8) & 255);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        pw_byte(w, OP_BININT);
        pw_u32(w, (uint32_t)(int32_t)v);
    } else {
        /* LONG1: little-endian two's complement, as few bytes as keep the sign. */
        guint8 b[8];
        int n = 0;
        uint64_t u = (uint64_t)v;
        for (int i = 0; i < 8; i++)
            b[i] = (u >> (8 * i)) & 255;
        for (n = 8; n > 1; n--) {
            guint8 top = b[n - 1], next = b[n - 2];
            if (!((top == 0 && !(next & 0x80)) || (top == 0xff && (next & 0x80))))
                break;
        }
        pw_byte(w, OP_LONG1);
        pw_byte(w, (guint8)n);
        memsim_out_write(w->out, b, (gsize)n);
    }
}

/* An unsigned value (addresses may use all 64 bits). */
static void pw_uint(PWriter *w, uint64_t v)
{
    if (v <= INT64_MAX) {
        pw_int(w, (int64_t)v);
        return;
    }
    guint8 b[9];
    for (int i = 0; i < 8; i++)
        b[i] = (v >> (8 * i)) & 255;
    b[8] = 0;
    pw_byte(w, OP_LONG1);
    pw_byte(w, 9);
    memsim_out_write(w->out, b, 9);
}

static void pw_float(PWriter *w, double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    guint8 b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (u >> (8 * (7 - i))) & 255; /* big-endian */
    pw_byte(w, OP_BINFLOAT);
    memsim_out_write(w->out, b, 8);
}

static void pw_bool(PWriter *w, gboolean b)
{
    pw_byte(w, b ? OP_NEWTRUE : OP_NEWFALSE);
}

/* frames = [{"name": op, "filename": "memsim", "line": 0}], or [] when no op runs. */
static void pw_frames(PWriter *w, const char *const *op_names, guint n_ops, int64_t op)
{
    if (op < 0 || (guint64)op >= n_ops) {
        pw_byte(w, OP_EMPTY_LIST);
        return;
    }
    if ((guint64)op < w->frames->len && g_array_index(w->frames, guint32, op)) {
        pw_get(w, g_array_index(w->frames, guint32, op) - 1);
        return;
    }
    pw_byte(w, OP_EMPTY_LIST);
    uint32_t idx = pw_put(w);
    pw_byte(w, OP_EMPTY_DICT);
    pw_byte(w, OP_MARK);
    pw_str(w, "name");
    pw_str(w, op_names[op]);
    pw_str(w, "filename");
    pw_str(w, "memsim");
    pw_str(w, "line");
    pw_int(w, 0);
    pw_byte(w, OP_SETITEMS);
    pw_byte(w, OP_APPEND);
    if ((guint64)op >= w->frames->len)
        g_array_set_size(w->frames, (guint)op + 1);
    g_array_index(w->frames, guint32, op) = idx + 1;
}

/* ---- the replay ---- */

typedef struct SnapExport SnapExport;

typedef struct {
    MemsimBlockInfo b;
    int64_t op; /* the op that allocated it, -1 */
} Blk;

typedef struct {
    uint32_t device;
    memsim_addr_t addr;
    memsim_size_t size;
    uint32_t stream;
    uint32_t flags;
    guint first, n; /* blocks */
    int64_t op;
} Seg;

typedef struct {
    SnapExport *x;
    guint32 rank;
    int64_t cur_op;  /* the op of the entry being written */
    uint64_t index;  /* and its event index (time_us) */
    memsim_addr_t bump;
    GHashTable *seg_op; /* segment (or first mapped) address → op + 1 */
    GHashTable *blk_op; /* allocated block address → op + 1 of its alloc */
    /* its trace entries */
    MemsimOutFile tmp;
    char *tmp_path;
    PWriter pw;
    uint32_t in_batch;
} RankX;

struct SnapExport {
    MemsimTraceHeader header; /* copy; op names refreshed as the trace grows */
    char *conf;
    guint n_ranks;
    RankX *ranks;
    uint32_t memo_counter;
    GPtrArray *op_names; /* char*, valid UTF-8 */
    GArray *blocks;      /* Blk: the final layout of every rank */
    GArray *segs;        /* Seg */
    GHashTable *devices; /* the devices whose final layout is taken (their first rank) */
};

#define SEG_BASE ((memsim_addr_t)0x7f0000000000ull)
#define SEG_ALIGN ((memsim_addr_t)2 << 20)

static uint64_t stream_handle(const RankX *r, uint32_t stream)
{
    const MemsimRankInfo *ri = &r->x->header.ranks[r->rank];
    if (ri->stream_handles && stream < ri->n_streams)
        return ri->stream_handles[stream];
    return stream;
}

static void entry_begin(RankX *r)
{
    if (r->in_batch == 0)
        pw_byte(&r->pw, OP_MARK);
    pw_byte(&r->pw, OP_EMPTY_DICT);
    pw_byte(&r->pw, OP_MARK);
}

static void entry_end(RankX *r)
{
    PWriter *w = &r->pw;
    pw_str(w, "time_us");
    pw_uint(w, r->index);
    pw_str(w, "frames");
    pw_frames(w, (const char *const *)r->x->op_names->pdata, r->x->op_names->len, r->cur_op);
    pw_byte(w, OP_SETITEMS);
    if (++r->in_batch == BATCH) {
        pw_byte(w, OP_APPENDS);
        r->in_batch = 0;
    }
}

static void write_entry(RankX *r, const char *action, memsim_addr_t addr, memsim_size_t size,
                        uint32_t stream, gboolean oom)
{
    PWriter *w = &r->pw;
    entry_begin(r);
    pw_str(w, "action");
    pw_str(w, action);
    pw_str(w, oom ? "device_free" : "addr");
    pw_uint(w, addr);
    pw_str(w, "size");
    pw_uint(w, size);
    pw_str(w, "stream");
    pw_uint(w, stream_handle(r, stream));
    entry_end(r);
}

static void sync_ops(SnapExport *x, const MemsimTraceHeader *h)
{
    for (guint i = x->op_names->len; i < h->n_ops; i++) {
        uint32_t s = h->ops[i].name;
        const char *n = s < h->n_strings && h->strings[s] ? h->strings[s] : "?";
        g_ptr_array_add(x->op_names,
                        g_utf8_validate(n, -1, NULL) ? g_strdup(n) : g_utf8_make_valid(n, -1));
    }
}

static void insert_op(GHashTable *map, memsim_addr_t addr, int64_t op)
{
    g_hash_table_insert(map, g_memdup2(&addr, sizeof addr),
                        GINT_TO_POINTER((gint)MIN(op + 1, G_MAXINT)));
}

/* ---- the replay's hooks ---- */

static void on_event(void *user, const MemsimTraceHeader *h, guint32 rank, uint64_t index,
                     const MemsimEvent *ev)
{
    SnapExport *x = user;
    RankX *r = &x->ranks[rank];
    if (h->n_ops > x->op_names->len)
        sync_ops(x, h);
    if (ev->kind == MEMSIM_EV_INIT_SEGMENT) {
        /* new segments go above the ones the trace starts with */
        memsim_addr_t end = ev->addr + ev->size;
        if (end > r->bump - SEG_ALIGN)
            r->bump = ((end + SEG_ALIGN - 1) & ~(SEG_ALIGN - 1)) + SEG_ALIGN;
    }
}

static void on_free(void *user, guint32 rank, uint64_t index, int64_t op,
                    const MemsimReplayTensor *t)
{
    RankX *r = &((SnapExport *)user)->ranks[rank];
    r->index = index;
    r->cur_op = op;
    write_entry(r, "free_requested", t->addr, t->requested, t->stream, FALSE);
}

static void on_action(void *user, guint32 rank, uint64_t index, int64_t op,
                      const MemsimAllocEvent *ev)
{
    RankX *r = &((SnapExport *)user)->ranks[rank];
    const char *action = NULL;
    switch (ev->kind) {
    case MEMSIM_AEV_SEG_ALLOC:
        action = "segment_alloc";
        break;
    case MEMSIM_AEV_SEG_FREE:
        action = "segment_free";
        break;
    case MEMSIM_AEV_SEG_MAP:
        action = "segment_map";
        break;
    case MEMSIM_AEV_SEG_UNMAP:
        action = "segment_unmap";
        break;
    case MEMSIM_AEV_ALLOC:
        action = "alloc";
        insert_op(r->blk_op, ev->addr, op);
        break;
    case MEMSIM_AEV_FREE_COMPLETED:
        action = "free_completed";
        g_hash_table_remove(r->blk_op, &ev->addr);
        break;
    case MEMSIM_AEV_OOM:
        action = "oom";
        break;
    }
    if (!action)
        return;
    if ((ev->kind == MEMSIM_AEV_SEG_ALLOC || ev->kind == MEMSIM_AEV_SEG_MAP) && op >= 0)
        insert_op(r->seg_op, ev->addr, op);
    r->index = index;
    r->cur_op = op;
    write_entry(r, action, ev->addr, ev->size, ev->stream, ev->kind == MEMSIM_AEV_OOM);
}

static memsim_addr_t segment_addr(void *user, guint32 rank, memsim_size_t size, uint32_t stream)
{
    RankX *r = &((SnapExport *)user)->ranks[rank];
    memsim_addr_t a = r->bump;
    r->bump += ((size + SEG_ALIGN - 1) & ~(SEG_ALIGN - 1)) + SEG_ALIGN;
    return a;
}

static void rank_segments(RankX *r, MemsimAlloc *alloc, GArray *blocks, GArray *segs);

static void on_end(void *user, guint32 rank, MemsimAlloc *alloc)
{
    SnapExport *x = user;
    uint32_t device = x->header.ranks[rank].device;
    if (!g_hash_table_add(x->devices, GUINT_TO_POINTER(device)))
        return; /* one program per device: the first rank of it */
    rank_segments(&x->ranks[rank], alloc, x->blocks, x->segs);
}

static void sx_free(SnapExport *x)
{
    if (!x)
        return;
    for (guint i = 0; i < x->n_ranks; i++) {
        RankX *r = &x->ranks[i];
        if (r->seg_op)
            g_hash_table_unref(r->seg_op);
        if (r->blk_op)
            g_hash_table_unref(r->blk_op);
        pw_clear(&r->pw);
        if (r->tmp.f)
            memsim_out_abort(&r->tmp);
        if (r->tmp_path)
            g_unlink(r->tmp_path);
        g_free(r->tmp_path);
    }
    g_free(x->ranks);
    g_ptr_array_unref(x->op_names);
    g_array_unref(x->blocks);
    g_array_unref(x->segs);
    g_hash_table_unref(x->devices);
    memsim_trace_header_clear(&x->header);
    g_free(x->conf);
    g_free(x);
}

static SnapExport *sx_new(const MemsimTraceHeader *h, const char *alloc_conf, GError **error)
{
    SnapExport *x = g_new0(SnapExport, 1);
    memsim_trace_header_copy(&x->header, h);
    x->op_names = g_ptr_array_new_with_free_func(g_free);
    x->blocks = g_array_new(FALSE, FALSE, sizeof(Blk));
    x->segs = g_array_new(FALSE, FALSE, sizeof(Seg));
    x->devices = g_hash_table_new(g_direct_hash, g_direct_equal);
    const char *conf = alloc_conf ? alloc_conf : h->alloc_conf;
    x->conf = g_strdup(conf ? conf : "");
    x->n_ranks = h->n_ranks;
    x->ranks = g_new0(RankX, MAX(h->n_ranks, 1u));
    for (guint i = 0; i < x->n_ranks; i++) {
        RankX *r = &x->ranks[i];
        r->x = x;
        r->rank = i;
        r->cur_op = -1;
        r->bump = SEG_BASE;
        r->seg_op = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
        r->blk_op = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
        int fd = g_file_open_tmp("memsim-snapshot-XXXXXX", &r->tmp_path, error);
        if (fd < 0) {
            sx_free(x);
            return NULL;
        }
        close(fd);
        if (!memsim_out_open(&r->tmp, r->tmp_path, error)) {
            sx_free(x);
            return NULL;
        }
        pw_init(&r->pw, &r->tmp, &x->memo_counter);
    }
    return x;
}

/* ---- the final layout ---- */


static void collect_block(void *user, const MemsimBlockInfo *b)
{
    GArray *a = user;
    Blk k = {*b, -1};
    g_array_append_val(a, k);
}

static int seg_cmp(gconstpointer pa, gconstpointer pb)
{
    const Seg *a = pa, *b = pb;
    if (a->device != b->device)
        return a->device < b->device ? -1 : 1;
    return a->addr < b->addr ? -1 : a->addr > b->addr;
}

/* Snapshot segments of one rank: whole segments, or mapped runs of expandable ones. */
static void rank_segments(RankX *r, MemsimAlloc *alloc, GArray *blocks, GArray *segs)
{
    guint first = blocks->len;
    memsim_alloc_foreach_block(alloc, collect_block, blocks);
    uint32_t device = r->x->header.ranks[r->rank].device;
    Seg cur = {0};
    gboolean open = FALSE;
    for (guint i = first; i < blocks->len; i++) {
        Blk *k = &g_array_index(blocks, Blk, i);
        gpointer v = g_hash_table_lookup(r->blk_op, &k->b.addr);
        if (v && k->b.state == MEMSIM_BLOCK_ALLOCATED)
            k->op = GPOINTER_TO_INT(v) - 1;
        gboolean exp = (k->b.segment_flags & MEMSIM_SEGF_EXPANDABLE) != 0;
        gboolean new_seg;
        if (exp) {
            /* one snapshot segment per run of mapped blocks */
            if (k->b.state == MEMSIM_BLOCK_UNMAPPED) {
                if (open)
                    g_array_append_val(segs, cur);
                open = FALSE;
                continue;
            }
            new_seg = !open || cur.addr + cur.size != k->b.addr ||
                      !(cur.flags & MEMSIM_SEGF_EXPANDABLE);
        } else {
            new_seg = !open || cur.addr != k->b.segment || (cur.flags & MEMSIM_SEGF_EXPANDABLE);
        }
        if (new_seg) {
            if (open)
                g_array_append_val(segs, cur);
            memsim_addr_t base = exp ? k->b.addr : k->b.segment;
            gpointer so = g_hash_table_lookup(r->seg_op, &base);
            Seg s = {device, base, 0, k->b.stream, k->b.segment_flags, i, 0,
                     so ? GPOINTER_TO_INT(so) - 1 : -1};
            cur = s;
            open = TRUE;
        }
        cur.size += k->b.size;
        cur.n++;
    }
    if (open)
        g_array_append_val(segs, cur);
}

/* The allocator settings as the snapshot shows them, from the parsed settings
 * (formats/torch_settings.h). The division table is read back from the rounding (one probe
 * per table entry), so that an entry that cannot change a size shows as off, as PyTorch's
 * rounding sees it. */
static void write_settings(PWriter *w, SnapExport *x)
{
    TorchSettings c;
    /* the replay took these settings already; a failure cannot happen here */
    if (!torch_settings_parse(x->conf, &c, NULL))
        torch_settings_parse(NULL, &c, NULL);
    pw_byte(w, OP_EMPTY_DICT);
    pw_byte(w, OP_MARK);
    pw_str(w, "PYTORCH_CUDA_ALLOC_CONF");
    pw_str(w, x->conf);
    pw_str(w, "max_split_size");
    pw_int(w, c.max_split_size == TORCH_UNLIMITED ? -1 : (int64_t)c.max_split_size);
    pw_str(w, "garbage_collection_threshold");
    pw_float(w, c.gc_threshold);
    pw_str(w, "expandable_segments");
    pw_bool(w, c.expandable);
    pw_str(w, "pinned_num_register_threads");
    pw_int(w, 1);
    pw_str(w, "release_lock_on_cudamalloc");
    pw_bool(w, FALSE);
    pw_str(w, "pinned_use_cuda_host_register");
    pw_bool(w, FALSE);
    pw_str(w, "roundup_power2_divisions");
    pw_byte(w, OP_EMPTY_DICT);
    pw_byte(w, OP_MARK);
    for (int i = 0; i < TORCH_DIV_INTERVALS; i++) {
        /* Entry i covers [2^(20+i), 2^(21+i)): 2^(20+i)+1 rounds up to the next multiple
         * of 2^(20+i)/d, or of 512 when the entry is off. */
        memsim_size_t f = (memsim_size_t)1 << (20 + i);
        memsim_size_t got = torch_settings_round(&c, f + 1);
        memsim_size_t step = got > f ? got - f : 512;
        int64_t d = step <= 512 ? 0 : (int64_t)(f / step);
        char key[16];
        g_snprintf(key, sizeof key, "%u", 1u << i);
        pw_str(w, key);
        pw_int(w, d);
    }
    pw_byte(w, OP_SETITEMS);
    pw_byte(w, OP_SETITEMS);
}

static const char *block_state(uint32_t s)
{
    return s == MEMSIM_BLOCK_ALLOCATED      ? "active_allocated"
           : s == MEMSIM_BLOCK_PENDING_FREE ? "active_pending_free"
                                            : "inactive";
}

static gboolean copy_file(MemsimOutFile *out, const char *from, GError **error)
{
    FILE *f = g_fopen(from, "rb");
    if (!f) {
        int e = errno;
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: cannot read back: %s", from,
                    g_strerror(e));
        return FALSE;
    }
    char *buf = g_malloc(1 << 20);
    size_t n;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0)
        memsim_out_write(out, buf, n);
    gboolean ok = !ferror(f);
    int e = errno;
    fclose(f);
    g_free(buf);
    if (!ok)
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: read error: %s", from,
                    g_strerror(e));
    return ok;
}

static gboolean sx_finish(SnapExport *x, const char *path, GError **error)
{
    /* Close each rank's entries. */
    for (guint i = 0; i < x->n_ranks; i++) {
        RankX *r = &x->ranks[i];
        if (r->in_batch)
            pw_byte(&r->pw, OP_APPENDS);
        r->in_batch = 0;
        if (!memsim_out_close(&r->tmp, error))
            return FALSE;
    }
    MemsimOutFile out;
    if (!memsim_out_open(&out, path, error))
        return FALSE;
    PWriter w;
    pw_init(&w, &out, &x->memo_counter);
    pw_byte(&w, OP_PROTO);
    pw_byte(&w, 2);
    pw_byte(&w, OP_EMPTY_DICT);
    pw_byte(&w, OP_MARK);

    /* device_traces: one list per device, index = device. */
    uint32_t n_dev = 0;
    for (guint i = 0; i < x->n_ranks; i++)
        n_dev = MAX(n_dev, x->header.ranks[i].device + 1);
    pw_str(&w, "device_traces");
    pw_byte(&w, OP_EMPTY_LIST);
    gboolean ok = TRUE;
    for (uint32_t d = 0; d < n_dev && ok; d++) {
        pw_byte(&w, OP_EMPTY_LIST);
        for (guint i = 0; i < x->n_ranks && ok; i++)
            if (x->header.ranks[i].device == d) {
                ok = copy_file(&out, x->ranks[i].tmp_path, error);
                break; /* one program per device: the first rank of it */
            }
        pw_byte(&w, OP_APPEND);
    }
    if (!ok) {
        pw_clear(&w);
        memsim_out_abort(&out);
        return FALSE;
    }

    /* segments (the final layouts, taken at the end of the replay) */
    GArray *blocks = x->blocks, *segs = x->segs;
    g_array_sort(segs, seg_cmp);
    pw_str(&w, "segments");
    pw_byte(&w, OP_EMPTY_LIST);
    const char *const *names = (const char *const *)x->op_names->pdata;
    guint n_names = x->op_names->len;
    for (guint i = 0; i < segs->len; i++) {
        const Seg *s = &g_array_index(segs, Seg, i);
        const RankX *owner = NULL;
        for (guint k = 0; k < x->n_ranks && !owner; k++)
            if (x->header.ranks[k].device == s->device)
                owner = &x->ranks[k];
        int64_t allocated = 0, active = 0, requested = 0;
        for (guint k = s->first; k < s->first + s->n; k++) {
            const MemsimBlockInfo *b = &g_array_index(blocks, Blk, k).b;
            if (b->state == MEMSIM_BLOCK_ALLOCATED)
                allocated += (int64_t)b->size;
            if (b->state == MEMSIM_BLOCK_ALLOCATED || b->state == MEMSIM_BLOCK_PENDING_FREE) {
                active += (int64_t)b->size;
                requested += (int64_t)b->requested;
            }
        }
        pw_byte(&w, OP_EMPTY_DICT);
        pw_byte(&w, OP_MARK);
        pw_str(&w, "device");
        pw_int(&w, s->device);
        pw_str(&w, "address");
        pw_uint(&w, s->addr);
        pw_str(&w, "total_size");
        pw_uint(&w, s->size);
        pw_str(&w, "allocated_size");
        pw_int(&w, allocated);
        pw_str(&w, "active_size");
        pw_int(&w, active);
        pw_str(&w, "requested_size");
        pw_int(&w, requested);
        pw_str(&w, "stream");
        pw_uint(&w, owner ? stream_handle(owner, s->stream) : s->stream);
        pw_str(&w, "segment_type");
        pw_str(&w, (s->flags & MEMSIM_SEGF_SMALL) ? "small" : "large");
        pw_str(&w, "segment_pool_id");
        pw_int(&w, 0);
        pw_int(&w, 0);
        pw_byte(&w, OP_TUPLE2);
        pw_str(&w, "is_expandable");
        pw_bool(&w, (s->flags & MEMSIM_SEGF_EXPANDABLE) != 0);
        pw_str(&w, "frames");
        pw_frames(&w, names, n_names, s->op);
        pw_str(&w, "blocks");
        pw_byte(&w, OP_EMPTY_LIST);
        pw_byte(&w, OP_MARK);
        for (guint k = s->first; k < s->first + s->n; k++) {
            const Blk *bk = &g_array_index(blocks, Blk, k);
            pw_byte(&w, OP_EMPTY_DICT);
            pw_byte(&w, OP_MARK);
            pw_str(&w, "address");
            pw_uint(&w, bk->b.addr);
            pw_str(&w, "size");
            pw_uint(&w, bk->b.size);
            pw_str(&w, "requested_size");
            pw_uint(&w, bk->b.requested);
            pw_str(&w, "state");
            pw_str(&w, block_state(bk->b.state));
            pw_str(&w, "frames");
            pw_frames(&w, names, n_names, bk->b.state == MEMSIM_BLOCK_FREE ? -1 : bk->op);
            pw_byte(&w, OP_SETITEMS);
        }
        pw_byte(&w, OP_APPENDS);
        pw_byte(&w, OP_SETITEMS);
        pw_byte(&w, OP_APPEND);
    }

    pw_str(&w, "allocator_settings");
    write_settings(&w, x);
    pw_str(&w, "external_annotations");
    pw_byte(&w, OP_EMPTY_LIST);
    pw_byte(&w, OP_SETITEMS);
    pw_byte(&w, OP_STOP);
    pw_clear(&w);
    return memsim_out_close(&out, error);
}

/* ---- public ---- */

/* Replays `trace` (or the file at `path`) through the torch policy with the export's hooks,
 * then writes the snapshot. */
static gboolean export(MemsimTrace *trace, const char *path, const char *out,
                       const char *alloc_conf, GError **error)
{
    MemsimTraceReader *rd = NULL;
    if (!trace && !(rd = memsim_trace_reader_open(path, error)))
        return FALSE;
    SnapExport *x = sx_new(trace ? memsim_trace_header(trace) : memsim_trace_reader_header(rd),
                           alloc_conf, error);
    MemsimReport *rep = NULL;
    if (x) {
        MemsimReplayHooks hooks = {x, on_event, on_free, on_action, segment_addr, on_end};
        MemsimReplayOptions o = MEMSIM_REPLAY_OPTIONS_INIT;
        o.allocator = "torch";
        o.alloc_conf = x->conf;
        o.hooks = &hooks;
        /* a snapshot has no timing: what it shows must be what a replay of it does */
        o.untimed = TRUE;
        rep = trace ? memsim_replay_trace(trace, &o, error)
                    : memsim_replay_reader(rd, path, &o, error);
    }
    memsim_trace_reader_free(rd);
    gboolean ok = rep && sx_finish(x, out, error);
    memsim_report_free(rep);
    sx_free(x);
    return ok;
}

gboolean memsim_export_snapshot_trace(MemsimTrace *trace, const char *out, const char *alloc_conf,
                                      GError **error)
{
    return export(trace, NULL, out, alloc_conf, error);
}

gboolean memsim_export_snapshot(const char *trace_path, const char *out, const char *alloc_conf,
                                GError **error)
{
    return export(NULL, trace_path, out, alloc_conf, error);
}
