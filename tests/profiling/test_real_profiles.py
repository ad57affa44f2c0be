"""Every real profiler file in shared/data/profiles parses, and the known facts hold (shared/testing.md).

Where a number is asserted, it is checked against an independent oracle: a plain ``csv.DictReader`` loop in
this file, written from the reference's description and sharing no code with the parser.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections import defaultdict

import pytest

from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.profiling.discover import discover
from npu_deploy.profiling.parse import open_table
from npu_deploy.profiling.report import render_text
from tests.conftest import PROFILES

LLM = PROFILES / "torch_npu_level2_llm_910B"
MSTT = PROFILES / "mstt_fixtures"
MSINSIGHT = PROFILES / "msinsight_fixtures"

# real files from ../shared/data: skipped by tests/conftest.py where that folder is not beside the clone
pytestmark = pytest.mark.shared_data


def oracle(path, type_col="Type", core_col="Accelerator Core", dur_col="Duration(us)", name_col="Name"):
    """Per-op-type compute time and total, communication excluded, ragged rows dropped."""
    per = defaultdict(float)
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    for r in rows[1:]:
        if len(r) != len(header):
            continue
        row = dict(zip(header, r))
        if row[core_col] in ("HCCL", "COMMUNICATION") or row[name_col].startswith("hcom_"):
            continue
        per[row[type_col]] += float(row[dur_col])
    return per, sum(per.values())


def test_every_file_parses():
    files = sorted(p for p in PROFILES.rglob("*") if p.suffix in (".csv", ".db", ".json"))
    assert len(files) >= 9
    for p in files:
        stream = open_table(p)
        n = sum(1 for _ in stream)
        assert n > 0, p
        r = analyze_profile(p)
        assert r.compute_us > 0, p


def test_llm_capture_no_transdata_cast_2_6_percent():
    r = analyze_profile(LLM)
    per, total = oracle(LLM / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv")
    assert r.transdata_ops == 0 and r.transdata_pct == 0.0
    assert r.cast_pct == pytest.approx(2.6, abs=0.05)
    assert r.cast_pct == pytest.approx(100 * per["Cast"] / total, rel=1e-9)
    assert r.compute_us == pytest.approx(total, abs=1e-3)
    assert r.compute_ops == 2463 - 15  # 2,463 kernel rows, 15 of them communication
    assert r.communication_ops == 15
    assert not r.flagged and bool(r)
    # op_statistic (Device_id column) is used as a cross-check only, never mixed in
    assert r.cross_checks["op_statistic_transdata_pct"] == 0.0
    assert any("op_statistic" in s and "cross-check" in s for s in r.sources)
    by_type = {o.op_type: o for o in r.op_types}
    for t, us in per.items():
        assert by_type[t].total_us == pytest.approx(us, abs=1e-3)


def test_pmu_capture_cast_11_7_percent_and_format_prefix():
    path = MSTT / "kernel_details_2023_pmu.csv"
    r = analyze_profile(path)
    per, total = oracle(path)
    assert r.cast_pct == pytest.approx(11.7, abs=0.05)
    assert r.cast_pct == pytest.approx(100 * per["Cast"] / total, rel=1e-9)
    assert r.transpose_pct == pytest.approx(100 * per["Transpose"] / total, rel=1e-9)
    # FORMAT_ND in the file is ND in the report
    transposes = [k for k in r.conversions if k.category == "layout"]
    assert transposes and all(k.src == "ND" and k.dst == "ND" for k in transposes)
    # permutations are labelled by op, format and shapes, never as a no-op "ND→ND" conversion;
    # independent: group the Transpose rows by (first input shape, output shape) with the csv module
    groups = defaultdict(lambda: [0, 0.0])
    for row in csv.DictReader(open(path, newline="")):
        if row["Type"] == "Transpose":
            key = (row["Input Shapes"].strip('"').split(";")[0], row["Output Shapes"].strip('"'))
            groups[key][0] += 1
            groups[key][1] += float(row["Duration(us)"])
    assert {k.label: (k.count, round(k.total_us, 3)) for k in transposes} == {
        f"Transpose ND [{a}]→[{b}]": (n, round(us, 3)) for (a, b), (n, us) in groups.items()}
    assert "Transpose ND [1024,12,512]→[12,512,1024]" in {k.label for k in transposes}
    text = render_text(r)
    assert "ND→ND" not in text and "Transpose ND [4,1024,12288]→[1024,4,12288]" in text
    # the HCCL broadcasts are not compute
    assert r.communication_ops == sum(1 for row in csv.DictReader(open(path, newline=""))
                                      if row["Accelerator Core"] == "HCCL")


def test_level0_classifies_by_kernel_name():
    r = analyze_profile(MSTT / "kernel_details_level0_trans_names.csv")
    fmt = [k for k in r.conversions if k.category == "format"]
    names = {i.name for k in fmt for i in k.top}
    assert names == {"trans_TransData_20", "trans_TransData_22"}
    casts = {i.name for k in r.conversions if k.category == "dtype" for i in k.top}
    assert {"trans_Cast_19", "trans_Cast_21", "Cast16"} == casts
    assert r.classified_by_name == 8
    assert r.transdata_us == pytest.approx(7.77 + 23.98)
    assert any("classified by kernel name" in w for w in r.warnings)


def test_tab_suffixed_start_times_parse():
    path = MSTT / "kernel_details_2025_matmul_tab.csv"
    assert '\t"' in path.read_text()
    r = analyze_profile(path)
    per, total = oracle(path)
    assert r.compute_us == pytest.approx(total, abs=1e-3)


def test_trace_view_timeline_bare_array():
    r = analyze_profile(MSTT / "trace_view.json")
    assert r.transdata_ops > 0 and r.classified_by_name > 0
    names = [i.name for k in r.conversions if k.category == "format" for i in k.top]
    assert all("TransData" in n for n in names)


def test_short_row_is_skipped_and_named():
    r = analyze_profile(MSINSIGHT / "op_summary_1.csv")
    msgs = [w for w in r.warnings if "skipped 1 row" in w]
    assert msgs and "line 17" in msgs[0] and "31 fields" in msgs[0]
    per, total = oracle(MSINSIGHT / "op_summary_1.csv", type_col="OP Type", core_col="Task Type",
                        dur_col="Task Duration(us)", name_col="Op Name")
    assert r.compute_us == pytest.approx(total, abs=1e-3)


def test_msprof_sqlite_export_through_the_joins():
    import sqlite3

    db = MSINSIGHT / "msprof_0.db"
    r = analyze_profile(db)
    # immutable: a read-only open of this WAL-mode file would still create -shm/-wal beside it
    con = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    expected = con.execute("SELECT SUM(t.endNs - t.startNs) FROM COMPUTE_TASK_INFO c "
                           "JOIN TASK t ON t.globalTaskId = c.globalTaskId").fetchone()[0] / 1000.0
    casts = con.execute("SELECT SUM(t.endNs - t.startNs) FROM COMPUTE_TASK_INFO c JOIN TASK t "
                        "ON t.globalTaskId = c.globalTaskId JOIN STRING_IDS s ON s.id = c.opType "
                        "WHERE s.value = 'Cast'").fetchone()[0] / 1000.0
    con.close()
    assert r.compute_us == pytest.approx(expected)
    assert r.cast_us == pytest.approx(casts)
    assert r.compute_ops == 11


def _rank_copy(dst, factor):
    """The LLM capture as another rank would write it: the same kernels, every duration × ``factor`` and
    every start time shifted (written with the csv module, so only those two columns change)."""
    shutil.copytree(LLM, dst)
    kd = dst / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    with open(LLM / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    h = rows[0]
    i_dur, i_start = h.index("Duration(us)"), h.index("Start Time(us)")
    for r in rows[1:]:
        if len(r) == len(h):
            r[i_dur] = repr(float(r[i_dur]) * factor)
            r[i_start] = repr(float(r[i_start].strip()) + 1e6)
    with open(kd, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)


def test_parent_folder_of_captures(tmp_path):
    # two ranks of one run, with different data: both used, neither mixed with its own op_statistic
    shutil.copytree(LLM, tmp_path / "host_0_20251128120000000_ascend_pt")
    _rank_copy(tmp_path / "host_1_20251128120000000_ascend_pt", 2.0)
    d = discover(tmp_path)
    assert len(d.used) == 2 and all(s.kind == "kernel_details" for s in d.used)
    r = analyze_profile(tmp_path)
    single = analyze_profile(LLM)
    assert r.compute_us == pytest.approx(3 * single.compute_us)
    assert r.cast_pct == pytest.approx(single.cast_pct)
    # one line per rank: the two captures are not merged into one "device 0"
    assert sorted((d.device, round(d.compute_us / single.compute_us, 6)) for d in r.devices) == [
        ("host_0_20251128120000000_ascend_pt: device_0", 1.0), ("host_1_20251128120000000_ascend_pt: device_0", 2.0)]


def test_copied_capture_counts_once(tmp_path):
    # the same capture copied into two folders is one capture's data, not two ranks
    for rank in (0, 1):
        shutil.copytree(LLM, tmp_path / f"host_{rank}_20251128120000000_ascend_pt")
    d = discover(tmp_path)
    (used,) = d.used
    (dup,) = [s for c in d.captures for s in c.unused if s.kind == "kernel_details"]
    assert dup.reason == f"same data as {used.paths[0].relative_to(tmp_path)}"
    r = analyze_profile(tmp_path)
    assert r.compute_us == pytest.approx(analyze_profile(LLM).compute_us)


def test_msinsight_folder_does_not_mix_kernel_details_and_its_op_summary():
    # kernel_details_2023_fa.csv is op_summary_1.csv with renamed columns (msprof.md §0.1): one copy is
    # read. Independent figure: the compute time of one file, summed with the csv module.
    _per, total = oracle(MSINSIGHT / "kernel_details_2023_fa.csv")
    assert round(total / 1000, 2) == 27.13
    for path in (MSINSIGHT, PROFILES):
        r = analyze_profile(path)
        d = discover(path)
        used = [p.name for s in d.used for p in s.paths]
        assert "kernel_details_2023_fa.csv" in used and "op_summary_1.csv" not in used
        line = next(s for s in r.sources if "op_summary_1.csv" in s)
        assert "not used: same data as" in line and "kernel_details_2023_fa.csv" in line
        # the SQLite export holds other tasks (another run): listed with that reason, never "same data"
        db = next(s for s in r.sources if "msprof_0.db" in s)
        assert "not used: holds other tasks" in db and "same data" not in db
        (rec,) = [s for c in r.discovery["captures"] for s in c["not_used"] if s["kind"] == "op_summary"]
        assert rec["reason"].startswith("same data as") and rec["same_as"].endswith("kernel_details_2023_fa.csv")
        if path == MSINSIGHT:
            assert r.compute_us == pytest.approx(total, abs=1e-3)
            # three significant digits, the one unit rule (npu_deploy._display.duration)
            assert f"Device compute {total / 1000:.1f} ms" in "\n".join(r.sources + [render_text(r)])


def test_loose_op_statistic_beside_its_kernel_details_is_not_mixed(tmp_path):
    # op_statistic.csv and a renamed kernel_details of the same step, loose in one folder: the totals are
    # the same data (per op type, summed over core types); read once, op_statistic kept as cross-check
    shutil.copy(LLM / "ASCEND_PROFILER_OUTPUT" / "op_statistic.csv", tmp_path / "op_statistic.csv")
    shutil.copy(LLM / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", tmp_path / "kernel_details_llm.csv")
    r = analyze_profile(tmp_path)
    _per, total = oracle(LLM / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv")
    assert r.compute_us == pytest.approx(total, abs=1e-3) and r.detail == "per-task"
    line = next(s for s in r.sources if "op_statistic.csv (not used" in s)
    assert "same data as kernel_details_llm.csv" in line
    assert r.cross_checks["op_statistic_transdata_pct"] == 0.0


def test_folder_of_real_captures_gives_each_its_verdict():
    # the whole folder pooled is 0.2 % "ok"; the torch_npu timeline inside it is 26 % (issue 12)
    r = analyze_profile(PROFILES)
    parts = {d.device: d for d in r.devices}
    timeline = parts["mstt_fixtures: device_0"]
    events = json.loads((MSTT / "trace_view.json").read_text())
    hw = [e for e in events if e.get("ph") == "X" and e.get("pid") == 800
          and not e["name"].upper().startswith("MEMCPY")]
    total = sum(e["dur"] for e in hw)
    trans = sum(e["dur"] for e in hw if "transdata" in e["name"].lower())
    assert timeline.share_pct == pytest.approx(100 * trans / total) and timeline.flagged
    assert timeline.share_pct > 20 and r.formattrans_pct < 1
    assert [d.device for d in r.flagged_parts()] == ["mstt_fixtures: device_0"]
    assert r.flagged and not r
