"""Rule ``sink-transpose``: a Transpose pushed down through the element-wise and broadcast ops that read
its output (their constant operands permuted to match) until it meets the Transposes at the end of that
region, where the two cancel (or compose into one).

The common case is the NHWC detour of exported models between two Convs: ``Conv -> Transpose(0,2,3,1)
-> Sigmoid / Mul by a per-channel constant -> Transpose(0,3,1,2) -> Conv``. The planner keeps NC1HWC0
from one Conv to the next only when nothing in between permutes the axes; each Transpose leaves it (two
TransData each way). onnxruntime's transpose optimizer does the same kind of push (``PushTranspose``
through layout-agnostic and broadcast ops, cancelling inverse pairs); this is our own, smaller version:
one region at a time, every reader of the region inside it or a Transpose, side inputs constant.

Why permuting a constant is exact: with ``y = x.transpose(p)`` an element-wise ``f`` commutes with the
permutation, ``f(y, c).transpose(inv(p)) == f(x, c')`` where ``c'`` is ``c`` (left-padded with 1s to
the rank of ``x``) transposed by ``inv(p)`` -- broadcasting is per axis, so it moves with the axes.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from npu_deploy.converters.lowering import ops
from npu_deploy.converters.optimize.graph import (
    Change,
    Match,
    Rule,
    View,
    attr,
)

# ops that compute each output element from the elements at the same (broadcast) index of their inputs,
# with no axis attribute: the permutation passes through them unchanged
_AGNOSTIC = ops.ELEMENTWISE
# inputs that are scalar parameters, not broadcast operands: left as they are
_SCALAR_INPUTS = {"Clip": {1, 2}}


def _perm(v: View, n) -> list[int] | None:
    """The Transpose's permutation (no ``perm``: the axes reversed), None when the rank is unknown."""
    p = attr(n, "perm")
    if p is not None:
        return [int(i) for i in p]
    s = v.shape(n.input[0]) if n.input else None
    return None if s is None else list(range(len(s)))[::-1]


def _region(v: View, t1):
    """The region a Transpose ``t1`` can sink through: ``(nodes, exits, reason)``. ``nodes`` are the
    element-wise ops that read its output (directly or through each other), in graph order; ``exits``
    the Transposes that read region values; ``reason`` says why it cannot sink (else None)."""
    p = _perm(v, t1)
    if not p or p == list(range(len(p))):
        return [], [], "no permutation to sink"
    inside = {t1.output[0]}
    nodes, exits, queue = {}, {}, [t1.output[0]]
    while queue:
        value = queue.pop()
        if value in v.graph_outputs:
            return [], [], f"{value} is a graph output in the permuted layout"
        for c in v.consumers.get(value, []):
            if c.name in nodes or c.name in exits:
                continue
            if c.op_type == "Transpose" and _perm(v, c) is not None and len(_perm(v, c)) == len(p):
                exits[c.name] = c
            elif c.op_type in _AGNOSTIC and len(c.output) == 1:
                nodes[c.name] = c
                inside.add(c.output[0])
                queue.append(c.output[0])
            else:
                return [], [], f"{c.op_type} {c.name} reads {value} in the permuted layout"
    order = [n for n in v.model.graph.node if n.name in nodes]
    for n in order:
        for k, i in enumerate(n.input):
            if not i or i in inside:
                continue
            c = v.const(i)
            if c is None:
                return [], [], f"input {i} of {n.op_type} {n.name} is computed outside the region (not a constant)"
            if k not in _SCALAR_INPUTS.get(n.op_type, ()) and c.ndim > len(p):
                return [], [], f"constant {i} of {n.op_type} {n.name} has a higher rank than the permuted tensor"
    for e in exits.values():
        if e.input[0] not in inside:  # pragma: no cover - an exit is found as a reader of a region value
            return [], [], f"{e.name} reads no region value"
    if not exits:
        return [], [], "no Transpose ends the region"
    return order, list(exits.values()), None


def _find_sink(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        if n.op_type != "Transpose" or not n.input or not n.input[0]:
            continue
        readers = v.consumers.get(n.output[0], [])
        if any(r.op_type != "Transpose" for r in readers):  # Transpose pairs: cancel-transpose-reshape
            nodes, exits, _ = _region(v, n)
            out.append(Match(f"sink:{n.name}", (n.name, *[x.name for x in nodes], *[x.name for x in exits])))
    return out


def _check_sink(v: View, m: Match) -> str | None:
    return _region(v, v.nodes[m.nodes[0]])[2]


def _rewrite_sink(v: View, m: Match) -> Change:
    t1 = v.nodes[m.nodes[0]]
    nodes, exits, _ = _region(v, t1)
    p = _perm(v, t1)
    inv = [int(i) for i in np.argsort(p)]
    change = Change(remove={t1.name}, reroute={t1.output[0]: t1.input[0]})
    for n in nodes:
        new_inputs = list(n.input)
        for k, i in enumerate(n.input):
            c = v.const(i) if i and k not in _SCALAR_INPUTS.get(n.op_type, ()) else None
            if c is None or c.ndim == 0:
                continue
            moved = c.reshape((1,) * (len(p) - c.ndim) + c.shape).transpose(inv)
            name, t = v.init(f"{i}_sunk", np.ascontiguousarray(moved))
            change.inits.append(t)
            new_inputs[k] = name
        if new_inputs != list(n.input):
            new = helper.make_node(n.op_type, new_inputs, list(n.output), name=n.name, domain=n.domain or None)
            new.attribute.extend(n.attribute)
            change.remove.add(n.name)
            change.add.append(new)
    for e in exits:
        comp = [p[i] for i in _perm(v, e)]
        change.remove.add(e.name)
        if comp == list(range(len(comp))):
            change.reroute[e.output[0]] = e.input[0]
        else:
            change.add.append(helper.make_node("Transpose", [e.input[0]], [e.output[0]], name=e.name, perm=comp))
    return change


RULE = Rule("sink-transpose", "a Transpose pushed through the element-wise and broadcast ops after it (constants "
            "permuted) cancels or composes with the Transposes ending them: the NHWC detour between two Convs "
            "leaves NC1HWC0", _find_sink, _check_sink, _rewrite_sink)
