"""Rule ``remove-empty-slices``: empty Slices feeding a Concat removed (the device Concat rejects them).
"""

from __future__ import annotations

from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr


def _find_empty_slices(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type == "Concat":
            empty = [i for i in n.input if 0 in (v.declared(i) or ()) and v.producer.get(i) is not None
                     and v.producer[i].op_type == "Slice"]
            if empty:
                out.append(Match(f"empty-slices:{n.name}", (n.name,), tuple(empty)))
    return out


def _check_empty_slices(v: View, m: Match) -> str | None:
    n = v.nodes[m.nodes[0]]
    if len(n.input) - len(m.data) < 1:
        return "every input of the Concat is empty"
    return None


def _rewrite_empty_slices(v: View, m: Match) -> Change:
    n = v.nodes[m.nodes[0]]
    ins = [i for i in n.input if i not in m.data]
    ch = Change(remove={n.name}, add=[helper.make_node("Concat", ins, [n.output[0]], name=n.name,
                                                       axis=attr(n, "axis", 0))])
    for e in m.data:
        if v.only_consumer(e) is n:
            ch.remove.add(v.producer[e].name)
    return ch


RULE = Rule("remove-empty-slices", "empty Slices feeding a Concat removed (the device Concat rejects them)",
     _find_empty_slices, _check_empty_slices, _rewrite_empty_slices, default=False)
