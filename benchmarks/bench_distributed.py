"""Benchmarks of batch inference on Ray (``npu_deploy.distributed``) and of cluster profile analysis.

0. ``pool``: what a user waits, call to return: an ``NpuPool`` of 2 emulator actors x 1 thread on PP-OCR cls
   (3,000 arrays), its first call (Ray's local start and the actors' start included) and repeated calls
   on the live actors, against one in-process session's loop, alternated. Target (issue 22): repeated
   calls >= 1.8x on a quiet machine. Runs before Ray is started for the others.
1. ``throughput``: PP-OCR cls (the real model from the test cache, [1,3,48,192]) on 2 emulator actors of
   one onnxruntime thread each vs one in-process session of one thread, same samples, side by side.
   Target (issue 14): >= 1.7x. Three cases: 3,000 arrays from Python (plus two plain processes without
   Ray, the ceiling of the moment); a generator of ``--long`` samples (the rate once a run is under
   way); a folder of 3,000 ``.npy`` to an output folder (``run --input-dir --output``), against one
   session reading, running and writing each file with the same code.
2. ``overhead``: Ray's cost per sample on a tiny model (Add + Relu on [1,8]): run_batch on 1 actor vs the
   same session called in-process. Target: < 1 ms per sample.
3. ``memory``: 100,000 samples of the tiny model streamed through 2 actors; the driver's RSS sampled as
   the run goes (backpressure: it must stay flat).
4. ``cluster``: 64 synthetic ranks x 100,000 kernel rows analysed by ``analyze_cluster`` (2 worker
   processes) vs analysing one rank's rows 64 times in one process. Targets: < 2x that time, < 300 MB
   peak RSS per worker.

Ray start-up and actor start-up are excluded from the timed parts of 1-3 (``BatchResult.wall_s`` starts once the
actors answer) and printed apart; ``pool`` reports them (``BatchResult.call_s``, ``start_s``). The host line
of ``benchmarks/_host.py`` (CPU model, cores, load, "quiet?") is printed at the start and the end.

    python benchmarks/bench_distributed.py [pool|throughput|overhead|memory|cluster ...] [--samples N]
        [--long 20000] [--stream 100000] [--ranks 64] [--rows 100000] [--write] [--no-check]
    python benchmarks/bench_distributed.py --quick      # = pool (issue 22's figure, at its documented size)

**Self-check** of ``pool`` (exit 1 naming the row; ``--no-check`` exits 0 anyway): repeated calls >= 1.8x
(the median of the rounds, missed by more than half their interquartile range) and the figure the README
documents (its generated ``pool`` section, else the hand-written row) within both runs' noise together
and at least ``POOL_FLOOR``, or within the documented rounds. Both are **wall-clock** figures (the speed-up of two processes), so they are
checked only when the host is quiet at the start (``_host.is_quiet``) and, for the documented one, was
quiet when it was measured; on a loaded host the figures are reported with the reason they are not
checked, and the run does not fail on them. The other parts' targets are checked too when they run
(throughput >= 1.7x and the cluster's < 2x only on a quiet host; Ray overhead < 1 ms; driver RSS growing
less than 10 % over the stream; < 300 MB per cluster worker). ``--write`` replaces the README's generated ``pool`` section
(on a quiet host only: the figure it documents is a quiet host's).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))     # benchmarks/_host.py, also when this file is loaded by path (tests)
import _host  # noqa: E402

README = HERE / "README-distributed.md"
POOL_TARGET = 1.8      # repeated run_batch calls on a live pool vs one session, call to return (issue 22)
# a documented pool ratio and a new one may differ by both noises together, at least this share of it:
# two quiet runs minutes apart gave 1.84x and 1.84x, their single rounds 1.79-1.98x
POOL_FLOOR = 0.08
POOL_SECTION = "<!-- bench_distributed.py pool: generated section -->"
CLS = Path(os.environ.get("NPU_DEPLOY_MODEL_CACHE", Path.home() / ".cache" / "npu-deploy")) / "models" / \
    "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _tiny_bundle(d: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import npu_deploy

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    w = numpy_helper.from_array(np.ones((1, 8), np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                          "tiny", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, d / "tiny.onnx")
    npu_deploy.convert(str(d / "tiny.onnx"), output=str(d / "tiny.bundle"), backend="builtin",
                       precision_mode="must_keep_origin_dtype")
    return d / "tiny.bundle"


def _ray(npus: int) -> float:
    import ray

    from npu_deploy._ray import quiet_ray_logs

    quiet_ray_logs()
    t = time.perf_counter()
    ray.init(resources={"NPU": npus}, num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    return time.perf_counter() - t


def _in_process(bundle: Path, xs, threads: int = 1) -> float:
    from npu_deploy.runtime.distributed import open_session

    s = open_session(bundle, threads=threads)
    name = s.get_inputs()[0].name
    s.run(None, {name: np.zeros(s.get_inputs()[0].shape, np.float32)})  # warm-up, as the actors do
    t = time.perf_counter()
    for x in xs:
        s.run(None, {name: x})
    return time.perf_counter() - t


def _folder_in_process(bundle: Path, src: Path, out: Path) -> float:
    """What one session does with a folder of samples: read each file, run, write its output file
    (atomically, as run_batch's driver does), in the code run_batch uses for each step."""
    from npu_deploy.runtime.distributed import _feeds_from_file, _Writer, input_files, open_session

    s = open_session(bundle, threads=1)
    names = [m.name for m in s.get_inputs()]
    files, _ = input_files(src)
    w = _Writer(out, [m.name for m in s.get_outputs()])
    s.run(None, {names[0]: np.zeros(s.get_inputs()[0].shape, np.float32)})
    t = time.perf_counter()
    for p in files:
        w.write(w.path_for(p.name), s.run(None, _feeds_from_file(p, names)))
    return time.perf_counter() - t


def _cycle(pool: list, n: int):
    return itertools.islice(itertools.cycle(pool), n)


def bench_throughput(tmp: Path, samples: int, long: int) -> dict:
    import npu_deploy
    from npu_deploy.runtime.distributed import run_batch

    if not CLS.is_file():
        sys.exit(f"{CLS} missing: run the realmodel tests once (they download it)")
    bundle = tmp / "cls.bundle"
    npu_deploy.convert(str(CLS), output=str(bundle), backend="builtin", input_shapes={"x": (1, 3, 48, 192)})
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 3, 48, 192)).astype(np.float32) * 0.5 for _ in range(samples)]
    src = tmp / "cls-in"
    src.mkdir()
    for i, x in enumerate(xs):
        np.save(src / f"s{i:06d}.npy", x)
    rows, long_rows, folder_rows = [], [], []
    ctx = multiprocessing.get_context("spawn")
    for rep in range(3):  # alternate, take medians
        one = _in_process(bundle, xs, threads=1)
        r = run_batch(bundle, xs, npus=2, threads=1, progress=False)
        # the ceiling at this moment on this machine: two plain processes, no Ray, half the samples each
        with ctx.Pool(2) as pool:
            pool.map(_half, [(str(bundle), 8)] * 2)  # start-up and warm-up, not timed
            two = max(pool.map(_half, [(str(bundle), samples // 2)] * 2))  # the runs only, not the data
        rows.append((samples / one, samples / r.wall_s, (samples // 2 * 2) / two))
        if long:  # a longer stream (a generator over the same samples): the rate once the run is under way
            one = _in_process(bundle, _cycle(xs, long), threads=1)
            r = run_batch(bundle, _cycle(xs, long), npus=2, threads=1, progress=False)
            long_rows.append((long / one, long / r.wall_s))
        for d in ("out-1", "out-2"):
            shutil.rmtree(tmp / d, ignore_errors=True)
        one = _folder_in_process(bundle, src, tmp / "out-1")
        r = run_batch(bundle, src, npus=2, threads=1, output=tmp / "out-2", progress=False)
        assert r.ok == samples, r.verdict()
        folder_rows.append((samples / one, samples / r.wall_s))
    a, b, c = (statistics.median(col) for col in zip(*rows))
    print(f"throughput PP-OCR cls, {samples} samples in memory: 1 session x 1 thread {a:.1f}/s; 2 actors x 1 "
          f"thread {b:.1f}/s = {b / a:.2f}x (target >= 1.7x); 2 plain processes (no Ray) {c:.1f}/s = "
          f"{c / a:.2f}x; runs {[tuple(round(v) for v in row) for row in rows]}")
    if long_rows:
        a, b = (statistics.median(col) for col in zip(*long_rows))
        print(f"throughput PP-OCR cls, a stream of {long} samples: 1 session {a:.1f}/s; 2 actors {b:.1f}/s = "
              f"{b / a:.2f}x; runs {[tuple(round(v) for v in row) for row in long_rows]}")
    arrays = _host.ratio_noise([r[1] / r[0] for r in rows])
    a, b = (statistics.median(col) for col in zip(*folder_rows))
    print(f"throughput PP-OCR cls, folder of {samples} .npy to an output folder (run --input-dir --output): 1 "
          f"session reading, running, writing {a:.1f}/s; run_batch on 2 actors {b:.1f}/s = {b / a:.2f}x; runs "
          f"{[tuple(round(v) for v in row) for row in folder_rows]}")
    return {"arrays": arrays, "folder": _host.ratio_noise([r[1] / r[0] for r in folder_rows])}


def _cpu_load() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    load = os.getloadavg()
    quiet = "quiet" if load[0] < 0.5 * (os.cpu_count() or 1) else "NOT quiet"
    return f"{cpu}, {os.cpu_count()} CPUs, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} ({quiet})"


def bench_pool(tmp: Path, samples: int, rounds: int = 3) -> dict:
    """What a user waits, call to return: one in-process session's loop against an NpuPool's first call
    (Ray's local start, 2 actors opening and warming up their sessions, then the run) and its repeated
    calls on the same live actors. Side by side in one run, alternated; Ray is not started beforehand."""
    import npu_deploy
    from npu_deploy.runtime.distributed import NpuPool, open_session

    if not CLS.is_file():
        sys.exit(f"{CLS} missing: run the realmodel tests once (they download it)")
    bundle = tmp / "cls-pool.bundle"
    npu_deploy.convert(str(CLS), output=str(bundle), backend="builtin", input_shapes={"x": (1, 3, 48, 192)})
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 3, 48, 192)).astype(np.float32) * 0.5 for _ in range(samples)]
    print(f"pool: host {_cpu_load()} at start")
    t, c = time.perf_counter(), time.process_time()
    s = open_session(bundle, threads=1)
    opened, opened_cpu = time.perf_counter() - t, time.process_time() - c
    name = s.get_inputs()[0].name
    s.run(None, {name: xs[0]})

    def one() -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        for x in xs:
            s.run(None, {name: x})
        return time.perf_counter() - t, time.process_time() - c

    singles, repeats = [], []
    with NpuPool(bundle, npus=2, threads=1) as pool:
        singles.append(one())
        first = pool.run_batch(xs, progress=False)
        assert first.ok == samples, first.verdict()
        for _ in range(rounds):
            singles.append(one())
            r = pool.run_batch(xs, progress=False)
            assert r.ok == samples and r.start_s == 0, r.verdict()
            repeats.append(r)
    # the ceiling of the moment on this machine: two plain processes (no Ray), half the samples each
    with multiprocessing.get_context("spawn").Pool(2) as procs:
        procs.map(_half, [(str(bundle), 8)] * 2)  # start-up and warm-up, not timed
        two = max(procs.map(_half, [(str(bundle), samples // 2)] * 2))
    load_end = os.getloadavg()
    one_wall = statistics.median(w for w, _ in singles)
    one_cpu = statistics.median(c for _, c in singles)
    rep = statistics.median(r.call_s for r in repeats)
    print(f"pool PP-OCR cls, {samples} arrays, 2 emulator actors x 1 thread vs 1 in-process session x 1 thread "
          f"(call to return, wall): session loop {one_wall:.2f} s ({samples / one_wall:.0f}/s, {one_cpu:.2f} s CPU; "
          f"opening it {opened:.2f} s, {opened_cpu:.2f} s CPU); first pool call {first.call_s:.2f} s (start "
          f"{first.start_s:.2f} s + run {first.wall_s:.2f} s) = {one_wall / first.call_s:.2f}x "
          f"({(opened + one_wall) / first.call_s:.2f}x counting the session's opening); repeated calls "
          f"{rep:.2f} s = {one_wall / rep:.2f}x (rounds "
          f"{[round(w / r.call_s, 2) for (w, _), r in zip(singles[1:], repeats)]}; their own wall_s "
          f"{statistics.median(r.wall_s for r in repeats):.2f} s); two plain processes (no Ray, the ceiling "
          f"of the moment) {two:.2f} s = {one_wall * (samples // 2 * 2) / samples / two:.2f}x")
    print(f"pool: load average at the end {load_end[0]:.1f}/{load_end[1]:.1f}/{load_end[2]:.1f}")
    ratios = [w / r.call_s for (w, _), r in zip(singles[1:], repeats)]
    ratio, noise = _host.ratio_noise(ratios)
    return {"samples": samples, "ratios": ratios, "ratio": ratio, "noise": noise, "one_wall": one_wall,
            "one_cpu": one_cpu, "opened": opened, "repeat_s": rep, "first_call_s": first.call_s,
            "first_start_s": first.start_s, "first_run_s": first.wall_s, "first": one_wall / first.call_s,
            "two": one_wall * (samples // 2 * 2) / samples / two, "load_end": load_end}


def _half(args) -> float:
    bundle, n = args
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 3, 48, 192)).astype(np.float32) * 0.5 for _ in range(n)]
    return _in_process(Path(bundle), xs, threads=1)


def bench_overhead(tmp: Path, samples: int) -> dict:
    from npu_deploy.runtime.distributed import run_batch

    bundle = _tiny_bundle(tmp)
    xs = [np.random.default_rng(i).standard_normal((1, 8)).astype(np.float32) for i in range(samples)]
    rows = []
    for rep in range(3):
        local = _in_process(bundle, xs, threads=1) / samples
        r1 = run_batch(bundle, xs, npus=1, threads=1, progress=False)
        r2 = run_batch(bundle, xs, npus=2, threads=1, progress=False)
        rows.append((local, r1.wall_s / samples, r2.wall_s / samples))
    local, one, two = (statistics.median(c) for c in zip(*rows))
    print(f"overhead tiny model, {samples} samples: in-process {local * 1e3:.3f} ms/sample; run_batch 1 actor "
          f"{one * 1e3:.3f} ms/sample (Ray overhead {(one - local) * 1e3:.3f} ms, target < 1 ms); 2 actors "
          f"{two * 1e3:.3f} ms/sample")
    return {"overhead_ms": (one - local) * 1e3}


def bench_memory(tmp: Path, n: int) -> dict:
    from npu_deploy.runtime.distributed import run_batch

    bundle = _tiny_bundle(tmp)
    rng = np.random.default_rng(0)
    marks: dict[int, float] = {}
    step = max(1, n // 10)

    def source():
        for _ in range(n):
            yield rng.standard_normal((1, 8)).astype(np.float32)

    def progress(done, total, failed):
        k = done // step * step
        if k and k not in marks:
            marks[k] = _rss_mb()

    before = _rss_mb()
    r = run_batch(bundle, source(), npus=2, threads=1, progress=progress)
    after = _rss_mb()
    shown = ", ".join(f"{k:,}: {v:.0f}" for k, v in sorted(marks.items()))
    print(f"memory {n:,} samples on 2 actors in {r.wall_s:.1f} s ({r.throughput_per_s:.0f}/s), {len(r.failures)} "
          f"failed: driver RSS MB before {before:.0f}, by samples done {{{shown}}}, after {after:.0f}; "
          f"in flight at most {r.max_in_flight}")
    first = marks[min(marks)] if marks else before
    return {"first_mb": first, "after_mb": after, "samples": n}


# ------------------------------------------------------------------------------------------ cluster
KD_HEADER = ("Step Id,Model ID,Task ID,Stream ID,Name,Type,Accelerator Core,Start Time(us),Duration(us),"
             "Wait Time(us),Block Dim,Mix Block Dim,HF32 Eligible,Input Shapes,Input Data Types,Input Formats,"
             "Output Shapes,Output Data Types,Output Formats,Context ID,aicore_time(us),aic_total_cycles\n")


def _write_rank(path: Path, rows: int, rank: int) -> None:
    """A kernel_details.csv: MatMul / Add / TransData rows; TransData durations depend on the rank."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rnd = np.random.default_rng(rank)
    durs = rnd.uniform(5, 50, rows)
    lines = [KD_HEADER]
    t = 1.7e15
    for i in range(rows):
        k = i % 20
        if k == 0:
            name, typ, core = f"trans_TransData_{i}", "TransData", "AI_VECTOR_CORE"
            fmt_in, fmt_out, d = "NCHW", "NC1HWC0", durs[i] * (1 + rank % 4)
        elif k < 10:
            name, typ, core, fmt_in, fmt_out, d = f"MatMul_{i}", "MatMulV2", "AI_CORE", "FRACTAL_NZ", "FRACTAL_NZ", durs[i]
        else:
            name, typ, core, fmt_in, fmt_out, d = f"Add_{i}", "Add", "AI_VECTOR_CORE", "ND", "ND", durs[i]
        lines.append(f'1,4294967295,{i},2,{name},{typ},{core},"{t:.3f}\t",{d:.3f},0,8,0,NO,'
                     f'"""1,64,56,56""",FLOAT16,{fmt_in},"""1,4,56,56,16""",FLOAT16,{fmt_out},N/A,0,0\n')
        t += d + 1.0
    path.write_text("".join(lines))


def _timed(code: str) -> tuple[float, str]:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - t, out.strip()


def bench_cluster(tmp: Path, ranks: int, rows: int) -> dict:
    top = tmp / "cluster"
    t = time.perf_counter()
    for r in range(ranks):
        _write_rank(top / f"rank_{r}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", rows, r)
    size = sum(p.stat().st_size for p in top.rglob("*.csv")) / 2**20
    print(f"cluster: wrote {ranks} ranks x {rows:,} rows ({size:.0f} MB) in {time.perf_counter() - t:.0f} s")
    one = top / "rank_0_ascend_pt"
    single_code = ("import resource,time;from npu_deploy.profiling.analyze import analyze_profile;"
                   f"t=time.perf_counter();analyze_profile({str(one)!r});"
                   "print(time.perf_counter()-t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024)")
    cluster_code = ("import resource,time;from npu_deploy.profiling.cluster import analyze_cluster;"
                    f"t=time.perf_counter();r=analyze_cluster({str(top)!r}, workers=2);"
                    "print(time.perf_counter()-t, r.max_worker_rss_mb, len(r.analysed()), "
                    "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024)")
    singles, clusters = [], []
    for rep in range(2):
        _, out = _timed(single_code)
        s, s_rss = map(float, out.split())
        singles.append((s, s_rss))
        _, out = _timed(cluster_code)
        c, w_rss, n_ok, d_rss = out.split()
        clusters.append((float(c), float(w_rss), int(n_ok), float(d_rss)))
    s = statistics.median(x for x, _ in singles)
    c = statistics.median(x[0] for x in clusters)
    w = max(x[1] for x in clusters)
    print(f"cluster {ranks} ranks x {rows:,} rows: one rank {s:.2f} s (x{ranks} = {s * ranks:.1f} s, peak RSS "
          f"{singles[0][1]:.0f} MB); analyze_cluster 2 workers {c:.1f} s = {c / (s * ranks):.2f}x of {ranks} x one "
          f"rank (target < 2x); peak worker RSS {w:.0f} MB (target < 300 MB); parent RSS {clusters[0][3]:.0f} MB; "
          f"ranks analysed {clusters[0][2]}")
    return {"ratio": c / (s * ranks), "worker_rss_mb": w, "ranks": ranks}


def pool_markdown(fig: dict, host: str, quiet: bool) -> str:
    """The README's generated ``pool`` section (what :func:`documented` reads back)."""
    rounds = ", ".join(f"{r:.2f}" for r in fig["ratios"])
    status = ("met" if fig["ratio"] + fig["noise"] >= POOL_TARGET else "**NOT met**") if quiet else \
        "not judged: the host was not quiet (a wall-clock ratio follows the other jobs)"
    return f"""### `pool`: what a user waits, call to return (generated)

`python benchmarks/bench_distributed.py pool` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}), PP-OCR cls,
{fig['samples']:,} arrays, `NpuPool` of 2 emulator actors × 1 thread against one in-process session × 1 thread,
alternated. Host at the start: {host}; load average at the end {fig['load_end'][0]:.1f} (this run's own
processes included).

| figure | measured | rounds | target |
|---|---|---|---|
| repeated calls (session loop / pool call, wall) | **{fig['ratio']:.2f}×** ± {fig['noise']:.2f} | {rounds} | ≥ {POOL_TARGET}× on a quiet host: {status} |
| first call (Ray's start and the actors' included) | {fig['first']:.2f}× ({fig['first_call_s']:.2f} s = start {fig['first_start_s']:.2f} s + run {fig['first_run_s']:.2f} s) | 1 | reported |
| two plain processes, no Ray (the ceiling of the moment) | {fig['two']:.2f}× | 1 | reported |
| session loop | {fig['one_wall']:.2f} s wall, {fig['one_cpu']:.2f} s CPU (opening it {fig['opened']:.2f} s) | median | – |
"""


def documented(text: str) -> dict | None:
    """The pool figure README-distributed.md documents: {"ratios", "quiet", "samples"} from the
    generated section, else from the hand-written table row; None when neither is there."""
    part = _host.section(text, POOL_SECTION)
    for t in _host.tables(part):
        for r in t:
            if r.get("figure", "").startswith("repeated calls"):
                ratios = [float(x) for x in r["rounds"].split(",") if x.strip()]
                m = re.search(r"PP-OCR cls,\s*([\d,]+) arrays", part)
                return {"ratios": ratios, "quiet": "quiet? quiet" in part.replace("\n", " "),
                        "samples": int(m.group(1).replace(",", "")) if m else None}
    m = re.search(r"repeated calls [\d.]+ s = \*\*[\d.]+×\*\* \(rounds ([\d., ]+)\)", text)
    if m:
        row = next((ln for ln in text.splitlines() if m.group(0) in ln), "")
        n = re.search(r"PP-OCR cls, ([\d,]+) arrays", row)
        return {"ratios": [float(x) for x in m.group(1).split(",") if x.strip()], "quiet": "**Quiet host**" in row,
                "samples": int(n.group(1).replace(",", "")) if n else None}
    return None


def check(pool: dict | None, doc: dict | None, quiet: bool | None = None, other: dict | None = None) -> _host.Check:
    """The pool figure (target and documented), then the targets of the other parts that ran (``other``:
    throughput >= 1.7x and the cluster's < 2x are wall-clock ratios, checked on a quiet host only)."""
    c = _host.Check(quiet)
    o = other or {}
    if "throughput" in o:
        m, n = o["throughput"]["arrays"]
        c.at_least("throughput, 3,000 arrays: 2 actors / 1 session (wall)", m, 1.7, n, wall=True)
    if "overhead" in o:
        c.at_most("Ray overhead per sample, ms", o["overhead"]["overhead_ms"], 1.0)
    if "memory" in o:
        mem = o["memory"]
        c.at_most(f"driver RSS growth over {mem['samples']:,} samples, MB", mem["after_mb"] - mem["first_mb"],
                  _host.RSS_NOISE * mem["first_mb"])
    if "cluster" in o:
        cl = o["cluster"]
        c.at_most(f"cluster {cl['ranks']} ranks / {cl['ranks']} x one rank (wall)", cl["ratio"], 2.0, wall=True)
        c.at_most("cluster: peak RSS per worker, MB", cl["worker_rss_mb"], 300)
    if pool is None:
        return c
    name = f"pool, {pool['samples']:,} arrays: repeated calls / session loop (wall)"
    c.at_least(name, pool["ratio"], POOL_TARGET, pool["noise"], wall=True)
    if doc is None or doc.get("samples") not in (None, pool["samples"]):
        c.notes.append(f"{name}: the README documents no figure for {pool['samples']:,} arrays")
        return c
    dv, dn = _host.ratio_noise(doc["ratios"])
    c.documented(name, pool["ratio"], dv, max(pool["noise"] + dn, POOL_FLOOR * dv), wall=True,
                 doc_quiet=doc["quiet"], doc_rounds=doc["ratios"], noise=pool["noise"])
    return c


def _replace_section(path: Path, text: str, marker: str) -> None:
    """Put ``text`` between two ``marker`` lines of the README (after its first table when absent)."""
    old = path.read_text(encoding="utf-8")
    block = f"{marker}\n{text.rstrip()}\n{marker}\n"
    if old.count(marker) >= 2:
        head, _mid, tail = old.split(marker, 2)
        new = head + block + tail.lstrip("\n")
    else:
        head, sep, tail = old.partition("\n## ")
        new = head.rstrip("\n") + "\n\n" + block + ("\n" + sep.lstrip("\n") + tail if sep else "")
    from npu_deploy._io import atomic_write

    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(new)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="*", default=["pool", "throughput", "overhead", "memory", "cluster"])
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--long", type=int, default=20_000, help="samples of the longer stream (0: skip it)")
    ap.add_argument("--overhead-samples", type=int, default=3000)
    ap.add_argument("--stream", type=int, default=100_000)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--quick", action="store_true", help="pool only (issue 22's figure; about a minute quiet)")
    ap.add_argument("--write", action="store_true", help="replace the README's generated pool section")
    ap.add_argument("--no-check", action="store_true", help="exit 0 even when a checked figure is off")
    args = ap.parse_args(argv)
    what = ["pool"] if args.quick else args.what
    host = _host.describe()
    quiet = _host.is_quiet()    # before this run's own processes add to the load
    print("host:", host, flush=True)
    doc = documented(README.read_text(encoding="utf-8")) if README.is_file() else None
    pool, other = None, {}
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as d:
        tmp = Path(d)
        if "pool" in what:  # first: its first call starts Ray itself, as a user's does
            pool = bench_pool(tmp, args.samples)
        if {"throughput", "overhead", "memory"} & set(what):
            print(f"ray start-up (not timed below): {_ray(2):.1f} s")
        if "throughput" in what:
            other["throughput"] = bench_throughput(tmp, args.samples, args.long)
        if "overhead" in what:
            other["overhead"] = bench_overhead(tmp, args.overhead_samples)
        if "memory" in what:
            other["memory"] = bench_memory(tmp, args.stream)
        if "cluster" in what:
            other["cluster"] = bench_cluster(tmp, args.ranks, args.rows)
        print(f"load average at the end {os.getloadavg()}")
    if pool is not None:
        text = pool_markdown(pool, host, quiet)
        print(text)
        if args.write and not quiet:
            print(f"--write: {README.name} not written: the host was not quiet at the start, and the figure "
                  "it documents is a wall-clock ratio on a quiet host (re-run when the load is below "
                  f"{_host.QUIET_LOAD_PER_CORE:g} per core)")
        elif args.write:
            _replace_section(README, text, POOL_SECTION)
            print(f"wrote the pool section of {README}")
    return check(pool, doc, quiet, other).finish("bench_distributed.py", args.no_check)


if __name__ == "__main__":
    sys.exit(main())
