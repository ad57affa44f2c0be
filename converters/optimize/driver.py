"""The driver: apply the rules one step at a time, verify and measure each step.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto

from npu_deploy import _io
from npu_deploy.converters.files.onnx_model import name_nodes
from npu_deploy.converters.lowering import opinfo
from npu_deploy.converters.lowering.options import DEFAULT_SOC
from npu_deploy.converters.optimize.graph import Match, Rule, View, apply_change, merge_changes
from npu_deploy.converters.optimize.measure import (
    COST_MODEL,
    NOISE_MARGIN_PCT,
    DeviceTimer,
    Measure,
    _DeviceTimes,
    _pct,
    device_faster,
)
from npu_deploy.converters.optimize.registry import select_rules
from npu_deploy.converters.optimize.result import Application, OptimizeResult
from npu_deploy.converters.optimize.verify import _compare, _run_all, _validate, check_tensor_data, realistic_feeds
from npu_deploy.errors import AtcError, InputError, ModelError, NpuDeployError

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
MAX_APPLICATIONS_PER_RULE = 64


def _name_nodes(model: onnx.ModelProto) -> None:
    """Unique node names, as the loader gives them (rules and reports key nodes by name)."""
    name_nodes(model.graph)


def optimize_model(model: onnx.ModelProto, *, rules: Sequence[str] | None = None, skip: Sequence[str] | None = None,
                   feeds: Mapping[str, np.ndarray] | None = None, input_shapes: Mapping[str, Sequence[int]] | None = None,
                   soc: str | None = None, atol: float | None = None, rtol: float | None = None,
                   keep_if_faster: bool = False, seed: int = 0, source: str = "<model>",
                   progress: Callable[[str], None] | None = None,
                   device_timer: DeviceTimer | None = None,
                   keep_all: bool = False, op_info=None) -> tuple[OptimizeResult, onnx.ModelProto]:
    """Apply the rules to ``model``; return the result and the rewritten model (see the module doc).

    What is kept of the verified steps: by default those the cost model does not estimate slower
    (:func:`_worse`; the others are reported as ``worse``), with ``keep_if_faster`` only those it
    estimates faster, with ``keep_all`` every one (``optimize --all``).
    ``device_timer`` (with ``keep_if_faster`` only): also time each step the cost model accepts on
    the device, e.g. ``AtcAclTimer()`` from :mod:`npu_deploy.runtime.device_time`. ``op_info``: the
    installed op info the measuring plans use (``--op-info DIR``; None: ``$ASCEND_OPP_PATH`` if set,
    :func:`npu_deploy.converters.lowering.opinfo.resolve`)."""
    chosen = select_rules(rules, skip)
    if keep_all and keep_if_faster:
        raise InputError("--all keeps every verified rewrite, --keep-if-faster only the faster ones",
                         hint="give one of them")
    keep = "faster" if keep_if_faster else "all" if keep_all else "not worse"
    if device_timer is not None:
        if not keep_if_faster:
            raise InputError("a device timer (--measure atc) judges --keep-if-faster, which is off",
                             hint="add --keep-if-faster, or drop --measure atc")
        check = getattr(device_timer, "check", None)
        if check is not None:
            check()  # ATC or pyACL missing: say so before any rewrite is verified
    soc = soc or DEFAULT_SOC
    installed = op_info if isinstance(op_info, opinfo.OpInfo) else opinfo.resolve(op_info, soc)[0]
    atol = DEFAULT_ATOL if atol is None else float(atol)
    rtol = DEFAULT_RTOL if rtol is None else float(rtol)
    say = progress or (lambda s: None)
    cur = onnx.ModelProto()
    cur.CopyFrom(model)
    _name_nodes(cur)
    check_tensor_data(cur, source)
    if feeds is None:
        feeds = realistic_feeds(cur, input_shapes, seed=seed)
    feeds = {k: np.asarray(v) for k, v in feeds.items()}
    shapes = {k: tuple(v.shape) for k, v in feeds.items()}
    out_names = [o.name for o in cur.graph.output]
    try:
        values = _run_all(cur, feeds)
    except NpuDeployError:
        raise
    except Exception as e:
        raise ModelError(f"{source}: onnxruntime cannot run the model on the verification inputs "
                         f"({str(e).splitlines()[0][:200]})", hint="check the model and --inputs/--input-shape") from None
    reference = {n: values[n] for n in out_names}
    applications: list[Application] = []
    with tempfile.TemporaryDirectory(prefix="npu-deploy-optimize-") as tmp:
        work = Path(tmp)
        device = None if device_timer is None else _DeviceTimes(device_timer, work, feeds, shapes, soc, say)
        original = cur
        before = Measure.of(cur, shapes, soc, work, op_info=installed)
        now = before
        for rule in chosen:
            tried: set[str] = set()
            single = False  # after a batch failed: one application at a time finds the culprit
            for _ in range(MAX_APPLICATIONS_PER_RULE):
                view = View(cur, values)
                try:
                    matches = [m for m in rule.find(view) if m.key not in tried]
                except Exception as e:  # a rule that cannot read this graph is reported, the model unchanged
                    applications.append(Application(rule.name, "<graph>", "not applicable",
                                                    f"the pattern could not be matched: {type(e).__name__}: {e}"))
                    break
                if not matches:
                    break
                batch: list[Match] = []
                used: set[str] = set()
                for m in matches:
                    if used & set(m.nodes) or (single and batch):
                        continue
                    tried.add(m.key)
                    reason = rule.check(view, m)
                    if reason is not None:
                        applications.append(Application(rule.name, m.nodes[0], "not applicable", reason))
                        continue
                    batch.append(m)
                    used |= set(m.nodes)
                if not batch:
                    continue
                say(f"{rule.name} at {batch[0].nodes[0]}" + (f" and {len(batch) - 1} more" if len(batch) > 1 else ""))
                apps, new, new_values, measured = _try(rule, view, batch, cur, feeds, reference, out_names, shapes,
                                                       soc, work, now, atol, rtol, keep, device, installed)
                if new is None and len(batch) > 1:
                    tried -= {m.key for m in batch}
                    single = True
                    continue
                applications += apps
                if new is not None:
                    cur, values, now = new, new_values, measured
        after = now
        device_summary = None
        if device is not None and device.known(original) is not None:
            device_summary = {"before_ms": device.known(original), "after_ms": device.ms(cur, "the output model"),
                              "runs": device.runs, "margin_pct": NOISE_MARGIN_PCT}
    res = OptimizeResult(source, None, soc, [r.name for r in chosen],
                         {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in feeds.items()},
                         atol, rtol, dataclasses.asdict(before), dataclasses.asdict(after), applications,
                         keep_if_faster, True,
                         COST_MODEL if device_timer is None else
                         f"{COST_MODEL}; device time {device_timer.measured_by}", device_summary, keep)
    problem = _validate(cur)
    if problem is not None:  # pragma: no cover - every accepted step passed the same check
        raise ModelError(f"{source}: the rewritten model fails the ONNX checks ({problem})")
    return res, cur


def _try(rule: Rule, view: View, batch: list[Match], cur, feeds, reference, out_names, shapes, soc, work,
         now: Measure, atol, rtol, keep: str, device: _DeviceTimes | None = None, op_info=None):
    """Apply ``batch`` (matches on disjoint nodes) in one step, verify and measure it. Returns the
    applications, and the new model, values and measure (None when rolled back)."""
    where = batch[0].nodes[0]

    def failed(reason: str):
        return [Application(rule.name, m.nodes[0], "rolled back", reason) for m in batch], None, None, None

    try:
        change = merge_changes([rule.rewrite(view, m) for m in batch])
        new = apply_change(cur, change)
    except Exception as e:
        return failed(f"rewrite failed: {type(e).__name__}: {e}")
    problem = _validate(new)
    if problem is not None:
        return failed(f"checks failed: {problem}")
    try:
        values = _run_all(new, feeds)
    except Exception as e:
        return failed(f"onnxruntime failed: {str(e).splitlines()[0][:200]}")
    diff, bad = _compare(reference, values, out_names, atol, rtol)
    if bad is not None:
        return failed(f"changes the numbers: {bad}")
    try:
        measured = Measure.of(new, shapes, soc, work, op_info=op_info)
    except NpuDeployError as e:
        return failed(f"the built-in lowering cannot plan it: {e}")
    together = None if len(batch) == 1 else \
        f"verified and measured together with {where} ({len(batch)} {rule.name} rewrites in one step)"
    apps = [Application(rule.name, where, "applied", None, dataclasses.asdict(now), dataclasses.asdict(measured), diff)]
    apps += [Application(rule.name, m.nodes[0], "applied", together, None, None, diff) for m in batch[1:]]
    judged = _judge(keep, now, measured)
    if judged is not None:
        for a in apps:
            a.status, a.reason = judged
        return apps, None, None, None
    if device is not None:
        try:
            before_ms = device.ms(cur, f"the model before {rule.name} at {where}")
        except NpuDeployError as e:  # the model that already ran (or the original) cannot be timed
            e.message = f"--measure atc, timing the model before {rule.name} at {where}: {e.message}"
            raise
        try:
            after_ms = device.ms(new, f"{rule.name} at {where}")
        except (AtcError, ModelError) as e:  # this rewrite does not compile: it goes, the others stay
            return failed(f"ATC cannot compile the rewritten model: {e}")
        apps[0].device = {"before_ms": before_ms, "after_ms": after_ms, "runs": device.runs,
                          "change_pct": _pct(before_ms, after_ms)}
        if not device_faster(before_ms, after_ms):
            reason = (f"device compute {before_ms:.3f} -> {after_ms:.3f} ms (ATC + ACL, median of {device.runs} "
                      f"runs): not faster by more than {NOISE_MARGIN_PCT:g} %, although the cost model estimated "
                      f"{now.est_us:.1f} -> {measured.est_us:.1f} us")
            for a in apps:
                a.status, a.reason = "not faster", reason
            return apps, None, None, None
    return apps, new, values, measured


def _worse(now: Measure, measured: Measure) -> bool:
    """The cost model estimates ``measured`` slower than ``now`` (estimated time up); with no estimate
    for the SoC, more planned TransData or AI CPU ops."""
    if now.est_us is not None and measured.est_us is not None:
        return measured.est_us > now.est_us
    return measured.transdata > now.transdata or measured.ai_cpu > now.ai_cpu


def _judge(keep: str, now: Measure, measured: Measure) -> tuple[str, str] | None:
    """Why a verified step is not kept under ``keep`` (``(status, reason)``), or None to keep it."""
    est = (f"estimated {now.est_us:.1f} -> {measured.est_us:.1f} us"
           if measured.est_us is not None and now.est_us is not None else None)
    if keep == "faster" and est is None:
        return "not faster", "no cost estimate for this SoC"
    if keep == "faster" and not measured.est_us < now.est_us:
        return "not faster", est
    if keep == "not worse" and _worse(now, measured):
        counts = f"TransData {now.transdata} -> {measured.transdata}, AI CPU {now.ai_cpu} -> {measured.ai_cpu}"
        return "worse", f"{est + ', ' if est else ''}{counts} (--all keeps it)"
    return None


def optimize(model: str | os.PathLike, output: str | os.PathLike, *, rules: Sequence[str] | None = None,
             skip: Sequence[str] | None = None, inputs: str | os.PathLike | None = None,
             input_shapes: Mapping[str, Sequence[int]] | None = None, soc: str | None = None,
             atol: float | None = None, rtol: float | None = None, keep_if_faster: bool = False, seed: int = 0,
             report: str | os.PathLike | None = None,
             progress: Callable[[str], None] | None = None,
             device_timer: DeviceTimer | None = None, keep_all: bool = False, op_info=None) -> OptimizeResult:
    """Rewrite ``model`` for Ascend into ``output`` (see the module doc); return an :class:`OptimizeResult`.

    ``inputs``: an ``.npz`` of verification inputs (else generated in realistic ranges, shapes from
    ``input_shapes`` for dynamic dimensions). ``device_timer``: see :func:`optimize_model`. The output
    is written only when every check passed."""
    src = Path(model)
    _io.check_dest(output)
    if report is not None:
        _io.check_dest(report)
    _io.refuse_overwriting([("-o", output), ("--json", report)],
                           [("model being optimized", src), ("--inputs file", inputs)])
    select_rules(rules, skip)
    if not src.is_file():
        raise InputError(f"model {src} does not exist")
    try:
        m = onnx.load(str(src), load_external_data=False)
    except Exception as e:
        raise ModelError(f"{src}: not an ONNX model ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})",
                         hint="check the file is a .onnx export") from None
    if any(t.data_location == TensorProto.EXTERNAL for t in m.graph.initializer):
        raise ModelError(f"{src}: weights in external data files are not supported by optimize",
                         hint="save the model with its weights inside (onnx.save(..., save_as_external_data=False))")
    problem = _validate(m)
    if problem is not None:
        raise ModelError(f"{src}: the model fails the ONNX checks, nothing was rewritten ({problem})")
    feeds = None
    if inputs is not None:
        feeds = _io.load_npz(inputs)
        names = {i.name for i in m.graph.input} - {t.name for t in m.graph.initializer}
        missing = sorted(names - set(feeds))
        if missing:
            raise InputError(f"--inputs {inputs} lacks input {missing[0]!r} of {src.name}",
                             hint=f"the model's inputs are {', '.join(sorted(names))}")
        feeds = {k: feeds[k] for k in names}
    res, out = optimize_model(m, rules=rules, skip=skip, feeds=feeds, input_shapes=input_shapes, soc=soc,
                              atol=atol, rtol=rtol, keep_if_faster=keep_if_faster, seed=seed, source=str(src),
                              progress=progress, device_timer=device_timer, keep_all=keep_all, op_info=op_info)
    res.output = str(output)
    with _io.outputs():
        with _io.atomic_path(output) as tmp:
            onnx.save(out, str(tmp))
        if report is not None:
            res.to_json(report)
    return res
