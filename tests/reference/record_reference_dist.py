"""Records reference traces of real multi-process PyTorch training (DistributedDataParallel,
and ZeroRedundancyOptimizer under DDP) on the CPU with the gloo backend, one trace per rank.

Usage:  /usr/bin/python3 tests/reference/record_reference_dist.py OUTDIR [--case NAME ...] [--list]

What: for each case below (a model family of hf_models.py, a world size, a method) it spawns
WORLD processes (torch.multiprocessing.spawn; gloo over the loopback, a FileStore
rendezvous in OUTDIR), each of which runs two training steps in fp32 and records its own
allocations with tools/python/memsim_record.py, and writes to OUTDIR:
  NAME.rankR.txt  rank R's trace in memsim's text form;
  NAME.json       the case: the HF config.json contents, batch, seq, steps, world size,
                  method, the run description, and per rank the peaks measured from its
                  recorded allocation stream itself (overall, per step, per phase).

How: every rank builds the same model (same seed), then the optimizer over its parameters:
    ddp             torch.optim.AdamW(foreach=False)
    zero-redundancy torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class=AdamW,
                    foreach=False): this rank's optimizer holds the whole parameters the
                    greedy partition gave it (_partition_parameters), the others are
                    broadcast from their owners after each step (_sync_params)
and starts recording before it wraps the model in DistributedDataParallel (gloo, CPU,
defaults: bucket_cap_mb 25, gradient_as_bucket_view False, broadcast_buffers True), so the
reducer's buckets and DDP's construction broadcasts are in the trace. Each step is
    forward    loss = ddp(input_ids, labels=labels).loss
    backward   loss.backward()          (the reducer copies each gradient into its bucket,
                                         all-reduces full buckets, copies the averages back)
    optimizer  opt.step(); opt.zero_grad(set_to_none=True)
Each rank gets its own batch (seed 1 + rank). Dropout is off and attention is eager, as in
record_reference.py. Gloo's worker threads allocate outside c10's CPU allocator (gloo's own
buffers) and outside the profiler's thread; the reducer's tensors are allocated on the
training thread (construction, and the autograd hooks: CPU backward runs on the caller's
thread), so the trace holds every tensor the rank's training keeps.

The traces shipped in tests/data/reference-dist/ were made with this script (README there).
"""

import argparse
import gc
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "python"))

import hf_models  # noqa: E402
from memsim_record import Recorder  # noqa: E402
from record_reference import GPT2, LLAMA  # noqa: E402

STEPS = 2
METHODS = ("ddp", "zero-redundancy")


def _cases():
    """(name, config, batch, seq, world, method)."""
    out = []
    for family, config, world, (b, s) in (("llama_gqa", LLAMA, 2, (2, 64)),
                                          ("llama_gqa", LLAMA, 4, (2, 64)),
                                          ("gpt2", GPT2, 2, (2, 64))):
        for method in METHODS:
            out.append(("%s_%s_w%d_b%d_s%d" % (family, method.replace("-", "_"), world, b, s),
                        config, b, s, world, method))
    return out


CASES = _cases()


def _rank_main(rank, outdir, store_path, name, config, batch, seq, world, method, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                            world_size=world)
    gc.collect()
    torch.manual_seed(0)
    model = hf_models.build_model(config)
    model.train()
    params = list(model.parameters())
    if method == "ddp":
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=False)
        local = opt
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=1e-3,
                                      weight_decay=0.01, foreach=False)
        local = opt.optim  # this rank's optimizer: its parameters and their state
    g = torch.Generator().manual_seed(1 + rank)
    input_ids = torch.randint(0, config["vocab_size"], (batch, seq), generator=g)
    labels = input_ids.clone()

    rec = Recorder(model=model, optimizer=local, inputs=(input_ids, labels), ops="memory",
                   name="%s rank %d of %d (torch %s, cpu, gloo, fp32)"
                        % (name, rank, world, torch.__version__))
    # DDP's constructor broadcasts the module states from rank 0 through a flat temporary
    # (torch/distributed/utils.py _sync_module_states -> _broadcast_coalesced). That
    # temporary's last reference may be dropped on a gloo worker thread, whose frees the
    # profiler does not see (it records the threads it was enabled on), or later still: in
    # some runs it was missing from the trace. The broadcast is therefore run here, before
    # recording, and skipped inside the constructor; the models are identical (same seed),
    # so nothing else changes. Everything else DDP's constructor makes (the reducer and its
    # buckets) is recorded.
    ddp_mod = torch.nn.parallel.distributed
    ddp_mod._sync_module_states(module=model, process_group=dist.group.WORLD,
                                broadcast_bucket_size=250 * 1024 * 1024, src=0,
                                params_and_buffers_to_ignore=set())
    dist.barrier()
    rec.start()
    rec.mark("ddp init begin")
    sync, ddp_mod._sync_module_states = ddp_mod._sync_module_states, lambda **kw: None
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    finally:
        ddp_mod._sync_module_states = sync
    rec.mark("ddp init end")
    for step in range(1, STEPS + 1):
        with rec.step(step):
            with rec.phase("forward"):
                loss = ddp(input_ids, labels=labels).loss
            with rec.phase("backward"):
                loss.backward()
            with rec.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    del loss
    rec.save(os.path.join(outdir, "%s.rank%d.txt" % (name, rank)))
    s = rec.summary()
    owned = [p.numel() for grp in local.param_groups for p in grp["params"]]
    results[rank] = dict(rank=rank, trace="%s.rank%d.txt" % (name, rank),
                         optimizer_params=sum(owned), optimizer_param_numels=owned,
                         peak_live_bytes=s["peak_live_bytes"],
                         final_live_bytes=s["final_live_bytes"], steps=s["steps"],
                         by_category_at_peak=s["by_category_at_peak"], n_alloc=s["n_alloc"],
                         n_free=s["n_free"], warnings=s["warnings"])
    dist.barrier()
    dist.destroy_process_group()


def record_case(outdir, name, config, batch, seq, world, method):
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        with mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(_rank_main, nprocs=world, join=True,
                     args=(outdir, store, name, config, batch, seq, world, method, results))
            ranks = [dict(results[r]) for r in range(world)]
    torch.manual_seed(0)
    model = hf_models.build_model(config)
    case = {
        "case": name,
        "config": config,
        "batch": batch,
        "seq": seq,
        "steps": STEPS,
        "world": world,
        "method": method,
        "run": {
            "precision": "fp32",
            "optimizer": "adamw",
            "optimizer_impl": "for-loop",
            "lr": 1e-3,
            "weight_decay": 0.01,
            "zero_grad": "none",
            "attention": "eager",
            "checkpointing": "none",
            "finetune": "full",
            "backend": "gloo",
            "ddp": {"bucket_cap_mb": 25, "gradient_as_bucket_view": False,
                    "broadcast_buffers": True, "find_unused_parameters": False},
            "torch_version": torch.__version__,
            "device": "cpu",
            "loop": "loss = ddp(input_ids, labels=labels).loss; loss.backward(); "
                    "opt.step(); opt.zero_grad(set_to_none=True)",
        },
        "n_params": sum(p.numel() for p in model.parameters()),
        "ranks": ranks,
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
    if not dist.is_gloo_available():
        print("torch.distributed has no gloo backend here", file=sys.stderr)
        return 2
    os.makedirs(args.outdir, exist_ok=True)
    wanted = set(args.case or [])
    unknown = wanted - {c[0] for c in CASES}
    if unknown:
        p.error("unknown case(s): %s" % ", ".join(sorted(unknown)))
    t_all = time.time()
    print("%-36s %5s %12s %12s %6s" % ("case", "rank", "step1 peak", "step2 peak", "sec"))
    status = 0
    for name, config, batch, seq, world, method in CASES:
        if wanted and name not in wanted:
            continue
        t0 = time.time()
        case = record_case(args.outdir, name, config, batch, seq, world, method)
        for r in case["ranks"]:
            print("%-36s %5d %12d %12d %6.2f" % (name, r["rank"], r["steps"]["1"]["peak"],
                                                  r["steps"]["2"]["peak"], time.time() - t0))
            for w in r["warnings"]:
                print("  warning: rank %d: %s" % (r["rank"], w), file=sys.stderr)
                status = 1
    print("recorded in %.1f s" % (time.time() - t_all))
    return status


if __name__ == "__main__":
    sys.exit(main())
