"""Latency and throughput statistics for ``npu-deploy run`` and the Python API.

:func:`benchmark` runs a session (or any :class:`~npu_deploy.runtime.backend.Backend`) ``warmup + loop``
times on the same feeds and returns a :class:`BenchResult`: end-to-end latency (min / mean / p50 / p90 /
p95 / p99 / max), throughput, and — separately — the host→device, compute and device→host phases
(ais_bench reports device compute only; users need both).

>>> stats = latency_stats([0.001, 0.002, 0.003, 0.004])
>>> round(stats.mean_ms, 3), round(stats.p50_ms, 3)
(2.5, 2.5)
"""

from __future__ import annotations

import dataclasses
import math
import platform
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from npu_deploy._display import duration_ms, plural, table
from npu_deploy._result import Result
from npu_deploy.errors import InputError
from npu_deploy._version import __version__

PERCENTILES = (50, 90, 95, 99)


@dataclasses.dataclass
class LatencyStats:
    """Summary of a list of durations, in milliseconds. Percentiles interpolate linearly between the
    two nearest ranks (numpy's default ``linear`` method)."""

    count: int
    min_ms: float
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    std_ms: float
    total_ms: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LatencyStats":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


def latency_stats(seconds: Sequence[float]) -> LatencyStats:
    """Statistics of durations given in seconds (reported in ms).

    >>> latency_stats([0.010]).p99_ms
    10.0
    """
    x = np.asarray(seconds, dtype=np.float64) * 1e3
    if x.size == 0:
        raise InputError("no timings to summarise", hint="run at least one iteration (--loop 1)")
    p = np.percentile(x, PERCENTILES)
    return LatencyStats(count=int(x.size), min_ms=float(x.min()), mean_ms=float(x.mean()),
                        p50_ms=float(p[0]), p90_ms=float(p[1]), p95_ms=float(p[2]), p99_ms=float(p[3]),
                        max_ms=float(x.max()), std_ms=float(x.std()), total_ms=float(x.sum()))


def versions() -> dict[str, str]:
    """Versions of the pieces that decide the numbers (npu-deploy, Python, numpy, onnx, onnxruntime)."""
    out = {"npu_deploy": __version__, "python": platform.python_version(), "numpy": np.__version__,
           "platform": platform.platform()}
    for mod in ("onnx", "onnxruntime"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:  # pragma: no cover - both are dependencies
            out[mod] = "missing"
    return out


@dataclasses.dataclass
class BenchResult(Result):
    """What ``npu-deploy run`` measured. ``latency`` is the whole ``run`` call per iteration;
    ``h2d``/``compute``/``d2h`` the phases; ``throughput`` is samples per second
    (``batch_size * count / total latency``)."""

    SCHEMA = "npu-deploy/run"
    SCHEMA_VERSION = 1

    model: str = ""
    backend: str = ""
    batch_size: int = 1
    loop: int = 0
    warmup: int = 0
    inputs: dict = dataclasses.field(default_factory=dict)
    outputs: dict = dataclasses.field(default_factory=dict)
    latency: LatencyStats | None = None
    h2d: LatencyStats | None = None
    compute: LatencyStats | None = None
    d2h: LatencyStats | None = None
    throughput: float = 0.0
    estimated: bool = False
    versions: dict = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.latency is not None and self.latency.count > 0

    def verdict(self) -> str:
        if self.latency is None:
            return "no runs"
        where = "CPU emulator (not device time)" if self.backend == "emulator" else self.backend
        return (f"{plural(self.loop, 'run')} on {where}: mean {duration_ms(self.latency.mean_ms)}, "
                f"p99 {duration_ms(self.latency.p99_ms)}, throughput {self.throughput:.1f} samples/s")

    @classmethod
    def from_dict(cls, d: dict) -> "BenchResult":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for k in ("latency", "h2d", "compute", "d2h"):
            if isinstance(kw.get(k), dict):
                kw[k] = LatencyStats.from_dict(kw[k])
        return cls(**kw)

    def table(self) -> str:
        """The numbers as an aligned table (what the CLI prints), then the same in ais_bench's terms."""
        rows = [("latency (end to end)", self.latency), ("  host -> device", self.h2d),
                ("  compute", self.compute), ("  device -> host", self.d2h)]
        body = [(label, *(duration_ms(getattr(s, f"{k}_ms")) for k in ("min", "mean", "p50", "p90", "p95",
                                                                        "p99", "max", "std")))
                for label, s in rows if s is not None]
        lines = [table(["", "min", "mean", "p50", "p90", "p95", "p99", "max", "std"], body, right=range(1, 9))]
        lines.append(f"throughput: {self.throughput:.2f} samples/s end to end (batch {self.batch_size})")
        lines.extend(self.ais_bench_lines())
        return "\n".join(lines)

    def ais_bench_lines(self) -> list[str]:
        """The summary as ais_bench words it: H2D / compute / D2H in ms (mean, median, p99), and its
        throughput, which counts compute time only (``1000 * batchsize / compute mean``)."""
        out = ["in ais_bench's terms (ms):"]
        for label, s in (("H2D_latency", self.h2d), ("NPU_compute_time", self.compute), ("D2H_latency", self.d2h)):
            if s is not None:
                out.append(f"  {label}: min = {s.min_ms:.4g}, max = {s.max_ms:.4g}, mean = {s.mean_ms:.4g}, "
                           f"median = {s.p50_ms:.4g}, percentile(99%) = {s.p99_ms:.4g}")
        if self.compute is not None and self.compute.mean_ms > 0:
            thr = 1000.0 * self.batch_size / self.compute.mean_ms
            out.append(f"  throughput 1000*batchsize({self.batch_size})/NPU_compute_time.mean"
                       f"({self.compute.mean_ms:.4g}): {thr:.2f}")
        return out


def benchmark(session: Any, feeds: Mapping[str, np.ndarray], *, loop: int = 10, warmup: int = 1,
              batch_size: int | None = None, output_names: Sequence[str] | None = None,
              progress: Callable[[int], None] | None = None,
              model: str = "") -> tuple[BenchResult, list[np.ndarray]]:
    """Run ``session.run_timed`` ``warmup`` times unmeasured, then ``loop`` times measured.

    Returns the :class:`BenchResult` and the outputs of the last run. ``batch_size`` defaults to
    axis 0 of the first input; ``progress(i)`` is called after each measured run.

    >>> res, outs = benchmark(sess, {"x": x}, loop=100, warmup=5)   # doctest: +SKIP
    """
    if loop < 1:
        raise InputError(f"loop count {loop} must be at least 1", hint="use --loop 1 or more")
    if warmup < 0:
        raise InputError(f"warmup count {warmup} must not be negative", hint="use --warmup 0 or more")
    outs: list[np.ndarray] = []
    for _ in range(warmup):
        outs, _t = session.run_timed(output_names, feeds)
    totals, h2d, comp, d2h = [], [], [], []
    for i in range(loop):
        outs, t = session.run_timed(output_names, feeds)
        totals.append(t.total)
        h2d.append(t.h2d)
        comp.append(t.compute)
        d2h.append(t.d2h)
        if progress is not None:
            progress(i + 1)
    if batch_size is None:
        first = next(iter(feeds.values()), None)
        batch_size = int(first.shape[0]) if first is not None and getattr(first, "ndim", 0) else 1
    lat = latency_stats(totals)
    thr = batch_size * lat.count / (lat.total_ms / 1e3) if lat.total_ms > 0 else math.inf
    names = [m.name for m in session.get_outputs()] if output_names is None else list(output_names)
    res = BenchResult(
        model=model, backend=getattr(session, "backend_name", getattr(session, "name", "")),
        batch_size=batch_size, loop=loop, warmup=warmup,
        inputs={n: {"shape": list(np.shape(a)), "dtype": np.asarray(a).dtype.name} for n, a in feeds.items()},
        outputs={n: {"shape": list(o.shape), "dtype": o.dtype.name} for n, o in zip(names, outs)},
        latency=lat, h2d=latency_stats(h2d), compute=latency_stats(comp), d2h=latency_stats(d2h),
        throughput=float(thr), estimated=False, versions=versions())
    return res, outs
