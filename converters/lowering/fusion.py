"""Which tensors the device never stores: elementwise ops fused into their producer.

ATC fuses a chain such as Conv → Add → Relu or MatMul → Add → Gelu into one kernel (UB fusion): the
intermediate results stay in the core's buffer and are never written to device memory, so they are
not rounded to the storage dtype either. The plan records these tensors (``Plan.fused``, manifest
``fused_tensors``); the emulator does not round them, and the memory plan does not need them.
The rule is deliberately simple and stated here so that a user can check it: a tensor is fused when
it is the only output of a non-folded op, is read by exactly one node, once, that node is an
elementwise op running in the same layout and precision, and no TransData, graph output or
subgraph touches it; or it is read (so) by several elementwise ops that all meet again, through
single-reader elementwise ops, in one of them (x * sigmoid(x), x * relu6(x + 3) / 6).
"""

from __future__ import annotations

from typing import Any, Mapping

import onnx

from npu_deploy.converters.formats.graph import same_format
from npu_deploy.converters.lowering import ops

# the fusion classes of the op table (ops.py): elementwise ops fused into their producer
UNARY_ELEMENTWISE = ops.UNARY_ELEMENTWISE
BINARY_ELEMENTWISE = ops.BINARY_ELEMENTWISE


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
    intermediate stays in the core's buffer, so it is not rounded to the storage dtype), or read by
    several such ops that meet again in one of them (x * sigmoid(x), the decomposed hard-swish)."""
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

    def elementwise(n: onnx.NodeProto) -> bool:
        return n.op_type in UNARY_ELEMENTWISE or n.op_type in BINARY_ELEMENTWISE

    def reads_in_place(t: str, p: onnx.NodeProto, c: onnx.NodeProto) -> bool:
        """``c`` reads ``t`` once, in the layout and precision ``p`` writes it, with no TransData."""
        if not elementwise(c) or list(c.input).count(t) != 1 or (t, c.name) in td_by_edge:
            return False
        pr, cr = rec(p), rec(c)
        if pr.get("folded") or pr.get("dtype") != cr.get("dtype"):
            return False
        out_fmt = (pr.get("output_formats") or [None])[0]
        in_fmt = (cr.get("input_formats") or [None] * len(c.input))[list(c.input).index(t)]
        return same_format(out_fmt or "ND", in_fmt or "ND")

    def storable(t: str) -> bool:
        p = producer.get(t)
        return (p is not None and t not in consts and t not in outputs and t not in sub_reads
                and len(p.output) == 1)

    def leads_to(n: onnx.NodeProto, sink: onnx.NodeProto, depth: int = 8) -> bool:
        """``n``'s result reaches ``sink`` through single-reader elementwise ops only."""
        for _ in range(depth):
            o = n.output[0] if len(n.output) == 1 else ""
            rs = readers.get(o, [])
            if not o or not storable(o) or len(rs) != 1 or not reads_in_place(o, n, rs[0]):
                return False
            if rs[0] is sink:
                return True
            n = rs[0]
        return False

    fused: set[str] = set()
    for t, rs in readers.items():
        if not storable(t):
            continue
        p = producer[t]
        if len(rs) == 1:
            if reads_in_place(t, p, rs[0]):
                fused.add(t)
            continue
        # one tensor, several elementwise readers that meet again in one op: x * hardsigmoid(x),
        # x * sigmoid(x), x * relu6(x + 3) / 6 — one fused kernel, x never leaves the core
        if not all(reads_in_place(t, p, r) for r in rs):
            continue
        sinks = [r for r in rs if all(o is r or leads_to(o, r) for o in rs)]
        if len(sinks) == 1:
            fused.add(t)
    return sorted(fused)


