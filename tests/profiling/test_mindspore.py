"""MindSpore 1.x profiler output: ``aicore_intermediate_{dev}_type.csv`` / ``_detail.csv`` and
``timeline_display_{dev}.json``.

``reference/msprof.md`` does not document these files. The fixtures use MindSpore 1.x's publicly known
column names (its profiler's integrator): type = ``op_type, execution_time, execution_frequency, percent``
with times in ms; detail = ``full_op_name, execution_time`` (ms). The numbers echo the issue's 2-device
AlexNet capture: 67 ms of AI Core time per device, TransData 8.7 ms (13.0 %, FLAGGED) on device 0 and
1.0 ms (1.5 %, ok) on device 1. Expected values are computed by hand from the rows below.
"""

from __future__ import annotations

import json

import pytest

from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.profiling.discover import discover

TYPES = {  # op type -> (ms, number of ops) per device
    0: {"Conv2D": (30.0, 5), "MatMul": (20.0, 3), "TransData": (8.7, 12), "ReLU": (5.0, 7),
        "MaxPool": (3.0, 3), "BiasAdd": (0.3, 8)},
    1: {"Conv2D": (30.0, 5), "MatMul": (20.0, 3), "TransData": (1.0, 2), "ReLU": (12.7, 7),
        "MaxPool": (3.0, 3), "BiasAdd": (0.3, 8)},
}


def write_type_csv(folder, dev):
    total = sum(ms for ms, _n in TYPES[dev].values())
    lines = ["op_type,execution_time,execution_frequency,percent"]
    lines += [f"{op},{ms},{n},{round(100 * ms / total, 2)}" for op, (ms, n) in TYPES[dev].items()]
    (folder / f"aicore_intermediate_{dev}_type.csv").write_text("\n".join(lines) + "\n")


def write_detail_csv(folder, dev):
    lines = ["full_op_name,execution_time"]
    for op, (ms, n) in TYPES[dev].items():
        for k in range(n):
            lines.append(f"Default/network-WithLossCell/_backbone-AlexNet/{op}-op{100 + k},{ms / n}")
    (folder / f"aicore_intermediate_{dev}_detail.csv").write_text("\n".join(lines) + "\n")


def write_timeline(folder, dev):
    ev = [{"ph": "M", "name": "process_name", "pid": dev, "args": {"name": "Ascend Op"}},
          {"ph": "M", "name": "thread_name", "pid": dev, "tid": 1, "args": {"name": "Stream #1"}},
          {"ph": "M", "name": "thread_name", "pid": dev, "tid": 2, "args": {"name": "AI CPU Op"}},
          {"ph": "M", "name": "thread_name", "pid": dev, "tid": 3, "args": {"name": "Merged Computation Op"}},
          {"ph": "M", "name": "thread_name", "pid": dev, "tid": 4, "args": {"name": "Steps"}},
          {"ph": "M", "name": "thread_name", "pid": dev, "tid": 5, "args": {"name": "Communication Op"}}]
    t = 0.0
    for name, tid, us in (("Default/Conv2D-op1", 1, 60.0), ("Default/TransData-op2", 1, 30.0),
                          ("Default/GatherV2-op3", 2, 10.0)):
        ev.append({"ph": "X", "name": name, "pid": dev, "tid": tid, "ts": t, "dur": us})
        t += us
    ev.append({"ph": "X", "name": "Computation Op", "pid": dev, "tid": 3, "ts": 0.0, "dur": 100.0})
    ev.append({"ph": "X", "name": "1", "pid": dev, "tid": 4, "ts": 0.0, "dur": 150.0})
    ev.append({"ph": "X", "name": "Default/AllReduce-op4", "pid": dev, "tid": 5, "ts": 100.0, "dur": 40.0})
    (folder / f"timeline_display_{dev}.json").write_text(json.dumps(ev))


@pytest.fixture
def profiler(tmp_path):
    folder = tmp_path / "data" / "profiler"      # MindSpore 1.x's default output folder
    folder.mkdir(parents=True)
    for dev in (0, 1):
        write_type_csv(folder, dev)
        write_detail_csv(folder, dev)
        write_timeline(folder, dev)
    return folder


def test_type_tables_give_op_type_totals_and_transdata_share(profiler, tmp_path):
    r = analyze_profile(tmp_path)                  # found below ./data, which is not a raw-data folder here
    assert r.compute_us == pytest.approx(134_000.0)
    assert r.transdata_us == pytest.approx(9_700.0) and r.transdata_ops == 14
    by_type = {o.op_type: o for o in r.op_types}
    assert by_type["Conv2D"].total_us == pytest.approx(60_000.0) and by_type["Conv2D"].count == 10
    assert r.detail == "totals only"
    d = {x.device: x for x in r.devices}
    assert d["device_0"].share_pct == pytest.approx(100 * 8.7 / 67) and d["device_0"].flagged
    assert d["device_1"].share_pct == pytest.approx(100 * 1.0 / 67) and not d["device_1"].flagged
    assert r.flagged


def test_type_table_is_preferred_and_the_others_are_named(profiler):
    disc = discover(profiler)
    (cap,) = disc.captures
    assert cap.used.kind == "ms_aicore_type" and [p.name for p in cap.used.paths] == [
        "aicore_intermediate_0_type.csv", "aicore_intermediate_1_type.csv"]
    assert {s.kind for s in cap.unused} == {"ms_aicore_detail", "ms_timeline"}
    assert all("is preferred" in s.reason for s in cap.unused)


def test_detail_table_alone_classifies_by_scope_name(tmp_path):
    write_detail_csv(tmp_path, 0)
    r = analyze_profile(tmp_path / "aicore_intermediate_0_detail.csv")
    assert r.compute_us == pytest.approx(67_000.0)
    assert r.transdata_pct == pytest.approx(100 * 8.7 / 67) and r.transdata_ops == 12
    assert r.classified_by_name == 38
    names = {i.name for k in r.conversions for i in k.top}
    assert "Default/network-WithLossCell/_backbone-AlexNet/TransData-op100" in names


def test_timeline_display_alone_reads_kernel_threads_only(tmp_path):
    write_timeline(tmp_path, 3)
    r = analyze_profile(tmp_path / "timeline_display_3.json")
    # Stream #1 (90 µs) + AI CPU Op (10 µs); the merged summary, steps and free time are not kernels
    assert r.compute_us == pytest.approx(100.0) and r.transdata_pct == pytest.approx(30.0)
    assert r.communication_us == pytest.approx(40.0)
    assert r.ai_cpu_us == pytest.approx(10.0)
    assert [(s.device, s.kind, s.count, s.total_us) for s in r.steps] == [("device_3", "Step", 1, 150.0)]


def test_prof_raw_data_folders_are_still_skipped(tmp_path):
    from tests.profiling.helpers import op, write_csv

    prof = tmp_path / "PROF_000001_20230628101435646_FKFLNPEPPRRCFCBA"
    write_csv(prof / "device_0" / "summary" / "op_summary_0_1.csv", [op("MatMul_0", "MatMulV2", "AI_CORE", "9.0")],
              style="op_summary_device")
    write_csv(prof / "device_0" / "data" / "op_summary_0_1.csv", [op("Add_0", "Add", "AI_CORE", "1.0")],
              style="op_summary_device")
    r = analyze_profile(prof)
    assert r.compute_us == pytest.approx(9.0)
