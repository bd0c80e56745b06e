/* Private to the .mst reader (mst_read.c) and writer (mst_write.c): the layout of the file
 * that both follow (spec: formats/README.md; schema: formats/mst.proto) and the coding of
 * its values, varints and zigzag deltas, in both directions.
 *
 * A .mst file is a zstd stream holding a 12-byte preamble and then length-delimited Record
 * messages: the header, chunks of events of one rank stored as columns, and an end record.
 * Below: the preamble, the field numbers of Record and Chunk, which kinds carry which
 * columns and the codes of the extra values.
 *
 * The varint decoders are static inline here on purpose: the reader's column loop inlines
 * them, and its speed depends on it.
 */
#ifndef MEMSIM_FORMATS_MST_H
#define MEMSIM_FORMATS_MST_H

#include "formats/formats-internal.h"

#include <string.h>

#define MST_MAGIC "MEMSIMTR"
#define MST_MAJOR 1
#define MST_MINOR 1
#define MST_PREAMBLE 12
#define MST_MAX_RECORD (64u << 20) /* bytes in one record: above any chunk of valid size */

/* Record fields (mst.proto). */
enum { REC_HEADER = 1, REC_CHUNK = 2, REC_END = 3 };

/* Chunk fields and the columns they hold. */
enum {
    CH_RANK = 1,
    CH_N_EVENTS = 2,
    CH_KIND = 3,
    CH_STREAM,
    CH_FLAGS,
    CH_CATEGORY,
    CH_ID,
    CH_SIZE,
    CH_ADDR,
    CH_AUX,
    CH_EXTRA_EVENT,
    CH_EXTRA_FIELD,
    CH_EXTRA_VALUE,
    CH_STRINGS = 14,
    CH_OPS = 15,
};
#define N_COLUMNS 11 /* fields 3 .. 13 */
#define COL(field) ((field)-CH_KIND)

/* Which kinds carry which fields in the columns; anything else non-zero is an extra. An
 * ALLOC carries addr only when its flags have MEMSIM_EVF_ADDR. */
enum { C_ID = 1, C_SIZE = 2, C_ADDR = 4, C_AUX = 8, C_CAT = 16, C_FLAGS = 32 };
static const uint8_t carries[32] = {
    [MEMSIM_EV_ALLOC] = C_ID | C_SIZE | C_ADDR | C_CAT | C_FLAGS,
    [MEMSIM_EV_FREE] = C_ID,
    [MEMSIM_EV_USE] = C_ID,
    [MEMSIM_EV_OP] = C_ID,
    [MEMSIM_EV_WAIT] = C_ID,
    [MEMSIM_EV_COLLECTIVE] = C_ID | C_SIZE | C_AUX,
    [MEMSIM_EV_EMPTY_CACHE] = C_FLAGS,
    [MEMSIM_EV_MARK] = C_ID,
    [MEMSIM_EV_SEG_ALLOC] = C_ADDR | C_SIZE,
    [MEMSIM_EV_SEG_FREE] = C_ADDR | C_SIZE,
    [MEMSIM_EV_SEG_MAP] = C_ADDR | C_SIZE,
    [MEMSIM_EV_SEG_UNMAP] = C_ADDR | C_SIZE,
    [MEMSIM_EV_OOM] = C_SIZE | C_ADDR,
    [MEMSIM_EV_INIT_SEGMENT] = C_ADDR | C_SIZE | C_AUX,
    [MEMSIM_EV_INIT_BLOCK] = C_ID | C_ADDR | C_SIZE | C_AUX | C_CAT,
    [MEMSIM_EV_REPEAT] = 0, /* rare (one per micro-batch at most): its fields are extras */
};

/* Extra field codes, in the order an event's extras are written. */
enum { X_ID = 1, X_SIZE, X_ADDR, X_AUX, X_CATEGORY, X_FLAGS };

/* The fields (C_*) that `e` stores in the columns. */
static inline unsigned carried(const MemsimEvent *e)
{
    unsigned m = carries[e->kind & 31];
    if (e->kind == MEMSIM_EV_ALLOC && !(e->flags & MEMSIM_EVF_ADDR))
        m &= ~(unsigned)C_ADDR;
    return m;
}

/* Delta coding of ids and addresses: zigzag(v - prev), the difference taken modulo 2^64. */
static inline uint64_t zigzag(uint64_t delta)
{
    return (delta << 1) ^ (uint64_t)((int64_t)delta >> 63);
}

static inline uint64_t unzigzag(uint64_t v)
{
    return (v >> 1) ^ (uint64_t) - (int64_t)(v & 1);
}

/* ---- varints ---- */

static inline guint8 *put_varint(guint8 *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (guint8)(v | 0x80);
        v >>= 7;
    }
    *p++ = (guint8)v;
    return p;
}

static inline gsize varint_len(uint64_t v)
{
    gsize n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* NULL when the varint runs past `end` or is longer than 64 bits. Kept out of line: the rare
 * case (`unused`: the writer includes it and decodes nothing). */
static __attribute__((noinline, unused)) const guint8 *
get_varint_slow(const guint8 *p, const guint8 *end, uint64_t *out)
{
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (p >= end)
            return NULL;
        guint8 b = *p++;
        if (shift == 63 && b > 1)
            return NULL;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = x;
            return p;
        }
    }
    return NULL;
}

/* Away from the end of the buffer, up to ten bytes are read without bounds checks. A varint
 * of at most 8 bytes (values below 2^56) is decoded without a branch on its length: the
 * first byte below 0x80 ends it, and its 7-bit groups are gathered pairwise. */
static inline const guint8 *get_varint(const guint8 *p, const guint8 *end, uint64_t *out)
{
    if (G_LIKELY(end - p >= 10)) {
        uint64_t w;
        memcpy(&w, p, 8);
        w = GUINT64_FROM_LE(w);
        const uint64_t stop = ~w & 0x8080808080808080ull; /* bit 7 of each last-byte candidate */
        if (G_LIKELY(stop)) {
            const uint64_t x = w & (stop ^ (stop - 1)) & 0x7f7f7f7f7f7f7f7full;
            uint64_t y = (x & 0x007f007f007f007full) | ((x & 0x7f007f007f007f00ull) >> 1);
            y = (y & 0x00003fff00003fffull) | ((y & 0x3fff00003fff0000ull) >> 2);
            *out = (y & 0x000000000fffffffull) | ((y & 0x0fffffff00000000ull) >> 4);
            return p + ((unsigned)__builtin_ctzll(stop) >> 3) + 1;
        }
        uint64_t x = 0;
        for (unsigned i = 0; i < 9; i++) {
            guint8 b = p[i];
            x |= (uint64_t)(b & 0x7f) << (7 * i);
            if (b < 0x80) {
                *out = x;
                return p + i + 1;
            }
        }
        if (p[9] > 1)
            return NULL;
        *out = x | (uint64_t)p[9] << 63;
        return p + 10;
    }
    return get_varint_slow(p, end, out);
}

/* get_varint for values that mostly take at most four bytes (sizes): those in 32-bit
 * arithmetic, the rest as get_varint does. */
static inline const guint8 *get_varint4(const guint8 *p, const guint8 *end, uint64_t *out)
{
    if (G_LIKELY(end - p >= 4)) {
        uint32_t w;
        memcpy(&w, p, 4);
        w = GUINT32_FROM_LE(w);
        const uint32_t stop = ~w & 0x80808080u;
        if (G_LIKELY(stop)) {
            const uint32_t x = w & (stop ^ (stop - 1)) & 0x7f7f7f7fu;
            const uint32_t y = (x & 0x007f007fu) | ((x & 0x7f007f00u) >> 1);
            *out = (y & 0x3fffu) | ((y & 0x3fff0000u) >> 2);
            return p + ((unsigned)__builtin_ctz(stop) >> 3) + 1;
        }
    }
    return get_varint(p, end, out);
}

#endif
