"""Rule ``fold-channel-slice``: Slices of a Conv output along channels become Convs with sliced weights (and
spatial cuts move to the input): a Slice of a Conv output leaves NC1HWC0, two TransData.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr
from npu_deploy.converters.optimize.rules.merge_slices import _slice_params


def _find_channel_slices(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "Conv" or n.output[0] in v.graph_outputs:
            continue
        readers = v.consumers.get(n.output[0], [])
        if readers and all(r.op_type == "Slice" and r.input[0] == n.output[0] for r in readers):
            out.append(Match(f"channel-slice:{n.name}", (n.name, *[r.name for r in readers])))
    return out


def _check_channel_slices(v: View, m: Match) -> str | None:
    conv = v.nodes[m.nodes[0]]
    if v.const(conv.input[1]) is None or (len(conv.input) > 2 and conv.input[2] and v.const(conv.input[2]) is None):
        return "weights are not constant"
    if attr(conv, "group", 1) != 1:
        return "grouped convolution"
    rank = len(v.shape(conv.output[0]) or ())
    for x in m.nodes[1:]:
        p = _slice_params(v, v.nodes[x])
        if p is None:
            return f"{x}: starts/ends/axes/steps are not constant"
        if 1 not in p[2] or p[3][p[2].index(1)] != 1 or rank < 3:
            return f"{x} does not slice the channel axis with step 1"
    return None


def _rewrite_channel_slices(v: View, m: Match) -> Change:
    conv = v.nodes[m.nodes[0]]
    w = v.const(conv.input[1])
    b = v.const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    ch = Change(remove=set(m.nodes))
    sliced: dict[tuple, str] = {}
    for x in m.nodes[1:]:
        s = v.nodes[x]
        start, end, axes, steps = _slice_params(v, s)
        k = axes.index(1)
        lo, hi, _ = slice(int(start[k]), int(end[k])).indices(w.shape[0])
        rest = [j for j in range(len(axes)) if j != k]
        wn, wt = v.init(f"{conv.input[1]}_{lo}_{hi}", np.ascontiguousarray(w[lo:hi]))
        ch.inits.append(wt)
        ins = [conv.input[0], wn]
        if b is not None:
            bn, bt = v.init(f"{conv.input[2]}_{lo}_{hi}", np.ascontiguousarray(b[lo:hi]))
            ch.inits.append(bt)
            ins.append(bn)
        y = v.fresh(f"{conv.output[0]}_{lo}_{hi}") if rest else s.output[0]
        new = helper.make_node("Conv", ins, [y], name=v.fresh(f"{conv.name}_{lo}_{hi}"))
        new.attribute.extend(conv.attribute)
        ch.add.append(new)
        moved = _input_slice(v, conv, w, [(axes[j], int(start[j]), int(end[j]), int(steps[j])) for j in rest])
        if moved is not None:
            # slice the input instead: the Conv's output then feeds its readers directly (the
            # output Slice is what made the planner leave NC1HWC0)
            key = tuple(moved)
            if key not in sliced:  # readers cutting the same input window share one Slice
                vals = list(zip(*moved))
                names = []
                for what, val in zip(("starts", "ends", "axes", "steps"), vals):
                    nm, t = v.init(f"{s.name}_in_{what}", np.array(val, dtype=np.int64))
                    ch.inits.append(t)
                    names.append(nm)
                sliced[key] = v.fresh(f"{conv.input[0]}_{s.name}")
                ch.add.append(helper.make_node("Slice", [conv.input[0], *names], [sliced[key]],
                                               name=v.fresh(f"{s.name}_input")))
            xs = sliced[key]
            new.input[0] = xs
            new.output[0] = s.output[0]
        elif rest:  # the other axes stay a Slice of the output
            names = []
            for what, vals in (("starts", start), ("ends", end), ("axes", axes), ("steps", steps)):
                nm, t = v.init(f"{s.name}_{what}", np.array([vals[j] for j in rest], dtype=np.int64))
                ch.inits.append(t)
                names.append(nm)
            ch.add.append(helper.make_node("Slice", [y, *names], [s.output[0]], name=s.name))
    return ch


_TO_END = 1 << 31


def _input_slice(v: View, conv: onnx.NodeProto, w: np.ndarray, cuts: list[tuple[int, int, int, int]]):
    """The input Slice (start, end, axis, step per axis) equivalent to slicing the Conv's output by
    ``cuts`` (axis, start, end, step), or None when it is not exact: batch cuts move as they are;
    spatial cuts need step 1, a non-negative start, no padding on the axis, and an end that is
    either "to the end" or inside the output."""
    if not cuts:
        return None
    rank = w.ndim - 2
    pads = attr(conv, "pads") or [0] * (2 * rank)
    strides = attr(conv, "strides") or [1] * rank
    dil = attr(conv, "dilations") or [1] * rank
    if attr(conv, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    out_decl = v.declared(conv.output[0]) or ()
    moved = []
    for axis, start, end, step in cuts:
        if axis == 0:
            moved.append((start, end, 0, step))
            continue
        d = axis - 2
        if d < 0 or step != 1 or start < 0 or end < 0 or pads[d] or pads[d + rank]:
            return None
        ek = (w.shape[2 + d] - 1) * dil[d] + 1
        full = out_decl[axis] if axis < len(out_decl) else None
        if end >= _TO_END or (full is not None and end >= full):
            in_end = _TO_END
        elif full is not None:
            in_end = (end - 1) * strides[d] + ek
        else:
            return None
        moved.append((start * strides[d], in_end, axis, 1))
    return moved


RULE = Rule("fold-channel-slice", "Slices of a Conv output along channels become Convs with sliced weights "
     "(and spatial cuts move to the input): a Slice of a Conv output leaves NC1HWC0, two TransData", _find_channel_slices,
     _check_channel_slices, _rewrite_channel_slices)
