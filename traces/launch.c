/* A launch's text read (traces/launch.h): a command line, a shell script, or a Megatron
 * functional test's model_config.yaml, into the program's flags, its environment and its
 * launcher's words. traces/megatron.c takes the flags as Megatron-LM's argparse would; file:line
 * below are at Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553.
 *
 * Told apart by launch_read:
 *   - a functional test's model_config.yaml (a top-level MODEL_ARGS or ENV_VARS key): its
 *     MODEL_ARGS map turned into flags as the harness does (tests/functional_tests/
 *     shell_test_utils/_run_training.sh:131-165: a value `true` is the flag alone, a list its
 *     items, an empty value drops the flag), ENV_VARS as the environment;
 *   - a command line or a shell script, read (never run) by the small shell reader below:
 *     assignments (scalars and arrays, `export`, `+=`), $VAR, ${VAR}, ${VAR:-default},
 *     ${ARR[@]}, $((arithmetic)), quotes, comments, line continuations and redirections.
 *     Conditions are not evaluated: every assignment is taken in order. What it cannot expand
 *     ($(cmd), $1, a variable the script does not assign) stays as written, which a
 *     path-valued flag takes. The launch is the command that runs a Python script
 *     (pretrain_gpt.py first), torchrun or ft_launcher, or a line of bare flags; the words
 *     before the script are the launcher's. Without such a command, the flags are the
 *     script's arrays and strings of flags (GPT_ARGS=( … ), GPT_ARGS="--num-layers 24 …") in
 *     the order they were first assigned. The environment is what the script exports and the
 *     launch's VAR=value prefixes; its other variables are kept apart (the world size's
 *     WORLD_SIZE, GPUS_PER_NODE and NUM_NODES may be plain variables).
 */
#include "traces/launch.h"

#include <memsim/error.h>
#include <string.h>
#include <yaml.h>

#define MAX_TEXT_BYTES ((gsize)1 << 20)      /* a launch script is a few KB */
#define MAX_WORDS 100000                     /* flags and values of one launch */
#define MAX_DEPTH 64                         /* nested expansions, nested arithmetic */
#define MAX_EXPANDED_BYTES ((gsize)16 << 20) /* what the expansions of one text may make */

/* ---- errors ---- */

static gboolean bad(GError **error, const char *where, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

static gboolean bad(GError **error, const char *where, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s", where, msg);
    return FALSE;
}

/* ---- the launch: its flags, environment and launcher, whatever the form ---- */

void launch_init(Launch *l, const char *where)
{
    memset(l, 0, sizeof *l);
    l->where = where;
    l->args = g_ptr_array_new_with_free_func(g_free);
    l->env = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    l->vars = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
    l->launcher = g_ptr_array_new_with_free_func(g_free);
    l->unknown = g_ptr_array_new_with_free_func(g_free);
    l->notes = g_ptr_array_new_with_free_func(g_free);
}

void launch_clear(Launch *l)
{
    g_ptr_array_unref(l->args);
    g_hash_table_unref(l->env);
    g_hash_table_unref(l->vars);
    g_ptr_array_unref(l->launcher);
    g_ptr_array_unref(l->unknown);
    g_ptr_array_unref(l->notes);
}

void launch_unknown(Launch *l, const char *what)
{
    for (guint i = 0; i < l->unknown->len; i++)
        if (strcmp(l->unknown->pdata[i], what) == 0)
            return;
    g_ptr_array_add(l->unknown, g_strdup(what));
}

void launch_note(Launch *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    for (guint i = 0; i < l->notes->len; i++)
        if (strcmp(l->notes->pdata[i], msg) == 0) {
            g_free(msg);
            return;
        }
    g_ptr_array_add(l->notes, msg);
}

/* ---- the YAML form: a functional test's model_config.yaml ---- */

static char *yaml_scalar(yaml_document_t *d, yaml_node_t *n)
{
    if (!n || n->type != YAML_SCALAR_NODE)
        return NULL;
    return g_strndup((const char *)n->data.scalar.value, n->data.scalar.length);
}

/* The pairs of mapping `n`, merge keys (<<: *anchor) folded in as yq's explode does. */
static void yaml_pairs(yaml_document_t *d, yaml_node_t *n, GPtrArray *keys, GPtrArray *values,
                       int depth)
{
    if (!n || n->type != YAML_MAPPING_NODE || depth > 8)
        return;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(d, p->key);
        yaml_node_t *v = yaml_document_get_node(d, p->value);
        g_autofree char *key = yaml_scalar(d, k);
        if (key && strcmp(key, "<<") == 0) {
            yaml_pairs(d, v, keys, values, depth + 1);
            continue;
        }
        g_ptr_array_add(keys, g_steal_pointer(&key));
        g_ptr_array_add(values, v);
    }
}

/* MODEL_ARGS into flags as _run_training.sh:131-165 does: `true` → the flag alone; an empty
 * value → nothing; a list → the flag and its items; anything else → the flag and its text. */
static gboolean yaml_read(Launch *l, const char *text, gsize len, GError **error)
{
    yaml_parser_t p;
    yaml_document_t d;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    if (!yaml_parser_load(&p, &d)) {
        gboolean r = bad(error, l->where, "not valid YAML: %s at line %zu",
                         p.problem ? p.problem : "unreadable", p.problem_mark.line + 1);
        yaml_parser_delete(&p);
        return r;
    }
    yaml_parser_delete(&p);
    gboolean ok = TRUE, model_args = FALSE;
    yaml_node_t *root = yaml_document_get_root_node(&d);
    g_autoptr(GPtrArray) keys = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GPtrArray) values = g_ptr_array_new();
    yaml_pairs(&d, root, keys, values, 0);
    for (guint i = 0; ok && i < keys->len; i++) {
        const char *key = keys->pdata[i];
        yaml_node_t *v = values->pdata[i];
        bool env = strcmp(key, "ENV_VARS") == 0, args = strcmp(key, "MODEL_ARGS") == 0;
        if (!env && !args) /* TEST_TYPE, LAUNCHER, MODEL_ARGS_2 (a later sub-run), … */
            continue;
        if (v->type != YAML_MAPPING_NODE) {
            ok = bad(error, l->where, "%s: expected a map (flag: value)", key);
            break;
        }
        model_args |= args;
        g_autoptr(GPtrArray) k2 = g_ptr_array_new_with_free_func(g_free);
        g_autoptr(GPtrArray) v2 = g_ptr_array_new();
        yaml_pairs(&d, v, k2, v2, 0);
        for (guint j = 0; j < k2->len; j++) {
            const char *name = k2->pdata[j];
            yaml_node_t *x = v2->pdata[j];
            if (env) {
                g_autofree char *s = yaml_scalar(&d, x);
                if (!s) {
                    ok = bad(error, l->where, "ENV_VARS: %s: expected a value", name);
                    break;
                }
                g_hash_table_replace(l->env, g_strdup(name), g_steal_pointer(&s));
                continue;
            }
            if (x->type == YAML_SEQUENCE_NODE) {
                g_ptr_array_add(l->args, g_strdup(name));
                for (yaml_node_item_t *it = x->data.sequence.items.start;
                     it < x->data.sequence.items.top; it++) {
                    char *s = yaml_scalar(&d, yaml_document_get_node(&d, *it));
                    if (s)
                        g_ptr_array_add(l->args, s);
                }
                continue;
            }
            g_autofree char *s = yaml_scalar(&d, x);
            if (!s) {
                ok = bad(error, l->where, "MODEL_ARGS: %s: expected a value", name);
                break;
            }
            if (!*s)
                continue;
            g_ptr_array_add(l->args, g_strdup(name));
            if (strcmp(s, "true") != 0)
                g_ptr_array_add(l->args, g_steal_pointer(&s));
        }
    }
    yaml_document_delete(&d);
    if (ok && !model_args)
        ok = bad(error, l->where,
                 "no MODEL_ARGS map (a Megatron functional test's "
                 "model_config.yaml has one)");
    return ok;
}

/* ---- the shell form: a command line or a script, read, not run ---- */

typedef struct {
    bool array, exported;
    char *value;      /* a scalar */
    GPtrArray *items; /* an array's: char * */
    int order;        /* when first assigned */
} Var;

static void var_free(gpointer p)
{
    Var *v = p;
    g_free(v->value);
    if (v->items)
        g_ptr_array_unref(v->items);
    g_free(v);
}

/* A word as written (quotes kept), or an array assignment NAME=( … ) with its words. */
typedef struct {
    char *text;
    GPtrArray *array; /* char *: the raw words between the parentheses, or NULL */
} Raw;

static void raw_free(gpointer p)
{
    Raw *r = p;
    g_free(r->text);
    if (r->array)
        g_ptr_array_unref(r->array);
    g_free(r);
}

typedef struct {
    GPtrArray *words; /* the command's words, expanded */
    GPtrArray *env;   /* char *: its NAME=value prefixes */
    int score;        /* how much it looks like the training launch */
} Command;

typedef struct {
    const char *where;
    const char *s;
    gsize n, i;
    GHashTable *vars; /* char * → Var * */
    int order;
    Command best; /* the launch, or words == NULL */
    int depth;    /* expansions within expansions (${A:-${B}}, $((…))), bounded */
    gsize budget; /* bytes the expansions may still make (MAX_EXPANDED_BYTES) */
} Sh;

static bool sh_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* Ends a word outside quotes. */
static bool sh_stop(char c)
{
    return sh_blank(c) || c == '\n' || c == ';' || c == '&' || c == '|' || c == '<' || c == '>' ||
           c == '(' || c == ')';
}

static bool name_start(char c)
{
    return g_ascii_isalpha(c) || c == '_';
}

static bool name_char(char c)
{
    return g_ascii_isalnum(c) || c == '_';
}

/* Copies s[i..] up to the parenthesis that closes the one at s[i + 1] ("$(" or "$(("),
 * quotes respected. */
static void sh_copy_parens(Sh *sh, GString *out)
{
    int depth = 0;
    char quote = 0;
    while (sh->i < sh->n) {
        char c = sh->s[sh->i++];
        g_string_append_c(out, c);
        if (quote) {
            if (c == '\\' && quote == '"' && sh->i < sh->n)
                g_string_append_c(out, sh->s[sh->i++]);
            else if (c == quote)
                quote = 0;
            continue;
        }
        if (c == '\'' || c == '"')
            quote = c;
        else if (c == '(')
            depth++;
        else if (c == ')' && --depth == 0)
            return;
    }
}

/* Copies s[i..] ("${") up to its closing brace. */
static void sh_copy_braces(Sh *sh, GString *out)
{
    int depth = 0;
    while (sh->i < sh->n) {
        char c = sh->s[sh->i++];
        g_string_append_c(out, c);
        if (c == '{')
            depth++;
        else if (c == '}' && --depth == 0)
            return;
    }
}

/* One word as written (quotes, $ and escapes kept); NULL at a separator. */
static char *sh_word(Sh *sh)
{
    GString *w = g_string_new(NULL);
    while (sh->i < sh->n) {
        char c = sh->s[sh->i];
        if (sh_stop(c))
            break;
        if (c == '\\') {
            if (sh->i + 1 < sh->n && sh->s[sh->i + 1] == '\n') {
                sh->i += 2;
                continue;
            }
            g_string_append_len(w, sh->s + sh->i, MIN(2, sh->n - sh->i));
            sh->i += 2;
            continue;
        }
        if (c == '\'') {
            gsize j = sh->i + 1;
            while (j < sh->n && sh->s[j] != '\'')
                j++;
            g_string_append_len(w, sh->s + sh->i, MIN(j + 1, sh->n) - sh->i);
            sh->i = MIN(j + 1, sh->n);
            continue;
        }
        if (c == '"') {
            g_string_append_c(w, c);
            sh->i++;
            while (sh->i < sh->n && sh->s[sh->i] != '"') {
                char d = sh->s[sh->i];
                if (d == '\\' && sh->i + 1 < sh->n) {
                    g_string_append_len(w, sh->s + sh->i, 2);
                    sh->i += 2;
                } else if (d == '$' && sh->i + 1 < sh->n && sh->s[sh->i + 1] == '(') {
                    sh_copy_parens(sh, w);
                } else if (d == '$' && sh->i + 1 < sh->n && sh->s[sh->i + 1] == '{') {
                    sh_copy_braces(sh, w);
                } else {
                    g_string_append_c(w, d);
                    sh->i++;
                }
            }
            if (sh->i < sh->n) {
                g_string_append_c(w, '"');
                sh->i++;
            }
            continue;
        }
        if (c == '$' && sh->i + 1 < sh->n && sh->s[sh->i + 1] == '(') {
            sh_copy_parens(sh, w);
            continue;
        }
        if (c == '$' && sh->i + 1 < sh->n && sh->s[sh->i + 1] == '{') {
            sh_copy_braces(sh, w);
            continue;
        }
        if (c == '`') {
            gsize j = sh->i + 1;
            while (j < sh->n && sh->s[j] != '`')
                j++;
            g_string_append_len(w, sh->s + sh->i, MIN(j + 1, sh->n) - sh->i);
            sh->i = MIN(j + 1, sh->n);
            continue;
        }
        g_string_append_c(w, c);
        sh->i++;
    }
    return g_string_free(w, FALSE);
}

/* Skips blanks, continuations and comments within a command; TRUE at its end (a newline or a
 * separator, consumed) or at the end of the text. */
static bool sh_skip(Sh *sh, bool in_array)
{
    while (sh->i < sh->n) {
        char c = sh->s[sh->i];
        if (sh_blank(c)) {
            sh->i++;
        } else if (c == '\\' && sh->i + 1 < sh->n && sh->s[sh->i + 1] == '\n') {
            sh->i += 2;
        } else if (c == '#') {
            while (sh->i < sh->n && sh->s[sh->i] != '\n')
                sh->i++;
        } else if (c == '\n' && in_array) {
            sh->i++;
        } else if (c == '\n' || c == ';' || c == '&' || c == '|' ||
                   ((c == '(' || c == ')') && !in_array)) {
            while (sh->i < sh->n && strchr("\n;&|()", sh->s[sh->i]))
                sh->i++;
            return true;
        } else {
            return false;
        }
    }
    return true;
}

/* Skips a redirection (2>&1, > log, < file) at s[i]. */
static void sh_redirect(Sh *sh)
{
    bool dup = false;
    while (sh->i < sh->n && strchr("<>&|", sh->s[sh->i])) {
        dup |= sh->s[sh->i] == '&';
        sh->i++;
    }
    if (dup && sh->i < sh->n && (g_ascii_isdigit(sh->s[sh->i]) || sh->s[sh->i] == '-')) {
        while (sh->i < sh->n && (g_ascii_isdigit(sh->s[sh->i]) || sh->s[sh->i] == '-'))
            sh->i++;
        return;
    }
    while (sh->i < sh->n && sh_blank(sh->s[sh->i]))
        sh->i++;
    g_free(sh_word(sh));
}

/* Whether raw word w is an assignment NAME= or NAME+=; its name's length and whether it
 * appends. */
static bool sh_assignment(const char *w, gsize *name_len, bool *append)
{
    if (!name_start(w[0]))
        return false;
    gsize k = 1;
    while (name_char(w[k]))
        k++;
    *name_len = k;
    *append = w[k] == '+' && w[k + 1] == '=';
    return w[k] == '=' || *append;
}

/* The raw words of one command; FALSE at the end of the text with none. */
static gboolean sh_command(Sh *sh, GPtrArray *raws)
{
    while (sh->i < sh->n || raws->len) {
        if (sh_skip(sh, false)) {
            if (raws->len || sh->i >= sh->n)
                return raws->len > 0;
            continue;
        }
        char c = sh->s[sh->i];
        if (c == '<' || c == '>') {
            /* a bare file descriptor before it (2>&1) belongs to the redirection */
            if (raws->len && sh->i > 0 && !sh_blank(sh->s[sh->i - 1])) {
                Raw *last = raws->pdata[raws->len - 1];
                bool digits = *last->text && !last->array;
                for (const char *p = last->text; *p && digits; p++)
                    digits = g_ascii_isdigit(*p);
                if (digits)
                    g_ptr_array_remove_index(raws, raws->len - 1);
            }
            sh_redirect(sh);
            continue;
        }
        Raw *r = g_new0(Raw, 1);
        r->text = sh_word(sh);
        gsize nl;
        bool app;
        if (sh->i < sh->n && sh->s[sh->i] == '(' && sh_assignment(r->text, &nl, &app) &&
            r->text[strlen(r->text) - 1] == '=') {
            sh->i++; /* NAME=( words ) */
            r->array = g_ptr_array_new_with_free_func(g_free);
            while (sh->i < sh->n) {
                sh_skip(sh, true);
                if (sh->i >= sh->n)
                    break;
                if (sh->s[sh->i] == ')') {
                    sh->i++;
                    break;
                }
                char *w = sh_word(sh);
                if (!*w && sh->i < sh->n && sh_stop(sh->s[sh->i]) && sh->s[sh->i] != ')') {
                    g_free(w); /* a stray separator inside the parentheses */
                    sh->i++;
                    continue;
                }
                g_ptr_array_add(r->array, w);
            }
        } else if (!*r->text) {
            raw_free(r); /* an unmatched parenthesis or the like: skip one character */
            if (sh->i < sh->n)
                sh->i++;
            continue;
        }
        g_ptr_array_add(raws, r);
    }
    return FALSE;
}

/* ---- expansion ---- */

typedef struct {
    GPtrArray *fields;
    GString *cur;
    bool have;     /* the current field exists (it may be empty: "") */
    gsize *budget; /* bytes the whole text may still expand to (Sh.budget) */
} Fields;

static void fields_end(Fields *f)
{
    if ((f->cur->len || f->have) && *f->budget >= 32) {
        *f->budget -= 32; /* a field's keeping */
        g_ptr_array_add(f->fields, g_strdup(f->cur->str));
    } else if (f->cur->len || f->have) {
        *f->budget = 0;
    }
    g_string_truncate(f->cur, 0);
    f->have = false;
}

/* Appends an expansion's text: split at blanks unless quoted. */
static void fields_add(Fields *f, const char *v, bool split)
{
    /* A=$A$A doubling, or arrays doubling: the expansions are bounded, the rest dropped (and
     * the text refused: shell_read) */
    gsize n = strlen(v);
    if (n > *f->budget) {
        *f->budget = 0;
        return;
    }
    *f->budget -= n;
    if (!split) {
        g_string_append(f->cur, v);
        f->have = true;
        return;
    }
    for (const char *p = v; *p;) {
        if (*p == ' ' || *p == '\t' || *p == '\n') {
            fields_end(f);
            while (*p == ' ' || *p == '\t' || *p == '\n')
                p++;
            continue;
        }
        g_string_append_c(f->cur, *p++);
        f->have = true;
    }
}

static const Var *sh_var(const Sh *sh, const char *name)
{
    return g_hash_table_lookup(sh->vars, name);
}

static char *sh_expand_one(Sh *sh, const char *w);

/* Integer arithmetic of $(( … )): + - * / % and parentheses over numbers and variables. */
typedef struct {
    Sh *sh;
    const char *p;
    bool ok;
    int depth; /* parentheses and signs, bounded */
} Arith;

static int64_t arith_sum(Arith *a);

static void arith_blank(Arith *a)
{
    while (*a->p == ' ' || *a->p == '\t')
        a->p++;
}

static int64_t arith_atom(Arith *a)
{
    arith_blank(a);
    if (++a->depth > MAX_DEPTH) {
        a->ok = false;
        return 0;
    }
    if (*a->p == '-' || *a->p == '+') {
        bool neg = *a->p++ == '-';
        int64_t x = arith_atom(a);
        return neg ? -x : x;
    }
    if (*a->p == '(') {
        a->p++;
        int64_t x = arith_sum(a);
        arith_blank(a);
        if (*a->p++ != ')')
            a->ok = false;
        return x;
    }
    if (g_ascii_isdigit(*a->p)) {
        char *end;
        int64_t x = g_ascii_strtoll(a->p, &end, 10);
        a->p = end;
        return x;
    }
    if (name_start(*a->p)) {
        const char *s = a->p;
        while (name_char(*a->p))
            a->p++;
        g_autofree char *name = g_strndup(s, (gsize)(a->p - s));
        const Var *v = sh_var(a->sh, name);
        char *end;
        const char *val = v && !v->array ? v->value : NULL;
        int64_t x = val ? g_ascii_strtoll(val, &end, 10) : 0;
        if (!val || !*val || *end)
            a->ok = false;
        return x;
    }
    a->ok = false;
    return 0;
}

static int64_t arith_product(Arith *a)
{
    int64_t x = arith_atom(a);
    for (;;) {
        arith_blank(a);
        char op = *a->p;
        if (op != '*' && op != '/' && op != '%')
            return x;
        a->p++;
        int64_t y = arith_atom(a);
        if ((op != '*' && y == 0) || (op == '*' && __builtin_mul_overflow(x, y, &x))) {
            a->ok = false;
            return 0;
        }
        if (op == '/')
            x /= y;
        else if (op == '%')
            x %= y;
    }
}

static int64_t arith_sum(Arith *a)
{
    int64_t x = arith_product(a);
    for (;;) {
        arith_blank(a);
        char op = *a->p;
        if (op != '+' && op != '-')
            return x;
        a->p++;
        int64_t y = arith_product(a);
        if (op == '+' ? __builtin_add_overflow(x, y, &x) : __builtin_sub_overflow(x, y, &x))
            a->ok = false;
    }
}

/* $((expr)): the number, or NULL when something in it is not known. */
static char *sh_arith(Sh *sh, const char *expr)
{
    g_autofree char *e = sh_expand_one(sh, expr);
    Arith a = {sh, e, true, 0};
    int64_t x = arith_sum(&a);
    arith_blank(&a);
    if (!a.ok || *a.p || strchr(e, '$'))
        return NULL;
    return g_strdup_printf("%" G_GINT64_FORMAT, x);
}

/* The end of the expansion starting at w[0] == '$' ("${…}", "$((…))", "$(…)", "$NAME", "$1"). */
static const char *sh_dollar_end(const char *w)
{
    if (w[1] == '{') {
        int depth = 0;
        for (const char *p = w + 1; *p; p++)
            if (*p == '{')
                depth++;
            else if (*p == '}' && --depth == 0)
                return p + 1;
        return w + strlen(w);
    }
    if (w[1] == '(') {
        int depth = 0;
        char quote = 0;
        for (const char *p = w + 1; *p; p++) {
            if (quote) {
                if (*p == quote)
                    quote = 0;
                continue;
            }
            if (*p == '\'' || *p == '"')
                quote = *p;
            else if (*p == '(')
                depth++;
            else if (*p == ')' && --depth == 0)
                return p + 1;
        }
        return w + strlen(w);
    }
    if (name_start(w[1])) {
        const char *p = w + 1;
        while (name_char(*p))
            p++;
        return p;
    }
    if (g_ascii_isdigit(w[1]) || (w[1] && strchr("@*#?$!-", w[1])))
        return w + 2;
    return w + 1;
}

/* Expands the expansion w[0..len) into f. */
static void sh_dollar(Sh *sh, const char *w, gsize len, bool quoted, Fields *f)
{
    g_autofree char *raw = g_strndup(w, len);
    bool split = !quoted;
    if (len == 1) { /* a lone $ */
        fields_add(f, "$", false);
        return;
    }
    if (g_str_has_prefix(raw, "$((") && g_str_has_suffix(raw, "))")) {
        g_autofree char *inner = g_strndup(raw + 3, len - 5);
        g_autofree char *x = sh_arith(sh, inner);
        fields_add(f, x ? x : raw, false);
        return;
    }
    if (raw[1] == '(') { /* $(command): not run */
        fields_add(f, raw, false);
        return;
    }
    const char *name_s, *rest = "";
    g_autofree char *name = NULL;
    if (raw[1] == '{') {
        g_autofree char *inner = g_strndup(raw + 2, len > 3 ? len - 3 : 0);
        const char *p = inner;
        if (!name_start(*p)) { /* ${1:-x}, ${#A[@]}, …: a positional default only */
            if (g_ascii_isdigit(*p)) {
                while (g_ascii_isdigit(*p))
                    p++;
                if (g_str_has_prefix(p, ":-") || *p == '-') {
                    g_autofree char *d = sh_expand_one(sh, p + (g_str_has_prefix(p, ":-") ? 2 : 1));
                    fields_add(f, d, split);
                    return;
                }
            }
            fields_add(f, raw, false);
            return;
        }
        name_s = p;
        while (name_char(*p))
            p++;
        name = g_strndup(name_s, (gsize)(p - name_s));
        rest = p;
        const Var *v = sh_var(sh, name);
        if (g_str_equal(rest, "[@]") || g_str_equal(rest, "[*]")) {
            if (!v) {
                fields_add(f, raw, false);
                return;
            }
            if (!v->array) {
                fields_add(f, v->value, split);
                return;
            }
            for (guint k = 0; k < v->items->len; k++) {
                if (quoted && rest[1] == '@') {
                    if (k)
                        fields_end(f);
                    fields_add(f, v->items->pdata[k], false);
                } else {
                    if (k)
                        fields_add(f, " ", split);
                    fields_add(f, v->items->pdata[k], split);
                }
            }
            return;
        }
        if (!*rest) {
            if (!v)
                fields_add(f, raw, false);
            else
                fields_add(f, v->array ? (v->items->len ? v->items->pdata[0] : "") : v->value,
                           split);
            return;
        }
        bool colon = *rest == ':';
        const char *op = rest + colon;
        const char *val =
            v ? (v->array ? (v->items->len ? v->items->pdata[0] : "") : v->value) : NULL;
        bool set = val && (!colon || *val);
        if (*op == '-' || *op == '=') {
            if (set) {
                fields_add(f, val, split);
            } else {
                g_autofree char *d = sh_expand_one(sh, op + 1);
                fields_add(f, d, split);
            }
            return;
        }
        if (*op == '+') {
            if (set) {
                g_autofree char *d = sh_expand_one(sh, op + 1);
                fields_add(f, d, split);
            }
            return;
        }
        fields_add(f, raw, false); /* ${A%x}, ${A/x/y}, …: not expanded */
        return;
    }
    if (!name_start(raw[1])) { /* $1, $@, $$, …: not known here */
        fields_add(f, raw, false);
        return;
    }
    const Var *v = sh_var(sh, raw + 1);
    if (!v)
        fields_add(f, raw, false);
    else
        fields_add(f, v->array ? (v->items->len ? v->items->pdata[0] : "") : v->value, split);
}

/* Expands raw word w into fields: quotes removed, expansions done, unquoted ones split at
 * blanks (when `split`). */
static void sh_expand(Sh *sh, const char *w, bool split, GPtrArray *out)
{
    if (sh->depth >= MAX_DEPTH) { /* kept as written */
        g_ptr_array_add(out, g_strdup(w));
        return;
    }
    sh->depth++;
    Fields f = {out, g_string_new(NULL), false, &sh->budget};
    const char *p = w;
    while (*p) {
        if (*p == '\\') {
            if (p[1])
                g_string_append_c(f.cur, p[1]);
            f.have = true;
            p += p[1] ? 2 : 1;
        } else if (*p == '\'') {
            const char *e = strchr(p + 1, '\'');
            e = e ? e : p + strlen(p);
            g_string_append_len(f.cur, p + 1, (gssize)(e - p - 1));
            f.have = true;
            p = *e ? e + 1 : e;
        } else if (*p == '"') {
            f.have = true;
            p++;
            while (*p && *p != '"') {
                if (*p == '\\' && p[1] && strchr("$`\"\\\n", p[1])) {
                    if (p[1] != '\n')
                        g_string_append_c(f.cur, p[1]);
                    p += 2;
                } else if (*p == '$') {
                    const char *e = sh_dollar_end(p);
                    sh_dollar(sh, p, (gsize)(e - p), true, &f);
                    p = e;
                } else {
                    g_string_append_c(f.cur, *p++);
                }
            }
            if (*p)
                p++;
        } else if (*p == '$') {
            const char *e = sh_dollar_end(p);
            sh_dollar(sh, p, (gsize)(e - p), !split, &f);
            p = e;
        } else {
            g_string_append_c(f.cur, *p++);
            f.have = true;
        }
    }
    fields_end(&f);
    g_string_free(f.cur, TRUE);
    sh->depth--;
}

/* w expanded into one string (an assignment's value: no splitting). */
static char *sh_expand_one(Sh *sh, const char *w)
{
    g_autoptr(GPtrArray) fs = g_ptr_array_new_with_free_func(g_free);
    sh_expand(sh, w, false, fs);
    GString *s = g_string_new(NULL);
    for (guint i = 0; i < fs->len; i++)
        g_string_append_printf(s, "%s%s", i ? " " : "", (char *)fs->pdata[i]);
    return g_string_free(s, FALSE);
}

/* The bytes a string costs the expansions' budget: its text and its keeping. */
static bool sh_charge(Sh *sh, gsize n)
{
    n += 32;
    if (n > sh->budget) {
        sh->budget = 0;
        return false;
    }
    sh->budget -= n;
    return true;
}

static void sh_assign(Sh *sh, const Raw *r, bool exported)
{
    gsize nl;
    bool append;
    sh_assignment(r->text, &nl, &append);
    g_autofree char *name = g_strndup(r->text, nl);
    Var *v = g_hash_table_lookup(sh->vars, name);
    /* the new value first: it may read the old one (A=$A$A, A+=(${A[@]})) */
    GPtrArray *items = NULL;
    g_autofree char *val = NULL;
    if (r->array) {
        items = g_ptr_array_new_with_free_func(g_free);
        if (append && v && v->array)
            for (guint i = 0; i < v->items->len && sh_charge(sh, strlen(v->items->pdata[i])); i++)
                g_ptr_array_add(items, g_strdup(v->items->pdata[i]));
        else if (append && v && v->value)
            g_ptr_array_add(items, g_strdup(v->value));
        for (guint i = 0; i < r->array->len && sh->budget; i++)
            sh_expand(sh, r->array->pdata[i], true, items);
        if (items->len > MAX_WORDS)
            sh->budget = 0;
    } else {
        val = sh_expand_one(sh, r->text + nl + (append ? 2 : 1));
    }
    if (!v) {
        v = g_new0(Var, 1);
        v->order = sh->order++;
        g_hash_table_insert(sh->vars, g_strdup(name), v);
    }
    v->exported |= exported;
    if (items) {
        g_clear_pointer(&v->items, g_ptr_array_unref);
        g_clear_pointer(&v->value, g_free);
        v->items = items;
        v->array = true;
    } else if (v->array) { /* A+=x appends to an array; A=x sets its first element */
        if (append || !v->items->len)
            g_ptr_array_add(v->items, g_steal_pointer(&val));
        else {
            g_free(v->items->pdata[0]);
            v->items->pdata[0] = g_steal_pointer(&val);
        }
    } else {
        char *joined = append && v->value ? g_strconcat(v->value, val, NULL) : g_strdup(val);
        g_free(v->value);
        v->value = joined;
    }
}

/* How much expanded command `w` looks like the training launch (0: not at all). */
static int launch_score(GPtrArray *w)
{
    if (!w->len)
        return 0;
    g_autofree char *first = g_path_get_basename(w->pdata[0]);
    int score = 0;
    if (g_str_has_prefix(first, "--"))
        score = 1; /* a line of bare flags */
    if (strcmp(first, "torchrun") == 0 || strcmp(first, "ft_launcher") == 0)
        score += 2;
    for (guint i = 0; i < w->len; i++) {
        const char *x = w->pdata[i];
        if (strcmp(x, "torch.distributed.run") == 0 || strcmp(x, "torch.distributed.launch") == 0)
            score += 2;
        if (g_str_has_suffix(x, ".py")) {
            g_autofree char *b = g_path_get_basename(x);
            score += g_str_has_prefix(b, "pretrain") ? 4 : 1;
            break;
        }
    }
    return score;
}

static const char *const sh_keywords[] = {
    "if",   "then", "else", "elif", "fi", "do",   "done", "while", "until",    "for",
    "case", "esac", "{",    "}",    "!",  "time", "exec", "nohup", "function", NULL};

/* Runs what memsim reads of one command: its assignments, or it as the launch. */
static void sh_run(Sh *sh, GPtrArray *raws)
{
    guint k = 0;
    while (k < raws->len && !((Raw *)raws->pdata[k])->array &&
           g_strv_contains(sh_keywords, ((Raw *)raws->pdata[k])->text))
        k++;
    if (k >= raws->len)
        return;
    const char *cmd = ((Raw *)raws->pdata[k])->text;
    gsize nl;
    bool app;
    if (!strcmp(cmd, "export") || !strcmp(cmd, "declare") || !strcmp(cmd, "typeset") ||
        !strcmp(cmd, "local") || !strcmp(cmd, "readonly")) {
        bool exported = strcmp(cmd, "export") == 0;
        for (guint j = k + 1; j < raws->len; j++) {
            const Raw *r = raws->pdata[j];
            if (r->text[0] == '-') {
                exported |= strchr(r->text, 'x') != NULL;
            } else if (sh_assignment(r->text, &nl, &app)) {
                sh_assign(sh, r, exported);
            } else if (exported) {
                Var *v = g_hash_table_lookup(sh->vars, r->text);
                if (v)
                    v->exported = true;
            }
        }
        return;
    }
    if (!strcmp(cmd, "unset")) {
        for (guint j = k + 1; j < raws->len; j++)
            g_hash_table_remove(sh->vars, ((Raw *)raws->pdata[j])->text);
        return;
    }
    guint a = k;
    while (a < raws->len && sh_assignment(((Raw *)raws->pdata[a])->text, &nl, &app))
        a++;
    if (a == raws->len) { /* only assignments: script variables */
        for (guint j = k; j < a; j++)
            sh_assign(sh, raws->pdata[j], false);
        return;
    }
    Command c = {g_ptr_array_new_with_free_func(g_free), g_ptr_array_new_with_free_func(g_free), 0};
    for (guint j = k; j < a; j++) {
        const Raw *r = raws->pdata[j];
        sh_assignment(r->text, &nl, &app);
        g_autofree char *v = sh_expand_one(sh, r->text + nl + 1);
        g_ptr_array_add(c.env, g_strdup_printf("%.*s=%s", (int)nl, r->text, v));
    }
    for (guint j = a; j < raws->len && c.words->len < MAX_WORDS; j++)
        sh_expand(sh, ((Raw *)raws->pdata[j])->text, true, c.words);
    /* env NAME=value … command */
    while (c.words->len && strcmp(c.words->pdata[0], "env") == 0) {
        g_ptr_array_remove_index(c.words, 0);
        while (c.words->len && sh_assignment(c.words->pdata[0], &nl, &app)) {
            g_ptr_array_add(c.env, g_strdup(c.words->pdata[0]));
            g_ptr_array_remove_index(c.words, 0);
        }
    }
    c.score = launch_score(c.words);
    if (c.score && c.score >= sh->best.score) {
        if (sh->best.words) {
            g_ptr_array_unref(sh->best.words);
            g_ptr_array_unref(sh->best.env);
        }
        sh->best = c;
    } else {
        g_ptr_array_unref(c.words);
        g_ptr_array_unref(c.env);
    }
}

static int by_order(gconstpointer a, gconstpointer b, gpointer vars)
{
    const Var *x = g_hash_table_lookup(vars, *(char *const *)a);
    const Var *y = g_hash_table_lookup(vars, *(char *const *)b);
    return x->order - y->order;
}

/* A command line or a shell script: the launch command's words, or else the flags the
 * script's arrays and strings hold. */
static gboolean shell_read(Launch *l, const char *text, gsize len, GError **error)
{
    Sh sh = {.where = l->where,
             .s = text,
             .n = len,
             .vars = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, var_free),
             .budget = MAX_EXPANDED_BYTES};
    g_autoptr(GPtrArray) raws = g_ptr_array_new_with_free_func(raw_free);
    while (sh_command(&sh, raws) && sh.budget) {
        sh_run(&sh, raws);
        g_ptr_array_set_size(raws, 0);
    }
    if (!sh.budget) {
        g_hash_table_unref(sh.vars);
        if (sh.best.words) {
            g_ptr_array_unref(sh.best.words);
            g_ptr_array_unref(sh.best.env);
        }
        return bad(error, l->where,
                   "its variables expand to more than %zu MiB: not a launch "
                   "script",
                   MAX_EXPANDED_BYTES >> 20);
    }
    /* the environment: what the script exports; its variables, for the world size */
    GHashTableIter it;
    gpointer k, v;
    g_hash_table_iter_init(&it, sh.vars);
    while (g_hash_table_iter_next(&it, &k, &v)) {
        const Var *x = v;
        if (x->array)
            continue;
        g_hash_table_replace(l->vars, g_strdup(k), g_strdup(x->value));
        if (x->exported)
            g_hash_table_replace(l->env, g_strdup(k), g_strdup(x->value));
    }
    if (sh.best.words) {
        for (guint i = 0; i < sh.best.env->len; i++) {
            const char *a = sh.best.env->pdata[i];
            const char *eq = strchr(a, '=');
            g_hash_table_replace(l->env, g_strndup(a, (gsize)(eq - a)), g_strdup(eq + 1));
            g_hash_table_replace(l->vars, g_strndup(a, (gsize)(eq - a)), g_strdup(eq + 1));
        }
        /* the launcher's words up to the script, the program's after it */
        GPtrArray *w = sh.best.words;
        guint script = w->len;
        for (guint i = 0; i < w->len && script == w->len; i++)
            if (g_str_has_suffix(w->pdata[i], ".py"))
                script = i;
        if (script == w->len && g_str_has_prefix(w->pdata[0], "--"))
            script = (guint)-1; /* bare flags: no launcher */
        for (guint i = 0; i < w->len; i++) {
            if (script != (guint)-1 && i < script)
                g_ptr_array_add(l->launcher, g_strdup(w->pdata[i]));
            else if (script == (guint)-1 || i > script)
                g_ptr_array_add(l->args, g_strdup(w->pdata[i]));
        }
        if (script == w->len) {
            /* torchrun -m module or the like: every word was the launcher's */
            g_ptr_array_set_size(l->launcher, 0);
            for (guint i = 0; i < w->len; i++)
                g_ptr_array_add(l->launcher, g_strdup(w->pdata[i]));
        }
        g_ptr_array_unref(sh.best.words);
        g_ptr_array_unref(sh.best.env);
    } else {
        /* no launch: the arrays and the strings of flags, in the order first assigned */
        g_autoptr(GPtrArray) names = g_ptr_array_new();
        g_hash_table_iter_init(&it, sh.vars);
        while (g_hash_table_iter_next(&it, &k, &v))
            g_ptr_array_add(names, k);
        g_ptr_array_sort_with_data(names, by_order, sh.vars);
        for (guint i = 0; i < names->len; i++) {
            const Var *x = g_hash_table_lookup(sh.vars, names->pdata[i]);
            if (x->array) {
                for (guint j = 0; j < x->items->len; j++)
                    g_ptr_array_add(l->args, g_strdup(x->items->pdata[j]));
            } else if (g_str_has_prefix(g_strchug(x->value), "--")) {
                g_auto(GStrv) parts = g_strsplit_set(x->value, " \t\n", -1);
                for (char **p = parts; *p; p++)
                    if (**p)
                        g_ptr_array_add(l->args, g_strdup(*p));
            }
        }
    }
    g_hash_table_unref(sh.vars);
    if (!l->args->len && !l->launcher->len)
        return bad(error, l->where,
                   "no Megatron flags found (expected a launch command such as "
                   "`torchrun … pretrain_gpt.py --num-layers …`, arrays of flags "
                   "such as GPT_ARGS=( … ), or a model_config.yaml)");
    return TRUE;
}

/* Reads the text into l, by its form. */
gboolean launch_read(Launch *l, const char *text, gsize len, GError **error)
{
    if (len > MAX_TEXT_BYTES)
        return bad(error, l->where,
                   "larger than %zu KiB: not a launch script, which takes a few "
                   "KB",
                   MAX_TEXT_BYTES >> 10);
    if (memchr(text, '\0', len))
        return bad(error, l->where, "holds a NUL byte: not a text file");
    if (!g_utf8_validate(text, (gssize)len, NULL))
        return bad(error, l->where, "not UTF-8 text");
    /* a YAML has a top-level MODEL_ARGS: or ENV_VARS: key; a shell script has no such line */
    for (const char *p = text; p && p < text + len; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (g_str_has_prefix(p, "MODEL_ARGS:") || g_str_has_prefix(p, "ENV_VARS:")) {
            l->yaml = true;
            return yaml_read(l, text, len, error);
        }
    return shell_read(l, text, len, error);
}
