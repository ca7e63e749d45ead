#!/usr/bin/env python3
"""Layout rules of the workspace that the compiler does not enforce.

No import circle between two files of one crate: if a.rs uses b.rs, b.rs
does not use a.rs (nor through a longer cycle). A crate's `error` module is
left out: its enum names the errors of the modules it wraps (`#[from]`),
which return it in turn; that pair is the one allowed.

(No `std::fs::rename` outside ftpipe-fs is clippy's `disallowed-methods`
in clippy.toml, checked by CI's clippy run.)

Exits 1 listing every violation.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBRARY_CRATES = ["hub", "fetch", "convert", "pipeline", "receipts", "artifact", "formats", "progress", "src"]


def src_root(crate):
    return ROOT / "src" if crate == "src" else ROOT / crate / "src"


def rust_files(crate):
    return sorted(src_root(crate).rglob("*.rs"))


def module_of(path, src_root):
    rel = path.relative_to(src_root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)


def imports(crate):
    root = src_root(crate)
    modules = {}
    for f in rust_files(crate):
        if f.name == "tests.rs" or module_of(f, root) == "error":
            continue
        text = f.read_text()
        text = text.split("#[cfg(test)]\nmod tests")[0]
        text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
        modules[module_of(f, root)] = text
    edges = {m: set() for m in modules}
    for m, text in modules.items():
        parent = m.rsplit("::", 1)[0] if "::" in m else ""
        for path in re.findall(r"\b(crate|super)::((?:[a-z_][a-z0-9_]*::)*[a-z_][a-z0-9_]*)", text):
            base, rest = path
            target = rest if base == "crate" else (f"{parent}::{rest}" if parent else rest)
            parts = target.split("::")
            for i in range(len(parts), 0, -1):
                cand = "::".join(parts[:i])
                if cand in modules and cand != m and not m.startswith(cand + "::") and not cand.startswith(m + "::"):
                    edges[m].add(cand)
                    break
    return edges


def cycles(edges):
    found, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def main():
    problems = []
    for crate in LIBRARY_CRATES:
        for cycle in cycles(imports(crate)):
            problems.append(f"{crate}: import circle: {' -> '.join(c or 'lib' for c in cycle)}")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
