"""Rule ``fold-transpose-bn``: Transpose -> BatchNormalization -> inverse Transpose becomes Mul + Add.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr


def _find_tbt(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "BatchNormalization" or len(n.output) != 1 and any(n.output[1:]):
            continue
        p = v.producer.get(n.input[0])
        c = v.only_consumer(n.output[0])
        if p is not None and p.op_type == "Transpose" and c is not None and c.op_type == "Transpose":
            out.append(Match(f"tbt:{n.name}", (p.name, n.name, c.name)))
    return out


def _check_tbt(v: View, m: Match) -> str | None:
    t1, bn, t2 = (v.nodes[x] for x in m.nodes)
    p, q = list(attr(t1, "perm") or []), list(attr(t2, "perm") or [])
    if not p or len(p) != len(q) or [p[i] for i in q] != list(range(len(p))):
        return "the two Transposes do not cancel"
    if any(v.const(x) is None for x in bn.input[1:5]):
        return "BatchNormalization parameters are not constant"
    if attr(bn, "training_mode", 0):
        return "training-mode BatchNormalization"
    if v.only_consumer(t1.output[0]) is None:
        return f"{t1.output[0]} has other readers (the first Transpose must stay)"
    return None


def _rewrite_tbt(v: View, m: Match) -> Change:
    t1, bn, t2 = (v.nodes[x] for x in m.nodes)
    p = list(attr(t1, "perm"))
    gamma, beta, mean, var = (v.const(x).astype(np.float64) for x in bn.input[1:5])
    eps = attr(bn, "epsilon", 1e-5)
    scale = gamma / np.sqrt(var + eps)
    shift = beta - mean * scale
    dtype = v.dtype(t1.input[0]) or np.float32
    shape = [1] * len(p)
    shape[p[1]] = scale.size          # the BN channel axis (1 after t1) is axis p[1] of the input
    sn, st = v.init(bn.name + "_scale", scale.reshape(shape).astype(dtype))
    bn_, bt = v.init(bn.name + "_shift", shift.reshape(shape).astype(dtype))
    mid = v.fresh(bn.name + "_scaled")
    return Change(remove=set(m.nodes), inits=[st, bt], add=[
        helper.make_node("Mul", [t1.input[0], sn], [mid], name=v.fresh(bn.name + "_mul")),
        helper.make_node("Add", [mid, bn_], [t2.output[0]], name=v.fresh(bn.name + "_add"))])


RULE = Rule("fold-transpose-bn", "Transpose -> BatchNormalization -> inverse Transpose becomes Mul + Add",
     _find_tbt, _check_tbt, _rewrite_tbt)
