"""Benchmark: analyse a generated 1,000,000-row op_summary vs ``pandas.read_csv`` of the same file.

Targets (issue "npu-deploy profile"): analysis time ≤ 1.5 × pandas.read_csv alone, peak RSS ≤ 300 MB.
Each measurement runs in a fresh subprocess (so peak RSS is that of the measured work only), the two
alternate, and the median of ``--repeat`` runs is reported. Figures go to ``benchmarks/README-profile.md``.

    python benchmarks/bench_profile.py [--rows 1000000] [--repeat 3] [--keep FILE]

pandas is only the yardstick here, not a dependency of npu-deploy.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = ("Device_id,Model ID,Task ID,Stream ID,Op Name,OP Type,OP State,Task Type,Task Start Time(us),"
          "Task Duration(us),Task Wait Time(us),Block Num,Mix Block Num,HF32 Eligible,Input Shapes,"
          "Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats,Context ID,"
          "aicore_time(us),aic_total_cycles,aic_mac_time(us),aic_mac_ratio,aic_scalar_time(us),"
          "aic_scalar_ratio,aic_mte1_time(us),aic_mte1_ratio,aic_mte2_time(us),aic_mte2_ratio,"
          "aic_fixpipe_time(us),aic_fixpipe_ratio,aic_icache_miss_rate,aiv_time(us),aiv_total_cycles,"
          "aiv_vec_time(us),aiv_vec_ratio,aiv_scalar_time(us),aiv_scalar_ratio,aiv_mte2_time(us),"
          "aiv_mte2_ratio,aiv_mte3_time(us),aiv_mte3_ratio,aiv_icache_miss_rate,cube_utilization(%)").split(",")

# one transformer-ish layer: (name pattern, op type, task type, in shapes, in dtypes, in formats, out shapes,
# out dtypes, out formats, mean µs)
LAYER = [
    ("MatMul_{i}_q", "MatMulV2", "AI_CORE", '"128,384;384,384"', "FLOAT16;FLOAT16", "FRACTAL_NZ;FRACTAL_NZ",
     '"24,8,16,16"', "FLOAT16", "FRACTAL_NZ", 12.0),
    ("trans_TransData_{i}a", "TransData", "AI_VECTOR_CORE", '"24,8,16,16"', "FLOAT16", "FRACTAL_NZ",
     '"128,384"', "FLOAT16", "ND", 4.0),
    ("Add_{i}", "Add", "AI_VECTOR_CORE", '"128,384;384"', "FLOAT16;FLOAT16", "ND;ND", '"128,384"',
     "FLOAT16", "ND", 2.0),
    ("trans_TransData_{i}b", "TransData", "AI_VECTOR_CORE", '"128,384"', "FLOAT16", "ND",
     '"24,8,16,16"', "FLOAT16", "FRACTAL_NZ:0", 4.0),
    ("MatMul_{i}_k", "MatMulV2", "AI_CORE", '"128,384;384,384"', "FLOAT16;FLOAT16", "FRACTAL_NZ;FRACTAL_NZ",
     '"24,8,16,16"', "FLOAT16", "FRACTAL_NZ", 12.0),
    ("Softmax_{i}", "SoftmaxV2", "AI_VECTOR_CORE", '"12,128,128"', "FLOAT16", "ND", '"12,128,128"',
     "FLOAT16", "ND", 6.0),
    ("Transpose_{i}", "Transpose", "AI_VECTOR_CORE", '"128,12,32;3"', "FLOAT16;INT64", "ND;ND",
     '"12,128,32"', "FLOAT16", "ND", 3.0),
    ("Cast_{i}", "Cast", "AI_VECTOR_CORE", '"128,384"', "FLOAT", "ND", '"128,384"', "FLOAT16", "ND", 1.5),
    ("Gather_{i}", "GatherV2", "AI_CPU", '"30522,384;128;1"', "FLOAT16;INT64;INT64", "ND;ND;ND",
     '"128,384"', "FLOAT16", "ND", 20.0),
    ("LayerNorm_{i}", "LayerNormV3", "AI_VECTOR_CORE", '"128,384;384;384"', "FLOAT16;FLOAT16;FLOAT16",
     "ND;ND;ND", '"128,384"', "FLOAT16", "ND", 5.0),
]


def generate(path: Path, rows: int, seed: int = 0) -> None:
    rnd = random.Random(seed)
    pmu = ["N/A"] * 25
    t = 1736413971558972.0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\r\n")
        w.writerow(HEADER)
        i = 0
        n = 0
        while n < rows:
            for (name, op, core, ish, idt, ifm, osh, odt, ofm, mean) in LAYER:
                if n >= rows:
                    break
                d = mean * (0.8 + 0.4 * rnd.random())
                w.writerow(["0", "4294967295", str(n % 65536), "2", name.format(i=i), op, "static", core,
                            f"{t:.3f}\t", f"{d:.3f}", "0.5", "8", "0", "NO", ish, idt, ifm, osh, odt, ofm,
                            "N/A", f"{d * 0.9:.3f}", "12345", *pmu[2:]])
                t += d + 0.5
                n += 1
            if n < rows and i % 50 == 49:  # an all-reduce now and then (excluded from compute)
                w.writerow(["0", "4294967295", "N/A", "N/A", f"hcom_allReduce__{i}_0", "hcom_allReduce_", "N/A",
                            "COMMUNICATION", f"{t:.3f}\t", "150.000", "0", *(["N/A"] * 35)])
                n += 1
            i += 1


def _child(mode: str, path: str) -> None:
    import resource

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if mode == "pandas":
        import pandas as pd

        df = pd.read_csv(path)
        info = f"{len(df)} rows"
    else:
        from npu_deploy.profiling.analyze import analyze_profile

        r = analyze_profile(path)
        info = r.verdict()
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"{dt:.4f} {cpu:.4f} {r1.ru_maxrss} {info}")


def _measure(mode: str, path: Path) -> tuple[float, float, float, str]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], capture_output=True,
                         text=True, check=True)
    dt, cpu, kb, info = out.stdout.strip().split(" ", 3)
    return float(dt), float(cpu), int(kb) / 1024.0, info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", default=None, help="write the generated file here and keep it")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(Path(__file__).with_name("README-profile.md")))
    a = ap.parse_args()
    if a.child:
        _child(*a.child)
        return
    tmp = None
    if a.keep:
        path = Path(a.keep)
    else:
        tmp = tempfile.mkdtemp()
        path = Path(tmp) / "op_summary_20250101000000.csv"
    t0 = time.perf_counter()
    generate(path, a.rows)
    gen_s = time.perf_counter() - t0
    size_mb = path.stat().st_size / 1e6
    pandas_t, ours_t, pandas_cpu, ours_cpu, ours_rss, pandas_rss = [], [], [], [], [], []
    verdict = ""
    for _ in range(a.repeat):
        t, c, rss, _info = _measure("pandas", path)
        pandas_t.append(t)
        pandas_cpu.append(c)
        pandas_rss.append(rss)
        t, c, rss, verdict = _measure("ours", path)
        ours_t.append(t)
        ours_cpu.append(c)
        ours_rss.append(rss)
    pm, om = statistics.median(pandas_t), statistics.median(ours_t)
    pc, oc = statistics.median(pandas_cpu), statistics.median(ours_cpu)
    ratio = oc / pc
    wall_ratio = om / pm
    import pandas

    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"""## `npu-deploy profile analyze`: 1,000,000-row op_summary

Generated by `benchmarks/bench_profile.py` (a CANN 8.x op_summary header with PMU columns, 46 columns,
{a.rows:,} rows, {size_mb:.0f} MB, CRLF, quoted shapes, TAB-suffixed start times; generated in {gen_s:.1f} s).
A stress mix: every other row takes the analyser's detail path (TransData ND↔FRACTAL_NZ round trips
between MatMuls, Transpose, Cast, an AI CPU GatherV2 with int64), plus an all-reduce every 500 rows.
Reproduce: `python benchmarks/bench_profile.py` (needs pandas; about 3 minutes).
Each figure is the median of {a.repeat} runs, each in a fresh process; pandas and ours alternate. The ratio
is taken on CPU time (user + system) of the measured work, which other load on the machine disturbs far
less than wall time; wall times are shown too. Peak RSS is the whole measuring process (Python included).

| machine | Python | pandas | `pandas.read_csv` alone (CPU / wall) | `analyze_profile` (CPU / wall) | ratio, CPU (target ≤ 1.5) | ratio, wall | peak RSS ours (target ≤ 300 MB) | peak RSS pandas |
|---|---|---|---|---|---|---|---|---|
| {cpu}, {os.cpu_count()} cores | {platform.python_version()} | {pandas.__version__} | {pc:.2f} s / {pm:.2f} s | {oc:.2f} s / {om:.2f} s | **{ratio:.2f}×** | {wall_ratio:.2f}× | **{statistics.median(ours_rss):.0f} MB** | {statistics.median(pandas_rss):.0f} MB |

All runs (CPU s): pandas {', '.join(f'{x:.2f}' for x in pandas_cpu)}; ours {', '.join(f'{x:.2f}' for x in ours_cpu)}.
All runs (wall s): pandas {', '.join(f'{x:.2f}' for x in pandas_t)}; ours {', '.join(f'{x:.2f}' for x in ours_t)}.
Verdict on the generated file: `{verdict}`.
"""
    Path(a.out).write_text(text, encoding="utf-8")
    print(text)
    if tmp:
        path.unlink()
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
