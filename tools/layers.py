#!/usr/bin/env python3
"""The floors of memsim's source tree, and what uses what.

    tools/layers.py [--build BUILD_DIR] [--graph]

Reads every `#include` of the C sources and headers under include/, formats/, sim/, traces/
and tools/ and, with --build, the symbols each object file of the library defines and uses
(`nm`), so that a call through a header shared by several files counts too. Then it checks
the one-way rule of the source tree (README.md, "Layout"):

    floor 0  include/memsim/     the public API                    uses nothing of memsim
    floor 1  formats/            the trace contract, files          include
    floor 2  sim/                replay, allocator policies, exports formats
    floor 3  traces/             the generator                      formats
             traces/estimate/,   the estimate and the planner       formats, sim, the generator
             traces/plan/
    floor 4  tools/              the command, bench, Python module  the public API only

and that no two files use each other, directly or round a circle. It prints every arrow that
breaks the rule and every circle, and exits 1 if there is any; --graph also prints the
file-to-file arrows, folder by folder.
"""

import argparse
import collections
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIRS = ["include", "formats", "sim", "traces", "tools"]
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def part_of(path):
    """The part of the house a source path (relative to the root) belongs to."""
    if path.startswith("include/memsim/"):
        return "api"
    top = path.split("/", 1)[0]
    if top == "traces":
        sub = path.split("/")[1] if path.count("/") > 1 else ""
        return "traces-top" if sub in ("estimate", "plan") else "generator"
    return top


# part → the parts it may use (besides itself)
MAY_USE = {
    "api": set(),
    "formats": {"api"},
    "sim": {"api", "formats"},
    "generator": {"api", "formats"},
    "traces-top": {"api", "formats", "sim", "generator"},
    "tools": {"api"},
}


def sources():
    for d in SOURCE_DIRS:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, d)):
            dirnames[:] = [x for x in dirnames if not x.startswith(".")]
            for f in files:
                if f.endswith((".c", ".h")):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


def resolve(src, kind, name, known):
    """The source file an include names, or None (a system header)."""
    if kind == "<":
        cand = "include/" + name
        return cand if cand in known else None
    for cand in (os.path.normpath(os.path.join(os.path.dirname(src), name)), name,
                 "include/" + name):
        if cand in known:
            return cand
    return None


def include_edges(files):
    known = set(files)
    edges = collections.defaultdict(set)
    for src in files:
        with open(os.path.join(ROOT, src), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for kind, name in INCLUDE_RE.findall(text):
            dst = resolve(src, kind, name, known)
            if dst and dst != src:
                edges[src].add(dst)
    return edges


def object_source(obj_name, files):
    """libmemsim.so.p/sim_alloc_torch.c.o → sim/alloc/torch.c (meson joins with '_')."""
    stem = obj_name[:-2] if obj_name.endswith(".o") else obj_name
    for f in files:
        if f.endswith(".c") and f.replace("/", "_") == stem:
            return f
    return None


def symbol_edges(build, files):
    """Calls and data uses between the library's files, from the objects' symbol tables."""
    objdir = None
    for d in os.listdir(build):
        if d.startswith("libmemsim.so") and d.endswith(".p"):
            objdir = os.path.join(build, d)
    if not objdir:
        sys.exit(f"layers: no libmemsim.so objects under {build}")
    defs, uses = {}, collections.defaultdict(set)
    for o in sorted(os.listdir(objdir)):
        if not o.endswith(".o"):
            continue
        src = object_source(o, files)
        if not src:
            continue  # generated code (protobuf, resources)
        out = subprocess.run(["nm", os.path.join(objdir, o)], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDBRVW":
                defs[p[2]] = src
            elif len(p) == 2 and p[0] == "U":
                uses[src].add(p[1])
    edges = collections.defaultdict(dict)
    for src, syms in uses.items():
        for s in sorted(syms):
            dst = defs.get(s)
            if dst and dst != src:
                edges[src].setdefault(dst, s)
    return edges


def circles(nodes, edges):
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", help="a build directory: also check the objects' symbols")
    ap.add_argument("--graph", action="store_true", help="print the arrows between folders")
    args = ap.parse_args()
    files = sorted(sources())
    inc = include_edges(files)
    sym = symbol_edges(args.build, files) if args.build else {}
    edges = collections.defaultdict(set)
    why = {}
    for a, bs in inc.items():
        for b in bs:
            edges[a].add(b)
            why.setdefault((a, b), "includes")
    for a, bs in sym.items():
        for b, s in bs.items():
            edges[a].add(b)
            why[(a, b)] = why.get((a, b), f"uses {s}") if (a, b) in why else f"uses {s}"
    bad = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            pa, pb = part_of(a), part_of(b)
            if pa != pb and pb not in MAY_USE[pa]:
                bad.append(f"{a} ({pa}) -> {b} ({pb}): {why[(a, b)]}")
    loops = circles(set(files), edges)
    if args.graph:
        folders = collections.Counter()
        for a in edges:
            for b in edges[a]:
                fa, fb = os.path.dirname(a), os.path.dirname(b)
                if fa != fb:
                    folders[(fa, fb)] += 1
        for (fa, fb), n in sorted(folders.items()):
            print(f"{fa} -> {fb}: {n}")
    n_edges = sum(len(v) for v in edges.values())
    print(f"{len(files)} files, {n_edges} arrows ({sum(len(v) for v in inc.values())} includes"
          f"{', symbol uses from ' + args.build if args.build else ''}): "
          f"{len(bad)} against the floors, {len(loops)} circles")
    for line in bad:
        print("against the floors: " + line)
    for c in loops:
        print("circle: " + " <-> ".join(c))
    return 1 if bad or loops else 0


if __name__ == "__main__":
    sys.exit(main())
