"""Rule ``cancel-transpose-reshape``: Transpose pairs composed or cancelled, Reshape chains collapsed, identity
Transpose/Reshape dropped.
"""

from __future__ import annotations

from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr


def _find_cancel(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type == "Transpose":
            p = v.producer.get(n.input[0])
            if p is not None and p.op_type == "Transpose" and v.only_consumer(p.output[0]) is n:
                out.append(Match(f"transposes:{n.name}", (p.name, n.name), "transposes"))
            perm = attr(n, "perm")
            if perm is not None and list(perm) == list(range(len(perm))):
                out.append(Match(f"transpose-identity:{n.name}", (n.name,), "transpose-identity"))
        elif n.op_type == "Reshape":
            p = v.producer.get(n.input[0])
            if p is not None and p.op_type == "Reshape" and v.only_consumer(p.output[0]) is n:
                out.append(Match(f"reshapes:{n.name}", (p.name, n.name), "reshapes"))
            s_in, s_out = v.declared(n.input[0]), v.declared(n.output[0])
            if s_in is not None and None not in s_in and s_in == s_out:
                out.append(Match(f"reshape-identity:{n.name}", (n.name,), "reshape-identity"))
    return out


def _check_cancel(v: View, m: Match) -> str | None:
    if m.data == "reshapes":
        second = v.nodes[m.nodes[1]]
        s = v.const(second.input[1])
        if s is None:
            return "the second Reshape's target is computed at run time"
        if 0 in s.tolist() and not attr(second, "allowzero", 0):
            return "the second Reshape copies a dimension (0) from the first one's output"
    if m.data == "reshape-identity" and v.const(v.nodes[m.nodes[0]].input[1]) is None \
            and v.model.graph.input and False:
        return "dynamic target"
    return None


def _rewrite_cancel(v: View, m: Match) -> Change:
    if m.data in ("transpose-identity", "reshape-identity"):
        n = v.nodes[m.nodes[0]]
        return Change(remove={n.name}, reroute={n.output[0]: n.input[0]})
    a, b = (v.nodes[x] for x in m.nodes)
    if m.data == "reshapes":
        new = helper.make_node("Reshape", [a.input[0], b.input[1]], [b.output[0]], name=b.name)
        new.attribute.extend(b.attribute)
        return Change(remove={a.name, b.name}, add=[new])
    p, q = list(attr(a, "perm")), list(attr(b, "perm"))
    comp = [p[i] for i in q]
    if comp == list(range(len(comp))):
        return Change(remove={a.name, b.name}, reroute={b.output[0]: a.input[0]})
    return Change(remove={a.name, b.name}, add=[helper.make_node("Transpose", [a.input[0]], [b.output[0]],
                                                                 name=b.name, perm=comp)])


RULE = Rule("cancel-transpose-reshape", "Transpose pairs composed or cancelled, Reshape chains collapsed, "
     "identity Transpose/Reshape dropped", _find_cancel, _check_cancel, _rewrite_cancel)
