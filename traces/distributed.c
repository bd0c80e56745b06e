/* Distributed methods: one program per rank role (DISTRIBUTED.md).
 *
 * Data-parallel methods run the whole model on every rank, so all ranks share one role:
 *   ddp          §1: full parameters, gradients, buckets (one bucket of all gradients in the
 *                first iteration, ≤ 25 MiB buckets in ready order afterwards; first 1 MiB),
 *                all-reduced on a communication stream; full optimizer state. With
 *                --zero-redundancy (torch's ZeroRedundancyOptimizer) the same, but each rank's
 *                optimizer steps and keeps state for its own whole parameters (the greedy
 *                partition, zr_partition), so every rank has a program of its own.
 *   zero1/zero2  §2.3 (DeepSpeed, bf16): one flat bf16 parameter buffer padded to a multiple
 *                of 2N elements, fp32 master and optimizer state for this rank's 1/N
 *                partition; stage 2 reduces gradients through the ipg bucket into a 1/N
 *                gradient partition, stage 1 keeps the full bf16 gradients through backward.
 *   zero3        §2.4: bf16 partitions of ⌈numel/N⌉ per parameter, gathered per layer on an
 *                all-gather stream before its forward and its backward (the next layer
 *                prefetched) and released after; persistent ipg bucket and flat gradient
 *                partitions; reduce-scatter through a flattened copy of the bucket.
 *   fsdp, fsdp-grad-op, hsdp   §3 (FSDP1, MixedPrecision bf16 by default): one FlatParameter
 *                per decoder layer plus the root; fp32 local shard of ⌈numel/N⌉; the bf16 unsharded
 *                buffer allocated on the unshard stream and freed (record_stream on the
 *                compute stream) after forward (not the root; not with SHARD_GRAD_OP) and after
 *                backward; at most two all-gathers in flight (the host waits); backward
 *                prefetch of the next unit; gradients reduce-scattered on the post-backward
 *                stream into an fp32 gradient shard.
 *                As configured (fsdp_check in settings.c says what is refused): the sharding
 *                strategy (--fsdp-sharding; NO_SHARD gathers nothing and all-reduces in
 *                place), MixedPrecision's param and reduce dtypes (fp32 parameters under a
 *                -mixed precision: torch.autocast on fp32 shards gathered in fp32), CPU
 *                offload (shards, gradient shards and the optimizer's state in host memory,
 *                gg_host; the optimizer steps on the CPU), the limiter, BACKWARD_PRE/POST/none,
 *                use_orig_params' 16-byte alignment; and FSDP2 (§4, --fsdp-version 2):
 *                per-parameter dim-0 shards, foreach_all_gather's copy-in and output on the
 *                copy-in stream (the forward's kept until the next group's copy-out), the
 *                unsharded parameters copied out on the compute stream, foreach_reduce's
 *                reduce-scatter input on the compute stream (kept until the next group's),
 *                reshard_after_forward True / False / k.
 * Megatron (tp × pp × dp) runs one role per pipeline stage (§5): heads, widths and vocabulary
 * split over tp, layers over pp; bf16 parameters, an fp32 main-grad buffer, fp32 main
 * parameters and Adam state split over dp by the distributed optimizer (over all of them
 * when dp = 1); micro-batches (--microbatches, or as many as --grad-accum: Megatron's
 * accumulation) scheduled GPipe, 1F1B or interleaved 1F1B (§5.3), with the
 * stage input received into a fresh buffer and the output freed once sent.
 *
 * The loop: every data-parallel rank runs the training loop of traces/loop.c (steps,
 * accumulation micro-batches, autocast, keep-outputs, zero_grad), the method's buffers and
 * collectives added through its hooks; a pipeline stage runs its schedule and takes the
 * loop's step mark and optimizer step. The optimizer steps what the method holds: torch.optim
 * on DDP's replica and on FSDP's shards (every optimizer, implementation and zero_grad the
 * run asks for, the state per shard: SGD none, momentum one buffer, AdamW two, Adafactor on a
 * 1-D shard a full second moment); DeepSpeed's optimizer around the flat fp32 partition
 * (AdamW its FusedAdam, any other the client's torch optimizer; gradients set to None by the
 * engine); Megatron's distributed optimizer (Adam only, apex/TE FusedAdam) on the main shard.
 * What a framework decides itself is refused by setting_check_distributed_loop (run.c).
 *
 * LoRA/QLoRA: only the adapters train. DDP keeps peft's fp32 adapters; DeepSpeed casts them
 * to bf16 with the module; ZeRO-1/2 flatten and partition only the adapters (the frozen base
 * stays whole), ZeRO-3 partitions every parameter; FSDP runs with use_orig_params, one bf16
 * FlatParameter per unit holding base and adapters (its gradient covers the whole unit),
 * Adam on the trained share. QLoRA's packed 4-bit weights are sharded as bf16 bytes
 * (bnb_4bit_quant_storage), their absmax stays whole. Megatron-LM has no LoRA.
 *
 * The sharded methods (zero3, fsdp*) build the model without parameter storage and
 * materialise one unit at a time (zero.Init; FSDP wrapping unit by unit), so the model is
 * never whole on a GPU. Gathered units: in forward the current (and for ZeRO-3 the next)
 * layer, in backward the current and the prefetched one; a unit is released when the
 * backward moves past it (its post-backward), with or without checkpointing. The root
 * (embeddings, final norm, head) is gathered for the whole forward and backward.
 *
 * Durations: compute ops are costed by the graph (gg_set_gpu: FLOPs at half the tensor-core
 * peak, traffic at 80% of HBM); collectives by ring over the profile's link within a node or
 * the network beyond (comm_cost); ZeRO-3's host synchronises its fetches as FSDP's limiter
 * does, so the host stays within two gathers of the GPU.
 *
 * Meetings: a pipeline's sends and recvs name the stage at the other end (gg_p2p: the trace
 * rank, MEMSIM_EVF_PEER), so the replay pairs the k-th send of a stage to its neighbour with
 * the neighbour's k-th recv from it: a stage's recv waits for the send, and the pipeline's
 * fill and drain (the bubble, (p − 1)/m of the step for 1F1B and GPipe) appear in each
 * stage's time. Collectives within a role (data-parallel, tensor-parallel, the distributed
 * optimizer's) carry no peer: the symmetric ranks a role stands for reach them together, so
 * they need no meeting.
 *
 * A DeepSpeed config (run->deepspeed, traces/deepspeed.c) sets what the methods' fixed
 * defaults otherwise stand for: the ipg bucket's size (reduce_bucket_size, allocated whole),
 * overlap_comm's second bucket in stages 1 and 2 (and stage 1's hooks reducing at the
 * boundary), contiguous_gradients, stage 3's prefetch (no prefetch in the first, trace-
 * recording step; then by stage3_prefetch_bucket_size and stage3_max_live_parameters, whole
 * layers at a time), stage3_max_reuse_distance (a layer whose backward comes within it stays
 * gathered after its forward), persistent small parameters, sub-groups of the step, and
 * offload: ZeRO-Offload's fp32 partition, its fp32 gradient, Adam's state (and with
 * accumulation the host accumulation buffer) counted on the host with gg_host, the GPU
 * keeping the bf16 parameters, the buckets and temp_grad_buffer_for_gpu_offload (stages 1-2);
 * offload_param's bf16 partitions on the host, each gather copying its partition in first.
 *
 * Simplifications, stated: without a config, ZeRO-3's reuse-distance and persistence-threshold
 * rules keep no parameter gathered beyond its layer; the gradient partition of ZeRO-2 is exactly 1/N of the
 * padded parameters; a send does not wait for its recv (with a send and the next recv as
 * separate events, a rendezvous would deadlock 1F1B, which Megatron avoids by batching the
 * two: the wait falls on the recv).
 */
#include <memsim/gen.h>

#include <string.h>

#include "traces/deepspeed.h"
#include "traces/layers.h"
#include "traces/loop.h"
#include "traces/models.h"
#include "traces/settings.h"

enum { S_COMPUTE = 0, S_COMM = 1, S_PRE = 2, S_POST = 3 };

#define RB_ELEMENTS 500000000LL   /* DeepSpeed reduce_bucket_size (elements) */
#define DDP_BUCKET (25LL << 20)   /* bytes */
#define DDP_FIRST_BUCKET (1LL << 20)

typedef MemsimGpu GpuProfile;

/* A group's link: the profile's GPU-to-GPU link when the group fits in one node, else its
 * network bandwidth per GPU, at the profile's bandwidth efficiency as every derived duration
 * (traces/gpus.c), with NCCL's latencies for that hardware (comm_link_us). Compute ops are
 * costed too (gg_set_gpu), so the replay's streams advance and a record_stream'd block is
 * reusable once its stream passed. */
static CommLink comm_cost(const GpuProfile *gpu, bool intra)
{
    double gbs = intra ? gpu->link_gbs : gpu->network_gbs;
    return (CommLink){1.0 / (gpu->bandwidth_efficiency * gbs * 1e3), gpu->nccl_base_us,
                      intra ? gpu->link_hop_us : gpu->network_hop_us};
}

/* A ring collective among n ranks moving `bytes` (the full, unsharded size): comm_link_us. */
static double ring_us(CommLink link, MemsimCollectiveKind kind, uint64_t bytes, int n)
{
    return comm_link_us(link, kind, bytes, n);
}

/* ---- the per-rank state of a method ---- */

typedef struct {
    AgStorage *full;      /* the unsharded (bf16) buffer of the unit's parameters */
    AgTensor *shard;      /* fp32 local shard (FSDP) */
    AgTensor *opt;        /* FSDP: what the optimizer steps of the shard (a view of it: the
                           * whole shard, or with LoRA this rank's share of the adapters);
                           * its .grad is the gradient shard */
    GPtrArray *params;    /* the unit's parameter tensors (not references) */
    int64_t numel, shard_numel;
    int64_t gathered_numel; /* ZeRO-3 with a config: ds_numel of the gathered parameters */
    int pending;          /* gradients not yet produced in this backward */
    int trainable;        /* the unit's parameters that require grad */
    int64_t train_numel;  /* their elements (LoRA: the adapters) */
    bool root;
    bool outer;           /* the root, or the base model's unit of size_based_auto_wrap_policy:
                           * gathered around everything inside it, layers included */
    AgTensor *post_fwd;   /* FSDP2 reshard_after_forward=k: this rank's 1/k between forward
                           * and backward */
    /* --fsdp-wrap lora: the layer's frozen FlatParameter (shard_numel of it is the frozen
     * ⌈F/N⌉) and its adapters' own FlatParameters, fp32, Σ ⌈a/N⌉ (adapter: their shards) */
    int64_t frozen_shard, adapter_shard;
    AgTensor *adapter;
} Unit;

typedef struct {
    Model md;
    AgGraph *g;
    const MemsimRun *run;
    MemsimMethod method;
    int N;                 /* sharding (data-parallel) degree */
    int64_t psi, psi_pad;  /* trainable elements on this rank, padded */
    /* DDP */
    GPtrArray *buckets;    /* AgTensor* */
    int64_t ddp_pending;
    bool ddp_rebuilt;
    /* DDP + ZeroRedundancyOptimizer: this rank (-1 without it) and its parameters */
    int zr_rank;
    GPtrArray *zr_params;
    /* ZeRO */
    AgTensor *flat;        /* ZeRO-1/2: the flat bf16 parameters; ZeRO-3: the partitions */
    AgTensor *master;      /* the fp32 partition, the optimizer's parameter */
    AgTensor *ipg;         /* ipg bucket */
    int64_t ipg_fill;
    AgTensor *grad_part;   /* gradient partition */
    AgTensor *frozen_part; /* ZeRO-3 with LoRA/QLoRA: the frozen parameters' partitions */
    bool lora;             /* LoRA/QLoRA: a frozen base, trained adapters */
    /* a DeepSpeed config (run->deepspeed, traces/deepspeed.h), its sizes resolved */
    bool ds;
    DsZero z;
    int64_t rb;            /* reduce_bucket_size (elements) */
    AgTensor *ipg2;        /* stage 1/2 with overlap_comm: the second ipg buffer */
    GPtrArray *pending;    /* stage 2 without contiguous_gradients: the bucket's gradients */
    AgTensor *offload_tmp; /* ZeRO-Offload stage 1/2: temp_grad_buffer_for_gpu_offload */
    int64_t largest;       /* the largest trainable parameter's numel */
    int64_t host_accum;    /* ZeRO-Offload with accumulation: accumulated_grads_in_cpu */
    bool adam_on_host;     /* DeepSpeedCPUAdam's state, made at the first step */
    int step;              /* the step that runs (1-based) */
    int micro;             /* the micro-batch that runs in the step (1-based) */
    int64_t avail;         /* ZeRO-3: numel of the gathered units (n_available) */
    DType cdt;             /* the parameters' dtype: ZeRO's flat buffers, buckets and
                            * gradient partitions (stage_1_and_2.py self.dtype) */
    /* FSDP / ZeRO-3 units */
    Unit *units;
    int n_units;
    GHashTable *unit_of_param; /* parameter → unit index + 1 */
    /* FSDP1 size_based_auto_wrap_policy (size_wrap_plan): each layer's unit (-1: the
     * enclosing one), the units of the token embedding, the base model and the output
     * projection (-1: none), and the units in the order their forwards end (_exec_order_utils.py
     * handles_post_forward_order, which backward prefetch walks back); NULL/-1 otherwise */
    int *layer_unit;
    int u_embed, u_base, u_head;
    int *order, *order_pos, n_order;
    bool root_pre_backward; /* the root's pre-backward hook ran in this backward */
    int bw_unit;           /* the unit whose backward runs now (-1 before the first) */
    GQueue *inflight;      /* FSDP rate limiter: units whose all-gather may still run */
    /* FSDP as configured (fsdp_setup): 0 for the other methods, else 1 or 2 (the API) */
    int fsdp;
    int sharding;          /* 0 FULL_SHARD, 1 SHARD_GRAD_OP, 2 HYBRID_SHARD, 3 NO_SHARD */
    DType param_dt, reduce_dt, orig_dt; /* MixedPrecision; the sharded parameters' dtype */
    bool offload;          /* CPUOffload / CPUOffloadPolicy: shards, grads, optimizer on host */
    bool keep_after_forward; /* SHARD_GRAD_OP, FSDP2 reshard_after_forward=False */
    bool lora_wrap;        /* --fsdp-wrap lora (peft's fsdp_auto_wrap_policy) */
    bool limit;            /* FSDP1 limit_all_gathers (ZeRO-3: its fetch events) */
    int prefetch;          /* FSDP1 backward prefetch: 0 pre, 1 post, 2 none */
    AgTensor *ag_prev;     /* FSDP2: the last group's all-gather output (forward) */
    AgTensor *rs_prev;     /* FSDP2: the last group's reduce-scatter input */
    int64_t host_state;    /* offload: the optimizer's host bytes per shard element */
    CommLink comm_us_per_byte;
    /* the optimizer and the parameters it steps (ZeRO: the fp32 partition; FSDP: the units'
     * shards; DDP: the model's) */
    Optimizer opt;
    GPtrArray *opt_params;
} Dist;

static AgTensor *alloc_cat(AgGraph *g, uint8_t cat, DType dt, int64_t n)
{
    AgContext *c = gg_ctx(g);
    uint8_t old = c->category;
    c->category = cat;
    AgTensor *t = op_new(g, "empty", dt, 1, (int64_t[]){n});
    c->category = old;
    return t;
}

static double coll_us(Dist *d, MemsimCollectiveKind kind, uint64_t bytes)
{
    return ring_us(d->comm_us_per_byte, kind, bytes, d->N);
}

/* ---- units (FSDP FlatParameters, ZeRO-3 layer gathers) ---- */

static int unit_of(Dist *d, int32_t layer)
{
    if (d->n_units == 1 || layer < 0)
        return d->n_units - 1; /* the root */
    if (d->layer_unit) {
        int u = d->layer_unit[layer];
        return u >= 0 ? u : d->u_base >= 0 ? d->u_base : d->n_units - 1;
    }
    return layer;
}

/* The unit whose all-gather backward prefetch issues from unit u (FSDP1
 * _runtime_utils.py _get_handle_to_prefetch: the handle before u's in the post-forward
 * order), or -1. */
static int prev_unit(Dist *d, int u)
{
    if (!d->order)
        return u > 0 && u - 1 < d->n_units - 1 ? u - 1 : -1;
    int pos = d->order_pos[u];
    return pos > 0 ? d->order[pos - 1] : -1;
}

/* FSDP2's unshard of one parameter group (fsdp/_fully_shard/_fsdp_collectives.py
 * foreach_all_gather, foreach_all_gather_copy_out; _fsdp_param_group.py FSDPParamGroup.unshard
 * and wait_for_unshard). On the copy-in stream: with CPUOffloadPolicy the shards come over
 * from the host (S elements of the original dtype), with a param_dtype other than the
 * parameters' their cast (S of param_dtype), then all_gather_output of N·S elements of
 * param_dtype, this rank's part copied in; the all-gather on the all-gather stream. Then
 * on the compute stream the copy-out into the unsharded parameters (each padded on dim 0:
 * N·S in all). In forward the output is kept in comm_ctx.all_gather_state until the next
 * group's copy-out is done (implicit prefetching: the next copy-in never overwrites what is
 * still read), so the previous one goes now; in backward it goes right after copy-out. */
static void unshard_fsdp2(Dist *d, Unit *un)
{
    AgGraph *g = d->g;
    AgContext *c = gg_ctx(g);
    c->stream = S_PRE;
    gg_wait_stream(g, S_PRE, S_COMPUTE);
    /* (resharded after forward to groups of k: the all-gather's input is the post-forward
     * shard, already in param_dtype, gathered over k ranks) */
    bool pf = un->post_fwd != NULL;
    AgTensor *h2d = d->offload && !pf
                        ? alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->orig_dt, un->shard_numel)
                        : NULL;
    AgTensor *cast = d->param_dt != d->orig_dt && !pf
                         ? alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->param_dt, un->shard_numel)
                         : NULL;
    /* (the inputs live until the copy-in is done: del param_all_gather_inputs) */
    AgTensor *out = alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->param_dt, un->shard_numel * d->N);
    gt_unref(g, h2d);
    gt_unref(g, cast);
    c->stream = S_COMM;
    gg_wait_stream(g, S_COMM, S_PRE);
    gg_collective(g, MEMSIM_COLL_ALL_GATHER, gt_nbytes(out), 0,
                  pf ? ring_us(d->comm_us_per_byte, MEMSIM_COLL_ALL_GATHER, gt_nbytes(out),
                               d->run->fsdp_reshard_after_forward)
                     : coll_us(d, MEMSIM_COLL_ALL_GATHER, gt_nbytes(out)));
    c->stream = S_COMPUTE;
    gg_wait_stream(g, S_COMPUTE, S_COMM);
    bool forward = c->phase == MEMSIM_PHASE_FORWARD;
    /* FSDP2 frees an all-gather output without record_stream: the all-gather streams first
     * wait on the event recorded after its copy-out (_wait_all_gather_streams_on_event), so
     * the copy-in stream may take the block again at once */
    if (d->ag_prev) {
        gg_wait_stream(g, S_PRE, S_COMPUTE);
        gg_wait_stream(g, S_COMM, S_COMPUTE);
        gt_unref(g, d->ag_prev);
        d->ag_prev = NULL;
    }
    c->category = MEMSIM_CAT_PARAMETER;
    gg_storage_restore(g, un->full);
    if (pf) {
        gt_unref(g, un->post_fwd);
        un->post_fwd = NULL;
    }
    if (forward) {
        d->ag_prev = out;
    } else {
        gg_wait_stream(g, S_PRE, S_COMPUTE);
        gg_wait_stream(g, S_COMM, S_COMPUTE);
        gt_unref(g, out);
    }
}

static void unshard(Dist *d, int u)
{
    Unit *un = &d->units[u];
    AgGraph *g = d->g;
    AgContext *c = gg_ctx(g);
    if (un->full->resident)
        return;
    uint16_t old = c->stream;
    uint8_t oldcat = c->category;
    /* FSDP's rate limiter: at most two all-gathers in flight, the host waits for the oldest
     * one's free event; ZeRO-3 alike synchronises its oldest fetch event beyond two
     * (__max_ongoing_fetch_events) */
    if (d->limit && g_queue_get_length(d->inflight) >= 2) {
        g_queue_pop_head(d->inflight);
        gg_host_wait(g, S_COMPUTE);
    }
    if (d->fsdp == 2) {
        unshard_fsdp2(d, un);
    } else if (d->method != MEMSIM_METHOD_ZERO3) {
        /* _flat_param.py FlatParamHandle.pre_unshard, on the pre-unshard stream: with param
         * mixed precision _use_low_precision_shard casts the shard into _mp_shard (S elements
         * of param_dtype); with CPU offload and no mixed precision flat_param_to(device)
         * copies the host shard over (S of the original dtype); else nothing */
        c->stream = S_PRE;
        gg_wait_stream(g, S_PRE, S_COMPUTE);
        AgTensor *mp = d->lora_wrap ? (un->adapter_shard && d->param_dt != DT_F32
                                           ? alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->param_dt,
                                                       un->adapter_shard)
                                           : NULL)
                       : d->param_dt != d->orig_dt || d->offload
                           ? alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->param_dt, un->shard_numel)
                           : NULL;
        c->stream = S_COMM;
        gg_wait_stream(g, S_COMM, S_PRE);
        c->category = MEMSIM_CAT_PARAMETER;
        if (d->sharding == 3) {
            /* NO_SHARD: FlatParamHandle.unshard has nothing to gather (needs_unshard is
             * false): the parameters are the _mp_shard itself, freed in post_reshard */
            gt_unref(g, mp);
            mp = NULL;
            c->stream = S_PRE;
            gg_storage_restore(g, un->full);
        } else {
            gg_storage_restore(g, un->full);
            gg_collective(g, MEMSIM_COLL_ALL_GATHER, un->full->nbytes, 0,
                          coll_us(d, MEMSIM_COLL_ALL_GATHER, un->full->nbytes));
        }
        if (mp) {
            gg_record_stream(g, mp, S_COMM);
            gt_unref(g, mp);
        }
        g_queue_push_tail(d->inflight, un);
    } else {
        c->stream = S_COMM;
        gg_wait_stream(g, S_COMM, S_COMPUTE);
        /* ZeRO-Infinity with offload_param: the host partition is copied to the device first
         * (partition_parameters.py _allgather_params_coalesced: ds_tensor.to(device)) */
        AgTensor *h2d = d->ds && d->z.offload_param
                            ? alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->cdt, un->shard_numel)
                            : NULL;
        c->category = MEMSIM_CAT_PARAMETER;
        gg_storage_restore(g, un->full);
        gg_collective(g, MEMSIM_COLL_ALL_GATHER, un->full->nbytes, 0, coll_us(d, MEMSIM_COLL_ALL_GATHER, un->full->nbytes));
        gt_unref(g, h2d);
        g_queue_push_tail(d->inflight, un);
        d->avail += un->numel;
    }
    c->stream = old;
    c->category = oldcat;
    gg_wait_stream(g, S_COMPUTE, S_COMM);
}

static void reshard(Dist *d, int u)
{
    Unit *un = &d->units[u];
    if (!un->full->resident || (d->sharding == 3 && d->param_dt == d->orig_dt))
        return; /* NO_SHARD without mixed precision: the parameters are the FlatParameter */
    gg_record_stream_storage(d->g, un->full, S_COMPUTE);
    gg_storage_release(d->g, un->full);
    if (d->method == MEMSIM_METHOD_ZERO3)
        d->avail -= un->numel;
}

/* ZeRO-3's prefetch from unit `u` on in direction `dir` (+1 forward, -1 backward).
 * Without a config: the next layer. With one (partitioned_param_coordinator.py
 * fetch_sub_module): none in the first step (the trace is being recorded), then the upcoming
 * units while the numel being prefetched stays below min(stage3_prefetch_bucket_size,
 * stage3_max_live_parameters − n_available) — whole layers here, where DeepSpeed counts
 * parameter by parameter. */
static void zero3_prefetch(Dist *d, int u, int dir)
{
    int last = d->n_units - 1; /* the root, gathered for the whole step */
    if (!d->ds) {
        if (u + dir >= 0 && u + dir < last)
            unshard(d, u + dir);
        return;
    }
    if (d->step < 2)
        return;
    int64_t budget = d->z.max_live - d->avail;
    if (d->z.prefetch_bucket < budget)
        budget = d->z.prefetch_bucket;
    int64_t sum = 0;
    for (int k = u + dir; k >= 0 && k < last && sum < budget; k += dir) {
        if (d->units[k].full->resident)
            continue;
        unshard(d, k);
        sum += d->units[k].numel;
    }
}

/* stage3_max_reuse_distance (partitioned_param_coordinator.py release_sub_module): after its
 * forward, a layer is kept gathered when its next use — its backward — comes within that many
 * numel of fetched parameters (the layers after it, forward and backward), from the second
 * step on (the first records the trace and releases everything). */
static bool zero3_reused(Dist *d, int u)
{
    if (!d->ds || d->method != MEMSIM_METHOD_ZERO3 || d->step < 2)
        return false;
    int64_t dist = 0;
    for (int v = u + 1; v < d->n_units - 1; v++)
        dist += 2 * d->units[v].numel;
    return dist < d->z.max_reuse;
}

/* ---- hooks ---- */

static void layer_hook(Model *md, int32_t layer, bool pre)
{
    Dist *d = (Dist *)md;
    if (!d->units)
        return;
    int u = unit_of(d, layer);
    if (pre) {
        unshard(d, u);
        if (d->method == MEMSIM_METHOD_ZERO3 && !d->units[u].root)
            zero3_prefetch(d, u, +1);
    } else if (!d->units[u].outer && !d->keep_after_forward && !zero3_reused(d, u)) {
        reshard(d, u);
        if (d->fsdp == 2 && d->run->fsdp_reshard_after_forward > 1 && d->units[u].trainable) {
            /* reshard_after_forward=k: the unsharded parameters go, this rank keeps 1/k of
             * them in param_dtype (_fsdp_param.py to_sharded_post_forward: N·S/k elements) */
            Unit *un = &d->units[u];
            AgContext *c = gg_ctx(d->g);
            uint8_t oldcat = c->category;
            c->category = MEMSIM_CAT_PARAMETER;
            un->post_fwd = op_new(d->g, "empty", d->param_dt, 1,
                                  (int64_t[]){un->shard_numel * d->N /
                                              d->run->fsdp_reshard_after_forward});
            c->category = oldcat;
        }
    }
}

static void pre_backward_unit(Dist *d, int u)
{
    /* the post-backward of the unit whose backward just ended (ZeRO-3's release_sub_module;
     * FSDP's post-backward reshard, already done by the gradient hook when the unit trains) */
    if (d->bw_unit >= 0 && d->bw_unit != u && !d->units[d->bw_unit].outer)
        reshard(d, d->bw_unit);
    d->bw_unit = u;
    unshard(d, u);
    /* backward prefetch of the next unit: ZeRO-3's coordinator (zero3_prefetch); FSDP's
     * BACKWARD_PRE here, before the unit's gradients (_runtime_utils.py _pre_backward_hook →
     * _prefetch_handle), BACKWARD_POST in its post-backward hook (post_accumulate); FSDP2 as
     * BACKWARD_PRE */
    if (d->method == MEMSIM_METHOD_ZERO3 && !d->units[u].root)
        zero3_prefetch(d, u, -1);
    else if (d->prefetch == 0 && prev_unit(d, u) >= 0)
        unshard(d, prev_unit(d, u));
}

static void pre_backward_layer(AgGraph *g, void *user, int32_t layer)
{
    Dist *d = user;
    (void)g;
    if (!d->units)
        return;
    int u = unit_of(d, layer);
    /* a layer of size_based_auto_wrap_policy's base unit is no FSDP module: no hook runs */
    if (d->units[u].outer && !d->units[u].root)
        return;
    pre_backward_unit(d, u);
}

/* The unit of a module outside the layers (ModelModule), or -1. */
static int module_unit(const Dist *d, int module)
{
    if (!d->units || !d->layer_unit)
        return -1;
    return module == MODULE_BASE ? d->u_base : module == MODULE_EMBED ? d->u_embed
                                  : module == MODULE_HEAD                ? d->u_head
                                                                         : -1;
}

/* The pre-backward hook of such a unit (FSDP1 _runtime_utils.py _pre_backward_hook, on the
 * module's outputs): it runs as the backward reaches the module. */
static void pre_backward_module(AgGraph *g, void *user, int module)
{
    Dist *d = user;
    (void)g;
    if (module == MODULE_ROOT && d->fsdp && d->units && !d->root_pre_backward) {
        /* the root's pre-backward, on the loss and logits, once per backward
         * (_runtime_utils.py _pre_backward_hook: _ran_pre_backward_hook): its BACKWARD_PRE
         * prefetch all-gathers the unit whose forward ended last before the root's (FSDP2:
         * FSDPParamGroup._backward_prefetch, the post-forward order alike) */
        d->root_pre_backward = true;
        int r = d->n_units - 1;
        if (d->prefetch == 0 && prev_unit(d, r) >= 0)
            unshard(d, prev_unit(d, r));
        return;
    }
    int u = module_unit(d, module);
    if (u < 0)
        return;
    pre_backward_unit(d, u);
}

/* Forward of such a unit: all-gathered before, resharded after unless the strategy keeps
 * it (FSDP1 _runtime_utils.py _pre_forward_unshard, _post_forward_reshard: every non-root
 * unit under FULL_SHARD / HYBRID_SHARD). */
static void module_hook(Model *md, int module, bool pre)
{
    Dist *d = (Dist *)md;
    int u = module_unit(d, module);
    if (u < 0)
        return;
    if (pre)
        unshard(d, u);
    else if (!d->keep_after_forward)
        reshard(d, u);
}

/* The unit's unsharded gradients go (record_stream on the stream that reduced them). */
static void drop_param_grads(Dist *d, Unit *un, uint16_t stream)
{
    for (guint i = 0; i < un->params->len; i++) {
        AgTensor *p = un->params->pdata[i];
        if (p->grad) {
            gg_record_stream(d->g, p->grad, stream);
            AgTensor *gr = p->grad;
            p->grad = NULL;
            gt_unref(d->g, gr);
        }
    }
}

/* The reduced gradient shard `sh` (reduce_dtype) becomes the unit's sharded gradient: cast
 * back to the parameters' dtype when it differs (FSDP1 _runtime_utils.py
 * _cast_grad_to_param_dtype; FSDP2 foreach_reduce's to(orig_dtype)), accumulated into the
 * saved shard if there is one; with CPU offload copied to the pinned host gradient
 * (FSDP1 _offload_grad into _cpu_grad; FSDP2 foreach_reduce's to(cpu, non_blocking)) and
 * dropped from the GPU. */
static void keep_grad_shard(Dist *d, Unit *un, AgTensor *sh)
{
    AgGraph *g = d->g;
    DType keep_dt = d->lora && !d->lora_wrap ? d->param_dt : d->orig_dt;
    AgTensor *kept = sh;
    if (d->reduce_dt != keep_dt) {
        kept = alloc_cat(g, MEMSIM_CAT_GRADIENT, keep_dt, gt_numel(sh));
        gt_unref(g, sh);
    }
    if (d->offload) {
        gg_record_stream(g, kept, S_POST);
        gt_unref(g, kept);
        return;
    }
    g_assert(un->opt);
    if (!un->opt->grad)
        un->opt->grad = kept;
    else
        gt_unref(g, kept); /* accumulated into the saved shard */
}

/* FSDP1's post-backward hook of a unit (_runtime_utils.py _post_backward_hook, _reduce_grad,
 * _get_reduce_scatter_tensors; NO_SHARD _reduce_grad_no_shard), on the post-backward
 * stream: the unsharded gradient cast to reduce_dtype if it differs, padded to N·S (F.pad:
 * a new tensor when there is padding), reduce-scattered into a new S-element shard (NO_SHARD:
 * all-reduced in place), then kept as the unit's gradient shard. */
static void reduce_unit_grads(Dist *d, Unit *un)
{
    AgGraph *g = d->g;
    AgContext *c = gg_ctx(g);
    uint16_t old = c->stream;
    uint8_t oldcat = c->category;
    c->stream = S_POST;
    gg_wait_stream(g, S_POST, S_COMPUTE);
    c->category = MEMSIM_CAT_COMM_BUFFER;
    DType rdt = d->reduce_dt;
    DType keep_dt = d->lora && !d->lora_wrap ? d->param_dt : d->orig_dt;
    /* use_orig_params with frozen parameters: the FlatParameter's gradient is the whole
     * unit (zeros where frozen), and the whole is reduce-scattered; with the LoRA policy
     * only the adapters' FlatParameters have gradients (numel: theirs, S: their shards) */
    AgTensor *flatg = d->lora && !d->lora_wrap
                          ? alloc_cat(g, MEMSIM_CAT_GRADIENT, d->param_dt, un->numel)
                          : NULL;
    int64_t numel = d->lora_wrap ? un->train_numel : un->numel;
    int64_t S = d->lora_wrap ? un->adapter_shard : un->shard_numel;
    /* (NO_SHARD: the cast gradient is reduced in place and kept when it is the parameters'
     * dtype) */
    AgTensor *cast = rdt != d->param_dt
                         ? alloc_cat(g, d->sharding == 3 && rdt == keep_dt && !d->offload
                                            ? MEMSIM_CAT_GRADIENT
                                            : MEMSIM_CAT_COMM_BUFFER,
                                     rdt, numel)
                         : NULL;
    AgTensor *sh, *pad = NULL;
    if (d->sharding == 3) {
        /* the all-reduce is in place; the reduced gradient is the cast one, or a flat copy
         * of the unit's gradients when there was no cast */
        uint64_t bytes = (uint64_t)numel * dt_size(rdt);
        gg_collective(g, MEMSIM_COLL_ALL_REDUCE, bytes, 0,
                      ring_us(d->comm_us_per_byte, MEMSIM_COLL_ALL_REDUCE, bytes, d->run->gpus));
        sh = cast ? gt_ref(cast)
                  : alloc_cat(g, rdt == keep_dt ? MEMSIM_CAT_GRADIENT : MEMSIM_CAT_COMM_BUFFER, rdt,
                              numel);
    } else {
        pad = S * d->N > numel ? alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, rdt, S * d->N) : NULL;
        sh = alloc_cat(g, rdt == keep_dt && !d->offload ? MEMSIM_CAT_GRADIENT
                                                        : MEMSIM_CAT_COMM_BUFFER,
                       rdt, S);
        uint64_t bytes = (uint64_t)S * d->N * dt_size(rdt);
        gg_collective(g, MEMSIM_COLL_REDUCE_SCATTER, bytes, 0,
                      coll_us(d, MEMSIM_COLL_REDUCE_SCATTER, bytes));
        if (d->sharding == 2) /* HYBRID_SHARD: the shard all-reduced across the replicas */
            gg_collective(g, MEMSIM_COLL_ALL_REDUCE, (uint64_t)S * dt_size(rdt), 0,
                          ring_us(d->comm_us_per_byte, MEMSIM_COLL_ALL_REDUCE,
                                  (uint64_t)S * dt_size(rdt), d->run->gpus / d->N));
    }
    keep_grad_shard(d, un, sh);
    gt_unref(g, pad);
    gt_unref(g, cast);
    gt_unref(g, flatg);
    drop_param_grads(d, un, S_POST);
    c->stream = old;
    c->category = oldcat;
}

/* FSDP2's post-backward of a group (_fsdp_collectives.py foreach_reduce;
 * _fsdp_param_group.py post_backward): the previous group's reduce-scatter input released
 * (comm_ctx.reduce_scatter_state), the reduce-scatter input of N·S elements in reduce_dtype
 * allocated on the compute stream and filled (chunk_cat), the unsharded gradients freed; on
 * the reduce-scatter stream the output of S elements, all-reduced across replicas with
 * HSDP, then the sharded gradient. */
static void reduce_group_grads(Dist *d, Unit *un)
{
    AgGraph *g = d->g;
    AgContext *c = gg_ctx(g);
    uint16_t old = c->stream;
    uint8_t oldcat = c->category;
    c->stream = S_COMPUTE;
    /* the compute stream waits on the previous reduce-scatter's event, then its input goes
     * (no record_stream: the block is the compute stream's again at once) */
    if (d->rs_prev) {
        gg_wait_stream(g, S_COMPUTE, S_POST);
        gt_unref(g, d->rs_prev);
        d->rs_prev = NULL;
    }
    AgTensor *in = alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->reduce_dt, un->shard_numel * d->N);
    drop_param_grads(d, un, S_COMPUTE);
    c->stream = S_POST;
    gg_wait_stream(g, S_POST, S_COMPUTE);
    AgTensor *sh = alloc_cat(g, d->reduce_dt == d->orig_dt && !d->offload ? MEMSIM_CAT_GRADIENT
                                                                          : MEMSIM_CAT_COMM_BUFFER,
                             d->reduce_dt, un->shard_numel);
    gg_collective(g, MEMSIM_COLL_REDUCE_SCATTER, gt_nbytes(in), 0,
                  coll_us(d, MEMSIM_COLL_REDUCE_SCATTER, gt_nbytes(in)));
    if (d->sharding == 2)
        gg_collective(g, MEMSIM_COLL_ALL_REDUCE, gt_nbytes(sh), 0,
                      ring_us(d->comm_us_per_byte, MEMSIM_COLL_ALL_REDUCE, gt_nbytes(sh),
                              d->run->gpus / d->N));
    d->rs_prev = in;
    keep_grad_shard(d, un, sh);
    c->stream = old;
    c->category = oldcat;
}

/* Whether the gradient hooks reduce and partition now: stage 2 always, stage 1 with a
 * config's overlap_comm at the accumulation boundary (stage_1_and_2.py: the hooks exist for
 * partition_gradients or overlap_comm; reduce_ready_partitions_and_remove_grads runs for
 * stage 1 at the boundary only), where the gradient moves into the bucket as in stage 2. */
static bool zero_partitions_grads(const Dist *d)
{
    return d->method == MEMSIM_METHOD_ZERO2 || d->method == MEMSIM_METHOD_ZERO3 ||
           (d->method == MEMSIM_METHOD_ZERO1 && d->ds && d->z.overlap_comm &&
            d->micro == d->run->grad_accum);
}

/* The ipg bucket's elements: reduce_bucket_size as DeepSpeed allocates it
 * (torch.empty(reduce_bucket_size)); without a config, no more than the model's. */
static int64_t ipg_cap(const Dist *d)
{
    if (d->ds)
        return d->rb;
    return d->rb < d->psi_pad ? d->rb : d->psi_pad;
}

/* Reduces the filled part of the ipg bucket: a flattened copy, reduce-scatter (stage 3) or
 * all-reduce, copied back; with reduce_scatter off the bucket is all-reduced in place
 * (stage_1_and_2.py average_tensor: gradient_reduction_w_predivide; stage3.py
 * __avg_scatter_grads). Without contiguous_gradients the bucket's gradients go once reduced
 * (buffered_reduce_fallback). */
static void reduce_ipg(Dist *d)
{
    AgGraph *g = d->g;
    if (d->ipg_fill > 0) {
        bool in_place = d->ds && !d->z.reduce_scatter && d->ipg;
        AgTensor *tmp = in_place ? NULL : alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->cdt, d->ipg_fill);
        MemsimCollectiveKind kind = d->method == MEMSIM_METHOD_ZERO3 ? MEMSIM_COLL_REDUCE_SCATTER
                                                                     : MEMSIM_COLL_ALL_REDUCE;
        uint64_t bytes = (uint64_t)d->ipg_fill * dt_size(d->cdt);
        gg_collective(g, kind, bytes, 0, coll_us(d, kind, bytes));
        gt_unref(g, tmp);
        d->ipg_fill = 0;
    }
    for (guint i = 0; d->pending && i < d->pending->len; i++)
        gt_unref(g, d->pending->pdata[i]);
    if (d->pending)
        g_ptr_array_set_size(d->pending, 0);
}

static void zero_grad_hook(Dist *d, AgTensor *p)
{
    AgGraph *g = d->g;
    int64_t n = gt_numel(p);
    AgContext *c = gg_ctx(g);
    uint8_t oldcat = c->category;
    uint16_t old = c->stream;
    int64_t cap = ipg_cap(d);
    bool part = zero_partitions_grads(d);
    /* setup_buckets at the first hook of a backward (stage_1_and_2.py backward: the ipg
     * buffer with contiguous_gradients, which ZeRO-Offload forces; a second one with
     * overlap_comm) */
    bool contiguous = !d->ds || d->z.contiguous_gradients || d->z.offload_optimizer;
    if (!d->ipg && contiguous) {
        d->ipg = alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->cdt, cap);
        if (d->ds && d->z.overlap_comm && d->method != MEMSIM_METHOD_ZERO3)
            d->ipg2 = alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->cdt, cap);
    }
    /* ZeRO-Offload with accumulation: each owned gradient accumulates in a host buffer of
     * its size (async_accumulate_grad_in_cpu_via_gpu, kept across steps) */
    if (d->ds && d->z.offload_optimizer && d->method != MEMSIM_METHOD_ZERO3 &&
        d->run->grad_accum > 1 && !d->host_accum) {
        d->host_accum = d->psi_pad / d->N * (int64_t)dt_size(d->cdt);
        gg_host(g, d->host_accum);
    }
    if (d->ipg_fill + n > cap && d->ipg_fill > 0) {
        reduce_ipg(d);
        /* stage 2 copies the owned gradients into grads_in_partition (allocated at the first
         * copy, freed at the step); ZeRO-Offload copies them to the host instead
         * (copy_grads_in_partition); stage 3 has its persistent flat partitions */
        if (!d->grad_part && part && d->method != MEMSIM_METHOD_ZERO3 &&
            !(d->ds && d->z.offload_optimizer))
            d->grad_part = alloc_cat(g, MEMSIM_CAT_GRADIENT, d->cdt, d->psi_pad / d->N);
    }
    d->ipg_fill += n < cap ? n : 0;
    /* the gradient now lives in the bucket (or in the partition): the original is freed; not
     * contiguous, it waits for its bucket's reduction */
    if (part) {
        AgTensor *gr = p->grad;
        p->grad = NULL;
        if (!contiguous)
            g_ptr_array_add(d->pending, gr);
        else
            gt_unref(g, gr);
    }
    c->category = oldcat;
    c->stream = old;
}

/* The end-of-backward epilogue: the partly filled bucket is reduced too. */
static void zero_flush(Dist *d)
{
    AgGraph *g = d->g;
    reduce_ipg(d);
    if (!d->grad_part && zero_partitions_grads(d) && d->method != MEMSIM_METHOD_ZERO3 &&
        !(d->ds && d->z.offload_optimizer))
        d->grad_part = alloc_cat(g, MEMSIM_CAT_GRADIENT, d->cdt, d->psi_pad / d->N);
    if (d->method != MEMSIM_METHOD_ZERO3 && d->ipg) {
        gt_unref(g, d->ipg); /* _release_ipg_buffers */
        d->ipg = NULL;
        gt_unref(g, d->ipg2);
        d->ipg2 = NULL;
    }
}

static void post_accumulate(AgGraph *g, void *user, AgTensor *p)
{
    Dist *d = user;
    switch (d->method) {
    case MEMSIM_METHOD_DDP: {
        /* copy into the bucket view (no allocation); a full bucket is all-reduced */
        if (--d->ddp_pending == 0 || d->ddp_pending % 64 == 0) {
            AgContext *c = gg_ctx(g);
            uint16_t old = c->stream;
            c->stream = S_COMM;
            gg_wait_stream(g, S_COMM, S_COMPUTE);
            gg_collective(g, MEMSIM_COLL_ALL_REDUCE, DDP_BUCKET, 0, coll_us(d, MEMSIM_COLL_ALL_REDUCE, DDP_BUCKET));
            c->stream = old;
        }
        break;
    }
    case MEMSIM_METHOD_ZERO1:
    case MEMSIM_METHOD_ZERO2:
    case MEMSIM_METHOD_ZERO3:
        zero_grad_hook(d, p);
        break;
    case MEMSIM_METHOD_FSDP:
    case MEMSIM_METHOD_FSDP_GRAD_OP:
    case MEMSIM_METHOD_HSDP: {
        int u = GPOINTER_TO_INT(g_hash_table_lookup(d->unit_of_param, p)) - 1;
        if (u >= 0 && --d->units[u].pending == 0) {
            reshard(d, u);
            if (d->fsdp == 2)
                reduce_group_grads(d, &d->units[u]);
            else
                reduce_unit_grads(d, &d->units[u]);
            /* BACKWARD_POST: the next unit's all-gather once this one's gradient is done
             * (_runtime_utils.py _post_backward_hook → _prefetch_handle) */
            if (d->prefetch == 1 && prev_unit(d, u) >= 0)
                unshard(d, prev_unit(d, u));
        }
        break;
    }
    default:
        break;
    }
}

/* ---- building the rank ---- */

static int64_t count_trainable(Model *md)
{
    int64_t n = 0;
    for (guint i = 0; i < md->trainable->len; i++)
        n += gt_numel(md->trainable->pdata[i]);
    return n;
}

/* ---- size_based_auto_wrap_policy ---- */

static int64_t numel_of(const AgTensor *t)
{
    return t ? gt_numel(t) : 0;
}

static int64_t lin_numel(const Lin *l)
{
    return numel_of(l->w) + numel_of(l->b);
}

/* The unit of a parameter outside the layers under the size-based plan: the token embedding
 * its own unit or the base model's; the output projection its own or the root's; the rest of
 * the base model (position embeddings, norms, projections) the base model's. */
static int outside_unit(const Dist *d, const AgTensor *p)
{
    const Model *md = &d->md;
    int root = d->n_units - 1;
    if (p == md->lm_head || p == md->lm_bias)
        return d->u_head >= 0 ? d->u_head : root;
    if (p == md->wte && d->u_embed >= 0)
        return d->u_embed;
    return d->u_base >= 0 ? d->u_base : root;
}

/* FSDP1's auto wrapping with size_based_auto_wrap_policy (torch/distributed/fsdp/wrap.py
 * _recursive_wrap, size_based_auto_wrap_policy; _wrap_utils.py _auto_wrap with
 * only_wrap_children for the root, which FSDP wraps itself): a module whose parameters not
 * yet wrapped number at least N is recursed into, its children wrapped first, then the
 * module itself when what remains is at least N — nn.ModuleList and ModuleDict never. On a
 * Hugging Face causal LM: a decoder layer of T ≥ N parameters is a unit unless a child of it
 * (the attention, the MLP or, in OPT, fc1 and fc2) has N or more, which would make units
 * inside the layer — refused; the token embedding and the output projection are units of
 * their own at N or more; the base model (LlamaModel, GPT2Model, OPTDecoder…) is one when
 * its remainder (the unwrapped layers, norms, position embeddings) reaches N; the root
 * holds the rest. Tied input and output embeddings must share a unit (FSDP's documented
 * restriction): one that puts the tied weight in the embedding's or the base model's unit,
 * apart from the output projection in the root, is refused too. */
static gboolean size_wrap_plan(Dist *d, GError **error)
{
    Model *md = &d->md;
    const MemsimModel *m = md->m;
    int L = (int)m->L;
    int64_t N = d->run->fsdp_wrap_min_params;
    bool opt_fc = m->fam == FAM_OPT; /* OPTDecoderLayer holds fc1 and fc2 itself */
    int *wrapped = g_new0(int, L);
    int64_t layers_total = 0, wrapped_total = 0;
    int n_layers = 0;
    for (int l = 0; l < L; l++) {
        const Layer *ly = &md->layers[l];
        int64_t attn = lin_numel(&ly->q) + lin_numel(&ly->k) + lin_numel(&ly->v) +
                       lin_numel(&ly->o) + lin_numel(&ly->qkv) + numel_of(ly->qn_w) +
                       numel_of(ly->qn_b) + numel_of(ly->kn_w) + numel_of(ly->kn_b);
        int64_t mlp = lin_numel(&ly->gate) + lin_numel(&ly->up) + lin_numel(&ly->down) +
                      numel_of(ly->router);
        for (int64_t e = 0; ly->experts && e < 3 * m->n_experts; e++)
            mlp += lin_numel(&ly->experts[e]);
        int64_t T = attn + mlp + numel_of(ly->ln1_w) + numel_of(ly->ln1_b) +
                    numel_of(ly->ln2_w) + numel_of(ly->ln2_b);
        layers_total += T;
        if (T < N)
            continue;
        const char *child = NULL;
        int64_t size = 0;
        if (attn >= N) {
            child = "attention";
            size = attn;
        } else if (!opt_fc && mlp >= N) {
            child = "MLP";
            size = mlp;
        } else if (opt_fc && lin_numel(&ly->up) >= N) {
            child = "fc1";
            size = lin_numel(&ly->up);
        } else if (opt_fc && lin_numel(&ly->down) >= N) {
            child = "fc2";
            size = lin_numel(&ly->down);
        }
        if (child) {
            int64_t above = attn;
            if (!opt_fc && mlp > above)
                above = mlp;
            if (opt_fc && lin_numel(&ly->up) > above)
                above = lin_numel(&ly->up);
            if (opt_fc && lin_numel(&ly->down) > above)
                above = lin_numel(&ly->down);
            g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                        "fsdp-wrap: size:%" G_GINT64_FORMAT " makes layer %d's %s (%" G_GINT64_FORMAT
                        " parameters) an FSDP unit of its own (size_based_auto_wrap_policy); "
                        "units inside a layer are not modelled: give N from %" G_GINT64_FORMAT
                        " to %" G_GINT64_FORMAT " for one unit per layer, or --fsdp-wrap layer",
                        N, l, child, size, above + 1, T);
            g_free(wrapped);
            return FALSE;
        }
        wrapped[l] = 1;
        wrapped_total += T;
        n_layers++;
    }
    int64_t E = numel_of(md->wte);
    int64_t extras = numel_of(md->wpe) + numel_of(md->norm_w) + numel_of(md->norm_b) +
                     numel_of(md->proj_in) + numel_of(md->proj_out) + numel_of(md->emb_ln_w) +
                     numel_of(md->emb_ln_b);
    int64_t base_total = E + extras + layers_total;
    bool embed = false, base = false;
    if (base_total >= N) {
        const AgTensor *const others[] = {md->wpe, md->proj_in, md->proj_out};
        const char *const names[] = {"position embedding", "project_in", "project_out"};
        for (gsize k = 0; k < G_N_ELEMENTS(others); k++)
            if (numel_of(others[k]) >= N) {
                g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                            "fsdp-wrap: size:%" G_GINT64_FORMAT " makes the %s (%" G_GINT64_FORMAT
                            " parameters) an FSDP unit of its own: not modelled",
                            N, names[k], numel_of(others[k]));
                g_free(wrapped);
                return FALSE;
            }
        embed = E >= N;
        base = base_total - (embed ? E : 0) - wrapped_total >= N;
    }
    bool tied = !md->lm_head;
    bool head = !tied && numel_of(md->lm_head) + numel_of(md->lm_bias) >= N;
    if (tied && (embed || base)) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "fsdp-wrap: size:%" G_GINT64_FORMAT " puts the tied input/output embedding "
                    "(%" G_GINT64_FORMAT " parameters) in the %s unit, apart from the output "
                    "projection that uses it after that unit is resharded; FSDP needs tied "
                    "weights in one unit: give N above %" G_GINT64_FORMAT ", or --fsdp-wrap layer",
                    N, E, embed ? "token embedding's" : "base model's",
                    base_total - wrapped_total);
        g_free(wrapped);
        return FALSE;
    }
    /* the units: the wrapped layers in order, then the embedding, the base model, the head,
     * the root last */
    d->layer_unit = g_new(int, L);
    int u = 0;
    for (int l = 0; l < L; l++)
        d->layer_unit[l] = wrapped[l] ? u++ : -1;
    d->u_embed = embed ? u++ : -1;
    d->u_base = base ? u++ : -1;
    d->u_head = head ? u++ : -1;
    d->n_units = u + 1;
    /* the post-forward order: the embedding, the layers, the base model, the head */
    d->order = g_new(int, d->n_units);
    d->order_pos = g_new(int, d->n_units);
    for (int k = 0; k < d->n_units; k++)
        d->order_pos[k] = -1;
    d->n_order = 0;
    if (embed)
        d->order[d->n_order++] = d->u_embed;
    for (int l = 0; l < L; l++)
        if (wrapped[l])
            d->order[d->n_order++] = d->layer_unit[l];
    if (base)
        d->order[d->n_order++] = d->u_base;
    if (head)
        d->order[d->n_order++] = d->u_head;
    d->order[d->n_order++] = d->n_units - 1; /* the root's forward ends last */
    for (int k = 0; k < d->n_order; k++)
        d->order_pos[d->order[k]] = k;
    (void)n_layers;
    g_free(wrapped);
    return TRUE;
}

/* Re-homes the parameters of each unit into one non-resident flat storage (FSDP
 * FlatParameter / ZeRO-3 gather buffer). The model was built without parameter storage
 * (meta device / zero.Init): each unit is materialised on its own, sharded, and its full
 * copy freed, so only one unit's unsharded parameters exist at a time. */
static void make_units(Dist *d, DType compute_dt)
{
    Model *md = &d->md;
    AgGraph *g = d->g;
    int L = (int)md->m->L;
    if (!d->layer_unit)
        d->n_units = d->run->fsdp_wrap_model == 1 ? 1 : L + 1;
    d->units = g_new0(Unit, d->n_units);
    d->unit_of_param = g_hash_table_new(NULL, NULL);
    d->bw_unit = -1;
    for (int u = 0; u < d->n_units; u++) {
        d->units[u].params = g_ptr_array_new();
        d->units[u].root = u == d->n_units - 1;
        d->units[u].outer = d->units[u].root || u == d->u_base;
    }
    /* which unit a parameter belongs to: its layer, found through the Layer structs; QLoRA's
     * absmax (a quant_state, not a parameter) stays whole on every rank */
    GHashTable *layer_of = g_hash_table_new(NULL, NULL);
    GHashTable *absmax = g_hash_table_new(NULL, NULL);
    for (int l = 0; l < L && d->n_units > 1; l++) {
        const Layer *ly = &md->layers[l];
        const Lin *lins[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->qkv, &ly->gate, &ly->up, &ly->down};
        for (gsize k = 0; k < G_N_ELEMENTS(lins); k++) {
            const AgTensor *const t[] = {lins[k]->w, lins[k]->b, lins[k]->lora_a, lins[k]->lora_b};
            for (gsize j = 0; j < G_N_ELEMENTS(t); j++)
                if (t[j])
                    g_hash_table_insert(layer_of, (gpointer)t[j], GINT_TO_POINTER(l + 1));
            if (lins[k]->absmax)
                g_hash_table_add(absmax, lins[k]->absmax);
        }
        for (int64_t e = 0; ly->experts && e < 3 * md->m->n_experts; e++) {
            const Lin *x = &ly->experts[e];
            const AgTensor *const t[] = {x->w, x->b, x->lora_a, x->lora_b};
            for (gsize j = 0; j < G_N_ELEMENTS(t); j++)
                if (t[j])
                    g_hash_table_insert(layer_of, (gpointer)t[j], GINT_TO_POINTER(l + 1));
            if (x->absmax)
                g_hash_table_add(absmax, x->absmax);
        }
        const AgTensor *const rest[] = {ly->ln1_w, ly->ln1_b, ly->ln2_w, ly->ln2_b, ly->router};
        for (gsize k = 0; k < G_N_ELEMENTS(rest); k++)
            if (rest[k])
                g_hash_table_insert(layer_of, (gpointer)rest[k], GINT_TO_POINTER(l + 1));
    }
    /* every parameter, trained or frozen (in registration order); a packed 4-bit weight is
     * flattened as its bytes in the compute dtype (bnb_4bit_quant_storage); with LoRA, FSDP
     * runs with use_orig_params, each parameter starting at a multiple of 16 bytes */
    AgContext *c = gg_ctx(g);
    int64_t frozen_part = 0, persistent = 0;
    /* use_orig_params (FSDP1, always with LoRA): each parameter starts at a multiple of 16
     * bytes of the FlatParameter (_flat_param.py _init_flat_param_and_metadata,
     * _get_aligned_numel) */
    bool orig_params = d->fsdp == 1 && ((d->lora && !d->lora_wrap) || d->run->fsdp_use_orig_params);
    int64_t align = orig_params ? 16 / dt_size(compute_dt) : 1;
    for (guint i = 0; i < md->leaves->len; i++) {
        AgTensor *p = md->leaves->pdata[i];
        if (!p->st || p->st->category != MEMSIM_CAT_PARAMETER)
            continue;
        if (g_hash_table_contains(absmax, p)) {
            c->category = MEMSIM_CAT_PARAMETER;
            gg_storage_restore(g, p->st);
            continue;
        }
        int64_t n = p->dt == DT_U8 ? gt_nbytes(p) / dt_size(compute_dt) : gt_numel(p);
        /* ZeRO-3 with a config: a parameter of at most stage3_param_persistence_threshold
         * elements (while the persistent total stays within stage3_model_persistence_threshold)
         * is gathered once and never released (parameter_offload.py
         * mark_persistent_parameters): whole on every rank, outside its layer's gather */
        if (d->ds && d->method == MEMSIM_METHOD_ZERO3 && n <= d->z.persist_threshold &&
            persistent + n <= d->z.model_persist_threshold) {
            persistent += n;
            c->category = MEMSIM_CAT_PARAMETER;
            gg_storage_restore(g, p->st);
            if (p->dt != DT_U8)
                p->dt = compute_dt;
            continue;
        }
        int unit = GPOINTER_TO_INT(g_hash_table_lookup(layer_of, p)) - 1;
        if (unit >= 0 && d->layer_unit)
            unit = unit_of(d, unit);
        else if (unit < 0 && d->layer_unit)
            unit = outside_unit(d, p);
        else if (unit < 0)
            unit = d->n_units - 1;
        g_ptr_array_add(d->units[unit].params, p);
        d->units[unit].numel += (n + align - 1) / align * align;
        /* FSDP2: each parameter its own Shard(0), dim 0 padded to a multiple of N
         * (_fsdp_param.py FSDPParam._init_sharded_param, _get_dim0_padded_size) */
        if (d->fsdp == 2) {
            int64_t d0 = p->nd ? p->shape[0] : 1;
            d->units[unit].shard_numel += (d0 + d->N - 1) / d->N * (n / (d0 ? d0 : 1));
        }
        if (p->requires_grad) {
            d->units[unit].train_numel += n;
            d->units[unit].adapter_shard += (n + d->N - 1) / d->N;
        } else {
            d->units[unit].frozen_shard += n;
        }
        if (!p->requires_grad)
            frozen_part += (n + d->N - 1) / d->N;
        g_hash_table_insert(d->unit_of_param, p, GINT_TO_POINTER(unit + 1));
    }
    g_hash_table_unref(layer_of);
    g_hash_table_unref(absmax);
    for (int u = 0; u < d->n_units; u++) {
        Unit *un = &d->units[u];
        if (d->lora_wrap) {
            /* peft's fsdp_auto_wrap_policy: the frozen layer one FlatParameter (⌈F/N⌉ of its
             * F elements), each adapter Linear another (⌈a/N⌉ each), gathered together */
            un->frozen_shard = (un->frozen_shard + d->N - 1) / d->N;
            un->shard_numel = un->frozen_shard + un->adapter_shard;
        } else if (d->fsdp != 2) {
            un->shard_numel = (un->numel + d->N - 1) / d->N;
        }
        /* the unit on the GPU in full (fp32 for FSDP's local shard, the compute dtype for
         * zero.Init), then its shard */
        DType full_dt = d->method == MEMSIM_METHOD_ZERO3 || d->lora ? compute_dt : DT_F32;
        /* (with CPU offload the unit is materialised and sharded on the host) */
        AgTensor *whole = d->offload ? NULL : alloc_cat(g, MEMSIM_CAT_PARAMETER, full_dt, un->numel);
        c->category = MEMSIM_CAT_PARAMETER;
        un->full = gg_storage_new(g, (uint64_t)un->shard_numel * d->N * (uint64_t)dt_size(compute_dt),
                                  false);
        if (d->offload) {
            /* CPUOffload: the shard lives in pinned host memory (_flat_param.py
             * FlatParamHandle.shard → _local_shard pinned; FSDP2 CPUOffloadPolicy pins the
             * sharded DTensors), the optimizer's view of it too (its .grad: _cpu_grad) */
            gg_host(g, un->shard_numel * dt_size(full_dt) * 2);
            AgStorage *hs = gg_storage_new(g, (uint64_t)un->shard_numel * dt_size(full_dt), false);
            un->shard = gg_leaf_in(g, hs, full_dt, 1, (int64_t[]){un->shard_numel}, false);
            gg_storage_unref(g, hs);
        } else if (d->sharding == 3 && compute_dt == full_dt) {
            /* NO_SHARD without mixed precision: the FlatParameter is the parameters */
            gg_storage_restore(g, un->full);
            un->shard = gg_leaf_in(g, un->full, full_dt, 1, (int64_t[]){un->shard_numel}, false);
        } else if (d->lora_wrap) {
            un->shard = alloc_cat(g, MEMSIM_CAT_PARAMETER, full_dt, un->frozen_shard);
            if (un->adapter_shard) /* peft's adapters stay fp32 */
                un->adapter = alloc_cat(g, MEMSIM_CAT_PARAMETER, DT_F32, un->adapter_shard);
        } else if (d->method != MEMSIM_METHOD_ZERO3) {
            un->shard = alloc_cat(g, MEMSIM_CAT_PARAMETER, full_dt, un->shard_numel);
        }
        gt_unref(g, whole);
        for (guint i = 0; i < un->params->len; i++) {
            AgTensor *p = un->params->pdata[i];
            /* the tensor now views the unit's flat buffer */
            AgStorage *old = p->st;
            gg_storage_release(g, old);
            gg_storage_unref(g, old);
            p->st = un->full;
            un->full->refs++;
            if (p->dt != DT_U8)
                p->dt = compute_dt;
            if (p->requires_grad)
                un->pending++;
            /* FSDP1 registers plain Tensor views of the FlatParameter in forward
             * (_flat_param.py _use_unsharded_flat_param: as_params=not in_forward), which
             * autocast does not cache (it caches leaves that require grad); FSDP2's
             * unsharded parameters are nn.Parameters, cached for the whole forward */
            p->view_in_forward = d->fsdp == 1;
        }
        un->trainable = un->pending;
    }
    if (d->method == MEMSIM_METHOD_ZERO3) { /* lp_param_buffer: the trained bf16 partitions */
        if (d->ds && d->z.offload_param) /* ZeRO-Infinity: the partitions on the host */
            gg_host(g, d->psi_pad / d->N * (int64_t)dt_size(d->cdt));
        else
            d->flat = alloc_cat(g, MEMSIM_CAT_PARAMETER, d->cdt, d->psi_pad / d->N);
        if (frozen_part) /* the frozen ones stay per-parameter ds_tensors */
            d->frozen_part = alloc_cat(g, MEMSIM_CAT_PARAMETER, compute_dt, frozen_part);
    }
    c->category = MEMSIM_CAT_TEMPORARY;
}

static void free_units(Dist *d)
{
    for (int u = 0; u < d->n_units; u++) {
        Unit *un = &d->units[u];
        gt_unref(d->g, un->opt);
        gt_unref(d->g, un->shard);
        gt_unref(d->g, un->post_fwd);
        gt_unref(d->g, un->adapter);
        gg_storage_unref(d->g, un->full);
        g_ptr_array_unref(un->params);
    }
    g_free(d->units);
    g_hash_table_unref(d->unit_of_param);
    g_free(d->layer_unit);
    g_free(d->order);
    g_free(d->order_pos);
}

/* ---- the method's part of the training loop (LoopHooks, traces/loop.h) ---- */

/* ZeroRedundancyOptimizer's partition (torch/distributed/optim/zero_redundancy_optimizer.py
 * _partition_parameters, 1.13 and current): the parameters sorted by numel, largest first
 * (Python's sort is stable: ties keep their order), each given whole to the rank with the
 * fewest elements so far (_get_min_index: the first such rank). The rank's local optimizer
 * holds its parameters in that order. */
static GPtrArray *zr_partition(GPtrArray *params, int N, int rank)
{
    GPtrArray *sorted = g_ptr_array_copy(params, NULL, NULL);
    /* a stable insertion sort by numel, descending */
    for (guint i = 1; i < sorted->len; i++) {
        gpointer x = sorted->pdata[i];
        guint j = i;
        while (j > 0 && gt_numel(sorted->pdata[j - 1]) < gt_numel(x)) {
            sorted->pdata[j] = sorted->pdata[j - 1];
            j--;
        }
        sorted->pdata[j] = x;
    }
    int64_t *sizes = g_new0(int64_t, N);
    GPtrArray *mine = g_ptr_array_new();
    for (guint i = 0; i < sorted->len; i++) {
        int r = 0;
        for (int k = 1; k < N; k++)
            if (sizes[k] < sizes[r])
                r = k;
        sizes[r] += gt_numel(sorted->pdata[i]);
        if (r == rank)
            g_ptr_array_add(mine, sorted->pdata[i]);
    }
    g_free(sizes);
    g_ptr_array_unref(sorted);
    return mine;
}

/* DDP's _rebuild_buckets at the second forward: ≤ 25 MiB buckets (the first 1 MiB) in the
 * order the gradients became ready. */
static void dp_before_step(void *user, int step)
{
    Dist *d = user;
    d->step = step;
    d->micro = 0;
    if (d->method != MEMSIM_METHOD_DDP || step != 2 || d->ddp_rebuilt)
        return;
    AgGraph *g = d->g;
    gt_unref(g, d->buckets->pdata[0]);
    g_ptr_array_remove_index(d->buckets, 0);
    int64_t cur = 0, cap = DDP_FIRST_BUCKET;
    for (int i = (int)d->md.trainable->len - 1; i >= 0; i--) {
        cur += gt_nbytes(d->md.trainable->pdata[i]);
        if (cur >= cap || i == 0) {
            g_ptr_array_add(d->buckets, alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, DT_U8, cur));
            cur = 0;
            cap = DDP_BUCKET;
        }
    }
    d->ddp_rebuilt = true;
}

static void dp_before_forward(void *user)
{
    Dist *d = user;
    d->micro++;
    d->ddp_pending = (int64_t)d->md.trainable->len;
    if (d->units) /* the root unit: gathered for the step, freed after backward */
        unshard(d, d->n_units - 1);
}

/* Micro-batches the loop counts as run without running them (a steady state): the
 * accumulation counter moves on as their forwards would have moved it. */
static void dp_skip_microbatches(void *user, int n)
{
    Dist *d = user;
    d->micro += n;
}

static void dp_after_backward(void *user)
{
    Dist *d = user;
    AgGraph *g = d->g;
    if (d->method == MEMSIM_METHOD_ZERO1 || d->method == MEMSIM_METHOD_ZERO2 ||
        d->method == MEMSIM_METHOD_ZERO3)
        zero_flush(d);
    if (d->units) {
        /* FSDP2's root post-backward: the last reduce-scatter input and all-gather output go
         * (_fsdp_state.py _root_post_backward_final_callback) */
        if (d->fsdp == 2) {
            gg_wait_stream(g, S_COMPUTE, S_POST);
            gg_wait_stream(g, S_PRE, S_COMPUTE);
        }
        gt_unref(g, d->rs_prev);
        gt_unref(g, d->ag_prev);
        d->rs_prev = d->ag_prev = NULL;
        for (int u = 0; u < d->n_units; u++) {
            reshard(d, u);
            d->units[u].pending = d->units[u].trainable;
        }
        d->bw_unit = -1;
        d->root_pre_backward = false;
    }
    gg_wait_stream(g, S_COMPUTE, S_COMM);
    gg_wait_stream(g, S_COMPUTE, S_POST);
}

/* What the optimizer steps: DDP the model's parameters (torch.optim on the replica); FSDP the
 * units' shards, their gradient shards as .grad; DeepSpeed (stage_1_and_2.py, stage3.py
 * step) the fp32 partition, whose .grad is the flattened bf16 gradient partition cast to
 * fp32 (the bf16 flat copy dies at once, the fp32 one once the step is done). */
static GPtrArray *dp_before_optimizer(void *user, int step)
{
    Dist *d = user;
    if (d->method == MEMSIM_METHOD_DDP)
        return d->zr_params ? d->zr_params : d->md.trainable;
    if (d->offload) {
        /* the optimizer steps on the host shards (FSDP1 CPUOffload: "the optimizer step on
         * CPU"; FSDP2 CPUOffloadPolicy alike): its state is host memory, made at the first
         * step; nothing of it on the GPU */
        if (step == 1)
            for (int u = 0; u < d->n_units; u++)
                gg_host(d->g, d->units[u].shard_numel * d->host_state);
        return d->opt_params; /* empty (dp_optimizer) */
    }
    if (d->method == MEMSIM_METHOD_ZERO1 || d->method == MEMSIM_METHOD_ZERO2 ||
        d->method == MEMSIM_METHOD_ZERO3) {
        int64_t part = d->psi_pad / d->N;
        if (d->ds && d->z.offload_optimizer) {
            /* ZeRO-Offload: DeepSpeedCPUAdam steps the host partition against its host fp32
             * gradient; its exp_avg and exp_avg_sq are made at the first step (cpu_adam.py
             * step: state initialised lazily); the GPU steps nothing */
            if (!d->adam_on_host) {
                gg_host(d->g, part * 8);
                d->adam_on_host = true;
            }
            return d->opt_params;
        }
        /* stage 3 steps sub-group by sub-group (stage3.py step: _prepare_sub_group and
         * _optimizer_step per sub_group_size elements): its temporaries are one sub-group's */
        int64_t n = part;
        if (d->ds && d->method == MEMSIM_METHOD_ZERO3 && d->z.sub_group < n)
            n = d->z.sub_group;
        AgTensor *flat16 = alloc_cat(d->g, MEMSIM_CAT_TEMPORARY, d->cdt, n);
        d->master->grad = alloc_cat(d->g, MEMSIM_CAT_TEMPORARY, DT_F32, n);
        gt_unref(d->g, flat16);
    }
    return d->opt_params;
}

/* DeepSpeed after its step: the parameters all-gathered (stage 1/2), its buffers released,
 * the engine's zero_grad on the bf16 parameters. */
static void dp_after_optimizer(void *user, int step)
{
    Dist *d = user;
    AgGraph *g = d->g;
    (void)step;
    if (d->zr_params) {
        /* ZeroRedundancyOptimizer.step's _sync_params: each parameter broadcast from its
         * owner into param.data, in place; then zero_grad over every parameter (the
         * wrapper's param_groups hold them all), not only the rank's own */
        for (guint i = 0; i < d->md.trainable->len; i++) {
            AgTensor *p = d->md.trainable->pdata[i];
            gg_collective(g, MEMSIM_COLL_BROADCAST, (uint64_t)gt_nbytes(p), 0,
                          coll_us(d, MEMSIM_COLL_BROADCAST, (uint64_t)gt_nbytes(p)));
            if (d->opt.to_none && p->grad) {
                AgTensor *gr = p->grad;
                p->grad = NULL;
                gt_unref(g, gr);
            }
        }
        return;
    }
    if (d->method != MEMSIM_METHOD_ZERO1 && d->method != MEMSIM_METHOD_ZERO2 &&
        d->method != MEMSIM_METHOD_ZERO3)
        return;
    if (d->ds && d->z.offload_optimizer) {
        /* the updated host partition back into the GPU's parameters: stage 1/2 through a GPU
         * fp32 copy (stage_1_and_2.py step: fp32_partition.to(device), then copy_); stage 3
         * by a blocking copy_ whose dtype conversion runs on the CPU (stage3.py
         * _reassign_or_swap_out_partitioned_parameters; aten/src/ATen/native/cuda/Copy.cu
         * copy_kernel_cuda), sub-group by sub-group; host to host with offload_param */
        int64_t part = d->psi_pad / d->N;
        if (d->method != MEMSIM_METHOD_ZERO3) {
            gt_unref(g, alloc_cat(g, MEMSIM_CAT_TEMPORARY, DT_F32, part));
        } else if (!d->z.offload_param) {
            int64_t n = d->z.sub_group < part ? d->z.sub_group : part;
            gg_host(g, n * (int64_t)dt_size(d->cdt));
            gg_host(g, -n * (int64_t)dt_size(d->cdt));
        }
    }
    if (d->method != MEMSIM_METHOD_ZERO3) {
        /* all_gather_into_tensor straight into the flat parameters: in place */
        gg_collective(g, MEMSIM_COLL_ALL_GATHER, (uint64_t)d->psi_pad * 2, 0,
                      coll_us(d, MEMSIM_COLL_ALL_GATHER, (uint64_t)d->psi_pad * 2));
        /* stage 1/2: grads_in_partition and the ipg buffers go; stage 3 keeps both */
        gt_unref(g, d->grad_part);
        d->grad_part = NULL;
        gt_unref(g, d->ipg);
        d->ipg = NULL;
        gt_unref(g, d->ipg2);
        d->ipg2 = NULL;
    }
    d->ipg_fill = 0;
    /* the engine's zero_grad (set_to_none) on the bf16 parameters: stage 1 kept the full
     * gradients through backward */
    for (guint i = 0; i < d->md.trainable->len; i++) {
        AgTensor *p = d->md.trainable->pdata[i];
        if (p->grad) {
            AgTensor *gr = p->grad;
            p->grad = NULL;
            gt_unref(g, gr);
        }
    }
}

/* The optimizer of a data-parallel rank: torch.optim as the run asks (DDP on the replica,
 * FSDP on the shards), or DeepSpeed's. */
static void dp_optimizer(Dist *d, const MemsimRun *run, const AgRules *rules)
{
    optimizer_init(&d->opt, run, rules);
    /* the distributed programs write their optimizer's state and temporaries as plain
     * `empty` allocations, as they always have (one GPU names torch's ops) */
    d->opt.plain_ops = true;
    d->opt_params = g_ptr_array_new();
    switch (d->method) {
    case MEMSIM_METHOD_ZERO1:
    case MEMSIM_METHOD_ZERO2:
    case MEMSIM_METHOD_ZERO3:
        optimizer_for_method(&d->opt, d->method);
        if (d->master) /* ZeRO-Offload: the optimizer is on the host */
            g_ptr_array_add(d->opt_params, d->master);
        break;
    case MEMSIM_METHOD_FSDP:
    case MEMSIM_METHOD_FSDP_GRAD_OP:
    case MEMSIM_METHOD_HSDP:
        /* the optimizer holds each unit's sharded FlatParameter; with LoRA (use_orig_params)
         * the trained parameters' views, this rank's even share ⌈numel/N⌉ per unit */
        for (int u = 0; u < d->n_units && !d->offload; u++) {
            Unit *un = &d->units[u];
            int64_t n = d->lora_wrap ? un->adapter_shard
                        : d->lora    ? (un->train_numel + d->N - 1) / d->N
                                     : un->shard_numel;
            if (!n)
                continue;
            un->opt = gt_view_of(d->g, d->lora_wrap ? un->adapter : un->shard, 1, (int64_t[]){n},
                                 NULL);
            if (d->lora && !d->lora_wrap) /* the adapters of the bf16 FlatParameter (the file's header) */
                un->opt->dt = DT_BF16;
            g_ptr_array_add(d->opt_params, un->opt);
        }
        break;
    default:
        break;
    }
}

/* `zr_rank`: with ZeroRedundancyOptimizer, the rank whose program this is (each differs by
 * its optimizer's share); -1: one program for all the ranks. */
static gboolean dp_program(const MemsimModel *m, const MemsimRun *run, MemsimTrace *t,
                           const AgRules *rules, const GpuProfile *gpu, int zr_rank,
                           GError **error)
{
    MemsimMethod meth = run->method;
    bool fsdp = meth == MEMSIM_METHOD_FSDP || meth == MEMSIM_METHOD_FSDP_GRAD_OP ||
                meth == MEMSIM_METHOD_HSDP;
    /* the sharding strategy: the method's, or --fsdp-sharding with --method fsdp */
    int sharding = meth == MEMSIM_METHOD_FSDP_GRAD_OP ? 1
                   : meth == MEMSIM_METHOD_HSDP       ? 2
                   : meth == MEMSIM_METHOD_FSDP       ? run->fsdp_sharding
                                                      : 0;
    int N = run->gpus;
    if (fsdp && sharding == 2)
        N = run->gpus_per_node < run->gpus ? run->gpus_per_node : run->gpus;
    if (fsdp && sharding == 3)
        N = 1;
    guint32 rank = zr_rank >= 0 ? memsim_trace_add_rank(t, (guint32)zr_rank, 1)
                                : memsim_trace_add_rank(t, 0, (guint32)run->gpus);
    static const char *names[] = {"", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op",
                                  "hsdp", "megatron"};
    memsim_trace_header(t)->ranks[rank].role =
        zr_rank >= 0 ? g_strdup_printf("ddp + ZeroRedundancyOptimizer rank %d of %d", zr_rank,
                                       run->gpus)
                     : g_strdup_printf("%s data-parallel rank (%d of them)", names[meth], run->gpus);
    AgGraph *g = gg_new(t, rank, rules);
    Dist *d = g_new0(Dist, 1);
    d->g = g;
    d->run = run;
    d->method = meth;
    d->N = N;
    d->zr_rank = zr_rank;
    d->inflight = g_queue_new();
    d->buckets = g_ptr_array_new();
    d->comm_us_per_byte = comm_cost(gpu, (fsdp && sharding == 3 ? run->gpus : N) <= run->gpus_per_node);
    d->limit = true;
    gg_set_gpu(g, gpu, run->precision == MEMSIM_PREC_FP32);
    /* DeepSpeed and FSDP MixedPrecision compute in bf16 on bf16 parameters */
    MemsimRun eff = *run;
    bool lowp = run->precision != MEMSIM_PREC_FP32;
    if (meth != MEMSIM_METHOD_DDP && lowp)
        eff.precision = run->precision == MEMSIM_PREC_FP16_MIXED || run->precision == MEMSIM_PREC_FP16
                            ? MEMSIM_PREC_FP16
                            : MEMSIM_PREC_BF16;
    if (fsdp) {
        /* FSDP as configured: MixedPrecision's param_dtype (default the precision's: bf16 for
         * bf16-mixed, as before), reduce_dtype (default param_dtype: api.py MixedPrecision,
         * _fsdp_api.py MixedPrecisionPolicy), the sharded parameters in fp32 */
        static const DType dts[] = {DT_F32, DT_BF16, DT_F16};
        d->fsdp = run->fsdp_version + 1;
        d->sharding = sharding;
        d->orig_dt = DT_F32; /* LoRA: see below */
        d->param_dt = memsim_run_given(run, "fsdp-param-dtype") ? dts[run->fsdp_param_dtype]
                      : eff.precision == MEMSIM_PREC_FP16 ? DT_F16
                      : eff.precision == MEMSIM_PREC_BF16 ? DT_BF16
                                                          : DT_F32;
        d->reduce_dt = memsim_run_given(run, "fsdp-reduce-dtype") ? dts[run->fsdp_reduce_dtype]
                                                                  : d->param_dt;
        /* fp32 parameters: no MixedPrecision; under a -mixed precision torch.autocast casts
         * per op (the recipe without FSDP MixedPrecision), else fp32 throughout */
        eff.precision = d->param_dt == DT_BF16 ? MEMSIM_PREC_BF16
                        : d->param_dt == DT_F16 ? MEMSIM_PREC_FP16
                        : run->precision == MEMSIM_PREC_BF16_MIXED ||
                                run->precision == MEMSIM_PREC_FP16_MIXED
                            ? run->precision
                            : MEMSIM_PREC_FP32;
        d->offload = run->fsdp_offload;
        d->keep_after_forward = sharding == 1 || (d->fsdp == 2 && !run->fsdp_reshard_after_forward);
        /* FSDP1's limiter as given; FSDP2 has none (_fsdp_param_group.py: no rate limiter) */
        d->limit = d->fsdp == 1 && run->fsdp_limit_all_gathers;
        d->prefetch = d->fsdp == 1 ? run->fsdp_backward_prefetch : 0;
        /* the optimizer's host state per shard element (fp32): AdamW two moments,
         * SGD with momentum one buffer, SGD none */
        d->host_state = run->optimizer == MEMSIM_OPTIM_ADAMW           ? 8
                        : run->optimizer == MEMSIM_OPTIM_SGD_MOMENTUM ? 4
                                                                       : 0;
    }
    /* the sharded methods materialise their units one at a time (make_units) */
    bool units = meth != MEMSIM_METHOD_DDP && meth != MEMSIM_METHOD_ZERO1 &&
                 meth != MEMSIM_METHOD_ZERO2;
    gg_ctx(g)->meta_params = units;
    gboolean built = model_build(&d->md, g, m, &eff, error);
    gg_ctx(g)->meta_params = false;
    d->u_embed = d->u_base = d->u_head = -1;
    /* FSDP1's size-based wrapping: its units, or a refusal (size_wrap_plan) */
    if (built && fsdp && run->fsdp_wrap_model == 3)
        built = size_wrap_plan(d, error);
    if (!built) {
        model_clear(&d->md);
        gg_free(g);
        g_queue_free(d->inflight);
        g_ptr_array_unref(d->buckets);
        g_free(d);
        return FALSE;
    }
    d->md.layer_hook = layer_hook;
    if (d->layer_unit)
        d->md.module_hook = module_hook;
    d->lora = run->finetune != MEMSIM_FT_FULL;
    /* LoRA: the FlatParameter is in the frozen base's dtype, which MixedPrecision's
     * param_dtype matches, so there is no _mp_shard (_flat_param.py
     * _uses_param_mixed_precision) and the gradient shard stays in that dtype */
    d->lora_wrap = fsdp && d->lora && run->fsdp_wrap_model == 2;
    if (fsdp && d->lora && !d->lora_wrap)
        d->orig_dt = d->param_dt;
    d->psi = count_trainable(&d->md);
    d->psi_pad = (d->psi + 2 * N - 1) / (2 * N) * (2 * N);
    d->ds = run->deepspeed != NULL;
    d->rb = RB_ELEMENTS;
    if (d->ds) {
        d->z = ds_zero_resolved(run->deepspeed, m->H);
        d->rb = d->z.reduce_bucket;
        d->pending = g_ptr_array_new();
    }
    for (guint i = 0; i < d->md.trainable->len; i++)
        if (gt_numel(d->md.trainable->pdata[i]) > d->largest)
            d->largest = gt_numel(d->md.trainable->pdata[i]);
    AgContext *c = gg_ctx(g);
    DType cdt = eff.precision == MEMSIM_PREC_FP32 ? DT_F32 : eff.precision == MEMSIM_PREC_FP16 ? DT_F16 : DT_BF16;
    if (fsdp)
        cdt = d->param_dt;
    d->cdt = cdt;
    /* DeepSpeed's bf16 engine casts the whole module, peft's fp32 adapters included; FSDP
     * needs one dtype per FlatParameter: the adapters take the frozen base's */
    if (meth != MEMSIM_METHOD_DDP)
        for (guint i = 0; i < d->md.trainable->len; i++)
            ((AgTensor *)d->md.trainable->pdata[i])->dt = cdt;
    switch (meth) {
    case MEMSIM_METHOD_DDP: {
        /* iteration 1: one bucket of every gradient (torch/nn/parallel/distributed.py
         * _ddp_init_helper: bucket_size_limits [sys.maxsize] without find_unused_parameters,
         * 1.13 as 2.x; the gloo recordings of tests/data/reference-dist agree) */
        int64_t bytes = 0;
        for (guint i = 0; i < d->md.trainable->len; i++)
            bytes += gt_nbytes(d->md.trainable->pdata[i]);
        g_ptr_array_add(d->buckets, alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, DT_U8, bytes));
        break;
    }
    case MEMSIM_METHOD_ZERO1:
    case MEMSIM_METHOD_ZERO2: {
        /* the flat bf16 buffer (params become views of it): the build's own storages go */
        /* (through the CPU: the parameters' GPU storage goes before the flat buffer comes) */
        c->category = MEMSIM_CAT_PARAMETER;
        AgStorage *flat = gg_storage_new(g, (uint64_t)d->psi_pad * (uint64_t)dt_size(cdt), false);
        for (guint i = 0; i < d->md.trainable->len; i++) {
            AgTensor *p = d->md.trainable->pdata[i];
            AgStorage *old = p->st;
            gg_storage_release(g, old);
            gg_storage_unref(g, old);
            p->st = flat;
            flat->refs++;
        }
        /* the frozen base (LoRA, QLoRA) is not the optimizer's: it stays as loaded */
        gg_storage_restore(g, flat);
        gg_storage_unref(g, flat);
        if (d->ds && d->z.offload_optimizer) {
            /* ZeRO-Offload (stage_1_and_2.py __init__): the fp32 partition on the host (pinned
             * with pin_memory), its fp32 gradient made by initialize_optimizer_states and kept
             * there, the host staging buffer of the largest parameter
             * (temp_grad_buffer_for_cpu_offload); on the GPU, temp_grad_buffer_for_gpu_offload
             * of the largest parameter's numel in the parameters' dtype */
            gg_host(g, d->psi_pad / N * 4 * 2 + d->largest * dt_size(cdt));
            d->offload_tmp = alloc_cat(g, MEMSIM_CAT_GRADIENT, cdt, d->largest);
        } else {
            d->master = alloc_cat(g, MEMSIM_CAT_OPTIMIZER_STATE, DT_F32, d->psi_pad / N);
        }
        c->category = MEMSIM_CAT_TEMPORARY;
        break;
    }
    case MEMSIM_METHOD_ZERO3:
        make_units(d, cdt);
        if (d->ds && d->z.offload_optimizer)
            /* stage3.py with offload_optimizer: the fp32 partitions and their fp32 gradients
             * on the host (_create_fp32_partitions, initialize_optimizer_states), and the
             * gradient partitions' flat buffer too (grad_partitions_flat_buffer on
             * self.device, the CPU; gradient_accumulation_dtype = the parameters') */
            gg_host(g, d->psi_pad / N * (4 + 4 + (int64_t)dt_size(cdt)));
        else
            d->master = alloc_cat(g, MEMSIM_CAT_OPTIMIZER_STATE, DT_F32, d->psi_pad / N);
        if (!d->ds || d->z.contiguous_gradients)
            d->ipg = alloc_cat(g, MEMSIM_CAT_COMM_BUFFER, d->cdt, ipg_cap(d));
        if (!(d->ds && d->z.offload_optimizer))
            d->grad_part = alloc_cat(g, MEMSIM_CAT_GRADIENT, d->cdt, d->psi_pad / N);
        break;
    default:
        make_units(d, cdt);
        break;
    }
    AgHooks hooks = {post_accumulate, pre_backward_layer, d, pre_backward_module};
    gg_set_hooks(g, &hooks);

    dp_optimizer(d, run, rules);
    if (zr_rank >= 0)
        d->zr_params = zr_partition(d->md.trainable, N, zr_rank);
    LoopHooks loop = {dp_before_step,      dp_before_forward,  dp_after_backward,
                      dp_before_optimizer, dp_after_optimizer, d,
                      dp_skip_microbatches};
    loop_train(&d->md, &d->opt, &loop);
    optimizer_clear(g, &d->opt);
    g_ptr_array_unref(d->opt_params);
    if (d->zr_params)
        g_ptr_array_unref(d->zr_params);
    for (guint i = 0; i < d->buckets->len; i++)
        gt_unref(g, d->buckets->pdata[i]);
    g_ptr_array_unref(d->buckets);
    gt_unref(g, d->master);
    gt_unref(g, d->ipg);
    gt_unref(g, d->ipg2);
    gt_unref(g, d->offload_tmp);
    if (d->pending) {
        for (guint i = 0; i < d->pending->len; i++)
            gt_unref(g, d->pending->pdata[i]);
        g_ptr_array_unref(d->pending);
    }
    gt_unref(g, d->grad_part);
    gt_unref(g, d->flat);
    gt_unref(g, d->frozen_part);
    if (d->units)
        free_units(d);
    g_queue_free(d->inflight);
    model_clear(&d->md);
    gg_free(g);
    g_free(d);
    return TRUE;
}

/* ---- Megatron: pipeline stages ---- */

typedef struct {
    AgTensor *in;   /* received activation (leaf requiring grad), or NULL on stage 0 */
    AgTensor *out;  /* output (storage freed after send) or loss */
} InFlight;

/* The steady phase of a 1F1B stage (megatron/core/pipeline_parallel/schedules.py
 * forward_backward_pipelining_without_interleaving: num_warmup_microbatches forwards, then one
 * forward and one backward per micro-batch, then the cool-down backwards): its forward-backward
 * pairs are the units of traces/loop.c's steady state; a middle pair that repeats the one
 * before it is generated once, the micro-batches in flight then handed on to the pairs after
 * the repeated ones. The interleaved schedule's steady pairs (forward_backward_pipelining_
 * with_interleaving) go through the chunks group by group (get_schedule_table: a group of g
 * micro-batches through every chunk in turn): v g pairs, a group's worth, make its unit, the
 * next unit the same g micro-batches later; with a last group shorter than g the table does
 * not repeat to its end, and the schedule runs slot by slot. GPipe's forwards pile up: slot
 * by slot too. */
typedef struct {
    LoopSteady s;
    int warm;  /* the warm-up forwards */
    int units; /* the steady phase's whole units */
    int len;   /* a unit's pairs */
    int shift; /* how many micro-batches later a unit runs than the one before */
    int v;
} PipeSteady;

static void pipe_steady_init(PipeSteady *ps, MemsimPipeSchedule kind, int p, int r, int m, int v,
                             int g)
{
    memset(ps, 0, sizeof *ps);
    ps->v = v;
    if (kind == MEMSIM_PP_1F1B || v == 1) {
        ps->warm = p - r - 1 < m ? p - r - 1 : m;
        ps->len = ps->shift = 1;
    } else {
        /* schedule()'s interleaved warm-up */
        ps->warm = 2 * (p - r - 1) + (v - 1) * g;
        if (ps->warm > m * v)
            ps->warm = m * v;
        ps->len = v * g;
        ps->shift = g;
    }
    ps->units = (m * v - ps->warm) / ps->len;
    /* a steady unit frees what the forwards of the warm-up, or the units as many pairs
     * before, made */
    loop_steady_init(&ps->s,
                     loop_skip_enabled() && kind != MEMSIM_PP_GPIPE && ps->units >= 5 &&
                         (v == 1 || (g > 0 && m % g == 0)),
                     (ps->warm + ps->len - 1) / ps->len + 1);
}

/* Before slot i. */
static void pipe_steady_before(AgGraph *g, PipeSteady *ps, guint i)
{
    int k = (int)i - ps->warm;
    if (!ps->s.on || k < 0 || k % (2 * ps->len) || k / (2 * ps->len) >= ps->units)
        return;
    int u = k / (2 * ps->len);
    loop_steady_begin(g, &ps->s, u >= 1 && u <= ps->units - 2);
}

/* After slot i: the slots to go on after (those of the repeated units). */
static guint pipe_steady_after(AgGraph *g, PipeSteady *ps, guint i, InFlight *fl, int m)
{
    int k = (int)i - ps->warm;
    if (!ps->s.on || k < 0 || (k + 1) % (2 * ps->len) || k / (2 * ps->len) >= ps->units)
        return 0;
    int u = k / (2 * ps->len); /* the unit that ended */
    int n = u >= 2 ? loop_steady_end(g, &ps->s, ps->units - 2 - u) : 0;
    if (n <= 0)
        return 0;
    /* the micro-batches in flight (on every chunk) run n units later: n shift micro-batches
     * later */
    const int d = n * ps->shift, v = ps->v;
    for (int mb = m - 1 - d; mb >= 0; mb--)
        for (int c = 0; c < v; c++) {
            InFlight *from = &fl[mb * v + c];
            if (from->in || from->out) {
                fl[(mb + d) * v + c] = *from;
                *from = (InFlight){0};
            }
        }
    return 2 * (guint)(n * ps->len);
}

/* The order of (forward?, micro-batch, chunk) a stage runs (DISTRIBUTED.md §5.3). */
typedef struct {
    bool fwd;
    int mb;
    int chunk;
} Slot;

static GArray *schedule(MemsimPipeSchedule kind, int p, int r, int m, int v, int g)
{
    GArray *s = g_array_new(FALSE, FALSE, sizeof(Slot));
    if (kind == MEMSIM_PP_GPIPE) {
        for (int i = 0; i < m; i++) {
            Slot sl = {true, i, 0};
            g_array_append_val(s, sl);
        }
        for (int i = m - 1; i >= 0; i--) {
            Slot sl = {false, i, 0};
            g_array_append_val(s, sl);
        }
        return s;
    }
    if (kind == MEMSIM_PP_1F1B || v == 1) {
        int warm = p - r - 1 < m ? p - r - 1 : m;
        int f = 0, b = 0;
        for (; f < warm; f++) {
            Slot sl = {true, f, 0};
            g_array_append_val(s, sl);
        }
        while (f < m) {
            Slot a = {true, f++, 0}, bb = {false, b++, 0};
            g_array_append_val(s, a);
            g_array_append_val(s, bb);
        }
        while (b < m) {
            Slot bb = {false, b++, 0};
            g_array_append_val(s, bb);
        }
        return s;
    }
    /* interleaved (schedules.py forward_backward_pipelining_with_interleaving): virtual
     * micro-batch k runs entry k of get_schedule_table — groups of g micro-batches, each
     * group through every chunk in turn — forwards on chunk c, backwards on v - 1 - c; the
     * warm-up is 2 (p - r - 1) + (v - 1) g */
    int total = m * v;
    GArray *tab = g_array_new(FALSE, FALSE, sizeof(Slot));
    for (int lo = 0; lo < m; lo += g) {
        int hi = lo + g >= m ? m : lo + g;
        for (int c = 0; c < v; c++)
            for (int mb = lo; mb < hi; mb++) {
                Slot sl = {true, mb, c};
                g_array_append_val(tab, sl);
            }
    }
    int warm = 2 * (p - r - 1) + (v - 1) * g;
    if (warm > total)
        warm = total;
    int f = 0, b = 0;
#define FWD_SLOT(k) (g_array_index(tab, Slot, (k)))
#define BWD_SLOT(k)                                                                            \
    ((Slot){false, g_array_index(tab, Slot, (k)).mb, v - 1 - g_array_index(tab, Slot, (k)).chunk})
    for (; f < warm; f++) {
        Slot sl = FWD_SLOT(f);
        g_array_append_val(s, sl);
    }
    while (f < total) {
        Slot a = FWD_SLOT(f), bb = BWD_SLOT(b);
        f++;
        b++;
        g_array_append_val(s, a);
        g_array_append_val(s, bb);
    }
    while (b < total) {
        Slot bb = BWD_SLOT(b);
        b++;
        g_array_append_val(s, bb);
    }
#undef FWD_SLOT
#undef BWD_SLOT
    g_array_unref(tab);
    return s;
}

/* The distributed optimizer's part of a stage's optimizer step (§5.5): the fp32 main-grad
 * buffer reduce-scattered over dp, an fp32 main copy of this rank's shard (made at the first
 * step) stepped with its slice of the buffer as .grad, the bf16 parameters all-gathered. */
typedef struct {
    AgGraph *g;
    AgTensor *main_grad; /* the persistent fp32 grad buffer */
    AgTensor *main;      /* this rank's fp32 main parameters */
    GPtrArray *params;   /* { main } */
    int64_t psi;         /* the stage's trainable elements */
    int dp;
    CommLink dp_cost;
} StageOptimizer;

static GPtrArray *stage_before_optimizer(void *user, int step)
{
    StageOptimizer *so = user;
    AgGraph *g = so->g;
    (void)step;
    if (so->dp > 1)
        gg_collective(g, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)so->psi * 4, 3,
                      ring_us(so->dp_cost, MEMSIM_COLL_REDUCE_SCATTER, (uint64_t)so->psi * 4,
                              so->dp));
    int64_t part = (so->psi + so->dp - 1) / so->dp;
    if (!so->main) {
        so->main = alloc_cat(g, MEMSIM_CAT_OPTIMIZER_STATE, DT_F32, part);
        g_ptr_array_add(so->params, so->main);
    }
    so->main->grad = gt_view_of(g, so->main_grad, 1, (int64_t[]){part}, NULL);
    return so->params;
}

static void stage_after_optimizer(void *user, int step)
{
    StageOptimizer *so = user;
    (void)step;
    if (so->dp > 1)
        gg_collective(so->g, MEMSIM_COLL_ALL_GATHER, (uint64_t)so->psi * 2, 3,
                      ring_us(so->dp_cost, MEMSIM_COLL_ALL_GATHER, (uint64_t)so->psi * 2,
                              so->dp));
}

/* ---- Megatron-LM's GPTModel from a launch (traces/megatron.h) ---- */

/* The layers of virtual stage `vs` (chunk k of rank r is vs = k·pp + r) and whether it holds
 * the embedding or the loss: an even split; --decoder-first/last-pipeline-num-layers take
 * theirs off the ends; --account-for-embedding/loss-in-pipeline-split count the embedding and
 * the loss as a layer each (megatron/core/transformer/transformer_block.py
 * get_num_layers_to_build, megatron/core/transformer/transformer_layer.py
 * get_transformer_layer_offset). */
static void mg_layout(const MemsimModel *m, int pp, int v, int vs, int64_t *l0, int64_t *l1,
                      bool *first, bool *last)
{
    const MgOptions *o = m->mg;
    int n = pp * v;
    *first = vs == 0;
    *last = vs == n - 1;
    if (o->first_stage_layers || o->last_stage_layers) {
        /* v = 1: the first and last stages as given, the middle ones share the rest */
        int64_t f = o->first_stage_layers, la = o->last_stage_layers;
        int64_t mid = pp > 2 ? (m->L - f - la) / (pp - 2) : 0;
        if (vs == 0) {
            *l0 = 0;
            *l1 = f ? f : mid;
        } else if (vs == pp - 1) {
            *l0 = m->L - (la ? la : mid);
            *l1 = m->L;
        } else {
            *l0 = (f ? f : mid) + (int64_t)(vs - 1) * mid;
            *l1 = *l0 + mid;
        }
        return;
    }
    int64_t e = o->embedding_in_split ? 1 : 0, lo = o->loss_in_split ? 1 : 0;
    int64_t per = (m->L + e + lo) / n;
    int64_t u0 = (int64_t)vs * per - e, u1 = u0 + per;
    *l0 = u0 < 0 ? 0 : u0 > m->L ? m->L : u0;
    *l1 = u1 < 0 ? 0 : u1 > m->L ? m->L : u1;
}

typedef struct MgOpt MgOpt;
static void mg_grad_add(MgOpt *mo, AgTensor *p);

static void mg_post_accumulate(AgGraph *g, void *user, AgTensor *p)
{
    /* the DDP hook (megatron/core/distributed/distributed_data_parallel.py
     * _make_backward_post_hook): param.main_grad.add_(param.grad), param.grad = None */
    if (user)
        mg_grad_add(user, p);
    if (p->grad) {
        AgTensor *gr = p->grad;
        p->grad = NULL;
        gt_unref(g, gr);
    }
}

struct MgOpt {
    AgGraph *g;
    const MgOptions *o;
    AgTensor *main_grad;   /* the DDP grad buffer */
    GPtrArray *mains;      /* fp32 main parameters (one per parameter, or the shard) */
    GPtrArray *model;      /* the model's parameters, in the same order (non-distributed) */
    int64_t psi;
    int dp, shard;
    CommLink dp_cost;
    /* the step's bookkeeping (mg_step_bookkeeping) */
    int n_params;          /* the rank's trainable parameter tensors */
    int world, mp;         /* all ranks; the model-parallel group (tp × pp × cp) */
    CommLink world_cost, mp_cost;
    bool last;             /* the stage holds the loss */
    uint64_t emb_bytes;    /* pp > 1, tied: the word embedding's grad the embedding group
                            * all-reduces on the first and last stage (0: none) */
    uint64_t emb_group;    /* that group's id */
    CommLink emb_cost;
    const AgTensor *embeddings[2]; /* the first stage's word and position tables */
    int n_buckets;         /* the DDP buffer's buckets */
};

/* The DDP hook's accumulation (_make_backward_post_hook): `if param.grad is not None and not
 * param.grad_added_to_main_grad: param.main_grad.add_(param.grad.data)` — every parameter
 * without gradient-accumulation fusion; with it, the linears' weights accumulate inside their
 * wgrad GEMM (grad_added_to_main_grad) and the rest (norms, biases, the embedding tables) take
 * the add_. An in-place op over the parameter's main_grad: read both, write one. */
static void mg_grad_add(MgOpt *mo, AgTensor *p)
{
    if (!p->grad)
        return;
    if (mo->o->grad_accum_fusion && p->nd >= 2 && p != mo->embeddings[0] &&
        p != mo->embeddings[1])
        return;
    double n = (double)gt_numel(p);
    gg_op(mo->g, "add_");
    gg_bytes(mo->g, n * (2.0 * dt_size(mo->main_grad->dt) + dt_size(p->grad->dt)));
}

/* A small tensor all-reduced from Python (a flag, a norm, a count: 4 to 8 bytes) over a group
 * of n ranks; NCCL's latency (traces/gpus.c). */
static void mg_small_allreduce(AgGraph *g, CommLink link, int n)
{
    gg_collective(g, MEMSIM_COLL_ALL_REDUCE, 8, 3, ring_us(link, MEMSIM_COLL_ALL_REDUCE, 8, n));
}

/* `.item()` on a CUDA tensor (aten _local_scalar_dense): a copy to the host, which waits for
 * the stream's work so far (a synchronization). */
static void mg_item(AgGraph *g)
{
    gg_op(g, "_local_scalar_dense");
    gg_host_wait(g, gg_ctx(g)->stream);
}

/* torch.distributed.barrier() under NCCL: a one-element all-reduce over the world, waited on
 * by the host (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp barrier: the work's
 * synchronize). Then megatron/core/timers.py Timer.start/stop's torch.cuda.synchronize(). */
static void mg_barrier(AgGraph *g, const MgOpt *mo)
{
    mg_small_allreduce(g, mo->world_cost, mo->world);
    gg_host_wait(g, gg_ctx(g)->stream);
    gg_op(g, "cudaDeviceSynchronize");
    gg_host_wait(g, gg_ctx(g)->stream);
}

/* What one training iteration of Megatron-LM runs beyond the model's forward and backward and
 * the optimizer's update (megatron/training/training.py train_step and the train loop's
 * training_log, at Megatron-LM d98e8a64dd): kernels, collectives and the host's
 * synchronizations on `.item()`, each at the per-op dispatch and NCCL latency of the GPU
 * profile (traces/gpus.c). Allocates nothing the memory report sees (these are 1-element
 * tensors the caching allocator serves from its cached 512-byte blocks). `before`: between the
 * gradient reduction and the update (finalize_model_grads, the loss reduction, the
 * optimizer's checks); else after the update (train_step's statistics, training_log). */
static void mg_step_bookkeeping(MgOpt *mo, bool before)
{
    AgGraph *g = mo->g;
    const MgOptions *o = mo->o;
    int dpcp = mo->dp * (o->cp > 1 ? o->cp : 1);
    if (before) {
        /* finalize_model_grads (core/distributed/finalize_model_grads.py): the tied word
         * embedding's gradient all-reduced between the first and the last stage
         * (_allreduce_word_embedding_grads) */
        if (mo->emb_bytes)
            gg_collective(g, MEMSIM_COLL_ALL_REDUCE, mo->emb_bytes, mo->emb_group,
                          ring_us(mo->emb_cost, MEMSIM_COLL_ALL_REDUCE, mo->emb_bytes, 2));
        /* train_step, last stage: each reported loss all-reduced over the data-parallel ×
         * context-parallel group (torch.distributed.all_reduce of the [sum, count] pair) */
        if (mo->last) {
            gg_op(g, "stack");
            mg_small_allreduce(g, mo->dp_cost, dpcp);
        }
        /* MixedPrecisionOptimizer.step (core/optimizer/optimizer.py): fp16's loss scaler
         * unscales the main grads and checks them for inf/nan
         * (_unscale_main_grads_and_check_for_nan: torch._amp_foreach_non_finite_check_and_unscale_,
         * all_reduce(found_inf, MAX) over the model-parallel group, found_inf.item()) */
        if (o->fp16) {
            gg_op(g, "fill_");
            gg_op(g, "_amp_foreach_non_finite_check_and_unscale_");
            mg_small_allreduce(g, mo->mp_cost, mo->mp);
            mg_item(g);
        }
        /* clip_grad_norm (core/optimizer/clip_grads.py get_grad_norm_fp32: one
         * multi_tensor_applier l2norm over the grads, all_reduce over the model-parallel group,
         * .item(); then clip_grads_with_norm_fp32's multi_tensor_scale) */
        if (o->clip_grad > 0) {
            gg_op(g, "zeros");
            gg_op(g, "multi_tensor_l2norm");
            gg_op(g, "pow");
            mg_small_allreduce(g, mo->mp_cost, mo->mp);
            mg_item(g);
            gg_op(g, "multi_tensor_scale");
        }
        /* --log-num-zeros-in-grad: count_zeros_fp32, per gradient
         * `grad.numel() - torch.count_nonzero(grad)` added to the total (three ops), then an
         * all_reduce over the model-parallel group and .item() */
        if (o->log_num_zeros) {
            gg_op(g, "zeros");
            for (int i = 0; i < mo->n_params; i++) {
                gg_op(g, "count_nonzero");
                gg_op(g, "rsub");
                gg_op(g, "add");
            }
            mg_small_allreduce(g, mo->mp_cost, mo->mp);
            mg_item(g);
        }
        return;
    }
    /* after the update: MixedPrecisionOptimizer._copy_main_params_to_model_params (one
     * multi_tensor_scale over the pairs) */
    gg_op(g, "multi_tensor_scale");
    /* train_step: reduce_max_stat_across_model_parallel_group for grad_norm and (when logged)
     * num_zeros_in_grad (training/utils/common_utils.py): a tensor made from the float, an
     * all_reduce(MAX) over the model-parallel group, .item() twice */
    for (int k = 0; k < (o->log_num_zeros ? 2 : 1); k++) {
        gg_op(g, "tensor");
        mg_small_allreduce(g, mo->mp_cost, mo->mp);
        mg_item(g);
        mg_item(g);
    }
    /* the train loop: optimizer.get_loss_scale().item() */
    mg_item(g);
    /* --log-params-norm: calc_params_l2_norm (training/utils/common_utils.py): eight buckets'
     * norms (_compute_norm_2: a multi_tensor l2norm, or a zero tensor when empty), the
     * sharded buckets' four all_reduces over the data-parallel groups, the sum, the
     * model-parallel all_reduce, .item() */
    if (o->log_params_norm) {
        for (int k = 0; k < 8; k++)
            gg_op(g, "multi_tensor_l2norm");
        for (int k = 0; k < 4; k++)
            mg_small_allreduce(g, mo->dp_cost, dpcp);
        for (int k = 0; k < 3; k++)
            gg_op(g, "add");
        mg_small_allreduce(g, mo->mp_cost, mo->mp);
        mg_item(g);
    }
    /* training_log at every --log-interval (1 in the development set): the reported losses'
     * .item() on the last stage; timers('interval-time').elapsed(barrier=True) stops and
     * restarts the timer, each with a barrier and a torch.cuda.synchronize()
     * (core/timers.py Timer.elapsed, stop, start) */
    if (mo->last)
        mg_item(g);
    mg_barrier(g, mo);
    mg_barrier(g, mo);
}

static GPtrArray *mg_before_optimizer(void *user, int step)
{
    MgOpt *mo = user;
    AgGraph *g = mo->g;
    (void)step;
    DType gdt = mo->main_grad->dt;
    uint64_t gbytes = (uint64_t)mo->psi * (uint64_t)dt_size(gdt);
    /* _ParamAndGradBucketGroup.start_grad_sync (core/distributed/param_and_grad_buffer.py):
     * with check_for_nan_in_grad (DDP config from check_for_nan_in_loss_and_grad,
     * training.py), check_grads per bucket: grad_data.norm(p=2) and validate_result's
     * torch.isnan and torch.isinf, each read as a bool on the host; then each bucket's
     * `grad_data *= gradient_scaling_factor` (1 / dp·cp, distributed_data_parallel.py) */
    int dpcp = mo->dp * (mo->o->cp > 1 ? mo->o->cp : 1);
    for (int k = 0; k < mo->n_buckets; k++) {
        double bb = (double)gbytes / mo->n_buckets;
        if (mo->o->check_nan) {
            gg_op(g, "linalg_vector_norm");
            gg_bytes(g, bb);
            gg_op(g, "isnan");
            mg_item(g);
            gg_op(g, "isinf");
            mg_item(g);
        }
        if (dpcp > 1) {
            gg_op(g, "mul_");
            gg_bytes(g, 2.0 * bb);
        }
    }
    if (mo->dp > 1)
        gg_collective(g, mo->o->distributed_optimizer ? MEMSIM_COLL_REDUCE_SCATTER
                                                      : MEMSIM_COLL_ALL_REDUCE,
                      gbytes, 3,
                      ring_us(mo->dp_cost, mo->o->distributed_optimizer
                                               ? MEMSIM_COLL_REDUCE_SCATTER
                                               : MEMSIM_COLL_ALL_REDUCE,
                              gbytes, mo->dp));
    mg_step_bookkeeping(mo, true);
    /* main_param.grad: a view of main_grad (fp32), or an fp32 copy (fp16 grads: .float()) */
    for (guint i = 0; i < mo->mains->len; i++) {
        AgTensor *mp = mo->mains->pdata[i];
        if (gdt == DT_F32)
            mp->grad = gt_view_of(g, mo->main_grad, mp->nd, mp->shape, NULL);
        else
            mp->grad = op_new(g, "_to_copy", DT_F32, mp->nd, mp->shape);
    }
    return mo->mains;
}

static void mg_after_optimizer(void *user, int step)
{
    MgOpt *mo = user;
    (void)step;
    if (mo->dp > 1 && mo->o->distributed_optimizer)
        gg_collective(mo->g, MEMSIM_COLL_ALL_GATHER, (uint64_t)mo->psi * 2, 3,
                      ring_us(mo->dp_cost, MEMSIM_COLL_ALL_GATHER, (uint64_t)mo->psi * 2,
                              mo->dp));
    mg_step_bookkeeping(mo, false);
}

/* After a pipeline exchange: with batched p2p, torch.cuda.synchronize()
 * (core/pipeline_parallel/p2p_communication.py P2PCommunicator._communicate; MgOptions
 * p2p_sync): the host waits for the stream. */
static void mg_p2p_sync(AgGraph *g, const MgOptions *o)
{
    if (!o->p2p_sync)
        return;
    gg_op(g, "torch.cuda.synchronize (p2p)");
    gg_host_wait(g, gg_ctx(g)->stream);
}

/* pretrain_gpt.py get_batch on a stage that holds the embedding or the loss: on TP rank 0
 * the next batch from the data loader copied to the device (`.cuda(non_blocking=True)` of
 * each of BATCH_KEYS: tokens, labels, loss_mask, attention_mask, position_ids), then
 * core/utils.py get_batch_on_this_tp_rank's torch.distributed.broadcast over the TP group
 * of the tensors the stage needs (one stage: tokens, labels, loss_mask, position_ids and the
 * mask; the first: tokens, position_ids, mask; the last: labels, loss_mask, mask), into the
 * buffers the other TP ranks hold (the inputs the stage's program already has). */
static void mg_get_batch(AgGraph *g, const Model *md, const MemsimRun *run)
{
    const MgOptions *o = md->m->mg;
    if (!md->first && !md->last)
        return;
    int64_t b = run->batch, sq = run->seq;
    uint64_t tok = (uint64_t)(b * sq * 8), mask = o->attention_mask ? (uint64_t)(b * sq * sq) : 0;
    for (int k = 0; k < 5; k++)
        gg_op(g, "_to_copy");
    uint64_t sizes[5];
    int n = 0;
    if (md->first) {
        sizes[n++] = tok; /* tokens */
        sizes[n++] = tok; /* position_ids */
    }
    if (md->last) {
        sizes[n++] = tok;                       /* labels */
        sizes[n++] = (uint64_t)(b * sq * 4);    /* loss_mask */
    }
    if (mask)
        sizes[n++] = mask;
    for (int k = 0; k < n; k++)
        gg_collective(g, MEMSIM_COLL_BROADCAST, sizes[k], 1,
                      nn_tp_us(md, MEMSIM_COLL_BROADCAST, sizes[k]));
}

/* The loss of a micro-batch on the last stage: pretrain_gpt.py loss_func beyond the
 * masked sum the model's forward has (loss_mask.sum(), .clone().detach().to(int), the
 * report's torch.cat of two clones), the schedule's forward_step scaling and accumulating it
 * (pipeline_parallel/schedules.py: output_tensor /= num_tokens or num_microbatches,
 * total_num_tokens += num_tokens); with check_for_nan_in_loss_and_grad,
 * rerun_state_machine.validate_result with torch.isnan and torch.isinf, each result read as
 * a bool on the host (core/rerun_state_machine.py validate_result: rejection_func(result)). */
static void mg_loss_func(AgGraph *g, const MgOptions *o)
{
    static const char *const ops[] = {"sum", "clone", "_to_copy", "clone", "cat", "div_", "add_"};
    for (gsize k = 0; k < G_N_ELEMENTS(ops); k++)
        gg_op(g, ops[k]);
    if (o->check_nan) {
        gg_op(g, "isnan");
        mg_item(g);
        gg_op(g, "isinf");
        mg_item(g);
    }
}

static gboolean mg_program(const MemsimModel *m, const MemsimRun *run, MemsimTrace *t,
                           const AgRules *rules, const GpuProfile *gpu, int tp, int pp, int dp,
                           int r, GError **error)
{
    const MgOptions *o = m->mg;
    int v = run->pp_schedule == MEMSIM_PP_INTERLEAVED ? run->virtual_stages : 1;
    int mbs = memsim_run_resolve(run).microbatches;
    int cp = o->cp > 0 ? o->cp : 1;
    guint32 rank = memsim_trace_add_rank(t, (guint32)(r * tp * cp), (guint32)(tp * cp * dp));
    /* Megatron logs memory on global rank world − 1 only (global_vars.py: the TensorBoard
     * writer), the last stage's last TP, CP and DP rank */
    memsim_trace_header(t)->ranks[rank].role = g_strdup_printf(
        "pipeline stage %d of %d (tp %d, cp %d, dp %d)%s", r, pp, tp, cp, dp,
        r == pp - 1 ? "; holds the rank Megatron logs memory on (the last)" : "");
    AgGraph *g = gg_new(t, rank, rules);
    gg_set_gpu(g, gpu, run->precision == MEMSIM_PREC_FP32);
    MemsimRun eff = *run;
    if (run->precision != MEMSIM_PREC_FP32)
        eff.precision = o->fp16 ? MEMSIM_PREC_FP16 : MEMSIM_PREC_BF16;
    MgShared shared = {.dummy = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                       .defer_in = g_ptr_array_new(), .defer_grad = g_ptr_array_new(),
                       .dp = dp, .dp_cost = comm_cost(gpu, tp * cp * dp <= run->gpus_per_node)};
    Model *chunks = g_new0(Model, v);
    for (int k = 0; k < v; k++) {
        int64_t l0, l1;
        bool first, last;
        mg_layout(m, pp, v, k * pp + r, &l0, &l1, &first, &last);
        if (!model_build_chunk(&chunks[k], g, m, &eff, tp, l0, l1, first, last, error)) {
            for (int j = 0; j <= k; j++)
                model_clear(&chunks[j]);
            g_free(chunks);
            gg_free(g);
            return FALSE;
        }
        chunks[k].S = run->seq;
        chunks[k].mgs = &shared;
        chunks[k].comm_us_per_byte = comm_cost(gpu, tp <= run->gpus_per_node);
    }
    int64_t psi = 0;
    for (int k = 0; k < v; k++)
        psi += count_trainable(&chunks[k]);
    AgContext *c = gg_ctx(g);
    DType adt = chunks[0].adt;
    /* the DDP grad buffer (megatron/core/distributed/param_and_grad_buffer.py): fp32 with
     * bf16 (grad_reduce_in_fp32), else the parameters' dtype */
    /* the distributed optimizer shards over the data-parallel × context-parallel group, within
     * one of --num-distributed-optimizer-instances (parallel_state.py: the intra-instance
     * dp_cp group) */
    int dpo = o->distributed_optimizer
                  ? dp * cp / (o->optimizer_instances > 0 ? o->optimizer_instances : 1)
                  : 1;
    if (dpo < 1)
        dpo = 1;
    /* the distributed optimizer pads each parameter's start to 64 elements and the bucket's end
     * to lcm(shards, 128) (distrib_optimizer.py _compute_per_buffer_param_layout) */
    int64_t psi_pad = psi;
    if (o->distributed_optimizer) {
        psi_pad = 0;
        for (int k = 0; k < v; k++)
            for (guint j = 0; j < chunks[k].trainable->len; j++)
                psi_pad = (psi_pad + 63) / 64 * 64 + gt_numel(chunks[k].trainable->pdata[j]);
        int64_t lcm = 128;
        while (lcm % dpo)
            lcm += 128;
        psi_pad = (psi_pad + lcm - 1) / lcm * lcm;
    }
    AgTensor *main_grad = alloc_cat(g, MEMSIM_CAT_GRADIENT, o->grads_fp32 ? DT_F32 : adt, psi_pad);
    /* fp32 main parameters, made when the optimizer is built: a copy of each parameter
     * (Float16OptimizerWithFloat16Params), or of this rank's shard (DistributedOptimizer) */
    MgOpt mo = {.g = g, .o = o, .main_grad = main_grad, .mains = g_ptr_array_new(),
                .psi = psi_pad, .dp = dp, .shard = dpo,
                .dp_cost = comm_cost(gpu, tp * cp * dp <= run->gpus_per_node)};
    for (int k = 0; k < v; k++)
        mo.n_params += (int)chunks[k].trainable->len;
    mo.world = tp * cp * dp * pp;
    mo.mp = tp * cp * pp;
    mo.world_cost = comm_cost(gpu, mo.world <= run->gpus_per_node);
    mo.mp_cost = comm_cost(gpu, mo.mp <= run->gpus_per_node);
    mo.last = chunks[v - 1].last;
    mo.embeddings[0] = chunks[0].first ? chunks[0].wte : NULL;
    mo.embeddings[1] = chunks[0].first ? chunks[0].wpe : NULL;
    {
        /* DDP buckets (distributed_data_parallel.py:131-137): --ddp-bucket-size, else with
         * --overlap-grad-reduce max(40M, 1M × dp) elements, else one bucket */
        int64_t be = o->bucket_size ? o->bucket_size
                     : o->overlap_grad_reduce ? MAX((int64_t)40000000, (int64_t)1000000 * dp)
                                              : psi_pad;
        mo.n_buckets = (int)((psi_pad + be - 1) / MAX(be, (int64_t)1));
        if (mo.n_buckets < 1)
            mo.n_buckets = 1;
    }
    if (pp > 1 && m->tie && (chunks[0].first || chunks[v - 1].last)) {
        mo.emb_bytes = (uint64_t)(mg_padded_vocab(o, tp) / tp) * (uint64_t)m->H *
                       (uint64_t)dt_size(main_grad->dt);
        mo.emb_group = 3;
        mo.emb_cost = comm_cost(gpu, mo.world <= run->gpus_per_node);
    }
    if (o->distributed_optimizer) {
        g_ptr_array_add(mo.mains, alloc_cat(g, MEMSIM_CAT_OPTIMIZER_STATE, DT_F32, psi_pad / dpo));
    } else {
        for (int k = 0; k < v; k++)
            for (guint j = 0; j < chunks[k].trainable->len; j++) {
                AgTensor *p = chunks[k].trainable->pdata[j];
                AgTensor *mp = gg_leaf(g, DT_F32, p->nd, p->shape, false,
                                       MEMSIM_CAT_OPTIMIZER_STATE);
                g_ptr_array_add(mo.mains, mp);
            }
    }
    /* 1-element tensors that live for the run (512 B blocks): pretrain's start_time tensor, the
     * FusedAdam overflow buffer and the loss scaler's (bf16: _scale_one; fp16: found_inf, the
     * dynamic scaler's scale, bounds and factors, its overflow buffer), the last stage's
     * loss_dict and total_loss_dict entries (megatron/training/training.py,
     * megatron/core/optimizer/optimizer.py, grad_scaler.py) */
    GPtrArray *small = g_ptr_array_new();
    {
        int n_small = 2 + (o->fp16 ? 6 : 1) + (chunks[v - 1].last ? 2 : 0);
        if (o->overlap_param_gather_with_step)
            n_small += 1 + (o->fp16 ? 6 : 1);
        uint8_t cat = c->category;
        c->category = MEMSIM_CAT_OTHER;
        for (int i = 0; i < n_small; i++)
            g_ptr_array_add(small, op_new(g, "tensor", DT_F32, 1, (int64_t[]){1}));
        c->category = cat;
    }
    AgHooks ah = {.post_accumulate = mg_post_accumulate, .user = &mo};
    gg_set_hooks(g, &ah);
    LoopHooks hooks = {.before_optimizer = mg_before_optimizer,
                       .after_optimizer = mg_after_optimizer,
                       .user = &mo};
    Optimizer opt;
    optimizer_init(&opt, run, rules);
    optimizer_for_method(&opt, MEMSIM_METHOD_MEGATRON);
    opt.plain_ops = true;
    int64_t H = m->H;
    int64_t sl = run->seq / cp;
    int64_t sq = run->sequence_parallel ? sl / tp : sl; /* p2p tensors' tokens */
    uint64_t p2p_bytes = (uint64_t)(run->batch * sq * H * dt_size(adt));
    double p2p_us = ring_us(comm_cost(gpu, tp * cp * dp * pp <= run->gpus_per_node),
                            MEMSIM_COLL_SEND, p2p_bytes, 2);
    guint32 prev = rank - (guint32)r + (guint32)((r + pp - 1) % pp);
    guint32 next = rank - (guint32)r + (guint32)((r + 1) % pp);
    InFlight *fl = g_new0(InFlight, (gsize)mbs * v);
    /* the interleaved schedule's micro-batch group
     * (--microbatch-group-size-per-virtual-pipeline-stage, else pp) */
    const int group = o->microbatch_group > 0 ? o->microbatch_group : pp;
    for (int step = 1; step <= run->steps; step++) {
        loop_mark_step(g, step);
        GArray *sched = schedule(run->pp_schedule, pp, r, mbs, v, group);
        PipeSteady ps;
        pipe_steady_init(&ps, run->pp_schedule, pp, r, mbs, v, group);
        for (guint i = 0; i < sched->len; i++) {
            pipe_steady_before(g, &ps, i);
            Slot sl2 = g_array_index(sched, Slot, i);
            Model *md = &chunks[sl2.chunk];
            InFlight *f = &fl[sl2.mb * v + sl2.chunk];
            c->microbatch = sl2.mb;
            c->category = MEMSIM_CAT_TEMPORARY;
            if (sl2.fwd) {
                c->phase = MEMSIM_PHASE_FORWARD;
                mg_get_batch(g, md, run);
                if (!md->first) {
                    gg_p2p(g, MEMSIM_COLL_RECV, p2p_bytes, 2, prev, p2p_us);
                    mg_p2p_sync(g, o);
                    f->in = gg_leaf(g, adt, 3, (int64_t[]){sq, run->batch, H}, true,
                                    MEMSIM_CAT_ACTIVATION);
                }
                AgTensor *hidden = NULL;
                AgTensor *loss = mg_stage_forward(md, f->in, &hidden);
                if (step == 1 && i == 0)
                    gg_mark_breakdown(g, MEMSIM_BREAKDOWN_FIRST_FORWARD);
                if (loss) {
                    mg_loss_func(g, o);
                    f->out = loss;
                } else {
                    gg_p2p(g, MEMSIM_COLL_SEND, (uint64_t)gt_nbytes(hidden), 2, next, p2p_us);
                    /* send_forward_recv_backward: one exchange with the backward's recv
                     * that follows in the steady state (schedules.py), one synchronize */
                    if (!(i + 1 < sched->len && !g_array_index(sched, Slot, i + 1).fwd))
                        mg_p2p_sync(g, o);
                    gg_storage_release(g, hidden->st); /* deallocate_output_tensor */
                    f->out = hidden;
                }
            } else {
                c->phase = MEMSIM_PHASE_BACKWARD;
                AgTensor *grad = NULL;
                if (!md->last) {
                    gg_p2p(g, MEMSIM_COLL_RECV, p2p_bytes, 2, next, p2p_us);
                    mg_p2p_sync(g, o);
                    grad = op_new(g, "empty", adt, 3, (int64_t[]){sq, run->batch, H});
                }
                gg_backward_with(g, f->out, grad);
                gt_unref(g, f->out);
                f->out = NULL;
                if (f->in) {
                    gg_p2p(g, MEMSIM_COLL_SEND, (uint64_t)gt_nbytes(f->in), 2, prev, p2p_us);
                    /* send_backward_recv_forward: one exchange with the next forward's recv */
                    if (!(i + 1 < sched->len && g_array_index(sched, Slot, i + 1).fwd &&
                          !chunks[g_array_index(sched, Slot, i + 1).chunk].first))
                        mg_p2p_sync(g, o);
                    gt_unref(g, f->in);
                    f->in = NULL;
                }
            }
            i += pipe_steady_after(g, &ps, i, fl, mbs);
        }
        loop_steady_clear(&ps.s);
        g_array_unref(sched);
        /* finish_embedding_wgrad_compute: the deferred output-layer wgrads, then the buffers
         * emptied (megatron/core/utils.py drain_embedding_wgrad_compute) */
        for (guint i = 0; i < shared.defer_grad->len; i++) {
            gg_gemm(g);
            gt_unref(g, shared.defer_grad->pdata[i]);
        }
        for (guint i = 0; i < shared.defer_in->len; i++)
            gt_unref(g, shared.defer_in->pdata[i]);
        g_ptr_array_set_size(shared.defer_grad, 0);
        g_ptr_array_set_size(shared.defer_in, 0);
        loop_optimizer_step(g, &opt, &hooks, NULL, step, step == run->steps);
    }
    gg_teardown(g);
    g_free(fl);
    g_ptr_array_unref(shared.defer_in);
    g_ptr_array_unref(shared.defer_grad);
    for (guint i = 0; i < mo.mains->len; i++)
        gt_unref(g, mo.mains->pdata[i]);
    g_ptr_array_unref(mo.mains);
    optimizer_clear(g, &opt);
    gt_unref(g, main_grad);
    gt_unref(g, shared.mpu);
    gt_unref(g, shared.te_workspace);
    gt_unref(g, shared.freqs);
    GHashTableIter it;
    gpointer dv;
    g_hash_table_iter_init(&it, shared.dummy);
    while (g_hash_table_iter_next(&it, NULL, &dv))
        gt_unref(g, dv);
    g_hash_table_unref(shared.dummy);
    for (guint i = 0; i < small->len; i++)
        gt_unref(g, small->pdata[i]);
    g_ptr_array_unref(small);
    for (int k = 0; k < v; k++)
        model_clear(&chunks[k]);
    g_free(chunks);
    gg_free(g);
    return TRUE;
}

static gboolean megatron_program(const MemsimModel *m, const MemsimRun *run, MemsimTrace *t,
                                 const AgRules *rules, const GpuProfile *gpu, int tp, int pp,
                                 int dp, int r, GError **error)
{
    int v = run->pp_schedule == MEMSIM_PP_INTERLEAVED ? run->virtual_stages : 1;
    int mbs = memsim_run_resolve(run).microbatches;
    guint32 rank = memsim_trace_add_rank(t, (guint32)(r * tp), (guint32)(tp * dp));
    memsim_trace_header(t)->ranks[rank].role = g_strdup_printf(
        "pipeline stage %d of %d (tp %d, dp %d)", r, pp, tp, dp);
    AgGraph *g = gg_new(t, rank, rules);
    gg_set_gpu(g, gpu, run->precision == MEMSIM_PREC_FP32);
    MemsimRun eff = *run;
    if (run->precision != MEMSIM_PREC_FP32)
        eff.precision = run->precision == MEMSIM_PREC_FP16_MIXED ? MEMSIM_PREC_FP16 : MEMSIM_PREC_BF16;
    int64_t per = m->L / (pp * v);
    Model *chunks = g_new0(Model, v);
    for (int k = 0; k < v; k++) {
        int64_t l0 = (k * pp + r) * per;
        if (!model_build_part(&chunks[k], g, m, &eff, tp, l0, l0 + per, error)) {
            for (int j = 0; j <= k; j++)
                model_clear(&chunks[j]);
            g_free(chunks);
            gg_free(g);
            return FALSE;
        }
        chunks[k].comm_us_per_byte = comm_cost(gpu, tp <= run->gpus_per_node);
    }
    int64_t psi = 0;
    for (int k = 0; k < v; k++)
        psi += count_trainable(&chunks[k]);
    AgContext *c = gg_ctx(g);
    /* the DDP grad buffer: fp32 main grads (grad_reduce_in_fp32), persistent */
    AgTensor *main_grad = alloc_cat(g, MEMSIM_CAT_GRADIENT, DT_F32, psi);
    AgTensor *ids = gg_leaf(g, DT_I64, 2, (int64_t[]){run->batch, run->seq}, false, MEMSIM_CAT_INPUT);
    int64_t H = m->H;
    int64_t sq = run->sequence_parallel ? run->seq / tp : run->seq; /* p2p tensors' tokens */
    DType adt = chunks[0].adt;
    /* Megatron's layout: tp innermost, then dp, then pp (the planner's, traces/plan/cost.c) */
    StageOptimizer so = {g, main_grad, NULL, g_ptr_array_new(), psi, dp,
                         comm_cost(gpu, tp * dp <= run->gpus_per_node)};
    LoopHooks hooks = {.before_optimizer = stage_before_optimizer,
                       .after_optimizer = stage_after_optimizer,
                       .user = &so};
    Optimizer opt;
    optimizer_init(&opt, run, rules);
    optimizer_for_method(&opt, MEMSIM_METHOD_MEGATRON);
    opt.plain_ops = true;
    uint64_t p2p_bytes = (uint64_t)(run->batch * sq * H * dt_size(adt));
    double p2p_us = ring_us(comm_cost(gpu, tp * dp * pp <= run->gpus_per_node), MEMSIM_COLL_SEND,
                            p2p_bytes, 2);
    /* the trace ranks of the stages before and after this one (the interleaved schedule's
     * last stage sends its chunk's output on to the first) */
    guint32 prev = rank - (guint32)r + (guint32)((r + pp - 1) % pp);
    guint32 next = rank - (guint32)r + (guint32)((r + 1) % pp);
    InFlight *fl = g_new0(InFlight, (gsize)mbs * v);
    for (int step = 1; step <= run->steps; step++) {
        loop_mark_step(g, step);
        GArray *sched = schedule(run->pp_schedule, pp, r, mbs, v, pp);
        PipeSteady ps;
        pipe_steady_init(&ps, run->pp_schedule, pp, r, mbs, v, pp);
        for (guint i = 0; i < sched->len; i++) {
            pipe_steady_before(g, &ps, i);
            Slot sl = g_array_index(sched, Slot, i);
            Model *md = &chunks[sl.chunk];
            InFlight *f = &fl[sl.mb * v + sl.chunk];
            c->microbatch = sl.mb;
            c->category = MEMSIM_CAT_TEMPORARY;
            if (sl.fwd) {
                c->phase = MEMSIM_PHASE_FORWARD;
                if (!md->first) {
                    /* recv: a fresh [b, s, h] buffer that needs grad */
                    gg_p2p(g, MEMSIM_COLL_RECV, p2p_bytes, 2, prev, p2p_us);
                    f->in = gg_leaf(g, adt, 3, (int64_t[]){run->batch, sq, H}, true,
                                    MEMSIM_CAT_ACTIVATION);
                }
                AgTensor *logits = NULL, *hidden = NULL;
                AgTensor *loss = model_stage_forward(md, ids, f->in, ids, &logits, &hidden);
                gt_unref(g, logits);
                model_drop_output(md);
                if (step == 1 && i == 0)
                    gg_mark_breakdown(g, MEMSIM_BREAKDOWN_FIRST_FORWARD);
                if (loss) {
                    f->out = loss;
                } else {
                    gg_p2p(g, MEMSIM_COLL_SEND, (uint64_t)gt_nbytes(hidden), 2, next, p2p_us);
                    gg_storage_release(g, hidden->st); /* deallocate_output_tensor */
                    f->out = hidden;
                }
            } else {
                c->phase = MEMSIM_PHASE_BACKWARD;
                AgTensor *grad = NULL;
                if (!md->last) {
                    gg_p2p(g, MEMSIM_COLL_RECV, p2p_bytes, 2, next, p2p_us);
                    grad = op_new(g, "empty", adt, 3, (int64_t[]){run->batch, sq, H});
                }
                gg_backward_with(g, f->out, grad);
                gt_unref(g, f->out);
                f->out = NULL;
                if (f->in) {
                    gg_p2p(g, MEMSIM_COLL_SEND, (uint64_t)gt_nbytes(f->in), 2, prev, p2p_us);
                    gt_unref(g, f->in);
                    f->in = NULL;
                }
                /* main_grad += param.grad; param.grad = None */
                for (int k = 0; k < v; k++)
                    for (guint j = 0; j < chunks[k].trainable->len; j++) {
                        AgTensor *p = chunks[k].trainable->pdata[j];
                        if (p->grad) {
                            AgTensor *gr = p->grad;
                            p->grad = NULL;
                            gt_unref(g, gr);
                        }
                    }
            }
            i += pipe_steady_after(g, &ps, i, fl, mbs);
        }
        loop_steady_clear(&ps.s);
        g_array_unref(sched);
        loop_optimizer_step(g, &opt, &hooks, NULL, step, step == run->steps);
    }
    gg_teardown(g);
    g_free(fl);
    gt_unref(g, ids);
    gt_unref(g, so.main);
    g_ptr_array_unref(so.params);
    optimizer_clear(g, &opt);
    gt_unref(g, main_grad);
    for (int k = 0; k < v; k++)
        model_clear(&chunks[k]);
    g_free(chunks);
    gg_free(g);
    return TRUE;
}

/* DDP + ZeroRedundancyOptimizer: one program per rank, ranks whose shares are alike (the
 * same sizes in the same order: the same state and the same update) simulated once, as one
 * row of that many ranks. The shares come from the model's trainable parameters, built once
 * on their own. */
static gboolean zr_programs(const MemsimModel *m, const MemsimRun *run, MemsimTrace *t,
                            const AgRules *rules, const GpuProfile *gpu, GError **error)
{
    MemsimTrace *scratch = memsim_trace_new("zero-redundancy shares");
    AgGraph *g = gg_new(scratch, memsim_trace_add_rank(scratch, 0, 1), rules);
    Model md = {0};
    gboolean ok = model_build(&md, g, m, run, error);
    GHashTable *first = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (int r = 0; ok && r < run->gpus; r++) {
        GPtrArray *mine = zr_partition(md.trainable, run->gpus, r);
        GString *key = g_string_new(NULL);
        for (guint i = 0; i < mine->len; i++)
            g_string_append_printf(key, "%" G_GINT64_FORMAT ",", gt_numel(mine->pdata[i]));
        g_ptr_array_unref(mine);
        gpointer idx;
        if (g_hash_table_lookup_extended(first, key->str, NULL, &idx)) {
            MemsimRankInfo *tr = &memsim_trace_header(t)->ranks[GPOINTER_TO_UINT(idx)];
            tr->multiplicity++;
            g_free(tr->role);
            tr->role = g_strdup_printf("ddp + ZeroRedundancyOptimizer rank %u of %d (%u ranks "
                                       "with shares alike)",
                                       tr->device, run->gpus, tr->multiplicity);
            g_string_free(key, TRUE);
            continue;
        }
        g_hash_table_insert(first, g_string_free(key, FALSE),
                            GUINT_TO_POINTER(memsim_trace_header(t)->n_ranks));
        ok = dp_program(m, run, t, rules, gpu, r, error);
    }
    g_hash_table_unref(first);
    model_clear(&md);
    gg_free(g);
    memsim_trace_free(scratch);
    return ok;
}

gboolean memsim_generate_distributed(const MemsimModel *m, const MemsimRun *run, MemsimTrace *t,
                                     const AgRules *rules, const gboolean *stages,
                                     GError **error)
{
    MemsimGpu gbuf; /* the profile with the run's time-model settings */
    const GpuProfile *gpu = run_gpu(run, &gbuf);
    if (!gpu) {
        g_autofree char *k = memsim_gpu_names();
        return setting_refuse(error, "gpu: unknown GPU '%s' (known: %s)", run->gpu, k);
    }
    MemsimResolvedRun rr = memsim_run_resolve(run);
    MemsimMethod meth = rr.method;
    if (run->inference)
        return setting_refuse(error, "method: distributed runs are modelled for training (inference "
                               "runs on one GPU)");
    if (run->finetune != MEMSIM_FT_FULL && meth == MEMSIM_METHOD_MEGATRON)
        return setting_refuse(error, "finetune: Megatron-LM has no LoRA or QLoRA (its adapters live in "
                               "NeMo); use ddp, zero1/2/3 or fsdp with --finetune %s",
                        run->finetune == MEMSIM_FT_LORA ? "lora" : "qlora");
    if (meth != MEMSIM_METHOD_MEGATRON) {
        if (run->tp > 1 || run->pp > 1)
            return setting_refuse(error, "method: --tp/--pp belong to the megatron method, not to %s",
                            meth == MEMSIM_METHOD_NONE ? "none" : "a data-parallel method");
        if (meth == MEMSIM_METHOD_NONE)
            return setting_refuse(error, "method: %d GPUs need a method (ddp, zero1, zero2, zero3, "
                                   "fsdp, fsdp-grad-op, hsdp, megatron)",
                            run->gpus);
        MemsimRun r2 = *run;
        r2.method = meth;
        if (meth == MEMSIM_METHOD_DDP && run->zero_redundancy)
            return zr_programs(m, &r2, t, rules, gpu, error);
        return dp_program(m, &r2, t, rules, gpu, -1, error);
    }
    int tp = rr.tp, pp = rr.pp, dp = rr.dp;
    int cp = m->fam == FAM_MEGATRON && m->mg->cp > 1 ? m->mg->cp : 1;
    if (cp > 1 && !run->dp)
        dp = run->gpus / (tp * pp * cp);
    if ((int64_t)tp * pp * cp * dp != run->gpus)
        return setting_refuse(error, "gpus: %d GPUs are not tp %d × pp %d × dp %d", run->gpus, tp, pp,
                        dp);
    if (m->nh % tp)
        return setting_refuse(error, "tp: %d does not divide the %" G_GINT64_FORMAT
                               " attention heads (num_attention_heads)",
                        tp, m->nh);
    if (m->nkv != 1 && m->nkv % tp)
        return setting_refuse(error, "tp: %d does not divide the %" G_GINT64_FORMAT
                               " key/value heads (num_key_value_heads)",
                        tp, m->nkv);
    if (m->I % tp)
        return setting_refuse(error, "tp: %d does not divide the MLP width %" G_GINT64_FORMAT, tp, m->I);
    int v = run->pp_schedule == MEMSIM_PP_INTERLEAVED ? run->virtual_stages : 1;
    if (pp > m->L)
        return setting_refuse(error, "pp: %d stages for %" G_GINT64_FORMAT " layers", pp, m->L);
    if (m->fam != FAM_MEGATRON && m->L % ((int64_t)pp * v))
        return setting_refuse(error, "pp: %" G_GINT64_FORMAT " layers do not split into %d stages × %d "
                               "virtual stages",
                        m->L, pp, v);
    int mbs = rr.microbatches;
    if (run->pp_schedule == MEMSIM_PP_INTERLEAVED && (v < 2 || (m->fam != FAM_MEGATRON && mbs % pp)))
        return setting_refuse(error, "pp-schedule: interleaved needs --virtual-stages ≥ 2 and "
                               "micro-batches divisible by pp (%d)",
                        pp);
    if (run->sequence_parallel && (tp == 1 || run->seq % tp))
        return setting_refuse(error, "sequence-parallel: needs tp > 1 dividing the sequence length");
    for (int r = 0; r < pp; r++)
        if ((!stages || stages[r]) &&
            !(m->fam == FAM_MEGATRON ? mg_program : megatron_program)(m, run, t, rules, gpu, tp,
                                                                       pp, dp, r, error))
            return FALSE;
    return TRUE;
}
