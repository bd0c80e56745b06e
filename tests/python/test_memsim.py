"""The Python module (tools/python/memsim) against the command: each call returns exactly the
dict that `memsim CMD --json` prints, and bad input raises memsim.Error with the message the
command prints after "memsim CMD: ".

Run by tests/test_python.c with Debian's /usr/bin/python3, PYTHONPATH=tools/python,
MEMSIM_LIBRARY (the build's shared library) and MEMSIM_BIN (the build's command).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import memsim

BIN = os.environ["MEMSIM_BIN"]
SHARED = os.environ.get("MEMSIM_SHARED_DATA", "")
SNAPSHOT = os.path.join(SHARED, "torch-snapshots",
                        "shreyansh26__MLSys-Experiments__profile_grad.pkl")
# One that ran out of memory: its recorded OOM is part of the report.
SNAPSHOT_OOM = os.path.join(SHARED, "torch-snapshots",
                            "Nesta-gitU__discrete_diffusion__memory_snapshot.json.pickle")


def cli(*args):
    """(exit status, stdout, stderr) of the command."""
    p = subprocess.run([BIN] + [str(a) for a in args], capture_output=True, text=True,
                       check=False)
    return p.returncode, p.stdout, p.stderr


def cli_json(*args):
    rc, out, err = cli(*args, "--json")
    if rc not in (0, 1):
        raise AssertionError("memsim %s: exit %d: %s" % (" ".join(map(str, args)), rc, err))
    return json.loads(out)


def flags(run):
    """Keyword arguments as the command's flags."""
    out = []
    for k, v in run.items():
        name = "--" + k.replace("_", "-")
        if v is True and k == "inference":
            out.append(name)
        elif isinstance(v, (list, tuple)):
            out += [name, ",".join(v)]
        else:
            out += [name, v]
    return out


class Estimate(unittest.TestCase):
    RUNS = [
        ("gpt2", dict(batch=2, seq=256)),
        ("opt-125m", dict(seq=128, finetune="lora", lora_rank=8, checkpointing="full",
                          gpu_mem="16GiB", alloc_conf="expandable_segments:True")),
        ("pythia-410m", dict(seq=128, precision="fp32", optimizer="sgd-momentum",
                             torch_version="1.13", gpu_mem=2 << 30, cuda_context="300MiB")),
        ("gpt2", dict(inference=True, prompt=64, generate=16, batch=4)),
        ("llama-7b", dict(seq=64, finetune="lora", lora_targets=["q_proj", "k_proj"],
                          allocator="exact", gpu_mem="8GiB")),  # does not fit: exit 1
        ("gpt2", dict(seq=128, gpus=2, method="zero2", nccl_mem="200MiB", gpu_mem="16GiB")),
    ]

    def test_same_dict_as_the_command(self):
        for model, run in self.RUNS:
            with self.subTest(model=model, run=run):
                got = memsim.estimate(model, **run)
                want = cli_json("estimate", "--model", model, *flags(run))
                self.assertEqual(got, want)

    def test_launch_and_config(self):
        """A Megatron-LM launch and a DeepSpeed config, as the command reads them."""
        root = os.environ["MEMSIM_SOURCE_ROOT"]
        launch = os.path.join(root, "tests", "data", "megatron", "run.txt")
        ds = os.path.join(root, "tests", "data", "deepspeed", "hf-trainer-zero2-auto.json")
        self.assertEqual(memsim.estimate(megatron_args=launch),
                         cli_json("estimate", "--megatron-args", launch))
        run = dict(seq=128, gpus=2, deepspeed_config=ds,
                   deepspeed_set=["zero_optimization.overlap_comm=false"])
        self.assertEqual(memsim.estimate("opt-125m", **run),
                         cli_json("estimate", "--model", "opt-125m", "--seq", "128", "--gpus",
                                  "2", "--deepspeed-config", ds, "--deepspeed-set",
                                  "zero_optimization.overlap_comm=false"))
        with self.assertRaises(memsim.Error):
            memsim.estimate("gpt2", megatron_args=launch)
        with self.assertRaises(memsim.Error):
            memsim.estimate("opt-125m", deepspeed_set="a=1")
        with self.assertRaises(memsim.Error):  # the launch sets the sequence itself
            memsim.estimate(megatron_args=launch, seq=1024)

    def test_run_file(self):
        with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as f:
            f.write("[run]\nbatch=3\nseq=64\noptimizer=sgd\n")
        try:
            self.assertEqual(memsim.estimate("gpt2", run=f.name, seq=96),
                             cli_json("estimate", "--model", "gpt2", "--run", f.name,
                                      "--seq", "96"))
        finally:
            os.unlink(f.name)

    def assert_same_error(self, cmd, fn, args, *cli_args, exact=True):
        with self.assertRaises(memsim.Error) as cm:
            fn(*args[0], **args[1])
        rc, out, err = cli(cmd, *cli_args)
        self.assertEqual(rc, 2, err)
        prefix = "memsim %s: %s" % (cmd, cm.exception)
        if exact:
            self.assertEqual(err, prefix + "\n")
        else:  # an option's error: the command adds " (see memsim CMD --help)"
            self.assertTrue(err.startswith(prefix), "%r vs %r" % (err, prefix))
        self.assertEqual(str(cm.exception), cm.exception.message)

    def test_errors(self):
        self.assert_same_error("estimate", memsim.estimate, (("gpt2",), dict(precision="fp8")),
                               "--model", "gpt2", "--precision", "fp8", exact=False)
        self.assert_same_error("estimate", memsim.estimate, (("gpt2",), dict(batch=0)),
                               "--model", "gpt2", "--batch", "0", exact=False)
        self.assert_same_error("estimate", memsim.estimate, (("no-such-model",), {}),
                               "--model", "no-such-model")
        self.assert_same_error("estimate", memsim.estimate, (("gpt2",), dict(gpu_mem="80XB")),
                               "--model", "gpt2", "--gpu-mem", "80XB")
        with self.assertRaises(memsim.Error) as cm:
            memsim.estimate("gpt2", no_such_setting=1)
        self.assertIn("no-such-setting", str(cm.exception))


def bad_settings():
    """The rows of tests/data/bad-settings.txt: (command, model, keyword arguments, word)."""
    path = os.path.join(os.environ["MEMSIM_TEST_DATA"], "bad-settings.txt")
    rows = []
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            cmd, args, word = (x.strip() for x in line.split("|"))
            toks = args.split(" ")
            kw, model, i = {}, None, 0
            while i < len(toks):
                key = toks[i][2:].replace("-", "_")
                if i + 1 < len(toks) and not toks[i + 1].startswith("--"):
                    val = "" if toks[i + 1] == "''" else toks[i + 1]
                    i += 2
                else:
                    val, i = True, i + 1
                if key == "model":
                    model = val
                else:
                    kw[key] = val
            rows.append((cmd, model, kw, word))
    return rows


class BadSettings(unittest.TestCase):
    def test_table(self):
        """Every row of the command's bad-settings table raises memsim.Error naming the
        setting, through the module's estimate and plan."""
        rows = bad_settings()
        self.assertGreater(len(rows), 100)
        for cmd, model, kw, word in rows:
            fn = memsim.estimate if cmd == "estimate" else memsim.plan
            with self.subTest(cmd=cmd, kw=kw):
                with self.assertRaises(memsim.Error) as cm:
                    fn(model, **kw)
                self.assertIn(word, str(cm.exception))


def bad_configs():
    """The table of tests/data/bad-configs.txt (its header gives the format), read as
    tests/test_config.c reads it: ([(family, [(field, kind, flags, value)])], {kind: [bad
    value, or None for the field left out]})."""
    path = os.path.join(os.environ["MEMSIM_TEST_DATA"], "bad-configs.txt")
    kinds = ("int", "prob", "frac", "pos", "bool", "act", "type")
    bases, bad, ended = [], {k: [] for k in kinds}, False
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            assert not ended, "a record after end: " + line
            word = line.split("|", 1)[0].strip()
            parts = {"bad": 3, "family": 2, "field": 5}.get(word, 1)
            w = [x.strip() for x in line.split("|", parts - 1)]
            assert len(w) == parts, "bad record: " + line
            if word == "end":
                ended = True
            elif word == "bad":
                assert w[1] in kinds and w[2], "bad record: " + line
                bad[w[1]].append(None if w[2] == "absent" else w[2])
            elif word == "family":
                bases.append((w[1], []))
            elif word == "field":
                assert bases, "a field before any family: " + line
                flags = set() if w[3] == "-" else {x.strip() for x in w[3].split(",")}
                assert w[2] in kinds and flags <= {"req", "null"} and w[1] and w[4], \
                    "bad record: " + line
                bases[-1][1].append((w[1], w[2], flags, w[4]))
            else:
                raise AssertionError("bad record: " + line)
    assert ended, "no end record (the file is cut short)"
    assert all(bad.values()), bad
    return bases, bad


def config_with(fields, name, value):
    """The base config's text with field `name` set to `value` (JSON text, written as it is:
    NaN too), or left out when value is None."""
    pairs = []
    for field, _, _, good in fields:
        v = value if field == name else good
        if v is not None:
            pairs.append('"%s": %s' % (field, v))
    return "{" + ", ".join(pairs) + "}"


class BadConfigs(unittest.TestCase):
    def test_table(self):
        """Every case of the bad-config table (the one tests/test_config.c runs through
        memsim_model_load) raises memsim.Error, a bad-input one naming the field. All of
        them: the module loads configs in-process, so the whole table takes seconds."""
        bases, bad = bad_configs()
        tmp = tempfile.mkdtemp(prefix="memsim-py-")
        cases = 0
        try:
            for family, fields in bases:
                path = os.path.join(tmp, family + ".json")
                with open(path, "w") as f:
                    f.write(config_with(fields, "", None))
                with self.subTest(family=family, base=True):
                    memsim.estimate(path, seq=64)  # the base itself is a good config
                for name, kind, flags, _ in fields:
                    for k, v in enumerate(bad[kind]):
                        if v == "null" and "null" in flags:
                            continue  # null is accepted (Transformers' None)
                        if v is None and "req" not in flags:
                            continue  # left out: only required fields
                        text = config_with(fields, name, v)
                        path = os.path.join(tmp, "%s-%s-%d.json" % (family, name, k))
                        with open(path, "w") as f:
                            f.write(text)
                        with self.subTest(config=text):
                            with self.assertRaises(memsim.Error) as cm:
                                memsim.estimate(path, seq=64)
                            self.assertEqual(cm.exception.code, 0, str(cm.exception))
                            self.assertIn(name, str(cm.exception))
                        cases += 1
        finally:
            shutil.rmtree(tmp)
        # as tests/test_config.c: an empty, truncated or misread table fails (1562 cases)
        self.assertGreaterEqual(cases, 1500)


class Loading(unittest.TestCase):
    def test_source_tree_prefers_the_normal_build(self):
        """In a source tree with build/ and a newer sanitized build-asan/, the module takes
        build/ and never the sanitized library (an interpreter cannot load it)."""
        root = tempfile.mkdtemp()
        try:
            os.makedirs(os.path.join(root, "include", "memsim"))
            open(os.path.join(root, "include", "memsim", "gen.h"), "w").close()
            for name, sanitize in (("build", "none"), ("build-asan", "address,undefined"),
                                   ("build-other", "none")):
                d = os.path.join(root, name)
                os.makedirs(os.path.join(d, "meson-info"))
                with open(os.path.join(d, "meson-info", "intro-buildoptions.json"), "w") as f:
                    json.dump([{"name": "b_sanitize", "value": sanitize}], f)
                open(os.path.join(d, "libmemsim.so.0"), "w").close()
            os.utime(os.path.join(root, "build", "libmemsim.so.0"), (1, 1))
            got = [os.path.basename(os.path.dirname(p))
                   for p in memsim._source_tree_builds(root)]
            self.assertEqual(got, ["build", "build-other"])
        finally:
            shutil.rmtree(root)


class Plan(unittest.TestCase):
    RUNS = [
        ("opt-125m", dict(gpus=2, gpu="a100-40gb", seq=512, methods=["ddp", "zero3"], top=3)),
        ("gpt2", dict(gpus=4, gpu="v100-16gb", seq=256, global_batch=16,
                      checkpointing_modes="none,full", no_expandable=True, threads=1)),
        ("opt-125m", dict(gpus=1, gpu="a100-40gb", seq=256, mig=True, max_batch=8)),
    ]

    @staticmethod
    def timeless(d):
        """The plan without its wall time (the only figure that differs between runs)."""
        d["sweep"].pop("elapsed_s")
        return d

    def test_same_dict_as_the_command(self):
        for model, run in self.RUNS:
            with self.subTest(model=model, run=run):
                args = []
                for k, v in run.items():
                    name = "--" + k.replace("_", "-")
                    if v is True:
                        args.append(name)
                    else:
                        args += [name, ",".join(v) if isinstance(v, list) else v]
                got = self.timeless(memsim.plan(model, **run))
                want = self.timeless(cli_json("plan", "--model", model, *args))
                self.assertEqual(got, want)
                self.assertTrue(got["rows"] or got["mig"])

    def test_errors(self):
        same = Estimate.assert_same_error
        # Zero GPUs, an unknown GPU (the message lists the known ones), a global batch that
        # no layout divides, a bad method word.
        same(self, "plan", memsim.plan, (("gpt2",), dict(gpus=0)), "--model", "gpt2",
             "--gpus", "0", exact=False)
        same(self, "plan", memsim.plan, (("gpt2",), dict(gpus=2, gpu="b200")), "--model",
             "gpt2", "--gpus", "2", "--gpu", "b200", exact=False)
        same(self, "plan", memsim.plan,
             (("gpt2",), dict(gpus=4, global_batch=6, methods="ddp,zero3")), "--model",
             "gpt2", "--gpus", "4", "--global-batch", "6", "--methods", "ddp,zero3")
        same(self, "plan", memsim.plan, (("gpt2",), dict(methods="zero4")), "--model", "gpt2",
             "--methods", "zero4")
        with self.assertRaises(memsim.Error) as cm:
            memsim.plan("gpt2", gpu="b200")
        self.assertIn("h100-80gb", str(cm.exception))


class Replay(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="memsim-py-")
        cls.trace = os.path.join(cls.tmp, "run.mst")
        rc, _, err = cli("gen", "--model", "opt-125m", "--seq", "128", "-o", cls.trace)
        assert rc == 0, err

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_generated_trace(self):
        self.assertEqual(memsim.replay(self.trace), cli_json("replay", self.trace))
        self.assertEqual(memsim.replay(self.trace, allocator="exact"),
                         cli_json("replay", self.trace, "--allocator", "exact"))
        # Too small a device: a simulated OOM (the command exits 1).
        self.assertEqual(memsim.replay(self.trace, gpu_mem="256MiB"),
                         cli_json("replay", self.trace, "--gpu-mem", "256MiB"))
        self.assertEqual(
            memsim.replay(self.trace, alloc_conf="expandable_segments:True"),
            cli_json("replay", self.trace, "--alloc-conf", "expandable_segments:True"))

    def test_snapshot(self):
        if not os.path.exists(SNAPSHOT):
            self.skipTest("real snapshots absent (MEMSIM_SHARED_DATA=%s)" % SHARED)
        got = memsim.replay(SNAPSHOT, verify=True)
        self.assertEqual(got, cli_json("replay", SNAPSHOT, "--verify"))
        self.assertEqual(got["ranks"][0]["verify"]["mismatches"], 0)
        conf = "expandable_segments:True,max_split_size_mb:64"
        self.assertEqual(memsim.replay(SNAPSHOT, alloc_conf=conf, verify=True),
                         cli_json("replay", SNAPSHOT, "--alloc-conf", conf, "--verify"))

    def test_snapshot_oom(self):
        if not os.path.exists(SNAPSHOT_OOM):
            self.skipTest("real snapshots absent (MEMSIM_SHARED_DATA=%s)" % SHARED)
        self.assertEqual(memsim.replay(SNAPSHOT_OOM, verify=True),
                         cli_json("replay", SNAPSHOT_OOM, "--verify"))

    def test_errors(self):
        missing = os.path.join(self.tmp, "missing.mst")
        with self.assertRaises(memsim.Error) as cm:
            memsim.replay(missing)
        self.assertEqual(cli("replay", missing)[2], "memsim replay: %s\n" % cm.exception)
        with self.assertRaises(memsim.Error) as cm:
            memsim.replay(self.trace, allocator="no-such-policy")
        self.assertEqual(cli("replay", self.trace, "--allocator", "no-such-policy")[2],
                         "memsim replay: %s\n" % cm.exception)
        bad = os.path.join(self.tmp, "bad.txt")
        with open(bad, "w") as f:
            f.write("this is not a trace\n")
        with self.assertRaises(memsim.Error) as cm:
            memsim.replay(bad)
        self.assertEqual(cli("replay", bad)[2], "memsim replay: %s\n" % cm.exception)


class Compare(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="memsim-py-")
        cls.trace = os.path.join(cls.tmp, "run.mst")
        rc, _, err = cli("gen", "--model", "gpt2", "--seq", "128", "-o", cls.trace)
        assert rc == 0, err
        cls.has_command = cli("compare", "--help")[0] == 0

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def test_same_dict_as_the_command(self):
        if not self.has_command:
            self.skipTest("this memsim has no compare command")
        for specs in ("torch,exact", "torch,torch:expandable_segments=True,bfc", "all"):
            with self.subTest(allocators=specs):
                self.assertEqual(memsim.compare(self.trace, allocators=specs),
                                 cli_json("compare", self.trace, "--allocators", specs))
        self.assertEqual(memsim.compare(self.trace, allocators=["torch", "exact"],
                                        gpu_mem="1GiB"),
                         cli_json("compare", self.trace, "--allocators", "torch,exact",
                                  "--gpu-mem", "1GiB"))
        run = dict(seq=64, batch=2, finetune="lora")
        self.assertEqual(memsim.compare(model="opt-125m", allocators="torch,buddy",
                                        gpu_mem="8GiB", **run),
                         cli_json("compare", "--model", "opt-125m", "--allocators",
                                  "torch,buddy", "--gpu-mem", "8GiB", *flags(run)))

    def test_shape(self):
        if not self.has_command:
            self.skipTest("this memsim has no compare command")
        got = memsim.compare(self.trace, allocators="torch,exact")
        self.assertEqual([p["allocator"] for p in got["policies"]], ["torch", "exact"])
        for p in got["policies"]:
            self.assertIsNone(p["error"])
            self.assertEqual(p["ranks"], memsim.replay(self.trace, allocator=p["allocator"])
                             ["ranks"])

    def test_errors(self):
        if not self.has_command:
            self.skipTest("this memsim has no compare command")
        with self.assertRaises(memsim.Error) as cm:
            memsim.compare(self.trace, allocators="torch,no-such-policy")
        self.assertEqual(cli("compare", self.trace, "--allocators", "torch,no-such-policy")[2],
                         "memsim compare: %s\n" % cm.exception)
        missing = os.path.join(self.tmp, "missing.mst")
        with self.assertRaises(memsim.Error) as cm:
            memsim.compare(missing)
        self.assertEqual(cli("compare", missing)[2], "memsim compare: %s\n" % cm.exception)
        with self.assertRaises(memsim.Error):
            memsim.compare(self.trace, model="gpt2")


class Models(unittest.TestCase):
    def test_models(self):
        self.assertEqual(memsim.models(), cli_json("models"))


class Record(unittest.TestCase):
    def test_record_and_replay(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        tmp = tempfile.mkdtemp(prefix="memsim-py-")
        try:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                        torch.nn.Linear(128, 8))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.randn(16, 64)
            for name in ("step.txt", "step.mst"):
                path = os.path.join(tmp, name)
                with memsim.record(path, model=model, optimizer=opt, inputs=(x,)) as rec:
                    with rec.step(1):
                        with rec.phase("forward"):
                            loss = model(x).square().mean()
                        with rec.phase("backward"):
                            loss.backward()
                        with rec.phase("optimizer"):
                            opt.step()
                            opt.zero_grad(set_to_none=True)
                    del loss
                got = memsim.replay(path, allocator="exact")
                self.assertEqual(got, cli_json("replay", path, "--allocator", "exact"))
                self.assertGreater(got["ranks"][0]["peak_allocated"], 64 * 128 * 4)
                with open(path, "rb") as f:
                    head = f.read(4)
                # Text starts "memsim-trace"; .mst is a zstd stream.
                want = b"\x28\xb5\x2f\xfd" if name.endswith(".mst") else b"mems"
                self.assertEqual(head, want, name)
            self.assertEqual(sorted(os.listdir(tmp)), ["step.mst", "step.txt"])
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    print("memsim module: %s\nlibrary: %s" % (memsim.__file__, memsim.library_path()))
    result = unittest.main(verbosity=2, exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)
