/* Regression tests for defects fixed in the generator: each test failed on the code before its
 * fix. */
#include <criterion/criterion.h>
#include <memsim/gen.h>
#include <memsim/trace.h>
#include <string.h>

#include "testutil.h"

static MemsimTrace *generate(const char *model, const char *const *settings)
{
    GError *e = NULL;
    MemsimModel *m = memsim_model_load(model, &e);
    cr_assert(m, "%s", e ? e->message : "?");
    MemsimRun run = memsim_run_defaults();
    for (int i = 0; settings[i]; i += 2)
        cr_assert(memsim_run_set(&run, settings[i], settings[i + 1], &e), "%s: %s", settings[i],
                  e ? e->message : "?");
    MemsimTrace *t = memsim_generate(m, &run, &e);
    cr_assert(t, "%s", e ? e->message : "?");
    memsim_run_clear(&run);
    memsim_model_free(m);
    return t;
}

static const char *op_name(const MemsimTraceHeader *h, int64_t op)
{
    if (op < 0 || (uint64_t)op >= h->n_ops || h->ops[op].name >= h->n_strings)
        return "(no op)";
    return h->strings[h->ops[op].name];
}

static gboolean is_gemm(const char *name)
{
    static const char *const gemms[] = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"};
    for (gsize i = 0; i < G_N_ELEMENTS(gemms); i++)
        if (strcmp(name, gemms[i]) == 0)
            return TRUE;
    return FALSE;
}

/* The cuBLAS workspace (CUBLAS_WORKSPACE_CONFIG's default before Hopper: 4096 KiB × 2 +
 * 16 KiB × 8 = 8519680 bytes, one per cuBLAS handle: the forward thread's and the autograd
 * thread's) is allocated by the first GEMM of each thread, so its ALLOC must lie in that
 * GEMM's op (mm, addmm, bmm), not in the op before it (it used to land in a _to_copy in the
 * forward and in MmBackward0 in the backward). */
static void workspaces_in_gemms(const char *model, const char *const *settings,
                                memsim_size_t workspace)
{
    MemsimTrace *t = generate(model, settings);
    const MemsimTraceHeader *h = memsim_trace_header(t);
    gsize n = 0;
    const MemsimEvent *ev = memsim_trace_events(t, 0, &n);
    int64_t op = -1;
    int found = 0;
    for (gsize i = 0; i < n; i++) {
        if (ev[i].kind == MEMSIM_EV_OP)
            op = (int64_t)ev[i].id;
        if (ev[i].kind != MEMSIM_EV_ALLOC || ev[i].size != workspace ||
            ev[i].category != MEMSIM_CAT_OTHER)
            continue;
        const char *name = op_name(h, op);
        cr_expect(is_gemm(name), "%s: workspace %d (event %zu) is in op \"%s\" (%s), not a GEMM",
                  model, found + 1, i, name,
                  op >= 0 ? memsim_phase_name(h->ops[op].phase) : "-");
        found++;
    }
    cr_expect_eq(found, 2, "%s: %d workspaces of %" G_GUINT64_FORMAT " bytes (forward and "
                 "autograd threads expected)", model, found, (guint64)workspace);
    memsim_trace_free(t);
}

Test(cublas_workspace, in_the_first_gemm_gpt2)
{
    static const char *const s[] = {"seq", "128", NULL};
    workspaces_in_gemms("gpt2", s, 8519680);
}

Test(cublas_workspace, in_the_first_gemm_llama)
{
    /* nn.Linear layers (mm, no bias), on Hopper: a 32 MiB workspace */
    static const char *const s[] = {"seq", "64", "gpu", "h100-80gb", NULL};
    workspaces_in_gemms("llama-2-7b", s, 33554432);
}
