"""ATC's ``--out_nodes`` and ``--output_type`` on an ONNX graph, for the built-in lowering.

ATC cuts the graph at the tensors ``--out_nodes`` names and casts outputs to the dtypes ``--output_type``
names; the built-in path does the same to the model before it is checked and planned, so both
backends return the same outputs for the same command line.

``--out_nodes``: ``"node:0;node2:1"`` (node name : output index), or ONNX tensor names
``"out1;out2"`` (one style at a time, as ATC requires). ``--output_type``: one type for every output
(``FP16``) or per output ``"node:0:FP16;node2:1:FP32"`` (needs ``--out_nodes``, as in ATC).

>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="r"),
...                        helper.make_node("Neg", ["a"], ["y"], name="n")], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
>>> m = edit_outputs(helper.make_model(g), out_nodes="r:0", output_type="FP16")
>>> [o.name for o in m.graph.output], [n.op_type for n in m.graph.node]
(['a'], ['Relu', 'Cast'])
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from npu_deploy.errors import InputError

# ATC's --output_type names -> ONNX element types
OUTPUT_TYPES = {"FP32": TensorProto.FLOAT, "FP16": TensorProto.FLOAT16, "UINT8": TensorProto.UINT8,
                "INT8": TensorProto.INT8, "UINT16": TensorProto.UINT16, "INT16": TensorProto.INT16,
                "UINT32": TensorProto.UINT32, "INT32": TensorProto.INT32, "UINT64": TensorProto.UINT64,
                "INT64": TensorProto.INT64, "DOUBLE": TensorProto.DOUBLE}


def parse_out_nodes(text: str | None, graph: onnx.GraphProto) -> list[str]:
    """The tensor names ``--out_nodes`` selects, in the order given."""
    if not text or not text.strip():
        return []
    items = [t.strip() for t in text.split(";") if t.strip()]
    by_node = {n.name: n for n in graph.node}
    produced = {o for n in graph.node for o in n.output if o} | {i.name for i in graph.input}
    tensors = []
    for item in items:
        name, sep, idx = item.rpartition(":")
        if sep and idx.strip().isdigit() and name in by_node:
            outs = by_node[name].output
            k = int(idx)
            if k >= len(outs) or not outs[k]:
                raise InputError(f"--out_nodes {item}: node {name!r} has {len(outs)} output(s)",
                                 hint=f"use an index below {len(outs)}")
            tensors.append(outs[k])
        elif item in produced:
            tensors.append(item)
        else:
            raise InputError(f"--out_nodes {item}: no node {name or item!r} and no tensor {item!r} in the model",
                             hint="name node:index (ATC's style) or an ONNX tensor name")
    return list(dict.fromkeys(tensors))


def parse_output_type(text: str | None, graph: onnx.GraphProto, outputs: list[str]) -> dict[str, int]:
    """``{output tensor: ONNX element type}`` for ``--output_type``."""
    if not text or not text.strip():
        return {}
    text = text.strip()
    if ":" not in text:
        return {o: _type(text) for o in outputs}
    by_node = {n.name: n for n in graph.node}
    out: dict[str, int] = {}
    for item in (t.strip() for t in text.split(";") if t.strip()):
        parts = item.rsplit(":", 2)
        if len(parts) != 3 or not parts[1].isdigit() or parts[0] not in by_node:
            raise InputError(f"--output_type {item}: not node:index:TYPE for a node of the model",
                             hint="e.g. --output_type=\"conv1:0:FP16\" (with --out_nodes naming that output)")
        node, k = by_node[parts[0]], int(parts[1])
        if k >= len(node.output) or node.output[k] not in outputs:
            raise InputError(f"--output_type {item}: {parts[0]}:{k} is not one of the graph's outputs",
                             hint="name it in --out_nodes too (ATC requires the same)")
        out[node.output[k]] = _type(parts[2])
    return out


def _type(name: str) -> int:
    t = OUTPUT_TYPES.get(name.strip().upper())
    if t is None:
        raise InputError(f"--output_type {name}: not an ATC output type", hint=f"use one of {', '.join(OUTPUT_TYPES)}")
    return t


def edit_outputs(model: onnx.ModelProto, *, out_nodes: str | None = None,
                 output_type: str | None = None) -> onnx.ModelProto:
    """``model`` cut at ``out_nodes`` (only the nodes those outputs need are kept) and with its outputs
    cast as ``output_type`` says. The model is returned unchanged when neither is given."""
    if not (out_nodes and out_nodes.strip()) and not (output_type and output_type.strip()):
        return model
    g = model.graph
    wanted = parse_out_nodes(out_nodes, g) or [o.name for o in g.output]
    types = parse_output_type(output_type, g, wanted)
    known = _value_infos(model)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    mg = m.graph
    if wanted != [o.name for o in g.output]:
        keep = _needed(g, wanted)
        nodes = [n for k, n in enumerate(g.node) if k in keep]
        del mg.node[:]
        mg.node.extend(nodes)
        used = {i for n in nodes for i in n.input} | set(wanted)
        inits = [t for t in g.initializer if t.name in used]
        del mg.initializer[:]
        mg.initializer.extend(inits)
        outs = []
        for t in wanted:
            vi = known.get(t)
            if vi is None:
                raise InputError(f"--out_nodes: the type of tensor {t!r} is unknown (shape inference could not "
                                 f"tell it)", hint="cut at a tensor whose type the model declares")
            outs.append(vi)
        del mg.output[:]
        mg.output.extend(outs)
    for k, o in enumerate(list(mg.output)):
        to = types.get(o.name)
        if to is None or o.type.tensor_type.elem_type == to:
            continue
        # the graph output keeps its name (what the user asked for); the producer writes a renamed tensor
        inner = f"{o.name}__before_output_type"
        for n in mg.node:
            for j, x in enumerate(n.output):
                if x == o.name:
                    n.output[j] = inner
            for j, x in enumerate(n.input):
                if x == o.name:
                    n.input[j] = inner
        mg.node.append(helper.make_node("Cast", [inner], [o.name], to=to, name=f"{o.name}/output_type"))
        new = onnx.ValueInfoProto()
        new.CopyFrom(o)
        new.type.tensor_type.elem_type = to
        mg.output[k].CopyFrom(new)
    return m


def _needed(g: onnx.GraphProto, outputs: list[str]) -> set[int]:
    """Indexes of the nodes ``outputs`` depend on."""
    producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    keep: set[int] = set()
    todo = list(outputs)
    seen: set[str] = set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        k = producer.get(t)
        if k is None or k in keep:
            continue
        keep.add(k)
        n = g.node[k]
        todo.extend(i for i in n.input if i)
        for a in n.attribute:  # subgraphs read outer tensors by name
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                todo.extend(i for sn in sub.node for i in sn.input if i)
    return keep


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    g = model.graph
    infos = {v.name: v for v in list(g.input) + list(g.output) + list(g.value_info)}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        for v in list(inferred.graph.value_info) + list(inferred.graph.output):
            infos.setdefault(v.name, v)
    except Exception:  # inference is a help here; a tensor it cannot type is refused by name above
        pass
    return {k: v for k, v in infos.items() if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}
