"""Operator dump files: the cost of ``run --dump`` and of reading a dump folder once.

Side by side in one run, on a real model (PP-OCRv4 det 640x640 by default, or ``--model ppocr_cls``):

* one emulator run (``EmulatorBackend.run``) vs one recorded run (``run_recorded``, every buffer kept);
* ``write_dump_folder`` of every executed op vs ``np.save`` of the same arrays (one .npy each): the
  baseline for writing the same bytes (the dump files are written atomically, with an fsync each);
* ``read_dump_folder`` vs ``np.load`` of those .npy files: the baseline for reading the same bytes;
  plus ``logical()`` of every tensor (through the format core).

Wall and CPU time, median of ``--rounds`` (default 3), alternating the contenders. About a minute for det.

    python benchmarks/bench_dump.py [--model ppocr_det|ppocr_cls] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPES = {"ppocr_det": (1, 3, 640, 640), "ppocr_cls": (1, 3, 48, 192)}


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="ppocr_det", choices=sorted(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import npu_deploy
    from npu_deploy.converters.files.dump import read_dump_folder, write_dump_folder
    from npu_deploy.runtime.emulator import EmulatorBackend
    from tests.conftest import real_model_path

    model = real_model_path(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="bench_dump_"))
    try:
        bundle = tmp / "m.bundle"
        npu_deploy.convert(str(model), output=str(bundle), backend="builtin", precision_mode="force_fp16",
                           input_shapes={"x": SHAPES[args.model]})
        x = np.random.default_rng(0).standard_normal(SHAPES[args.model]).astype(np.float32)
        rows: dict[str, list[tuple[float, float]]] = {}

        def add(name, w, c):
            rows.setdefault(name, []).append((w, c))

        with EmulatorBackend(bundle) as b:
            b.run(None, {"x": x})  # warm-up
            ops = None
            for r in range(args.rounds):
                w, c, _ = timed(lambda: b.run(None, {"x": x}))
                add("emulator run", w, c)
                w, c, (_, ops) = timed(lambda: b.run_recorded({"x": x}))
                add("recorded run", w, c)
                arrays = [t.data for op in ops for t in op.inputs + op.outputs]
                folder, npys = tmp / f"d{r}", tmp / f"n{r}"
                npys.mkdir()
                w, c, _ = timed(lambda: [np.save(npys / f"{i}.npy", a) for i, a in enumerate(arrays)])
                add("np.save of the same arrays", w, c)
                w, c, _ = timed(lambda: write_dump_folder(folder, ops))
                add("write_dump_folder", w, c)
                # both reads hold every array at once (as read_dump_folder returns them), then drop them
                w, c, _ = timed(lambda: len([np.load(p) for p in sorted(npys.iterdir())]))
                add("np.load of those arrays", w, c)
                w, c, _ = timed(lambda: len(read_dump_folder(folder)))
                add("read_dump_folder", w, c)
                dumps = read_dump_folder(folder)
                w, c, _ = timed(lambda: sum(t.logical().nbytes for d in dumps for t in d.inputs + d.outputs))
                add("logical() of every tensor", w, c)
                dumps = None  # free the arrays before the next round
                shutil.rmtree(folder)
                shutil.rmtree(npys)
        n_files = len(ops)
        n_bytes = sum(t.data.nbytes for op in ops for t in op.inputs + op.outputs)
        print(f"{args.model} {SHAPES[args.model]}: {n_files} ops dumped, {n_bytes / 2**20:.1f} MiB of tensors; "
              f"median of {args.rounds}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in rows.items()}
        base = {"recorded run": "emulator run", "write_dump_folder": "np.save of the same arrays",
                "read_dump_folder": "np.load of those arrays"}
        print("| step | wall s | CPU s | vs |")
        print("|---|---|---|---|")
        for k, (w, c) in med.items():
            ref = base.get(k)
            vs = f"{w / med[ref][0]:.2f}x wall, {c / med[ref][1]:.2f}x CPU of {ref}" if ref else ""
            print(f"| {k} | {w:.3f} | {c:.3f} | {vs} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
