"""The planner's data: the format preference table (:data:`FORMAT_RULES`), the format names, the
per-node and per-tensor records (:class:`NodeFormats`, :class:`TransData`, :class:`PackedWeight`) and
:class:`PlanState`, what the passes read and write. The planner's stages are described in
:mod:`npu_deploy.converters.lowering.planner`; GE/FE rules cited as R<n> are in ``docs/ge-rules.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterable, Sequence

import numpy as np
import onnx

from npu_deploy import _thresholds
from npu_deploy.converters.lowering import ops
from npu_deploy.errors import InputError
from npu_deploy.converters import formats
from npu_deploy.converters.formats.graph import is_plain as graph_is_plain, same_format
from npu_deploy.converters.lowering.support import AI_CPU, BUILTIN, constant_tensors

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

PRECISION_MODES = ops.PRECISION_MODES
FORMATTRANS_THRESHOLD_PCT = _thresholds.FORMATTRANS_THRESHOLD_PCT

# Ops kept in float32 under allow_mix_precision, and the cube-unit ops (no float32 path on the 310P
# cube): the op table's (ops.py)
MIX_PRECISION_FP32_OPS = ops.MIX_PRECISION_FP32_OPS
CUBE_OPS = ops.CUBE_OPS


# The format preference table (which format each op wants) is the op table's (ops.py); here the
# rules for ops outside it and the lookup.
FormatRule = ops.FormatRule
FORMAT_RULES = ops.FORMAT_RULES
_ND_RULE = FormatRule("nd", note="needs ND (its kernel indexes the logical layout; ge-rules R16)")
_AICPU_RULE = FormatRule("nd", note="runs on AI CPU, which takes ND only")
_CONST_RULE = FormatRule("nd", note="compile-time constant (ge-rules R10)")
_DYNAMIC_RULE = FormatRule("nd", note="output shape depends on input values: kept in ND")


def rule_for(op_type: str) -> FormatRule:
    """The format rule of an op type (``nd`` for ops not in :data:`FORMAT_RULES`)."""
    return FORMAT_RULES.get(op_type, _ND_RULE)


def is_plain(fmt: str) -> bool:
    """True for the row-major layouts (ND, NCHW, NHWC as given, NCDHW…): the one "plain?" predicate,
    :func:`~npu_deploy.converters.formats.graph.is_plain` (the format registry's)."""
    return graph_is_plain(fmt)


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
    c0: int | None = None    # set only when not the dtype's default (float32 cube operands on 910B: 8)
    # The TransData whose result this one converts further (a C0 8 <-> 16 change goes through NCHW in
    # two steps, ge-rules R7): its name in the manifest, and the record itself until names are final.
    after: str | None = None
    prev: "TransData | None" = dataclasses.field(default=None, repr=False, compare=False)

    def to_manifest(self) -> dict:
        d = {"name": self.name, "tensor": self.tensor, "producer": self.producer,
             "consumers": list(self.consumers), "src_format": self.src_format,
             "dst_format": self.dst_format, "shape": list(self.shape), "dtype": self.dtype,
             "bytes": self.bytes, "dst_bytes": self.dst_bytes, "est_us": self.est_us,
             "onnx_nodes": [n for n in [self.producer, *self.consumers] if n], "reason": self.reason}
        if self.c0 is not None:
            d["c0"] = self.c0
        if self.after is not None:
            d["after"] = self.after
        return d


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
    first: str | None = None  # the first pick (assign-preferred-formats)
    dtype: str = "float32"
    c0_weight: bool = False  # first conv with small-channel input (C04)
    fp16_only: bool = False  # its AI Core kernel takes float16 but not float32 (op-info)


class PlanState:
    """What the passes read and write: nodes with their current format, tensors, shapes, consumers."""

    def __init__(self, loaded, support, *, precision_mode: str, keep_dtype: Sequence[str],
                 enable_small_channel: bool, input_format: str | None, outer_const: Iterable[str] = (),
                 soc: str = "Ascend310P3", op_info=None):
        self.loaded = loaded
        self.op_info = op_info  # the installed op info (opinfo.OpInfo) or None: the built-in table alone
        self.graph = loaded.model.graph
        self.shapes: dict[str, tuple[int, ...]] = dict(loaded.shapes)
        self.dtypes: dict[str, np.dtype] = {k: np.dtype(v) for k, v in loaded.dtypes.items()}
        self.precision_mode = precision_mode
        self.soc = soc
        self.enable_small_channel = enable_small_channel
        self.input_format = input_format
        formats_by_input, self.notes = host_input_formats(loaded.inputs, input_format)
        # graph inputs the host feeds in a channels-last layout (NHWC/NDHWC): produced in that layout
        self.host_formats: dict[str, str] = {k: v for k, v in formats_by_input.items() if v in HOST_LAYOUTS}
        static = {} if loaded.gears else dict(loaded.shapes)
        self.const = constant_tensors(self.graph, static) | set(outer_const)
        self.bodies: list = []  # plan_passes.Body: the planned If/Loop/Scan bodies of this graph's nodes
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
            needs = self.needs(t)
            targets = {req for _, req in needs if not _same(req, src)}
            count += len(targets)
            nbytes += len(targets) * self.storage_bytes(t, src)
            # a reader of the stored blocked format with another C0: two steps through the plain origin
            # format, the first shared with the plain readers (ge-rules R7)
            c0s = self._c0_changes(t, src, needs)
            if c0s:
                plain = any(is_plain(req) for req in targets)
                count += len(c0s) + (0 if plain else 1)
                nbytes += len(c0s) * _numel(self.shapes.get(t, ())) * self.device_dtype(t).itemsize
                nbytes += 0 if plain else self.storage_bytes(t, src)
        return count, nbytes

    def _c0_changes(self, t: str, src: str, needs) -> set:
        """The C0s (None: the default) other than the stored one that readers of ``t`` want in its
        stored blocked format ``src``."""
        if is_plain(src) or src == C04 or ops.cube_c0(self.soc, np.float32) == formats_default_c0(np.float32):
            return set()
        have = self.stored_c0(t)
        return {w for w in (self.read_c0(c, t, req) for c, req in needs if _same(req, src)) if w != have}

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
        return _format_nbytes(fmt, tuple(shape), dt, self.cube_c0(t, fmt))

    def cube_c0(self, t: str, fmt: str) -> int | None:
        """The C0 ``t`` is stored with in blocked ``fmt`` when it is not the dtype's default: float32
        operands of a cube op on a SoC with cube high precision (C0 = 8 on 910B, docs/ge-rules.md R7);
        None otherwise (the default C0)."""
        if is_plain(fmt) or fmt == C04 or self.device_dtype(t) != np.float32:
            return None
        c0 = ops.cube_c0(self.soc, np.float32)
        if c0 == formats_default_c0(np.float32):
            return None
        p = self.producer.get(t)
        prod = self.nodes[p[0]] if p else None
        if prod is not None and not prod.folded and output_format(prod.fmt) == fmt:
            # stored as its producer writes it
            return c0 if prod.node.op_type in ops.CUBE_C0_OPS else None
        # converted for its readers (a TransData's destination): as the cube reader reads it
        readers = [self.nodes[k] for k, _ in self.consumers.get(t, [])]
        cube = any(n.node.op_type in ops.CUBE_C0_OPS and not n.folded and n.fmt == fmt
                   and np.dtype(n.dtype) == np.float32 for n in readers)
        return c0 if cube else None

    def stored_c0(self, t: str) -> int | None:
        """The C0 ``t`` is stored with when it is not the dtype's default (None otherwise): float32
        written in a blocked format by a cube op under cube high precision (8 on 910B/910_93)."""
        p = self.producer.get(t)
        if p is None or t in self.const or self.nodes[p[0]].folded:
            return None
        return self.cube_c0(t, self.tensor_format(t))

    def read_c0(self, consumer: str | None, t: str, fmt: str) -> int | None:
        """The C0 node ``consumer`` reads ``t`` with in blocked ``fmt`` when it is not the dtype's
        default (None otherwise). FE gives a float32 cube op's tensors C0 = 8 under cube high precision
        (``ARefreshCubeC0FusionPass``; ``GetC0ValByOpDescAndDtype``), every other op the dtype's C0
        (16 for float32): a vector op (pooling, BN, elementwise) reads float32 NC1HWC0 with C0 = 16
        (docs/ge-rules.md R7)."""
        if consumer is None or is_plain(fmt) or fmt == C04 or self.device_dtype(t) != np.float32:
            return None
        c0 = ops.cube_c0(self.soc, np.float32)
        if c0 == formats_default_c0(np.float32):
            return None
        n = self.by_name.get(consumer)
        if n is None or n.folded or n.node.op_type not in ops.CUBE_C0_OPS or np.dtype(n.dtype) != np.float32:
            return None
        return c0

    def storage_bytes_c0(self, t: str, fmt: str, c0: int | None) -> int:
        """Bytes of ``t`` stored in ``fmt`` with the given C0 (None: the dtype's default), as a
        TransData destination for one kind of reader writes it."""
        if is_plain(fmt):
            return self.storage_bytes(t, fmt)
        shape = self.shapes.get(t)
        if shape is None:
            return 0
        return _format_nbytes(fmt, tuple(shape), self.device_dtype(t), c0)

    def node_c0(self, n: "_Node") -> int | None:
        """The C0 node ``n`` computes with (``NodeFormats.c0``)."""
        dt = np.dtype(n.dtype)
        if n.node.op_type in ops.CUBE_C0_OPS and dt == np.float32 and not is_plain(n.fmt) and n.fmt != C04:
            return ops.cube_c0(self.soc, dt)
        return _c0_for(n.fmt, dt)

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
    """No conversion between ``a`` and ``b`` (None: no format asked for): the one "same layout?"
    predicate, :func:`~npu_deploy.converters.formats.graph.same_format` (channels-last host layouts
    are not the same as NCHW/ND)."""
    return a is None or b is None or same_format(a, b)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n


@functools.lru_cache(maxsize=4096)
def formats_default_c0(dtype) -> int:
    return formats.default_c0(dtype)


def _format_nbytes(fmt: str, shape: tuple[int, ...], dt: np.dtype, c0: int | None = None) -> int:
    try:
        return int(formats.nbytes(fmt, view_shape(fmt, shape), dt, c0=c0 or _c0_for(fmt, dt)))
    except Exception:  # a shape the format cannot hold: counted as stored plainly
        return _numel(shape) * dt.itemsize


@functools.lru_cache(maxsize=256)
def _c0_for(fmt: str, dtype: np.dtype) -> int | None:
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
