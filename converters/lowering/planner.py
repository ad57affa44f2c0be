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
   of consumers) gives the **optimised plan**; :func:`verify_plan` checks the guarantees (every node
   has formats; after TransData every edge's producer and consumer formats agree; no cancellable pair
   left).

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

import dataclasses
import functools
from typing import Any, Callable, ClassVar, Iterable, Sequence

import numpy as np
import onnx
from onnx import helper

from npu_deploy import _thresholds
from npu_deploy._result import Result
from npu_deploy.converters.lowering import fusion
from npu_deploy.errors import InputError, InternalError

ND = "ND"
NC1HWC0 = "NC1HWC0"
C04 = "NC1HWC0_C04"
NDC1HWC0 = "NDC1HWC0"
NZ = "FRACTAL_NZ"
PRIVATE_5HD = (NC1HWC0, C04, NDC1HWC0)
# Channels-last host layouts of --input-format: name -> (the graph's layout, rank). Plain (no padding),
# but a different axis order from the ONNX graph: converting costs a transpose.
HOST_LAYOUTS: dict[str, tuple[str, int]] = {"NHWC": ("NCHW", 4), "NDHWC": ("NCDHW", 5)}
# --input-format values and the input rank each applies to (None: any rank).
INPUT_FORMAT_RANKS: dict[str, int | None] = {"NCHW": 4, "NHWC": 4, "NCDHW": 5, "NDHWC": 5, "ND": None}

PRECISION_MODES = ("force_fp16", "allow_fp32_to_fp16", "must_keep_origin_dtype", "allow_mix_precision")
FORMATTRANS_THRESHOLD_PCT = _thresholds.FORMATTRANS_THRESHOLD_PCT

# Ops kept in float32 under allow_mix_precision (numerically sensitive: reductions, exponentials,
# normalisations). npu-deploy's list, modelled on the "black list" idea of CANN's mixed precision.
MIX_PRECISION_FP32_OPS = frozenset({
    "Softmax", "LogSoftmax", "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceSumSquare",
    "ReduceL2", "ReduceLogSumExp", "Exp", "Log", "Pow", "Sqrt", "Erf", "InstanceNormalization",
    "GroupNormalization", "BatchNormalization", "Div", "Reciprocal", "CumSum",
})
# Cube-unit ops: the 310P cube has no float32 path, so allow_fp32_to_fp16 runs them in float16.
CUBE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN"})


# ------------------------------------------------------------------------------------------------
# The format preference table: the one place that says which format each op wants.
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FormatRule:
    """How an op takes its operands.

    ``kind``: ``"5hd"`` (activations in NC1HWC0 — NDC1HWC0 for 5-D — weight slot in FRACTAL_Z),
    ``"matmul"`` (operands and result in FRACTAL_NZ; constant B pre-packed), ``"concat"`` (a producer's
    blocked format: NC1HWC0 along C for any sizes, FRACTAL_NZ unless it joins a blocked axis with
    unaligned sizes; constant inputs packed at compile time), ``"follow"`` (format-
    agnostic: takes its producer's format where broadcasting allows), ``"reduce"`` (ND, or its
    producer's blocked format when the reduced axes leave the blocked ones whole), ``"slice"`` (the same
    rule for the axes a Slice cuts), ``"lastaxis"`` (ND, or
    FRACTAL_NZ when it normalises over the last axis of an NZ input), ``"view"`` (ND, or the input's
    blocked format when the blocked axes are untouched or the view is half of an attention head
    split/merge pair, :func:`head_pair`), ``"nd"`` (ND only).
    """

    kind: str
    data_slots: tuple[int, ...] = (0,)
    weight_slot: int | None = None
    note: str = ""


_5HD_NOTE = "its AI Core kernel reads activations in NC1HWC0"
_REDUCE_NOTE = ("{}: in NC1HWC0 (NDC1HWC0) when it reduces spatial axes only, in FRACTAL_NZ when it reduces "
                "outer axes only, keeping dims; other reductions run in ND")
FORMAT_RULES: dict[str, FormatRule] = {
    "Conv": FormatRule("5hd", (0,), 1, "Conv2D/Conv3D: NC1HWC0 (NDC1HWC0) activations, FRACTAL_Z weight"),
    "ConvTranspose": FormatRule("5hd", (0,), 1, "Conv2DTranspose: NC1HWC0 activations, FRACTAL_Z weight"),
    "MaxPool": FormatRule("5hd", note="MaxPoolV3: " + _5HD_NOTE),
    "AveragePool": FormatRule("5hd", note="AvgPoolV2: " + _5HD_NOTE),
    "LpPool": FormatRule("5hd", note="AvgPoolV2: " + _5HD_NOTE),
    "GlobalAveragePool": FormatRule("5hd", note="pooling: " + _5HD_NOTE),
    "GlobalMaxPool": FormatRule("5hd", note="pooling: " + _5HD_NOTE),
    "BatchNormalization": FormatRule("5hd", note="BatchNorm: " + _5HD_NOTE),
    "Resize": FormatRule("5hd", note="Resize/ResizeNearestNeighborV2: " + _5HD_NOTE),
    "Upsample": FormatRule("5hd", note="Resize: " + _5HD_NOTE),
    "LRN": FormatRule("5hd", note="LRN: " + _5HD_NOTE),
    "MaxRoiPool": FormatRule("5hd", note="ROIPooling: " + _5HD_NOTE),
    "RoiAlign": FormatRule("5hd", note="ROIAlign: " + _5HD_NOTE),
    "MatMul": FormatRule("matmul", (0, 1), 1, "BatchMatMulV2: the cube reads 16x16 FRACTAL_NZ fractals"),
    "Gemm": FormatRule("matmul", (0, 1), 1, "MatMulV2: the cube reads 16x16 FRACTAL_NZ fractals"),
    "Softmax": FormatRule("lastaxis", note="SoftmaxV2 has a FRACTAL_NZ kernel for axis = last (-1 or "
                                           "rank-1; padding masked); other axes run in ND"),
    "LogSoftmax": FormatRule("lastaxis", note="LogSoftmaxV2 has a FRACTAL_NZ kernel for axis = last (-1 or "
                                              "rank-1); other axes run in ND"),
    "LayerNormalization": FormatRule("lastaxis", note="LayerNorm takes FRACTAL_NZ only over the last axis"),
    "ReduceMean": FormatRule("reduce", note=_REDUCE_NOTE.format("ReduceMeanD")),
    "ReduceSum": FormatRule("reduce", note=_REDUCE_NOTE.format("ReduceSumD")),
    "ReduceMax": FormatRule("reduce", note=_REDUCE_NOTE.format("ReduceMaxD")),
    "ReduceMin": FormatRule("reduce", note=_REDUCE_NOTE.format("ReduceMinD")),
    "Reshape": FormatRule("view", note="Reshape keeps a blocked format only if the blocked axes are unchanged"),
    "Squeeze": FormatRule("view", note="Squeeze keeps a blocked format only if the blocked axes are unchanged"),
    "Unsqueeze": FormatRule("view", note="Unsqueeze keeps a blocked format only if the blocked axes are unchanged"),
    "Flatten": FormatRule("view", note="Flatten keeps a blocked format only if the blocked axes are unchanged"),
    "Transpose": FormatRule("view", note="Transpose keeps FRACTAL_NZ only if it leaves the last two axes alone"),
    "Identity": FormatRule("view", note="Identity keeps any format"),
    "Concat": FormatRule("concat", note="ConcatD keeps its producers' blocked format (NC1HWC0 along C "
                                        "whatever the channel counts; FRACTAL_NZ unless it joins along a "
                                        "blocked axis with sizes not multiples of the block); constant "
                                        "inputs are packed at compile time"),
    "Dropout": FormatRule("view", note="Dropout (inference) keeps any format"),
    "Slice": FormatRule("slice", note="StridedSliceD: in NC1HWC0 (NDC1HWC0) when it slices N and spatial axes "
                                      "only, in FRACTAL_NZ when it slices outer axes only; else ND"),
}
_FOLLOW_OPS = {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Relu", "Sigmoid", "Tanh", "Clip",
    "HardSigmoid", "HardSwish", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "Erf", "Exp", "Log",
    "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Sign", "Softplus", "Softsign", "Mish",
    "ThresholdedRelu", "Sin", "Cos", "Cast", "Where", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf", "Shrink", "Trilu",
}
for _op in _FOLLOW_OPS:
    FORMAT_RULES.setdefault(_op, FormatRule("follow", note="elementwise: runs in its producer's format; in "
                                                  "FRACTAL_NZ when other operands are (M, N), (1, N) or scalar"))
_ND_RULE = FormatRule("nd", note="needs ND (its kernel indexes the logical layout)")
_AICPU_RULE = FormatRule("nd", note="runs on AI CPU, which takes ND only")
_CONST_RULE = FormatRule("nd", note="compile-time constant")
_DYNAMIC_RULE = FormatRule("nd", note="output shape depends on input values: kept in ND")


def rule_for(op_type: str) -> FormatRule:
    """The format rule of an op type (``nd`` for ops not in :data:`FORMAT_RULES`)."""
    return FORMAT_RULES.get(op_type, _ND_RULE)


def is_plain(fmt: str) -> bool:
    """True for the row-major layouts (ND, NCHW, NHWC as given, NCDHW…): no conversion between them."""
    return fmt not in PRIVATE_5HD and fmt != NZ


def output_format(fmt: str) -> str:
    """The format a node running in ``fmt`` writes: NC1HWC0_C04 is an input-only layout (the first
    conv reads C04 and writes ordinary NC1HWC0)."""
    return NC1HWC0 if fmt == C04 else fmt


def plain_name(rank: int) -> str:
    return "NCHW" if rank == 4 else "NCDHW" if rank == 5 else ND


def display_format(fmt: str, rank: int) -> str:
    """The name reports use: host layouts as themselves, other plain layouts by rank, blocked as is."""
    if fmt in HOST_LAYOUTS:
        return fmt
    return plain_name(rank) if is_plain(fmt) else fmt


def host_input_formats(inputs, input_format: str | None) -> tuple[dict[str, str], list[str]]:
    """The host (user) format of each graph input under ``--input-format``, and notes.

    ``inputs``: objects with ``name`` and ``shape`` (``LoadedModel.inputs``). The format applies to
    inputs of its rank (4-D for NCHW/NHWC, 5-D for NCDHW/NDHWC; ``ND`` to all); other inputs keep their
    plain layout (ND, or NCHW/NCDHW by rank), which a note says. NHWC/NDHWC with no input of that rank
    would change nothing: an ``InputError``.

    >>> from types import SimpleNamespace as T
    >>> host_input_formats([T(name="x", shape=(1, 3, 8, 8)), T(name="m", shape=(1, 8))], "NHWC")
    ({'x': 'NHWC', 'm': 'ND'}, ['input m (rank 2) keeps ND: --input-format NHWC applies to 4-D inputs'])
    """
    out: dict[str, str] = {}
    notes: list[str] = []
    if input_format is not None and input_format not in INPUT_FORMAT_RANKS:
        raise InputError(f"unknown input format {input_format!r}",
                         hint=f"use one of: {', '.join(INPUT_FORMAT_RANKS)}")
    want = INPUT_FORMAT_RANKS.get(input_format) if input_format else None
    for i in inputs:
        rank = len(tuple(i.shape))
        if input_format is None:
            out[i.name] = plain_name(rank)
        elif want is None or rank == want:
            out[i.name] = input_format
        else:
            out[i.name] = plain_name(rank)
            if input_format in HOST_LAYOUTS:
                notes.append(f"input {i.name} (rank {rank}) keeps {out[i.name]}: --input-format "
                             f"{input_format} applies to {want}-D inputs")
    if input_format in HOST_LAYOUTS and not any(f == input_format for f in out.values()):
        ranks = ", ".join(f"{i.name} rank {len(tuple(i.shape))}" for i in inputs) or "none"
        raise InputError(f"--input-format {input_format} applies to {want}-D inputs, and the model has none "
                         f"(inputs: {ranks})",
                         hint="drop --input-format (inputs then keep the model's layout) or fix --input-shape")
    return out, notes


# ------------------------------------------------------------------------------------------------
# Plan data
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class NodeFormats:
    """The formats one node runs with. ``input_formats`` has ``None`` for empty optional inputs;
    constant inputs show the format they are stored in (converted at compile time)."""

    op_type: str
    engine: str
    input_formats: list[str | None]
    output_formats: list[str]
    dtype: str
    c0: int | None = None
    folded: bool = False
    why: str = ""

    def to_manifest(self) -> dict:
        return {"op_type": self.op_type, "engine": self.engine, "input_formats": self.input_formats,
                "output_formats": self.output_formats, "dtype": self.dtype, "c0": self.c0,
                "folded": self.folded}


@dataclasses.dataclass
class TransData:
    """One planned conversion on the edge ``tensor`` → ``consumers`` (ONNX node names)."""

    name: str
    tensor: str
    producer: str | None
    consumers: list[str]
    src_format: str
    dst_format: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    dst_bytes: int
    est_us: float | None = None
    reason: str = ""

    def to_manifest(self) -> dict:
        return {"name": self.name, "tensor": self.tensor, "producer": self.producer,
                "consumers": list(self.consumers), "src_format": self.src_format,
                "dst_format": self.dst_format, "shape": list(self.shape), "dtype": self.dtype,
                "bytes": self.bytes, "dst_bytes": self.dst_bytes, "est_us": self.est_us,
                "onnx_nodes": [n for n in [self.producer, *self.consumers] if n], "reason": self.reason}


@dataclasses.dataclass
class PackedWeight:
    """A constant stored pre-packed: ``logical_shape`` is what ``formats.pack`` takes (a 4-D view for
    Conv1d weights), ``onnx_shape`` the initializer's own shape."""

    name: str
    format: str
    logical_shape: tuple[int, ...]
    onnx_shape: tuple[int, ...]
    dtype: str
    source_dtype: str
    c0: int | None
    groups: int
    origin: str | None
    consumers: list[str]
    nbytes: int


@dataclasses.dataclass
class _Node:
    idx: int
    node: onnx.NodeProto
    rule: FormatRule
    engine: str
    folded: bool
    fmt: str = ND
    why: str = ""
    fixed: bool = False  # the format is the kernel's (cannot move to another format)
    dtype: str = "float32"
    c0_weight: bool = False  # first conv with small-channel input (C04)
    fp16_only: bool = False  # its AI Core kernel takes float16 but not float32 (op-info)


class PlanState:
    """What the passes read and write: nodes with their current format, tensors, shapes, consumers."""

    def __init__(self, loaded, support, *, precision_mode: str, keep_dtype: Sequence[str],
                 enable_small_channel: bool, input_format: str | None, outer_const: Iterable[str] = ()):
        from npu_deploy.converters.lowering.support import AI_CPU, BUILTIN, constant_tensors

        self.loaded = loaded
        self.graph = loaded.model.graph
        self.shapes: dict[str, tuple[int, ...]] = dict(loaded.shapes)
        self.dtypes: dict[str, np.dtype] = {k: np.dtype(v) for k, v in loaded.dtypes.items()}
        self.precision_mode = precision_mode
        self.enable_small_channel = enable_small_channel
        self.input_format = input_format
        formats_by_input, self.notes = host_input_formats(loaded.inputs, input_format)
        # graph inputs the host feeds in a channels-last layout (NHWC/NDHWC): produced in that layout
        self.host_formats: dict[str, str] = {k: v for k, v in formats_by_input.items() if v in HOST_LAYOUTS}
        static = {} if loaded.gears else dict(loaded.shapes)
        self.const = constant_tensors(self.graph, static) | set(outer_const)
        self.bodies: list[Body] = []  # the planned If/Loop/Scan bodies of this graph's nodes
        self.non_tensors = dict(getattr(loaded, "non_tensors", {}))
        self.graph_inputs = [i.name for i in loaded.inputs]
        self.graph_outputs = [o.name for o in self.graph.output]
        self.producer: dict[str, tuple[int, int]] = {}
        self.consumers: dict[str, list[tuple[int, int]]] = {}
        eng = {n.name: n for n in support.nodes}
        dynamic = set(getattr(loaded, "data_dependent", ()))
        self.nodes: list[_Node] = []
        for k, n in enumerate(self.graph.node):
            s = eng.get(n.name)
            engine = s.engine if s is not None else "AI Core"
            folded = n.op_type in BUILTIN or bool(s is not None and s.folded) or (
                bool(n.output) and all(o in self.const for o in n.output if o))
            if folded:
                rule = _CONST_RULE
            elif engine == AI_CPU:
                rule = _AICPU_RULE
            elif any(o in dynamic for o in n.output):
                rule = _DYNAMIC_RULE
            else:
                rule = rule_for(n.op_type)
            node = _Node(k, n, rule, engine, folded)
            node.fp16_only = bool(s is not None and "runs in float16" in s.detail)
            self.nodes.append(node)
            for j, o in enumerate(n.output):
                if o:
                    self.producer[o] = (k, j)
            for j, i in enumerate(n.input):
                if i:
                    self.consumers.setdefault(i, []).append((k, j))
        self.keep_dtype = self._resolve_keep(keep_dtype)
        self.explanations: dict[tuple[str, str], str] = {}
        self.by_name: dict[str, _Node] = {n.node.name: n for n in self.nodes}
        self._bytes_cache: dict[tuple[str, str], int] = {}
        self._slot_cache: dict[tuple[int, str], list[str | None]] = {}
        self._dtype_cache: dict[str, np.dtype] = {}

    def _resolve_keep(self, keep: Sequence[str]) -> set[int]:
        out: set[int] = set()
        names = {n.node.name: n.idx for n in self.nodes}
        types = {n.node.op_type for n in self.nodes}
        for item in keep or ():
            item = item.strip()
            if not item:
                continue
            if item.startswith("OpType::"):
                t = item[len("OpType::"):]
                if t not in types:
                    raise InputError(f"--keep-dtype {item}: the model has no {t} node",
                                     hint=f"op types in the model: {', '.join(sorted(types))[:300]}")
                out |= {n.idx for n in self.nodes if n.node.op_type == t}
            elif item in names:
                out.add(names[item])
            else:
                raise InputError(f"--keep-dtype names node {item!r}, which is not in the model",
                                 hint="use ONNX node names (npu-deploy inspect MODEL lists them) or OpType::Name")
        return out

    # -- tensor helpers --------------------------------------------------------------------------
    def is_activation(self, t: str) -> bool:
        """A runtime tensor (not a constant; not a sequence/optional value, which has no format)."""
        return bool(t) and t not in self.const and t not in self.non_tensors

    def tensor_format(self, t: str) -> str:
        """Format a tensor is produced in (plain for graph inputs and constants)."""
        p = self.producer.get(t)
        if p is None or t in self.const:
            return self.host_formats.get(t, ND)
        return output_format(self.nodes[p[0]].fmt)

    def rank(self, t: str) -> int:
        return len(self.shapes.get(t, ()))

    def slot_formats(self, n: _Node, fmt: str | None = None) -> list[str | None]:
        """Required format of every input slot when ``n`` runs in ``fmt`` (None: no runtime need)."""
        fmt = n.fmt if fmt is None else fmt
        key = (n.idx, fmt)
        got = self._slot_cache.get(key)
        if got is None:
            got = self._slot_cache[key] = self._slot_formats(n, fmt)
        return got

    def _slot_formats(self, n: _Node, fmt: str) -> list[str | None]:
        out: list[str | None] = []
        for j, t in enumerate(n.node.input):
            if not t or not self.is_activation(t):
                out.append(None)
                continue
            if is_plain(fmt):
                out.append(ND)
            elif n.rule.kind in ("5hd", "matmul", "lastaxis", "view", "reduce", "slice"):
                out.append(fmt if j in n.rule.data_slots else ND)
            elif n.rule.kind == "follow":
                out.append(fmt if _numel(self.shapes.get(t, ())) != 1 else None)
            elif n.rule.kind == "concat":
                out.append(fmt)
            else:
                out.append(ND)
        return out

    def needs(self, t: str) -> list[tuple[str | None, str]]:
        """(consumer node name or None for a graph output, required format) for each use of ``t``."""
        out = []
        for k, j in self.consumers.get(t, []):
            n = self.nodes[k]
            if n.folded:
                continue  # folded at compile time (e.g. Shape of a static tensor): reads no data
            req = self.slot_formats(n)[j]
            if req is not None:
                out.append((n.node.name, req))
        if t in self.graph_outputs:
            out.append((None, ND))
        return out

    def count_conversions(self, around: Iterable[str]) -> tuple[int, int]:
        """(conversions, bytes) needed on the given tensors, one per (tensor, target format)."""
        count = nbytes = 0
        for t in around:
            if not self.is_activation(t):
                continue
            src = self.tensor_format(t)
            targets = {req for _, req in self.needs(t) if not _same(req, src)}
            count += len(targets)
            nbytes += len(targets) * self.storage_bytes(t, src)
        return count, nbytes

    def storage_bytes(self, t: str, fmt: str) -> int:
        """Bytes of ``t`` stored in ``fmt`` with its device dtype (dtypes are fixed before any pass)."""
        key = (t, ND if is_plain(fmt) else fmt)
        got = self._bytes_cache.get(key)
        if got is None:
            got = self._bytes_cache[key] = self._storage_bytes(t, fmt)
        return got

    def _storage_bytes(self, t: str, fmt: str) -> int:
        shape = self.shapes.get(t)
        if shape is None:
            return 0
        dt = self.device_dtype(t)
        if is_plain(fmt):
            return _numel(shape) * dt.itemsize
        return _format_nbytes(fmt, tuple(shape), dt)

    def device_dtype(self, t: str) -> np.dtype:
        """The dtype ``t`` has on the device (its producer's compute dtype for float32 tensors).
        Cached: call only after node dtypes are assigned."""
        got = self._dtype_cache.get(t)
        if got is None:
            got = self._dtype_cache[t] = self._device_dtype(t)
        return got

    def _device_dtype(self, t: str) -> np.dtype:
        dt = self.dtypes.get(t, np.dtype(np.float32))
        p = self.producer.get(t)
        if p is not None and dt == np.float32 and not self.nodes[p[0]].folded:
            return np.dtype(self.nodes[p[0]].dtype)
        return dt


def _same(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return True
    return a == b or (is_plain(a) and is_plain(b) and a not in HOST_LAYOUTS and b not in HOST_LAYOUTS)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n


@functools.lru_cache(maxsize=4096)
def _format_nbytes(fmt: str, shape: tuple[int, ...], dt: np.dtype) -> int:
    from npu_deploy.converters import formats

    try:
        return int(formats.nbytes(fmt, view_shape(fmt, shape), dt, c0=_c0_for(fmt, dt)))
    except Exception:  # a shape the format cannot hold: counted as stored plainly
        return _numel(shape) * dt.itemsize


@functools.lru_cache(maxsize=256)
def _c0_for(fmt: str, dtype: np.dtype) -> int | None:
    from npu_deploy.converters import formats

    if is_plain(fmt):
        return None
    if fmt == C04:
        return 4
    return formats.default_c0(dtype)


def view_shape(fmt: str, shape: Sequence[int]) -> tuple[int, ...]:
    """The logical shape a format packs: a 3-D ``[N, C, L]`` activation in NC1HWC0 is ``[N, C, 1, L]``
    (Conv1d and 1-D pooling run as 2-D kernels with H = 1, as ATC's plugins do with Unsqueeze)."""
    shape = tuple(int(d) for d in shape)
    if fmt in (NC1HWC0, C04) and len(shape) == 3:
        return (shape[0], shape[1], 1, shape[2])
    return shape


# ------------------------------------------------------------------------------------------------
# Passes
# ------------------------------------------------------------------------------------------------

class Pass:
    """A graph pass over a :class:`PlanState`. ``run`` returns True when it changed anything."""

    name: ClassVar[str] = "pass"
    requires: ClassVar[str] = ""
    guarantees: ClassVar[str] = ""

    def run(self, state: PlanState) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


class AssignPreferredFormats(Pass):
    """Every node gets its kernel's preferred format (format-agnostic ones: ND)."""

    name = "assign-preferred-formats"
    requires = "shapes inferred for every tensor; engines known"
    guarantees = "every node has a format; the TransData it implies is the naive plan"

    def run(self, state: PlanState) -> bool:
        first_conv_done = False
        for n in state.nodes:
            fmt, why, fixed = ND, n.rule.note, False
            kind = n.rule.kind
            data = n.node.input[0] if n.node.input else ""
            r = state.rank(data) if data else 0
            if n.folded:
                why = "constant-folded at compile time"
                fixed = True
            elif kind == "5hd":
                if r == 4 or (r == 3 and n.node.op_type in ("Conv", "MaxPool", "AveragePool", "BatchNormalization",
                                                            "GlobalAveragePool", "GlobalMaxPool")):
                    fmt, fixed = NC1HWC0, True
                elif r == 5 and n.node.op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool"):
                    fmt, why, fixed = NDC1HWC0, n.rule.note.replace("NC1HWC0", "NDC1HWC0"), True
                else:
                    why = f"{n.node.op_type} on a rank-{r} tensor runs in ND"
                if (fmt == NC1HWC0 and n.node.op_type == "Conv" and state.enable_small_channel
                        and not first_conv_done and r == 4 and _feeds_from_input(state, data)):
                    w = state.shapes.get(n.node.input[1], ())
                    if len(w) == 4 and w[1] <= 4 and int(_attr(n.node, "group", 1)) == 1:
                        fmt, n.c0_weight = C04, True
                        why = "first conv with <= 4 input channels (--enable-small-channel): NC1HWC0_C04"
                if n.node.op_type == "Conv":
                    first_conv_done = True
            elif kind == "matmul":
                a = state.rank(n.node.input[0])
                b = state.rank(n.node.input[1]) if len(n.node.input) > 1 else 0
                if a >= 2 and b >= 2:
                    fmt, fixed = NZ, True
                else:
                    why = f"{n.node.op_type} with a 1-D operand runs in ND"
            else:
                fixed = kind == "nd"
            n.fmt, n.why, n.fixed = fmt, why, fixed
        return True


def _feeds_from_input(state: PlanState, t: str) -> bool:
    """``t`` is a graph input, or computed from one by format-agnostic elementwise ops only."""
    seen = 0
    while seen < 16:
        if t in state.graph_inputs:
            return True
        p = state.producer.get(t)
        if p is None:
            return False
        n = state.nodes[p[0]]
        if n.rule.kind not in ("follow", "view"):
            return False
        acts = [i for i in n.node.input if state.is_activation(i)]
        if len(acts) != 1:
            return False
        t = acts[0]
        seen += 1
    return False


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def check_format(state: PlanState, n: _Node, fmt: str) -> str | None:
    """Can flexible node ``n`` run in ``fmt``? None if yes, else the reason why not."""
    if fmt in HOST_LAYOUTS:
        return f"{n.node.op_type} runs in the graph's layout, not the host layout {fmt}"
    if is_plain(fmt):
        return None
    if n.fixed:
        return f"{n.node.op_type} {n.node.name} must run in {n.fmt} ({n.why})"
    kind = n.rule.kind
    outs = [o for o in n.node.output if o]
    out_shape = state.shapes.get(outs[0], ()) if outs else ()
    if kind == "follow":
        return _check_broadcast(state, n, fmt, out_shape)
    if kind == "concat":
        return _check_concat(state, n, fmt, out_shape)
    if kind == "reduce":
        return _check_reduce(state, n, fmt)
    if kind == "slice":
        return _check_slice(state, n, fmt)
    if kind == "lastaxis":
        if fmt != NZ:
            return f"{n.node.op_type} takes ND or FRACTAL_NZ, not {fmt}"
        r = len(out_shape)
        axis = int(_attr(n.node, "axis", -1))
        if n.node.op_type == "Softmax" and state.loaded.opset < 13:
            axis = int(_attr(n.node, "axis", 1))
            if axis % max(r, 1) != r - 1:
                return f"{n.node.op_type} at opset < 13 flattens from axis {axis}: not the last axis only"
        if r < 2 or axis % r != r - 1:
            return f"{n.node.op_type} normalises over axis {axis}, not the last axis of a rank-{r} tensor"
        return None
    if kind == "view":
        src = n.node.input[0]
        in_shape = state.shapes.get(src, ())
        if n.node.op_type in ("Identity", "Dropout"):
            return None
        if fmt != NZ:
            return f"{n.node.op_type} regroups axes, which {fmt}'s C1/C0 split does not allow"
        if len(in_shape) < 2 or len(out_shape) < 2:
            return f"{n.node.op_type} output has rank < 2: nothing to keep in FRACTAL_NZ"
        if n.node.op_type == "Transpose":
            perm = list(_attr(n.node, "perm", list(range(len(in_shape)))[::-1]))
            r = len(perm)
            if perm[-2:] != [r - 2, r - 1]:
                pair = head_pair(state, n)
                if pair.kind:
                    return pair.reason
                return (f"Transpose perm {perm} moves the last two axes (the FRACTAL_NZ blocks), and it is "
                        f"not half of an attention head split/merge ({pair.reason})")
            return None
        if tuple(in_shape[-2:]) != tuple(out_shape[-2:]):
            pair = head_pair(state, n) if n.node.op_type == "Reshape" else None
            if pair is not None and pair.kind:
                return pair.reason
            return (f"{n.node.op_type} changes the last two axes {tuple(in_shape[-2:])} -> "
                    f"{tuple(out_shape[-2:])}, which FRACTAL_NZ blocks"
                    + (f", and it is not half of an attention head split/merge ({pair.reason})" if pair else ""))
        return None
    return f"{n.node.op_type} needs ND ({n.rule.note})"


@dataclasses.dataclass(frozen=True)
class HeadPair:
    """What :func:`head_pair` found. ``kind``: ``"split"`` (Reshape [.., S, H*D] -> [.., S, H, D] +
    Transpose to [.., H, S, D]), ``"split-kt"`` (the same Transpose to K^T [.., H, D, S], read by
    MatMul as its second operand), ``"merge"`` (Transpose [.., H, S, D] -> [.., S, H, D] + Reshape to
    [.., S, H*D]), or ``""`` (not such a pair). ``reason``: None when the pair may run in FRACTAL_NZ,
    else why not (or, for ``""``, which part of the pattern is missing)."""

    kind: str
    reason: str | None
    partner: str = ""


def _perm(node: onnx.NodeProto, rank: int) -> list[int]:
    return [int(a) for a in _attr(node, "perm", list(range(rank))[::-1])]


def _split_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, int] | None:
    """(H, D) when ``a`` = P + (S, H*D) and ``b`` = P + (S, H, D), else None."""
    a, b = tuple(a), tuple(b)
    if len(b) != len(a) + 1 or len(a) < 2 or a[:-1] != b[:-2] or b[-2] * b[-1] != a[-1] or b[-2] < 1:
        return None
    return b[-2], b[-1]


def _live_consumers(state: PlanState, t: str) -> list[tuple[_Node, int]]:
    return [(state.nodes[k], j) for k, j in state.consumers.get(t, []) if not state.nodes[k].folded]


def _pair_ok(state: PlanState, kind: str, t: str, head_dim: int, partner: _Node) -> HeadPair:
    block = _c0_for(NZ, state.device_dtype(t))
    what = {"split": "attention head split", "split-kt": "attention head split to K^T",
            "merge": "attention head merge"}[kind]
    if head_dim % block:
        return HeadPair(kind, f"{what} with {partner.node.name}: head size {head_dim} is not a multiple of "
                              f"{block}, so FRACTAL_NZ's {block}-column fractals would straddle heads",
                        partner.node.name)
    return HeadPair(kind, None, partner.node.name)


def head_pair(state: PlanState, n: _Node) -> HeadPair:
    """Is ``n`` (a Reshape or Transpose) half of an attention head split or merge that FRACTAL_NZ
    holds as is? With the head size D a multiple of the fractal width, [.., S, H*D] in NZ and its
    split [.., H, S, D] in NZ have the same bytes (CANN fuses the pair as ConfusionTransposeD); K^T
    [.., H, D, S] is read by BatchMatMul as a transposed operand (``adj_x2``). The check looks at
    the pair, never at one node alone: each half alone regroups the fractal axes."""
    op = n.node.op_type
    src = n.node.input[0] if n.node.input else ""
    outs = [o for o in n.node.output if o]
    if not src or not outs:
        return HeadPair("", "no data input or output")
    in_shape, out_shape = tuple(state.shapes.get(src, ())), tuple(state.shapes.get(outs[0], ()))
    p = len(in_shape) - 3  # leading (batch) axes kept in place
    if op == "Reshape":
        hd = _split_shapes(in_shape, out_shape)
        if hd is not None:
            cons = _live_consumers(state, outs[0])
            if not cons or outs[0] in state.graph_outputs:
                return HeadPair("", "its output is not read by a Transpose only")
            kinds = set()
            for c, _ in cons:
                got = head_pair(state, c) if c.node.op_type == "Transpose" else HeadPair("", "")
                if not got.kind.startswith("split") or got.partner != n.node.name:
                    return HeadPair("", f"{c.node.op_type} {c.node.name} after it is not a head transpose")
                if got.reason is not None:
                    return got
                kinds.add(got.kind)
            return _pair_ok(state, sorted(kinds)[0], src, hd[1], cons[0][0])
        hd = _split_shapes(out_shape, in_shape)
        if hd is not None:
            pr = state.producer.get(src)
            prod = state.nodes[pr[0]] if pr else None
            if prod is None or prod.node.op_type != "Transpose":
                return HeadPair("", "it does not follow a head transpose")
            got = head_pair(state, prod)
            if got.kind != "merge":
                return HeadPair("", f"Transpose {prod.node.name} before it is not a head merge")
            return HeadPair("merge", got.reason, prod.node.name)
        return HeadPair("", f"Reshape {in_shape} -> {out_shape} neither splits the last axis into "
                            f"(heads, head size) nor merges them")
    if op != "Transpose" or len(in_shape) < 3:
        return HeadPair("", f"{op} is not a head split/merge transpose")
    perm = _perm(n.node, len(in_shape))
    head = list(range(p))  # P + (S, H, D) or P + (H, S, D): the last three axes move
    pr = state.producer.get(src)
    prod = state.nodes[pr[0]] if pr else None
    if perm in (head + [p + 1, p, p + 2], head + [p + 1, p + 2, p]) and prod is not None \
            and prod.node.op_type == "Reshape" and not prod.folded \
            and _split_shapes(state.shapes.get(prod.node.input[0], ()), in_shape) is not None \
            and all(c.node.op_type == "Transpose" for c, _ in _live_consumers(state, src)):
        kind = "split" if perm[-1] == p + 2 else "split-kt"
        if kind == "split-kt":
            readers = _live_consumers(state, outs[0])
            bad = [c for c, j in readers if c.node.op_type != "MatMul" or j != 1]
            if not readers or bad or outs[0] in state.graph_outputs:
                who = bad[0].node.name if bad else "a graph output"
                return HeadPair(kind, f"K^T split with {prod.node.name}: {who} does not read it as the "
                                      f"second MatMul operand (BatchMatMul adj_x2)", prod.node.name)
        return _pair_ok(state, kind, src, in_shape[-1], prod)
    if perm == head + [p + 1, p, p + 2]:
        cons = _live_consumers(state, outs[0])
        if cons and outs[0] not in state.graph_outputs and all(
                c.node.op_type == "Reshape" and _split_shapes(state.shapes.get(c.node.output[0], ()),
                                                              out_shape) is not None for c, _ in cons):
            return _pair_ok(state, "merge", src, in_shape[-1], cons[0][0])
    return HeadPair("", f"Transpose perm {perm} is not paired with a head Reshape")


def _reduce_axes(state: PlanState, n: _Node, rank: int) -> list[int] | None:
    """The axes a Reduce* node reduces (attribute, or the constant ``axes`` input of newer opsets);
    None when they are not known at compile time."""
    axes = _attr(n.node, "axes")
    if axes is None and len(n.node.input) > 1 and n.node.input[1]:
        if n.node.input[1] not in state.loaded.constants:
            return None
        axes = [int(a) for a in np.asarray(state.loaded.constant_array(n.node.input[1])).reshape(-1)]
    if axes is None or len(axes) == 0:
        return [] if int(_attr(n.node, "noop_with_empty_axes", 0)) else list(range(rank))
    return sorted({int(a) % max(rank, 1) for a in axes})


def _slice_axes(state: PlanState, n: _Node, rank: int) -> list[int] | None:
    """The axes a Slice cuts (attribute before opset 10, else the constant ``axes`` input; all leading
    axes when absent); None when they are not known at compile time."""
    if state.loaded.opset < 10:
        axes = _attr(n.node, "axes")
        count = len(_attr(n.node, "starts", []) or [])
    else:
        axes = None
        starts = n.node.input[1] if len(n.node.input) > 1 else ""
        if not starts or starts not in state.loaded.constants:
            return None
        count = int(np.asarray(state.loaded.constant_array(starts)).size)
        if len(n.node.input) > 3 and n.node.input[3]:
            if n.node.input[3] not in state.loaded.constants:
                return None
            axes = [int(a) for a in np.asarray(state.loaded.constant_array(n.node.input[3])).reshape(-1)]
    if axes is None:
        axes = list(range(count))
    return sorted({int(a) % max(rank, 1) for a in axes})


def _check_slice(state: PlanState, n: _Node, fmt: str) -> str | None:
    r = state.rank(n.node.input[0]) if n.node.input else 0
    axes = _slice_axes(state, n, r)
    if axes is None:
        return "Slice bounds are computed at run time"
    if fmt in (NC1HWC0, NDC1HWC0):
        if r != (5 if fmt == NDC1HWC0 else 4):
            return f"rank-{r} tensors cannot be held in {fmt}"
        if 1 in axes:
            return f"Slice cuts the channel axis, which {fmt} splits into C1 x C0 blocks"
        return None
    if fmt == NZ:
        if r < 2 or not set(axes) <= set(range(r - 2)):
            return f"Slice cuts axes {axes} of a rank-{r} tensor, which include FRACTAL_NZ's blocked last two axes"
        return None
    return f"Slice does not run in {fmt}"


def _check_reduce(state: PlanState, n: _Node, fmt: str) -> str | None:
    r = state.rank(n.node.input[0]) if n.node.input else 0
    if not int(_attr(n.node, "keepdims", 1)):
        return f"{n.node.op_type} with keepdims=0 drops axes, which regroups {fmt}'s blocks"
    axes = _reduce_axes(state, n, r)
    if axes is None:
        return f"{n.node.op_type} axes are computed at run time"
    if fmt in (NC1HWC0, NDC1HWC0):
        spatial = set(range(2, r))
        if r != (5 if fmt == NDC1HWC0 else 4):
            return f"rank-{r} tensors cannot be held in {fmt}"
        if not set(axes) <= spatial:
            return f"{n.node.op_type} reduces axes {axes}, not only the spatial axes {sorted(spatial)} of {fmt}"
        return None
    if fmt == NZ:
        if r < 2 or not set(axes) <= set(range(r - 2)):
            return (f"{n.node.op_type} reduces axes {axes} of a rank-{r} tensor, which include FRACTAL_NZ's "
                    f"blocked last two axes")
        return None
    return f"{n.node.op_type} does not run in {fmt}"


def _check_concat(state: PlanState, n: _Node, fmt: str, out_shape: Sequence[int]) -> str | None:
    # Constant inputs need no runtime conversion: they are packed into the weight blob in the node's
    # format at compile time (_plan_weights), as ATC does.
    r = len(out_shape)
    axis = int(_attr(n.node, "axis", 0)) % max(r, 1)
    ins = [t for t in n.node.input if t]
    if fmt in (NC1HWC0, NDC1HWC0):
        if r != (5 if fmt == NDC1HWC0 else 4):
            return f"rank-{r} tensors cannot be held in {fmt}"
        if axis != 1 or fmt == NC1HWC0:
            # ConcatD runs NC1HWC0 along C whatever the channel counts (ATC: 13 + 3 channels in NC1HWC0)
            return None
        block = _c0_for(fmt, state.device_dtype(ins[0]))
    elif fmt == NZ:
        if r < 2:
            return "rank < 2 cannot be held in FRACTAL_NZ"
        if axis < r - 2:
            return None
        block = 16 if axis == r - 2 else _c0_for(fmt, state.device_dtype(ins[0]))
    else:
        return f"Concat does not run in {fmt}"
    sizes = [state.shapes.get(t, (0,) * r)[axis] for t in ins]
    if all(sz % block == 0 for sz in sizes[:-1]):
        return None
    return (f"Concat joins along axis {axis}, which {fmt} pads to blocks of {block}, "
            f"and input sizes {sizes} are not all multiples of {block}")


def _check_broadcast(state: PlanState, n: _Node, fmt: str, out_shape: Sequence[int]) -> str | None:
    r = len(out_shape)
    if fmt in (NC1HWC0, C04) and r not in (3, 4):
        return f"output rank {r} cannot be held in {fmt}"
    if fmt == NDC1HWC0 and r != 5:
        return f"output rank {r} cannot be held in {fmt}"
    if fmt == NZ and r < 2:
        return "output rank < 2 cannot be held in FRACTAL_NZ"
    for t in n.node.input:
        if not t:
            continue
        s = tuple(state.shapes.get(t, ()))
        if _numel(s) == 1 or s == tuple(out_shape):
            continue
        const = not state.is_activation(t)
        aligned = (1,) * (r - len(s)) + s if len(s) <= r else None
        if aligned is None:
            return f"input {t} has a higher rank than the output"
        if fmt == NZ:
            # NZ holds an operand whose last two axes are the output's (M, N), broadcast only along the
            # outer axes, or a (1, N) row repeated over M (a bias row, an attention mask): the kernel
            # reuses the operand's one row of fractals per 16-row block. An activation operand is
            # converted to NZ by its own (small) TransData, counted like any other.
            if aligned[-2:] == tuple(out_shape[-2:]):
                continue
            if aligned[-2] == 1 and aligned[-1] == out_shape[-1]:
                continue
            what = "a constant" if const else "an activation"
            if aligned[-1] != out_shape[-1]:
                return (f"input {t} {s} ({what}) broadcasts along the last axis of {tuple(out_shape)} "
                        f"(N: {aligned[-1]} -> {out_shape[-1]}), which FRACTAL_NZ blocks into 16-column "
                        f"fractals; NZ takes only (M, N), (1, N) or scalar operands")
            return (f"input {t} {s} ({what}) broadcasts over the last two axes of {tuple(out_shape)} "
                    f"as (M, N) = {tuple(aligned[-2:])}, which FRACTAL_NZ blocks; NZ takes only "
                    f"(M, N), (1, N) or scalar operands")
        if fmt in PRIVATE_5HD:
            c = 1
            if aligned[c] != out_shape[c]:
                return (f"input {t} {s} broadcasts over the channel axis of {tuple(out_shape)}, "
                        f"which {fmt} splits into C1 x C0")
            continue
    return None


class PropagateFormats(Pass):
    """Format-agnostic nodes take the format of a producer when the node's check allows it."""

    name = "propagate-formats"
    requires = "every node has a format (assign-preferred-formats)"
    guarantees = "flexible nodes run in a producer's blocked format wherever their check allows"

    def run(self, state: PlanState) -> bool:
        changed = False
        for n in state.nodes:
            if n.fixed or n.folded or n.rule.kind == "nd":
                continue
            cands = []
            for j, t in enumerate(n.node.input):
                if state.is_activation(t) and (n.rule.kind in ("follow", "concat") or j in n.rule.data_slots):
                    f = state.tensor_format(t)
                    if not is_plain(f) and f not in cands:
                        cands.append(f)
            for f in cands:
                reason = check_format(state, n, f)
                if reason is None:
                    if n.fmt != f:
                        n.fmt, n.why, changed = f, f"follows its producer ({n.rule.note})", True
                    break
                state.explanations[(n.node.name, f)] = reason
        return changed


@dataclasses.dataclass(frozen=True)
class CancelRule:
    """A cancellation rule. ``pattern(state)`` yields candidate moves ``(nodes, fmt)``: a group of
    flexible nodes and a format to run them in; ``check`` says why the move is not allowed (or None);
    ``rewrite`` makes it. A move is kept only when it removes conversions (or, at the same count,
    bytes moved); the reason a move was refused is kept for ``--explain``."""

    name: str
    description: str
    pattern: Callable[[PlanState], Iterable[tuple[list[_Node], str]]]

    def check(self, state: PlanState, nodes: list[_Node], fmt: str) -> str | None:
        for n in nodes:
            why = check_format(state, n, fmt)
            if why is not None:
                return why
        return None

    def rewrite(self, state: PlanState, nodes: list[_Node], fmt: str) -> None:
        for n in nodes:
            n.fmt = fmt
            n.why = f"moved to {fmt} by rule {self.name} ({n.rule.note})"


def _flexible(n: _Node) -> bool:
    return not (n.fixed or n.folded or n.rule.kind == "nd")


def _touching(nodes: list[_Node]) -> list[str]:
    return list(dict.fromkeys(t for n in nodes for t in [*n.node.input, *n.node.output] if t))


def _boundary_formats(state: PlanState, nodes: list[_Node]) -> list[str]:
    """Formats on the other side of the conversions entering or leaving the group (plus ND)."""
    inside = {n.idx for n in nodes}
    fmt = nodes[0].fmt
    found: list[str] = []
    for n in nodes:
        slots = state.slot_formats(n)
        for j, t in enumerate(n.node.input):
            p = state.producer.get(t)
            if state.is_activation(t) and (p is None or p[0] not in inside) and \
                    not _same(slots[j], state.tensor_format(t)):
                found.append(ND if is_plain(state.tensor_format(t)) else state.tensor_format(t))
        for o in n.node.output:
            for consumer, req in (state.needs(o) if o else []):
                if not _same(req, output_format(fmt)):
                    found.append(ND if is_plain(req) else req)
    cands = [f for f in dict.fromkeys(found) if not _same(f, fmt) and f != C04]
    if not is_plain(fmt) and ND not in cands:
        cands.append(ND)
    return cands


def _single_node_moves(state: PlanState) -> Iterable[tuple[list[_Node], str]]:
    """X→Y→X around one flexible node: a conversion X→Y enters it and Y→X leaves it."""
    for n in state.nodes:
        if not _flexible(n):
            continue
        slots = state.slot_formats(n)
        ins = {state.tensor_format(t) for j, t in enumerate(n.node.input)
               if state.is_activation(t) and not _same(slots[j], state.tensor_format(t))}
        outs = {req for o in n.node.output if o for _, req in state.needs(o)
                if not _same(req, output_format(n.fmt))}
        cands = [f for f in ins if any(_same(f, o) for o in outs)]
        if not is_plain(n.fmt) and outs and all(is_plain(o) for o in outs) and ND not in cands:
            cands.append(ND)
        if any(f in HOST_LAYOUTS for f in ins):
            # host NHWC -> (this node) -> blocked consumer: running the node in the consumer's format
            # turns NHWC->NCHW plus NCHW->X into one direct NHWC->X
            cands += [o for o in dict.fromkeys(outs) if not is_plain(o) and o != C04 and o not in cands]
        for f in cands:
            yield [n], f


def _group_moves(state: PlanState) -> Iterable[tuple[list[_Node], str]]:
    """The same across a connected group of flexible nodes sharing one format (an elementwise chain
    between two conversions): run the whole group in the format on the other side."""
    seen: set[int] = set()
    for n in state.nodes:
        if n.idx in seen or not _flexible(n):
            continue
        group, todo = [], [n]
        seen.add(n.idx)
        while todo:
            m = todo.pop()
            group.append(m)
            near = [state.producer[t][0] for t in m.node.input if t in state.producer]
            near += [k for o in m.node.output if o for k, _ in state.consumers.get(o, [])]
            for k in near:
                other = state.nodes[k]
                if k not in seen and _flexible(other) and other.fmt == n.fmt:
                    seen.add(k)
                    todo.append(other)
        if len(group) < 2:
            continue
        group.sort(key=lambda x: x.idx)
        for f in _boundary_formats(state, group):
            yield group, f


CANCEL_RULES: tuple[CancelRule, ...] = (
    CancelRule("round-trip", "X→Y→X around a flexible node: run the node in X when that removes "
                             "conversions", _single_node_moves),
    CancelRule("group-round-trip", "X→Y ... Y→X around a chain of flexible nodes: run the chain in X "
                                   "when that removes conversions (or bytes)", _group_moves),
)


def _try_move(state: PlanState, rule: CancelRule, nodes: list[_Node], fmt: str, *, keep: bool) -> bool:
    """Apply a move if it lowers (conversions, bytes) on the touched tensors; undo it otherwise (or
    always, when ``keep`` is False). Returns whether it improved."""
    tensors = _touching(nodes)
    before = state.count_conversions(tensors)
    old = [(n.fmt, n.why) for n in nodes]
    rule.rewrite(state, nodes, fmt)
    after = state.count_conversions(tensors)
    better = after < before
    if not (better and keep):
        for n, (f, w) in zip(nodes, old):
            n.fmt, n.why = f, w
    if not better and keep:
        what = nodes[0].node.name if len(nodes) == 1 else f"{nodes[0].node.name} .. {nodes[-1].node.name}"
        for n in nodes:
            state.explanations.setdefault((n.node.name, fmt),
                                          f"moving {what} to {fmt} would not remove a conversion "
                                          f"({before[0]} now, {after[0]} after)")
    return better


class CancelRoundTrips(Pass):
    """Apply :data:`CANCEL_RULES` until no rule removes a conversion."""

    name = "cancel-round-trips"
    requires = "formats propagated"
    guarantees = "no flexible node or chain has an X→Y→X conversion pair that moving it to X would remove"

    def run(self, state: PlanState) -> bool:
        # Each accepted move lowers (conversions, bytes) on the tensors touching the moved nodes, which
        # are the only ones a move can change: the total strictly decreases, so this terminates.
        changed_any = False
        for _ in range(len(state.nodes) + 1):
            changed = False
            for rule in CANCEL_RULES:
                for nodes, fmt in list(rule.pattern(state)):
                    if any(n.fmt == fmt for n in nodes):
                        continue  # an earlier move in this round already changed the group
                    why = rule.check(state, nodes, fmt)
                    if why is not None:
                        culprit = next(n for n in nodes if check_format(state, n, fmt) is not None)
                        for n in nodes:
                            state.explanations.setdefault(
                                (n.node.name, fmt), why if n is culprit else
                                f"it runs in one chain with {culprit.node.op_type} {culprit.node.name}, "
                                f"which cannot: {why}")
                        continue
                    changed |= _try_move(state, rule, nodes, fmt, keep=True)
            changed_any |= changed
            if not changed:
                break
        return changed_any


def insert_transdata(state: PlanState, *, shared: bool = True, naive: bool = False) -> list[TransData]:
    """TransData for the current formats: one per (tensor, target format) when ``shared``, else one
    per consumer edge. ``naive``: every edge converts, each consumer on its own (the naive plan)."""
    out: list[TransData] = []
    tensors = list(state.graph_inputs) + [o for n in state.nodes for o in n.node.output if o]
    for t in tensors:
        if not state.is_activation(t):
            continue
        src = state.tensor_format(t)
        groups: dict[str, list[str | None]] = {}
        for consumer, req in state.needs(t):
            if not _same(req, src):
                key = req if shared and not naive else f"{req}#{len(groups)}"
                groups.setdefault(key, []).append(consumer)
        p = state.producer.get(t)
        prod = state.nodes[p[0]] if p else None
        for key, consumers in groups.items():
            dst = key.split("#")[0]
            shape = tuple(state.shapes.get(t, ()))
            rank = len(shape)
            src_name = display_format(src, rank)
            dst_name = display_format(dst, rank)
            td = TransData(
                name=f"trans_TransData_{len(out)}", tensor=t, producer=prod.node.name if prod else None,
                consumers=[c if c is not None else "<graph output>" for c in consumers],
                src_format=src_name, dst_format=dst_name, shape=shape, dtype=state.device_dtype(t).name,
                bytes=state.storage_bytes(t, src), dst_bytes=state.storage_bytes(t, dst))
            td.reason = ("naive plan: every boundary converts, once per consumer" if naive
                         else _reason(state, td, prod, consumers, src, dst))
            out.append(td)
    return out


def _reason(state: PlanState, td: TransData, prod: _Node | None, consumers, src: str, dst: str) -> str:
    by_name = state.by_name
    parts = []
    if prod is None:
        parts.append(f"graph input {td.tensor} arrives in the user's format {td.src_format}")
    else:
        parts.append(f"{prod.node.op_type} {prod.node.name} produces {td.src_format} ({prod.why})")
    for c in consumers:
        if c is None:
            parts.append(f"graph output {td.tensor} goes back in the user's format {td.dst_format}")
            continue
        n = by_name[c]
        parts.append(f"{n.node.op_type} {c} needs {td.dst_format} ({n.why})")
        why = state.explanations.get((c, src))
        if why:
            parts.append(f"{c} cannot take {td.src_format}: {why}")
    if prod is not None:
        why = state.explanations.get((prod.node.name, dst))
        if why:
            parts.append(f"{prod.node.name} cannot produce {td.dst_format}: {why}")
    return "; ".join(parts)


def verify_plan(state: PlanState, transdata: list[TransData], node_formats: dict[str, NodeFormats] | None = None,
                weights: Sequence[PackedWeight] = ()) -> None:
    """Check the plan's guarantees; raise ``InternalError`` (a bug) when one does not hold.

    The contract a plan-executing emulator relies on: every tensor is stored in its producer's output
    format (graph inputs: the host format); every consumer slot reads it in exactly that format unless
    one planned TransData on (tensor, consumer) converts it to the slot's format; constants are read in
    their packed format (ND when not packed); graph outputs leave in a plain layout. Checked for every
    slot of every node (``node_formats``, as written to the manifest) when given, else for the
    slots that carry a runtime requirement.
    """
    by_edge: dict[tuple[str, str], list[TransData]] = {}
    for td in transdata:
        if _same(td.src_format, td.dst_format):
            raise InternalError(f"plan: {td.name} on {td.tensor} converts {td.src_format} to itself")
        if not _same(td.src_format, display_format(state.tensor_format(td.tensor), state.rank(td.tensor))):
            raise InternalError(f"plan: {td.name} reads {td.tensor} as {td.src_format}, stored as "
                                f"{state.tensor_format(td.tensor)}")
        for c in dict.fromkeys(td.consumers):  # a node reading t at two slots is listed twice
            by_edge.setdefault((td.tensor, c), []).append(td)
    if any(len(v) > 1 for v in by_edge.values()):
        (t, c), _ = next((k, v) for k, v in by_edge.items() if len(v) > 1)
        raise InternalError(f"plan: edge {t} -> {c} has more than one TransData")
    for n in state.nodes:
        if n.fmt is None:
            raise InternalError(f"plan: node {n.node.name} has no format")

    def arrives(t: str, consumer: str) -> str:
        tds = by_edge.get((t, consumer))
        return tds[0].dst_format if tds else display_format(state.tensor_format(t), state.rank(t))

    for t in list(state.graph_inputs) + [o for n in state.nodes for o in n.node.output if o]:
        if not state.is_activation(t):
            continue
        for consumer, req in state.needs(t):
            got = arrives(t, consumer if consumer is not None else "<graph output>")
            if not _same(got, req):
                raise InternalError(f"plan: edge {t} -> {consumer} gets {got} but needs {req}")
    for o in state.graph_outputs:
        if state.is_activation(o) and not is_plain(arrives(o, "<graph output>")):
            raise InternalError(f"plan: graph output {o} leaves in {arrives(o, '<graph output>')}")
    if node_formats is None:
        return
    packed = {w.name: w.format for w in weights}
    for n in state.nodes:
        nf = node_formats.get(n.node.name)
        if nf is None or len(nf.input_formats) != len(n.node.input):
            raise InternalError(f"plan: node {n.node.name} has no slot formats")
        if n.folded:
            continue  # computed at compile time: reads nothing at run time
        for k, o in enumerate(n.node.output):
            if o and state.is_activation(o) and not _same(nf.output_formats[k], state.tensor_format(o)):
                raise InternalError(f"plan: {n.node.name} writes output {k} ({o}) as {nf.output_formats[k]}, "
                                    f"but it is stored as {state.tensor_format(o)}")
        for j, t in enumerate(n.node.input):
            want = nf.input_formats[j]
            if not t:
                continue
            got = arrives(t, n.node.name) if state.is_activation(t) else packed.get(t, ND)
            if want is None or not _same(got, want):
                raise InternalError(f"plan: {n.node.name} reads input {j} ({t}) as {want}, but it arrives "
                                    f"as {got}")
    # "No cancellable pair left" holds by construction: CancelRoundTrips stops only after a full round
    # of every rule found no improving move (tests check it independently on the TransData list).


PIPELINE: tuple[type[Pass], ...] = (AssignPreferredFormats, PropagateFormats, CancelRoundTrips)


# ------------------------------------------------------------------------------------------------
# If / Loop / Scan bodies
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Body:
    """One planned If/Loop/Scan body: ``owner`` node, the attribute holding it, its own state, its
    TransData (optimised and naive). Bodies are planned like graphs of their own: an outer tensor
    they read arrives as it is stored outside (a body op that needs another format has its TransData
    inside the body, consumer = that op), the body's formal inputs arrive in ND, and its outputs
    leave in ND (TransData consumer ``<graph output>`` on a body tensor: back to the owner)."""

    owner: str
    attr: str
    state: "PlanState"
    transdata: list[TransData]
    naive: list[TransData]


class _BodyModel:
    """The part of a ``LoadedModel`` a :class:`PlanState` reads, for one body graph. Shapes and dtypes
    are the model's (body tensors included: ``onnx_model`` sizes them per branch). Constants inside
    bodies are read as they are (ND): the weight blob holds the top-level graph's constants only."""

    def __init__(self, loaded, body: onnx.GraphProto, outer: Sequence[str]):
        import types

        self.model = types.SimpleNamespace(graph=body)
        self.path = loaded.path
        self.shapes = loaded.shapes
        self.dtypes = loaded.dtypes
        self.gears = loaded.gears
        self.opset = loaded.opset
        self.data_dependent = list(getattr(loaded, "data_dependent", ()))
        self.non_tensors = dict(getattr(loaded, "non_tensors", {}))
        self.constants: dict = {}
        self.warnings: list[str] = []
        names = [i.name for i in body.input] + [t for t in outer if t not in {i.name for i in body.input}]
        self.inputs = [types.SimpleNamespace(name=t, shape=tuple(loaded.shapes.get(t, ()))) for t in names]

    def constant_array(self, name: str) -> np.ndarray:
        raise KeyError(name)


def _support_below(support, prefix: str):
    """The op-support entries of one body (``check_graph`` names them ``<owner>/<attr>/<node>``)."""
    import types

    return types.SimpleNamespace(nodes=[dataclasses.replace(s, name=s.name[len(prefix):]) for s in support.nodes
                                        if s.name.startswith(prefix)])


def plan_bodies(state: PlanState, support, prefix: str = "") -> None:
    """Plan every If/Loop/Scan body of ``state``'s nodes (nested ones too) into ``state.bodies``."""
    for n in state.nodes:
        if n.folded:
            continue
        for a in n.node.attribute:
            if a.type != onnx.AttributeProto.GRAPH:
                continue  # GRAPHS attributes belong to no standard op
            body = a.g
            outer = sorted(_body_reads(body))
            outer_const = {t for t in outer if t in state.const}
            sub_prefix = f"{prefix}{n.node.name}/{a.name}/"
            sub = PlanState(_BodyModel(state.loaded, body, [t for t in outer if t not in outer_const]),
                            _support_below(support, sub_prefix), precision_mode=state.precision_mode,
                            keep_dtype=(), enable_small_channel=False, input_format=None,
                            outer_const=outer_const)
            # the boundary: an outer tensor enters the body as it is stored outside (no conversion at
            # the owner); a body op that wants another format gets its TransData inside the body
            for t in outer:
                if t not in outer_const and state.is_activation(t):
                    sub.host_formats[t] = state.tensor_format(t)
            _assign_dtypes(sub)
            AssignPreferredFormats().run(sub)
            naive = insert_transdata(sub, naive=True)
            for cls in PIPELINE[1:]:
                cls().run(sub)
            transdata = insert_transdata(sub, shared=True)
            verify_plan(sub, transdata, _node_formats(sub, []), [])
            plan_bodies(sub, support, sub_prefix)
            state.bodies.append(Body(n.node.name, a.name, sub, transdata, naive))


def _body_reads(body: onnx.GraphProto) -> set[str]:
    """Outer names one body reads (nested bodies included)."""
    return _graph_reads([body])


def all_bodies(state: PlanState) -> list[Body]:
    """Every planned body below ``state``, depth first."""
    out: list[Body] = []
    for b in state.bodies:
        out.append(b)
        out.extend(all_bodies(b.state))
    return out


# ------------------------------------------------------------------------------------------------
# Precision, weights
# ------------------------------------------------------------------------------------------------

def _assign_dtypes(state: PlanState) -> None:
    mode = state.precision_mode
    for n in state.nodes:
        outs = [o for o in n.node.output if o]
        dt = state.dtypes.get(outs[0], np.dtype(np.float32)) if outs else np.dtype(np.float32)
        ins = [state.dtypes.get(i) for i in n.node.input if i]
        floaty = dt == np.float32 or (n.node.op_type in CUBE_OPS and any(d == np.float32 for d in ins if d))
        if not floaty or n.folded:
            n.dtype = dt.name
            continue
        if mode == "must_keep_origin_dtype" or n.idx in state.keep_dtype:
            n.dtype = "float32"
        elif mode == "force_fp16":
            n.dtype = "float16"
        elif mode == "allow_mix_precision":
            n.dtype = "float32" if n.node.op_type in MIX_PRECISION_FP32_OPS else "float16"
        elif mode == "allow_fp32_to_fp16":
            n.dtype = "float16" if (n.node.op_type in CUBE_OPS or n.fp16_only) else "float32"
        else:  # pragma: no cover - validated by plan()
            raise InternalError(f"precision mode {mode}")


def _operand_constants(state: PlanState) -> Iterable[tuple[_Node, str, tuple]]:
    """Constant operands of elementwise ops and Concat running in a blocked format: converted once at
    compile time into the node's format (a (1, C, 1, 1) scale in NC1HWC0, a bias row in FRACTAL_NZ, a
    Concat constant), never by a runtime TransData. Scalars are read as they are (ND). A constant of
    lower rank is packed with the output's rank (leading 1s, as ONNX broadcasting aligns it)."""
    for n in state.nodes:
        if n.folded or is_plain(n.fmt) or n.rule.kind not in ("follow", "concat"):
            continue
        outs = [o for o in n.node.output if o]
        r = state.rank(outs[0]) if outs else 0
        for t in n.node.input:
            ref = state.loaded.constants.get(t) if t else None
            if ref is None or ref.dtype.kind != "f" or _numel(ref.shape) == 1 or len(ref.shape) > r:
                continue
            aligned = (1,) * (r - len(ref.shape)) + tuple(int(d) for d in ref.shape)
            dt = np.dtype(np.float16) if n.dtype == "float16" and ref.dtype == np.float32 else ref.dtype
            fmt = output_format(n.fmt)
            yield n, t, (fmt, view_shape(fmt, aligned), 1, "ND" if fmt == NZ else None, dt.name)


def _plan_weights(state: PlanState) -> list[PackedWeight]:
    from npu_deploy.converters import formats

    wanted: dict[str, list[tuple[_Node, tuple]]] = {}
    for n in state.nodes:
        ws = n.rule.weight_slot
        if ws is None or n.folded or n.fmt == ND or ws >= len(n.node.input):
            continue
        t = n.node.input[ws]
        if not t or t not in state.loaded.constants:
            continue
        ref = state.loaded.constants[t]
        if ref.dtype.kind != "f":
            continue
        shape = ref.shape
        groups = int(_attr(n.node, "group", 1)) if n.node.op_type in ("Conv", "ConvTranspose") else 1
        if n.node.op_type in ("Conv", "ConvTranspose"):
            if n.fmt == NDC1HWC0 and len(shape) == 5:
                spec = ("FRACTAL_Z_3D", shape, groups, "NCDHW")
            elif n.fmt == C04 and len(shape) == 4:
                spec = ("FRACTAL_Z_C04", shape, 1, "NCHW")
            elif len(shape) == 4:
                spec = ("FRACTAL_Z", shape, groups, "NCHW")
            elif len(shape) == 3:
                spec = ("FRACTAL_Z", (shape[0], shape[1], 1, shape[2]), groups, "NCHW")
            else:
                continue
            if n.node.op_type == "ConvTranspose" and groups != 1:
                continue  # grouped deconvolution weights: kept as given (layout not modelled)
        else:  # MatMul / Gemm B
            if len(shape) == 2:
                spec = ("FRACTAL_Z", shape, 1, "ND")
            elif len(shape) > 2:
                spec = (NZ, shape, 1, "ND")
            else:
                continue
        dt = np.dtype(np.float16) if n.dtype == "float16" and ref.dtype == np.float32 else ref.dtype
        wanted.setdefault(t, []).append((n, spec + (dt.name,)))
    for n, t, spec in _operand_constants(state):
        wanted.setdefault(t, []).append((n, spec))
    out = []
    for t, uses in wanted.items():
        specs = {s for _, s in uses}
        all_uses = [k for k, _ in state.consumers.get(t, [])]
        if len(specs) != 1 or len(all_uses) != len(uses) or t in state.graph_outputs:
            continue  # used in two layouts, or also by another op: keep the plain constant
        fmt, shape, groups, origin, dtname = specs.pop()
        dt = np.dtype(dtname)
        c0 = 4 if fmt == "FRACTAL_Z_C04" else formats.default_c0(dt)
        try:
            nbytes = formats.nbytes(fmt, shape, dt, c0=c0 if fmt != "FRACTAL_Z_C04" else None,
                                    groups=groups, origin=origin)
        except Exception:
            continue  # a shape the format cannot hold: keep it plain
        ref = state.loaded.constants[t]
        out.append(PackedWeight(t, fmt, tuple(shape), tuple(ref.shape), dt.name, ref.dtype.name,
                                None if fmt == "FRACTAL_Z_C04" else c0, groups, origin,
                                [n.node.name for n, _ in uses], int(nbytes)))
    return out


# ------------------------------------------------------------------------------------------------
# The plan and its report
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class PlanReport(Result):
    """What the built-in lowering planned. ``bool()``: estimated FormatTrans share ≤ 8 % (True when no
    cost profile exists for the SoC). All times are **estimates** from the cost model."""

    SCHEMA: ClassVar[str] = "npu-deploy/plan-report"
    SCHEMA_VERSION: ClassVar[int] = 1

    model: str
    soc: str
    precision_mode: str
    nodes: int
    constant_folded: int
    engines: dict
    formats: dict
    transdata_naive_count: int
    transdata_naive_bytes: int
    transdata_count: int
    transdata_bytes: int
    transdata: list
    weights_prepacked: int
    weights_bytes: int
    memory: dict
    cost: dict | None
    notes: list = dataclasses.field(default_factory=list)
    # where this plan is known to differ from what ATC builds, each with how to check it on a real .om
    atc_differences: list = dataclasses.field(default_factory=list)

    def formattrans_share_pct(self) -> float | None:
        """Estimated share of device time spent in TransData, in percent (as ``ProfileReport``'s), or
        None without a cost profile."""
        return None if self.cost is None else 100.0 * float(self.cost["formattrans_share"])

    formattrans_share = formattrans_share_pct  # the same name and unit as ProfileReport.formattrans_share

    def top_conversions(self, n: int = 10) -> list[dict]:
        """The ``n`` planned TransData with the largest estimated time (then bytes)."""
        return sorted(self.transdata, key=lambda t: (-(t.get("est_us") or 0), -t["bytes"]))[:n]

    def __bool__(self) -> bool:
        share = self.formattrans_share_pct()
        return share is None or share <= FORMATTRANS_THRESHOLD_PCT

    def verdict(self) -> str:
        share = self.formattrans_share_pct()
        if share is None:
            est = f"no cost profile for {self.soc}: FormatTrans share not estimated"
        else:
            est = (f"estimated FormatTrans share {share:.1f} % ({'above' if share > FORMATTRANS_THRESHOLD_PCT else 'within'} "
                   f"the {FORMATTRANS_THRESHOLD_PCT:g} % threshold)")
        return (f"{est}; {self.transdata_count} TransData planned (naive {self.transdata_naive_count}), "
                f"{_mb(self.transdata_bytes)} moved; arena {_mb(self.memory.get('arena_bytes', 0))} "
                f"(lower bound {_mb(self.memory.get('lower_bound_bytes', 0))}, "
                f"no reuse {_mb(self.memory.get('no_reuse_bytes', 0))})")

    def summary_lines(self) -> list[str]:
        """The human-readable report ``npu-deploy convert`` prints (estimates labelled)."""
        lines = [f"plan for {self.model} on {self.soc} ({self.precision_mode}): {self.nodes} nodes"
                 + (f", {self.constant_folded} constant-folded" if self.constant_folded else ""),
                 "  engines: " + ", ".join(f"{k} {v}" for k, v in self.engines.items()),
                 "  formats: " + ", ".join(f"{k} {v}" for k, v in sorted(self.formats.items())),
                 f"  TransData: naive {self.transdata_naive_count} ({_mb(self.transdata_naive_bytes)}), "
                 f"optimised {self.transdata_count} ({_mb(self.transdata_bytes)})",
                 f"  weights pre-packed: {self.weights_prepacked} ({_mb(self.weights_bytes)})",
                 f"  memory arena: {_mb(self.memory.get('arena_bytes', 0))} (lower bound "
                 f"{_mb(self.memory.get('lower_bound_bytes', 0))}, no reuse "
                 f"{_mb(self.memory.get('no_reuse_bytes', 0))}, {self.memory.get('alignment', 256)}-byte aligned)"]
        if self.cost is not None:
            c = self.cost
            lines.append(f"  estimated device time: {c['total_us']:.1f} µs, of which TransData "
                         f"{c['formattrans_us']:.1f} µs = {100 * c['formattrans_share']:.1f} % (estimate"
                         f"{f'; above {FORMATTRANS_THRESHOLD_PCT:g} %: FLAGGED' if 100 * c['formattrans_share'] > FORMATTRANS_THRESHOLD_PCT else ''})")
        top = self.top_conversions(8)
        if top:
            lines.append("  planned TransData" + (f" (largest {len(top)} of {self.transdata_count}; all in --report)"
                                                 if len(top) < self.transdata_count else "") + ":")
            for t in top:
                shape = "x".join(str(d) for d in t.get("shape") or []) or "scalar"
                where = t.get("producer") or "(input)"
                to = ", ".join(t.get("consumers") or []) or "(output)"
                est = f", est. {t['est_us']:.1f} µs" if t.get("est_us") is not None else ""
                lines.append(f"    {t.get('name')}: {t.get('tensor', '?')} {t.get('src_format')} -> "
                             f"{t.get('dst_format')} [{shape}] {_mb(t.get('bytes', 0))}{est}, "
                             f"{where} -> {to}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return lines


def _mb(n: int) -> str:
    n = int(n or 0)
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"


@dataclasses.dataclass
class TensorPlan:
    """One tensor's decision: its device ``format`` (the reporting name: NCHW/NCDHW for plain 4-/5-D),
    device ``dtype``, logical ``shape`` (the largest gear; -1 for data-dependent dims), the
    ``storage_shape`` its buffer has (C padded to C0, M/N to 16; None when the shape is not static),
    ``c0`` and the buffer's ``nbytes``."""

    format: str
    dtype: str
    shape: tuple[int, ...]
    storage_shape: tuple[int, ...] | None
    c0: int | None
    nbytes: int

    def to_manifest(self) -> dict:
        return {"format": self.format, "dtype": self.dtype, "shape": list(self.shape),
                "storage_shape": None if self.storage_shape is None else list(self.storage_shape),
                "c0": self.c0, "nbytes": self.nbytes}


@dataclasses.dataclass
class Transfer:
    """How one graph input or output crosses the host/device boundary. ``format``/``shape``/``dtype``:
    the host array (channels-last for an NHWC host input); ``device_*``: the device buffer the
    transfer writes or reads; ``graph_format``/``graph_shape``: the layout the ONNX graph declares,
    when the host's differs (NHWC host, NCHW graph)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    format: str
    device_format: str
    device_shape: tuple[int, ...]
    device_dtype: str
    c0: int | None
    nbytes: int
    graph_format: str | None = None
    graph_shape: tuple[int, ...] | None = None

    def to_manifest(self) -> dict:
        d = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "format": self.format,
             "device_format": self.device_format, "device_shape": list(self.device_shape), "c0": self.c0,
             "nbytes": self.nbytes, "device_dtype": self.device_dtype}
        if self.graph_format is not None:
            d.update(graph_format=self.graph_format, graph_shape=list(self.graph_shape or ()))
        return d


@dataclasses.dataclass
class Plan:
    """The result of :func:`plan`: formats, TransData (optimised and naive), packed weights, dtypes,
    memory plan, cost estimate and the :class:`PlanReport`."""

    soc: str
    precision_mode: str
    node_formats: dict[str, NodeFormats]
    tensor_formats: dict[str, str]
    tensor_dtypes: dict[str, str]
    transdata: list[TransData]
    transdata_naive: list[TransData]
    weights: list[PackedWeight]
    memory: Any
    cost: Any
    report: PlanReport
    passes: list[tuple[str, bool]]
    fused: list[str] = dataclasses.field(default_factory=list)  # tensors never stored (converters.lowering.fusion)
    tensors: dict[str, TensorPlan] = dataclasses.field(default_factory=dict)
    inputs: list[Transfer] = dataclasses.field(default_factory=list)
    outputs: list[Transfer] = dataclasses.field(default_factory=list)
    dynamic: dict = dataclasses.field(default_factory=lambda: {"mode": None, "gears": []})
    input_format: str | None = None

    def to_manifest(self, *, support=None, source_model: dict | None = None) -> dict:
        """The bundle manifest: every decision of this plan, as it is (nothing is re-derived)."""
        from npu_deploy._version import __version__

        cost = self.cost.manifest_summary() if self.cost is not None else {
            "estimated": True, "soc": self.soc, "formattrans_share": None, "est_us": {}}
        return {
            "producer": "npu-deploy",
            "producer_version": __version__,
            "soc": self.soc,
            "precision_mode": self.precision_mode,
            "input_format": self.input_format,
            "inputs": [t.to_manifest() for t in self.inputs],
            "outputs": [t.to_manifest() for t in self.outputs],
            "dynamic": self.dynamic,
            "memory": self.memory.summary(),
            "transdata": [t.to_manifest() for t in self.transdata],
            "transdata_naive_count": len(self.transdata_naive),
            "transdata_naive": [t.to_manifest() for t in self.transdata_naive],
            "transdata_naive_bytes": sum(t.bytes for t in self.transdata_naive),
            "node_formats": {k: v.to_manifest() for k, v in self.node_formats.items()},
            "tensor_formats": self.tensor_formats,
            "tensor_dtypes": self.tensor_dtypes,
            "tensors": {k: v.to_manifest() for k, v in self.tensors.items()},
            "fused_tensors": list(self.fused),
            "cost": cost,
            "plan": {"verdict": self.report.verdict(), "passes": [list(x) for x in self.passes]},
            "support": None if support is None else {"verdict": support.verdict(), "counts": support.counts()},
            "source_model": source_model,
        }

    def explain(self) -> list[str]:
        """One line per TransData kept: where it sits and why it had to stay; then one line per known
        difference from ATC's build (``PlanReport.atc_differences``)."""
        return [f"{t.name}: {t.tensor} {t.src_format} -> {t.dst_format} ({_mb(t.bytes)}): {t.reason}"
                for t in self.transdata] + [f"differs from ATC: {d}" for d in self.report.atc_differences]


def plan(loaded, *, soc: str = "Ascend310P3", precision_mode: str | None = None,
         keep_dtype: Sequence[str] = (), enable_small_channel: bool = False,
         input_format: str | None = None, support=None) -> Plan:
    """Plan the built-in lowering of a loaded model (see the module docstring).

    ``precision_mode`` defaults to ATC's ``force_fp16``. ``support`` is the op-support report (computed
    when not given). Raises ``InputError`` for a bad precision mode or ``keep_dtype`` entry.
    """
    from npu_deploy.converters.lowering import memory
    from npu_deploy.converters.lowering.support import check_support

    precision_mode = precision_mode or "force_fp16"
    if precision_mode not in PRECISION_MODES:
        raise InputError(f"unknown precision mode {precision_mode!r}",
                         hint=f"use one of: {', '.join(PRECISION_MODES)}")
    if support is None:
        support = check_support(loaded, soc, precision_mode=precision_mode)
    state = PlanState(loaded, support, precision_mode=precision_mode, keep_dtype=keep_dtype,
                      enable_small_channel=enable_small_channel, input_format=input_format)
    _assign_dtypes(state)

    passes: list[tuple[str, bool]] = []
    AssignPreferredFormats().run(state)
    naive = insert_transdata(state, naive=True)
    for cls in PIPELINE[1:]:
        passes.append((cls.name, cls().run(state)))
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
    cost = _cost(state, transdata, naive, soc, set(fused))
    transdata = transdata + [td for b in bodies for td in b.transdata]
    naive = naive + [td for b in bodies for td in b.naive]
    for k, td in enumerate(transdata):
        td.name = f"trans_TransData_{k}"
    report = _report(loaded, state, soc, precision_mode, support, naive, transdata, weights, mem, cost)
    tensors = _tensor_plans(state, tensor_formats, tensor_dtypes)
    inputs, outputs = _transfers(state, tensor_dtypes)
    dynamic = {"mode": loaded.dynamic_mode, "gears": _host_gears(loaded, state.host_formats)}
    return Plan(soc, precision_mode, node_formats, tensor_formats, tensor_dtypes, transdata, naive, weights,
                mem, cost, report, passes, fused, tensors, inputs, outputs, dynamic, input_format)


def _host_perm(host: str, graph: str) -> list[int]:
    """Axis ``k`` of the host (channels-last) array is axis ``perm[k]`` of the graph's array."""
    return [graph.index(a) for a in host]


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
    from npu_deploy.converters import formats

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
                    storage = tuple(formats.storage_shape(fmt, shape, dt))
                    c0 = formats.resolve_c0(fmt, dt)
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


def _node_formats(state: PlanState, weights: list[PackedWeight]) -> dict[str, NodeFormats]:
    """Each node's slot formats, literally: the format the node reads each input in (an activation
    slot with no requirement, e.g. a broadcast scalar, reads the tensor as it is stored; a constant
    reads its packed format, else ND) and the format it writes each output in."""
    packed = {w.name: w for w in weights}
    out: dict[str, NodeFormats] = {}
    for n in state.nodes:
        slots = state.slot_formats(n)
        ins: list[str | None] = []
        for j, t in enumerate(n.node.input):
            if not t:
                ins.append(None)
            elif t in packed:
                ins.append(packed[t].format)
            elif not state.is_activation(t):
                ins.append(plain_name(state.rank(t)))
            else:
                f = slots[j] if slots[j] is not None else state.tensor_format(t)
                ins.append(display_format(f, state.rank(t)))
        outs = [display_format(output_format(n.fmt), state.rank(o)) for o in n.node.output]
        dt = np.dtype(n.dtype)
        out[n.node.name] = NodeFormats(n.node.op_type, n.engine, ins, outs, n.dtype, _c0_for(n.fmt, dt),
                                       n.folded, n.why)
    return out


def outer_names(node: onnx.NodeProto) -> set[str]:
    """Tensors of the enclosing graph that the bodies of ``node`` (If/Loop/Scan, nested included)
    read: names read inside and defined by no body node, body input or body initializer."""
    return _graph_reads(_subgraphs(node))


def _graph_reads(graphs: Sequence[onnx.GraphProto]) -> set[str]:
    reads: set[str] = set()
    defined: set[str] = set()

    def walk(g: onnx.GraphProto) -> None:
        defined.update(i.name for i in g.input)
        defined.update(t.name for t in g.initializer)
        for sub in g.node:
            reads.update(i for i in sub.input if i)
            defined.update(o for o in sub.output if o)
            for body in _subgraphs(sub):
                walk(body)

    for body in graphs:
        walk(body)
    return reads - defined


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
    from npu_deploy.converters.lowering import cost as costmod

    try:
        costmod.get_soc_profile(soc)
    except InputError:
        return None
    state.not_estimated = []
    ops, tds = _cost_items(state, transdata, naive, soc, costmod, fused)
    return costmod.estimate(ops, tds, soc)


def _cost_items(state: PlanState, transdata: list[TransData], naive: list[TransData], soc: str,
                costmod, fused: set[str] = frozenset()) -> tuple[list, list]:
    dtypes = {t: state.device_dtype(t) for t in state.dtypes}
    ops = []
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
        ops.append(costmod.EstimatedOp(n.node.name, n.node.op_type, work, dtype=n.dtype,
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
        ops += b_ops
        tds += b_tds
    return ops, tds


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


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            graphs.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(a.graphs)
    return graphs


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
