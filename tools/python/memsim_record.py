"""memsim_record: record the tensor allocations and frees of a PyTorch training step as a
memsim trace (the text form of formats/README.md).

    from memsim_record import Recorder

    rec = Recorder(model=model, optimizer=opt, inputs=(x, y))
    for step in (1, 2):
        with rec.step(step):
            with rec.phase("forward"):
                loss = loss_fn(model(x), y)
            with rec.phase("backward"):
                loss.backward()
            with rec.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    rec.save("step.txt")             # then: memsim replay --allocator exact step.txt
    print(rec.summary())             # peaks per step and per phase, computed here

What is recorded. Every storage allocation (its requested size, the top-level operator that
made it and the innermost one), every free, the start of every top-level operator (an OP
event into an op table with its name and phase), and MARK events at step and phase
boundaries. Storages that exist when recording starts (parameters, buffers, gradients,
optimizer state, inputs) appear first, as ALLOC events, so that live bytes are complete.
Each allocation gets a category: parameter, gradient, optimizer_state or input for the
tensors the recorder knows and for storages seen as a `.grad` or as optimizer state at the
end of any phase; "other" for model buffers; activation for storages allocated in a forward
phase and still alive at its end (saved for backward, or outputs); temporary for everything
else. `tag()` overrides all of these.

How, and why it is exact (CPU, torch >= 1.13). The PyTorch profiler with
`profile_memory=True` records one event for each allocation and each free that goes through
c10's CPU allocator, at the moment it happens, from inside the allocator. Its experimental
event tree (`prof.profiler.kineto_results.experimental_event_tree()`) exposes for each one
the pointer, the signed byte count, the allocator's running total and a nanosecond
timestamp, nested under the operator that was running. So the stream is complete (no
sampling, no guessing from Python object lifetimes) and each free is matched to its
allocation by pointer, replaying the stream in order: a pointer names one live allocation at
a time. Two checks make it trustworthy: every event's running total must equal the previous
total plus its own size (which proves the order, and is used to repair the order of events
that share a timestamp), and every free must match a live allocation of the same size.
Operator boundaries come from the same tree, so attribution is by nesting, not by time.
The profiler records the threads it was enabled on; a storage whose last reference is
dropped on another thread (a gloo worker finishing a collective) is freed unseen. When the
allocator hands out such an address again, the free is placed just before that allocation
(the latest it can have happened) and counted in a comment of the trace.
The `KinetoEvent`s of `prof.events()` carry no pointer, and a TorchDispatchMode plus weak
references would see tensor, not storage, lifetimes and miss allocator-level frees; both
were rejected for that reason.

One limit of the allocator's reporting shapes the method: the CPU allocator reports a free
only for a pointer it saw allocated while memory profiling was on. Storages that exist
before recording would therefore never be seen freed (a `.grad` dropped by `zero_grad`, an
input batch dropped at the end of a step). The recorder "adopts" the ones it knows: right
after the profiler starts, each such storage is cloned and its tensors are re-pointed to the
clone with `Tensor.set_` (aliasing between the known tensors is kept; values are unchanged).
Unknown tensors allocated before recording stay invisible: they are neither counted live nor
seen freed. (Freeing the old copies makes torch 1.13's CPU allocator log one warning, "Memory
block of unknown size was allocated before the profiling started"; it is expected.) Pass `adopt=False` to leave the user's tensors alone; they are then written as
initial ALLOC events and their frees, if any, are missed.

Phases and steps are profiler ranges opened with `_record_function_enter_new`, which makes
no tensor (the Python `record_function` of torch 1.13 allocates a small handle tensor, which
would show up in the trace). The recorder's own ranges are left out of the op attribution;
so are other user ranges such as torch's `Optimizer.step#AdamW.step`, whose aten ops become
the top-level ops.

CUDA (torch 2.x). The allocation stream comes from the caching allocator's own history,
`torch.cuda.memory._record_memory_history` + `_snapshot()["device_traces"]`: `alloc` and
`free_requested` entries with the requested (un-rounded) size and the stream. The profiler
runs alongside; its CUDA memory events (block sizes) are joined to the history entries one by
one, in order, checking that the addresses agree, which gives each allocation its operator,
phase and step exactly as on CPU. The blocks live at the start come from `_snapshot()`'s
segments. History entries the profiler did not see (another thread) are kept, attributed to
the operator before them. No adoption is needed: the CUDA allocator reports every free.
This path was written from the PyTorch sources and has not been run on a GPU here.

CPU traces include host-only allocations that a GPU run keeps in host memory: wrapped
Python scalars (4-8 bytes, transient), AdamW's `state["step"]` (4 bytes per parameter),
the RNG state stashed by checkpointing (about 5 KB per region). They are small; they are
kept because they are what the allocator saw.

Command line: `python3 memsim-record.py --demo OUT.txt [--summary OUT.json]` records two
AdamW steps of a small built-in MLP.
"""

import argparse
import contextlib
import json
import sys

import torch

CATEGORIES = ("other", "parameter", "gradient", "optimizer_state", "activation", "temporary",
              "comm_buffer", "input", "kv_cache")
PHASES = ("other", "forward", "backward", "optimizer", "communication")

_RANGE_PREFIX = "memsim::"


# ============================================================================ helpers ====

def _storage(t):
    """The storage behind a tensor (untyped on torch 2.x, typed on 1.13)."""
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()
    return t.storage()


def _storage_ptr(t):
    return _storage(t).data_ptr()


def _storage_nbytes(t):
    return _storage(t).nbytes()


def _iter_tensors(obj):
    """Tensors inside nested lists, tuples and dicts."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _iter_tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _iter_tensors(v)


class _Range:
    """A profiler range that allocates nothing (unlike torch 1.13's Python record_function)."""

    def __init__(self, name):
        self.name = name
        self.handle = None

    def __enter__(self):
        try:
            self.handle = torch.ops.profiler._record_function_enter_new(self.name, None)
            self.exit = torch.ops.profiler._record_function_exit._RecordFunction
        except (AttributeError, RuntimeError):
            rf = torch.autograd.profiler.record_function(self.name)
            rf.__enter__()
            self.handle, self.exit = rf, lambda h: h.__exit__(None, None, None)
        return self

    def __exit__(self, *exc):
        self.exit(self.handle)
        return False


class _Profiler:
    """The profiler with memory events on, CPU activity only. Stopping it returns the raw
    results; the Python-side parsing into FunctionEvents, which torch 1.13 does on exit and
    which takes longer than the recording, is skipped."""

    def __init__(self):
        try:
            p = torch.autograd.profiler.profile(enabled=True, profile_memory=True,
                                                record_shapes=False, with_stack=False,
                                                use_kineto=True)
            p._prepare_trace()
            p._start_trace()
            self._low, self._prof = True, p
        except (AttributeError, TypeError, RuntimeError):
            p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                       profile_memory=True, record_shapes=False,
                                       with_stack=False)
            p.start()
            self._low, self._prof = False, p

    def stop(self):
        if self._low:
            return torch.autograd._disable_profiler()
        self._prof.stop()
        return self._prof.profiler.kineto_results


def _point(name):
    """A zero-length range: a position in the event stream."""
    with _Range(name):
        pass


def _alloc_device(ef):
    """(device type, index) of an allocation event, across profiler versions."""
    dev = getattr(ef, "device", None)
    if callable(dev):
        dev = dev()
    if isinstance(dev, torch.device):
        return dev.type, (dev.index if dev.index is not None else -1)
    dtype = getattr(ef, "device_type", None)
    index = getattr(ef, "device_index", -1)
    return ("cuda" if "CUDA" in str(dtype).upper() else "cpu"), index


def _event_name(node):
    name = node.name
    return name() if callable(name) else name


def _is_user_scope(node):
    scope = getattr(node.extra_fields, "scope", None)
    return scope is not None and str(scope).endswith("USER_SCOPE")


def _short_op_name(name):
    """'autograd::engine::evaluate_function: MmBackward0' -> 'MmBackward0'."""
    prefix = "autograd::engine::evaluate_function: "
    return name[len(prefix):] if name.startswith(prefix) else name


# ========================================================================== recorder ====

class Recorder:
    """Records allocations, frees, operators and step/phase marks; see the module docstring.

    model, optimizer: whose parameters, buffers, gradients and optimizer state are known
        (categories, adoption, gradient and state detection after each phase).
    inputs: tensors (or nested lists/dicts of tensors) that exist before recording: inputs.
    device: "cpu" or "cuda[:N]"; default: the device of the model's first parameter.
    adopt: CPU only: re-home the known pre-existing storages so that their frees are seen
        (default True).
    ops: "all" writes an OP event for every top-level operator; "memory" only for those
        that allocate or free.
    """

    def __init__(self, model=None, optimizer=None, inputs=(), device=None, name=None,
                 adopt=True, ops="all"):
        self.model = model
        self.optimizer = optimizer
        self.inputs = inputs
        if device is None:
            param = next(iter(model.parameters()), None) if model is not None else None
            device = param.device if param is not None else torch.device("cpu")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.name = name or "memsim-record"
        self.adopt = adopt and self.device.type == "cpu"
        if ops not in ("all", "memory"):
            raise ValueError("ops must be 'all' or 'memory'")
        self.ops = ops
        self._prof = None
        self._running = False
        self._done = False
        self._n_points = 0
        self._observations = {}   # point name -> [(storage ptr, category)]
        self._initial = []        # (ptr, size, category) known before recording (no adoption)
        self._cuda_blocks = None  # CUDA: blocks live at the start, from _snapshot()
        self._cuda_trace_start = 0
        self._phase_stack = []
        self._step = None
        self._result = None

    # ----------------------------------------------------------------------- control ----

    def start(self):
        """Starts recording (step() calls it on first use)."""
        if self._running or self._done:
            if self._done:
                raise RuntimeError("this Recorder has already been stopped")
            return
        if self.device.type == "cuda":
            self._cuda_start()
        self._prof = _Profiler()
        self._running = True
        known = self._known_tensors()
        if self.adopt:
            with _Range(_RANGE_PREFIX + "init"):
                self._adopt(known)
            self._observe(known)
        elif self.device.type == "cpu":
            seen = set()
            for t, cat in known:
                ptr = _storage_ptr(t)
                if ptr and ptr not in seen:
                    seen.add(ptr)
                    self._initial.append((ptr, _storage_nbytes(t), cat))
        else:
            self._observe(known)

    def stop(self):
        """Stops recording and processes the events (save() and summary() call it)."""
        if self._done:
            return
        if not self._running:
            raise RuntimeError("nothing was recorded")
        results = self._prof.stop()
        self._running = False
        self._done = True
        cuda_history = self._cuda_stop() if self.device.type == "cuda" else None
        self._result = _process(self, results.experimental_event_tree(), cuda_history)
        self._prof = None

    @contextlib.contextmanager
    def step(self, number):
        """Everything inside is step `number`: MARK events "step N begin" and "step N end"."""
        self.start()
        self._step = number
        with _Range("%sstep %s" % (_RANGE_PREFIX, number)):
            try:
                yield self
            finally:
                self._observe(self._known_tensors(include_inputs=False))
        self._step = None

    @contextlib.contextmanager
    def phase(self, name):
        """A phase of the step: "forward", "backward", "optimizer" (others count as "other").
        At its end the recorder looks at the parameters' .grad and the optimizer state."""
        self.start()
        if any(c.isspace() for c in name):
            raise ValueError("phase names have no spaces")
        with _Range("%sphase %s" % (_RANGE_PREFIX, name)):
            try:
                yield self
            finally:
                self._observe(self._known_tensors(include_inputs=False))

    def mark(self, text):
        """A MARK event here, with this text."""
        self.start()
        _point("%smark %s" % (_RANGE_PREFIX, text))

    def tag(self, tensors, category):
        """The storages of these tensors, as they are now, get this category."""
        if category not in CATEGORIES:
            raise ValueError("unknown category %r (expected one of %s)"
                             % (category, ", ".join(CATEGORIES)))
        self.start()
        self._observe([(t, category) for t in _iter_tensors(tensors)], force=True)

    # ------------------------------------------------------------------------ output ----

    def events(self):
        """The processed events: a list of dicts (kind, and the kind's fields)."""
        self.stop()
        return self._result["events"]

    def summary(self):
        """Peak live bytes (sum of requested sizes) overall, per step and per phase, from the
        recorded stream itself; plus counts and any consistency warnings."""
        self.stop()
        return _summarize(self._result)

    def save(self, path):
        """Writes the trace in memsim's text form."""
        self.stop()
        with open(path, "w", encoding="utf-8") as f:
            _write_text(f, self.name, self._result)

    def save_summary(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.summary(), f, indent=1, sort_keys=True)
            f.write("\n")

    # ----------------------------------------------------------------------- private ----

    def _known_tensors(self, include_inputs=True):
        """(tensor, category) for what exists now, in priority order."""
        out = []
        params = []
        if self.model is not None:
            params.extend(self.model.parameters())
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                params.extend(group["params"])
        out.extend((p, "parameter") for p in params)
        if self.model is not None:
            # Buffers (rotary frequencies, causal tables) are model state but not parameters:
            # "other", as memsim's generator has them.
            out.extend((b, "other") for b in self.model.buffers())
        out.extend((p.grad, "gradient") for p in params if p.grad is not None)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                out.extend((t, "optimizer_state") for t in _iter_tensors(state))
        if include_inputs:
            out.extend((t, "input") for t in _iter_tensors(self.inputs))
        return [(t, c) for t, c in out if t.device == self.device]

    def _observe(self, pairs, force=False):
        """Records which category each storage has at this point of the stream."""
        name = "point %d" % self._n_points
        self._n_points += 1
        _point(_RANGE_PREFIX + name)
        obs = []
        for t, cat in pairs:
            if t.device != self.device:
                continue
            ptr = _storage_ptr(t)
            if ptr:
                obs.append((ptr, cat, force))
        self._observations[name] = obs

    def _adopt(self, known):
        """Clones each known storage under the profiler and re-points its tensors at the clone,
        so that the allocator will report its free."""
        groups = {}
        for t, _ in known:
            ptr = _storage_ptr(t)
            if ptr:
                groups.setdefault(ptr, []).append(t)
        with torch.no_grad():
            for tensors in groups.values():
                old = _storage(tensors[0])
                new = old.clone()
                done = set()
                for t in tensors:
                    if id(t) in done:
                        continue
                    done.add(id(t))
                    t.set_(new, t.storage_offset(), t.size(), t.stride())

    def _cuda_start(self):
        mem = torch.cuda.memory
        try:
            mem._record_memory_history(enabled="all", context=None, stacks="python",
                                       max_entries=1 << 26, device=self.device)
        except TypeError:
            mem._record_memory_history(True, trace_alloc_max_entries=1 << 26,
                                       trace_alloc_record_context=False, device=self.device)
        snap = mem._snapshot()
        self._cuda_trace_start = len(snap["device_traces"][self.device.index])
        blocks = []
        for seg in snap["segments"]:
            if seg.get("device", self.device.index) != self.device.index:
                continue
            addr = seg["address"]
            for b in seg["blocks"]:
                if b["state"] == "active_allocated":
                    blocks.append((b.get("address", addr), b.get("requested_size", b["size"]),
                                   seg.get("stream", 0)))
                addr += b["size"]
        self._cuda_blocks = blocks

    def _cuda_stop(self):
        mem = torch.cuda.memory
        torch.cuda.synchronize(self.device)
        snap = mem._snapshot()
        try:
            mem._record_memory_history(enabled=None, device=self.device)
        except TypeError:
            mem._record_memory_history(False, device=self.device)
        trace = snap["device_traces"][self.device.index][self._cuda_trace_start:]
        return [e for e in trace if e["action"] in ("alloc", "free_requested")]


# ======================================================================== processing ====

class _Alloc:
    __slots__ = ("tid", "size", "top", "inner", "phase", "step", "category", "forced",
                 "freed_in_phase")

    def __init__(self, tid, size, top, inner, phase, step):
        self.tid, self.size, self.top, self.inner = tid, size, top, inner
        self.phase, self.step = phase, step
        self.category = None
        self.forced = False
        self.freed_in_phase = False


def _collect(tree, device):
    """Walks the profiler's event tree. Returns the memory events of `device` with their
    operators, the top-level operators, and the recorder's ranges."""
    mems, ops, ranges = [], [], []
    alloc_type = torch._C._profiler._ExtraFields_Allocation
    seq = 0
    stack = [(node, ()) for node in reversed(tree)]
    while stack:
        node, chain = stack.pop()
        seq += 1
        ef = node.extra_fields
        if isinstance(ef, alloc_type):
            if _alloc_device(ef) == device:
                top = _event_name(chain[0]) if chain else None
                inner = _event_name(chain[-1]) if chain else None
                mems.append(dict(t=node.start_time_ns, seq=seq, ptr=ef.ptr, size=ef.alloc_size,
                                 total=ef.total_allocated, top=top, inner=inner))
            continue
        name = _event_name(node)
        child_chain = chain
        if name.startswith(_RANGE_PREFIX):
            ranges.append(dict(name=name[len(_RANGE_PREFIX):], t0=node.start_time_ns,
                               t1=node.end_time_ns, seq=seq))
        elif _is_user_scope(node):
            pass
        elif hasattr(ef, "scope") or chain:
            if not chain:
                ops.append(dict(t=node.start_time_ns, seq=seq, name=name, node=node))
            child_chain = chain + (node,)
        for child in reversed(node.children):
            stack.append((child, child_chain))
    return mems, ops, ranges


def _fix_order(mems, warnings):
    """Sorts memory events by time and, where events share a timestamp, puts them in the
    order that the allocator's running total proves."""
    mems.sort(key=lambda m: (m["t"], m["seq"]))
    bad = 0
    i = 0
    prev_total = None
    while i < len(mems):
        j = i
        while j + 1 < len(mems) and mems[j + 1]["t"] == mems[i]["t"]:
            j += 1
        group = mems[i:j + 1]
        if prev_total is not None and len(group) > 1:
            ordered, total = [], prev_total
            rest = list(group)
            while rest:
                k = next((k for k, m in enumerate(rest) if m["total"] == total + m["size"]), 0)
                ordered.append(rest.pop(k))
                total = ordered[-1]["total"]
            mems[i:j + 1] = ordered
        for m in mems[i:j + 1]:
            if prev_total is not None and m["total"] != prev_total + m["size"]:
                bad += 1
            prev_total = m["total"]
        i = j + 1
    if bad:
        warnings.append("%d memory events do not follow the allocator's running total "
                        "(events from another thread, or reordered)" % bad)


def _join_cuda(mems, history, warnings):
    """Gives the profiler's CUDA memory events the history's requested sizes and streams;
    keeps history entries the profiler did not see."""
    out = []
    k = 0
    unmatched = 0
    window = 8  # events of two threads with close timestamps may be out of order
    for h in history:
        is_alloc = h["action"] == "alloc"
        j = next((j for j in range(k, min(k + window, len(mems)))
                  if mems[j]["ptr"] == h["addr"] and (mems[j]["size"] > 0) == is_alloc), None)
        if j is not None:
            mems.insert(k, mems.pop(j))
            m = dict(mems[k])
            k += 1
        else:
            unmatched += 1
            base = out[-1] if out else dict(t=0, seq=0, top=None, inner=None)
            m = dict(t=base["t"], seq=base["seq"], ptr=h["addr"], top=base["top"],
                     inner=base["inner"], total=None)
        m["size"] = h["size"] if is_alloc else -h["size"]
        m["stream"] = h.get("stream", 0)
        out.append(m)
    # The history's order is the allocator's: keep it through the sort by time.
    for a, b in zip(out, out[1:]):
        if b["t"] < a["t"]:
            b["t"] = a["t"]
    if unmatched or k != len(mems):
        warnings.append("%d allocator history entries had no profiler event, %d profiler "
                        "events no history entry" % (unmatched, len(mems) - k))
    return out


def _process(rec, tree, cuda_history):
    warnings = []
    dev = (rec.device.type, rec.device.index if rec.device.index is not None else -1)
    mems, ops, ranges = _collect(tree, dev)
    if cuda_history is not None:
        mems.sort(key=lambda m: (m["t"], m["seq"]))
        mems = _join_cuda(mems, cuda_history, warnings)
    else:
        _fix_order(mems, warnings)

    # The timeline: range begins, operator starts, memory events, range ends, by time.
    items = []
    for r in ranges:
        items.append((r["t0"], 0, r["seq"], "begin", r))
        items.append((r["t1"], 3, r["seq"], "end", r))
    for o in ops:
        items.append((o["t"], 1, o["seq"], "op", o))
    for n, m in enumerate(mems):
        items.append((m["t"], 2, n, "mem", m))
    items.sort(key=lambda x: x[:3])

    streams = {0: 0}
    if cuda_history is not None:
        for m in mems:
            streams.setdefault(m.get("stream", 0), len(streams))

    events = []        # dicts: kind and fields
    allocs = {}        # trace id -> _Alloc
    live = {}          # ptr -> trace id
    next_id = [1]
    op_table = {}      # (name, phase) -> index
    op_list = []
    phase = ["other"]
    step = [None]
    in_init = [False]
    unmatched_frees = 0
    size_mismatch = 0
    pending_op = [None]
    inferred = [0]

    def new_alloc(ptr, size, top, inner, stream, category=None):
        tid = next_id[0]
        next_id[0] += 1
        a = _Alloc(tid, size, top, inner, phase[0], step[0])
        a.category = category
        allocs[tid] = a
        if ptr in live:
            # The allocator handed out an address that is still live here: its block was
            # freed on a thread the profiler does not record (a gloo or autograd worker
            # dropping the last reference), and that free is placed here, the latest point
            # it can have happened.
            events.append(dict(kind="free", t=live.pop(ptr), stream=stream))
            inferred[0] += 1
        live[ptr] = tid
        events.append(dict(kind="alloc", t=tid, size=size, stream=stream, alloc=a))

    def emit_op(o):
        key = (_short_op_name(o["name"]), _phase_index(phase[0]))
        if key not in op_table:
            op_table[key] = len(op_list)
            op_list.append(key)
        events.append(dict(kind="op", index=op_table[key]))

    # Storages that exist at the start and were not adopted (CPU adopt=False, or CUDA).
    if rec._initial:
        for ptr, size, cat in rec._initial:
            new_alloc(ptr, size, None, None, 0, cat)
    if rec._cuda_blocks:
        for ptr, size, handle in rec._cuda_blocks:
            stream = streams.setdefault(handle, len(streams))
            new_alloc(ptr, size, None, None, stream, "other")

    for _, _, _, what, obj in items:
        if what == "begin" or what == "end":
            name = obj["name"]
            word, _, arg = name.partition(" ")
            if word == "point":
                if what == "begin":
                    continue
                for ptr, cat, force in rec._observations.get(name, ()):
                    tid = live.get(ptr)
                    if tid is not None:
                        a = allocs[tid]
                        if force or not a.forced:
                            a.category = cat
                            a.forced = a.forced or force
                continue
            if word == "init":
                in_init[0] = what == "begin"
                events.append(dict(kind="mark", text="init " + what))
            elif word == "step":
                if what == "begin":
                    step[0] = arg
                events.append(dict(kind="mark", text="step %s %s" % (arg, what)))
                if what == "end":
                    step[0] = None
            elif word == "phase":
                if what == "begin":
                    phase[0] = arg
                else:
                    # Forward storages still alive here are activations.
                    for tid in live.values():
                        a = allocs[tid]
                        if a.phase == "forward" and a.step == step[0] and arg == "forward" \
                                and a.category is None:
                            a.category = "activation"
                events.append(dict(kind="mark", text=(
                    "step %s %s %s" % (step[0], arg, what) if step[0] is not None
                    else "%s %s" % (arg, what))))
                if what == "end":
                    phase[0] = "other"
            elif word == "mark":
                if what == "begin":
                    events.append(dict(kind="mark", text=arg))
            continue
        if what == "op":
            if in_init[0]:
                continue
            if rec.ops == "all":
                emit_op(obj)
            else:
                pending_op[0] = obj
            continue
        # A memory event.
        m = obj
        if rec.ops == "memory" and pending_op[0] is not None and not in_init[0]:
            emit_op(pending_op[0])
            pending_op[0] = None
        stream = streams.get(m.get("stream", 0), 0)
        if m["size"] > 0:
            new_alloc(m["ptr"], m["size"], m["top"], m["inner"], stream)
        else:
            tid = live.pop(m["ptr"], None)
            if tid is None:
                # Adoption frees the old storages of the known tensors: expected. Any other
                # free of an unknown pointer is of a storage allocated before recording
                # (seen by an earlier profiling session), which is not in the trace.
                if not in_init[0]:
                    unmatched_frees += 1
                continue
            a = allocs[tid]
            if a.size != -m["size"] and cuda_history is None:
                size_mismatch += 1
            if a.phase == "forward" and phase[0] == "forward" and a.step == step[0]:
                a.freed_in_phase = True
            events.append(dict(kind="free", t=tid, stream=stream))

    for a in allocs.values():
        if a.category is None:
            a.category = "temporary"
    if unmatched_frees:
        warnings.append("%d frees of storages allocated before recording (not in the trace)"
                        % unmatched_frees)
    if size_mismatch:
        warnings.append("%d frees whose size differs from their allocation" % size_mismatch)
    return dict(events=events, ops=op_list, n_streams=len(streams), warnings=warnings,
                torch_version=torch.__version__, device=str(rec.device),
                inferred_frees=inferred[0])


def _phase_index(name):
    return name if name in PHASES else "other"


# =========================================================================== output ====

def _quote(s):
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\x%02x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _write_text(f, name, result):
    """The canonical text form: header, string and op tables, then the events of rank 0.
    The innermost operator of each allocation is written as a comment."""
    strings, index = [], {}

    def intern(s):
        if s not in index:
            index[s] = len(strings)
            strings.append(s)
        return index[s]

    op_names = [intern(n) for n, _ in result["ops"]]
    for e in result["events"]:
        if e["kind"] == "mark":
            e["string"] = intern(e["text"])
    w = f.write
    w("memsim-trace 1\n")
    w("name %s\n" % _quote(name))
    w("capacity 0\n")
    w("rank 0 device=0 multiplicity=1 streams=%d\n" % result["n_streams"])
    w("# recorded by memsim_record with torch %s on %s\n"
      % (result["torch_version"], result["device"]))
    if result.get("inferred_frees"):
        w("# %d free(s) not seen (made on another thread), placed where the address was "
          "allocated again\n" % result["inferred_frees"])
    for warning in result["warnings"]:
        w("# warning: %s\n" % warning.replace("\n", " "))
    for i, s in enumerate(strings):
        w("string %d %s\n" % (i, _quote(s)))
    for i, (n, ph) in enumerate(result["ops"]):
        w("opinfo %d name=%d phase=%s layer=-1 microbatch=-1 duration_us=0\n"
          % (i, op_names[i], ph))
    w("@rank 0\n")
    lines = []
    for e in result["events"]:
        kind = e["kind"]
        if kind == "alloc":
            a = e["alloc"]
            line = "alloc t=%d size=%d stream=%d cat=%s" % (e["t"], e["size"], e["stream"],
                                                            a.category)
            if a.inner:
                line += "  # " + _short_op_name(a.inner).replace("\n", " ")
            lines.append(line)
        elif kind == "free":
            lines.append("free t=%d" % e["t"] + (" stream=%d" % e["stream"] if e["stream"] else ""))
        elif kind == "op":
            lines.append("op %d" % e["index"])
        elif kind == "mark":
            lines.append("mark %d" % e["string"])
        if len(lines) >= 4096:
            w("\n".join(lines) + "\n")
            lines = []
    if lines:
        w("\n".join(lines) + "\n")


def _summarize(result):
    """Live bytes replayed from the events: peak overall, per step, per phase of each step."""
    live = 0
    peak = 0
    sizes = {}
    steps = {}
    open_step = None
    open_phase = None
    n_alloc = n_free = 0
    by_cat_at_peak = {}
    cats = {}
    for e in result["events"]:
        kind = e["kind"]
        if kind == "alloc":
            live += e["size"]
            sizes[e["t"]] = e["size"]
            cats[e["t"]] = e["alloc"].category
            n_alloc += 1
        elif kind == "free":
            live -= sizes.pop(e["t"])
            del cats[e["t"]]
            n_free += 1
        elif kind == "mark":
            words = e["text"].split()
            if len(words) == 3 and words[0] == "step":
                if words[2] == "begin":
                    open_step = steps.setdefault(words[1], dict(
                        begin=live, peak=live, end=None, phases={}))
                elif open_step is not None:
                    open_step["end"] = live
                    open_step = None
            elif len(words) == 4 and words[0] == "step" and open_step is not None:
                if words[3] == "begin":
                    open_phase = open_step["phases"].setdefault(words[2], dict(
                        begin=live, peak=live, end=None))
                elif open_phase is not None:
                    open_phase["end"] = live
                    open_phase = None
            continue
        else:
            continue
        if live > peak:
            peak = live
            by_cat_at_peak = {}
            for tid, c in cats.items():
                by_cat_at_peak[c] = by_cat_at_peak.get(c, 0) + sizes[tid]
        if open_step is not None:
            open_step["peak"] = max(open_step["peak"], live)
        if open_phase is not None:
            open_phase["peak"] = max(open_phase["peak"], live)
    return dict(peak_live_bytes=peak, final_live_bytes=live, steps=steps,
                by_category_at_peak=by_cat_at_peak, n_alloc=n_alloc, n_free=n_free,
                warnings=list(result["warnings"]), torch_version=result["torch_version"],
                device=result["device"])


# ============================================================================== demo ====

def demo(path, summary_path=None, device="cpu"):
    """Two AdamW steps of a small MLP, recorded to `path`."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                torch.nn.Linear(512, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    rec = Recorder(model=model, optimizer=opt, inputs=(x, y), name="demo: 3-layer MLP, AdamW")
    for step in (1, 2):
        with rec.step(step):
            with rec.phase("forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            with rec.phase("backward"):
                loss.backward()
            with rec.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    del loss
    rec.save(path)
    if summary_path:
        rec.save_summary(summary_path)
    return rec.summary()


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="memsim-record.py",
        description="Record PyTorch tensor allocations as a memsim trace. As a library: "
                    "from memsim_record import Recorder (see the module docstring).")
    p.add_argument("--demo", metavar="OUT.txt", required=True,
                   help="record two AdamW steps of a small built-in MLP into OUT.txt")
    p.add_argument("--summary", metavar="OUT.json", help="also write the peaks as JSON")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = p.parse_args(argv)
    s = demo(args.demo, args.summary, args.device)
    print("wrote %s: %d allocations, %d frees, peak live %d bytes"
          % (args.demo, s["n_alloc"], s["n_free"], s["peak_live_bytes"]))
    for n, st in sorted(s["steps"].items()):
        print("  step %s: peak %d bytes (%s)" % (n, st["peak"], ", ".join(
            "%s %d" % (ph, v["peak"]) for ph, v in st["phases"].items())))
    for w in s["warnings"]:
        print("warning: " + w, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
