#!/usr/bin/env python3
"""Fail when the crate's modules import each other in a circle.

    scripts/check-deps.py [SRC]        (default: src)
    scripts/check-deps.py --self-test  (the checker against small trees with known answers)

Two graphs are checked: the top-level modules of the crate (`index`, `registry`, ...), and, inside
each top-level module, its files. An edge A -> B means code in A names a path into B
(`crate::b::...`, `super::b::...`, `self::b::...`, also inside `use` groups). A path into one of A's
own ancestors is not an edge: a child module is a part of its parent (the way Rust splits one
module over several files), so it may use what the parent declares. Test code may reach anywhere:
files named `tests.rs` or `*_tests.rs`, files under a `tests/` folder and `#[cfg(test)] mod`
blocks are skipped. Prints every cycle with the lines that make it and exits 1; prints nothing
and exits 0 when the order is one-directional. See docs/ARCHITECTURE.md for the intended order.
"""

import os
import re
import sys


def is_test_file(rel):
    parts = rel.split(os.sep)
    name = parts[-1]
    return name == "tests.rs" or name.endswith("_tests.rs") or "tests" in parts[:-1]


def module_path(rel):
    parts = rel[: -len(".rs")].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def blank(match):
    # Keep the newlines so that line numbers stay right.
    return re.sub(r"[^\n]", " ", match.group(0))


def code_only(text):
    """The source with comments, string and char literals and test modules blanked out."""
    text = re.sub(r"/\*.*?\*/", blank, text, flags=re.S)
    text = re.sub(r'r(#*)"(?:.|\n)*?"\1', blank, text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', blank, text)
    text = re.sub(r"'(?:\\.|[^'\\])'", blank, text)
    text = re.sub(r"//[^\n]*", blank, text)
    out = list(text)
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        for j in range(m.start(), i):
            if out[j] != "\n":
                out[j] = " "
    return "".join(out)


PATH = re.compile(r"\b(crate|super|self)((?:\s*::\s*(?:[A-Za-z_]\w*|\{))+)")


def expand(tail, text, start):
    """All paths a (possibly grouped) tail stands for: `a::{b, c::{d}}` -> a::b, a::c::d."""
    segs = [s.strip() for s in tail.split("::") if s.strip()]
    if not segs or segs[-1] != "{":
        return [segs]
    prefix = segs[:-1]
    depth, i = 1, start
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    paths = []
    for item in split_top(text[start : i - 1]):
        item = item.split(" as ")[0].strip()
        if not item or item == "*":
            paths.append(prefix)
            continue
        brace = item.find("{")
        if brace >= 0:
            sub = expand(item[: brace + 1], item, brace + 1)
            paths.extend(prefix + p for p in sub)
        else:
            paths.append(prefix + [s.strip() for s in item.split("::") if s.strip()])
    return paths


def split_top(text):
    """Split at the commas that are not inside braces."""
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    return items + [cur]


def use_leaves(tree):
    """(path, name it is known by) of every leaf of a use tree: `a::{b as c, d::{self}}`."""
    tree = tree.strip()
    brace = tree.find("{")
    if brace < 0:
        path, _, alias = tree.partition(" as ")
        segs = [s.strip() for s in path.split("::") if s.strip()]
        return [(segs, alias.strip() or segs[-1])] if segs and segs[-1] != "*" else []
    prefix = [s.strip() for s in tree[:brace].split("::") if s.strip()]
    out = []
    for item in split_top(tree[brace + 1 : tree.rindex("}")]):
        for segs, name in use_leaves(item):
            if segs == ["self"]:
                out.append((prefix, alias_or(name, prefix)))
            else:
                out.append((prefix + segs, name))
    return out


def alias_or(name, prefix):
    return prefix[-1] if name == "self" else name


def absolute(mod, segs):
    """The crate-rooted path that `segs`, written in module `mod`, names."""
    if segs and segs[0] == "crate":
        path, segs = [], segs[1:]
    else:
        path = list(mod)
    for s in segs:
        if s == "super":
            path = path[:-1]
        elif s not in ("self", "{"):
            path.append(s)
    return path


PUB_USE = re.compile(r"\bpub(?:\s*\([^)]*\))?\s+use\s+([^;]+);")


def edges_of(src):
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), src)
            # main.rs is the binary's own crate: it reaches the library by name, not `crate::`.
            if name.endswith(".rs") and not is_test_file(rel) and rel != "main.rs":
                files[module_path(rel)] = rel
    raw = {mod: open(os.path.join(src, rel), encoding="utf-8").read() for mod, rel in files.items()}
    # A module declared `#[cfg(test)] mod x;` is test code wherever its file lives.
    for mod, text in raw.items():
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
            child = mod + (m.group(1),)
            files.pop(child, None)
    texts = {mod: code_only(raw[mod]) for mod in files}
    # What each module re-exports: a path through `index::Watermark` depends on the module that
    # declares `Watermark`, not on `index` (else re-exports from a parent would hide cycles).
    reexports = {}
    for mod, text in texts.items():
        for m in PUB_USE.finditer(text):
            for segs, name in use_leaves(m.group(1)):
                reexports[(mod, name)] = absolute(mod, segs)

    def declaring_module(path):
        for _ in range(16):
            target = ()
            for k in range(len(path), 0, -1):
                if tuple(path[:k]) in files:
                    target = tuple(path[:k])
                    break
            rest = path[len(target) :]
            step = reexports.get((target, rest[0])) if rest else None
            if step is None or step == path[: len(target) + 1]:
                return target
            path = step + rest[1:]
        return target

    edges = {}  # (from, to) -> list of "file:line"
    for mod, rel in files.items():
        text = texts[mod]
        for m in PATH.finditer(text):
            kind = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            for segs in expand(m.group(2), text, m.end()):
                # `super` names the parent module, whether the module is `a/b.rs` or `a/b/mod.rs`.
                base = {"crate": (), "self": mod, "super": mod[:-1]}[kind]
                target = declaring_module(absolute(base, segs))
                # Ancestors (and the module itself) are not dependencies.
                if not target or mod[: len(target)] == target:
                    continue
                where = edges.setdefault((mod, target), [])
                if f"{rel}:{line}" not in where:
                    where.append(f"{rel}:{line}")
    return files, edges


def cycles(nodes, adjacent):
    """Strongly connected components with more than one member (iterative Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(adjacent.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(adjacent.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def problems_in(src):
    """Print every cycle and order violation under `src`; return how many."""
    files, edges = edges_of(src)
    name = lambda m: "::".join(m) or "crate"
    problems = 0

    top = {}
    for (a, b), where in sorted(edges.items()):
        if a and b and a[0] != b[0]:
            lines = [f"{name(a)} -> {name(b)} ({w})" for w in where]
            top.setdefault((a[:1], b[:1]), []).extend(lines)
    adjacent = {}
    for a, b in top:
        adjacent.setdefault(a, set()).add(b)
    for component in cycles({m[:1] for m in files if m}, adjacent):
        problems += 1
        print("cycle between top-level modules:", " <-> ".join(map(name, component)))
        for a in component:
            for b in component:
                whys = top.get((a, b), [])
                for why in whys[:3]:
                    print("   ", why)
                if len(whys) > 3:
                    print(f"    ... and {len(whys) - 3} more from {name(a)} to {name(b)}")

    for first in sorted({m[0] for m in files if m}):
        members = {m for m in files if m and m[0] == first}
        adjacent = {}
        for (a, b) in edges:
            if a in members and b in members:
                adjacent.setdefault(a, set()).add(b)
        for component in cycles(members, adjacent):
            problems += 1
            print(f"cycle inside {first}:", " <-> ".join(map(name, component)))
            for a in component:
                for b in component:
                    for where in edges.get((a, b), [])[:3]:
                        print(f"    {name(a)} -> {name(b)} ({where})")
    return problems + check_documented_order(src, files, edges)


def documented_ranks(lines, whole):
    """Bullet rank of every module linked as [`name`] in a doc's bullets, lowest first. With
    `whole`, every bullet of the doc counts (the crate root); otherwise only the bullets right
    after a line saying "Layers, lowest first" (a module's own order of its children)."""
    rank, bullet, inside = {}, -1, whole
    for line in lines:
        text = line.strip()
        if not whole and "Layers, lowest first" in text:
            inside = True
            continue
        if not inside:
            continue
        if text.startswith("- "):
            bullet += 1
        elif not whole and bullet >= 0 and not text:
            break
        if bullet >= 0:
            for name in re.findall(r"\[`(\w+)`\]", line):
                rank.setdefault(name, bullet)
    return rank


def check_documented_order(src, files, edges):
    """The crate root's doc lists the top-level modules as bullets, lowest first, and a module's
    doc may list its children the same way after "Layers, lowest first": every module (child)
    must be listed, and may use only modules of its own bullet or an earlier one."""
    problems = 0
    for mod in sorted({()} | {m for m in files if m}):
        rel = "lib.rs" if mod == () else os.path.join(*mod, "mod.rs")
        try:
            with open(os.path.join(src, rel), encoding="utf-8") as f:
                doc = [line[3:] for line in f if line.startswith("//!")]
        except FileNotFoundError:
            continue
        rank = documented_ranks(doc, whole=(mod == ()))
        if not rank:
            continue
        depth = len(mod)
        children = {m[depth] for m in files if len(m) > depth and m[:depth] == mod}
        for child in sorted(children):
            if child not in rank:
                problems += 1
                where = "the layout doc of " + os.path.join(src, rel)
                print(f"module {'::'.join(mod + (child,))} is not listed in {where}")
        for (a, b), where in sorted(edges.items()):
            if len(a) <= depth or len(b) <= depth or a[:depth] != mod or b[:depth] != mod:
                continue
            ca, cb = a[depth], b[depth]
            if ca != cb and ca in rank and cb in rank and rank[cb] > rank[ca]:
                problems += 1
                user, used = "::".join(a), "::".join(b)
                print(f"{user} uses {used}, listed after it in {os.path.join(src, rel)} ({where[0]})")
    return problems


SELF_TEST = {
    # name: (files, problems expected)
    "one way": (
        {"lib.rs": "//! - [`a`]\n//! - [`b`]\n", "a.rs": "", "b.rs": "use crate::a::X;"},
        0,
    ),
    "two modules": (
        {
            "lib.rs": "//! - [`a`], [`b`]\n",
            "a.rs": "use crate::b::X;",
            "b.rs": "use crate::a::{Y, Z};",
        },
        1,
    ),
    "through a parent's re-export": (
        {
            "lib.rs": "//! - [`m`]\n",
            "m/mod.rs": "mod x;\nmod y;\npub use x::X;\n",
            "m/x.rs": "use super::y::Y;",
            "m/y.rs": "// crate::m::x is named in a comment only\nuse crate::m::X;",
        },
        1,
    ),
    "a child using its parent": (
        {
            "lib.rs": "//! - [`m`]\n",
            "m/mod.rs": "mod c;\nuse c::C;",
            "m/c.rs": "use super::Parent;",
        },
        0,
    ),
    "test code reaches anywhere": (
        {
            "lib.rs": "//! - [`a`]\n//! - [`b`]\n",
            "a.rs": "#[cfg(test)]\nmod t;\n#[cfg(test)]\nmod inline { use crate::b::X; }",
            "a/t.rs": "use crate::b::X;",
            "b.rs": "use crate::a::X;",
        },
        0,
    ),
    "a use of a later module": (
        {"lib.rs": "//! - [`a`]\n//! - [`b`]\n", "a.rs": "use crate::b::X;", "b.rs": ""},
        1,
    ),
    "an unlisted module": ({"lib.rs": "//! - [`a`]\n", "a.rs": "", "b.rs": ""}, 1),
    "a module's own layers, kept": (
        {
            "lib.rs": "//! - [`m`]\n",
            "m/mod.rs": "//! Layers, lowest first:\n//! - [`low`]\n//! - [`high`]\n//!\n//! - [`low`]\nmod low;\nmod high;\n",
            "m/low/mod.rs": "mod x;",
            "m/low/x.rs": "",
            "m/high.rs": "use crate::m::low::x::X;",
        },
        0,
    ),
    "a module's own layers, broken from a nested file": (
        {
            "lib.rs": "//! - [`m`]\n",
            "m/mod.rs": "//! Layers, lowest first:\n//! - [`low`]\n//! - [`high`]\nmod low;\nmod high;\n",
            "m/low/mod.rs": "mod x;",
            "m/low/x.rs": "use super::super::high::H;",
            "m/high.rs": "",
        },
        1,
    ),
    "a module's child left out of its layers": (
        {
            "lib.rs": "//! - [`m`]\n",
            "m/mod.rs": "//! Layers, lowest first:\n//! - [`low`]\nmod low;\nmod other;\n",
            "m/low.rs": "",
            "m/other.rs": "",
        },
        1,
    ),
}


def self_test():
    import contextlib
    import io
    import tempfile

    failed = 0
    for name, (tree, expected) in SELF_TEST.items():
        with tempfile.TemporaryDirectory() as root:
            for rel, text in tree.items():
                os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
                    f.write(text)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                found = problems_in(root)
        if found != expected:
            failed += 1
            print(f"self-test {name!r}: {found} problem(s), expected {expected}\n{out.getvalue()}")
    return failed


def main():
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(1 if self_test() else 0)
    src = sys.argv[1] if len(sys.argv) > 1 else "src"
    sys.exit(1 if problems_in(src) else 0)


if __name__ == "__main__":
    main()
