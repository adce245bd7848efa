#!/usr/bin/env python3
"""Which of the C core's files use which, and the circles they form.

A file is a name of agent/csrc with its .c, its .h or both (sync.h and
compat.h are files of their own).  The symbols each object file of a build
needs (``nm``: the LTO plugin lists the IR's symbols) are mapped to the
object file that defines them, through the header that declares them when
that is another file's: a call to hw_lock_contended(), declared in sync.h,
is a use of sync, and sync uses whatever defines it.  The strongly connected
components of that graph are the circles: files that all depend on each
other.  Shared variables count, as a call does; ``--functions`` leaves them
out.  Functions a header inlines are its includers' uses (nm sees them there).

Usage: ``python tools/c_call_graph.py [--functions] [--edges] [--csrc DIR]
[OBJDIR]``, OBJDIR holding the objects of agent/csrc (by default the newest
under build/), DIR the sources they were built from (by default this tree's
agent/csrc: give another tree's to measure its build).  The graph depends
on the Python the objects were built for: reftracer.c is empty before 3.13.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "agent" / "csrc"
FUNCTIONS = set("TtWw")


def newest_objdir() -> Path:
    dirs = {p.parent for p in ROOT.glob("build/*/temp*/agent/csrc/*.o")}
    if not dirs:
        sys.exit("no object files under build/: run `make install` first")
    return max(dirs, key=lambda d: max(o.stat().st_mtime for o in d.glob("*.o")))


def symbols(obj: Path) -> list[tuple[str, str]]:
    """(kind, name) of every symbol, as nm prints them."""
    out = subprocess.run(["nm", str(obj)], check=True, capture_output=True, text=True).stdout
    return [(f[-2], f[-1]) for f in map(str.split, out.splitlines()) if len(f) >= 2]


def top_level(source: str) -> str:
    """A header's text outside comments, directives and braces: its declarations."""
    source = re.sub(r"/\*.*?\*/|//[^\n]*", " ", source, flags=re.S)
    source = re.sub(r"^\s*#(?:[^\n]*\\\n)*[^\n]*", " ", source, flags=re.M)
    depth, kept = 0, []
    for ch in source:
        depth += (ch == "{") - (ch == "}")
        if depth == 0 and ch != "}":
            kept.append(ch)
    return "".join(kept)


def graph(objdir: Path, csrc: Path, functions_only: bool) -> dict[str, set[str]]:
    defined: dict[str, str] = {}
    needed: dict[str, set[str]] = {}
    for obj in sorted(objdir.glob("*.o")):
        needed[obj.stem] = set()
        for kind, name in symbols(obj):
            if kind == "U":
                needed[obj.stem].add(name)
            elif kind != "w" and (not functions_only or kind in FUNCTIONS):
                defined[name] = obj.stem
    declared: dict[str, str] = {}
    for header in sorted(csrc.glob("*.h")):
        for name in re.findall(r"\w+", top_level(header.read_text())):
            if name in defined:
                declared.setdefault(name, header.stem)
    edges: dict[str, set[str]] = {p.stem: set() for p in csrc.glob("*.[ch]")}
    for user, names in needed.items():
        for name in names & defined.keys():
            definer = defined[name]
            via = declared.get(name, definer)
            edges[user].add(via)
            edges[via].add(definer)
    return {user: used - {user} for user, used in edges.items()}


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, without recursion."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        work = [(root, iter(sorted(edges[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in stack:
                low[node] = min(low[node], index[child])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("objdir", nargs="?", type=Path)
    parser.add_argument("--functions", action="store_true", help="calls only, no variables")
    parser.add_argument("--edges", action="store_true", help="print what each file uses")
    parser.add_argument("--csrc", type=Path, default=CSRC, help="the sources of OBJDIR")
    args = parser.parse_args()
    objdir = args.objdir or newest_objdir()
    edges = graph(objdir, args.csrc, args.functions)
    print(f"{objdir}: {len(edges)} files, {sum(map(len, edges.values()))} uses")
    if args.edges:
        for user in sorted(edges):
            print(f"  {user:12} {' '.join(sorted(edges[user])) or '-'}")
    circles = sorted((c for c in components(edges) if len(c) > 1), key=len, reverse=True)
    for circle in circles:
        print(f"circle of {len(circle)}: {' '.join(circle)}")
    if not circles:
        print("no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
