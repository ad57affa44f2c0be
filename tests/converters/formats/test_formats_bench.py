"""The benchmark compares like with like: its naive pad + reshape + transpose implementations must
produce exactly what ``formats.pack``/``unpack`` produce (and both agree with the reference offsets)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from npu_deploy.converters import formats as F
from tests.conftest import TEST_TIMEOUT, load_script

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_formats.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(BENCH)


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


@pytest.mark.parametrize("nbytes", [4096, 65536, 16 << 20, 256 << 20])
def test_benchmark_sizes(bench, nbytes):
    """Every benchmarked tensor is within a few percent of its nominal size (the issue's 4 KB, 64 KB,
    16 MB and 256 MB), for every format and dtype, grouped FRACTAL_Z included."""
    for fmt in bench.FORMATS:
        for dtype in bench.DTYPES:
            name, shape, kw = bench.case(fmt, dtype, nbytes)
            size = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, F.nbytes(name, shape, dtype, **kw))
            assert 0.45 * nbytes <= size <= 2.1 * nbytes, (fmt, dtype, shape, size)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["bench_memory.py", "bench_inspect.py"])
def test_benchmarks_run_from_a_non_editable_install(tmp_path, script):
    """Issue 15: with a regular (non-editable) install, a benchmark script must not shadow the installed
    ``npu_deploy`` with the repository's own ``npu_deploy/`` folder, which has no ``converters``."""
    repo = BENCH.parents[1]
    site = tmp_path / "site"     # the layout setuptools installs (package-dir mapping), from the sources
    shutil.copytree(repo / "npu_deploy", site / "npu_deploy")
    for sub in ("cli", "converters", "runtime", "profiling"):
        shutil.copytree(repo / sub, site / "npu_deploy" / sub)
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *deps])}
    # -S: no site hooks, so no editable-install finder can rescue a shadowed import
    code = (f"import runpy, sys; sys.argv = [{str(repo / 'benchmarks' / script)!r}, '--help']; "
            f"runpy.run_path(sys.argv[0], run_name='__main__')")
    r = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=TEST_TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage" in r.stdout
