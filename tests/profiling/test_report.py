"""Terminal text and self-contained HTML rendering."""

from __future__ import annotations

import html
import html.parser

import pytest

from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.profiling.report import fmt_us, render_text, write_html
from tests.profiling.helpers import flagged_rows, op, td, write_csv

EVIL = '<script>alert("x")</script>&<img src=http://evil/x.png onerror=1>'


@pytest.fixture
def report(tmp_path):
    rows = flagged_rows() + [td(EVIL, "NCHW", "NC1HWC0", "1,64,56,56", "1,4,56,56,16", "1.000"),
                             op(EVIL + "_next", "Add", "AI_VECTOR_CORE", "1.000")]
    return analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))


def test_text_verdict_first_then_tables(report):
    text = render_text(report)
    lines = text.splitlines()
    assert lines[0] == report.verdict() and "FLAGGED" in lines[0]
    assert "Conversion kinds" in text and "Top conversion ops" in text and "Round trips" in text
    assert "FRACTAL_NZ→ND→FRACTAL_NZ" in text and "Suggestions" in text
    kinds = text[text.index("Conversion kinds"):text.index("Top conversion ops")]
    assert "NCHW→NC1HWC0" in kinds and "FRACTAL_NZ→ND" in kinds


class _Collector(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []
        self.attrs = []
        self.text = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)

    def handle_data(self, data):
        self.text.append(data)


def test_html_self_contained_and_escaped(report, tmp_path):
    out = tmp_path / "r.html"
    write_html(report, out)
    doc = out.read_text(encoding="utf-8")
    c = _Collector()
    c.feed(doc)
    assert "script" not in c.tags and "img" not in c.tags       # the profile's strings stay text
    assert EVIL in "".join(c.text)                               # …and are shown, unescaped for the reader
    # nothing loaded from elsewhere: no src/href attributes, no CSS imports or urls
    assert not any(k in ("src", "href") for k, _ in c.attrs) and "link" not in c.tags
    assert "url(" not in doc and "@import" not in doc
    assert "<style>" in doc
    text = "".join(c.text)
    assert report.verdict() in text
    for needle in ("Device time by op type", "Conversion kinds", "Round trips", "Suggestions",
                   "threshold 8 %", "FRACTAL_NZ→ND→FRACTAL_NZ", "Keep FRACTAL_NZ between MatMuls"):
        assert needle in text, needle
    assert "class='bar format'" in doc                          # FormatTrans highlighted in the chart


def test_html_not_left_half_written(report, tmp_path, monkeypatch):
    import npu_deploy.profiling.report as rep

    out = tmp_path / "r.html"

    def boom(r, **kw):
        raise RuntimeError("render failed")

    monkeypatch.setattr(rep, "render_html", boom)
    with pytest.raises(RuntimeError):
        write_html(report, out)
    assert not out.exists() and list(tmp_path.iterdir()) == [tmp_path / "op_summary_0_1.csv"]


def test_fmt_us():
    assert fmt_us(12.345) == "12.3 µs" and fmt_us(1234.5) == "1.23 ms" and fmt_us(2.5e6) == "2.50 s"


def test_permutations_are_labelled_by_shape_not_as_nd_to_nd(report, tmp_path):
    # flagged_rows: Transpose_8 permutes [128,12,32] (ND) to [12,128,32]; TransData keeps SRC→DST
    label = "Transpose ND [128,12,32]→[12,128,32]"
    (k,) = [k for k in report.conversions if k.category == "layout"]
    assert k.label == label and (k.in_shape, k.out_shape) == ("128,12,32", "12,128,32")
    text = render_text(report)
    kinds = text[text.index("Conversion kinds"):text.index("Top conversion ops")]
    assert label in kinds and "ND→ND" not in text and "NCHW→NC1HWC0" in kinds
    top = text[text.index("Top conversion ops"):]
    assert "Transpose ND" in top and "[128,12,32]→[12,128,32]" in top
    out = tmp_path / "r.html"
    write_html(report, out)
    doc = out.read_text(encoding="utf-8")
    assert label in html.unescape(doc) and "ND→ND" not in doc
    d = report.to_dict()
    labels = {c["label"] for c in d["conversions"]}
    assert label in labels and "NCHW→NC1HWC0" in labels and "FLOAT→FLOAT16" in labels
    assert {t["label"] for t in d["round_trips"]} == {"FRACTAL_NZ→ND→FRACTAL_NZ", "NC1HWC0→NCHW→NC1HWC0"}


def test_permutation_labels_without_shapes_or_formats(tmp_path):
    rows = [op("MatMul_0", "MatMulV2", "AI_CORE", "70.000"),
            op("Transpose_1", "TransposeD", "AI_VECTOR_CORE", "10.000", in_fmt="NCHW", out_fmt="NCHW"),
            op("Transpose_2", "Transpose", "AI_VECTOR_CORE", "20.000")]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    assert sorted(k.label for k in r.conversions) == ["Transpose (formats not recorded)", "TransposeD (NCHW)"]
    assert r.transpose_pct == pytest.approx(30.0)


def test_many_distinct_permutations_fold_into_one_kind_per_format(tmp_path):
    from npu_deploy.profiling.analyze import _MAX_LAYOUT_KINDS

    n = _MAX_LAYOUT_KINDS + 6
    rows = [op(f"Transpose_{i}", "Transpose", "AI_VECTOR_CORE", "1.000", in_shape=f"{i + 1},8", in_fmt="ND",
               out_shape=f"8,{i + 1}", out_fmt="ND") for i in range(n)]
    r = analyze_profile(write_csv(tmp_path / "op_summary_0_1.csv", rows))
    kinds = [k for k in r.conversions if k.category == "layout"]
    assert len(kinds) == _MAX_LAYOUT_KINDS + 1 and sum(k.count for k in kinds) == n
    (rest,) = [k for k in kinds if k.in_shape is None]
    assert rest.label == "Transpose (ND)" and rest.count == 6


def test_devices_table_stays_aligned_with_long_capture_labels(tmp_path):
    for k, name in enumerate(("a", "a_much_longer_capture_folder_name_than_twelve")):
        rows = flagged_rows()
        rows[0] = {**rows[0], "dur": str(float(rows[0]["dur"]) + k)}  # two captures, not one copied twice
        write_csv(tmp_path / "caps" / name / "PROF_000001_20250101000000000_ABCDEF" / "mindstudio_profiler_output"
                  / "op_summary_20250101000000.csv", rows)
    text = render_text(analyze_profile(tmp_path / "caps"))
    block = text.split("Captures / devices\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(block) == 2
    assert len({line.index(" compute ") for line in block}) == 1, block
