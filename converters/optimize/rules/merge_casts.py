"""Rule ``merge-casts``: identity Casts dropped, exact Cast chains collapsed, sibling Casts merged.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, _onnx_to_np, attr

# float/int widening chains that lose nothing: a -> b is exact when b holds every value of a
_EXACT = {("float16", "float32"), ("float16", "float64"), ("float32", "float64"), ("bfloat16", "float32"),
          ("bfloat16", "float64"), ("int8", "int16"), ("int8", "int32"), ("int8", "int64"), ("int16", "int32"),
          ("int16", "int64"), ("int32", "int64"), ("uint8", "int16"), ("uint8", "int32"), ("uint8", "int64"),
          ("uint8", "float16"), ("uint8", "float32"), ("int8", "float16"), ("int8", "float32"),
          ("int16", "float32"), ("int32", "float64"), ("bool", "int32"), ("bool", "int64"), ("bool", "float32")}


def _cast_to(n: onnx.NodeProto) -> np.dtype:
    return _onnx_to_np(attr(n, "to"))


def _find_casts(v: View) -> list[Match]:
    out = []
    by_input: dict[tuple[str, int], list[str]] = defaultdict(list)
    for n in v.model.graph.node:
        if n.op_type != "Cast":
            continue
        by_input[(n.input[0], attr(n, "to"))].append(n.name)
        if v.dtype(n.input[0]) == _cast_to(n):
            out.append(Match(f"cast-identity:{n.name}", (n.name,), "identity"))
        c = v.only_consumer(n.output[0])
        if c is not None and c.op_type == "Cast":
            out.append(Match(f"cast-chain:{n.name}", (n.name, c.name), "chain"))
    for (_, _), names in by_input.items():
        if len(names) > 1:
            out.append(Match(f"cast-siblings:{names[0]}", tuple(names), "siblings"))
    return out


def _check_casts(v: View, m: Match) -> str | None:
    if m.data == "identity":
        if v.dtype(v.nodes[m.nodes[0]].input[0]) is None:
            return "input dtype unknown"
        return None
    if m.data == "chain":
        a = v.nodes[m.nodes[0]]
        src, mid = v.dtype(a.input[0]), _cast_to(a)
        if src is None:
            return "input dtype unknown"
        if (src.name, mid.name) not in _EXACT and src != mid:
            return f"the first Cast {src.name} -> {mid.name} rounds or truncates: the chain is not one Cast"
    return None


def _rewrite_casts(v: View, m: Match) -> Change:
    if m.data == "identity":
        n = v.nodes[m.nodes[0]]
        return Change(remove={n.name}, reroute={n.output[0]: n.input[0]})
    if m.data == "chain":
        a, b = v.nodes[m.nodes[0]], v.nodes[m.nodes[1]]
        if v.dtype(a.input[0]) == _cast_to(b):
            return Change(remove={a.name, b.name}, reroute={b.output[0]: a.input[0]})
        return Change(remove={a.name, b.name}, add=[
            helper.make_node("Cast", [a.input[0]], [b.output[0]], name=b.name, to=attr(b, "to"))])
    keep, *drop = (v.nodes[x] for x in m.nodes)
    return Change(remove={d.name for d in drop}, reroute={d.output[0]: keep.output[0] for d in drop})


RULE = Rule("merge-casts", "identity Casts dropped, exact Cast chains collapsed, sibling Casts merged",
     _find_casts, _check_casts, _rewrite_casts)
