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
        for path in (REPO / folder).rglob("*.py"):   # the layers are sub-packages
            found |= set(re.findall(r'"(npu-deploy/[a-z-]+)"', path.read_text()))
    assert found <= documented, f"undocumented schemas: {sorted(found - documented)}"


def _docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])


def test_install_commands_work_from_the_clone():
    """npu-deploy is not on PyPI: every extra is installed from the clone, and the extra exists."""
    import tomllib

    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    text = _docs_text()
    assert "npu-deploy[" not in text
    for extra in re.findall(r"pip install (?:-e )?'\.\[([\w,]+)\]'", text):
        assert set(extra.split(",")) <= extras, extra
    for folder in ("cli", "runtime", "profiling", "npu_deploy"):
        for path in (REPO / folder).rglob("*.py"):
            assert "npu-deploy[" not in path.read_text(encoding="utf-8"), path


def test_coming_from_atc_matches_convert_help(run_cli):
    code, out, _ = run_cli("convert", "--help")
    assert code == 0
    text = (REPO / "docs" / "coming-from.md").read_text(encoding="utf-8")
    both = re.search(r"Honoured by both backends: (.*?)\.", text, re.S).group(1)
    for flag in re.findall(r"`(--\w+)`", both):
        block = out[out.index(flag):out.index(flag) + 200]
        assert "both" in block and "backends" in block, flag
    assert "does not implement these options" not in text


def test_unnamed_node_names_are_as_documented():
    import onnx
    from onnx import helper

    from npu_deploy.converters.files.onnx_model import name_nodes

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="Softmax@0"),
                           helper.make_node("Relu", ["y"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1])])
    name_nodes(g)
    assert [n.name for n in g.node] == ["Softmax@0", "Relu_1"]      # kept; <OpType>_<index>
    for doc in ("debug.md", "internals.md"):
        text = (REPO / "docs" / doc).read_text(encoding="utf-8")
        assert "`<OpType>_<index>`" in text and "Softmax@0" in text, doc
