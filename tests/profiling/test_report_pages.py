"""What a reader of the profile HTML sees first, through ``npu-deploy profile analyze --html``: the
figure that flags leads, every second figure says what it counts, unknowns are called unknown.

Pages are parsed with html.parser (text order and the colour of each share bar); the layouts were
also looked at in headless Chromium while writing these tests."""

from __future__ import annotations

import html.parser
import re
import shutil

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
