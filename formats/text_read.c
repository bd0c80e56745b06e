/* The text form of a trace: the reader (spec: formats/README.md; the syntax of event lines:
 * text.h and text_syntax.c; the writer: text_write.c).
 *
 * The reader streams: it holds one line and one batch of events. A batch ends at a change
 * of rank or at a string/opinfo line, so that table growth keeps its place among the events
 * when the trace is converted to .mst and back. Bad input is reported with the file and
 * line.
 */
#include "formats/text.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#define MAX_LINE (1u << 20)
#define MAX_ITEMS 24

typedef struct {
    const char *key; /* NULL for a positional value */
    gsize key_len;
    const char *val;
    gsize val_len;
    gboolean quoted;
} Item;

typedef struct {
    MemsimTraceReader base;
    char *lbuf; /* [lstart, llen): bytes read and not yet split into lines */
    gsize lcap, lstart, llen, scanned;
    gboolean eof;
    guint64 line_no;
    char *line;
    gsize line_len;
    gboolean pending; /* `line` is still to be processed */
    char *scratch;    /* decoded quoted strings of the current line */
    gsize scratch_cap;
    Item items[MAX_ITEMS];
    gsize n_items;
    MemsimEvent *events;
    gsize events_cap;
    guint32 rank;
    gboolean events_started, seen_name, seen_alloc_conf, seen_capacity;
    GHashTable *string_index; /* string → index + 1, for quoted mark and op names */
} TextReader;

static void text_fail(TextReader *r, GError **error, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static void text_fail(TextReader *r, GError **error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    memsim_set_bad_input(error, "%s:%" G_GUINT64_FORMAT ": %s", r->base.name, r->line_no, msg);
    g_free(msg);
}

/* Returns 1 with the next line in r->line, 0 at the end, -1 on error. */
static int read_line(TextReader *r, GError **error)
{
    for (;;) {
        char *nl = memchr(r->lbuf + r->scanned, '\n', r->llen - r->scanned);
        if (nl) {
            r->line = r->lbuf + r->lstart;
            r->line_len = (gsize)(nl - r->line);
            r->lstart = r->scanned = (gsize)(nl - r->lbuf) + 1;
            break;
        }
        r->scanned = r->llen;
        if (r->eof) {
            if (r->llen == r->lstart)
                return 0;
            r->line = r->lbuf + r->lstart;
            r->line_len = r->llen - r->lstart;
            r->lstart = r->scanned = r->llen;
            break;
        }
        if (r->llen - r->lstart >= MAX_LINE) {
            r->line_no++;
            text_fail(r, error, "line longer than %u bytes", MAX_LINE);
            return -1;
        }
        if (r->lstart) {
            memmove(r->lbuf, r->lbuf + r->lstart, r->llen - r->lstart);
            r->llen -= r->lstart;
            r->scanned -= r->lstart;
            r->lstart = 0;
        }
        if (r->lcap - r->llen < 65536) {
            r->lcap = MAX(r->lcap * 2, r->llen + 65536);
            r->lbuf = g_realloc(r->lbuf, r->lcap);
        }
        gsize got = 0;
        if (!memsim_source_read(&r->base.src, r->lbuf + r->llen, r->lcap - r->llen, &got,
                                r->base.name, error))
            return -1;
        if (got == 0)
            r->eof = TRUE;
        r->llen += got;
    }
    r->line_no++;
    if (r->line_len > MAX_LINE) {
        text_fail(r, error, "line longer than %u bytes", MAX_LINE);
        return -1;
    }
    if (r->line_len && r->line[r->line_len - 1] == '\r')
        r->line_len--;
    if (memchr(r->line, 0, r->line_len)) {
        text_fail(r, error, "NUL byte in line");
        return -1;
    }
    return 1;
}

static gboolean is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* A quoted string starting at p (at the opening quote), decoded to *out (advanced). Returns
 * the position after the closing quote, or NULL with error set. */
static const char *parse_quoted(TextReader *r, const char *p, const char *end, char **out,
                                GError **error)
{
    char *o = *out;
    for (p++; p < end; p++) {
        guint8 c = (guint8)*p;
        if (c == '"') {
            *o++ = 0;
            *out = o;
            return p + 1;
        }
        if (c == '\\') {
            if (++p >= end)
                break;
            switch (*p) {
            case '\\':
                *o++ = '\\';
                break;
            case '"':
                *o++ = '"';
                break;
            case 'n':
                *o++ = '\n';
                break;
            case 't':
                *o++ = '\t';
                break;
            case 'r':
                *o++ = '\r';
                break;
            case 'x': {
                int hi = end - p > 2 ? g_ascii_xdigit_value(p[1]) : -1;
                int lo = end - p > 2 ? g_ascii_xdigit_value(p[2]) : -1;
                if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                    text_fail(r, error,
                              "bad escape in string (expected \\xHH with two hex "
                              "digits, not \\x00)");
                    return NULL;
                }
                *o++ = (char)(hi << 4 | lo);
                p += 2;
                break;
            }
            default:
                text_fail(r, error,
                          "unknown escape \\%c in string (expected \\\\, \\\", \\n, "
                          "\\t, \\r or \\xHH)",
                          g_ascii_isprint(*p) ? *p : '?');
                return NULL;
            }
            continue;
        }
        if (c < 0x20 || c == 0x7f) {
            text_fail(r, error,
                      "control character 0x%02x in string (expected it escaped as "
                      "\\xHH)",
                      c);
            return NULL;
        }
        *o++ = (char)c;
    }
    text_fail(r, error, "unterminated string (expected a closing \")");
    return NULL;
}

/* Splits r->line into items. */
static gboolean tokenize(TextReader *r, GError **error)
{
    const char *p = r->line, *end = r->line + r->line_len;
    if (r->scratch_cap < r->line_len + 1) { /* decoding never lengthens a line */
        r->scratch_cap = MAX(r->line_len + 1, 2 * r->scratch_cap);
        g_free(r->scratch);
        r->scratch = g_malloc(r->scratch_cap);
    }
    char *out = r->scratch;
    r->n_items = 0;
    for (;;) {
        while (p < end && is_space(*p))
            p++;
        if (p >= end || *p == '#')
            return TRUE;
        if (r->n_items == MAX_ITEMS) {
            text_fail(r, error, "more than %d fields in a line", MAX_ITEMS);
            return FALSE;
        }
        Item *it = &r->items[r->n_items++];
        memset(it, 0, sizeof *it);
        const char *start = p;
        if (*p != '"') {
            while (p < end && !is_space(*p) && *p != '#' && *p != '"' && *p != '=') {
                if ((guint8)*p < 0x20 || *p == 0x7f) {
                    text_fail(r, error, "control character 0x%02x (expected printable text)",
                              (guint8)*p);
                    return FALSE;
                }
                p++;
            }
            if (p < end && *p == '=') {
                it->key = start;
                it->key_len = (gsize)(p - start);
                if (it->key_len == 0) {
                    text_fail(r, error, "'=' without a key (expected key=value)");
                    return FALSE;
                }
                p++;
                start = p;
                if (p >= end || is_space(*p) || *p == '#') {
                    text_fail(r, error, "%.*s= has no value (expected %.*s=VALUE)",
                              (int)it->key_len, it->key, (int)it->key_len, it->key);
                    return FALSE;
                }
            }
        }
        if (p < end && *p == '"') {
            if (p != start) {
                text_fail(r, error, "a quote inside a word (expected space before \")");
                return FALSE;
            }
            it->val = out;
            it->quoted = TRUE;
            if (!(p = parse_quoted(r, p, end, &out, error)))
                return FALSE;
            it->val_len = strlen(it->val);
        } else {
            while (p < end && !is_space(*p) && *p != '#' && *p != '"') {
                if ((guint8)*p < 0x20 || *p == 0x7f) {
                    text_fail(r, error, "control character 0x%02x (expected printable text)",
                              (guint8)*p);
                    return FALSE;
                }
                p++;
            }
            it->val = start;
            it->val_len = (gsize)(p - start);
        }
        if (p < end && !is_space(*p) && *p != '#') {
            text_fail(r, error, "unexpected '%c' after \"%.*s\" (expected a space)", *p,
                      (int)MIN((gsize)40, (gsize)(p - start)), start);
            return FALSE;
        }
    }
}

static gboolean item_is(const Item *it, const char *s)
{
    gsize n = strlen(s);
    return !it->quoted && it->val_len == n && memcmp(it->val, s, n) == 0;
}

static gboolean key_is(const Item *it, const char *s)
{
    gsize n = strlen(s);
    return it->key && it->key_len == n && memcmp(it->key, s, n) == 0;
}

static gboolean parse_u64_error(TextReader *r, const Item *it, const char *what, uint64_t max,
                                GError **error);

/* Numbers: decimal or 0x hex, no sign, below 2^64. `what` names the value in messages;
 * NULL: the item's key. */
static gboolean parse_u64(TextReader *r, const Item *it, const char *what, uint64_t max,
                          uint64_t *out, GError **error)
{
    const char *s = it->val;
    gsize n = it->val_len;
    unsigned base = 10;
    gsize i = 0;
    if (G_UNLIKELY(it->quoted || n == 0 || s[0] == '-'))
        goto slow;
    if (n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        i = 2;
    } else if (n < 20) { /* the common case: a short decimal, no overflow possible */
        uint64_t v = 0;
        for (; i < n; i++) {
            unsigned d = (unsigned)(guint8)s[i] - '0';
            if (d > 9)
                goto slow;
            v = v * 10 + d;
        }
        if (v > max)
            goto slow;
        *out = v;
        return TRUE;
    }
    uint64_t v = 0;
    for (; i < n; i++) {
        int d = base == 16 ? g_ascii_xdigit_value(s[i]) : g_ascii_digit_value(s[i]);
        if (d < 0)
            goto slow;
        if (v > (UINT64_MAX - (uint64_t)d) / base)
            goto slow;
        v = v * base + (uint64_t)d;
    }
    if (v > max)
        goto slow;
    *out = v;
    return TRUE;
slow:
    return parse_u64_error(r, it, what, max, error);
}

/* The error for a number that the fast path refused. */
static gboolean parse_u64_error(TextReader *r, const Item *it, const char *what, uint64_t max,
                                GError **error)
{
    char keybuf[80];
    if (!what) {
        snprintf(keybuf, sizeof keybuf, "%.*s=", (int)MIN(it->key_len, (gsize)60), it->key);
        what = keybuf;
    }
    const char *s = it->val;
    gsize n = it->val_len;
    const char *sep = g_str_has_suffix(what, "=") ? "" : " "; /* "size=5", "rank 5" */
    if (it->quoted || n == 0)
        goto bad;
    if (s[0] == '-') {
        text_fail(r, error, "%s%s%.*s is negative (expected a number from 0 to %" PRIu64 ")", what,
                  sep, (int)MIN(n, (gsize)64), s, max);
        return FALSE;
    }
    unsigned base = 10;
    gsize i = 0;
    if (n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        i = 2;
    }
    uint64_t v = 0;
    for (; i < n; i++) {
        int d = base == 16 ? g_ascii_xdigit_value(s[i]) : g_ascii_digit_value(s[i]);
        if (d < 0)
            goto bad;
        if (v > (UINT64_MAX - (uint64_t)d) / base) {
            text_fail(r, error, "%s%s%.*s does not fit in 64 bits (expected at most %" PRIu64 ")",
                      what, sep, (int)MIN(n, (gsize)64), s, max);
            return FALSE;
        }
        v = v * base + (uint64_t)d;
    }
    if (v > max) {
        text_fail(r, error, "%s%s%" PRIu64 " out of range (expected at most %" PRIu64 ")", what,
                  sep, v, max);
        return FALSE;
    }
    g_assert_not_reached(); /* the fast path would have taken it */
bad:
    text_fail(r, error, "%s: expected a number (decimal or 0x hex), got %s%.*s%s", what,
              it->quoted ? "\"" : "'", (int)MIN(n, (gsize)64), s, it->quoted ? "\"" : "'");
    return FALSE;
}

static gboolean parse_i32(TextReader *r, const Item *it, const char *what, int32_t *out,
                          GError **error)
{
    Item abs = *it;
    gboolean neg = it->val_len > 0 && it->val[0] == '-' && !it->quoted;
    if (neg) {
        abs.val++;
        abs.val_len--;
    }
    uint64_t v;
    if (!parse_u64(r, &abs, what, neg ? (uint64_t)G_MAXINT32 + 1 : G_MAXINT32, &v, error))
        return FALSE;
    *out = neg ? (int32_t)(-(int64_t)v) : (int32_t)v;
    return TRUE;
}

static char *quoted_value(TextReader *r, const Item *it, const char *what, GError **error)
{
    if (!it->quoted) {
        text_fail(r, error, "%s: expected a quoted string, got '%.*s'", what,
                  (int)MIN(it->val_len, (gsize)64), it->val);
        return NULL;
    }
    return g_strndup(it->val, it->val_len);
}

static gboolean parse_name(TextReader *r, const Item *it, const char *what,
                           int (*from_name)(const char *), const char *const *names, int n_names,
                           int *out, GError **error)
{
    char buf[64];
    if (!it->quoted && it->val_len < sizeof buf) {
        memcpy(buf, it->val, it->val_len);
        buf[it->val_len] = 0;
        int v = from_name(buf);
        if (v >= 0) {
            *out = v;
            return TRUE;
        }
    }
    GString *exp = g_string_new(NULL);
    for (int i = 0; i < n_names; i++)
        g_string_append_printf(exp, "%s%s", i ? ", " : "", names[i]);
    text_fail(r, error, "unknown %s '%.*s' (expected %s)", what, (int)MIN(it->val_len, (gsize)64),
              it->val, exp->str);
    g_string_free(exp, TRUE);
    return FALSE;
}

static const char *const *category_list(int *n)
{
    static const char *names[MEMSIM_CAT_COUNT];
    for (int i = 0; i < MEMSIM_CAT_COUNT; i++)
        names[i] = memsim_category_name(i);
    *n = MEMSIM_CAT_COUNT;
    return names;
}

static gboolean parse_category(TextReader *r, const Item *it, uint64_t *out, GError **error)
{
    int n, v;
    const char *const *names = category_list(&n);
    if (!parse_name(r, it, "category", memsim_category_from_name, names, n, &v, error))
        return FALSE;
    *out = (uint64_t)v;
    return TRUE;
}

/* A string by index, or quoted text (looked up, or appended to the string table). */
static gboolean parse_string_ref(TextReader *r, const Item *it, const char *what, uint64_t *out,
                                 GError **error)
{
    MemsimTraceHeader *h = &r->base.header;
    if (!it->quoted) {
        if (!parse_u64(r, it, what, G_MAXUINT32, out, error))
            return FALSE;
        if (*out >= h->n_strings) {
            text_fail(r, error,
                      "%s: string %" PRIu64 " is not defined (%" PRIu32 " strings so far)", what,
                      *out, h->n_strings);
            return FALSE;
        }
        return TRUE;
    }
    gpointer v = g_hash_table_lookup(r->string_index, it->val);
    if (v) {
        *out = GPOINTER_TO_UINT(v) - 1;
        return TRUE;
    }
    if (h->n_strings >= MEMSIM_MAX_STRINGS) {
        text_fail(r, error, "more than %u strings", MEMSIM_MAX_STRINGS);
        return FALSE;
    }
    memsim_header_append_string(h, it->val, it->val_len);
    g_hash_table_insert(r->string_index, h->strings[h->n_strings - 1],
                        GUINT_TO_POINTER(h->n_strings));
    *out = h->n_strings - 1;
    return TRUE;
}

static gboolean parse_event(TextReader *r, int kind, MemsimEvent *e, GError **error)
{
    const KindSyntax *k = &memsim_text_syntax[kind];
    const char *kname = memsim_event_kind_name(kind);
    memset(e, 0, sizeof *e);
    e->kind = (uint8_t)kind;
    gsize i = 1;
    if (k->pos != POS_NONE) {
        if (i >= r->n_items || r->items[i].key) {
            text_fail(r, error, "%s needs a %s first (expected %s)", kname,
                      k->pos == POS_COLLECTIVE ? "collective kind" : "number", k->usage);
            return FALSE;
        }
        const Item *it = &r->items[i++];
        if (k->pos == POS_NUMBER) {
            if (!parse_u64(r, it, kname, UINT64_MAX, &e->id, error))
                return FALSE;
        } else if (k->pos == POS_MARK) {
            if (!parse_string_ref(r, it, kname, &e->id, error))
                return FALSE;
        } else {
            int v;
            const char *names[MEMSIM_COLL_COUNT];
            for (int c = 0; c < MEMSIM_COLL_COUNT; c++)
                names[c] = memsim_collective_name(c);
            if (!parse_name(r, it, "collective kind", memsim_collective_from_name, names,
                            MEMSIM_COLL_COUNT, &v, error))
                return FALSE;
            e->aux = (uint64_t)v;
        }
    }
    const unsigned named = named_fields(k);
    unsigned given = 0;       /* fields set by a key */
    unsigned slots_given = 0; /* slots present */
    uint64_t implied[F_COUNT] = {0};
    for (; i < r->n_items; i++) {
        const Item *it = &r->items[i];
        if (!it->key) {
            unsigned w;
            for (w = 0; w < k->n_words; w++)
                if (item_is(it, k->words[w].word))
                    break;
            if (w == k->n_words) {
                text_fail(r, error, "unexpected %s%.*s%s in %s (expected %s)",
                          it->quoted ? "\"" : "'", (int)MIN(it->val_len, (gsize)64), it->val,
                          it->quoted ? "\"" : "'", kname, k->usage);
                return FALSE;
            }
            implied[k->words[w].field] |= k->words[w].bit;
            continue;
        }
        int field = -1, slot = -1;
        for (unsigned s = 0; s < k->n_slots; s++)
            if (key_is(it, k->slots[s].key)) {
                slot = (int)s;
                field = k->slots[s].field;
            }
        if (slot < 0)
            for (unsigned f = 0; f < F_COUNT; f++)
                if (key_is(it, memsim_text_raw_keys[f]) && !(named & (1u << f)))
                    field = (int)f;
        if (field < 0) {
            text_fail(r, error, "unknown key '%.*s' for %s (expected %s)",
                      (int)MIN(it->key_len, (gsize)64), it->key, kname, k->usage);
            return FALSE;
        }
        if (given & (1u << field)) {
            text_fail(r, error, "%.*s= given twice", (int)it->key_len, it->key);
            return FALSE;
        }
        given |= 1u << field;
        uint64_t v;
        if (field == F_CAT) {
            if (!parse_category(r, it, &v, error))
                return FALSE;
        } else {
            uint64_t max = field == F_STREAM  ? MEMSIM_MAX_STREAMS - 1
                           : field == F_FLAGS ? G_MAXUINT32
                                              : UINT64_MAX;
            if (!parse_u64(r, it, NULL, max, &v, error))
                return FALSE;
        }
        field_set(e, (unsigned)field, v);
        if (slot >= 0) {
            slots_given |= 1u << slot;
            implied[F_FLAGS] |= k->slots[slot].implies_flags;
        }
    }
    for (unsigned s = 0; s < k->n_slots; s++) {
        if (k->slots[s].show == REQUIRED && !(slots_given & (1u << s))) {
            text_fail(r, error, "%s needs %s= (expected %s)", kname, k->slots[s].key, k->usage);
            return FALSE;
        }
    }
    if (!(given & (1u << F_FLAGS)))
        e->flags = (uint32_t)implied[F_FLAGS];
    if (!(given & (1u << F_AUX)) && implied[F_AUX])
        e->aux = implied[F_AUX];
    return TRUE;
}

static gboolean parse_rank_line(TextReader *r, GError **error)
{
    MemsimTraceHeader *h = &r->base.header;
    uint64_t idx;
    if (r->n_items < 2 || r->items[1].key) {
        text_fail(r, error,
                  "expected rank INDEX device=D multiplicity=M streams=S [role=\"..\"] "
                  "[handles=H,H,..] [final_reserved=B final_allocated=B] [capacity=B]");
        return FALSE;
    }
    if (!parse_u64(r, &r->items[1], "rank", UINT64_MAX, &idx, error))
        return FALSE;
    if (idx != h->n_ranks) {
        text_fail(r, error, "rank %" PRIu64 " out of order (expected rank %" PRIu32 ")", idx,
                  h->n_ranks);
        return FALSE;
    }
    if (h->n_ranks >= MEMSIM_MAX_RANKS) {
        text_fail(r, error, "more than %u ranks", MEMSIM_MAX_RANKS);
        return FALSE;
    }
    MemsimRankInfo ri = {.device = h->n_ranks, .multiplicity = 1, .n_streams = 1};
    const Item *handles = NULL;
    gboolean has_res = FALSE, has_alloc = FALSE;
    unsigned given = 0;
    static const char *const keys[] = {"device",  "multiplicity",   "streams",        "role",
                                       "handles", "final_reserved", "final_allocated",
                                       "capacity"};
    for (gsize i = 2; i < r->n_items; i++) {
        const Item *it = &r->items[i];
        unsigned k;
        for (k = 0; k < G_N_ELEMENTS(keys); k++)
            if (key_is(it, keys[k]))
                break;
        if (k == G_N_ELEMENTS(keys)) {
            text_fail(r, error,
                      "unexpected '%.*s' in a rank line (expected device=, "
                      "multiplicity=, streams=, role=, handles=, final_reserved=, "
                      "final_allocated=, capacity=)",
                      (int)MIN(it->key ? it->key_len : it->val_len, (gsize)64),
                      it->key ? it->key : it->val);
            g_free(ri.role);
            return FALSE;
        }
        if (given & (1u << k)) {
            text_fail(r, error, "%s= given twice", keys[k]);
            g_free(ri.role);
            return FALSE;
        }
        given |= 1u << k;
        uint64_t v = 0;
        gboolean ok = TRUE;
        switch (k) {
        case 0:
            ok = parse_u64(r, it, "device=", G_MAXUINT32, &v, error);
            ri.device = (uint32_t)v;
            break;
        case 1:
            ok = parse_u64(r, it, "multiplicity=", G_MAXUINT32, &v, error);
            ri.multiplicity = (uint32_t)v;
            break;
        case 2:
            ok = parse_u64(r, it, "streams=", MEMSIM_MAX_STREAMS, &v, error);
            ri.n_streams = (uint32_t)v;
            break;
        case 3:
            ok = (ri.role = quoted_value(r, it, "role=", error)) != NULL;
            break;
        case 4:
            handles = it;
            break;
        case 5:
            ok = parse_u64(r, it, "final_reserved=", UINT64_MAX, &ri.final_reserved, error);
            has_res = TRUE;
            break;
        case 6:
            ok = parse_u64(r, it, "final_allocated=", UINT64_MAX, &ri.final_allocated, error);
            has_alloc = TRUE;
            break;
        default:
            ok = parse_u64(r, it, "capacity=", UINT64_MAX, &ri.capacity, error);
            break;
        }
        if (!ok) {
            g_free(ri.role);
            return FALSE;
        }
    }
    char *why = memsim_rank_check(&ri);
    if (!why && has_res != has_alloc)
        why = g_strdup("final_reserved= and final_allocated= go together");
    if (why) {
        text_fail(r, error, "rank %" PRIu64 ": %s", idx, why);
        g_free(why);
        g_free(ri.role);
        return FALSE;
    }
    ri.has_final = has_res;
    if (handles) {
        ri.stream_handles = g_new0(uint64_t, ri.n_streams);
        const char *p = handles->val, *end = p + handles->val_len;
        guint32 n = 0;
        gboolean ok = !handles->quoted;
        while (ok && p <= end) {
            const char *comma = memchr(p, ',', (gsize)(end - p));
            if (!comma)
                comma = end;
            Item part = {.val = p, .val_len = (gsize)(comma - p)};
            if (n >= ri.n_streams) {
                text_fail(r, error, "more handles than the %" PRIu32 " streams", ri.n_streams);
                ok = FALSE;
            } else {
                ok = parse_u64(r, &part, "handles=", UINT64_MAX, &ri.stream_handles[n++], error);
            }
            p = comma + 1;
        }
        if (ok && n != ri.n_streams) {
            text_fail(r, error,
                      "%" PRIu32 " handles for %" PRIu32 " streams (expected one per stream)", n,
                      ri.n_streams);
            ok = FALSE;
        }
        if (!ok) {
            if (handles->quoted)
                text_fail(r, error, "handles=: expected comma-separated numbers");
            g_free(ri.stream_handles);
            g_free(ri.role);
            return FALSE;
        }
    }
    h->ranks = g_renew(MemsimRankInfo, h->ranks, h->n_ranks + 1);
    h->ranks[h->n_ranks++] = ri;
    return TRUE;
}

static gboolean parse_opinfo_line(TextReader *r, GError **error)
{
    MemsimTraceHeader *h = &r->base.header;
    uint64_t idx;
    if (r->n_items < 2 || r->items[1].key) {
        text_fail(r, error,
                  "expected opinfo INDEX name=STRING phase=PHASE layer=L "
                  "microbatch=M duration_us=D");
        return FALSE;
    }
    if (!parse_u64(r, &r->items[1], "opinfo", UINT64_MAX, &idx, error))
        return FALSE;
    if (idx != h->n_ops) {
        text_fail(r, error, "opinfo %" PRIu64 " out of order (expected opinfo %" PRIu32 ")", idx,
                  h->n_ops);
        return FALSE;
    }
    if (h->n_ops >= MEMSIM_MAX_OPS) {
        text_fail(r, error, "more than %u ops", MEMSIM_MAX_OPS);
        return FALSE;
    }
    MemsimOpInfo op = {.layer = -1, .microbatch = -1};
    gboolean has_name = FALSE;
    unsigned given = 0;
    static const char *const keys[] = {"name",       "phase",       "layer",
                                       "microbatch", "duration_us", "bound"};
    for (gsize i = 2; i < r->n_items; i++) {
        const Item *it = &r->items[i];
        unsigned k;
        for (k = 0; k < G_N_ELEMENTS(keys); k++)
            if (key_is(it, keys[k]))
                break;
        if (k == G_N_ELEMENTS(keys)) {
            text_fail(r, error,
                      "unexpected '%.*s' in an opinfo line (expected name=, phase=, "
                      "layer=, microbatch=, duration_us=, bound=)",
                      (int)MIN(it->key ? it->key_len : it->val_len, (gsize)64),
                      it->key ? it->key : it->val);
            return FALSE;
        }
        if (given & (1u << k)) {
            text_fail(r, error, "%s= given twice", keys[k]);
            return FALSE;
        }
        given |= 1u << k;
        switch (k) {
        case 0: {
            uint64_t v;
            if (!parse_string_ref(r, it, "name=", &v, error))
                return FALSE;
            op.name = (uint32_t)v;
            has_name = TRUE;
            break;
        }
        case 1: {
            const char *names[MEMSIM_PHASE_COUNT];
            for (int p = 0; p < MEMSIM_PHASE_COUNT; p++)
                names[p] = memsim_phase_name(p);
            int v;
            if (!parse_name(r, it, "phase", memsim_phase_from_name, names, MEMSIM_PHASE_COUNT, &v,
                            error))
                return FALSE;
            op.phase = (uint8_t)v;
            break;
        }
        case 2:
            if (!parse_i32(r, it, "layer=", &op.layer, error))
                return FALSE;
            break;
        case 3:
            if (!parse_i32(r, it, "microbatch=", &op.microbatch, error))
                return FALSE;
            break;
        case 5: {
            const char *names[MEMSIM_BOUND_COUNT];
            for (int b = 0; b < MEMSIM_BOUND_COUNT; b++)
                names[b] = memsim_op_bound_name(b);
            int v;
            if (!parse_name(r, it, "bound", memsim_op_bound_from_name, names, MEMSIM_BOUND_COUNT,
                            &v, error))
                return FALSE;
            op.bound = (uint8_t)v;
            break;
        }
        default: {
            char buf[64];
            char *endp = NULL;
            double d = NAN;
            if (!it->quoted && it->val_len > 0 && it->val_len < sizeof buf) {
                memcpy(buf, it->val, it->val_len);
                buf[it->val_len] = 0;
                d = g_ascii_strtod(buf, &endp);
            }
            if (!endp || *endp || !isfinite(d) || d < 0) {
                text_fail(r, error, "duration_us=%.*s (expected a finite number >= 0)",
                          (int)MIN(it->val_len, (gsize)64), it->val);
                return FALSE;
            }
            op.duration_us = d;
            break;
        }
        }
    }
    if (!has_name) {
        text_fail(r, error, "opinfo needs name= (expected opinfo INDEX name=STRING ...)");
        return FALSE;
    }
    memsim_header_append_op(h, &op);
    return TRUE;
}

static gboolean parse_string_line(TextReader *r, GError **error)
{
    MemsimTraceHeader *h = &r->base.header;
    uint64_t idx;
    if (r->n_items != 3 || r->items[1].key || r->items[2].key || !r->items[2].quoted) {
        text_fail(r, error, "expected string INDEX \"TEXT\"");
        return FALSE;
    }
    if (!parse_u64(r, &r->items[1], "string", UINT64_MAX, &idx, error))
        return FALSE;
    if (idx != h->n_strings) {
        text_fail(r, error, "string %" PRIu64 " out of order (expected string %" PRIu32 ")", idx,
                  h->n_strings);
        return FALSE;
    }
    if (h->n_strings >= MEMSIM_MAX_STRINGS) {
        text_fail(r, error, "more than %u strings", MEMSIM_MAX_STRINGS);
        return FALSE;
    }
    memsim_header_append_string(h, r->items[2].val, r->items[2].val_len);
    char *s = h->strings[h->n_strings - 1];
    if (!g_hash_table_contains(r->string_index, s))
        g_hash_table_insert(r->string_index, s, GUINT_TO_POINTER(h->n_strings));
    return TRUE;
}

/* name, alloc_conf, capacity: once each, in the header. */
static gboolean parse_header_value(TextReader *r, GError **error)
{
    MemsimTraceHeader *h = &r->base.header;
    const Item *kw = &r->items[0];
    gboolean *seen = item_is(kw, "name")         ? &r->seen_name
                     : item_is(kw, "alloc_conf") ? &r->seen_alloc_conf
                                                 : &r->seen_capacity;
    if (*seen) {
        text_fail(r, error, "a second %.*s line", (int)kw->val_len, kw->val);
        return FALSE;
    }
    *seen = TRUE;
    if (r->n_items != 2 || r->items[1].key) {
        text_fail(r, error, "expected %.*s %s", (int)kw->val_len, kw->val,
                  seen == &r->seen_capacity ? "BYTES" : "\"TEXT\"");
        return FALSE;
    }
    if (seen == &r->seen_capacity)
        return parse_u64(r, &r->items[1], "capacity", UINT64_MAX, &h->capacity, error);
    char *s = quoted_value(r, &r->items[1], seen == &r->seen_name ? "name" : "alloc_conf", error);
    if (!s)
        return FALSE;
    char **dst = seen == &r->seen_name ? &h->name : &h->alloc_conf;
    g_free(*dst);
    *dst = s;
    return TRUE;
}

static gboolean is_header_keyword(const Item *kw)
{
    return item_is(kw, "name") || item_is(kw, "alloc_conf") || item_is(kw, "capacity") ||
           item_is(kw, "rank");
}

static gboolean parse_header_line(TextReader *r, GError **error)
{
    const Item *kw = &r->items[0];
    if (item_is(kw, "rank"))
        return parse_rank_line(r, error);
    return parse_header_value(r, error);
}

static gsize text_next(MemsimTraceReader *base, guint32 *rank, const MemsimEvent **events,
                       GError **error)
{
    TextReader *r = (TextReader *)base;
    MemsimTraceHeader *h = &base->header;
    gsize n = 0;
    for (;;) {
        if (!r->pending) {
            int rc = read_line(r, error);
            if (rc < 0)
                return 0;
            if (rc == 0)
                break;
            r->pending = TRUE;
        }
        if (!tokenize(r, error))
            return 0;
        if (r->n_items == 0) {
            r->pending = FALSE;
            continue;
        }
        const Item *kw = &r->items[0];
        if (kw->key || kw->quoted) {
            text_fail(r, error,
                      "expected a keyword first (an event kind, @rank, string or "
                      "opinfo)");
            return 0;
        }
        if (item_is(kw, "@rank")) {
            uint64_t v;
            if (r->n_items != 2 || r->items[1].key) {
                text_fail(r, error, "expected @rank INDEX");
                return 0;
            }
            if (!parse_u64(r, &r->items[1], "@rank", UINT64_MAX, &v, error))
                return 0;
            if (v >= h->n_ranks) {
                text_fail(r, error,
                          "rank %" PRIu64 " out of range (the header has %" PRIu32 " ranks)", v,
                          h->n_ranks);
                return 0;
            }
            if (n && v != r->rank)
                break; /* a batch holds one rank; this line is read again next time */
            r->rank = (guint32)v;
            r->events_started = TRUE;
            r->pending = FALSE;
            continue;
        }
        if (item_is(kw, "string") || item_is(kw, "opinfo")) {
            if (n)
                break; /* table growth starts a new batch, keeping its place */
            if (!(item_is(kw, "string") ? parse_string_line(r, error)
                                        : parse_opinfo_line(r, error)))
                return 0;
            r->pending = FALSE;
            continue;
        }
        if (is_header_keyword(kw)) {
            text_fail(r, error, "%.*s belongs to the header, before the first event or @rank",
                      (int)kw->val_len, kw->val);
            return 0;
        }
        char kname[32];
        int kind = -1;
        if (kw->val_len < sizeof kname) {
            memcpy(kname, kw->val, kw->val_len);
            kname[kw->val_len] = 0;
            kind = memsim_event_kind_from_name(kname);
        }
        if (kind < 0) {
            GString *exp = g_string_new(NULL);
            for (int k = 1; k <= MEMSIM_EV_KIND_MAX; k++)
                g_string_append_printf(exp, "%s, ", memsim_event_kind_name(k));
            text_fail(r, error, "unknown event kind '%.*s' (expected %s@rank, string or opinfo)",
                      (int)MIN(kw->val_len, (gsize)64), kw->val, exp->str);
            g_string_free(exp, TRUE);
            return 0;
        }
        if (h->n_ranks == 0) {
            text_fail(r, error,
                      "an event, but the header declares no rank (expected a "
                      "'rank 0 ...' line before the events)");
            return 0;
        }
        r->events_started = TRUE;
        if (n == r->events_cap) {
            r->events_cap = MIN(MAX(2 * r->events_cap, (gsize)256), (gsize)MEMSIM_CHUNK_EVENTS);
            r->events = g_renew(MemsimEvent, r->events, r->events_cap);
        }
        MemsimEvent *e = &r->events[n];
        if (!parse_event(r, kind, e, error))
            return 0;
        gsize bad;
        char *why = memsim_events_check(h, r->rank, e, 1, &bad);
        if (why) {
            text_fail(r, error, "%s", why);
            g_free(why);
            return 0;
        }
        r->pending = FALSE;
        if (++n == MEMSIM_CHUNK_EVENTS)
            break;
    }
    *rank = r->rank;
    *events = r->events;
    return n;
}

static void text_reader_clear(MemsimTraceReader *base)
{
    TextReader *r = (TextReader *)base;
    g_free(r->lbuf);
    g_free(r->scratch);
    g_free(r->events);
    if (r->string_index)
        g_hash_table_unref(r->string_index);
}

static gsize text_buffer_bytes(MemsimTraceReader *base)
{
    TextReader *r = (TextReader *)base;
    return r->lcap + r->scratch_cap + r->events_cap * sizeof(MemsimEvent);
}

static const MemsimReaderOps text_reader_ops = {
    .next = text_next,
    .clear = text_reader_clear,
    .buffer_bytes = text_buffer_bytes,
};

MemsimTraceReader *memsim_text_reader_new(MemsimSource *src, const char *name, GError **error)
{
    TextReader *r = (TextReader *)memsim_trace_reader_alloc(sizeof(TextReader), &text_reader_ops,
                                                            MEMSIM_FORMAT_TEXT, src, name);
    r->lcap = 65536;
    r->lbuf = g_malloc(r->lcap);
    r->string_index = g_hash_table_new(g_str_hash, g_str_equal);
    MemsimTraceHeader *h = &r->base.header;
    h->name = g_strdup("");
    h->ranks = g_new0(MemsimRankInfo, 1);

    /* The version line. */
    int rc = read_line(r, error);
    uint64_t version = 0;
    if (rc == 0) {
        r->line_no = 1;
        text_fail(r, error, "empty file (expected \"memsim-trace %d\")", TEXT_VERSION);
        goto fail;
    }
    if (rc < 0 || !tokenize(r, error))
        goto fail;
    if (r->n_items != 2 || !item_is(&r->items[0], "memsim-trace") || r->items[1].key) {
        text_fail(r, error,
                  "not a memsim text trace (expected \"memsim-trace %d\" as the first "
                  "line)",
                  TEXT_VERSION);
        goto fail;
    }
    if (!parse_u64(r, &r->items[1], "version", UINT64_MAX, &version, error))
        goto fail;
    if (version != TEXT_VERSION) {
        text_fail(r, error,
                  "text trace version %" PRIu64 " is not supported (this reader reads "
                  "version %d)",
                  version, TEXT_VERSION);
        goto fail;
    }

    /* Header lines, up to the first line that is not one. */
    for (;;) {
        rc = read_line(r, error);
        if (rc < 0)
            goto fail;
        if (rc == 0)
            break;
        if (!tokenize(r, error))
            goto fail;
        if (r->n_items == 0)
            continue;
        const Item *kw = &r->items[0];
        gboolean ok;
        if (is_header_keyword(kw))
            ok = parse_header_line(r, error);
        else if (item_is(kw, "string"))
            ok = parse_string_line(r, error);
        else if (item_is(kw, "opinfo"))
            ok = parse_opinfo_line(r, error);
        else {
            r->pending = TRUE;
            break;
        }
        if (!ok)
            goto fail;
    }
    char *why = memsim_ops_check(h, 0);
    if (why) {
        text_fail(r, error, "%s", why);
        g_free(why);
        goto fail;
    }
    return &r->base;
fail:
    memsim_trace_reader_free(&r->base);
    return NULL;
}
