"""What a reader of the profile HTML sees first, through ``npu-deploy profile analyze --html``: the
figure that flags leads, every second figure says what it counts, unknowns are called unknown.

Pages are parsed with html.parser (text order and the colour of each share bar); the layouts were
also looked at in headless Chromium while writing these tests."""

from __future__ import annotations

import html.parser
import json
import re
import shutil

import numpy as np
import pytest

from tests.conftest import PROFILES
from tests.profiling.helpers import op, td, write_csv

# six real captures side by side, as a folder of ranks would be
CAPTURES = ["msinsight_fixtures/op_summary_1.csv", "msinsight_fixtures/kernel_details_2023_fa.csv",
            "mstt_fixtures/kernel_details_2025_matmul_tab.csv", "mstt_fixtures/kernel_details_2023_pmu.csv",
            "mstt_fixtures/kernel_details_level0_trans_names.csv"]


class _Page(html.parser.HTMLParser):
    """Text in order, plus each gauge's colour and the figure printed in it."""

    def __init__(self):
        super().__init__()
        self.text: list[str] = []
        self.gauges: list[list] = []   # [colour, figure text]
        self._in_val = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class", "")
        if cls == "gauge":
            self.gauges.append([None, None])
        elif cls == "fill" and self.gauges:
            self.gauges[-1][0] = re.search(r"background:(#\w+)", a.get("style", "")).group(1)
        elif cls == "val" and self.gauges:
            self._in_val = True

    def handle_data(self, data):
        self.text.append(data)
        if self._in_val:
            self.gauges[-1][1] = data
            self._in_val = False

    @property
    def all(self) -> str:
        return " ".join(self.text)


def _page(path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


@pytest.fixture
def six(tmp_path):
    root = tmp_path / "captures"
    for c in CAPTURES:
        dst = root / c.replace("/", "_").removesuffix(".csv")
        dst.mkdir(parents=True)
        shutil.copy(PROFILES / c, dst)
    shutil.copytree(PROFILES / "torch_npu_level2_llm_910B", root / "torch_npu_level2_llm_910B")
    return root


@pytest.mark.shared_data
def test_six_captures_lead_with_the_flagged_one(run_cli, six, tmp_path):
    out = tmp_path / "six.html"
    code, text, err = run_cli("profile", "analyze", six, "--threshold", "3", "--html", out)
    assert code == 0, err
    page = _page(out)
    body = page.all
    flagged = "mstt_fixtures_kernel_details_level0_trans_names/kernel_details_level0_trans_names.csv"
    # the flagged capture and its own share come first, then the per-capture table, then pooled figures
    lead = body.index("Flagged:")
    assert flagged in body[lead:lead + 300] and "3.2 %" in body[lead:lead + 400]
    assert lead < body.index("one verdict each") < body.index("together (pooled)") < body.index("Device time")
    # each bar is red only when its own figure is above the threshold: no red 0.1 %
    assert page.gauges[0] == ["#d9534f", "3.2 %"]
    colour, figure = page.gauges[1]
    assert float(figure.split()[0]) < 3 and colour != "#d9534f"
    assert "flagged by the capture(s) above, not by this figure" in body
    # which capture each conversion op is from, and no ?→? / [?] for a capture without formats
    assert "?→?" not in body and "[?]" not in body
    assert "formats unknown" in body and "no Input/Output Formats" in body
    assert body.count("capture ") >= 7


def test_single_capture_cross_check_says_what_it_counts(run_cli, tmp_path):
    # TransData 6 of 100 µs, plus a ConvTranspose that msprof-analyze's name rule also counts
    rows = [op("Conv_0", "Conv2D", "AI_CORE", "80.000"),
            td("trans_TransData_0", "NCHW", "NC1HWC0", "1,64,56,56", "1,4,56,56,16", "6.000"),
            op("deconv_ConvTranspose_1", "Conv2DTranspose", "AI_CORE", "2.000"),
            op("Relu_2", "Relu", "AI_VECTOR_CORE", "12.000")]
    out = tmp_path / "one.html"
    code, text, err = run_cli("profile", "analyze", write_csv(tmp_path / "op_summary_0_1.csv", rows),
                              "--html", out)
    assert code == 0, err
    body = _page(out).all
    head = re.search(r"FormatTrans (\d+\.\d) % of device compute", body).group(1)
    note = body[body.index("Cross-checks"):]
    rule = re.search(r"name rule: (\d+\.\d+) %", note)
    assert rule and float(rule.group(1)) > float(head)                  # a second, larger figure …
    assert "Conv2DTranspose" in note and f"the headline ({head} %)" in note   # … says why
    assert "Cross-check" in text and "Conv2DTranspose" in text          # the terminal says it too


@pytest.fixture(scope="module")
def cls_dumped(real_model, tmp_path_factory):
    """PP-OCR cls converted with force_fp16, run once with ``--dump`` and once with ``--profile``."""
    from npu_deploy.cli.main import main

    d = tmp_path_factory.mktemp("cls")
    src = real_model("ppocr_cls")
    np.save(d / "x.npy", np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32))
    assert main(["convert", str(src), "-o", str(d / "cls.bundle"), "--backend", "builtin", "--precision-mode",
                 "force_fp16", "--input-shape", "x:1,3,48,192"]) == 0
    assert main(["run", str(d / "cls.bundle"), "--input", f"x={d / 'x.npy'}", "--dump", str(d / "dumps"),
                 "--loop", "1", "--profile", str(d / "ranks" / "rank_1_ascend_pt")]) == 0
    return src, d


class _Svg(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.circles: list[dict] = []
        self.titles: list[str] = []
        self.axis: list[str] = []
        self.styles = 0
        self._tag = None

    def handle_starttag(self, tag, attrs):
        self._tag = (tag, dict(attrs))
        if tag == "circle":
            self.circles.append(dict(attrs))
        self.styles += tag == "style"

    def handle_data(self, data):
        if self._tag and self._tag[0] == "title" and self.circles:
            self.titles.append(data)
        elif self._tag and self._tag[0] == "text" and "rotate" in self._tag[1].get("transform", ""):
            self.axis.append(data)


@pytest.mark.realmodel
@pytest.mark.slow
def test_debug_compare_page_names_layers_and_draws_zero_as_zero(cls_dumped, run_cli):
    from npu_deploy._html import CSS

    src, d = cls_dumped
    code, out, err = run_cli("debug", "compare", src, d / "dumps", "--bundle", d / "cls.bundle",
                             "--input", f"x={d / 'x.npy'}", "--html", d / "dc.html", "--json", d / "dc.json")
    assert code == 0, err
    doc = (d / "dc.html").read_text(encoding="utf-8")
    assert CSS in doc                                   # the same stylesheet as the profile pages
    svg = _Svg()
    svg.feed(doc)
    rows = json.loads((d / "dc.json").read_text())["rows"]
    compared = [r for r in rows if r.get("compared", True) and r.get("cosine") is not None]
    assert len(svg.circles) == len(svg.titles) >= len(compared) > 100
    # hover: every dot names its layer; axis: the first layer's name is under the axis
    assert all(t.split(" ", 2)[1] in {r["op"] for r in rows} for t in svg.titles)
    assert rows[0]["op"] in svg.axis and len(svg.axis) >= 30
    # the graph input's TransData is exact: its dot sits on the 0 line (hollow), below every log-scale dot
    exact = [c for c, t in zip(svg.circles, svg.titles) if "0 (exact)" in t]
    inexact = [c for c, t in zip(svg.circles, svg.titles) if "0 (exact)" not in t]
    assert exact and all(c["fill"] == "none" for c in exact)
    assert min(float(c["cy"]) for c in exact) > max(float(c["cy"]) for c in inexact)


@pytest.mark.realmodel
@pytest.mark.shared_data
@pytest.mark.slow
def test_cluster_page_marks_emulator_ranks(cls_dumped, run_cli):
    _, d = cls_dumped
    shutil.copytree(PROFILES / "torch_npu_level2_llm_910B", d / "ranks" / "rank_0_ascend_pt")
    code, out, err = run_cli("profile", "analyze", d / "ranks", "--cluster", "--html", d / "c.html")
    assert code == 0, err
    assert "estimated" in next(line for line in out.splitlines() if line.startswith("rank_1_ascend_pt"))
    body = _page(d / "c.html").all
    r0, r1 = body.index("rank_0_ascend_pt (slowest)"), body.index("rank_1_ascend_pt", body.index("Ranks"))
    assert "emulator estimate" in body[r1:r1 + 60] and "emulator estimate" not in body[r0:r1]
    assert "1 of 2 ranks were profiled on the CPU emulator" in body
