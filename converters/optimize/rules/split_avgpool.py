"""Rule ``split-avgpool``: AveragePool with kernel h*w >= 255 split into two cascaded pools (the ISA limit).
"""

from __future__ import annotations

import math
from typing import Sequence

from onnx import helper

from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, attr

AVGPOOL_LIMIT = 255         # the ISA limit on kernel h*w


def _find_avgpool(v: View) -> list[Match]:
    out = []
    for n in v.model.graph.node:
        k = attr(n, "kernel_shape")
        if n.op_type == "AveragePool" and k and len(k) == 2 and k[0] * k[1] >= AVGPOOL_LIMIT:
            out.append(Match(f"avgpool:{n.name}", (n.name,)))
    return out


def _factor(k: int) -> tuple[int, int]:
    """k = a * b with a as close to sqrt(k) as possible (a >= b)."""
    best = (k, 1)
    for b in range(1, int(math.isqrt(k)) + 1):
        if k % b == 0:
            best = (k // b, b)
    return best


def _avgpool_plan(k: Sequence[int]) -> tuple[list[int], list[int]] | None:
    (h1, h2), (w1, w2) = _factor(k[0]), _factor(k[1])
    first, second = [h1, w1], [h2, w2]
    if first[0] * first[1] >= AVGPOOL_LIMIT or second[0] * second[1] >= AVGPOOL_LIMIT:
        # balance: move factors so each stage stays under the limit
        first, second = [h1, w2], [h2, w1]
        if first[0] * first[1] >= AVGPOOL_LIMIT or second[0] * second[1] >= AVGPOOL_LIMIT:
            return None
    return first, second


def _check_avgpool(v: View, m: Match) -> str | None:
    n = v.nodes[m.nodes[0]]
    k = attr(n, "kernel_shape")
    if any(attr(n, "pads") or [0]):
        return "padded AveragePool: the split is exact only without padding"
    if list(attr(n, "strides") or [1, 1]) != list(k):
        return "strides differ from the kernel: overlapping windows do not split into a cascade"
    if attr(n, "ceil_mode", 0):
        return "ceil_mode=1: partial windows do not split exactly"
    if any(d != 1 for d in (attr(n, "dilations") or [1, 1])):
        return "dilated AveragePool"
    if _avgpool_plan(k) is None:
        return f"kernel {k[0]}x{k[1]} has no factorisation with both stages under {AVGPOOL_LIMIT}"
    return None


def _rewrite_avgpool(v: View, m: Match) -> Change:
    n = v.nodes[m.nodes[0]]
    first, second = _avgpool_plan(attr(n, "kernel_shape"))
    mid = v.fresh(n.output[0] + "_stage1")
    return Change(remove={n.name}, add=[
        helper.make_node("AveragePool", [n.input[0]], [mid], name=v.fresh(n.name + "_stage1"),
                         kernel_shape=first, strides=first),
        helper.make_node("AveragePool", [mid], [n.output[0]], name=v.fresh(n.name + "_stage2"),
                         kernel_shape=second, strides=second)])


RULE = Rule("split-avgpool", f"AveragePool with kernel h*w >= {AVGPOOL_LIMIT} split into two cascaded pools "
     "(the ISA limit)", _find_avgpool, _check_avgpool, _rewrite_avgpool)
