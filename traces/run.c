/* Run semantics (include/memsim/gen.h): the run description, the version rules
 * (AUTOGRAD_MEMORY.md §12), generation, and memsim_generate, which runs one GPU's training
 * through the training loop of traces/loop.c and hands runs on several GPUs to
 * traces/distributed.c.
 */
#include <memsim/alloc.h>
#include <memsim/gen.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "traces/loop.h"
#include "traces/models.h"
#include "traces/settings.h"

MemsimRun memsim_run_defaults(void)
{
    MemsimRun r = {0};
    r.batch = 1;
    r.seq = 2048;
    r.steps = 2;
    r.grad_accum = 1;
    r.precision = MEMSIM_PREC_BF16_MIXED;
    r.optimizer = MEMSIM_OPTIM_ADAMW;
    r.optimizer_impl = MEMSIM_OPTIM_IMPL_DEFAULT;
    r.attention = MEMSIM_ATTN_SDPA;
    r.checkpointing = MEMSIM_CKPT_NONE;
    r.finetune = MEMSIM_FT_FULL;
    r.lora_rank = 16;
    r.use_cache = -1;
    r.prompt = 512;
    r.generate = 128;
    r.gpus = 1;
    r.virtual_stages = 1;
    r.gpus_per_node = 8;
    return r;
}

void memsim_run_clear(MemsimRun *r)
{
    g_strfreev(r->lora_targets);
    g_free(r->torch_version);
    g_free(r->gpu);
    r->lora_targets = NULL;
    r->torch_version = NULL;
    r->gpu = NULL;
}

static gboolean pick(const char *key, const char *v, const char *const *names, int *out,
                     GError **error)
{
    for (int i = 0; names[i]; i++)
        if (g_ascii_strcasecmp(v, names[i]) == 0) {
            *out = i;
            return TRUE;
        }
    g_autofree char *list = g_strjoinv(", ", (char **)names);
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: '%s' is not one of %s", key, v,
                list);
    return FALSE;
}

gboolean setting_int(const char *key, const char *v, int64_t lo, int64_t hi, int64_t *out,
                     GError **error)
{
    char *end = NULL;
    gint64 x = g_ascii_strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: '%s' is not an integer in [%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "]",
                    key, v, lo, hi);
        return FALSE;
    }
    *out = x;
    return TRUE;
}

gboolean setting_bool(const char *key, const char *v, gboolean *out, GError **error)
{
    int i;
    static const char *const names[] = {"false", "true", "no", "yes", "0", "1", NULL};
    if (!pick(key, v, names, &i, error))
        return FALSE;
    *out = i % 2;
    return TRUE;
}

#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Every setting memsim_run_set takes, in the order of the bits of MemsimRun.given. */
static const char *const run_keys[] = {
    "batch", "seq", "steps", "grad-accum", "precision", "optimizer", "optimizer-impl",
    "zero-grad", "attention", "checkpointing", "finetune", "lora-rank", "lora-targets",
    "torch-version", "use-cache", "inference", "prompt", "generate", "weights", "keep-outputs",
    "gpus", "method", "tp", "pp", "dp", "pp-schedule", "microbatches", "virtual-stages",
    "sequence-parallel", "fsdp-wrap", "gpus-per-node", "cublas-workspace", "gpu", "device",
    NULL};

static int run_key_index(const char *key)
{
    for (int i = 0; run_keys[i]; i++)
        if (strcmp(run_keys[i], key) == 0)
            return i;
    return -1;
}

gboolean memsim_run_given(const MemsimRun *run, const char *key)
{
    int i = run_key_index(key);
    return i >= 0 && (run->given >> i & 1);
}

static gboolean run_set_value(MemsimRun *r, const char *key, const char *v, GError **error);

/* FALSE with the known profiles listed for a GPU name memsim has no profile of. */
static gboolean gpu_known(const char *name, GError **error)
{
    if (memsim_gpu_find(name))
        return TRUE;
    g_autofree char *known = memsim_gpu_names();
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "gpu: unknown GPU '%s' (known: %s)",
                name, known);
    return FALSE;
}

gboolean memsim_run_set(MemsimRun *r, const char *key, const char *v, GError **error)
{
    int i = run_key_index(key);
    if (i < 0) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "unknown run setting '%s'", key);
        return FALSE;
    }
    if (!v) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: no value", key);
        return FALSE;
    }
    if (!run_set_value(r, key, v, error))
        return FALSE;
    r->given |= (guint64)1 << i;
    return TRUE;
}

static gboolean run_set_value(MemsimRun *r, const char *key, const char *v, GError **error)
{
    int i;
    int64_t x;
    if (strcmp(key, "batch") == 0) {
        if (!setting_int(key, v, 1, 1 << 20, &x, error))
            return FALSE;
        r->batch = x;
    } else if (strcmp(key, "seq") == 0) {
        if (!setting_int(key, v, 1, 1 << 24, &x, error))
            return FALSE;
        r->seq = x;
    } else if (strcmp(key, "steps") == 0) {
        if (!setting_int(key, v, 1, 1000, &x, error))
            return FALSE;
        r->steps = (int)x;
    } else if (strcmp(key, "grad-accum") == 0) {
        if (!setting_int(key, v, 1, 4096, &x, error))
            return FALSE;
        r->grad_accum = (int)x;
    } else if (strcmp(key, "precision") == 0) {
        if (!pick(key, v, NAMES("fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp16"), &i, error))
            return FALSE;
        r->precision = (MemsimPrecision)i;
    } else if (strcmp(key, "optimizer") == 0) {
        if (!pick(key, v, NAMES("adamw", "sgd", "sgd-momentum", "adafactor", "adamw-8bit"), &i,
                  error))
            return FALSE;
        r->optimizer = (MemsimOptimizer)i;
    } else if (strcmp(key, "optimizer-impl") == 0) {
        if (!pick(key, v, NAMES("default", "for-loop", "foreach", "fused"), &i, error))
            return FALSE;
        r->optimizer_impl = (MemsimOptimizerImpl)i;
    } else if (strcmp(key, "zero-grad") == 0) {
        if (!pick(key, v, NAMES("zero", "none"), &i, error))
            return FALSE;
        r->zero_grad_to_none = i == 1;
        r->zero_grad_set = TRUE;
    } else if (strcmp(key, "attention") == 0) {
        if (!pick(key, v, NAMES("sdpa", "eager", "sdpa-math", "flash", "mem-efficient"), &i,
                  error))
            return FALSE;
        r->attention = (MemsimAttention)i;
    } else if (strcmp(key, "checkpointing") == 0) {
        if (!pick(key, v, NAMES("none", "full", "selective"), &i, error))
            return FALSE;
        r->checkpointing = (MemsimCheckpointing)i;
    } else if (strcmp(key, "finetune") == 0) {
        if (!pick(key, v, NAMES("full", "lora", "qlora"), &i, error))
            return FALSE;
        r->finetune = (MemsimFinetune)i;
    } else if (strcmp(key, "lora-rank") == 0) {
        if (!setting_int(key, v, 1, 65536, &x, error))
            return FALSE;
        r->lora_rank = (int)x;
    } else if (strcmp(key, "lora-targets") == 0) {
        g_strfreev(r->lora_targets);
        r->lora_targets = g_strsplit(v, ",", -1);
        for (char **t = r->lora_targets; *t; t++)
            g_strstrip(*t);
    } else if (strcmp(key, "torch-version") == 0) {
        int maj = 0, min = 0;
        if (sscanf(v, "%d.%d", &maj, &min) != 2 || maj < 1 || (maj == 1 && min < 13) ||
            maj > 2) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "torch-version: '%s' is not a modelled release (1.13, or 2.0 to 2.9)", v);
            return FALSE;
        }
        g_free(r->torch_version);
        r->torch_version = g_strdup(v);
    } else if (strcmp(key, "use-cache") == 0) {
        gboolean b;
        if (!setting_bool(key, v, &b, error))
            return FALSE;
        r->use_cache = b;
    } else if (strcmp(key, "inference") == 0) {
        if (!setting_bool(key, v, &r->inference, error))
            return FALSE;
    } else if (strcmp(key, "prompt") == 0) {
        if (!setting_int(key, v, 1, 1 << 24, &x, error))
            return FALSE;
        r->prompt = x;
    } else if (strcmp(key, "generate") == 0) {
        if (!setting_int(key, v, 0, 1 << 24, &x, error))
            return FALSE;
        r->generate = x;
    } else if (strcmp(key, "weights") == 0) {
        if (!pick(key, v, NAMES("default", "int8", "4bit"), &i, error))
            return FALSE;
        r->weights = (MemsimWeights)i;
    } else if (strcmp(key, "keep-outputs") == 0) {
        if (!setting_bool(key, v, &r->keep_outputs, error))
            return FALSE;
    } else if (strcmp(key, "gpus") == 0) {
        if (!setting_int(key, v, 1, 1 << 20, &x, error))
            return FALSE;
        r->gpus = (int)x;
    } else if (strcmp(key, "method") == 0) {
        if (!pick(key, v,
                  NAMES("none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "hsdp",
                        "megatron"),
                  &i, error))
            return FALSE;
        r->method = (MemsimMethod)i;
    } else if (strcmp(key, "tp") == 0 || strcmp(key, "pp") == 0 || strcmp(key, "dp") == 0) {
        if (!setting_int(key, v, 1, 1 << 20, &x, error))
            return FALSE;
        *(key[0] == 't' ? &r->tp : key[1] == 'p' && key[0] == 'p' ? &r->pp : &r->dp) = (int)x;
    } else if (strcmp(key, "pp-schedule") == 0) {
        if (!pick(key, v, NAMES("1f1b", "gpipe", "interleaved"), &i, error))
            return FALSE;
        r->pp_schedule = (MemsimPipeSchedule)i;
    } else if (strcmp(key, "microbatches") == 0) {
        if (!setting_int(key, v, 1, 1 << 16, &x, error))
            return FALSE;
        r->microbatches = (int)x;
    } else if (strcmp(key, "virtual-stages") == 0) {
        if (!setting_int(key, v, 1, 1024, &x, error))
            return FALSE;
        r->virtual_stages = (int)x;
    } else if (strcmp(key, "sequence-parallel") == 0) {
        if (!setting_bool(key, v, &r->sequence_parallel, error))
            return FALSE;
    } else if (strcmp(key, "fsdp-wrap") == 0) {
        if (!pick(key, v, NAMES("layer", "model"), &i, error))
            return FALSE;
        r->fsdp_wrap_model = i == 1;
    } else if (strcmp(key, "gpus-per-node") == 0) {
        if (!setting_int(key, v, 1, 1024, &x, error))
            return FALSE;
        r->gpus_per_node = (int)x;
    } else if (strcmp(key, "cublas-workspace") == 0) {
        if (!memsim_parse_size_of(key, v, &r->cublas_workspace, error))
            return FALSE;
    } else if (strcmp(key, "gpu") == 0) {
        g_autofree char *name = g_ascii_strdown(v, -1);
        if (!gpu_known(name, error))
            return FALSE;
        g_free(r->gpu);
        r->gpu = g_steal_pointer(&name);
    } else if (strcmp(key, "device") == 0) {
        if (!pick(key, v, NAMES("cuda", "cpu"), &i, error))
            return FALSE;
        r->device_cpu = i == 1;
    } else {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "unknown run setting '%s'", key);
        return FALSE;
    }
    return TRUE;
}

gboolean setting_refuse(GError **error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s", msg);
    return FALSE;
}

/* The distributed programs run the training loop of traces/loop.c, each method stepping the
 * optimizer on what it holds (DDP: torch.optim on the replica; ZeRO: DeepSpeed around the
 * flat fp32 partition; FSDP: torch.optim on the shards; Megatron: the distributed optimizer
 * on the main-parameter shard). A setting that a method's framework decides itself, or does
 * not take, is refused naming it. Without a method (plan's sweep over every method, whose
 * model-state bounds are AdamW's), whatever some method refuses is refused. */
gboolean setting_check_distributed_loop(const MemsimRun *r, gboolean megatron, GError **error)
{
    bool zero = !megatron && (r->method == MEMSIM_METHOD_ZERO1 ||
                              r->method == MEMSIM_METHOD_ZERO2 ||
                              r->method == MEMSIM_METHOD_ZERO3);
    bool sweep = !megatron && r->method == MEMSIM_METHOD_NONE;
    const char *who = megatron ? "Megatron-LM" : zero ? "DeepSpeed" : "a sweep over the methods";
    if (megatron && r->optimizer != MEMSIM_OPTIM_ADAMW)
        return setting_refuse(error, "optimizer: Megatron-LM's distributed optimizer takes only "
                                     "Adam (distrib_optimizer.py asserts it)");
    if (sweep && r->optimizer != MEMSIM_OPTIM_ADAMW)
        return setting_refuse(error, "optimizer: without --method, a run on several GPUs is "
                                     "planned over every method with AdamW's model state "
                                     "(Megatron-LM takes only Adam): give --method");
    if ((zero || megatron || sweep) && r->optimizer_impl != MEMSIM_OPTIM_IMPL_DEFAULT)
        return setting_refuse(error, "optimizer-impl: %s steps its own fused Adam "
                                     "(DeepSpeed's FusedAdam, apex/TE FusedAdam in Megatron-LM); "
                                     "DDP and FSDP take the choice",
                              who);
    if ((zero || megatron || sweep) && r->zero_grad_set && !r->zero_grad_to_none)
        return setting_refuse(error, "zero-grad: %s sets the gradients to None itself after "
                                     "each step (DeepSpeed's engine: zero_grad(set_to_none=True); "
                                     "Megatron-LM: the main grads, its grad buffer zeroed in "
                                     "place); DDP and FSDP take the choice",
                              who);
    if ((megatron || sweep) && r->keep_outputs)
        return setting_refuse(error, "keep-outputs: %s runs Megatron-LM's pipeline schedule, "
                                     "which frees each micro-batch's output itself (the data-"
                                     "parallel methods take it)",
                              megatron ? "a Megatron run" : "a sweep over the methods");
    if (megatron && r->microbatches &&
        (r->grad_accum > 1 || memsim_run_given(r, "grad-accum")) &&
        r->grad_accum != r->microbatches)
        return setting_refuse(error, "grad-accum: a Megatron run accumulates over its "
                                     "micro-batches: --grad-accum %d and --microbatches %d "
                                     "disagree (give one of them)",
                              r->grad_accum, r->microbatches);
    return TRUE;
}

gboolean memsim_run_check(const MemsimRun *r, GError **error)
{
#define GIVEN(k) memsim_run_given(r, k)
    if (r->gpu && !gpu_known(r->gpu, error))
        return FALSE;
    if (r->inference) {
        if (GIVEN("seq"))
            return setting_refuse(error, "seq: an inference run takes --prompt (the prompt's "
                                         "tokens) and --generate (the tokens generated), not "
                                         "--seq");
        /* what only a training step has */
        static const char *const training[] = {
            "steps", "grad-accum", "optimizer", "optimizer-impl", "zero-grad", "checkpointing",
            "finetune", "lora-rank", "lora-targets", "keep-outputs", "method", "tp", "pp", "dp",
            "pp-schedule", "microbatches", "virtual-stages", "sequence-parallel", "fsdp-wrap",
            NULL};
        for (int i = 0; training[i]; i++)
            if (GIVEN(training[i]))
                return setting_refuse(error,
                                      "%s: an inference run has no %s (it is a training setting)",
                                      training[i], training[i]);
    } else {
        static const char *const inference[] = {"prompt", "generate", "weights", NULL};
        for (int i = 0; inference[i]; i++)
            if (GIVEN(inference[i]))
                return setting_refuse(error, "%s: only with --inference (training takes --seq)",
                                      inference[i]);
    }
    if ((GIVEN("lora-rank") || GIVEN("lora-targets")) && r->finetune == MEMSIM_FT_FULL)
        return setting_refuse(error, "%s: only with --finetune lora or qlora",
                              GIVEN("lora-rank") ? "lora-rank" : "lora-targets");
    int tp = r->tp ? r->tp : 1, pp = r->pp ? r->pp : 1;
    bool megatron = r->method == MEMSIM_METHOD_MEGATRON ||
                    (r->method == MEMSIM_METHOD_NONE && (tp > 1 || pp > 1));
    if (GIVEN("sequence-parallel") && r->sequence_parallel && tp < 2)
        return setting_refuse(error,
                              "sequence-parallel: needs tensor parallelism (--tp 2 or more)");
    if (GIVEN("microbatches") && !megatron)
        return setting_refuse(error, "microbatches: Megatron's micro-batches per step need "
                                     "--method megatron or --tp/--pp (elsewhere accumulation is "
                                     "--grad-accum)");
    if (GIVEN("pp-schedule") && !megatron)
        return setting_refuse(error, "pp-schedule: needs a Megatron run (--pp 2 or more)");
    if (GIVEN("virtual-stages") && r->virtual_stages > 1 &&
        r->pp_schedule != MEMSIM_PP_INTERLEAVED)
        return setting_refuse(error, "virtual-stages: only with --pp-schedule interleaved");
    if (GIVEN("fsdp-wrap") && r->method != MEMSIM_METHOD_FSDP &&
        r->method != MEMSIM_METHOD_FSDP_GRAD_OP && r->method != MEMSIM_METHOD_HSDP)
        return setting_refuse(error, "fsdp-wrap: only with --method fsdp, fsdp-grad-op or hsdp");
    bool distributed = r->gpus > 1 || r->method != MEMSIM_METHOD_NONE || tp > 1 || pp > 1;
    if (distributed && !r->inference && !setting_check_distributed_loop(r, megatron, error))
        return FALSE;
    if (r->gpus < 2 && (tp > 1 || pp > 1 || r->dp > 1))
        return setting_refuse(error, "gpus: --tp, --pp and --dp describe a run on several GPUs: "
                                     "give --gpus (tp × pp × dp)");
    if (GIVEN("gpus-per-node") && r->gpus < 2)
        return setting_refuse(error,
                              "gpus-per-node: a run on one GPU has no nodes to span: give --gpus");
#undef GIVEN
    return TRUE;
}

gboolean memsim_run_load_file(MemsimRun *r, const char *path, GError **error)
{
    g_autoptr(GKeyFile) kf = g_key_file_new();
    GError *e = NULL;
    if (!g_key_file_load_from_file(kf, path, G_KEY_FILE_NONE, &e)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s", path, e->message);
        g_error_free(e);
        return FALSE;
    }
    gsize n = 0;
    g_auto(GStrv) keys = g_key_file_get_keys(kf, "run", &n, &e);
    if (!keys) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: %s", path, e->message);
        g_error_free(e);
        return FALSE;
    }
    for (gsize i = 0; i < n; i++) {
        g_autofree char *v = g_key_file_get_string(kf, "run", keys[i], NULL);
        GError *e2 = NULL;
        if (!memsim_run_set(r, keys[i], v ? v : "", &e2)) {
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, "%s: [run] %s", path,
                        e2->message);
            g_error_free(e2);
            return FALSE;
        }
    }
    return TRUE;
}

/* ---- versions ---- */

static AgRules rules_for(const MemsimRun *run)
{
    int maj = 2, min = 8;
    if (run->torch_version)
        sscanf(run->torch_version, "%d.%d", &maj, &min);
    bool v113 = maj == 1;
    AgRules r = {0};
    r.v113 = v113;
    r.mean_saves_input = v113;
    r.embedding_saves_weight = v113;
    r.accumulate_inplace = !v113;
    r.matmul_always_folds = v113;
    r.full_slices_recorded = v113;
    r.checkpoint_early_stop = !v113;
    r.cuda = !run->device_cpu;
    /* CUBLAS_WORKSPACE_CONFIG's default: 4096 KiB × 2 + 16 KiB × 8 before Hopper, 32 MiB on
     * Hopper (sm90) — DISTRIBUTED.md §7.2 */
    bool hopper = run->gpu && (g_str_has_prefix(run->gpu, "h100") || g_str_has_prefix(run->gpu, "h200"));
    r.cublas_workspace = run->cublas_workspace ? run->cublas_workspace
                         : hopper              ? 33554432ull
                                               : 8519680ull;
    return r;
}

static const char *prec_names[] = {"fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp16"};
static const char *optim_names[] = {"adamw", "sgd", "sgd-momentum", "adafactor", "adamw-8bit"};
static const char *impl_names[] = {"default", "for-loop", "foreach", "fused"};
static const char *attn_names[] = {"sdpa", "eager", "sdpa-math", "flash", "mem-efficient"};
static const char *ckpt_names[] = {"none", "full", "selective"};
static const char *ft_names[] = {"full", "lora", "qlora"};

char *memsim_run_describe(const MemsimRun *run)
{
    AgRules rules = rules_for(run);
    GString *s = g_string_new(NULL);
    if (run->inference) {
        g_string_append_printf(s, "inference: batch %" G_GINT64_FORMAT ", prompt %" G_GINT64_FORMAT
                               ", generate %" G_GINT64_FORMAT ", %s weights, attention %s",
                               run->batch, run->prompt, run->generate,
                               run->weights == MEMSIM_WEIGHTS_4BIT  ? "4-bit"
                               : run->weights == MEMSIM_WEIGHTS_INT8 ? "int8"
                                                                     : prec_names[run->precision],
                               attn_names[run->attention]);
    } else {
        g_string_append_printf(
            s, "batch %" G_GINT64_FORMAT ", seq %" G_GINT64_FORMAT "%s, %d step(s), grad-accum %d, "
            "%s, %s (%s), zero_grad %s, attention %s, checkpointing %s, finetune %s",
            run->batch, run->seq,
            /* memsim_run_adapt cut a sequence that was not given */
            !memsim_run_given(run, "seq") && run->seq != memsim_run_defaults().seq
                ? " (the model's context)"
                : "",
            run->steps, run->grad_accum, prec_names[run->precision],
            optim_names[run->optimizer], impl_names[optim_effective_impl(run, &rules)],
            optim_effective_to_none(run, &rules) ? "to None" : "in place", attn_names[run->attention],
            ckpt_names[run->checkpointing], ft_names[run->finetune]);
        if (run->finetune != MEMSIM_FT_FULL) {
            g_autofree char *t = run->lora_targets ? g_strjoinv(",", run->lora_targets) : NULL;
            g_string_append_printf(s, " (rank %d, targets %s)", run->lora_rank, t ? t : "default");
        }
    }
    if (run->gpus > 1 || run->method != MEMSIM_METHOD_NONE || run->tp > 1 || run->pp > 1) {
        static const char *meths[] = {"none", "ddp", "zero1", "zero2", "zero3", "fsdp",
                                      "fsdp-grad-op", "hsdp", "megatron"};
        static const char *scheds[] = {"1f1b", "gpipe", "interleaved"};
        MemsimMethod m = run->method == MEMSIM_METHOD_NONE && (run->tp > 1 || run->pp > 1)
                             ? MEMSIM_METHOD_MEGATRON
                             : run->method;
        g_string_append_printf(s, ", %d GPUs: %s", run->gpus, meths[m]);
        if (m == MEMSIM_METHOD_MEGATRON) {
            int tp = run->tp ? run->tp : 1, pp = run->pp ? run->pp : 1;
            int dp = run->dp ? run->dp : run->gpus / (tp * pp);
            g_string_append_printf(s, " tp %d × pp %d × dp %d", tp, pp, dp);
            if (pp > 1)
                g_string_append_printf(s, ", %s, %d micro-batches", scheds[run->pp_schedule],
                                       run->microbatches ? run->microbatches : pp);
            if (run->sequence_parallel)
                g_string_append(s, ", sequence parallel");
        }
    }
    g_string_append_printf(s, ", torch %s%s", run->torch_version ? run->torch_version : "2.8",
                           run->device_cpu ? " (CPU kernels)" : "");
    return g_string_free(s, FALSE);
}

/* ---- inference ---- */

static gboolean run_inference(Model *md, AgGraph *g, GError **error)
{
    /* generate(): the prompt (prefill), then one token at a time; no grad. With the cache
     * (use_cache, the default) each forward's layers extend the DynamicCache (cache_update in
     * traces/models.c: the prefill's copies, then cat(past, new) per token); without it every
     * token runs the whole sequence again. The forward computes the last position's logits
     * only (generate passes logits_to_keep=1), and generate takes an fp32 copy of them
     * (logits[:, -1, :].to(float32)) for the next token's choice (greedy: argmax). */
    AgContext *c = gg_ctx(g);
    c->grad_enabled = false;
    const MemsimModel *m = md->m;
    bool cache = md->run->use_cache < 0 ? m->use_cache : md->run->use_cache;
    int64_t B = md->run->batch, P = md->run->prompt, N = md->run->generate;
    md->last_logits_only = true;
    c->phase = MEMSIM_PHASE_FORWARD;
    for (int64_t t = 0; t <= N; t++) {
        if (t == 0)
            gg_mark(g, "prefill");
        else if (t == 1)
            gg_mark(g, "decode");
        md->S = t == 0 ? P : cache ? 1 : P + t;
        AgTensor *ids = gg_leaf(g, DT_I64, SHAPE(B, md->S), false, MEMSIM_CAT_INPUT);
        if (t > 0 && cache) {
            /* the past cache goes into this forward; each layer's update consumes its entry */
            GPtrArray *past = md->cache;
            md->past = past;
            md->cache = g_ptr_array_new();
        }
        AgTensor *logits = NULL;
        model_forward(md, ids, NULL, &logits);
        if (md->past) {
            for (guint i = 0; i < md->past->len; i++)
                gt_unref(g, md->past->pdata[i]); /* NULL where consumed */
            g_ptr_array_unref(md->past);
            md->past = NULL;
        }
        if (!cache)
            model_drop_output(md);
        AgTensor *next = op_new(g, "_to_copy", DT_F32, SHAPE(B, m->V));
        gt_unref(g, logits);
        gt_unref(g, ids);
        AgTensor *tok = op_new(g, "argmax", DT_I64, SHAPE(B));
        gt_unref(g, next);
        gt_unref(g, tok);
    }
    model_drop_output(md);
    (void)error;
    return TRUE;
}

/* ---- the trace ---- */

static bool learned_positions(const MemsimModel *m)
{
    return m->fam == FAM_GPT2 || m->fam == FAM_OPT || m->fam == FAM_GPTNEO;
}

void memsim_run_adapt(MemsimRun *run, const MemsimModel *m)
{
    if (!memsim_run_given(run, "seq") && learned_positions(m) && run->seq > m->max_pos)
        run->seq = m->max_pos;
    /* Megatron accumulates over its micro-batches (forward_backward_func runs them, the
     * gradients summed in the grad buffer): --grad-accum N without --microbatches is N
     * micro-batches (setting_check_distributed_loop refuses the two disagreeing) */
    bool megatron = run->method == MEMSIM_METHOD_MEGATRON ||
                    (run->method == MEMSIM_METHOD_NONE && (run->tp > 1 || run->pp > 1));
    if (megatron && !run->inference && !run->microbatches &&
        (run->grad_accum > 1 || memsim_run_given(run, "grad-accum")))
        run->microbatches = run->grad_accum;
}

/* The work a run asks for, bounded before any is done: the largest tensor it makes (the fp32
 * logits, an MLP activation, eager attention's scores), which no device holds beyond 2^50
 * bytes, and the events of its trace, which the generator keeps in memory (40 bytes each) —
 * about 600 per layer and micro-batch of training (and 150 more per MoE expert), 200 per layer
 * and token step of generation (measured on the presets: 526 for Llama-2-7B, 622 with
 * checkpointing, 1576 for Mixtral's 8 experts, 126 per decode step). */
#define MAX_TENSOR_BYTES 1125899906842624.0 /* 2^50 */
#define MAX_EVENTS 1.5e8                    /* 6 GB of events */

static gboolean within_bounds(const MemsimModel *m, const MemsimRun *run, GError **error)
{
    double B = (double)run->batch;
    double S = run->inference ? (double)(run->prompt + run->generate) : (double)run->seq;
    double width = MAX((double)m->V, (double)m->I);
    double largest = MAX(B * S * width * 4.0, B * (double)m->nh * S * S * 4.0);
    if (largest > MAX_TENSOR_BYTES) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: batch %" G_GINT64_FORMAT " × %.0f tokens makes a tensor of %.3g bytes, "
                    "beyond any device (2^50 bytes)",
                    run->inference ? "prompt + generate" : "seq", run->batch, S, largest);
        return FALSE;
    }
    /* Megatron's micro-batches are its accumulation (memsim_generate) */
    double micro = (double)run->steps * (run->microbatches ? run->microbatches : run->grad_accum);
    double per_layer = 600.0 + 150.0 * (double)m->n_experts;
    double events = run->inference ? (double)(run->generate + 1) * (double)m->L * 200.0
                                   : micro * (double)m->L * per_layer;
    if (events > MAX_EVENTS) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: about %.3g events to simulate (%.0f GB of trace held in memory), "
                    "beyond the %.3g this machine's memory allows: give fewer %s",
                    run->inference ? "generate" : "steps", events, events * 40.0 / 1e9,
                    MAX_EVENTS,
                    run->inference ? "generated tokens (--generate)"
                                   : "steps (--steps), micro-batches (--grad-accum, "
                                     "--microbatches) or layers");
        return FALSE;
    }
    return TRUE;
}

MemsimTrace *memsim_generate(const MemsimModel *m, const MemsimRun *run_in, GError **error)
{
    if (!memsim_run_check(run_in, error))
        return NULL;
    MemsimRun adapted = *run_in;
    memsim_run_adapt(&adapted, m);
    const MemsimRun *run = &adapted;
    bool learned_pos = learned_positions(m);
    int64_t len = run->inference ? run->prompt + run->generate : run->seq;
    if (learned_pos && len > m->max_pos) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: %" G_GINT64_FORMAT " tokens exceed the model's %" G_GINT64_FORMAT
                    " learned positions (max_position_embeddings)",
                    run->inference ? "prompt + generate" : "seq", len, m->max_pos);
        return NULL;
    }
    if (run->inference && run->finetune != MEMSIM_FT_FULL) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "finetune: inference takes no fine-tuning method");
        return NULL;
    }
    if (!within_bounds(m, run, error))
        return NULL;
    AgRules rules = rules_for(run);
    g_autofree char *desc = memsim_run_describe(run);
    g_autofree char *name = g_strdup_printf("%s: %s", m->name, desc);
    MemsimTrace *t = memsim_trace_new(name);
    MemsimRun eff = *run;
    g_auto(GStrv) split = NULL;
    if (run->finetune != MEMSIM_FT_FULL && !run->lora_targets) {
        split = g_strsplit(model_lora_default_targets(m->fam), ",", -1);
        eff.lora_targets = split;
    }
    if (run->gpus > 1 || run->method != MEMSIM_METHOD_NONE || run->tp > 1 || run->pp > 1) {
        if (!memsim_generate_distributed(m, &eff, t, &rules, error)) {
            memsim_trace_free(t);
            return NULL;
        }
        return t;
    }
    memsim_trace_add_rank(t, 0, 1);
    AgGraph *g = gg_new(t, 0, &rules);
    gg_set_gpu(g, memsim_gpu_find(run->gpu), run->precision == MEMSIM_PREC_FP32);
    Model md;
    if (!model_build(&md, g, m, &eff, error)) {
        model_clear(&md);
        gg_free(g);
        memsim_trace_free(t);
        return NULL;
    }
    if (eff.inference) {
        run_inference(&md, g, error);
    } else {
        Optimizer o;
        optimizer_init(&o, &eff, &rules);
        loop_train(&md, &o, NULL);
        optimizer_clear(g, &o);
    }
    gg_teardown(g);
    model_clear(&md);
    gg_free(g);
    return t;
}
