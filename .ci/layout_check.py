#!/usr/bin/env python3
"""Layout rules of the workspace that the compiler does not enforce.

1. No import circle between two files of one crate: if a.rs uses b.rs,
   b.rs does not use a.rs (nor through a longer cycle). A crate's `error`
   module is left out: its enum names the errors of the modules it wraps
   (`#[from]`), which return it in turn; that pair is the one allowed.
2. No function body over MAX_FN_LINES lines outside tests, fixtures and
   fuzzing: a function is read in one screen.
3. `src/main.rs` at most MAX_MAIN_LINES lines: it parses and dispatches;
   the commands live in `src/cli/`.
4. `ftpipe-fetch` has no direct `object_store` dependency: object storage
   sits behind the source seam, in `ftpipe-objstore`.

(No `std::fs::rename` outside ftpipe-fs is clippy's `disallowed-methods`
in clippy.toml, checked by CI's clippy run.)

Exits 1 listing every violation.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBRARY_CRATES = ["hub", "fetch", "convert", "pipeline", "receipts", "artifact", "formats", "progress", "objstore", "secrets", "fs", "src"]


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


MAX_FN_LINES = 100
MAX_MAIN_LINES = 400
# Test support and fuzz targets are not held to the function length.
LONG_FN_EXEMPT = {"fixtures", "fuzz", "fuzzing", "tests", "target"}
FN_START = re.compile(
    r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+([A-Za-z0-9_]+)"
)


def code_only(line):
    """A line without its comment, strings and char literals (for braces)."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return re.sub(r"//.*", "", line)


def without_test_module(lines):
    for i, line in enumerate(lines):
        if line.startswith("#[cfg(test)]") and i + 1 < len(lines) and lines[i + 1].startswith("mod tests"):
            return lines[:i]
    return lines


def function_spans(lines):
    """(name, first line index, line count) of every fn with a body."""
    i = 0
    while i < len(lines):
        m = FN_START.match(lines[i])
        if not m:
            i += 1
            continue
        depth, opened, j = 0, False, i
        while j < len(lines):
            code = code_only(lines[j])
            if not opened and ";" in code and "{" not in code:
                break
            for ch in code:
                if ch == "{":
                    depth, opened = depth + 1, True
                elif ch == "}":
                    depth -= 1
            if opened and depth <= 0:
                break
            j += 1
        if opened:
            yield m.group(7), i, j - i + 1
            i = j + 1
        else:
            i += 1


def long_functions():
    found = []
    for f in sorted(ROOT.rglob("*.rs")):
        rel = f.relative_to(ROOT)
        if rel.parts[0] in LONG_FN_EXEMPT or f.name == "tests.rs" or "tests" in rel.parts:
            continue
        lines = without_test_module(f.read_text().splitlines())
        for name, start, count in function_spans(lines):
            if count > MAX_FN_LINES:
                found.append(f"{rel}:{start + 1}: fn {name} is {count} lines (at most {MAX_FN_LINES}: split it into named steps)")
    return found


def main_rs_length():
    count = len((ROOT / "src" / "main.rs").read_text().splitlines())
    if count > MAX_MAIN_LINES:
        return [f"src/main.rs: {count} lines (at most {MAX_MAIN_LINES}: commands belong in src/cli/)"]
    return []


def fetch_dependencies():
    manifest = (ROOT / "fetch" / "Cargo.toml").read_text()
    if re.search(r"^object_store\b", manifest, re.M):
        return ["fetch/Cargo.toml: ftpipe-fetch depends on object_store directly (object storage belongs behind the source seam, in ftpipe-objstore)"]
    return []


def main():
    problems = long_functions() + main_rs_length() + fetch_dependencies()
    for crate in LIBRARY_CRATES:
        for cycle in cycles(imports(crate)):
            problems.append(f"{crate}: import circle: {' -> '.join(c or 'lib' for c in cycle)}")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
