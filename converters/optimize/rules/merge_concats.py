"""Rule ``merge-concats``: chained Concats on the same axis become one.
"""

from __future__ import annotations

import onnx
from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr


def _find_concats(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "Concat":
            continue
        inner = [v.producer.get(i) for i in n.input]
        inner = [p.name for p in inner if p is not None and p.op_type == "Concat"
                 and v.only_consumer(p.output[0]) is n]
        if inner:
            out.append(Match(f"concats:{n.name}", (n.name, *inner)))
    return out


def _norm_axis(v: View, n: onnx.NodeProto) -> int | None:
    a = attr(n, "axis", 0)
    s = v.shape(n.output[0])
    if a < 0:
        return None if s is None else a + len(s)
    return a


def _check_concats(v: View, m: Match) -> str | None:
    outer = v.nodes[m.nodes[0]]
    ax = _norm_axis(v, outer)
    for x in m.nodes[1:]:
        if _norm_axis(v, v.nodes[x]) != ax:
            return f"{x} concatenates on another axis"
    return None


def _rewrite_concats(v: View, m: Match) -> Change:
    outer = v.nodes[m.nodes[0]]
    inner = {v.nodes[x].output[0]: v.nodes[x] for x in m.nodes[1:]}
    ins: list[str] = []
    for i in outer.input:
        ins.extend(inner[i].input if i in inner else [i])
    return Change(remove=set(m.nodes), add=[helper.make_node("Concat", ins, [outer.output[0]], name=outer.name,
                                                             axis=attr(outer, "axis", 0))])


RULE = Rule("merge-concats", "chained Concats on the same axis become one", _find_concats, _check_concats,
     _rewrite_concats)
