"""Every real profiler file in shared/data/profiles parses, and the known facts hold (shared/testing.md).

Where a number is asserted, it is checked against an independent oracle: a plain ``csv.DictReader`` loop in
this file, written from the reference's description and sharing no code with the parser.
"""

from __future__ import annotations

import csv
import shutil
from collections import defaultdict

import pytest

from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.profiling.discover import discover
from npu_deploy.profiling.parse import open_table
from tests.conftest import PROFILES

LLM = PROFILES / "torch_npu_level2_llm_910B"
MSTT = PROFILES / "mstt_fixtures"
MSINSIGHT = PROFILES / "msinsight_fixtures"

pytestmark = pytest.mark.skipif(not PROFILES.is_dir(), reason=f"shared profiles not at {PROFILES}")


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
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    expected = con.execute("SELECT SUM(t.endNs - t.startNs) FROM COMPUTE_TASK_INFO c "
                           "JOIN TASK t ON t.globalTaskId = c.globalTaskId").fetchone()[0] / 1000.0
    casts = con.execute("SELECT SUM(t.endNs - t.startNs) FROM COMPUTE_TASK_INFO c JOIN TASK t "
                        "ON t.globalTaskId = c.globalTaskId JOIN STRING_IDS s ON s.id = c.opType "
                        "WHERE s.value = 'Cast'").fetchone()[0] / 1000.0
    con.close()
    assert r.compute_us == pytest.approx(expected)
    assert r.cast_us == pytest.approx(casts)
    assert r.compute_ops == 11


def test_parent_folder_of_captures(tmp_path):
    # two ranks of the same run: both used, neither copy mixed with its own op_statistic
    for rank in (0, 1):
        dst = tmp_path / f"host_{rank}_20251128120000000_ascend_pt"
        shutil.copytree(LLM, dst)
    d = discover(tmp_path)
    assert len(d.used) == 2 and all(s.kind == "kernel_details" for s in d.used)
    r = analyze_profile(tmp_path)
    single = analyze_profile(LLM)
    assert r.compute_us == pytest.approx(2 * single.compute_us)
    assert r.cast_pct == pytest.approx(single.cast_pct)
    # one line per rank: the two captures are not merged into one "device 0"
    assert sorted(d.device for d in r.devices) == ["host_0_20251128120000000_ascend_pt: 0",
                                                   "host_1_20251128120000000_ascend_pt: 0"]
