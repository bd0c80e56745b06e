"""Records reference traces of real PyTorch training steps for memsim's generator tests.

Usage:  /usr/bin/python3 tests/reference/record_reference.py OUTDIR [--case NAME ...] [--list]

What: for each case below (a model family in the style of Hugging Face, from hf_models.py, at
a batch and sequence size, optionally with activation checkpointing or LoRA) it runs two
training steps on CPU in fp32 and writes to OUTDIR:
  NAME.txt   the trace in memsim's text form, recorded with tools/python/memsim_record.py;
  NAME.json  the case: the HF config.json contents (what the generator reads), batch, seq,
             steps, the run description (optimizer, attention, checkpointing, finetuning) and
             the peaks measured from the recorded allocation stream itself, independently of
             memsim: peak live bytes (sum of requested sizes) overall, per step and per
             phase, with live bytes at each boundary.
and prints a table of the peaks.

How: each step is what a Trainer-like loop does:
    forward    loss = model(input_ids, labels=labels).loss   (the output object is dropped
               at once, so logits and the cache die at the end of the forward; the loss is
               ForCausalLMLoss inside the model)
    backward   loss.backward()
    optimizer  opt.step(); opt.zero_grad(set_to_none=True)   (AdamW, foreach=False: the
               for-loop implementation; lr 1e-3, weight decay 0.01)
The same batch is used for both steps; it exists before recording (category "input"). Step 1
creates the gradients and the optimizer state; step 2 starts with the state in place, so
the two steps have different peaks. Dropout probabilities are set to 0 (CPU dropout keeps a
float noise tensor where CUDA keeps a bool mask, which the generator does not model), and the
attention implementation is HF's eager one (torch 1.13 has no public SDPA).

Everything is deterministic: fixed seeds, one thread. All cases together take a few
seconds to record; the models are tiny (hidden 64-128, 2 layers, vocab <= 1000).
"""

import argparse
import gc
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "python"))

import hf_models  # noqa: E402
from memsim_record import Recorder  # noqa: E402

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "torch_dtype": "float32",
}

GPT2 = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "vocab_size": 1000,
    "n_embd": 128,
    "n_head": 4,
    "n_layer": 2,
    "n_positions": 512,
    "n_inner": None,
    "activation_function": "gelu_new",
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "initializer_range": 0.02,
    "tie_word_embeddings": True,
    "use_cache": True,
    "torch_dtype": "float32",
}

OPT = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "vocab_size": 1000,
    "hidden_size": 96,
    "ffn_dim": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
    "word_embed_proj_dim": 96,
    "do_layer_norm_before": True,
    "activation_function": "relu",
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "layerdrop": 0.0,
    "enable_bias": True,
    "init_std": 0.02,
    "pad_token_id": 1,
    "tie_word_embeddings": True,
    "use_cache": True,
    "torch_dtype": "float32",
}

NEOX = {
    "architectures": ["GPTNeoXForCausalLM"],
    "model_type": "gpt_neox",
    "vocab_size": 1000,
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_act": "gelu",
    "rotary_pct": 0.25,
    "rotary_emb_base": 10000,
    "max_position_embeddings": 512,
    "layer_norm_eps": 1e-5,
    "use_parallel_residual": True,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "use_cache": True,
    "torch_dtype": "float32",
}

LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _cases():
    """(name, config, batch, seq, checkpointing, lora)."""
    out = []
    for family, config, sizes in (
            ("llama_gqa", LLAMA, ((1, 64), (2, 96), (4, 128))),
            ("gpt2", GPT2, ((1, 64), (2, 96), (4, 128))),
            ("opt", OPT, ((1, 48), (2, 96), (3, 128))),
            ("gpt_neox", NEOX, ((1, 64), (2, 96), (4, 128)))):
        for b, s in sizes:
            out.append(("%s_b%d_s%d" % (family, b, s), config, b, s, False, None))
    out.append(("llama_gqa_ckpt_b2_s64", LLAMA, 2, 64, True, None))
    out.append(("llama_gqa_ckpt_b4_s128", LLAMA, 4, 128, True, None))
    out.append(("llama_gqa_sacop_b2_s64", LLAMA, 2, 64, "sac-op", None))
    out.append(("llama_gqa_sacop_b4_s128", LLAMA, 4, 128, "sac-op", None))
    out.append(("gpt2_sacop_b2_s96", GPT2, 2, 96, "sac-op", None))
    out.append(("llama_gqa_hf445_b2_s64", LLAMA, 2, 64, False, None))
    out.append(("llama_gqa_lora_b2_s64", LLAMA, 2, 64, False, LORA))
    out.append(("llama_gqa_lora_b4_s128", LLAMA, 4, 128, False, LORA))
    return out


CASES = _cases()
STEPS = 2


def record_case(outdir, name, config, batch, seq, checkpointing, lora, build=None):
    """Records one case; `build(config)` makes its model instead of hf_models.build_model
    (the other families' recorder, record_families.py)."""
    # Garbage of the previous case must not be collected while this one records: its frees
    # would be reported (they would be dropped, but with a warning).
    gc.collect()
    torch.manual_seed(0)
    # a case named *_hf445_* runs Transformers 4.45's LlamaForCausalLM.forward
    hf_version = (4, 45) if "_hf445_" in name else None
    model = build(config) if build else hf_models.build_model(
        config, gradient_checkpointing=checkpointing, transformers_version=hf_version,
        lora=dict(lora, target_modules=tuple(lora["target_modules"])) if lora else None)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=False)
    input_ids = torch.randint(0, config["vocab_size"], (batch, seq))
    labels = input_ids.clone()

    rec = Recorder(model=model, optimizer=opt, inputs=(input_ids, labels),
                   name="%s (torch %s, cpu, fp32)" % (name, torch.__version__))
    for step in range(1, STEPS + 1):
        with rec.step(step):
            with rec.phase("forward"):
                loss = model(input_ids, labels=labels).loss
            with rec.phase("backward"):
                loss.backward()
            with rec.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    rec.save(os.path.join(outdir, name + ".txt"))
    summary = rec.summary()

    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    case = {
        "case": name,
        "trace": name + ".txt",
        "config": config,
        "batch": batch,
        "seq": seq,
        "steps": STEPS,
        "run": {
            "precision": "fp32",
            "optimizer": "adamw",
            "optimizer_impl": "for-loop",
            "lr": 1e-3,
            "weight_decay": 0.01,
            "zero_grad": "none",
            "attention": "eager",
            "checkpointing": (checkpointing if isinstance(checkpointing, str)
                              else "full" if checkpointing else "none"),
            "checkpoint_use_reentrant": False,
            "finetune": "lora" if lora else "full",
            "lora": lora,
            "grad_accum": 1,
            "torch_version": torch.__version__,
            "transformers_version": "%d.%d" % hf_version if hf_version else None,
            "device": "cpu",
            "loop": "loss = model(input_ids, labels=labels).loss; loss.backward(); "
                    "opt.step(); opt.zero_grad(set_to_none=True)",
        },
        "n_params": n_params,
        "n_trainable_params": sum(p.numel() for p in params),
        "measured": {
            "peak_live_bytes": summary["peak_live_bytes"],
            "final_live_bytes": summary["final_live_bytes"],
            "steps": summary["steps"],
            "by_category_at_peak": summary["by_category_at_peak"],
            "n_alloc": summary["n_alloc"],
            "n_free": summary["n_free"],
            "warnings": summary["warnings"],
        },
    }
    with open(os.path.join(outdir, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(case, f, indent=1, sort_keys=True)
        f.write("\n")
    return case


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", nargs="?")
    p.add_argument("--case", action="append", help="record only this case (repeatable)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    args = p.parse_args(argv)
    if args.list:
        for c in CASES:
            print(c[0])
        return 0
    if not args.outdir:
        p.error("OUTDIR is required")
    torch.set_num_threads(1)
    os.makedirs(args.outdir, exist_ok=True)
    wanted = set(args.case or [])
    unknown = wanted - {c[0] for c in CASES}
    if unknown:
        p.error("unknown case(s): %s" % ", ".join(sorted(unknown)))
    t_all = time.time()
    print("%-26s %12s %12s %12s %6s" % ("case", "step1 peak", "step2 peak", "params", "sec"))
    status = 0
    for name, config, batch, seq, ckpt, lora in CASES:
        if wanted and name not in wanted:
            continue
        t0 = time.time()
        case = record_case(args.outdir, name, config, batch, seq, ckpt, lora)
        steps = case["measured"]["steps"]
        print("%-26s %12d %12d %12d %6.2f" % (name, steps["1"]["peak"], steps["2"]["peak"],
                                               case["n_params"], time.time() - t0))
        for w in case["measured"]["warnings"]:
            print("  warning: " + w, file=sys.stderr)
            status = 1
    print("recorded in %.1f s" % (time.time() - t_all))
    return status


if __name__ == "__main__":
    sys.exit(main())
