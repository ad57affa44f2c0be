"""Multi-rank profiles (profiling/cluster.py): generated rank folders with hand-computed shares, and the
real captures of ../shared/data/profiles, including copies of the real LLM capture as further ranks."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.profiling.cluster import (ClusterReport, analyze_cluster, is_cluster_folder, rank_paths,
                                          render_cluster_html, render_cluster_text)
from tests.conftest import PROFILES
from tests.profiling.helpers import op, td, write_csv

LLM = PROFILES / "torch_npu_level2_llm_910B"

# rank -> (conv µs per op, TransData NCHW→NC1HWC0 µs per op, TransData FRACTAL_NZ→ND µs per op)
PLAN = {0: (100.0, 5.0, 2.0), 1: (100.0, 5.0, 2.0), 2: (120.0, 5.0, 2.0), 3: (100.0, 60.0, 2.0), 10: (100.0, 5.0, 2.0)}
N_CONV, N_TD = 20, 4


def _rank(base, r, conv, td_nc, td_nz):
    rows = [op(f"Conv_{i}", "Conv2D", "AI_CORE", f"{conv:.3f}") for i in range(N_CONV)]
    rows += [td(f"trans_TransData_{i}", "NCHW", "NC1HWC0", "1,64,56,56", "1,4,56,56,16", f"{td_nc:.3f}")
             for i in range(N_TD)]
    rows += [td(f"trans_TransData_nz_{i}", "FRACTAL_NZ", "ND", "24,8,16,16", "128,384", f"{td_nz:.3f}")
             for i in range(N_TD)]
    rows.append(op("hcom_allReduce__0", "hcom_allReduce_", "COMMUNICATION", "9000.000", stream="N/A"))
    write_csv(base / f"rank_{r}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", rows,
              style="kernel_details")


def _expected(conv, td_nc, td_nz):
    """(device compute µs, FormatTrans %) by hand: communication is not compute."""
    compute = N_CONV * conv + N_TD * (td_nc + td_nz)
    return compute, 100.0 * N_TD * (td_nc + td_nz) / compute


@pytest.fixture
def cluster_dir(tmp_path):
    for r, plan in PLAN.items():
        _rank(tmp_path, r, *plan)
    (tmp_path / "rank_99_ascend_pt").mkdir()                     # a rank folder with nothing in it
    (tmp_path / "rank_98_ascend_pt" / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (tmp_path / "rank_98_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").write_text("what,ever\n1,2\n")
    return tmp_path


def test_per_rank_verdicts_slowest_rank_and_transdata_spread(cluster_dir):
    rep = analyze_cluster(cluster_dir, workers=2)
    ranks = {r.rank: r for r in rep.analysed()}
    assert sorted(ranks) == sorted(f"rank_{r}_ascend_pt" for r in PLAN)
    for r, plan in PLAN.items():
        compute, share = _expected(*plan)
        got = ranks[f"rank_{r}_ascend_pt"]
        assert got.compute_us == pytest.approx(compute)
        assert got.formattrans_pct == pytest.approx(share)
        assert got.flagged == (share > 8.0)
    # natural order: rank_2 before rank_10; the broken ranks come back skipped with a reason, not fatal
    assert [r.rank for r in rep.ranks][:5] == ["rank_0_ascend_pt", "rank_1_ascend_pt", "rank_2_ascend_pt",
                                               "rank_3_ascend_pt", "rank_10_ascend_pt"]
    assert sorted(r.rank for r in rep.skipped()) == ["rank_98_ascend_pt", "rank_99_ascend_pt"]
    assert all(r.error for r in rep.skipped())
    # slowest: rank 2 (conv 120 µs): 2428 µs vs the median 2028 µs (ranks 0, 1, 10)
    c_slow, _ = _expected(*PLAN[2])
    c_med, _ = _expected(*PLAN[0])
    assert rep.slowest_rank == "rank_2_ascend_pt"
    assert rep.slowest_over_median_pct == pytest.approx(100.0 * (c_slow - c_med) / c_med)
    # TransData differs in one kind only (NCHW→NC1HWC0 on rank 3); FRACTAL_NZ→ND is equal everywhere
    (spread,) = rep.transdata_spread
    assert spread.kind == "NCHW→NC1HWC0" and spread.max_rank == "rank_3_ascend_pt"
    assert spread.spread_us == pytest.approx(N_TD * (60.0 - 5.0))
    assert rep.flagged and "FLAGGED (1 of 5 ranks: rank_3_ascend_pt)" in rep.verdict()
    assert "2 skipped" in rep.verdict()


@pytest.mark.slow
def test_one_worker_and_many_give_the_same_view(cluster_dir):
    a = analyze_cluster(cluster_dir, workers=1).to_dict()
    b = analyze_cluster(cluster_dir, workers=3).to_dict()
    for d in (a, b):
        d.pop("workers")
        for r in d["ranks"]:
            r.pop("worker_rss_mb")
        d.pop("max_worker_rss_mb")
    assert a == b


def test_json_round_trip_and_escaped_html(cluster_dir):
    _rank(cluster_dir, "<b onload=x>", 100.0, 5.0, 2.0)
    rep = analyze_cluster(cluster_dir, workers=2)
    back = ClusterReport.load(json.loads(rep.to_json()))
    assert back.verdict() == rep.verdict() and back.transdata_spread[0].kind == "NCHW→NC1HWC0"
    page = render_cluster_html(rep)
    assert "<b onload" not in page and "rank_&lt;b onload=x&gt;_ascend_pt" in page
    assert "<svg" in page and "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert page.count("<rect") == len(rep.analysed())


def test_cluster_folder_detection(cluster_dir, tmp_path_factory):
    assert is_cluster_folder(cluster_dir)
    single = tmp_path_factory.mktemp("one")
    _rank(single, 0, 100.0, 5.0, 2.0)
    assert not is_cluster_folder(single)
    assert not is_cluster_folder(single / "rank_0_ascend_pt")
    # msprof device folders of one PROF folder, each exported per device
    prof = tmp_path_factory.mktemp("p") / "PROF_000001_20250101000000000_ABCDEF"
    for dev in (0, 1):
        rows = [op(f"Conv_{i}", "Conv2D", "AI_CORE", "100.0") for i in range(5)]
        write_csv(prof / f"device_{dev}" / "summary" / f"op_summary_{dev}_1_20250101000000.csv", rows,
                  style="op_summary_device")
    assert is_cluster_folder(prof)
    assert [p.name for p in rank_paths(prof)] == ["device_0", "device_1"]
    rep = analyze_cluster(prof, workers=1)
    assert [r.compute_us for r in rep.analysed()] == [pytest.approx(500.0)] * 2


@pytest.mark.slow
def test_cli_cluster_view(cluster_dir, run_cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    code, stdout, stderr = run_cli("profile", "analyze", cluster_dir, "--cluster", "--json", out / "c.json",
                                   "--html", out / "c.html", "--workers", "2")
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("rank_0_ascend_pt") and "FormatTrans" in lines[0]
    assert any(line.startswith("Slowest rank: rank_2_ascend_pt") for line in lines)
    assert lines[-1].startswith("5 ranks: FormatTrans") and "FLAGGED" in lines[-1]
    assert stderr.count("skipped: not a profile") == 2
    d = json.loads((out / "c.json").read_text())
    assert d["schema"] == "npu-deploy/cluster-profile-report" and d["slowest_rank"] == "rank_2_ascend_pt"
    assert (out / "c.html").read_text().startswith("<!DOCTYPE html>")
    code, _, _ = run_cli("profile", "analyze", cluster_dir, "--cluster", "--fail-on-flag")
    assert code == 1
    # without --cluster: the pooled report of every capture (which a broken capture stops: remove it)
    shutil.rmtree(cluster_dir / "rank_98_ascend_pt")
    code, stdout, _ = run_cli("profile", "analyze", cluster_dir)
    assert code == 0 and "captures/devices" in stdout.splitlines()[-1]


def test_cli_folder_without_any_profile_is_exit_2(run_cli, tmp_path):
    (tmp_path / "rank_0_ascend_pt").mkdir()
    (tmp_path / "rank_1_ascend_pt").mkdir()
    code, _, stderr = run_cli("profile", "analyze", tmp_path, "--cluster")
    assert code == 2 and "none of the 2 entries holds a profile" in stderr


def _rank_copy(src, dst, factor):
    """The real capture as another rank: every kernel duration × ``factor`` (csv module, nothing else)."""
    shutil.copytree(src, dst)
    path = src / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    i_dur = rows[0].index("Duration(us)")
    for r in rows[1:]:
        if len(r) == len(rows[0]):
            r[i_dur] = repr(float(r[i_dur]) * factor)
    with open(dst / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)


@pytest.mark.shared_data
def test_real_captures_as_ranks(tmp_path):
    for rank, factor in ((0, 1.0), (1, 1.0), (2, 1.5)):
        _rank_copy(LLM, tmp_path / f"host_{rank}_20251128120000000_ascend_pt", factor)
    (tmp_path / "host_3_20251128120000000_ascend_pt").mkdir()
    (tmp_path / "host_3_20251128120000000_ascend_pt" / "README").write_text("export failed")
    rep = analyze_cluster(tmp_path, workers=2)
    ok = {r.rank.split("_")[1]: r for r in rep.analysed()}
    assert sorted(ok) == ["0", "1", "2"] and [r.rank.split("_")[1] for r in rep.skipped()] == ["3"]
    # a real Level2 LLM step: no TransData at all (testing.md), so nothing to differ between ranks
    assert all(r.transdata_us == 0 for r in ok.values()) and rep.transdata_spread == []
    assert rep.slowest_rank.startswith("host_2_")
    assert rep.slowest_over_median_pct == pytest.approx(50.0, abs=1e-6)
    assert ok["0"].compute_us == pytest.approx(analyze_profile(LLM).compute_us)


@pytest.mark.shared_data
def test_the_shared_profiles_folder(tmp_path):
    rep = analyze_cluster(PROFILES, workers=2)
    names = {r.rank for r in rep.analysed()}
    assert {"torch_npu_level2_llm_910B", "mstt_fixtures", "msinsight_fixtures"} <= names
    assert "SOURCES.md" in {r.rank for r in rep.skipped()}
    for r in rep.analysed():  # each rank's verdict is the single-capture analysis of that folder
        assert r.verdict == analyze_profile(PROFILES / r.rank).verdict()
    text = render_cluster_text(rep)
    assert text.splitlines()[-1] == "Summary: " + rep.verdict()


def test_many_more_ranks_than_workers(tmp_path):
    # 40 ranks on 2 workers: every worker parses many ranks in turn (a pool that retired its workers
    # after 8 ranks hung here on Python 3.11)
    for r in range(40):
        _rank(tmp_path, r, 100.0, 5.0 + r, 2.0)
    rep = analyze_cluster(tmp_path, workers=2)
    assert len(rep.analysed()) == 40 and rep.slowest_rank == "rank_39_ascend_pt"
    for r in (0, 17, 39):
        _, share = _expected(100.0, 5.0 + r, 2.0)
        assert rep.ranks[r].formattrans_pct == pytest.approx(share)
