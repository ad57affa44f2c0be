"""One named case per quirk in reference/msprof.md §2–3, on small files written here.

Expected numbers are computed by hand from each fixture's content (durations chosen so the arithmetic is
obvious), not copied from the code under test.
"""

from __future__ import annotations

import pytest

from npu_deploy.errors import ProfileError
from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.profiling.parse import (
    clean,
    normalize_format,
    op_type_from_name,
    parse_shapes,
    split_formats,
)
from tests.profiling.helpers import csv_text, op, td, write_csv

BASE = [op("MatMul_0", "MatMulV2", "AI_CORE", "90.000"),
        td("trans_TransData_0", "NCHW", "NC1HWC0", "32,3,224,224", "32,1,224,224,16", "10.000")]


def kinds(r, category="format"):
    return {(k.src, k.dst): k for k in r.conversions if k.category == category}


@pytest.mark.parametrize("quoted", [True, False])
def test_trailing_tab_on_start_time(tmp_path, quoted):
    text = csv_text(BASE, quote_tab=quoted)
    assert ('\t",' in text) == quoted and "\t" in text  # both spellings occur in real files
    p = tmp_path / "op_summary_0_1.csv"
    p.write_text(text)
    r = analyze_profile(p)
    assert r.compute_us == pytest.approx(100.0) and r.transdata_pct == pytest.approx(10.0)
    assert not r.warnings


def test_tab_in_duration_cell_is_stripped(tmp_path):
    rows = [dict(BASE[0], dur="90.000\t"), dict(BASE[1], dur="\t10.000")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert r.compute_us == pytest.approx(100.0)


@pytest.mark.parametrize("missing", ["N/A", "", "NULL"])
def test_missing_values_in_formats_and_shapes(tmp_path, missing):
    rows = [BASE[0], td("trans_TransData_0", missing, missing, "", "", "10.000")]
    rows[1]["in_shape"] = missing
    rows[1]["out_shape"] = missing
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert r.transdata_pct == pytest.approx(10.0)
    (k,) = [k for k in r.conversions if k.category == "format"]
    assert (k.src, k.dst) == ("?", "?") and k.label == "(formats not recorded)"
    assert k.shapes == []


def test_missing_duration_is_skipped_and_counted(tmp_path):
    rows = BASE + [op("Add_1", "Add", "AI_VECTOR_CORE", "N/A"), op("Add_2", "Add", "AI_VECTOR_CORE", "")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert r.compute_us == pytest.approx(100.0)
    (w,) = [w for w in r.warnings if "duration missing" in w]
    assert "skipped 2 rows" in w and "lines 4, 5" in w


def test_literal_quotes_around_shapes():
    assert parse_shapes('"32,3,224,224"') == [(32, 3, 224, 224)]
    assert parse_shapes('"2048;"') == [(2048,), ()]
    assert parse_shapes('";;"') == [(), (), ()]
    assert parse_shapes("; ; ; ;") == [(), (), (), (), ()]


def test_semicolon_separated_tensors_use_first_data_tensor(tmp_path):
    rows = [BASE[0], td("trans_TransData_0", "ND;ND", "FRACTAL_NZ", "128,384;", "24,8,16,16", "10.000")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    (k,) = [k for k in r.conversions if k.category == "format"]
    assert (k.src, k.dst) == ("ND", "FRACTAL_NZ") and k.shapes == [["128,384", 1]]


def test_format_prefix_and_subformat_suffix(tmp_path):
    assert normalize_format("FORMAT_ND") == "ND"
    assert normalize_format("NC1HWC0:1") == "NC1HWC0"
    assert normalize_format(" FORMAT_FRACTAL_NZ ") == "FRACTAL_NZ"
    assert split_formats("FORMAT_ND;NC1HWC0:1;N/A") == ["ND", "NC1HWC0", None]
    rows = [BASE[0], td("a", "FORMAT_NCHW", "NC1HWC0:1", "1,64,56,56", "1,4,56,56,16", "4.000"),
            td("b", "NCHW", "NC1HWC0", "1,64,56,56", "1,4,56,56,16", "6.000")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    k = kinds(r)[("NCHW", "NC1HWC0")]
    assert k.count == 2 and k.total_us == pytest.approx(10.0)  # one kind, not two


@pytest.mark.parametrize("newline,bom", [("\r\n", False), ("\n", True), ("\r\n", True)])
def test_crlf_and_bom(tmp_path, newline, bom):
    p = write_csv(tmp_path / "op_summary_0_1.csv", BASE, newline=newline, bom=bom)
    r = analyze_profile(p)
    assert r.compute_us == pytest.approx(100.0) and r.transdata_pct == pytest.approx(10.0)
    assert r.conversions[0].src == "NCHW"  # first header cell read without the BOM, last cell without CR


def test_level0_without_op_types_classifies_by_name(tmp_path):
    rows = [op("Conv2D17", "N/A", "N/A", "50.000"), op("trans_TransData_20", "N/A", "N/A", "20.000"),
            op("aclnnMatmul_TransData_TransData", "N/A", "N/A", "10.000"),
            op("trans_Cast_19", "N/A", "N/A", "10.000"), op("BroadcastTo21", "N/A", "N/A", "10.000"),
            op("hcom_broadcast__445_0", "N/A", "HCCL", "900.000")]
    r = analyze_profile(write_csv(tmp_path / "kernel_details.csv", rows, style="kernel_details"))
    assert r.compute_us == pytest.approx(100.0)
    assert r.transdata_pct == pytest.approx(30.0)       # both TransData kernels, by name
    assert r.cast_pct == pytest.approx(10.0)            # trans_Cast_19 only: BroadcastTo is not a Cast
    assert r.communication_us == pytest.approx(900.0)
    assert r.classified_by_name == 6


def test_name_rules():
    assert op_type_from_name("trans_TransData_12") == "TransData"
    assert op_type_from_name("aclnnMaxPool2dWithMask_TransDataSpecial_TransData") == "TransData"
    assert op_type_from_name("aclnnAdaptiveAvgPool2d_TransposeAiCore_Transpose") == "Transpose"
    assert op_type_from_name("Default/network/Conv2D-op12/TransData-op3") == "TransData"
    assert op_type_from_name("TransposeBatchMatMul5") == "TransposeBatchMatMul"
    assert op_type_from_name("hcom_allReduce__1_0") == "hcom_allReduce_"


def test_sentinel_model_id_and_na_stream(tmp_path):
    # Model ID 4294967295 (single-op) and Stream ID N/A must not matter
    rows = [dict(r, stream="N/A") for r in BASE]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert r.compute_us == pytest.approx(100.0)


def test_short_and_long_rows_are_skipped_and_named(tmp_path):
    text = csv_text(BASE + [op("Add_1", "Add", "AI_VECTOR_CORE", "5.000")] * 4).splitlines()
    text[2] = text[2].rsplit(",", 1)[0]                  # one field short (line 3)
    text[4] = text[4] + ",extra"                          # one field long (line 5)
    text[5] = text[5] + ",extra"                          # and again (line 6)
    p = tmp_path / "op_summary_0_1.csv"
    p.write_text("\n".join(text) + "\n")
    r = analyze_profile(p)
    assert r.compute_us == pytest.approx(90.0 + 2 * 5.0)
    short = [w for w in r.warnings if "22 fields" in w]
    long_ = [w for w in r.warnings if "24 fields" in w]
    assert short and "line 3" in short[0] and "skipped 1 row" in short[0]
    assert long_ and "lines 5, 6" in long_[0] and "skipped 2 rows" in long_[0]


def test_header_aliases_give_the_same_answer(tmp_path):
    a = analyze_profile(write_csv(tmp_path / "a" / "op_summary_0_1.csv", BASE))
    b = analyze_profile(write_csv(tmp_path / "b" / "kernel_details.csv", BASE, style="kernel_details"))
    for key in ("compute_us", "transdata_pct", "transdata_ops"):
        assert getattr(a, key) == getattr(b, key)
    # old names: Block Dim, Task Start Time without unit, Step ID (MindSpore), Task Duration without unit
    text = csv_text(BASE).replace("Block Num", "Block Dim").replace("Task Start Time(us)", "Task Start Time")
    text = text.replace("Device_id", "Step ID")
    p = tmp_path / "c" / "op_summary_0_1.csv"
    p.parent.mkdir()
    p.write_text(text)
    c = analyze_profile(p)
    assert c.compute_us == a.compute_us and c.transdata_pct == a.transdata_pct


def test_hccl_and_hcom_rows_are_communication(tmp_path):
    rows = BASE + [op("hcom_allGather__1_1", "hcom_allGather_", "HCCL", "400.000"),
                   op("hcom_reduceScatter__2_1", "N/A", "N/A", "500.000")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert r.compute_us == pytest.approx(100.0)
    assert r.communication_us == pytest.approx(900.0) and r.communication_ops == 2


def test_wrong_encoding_does_not_crash(tmp_path):
    p = write_csv(tmp_path / "op_summary_0_1.csv", BASE + [op("层_名", "Add", "AI_VECTOR_CORE", "5.000")],
                  encoding="gbk")
    r = analyze_profile(p)
    assert r.compute_us == pytest.approx(105.0)


def test_garbage_numbers_skipped(tmp_path):
    rows = BASE + [op("x", "Add", "AI_VECTOR_CORE", v) for v in ("nan", "inf", "-3", "1e400", "12,5", "abc")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert r.compute_us == pytest.approx(100.0)
    assert sum(int(w.split("skipped ")[1].split()[0]) for w in r.warnings if "skipped" in w) == 6


def test_clean():
    assert clean(" 12.5\t") == "12.5" and clean("N/A") is None and clean("NULL") is None and clean("") is None


def test_not_an_op_table(tmp_path):
    p = tmp_path / "op_summary_0_1.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ProfileError) as e:
        analyze_profile(p)
    assert "not a recognisable profiler table" in str(e.value) and "Task Duration(us)" in str(e.value)


def test_empty_file(tmp_path):
    p = tmp_path / "op_summary_0_1.csv"
    p.write_text("")
    with pytest.raises(ProfileError):
        analyze_profile(p)


def test_header_only_has_no_compute(tmp_path):
    p = tmp_path / "op_summary_0_1.csv"
    p.write_text(csv_text([]))
    with pytest.raises(ProfileError) as e:
        analyze_profile(p)
    assert "no device compute time" in str(e.value)


def test_oversized_cell_is_skipped_and_reading_goes_on(tmp_path):
    rows = [BASE[0], op("x" * 200_000, "Add", "AI_VECTOR_CORE", "5.000"), BASE[1]]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert r.compute_us == pytest.approx(100.0)     # the rows after the bad one still count
    (w,) = [w for w in r.warnings if "malformed CSV" in w]
    assert "skipped 1 row" in w and "line 3" in w
