"""910B parts: per-part profiles (peaks from CANN's platform_config core counts), which part a capture ran
on (named in it, else inferred from its block dims), and `--soc` over both."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from npu_deploy.converters.lowering import costcheck, pipeline
from npu_deploy.converters.lowering.cost import SOC_PROFILES, get_soc_profile, part_profile
from npu_deploy.converters.lowering.options import ConvertOptions
from npu_deploy.profiling.ops import read_measured_ops
from tests.conftest import PROFILES, SHARED_DATA

LLM = PROFILES / "torch_npu_level2_llm_910B"
CNN = SHARED_DATA / "timings_910B" / "cnn_level1_rank1_ascend_pt"
CNN2 = SHARED_DATA / "timings_910B" / "cnn_level2_rank0_ascend_pt"


def test_part_profiles_peaks_against_the_platform_config_figures():
    fam = SOC_PROFILES["Ascend910B"]
    b4 = get_soc_profile("Ascend910B4")
    # CANN platform_config Ascend910B4.ini: 20 cube cores at 1500 MHz, a 16x16x16 fp16 cube each:
    # 20 x 4096 MACs x 2 x 1.5e9 = 245.76 TFLOPS
    assert b4.name == "Ascend910B4" and b4.fp16_tflops == pytest.approx(245.76)
    assert b4.vector_fp16_tflops == pytest.approx(fam.vector_fp16_tflops * 40 / 48)   # 40 of 48 vector cores
    assert b4.int8_tops == pytest.approx(2 * 245.76)                                    # the family's 2x ratio
    assert b4.fp32_tflops == pytest.approx(fam.fp32_tflops * 245.76 / fam.fp16_tflops)
    b3 = get_soc_profile("Ascend910B3")                   # 20 cores, clock not published: 20/24 of 300
    assert b3.fp16_tflops == pytest.approx(250.0)
    assert b3.vector_fp16_tflops == pytest.approx(fam.vector_fp16_tflops * 40 / 48)
    b2 = get_soc_profile("Ascend910B2")                   # 24/48: the family profile's own core counts
    assert (b2.fp16_tflops, b2.vector_fp16_tflops, b2.fp32_tflops) == (fam.fp16_tflops, fam.vector_fp16_tflops,
                                                                      fam.fp32_tflops)
    for p in (b2, b3, b4):
        # the HBM rate per part is not published: the family's, labelled an assumption; efficiencies shared
        assert p.bandwidth_gbps == fam.bandwidth_gbps and p.sources["bandwidth_gbps"].startswith("assumption")
        assert (p.vector_efficiency, p.cube_efficiency_by_dtype, p.launch_us_by_engine) == (
            fam.vector_efficiency, fam.cube_efficiency_by_dtype, fam.launch_us_by_engine)
        assert p.calibrated and "platform_config" in p.sources["fp16_tflops"]
    assert get_soc_profile("Ascend910B1") is fam            # no core count for B1 in any source here
    assert part_profile(fam, "Ascend310P3") is fam          # not a 910B part: unchanged


def test_convert_prices_the_plan_on_the_part(example_onnx):
    def plan(soc):
        return pipeline.lower(example_onnx, None, ConvertOptions(backend="builtin", soc=soc),
                              until="plan from ONNX").plan.cost

    b4, b2 = plan("Ascend910B4"), plan("Ascend910B2")
    assert b4.soc == "Ascend910B4" and b2.soc == "Ascend910B2"
    assert b4.total_us >= b2.total_us                      # fewer cores, same memory: never faster


def _block_dims(capture_dir) -> dict[str, int]:
    """Largest Block Dim per Accelerator Core, read straight from kernel_details.csv (not via the code)."""
    out: dict[str, int] = {}
    for f in capture_dir.rglob("kernel_details.csv"):
        with open(f, newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                try:
                    bd = int(row.get("Block Dim") or row.get("Block Num") or 0)
                except ValueError:
                    continue
                eng = row.get("Accelerator Core", "")
                if bd <= 48:
                    out[eng] = max(out.get(eng, 0), bd)
    return out


@pytest.mark.shared_data
def test_block_dims_tell_the_part_of_the_real_captures():
    # by hand from the rows: the LLM step's kernels use at most 20 blocks on AI_CORE/MIX_AIC and 40 on
    # AI_VECTOR_CORE/MIX_AIV (1,281 vector rows at 40); the CNN's reach 24 and 48
    llm_dims, cnn_dims = _block_dims(LLM), _block_dims(CNN)
    assert llm_dims.get("AI_CORE") == 20 and llm_dims.get("AI_VECTOR_CORE") == 40
    assert cnn_dims.get("AI_CORE") == 24 and cnn_dims.get("AI_VECTOR_CORE") == 48
    (llm,) = read_measured_ops(LLM)
    (cnn,) = read_measured_ops(CNN)
    assert llm.soc is None and cnn.soc is None              # neither capture names its SoC
    a, b = costcheck.capture_part(llm.ops), costcheck.capture_part(cnn.ops)
    assert (a.soc, a.inferred) == ("Ascend910B4", True) and "20-core" in a.why and "B3/B4" in a.why
    assert (b.soc, b.inferred) == ("Ascend910B2", True) and "24-core" in b.why


@pytest.mark.shared_data
def test_a_part_named_in_profiler_info_wins_and_soc_wins_over_both(tmp_path, run_cli):
    cap = tmp_path / "cnn_named_ascend_pt"
    shutil.copytree(CNN, cap)
    info = cap / "profiler_info_1.json"
    d = json.loads(info.read_text())
    d["soc_version"] = "Ascend910B4"                        # the rows say 24/48; the capture says B4
    info.write_text(json.dumps(d))
    (c,) = read_measured_ops(cap)
    choice = costcheck.capture_part(c.ops, c.soc)
    assert choice.soc == "Ascend910B4" and not choice.inferred and "named in the capture" in choice.why
    j, h = tmp_path / "c.json", tmp_path / "c.html"
    code, out, err = run_cli("cost", "check", cap, "--json", j, "--html", h)
    assert code == 0, err
    named = "SoC: Ascend910B4 — Ascend910B4 named in the capture"
    assert json.loads(j.read_text())["soc"] == "Ascend910B4" and named in out
    assert "<p>SoC: Ascend910B4 — Ascend910B4 named in the capture" in h.read_text()
    j2 = tmp_path / "c2.json"
    code, out, err = run_cli("cost", "check", cap, "--soc", "Ascend910B3", "--json", j2)
    assert code == 0, err
    d2 = json.loads(j2.read_text())
    assert d2["soc"] == "Ascend910B3" and "given with --soc" in d2["soc_note"]
    # fewer cube cores than the 24-core profile it was inferred as: the Convs cost more
    j3 = tmp_path / "c3.json"
    assert run_cli("cost", "check", CNN, "--json", j3)[0] == 0
    d3 = json.loads(j3.read_text())
    assert d3["soc"] == "Ascend910B2" and "inferred from block dims" in d3["soc_note"]
    conv = lambda dd: sum(o["predicted_us"] for o in dd["ops"] if o["type"] == "Conv2D")  # noqa: E731
    assert conv(d2) > conv(d3)


@pytest.mark.shared_data
@pytest.mark.slow
def test_fit_prices_each_capture_on_its_part_with_one_set_of_parameters():
    pytest.importorskip("scipy", reason="cost fit needs scipy")
    caps = [(c.label, c.ops) for p in (CNN, CNN2) for c in read_measured_ops(p)]
    _, same = costcheck.fit(caps, "Ascend910B", name="t")
    _, mixed = costcheck.fit(caps, "Ascend910B", name="t", parts={caps[1][0]: "Ascend910B4"})
    assert {k: v["soc"] for k, v in same.parts.items()} == {caps[0][0]: "Ascend910B2", caps[1][0]: "Ascend910B2"}
    assert mixed.parts[caps[1][0]] == {"soc": "Ascend910B4", "why": "given with --part"}
    assert set(mixed.parameters) == set(same.parameters)   # the parameter count does not grow per part
    # every capture on one part: the written profile carries that part's peaks
    prof, _ = costcheck.fit(caps, "Ascend910B", parts={caps[0][0]: "Ascend910B4", caps[1][0]: "Ascend910B4"})
    assert prof.name == "Ascend910B4-fitted" and prof.fp16_tflops == pytest.approx(245.76)
