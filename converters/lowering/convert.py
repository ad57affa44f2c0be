"""``convert``: ONNX model → Ascend offline model (ATC ``.om``, or the built-in offline bundle).

The pipeline, the same for the API and ``npu-deploy convert``:

1. **ONNX from path** — :func:`~npu_deploy.converters.files.onnx_model.load_model`: external data checked,
   tensor-only inputs/outputs, ``onnx.checker`` full check, input shapes / gears applied, shapes
   inferred (what loading worked around lands in the plan report's ``notes``).
2. **Op support** — :func:`~npu_deploy.converters.lowering.support.check_support`: an ai.onnx opset in ATC's
   range, and every unsupported node reported together, before any long compile starts.
3. **Backend** — ``"atc"`` runs ATC (``converters.lowering.atc``); ``"builtin"`` plans the lowering
   (``converters.lowering.planner``) and writes the bundle (``converters.files.bundle``), packing and writing the
   weights one at a time; ``"auto"`` is ATC when it is found, else built-in (the result says which
   and why).

``input_format``: the layout the host feeds 4-D (NCHW/NHWC) or 5-D (NCDHW/NDHWC) inputs in; ``ND`` for
all. ATC takes NCHW, NCDHW or ND for ONNX models, so NHWC/NDHWC is refused there (also under
``"auto"`` when ATC is found); the built-in backend implements it: the manifest's input ``format`` and
``shape`` are channels-last (what the user feeds), ``graph_format``/``graph_shape`` say what the
lowered graph reads, and the plan's first TransData converts on the device (NHWC→NC1HWC0 directly).

>>> import numpy as np, onnx, tempfile, os
>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])])
>>> d = tempfile.mkdtemp(); src = os.path.join(d, "m.onnx")
>>> onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
>>> r = convert(src, os.path.join(d, "m.bundle"), backend="builtin", input_shapes={"x": (2, 8)})
>>> r.backend, os.path.exists(r.output), bool(r)
('builtin', True, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import onnx
from onnx.external_data_helper import load_external_data_for_model

from npu_deploy import _io
from npu_deploy._result import Result
from npu_deploy.converters.lowering import pipeline, ranges
from npu_deploy.converters.lowering.options import ConvertOptions
from npu_deploy.errors import DependencyError
from npu_deploy.converters.lowering import aipp
from npu_deploy.converters.lowering import atc as atcmod
from npu_deploy.converters.lowering.planner import PlanReport
from npu_deploy.errors import InputError



@dataclasses.dataclass
class ConvertResult(Result):
    """What ``convert`` did. ``bool()``: converted and, for the built-in backend, the estimated
    FormatTrans share is within 8 %. ``plan`` is the :class:`~npu_deploy.converters.lowering.planner.PlanReport`
    as a dict (built-in backend), ``atc`` the ATC run summary (ATC backend)."""

    SCHEMA: ClassVar[str] = "npu-deploy/convert-result"
    SCHEMA_VERSION: ClassVar[int] = 1

    model: str
    output: str
    backend: str
    backend_reason: str
    soc: str
    precision_mode: str
    dynamic: dict
    support: dict
    plan: dict | None = None
    atc: dict | None = None
    seconds: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)  # options the chosen backend ignored

    def __bool__(self) -> bool:
        if self.plan is None:
            return True
        return bool(self.plan_report())

    def plan_report(self):
        """The built-in plan as a :class:`PlanReport` (None for the ATC backend)."""
        return None if self.plan is None else PlanReport.load(self.plan)

    def verdict(self) -> str:
        head = f"converted {Path(self.model).name} -> {self.output} ({self.backend}, {self.soc})"
        if self.plan is not None:
            return f"{head}: {self.plan_report().verdict()}"
        return head


def _choose_backend(backend: str, atc: str | os.PathLike | None) -> tuple[str, str, str | None]:
    if backend == "builtin":
        return "builtin", "requested (--backend builtin)", None
    try:
        from npu_deploy.converters.lowering import atc as atcmod
    except ImportError:  # pragma: no cover - the ATC driver ships with the package
        atcmod = None
    if backend == "atc":
        if atcmod is None:
            raise DependencyError("the ATC driver (npu_deploy.converters.lowering.atc) is not available")
        return "atc", "requested (--backend atc)", atcmod.require_atc(atc)
    found = atcmod.find_atc(atc) if atcmod is not None else None
    if found:
        return "atc", f"auto: ATC found at {found}", found
    return "builtin", "auto: ATC not found on PATH (or $ASCEND_TOOLKIT_HOME), using the built-in lowering", None


def convert(model: str | os.PathLike, output: str | os.PathLike | None = None, *, backend: str = "auto",
            soc: str | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
            input_format: str | None = None, dynamic_batch: Sequence[int] | None = None,
            dynamic_dims=None, precision_mode: str | None = None, keep_dtype: Sequence[str] | None = None,
            enable_small_channel: bool = False, atc_args: Sequence[str] = (), timeout: float | None = None,
            report: str | os.PathLike | None = None,
            progress: Callable[[str, float | None], None] | None = None,
            atc: str | os.PathLike | None = None,
            insert_op_conf: str | os.PathLike | None = None, out_nodes: str | None = None,
            output_type: str | None = None, atc_flags: Sequence[str] = (),
            atc_log: str | None = None, shape_ranges: Mapping[str, Sequence[Any]] | None = None,
            op_info: str | os.PathLike | None = None) -> ConvertResult:
    """Convert an ONNX model for an Ascend SoC; return a :class:`ConvertResult`.

    ``output`` defaults to the model path with ``.bundle`` (built-in) or ``.om`` (ATC); for the bundle
    it is used exactly as given. ``input_shapes``: ``{name: dims}`` (-1 marks a gear dimension);
    ``dynamic_batch``: ``[1, 4, 8]``; ``dynamic_dims``: ``[(1, 128), (4, 256)]`` or ``"1,128;4,256"``.
    ``precision_mode`` defaults to ATC's ``force_fp16``. ``keep_dtype``: node names or ``OpType::X``
    kept in float32. ``atc_args``: extra ``--name=value`` passed to ATC verbatim. ``report``: write the
    result (with the plan report) as JSON. ``progress(stage, fraction)`` is called as work advances.
    ``insert_op_conf``: an AIPP config; ATC gets the file, the built-in lowering validates it and
    prepends the preprocessing (:func:`npu_deploy.converters.lowering.aipp.prepend`: the input becomes the raw
    uint8 NHWC image) and records it in the manifest's ``aipp`` key. ``out_nodes`` / ``output_type``:
    ATC's ``--out_nodes`` / ``--output_type``, honoured by both backends. ``atc_flags``: ATC options
    given in ATC's spelling with no built-in counterpart (passed to ATC; the built-in lowering notes
    them). ``atc_log``: ATC's ``--log`` level (default ``error``). ``op_info``: a CANN opp folder whose
    installed op info narrows the built-in planner's formats (default ``$ASCEND_OPP_PATH`` when set;
    :mod:`npu_deploy.converters.lowering.opinfo`).
    """
    options = ConvertOptions(backend=backend, soc=soc, input_shapes=input_shapes, input_format=input_format,
                             dynamic_batch=dynamic_batch, dynamic_dims=dynamic_dims, precision_mode=precision_mode,
                             keep_dtype=tuple(keep_dtype or ()), enable_small_channel=enable_small_channel,
                             atc_args=tuple(atc_args or ()), atc_flags=tuple(atc_flags or ()),
                             out_nodes=out_nodes, output_type=output_type, atc_log=atc_log, timeout=timeout,
                             insert_op_conf=None if insert_op_conf is None else str(insert_op_conf),
                             atc=None if atc is None else str(atc), shape_ranges=shape_ranges,
                             op_info=None if op_info is None else str(op_info))
    with _io.outputs():  # a failure after the bundle/.om is written (e.g. the report) removes it again
        return _convert(Path(model), output, options, report=report, progress=progress)


def _convert(src: Path, output, o: ConvertOptions, *, report, progress) -> ConvertResult:
    t0 = time.perf_counter()
    if o.backend == "atc":
        o.for_backend("atc", "requested (--backend atc)")
    say = progress or (lambda stage, fraction=None: None)
    ctx = pipeline.lower(src, None, o, say=say, until="op support")
    loaded, support = ctx.loaded, ctx.support

    chosen, reason, atc_exe = _choose_backend(o.backend, o.atc)
    notes = o.for_backend(chosen, reason)
    out = src.with_suffix(".om" if chosen == "atc" else ".bundle") if output is None else Path(output)
    _io.check_dest(out)
    if report is not None:
        _io.check_dest(report)
    _io.refuse_overwriting([("the output", out), ("--report", report)], [("model being converted", src),
                        ("--insert-op-conf file", o.insert_op_conf)])
    support_d = {"verdict": support.verdict(), "counts": support.counts(),
                 "ai_cpu_nodes": [n.name for n in support.nodes if n.engine == "AI CPU" and not n.folded]}

    if chosen == "atc":
        # ATC takes the graph's own layout for ONNX models: its gears are the model's
        dynamic = {"mode": loaded.dynamic_mode, "gears": [{k: list(v) for k, v in g.items()} for g in loaded.gears]}
        if o.shape_ranges:
            dynamic = {"mode": "range", "gears": [], "ranges": {n: [list(r) if r else d for d, r in
                                                                zip(o.input_shapes[n], rng)]
                                                            for n, rng in o.shape_ranges.items()}}
        atc_d, om_path = _run_atc(loaded, out, o, atc_exe=atc_exe, say=say)
        _io.adopt(om_path)
        result = ConvertResult(str(src), om_path, "atc", reason, o.soc, o.precision, dynamic, support_d, None,
                               atc_d, time.perf_counter() - t0, notes)
    else:
        with _aipp_prepended(ctx, src, o, say) as ctx:
            ctx.output = out
            if o.shape_ranges:  # planned at both ends of the range (converters.lowering.ranges)
                ranges.plan_for_range(ctx, say)
            steps = [] if o.shape_ranges else [pipeline.STEPS["plan from ONNX"]]
            pipeline.run_steps(steps + [pipeline.STEPS["bundle from plan"]], ctx, say)
        p = ctx.plan
        result = ConvertResult(str(src), str(out), "builtin", reason, o.soc, o.precision, p.dynamic, support_d,
                               p.report.to_dict(), None, time.perf_counter() - t0, notes)
    if report is not None:
        result.to_json(report)
    return result


@contextlib.contextmanager
def _aipp_prepended(ctx, src: Path, o: ConvertOptions, say):
    """The built-in path's ``--insert-op-conf``: the AIPP preprocessing subgraph prepended to the loaded
    model (the AIPP input becomes the raw uint8 NHWC image), lowered from a private temporary file."""
    if o.insert_op_conf is None:
        yield ctx
        return

    configs = aipp.parse_config(o.insert_op_conf)
    if ctx.loaded.gears:
        raise InputError("--insert-op-conf with dynamic gears is not implemented by the built-in lowering",
                         hint="fix the input shapes with --input-shape")
    model, records = ctx.loaded.model, []
    for cfg in configs:
        model = aipp.prepend(model, cfg)
        rec = cfg.to_manifest()
        inits = {t.name for t in model.graph.initializer}
        real = [i.name for i in model.graph.input if i.name not in inits]
        rec["input"] = cfg.related_input_name or real[cfg.related_input_rank]
        records.append(rec)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        # external data (or large weights read in place from the .onnx itself: files.onnx_model) is
        # relative to the model's folder; the copy saved below is elsewhere: it holds the values inline
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        load_external_data_for_model(copy, str(src.parent))
        model = copy
    with tempfile.TemporaryDirectory(prefix="npu-deploy-aipp-") as tmp:
        path = Path(tmp) / src.name
        onnx.save(model, str(path))
        o2 = dataclasses.replace(o, input_shapes=None, dynamic_batch=None, dynamic_dims=None, out_nodes=None,
                                 output_type=None)  # all applied to the model saved here already
        actx = pipeline.lower(path, None, o2, say=say, until="op support")
        actx.loaded.aipp = records[0] if len(records) == 1 else {"blocks": records, **records[0]}
        actx.loaded.aipp_source = src
        yield actx
        ctx.plan = actx.plan


def _run_atc(loaded, out: Path, o: ConvertOptions, *, atc_exe, say) -> tuple[dict, str]:
    shapes = {i.name: tuple(i.shape) for i in loaded.inputs}
    extra = list(o.atc_args) + list(o.atc_flags)
    extra += [f"--{k}={v}" for k, v in (("out_nodes", o.out_nodes), ("output_type", o.output_type)) if v]
    if o.enable_small_channel and not any(a.startswith("--enable_small_channel") for a in extra):
        extra.append("--enable_small_channel=1")
    kwargs: dict[str, Any] = {"input_shapes": shapes, "precision_mode": o.precision_mode, "extra_args": extra,
                              "log": o.atc_log or "error"}
    if o.input_format is not None:
        kwargs["input_format"] = o.input_format
    if o.keep_dtype:
        kwargs["keep_dtype"] = list(o.keep_dtype)
    if o.insert_op_conf is not None:
        kwargs["insert_op_conf"] = o.insert_op_conf
    if o.shape_ranges:
        kwargs["shape_ranges"] = o.shape_ranges
    if loaded.dynamic_mode == "batch":
        kwargs["dynamic_batch"] = [g[next(iter(g))][0] for g in loaded.gears] if o.dynamic_batch is None \
            else list(o.dynamic_batch)
    elif loaded.dynamic_mode == "dims":
        slots = [(n, k) for n, s in shapes.items() for k, d in enumerate(s) if d < 0]
        kwargs["dynamic_dims"] = [[g[n][k] for n, k in slots] for g in loaded.gears]
    start = time.perf_counter()
    res = atcmod.atc_convert(loaded.path, out, soc=o.soc, atc=atc_exe, timeout=o.timeout,
                             on_line=lambda line, s: say(f"atc: {line}", None),
                             on_tick=lambda s: say(f"atc running ({s:.0f} s)", None), **kwargs)
    d = res.to_dict() if hasattr(res, "to_dict") else {}
    d.setdefault("elapsed_s", time.perf_counter() - start)
    return d, str(getattr(res, "om_path", out))
