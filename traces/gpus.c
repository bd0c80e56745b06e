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

const MemsimGpu *memsim_gpus(void)
{
    return gpus;
}

const MemsimGpu *memsim_gpu_find(const char *name)
{
    if (!name)
        name = "a100-80gb";
    if (strcmp(name, "h200-141gb") == 0)
        name = "h200";
    for (const MemsimGpu *g = gpus; g->name; g++)
        if (strcmp(g->name, name) == 0)
            return g;
    return NULL;
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
