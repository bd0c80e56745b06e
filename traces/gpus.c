/* GPU profiles (include/memsim/gen.h): public figures of each card — memory as nvidia-smi
 * reports it, dense tensor-core peak (bf16/fp16) and fp32 peak, HBM bandwidth, and the
 * per-direction bandwidth of its GPU-to-GPU link (NVLink, or PCIe 4.0 x16 for cards without
 * it) — from NVIDIA's data sheets (A100: "NVIDIA A100 Tensor Core GPU" datasheet; H100/H200:
 * the H100 and H200 product pages; V100: the V100 datasheet; A10G, L4, RTX cards: their
 * architecture whitepapers).
 *
 * SMs: the whitepapers' counts of enabled SMs (A100 108, H100 SXM5 132, V100 80, A10 80,
 * L4 58, RTX 4090 128, RTX 3090 82).
 *
 * What the time model assumes is reached: half the tensor-core peak for a GEMM's full waves
 * and 80% of the bandwidths (the ratios NVIDIA's "Matrix Multiplication Background User's
 * Guide" and the STREAM-like copy figures of its data sheets show for large operands), and
 * 25 GB/s per GPU between nodes (one 200 Gb/s InfiniBand NIC per GPU, as DGX and HGX nodes
 * have); the planner's --efficiency and --network-gbs change the last for its cost model.
 *
 * Per-kernel and per-op terms:
 *   kernel_us 3: the shortest a kernel takes on the GPU, launch to completion (NVIDIA's
 *               "Getting Started with CUDA Graphs" blog measures about 3 µs per back-to-back
 *               short kernel);
 *   dispatch_us 10: the host's time to run one eager PyTorch op — Python, the autograd
 *               recording (torch/csrc/autograd/generated/VariableType), the ATen dispatcher
 *               and cudaLaunchKernel; each is a few µs, 5-25 µs in all by the published
 *               breakdowns of the dispatch path;
 *   NCCL's latency model (NVIDIA/nccl src/graph/tuning.cc: baseLat, hwLat; the Ring
 *               algorithm with the Simple protocol): 8.4 µs per collective plus, per ring
 *               step, 3.4 µs over NVLink, 5.7 µs over PCIe, 9.6 µs over the network. */
#include <memsim/alloc.h>
#include <memsim/gen.h>
#include <memsim/sim.h>

#include <string.h>

#define MiB ((memsim_size_t)1 << 20)
#define REACHED 0.5, 0.8, 25.0 /* compute and bandwidth efficiency, network GB/s */
#define NVLINK 3.0, 10.0, 8.4, 3.4, 9.6 /* kernel, dispatch, NCCL base, link hop, net hop */
#define PCIE 3.0, 10.0, 8.4, 5.7, 9.6

static const MemsimGpu gpus[] = {
    {"a100-40gb", 40960 * MiB, 312, 19.5, 1555, 300, REACHED, 108, NVLINK},
    {"a100-80gb", 81920 * MiB, 312, 19.5, 2039, 300, REACHED, 108, NVLINK},
    {"h100-80gb", 81559 * MiB, 989, 67, 3350, 450, REACHED, 132, NVLINK},
    {"h200", 143771 * MiB, 989, 67, 4800, 450, REACHED, 132, NVLINK},
    {"v100-16gb", 16160 * MiB, 125, 15.7, 900, 150, REACHED, 80, NVLINK},
    {"v100-32gb", 32510 * MiB, 125, 15.7, 900, 150, REACHED, 80, NVLINK},
    {"a10g", 23028 * MiB, 70, 31.2, 600, 25, REACHED, 80, PCIE},
    {"l4", 23034 * MiB, 121, 30.3, 300, 25, REACHED, 58, PCIE},
    {"rtx4090", 24564 * MiB, 165, 82.6, 1008, 25, REACHED, 128, PCIE},
    {"rtx3090", 24576 * MiB, 71, 35.6, 936, 25, REACHED, 82, PCIE},
    {NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};

/* ---- MIG slices ----
 *
 * Memory: the GiB `nvidia-smi mig -lgip` lists (public listings of A100-SXM4-40GB,
 * A100-SXM4-80GB and H100-SXM5-80GB). H200: 7g.141gb as a public lgip listing gives it
 * (140.00 GiB) and 3g/4g.71gb as torch reports a 3g.71gb slice (69.8 GiB); 1g.18gb and
 * the 35gb profiles are scaled from H100's listing (verify with nvidia-smi mig -lgip).
 * Instances: the MIG user guide's "number of instances available". SMs: lgip's SM column
 * (A100: 108 SMs in all, of which 98 in 7g; H100/H200: 132). Memory slices: of 8, the
 * share of the HBM bandwidth and L2 the slice gets (the MIG user guide's "memory slice").
 *
 * A slice is a GPU profile of its own, named GPU:PROFILE (a100-40gb:1g.5gb): its memory,
 * its SMs (GEMM waves), the tensor-core and vector peaks scaled by its SMs over the GPU's,
 * its HBM bandwidth by its memory slices over 8; the host terms are the GPU's (each slice's
 * job has its own process and CPU cores). */
static const MemsimMigProfile migs[] = {
    {"a100-40gb", "1g.5gb", 4864, 14, 1, 7},    {"a100-40gb", "2g.10gb", 9984, 28, 2, 3},
    {"a100-40gb", "3g.20gb", 20096, 42, 4, 2},  {"a100-40gb", "4g.20gb", 20096, 56, 4, 1},
    {"a100-40gb", "7g.40gb", 40320, 98, 8, 1},  {"a100-80gb", "1g.10gb", 9728, 14, 1, 7},
    {"a100-80gb", "1g.20gb", 19968, 14, 2, 4},  {"a100-80gb", "2g.20gb", 19968, 28, 2, 3},
    {"a100-80gb", "3g.40gb", 40192, 42, 4, 2},  {"a100-80gb", "4g.40gb", 40192, 56, 4, 1},
    {"a100-80gb", "7g.80gb", 80896, 98, 8, 1},  {"h100-80gb", "1g.10gb", 9984, 16, 1, 7},
    {"h100-80gb", "1g.20gb", 20096, 26, 2, 4},  {"h100-80gb", "2g.20gb", 20096, 32, 2, 3},
    {"h100-80gb", "3g.40gb", 40448, 60, 4, 2},  {"h100-80gb", "4g.40gb", 40448, 64, 4, 1},
    {"h100-80gb", "7g.80gb", 81152, 132, 8, 1}, {"h200", "1g.18gb", 17536, 16, 1, 7},
    {"h200", "1g.35gb", 35456, 26, 2, 4},       {"h200", "2g.35gb", 35456, 32, 2, 3},
    {"h200", "3g.71gb", 71424, 60, 4, 2},       {"h200", "4g.71gb", 71424, 64, 4, 1},
    {"h200", "7g.141gb", 143360, 132, 8, 1},    {NULL, NULL, 0, 0, 0, 0},
};

#define N_MIGS (sizeof migs / sizeof migs[0] - 1)

static const MemsimGpu *whole(const char *name)
{
    for (const MemsimGpu *g = gpus; g->name; g++)
        if (strcmp(g->name, name) == 0)
            return g;
    return NULL;
}

static MemsimGpu mig_gpus[N_MIGS];

static gpointer init_migs(gpointer unused)
{
    for (gsize i = 0; i < N_MIGS; i++) {
        const MemsimMigProfile *m = &migs[i];
        const MemsimGpu *g = whole(m->gpu);
        double c = (double)m->sms / g->sms, b = m->mem_slices / 8.0;
        MemsimGpu s = *g;
        s.name = g_strdup_printf("%s:%s", m->gpu, m->name); /* static: lives as the table */
        s.memory = (memsim_size_t)m->mem_mib * MiB;
        s.bf16_tflops = g->bf16_tflops * c;
        s.fp32_tflops = g->fp32_tflops * c;
        s.hbm_gbs = g->hbm_gbs * b;
        s.sms = m->sms;
        mig_gpus[i] = s;
    }
    return NULL;
}

const MemsimGpu *memsim_gpus(void)
{
    return gpus;
}

const MemsimMigProfile *memsim_mig_profiles(void)
{
    return migs;
}

const MemsimGpu *memsim_gpu_find(const char *name)
{
    if (!name)
        name = "a100-80gb";
    if (strcmp(name, "h200-141gb") == 0)
        name = "h200";
    const char *colon = strchr(name, ':');
    if (colon) {
        static GOnce once = G_ONCE_INIT;
        g_once(&once, init_migs, NULL);
        for (gsize i = 0; i < N_MIGS; i++)
            if (strcmp(mig_gpus[i].name, name) == 0)
                return &mig_gpus[i];
        return NULL;
    }
    return whole(name);
}

char *memsim_gpu_names(void)
{
    GString *s = g_string_new(NULL);
    for (const MemsimGpu *g = gpus; g->name; g++)
        g_string_append_printf(s, "%s%s", s->len ? ", " : "", g->name);
    return g_string_free(s, FALSE);
}

gboolean memsim_parse_gpu_mem(const char *key, const char *text, memsim_size_t *bytes,
                              const char **profile, GError **error)
{
    g_autofree char *low = g_ascii_strdown(text, -1);
    const MemsimGpu *g = memsim_gpu_find(low);
    if (g) {
        *bytes = g->memory;
        if (profile)
            *profile = g->name;
        return TRUE;
    }
    GError *e = NULL;
    memsim_size_t b;
    if (!memsim_parse_size(text, &b, &e)) {
        g_autofree char *known = memsim_gpu_names();
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: '%s' is neither a size (80GiB, 80GB, bytes) nor a GPU (%s)", key, text,
                    known);
        g_error_free(e);
        return FALSE;
    }
    if (b == 0) {
        g_set_error(error, MEMSIM_ERROR, MEMSIM_ERROR_BAD_INPUT,
                    "%s: 0 bytes: give the device's memory (80GiB) or a GPU name", key);
        return FALSE;
    }
    *bytes = b;
    if (profile)
        *profile = NULL;
    return TRUE;
}

void memsim_time_model_of(const MemsimGpu *gpu, MemsimTimeModel *out);
void memsim_time_model_of(const MemsimGpu *gpu, MemsimTimeModel *out)
{
    memset(out, 0, sizeof *out);
    g_strlcpy(out->gpu, gpu->name, sizeof out->gpu);
    out->compute_efficiency = gpu->compute_efficiency;
    out->bandwidth_efficiency = gpu->bandwidth_efficiency;
    out->sms = gpu->sms;
    out->kernel_us = gpu->kernel_us;
    out->dispatch_us = gpu->dispatch_us;
    out->network_gbs = gpu->network_gbs;
}
