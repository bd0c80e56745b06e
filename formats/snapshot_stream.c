/* PyTorch memory snapshot → memsim trace, streaming (formats/snapshot.h).
 *
 * Reads the pickle of torch.cuda.memory._snapshot() (torch/cuda/memory.py _snapshot,
 * _dump_snapshot: pickle.dump of the dict that torch/csrc/cuda/Module.cpp
 * _cuda_memorySnapshot builds) in one pass over its opcodes, turning records into the
 * trace as they complete instead of building the object tree first (snapshot.c reads that
 * tree, pickle.c builds it; both stay as the reference the tests compare against). The
 * opcodes, their safety rules and their error messages are pickle.c's: plain data only (no
 * GLOBAL, REDUCE or anything else that names or calls code), protocols 2 to 5, bounded
 * nesting, bounded strings, memory bounded per input byte; an error names the file, the
 * byte offset of the opcode and what is wrong.
 *
 * How it streams. Python's pickler (Lib/pickle.py _Pickler.save_dict, save_list,
 * _batch_setitems, _batch_appends) writes a container as EMPTY_DICT / EMPTY_LIST, then its
 * items, in MARK ... SETITEMS / APPENDS runs of at most 1000 (or one SETITEM / APPEND),
 * before the container itself is placed into its parent. So when a container is made, its
 * place in the snapshot's schema can be told from the value stack below it (the open
 * container below the last MARK, or the list / dict-and-key just below it); this is its
 * role: the root dict, `segments`, a segment, `device_traces`, one device's trace, a trace
 * entry, a `frames` list, a frame. Whatever is placed into a container is converted by the
 * parent's role at that moment:
 *
 *   frame dict placed into a frames list  → a frame id (frames interned by content);
 *   frames list placed into an entry      → a stack id (interned by its frame ids), with the
 *                                           stack text and category snapshot.c's read_frames
 *                                           gives, computed once per distinct stack;
 *   entry dict placed into a device list  → the device's events, at once (see below);
 *   segment dict placed into `segments`   → a Segment record with its blocks.
 *
 * The memo (PUT / MEMOIZE / GET) holds a 32-bit handle per index: an interned string, a
 * frame id, a stack id, or a container still in use. An entry's or a segment's dict is
 * dropped from the memo once read: a snapshot writes each record once, so a later GET of
 * one is refused, as snapshot.c refuses a record that appears twice. A container becomes
 * read-only once placed (picklers write a value whole before placing it, except for
 * recursive values, which snapshots do not have), which also rules out cycles. Nesting is
 * bounded by PICKLE_MAX_DEPTH, one string by STREAM_MAX_STRING.
 *
 * The work is spread over threads, each stage handing the next its results in order through
 * a small ring of buffers: one reads the file (and decompresses it) a few chunks ahead of the
 * parser (feeder_start); the parser runs the opcodes and hands each trace entry, its fields
 * read, to one that applies it to its device's state and codes its events (entry_queue),
 * which is a third of the parsing; once the file is read, one makes the replay's chunks of
 * events from the codes (snap_ahead_main) while the caller replays the chunk before. The
 * trace, the events and the errors are the ones a single thread makes: every stage keeps the
 * order, and a failure in applying an entry is put before whatever the parser met after it.
 *
 * Memory is the live blocks (each device's allocated addresses), the distinct strings,
 * frames and stacks, 4 bytes per memo index, the value stack (at most 1000 entries of a
 * batch) and the events of the trace being built — not the file.
 *
 * The events. snapshot.c rebuilds the state a trace starts in by walking the trace
 * backwards from the final `segments`; here the same state is found going forward: a
 * free_requested of an address the trace did not allocate was live at the start, a
 * segment_free of a segment the trace did not allocate existed at the start, and the final
 * segments' blocks that the trace did not allocate were live at the start. Events are
 * written with provisional tensor ids and stream indices; at the end the starting state is
 * put in front (INIT_SEGMENT / INIT_BLOCK in address order, numbered first, as snapshot.c
 * numbers them) and one pass renumbers ids and streams, so that the trace is the one
 * snapshot.c makes, event for event.
 */
#include "formats/formats-internal.h"
#include "formats/snapshot.h"
#include "formats/torch_settings.h"

#include <memsim/error.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <glib/gstdio.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define PICKLE_MAX_DEPTH 10000
#define PICKLE_MAX_STACK (1u << 20)
#define PICKLE_MAX_KEY_WEIGHT 256
/* One string or bytes value may hold at most this many bytes (a frame's name is a few
 * hundred). */
#define STREAM_MAX_STRING ((gsize)64 << 20)
/* Memory held: at most this many bytes per input byte read so far, plus the base. */
#define STREAM_MEM_PER_BYTE 16
#define STREAM_MEM_BASE ((guint64)64 << 20)
#define MAX_DEVICES 4096u
#define SMALL_SEGMENT ((uint64_t)2 << 20)
#define ONE_MIB ((uint64_t)1 << 20)
#define NO_OFF G_MAXUINT64

/* ---- input: plain, zstd or gzip, by magic bytes ----------------------------------------- */

typedef enum { IN_MEMORY, IN_PLAIN, IN_ZSTD, IN_GZIP } InKind;

typedef struct Feeder Feeder;

typedef struct {
    InKind kind;
    Feeder *feed;   /* bytes come from a reading thread (feeder_start), not from f */
    FILE *f;
    guint8 *buf; /* decompressed (or plain) bytes; buf[pos..end) unread: own, or a reading
                  * thread's chunk (feed_swap) */
    gsize cap, pos, end;
    guint8 *own; /* the buffer the Input owns (NULL: buf is memory it was given) */
    gsize own_cap;
    guint64 base;   /* offset in the decompressed stream of buf[0] */
    gboolean eof;   /* nothing more will come */
    guint8 *zin;    /* compressed bytes read from the file */
    gsize zcap, zpos, zend;
    gboolean file_eof;
    ZSTD_DStream *zs;
    z_stream *gz; /* (on the heap: zlib checks that its state stays with its address) */
    guint64 total; /* decompressed bytes, when known (plain input), else 0 */
    gboolean z_done; /* the compressed stream ended properly */
    guint64 file_bytes;
    guint64 *progress;
    char *err; /* a read or decompression error, for the caller */
} Input;

static gboolean file_fill(Input *in)
{
    if (in->file_eof)
        return FALSE;
    if (in->zpos == in->zend)
        in->zpos = in->zend = 0;
    if (in->zend == in->zcap)
        return TRUE;
    size_t got = fread(in->zin + in->zend, 1, in->zcap - in->zend, in->f);
    in->zend += got;
    in->file_bytes += got;
    if (in->progress) /* (read by a progress display's thread) */
        __atomic_store_n(in->progress, in->file_bytes, __ATOMIC_RELAXED);
    if (got == 0) {
        if (ferror(in->f)) {
            in->err = g_strdup_printf("read error: %s", g_strerror(errno));
            return FALSE;
        }
        in->file_eof = TRUE;
        return FALSE;
    }
    return TRUE;
}

static gboolean feed_more(Input *in);

/* Appends decompressed bytes to buf[end..cap); FALSE at the end of input or on an error
 * (in->err). */
static gboolean input_more(Input *in)
{
    if (in->feed)
        return feed_more(in);
    switch (in->kind) {
    case IN_MEMORY:
        return FALSE;
    case IN_PLAIN: {
        size_t got = fread(in->buf + in->end, 1, in->cap - in->end, in->f);
        in->end += got;
        in->file_bytes += got;
        if (in->progress) /* (read by a progress display's thread) */
            __atomic_store_n(in->progress, in->file_bytes, __ATOMIC_RELAXED);
        if (got == 0 && ferror(in->f))
            in->err = g_strdup_printf("read error: %s", g_strerror(errno));
        return got > 0;
    }
    case IN_ZSTD:
    case IN_GZIP:
        for (;;) {
            if (in->zpos == in->zend && !file_fill(in)) {
                if (in->err)
                    return FALSE;
                if (!in->z_done)
                    in->err = g_strdup("the compressed stream ends early");
                return FALSE;
            }
            gsize before = in->end;
            if (in->kind == IN_ZSTD) {
                ZSTD_inBuffer zi = {in->zin, in->zend, in->zpos};
                ZSTD_outBuffer zo = {in->buf, in->cap, in->end};
                size_t r = ZSTD_decompressStream(in->zs, &zo, &zi);
                if (ZSTD_isError(r)) {
                    in->err = g_strdup_printf("zstd: %s", ZSTD_getErrorName(r));
                    return FALSE;
                }
                in->zpos = zi.pos;
                in->end = zo.pos;
                in->z_done = r == 0;
            } else {
                in->gz->next_in = in->zin + in->zpos;
                in->gz->avail_in = (uInt)(in->zend - in->zpos);
                in->gz->next_out = in->buf + in->end;
                in->gz->avail_out = (uInt)MIN(in->cap - in->end, (gsize)G_MAXUINT32);
                int r = inflate(in->gz, Z_NO_FLUSH);
                in->zpos = in->zend - in->gz->avail_in;
                in->end = in->cap - in->gz->avail_out;
                if (r == Z_STREAM_END) {
                    /* gzip members may follow one another (gzip -c a b > c) */
                    in->z_done = TRUE;
                    if (in->zpos < in->zend || file_fill(in))
                        if (in->zin[in->zpos] == 0x1f) {
                            inflateReset(in->gz);
                            in->z_done = FALSE;
                        }
                } else if (r != Z_OK && r != Z_BUF_ERROR) {
                    in->err = g_strdup_printf("gzip: %s", in->gz->msg ? in->gz->msg : "bad data");
                    return FALSE;
                }
            }
            if (in->end > before)
                return TRUE;
            if (in->z_done && in->zpos == in->zend && in->file_eof)
                return FALSE;
        }
    }
    return FALSE;
}

static gboolean feed_swap(Input *in, gsize n);
static void feed_give_back(Input *in);

/* Makes n bytes available at buf[pos]; FALSE when the input ends first. Moves buf: pointers
 * into it do not outlive the call. */
static gboolean input_need(Input *in, gsize n)
{
    if (G_LIKELY(in->end - in->pos >= n))
        return TRUE;
    if (in->kind == IN_MEMORY || in->eof)
        return FALSE;
    if (in->feed && feed_swap(in, n))
        return TRUE;
    gsize left = in->end - in->pos;
    if (in->buf != in->own) {
        /* the rest of a reading thread's chunk comes into the Input's own buffer */
        if (left > in->own_cap) {
            g_free(in->own);
            in->own_cap = MAX(left, 2 * in->own_cap);
            in->own = g_malloc(in->own_cap);
        }
        memcpy(in->own, in->buf + in->pos, left);
        feed_give_back(in);
        in->buf = in->own;
        in->cap = in->own_cap;
    } else if (in->pos > 0) {
        memmove(in->buf, in->buf + in->pos, left);
    }
    in->base += in->pos;
    in->end = left;
    in->pos = 0;
    if (n > in->cap) {
        in->cap = MAX(n, 2 * in->cap);
        in->own = in->buf = g_realloc(in->buf, in->cap);
        in->own_cap = in->cap;
    }
    while (in->end - in->pos < n)
        if (!input_more(in)) {
            in->eof = TRUE;
            return FALSE;
        }
    return TRUE;
}

/* ---- a thread that reads ahead ----------------------------------------------------------
 * A file is read (and a compressed one decompressed) by a second thread into a ring of
 * chunks while the parser works: the parser's thread neither waits for read() and its copy
 * out of the page cache (a tenth of the time of the 33 MB benchmark snapshot) nor runs zstd
 * or inflate (a fifth of it, compressed). The parser reads a chunk where it lies (feed_swap):
 * the few bytes left unread of the one before, less than FEED_HEAD, are put in front of it,
 * in room kept free there. The thread owns the file side of the Input (f, the compressed
 * buffer and stream); its last chunk carries the stream's end state (err, z_done). */

#define FEED_CHUNK ((gsize)256 << 10)
#define FEED_HEAD ((gsize)64 << 10)
#define FEED_CHUNKS 4

typedef struct {
    guint8 *data;   /* FEED_HEAD bytes of room, then the chunk's len bytes */
    gsize len;
    gboolean full;  /* filled, not yet taken back by the parser */
    gboolean last;  /* nothing follows; the Feeder's src.err and src.z_done are final */
} FeedChunk;

/* A lock and its condition, shared by a thread that fills buffers and one that takes them:
 * each buffer's `full` flag, changed under the lock, says whose it is. (pthreads, not GLib's
 * futex-based locks, so that ThreadSanitizer sees the hand-over.) */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
} Hand;

static void hand_init(Hand *h)
{
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
}

static void hand_clear(Hand *h)
{
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
}

/* Waits until *flag is `want` or *stop (NULL: never) is set; FALSE when it is. */
static gboolean hand_wait(Hand *h, const gboolean *flag, gboolean want, const gboolean *stop)
{
    pthread_mutex_lock(&h->mu);
    while (*flag != want && !(stop && *stop))
        pthread_cond_wait(&h->cv, &h->mu);
    gboolean go = !(stop && *stop);
    pthread_mutex_unlock(&h->mu);
    return go;
}

/* Sets *flag (a buffer changes hands, or a stop is asked) and wakes the other side. */
static void hand_set(Hand *h, gboolean *flag, gboolean v)
{
    pthread_mutex_lock(&h->mu);
    *flag = v;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

struct Feeder {
    Input src; /* the thread's: kind, f, zin, zs, gz; buf is the chunk being filled */
    Hand hand;
    FeedChunk chunks[FEED_CHUNKS]; /* filled and taken in turn */
    guint next_read; /* the parser's chunk, taken from cur_pos */
    gsize cur_pos;
    FeedChunk *held; /* the chunk the Input's buf is (feed_swap), given back when left */
    gboolean done;   /* the last chunk was taken */
    gboolean cancel;
    pthread_t thread;
};

static void *feeder_main(void *data)
{
    Feeder *fd = data;
    for (guint w = 0;; w = (w + 1) % FEED_CHUNKS) {
        FeedChunk *c = &fd->chunks[w];
        if (!hand_wait(&fd->hand, &c->full, FALSE, &fd->cancel))
            return NULL;
        fd->src.buf = c->data + FEED_HEAD;
        fd->src.cap = FEED_CHUNK;
        fd->src.pos = fd->src.end = 0;
        gboolean end = FALSE;
        while (!end && fd->src.end < FEED_CHUNK)
            end = !input_more(&fd->src);
        fd->src.buf = NULL;
        c->len = fd->src.end;
        c->last = end;
        hand_set(&fd->hand, &c->full, TRUE);
        if (end)
            return NULL;
    }
}

/* From now on the file side of `in` belongs to the reading thread. */
static void feeder_start(Input *in)
{
    Feeder *fd = g_new0(Feeder, 1);
    fd->src = *in;
    fd->src.buf = NULL;
    hand_init(&fd->hand);
    for (int k = 0; k < FEED_CHUNKS; k++)
        fd->chunks[k].data = g_malloc(FEED_HEAD + FEED_CHUNK);
    if (pthread_create(&fd->thread, NULL, feeder_main, fd) != 0) {
        /* no thread: read on this one */
        for (int k = 0; k < FEED_CHUNKS; k++)
            g_free(fd->chunks[k].data);
        hand_clear(&fd->hand);
        g_free(fd);
        return;
    }
    in->zin = NULL;
    in->zs = NULL;
    in->gz = NULL;
    in->feed = fd;
}

/* A chunk is taken: the last one carries the stream's end state. */
static void feed_taken(Input *in, const FeedChunk *c)
{
    Feeder *fd = in->feed;
    if (!c->last)
        return;
    fd->done = TRUE;
    in->z_done = fd->src.z_done;
    in->file_eof = TRUE;
    if (fd->src.err && !in->err)
        in->err = g_steal_pointer(&fd->src.err);
}

static gboolean feed_more(Input *in)
{
    Feeder *fd = in->feed;
    for (;;) {
        if (fd->done)
            return FALSE;
        FeedChunk *c = &fd->chunks[fd->next_read];
        if (fd->cur_pos == 0)
            hand_wait(&fd->hand, &c->full, TRUE, NULL);
        gsize n = MIN(c->len - fd->cur_pos, in->cap - in->end);
        memcpy(in->buf + in->end, c->data + FEED_HEAD + fd->cur_pos, n);
        in->end += n;
        fd->cur_pos += n;
        if (fd->cur_pos == c->len) {
            feed_taken(in, c);
            hand_set(&fd->hand, &c->full, FALSE);
            fd->next_read = (fd->next_read + 1) % FEED_CHUNKS;
            fd->cur_pos = 0;
        }
        if (n)
            return TRUE;
    }
}

/* The parser leaves the chunk its buf is. */
static void feed_give_back(Input *in)
{
    Feeder *fd = in->feed;
    if (!fd || !fd->held)
        return;
    hand_set(&fd->hand, &fd->held->full, FALSE);
    fd->held = NULL;
}

/* input_need's usual case: the next chunk, whole, becomes buf, with the bytes left unread
 * put in front of it. FALSE (nothing done but waiting for the chunk) where that is not
 * enough or they do not fit in front. */
static gboolean feed_swap(Input *in, gsize n)
{
    Feeder *fd = in->feed;
    gsize left = in->end - in->pos;
    if (fd->done || fd->cur_pos != 0 || left > FEED_HEAD)
        return FALSE;
    FeedChunk *c = &fd->chunks[fd->next_read];
    hand_wait(&fd->hand, &c->full, TRUE, NULL);
    if (left + c->len < n)
        return FALSE;
    guint8 *at = c->data + FEED_HEAD - left;
    memcpy(at, in->buf + in->pos, left);
    feed_give_back(in);
    /* buf[0] is the stream's offset of the first unread byte less FEED_HEAD - left (mod
     * 2^64: only base + pos is ever read) */
    in->base += in->pos - (FEED_HEAD - left);
    in->buf = c->data;
    in->pos = FEED_HEAD - left;
    in->end = in->cap = FEED_HEAD + c->len;
    fd->held = c;
    fd->next_read = (fd->next_read + 1) % FEED_CHUNKS;
    feed_taken(in, c);
    return TRUE;
}

/* Stops the thread (at once when the input was not read to its end) and frees what it
 * held. */
static void feeder_stop(Input *in)
{
    Feeder *fd = in->feed;
    if (!fd)
        return;
    hand_set(&fd->hand, &fd->cancel, TRUE);
    pthread_join(fd->thread, NULL);
    hand_clear(&fd->hand);
    if (fd->src.zs)
        ZSTD_freeDStream(fd->src.zs);
    if (fd->src.gz) {
        inflateEnd(fd->src.gz);
        g_free(fd->src.gz);
    }
    g_free(fd->src.zin);
    g_free(fd->src.err);
    for (int k = 0; k < FEED_CHUNKS; k++)
        g_free(fd->chunks[k].data);
    g_free(fd);
    in->feed = NULL;
}

/* ---- values ----------------------------------------------------------------------------- */

typedef enum { V_NONE, V_BOOL, V_INT, V_BIGINT, V_FLOAT, V_STR, V_BYTES, V_CONT, V_FRAME, V_STACK } VType;

typedef struct {
    guint32 len;
    guint32 id;
    guint8 bytes; /* a bytes value, not a str */
    guint8 field; /* an entry's key: its EntryField, else 0 */
    guint8 act;   /* an action's name: its Action + 1, else 0 */
    char data[];  /* NUL-terminated */
} Str;

/* The keys of a trace entry read (Str.field). */
enum { EF_OTHER, EF_ACTION, EF_ADDR, EF_SIZE, EF_STREAM, EF_FRAMES, EF_DEVICE_FREE, EF_COUNT };

typedef struct Cont Cont;

typedef struct {
    guint8 t;
    guint32 id;   /* V_FRAME, V_STACK */
    guint64 off;  /* the opcode that made it, NO_OFF for None and bools */
    union {
        gint64 i;
        double f;
        const Str *s;
        Cont *c;
    } u;
} Val;

typedef enum {
    R_NONE,
    R_ROOT,
    R_SEGS,
    R_SEG,
    R_BLOCKS,
    R_BLOCK,
    R_DTRACES,
    R_DEV,
    R_ENTRY,
    R_FRAMES,
    R_FRAME,
    R_SETTINGS,
} Role;

enum { C_LIST, C_TUPLE, C_DICT };

struct Cont {
    guint8 type;
    guint8 role;
    guint8 placed;   /* read-only: it is a part of another value */
    guint8 consumed; /* a record already read */
    guint8 hashable; /* tuples */
    guint32 refs;
    guint32 memo;    /* memo index + 1 of its PUT, 0 none (G_MAXUINT32: more than one) */
    guint32 depth;   /* 1 + the deepest container inside */
    guint64 serial;
    guint64 parent;  /* role's parent container (serial) and the index there (lists) */
    guint64 index;
    guint64 off;
    guint64 weight;  /* tuples: values held */
    gsize n, cap;    /* items; a dict's are key, value pairs: 2n Vals */
    guint64 n_read;  /* records read instead of kept (segments, devices, entries) */
    Val *items;
};

/* ---- the snapshot's records ---------------------------------------------------------------- */

typedef struct {
    uint64_t addr, size, requested;
    gboolean allocated, pending;
} Block;

typedef struct {
    uint64_t device, addr, size, stream;
    gboolean small, expandable;
    GArray *blocks;
} Segment;

typedef struct {
    const Str *file, *name;
    gint64 line;
    guint8 py, user, optim, apply, accum;
} Frame;

typedef struct {
    guint32 n, first; /* frame ids in StreamReader.stack_frames[first..first+n) */
    guint32 hash;
    guint32 str;      /* trace string index + 1, 0 = not yet interned */
    guint8 category;
    guint8 done;      /* category computed */
} Stack;

/* A u64 → (a, b) map, open addressing with linear probing and backward-shift deletion. */
typedef struct {
    uint64_t key, a, b;
    guint8 used;
} Slot;

typedef struct {
    Slot *s;
    gsize cap, n;
} Map;

static guint64 mix64(guint64 x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static Slot *map_find(const Map *m, uint64_t key)
{
    if (!m->n)
        return NULL;
    gsize i = mix64(key) & (m->cap - 1);
    while (m->s[i].used) {
        if (m->s[i].key == key)
            return &m->s[i];
        i = (i + 1) & (m->cap - 1);
    }
    return NULL;
}

static void map_grow(Map *m);

/* The slot of `key`, made (zeroed a, b) when absent; *fresh says which. */
static Slot *map_put(Map *m, uint64_t key, gboolean *fresh)
{
    if (2 * (m->n + 1) > m->cap)
        map_grow(m);
    gsize i = mix64(key) & (m->cap - 1);
    while (m->s[i].used) {
        if (m->s[i].key == key) {
            if (fresh)
                *fresh = FALSE;
            return &m->s[i];
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->s[i] = (Slot){key, 0, 0, 1};
    m->n++;
    if (fresh)
        *fresh = TRUE;
    return &m->s[i];
}

static void map_grow(Map *m)
{
    Map g = {g_new0(Slot, m->cap ? 2 * m->cap : 64), m->cap ? 2 * m->cap : 64, 0};
    for (gsize i = 0; i < m->cap; i++)
        if (m->s[i].used)
            *map_put(&g, m->s[i].key, NULL) = m->s[i];
    g_free(m->s);
    *m = g;
}

static void map_del(Map *m, Slot *sl)
{
    gsize i = (gsize)(sl - m->s);
    m->s[i].used = 0;
    m->n--;
    gsize j = i;
    for (;;) {
        j = (j + 1) & (m->cap - 1);
        if (!m->s[j].used)
            return;
        gsize h = mix64(m->s[j].key) & (m->cap - 1);
        /* move j back to i when its home is not in (i, j] */
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            m->s[i] = m->s[j];
            m->s[j].used = 0;
            i = j;
        }
    }
}

static void map_clear(Map *m)
{
    g_free(m->s);
    *m = (Map){0};
}

/* ---- one device's trace, read forward ---------------------------------------------------- */

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

#define START_ID (G_GUINT64_CONSTANT(1) << 62) /* provisional ids of blocks live at the start */

typedef struct {
    uint64_t addr, requested, size; /* size 0: unknown (found by its free) */
    uint64_t entry;                 /* the entry of its first free, or G_MAXUINT64 */
    uint64_t id;                    /* final id; 0: no segment holds it */
} StartBlock;

typedef struct {
    uint64_t addr, size, stream;
    gboolean small, expandable;
} StartSeg;

/* A parsed trace entry, coded in a few bytes (as a MemsimEvent it takes 40: a snapshot of a
 * million entries would hold 40 MB of fresh pages): a byte with the kind and the flags below,
 * then varints: the stream when it is not the last event's; ALLOC: the size, the address (as
 * the zigzag of its difference from the last address coded), the site and the category
 * where there is one (PK_SITE); FREE: how many ALLOCs back its block's was, or (PK_START) the
 * index of a block live at the start; MARK: the string; segments and OOM: the size and the
 * address. The rest of an event is implied: an ALLOC's id is its rank among the ALLOCs, its
 * flags MEMSIM_EVF_ADDR; an EMPTY_CACHE's MEMSIM_EVF_INFERRED. */
enum { PK_STREAM = 0x10, PK_SITE = 0x20, PK_START = 0x40 };
#define PK_MAX_BYTES 40 /* an event's code at most */

typedef struct {
    guint16 stream;  /* the last event's */
    uint64_t addr;   /* the last address coded */
    uint64_t allocs; /* ALLOCs so far */
} Coder;

typedef struct {
    guint32 dev;
    guint64 owner;        /* serial of its list */
    guint64 n;            /* entries read (the index in error messages) */
    /* the rest is the applying thread's (entry_apply): on cache lines of its own */
    _Alignas(64) guint64 n_parsed; /* entries that are not skipped (unknown actions) */
    /* the parsed events, provisional ids and streams, coded (see emit): code[0..code_len) */
    guint8 *code;
    gsize code_len, code_cap;
    Coder enc;
    guint n_events;
    gboolean any_oom;
    uint64_t last_handle; /* dev_stream's last answer */
    guint16 last_stream;
    gboolean any_stream;
    GArray *handles;      /* stream handles by provisional index */
    Map streams;          /* handle → provisional index */
    Map live;             /* addr → (provisional id, entry): allocated by the trace, not freed */
    Map start;            /* addr → index in startb */
    GArray *startb;       /* StartBlock found by their frees */
    Map segs;             /* addr → entry: segments the trace allocated, still there */
    Map seg_start;        /* addr → index in startseg */
    GArray *startseg;     /* StartSeg found by their frees */
    Map freed;            /* addresses freed (when the final state was not read first) */
    int64_t mapped;       /* segment_map − segment_unmap bytes */
    gboolean any_map;
    gboolean release_run; /* the last event was a segment_free / unmap */
    guint16 release_stream;
    uint64_t next_id;
} Dev;

/* A set of ids (id + 1 per slot) found by a hash the caller computes. */
typedef struct {
    guint32 id1, hash; /* id + 1, 0 = empty */
} IdSlot;

typedef struct {
    IdSlot *s;
    gsize cap, n;
} IdTable;

/* ---- the reader ---------------------------------------------------------------------------- */


typedef struct {
    const char *name;
    GError **error;
    Input in;
    gboolean failed;

    Val *stack;
    gsize n_stack, cap_stack;
    gsize *marks;
    gsize n_marks, cap_marks;
    guint32 *memo; /* handles, see memo_handle (0: none): memo[0..cap_memo), mapped
                      (memo_map) */
    gsize cap_memo, n_memo;
    /* memo indices that hold a record (read once, never referred to: its memo handle is 0,
     * as if never stored, but the index counts as set for the pickler's numbering), a bit
     * each: a million trace entries use a million indices, and their handles would be
     * megabytes of memo written for nothing */
    guint8 *recs;
    gsize cap_recs; /* bytes */
    guint64 memo_top; /* 1 + the highest index ever stored: the memo above it is unread */
    GPtrArray *conts; /* memo's containers by index (NULL: free slot) */
    GArray *free_conts;
    GArray *scalars;  /* memo's other values */
    guint64 serial;

    GHashTable *strs; /* Str* set by content */
    GPtrArray *str_by_id;
    GPtrArray *chunks; /* string blocks */
    char *chunk_at;
    gsize chunk_left;
    guint64 held, limit_base;
    guint64 ops; /* opcodes run (the memory bound is checked every 4096) */
    guint64 n_memo_first_free; /* fast_entry: memo indices from here are this entry's own */

    GArray *frames;       /* Frame */
    IdTable frame_ix;     /* frames by content */
    GArray *stacks;       /* Stack */
    GArray *stack_frames; /* guint32 */
    IdTable stack_ix;     /* stacks by their frames */

    /* interned keys and actions */
    const Str *k_segments, *k_device_traces, *k_settings, *k_blocks, *k_frames, *k_action,
        *k_addr, *k_size, *k_stream, *k_device_free, *k_filename, *k_name, *k_line, *k_device,
        *k_address, *k_total_size, *k_allocated_size, *k_segment_type, *k_is_expandable,
        *k_requested_size, *k_state;
    const Str *actions[10];

    MemsimTrace *t;
    MemsimSnapOdd odd;
    GArray *segs;         /* Segment */
    guint64 segs_owner, dtraces_owner;
    guint64 n_dev_lists;
    gboolean segs_read;   /* final state known before the traces */
    gboolean root_has_segments, root_has_traces;
    Val settings;
    gboolean settings_none; /* allocator_settings: None */
    GPtrArray *devs;      /* Dev*, by device */
    gboolean reserved_events; /* a device's events were reserved from the file's size */
    GPtrArray *codes;     /* RankCode*, by rank: the events left packed (a lazy reader's), or
                             NULL: each rank's events decoded into the trace */
    Cont *spare[256];     /* freed containers, kept with their item arrays for reuse */
    guint n_spare;
    Map pending;          /* addr → (device, its last free_requested's entry + 1, or 0): the
                             blocks the final state has allocated (pending a free or not) */
    struct Applier *apply; /* entries read, to be applied (entry_queue) */
    guint64 held_apply;   /* bytes the applying thread holds (atomic) */
} P;

#define H_KIND(h) ((h) >> 29)
#define H_INDEX(h) ((h) & ((1u << 29) - 1))
enum { H_EMPTY, H_STR, H_CONT, H_FRAME, H_STACK, H_SCALAR, H_RECORD };

#define op_name memsim_pickle_op_name

static gboolean G_GNUC_PRINTF(3, 4) fail(P *p, guint64 off, const char *fmt, ...)
{
    if (p->failed)
        return FALSE;
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *what = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(p->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: byte %" G_GUINT64_FORMAT ": %s",
                p->name, off, what);
    p->failed = TRUE;
    return FALSE;
}

/* The error of a record named `where`, as fail_at and apply_fail make it. */
static GError *where_error(const P *p, const char *where, const char *fmt, va_list ap)
{
    g_autofree char *what = g_strdup_vprintf(fmt, ap);
    return g_error_new(MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s: %s", p->name, where, what);
}

/* A schema error, named by its record as snapshot.c names it. */
static gboolean G_GNUC_PRINTF(3, 4) fail_at(P *p, const char *where, const char *fmt, ...)
{
    if (p->failed)
        return FALSE;
    va_list ap;
    va_start(ap, fmt);
    g_propagate_error(p->error, where_error(p, where, fmt, ap));
    va_end(ap);
    p->failed = TRUE;
    return FALSE;
}

static guint64 here(const P *p)
{
    return p->in.base + p->in.pos;
}

static void hold(P *p, gint64 bytes)
{
    p->held += (guint64)bytes;
}

static gboolean over_limit(P *p)
{
    return p->held + __atomic_load_n(&p->held_apply, __ATOMIC_RELAXED) >
           here(p) * STREAM_MEM_PER_BYTE + STREAM_MEM_BASE;
}

/* hold() for what applying entries holds (entry_apply, possibly on its own thread): counted
 * by the batch (apply_batch). */
static void hold_apply(P *p, gint64 bytes);


static void odd(P *p, int64_t device, const char *kind, const char *where, const char *fmt, ...)
    G_GNUC_PRINTF(5, 6);

static void odd(P *p, int64_t device, const char *kind, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    memsim_snap_odd_note(&p->odd, device, kind, where, msg);
}

/* ---- strings ------------------------------------------------------------------------------- */

static guint str_hash(gconstpointer a)
{
    const Str *s = a;
    guint h = s->bytes ? 2166136263u : 2166136261u;
    for (guint32 i = 0; i < s->len; i++)
        h = (h ^ (guint8)s->data[i]) * 16777619u;
    return h;
}

static gboolean str_equal(gconstpointer a, gconstpointer b)
{
    const Str *x = a, *y = b;
    return x->len == y->len && x->bytes == y->bytes && memcmp(x->data, y->data, x->len) == 0;
}

/* Interned strings live in blocks of at least 64 KiB, 8-byte aligned, freed at the end. */
static Str *str_alloc(P *p, gsize bytes)
{
    bytes = (bytes + 7) & ~(gsize)7;
    if (p->chunk_left < bytes) {
        gsize sz = MAX(bytes, (gsize)64 << 10);
        guint64 *blk = g_malloc(sz);
        g_ptr_array_add(p->chunks, blk);
        p->chunk_at = (char *)blk;
        p->chunk_left = sz;
        hold(p, (gint64)sz);
    }
    Str *s = (Str *)p->chunk_at;
    p->chunk_at += bytes;
    p->chunk_left -= bytes;
    return s;
}

static const Str *intern(P *p, const char *s, gsize n, gboolean bytes)
{
    /* a lookup key on the stack for short strings, on the heap for long ones */
    guint8 small[sizeof(Str) + 256];
    Str *key = n < 256 ? (Str *)small : g_malloc(sizeof(Str) + n + 1);
    key->len = (guint32)n;
    key->bytes = bytes ? 1 : 0;
    key->field = key->act = 0;
    memcpy(key->data, s, n);
    key->data[n] = '\0';
    Str *found = g_hash_table_lookup(p->strs, key);
    if (!found) {
        found = str_alloc(p, sizeof(Str) + n + 1);
        memcpy(found, key, sizeof(Str) + n + 1);
        found->id = p->str_by_id->len;
        g_ptr_array_add(p->str_by_id, found);
        g_hash_table_add(p->strs, found);
        hold(p, 48);
    }
    if ((guint8 *)key != small)
        g_free(key);
    return found;
}

static const Str *intern0(P *p, const char *s)
{
    return intern(p, s, strlen(s), FALSE);
}

/* ---- containers ---------------------------------------------------------------------------- */

static void val_unref(P *p, Val *v);

static Cont *cont_new(P *p, guint8 type, guint64 off)
{
    Cont *c;
    if (p->n_spare) {
        c = p->spare[--p->n_spare];
        Val *items = c->items;
        gsize cap = c->cap;
        memset(c, 0, sizeof *c);
        c->items = items;
        c->cap = cap;
        hold(p, (gint64)(cap * sizeof(Val)));
    } else {
        c = g_new0(Cont, 1);
    }
    c->type = type;
    c->refs = 1;
    c->off = off;
    c->serial = ++p->serial;
    c->depth = 1;
    c->hashable = TRUE;
    c->weight = 1;
    hold(p, sizeof *c + 16);
    return c;
}

static void cont_items_free(P *p, Cont *c, gboolean keep)
{
    gsize m = c->type == C_DICT ? 2 * c->n : c->n;
    for (gsize i = 0; i < m; i++)
        val_unref(p, &c->items[i]);
    hold(p, -(gint64)(c->cap * sizeof(Val)));
    c->n = 0;
    if (!keep) {
        g_free(c->items);
        c->items = NULL;
        c->cap = 0;
    }
}

static void cont_unref(P *p, Cont *c)
{
    if (--c->refs)
        return;
    cont_items_free(p, c, TRUE);
    hold(p, -(gint64)(sizeof *c + 16));
    /* (freeing the items may have filled the spares) */
    if (p->n_spare < G_N_ELEMENTS(p->spare) && c->cap <= 64) {
        p->spare[p->n_spare++] = c;
    } else {
        g_free(c->items);
        g_free(c);
    }
}

static void val_unref(P *p, Val *v)
{
    if (v->t == V_CONT) {
        cont_unref(p, v->u.c);
        v->t = V_NONE;
    }
}

static Val val_ref(Val v)
{
    if (v.t == V_CONT)
        v.u.c->refs++;
    return v;
}

static void cont_reserve(P *p, Cont *c, gsize extra)
{
    gsize per = c->type == C_DICT ? 2 : 1;
    gsize need = (c->n + extra) * per;
    if (need <= c->cap)
        return;
    gsize cap = MAX(need, 2 * c->cap);
    cap = MAX(cap, 16); /* an entry's 6 pairs, a frame's 3, a stack's frames: one array */
    hold(p, (gint64)((cap - c->cap) * sizeof(Val)));
    c->items = g_renew(Val, c->items, cap);
    c->cap = cap;
}

/* ---- the value stack ----------------------------------------------------------------------- */

static inline void push(P *p, Val v)
{
    if (G_UNLIKELY(p->n_stack == p->cap_stack)) {
        gsize cap = p->cap_stack ? 2 * p->cap_stack : 256;
        hold(p, (gint64)((cap - p->cap_stack) * sizeof(Val)));
        p->stack = g_renew(Val, p->stack, cap);
        p->cap_stack = cap;
    }
    p->stack[p->n_stack++] = v;
}

static gsize fence(const P *p)
{
    return p->n_marks ? p->marks[p->n_marks - 1] : 0;
}

static gboolean need_stack(P *p, guint64 off, guint8 op, gsize n)
{
    if (p->n_stack - fence(p) < n)
        return fail(p, off, "stack underflow: opcode 0x%02x (%s) needs %" G_GSIZE_FORMAT
                    " value%s above the last mark, there %s %" G_GSIZE_FORMAT,
                    op, op_name(op), n, n == 1 ? "" : "s",
                    p->n_stack - fence(p) == 1 ? "is" : "are", p->n_stack - fence(p));
    return TRUE;
}

static gboolean pop_mark(P *p, guint64 off, guint8 op, gsize *mark)
{
    if (p->n_marks == 0)
        return fail(p, off, "opcode 0x%02x (%s) needs a MARK and there is none", op, op_name(op));
    *mark = p->marks[--p->n_marks];
    return TRUE;
}

static const char *type_name(const Val *v)
{
    switch (v->t) {
    case V_NONE:
        return "None";
    case V_BOOL:
        return "bool";
    case V_INT:
        return "int";
    case V_BIGINT:
        return "int (beyond 64 bits)";
    case V_FLOAT:
        return "float";
    case V_STR:
        return "str";
    case V_BYTES:
        return "bytes";
    case V_FRAME:
        return "dict";
    case V_STACK:
        return "list";
    case V_CONT:
        return v->u.c->type == C_LIST ? "list" : v->u.c->type == C_TUPLE ? "tuple" : "dict";
    }
    return "?";
}

/* " (byte N)" for a value made at a known place; in buf. */
static const char *at_byte(const Val *v, char buf[40])
{
    if (v->off == NO_OFF)
        return "";
    g_snprintf(buf, 40, " (byte %" G_GUINT64_FORMAT ")", v->off);
    return buf;
}

/* ---- roles ------------------------------------------------------------------------------------ */

/* The role of a value placed at `key` of a dict of role `r`. */
static Role field_role(P *p, Role r, const Val *key)
{
    if (key->t != V_STR)
        return R_NONE;
    const Str *k = key->u.s;
    switch (r) {
    case R_ROOT:
        return k == p->k_segments ? R_SEGS
             : k == p->k_device_traces ? R_DTRACES
             : k == p->k_settings ? R_SETTINGS
                                  : R_NONE;
    case R_SEG:
        return k == p->k_blocks ? R_BLOCKS : R_NONE;
    case R_BLOCK:
    case R_ENTRY:
        return k == p->k_frames ? R_FRAMES : R_NONE;
    default:
        return R_NONE;
    }
}

static Role item_role(Role r)
{
    switch (r) {
    case R_SEGS:
        return R_SEG;
    case R_BLOCKS:
        return R_BLOCK;
    case R_DTRACES:
        return R_DEV;
    case R_DEV:
        return R_ENTRY;
    case R_FRAMES:
        return R_FRAME;
    default:
        return R_NONE;
    }
}

static gboolean role_is_list(Role r)
{
    return r == R_SEGS || r == R_BLOCKS || r == R_DTRACES || r == R_DEV || r == R_FRAMES;
}

static gboolean role_fits(Role r, guint8 type)
{
    if (r == R_NONE || r == R_SETTINGS)
        return FALSE;
    return role_is_list(r) ? type == C_LIST : type == C_DICT;
}

static gboolean open_cont(const Val *v, guint8 type)
{
    return v->t == V_CONT && !v->u.c->placed && v->u.c->type == type;
}

/* The place in the schema of a container of `type` made now, told from the stack (see the
 * file's header): either an item of the MARK run of the open container below the last MARK
 * ("batch"), or the one item of the list just below it, or the value of the key just below
 * it in the dict below that ("single"). The schema settles the cases both readings allow. */
static void infer_role(P *p, Cont *c)
{
    gsize h = p->n_stack, f = fence(p);
    Role ra = R_NONE, rb = R_NONE;
    guint64 pa = 0, ia = 0, pb = 0, ib = 0;
    gboolean a_ok = FALSE, b_ok = FALSE;
    if (h == 0 && p->n_marks == 0) {
        c->role = c->type == C_DICT ? R_ROOT : c->type == C_LIST ? R_SEGS : R_NONE;
        return;
    }
    if (p->n_marks && f >= 1 && h >= f && p->stack[f - 1].t == V_CONT &&
        !p->stack[f - 1].u.c->placed) {
        Cont *par = p->stack[f - 1].u.c;
        if (par->type == C_LIST) {
            a_ok = TRUE;
            ra = item_role(par->role);
            pa = par->serial;
            ia = par->n + par->n_read + (h - f);
        } else if (par->type == C_DICT && (h - f) % 2 == 1) {
            a_ok = TRUE;
            ra = field_role(p, par->role, &p->stack[h - 1]);
            pa = par->serial;
        }
    }
    if (h >= f + 1 && h >= 1 && open_cont(&p->stack[h - 1], C_LIST)) {
        Cont *par = p->stack[h - 1].u.c;
        b_ok = TRUE;
        rb = item_role(par->role);
        pb = par->serial;
        ib = par->n + par->n_read;
    } else if (h >= f + 2 && h >= 2 && open_cont(&p->stack[h - 2], C_DICT) &&
               p->stack[h - 1].t == V_STR) {
        Cont *par = p->stack[h - 2].u.c;
        b_ok = TRUE;
        rb = field_role(p, par->role, &p->stack[h - 1]);
        pb = par->serial;
    }
    gboolean fa = a_ok && role_fits(ra, c->type), fb = b_ok && role_fits(rb, c->type);
    if (fb && !fa) {
        c->role = rb, c->parent = pb, c->index = ib;
    } else if (a_ok) {
        c->role = ra, c->parent = pa, c->index = ia;
    } else if (b_ok) {
        c->role = rb, c->parent = pb, c->index = ib;
    }
    if (!role_fits(c->role, c->type) && c->role != R_SETTINGS)
        c->role = R_NONE;
}

/* ---- frames and stacks ------------------------------------------------------------------- */

static void id_grow(P *p, IdTable *t)
{
    gsize cap = t->cap ? 2 * t->cap : 1024;
    IdSlot *ns = g_new0(IdSlot, cap);
    hold(p, (gint64)((cap - t->cap) * sizeof(IdSlot)));
    for (gsize i = 0; i < t->cap; i++) {
        if (!t->s[i].id1)
            continue;
        gsize j = t->s[i].hash & (cap - 1);
        while (ns[j].id1)
            j = (j + 1) & (cap - 1);
        ns[j] = t->s[i];
    }
    g_free(t->s);
    t->s = ns;
    t->cap = cap;
}

static guint32 frame_hash(const Frame *f)
{
    return (guint32)mix64((guint64)(gsize)f->file * 31 + (guint64)(gsize)f->name * 7 +
                          (guint64)f->line);
}

/* c10 frames carry no .py file; a frame is the program's own when it is outside torch and
 * the installed packages (snapshot.c read_frames). */
static guint32 frame_intern(P *p, const Str *file, const Str *name, gint64 line)
{
    Frame f = {file, name, line, 0, 0, 0, 0, 0};
    guint32 h = frame_hash(&f);
    if (2 * (p->frame_ix.n + 1) > p->frame_ix.cap)
        id_grow(p, &p->frame_ix);
    gsize j = h & (p->frame_ix.cap - 1);
    while (p->frame_ix.s[j].id1) {
        IdSlot *sl = &p->frame_ix.s[j];
        if (sl->hash == h) {
            const Frame *g = &g_array_index(p->frames, Frame, sl->id1 - 1);
            if (g->file == file && g->name == name && g->line == line)
                return sl->id1 - 1;
        }
        j = (j + 1) & (p->frame_ix.cap - 1);
    }
    const char *fn = file ? file->data : NULL, *nm = name ? name->data : NULL;
    f.accum = nm && (strstr(nm, "AccumulateGrad") || strstr(nm, "accumulate_grad"));
    f.py = fn && g_str_has_suffix(fn, ".py");
    if (f.py) {
        f.optim = strstr(fn, "/torch/optim/") != NULL;
        f.apply = strstr(fn, "/torch/nn/modules/module.py") && nm && strcmp(nm, "_apply") == 0;
        f.user = !strstr(fn, "/torch/") && !strstr(fn, "/site-packages/") &&
                 !strstr(fn, "/dist-packages/") && !strstr(fn, "/lib/python3");
    }
    guint32 id = p->frames->len;
    g_array_append_val(p->frames, f);
    hold(p, sizeof f);
    p->frame_ix.s[j] = (IdSlot){id + 1, h};
    p->frame_ix.n++;
    return id;
}

/* The last value of `key` in a dict's items, or NULL. */
static const Val *dict_get(const Cont *d, const Str *key)
{
    const Val *found = NULL;
    for (gsize i = 0; i < d->n; i++)
        if (d->items[2 * i].t == V_STR && d->items[2 * i].u.s == key)
            found = &d->items[2 * i + 1];
    return found;
}

static guint32 frame_of_dict(P *p, const Cont *d)
{
    const Val *fv = dict_get(d, p->k_filename), *nv = dict_get(d, p->k_name),
              *lv = dict_get(d, p->k_line);
    return frame_intern(p, fv && fv->t == V_STR ? fv->u.s : NULL,
                        nv && nv->t == V_STR ? nv->u.s : NULL, lv && lv->t == V_INT ? lv->u.i : 0);
}

/* The stack of the frame ids appended to stack_frames from `first` on: an existing one (and
 * they are taken back) or a new one. */
static guint32 stack_intern_ids(P *p, const guint32 *ids, guint32 n);

static guint32 stack_intern(P *p, guint32 first)
{
    guint32 n = p->stack_frames->len - first;
    guint32 *copy = n ? g_memdup2(&g_array_index(p->stack_frames, guint32, first),
                                  n * sizeof(guint32))
                      : NULL;
    g_array_set_size(p->stack_frames, first);
    guint32 id = stack_intern_ids(p, copy, n);
    g_free(copy);
    return id;
}

/* The stack of these frame ids: an existing one or a new one. */
static guint32 stack_intern_ids(P *p, const guint32 *ids, guint32 n)
{
    guint64 h64 = 0x84222325cbf29ce4ULL ^ n;
    for (guint32 i = 0; i < n; i++)
        h64 = mix64(h64 + ids[i] + 1);
    guint32 h = (guint32)h64;
    if (2 * (p->stack_ix.n + 1) > p->stack_ix.cap)
        id_grow(p, &p->stack_ix);
    gsize j = h & (p->stack_ix.cap - 1);
    while (p->stack_ix.s[j].id1) {
        IdSlot *sl = &p->stack_ix.s[j];
        if (sl->hash == h) {
            const Stack *s = &g_array_index(p->stacks, Stack, sl->id1 - 1);
            if (s->n == n && (n == 0 || memcmp(&g_array_index(p->stack_frames, guint32, s->first),
                                               ids, n * sizeof(guint32)) == 0))
                return sl->id1 - 1;
        }
        j = (j + 1) & (p->stack_ix.cap - 1);
    }
    Stack s = {n, p->stack_frames->len, h, 0, MEMSIM_CAT_OTHER, 0};
    if (n)
        g_array_append_vals(p->stack_frames, ids, n);
    guint32 id = p->stacks->len;
    g_array_append_val(p->stacks, s);
    hold(p, (gint64)(sizeof s + n * sizeof(guint32)));
    p->stack_ix.s[j] = (IdSlot){id + 1, h};
    p->stack_ix.n++;
    return id;
}

/* A frames list → its stack id: frame dicts and frames read already; other items are no
 * frames (snapshot.c skips them too). */
static guint32 stack_of_list(P *p, const Cont *l)
{
    guint32 first = p->stack_frames->len;
    for (gsize i = 0; i < l->n; i++) {
        const Val *it = &l->items[i];
        guint32 f;
        if (it->t == V_FRAME)
            f = it->id;
        else if (it->t == V_CONT && it->u.c->type == C_DICT)
            f = frame_of_dict(p, it->u.c);
        else
            continue;
        g_array_append_val(p->stack_frames, f);
    }
    return stack_intern(p, first);
}

/* An alloc's site and category from its stack, as snapshot.c read_frames makes them (the
 * stack text interned in the trace when an alloc first uses it). */
static guint32 stack_site(P *p, guint32 sid, guint8 *category)
{
    Stack *s = &g_array_index(p->stacks, Stack, sid);
    if (!s->done) {
        GString *g = NULL;
        gboolean user = FALSE;
        guint8 cat = MEMSIM_CAT_OTHER;
        for (guint32 i = 0; i < s->n; i++) {
            const Frame *f =
                &g_array_index(p->frames, Frame, g_array_index(p->stack_frames, guint32, s->first + i));
            if (f->accum && cat == MEMSIM_CAT_OTHER)
                cat = MEMSIM_CAT_GRADIENT;
            if (!f->py)
                continue;
            if (!user && f->optim && cat == MEMSIM_CAT_OTHER)
                cat = MEMSIM_CAT_OPTIMIZER_STATE;
            if (!user && f->apply && cat == MEMSIM_CAT_OTHER)
                cat = MEMSIM_CAT_PARAMETER;
            if (f->user)
                user = TRUE;
            if (!g)
                g = g_string_new(NULL);
            else if (g->len > 65536)
                break;
            g_string_append_printf(g, "%s%s:%" G_GINT64_FORMAT " %s", g->len ? "\n" : "",
                                   f->file->data, f->line, f->name ? f->name->data : "?");
        }
        s = &g_array_index(p->stacks, Stack, sid);
        s->str = memsim_trace_intern(p->t, g ? g->str : "(no frames)") + 1;
        s->category = cat;
        s->done = 1;
        if (g)
            g_string_free(g, TRUE);
    }
    *category = s->category;
    return s->str;
}

/* ---- records: fields --------------------------------------------------------------------- */

/* An integer field that must be present (when required) and non-negative. */
static gboolean get_u64(P *p, const Cont *d, const Str *key, const char *where,
                        gboolean required, uint64_t *out)
{
    const Val *v = dict_get(d, key);
    if (!v) {
        if (!required)
            return TRUE;
        return fail_at(p, where, "missing key '%s'", key->data);
    }
    char buf[40];
    if (v->t == V_BIGINT)
        return fail_at(p, where, "'%s' does not fit in 64 bits%s", key->data, at_byte(v, buf));
    if (v->t != V_INT)
        return fail_at(p, where, "'%s' is a %s, expected an int%s", key->data, type_name(v),
                       at_byte(v, buf));
    if (v->u.i < 0)
        return fail_at(p, where, "'%s' is negative (%" G_GINT64_FORMAT ")", key->data, v->u.i);
    *out = (uint64_t)v->u.i;
    return TRUE;
}

/* A field's value as get_u64 reads it, without a message: FALSE when get_u64 would fail. */
static inline gboolean val_u64(const Val *v, gboolean required, uint64_t *out)
{
    if (!v)
        return !required;
    if (v->t != V_INT || v->u.i < 0)
        return FALSE;
    *out = (uint64_t)v->u.i;
    return TRUE;
}

/* get_u64 without a message: FALSE when get_u64 would fail */
static inline gboolean fast_u64(const Cont *d, const Str *key, gboolean required, uint64_t *out)
{
    const Val *v = dict_get(d, key);
    if (!v)
        return !required;
    if (v->t != V_INT || v->u.i < 0)
        return FALSE;
    *out = (uint64_t)v->u.i;
    return TRUE;
}

static const Str *get_str(const Cont *d, const Str *key)
{
    const Val *v = dict_get(d, key);
    return v && v->t == V_STR ? v->u.s : NULL;
}

static gboolean expect_dict(P *p, const Val *v, const char *where)
{
    char buf[40];
    if (v->t == V_CONT && v->u.c->type == C_DICT)
        return TRUE;
    return fail_at(p, where, "is a %s, expected a dict%s", type_name(v), at_byte(v, buf));
}

static gboolean once(P *p, const Val *v, const char *where)
{
    char buf[40];
    if (v->t == V_CONT && v->u.c->consumed)
        return fail_at(p, where, "this %s%s appears more than once (through memo references): a "
                       "snapshot writes each record once", type_name(v), at_byte(v, buf));
    return TRUE;
}

/* ---- segments ------------------------------------------------------------------------------ */

static gboolean read_segment(P *p, const Val *v, gsize i)
{
    char where[64];
    g_snprintf(where, sizeof where, "segments[%zu]", i);
    if (!expect_dict(p, v, where) || !once(p, v, where))
        return FALSE;
    const Cont *s = v->u.c;
    Segment seg = {0};
    uint64_t allocated_size = 0;
    if (!get_u64(p, s, p->k_device, where, FALSE, &seg.device) ||
        !get_u64(p, s, p->k_address, where, TRUE, &seg.addr) ||
        !get_u64(p, s, p->k_total_size, where, TRUE, &seg.size) ||
        !get_u64(p, s, p->k_stream, where, FALSE, &seg.stream) ||
        !get_u64(p, s, p->k_allocated_size, where, FALSE, &allocated_size))
        return FALSE;
    if (seg.size == 0 || seg.addr + seg.size < seg.addr)
        return fail_at(p, where, "segment of %" G_GUINT64_FORMAT " bytes at 0x%" G_GINT64_MODIFIER
                       "x is empty or wraps around", seg.size, seg.addr);
    if (allocated_size > seg.size)
        odd(p, (int64_t)seg.device, "segments whose allocated_size exceeds their size", where,
            "allocated_size %" G_GUINT64_FORMAT " > total_size %" G_GUINT64_FORMAT,
            allocated_size, seg.size);
    const Str *type = get_str(s, p->k_segment_type);
    seg.small = type ? strcmp(type->data, "small") == 0 : seg.size == SMALL_SEGMENT;
    const Val *e = dict_get(s, p->k_is_expandable);
    seg.expandable = e && e->t == V_BOOL && e->u.i;
    const Val *bl = dict_get(s, p->k_blocks);
    char bwhere[80];
    g_snprintf(bwhere, sizeof bwhere, "%s.blocks", where);
    char buf[40];
    if (!bl)
        return fail_at(p, bwhere, "missing");
    if (bl->t != V_CONT || bl->u.c->type == C_DICT)
        return fail_at(p, bwhere, "is a %s, expected a list%s", type_name(bl), at_byte(bl, buf));
    if (!once(p, bl, bwhere))
        return FALSE;
    const Cont *blocks = bl->u.c;
    seg.blocks = g_array_new(FALSE, FALSE, sizeof(Block));
    uint64_t at = seg.addr;
    for (gsize j = 0; j < blocks->n; j++) {
        g_snprintf(bwhere, sizeof bwhere, "%s.blocks[%zu]", where, j);
        const Val *bv = &blocks->items[j];
        Block blk = {0};
        if (!expect_dict(p, bv, bwhere) || !once(p, bv, bwhere) ||
            !get_u64(p, bv->u.c, p->k_size, bwhere, TRUE, &blk.size) ||
            !get_u64(p, bv->u.c, p->k_requested_size, bwhere, FALSE, &blk.requested)) {
            g_array_unref(seg.blocks);
            return FALSE;
        }
        blk.addr = at;
        if (!get_u64(p, bv->u.c, p->k_address, bwhere, FALSE, &blk.addr)) {
            g_array_unref(seg.blocks);
            return FALSE;
        }
        const Str *state = get_str(bv->u.c, p->k_state);
        if (!state) {
            g_array_unref(seg.blocks);
            return fail_at(p, bwhere, "missing or non-string 'state'");
        }
        blk.allocated = strcmp(state->data, "inactive") != 0;
        blk.pending = strcmp(state->data, "active_pending_free") == 0;
        /* c10/cuda/CUDACachingAllocator.h BlockInfo and torch/csrc/cuda/Module.cpp
         * _cuda_memorySnapshot: a block is active_allocated, active_pending_free or inactive */
        if (blk.allocated && !blk.pending && strcmp(state->data, "active_allocated") != 0)
            odd(p, (int64_t)seg.device, "blocks in a state that does not exist", bwhere,
                "state '%.64s' (expected active_allocated, active_pending_free or "
                "inactive), read as allocated", state->data);
        if (blk.addr != at || blk.size == 0 || blk.addr + blk.size > seg.addr + seg.size) {
            g_array_unref(seg.blocks);
            return fail_at(p, bwhere,
                           "block at 0x%" G_GINT64_MODIFIER "x of %" G_GUINT64_FORMAT
                           " bytes does not tile its segment (expected it at 0x%"
                           G_GINT64_MODIFIER "x)", blk.addr, blk.size, at);
        }
        at += blk.size;
        g_array_append_val(seg.blocks, blk);
        if (blk.allocated) {
            Slot *ps = map_put(&p->pending, blk.addr, NULL);
            ps->a = seg.device;
            ps->b = 0;
        }
    }
    if (blocks->n && at != seg.addr + seg.size) {
        g_array_unref(seg.blocks);
        return fail_at(p, where, "blocks cover %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT
                       " bytes", at - seg.addr, seg.size);
    }
    hold(p, (gint64)(sizeof seg + seg.blocks->len * sizeof(Block)));
    g_array_append_val(p->segs, seg);
    return TRUE;
}

/* ---- trace entries, one device at a time ---------------------------------------------------- */

/* Large arrays filled once from start to end: transparent huge pages, where the kernel
 * offers them on request, spare a page fault per 4 KiB (a tenth of the reading time on a
 * virtual machine). Only a hint. */
static void advise_huge(void *data, gsize bytes)
{
#ifdef MADV_HUGEPAGE
    const gsize huge = (gsize)2 << 20;
    guintptr a = ((guintptr)data + huge - 1) & ~(guintptr)(huge - 1);
    guintptr e = ((guintptr)data + bytes) & ~(guintptr)(huge - 1);
    if (e > a)
        madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)data;
    (void)bytes;
#endif
}

/* The memo's opposite: its pages are touched here and there (a string's index, a frames
 * list's), and a huge page would zero 2 MiB for each. Only a hint. */
static void advise_small(void *data, gsize bytes)
{
#ifdef MADV_NOHUGEPAGE
    madvise(data, bytes, MADV_NOHUGEPAGE);
#else
    (void)data;
    (void)bytes;
#endif
}

static Dev *dev_new(P *p, guint32 d);

static inline Dev *dev_get(P *p, guint32 d)
{
    Dev *v = d < p->devs->len ? g_ptr_array_index(p->devs, d) : NULL;
    return G_LIKELY(v) ? v : dev_new(p, d);
}

static Dev *dev_new(P *p, guint32 d)
{
    if (d >= p->devs->len)
        g_ptr_array_set_size(p->devs, d + 1);
    Dev *v = g_ptr_array_index(p->devs, d);
    if (!v) {
        v = g_aligned_alloc0(1, sizeof(Dev), 64); /* (Dev's alignment) */
        v->dev = d;
        v->handles = g_array_new(FALSE, FALSE, sizeof(uint64_t));
        v->startb = g_array_new(FALSE, FALSE, sizeof(StartBlock));
        v->startseg = g_array_new(FALSE, FALSE, sizeof(StartSeg));
        v->next_id = 1;
        g_ptr_array_index(p->devs, d) = v;
        hold(p, 1024);
    }
    return v;
}

static void dev_free(gpointer x)
{
    Dev *v = x;
    if (!v)
        return;
    g_free(v->code);
    g_array_unref(v->handles);
    g_array_unref(v->startb);
    g_array_unref(v->startseg);
    map_clear(&v->streams);
    map_clear(&v->live);
    map_clear(&v->start);
    map_clear(&v->segs);
    map_clear(&v->seg_start);
    map_clear(&v->freed);
    g_aligned_free(v);
}

static guint16 dev_stream_find(Dev *v, uint64_t handle);

static guint16 dev_stream(Dev *v, uint64_t handle)
{
    if (v->any_stream && handle == v->last_handle)
        return v->last_stream;
    v->any_stream = TRUE;
    v->last_handle = handle;
    v->last_stream = dev_stream_find(v, handle);
    return v->last_stream;
}

static guint16 dev_stream_find(Dev *v, uint64_t handle)
{
    gboolean fresh;
    Slot *s = map_put(&v->streams, handle, &fresh);
    if (fresh) {
        s->a = v->handles->len;
        g_array_append_val(v->handles, handle);
    }
    return (guint16)MIN(s->a, 65535u); /* more than 65535 streams are refused at the end */
}

static inline Action parse_action(P *p, const Str *a)
{
    return a->act ? (Action)(a->act - 1) : A_OTHER;
}

/* Room for the events of the first device: about 8 bytes for each 20 bytes of the snapshot,
 * reserved (untouched until used, so not resident) so that it does not move: an entry of
 * device_traces takes at least about 20 bytes of pickle (its dict, four memoized keys and
 * values) and its code about 5 on average; moving it copies every event. Others, and beyond
 * that, grow by doubling. */
static void code_grow(P *p, Dev *v)
{
    gsize cap;
    if (!v->code_cap && !p->reserved_events) {
        cap = (gsize)MIN(p->in.total / 20 * 8 + 4096, (guint64)1 << 32);
        p->reserved_events = TRUE;
    } else {
        cap = MAX(2 * v->code_cap, (gsize)4096);
    }
    v->code = g_realloc(v->code, cap);
    v->code_cap = cap;
    if (!v->code_len)
        advise_huge(v->code, cap);
}

static inline guint8 *put_varint(guint8 *o, uint64_t x)
{
    while (x >= 0x80) {
        *o++ = (guint8)(x | 0x80);
        x >>= 7;
    }
    *o++ = (guint8)x;
    return o;
}

static inline const guint8 *get_varint(const guint8 *i, uint64_t *x)
{
    uint64_t v = 0;
    int sh = 0;
    while (*i & 0x80) {
        v |= (uint64_t)(*i++ & 0x7f) << sh;
        sh += 7;
    }
    *x = v | (uint64_t)*i++ << sh;
    return i;
}

static inline uint64_t zig(uint64_t d)
{
    return d << 1 ^ (uint64_t)((int64_t)d >> 63);
}

static inline uint64_t unzig(uint64_t z)
{
    return z >> 1 ^ (~(z & 1) + 1);
}

/* Codes one event at o (PK_MAX_BYTES of room); returns where the next goes. */
static inline guint8 *encode(Coder *c, const MemsimEvent *ev, guint8 *o)
{
    guint8 *h = o++, b = ev->kind;
    if (ev->stream != c->stream) {
        b |= PK_STREAM;
        o = put_varint(o, ev->stream);
        c->stream = ev->stream;
    }
    switch (ev->kind) {
    case MEMSIM_EV_ALLOC:
        c->allocs++;
        g_assert(ev->id == c->allocs && ev->flags == MEMSIM_EVF_ADDR); /* (read_entry_pairs) */
        o = put_varint(o, ev->size);
        o = put_varint(o, zig(ev->addr - c->addr));
        c->addr = ev->addr;
        if (ev->aux || ev->category) {
            b |= PK_SITE;
            o = put_varint(o, ev->aux);
            *o++ = ev->category;
        }
        break;
    case MEMSIM_EV_FREE:
        if (ev->id & START_ID) {
            b |= PK_START;
            o = put_varint(o, ev->id & ~START_ID);
        } else {
            o = put_varint(o, c->allocs - ev->id);
        }
        break;
    case MEMSIM_EV_MARK:
        o = put_varint(o, ev->id);
        break;
    case MEMSIM_EV_EMPTY_CACHE:
        break;
    default: /* segments, OOM */
        o = put_varint(o, ev->size);
        o = put_varint(o, zig(ev->addr - c->addr));
        c->addr = ev->addr;
        break;
    }
    *h = b;
    return o;
}

/* The event coded at i (provisional, as emit was given it); returns where the next is. */
static inline const guint8 *decode(Coder *c, const guint8 *i, MemsimEvent *ev)
{
    const guint8 b = *i++;
    uint64_t x;
    memset(ev, 0, sizeof *ev);
    ev->kind = b & 0x0f;
    if (b & PK_STREAM) {
        i = get_varint(i, &x);
        c->stream = (guint16)x;
    }
    ev->stream = c->stream;
    switch (ev->kind) {
    case MEMSIM_EV_ALLOC:
        ev->id = ++c->allocs;
        ev->flags = MEMSIM_EVF_ADDR;
        i = get_varint(i, &ev->size);
        i = get_varint(i, &x);
        ev->addr = c->addr += unzig(x);
        if (b & PK_SITE) {
            i = get_varint(i, &ev->aux);
            ev->category = *i++;
        }
        break;
    case MEMSIM_EV_FREE:
        i = get_varint(i, &x);
        ev->id = b & PK_START ? x | START_ID : c->allocs - x;
        break;
    case MEMSIM_EV_MARK:
        i = get_varint(i, &ev->id);
        break;
    case MEMSIM_EV_EMPTY_CACHE:
        ev->flags = MEMSIM_EVF_INFERRED;
        break;
    default:
        i = get_varint(i, &ev->size);
        i = get_varint(i, &x);
        ev->addr = c->addr += unzig(x);
        break;
    }
    return i;
}

static inline void emit(P *p, Dev *v, const MemsimEvent *ev)
{
    v->any_oom |= ev->kind == MEMSIM_EV_OOM;
    if (G_UNLIKELY(v->code_cap - v->code_len < PK_MAX_BYTES))
        code_grow(p, v);
    guint8 *o = encode(&v->enc, ev, v->code + v->code_len);
    gsize n = (gsize)(o - (v->code + v->code_len));
    v->code_len += n;
    v->n_events++;
    hold_apply(p, (gint64)n);
}

/* One entry of device_traces[dev], read as snapshot.c's read_entries and build_device read it. */
static gboolean read_entry_pairs(P *p, Dev *v, Val *items, gsize n_pairs);

static gboolean read_entry(P *p, Dev *v, const Val *ev_val)
{
    if (G_UNLIKELY(ev_val->t != V_CONT || ev_val->u.c->type != C_DICT || ev_val->u.c->consumed)) {
        char where[80];
        g_snprintf(where, sizeof where, "device_traces[%u][%" G_GUINT64_FORMAT "]", v->dev,
                   v->n++);
        return expect_dict(p, ev_val, where) && once(p, ev_val, where);
    }
    return read_entry_pairs(p, v, ev_val->u.c->items, ev_val->u.c->n);
}

/* An entry's fields by Str.field (the last value of each key, as dict_get); f[EF_OTHER]: any
 * other key's. */
typedef struct {
    const Val *f[EF_COUNT];
} EntryVals;

/* What is wrong with an entry's fields, in the order read_entry_pairs says it. */
typedef enum {
    ENTRY_OK,
    ENTRY_NO_ACTION,
    ENTRY_BAD_SIZE,
    ENTRY_BAD_STREAM,
    ENTRY_BAD_FREE,
    ENTRY_BAD_ADDR,
    ENTRY_WRAPS,
    ENTRY_HUGE,
} EntryFault;

/* An entry's fields taken: the action (A_OTHER: one this reader skips) and its numbers. */
typedef struct {
    Action act;
    const Str *action;
    uint64_t addr, size, stream;
} Entry;

static inline EntryFault entry_check(P *p, const EntryVals *fv, Entry *en)
{
    const Val *a = fv->f[EF_ACTION];
    en->addr = en->size = en->stream = 0;
    if (!a || a->t != V_STR)
        return ENTRY_NO_ACTION;
    en->action = a->u.s;
    en->act = parse_action(p, en->action);
    if (en->act == A_OTHER)
        return ENTRY_OK;
    const gboolean snap = en->act == A_SNAPSHOT, oom = en->act == A_OOM;
    if (!val_u64(fv->f[EF_SIZE], !snap, &en->size))
        return ENTRY_BAD_SIZE;
    if (!val_u64(fv->f[EF_STREAM], FALSE, &en->stream))
        return ENTRY_BAD_STREAM;
    if (oom && !val_u64(fv->f[EF_DEVICE_FREE], FALSE, &en->addr))
        return ENTRY_BAD_FREE;
    if (!oom && !snap && !val_u64(fv->f[EF_ADDR], TRUE, &en->addr))
        return ENTRY_BAD_ADDR;
    if (!oom && !snap && en->addr + en->size < en->addr)
        return ENTRY_WRAPS;
    if (!snap && en->size >= ((uint64_t)1 << 60))
        return ENTRY_HUGE;
    return ENTRY_OK;
}

/* the entry's name, made only for a message (`where`, `v` and `k` in scope) */
#define WHERE (g_snprintf(where, sizeof where, "device_traces[%u][%" G_GUINT64_FORMAT "]", \
                          v->dev, k), where)

static gboolean entry_queue(P *p, Dev *v, guint64 k, const Entry *en, const Val *f_frames);

/* An entry's key, value pairs (items[0..2 n_pairs)). */
static gboolean read_entry_pairs(P *p, Dev *v, Val *items, gsize n_pairs)
{
    char where[80];
    guint64 k = v->n++;
    /* the fields, in one pass (a repeated key: its last value, as dict_get) */
    EntryVals fv = {{NULL}};
    for (gsize i = 0; i < n_pairs; i++)
        if (items[2 * i].t == V_STR)
            fv.f[items[2 * i].u.s->field] = &items[2 * i + 1];
    /* the dict, for get_u64's messages */
    Cont e_[1];
    const Cont *e = e_;
    e_->items = items;
    e_->n = n_pairs;
    Entry en;
    switch (entry_check(p, &fv, &en)) {
    case ENTRY_OK:
        break;
    case ENTRY_NO_ACTION:
        return fail_at(p, WHERE, "missing or non-string 'action'");
    case ENTRY_BAD_SIZE:
        return get_u64(p, e, p->k_size, WHERE, en.act != A_SNAPSHOT, &en.size);
    case ENTRY_BAD_STREAM:
        return get_u64(p, e, p->k_stream, WHERE, FALSE, &en.stream);
    case ENTRY_BAD_FREE:
        return get_u64(p, e, p->k_device_free, WHERE, FALSE, &en.addr);
    case ENTRY_BAD_ADDR:
        return get_u64(p, e, p->k_addr, WHERE, TRUE, &en.addr);
    case ENTRY_WRAPS:
        return fail_at(p, WHERE, "range at 0x%" G_GINT64_MODIFIER "x of %" G_GUINT64_FORMAT
                       " bytes wraps around", en.addr, en.size);
    case ENTRY_HUGE:
        return fail_at(p, WHERE, "size %" G_GUINT64_FORMAT " is beyond any device (≥ 2^60)",
                       en.size);
    }
    return entry_queue(p, v, k, &en, fv.f[EF_FRAMES]);
}

/* ---- applying entries ------------------------------------------------------------------------
 * An entry read becomes a job: what only the reading thread may touch (the stacks and their
 * sites, the trace's strings, the odd facts) is taken from it at once, the rest — the device's
 * live blocks and segments, its events — is applied in order by entry_apply: on a thread of
 * its own once the snapshot has more than a batch of entries, so that it runs beside the
 * reading of the next ones. A failure there is the earliest one (the entries before it were
 * read without one): apply_drain puts it in place of any the reader met later. */

typedef struct {
    Dev *v;
    guint64 k;        /* the entry's index in its device's list (messages) */
    Action act;
    uint64_t addr, size, stream;
    guint32 site;     /* ALLOC: its site (the stack's text + 1, 0 none) and category */
    guint8 cat;
    gboolean segs_read; /* p->segs_read when it was read */
} ApplyJob;

#define APPLY_BATCH 2048
#define APPLY_SLOTS 4

typedef struct {
    ApplyJob job[APPLY_BATCH];
    guint n;
    gboolean full; /* given to the thread, not yet applied (under the lock) */
} ApplyBatch;

/* (the reader's fields, the applying thread's and the shared ones on cache lines apart: the
 * reader reads `failed` at every entry) */
typedef struct Applier {
    ApplyBatch slot[APPLY_SLOTS];
    _Alignas(64) guint fill; /* the reader's slot */
    gboolean threaded, no_thread;
    int failed;       /* (atomic) err is set: the reader stops */
    _Alignas(64) guint take; /* the thread's next slot */
    GError *err;      /* the first failure, made by entry_apply */
    guint64 held;     /* hold_apply's bytes of the batch being applied */
    _Alignas(64) gboolean stop;
    pthread_t thread;
    Hand hand;
} Applier;

static gboolean G_GNUC_PRINTF(3, 4) apply_fail(P *p, const char *where, const char *fmt, ...)
{
    Applier *a = p->apply;
    if (a->err)
        return FALSE;
    va_list ap;
    va_start(ap, fmt);
    a->err = where_error(p, where, fmt, ap);
    va_end(ap);
    __atomic_store_n(&a->failed, 1, __ATOMIC_RELEASE);
    return FALSE;
}

/* One entry of device_traces, its k-th, its fields taken (entry_check: ENTRY_OK, not
 * A_OTHER). */
static gboolean entry_apply(P *p, const ApplyJob *j)
{
    char where[80];
    Dev *v = j->v;
    const guint64 k = j->k;
    const Action act = j->act;
    const uint64_t addr = j->addr, size = j->size, stream = j->stream;
    v->n_parsed++;
    MemsimEvent ev = {.stream = dev_stream(v, stream)};
    /* A run of releases ends: the empty_cache (or OOM-path release) that made it. */
    if (v->release_run && act != A_SEGMENT_FREE && act != A_SEGMENT_UNMAP) {
        MemsimEvent ec = {.kind = MEMSIM_EV_EMPTY_CACHE, .flags = MEMSIM_EVF_INFERRED,
                          .stream = v->release_stream};
        emit(p, v, &ec);
        v->release_run = FALSE;
    }
    gboolean fresh;
    Slot *sl;
    switch (act) {
    case A_ALLOC: {
        /* its slot in the blocks the trace allocated (still there: refused) */
        sl = map_put(&v->live, addr, &fresh);
        if (!fresh)
            return apply_fail(p, WHERE, "alloc at 0x%" G_GINT64_MODIFIER "x, which is still "
                              "allocated", addr);
        if (size == 0)
            return apply_fail(p, WHERE,
                              "alloc of 0 bytes (such requests never reach the allocator)");
        ev.kind = MEMSIM_EV_ALLOC;
        ev.id = v->next_id;
        ev.size = size;
        ev.addr = addr;
        ev.flags = MEMSIM_EVF_ADDR;
        ev.aux = j->site;
        ev.category = j->cat;
        sl->a = v->next_id++;
        sl->b = k;
        break;
    }
    case A_FREE_REQUESTED:
        /* (a final block freed and not allocated again cannot be live at the end) */
        if (!j->segs_read)
            map_put(&v->freed, addr, NULL)->b = k + 1;
        else if ((sl = map_find(&p->pending, addr)) && sl->a == v->dev)
            sl->b = k + 1;
        if ((sl = map_find(&v->live, addr))) {
            ev.id = sl->a;
            map_del(&v->live, sl);
        } else {
            /* live before the trace began */
            sl = map_put(&v->start, addr, &fresh);
            if (!fresh)
                return apply_fail(p, WHERE, "free of 0x%" G_GINT64_MODIFIER "x, which is live "
                                  "again before any alloc", addr);
            StartBlock b = {addr, size, 0, k, 0};
            sl->a = v->startb->len;
            g_array_append_val(v->startb, b);
            hold_apply(p, sizeof b + 32);
            ev.id = START_ID | sl->a;
        }
        ev.kind = MEMSIM_EV_FREE;
        break;
    case A_FREE_COMPLETED:
        return TRUE;
    case A_SEGMENT_ALLOC:
        sl = map_put(&v->segs, addr, &fresh);
        if (!fresh)
            return apply_fail(p, WHERE, "segment_alloc at 0x%" G_GINT64_MODIFIER "x of a "
                              "segment that is allocated already", addr);
        sl->a = k;
        ev.kind = MEMSIM_EV_SEG_ALLOC;
        break;
    case A_SEGMENT_FREE:
        if ((sl = map_find(&v->segs, addr))) {
            map_del(&v->segs, sl);
        } else {
            sl = map_put(&v->seg_start, addr, &fresh);
            if (fresh) {
                StartSeg ss = {addr, size, stream, size == SMALL_SEGMENT, FALSE};
                sl->a = v->startseg->len;
                g_array_append_val(v->startseg, ss);
            }
        }
        ev.kind = MEMSIM_EV_SEG_FREE;
        break;
    case A_SEGMENT_MAP:
        v->any_map = TRUE;
        v->mapped += (int64_t)size;
        ev.kind = MEMSIM_EV_SEG_MAP;
        break;
    case A_SEGMENT_UNMAP:
        v->any_map = TRUE;
        v->mapped -= (int64_t)size;
        ev.kind = MEMSIM_EV_SEG_UNMAP;
        break;
    case A_OOM:
        ev.kind = MEMSIM_EV_OOM;
        break;
    case A_SNAPSHOT:
        ev.kind = MEMSIM_EV_MARK;
        ev.id = 0; /* the string "snapshot" (read_all) */
        break;
    default:
        return TRUE;
    }
    if (ev.kind >= MEMSIM_EV_SEG_ALLOC && ev.kind <= MEMSIM_EV_OOM) {
        ev.addr = addr;
        ev.size = size;
    }
    emit(p, v, &ev);
    if (act == A_SEGMENT_FREE || act == A_SEGMENT_UNMAP) {
        v->release_run = TRUE;
        v->release_stream = ev.stream;
    }
    return TRUE;
}

static void hold_apply(P *p, gint64 bytes)
{
    p->apply->held += (guint64)bytes;
}

/* Applies a batch (after a failure: nothing). */
static void apply_batch(P *p, ApplyBatch *b)
{
    Applier *a = p->apply;
    for (guint i = 0; i < b->n && !a->err; i++)
        entry_apply(p, &b->job[i]);
    b->n = 0;
    __atomic_add_fetch(&p->held_apply, a->held, __ATOMIC_RELAXED);
    a->held = 0;
}

static void *apply_main(void *data)
{
    P *p = data;
    Applier *a = p->apply;
    for (;;) {
        ApplyBatch *b = &a->slot[a->take];
        if (!hand_wait(&a->hand, &b->full, TRUE, &a->stop))
            return NULL;
        apply_batch(p, b);
        hand_set(&a->hand, &b->full, FALSE);
        a->take = (a->take + 1) % APPLY_SLOTS;
    }
}

/* The reader's batch, full: to the thread (started now if it is not running; where it
 * cannot start, applied here). */
static void apply_give(P *p)
{
    Applier *a = p->apply;
    ApplyBatch *b = &a->slot[a->fill];
    if (!a->threaded && !a->no_thread) {
        hand_init(&a->hand);
        a->threaded = pthread_create(&a->thread, NULL, apply_main, p) == 0;
        if (!a->threaded) {
            hand_clear(&a->hand);
            a->no_thread = TRUE;
        }
    }
    if (!a->threaded) {
        apply_batch(p, b);
        return;
    }
    hand_set(&a->hand, &b->full, TRUE);
    a->fill = (a->fill + 1) % APPLY_SLOTS;
    hand_wait(&a->hand, &a->slot[a->fill].full, FALSE, NULL);
}

/* Every entry read so far applied; FALSE (the applying failure in p->error, in place of any
 * later one) when one failed. */
static gboolean apply_drain(P *p)
{
    Applier *a = p->apply;
    if (!a)
        return !p->failed;
    for (guint k = 0; a->threaded && k < APPLY_SLOTS; k++)
        hand_wait(&a->hand, &a->slot[k].full, FALSE, NULL);
    apply_batch(p, &a->slot[a->fill]);
    if (a->err) {
        if (p->error)
            g_clear_error(p->error);
        g_propagate_error(p->error, g_steal_pointer(&a->err));
        p->failed = TRUE;
    }
    return !p->failed;
}

/* The thread ends (after apply_drain, or on a failure: what it had not applied is dropped). */
static void apply_stop(P *p)
{
    Applier *a = p->apply;
    if (!a)
        return;
    if (a->threaded) {
        hand_set(&a->hand, &a->stop, TRUE);
        pthread_join(a->thread, NULL);
        hand_clear(&a->hand);
    }
    if (a->err)
        g_error_free(a->err);
    g_aligned_free(a);
    p->apply = NULL;
}

/* An entry read (entry_check: ENTRY_OK), to be applied in order; FALSE when the reading is to
 * stop (p->failed: an entry applied before it failed). */
static gboolean entry_queue(P *p, Dev *v, guint64 k, const Entry *en, const Val *f_frames)
{
    char where[80];
    if (en->act == A_OTHER) {
        /* torch/csrc/cuda/Module.cpp _cuda_memorySnapshot: "user_defined" entries
         * (annotations) carry no allocator action; anything else is unknown here */
        const Str *action = en->action;
        if (strcmp(action->data, "user_defined") != 0) {
            g_autofree char *kind =
                g_strdup_printf("trace entries of the unknown action '%.64s' skipped", action->data);
            odd(p, -1, kind, WHERE, "action '%.64s'", action->data);
        }
        return TRUE;
    }
    if (G_UNLIKELY(!p->apply))
        p->apply = g_aligned_alloc0(1, sizeof(Applier), 64); /* (its alignment) */
    Applier *a = p->apply;
    if (G_UNLIKELY(__atomic_load_n(&a->failed, __ATOMIC_ACQUIRE)))
        return apply_drain(p);
    ApplyBatch *b = &a->slot[a->fill];
    ApplyJob *j = &b->job[b->n++];
    j->v = v;
    j->k = k;
    j->act = en->act;
    j->addr = en->addr;
    j->size = en->size;
    j->stream = en->stream;
    j->segs_read = p->segs_read;
    j->site = 0;
    j->cat = MEMSIM_CAT_OTHER;
    if (en->act == A_ALLOC) {
        const Val *fr = f_frames;
        if (fr && fr->t == V_STACK)
            j->site = stack_site(p, fr->id, &j->cat);
        else if (fr && fr->t == V_CONT && fr->u.c->type == C_LIST)
            j->site = stack_site(p, stack_of_list(p, fr->u.c), &j->cat);
    }
    if (b->n == APPLY_BATCH)
        apply_give(p);
    return TRUE;
#undef WHERE
}

/* ---- the memo ------------------------------------------------------------------------------ */

static void rec_mark(P *p, guint64 idx)
{
    gsize byte = (gsize)(idx >> 3);
    if (byte >= p->cap_recs) {
        gsize cap = MAX(MAX(2 * p->cap_recs, byte + 1), (gsize)4096);
        p->recs = g_realloc(p->recs, cap);
        memset(p->recs + p->cap_recs, 0, cap - p->cap_recs);
        hold(p, (gint64)(cap - p->cap_recs));
        p->cap_recs = cap;
    }
    p->recs[byte] |= (guint8)(1u << (idx & 7));
    p->memo_top = MAX(p->memo_top, idx + 1);
}

static inline gboolean rec_has(const P *p, guint64 idx)
{
    gsize byte = (gsize)(idx >> 3);
    return byte < p->cap_recs && (p->recs[byte] >> (idx & 7) & 1);
}

/* Whether idx held a record (and no longer does). */
static inline gboolean rec_take(P *p, guint64 idx)
{
    if (!rec_has(p, idx))
        return FALSE;
    p->recs[idx >> 3] &= (guint8)~(1u << (idx & 7));
    return TRUE;
}

/* The memo is anonymous memory, zero until written: an index reads as 0 (never stored) at no
 * cost, and only the pages of the indices stored are ever touched (a million trace entries
 * take an index each; their records are bits in recs, the few strings among them a page
 * each). */
static guint32 *memo_map(gsize n)
{
    const gsize page = (gsize)sysconf(_SC_PAGESIZE),
                bytes = (n * sizeof(guint32) + page - 1) / page * page;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED)
        g_error("snapshot reader: cannot map %" G_GSIZE_FORMAT " bytes for the pickle memo",
                bytes);
    advise_small(m, bytes);
    return m;
}

/* Makes memo[idx] addressable. */
static void memo_reserve(P *p, guint64 idx)
{
    if (idx < p->cap_memo)
        return;
    gsize cap = MAX(MAX(2 * p->cap_memo, (gsize)idx + 1), 1024);
    hold(p, (gint64)((cap - p->cap_memo) * sizeof(guint32)));
    void *m = mremap(p->memo, p->cap_memo * sizeof(guint32), cap * sizeof(guint32),
                     MREMAP_MAYMOVE);
    if (m == MAP_FAILED)
        g_error("snapshot reader: cannot map %" G_GSIZE_FORMAT " bytes for the pickle memo",
                cap * sizeof(guint32));
    advise_small(m, cap * sizeof(guint32));
    p->memo = m;
    p->cap_memo = cap;
}

static void memo_release(P *p, guint32 h)
{
    if (H_KIND(h) == H_CONT) {
        guint32 i = H_INDEX(h);
        Cont *c = g_ptr_array_index(p->conts, i);
        g_ptr_array_index(p->conts, i) = NULL;
        g_array_append_val(p->free_conts, i);
        cont_unref(p, c);
    }
}

/* A container read into a frame, a stack or a record: its memo index now holds `h`. */
static void memo_convert(P *p, Cont *c, guint32 h)
{
    if (c->memo == 0 || c->memo == G_MAXUINT32)
        return;
    guint32 idx = c->memo - 1, old = p->memo[idx];
    if (H_KIND(old) != H_CONT || g_ptr_array_index(p->conts, H_INDEX(old)) != c)
        return;
    c->memo = 0;
    p->memo[idx] = h;
    if (!h)
        rec_mark(p, idx); /* a record read: the index stays set */
    memo_release(p, old);
}

/* A store at an index that holds nothing (fast_entry's at a fresh index, fast_memo). */
static void memo_set(P *p, guint64 idx, guint32 h)
{
    p->n_memo++;
    if (H_KIND(h) == H_RECORD) {
        rec_mark(p, idx);
        return;
    }
    if (G_UNLIKELY(idx >= p->cap_memo))
        memo_reserve(p, idx);
    p->memo[idx] = h;
    p->memo_top = MAX(p->memo_top, idx + 1);
}

static gboolean memo_put(P *p, guint64 off, guint8 op, guint64 idx)
{
    if (!need_stack(p, off, op, 1))
        return FALSE;
    /* A pickler numbers its memo densely (pickle.c allows indices up to the file's length;
     * memsim's own snapshot writer, sim/export/snapshot.c, numbers ahead). Of a compressed
     * file the length is not known: twice what was read, plus 64 Ki. */
    guint64 bound = p->in.total ? MAX(p->in.total, here(p)) : 2 * here(p) + 65536;
    if (idx > bound)
        return fail(p, off, "opcode 0x%02x (%s): memo index %" G_GUINT64_FORMAT
                    " is larger than a file of %" G_GUINT64_FORMAT " bytes can use",
                    op, op_name(op), idx, bound);
    if (idx >= p->cap_memo)
        memo_reserve(p, idx);
    const Val *v = &p->stack[p->n_stack - 1];
    guint32 h, i;
    switch (v->t) {
    case V_STR:
    case V_BYTES:
        h = (guint32)H_STR << 29 | v->u.s->id;
        break;
    case V_FRAME:
        h = (guint32)H_FRAME << 29 | v->id;
        break;
    case V_STACK:
        h = (guint32)H_STACK << 29 | v->id;
        break;
    case V_CONT:
        if (v->u.c->role == R_ENTRY || v->u.c->role == R_SEG) {
            /* a record: read once, never referred to again (a GET of it is refused) */
            h = (guint32)H_RECORD << 29;
            break;
        }
        if (p->free_conts->len) {
            i = g_array_index(p->free_conts, guint32, p->free_conts->len - 1);
            g_array_set_size(p->free_conts, p->free_conts->len - 1);
            g_ptr_array_index(p->conts, i) = v->u.c;
        } else {
            i = p->conts->len;
            g_ptr_array_add(p->conts, v->u.c);
            hold(p, sizeof(gpointer));
        }
        v->u.c->refs++;
        v->u.c->memo = v->u.c->memo ? G_MAXUINT32 : (guint32)idx + 1;
        h = (guint32)H_CONT << 29 | i;
        break;
    default:
        i = p->scalars->len;
        g_array_append_val(p->scalars, *v);
        hold(p, sizeof *v);
        h = (guint32)H_SCALAR << 29 | i;
        break;
    }
    if (H_INDEX(h) != (h & ((1u << 29) - 1)) || p->conts->len >= (1u << 29) ||
        p->scalars->len >= (1u << 29) || p->str_by_id->len >= (1u << 29))
        return fail(p, off, "more than 2^29 values in the memo");
    /* (an index above every one stored is known empty: its page is not touched) */
    const guint32 old = idx < p->memo_top ? p->memo[idx] : 0;
    if (!old && !(idx < p->memo_top && rec_take(p, idx))) {
        memo_set(p, idx, h);
        return TRUE;
    }
    /* a value stored over another: the index counted once */
    memo_release(p, old);
    if (H_KIND(h) == H_RECORD)
        rec_mark(p, idx);
    p->memo[idx] = H_KIND(h) == H_RECORD ? 0 : h;
    return TRUE;
}

static inline gboolean memo_get(P *p, guint64 off, guint8 op, guint64 idx)
{
    guint32 h = idx < p->cap_memo ? p->memo[idx] : 0;
    Val v = {.off = NO_OFF};
    switch (H_KIND(h)) {
    case H_STR:
        v.u.s = g_ptr_array_index(p->str_by_id, H_INDEX(h));
        v.t = v.u.s->bytes ? V_BYTES : V_STR;
        break;
    case H_CONT:
        v.t = V_CONT;
        v.u.c = g_ptr_array_index(p->conts, H_INDEX(h));
        v.u.c->refs++;
        v.off = v.u.c->off;
        break;
    case H_FRAME:
        v.t = V_FRAME;
        v.id = H_INDEX(h);
        break;
    case H_STACK:
        v.t = V_STACK;
        v.id = H_INDEX(h);
        break;
    case H_SCALAR:
        v = g_array_index(p->scalars, Val, H_INDEX(h));
        break;
    default:
        return fail(p, off, "opcode 0x%02x (%s): memo index %" G_GUINT64_FORMAT " was never "
                    "stored, or holds a record read already (a snapshot writes each record once)",
                    op, op_name(op), idx);
    }
    push(p, v);
    return TRUE;
}

/* ---- placing values into containers ------------------------------------------------------------ */

static gboolean check_key(P *p, guint64 off, guint8 op, const Val *k)
{
    if (k->t == V_CONT && k->u.c->type != C_TUPLE)
        return fail(p, off, "opcode 0x%02x (%s): a %s (made at byte %" G_GUINT64_FORMAT
                    ") cannot be a dict key (not hashable)", op, op_name(op), type_name(k), k->off);
    if (k->t == V_FRAME || k->t == V_STACK)
        return fail(p, off, "opcode 0x%02x (%s): a %s cannot be a dict key (not hashable)", op,
                    op_name(op), type_name(k));
    if (k->t == V_CONT) {
        const Cont *c = k->u.c;
        if (!c->hashable)
            return fail(p, off, "opcode 0x%02x (%s): a tuple holding a list or dict (made at "
                        "byte %" G_GUINT64_FORMAT ") cannot be a dict key (not hashable)",
                        op, op_name(op), k->off);
        if (c->weight > PICKLE_MAX_KEY_WEIGHT)
            return fail(p, off, "opcode 0x%02x (%s): a tuple of more than %d values (made at "
                        "byte %" G_GUINT64_FORMAT ") as a dict key",
                        op, op_name(op), PICKLE_MAX_KEY_WEIGHT, k->off);
    }
    return TRUE;
}

/* A record read: dropped from the memo, marked. */
static void consume(P *p, Val *v)
{
    if (v->t == V_CONT) {
        v->u.c->consumed = 1;
        memo_convert(p, v->u.c, 0);
    }
}

static gboolean read_dev_list(P *p, Cont *c, const Val *v, guint64 index);

/* Puts v (the caller's reference, taken over) into c: at its end, or under `key` (also
 * taken over) for a dict. The parent's role decides what v becomes (file header). */
static gboolean place(P *p, Cont *c, Val *key, Val *v, guint64 off, guint8 op)
{
    gboolean ok = TRUE;
    if (v->t == V_CONT) {
        Cont *x = v->u.c;
        if (x == c) {
            ok = fail(p, off, "opcode 0x%02x (%s): the %s made at byte %" G_GUINT64_FORMAT
                      " would contain itself", op, op_name(op), type_name(v), x->off);
            goto drop;
        }
        if (x->depth + 1 > c->depth)
            c->depth = x->depth + 1;
        if (c->depth > PICKLE_MAX_DEPTH) {
            ok = fail(p, off, "values nested deeper than %d levels", PICKLE_MAX_DEPTH);
            goto drop;
        }
        x->placed = 1;
        if (c->type == C_TUPLE && (x->type != C_TUPLE || !x->hashable))
            c->hashable = FALSE;
        if (c->type == C_TUPLE)
            c->weight = MIN(c->weight + x->weight, (guint64)1 << 40);
    } else if (c->type == C_TUPLE) {
        c->weight++;
    }
    Role role = c->role;
    if (role == R_FRAMES && v->t == V_CONT && v->u.c->type == C_DICT) {
        guint32 id = frame_of_dict(p, v->u.c);
        memo_convert(p, v->u.c, (guint32)H_FRAME << 29 | id);
        val_unref(p, v);
        *v = (Val){.t = V_FRAME, .id = id, .off = NO_OFF};
    } else if (key && (role == R_ENTRY || role == R_BLOCK) && field_role(p, role, key) == R_FRAMES &&
               v->t == V_CONT && v->u.c->type == C_LIST) {
        guint32 id = stack_of_list(p, v->u.c);
        memo_convert(p, v->u.c, (guint32)H_STACK << 29 | id);
        val_unref(p, v);
        *v = (Val){.t = V_STACK, .id = id, .off = NO_OFF};
    } else if (role == R_DEV) {
        if (c->index >= MAX_DEVICES) {
            ok = fail_at(p, "device_traces", "more devices than %u", MAX_DEVICES);
            goto drop;
        }
        Dev *d = dev_get(p, (guint32)c->index);
        if (d->owner && d->owner != c->serial) {
            ok = fail(p, off, "a second list of trace entries for device %u", d->dev);
            goto drop;
        }
        d->owner = c->serial;
        ok = read_entry(p, d, v);
        consume(p, v);
        c->n_read++;
        goto drop;
    } else if (role == R_SEGS) {
        if (p->segs_owner && p->segs_owner != c->serial) {
            ok = fail(p, off, "a second list of segments");
            goto drop;
        }
        p->segs_owner = c->serial;
        ok = read_segment(p, v, c->n_read);
        consume(p, v);
        c->n_read++;
        goto drop;
    } else if (role == R_DTRACES) {
        ok = read_dev_list(p, c, v, c->n_read);
        c->n_read++;
        goto drop;
    } else if (role == R_ROOT && key) {
        Role r = field_role(p, role, key);
        if (r == R_SEGS) {
            if (p->root_has_segments) {
                ok = fail(p, off, "'segments' given twice");
                goto drop;
            }
            p->root_has_segments = TRUE;
            char buf[40];
            if (v->t != V_CONT || v->u.c->type == C_DICT) {
                ok = fail_at(p, "segments", "is a %s, expected a list%s", type_name(v),
                             at_byte(v, buf));
                goto drop;
            }
            if (v->u.c->role != R_SEGS || v->u.c->parent != c->serial) {
                /* not made in place (a LIST or TUPLE opcode): read it now */
                Cont *l = v->u.c;
                if (l->role == R_SEGS || (p->segs_owner && l->serial != p->segs_owner)) {
                    ok = fail(p, off, "the list of segments made at byte %" G_GUINT64_FORMAT
                              " is not the root's", l->off);
                    goto drop;
                }
                for (gsize i = 0; ok && i < l->n; i++) {
                    ok = read_segment(p, &l->items[i], i);
                    consume(p, &l->items[i]);
                }
            }
            p->segs_read = TRUE;
        } else if (r == R_DTRACES) {
            if (p->root_has_traces) {
                ok = fail(p, off, "'device_traces' given twice");
                goto drop;
            }
            p->root_has_traces = TRUE;
            char buf[40];
            if (v->t != V_CONT || v->u.c->type == C_DICT) {
                ok = fail_at(p, "device_traces", "is a %s, expected a list%s", type_name(v),
                             at_byte(v, buf));
                goto drop;
            }
            Cont *l = v->u.c;
            if (l->role != R_DTRACES || l->parent != c->serial) {
                if (l->role == R_DTRACES || p->dtraces_owner) {
                    ok = fail(p, off, "the list of device traces made at byte %" G_GUINT64_FORMAT
                              " is not the root's", l->off);
                    goto drop;
                }
                if (l->n > MAX_DEVICES) {
                    ok = fail_at(p, "device_traces", "%zu lists: more devices than %u",
                                 (size_t)l->n, MAX_DEVICES);
                    goto drop;
                }
                Cont tmp = {.type = C_LIST, .role = R_DTRACES};
                for (gsize i = 0; ok && i < l->n; i++)
                    ok = read_dev_list(p, &tmp, &l->items[i], i);
                p->dtraces_owner = l->serial;
            }
        } else if (r == R_SETTINGS) {
            val_unref(p, &p->settings);
            p->settings = *v;
            p->settings_none = v->t == V_NONE;
            v->t = V_NONE;
        }
        goto drop;
    } else if (role == R_DTRACES || role == R_SEGS) {
        goto drop;
    }
    /* kept */
    cont_reserve(p, c, 1);
    if (c->type == C_DICT) {
        c->items[2 * c->n] = *key;
        c->items[2 * c->n + 1] = *v;
    } else {
        c->items[c->n] = *v;
    }
    c->n++;
    return TRUE;
drop:
    if (key)
        val_unref(p, key);
    val_unref(p, v);
    return ok;
}

/* One device's list placed into device_traces at `index`: made in place, its entries read
 * already; otherwise (a tuple, a LIST opcode) read now. */
static gboolean read_dev_list(P *p, Cont *c, const Val *v, guint64 index)
{
    char where[64];
    g_snprintf(where, sizeof where, "device_traces[%" G_GUINT64_FORMAT "]", index);
    char buf[40];
    if (index >= MAX_DEVICES)
        return fail_at(p, "device_traces", "more than %u lists: more devices than %u", MAX_DEVICES,
                       MAX_DEVICES);
    if (v->t != V_CONT || v->u.c->type == C_DICT)
        return fail_at(p, where, "is a %s, expected a list%s", type_name(v), at_byte(v, buf));
    Cont *l = v->u.c;
    if (!once(p, v, where))
        return FALSE;
    /* (a device's state is made by its first entry) */
    Dev *d = index < p->devs->len ? g_ptr_array_index(p->devs, index) : NULL;
    Dev none = {0};
    if (!d && (l->role == R_DEV || l->n == 0))
        d = &none;
    else if (!d)
        d = dev_get(p, (guint32)index);
    if (l->role == R_DEV) {
        if ((c->serial && l->parent != c->serial) || l->index != index ||
            (d->owner != 0 && d->owner != l->serial))
            return fail(p, l->off, "the list of trace entries made here is not device_traces[%"
                        G_GUINT64_FORMAT "]", index);
    } else {
        if (d->owner)
            return fail(p, l->off, "a second list of trace entries for device %" G_GUINT64_FORMAT,
                        index);
        d->owner = l->serial;
        for (gsize i = 0; i < l->n; i++) {
            if (!read_entry(p, d, &l->items[i]))
                return FALSE;
            consume(p, &l->items[i]);
        }
    }
    l->consumed = 1;
    p->n_dev_lists = MAX(p->n_dev_lists, index + 1);
    return TRUE;
}

#define read_le memsim_pickle_read_le

static gboolean arg_slow(P *p, guint64 off, guint8 op, guint64 n, const guint8 **s);

/* n argument bytes after the opcode at off, at *s (valid until the next read). */
static inline gboolean arg(P *p, guint64 off, guint8 op, guint64 n, const guint8 **s)
{
    if (G_LIKELY(p->in.end - p->in.pos >= n)) {
        *s = p->in.buf + p->in.pos;
        p->in.pos += (gsize)n;
        return TRUE;
    }
    return arg_slow(p, off, op, n, s);
}

static gboolean arg_slow(P *p, guint64 off, guint8 op, guint64 n, const guint8 **s)
{
    if (n > STREAM_MAX_STRING)
        return fail(p, off, "opcode 0x%02x (%s) with an argument of %" G_GUINT64_FORMAT
                    " bytes (at most %" G_GSIZE_FORMAT " are read)", op, op_name(op), n,
                    STREAM_MAX_STRING);
    if (!input_need(&p->in, (gsize)n)) {
        if (p->in.err)
            return fail(p, off, "%s", p->in.err);
        return fail(p, off, "truncated: opcode 0x%02x (%s) needs %" G_GUINT64_FORMAT
                    " bytes of argument, %" G_GSIZE_FORMAT " left", op, op_name(op), n,
                    p->in.end - p->in.pos);
    }
    *s = p->in.buf + p->in.pos;
    p->in.pos += (gsize)n;
    return TRUE;
}

/* The text argument of a protocol 0 opcode, up to the newline (consumed). */
static gboolean read_line(P *p, guint64 off, guint8 op, const guint8 **line, gsize *n)
{
    gsize scanned = 0;
    for (;;) {
        const guint8 *start = p->in.buf + p->in.pos;
        gsize avail = p->in.end - p->in.pos;
        const guint8 *nl = avail > scanned ? memchr(start + scanned, '\n', avail - scanned) : NULL;
        if (nl) {
            *line = start;
            *n = (gsize)(nl - start);
            p->in.pos += *n + 1;
            return TRUE;
        }
        scanned = avail;
        if (avail >= 1 << 20 || !input_need(&p->in, avail + 1)) {
            if (p->in.err)
                return fail(p, off, "%s", p->in.err);
            return fail(p, off, "truncated: opcode 0x%02x (%s) has no end of line", op,
                        op_name(op));
        }
    }
}

static Val int_val(guint64 off, gint64 i, gboolean big)
{
    Val v = {.t = big ? V_BIGINT : V_INT, .off = off};
    if (!big)
        v.u.i = i;
    return v;
}

static Val long_bytes(guint64 off, const guint8 *s, gsize n)
{
    gint64 i;
    gboolean fits = memsim_pickle_long(s, n, &i);
    return int_val(off, i, !fits);
}

/* UNICODE's raw-unicode-escape argument as UTF-8 (memsim_pickle_raw_unicode). */
static gboolean raw_unicode(P *p, guint64 off, const guint8 *s, gsize n, Val *out)
{
    g_autofree char *buf = g_malloc(2 * n + 1);
    gsize o;
    char why[64];
    if (!memsim_pickle_raw_unicode(s, n, buf, &o, why, sizeof why))
        return fail(p, off, "opcode 0x56 (UNICODE): %s", why);
    *out = (Val){.t = V_STR, .off = off, .u.s = intern(p, buf, o, FALSE)};
    return TRUE;
}

/* A new container on the stack; `role` told from the stack below it. */
static void push_cont(P *p, guint8 type, guint64 off)
{
    Cont *c = cont_new(p, type, off);
    if (type != C_TUPLE)
        infer_role(p, c);
    push(p, (Val){.t = V_CONT, .off = off, .u.c = c});
}

static gboolean writable(P *p, guint64 off, guint8 op, const Val *t, guint8 type)
{
    char buf[40];
    if (t->t != V_CONT || t->u.c->type != type)
        return fail(p, off, "opcode 0x%02x (%s) on a %s%s, not a %s", op, op_name(op),
                    type_name(t), at_byte(t, buf), type == C_LIST ? "list" : "dict");
    if (t->u.c->placed || t->u.c->consumed)
        return fail(p, off, "opcode 0x%02x (%s) changes the %s made at byte %" G_GUINT64_FORMAT
                    " after it was placed in another value (a snapshot writes each value "
                    "whole)", op, op_name(op), type_name(t), t->u.c->off);
    return TRUE;
}

/* stack[from..) into the list at stack[from - 1]. */
static gboolean list_append_from(P *p, guint64 off, guint8 op, gsize from)
{
    Val *t = &p->stack[from - 1];
    if (!writable(p, off, op, t, C_LIST))
        return FALSE;
    Cont *l = t->u.c;
    gsize n = p->n_stack - from;
    gboolean ok = TRUE;
    if (role_is_list(l->role) && l->role != R_FRAMES && l->role != R_BLOCKS) {
        /* records: read one by one */
        for (gsize i = from; i < p->n_stack; i++)
            if (ok)
                ok = place(p, l, NULL, &p->stack[i], off, op);
            else
                val_unref(p, &p->stack[i]);
    } else {
        cont_reserve(p, l, n);
        for (gsize i = from; i < p->n_stack; i++)
            if (ok && p->stack[i].t != V_CONT)
                l->items[l->n++] = p->stack[i]; /* as place() does with plain values */
            else if (ok)
                ok = place(p, l, NULL, &p->stack[i], off, op);
            else
                val_unref(p, &p->stack[i]);
    }
    p->n_stack = from;
    return ok;
}

static gboolean dict_set_from(P *p, guint64 off, guint8 op, gsize at, gsize from)
{
    Val *t = &p->stack[at];
    gsize n = p->n_stack - from;
    gboolean ok = TRUE;
    if (n % 2)
        ok = fail(p, off, "opcode 0x%02x (%s) with an odd number of items (%" G_GSIZE_FORMAT
                  "): keys and values must pair up", op, op_name(op), n);
    if (ok)
        ok = writable(p, off, op, t, C_DICT);
    for (gsize i = from; ok && i < p->n_stack; i += 2)
        ok = check_key(p, off, op, &p->stack[i]);
    if (ok && t->u.c->role != R_ROOT)
        cont_reserve(p, t->u.c, n / 2);
    Cont *d = ok ? t->u.c : NULL;
    for (gsize i = from; i + 1 < p->n_stack || i < p->n_stack; i += 2) {
        if (ok && i + 1 < p->n_stack && d->role != R_ROOT && p->stack[i].t != V_CONT &&
            p->stack[i + 1].t != V_CONT) {
            /* plain values go in as they are (what place() does with them) */
            d->items[2 * d->n] = p->stack[i];
            d->items[2 * d->n + 1] = p->stack[i + 1];
            d->n++;
        } else if (ok && i + 1 < p->n_stack) {
            ok = place(p, t->u.c, &p->stack[i], &p->stack[i + 1], off, op);
        } else {
            val_unref(p, &p->stack[i]);
            if (i + 1 < p->n_stack)
                val_unref(p, &p->stack[i + 1]);
        }
    }
    p->n_stack = from;
    return ok;
}

/* stack[from..) → a tuple, or a list (LIST opcode). */
static gboolean make_seq(P *p, guint64 off, guint8 op, gsize from, guint8 type)
{
    Cont *c = cont_new(p, type, off);
    gsize n = p->n_stack - from;
    gboolean ok = TRUE;
    cont_reserve(p, c, n);
    for (gsize i = from; i < p->n_stack; i++)
        if (ok)
            ok = place(p, c, NULL, &p->stack[i], off, op);
        else
            val_unref(p, &p->stack[i]);
    p->n_stack = from;
    push(p, (Val){.t = V_CONT, .off = off, .u.c = c});
    return ok;
}


/* ---- the common case of a trace entry, decoded in one go ---------------------------------- */

/* A trace entry as Python's pickler writes one inside a device list's MARK run:
 *
 *   EMPTY_DICT memo MARK (key value)* SETITEMS
 *
 * keys: a GET of a str or a new SHORT_BINUNICODE (+ memo); values: BININT1, BININT2,
 * BININT, LONG1 of at most 8 bytes, None, a bool, BINFLOAT, a GET of a str or of a frames
 * list read already, a new SHORT_BINUNICODE (+ memo), or the frames list: EMPTY_LIST memo
 * and GETs of frames read already, in one APPEND or a MARK ... APPENDS run. That is every
 * entry of a real snapshot but the first of each stack's frames. Such an entry is read
 * straight from the bytes into read_entry(), with the memo stores the opcodes make, and
 * nothing is pushed; anything else (or any doubt) leaves the position as it was and the
 * opcodes run one by one. The result is the same either way; this is 3 times faster. */

#if defined(__GNUC__) || defined(__clang__)
#define FAST_INLINE static inline __attribute__((always_inline))
#else
#define FAST_INLINE static inline
#endif

#define FAST_MAX_PAIRS 16
#define FAST_MAX_MEMO 24
#define FAST_MAX_FRAMES 1024

typedef struct {
    guint64 idx;
    guint32 h;
} MemoSet;

static inline guint32 le32(const guint8 *s)
{
    guint32 v;
    memcpy(&v, s, 4);
    return GUINT32_FROM_LE(v);
}

/* The handle at memo index i, or 0. */
static inline guint32 memo_at(const P *p, guint64 i)
{
    return i < p->cap_memo ? p->memo[i] : 0;
}

typedef struct {
    const guint8 *c, *e;
    guint64 base; /* stream offset of buf[0] */
    const guint8 *buf;
    MemoSet memo[FAST_MAX_MEMO];
    guint n_memo;
    guint64 next; /* MEMOIZE's next index */
} Fast;

/* A FRAME opcode (protocol 4's framing, every 64 KiB) may come between any two opcodes;
 * the one entry it falls into is read opcode by opcode. */
FAST_INLINE void fast_skip_frames(Fast *f)
{
    (void)f;
}

/* An optional memo store of the value just read: the pickler's MEMOIZE (protocol 4+) or
 * BINPUT / LONG_BINPUT with the next index (protocols 2, 3). */
FAST_INLINE gboolean fast_memo(P *p, Fast *f, guint32 h)
{
    guint64 idx;
    fast_skip_frames(f);
    if (f->c < f->e && *f->c == 0x94) {
        idx = f->next;
        f->c++;
    } else if (f->e - f->c >= 2 && *f->c == 'q') {
        idx = f->c[1];
        f->c += 2;
    } else if (f->e - f->c >= 5 && *f->c == 'r') {
        idx = le32(f->c + 1);
        f->c += 5;
    } else {
        return TRUE; /* not memoized */
    }
    /* (a fresh index, above every one stored: its page of the memo is not read) */
    if (idx != f->next || f->n_memo == FAST_MAX_MEMO ||
        (idx < p->memo_top && (memo_at(p, idx) || rec_has(p, idx))))
        return FALSE;
    f->memo[f->n_memo++] = (MemoSet){idx, h};
    f->next++;
    return TRUE;
}

/* A GET of an index stored before this entry; 0 when it is anything else. */
FAST_INLINE guint32 fast_get(P *p, Fast *f)
{
    guint64 idx;
    fast_skip_frames(f);
    if (f->e - f->c >= 2 && *f->c == 'h') {
        idx = f->c[1];
        f->c += 2;
    } else if (f->e - f->c >= 5 && *f->c == 'j') {
        idx = le32(f->c + 1);
        f->c += 5;
    } else {
        return 0;
    }
    if (idx >= p->n_memo_first_free && idx >= f->next - f->n_memo)
        return 0; /* (possibly) one of this entry's own stores */
    return memo_at(p, idx);
}

/* A value written field by field: one built whole and then copied is read back (16 bytes at a
 * time) before its parts are stored, which stalls on each of a million entries. */
static inline void val_set(Val *v, guint8 t, guint64 off, gint64 i)
{
    v->t = t;
    v->id = 0;
    v->off = off;
    v->u.i = i;
}

static inline void val_set_s(Val *v, guint8 t, guint64 off, const Str *s)
{
    v->t = t;
    v->id = 0;
    v->off = off;
    v->u.s = s;
}

/* A str: a new SHORT_BINUNICODE (and its memo) or a GET of one read already; NULL when not. */
FAST_INLINE const Str *fast_str(P *p, Fast *f)
{
    fast_skip_frames(f);
    if (f->c >= f->e)
        return NULL;
    if (*f->c == 0x8c) {
        if (f->e - f->c < 2 || f->e - f->c - 2 < f->c[1] ||
            !memsim_pickle_utf8_ok(f->c + 2, f->c[1])) /* the slow path says why */
            return NULL;
        const Str *s = intern(p, (const char *)f->c + 2, f->c[1], FALSE);
        f->c += 2 + f->c[1];
        return fast_memo(p, f, (guint32)H_STR << 29 | s->id) ? s : NULL;
    }
    guint32 h = fast_get(p, f);
    if (H_KIND(h) != H_STR)
        return NULL;
    const Str *s = g_ptr_array_index(p->str_by_id, H_INDEX(h));
    return s->bytes ? NULL : s;
}

FAST_INLINE gboolean fast_value(P *p, Fast *f, Val *v)
{
    fast_skip_frames(f);
    if (f->c >= f->e)
        return FALSE;
    /* (no opcode offsets: the values read here are ones entry_check takes, and what is
     * wrong with others the opcodes' path says) */
    const guint64 off = NO_OFF;
    gsize left = (gsize)(f->e - f->c);
    guint8 op = *f->c;
    switch (op) {
    case 'K':
        if (left < 2)
            return FALSE;
        val_set(v, V_INT, off, f->c[1]);
        f->c += 2;
        return TRUE;
    case 'M':
        if (left < 3)
            return FALSE;
        val_set(v, V_INT, off, (gint64)read_le(f->c + 1, 2));
        f->c += 3;
        return TRUE;
    case 'J': {
        if (left < 5)
            return FALSE;
        guint64 u = le32(f->c + 1);
        val_set(v, V_INT, off, u >= 0x80000000u ? (gint64)u - 0x100000000 : (gint64)u);
        f->c += 5;
        return TRUE;
    }
    case 0x8a: {
        guint n = left >= 2 ? f->c[1] : 99;
        if (n == 0 || n > 8 || left - 2 < n)
            return FALSE;
        /* little-endian two's complement (addresses: 6 bytes, times: 7) */
        guint64 u = 0;
        if (left >= 10) { /* one load, the bytes past the number masked off */
            memcpy(&u, f->c + 2, 8);
            u = GUINT64_FROM_LE(u);
            if (n < 8)
                u &= ~(~(guint64)0 << (8 * n));
        } else {
            u = read_le(f->c + 2, (int)n);
        }
        if (n < 8 && (f->c[1 + n] & 0x80))
            u |= ~(guint64)0 << (8 * n);
        val_set(v, V_INT, off, u <= (guint64)G_MAXINT64 ? (gint64)u : -(gint64)(~u) - 1);
        f->c += 2 + n;
        return TRUE;
    }
    case 'N':
        *v = (Val){.t = V_NONE, .off = NO_OFF};
        f->c++;
        return TRUE;
    case 0x88:
    case 0x89:
        *v = (Val){.t = V_BOOL, .off = NO_OFF, .u.i = op == 0x88};
        f->c++;
        return TRUE;
    case 0x8c: {
        const Str *s = fast_str(p, f);
        if (!s)
            return FALSE;
        val_set_s(v, V_STR, NO_OFF, s);
        return TRUE;
    }
    case 'h':
    case 'j': {
        guint32 h = fast_get(p, f);
        if (H_KIND(h) == H_STACK) {
            *v = (Val){.t = V_STACK, .off = NO_OFF, .id = H_INDEX(h)};
            return TRUE;
        }
        if (H_KIND(h) != H_STR)
            return FALSE;
        const Str *s = g_ptr_array_index(p->str_by_id, H_INDEX(h));
        val_set_s(v, s->bytes ? V_BYTES : V_STR, NO_OFF, s);
        return TRUE;
    }
    case ']': {
        /* a frames list of frames read already */
        f->c++;
        guint mi = f->n_memo;
        if (!fast_memo(p, f, 0))
            return FALSE;
        guint32 ids[FAST_MAX_FRAMES];
        guint32 nf = 0;
        gboolean ok = TRUE;
        fast_skip_frames(f);
        if (f->c < f->e && *f->c == '(') {
            f->c++;
            while (ok && (fast_skip_frames(f), f->c < f->e) && *f->c != 'e') {
                guint32 h = fast_get(p, f);
                ok = H_KIND(h) == H_FRAME && nf < FAST_MAX_FRAMES;
                if (ok)
                    ids[nf++] = H_INDEX(h);
            }
            ok = ok && f->c < f->e;
            f->c++;
        } else if (f->c < f->e && (*f->c == 'h' || *f->c == 'j')) {
            guint32 h = fast_get(p, f);
            fast_skip_frames(f);
            ok = H_KIND(h) == H_FRAME && f->c < f->e && *f->c == 'a';
            if (ok)
                ids[nf++] = H_INDEX(h);
            f->c++;
        }
        if (!ok)
            return FALSE;
        guint32 sid = stack_intern_ids(p, ids, nf);
        if (mi < f->n_memo)
            f->memo[mi].h = (guint32)H_STACK << 29 | sid;
        *v = (Val){.t = V_STACK, .off = NO_OFF, .id = sid};
        return TRUE;
    }
    default:
        return FALSE;
    }
}

/* The check run() makes every 4096 opcodes (the fast path counts its opcodes by the bytes). */
static gboolean over_memory(P *p)
{
    return fail(p, here(p), "the values read so far need more than %" G_GUINT64_FORMAT
                " MiB of memory (%d bytes per byte of input, plus %" G_GUINT64_FORMAT
                " MiB): not the data of a snapshot",
                p->held >> 20, STREAM_MEM_PER_BYTE, STREAM_MEM_BASE >> 20);
}

/* 1: the entry was read (or refused: p->failed), and the entries right after it in the same
 * run of APPENDS; 0: not this case, nothing changed. The EMPTY_DICT at `off` is read. */
static int fast_entry(P *p, guint64 off)
{
    gsize f0 = fence(p);
    if (!p->n_marks || f0 == 0)
        return 0;
    const Val *lv = &p->stack[f0 - 1];
    if (lv->t != V_CONT || lv->u.c->type != C_LIST || lv->u.c->role != R_DEV ||
        lv->u.c->placed || lv->u.c->consumed)
        return 0;
    Cont *dl = lv->u.c;
    if (p->n_stack > f0) {
        /* entries of this run read one opcode at a time: placed now, as APPENDS would
         * place them, so that the entries stay in order */
        for (gsize i = f0; i < p->n_stack; i++)
            if (p->stack[i].t != V_CONT || p->stack[i].u.c->type != C_DICT)
                return 0;
        if (!list_append_from(p, off, 'e', f0))
            return 1;
    }
    Dev *d = NULL;
    gboolean first = TRUE;
    guint64 ops_block = p->ops >> 12;
    for (;;) {
        input_need(&p->in, 8192); /* as much as there is */
        Fast f; /* (its memo array is filled as it goes, not cleared) */
        f.c = p->in.buf + p->in.pos;
        f.e = p->in.buf + p->in.end;
        f.base = p->in.base;
        f.buf = p->in.buf;
        f.next = p->n_memo;
        f.n_memo = 0;
        p->n_memo_first_free = p->n_memo;
        if (!fast_memo(p, &f, (guint32)H_RECORD << 29) || (fast_skip_frames(&f), f.c >= f.e) ||
            *f.c != '(')
            goto no;
        f.c++;
        /* the fields read straight from the opcodes: a key's value goes to its field (the
         * last one wins, as dict_get), other keys' values are read and dropped */
        Val fields[EF_COUNT];
        EntryVals fv;
        for (int i = 0; i < EF_COUNT; i++)
            fv.f[i] = NULL;
        guint n = 0;
        for (;;) {
            fast_skip_frames(&f);
            if (f.c >= f.e)
                goto no;
            if (*f.c == 'u')
                break;
            const Str *key = n < FAST_MAX_PAIRS ? fast_str(p, &f) : NULL;
            if (!key || f.c >= f.e)
                goto no;
            guint fi = key->field;
            if (!fast_value(p, &f, &fields[fi]))
                goto no;
            fv.f[fi] = &fields[fi];
            n++;
        }
        Entry en;
        if (entry_check(p, &fv, &en) != ENTRY_OK)
            goto no; /* the opcodes' path says what is wrong */
        f.c++; /* SETITEMS */
        /* as the opcodes would have done it: the memo stores, then the entry placed */
        for (guint i = 0; i < f.n_memo; i++)
            memo_set(p, f.memo[i].idx, f.memo[i].h);
        p->ops += (guint64)(f.c - (p->in.buf + p->in.pos)) / 4;
        p->in.pos = (gsize)(f.c - p->in.buf);
        if (!d) {
            if (dl->index >= MAX_DEVICES)
                return fail_at(p, "device_traces", "more devices than %u", MAX_DEVICES), 1;
            d = dev_get(p, (guint32)dl->index);
            if (d->owner && d->owner != dl->serial)
                return fail(p, off, "a second list of trace entries for device %u", d->dev), 1;
            d->owner = dl->serial;
        }
        gboolean go = entry_queue(p, d, d->n++, &en, fv.f[EF_FRAMES]);
        dl->n_read++;
        if (!go || p->failed)
            return 1;
        /* the next entry of the run, when the next opcode opens one (anything else, a FRAME
         * among them, goes back to run()) */
        if (p->ops >> 12 != ops_block) {
            ops_block = p->ops >> 12;
            if (over_limit(p))
                return over_memory(p), 1;
        }
        if (p->in.pos >= p->in.end && !input_need(&p->in, 1))
            return 1; /* (run() says why) */
        if (p->in.buf[p->in.pos] != '}')
            return 1;
        off = here(p);
        p->in.pos++;
        first = FALSE;
        continue;
    no:
        if (first)
            return 0;
        /* an EMPTY_DICT the fast path does not take: what run() does with it */
        push_cont(p, C_DICT, off);
        return 1;
    }
}

static gboolean finish(P *p, Val *root);

/* Runs the opcodes up to STOP and reads the snapshot they hold. */
static gboolean run(P *p)
{
    for (;;) {
        if (G_UNLIKELY(p->in.pos >= p->in.end) && !input_need(&p->in, 1)) {
            if (p->in.err)
                return fail(p, here(p), "%s", p->in.err);
            return fail(p, here(p), "truncated: the data ends before the STOP opcode");
        }
        if (G_UNLIKELY(p->n_stack > PICKLE_MAX_STACK))
            return fail(p, here(p), "more than %u values on the stack (picklers append list "
                        "items and dict pairs in runs of 1000): not the data of a snapshot",
                        PICKLE_MAX_STACK);
        if (G_UNLIKELY((++p->ops & 4095) == 0 && over_limit(p)))
            return over_memory(p);
        const guint64 off = here(p);
        const guint8 op = p->in.buf[p->in.pos++];
        const guint8 *s = NULL;
        gsize n;
        guint64 u;
        gint64 i;
        gboolean big;
        gsize mark = 0;

        switch (op) {
        case 0x80: /* PROTO */
            if (!arg(p, off, op, 1, &s))
                return FALSE;
            if (s[0] < 2 || s[0] > 5)
                return fail(p, off, "unsupported pickle protocol %u (protocols 2 to 5 are read)",
                            (unsigned)s[0]);
            break;
        case 0x95: /* FRAME: a length hint only; opcodes may straddle frames */
            if (!arg(p, off, op, 8, &s))
                return FALSE;
            u = read_le(s, 8);
            if (p->in.total && u > p->in.total - here(p))
                return fail(p, off, "truncated: FRAME of %" G_GUINT64_FORMAT " bytes, %"
                            G_GUINT64_FORMAT " left", u, p->in.total - here(p));
            break;
        case '.': /* STOP */
            if (p->n_marks)
                return fail(p, off, "STOP with an open MARK (made at a value stack height of %"
                            G_GSIZE_FORMAT ")", p->marks[p->n_marks - 1]);
            if (p->n_stack != 1)
                return fail(p, off, "STOP with %" G_GSIZE_FORMAT " values on the stack (1 "
                            "expected)", p->n_stack);
            return finish(p, &p->stack[0]);

        case '(': /* MARK */
            if (p->n_marks >= PICKLE_MAX_DEPTH)
                return fail(p, off, "more than %d nested MARKs", PICKLE_MAX_DEPTH);
            if (p->n_marks == p->cap_marks) {
                p->cap_marks = p->cap_marks ? 2 * p->cap_marks : 64;
                p->marks = g_renew(gsize, p->marks, p->cap_marks);
            }
            p->marks[p->n_marks++] = p->n_stack;
            break;
        case '0': /* POP */
            if (p->n_marks && p->marks[p->n_marks - 1] == p->n_stack) {
                p->n_marks--;
            } else {
                if (!need_stack(p, off, op, 1))
                    return FALSE;
                val_unref(p, &p->stack[--p->n_stack]);
            }
            break;
        case '1': /* POP_MARK */
            if (!pop_mark(p, off, op, &mark))
                return FALSE;
            while (p->n_stack > mark)
                val_unref(p, &p->stack[--p->n_stack]);
            break;
        case '2': /* DUP */
            if (!need_stack(p, off, op, 1))
                return FALSE;
            push(p, val_ref(p->stack[p->n_stack - 1]));
            break;

        case 'N':
            push(p, (Val){.t = V_NONE, .off = NO_OFF});
            break;
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            push(p, (Val){.t = V_BOOL, .off = NO_OFF, .u.i = op == 0x88});
            break;

        case 'I':
            if (!read_line(p, off, op, &s, &n))
                return FALSE;
            if (n == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1')) {
                push(p, (Val){.t = V_BOOL, .off = NO_OFF, .u.i = s[1] == '1'});
                break;
            }
            if (!memsim_pickle_parse_decimal(s, n, &i, &big)) {
                g_autofree char *q = memsim_pickle_quote(s, n);
                return fail(p, off, "opcode 0x49 (INT): %s is not a decimal integer", q);
            }
            push(p, int_val(off, i, big));
            break;
        case 'L':
            if (!read_line(p, off, op, &s, &n))
                return FALSE;
            if (n && s[n - 1] == 'L')
                n--;
            if (!memsim_pickle_parse_decimal(s, n, &i, &big)) {
                g_autofree char *q = memsim_pickle_quote(s, n);
                return fail(p, off, "opcode 0x4c (LONG): %s is not a decimal integer", q);
            }
            push(p, int_val(off, i, big));
            break;
        case 'J':
            if (!arg(p, off, op, 4, &s))
                return FALSE;
            u = read_le(s, 4);
            push(p, int_val(off, u >= 0x80000000u ? (gint64)u - 0x100000000 : (gint64)u, FALSE));
            break;
        case 'K':
        case 'M':
            n = op == 'K' ? 1 : 2;
            if (!arg(p, off, op, n, &s))
                return FALSE;
            push(p, int_val(off, (gint64)read_le(s, (int)n), FALSE));
            break;
        case 0x8a: /* LONG1 */
            if (!arg(p, off, op, 1, &s))
                return FALSE;
            n = s[0];
            if (!arg(p, off, op, n, &s))
                return FALSE;
            push(p, long_bytes(off, s, n));
            break;
        case 0x8b: /* LONG4 */
            if (!arg(p, off, op, 4, &s))
                return FALSE;
            u = read_le(s, 4);
            if (u >= 0x80000000u)
                return fail(p, off, "opcode 0x8b (LONG4) with a negative byte count");
            if (!arg(p, off, op, u, &s))
                return FALSE;
            push(p, long_bytes(off, s, (gsize)u));
            break;

        case 'F': {
            if (!read_line(p, off, op, &s, &n))
                return FALSE;
            g_autofree char *text = g_strndup((const char *)s, n);
            char *end = NULL;
            double d = g_ascii_strtod(text, &end);
            if (!(n > 0 && end && *end == '\0' && !g_ascii_isspace(text[0]) && strlen(text) == n)) {
                g_autofree char *q = memsim_pickle_quote(s, n);
                return fail(p, off, "opcode 0x46 (FLOAT): %s is not a number", q);
            }
            push(p, (Val){.t = V_FLOAT, .off = off, .u.f = d});
            break;
        }
        case 'G': {
            if (!arg(p, off, op, 8, &s))
                return FALSE;
            guint64 bits = 0;
            for (int k = 0; k < 8; k++)
                bits = (bits << 8) | s[k];
            double d;
            memcpy(&d, &bits, sizeof d);
            push(p, (Val){.t = V_FLOAT, .off = off, .u.f = d});
            break;
        }

        case 'V': {
            Val v;
            if (!read_line(p, off, op, &s, &n) || !raw_unicode(p, off, s, n, &v))
                return FALSE;
            push(p, v);
            break;
        }
        case 0x8c: /* SHORT_BINUNICODE */
        case 'U':
        case 'C':
            if (!arg(p, off, op, 1, &s))
                return FALSE;
            u = s[0];
            goto counted;
        case 'X':
        case 'B':
        case 'T':
            if (!arg(p, off, op, 4, &s))
                return FALSE;
            u = read_le(s, 4);
            if (op == 'T' && u >= 0x80000000u)
                return fail(p, off, "opcode 0x54 (BINSTRING) with a negative byte count");
            goto counted;
        case 0x8d:
        case 0x8e:
        case 0x96:
            if (!arg(p, off, op, 8, &s))
                return FALSE;
            u = read_le(s, 8);
        counted: {
            gboolean bytes = op == 'C' || op == 'B' || op == 0x8e || op == 0x96;
            if (!arg(p, off, op, u, &s))
                return FALSE;
            if ((op == 0x8c || op == 'X' || op == 0x8d) &&
                !memsim_pickle_utf8_ok(s, (gsize)u))
                return fail(p, off, "a str that is not UTF-8 text");
            push(p, (Val){.t = bytes ? V_BYTES : V_STR, .off = off,
                          .u.s = intern(p, (const char *)s, (gsize)u, bytes)});
            break;
        }

        case '}':
            if (fast_entry(p, off)) {
                if (p->failed)
                    return FALSE;
                break;
            }
            push_cont(p, C_DICT, off);
            break;
        case ']':
            push_cont(p, C_LIST, off);
            break;
        case ')':
            if (!make_seq(p, off, op, p->n_stack, C_TUPLE))
                return FALSE;
            break;
        case 0x85:
        case 0x86:
        case 0x87:
            n = (gsize)(op - 0x84);
            if (!need_stack(p, off, op, n) || !make_seq(p, off, op, p->n_stack - n, C_TUPLE))
                return FALSE;
            break;
        case 't':
            if (!pop_mark(p, off, op, &mark) || !make_seq(p, off, op, mark, C_TUPLE))
                return FALSE;
            break;
        case 'l':
            if (!pop_mark(p, off, op, &mark) || !make_seq(p, off, op, mark, C_LIST))
                return FALSE;
            break;
        case 'd': { /* DICT */
            if (!pop_mark(p, off, op, &mark))
                return FALSE;
            Cont *d = cont_new(p, C_DICT, off);
            push(p, (Val){.t = V_CONT, .off = off, .u.c = d});
            /* the new dict below its items: move it to `mark` */
            Val dv = p->stack[p->n_stack - 1];
            memmove(&p->stack[mark + 1], &p->stack[mark], (p->n_stack - 1 - mark) * sizeof(Val));
            p->stack[mark] = dv;
            if (!dict_set_from(p, off, op, mark, mark + 1))
                return FALSE;
            break;
        }
        case 'a': /* APPEND */
            if (!need_stack(p, off, op, 2) || !list_append_from(p, off, op, p->n_stack - 1))
                return FALSE;
            break;
        case 'e': /* APPENDS */
            if (!pop_mark(p, off, op, &mark))
                return FALSE;
            if (mark <= fence(p))
                return fail(p, off, "stack underflow: opcode 0x65 (APPENDS) has no list below "
                            "its MARK");
            if (!list_append_from(p, off, op, mark))
                return FALSE;
            break;
        case 's': /* SETITEM */
            if (!need_stack(p, off, op, 3) ||
                !dict_set_from(p, off, op, p->n_stack - 3, p->n_stack - 2))
                return FALSE;
            break;
        case 'u': /* SETITEMS */
            if (!pop_mark(p, off, op, &mark))
                return FALSE;
            if (mark <= fence(p))
                return fail(p, off, "stack underflow: opcode 0x75 (SETITEMS) has no dict below "
                            "its MARK");
            if (!dict_set_from(p, off, op, mark - 1, mark))
                return FALSE;
            break;

        case 'p': /* PUT */
        case 'g': { /* GET */
            if (!read_line(p, off, op, &s, &n))
                return FALSE;
            if (!memsim_pickle_parse_decimal(s, n, &i, &big) || big || i < 0) {
                g_autofree char *q = memsim_pickle_quote(s, n);
                return fail(p, off, "opcode 0x%02x (%s): bad memo index %s", op, op_name(op), q);
            }
            if (!(op == 'p' ? memo_put(p, off, op, (guint64)i) : memo_get(p, off, op, (guint64)i)))
                return FALSE;
            break;
        }
        case 'q': /* BINPUT */
        case 'h': /* BINGET */
            if (!arg(p, off, op, 1, &s))
                return FALSE;
            if (!(op == 'q' ? memo_put(p, off, op, s[0]) : memo_get(p, off, op, s[0])))
                return FALSE;
            break;
        case 'r': /* LONG_BINPUT */
        case 'j': /* LONG_BINGET */
            if (!arg(p, off, op, 4, &s))
                return FALSE;
            u = read_le(s, 4);
            if (!(op == 'r' ? memo_put(p, off, op, u) : memo_get(p, off, op, u)))
                return FALSE;
            break;
        case 0x94: /* MEMOIZE */
            if (!memo_put(p, off, op, p->n_memo))
                return FALSE;
            break;

        default:
            return fail(p, off, "opcode 0x%02x (%s) is not allowed in a snapshot (only plain "
                        "data is read)", op, op_name(op));
        }
    }
}

/* ---- the end: settings, starting states, ranks ------------------------------------------------ */

static char *settings_string(P *p, const Cont *s)
{
    if (!s)
        return NULL;
    const Str *conf = get_str(s, intern0(p, "PYTORCH_CUDA_ALLOC_CONF"));
    GString *g = g_string_new(NULL);
    const Val *v;
    if ((v = dict_get(s, intern0(p, "expandable_segments"))) && v->t == V_BOOL)
        g_string_append_printf(g, "%sexpandable_segments:%s", g->len ? "," : "",
                               v->u.i ? "True" : "False");
    if ((v = dict_get(s, intern0(p, "max_split_size"))) && v->t == V_INT && v->u.i > 0)
        g_string_append_printf(g, "%smax_split_size_mb:%" G_GINT64_FORMAT, g->len ? "," : "",
                               v->u.i >> 20);
    if ((v = dict_get(s, intern0(p, "garbage_collection_threshold"))) && v->t == V_FLOAT &&
        v->u.f > 0) {
        char buf[G_ASCII_DTOSTR_BUF_SIZE];
        g_string_append_printf(g, "%sgarbage_collection_threshold:%s", g->len ? "," : "",
                               g_ascii_dtostr(buf, sizeof buf, v->u.f));
    }
    if ((v = dict_get(s, intern0(p, "roundup_power2_divisions"))) && v->t == V_CONT &&
        v->u.c->type == C_DICT) {
        const Cont *d = v->u.c;
        GString *list = g_string_new(NULL);
        gboolean any = FALSE;
        for (gsize i = 0; i < d->n; i++) {
            const Val *k = &d->items[2 * i], *x = &d->items[2 * i + 1];
            gboolean later = FALSE; /* a repeated key keeps its first place, its last value */
            for (gsize j = 0; j < i && !later; j++)
                later = d->items[2 * j].t == k->t && k->t == V_STR && d->items[2 * j].u.s == k->u.s;
            if (later)
                continue;
            if (k->t == V_STR)
                x = dict_get(d, k->u.s);
            if (k->t != V_STR || x->t != V_INT || x->u.i < 0)
                continue;
            if (x->u.i > 0)
                any = TRUE;
            g_string_append_printf(list, "%s%s:%" G_GINT64_FORMAT, list->len ? "," : "",
                                   k->u.s->data, x->u.i);
        }
        if (any)
            g_string_append_printf(g, "%sroundup_power2_divisions:[%s]", g->len ? "," : "",
                                   list->str);
        g_string_free(list, TRUE);
    }
    if (conf && conf->len) {
        g_auto(GStrv) parts = g_strsplit(conf->data, ",", -1);
        for (char **q = parts; *q; q++) {
            g_autofree char *t = g_strstrip(g_strdup(*q));
            if (g_str_has_prefix(t, "max_non_split_rounding_mb") ||
                g_str_has_prefix(t, "per_process_memory_fraction"))
                g_string_append_printf(g, "%s%s", g->len ? "," : "", t);
        }
    }
    if (g->len == 0) {
        g_string_free(g, TRUE);
        return conf && conf->len ? g_strdup(conf->data) : NULL;
    }
    return g_string_free(g, FALSE);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    uint64_t addr, size, requested;
    guint32 sb; /* index in Dev.startb + 1, 0 = from the final state */
} Live0;

/* A rank's events as the trace has them, made from what was parsed as they are asked for:
 * the starting state (INIT_SEGMENT / INIT_BLOCK), then the parsed events renumbered (ids
 * after the starting blocks', those of blocks live at the start theirs), their streams in
 * handle order, frees of blocks no segment holds dropped, then the EMPTY_CACHE a last run of
 * segment frees makes. */
typedef struct {
    GArray *init;      /* MemsimEvent */
    guint8 *code;      /* the parsed events (Dev.code) */
    guint n;           /* parsed events */
    guint16 *smap;     /* provisional stream → the trace's */
    guint n_smap;
    uint64_t *start_id; /* Dev.startb index → id (0: the free is dropped) */
    uint64_t n_init;
    gboolean tail;
    guint16 tail_stream;
    gsize total;       /* events in all */
    /* where the next call goes on */
    gsize at_init, at;
    const guint8 *rd;
    Coder dec;
    gboolean tail_done;
} RankCode;

static void rank_code_free(gpointer x)
{
    RankCode *c = x;
    if (!c)
        return;
    if (c->init)
        g_array_unref(c->init);
    g_free(c->code);
    g_free(c->smap);
    g_free(c->start_id);
    g_free(c);
}

/* The next parsed event, provisional. */
static inline void code_parsed(RankCode *c, MemsimEvent *ev)
{
    c->rd = decode(&c->dec, c->rd, ev);
    c->at++;
}

/* Back to the first parsed event. */
static void code_rewind(RankCode *c)
{
    c->rd = c->code;
    c->at = 0;
    memset(&c->dec, 0, sizeof c->dec);
}

/* Up to `max` next events into out; 0 at the end. */
static gsize rank_code_next(RankCode *c, MemsimEvent *out, gsize max)
{
    gsize k = 0;
    while (k < max && c->at_init < c->init->len)
        out[k++] = g_array_index(c->init, MemsimEvent, c->at_init++);
    while (k < max && c->at < c->n) {
        MemsimEvent ev;
        code_parsed(c, &ev);
        ev.stream = ev.stream < c->n_smap ? c->smap[ev.stream] : 0;
        if (ev.kind == MEMSIM_EV_ALLOC) {
            ev.id += c->n_init;
        } else if (ev.kind == MEMSIM_EV_FREE) {
            if (ev.id & START_ID) {
                ev.id = c->start_id[ev.id & ~START_ID];
                if (!ev.id)
                    continue;
            } else {
                ev.id += c->n_init;
            }
        }
        out[k++] = ev;
    }
    if (k < max && c->at == c->n && c->tail && !c->tail_done) {
        MemsimEvent ec = {.kind = MEMSIM_EV_EMPTY_CACHE, .flags = MEMSIM_EVF_INFERRED,
                          .stream = c->tail_stream};
        out[k++] = ec;
        c->tail_done = TRUE;
    }
    return k;
}

/* All of a rank's events at once, as its program in `t`; frees `c`. */
static void rank_code_append(MemsimTrace *t, guint32 rank, RankCode *c)
{
    GArray *events = g_array_sized_new(FALSE, FALSE, sizeof(MemsimEvent), (guint)c->total);
    g_array_set_size(events, (guint)c->total);
    gsize got = rank_code_next(c, (MemsimEvent *)(void *)events->data, c->total);
    g_assert(got == c->total);
    rank_code_free(c);
    memsim_trace_append_array(t, rank, events);
}

static gboolean build_rank(P *p, guint32 device, GArray *segs, Dev *v, const TorchSettings *rounder,
                           uint64_t max_split)
{
    MemsimTrace *t = p->t;
    guint32 rank = memsim_trace_add_rank(t, device, 1);
    MemsimRankInfo *ri = &memsim_trace_header(t)->ranks[rank];
    gboolean has_entries = v && v->n_parsed > 0;
    char where[80];

    /* Streams, ordered by handle value as the allocator orders them. */
    GArray *handles = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    Map seen = {0};
    uint64_t zero = 0;
    map_put(&seen, 0, NULL);
    g_array_append_val(handles, zero);
    uint64_t final_reserved = 0, final_allocated = 0;
    for (guint i = 0; i < segs->len; i++) {
        Segment *s = &g_array_index(segs, Segment, i);
        gboolean fresh;
        map_put(&seen, s->stream, &fresh);
        if (fresh)
            g_array_append_val(handles, s->stream);
        final_reserved += s->size;
        for (guint j = 0; j < s->blocks->len; j++) {
            Block *b = &g_array_index(s->blocks, Block, j);
            if (b->allocated)
                final_allocated += b->size;
        }
    }
    for (guint i = 0; v && i < v->handles->len; i++) {
        gboolean fresh;
        map_put(&seen, g_array_index(v->handles, uint64_t, i), &fresh);
        if (fresh)
            g_array_append_val(handles, g_array_index(v->handles, uint64_t, i));
    }
    map_clear(&seen);
    g_array_sort(handles, cmp_u64);
    if (handles->len > 65535) {
        g_array_unref(handles);
        return fail_at(p, "device_traces", "more than 65535 streams on device %u", device);
    }
    Map sidx = {0}; /* handle → final index */
    for (guint i = 0; i < handles->len; i++)
        map_put(&sidx, g_array_index(handles, uint64_t, i), NULL)->a = i;
    ri->n_streams = handles->len;
    ri->stream_handles = g_memdup2(handles->data, sizeof(uint64_t) * handles->len);
    ri->has_final = TRUE;
    ri->final_reserved = final_reserved;
    ri->final_allocated = final_allocated;
    g_array_unref(handles);

    gboolean ok = FALSE;
    Map seg_at = {0};    /* addr → index in start (a), the final candidates */
    Map live = {0};      /* addr → index in lives */
    GArray *start = g_array_new(FALSE, FALSE, sizeof(StartSeg));
    GArray *lives = g_array_new(FALSE, FALSE, sizeof(Live0));
    GArray *init = g_array_new(FALSE, TRUE, sizeof(MemsimEvent));
    int64_t mapped = 0;
    gboolean any_expandable = v && v->any_map;

    /* Final state. */
    GArray *final_segs = g_array_new(FALSE, FALSE, sizeof(StartSeg));
    for (guint i = 0; i < segs->len; i++) {
        Segment *s = &g_array_index(segs, Segment, i);
        if (s->expandable && has_entries) {
            any_expandable = TRUE;
            mapped += (int64_t)s->size;
        } else {
            StartSeg ss = {s->addr, s->size, s->stream, s->small, s->expandable};
            gboolean fresh;
            Slot *sl = map_put(&seg_at, s->addr, &fresh);
            if (fresh) {
                sl->a = final_segs->len;
                g_array_append_val(final_segs, ss);
            } else {
                g_array_index(final_segs, StartSeg, sl->a) = ss;
            }
        }
        for (guint j = 0; j < s->blocks->len; j++) {
            Block *b = &g_array_index(s->blocks, Block, j);
            if (!b->allocated)
                continue;
            /* the entry + 1 of its last free in the trace, 0 for none */
            Slot *ps = map_find(&p->pending, b->addr), *pf = v ? map_find(&v->freed, b->addr) : NULL;
            uint64_t freed = ps && ps->a == device && ps->b ? ps->b : pf ? pf->b : 0;
            if (b->pending) {
                if (freed)
                    continue;
            } else if (v && map_find(&v->live, b->addr)) {
                continue; /* allocated by the trace */
            } else if (freed) {
                /* freed by the trace and not allocated again, yet live at the end */
                g_snprintf(where, sizeof where, "device_traces[%u][%" G_GUINT64_FORMAT "]",
                           device, freed - 1);
                fail_at(p, where, "free of 0x%" G_GINT64_MODIFIER "x, which is live again "
                        "before any alloc", b->addr);
                goto out;
            }
            Live0 l = {b->addr, b->size, b->requested, 0};
            gboolean fresh;
            Slot *sl = map_put(&live, b->addr, &fresh);
            if (fresh) {
                sl->a = lives->len;
                g_array_append_val(lives, l);
            } else {
                g_array_index(lives, Live0, sl->a) = l;
            }
        }
    }
    if (v) {
        /* what the trace allocated and kept must be live at the end: an allocated, not
         * pending, block of the final state */
        Map fin = {0};
        for (guint i = 0; i < segs->len; i++) {
            Segment *s = &g_array_index(segs, Segment, i);
            for (guint j = 0; j < s->blocks->len; j++) {
                Block *b = &g_array_index(s->blocks, Block, j);
                if (b->allocated && !b->pending)
                    map_put(&fin, b->addr, NULL);
            }
        }
        uint64_t bad_k = 0, bad_addr = 0;
        gboolean bad = FALSE;
        for (gsize i = 0; i < v->live.cap; i++) {
            Slot *a = &v->live.s[i];
            if (!a->used)
                continue;
            gboolean is_live = map_find(&fin, a->key) != NULL;
            if (!is_live && (!bad || a->b > bad_k)) {
                bad = TRUE;
                bad_k = a->b;
                bad_addr = a->key;
            }
        }
        map_clear(&fin);
        if (bad) {
            g_snprintf(where, sizeof where, "device_traces[%u][%" G_GUINT64_FORMAT "]", device,
                       bad_k);
            fail_at(p, where, "alloc at 0x%" G_GINT64_MODIFIER "x is neither freed later nor "
                    "live at the end", bad_addr);
            goto out;
        }
        for (gsize i = 0; i < v->segs.cap; i++) {
            Slot *a = &v->segs.s[i];
            if (a->used && !map_find(&seg_at, a->key)) {
                g_snprintf(where, sizeof where, "device_traces[%u][%" G_GUINT64_FORMAT "]",
                           device, a->a);
                fail_at(p, where, "segment_alloc at 0x%" G_GINT64_MODIFIER "x of a segment that "
                        "neither exists at the end nor is freed later", a->key);
                goto out;
            }
        }
        mapped -= v->mapped;
    }
    if (any_expandable && mapped != 0) {
        g_set_error(p->error, MEMSIM_ERROR, MEMSIM_ERROR_UNSUPPORTED,
                    "%s: device %u: the trace of an expandable-segments allocator begins with "
                    "%" G_GINT64_FORMAT " bytes already mapped; rebuilding that starting state "
                    "is not supported", p->name, device, mapped);
        p->failed = TRUE;
        goto out;
    }
    /* Starting segments: found by their frees (first), then the final ones the trace did
     * not allocate. */
    for (guint i = 0; v && i < v->startseg->len; i++)
        g_array_append_val(start, g_array_index(v->startseg, StartSeg, i));
    for (guint i = 0; i < final_segs->len; i++) {
        StartSeg *ss = &g_array_index(final_segs, StartSeg, i);
        if (v && (map_find(&v->segs, ss->addr) || map_find(&v->seg_start, ss->addr)))
            continue;
        g_array_append_val(start, *ss);
    }
    g_array_sort(start, cmp_u64);
    /* Blocks live at the start: the final ones (above) and those found by their frees. */
    for (guint i = 0; v && i < v->startb->len; i++) {
        StartBlock *sb = &g_array_index(v->startb, StartBlock, i);
        Live0 l = {sb->addr, 0, sb->requested, i + 1};
        gboolean fresh;
        Slot *sl = map_put(&live, sb->addr, &fresh);
        if (fresh) {
            sl->a = lives->len;
            g_array_append_val(lives, l);
        } else {
            g_array_index(lives, Live0, sl->a) = l;
        }
    }
    g_array_sort(lives, cmp_u64);

    uint64_t next_id = 1, held = 0;
    guint bi = 0;
    for (guint i = 0; i < start->len; i++) {
        StartSeg *s = &g_array_index(start, StartSeg, i);
        held += s->size;
        if (i + 1 < start->len && s->addr + s->size > g_array_index(start, StartSeg, i + 1).addr) {
            fail_at(p, "segments", "device %u: segments at 0x%" G_GINT64_MODIFIER "x and 0x%"
                    G_GINT64_MODIFIER "x overlap", device, s->addr,
                    g_array_index(start, StartSeg, i + 1).addr);
            goto out;
        }
        guint16 st = (guint16)map_find(&sidx, s->stream)->a;
        MemsimEvent ev = {.kind = MEMSIM_EV_INIT_SEGMENT, .stream = st, .addr = s->addr,
                          .size = s->size,
                          .aux = (s->small ? MEMSIM_SEGF_SMALL : 0) |
                                 (s->expandable ? MEMSIM_SEGF_EXPANDABLE : 0)};
        g_array_append_val(init, ev);
        uint64_t end = s->addr + s->size;
        while (bi < lives->len && g_array_index(lives, Live0, bi).addr < s->addr)
            bi++;
        while (bi < lives->len && g_array_index(lives, Live0, bi).addr < end) {
            Live0 *l = &g_array_index(lives, Live0, bi);
            uint64_t a = l->addr;
            uint64_t next = bi + 1 < lives->len && g_array_index(lives, Live0, bi + 1).addr < end
                                ? g_array_index(lives, Live0, bi + 1).addr
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
                fail_at(p, "device_traces", "device %u: block at 0x%" G_GINT64_MODIFIER
                        "x (%" G_GUINT64_FORMAT " bytes requested), live at the start, "
                        "overlaps the next block or its segment's end", device, a, l->requested);
                goto out;
            }
            MemsimEvent b = {.kind = MEMSIM_EV_INIT_BLOCK, .category = MEMSIM_CAT_PARAMETER,
                             .stream = st, .id = next_id, .addr = a, .size = l->requested,
                             .aux = size};
            g_array_append_val(init, b);
            if (l->sb)
                g_array_index(v->startb, StartBlock, l->sb - 1).id = next_id;
            next_id++;
            bi++;
        }
    }
    uint64_t n_init = next_id - 1;

    /* The events: renumbered, their streams ordered, frees of blocks no segment holds
     * dropped (RankCode); the capacity of a recorded OOM. */
    RankCode *c = g_new0(RankCode, 1);
    c->init = init;
    init = NULL;
    c->n_init = n_init;
    c->total = c->init->len;
    uint64_t capacity = 0;
    if (v) {
        c->n = v->n_events;
        c->code = v->code;
        v->code = NULL;
        v->code_len = v->code_cap = 0;
        v->n_events = 0;
        c->n_smap = v->handles->len;
        c->smap = g_new(guint16, MAX(c->n_smap, 1));
        for (guint i = 0; i < c->n_smap; i++)
            c->smap[i] = (guint16)map_find(&sidx, g_array_index(v->handles, uint64_t, i))->a;
        c->start_id = g_new0(uint64_t, MAX(v->startb->len, 1));
        guint64 dropped = 0;
        for (guint i = 0; i < v->startb->len; i++) {
            /* each found by the free that is its one START_ID event */
            StartBlock *sb = &g_array_index(v->startb, StartBlock, i);
            c->start_id[i] = sb->id;
            if (!sb->id) {
                g_snprintf(where, sizeof where, "device_traces[%u][%" G_GUINT64_FORMAT "]",
                           device, sb->entry);
                odd(p, device, "frees of an address no segment holds, skipped", where,
                    "free of 0x%" G_GINT64_MODIFIER "x", sb->addr);
                dropped++;
            }
        }
        c->total += c->n - dropped;
        if (v->release_run) {
            c->tail = TRUE;
            c->tail_stream = c->smap[v->release_stream];
            c->total++;
        }
        /* c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::malloc records the OOM
         * with cudaMemGetInfo's device_free after releasing its cached blocks: the allocator
         * could have had what it held then plus that. */
        code_rewind(c);
        for (gsize i = 0; v->any_oom && i < c->n && !capacity; i++) {
            MemsimEvent ev;
            code_parsed(c, &ev);
            switch (ev.kind) {
            case MEMSIM_EV_SEG_ALLOC:
            case MEMSIM_EV_SEG_MAP:
                held += ev.size;
                break;
            case MEMSIM_EV_SEG_FREE:
            case MEMSIM_EV_SEG_UNMAP:
                held -= MIN(held, ev.size);
                break;
            case MEMSIM_EV_OOM:
                if (held + ev.addr >= held)
                    capacity = held + ev.addr;
                break;
            default:
                break;
            }
        }
        code_rewind(c);
    }
    ri->capacity = capacity;
    if (p->codes) {
        if (p->codes->len <= rank)
            g_ptr_array_set_size(p->codes, rank + 1);
        g_ptr_array_index(p->codes, rank) = c;
    } else {
        rank_code_append(t, rank, c);
    }
    ok = TRUE;
out:
    map_clear(&sidx);
    map_clear(&seg_at);
    map_clear(&live);
    g_array_unref(start);
    g_array_unref(lives);
    if (init)
        g_array_unref(init);
    g_array_unref(final_segs);
    return ok;
}

static gboolean finish(P *p, Val *rootv)
{
    if (rootv->t != V_CONT || rootv->u.c->type == C_TUPLE)
        return fail_at(p, "top level", "is a %s, expected the dict of a PyTorch memory snapshot",
                       type_name(rootv));
    Cont *root = rootv->u.c;
    if (root->type == C_LIST) {
        /* torch.cuda.memory_snapshot(): the segments alone */
        if (root->role != R_SEGS) {
            for (gsize i = 0; i < root->n; i++)
                if (!read_segment(p, &root->items[i], i))
                    return FALSE;
        }
    } else {
        if (root->role != R_ROOT) {
            /* made by a DICT opcode: its values are read now */
            Cont tmp = {.type = C_DICT, .role = R_ROOT, .serial = ++p->serial};
            for (gsize i = 0; i < root->n; i++) {
                Val k = val_ref(root->items[2 * i]), v = val_ref(root->items[2 * i + 1]);
                if (!place(p, &tmp, &k, &v, root->off, 'd'))
                    return FALSE;
            }
        }
        if (!p->root_has_segments)
            return fail_at(p, "top level", "no 'segments' key: not a PyTorch memory snapshot");
    }

    /* every entry applied: the devices' state is whole */
    if (!apply_drain(p))
        return FALSE;
    MemsimTrace *t = p->t;
    MemsimTraceHeader *h = memsim_trace_header(t);
    const Cont *settings = NULL;
    if (p->settings.t == V_CONT && p->settings.u.c->type == C_DICT)
        settings = p->settings.u.c;
    else if (p->settings.t != V_NONE || p->settings_none)
        return fail_at(p, "allocator_settings", "is a %s, expected a dict", type_name(&p->settings));
    h->alloc_conf = settings_string(p, settings);
    TorchSettings rounder;
    GError *e2 = NULL;
    if (!torch_settings_parse(h->alloc_conf, &rounder, &e2)) {
        fail_at(p, "allocator_settings", "%s", e2->message);
        g_error_free(e2);
        return FALSE;
    }
    uint64_t max_split = UINT64_MAX;
    const Val *ms = settings ? dict_get(settings, intern0(p, "max_split_size")) : NULL;
    if (ms && ms->t == V_INT && ms->u.i > 0)
        max_split = (uint64_t)ms->u.i;

    /* Ranks: the devices that have a trace; when none has one, those with segments. */
    guint n_dev = (guint)p->n_dev_lists;
    gboolean any_trace = FALSE;
    for (guint d = 0; d < n_dev && d < p->devs->len; d++) {
        Dev *v = g_ptr_array_index(p->devs, d);
        if (v && v->n_parsed)
            any_trace = TRUE;
    }
    for (guint i = 0; i < p->segs->len; i++) {
        uint64_t dv = g_array_index(p->segs, Segment, i).device;
        if (dv >= MAX_DEVICES)
            return fail_at(p, "segments", "device index %" G_GUINT64_FORMAT " is out of range "
                           "(expected below %u)", dv, MAX_DEVICES);
        if (dv + 1 > n_dev)
            n_dev = (guint)dv + 1;
    }
    GArray **dev_segs = g_new0(GArray *, n_dev);
    for (guint i = 0; i < p->segs->len; i++) {
        Segment *s = &g_array_index(p->segs, Segment, i);
        if (!dev_segs[s->device])
            dev_segs[s->device] = g_array_new(FALSE, FALSE, sizeof(Segment));
        g_array_append_val(dev_segs[s->device], *s);
    }
    GArray *no_segs = g_array_new(FALSE, FALSE, sizeof(Segment));
    gboolean ok = TRUE;
    for (guint d = 0; d < n_dev && ok; d++) {
        Dev *v = d < p->n_dev_lists && d < p->devs->len ? g_ptr_array_index(p->devs, d) : NULL;
        gboolean has = v && v->n_parsed;
        if (any_trace ? !has : !dev_segs[d])
            continue;
        ok = build_rank(p, d, dev_segs[d] ? dev_segs[d] : no_segs, v, &rounder, max_split);
        if (v) {
            /* what the rank no longer needs */
            map_clear(&v->live);
            map_clear(&v->start);
        }
    }
    for (guint d = 0; d < n_dev; d++)
        if (dev_segs[d])
            g_array_unref(dev_segs[d]);
    g_free(dev_segs);
    g_array_unref(no_segs);
    return ok;
}

/* ---- public ------------------------------------------------------------------------------------ */

static void segment_clear(gpointer x)
{
    Segment *s = x;
    if (s->blocks)
        g_array_unref(s->blocks);
}

static MemsimTrace *read_all(Input *in, const char *name, GPtrArray **codes, GError **error)
{
    P p = {0};
    if (codes)
        p.codes = g_ptr_array_new_with_free_func(rank_code_free);
    p.name = name;
    p.error = error;
    p.in = *in;
    p.conts = g_ptr_array_new();
    p.free_conts = g_array_new(FALSE, FALSE, sizeof(guint32));
    p.scalars = g_array_new(FALSE, FALSE, sizeof(Val));
    p.strs = g_hash_table_new(str_hash, str_equal);
    p.str_by_id = g_ptr_array_new();
    p.chunks = g_ptr_array_new_with_free_func(g_free);
    p.frames = g_array_new(FALSE, FALSE, sizeof(Frame));
    p.stacks = g_array_new(FALSE, FALSE, sizeof(Stack));
    p.stack_frames = g_array_new(FALSE, FALSE, sizeof(guint32));
    p.t = memsim_trace_new(name);
    memsim_snap_odd_init(&p.odd);
    p.segs = g_array_new(FALSE, FALSE, sizeof(Segment));
    g_array_set_clear_func(p.segs, segment_clear);
    p.devs = g_ptr_array_new_with_free_func(dev_free);
    p.settings.t = V_NONE;

    p.k_segments = intern0(&p, "segments");
    p.k_device_traces = intern0(&p, "device_traces");
    p.k_settings = intern0(&p, "allocator_settings");
    p.k_blocks = intern0(&p, "blocks");
    p.k_frames = intern0(&p, "frames");
    p.k_action = intern0(&p, "action");
    p.k_addr = intern0(&p, "addr");
    p.k_size = intern0(&p, "size");
    p.k_stream = intern0(&p, "stream");
    p.k_device_free = intern0(&p, "device_free");
    p.k_filename = intern0(&p, "filename");
    p.k_name = intern0(&p, "name");
    p.k_line = intern0(&p, "line");
    p.k_device = intern0(&p, "device");
    p.k_address = intern0(&p, "address");
    p.k_total_size = intern0(&p, "total_size");
    p.k_allocated_size = intern0(&p, "allocated_size");
    p.k_segment_type = intern0(&p, "segment_type");
    p.k_is_expandable = intern0(&p, "is_expandable");
    p.k_requested_size = intern0(&p, "requested_size");
    p.k_state = intern0(&p, "state");
    static const char *const acts[10] = {"alloc", "free_requested", "free_completed",
                                         "segment_alloc", "segment_free", "segment_map",
                                         "segment_unmap", "oom", "snapshot", "free"};
    /* "free" (torch 2.0's free_requested): the same action */
    static const Action act_of[10] = {A_ALLOC, A_FREE_REQUESTED, A_FREE_COMPLETED,
                                      A_SEGMENT_ALLOC, A_SEGMENT_FREE, A_SEGMENT_MAP,
                                      A_SEGMENT_UNMAP, A_OOM, A_SNAPSHOT, A_FREE_REQUESTED};
    for (int i = 0; i < 10; i++) {
        p.actions[i] = intern0(&p, acts[i]);
        ((Str *)p.actions[i])->act = (guint8)(act_of[i] + 1);
    }
    ((Str *)p.k_action)->field = EF_ACTION;
    ((Str *)p.k_addr)->field = EF_ADDR;
    ((Str *)p.k_size)->field = EF_SIZE;
    ((Str *)p.k_stream)->field = EF_STREAM;
    ((Str *)p.k_frames)->field = EF_FRAMES;
    ((Str *)p.k_device_free)->field = EF_DEVICE_FREE;
    p.held = 0;

    /* The memo: about one index per 24 bytes of a snapshot, mapped (untouched until used:
     * memo_map) so that it seldom moves. */
    p.cap_memo = (gsize)MIN(p.in.total / 24 + 1024, (guint64)1 << 28);
    p.memo = memo_map(p.cap_memo);
    memsim_trace_intern(p.t, "snapshot"); /* string 0, before the stacks */
    gboolean ok = run(&p);
    /* (an entry that failed to apply comes before what the reading met after it) */
    ok = apply_drain(&p) && ok;
    apply_stop(&p);

    MemsimTrace *t = p.t;
    if (ok) {
        memsim_snap_odd_finish(&p.odd, t, name);
        if (codes) {
            g_ptr_array_set_size(p.codes, memsim_trace_header(t)->n_ranks);
            *codes = p.codes;
            p.codes = NULL;
        }
    } else {
        memsim_trace_free(t);
        t = NULL;
    }
    if (p.codes)
        g_ptr_array_unref(p.codes);

    while (p.n_stack)
        val_unref(&p, &p.stack[--p.n_stack]);
    for (guint i = 0; i < p.conts->len; i++)
        if (g_ptr_array_index(p.conts, i))
            cont_unref(&p, g_ptr_array_index(p.conts, i));
    val_unref(&p, &p.settings);
    g_free(p.stack);
    g_free(p.marks);
    munmap(p.memo, p.cap_memo * sizeof(guint32));
    g_free(p.recs);
    g_ptr_array_unref(p.conts);
    g_array_unref(p.free_conts);
    g_array_unref(p.scalars);
    g_hash_table_unref(p.strs);
    g_ptr_array_unref(p.str_by_id);
    g_ptr_array_unref(p.chunks);
    g_array_unref(p.frames);
    g_free(p.frame_ix.s);
    g_array_unref(p.stacks);
    g_array_unref(p.stack_frames);
    g_free(p.stack_ix.s);
    memsim_snap_odd_clear(&p.odd);
    g_array_unref(p.segs);
    g_ptr_array_unref(p.devs);
    map_clear(&p.pending);
    for (guint i = 0; i < p.n_spare; i++) {
        g_free(p.spare[i]->items);
        g_free(p.spare[i]);
    }
    *in = p.in;
    return t;
}

MemsimTrace *memsim_snapshot_read_bytes(const guint8 *data, gsize len, const char *name,
                                        GError **error)
{
    Input in = {.kind = IN_MEMORY, .buf = (guint8 *)data, .cap = len, .end = len, .eof = TRUE,
                .total = len};
    return read_all(&in, name ? name : "<snapshot>", NULL, error);
}

gboolean memsim_snapshot_sniff_compressed(const guint8 *d, gsize n)
{
    return (n >= 4 && d[0] == 0x28 && d[1] == 0xb5 && d[2] == 0x2f && d[3] == 0xfd) ||
           (n >= 2 && d[0] == 0x1f && d[1] == 0x8b);
}

static MemsimTrace *read_file(const char *path, const MemsimSnapshotReadOptions *opt,
                              GPtrArray **codes, GError **error)
{
    FILE *f = g_fopen(path, "rb");
    if (!f) {
        int e = errno;
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: cannot open: %s", path,
                    g_strerror(e));
        return NULL;
    }
    Input in = {.kind = IN_PLAIN, .f = f, .cap = 256 << 10};
    in.own = in.buf = g_malloc(in.cap);
    in.own_cap = in.cap;
    in.progress = opt ? opt->bytes_read : NULL;
    guint8 head[4];
    size_t got = fread(head, 1, sizeof head, f);
    rewind(f);
    if (got >= 4 && head[0] == 0x28 && head[1] == 0xb5 && head[2] == 0x2f && head[3] == 0xfd) {
        in.kind = IN_ZSTD;
        in.zs = ZSTD_createDStream();
        ZSTD_initDStream(in.zs);
    } else if (got >= 2 && head[0] == 0x1f && head[1] == 0x8b) {
        in.kind = IN_GZIP;
        in.gz = g_new0(z_stream, 1);
        if (inflateInit2(in.gz, 15 + 16) != Z_OK) {
            g_free(in.gz);
            fclose(f);
            g_free(in.own);
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: zlib: cannot start", path);
            return NULL;
        }
    } else {
        GStatBuf st;
        if (g_stat(path, &st) == 0)
            in.total = (guint64)st.st_size;
    }
    if (in.kind != IN_PLAIN) {
        in.zcap = 1 << 20;
        in.zin = g_malloc(in.zcap);
    }
    feeder_start(&in);
    MemsimTrace *t = read_all(&in, path, codes, error);
    if (t && in.kind != IN_PLAIN && !in.z_done) {
        /* the pickle ended (STOP) before the compressed stream did: check the rest */
        while (input_need(&in, in.end - in.pos + 1))
            in.pos = in.end;
    }
    feeder_stop(&in);
    if (t && in.err) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s", path, in.err);
        memsim_trace_free(t);
        t = NULL;
        if (codes) {
            g_ptr_array_unref(*codes);
            *codes = NULL;
        }
    }
    if (in.zs)
        ZSTD_freeDStream(in.zs);
    if (in.gz) {
        inflateEnd(in.gz);
        g_free(in.gz);
    }
    g_free(in.zin);
    g_free(in.own);
    g_free(in.err);
    fclose(f);
    return t;
}

MemsimTrace *memsim_snapshot_read(const char *path, const MemsimSnapshotReadOptions *opt,
                                  GError **error)
{
    return read_file(path, opt, NULL, error);
}

/* ---- the snapshot as a reader: each rank's events made chunk by chunk -------------------
 * A second thread makes the chunks (decodes and renumbers them, and checks them) a few ahead
 * of the replay that takes them: the replay's thread then only replays. */

#define SNAP_AHEAD 3

typedef struct {
    MemsimEvent *ev;
    gsize n;       /* 0: the end (err: why, when not the plain end) */
    guint32 rank;
    GError *err;
    gboolean full; /* made, not yet given back */
} SnapChunk;

typedef struct {
    MemsimTraceReader base;
    MemsimTrace *t;    /* the header's, no events */
    GPtrArray *codes;  /* RankCode*, by rank */
    guint32 rank;      /* (the making thread's from its start) */
    gsize pos;         /* events of the rank made so far */
    /* the chunks, made in turn into slots w = 0, 1, ... and taken in the same turn */
    SnapChunk slot[SNAP_AHEAD];
    guint take;        /* the slot the next call takes */
    int lent;          /* the slot the last call returned, -1 none */
    gboolean started, threaded, cancel;
    pthread_t thread;
    Hand hand;
} SnapReader;

/* The next chunk into `out`: its length (0 at the end, or with *error set). */
static gsize snap_make(SnapReader *r, guint32 *rank, MemsimEvent *out, GError **error)
{
    MemsimTraceReader *base = &r->base;
    while (r->rank < base->header.n_ranks) {
        RankCode *c = g_ptr_array_index(r->codes, r->rank);
        gsize n = c ? rank_code_next(c, out, MEMSIM_CHUNK_EVENTS) : 0;
        if (n) {
            if (!memsim_events_check_named(&base->header, base->name, r->rank, r->pos, out, n,
                                           error))
                return 0;
            *rank = r->rank;
            r->pos += n;
            return n;
        }
        /* the rank is done: what it held goes */
        if (c)
            g_ptr_array_index(r->codes, r->rank) = NULL, rank_code_free(c);
        r->rank++;
        r->pos = 0;
    }
    return 0;
}

static void *snap_ahead_main(void *data)
{
    SnapReader *r = data;
    for (guint w = 0;; w = (w + 1) % SNAP_AHEAD) {
        SnapChunk *s = &r->slot[w];
        if (!hand_wait(&r->hand, &s->full, FALSE, &r->cancel))
            return NULL;
        GError *err = NULL;
        gsize n = snap_make(r, &s->rank, s->ev, &err);
        s->n = n;
        s->err = err;
        hand_set(&r->hand, &s->full, TRUE);
        if (n == 0)
            return NULL;
    }
}

static gsize snap_reader_next(MemsimTraceReader *base, guint32 *rank, const MemsimEvent **events,
                              GError **error)
{
    SnapReader *r = (SnapReader *)base;
    if (!r->started) {
        r->started = TRUE;
        r->lent = -1;
        r->threaded = pthread_create(&r->thread, NULL, snap_ahead_main, r) == 0;
    }
    if (!r->threaded) {
        /* (no thread: made here, into the first slot) */
        gsize n = snap_make(r, rank, r->slot[0].ev, error);
        *events = r->slot[0].ev;
        return n;
    }
    if (r->lent >= 0) {
        hand_set(&r->hand, &r->slot[r->lent].full, FALSE);
        r->lent = -1;
    }
    SnapChunk *s = &r->slot[r->take];
    hand_wait(&r->hand, &s->full, TRUE, NULL);
    if (s->n == 0) {
        /* the end: the slot stays full, so the thread has ended */
        if (s->err)
            g_propagate_error(error, g_steal_pointer(&s->err));
        return 0;
    }
    *rank = s->rank;
    *events = s->ev;
    r->lent = (int)r->take;
    r->take = (r->take + 1) % SNAP_AHEAD;
    return s->n;
}

static gsize snap_reader_buffer_bytes(MemsimTraceReader *base)
{
    return SNAP_AHEAD * MEMSIM_CHUNK_EVENTS * sizeof(MemsimEvent);
}

static void snap_reader_clear(MemsimTraceReader *base)
{
    SnapReader *r = (SnapReader *)base;
    if (r->threaded) {
        hand_set(&r->hand, &r->cancel, TRUE);
        pthread_join(r->thread, NULL);
    }
    hand_clear(&r->hand);
    memsim_trace_free(r->t);
    if (r->codes)
        g_ptr_array_unref(r->codes);
    for (int k = 0; k < SNAP_AHEAD; k++) {
        g_free(r->slot[k].ev);
        g_clear_error(&r->slot[k].err);
    }
}

static const MemsimReaderOps snap_reader_ops = {
    .next = snap_reader_next,
    .clear = snap_reader_clear,
    .buffer_bytes = snap_reader_buffer_bytes,
};

MemsimTraceReader *memsim_snapshot_reader(const char *path, const MemsimSnapshotReadOptions *opt,
                                          GError **error)
{
    GPtrArray *codes = NULL;
    MemsimTrace *t = read_file(path, opt, &codes, error);
    if (!t)
        return NULL;
    SnapReader *r = (SnapReader *)memsim_trace_reader_alloc(
        sizeof(SnapReader), &snap_reader_ops, MEMSIM_FORMAT_SNAPSHOT, NULL, path);
    r->t = t;
    r->codes = codes;
    for (int k = 0; k < SNAP_AHEAD; k++)
        r->slot[k].ev = g_new(MemsimEvent, MEMSIM_CHUNK_EVENTS);
    hand_init(&r->hand);
    memsim_trace_header_copy(&r->base.header, memsim_trace_header(t));
    return &r->base;
}

MemsimTrace *memsim_snapshot_reader_take(MemsimTraceReader *base)
{
    if (base->ops != &snap_reader_ops)
        return NULL;
    SnapReader *r = (SnapReader *)base;
    g_assert(!r->started);
    MemsimTrace *t = r->t;
    for (guint32 k = 0; k < r->codes->len; k++) {
        RankCode *c = g_ptr_array_index(r->codes, k);
        g_ptr_array_index(r->codes, k) = NULL;
        if (c)
            rank_code_append(t, k, c);
    }
    r->t = memsim_trace_new(NULL);
    return t;
}

gboolean memsim_snapshot_sniff_path(const char *path)
{
    FILE *f = g_fopen(path, "rb");
    if (!f)
        return FALSE;
    guint8 head[4];
    size_t got = fread(head, 1, sizeof head, f);
    rewind(f);
    gboolean yes = FALSE;
    Input in = {.f = f, .cap = 64 * 1024, .zcap = 64 * 1024};
    if (got >= 4 && head[0] == 0x28 && head[1] == 0xb5 && head[2] == 0x2f && head[3] == 0xfd) {
        in.kind = IN_ZSTD;
        in.zs = ZSTD_createDStream();
        ZSTD_initDStream(in.zs);
    } else if (got >= 2 && head[0] == 0x1f && head[1] == 0x8b) {
        in.kind = IN_GZIP;
        in.gz = g_new0(z_stream, 1);
        if (inflateInit2(in.gz, 15 + 16) != Z_OK) {
            g_free(in.gz);
            in.gz = NULL;
            in.kind = IN_PLAIN;
        }
    } else {
        in.kind = IN_PLAIN;
    }
    in.own = in.buf = g_malloc(in.cap);
    in.own_cap = in.cap;
    in.zin = g_malloc(in.zcap);
    if (input_need(&in, 2))
        yes = memsim_snapshot_sniff(in.buf + in.pos, 2);
    if (in.zs)
        ZSTD_freeDStream(in.zs);
    if (in.gz) {
        inflateEnd(in.gz);
        g_free(in.gz);
    }
    g_free(in.own);
    g_free(in.zin);
    g_free(in.err);
    fclose(f);
    return yes;
}

MemsimTrace *memsim_snapshot_load(const char *path, GError **error)
{
    return memsim_snapshot_read(path, NULL, error);
}

gboolean memsim_snapshot_sniff(const guint8 *data, gsize len)
{
    /* PROTO opcode 0x80 followed by a protocol number 2..5. */
    return len >= 2 && data[0] == 0x80 && data[1] >= 2 && data[1] <= 5;
}
