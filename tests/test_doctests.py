"""Every example written in a module's docstrings runs and prints what it says (``doctest``).

The examples are the first code a reader copies; this keeps them true as the code moves. Modules are
found by walking the installed package's folders for a ``>>>`` line, so a new example is picked up
without being listed here.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cli", "converters", "runtime", "profiling", "npu_deploy")


def _modules_with_examples() -> list[str]:
    names = []
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if ">>> " not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(parts) if top == "npu_deploy" else "npu_deploy." + ".".join(parts))
    return names


MODULES = _modules_with_examples()


def test_examples_are_found():
    # the walk itself could silently find nothing (a moved folder): the registry's examples must be seen
    assert "npu_deploy.converters.formats" in MODULES and len(MODULES) > 20


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             report=True, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed"
