"""The benchmark compares like with like: its naive pad + reshape + transpose implementations must
produce exactly what ``formats.pack``/``unpack`` produce (and both agree with the reference offsets)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from npu_deploy.converters import formats as F

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_formats.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_formats", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("fmt,shape", [
    ("NC1HWC0", (2, 19, 5, 3)), ("NC1HWC0", (1, 32, 4, 4)), ("FRACTAL_Z", (17, 33, 3, 3)),
    ("FRACTAL_Z", (32, 16, 1, 1)), ("FRACTAL_NZ", (20, 35)), ("FRACTAL_NZ", (2, 17, 33))])
def test_naive_equals_pack_and_unpack(bench, fmt, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float16)
    y = F.pack(x, fmt)
    assert bench.naive_pack(x, fmt).tobytes() == y.tobytes()
    assert np.array_equal(bench.naive_unpack(y, fmt, shape), x)


def test_benchmark_cases_are_at_least_16_mib(bench):
    for fmt, shape in bench.CASES.values():
        assert int(np.prod(shape)) * 2 >= 16 * 2**20
    assert {f for f, _ in bench.CASES.values()} == {"NC1HWC0", "FRACTAL_Z", "FRACTAL_NZ"}
