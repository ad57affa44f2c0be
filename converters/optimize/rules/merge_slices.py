"""Rule ``merge-slices``: chained Slices on different axes become one.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View


def _slice_params(v: View, n: onnx.NodeProto):
    if len(n.input) < 4 or any(v.const(i) is None for i in n.input[1:] if i):
        return None
    rank = len(v.shape(n.input[0]) or ())
    starts, ends = v.const(n.input[1]), v.const(n.input[2])
    axes = v.const(n.input[3]) if len(n.input) > 3 and n.input[3] else np.arange(len(starts))
    steps = v.const(n.input[4]) if len(n.input) > 4 and n.input[4] else np.ones(len(starts), np.int64)
    axes = [int(a) + rank if a < 0 else int(a) for a in axes]
    return list(starts), list(ends), axes, list(steps)


def _find_slices(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "Slice":
            continue
        c = v.only_consumer(n.output[0])
        if c is not None and c.op_type == "Slice" and c.input[0] == n.output[0]:
            out.append(Match(f"slices:{n.name}", (n.name, c.name)))
    return out


def _check_slices(v: View, m: Match) -> str | None:
    a, b = (_slice_params(v, v.nodes[x]) for x in m.nodes)
    if a is None or b is None:
        return "starts/ends/axes/steps are not all constant (opset >= 10 inputs)"
    if v.shape(v.nodes[m.nodes[0]].input[0]) is None:
        return "input rank unknown"
    if set(a[2]) & set(b[2]):
        return f"both Slices cut axis {sorted(set(a[2]) & set(b[2]))[0]}: not merged (different axes only)"
    return None


def _rewrite_slices(v: View, m: Match) -> Change:
    na, nb = (v.nodes[x] for x in m.nodes)
    a, b = _slice_params(v, na), _slice_params(v, nb)
    names = []
    ch = Change(remove={na.name, nb.name})
    for k, what in enumerate(("starts", "ends", "axes", "steps")):
        name, t = v.init(f"{na.name}_{what}", np.array(a[k] + b[k], dtype=np.int64))
        ch.inits.append(t)
        names.append(name)
    ch.add.append(helper.make_node("Slice", [na.input[0], *names], [nb.output[0]], name=nb.name))
    return ch


RULE = Rule("merge-slices", "chained Slices on different axes become one", _find_slices, _check_slices,
     _rewrite_slices)
