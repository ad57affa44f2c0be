"""What the output guarantees cost: atomic writes alone, inside a run's output set (which keeps a hard-link
backup of every file it replaces), the stale-temporary scan of a crowded folder, and the size check of
``load_npy`` against a plain ``np.load``. Side by side in one run; prints a Markdown table.

    python benchmarks/bench_io.py [--files 500] [--crowd 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from npu_deploy import _io


def _best(fn, rounds=5) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--crowd", type=int, default=20000)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-io-"))
    payload = os.urandom(4096)
    try:
        def plain():
            for i in range(args.files):
                with open(root / f"p{i}.bin", "wb") as f:
                    f.write(payload)

        def atomic(replace_in_set: bool):
            def run():
                ctx = _io.outputs() if replace_in_set else contextlib.nullcontext()
                with ctx:
                    for i in range(args.files):
                        with _io.atomic_path(root / f"a{i}.bin") as tmp:
                            tmp.write_bytes(payload)
            return run

        plain()
        atomic(False)()  # the files now exist: the timed runs replace them
        t_plain = _best(plain)
        t_atomic = _best(atomic(False))
        t_set = _best(atomic(True))

        crowd = root / "crowd"
        crowd.mkdir()
        for i in range(args.crowd):
            (crowd / f"f{i}.npy").touch()
        t_scan = _best(lambda: _io.clean_stale_parts(crowd))

        arr = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)
        np.save(root / "x.npy", arr)
        t_np = _best(lambda: np.load(root / "x.npy", allow_pickle=False), rounds=10)
        t_checked = _best(lambda: _io.load_npy(root / "x.npy"), rounds=10)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"best of 5 (10 for reads)\n")
    print("| operation | time | ratio |\n|---|---:|---:|")
    per = 1e6 / args.files
    print(f"| {args.files} x 4 KiB, plain open/write | {t_plain * per:.0f} µs/file | 1.00 |")
    print(f"| atomic_path (temp + chmod + rename) | {t_atomic * per:.0f} µs/file | {t_atomic / t_plain:.2f} |")
    print(f"| atomic_path in an output set, replacing (+ link backup) | {t_set * per:.0f} µs/file | "
          f"{t_set / t_plain:.2f} |")
    print(f"| stale-temporary scan of {args.crowd:,} files (once per folder per run) | {t_scan * 1e3:.1f} ms | |")
    print(f"| np.load of a 4 MiB .npy | {t_np * 1e3:.2f} ms | 1.00 |")
    print(f"| load_npy (header size check first) | {t_checked * 1e3:.2f} ms | {t_checked / t_np:.2f} |")


if __name__ == "__main__":
    main()
