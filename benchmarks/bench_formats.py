"""Pack/unpack speed of the format algebra, side by side with ``np.copyto`` of the same bytes and
with the plain numpy expression of the same layout.

Every figure is a median of interleaved rounds in **process CPU time** (time spent waiting for a
core that other jobs hold does not count), printed with the host line of ``_host.py`` (CPU model,
cores, caches, load averages, "quiet?") and the 1-minute load beside every row:

* **per call** (4 KiB, and 64 KiB in the full run): microseconds per ``pack``/``unpack`` into a
  reused ``out=`` buffer, against ``np.copyto`` of the same bytes and the plain numpy expression
  (reshape + transpose + ``ascontiguousarray``, ``np.pad`` only where the shape needs it); targets:
  at most 3x the copy + 5 us, and never slower than the plain numpy expression;
* **throughput** (16 MiB, and 256 MiB in the full run): ratio of a single-thread ``np.copyto`` of the
  same bytes to a ``threads=1`` call, with its noise (half the interquartile range of the per-round
  ratios); targets: >= 0.6 and never below the plain numpy expression; plus the variant each recipe
  chose (``formats._tune``), wall-clock ratios for 1 and 2 threads and the no-kernel fallback.

The run exits 1 (after printing what is off) when a target is missed by more than the row's noise,
or when a figure the README documents ("0.95 ± 0.04") differs from the new one by more than both
noises (and 15 %, or 30 % when the host is not quiet); ``--no-check`` exits 0 anyway. ``--write`` writes ``benchmarks/README-formats.md``.
Formats NC1HWC0, NDC1HWC0, FRACTAL_Z, FRACTAL_Z with groups=4, FRACTAL_NZ; float16, float32, int8;
both directions.

    python benchmarks/run_all.py --quick             # this benchmark's quick mode, through run_all
    python benchmarks/bench_formats.py --quick       # 4 KiB and 16 MiB only (~1 minute on 2 cores)
    python benchmarks/bench_formats.py --runs 5 --write   # everything, the 16 MiB rows in 5 processes (~4 min quiet)
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from npu_deploy.converters.formats import _fastcopy
from npu_deploy.converters import formats as F

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))     # benchmarks/_host.py, also when this file is loaded by path (tests)
import _host  # noqa: E402


# ------------------------------------------------------------------------------ naive implementations
def ceil(a: int, b: int) -> int:
    return -(-a // b)


def _pad(x: np.ndarray, widths) -> np.ndarray:
    return np.pad(x, widths) if any(w for _, w in widths) else x


def naive_pack(x: np.ndarray, fmt: str, c0: int = 16) -> np.ndarray:
    """Pad (only where the shape needs it), reshape, transpose, copy: the straightforward numpy way."""
    if fmt == "NC1HWC0":
        n, c, h, w = x.shape
        p = _pad(x, ((0, 0), (0, ceil(c, c0) * c0 - c), (0, 0), (0, 0)))
        return np.ascontiguousarray(p.reshape(n, -1, c0, h, w).transpose(0, 1, 3, 4, 2))
    if fmt == "FRACTAL_Z":
        n, c, h, w = x.shape
        p = _pad(x, ((0, ceil(n, 16) * 16 - n), (0, ceil(c, c0) * c0 - c), (0, 0), (0, 0)))
        y = p.reshape(-1, 16, ceil(c, c0), c0, h, w).transpose(2, 4, 5, 0, 1, 3)
        return np.ascontiguousarray(y).reshape(ceil(c, c0) * h * w, -1, 16, c0)
    if fmt == "FRACTAL_NZ":
        m, n = x.shape[-2:]
        pad = [(0, 0)] * (x.ndim - 2) + [(0, ceil(m, 16) * 16 - m), (0, ceil(n, c0) * c0 - n)]
        p = _pad(x, pad)
        b = x.shape[:-2]
        y = p.reshape(*b, ceil(m, 16), 16, ceil(n, c0), c0)
        k = len(b)
        return np.ascontiguousarray(y.transpose(*range(k), k + 2, k, k + 1, k + 3))
    raise ValueError(fmt)


def naive_unpack(y: np.ndarray, fmt: str, shape: tuple[int, ...]) -> np.ndarray:
    if fmt == "NC1HWC0":
        n, c, h, w = shape
        return np.ascontiguousarray(y.transpose(0, 1, 4, 2, 3).reshape(n, -1, h, w)[:, :c])
    if fmt == "FRACTAL_Z":
        n, c, h, w = shape
        c1, c0 = ceil(c, y.shape[-1]), y.shape[-1]
        z = y.reshape(c1, h, w, -1, 16, c0).transpose(3, 4, 0, 5, 1, 2).reshape(-1, c1 * c0, h, w)
        return np.ascontiguousarray(z[:n, :c])
    if fmt == "FRACTAL_NZ":
        m, n = shape[-2:]
        k = len(shape) - 2
        z = y.transpose(*range(k), k + 1, k + 2, k, k + 3)
        z = z.reshape(*shape[:-2], y.shape[k + 1] * 16, y.shape[k] * y.shape[-1])
        return np.ascontiguousarray(z[..., :m, :n])
    raise ValueError(fmt)


# ------------------------------------------------------------------------------ cases
FORMATS = ("NC1HWC0", "NDC1HWC0", "FRACTAL_Z", "FRACTAL_Z/g4", "FRACTAL_NZ")
DTYPES = (np.float16, np.float32, np.int8)
CASES = {   # the naive-comparison cases of the 16 MiB float16 table (tests check they agree with pack)
    "NC1HWC0": ("NC1HWC0", (8, 64, 128, 128)),
    "FRACTAL_Z": ("FRACTAL_Z", (1024, 1024, 3, 3)),
    "FRACTAL_NZ": ("FRACTAL_NZ", (4096, 2048)),
}


def _split(e: int) -> tuple[int, int]:
    """e = h * w with h, w as close as possible (powers of two when e is one)."""
    h = 1 << max(0, (e.bit_length() - 1) // 2)
    while e % h:
        h //= 2
    return h, e // h


def case(fmt: str, dtype, nbytes: int) -> tuple[str, tuple[int, ...], dict]:
    """(format, logical shape, keywords) of an aligned tensor of about ``nbytes`` logical bytes."""
    e = max(1, nbytes // np.dtype(dtype).itemsize)
    if fmt == "NC1HWC0":
        n = 8 if e >= 1 << 20 else 1
        return fmt, (n, 64, *_split(e // (64 * n))), {}
    if fmt == "NDC1HWC0":
        n, d = (2, 4) if e >= 1 << 20 else (1, 2)
        return fmt, (n, 64, d, *_split(e // (64 * n * d))), {}
    if fmt == "FRACTAL_Z":       # 1x1 conv weights when small, 3x3 when large
        k = 3 if e >= 1 << 20 else 1
        n = 1 << ((e // (k * k)).bit_length() // 2)
        return fmt, (n, max(64, e // (k * k * n) // 64 * 64), k, k), {}
    if fmt == "FRACTAL_Z/g4":    # grouped conv weight [Cout, Cin / 4, k, k], 4 groups
        k = 3 if e >= 1 << 20 else 1
        cout = max(64, int((4 * e / (k * k)) ** 0.5) // 64 * 64)
        return "FRACTAL_Z", (cout, cout // 4, k, k), {"groups": 4}
    if fmt == "FRACTAL_NZ":
        return fmt, _split(e), {}
    raise ValueError(fmt)


# ------------------------------------------------------------------------------ measurement
def load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def rounds(fns: dict, reps: int, number: int = 1) -> tuple[dict, dict]:
    """Per-call process CPU times and wall times (seconds) of each candidate, one entry per round;
    the candidates alternate within every round, so machine load hits them alike. CPU time leaves
    out the time spent waiting for a core another job holds."""
    cpu = {k: [] for k in fns}
    wall = {k: [] for k in fns}
    for f in fns.values():
        f()                     # warm up: page in buffers, build (and tune) recipes
    for _ in range(reps):
        for k, f in fns.items():
            c0 = time.process_time()
            t0 = time.perf_counter()
            for _ in range(number):
                f()
            wall[k].append((time.perf_counter() - t0) / number)
            cpu[k].append((time.process_time() - c0) / number)
    return cpu, wall


def med(v) -> float:
    return float(statistics.median(v))


def ratio_stats(num: list[float], den: list[float]) -> tuple[float, float]:
    """(median, noise) of the per-round ratios num/den; noise: half the interquartile range (at
    least 2 % of the median: the timer and cache state of a single round)."""
    r = sorted(n / d for n, d in zip(num, den) if d > 0)
    if not r:
        return float("nan"), float("nan")
    q = statistics.quantiles(r, n=4, method="inclusive") if len(r) > 1 else [r[0]] * 3
    m = med(r)
    return m, max((q[2] - q[0]) / 2, 0.02 * m)


def peak_alloc(fn) -> int:
    """Peak bytes allocated (tracemalloc, numpy buffers included) during one call."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    result = fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del result
    return peak


def no_kernel(fn):
    """``fn`` with the compiled kernel off (what a machine without a C compiler runs)."""
    def run():
        old = _fastcopy.KERNEL_ENABLED
        _fastcopy.KERNEL_ENABLED = False
        try:
            return fn()
        finally:
            _fastcopy.KERNEL_ENABLED = old
    return run


ALIGN_OFFSET = 16     # every large buffer starts this many bytes past a 4 KiB page (numpy's own mmap'd arrays)


def aligned(shape, dtype, fill=None) -> np.ndarray:
    """A C-contiguous array whose data starts ALIGN_OFFSET bytes past a page. Where numpy puts an
    array of 1-32 MiB depends on what the process freed before (glibc serves it from the heap at any
    16-byte offset once its mmap threshold has grown), and the kernels' speed depends on the offsets
    of source and destination (FRACTAL_Z int8 unpack at 16 MiB: 0.61-0.78 of a copy over 16 offset
    pairs; FRACTAL_NZ fp16 pack 0.74-1.05): fixed offsets keep that out of the process-to-process
    spread the README documents."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(n + 8192, np.uint8)
    o = (-raw.ctypes.data) % 4096 + ALIGN_OFFSET
    a = raw[o:o + n].view(dt).reshape(shape)
    if fill is not None:
        a[...] = fill
    return a


def _tensors(fmt: str, dtype, nbytes: int):
    name, shape, kw = case(fmt, dtype, nbytes)
    rng = np.random.default_rng(0)
    x = aligned(shape, dtype, rng.integers(-100, 100, size=shape).astype(dtype))
    phys = aligned(F.storage_shape(name, shape, dtype, **kw), dtype)
    F.pack(x, name, out=phys, **kw)
    return name, shape, kw, x, phys, aligned(shape, dtype)


def _naive(name: str, kw: dict, direction: str, x, phys, shape, dtype):
    """The plain numpy expression of the same layout (None where the benchmark has none: NDC1HWC0,
    grouped FRACTAL_Z)."""
    if kw or name not in CASES:
        return None
    c0 = F.default_c0(dtype)
    if direction == "pack":
        return lambda: naive_pack(x, name, c0)
    return lambda: naive_unpack(phys, name, shape)


def _choice(x_shape, unpack: bool, dtype) -> str:
    """The variant the recipe chose when it was built (see ``formats._tune``)."""
    for r in list(F._recipes.values()):
        if r.unpack == unpack and r.in_shape == tuple(x_shape) and r.plan.dtype == np.dtype(dtype):
            if 1 in r.choices:
                return r.choices[1][0]
            if r.last[1]:
                return r.last[1]
    return "-"


def run_small(reps: int, sizes=(4096, 65536)) -> list[dict]:
    rows = []
    for nbytes in sizes:
        number = 400 if nbytes <= 4096 else 60
        for fmt in FORMATS:
            for dtype in DTYPES:
                name, shape, kw, x, phys, back = _tensors(fmt, dtype, nbytes)
                nb = max(x.nbytes, phys.nbytes)
                a, b = aligned(nb, np.uint8, 1), aligned(nb, np.uint8, 0)
                for direction in ("pack", "unpack"):
                    if direction == "pack":
                        fast = lambda: F.pack(x, name, out=phys, **kw)              # noqa: E731
                        alloc = lambda: F.pack(x, name, **kw)                       # noqa: E731
                    else:
                        fast = lambda: F.unpack(phys, name, shape, out=back, **kw)  # noqa: E731
                        alloc = lambda: F.unpack(phys, name, shape, **kw)           # noqa: E731
                    fns = {"copy": lambda: np.copyto(b, a), "fast": fast, "alloc": alloc,
                           "nokernel": no_kernel(fast)}
                    naive = _naive(name, kw, direction, x, phys, shape, dtype)
                    if naive is not None:
                        fns["naive"] = naive
                    cpu, _ = rounds(fns, reps, number)
                    us = {k: med(v) * 1e6 for k, v in cpu.items()}
                    target = 3 * us["copy"] + 5
                    r = {"part": "small", "fmt": fmt, "dtype": np.dtype(dtype).name, "dir": direction,
                         "shape": shape, "bytes": nb, "us": us, "target": target,
                         "met": us["fast"] <= target, "met_nokernel": us["nokernel"] <= target,
                         "choice": _choice(x.shape if direction == "pack" else phys.shape,
                                           direction == "unpack", dtype), "load": load()}
                    if naive is not None:
                        q, noise = ratio_stats(cpu["naive"], cpu["fast"])     # > 1: fast is faster
                        r["vs_naive"], r["vs_naive_noise"] = q, noise
                        r["met_naive"] = q >= 1 - noise
                    rows.append(r)
                    nv = (f"naive {us['naive']:6.2f} ({r['vs_naive']:.2f}x)" if naive is not None
                          else "naive      -")
                    print(f"{fmt:12} {r['dtype']:7} {direction:6} {nb:7d} B  copy {us['copy']:6.2f} us  "
                          f"fast {us['fast']:6.2f} (target {target:5.2f}: {'met' if r['met'] else 'NOT met'})  "
                          f"{nv}  no out= {us['alloc']:6.2f}  no kernel {us['nokernel']:6.2f}  "
                          f"[{r['choice']}]  {_host.load_line()}", flush=True)
    return rows


def run_large(reps: int, sizes=(16 << 20, 256 << 20)) -> list[dict]:
    rows = []
    for nbytes in sizes:
        r_reps = reps if nbytes <= 32 << 20 else max(3, reps // 2)
        for fmt in FORMATS:
            for dtype in DTYPES:
                rows += _large_case(fmt, dtype, nbytes, r_reps)     # its arrays are freed on return
    return rows


def _large_case(fmt: str, dtype, nbytes: int, reps: int) -> list[dict]:
    name, shape, kw, x, phys, back = _tensors(fmt, dtype, nbytes)
    nb = max(x.nbytes, phys.nbytes)
    a, b = aligned(nb, np.uint8, 1), aligned(nb, np.uint8, 0)
    rows = []
    for direction in ("pack", "unpack"):
        if direction == "pack":
            def fast(n):
                return lambda: F.pack(x, name, out=phys, threads=n, **kw)
        else:
            def fast(n):
                return lambda: F.unpack(phys, name, shape, out=back, threads=n, **kw)
        fast(1)()           # the first call builds (and tunes) the recipe; measure repeated ones
        peak = peak_alloc(fast(1)) if nbytes <= 32 << 20 else None
        fns = {"copy": lambda: np.copyto(b, a), "t1": fast(1), "t2": fast(2), "nokernel": no_kernel(fast(1))}
        naive = _naive(name, kw, direction, x, phys, shape, dtype)
        if naive is not None:
            fns["naive"] = naive
        cpu, wall = rounds(fns, reps)
        q, noise = ratio_stats(cpu["copy"], cpu["t1"])
        ratio = {"cpu1": q, "noise": noise,
                 "t1": med(wall["copy"]) / med(wall["t1"]), "t2": med(wall["copy"]) / med(wall["t2"]),
                 "nokernel": med(cpu["copy"]) / med(cpu["nokernel"])}
        r = {"part": "large", "fmt": fmt, "dtype": np.dtype(dtype).name, "dir": direction,
             "shape": shape, "bytes": nb, "copy_gbs": nb / med(cpu["copy"]) / 1e9, "ratio": ratio,
             "met1": q >= 0.6 - noise, "met2": ratio["t2"] >= 1.0, "peak": peak, "load": load(),
             "choice": _choice(x.shape if direction == "pack" else phys.shape, direction == "unpack", dtype)}
        if naive is not None:
            ratio["naive"] = med(cpu["copy"]) / med(cpu["naive"])
            vq, vn = ratio_stats(cpu["naive"], cpu["t1"])
            r["vs_naive"], r["met_naive"] = vq, vq >= 1 - vn
        rows.append(r)
        pk = "-" if peak is None else f"{peak / 2**20:.2f} MiB"
        nv = f"naive {ratio['naive']:4.2f}" if naive is not None else "naive    -"
        print(f"{fmt:12} {r['dtype']:7} {direction:6} {nb / 2**20:6.1f} MiB  copy "
              f"{r['copy_gbs']:5.2f} GB/s  CPU ratio {q:4.2f} ± {noise:4.2f}  {nv}  wall 1 thread "
              f"{ratio['t1']:4.2f}  2 threads {ratio['t2']:4.2f}  no kernel {ratio['nokernel']:4.2f}  "
              f"[{r['choice']}]  alloc {pk}  {_host.load_line()}", flush=True)
    return rows


def kernel_first_use() -> str:
    """Build the kernel from scratch in a temporary cache (the first-use cost), then load it from the
    real cache; a one-line description for the README."""
    import tempfile

    if not _fastcopy.KERNEL_ENABLED:
        return "compiled kernel disabled (NPU_DEPLOY_KERNEL=0)"
    old = os.environ.get("NPU_DEPLOY_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NPU_DEPLOY_CACHE"] = tmp
        _fastcopy._reset_kernel()
        t0 = time.perf_counter()
        ok = _fastcopy._kernel_fn() is not None
        first = time.perf_counter() - t0
        info = _fastcopy.kernel_info()
    if old is None:
        os.environ.pop("NPU_DEPLOY_CACHE", None)
    else:
        os.environ["NPU_DEPLOY_CACHE"] = old
    _fastcopy._reset_kernel()
    t0 = time.perf_counter()
    _fastcopy._kernel_fn()
    cached = time.perf_counter() - t0
    if not ok:
        return f"compiled kernel unavailable ({info['reason']}): numpy/onnxruntime paths"
    cc = _fastcopy._find_cc()
    import subprocess
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    return (f"compiled kernel: first use {first:.2f} s (compile {info['compile_seconds']:.2f} s with "
            f"`{ver}`, -O3, no -march; block transposes {_fastcopy.kernel_info()['isa']}, runtime dispatch), "
            f"later processes {1000 * cached:.1f} ms (load from the cache)")


def machine() -> str:
    return (f"{_host.describe()}; numpy {np.__version__}; fast-copy threads {_fastcopy._threads()}")


def _size(nb: int) -> str:
    return f"{nb / 2**20:.0f} MiB" if nb >= 1 << 20 else f"{nb / 1024:.0f} KiB" if nb >= 1024 else f"{nb} B"


def _row_key(fmt_shape: str, dtype: str, direction: str, size: str) -> tuple:
    return (fmt_shape.strip(), dtype.strip(), direction.strip(), size.strip())


def documented(path: Path) -> dict:
    """The figures a README written by this script documents: {row key: (value, noise, low, high)}
    for the throughput rows' CPU ratio ("0.95 ± 0.04", or "0.95 ± 0.04 (runs 0.80–1.10)" when the
    row was measured in several processes: low and high are the runs' extremes; a single run's
    are its value)."""
    out: dict = {}
    if not path.is_file():
        return out
    part = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("### "):
            part = line
        if part and part.startswith("### Throughput") and line.startswith("| ") and "±" in line:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            m = re.match(r"([0-9.]+)\s*±\s*([0-9.]+)(?:\s*\(runs ([0-9.]+)[–-]([0-9.]+)\))?", cells[5])
            if m:
                v, n = float(m.group(1)), float(m.group(2))
                lo, hi = (float(m.group(3)), float(m.group(4))) if m.group(3) else (v, v)
                out[_row_key(*cells[:4])] = (v, n, lo, hi)
    return out


def check(small: list[dict], large: list[dict], doc: dict) -> list[str]:
    """What is off: a target missed by more than the row's noise, or a documented figure the new
    measurement differs from by more than both noises together and a floor: 15 % when the row was
    measured on a quiet host, 30 % when not (between two runs at load 10-25 on 2 cores the same row
    moved by up to 30 %, far more than its within-run noise: other jobs change the caches and the
    memory bandwidth left, and the recipe's choice is timed under that load too)."""
    bad = []
    for r in small:
        if "met_naive" in r and not r["met_naive"]:
            bad.append(f"per call {r['fmt']} {r['dtype']} {r['dir']} {_size(r['bytes'])}: "
                       f"{r['vs_naive']:.2f}x the plain numpy expression (slower)")
    for r in large:
        q = r["ratio"]
        name = f"{r['fmt']} {r['dtype']} {r['dir']} {_size(r['bytes'])}"
        if not r["met1"]:
            bad.append(f"{name}: {q['cpu1']:.2f} ± {q['noise']:.2f} of a copy in CPU time (target 0.60)")
        if "met_naive" in r and not r["met_naive"]:
            bad.append(f"{name}: slower than the plain numpy transpose ({r['vs_naive']:.2f}x)")
        key = _row_key(f"{r['fmt']} {list(r['shape'])}", r["dtype"], r["dir"], _size(r["bytes"]))
        if key in doc:
            v, n, lo, hi = doc[key]
            floor = 0.15 if _host.is_quiet(r.get("load", 0.0)) else 0.30
            x = q["cpu1"]
            if x < lo - max(n + q["noise"], floor * lo) or x > hi + max(n + q["noise"], floor * hi):
                runs = f" (runs {lo:.2f}–{hi:.2f})" if (lo, hi) != (v, v) else ""
                bad.append(f"{name}: README documents {v:.2f} ± {n:.2f}{runs}, measured {x:.2f} ± "
                           f"{q['noise']:.2f}")
    return bad


def _cpu_cell(r: dict) -> str:
    q = r["ratio"]
    runs = r.get("runs")
    extra = f" (runs {min(runs):.2f}–{max(runs):.2f})" if runs and len(runs) > 1 else ""
    return f"{q['cpu1']:.2f} ± {q['noise']:.2f}{extra}"


def more_runs(large: list[dict], k: int, reps: int, sizes: tuple[int, ...]) -> None:
    """Measure the throughput rows of ``sizes`` again in ``k`` fresh processes and record every run's
    CPU ratio in ``row["runs"]`` (this process's first). Between processes a 16 MiB row moves by far
    more than its within-run noise (up to ±30 % with the same variant and buffer offsets: where the
    pages landed physically, see the notes below), so the README documents the runs' range and the
    check holds a new run against what repeats, not against one process's luck."""
    import json
    import subprocess
    import tempfile

    for r in large:
        r["runs"], r["run_choices"] = [r["ratio"]["cpu1"]], [r["choice"]]
    if k <= 0:
        return
    index = {(r["fmt"], r["dtype"], r["dir"], r["bytes"]): r for r in large}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(k):
            out = Path(tmp) / f"run{i}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--large-only", "--no-check", "--reps", str(reps),
                   "--sizes", ",".join(str(s >> 20) for s in sizes), "--json", str(out)]
            print(f"== another process ({i + 2} of {k + 1}): {' '.join(cmd[1:])}", flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
                raise SystemExit(f"bench_formats: the run in another process exited {done.returncode} (above)")
            for row in json.loads(out.read_text(encoding="utf-8")):
                mine = index.get((row["fmt"], row["dtype"], row["dir"], row["bytes"]))
                if mine is not None:
                    mine["runs"].append(row["ratio"]["cpu1"])
                    mine["run_choices"].append(row["choice"])


def markdown(small: list[dict], large: list[dict], info: str, reps: int, argv: str,
             bad: list[str]) -> str:
    lines = [
        "## Formats: pack / unpack speed",
        "",
        f"`python benchmarks/{argv}` ({datetime.date.today().isoformat()}; {reps} interleaved rounds, "
        f"medians of process CPU time). Host: {info}. *load* is the 1-minute load average when the "
        f"row was measured.",
        "",
        "### Per call (small tensors)",
        "",
        "Microseconds of process CPU time per call (median of the rounds). *fast*: `pack`/`unpack` into "
        "a reused `out=` buffer (the emulator's case); *naive*: the plain numpy expression of the same "
        "layout (`reshape` + `transpose` + `ascontiguousarray`, `np.pad` only where the shape needs "
        "padding); *vs naive*: naive time / fast time (≥ 1: fast is not slower); *path*: what the "
        "recipe chose when it was built (`views`: the plain numpy assignment bound to the buffers, "
        "`gather`: one `np.take`); *no out=*: allocating the result; *no kernel*: "
        "`NPU_DEPLOY_KERNEL=0`; *copy*: `np.copyto` of the same bytes. Target: fast <= 3 x copy + 5 us "
        "and never slower than naive.",
        "",
        "| format | dtype | dir | bytes | copy us | fast us | naive us | vs naive | path | target us | met | "
        "no out= us | no kernel us | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|",
    ]
    for r in small:
        us = r["us"]
        nv = f"{us['naive']:.2f}" if "naive" in us else "–"
        vs = f"{r['vs_naive']:.2f}" if "vs_naive" in r else "–"
        lines.append(f"| {r['fmt']} {list(r['shape'])} | {r['dtype']} | {r['dir']} | {_size(r['bytes'])} | "
                     f"{us['copy']:.2f} | {us['fast']:.2f} | {nv} | {vs} | {r['choice']} | {r['target']:.2f} | "
                     f"{'yes' if r['met'] else '**no**'} | {us['alloc']:.2f} | {us['nokernel']:.2f} | "
                     f"{r['load']:.2f} |")
    lines += [
        "",
        "### Throughput (large tensors)",
        "",
        "*CPU*: single-thread `np.copyto` of the same bytes / `threads=1` call, in process CPU time "
        "(median of the per-round ratios ± half their interquartile range; *runs*: the lowest and "
        "highest of the same row measured in separate processes, which is what a new run is held "
        "against, widened by that noise and 15 %, 30 % on a loaded host); "
        "*naive*: the same ratio for the plain numpy expression (NC1HWC0, FRACTAL_Z, FRACTAL_NZ); "
        "*variant*: what the recipe chose on its first call (`formats._tune`: `st`/`nt` ordinary or "
        "streaming stores, `a` tile depth in bytes, `r` npd_tile3 r-chunk, `recorded` the default, "
        "`numpy` the plain numpy path); *wall 1 / 2 threads*: wall-clock ratios (indicative only when "
        "the host is not quiet); *no kernel*: `NPU_DEPLOY_KERNEL=0`, CPU ratio. Target: CPU ≥ 0.60 and "
        "not below naive (✗: missed by more than the noise). *alloc*: bytes tracemalloc saw allocated "
        "during a repeated call with `out=` (16 MiB rows).",
        "",
        "| format | dtype | dir | size | copy GB/s | CPU | naive | variant | wall 1 thread | 2 threads | "
        "no kernel | alloc | load |",
        "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in large:
        q = r["ratio"]
        pk = "–" if r["peak"] is None else f"{r['peak']} B"
        nv = f"{q['naive']:.2f}" if "naive" in q else "–"
        ok = r["met1"] and r.get("met_naive", True)
        lines.append(f"| {r['fmt']} {list(r['shape'])} | {r['dtype']} | {r['dir']} | {_size(r['bytes'])} | "
                     f"{r['copy_gbs']:.2f} | {_cpu_cell(r)}{'' if ok else ' ✗'} | {nv} | "
                     f"{r['choice']} | {q['t1']:.2f} | {q['t2']:.2f} | {q['nokernel']:.2f} | {pk} | "
                     f"{r['load']:.2f} |")
    n_small = sum(r["met"] for r in small)
    n_naive = sum(r.get("met_naive", True) for r in small)
    n1 = sum(r["met1"] for r in large)
    n1n = sum(r.get("met_naive", True) for r in large)
    lines += ["", f"Summary of this run: per-call target met in {n_small} of {len(small)} rows, not slower "
                  f"than naive in {n_naive} of {len(small)}; large tensors ≥ 0.6 of a copy in CPU time in "
                  f"{n1} of {len(large)} rows, not slower than naive in {n1n} of {len(large)}."]
    if bad:
        lines += ["", "Off in this run (the benchmark exits 1):", ""] + [f"* {b}" for b in bad]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="4 KiB and 16 MiB only (about a minute)")
    ap.add_argument("--large-only", action="store_true")
    ap.add_argument("--write", action="store_true", help="write benchmarks/README-formats.md")
    ap.add_argument("--no-check", action="store_true",
                    help="exit 0 even when a target or a documented figure is off")
    ap.add_argument("--runs", type=int, default=1, metavar="K",
                    help="measure the 16 MiB throughput rows in K processes in all and document their range")
    ap.add_argument("--sizes", default=None, metavar="MIB,...",
                    help="throughput sizes in MiB (default: 16, and 256 without --quick)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the throughput rows as JSON")
    args = ap.parse_args(argv)
    info = machine()
    print(info)
    kinfo = kernel_first_use()
    print(kinfo)
    info += "; " + kinfo
    doc = documented(HERE / "README-formats.md")
    small = [] if args.large_only else run_small(args.reps, (4096,) if args.quick else (4096, 65536))
    if args.sizes:
        try:
            sizes = tuple(int(v) << 20 for v in args.sizes.split(",") if v.strip())
        except ValueError:
            ap.error(f"--sizes {args.sizes!r}: whole MiB separated by commas, e.g. 16,256")
    else:
        sizes = (16 << 20,) if args.quick else (16 << 20, 256 << 20)
    large = run_large(args.reps, sizes)
    if args.json is not None:
        import json

        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "peak"} for r in large]),
                             encoding="utf-8")
    more_runs(large, args.runs - 1, args.reps, tuple(s for s in sizes if s <= 32 << 20))
    for r in large:
        if len(r["runs"]) > 1:
            print(f"{r['fmt']:12} {r['dtype']:7} {r['dir']:6} {_size(r['bytes']):>7}  CPU ratio over "
                  f"{len(r['runs'])} processes: " + " ".join(f"{v:.2f} [{c}]" for v, c in zip(r["runs"], r["run_choices"])))
    info += "; at the end: " + _host.load_line()
    bad = check(small, large, doc)
    cmd = "bench_formats.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = markdown(small, large, info, args.reps, cmd.strip(), bad)
    if args.write:
        from npu_deploy._io import atomic_write

        with atomic_write(HERE / "README-formats.md", "w", encoding="utf-8") as f:
            f.write(text + NOTES)
        print(f"wrote {HERE / 'README-formats.md'}")
    print(_host.describe())
    if bad:
        print(f"FAILED: {len(bad)} figure(s) off:", file=sys.stderr)
        for line in bad:
            print(f"  {line}", file=sys.stderr)
        return 0 if args.no_check else 1
    print("all figures within their targets and documented values")
    return 0


NOTES = """
### How the fast path chooses

**Per recipe, measured on the host.** The first `pack`/`unpack` with a given signature builds a
*recipe*. For tensors of at least 1 MiB the recipe records its compiled-kernel program and then
times, on that first call's own buffers and in process CPU time, the program's variants side by
side: ordinary or streaming (non-temporal) stores, a 256- or 2048-byte tile depth along the
destination's inner axis, for FRACTAL_Z's `npd_tile3` the r-chunk loop order, and the plain numpy
assignment of the same layout. The fastest is kept for every later call (the *variant* column;
`NPU_DEPLOY_TUNE=0` keeps the recorded default). Every variant writes the same bytes (checked
against the oracle in `tests/converters/formats/test_formats_tuning.py`), so the first call's
output is complete whichever ran last; it costs that call about one run per variant (1-3 rounds,
fewer for larger tensors). Why measured and not fixed: the best choice depends on the host's
write-combining buffers, caches and prefetchers. On this host NC1HWC0 fp16 unpack at 16 MiB runs at
0.16-0.3 of a copy with streaming stores (the default before, chosen on an AMD EPYC) and 1.0-1.4
with ordinary stores and deeper tiles; NC1HWC0 fp16 pack the other way round.

**Timed as a repeated call runs** (new). Below 48 MiB each candidate runs once untimed right
before its timed run, so it finds the output as the next call will: written by the same program.
Timed straight after another variant, it found that variant's dirty lines in the caches: ordinary
stores hit them and streaming stores first had to evict them. So the tuner kept, in one process or
another, variants that then ran at 0.4-0.6 of a copy where another ran at 0.8-1.2 (16 MiB,
FRACTAL_Z int8 unpack: `st-a256-r128` 0.39-0.45 kept in 3 of 4 processes, `st-a256-r0` 0.7-1.0;
FRACTAL_NZ fp16 pack: `st-a2048-r0` 0.75-0.8 kept, `nt-a2048-r0` 1.3-1.5). Dropping the output from
the caches before each timing (clflush) was tried too: it is the state of a first call, not of the
repeated ones, and it kept streaming-store variants that ran at 0.6 where ordinary stores ran at 1.0.
With the untimed run all 30 rows at 16 MiB kept the same variant in each of 4 processes (one
quick run with `--runs 4`), 27 of 30 in the full run's 5 (FRACTAL_Z fp32 and int8 pack, grouped fp16
pack: one process each kept another variant, before 13 of 30 rows differed).

**Between processes.** The same code, the same variant, the buffers at the same offsets (the
script places every large buffer 16 bytes past a page, as numpy's mmap'd arrays are): a 16 MiB row
still moves by up to ±30 % from one process to the next (NDC1HWC0 fp16 pack 0.50-0.95 with the
`recorded` program each time; no transparent huge pages on this host, so not those). What differs
is where the pages landed physically, which decides how the strided streams share cache sets: no
process controls it. The 16 MiB rows are therefore measured in five processes (`--runs 5`), the
*runs* range is documented beside the first process's figure, and a new run is held against that
range (widened by the noise and 15 %).

**Not yet reliable: the 16 MiB self-check across host states.** Three `--quick` runs at 11:18–11:19 UTC
(load 0.1–0.5, the same tree as the full run above) each exited 1, on 7, 3 and 11 rows, all *below* the
documented ranges (FRACTAL_NZ int8 pack 0.74–0.93 against runs 1.44–1.56). In those runs `np.copyto`
itself ran at 9–14 GB/s where the documented run had it at 7–9: the host's memory system was in another
state (this is a VM; its neighbours are not visible here), and at 16 MiB, half inside the last-level
cache, the copy gained more than the kernels did. NDC1HWC0 fp16 / fp32 pack fell to 0.45–0.56 of a copy
there, **under the 0.6 target**. Five processes measured in one host state do not cover another; the
check is right to report it, and these rows are open work (issue 22 item 1), not noise to widen away.

**Small calls.** A recipe of at most 8,192 index entries and 64 KiB binds a runner to the call's
`x` and `out` (weak references plus the runner): a repeated call with the very same arrays (the
emulator converting into reused buffers) checks their identity, shape, dtype and writeability and
runs it. The first binding times the recipe's two ways, the `np.take` gather through its index map
and the plain numpy assignment between precomputed views (the *path* column), and keeps the faster.
Calls with new arrays each time, or without `out=`, take the gather as before. The binding keeps its
two (small) arrays alive until the next binding of that recipe.

**Large tensors** (`converters/formats/_copykernel.c`): SSE2 register transposes for 1-, 2- and
4-byte elements, contiguous runs of up to 64 bytes as one unit, cache tiles, optional streaming
stores, and `npd_tile3` for FRACTAL_Z's many small `C0 x H·W` blocks to and from long runs (with an
r-chunk loop order as a variant: rc consecutive r for every outer index, rc = 1 line, 8, 128 or 255,
and the staged walk for tensors beyond the caches, rc = 4, 8 or 32: see below).
Where the CPU reports AVX2 (runtime dispatch: per-function `target("avx2")`, the file itself built
without `-march`, so the same shared object runs on any x86-64), FRACTAL_Z's fp16 (16 x H·W) and int8
(32 x H·W) blocks and int8 NC1HWC0 pack use AVX2 transposes of twice the width: two source rows per
register (one per 128-bit lane), one in-lane 8x8 / 16x8 transpose per 8 columns giving whole 32-byte
runs, and for 3x3 kernels the ninth column assembled from loads and blends (no shuffles) instead of
element by element. `NPU_DEPLOY_KERNEL_ISA=sse2` keeps the baseline; `test_copykernel_isa.py` checks
both paths byte for byte.

### What is met, what is not, and why

Read the tables with the host line: the 2 cores were shared with other jobs (load well above 1 per
core), which disturbs CPU-time ratios too (shared caches and memory bandwidth), though far less than
wall time. The summary and the "off" list under the tables are this run's.

* **Per call** (the counts are in the summary line under the tables): the plain numpy expression
  was 2-3x faster than `pack`/`unpack(out=...)` at 4 KiB before, because every call paid key
  building and argument checks that a bound runner now skips. A 64 KiB row is past the gather size:
  its choice between the kernel program and the views is measured once, so a loaded host can leave
  it below naive (NC1HWC0 fp32 unpack at 0.81x in an earlier run at load 10 per core).
* **Large tensors** (counts in the summary line; every row faster than the plain numpy
  expression in the runs so far, typically 2-10x). What the AVX2 transposes
  changed, 16 MiB, same host: FRACTAL_Z fp16 pack 0.48 -> 0.68, unpack 0.51 -> 0.87, int8 pack 0.38
  -> 0.65, unpack 0.55 -> 0.60; grouped FRACTAL_Z fp16 pack 0.47 -> 0.87, int8 pack 0.37 -> 0.85;
  NC1HWC0 int8 pack -> 0.72. Why it was the shuffles and not (only) the access pattern: the same
  288-byte block reads and 32-byte run writes moved *without* transposing run at ~0.75 of a copy at
  16 MiB, the SSE2 kernel at ~0.5, its in-cache rate (~17 GB/s fp16, ~8 GB/s int8) adding to the
  memory time rather than hiding under it; AVX2 raises the in-cache rate to ~27 / ~15 GB/s (C
  harness over the kernel file, CPU time). Prefetch distances (8-64 blocks) and n-tiles at 16 MiB
  changed nothing beyond the noise.
* **256 MiB: what changed, what is still not met.** Beyond the caches the transposes are bound by
  how their memory traffic looks, not by instructions. Three findings, each measured in a C harness
  over the kernel file and then through the recipes (CPU time, side by side with the copy):
  * *FRACTAL_Z pack: the staged walk.* With r innermost every (n, b) wrote one 32-byte piece of a
    run: half lines, read for ownership, scattered over 2,016 runs (0.14-0.28 of a copy). The
    staged walk (`npd_tile3` dir bit 3, variants `nt-…-rN-staged`) reads the NCHW weight row by row
    (rc rows per tile, all c1), transposes each tile into a buffer in L1 and streams every run's
    piece out in whole lines: aligned buffers 0.70-0.73 at rc 8.
  * *Misaligned outputs.* numpy's large arrays start 16 bytes past a page, so every piece began and
    ended inside a line; streaming those partial lines, or storing them normally, fell back to
    0.16-0.43. Carrying each run's pending bytes to the next tile (a line writer per run) wrote only
    whole lines but its 2,016 states were slower to touch than the lines they saved (0.45). What the
    kernel does: each tile stages again the one or two r before its own (the bytes of the line it
    shares with the previous tile) and writes exactly the whole lines it completes: 0.61-0.65 with
    the output 16 bytes off (+25 % transposes at rc 8, which cost less than the traffic).
  * *4K aliasing.* A load from the staging buffer whose low 12 address bits match a streaming store
    just issued waits for it: with the buffer at one offset the same walk ran at 0.45, at others at
    0.63-0.66. The buffer is placed 512 bytes (mod 4096) past the destination piece it feeds.
  * *int8 NC1HWC0 / NDC1HWC0 pack:* the destination tile is one contiguous run but no register
    transpose could stream it (8-byte stores); it is now transposed into an L2 buffer and streamed
    out in whole lines (0.42 -> 0.60-0.61).
  * **Still under 0.6 at 256 MiB** (see the table): the FRACTAL_Z unpacks (plain and grouped,
    0.33-0.45), NC1HWC0 / NDC1HWC0 int8 unpack (~0.5), FRACTAL_Z fp32 / int8 and grouped fp16 /
    int8 pack (0.5-0.6). The unpacks read the run side in pieces of rc x C0 from B x oc runs per
    tile; the staged unpack (pieces gathered into L1 with the next tile's prefetched, blocks
    transposed into a second buffer, block rows streamed with carried lines) reached 0.42-0.47
    against 0.35-0.37 before; larger tiles (to 255 r, 128 KiB buffers), direct transposes from the
    runs and other prefetch distances did not do better. Staging NC1HWC0 unpack's far-apart rows
    through L2 was slower than ordinary stores (0.43 against 0.60) and is not kept.
* **On an AMD EPYC Zen 3 host** (the issue's host kind: family 25 model 1, 2 cores, L2 512 KiB per
  core, L3 32 MiB, AVX2/F16C, no AVX-512; the previous tree's tables were from it, 14:09-14:16 UTC;
  the tables above are from a Zen 4, see the next point).
  The figures measured on the Intel Xeon host before do not carry over: the first quick run here
  (12:39 UTC, the tree of the previous session) had 70 rows off their documented figures, at 16 MiB
  and 256 MiB alike; FRACTAL_Z rows at 0.2-0.5 of a copy, NC1HWC0 / NDC1HWC0 int8 pack 0.31-0.49.
  What is different, measured in a C harness over the kernel file (CPU time): one core *reads* at
  ~9.4 GB/s (sequential), and `np.copyto` (8-10 GB/s) is bound by that, while streaming stores
  write at 18-20 GB/s, 12-17 GB/s in 256-1,024-byte pieces scattered over 2,016 runs. Reading
  288-byte strips from rows 64 KB apart (FRACTAL_Z's blocks, one per (n, c1)) runs at ~5 GB/s,
  9 KiB strips at ~8.8. So here the FRACTAL_Z kernels are bound by how they *read*: the staged pack
  read its rc rows 288 bytes at a time each, interleaved with the writes (0.33 of a copy), and
  the transposes and the writes do not overlap (reads alone 0.6-0.8 of a copy, writes alone 1.3-1.6,
  together 0.41-0.44). Huge pages (granted here under `madvise`, as numpy asks for large arrays)
  changed nothing; padding the staging rows off one cache set, tile shapes from 1 x 8 to 64 x 64
  blocks and a prefetch of the next tile did not either (0.3-0.47).
  * *Whole rows* (new variant, `nt-…-rN-staged-whole`, `npd_tile3` dir bit 4): the pack stages a
    tile's rc rows for *all* c1 before it writes any run piece, each source row read through from
    start to end. Side by side through the recipes on [4096, 3584, 3, 3] at 256 MiB (host loaded by
    another job, load 2-3): fp16 pack 0.35-0.58 of a copy against 0.33-0.41 for the best of the
    previous variants, int8 0.47-0.48 against 0.41-0.44, fp32 0.33-0.50 against 0.28-0.47. The
    tuner keeps it only where it wins: in the full run of the tables above (14:09-14:16 UTC) it was
    kept for 10 of the 12 FRACTAL_Z rows at 256 MiB in the first process (the unpacks take its
    staged walk with 16 or 32 r), and FRACTAL_Z pack there ran at 0.40-0.48 of a copy (0.32-0.39 in
    the first run of the day); still **under 0.6**.
  * That full run: 33 of 60 rows ≥ 0.6 (the summary line). At 16 MiB most rows hold (FRACTAL_Z fp16
    pack 0.96 where the morning's quick run had 0.40: the same host in another state, as on the
    Intel host). At 256 MiB only NC1HWC0 / NDC1HWC0 fp16 and fp32 pack and FRACTAL_NZ fp32 unpack
    reach 0.6: every 256 MiB unpack, every int8 pack and every FRACTAL_Z row stays under it here.
  * The unpacks (0.3-0.35 here) write NCHW rows and read the runs in rc x C0 pieces: the same
    reading problem the other way round, not solved in this tree.
* **On an AMD EPYC Zen 4 host** (new, the tables above: family 25 model 17, 2 cores, L2 1 MiB per
  core, L3 32 MiB, AVX-512 present but the kernel's widest path is AVX2; `np.copyto` 7-14 GB/s, its
  rate moving by up to 2x between processes minutes apart: a VM whose neighbours share the memory
  system). The same `model name` as the Zen 3 host: `_host.kind` tells them apart by L2 size.
  * First quick run (18:49 UTC, the previous tree): 6 rows under 0.6 at 16 MiB, other ones than on
    the Zen 3: NC1HWC0 / NDC1HWC0 int8 pack 0.44 / 0.54, FRACTAL_Z fp32 / int8 unpack 0.51 / 0.42,
    grouped int8 unpack 0.55, FRACTAL_NZ fp16 unpack 0.49.
  * *int8 NC1HWC0 / NDC1HWC0 pack, row staging* (new). A tile reads 32 channel planes H*W bytes
    apart; at H*W = 32,768 they are 32 KiB apart, so every plane's line falls into the same L1 set
    and 8 ways cannot hold 32 of them: the transpose refetched each line up to 4 times. Now each
    plane's 2,048-byte piece of the tile is read through in one burst into a row buffer whose row
    stride (2,112 bytes) is no multiple of 4,096, and 32 x 8 AVX2 transposes from there give 8
    whole 32-byte runs each, streamed out from the registers (16-byte halves when the output is,
    as numpy's large arrays are, 16 bytes into a line; 1,024- and 4,096-byte pieces and a prefetch
    of the next piece measured no better). C harness over the built kernel, cache flushed between
    rounds: 0.42-0.48 of a copy -> 0.60-0.70 (32-byte aligned output) / 0.60-0.64 (16-byte); through
    the recipes, side by side with the previous kernel in one script: 16 MiB 0.44-0.48 -> 0.57-0.64,
    256 MiB 0.47 -> 0.58. In the full run above NC1HWC0 int8 pack is 0.55 at 256 MiB, still just
    under 0.6, and NDC1HWC0's 0.74.
  * The full run (--runs 5, 19:29-19:37 UTC, load 0.1-1.3): **50 of 60 rows >= 0.6**, 27 of 30 at
    16 MiB (FRACTAL_Z fp16 / fp32 / int8 unpack 0.53-0.56 missing), 23 of 30 at 256 MiB. Missing at
    256 MiB: the FRACTAL_Z unpacks (0.47-0.56; grouped fp32 0.71 makes it), NC1HWC0 int8 pack 0.55,
    NDC1HWC0 int8 unpack 0.53, FRACTAL_NZ int8 unpack 0.54. The FRACTAL_Z unpack's winner here
    (`st-a256-r0`: r innermost, ordinary stores) writes 288-byte block rows 64 KB apart, one per
    (n, c1), so the line it shares with the next c1's block is read for ownership twice, passes of
    1.2 MB apart (beyond L2): three memory passes against the copy's two. The whole-row unpack
    (a tile's rows complete in a buffer, streamed out) reads the runs in rc x 32-byte pieces
    instead, the read-side strip problem of the Zen 3 host. Built and measured after this run, not
    kept: with tiles of rc = 8-32 rows it was slower (fp16 [4096, 3584, 3, 3]: 45-60 ms against
    41-47 ms for `st-a256-r0`); with 128-255 rows and c1 chunks of a 256 KiB buffer 33-38 ms,
    against 33-47 ms for the others from process to process, and through the benchmark's rows the
    tuner did not keep it (fp16 0.51-0.58, int8 0.39-0.46: no better than above). The same for
    staging NC1HWC0 / NDC1HWC0 int8 unpack's 32 destination planes through a row buffer (16 MiB
    0.60-0.66 -> 0.64-0.72, 256 MiB 0.52-0.61 -> 0.54-0.69, inside the process-to-process noise).
* **2 threads**: reported (wall clock), not a target of this run: with the load above 1 per core
  the helper thread mostly waits for a core.

Exactness: every path (gather, bound views, every kernel variant, streaming stores, threads, the
no-kernel fallback, the plain derived interpreter) is checked byte for byte against the independent
oracle (`test_formats_oracle.py`, `test_formats_tuning.py`) and against each other
(`test_formats_recipe.py`, `test_formats_fastcopy.py`, `test_copykernel.py`); the SSE2 and AVX2
kernel paths, each forced, in `test_copykernel_isa.py`.
"""

if __name__ == "__main__":
    sys.exit(main())
