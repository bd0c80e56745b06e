#!/usr/bin/env python3
"""Records training steps of the small Qwen2, Gemma-2, Phi-3, OLMo and DeepSeek-V2-style models of
hf_families.py with tools/python/memsim_record.py, as record_reference.py records the older
families (same loop, optimizer, recorder and case files); tests/test_reference_families.c
compares memsim's generated runs with them.

Usage: record_families.py OUTDIR [--case NAME ...] [--list]
"""

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hf_families  # noqa: E402
import record_reference  # noqa: E402

COMMON = {
    "vocab_size": 1000,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "torch_dtype": "float32",
}

QWEN2 = dict(COMMON, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
             intermediate_size=344, hidden_act="silu", tie_word_embeddings=False,
             use_sliding_window=False, sliding_window=None)

GEMMA2 = dict(COMMON, architectures=["Gemma2ForCausalLM"], model_type="gemma2",
              intermediate_size=256, head_dim=32, hidden_activation="gelu_pytorch_tanh",
              query_pre_attn_scalar=32, sliding_window=4096, final_logit_softcapping=30.0,
              attn_logit_softcapping=50.0, tie_word_embeddings=True, pad_token_id=0)

PHI3 = dict(COMMON, architectures=["Phi3ForCausalLM"], model_type="phi3",
            intermediate_size=256, hidden_act="silu", tie_word_embeddings=False,
            resid_pdrop=0.0, embd_pdrop=0.0)

OLMO = dict(COMMON, architectures=["OlmoForCausalLM"], model_type="olmo",
            intermediate_size=344, hidden_act="silu", tie_word_embeddings=False,
            clip_qkv=8.0)

DEEPSEEK = dict(COMMON, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                num_key_value_heads=4, intermediate_size=256, moe_intermediate_size=64,
                n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                first_k_dense_replace=1, moe_layer_freq=1, norm_topk_prob=False,
                q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
                v_head_dim=32, hidden_act="silu", tie_word_embeddings=False,
                attention_bias=False)

MIXTRAL = dict(COMMON, architectures=["MixtralForCausalLM"], model_type="mixtral",
               intermediate_size=256, num_local_experts=4, num_experts_per_tok=2,
               hidden_act="silu", tie_word_embeddings=False)

# experts that dominate the peak: under --moe-imbalance 3 the most-loaded expert's backward
# buffers raise it by some 3.6% (memsim's figure), which the recording must show too
MIXTRAL_WIDE = dict(MIXTRAL, vocab_size=256, intermediate_size=2048, num_experts_per_tok=1)

CASES = []
for family, config in (("qwen2", QWEN2), ("gemma2", GEMMA2), ("phi3", PHI3),
                       ("olmo", OLMO), ("deepseek_v2", DEEPSEEK)):
    for b, s in ((2, 64), (4, 128)):
        CASES.append(("%s_b%d_s%d" % (family, b, s), config, b, s, False, None))
# Mixtral's experts one by one, uniform and under --moe-imbalance 2 and 3 (the case name's
# "imbN" is the factor the test sets)
BUILD = {}
for name, config, f, b, s in (("mixtral_b2_s64", MIXTRAL, 1.0, 2, 64),
                              ("mixtral_imb2_b4_s128", MIXTRAL, 2.0, 4, 128),
                              ("mixtral_wide_b8_s128", MIXTRAL_WIDE, 1.0, 8, 128),
                              ("mixtral_wide_imb3_b8_s128", MIXTRAL_WIDE, 3.0, 8, 128)):
    CASES.append((name, config, b, s, False, None))
    BUILD[name] = (lambda f: lambda c: hf_families.MixtralForCausalLM(c, imbalance=f))(f)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", nargs="?")
    p.add_argument("--case", action="append")
    p.add_argument("--list", action="store_true")
    args = p.parse_args(argv)
    if args.list:
        for c in CASES:
            print(c[0])
        return 0
    if not args.outdir:
        p.error("OUTDIR is required")
    torch.set_num_threads(1)
    os.makedirs(args.outdir, exist_ok=True)
    status = 0
    for name, config, batch, seq, ckpt, lora in CASES:
        if args.case and name not in args.case:
            continue
        t0 = time.time()
        case = record_reference.record_case(args.outdir, name, config, batch, seq, ckpt, lora,
                                            build=BUILD.get(name, hf_families.build_model))
        steps = case["measured"]["steps"]
        print("%-24s %12d %12d %10d %6.2f" % (name, steps["1"]["peak"], steps["2"]["peak"],
                                             case["n_params"], time.time() - t0))
        for w in case["measured"]["warnings"]:
            print("  warning: " + w, file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
