"""Docs that describe code are checked against the code."""

import importlib
import inspect
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _json_doc_rows():
    rows = []
    for line in (REPO / "docs" / "json.md").read_text().splitlines():
        m = re.match(r"\| `(npu-deploy/[a-z-]+)` \| (\d+) \| .* \| `(npu_deploy\.[a-z_.]+)`", line)
        if m:
            rows.append((m.group(1), int(m.group(2)), m.group(3)))
    return rows


def test_every_documented_schema_is_in_its_module():
    rows = _json_doc_rows()
    assert len(rows) >= 10
    for schema, version, module in rows:
        src = inspect.getsource(importlib.import_module(module))
        assert f'"{schema}"' in src, f"{schema} not found in {module}"


def test_every_schema_in_the_code_is_documented():
    documented = {s for s, _, _ in _json_doc_rows()}
    found = set()
    for folder in ("converters", "runtime", "profiling"):
        for path in (REPO / folder).glob("*.py"):
            found |= set(re.findall(r'"(npu-deploy/[a-z-]+)"', path.read_text()))
    assert found <= documented, f"undocumented schemas: {sorted(found - documented)}"
