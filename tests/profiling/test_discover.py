"""Discovery of every documented layout (reference/msprof.md §1), and never mixing two copies of the data."""

from __future__ import annotations

import pytest

from npu_deploy.errors import ProfileError
from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.profiling.discover import discover
from tests.profiling.helpers import csv_text, op, td, write_csv

ROWS = [op("MatMul_0", "MatMulV2", "AI_CORE", "80.000"),
        td("trans_TransData_0", "NCHW", "NC1HWC0", "1,3,8,8", "1,1,8,8,16", "20.000")]
PROF = "PROF_000001_20230628101435646_FKFLNPEPPRRCFCBA"


def test_old_per_device_summary(tmp_path):
    root = tmp_path / PROF
    write_csv(root / "device_0" / "summary" / "op_summary_0_1_20240603052618.csv", ROWS,
              style="op_summary_device")
    write_csv(root / "device_1" / "summary" / "op_summary_1_1_20240603052618.csv", ROWS,
              style="op_summary_device")
    d = discover(root)
    (src,) = d.used
    assert src.kind == "op_summary_device" and len(src.paths) == 2
    r = analyze_profile(root)
    assert r.compute_us == pytest.approx(200.0) and r.transdata_pct == pytest.approx(20.0)
    # per-device files have no Device_id column: the device comes from the folder name
    assert {(x.device, x.share_pct) for x in r.devices} == {("device_0", 20.0), ("device_1", 20.0)}


def test_new_layout_prefers_merged_output_over_device_copies(tmp_path):
    root = tmp_path / PROF
    write_csv(root / "mindstudio_profiler_output" / "op_summary_20240603052618.csv", ROWS)
    write_csv(root / "device_0" / "summary" / "op_summary_0_1_20240603052618.csv", ROWS)
    d = discover(root)
    assert [s.kind for s in d.used] == ["op_summary"]
    assert any("not used: same data" in line and "device_N/summary" in line for line in d.describe())
    assert analyze_profile(root).compute_us == pytest.approx(100.0)  # not 200: the copy is not mixed in


def test_slices_are_all_read_in_order(tmp_path):
    out = tmp_path / PROF / "mindstudio_profiler_output"
    write_csv(out / "op_summary_slice_1_20240603052618.csv", ROWS[1:])
    write_csv(out / "op_summary_slice_0_20240603052618.csv", ROWS[:1])
    d = discover(tmp_path / PROF)
    assert [p.name for p in d.used[0].paths] == ["op_summary_slice_0_20240603052618.csv",
                                                  "op_summary_slice_1_20240603052618.csv"]
    r = analyze_profile(tmp_path / PROF)
    assert r.compute_us == pytest.approx(100.0)
    assert r.conversions[0].top[0].prev_op == "MatMul_0"   # the stream continues across slices


def test_older_export_is_not_mixed(tmp_path):
    out = tmp_path / PROF / "mindstudio_profiler_output"
    write_csv(out / "op_summary_20240101000000.csv", ROWS)
    write_csv(out / "op_summary_20240603052618.csv", ROWS)
    d = discover(tmp_path / PROF)
    assert [p.name for p in d.used[0].paths] == ["op_summary_20240603052618.csv"]
    assert any("older op_summary export" in n for n in d.notes)


def test_torch_npu_folder_prefers_kernel_details(tmp_path):
    pt = tmp_path / "host_123_20250101120000000_ascend_pt"
    write_csv(pt / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", ROWS, style="kernel_details")
    (pt / "ASCEND_PROFILER_OUTPUT" / "op_statistic.csv").write_text(
        "OP Type,Core Type,Count,Total Time(us),Min Time(us),Avg Time(us),Max Time(us),Ratio(%)\n"
        "MatMulV2,AI_CORE,1,80,80,80,80,80\nTransData,AI_VECTOR_CORE,1,20,20,20,20,20\n")
    write_csv(pt / PROF / "mindstudio_profiler_output" / "op_summary_20250101120000.csv", ROWS)
    (pt / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text("[]")
    d = discover(tmp_path)
    assert len(d.captures) == 1
    cap = d.captures[0]
    assert cap.used.kind == "kernel_details" and cap.cross_check.kind == "op_statistic"
    assert {s.kind for s in cap.unused} == {"op_summary", "timeline"}
    reasons = {s.kind: s.reason for s in cap.unused}
    assert reasons == {"op_summary": "same data as kernel_details.csv", "timeline": "kernel_details.csv is preferred"}
    r = analyze_profile(tmp_path)
    assert r.compute_us == pytest.approx(100.0)
    assert r.cross_checks["op_statistic_transdata_pct"] == pytest.approx(20.0)


def test_op_statistic_only_gives_totals(tmp_path):
    p = tmp_path / "op_statistic_20250101120000.csv"
    p.write_text("Device_id,OP Type,Core Type,Count,Total Time(us),Min Time(us),Avg Time(us),Max Time(us),Ratio(%)\n"
                 "0,MatMulV2,AI_CORE,2,60,30,30,30,60\n0,MatMulV2,MIX_AIC,1,20,20,20,20,20\n"
                 "0,TransData,AI_VECTOR_CORE,4,20,5,5,5,20\n")
    r = analyze_profile(tmp_path)
    assert r.detail == "totals only"
    assert r.transdata_pct == pytest.approx(20.0) and r.conversions == []
    by = {o.op_type: o for o in r.op_types}
    assert by["MatMulV2"].count == 3 and by["MatMulV2"].total_us == pytest.approx(80.0)  # summed over cores


def test_nothing_recognisable_says_what_was_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ProfileError) as e:
        discover(tmp_path)
    msg = str(e.value)
    assert "kernel_details.csv" in msg and "op_summary_*.csv" in msg and e.value.exit_code == 2


def test_missing_path(tmp_path):
    with pytest.raises(ProfileError, match="no such file"):
        discover(tmp_path / "nope")


def test_single_csv_file_any_name(tmp_path):
    p = tmp_path / "my_export.csv"
    p.write_text(csv_text(ROWS))
    assert analyze_profile(p).compute_us == pytest.approx(100.0)


def test_timeline_only_capture_keeps_the_merged_level(tmp_path):
    import json

    ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "Ascend Hardware"}},
          {"ph": "X", "name": "trans_TransData_0", "pid": 1, "tid": 2, "ts": "10.0", "dur": 20.0,
           "args": {"Task Type": "AI_VECTOR_CORE"}},
          {"ph": "X", "name": "MatMul_0", "pid": 1, "tid": 2, "ts": "40.0", "dur": 80.0,
           "args": {"Task Type": "AI_CORE"}}]
    root = tmp_path / PROF
    (root / "timeline").mkdir(parents=True)
    (root / "device_0" / "timeline").mkdir(parents=True)
    (root / "timeline" / "msprof_0_1.json").write_text(json.dumps(ev))
    (root / "device_0" / "timeline" / "msprof_0_1.json").write_text(json.dumps(ev))
    r = analyze_profile(root)
    assert r.compute_us == pytest.approx(100.0) and r.transdata_pct == pytest.approx(20.0)


def test_renamed_column_copy_is_used_once(tmp_path):
    # kernel_details is op_summary with renamed columns (msprof.md §0.1); a loose copy beside it is the
    # same data: one is read, the other named. Both have formats and shapes; the op_summary also has a
    # Device_id column, so it is the richer one (with a tie, kernel_details would win: see msinsight)
    write_csv(tmp_path / "op_summary_0_1_20240603052618.csv", ROWS)
    write_csv(tmp_path / "kernel_details_copy.csv", ROWS, style="kernel_details")
    d = discover(tmp_path)
    assert [p.name for s in d.used for p in s.paths] == ["op_summary_0_1_20240603052618.csv"]
    (dup,) = [s for c in d.captures for s in c.unused]
    assert dup.paths[0].name == "kernel_details_copy.csv"
    assert dup.reason == "same data as op_summary_0_1_20240603052618.csv"
    assert any("kernel_details_copy.csv (not used: same data as op_summary_0_1_20240603052618.csv)" in line
               for line in d.describe())
    r = analyze_profile(tmp_path)
    assert r.compute_us == pytest.approx(100.0) and r.transdata_pct == pytest.approx(20.0)   # not 200 µs
    (cap,) = [c for c in r.discovery["captures"] if c["not_used"]]
    assert cap["used"] is None and cap["not_used"][0]["same_as"].endswith("op_summary_0_1_20240603052618.csv")


def test_richer_copy_wins(tmp_path):
    # the copy without format/shape columns is the poorer one, whatever its kind
    write_csv(tmp_path / "PROF_000001_20230628101435646_FKFLNPEPPRRCFCBA" / "mindstudio_profiler_output"
              / "op_summary_20240603052618.csv", ROWS)
    text = csv_text(ROWS, style="kernel_details").splitlines()
    keep = [i for i, h in enumerate(text[0].split(",")) if "Formats" not in h and "Shapes" not in h]
    import csv as _csv
    rows = list(_csv.reader(text))
    with open(tmp_path / "kernel_details_slim.csv", "w", newline="") as f:
        _csv.writer(f).writerows([[r[i] for i in keep] for r in rows])
    d = discover(tmp_path)
    assert [s.kind for s in d.used] == ["op_summary"]
    assert analyze_profile(tmp_path).compute_us == pytest.approx(100.0)


def test_overlapping_copy_is_not_mixed(tmp_path):
    # a copy holding the same first tasks and one more: not the same data, and not mixed either
    write_csv(tmp_path / "op_summary_0_1_20240603052618.csv", ROWS)
    write_csv(tmp_path / "kernel_details_more.csv", ROWS + [op("Add_9", "Add", "AI_VECTOR_CORE", "5.000")],
              style="kernel_details")
    d = discover(tmp_path)
    assert len(d.used) == 1
    (dup,) = [s for c in d.captures for s in c.unused]
    assert dup.reason.startswith("overlaps") and "not mixed" in dup.reason


def test_different_captures_in_one_folder_are_both_used(tmp_path):
    other = [op("MatMul_0", "MatMulV2", "AI_CORE", "70.000"),
             td("trans_TransData_0", "NCHW", "NC1HWC0", "1,3,8,8", "1,1,8,8,16", "30.000")]
    write_csv(tmp_path / "a" / "op_summary_0_1_20240603052618.csv", ROWS)
    write_csv(tmp_path / "b" / "op_summary_0_1_20240603052618.csv", other)
    d = discover(tmp_path)
    assert len(d.used) == 2 and not any(c.unused for c in d.captures)
    r = analyze_profile(tmp_path)
    assert r.compute_us == pytest.approx(200.0) and r.transdata_us == pytest.approx(50.0)


def test_op_statistic_of_other_data_is_still_read(tmp_path):
    # a loose op_statistic whose totals are not those of the per-task table beside it: a different
    # capture, so both are read (as before); the match needs equal counts and totals per op type
    (tmp_path / "op_statistic_20250101120000.csv").write_text(
        "OP Type,Core Type,Count,Total Time(us),Min Time(us),Avg Time(us),Max Time(us),Ratio(%)\n"
        "MatMulV2,AI_CORE,1,80,80,80,80,79\nTransData,AI_VECTOR_CORE,1,21,21,21,21,21\n")
    write_csv(tmp_path / "kernel_details_a.csv", ROWS, style="kernel_details")
    d = discover(tmp_path)
    assert sorted(s.kind for s in d.used) == ["kernel_details", "op_statistic"]
    (tmp_path / "op_statistic_20250101120000.csv").write_text(
        "OP Type,Core Type,Count,Total Time(us),Min Time(us),Avg Time(us),Max Time(us),Ratio(%)\n"
        "MatMulV2,AI_CORE,1,80,80,80,80,80\nTransData,AI_VECTOR_CORE,1,20,20,20,20,20\n")
    d = discover(tmp_path)
    assert [s.kind for s in d.used] == ["kernel_details"]
    assert analyze_profile(tmp_path).compute_us == pytest.approx(100.0)


def test_large_copies_compared_by_records_and_last_tasks(tmp_path):
    # > 64 KB each, LF vs CRLF, different column order: compared by their first tasks, their number of
    # records and their last tasks (read from the end of the file), without parsing them
    rows = [op(f"Add_{i}", "Add", "AI_VECTOR_CORE", f"{1 + i % 7}.250") for i in range(3000)]
    rows[1500] = op("hcom_allReduce__1_0", "hcom_allReduce_", "COMMUNICATION", "50.000", stream="N/A")
    a = write_csv(tmp_path / "op_summary_0_1_20240603052618.csv", rows)
    b = write_csv(tmp_path / "kernel_details_copy.csv", rows, style="kernel_details", newline="\r\n")
    assert a.stat().st_size > 1 << 17
    d = discover(tmp_path)
    assert len(d.used) == 1
    assert [s.reason for c in d.captures for s in c.unused] == [f"same data as {d.used[0].paths[0].name}"]
    # the same first tasks and as many rows, but the second-to-last task differs: an overlap, not mixed
    rows[-2] = op("Add_2998", "Add", "AI_VECTOR_CORE", "99.000")
    write_csv(b, rows, style="kernel_details", newline="\r\n")
    d = discover(tmp_path)
    assert len(d.used) == 1
    (dup,) = [s for c in d.captures for s in c.unused]
    assert dup.reason.startswith("overlaps")
