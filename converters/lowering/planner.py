"""The built-in lowering plan: formats per tensor, TransData, weight pre-packing, precision, memory, cost.

``plan(loaded, soc=..., precision_mode=...)`` runs a fixed pipeline of small graph passes over a
:class:`PlanState` (each states what it requires and guarantees, and returns whether it changed
anything):

1. :class:`AssignPreferredFormats` — every node gets the format its kernel wants, from the one table
   :data:`FORMAT_RULES` (Conv/pool/BN/Resize: NC1HWC0 activations and FRACTAL_Z weights; MatMul/Gemm:
   FRACTAL_NZ; Reshape/Transpose/Gather/…: ND); format-agnostic ops start in ND. The TransData this
   leaves (one per edge whose formats differ, none shared) is the **naive plan**.
2. :class:`PropagateFormats` — format-agnostic ops (elementwise, activations, Softmax/LayerNorm over
   the last axis, spatial Reduce* in NC1HWC0, channel Concat in NC1HWC0 whatever the channel counts,
   views that keep the blocked axes) take their producer's format where the broadcasting/axis check
   allows (FRACTAL_NZ: other operands (M, N), (1, N) or scalar; an activation operand not in NZ gets
   its own small TransData, and step 3 moves the node back if that does not pay). Views are checked
   in pairs where a pair is what the device runs: an attention head split (Reshape [.., S, H*D] ->
   [.., S, H, D] + Transpose), K^T read by BatchMatMul as ``adj_x2`` and the head merge stay in
   FRACTAL_NZ when the head size D is a multiple of 16 (:func:`head_pair`).
3. :class:`CancelRoundTrips` — rules (pattern, check, rewrite) that remove X→Y→X pairs around a
   flexible node, or around a chain of them (:data:`CANCEL_RULES`), by moving it to the other format
   when that removes conversions (or, at equal count, bytes); a failed check's reason is kept and
   shown by ``--explain``.
4. :func:`insert_transdata` (shared: one conversion per tensor and target format, whatever the number
   of consumers; a float32 C0 8 <-> 16 change on a cube-high-precision SoC is two, through NCHW, the
   second naming the first in ``after``: docs/ge-rules.md R7) gives the **optimised plan**;
   :func:`verify_plan` checks the guarantees (every node has formats; after TransData every edge's
   producer and consumer formats, and C0s, agree; no cancellable pair left).

If/Loop/Scan bodies are then planned the same way, each as a graph of its own (:func:`plan_bodies`):
outer tensors enter a body as they are stored outside, body inputs and outputs are ND; body nodes
and tensors appear in the plan under their names (unique model-wide, ``onnx_model`` sees to it).

The plan is literal (:func:`verify_plan`): a tensor is stored in its producer's output format, every
consumer slot reads exactly that unless one planned TransData on that edge converts it, constants
are read in the format they are packed in (ND when not packed), graph outputs leave plain.

Then: weight pre-packing (constants at Conv/MatMul weight slots are stored in their device format, and
constant operands of elementwise ops and Concat running blocked are packed in that format: converted
once at compile time, never by a runtime TransData),
precision (``force_fp16`` casts float32 compute to float16, ``must_keep_origin_dtype`` keeps it,
``allow_mix_precision`` keeps :data:`MIX_PRECISION_FP32_OPS` and ``keep_dtype`` nodes in float32; C0
follows the device dtype), the memory plan (``converters.lowering.memory``) and the cost estimate
(``converters.lowering.cost``) — an **estimate**, labelled so everywhere. ``allow_fp32_to_fp16`` keeps float32
where an AI Core float32 kernel exists: cube ops (:data:`CUBE_OPS`; the 310P cube has no float32 path)
and ops whose published op-info lists float16 only run in float16.

Plain layouts (ND, NCHW, NCDHW…) are byte-identical for an ONNX tensor: converting between them is
free, so they compare equal here; reports show NCHW for 4-D and NCDHW for 5-D plain tensors.

Host layouts (``input_format="NHWC"`` / ``"NDHWC"``, :data:`HOST_LAYOUTS`): the user feeds a 4-D (5-D)
input channels-last while the ONNX graph is NCHW (NCDHW), as GE does for TensorFlow models. Such an
input is produced in NHWC, which is *not* interchangeable with the other plain layouts: its first
TransData goes straight to the consumer's format (NHWC→NC1HWC0, a direct GE transfer, formats.md §4.1)
or, for an ND/NCHW consumer, NHWC→NCHW (a transpose, costed like any TransData). A flexible node
right after such an input may move to its consumer's blocked format when that saves the extra
conversion. Inputs of another rank keep their plain layout (a plan note says so); no input of the
right rank is an ``InputError`` (:func:`host_input_formats`).

>>> import numpy as np, onnx, tempfile, os
>>> from onnx import helper, TensorProto, numpy_helper
>>> w = numpy_helper.from_array(np.ones((8, 3, 3, 3), np.float32), "w")
>>> g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
...                        helper.make_node("Relu", ["c"], ["y"], name="relu")], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], [w])
>>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
>>> onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
>>> from npu_deploy.converters.files.onnx_model import load_model
>>> p = plan(load_model(path), soc="Ascend310P3", precision_mode="force_fp16")
>>> p.node_formats["relu"].input_formats, [(t.src_format, t.dst_format) for t in p.transdata]
(['NC1HWC0'], [('NCHW', 'NC1HWC0'), ('NC1HWC0', 'NCHW')])
>>> p.weights[0].format, p.weights[0].dtype
('FRACTAL_Z', 'float16')
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx

from npu_deploy.converters.formats.graph import axis_perm
from npu_deploy.converters.lowering import fusion, opinfo, ops
# the planner's parts; their public names are re-exported here (importers use planner.X)
from npu_deploy.converters.lowering.plan_passes import (  # noqa: F401
    CANCEL_RULES, PIPELINE, AssignPreferredFormats, Body, CancelRoundTrips, CancelRule, HeadPair, Pass,
    PropagateFormats, _assign_dtypes, _graph_reads, _node_formats, _plan_weights, _subgraphs, all_bodies,
    check_format, head_pair, insert_transdata, plan_bodies, run_passes, verify_plan)
from npu_deploy.converters.lowering.plan_record import Plan, PlanReport, TensorPlan, Transfer  # noqa: F401
from npu_deploy.converters.lowering.plan_state import (  # noqa: F401
    C04, CUBE_OPS, FORMAT_RULES, FORMATTRANS_THRESHOLD_PCT, HOST_LAYOUTS, INPUT_FORMAT_RANKS,
    MIX_PRECISION_FP32_OPS, NC1HWC0, ND, NDC1HWC0, NZ, PRECISION_MODES, PRIVATE_5HD, FormatRule, NodeFormats,
    PackedWeight, PlanState, TransData, display_format, formats_default_c0, host_input_formats, is_plain,
    output_format, plain_name, rule_for, view_shape)
from npu_deploy.errors import InputError
from npu_deploy.converters import formats
from npu_deploy.converters.lowering import cost as costmod
from npu_deploy.converters.lowering import memory
from npu_deploy.converters.lowering.support import check_support

def plan(loaded, *, soc: str = "Ascend310P3", precision_mode: str | None = None,
         keep_dtype: Sequence[str] = (), enable_small_channel: bool = False,
         input_format: str | None = None, support=None, cost_profile=None, op_info=None) -> Plan:
    """Plan the built-in lowering of a loaded model (see the module docstring).

    ``precision_mode`` defaults to ATC's ``force_fp16``. ``support`` is the op-support report (computed
    when not given). ``cost_profile`` (a :class:`~npu_deploy.converters.lowering.cost.SocProfile`, e.g.
    ``cost fit``'s) prices the estimate instead of ``soc``'s built-in profile. Raises ``InputError`` for a
    bad precision mode or ``keep_dtype`` entry. ``op_info``: the installed op info (an
    :class:`~npu_deploy.converters.lowering.opinfo.OpInfo`, or the folder ``--op-info`` names); None reads
    ``$ASCEND_OPP_PATH`` when set, else plans from the built-in table alone (``opinfo.resolve``).
    """

    precision_mode = precision_mode or "force_fp16"
    if precision_mode not in PRECISION_MODES:
        raise InputError(f"unknown precision mode {precision_mode!r}",
                         hint=f"use one of: {', '.join(PRECISION_MODES)}")
    if support is None:
        support = check_support(loaded, soc, precision_mode=precision_mode)
    installed, info_notes = (op_info, [op_info.describe()]) if isinstance(op_info, opinfo.OpInfo) else \
        opinfo.resolve(op_info, soc)
    state = PlanState(loaded, support, precision_mode=precision_mode, keep_dtype=keep_dtype,
                      enable_small_channel=enable_small_channel, input_format=input_format, soc=soc,
                      op_info=installed)
    state.notes += info_notes   # the installed op info used (or why none)
    _assign_dtypes(state)

    passes: list[tuple[str, bool]] = []
    run_passes(state, PIPELINE[:1])
    naive = insert_transdata(state, naive=True)
    run_passes(state, PIPELINE[1:], passes)
    state._bytes_cache.clear()   # sizes depend on the final formats (C0 of float32 cube operands)
    transdata = insert_transdata(state, shared=True)
    weights = _plan_weights(state)
    node_formats = _node_formats(state, weights)
    verify_plan(state, transdata, node_formats, weights)
    plan_bodies(state, support)
    bodies = all_bodies(state)

    tensor_formats: dict[str, str] = {}
    tensor_dtypes: dict[str, str] = {}
    for s, produced in [(state, list(state.graph_inputs))] + [(b.state, [i.name for i in b.state.graph.input])
                                                              for b in bodies]:
        for t in produced + [o for n in s.nodes for o in n.node.output if o]:
            if s.is_activation(t):
                tensor_formats[t] = display_format(s.tensor_format(t), s.rank(t))
                tensor_dtypes[t] = s.device_dtype(t).name
    for b in bodies:
        node_formats.update(_node_formats(b.state, []))

    mem = _memory_plan(state, transdata, memory)  # the top-level graph's (bodies: sized at run time)
    fused = fusion.fused_tensors(loaded.model.graph, {k: v.to_manifest() for k, v in node_formats.items()},
                                 [t.to_manifest() for t in transdata], set(loaded.constants))
    cost = _cost(state, transdata, naive, cost_profile or soc, set(fused))
    transdata = transdata + [td for b in bodies for td in b.transdata]
    naive = naive + [td for b in bodies for td in b.naive]
    for k, td in enumerate(transdata):
        td.name = f"trans_TransData_{k}"
    for td in transdata:  # the second step of a C0 change names the first by its final name
        if td.prev is not None:
            td.after = td.prev.name
    report = _report(loaded, state, soc, precision_mode, support, naive, transdata, weights, mem, cost)
    tensors = _tensor_plans(state, tensor_formats, tensor_dtypes)
    inputs, outputs = _transfers(state, tensor_dtypes)
    dynamic = {"mode": loaded.dynamic_mode, "gears": _host_gears(loaded, state.host_formats)}
    return Plan(soc, precision_mode, node_formats, tensor_formats, tensor_dtypes, transdata, naive, weights,
                mem, cost, report, passes, fused, tensors, inputs, outputs, dynamic, input_format)


def _host_perm(host: str, graph: str) -> list[int]:
    """Axis ``k`` of the host (channels-last) array is axis ``perm[k]`` of the graph's array."""
    return list(axis_perm(graph, host))


def _host_gears(loaded, host_formats: dict[str, str]) -> list[dict[str, list[int]]]:
    """``loaded.gears`` with each channels-last input's shape in the order the host feeds it."""
    out = []
    for g in loaded.gears:
        gear = {}
        for k, v in g.items():
            f = host_formats.get(k)
            if f in HOST_LAYOUTS:
                v = [v[j] for j in _host_perm(f, HOST_LAYOUTS[f][0])]
            gear[k] = list(v)
        out.append(gear)
    return out


def _tensor_plans(state: PlanState, tensor_formats: dict[str, str], tensor_dtypes: dict[str, str]
                  ) -> dict[str, TensorPlan]:
    dynamic = set(getattr(state.loaded, "data_dependent", ()))
    out: dict[str, TensorPlan] = {}
    for t, fmt in tensor_formats.items():
        shape = tuple(int(d) for d in state.shapes.get(t, ()))
        dt = np.dtype(tensor_dtypes[t]) if tensor_dtypes.get(t) != "bfloat16" else state.device_dtype(t)
        storage: tuple[int, ...] | None = None
        c0 = None
        if t not in dynamic and all(d >= 0 for d in shape) and t in state.shapes:
            if is_plain(fmt) or fmt in HOST_LAYOUTS:
                storage = shape if fmt not in HOST_LAYOUTS else tuple(
                    shape[j] for j in _host_perm(fmt, HOST_LAYOUTS[fmt][0]))
            else:
                try:
                    c0 = formats.resolve_c0(fmt, dt, state.cube_c0(t, fmt) if t in state.shapes else None)
                    storage = tuple(formats.storage_shape(fmt, shape, dt, c0=c0))
                except Exception:  # a shape the format cannot hold: reported without a storage shape
                    storage = None
        nbytes = int(np.prod(storage, dtype=np.int64)) * dt.itemsize if storage is not None else 0
        out[t] = TensorPlan(fmt, dt.name, shape, storage, c0, nbytes)
    return out


def _transfers(state: PlanState, tensor_dtypes: dict[str, str]) -> tuple[list[Transfer], list[Transfer]]:
    """Graph inputs arrive in the host format (plain, or channels-last under ``--input-format``) and
    the plan's first TransData converts them on the device; outputs leave in their plain layout."""
    loaded = state.loaded

    def one(info, host_fmt: str | None, is_input: bool) -> Transfer:
        shape = list(info.shape)
        if not is_input and not loaded.gears and info.name in loaded.shapes:
            shape = list(loaded.shapes[info.name])
        full = list(loaded.shapes.get(info.name, tuple(max(d, 0) for d in shape)))
        fmt = host_fmt or plain_name(len(shape))
        dt = np.dtype(info.dtype)
        nbytes = int(np.prod(full, dtype=np.int64)) * dt.itemsize
        dev_dt = tensor_dtypes.get(info.name, dt.name)
        if fmt in HOST_LAYOUTS:
            # the host feeds (and the device receives) the compact channels-last array; the lowered
            # graph itself declares graph_format
            perm = _host_perm(fmt, HOST_LAYOUTS[fmt][0])
            return Transfer(info.name, tuple(shape[j] for j in perm), dt.name, fmt, fmt,
                            tuple(full[j] for j in perm), dev_dt, None, nbytes, HOST_LAYOUTS[fmt][0], tuple(shape))
        return Transfer(info.name, tuple(shape), dt.name, fmt, fmt, tuple(full), dev_dt, None, nbytes)

    host = {i.name: (state.host_formats.get(i.name) or plain_name(len(tuple(i.shape)))) for i in loaded.inputs}
    return ([one(i, host[i.name], True) for i in loaded.inputs],
            [one(o, None, False) for o in loaded.outputs])


def outer_names(node: onnx.NodeProto) -> set[str]:
    """Tensors of the enclosing graph that the bodies of ``node`` (If/Loop/Scan, nested included)
    read: names read inside and defined by no body node, body input or body initializer."""
    return _graph_reads(_subgraphs(node))


_outer_reads = fusion.subgraph_reads  # names If/Loop/Scan bodies read: they keep outer tensors alive


def _memory_plan(state: PlanState, transdata: list[TransData], memory) -> Any:
    last = len(state.nodes)
    first: dict[str, int] = {}
    end: dict[str, int] = {}
    for t in state.graph_inputs:
        first[t], end[t] = -1, -1
    for n in state.nodes:
        if n.folded:
            continue
        for t in list(n.node.input) + sorted(_outer_reads(n.node)):
            if t in first:
                end[t] = max(end[t], n.idx)
        for o in n.node.output:
            if o and state.is_activation(o) and o not in first:
                first[o], end[o] = n.idx, n.idx
    for o in state.graph_outputs:
        if o in end:
            end[o] = last
    idx = {n.node.name: n.idx for n in state.nodes}
    # tensors with data-dependent shapes (loaded.data_dependent) have no size to plan: left out
    dynamic = set(getattr(state.loaded, "data_dependent", ()))
    tensors = [memory.MemTensor(t, state.storage_bytes(t, state.tensor_format(t)), f, end[t])
               for t, f in first.items() if t not in dynamic]
    for td in transdata:
        steps = [idx[c] if c in idx else last for c in td.consumers]
        tensors.append(memory.MemTensor(f"{td.name}:{td.tensor}", td.dst_bytes, min(steps), max(steps)))
    return memory.plan_memory(tensors)  # validated there: alignment, no overlap of live tensors


def _cost(state: PlanState, transdata: list[TransData], naive: list[TransData], soc: str,
          fused: set[str] = frozenset()) -> Any:
    """The estimate of the top-level graph plus its bodies: an If counts its costlier branch, a
    Loop/Scan body one iteration (trip counts are run-time values)."""
    try:
        costmod.get_soc_profile(soc)
    except InputError:
        return None
    state.not_estimated = []
    est_ops, tds = _cost_items(state, transdata, naive, soc, costmod, fused)
    return costmod.estimate(est_ops, tds, soc)


def _cost_items(state: PlanState, transdata: list[TransData], naive: list[TransData], soc: str,
                costmod, fused: set[str] = frozenset()) -> tuple[list, list]:
    dtypes = {t: state.device_dtype(t) for t in state.dtypes}
    est_ops = []
    for n in state.nodes:
        if n.folded or any(t in fused for t in n.node.input):
            continue  # folded at conversion, or an elementwise op fused into its producer's kernel
        try:
            work = costmod.op_work(n.node, state.shapes, dtypes)
        except Exception:  # shapes the cost model cannot read: left out of the estimate, and said so
            state.not_estimated.append(n.node.name)
            continue
        operand = None
        if n.node.op_type in ("MatMul", "Gemm"):
            operand = "NZ" if n.fmt == NZ else "ND"
        est_ops.append(costmod.EstimatedOp(n.node.name, n.node.op_type, work, dtype=n.dtype,
                                           engine=n.engine if n.engine in costmod.ENGINES else "AI Core",
                                           operand_format=operand))
    for td in transdata + naive:
        td.est_us = float(costmod.transdata_time_us(td.bytes, td.src_format, td.dst_format, soc,
                                                     dst_nbytes=td.dst_bytes))
    tds = [costmod.EstimatedTransData(t.name, t.src_format, t.dst_format, t.bytes, t.dst_bytes) for t in transdata]
    by_owner: dict[str, list[tuple[float, list, list]]] = {}
    for b in state.bodies:
        b.state.not_estimated = state.not_estimated  # one list for the whole model
        b_ops, b_tds = _cost_items(b.state, b.transdata, b.naive, soc, costmod)
        total = costmod.estimate(b_ops, b_tds, soc).total_us if (b_ops or b_tds) else 0.0
        by_owner.setdefault(b.owner, []).append((float(total), b_ops, b_tds))
    for choices in by_owner.values():
        _, b_ops, b_tds = max(choices, key=lambda c: c[0])
        est_ops += b_ops
        tds += b_tds
    return est_ops, tds


def _names(nodes: Sequence[str], k: int = 3) -> str:
    return ", ".join(nodes[:k]) + (f" and {len(nodes) - k} more" if len(nodes) > k else "")


def atc_differences(state: PlanState) -> list[str]:
    """Where this plan is known to differ from ATC's build, in terms a user can check on the ``.om``
    (``npu-deploy inspect MODEL.om`` lists its ops, formats and the ONNX names fused into each)."""
    out: list[str] = []
    split, kt, merge = [], [], []
    states = [state] + [b.state for b in all_bodies(state)]
    for s in states:
        for n in s.nodes:
            if n.fmt != NZ or n.node.op_type != "Transpose":
                continue
            pair = head_pair(s, n)
            if pair.reason is None and pair.kind:
                {"split": split, "split-kt": kt, "merge": merge}[pair.kind].append(f"{pair.partner} + {n.node.name}")
    if split or merge:
        pairs = split + merge
        out.append(f"attention head split/merge ({len(pairs)} Reshape + Transpose pairs, e.g. {_names(pairs, 2)}) "
                   f"run here as two FRACTAL_NZ ops each; ATC fuses each pair into one ConfusionTransposeD "
                   f"(the .om lists a ConfusionTransposeD whose original names are both nodes, and no "
                   f"TransData around it)")
    if kt:
        out.append(f"K^T ({len(kt)} Reshape + Transpose pairs, e.g. {_names(kt, 2)}) is a FRACTAL_NZ transpose "
                   f"here; ATC reads K in place as the second operand of BatchMatMul with adj_x2=true (the "
                   f".om's BatchMatMul lists the Transpose among its original names)")
    rnn = [n.node.name for s in states for n in s.nodes if n.node.op_type in ("LSTM", "GRU") and not n.folded]
    if rnn:
        out.append(f"{_names(rnn)} ({len(rnn)} recurrent op(s)) planned in ND here; ATC rewrites LSTM/GRU to "
                   f"DynamicRNN/DynamicGRUV2, which read FRACTAL_NZ activations and FRACTAL_ZN_RNN weights: "
                   f"expect TransData next to them in the .om that this plan does not count")
    if state.precision_mode != "must_keep_origin_dtype":
        ends = [t for t in [*state.graph_inputs, *state.graph_outputs]
                if state.dtypes.get(t) == np.float32 and state.is_activation(t)]
        casts = [t for t in ends if t in state.graph_inputs and any(
            state.nodes[k].dtype == "float16" for k, _ in state.consumers.get(t, []))]
        casts += [t for t in ends if t in state.graph_outputs and state.device_dtype(t) == np.float16]
        if casts:
            out.append(f"float32 graph inputs/outputs computed in float16 ({_names(casts)}): ATC inserts a Cast "
                       f"next to each (trans_Cast_* ops in the .om and in msprof); this plan has no separate Cast "
                       f"ops, so their time is not in the estimate")
    owners = list(dict.fromkeys(b.owner for b in all_bodies(state)))
    if owners:
        out.append(f"{_names(owners)} ({len(owners)} If/Loop/Scan node(s)): their bodies return ND here (and "
                   f"Loop/Scan state enters in ND); ATC compiles each body as a subgraph of its own and may keep "
                   f"a blocked format across the boundary (the .om has one partition per body: compare the "
                   f"formats of the ops next to it)")
    return out


def _c0_boundaries(transdata: Sequence[TransData]) -> list[str]:
    """Tensors written in a blocked format with one C0 and read with the other (a float32 cube op's
    C0 = 8 read by a vector op with C0 = 16, or the reverse): each such change is a planned chain of two
    TransData (the second names the first in ``after``), one entry per chain."""
    return [td.tensor for td in transdata if td.after is not None]


def _report(loaded, state, soc, precision_mode, support, naive, transdata, weights, mem, cost) -> PlanReport:
    formats_count: dict[str, int] = {}
    folded = planned = 0
    for s in [state] + [b.state for b in all_bodies(state)]:
        for n in s.nodes:
            if n.folded:
                folded += 1
                continue
            planned += 1
            key = plain_name(s.rank(n.node.output[0]) if n.node.output else 0) if is_plain(n.fmt) else n.fmt
            formats_count[key] = formats_count.get(key, 0) + 1
    notes = list(getattr(loaded, "warnings", ()))  # what loading worked around (onnx_model.load_model)
    notes += state.notes  # inputs --input-format does not apply to
    mixed = _c0_boundaries(transdata)
    if mixed:
        notes.append(f"{len(mixed)} float32 C0 change(s) between a cube op (C0 = 8) and a vector op (C0 = 16) in "
                     f"the same blocked format (e.g. {_names(list(dict.fromkeys(mixed)), 2)}): two formats to GE "
                     f"(C0 sits in the format's high bits), each converted through NCHW by two TransData (the "
                     f"first shared with the tensor's plain readers, if any; docs/ge-rules.md R7)")
    differences = atc_differences(state)
    if state.bodies:
        notes.append(f"{len(all_bodies(state))} If/Loop/Scan bodies planned (outer tensors enter as stored, "
                     f"body inputs and outputs are ND); the estimate counts each If's costlier branch and one "
                     f"Loop/Scan iteration; body tensors are not in the memory plan")
    if differences:
        notes.append(f"{len(differences)} known difference(s) from what ATC builds (convert --explain lists "
                     f"them, with how to check each on a real .om)")
    cost_d = None
    if cost is not None:
        cost_d = {"estimated": True, "compute_us": float(cost.compute_us),
                  "formattrans_us": float(cost.formattrans_us), "total_us": float(cost.total_us),
                  "formattrans_share": float(cost.formattrans_share), "flagged": bool(cost.flagged),
                  "naive_formattrans_us": float(sum(t.est_us or 0 for t in naive))}
    else:
        notes.append(f"no cost profile for {soc}: times not estimated")
    if loaded.gears:
        notes.append(f"sizes and times at the largest of {len(loaded.gears)} gears")
    skipped = getattr(state, "not_estimated", [])
    if skipped:
        notes.append(f"{len(skipped)} op(s) left out of the time estimate (shapes unknown to the cost "
                     f"model): {', '.join(skipped[:5])}" + (" …" if len(skipped) > 5 else ""))
    return PlanReport(
        model=loaded.path.name, soc=soc, precision_mode=precision_mode,
        nodes=planned, constant_folded=folded, engines=support.counts(),
        formats=formats_count, transdata_naive_count=len(naive),
        transdata_naive_bytes=sum(t.bytes for t in naive), transdata_count=len(transdata),
        transdata_bytes=sum(t.bytes for t in transdata), transdata=[t.to_manifest() for t in transdata],
        weights_prepacked=len(weights), weights_bytes=sum(w.nbytes for w in weights),
        memory=mem.summary(), cost=cost_d, notes=notes, atc_differences=differences)
