"""`npu-deploy profile analyze|run` through the real entry point: exit codes, outputs, errors."""

from __future__ import annotations

import json

import pytest

from tests.conftest import PROFILES
from tests.profiling.helpers import flagged_rows, op, td, write_csv


@pytest.fixture
def flagged(tmp_path):
    return write_csv(tmp_path / "PROF_000001_20250101000000000_ABCDEF" / "mindstudio_profiler_output"
                     / "op_summary_20250101000000.csv", flagged_rows()).parent.parent


@pytest.fixture
def clean(tmp_path):
    rows = [op("MatMul_0", "MatMulV2", "AI_CORE", "97.000"),
            td("trans_TransData_0", "ND", "FRACTAL_NZ", "16,16", "1,1,16,16", "3.000")]
    return write_csv(tmp_path / "ok" / "op_summary_0_1.csv", rows)


def test_flagged_exits_0_without_fail_on_flag(run_cli, flagged):
    code, out, err = run_cli("profile", "analyze", flagged)
    lines = out.strip().splitlines()
    assert code == 0
    assert lines[0] == "FormatTrans 17.0 % of device compute (threshold 8 %): FLAGGED"
    assert lines[-1] == lines[0]                       # the verdict is also the last line
    assert "NCHW→NC1HWC0" in out and "trans_TransData_0" in out


def test_fail_on_flag_exits_1(run_cli, flagged, clean):
    assert run_cli("profile", "analyze", flagged, "--fail-on-flag")[0] == 1
    assert run_cli("profile", "analyze", clean, "--fail-on-flag")[0] == 0
    assert run_cli("profile", "analyze", flagged, "--fail-on-flag", "--threshold", "20")[0] == 0


def test_no_include_transpose(run_cli, flagged):
    code, out, _ = run_cli("profile", "analyze", flagged, "--no-include-transpose")
    assert code == 0 and out.splitlines()[0].startswith("FormatTrans (TransData only) 16.0 %")
    # the Transpose family has its own line, saying whether it is counted and which option changes that
    assert "  Transpose family 1.0 % (10.0 µs, 1 ops): not included (--include-transpose counts it)" in out
    code, out, _ = run_cli("profile", "analyze", flagged)
    lines = out.splitlines()
    assert lines[1] == "  TransData 16.0 % (160 µs, 7 ops)"
    assert lines[2].startswith("  Transpose family 1.0 % (10.0 µs, 1 ops): included in FormatTrans")
    assert lines[3] == "  Cast 1.0 % (10.0 µs, 1 ops): dtype conversion, not FormatTrans"


def test_json_and_html_outputs(run_cli, flagged, tmp_path):
    j, h = tmp_path / "r.json", tmp_path / "r.html"
    code, out, _ = run_cli("profile", "analyze", flagged, "--json", j, "--html", h)
    assert code == 0
    d = json.loads(j.read_text())
    assert d["schema"] == "npu-deploy/profile-report" and d["flagged"] is True
    assert d["transdata_pct"] == pytest.approx(16.0) and d["compute_us"] == pytest.approx(1000.0)
    assert {t["shape"] for t in d["round_trips"]} == {"128,384", "1,64,56,56"}
    (layout,) = [k for k in d["conversions"] if k["category"] == "layout"]
    assert layout["label"] == "Transpose ND [128,12,32]→[12,128,32]" and layout["in_shape"] == "128,12,32"
    assert "Transpose ND [128,12,32]→[12,128,32]" in out and "ND→ND" not in out
    assert h.read_text().startswith("<!DOCTYPE html>")


def test_unusable_input_exits_2_with_one_line(run_cli, tmp_path):
    (tmp_path / "readme.txt").write_text("x")
    code, out, err = run_cli("profile", "analyze", tmp_path)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "no profiler output found" in err and "kernel_details.csv" in err
    code, _, err = run_cli("profile", "analyze", tmp_path / "missing")
    assert code == 2 and "no such file" in err
    # a profile with a header and no task rows: says which file was read
    write_csv(tmp_path / "hdr" / "op_summary_0_1.csv", [])
    code, out, err = run_cli("profile", "analyze", tmp_path / "hdr")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "no device compute time found in op_summary_0_1.csv" in err and str(tmp_path / "hdr") in err


def test_bad_output_path_leaves_nothing(run_cli, flagged, tmp_path):
    code, _, err = run_cli("profile", "analyze", flagged, "--json", tmp_path / "nodir" / "r.json")
    assert code == 2 and "does not exist" in err


@pytest.mark.shared_data
def test_skipped_rows_warned_on_stderr(run_cli):
    code, out, err = run_cli("profile", "analyze", PROFILES / "msinsight_fixtures" / "op_summary_1.csv")
    assert code == 0 and "warning" in err and "line 17" in err


@pytest.mark.shared_data
def test_real_llm_capture(run_cli):
    code, out, _ = run_cli("profile", "analyze", PROFILES / "torch_npu_level2_llm_910B")
    assert code == 0 and out.splitlines()[0] == "FormatTrans 0.0 % of device compute (threshold 8 %): ok"
    assert "Cast 2.6 %" in out


def test_help_lists_subcommands(run_cli):
    code, out, _ = run_cli("profile", "--help")
    assert code == 0 and "analyze" in out and "run" in out


def test_report_outputs_never_overwrite_the_profile(run_cli, tmp_path):
    src = write_csv(tmp_path / "op_summary_0_1.csv", flagged_rows())
    before = src.read_bytes()
    for args in (("--json", src), ("--html", src), ("--json", tmp_path / "r"), ):
        extra = ("--html", tmp_path / "r") if args[1] == tmp_path / "r" else ()
        code, _, err = run_cli("profile", "analyze", src, *args, *extra)
        assert code == 2 and ("overwrite" in err or "replace" in err) and "Traceback" not in err, err
    assert src.read_bytes() == before and not (tmp_path / "r").exists()
