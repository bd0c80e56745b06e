/* The cost model that orders `memsim plan`'s search: one place, every formula. The step
 * times the plan shows are not these but the simulation's (the generator's op durations,
 * traces/gpus.c, replayed as `memsim estimate` replays them); this model, meant to stay
 * below the simulated step (FLOPs at the peak's efficiency without waves, launch floors,
 * host dispatch or latencies; its collective terms are not guaranteed to), only says which configurations to simulate first and which
 * cannot reach the top rows (traces/plan/plan.c raises it, per configuration, to the bound of
 * a short run of a Megatron layout's stage programs, traces/plan/bound.c, and to the host's
 * dispatch time the simulation of a sibling micro-batch size showed).
 *
 * Notation: Ψ parameters (memsim_model_n_params), Ψt trainable ones (Ψ for full fine-tuning;
 * LoRA: r · 2H per target × 2 targets (q, v) × L), L layers, H hidden, s sequence length,
 * b micro-batch, m micro-batches per step and replica, N data-parallel degree, tp / pp / v
 * Megatron degrees and virtual stages; cb bytes of the compute dtype (2, fp32: 4).
 *
 * Compute (per sequence; Kaplan/Narayanan counting, attention term of Korthikanti et al.):
 *   A          = 4 · L · s² · H                     attention scores and values, one pass
 *   forward    = 2 · Ψ · s + A
 *   backward   = 2 · Ψ · s + 2 · Ψt · s + 2 · A     (4Ψs for full fine-tuning: input and
 *                                                   weight gradients; frozen weights only
 *                                                   pass input gradients)
 *   recompute  = full: forward again; selective: A (the attention core); none: 0
 *   rate       = peak × efficiency × compute fraction, peak = the profile's bf16 tensor-core
 *                TFLOP/s (fp32 TFLOP/s for fp32 runs), efficiency 0.5 by default, compute
 *                fraction 1 (a MIG slice: its SMs over the GPU's)
 *   compute    = b · m · (forward + backward) / (tp · pp) / rate; recompute likewise
 *   bubble     = (compute + recompute) · (pp − 1) / m, divided by v when interleaved (1F1B
 *                and GPipe alike, Narayanan et al. 2021)
 *
 * Collectives (ring algorithms; bytes are the full, unsharded size):
 *   all-reduce          = 2 (n − 1) / n · bytes / bw
 *   all-gather, reduce-scatter = (n − 1) / n · bytes / bw
 *   bw = the profile's GPU-to-GPU link (NVLink) when the group fits in one node
 *        (--gpus-per-node, default 8), else the network: 25 GB/s per GPU (one 200 Gb/s
 *        NIC per GPU), set with MemsimPlanOptions.network_gbs. Groups are laid out
 *        Megatron-style: tp innermost, then dp, then pp.
 *   DDP         all-reduce of the gradients (Ψ · 4 bytes under autocast, Ψ · 2 for pure
 *               bf16/fp16) once per step (no_sync while accumulating), overlapped with the
 *               last micro-batch's backward: exposed = max(0, all-reduce − backward)
 *   ZeRO-1      all-reduce of cb · Ψ once per step (overlapped as DDP), then an all-gather of
 *               the updated cb · Ψ parameters (exposed)
 *   ZeRO-2      reduce-scatter of cb · Ψ per micro-batch, overlapped with its backward;
 *               the all-gather of the parameters after the step (exposed)
 *   ZeRO-3, FSDP (FULL_SHARD)  per micro-batch two all-gathers of cb · Ψ (forward and
 *               backward) and a reduce-scatter of cb · Ψ, overlapped with the micro-batch's
 *               compute: exposed = max(0, collectives − compute) per micro-batch
 *   FSDP SHARD_GRAD_OP  one all-gather (forward only) and the reduce-scatter per micro-batch
 *   HSDP        FSDP within a node, plus an all-reduce of the cb · Ψ / gpus-per-node
 *               gradient shard across nodes per micro-batch, overlapped likewise
 *   Megatron    per micro-batch and GPU: (L / pp) · 4 all-reduces of b · s · H · cb over tp
 *               (2 forward, 2 backward; 2 more with full recomputation), exposed; per
 *               micro-batch 2 · b · s · H · cb point-to-point bytes (× v when interleaved),
 *               exposed; per step the distributed optimizer's reduce-scatter of the fp32
 *               main gradients (4 · Ψ / (tp pp)) and all-gather of the parameters
 *               (cb · Ψ / (tp pp)) over dp, exposed (Megatron's default: no overlap)
 *   replicas    (LoRA/QLoRA on several GPUs) all-reduce of 4 · Ψt once per step, overlapped
 *               with the last backward
 *
 * Memory traffic:
 *   optimizer   32 bytes per parameter of the rank's optimizer shard (read master, gradient,
 *               two moments; write master, moments, low-precision copy) at the HBM bandwidth
 *               × the slice's memory fraction. Shard: Ψt (DDP, one GPU), Ψ / N (ZeRO, FSDP),
 *               Ψ / gpus-per-node (HSDP), Ψ / (tp pp dp) (Megatron)
 *   QLoRA       dequantisation per micro-batch and pass (forward, backward, and the
 *               recomputed forward with full checkpointing): 2.5 · Ψ bytes (read 4-bit,
 *               write bf16) at the HBM bandwidth
 *   CPU offload instead of the GPU optimizer step: gradients down and parameters up, 2
 *               bytes each per shard parameter, over PCIe at 25 GB/s, and the CPU Adam step
 *               at 1e9 parameters per second per GPU (DeepSpeed CPU-Adam's order of
 *               magnitude)
 *
 * step = compute + recompute + bubble + exposed collectives + optimizer (+ dequantisation)
 * tokens per step = replicas · b · m · s; tokens per second = tokens / step.
 */
#include "traces/plan/cost.h"

#include "traces/model.h"

#define PCIE_GBS 25.0
#define CPU_ADAM_PARAMS_PER_S 1e9
#define OPTIM_BYTES_PER_PARAM 32.0

static double allreduce(double bytes, int n, double gbs)
{
    return n > 1 ? 2.0 * (n - 1) / n * bytes / (gbs * 1e9) : 0.0;
}

static double gather(double bytes, int n, double gbs)
{
    return n > 1 ? (double)(n - 1) / n * bytes / (gbs * 1e9) : 0.0;
}

static double max0(double x)
{
    return x > 0 ? x : 0;
}

/* The bandwidth of a group spanning `span` consecutive GPUs. */
static double bw(const CostInput *in, int span)
{
    int gpn = in->gpus_per_node > 0 ? in->gpus_per_node : 8;
    return span <= gpn ? in->gpu->link_gbs : in->network_gbs;
}

void cost_step(const CostInput *in, CostResult *out)
{
    const MemsimModel *m = in->model;
    double psi = (double)memsim_model_n_params(m);
    double L = (double)m->L, H = (double)m->H, s = (double)in->seq;
    bool full_ft = in->finetune == MEMSIM_FT_FULL;
    double psi_t = full_ft ? psi : (double)in->lora_rank * 2.0 * H * 2.0 * L;
    double cb = in->precision == MEMSIM_PREC_FP32 ? 4.0 : 2.0;
    bool pure = in->precision == MEMSIM_PREC_BF16 || in->precision == MEMSIM_PREC_FP16;
    double tp = in->tp > 0 ? in->tp : 1, pp = in->pp > 0 ? in->pp : 1;
    double b = (double)in->batch, mb = in->n_micro > 0 ? in->n_micro : 1;
    bool megatron = in->method == MEMSIM_METHOD_MEGATRON;
    double peak =
        (in->precision == MEMSIM_PREC_FP32 ? in->gpu->fp32_tflops : in->gpu->bf16_tflops) * 1e12;
    double rate = peak * in->efficiency * in->compute_fraction;
    double hbm = in->gpu->hbm_gbs * 1e9 * in->memory_fraction;

    /* compute */
    double A = 4.0 * L * s * s * H;
    double fwd = 2.0 * psi * s + A;
    double bwd = 2.0 * psi * s + 2.0 * psi_t * s + 2.0 * A;
    double rec = in->checkpointing == MEMSIM_CKPT_FULL        ? fwd
                 : in->checkpointing == MEMSIM_CKPT_SELECTIVE ? A
                                                              : 0.0;
    double split = megatron ? tp * pp : 1.0;
    double per_mb_fwd = b * fwd / split / rate;
    double per_mb_bwd = b * (bwd + rec) / split / rate; /* recomputation runs in backward */
    double per_mb = per_mb_fwd + per_mb_bwd;
    out->compute_s = b * mb * (fwd + bwd) / split / rate;
    out->recompute_s = b * mb * rec / split / rate;
    out->bubble_s = 0;
    if (megatron && pp > 1) {
        double frac = (pp - 1) / mb;
        if (in->schedule == MEMSIM_PP_INTERLEAVED && in->v > 1)
            frac /= in->v;
        out->bubble_s = (out->compute_s + out->recompute_s) * frac;
    }

    /* collectives */
    int gpus = in->gpus, gpn = in->gpus_per_node > 0 ? in->gpus_per_node : 8;
    double comm = 0, shard = psi_t;
    switch (in->method) {
    case MEMSIM_METHOD_DDP: {
        double ar = allreduce(psi * (pure ? 2.0 : 4.0), gpus, bw(in, gpus));
        comm = max0(ar - per_mb_bwd);
        shard = psi;
        break;
    }
    case MEMSIM_METHOD_ZERO1:
        comm = max0(allreduce(cb * psi, gpus, bw(in, gpus)) - per_mb_bwd) +
               gather(cb * psi, gpus, bw(in, gpus));
        shard = psi / gpus;
        break;
    case MEMSIM_METHOD_ZERO2:
        comm = mb * max0(gather(cb * psi, gpus, bw(in, gpus)) - per_mb_bwd) +
               gather(cb * psi, gpus, bw(in, gpus));
        shard = psi / gpus;
        break;
    case MEMSIM_METHOD_ZERO3:
    case MEMSIM_METHOD_FSDP:
        comm = mb * max0(3.0 * gather(cb * psi, gpus, bw(in, gpus)) - per_mb);
        shard = psi / gpus;
        break;
    case MEMSIM_METHOD_FSDP_GRAD_OP:
        comm = mb * max0(2.0 * gather(cb * psi, gpus, bw(in, gpus)) - per_mb);
        shard = psi / gpus;
        break;
    case MEMSIM_METHOD_HSDP: {
        int n = gpn < gpus ? gpn : gpus;
        double c = 3.0 * gather(cb * psi, n, bw(in, n)) +
                   allreduce(cb * psi / n, gpus / n, in->network_gbs);
        comm = mb * max0(c - per_mb);
        shard = psi / n;
        break;
    }
    case MEMSIM_METHOD_MEGATRON: {
        int itp = (int)tp, ipp = (int)pp, dp = in->dp > 0 ? in->dp : 1;
        double act = b * s * H * cb;
        double ars = (L / pp) * (in->checkpointing == MEMSIM_CKPT_FULL ? 6.0 : 4.0);
        double tpc = mb * ars * allreduce(act, itp, bw(in, itp));
        double hops = in->schedule == MEMSIM_PP_INTERLEAVED && in->v > 1 ? in->v : 1;
        double ppc = ipp > 1 ? mb * 2.0 * act * hops / (bw(in, itp * dp * ipp) * 1e9) : 0.0;
        double stage = psi / (tp * pp);
        double dpc =
            gather(4.0 * stage, dp, bw(in, itp * dp)) + gather(cb * stage, dp, bw(in, itp * dp));
        comm = tpc + ppc + dpc;
        shard = stage / dp;
        break;
    }
    default:
        if (in->replicas && gpus > 1)
            comm = max0(allreduce(4.0 * psi_t, gpus, bw(in, gpus)) - per_mb_bwd);
        shard = psi_t;
        break;
    }
    out->comm_s = comm;

    /* memory traffic */
    if (in->offload)
        out->optimizer_s = 4.0 * shard / (PCIE_GBS * 1e9) + shard / CPU_ADAM_PARAMS_PER_S;
    else
        out->optimizer_s = OPTIM_BYTES_PER_PARAM * shard / hbm;
    out->other_s = 0;
    if (in->finetune == MEMSIM_FT_QLORA) {
        double passes = in->checkpointing == MEMSIM_CKPT_FULL ? 3.0 : 2.0;
        out->other_s = mb * passes * 2.5 * psi / hbm;
    }
    out->step_s = out->compute_s + out->recompute_s + out->bubble_s + out->comm_s +
                  out->optimizer_s + out->other_s;
    double replicas = megatron ? (in->dp > 0 ? in->dp : 1)
                      : in->method == MEMSIM_METHOD_NONE && !in->replicas ? 1
                                                                          : gpus;
    out->tokens = replicas * b * mb * s;
    out->tokens_per_s = out->tokens / out->step_s;
}
