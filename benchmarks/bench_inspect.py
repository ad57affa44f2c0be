"""`.om` reader and `inspect` figures, measured side by side in one run.

    python benchmarks/bench_inspect.py            # writes benchmarks/README-inspect.md

1. ModelDef decoding: ``read_om`` (pure-Python, bounds-checked wire decoder, decodes only what it
   reports) against protobuf's C parser (upb) on the same bytes with a message class built from the
   reference field numbers (``tests/standins/omfile.py``), plus a Counter of op types; synthetic `.om`
   files of 1k-20k ops. The ratio is the figure; the peak Python allocation is shown against file size.
2. Weight size does not matter: the same model with a 1 MB and a 256 MB weight partition.
3. ``inspect`` on the five real ONNX models: plain, and with ``soc`` (op support + layout plan).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # for tests/ only: last, so the installed npu_deploy wins over the
                             # repository's partial npu_deploy/ folder (non-editable installs)

from npu_deploy.runtime.check.inspect import inspect  # noqa: E402
from npu_deploy.converters.files.om import read_om  # noqa: E402
from tests.standins.omfile import ModelDef, build_om, op, tensor, transdata  # noqa: E402


def _ops(n: int) -> list[dict]:
    out = []
    for i in range(n):
        if i % 10 == 0:
            out.append(transdata(f"trans_TransData_{i}", "NCHW", "NC1HWC0", [1, 64, 56, 56],
                                 out_shape=[1, 4, 56, 56, 16]))
        else:
            out.append(op(f"conv{i}", "Conv2D", inputs=[f"conv{i - 1}:0"],
                          input_desc=[tensor("a", "float16", [1, 4, 56, 56, 16], "NC1HWC0"),
                                      tensor("w", "float16", [36, 4, 16, 16], "FRACTAL_Z")],
                          output_desc=[tensor("b", "float16", [1, 4, 56, 56, 16], "NC1HWC0")],
                          attrs={"strides": [1, 1, 1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1, 1, 1],
                                 "groups": 1, "data_format": "NCHW"}))
    return out


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _upb(path: Path, om) -> None:
    p = om.partitions[0]
    with open(path, "rb") as f:
        f.seek(p.offset)
        md = ModelDef.FromString(f.read(p.size))
    Counter(o.type for g in md.graph for o in g.op)


def bench_decode(d: Path, sizes: list[int], repeat: int) -> list[str]:
    rows = ["| ops | file | read_om | protobuf (upb) + Counter | ratio | read_om peak alloc | peak / file |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for n in sizes:
        path = build_om(d / f"ops{n}.om", table="64", inputs=[tensor("x", "float16", [1, 64, 56, 56], "NCHW")],
                        outputs=[tensor("y", "float16", [1, 1000])], ops=_ops(n))
        om = read_om(path)
        assert om.main.op_count == n + 2
        t_ours = _best(lambda: read_om(path), repeat)
        t_upb = _best(lambda: _upb(path, om), repeat)
        tracemalloc.start()
        read_om(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        size = path.stat().st_size
        rows.append(f"| {n:,} | {size / 2**20:.1f} MiB | {1e3 * t_ours:.0f} ms | {1e3 * t_upb:.0f} ms | "
                    f"{t_ours / t_upb:.1f}x | {peak / 2**20:.1f} MiB | {peak / size:.1f} |")
        path.unlink()
    return rows


def bench_weights(d: Path, repeat: int) -> list[str]:
    rows = ["| weight partition | file | read_om |", "|---:|---:|---:|"]
    for mb in (1, 256):
        path = build_om(d / f"w{mb}.om", table="64", inputs=[tensor("x")], outputs=[tensor("y")],
                        ops=_ops(1000), weights=b"\0" * (mb << 20))
        t = _best(lambda: read_om(path), repeat)
        rows.append(f"| {mb} MiB | {path.stat().st_size / 2**20:.0f} MiB | {1e3 * t:.0f} ms |")
        path.unlink()
    return rows


def bench_real(repeat: int) -> list[str]:
    from tests.conftest import real_model_path

    shapes = {"ppocr_det": {"x": (1, 3, 640, 640)}, "ppocr_rec": {"x": (1, 3, 48, 320)},
              "ppocr_cls": {"x": (1, 3, 48, 192)}, "silero_vad": {"input": (1, 576)},
              "minilm": {"input_ids": (1, 128), "attention_mask": (1, 128)}}
    rows = ["| model | file | nodes | inspect | inspect --soc Ascend310P3 | TransData planned (naive) | "
            "est. FormatTrans |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, shp in shapes.items():
        path = real_model_path(name)
        t_plain = _best(lambda: inspect(path), repeat)
        t0 = time.perf_counter()
        r = inspect(path, soc="Ascend310P3", input_shapes=shp)
        t_soc = time.perf_counter() - t0
        s = r.onnx["soc"]
        rows.append(f"| {name} | {path.stat().st_size / 2**20:.1f} MiB | {r.op_count} | {1e3 * t_plain:.0f} ms | "
                    f"{1e3 * t_soc:.0f} ms | {s['transdata_count']} ({s['transdata_naive_count']}) | "
                    f"{100 * s['formattrans_share']:.1f} % |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,5000,20000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "README-inspect.md"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        decode = bench_decode(d, sizes, args.repeat)
        weights = bench_weights(d, args.repeat)
    real = bench_real(args.repeat)
    load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    text = "\n".join([
        "# `.om` reader and `inspect` (benchmarks/bench_inspect.py)", "",
        "Measured in one run on this machine (2 cores, Python 3.11); best of "
        f"{args.repeat}; load average at the end {load}. Re-run with `python benchmarks/bench_inspect.py`. "
        "With other jobs running, absolute times are inflated and ratios noisy.", "",
        "## ModelDef decoding", "",
        "Synthetic `.om` files (64-bit table; every op with two or three tensor descriptors and a few "
        "attributes, one TransData in ten). `read_om` decodes the protobuf wire format itself with every "
        "length bounds-checked and only the fields it reports; the baseline is protobuf's C parser "
        "(upb) on the same bytes with a message class built from the reference field numbers, plus an "
        "op-type Counter. The pure-Python decoder is the price of reading a stranger's file without "
        "trusting a generated parser; the ratio says how much it costs.", "",
        *decode, "",
        "## Weight size does not matter", "",
        "`read_om` reads the header, the partition table and the MODEL_DEF partition only.", "",
        *weights, "",
        "## `inspect` on the real ONNX models", "",
        "`inspect` loads the protobuf without external data; `--soc` adds `load_model` (shape "
        "inference), the op-support table and the built-in layout planner with its cost estimate "
        "(an estimate, not a measurement).", "",
        *real, "",
    ])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
