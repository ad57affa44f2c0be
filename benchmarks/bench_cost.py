"""Cost model against real Ascend910B captures: fit, leave-one-capture-out error per op class.

    python benchmarks/bench_cost.py            # report (about 80 s of CPU: 4 starts per fit)
    python benchmarks/bench_cost.py --write    # also write the built-in Ascend910B calibration
                                               # (converters/lowering/data/soc_calibration_Ascend910B.json)

Captures: every capture with shapes under ../shared/data/timings_910B plus
../shared/data/profiles/torch_npu_level2_llm_910B (all real Ascend910B runs; see their SOURCES.md).
Targets (issue 19): TransData median |error| <= 20 % (p90 <= 50 %), Conv2D and MatMul median <= 25 %,
total device time within +-10 %, FormatTrans share within +-1.5 points, all leave-one-capture-out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from npu_deploy.converters.lowering import cost as C
from npu_deploy.converters.lowering import costcheck as K
from npu_deploy.profiling.ops import read_measured_ops

REPO = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/data") if Path("/work/shared/data").is_dir() else REPO.parent / "shared" / "data"
CAPTURES = [SHARED / "timings_910B", SHARED / "profiles" / "torch_npu_level2_llm_910B"]
OUT = REPO / "converters" / "lowering" / "data" / "soc_calibration_Ascend910B.json"
FITTED_FIELDS = ("fp32_tflops", "vector_efficiency", "bw_efficiency", "aicpu_launch_us", "aicpu_bandwidth_gbps",
                 "fill_efficiency", "dsa_bandwidth_gbps", "transposed_read_efficiency",
                 "cube_write_efficiency",
                 "launch_us_by_engine", "transdata_efficiency_by_pair", "cube_efficiency_by_dtype")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    caps = []
    for root in CAPTURES:
        for c in read_measured_ops(root):
            if c.has_shapes:
                caps.append((c.label, c.ops))
    t0 = time.process_time()
    # the datasheet profile as the start, not an earlier calibration (starting from the last fit made
    # each --write drift a little from the one before)
    base = dataclasses.replace(C.DATASHEET_910B, calibration={})
    prof, res = K.fit(caps, base, name="Ascend910B")
    cpu = time.process_time() - t0
    print(f"{len(caps)} captures, {res.n_ops} priced ops, {res.n_keys} distinct (op, shape) keys, "
          f"{len(res.parameters)} parameters; fit + {len(caps)} leave-one-out fits: {cpu:.1f} s CPU")
    print(res.verdict())
    print(f"left out of the fit (and of every figure below): {res.n_excluded} implausible measurement(s)")
    for label, rows in res.excluded.items():
        for r in rows:
            print(f"  {label}: {r['type']} {r['name']}: {r['why']}")
    print(f"\n{'class':<10}{'ops':>6}{'in-sample median':>18}{'LOO median':>12}{'LOO p90':>10}")
    for cls in K.CLASSES:
        a = res.in_sample["per_class"].get(cls)
        b = res.leave_one_out.get("per_class", {}).get(cls)
        if a and b:
            print(f"{cls:<10}{a['count']:>6}{a['median_abs_err_pct']:>17.1f}%{b['median_abs_err_pct']:>11.1f}%"
                  f"{b['p90_abs_err_pct']:>9.1f}%")
    print(f"\nper capture, leave-one-out (fitted without it):")
    print(f"{'capture':<34}{'median':>8}{'total err':>11}{'FT meas':>9}{'FT pred':>9}  per class median")
    for label, s in res.leave_one_out.get("per_capture", {}).items():
        pc = ", ".join(f"{k} {v['median_abs_err_pct']:.0f} %" for k, v in s["per_class"].items())
        print(f"{label[:33]:<34}{s['median_abs_err_pct']:>7.1f}%{s['total_error_pct']:>+10.1f}%"
              f"{s['formattrans_measured_pct']:>8.2f}%{s['formattrans_predicted_pct']:>8.2f}%  {pc}")
    for label, s in res.leave_one_out.get("per_capture", {}).items():
        mm = s.get("per_type", {}).get("MatMulV2")
        if label.startswith("cnn") and mm:
            print(f"  {label}: fp32 MatMulV2 (x·Wᵀ + bias forward, Mm backward) {mm['count']} ops, median "
                  f"{mm['median_abs_err_pct']:.1f} %, measured {mm['measured_us']:.0f} µs, predicted "
                  f"{mm['predicted_us']:.0f} µs")
    print("\nper op type, leave-one-out (the 20 largest by measured time, then a few small ones):")
    print(f"{'op type':<30}{'ops':>6}{'measured us':>13}{'predicted us':>14}{'median':>9}{'p90':>9}")
    per_type = res.leave_one_out.get("per_type", {})
    named = ("MemSet", "TopKV2", "DSAGenBitMask", "MaxPoolWithArgmaxV1", "MaxPoolGradWithArgmaxV1", "NonZero")
    for t, v in [kv for k, kv in enumerate(per_type.items()) if k < 20 or kv[0] in named]:
        print(f"{t[:29]:<30}{v['count']:>6}{v['measured_us']:>13.0f}{v['predicted_us']:>14.0f}"
              f"{v['median_abs_err_pct']:>8.1f}%{v['p90_abs_err_pct']:>8.1f}%")
    print("\nparameters:")
    for k, v in res.parameters.items():
        print(f"  {k} = {v:.4g}")
    if args.write:
        d = {k: getattr(prof, k) for k in FITTED_FIELDS}
        d["sources"] = {k: v for k, v in prof.sources.items() if v.startswith("fitted")}
        d["calibration"] = dict(prof.calibration, captures=[c[0] for c in caps],
                                leave_one_out_median_pct=round(res.leave_one_out["median_abs_err_pct"], 1),
                                per_type={k: round(v["median_abs_err_pct"], 1)
                                          for k, v in res.leave_one_out["per_class"].items()})
        OUT.write_text(json.dumps(d, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"\nwrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
