"""Op support per SoC: for every node, the CANN op ATC maps it to and the engine that runs it.

This mirrors how ATC's ONNX parser resolves a node (``shared/reference/onnx-op-support.md`` §1): the key
``<domain>::<model opset for that domain>::<op_type>`` must be registered by a parser plugin; ``Constant``
(and ``Input``/``FileConstant``) bypass the registry. The registered plugin names a CANN op, or a
``PartitionedCall`` subgraph of CANN ops. The engine then follows the 2022 op-info dtype lists of the main
input (§5): a dtype the AI Core kernel accepts → AI Core; one only the AI CPU kernel library accepts →
AI CPU (int64 / float64 typically). Ops whose AI Core formats are chosen at compile time ("dynamic") run
on AI Core unless the dtype is one AI Core never takes (int64, float64, complex…, per the CANN docs).
A few plugins reject attribute values outright; those rules are listed in ``PLUGIN_RULES``.

Data: ``converters/lowering/data/onnx_cann.json``, derived from ``shared/data/onnx-cann/*.json`` (the derivation
is re-run and compared in ``tests/converters/lowering/test_support.py``).

>>> import onnx
>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm"),
...                        helper.make_node("Loop", ["n", "c"], ["z"], name="loop")], "g",
...     [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in "ab"],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
>>> r = check_graph(g, {"": 17}, "Ascend310P3", dtypes={"a": "float32"})
>>> r.node("mm").cann_op, r.node("mm").engine, r.node("loop").engine
('BatchMatMulV2', 'AI Core', 'unsupported')
>>> bool(r)
False
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import onnx
from onnx import helper

from npu_deploy._result import Result
from npu_deploy.converters.lowering import ops
from npu_deploy.errors import InputError, ModelError

AI_CORE = "AI Core"
AI_CPU = "AI CPU"
UNSUPPORTED = "unsupported"

# GE handles these itself (onnx_parser.cc kOnnxOpMap): no plugin, no kernel.
BUILTIN = {"Constant": "Const", "Input": "Data", "FileConstant": "FileConstant"}

# numpy dtype name -> the op-info spelling
_OPINFO_DTYPE = {"float32": "float", "float64": "double", "float16": "float16", "bfloat16": "bfloat16",
                 "int8": "int8", "uint8": "uint8", "int16": "int16", "uint16": "uint16", "int32": "int32",
                 "uint32": "uint32", "int64": "int64", "uint64": "uint64", "bool": "bool",
                 "complex64": "complex64", "complex128": "complex128"}
# Dtypes AI Core kernels take when their op-info is "dynamic" (int64/double are AI-CPU-only per the
# CANN migration guide: "AI CORE operators do not support int64").
_DYNAMIC_AICORE = {"float", "float16", "bfloat16", "int32", "int8", "uint8", "bool", "int16"}

# PartitionedCall subgraphs: the op that does the work, the helpers around it, and the CANN ops a GE
# fusion pass moves to AI Core: facts of the op table (``ops.py``)
_HELPER_SUBOPS = ops.SUBGRAPH_HELPER_OPS
_PRIMARY = ops.PARSER_PRIMARY
FUSION_TO_AICORE = ops.FUSION_TO_AICORE

# the op table's SoC family -> the op-info family in the data (only ascend310p and ascend910 were published)
_OPINFO_FAMILY = {"Ascend310": "ascend310p", "Ascend310P": "ascend310p", "Ascend310B": "ascend310p",
                  "Ascend910": "ascend910", "Ascend910B": "ascend910", "Ascend910_93": "ascend910"}
# SoCs newer than the op table's list, checked against the newest data
_NEWER_SOCS = (("Ascend950", "ascend910"), ("Ascend960", "ascend910"))


@dataclasses.dataclass(frozen=True)
class PluginRule:
    """An attribute value the ATC parser plugin refuses (parse fails with the plugin's error)."""

    op_type: str
    why: str
    check: Callable[[onnx.NodeProto], bool]  # True when the node is acceptable


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


PLUGIN_RULES: tuple[PluginRule, ...] = (
    PluginRule("ArgMax", "select_last_index=1 is refused by the plugin",
               lambda n: _attr(n, "select_last_index", 0) == 0),
    PluginRule("ArgMin", "select_last_index=1 is refused by the plugin",
               lambda n: _attr(n, "select_last_index", 0) == 0),
    PluginRule("GatherND", "batch_dims must be 0", lambda n: _attr(n, "batch_dims", 0) == 0),
    PluginRule("MaxPool", "storage_order=1 and the Indices output are refused",
               lambda n: _attr(n, "storage_order", 0) == 0 and len([o for o in n.output if o]) <= 1),
    PluginRule("IsInf", "detect_negative and detect_positive must both be 1",
               lambda n: _attr(n, "detect_negative", 1) == 1 and _attr(n, "detect_positive", 1) == 1),
    PluginRule("Selu", "alpha and gamma must be the ONNX defaults",
               lambda n: abs(_attr(n, "alpha", 1.67326319217681884765625) - 1.67326319217681884765625) < 1e-6
               and abs(_attr(n, "gamma", 1.05070102214813232421875) - 1.05070102214813232421875) < 1e-6),
    PluginRule("Cast", "the target type has no CANN mapping (only ONNX element types 1-16)",
               lambda n: 1 <= int(_attr(n, "to", 1)) <= 16),
    PluginRule("LRN", "size must be odd", lambda n: int(_attr(n, "size", 1)) % 2 == 1),
    PluginRule("Resize", "only nearest/linear/cubic modes", lambda n: _attr(n, "mode", b"nearest") in
               (b"nearest", b"linear", b"cubic", "nearest", "linear", "cubic")),
)


@functools.lru_cache(maxsize=1)
def _data() -> dict:
    text = resources.files("npu_deploy.converters.lowering").joinpath("data/onnx_cann.json").read_text("utf-8")
    return json.loads(text)


def supported_opset_range() -> tuple[int, int]:
    """The ai.onnx opsets for which ATC has standard-op parser registrations (from the data: 8–18).

    >>> supported_opset_range()
    (8, 18)
    """
    return _opset_range()


@functools.lru_cache(maxsize=1)
def _opset_range() -> tuple[int, int]:
    import onnx.defs

    standard = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}
    lo, hi = 10**6, 0
    for op, ranges in _data()["registrations"]["ai.onnx"].items():
        if op in standard:
            lo = min(lo, ranges[0][0]) if ranges[0][0] >= 8 else lo
            hi = max(hi, ranges[-1][1])
    return lo, hi


def soc_family(soc: str) -> str:
    """The op-info family used for ``soc`` (``"ascend310p"`` or ``"ascend910"``)."""
    family = ops.soc_family(soc)
    if family is not None:
        return _OPINFO_FAMILY[family]
    for prefix, data_family in _NEWER_SOCS:
        if soc.startswith(prefix):
            return data_family
    raise InputError(f"unknown SoC {soc!r}",
                     hint="use the --soc_version value ATC takes, e.g. Ascend310P3, Ascend910B1, Ascend310B1")


@dataclasses.dataclass
class NodeSupport:
    """How one node maps: ``cann_op`` ("" when unsupported), ``engine`` AI Core / AI CPU / unsupported."""

    name: str
    op_type: str
    domain: str
    key: str
    cann_op: str
    engine: str
    dtype: str | None
    detail: str = ""
    folded: bool = False  # every input is a compile-time constant: GE folds the node, no kernel runs


@dataclasses.dataclass
class SupportReport(Result):
    """Op support of a model on one SoC. ``bool()`` is True when every node is supported.

    >>> SupportReport(soc="Ascend310P3", opset=17, nodes=[]).verdict()
    'Ascend310P3, opset 17: 0 nodes: 0 AI Core, 0 AI CPU, 0 unsupported'
    """

    SCHEMA: ClassVar[str] = "npu-deploy/support-report"
    SCHEMA_VERSION: ClassVar[int] = 1

    soc: str
    opset: int
    nodes: list[NodeSupport]

    def __bool__(self) -> bool:
        return not self.unsupported()

    def node(self, name: str) -> NodeSupport:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def unsupported(self) -> list[NodeSupport]:
        return [n for n in self.nodes if n.engine == UNSUPPORTED]

    def counts(self) -> dict[str, int]:
        """Nodes per engine, not counting constants and nodes GE folds at compile time."""
        out = {AI_CORE: 0, AI_CPU: 0, UNSUPPORTED: 0}
        for n in self.nodes:
            if n.op_type not in BUILTIN and not (n.folded and n.engine != UNSUPPORTED):
                out[n.engine] = out.get(n.engine, 0) + 1
        return out

    def verdict(self) -> str:
        c = self.counts()
        folded = sum(1 for n in self.nodes if n.folded and n.engine != UNSUPPORTED)
        return (f"{self.soc}, opset {self.opset}: {sum(c.values())} nodes: {c[AI_CORE]} AI Core, "
                f"{c[AI_CPU]} AI CPU, {c[UNSUPPORTED]} unsupported"
                + (f" (and {folded} ops constant-folded, Constant nodes not counted)" if folded else ""))

    def raise_if_unsupported(self, model_name: str = "the model") -> None:
        """Raise one ``ModelError`` listing every unsupported node (name, op, reason)."""
        bad = self.unsupported()
        if not bad:
            return
        shown = "; ".join(f"{n.name} ({n.op_type}: {n.detail})" for n in bad[:20])
        more = f"; and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise ModelError(f"{model_name}: {len(bad)} node(s) ATC cannot convert for {self.soc}: {shown}{more}",
                         hint="replace these ops before export, or re-export at opset 11-17")

    @classmethod
    def from_dict(cls, d: dict) -> "SupportReport":
        return cls(soc=d["soc"], opset=d["opset"], nodes=[NodeSupport(**n) for n in d.get("nodes", [])])


def _lookup(domain: str, version: int, op_type: str) -> tuple[str, list[str]] | None:
    for lo, hi, cann, subops in _data()["registrations"].get(domain, {}).get(op_type, []):
        if lo <= version <= hi:
            return cann, subops
    return None


def _primary(op_type: str, cann: str, subops: list[str]) -> str:
    if cann != "PartitionedCall":
        return cann
    if op_type in _PRIMARY and _PRIMARY[op_type] in subops:
        return _PRIMARY[op_type]
    for s in subops:
        if s.lower() == op_type.lower() or s.lower().startswith(op_type.lower()):
            return s
    for s in subops:
        if s not in _HELPER_SUBOPS:
            return s
    return subops[0] if subops else cann


def _engine(family: str, cann: str, dtype: str | None, fp16: bool = False) -> tuple[str, str]:
    row = _data()["engines"].get(family, {}).get(cann)
    dt = _OPINFO_DTYPE.get(dtype or "", dtype)
    if row is not None and row["aicore"] is None and row["aicpu"] is None:
        row = None  # no op-info either way: the engine cannot be read from the data
    if row is None:
        if dt is not None and dt not in _DYNAMIC_AICORE:
            return AI_CPU, f"{dtype} is not an AI Core dtype"
        return AI_CORE, "no op-info published; engine assumed"
    core, cpu = row["aicore"], row["aicpu"]
    if isinstance(core, list):
        if dt is None or dt in core:
            return AI_CORE, ""
        if fp16 and dt == "float" and "float16" in core:
            return AI_CORE, "runs in float16 (no float32 AI Core kernel)"
        if cpu is None or dt in cpu:
            return AI_CPU, f"{dtype} not in the AI Core op-info ({'/'.join(core)})"
        return AI_CPU, f"{dtype} not in the AI Core op-info; AI CPU kernel assumed"
    if core == "dynamic":
        if dt is None or dt in _DYNAMIC_AICORE:
            return AI_CORE, ""
        return AI_CPU, f"{dtype} is not an AI Core dtype"
    return AI_CPU, "no AI Core op-info (AI CPU kernel only)"


def constant_tensors(graph: onnx.GraphProto, static_shapes: Mapping[str, tuple] | None = None) -> set[str]:
    """Tensors known at compile time: initializers, ``Constant`` outputs, ``Shape``/``Size`` of a tensor
    with a static shape, and outputs of deterministic nodes whose inputs are all such tensors."""
    const = {t.name for t in graph.initializer}
    static_shapes = static_shapes or {}
    for n in graph.node:
        ins = [i for i in n.input if i]
        if n.op_type == "Constant":
            ok = True
        elif n.op_type in ("Shape", "Size"):
            shape = static_shapes.get(ins[0]) if ins else None
            ok = shape is not None and all(d >= 0 for d in shape)
        elif n.op_type in ops.RANDOM_OPS or any(a.type == onnx.AttributeProto.GRAPH for a in n.attribute):
            ok = False
        else:
            ok = bool(ins) and all(i in const for i in ins)
        if ok:
            const.update(o for o in n.output if o)
    return const


def check_graph(graph: onnx.GraphProto, opsets: Mapping[str, int], soc: str, *,
                dtypes: Mapping[str, Any] | None = None,
                static_shapes: Mapping[str, tuple] | None = None,
                precision_mode: str | None = None) -> SupportReport:
    """Map every node of ``graph`` (and of ``If`` branches) for ``soc``. ``opsets``: domain → version
    (the model's ``opset_import``); ``dtypes``: tensor name → dtype, for the engine decision;
    ``static_shapes``: tensor name → shape, fixed dims only, to find shape computations GE folds;
    ``precision_mode``: unless ``must_keep_origin_dtype``, float32 ops with only a float16 AI Core
    kernel run on AI Core in float16 (ATC's precision modes allow that cast)."""
    fp16 = precision_mode != "must_keep_origin_dtype"
    family = soc_family(soc)
    dtypes = dtypes or {}
    const = constant_tensors(graph, static_shapes)
    imports = {("ai.onnx" if k in ("", "ai.onnx") else k): int(v) for k, v in opsets.items()}
    nodes: list[NodeSupport] = []

    def visit(g: onnx.GraphProto, prefix: str) -> None:
        for k, n in enumerate(g.node):
            name = prefix + (n.name or f"{n.op_type}_{k}")
            domain = "ai.onnx" if n.domain in ("", "ai.onnx") else n.domain
            in_dt = next((dtypes.get(i) for i in n.input if i and i in dtypes), None)
            if in_dt is None and n.output and n.output[0] in dtypes:
                in_dt = dtypes[n.output[0]]
            dt = np.dtype(in_dt).name if in_dt is not None else None
            if domain == "ai.onnx" and n.op_type in BUILTIN:
                nodes.append(NodeSupport(name, n.op_type, domain, n.op_type, BUILTIN[n.op_type], AI_CORE, dt,
                                         "handled by the graph engine (no kernel)"))
                continue
            if domain not in imports:
                nodes.append(NodeSupport(name, n.op_type, domain, f"{domain}::?::{n.op_type}", "", UNSUPPORTED,
                                         dt, f"domain {domain} is not in the model's opset_import (E19999)"))
                continue
            key = f"{domain}::{imports[domain]}::{n.op_type}"
            found = _lookup(domain, imports[domain], n.op_type)
            if found is None:
                nodes.append(NodeSupport(name, n.op_type, domain, key, "", UNSUPPORTED, dt,
                                         f"no ATC parser registered for {key} (E16002)"))
                continue
            cann, subops = found
            primary = _primary(n.op_type, cann, subops)
            rule = next((r for r in PLUGIN_RULES if r.op_type == n.op_type and domain == "ai.onnx"
                         and not r.check(n)), None)
            if rule is not None:
                nodes.append(NodeSupport(name, n.op_type, domain, key, primary, UNSUPPORTED, dt, rule.why))
                continue
            engine, detail = _engine(family, primary, dt, fp16)
            fusion = FUSION_TO_AICORE.get(primary)
            if engine == AI_CPU and fusion is not None and dt in (None, "float32", "float16", "int32", "bool"):
                need = [n.input[i] for i in fusion[1] if i < len(n.input) and n.input[i]]
                if all(i in const for i in need):
                    engine, detail = AI_CORE, f"rewritten to {fusion[0]} by a GE fusion pass"
            folded = n.op_type not in ("Identity",) and bool(n.input) and all(
                o in const for o in n.output if o) and not prefix
            if folded:
                detail = "constant-folded at compile time" + (f"; {detail}" if detail else "")
            if cann == "PartitionedCall":
                detail = (f"subgraph of {', '.join(subops)}" + (f"; {detail}" if detail else ""))
            nodes.append(NodeSupport(name, n.op_type, domain, key, primary, engine, dt, detail, folded))
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    visit(a.g, f"{name}/{a.name}/")

    visit(graph, "")
    version = imports.get("ai.onnx", 0)
    return SupportReport(soc=soc, opset=version, nodes=nodes)


def check_opset(opset: int, model_name: str = "the model") -> None:
    """Raise ``ModelError`` when the model's ai.onnx opset is outside the range ATC parses."""
    lo, hi = supported_opset_range()
    if not lo <= opset <= hi:
        raise ModelError(f"{model_name}: ai.onnx opset {opset} is outside the range ATC parses ({lo}-{hi})",
                         hint=f"re-export the model at an opset between {lo} and {hi} (11-17 is safest)")


def check_support(loaded, soc: str, *, precision_mode: str | None = None) -> SupportReport:
    """Op support for a :class:`~npu_deploy.converters.files.onnx_model.LoadedModel` on ``soc``.

    Raises ``ModelError`` for a model without an ai.onnx opset (e.g. ai.onnx.ml only) or with one
    outside the supported range; unsupported nodes are reported
    (``report.unsupported()``, ``report.raise_if_unsupported()``), not raised.
    """
    opsets = {o.domain: o.version for o in loaded.model.opset_import}
    if not loaded.opset:  # e.g. an ai.onnx.ml-only model: loadable, but ATC parses ai.onnx models only
        others = ", ".join(f"{d} {v}" for d, v in opsets.items()) or "none"
        raise ModelError(f"{loaded.path.name}: the model imports no ai.onnx opset (domains: {others}); "
                         f"ATC parses ai.onnx models only", hint="re-export the model with standard "
                         "ai.onnx ops (ai.onnx.ml ops have no NPU lowering)")
    check_opset(loaded.opset, loaded.path.name)
    static = {i.name: i.shape for i in loaded.inputs} if not loaded.gears else {}
    if not loaded.gears:
        static.update(loaded.shapes)
    return check_graph(loaded.model.graph, opsets, soc, dtypes=loaded.dtypes, static_shapes=static,
                       precision_mode=precision_mode)


@dataclasses.dataclass(frozen=True)
class OpRow:
    """One ONNX op's row of the op table on one SoC (:func:`op_row`).

    ``opsets``: the ai.onnx opset ranges ATC's parser registers, each with the CANN op (or
    ``PartitionedCall``) and its subgraph ops; ``cann_op``: the op doing the work (the name a real
    ``.om`` shows, :func:`ops.cann_op`); ``engines``: dtype -> (engine, why) on ``soc``; ``formats``:
    dtype -> the installed op info's input-0 formats (only with ``op_info``; None: not bounded there).
    """

    op_type: str
    soc: str
    opsets: tuple[tuple[int, int, str, tuple[str, ...]], ...]
    cann_op: str
    parser_op: str
    engines: Mapping[str, tuple[str, str]]
    cost_class: str
    fusion_class: str | None
    view: bool
    format_agnostic: bool
    cube: bool
    formats: Mapping[str, frozenset[str] | None] | None = None

    def lines(self) -> list[str]:
        """The row as text, one fact a line."""
        regs = "; ".join(f"{lo}-{hi}: {c}" + (f" ({', '.join(sub)})" if c == "PartitionedCall" else "") for lo, hi, c, sub in
                         self.opsets) or "none (no ATC parser registration)"
        out = [f"{self.op_type} on {self.soc}", f"  opsets: {regs}", f"  CANN op: {self.cann_op} (parser: "
               f"{self.parser_op})",
               "  engine: " + ", ".join(f"{d} {e}" + (f" ({w})" if w else "") for d, (e, w) in self.engines.items()),
               f"  cost class: {self.cost_class}; fusion class: {self.fusion_class or '-'}; view: {self.view}; "
               f"format-agnostic: {self.format_agnostic}; cube: {self.cube}"]
        if self.parser_op in FUSION_TO_AICORE:
            to, need = FUSION_TO_AICORE[self.parser_op]
            out.append(f"  GE fusion pass: {self.parser_op} -> {to} on AI Core"
                       + (f" when inputs {', '.join(map(str, need))} are constant" if need else ""))
        if self.formats is not None:
            out.append("  installed op info: " + ", ".join(
                f"{d} {'/'.join(sorted(f)) if f else 'not bounded'}" for d, f in self.formats.items()))
        return out


def op_row(op_type: str, soc: str = "Ascend310P3", *, opset: int = 17,
           dtypes: tuple[str, ...] = ("float16", "float32", "int32", "int64"), op_info=None,
           precision_mode: str | None = None) -> OpRow:
    """The op table's row for ``op_type`` on ``soc`` (see :class:`OpRow`): the opset registrations, the
    CANN op at ``opset``, the engine per dtype (the op-info data of :func:`check_graph`), the classes
    of ``ops.py`` and, with ``op_info`` (an ``opinfo.OpInfo``), the installed format columns.

    >>> r = op_row("TopK", "Ascend310P3")
    >>> r.opsets[-1][:3], r.engines["float32"][0], r.cost_class
    ((10, 18, 'TopK'), 'AI CPU', 'kernel')
    >>> op_row("Relu").fusion_class, op_row("MatMul", "Ascend910B3").cann_op
    ('unary', 'BatchMatMulV2')
    """
    family = soc_family(soc)
    regs = tuple((int(lo), int(hi), str(c), tuple(sub)) for lo, hi, c, sub in
                 _data()["registrations"].get("ai.onnx", {}).get(op_type, []))
    found = _lookup("ai.onnx", opset, op_type)
    primary = _primary(op_type, *found) if found else ops.cann_op(op_type)
    fp16 = precision_mode != "must_keep_origin_dtype"
    engines = {d: (_engine(family, primary, d, fp16) if found else (UNSUPPORTED, f"no parser at opset {opset}"))
               for d in dtypes}
    formats = None
    if op_info is not None:
        e = next((op_info.entry(n) for n in (ops.cann_op(op_type), primary, op_type) if op_info.entry(n)), None)
        formats = {d: (e.formats_for(0, d) if e is not None else None) for d in dtypes}
    return OpRow(op_type, soc, regs, ops.cann_op(op_type), primary, engines, ops.cost_class(op_type),
                 ops.fusion_class(op_type), op_type in ops.VIEW_OPS, op_type in ops.FORMAT_AGNOSTIC,
                 op_type in ops.CUBE_OPS, formats)
