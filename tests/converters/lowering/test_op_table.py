"""One op table: ``converters/lowering/ops.py`` is the only place that lists ONNX op types.

The source is read (``ast``) for collections of three or more ONNX op-type names (set, list, tuple, dict
keys) outside ``ops.py``; each one found must be on the allow-list below with the reason it stays. A new
hard-coded list fails here with its file, line and the names in it: read the op table instead (or add a
column to it). Op names in messages, single comparisons and tests are not collections and are not
counted.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import onnx.defs
import pytest

from npu_deploy.converters.lowering import ops
from npu_deploy.converters.lowering import support as S

REPO = Path(__file__).resolve().parents[3]
FOLDERS = ("converters", "runtime", "cli", "npu_deploy", "profiling")
ONNX_OPS = frozenset(s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == "")

# "<path>::<assigned name or enclosing function>" -> why it stays outside ops.py
ALLOWED = {
    # layers below the op table (tests/test_layers.py: files and profiling may not import lowering)
    "converters/files/feeds.py::_INDEX_PASSTHROUGH": "files layer, below lowering: ops an index passes through",
    "converters/files/onnx_model.py::_value_dependent": "files layer, below lowering: shape-only producers",
    "profiling/analyze.py::AGNOSTIC_TYPES": "profiling layer (may not import lowering): CANN op types of "
                                            "profiler rows, not ONNX ops",
    "profiling/parse.py::_CANONICAL_TYPES": "profiling layer: canonical spellings of kernel names in profiles",
    # CANN op types read from device files (the names happen to match ONNX ones)
    "converters/lowering/costcheck.py::_TRANSCENDENTAL": "CANN kernel types of profiled rows",
    "converters/lowering/costcheck.py::VECTOR_TYPES": "CANN kernel types of profiled rows",
    "converters/lowering/costcheck.py::_OPS_PER_ELEMENT": "CANN kernel types of profiled rows, with their "
                                                          "instructions per element",
    "converters/lowering/costcheck.py::CLASSES": "cost-check op class labels (Conv, MatMul, Attention, ...), "
                                                 "not op types",
    "converters/lowering/costcheck.py::_COLOURS": "the same class labels, with their plot colours",
    # per-op formulas, each with its own code (a column of the table would be the code itself)
    "converters/lowering/cost.py::op_work": "per-op formula branches of the cost model",
    "converters/optimize/rules/conv1d_to_conv2d.py::_REGION_OPS": "the ops this rule rewrites with code of "
                                                                  "its own (beside the op table's elementwise)",
}


def _name(node: ast.AST) -> str | None:
    """The name a statement gives: an assignment's target, a function's or class's name."""
    if isinstance(node, ast.Assign) and node.targets and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    return None


@functools.lru_cache(maxsize=1)
def op_type_lists() -> list[tuple[str, int, list[str]]]:
    """Every collection literal of >= 3 ONNX op names outside ops.py: (key, line, names); the key is
    ``<path>::<the innermost assignment, function or class around it>``."""
    found = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == "converters/lowering/ops.py":
                continue
            stack = [(ast.parse(path.read_text(encoding="utf-8")), "<module>")]
            while stack:
                node, where = stack.pop()
                if isinstance(node, (ast.Set, ast.List, ast.Tuple, ast.Dict)):
                    elts = node.keys if isinstance(node, ast.Dict) else node.elts
                    names = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in ONNX_OPS]
                    if len(names) >= 3:
                        found.append((f"{rel}::{where}", node.lineno, names))
                inner = _name(node) or where
                stack.extend((c, inner) for c in ast.iter_child_nodes(node))
    return found


def test_no_op_type_lists_outside_the_op_table():
    bad = [f"{k.split('::')[0]}:{line} ({k.split('::')[1]}): {', '.join(names[:6])}"
           + (" ..." if len(names) > 6 else "")
           for k, line, names in op_type_lists() if k not in ALLOWED]
    assert not bad, ("ONNX op types listed outside converters/lowering/ops.py (read the op table, or add "
                     "the list to ALLOWED with its reason):\n  " + "\n  ".join(bad))


def test_allow_list_has_no_stale_entries():
    seen = {k for k, _, _ in op_type_lists()}
    assert not set(ALLOWED) - seen, f"allowed but no longer there: {sorted(set(ALLOWED) - seen)}"


def test_the_scan_finds_a_list():
    """The scan itself: a planted list is found (the test above could pass by finding nothing)."""
    tree = ast.parse('X = {"Relu", "Sigmoid", "Tanh"}')
    node = tree.body[0].value
    assert sum(isinstance(e, ast.Constant) and e.value in ONNX_OPS for e in node.elts) == 3


def test_every_listed_name_is_an_onnx_op():
    """The op table's ONNX columns name real ONNX ops (a typo would silently never match)."""
    sets = {"VIEW_OPS": ops.VIEW_OPS, "FREE_OPS": ops.FREE_OPS, "UNARY_ELEMENTWISE": ops.UNARY_ELEMENTWISE,
            "BINARY_ELEMENTWISE": ops.BINARY_ELEMENTWISE, "ELEMENTWISE": ops.ELEMENTWISE,
            "FORMAT_AGNOSTIC": ops.FORMAT_AGNOSTIC, "CUBE_OPS": ops.CUBE_OPS,
            "MIX_PRECISION_FP32_OPS": ops.MIX_PRECISION_FP32_OPS, "RANDOM_OPS": ops.RANDOM_OPS,
            "NC1HWC0_RANK3_OPS": ops.NC1HWC0_RANK3_OPS, "CANN_OPS": set(ops.CANN_OPS),
            "PARSER_PRIMARY": set(ops.PARSER_PRIMARY), "INT_DATA_INPUTS": set(ops.INT_DATA_INPUTS)}
    wrong = {k: sorted(set(v) - ONNX_OPS) for k, v in sets.items() if set(v) - ONNX_OPS}
    assert not wrong


def test_classes_nest_as_documented():
    assert ops.VIEW_OPS <= ops.FREE_OPS
    assert ops.UNARY_ELEMENTWISE | ops.BINARY_ELEMENTWISE <= ops.ELEMENTWISE
    # FE's C0 refresh list also holds the average poolings (AvgPool, AvgPoolV2): C0 = 8 storage, but not
    # cube ops for precision or cost
    assert ops.CUBE_C0_OPS - {"AveragePool", "GlobalAveragePool"} <= ops.CUBE_OPS
    assert not {"AveragePool", "GlobalAveragePool"} & ops.CUBE_OPS
    # an elementwise op with an axis would not commute with a permutation: none has one in ONNX
    import onnx

    for op in ops.ELEMENTWISE:
        attrs = onnx.defs.get_schema(op).attributes
        assert "axis" not in attrs and "axes" not in attrs and "perm" not in attrs, op
    # Trilu reads the last two axes: format-agnostic for the planner (same layout), never permutation-free
    assert "Trilu" in ops.FORMAT_AGNOSTIC and "Trilu" not in ops.ELEMENTWISE


def test_primary_subgraph_ops_are_in_the_parser_data():
    """PARSER_PRIMARY names an op of the registered subgraph (shared/data/onnx-cann, via support's data)."""
    regs = S._data()["registrations"]["ai.onnx"]
    for op, primary in ops.PARSER_PRIMARY.items():
        subs = {s for _, _, cann, sub in regs.get(op, []) for s in [cann, *sub]}
        assert primary in subs, (op, primary, sorted(subs))


@pytest.mark.parametrize("op, soc, dtype, engine", [
    ("TopK", "Ascend310P3", "float32", "AI CPU"),      # onnx-op-support.md §5: no AI Core op-info for TopK
    ("Abs", "Ascend310P3", "int64", "AI CPU"),         # int64 Abs: AI CPU only (2022 op-info)
    ("Abs", "Ascend310P3", "float16", "AI Core"),
    ("MatMul", "Ascend910B3", "float16", "AI Core"),
])
def test_op_row_engine(op, soc, dtype, engine):
    assert S.op_row(op, soc, dtypes=(dtype,)).engines[dtype][0] == engine


def test_op_row_opsets_and_classes():
    r = S.op_row("Resize", "Ascend910B3")
    assert r.opsets[0][:2] == (10, 18) and r.cann_op == "ResizeBilinearV2" and r.parser_op == "Resize"
    assert S.op_row("Einsum").opsets and S.op_row("Reshape").cost_class == "free"
    assert S.op_row("Gelu", opset=18).engines["float16"][0] == "unsupported"   # ONNX Gelu is opset 20
