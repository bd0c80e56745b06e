/* memsim — a restricted reader for Python pickles (PyTorch memory snapshots).
 *
 * Implements the subset of the pickle virtual machine that plain data needs, following
 * CPython's Lib/pickle.py (the _Unpickler class), Modules/_pickle.c (stack fences at marks,
 * the memo count used by MEMOIZE) and the opcode documentation in Lib/pickletools.py.
 * Nothing that names or calls Python code is accepted (GLOBAL, STACK_GLOBAL, REDUCE, BUILD,
 * INST, OBJ, NEWOBJ*, PERSID, EXT*, out-of-band buffers), nor sets, nor Python 2's quoted
 * STRING; such an opcode stops the load with an error naming it.
 *
 * One pass over the bytes builds the values; a second pass (an iterative depth-first walk
 * with three colours) refuses cycles, nesting deeper than PICKLE_MAX_DEPTH and documents
 * whose shared references would expand to an unreasonable tree (a "billion laughs"), and
 * merges repeated dict keys. Consumers can therefore recurse over the result without
 * guards. Cost: O(input) time and memory; every value and string lives in one arena of
 * large blocks, freed at once; so do the item arrays of lists and dicts, except those that
 * grow past their first fill: they are reallocated on the heap and freed with the document.
 *
 * Trust model: the input is hostile. Every length is checked against the bytes that remain
 * before anything is allocated for it; a memo index may not exceed the input size (a real
 * pickler numbers its memo entries densely from 0). Memory is bounded by the input size
 * with a constant a real snapshot stays far below: None, True, False, small ints and the
 * empty tuple are one shared value each per document, not an object per opcode; the value
 * stack holds at most PICKLE_MAX_STACK values (picklers write lists and dicts in runs of
 * 1000); and everything the load holds (values, item arrays, memo, stack) is counted and
 * refused beyond PICKLE_MEM_PER_BYTE bytes per input byte plus PICKLE_MEM_BASE.
 */
#include "formats/pickle.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

/* Deeper nesting than this is refused, so consumers may recurse. */
#define PICKLE_MAX_DEPTH 10000
/* A tuple used as a dict key may hold at most this many values (nested ones counted): it
 * bounds the cost of comparing keys. */
#define PICKLE_MAX_KEY_WEIGHT 256
/* Dicts larger than this merge repeated keys with a hash table; smaller ones compare pairs. */
#define PICKLE_DICT_HASH_MIN 32
/* The expanded tree (shared values counted once per reference) may hold at most
 * PICKLE_EXPAND_PER_BYTE values per input byte plus PICKLE_EXPAND_BASE. Real snapshots use
 * fewer than 4 per byte. */
#define PICKLE_EXPAND_PER_BYTE 64
#define PICKLE_EXPAND_BASE 1000000
/* Values on the stack at once. Python's pickler appends list items and dict pairs in runs
 * of 1000 (pickle._Pickler._batch_appends); only a tuple's items all stand on the stack
 * together, and snapshots hold no tuple of a million values. */
#define PICKLE_MAX_STACK (1u << 20)
/* Bytes a load may hold: PICKLE_MEM_PER_BYTE per input byte plus PICKLE_MEM_BASE. The 30
 * real snapshots of ../shared/data/torch-snapshots (0.5 KB to 3.3 MB) hold at most 13 MB,
 * 3.3 to 7 bytes per input byte above 1 MB (arena blocks counted whole); 16 per byte keeps
 * a 20 MB hostile file under 400 MB. */
#define PICKLE_MEM_PER_BYTE 16
#define PICKLE_MEM_BASE (32u << 20)
/* Ints in [PICKLE_SMALL_INT_MIN, PICKLE_SMALL_INT_MAX) are shared values. */
#define PICKLE_SMALL_INT_MIN (-256)
#define PICKLE_SMALL_INT_MAX 65536

/* ---- arena ---------------------------------------------------------------------------- */

typedef struct ArenaBlock {
    struct ArenaBlock *next;
    gsize used;
    gsize cap;
} ArenaBlock;

/* Keeps the data of each block aligned for any value stored in it (pointers, gsize,
 * guint64, double). */
#define ARENA_ALIGN 8
#define ARENA_HEADER ((sizeof(ArenaBlock) + ARENA_ALIGN - 1) & ~(gsize)(ARENA_ALIGN - 1))
#define ARENA_FIRST_BLOCK (64 * 1024)
#define ARENA_MAX_BLOCK (4 * 1024 * 1024)

typedef struct {
    ArenaBlock *head; /* the block being filled */
    gsize next_cap;   /* size of the next ordinary block (grows to ARENA_MAX_BLOCK) */
    /* Bytes the load holds: the arena's blocks, plus what the parser adds (arena_hold) for
     * its heap arrays; `over` is set once they pass `limit`, and then *trip is zeroed: it is
     * the parser's end of input, so the test the opcode loop makes anyway stops it. */
    guint64 held, limit;
    gboolean over;
    gsize *trip;
} Arena;

static void arena_hold(Arena *a, guint64 bytes)
{
    a->held += bytes;
    if (a->held > a->limit) {
        a->over = TRUE;
        if (a->trip)
            *a->trip = 0;
    }
}

static void *arena_alloc(Arena *a, gsize size)
{
    size = (size + ARENA_ALIGN - 1) & ~(gsize)(ARENA_ALIGN - 1);
    ArenaBlock *b = a->head;
    if (b && b->cap - b->used >= size) {
        void *p = (char *)b + ARENA_HEADER + b->used;
        b->used += size;
        return p;
    }
    if (a->next_cap == 0)
        a->next_cap = ARENA_FIRST_BLOCK;
    if (size > a->next_cap / 4 && b) {
        /* A large request gets a block of its own, linked behind the current one, so the
         * free space left in the current block is not wasted. */
        ArenaBlock *big = g_malloc(ARENA_HEADER + size);
        arena_hold(a, ARENA_HEADER + size);
        big->cap = size;
        big->used = size;
        big->next = b->next;
        b->next = big;
        return (char *)big + ARENA_HEADER;
    }
    gsize cap = MAX(size, a->next_cap);
    if (a->next_cap < ARENA_MAX_BLOCK)
        a->next_cap *= 2;
    ArenaBlock *nb = g_malloc(ARENA_HEADER + cap);
    arena_hold(a, ARENA_HEADER + cap);
    nb->cap = cap;
    nb->used = size;
    nb->next = b;
    a->head = nb;
    return (char *)nb + ARENA_HEADER;
}

static void arena_clear(Arena *a)
{
    ArenaBlock *b = a->head;
    while (b) {
        ArenaBlock *next = b->next;
        g_free(b);
        b = next;
    }
    a->head = NULL;
    a->held = 0;
}

/* ---- values --------------------------------------------------------------------------- */

/* Lists, tuples and dicts carry bookkeeping after the public part. The public part comes
 * first so that a MemsimPyValue * of a container can be cast to Container *. */
typedef struct {
    MemsimPyValue v;
    gsize cap;       /* allocated item slots (lists and dicts) */
    guint64 weight;  /* tuples at creation: values held (for dict keys); final walk: size of
                        the expanded tree below and including this container */
    guint8 colour;   /* final walk: WHITE, GREY (on the path), BLACK (done) */
    guint8 hashable; /* tuples: every item is hashable */
    guint8 heap;     /* lists and dicts: the item arrays are on the heap (Doc.heap lists it),
                        else in the arena */
} Container;

enum { WHITE = 0, GREY, BLACK };

static gboolean is_container(const MemsimPyValue *v)
{
    return v->type == MEMSIM_PY_LIST || v->type == MEMSIM_PY_TUPLE || v->type == MEMSIM_PY_DICT;
}

struct MemsimPyDoc {
    Arena arena;
    MemsimPyValue *root;
    GPtrArray *heap; /* Container *: lists and dicts whose item arrays are on the heap */
};

/* ---- opcodes -------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    gboolean allowed;
} OpInfo;

/* Every opcode of pickletools.opcodes (protocols 0 to 5); the others are unknown. */
static const OpInfo OPS[256] = {
    ['('] = {"MARK", TRUE},
    ['.'] = {"STOP", TRUE},
    ['0'] = {"POP", TRUE},
    ['1'] = {"POP_MARK", TRUE},
    ['2'] = {"DUP", TRUE},
    ['F'] = {"FLOAT", TRUE},
    ['I'] = {"INT", TRUE},
    ['J'] = {"BININT", TRUE},
    ['K'] = {"BININT1", TRUE},
    ['L'] = {"LONG", TRUE},
    ['M'] = {"BININT2", TRUE},
    ['N'] = {"NONE", TRUE},
    ['P'] = {"PERSID", FALSE},
    ['Q'] = {"BINPERSID", FALSE},
    ['R'] = {"REDUCE", FALSE},
    /* Python 2 str in its quoted repr form: it needs Python's escape decoder and never
     * appears in a Python 3 snapshot. */
    ['S'] = {"STRING", FALSE},
    ['T'] = {"BINSTRING", TRUE},
    ['U'] = {"SHORT_BINSTRING", TRUE},
    ['V'] = {"UNICODE", TRUE},
    ['X'] = {"BINUNICODE", TRUE},
    ['a'] = {"APPEND", TRUE},
    ['b'] = {"BUILD", FALSE},
    ['c'] = {"GLOBAL", FALSE},
    ['d'] = {"DICT", TRUE},
    ['}'] = {"EMPTY_DICT", TRUE},
    ['e'] = {"APPENDS", TRUE},
    ['g'] = {"GET", TRUE},
    ['h'] = {"BINGET", TRUE},
    ['i'] = {"INST", FALSE},
    ['j'] = {"LONG_BINGET", TRUE},
    ['l'] = {"LIST", TRUE},
    [']'] = {"EMPTY_LIST", TRUE},
    ['o'] = {"OBJ", FALSE},
    ['p'] = {"PUT", TRUE},
    ['q'] = {"BINPUT", TRUE},
    ['r'] = {"LONG_BINPUT", TRUE},
    ['s'] = {"SETITEM", TRUE},
    ['t'] = {"TUPLE", TRUE},
    [')'] = {"EMPTY_TUPLE", TRUE},
    ['u'] = {"SETITEMS", TRUE},
    ['B'] = {"BINBYTES", TRUE},
    ['C'] = {"SHORT_BINBYTES", TRUE},
    ['G'] = {"BINFLOAT", TRUE},
    [0x80] = {"PROTO", TRUE},
    [0x81] = {"NEWOBJ", FALSE},
    [0x82] = {"EXT1", FALSE},
    [0x83] = {"EXT2", FALSE},
    [0x84] = {"EXT4", FALSE},
    [0x85] = {"TUPLE1", TRUE},
    [0x86] = {"TUPLE2", TRUE},
    [0x87] = {"TUPLE3", TRUE},
    [0x88] = {"NEWTRUE", TRUE},
    [0x89] = {"NEWFALSE", TRUE},
    [0x8a] = {"LONG1", TRUE},
    [0x8b] = {"LONG4", TRUE},
    [0x8c] = {"SHORT_BINUNICODE", TRUE},
    [0x8d] = {"BINUNICODE8", TRUE},
    [0x8e] = {"BINBYTES8", TRUE},
    [0x8f] = {"EMPTY_SET", FALSE},
    [0x90] = {"ADDITEMS", FALSE},
    [0x91] = {"FROZENSET", FALSE},
    [0x92] = {"NEWOBJ_EX", FALSE},
    [0x93] = {"STACK_GLOBAL", FALSE},
    [0x94] = {"MEMOIZE", TRUE},
    [0x95] = {"FRAME", TRUE},
    [0x96] = {"BYTEARRAY8", TRUE},
    [0x97] = {"NEXT_BUFFER", FALSE},
    [0x98] = {"READONLY_BUFFER", FALSE},
};

const char *memsim_pickle_op_name(guint8 op)
{
    return OPS[op].name ? OPS[op].name : "unknown";
}

gboolean memsim_pickle_op_allowed(guint8 op)
{
    return OPS[op].allowed;
}

#define op_name memsim_pickle_op_name

/* ---- the parser ----------------------------------------------------------------------- */

typedef struct {
    const guint8 *data;
    gsize len;
    gsize end; /* len, or 0 once a limit is passed (Arena.trip) */
    gsize pos;
    const char *name;
    Arena *arena;
    GError **error;

    MemsimPyValue **stack;
    gsize n_stack, cap_stack;
    gsize *marks; /* stack heights at each MARK; the top one is the fence */
    gsize n_marks, cap_marks;
    MemsimPyValue **memo;
    gsize cap_memo;
    gsize n_memo; /* entries set: MEMOIZE stores at this index, as _pickle.c does */
    guint64 work, work_limit; /* dict key comparisons (see dict_merge_repeats) */

    MemsimPyDoc *doc;
    /* The shared values, made when first needed. */
    MemsimPyValue *none, *bools[2], *empty_tuple;
    MemsimPyValue **small_ints; /* PICKLE_SMALL_INT_MAX - PICKLE_SMALL_INT_MIN slots */
} Parser;

static gboolean G_GNUC_PRINTF(3, 4) fail(Parser *p, gsize offset, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *what = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(p->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: byte %" G_GSIZE_FORMAT ": %s",
                p->name, offset, what);
    g_free(what);
    return FALSE;
}

char *memsim_pickle_quote(const guint8 *s, gsize n)
{
    GString *q = g_string_new("\"");
    for (gsize i = 0; i < MIN(n, 40); i++) {
        if (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '"' && s[i] != '\\')
            g_string_append_c(q, (char)s[i]);
        else
            g_string_append_printf(q, "\\x%02x", s[i]);
    }
    g_string_append(q, n > 40 ? "\"..." : "\"");
    return g_string_free(q, FALSE);
}

static gsize remaining(const Parser *p)
{
    return p->len - p->pos;
}

/* Ensures `n` argument bytes follow the opcode at `off`. */
static gboolean need(Parser *p, gsize off, guint8 op, guint64 n)
{
    if (n > remaining(p))
        return fail(p, off,
                    "truncated: opcode 0x%02x (%s) needs %" G_GUINT64_FORMAT
                    " bytes of argument, %" G_GSIZE_FORMAT " left",
                    op, op_name(op), n, remaining(p));
    return TRUE;
}

#define read_le memsim_pickle_read_le

/* The text argument of a protocol 0 opcode: the bytes up to the next newline, which is
 * consumed. */
static gboolean read_line(Parser *p, gsize off, guint8 op, const guint8 **line, gsize *n)
{
    const guint8 *start = p->data + p->pos;
    const guint8 *nl = memchr(start, '\n', remaining(p));
    if (!nl)
        return fail(p, off, "truncated: opcode 0x%02x (%s) has no end of line", op, op_name(op));
    *line = start;
    *n = (gsize)(nl - start);
    p->pos += *n + 1;
    return TRUE;
}

static MemsimPyValue *new_value(Parser *p, MemsimPyType type, guint64 off)
{
    MemsimPyValue *v = arena_alloc(p->arena, sizeof *v);
    memset(v, 0, sizeof *v);
    v->type = type;
    v->offset = off;
    return v;
}

static Container *new_container(Parser *p, MemsimPyType type, guint64 off)
{
    Container *c = arena_alloc(p->arena, sizeof *c);
    memset(c, 0, sizeof *c);
    c->v.type = type;
    c->v.offset = off;
    c->weight = 1;
    c->hashable = TRUE;
    return c;
}

/* A shared value (None, True, False), made on first use. */
static MemsimPyValue *shared(Parser *p, MemsimPyValue **slot, MemsimPyType type)
{
    if (!*slot)
        *slot = new_value(p, type, MEMSIM_PY_NO_OFFSET);
    return *slot;
}

static MemsimPyValue *new_bool(Parser *p, gboolean b)
{
    MemsimPyValue *v = shared(p, &p->bools[b ? 1 : 0], MEMSIM_PY_BOOL);
    v->v.b = b ? TRUE : FALSE;
    return v;
}

/* " (made at byte N)", or nothing for a shared value; in `buf`. */
static const char *made_at(const MemsimPyValue *v, char buf[48])
{
    if (v->offset == MEMSIM_PY_NO_OFFSET)
        return "";
    g_snprintf(buf, 48, " (made at byte %" G_GUINT64_FORMAT ")", v->offset);
    return buf;
}

/* A str or bytes value holding a copy of `n` bytes (NUL-terminated), in one allocation. */
static MemsimPyValue *new_string(Parser *p, MemsimPyType type, gsize off, const guint8 *s,
                                 gsize n)
{
    MemsimPyValue *v = arena_alloc(p->arena, sizeof *v + n + 1);
    memset(v, 0, sizeof *v);
    v->type = type;
    v->offset = off;
    char *d = (char *)(v + 1);
    if (n)
        memcpy(d, s, n);
    d[n] = '\0';
    v->v.str.data = d;
    v->v.str.len = n;
    return v;
}

/* The stack is bounded: growing past PICKLE_MAX_STACK stops the load after this opcode. */
static void push(Parser *p, MemsimPyValue *v)
{
    if (p->n_stack == p->cap_stack) {
        gsize cap = p->cap_stack ? 2 * p->cap_stack : 256;
        arena_hold(p->arena, (cap - p->cap_stack) * sizeof *p->stack);
        if (cap > PICKLE_MAX_STACK)
            p->end = 0; /* n_stack is about to pass PICKLE_MAX_STACK */
        p->cap_stack = cap;
        p->stack = g_renew(MemsimPyValue *, p->stack, p->cap_stack);
    }
    p->stack[p->n_stack++] = v;
}

static gsize fence(const Parser *p)
{
    return p->n_marks ? p->marks[p->n_marks - 1] : 0;
}

/* Checks that `n` values lie above the fence (the last MARK), as _pickle.c does. */
static gboolean need_stack(Parser *p, gsize off, guint8 op, gsize n)
{
    if (p->n_stack - fence(p) < n)
        return fail(p, off, "stack underflow: opcode 0x%02x (%s) needs %" G_GSIZE_FORMAT
                    " value%s above the last mark, there %s %" G_GSIZE_FORMAT,
                    op, op_name(op), n, n == 1 ? "" : "s",
                    p->n_stack - fence(p) == 1 ? "is" : "are", p->n_stack - fence(p));
    return TRUE;
}

static gboolean pop_mark(Parser *p, gsize off, guint8 op, gsize *mark)
{
    if (p->n_marks == 0)
        return fail(p, off, "opcode 0x%02x (%s) needs a MARK and there is none", op,
                    op_name(op));
    *mark = p->marks[--p->n_marks];
    return TRUE;
}

/* Hashable as a dict key, in Python's sense; tuple keys are also bounded in size. */
static gboolean check_key(Parser *p, gsize off, guint8 op, const MemsimPyValue *k)
{
    if (k->type == MEMSIM_PY_LIST || k->type == MEMSIM_PY_DICT)
        return fail(p, off, "opcode 0x%02x (%s): a %s (made at byte %" G_GUINT64_FORMAT
                    ") cannot be a dict key (not hashable)",
                    op, op_name(op), memsim_py_type_name(k->type), k->offset);
    if (k->type == MEMSIM_PY_TUPLE) {
        const Container *c = (const Container *)k;
        if (!c->hashable)
            return fail(p, off, "opcode 0x%02x (%s): a tuple holding a list or dict (made at "
                        "byte %" G_GUINT64_FORMAT ") cannot be a dict key (not hashable)",
                        op, op_name(op), k->offset);
        if (c->weight > PICKLE_MAX_KEY_WEIGHT)
            return fail(p, off, "opcode 0x%02x (%s): a tuple of more than %d values (made at "
                        "byte %" G_GUINT64_FORMAT ") as a dict key",
                        op, op_name(op), PICKLE_MAX_KEY_WEIGHT, k->offset);
    }
    return TRUE;
}

/* Item arrays of lists and dicts: the first fill (one APPENDS or SETITEMS run, usually the
 * only one) gets an exact array in the arena; growth beyond it moves the array to the heap,
 * where doubling by realloc leaves nothing behind, and the document frees it. Returns the
 * new capacity, or 0 when `extra` more items fit already. *old_in_arena tells whether the
 * current array (n items) is to be copied out of the arena. */
static gsize grow(Parser *p, Container *c, gsize n, gsize extra, gsize arrays,
                  gboolean *old_in_arena)
{
    if (n + extra <= c->cap)
        return 0;
    *old_in_arena = !c->heap;
    if (c->cap == 0)
        return c->cap = extra; /* into the arena */
    gsize cap = MAX(2 * c->cap, n + extra);
    if (!c->heap) {
        c->heap = TRUE;
        g_ptr_array_add(p->doc->heap, c);
        /* the pointer in Doc.heap and malloc's own overhead, roughly */
        arena_hold(p->arena, sizeof(gpointer) + arrays * (16 + cap * sizeof(MemsimPyValue *)));
    } else {
        arena_hold(p->arena, (cap - c->cap) * arrays * sizeof(MemsimPyValue *));
    }
    c->cap = cap;
    return cap;
}

/* An item array of `cap` slots holding the `n` of `old`: in the arena for a first fill,
 * else on the heap. */
static MemsimPyValue **regrow(Parser *p, const Container *c, MemsimPyValue **old, gsize n,
                              gsize cap, gboolean old_in_arena)
{
    if (!c->heap)
        return arena_alloc(p->arena, cap * sizeof *old);
    if (!old_in_arena)
        return g_renew(MemsimPyValue *, old, cap);
    MemsimPyValue **items = g_new(MemsimPyValue *, cap);
    if (n)
        memcpy(items, old, n * sizeof *items);
    return items;
}

static void list_reserve(Parser *p, Container *c, gsize extra)
{
    gsize n = c->v.v.seq.n;
    gboolean old_in_arena;
    gsize cap = grow(p, c, n, extra, 1, &old_in_arena);
    if (cap)
        c->v.v.seq.items = regrow(p, c, c->v.v.seq.items, n, cap, old_in_arena);
}

static void dict_reserve(Parser *p, Container *c, gsize extra)
{
    gsize n = c->v.v.dict.n;
    gboolean old_in_arena;
    gsize cap = grow(p, c, n, extra, 2, &old_in_arena);
    if (cap) {
        c->v.v.dict.keys = regrow(p, c, c->v.v.dict.keys, n, cap, old_in_arena);
        c->v.v.dict.values = regrow(p, c, c->v.v.dict.values, n, cap, old_in_arena);
    }
}

/* Adds the pairs stack[from..n_stack) to `dict` (repeated keys are merged at the end). */
static gboolean dict_add_pairs(Parser *p, gsize off, guint8 op, Container *dict, gsize from)
{
    gsize n = p->n_stack - from;
    if (n % 2)
        return fail(p, off, "opcode 0x%02x (%s) with an odd number of items (%" G_GSIZE_FORMAT
                    "): keys and values must pair up",
                    op, op_name(op), n);
    for (gsize i = from; i < p->n_stack; i += 2)
        if (!check_key(p, off, op, p->stack[i]))
            return FALSE;
    dict_reserve(p, dict, n / 2);
    MemsimPyValue **keys = dict->v.v.dict.keys, **values = dict->v.v.dict.values;
    gsize d = dict->v.v.dict.n;
    for (gsize i = from; i < p->n_stack; i += 2, d++) {
        keys[d] = p->stack[i];
        values[d] = p->stack[i + 1];
    }
    dict->v.v.dict.n = d;
    p->n_stack = from;
    return TRUE;
}

/* Replaces stack[from..n_stack) with a tuple of those values (the shared empty tuple when
 * there are none). */
static void make_tuple(Parser *p, gsize off, gsize from)
{
    gsize n = p->n_stack - from;
    if (n == 0) {
        if (!p->empty_tuple)
            p->empty_tuple = &new_container(p, MEMSIM_PY_TUPLE, MEMSIM_PY_NO_OFFSET)->v;
        push(p, p->empty_tuple);
        return;
    }
    Container *t = new_container(p, MEMSIM_PY_TUPLE, off);
    t->v.v.seq.items = arena_alloc(p->arena, n * sizeof(MemsimPyValue *));
    memcpy(t->v.v.seq.items, p->stack + from, n * sizeof(MemsimPyValue *));
    t->v.v.seq.n = n;
    t->cap = n;
    for (gsize i = 0; i < n; i++) {
        const MemsimPyValue *it = t->v.v.seq.items[i];
        if (it->type == MEMSIM_PY_LIST || it->type == MEMSIM_PY_DICT) {
            t->hashable = FALSE;
        } else if (it->type == MEMSIM_PY_TUPLE) {
            const Container *c = (const Container *)it;
            t->hashable = t->hashable && c->hashable;
            /* Saturates well above PICKLE_MAX_KEY_WEIGHT; only that comparison matters. */
            t->weight = MIN(t->weight + c->weight, (guint64)1 << 40);
        } else {
            t->weight++;
        }
    }
    p->n_stack = from;
    push(p, &t->v);
}

static void make_list(Parser *p, gsize off, gsize from)
{
    gsize n = p->n_stack - from;
    Container *l = new_container(p, MEMSIM_PY_LIST, off);
    list_reserve(p, l, n);
    if (n)
        memcpy(l->v.v.seq.items, p->stack + from, n * sizeof(MemsimPyValue *));
    l->v.v.seq.n = n;
    p->n_stack = from;
    push(p, &l->v);
}

/* Appends stack[from..n_stack) to the list at stack[from - 1]. */
static gboolean list_append_from(Parser *p, gsize off, guint8 op, gsize from)
{
    MemsimPyValue *target = p->stack[from - 1];
    char buf[48];
    if (target->type != MEMSIM_PY_LIST)
        return fail(p, off, "opcode 0x%02x (%s) on a %s%s, not a list", op, op_name(op),
                    memsim_py_type_name(target->type), made_at(target, buf));
    Container *l = (Container *)target;
    gsize n = p->n_stack - from;
    list_reserve(p, l, n);
    if (n)
        memcpy(l->v.v.seq.items + l->v.v.seq.n, p->stack + from, n * sizeof(MemsimPyValue *));
    l->v.v.seq.n += n;
    p->n_stack = from;
    return TRUE;
}

static gboolean dict_target(Parser *p, gsize off, guint8 op, gsize at, Container **dict)
{
    MemsimPyValue *target = p->stack[at];
    char buf[48];
    if (target->type != MEMSIM_PY_DICT)
        return fail(p, off, "opcode 0x%02x (%s) on a %s%s, not a dict", op, op_name(op),
                    memsim_py_type_name(target->type), made_at(target, buf));
    *dict = (Container *)target;
    return TRUE;
}

gboolean memsim_pickle_parse_decimal(const guint8 *s, gsize n, gint64 *val, gboolean *big)
{
    while (n && g_ascii_isspace(s[n - 1]))
        n--;
    while (n && g_ascii_isspace(*s))
        s++, n--;
    gboolean neg = FALSE;
    if (n && (*s == '-' || *s == '+')) {
        neg = *s == '-';
        s++, n--;
    }
    if (n == 0)
        return FALSE;
    /* Accumulates the magnitude; 2^63 is representable as a magnitude for INT64_MIN. */
    guint64 mag = 0;
    *big = FALSE;
    for (gsize i = 0; i < n; i++) {
        if (!g_ascii_isdigit(s[i]))
            return FALSE;
        guint d = (guint)(s[i] - '0');
        if (!*big && mag > (G_MAXUINT64 - d) / 10)
            *big = TRUE;
        if (!*big)
            mag = mag * 10 + d;
    }
    if (!*big) {
        if (neg && mag <= (guint64)G_MAXINT64 + 1)
            *val = mag == (guint64)G_MAXINT64 + 1 ? G_MININT64 : -(gint64)mag;
        else if (!neg && mag <= (guint64)G_MAXINT64)
            *val = (gint64)mag;
        else
            *big = TRUE;
    }
    return TRUE;
}

/* Small ints are shared values, made on first use. */
static MemsimPyValue *new_int(Parser *p, gsize off, gint64 i, gboolean big)
{
    if (!big && i >= PICKLE_SMALL_INT_MIN && i < PICKLE_SMALL_INT_MAX) {
        if (!p->small_ints) {
            p->small_ints = g_new0(MemsimPyValue *, PICKLE_SMALL_INT_MAX - PICKLE_SMALL_INT_MIN);
            arena_hold(p->arena,
                       (PICKLE_SMALL_INT_MAX - PICKLE_SMALL_INT_MIN) * sizeof(gpointer));
        }
        MemsimPyValue **slot = &p->small_ints[i - PICKLE_SMALL_INT_MIN];
        if (!*slot) {
            *slot = new_value(p, MEMSIM_PY_INT, MEMSIM_PY_NO_OFFSET);
            (*slot)->v.i = i;
        }
        return *slot;
    }
    MemsimPyValue *v = new_value(p, big ? MEMSIM_PY_BIGINT : MEMSIM_PY_INT, off);
    if (!big)
        v->v.i = i;
    return v;
}

/* LONG1 / LONG4 */
static MemsimPyValue *new_long_bytes(Parser *p, gsize off, const guint8 *s, gsize n)
{
    gint64 i;
    gboolean fits = memsim_pickle_long(s, n, &i);
    return new_int(p, off, i, !fits);
}

gboolean memsim_pickle_raw_unicode(const guint8 *s, gsize n, char *buf, gsize *len, char *why,
                                   gsize why_size)
{
    gsize o = 0;
    gsize i = 0;
    while (i < n) {
        if (s[i] != '\\') {
            o += (gsize)g_unichar_to_utf8(s[i], buf + o);
            i++;
            continue;
        }
        gsize bs = i;
        while (i < n && s[i] == '\\')
            buf[o++] = (char)s[i++];
        if (((i - bs) & 1) == 0 || i >= n || (s[i] != 'u' && s[i] != 'U'))
            continue;
        o--; /* the last backslash starts an escape */
        int count = s[i] == 'u' ? 4 : 8;
        i++;
        guint32 ch = 0;
        for (int k = 0; k < count; k++, i++) {
            if (i >= n || !g_ascii_isxdigit(s[i])) {
                g_snprintf(why, why_size, "truncated \\%c escape", count == 4 ? 'u' : 'U');
                return FALSE;
            }
            ch = (ch << 4) | (guint32)g_ascii_xdigit_value(s[i]);
        }
        if (ch > 0x10ffff) {
            g_snprintf(why, why_size, "\\U escape out of range (0x%x)", ch);
            return FALSE;
        }
        o += (gsize)g_unichar_to_utf8(ch, buf + o);
    }
    buf[o] = '\0';
    *len = o;
    return TRUE;
}

static gboolean decode_raw_unicode_escape(Parser *p, gsize off, const guint8 *s, gsize n,
                                          MemsimPyValue **out)
{
    char *buf = arena_alloc(p->arena, 2 * n + 1);
    gsize o;
    char why[64];
    if (!memsim_pickle_raw_unicode(s, n, buf, &o, why, sizeof why))
        return fail(p, off, "opcode 0x56 (UNICODE): %s", why);
    MemsimPyValue *v = new_value(p, MEMSIM_PY_STR, off);
    v->v.str.data = buf;
    v->v.str.len = o;
    *out = v;
    return TRUE;
}

static gboolean memo_put(Parser *p, gsize off, guint8 op, guint64 idx)
{
    if (!need_stack(p, off, op, 1))
        return FALSE;
    if (idx > p->len)
        return fail(p, off, "opcode 0x%02x (%s): memo index %" G_GUINT64_FORMAT
                    " is larger than a file of %" G_GSIZE_FORMAT " bytes can use",
                    op, op_name(op), idx, p->len);
    if (idx >= p->cap_memo) {
        gsize cap = MAX(MAX(2 * p->cap_memo, (gsize)idx + 1), 256);
        arena_hold(p->arena, (cap - p->cap_memo) * sizeof *p->memo);
        p->memo = g_renew(MemsimPyValue *, p->memo, cap);
        memset(p->memo + p->cap_memo, 0, (cap - p->cap_memo) * sizeof *p->memo);
        p->cap_memo = cap;
    }
    if (!p->memo[idx])
        p->n_memo++;
    p->memo[idx] = p->stack[p->n_stack - 1];
    return TRUE;
}

static gboolean memo_get(Parser *p, gsize off, guint8 op, guint64 idx)
{
    if (idx >= p->cap_memo || !p->memo[idx])
        return fail(p, off, "opcode 0x%02x (%s): memo index %" G_GUINT64_FORMAT
                    " was never stored",
                    op, op_name(op), idx);
    push(p, p->memo[idx]);
    return TRUE;
}

/* The decimal argument of PUT / GET. */
static gboolean read_memo_index(Parser *p, gsize off, guint8 op, guint64 *idx)
{
    const guint8 *line;
    gsize n;
    if (!read_line(p, off, op, &line, &n))
        return FALSE;
    gint64 v;
    gboolean big;
    if (!memsim_pickle_parse_decimal(line, n, &v, &big) || big || v < 0) {
        char *q = memsim_pickle_quote(line, n);
        fail(p, off, "opcode 0x%02x (%s): bad memo index %s", op, op_name(op), q);
        g_free(q);
        return FALSE;
    }
    *idx = (guint64)v;
    return TRUE;
}

/* Runs the opcodes up to STOP. On success the single value left is the root. */
static MemsimPyValue *run(Parser *p)
{
    gsize prev = 0; /* the offset of the opcode just run */
    for (;;) {
        if (G_UNLIKELY(p->pos >= p->end)) {
            if (p->n_stack > PICKLE_MAX_STACK)
                fail(p, prev, "more than %u values on the stack (picklers append list items "
                     "and dict pairs in runs of 1000): not the data of a snapshot",
                     PICKLE_MAX_STACK);
            else if (p->arena->over)
                fail(p, prev, "the values read so far need more than %" G_GUINT64_FORMAT
                     " MiB of memory (%d bytes per byte of input, plus %u MiB): not the data "
                     "of a snapshot",
                     p->arena->limit >> 20, PICKLE_MEM_PER_BYTE, PICKLE_MEM_BASE >> 20);
            else
                fail(p, p->pos, "truncated: the data ends before the STOP opcode");
            return NULL;
        }
        const gsize off = prev = p->pos;
        const guint8 op = p->data[p->pos++];
        const guint8 *s;
        gsize n;
        guint64 u;
        gint64 i;
        gboolean big;
        gsize mark = 0;

        switch (op) {
        case 0x80: /* PROTO */
            if (!need(p, off, op, 1))
                return NULL;
            u = p->data[p->pos++];
            if (u < 2 || u > 5) {
                fail(p, off, "unsupported pickle protocol %u (protocols 2 to 5 are read)",
                     (unsigned)u);
                return NULL;
            }
            break;
        case 0x95: /* FRAME: only a length hint; the framed opcodes follow as usual. Like
                      _pickle.c, opcodes may straddle frames. */
            if (!need(p, off, op, 8))
                return NULL;
            u = read_le(p->data + p->pos, 8);
            p->pos += 8;
            if (u > remaining(p)) {
                fail(p, off, "truncated: FRAME of %" G_GUINT64_FORMAT " bytes, %" G_GSIZE_FORMAT
                     " left", u, remaining(p));
                return NULL;
            }
            break;
        case '.': /* STOP */
            if (p->n_marks) {
                fail(p, off, "STOP with an open MARK (made at a value stack height of %"
                     G_GSIZE_FORMAT ")", p->marks[p->n_marks - 1]);
                return NULL;
            }
            if (p->n_stack != 1) {
                fail(p, off, "STOP with %" G_GSIZE_FORMAT " values on the stack (1 expected)",
                     p->n_stack);
                return NULL;
            }
            return p->stack[0];

        case '(': /* MARK */
            if (p->n_marks >= PICKLE_MAX_DEPTH) {
                fail(p, off, "more than %d nested MARKs", PICKLE_MAX_DEPTH);
                return NULL;
            }
            if (p->n_marks == p->cap_marks) {
                p->cap_marks = p->cap_marks ? 2 * p->cap_marks : 64;
                p->marks = g_renew(gsize, p->marks, p->cap_marks);
            }
            p->marks[p->n_marks++] = p->n_stack;
            break;
        case '0': /* POP: the top value, or the mark on top (_pickle.c load_pop) */
            if (p->n_marks && p->marks[p->n_marks - 1] == p->n_stack) {
                p->n_marks--;
            } else {
                if (!need_stack(p, off, op, 1))
                    return NULL;
                p->n_stack--;
            }
            break;
        case '1': /* POP_MARK */
            if (!pop_mark(p, off, op, &mark))
                return NULL;
            p->n_stack = mark;
            break;
        case '2': /* DUP */
            if (!need_stack(p, off, op, 1))
                return NULL;
            push(p, p->stack[p->n_stack - 1]);
            break;

        case 'N':
            push(p, shared(p, &p->none, MEMSIM_PY_NONE));
            break;
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            push(p, new_bool(p, op == 0x88));
            break;

        case 'I': /* INT: decimal text, or protocol 0's "01" / "00" for True / False */
            if (!read_line(p, off, op, &s, &n))
                return NULL;
            if (n == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1')) {
                push(p, new_bool(p, s[1] == '1'));
                break;
            }
            if (!memsim_pickle_parse_decimal(s, n, &i, &big)) {
                char *q = memsim_pickle_quote(s, n);
                fail(p, off, "opcode 0x49 (INT): %s is not a decimal integer", q);
                g_free(q);
                return NULL;
            }
            push(p, new_int(p, off, i, big));
            break;
        case 'L': /* LONG: decimal text with an optional Python 2 "L" suffix */
            if (!read_line(p, off, op, &s, &n))
                return NULL;
            if (n && s[n - 1] == 'L')
                n--;
            if (!memsim_pickle_parse_decimal(s, n, &i, &big)) {
                char *q = memsim_pickle_quote(s, n);
                fail(p, off, "opcode 0x4c (LONG): %s is not a decimal integer", q);
                g_free(q);
                return NULL;
            }
            push(p, new_int(p, off, i, big));
            break;
        case 'J': /* BININT: signed 4 bytes */
            if (!need(p, off, op, 4))
                return NULL;
            u = read_le(p->data + p->pos, 4);
            p->pos += 4;
            push(p, new_int(p, off, u >= 0x80000000u ? (gint64)u - 0x100000000 : (gint64)u,
                            FALSE));
            break;
        case 'K': /* BININT1 */
        case 'M': /* BININT2 */
            n = op == 'K' ? 1 : 2;
            if (!need(p, off, op, n))
                return NULL;
            u = read_le(p->data + p->pos, (int)n);
            p->pos += n;
            push(p, new_int(p, off, (gint64)u, FALSE));
            break;
        case 0x8a: /* LONG1 */
            if (!need(p, off, op, 1))
                return NULL;
            n = p->data[p->pos++];
            if (!need(p, off, op, n))
                return NULL;
            push(p, new_long_bytes(p, off, p->data + p->pos, n));
            p->pos += n;
            break;
        case 0x8b: /* LONG4 */
            if (!need(p, off, op, 4))
                return NULL;
            u = read_le(p->data + p->pos, 4);
            p->pos += 4;
            if (u >= 0x80000000u) {
                fail(p, off, "opcode 0x8b (LONG4) with a negative byte count");
                return NULL;
            }
            if (!need(p, off, op, u))
                return NULL;
            push(p, new_long_bytes(p, off, p->data + p->pos, (gsize)u));
            p->pos += (gsize)u;
            break;

        case 'F': { /* FLOAT: text, as repr() writes it */
            if (!read_line(p, off, op, &s, &n))
                return NULL;
            char *text = g_strndup((const char *)s, n);
            char *end = NULL;
            double d = g_ascii_strtod(text, &end);
            gboolean ok = n > 0 && end && *end == '\0' && !g_ascii_isspace(text[0]) &&
                          strlen(text) == n;
            g_free(text);
            if (!ok) {
                char *q = memsim_pickle_quote(s, n);
                fail(p, off, "opcode 0x46 (FLOAT): %s is not a number", q);
                g_free(q);
                return NULL;
            }
            push(p, new_value(p, MEMSIM_PY_FLOAT, off));
            p->stack[p->n_stack - 1]->v.f = d;
            break;
        }
        case 'G': { /* BINFLOAT: big-endian IEEE 754 double */
            if (!need(p, off, op, 8))
                return NULL;
            guint64 bits = 0;
            for (int k = 0; k < 8; k++)
                bits = (bits << 8) | p->data[p->pos + (gsize)k];
            p->pos += 8;
            double d;
            memcpy(&d, &bits, sizeof d);
            push(p, new_value(p, MEMSIM_PY_FLOAT, off));
            p->stack[p->n_stack - 1]->v.f = d;
            break;
        }

        case 'V': { /* UNICODE */
            MemsimPyValue *v = NULL;
            if (!read_line(p, off, op, &s, &n))
                return NULL;
            if (!decode_raw_unicode_escape(p, off, s, n, &v))
                return NULL;
            push(p, v);
            break;
        }
        case 0x8c: /* SHORT_BINUNICODE */
        case 'U':  /* SHORT_BINSTRING (Python 2 str, read as text) */
        case 'C':  /* SHORT_BINBYTES */
            if (!need(p, off, op, 1))
                return NULL;
            u = p->data[p->pos++];
            goto counted;
        case 'X': /* BINUNICODE */
        case 'B': /* BINBYTES */
        case 'T': /* BINSTRING: a signed count */
            if (!need(p, off, op, 4))
                return NULL;
            u = read_le(p->data + p->pos, 4);
            p->pos += 4;
            if (op == 'T' && u >= 0x80000000u) {
                fail(p, off, "opcode 0x54 (BINSTRING) with a negative byte count");
                return NULL;
            }
            goto counted;
        case 0x8d: /* BINUNICODE8 */
        case 0x8e: /* BINBYTES8 */
        case 0x96: /* BYTEARRAY8, read as bytes */
            if (!need(p, off, op, 8))
                return NULL;
            u = read_le(p->data + p->pos, 8);
            p->pos += 8;
        counted:
            if (!need(p, off, op, u))
                return NULL;
            if ((op == 0x8c || op == 'X' || op == 0x8d) &&
                !memsim_pickle_utf8_ok(p->data + p->pos, (gsize)u)) {
                fail(p, off, "a str that is not UTF-8 text");
                return NULL;
            }
            push(p, new_string(p,
                               (op == 'C' || op == 'B' || op == 0x8e || op == 0x96)
                                   ? MEMSIM_PY_BYTES
                                   : MEMSIM_PY_STR,
                               off, p->data + p->pos, (gsize)u));
            p->pos += (gsize)u;
            break;

        case '}': /* EMPTY_DICT */
            push(p, &new_container(p, MEMSIM_PY_DICT, off)->v);
            break;
        case ']': /* EMPTY_LIST */
            push(p, &new_container(p, MEMSIM_PY_LIST, off)->v);
            break;
        case ')': /* EMPTY_TUPLE */
            make_tuple(p, off, p->n_stack);
            break;
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */
            n = (gsize)(op - 0x84);
            if (!need_stack(p, off, op, n))
                return NULL;
            make_tuple(p, off, p->n_stack - n);
            break;
        case 't': /* TUPLE */
            if (!pop_mark(p, off, op, &mark))
                return NULL;
            make_tuple(p, off, mark);
            break;
        case 'l': /* LIST */
            if (!pop_mark(p, off, op, &mark))
                return NULL;
            make_list(p, off, mark);
            break;
        case 'd': { /* DICT */
            if (!pop_mark(p, off, op, &mark))
                return NULL;
            Container *d = new_container(p, MEMSIM_PY_DICT, off);
            if (!dict_add_pairs(p, off, op, d, mark))
                return NULL;
            push(p, &d->v);
            break;
        }
        case 'a': /* APPEND: the list and the value both above the fence */
            if (!need_stack(p, off, op, 2))
                return NULL;
            if (!list_append_from(p, off, op, p->n_stack - 1))
                return NULL;
            break;
        case 'e': /* APPENDS: the list just below the mark, itself above the previous one */
            if (!pop_mark(p, off, op, &mark))
                return NULL;
            if (mark <= fence(p)) {
                fail(p, off, "stack underflow: opcode 0x65 (APPENDS) has no list below its "
                     "MARK");
                return NULL;
            }
            if (!list_append_from(p, off, op, mark))
                return NULL;
            break;
        case 's': { /* SETITEM */
            Container *d;
            if (!need_stack(p, off, op, 3))
                return NULL;
            if (!dict_target(p, off, op, p->n_stack - 3, &d) ||
                !dict_add_pairs(p, off, op, d, p->n_stack - 2))
                return NULL;
            break;
        }
        case 'u': { /* SETITEMS */
            Container *d;
            if (!pop_mark(p, off, op, &mark))
                return NULL;
            if (mark <= fence(p)) {
                fail(p, off, "stack underflow: opcode 0x75 (SETITEMS) has no dict below its "
                     "MARK");
                return NULL;
            }
            if (!dict_target(p, off, op, mark - 1, &d) || !dict_add_pairs(p, off, op, d, mark))
                return NULL;
            break;
        }

        case 'p': /* PUT */
            if (!read_memo_index(p, off, op, &u) || !memo_put(p, off, op, u))
                return NULL;
            break;
        case 'q': /* BINPUT */
            if (!need(p, off, op, 1))
                return NULL;
            u = p->data[p->pos++];
            if (!memo_put(p, off, op, u))
                return NULL;
            break;
        case 'r': /* LONG_BINPUT */
            if (!need(p, off, op, 4))
                return NULL;
            u = read_le(p->data + p->pos, 4);
            p->pos += 4;
            if (!memo_put(p, off, op, u))
                return NULL;
            break;
        case 0x94: /* MEMOIZE */
            if (!memo_put(p, off, op, p->n_memo))
                return NULL;
            break;
        case 'g': /* GET */
            if (!read_memo_index(p, off, op, &u) || !memo_get(p, off, op, u))
                return NULL;
            break;
        case 'h': /* BINGET */
            if (!need(p, off, op, 1))
                return NULL;
            u = p->data[p->pos++];
            if (!memo_get(p, off, op, u))
                return NULL;
            break;
        case 'j': /* LONG_BINGET */
            if (!need(p, off, op, 4))
                return NULL;
            u = read_le(p->data + p->pos, 4);
            p->pos += 4;
            if (!memo_get(p, off, op, u))
                return NULL;
            break;

        default:
            g_assert(!OPS[op].allowed);
            fail(p, off, "opcode 0x%02x (%s) is not allowed in a snapshot (only plain data is read)",
                 op, op_name(op));
            return NULL;
        }
    }
}

/* ---- repeated dict keys --------------------------------------------------------------- */

/* Comparing keys costs work proportional to their size; hostile files could make many dicts
 * of long, nearly equal or colliding keys. The work is counted and bounded (Parser.work) so
 * that a load stays linear in the input. */

static gboolean is_number(const MemsimPyValue *v)
{
    return v->type == MEMSIM_PY_BOOL || v->type == MEMSIM_PY_INT || v->type == MEMSIM_PY_FLOAT;
}

static gint64 int_of(const MemsimPyValue *v)
{
    return v->type == MEMSIM_PY_BOOL ? (v->v.b ? 1 : 0) : v->v.i;
}

/* Whether a float is integral and inside int64's range, so that it may equal an int. */
static gboolean float_is_int64(double f)
{
    return f == floor(f) && f >= -9223372036854775808.0 && f < 9223372036854775808.0;
}

/* Python's == on hashable values: numbers compare by value across bool, int and float; str
 * and bytes by content; tuples item by item (bounded by PICKLE_MAX_KEY_WEIGHT). A BIGINT's
 * value is not kept, so it only equals itself. */
static gboolean key_equal(Parser *p, const MemsimPyValue *a, const MemsimPyValue *b)
{
    p->work++;
    if (a == b)
        return TRUE;
    if (is_number(a) && is_number(b)) {
        if (a->type == MEMSIM_PY_FLOAT && b->type == MEMSIM_PY_FLOAT)
            return a->v.f == b->v.f;
        if (a->type == MEMSIM_PY_FLOAT || b->type == MEMSIM_PY_FLOAT) {
            const MemsimPyValue *f = a->type == MEMSIM_PY_FLOAT ? a : b;
            const MemsimPyValue *k = f == a ? b : a;
            return float_is_int64(f->v.f) && (gint64)f->v.f == int_of(k);
        }
        return int_of(a) == int_of(b);
    }
    if (a->type != b->type)
        return FALSE;
    switch (a->type) {
    case MEMSIM_PY_NONE:
        return TRUE;
    case MEMSIM_PY_STR:
    case MEMSIM_PY_BYTES:
        if (a->v.str.len != b->v.str.len)
            return FALSE;
        p->work += a->v.str.len / 16;
        return memcmp(a->v.str.data, b->v.str.data, a->v.str.len) == 0;
    case MEMSIM_PY_TUPLE:
        if (a->v.seq.n != b->v.seq.n)
            return FALSE;
        for (gsize i = 0; i < a->v.seq.n; i++)
            if (!key_equal(p, a->v.seq.items[i], b->v.seq.items[i]))
                return FALSE;
        return TRUE;
    default:
        return FALSE;
    }
}

/* Consistent with key_equal: equal numbers hash alike whatever their type. */
static guint key_hash(Parser *p, const MemsimPyValue *v)
{
    p->work++;
    switch (v->type) {
    case MEMSIM_PY_NONE:
        return 0x9e3779b9u;
    case MEMSIM_PY_BOOL:
    case MEMSIM_PY_INT:
        return (guint)(int_of(v) ^ (int_of(v) >> 32));
    case MEMSIM_PY_FLOAT: {
        double f = v->v.f;
        if (float_is_int64(f)) {
            gint64 i = (gint64)f;
            return (guint)(i ^ (i >> 32));
        }
        guint64 bits;
        memcpy(&bits, &f, sizeof bits);
        return (guint)(bits ^ (bits >> 32));
    }
    case MEMSIM_PY_STR:
    case MEMSIM_PY_BYTES: {
        guint h = v->type == MEMSIM_PY_STR ? 2166136261u : 2166136263u;
        for (gsize i = 0; i < v->v.str.len; i++)
            h = (h ^ (guint8)v->v.str.data[i]) * 16777619u;
        p->work += v->v.str.len / 16;
        return h;
    }
    case MEMSIM_PY_TUPLE: {
        guint h = 0x345678u;
        for (gsize i = 0; i < v->v.seq.n; i++)
            h = (h ^ key_hash(p, v->v.seq.items[i])) * 1000003u;
        return h;
    }
    default:
        return g_direct_hash(v);
    }
}

static gboolean over_budget(Parser *p, const MemsimPyValue *d)
{
    if (p->work <= p->work_limit)
        return FALSE;
    return !fail(p, d->offset, "the dict made here (or one before it) has keys too costly to "
                 "compare (long, nearly equal or colliding keys)");
}

/* Keeps the first position and the last value of each key, as a Python dict does. Small
 * dicts compare pairs; larger ones use an open-addressing table of positions. */
static gboolean dict_merge_repeats(Parser *p, MemsimPyValue *d)
{
    MemsimPyValue **keys = d->v.dict.keys, **values = d->v.dict.values;
    gsize n = d->v.dict.n, out = 0;
    if (n < 2)
        return TRUE;
    if (n < PICKLE_DICT_HASH_MIN) {
        for (gsize i = 0; i < n; i++) {
            gsize j = 0;
            while (j < out && !key_equal(p, keys[j], keys[i]))
                j++;
            if (j < out) {
                values[j] = values[i];
            } else {
                keys[out] = keys[i];
                values[out] = values[i];
                out++;
            }
        }
        d->v.dict.n = out;
        return !over_budget(p, d);
    }
    gsize size = 64;
    while (size < 2 * n)
        size *= 2;
    gsize *slots = g_new0(gsize, size); /* position + 1, 0 = empty */
    guint *hashes = g_new(guint, n);
    gboolean ok = TRUE;
    for (gsize i = 0; i < n && ok; i++) {
        guint h = key_hash(p, keys[i]);
        gsize s = h & (size - 1);
        while (slots[s] && !(hashes[slots[s] - 1] == h && key_equal(p, keys[slots[s] - 1], keys[i])))
            s = (s + 1) & (size - 1);
        if (slots[s]) {
            values[slots[s] - 1] = values[i];
        } else {
            keys[out] = keys[i];
            values[out] = values[i];
            hashes[out] = h;
            slots[s] = ++out;
        }
        ok = !over_budget(p, d);
    }
    g_free(slots);
    g_free(hashes);
    d->v.dict.n = out;
    return ok;
}

/* ---- the final walk ------------------------------------------------------------------- */

static gsize n_children(const MemsimPyValue *v)
{
    return v->type == MEMSIM_PY_DICT ? 2 * v->v.dict.n : v->v.seq.n;
}

static MemsimPyValue *child(const MemsimPyValue *v, gsize i)
{
    if (v->type == MEMSIM_PY_DICT)
        return i % 2 ? v->v.dict.values[i / 2] : v->v.dict.keys[i / 2];
    return v->v.seq.items[i];
}

typedef struct {
    Container *c;
    gsize next; /* next child to visit */
} Frame;

/* Depth-first from the root with colours: a GREY container met again closes a cycle. Each
 * container is expanded once; `weight` accumulates the size of the tree a consumer that
 * recurses would see. */
static gboolean check_tree(Parser *p, MemsimPyValue *root)
{
    if (!is_container(root))
        return TRUE;
    const guint64 limit = (guint64)p->len * PICKLE_EXPAND_PER_BYTE + PICKLE_EXPAND_BASE;
    gboolean ok = TRUE;
    GArray *path = g_array_sized_new(FALSE, FALSE, sizeof(Frame), 64);
    Container *rc = (Container *)root;
    rc->colour = GREY;
    rc->weight = 1;
    if (root->type == MEMSIM_PY_DICT && !dict_merge_repeats(p, root)) {
        g_array_free(path, TRUE);
        return FALSE;
    }
    g_array_append_val(path, ((Frame){rc, 0}));

    while (path->len) {
        Frame *f = &g_array_index(path, Frame, path->len - 1);
        Container *c = f->c;
        if (f->next == n_children(&c->v)) {
            c->colour = BLACK;
            g_array_set_size(path, path->len - 1);
            if (path->len) {
                Container *parent = g_array_index(path, Frame, path->len - 1).c;
                parent->weight += c->weight;
                if (parent->weight > limit) {
                    ok = fail(p, parent->v.offset, "the %s made here expands to more than %"
                              G_GUINT64_FORMAT " values through shared memo references",
                              memsim_py_type_name(parent->v.type), limit);
                    break;
                }
            }
            continue;
        }
        MemsimPyValue *ch = child(&c->v, f->next++);
        if (!is_container(ch)) {
            c->weight++;
            continue;
        }
        Container *cc = (Container *)ch;
        if (cc->colour == BLACK) {
            ch->repeated = TRUE;
            c->weight += cc->weight;
            if (c->weight > limit) {
                ok = fail(p, c->v.offset, "the %s made here expands to more than %"
                          G_GUINT64_FORMAT " values through shared memo references",
                          memsim_py_type_name(c->v.type), limit);
                break;
            }
            continue;
        }
        if (cc->colour == GREY) {
            ok = fail(p, ch->offset, "the %s made here contains itself (a cycle through memo "
                      "references)", memsim_py_type_name(ch->type));
            break;
        }
        if (path->len >= PICKLE_MAX_DEPTH) {
            ok = fail(p, ch->offset != MEMSIM_PY_NO_OFFSET ? ch->offset : c->v.offset,
                      "values nested deeper than %d levels", PICKLE_MAX_DEPTH);
            break;
        }
        cc->colour = GREY;
        cc->weight = 1;
        if (ch->type == MEMSIM_PY_DICT && !(ok = dict_merge_repeats(p, ch)))
            break;
        g_array_append_val(path, ((Frame){cc, 0}));
    }
    g_array_free(path, TRUE);
    return ok;
}

/* ---- public --------------------------------------------------------------------------- */

MemsimPyDoc *memsim_pickle_load(const guint8 *data, gsize len, const char *name, GError **error)
{
    g_return_val_if_fail(data != NULL || len == 0, NULL);
    MemsimPyDoc *doc = g_new0(MemsimPyDoc, 1);
    doc->heap = g_ptr_array_new();
    Parser p = {
        .data = data,
        .len = len,
        .end = len,
        .name = name ? name : "<pickle>",
        .arena = &doc->arena,
        .error = error,
        .work_limit = (guint64)len * PICKLE_EXPAND_PER_BYTE + PICKLE_EXPAND_BASE,
        .doc = doc,
    };
    doc->arena.limit = (guint64)len * PICKLE_MEM_PER_BYTE + PICKLE_MEM_BASE;
    doc->arena.trip = &p.end;
    MemsimPyValue *root = run(&p);
    if (root && !check_tree(&p, root))
        root = NULL;
    g_free(p.stack);
    g_free(p.marks);
    g_free(p.memo);
    g_free(p.small_ints);
    doc->arena.trip = NULL;
    if (!root) {
        memsim_pickle_free(doc);
        return NULL;
    }
    doc->root = root;
    return doc;
}

MemsimPyDoc *memsim_pickle_load_file(const char *path, GError **error)
{
    char *data = NULL;
    gsize len = 0;
    GError *io = NULL;
    if (!g_file_get_contents(path, &data, &len, &io)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: %s", path, io->message);
        g_error_free(io);
        return NULL;
    }
    MemsimPyDoc *doc = memsim_pickle_load((const guint8 *)data, len, path, error);
    g_free(data);
    return doc;
}

const MemsimPyValue *memsim_pickle_root(MemsimPyDoc *doc)
{
    return doc->root;
}

void memsim_pickle_free(MemsimPyDoc *doc)
{
    if (!doc)
        return;
    for (guint i = 0; i < doc->heap->len; i++) {
        MemsimPyValue *v = g_ptr_array_index(doc->heap, i);
        if (v->type == MEMSIM_PY_DICT) {
            g_free(v->v.dict.keys);
            g_free(v->v.dict.values);
        } else {
            g_free(v->v.seq.items);
        }
    }
    g_ptr_array_free(doc->heap, TRUE);
    arena_clear(&doc->arena);
    g_free(doc);
}

const MemsimPyValue *memsim_py_dict_get(const MemsimPyValue *dict, const char *key)
{
    if (!dict || dict->type != MEMSIM_PY_DICT || !key)
        return NULL;
    gsize klen = strlen(key);
    for (gsize i = 0; i < dict->v.dict.n; i++) {
        const MemsimPyValue *k = dict->v.dict.keys[i];
        if (k->type == MEMSIM_PY_STR && k->v.str.len == klen &&
            memcmp(k->v.str.data, key, klen) == 0)
            return dict->v.dict.values[i];
    }
    return NULL;
}

const char *memsim_py_type_name(MemsimPyType type)
{
    switch (type) {
    case MEMSIM_PY_NONE:
        return "None";
    case MEMSIM_PY_BOOL:
        return "bool";
    case MEMSIM_PY_INT:
        return "int";
    case MEMSIM_PY_BIGINT:
        return "int (beyond 64 bits)";
    case MEMSIM_PY_FLOAT:
        return "float";
    case MEMSIM_PY_STR:
        return "str";
    case MEMSIM_PY_BYTES:
        return "bytes";
    case MEMSIM_PY_LIST:
        return "list";
    case MEMSIM_PY_TUPLE:
        return "tuple";
    case MEMSIM_PY_DICT:
        return "dict";
    }
    return "?";
}
