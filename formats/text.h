/* Private to the text form's reader (text_read.c) and writer (text_write.c): the syntax of
 * event lines that both follow (spec: formats/README.md), the table itself in
 * text_syntax.c.
 *
 *     memsim-trace 1
 *     name "llama step"
 *     capacity 85899345920
 *     rank 0 device=0 multiplicity=1 streams=2
 *     string 0 "linear"
 *     opinfo 0 name=0 phase=forward layer=0 microbatch=-1 duration_us=12.5
 *     @rank 0
 *     op 0
 *     alloc t=1 size=4096 stream=0 cat=activation
 *     free t=1
 *
 * One record a line: a keyword, then positional values and key=value pairs; '#' starts a
 * comment outside quoted strings. Each event kind has its own key names (KindSyntax below);
 * a field the kind does not name can still be given with its raw name (id=, size=, addr=,
 * aux=, cat=, flags=), so every MemsimEvent round-trips.
 */
#ifndef MEMSIM_FORMATS_TEXT_H
#define MEMSIM_FORMATS_TEXT_H

#include "formats/formats-internal.h"

#define TEXT_VERSION 1

/* The fields of a MemsimEvent that keys and words set (field_get, field_set). */
enum { F_ID, F_SIZE, F_ADDR, F_AUX, F_CAT, F_STREAM, F_FLAGS, F_COUNT };
/* The raw names of the fields, by F_*: how a field the kind does not name is given. */
extern const char *const memsim_text_raw_keys[F_COUNT];

/* When the writer writes a key (REQUIRED ones are always written, and the reader wants
 * them), and the value that follows the keyword, if any. */
enum { SHOW_NONZERO, SHOW_ALWAYS, REQUIRED };
enum { POS_NONE, POS_NUMBER, POS_MARK, POS_COLLECTIVE };

/* A key=value of a kind, for one field. */
typedef struct {
    const char *key;
    guint8 field;
    guint8 show;
    guint8 hex;
    guint32 implies_flags; /* flags the key's presence stands for */
} Slot;

/* A bare word of a kind, for bits of one field ("inferred", "small"). */
typedef struct {
    const char *word;
    guint8 field;
    uint64_t bit;
} Word;

typedef struct {
    const char *usage;
    guint8 pos; /* positional value, stored in `id` (POS_NUMBER, POS_MARK) or `aux` */
    guint8 n_slots, n_words;
    Slot slots[6];
    Word words[2];
} KindSyntax;

/* How each kind's line is written and read, by kind. */
extern const KindSyntax memsim_text_syntax[MEMSIM_EV_KIND_MAX + 1];

static inline uint64_t field_get(const MemsimEvent *e, unsigned f)
{
    switch (f) {
    case F_ID:
        return e->id;
    case F_SIZE:
        return e->size;
    case F_ADDR:
        return e->addr;
    case F_AUX:
        return e->aux;
    case F_CAT:
        return e->category;
    case F_STREAM:
        return e->stream;
    default:
        return e->flags;
    }
}

static inline void field_set(MemsimEvent *e, unsigned f, uint64_t v)
{
    switch (f) {
    case F_ID:
        e->id = v;
        break;
    case F_SIZE:
        e->size = v;
        break;
    case F_ADDR:
        e->addr = v;
        break;
    case F_AUX:
        e->aux = v;
        break;
    case F_CAT:
        e->category = (uint8_t)v;
        break;
    case F_STREAM:
        e->stream = (uint16_t)v;
        break;
    default:
        e->flags = (uint32_t)v;
        break;
    }
}

/* Which fields a kind names itself (a slot or the positional value); the others take their
 * raw names. */
static inline unsigned named_fields(const KindSyntax *k)
{
    unsigned m = 0;
    for (unsigned i = 0; i < k->n_slots; i++)
        m |= 1u << k->slots[i].field;
    if (k->pos == POS_NUMBER || k->pos == POS_MARK)
        m |= 1u << F_ID;
    if (k->pos == POS_COLLECTIVE)
        m |= 1u << F_AUX;
    return m;
}

/* The bits of field `f` that the kind's words stand for. */
static inline uint64_t word_mask(const KindSyntax *k, unsigned f)
{
    uint64_t m = 0;
    for (unsigned i = 0; i < k->n_words; i++)
        if (k->words[i].field == f)
            m |= k->words[i].bit;
    return m;
}

#endif
