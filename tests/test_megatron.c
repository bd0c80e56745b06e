/* Megatron-LM launches (include/memsim/megatron.h, traces/megatron.c, traces/launch.c): the
 * same run read from a test's model_config.yaml, a command line and a shell script is the same
 * run; unknown flags are named in one warning and memory-neutral ones in none; Megatron's
 * defaults are Megatron's (megatron/training/arguments.py at d98e8a64dd, cited in the code);
 * contradictions exit 2 naming the flags; the parameter count is Megatron's own formula; and
 * the golden development set of real Megatron runs (../shared/data/megatron-golden) maps to the
 * fields its README derives from Megatron's source. */
#include <criterion/criterion.h>
#include <json-glib/json-glib.h>
#include <memsim/megatron.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "traces/megatron.h"
#include "traces/model.h"

/* The flags every inline launch below starts from: a small GPT, 12 layers, hidden 512. */
#define BASE                                                                                      \
    "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "              \
    "--max-position-embeddings 1024 --micro-batch-size 4 "

static MemsimMegatron *parse_ok(const char *text)
{
    GError *e = NULL;
    MemsimMegatron *mg = memsim_megatron_parse(text, "launch", &e);
    cr_assert(mg, "%s\n%s", e ? e->message : "?", text);
    return mg;
}

/* The error of a launch that must be refused; it must name every word of `words`. */
static void parse_refused(const char *text, const char *const *words)
{
    GError *e = NULL;
    MemsimMegatron *mg = memsim_megatron_parse(text, "launch", &e);
    cr_assert(!mg, "accepted: %s", text);
    cr_assert(e && e->domain == MEMSIM_ERROR && e->code == MEMSIM_ERROR_BAD_INPUT, "%s", text);
    for (const char *const *w = words; *w; w++)
        cr_expect(strstr(e->message, *w), "'%s' not named: %s", *w, e->message);
    g_error_free(e);
}

static guint n_warnings(const MemsimMegatron *mg)
{
    guint n = 0;
    for (const char *const *w = memsim_megatron_warnings(mg); *w; w++)
        n++;
    return n;
}

static char *fixture(const char *name)
{
    g_autofree char *rel = g_build_filename("megatron", name, NULL);
    return tu_test_data(rel);
}

/* ---- one run, three forms ---- */

/* The model, the MgOptions (pointers aside) and the run line of two launches are the same. */
static void expect_same(const MemsimMegatron *a, const MemsimMegatron *b, const char *what)
{
    const MemsimModel *ma = memsim_megatron_model(a), *mb = memsim_megatron_model(b);
    cr_expect_str_eq(ma->name, mb->name, "%s", what);
    cr_expect(ma->V == mb->V && ma->H == mb->H && ma->L == mb->L && ma->nh == mb->nh &&
                  ma->nkv == mb->nkv && ma->hd == mb->hd && ma->I == mb->I &&
                  ma->max_pos == mb->max_pos && ma->tie == mb->tie &&
                  ma->qkv_bias == mb->qkv_bias && ma->o_bias == mb->o_bias &&
                  ma->mlp_bias == mb->mlp_bias && strcmp(ma->act, mb->act) == 0 &&
                  ma->attn_pdrop == mb->attn_pdrop && ma->resid_pdrop == mb->resid_pdrop &&
                  ma->rotary_pct == mb->rotary_pct,
              "%s: the models differ", what);
    MgOptions oa = a->o, ob = b->o;
    cr_expect_str_eq(oa.alloc_conf ? oa.alloc_conf : "", ob.alloc_conf ? ob.alloc_conf : "",
                     "%s", what);
    cr_expect_str_eq(oa.tokenizer, ob.tokenizer, "%s", what);
    oa.alloc_conf = ob.alloc_conf = NULL;
    oa.tokenizer = ob.tokenizer = NULL;
    cr_expect(memcmp(&oa, &ob, sizeof oa) == 0, "%s: the Megatron options differ", what);
    MemsimRun ra = memsim_run_defaults(), rb = memsim_run_defaults();
    memsim_megatron_apply(a, &ra);
    memsim_megatron_apply(b, &rb);
    g_autofree char *da = memsim_run_describe(&ra);
    g_autofree char *db = memsim_run_describe(&rb);
    cr_expect_str_eq(da, db, "%s", what);
    GError *e = NULL;
    cr_expect(memsim_run_check(&ra, &e), "%s: %s", what, e ? e->message : "");
    g_clear_error(&e);
    cr_expect_eq(g_strcmp0(memsim_megatron_alloc_conf(a), memsim_megatron_alloc_conf(b)), 0);
    memsim_run_clear(&ra);
    memsim_run_clear(&rb);
}

Test(megatron, yaml_command_line_and_script_give_the_same_run)
{
    const char *names[] = {"run.yaml", "run.txt", "run.sh"};
    MemsimMegatron *mg[3];
    for (int i = 0; i < 3; i++) {
        g_autofree char *path = fixture(names[i]);
        GError *e = NULL;
        mg[i] = memsim_megatron_load(path, &e);
        cr_assert(mg[i], "%s: %s", names[i], e ? e->message : "?");
        cr_expect_eq(n_warnings(mg[i]), 0, "%s: %s", names[i], memsim_megatron_warnings(mg[i])[0]);
    }
    expect_same(mg[0], mg[1], "run.yaml vs run.txt");
    expect_same(mg[0], mg[2], "run.yaml vs run.sh");
    /* what the fixtures say, read back */
    MemsimRun r = memsim_run_defaults();
    memsim_megatron_apply(mg[0], &r);
    cr_expect(r.gpus == 8 && r.tp == 2 && r.pp == 2 && r.dp == 2 && r.microbatches == 8 &&
              r.batch == 2 && r.seq == 1024 && r.sequence_parallel &&
              r.method == MEMSIM_METHOD_MEGATRON && r.precision == MEMSIM_PREC_BF16_MIXED &&
              r.checkpointing == MEMSIM_CKPT_SELECTIVE && r.attention == MEMSIM_ATTN_MEM_EFFICIENT &&
              r.cublas_workspace == 32 << 20 && r.megatron == mg[0]);
    const MemsimModel *m = memsim_megatron_model(mg[0]);
    cr_expect(m->nkv == 4 && m->I == 1536 && !m->tie && !m->mlp_bias && !m->qkv_bias);
    cr_expect_str_eq(memsim_model_family(m), "megatron");
    cr_expect_str_eq(memsim_megatron_alloc_conf(mg[0]), "expandable_segments:True");
    cr_expect(mg[0]->o.distributed_optimizer && mg[0]->o.overlap_grad_reduce &&
              mg[0]->o.overlap_param_gather && mg[0]->o.rms_norm && mg[0]->o.swiglu &&
              mg[0]->o.pos == MG_POS_ROPE && mg[0]->o.attention == MG_ATTN_FUSED);
    memsim_run_clear(&r);
    for (int i = 0; i < 3; i++)
        memsim_megatron_free(mg[i]);
}

static JsonNode *json_of(const char *text)
{
    g_autoptr(JsonParser) p = json_parser_new();
    GError *e = NULL;
    cr_assert(json_parser_load_from_data(p, text, -1, &e), "%s", e ? e->message : "?");
    return json_node_copy(json_parser_get_root(p));
}

/* The estimate of each form through the command: the same peaks, rank by rank. */
Test(megatron, the_three_forms_estimate_the_same, .timeout = 240)
{
    const char *names[] = {"run.yaml", "run.txt", "run.sh"};
    char *out[3] = {NULL}, *err[3] = {NULL};
    int rc[3];
    for (int i = 0; i < 3; i++) {
        g_autofree char *path = fixture(names[i]);
        const char *argv[] = {"estimate", "--megatron-args", path, "--gpu-mem", "80GiB", "--json",
                              NULL};
        rc[i] = tu_run_memsim(argv, &out[i], &err[i]);
    }
    for (int i = 0; i < 3; i++)
        cr_assert(rc[i] == 0 || rc[i] == 1, "%s: exit %d: %s", names[i], rc[i], err[i]);
    JsonNode *j[3];
    for (int i = 0; i < 3; i++)
        j[i] = json_of(out[i]);
    JsonArray *r0 = json_object_get_array_member(json_node_get_object(j[0]), "ranks");
    for (int i = 1; i < 3; i++) {
        JsonArray *ri = json_object_get_array_member(json_node_get_object(j[i]), "ranks");
        cr_assert_eq(json_array_get_length(ri), json_array_get_length(r0), "%s", names[i]);
        for (guint k = 0; k < json_array_get_length(r0); k++) {
            JsonObject *a = json_array_get_object_element(r0, k);
            JsonObject *b = json_array_get_object_element(ri, k);
            const char *fields[] = {"rank", "peak_allocated", "peak_reserved", "peak_requested"};
            for (gsize f = 0; f < G_N_ELEMENTS(fields); f++)
                cr_expect_eq(json_object_get_int_member(a, fields[f]),
                             json_object_get_int_member(b, fields[f]), "%s, rank row %u: %s",
                             names[i], k, fields[f]);
        }
        cr_expect_str_eq(json_object_get_string_member(json_node_get_object(j[i]), "run"),
                         json_object_get_string_member(json_node_get_object(j[0]), "run"));
    }
    for (int i = 0; i < 3; i++) {
        json_node_unref(j[i]);
        g_free(out[i]);
        g_free(err[i]);
    }
}

/* ---- warnings ---- */

Test(megatron, unknown_flags_make_one_warning_naming_them)
{
    MemsimMegatron *mg = parse_ok("torchrun --nproc-per-node 8 pretrain_gpt.py " BASE
                                  "--frobnicate 3 --no-such-flag --bf16 --another_one=x");
    cr_assert_eq(n_warnings(mg), 1, "%s", memsim_megatron_warnings(mg)[0]);
    const char *w = memsim_megatron_warnings(mg)[0];
    cr_expect(strstr(w, "not known") && strstr(w, "--frobnicate") && strstr(w, "--no-such-flag") &&
                  strstr(w, "--another-one") && strstr(w, "ignored"),
              "%s", w);
    /* the value of an unknown flag is not taken for a flag, and the known ones still apply */
    cr_expect(mg->o.bf16);
    memsim_megatron_free(mg);
}

Test(megatron, memory_neutral_flags_make_no_warning)
{
    MemsimMegatron *mg = parse_ok(
        "torchrun --nproc-per-node 8 --nnodes 1 --master-addr localhost --master-port 6000 "
        "--node-rank 0 --rdzv-backend c10d pretrain_gpt.py " BASE
        "--train-iters 500000 --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 "
        "--lr-warmup-fraction .001 --lr-decay-iters 430000 --weight-decay 0.1 --adam-beta1 0.9 "
        "--adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --data-path /d/x_text_document "
        "--vocab-file /d/gpt2-vocab.json --merge-file /d/gpt2-merges.txt --split 949,50,1 "
        "--log-interval 100 --save-interval 10000 --eval-interval 1000 --save /c --load /c "
        "--eval-iters 10 --tensorboard-dir /tb --seed 1234 --use-mcore-models "
        "--ckpt-format torch_dist --async-save --use-persistent-ckpt-worker "
        "--dist-ckpt-strictness log_all --log-timers-to-tensorboard --log-memory-to-tensorboard "
        "--timing-log-level 0 --distributed-backend nccl --manual-gc --rotary-base 10000 "
        "--use-checkpoint-opt_param-scheduler --override-opt_param-scheduler --finetune "
        "--no-load-optim --no-load-rng --calculate-per-token-loss --wandb-project p "
        "--data-cache-path /cache --num-workers 2 --use-flash-attn --deterministic-mode");
    cr_expect_eq(n_warnings(mg), 0, "%s", memsim_megatron_warnings(mg)[0]);
    memsim_megatron_free(mg);
}

/* ---- Megatron's defaults ---- */

Test(megatron, defaults_are_megatrons)
{
    MemsimMegatron *mg = parse_ok("pretrain_gpt.py " BASE);
    const MemsimModel *m = memsim_megatron_model(mg);
    const MgOptions *o = &mg->o;
    /* FFN 4h, kv-channels h / heads, no GQA (arguments.py:1320-1333, argument_utils.py:330) */
    cr_expect_eq(m->I, 4 * 512);
    cr_expect_eq(m->hd, 64);
    cr_expect_eq(m->nkv, 8);
    /* GPT2BPETokenizer's 50257 tokens, padded to 128 × TP (pretrain_gpt.py:527,
     * arguments.py:2441) */
    cr_expect_eq(m->V, 50257);
    cr_expect_str_eq(o->tokenizer, "GPT2BPETokenizer");
    cr_expect_eq(mg_padded_vocab(o, 1), 50304);
    cr_expect_eq(mg_padded_vocab(o, 2), 50432);
    cr_expect_eq(mg_padded_vocab(o, 4), 50688);
    /* dropout 0.1 (transformer_config.py:188, 191), biases, tied, LayerNorm, learned positions */
    cr_expect(m->attn_pdrop == 0.1 && m->resid_pdrop == 0.1 && m->embd_pdrop == 0.1);
    cr_expect(m->qkv_bias && m->o_bias && m->mlp_bias && m->tie);
    cr_expect_str_eq(m->act, "gelu");
    cr_expect(!o->rms_norm && o->pos == MG_POS_LEARNED && !o->swiglu && !o->qk_norm);
    /* Transformer Engine, attention auto, fusions on, CE fusion off, mask from the loader */
    cr_expect(o->impl == MG_IMPL_TE && o->attention == MG_ATTN_AUTO);
    cr_expect(o->bias_dropout_fusion && o->bias_gelu_fusion && o->masked_softmax_fusion &&
              o->grad_accum_fusion && !o->ce_fusion && o->attention_mask && !o->rope_fusion);
    /* fp32 without --bf16/--fp16: grads fp32; Adam; no distributed optimizer, no overlap */
    cr_expect(!o->bf16 && !o->fp16 && o->grads_fp32 && !o->distributed_optimizer &&
              o->optimizer_instances == 1 && !o->overlap_grad_reduce && !o->overlap_param_gather);
    cr_expect(o->clip_grad == 1.0 && o->recompute == MG_RECOMPUTE_NONE && o->cp == 1);
    /* one GPU without a launcher: one micro-batch of micro-batch × dp */
    MemsimRun r = memsim_run_defaults();
    memsim_megatron_apply(mg, &r);
    cr_expect(r.gpus == 1 && r.tp == 1 && r.pp == 1 && r.dp == 1 && r.microbatches == 1);
    cr_expect(r.precision == MEMSIM_PREC_FP32 && r.optimizer == MEMSIM_OPTIM_ADAMW &&
              r.checkpointing == MEMSIM_CKPT_NONE && r.attention == MEMSIM_ATTN_SDPA);
    cr_expect_eq(r.steps, 2, "memsim's own default");
    cr_expect(!memsim_megatron_sets(mg, "gpus") && memsim_megatron_sets(mg, "tp") &&
              memsim_megatron_sets(mg, "seq") && !memsim_megatron_sets(mg, "gpu") &&
              !memsim_megatron_sets(mg, "cublas-workspace"));
    memsim_run_clear(&r);
    memsim_megatron_free(mg);
}

Test(megatron, swiglu_width_and_gqa_defaults)
{
    /* int((4h · 2/3) / 64) × 64 (arguments.py:1320-1327) */
    MemsimMegatron *mg = parse_ok("pretrain_gpt.py " BASE "--swiglu");
    cr_expect_eq(memsim_megatron_model(mg)->I, 1344);
    cr_expect_str_eq(memsim_megatron_model(mg)->act, "swiglu");
    memsim_megatron_free(mg);
    mg = parse_ok("pretrain_gpt.py --num-layers 2 --hidden-size 4096 --num-attention-heads 32 "
                  "--seq-length 128 --max-position-embeddings 128 --micro-batch-size 1 --swiglu");
    cr_expect_eq(memsim_megatron_model(mg)->I, 10880);
    memsim_megatron_free(mg);
    /* --group-query-attention alone: one query group (argparse's default,
     * transformer_config.py:175-177); --num-query-groups without it: ignored, with a warning */
    mg = parse_ok("pretrain_gpt.py " BASE "--group-query-attention");
    cr_expect_eq(memsim_megatron_model(mg)->nkv, 1);
    memsim_megatron_free(mg);
    mg = parse_ok("pretrain_gpt.py " BASE "--num-query-groups 2");
    cr_expect_eq(memsim_megatron_model(mg)->nkv, 8);
    cr_expect(n_warnings(mg) == 1 && strstr(memsim_megatron_warnings(mg)[0], "--num-query-groups"));
    memsim_megatron_free(mg);
    /* --kv-channels apart from h / heads is Megatron's to take */
    mg = parse_ok("pretrain_gpt.py " BASE "--kv-channels 128");
    cr_expect_eq(memsim_megatron_model(mg)->hd, 128);
    memsim_megatron_free(mg);
}

Test(megatron, precision_and_grads)
{
    /* bf16: grads accumulated and reduced in fp32 (arguments.py:1204-1217) */
    MemsimMegatron *mg = parse_ok("pretrain_gpt.py " BASE "--bf16");
    cr_expect(mg->o.bf16 && mg->o.grads_fp32 && mg->run.precision == MEMSIM_PREC_BF16_MIXED);
    memsim_megatron_free(mg);
    mg = parse_ok("pretrain_gpt.py " BASE "--bf16 --grad-reduce-in-bf16");
    cr_expect(!mg->o.grads_fp32);
    memsim_megatron_free(mg);
    /* fp16: grads fp16 unless asked, dynamic loss scaling without --loss-scale */
    mg = parse_ok("pretrain_gpt.py " BASE "--fp16");
    cr_expect(mg->o.fp16 && !mg->o.grads_fp32 && mg->o.loss_scaling_dynamic &&
              mg->run.precision == MEMSIM_PREC_FP16_MIXED);
    memsim_megatron_free(mg);
    mg = parse_ok("pretrain_gpt.py " BASE "--fp16 --accumulate-allreduce-grads-in-fp32 "
                  "--loss-scale 4096");
    cr_expect(mg->o.grads_fp32 && !mg->o.loss_scaling_dynamic);
    memsim_megatron_free(mg);
}

Test(megatron, sequence_parallel_dropped_at_tp_1)
{
    MemsimMegatron *mg = parse_ok("torchrun --nproc-per-node 2 pretrain_gpt.py " BASE
                                  "--sequence-parallel");
    cr_expect(!mg->run.sequence_parallel);
    cr_expect(n_warnings(mg) == 1 && strstr(memsim_megatron_warnings(mg)[0], "--sequence-parallel"),
              "%s", memsim_megatron_warnings(mg)[0]);
    memsim_megatron_free(mg);
    mg = parse_ok("torchrun --nproc-per-node 2 pretrain_gpt.py " BASE
                  "--sequence-parallel --tensor-model-parallel-size 2");
    cr_expect(mg->run.sequence_parallel && n_warnings(mg) == 0);
    memsim_megatron_free(mg);
}

Test(megatron, recomputation)
{
    /* --recompute-num-layers without a granularity recomputes nothing */
    MemsimMegatron *mg = parse_ok("pretrain_gpt.py " BASE "--recompute-num-layers 1");
    cr_expect(mg->o.recompute == MG_RECOMPUTE_NONE && mg->run.checkpointing == MEMSIM_CKPT_NONE);
    memsim_megatron_free(mg);
    mg = parse_ok("pretrain_gpt.py " BASE "--recompute-activations");
    cr_expect(mg->run.checkpointing == MEMSIM_CKPT_SELECTIVE);
    memsim_megatron_free(mg);
    mg = parse_ok("pretrain_gpt.py " BASE "--recompute-granularity full --recompute-method block "
                  "--recompute-num-layers 2");
    cr_expect(mg->run.checkpointing == MEMSIM_CKPT_FULL &&
              mg->o.recompute_method == MG_RECOMPUTE_BLOCK && mg->o.recompute_layers == 2);
    memsim_megatron_free(mg);
}

Test(megatron, environment)
{
    /* CUBLAS_WORKSPACE_CONFIG :SIZE:COUNT pairs: 8 × 4096 KiB = 32 MiB; PYTORCH_CUDA_ALLOC_CONF */
    MemsimMegatron *mg = parse_ok("CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTORCH_CUDA_ALLOC_CONF="
                                  "expandable_segments:True python pretrain_gpt.py " BASE);
    cr_expect_eq(mg->o.cublas_workspace, 32 << 20);
    cr_expect_str_eq(memsim_megatron_alloc_conf(mg), "expandable_segments:True");
    cr_expect(memsim_megatron_sets(mg, "cublas-workspace"));
    memsim_megatron_free(mg);
    mg = parse_ok("CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8 python pretrain_gpt.py " BASE);
    cr_expect_eq(mg->o.cublas_workspace, 4096 * 1024 * 2 + 16 * 1024 * 8);
    memsim_megatron_free(mg);
    /* --deterministic-mode sets :4096:8 when the environment does not (determinism.py:28-32) */
    mg = parse_ok("python pretrain_gpt.py " BASE "--deterministic-mode");
    cr_expect_eq(mg->o.cublas_workspace, 32 << 20);
    cr_expect_null(memsim_megatron_alloc_conf(mg));
    memsim_megatron_free(mg);
}

/* ---- the world size ---- */

Test(megatron, world_size_sources)
{
    MemsimMegatron *mg = parse_ok("python -m torch.distributed.run --nproc_per_node=4 --nnodes 2 "
                                  "pretrain_gpt.py " BASE "--tensor-model-parallel-size 2");
    cr_expect(mg->run.gpus == 8 && mg->run.dp == 4 && memsim_megatron_sets(mg, "gpus"));
    GError *e = NULL;
    cr_expect(!memsim_megatron_set_gpus(mg, 16, &e) && strstr(e->message, "--gpus"));
    g_clear_error(&e);
    memsim_megatron_free(mg);
    mg = parse_ok("WORLD_SIZE=16 python pretrain_gpt.py " BASE);
    cr_expect(mg->run.gpus == 16 && memsim_megatron_sets(mg, "gpus"));
    memsim_megatron_free(mg);
    mg = parse_ok("GPUS_PER_NODE=4\nNUM_NODES=3\npython pretrain_gpt.py " BASE);
    cr_expect(mg->run.gpus == 12 && mg->run.gpus_per_node == 4);
    memsim_megatron_free(mg);
    /* a YAML: 8 GPUs, which --gpus changes */
    mg = parse_ok("MODEL_ARGS:\n  --num-layers: 12\n  --hidden-size: 512\n"
                  "  --num-attention-heads: 8\n  --seq-length: 1024\n"
                  "  --max-position-embeddings: 1024\n  --micro-batch-size: 4\n"
                  "  --global-batch-size: 32\n");
    cr_expect(mg->run.gpus == 8 && mg->run.dp == 8 && mg->run.microbatches == 1 &&
              !memsim_megatron_sets(mg, "gpus"));
    cr_expect(memsim_megatron_set_gpus(mg, 4, &e), "%s", e ? e->message : "");
    MemsimRun r = memsim_run_defaults();
    memsim_megatron_apply(mg, &r);
    cr_expect(r.gpus == 4 && r.dp == 4 && r.microbatches == 2);
    memsim_run_clear(&r);
    /* a global batch that no longer divides: refused naming the flags */
    cr_expect(!memsim_megatron_set_gpus(mg, 3, &e) && strstr(e->message, "--global-batch-size") &&
              strstr(e->message, "--micro-batch-size"));
    g_clear_error(&e);
    memsim_megatron_free(mg);
    /* no launcher and TP 2: read, then refused once the run is checked, naming the flags */
    mg = parse_ok("python pretrain_gpt.py " BASE "--tensor-model-parallel-size 2");
    r = memsim_run_defaults();
    memsim_megatron_apply(mg, &r);
    cr_expect(!memsim_run_check(&r, &e) && strstr(e->message, "--tensor-model-parallel-size") &&
              strstr(e->message, "--gpus"));
    g_clear_error(&e);
    memsim_run_clear(&r);
    memsim_megatron_free(mg);
}

/* ---- the shell reader ---- */

Test(megatron, shell_script_expansions)
{
    MemsimMegatron *mg = parse_ok(
        "#!/bin/bash\n"
        "set -euo pipefail\n"
        "NL=${NUM_LAYERS:-6}   # a default\n"
        "H=256; HEADS=$(( H / 64 ))\n"
        "export PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'\n"
        "ARGS=(--num-layers $NL\n"
        "      # a comment inside the array\n"
        "      --hidden-size \"$H\" --num-attention-heads ${HEADS})\n"
        "ARGS+=( --seq-length 512 --max-position-embeddings 512 )\n"
        "ARGS+=(--micro-batch-size=2)\n"
        "OPT=\"--bf16 \\\n"
        "     --use_distributed_optimizer\"\n"
        "CKPT=$(date +%s)\n"
        "srun -N 1 true\n"
        "torchrun --nproc_per_node=4 pretrain_gpt.py ${ARGS[@]} $OPT \\\n"
        "    --save $CKPT --load $1 --tensorboard-dir \"${TB}\" > log 2>&1 &\n"
        "wait\n");
    const MemsimModel *m = memsim_megatron_model(mg);
    cr_expect(m->L == 6 && m->H == 256 && m->nh == 4, "%ld %ld %ld", (long)m->L, (long)m->H,
              (long)m->nh);
    cr_expect(mg->run.seq == 512 && mg->run.batch == 2 && mg->run.gpus == 4);
    cr_expect(mg->o.bf16 && mg->o.distributed_optimizer);
    cr_expect_str_eq(memsim_megatron_alloc_conf(mg), "expandable_segments:True");
    cr_expect_eq(n_warnings(mg), 0, "%s", memsim_megatron_warnings(mg)[0]);
    memsim_megatron_free(mg);
    /* no launch command: the arrays and strings of flags; torchrun's among them */
    mg = parse_ok("DISTRIBUTED_ARGS=(--nproc_per_node 2 --nnodes 1)\n"
                  "GPT_ARGS=\"" BASE "--bf16\"\n"
                  "PAR=(--tensor-model-parallel-size 2)\n");
    cr_expect(mg->run.gpus == 2 && mg->run.tp == 2 && mg->o.bf16 && mg->run.batch == 4);
    memsim_megatron_free(mg);
    /* an exported variable reaches the launch, an unexported one does not */
    mg = parse_ok("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\npython pretrain_gpt.py " BASE);
    cr_expect_null(memsim_megatron_alloc_conf(mg));
    memsim_megatron_free(mg);
}

/* ---- contradictions and what is not modelled ---- */

#define W(...) ((const char *const[]){__VA_ARGS__, NULL})

Test(megatron, contradictions_name_the_flags)
{
    parse_refused("torchrun --nproc-per-node 6 pretrain_gpt.py " BASE
                  "--tensor-model-parallel-size 3",
                  W("--num-attention-heads", "--tensor-model-parallel-size"));
    parse_refused("torchrun --nproc-per-node 8 pretrain_gpt.py " BASE
                  "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 3",
                  W("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                    "--context-parallel-size", "8 GPUs"));
    parse_refused("torchrun --nproc-per-node 8 pretrain_gpt.py " BASE "--global-batch-size 36",
                  W("--global-batch-size", "--micro-batch-size"));
    parse_refused("pretrain_gpt.py " BASE "--fp16 --bf16", W("--fp16", "--bf16"));
    parse_refused("torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 12 --hidden-size 512 "
                  "--num-attention-heads 8 --seq-length 1022 --max-position-embeddings 1024 "
                  "--micro-batch-size 4 --tensor-model-parallel-size 4 --sequence-parallel",
                  W("--sequence-parallel", "--seq-length", "--tensor-model-parallel-size"));
    parse_refused("torchrun --nproc-per-node 4 pretrain_gpt.py --num-layers 12 --hidden-size 512 "
                  "--num-attention-heads 8 --seq-length 1028 --max-position-embeddings 1028 "
                  "--micro-batch-size 4 --context-parallel-size 4",
                  W("--seq-length", "--context-parallel-size"));
    parse_refused("torchrun --nproc-per-node 5 pretrain_gpt.py " BASE
                  "--pipeline-model-parallel-size 5",
                  W("--num-layers", "--pipeline-model-parallel-size"));
    parse_refused("torchrun --nproc-per-node 4 pretrain_gpt.py " BASE
                  "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 2 "
                  "--decoder-last-pipeline-num-layers 3",
                  W("--num-layers", "--decoder-first/last-pipeline-num-layers"));
    parse_refused("torchrun --nproc-per-node 4 pretrain_gpt.py " BASE
                  "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2",
                  W("--num-layers-per-virtual-pipeline-stage"));
    parse_refused("pretrain_gpt.py --num-layers 12 --hidden-size 500 --num-attention-heads 8 "
                  "--seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 4",
                  W("--hidden-size", "--num-attention-heads", "--kv-channels"));
    parse_refused("torchrun --nproc-per-node 4 pretrain_gpt.py " BASE
                  "--group-query-attention --num-query-groups 3 --tensor-model-parallel-size 4",
                  W("--num-query-groups"));
    parse_refused("pretrain_gpt.py " BASE "--recompute-granularity full",
                  W("--recompute-granularity", "--recompute-method"));
    parse_refused("pretrain_gpt.py " BASE "--overlap-param-gather --overlap-grad-reduce",
                  W("--overlap-param-gather", "--use-distributed-optimizer"));
    parse_refused("pretrain_gpt.py " BASE "--seq-length 2048",
                  W("--max-position-embeddings", "--seq-length"));
    parse_refused("pretrain_gpt.py --hidden-size 512 --num-attention-heads 8 --seq-length 1024 "
                  "--max-position-embeddings 1024 --micro-batch-size 4",
                  W("--num-layers"));
    parse_refused("pretrain_gpt.py " BASE "--bf16 true", W("'true'", "--bf16"));
    parse_refused("pretrain_gpt.py " BASE "--batch-size 8", W("--batch-size", "--micro-batch-size"));
}

Test(megatron, unmodelled_features_are_refused)
{
    parse_refused("pretrain_gpt.py " BASE "--fp8-format hybrid --fp8-recipe tensorwise",
                  W("not modelled", "fp8", "--fp8-format", "--fp8-recipe"));
    parse_refused("pretrain_gpt.py " BASE "--num-experts 8 --moe-router-topk 2",
                  W("not modelled", "--num-experts", "--moe-router-topk"));
    parse_refused("pretrain_gpt.py " BASE "--multi-latent-attention --kv-lora-rank 64",
                  W("not modelled", "--multi-latent-attention", "--kv-lora-rank"));
    parse_refused("pretrain_gpt.py " BASE "--optimizer sgd", W("not modelled", "--optimizer sgd"));
    parse_refused("pretrain_gpt.py " BASE "--tokenizer-type HuggingFaceTokenizer "
                  "--tokenizer-model meta-llama/Llama-3.1-8B",
                  W("--vocab-size", "HuggingFaceTokenizer"));
    /* a harmless value of such a flag is accepted */
    MemsimMegatron *mg = parse_ok("pretrain_gpt.py " BASE "--num-experts 0 --cp-comm-type p2p "
                                  "--empty-unused-memory-level 0");
    memsim_megatron_free(mg);
    /* the vocabulary of a tokenizer memsim cannot read comes from --vocab-size */
    mg = parse_ok("pretrain_gpt.py " BASE "--tokenizer-type HuggingFaceTokenizer "
                  "--tokenizer-model x --vocab-size 128256");
    cr_expect_eq(memsim_megatron_model(mg)->V, 128256);
    memsim_megatron_free(mg);
    mg = parse_ok("pretrain_gpt.py " BASE "--tokenizer-type NullTokenizer --vocab-size 1000");
    cr_expect_eq(mg_padded_vocab(&mg->o, 1), 1024);
    memsim_megatron_free(mg);
}

/* Through the command: exit 2 and a message naming the flags, for the launch's own
 * contradictions and for memsim flags the launch already sets. */
Test(megatron, command_refusals)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *heads = g_build_filename(dir, "heads.sh", NULL);
    g_autofree char *bare = g_build_filename(dir, "bare.txt", NULL);
    cr_assert(g_file_set_contents(heads, "torchrun --nproc-per-node 6 pretrain_gpt.py " BASE
                                         "--tensor-model-parallel-size 3\n",
                                  -1, NULL));
    cr_assert(g_file_set_contents(bare, "python pretrain_gpt.py " BASE
                                        "--tensor-model-parallel-size 2\n",
                                  -1, NULL));
    g_autofree char *run = fixture("run.txt");
    g_autofree char *yaml = fixture("run.yaml");
    struct {
        const char *argv[10];
        const char *words[3];
    } cases[] = {
        {{"estimate", "--megatron-args", heads}, {"--num-attention-heads",
                                                  "--tensor-model-parallel-size"}},
        {{"estimate", "--megatron-args", bare}, {"--tensor-model-parallel-size", "--gpus"}},
        {{"estimate", "--megatron-args", run, "--tp", "2"}, {"--tp", "--megatron-args"}},
        {{"estimate", "--megatron-args", run, "--batch", "4"}, {"--batch", "--megatron-args"}},
        {{"estimate", "--megatron-args", run, "--precision", "fp32"}, {"--precision"}},
        {{"estimate", "--megatron-args", run, "--gpus", "4"}, {"--gpus", "--megatron-args"}},
        {{"estimate", "--megatron-args", run, "--model", "gpt2"}, {"--model", "--megatron-args"}},
        {{"estimate", "--megatron-args", yaml, "--gpus", "3"}, {"3 GPUs", "--gpus 3",
                                                                "--tensor-model-parallel-size"}},
        {{"estimate", "--megatron-args", yaml, "--gpus", "12"}, {"--global-batch-size",
                                                                 "--micro-batch-size"}},
        {{"estimate", "--megatron-args", "/nonexistent/run.sh"}, {"/nonexistent/run.sh"}},
        {{"plan", "--megatron-args", run, "--global-batch", "64"}, {"--global-batch",
                                                                    "--megatron-args"}},
        {{"plan", "--megatron-args", run, "--methods", "zero3"}, {"methods"}},
    };
    for (gsize i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *err = NULL;
        int rc = tu_run_memsim(cases[i].argv, NULL, &err);
        cr_expect_eq(rc, 2, "case %zu (%s %s): exit %d: %s", i, cases[i].argv[0],
                     cases[i].argv[3] ? cases[i].argv[3] : "", rc, err);
        for (gsize k = 0; k < 3 && cases[i].words[k]; k++)
            cr_expect(err && strstr(err, cases[i].words[k]), "case %zu: '%s' not named: %s", i,
                      cases[i].words[k], err);
    }
    /* warnings: on stderr, "memsim: warning: " a line each (a run refused later, to be quick) */
    g_autofree char *warn = g_build_filename(dir, "warn.txt", NULL);
    cr_assert(g_file_set_contents(warn, "python pretrain_gpt.py " BASE
                                        "--tensor-model-parallel-size 2 --frobnicate\n",
                                  -1, NULL));
    const char *argv[] = {"estimate", "--megatron-args", warn, NULL};
    g_autofree char *err = NULL;
    cr_expect_eq(tu_run_memsim(argv, NULL, &err), 2);
    cr_expect(err && strstr(err, "memsim: warning: ") && strstr(err, "--frobnicate"), "%s", err);
}

/* Hostile launches end quickly and small, exit 2 naming the file: deep nesting, expansions
 * that double, a text too large, malformed YAML. */
Test(megatron, hostile_launches_are_refused_quickly, .timeout = 120)
{
    g_autofree char *dir = tu_tmpdir();
    GString *deep_arith = g_string_new("A=$((");
    GString *deep_default = g_string_new("A=");
    GString *doubling = g_string_new("A=x\n");
    GString *arrays = g_string_new("A=(x)\n");
    for (int i = 0; i < 100000; i++)
        g_string_append_c(deep_arith, '(');
    g_string_append(deep_arith, "1");
    for (int i = 0; i < 100000; i++)
        g_string_append_c(deep_arith, ')');
    g_string_append(deep_arith, "))\npython pretrain_gpt.py --num-layers $A\n");
    for (int i = 0; i < 20000; i++)
        g_string_append(deep_default, "${A:-");
    for (int i = 0; i < 20000; i++)
        g_string_append_c(deep_default, '}');
    for (int i = 0; i < 64; i++) {
        g_string_append(doubling, "A=$A$A\n");
        g_string_append(arrays, "A+=(${A[@]})\n");
    }
    GString *big = g_string_new(NULL);
    while (big->len < (2 << 20))
        g_string_append(big, "--lr 1 ");
    const char *texts[] = {deep_arith->str, deep_default->str, doubling->str, arrays->str, big->str,
                           "torchrun \"--nproc-per-node 8 pretrain_gpt.py --num-layers 2",
                           "MODEL_ARGS: [--num-layers, 2\n", "ENV_VARS: 3\nMODEL_ARGS: {}\n",
                           "MODEL_ARGS:\n  <<: *nowhere\n"};
    for (gsize i = 0; i < G_N_ELEMENTS(texts); i++) {
        g_autofree char *name = g_strdup_printf("hostile%zu.sh", i);
        g_autofree char *path = g_build_filename(dir, name, NULL);
        cr_assert(g_file_set_contents(path, texts[i], -1, NULL));
        const char *argv[] = {"estimate", "--megatron-args", path, NULL};
        g_autofree char *err = NULL;
        gint64 t0 = g_get_monotonic_time();
        int rc = tu_run_memsim(argv, NULL, &err);
        double secs = (double)(g_get_monotonic_time() - t0) / 1e6;
        cr_expect_eq(rc, 2, "%s: exit %d: %.300s", name, rc, err);
        cr_expect(err && strstr(err, name), "%s: %.300s", name, err);
        cr_expect(secs < tu_limit_s(), "%s: %.2f s", name, secs);
    }
    cr_expect(tu_children_peak_mib() < tu_limit_mib(), "%.0f MiB", tu_children_peak_mib());
    g_string_free(deep_arith, TRUE);
    g_string_free(deep_default, TRUE);
    g_string_free(doubling, TRUE);
    g_string_free(arrays, TRUE);
    g_string_free(big, TRUE);
}

/* ---- the parameter count: Megatron's own formula ---- */

/* megatron/training/theoretical_memory_usage.py:12-185 (compute_weight_and_optimizer_memory),
 * dense models: without biases and learned positions, which it leaves out. */
static double megatron_params(double L, double h, double heads, double groups, double kv,
                              double ffn, bool swiglu, bool rms, double vocab_padded, bool untie)
{
    double qp = kv * heads, ratio = qp / h;
    double attn = 2 * h * h * ((1 + groups / heads) * ratio);
    double glu = swiglu ? 1.5 : 1.0;
    double mlp = 2 * h * ffn * glu;
    double norm = rms ? 1 : 2;
    double layer = attn + mlp + 2 * h * norm;
    double block = layer * L + norm * h;
    double emb = h * vocab_padded * (untie ? 2 : 1);
    return block + emb;
}

Test(megatron, parameter_count_is_megatrons)
{
    /* a GPT: biases and a learned position table, which the formula leaves out */
    MemsimMegatron *mg = parse_ok("pretrain_gpt.py " BASE);
    double f = megatron_params(12, 512, 8, 8, 64, 2048, false, false, 50304, false);
    double biases = 12 * (3 * 512 + 512 + 2048 + 512), pos = 1024 * 512;
    cr_expect_eq(memsim_model_n_params(memsim_megatron_model(mg)), (int64_t)(f + biases + pos));
    memsim_megatron_free(mg);
    /* a Llama-like model: GQA, SwiGLU, RMSNorm, rope, untied, no biases */
    mg = parse_ok("pretrain_gpt.py --num-layers 32 --hidden-size 3072 --ffn-hidden-size 8192 "
                  "--num-attention-heads 32 --group-query-attention --num-query-groups 8 "
                  "--kv-channels 128 --swiglu --normalization RMSNorm --position-embedding-type "
                  "rope --untie-embeddings-and-output-weights --disable-bias-linear "
                  "--seq-length 512 --max-position-embeddings 4096 --micro-batch-size 2");
    f = megatron_params(32, 3072, 32, 8, 128, 8192, true, true, 50304, true);
    cr_expect_eq(memsim_model_n_params(memsim_megatron_model(mg)), (int64_t)f);
    memsim_megatron_free(mg);
}

/* ---- the planner around a launch ---- */

/* With too little memory for any layout, every candidate is ruled out by the model-state bound
 * before any simulation: the misses show what was swept, Megatron's layouts only. */
Test(megatron, plan_sweeps_megatron_layouts_around_the_launch)
{
    g_autofree char *yaml = fixture("run.yaml");
    const char *argv[] = {"plan", "--megatron-args", yaml, "--gpu-mem", "1GiB", "--misses", "50",
                          "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    JsonNode *root = json_of(out);
    JsonObject *o = json_node_get_object(root);
    cr_expect_eq(json_object_get_int_member(o, "global_batch"), 32);
    JsonArray *misses = json_object_get_array_member(o, "misses");
    cr_assert_gt(json_array_get_length(misses), 0, "%s", out);
    for (guint i = 0; i < json_array_get_length(misses); i++) {
        JsonObject *m = json_array_get_object_element(misses, i);
        const char *label = json_object_get_string_member(m, "label");
        const char *command = json_object_get_string_member(m, "command");
        const char *recipe = json_object_get_string_member(m, "recipe");
        cr_expect(g_str_has_prefix(label, "megatron"), "%s", label);
        cr_expect(strstr(command, "--megatron-args") && strstr(command, "run.yaml"), "%s",
                  command);
        cr_expect(strstr(recipe, "run.yaml") && strstr(recipe, "--tensor-model-parallel-size"),
                  "%s", recipe);
        /* the launch's recomputation, its global batch */
        cr_expect_str_eq(json_object_get_string_member(m, "checkpointing"), "selective");
        cr_expect_eq(json_object_get_int_member(m, "global_batch"), 32);
        /* 4 query groups: TP up to 4 */
        cr_expect_leq(json_object_get_int_member(m, "tp"), 4);
    }
    json_node_unref(root);
}

/* Context parallelism is the launch's in every layout: tp × pp × cp × dp = the GPUs. */
Test(megatron, plan_keeps_context_parallelism)
{
    g_autofree char *dir = tu_tmpdir();
    g_autofree char *path = g_build_filename(dir, "cp2.sh", NULL);
    cr_assert(g_file_set_contents(path, "torchrun --nproc-per-node 8 pretrain_gpt.py " BASE
                                        "--global-batch-size 32 --context-parallel-size 2 --bf16\n",
                                  -1, NULL));
    const char *argv[] = {"plan", "--megatron-args", path, "--gpu-mem", "1GiB", "--misses", "50",
                          "--json", NULL};
    g_autofree char *out = NULL, *err = NULL;
    int rc = tu_run_memsim(argv, &out, &err);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    JsonNode *root = json_of(out);
    JsonArray *misses = json_object_get_array_member(json_node_get_object(root), "misses");
    cr_assert_gt(json_array_get_length(misses), 0, "%s", out);
    for (guint i = 0; i < json_array_get_length(misses); i++) {
        JsonObject *m = json_array_get_object_element(misses, i);
        const char *label = json_object_get_string_member(m, "label");
        cr_expect(strstr(label, " cp2 "), "%s", label);
        cr_expect_eq(json_object_get_int_member(m, "tp") * json_object_get_int_member(m, "pp") *
                         2 * json_object_get_int_member(m, "dp"),
                     8, "%s", label);
    }
    json_node_unref(root);
}

/* ---- the golden development set (../shared/data/megatron-golden/cases.jsonl) ---- */

static const char *str_of(JsonObject *o, const char *k)
{
    JsonNode *n = json_object_get_member(o, k);
    return n && JSON_NODE_HOLDS_VALUE(n) ? json_node_get_string(n) : NULL;
}

static bool null_of(JsonObject *o, const char *k)
{
    JsonNode *n = json_object_get_member(o, k);
    return !n || JSON_NODE_HOLDS_NULL(n);
}

/* The command line of a case: its environment as prefixes, torchrun on its node shape, its
 * flags (a value `true` is the flag alone). */
static char *case_command(JsonObject *c)
{
    GString *s = g_string_new(NULL);
    JsonObject *env = json_object_get_object_member(c, "env");
    GList *keys = json_object_get_members(env);
    for (GList *k = keys; k; k = k->next) {
        g_autofree char *v = g_shell_quote(json_object_get_string_member(env, k->data));
        g_string_append_printf(s, "%s=%s ", (char *)k->data, v);
    }
    g_list_free(keys);
    g_string_append_printf(s, "torchrun --nproc-per-node %" G_GINT64_FORMAT
                              " --nnodes %" G_GINT64_FORMAT " pretrain_gpt.py",
                           json_object_get_int_member(c, "gpus_per_node"),
                           json_object_get_int_member(c, "nodes"));
    JsonObject *args = json_object_get_object_member(c, "model_args");
    keys = json_object_get_members(args);
    for (GList *k = keys; k; k = k->next) {
        JsonNode *v = json_object_get_member(args, k->data);
        g_string_append_printf(s, " %s", (char *)k->data);
        if (json_node_get_value_type(v) == G_TYPE_BOOLEAN)
            continue;
        g_autofree char *q = g_shell_quote(json_node_get_string(v));
        g_string_append_printf(s, " %s", q);
    }
    g_list_free(keys);
    return g_string_free(s, FALSE);
}

static void check_case(JsonObject *c)
{
    const char *name = json_object_get_string_member(c, "name");
    JsonObject *d = json_object_get_object_member(c, "derived");
    g_autofree char *cmd = case_command(c);
    GError *e = NULL;
    MemsimMegatron *mg = memsim_megatron_parse(cmd, name, &e);
    bool fp8 = !null_of(d, "fp8");
    bool mla = json_object_get_boolean_member(d, "multi_latent_attention");
    if (fp8 || mla) {
        cr_expect(!mg, "%s: accepted, but it uses %s", name, fp8 ? "fp8" : "MLA");
        cr_expect(e && strstr(e->message, "not modelled") &&
                      strstr(e->message, fp8 ? "--fp8-format" : "--multi-latent-attention"),
                  "%s: %s", name, e ? e->message : "");
        g_clear_error(&e);
        memsim_megatron_free(mg);
        return;
    }
    cr_assert(mg, "%s: %s", name, e ? e->message : "?");
    for (const char *const *w = memsim_megatron_warnings(mg); *w; w++)
        cr_expect(!strstr(*w, "not known"), "%s: %s", name, *w);
    MemsimRun r = memsim_run_defaults();
    memsim_megatron_apply(mg, &r);
    const MemsimModel *m = memsim_megatron_model(mg);
    const MgOptions *o = &mg->o;
#define EQ(field, value)                                                                          \
    cr_expect_eq((int64_t)(value), json_object_get_int_member(d, field), "%s: %s: %" G_GINT64_FORMAT, \
                 name, field, (int64_t)(value))
#define IS(field, value)                                                                          \
    cr_expect_eq((bool)(value), json_object_get_boolean_member(d, field), "%s: %s", name, field)
    EQ("world_size", r.gpus);
    EQ("tp", r.tp);
    EQ("pp", r.pp);
    EQ("cp", o->cp);
    EQ("dp", r.dp);
    EQ("micro_batch_size", r.batch);
    EQ("global_batch_size", r.batch * r.dp * r.microbatches);
    EQ("num_microbatches_per_step", r.microbatches);
    EQ("seq_length", r.seq);
    EQ("num_layers", m->L);
    EQ("hidden_size", m->H);
    EQ("num_attention_heads", m->nh);
    EQ("ffn_hidden_size", m->I);
    EQ("kv_channels", m->hd);
    EQ("padded_vocab_size", mg_padded_vocab(o, r.tp));
    if (null_of(d, "num_query_groups"))
        cr_expect_eq(m->nkv, m->nh, "%s: no GQA", name);
    else
        EQ("num_query_groups", m->nkv);
    EQ("num_distributed_optimizer_instances", o->optimizer_instances);
    IS("distributed_optimizer", o->distributed_optimizer);
    IS("overlap_grad_reduce", o->overlap_grad_reduce);
    IS("overlap_param_gather", o->overlap_param_gather);
    IS("sequence_parallel_effective", r.sequence_parallel);
    IS("grads_accumulated_in_fp32", o->grads_fp32);
    IS("tied_embedding_output", m->tie);
    IS("add_bias_linear", m->mlp_bias);
    IS("gated_linear_unit_swiglu", o->swiglu);
    IS("qk_layernorm", o->qk_norm);
    IS("cross_entropy_loss_fusion", o->ce_fusion);
    IS("create_attention_mask_in_dataloader", o->attention_mask);
    IS("gradient_accumulation_fusion", o->grad_accum_fusion);
    cr_expect(null_of(d, "recompute") == (o->recompute == MG_RECOMPUTE_NONE), "%s: recompute",
              name);
    cr_expect_eq(m->resid_pdrop, json_object_get_double_member(d, "hidden_dropout"), "%s", name);
    cr_expect_eq(m->attn_pdrop, json_object_get_double_member(d, "attention_dropout"), "%s",
                 name);
    cr_expect(strstr(str_of(d, "tokenizer"), o->tokenizer) && o->vocab == 50257, "%s", name);
    const char *dt = str_of(d, "params_dtype");
    cr_expect_eq(r.precision,
                 !strcmp(dt, "bf16")   ? MEMSIM_PREC_BF16_MIXED
                 : !strcmp(dt, "fp16") ? MEMSIM_PREC_FP16_MIXED
                                       : MEMSIM_PREC_FP32,
                 "%s: params %s", name, dt);
    cr_expect_eq(o->impl == MG_IMPL_LOCAL, !strcmp(str_of(d, "transformer_impl"), "local"), "%s",
                 name);
    const char *be = str_of(d, "attention_backend");
    static const char *const attn[] = {"auto", "flash", "fused", "unfused", "local"};
    cr_expect(g_str_has_prefix(be, attn[o->attention]), "%s: attention %s, read %s", name, be,
              attn[o->attention]);
    const char *pos = str_of(d, "position_embedding_type");
    cr_expect_eq(o->pos, !strcmp(pos, "rope") ? MG_POS_ROPE : MG_POS_LEARNED, "%s", name);
    cr_expect_eq(o->rms_norm, !strcmp(str_of(d, "normalization"), "RMSNorm"), "%s", name);
    /* virtual pipeline stages: L / pp / --num-layers-per-virtual-pipeline-stage, or
     * --num-virtual-stages-per-pipeline-rank */
    if (null_of(d, "virtual_pipeline")) {
        cr_expect_eq(r.virtual_stages, 1, "%s", name);
    } else {
        JsonObject *v = json_object_get_object_member(d, "virtual_pipeline");
        int64_t want = json_object_has_member(v, "num_virtual_stages_per_pipeline_rank")
                           ? json_object_get_int_member(v, "num_virtual_stages_per_pipeline_rank")
                           : m->L / r.pp /
                                 json_object_get_int_member(v, "num_layers_per_virtual_pipeline_stage");
        cr_expect(r.virtual_stages == want && r.pp_schedule == MEMSIM_PP_INTERLEAVED,
                  "%s: virtual stages %d, want %" G_GINT64_FORMAT, name, r.virtual_stages, want);
    }
    GError *ce = NULL;
    cr_expect(memsim_run_check(&r, &ce), "%s: %s", name, ce ? ce->message : "");
    g_clear_error(&ce);
#undef EQ
#undef IS
    memsim_run_clear(&r);
    memsim_megatron_free(mg);
}

Test(megatron, golden_set_maps_to_its_derived_fields)
{
    g_autofree char *path = tu_shared_path_or_skip("megatron-golden/cases.jsonl");
    if (!g_file_test(path, G_FILE_TEST_EXISTS))
        cr_skip_test("%s absent: the golden development set is not checked", path);
    g_autofree char *text = NULL;
    cr_assert(g_file_get_contents(path, &text, NULL, NULL), "%s", path);
    g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
    int n = 0, refused = 0;
    for (char **l = lines; *l; l++) {
        if (!**l)
            continue;
        JsonNode *root = json_of(*l);
        JsonObject *c = json_node_get_object(root);
        JsonObject *d = json_object_get_object_member(c, "derived");
        refused += !null_of(d, "fp8") || json_object_get_boolean_member(d, "multi_latent_attention");
        check_case(c);
        json_node_unref(root);
        n++;
    }
    cr_expect_eq(n, 33, "cases");
    cr_expect_eq(refused, 3, "fp8 and MLA cases");
}
