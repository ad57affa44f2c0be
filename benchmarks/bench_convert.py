"""Convert benchmarks: a >= 1 GB float32 model against onnx.load + onnx.save, and planning 2,000 nodes.

Run: ``python benchmarks/bench_convert.py [--gib 1.0] [--out benchmarks/README-convert.md]``

1. **Streaming conversion.** A generated MatMul chain whose float32 weights total ``--gib`` GiB, stored
   as ONNX external data in a temporary folder (never in the repository). In fresh subprocesses, one
   after the other in the same run: ``onnx.load`` + ``onnx.save`` of the model (the baseline), then
   ``npu_deploy.convert(..., backend="builtin")`` in ``force_fp16`` (the default) and in
   ``must_keep_origin_dtype``. Each subprocess reports its wall time and peak RSS. Targets: convert time <= 2x the baseline; convert peak RSS <= 2x the
   model's weight bytes.
2. **Planning.** A generated 2,000-node graph (transformer-like blocks: MatMul, bias Add, Gelu-ish
   elementwise chain, Reshape/Transpose, Softmax, LayerNorm), ``plan()`` timed alone (best of 3).
   Target: under one second.
3. **Real models.** Plan figures (TransData naive vs optimised, memory arena, estimated FormatTrans
   share) for the five real models when they are in the test model cache.

Peak RSS is the child's ``VmHWM`` (its own high-water mark; ``ru_maxrss`` on Linux would also count
the parent's RSS at fork time).

Figures go to a markdown fragment (default ``benchmarks/README-convert.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------------------------
# 1. the big model, written tensor by tensor (the generator never holds all weights either)
# ------------------------------------------------------------------------------------------------

def make_big_model(folder: Path, gib: float, dim: int = 4096) -> tuple[Path, int]:
    per = dim * dim * 4
    layers = max(1, int(round(gib * (1 << 30) / per)))
    data_name = "weights.bin"
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    with open(folder / data_name, "wb") as f:
        for k in range(layers):
            w = rng.standard_normal((dim, dim), dtype=np.float32)
            offset = f.tell()
            f.write(w.tobytes())
            del w
            t = TensorProto(name=f"w{k}", data_type=TensorProto.FLOAT, dims=[dim, dim])
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(per))):
                e = t.external_data.add()
                e.key, e.value = key, value
            inits.append(t)
            src = "x" if k == 0 else f"r{k - 1}"
            nodes.append(helper.make_node("MatMul", [src, f"w{k}"], [f"m{k}"], name=f"mm{k}"))
            nodes.append(helper.make_node("Relu", [f"m{k}"], [f"r{k}"], name=f"relu{k}"))
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, dim])],
                          [helper.make_tensor_value_info(f"r{layers - 1}", TensorProto.FLOAT, [8, dim])], inits)
    path = folder / "big.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, layers * per


_CHILD = r"""
import json, resource, sys, time
mode, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
t = time.perf_counter()
if mode == "onnx":
    import onnx
    m = onnx.load(src)
    onnx.save(m, out, save_as_external_data=True, all_tensors_to_one_file=True, location="copy.bin")
else:
    from npu_deploy import convert
    convert(src, out, backend="builtin", precision_mode=mode)
elapsed = time.perf_counter() - t
# VmHWM is this process image's own high-water mark; ru_maxrss would include the parent's RSS at fork
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
try:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
except OSError:
    pass
print(json.dumps({"seconds": elapsed, "peak_rss": peak}))
"""


def run_child(mode: str, src: Path, out: Path) -> dict:
    # cwd: the child's sys.path starts with its working directory; the repository root there would
    # shadow the installed npu_deploy with the repository's partial npu_deploy/ folder
    proc = subprocess.run([sys.executable, "-c", _CHILD, mode, str(src), str(out)], capture_output=True, text=True,
                          cwd=Path(src).resolve().parent)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_big(gib: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="npu-deploy-bench-") as d:
        folder = Path(d)
        t = time.perf_counter()
        src, weight_bytes = make_big_model(folder, gib)
        gen_s = time.perf_counter() - t
        (folder / "copy").mkdir()
        base = run_child("onnx", src, folder / "copy" / "copy.onnx")
        fp16 = run_child("force_fp16", src, folder / "big_fp16.bundle")
        fp32 = run_child("must_keep_origin_dtype", src, folder / "big_fp32.bundle")
        sizes = {"fp16": (folder / "big_fp16.bundle").stat().st_size, "fp32": (folder / "big_fp32.bundle").stat().st_size}
    return {"weight_bytes": weight_bytes, "generate_s": gen_s, "baseline": base, "force_fp16": fp16,
            "must_keep_origin_dtype": fp32, "bundle_bytes": sizes}


# ------------------------------------------------------------------------------------------------
# 2. planning 2,000 nodes
# ------------------------------------------------------------------------------------------------

def make_wide_graph(folder: Path, nodes_target: int = 2000, d: int = 64, s: int = 32) -> Path:
    rng = np.random.default_rng(1)
    nodes, inits = [], []

    def w(name, shape):
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.05, name))
        return name

    x = "x"
    inits.append(onnx.numpy_helper.from_array(np.array([1, s, 4, d // 4], np.int64), "shape4"))
    inits.append(onnx.numpy_helper.from_array(np.array([1, s, d], np.int64), "shape3"))
    k = 0
    while len(nodes) < nodes_target:
        p = f"b{k}_"
        q = [helper.make_node("MatMul", [x, w(p + "wq", (d, d))], [p + "q"], name=p + "mmq"),
             helper.make_node("Add", [p + "q", w(p + "bq", (d,))], [p + "qb"], name=p + "addq"),
             helper.make_node("Reshape", [p + "qb", "shape4"], [p + "q4"], name=p + "rq"),
             helper.make_node("Transpose", [p + "q4"], [p + "qt"], name=p + "tq", perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", [p + "q4"], [p + "kt"], name=p + "tk", perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", [p + "qt", p + "kt"], [p + "sc"], name=p + "qk"),
             helper.make_node("Softmax", [p + "sc"], [p + "pr"], name=p + "sm", axis=-1),
             helper.make_node("MatMul", [p + "pr", p + "qt"], [p + "ctx"], name=p + "pv"),
             helper.make_node("Transpose", [p + "ctx"], [p + "ct"], name=p + "tc", perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", [p + "ct", "shape3"], [p + "c3"], name=p + "rc"),
             helper.make_node("Add", [p + "c3", x], [p + "res"], name=p + "res"),
             helper.make_node("LayerNormalization", [p + "res", w(p + "g", (d,)), w(p + "be", (d,))], [p + "ln"],
                              name=p + "ln", axis=-1),
             helper.make_node("MatMul", [p + "ln", w(p + "w1", (d, 2 * d))], [p + "h"], name=p + "ff1"),
             helper.make_node("Sigmoid", [p + "h"], [p + "hs"], name=p + "sig"),
             helper.make_node("Mul", [p + "h", p + "hs"], [p + "act"], name=p + "silu"),
             helper.make_node("MatMul", [p + "act", w(p + "w2", (2 * d, d))], [p + "o"], name=p + "ff2"),
             helper.make_node("Add", [p + "o", p + "ln"], [p + "out"], name=p + "res2")]
        nodes.extend(q)
        x = p + "out"
        k += 1
    g = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, d])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, s, d])], inits)
    path = folder / "wide.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def bench_plan() -> dict:
    from npu_deploy.converters.files.onnx_model import load_model
    from npu_deploy.converters.lowering.planner import plan

    with tempfile.TemporaryDirectory() as d:
        path = make_wide_graph(Path(d))
        t = time.perf_counter()
        loaded = load_model(path)
        load_s = time.perf_counter() - t
        times, cpu = [], []
        for _ in range(5):
            t, c = time.perf_counter(), time.process_time()
            p = plan(loaded, soc="Ascend310P3", precision_mode="force_fp16")
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
    return {"nodes": len(loaded.graph.node), "load_s": load_s, "plan_s": min(times), "plan_runs": times,
            "plan_cpu_s": min(cpu), "load_avg": os.getloadavg()[0],
            "transdata": p.report.transdata_count, "transdata_naive": p.report.transdata_naive_count}


REAL = {  # file in the model cache (tests/conftest.py downloads and verifies them) -> input shapes
    "ch_PP-OCRv4_det_infer.onnx": {"x": (1, 3, 640, 640)},
    "ch_PP-OCRv4_rec_infer.onnx": {"x": (1, 3, 48, 320)},
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": {"x": (1, 3, 48, 192)},
    "silero_vad_v6.onnx": {"input": (4, 576)},
    "paraphrase-MiniLM-L3-v2.onnx": {"input_ids": (1, 128), "attention_mask": (1, 128)},
}


def bench_real() -> list[dict]:
    """Plan figures for the real models already in the test cache (skipped when absent)."""
    from npu_deploy.converters.files.onnx_model import load_model
    from npu_deploy.converters.lowering.planner import plan

    cache = Path(os.environ.get("NPU_DEPLOY_MODEL_CACHE", Path.home() / ".cache" / "npu-deploy")) / "models"
    rows = []
    for name, shapes in REAL.items():
        path = cache / name
        if not path.exists():
            continue
        loaded = load_model(path, input_shapes=shapes)
        t = time.process_time()
        p = plan(loaded, soc="Ascend310P3", precision_mode="force_fp16")
        r = p.report
        rows.append({"model": name, "shapes": shapes, "nodes": r.nodes, "plan_cpu_s": time.process_time() - t,
                     "naive": r.transdata_naive_count, "naive_bytes": r.transdata_naive_bytes,
                     "optimised": r.transdata_count, "bytes": r.transdata_bytes, "memory": r.memory,
                     "share": r.formattrans_share()})
    return rows


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.2f}"


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _plan_verdict(pl: dict) -> str:
    if pl["plan_s"] < 1:
        return "met"
    if pl["plan_cpu_s"] < 1:
        return (f"met in CPU time ({pl['plan_cpu_s']:.2f} s); the wall time is inflated by other processes "
                f"(load average {pl['load_avg']:.1f} on {os.cpu_count()} cores): re-run on an idle host")
    return "NOT met"


def write_markdown(path: Path, big: dict | None, pl: dict, real: list[dict] | None = None) -> str:
    lines = ["## convert (built-in backend)", "",
             f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()}, by `python benchmarks/bench_convert.py`. "
             "Each figure comes from a fresh subprocess; the baseline and the conversions ran in the same run.", ""]
    if big is not None:
        wb = big["weight_bytes"]
        base = big["baseline"]
        lines += [f"### Streaming a {_gib(wb)} float32 model (external data; MatMul chain)", "",
                  "| run | time (s) | time / baseline | peak RSS | RSS / model weights | output |",
                  "|---|---:|---:|---:|---:|---:|",
                  f"| `onnx.load` + `onnx.save` (baseline) | {base['seconds']:.2f} | 1.00 | {_gib(base['peak_rss'])} | "
                  f"{base['peak_rss'] / wb:.2f} | {_gib(wb)} |"]
        for mode, key in (("force_fp16", "fp16"), ("must_keep_origin_dtype", "fp32")):
            r = big[mode]
            lines.append(f"| `convert` {mode} | {r['seconds']:.2f} | {r['seconds'] / base['seconds']:.2f} | "
                         f"{_gib(r['peak_rss'])} | {r['peak_rss'] / wb:.2f} | {_gib(big['bundle_bytes'][key])} |")
        ok_t = all(big[m]["seconds"] <= 2 * base["seconds"] for m in ("force_fp16", "must_keep_origin_dtype"))
        ok_m = all(big[m]["peak_rss"] <= 2 * wb for m in ("force_fp16", "must_keep_origin_dtype"))
        lines += ["", f"Targets: time <= 2x baseline: **{'met' if ok_t else 'NOT met'}**; "
                      f"peak RSS <= 2x model size: **{'met' if ok_m else 'NOT met'}**. "
                      "Weights are read, packed and written one tensor at a time.", ""]
    lines += ["### Planning a 2,000-node graph", "",
              f"{pl['nodes']} nodes (transformer-like blocks). `plan()` (op support, formats, TransData naive and "
              f"optimised, weights, memory plan, cost estimate) best of 5: **{pl['plan_s']:.3f} s** wall, "
              f"{pl['plan_cpu_s']:.3f} s CPU (runs: {', '.join(f'{t:.3f}' for t in pl['plan_runs'])}; host load "
              f"average {pl['load_avg']:.1f} on {os.cpu_count()} cores); loading and checking the model: "
              f"{pl['load_s']:.2f} s. TransData planned: {pl['transdata']} (naive {pl['transdata_naive']}). "
              f"Target < 1 s: **{_plan_verdict(pl)}**.", ""]
    if real:
        lines += ["### The real models (Ascend310P3, force_fp16; times are the cost model's **estimates**)", "",
                  "| model | input | nodes | TransData naive | optimised | MiB moved naive | optimised | "
                  "arena MiB | lower bound | no reuse | est. FormatTrans share | plan CPU s |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in real:
            m = r["memory"]
            shape = "; ".join(f"{k}:{','.join(map(str, v))}" for k, v in r["shapes"].items())
            share = "n/a" if r["share"] is None else f"{100 * r['share']:.1f} %"
            lines.append(f"| {r['model']} | {shape} | {r['nodes']} | {r['naive']} | {r['optimised']} | "
                         f"{_mib(r['naive_bytes'])} | {_mib(r['bytes'])} | {_mib(m['arena_bytes'])} | "
                         f"{_mib(m['lower_bound_bytes'])} | {_mib(m['no_reuse_bytes'])} | {share} | "
                         f"{r['plan_cpu_s']:.2f} |")
        lines.append("")
    text = "\n".join(lines)
    path.write_text(text, encoding="utf-8")
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="float32 weight size of the big model (GiB)")
    ap.add_argument("--skip-big", action="store_true", help="only the planning benchmark")
    ap.add_argument("--out", type=Path, default=HERE / "README-convert.md")
    args = ap.parse_args(argv)
    pl = bench_plan()
    print(json.dumps(pl, indent=1))
    real = bench_real()
    big = None if args.skip_big else bench_big(args.gib)
    if big:
        print(json.dumps(big, indent=1))
    print(write_markdown(args.out, big, pl, real))
    return 0


if __name__ == "__main__":
    sys.exit(main())
