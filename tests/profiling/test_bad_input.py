"""Bad profile input is exit 2 with one line naming the file (and the line where known), or a skipped row
that the report counts; never exit 4 or a traceback (issue 12). Names from a stranger's file never
reach the terminal unescaped."""

from __future__ import annotations

import json

import pytest

from npu_deploy.errors import ProfileError
from npu_deploy.profiling.analyze import FORMATTRANS_THRESHOLD_PCT, ProfileReport, analyze_profile
from tests.profiling.helpers import op, td, write_csv
from tests.profiling.test_db import build_db

STAT_HEADER = "OP Type,Core Type,Count,Total Time(us),Min Time(us),Avg Time(us),Max Time(us),Ratio(%)\n"


def _one_error_line(run_cli, path, *args):
    code, out, err = run_cli("profile", "analyze", path, *args)
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("npu-deploy: error: ") and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("count", ["inf", "-inf", "nan", "1e999", "-3"])
def test_op_statistic_count_out_of_range_is_a_skipped_row(tmp_path, count):
    p = tmp_path / "op_statistic_0_1.csv"
    p.write_text(STAT_HEADER + f"TransData,AI_VECTOR_CORE,{count},10,1,1,1,10\nMatMulV2,AI_CORE,3,90,1,1,1,90\n")
    r = analyze_profile(p)
    assert r.compute_us == pytest.approx(90.0) and r.transdata_us == 0.0
    assert any("skipped 1 row (count out of range) at line 2" in w for w in r.warnings)


def test_op_statistic_with_only_infinite_counts_is_one_line(tmp_path, run_cli):
    p = tmp_path / "op_statistic_0_1.csv"
    p.write_text(STAT_HEADER + "TransData,AI_VECTOR_CORE,inf,10,1,1,1,10\n")
    line = _one_error_line(run_cli, p)
    assert str(p) in line and "count out of range" in line and "line 2" in line


def test_op_statistic_header_over_the_csv_field_limit(tmp_path, run_cli):
    cap = tmp_path / "cap"
    cap.mkdir()
    p = cap / "op_statistic_0_1.csv"
    p.write_text("OP Type," + "x" * 140_000 + ",Total Time(us)\nTransData,1,2\n")
    with pytest.raises(ProfileError) as e:
        analyze_profile(cap)
    assert e.value.path == str(p) and e.value.line == 1 and "field larger than field limit" in str(e.value)
    assert f"{p}:1:" in _one_error_line(run_cli, cap)


def test_op_summary_cell_over_the_csv_field_limit_is_a_skipped_row(tmp_path):
    rows = [op("MatMul_0", "MatMulV2", "AI_CORE", "90.000"), op("x" * 140_000, "Add", "AI_VECTOR_CORE", "5.0"),
            td("trans_TransData_0", "NCHW", "NC1HWC0", "1,3,8,8", "1,1,8,8,16", "10.000")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert r.compute_us == pytest.approx(100.0)
    assert any("skipped 1 row (malformed CSV: field larger than field limit" in w and "line 3" in w
               for w in r.warnings)


def test_sqlite_names_that_are_not_utf8_are_read(tmp_path, run_cli):
    import sqlite3

    db = build_db(tmp_path / "msprof_0.db")
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE ZQZQ_EXTRA (a INTEGER)")
    con.commit()
    con.close()
    data = db.read_bytes()
    assert data.count(b"ZQZQ") >= 2 and data.count(b"Add_3") == 1
    # a table name and a kernel name with bytes that are not UTF-8
    db.write_bytes(data.replace(b"ZQZQ", b"\xff\xfe\xfd\xfc").replace(b"Add_3", b"A\xffd_3"))
    r = analyze_profile(db)
    assert r.compute_us == pytest.approx(400.0) and r.transdata_us == pytest.approx(53.761)
    code, out, err = run_cli("profile", "analyze", db)
    assert code == 0 and "Traceback" not in err


def test_sqlite_garbage_after_the_magic_is_one_line(tmp_path, run_cli):
    p = tmp_path / "msprof_0.db"
    p.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    assert str(p) in _one_error_line(run_cli, p)


def test_control_characters_in_names_are_escaped_on_the_terminal(tmp_path, run_cli):
    evil = "trans_TransData_\x1b[2J\x1b]0;pwned\x07_1"
    rows = [op("MatMul_\x1b[31m0", "MatMulV2", "AI_CORE", "80.000"),
            td(evil, "NCHW", "NC1HWC0", "1,3,8,8", "1,1,8,8,16", "20.000"),
            op("Add_\r\n1", "Add", "AI_VECTOR_CORE", "N/A")]
    p = write_csv(tmp_path / "op_summary_0_1.csv", rows)
    code, out, err = run_cli("profile", "analyze", p)
    assert code == 0
    for text in (out, err):
        assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "trans_TransData_\\x1b[2J\\x1b]0;pwned\\x07_1" in out


def test_threshold_constant_and_share_in_percent(tmp_path):
    assert FORMATTRANS_THRESHOLD_PCT == 8.0 and ProfileReport().threshold_pct == FORMATTRANS_THRESHOLD_PCT
    rows = [op("MatMul_0", "MatMulV2", "AI_CORE", "88.000"),
            td("trans_TransData_0", "NCHW", "NC1HWC0", "1,3,8,8", "1,1,8,8,16", "12.000")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert r.threshold_pct == 8.0 and r.flagged
    assert r.formattrans_share_pct() == pytest.approx(12.0)       # percent, not a fraction
    assert r.formattrans_share() == r.formattrans_share_pct()     # the old name keeps working
    assert ProfileReport.load(r.to_json()).formattrans_share_pct() == pytest.approx(12.0)


def _capture(root, name, rows):
    return write_csv(root / name / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", rows, style="kernel_details")


def test_folder_of_captures_gives_one_verdict_each_and_fails_on_any(tmp_path, run_cli):
    # the case: a pooled 0.2 % "ok" hid one capture at 26 %
    big = [op(f"MatMul_{i}", "MatMulV2", "AI_CORE", "1000.000") for i in range(130)]
    small = [op("MatMul_0", "MatMulV2", "AI_CORE", "74.000"),
             td("trans_TransData_0", "NCHW", "NC1HWC0", "1,3,8,8", "1,1,8,8,16", "26.000")]
    _capture(tmp_path, "rank_0_ascend_pt", big)
    _capture(tmp_path, "rank_1_ascend_pt", small)
    r = analyze_profile(tmp_path)
    assert r.formattrans_pct == pytest.approx(26.0 / 130_100 * 100)       # 0.02 %: pooled looks fine
    d = {x.device: x for x in r.devices}
    assert d["rank_1_ascend_pt"].share_pct == pytest.approx(26.0) and d["rank_1_ascend_pt"].flagged
    assert not d["rank_0_ascend_pt"].flagged and d["rank_0_ascend_pt"].capture == "rank_0_ascend_pt"
    assert r.flagged and [x.device for x in r.flagged_parts()] == ["rank_1_ascend_pt"]
    code, out, _err = run_cli("profile", "analyze", tmp_path, "--fail-on-flag")
    lines = out.splitlines()
    assert code == 1
    assert lines[0] == ("rank_0_ascend_pt: FormatTrans 0.0 % of 130 ms device compute (threshold 8 %): ok")
    assert lines[1] == ("rank_1_ascend_pt: FormatTrans 26.0 % of 100 µs device compute (threshold 8 %): "
                        "FLAGGED")
    assert lines[2].startswith("Summary: FormatTrans 0.0 % of device compute over 2 captures/devices")
    assert lines[-1].endswith("FLAGGED (1 of 2 above; highest rank_1_ascend_pt 26.0 %)")
    code, _out, _err = run_cli("profile", "analyze", tmp_path)
    assert code == 0
    js = tmp_path.parent / f"{tmp_path.name}-r.json"  # not inside the folder read (refused: issue 23)
    run_cli("profile", "analyze", tmp_path, "--json", js)
    back = ProfileReport.load(json.loads(js.read_text()))
    assert [x.flagged for x in back.devices] == [False, True] and not back


def test_folder_of_captures_all_within_threshold_passes(tmp_path, run_cli):
    ok = [op("MatMul_0", "MatMulV2", "AI_CORE", "95.000"),
          td("trans_TransData_0", "NCHW", "NC1HWC0", "1,3,8,8", "1,1,8,8,16", "5.000")]
    _capture(tmp_path, "rank_0_ascend_pt", ok)
    _capture(tmp_path, "rank_1_ascend_pt", [dict(x, dur=str(float(x["dur"]) * 2)) for x in ok])
    code, out, _err = run_cli("profile", "analyze", tmp_path, "--fail-on-flag")
    assert code == 0 and out.splitlines()[-1].endswith(": ok")
