"""Measured-op records out of real captures: shapes, dtypes, formats, engine, block dim and SoC."""

from __future__ import annotations

import pytest

from npu_deploy.errors import ProfileError
from npu_deploy.profiling.ops import MeasuredOp, read_measured_ops
from tests.conftest import PROFILES, SHARED_DATA
from tests.profiling.helpers import op, td, write_csv

TIMINGS = SHARED_DATA / "timings_910B"


@pytest.mark.shared_data
def test_kernel_details_row_as_the_device_wrote_it():
    (cap,) = read_measured_ops(TIMINGS / "cnn_level1_rank1_ascend_pt")
    first = cap.ops[0]
    # the first row of the file, read by hand: fp32 NCHW 32x3x224x224 -> NC1HWC0 with C0 = 8
    assert (first.name, first.type, first.engine) == ("trans_TransData_0", "TransData", "AI_VECTOR_CORE")
    assert first.in_shapes == ((32, 3, 224, 224),) and first.out_shapes == ((32, 1, 224, 224, 8),)
    assert first.in_dtypes == ("FLOAT",) and first.in_formats == ("NCHW",) and first.out_formats == ("NC1HWC0",)
    assert first.duration_us == pytest.approx(53.841) and first.block_dim == 32
    assert cap.level == "Level1"
    # 191 rows: 4 all-reduce tasks are communication, counted, not device compute
    assert len(cap.ops) == 187 and cap.skipped == {"communication": 4}
    assert sum(o.type == "TransData" for o in cap.ops) == 57


@pytest.mark.shared_data
def test_sqlite_export_names_its_soc():
    (cap,) = read_measured_ops(TIMINGS / "llm_setup_8dev_msprof_db")
    assert cap.soc == "Ascend910B" and cap.source == "db"
    assert cap.ops and all(o.soc == "Ascend910B" for o in cap.ops)
    assert any(o.in_shapes for o in cap.ops)


@pytest.mark.shared_data
def test_level0_capture_has_no_shapes():
    (cap,) = read_measured_ops(PROFILES / "mstt_fixtures" / "kernel_details_level0_trans_names.csv")
    assert cap.ops and not cap.has_shapes


def test_bad_durations_are_counted_not_kept(tmp_path):
    rows = [td("t0", "NCHW", "NC1HWC0", "1,16,8,8", "1,1,8,8,16", "5.0"),
            td("t1", "NCHW", "NC1HWC0", "1,16,8,8", "1,1,8,8,16", "-3"),
            td("t2", "NCHW", "NC1HWC0", "1,16,8,8", "1,1,8,8,16", "inf"),
            op("hcom_allReduce_1", "hcom_allReduce_", "COMMUNICATION", "100")]
    (cap,) = read_measured_ops(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert [o.name for o in cap.ops] == ["t0"]
    assert cap.skipped.get("communication") == 1
    # the parser drops the non-finite row itself (with a warning); ops.py the negative one
    assert cap.skipped.get("non-finite or negative duration", 0) + len(cap.warnings) >= 2
    assert isinstance(cap.ops[0], MeasuredOp) and cap.ops[0].in_dtypes == ("FLOAT16",)


def test_nothing_there_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError):
        read_measured_ops(tmp_path)


def test_plan_comparison_matches_transdata_by_formats_and_logical_shape(tmp_path):
    from npu_deploy.profiling.ops import compare_with_plan

    rows = [td("trans_TransData_0", "NCHW", "NC1HWC0", "1,16,8,8", "1,1,8,8,16", "6.0"),
            td("trans_TransData_1", "NC1HWC0", "NCHW", "1,1,8,8,16", "1,16,8,8", "4.0"),
            op("conv1", "Conv2D", "AI_CORE", "20.0", in_shape="1,1,8,8,16", in_dtype="FLOAT16",
               in_fmt="NC1HWC0", out_shape="1,1,8,8,16", out_dtype="FLOAT16", out_fmt="NC1HWC0")]
    caps = read_measured_ops(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    manifest = {"soc": "Ascend310P3",
                "transdata": [{"src_format": "NCHW", "dst_format": "NC1HWC0", "shape": [1, 16, 8, 8], "est_us": 5.0},
                              {"src_format": "NCHW", "dst_format": "FRACTAL_Z", "shape": [16, 16, 3, 3], "est_us": 3.0}],
                "cost": {"est_us": {"conv1": 5.0, "not_on_device": 1.0}}}
    cmp = compare_with_plan(caps, manifest)
    by = {(m.src_format, m.dst_format, m.shape): m for m in cmp.transdata}
    assert (by[("NCHW", "NC1HWC0", (1, 16, 8, 8))].planned, by[("NCHW", "NC1HWC0", (1, 16, 8, 8))].measured) == (1, 1)
    assert by[("NC1HWC0", "NCHW", (1, 16, 8, 8))].planned == 0          # measured, not planned
    assert by[("NCHW", "FRACTAL_Z", (16, 16, 3, 3))].measured == 0       # planned, not measured
    assert cmp.furthest == [("conv1", "Conv2D", 5.0, 20.0)]
    assert any("-75 %" in line for line in cmp.lines())
