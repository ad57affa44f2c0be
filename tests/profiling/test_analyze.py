"""The analysis on a flagged step built by hand (tests/profiling/helpers.py: flagged_rows), and on small
variations of it. Every expected number follows from the fixture's durations."""

from __future__ import annotations

import pytest

from npu_deploy.profiling.analyze import ProfileReport, analyze_profile, op_category
from tests.profiling.helpers import flagged_rows, op, td, write_csv


@pytest.fixture
def flagged(tmp_path):
    return write_csv(tmp_path / "PROF_000001_20250101000000000_ABCDEF" / "mindstudio_profiler_output"
                     / "op_summary_20250101000000.csv", flagged_rows())


def test_shares_use_device_compute_as_denominator(flagged):
    r = analyze_profile(flagged)
    assert r.compute_us == pytest.approx(1000.0) and r.compute_ops == 19
    assert r.communication_us == pytest.approx(5000.0) and r.communication_ops == 1
    assert r.transdata_pct == pytest.approx(16.0) and r.transdata_ops == 7
    assert r.transpose_pct == pytest.approx(1.0)
    assert r.formattrans_pct == pytest.approx(17.0)      # Transpose family included by default
    assert r.cast_pct == pytest.approx(1.0)               # reported apart, never FormatTrans
    assert r.ai_cpu_pct == pytest.approx(3.0)
    assert r.flagged and not bool(r)
    assert r.verdict() == "FormatTrans 17.0 % of device compute (threshold 8 %): FLAGGED"


def test_without_transpose_and_with_threshold(flagged):
    r = analyze_profile(flagged, include_transpose=False)
    assert r.formattrans_pct == pytest.approx(16.0)
    assert r.verdict() == "FormatTrans (TransData only) 16.0 % of device compute (threshold 8 %): FLAGGED"
    assert bool(analyze_profile(flagged, threshold=17.5))
    assert not bool(analyze_profile(flagged, threshold=16.9))


def test_conversion_kinds(flagged):
    r = analyze_profile(flagged)
    k = {(c.category, c.src, c.dst): c for c in r.conversions}
    nchw = k[("format", "NCHW", "NC1HWC0")]
    assert nchw.count == 2 and nchw.total_us == pytest.approx(45.0) and nchw.mean_us == pytest.approx(22.5)
    assert nchw.min_us == pytest.approx(15.0) and nchw.max_us == pytest.approx(30.0)
    assert nchw.share_pct == pytest.approx(4.5)
    assert sorted(s for s, _ in nchw.shapes) == ["1,3,224,224", "1,64,56,56"]
    back = k[("format", "NC1HWC0", "NCHW")]
    assert back.shapes == [["1,64,56,56", 1]]            # the logical (public-side) shape
    assert k[("format", "FRACTAL_NZ", "ND")].count == 2
    assert k[("format", "ND", "FRACTAL_NZ")].total_us == pytest.approx(50.0)
    assert k[("dtype", "FLOAT", "FLOAT16")].count == 1
    assert k[("layout", "ND", "ND")].op_types == ["Transpose"]
    top = r.top_conversions(1)[0]
    assert top.total_us == pytest.approx(50.0)
    first = nchw.top[0]
    assert (first.name, first.prev_op, first.next_op) == ("trans_TransData_0", None, "Conv_0/Conv2D")
    assert first.file == flagged.name and first.line == 2 and first.stream == "2" and first.device == "0"


def test_round_trips(flagged):
    r = analyze_profile(flagged)
    trips = {(tuple(t.formats), t.shape): t for t in r.round_trips}
    nz = trips[(("FRACTAL_NZ", "ND"), "128,384")]
    assert nz.count == 2 and nz.saved_us == pytest.approx(100.0) and nz.saved_pct == pytest.approx(10.0)
    assert nz.examples[0] == ["trans_TransData_3", "trans_TransData_4"]
    five = trips[(("NC1HWC0", "NCHW"), "1,64,56,56")]
    assert five.count == 1 and five.saved_us == pytest.approx(30.0)
    assert len(r.round_trips) == 2


def test_round_trip_across_a_matmul_and_not_across_other_ops(tmp_path):
    rows = [td("a", "ND", "FRACTAL_NZ", "384,384", "24,24,16,16", "10.000"),
            op("mm", "MatMulV2", "AI_CORE", "50.000"),
            td("b", "FRACTAL_NZ", "ND", "24,24,16,16", "384,384", "10.000"),
            # a Softmax between breaks the window: no round trip for c/d
            td("c", "ND", "FRACTAL_NZ", "128,384", "24,8,16,16", "10.000"),
            op("sm", "SoftmaxV2", "AI_VECTOR_CORE", "10.000"),
            td("d", "FRACTAL_NZ", "ND", "24,8,16,16", "128,384", "10.000"),
            # other streams do not interleave: e and f are on different streams
            td("e", "NCHW", "NC1HWC0", "1,64,8,8", "1,4,8,8,16", "5.000", stream="7"),
            td("f", "NC1HWC0", "NCHW", "1,4,8,8,16", "1,64,8,8", "5.000", stream="8")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert [(t.formats, t.shape, t.count, t.between) for t in r.round_trips] == [
        (["ND", "FRACTAL_NZ"], "384,384", 1, ["MatMulV2"])]


def test_suggestions_name_their_evidence(flagged):
    r = analyze_profile(flagged)
    s = {x.id: x for x in r.suggestions}
    assert set(s) == {"keep-nz-between-matmuls", "keep-5hd-between-convs", "input-format", "int64-to-int32"}
    assert "2 ND↔FRACTAL_NZ round trip(s)" in s["keep-nz-between-matmuls"].evidence
    assert "trans_TransData_3" in s["keep-nz-between-matmuls"].evidence
    assert "--enable_small_channel" in s["input-format"].detail and "(C=3)" in s["input-format"].evidence
    assert "GatherV2" in s["int64-to-int32"].evidence and "INT64" in s["int64-to-int32"].evidence


def test_conv1d_suggestion(tmp_path):
    rows = [op("Conv_0", "Conv2D", "AI_CORE", "80.000"),
            td("trans_TransData_1", "NC1HWC0", "NCL", "1,8,1,128,16", "1,128,128", "20.000")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    (s,) = [x for x in r.suggestions if x.id == "conv1d-to-conv2d"]
    assert "trans_TransData_1" in s.evidence


def test_not_flagged_has_no_generic_suggestion(tmp_path):
    rows = [op("MatMul_0", "MatMulV2", "AI_CORE", "95.000"),
            td("t", "ND", "FRACTAL_NZ", "16,16", "1,1,16,16", "5.000")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert not r.flagged and r.formattrans_pct == pytest.approx(5.0) and r.suggestions == []
    assert r.verdict() == "FormatTrans 5.0 % of device compute (threshold 8 %): ok"


def test_repeated_iterations_aggregate_per_op(tmp_path):
    step = [op("Conv_0", "Conv2D", "AI_CORE", "70.000"),
            td("trans_TransData_1", "NC1HWC0", "NCHW", "1,4,8,8,16", "1,64,8,8", "10.000"),
            op("Relu_1", "Relu", "AI_VECTOR_CORE", "10.000"),
            td("trans_TransData_2", "NCHW", "NC1HWC0", "1,64,8,8", "1,4,8,8,16", "10.000")]
    rows = step * 3
    rows[5] = dict(rows[5], dur="16.000")   # the second run of trans_TransData_1 is slower
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    k = {(c.src, c.dst): c for c in r.conversions}[("NC1HWC0", "NCHW")]
    (i,) = k.top
    assert (i.name, i.count, i.total_us, i.max_us) == ("trans_TransData_1", 3, 36.0, 16.0)
    assert i.duration_us == pytest.approx(12.0) and i.line == 3 and i.prev_op == "Conv_0"
    (t,) = r.round_trips
    assert t.count == 3 and t.saved_us == pytest.approx(66.0)
    assert t.examples == [["trans_TransData_1", "trans_TransData_2"]]   # not repeated per run


def test_several_devices(tmp_path):
    rows = [dict(x, device="0") for x in flagged_rows()] + [
        op("MatMul_0", "MatMulV2", "AI_CORE", "100.000", device="1")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_20250101000000.csv", rows))
    d = {x.device: x for x in r.devices}
    assert d["device_0"].share_pct == pytest.approx(17.0) and d["device_1"].share_pct == 0.0
    assert r.formattrans_pct == pytest.approx(170.0 / 1100.0 * 100)


def test_json_round_trip(flagged, tmp_path):
    r = analyze_profile(flagged)
    out = tmp_path / "r.json"
    r.to_json(out)
    back = ProfileReport.load(out)
    assert back.to_dict() == r.to_dict()
    assert back.conversions[0].top[0].name == r.conversions[0].top[0].name
    d = r.to_dict()
    assert d["schema"] == "npu-deploy/profile-report" and d["schema_version"] == 1
    assert d["ok"] is False and d["verdict"].endswith("FLAGGED")


def test_op_category():
    assert op_category("TransDataRNN") == "format"
    assert op_category("ConfusionTransposeD") == "layout"
    assert op_category("TransposeBatchMatMul") == "compute"
    assert op_category("hcom_allReduce_") == "communication"


def test_threshold_must_be_a_percentage(flagged):
    from npu_deploy.errors import ProfileError

    with pytest.raises(ProfileError):
        analyze_profile(flagged, threshold=-1)


def test_nothing_usable_says_why_rows_were_skipped(tmp_path):
    """When every row is skipped the report never comes, so its warnings are never shown: the error line
    itself must say which rows were skipped and why."""
    from npu_deploy.errors import ProfileError

    path = write_csv(tmp_path / "op_summary_0_1.csv",
                     [op("a", "TransData", "AI_CORE", "-5"), op("b", "MatMul", "AI_CORE", "inf")])
    with pytest.raises(ProfileError) as e:
        analyze_profile(path)
    msg = str(e.value)
    assert "no device compute time" in msg and "skipped 2 rows" in msg and "lines 2, 3" in msg
    assert "see the warnings above" not in msg
