#!/usr/bin/python3
"""Writes a synthetic PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot
writes) of a training run, from a fixed seed.

    /usr/bin/python3 tools/snapshot-gen.py OUT.pickle [--events N | --mb M] [--seed S]
                                          [--schema 2.0|2.1]

Default 895,000 trace entries; --mb M aims at a file of about M MB instead. The same
arguments give the same bytes. --schema says which PyTorch's recording the file is:
  2.0 (default): torch 2.0's _record_memory_history(True, trace_alloc_max_entries=N), whose
      trace entries hold action, addr, size and stream only (trace_alloc_record_context
      defaults to False, so they carry no frames; there is no time_us yet). About 37 bytes
      an entry: 895,000 entries make about 33 MB, --mb 350 about 9.8 million entries.
  2.1: torch 2.1 and later with _record_memory_history(context="alloc"): each entry has
      time_us, and each allocation a frames list. About 59 bytes an entry: 895,000 entries
      make about 53 MB.
The live blocks of `segments` carry their frames in both (record_context defaults to True).

The run: a 24-layer transformer (hidden 2048, 4096 tokens a micro-batch) whose parameters
are made first, then training steps: the input batch copied in on a copy stream, each
layer's forward keeping its activations and making short-lived temporaries, the backward
releasing them in reverse while making the gradients (kept from the first step on), the
gradient buckets reduced on a communication stream, the optimizer's state made at its first
step and its temporaries each step, and torch.cuda.empty_cache() every 20 steps. Sizes are
those shapes with a spread (a few percent, and the odd small tensor: norms' statistics,
indices, scalars), rounded to whole elements.

Addresses, segments and the final state come from tools/torch_alloc_model.py (the caching
allocator's best fit with its default settings), so the snapshot is consistent: replayed
through the torch policy it reproduces every address. The schema is
torch/csrc/cuda/Module.cpp _cuda_memorySnapshot's: `segments` (device, address, total_size,
allocated_size, active_size, requested_size, stream, segment_type, segment_pool_id,
is_expandable, blocks with address, size, requested_size, state, frames), `device_traces`
(action, addr, size, stream; with --schema 2.1 also time_us, and for each alloc its Python
frames: a new list per allocation holding frame dicts shared by every stack that has them,
as torch/csrc/profiler/combined_traceback.cpp py_symbolize makes them) and
`allocator_settings`. Both schemas draw the same random numbers: the same run, the same
addresses and peaks.
"""
import argparse
import os
import pickle
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_alloc_model import Allocator  # noqa: E402

# entries per MB of this generator's files (measured on 895,000-entry files)
EVENTS_PER_MB = {"2.0": 895093 / 32.97, "2.1": 895093 / 53.27}
H = 2048          # hidden size
TOKENS = 4096     # tokens in a micro-batch (batch 2 x sequence 2048)
LAYERS = 24
VOCAB = 32000
HEADS = 16
BF16, FP32, INT64 = 2, 4, 8

# CUDA stream handles as torch reports them (cudaStream_t values); 0 is the default stream.
COMPUTE, COMM, COPY = 0, 94371849781248, 94371849784320

SITE_PACKAGES = "/opt/conda/lib/python3.10/site-packages/torch"
USER = "/home/user/project"


class Frames:
    """Frame dicts (one object per distinct frame) and stacks of them."""

    def __init__(self):
        self.frames = {}

    def frame(self, filename, line, name):
        key = (filename, line, name)
        f = self.frames.get(key)
        if f is None:
            f = {"filename": filename, "line": line, "name": name}
            self.frames[key] = f
        return f

    def stack(self, *where):
        """Innermost first: (file, line, name) tuples."""
        return tuple(self.frame(*w) for w in where)


def build_sites(fr):
    mod = (SITE_PACKAGES + "/nn/modules/module.py", 1511, "_wrapped_call_impl")
    train = (USER + "/train.py", 95, "train_step")
    main = (USER + "/train.py", 143, "main")
    sites = {}
    for i, op in enumerate(["norm1", "qkv", "scores", "softmax", "attn", "proj", "norm2",
                            "up", "gelu", "down", "residual"]):
        sites["fwd_" + op] = fr.stack((USER + "/model.py", 120 + 3 * i, "forward"), mod,
                                      (USER + "/model.py", 210, "forward"), mod, train, main)
    sites["input"] = fr.stack((USER + "/data.py", 41, "to_device"), train, main)
    sites["embed"] = fr.stack((SITE_PACKAGES + "/nn/functional.py", 2264, "embedding"),
                              (USER + "/model.py", 201, "forward"), mod, train, main)
    sites["loss"] = fr.stack((SITE_PACKAGES + "/nn/functional.py", 3086, "cross_entropy"),
                             (USER + "/train.py", 88, "loss_fn"), train, main)
    backward = (SITE_PACKAGES + "/autograd/__init__.py", 266, "backward")
    sites["bwd"] = fr.stack((SITE_PACKAGES + "/_tensor.py", 525, "backward"),
                            (USER + "/train.py", 90, "train_step"), main)
    sites["grad"] = fr.stack((SITE_PACKAGES + "/autograd/graph.py", 768, "AccumulateGrad"),
                             backward, (USER + "/train.py", 90, "train_step"), main)
    sites["bucket"] = fr.stack((SITE_PACKAGES + "/distributed/distributed_c10d.py", 2288,
                                "all_reduce"), (USER + "/train.py", 91, "train_step"), main)
    sites["optim_state"] = fr.stack((SITE_PACKAGES + "/optim/adam.py", 146, "_init_group"),
                                    (SITE_PACKAGES + "/optim/optimizer.py", 385, "wrapper"),
                                    (USER + "/train.py", 93, "train_step"), main)
    sites["optim_tmp"] = fr.stack((SITE_PACKAGES + "/optim/adam.py", 520, "_multi_tensor_adam"),
                                  (SITE_PACKAGES + "/optim/optimizer.py", 385, "wrapper"),
                                  (USER + "/train.py", 93, "train_step"), main)
    sites["param"] = fr.stack((SITE_PACKAGES + "/nn/modules/module.py", 1150, "convert"),
                              (SITE_PACKAGES + "/nn/modules/module.py", 825, "_apply"),
                              (USER + "/train.py", 60, "setup"), main)
    return sites


class Run:
    def __init__(self, seed, target, schema):
        self.rng = random.Random(seed)
        self.schema = schema
        self.alloc = Allocator()
        self.alloc.log = []
        self.entries = []
        self.target = target
        self.time_us = 1737909051023564
        self.fr = Frames()
        self.sites = build_sites(self.fr)
        self.live = {}  # addr -> (requested, frames list)

    def _flush_log(self):
        for act, addr, size, stream in self.alloc.log:
            self._entry(act, addr, size, stream)
        self.alloc.log.clear()

    def _entry(self, action, addr, size, stream, frames=None):
        self.time_us += self.rng.randint(3, 40)
        e = {"action": action, "addr": addr, "size": size, "stream": stream}
        if self.schema != "2.0":  # TraceEntry's time_ came with torch 2.1
            e["time_us"] = self.time_us
        # Module.cpp adds `frames` to the entries that have a context (none in 2.0's default)
        if frames is not None and self.schema != "2.0":
            e["frames"] = frames
        self.entries.append(e)

    def jitter(self, n, elem=BF16):
        """About n elements: shapes vary a little (padding, ragged batches)."""
        n = max(1, int(n * self.rng.uniform(0.97, 1.03)))
        return n * elem

    def malloc(self, size, site, stream=COMPUTE):
        addr = self.alloc.malloc(size, stream)
        self._flush_log()
        frames = list(self.sites[site])  # a new list per allocation, shared frame dicts
        self.alloc.by_addr[addr].requested = size
        self.live[addr] = (size, frames)
        self._entry("alloc", addr, size, stream, frames)
        return addr

    def free(self, addr):
        size, _ = self.live.pop(addr)
        b = self.alloc.by_addr[addr]
        stream = b.stream
        self.alloc.free(addr)
        self._entry("free_requested", addr, size, stream)
        self._entry("free_completed", addr, size, stream)

    def empty_cache(self):
        self.alloc.empty_cache()
        self._flush_log()

    def done(self):
        return len(self.entries) >= self.target

    def small(self):
        """The odd small tensor: a norm's statistics, indices, a scalar."""
        return self.rng.choice([4, 8, 16, TOKENS * FP32, TOKENS * FP32, HEADS * TOKENS * FP32,
                                H * FP32, 512, 1024 * INT64])

    def params(self):
        ps = [self.malloc(VOCAB * H * BF16, "param")]
        for _ in range(LAYERS):
            for n in (3 * H * H, H * H, 4 * H * H, 4 * H * H):
                ps.append(self.malloc(n * BF16, "param"))
            for n in (H, H, 3 * H, H, 4 * H, H):  # norms and biases
                ps.append(self.malloc(n * BF16, "param"))
        return ps

    def step(self, first, params, grads, state):
        inp = self.malloc(TOKENS * INT64, "input", COPY)
        saved = []
        x = self.malloc(self.jitter(TOKENS * H), "embed")
        saved.append(x)
        for _ in range(LAYERS):
            if self.done():
                return
            layer = []
            for op, n, keep in (("norm1", TOKENS * H, True), ("qkv", 3 * TOKENS * H, True),
                                ("scores", HEADS * TOKENS * 512, False),
                                ("softmax", HEADS * TOKENS * 512, True),
                                ("attn", TOKENS * H, True), ("proj", TOKENS * H, True),
                                ("norm2", TOKENS * H, True), ("up", 4 * TOKENS * H, True),
                                ("gelu", 4 * TOKENS * H, True), ("down", TOKENS * H, True),
                                ("residual", TOKENS * H, False)):
                a = self.malloc(self.jitter(n), "fwd_" + op)
                for _ in range(self.rng.randint(1, 3)):
                    t = self.malloc(self.small(), "fwd_" + op)
                    self.free(t)
                if keep:
                    layer.append(a)
                else:
                    self.free(a)
            saved.append(layer)
        logits = self.malloc(self.jitter(TOKENS * VOCAB // 8, FP32), "loss")
        loss = self.malloc(4, "loss")
        self.free(logits)
        g = self.malloc(self.jitter(TOKENS * H), "bwd")
        bucket = None
        pi = len(params) - 1
        for li in range(LAYERS, 0, -1):
            if self.done():
                return
            for a in reversed(saved[li]):
                t = self.malloc(self.jitter(self.rng.choice([1, 3, 4]) * TOKENS * H), "bwd")
                for _ in range(self.rng.randint(1, 2)):
                    s = self.malloc(self.small(), "bwd")
                    self.free(s)
                self.free(a)
                self.free(t)
            for _ in range(10):  # this layer's parameters' gradients
                p = params[pi]
                size = self.live[p][0]
                if first:
                    grads.append(self.malloc(size, "grad"))
                else:
                    t = self.malloc(size, "grad")
                    self.free(t)
                pi -= 1
            if li % 4 == 0:  # a 25 MiB bucket reduced on the communication stream
                if bucket is not None:
                    self.free(bucket)
                bucket = self.malloc(25 << 20, "bucket", COMM)
        if bucket is not None:
            self.free(bucket)
        self.free(saved[0])
        self.free(g)
        self.free(loss)
        self.free(inp)
        for p in params:  # Adam: exp_avg and exp_avg_sq at the first step, temporaries
            if self.done():
                return
            size = self.live[p][0]
            if first:
                state.append(self.malloc(size * 2, "optim_state"))
                state.append(self.malloc(size * 2, "optim_state"))
            if self.rng.random() < 0.3:
                t = self.malloc(size, "optim_tmp")
                self.free(t)

    def run(self):
        params = self.params()
        grads, state = [], []
        step = 0
        while not self.done():
            self.step(step == 0, params, grads, state)
            step += 1
            if step % 20 == 0 and not self.done():
                self.empty_cache()
        return step

    def segments(self):
        out = []
        a = self.alloc
        for seg, (size, stream, small) in sorted(a.segments.items()):
            blocks = []
            alloc_sz = req_sz = 0
            for b in a.blocks_of(seg):
                if b.free:
                    blocks.append({"address": b.addr, "size": b.size, "requested_size": 0,
                                   "state": "inactive", "frames": []})
                else:
                    req, frames = self.live[b.addr]
                    alloc_sz += b.size
                    req_sz += req
                    blocks.append({"address": b.addr, "size": b.size, "requested_size": req,
                                   "state": "active_allocated", "frames": frames})
            out.append({"device": 0, "address": seg, "total_size": size,
                        "allocated_size": alloc_sz, "active_size": alloc_sz,
                        "requested_size": req_sz, "stream": stream,
                        "segment_type": "small" if small else "large",
                        "segment_pool_id": (0, 0), "is_expandable": False, "blocks": blocks})
        return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--events", type=int, default=895000, help="trace entries (default 895000)")
    ap.add_argument("--mb", type=float, help="aim at a file of about this many MB instead")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--schema", choices=["2.0", "2.1"], default="2.0",
                    help="the PyTorch whose recording the file is (default 2.0)")
    args = ap.parse_args(argv[1:])
    target = int(args.mb * EVENTS_PER_MB[args.schema]) if args.mb else args.events
    r = Run(args.seed, target, args.schema)
    steps = r.run()
    snap = {
        "segments": r.segments(),
        "device_traces": [r.entries],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                               "garbage_collection_threshold": 0.0,
                               "expandable_segments": False,
                               "roundup_power2_divisions": {}},
    }
    with open(args.out, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    print("%s: %d entries, %d steps, %d segments, peak reserved %d, peak allocated %d, %d bytes"
          % (args.out, len(r.entries), steps, len(snap["segments"]), r.alloc.peak_reserved,
             r.alloc.peak_allocated, os.path.getsize(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
