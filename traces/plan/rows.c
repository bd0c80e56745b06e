/* The planner's rows (memsim/plan.h): each candidate that fits (and each close miss) as a
 * row with its figures, its label, the command that re-estimates it and its recipe for
 * the frameworks, sorted best first. */
#include <memsim/estimate.h>
#include <memsim/deepspeed.h>
#include <memsim/megatron.h>
#include <memsim/plan.h>

#include <math.h>
#include <string.h>

#include "traces/deepspeed.h"
#include "traces/model.h"
#include "traces/plan/sweep.h"
#include "traces/settings.h"

const char *const plan_method_names[] = {"one GPU", "ddp",          "zero1", "zero2", "zero3",
                                         "fsdp",    "fsdp-grad-op", "hsdp",  "megatron"};
const char *const plan_ckpt_names[] = {"none", "full", "selective"};
const char *const plan_sched_names[] = {"1f1b", "gpipe", "interleaved"};

void plan_candidate_run(const Sweep *sw, const Group *g, int j, MemsimRun *r)
{
    *r = sw->base;
    r->given = 0; /* a candidate is the planner's, not settings a user gave */
    r->gpu = (char *)sw->gpu_name;
    r->checkpointing = g->ckpt;
    r->batch = g->bs[j];
    /* a Megatron launch keeps its sequence parallelism where there is tensor parallelism */
    r->sequence_parallel = sw->base.megatron && sw->base.sequence_parallel && g->tp > 1;
    r->tp = r->pp = r->dp = 0;
    r->microbatches = 0;
    r->virtual_stages = 1;
    r->pp_schedule = MEMSIM_PP_1F1B;
    r->grad_accum = 1;
    if (sw->offload && sw->ds_offload)
        r->deepspeed = sw->ds_offload;
    if (g->method == MEMSIM_METHOD_NONE) {
        r->gpus = 1;
        r->method = MEMSIM_METHOD_NONE;
        r->grad_accum = g->n_micro[j];
    } else if (g->method == MEMSIM_METHOD_MEGATRON) {
        r->gpus = sw->opt.gpus;
        r->method = MEMSIM_METHOD_MEGATRON;
        r->tp = g->tp;
        r->pp = g->pp;
        r->dp = g->dp;
        r->pp_schedule = g->schedule;
        r->virtual_stages = g->v;
        r->microbatches = g->n_micro[j];
    } else {
        r->gpus = sw->opt.gpus;
        r->method = g->method;
        r->grad_accum = g->n_micro[j];
    }
}

static char *size_flag(memsim_size_t b)
{
    if (b % ((memsim_size_t)1 << 20) == 0)
        return g_strdup_printf("%" G_GUINT64_FORMAT "MiB", b >> 20);
    return g_strdup_printf("%" G_GUINT64_FORMAT, b);
}

static void flag(GString *s, const char *name, const char *value)
{
    g_string_append_printf(s, " --%s", name);
    if (value) {
        g_autofree char *q = g_shell_quote(value);
        gboolean plain = TRUE;
        for (const char *c = value; *c; c++)
            if (!g_ascii_isalnum(*c) && !strchr("-_.,:/=+", *c))
                plain = FALSE;
        g_string_append_printf(s, " %s", plain && *value ? value : q);
    }
}

static void flag_int(GString *s, const char *name, int64_t v)
{
    char buf[32];
    g_snprintf(buf, sizeof buf, "%" G_GINT64_FORMAT, v);
    flag(s, name, buf);
}

/* The time model's settings a run was given (--efficiency, --network-gbs). */
static void time_flags(GString *s, const MemsimRun *r)
{
    char buf[G_ASCII_DTOSTR_BUF_SIZE];
    if (r->compute_efficiency > 0)
        flag(s, setting_name(SETTING_EFFICIENCY), g_ascii_formatd(buf, sizeof buf, "%g", r->compute_efficiency));
    if (r->network_gbs > 0)
        flag(s, setting_name(SETTING_NETWORK_GBS), g_ascii_formatd(buf, sizeof buf, "%g", r->network_gbs));
}

/* The `memsim estimate` command of a run: every setting that is not the default. A Megatron
 * launch's run is re-estimated from the launch, its layout set as the recipe says. */
static char *command_of(const Sweep *sw, const MemsimRun *r, memsim_size_t gpu_mem,
                        gboolean expandable)
{
#define VALUE(id, v) setting_value_name(id, (int)(v))
    MemsimRun d = memsim_run_defaults();
    GString *s = g_string_new("memsim estimate");
    if (r->megatron) {
        flag(s, "megatron-args", r->megatron->source);
        if (!memsim_megatron_sets(r->megatron, "gpus"))
            flag_int(s, setting_name(SETTING_GPUS), r->gpus);
        if (r->steps != d.steps)
            flag_int(s, setting_name(SETTING_STEPS), r->steps);
        if (r->torch_version)
            flag(s, setting_name(SETTING_TORCH_VERSION), r->torch_version);
        flag(s, setting_name(SETTING_GPU), r->gpu);
        time_flags(s, r);
        g_autofree char *mem = size_flag(gpu_mem);
        flag(s, "gpu-mem", mem);
        if (sw->ctx != MEMSIM_ESTIMATE_CONTEXT_DEFAULT) {
            g_autofree char *c = size_flag(sw->ctx);
            flag(s, "cuda-context", c);
        }
        if (sw->opt.nccl_bytes) {
            g_autofree char *n = size_flag(sw->opt.nccl_bytes);
            flag(s, "nccl-mem", n);
        }
        if (expandable)
            flag(s, "alloc-conf", "expandable_segments:True");
        g_string_append(s, "  # with the recipe's flags in the launch");
        return g_string_free(s, FALSE);
    }
    flag(s, "model", memsim_model_name(sw->model));
    /* a DeepSpeed config: the file, its overrides, and the batch as its keys (a --batch
     * beside a config that gives train_micro_batch_size_per_gpu would be a contradiction) */
    const MemsimDeepspeed *ds = r->deepspeed;
#define DS_SETS(name) (ds && memsim_deepspeed_sets(ds, name))
    if (ds) {
        flag(s, "deepspeed-config", ds->source);
        for (int i = 0; ds->sets && ds->sets[i]; i++)
            flag(s, "deepspeed-set", ds->sets[i]);
        g_autofree char *mb = g_strdup_printf("train_micro_batch_size_per_gpu=%" G_GINT64_FORMAT,
                                              r->batch);
        g_autofree char *ga = g_strdup_printf("gradient_accumulation_steps=%d", r->grad_accum);
        flag(s, "deepspeed-set", mb);
        flag(s, "deepspeed-set", ga);
    }
    if (r->gpus > 1 || (ds && r->gpus != 1))
        flag_int(s, setting_name(SETTING_GPUS), r->gpus);
    if (r->method != MEMSIM_METHOD_NONE && !ds)
        flag(s, setting_name(SETTING_METHOD), VALUE(SETTING_METHOD, r->method));
    if (r->method == MEMSIM_METHOD_MEGATRON) {
        flag_int(s, setting_name(SETTING_TP), r->tp);
        flag_int(s, setting_name(SETTING_PP), r->pp);
        flag_int(s, setting_name(SETTING_DP), r->dp);
        if (r->pp > 1)
            flag(s, setting_name(SETTING_PP_SCHEDULE), VALUE(SETTING_PP_SCHEDULE, r->pp_schedule));
        if (r->virtual_stages > 1)
            flag_int(s, setting_name(SETTING_VIRTUAL_STAGES), r->virtual_stages);
        flag_int(s, setting_name(SETTING_MICROBATCHES), r->microbatches);
    }
    if (!ds)
        flag_int(s, setting_name(SETTING_BATCH), r->batch);
    if (r->grad_accum != 1 && !ds)
        flag_int(s, setting_name(SETTING_GRAD_ACCUM), r->grad_accum);
    flag_int(s, setting_name(SETTING_SEQ), r->seq);
    flag(s, setting_name(SETTING_CHECKPOINTING), VALUE(SETTING_CHECKPOINTING, r->checkpointing));
    if (r->steps != d.steps)
        flag_int(s, setting_name(SETTING_STEPS), r->steps);
    if (r->precision != d.precision && !DS_SETS("precision"))
        flag(s, setting_name(SETTING_PRECISION), VALUE(SETTING_PRECISION, r->precision));
    if (r->optimizer != d.optimizer && !DS_SETS("optimizer"))
        flag(s, setting_name(SETTING_OPTIMIZER), VALUE(SETTING_OPTIMIZER, r->optimizer));
#undef DS_SETS
    if (r->optimizer_impl != d.optimizer_impl)
        flag(s, setting_name(SETTING_OPTIMIZER_IMPL), VALUE(SETTING_OPTIMIZER_IMPL, r->optimizer_impl));
    if (r->zero_grad_set)
        flag(s, setting_name(SETTING_ZERO_GRAD), r->zero_grad_to_none ? "none" : "zero");
    if (r->attention != d.attention)
        flag(s, setting_name(SETTING_ATTENTION), VALUE(SETTING_ATTENTION, r->attention));
    if (r->finetune != d.finetune) {
        flag(s, setting_name(SETTING_FINETUNE), VALUE(SETTING_FINETUNE, r->finetune));
        if (r->lora_rank != d.lora_rank)
            flag_int(s, setting_name(SETTING_LORA_RANK), r->lora_rank);
        if (r->lora_targets) {
            g_autofree char *t = g_strjoinv(",", r->lora_targets);
            flag(s, setting_name(SETTING_LORA_TARGETS), t);
        }
    }
    if (r->torch_version)
        flag(s, setting_name(SETTING_TORCH_VERSION), r->torch_version);
    if (r->use_cache >= 0)
        flag(s, setting_name(SETTING_USE_CACHE), r->use_cache ? "true" : "false");
    if (r->keep_outputs)
        flag(s, setting_name(SETTING_KEEP_OUTPUTS), "true");
    if (r->device_cpu)
        flag(s, setting_name(SETTING_DEVICE), "cpu");
    if (r->fsdp_wrap_model &&
        (r->method == MEMSIM_METHOD_FSDP || r->method == MEMSIM_METHOD_FSDP_GRAD_OP ||
         r->method == MEMSIM_METHOD_HSDP)) {
        g_autofree char *w =
            r->fsdp_wrap_model == 3
                ? g_strdup_printf("size:%" G_GINT64_FORMAT, r->fsdp_wrap_min_params)
                : g_strdup(setting_value_name(SETTING_FSDP_WRAP, r->fsdp_wrap_model));
        flag(s, setting_name(SETTING_FSDP_WRAP), w);
    }
    if (r->gpus_per_node != d.gpus_per_node)
        flag_int(s, setting_name(SETTING_GPUS_PER_NODE), r->gpus_per_node);
    flag(s, setting_name(SETTING_GPU), r->gpu);
    time_flags(s, r);
    if (r->cublas_workspace) {
        g_autofree char *w = size_flag(r->cublas_workspace);
        flag(s, setting_name(SETTING_CUBLAS_WORKSPACE), w);
    }
    g_autofree char *mem = size_flag(gpu_mem);
    flag(s, "gpu-mem", mem);
    if (sw->ctx != MEMSIM_ESTIMATE_CONTEXT_DEFAULT) {
        g_autofree char *c = size_flag(sw->ctx);
        flag(s, "cuda-context", c);
    }
    if (sw->opt.nccl_bytes) {
        g_autofree char *n = size_flag(sw->opt.nccl_bytes);
        flag(s, "nccl-mem", n);
    }
    if (expandable)
        flag(s, "alloc-conf", "expandable_segments:True");
    return g_string_free(s, FALSE);
#undef VALUE
}

/* The configuration in the words of the framework that runs it. */
static char *recipe_of(const Sweep *sw, const Group *g, int j, gboolean expandable,
                       gboolean offload)
{
    const MemsimRun *b = &sw->base;
    GString *s = g_string_new(NULL);
    int64_t mb = g->bs[j];
    int acc = g->n_micro[j];
    const char *ckpt_hf = g->ckpt == MEMSIM_CKPT_FULL ? "gradient_checkpointing=True"
                          : g->ckpt == MEMSIM_CKPT_SELECTIVE
                              ? "selective recomputation of the attention core"
                              : "no activation checkpointing";
    const char *prec = b->precision == MEMSIM_PREC_FP32 ? "fp32"
                       : b->precision == MEMSIM_PREC_FP16_MIXED || b->precision == MEMSIM_PREC_FP16
                           ? "fp16"
                           : "bf16";
    switch (g->method) {
    case MEMSIM_METHOD_NONE:
        if (g->replicas)
            g_string_append_printf(
                s,
                "torchrun --nproc_per_node %d (DDP over %d independent "
                "replicas of the single-GPU run); ",
                sw->opt.gpus < b->gpus_per_node ? sw->opt.gpus : b->gpus_per_node, sw->opt.gpus);
        g_string_append_printf(s,
                               "Trainer: per_device_train_batch_size=%" G_GINT64_FORMAT
                               ", gradient_accumulation_steps=%d, %s=True, %s",
                               mb, acc, prec, ckpt_hf);
        if (b->finetune != MEMSIM_FT_FULL)
            g_string_append_printf(
                s, ", peft LoRA r=%d%s", b->lora_rank,
                b->finetune == MEMSIM_FT_QLORA ? " on a 4-bit (bitsandbytes nf4) base" : "");
        break;
    case MEMSIM_METHOD_DDP:
        g_string_append_printf(s,
                               "torchrun, DistributedDataParallel (bucket_cap_mb=25) over %d "
                               "GPUs: per-GPU batch %" G_GINT64_FORMAT
                               ", gradient_accumulation_steps=%d "
                               "(no_sync between), autocast %s, %s",
                               sw->opt.gpus, mb, acc, prec, ckpt_hf);
        break;
    case MEMSIM_METHOD_ZERO1:
    case MEMSIM_METHOD_ZERO2:
    case MEMSIM_METHOD_ZERO3:
        if (b->deepspeed) {
            g_string_append_printf(s,
                                   "DeepSpeed: %s with train_micro_batch_size_per_gpu=%" G_GINT64_FORMAT
                                   ", gradient_accumulation_steps=%d, %s%s",
                                   b->deepspeed->source, mb, acc, ckpt_hf,
                                   offload ? ", zero_optimization.offload_optimizer.device=cpu" : "");
            break;
        }
        g_string_append_printf(s,
                               "DeepSpeed: zero_optimization.stage=%d, "
                               "train_micro_batch_size_per_gpu=%" G_GINT64_FORMAT
                               ", gradient_accumulation_steps=%d, %s.enabled=true, %s%s",
                               g->method == MEMSIM_METHOD_ZERO1   ? 1
                               : g->method == MEMSIM_METHOD_ZERO2 ? 2
                                                                  : 3,
                               mb, acc, prec, ckpt_hf,
                               offload ? ", offload_optimizer.device=cpu" : "");
        break;
    case MEMSIM_METHOD_FSDP:
    case MEMSIM_METHOD_FSDP_GRAD_OP:
    case MEMSIM_METHOD_HSDP:
        g_string_append_printf(
            s,
            "torchrun, FSDP: sharding_strategy=%s, auto_wrap_policy="
            "transformer decoder layer, MixedPrecision(param_dtype=%s), "
            "per-GPU batch %" G_GINT64_FORMAT ", gradient_accumulation_steps=%d, %s%s",
            g->method == MEMSIM_METHOD_FSDP           ? "FULL_SHARD"
            : g->method == MEMSIM_METHOD_FSDP_GRAD_OP ? "SHARD_GRAD_OP"
                                                      : "HYBRID_SHARD",
            prec, mb, acc, ckpt_hf,
            offload ? ", optimizer state on the CPU (DeepSpeed-style offload)" : "");
        break;
    case MEMSIM_METHOD_MEGATRON: {
        int64_t G = (int64_t)g->dp * mb * acc;
        if (b->megatron) {
            /* the launch's flags, its layout and batch changed */
            g_string_append_printf(s,
                                   "%s with: --tensor-model-parallel-size %d "
                                   "--pipeline-model-parallel-size %d",
                                   b->megatron->source, g->tp, g->pp);
            if (g->schedule == MEMSIM_PP_INTERLEAVED)
                g_string_append_printf(s, " --num-virtual-stages-per-pipeline-rank %d", g->v);
            g_string_append_printf(s,
                                   " --micro-batch-size %" G_GINT64_FORMAT
                                   " --global-batch-size %" G_GINT64_FORMAT,
                                   mb, G);
            if (g->ckpt != b->checkpointing)
                g_string_append_printf(s, " (recomputation: %s)", plan_ckpt_names[g->ckpt]);
            if (g->schedule == MEMSIM_PP_GPIPE)
                g_string_append(s, " (all-forward-all-backward schedule, GPipe)");
            if (offload)
                g_string_append(s, " --optimizer-cpu-offload");
            break;
        }
        g_string_append_printf(s,
                               "Megatron-LM: --tensor-model-parallel-size %d "
                               "--pipeline-model-parallel-size %d",
                               g->tp, g->pp);
        if (g->schedule == MEMSIM_PP_INTERLEAVED)
            g_string_append_printf(s, " --num-layers-per-virtual-pipeline-stage %" G_GINT64_FORMAT,
                                   sw->model->L / (g->pp * g->v));
        g_string_append_printf(s,
                               " --micro-batch-size %" G_GINT64_FORMAT
                               " --global-batch-size %" G_GINT64_FORMAT
                               " --seq-length %" G_GINT64_FORMAT " --%s "
                               "--use-distributed-optimizer",
                               mb, G, b->seq, prec);
        if (g->ckpt == MEMSIM_CKPT_FULL)
            g_string_append(s, " --recompute-granularity full --recompute-method uniform");
        else if (g->ckpt == MEMSIM_CKPT_SELECTIVE)
            g_string_append(s, " --recompute-granularity selective");
        if (g->schedule == MEMSIM_PP_GPIPE)
            g_string_append(s, " (all-forward-all-backward schedule, GPipe)");
        if (offload)
            g_string_append(s, " --optimizer-cpu-offload");
        break;
    }
    default:
        break;
    }
    if (expandable)
        g_string_append(s, "; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
    return g_string_free(s, FALSE);
}

static char *label_of(const Sweep *sw, const Group *g)
{
    if (g->method == MEMSIM_METHOD_NONE)
        return g_strdup(g->replicas ? "replicas" : "one GPU");
    if (g->method != MEMSIM_METHOD_MEGATRON)
        return g_strdup(plan_method_names[g->method]);
    /* a Megatron launch's context parallelism, kept in every layout */
    int cp = sw->base.megatron ? sw->base.megatron->o.cp : 1;
    g_autofree char *cps = cp > 1 ? g_strdup_printf(" cp%d", cp) : g_strdup("");
    if (g->pp == 1)
        return g_strdup_printf("megatron tp%d%s dp%d", g->tp, cps, g->dp);
    return g_strdup_printf("megatron tp%d pp%d%s dp%d %s", g->tp, g->pp, cps, g->dp,
                           plan_sched_names[g->schedule]);
}

static void make_row(const Sweep *sw, const Group *g, int j, gboolean miss, MemsimPlanRow *row)
{
    const Probe *p = &g->probes[j];
    const CostResult *c = &g->cost[j];
    memset(row, 0, sizeof *row);
    row->label = label_of(sw, g);
    row->method = g->method;
    row->replicas = g->replicas;
    row->tp = g->tp;
    row->pp = g->pp;
    row->dp = g->replicas_n;
    row->schedule = g->schedule;
    row->virtual_stages = g->v;
    row->batch = g->bs[j];
    row->grad_accum = g->n_micro[j];
    row->global_batch = (int64_t)g->replicas_n * g->bs[j] * g->n_micro[j];
    row->checkpointing = g->ckpt;
    row->expandable = p->expandable;
    row->offload = sw->offload;
    row->host_bytes = sw->offload || sw->base.deepspeed ? p->host : 0;
    row->step_s = c->step_s;
    row->tokens_per_s = c->tokens_per_s;
    if (miss && !c->simulated && p->measured && p->step_s > 0) {
        /* a miss measured without a memory limit: its simulated step */
        row->step_s = p->step_s;
        row->tokens_per_s = c->tokens / p->step_s;
    } else if (!(row->step_s > 0)) {
        /* no bound known (the cost model overestimated this sweep's steps): its guess */
        row->step_s = c->model_step_s;
        row->tokens_per_s = c->tokens / c->model_step_s;
    }
    row->compute_s = c->compute_s + c->recompute_s;
    row->comm_s = c->comm_s;
    row->bubble_s = c->bubble_s;
    row->optimizer_s = c->optimizer_s + c->other_s;
    if (c->simulated) {
        row->time_simulated = TRUE;
        row->sim_compute_s = p->parts.compute_us / 1e6;
        row->sim_memory_s = p->parts.memory_us / 1e6;
        row->sim_overhead_s = p->parts.overhead_us / 1e6;
        row->sim_waiting_s = p->parts.waiting_us / 1e6;
        row->sim_bubble_s = p->parts.bubble_us / 1e6;
    }
    if (miss && !p->done) {
        /* not simulated: the model-state bound ruled the layout out */
        row->peak = g->bound;
        row->bound_only = TRUE;
    } else {
        row->peak = p->peak;
        row->n_ranks = p->n_ranks;
        row->ranks = g_new0(MemsimPlanRank, p->n_ranks ? p->n_ranks : 1);
        for (guint32 i = 0; i < p->n_ranks; i++) {
            row->ranks[i] = p->ranks[i];
            row->ranks[i].role = g_strdup(p->ranks[i].role);
        }
    }
    row->headroom = (int64_t)sw->gpu_mem - (int64_t)row->peak;
    MemsimRun r;
    plan_candidate_run(sw, g, j, &r);
    row->command = command_of(sw, &r, sw->gpu_mem, p->expandable);
    row->recipe = recipe_of(sw, g, j, p->expandable, sw->offload);
}

void plan_row_clear(MemsimPlanRow *r)
{
    g_free(r->label);
    for (guint32 i = 0; i < r->n_ranks; i++)
        g_free(r->ranks[i].role);
    g_free(r->ranks);
    g_free(r->command);
    g_free(r->recipe);
}

typedef struct {
    const Group *g;
    int j;
    double tps;
    memsim_size_t peak;
    int64_t miss;
} Ranked;

static int by_row(gconstpointer a, gconstpointer b)
{
    const Ranked *x = a, *y = b;
    if (x->tps != y->tps)
        return x->tps > y->tps ? -1 : 1;
    if (x->peak != y->peak)
        return x->peak < y->peak ? -1 : 1;
    return x->g->idx - y->g->idx;
}

static int by_row_peak_first(gconstpointer a, gconstpointer b)
{
    const Ranked *x = a, *y = b;
    if (x->peak != y->peak)
        return x->peak < y->peak ? -1 : 1;
    return by_row(a, b);
}

static int by_miss(gconstpointer a, gconstpointer b)
{
    const Ranked *x = a, *y = b;
    if (x->miss != y->miss)
        return x->miss < y->miss ? -1 : 1;
    return x->g->idx - y->g->idx;
}

/* The ranked rows and the closest misses of the last phase. */
/* The rows that fit, best first (all of them: the caller keeps its K). */
static GArray *fitting_rows(const Sweep *sw)
{
    GArray *rows = g_array_new(FALSE, FALSE, sizeof(Ranked));
    for (int k = 0; k < sw->n_fams; k++) {
        if (sw->fams[k].row < 0)
            continue;
        const Group *g = &sw->groups[sw->fams[k].row];
        Ranked r = {g, g->row, g->cost[g->row].tokens_per_s, g->probes[g->row].peak, 0};
        g_array_append_val(rows, r);
    }
    g_array_sort(rows, by_row);
    return rows;
}

/* The misses shown: configurations whose smallest micro-batch does not fit but would beat
 * the recommendation (all of them when nothing fits). Such configurations are never pruned
 * by cost, so which they are does not depend on timing; the fastest are kept. */
static GArray *shown_misses(const Sweep *sw, const GArray *rows)
{
    double best = rows->len ? g_array_index(rows, Ranked, 0).tps : 0;
    GArray *misses = g_array_new(FALSE, FALSE, sizeof(Ranked));
    for (int i = 0; i < sw->n_groups; i++) {
        const Group *g = &sw->groups[i];
        if (g->nb == 0 || !g->miss || g->probes[0].failed)
            continue;
        /* measured: its simulated speed; else its guess (a bound, or none known) */
        const Probe *p = &g->probes[0];
        double tps = p->measured && p->step_s > 0 ? g->cost[0].tokens / p->step_s
                                                  : g->cost[0].tokens_per_s;
        if (!isfinite(tps)) /* no bound known: the cost model's guess, as its row shows it */
            tps = g->cost[0].tokens / g->cost[0].model_step_s;
        if (rows->len && !(tps > best))
            continue;
        /* the model-state bound's misses (not simulated) only after the simulated ones */
        Ranked k = {g, 0, tps, g->pruned_bound, 0};
        g_array_append_val(misses, k);
    }
    g_array_sort(misses, by_row_peak_first);
    g_array_set_size(misses, MIN(misses->len, (guint)(sw->opt.misses > 0 ? sw->opt.misses : 0)));
    return misses;
}

GPtrArray *plan_misses_to_measure(const Sweep *sw)
{
    GArray *rows = fitting_rows(sw);
    GArray *misses = shown_misses(sw, rows);
    GPtrArray *todo = g_ptr_array_new();
    for (guint i = 0; i < misses->len; i++) {
        Group *g = (Group *)g_array_index(misses, Ranked, i).g;
        if (!g->pruned_bound && !g->probes[0].measured)
            g_ptr_array_add(todo, g);
    }
    g_array_unref(rows);
    g_array_unref(misses);
    return todo;
}

void plan_collect(Sweep *sw, MemsimPlanRow **rows_out, guint *n_rows, MemsimPlanRow **miss_out,
                  guint *n_misses)
{
    GArray *rows = fitting_rows(sw);
    guint keep = sw->K == G_MAXINT ? rows->len : MIN(rows->len, (guint)sw->K);
    GArray *misses = shown_misses(sw, rows);
    guint nm = misses->len;
    for (guint i = 0; i < nm; i++) {
        Ranked *k = &g_array_index(misses, Ranked, i);
        Group *g = (Group *)k->g;
        memsim_size_t need = g->probes[0].done ? g->probes[0].peak : g->bound;
        k->peak = need;
        k->miss = (int64_t)need - (int64_t)sw->gpu_mem;
    }
    g_array_sort(misses, by_miss);
    *rows_out = g_new0(MemsimPlanRow, keep ? keep : 1);
    for (guint i = 0; i < keep; i++) {
        Ranked *k = &g_array_index(rows, Ranked, i);
        make_row(sw, k->g, k->j, FALSE, &(*rows_out)[i]);
    }
    *n_rows = keep;
    *miss_out = g_new0(MemsimPlanRow, nm ? nm : 1);
    for (guint i = 0; i < nm; i++) {
        Ranked *k = &g_array_index(misses, Ranked, i);
        make_row(sw, k->g, 0, TRUE, &(*miss_out)[i]);
    }
    *n_misses = nm;
    g_array_unref(rows);
    g_array_unref(misses);
}

