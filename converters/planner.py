"""The built-in lowering plan: formats per tensor, TransData, weight pre-packing, precision, memory, cost.

``plan(loaded, soc=..., precision_mode=...)`` runs a fixed pipeline of small graph passes over a
:class:`PlanState` (each states what it requires and guarantees, and returns whether it changed
anything):

1. :class:`AssignPreferredFormats` — every node gets the format its kernel wants, from the one table
   :data:`FORMAT_RULES` (Conv/pool/BN/Resize: NC1HWC0 activations and FRACTAL_Z weights; MatMul/Gemm:
   FRACTAL_NZ; Reshape/Transpose/Gather/…: ND); format-agnostic ops start in ND. The TransData this
   leaves (one per edge whose formats differ, none shared) is the **naive plan**.
2. :class:`PropagateFormats` — format-agnostic ops (elementwise, activations, Softmax/LayerNorm over
   the last axis, views that keep the blocked axes) take their producer's format where the
   broadcasting/axis check allows (FRACTAL_NZ: other operands (M, N), (1, N) or scalar; an activation
   operand not in NZ gets its own small TransData, and step 3 moves the node back if that does not pay).
3. :class:`CancelRoundTrips` — rules (pattern, check, rewrite) that remove X→Y→X pairs around a
   flexible node, or around a chain of them (:data:`CANCEL_RULES`), by moving it to the other format
   when that removes conversions (or, at equal count, bytes); a failed check's reason is kept and
   shown by ``--explain``.
4. :func:`insert_transdata` (shared: one conversion per tensor and target format, whatever the number
   of consumers) gives the **optimised plan**; :func:`verify_plan` checks the guarantees (every node
   has formats; after TransData every edge's producer and consumer formats agree; no cancellable pair
   left).

Then: weight pre-packing (constants at Conv/MatMul weight slots are stored in their device format),
precision (``force_fp16`` casts float32 compute to float16, ``must_keep_origin_dtype`` keeps it,
``allow_mix_precision`` keeps :data:`MIX_PRECISION_FP32_OPS` and ``keep_dtype`` nodes in float32; C0
follows the device dtype), the memory plan (``converters.memory``) and the cost estimate
(``converters.cost``) — an **estimate**, labelled so everywhere. ``allow_fp32_to_fp16`` keeps float32
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
>>> from npu_deploy.converters.onnx_model import load_model
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

from npu_deploy._result import Result
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
FORMATTRANS_THRESHOLD = 0.08

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
    blocked format unless it joins along a padded axis with unaligned sizes), ``"follow"`` (format-
    agnostic: takes its producer's format where broadcasting allows), ``"lastaxis"`` (ND, or
    FRACTAL_NZ when it normalises over the last axis of an NZ input), ``"view"`` (ND, or the input's
    blocked format when the blocked axes are untouched), ``"nd"`` (ND only).
    """

    kind: str
    data_slots: tuple[int, ...] = (0,)
    weight_slot: int | None = None
    note: str = ""


_5HD_NOTE = "its AI Core kernel reads activations in NC1HWC0"
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
    "Reshape": FormatRule("view", note="Reshape keeps a blocked format only if the blocked axes are unchanged"),
    "Squeeze": FormatRule("view", note="Squeeze keeps a blocked format only if the blocked axes are unchanged"),
    "Unsqueeze": FormatRule("view", note="Unsqueeze keeps a blocked format only if the blocked axes are unchanged"),
    "Flatten": FormatRule("view", note="Flatten keeps a blocked format only if the blocked axes are unchanged"),
    "Transpose": FormatRule("view", note="Transpose keeps FRACTAL_NZ only if it leaves the last two axes alone"),
    "Identity": FormatRule("view", note="Identity keeps any format"),
    "Concat": FormatRule("concat", note="ConcatD keeps a blocked format unless it joins along a padded "
                                        "(blocked) axis whose sizes are not multiples of the block"),
    "Dropout": FormatRule("view", note="Dropout (inference) keeps any format"),
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
                 enable_small_channel: bool, input_format: str | None):
        from npu_deploy.converters.support import AI_CPU, BUILTIN, constant_tensors

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
        self.const = constant_tensors(self.graph, static)
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
        return bool(t) and t not in self.const

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
            elif n.rule.kind in ("5hd", "matmul", "lastaxis", "view"):
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
                return f"Transpose perm {perm} moves the last two axes (the FRACTAL_NZ blocks)"
            return None
        if tuple(in_shape[-2:]) != tuple(out_shape[-2:]):
            return (f"{n.node.op_type} changes the last two axes {tuple(in_shape[-2:])} -> "
                    f"{tuple(out_shape[-2:])}, which FRACTAL_NZ blocks")
        return None
    return f"{n.node.op_type} needs ND ({n.rule.note})"


def _check_concat(state: PlanState, n: _Node, fmt: str, out_shape: Sequence[int]) -> str | None:
    r = len(out_shape)
    axis = int(_attr(n.node, "axis", 0)) % max(r, 1)
    ins = [t for t in n.node.input if t]
    if any(not state.is_activation(t) for t in ins):
        return "a constant input would need its own conversion"
    if fmt in (NC1HWC0, NDC1HWC0):
        if r != (5 if fmt == NDC1HWC0 else 4):
            return f"rank-{r} tensors cannot be held in {fmt}"
        if axis != 1:
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
                        for n in nodes:
                            state.explanations.setdefault((n.node.name, fmt), why)
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


def verify_plan(state: PlanState, transdata: list[TransData]) -> None:
    """Check the plan's guarantees; raise ``InternalError`` (a bug) when one does not hold."""
    by_edge: dict[tuple[str, str], str] = {}
    for td in transdata:
        for c in td.consumers:
            by_edge[(td.tensor, c)] = td.dst_format
    for n in state.nodes:
        if n.fmt is None:
            raise InternalError(f"plan: node {n.node.name} has no format")
    for t in list(state.graph_inputs) + [o for n in state.nodes for o in n.node.output if o]:
        if not state.is_activation(t):
            continue
        src = state.tensor_format(t)
        for consumer, req in state.needs(t):
            got = by_edge.get((t, consumer if consumer is not None else "<graph output>"), src)
            if not _same(got, req):
                raise InternalError(f"plan: edge {t} -> {consumer} gets {got} but needs {req}")
    # "No cancellable pair left" holds by construction: CancelRoundTrips stops only after a full round
    # of every rule found no improving move (tests check it independently on the TransData list).


PIPELINE: tuple[type[Pass], ...] = (AssignPreferredFormats, PropagateFormats, CancelRoundTrips)


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

    def formattrans_share(self) -> float | None:
        """Estimated share of device time spent in TransData (0..1), or None without a cost profile."""
        return None if self.cost is None else float(self.cost["formattrans_share"])

    def top_conversions(self, n: int = 10) -> list[dict]:
        """The ``n`` planned TransData with the largest estimated time (then bytes)."""
        return sorted(self.transdata, key=lambda t: (-(t.get("est_us") or 0), -t["bytes"]))[:n]

    def __bool__(self) -> bool:
        share = self.formattrans_share()
        return share is None or share <= FORMATTRANS_THRESHOLD

    def verdict(self) -> str:
        share = self.formattrans_share()
        if share is None:
            est = f"no cost profile for {self.soc}: FormatTrans share not estimated"
        else:
            est = (f"estimated FormatTrans share {100 * share:.1f} % "
                   f"({'above' if share > FORMATTRANS_THRESHOLD else 'within'} the 8 % threshold)")
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
                         f"{'; above 8 %: FLAGGED' if c['formattrans_share'] > FORMATTRANS_THRESHOLD else ''})")
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

    def explain(self) -> list[str]:
        """One line per TransData kept: where it sits and why it had to stay."""
        return [f"{t.name}: {t.tensor} {t.src_format} -> {t.dst_format} ({_mb(t.bytes)}): {t.reason}"
                for t in self.transdata]


def plan(loaded, *, soc: str = "Ascend310P3", precision_mode: str | None = None,
         keep_dtype: Sequence[str] = (), enable_small_channel: bool = False,
         input_format: str | None = None, support=None) -> Plan:
    """Plan the built-in lowering of a loaded model (see the module docstring).

    ``precision_mode`` defaults to ATC's ``force_fp16``. ``support`` is the op-support report (computed
    when not given). Raises ``InputError`` for a bad precision mode or ``keep_dtype`` entry.
    """
    from npu_deploy.converters import memory
    from npu_deploy.converters.support import check_support

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
    verify_plan(state, transdata)
    weights = _plan_weights(state)

    tensor_formats: dict[str, str] = {}
    tensor_dtypes: dict[str, str] = {}
    for t in list(state.graph_inputs) + [o for n in state.nodes for o in n.node.output if o]:
        if state.is_activation(t):
            tensor_formats[t] = display_format(state.tensor_format(t), state.rank(t))
            tensor_dtypes[t] = state.device_dtype(t).name
    packed = {w.name: w for w in weights}
    node_formats: dict[str, NodeFormats] = {}
    for n in state.nodes:
        slots = state.slot_formats(n)
        ins: list[str | None] = []
        for j, t in enumerate(n.node.input):
            if not t:
                ins.append(None)
            elif t in packed:
                ins.append(packed[t].format)
            elif slots[j] is not None:
                ins.append(plain_name(state.rank(t)) if is_plain(slots[j]) else slots[j])
            else:
                f = n.fmt if (not is_plain(n.fmt) and n.rule.kind == "follow") else ND
                ins.append(plain_name(state.rank(t)) if is_plain(f) else f)
        outs = [(plain_name(state.rank(o)) if is_plain(n.fmt) else output_format(n.fmt)) for o in n.node.output]
        dt = np.dtype(n.dtype)
        node_formats[n.node.name] = NodeFormats(n.node.op_type, n.engine, ins, outs, n.dtype,
                                                _c0_for(n.fmt, dt), n.folded, n.why)

    mem = _memory_plan(state, transdata, memory)
    cost = _cost(state, transdata, naive, soc)
    report = _report(loaded, state, soc, precision_mode, support, naive, transdata, weights, mem, cost)
    return Plan(soc, precision_mode, node_formats, tensor_formats, tensor_dtypes, transdata, naive, weights,
                mem, cost, report, passes)


def _outer_reads(node: onnx.NodeProto) -> set[str]:
    """Names the subgraphs of ``node`` (If/Loop/Scan bodies) read: they keep outer tensors alive."""
    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            for sub in g.node:
                names.update(i for i in sub.input if i)
                names |= _outer_reads(sub)
    return names


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


def _cost(state: PlanState, transdata: list[TransData], naive: list[TransData], soc: str) -> Any:
    from npu_deploy.converters import cost as costmod

    try:
        costmod.get_soc_profile(soc)
    except InputError:
        return None
    dtypes = {t: state.device_dtype(t) for t in state.dtypes}
    ops = []
    state.not_estimated = []
    for n in state.nodes:
        if n.folded:
            continue
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
    return costmod.estimate(ops, [costmod.EstimatedTransData(t.name, t.src_format, t.dst_format, t.bytes,
                                                             t.dst_bytes) for t in transdata], soc)


def _report(loaded, state, soc, precision_mode, support, naive, transdata, weights, mem, cost) -> PlanReport:
    formats_count: dict[str, int] = {}
    folded = 0
    for n in state.nodes:
        if n.folded:
            folded += 1
            continue
        key = plain_name(state.rank(n.node.output[0]) if n.node.output else 0) if is_plain(n.fmt) else n.fmt
        formats_count[key] = formats_count.get(key, 0) + 1
    notes = list(getattr(loaded, "warnings", ()))  # what loading worked around (onnx_model.load_model)
    notes += state.notes  # inputs --input-format does not apply to
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
        nodes=len(state.nodes) - folded, constant_folded=folded, engines=support.counts(),
        formats=formats_count, transdata_naive_count=len(naive),
        transdata_naive_bytes=sum(t.bytes for t in naive), transdata_count=len(transdata),
        transdata_bytes=sum(t.bytes for t in transdata), transdata=[t.to_manifest() for t in transdata],
        weights_prepacked=len(weights), weights_bytes=sum(w.nbytes for w in weights),
        memory=mem.summary(), cost=cost_d, notes=notes)
