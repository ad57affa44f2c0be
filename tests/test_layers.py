"""The layers of the package, read from the source: who may import whom, no cycles, every folder installed.

The rule table is the architecture of ``docs/internals.md`` ("Layers"); a new import across it fails
here with the module, line and layer named. Imports inside functions count as much as those at the top
(an import hidden in a function is still a dependency, and can still close a cycle).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_TIMEOUT

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"npu_deploy": "npu_deploy", "cli": "npu_deploy.cli", "converters": "npu_deploy.converters",
           "runtime": "npu_deploy.runtime", "profiling": "npu_deploy.profiling"}

# layer -> the layers it may import (besides itself). "base" is npu_deploy's own small modules
# (errors, _io, _result, _text, ...). Most specific prefix wins.
LAYERS = {
    "npu_deploy.converters.formats": {"base"},
    "npu_deploy.converters.files": {"base", "npu_deploy.converters.formats"},
    "npu_deploy.converters.lowering": {"base", "npu_deploy.converters.formats", "npu_deploy.converters.files"},
    "npu_deploy.converters.optimize": {"base", "npu_deploy.converters.formats", "npu_deploy.converters.files",
                                       "npu_deploy.converters.lowering"},
    "npu_deploy.converters": {"base"},
    "npu_deploy.runtime": {"base", "npu_deploy.converters.formats", "npu_deploy.converters.files",
                           "npu_deploy.converters.lowering"},
    "npu_deploy.runtime.check": {"base", "npu_deploy.converters.formats", "npu_deploy.converters.files",
                                 "npu_deploy.converters.lowering", "npu_deploy.runtime"},
    "npu_deploy.runtime.distributed": {"base", "npu_deploy.converters.formats", "npu_deploy.converters.files",
                                       "npu_deploy.runtime"},
    "npu_deploy.profiling": {"base", "npu_deploy.converters.formats", "npu_deploy.converters.files"},
    # `profile run`: convert, run on the emulator (or msprof on a device), then analyse
    "npu_deploy.profiling.run": {"base", "npu_deploy.converters.formats", "npu_deploy.converters.files",
                                 "npu_deploy.converters.lowering", "npu_deploy.runtime", "npu_deploy.profiling"},
    "npu_deploy.cli": {"*"},
    # the public faces: lazy names over the layers (npu_deploy/__init__.py, npu_deploy/distributed.py)
    "npu_deploy": {"*"},
    "npu_deploy.distributed": {"base", "npu_deploy.runtime.distributed"},
}
BASE = {"npu_deploy.errors", "npu_deploy._io", "npu_deploy._result", "npu_deploy._text", "npu_deploy._thresholds",
        "npu_deploy._version", "npu_deploy._display", "npu_deploy._ray", "npu_deploy._html",
        "npu_deploy._cbuild"}


def modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in FOLDERS.items():
        for p in sorted((REPO / folder).rglob("*.py")):
            parts = list(p.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = p
    return out


MODULES = modules()


def layer_of(mod: str) -> str:
    if mod in BASE:
        return "base"
    best = max((k for k in LAYERS if mod == k or mod.startswith(k + ".")), key=len, default=None)
    assert best is not None, f"{mod} belongs to no layer: add it to LAYERS in tests/test_layers.py"
    return best


def first_party_imports(mod: str, path: Path) -> list[tuple[str, int]]:
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = mod.split(".") if is_pkg else mod.split(".")[:-1]
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub if sub in MODULES else base, node.lineno))
    out = []
    for name, line in found:
        if not name.startswith("npu_deploy"):
            continue
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name != mod:
            out.append((name, line))
    return out


GRAPH = {m: first_party_imports(m, p) for m, p in MODULES.items()}


def test_every_import_follows_the_layers():
    wrong = []
    for mod, deps in GRAPH.items():
        here = layer_of(mod)
        allowed = LAYERS.get(here, set()) if here != "base" else {"base"}
        for dep, line in deps:
            there = layer_of(dep)
            if there == here or "*" in allowed or there in allowed:
                continue
            wrong.append(f"{MODULES[mod].relative_to(REPO)}:{line}: {mod} ({here}) imports {dep} ({there})")
    assert not wrong, "imports across the layers:\n" + "\n".join(wrong)


def test_nothing_imports_the_cli():
    users = [f"{m} imports {d}" for m, deps in GRAPH.items() if not m.startswith("npu_deploy.cli")
             for d, _ in deps if d.startswith("npu_deploy.cli")]
    assert not users


def test_no_import_cycles():
    # Tarjan's strongly connected components over every first-party import (function-level ones too)
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _ in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_a_cycle_is_seen_by_the_checker(tmp_path):
    """The cycle check can fail: two modules that import each other inside functions form a cycle."""
    global GRAPH
    saved = GRAPH
    GRAPH = dict(saved)
    GRAPH["npu_deploy.converters.lowering.convert"] = [*saved["npu_deploy.converters.lowering.convert"],
                                                        ("npu_deploy.converters.lowering.pipeline", 1)]
    GRAPH["npu_deploy.converters.lowering.pipeline"] = [*saved["npu_deploy.converters.lowering.pipeline"],
                                                         ("npu_deploy.converters.lowering.convert", 1)]
    try:
        with pytest.raises(AssertionError, match="import cycles"):
            test_no_import_cycles()
    finally:
        GRAPH = saved


def test_every_package_folder_is_installed_and_documented():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    conf = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(conf["tool"]["setuptools"]["packages"])
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert packages == listed, f"pyproject lists {sorted(listed - packages)} / misses {sorted(packages - listed)}"
    for m in packages:
        doc = ast.get_docstring(ast.parse(MODULES[m].read_text(encoding="utf-8")))
        assert doc and m.split(".")[-1] in doc.split(":")[0] + m, f"{m}: its __init__ needs a docstring saying what it holds"
    for folder in ("converters", "runtime"):  # no folder of code without an __init__.py (it would not be installed)
        for d in (REPO / folder).rglob("*"):
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")):
                assert (d / "__init__.py").is_file(), f"{d.relative_to(REPO)} holds modules but is no package"


def test_import_from_the_repository_root_gives_the_whole_package():
    """Run from the checkout's root (where ./npu_deploy/ is found first), every sub-package imports and is
    the checkout's own file, whichever way the package was installed."""
    code = ("import npu_deploy, npu_deploy.runtime.session, npu_deploy.converters.lowering.convert, "
            "npu_deploy.runtime.check.compare, npu_deploy.cli.main, npu_deploy.profiling.analyze;"
            "from npu_deploy import InferenceSession, convert;"
            "print(npu_deploy.runtime.session.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, timeout=TEST_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve() == (REPO / "runtime" / "session.py").resolve()
