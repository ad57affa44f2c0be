"""Rule ``narrow-int64``: int64 subgraphs computed in int32 (values checked), Casts at the boundary: int64 runs
on the AI CPU.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from npu_deploy.converters.lowering import ops
from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, regions

# op -> input positions that carry data (narrowed); the rest (shapes, axes, indices) stay int64: the
# op table's column (ops.INT_DATA_INPUTS)
_INT_DATA_OPS = ops.INT_DATA_INPUTS
_INT32 = np.iinfo(np.int32)


def _int_data_positions(n: onnx.NodeProto) -> tuple[int, ...]:
    pos = _INT_DATA_OPS[n.op_type]
    return tuple(range(len(n.input))) if pos is None else pos


def _int_candidate(v: View, n: onnx.NodeProto) -> bool:
    if n.op_type not in _INT_DATA_OPS or n.domain not in ("", "ai.onnx") or len(n.output) != 1:
        return False
    if v.dtype(n.output[0]) != np.int64:
        return False
    pos = _int_data_positions(n)
    return all(v.dtype(n.input[p]) == np.int64 for p in pos if p < len(n.input) and n.input[p])


def _find_int64(v: View) -> list[Match]:
    cands = {n.name for n in v.model.graph.node if _int_candidate(v, n)}

    def neighbours(node: onnx.NodeProto) -> list[str]:
        # joined through integer data only: a producer of a data input, a consumer reading it as data
        near = [v.producer.get(node.input[p]) for p in _int_data_positions(node) if p < len(node.input)]
        near += [c for c in v.consumers.get(node.output[0], [])
                 if c.name in cands  # (only candidates have data positions)
                 and any(c.input[p] == node.output[0] for p in _int_data_positions(c) if p < len(c.input))]
        return [m.name for m in near if m is not None]

    return [Match(f"int64:{r[0]}", r) for r in regions(v, cands, lambda n: True, neighbours)]


def _fits_int32(a: np.ndarray | None) -> bool:
    return a is None or a.size == 0 or (int(a.min()) >= _INT32.min and int(a.max()) <= _INT32.max)


def _check_int64(v: View, m: Match) -> str | None:
    if all(v.const(v.nodes[n].output[0]) is not None or _all_const_inputs(v, v.nodes[n]) for n in m.nodes):
        return "constant subgraph: folded at compile time, nothing runs on the AI CPU"
    for name in m.nodes:
        n = v.nodes[name]
        for p in _int_data_positions(n):
            if p < len(n.input) and n.input[p]:
                if not _fits_int32(v.const(n.input[p])) or not _fits_int32(v.values.get(n.input[p])):
                    return f"{n.input[p]} holds values outside int32 on these inputs"
        if not _fits_int32(v.values.get(n.output[0])):
            return f"{n.output[0]} holds values outside int32 on these inputs"
    return None


def _all_const_inputs(v: View, n: onnx.NodeProto) -> bool:
    return all(v.const(i) is not None for i in n.input if i)


def _rewrite_int64(v: View, m: Match) -> Change:
    ch = Change(remove=set(m.nodes))
    comp = set(m.nodes)
    narrowed: dict[str, str] = {}

    def narrow(x: str) -> str:
        if x in narrowed:
            return narrowed[x]
        c = v.const(x)
        if c is not None:
            name, t = v.init(x + "_i32", c.astype(np.int32))
            ch.inits.append(t)
        else:
            name = v.fresh(x + "_i32")
            p = v.producer.get(x)
            if p is None or p.name not in comp:
                ch.add.append(helper.make_node("Cast", [x], [name], to=TensorProto.INT32, name=v.fresh(f"{x}_cast32")))
        narrowed[x] = name
        return name

    for name in m.nodes:
        n = v.nodes[name]
        ins = list(n.input)
        for p in _int_data_positions(n):
            if p < len(ins) and ins[p]:
                ins[p] = narrow(ins[p])
        new = helper.make_node(n.op_type, ins, [narrow(n.output[0])], name=n.name)
        new.attribute.extend(n.attribute)
        ch.add.append(new)
    for name in m.nodes:
        o = v.nodes[name].output[0]
        readers = [c for c in v.consumers.get(o, []) if c.name not in comp
                   or not any(c.input[p] == o for p in _int_data_positions(c) if p < len(c.input))]
        if readers or o in v.graph_outputs:
            ch.add.append(helper.make_node("Cast", [narrowed[o]], [o], to=TensorProto.INT64, name=v.fresh(f"{o}_cast64")))
    return ch


RULE = Rule("narrow-int64", "int64 subgraphs computed in int32 (values checked), Casts at the boundary: "
     "int64 runs on the AI CPU", _find_int64, _check_int64, _rewrite_int64)
