"""Rule ``gather-to-split``: Gathers of contiguous disjoint constant ranges on one axis become one Split.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr


def _gather_range(v: View, n: onnx.NodeProto) -> tuple[int, int, bool] | None:
    idx = v.const(n.input[1])
    if idx is None or idx.ndim > 1 or idx.size == 0:
        return None
    dim = (v.shape(n.input[0]) or (None,) * 64)[_gather_axis(v, n)]
    if dim is None:
        return None
    flat = [int(i) + dim if i < 0 else int(i) for i in idx.reshape(-1)]
    if flat != list(range(flat[0], flat[0] + len(flat))):
        return None
    return flat[0], flat[0] + len(flat), idx.ndim == 0


def _gather_axis(v: View, n: onnx.NodeProto) -> int:
    a = attr(n, "axis", 0)
    return a + len(v.shape(n.input[0]) or ()) if a < 0 else a


def _find_gathers(v: View) -> list[Match]:
    groups: dict[tuple[str, int], list[str]] = defaultdict(list)
    for n in v.model.graph.node:
        if n.op_type == "Gather" and v.const(n.input[1]) is not None and v.shape(n.input[0]) is not None:
            groups[(n.input[0], _gather_axis(v, n))].append(n.name)
    return [Match(f"gathers:{names[0]}", tuple(names)) for names in groups.values() if len(names) > 1]


def _check_gathers(v: View, m: Match) -> str | None:
    first = v.nodes[m.nodes[0]]
    if v.const(first.input[0]) is not None:
        return "the data is constant: the Gathers fold at compile time"
    decl = v.declared(first.input[0])
    if decl is None or len(decl) <= _gather_axis(v, first) or decl[_gather_axis(v, first)] is None:
        return "the gathered axis is not static in the model (the Split sizes would be fixed)"
    ranges = []
    for x in m.nodes:
        r = _gather_range(v, v.nodes[x])
        if r is None:
            return f"{x}: indices are not a contiguous constant range"
        ranges.append(r)
    ranges.sort()
    for (a0, a1, _), (b0, b1, _) in zip(ranges, ranges[1:]):
        if b0 < a1:
            return "the index ranges overlap"
    return None


def _rewrite_gathers(v: View, m: Match) -> Change:
    nodes = [v.nodes[x] for x in m.nodes]
    data = nodes[0].input[0]
    axis = _gather_axis(v, nodes[0])
    dim = v.shape(data)[axis]
    spans = sorted((_gather_range(v, n), n) for n in nodes)
    ch = Change(remove={n.name for n in nodes})
    sizes, outs, pos = [], [], 0
    for (a, b, scalar), n in spans:
        if a > pos:
            sizes.append(a - pos)
            outs.append(v.fresh(f"{data}_gap{pos}"))
        sizes.append(b - a)
        if scalar:
            piece = v.fresh(n.output[0] + "_piece")
            an, at = v.init(n.name + "_axis", np.array([axis], dtype=np.int64))
            ch.inits.append(at)
            ch.add.append(helper.make_node("Squeeze", [piece, an], [n.output[0]], name=v.fresh(n.name + "_squeeze")))
            outs.append(piece)
        else:
            outs.append(n.output[0])
        pos = b
    if pos < dim:
        sizes.append(dim - pos)
        outs.append(v.fresh(f"{data}_gap{pos}"))
    sn, st = v.init(f"{data}_split_sizes", np.array(sizes, dtype=np.int64))
    ch.inits.append(st)
    ch.add.append(helper.make_node("Split", [data, sn], outs, name=v.fresh(f"{data}_split"), axis=axis))
    return ch


RULE = Rule("gather-to-split", "Gathers of contiguous disjoint constant ranges on one axis become one Split",
     _find_gathers, _check_gathers, _rewrite_gathers, default=False)
