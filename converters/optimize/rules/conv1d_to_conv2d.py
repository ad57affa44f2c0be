"""Rule ``conv1d-to-conv2d``: regions of Conv1d and element-wise ops run as Conv2d between one Unsqueeze and
Squeeze (ATC lowers each Conv1d to Conv2d; the region keeps the layout between them).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from npu_deploy.converters.optimize.graph import (
    _BINARY_ELEMENTWISE,
    _UNARY_ELEMENTWISE,
    Change,
    Match,
    Rule,
    View,
    _conv_is_1d,
    attr,
    regions,
)

# the op table's elementwise classes, and the ops this rule rewrites with code of its own
_REGION_OPS = _UNARY_ELEMENTWISE | _BINARY_ELEMENTWISE | {"Conv", "Slice", "BatchNormalization"}


def _region_member(v: View, n: onnx.NodeProto) -> bool:
    if n.op_type == "Conv":
        return _conv_is_1d(v, n)
    if n.op_type not in _REGION_OPS or len(n.output) != 1:
        return False
    out = v.shape(n.output[0])
    if out is None or len(out) != 3:
        return False
    if n.op_type == "Slice":
        return all(v.const(i) is not None for i in n.input[1:] if i) and len(n.input) >= 4
    if n.op_type in _BINARY_ELEMENTWISE:
        # the other operand must broadcast the same way once both are 4-D: a full 3-D tensor of
        # the region or a scalar / single-element constant
        for i in n.input:
            s = v.shape(i)
            if s is None:
                return False
            if len(s) != 3 and int(np.prod(s)) != 1:
                return False
    return True


def _find_conv1d_regions(v: View) -> list[Match]:
    members = {n.name for n in v.model.graph.node if _region_member(v, n)}

    def neighbours(node: onnx.NodeProto) -> list[str]:
        # a neighbour joins through a 3-D activation (members only: not a constant side input)
        near = [v.producer.get(i) for i in node.input if i]
        near += [c for o in node.output for c in v.consumers.get(o, [])]
        return [m.name for m in near if m is not None]

    return [Match(f"conv1d-region:{r[0]}", r)
            for r in regions(v, members, lambda n: n.op_type == "Conv", neighbours)]


def _check_conv1d(v: View, m: Match) -> str | None:
    for name in m.nodes:
        n = v.nodes[name]
        if n.op_type == "Conv" and attr(n, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            return f"{name}: auto_pad is set (explicit pads needed)"
    return None


def _rewrite_conv1d(v: View, m: Match) -> Change:
    ch = Change(remove=set(m.nodes))
    region = set(m.nodes)
    internal: dict[str, str] = {}   # 3-D tensor -> its 4-D twin
    axes_name, t = v.init("conv2d_axis", np.array([2], dtype=np.int64))
    ch.inits.append(t)

    def twin(x: str) -> str:
        if x in internal:
            return internal[x]
        y = v.fresh(x + "_2d")
        internal[x] = y
        p = v.producer.get(x)
        if p is None or p.name not in region:  # enters the region: Unsqueeze once
            ch.add.append(helper.make_node("Unsqueeze", [x, axes_name], [y], name=v.fresh(f"{x}_to2d")))
        return y

    for name in m.nodes:
        n = v.nodes[name]
        ins = list(n.input)
        if n.op_type == "Conv":
            w = v.const(n.input[1])
            if w is not None:
                wn, wt = v.init(n.input[1] + "_2d", w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]))
                ch.inits.append(wt)
                ins[1] = wn
            else:
                ins[1] = twin(n.input[1])
            ins[0] = twin(n.input[0])
            k = attr(n, "kernel_shape") or [v.shape(n.input[1])[2]]
            pads = attr(n, "pads") or [0, 0]
            kw = {"kernel_shape": [1, k[0]], "pads": [0, pads[0], 0, pads[1]],
                  "strides": [1, (attr(n, "strides") or [1])[0]], "dilations": [1, (attr(n, "dilations") or [1])[0]],
                  "group": attr(n, "group", 1)}
            new = helper.make_node("Conv", ins, [twin(n.output[0])], name=n.name, **kw)
        elif n.op_type == "Slice":
            axes = v.const(n.input[3]).astype(np.int64)
            axes = np.where(axes < 0, axes + 3, axes)
            axes = np.where(axes >= 2, axes + 1, axes)
            an, at = v.init(f"{n.name}_axes2d", axes)
            ch.inits.append(at)
            ins[0] = twin(ins[0])
            ins[3] = an
            new = helper.make_node("Slice", ins, [twin(n.output[0])], name=n.name)
        else:
            for k, x in enumerate(ins):
                s = v.shape(x) if x else None
                if x and s is not None and len(s) == 3:
                    ins[k] = twin(x)
            new = helper.make_node(n.op_type, ins, [twin(n.output[0])], name=n.name, domain=n.domain)
            new.attribute.extend(n.attribute)
        ch.add.append(new)
    for x, y in list(internal.items()):
        p = v.producer.get(x)
        if p is None or p.name not in region:
            continue
        outside = [c for c in v.consumers.get(x, []) if c.name not in region]
        if outside or x in v.graph_outputs:
            ch.add.append(helper.make_node("Squeeze", [y, axes_name], [x], name=v.fresh(f"{x}_to1d")))
    return ch


RULE = Rule("conv1d-to-conv2d", "regions of Conv1d and element-wise ops run as Conv2d between one Unsqueeze "
     "and Squeeze (ATC lowers each Conv1d to Conv2d; the region keeps the layout between them)", _find_conv1d_regions, _check_conv1d,
     _rewrite_conv1d)
