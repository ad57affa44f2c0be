"""Device compute time of an ONNX model, measured with ATC + ACL (``optimize --measure atc``).

Measured with ATC + ACL: verified against stand-ins only (``tests/standins/atc`` and the pyACL
stand-in); no real Ascend device has run this code yet.

:class:`AtcAclTimer` is "compute time from ONNX": the model is compiled to an ``.om`` by ATC
(:func:`npu_deploy.converters.lowering.convert.convert`, ``backend="atc"``, the verification inputs' shapes
made static), loaded with :class:`~npu_deploy.runtime.session.InferenceSession` (the ACL backend) and
run ``warmup + runs`` times on the same feeds (:func:`~npu_deploy.runtime.bench.benchmark`); the
figure is the median of the compute phase (``acl.mdl.execute``), without the host<->device copies.
It lives in ``runtime`` because it runs the model; ``converters.optimize`` receives it as a callable
(runtime -> converters, never the other way).

>>> timer = AtcAclTimer(atc="/usr/local/Ascend/ascend-toolkit/latest/bin/atc", runs=20)  # doctest: +SKIP
>>> timer.check()                                                                        # doctest: +SKIP
>>> timer(Path("m.onnx"), {"x": x}, {"x": (1, 3, 224, 224)}, "Ascend310P3")             # doctest: +SKIP
1.234
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from npu_deploy.converters.lowering.atc import require_atc
from npu_deploy.converters.lowering.convert import convert
from npu_deploy.errors import InputError
from npu_deploy.runtime import device
from npu_deploy.runtime.bench import benchmark
from npu_deploy.runtime.session import InferenceSession

#: the label every report of these figures carries (CLI help, JSON ``measured_by``)
ATC_ACL_LABEL = "measured with ATC + ACL: verified against stand-ins only"
DEFAULT_RUNS = 20
WARMUP = 1   # the first execute on a device pays for kernel loading and memory binding


class AtcAclTimer:
    """``timer(onnx_path, feeds, shapes, soc) -> ms``: median device compute time of the model.

    ``atc``: the ATC executable (default: found on PATH / ``$ASCEND_TOOLKIT_HOME``); ``runs``: timed
    runs after one warm-up (default 20); ``device_id``: the NPU to run on. The ``.om`` is written next
    to ``onnx_path`` (``<stem>.om``)."""

    measured_by = ATC_ACL_LABEL

    def __init__(self, *, atc: str | os.PathLike | None = None, runs: int | None = None, device_id: int = 0):
        self.atc = None if atc is None else str(atc)
        self.runs = DEFAULT_RUNS if runs is None else int(runs)
        if self.runs < 1:
            raise InputError(f"--runs {self.runs}: at least one timed run is needed", hint="use --runs 1 or more")
        self.device_id = device_id

    def check(self) -> None:
        """Raise :class:`~npu_deploy.errors.DependencyError` (exit 3) now when ATC or pyACL is missing,
        rather than after the first rewrite was verified."""
        self.atc = require_atc(self.atc)
        device.load_acl()

    def __call__(self, onnx_path: Path, feeds: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]],
                 soc: str) -> float:
        res = convert(onnx_path, onnx_path.with_suffix(".om"), backend="atc", atc=self.atc, soc=soc,
                      input_shapes={k: tuple(v) for k, v in shapes.items()})
        with InferenceSession(res.output, device_id=self.device_id, backend="acl") as sess:
            stats, _ = benchmark(sess, feeds, loop=self.runs, warmup=WARMUP, model=str(onnx_path))
        return float(stats.compute.p50_ms)
