"""Latency statistics against a hand-written percentile oracle; benchmark() bookkeeping (no timing asserts)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_deploy.errors import InputError
from npu_deploy.runtime.backend import Backend, TensorMeta, Timing
from npu_deploy.runtime.bench import BenchResult, benchmark, latency_stats


def percentile_oracle(values, q):
    """Linear interpolation between closest ranks (the 'linear' / type 7 definition)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(1e-6, 10.0, allow_nan=False), min_size=1, max_size=200))
def test_stats_match_oracle(seconds):
    s = latency_stats(seconds)
    ms = [v * 1e3 for v in seconds]
    assert s.count == len(ms)
    assert s.min_ms == pytest.approx(min(ms)) and s.max_ms == pytest.approx(max(ms))
    assert s.mean_ms == pytest.approx(sum(ms) / len(ms))
    for q, got in ((50, s.p50_ms), (90, s.p90_ms), (95, s.p95_ms), (99, s.p99_ms)):
        assert got == pytest.approx(percentile_oracle(ms, q), rel=1e-9)
    assert s.min_ms <= s.p50_ms <= s.p90_ms <= s.p95_ms <= s.p99_ms <= s.max_ms


def test_empty_stats_is_input_error():
    with pytest.raises(InputError):
        latency_stats([])


class Doubler(Backend):
    name = "doubler"

    def __init__(self):
        super().__init__()
        self.runs = 0

    def get_inputs(self):
        return [TensorMeta("x", (-1, 2), np.float32)]

    def get_outputs(self):
        return [TensorMeta("y", (-1, 2), np.float32)]

    def _run_validated(self, names, feeds, *, gear):
        self.runs += 1
        with self._phase("h2d"):
            x = feeds["x"].copy()
        with self._phase("compute"):
            y = x * 2
        with self._phase("d2h"):
            return [y.copy()]


def test_benchmark_counts_and_result():
    b = Doubler()
    seen = []
    with b:
        res, outs = benchmark(b, {"x": np.ones((4, 2), np.float32)}, loop=7, warmup=3, progress=seen.append)
    assert b.runs == 10 and seen == list(range(1, 8))
    assert res.latency.count == 7 and res.compute.count == 7 and res.batch_size == 4
    assert 0 < res.throughput < math.inf  # the formula's oracle: test_benchmark_figures_from_known_timings
    assert res.latency.mean_ms >= res.compute.mean_ms
    assert res.outputs == {"y": {"shape": [4, 2], "dtype": "float32"}}
    np.testing.assert_array_equal(outs[0], 2 * np.ones((4, 2)))
    assert "onnxruntime" in res.versions and res
    back = BenchResult.load(res.to_json())
    assert back.latency == res.latency and back.throughput == res.throughput
    assert "p99" in res.table() and "compute" in res.table()


class KnownTimings:
    """A session stand-in whose runs report fixed timings (what ``benchmark`` reads: ``run_timed``
    and ``get_outputs``), so that every figure has a value worked out by hand."""

    backend_name = "known"

    def __init__(self, totals_ms, compute_ms):
        self.timings = [Timing(0.001, c / 1e3, 0.001, t / 1e3) for t, c in zip(totals_ms, compute_ms)]

    def get_outputs(self):
        return [TensorMeta("y", (-1, 2), np.float32)]

    def run_timed(self, names, feeds):
        return [feeds["x"] * 2], self.timings.pop(0)


def test_benchmark_figures_from_known_timings():
    # one warmup run (30 ms, not counted), then 10, 20, 30, 40 ms end to end with 4, 4, 6, 6 ms compute
    s = KnownTimings([30, 10, 20, 30, 40], [9, 4, 4, 6, 6])
    res, _ = benchmark(s, {"x": np.ones((4, 2), np.float32)}, loop=4, warmup=1)
    assert not s.timings and res.batch_size == 4
    assert res.latency.total_ms == pytest.approx(100.0) and res.latency.mean_ms == pytest.approx(25.0)
    assert res.latency.min_ms == pytest.approx(10.0) and res.latency.max_ms == pytest.approx(40.0)
    assert res.throughput == pytest.approx(160.0)  # 4 runs x 4 samples in 0.1 s
    assert res.compute.mean_ms == pytest.approx(5.0)
    # ais_bench counts compute time only: 1000 * 4 / 5 ms = 800 samples/s
    assert res.ais_bench_lines()[-1].endswith(": 800.00")


@pytest.mark.parametrize("loop, warmup", [(0, 1), (3, -1)])
def test_benchmark_bad_counts(loop, warmup):
    with Doubler() as b, pytest.raises(InputError):
        benchmark(b, {"x": np.ones((1, 2), np.float32)}, loop=loop, warmup=warmup)
