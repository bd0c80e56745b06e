"""memsim from Python: the library (libmemsim) through ctypes, standard library only.

    import memsim

    r = memsim.estimate("llama-3-8b", batch=2, seq=4096, finetune="lora", lora_rank=16,
                        checkpointing="full", gpu_mem="80GiB")
    r["ranks"][0]["fits"]
    memsim.replay("run.pickle", alloc_conf="expandable_segments:True")
    memsim.compare("run.pickle", allocators="torch,exact")
    memsim.plan("llama-3-8b", gpus=8, gpu="a100-40gb", seq=4096, global_batch=64)

    with memsim.record("step.txt", model=model, optimizer=opt) as rec:   # needs torch
        with rec.step(1):
            ...

Each function returns the plain dict that the matching command prints with --json
(`memsim estimate --json`, `memsim replay --json`, `memsim compare --json`,
`memsim plan --json`). Bad input
raises memsim.Error whose message is the one the command prints after "memsim CMD: ".

Run settings are keyword arguments named as the command's flags with underscores for
dashes (batch=2, seq=4096, precision="bf16-mixed", lora_rank=16, torch_version="1.13",
inference=True, lora_targets=["q_proj", "v_proj"], run="run.ini" for a run file); the
estimate options are gpu_mem, cuda_context, nccl_mem (sizes: "80GiB" or bytes),
allocator and alloc_conf.

The shared library is found, in order: the path in the environment variable
MEMSIM_LIBRARY; the installed one beside this package (written at install time);
ctypes.util.find_library("memsim"); a build folder (build*/) of the source tree this file
lies in. The library is thread-safe for distinct calls; ctypes releases the GIL while it
runs, so threads estimate in parallel.
"""

import contextlib
import ctypes
import ctypes.util
import glob
import json
import os
import tempfile
import threading
import warnings

__all__ = ["Error", "estimate", "plan", "replay", "compare", "models", "convert", "record",
           "library_path"]


class Error(Exception):
    """Bad input or a failed operation; str(e) is the library's message (GError)."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        self.code = code  # MemsimErrorCode: 0 bad input, 1 I/O, 2 unsupported (or None)


# ------------------------------------------------------------------------ the library ----

class _GError(ctypes.Structure):
    _fields_ = [("domain", ctypes.c_uint32), ("code", ctypes.c_int),
                ("message", ctypes.c_char_p)]


class _Run(ctypes.Structure):
    """MemsimRun (include/memsim/gen.h), opaque: only the library reads or writes it. The
    buffer is larger than the struct so that fields added in C cannot overrun it (the
    struct is returned by value through a hidden pointer to this buffer);
    tests/test_python.c asserts the C struct still fits."""
    _fields_ = [("_opaque", ctypes.c_uint64 * 512)]


class _RunSettingName(ctypes.Structure):
    """The first field of MemsimRunSetting (include/memsim/gen.h): its key."""
    _fields_ = [("name", ctypes.c_char_p)]


class _EstimateOptions(ctypes.Structure):
    """MemsimEstimateOptions (include/memsim/gen.h); tests/test_python.c checks its size."""
    _fields_ = [("allocator", ctypes.c_char_p), ("alloc_conf", ctypes.c_char_p),
                ("gpu_mem", ctypes.c_uint64), ("context_bytes", ctypes.c_uint64),
                ("nccl_bytes", ctypes.c_uint64), ("device", ctypes.c_char_p)]


class _ReplayOptions(ctypes.Structure):
    """MemsimReplayOptions (include/memsim/sim.h); tests/test_python.c checks its size."""
    _fields_ = [("allocator", ctypes.c_char_p), ("alloc_conf", ctypes.c_char_p),
                ("capacity", ctypes.c_uint64), ("verify", ctypes.c_int),
                ("check_invariants", ctypes.c_int), ("timeline", ctypes.c_void_p),
                ("hooks", ctypes.c_void_p), ("untimed", ctypes.c_int),
                ("dispatch_us", ctypes.c_double), ("frames_skip", ctypes.c_char_p),
                ("threads", ctypes.c_uint)]


_CONTEXT_DEFAULT = 500 << 20  # MEMSIM_ESTIMATE_CONTEXT_DEFAULT

_ERR = ctypes.POINTER(ctypes.POINTER(_GError))
_lib = None
_glib = None
_lib_path = None
_load_lock = threading.Lock()


def _here():
    return os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("MEMSIM_LIBRARY")
    if env:
        yield env
        return
    try:
        from . import _paths
        yield os.path.normpath(os.path.join(_here(), _paths.LIBDIR_FROM_MODULE,
                                            "libmemsim.so.0"))
    except ImportError:
        pass
    found = ctypes.util.find_library("memsim")
    if found:
        yield found
    # The source tree: tools/python/memsim/ → build/libmemsim.so.0 (the README's build), then
    # the newest other build*/ — never a sanitized one, which an interpreter cannot load.
    yield from _source_tree_builds(os.path.dirname(os.path.dirname(os.path.dirname(_here()))))


def _sanitized(build_dir):
    """Whether meson configured build_dir with a sanitizer (b_sanitize)."""
    try:
        with open(os.path.join(build_dir, "meson-info", "intro-buildoptions.json")) as f:
            for opt in json.load(f):
                if opt.get("name") == "b_sanitize":
                    return opt.get("value") not in (None, "", "none")
    except (OSError, ValueError):
        pass
    return False


def _source_tree_builds(root):
    """The unsanitized libraries of the build folders of a source tree, best first."""
    if not os.path.exists(os.path.join(root, "include", "memsim", "gen.h")):
        return []
    libs = [p for p in glob.glob(os.path.join(root, "build*", "libmemsim.so.0"))
            if not _sanitized(os.path.dirname(p))]
    return sorted(libs, key=lambda p: (os.path.basename(os.path.dirname(p)) != "build",
                                       -os.path.getmtime(p)))


def _load():
    if _lib is not None:
        return _lib
    with _load_lock:
        return _lib if _lib is not None else _load_locked()


def _load_locked():
    global _lib, _glib, _lib_path
    tried = []
    lib = None
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            lib = ctypes.CDLL(path)
            _lib_path = path
            break
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    if lib is None:
        raise Error("cannot find libmemsim (set MEMSIM_LIBRARY to its path); tried: "
                    + ("; ".join(tried) or "nothing"))
    glib = ctypes.CDLL(ctypes.util.find_library("glib-2.0") or "libglib-2.0.so.0")

    def fn(name, restype, *argtypes, owner=lib):
        f = getattr(owner, name)
        f.restype = restype
        f.argtypes = list(argtypes)
        return f

    P = ctypes.c_void_p
    S = ctypes.c_char_p
    B = ctypes.c_int
    fn("g_free", None, P, owner=glib)
    fn("g_error_free", None, ctypes.POINTER(_GError), owner=glib)
    fn("g_strfreev", None, P, owner=glib)
    fn("memsim_run_defaults", _Run)
    fn("memsim_run_clear", None, ctypes.POINTER(_Run))
    fn("memsim_run_set", B, ctypes.POINTER(_Run), S, S, _ERR)
    fn("memsim_run_load_file", B, ctypes.POINTER(_Run), S, _ERR)
    fn("memsim_run_given", B, ctypes.POINTER(_Run), S)
    fn("memsim_run_setting_info", ctypes.POINTER(_RunSettingName), ctypes.c_uint)
    fn("memsim_model_load", P, S, _ERR)
    fn("memsim_model_free", None, P)
    fn("memsim_model_presets", ctypes.POINTER(S))
    fn("memsim_model_name", S, P)
    fn("memsim_model_family", S, P)
    fn("memsim_model_n_params", ctypes.c_int64, P)
    fn("memsim_model_to_json", P, P)
    fn("memsim_estimate", P, P, ctypes.POINTER(_Run), ctypes.POINTER(_EstimateOptions), _ERR)
    fn("memsim_parse_size_of", B, S, S, ctypes.POINTER(ctypes.c_uint64), _ERR)
    fn("memsim_device_capacity", B, ctypes.c_uint64, ctypes.c_uint64,
       ctypes.POINTER(ctypes.c_uint64), _ERR)
    fn("memsim_parse_gpu_mem", B, S, S, ctypes.POINTER(ctypes.c_uint64),
       ctypes.POINTER(S), _ERR)
    fn("memsim_replay_path", P, S, ctypes.POINTER(_ReplayOptions), _ERR)
    fn("memsim_report_to_json", P, P)
    fn("memsim_report_free", None, P)
    fn("memsim_convert", B, S, S, _ERR)
    fn("memsim_run_describe", P, ctypes.POINTER(_Run))
    fn("memsim_generate", P, P, ctypes.POINTER(_Run), _ERR)
    fn("memsim_trace_load", P, S, _ERR)
    fn("memsim_trace_free", None, P)
    if hasattr(lib, "memsim_compare_trace"):  # libraries from before `memsim compare` lack it
        fn("memsim_compare_parse_specs", ctypes.POINTER(S), S, _ERR)
        fn("memsim_compare_trace", P, P, ctypes.POINTER(S), ctypes.POINTER(_ReplayOptions),
           _ERR)
        fn("memsim_comparison_set_device", None, P, ctypes.c_uint64, ctypes.c_uint64)
        fn("memsim_comparison_to_json", P, P)
        fn("memsim_comparison_free", None, P)
    if hasattr(lib, "memsim_plan_options_new"):  # libraries from before plan() lack it
        fn("memsim_plan_options_new", P)
        fn("memsim_plan_options_free", None, P)
        fn("memsim_plan_options_set", B, P, S, S, _ERR)
        fn("memsim_plan_options_use_run", None, P, ctypes.POINTER(_Run))
        fn("memsim_plan", P, P, P, _ERR)
        fn("memsim_plan_to_json", P, P)
        fn("memsim_plan_free", None, P)
        fn("memsim_plan_option_keys", ctypes.POINTER(S))
    if hasattr(lib, "memsim_deepspeed_load_set"):  # libraries from before the configs lack it
        fn("memsim_deepspeed_load_set", P, S, ctypes.POINTER(S), _ERR)
        fn("memsim_deepspeed_sets", B, P, S)
        fn("memsim_deepspeed_apply", B, P, ctypes.POINTER(_Run), _ERR)
        fn("memsim_deepspeed_warnings", ctypes.POINTER(S), P)
        fn("memsim_deepspeed_free", None, P)
    if hasattr(lib, "memsim_megatron_load"):
        fn("memsim_megatron_load", P, S, _ERR)
        fn("memsim_megatron_model", P, P)
        fn("memsim_megatron_apply", None, P, ctypes.POINTER(_Run))
        fn("memsim_megatron_sets", B, P, S)
        fn("memsim_megatron_set_gpus", B, P, B, _ERR)
        fn("memsim_megatron_warnings", ctypes.POINTER(S), P)
        fn("memsim_megatron_alloc_conf", S, P)
        fn("memsim_megatron_free", None, P)
    _glib = glib
    _lib = lib
    return lib


def library_path():
    """The path of the shared library in use (loading it if needed)."""
    _load()
    return _lib_path


def _raise(err):
    """Raises memsim.Error from a GError and frees the GError."""
    if not err:
        raise Error("failed")
    msg = err.contents.message.decode("utf-8", "replace")
    code = err.contents.code
    _glib.g_error_free(err)
    raise Error(msg, code)


def _call(f, *args):
    """Calls a library function whose last argument is GError **; raises on failure."""
    err = ctypes.POINTER(_GError)()
    r = f(*args, ctypes.byref(err))
    if not r:
        _raise(err)
    return r


def _b(s):
    return None if s is None else os.fsencode(s) if isinstance(s, os.PathLike) else \
        str(s).encode("utf-8")


def _size(key, text):
    """A size given as `key` (the command's flag); the error names it as the command's does."""
    out = ctypes.c_uint64()
    _call(_lib.memsim_parse_size_of, _b(key), _b(_value(text)), ctypes.byref(out))
    return out.value


def _gpu_mem(text):
    """A device's memory as a size or a GPU name (memsim_parse_gpu_mem): (bytes, name)."""
    out = ctypes.c_uint64(0)
    name = ctypes.c_char_p()
    _call(_lib.memsim_parse_gpu_mem, b"gpu-mem", _b(_value(text)), ctypes.byref(out),
          ctypes.byref(name))
    return out.value, name.value


def _report_json(rep):
    """The report's JSON as a dict; frees the C string, not the report."""
    s = _lib.memsim_report_to_json(rep)
    try:
        return json.loads(ctypes.string_at(s).decode("utf-8"))
    finally:
        _glib.g_free(s)


def _model_json(m):
    """The model as the command's --json gives it (memsim_model_to_json)."""
    s = _lib.memsim_model_to_json(m)
    try:
        return json.loads(ctypes.string_at(s).decode("utf-8"))
    finally:
        _glib.g_free(s)


def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    return str(v)


# ------------------------------------------------------------------------- the calls ----

def _warn(lines):
    i = 0
    while lines[i]:
        warnings.warn(lines[i].decode("utf-8", "replace"), stacklevel=3)
        i += 1


class _Sources:
    """The run's sources besides the model: a Megatron-LM launch (which gives the model) or a
    DeepSpeed config with overrides, read into the run as the command reads them."""

    def __init__(self, lib, r, gpus, model, megatron_args, deepspeed_config, deepspeed_set):
        self.lib, self.mg, self.ds, self.model = lib, None, None, None
        if megatron_args is not None and model is not None:
            raise Error("--model and --megatron-args: give one (the launch %s describes the "
                        "model)" % _value(megatron_args))
        if megatron_args is None and model is None:
            raise Error("--model (or --megatron-args) is required")
        if deepspeed_set is not None and deepspeed_config is None:
            raise Error("--deepspeed-set needs --deepspeed-config")
        if megatron_args is not None and deepspeed_config is not None:
            raise Error("--megatron-args and --deepspeed-config: give one")
        given = lambda k: lib.memsim_run_given(ctypes.byref(r), _b(k))  # noqa: E731
        if megatron_args is not None:
            self.mg = _call(lib.memsim_megatron_load, _b(_value(megatron_args)))
            _warn(lib.memsim_megatron_warnings(self.mg))
            for k in _setting_names(lib):
                if given(k) and lib.memsim_megatron_sets(self.mg, _b(k)):
                    raise Error("--%s and --megatron-args %s: the launch sets %s itself; give "
                                "one of them" % (k, _value(megatron_args), k))
            if given("gpus"):
                if gpus is None:
                    raise Error("megatron_args with gpus from a run file: give gpus= as a "
                                "keyword")
                _call(lib.memsim_megatron_set_gpus, self.mg, int(gpus))
            lib.memsim_megatron_apply(self.mg, ctypes.byref(r))
            self.model = lib.memsim_megatron_model(self.mg)
        if deepspeed_config is not None:
            sets = [deepspeed_set] if isinstance(deepspeed_set, str) else list(deepspeed_set or [])
            arr = (ctypes.c_char_p * (len(sets) + 1))(*[_b(x) for x in sets], None)
            self.ds = _call(lib.memsim_deepspeed_load_set, _b(_value(deepspeed_config)), arr)
            _warn(lib.memsim_deepspeed_warnings(self.ds))
            for k in _setting_names(lib):
                if given(k) and k != "gpus" and lib.memsim_deepspeed_sets(self.ds, _b(k)):
                    raise Error("--%s and --deepspeed-config %s: the config sets %s itself; give "
                                "one of them" % (k, _value(deepspeed_config), k))
            _call(lib.memsim_deepspeed_apply, self.ds, ctypes.byref(r))

    def alloc_conf(self):
        return self.lib.memsim_megatron_alloc_conf(self.mg) if self.mg else None

    def free(self):
        if self.mg:
            self.lib.memsim_megatron_free(self.mg)
        if self.ds:
            self.lib.memsim_deepspeed_free(self.ds)


def _setting_names(lib):
    out = []
    i = 0
    while True:
        info = lib.memsim_run_setting_info(i)
        if not info:
            return out
        out.append(info.contents.name.decode("utf-8"))
        i += 1


def estimate(model=None, gpu_mem=None, cuda_context=None, nccl_mem=None, allocator=None,
             alloc_conf=None, megatron_args=None, deepspeed_config=None, deepspeed_set=None,
             **run):
    """One run's peak memory on a GPU, as `memsim estimate --json` prints it.

    model: a preset name (see models()) or the path of a Hugging Face config.json.
    gpu_mem, cuda_context, nccl_mem: sizes ("80GiB" or bytes); allocator, alloc_conf:
    strings. megatron_args: a Megatron-LM launch (a command line, shell script or test
    model_config.yaml) instead of model; deepspeed_config: a ds_config.json, deepspeed_set
    its KEY=VALUE overrides (a string or a list). Their warnings are Python warnings.
    run: the run settings, named as the command's flags with underscores for dashes.
    Raises Error on bad input."""
    lib = _load()
    r = lib.memsim_run_defaults()
    m = rep = src = None
    try:
        # In the command's order: the run flags as given, the launch or config, then the
        # sizes, then the model.
        _apply_run(lib, r, run)
        src = _Sources(lib, r, run.get("gpus"), model, megatron_args, deepspeed_config,
                       deepspeed_set)
        conf = _b(alloc_conf) if alloc_conf is not None else src.alloc_conf()
        eo = _EstimateOptions(_b(allocator), conf, 0, _CONTEXT_DEFAULT, 0)
        if gpu_mem is not None:
            eo.gpu_mem, eo.device = _gpu_mem(gpu_mem)
        if cuda_context is not None:
            eo.context_bytes = _size("cuda-context", cuda_context)
        if nccl_mem is not None:
            eo.nccl_bytes = _size("nccl-mem", nccl_mem)
        if src.model is None:
            m = _call(lib.memsim_model_load, _b(_value(model)))
        rep = _call(lib.memsim_estimate, src.model or m, ctypes.byref(r), ctypes.byref(eo))
        out = _report_json(rep)
        out["model"] = _model_json(src.model or m)
        return out
    finally:
        if rep:
            lib.memsim_report_free(rep)
        if m:
            lib.memsim_model_free(m)
        if src:
            src.free()
        lib.memsim_run_clear(ctypes.byref(r))


def _plan_keys(lib):
    """The options of `memsim plan` that are not run settings (memsim_plan_option_keys)."""
    keys = lib.memsim_plan_option_keys()
    out = set()
    i = 0
    while keys[i]:
        out.add(keys[i].decode("utf-8"))
        i += 1
    return out


def plan(model=None, megatron_args=None, deepspeed_config=None, deepspeed_set=None, **kwargs):
    """The fastest configuration that fits, as `memsim plan --json` prints it: the ranked
    "rows", the closest "misses", the "recommended" one, "mig" slices, "notes" and the
    "sweep" figures (whose elapsed_s is the wall time of this call).

    model: a preset name or a config.json path. The plan options are keyword arguments
    named as the command's flags with underscores for dashes: global_batch, gpu_mem, mig,
    methods (a list or "zero3,fsdp"), schedules, checkpointing_modes, max_batch,
    no_expandable, no_offload, top, misses, exhaustive, threads, cuda_context, nccl_mem,
    efficiency, network_gbs; every other keyword is a run setting as for estimate(), the
    cluster among them: gpus, gpu, gpus_per_node. megatron_args, deepspeed_config and
    deepspeed_set as for estimate(). The sweep runs on the library's worker threads with the
    GIL released. Raises Error on bad input."""
    lib = _load()
    if not hasattr(lib, "memsim_plan_options_new"):
        raise Error("this libmemsim has no planner (memsim_plan_options_new)")
    plan_keys = _plan_keys(lib)
    run = {k: v for k, v in kwargs.items() if k.replace("_", "-") not in plan_keys}
    opts = [(k.replace("_", "-"), v) for k, v in kwargs.items()
            if k.replace("_", "-") in plan_keys]
    if megatron_args is not None and "global_batch" in kwargs:
        raise Error("--global-batch and --megatron-args %s: the launch sets the global batch "
                    "itself; give one of them" % _value(megatron_args))
    r = lib.memsim_run_defaults()
    o = lib.memsim_plan_options_new()
    m = p = src = None
    try:
        # In the command's order: the run flags, the launch or config, the plan options,
        # then the model.
        _apply_run(lib, r, run)
        src = _Sources(lib, r, run.get("gpus"), model, megatron_args, deepspeed_config,
                       deepspeed_set)
        lib.memsim_plan_options_use_run(o, ctypes.byref(r))
        for key, v in opts:
            _call(lib.memsim_plan_options_set, o, _b(key), _b(_value(v)))
        if src.model is None:
            m = _call(lib.memsim_model_load, _b(_value(model)))
        p = _call(lib.memsim_plan, src.model or m, o)
        s = lib.memsim_plan_to_json(p)
        try:
            out = json.loads(ctypes.string_at(s).decode("utf-8"))
        finally:
            _glib.g_free(s)
        out["model"] = _model_json(src.model or m)
        return out
    finally:
        if p:
            lib.memsim_plan_free(p)
        if m:
            lib.memsim_model_free(m)
        if src:
            src.free()
        lib.memsim_plan_options_free(o)
        lib.memsim_run_clear(ctypes.byref(r))


def _replay_report(path, allocator=None, alloc_conf=None, capacity=0, verify=False):
    o = _ReplayOptions(_b(allocator), _b(alloc_conf), capacity, bool(verify), False, None)
    rep = _call(_lib.memsim_replay_path, _b(_value(path)), ctypes.byref(o))
    try:
        return _report_json(rep)
    finally:
        _lib.memsim_report_free(rep)


def replay(path, alloc_conf=None, allocator=None, gpu_mem=None, verify=False):
    """Replays a trace (.mst, text, or a PyTorch snapshot pickle), as `memsim replay --json`
    prints it. With alloc_conf, the report of the replay under those settings, with the
    replay under the recorded settings as its "recorded_settings" member (as the command
    prints it). Raises Error on bad input."""
    _load()
    capacity = _gpu_mem(gpu_mem)[0] if gpu_mem is not None else 0
    base = _replay_report(path, allocator, None, capacity, verify)
    if alloc_conf is None:
        return base
    alt = _replay_report(path, allocator, alloc_conf, capacity, False)
    alt["recorded_settings"] = base
    return alt


def _apply_run(lib, r, run):
    """Sets the run settings of keyword arguments on a _Run, in the order given."""
    for key, v in run.items():
        name = key.replace("_", "-")
        if name == "run":
            _call(lib.memsim_run_load_file, ctypes.byref(r), _b(_value(v)))
        else:
            _call(lib.memsim_run_set, ctypes.byref(r), _b(name), _b(_value(v)))


def compare(path=None, allocators="all", model=None, gpu_mem=None, cuda_context=None, **run):
    """One trace through several allocator policies, side by side, as `memsim compare
    --json` prints it: {"source", "capacity", "baseline", "policies": [{"allocator",
    "error", "ranks", "peak_reserved_vs_exact"}, ...]}, one policy per spec in the order
    given. path: a trace file; or path None and model (with run settings) to compare on the
    generated trace of that run. allocators: comma-separated specs, a list, or "all".
    gpu_mem, cuda_context: sizes (cuda_context defaults to 500MiB with a model, 0 with a
    trace file). Raises Error on bad input."""
    lib = _load()
    if not hasattr(lib, "memsim_compare_trace"):
        raise Error("this libmemsim has no policy comparison (memsim_compare_trace)")
    if (model is None) == (path is None):
        raise Error("give one trace file or a model")
    if not isinstance(allocators, str):
        allocators = ",".join(allocators)
    r = lib.memsim_run_defaults()
    m = t = c = specs = None
    try:
        # In the command's order: the run flags, the sizes, the specs, then the trace.
        _apply_run(lib, r, run)
        gpu = _gpu_mem(gpu_mem)[0] if gpu_mem is not None else 0
        ctxb = _CONTEXT_DEFAULT if model is not None else 0
        if cuda_context is not None:
            ctxb = _size("cuda-context", cuda_context)
        specs = _call(lib.memsim_compare_parse_specs, _b(allocators or "all"))
        capacity = ctypes.c_uint64()
        _call(lib.memsim_device_capacity, ctypes.c_uint64(gpu), ctypes.c_uint64(ctxb),
              ctypes.byref(capacity))
        o = _ReplayOptions(None, None, capacity.value, False, False, None, None)
        if model is not None:
            m = _call(lib.memsim_model_load, _b(_value(model)))
            t = _call(lib.memsim_generate, m, ctypes.byref(r))
        else:
            t = _call(lib.memsim_trace_load, _b(_value(path)))
        c = _call(lib.memsim_compare_trace, t, specs, ctypes.byref(o))
        lib.memsim_comparison_set_device(c, gpu, ctxb)
        s = lib.memsim_comparison_to_json(c)
        try:
            out = json.loads(ctypes.string_at(s).decode("utf-8"))
        finally:
            _glib.g_free(s)
        if m:
            # The command names a generated trace after the model and the run.
            d = lib.memsim_run_describe(ctypes.byref(r))
            try:
                out["source"] = "%s, %s" % (lib.memsim_model_name(m).decode("utf-8"),
                                            ctypes.string_at(d).decode("utf-8"))
            finally:
                _glib.g_free(d)
        return out
    finally:
        if c:
            lib.memsim_comparison_free(c)
        if t:
            lib.memsim_trace_free(t)
        if m:
            lib.memsim_model_free(m)
        if specs:
            _glib.g_strfreev(ctypes.cast(specs, ctypes.c_void_p))
        lib.memsim_run_clear(ctypes.byref(r))


def models():
    """The model presets, as `memsim models --json` prints them: a list of the model objects
    of estimate() (name, family, model_type, params, active_params, embedding_params,
    lm_head_params, tied_embeddings; experts, experts_per_token for a mixture of experts),
    each with "parameters" (= params)."""
    lib = _load()
    names = lib.memsim_model_presets()
    out = []
    try:
        i = 0
        while names[i]:
            m = _call(lib.memsim_model_load, names[i])
            d = {"parameters": lib.memsim_model_n_params(m)}
            d.update(_model_json(m))
            out.append(d)
            lib.memsim_model_free(m)
            i += 1
    finally:
        _glib.g_strfreev(ctypes.cast(names, ctypes.c_void_p))
    return out


def convert(src, dst):
    """Converts a trace between formats, chosen by the extension of dst (memsim convert)."""
    lib = _load()
    _call(lib.memsim_convert, _b(_value(src)), _b(_value(dst)))


@contextlib.contextmanager
def record(path, model=None, optimizer=None, inputs=(), **kwargs):
    """Records the PyTorch allocations made inside the `with` block and writes the trace to
    `path` on exit (also when the block raises: the trace of a step that ran out of memory
    is the one worth replaying). Text form; a path ending in .mst is written as text to a
    temporary file, then converted. Yields the Recorder (memsim.recorder.Recorder, i.e.
    tools/python/memsim_record.py; needs torch), whose step() and phase() mark the
    trace:

        with memsim.record("step.mst", model=model, optimizer=opt) as rec:
            with rec.step(1):
                with rec.phase("forward"):   loss = loss_fn(model(x), y)
                with rec.phase("backward"):  loss.backward()
                with rec.phase("optimizer"): opt.step(); opt.zero_grad()
    """
    from .recorder import Recorder
    path = os.fspath(path)
    rec = Recorder(model=model, optimizer=optimizer, inputs=inputs, **kwargs)
    rec.start()
    try:
        yield rec
    finally:
        if path.endswith(".mst"):
            fd, tmp = tempfile.mkstemp(suffix=".txt", prefix=".memsim-record-",
                                       dir=os.path.dirname(os.path.abspath(path)))
            os.close(fd)
            try:
                rec.save(tmp)
                convert(tmp, path)
            finally:
                os.unlink(tmp)
        else:
            rec.save(path)
