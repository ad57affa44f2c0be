"""Memory plan and cost model figures, measured side by side in one run.

    python benchmarks/bench_memory.py            # writes benchmarks/README-memory-cost.md

1. Planner speed: ``plan_memory`` (segment-tree conflict query) against the same greedy placement
   with an all-pairs conflict scan, on synthetic graphs of 1k–20k tensors; the ratio is the figure.
2. Plan quality on the five real models: arena vs lower bound vs no reuse.
3. The cost model against the source material's figures (10–15 µs per NCHW→NC1HWC0; NZ GEMM
   about 1.5x ND GEMM throughput).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path



REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # for tests/ only: last, so the installed npu_deploy wins over the
                             # repository's partial npu_deploy/ folder (non-editable installs)

from npu_deploy.converters.lowering import memory  # noqa: E402
from npu_deploy.converters.lowering.cost import (SOC_PROFILES, OpWork,  # noqa: E402
                                        op_time_us, transdata_time_us)
from npu_deploy.converters.lowering.memory import MemTensor, plan_memory  # noqa: E402


def synthetic(n: int, seed: int = 0) -> list[MemTensor]:
    """A graph-like workload: one tensor per step, most read by the next few steps, a few skip
    connections of tens of steps, 1 % living to the end (outputs, cached state)."""
    rng = random.Random(seed)
    ts = []
    for i in range(n):
        r = rng.random()
        life = 1 + int(rng.expovariate(1 / 2)) if r < 0.9 else rng.randint(10, 60) if r < 0.99 \
            else n - i
        size = rng.choice([64 << 10, 256 << 10, 1 << 20, 4 << 20]) + rng.randint(0, 4095)
        ts.append(MemTensor(f"t{i}", size, i, i + life))
    return ts


def plan_all_pairs(tensors: list[MemTensor], alignment: int = 256) -> int:
    """The same greedy-by-size best-fit pass as ``memory._greedy(..., "size")``, finding conflicts
    by scanning every placed tensor (the O(n²) baseline). Returns the arena size."""
    sizes = [memory._align(t.nbytes, alignment) for t in tensors]
    order = sorted(range(len(tensors)), key=lambda i: (-sizes[i], -(tensors[i].last_use -
                                                                    tensors[i].first_use),
                                                       tensors[i].name))
    placed: list[tuple[int, int, int, int]] = []   # first, last, offset, end
    arena = 0
    for i in order:
        t, size = tensors[i], sizes[i]
        if not size:
            continue
        busy = [(o, e) for f, la, o, e in placed if f <= t.last_use and t.first_use <= la]
        off = memory._place(size, busy)
        placed.append((t.first_use, t.last_use, off, off + size))
        arena = max(arena, off + size)
    return arena


def best_of(fn, repeat: int) -> float:
    """Best process CPU time of ``repeat`` runs (CPU time, not wall time: the benchmark machine is
    shared, and other jobs' load would otherwise swamp the comparison)."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def bench_speed(sizes: list[int], repeat: int) -> list[dict]:
    rows = []
    for n in sizes:
        ts = synthetic(n)
        sizes = [memory._align(t.nbytes, 256) for t in ts]
        fast = best_of(lambda: memory._greedy(ts, sizes, "size"), repeat)
        slow = best_of(lambda: plan_all_pairs(ts), 1)
        same = plan_all_pairs(ts) == memory._greedy(ts, sizes, "size")[1]
        full = best_of(lambda: plan_memory(ts), repeat)
        plan = plan_memory(ts)
        rows.append({"n": n, "tree_s": fast, "pairs_s": slow, "ratio": slow / fast,
                     "same_arena": same, "full_s": full, "overhead": plan.overhead})
        print(f"n={n:6d}  greedy pass {fast * 1e3:8.1f} ms   all-pairs {slow * 1e3:9.1f} ms   "
              f"x{slow / fast:6.1f}   plan_memory {full * 1e3:8.1f} ms   arena/lower bound "
              f"{plan.overhead:.3f}", flush=True)
    return rows


REAL = [
    ("ppocr_det", {"x": (1, 3, 640, 640)}),
    ("ppocr_rec", {"x": (1, 3, 48, 320)}),
    ("ppocr_cls", {"x": (1, 3, 48, 192)}),
    ("silero_vad", {"input": (1, 576), "h": (1, 1, 128), "c": (1, 1, 128)}),
    ("minilm", {"input_ids": (1, 128), "attention_mask": (1, 128)}),
]


def _planned(path, shapes, soc="Ascend310P3"):
    """The plan ``convert`` makes (built-in lowering up to the plan record)."""
    from npu_deploy.converters.lowering import pipeline
    from npu_deploy.converters.lowering.options import ConvertOptions

    opts = ConvertOptions(backend="builtin", input_shapes=shapes, soc=soc)
    return pipeline.lower(path, None, opts, until="plan from ONNX").plan


def bench_real() -> list[dict]:
    from tests.conftest import real_model_path

    rows = []
    for name, shapes in REAL:
        # the tensors the planner plans (its lifetimes, stored sizes and TransData destinations)
        ts = _planned(real_model_path(name), shapes).memory.tensors
        t0 = time.perf_counter()
        plan = plan_memory(ts)
        dt_ms = (time.perf_counter() - t0) * 1e3
        rows.append({"model": name, "shapes": shapes, "tensors": len(ts),
                     "arena": plan.arena_bytes, "lower": plan.lower_bound_bytes,
                     "no_reuse": plan.no_reuse_bytes, "ms": dt_ms})
        print(f"{name:10s} {len(ts):5d} tensors  arena {plan.arena_bytes / 2**20:8.2f} MiB  "
              f"lower {plan.lower_bound_bytes / 2**20:8.2f}  no-reuse "
              f"{plan.no_reuse_bytes / 2**20:8.2f}  ({dt_ms:.1f} ms)", flush=True)
    return rows


def bench_real_cost() -> list[dict]:
    """Whole-model baseline estimates (every op on AI Core, no TransData) on both SoCs."""
    from tests.conftest import real_model_path

    rows = []
    for name, shapes in REAL:
        row = {"model": name}
        for soc in SOC_PROFILES:
            r = _planned(real_model_path(name), shapes, soc=soc).cost  # the plan's own estimate
            row["ops"] = len(r.ops)
            by_type: dict[str, float] = {}
            for o in r.ops:
                by_type[o.op_type] = by_type.get(o.op_type, 0.0) + o.est_us
            top = sorted(by_type.items(), key=lambda kv: -kv[1])[:3]
            row[soc] = (r.total_us, [(k, v / r.total_us) for k, v in top])
        rows.append(row)
        print(f"{name:10s} " + "  ".join(f"{soc} {row[soc][0] / 1000:.3f} ms"
                                          for soc in SOC_PROFILES), flush=True)
    return rows


def cost_checks() -> tuple[list[tuple], list[tuple]]:
    td = []
    for soc in SOC_PROFILES:
        for shape in [(1, 16, 28, 28), (1, 64, 56, 56), (1, 256, 56, 56), (1, 3, 224, 224)]:
            n, c, h, w = shape
            src = n * c * h * w * 2
            dst = n * (-(-c // 16)) * h * w * 16 * 2
            td.append((soc, shape, src, dst, transdata_time_us(src, "NCHW", "NC1HWC0", soc,
                                                               dst_nbytes=dst)))
    gemm = []
    for soc in SOC_PROFILES:
        for m, k, n in [(1, 4096, 4096), (128, 384, 384), (128, 1536, 384), (512, 512, 512),
                        (1024, 1024, 1024), (4096, 4096, 4096)]:
            w = OpWork(2.0 * m * k * n, 2 * (m * k + k * n), 2 * m * n, "cube")
            nz = op_time_us(w, soc, operand_format="NZ")
            nd = op_time_us(w, soc, operand_format="ND")
            gemm.append((soc, (m, k, n), nz, nd, nd / nz))
    return td, gemm


def write_fragment(path: Path, speed, real, td, gemm, real_cost=()) -> None:
    mib = 2 ** 20
    lines = ["# Memory plan and cost model (benchmarks/bench_memory.py)", "",
             "Measured in one run on this machine (2 cores, Python 3.11). Re-run with "
             "`python benchmarks/bench_memory.py`.", "",
             "## Memory planner speed", "",
             "One greedy-by-size best-fit pass; conflicting tensors found with the "
             "lifetime index of `plan_memory` (bisection over short-lived tensors sorted by first "
             "use, one vectorised test over the long-lived ones) or by scanning every placed "
             "tensor (all-pairs baseline). Both run in the same process, one after the other; times "
             "are process CPU time (best of 3 for the index and plan_memory, 1 run of the "
             "baseline) because the machine was shared with other jobs. "
             "`plan_memory` runs that pass and, up to 4096 tensors, two more orders (by "
             "lifetime, by size x lifetime) when the first is above the lower bound. Synthetic graph-like workload: one tensor per step, 90 % read within a few "
             "steps, 9 % skip connections of 10–60 steps, 1 % live to the end.", "",
             "| tensors | greedy pass (index) | greedy pass (all-pairs) | speed-up | same arena | "
             "plan_memory (all orders tried) | its arena / lower bound |",
             "|---:|---:|---:|---:|:---:|---:|---:|"]
    for r in speed:
        lines.append(f"| {r['n']:,} | {r['tree_s'] * 1e3:.1f} ms | {r['pairs_s'] * 1e3:.1f} ms | "
                     f"{r['ratio']:.1f}x | {'yes' if r['same_arena'] else 'no'} | "
                     f"{r['full_s'] * 1e3:.1f} ms | {r['overhead']:.3f} |")
    lines += ["", "The long-lived 1 % are tested together with numpy on every query, so the cost "
              "still grows faster than linearly when many tensors live to the end (20k tensors "
              "with 200 graph outputs); real graphs plan in milliseconds (below).", "",
              "## Plan quality on the real models", "",
              "Activations only (weights are in the weight blob), fp32 activations counted as fp16 "
              "(ATC's default `force_fp16`), every slot rounded up to 256 bytes. The lower bound is "
              "the largest sum of tensors live at one step; no plan can use less.", "",
              "| model | input shapes | tensors | arena | lower bound | no reuse | arena / lower | "
              "saved vs no reuse | plan time |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in real:
        shp = "; ".join(f"{k} {'x'.join(map(str, v))}" for k, v in r["shapes"].items())
        lines.append(f"| {r['model']} | {shp} | {r['tensors']} | {r['arena'] / mib:.2f} MiB | "
                     f"{r['lower'] / mib:.2f} MiB | {r['no_reuse'] / mib:.2f} MiB | "
                     f"{r['arena'] / r['lower']:.3f} | {100 * (1 - r['arena'] / r['no_reuse']):.1f} % "
                     f"| {r['ms']:.1f} ms |")
    if real_cost:
        socs = list(SOC_PROFILES)
        lines += ["", "## Estimated baseline per real model (cost model, not a measurement)", "",
                  "The plan's own estimate (`Plan.cost`: the ops the planner keeps, with its "
                  "formats, fusion and TransData). Same input shapes as above.", "",
                  "| model | nodes | " + " | ".join(f"{s} est." for s in socs)
                  + " | largest op types (310P3 share) |",
                  "|---|---:|" + "---:|" * len(socs) + "---|"]
        for r in real_cost:
            top = ", ".join(f"{k} {100 * v:.0f} %" for k, v in r[socs[0]][1])
            lines.append(f"| {r['model']} | {r['ops']} | "
                         + " | ".join(f"{r[s][0] / 1000:.3f} ms" for s in socs) + f" | {top} |")
    lines += ["", "## Cost model against the source material (all figures are estimates)", "",
              "Every constant is in `converters/lowering/cost.py` `SOC_PROFILES` with its source or marked "
              "as an assumption (peak FP16/INT8 and bandwidth from the datasheet figures in "
              "design.md; launch overhead 3 µs, efficiencies, vector and AI CPU rates are "
              "assumptions). TransData = launch + (source bytes + destination bytes) / "
              "(bandwidth x 0.5).", "",
              "**NCHW→NC1HWC0 (fp16), source figure 10–15 µs on device:**", "",
              "| SoC | shape | bytes in → out | estimate | within 10–15 µs |",
              "|---|---|---:|---:|:---:|"]
    for soc, shape, src, dst, t in td:
        lines.append(f"| {soc} | {'x'.join(map(str, shape))} | {src:,} → {dst:,} | {t:.1f} µs | "
                     f"{'yes' if 10 <= t <= 15 else 'no'} |")
    lines += ["", "**ND vs NZ GEMM (fp16), source figure: NZ about 1.5x the ND throughput:**", "",
              "| SoC | M x K x N | NZ | ND | ND / NZ |", "|---|---|---:|---:|---:|"]
    for soc, (m, k, n), nz, nd, ratio in gemm:
        lines.append(f"| {soc} | {m} x {k} x {n} | {nz:.1f} µs | {nd:.1f} µs | {ratio:.2f} |")
    est = {(soc, shape): t for soc, shape, _, _, t in td}
    nd = {(soc, mkn): r for soc, mkn, _, _, r in gemm}
    typical = est[("Ascend310P3", (1, 64, 56, 56))]
    big = est[("Ascend310P3", (1, 256, 56, 56))]
    small = est[("Ascend310P3", (1, 16, 28, 28))]
    rgb = est[("Ascend310P3", (1, 3, 224, 224))]
    b910 = est[("Ascend910B", (1, 64, 56, 56))]
    lines += ["", "**Where the model agrees and where it disagrees.** For a typical ResNet-stage "
              f"activation (1x64x56x56 fp16) on the 310P3 the model gives {typical:.1f} µs, inside the "
              "10–15 µs the source material quotes; that figure is reproduced by the 204.8 GB/s "
              "LPDDR4X, an assumed 50 % transpose efficiency and a 3 µs launch, so it constrains "
              "their combination, not each one. The model disagrees in three places. (1) Size: "
              f"the cost grows with the bytes moved, so a 1x256x56x56 conversion is estimated at "
              f"{big:.1f} µs and a small 1x16x28x28 one at {small:.1f} µs (mostly launch); a flat "
              f"10–15 µs per conversion, as the source implies, underestimates large tensors and "
              f"overestimates small ones, and misses the padding of a 3-channel image to C0 = 16 "
              f"(1x3x224x224: 5.3x the bytes written, {rgb:.1f} µs). (2) SoC: on the 910B's "
              f"1.6 TB/s HBM the same 1x64x56x56 conversion is launch-bound at {b910:.1f} µs, so "
              f"the 10–15 µs figure reads as a 310-class or large-tensor number. "
              f"(3) NZ vs ND GEMM: the model charges ND operands a halved load bandwidth, so ND "
              f"costs at most bw_efficiency / nd_load_efficiency = 1.4x and only when the GEMM is "
              f"bandwidth-bound (GEMV: {nd[('Ascend310P3', (1, 4096, 4096))]:.2f}x; the MiniLM "
              f"128x384x384 projection: {nd[('Ascend310P3', (128, 384, 384))]:.2f}x on 310P3); "
              f"large compute-bound GEMMs (4096³: "
              f"{nd[('Ascend310P3', (4096, 4096, 4096))]:.2f}x) show no difference. The source's "
              "~1.5x is not reached; if real traces "
              "confirm it for mid-size GEMMs, the missing effect is the cube stalling on "
              "strided loads (not modelled), and `nd_load_efficiency` is the constant to lower. "
              "The tests pin these numbers (`tests/converters/lowering/test_cost.py`: TRANSDATA_CHECK, "
              "GEMM_CHECK).", "",
              "None of this has been checked against a real device: no NPU here. Treat the "
              "per-op times as a ranking aid and the FormatTrans share (flagged above 8 %) as a "
              "prompt to profile, not as a measurement.", "",
              "## ATC driver", "",
              "`converters/lowering/atc.py` has been verified **only against the stand-in** "
              "`tests/standins/atc`, which enforces ATC's documented command line, exit statuses, "
              "stdout protocol, error blocks and `.om` header (reference `atc-acl-om.md` §1); no "
              "real ATC has run it. It has no speed figures: ATC's own compile time dominates.", ""]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000,5000,10000,20000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-real", action="store_true", help="skip the real models")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "README-memory-cost.md"))
    args = ap.parse_args()
    speed = bench_speed([int(s) for s in args.sizes.split(",")], args.repeat)
    real = [] if args.no_real else bench_real()
    real_cost = [] if args.no_real else bench_real_cost()
    td, gemm = cost_checks()
    write_fragment(Path(args.out), speed, real, td, gemm, real_cost)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
