"""Rule ``split-qkv-matmul``: MatMul(+Add) -> Reshape -> Transpose -> N Gathers becomes N MatMuls.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr


def _find_qkv(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "MatMul" or v.const(n.input[1]) is None:
            continue
        cur, chain = n, [n.name]
        nxt = v.only_consumer(cur.output[0])
        if nxt is not None and nxt.op_type == "Add" and v.const(nxt.input[1]) is not None:
            chain.append(nxt.name)
            cur, nxt = nxt, v.only_consumer(nxt.output[0])
        if nxt is None or nxt.op_type != "Reshape":
            continue
        r = nxt
        t = v.only_consumer(r.output[0])
        if t is None or t.op_type != "Transpose":
            continue
        gathers = v.consumers.get(t.output[0], [])
        if len(gathers) >= 2 and all(g.op_type == "Gather" and attr(g, "axis", 0) == 0 for g in gathers) \
                and t.output[0] not in v.graph_outputs:
            out.append(Match(f"qkv:{n.name}", tuple(chain + [r.name, t.name] + [g.name for g in gathers])))
    return out


def _qkv_parts(v: View, m: Match):
    names = list(m.nodes)
    mm = v.nodes[names[0]]
    add = v.nodes[names[1]] if v.nodes[names[1]].op_type == "Add" else None
    k = 2 if add is not None else 1
    r, t = v.nodes[names[k]], v.nodes[names[k + 1]]
    gathers = [v.nodes[x] for x in names[k + 2:]]
    return mm, add, r, t, gathers


def _check_qkv(v: View, m: Match) -> str | None:
    mm, add, r, t, gathers = _qkv_parts(v, m)
    shape = v.const(r.input[1])
    w = v.const(mm.input[1])
    perm = list(attr(t, "perm") or [])
    if shape is None or not perm:
        return "Reshape target or Transpose perm not constant"
    if w.ndim != 2:
        return "weights are not a 2-D matrix"
    rshape = v.shape(r.output[0])
    if rshape is None:
        return "Reshape output shape unknown"
    axis = perm[0]
    n = rshape[axis]
    if shape[axis] != n:
        return "the number of slices is not a constant of the Reshape target"
    if math.prod(rshape[axis:]) != w.shape[1]:
        return "the gathered axis is not the leading factor of the MatMul's last dimension"
    idx = [v.const(g.input[1]) for g in gathers]
    if any(i is None or i.ndim != 0 for i in idx):
        return "Gather indices are not constant scalars"
    if sorted(int(i) % n for i in idx) != list(range(n)):
        return f"the Gathers do not take each of the {n} slices once"
    if add is not None:
        b = v.const(add.input[1])
        if b.ndim != 1 or b.shape[0] != w.shape[1]:
            return "the bias is not a vector over the MatMul's last dimension"
    if 0 in shape.tolist():
        return "Reshape target uses 0 (copy a dimension)"
    return None


def _rewrite_qkv(v: View, m: Match) -> Change:
    mm, add, r, t, gathers = _qkv_parts(v, m)
    w = v.const(mm.input[1])
    b = v.const(add.input[1]) if add is not None else None
    shape = v.const(r.input[1]).astype(np.int64).tolist()
    perm = list(attr(t, "perm"))
    rshape = v.shape(r.output[0])
    axis = perm[0]
    n = rshape[axis]
    width = w.shape[1] // n
    new_shape = np.array(shape[:axis] + shape[axis + 1:], dtype=np.int64)
    new_perm = [p - (p > axis) for p in perm[1:]]
    ch = Change(remove=set(m.nodes))
    sn, st = v.init(r.name + "_part_shape", new_shape)
    ch.inits.append(st)
    for g in gathers:
        i = int(v.const(g.input[1])) % n
        wn, wt = v.init(f"{mm.input[1]}_part{i}", np.ascontiguousarray(w[:, i * width:(i + 1) * width]))
        ch.inits.append(wt)
        y = v.fresh(f"{mm.name}_part{i}")
        ch.add.append(helper.make_node("MatMul", [mm.input[0], wn], [y], name=v.fresh(f"{mm.name}_part{i}")))
        if b is not None:
            bn, bt = v.init(f"{add.input[1]}_part{i}", b[i * width:(i + 1) * width])
            ch.inits.append(bt)
            y2 = v.fresh(f"{add.name}_part{i}")
            ch.add.append(helper.make_node("Add", [y, bn], [y2], name=v.fresh(f"{add.name}_part{i}")))
            y = y2
        z = v.fresh(f"{r.name}_part{i}")
        ch.add.append(helper.make_node("Reshape", [y, sn], [z], name=v.fresh(f"{r.name}_part{i}")))
        ch.add.append(helper.make_node("Transpose", [z], [g.output[0]], name=v.fresh(f"{t.name}_part{i}"),
                                       perm=new_perm))
    return ch


RULE = Rule("split-qkv-matmul", "MatMul(+Add) -> Reshape -> Transpose -> N Gathers becomes N MatMuls",
     _find_qkv, _check_qkv, _rewrite_qkv, default=False)
