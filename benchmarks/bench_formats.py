"""Pack/unpack throughput of the format algebra, against the memory-bandwidth ceiling.

For NC1HWC0, FRACTAL_Z and FRACTAL_NZ on >= 16 MiB float16 tensors, measure in one run, interleaved
(so machine load hits every variant alike), the best of ``--reps`` timings of:

* ``np.copyto`` of the same number of bytes into a preallocated buffer (the ceiling);
* ``formats.pack`` / ``formats.unpack`` writing into a preallocated ``out=`` (the fast path);
* the same with the fast copy disabled (the plain derived path: ``dst[...] = src`` per piece);
* a naive numpy implementation: ``np.pad`` + ``reshape`` + ``transpose`` + ``ascontiguousarray``.

It also records, with ``tracemalloc``, the peak memory one ``pack``/``unpack`` call allocates (without
``out=``), as a multiple of the output size. Writes ``benchmarks/README-formats.md`` (``--write``).

    python benchmarks/bench_formats.py --write
    python benchmarks/bench_formats.py --quick          # small tensors, a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from npu_deploy.converters import _fastcopy
from npu_deploy.converters import formats as F

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------ naive implementations
def ceil(a: int, b: int) -> int:
    return -(-a // b)


def naive_pack(x: np.ndarray, fmt: str, c0: int = 16) -> np.ndarray:
    """Pad, reshape, transpose, copy: the straightforward numpy way."""
    if fmt == "NC1HWC0":
        n, c, h, w = x.shape
        p = np.pad(x, ((0, 0), (0, ceil(c, c0) * c0 - c), (0, 0), (0, 0)))
        return np.ascontiguousarray(p.reshape(n, -1, c0, h, w).transpose(0, 1, 3, 4, 2))
    if fmt == "FRACTAL_Z":
        n, c, h, w = x.shape
        p = np.pad(x, ((0, ceil(n, 16) * 16 - n), (0, ceil(c, c0) * c0 - c), (0, 0), (0, 0)))
        y = p.reshape(-1, 16, ceil(c, c0), c0, h, w).transpose(2, 4, 5, 0, 1, 3)
        return np.ascontiguousarray(y).reshape(ceil(c, c0) * h * w, -1, 16, c0)
    if fmt == "FRACTAL_NZ":
        m, n = x.shape[-2:]
        pad = [(0, 0)] * (x.ndim - 2) + [(0, ceil(m, 16) * 16 - m), (0, ceil(n, c0) * c0 - n)]
        p = np.pad(x, pad)
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


# ------------------------------------------------------------------------------ measurement
def best_of(fns: dict, reps: int) -> tuple[dict, dict]:
    """Interleave the candidates rep by rep; keep each one's best wall time and best CPU time
    (process time, all threads) in seconds. CPU time is the robust figure on a shared machine."""
    best = {k: float("inf") for k in fns}
    cpu = {k: float("inf") for k in fns}
    for f in fns.values():
        f()  # warm up: page in buffers, build plans
    for _ in range(reps):
        for k, f in fns.items():
            c0 = time.process_time()
            t0 = time.perf_counter()
            f()
            best[k] = min(best[k], time.perf_counter() - t0)
            cpu[k] = min(cpu[k], time.process_time() - c0)
    return best, cpu


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


def with_threads(n: int, fn):
    """Run ``fn`` with ``NPU_DEPLOY_THREADS=n`` (the single-thread figure)."""
    def run():
        old = os.environ.get("NPU_DEPLOY_THREADS")
        os.environ["NPU_DEPLOY_THREADS"] = str(n)
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop("NPU_DEPLOY_THREADS", None)
            else:
                os.environ["NPU_DEPLOY_THREADS"] = old
    return run


def with_fast(enabled: bool, fn):
    def run():
        old = _fastcopy.ENABLED
        _fastcopy.ENABLED = enabled
        try:
            return fn()
        finally:
            _fastcopy.ENABLED = old
    return run


CASES = {
    # name: (format, logical shape)  -- float16, each >= 16 MiB
    "NC1HWC0": ("NC1HWC0", (8, 64, 128, 128)),
    "FRACTAL_Z": ("FRACTAL_Z", (1024, 1024, 3, 3)),
    "FRACTAL_NZ": ("FRACTAL_NZ", (4096, 2048)),
}
QUICK = {
    "NC1HWC0": ("NC1HWC0", (2, 32, 32, 32)),
    "FRACTAL_Z": ("FRACTAL_Z", (64, 64, 3, 3)),
    "FRACTAL_NZ": ("FRACTAL_NZ", (256, 256)),
}


def run(cases: dict, reps: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for name, (fmt, shape) in cases.items():
        x = rng.standard_normal(shape).astype(np.float16)
        phys = np.empty(F.storage_shape(fmt, shape, x.dtype), x.dtype)
        back = np.empty_like(x)
        F.pack(x, fmt, out=phys)
        ref = naive_pack(x, fmt)
        assert ref.tobytes() == phys.tobytes(), f"{name}: naive and fast disagree"
        # the ceiling: copy the same bytes (the larger of logical and storage) between two buffers
        nb = max(x.nbytes, phys.nbytes)
        a = np.empty(nb, np.uint8)
        b = np.empty(nb, np.uint8)
        a[:] = 1
        b[:] = 2
        for direction in ("pack", "unpack"):
            if direction == "pack":
                fns = {
                    "copy": lambda: np.copyto(b, a),
                    "fast": lambda: F.pack(x, fmt, out=phys),
                    "fast1": with_threads(1, lambda: F.pack(x, fmt, out=phys)),
                    "derived": with_fast(False, lambda: F.pack(x, fmt, out=phys)),
                    "naive": lambda: naive_pack(x, fmt),
                }
                peak = peak_alloc(lambda: F.pack(x, fmt))
                peak_out = peak_alloc(lambda: F.pack(x, fmt, out=phys))
                out_bytes = phys.nbytes
            else:
                fns = {
                    "copy": lambda: np.copyto(b, a),
                    "fast": lambda: F.unpack(phys, fmt, shape, out=back),
                    "fast1": with_threads(1, lambda: F.unpack(phys, fmt, shape, out=back)),
                    "derived": with_fast(False, lambda: F.unpack(phys, fmt, shape, out=back)),
                    "naive": lambda: naive_unpack(phys, fmt, shape),
                }
                peak = peak_alloc(lambda: F.unpack(phys, fmt, shape))
                peak_out = peak_alloc(lambda: F.unpack(phys, fmt, shape, out=back))
                out_bytes = back.nbytes
            t, cpu = best_of(fns, reps)
            gbs = {k: nb / v / 1e9 for k, v in t.items()}
            rows.append({
                "case": name, "direction": direction, "shape": shape, "mib": nb / 2**20,
                "copy_gbs": gbs["copy"], "fast_gbs": gbs["fast"], "derived_gbs": gbs["derived"],
                "naive_gbs": gbs["naive"], "fast_vs_copy": t["copy"] / t["fast"],
                "fast_vs_naive": t["naive"] / t["fast"], "derived_vs_copy": t["copy"] / t["derived"],
                "naive_vs_copy": t["copy"] / t["naive"], "fast1_vs_copy": t["copy"] / t["fast1"],
                "fast1_cpu_vs_copy": cpu["copy"] / cpu["fast1"] if cpu["fast1"] > 0 else float("nan"), "peak_x_out": peak / out_bytes,
                "peak_out_x_out": peak_out / out_bytes,
                "fast_cpu_vs_copy": cpu["copy"] / cpu["fast"] if cpu["fast"] > 0 else float("nan"),
                "derived_cpu_vs_copy": cpu["copy"] / cpu["derived"] if cpu["derived"] > 0 else float("nan"),
                "naive_cpu_vs_copy": cpu["copy"] / cpu["naive"] if cpu["naive"] > 0 else float("nan"),
            })
            r = rows[-1]
            print(f"{name:<11} {direction:<6} {r['mib']:6.1f} MiB  copy {r['copy_gbs']:5.2f} GB/s  "
                  f"fast {r['fast_gbs']:5.2f} GB/s ({100 * r['fast_vs_copy']:4.0f} % of copy, "
                  f"{r['fast_vs_naive']:4.1f}x naive; 1 thread {100 * r['fast1_vs_copy']:4.0f} %)  derived {100 * r['derived_vs_copy']:4.0f} %  "
                  f"naive {100 * r['naive_vs_copy']:4.0f} %  | CPU-time: fast {100 * r['fast_cpu_vs_copy']:4.0f} % "
                  f"derived {100 * r['derived_cpu_vs_copy']:4.0f} % naive {100 * r['naive_cpu_vs_copy']:4.0f} %  "
                  f"peak alloc {r['peak_x_out']:.2f}x out "
                  f"({r['peak_out_x_out']:.2f}x with out=)", flush=True)
    return rows


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return (f"{cpu}, {cores} cores, Python {platform.python_version()}, numpy {np.__version__}, "
            f"{platform.system()} {platform.release()}; load average at start {load}; "
            f"fast-copy threads {_fastcopy._threads()}")


def markdown(rows: list[dict], info: str, reps: int) -> str:
    lines = [
        "## Formats: pack / unpack throughput",
        "",
        f"`python benchmarks/bench_formats.py --write` ({datetime.date.today().isoformat()}, best of "
        f"{reps} interleaved runs). Machine: {info}.",
        "",
        "GB/s count the bytes moved (the larger of logical and storage size); \"% of copy\" is "
        "`np.copyto` of the same bytes between preallocated buffers, timed in the same loop. "
        "*fast* is the shipped path (`pack`/`unpack` with `out=`), *derived* the same piece "
        "decomposition with plain `dst[...] = src`, *naive* `np.pad` + `reshape` + `transpose` + "
        "`ascontiguousarray`. *CPU* compares process CPU time (all threads) instead of wall time: "
        "the per-core efficiency, robust to other jobs on the machine. Peak allocation is "
        "tracemalloc's peak during one call without `out=` (with `out=` in brackets), as a multiple "
        "of the output size.",
        "",
        "| format | dir | MiB | copy GB/s | fast GB/s | fast % of copy | fast × naive | derived % of copy "
        "| naive % of copy | fast 1-thread % of copy | CPU: fast / 1-thread / derived / naive % of copy "
        "| peak alloc × out |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} {list(r['shape'])} | {r['direction']} | {r['mib']:.1f} | {r['copy_gbs']:.2f} | "
            f"{r['fast_gbs']:.2f} | {100 * r['fast_vs_copy']:.0f} % | {r['fast_vs_naive']:.1f}× | "
            f"{100 * r['derived_vs_copy']:.0f} % | {100 * r['naive_vs_copy']:.0f} % | "
            f"{100 * r['fast1_vs_copy']:.0f} % | "
            f"{100 * r['fast_cpu_vs_copy']:.0f} / {100 * r['fast1_cpu_vs_copy']:.0f} / "
            f"{100 * r['derived_cpu_vs_copy']:.0f} / "
            f"{100 * r['naive_cpu_vs_copy']:.0f} % | {r['peak_x_out']:.2f} ({r['peak_out_x_out']:.2f}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="small tensors (smoke run)")
    ap.add_argument("--write", action="store_true", help="write benchmarks/README-formats.md")
    args = ap.parse_args(argv)
    info = machine()
    print(info)
    rows = run(QUICK if args.quick else CASES, args.reps)
    text = markdown(rows, info, args.reps)
    if args.write:
        from npu_deploy._io import atomic_write

        with atomic_write(HERE / "README-formats.md", "w", encoding="utf-8") as f:
            f.write(text + NOTES)
        print(f"wrote {HERE / 'README-formats.md'}")
    return 0


NOTES = """
### How the fast path works, and what limits it

`formats.pack`/`unpack` interpret the registry entry as a few rectangular pieces (full C0 blocks,
then the tail) and copy each piece between two strided views, writing straight into the one output
array (no padded intermediate; padding is zeroed in place, or the output is cleared in one contiguous
fill when it is mostly padding). `converters/_fastcopy.py` then speeds up each piece copy with numpy
alone: it merges contiguous axes, moves whole contiguous C0 rows as `np.take` gathers of 16–64-byte
blocks (FRACTAL_NZ, 1×1 FRACTAL_Z), loops over a short C0 axis in Python so that numpy's inner loop
runs along the long, source-contiguous H·W axis (NC1HWC0 pack), cuts the work into ~1 MiB tasks and,
when the machine has an idle core, runs them on a small thread pool (numpy releases the GIL while
copying). Below 512 Ki elements it is a plain `dst[...] = src` (the Python overhead would dominate).

**Result: the ≥ 50 % of copy bandwidth target is not met.** Per core (CPU-time column) the shipped
path reaches about 20–30 % of `np.copyto`; it is 1.5–3× the naive pad + transpose for NC1HWC0 and
FRACTAL_NZ packing and on par (±10 % CPU time) with plain numpy elsewhere (numpy already picks a good loop order for
the unpack directions and for 3×3 FRACTAL_Z, whose 9-element H·W runs leave no long axis to loop
along). It never allocates more than the output (peak 1.00×; with `out=` nothing but a cached
≤ 512 KiB `np.take` index). The floor is numpy's per-element strided loop: a 2-byte element that
changes neighbours (C0 = 16 elements interleaved from 16 channels) costs 0.6–0.8 ns here, while
`np.copyto` moves one in 0.1–0.2 ns, and FRACTAL_NZ's 32-byte block gather is bound by `np.take`'s
per-block cost (~10 ns). Two threads would roughly double the wall-clock figures on two idle cores,
but this VM was shared with other jobs during every run (load average 6–8 on 2 cores, see above):
a second thread got no CPU (measured: 7.8 ms of CPU for a 16 ms wall-clock 5HD pack), which is why
the pool now only starts when `os.getloadavg()` shows a spare core (`NPU_DEPLOY_THREADS=N` forces it).
The wall-clock columns are therefore pessimistic; the CPU-time column is the reproducible one.

Tried and rejected (measured in the same session, per core): onnxruntime's Transpose kernel
(50–80 % for the batched 2-D transposes of NC1HWC0 with static shapes, but 1–7 % for FRACTAL_NZ /
FRACTAL_Z, erratic with dynamic shapes, and ~10 ms of session creation per new shape); `np.take` with
2-byte elements (≈ 3 ns per element); void-dtype (`V32`) block copies (≈ 14 ns per block); uint64-lane
copies of NZ blocks (slower than `np.take`); one numpy call per C0 plane over the whole tensor
(no cache blocking: 2× slower than 1 MiB tasks). Reaching 50 % on one core needs a SIMD transpose
kernel, i.e. a compiled extension, which this package deliberately does not ship.
"""

if __name__ == "__main__":
    sys.exit(main())
