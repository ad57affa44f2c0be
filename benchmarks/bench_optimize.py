"""Optimize figures on the real models: what each rule set saves by the built-in cost model, and what
optimize costs in wall time (every step verified on onnxruntime and planned).

Run: ``python benchmarks/bench_optimize.py [--out benchmarks/README-optimize.md]``

For each real model in the test model cache (``~/.cache/npu-deploy``; nothing is downloaded here),
side by side in one run: the default rules, and the default rules with ``keep_if_faster``. Reported:
applied rewrites, planned TransData, AI CPU ops and estimated time before -> after (Ascend310P3), and
the wall time of the optimize run, with the machine's load average noted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from npu_deploy.converters.optimize import optimize_model  # noqa: E402

CACHE = Path(os.environ.get("NPU_DEPLOY_MODEL_CACHE", Path.home() / ".cache" / "npu-deploy")) / "models"
MODELS = {
    "silero_vad": ("silero_vad_v6.onnx", {"input": (1, 576)}),
    "minilm": ("paraphrase-MiniLM-L3-v2.onnx", {"input_ids": (1, 16), "attention_mask": (1, 16)}),
    "ppocr_cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": (1, 3, 48, 192)}),
    "ppocr_rec": ("ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)}),
    "ppocr_det": ("ch_PP-OCRv4_det_infer.onnx", {"x": (1, 3, 320, 320)}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="Write the figures as a markdown fragment.")
    args = ap.parse_args()
    rows = ["| model | mode | rewrites | TransData | AI CPU | est. us | verdict | wall s |",
            "|---|---|---|---|---|---|---|---|"]
    for name, (file, shapes) in MODELS.items():
        path = CACHE / file
        if not path.is_file():
            print(f"{name}: not in {CACHE}, skipped")
            continue
        for mode in ("default", "keep-if-faster"):
            t0 = time.perf_counter()
            res, _ = optimize_model(onnx.load(path), input_shapes=shapes, keep_if_faster=mode != "default")
            wall = time.perf_counter() - t0
            b, a = res.before, res.after
            row = (f"| {name} | {mode} | {res.applied_count()} | {b['transdata']} -> {a['transdata']} | "
                   f"{b['ai_cpu']} -> {a['ai_cpu']} | {b['est_us']:.1f} -> {a['est_us']:.1f} | {res.verdict()} | "
                   f"{wall:.1f} |")
            print(row, flush=True)
            rows.append(row)
    load = os.getloadavg()
    text = (f"Optimize on the real models ({platform.machine()}, {os.cpu_count()} cores, load average "
            f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; estimates from the built-in cost model, Ascend310P3)\n\n"
            + "\n".join(rows) + "\n")
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
