/* The run settings table (traces/settings.c, memsim_run_setting_info): every setting
 * numbered, parsed by its kind within its bounds, its default what memsim_run_defaults
 * gives and what its help says, refused on the runs it does not apply to, and offered by
 * the command with its value's name and help. */
#include <criterion/criterion.h>
#include <memsim/gen.h>
#include <string.h>

#include "testutil.h"
#include "traces/settings.h"

/* A value the setting takes. */
static const char *good_value(const MemsimRunSetting *s)
{
    static char buf[32];
    switch (s->kind) {
    case MEMSIM_SETTING_KIND_INT:
        g_snprintf(buf, sizeof buf, "%" G_GINT64_FORMAT, s->max);
        return buf;
    case MEMSIM_SETTING_KIND_ENUM:
        return s->values[g_strv_length((char **)s->values) - 1];
    case MEMSIM_SETTING_KIND_BOOL:
        return "true";
    case MEMSIM_SETTING_KIND_SIZE:
        return "32MiB";
    case MEMSIM_SETTING_KIND_LIST:
        return strcmp(s->name, "sac-ops") == 0 ? "mm, sdpa" : "q_proj, v_proj";
    case MEMSIM_SETTING_KIND_STRING:
        return strcmp(s->name, "gpu") == 0                          ? "H100-80GB"
               : strcmp(s->name, "transformers-version") == 0       ? "4.45"
               : strcmp(s->name, "fsdp-reshard-after-forward") == 0 ? "2"
               : strcmp(s->name, "efficiency") == 0                 ? "0.4"
               : strcmp(s->name, "network-gbs") == 0                ? "50"
                                                                     : "2.1";
    }
    return NULL;
}

Test(settings, every_setting_numbered_once)
{
    GHashTable *names = g_hash_table_new(g_str_hash, g_str_equal);
    for (int i = 0; i < N_SETTINGS; i++) {
        const MemsimRunSetting *s = memsim_run_setting_info((guint)i);
        cr_assert(s && s->name && s->help, "setting %d has no entry", i);
        cr_expect_str_eq(setting_name((SettingId)i), s->name);
        cr_expect(!g_hash_table_contains(names, s->name), "%s twice", s->name);
        g_hash_table_add(names, (gpointer)s->name);
        cr_expect(s->arg || s->kind == MEMSIM_SETTING_KIND_BOOL,
                  "%s: only a boolean may be a flag without a value", s->name);
        cr_expect((s->kind == MEMSIM_SETTING_KIND_ENUM) == (s->values != NULL), "%s", s->name);
        if (s->kind == MEMSIM_SETTING_KIND_INT)
            cr_expect(s->min <= s->max, "%s", s->name);
    }
    cr_expect_null(memsim_run_setting_info(N_SETTINGS));
    g_hash_table_unref(names);
}

/* Each kind parses what it says and refuses the rest, naming the setting; a refused value
 * leaves the run as it was. */
Test(settings, values_parsed_by_kind)
{
    const MemsimRunSetting *s;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++) {
        MemsimRun r = memsim_run_defaults();
        GError *error = NULL;
        cr_expect(memsim_run_set(&r, s->name, good_value(s), &error), "%s %s: %s", s->name,
                  good_value(s), error ? error->message : "");
        g_clear_error(&error);
        cr_expect(memsim_run_given(&r, s->name), "%s not marked given", s->name);
        const char *bad[4] = {NULL};
        char lo[32], hi[32];
        switch (s->kind) {
        case MEMSIM_SETTING_KIND_INT:
            g_snprintf(lo, sizeof lo, "%" G_GINT64_FORMAT, s->min - 1);
            g_snprintf(hi, sizeof hi, "%" G_GINT64_FORMAT, s->max + 1);
            bad[0] = lo, bad[1] = hi, bad[2] = "1.5";
            break;
        case MEMSIM_SETTING_KIND_ENUM:
            for (const char *const *v = s->values; *v; v++) {
                g_autofree char *upper = g_ascii_strup(*v, -1);
                cr_expect(memsim_run_set(&r, s->name, upper, NULL), "%s %s", s->name, upper);
            }
            bad[0] = "nonesuch";
            break;
        case MEMSIM_SETTING_KIND_BOOL:
            bad[0] = "maybe";
            break;
        case MEMSIM_SETTING_KIND_SIZE:
            bad[0] = "-1";
            bad[1] = "lots";
            break;
        case MEMSIM_SETTING_KIND_STRING:
            bad[0] = "nonesuch";
            break;
        case MEMSIM_SETTING_KIND_LIST:
            break;
        }
        for (int k = 0; bad[k]; k++) {
            MemsimRun before = memsim_run_defaults(), after = before;
            cr_expect_not(memsim_run_set(&after, s->name, bad[k], &error), "%s %s taken", s->name,
                          bad[k]);
            g_autofree char *prefix = g_strdup_printf("%s: ", s->name);
            cr_expect(error && g_str_has_prefix(error->message, prefix), "%s %s: %s", s->name,
                      bad[k], error ? error->message : "no error");
            if (error && s->kind == MEMSIM_SETTING_KIND_ENUM)
                for (const char *const *v = s->values; *v; v++)
                    cr_expect(strstr(error->message, *v), "%s: %s", *v, error->message);
            g_clear_error(&error);
            g_autofree char *d1 = memsim_run_describe(&before);
            g_autofree char *d2 = memsim_run_describe(&after);
            cr_expect_str_eq(d2, d1, "%s %s changed the run", s->name, bad[k]);
            cr_expect_eq(after.given, 0);
        }
        memsim_run_clear(&r);
    }
}

/* memsim_run_defaults is each default_value given (the run unchanged but for the bits of the
 * settings given). */
Test(settings, defaults_are_the_tables)
{
    MemsimRun d = memsim_run_defaults(), r = memsim_run_defaults();
    const MemsimRunSetting *s;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++)
        if (s->default_value)
            cr_expect(memsim_run_set(&r, s->name, s->default_value, NULL), "%s", s->name);
    cr_expect_eq(d.given, 0);
    r.given = 0;
    cr_expect_eq(r.batch, d.batch);
    cr_expect_eq(r.seq, d.seq);
    cr_expect_eq(r.steps, d.steps);
    cr_expect_eq(r.precision, MEMSIM_PREC_BF16_MIXED);
    cr_expect_eq(d.use_cache, -1, "use-cache: the config's");
    cr_expect_eq(d.gpus_per_node, 8);
    g_autofree char *d1 = memsim_run_describe(&d);
    g_autofree char *d2 = memsim_run_describe(&r);
    cr_expect_str_eq(d2, d1);
}

/* The word after "default " in a help ("(default 16)", "default 8)") when it is a number or a
 * boolean, else the word before " (default" ("bf16-mixed (default)"); NULL if neither. */
static char *default_in_help(const char *help)
{
    const char *p = strstr(help, "default ");
    if (p) {
        p += strlen("default ");
        gsize n = strspn(p, "0123456789.truefals");
        if (n &&
            (g_ascii_isdigit(*p) || g_str_has_prefix(p, "true") || g_str_has_prefix(p, "false")))
            return g_strndup(p, n);
    }
    p = strstr(help, " (default");
    if (p) {
        const char *w = p;
        while (w > help && w[-1] != ' ')
            w--;
        return g_strndup(w, (gsize)(p - w));
    }
    return NULL;
}

/* What a help says the default is, default_value is (for the settings that have one). */
Test(settings, help_names_the_default)
{
    const MemsimRunSetting *s;
    int n = 0;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++) {
        g_autofree char *said = default_in_help(s->help);
        if (!s->default_value || !said)
            continue;
        cr_expect_str_eq(said, s->default_value, "--%s: the help says the default is %s", s->name,
                         said);
        n++;
    }
    cr_expect_geq(n, 15, "only %d helps name a default", n);
}

/* A training setting given to an inference run, or an inference one to a training run, is
 * refused by memsim_run_check naming it; a setting of both runs is not refused as such. */
Test(settings, refused_on_the_runs_it_does_not_apply_to)
{
    const MemsimRunSetting *s;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++) {
        for (int inference = 0; inference < 2; inference++) {
            MemsimRun r = memsim_run_defaults();
            if (inference)
                cr_assert(memsim_run_set(&r, "inference", "true", NULL));
            cr_assert(memsim_run_set(&r, s->name, good_value(s), NULL), "%s", s->name);
            GError *error = NULL;
            gboolean ok = memsim_run_check(&r, &error);
            gboolean other = s->scope == (inference ? MEMSIM_SETTING_SCOPE_TRAINING
                                                    : MEMSIM_SETTING_SCOPE_INFERENCE);
            if (other) {
                g_autofree char *prefix = g_strdup_printf("%s: ", s->name);
                cr_expect(!ok && g_str_has_prefix(error->message, prefix), "%s given to %s: %s",
                          s->name, inference ? "inference" : "training",
                          ok ? "taken" : error->message);
            } else if (!ok) {
                cr_expect(!strstr(error->message, "an inference run has no") &&
                              !strstr(error->message, "only with --inference"),
                          "%s refused on %s: %s", s->name, inference ? "inference" : "training",
                          error->message);
            }
            g_clear_error(&error);
            memsim_run_clear(&r);
        }
    }
}

Test(settings, resolved_run)
{
    MemsimRun r = memsim_run_defaults();
    MemsimResolvedRun rr = memsim_run_resolve(&r);
    cr_expect(rr.method == MEMSIM_METHOD_NONE && rr.tp == 1 && rr.pp == 1 && rr.dp == 1 &&
              rr.microbatches == 1 && !rr.distributed);
    r.gpus = 16;
    r.tp = 2;
    r.pp = 4;
    rr = memsim_run_resolve(&r);
    cr_expect(rr.method == MEMSIM_METHOD_MEGATRON && rr.tp == 2 && rr.pp == 4 && rr.dp == 2 &&
              rr.microbatches == 4 && rr.distributed);
    r.microbatches = 8;
    r.dp = 1;
    rr = memsim_run_resolve(&r);
    cr_expect(rr.microbatches == 8 && rr.dp == 1);
    r = memsim_run_defaults();
    r.gpus = 4;
    r.method = MEMSIM_METHOD_ZERO3;
    rr = memsim_run_resolve(&r);
    cr_expect(rr.method == MEMSIM_METHOD_ZERO3 && rr.tp == 1 && rr.dp == 4 && rr.distributed);
    /* degrees whose product exceeds an int */
    r.method = MEMSIM_METHOD_NONE;
    r.gpus = 2;
    r.tp = r.pp = 1 << 20;
    rr = memsim_run_resolve(&r);
    cr_expect(rr.method == MEMSIM_METHOD_MEGATRON && rr.dp == 0);
}

/* `memsim estimate --help-run`: --run FILE, then every setting in the table's order, with its
 * value's name and its help. */
Test(settings, command_offers_every_setting)
{
    const char *argv[] = {"estimate", "--help-run", NULL};
    g_autofree char *out = NULL;
    cr_assert_eq(tu_run_memsim(argv, &out, NULL), 0);
    const char *p = strstr(out, "--run=FILE");
    cr_assert(p, "%s", out);
    const MemsimRunSetting *s;
    for (guint i = 0; (s = memsim_run_setting_info(i)); i++) {
        g_autofree char *opt = s->arg ? g_strdup_printf("\n  --%s=%s ", s->name, s->arg)
                                      : g_strdup_printf("\n  --%s ", s->name);
        const char *q = strstr(p, opt);
        cr_expect(q, "no %s in:\n%s", opt + 1, out);
        if (!q)
            continue;
        const char *eol = strchr(q + 1, '\n');
        g_autofree char *line = g_strndup(q + 1, eol ? (gsize)(eol - q - 1) : strlen(q + 1));
        cr_expect(g_str_has_suffix(line, s->help), "--%s: %s", s->name, line);
        p = q + 1;
    }
}
