"""Benchmarks of ``npu-deploy profile analyze`` on generated inputs (never kept in the repository).

1. A 1,000,000-row op_summary vs ``pandas.read_csv`` of the same file. Targets (issue "npu-deploy
   profile"): analysis time ≤ 1.5 × pandas.read_csv alone, peak RSS ≤ 300 MB.
2. ``--timeline GiB``: a Chrome-trace ``trace_view.json`` of that size (torch_npu layout: host, CANN,
   Ascend Hardware and HCCL processes), analysed by the streaming reader vs ``json.load`` of the same
   file (what the reader replaced). Target (issue 12): peak RSS ≤ 300 MB whatever the size.

Each measurement runs in a fresh subprocess (so peak RSS is that of the measured work only), the two
alternate, and the median of ``--repeat`` runs is reported. Figures go to ``benchmarks/README-profile.md``
(the timeline run replaces only its own section there).

    python benchmarks/bench_profile.py [--rows 1000000] [--repeat 3] [--keep FILE]
    python benchmarks/bench_profile.py --timeline 2 [--repeat 1] [--baseline-gib 0.5]
    python benchmarks/bench_profile.py --wide [--rows 1000000] [--repeat 3] [--keep FILE] [--no-fallback]

The script imports the installed ``npu_deploy`` (editable or not); it needs no ``sys.path`` changes.
pandas is only the yardstick here, not a dependency of npu-deploy.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from npu_deploy.profiling.parse import SORT_RUN

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


REAL_KERNELS = Path(__file__).resolve().parents[2] / "shared" / "data" / "timings_910B"


def generate_wide(path: Path, rows: int, seed: int = 0) -> int:
    """A ``kernel_details.csv`` of ``rows`` rows with the header of a real torch_npu capture (the 46
    columns of ``../shared/data/timings_910B/cnn_level2_*``, PMU columns included): the data lines of the
    real files resampled byte for byte (their quoting, TAB-suffixed start times and ``N/A`` cells kept),
    with the start time of each copy shifted so that time goes forward. Returns the number of columns."""
    srcs = sorted(REAL_KERNELS.glob("cnn_level*/ASCEND_PROFILER_OUTPUT/kernel_details.csv"))
    if not srcs:
        raise SystemExit(f"{REAL_KERNELS} not found (../shared beside the clone): cannot build the wide CSV")
    header = None
    lines: list[list[str]] = []
    for p in srcs:
        with open(p, newline="", encoding="utf-8") as f:
            recs = list(csv.reader(f))
        if header is None:
            header = recs[0]
        if recs[0] != header:
            continue
        lines += [r for r in recs[1:] if len(r) == len(header)]
    i_start = header.index("Start Time(us)")
    rnd = random.Random(seed)
    t = 1736412474759767.0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for _ in range(rows):
            r = list(rnd.choice(lines))
            t += 1.0 + 50.0 * rnd.random()
            r[i_start] = f"{t:.3f}\t"
            w.writerow(r)
    return len(header)


def generate_timeline(path: Path, size_bytes: int, seed: int = 0) -> int:
    """A torch_npu-style trace_view.json of about ``size_bytes``: metadata first, then per step host
    events, CANN events, Ascend Hardware kernels (a TransData every 10th) and an HCCL collective.
    Returns the number of events."""
    rnd = random.Random(seed)
    host, cann, hw, hccl = 437675, 43767502, 800, 801
    meta = [(host, "Python"), (cann, "CANN"), (hw, "Ascend Hardware"), (hccl, "HCCL")]
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        f.write("[\n")
        for pid, name in meta:
            f.write(f'{{"ph": "M", "name": "process_name", "pid": {pid}, "tid": 0, "args": {{"name": "{name}"}}}},\n')
            n += 1
        f.write(f'{{"ph": "M", "name": "process_labels", "pid": {hw}, "tid": 0, "args": {{"labels": "NPU 0"}}}},\n')
        f.write(f'{{"ph": "M", "name": "thread_name", "pid": {hw}, "tid": 3, "args": {{"name": "Stream 3"}}}}')
        n += 2
        t = 1704161511422904.0
        i = 0
        kernels = ("aclnnMm_MatMulCommon_MatMulV2", "aclnnAdd_AddAiCore_Add", "aclnnRelu_ReluAiCore_Relu",
                   "aclnnInplaceMuls_MulsAiCore_Muls", "aclnnReduceSum_ReduceSumAiCore_ReduceSum")
        while f.tell() < size_bytes:
            lines = []
            for k in range(200):
                i += 1
                d = 5.0 + 20.0 * rnd.random()
                lines.append(f',\n{{"ph": "X", "name": "aten::op_{k % 7}", "pid": {host}, "tid": {host}, '
                             f'"ts": "{t:.3f}", "dur": {d + 2:.3f}, "args": {{"Sequence number": {i}, '
                             f'"Fwd thread id": 0}}}}')
                lines.append(f',\n{{"ph": "X", "name": "AscendCL@aclnnOp_{k % 7}", "pid": {cann}, '
                             f'"tid": {host}, "ts": "{t + 1:.3f}", "dur": {d:.3f}, "args": {{"Thread Id": {host}, '
                             f'"Mode": "ACL_OP", "level": "acl", "id": "{i}", "item_id": "0", "connection_id": {i}}}}}')
                name = "trans_TransData_%d" % i if k % 10 == 0 else kernels[k % 5]
                lines.append(f',\n{{"ph": "X", "name": "{name}", "pid": {hw}, "tid": 3, "ts": "{t + 3:.3f}", '
                             f'"dur": {d:.4f}, "args": {{"Model Id": 4294967295, "Task Type": '
                             f'"{"AI_VECTOR_CORE" if k % 2 else "AI_CORE"}", "Stream Id": 3, "Task Id": {i % 65536}, '
                             f'"Batch Id": 0, "Subtask Id": 4294967295, "connection_id": {i}}}}}')
                t += d + 4.0
                n += 3
            lines.append(f',\n{{"ph": "X", "name": "hcom_allReduce__{i}_0", "pid": {hccl}, "tid": 0, '
                         f'"ts": "{t:.3f}", "dur": 150.0, "args": {{"connection_id": {i}}}}}')
            t += 151.0
            n += 1
            f.write("".join(lines))
        f.write("\n]\n")
    return n


REAL_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiles" / "mstt_fixtures" / "trace_view.json"


def generate_real_timeline(path: Path, size_bytes: int, *, shuffle: bool, seed: int = 0) -> int:
    """The real torch_npu timeline of ``../shared`` (mstt fixture: host cpu_ops, flows, CANN and
    Ascend Hardware events, every event kind of a real capture) repeated up to ``size_bytes``, each copy
    shifted in time and its flow ids renumbered. ``shuffle``: the events of each copy in random order,
    so that every thread, the device's included, goes back in time (the reader must sort them).
    Returns the number of events."""
    import json

    src = json.loads(REAL_TRACE.read_text(encoding="utf-8"))
    stamps = [float(e["ts"]) for e in src if "ts" in e]
    span = max(stamps) - min(stamps) + 100.0
    meta = [e for e in src if e.get("ph") == "M"]
    body = [e for e in src if e.get("ph") != "M"]
    rnd = random.Random(seed)
    n = len(meta)
    with open(path, "w", encoding="utf-8") as f:
        f.write("[" + ",\n".join(json.dumps(e) for e in meta))
        k = 0
        while f.tell() < size_bytes:
            out = []
            for e in body:
                e = dict(e)
                if "ts" in e:
                    e["ts"] = f"{float(e['ts']) + k * span:.3f}"
                if isinstance(e.get("id"), int):
                    e["id"] += k * 1_000_000
                out.append(json.dumps(e))
            if shuffle:
                rnd.shuffle(out)
            f.write(",\n" + ",\n".join(out))
            n += len(out)
            k += 1
        f.write("]\n")
    return n


def _child(mode: str, path: str) -> None:
    import resource

    # the --wide modes time the work, not the imports
    if mode == "pandas+groupby":
        import pandas  # noqa: F401
    elif mode == "analyze":
        import npu_deploy.converters.formats  # noqa: F401  (numpy: the analysis imports it on first use)
        import npu_deploy.profiling.analyze  # noqa: F401
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    if mode == "pandas":
        import pandas as pd

        df = pd.read_csv(path)
        info = f"{len(df)} rows"
    elif mode == "pandas+groupby":
        import pandas as pd

        df = pd.read_csv(path)
        by_type = df.groupby("Type")["Duration(us)"].sum()
        info = f"{len(df)} rows, {len(by_type)} types"
    elif mode == "json.load":
        import json

        with open(path, "rb") as f:
            events = json.load(f)
        info = f"{len(events)} events"
    else:
        from npu_deploy.profiling.analyze import analyze_profile

        r = analyze_profile(path)
        info = r.verdict()
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(f"{dt:.4f} {cpu:.4f} {r1.ru_maxrss} {info}")


def _measure(mode: str, path: Path, env: dict | None = None) -> tuple[float, float, float, str]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], capture_output=True,
                         text=True, check=True, env=None if env is None else {**os.environ, **env})
    dt, cpu, kb, info = out.stdout.strip().split(" ", 3)
    return float(dt), float(cpu), int(kb) / 1024.0, info


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


_CSV_SECTION = "<!-- bench_profile.py: generated section -->"
_SECTION = "<!-- bench_profile.py --timeline: generated section -->"


def _replace_section(path: Path, text: str, marker: str = _SECTION) -> None:
    """Put ``text`` between the two ``marker`` lines of the README (appended when absent); the rest of
    the file (notes written by hand, the other section) is kept."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{marker}\n{text.rstrip()}\n{marker}\n"
    if old.count(marker) >= 2:
        head, _mid, tail = old.split(marker, 2)
        new = head + block + tail.lstrip("\n")
    else:
        new = old.rstrip("\n") + "\n\n" + block
    path.write_text(new, encoding="utf-8")


def timeline_main(a) -> None:
    """Peak RSS and CPU time of ``analyze_profile`` on timelines of ``a.timeline`` GiB of three event
    mixes (the real capture repeated, the same shuffled, the generated synthetic mix), each beside
    ``json.load`` of a small file of the same mix."""
    tmp = Path(tempfile.mkdtemp())
    mixes = [("real capture repeated", "real"), ("real, every thread out of time order", "shuffled"),
             ("synthetic (generated events)", "synthetic")]
    if not REAL_TRACE.is_file():
        print(f"note: {REAL_TRACE} not found (../shared beside the clone): synthetic mix only")
        mixes = mixes[2:]

    def make(path: Path, size: int, mix: str) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        if mix == "synthetic":
            return generate_timeline(path, size)
        return generate_real_timeline(path, size, shuffle=mix == "shuffled")

    rows = []
    verdicts = {}
    try:
        for label, mix in mixes:
            big, small = tmp / mix / "big" / "trace_view.json", tmp / mix / "small" / "trace_view.json"
            n_big = make(big, int(a.timeline * (1 << 30)), mix)
            make(small, int(a.baseline_gib * (1 << 30)), mix)
            runs: dict[str, list] = {"big": [], "small": [], "json": []}
            for _ in range(a.repeat):
                runs["json"].append(_measure("json.load", small))
                runs["small"].append(_measure("ours", small))
                runs["big"].append(_measure("ours", big))

            def med(key, i, runs=runs):
                return statistics.median(r[i] for r in runs[key])

            gib_big, gib_small = big.stat().st_size / (1 << 30), small.stat().st_size / (1 << 30)
            verdicts[label] = runs["big"][-1][3]
            rows.append(f"| {label} | {gib_big:.2f} GiB ({n_big:,} events) | {med('big', 1):.1f} s / {med('big', 0):.1f} s "
                        f"| **{med('big', 2):.0f} MB** | {gib_small:.2f} GiB: {med('small', 2):.0f} MB "
                        f"| {med('json', 2):.0f} MB |")
            for p in (big, small):
                p.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()
    text = f"""## `npu-deploy profile analyze`: {a.timeline:g} GiB timelines, streamed

Generated by `benchmarks/bench_profile.py --timeline {a.timeline:g}` on {_machine()}, Python
{platform.python_version()}; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} cores
(wall times inflate under load; CPU times and peak RSS much less). Median of {a.repeat} run(s), each in a fresh
process; peak RSS is the whole process (the interpreter and its imports are about 25 MB of it).
The real mix is `../shared/data/profiles/mstt_fixtures/trace_view.json` (a real torch_npu capture: host
`cpu_op`s going back in time, flows, CANN and Ascend Hardware events) repeated and shifted in time; the
shuffled mix puts each copy's events in random order, so the device's threads must be sorted (in runs of
{SORT_RUN:,} records spilled to a temporary folder and merged). Target: ≤ 100 MB for 2 GiB of any mix.

| event mix | file | CPU / wall | peak RSS | small file | `json.load` of the small file |
|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n\n" + "\n".join(f"Verdict, {k}: `{v}`." for k, v in verdicts.items()) + "\n"
    print(text)
    if a.out:
        _replace_section(Path(a.out), text)


_WIDE_SECTION = "<!-- bench_profile.py --wide: generated section -->"


def wide_main(a) -> None:
    """CPU time of ``analyze_profile`` on a wide ``kernel_details.csv`` (the 46 columns of a real capture,
    resampled) beside ``pandas.read_csv`` + a groupby-sum by type of the same file, in fresh processes,
    alternating: the compiled extractor, the csv-module fallback (``NPU_DEPLOY_CSV_KERNEL=0``), pandas."""
    from npu_deploy.profiling.parse import csv_kernel_info

    tmp = None
    if a.keep:
        path = Path(a.keep)
    else:
        tmp = tempfile.mkdtemp()
        path = Path(tmp) / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not (a.keep and path.is_file()):
        ncols = generate_wide(path, a.rows)
    else:
        with open(path, newline="", encoding="utf-8") as f:
            ncols = len(next(csv.reader(f)))
    info = csv_kernel_info()
    if info["status"] != "loaded":
        print(f"note: the compiled CSV extractor is not in use ({info['status']}: {info['reason']})")
    size_mb = path.stat().st_size / 1e6
    load0 = os.getloadavg()
    runs: dict[str, list] = {"pandas": [], "ours": [], "fallback": []}
    verdicts = set()
    for _ in range(a.repeat):
        runs["pandas"].append(_measure("pandas+groupby", path))
        r = _measure("analyze", path)
        runs["ours"].append(r)
        verdicts.add(r[3])
        if not a.no_fallback:
            r = _measure("analyze", path, {"NPU_DEPLOY_CSV_KERNEL": "0"})
            runs["fallback"].append(r)
            verdicts.add(r[3])
    load1 = os.getloadavg()
    cores = os.cpu_count() or 1
    quiet = max(load0[0], load1[0]) < 0.5 * cores
    import pandas

    def med(key, i):
        return statistics.median(r[i] for r in runs[key])

    pc = med("pandas", 1)
    lines = [(f"| pandas.read_csv + groupby-sum by type | {pc:.2f} s / {med('pandas', 0):.2f} s | 1.00× "
              f"| {med('pandas', 2):.0f} MB |"),
             (f"| `analyze_profile`, compiled extractor | {med('ours', 1):.2f} s / {med('ours', 0):.2f} s "
              f"| **{med('ours', 1) / pc:.2f}×** | {med('ours', 2):.0f} MB |")]
    if runs["fallback"]:
        lines.append(f"| `analyze_profile`, csv module (`NPU_DEPLOY_CSV_KERNEL=0`) | {med('fallback', 1):.2f} s / "
                     f"{med('fallback', 0):.2f} s | {med('fallback', 1) / pc:.2f}× | {med('fallback', 2):.0f} MB |")
    allruns = "; ".join(f"{k} {', '.join(f'{r[1]:.2f}' for r in v)}" for k, v in runs.items() if v)
    rounds = ", ".join(f"{o[1] / p[1]:.2f}×" for p, o in zip(runs["pandas"], runs["ours"]))
    text = f"""## `npu-deploy profile analyze`: a wide kernel_details.csv ({a.rows:,} rows, {ncols} columns)

Generated by `benchmarks/bench_profile.py --wide` on {_machine()}, Python {platform.python_version()},
pandas {pandas.__version__}; load average {load0[0]:.1f} at the start and {load1[0]:.1f} at the end on {cores} cores
(quiet? **{'yes' if quiet else 'no: the machine was shared, wall times are inflated; CPU times much less'}**).
The file: the data lines of the real torch_npu captures in `../shared/data/timings_910B/cnn_level*`
(46 columns, PMU counters included, quoted shapes, TAB-suffixed start times) resampled to {a.rows:,} rows,
{size_mb:.0f} MB. Each figure is the median of {a.repeat} runs, each in a fresh process, the three
alternating; the ratio is on CPU time (user + system) of the measured work, imports (pandas, npu_deploy)
done before the clock starts. Peak RSS is the whole process. Target (issue 22): ≤ 1.2×.

| work | CPU / wall | ratio, CPU | peak RSS |
|---|---|---|---|
""" + "\n".join(lines) + f"""

All runs (CPU s): {allruns}. Ratio of each round (ours / the pandas run just before it): {rounds}.
Verdict: `{' / '.join(sorted(verdicts))}`.
"""
    if a.out:
        _replace_section(Path(a.out), text, _WIDE_SECTION)
    print(text)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", default=None, help="write the generated file here and keep it")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(Path(__file__).with_name("README-profile.md")))
    ap.add_argument("--timeline", type=float, default=None, metavar="GIB",
                    help="benchmark the streaming timeline reader on a generated trace_view.json of GIB GiB")
    ap.add_argument("--baseline-gib", type=float, default=0.25,
                    help="size of the file json.load is measured on (it needs several times it in memory)")
    ap.add_argument("--wide", action="store_true",
                    help="benchmark a wide kernel_details.csv (real capture columns) against pandas + groupby")
    ap.add_argument("--no-fallback", action="store_true", help="--wide: do not also time the csv-module path")
    a = ap.parse_args()
    if a.child:
        _child(*a.child)
        return
    if a.wide:
        wide_main(a)
        return
    if a.timeline is not None:
        timeline_main(a)
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

    machine = _machine()
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
| {machine} | {platform.python_version()} | {pandas.__version__} | {pc:.2f} s / {pm:.2f} s | {oc:.2f} s / {om:.2f} s | **{ratio:.2f}×** | {wall_ratio:.2f}× | **{statistics.median(ours_rss):.0f} MB** | {statistics.median(pandas_rss):.0f} MB |

All runs (CPU s): pandas {', '.join(f'{x:.2f}' for x in pandas_cpu)}; ours {', '.join(f'{x:.2f}' for x in ours_cpu)}.
All runs (wall s): pandas {', '.join(f'{x:.2f}' for x in pandas_t)}; ours {', '.join(f'{x:.2f}' for x in ours_t)}.
Verdict on the generated file: `{verdict}`.
"""
    if a.out:
        _replace_section(Path(a.out), text, _CSV_SECTION)
    print(text)
    if tmp:
        path.unlink()
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
