/* The text form of a trace: the writer (spec: formats/README.md; the syntax of event lines:
 * text.h and text_syntax.c; the reader: text_read.c).
 *
 * The writer is canonical: fixed key order, fixed number bases, a key written only when the
 * kind always shows it or its value is not zero; reading canonical text and writing it
 * again gives the same bytes. It holds about 64 KiB of lines before writing them out.
 */
#include "formats/text.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

typedef struct {
    MemsimTraceWriter base;
    GString *out;
    guint32 rank;
    gboolean rank_written;
} TextWriter;

static void put_quoted(GString *g, const char *s)
{
    g_string_append_c(g, '"');
    for (const guint8 *p = (const guint8 *)s; *p; p++) {
        switch (*p) {
        case '"':
            g_string_append(g, "\\\"");
            break;
        case '\\':
            g_string_append(g, "\\\\");
            break;
        case '\n':
            g_string_append(g, "\\n");
            break;
        case '\t':
            g_string_append(g, "\\t");
            break;
        case '\r':
            g_string_append(g, "\\r");
            break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                g_string_append_printf(g, "\\x%02x", *p);
            else
                g_string_append_c(g, (char)*p);
        }
    }
    g_string_append_c(g, '"');
}

static void put_u64(GString *g, uint64_t v, gboolean hex)
{
    char tmp[24];
    int n =
        hex ? snprintf(tmp, sizeof tmp, "0x%" PRIx64, v) : snprintf(tmp, sizeof tmp, "%" PRIu64, v);
    g_string_append_len(g, tmp, n);
}

/* The shortest decimal form that reads back as the same double. */
static void put_double(GString *g, double v)
{
    char buf[G_ASCII_DTOSTR_BUF_SIZE];
    if (v == floor(v) && fabs(v) < 9007199254740992.0 && !(v == 0 && signbit(v))) {
        g_string_append_printf(g, "%.0f", v); /* whole numbers as such: "10", not "1e+01" */
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        char fmt[8];
        snprintf(fmt, sizeof fmt, "%%.%dg", prec);
        g_ascii_formatd(buf, sizeof buf, fmt, v);
        if (g_ascii_strtod(buf, NULL) == v)
            break;
    }
    g_string_append(g, buf);
}

static gboolean text_flush(TextWriter *w, GError **error)
{
    if (w->out->len && fwrite(w->out->str, 1, w->out->len, w->base.file) != w->out->len) {
        int e = errno;
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_IO, "%s: write error: %s", w->base.name,
                    g_strerror(e ? e : EIO));
        return FALSE;
    }
    g_string_truncate(w->out, 0);
    return TRUE;
}

static void put_string_def(GString *g, guint32 i, const char *s)
{
    g_string_append_printf(g, "string %" PRIu32 " ", i);
    put_quoted(g, s);
    g_string_append_c(g, '\n');
}

static void put_op_def(GString *g, guint32 i, const MemsimOpInfo *op)
{
    g_string_append_printf(g,
                           "opinfo %" PRIu32 " name=%" PRIu32 " phase=%s layer=%" PRId32
                           " microbatch=%" PRId32 " duration_us=",
                           i, op->name, memsim_phase_name(op->phase), op->layer, op->microbatch);
    put_double(g, op->duration_us);
    if (op->bound != MEMSIM_BOUND_UNKNOWN) /* left out when unknown: older files read alike */
        g_string_append_printf(g, " bound=%s", memsim_op_bound_name(op->bound));
    g_string_append_c(g, '\n');
}

static void put_header(TextWriter *w)
{
    GString *g = w->out;
    const MemsimTraceHeader *h = &w->base.header;
    g_string_append_printf(g, "memsim-trace %d\nname ", TEXT_VERSION);
    put_quoted(g, h->name ? h->name : "");
    g_string_append_c(g, '\n');
    if (h->alloc_conf) {
        g_string_append(g, "alloc_conf ");
        put_quoted(g, h->alloc_conf);
        g_string_append_c(g, '\n');
    }
    g_string_append_printf(g, "capacity %" PRIu64 "\n", h->capacity);
    for (guint32 i = 0; i < h->n_ranks; i++) {
        const MemsimRankInfo *r = &h->ranks[i];
        g_string_append_printf(
            g, "rank %" PRIu32 " device=%" PRIu32 " multiplicity=%" PRIu32 " streams=%" PRIu32, i,
            r->device, r->multiplicity, r->n_streams);
        if (r->role) {
            g_string_append(g, " role=");
            put_quoted(g, r->role);
        }
        if (r->stream_handles) {
            g_string_append(g, " handles=");
            for (guint32 s = 0; s < r->n_streams; s++) {
                if (s)
                    g_string_append_c(g, ',');
                put_u64(g, r->stream_handles[s], TRUE);
            }
        }
        if (r->has_final)
            g_string_append_printf(g, " final_reserved=%" PRIu64 " final_allocated=%" PRIu64,
                                   r->final_reserved, r->final_allocated);
        if (r->capacity)
            g_string_append_printf(g, " capacity=%" PRIu64, r->capacity);
        g_string_append_c(g, '\n');
    }
    w->base.header_written = TRUE;
}

/* Strings and ops declared since they were last written. */
static void put_defs(TextWriter *w)
{
    const MemsimTraceHeader *h = &w->base.header;
    for (guint32 i = w->base.written_strings; i < h->n_strings; i++)
        put_string_def(w->out, i, h->strings[i]);
    for (guint32 i = w->base.written_ops; i < h->n_ops; i++)
        put_op_def(w->out, i, &h->ops[i]);
    w->base.written_strings = h->n_strings;
    w->base.written_ops = h->n_ops;
}

static void put_event(GString *g, const MemsimEvent *e)
{
    const KindSyntax *k = &memsim_text_syntax[e->kind];
    g_string_append(g, memsim_event_kind_name(e->kind));
    if (k->pos == POS_NUMBER || k->pos == POS_MARK) {
        g_string_append_c(g, ' ');
        put_u64(g, e->id, FALSE);
    } else if (k->pos == POS_COLLECTIVE) {
        g_string_append_c(g, ' ');
        g_string_append(g, memsim_collective_name(e->aux));
    }
    uint64_t implied_flags = 0;
    for (unsigned i = 0; i < k->n_slots; i++) {
        const Slot *s = &k->slots[i];
        uint64_t v = field_get(e, s->field);
        gboolean show = s->show != SHOW_NONZERO || v != 0 ||
                        (s->implies_flags && (e->flags & s->implies_flags));
        if (!show)
            continue;
        implied_flags |= s->implies_flags;
        g_string_append_c(g, ' ');
        g_string_append(g, s->key);
        g_string_append_c(g, '=');
        if (s->field == F_CAT)
            g_string_append(g, memsim_category_name(e->category));
        else
            put_u64(g, v, s->hex);
    }
    for (unsigned i = 0; i < k->n_words; i++) {
        if (field_get(e, k->words[i].field) & k->words[i].bit) {
            g_string_append_c(g, ' ');
            g_string_append(g, k->words[i].word);
            if (k->words[i].field == F_FLAGS)
                implied_flags |= k->words[i].bit;
        }
    }
    unsigned named = named_fields(k);
    for (unsigned f = F_ID; f <= F_CAT; f++) {
        if (named & (1u << f))
            continue;
        uint64_t v = field_get(e, f), words = word_mask(k, f);
        if ((words && !(v & ~words)) || v == 0)
            continue;
        g_string_append_c(g, ' ');
        g_string_append(g, memsim_text_raw_keys[f]);
        g_string_append_c(g, '=');
        if (f == F_CAT)
            g_string_append(g, memsim_category_name(e->category));
        else
            put_u64(g, v, f == F_ADDR || f == F_AUX);
    }
    if (e->flags != implied_flags)
        g_string_append_printf(g, " flags=0x%" PRIx32, e->flags);
    g_string_append_c(g, '\n');
}

static gboolean text_write(MemsimTraceWriter *base, guint32 rank, const MemsimEvent *events,
                           gsize n, GError **error)
{
    TextWriter *w = (TextWriter *)base;
    if (!base->header_written)
        put_header(w);
    put_defs(w);
    for (gsize i = 0; i < n; i++) {
        if (!w->rank_written || rank != w->rank) {
            g_string_append_printf(w->out, "@rank %" PRIu32 "\n", rank);
            w->rank = rank;
            w->rank_written = TRUE;
        }
        put_event(w->out, &events[i]);
        if (w->out->len >= 65536 && !text_flush(w, error))
            return FALSE;
    }
    return text_flush(w, error);
}

static gboolean text_finish(MemsimTraceWriter *base, GError **error)
{
    TextWriter *w = (TextWriter *)base;
    if (!base->header_written)
        put_header(w);
    put_defs(w);
    return text_flush(w, error);
}

static void text_writer_clear(MemsimTraceWriter *base)
{
    g_string_free(((TextWriter *)base)->out, TRUE);
}

static const MemsimWriterOps text_writer_ops = {
    .write = text_write,
    .finish = text_finish,
    .clear = text_writer_clear,
};

MemsimTraceWriter *memsim_text_writer_new(FILE *file, gboolean close_file, const char *name,
                                          const MemsimTraceHeader *header, GError **error)
{
    TextWriter *w = (TextWriter *)memsim_trace_writer_alloc(
        sizeof(TextWriter), &text_writer_ops, MEMSIM_FORMAT_TEXT, file, close_file, name, header);
    w->out = g_string_sized_new(65536 + 4096);
    /* The header is written with the first events, so that strings and ops declared before
     * any event join it: that keeps the output canonical. */
    return &w->base;
}
