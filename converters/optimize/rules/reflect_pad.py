"""Rule ``reflect-pad``: reflect-mode Pad becomes Slice (reversed) + Concat: reflect Pad is slow on the NPU.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr


def _find_reflect(v: View) -> list[Match]:
    return [Match(f"reflect:{n.name}", (n.name,)) for n in v.model.graph.node
            if n.op_type == "Pad" and attr(n, "mode", b"constant") in (b"reflect", "reflect")]


def _check_reflect(v: View, m: Match) -> str | None:
    n = v.nodes[m.nodes[0]]
    if len(n.input) < 2 or v.const(n.input[1]) is None:
        return "pads are not a constant input (opset >= 11)"
    if len(n.input) > 3 and n.input[3]:
        return "Pad with an axes input"
    pads = v.const(n.input[1])
    shape = v.shape(n.input[0])
    if shape is None:
        return "input shape unknown"
    if (pads < 0).any():
        return "negative pads (cropping)"
    r = len(shape)
    for a in range(r):
        if pads[a] >= shape[a] or pads[a + r] >= shape[a]:
            return f"pad on axis {a} is not smaller than the axis"
    return None


def _rewrite_reflect(v: View, m: Match) -> Change:
    n = v.nodes[m.nodes[0]]
    pads = v.const(n.input[1]).astype(np.int64)
    r = len(pads) // 2
    ch = Change(remove={n.name})
    cur = n.input[0]
    for a in range(r):
        b, e = int(pads[a]), int(pads[a + r])
        if not b and not e:
            continue
        parts = []

        def rev(start: int, end: int, tag: str) -> str:
            names = []
            for what, val in (("s", start), ("e", end), ("a", a), ("st", -1)):
                nm, t = v.init(f"{n.name}_{tag}{a}_{what}", np.array([val], dtype=np.int64))
                ch.inits.append(t)
                names.append(nm)
            out = v.fresh(f"{n.name}_{tag}{a}")
            ch.add.append(helper.make_node("Slice", [cur, *names], [out], name=v.fresh(f"{n.name}_{tag}{a}")))
            return out

        if b:
            parts.append(rev(b, 0, "left"))      # x[b], x[b-1], ..., x[1]
        parts.append(cur)
        if e:
            parts.append(rev(-2, -e - 2, "right"))  # x[n-2], ..., x[n-e-1]
        out = v.fresh(f"{n.name}_axis{a}")
        ch.add.append(helper.make_node("Concat", parts, [out], name=v.fresh(f"{n.name}_concat{a}"), axis=a))
        cur = out
    ch.add.append(helper.make_node("Identity", [cur], [n.output[0]], name=v.fresh(n.name + "_out")))
    return ch


RULE = Rule("reflect-pad", "reflect-mode Pad becomes Slice (reversed) + Concat: reflect Pad is slow on the NPU",
     _find_reflect, _check_reflect, _rewrite_reflect)
