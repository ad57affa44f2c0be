"""What a batch run reports: per-sample failures, per-NPU statistics, the :class:`BatchResult` summary."""

from __future__ import annotations

import dataclasses
import math
import random
from array import array
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from npu_deploy._result import Result
from npu_deploy._text import printable
from npu_deploy.runtime.bench import LatencyStats, latency_stats

#: an NPU whose mean latency is above this many times the median NPU's is a straggler
STRAGGLER_RATIO = 1.25
#: run times kept per NPU for the percentiles (count, mean, min and max are exact whatever the run length)
LATENCY_SAMPLE = 100_000


@dataclass
class SampleFailure:
    """One sample that produced no output: its id and why."""

    id: str
    error: str


@dataclass
class NpuStats:
    """What one NPU (one actor) did: samples, throughput over the run, latency of its runs."""

    worker: int
    device: str | None
    node: str = ""
    backend: str = ""
    samples: int = 0
    failed: int = 0
    throughput_per_s: float = 0.0
    latency: LatencyStats | None = None
    restarted: bool = False
    straggler: bool = False
    pid: int | None = None         # the actor's process (the same across the runs of one NpuPool)


@dataclass
class BatchResult(Result):
    """The summary of one :func:`run_batch`. ``bool(result)`` is True when every sample produced outputs.

    >>> r = BatchResult(model="m", npus=2, samples=10, ok=9, wall_s=2.0,
    ...                 failures=[SampleFailure("x7", "bad shape")])
    >>> r.verdict()
    '10 samples on 2 NPUs in 2.0 s (5.0/s): 1 failed (first: x7: bad shape)'
    """

    SCHEMA: ClassVar[str] = "npu-deploy/batch-result"
    SCHEMA_VERSION: ClassVar[int] = 1

    model: str = ""
    backend: str = ""
    address: str | None = None
    npus: int = 0
    samples: int = 0
    ok: int = 0
    wall_s: float = 0.0               # the run, from the moment every actor had answered
    throughput_per_s: float = 0.0
    max_in_flight: int = 0
    call_s: float = 0.0               # what the caller waited: call to return, Ray and actor start included
    start_s: float = 0.0              # the part of call_s spent starting Ray and the actors (0: a pool's live ones)
    output_dir: str | None = None
    workers: list[NpuStats] = field(default_factory=list)
    failures: list[SampleFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.failures

    def stragglers(self) -> list[NpuStats]:
        return [w for w in self.workers if w.straggler]

    def verdict(self) -> str:
        rate = self.samples / self.wall_s if self.wall_s > 0 else 0.0
        split = f" ({'/'.join(str(w.samples + w.failed) for w in self.workers)})" if len(self.workers) > 1 else ""
        waited = (f"; {self.call_s:.1f} s from the call, {self.start_s:.1f} s of it starting the actors"
                  if self.start_s > 0 else "")
        line = f"{self.samples} samples on {self.npus} NPUs{split} in {self.wall_s:.1f} s ({rate:.1f}/s{waited}): "
        if self.failures:
            first = self.failures[0]
            line += f"{len(self.failures)} failed (first: {printable(first.id)}: {printable(first.error)})"
        else:
            line += "all ok"
        slow = self.stragglers()
        if slow:
            line += f"; stragglers: {', '.join(_worker_label(w) for w in slow)}"
        return line

    def table(self) -> str:
        """Per-NPU lines: samples, throughput, latency p50/p90/p99, restarts, stragglers."""
        rows = [f"{'NPU':<12} {'samples':>8} {'failed':>6} {'per s':>8} {'p50 ms':>8} {'p90 ms':>8} "
                f"{'p99 ms':>8}  note"]
        for w in self.workers:
            lat = w.latency
            p = (f"{lat.p50_ms:8.2f} {lat.p90_ms:8.2f} {lat.p99_ms:8.2f}" if lat else f"{'-':>8} {'-':>8} {'-':>8}")
            note = ", ".join(x for x in ("restarted" if w.restarted else "", "straggler" if w.straggler else "") if x)
            rows.append(f"{printable(_worker_label(w)):<12} {w.samples:>8} {w.failed:>6} "
                        f"{w.throughput_per_s:>8.1f} {p}  {note}")
        return "\n".join(rows)

    @classmethod
    def from_dict(cls, d: dict) -> "BatchResult":
        d = dict(d)
        workers = []
        for w in d.get("workers", []):
            w = dict(w)
            if w.get("latency"):
                w["latency"] = LatencyStats.from_dict(w["latency"])
            workers.append(NpuStats(**{k: v for k, v in w.items() if k in _fields(NpuStats)}))
        d["workers"] = workers
        d["failures"] = [SampleFailure(**f) for f in d.get("failures", [])]
        return cls(**{k: v for k, v in d.items() if k in _fields(cls)})


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _worker_label(w: NpuStats) -> str:
    return f"npu {w.device}" if w.device is not None else f"worker {w.worker}"


class _Latencies:
    """Run times of one NPU in constant memory: exact count, total, min and max; percentiles from a
    uniform sample of at most :data:`LATENCY_SAMPLE` runs (reservoir sampling, fixed seed)."""

    def __init__(self, seed: int):
        self.count, self.total, self.min, self.max = 0, 0.0, math.inf, 0.0
        self.sample = array("d")
        self._rng = random.Random(seed)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.min = min(self.min, seconds)
        self.max = max(self.max, seconds)
        if len(self.sample) < LATENCY_SAMPLE:
            self.sample.append(seconds)
        else:
            j = self._rng.randrange(self.count)
            if j < LATENCY_SAMPLE:
                self.sample[j] = seconds

    def stats(self) -> LatencyStats | None:
        if not self.count:
            return None
        st = latency_stats(self.sample)
        return dataclasses.replace(st, count=self.count, min_ms=self.min * 1e3, max_ms=self.max * 1e3,
                                   mean_ms=self.total / self.count * 1e3, total_ms=self.total * 1e3)


def _mark_stragglers(workers: list[NpuStats]) -> None:
    means = [w.latency.mean_ms for w in workers if w.latency is not None]
    if len(means) < 2:
        return
    median = float(np.median(means))
    for w in workers:
        if w.latency is not None and median > 0 and w.latency.mean_ms > STRAGGLER_RATIO * median:
            w.straggler = True
