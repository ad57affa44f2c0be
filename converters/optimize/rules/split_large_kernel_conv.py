"""Rule ``split-large-kernel-conv``: Conv kernels above 192 along the last axis split into Slice + Conv + Add:
large kernels exceed the cube's tiling.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr

LARGE_KERNEL = 192          # the reference: kernel dims above ~192 exceed the cube's tiling


def _find_large_conv(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        w = v.shape(n.input[1]) if n.op_type == "Conv" and len(n.input) > 1 else None
        if w is not None and len(w) >= 3 and w[-1] > LARGE_KERNEL:
            out.append(Match(f"large-conv:{n.name}", (n.name,)))
    return out


def _check_large_conv(v: View, m: Match) -> str | None:
    n = v.nodes[m.nodes[0]]
    if v.const(n.input[1]) is None:
        return "weights are not constant"
    if attr(n, "group", 1) != 1:
        return "grouped convolution"
    rank = len(v.shape(n.input[1])) - 2
    pads = attr(n, "pads") or [0] * (2 * rank)
    if pads[rank - 1] or pads[2 * rank - 1]:
        return "padding along the large kernel axis"
    if (attr(n, "dilations") or [1] * rank)[-1] != 1:
        return "dilated along the large kernel axis"
    if attr(n, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return "auto_pad is set"
    if v.shape(n.output[0]) is None:
        return "output shape unknown"
    return None


def _rewrite_large_conv(v: View, m: Match) -> Change:
    n = v.nodes[m.nodes[0]]
    w = v.const(n.input[1])
    k = w.shape[-1]
    parts = -(-k // LARGE_KERNEL)
    size = -(-k // parts)
    axis = w.ndim - 1
    ch = Change(remove={n.name})
    acc = None
    for j, start in enumerate(range(0, k, size)):
        kj = min(size, k - start)
        wn, wt = v.init(f"{n.input[1]}_part{j}", np.ascontiguousarray(w[..., start:start + kj]))
        # the end counted from the far side keeps every part's output length (L - K) / s + 1 for any L
        tail = k - start - kj
        sl = [v.init(f"{n.name}_p{j}_{s}", np.array([x], dtype=np.int64)) for s, x in
              (("start", start), ("end", -tail if tail else np.iinfo(np.int64).max), ("axis", axis))]
        ch.inits += [wt] + [t for _, t in sl]
        xs = v.fresh(f"{n.name}_in{j}")
        ch.add.append(helper.make_node("Slice", [n.input[0], sl[0][0], sl[1][0], sl[2][0]], [xs],
                                       name=v.fresh(f"{n.name}_slice{j}")))
        ins = [xs, wn] + ([n.input[2]] if j == 0 and len(n.input) > 2 and n.input[2] else [])
        y = v.fresh(f"{n.name}_part{j}")
        conv = helper.make_node("Conv", ins, [y], name=v.fresh(f"{n.name}_part{j}"))
        conv.attribute.extend(a for a in n.attribute if a.name != "kernel_shape")
        ch.add.append(conv)
        if acc is None:
            acc = y
        else:
            s = v.fresh(f"{n.name}_sum{j}")
            ch.add.append(helper.make_node("Add", [acc, y], [s], name=v.fresh(f"{n.name}_sum{j}")))
            acc = s
    ch.add.append(helper.make_node("Identity", [acc], [n.output[0]], name=v.fresh(n.name + "_out")))
    return ch


RULE = Rule("split-large-kernel-conv", f"Conv kernels above {LARGE_KERNEL} along the last axis split into "
     "Slice + Conv + Add: large kernels exceed the cube's tiling", _find_large_conv, _check_large_conv,
     _rewrite_large_conv)
