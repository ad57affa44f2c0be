"""Which tensors the device never stores: elementwise ops fused into their producer.

ATC fuses a chain such as Conv → Add → Relu or MatMul → Add → Gelu into one kernel (UB fusion): the
intermediate results stay in the core's buffer and are never written to device memory, so they are
not rounded to the storage dtype either. The plan records these tensors (``Plan.fused``, manifest
``fused_tensors``); the emulator does not round them, and the memory plan does not need them.
The rule is deliberately simple and stated here so that a user can check it: a tensor is fused when
it is the only output of a non-folded op, is read by exactly one node, once, that node is an
elementwise op running in the same layout and precision, and no TransData, graph output or
subgraph touches it.
"""

from __future__ import annotations

from typing import Any, Mapping

import onnx

from npu_deploy.converters.format_graph import same_format

UNARY_ELEMENTWISE = frozenset({
    "Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "LeakyRelu",
    "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Floor", "Ceil", "Round",
    "Sign", "Gelu", "Mish", "Identity", "Clip", "ThresholdedRelu", "Sin", "Cos",
})
"""Ops the vector unit runs on any layout, element by element (their attributes name no axis)."""
BINARY_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Sum"})


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names the subgraphs of ``node`` (If/Loop/Scan bodies) read from the outer graph."""
    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for sub_g in graphs:
            for sub in sub_g.node:
                names.update(i for i in sub.input if i)
                names |= subgraph_reads(sub)
    return names


def fused_tensors(g: onnx.GraphProto, node_formats: Mapping[str, Any], transdata: list[Mapping[str, Any]],
                  consts: set[str]) -> list[str]:
    """Tensors ATC would not store: the output of an op read only by one elementwise op of the same
    layout and precision (Conv + Add + Relu, MatMul + Add + Gelu run as one fused kernel; the
    intermediate stays in the core's buffer, so it is not rounded to the storage dtype)."""
    td_by_edge = {(str(td.get("tensor")), str(c)) for td in transdata for c in td.get("consumers") or []}
    sub_reads: set[str] = set()
    for n in g.node:
        sub_reads |= subgraph_reads(n)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for t in n.input:
            if t:
                readers.setdefault(t, []).append(n)
    outputs = {o.name for o in g.output}
    producer = {o: n for n in g.node for o in n.output if o}

    def rec(n: onnx.NodeProto) -> dict:
        nf = node_formats.get(n.name)
        return nf if isinstance(nf, dict) else {}

    fused: set[str] = set()
    for t, rs in readers.items():
        p = producer.get(t)
        if p is None or t in consts or t in outputs or t in sub_reads or len(rs) != 1 or len(p.output) != 1:
            continue
        c = rs[0]
        if c.op_type not in UNARY_ELEMENTWISE and c.op_type not in BINARY_ELEMENTWISE:
            continue
        if list(c.input).count(t) != 1 or (t, c.name) in td_by_edge:
            continue
        pr, cr = rec(p), rec(c)
        if pr.get("folded") or pr.get("dtype") != cr.get("dtype"):
            continue
        out_fmt = (pr.get("output_formats") or [None])[0]
        in_fmt = (cr.get("input_formats") or [None] * len(c.input))[list(c.input).index(t)]
        if not same_format(out_fmt or "ND", in_fmt or "ND"):
            continue
        fused.add(t)
    return sorted(fused)


