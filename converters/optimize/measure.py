"""Measuring: the built-in plan of a model, and the injected device timer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np
import onnx

from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.options import ConvertOptions
from npu_deploy.errors import InternalError

# A step timed on the device must gain more than this share of compute time to count as faster:
# medians of repeated runs still differ between two loads of a model (launch jitter, clock states).
# 2 % is an assumption, not a figure measured on a device here.
NOISE_MARGIN_PCT = 2.0
COST_MODEL = "built-in planner and cost model"


@dataclasses.dataclass
class Measure:
    """The built-in plan of one model: planned TransData, AI CPU ops, estimated time (µs)."""

    transdata: int
    ai_cpu: int
    est_us: float | None

    @staticmethod
    def of(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], soc: str, workdir: Path,
           op_info=None) -> "Measure":
        path = workdir / "candidate.onnx"
        onnx.save(model, path)
        plan = pipeline.lower(path, None, ConvertOptions(backend="builtin", soc=soc, input_shapes=dict(shapes),
                                                         op_info=op_info),
                              until="plan from ONNX").plan
        r = plan.report
        cost = r.cost or {}
        return Measure(int(r.transdata_count), int(r.engines.get("AI CPU", 0)),
                       None if cost.get("total_us") is None else float(cost["total_us"]))


def _pct(before: float | None, after: float | None) -> float | None:
    if not before or after is None:
        return None
    return 100.0 * (after - before) / before


def device_faster(before_ms: float, after_ms: float, margin_pct: float = NOISE_MARGIN_PCT) -> bool:
    """True when the device time dropped by more than ``margin_pct`` percent of ``before_ms``.

    >>> device_faster(10.0, 9.7), device_faster(10.0, 9.9), device_faster(10.0, 10.5)
    (True, False, False)
    """
    return after_ms < before_ms * (1.0 - margin_pct / 100.0)


class DeviceTimer(Protocol):
    """What ``optimize_model(device_timer=...)`` needs: ``timer(onnx_path, feeds, shapes, soc) -> ms``
    (device compute time of the model saved at ``onnx_path``; it may write next to it), ``runs`` (the
    timed runs behind each figure), ``measured_by`` (the label of its figures) and, optionally,
    ``check()`` raising when its tools are missing. :class:`npu_deploy.runtime.device_time.AtcAclTimer`
    is the ATC + ACL one."""

    runs: int
    measured_by: str

    def __call__(self, onnx_path: Path, feeds: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]],
                 soc: str) -> float: ...


class _DeviceTimes:
    """The device timer's figure per model: each distinct model is saved, compiled and timed once."""

    def __init__(self, timer: DeviceTimer, workdir: Path, feeds, shapes, soc: str, say: Callable[[str], None]):
        self.timer, self.dir, self.feeds, self.shapes, self.soc, self.say = timer, workdir, feeds, shapes, soc, say
        self.runs = int(getattr(timer, "runs", 0)) or None
        self._ms: dict[str, float] = {}
        self._tried = 0   # folders made (a model ATC could not compile has one, and no figure)

    @staticmethod
    def _key(model: onnx.ModelProto) -> str:
        return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()

    def known(self, model: onnx.ModelProto) -> float | None:
        return self._ms.get(self._key(model))

    def ms(self, model: onnx.ModelProto, what: str) -> float:
        key = self._key(model)
        if key not in self._ms:
            d = self.dir / f"device-{self._tried}"
            self._tried += 1
            d.mkdir()
            path = d / "model.onnx"
            onnx.save(model, path)
            self.say(f"timing {what} on the device")
            ms = float(self.timer(path, self.feeds, self.shapes, self.soc))
            if not (math.isfinite(ms) and ms >= 0):
                raise InternalError(f"the device timer {type(self.timer).__name__} returned {ms} ms for {what}: "
                                    f"a device time is a finite, non-negative number of milliseconds")
            self._ms[key] = ms
        return self._ms[key]
