/* Internal: a restricted reader for Python pickles, for PyTorch memory snapshots.
 *
 *     MemsimPyDoc *doc = memsim_pickle_load_file("run.pickle", &err);
 *     const MemsimPyValue *root = memsim_pickle_root(doc);
 *     const MemsimPyValue *segs = memsim_py_dict_get(root, "segments");
 *     ...
 *     memsim_pickle_free(doc);
 *
 * A snapshot is untrusted input. Only what snapshots contain is accepted: dict, list, tuple,
 * str, bytes, int, long, float, bool, None, the memo opcodes and framing, protocols 2 to 5.
 * Anything else (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, PERSID, EXT*, ...)
 * is refused with a MEMSIM_ERROR_BAD_INPUT naming the file, the byte offset and the opcode.
 * Values form a tree (memo references may share a value; cycles are refused). All values
 * belong to the document and live until memsim_pickle_free(). None, True, False, the ints
 * from -256 to 65535 and the empty tuple are one shared value each per document, whose
 * offset is MEMSIM_PY_NO_OFFSET: a hostile file of a million NONE opcodes costs a million
 * pointers, not a million objects. Memory is bounded by the input size (see pickle.c).
 */
#ifndef MEMSIM_FORMATS_PICKLE_H
#define MEMSIM_FORMATS_PICKLE_H

#include <memsim/error.h>
#include <stdint.h>

typedef enum {
    MEMSIM_PY_NONE,
    MEMSIM_PY_BOOL,
    MEMSIM_PY_INT,    /* fits in int64_t */
    MEMSIM_PY_BIGINT, /* an integer that does not fit in int64_t (value not kept) */
    MEMSIM_PY_FLOAT,
    MEMSIM_PY_STR,    /* UTF-8 as stored */
    MEMSIM_PY_BYTES,
    MEMSIM_PY_LIST,
    MEMSIM_PY_TUPLE,
    MEMSIM_PY_DICT,
} MemsimPyType;

typedef struct MemsimPyValue MemsimPyValue;

/* The offset of a shared value (None, a bool, a small int, the empty tuple). */
#define MEMSIM_PY_NO_OFFSET G_MAXUINT64

struct MemsimPyValue {
    MemsimPyType type;
    /* Lists, tuples and dicts: the tree holds this same value more than once (memo
     * references to it); a pickler writes an object again that way only when the data
     * shares it. */
    guint8 repeated;
    uint64_t offset; /* byte offset in the file of the opcode that made this value, or
                        MEMSIM_PY_NO_OFFSET for a shared value */
    union {
        gboolean b;
        int64_t i;
        double f;
        struct {
            const char *data; /* NUL-terminated (bytes may also contain NULs) */
            gsize len;
        } str;
        struct {
            MemsimPyValue **items;
            gsize n;
        } seq; /* LIST, TUPLE */
        struct {
            MemsimPyValue **keys;
            MemsimPyValue **values;
            gsize n;
        } dict; /* keys in insertion order; a repeated key keeps its last value, as Python */
    } v;
};

typedef struct MemsimPyDoc MemsimPyDoc;

/* Parses a pickle held in memory. `name` is used in error messages (a file name). Returns a
 * new document or NULL with error set. */
MemsimPyDoc *memsim_pickle_load(const guint8 *data, gsize len, const char *name, GError **error);
/* Reads and parses a file. */
MemsimPyDoc *memsim_pickle_load_file(const char *path, GError **error);
/* The top-level value; owned by the document. */
const MemsimPyValue *memsim_pickle_root(MemsimPyDoc *doc);
void memsim_pickle_free(MemsimPyDoc *doc);

/* The value of a str key in a dict, or NULL when absent or when `dict` is not a dict. */
const MemsimPyValue *memsim_py_dict_get(const MemsimPyValue *dict, const char *key);
const char *memsim_py_type_name(MemsimPyType type);

/* The name of a pickle opcode as pickletools.opcodes lists it (protocols 0 to 5), or
 * "unknown"; and whether the restricted readers (pickle.c, snapshot_stream.c) accept it:
 * plain data, the memo and framing only. */
const char *memsim_pickle_op_name(guint8 op);
gboolean memsim_pickle_op_allowed(guint8 op);

/* A printable rendering of at most 40 bytes of a text argument, for error messages (the
 * bytes may be anything). Newly allocated. */
char *memsim_pickle_quote(const guint8 *s, gsize n);

/* UNICODE's argument, raw-unicode-escape: latin-1 bytes, except that \uXXXX and \UXXXXXXXX
 * preceded by an odd number of backslashes are code points (CPython's
 * _PyUnicode_DecodeRawUnicodeEscape). Decoded to UTF-8 (lone surrogates kept, encoded as
 * Python's "surrogatepass" does) into buf, which has room for 2 n + 1 bytes (each input byte
 * yields at most 2 output bytes, each escape at most 4 for its 6 or 10), NUL-terminated;
 * *len its length. FALSE, with the reason in why, for a bad escape. */
gboolean memsim_pickle_raw_unicode(const guint8 *s, gsize n, char *buf, gsize *len, char *why,
                                   gsize why_size);

/* n ≤ 8 bytes, little-endian. */
static inline guint64 memsim_pickle_read_le(const guint8 *s, int n)
{
    guint64 v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | s[i];
    return v;
}

/* LONG1 / LONG4's argument: n bytes of little-endian two's complement. FALSE when the value
 * does not fit in int64 (bytes beyond the eighth must all repeat the sign of the eighth). */
static inline gboolean memsim_pickle_long(const guint8 *s, gsize n, gint64 *val)
{
    *val = 0;
    if (n == 0)
        return TRUE;
    if (n > 8) {
        guint8 ext = (s[7] & 0x80) ? 0xff : 0x00;
        for (gsize i = 8; i < n; i++)
            if (s[i] != ext)
                return FALSE;
        n = 8;
    }
    guint64 u = memsim_pickle_read_le(s, (int)n);
    if (n < 8 && (s[n - 1] & 0x80))
        u |= ~(guint64)0 << (8 * n);
    /* two's complement reinterpretation, without implementation-defined conversion */
    *val = u <= (guint64)G_MAXINT64 ? (gint64)u : -(gint64)(~u) - 1;
    return TRUE;
}

/* An optionally signed decimal integer (the form Python's repr() writes, as INT, LONG, GET
 * and PUT carry it), with the surrounding whitespace int() ignores. FALSE when it is not one;
 * *big when it does not fit in int64 (*val is then not set). */
gboolean memsim_pickle_parse_decimal(const guint8 *s, gsize n, gint64 *val, gboolean *big);

/* Whether n bytes are text as Python's unpickler decodes a str (BINUNICODE and its short and
 * 8-byte forms: the 'utf-8' codec with 'surrogatepass', Modules/_pickle.c load_counted_binunicode):
 * well-formed UTF-8, in which encoded surrogates (ED A0..BF xx) are allowed. */
static inline gboolean memsim_pickle_utf8_ok(const guint8 *s, gsize n)
{
    gsize i = 0;
    while (i < n) {
        guint8 c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        gsize len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                                              : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (len == 0 || n - i < len)
            return FALSE;
        guint8 lo = 0x80, hi = 0xBF; /* the second byte's range */
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return FALSE;
        for (gsize k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return FALSE;
        i += len;
    }
    return TRUE;
}

#endif
