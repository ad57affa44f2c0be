"""What a model file holds: ONNX models, offline bundles and ATC ``.om`` files, told apart by content.

>>> from npu_deploy import inspect
>>> r = inspect("model.onnx")                                # doctest: +SKIP
>>> r.kind, [i["name"] for i in r.inputs], r.op_types        # doctest: +SKIP
('onnx', ['x'], {'Conv': 2, 'Relu': 2})
>>> r.verdict()                                              # doctest: +SKIP
'ONNX model: 1 input, 1 output, 4 nodes (2 op types), opset 17; integrity OK'
>>> r.to_json("model-info.json")                             # doctest: +SKIP

The kind is found from the first bytes: the bundle magic, ``IMOD`` (ATC ``.om``; ``PICO`` and ZIP/OM2
containers are reported as such), else an ONNX ``ModelProto``. The file name never matters.

JSON schema ``npu-deploy/inspect``, version 1 (``InspectReport.to_json``). Top level:

* ``schema``, ``schema_version``, ``ok`` (no integrity problem), ``verdict`` (one line)
* ``path``, ``kind`` (``"onnx"`` | ``"bundle"`` | ``"om"`` | ``"dump"``), ``file_size``
* ``inputs`` / ``outputs``: lists of ``{name, dtype, shape, format, ...}``; ``shape`` uses -1 for a
  dynamic dimension (``null`` when the rank is unknown); kind-specific keys: ONNX ``dim_names``
  (``format`` is what ATC assumes for ONNX by default: NCHW for 4-D, NCDHW for 5-D, else ND);
  bundle ``device_format``, ``device_shape``, ``c0``, ``nbytes``; ``.om`` ``format_word``,
  ``origin_format``, ``size`` (device bytes)
* ``op_count``, ``op_types`` (type → count, most common first)
* ``layout_ops``: format changes, each ``{name, type, src_format, dst_format, shape, ...}``:
  the TransData/Cast/Transpose ops of an ``.om``; the planned TransData of a bundle or of an ONNX
  model inspected with ``soc``
* ``problems`` (integrity failures; ``ok`` is false when not empty), ``notes`` (informational)
* ``onnx`` (or null): ``producer_name``, ``producer_version``, ``ir_version``, ``opsets`` (domain →
  version), ``graph_name``, ``node_count``, ``subgraph_node_count``, ``initializer_count``,
  ``initializer_bytes``, ``constant_node_bytes``, ``external_data`` (``[{file, tensors, bytes, exists}]``), ``nodes`` (with
  ``ops``: ``[{name, op_type, domain}]``, plus with ``soc``: ``planned_name`` (the name used by the
  plan; unnamed nodes become ``<op_type>_<index>``), ``engine``, ``cann_op``, ``folded``), ``soc`` (with ``soc``: ``{soc, precision_mode,
  support: {AI Core, AI CPU, unsupported}, unsupported: [...], node_formats?, transdata_naive_count?,
  formattrans_share?, estimated_total_us?, planner}``)
* ``bundle`` (or null): ``soc``, ``precision_mode``, ``producer``, ``producer_version``,
  ``source_model``, ``dynamic`` (``{mode, gears}``), ``memory``, ``transdata_naive_count``,
  ``formattrans_share``, ``weights`` (``{count, bytes}``), ``graph`` (``{nodes, opset}``),
  ``integrity`` (``[{check, ok, detail}]``: header, sections and checksums; self-contained (no
  external data, functions or foreign op domains: what the emulator refuses to run); manifest fields
  of the types and ranges the runtime reads; manifest/graph agreement; weights used; memory plan),
  ``node_formats`` (with ``layers``). A bundle the emulator would refuse is reported, not raised:
  ``ok`` is false (exit 1); a damaged header, section table or graph/manifest checksum raises (exit 2)
* ``om`` (or null): ``variant`` (``"om"``, ``"encrypted"``, ``"PICO"``, ``"ZIP"`` (maybe an OM2)), ``header`` (all
  ModelFileHeader fields), ``partitions`` (``[{model_index, type, type_name, offset, size}]``),
  ``model`` (``{name, version, graphs, attrs}``: scalar model attributes, e.g. ``soc_version``,
  ``atc_version``, ``atc_cmdline``), ``soc_version``, ``atc_version``, ``dynamic`` (``{mode, gears}``,
  plus ``ranges`` for a shape-range model: input → per dim ``[low, high]`` or the fixed size; each
  ``.om`` input also has ``shape_range``), ``engines`` (engine → op count), ``submodels``, ``ops`` (with ``ops`` or ``layers``: every op with
  its engine and edge formats)
* ``dump`` (or null): an ACL operator dump file (``converters/files/dump.py``): ``op_type``, ``op_name``,
  ``task_id``, ``stream_id``, ``timestamp``, ``version``, ``dump_time``; its tensors are the
  ``inputs`` (named ``input:N``) and ``outputs`` (``output:N``), each with ``dtype``, ``format`` (device),
  ``shape`` (device/storage), ``original_shape``, ``sub_format``, ``bytes`` and, for outputs,
  ``original_name`` / ``original_index`` / ``original_format`` (OriginalOp)
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from npu_deploy._text import printable
from npu_deploy._thresholds import FORMATTRANS_THRESHOLD_PCT
from npu_deploy._result import Result
from npu_deploy.converters.files import dump as dumpfile
from npu_deploy.errors import BundleError, InputError, ModelError
from npu_deploy.converters.files.bundle import BUNDLE_MAGIC
from npu_deploy.converters.files.bundle import check_graph, check_self_contained, read_bundle, validate_manifest
from npu_deploy.converters.files.om import read_om
from npu_deploy.converters.files.onnx_model import check_initializer_sizes # imports onnx, as above
from npu_deploy.converters.files.onnx_model import load_model
from npu_deploy.converters.lowering import planner
from npu_deploy.converters.lowering.support import check_support

KINDS = ("onnx", "bundle", "om", "dump")


@dataclasses.dataclass
class InspectReport(Result):
    """What :func:`inspect` found (schema ``npu-deploy/inspect`` v1, see the module docstring).

    ``bool(report)`` is True when no integrity problem was found.
    """

    SCHEMA: ClassVar[str] = "npu-deploy/inspect"
    SCHEMA_VERSION: ClassVar[int] = 1

    path: str
    kind: str
    file_size: int
    inputs: list[dict] = dataclasses.field(default_factory=list)
    outputs: list[dict] = dataclasses.field(default_factory=list)
    op_count: int = 0
    op_types: dict[str, int] = dataclasses.field(default_factory=dict)
    layout_ops: list[dict] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    onnx: dict | None = None
    bundle: dict | None = None
    om: dict | None = None
    dump: dict | None = None

    def __bool__(self) -> bool:
        return not self.problems

    def verdict(self) -> str:
        return printable(self._verdict())

    def _verdict(self) -> str:
        n_in, n_out = len(self.inputs), len(self.outputs)
        io = f"{n_in} input{'s' * (n_in != 1)}, {n_out} output{'s' * (n_out != 1)}"
        state = "integrity OK" if not self.problems else f"{len(self.problems)} integrity problem(s)"
        trans = sum(1 for o in self.layout_ops if str(o.get("type") or "TransData").startswith("TransData"))
        if self.kind == "onnx":
            d = self.onnx or {}
            text = (f"ONNX model: {io}, {self.op_count} nodes ({len(self.op_types)} op types), "
                    f"opset {d.get('opsets', {}).get('', d.get('opsets', {}).get('ai.onnx', '?'))}")
            soc = d.get("soc")
            if soc:
                s = soc.get("support", {})
                text += (f"; on {soc.get('soc')}: {s.get('AI Core', 0)} AI Core, {s.get('AI CPU', 0)} AI CPU, "
                         f"{s.get('unsupported', 0)} unsupported")
                if "transdata_count" in soc:
                    text += f", {soc['transdata_count']} TransData planned"
                if soc.get("formattrans_share") is not None:
                    text += f" (est. FormatTrans {100 * soc['formattrans_share']:.1f} %)"
            return f"{text}; {state}"
        if self.kind == "dump":
            d = self.dump or {}
            return f"operator dump of {d.get('op_type') or '?'} {d.get('op_name')}: {io}; reads cleanly"
        if self.kind == "bundle":
            b = self.bundle or {}
            folded = (b.get("graph") or {}).get("constant_folded") or 0
            # the count convert prints: the nodes that run (constant-folded ones said apart)
            nodes = f"{self.op_count - folded} nodes" + (f" ({folded} constant-folded)" if folded else "")
            return (f"offline bundle for {b.get('soc') or '?'} ({b.get('precision_mode') or '?'}): {io}, "
                    f"{nodes}, {trans} TransData planned; {state}")
        o = self.om or {}
        variant = o.get("variant")
        if variant in ("PICO", "ZIP"):
            return f"{variant} container, not a classic ATC .om: not decoded"
        if variant == "encrypted":
            return "encrypted .om: header only (model contents need the key)"
        dyn = (o.get("dynamic") or {}).get("mode")
        return (f".om for {o.get('soc_version') or 'unknown SoC'} (ATC {o.get('atc_version') or '?'}): {io}"
                f"{f', dynamic {dyn}' if dyn else ''}, {self.op_count} ops, {trans} TransData; {state}")

    @classmethod
    def from_dict(cls, d: dict) -> "InspectReport":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# -----------------------------------------------------------------------------------------------------
# detection

def detect_kind(path: str | os.PathLike) -> str:
    """``"bundle"``, ``"om"``, ``"dump"`` or ``"onnx"`` from the file's first bytes (``InputError`` when
    the file cannot be read). An ACL operator dump is also told by its name (``Type.name.task.stream.
    timestamp`` or ``*.dump``), so that a damaged one is reported as a dump.

    Anything starting with ``IMOD``, ``PICO`` or a ZIP header is an ``.om`` kind (foreign containers are
    reported by the ``.om`` reader as such); everything else is tried as ONNX, whose parser then decides.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file", hint="check the path")
    if p.is_dir():
        raise InputError(f"{p}: is a folder", hint="give a model file (.onnx, bundle or .om)")
    if not p.is_file():  # a device (/dev/zero), a FIFO, a socket: endless or blocking reads
        raise InputError(f"{p}: is not a regular file (a device, pipe or socket)",
                         hint="give a model file (.onnx, bundle or .om)")
    try:
        with open(p, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror})") from None
    if head.startswith(BUNDLE_MAGIC):
        return "bundle"
    if head[:4] in (b"IMOD", b"PICO", b"PK\x03\x04"):
        return "om"
    if dumpfile.looks_like_dump(p):
        return "dump"
    return "onnx"


def inspect(path: str | os.PathLike, *, soc: str | None = None, ops: bool = False, layers: bool = False,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            dynamic_batch: Sequence[int] | None = None, precision_mode: str | None = None,
            verify: bool = True) -> InspectReport:
    """Describe an ONNX model, an offline bundle or an ``.om`` file (kind detected by content).

    ``soc`` (ONNX only): add the op-support verdict per node and the built-in planner's layouts,
    TransData list and estimated FormatTrans share (``input_shapes``/``dynamic_batch`` fix dynamic
    dimensions as for ``convert``). ``ops``: list every node/op. ``layers``: per-node formats.
    ``verify=False`` skips the bundle weight checksum.

    >>> r = inspect("model.om", ops=True)        # doctest: +SKIP
    >>> r.om["soc_version"], r.om["header"]["version_text"]   # doctest: +SKIP
    ('Ascend310P3', '2.0')
    """
    kind = detect_kind(path)
    planning = [opt for opt, v in (("--precision-mode", precision_mode), ("--input-shape", input_shapes),
                                   ("--dynamic-batch", dynamic_batch)) if v]
    if planning and soc is None:  # they only shape the --soc plan: never ignore them silently
        raise InputError(f"{', '.join(planning)} {'applies' if len(planning) == 1 else 'apply'} only with --soc "
                         f"(shaping the planned layouts)",
                         hint="add --soc SOC, e.g. --soc Ascend310P3, or drop them")
    if soc is not None and kind != "onnx":
        raise InputError(f"--soc applies to ONNX models; {path} is {'an' if kind == 'om' else 'a'} {kind} "
                         "(its SoC is recorded in the file)", hint="drop --soc")
    if kind == "om":
        return _inspect_om(Path(path), ops=ops, layers=layers)
    if kind == "dump":
        return _inspect_dump(Path(path))
    if kind == "bundle":
        return _inspect_bundle(Path(path), ops=ops, layers=layers, verify=verify)
    return _inspect_onnx(Path(path), soc=soc, ops=ops, layers=layers, input_shapes=input_shapes,
                         dynamic_batch=dynamic_batch, precision_mode=precision_mode)


# -----------------------------------------------------------------------------------------------------
# ONNX

def _onnx_dtype(elem: int) -> str:
    import onnx
    try:
        from onnx import helper
        return str(helper.tensor_dtype_to_np_dtype(elem))
    except Exception:  # UNDEFINED, STRING and future types have no numpy dtype
        try:
            return onnx.TensorProto.DataType.Name(elem).lower()
        except ValueError:
            return f"onnx_dtype:{elem}"


def _itemsize(elem: int) -> int:
    """Bytes per element (sub-byte types count as one byte: an upper bound)."""
    from onnx import helper
    try:
        return helper.tensor_dtype_to_np_dtype(elem).itemsize
    except Exception:
        return 0


def _value_info(vi) -> dict:
    t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if t is None:
        kind = vi.type.WhichOneof("value") or "unknown"
        return {"name": vi.name, "dtype": kind, "shape": None, "dim_names": None, "format": "ND"}
    shape: list[int] | None = None
    names: list[str | None] | None = None
    if t.HasField("shape"):
        shape, names = [], []
        for d in t.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                shape.append(int(d.dim_value))
                names.append(None)
            else:
                shape.append(-1)
                names.append(d.dim_param or None)
    # ATC's default --input_format for ONNX: NCHW (NCDHW for 5-D), ND otherwise
    fmt = {4: "NCHW", 5: "NCDHW"}.get(len(shape) if shape is not None else -1, "ND")
    return {"name": vi.name, "dtype": _onnx_dtype(t.elem_type), "shape": shape, "dim_names": names,
            "format": fmt}


def _tensor_bytes(t) -> int:
    n = 1
    for d in t.dims:
        n *= max(int(d), 0)
    import onnx
    if t.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    return n * _itemsize(t.data_type)


def _external_data(model, base: Path, problems: list[str]) -> list[dict]:
    import onnx
    files: dict[str, dict] = {}
    tensors = list(model.graph.initializer)
    tensors += [a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    for t in tensors:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {_text_only(e.key): _text_only(e.value) for e in t.external_data}
        loc = info.get("location", "")
        entry = files.setdefault(loc, {"file": loc, "tensors": 0, "bytes": 0, "exists": False, "_end": 0})
        entry["tensors"] += 1
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else _tensor_bytes(t)
        except ValueError:
            problems.append(f"tensor {t.name!r}: external data offset/length are not integers")
            continue
        entry["bytes"] += length
        entry["_end"] = max(entry["_end"], offset + length)
    base_resolved = base.resolve()
    out = []
    for loc, entry in files.items():
        end = entry.pop("_end")
        out.append(entry)
        try:
            target = (base / loc).resolve() if loc else None
            if target is None or Path(loc).is_absolute() or base_resolved not in (target, *target.parents):
                problems.append(f"external data file {loc!r} lies outside the model's folder")
            elif not target.is_file():
                problems.append(f"external data file {loc!r} is missing (looked in {base})")
            else:
                entry["exists"] = True
                size = target.stat().st_size
                if size < end:
                    problems.append(f"external data file {loc!r} is {size} bytes, tensors need {end}")
        except (OSError, ValueError) as e:  # e.g. a NUL byte in the name, a name too long
            problems.append(f"external data file {loc!r} cannot be checked ({e})")
    return out


def _inspect_onnx(path: Path, *, soc: str | None, ops: bool, layers: bool,
                  input_shapes: Mapping[str, Sequence[int]] | None, dynamic_batch: Sequence[int] | None,
                  precision_mode: str | None) -> InspectReport:
    import onnx
    from google.protobuf.message import DecodeError

    try:
        # the bytes read here, bounded by the file's size (a non-UTF-8 file name defeats onnx's own open)
        with open(path, "rb") as f:
            model = onnx.load_model_from_string(f.read(path.stat().st_size))
    except (DecodeError, ValueError, RuntimeError, UnicodeDecodeError) as e:
        raise ModelError(f"{path}: not an ONNX model, offline bundle or .om ({type(e).__name__})",
                         hint="inspect reads .onnx models, npu-deploy bundles and ATC .om files") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise ModelError(f"{path}: not an ONNX model, offline bundle or .om (no ONNX graph in it)",
                         hint="inspect reads .onnx models, npu-deploy bundles and ATC .om files")
    g = model.graph
    problems: list[str] = []
    notes: list[str] = []
    try:  # what convert would refuse at load (onnx.checker passes it)
        check_initializer_sizes(g, path)
    except ModelError as e:
        problems.append(e.message)
    init_names = {t.name for t in g.initializer}
    inputs = [_value_info(vi) for vi in g.input if vi.name not in init_names]
    outputs = [_value_info(vi) for vi in g.output]
    hist = Counter(n.op_type for n in g.node)

    def sub_nodes(graph) -> int:
        total = 0
        for n in graph.node:
            for a in n.attribute:
                for sg in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    total += len(sg.node) + sub_nodes(sg)
        return total

    nested = sub_nodes(g)
    if nested:
        notes.append(f"{nested} more nodes inside subgraphs (If/Loop/Scan bodies) are not in the op histogram")
    info: dict[str, Any] = {
        "producer_name": model.producer_name, "producer_version": model.producer_version,
        "ir_version": model.ir_version,
        "opsets": {o.domain: o.version for o in model.opset_import},
        "graph_name": g.name, "node_count": len(g.node), "subgraph_node_count": nested,
        "initializer_count": len(g.initializer),
        "initializer_bytes": sum(_tensor_bytes(t) for t in g.initializer),
        "constant_node_bytes": sum(_tensor_bytes(a.t) for n in g.node if n.op_type == "Constant"
                                   for a in n.attribute if a.type == onnx.AttributeProto.TENSOR),
        "external_data": _external_data(model, path.parent, problems),
    }
    if ops:
        info["nodes"] = [{"name": n.name, "op_type": n.op_type, "domain": n.domain} for n in g.node]
    layout_ops: list[dict] = []
    if layers and soc is None:
        notes.append("an ONNX model has no device layouts of its own: add --soc SOC to see the planned ones")
    if soc is not None:
        if problems:
            raise ModelError(f"{path}: {problems[0]}", hint="fix the external data before planning")
        info["soc"], layout_ops = _onnx_on_soc(path, info, soc=soc, ops=ops, layers=layers,
                                              input_shapes=input_shapes, dynamic_batch=dynamic_batch,
                                              precision_mode=precision_mode, notes=notes)
    return InspectReport(path=str(path), kind="onnx", file_size=path.stat().st_size, inputs=_text_only(inputs),
                         outputs=_text_only(outputs), op_count=len(g.node),
                         op_types=_text_only(dict(hist.most_common())), layout_ops=_text_only(layout_ops),
                         problems=_text_only(problems), notes=notes, onnx=_text_only(info))


def _text_only(v: Any) -> Any:
    """Strings from a protobuf may come back as bytes when they are not valid UTF-8: make them text."""
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, dict):
        return {_text_only(k): _text_only(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_text_only(x) for x in v]
    return v


def _onnx_on_soc(path: Path, info: dict, *, soc: str, ops: bool, layers: bool,
                 input_shapes, dynamic_batch, precision_mode, notes: list[str]) -> tuple[dict, list[dict]]:

    loaded = load_model(path, input_shapes=input_shapes, dynamic_batch=dynamic_batch)
    report = check_support(loaded, soc, precision_mode=precision_mode)
    out: dict[str, Any] = {"soc": soc, "precision_mode": precision_mode, "support": report.counts(),
                           "unsupported": [{"name": n.name, "op_type": n.op_type, "detail": n.detail}
                                           for n in report.unsupported()]}
    if ops:
        # the loader names unnamed nodes (<op_type>_<index>); nodes keep their order, so match by index
        by_name = {n.name: n for n in report.nodes}
        loaded_nodes = list(loaded.model.graph.node)
        for k, node in enumerate(info.get("nodes", [])):
            if k < len(loaded_nodes) and loaded_nodes[k].op_type == node["op_type"]:
                node["planned_name"] = loaded_nodes[k].name
            s = by_name.get(node.get("planned_name", node["name"]))
            if s is not None:
                node.update(engine=s.engine, cann_op=s.cann_op, folded=s.folded)

    return _with_plan(planner, loaded, report, out, soc=soc, layers=layers, precision_mode=precision_mode)


def _with_plan(planner, loaded, report, out: dict, *, soc: str, layers: bool,
               precision_mode: str | None) -> tuple[dict, list[dict]]:
    plan = planner.plan(loaded, soc=soc, precision_mode=precision_mode, support=report)
    out["planner"] = "built-in"
    out["precision_mode"] = plan.precision_mode
    layout_ops = [dict(t.to_manifest(), type="TransData") for t in plan.transdata]
    out["transdata_count"] = len(plan.transdata)
    out["transdata_naive_count"] = len(plan.transdata_naive)
    cost = plan.cost
    if cost is not None:
        out["formattrans_share"] = float(cost.formattrans_share)
        out["estimated_total_us"] = float(cost.total_us)
    if layers:
        out["node_formats"] = {name: nf.to_manifest() for name, nf in plan.node_formats.items()}
    return out, layout_ops


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def _transdata_entry(t: Any) -> dict:
    d = _plain(t) if not isinstance(t, Mapping) else dict(t)
    if not isinstance(d, dict):
        return {"name": str(d), "type": "TransData"}
    d.setdefault("type", "TransData")
    return d


# -----------------------------------------------------------------------------------------------------
# offline bundle

def _get(d: Any, key: str, kind: type | tuple, default: Any = None) -> Any:
    v = d.get(key) if isinstance(d, Mapping) else None
    if isinstance(v, bool) and kind in (int, float, (int, float)):
        return default
    return v if isinstance(v, kind) else default


def _bundle_tensor(t: Any) -> dict:
    if not isinstance(t, Mapping):
        return {"name": "?", "dtype": "?", "shape": None, "format": "?"}
    keys = ("name", "dtype", "shape", "format", "device_format", "device_shape", "c0", "nbytes")
    return {k: _plain(t.get(k)) for k in keys}


def _inspect_bundle(path: Path, *, ops: bool, layers: bool, verify: bool) -> InspectReport:
    problems: list[str] = []
    notes: list[str] = []
    checks: list[dict] = []
    # the manifest and self-containment checks run below, so that their failures are reported (exit 1)
    # rather than raised; a damaged file (header, sections, checksums) still raises (exit 2)
    try:
        b = read_bundle(path, verify=verify, check=False)
        checks.append({"check": "header, sections and checksums" + (" (weights too)" if verify else ""),
                       "ok": True, "detail": ""})
    except BundleError as e:
        if not verify or "weight blob checksum" not in str(e):
            raise
        b = read_bundle(path, verify=False, check=False)
        problems.append(str(e))
        checks.append({"check": "weight blob checksum", "ok": False, "detail": str(e)})
    if not verify:
        notes.append("weight blob checksum not verified (verify=False)")
    with b:
        m = b.manifest
        graph = b.graph
        weights = list(b.weights.values())
    g = graph.graph
    inputs = [_bundle_tensor(t) for t in _get(m, "inputs", list, [])]
    aipp = _get(m, "aipp", Mapping, {})
    for t in inputs:  # an AIPP input is the raw image: NHWC on the host, the AIPP input format on the device
        if aipp and t.get("name") == aipp.get("input"):
            t["format"] = _plain(aipp.get("raw_layout")) or "NHWC"
            t["device_format"] = _plain(_get(aipp, "fields", Mapping, {}).get("input_format")) or t["device_format"]
    outputs = [_bundle_tensor(t) for t in _get(m, "outputs", list, [])]
    hist = Counter(n.op_type for n in g.node)

    def check(name: str, ok: bool, detail: str = "") -> None:
        checks.append({"check": name, "ok": bool(ok), "detail": detail})
        if not ok:
            problems.append(f"{name}: {detail}" if detail else name)

    for name, run in (("self-contained (no external data, functions or foreign op domains)",
                       lambda: check_self_contained(graph)),
                      ("manifest fields have the types and ranges the runtime reads",
                       lambda: validate_manifest(m)),
                      ("graph and manifest agree (element types, producers, dtypes, sizes)",
                       lambda: check_graph(graph, m))):
        try:
            run()
            check(name, True)
        except BundleError as e:
            check(name, False, e.message)

    init = {t.name for t in g.initializer}
    g_in = [vi.name for vi in g.input if vi.name not in init]
    g_out = [vi.name for vi in g.output]
    wnames = {w.name for w in weights}
    m_in = [t["name"] for t in inputs]
    check("manifest inputs match the graph inputs", m_in == [n for n in g_in if n not in wnames],
          f"manifest {m_in}, graph {[n for n in g_in if n not in wnames]}")
    check("manifest outputs match the graph outputs", [t["name"] for t in outputs] == g_out,
          f"manifest {[t['name'] for t in outputs]}, graph {g_out}")
    def concrete(t: Mapping) -> bool:
        # a scalar's device shape is [] (one element); a tensor with a 0 dimension holds 0 bytes
        shape = t.get("device_shape")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            return False
        n = t.get("nbytes")
        return isinstance(n, int) and (n > 0 if all(d > 0 for d in shape) else n == 0)

    bad_io = [t["name"] for t in inputs + outputs if not concrete(t)]
    check("every input/output has a concrete device shape and a positive byte size", not bad_io,
          f"not so for {bad_io[:5]}")
    def node_inputs(graph) -> set[str]:  # subgraph bodies (If/Loop/Scan) read outer weights too
        names = set()
        for n in graph.node:
            names.update(n.input)
            for a in n.attribute:
                for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    names |= node_inputs(sg)
        return names

    used = node_inputs(g) | set(g_in) | set(g_out) | init
    unused = sorted(wnames - used)
    check("every stored weight is used by the graph", not unused, f"unused: {unused[:5]}")
    mem = _get(m, "memory", Mapping, {})
    if mem:
        arena, lower, none_ = (_get(mem, k, int) for k in ("arena_bytes", "lower_bound_bytes", "no_reuse_bytes"))
        align = _get(mem, "alignment", int)
        ok = (align == 256 and arena is not None and arena % 256 == 0
              and (lower is None or lower <= arena) and (none_ is None or arena <= none_))
        check("memory plan is 256-byte aligned and within its bounds", ok,
              f"alignment {align}, arena {arena}, lower bound {lower}, no-reuse {none_}")
    transdata = [_transdata_entry(t) for t in _get(m, "transdata", list, [])]
    naive = _get(m, "transdata_naive_count", int)
    if naive is not None:
        check("optimised TransData count <= naive count", len(transdata) <= naive,
              f"{len(transdata)} planned, {naive} naive")
    cost = _get(m, "cost", Mapping, {})
    share = _get(cost, "formattrans_share", (int, float))
    dyn = _get(m, "dynamic", Mapping, {})
    info: dict[str, Any] = {
        "soc": _get(m, "soc", str), "precision_mode": _get(m, "precision_mode", str),
        "producer": _get(m, "producer", str), "producer_version": _get(m, "producer_version", str),
        "source_model": _plain(m.get("source_model")),
        "dynamic": {"mode": _get(dyn, "mode", str), "gears": _plain(_get(dyn, "gears", list, [])),
                    **({"ranges": _plain(dyn["ranges"])} if isinstance(dyn.get("ranges"), Mapping) else {})},
        "memory": _plain(mem),
        "transdata_naive_count": naive,
        "formattrans_share": float(share) if share is not None and math.isfinite(share) else None,
        "weights": {"count": len(weights), "bytes": sum(w.nbytes for w in weights)},
        "graph": {"nodes": len(g.node), "constant_folded": _folded_count(g, m),
                  "opset": next((o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")), None)},
        "integrity": checks,
    }
    if layers or ops:
        info["node_formats"] = _plain(_get(m, "node_formats", Mapping, {}))
    return InspectReport(path=str(path), kind="bundle", file_size=path.stat().st_size, inputs=inputs,
                         outputs=outputs, op_count=len(g.node), op_types=dict(hist.most_common()),
                         layout_ops=transdata, problems=problems, notes=notes, onnx=None, bundle=info)


# -----------------------------------------------------------------------------------------------------
# .om

def _scalar_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, list) and len(v) <= 64 and all(isinstance(x, (str, int, float, bool)) for x in v):
            out[k] = v
    return out


def _inspect_om(path: Path, *, ops: bool, layers: bool) -> InspectReport:
    om = read_om(path, keep_ops=ops or layers)
    info: dict[str, Any] = {
        "variant": om.variant,
        "header": dataclasses.asdict(om.header) if om.header else None,
        "partitions": [dataclasses.asdict(p) for p in om.partitions],
        "submodels": len(om.models),
    }
    m = om.main
    inputs: list[dict] = []
    outputs: list[dict] = []
    layout_ops: list[dict] = []
    op_types: dict[str, int] = {}
    if m is not None:
        info["model"] = {"name": m.name, "version": m.version, "graphs": m.graphs,
                         "attrs": _scalar_attrs(m.attrs)}
        info["soc_version"] = om.soc_version
        atc = m.attrs.get("atc_version")
        info["atc_version"] = atc if isinstance(atc, str) else None
        info["atc_cmdline"] = m.attrs.get("atc_cmdline") if isinstance(m.attrs.get("atc_cmdline"), str) else None
        mode = m.dynamic_mode
        if mode is None and om.header and (om.header.is_unknown_model or om.header.model_num > 1):
            mode = "shape"
        info["dynamic"] = {"mode": mode, "gears": m.gears}
        # shape-range inputs: per dim [low, high] (high -1: unbounded), or the size of a fixed dim, as for
        # bundles; from each Data op's descriptor attribute ``shape_range`` (om.SHAPE_RANGE_ATTR)
        ranges = {t.name: [d if lo == hi else [lo, hi] for d, (lo, hi) in zip(t.shape, t.shape_range)]
                  for t in m.inputs if t.shape_range}
        if ranges:
            info["dynamic"]["ranges"] = ranges
        info["engines"] = m.engines
        inputs = [dataclasses.asdict(t) for t in m.inputs]
        outputs = [dataclasses.asdict(t) for t in m.outputs]
        op_types = m.op_types
        for o in m.layout_ops:
            e = dataclasses.asdict(o)
            e["src_format"] = o.attrs.get("src_format") or (o.input_formats[0] if o.input_formats else None)
            e["dst_format"] = o.attrs.get("dst_format") or (o.output_formats[0] if o.output_formats else None)
            e["shape"] = o.input_shapes[0] if o.input_shapes else None
            layout_ops.append(e)
        if m.ops is not None:
            info["ops"] = [dataclasses.asdict(o) for o in m.ops]
    else:
        info["soc_version"] = None
        info["atc_version"] = None
    return InspectReport(path=str(path), kind="om", file_size=om.file_size, inputs=inputs, outputs=outputs,
                         op_count=sum(op_types.values()), op_types=op_types, layout_ops=layout_ops,
                         problems=[], notes=list(om.notes), om=info)


_DTYPE_NAME: dict = {}  # numpy's dtype.name is slow, and a dump repeats one dtype over thousands of tensors


def _dump_tensor(name: str, t: dumpfile.DumpTensor, output: bool) -> dict:
    dname = _DTYPE_NAME.get(t.dtype) or _DTYPE_NAME.setdefault(t.dtype, t.dtype.name)
    e = {"name": name, "dtype": dname, "format": t.format, "shape": list(t.shape),
         "original_shape": list(t.original_shape), "sub_format": t.sub_format, "bytes": int(t.data.nbytes)}
    if output:
        e.update(original_name=t.original_name, original_index=t.original_index,
                 original_format=t.original_format)
    return e


def _inspect_dump(path: Path) -> InspectReport:
    d = dumpfile.read_dump(path)
    info = {"op_type": d.op_type, "op_name": d.op_name, "task_id": d.task_id, "stream_id": d.stream_id,
            "timestamp": d.timestamp, "version": d.version, "dump_time": d.dump_time}
    notes = []
    wide = [f"input:{i}" for i, t in enumerate(d.inputs) if t.dtype.name == "float32"]
    if wide and d.outputs and all(t.dtype.name == "float16" for t in d.outputs) and d.op_type != "Cast":
        # force_fp16 with no Cast before the op: the float32 -> float16 cast is this op's own first step
        notes.append(f"{', '.join(wide)} float32, outputs float16: {d.op_type or 'the op'} {d.op_name} casts its "
                     "input to float16 itself (no Cast op and no dtype change at the transfer before it)")
    return InspectReport(path=str(path), kind="dump", file_size=path.stat().st_size,
                         inputs=[_dump_tensor(f"input:{i}", t, False) for i, t in enumerate(d.inputs)],
                         outputs=[_dump_tensor(f"output:{i}", t, True) for i, t in enumerate(d.outputs)],
                         op_count=1, op_types={d.op_type or "?": 1}, dump=info, notes=notes)


# -----------------------------------------------------------------------------------------------------
# text

def _shape_text(shape: Any, names: Any = None) -> str:
    if not isinstance(shape, (list, tuple)):
        return "?" if shape is None else str(shape)
    dims = []
    for i, d in enumerate(shape):
        if isinstance(d, int) and d >= 0:
            dims.append(str(d))
        else:
            n = names[i] if isinstance(names, list) and i < len(names) else None
            dims.append(n or "-1")
    return "[" + ",".join(dims) + "]"


def _share_text(share: Any) -> str | None:
    if not isinstance(share, (int, float)):
        return None
    flag = (f" (above the {FORMATTRANS_THRESHOLD_PCT:g} % threshold: see which TransData below)"
            if 100 * share > FORMATTRANS_THRESHOLD_PCT else "")
    return f"{100 * share:.1f} % of estimated device time{flag}"


def _seq_text(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "-"
    return "-" if v is None else str(v)


def _bytes_text(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else ("?" if v is None else str(v))


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = ["  " + "  ".join(str(h).ljust(w) for h, w in zip(header, widths)).rstrip()]
    out += ["  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return out


def _kv(pairs: list[tuple[str, Any]]) -> list[str]:
    pairs = [(k, v) for k, v in pairs if v not in (None, "", [], {})]
    if not pairs:
        return []
    w = max(len(k) for k, _ in pairs)
    return [f"  {k.ljust(w)}  {v}" for k, v in pairs]


def _resource_text(attrs: Mapping[str, Any]) -> str | None:
    """``atc --mode=6``'s resource line, from the ModelDef attributes that are recorded."""
    parts = [f"{label} {attrs[k]:,}{unit}" for k, label, unit in
             (("memory_size", "memory", " B"), ("weight_size", "weight", " B"), ("stream_num", "streams", ""),
              ("event_num", "events", "")) if isinstance(attrs.get(k), int)]
    return ", ".join(parts) or None


def _om_info_text(v: Any) -> str | None:
    """``om_info_list``: weight, TBE kernel, custom AI CPU kernel, task info and so store sizes."""
    if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
        return None
    labels = ("weight", "tbe kernels", "cust aicpu kernels", "task info", "so store")
    return ", ".join(f"{label} {x:,} B" for label, x in zip(labels, v))


def _dynamic_text(dyn: Mapping[str, Any]) -> str:
    mode, gears = dyn.get("mode"), dyn.get("gears") or []
    if not mode:
        return "static"
    parts = []
    for g in gears:
        if isinstance(g, Mapping):  # bundle gears: input name -> shape
            parts.append(" ".join(f"{k}:{_shape_text(v)}" for k, v in g.items()))
        elif isinstance(g, list):
            parts.append(("x" if mode == "hw" else ",").join(str(x) for x in g))
        else:
            parts.append(str(g))
    ranges = dyn.get("ranges") if isinstance(dyn.get("ranges"), Mapping) else {}
    for name, rng in ranges.items():  # shape ranges: input -> per-dim [low, high] or its size
        if isinstance(rng, list):
            parts.append(f"{name}:" + ",".join(f"{r[0]}~{r[1]}" if isinstance(r, list) and len(r) == 2 else str(r)
                                               for r in rng))
    if ranges:
        return f"{mode}: " + "; ".join(parts)
    return f"{mode}" + (f", {len(parts)} gears: " + "; ".join(parts) if parts else "")


def render_text(r: InspectReport, *, ops: bool = False, layers: bool = False, top: int = 15) -> str:
    """The readable summary ``npu-deploy inspect`` prints (aligned key/values and tables; verdict last)."""
    lines = [f"{r.path}: {r.kind}, {r.file_size:,} bytes"]
    lines += _header_lines(r)
    lines += _io_lines(r)
    if r.op_types and r.kind != "dump":
        shown = list(r.op_types.items()) if ops else list(r.op_types.items())[:top]
        lines.append(f"op types ({r.op_count} {'ops' if r.kind == 'om' else 'nodes'}, {len(r.op_types)} types):")
        lines += _table([[k, str(v)] for k, v in shown], ["type", "count"])
        if len(shown) < len(r.op_types):
            lines.append(f"  ... {len(r.op_types) - len(shown)} more (--ops lists all)")
    if r.kind == "om" and r.om and r.om.get("engines"):
        lines.append("engines:")
        lines += _table([[k, str(v)] for k, v in r.om["engines"].items()], ["engine", "ops"])
    soc = (r.onnx or {}).get("soc")
    if soc:
        s = soc["support"]
        lines.append(f"on {soc['soc']}:")
        lines += _kv([("AI Core", s.get("AI Core")), ("AI CPU", s.get("AI CPU")),
                      ("unsupported", s.get("unsupported")), ("planner", soc.get("planner")),
                      ("TransData", soc.get("transdata_count")),
                      ("TransData naive", soc.get("transdata_naive_count")),
                      ("FormatTrans est.", _share_text(soc.get("formattrans_share")))])
        for u in soc["unsupported"][:20]:
            lines.append(f"  unsupported  {u['name']} ({u['op_type']}): {u['detail']}")
    if r.layout_ops:
        lines.append("layout changes:")
        rows = []
        for o in r.layout_ops:
            src = o.get("src_format") or _seq_text(o.get("input_formats"))
            dst = o.get("dst_format") or _seq_text(o.get("output_formats"))
            rows.append([str(o.get("name")), str(o.get("type")), f"{src} -> {dst}", _shape_text(o.get("shape"))])
        lines += _table(rows, ["name", "type", "formats", "shape"])
    if ops:
        nodes = (r.onnx or {}).get("nodes") or (r.om or {}).get("ops")
        if nodes:
            lines.append("ops:")
            lines += _table([[str(n.get("planned_name") or n.get("name") or "(unnamed)"),
                              str(n.get("op_type") or n.get("type")), str(n.get("engine") or ""),
                              str(n.get("cann_op") or "")] for n in nodes], ["name", "type", "engine", "CANN op"])
    if layers:
        if r.kind == "om" and (r.om or {}).get("ops"):
            lines.append("op formats:")
            lines += _table([[o["name"], o["type"], ",".join(o["input_formats"]) or "-",
                              ",".join(o["output_formats"]) or "-"] for o in r.om["ops"]],
                            ["name", "type", "inputs", "outputs"])
        nf = (r.bundle or {}).get("node_formats") or ((r.onnx or {}).get("soc") or {}).get("node_formats")
        if nf:
            lines.append("node formats:")
            lines += _table([[k, str(v.get("op_type", "")), _seq_text(v.get("input_formats")),
                              _seq_text(v.get("output_formats"))] if isinstance(v, dict) else [k, "?", "-", "-"]
                             for k, v in nf.items()], ["node", "type", "inputs", "outputs"])
    if r.bundle:
        lines.append("integrity:")
        lines += [f"  {'ok  ' if c['ok'] else 'FAIL'}  {c['check']}" + (f" ({c['detail']})" if not c["ok"] else "")
                  for c in r.bundle["integrity"]]
    for p in r.problems:
        lines.append(f"problem: {p}")
    for n in r.notes:
        lines.append(f"note: {n}")
    lines.append(r.verdict())
    return "\n".join(printable(line) for line in lines)


def _header_lines(r: InspectReport) -> list[str]:
    """The key/value block of one kind of file (ONNX, bundle, dump, .om)."""
    lines: list[str] = []
    if r.kind == "onnx" and r.onnx:
        d = r.onnx
        lines += _kv([("producer", f"{d['producer_name']} {d['producer_version']}".strip()),
                      ("ir version", d["ir_version"]),
                      ("opsets", ", ".join(f"{k or 'ai.onnx'}={v}" for k, v in d["opsets"].items())),
                      ("nodes", d["node_count"]),
                      ("initializers", f"{d['initializer_count']} ({d['initializer_bytes']:,} bytes)"),
                      ("Constant nodes", f"{d['constant_node_bytes']:,} bytes" if d["constant_node_bytes"] else None)])
        for e in d["external_data"]:
            lines.append(f"  external data  {e['file']}: {e['tensors']} tensors, {e['bytes']:,} bytes, "
                         f"{'present' if e['exists'] else 'MISSING'}")
    elif r.kind == "bundle" and r.bundle:
        b = r.bundle
        lines += _kv([("soc", b["soc"]), ("precision mode", b["precision_mode"]),
                      ("producer", f"{b['producer'] or ''} {b['producer_version'] or ''}".strip()),
                      ("source model", b["source_model"] if isinstance(b["source_model"], str) else None),
                      ("dynamic", _dynamic_text(b["dynamic"])),
                      ("weights", f"{b['weights']['count']} tensors, {b['weights']['bytes']:,} bytes"),
                      ("memory", ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}"
                                           for k, v in (b["memory"] or {}).items())),
                      ("TransData naive", b["transdata_naive_count"]),
                      ("FormatTrans est.", _share_text(b["formattrans_share"]))])
    elif r.kind == "dump" and r.dump:
        d = r.dump
        lines += _kv([("op", f"{d['op_type'] or '?'} {d['op_name']}"), ("task", d["task_id"]),
                      ("stream", d["stream_id"]), ("timestamp", d["timestamp"]), ("version", d["version"]),
                      ("dump time", d["dump_time"])])
    elif r.kind == "om" and r.om:
        o = r.om
        h = o["header"]
        pairs: list[tuple[str, Any]] = []
        if h:
            pairs += ([("magic", h["magic"]), ("header version", f"{h['version_text']} (0x{h['version']:08X})"),
                          ("model type", h["model_type_name"]), ("model name", h["name"]),
                          ("platform", f"{h['platform_version']} type {h['platform_type']}"),
                          ("model length", f"{h['model_length']:,} (legacy length {h['length']:,})"),
                          ("encrypted", "yes" if h["is_encrypt"] else "no"),
                          ("checksum", f"{'UNCHECK' if h['is_checksum'] else 'CHECK'}, "
                                       f"{'zeros' if h['checksum_zero'] else 'set'}"),
                          ("model_num", h["model_num"]), ("unknown shape", h["is_unknown_model"])])
        if o.get("model"):
            attrs = o["model"]["attrs"]
            pairs += ([("soc version", o["soc_version"] or "(not recorded)"),
                          ("ATC version", o["atc_version"]), ("framework", attrs.get("framework_type")),
                          ("ATC command", o.get("atc_cmdline")),
                          ("dynamic", _dynamic_text(o["dynamic"])),
                          ("resource info", _resource_text(attrs)),
                          ("om info", _om_info_text(attrs.get("om_info_list")))])
        lines += _kv(pairs)
        if o["partitions"]:
            lines.append("partitions:")
            lines += _table([[str(p["model_index"]), p["type_name"], f"{p['offset']:,}", f"{p['size']:,}"]
                             for p in o["partitions"]], ["model", "type", "offset", "size"])
    return lines


def _io_lines(r: InspectReport) -> list[str]:
    """The inputs and outputs tables, with the columns the kind of file has."""
    lines: list[str] = []
    for title, ts in (("inputs", r.inputs), ("outputs", r.outputs)):
        if not ts:
            continue
        lines.append(f"{title}:")
        rows = []
        for t in ts:
            row = [t.get("name") or "?", str(t.get("dtype")), _shape_text(t.get("shape"), t.get("dim_names")),
                   str(t.get("format"))]
            if r.kind == "bundle":
                row += [str(t.get("device_format")), _shape_text(t.get("device_shape")), _bytes_text(t.get("nbytes"))]
            elif r.kind == "om":
                row += [_bytes_text(t.get("size"))]
            elif r.kind == "dump":
                orig = t.get("original_name")
                row += [_shape_text(t.get("original_shape")), _bytes_text(t.get("bytes")),
                        "" if orig is None else f"{orig}:{t.get('original_index')}"]
            rows.append(row)
        head = ["name", "dtype", "shape", "format"]
        head += ["device format", "device shape", "bytes"] if r.kind == "bundle" else \
            (["device bytes"] if r.kind == "om" else [])
        if r.kind == "dump":
            head = ["name", "dtype", "device shape", "format", "original shape", "bytes", "original tensor"]
        lines += _table(rows, head)
    return lines


def _folded_count(g, manifest: Mapping) -> int:
    """Nodes of the bundle graph the plan folded at compile time (as ``convert`` counts them)."""
    nf = manifest.get("node_formats")
    if not isinstance(nf, Mapping):
        return 0
    return sum(1 for n in g.node if isinstance(nf.get(n.name), Mapping) and nf[n.name].get("folded") is True)


__all__ = ["InspectReport", "inspect", "detect_kind", "render_text", "KINDS"]
