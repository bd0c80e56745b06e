/* A DeepSpeed config (ds_config.json) read into a MemsimRun and the ZeRO options the
 * generator follows (traces/deepspeed.h).
 *
 * The keys and their defaults are DeepSpeed's: deepspeed/runtime/zero/config.py
 * (DeepSpeedZeroConfig: stage 0, contiguous_gradients True, reduce_scatter True,
 * reduce_bucket_size and allgather_bucket_size 5e8, overlap_comm None → stage 3 only
 * (overlap_comm_valid), sub_group_size 1e9, stage3_prefetch_bucket_size 5e7,
 * stage3_param_persistence_threshold 1e5, stage3_max_live_parameters and
 * stage3_max_reuse_distance 1e9; partial offload (ratio < 1) stage 3 only,
 * offload_ratio_check), zero/offload_config.py (device none|cpu|nvme, pin_memory False,
 * ratio 1.0), runtime/config.py (fp16/bf16 both enabled is an error; the batch triple
 * train_batch_size = micro × accumulation × world size, _batch_assertion and
 * _set_batch_related_parameters). One table below lists every key memsim knows, with what it
 * does with it: mapped, taken as changing no memory, or refused as not modelled. */
#include <memsim/deepspeed.h>

#include <json-glib/json-glib.h>
#include <string.h>

#include "traces/deepspeed.h"
#include "traces/settings.h"

#define BAD(...) g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT, __VA_ARGS__)

typedef enum {
    K_MAPPED,  /* read by the code below */
    K_NEUTRAL, /* changes no GPU or host memory of the training step */
    K_REFUSED, /* changes memory in a way memsim does not model: refused when "on" */
} KeyKind;

typedef struct {
    const char *path; /* "zero_optimization.stage" */
    KeyKind kind;
    const char *why; /* K_REFUSED: what is not modelled */
} DsKey;

/* Every key memsim knows. A K_REFUSED key is refused only when its value turns the feature on
 * (true, a device other than none, a size above 1, an enabled section): off, it is taken. */
static const DsKey keys[] = {
    /* the batch (runtime/config.py) */
    {"train_batch_size", K_MAPPED, NULL},
    {"train_micro_batch_size_per_gpu", K_MAPPED, NULL},
    {"gradient_accumulation_steps", K_MAPPED, NULL},
    /* precision (runtime/config.py get_fp16_enabled, get_bfloat16_enabled; fp16/loss_scaler.py:
     * the loss scale is a host number) */
    {"fp16", K_MAPPED, NULL},
    {"fp16.enabled", K_MAPPED, NULL},
    {"fp16.auto_cast", K_REFUSED, "fp16.auto_cast (fp16 autocast of an fp32 module)"},
    {"fp16.loss_scale", K_NEUTRAL, NULL},
    {"fp16.initial_scale_power", K_NEUTRAL, NULL},
    {"fp16.loss_scale_window", K_NEUTRAL, NULL},
    {"fp16.hysteresis", K_NEUTRAL, NULL},
    {"fp16.consecutive_hysteresis", K_NEUTRAL, NULL},
    {"fp16.min_loss_scale", K_NEUTRAL, NULL},
    {"fp16.fp16_master_weights_and_grads", K_REFUSED, "fp16 master weights and gradients"},
    {"bf16", K_MAPPED, NULL},
    {"bf16.enabled", K_MAPPED, NULL},
    {"bf16.immediate_grad_update", K_NEUTRAL, NULL},
    {"bf16.check_grad_overflow", K_NEUTRAL, NULL},
    {"amp", K_MAPPED, NULL},
    {"amp.enabled", K_REFUSED, "apex AMP"},
    {"amp.opt_level", K_NEUTRAL, NULL},
    {"torch_autocast", K_MAPPED, NULL},
    {"torch_autocast.enabled", K_REFUSED, "torch_autocast (autocast of an fp32 module)"},
    {"torch_autocast.dtype", K_NEUTRAL, NULL},
    {"communication_data_type", K_MAPPED, NULL},
    {"data_types", K_MAPPED, NULL},
    {"data_types.grad_accum_dtype", K_MAPPED, NULL},
    /* the optimizer (runtime/engine.py _configure_basic_optimizer) */
    {"optimizer", K_MAPPED, NULL},
    {"optimizer.type", K_MAPPED, NULL},
    {"optimizer.params", K_NEUTRAL, NULL},
    {"zero_allow_untested_optimizer", K_NEUTRAL, NULL},
    {"zero_force_ds_cpu_optimizer", K_NEUTRAL, NULL},
    {"scheduler", K_NEUTRAL, NULL},
    {"gradient_clipping", K_MAPPED, NULL},
    {"prescale_gradients", K_NEUTRAL, NULL},
    {"gradient_predivide_factor", K_NEUTRAL, NULL},
    {"sparse_gradients", K_REFUSED, "sparse gradients"},
    /* ZeRO (zero/config.py) */
    {"zero_optimization", K_MAPPED, NULL},
    {"zero_optimization.stage", K_MAPPED, NULL},
    {"zero_optimization.contiguous_gradients", K_MAPPED, NULL},
    {"zero_optimization.reduce_scatter", K_MAPPED, NULL},
    {"zero_optimization.reduce_bucket_size", K_MAPPED, NULL},
    {"zero_optimization.use_multi_rank_bucket_allreduce", K_NEUTRAL, NULL},
    {"zero_optimization.allgather_partitions", K_NEUTRAL, NULL},
    {"zero_optimization.allgather_bucket_size", K_MAPPED, NULL},
    {"zero_optimization.overlap_comm", K_MAPPED, NULL},
    {"zero_optimization.load_from_fp32_weights", K_NEUTRAL, NULL},
    {"zero_optimization.elastic_checkpoint", K_NEUTRAL, NULL},
    {"zero_optimization.offload_param", K_MAPPED, NULL},
    {"zero_optimization.offload_param.device", K_MAPPED, NULL},
    {"zero_optimization.offload_param.pin_memory", K_MAPPED, NULL},
    {"zero_optimization.offload_param.nvme_path", K_NEUTRAL, NULL},
    {"zero_optimization.offload_param.buffer_count", K_NEUTRAL, NULL},
    {"zero_optimization.offload_param.buffer_size", K_NEUTRAL, NULL},
    {"zero_optimization.offload_param.max_in_cpu", K_NEUTRAL, NULL},
    {"zero_optimization.offload_optimizer", K_MAPPED, NULL},
    {"zero_optimization.offload_optimizer.device", K_MAPPED, NULL},
    {"zero_optimization.offload_optimizer.pin_memory", K_MAPPED, NULL},
    {"zero_optimization.offload_optimizer.ratio", K_MAPPED, NULL},
    {"zero_optimization.offload_optimizer.nvme_path", K_NEUTRAL, NULL},
    {"zero_optimization.offload_optimizer.buffer_count", K_NEUTRAL, NULL},
    {"zero_optimization.offload_optimizer.pipeline_read", K_NEUTRAL, NULL},
    {"zero_optimization.offload_optimizer.pipeline_write", K_NEUTRAL, NULL},
    {"zero_optimization.offload_optimizer.fast_init", K_NEUTRAL, NULL},
    {"zero_optimization.sub_group_size", K_MAPPED, NULL},
    {"zero_optimization.cpu_offload", K_MAPPED, NULL},
    {"zero_optimization.cpu_offload_param", K_MAPPED, NULL},
    {"zero_optimization.cpu_offload_use_pin_memory", K_MAPPED, NULL},
    {"zero_optimization.prefetch_bucket_size", K_MAPPED, NULL},
    {"zero_optimization.stage3_prefetch_bucket_size", K_MAPPED, NULL},
    {"zero_optimization.param_persistence_threshold", K_MAPPED, NULL},
    {"zero_optimization.stage3_param_persistence_threshold", K_MAPPED, NULL},
    {"zero_optimization.model_persistence_threshold", K_MAPPED, NULL},
    {"zero_optimization.stage3_model_persistence_threshold", K_MAPPED, NULL},
    {"zero_optimization.max_live_parameters", K_MAPPED, NULL},
    {"zero_optimization.stage3_max_live_parameters", K_MAPPED, NULL},
    {"zero_optimization.max_reuse_distance", K_MAPPED, NULL},
    {"zero_optimization.stage3_max_reuse_distance", K_MAPPED, NULL},
    {"zero_optimization.gather_16bit_weights_on_model_save", K_MAPPED, NULL},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", K_MAPPED, NULL},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", K_MAPPED, NULL},
    {"zero_optimization.stage3_module_granularity_threshold", K_REFUSED,
     "leaf modules by granularity (stage3_module_granularity_threshold)"},
    {"zero_optimization.module_granularity_threshold", K_REFUSED,
     "leaf modules by granularity (module_granularity_threshold)"},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", K_REFUSED,
     "parameter fetch by all-reduce"},
    {"zero_optimization.use_all_reduce_for_fetch_params", K_REFUSED,
     "parameter fetch by all-reduce"},
    {"zero_optimization.ignore_unused_parameters", K_NEUTRAL, NULL},
    {"zero_optimization.legacy_stage1", K_REFUSED, "the legacy stage-1 optimizer"},
    {"zero_optimization.round_robin_gradients", K_NEUTRAL, NULL},
    {"zero_optimization.zero_hpz_partition_size", K_REFUSED,
     "ZeRO++ hierarchical partitioning (a secondary parameter partition)"},
    {"zero_optimization.zero_quantized_weights", K_REFUSED, "ZeRO++ quantized weights"},
    {"zero_optimization.zero_quantized_nontrainable_weights", K_REFUSED,
     "ZeRO++ quantized non-trainable weights"},
    {"zero_optimization.zero_quantized_gradients", K_REFUSED, "ZeRO++ quantized gradients"},
    {"zero_optimization.zeropp_loco_param", K_REFUSED, "ZeRO++ LoCo"},
    {"zero_optimization.mics_shard_size", K_REFUSED, "MiCS sharding"},
    {"zero_optimization.mics_hierarchical_params_gather", K_REFUSED, "MiCS sharding"},
    {"zero_optimization.memory_efficient_linear", K_NEUTRAL, NULL},
    {"zero_optimization.pipeline_loading_checkpoint", K_NEUTRAL, NULL},
    {"zero_optimization.override_module_apply", K_NEUTRAL, NULL},
    {"zero_optimization.log_trace_cache_warnings", K_NEUTRAL, NULL},
    /* activation checkpointing (runtime/activation_checkpointing/config.py): used through
     * deepspeed.checkpointing; what changes memory is refused */
    {"activation_checkpointing", K_MAPPED, NULL},
    {"activation_checkpointing.partition_activations", K_REFUSED,
     "partitioned activation checkpoints"},
    {"activation_checkpointing.cpu_checkpointing", K_REFUSED, "activation checkpoints on the CPU"},
    {"activation_checkpointing.contiguous_memory_optimization", K_REFUSED,
     "contiguous checkpoint buffers"},
    {"activation_checkpointing.number_checkpoints", K_NEUTRAL, NULL},
    {"activation_checkpointing.synchronize_checkpoint_boundary", K_NEUTRAL, NULL},
    {"activation_checkpointing.profile", K_NEUTRAL, NULL},
    /* features that change the model or the data: refused when enabled */
    {"sparse_attention", K_REFUSED, "sparse attention"},
    {"compression_training", K_REFUSED, "compression training"},
    {"curriculum_learning", K_REFUSED, "curriculum learning (the sequence length changes)"},
    {"data_efficiency", K_REFUSED, "data efficiency (the sequence length changes)"},
    {"progressive_layer_drop", K_REFUSED, "progressive layer drop"},
    {"hybrid_engine", K_REFUSED, "the hybrid engine"},
    {"eigenvalue", K_REFUSED, "eigenvalue computation"},
    {"quantize_training", K_REFUSED, "quantize training"},
    {"pipeline", K_REFUSED, "DeepSpeed's pipeline engine"},
    {"tensor_parallel", K_REFUSED, "DeepSpeed's AutoTP training"},
    {"sequence_parallel_size", K_REFUSED, "Ulysses sequence parallelism"},
    {"elasticity", K_REFUSED, "elastic batch sizes"},
    /* logging, monitoring, checkpoints, I/O: no memory of the step */
    {"steps_per_print", K_NEUTRAL, NULL},
    {"wall_clock_breakdown", K_NEUTRAL, NULL},
    {"dump_state", K_NEUTRAL, NULL},
    {"memory_breakdown", K_NEUTRAL, NULL},
    {"flops_profiler", K_NEUTRAL, NULL},
    {"comms_logger", K_NEUTRAL, NULL},
    {"tensorboard", K_NEUTRAL, NULL},
    {"wandb", K_NEUTRAL, NULL},
    {"csv_monitor", K_NEUTRAL, NULL},
    {"comet", K_NEUTRAL, NULL},
    {"monitor_config", K_NEUTRAL, NULL},
    {"autotuning", K_NEUTRAL, NULL},
    {"checkpoint", K_NEUTRAL, NULL},
    {"aio", K_NEUTRAL, NULL},
    {"dataloader_drop_last", K_NEUTRAL, NULL},
    {"disable_allgather", K_NEUTRAL, NULL},
    {"seed", K_NEUTRAL, NULL},
    {"logging", K_NEUTRAL, NULL},
    {"timers", K_NEUTRAL, NULL},
    {"compile", K_REFUSED, "torch.compile through the engine"},
};

static const DsKey *key_find(const char *path)
{
    for (gsize i = 0; i < G_N_ELEMENTS(keys); i++)
        if (strcmp(keys[i].path, path) == 0)
            return &keys[i];
    return NULL;
}

/* Whether `path` is a section: a key of the table is below it. */
static bool is_section(const char *path)
{
    size_t n = strlen(path);
    for (gsize i = 0; i < G_N_ELEMENTS(keys); i++)
        if (strncmp(keys[i].path, path, n) == 0 && keys[i].path[n] == '.')
            return true;
    return false;
}

/* Whether a subtree (a section whose children memsim does not read) is taken whole. */
static bool subtree_whole(const char *path)
{
    const DsKey *k = key_find(path);
    if (!k || k->kind == K_MAPPED)
        return false;
    /* a known section: its children are its own (optimizer.params, scheduler, monitors) */
    return true;
}

/* Whether a value turns a feature on: true, a non-zero number, a non-empty string other than
 * "none", an object whose "enabled" is not false (or that has no "enabled" key). */
static bool value_on(JsonNode *n)
{
    if (JSON_NODE_HOLDS_NULL(n))
        return false;
    if (JSON_NODE_HOLDS_OBJECT(n)) {
        JsonObject *o = json_node_get_object(n);
        if (json_object_has_member(o, "enabled"))
            return value_on(json_object_get_member(o, "enabled"));
        return json_object_get_size(o) > 0;
    }
    if (JSON_NODE_HOLDS_ARRAY(n))
        return json_array_get_length(json_node_get_array(n)) > 0;
    GType t = json_node_get_value_type(n);
    if (t == G_TYPE_BOOLEAN)
        return json_node_get_boolean(n);
    if (t == G_TYPE_INT64)
        return json_node_get_int(n) != 0;
    if (t == G_TYPE_DOUBLE)
        return json_node_get_double(n) != 0;
    if (t == G_TYPE_STRING) {
        const char *s = json_node_get_string(n);
        return *s && g_ascii_strcasecmp(s, "none") != 0 && g_ascii_strcasecmp(s, "false") != 0;
    }
    return true;
}

typedef struct {
    const char *where;
    GHashTable *values; /* path → JsonNode (borrowed from the parser) */
    GPtrArray *unknown; /* paths */
    GError **error;
    bool failed;
} Walk;

/* Records every leaf (and section) by its dotted path; unknown keys collected, a refused
 * feature that is on refused at once. */
static void walk(Walk *w, const char *prefix, JsonObject *o)
{
    GList *members = json_object_get_members(o);
    for (GList *l = members; l && !w->failed; l = l->next) {
        const char *name = l->data;
        g_autofree char *path = *prefix ? g_strdup_printf("%s.%s", prefix, name) : g_strdup(name);
        JsonNode *n = json_object_get_member(o, name);
        const DsKey *k = key_find(path);
        if (!k) {
            /* zero_optimization's deprecated stage3_ spellings are in the table; anything else
             * is unknown */
            g_ptr_array_add(w->unknown, g_strdup(path));
            continue;
        }
        if (k->kind == K_REFUSED) {
            /* the limits that are "on" at their default: a size > 1, a threshold > 0 */
            bool on = value_on(n);
            if (strcmp(path, "zero_optimization.zero_hpz_partition_size") == 0)
                on = JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_INT64 &&
                     json_node_get_int(n) > 1;
            if (strcmp(path, "zero_optimization.mics_shard_size") == 0)
                on = JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_INT64 &&
                     json_node_get_int(n) > 0;
            if (on) {
                g_set_error(w->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                            "%s: %s: %s is not modelled", w->where, path, k->why);
                w->failed = true;
            }
            continue;
        }
        if (k->kind == K_MAPPED && is_section(path) && !JSON_NODE_HOLDS_OBJECT(n) &&
            !JSON_NODE_HOLDS_NULL(n)) {
            g_set_error(w->error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "%s: %s: expected an object ({…})", w->where, path);
            w->failed = true;
            continue;
        }
        g_hash_table_insert(w->values, g_strdup(path), n);
        if (JSON_NODE_HOLDS_OBJECT(n) && !subtree_whole(path))
            walk(w, path, json_node_get_object(n));
    }
    g_list_free(members);
}

/* ---- typed values ---- */

typedef struct {
    const char *where;
    GHashTable *values;
    GError **error;
} Reader;

static JsonNode *get(Reader *r, const char *path)
{
    return g_hash_table_lookup(r->values, path);
}

static bool is_auto(JsonNode *n)
{
    return n && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING &&
           strcmp(json_node_get_string(n), "auto") == 0;
}

/* An integer (numbers as DeepSpeed writes them: 5e8, 500000000, "5e8" is not taken).
 * *out keeps its value when the key is absent; DS_AUTO for "auto" where `auto_ok`. */
static gboolean get_int(Reader *r, const char *path, int64_t min, bool auto_ok, int64_t *out)
{
    JsonNode *n = get(r, path);
    if (!n)
        return TRUE;
    GError **error = r->error;
    if (is_auto(n)) {
        if (!auto_ok) {
            BAD("%s: %s: \"auto\" is filled in by Hugging Face's Trainer only where it has a "
                "value; give a number",
                r->where, path);
            return FALSE;
        }
        *out = DS_AUTO;
        return TRUE;
    }
    if (JSON_NODE_HOLDS_VALUE(n)) {
        GType t = json_node_get_value_type(n);
        double v = t == G_TYPE_INT64    ? (double)json_node_get_int(n)
                   : t == G_TYPE_DOUBLE ? json_node_get_double(n)
                                        : -1e300;
        if (v != -1e300 && v == (double)(int64_t)v && v >= (double)min && v < 9.2e18) {
            *out = (int64_t)v;
            return TRUE;
        }
    }
    BAD("%s: %s: expected an integer of at least %" G_GINT64_FORMAT, r->where, path, min);
    return FALSE;
}

static gboolean get_bool(Reader *r, const char *path, bool *out, bool *set)
{
    JsonNode *n = get(r, path);
    if (!n)
        return TRUE;
    if (JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_BOOLEAN) {
        *out = json_node_get_boolean(n);
        if (set)
            *set = true;
        return TRUE;
    }
    if (is_auto(n) && set) { /* left to the run */
        return TRUE;
    }
    GError **error = r->error;
    BAD("%s: %s: expected true or false", r->where, path);
    return FALSE;
}

static gboolean get_string(Reader *r, const char *path, const char **out)
{
    JsonNode *n = get(r, path);
    if (!n)
        return TRUE;
    if (JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING) {
        *out = json_node_get_string(n);
        return TRUE;
    }
    GError **error = r->error;
    BAD("%s: %s: expected a string", r->where, path);
    return FALSE;
}

/* offload_*.device: none, cpu; nvme refused (memsim models no NVMe tier: its pinned
 * buffer_count × buffer_size staging and the swapper's buffers are not generated). */
static gboolean get_device(Reader *r, const char *path, bool *cpu)
{
    const char *d = NULL;
    if (!get_string(r, path, &d))
        return FALSE;
    GError **error = r->error;
    if (!d || g_ascii_strcasecmp(d, "none") == 0) {
        *cpu = false;
    } else if (g_ascii_strcasecmp(d, "cpu") == 0) {
        *cpu = true;
    } else if (g_ascii_strcasecmp(d, "nvme") == 0) {
        BAD("%s: %s: nvme: offloading to NVMe (ZeRO-Infinity's swapper) is not modelled; use "
            "cpu",
            r->where, path);
        return FALSE;
    } else {
        BAD("%s: %s: '%s' is not one of none, cpu, nvme", r->where, path, d);
        return FALSE;
    }
    return TRUE;
}

/* A dtype name as DeepSpeed takes it (runtime/config.py get_communication_data_type,
 * DtypeEnum): fp32, fp16, bf16 and their spellings. */
static int dtype_of(const char *s)
{
    static const char *const f32[] = {"fp32", "float32", "float", "torch.float32", NULL};
    static const char *const f16[] = {"fp16", "float16", "half", "torch.float16", NULL};
    static const char *const b16[] = {"bf16", "bfloat16", "torch.bfloat16", NULL};
    for (int i = 0; f32[i]; i++)
        if (g_ascii_strcasecmp(s, f32[i]) == 0)
            return 32;
    for (int i = 0; f16[i]; i++)
        if (g_ascii_strcasecmp(s, f16[i]) == 0)
            return 16;
    for (int i = 0; b16[i]; i++)
        if (g_ascii_strcasecmp(s, b16[i]) == 0)
            return 17;
    return 0;
}

static gboolean read_config(MemsimDeepspeed *ds, Reader *r)
{
    GError **error = r->error;
    DsZero *z = &ds->z;
    /* zero/config.py defaults */
    int64_t stage = 0;
    z->reduce_bucket = 500000000;
    z->allgather_bucket = 500000000;
    z->contiguous_gradients = true;
    z->reduce_scatter = true;
    z->prefetch_bucket = 50000000;
    z->max_live = 1000000000;
    z->max_reuse = 1000000000;
    z->persist_threshold = 100000;
    z->model_persist_threshold = G_MAXINT64;
    z->sub_group = 1000000000;
    if (!get_int(r, "zero_optimization.stage", 0, false, &stage))
        return FALSE;
    if (stage > 3) {
        BAD("%s: zero_optimization.stage: %" G_GINT64_FORMAT " is not a ZeRO stage (0-3)", r->where,
            stage);
        return FALSE;
    }
    if (stage == 0) {
        /* the engine's own data parallelism (and BF16_Optimizer for bf16) is not DDP's */
        BAD("%s: zero_optimization.stage: 0 (DeepSpeed's data parallelism without ZeRO, and its "
            "bf16 optimizer's fp32 gradient accumulation) is not modelled; use stage 1, 2 or 3, "
            "or memsim --method ddp",
            r->where);
        return FALSE;
    }
    z->stage = (int)stage;
    bool overlap_set = false, ov = false;
    if (!get_int(r, "zero_optimization.reduce_bucket_size", 1, true, &z->reduce_bucket) ||
        !get_int(r, "zero_optimization.allgather_bucket_size", 1, false, &z->allgather_bucket) ||
        !get_bool(r, "zero_optimization.contiguous_gradients", &z->contiguous_gradients, NULL) ||
        !get_bool(r, "zero_optimization.reduce_scatter", &z->reduce_scatter, NULL) ||
        !get_bool(r, "zero_optimization.overlap_comm", &ov, &overlap_set) ||
        !get_int(r, "zero_optimization.sub_group_size", 1, false, &z->sub_group))
        return FALSE;
    z->overlap_comm = overlap_set ? ov : z->stage == 3;
    /* stage-3 keys, each under its two spellings (the alias wins as pydantic takes it) */
    static const struct {
        const char *a, *b;
        size_t off;
        bool auto_ok;
    } s3[] = {
        {"zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
         G_STRUCT_OFFSET(DsZero, prefetch_bucket), true},
        {"zero_optimization.param_persistence_threshold",
         "zero_optimization.stage3_param_persistence_threshold",
         G_STRUCT_OFFSET(DsZero, persist_threshold), true},
        {"zero_optimization.model_persistence_threshold",
         "zero_optimization.stage3_model_persistence_threshold",
         G_STRUCT_OFFSET(DsZero, model_persist_threshold), false},
        {"zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters",
         G_STRUCT_OFFSET(DsZero, max_live), false},
        {"zero_optimization.max_reuse_distance", "zero_optimization.stage3_max_reuse_distance",
         G_STRUCT_OFFSET(DsZero, max_reuse), false},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(s3); i++) {
        int64_t *dst = G_STRUCT_MEMBER_P(z, s3[i].off);
        if (!get_int(r, s3[i].a, 0, s3[i].auto_ok, dst) ||
            !get_int(r, s3[i].b, 0, s3[i].auto_ok, dst))
            return FALSE;
    }
    /* offload (offload_config.py); the deprecated cpu_offload / cpu_offload_param /
     * cpu_offload_use_pin_memory booleans (config.py) mean device cpu */
    bool dep_opt = false, dep_param = false, dep_pin = false;
    double ratio = 1.0;
    if (!get_device(r, "zero_optimization.offload_optimizer.device", &z->offload_optimizer) ||
        !get_bool(r, "zero_optimization.offload_optimizer.pin_memory", &z->offload_optimizer_pin,
                  NULL) ||
        !get_device(r, "zero_optimization.offload_param.device", &z->offload_param) ||
        !get_bool(r, "zero_optimization.offload_param.pin_memory", &z->offload_param_pin, NULL) ||
        !get_bool(r, "zero_optimization.cpu_offload", &dep_opt, NULL) ||
        !get_bool(r, "zero_optimization.cpu_offload_param", &dep_param, NULL) ||
        !get_bool(r, "zero_optimization.cpu_offload_use_pin_memory", &dep_pin, NULL))
        return FALSE;
    JsonNode *rn = get(r, "zero_optimization.offload_optimizer.ratio");
    if (rn) {
        if (!JSON_NODE_HOLDS_VALUE(rn) || (json_node_get_value_type(rn) != G_TYPE_DOUBLE &&
                                           json_node_get_value_type(rn) != G_TYPE_INT64)) {
            BAD("%s: zero_optimization.offload_optimizer.ratio: expected a number in [0, 1]",
                r->where);
            return FALSE;
        }
        ratio = json_node_get_value_type(rn) == G_TYPE_DOUBLE ? json_node_get_double(rn)
                                                              : (double)json_node_get_int(rn);
    }
    z->offload_optimizer |= dep_opt;
    z->offload_param |= dep_param;
    if (dep_pin) {
        z->offload_optimizer_pin |= dep_opt;
        z->offload_param_pin |= dep_param;
    }
    if (ratio < 1.0 && z->stage != 3) {
        BAD("%s: zero_optimization.offload_optimizer.ratio %g with zero_optimization.stage %d: "
            "partial offloading is for stage 3 only (zero/config.py offload_ratio_check)",
            r->where, ratio, z->stage);
        return FALSE;
    }
    if (z->offload_optimizer && ratio < 1.0) {
        BAD("%s: zero_optimization.offload_optimizer.ratio %g: partial optimizer offload (Twin-"
            "Flow) is not modelled; use 1.0",
            r->where, ratio);
        return FALSE;
    }
    if (z->offload_param && z->stage != 3) {
        BAD("%s: zero_optimization.offload_param with zero_optimization.stage %d: parameters are "
            "offloaded by stage 3 only (DeepSpeed ignores it below, memsim refuses it)",
            r->where, z->stage);
        return FALSE;
    }
    /* precision (runtime/config.py: fp16 and bf16 both enabled is an error) */
    bool fp16 = false, bf16 = false, fp16_set = false, bf16_set = false;
    if (!get_bool(r, "fp16.enabled", &fp16, &fp16_set) ||
        !get_bool(r, "bf16.enabled", &bf16, &bf16_set))
        return FALSE;
    /* neither enabled (absent, or false): DeepSpeed trains in fp32 (get_fp16_enabled and
     * get_bfloat16_enabled default False); "auto" (the Trainer's --fp16/--bf16) leaves the
     * precision to the run */
    if (fp16 && bf16) {
        BAD("%s: fp16.enabled and bf16.enabled: both true; DeepSpeed takes one (runtime/config.py)",
            r->where);
        return FALSE;
    }
    bool autop = is_auto(get(r, "fp16.enabled")) || is_auto(get(r, "bf16.enabled"));
    ds->precision_set = fp16 || bf16 || !autop;
    ds->precision = fp16   ? MEMSIM_PREC_FP16_MIXED
                    : bf16 ? MEMSIM_PREC_BF16_MIXED
                           : MEMSIM_PREC_FP32;
    (void)fp16_set;
    (void)bf16_set;
    /* gradient reduction and accumulation dtypes: the parameters' are modelled (checked
     * against the run's precision by memsim_run_check) */
    const char *cdt = NULL, *gdt = NULL;
    if (!get_string(r, "communication_data_type", &cdt) ||
        !get_string(r, "data_types.grad_accum_dtype", &gdt))
        return FALSE;
    const char *const dkeys[] = {"communication_data_type", "data_types.grad_accum_dtype"};
    const char *dvals[] = {cdt, gdt};
    int *douts[] = {&ds->comm_dtype, &ds->accum_dtype};
    for (int i = 0; i < 2; i++) {
        if (!dvals[i])
            continue;
        *douts[i] = dtype_of(dvals[i]);
        if (!*douts[i]) {
            BAD("%s: %s: '%s' is not one of fp32, fp16, bf16", r->where, dkeys[i], dvals[i]);
            return FALSE;
        }
    }
    /* the batch triple; "auto" leaves it to the run (the Trainer fills it from its args) */
    if (!get_int(r, "train_micro_batch_size_per_gpu", 1, true, &ds->micro) ||
        !get_int(r, "gradient_accumulation_steps", 1, true, &ds->accum) ||
        !get_int(r, "train_batch_size", 1, true, &ds->train_batch))
        return FALSE;
    if (ds->micro == DS_AUTO)
        ds->micro = 0;
    if (ds->accum == DS_AUTO)
        ds->accum = 0;
    if (ds->train_batch == DS_AUTO)
        ds->train_batch = 0;
    if (ds->micro && ds->accum && ds->train_batch && ds->train_batch % (ds->micro * ds->accum)) {
        BAD("%s: train_batch_size %" G_GINT64_FORMAT
            " is not train_micro_batch_size_per_gpu %" G_GINT64_FORMAT
            " × gradient_accumulation_steps %" G_GINT64_FORMAT " × a number of "
            "GPUs (runtime/config.py _batch_assertion)",
            r->where, ds->train_batch, ds->micro, ds->accum);
        return FALSE;
    }
    /* the optimizer: DeepSpeed's (engine.py _configure_basic_optimizer); none given: the
     * client's (the Trainer's AdamW), which the run's --optimizer says */
    const char *ot = NULL;
    if (!get_string(r, "optimizer.type", &ot))
        return FALSE;
    if (ot) {
        static const char *const adam[] = {
            "adam", "adamw", "fusedadam", "cpuadam", "deepspeedcpuadam", NULL};
        bool known = false;
        for (int i = 0; adam[i]; i++)
            known |= g_ascii_strcasecmp(ot, adam[i]) == 0;
        if (known) {
            ds->optimizer = MEMSIM_OPTIM_ADAMW;
        } else if (g_ascii_strcasecmp(ot, "sgd") == 0) {
            /* SGD's params.momentum, default 0 */
            JsonNode *p = get(r, "optimizer.params");
            double mom = 0;
            if (p && JSON_NODE_HOLDS_OBJECT(p)) {
                JsonObject *o = json_node_get_object(p);
                if (json_object_has_member(o, "momentum")) {
                    JsonNode *m = json_object_get_member(o, "momentum");
                    if (JSON_NODE_HOLDS_VALUE(m) && (json_node_get_value_type(m) == G_TYPE_DOUBLE ||
                                                     json_node_get_value_type(m) == G_TYPE_INT64))
                        mom = json_node_get_value_type(m) == G_TYPE_DOUBLE
                                  ? json_node_get_double(m)
                                  : (double)json_node_get_int(m);
                }
            }
            ds->optimizer = mom != 0 ? MEMSIM_OPTIM_SGD_MOMENTUM : MEMSIM_OPTIM_SGD;
        } else {
            BAD("%s: optimizer.type: '%s' is not modelled (Adam, AdamW, SGD are; the state of "
                "Lamb, OneBitAdam, Adagrad, Muon and the others is not)",
                r->where, ot);
            return FALSE;
        }
        ds->optimizer_set = true;
        if ((z->offload_optimizer) && ds->optimizer != MEMSIM_OPTIM_ADAMW) {
            BAD("%s: optimizer.type '%s' with zero_optimization.offload_optimizer: ZeRO-Offload "
                "steps DeepSpeedCPUAdam (stage_1_and_2.py); memsim models Adam there only",
                r->where, ot);
            return FALSE;
        }
    }
    JsonNode *clip = get(r, "gradient_clipping");
    if (clip && JSON_NODE_HOLDS_VALUE(clip) && !is_auto(clip)) {
        GType t = json_node_get_value_type(clip);
        if (t == G_TYPE_DOUBLE)
            ds->clip = json_node_get_double(clip);
        else if (t == G_TYPE_INT64)
            ds->clip = (double)json_node_get_int(clip);
        else {
            BAD("%s: gradient_clipping: expected a number", r->where);
            return FALSE;
        }
    }
    /* the 16-bit gather at save time: memory of saving, not of the step */
    static const char *const save[] = {
        "zero_optimization.gather_16bit_weights_on_model_save",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        "zero_optimization.stage3_gather_fp16_weights_on_model_save"};
    for (gsize i = 0; i < G_N_ELEMENTS(save); i++) {
        bool on = false;
        if (!get_bool(r, save[i], &on, NULL))
            return FALSE;
        if (on && z->stage == 3)
            g_ptr_array_add(ds->warnings,
                            g_strdup_printf("%s: %s: saving gathers the whole model in 16 bits on "
                                            "rank 0 (stage3.py _zero3_consolidated_16bit_state_"
                                            "dict); the estimate is of the training step, not of "
                                            "the save",
                                            r->where, save[i]));
    }
    return TRUE;
}

/* One KEY=VALUE over the config: the dotted key's objects made where missing, the value
 * read as JSON (true, 3, "cpu", {…}) or else taken as a string. */
static gboolean set_key(JsonObject *root, const char *set, const char *where, GError **error)
{
    const char *eq = strchr(set, '=');
    if (!eq || eq == set) {
        BAD("%s: --deepspeed-set '%s': expected KEY=VALUE (zero_optimization.stage=3)", where, set);
        return FALSE;
    }
    g_autofree char *key = g_strndup(set, (gsize)(eq - set));
    g_auto(GStrv) parts = g_strsplit(key, ".", -1);
    JsonObject *o = root;
    for (int i = 0; parts[i + 1]; i++) {
        if (!*parts[i]) {
            BAD("%s: --deepspeed-set '%s': an empty key", where, set);
            return FALSE;
        }
        JsonNode *n = json_object_get_member(o, parts[i]);
        if (!n || !JSON_NODE_HOLDS_OBJECT(n)) {
            json_object_set_object_member(o, parts[i], json_object_new());
            n = json_object_get_member(o, parts[i]);
        }
        o = json_node_get_object(n);
    }
    const char *last = parts[g_strv_length(parts) - 1];
    if (!*last) {
        BAD("%s: --deepspeed-set '%s': an empty key", where, set);
        return FALSE;
    }
    g_autoptr(JsonParser) vp = json_parser_new();
    JsonNode *v = json_parser_load_from_data(vp, eq + 1, -1, NULL) && json_parser_get_root(vp)
                      ? json_node_copy(json_parser_get_root(vp))
                      : NULL;
    if (!v) {
        v = json_node_new(JSON_NODE_VALUE);
        json_node_set_string(v, eq + 1);
    }
    json_object_set_member(o, last, v);
    return TRUE;
}

static MemsimDeepspeed *parse_with(const char *text, const char *where, const char *const *sets,
                                   GError **error)
{
    g_autoptr(JsonParser) parser = json_parser_new();
    GError *e = NULL;
    if (!json_parser_load_from_data(parser, text, -1, &e)) {
        BAD("%s: not JSON: %s", where, e->message);
        g_error_free(e);
        return NULL;
    }
    JsonNode *root = json_parser_get_root(parser);
    if (!root || !JSON_NODE_HOLDS_OBJECT(root)) {
        BAD("%s: a DeepSpeed config is a JSON object", where);
        return NULL;
    }
    for (int i = 0; sets && sets[i]; i++)
        if (!set_key(json_node_get_object(root), sets[i], where, error))
            return NULL;
    MemsimDeepspeed *ds = g_new0(MemsimDeepspeed, 1);
    ds->source = g_strdup(where);
    ds->text = g_strdup(text);
    ds->sets = g_strdupv((char **)sets);
    ds->warnings = g_ptr_array_new_with_free_func(g_free);
    Walk w = {where, g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
              g_ptr_array_new_with_free_func(g_free), error, false};
    walk(&w, "", json_node_get_object(root));
    Reader r = {where, w.values, error};
    gboolean ok = !w.failed && read_config(ds, &r);
    if (ok && w.unknown->len) {
        g_ptr_array_add(w.unknown, NULL);
        g_autofree char *list = g_strjoinv(", ", (char **)w.unknown->pdata);
        g_ptr_array_insert(ds->warnings, 0,
                           g_strdup_printf("%s: keys memsim does not know, taken as changing no "
                                           "memory: %s",
                                           where, list));
    }
    g_hash_table_unref(w.values);
    g_ptr_array_unref(w.unknown);
    if (!ok) {
        memsim_deepspeed_free(ds);
        return NULL;
    }
    g_ptr_array_add(ds->warnings, NULL);
    return ds;
}

MemsimDeepspeed *memsim_deepspeed_parse(const char *text, const char *where, GError **error)
{
    g_return_val_if_fail(text && where, NULL);
    return parse_with(text, where, NULL, error);
}

MemsimDeepspeed *memsim_deepspeed_load(const char *path, GError **error)
{
    return memsim_deepspeed_load_set(path, NULL, error);
}

MemsimDeepspeed *ds_with_set(const MemsimDeepspeed *ds, const char *set)
{
    GPtrArray *a = g_ptr_array_new();
    for (int i = 0; ds->sets && ds->sets[i]; i++)
        g_ptr_array_add(a, ds->sets[i]);
    g_ptr_array_add(a, (gpointer)set);
    g_ptr_array_add(a, NULL);
    MemsimDeepspeed *out = parse_with(ds->text, ds->source, (const char *const *)a->pdata, NULL);
    g_ptr_array_unref(a);
    return out;
}

MemsimDeepspeed *memsim_deepspeed_load_set(const char *path, const char *const *sets,
                                           GError **error)
{
    g_return_val_if_fail(path, NULL);
    g_autofree char *text = NULL;
    GError *e = NULL;
    if (!g_file_get_contents(path, &text, NULL, &e)) {
        BAD("%s: %s", path, e->message);
        g_error_free(e);
        return NULL;
    }
    return parse_with(text, path, sets, error);
}

void memsim_deepspeed_free(MemsimDeepspeed *ds)
{
    if (!ds)
        return;
    g_free(ds->source);
    g_free(ds->text);
    g_strfreev(ds->sets);
    g_ptr_array_unref(ds->warnings);
    g_free(ds);
}

const char *const *memsim_deepspeed_warnings(const MemsimDeepspeed *ds)
{
    g_return_val_if_fail(ds, NULL);
    return (const char *const *)ds->warnings->pdata;
}

const char *const *memsim_deepspeed_sets_given(const MemsimDeepspeed *ds)
{
    g_return_val_if_fail(ds, NULL);
    return (const char *const *)ds->sets;
}

const char *memsim_deepspeed_source(const MemsimDeepspeed *ds)
{
    g_return_val_if_fail(ds, NULL);
    return ds->source;
}

guint64 ds_sets_mask(const MemsimDeepspeed *ds)
{
    guint64 m = (guint64)1 << SETTING_METHOD;
    if (ds->micro)
        m |= (guint64)1 << SETTING_BATCH;
    if (ds->accum)
        m |= (guint64)1 << SETTING_GRAD_ACCUM;
    if (ds->precision_set)
        m |= (guint64)1 << SETTING_PRECISION;
    if (ds->optimizer_set)
        m |= (guint64)1 << SETTING_OPTIMIZER;
    if (ds->micro && ds->accum && ds->train_batch)
        m |= (guint64)1 << SETTING_GPUS;
    return m;
}

gboolean memsim_deepspeed_apply(const MemsimDeepspeed *ds, MemsimRun *run, GError **error)
{
    g_return_val_if_fail(ds && run, FALSE);
    static const MemsimMethod stages[] = {MEMSIM_METHOD_NONE, MEMSIM_METHOD_ZERO1,
                                          MEMSIM_METHOD_ZERO2, MEMSIM_METHOD_ZERO3};
    int64_t micro = ds->micro ? ds->micro : run->batch;
    int64_t accum = ds->accum ? ds->accum : run->grad_accum;
    int gpus = run->gpus;
    if (ds->train_batch) {
        int64_t per = micro * accum;
        if (ds->micro && ds->accum && !(run->given >> SETTING_GPUS & 1)) {
            gpus = (int)(ds->train_batch / per); /* divisible: checked when read */
        } else if (!ds->micro || !ds->accum) {
            /* the missing one of the two from the world size (_set_batch_related_parameters) */
            int64_t known = ds->micro ? ds->micro : ds->accum ? ds->accum : 0;
            if (known && ds->train_batch % ((int64_t)gpus * known) == 0) {
                int64_t other = ds->train_batch / ((int64_t)gpus * known);
                if (ds->micro)
                    accum = other;
                else
                    micro = other;
            }
        }
        if (ds->train_batch != micro * accum * gpus) {
            BAD("%s: train_batch_size %" G_GINT64_FORMAT
                " ≠ train_micro_batch_size_per_gpu %" G_GINT64_FORMAT
                " × gradient_accumulation_steps %" G_GINT64_FORMAT " × %d GPUs "
                "(runtime/config.py _batch_assertion)%s",
                ds->source, ds->train_batch, micro, accum, gpus,
                ds->micro && ds->accum
                    ? ""
                    : " (the missing keys from the run's --batch, --grad-accum)");
            return FALSE;
        }
    }
    if (gpus < 1 || gpus > 1000000) {
        BAD("%s: train_batch_size: %d GPUs", ds->source, gpus);
        return FALSE;
    }
    run->gpus = gpus;
    run->method = stages[ds->z.stage];
    run->batch = micro;
    run->grad_accum = (int)accum;
    if (ds->precision_set)
        run->precision = ds->precision;
    if (ds->optimizer_set)
        run->optimizer = ds->optimizer;
    run->deepspeed = ds;
    run->given |= ds_sets_mask(ds);
    return TRUE;
}

DsZero ds_zero_resolved(const MemsimDeepspeed *ds, int64_t hidden)
{
    DsZero z = ds->z;
    if (z.reduce_bucket == DS_AUTO)
        z.reduce_bucket = hidden * hidden;
    if (z.prefetch_bucket == DS_AUTO)
        z.prefetch_bucket = (int64_t)(0.9 * (double)(hidden * hidden));
    if (z.persist_threshold == DS_AUTO)
        z.persist_threshold = 10 * hidden;
    return z;
}

char *ds_describe(const MemsimDeepspeed *ds)
{
    const DsZero *z = &ds->z;
    GString *s = g_string_new(NULL);
    g_autofree char *base = g_path_get_basename(ds->source); /* the file, where it lies aside */
    g_string_append_printf(s, "deepspeed %s: stage %d, overlap_comm %s, contiguous_gradients %s",
                           base, z->stage, z->overlap_comm ? "on" : "off",
                           z->contiguous_gradients ? "on" : "off");
    if (z->reduce_bucket == DS_AUTO)
        g_string_append(s, ", reduce_bucket_size auto (h²)");
    else
        g_string_append_printf(s, ", reduce_bucket_size %" G_GINT64_FORMAT, z->reduce_bucket);
    if (z->stage == 3) {
        if (z->prefetch_bucket == DS_AUTO)
            g_string_append(s, ", prefetch auto (0.9 h²)");
        else
            g_string_append_printf(s, ", prefetch %" G_GINT64_FORMAT, z->prefetch_bucket);
        if (z->persist_threshold == DS_AUTO)
            g_string_append(s, ", persistence auto (10 h)");
        else
            g_string_append_printf(s, ", persistence %" G_GINT64_FORMAT, z->persist_threshold);
        g_string_append_printf(s,
                               ", max live %" G_GINT64_FORMAT ", max reuse %" G_GINT64_FORMAT
                               ", sub-group %" G_GINT64_FORMAT,
                               z->max_live, z->max_reuse, z->sub_group);
    }
    if (z->offload_optimizer)
        g_string_append_printf(s, ", offload_optimizer cpu%s",
                               z->offload_optimizer_pin ? " (pinned)" : "");
    if (z->offload_param)
        g_string_append_printf(s, ", offload_param cpu%s", z->offload_param_pin ? " (pinned)" : "");
    if (ds->clip > 0)
        g_string_append_printf(s, ", clipping %g", ds->clip);
    return g_string_free(s, FALSE);
}
