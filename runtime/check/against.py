"""Check the built-in plan against what ATC really did: ``npu-deploy inspect MODEL.om --against MODEL.onnx``.

An ``.om`` written by ATC says which original-model nodes each device op came from
(``shared/reference/accuracy-debug.md`` §4): the op attribute ``_datadump_original_op_names`` lists the
nodes fused into the op (absent: the op *is* the node of its name; empty: ATC inserted it), and an output
descriptor's ``_datadump_origin_name`` / ``_datadump_origin_output_index`` name the original tensor that
output stands for. From that this module

* maps every ``.om`` op to the ONNX nodes fused into it (:func:`op_mapping`);
* finds the original tensor each TransData ATC placed sits on (:func:`atc_transdata`): its own output
  descriptor when it carries the mapping, else its producer's origin output, walking up through other
  ops ATC inserted (Cast, TransData) to the first op that maps to the model (or to a graph input);
* plans the ONNX model with the built-in planner for the ``.om``'s SoC and input shapes and diffs the two
  TransData lists (:func:`against`), keyed by ONNX tensor and (source format, destination format):
  *agreed*, *planned only*, *ATC only*. Plain layouts byte-identical to the ONNX tensor (ND, NCHW, NC,
  NCL, NCDHW) compare equal, as they do in the planner.

>>> r = against("model.om", "model.onnx")                       # doctest: +SKIP
>>> r.verdict()                                                  # doctest: +SKIP
'ATC 3 TransData, plan 10: 3 agreed, 7 planned only, 0 ATC only'
>>> [(d.tensor, d.src_format, d.dst_format) for d in r.planned_only]   # doctest: +SKIP
[('concat_out', 'NC1HWC0', 'NCHW'), ...]

When an op carries no mapping attribute (a real ATC 7.6 file of an ONNX model carries none at all) it is
mapped by ATC's naming conventions (:class:`NameMap`): ``trans_TransData_<n>`` / ``trans_Cast_<n>`` are
inserted, ``PartitionedCall_<node>_<CANN op>_<n>`` and ``<node>function_graph_<n>/...`` stand for
``<node>``, fused ops concatenate the fused nodes' names (``<bn>_BNInferenceD<prelu>``), graph outputs are
``<producer>:<k>:<onnx output>``.

A TransData whose mapping leads nowhere (a converted constant, a file without the attributes) is listed
with ``tensor=None`` and counts as ATC only; an ``.om`` none of whose ops maps to a node of the ONNX model
is an :class:`~npu_deploy.errors.InputError` ("no op maps to this model": the wrong ONNX file).

JSON (schema ``npu-deploy/against`` v1, ``inspect MODEL.om --against MODEL.onnx --json FILE``):

* ``om``, ``onnx`` (paths), ``soc``, ``precision_mode`` (what the plan used), ``input_shapes``
  (name -> dims the plan used);
* ``ops``: every ``.om`` op of the main model: ``op``, ``type``, ``graph``, ``original`` (names the file
  records), ``onnx_nodes`` (the ONNX nodes it stands for), ``inserted`` (ATC added it), ``mapped_by``
  (``attribute``, ``name...`` for the naming convention used, or empty);
* ``op_map_coverage``: the fraction of the ``.om``'s compute ops (not inputs, NetOutput, constants or
  inserted conversions) mapped to ONNX nodes;
* ``atc_transdata``: ``name``, ``graph``, ``src_format``, ``dst_format``, ``in_shape``, ``out_shape``,
  ``origin`` / ``origin_output`` (the original tensor as the file names it), ``via`` (which attribute
  said so), ``tensor`` (the ONNX tensor or null), ``inserted``;
* ``plan_transdata``: the planned TransData as in the bundle manifest (``tensor``, ``src_format``,
  ``dst_format``, ``producer``, ``consumers``, ``reason``…);
* ``diff``: ``status`` (``agreed`` | ``planned only`` | ``ATC only``), ``tensor``, ``src_format``,
  ``dst_format`` (compared names, see :func:`canonical_format`), ``atc``, ``plan`` (TransData names),
  ``reason`` (the planner's);
* ``counts`` (``atc``, ``plan``, ``agreed``, ``planned_only``, ``atc_only``), ``onnx_node_count``,
  ``onnx_nodes_not_in_om`` (folded or fused away), ``notes``; plus ``ok`` and ``verdict``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import ChainMap, Counter
from typing import ClassVar, Iterable, Mapping

from npu_deploy._result import Result
from npu_deploy._text import printable
from npu_deploy.converters import formats
from npu_deploy.converters.formats.graph import same_format
from npu_deploy.converters.lowering import ops as optable, planner
from npu_deploy.converters.files import om as omfile
from npu_deploy.converters.files.onnx_model import load_model
from npu_deploy.errors import InputError, ModelError, OmError

AGREED, PLANNED_ONLY, ATC_ONLY = "agreed", "planned only", "ATC only"
# ONNX ops that only re-view the data: ATC folds them into a neighbouring TransData (a3c_pong's
# trans_TransData_13 converts NHWC [1,4,4,32] to FRACTAL_NZ [1,512], the Reshape gone), so the same
# conversion may sit on the view's input in the .om and on its output in the plan.
VIEW_OPS = optable.VIEW_OPS
MAX_WALK = 64          # ops ATC inserted back to back; a longer chain is a cycle or a corrupt file
_CMDLINE_PRECISION = re.compile(r"--precision_mode[= ]([A-Za-z0-9_]+)")


# ---------------------------------------------------------------------------------------------------
# results

@dataclasses.dataclass
class OpMapping:
    """One ``.om`` op and the original nodes it came from. ``original`` is what the file records (the
    op's own name when the attribute is absent); ``onnx_nodes`` are those that are nodes of the ONNX
    model (empty when no model was given); ``inserted``: ATC added the op (no original node)."""

    op: str
    type: str
    graph: str
    original: list[str]
    onnx_nodes: list[str] = dataclasses.field(default_factory=list)
    inserted: bool = False
    mapped_by: str = ""


@dataclasses.dataclass
class AtcTransData:
    """A TransData in the ``.om``: formats, shapes, and the original tensor it converts.

    ``origin`` / ``origin_output`` name that tensor as the file does (the node and its output index;
    TensorFlow names for a TensorFlow-origin ``.om``), ``via`` says which attribute gave it, ``tensor``
    is the ONNX tensor name (set by :func:`against`). ``inserted`` is False when the op is itself an
    original node (a layout op of the source model lowered to TransData): such ops are listed, not diffed.
    """

    name: str
    graph: str
    src_format: str
    dst_format: str
    in_shape: list[int]
    out_shape: list[int]
    origin: str | None
    origin_output: int | None
    via: str
    tensor: str | None = None
    inserted: bool = True


@dataclasses.dataclass
class DiffEntry:
    """One conversion of the diff: ``status`` is ``"agreed"``, ``"planned only"`` or ``"ATC only"``;
    ``atc`` / ``plan`` the TransData names on each side; ``reason`` the planner's reason."""

    status: str
    tensor: str | None
    src_format: str
    dst_format: str
    atc: str | None = None
    plan: str | None = None
    reason: str = ""


@dataclasses.dataclass
class AgainstReport(Result):
    """The ``.om`` against the built-in plan (schema ``npu-deploy/against`` v1).

    ``bool(report)``: the plan and ATC placed the same TransData (nothing planned only or ATC only).
    """

    SCHEMA: ClassVar[str] = "npu-deploy/against"
    SCHEMA_VERSION: ClassVar[int] = 1

    om: str
    onnx: str
    soc: str
    precision_mode: str
    input_shapes: dict[str, list[int]]
    ops: list[OpMapping]
    atc_transdata: list[AtcTransData]
    plan_transdata: list[dict]
    diff: list[DiffEntry]
    onnx_node_count: int = 0
    onnx_nodes_not_in_om: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    op_map_coverage: float = 0.0

    def _with(self, status: str) -> list[DiffEntry]:
        return [d for d in self.diff if d.status == status]

    @property
    def agreed(self) -> list[DiffEntry]:
        return self._with(AGREED)

    @property
    def planned_only(self) -> list[DiffEntry]:
        return self._with(PLANNED_ONLY)

    @property
    def atc_only(self) -> list[DiffEntry]:
        return self._with(ATC_ONLY)

    def __bool__(self) -> bool:
        return not self.planned_only and not self.atc_only

    def counts(self) -> dict[str, int]:
        """``{"atc": n, "plan": n, "agreed": n, "planned_only": n, "atc_only": n}``."""
        c = Counter(d.status for d in self.diff)
        return {"atc": c[AGREED] + c[ATC_ONLY], "plan": c[AGREED] + c[PLANNED_ONLY], "agreed": c[AGREED],
                "planned_only": c[PLANNED_ONLY], "atc_only": c[ATC_ONLY]}

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["counts"] = self.counts()
        return d

    def verdict(self) -> str:
        c = self.counts()
        return (f"ATC {c['atc']} TransData, plan {c['plan']}: {c['agreed']} agreed, "
                f"{c['planned_only']} planned only, {c['atc_only']} ATC only")

    @classmethod
    def from_dict(cls, d: dict) -> "AgainstReport":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["ops"] = [OpMapping(**x) for x in kw.get("ops", [])]
        kw["atc_transdata"] = [AtcTransData(**x) for x in kw.get("atc_transdata", [])]
        kw["diff"] = [DiffEntry(**x) for x in kw.get("diff", [])]
        return cls(**kw)



# ---------------------------------------------------------------------------------------------------
# the naming conventions (files without the fusion attributes)

_BOUNDARY = "_/:."
MIN_UNBOUNDED = 3      # a node name found right after other letters must be at least this long


class NameMap:
    """ONNX nodes named by an ``.om`` op's name, by the conventions of a real ATC 7.6 file
    (:data:`~npu_deploy.converters.files.om.INSERTED_NAME` and the constants beside it): the op's name
    itself, ``PartitionedCall_<node>_<CANN op>_<n>``, ``<node>function_graph_<n>/...``, a fused
    ``<node a>_<CANN op><node b>`` (every node name found in it, longest first, left to right, each ending
    at the end of the name, a separator, or ``function_graph_``), ``<producer>:<k>:<output>`` (the
    producer of the ONNX tensor ``output``).

    >>> NameMap({"bn1": ["b"], "prelu1": ["p"]}).nodes("bn1_BNInferenceDprelu1")
    ['bn1', 'prelu1']
    >>> NameMap({"/up/Resize": ["r"]}).nodes("PartitionedCall_/up/Resize_ResizeBilinearV2_4")
    ['/up/Resize']
    """

    def __init__(self, node_outputs: Mapping[str, list[str]]):
        self.node_outputs = node_outputs
        self.producer = {o: n for n, outs in node_outputs.items() for o in outs if o}
        self._lengths = sorted({len(n) for n in node_outputs if n}, reverse=True)

    def _ends_at(self, name: str, end: int) -> bool:
        return end == len(name) or name[end] in _BOUNDARY or name.startswith(omfile.FUNCTION_GRAPH_MARK, end)

    def _scan(self, name: str) -> list[str]:
        found: list[str] = []
        i = 0
        while i < len(name):
            hit = None
            for n in self._lengths:
                cand = name[i:i + n]
                if len(cand) < n:
                    continue
                bounded = i == 0 or name[i - 1] in _BOUNDARY or cand[0] in _BOUNDARY
                if (cand in self.node_outputs and self._ends_at(name, i + n)
                        and (bounded or n >= MIN_UNBOUNDED)):
                    hit = cand
                    break
            if hit is None:
                i += 1
                continue
            if hit not in found:
                found.append(hit)
            i += len(hit)
        return found

    def nodes(self, name: str) -> list[str]:
        """The ONNX nodes ``name`` stands for (empty: none found)."""
        if name in self.node_outputs:
            return [name]
        if omfile.is_inserted_name(name):
            return []
        m = omfile.OUTPUT_NAME.fullmatch(name)
        if m and m.group("output") in self.producer:
            return [self.producer[m.group("output")]]
        core = name[len(omfile.PARTITIONED_PREFIX):] if name.startswith(omfile.PARTITIONED_PREFIX) else name
        return self._scan(core)

    def how(self, name: str) -> str:
        if name in self.node_outputs:
            return "name"
        if name.startswith(omfile.PARTITIONED_PREFIX):
            return "name: PartitionedCall_<node>_<CANN op>_<n>"
        if omfile.FUNCTION_GRAPH_MARK in name:
            return "name: <node>function_graph_<n>/..."
        if omfile.OUTPUT_NAME.fullmatch(name):
            return "name: <producer>:<k>:<output>"
        return "name: fused names"


def _compute_op(m: OpMapping) -> bool:
    """An op of the model's computation: not an input, the output, a constant or an inserted conversion."""
    return not m.inserted and m.type not in omfile.INPUT_OP_TYPES and m.type not in _NOT_COMPUTE


_NOT_COMPUTE = frozenset({"NetOutput", "Const", "Constant", "Variable"})


def map_by_names(mapping: list[OpMapping], names: NameMap) -> float:
    """Fill each op's ``onnx_nodes`` (by the attribute when the file has it, else by the naming
    conventions) and return the op-map coverage: the fraction of compute ops mapped to ONNX nodes."""
    for m in mapping:
        if m.mapped_by == "attribute":
            m.onnx_nodes = [n for n in m.original if n in names.node_outputs]
            continue
        if omfile.is_inserted_name(m.op):
            m.inserted, m.mapped_by, m.onnx_nodes = True, "name: inserted by ATC (trans_<op>_<n>)", []
            continue
        m.onnx_nodes = names.nodes(m.op)
        m.mapped_by = names.how(m.op) if m.onnx_nodes else ""
    compute = [m for m in mapping if _compute_op(m)]
    return round(sum(1 for m in compute if m.onnx_nodes) / len(compute), 4) if compute else 0.0


# ---------------------------------------------------------------------------------------------------
# the .om side (works without an ONNX model: names are the source framework's)

def _main_ops(model: omfile.OmModel) -> list[omfile.OmOp]:
    m = model.main
    if m is None:
        raise OmError(f"{model.path}: no ModelDef with ops to map" +
                      (f" ({model.notes[0]})" if model.notes else ""),
                      hint="give an unencrypted .om written by ATC (--mode=0)")
    if m.ops is None:
        raise ValueError("read the .om with read_om(path, keep_ops=True)")
    return m.ops


def _is_transdata(op: omfile.OmOp) -> bool:
    return op.type.startswith("TransData")


def op_mapping(model: omfile.OmModel) -> list[OpMapping]:
    """Every op of the main model with the original nodes ATC recorded for it.

    ``model`` comes from ``read_om(path, keep_ops=True)``.
    """
    out = []
    for op in _main_ops(model):
        names = [op.name] if op.original_names is None else list(op.original_names)
        out.append(OpMapping(op.name, op.type, op.graph, names, inserted=op.original_names == [],
                             mapped_by="" if op.original_names is None else "attribute"))
    return out


def _edge(text: str) -> tuple[str, int] | None:
    """``"producer:3"`` -> ("producer", 3); control edges (``:-1``) and empty inputs -> None."""
    if not text:
        return None
    name, sep, idx = text.rpartition(":")
    if not sep or not idx.lstrip("-").isdigit():
        return text, 0
    k = int(idx)
    return None if k < 0 else (name, k)


def _data_edges(op: omfile.OmOp) -> list[tuple[str, int]]:
    return [e for e in (_edge(t) for t in op.inputs) if e is not None]


def _source(index: Mapping[str, omfile.OmOp], edge: tuple[str, int],
            names: NameMap | None = None) -> tuple[str | None, int | None, str]:
    """The original tensor on ``edge``: (node, output index, how it was found). With ``names`` (the
    ONNX model's), an op without the mapping attribute is mapped by the naming conventions: a
    ``trans_<op>_<n>`` is walked through as inserted, another name gives its last ONNX node."""
    steps: list[str] = []
    seen: set[str] = set()
    while True:
        name, k = edge
        p = index.get(name)
        if p is None:
            return None, None, " ".join(steps + [f"input {name}:{k} names no op of the graph"])
        origins = p.output_origins
        if k < len(origins) and origins[k] is not None:
            o = origins[k]
            return o.name, o.output_index, " ".join(
                steps + [f"{p.name} output {k} carries {omfile.ORIGIN_NAME_ATTR}"])
        if p.type in omfile.INPUT_OP_TYPES:
            return p.name, 0, " ".join(steps + [f"graph input {p.name}"])
        by_name = p.original_names is None and names is not None and p.name not in names.node_outputs
        if by_name and not omfile.is_inserted_name(p.name):
            found = names.nodes(p.name)
            if found:
                return found[-1], k, " ".join(steps + [f"{p.name} output {k} ({names.how(p.name)})"])
            by_name = False
        if p.original_names is None and not by_name:
            return p.name, k, " ".join(steps + [f"{p.name} output {k}, the op being the original node"])
        if p.original_names:
            # a fused op without the output attribute: the last node of the fused group (§4)
            return p.original_names[-1], k, " ".join(
                steps + [f"{p.name} output {k} (last fused node; no {omfile.ORIGIN_NAME_ATTR})"])
        data = _data_edges(p)
        if not data:
            return None, None, " ".join(steps + [f"{p.name} ({p.type}, inserted by ATC) has no data input"])
        if p.name in seen or len(seen) >= MAX_WALK:
            return None, None, " ".join(steps + [f"stopped at {p.name}: the inputs loop, or more than "
                                                 f"{MAX_WALK} inserted ops in a row"])
        seen.add(p.name)
        steps.append(f"through {p.name} ({p.type}):")
        edge = data[0]


def _fmt(op: omfile.OmOp, key: str, descs: list[str]) -> str:
    v = op.attrs.get(key)
    if isinstance(v, str) and v and v != "?":
        return v
    return descs[0] if descs else "?"


def atc_transdata(model: omfile.OmModel, names: NameMap | None = None) -> list[AtcTransData]:
    """The TransData ops of the main model, each with the original tensor it converts.

    ``model`` comes from ``read_om(path, keep_ops=True)``. Works on any ``.om``: the names are those of
    the source framework (TensorFlow node names for a TensorFlow-origin model).

    >>> from npu_deploy.converters.files.om import read_om
    >>> [(t.name, t.origin) for t in atc_transdata(read_om("m.om", keep_ops=True))]   # doctest: +SKIP
    [('trans_TransData_1', 's'), ('trans_TransData_11', 'W_0/conv3/Relu'), ...]
    """
    ops = _main_ops(model)
    by_graph: dict[str, dict[str, omfile.OmOp]] = {}
    everywhere: dict[str, omfile.OmOp] = {}
    for op in ops:
        by_graph.setdefault(op.graph, {}).setdefault(op.name, op)
        everywhere.setdefault(op.name, op)
    out = []
    for op in ops:
        if not _is_transdata(op):
            continue
        own = op.output_origins[0] if op.output_origins else None
        if own is not None:
            origin, index, via = own.name, own.output_index, f"its own output carries {omfile.ORIGIN_NAME_ATTR}"
        else:
            data = _data_edges(op)
            if data:
                # an edge names an op of the same graph first (names repeat across subgraphs)
                origin, index, via = _source(ChainMap(by_graph[op.graph], everywhere), data[0], names)
            else:
                origin, index, via = None, None, "no data input"
        out.append(AtcTransData(
            name=op.name, graph=op.graph, src_format=_fmt(op, "src_format", op.input_formats),
            dst_format=_fmt(op, "dst_format", op.output_formats),
            in_shape=list(op.input_shapes[0]) if op.input_shapes else [],
            out_shape=list(op.output_shapes[0]) if op.output_shapes else [],
            origin=origin, origin_output=index, via=via, inserted=not op.original_names))
    return out


# ---------------------------------------------------------------------------------------------------
# the ONNX side and the diff

def _identity_layouts() -> frozenset[str]:
    """Formats byte-identical to a row-major ONNX tensor: plain entries whose pattern moves no axis."""
    same = set()
    for name, f in formats.FORMATS.items():
        pats = [lay.pattern for lay in f.layouts.values()]
        if f.plain and pats and all(p.split("->")[0].split() == p.split("->")[1].split() for p in pats):
            same.add(name)
    return frozenset(same)


_IDENTITY = _identity_layouts()


def canonical_format(fmt: str, rank: int) -> str:
    """The name both sides are compared under: sub-format and C0 annotations dropped, and every layout
    byte-identical to the ONNX tensor named as the planner's reports name it (NCHW for 4-D, NCDHW for
    5-D, ND otherwise).

    >>> canonical_format("ND", 4), canonical_format("NCHW", 2), canonical_format("FRACTAL_Z:2", 4)
    ('NCHW', 'ND', 'FRACTAL_Z')
    >>> canonical_format("FRACTAL_NZ[C0=8]", 2), canonical_format("NHWC", 4)
    ('FRACTAL_NZ', 'NHWC')
    """
    base = _base(fmt)
    return planner.plain_name(rank) if base in _IDENTITY else base


def _base(fmt: str) -> str:
    base = re.split(r"[:\[]", str(fmt), maxsplit=1)[0].strip()
    return base[len("FORMAT_"):] if base.startswith("FORMAT_") else base


class _Names:
    """Original names -> ONNX tensors: node names (main graph and bodies), graph inputs, tensor names."""

    def __init__(self, graph):
        self.node_outputs: dict[str, list[str]] = {}
        self.tensors: set[str] = set()
        self._walk(graph)
        inits = {t.name for t in graph.initializer}
        self.inputs = [i.name for i in graph.input if i.name not in inits]
        self.tensors.update(self.inputs)

    def _walk(self, graph) -> None:
        for n in graph.node:
            self.node_outputs.setdefault(n.name, list(n.output))
            self.tensors.update(o for o in n.output if o)
            for a in n.attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    self._walk(g)

    def tensor(self, origin: str | None, index: int | None) -> str | None:
        if origin is None:
            return None
        outs = self.node_outputs.get(origin)
        if outs is not None:
            k = index or 0
            return outs[k] if k < len(outs) and outs[k] else None
        if origin in self.tensors:   # a graph input (ATC's Data op) or a tensor named directly
            return origin
        return None


def _key(tensor: str | None, src: str, dst: str, rank: int) -> tuple[str | None, str, str]:
    return tensor, canonical_format(src, rank), canonical_format(dst, rank)


def _diff(atc: list[tuple[tuple, str]], plan: list[tuple[tuple, str, str]]) -> list[DiffEntry]:
    """Multiset match on the key: each ATC TransData agrees with at most one planned one."""
    pending: dict[tuple, list[tuple[str, str]]] = {}
    for key, name, reason in plan:
        pending.setdefault(key, []).append((name, reason))
    out: list[DiffEntry] = []
    for key, name in atc:
        match = pending.get(key) if key[0] is not None else None
        if match:
            pname, reason = match.pop(0)
            out.append(DiffEntry(AGREED, key[0], key[1], key[2], atc=name, plan=pname, reason=reason))
        else:
            out.append(DiffEntry(ATC_ONLY, key[0], key[1], key[2], atc=name))
    for key, left in pending.items():
        for pname, reason in left:
            out.append(DiffEntry(PLANNED_ONLY, key[0], key[1], key[2], plan=pname, reason=reason))
    return out


def _parse_onnx(path: str):
    """The graph as parsed (no check, no external data), or None when the file is not ONNX."""
    import onnx   # heavy: only here and in the loader

    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:  # protobuf's DecodeError and friends: the loader words the error
        return None
    return model.graph if model.HasField("graph") else None


def _require_mapping(mapping: list[OpMapping], names: NameMap, om_path: str, onnx_path: str) -> None:
    if any(n in names.node_outputs for m in mapping if not m.inserted for n in m.original):
        return
    if any(names.nodes(m.op) for m in mapping if m.mapped_by != "attribute"):
        return
    sample = [n for m in mapping if not m.inserted and m.type not in omfile.INPUT_OP_TYPES
              and m.type != "NetOutput" for n in m.original][:3]
    raise InputError(f"{om_path}: no op maps to this model {onnx_path}: the .om's original names "
                     f"({', '.join(repr(s) for s in sample) or 'none recorded'}) are not "
                     f"nodes of {os.path.basename(onnx_path)}",
                     hint="pass the ONNX model the .om was converted from")


def _views(graph) -> dict[str, str]:
    """tensor -> the tensor a view op (:data:`VIEW_OPS`) makes of it."""
    out: dict[str, str] = {}
    for n in graph.node:
        if n.op_type in VIEW_OPS and n.input and len(n.output) == 1:
            out.setdefault(n.input[0], n.output[0])
    return out


def _through_views(a: str, b: str, views: dict[str, str]) -> bool:
    """True when ``b`` is ``a`` seen through a chain of view ops (either direction)."""
    for start, goal in ((a, b), (b, a)):
        t = start
        for _ in range(MAX_WALK):
            t = views.get(t)
            if t is None:
                break
            if t == goal:
                return True
    return False


def _same_format(x: str, y: str) -> bool:
    """Equal, or both plain (a view op changes the rank, so NCHW on one side may be ND on the other):
    the one "same layout" predicate, :func:`~npu_deploy.converters.formats.graph.same_format`."""
    return same_format(x, y)


def _pair_across_views(diff: list[DiffEntry], views: dict[str, str]) -> list[DiffEntry]:
    """An ATC-only and a planned-only conversion of the same data on either side of a view op agree."""
    planned = [d for d in diff if d.status == PLANNED_ONLY and d.tensor]
    for d in diff:
        if d.status != ATC_ONLY or not d.tensor:
            continue
        q = next((q for q in planned if _same_format(q.src_format, d.src_format)
                  and _same_format(q.dst_format, d.dst_format) and _through_views(d.tensor, q.tensor, views)), None)
        if q is None:
            continue
        planned.remove(q)
        diff.remove(q)
        d.status, d.plan = AGREED, q.plan
        d.reason = (f"the plan converts {q.tensor}, the same data through a view op ATC folded into the "
                    f"TransData" + (f"; {q.reason}" if q.reason else ""))
    return diff


def _shapes_from_om(model: omfile.OmModel, onnx_inputs: list[str], given: dict | None,
                    notes: list[str]) -> dict[str, list[int]]:
    shapes = {k: [int(d) for d in v] for k, v in (given or {}).items()}
    for t in model.inputs:
        if t.name == omfile.DYNAMIC_INPUT_NAME or t.name in shapes:
            continue
        if t.name not in onnx_inputs:
            notes.append(f".om input {t.name} is not an input of the ONNX model")
            continue
        # gear models record the -1 dims in the shape; otherwise origin_shape is the logical one
        shape = t.shape if any(d < 0 for d in t.shape) else (t.origin_shape or t.shape)
        if any(d < 0 for d in shape) and not (model.main and model.main.gears):
            notes.append(f".om input {t.name} is dynamic {shape}: the ONNX model's own shape is used "
                         "(fix it with --input-shape)")
            continue
        shapes[t.name] = list(shape)
    return shapes


def _om_gears(model: omfile.OmModel, shapes: dict, given: dict, notes: list[str]) -> dict:
    """``load_model`` keywords for the .om's gears (dynamic batch / image size / dims), so that the
    plan is made, as ATC's, at the largest gear; {} for a static model or shapes the user fixed."""
    m = model.main
    if m is None or not m.gears or not any(d < 0 for k, v in shapes.items() if k not in given for d in v):
        return {}
    notes.append(f".om gears ({m.dynamic_mode}): {' '.join(','.join(map(str, g)) for g in m.gears)}; "
                 "planned at the largest, as ATC compiles each")
    if m.dynamic_mode == "batch":
        return {"dynamic_batch": [g[0] for g in m.gears]}
    return {"dynamic_dims": [list(g) for g in m.gears]}   # image size: the two -1 dims, H and W


def _shape_text(shapes: dict) -> str:
    return "; ".join(f"{k}:{','.join(str(d) for d in v)}" for k, v in shapes.items())


def _precision(model: omfile.OmModel, given: str | None, notes: list[str]) -> str | None:
    if given:
        return given
    cmd = model.main.attrs.get("atc_cmdline") if model.main else None
    m = _CMDLINE_PRECISION.search(cmd) if isinstance(cmd, str) else None
    if m is None:
        return None
    if m.group(1) in planner.PRECISION_MODES:
        return m.group(1)
    notes.append(f"ATC ran with --precision_mode={m.group(1)}, which the built-in planner does not "
                 "take: planned with its default")
    return None


def against(om_path: str | os.PathLike, onnx_path: str | os.PathLike, *, soc: str | None = None,
            precision_mode: str | None = None,
            input_shapes: dict[str, Iterable[int]] | None = None) -> AgainstReport:
    """Diff the TransData ATC placed in ``om_path`` against the built-in plan of ``onnx_path``.

    The plan uses the ``.om``'s SoC (``soc`` only when the file does not record one; a different one is
    an ``InputError``), ``precision_mode`` (else the one in the ``.om``'s ``atc_cmdline``, else the
    planner's default) and the ``.om``'s input shapes (``input_shapes`` wins). Raises ``OmError`` /
    ``ModelError`` / ``InputError`` (exit 2) for a file that is not an ``.om`` / not ONNX, or an ``.om``
    none of whose ops maps to a node of the model.
    """
    om_path, onnx_path = os.fspath(om_path), os.fspath(onnx_path)
    if not omfile.is_om(om_path):
        if not os.path.exists(om_path):
            raise OmError(f"{om_path}: no such file", hint="check the path")
        raise OmError(f"{om_path}: not an ATC .om (--against compares an .om with the ONNX model it was "
                      "built from)", hint="give the .om as FILE and the .onnx after --against")
    model = omfile.read_om(om_path, keep_ops=True)
    if model.variant != "om":
        raise OmError(f"{om_path}: {model.notes[0] if model.notes else model.variant}: its ops cannot be read",
                      hint="give an unencrypted .om written by ATC")
    notes: list[str] = []
    mapping = op_mapping(model)
    loaded, soc, shapes = _load_for(model, onnx_path, mapping, soc=soc, input_shapes=input_shapes, notes=notes)
    names = _Names(loaded.graph)   # node names as the loader gives them (unnamed: <OpType>_<index>)
    by_name = NameMap(names.node_outputs)
    _require_mapping(mapping, by_name, om_path, onnx_path)
    coverage = map_by_names(mapping, by_name)
    listed = atc_transdata(model, by_name)
    the_plan = planner.plan(loaded, soc=soc, precision_mode=_precision(model, precision_mode, notes))
    mapped = {n for m in mapping for n in m.onnx_nodes}
    plan_keys = [(_key(td.tensor, td.src_format, td.dst_format, _rank(loaded, td.tensor, td.shape)), td.name,
                  td.reason) for td in the_plan.transdata]
    if len(model.models) > 1:
        notes.append(f"the .om holds {len(model.models)} models: only the first is compared")
    diff = _diff(_atc_keys(listed, mapping, names, loaded, notes), plan_keys)
    return AgainstReport(
        om=om_path, onnx=onnx_path, soc=soc, precision_mode=the_plan.precision_mode, input_shapes=shapes,
        ops=mapping, atc_transdata=listed, plan_transdata=[td.to_manifest() for td in the_plan.transdata],
        diff=_pair_across_views(diff, _views(loaded.graph)), onnx_node_count=len(loaded.graph.node),
        onnx_nodes_not_in_om=[n.name for n in loaded.graph.node if n.name not in mapped], notes=notes,
        op_map_coverage=coverage)


def _load_for(model: omfile.OmModel, onnx_path: str, mapping: list[OpMapping], *, soc: str | None,
              input_shapes: dict | None, notes: list[str]):
    """Load the ONNX model with the .om's input shapes, after checking it is the right model and the
    SoC is known: (loaded model, SoC, input shapes used)."""
    om_path = model.path
    raw = _parse_onnx(onnx_path)
    if raw is None:
        load_model(onnx_path)   # raises the loader's one-line ModelError for a file that is not ONNX
        raise InputError(f"{onnx_path}: cannot be read as ONNX")
    if all(n.name for n in raw.node):   # unnamed nodes get the loader's names: checked after loading
        _require_mapping(mapping, NameMap({n.name: list(n.output) for n in raw.node}), om_path, onnx_path)

    om_soc = model.soc_version
    if om_soc and soc and om_soc != soc:
        raise InputError(f"{om_path} was built for {om_soc}, not {soc}",
                         hint="drop --soc: the plan uses the .om's SoC")
    soc = om_soc or soc
    if not soc:
        raise InputError(f"{om_path} does not record its SoC", hint="give it with --soc (e.g. --soc Ascend310P3)")

    given = {k: list(v) for k, v in (input_shapes or {}).items()}
    inits = {t.name for t in raw.initializer}
    shapes = _shapes_from_om(model, [i.name for i in raw.input if i.name not in inits], given, notes)
    try:
        loaded = load_model(onnx_path, input_shapes=shapes or None, **_om_gears(model, shapes, given, notes))
    except ModelError as e:
        from_om = {k: v for k, v in shapes.items() if k not in given}
        if not from_om or "--input-shape" not in e.message:
            raise
        raise ModelError(f"the input shapes of {om_path} ({_shape_text(from_om)}) do not fit {onnx_path}: "
                         f"{e.message}", hint="give the shapes with --input-shape") from None
    return loaded, soc, shapes


def _rank(loaded, tensor: str | None, fallback) -> int:
    shape = loaded.shapes.get(tensor) if tensor else None
    return len(shape) if shape is not None else len(fallback)


def _atc_keys(listed: list[AtcTransData], mapping: list[OpMapping], names: _Names, loaded,
              notes: list[str]) -> list[tuple[tuple, str]]:
    """Resolve each ATC TransData to its ONNX tensor (in place) and key it for the diff."""
    by_op = {m.op: m for m in mapping}
    keys: list[tuple[tuple, str]] = []
    for t in listed:
        m = by_op.get(t.name)
        if t.inserted and m is not None and not m.inserted and t.name in names.node_outputs:
            t.inserted = False   # no mapping attribute, and the name is a node of the model: that node
        t.tensor = names.tensor(t.origin, t.origin_output)
        if t.origin is not None and t.tensor is None:
            t.via += (f"; node {t.origin} has no output {t.origin_output}" if t.origin in names.node_outputs
                      else f"; {t.origin} is not a node or tensor of the ONNX model")
        if not t.inserted:
            notes.append(f"{t.name} is the model's own node, lowered to TransData: listed, not diffed")
            continue
        plain_side = t.in_shape if _base(t.src_format) in _IDENTITY else t.out_shape
        keys.append((_key(t.tensor, t.src_format, t.dst_format, _rank(loaded, t.tensor, plain_side)), t.name))
    return keys


# ---------------------------------------------------------------------------------------------------
# terminal

def _conv(d: DiffEntry) -> str:
    return f"{d.tensor or '(unmapped)'} {d.src_format} -> {d.dst_format}"


def render_text(report: AgainstReport, *, ops: bool = False) -> str:
    """The terminal report: the op map (every op with ``ops``), ATC's TransData, the diff, the verdict.
    Every line goes through :func:`~npu_deploy._text.printable` (names come from a stranger's files)."""
    mapped = [m for m in report.ops if m.onnx_nodes]
    n_nodes = len({n for m in mapped for n in m.onnx_nodes})
    shapes = _shape_text(report.input_shapes)
    lines = [f"{report.om} against {report.onnx} ({report.soc}, {report.precision_mode}"
             + (f"; {shapes}" if shapes else "") + ")",
             f"  op map: {len(mapped)} of {len(report.ops)} .om ops carry {n_nodes} of "
             f"{report.onnx_node_count} ONNX nodes ({report.op_map_coverage:.0%} of the compute ops mapped"
             + (f", {sum(1 for m in mapped if m.mapped_by.startswith('name'))} by name" 
                if any(m.mapped_by.startswith("name") for m in mapped) else "") + ")"
             + (f"; not in the .om (folded or fused away): {len(report.onnx_nodes_not_in_om)}"
                if report.onnx_nodes_not_in_om else "")]
    if ops:
        for m in report.ops:
            what = "inserted by ATC" if m.inserted else ", ".join(m.onnx_nodes) or "(no ONNX node)"
            lines.append(f"    {m.op} [{m.type}]: {what}")
    lines.append(f"  TransData in the .om ({len(report.atc_transdata)}):")
    for t in report.atc_transdata:
        on = t.tensor or (f"{t.origin}:{t.origin_output} (not in the ONNX model)" if t.origin else "(unmapped)")
        lines.append(f"    {t.name}: {on} {t.src_format} -> {t.dst_format} (mapping: {t.via})")
    for status in (AGREED, PLANNED_ONLY, ATC_ONLY):
        group = [d for d in report.diff if d.status == status]
        lines.append(f"  {status} ({len(group)}):")
        for d in group:
            names = " | ".join(x for x in (f"ATC {d.atc}" if d.atc else "", f"plan {d.plan}" if d.plan else "")
                               if x)
            why = f": {d.reason}" if d.reason and status == PLANNED_ONLY else ""
            lines.append(f"    {_conv(d)} [{names}]{why}")
    lines += [f"  note: {note}" for note in report.notes]
    lines.append(report.verdict())
    return "\n".join(printable(line) for line in lines)
