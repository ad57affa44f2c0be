"""`npu-deploy cost check` / `cost fit` on real 910B captures: exit codes, JSON, HTML, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import PROFILES, SHARED_DATA

CNN = SHARED_DATA / "timings_910B" / "cnn_level1_rank1_ascend_pt"
CNN2 = SHARED_DATA / "timings_910B" / "cnn_level2_rank0_ascend_pt"

pytestmark = pytest.mark.shared_data


def test_check_table_json_and_html(run_cli, tmp_path):
    j, h = tmp_path / "c.json", tmp_path / "c.html"
    code, out, err = run_cli("cost", "check", CNN, "--json", j, "--html", h)
    assert code == 0, err
    assert "TransData" in out and "median |err|" in out and "FormatTrans share: measured" in out
    assert "not calibrated" not in out.splitlines()[0] and "median op error" in out.splitlines()[0]
    d = json.loads(j.read_text())
    assert len(d["ops"]) == 187                                     # every device op, priced or not
    assert {"name", "type", "engine", "measured_us", "predicted_us"} <= set(d["ops"][0])
    # every op of this capture is priced: MemSet without a recorded size at its fitted fixed cost, the
    # DSA dropout masks by bytes written, TopKV2 as a sort
    assert all(o["predicted_us"] is not None for o in d["ops"]) and "not priced: 0 ops" in out
    measured_td = sum(o["measured_us"] for o in d["ops"] if o["type"] == "TransData")
    assert measured_td == pytest.approx(1416.0, abs=0.5)            # the op_statistic total of this capture
    assert abs(d["formattrans"]["predicted_pct"] - d["formattrans"]["measured_pct"]) < 3.0
    html = h.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html and "<script" not in html


def test_max_error_exit_1(run_cli):
    code, out, _ = run_cli("cost", "check", CNN, "--max-error", "1")
    assert code == 1 and "FAILED" in out.splitlines()[-1]


def test_level0_capture_is_one_line_exit_2(run_cli):
    code, out, err = run_cli("cost", "check", PROFILES / "mstt_fixtures" / "kernel_details_level0_trans_names.csv")
    assert code == 2 and "`cost check` needs a Level1 or higher capture" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_fit_then_check_with_the_fitted_profile(run_cli, tmp_path):
    pytest.importorskip("scipy", reason="cost fit needs scipy (pip install 'npu-deploy[cost]')")
    prof = tmp_path / "my.json"
    code, out, err = run_cli("cost", "fit", CNN, CNN2, "-o", prof, "--name", "my910B")
    assert code == 0, err
    assert "leave one capture out" in out
    assert "cnn_level2_rank0_ascend_pt priced as Ascend910B2: 24-core 910B part" in out   # block dims 24/48
    d = json.loads(prof.read_text())
    assert d["name"] == "my910B" and d["calibration"]["calibrated"] is True
    code, out, err = run_cli("cost", "check", SHARED_DATA / "timings_910B" / "cnn_level2_rank1_ascend_pt",
                             "--soc", prof)
    assert code == 0, err
    assert "my910B" in out


def test_fit_part_must_be_a_known_soc(run_cli, tmp_path):
    code, _, err = run_cli("cost", "fit", CNN, CNN2, "-o", tmp_path / "p.json", "--part", "Ascend999")
    assert code == 2 and "no cost profile for SoC 'Ascend999'" in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


def test_bad_profile_names_the_field(run_cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "base": "Ascend910B", "bw_efficiency": 7}))
    code, _, err = run_cli("cost", "check", CNN, "--soc", bad)
    assert code == 2 and "bw_efficiency" in err


def test_a_profile_json_works_where_soc_does(tmp_path, run_cli, example_onnx):
    """`convert --soc my.json` (what `cost fit -o` writes): the plan is its base SoC's, the estimate
    the profile's own figures; a field out of range is refused naming it."""
    import json as _json

    from npu_deploy.converters.files.bundle import read_bundle

    slow = tmp_path / "slow910B.json"
    slow.write_text(_json.dumps({"name": "slow910B", "base": "Ascend910B", "bandwidth_gbps": 40.0}))
    out = {}
    for soc in ("Ascend910B", str(slow)):
        b = tmp_path / f"{Path(soc).stem}.bundle"
        code, _, err = run_cli("convert", example_onnx, "-o", b, "--backend", "builtin", "--soc", soc)
        assert code == 0, err
        with read_bundle(b) as bundle:
            out[soc] = bundle.manifest
    base, mine = out["Ascend910B"], out[str(slow)]
    where = lambda m: [(t["name"], t["src_format"], t["dst_format"], t["bytes"]) for t in m["transdata"]]  # noqa: E731
    assert mine["soc"] == "Ascend910B" and where(mine) == where(base)              # planned as its base
    us = lambda m: [t["est_us"] for t in m["transdata"]]  # noqa: E731
    assert all(a > b for a, b in zip(us(mine), us(base))) and us(mine)  # 40 GB/s, not the calibrated figure
    bad = tmp_path / "bad.json"
    bad.write_text(_json.dumps({"name": "bad", "base": "Ascend910B", "bandwidth_gbps": -1}))
    code, _, err = run_cli("convert", example_onnx, "-o", tmp_path / "x.bundle", "--backend", "builtin", "--soc", str(bad))
    assert code == 2 and "bandwidth_gbps" in err and not (tmp_path / "x.bundle").exists()


def _slow_profile(tmp_path) -> Path:
    """A SoC profile JSON as `cost fit -o` writes it, with a bandwidth far below the 910B's."""
    p = tmp_path / "slow910B.json"
    p.write_text(json.dumps({"name": "slow910B", "base": "Ascend910B", "bandwidth_gbps": 40.0}))
    return p


def _estimated_us(prof_dir: Path) -> dict[str, float]:
    """Per op type, the estimated µs the emulator wrote into its op_statistic (read back, not from the model)."""
    import csv

    (stat,) = prof_dir.glob("PROF_*/mindstudio_profiler_output/op_statistic_*.csv")
    with open(stat, newline="", encoding="utf-8") as f:
        return {r["OP Type"]: float(r["Total Time(us)"]) for r in csv.DictReader(f)}


@pytest.mark.realmodel
@pytest.mark.slow
def test_profile_run_takes_soc_names_and_profile_json(run_cli, real_model, tmp_path, monkeypatch):
    """`profile run --soc` (name or `cost fit` JSON) as convert's: planned for the SoC (or the JSON's base),
    the estimated profile priced with the JSON's figures, and its accuracy line names that profile."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no msprof: the emulator's estimated profile
    model = real_model("ppocr_cls")
    slow = _slow_profile(tmp_path)
    res = {}
    for soc in ("Ascend910B", str(slow)):
        out = tmp_path / f"prof-{Path(soc).stem}"
        code, stdout, err = run_cli("profile", "run", model, "--input-shape", "x:1,3,48,192", "-o", out,
                                    "--soc", soc)
        assert code == 0, err
        res[soc] = (_estimated_us(out), err)
    (fast, err_b), (slow_us, err_j) = res["Ascend910B"], res[str(slow)]
    assert "7 real Ascend910B captures" in err_b and "median op error" in err_b
    assert "not calibrated for slow910B" in err_j
    assert fast.keys() == slow_us.keys() and "TransData" in fast          # same plan: the JSON's base SoC
    assert slow_us["TransData"] > 1.5 * fast["TransData"]                 # 40 GB/s against the fitted 910B
    assert sum(slow_us.values()) > 1.5 * sum(fast.values())
    # a converted bundle's plan is fixed: --soc is refused in one line, exit 2
    bundle = tmp_path / "cls.bundle"
    assert run_cli("convert", model, "-o", bundle, "--backend", "builtin", "--input-shape", "x:1,3,48,192")[0] == 0
    code, _, err = run_cli("profile", "run", bundle, "-o", tmp_path / "p2", "--soc", "Ascend910B")
    assert code == 2 and "already converted" in err and len(err.strip().splitlines()) <= 2
    assert not (tmp_path / "p2").exists()


def test_debug_precision_prices_latency_with_the_soc_profile(run_cli, example_onnx, tmp_path):
    """`debug precision --soc my.json`: the latency estimate is the profile's, and beside it the same
    accuracy line convert prints (here: one evaluation, the float16 plan already passes)."""
    from npu_deploy.converters.lowering.cost import accuracy_note

    slow = _slow_profile(tmp_path)
    got = {}
    for soc in ("Ascend910B", str(slow)):
        j = tmp_path / f"{Path(soc).stem}.json.out"
        code, out, err = run_cli("debug", "precision", example_onnx, "--cosine", "-1", "--soc", soc,
                                 "--json", j, "--checkpoint", tmp_path / f"{Path(soc).stem}.ck")
        assert code == 0, err
        d = json.loads(j.read_text())
        line = next(x for x in out.splitlines() if x.startswith("estimated latency"))
        got[soc] = (d, line)
    (d_b, line_b), (d_j, line_j) = got["Ascend910B"], got[str(slow)]
    assert accuracy_note("Ascend910B") in line_b and d_b["cost_accuracy"] == accuracy_note("Ascend910B")
    assert "not calibrated for slow910B" in line_j and "not calibrated for slow910B" in d_j["cost_accuracy"]
    assert d_j["baseline_est_us"] > d_b["baseline_est_us"]        # priced at 40 GB/s


def test_check_reports_an_implausible_measurement_and_keeps_it(run_cli, tmp_path):
    """llm_setup's ZerosLike of 6.7 GB in 612 µs: kept in the JSON with why, left out of the total."""
    j = tmp_path / "s.json"
    code, out, err = run_cli("cost", "check", SHARED_DATA / "timings_910B" / "llm_setup_8dev_msprof_db", "--json", j)
    assert code == 0, err
    assert "implausible measurements: 1 ops, 92.2 % of measured device time (ZerosLike" in out
    assert "device time, priced plausible ops: measured 51.8 µs" in out and "Traceback" not in err
    d = json.loads(j.read_text())
    assert len(d["ops"]) == 11 and d["implausible"]["count"] == 1
    (z,) = [o for o in d["ops"] if o["excluded"]]
    assert z["type"] == "ZerosLike" and z["predicted_us"] is None and "11.0 TB/s" in z["excluded"]
    assert d["total"]["measured_priced_us"] == pytest.approx(d["total"]["measured_us"] - z["measured_us"])
