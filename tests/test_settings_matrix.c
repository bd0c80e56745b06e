/* Every method × every loop setting: a run on one GPU, DDP, ZeRO-1/2/3, FSDP (FULL_SHARD,
 * SHARD_GRAD_OP), HSDP and Megatron (tensor and pipeline parallel) share one training loop
 * (traces/loop.c), so a loop setting (optimizer, optimizer-impl, grad-accum, keep-outputs,
 * zero-grad, checkpointing) either changes the generated trace or is refused with
 * MEMSIM_ERROR_BAD_INPUT and a message that starts with its name — never accepted and
 * ignored. Which ones each method refuses is its framework's (DISTRIBUTED.md): DeepSpeed picks
 * its FusedAdam and zeroes the gradients itself; Megatron-LM's distributed optimizer takes only
 * Adam, its schedule owns the outputs.
 *
 * Where the model state has a closed form it is checked against GPT-2's published parameter
 * count, not against memsim's: the optimizer state at the last optimizer step of DDP (torch.optim
 * on fp32 replicas: SGD none, SGD with momentum one buffer, AdamW two, per parameter), of
 * ZeRO-1/2/3 (the fp32 master partition of psi_pad/N plus the optimizer's state on that flat 1-D
 * partition: Adafactor's full second moment, 8-bit AdamW's bytes and block scales) and of FSDP
 * (the optimizer's state on each unit's fp32 shard of ⌈numel/N⌉, bitsandbytes' 2048-element
 * blocks counted per shard). */
#include <criterion/criterion.h>
#include <memsim/gen.h>
#include <memsim/sim.h>
#include <string.h>

#include "testutil.h"

/* GPT-2 (124M): its checkpoint's tensors, the head tied to the embedding: wte 50257·768, wpe
 * 1024·768, ln_f 2·768 and 12 layers of 7,087,872 (ln 2·2·768, c_attn 768·2304 + 2304,
 * c_proj 768² + 768, c_fc 768·3072 + 3072, c_proj 3072·768 + 768). */
#define GPT2_LAYER 7087872LL
#define GPT2_ROOT (50257LL * 768 + 1024 * 768 + 2 * 768)
#define GPT2_PSI (12 * GPT2_LAYER + GPT2_ROOT) /* 124,439,808 */

typedef struct {
    const char *name;
    const char *settings[8]; /* key, value, ..., NULL */
    /* the settings the method's framework decides itself (refused): a key, or key=value */
    const char *refused[8];
} Method;

static const Method methods[] = {
    {"one GPU", {NULL}, {NULL}},
    {"ddp", {"gpus", "2", "method", "ddp", NULL}, {NULL}},
    {"ddp + ZeroRedundancyOptimizer", {"gpus", "2", "method", "ddp", "zero-redundancy", "true", NULL}, {NULL}},
    {"zero1", {"gpus", "2", "method", "zero1", NULL}, {"optimizer-impl", "zero-grad", NULL}},
    {"zero2", {"gpus", "2", "method", "zero2", NULL}, {"optimizer-impl", "zero-grad", NULL}},
    {"zero3", {"gpus", "2", "method", "zero3", NULL}, {"optimizer-impl", "zero-grad", NULL}},
    {"fsdp", {"gpus", "2", "method", "fsdp", NULL}, {NULL}},
    {"fsdp-grad-op", {"gpus", "2", "method", "fsdp-grad-op", NULL}, {NULL}},
    {"hsdp", {"gpus", "4", "gpus-per-node", "2", "method", "hsdp", NULL}, {NULL}},
    {"megatron tp",
     {"gpus", "2", "tp", "2", NULL},
     {"optimizer", "optimizer-impl", "zero-grad", "keep-outputs", "checkpointing=sac-op",
      "checkpointing=sac-layer:2", NULL}},
    {"megatron pp",
     {"gpus", "2", "pp", "2", NULL},
     {"optimizer", "optimizer-impl", "zero-grad", "keep-outputs", "checkpointing=sac-op",
      "checkpointing=sac-layer:2", NULL}},
};

/* The settings, each against the default run (AdamW, the version's implementation, one
 * micro-batch, outputs dropped, zero_grad to None, no checkpointing). grad-accum 3: a
 * pipeline's default is pp = 2 micro-batches. */
// clang-format off
static const char *const cells[][2] = {
    {"optimizer", "sgd"},
    {"optimizer", "sgd-momentum"},
    {"optimizer", "adafactor"},
    {"optimizer", "adamw-8bit"},
    {"optimizer-impl", "for-loop"},
    {"optimizer-impl", "fused"},
    {"grad-accum", "3"},
    {"keep-outputs", "true"},
    {"zero-grad", "zero"},
    {"checkpointing", "full"},
    {"checkpointing", "selective"},
    {"checkpointing", "sac-op"},
    {"checkpointing", "sac-layer:2"},
};
// clang-format on

/* GPT-2's trace (seq 64, two steps) with the method's settings plus (key, value) when key is
 * not NULL, or NULL with *error. */
static MemsimTrace *generate(const Method *me, const char *key, const char *value, GError **error)
{
    MemsimModel *m = memsim_model_load("gpt2", error);
    cr_assert(m, "gpt2: %s", (*error)->message);
    MemsimRun run = memsim_run_defaults();
    const char *base[] = {"seq", "64", "steps", "2", NULL};
    for (const char *const *s = base; *s; s += 2)
        cr_assert(memsim_run_set(&run, s[0], s[1], error));
    for (const char *const *s = me->settings; *s; s += 2)
        cr_assert(memsim_run_set(&run, s[0], s[1], error), "%s", me->name);
    if (key)
        cr_assert(memsim_run_set(&run, key, value, error), "%s=%s", key, value);
    MemsimTrace *t = memsim_generate(m, &run, error);
    memsim_run_clear(&run);
    memsim_model_free(m);
    return t;
}

static gboolean same_events(MemsimTrace *a, MemsimTrace *b, guint32 rank)
{
    gsize na, nb;
    const MemsimEvent *ea = memsim_trace_events(a, rank, &na);
    const MemsimEvent *eb = memsim_trace_events(b, rank, &nb);
    if (na != nb)
        return FALSE;
    for (gsize i = 0; i < na; i++)
        if (ea[i].kind != eb[i].kind || ea[i].category != eb[i].category ||
            ea[i].stream != eb[i].stream || ea[i].flags != eb[i].flags || ea[i].id != eb[i].id ||
            ea[i].size != eb[i].size || ea[i].addr != eb[i].addr || ea[i].aux != eb[i].aux)
            return FALSE;
    return TRUE;
}

/* Whether two generated traces are the same program: ranks, events, the op table. */
static gboolean same_trace(MemsimTrace *a, MemsimTrace *b)
{
    const MemsimTraceHeader *ha = memsim_trace_header(a), *hb = memsim_trace_header(b);
    if (ha->n_ranks != hb->n_ranks || ha->n_ops != hb->n_ops)
        return FALSE;
    for (guint32 r = 0; r < ha->n_ranks; r++)
        if (!same_events(a, b, r))
            return FALSE;
    for (guint32 i = 0; i < ha->n_ops; i++) {
        const MemsimOpInfo *x = &ha->ops[i], *y = &hb->ops[i];
        if (strcmp(ha->strings[x->name], hb->strings[y->name]) != 0 || x->phase != y->phase ||
            x->layer != y->layer || x->microbatch != y->microbatch ||
            x->duration_us != y->duration_us)
            return FALSE;
    }
    return TRUE;
}

static gboolean refuses(const Method *me, const char *key, const char *value)
{
    g_autofree char *kv = g_strdup_printf("%s=%s", key, value);
    for (const char *const *k = me->refused; *k; k++)
        if (strcmp(*k, key) == 0 || strcmp(*k, kv) == 0)
            return TRUE;
    return FALSE;
}

Test(settings_matrix, every_setting_changes_the_trace_or_is_refused, .timeout = 300)
{
    for (gsize i = 0; i < G_N_ELEMENTS(methods); i++) {
        const Method *me = &methods[i];
        GError *error = NULL;
        MemsimTrace *base = generate(me, NULL, NULL, &error);
        cr_assert(base, "%s: %s", me->name, error ? error->message : "?");
        for (gsize j = 0; j < G_N_ELEMENTS(cells); j++) {
            const char *key = cells[j][0], *value = cells[j][1];
            MemsimTrace *t = generate(me, key, value, &error);
            if (refuses(me, key, value)) {
                cr_expect(!t, "%s: %s %s was accepted; its framework decides it", me->name, key,
                          value);
                if (!t) {
                    cr_expect(error && error->domain == MEMSIM_ERROR &&
                                  error->code == MEMSIM_ERROR_BAD_INPUT,
                              "%s: %s %s", me->name, key, value);
                    gchar *prefix = g_strdup_printf("%s: ", key);
                    cr_expect(g_str_has_prefix(error->message, prefix), "%s: %s %s refused as '%s'",
                              me->name, key, value, error->message);
                    g_free(prefix);
                }
            } else {
                cr_expect(t, "%s: %s %s refused: %s", me->name, key, value,
                          error ? error->message : "?");
                if (t)
                    cr_expect(!same_trace(base, t), "%s: %s %s accepted and ignored", me->name, key,
                              value);
            }
            memsim_trace_free(t);
            g_clear_error(&error);
        }
        memsim_trace_free(base);
    }
}

/* The optimizer-state bytes (requested) at the last optimizer step of rank 0. */
static int64_t optimizer_state(const Method *me, const char *optimizer)
{
    GError *error = NULL;
    MemsimTrace *t = generate(me, "optimizer", optimizer, &error);
    cr_assert(t, "%s %s: %s", me->name, optimizer, error ? error->message : "?");
    MemsimReport *rep = memsim_replay_trace(t, NULL, &error);
    cr_assert(rep, "%s", error ? error->message : "?");
    int64_t bytes = -1;
    const MemsimRankReport *r = &rep->ranks[0];
    for (guint i = 0; i < r->n_breakdowns; i++)
        if (strstr(r->breakdowns[i].name, "model state"))
            bytes = (int64_t)r->breakdowns[i].requested[MEMSIM_CAT_OPTIMIZER_STATE];
    cr_assert_geq(bytes, 0, "%s %s: no model-state breakdown", me->name, optimizer);
    memsim_report_free(rep);
    memsim_trace_free(t);
    return bytes;
}

static const Method *method(const char *name)
{
    for (gsize i = 0; i < G_N_ELEMENTS(methods); i++)
        if (strcmp(methods[i].name, name) == 0)
            return &methods[i];
    cr_assert_fail("no method %s", name);
    return NULL;
}

/* torch.optim on fp32 parameters (bf16 autocast): SGD keeps nothing, SGD with momentum one
 * momentum_buffer, AdamW exp_avg and exp_avg_sq — on one GPU and on each DDP replica.
 * Adafactor factors a matrix's second moment into its row and column means (fp32) and keeps a
 * vector's whole: GPT-2's matrices are wte 50257×768, wpe 1024×768 and per layer c_attn
 * 768×2304, c_proj 768×768, c_fc 768×3072, c_proj 3072×768; its vectors the per-layer biases
 * (2304 + 768 + 3072 + 768) and norms (4·768), and ln_f (2·768). */
Test(settings_matrix, replica_optimizer_state, .timeout = 120)
{
    int64_t factored = (50257 + 768) + (1024 + 768) + 2 * 768 +
                       12 * ((768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768) +
                             (2304 + 768 + 3072 + 768) + 4 * 768);
    const char *names[] = {"one GPU", "ddp"};
    for (gsize i = 0; i < G_N_ELEMENTS(names); i++) {
        const Method *me = method(names[i]);
        cr_expect_eq(optimizer_state(me, "sgd"), 0, "%s sgd", names[i]);
        cr_expect_eq(optimizer_state(me, "sgd-momentum"), 4 * GPT2_PSI, "%s sgd-momentum",
                     names[i]);
        cr_expect_eq(optimizer_state(me, "adamw"), 8 * GPT2_PSI, "%s adamw", names[i]);
        cr_expect_eq(optimizer_state(me, "adafactor"), 4 * factored, "%s adafactor", names[i]);
    }
}

/* DeepSpeed (N = 2): the fp32 master partition P = psi_pad/N (psi padded to a multiple of
 * 2N), the optimizer stepping it as one flat 1-D tensor: AdamW two fp32 moments, SGD none,
 * SGD with momentum one buffer, Adafactor a full (unfactored) fp32 second moment,
 * bitsandbytes' 8-bit AdamW two uint8 states and two fp32 scales per 2048-element block. */
Test(settings_matrix, zero_partition_optimizer_state, .timeout = 120)
{
    const int64_t N = 2;
    int64_t pad = (GPT2_PSI + 2 * N - 1) / (2 * N) * (2 * N);
    int64_t P = pad / N;
    struct {
        const char *optimizer;
        int64_t bytes;
    } want[] = {
        {"adamw", 4 * P + 2 * 4 * P},
        {"sgd", 4 * P},
        {"sgd-momentum", 4 * P + 4 * P},
        {"adafactor", 4 * P + 4 * P},
        {"adamw-8bit", 4 * P + 2 * P + 2 * 4 * ((P + 2047) / 2048)},
    };
    const char *names[] = {"zero1", "zero2", "zero3"};
    for (gsize i = 0; i < G_N_ELEMENTS(names); i++)
        for (gsize j = 0; j < G_N_ELEMENTS(want); j++) {
            int64_t got = optimizer_state(method(names[i]), want[j].optimizer);
            cr_expect_eq(got, want[j].bytes, "%s %s: %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT,
                         names[i], want[j].optimizer, got, want[j].bytes);
        }
}

/* FSDP (N = 2): one FlatParameter per layer and the root (embeddings, final norm), each rank's
 * fp32 shard S = ⌈numel/N⌉ per unit; torch.optim steps the shards (1-D). */
Test(settings_matrix, fsdp_shard_optimizer_state, .timeout = 120)
{
    const int64_t N = 2;
    int64_t S = 12 * ((GPT2_LAYER + N - 1) / N) + (GPT2_ROOT + N - 1) / N;
    struct {
        const char *optimizer;
        int64_t bytes;
    } want[] = {
        {"adamw", 8 * S},
        {"sgd", 0},
        {"sgd-momentum", 4 * S},
        {"adafactor", 4 * S},
        {"adamw-8bit", 2 * S + 2 * 4 *
                                   (12 * (((GPT2_LAYER + N - 1) / N + 2047) / 2048) +
                                    ((GPT2_ROOT + N - 1) / N + 2047) / 2048)},
    };
    const char *names[] = {"fsdp", "fsdp-grad-op"};
    for (gsize i = 0; i < G_N_ELEMENTS(names); i++)
        for (gsize j = 0; j < G_N_ELEMENTS(want); j++) {
            int64_t got = optimizer_state(method(names[i]), want[j].optimizer);
            cr_expect_eq(got, want[j].bytes, "%s %s: %" G_GINT64_FORMAT " want %" G_GINT64_FORMAT,
                         names[i], want[j].optimizer, got, want[j].bytes);
        }
}

/* --moe-imbalance, a model's setting rather than the loop's: every method refuses it for
 * GPT-2, which has no routed experts, naming it; with a small Mixtral (its experts run one by
 * one on their rows, traces/models.c model_expert_rows) each method that runs the model at
 * all changes its trace under it, and takes 1 as the uniform default it is. */
Test(settings_matrix, moe_imbalance_needs_routed_experts, .timeout = 300)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *cfg = g_build_filename(dir, "mixtral.json", NULL);
    cr_assert(g_file_set_contents(
        cfg,
        "{\"model_type\": \"mixtral\", \"vocab_size\": 256, \"hidden_size\": 64, "
        "\"intermediate_size\": 256, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"num_local_experts\": 4, \"num_experts_per_tok\": 2}",
        -1, NULL));
    for (gsize i = 0; i < G_N_ELEMENTS(methods); i++) {
        const Method *me = &methods[i];
        GError *error = NULL;
        MemsimTrace *t = generate(me, "moe-imbalance", "2", &error);
        cr_expect(!t && error && g_str_has_prefix(error->message, "moe-imbalance: "),
                  "%s: gpt2 with moe-imbalance: %s", me->name, error ? error->message : "accepted");
        memsim_trace_free(t);
        g_clear_error(&error);
        MemsimModel *m = memsim_model_load(cfg, &error);
        cr_assert(m, "%s", error ? error->message : "?");
        MemsimTrace *tr[3] = {NULL};
        const char *f[] = {NULL, "1", "2"};
        for (int k = 0; k < 3; k++) {
            MemsimRun run = memsim_run_defaults();
            tu_set(&run, "seq", "64");
            for (const char *const *s = me->settings; *s; s += 2)
                tu_set(&run, s[0], s[1]);
            if (f[k])
                tu_set(&run, "moe-imbalance", f[k]);
            tr[k] = memsim_generate(m, &run, &error);
            memsim_run_clear(&run);
            if (!tr[k]) /* the method does not run this model (Megatron: the experts' TP) */
                cr_expect(k == 0 || !tr[0], "%s: %s", me->name, error->message);
            g_clear_error(&error);
        }
        if (tr[0]) {
            cr_expect(tr[1] && same_trace(tr[0], tr[1]), "%s: moe-imbalance 1 is not uniform",
                      me->name);
            cr_expect(tr[2] && !same_trace(tr[0], tr[2]), "%s: moe-imbalance 2 ignored", me->name);
        }
        for (int k = 0; k < 3; k++)
            memsim_trace_free(tr[k]);
        memsim_model_free(m);
    }
}
