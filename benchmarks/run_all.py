"""Run the benchmarks whose figures the READMEs quote, as one command, and fail loudly when a figure is off.

    python benchmarks/run_all.py --quick            # the quick modes (a few minutes on 2 cores)
    python benchmarks/run_all.py --quick --write    # ... and rewrite the READMEs they own
    python benchmarks/run_all.py                    # the full runs

Each benchmark runs in its own process (one after the other, in the order of ``BENCHMARKS``: they would
disturb each other's timings) with this interpreter; its output streams through. The 1-minute load
average remembers the previous benchmark for a minute, so before each one this script waits (up to
``--settle`` seconds, 60 by default) for the host to look quiet again; ``bench_distributed.py``, whose
figure is a wall-clock ratio, runs first. Before and after, the host line of
:mod:`_host` (CPU model, cores, caches, load averages, the "quiet?" verdict) is printed, so the
figures above it carry the conditions they were measured under. A benchmark checks its own figures
against its targets and the values its README documents (within their noise) and exits 1 when one
is off, naming the row; this script then exits 1 too and names the benchmark. ``--quick`` runs:

* ``bench_distributed.py --quick``: the ``NpuPool`` call-to-return figure, 3,000 PP-OCR cls arrays
  (a wall-clock ratio: checked only on a quiet host) (README-distributed.md);
* ``bench_formats.py --quick``: pack/unpack at 4 KiB and 16 MiB (README-formats.md);
* ``bench_convert.py --quick``: convert peak RSS and CPU vs ``onnx.load`` + ``onnx.save`` on the 912 MiB
  external-data model, 3 interleaved rounds, and planning 2,000 nodes (README-convert.md);
* ``bench_profile.py --quick``: the wide 1,000,000-row kernel_details.csv vs pandas, 5 interleaved
  rounds, and the two real-mix timelines at 0.25 GiB (the full figure: 2 GiB) (README-profile.md).

The full runs (without ``--quick``) measure the same at the documented sizes, plus the rest of each
script; ``--write`` lets each rewrite its README (the three above only from a full run). The other
``bench_*.py`` scripts have no self-check yet and are listed as not part of it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import _host  # noqa: E402

# name -> (quick arguments or None when it has no quick mode, full arguments, arguments to write its README)
# (run in this order)
BENCHMARKS: dict[str, tuple[list[str] | None, list[str], list[str]]] = {
    "bench_distributed.py": (["--quick"], [], ["--write"]),
    "bench_formats.py": (["--quick", "--reps", "5"], ["--reps", "5", "--runs", "5"], ["--write"]),
    "bench_convert.py": (["--quick"], [], ["--write"]),
    "bench_profile.py": (["--quick"], ["--op-summary", "--wide", "--repeat", "5", "--timeline", "2",
                                       "--baseline-gib", "0.1"], ["--write"]),
}


def settle(max_s: float, step: float = 5.0) -> float:
    """Wait until the host looks quiet (:func:`_host.is_quiet`) or ``max_s`` seconds have passed; the
    seconds waited."""
    t0 = time.perf_counter()
    while not _host.is_quiet() and time.perf_counter() - t0 < max_s:
        time.sleep(step)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the benchmarks' quick modes only")
    ap.add_argument("--write", action="store_true", help="let each benchmark rewrite its README")
    ap.add_argument("--only", action="append", default=[], metavar="SCRIPT", help="run only these scripts")
    ap.add_argument("--settle", type=float, default=60.0, metavar="S",
                    help="before each benchmark, wait up to S seconds for the host to look quiet (0: never)")
    args = ap.parse_args(argv)
    print("host:", _host.describe(), flush=True)
    known = sorted(p.name for p in HERE.glob("bench_*.py"))
    unknown = [s for s in args.only if s not in BENCHMARKS]
    if unknown:
        print(f"run_all: unknown benchmark(s) {', '.join(unknown)} (known: {', '.join(BENCHMARKS)})",
              file=sys.stderr)
        return 2
    failed, ran = [], []
    t_all = time.perf_counter()
    for name in BENCHMARKS:
        if args.only and name not in args.only:
            continue
        quick, full, write = BENCHMARKS[name]
        if args.quick and quick is None:
            print(f"== {name}: skipped (no quick mode)")
            continue
        cmd = [sys.executable, str(HERE / name), *(quick if args.quick else full), *(write if args.write else [])]
        if args.settle > 0 and not _host.is_quiet():
            waited = settle(args.settle)
            print(f"== waited {waited:.0f} s for the load to settle: {_host.load_line()}", flush=True)
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=HERE.parent).returncode
        ran.append(name)
        print(f"== {name}: exit {rc} after {time.perf_counter() - t0:.0f} s; {_host.load_line()}", flush=True)
        if rc != 0:
            failed.append(f"{name} (exit {rc})")
    skipped = [n for n in known if n not in BENCHMARKS]
    if skipped:
        print(f"not part of run_all yet (no self-check / quick mode): {', '.join(skipped)}")
    print(f"run_all: {len(ran)} benchmark(s) in {time.perf_counter() - t_all:.0f} s")
    print("host:", _host.describe())
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"all {len(ran)} benchmark(s) within their targets and documented figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
