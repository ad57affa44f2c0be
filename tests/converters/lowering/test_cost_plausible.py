"""Measured rows no physical rate can produce: the bytes an op moves beyond what the part's L2 holds must
stream at most at HBM peak x PLAUSIBLE_RATE_MARGIN; faster rows are kept, reported and left out of the
totals and of the fit (issue 19: the llm_setup capture's ZerosLike of 6.7 GB in 612 µs)."""

from __future__ import annotations

import json

import pytest

from npu_deploy.converters.lowering import costcheck
from npu_deploy.converters.lowering.cost import SocProfile, get_soc_profile
from npu_deploy.errors import InputError
from npu_deploy.profiling.ops import MeasuredOp, read_measured_ops
from tests.conftest import PROFILES, SHARED_DATA

TIMINGS = SHARED_DATA / "timings_910B"
LLM_SETUP = TIMINGS / "llm_setup_8dev_msprof_db"
MIB = 1 << 20


def _op(type_, shape, dur, dtype="FLOAT", engine="AI_VECTOR_CORE", name="op"):
    return MeasuredOp(name, type_, engine, (shape,), (shape,), (dtype,), (dtype,), ("ND",), ("ND",), dur)


def _check(capture_dir):
    """`cost check` as the CLI runs it: each capture on the part it ran on."""
    caps = [c for c in read_measured_ops(capture_dir) if c.has_shapes]
    soc_of = {c.label: costcheck.capture_part(c.ops, c.soc).soc for c in caps}
    return costcheck.check([o for c in caps for o in c.ops], next(iter(soc_of.values())), soc_of=soc_of,
                           captures=[c.label for c in caps]), caps


def test_the_floor_by_hand_just_above_and_below():
    """A ZerosLike of 1 GiB of float32 on the family profile (HBM 1.6 TB/s, L2 192 MiB): what L2 cannot
    hold, 1024 - 192 MiB, written at 1.6 TB/s x 1.25 takes 436.2 µs; just faster is implausible."""
    p = get_soc_profile("Ascend910B")
    assert (p.bandwidth_gbps, p.l2_mib, costcheck.PLAUSIBLE_RATE_MARGIN) == (1600.0, 192.0, 1.25)
    n = 1 << 28                                          # 2^28 floats = 1 GiB written, nothing read
    floor_us = (4 * n - 192 * MIB) / (1600e9 * 1.25) * 1e6
    assert floor_us == pytest.approx(436.2, abs=0.1)
    f = costcheck.features(_op("ZerosLike", (n,), 1.0))
    assert f.nbytes == 4 * n and costcheck.hbm_floor_us(f, p) == pytest.approx(floor_us)
    assert costcheck.implausible(f, floor_us * 1.01, p) is None
    why = costcheck.implausible(f, floor_us * 0.99, p)
    assert why is not None and "1.1 GB" in why and "192 MiB" in why and "not what the kernel wrote" in why
    r = costcheck.check([_op("ZerosLike", (n,), floor_us * 0.99), _op("ZerosLike", (n,), floor_us * 1.01)], p)
    assert [o.excluded is not None for o in r.ops] == [True, False]
    assert r.ops[0].predicted_us is None and r.ops[1].predicted_us is not None


def test_an_op_within_l2_is_never_flagged_and_l2_is_the_parts():
    """16 MiB (the llm_setup OnesLike/Tril size) fits either part's L2: no time is too fast for it. 150 MiB
    fits Ascend910B2's 192 MiB but not Ascend910B4's 96 MiB."""
    small = costcheck.features(_op("OnesLike", (1, 2048, 2048), 1.0))
    for soc in ("Ascend910B", "Ascend910B2", "Ascend910B4"):
        assert costcheck.implausible(small, 0.01, get_soc_profile(soc)) is None
    mid = costcheck.features(_op("ZerosLike", (150 * MIB // 4,), 1.0))
    b2, b4 = get_soc_profile("Ascend910B2"), get_soc_profile("Ascend910B4")
    assert (b2.l2_mib, b4.l2_mib) == (192.0, 96.0)
    assert "platform_config" in b2.sources["l2_mib"] and "platform_config" in b4.sources["l2_mib"]
    assert get_soc_profile("Ascend910B").sources["l2_mib"].startswith("assumption")
    assert costcheck.implausible(mid, 5.0, b2) is None
    assert costcheck.implausible(mid, 5.0, b4) is not None              # 54 MiB beyond L2 in 5 µs


def test_no_l2_size_known_no_floor_and_the_field_is_checked():
    p310 = get_soc_profile("Ascend310P3")
    assert p310.l2_mib is None
    big = costcheck.features(_op("ZerosLike", (1 << 30,), 1.0))
    assert costcheck.hbm_floor_us(big, p310) is None and costcheck.implausible(big, 0.1, p310) is None
    mine = SocProfile.from_dict({"name": "mine", "base": "Ascend910B", "l2_mib": None})
    assert costcheck.implausible(big, 0.1, mine) is None
    assert SocProfile.from_dict({"name": "x", "base": "Ascend910B"}).l2_mib == 192.0   # the base's
    with pytest.raises(InputError, match="l2_mib"):
        SocProfile.from_dict({"name": "x", "base": "Ascend910B", "l2_mib": -1})


def test_gather_and_embedding_grad_move_the_rows_their_indices_select():
    """The LLM step's embedding rows (151,936 x 1,024 table, 4,096 tokens): GatherV2 reads 4,096 rows,
    not the 311 MB table; EmbeddingDenseGradV2 accumulates 4,096 grad rows into a table a ZerosLike has
    zeroed (aclnnEmbeddingDenseBackward), writing those rows, not 622 MB."""
    g = MeasuredOp("g", "GatherV2", "AI_VECTOR_CORE", ((151936, 1024), (1, 4096), (1,)), ((1, 4096, 1024),),
                   ("BF16", "INT64", "INT64"), ("BF16",), ("ND",) * 3, ("ND",), 35.6)
    f = costcheck.features(g)
    assert f.nbytes == 2 * (4096 * 1024 * 2) + 4096 * 8 + 8
    assert f.flops == 4096 * 1024
    # gpt3_step_start_rank1: 16,384 tokens of a 6,400-row table: at most the table is fetched
    g3 = MeasuredOp("g", "GatherV2", "AI_CORE", ((6400, 5120), (2, 8192), (1,)), ((2, 8192, 5120),),
                    ("BF16", "INT32", "INT64"), ("BF16",), ("ND",) * 3, ("ND",), 648.4)
    assert costcheck.features(g3).nbytes == 6400 * 5120 * 2 + 2 * 8192 * 4 + 8 + 2 * 8192 * 5120 * 2
    e = MeasuredOp("e", "EmbeddingDenseGradV2", "MIX_AIV", ((1, 4096, 1024), (4096,), (4096,)), ((151936, 1024),),
                   ("FLOAT", "INT32", "INT32"), ("FLOAT",), ("NCL", "ND", "ND"), ("ND",), 130.3)
    h = costcheck.features(e)
    assert h.nbytes == 4096 * 1024 * 4 + 2 * 4096 * 4 + 4096 * 1024 * 4
    b4 = get_soc_profile("Ascend910B4")
    assert costcheck.implausible(f, 35.6, b4) is None and costcheck.implausible(h, 130.3, b4) is None


@pytest.mark.shared_data
def test_llm_setup_the_zeroslike_is_flagged_and_nothing_else():
    r, caps = _check(LLM_SETUP)
    ops = [o for c in caps for o in c.ops]
    assert len(r.ops) == len(ops) == 11                                  # kept, never dropped
    flagged = [o for o in r.ops if o.excluded]
    assert [o.type for o in flagged] == ["ZerosLike"]
    z = flagged[0]
    assert z.measured_us == pytest.approx(612.1, abs=0.1) and z.predicted_us is None and z.error_pct is None
    assert "6.7 GB = 11.0 TB/s" in z.excluded
    assert r.implausible["count"] == 1 and r.implausible["types"] == {"ZerosLike": 1}
    rest = sum(o.duration_us for o in ops if o.type != "ZerosLike")       # the other 10 rows, as read
    assert r.total["measured_us"] == pytest.approx(rest + z.measured_us)
    assert r.total["measured_priced_us"] == pytest.approx(rest)
    assert r.total["predicted_us"] == pytest.approx(sum(o.predicted_us for o in r.ops if o.predicted_us))
    assert r.implausible["share_pct"] == pytest.approx(100 * z.measured_us / (rest + z.measured_us))
    assert r.not_priced["count"] == 0                                     # implausible is not "not priced"
    d = json.loads(r.to_json())
    zj = next(o for o in d["ops"] if o["type"] == "ZerosLike")
    assert zj["predicted_us"] is None and zj["excluded"] == z.excluded
    assert all(o["excluded"] is None for o in d["ops"] if o["type"] != "ZerosLike")
    text = costcheck.render_text(r)
    assert "implausible measurements: 1 ops, 92.2 % of measured device time (ZerosLike" in text
    assert "device time, priced plausible ops: measured 51.8 µs" in text
    assert "implausible measurements: 1 ops" in costcheck.render_html(r)


@pytest.mark.shared_data
@pytest.mark.parametrize("capture", [TIMINGS / "cnn_level1_rank1_ascend_pt", TIMINGS / "cnn_level2_rank0_ascend_pt",
                                     TIMINGS / "cnn_level2_rank1_ascend_pt", PROFILES / "torch_npu_level2_llm_910B"],
                         ids=lambda p: p.name)
def test_no_measurement_of_the_cnn_captures_or_the_llm_step_is_flagged(capture):
    r, caps = _check(capture)
    assert sum(len(c.ops) for c in caps) == len(r.ops) > 100
    assert r.implausible["count"] == 0 and not any(o.excluded for o in r.ops)
    assert "implausible measurements: 0 ops, 0.0 % of measured device time (none)" in costcheck.render_text(r)


def test_fit_leaves_implausible_rows_out():
    """Two captures of vector kernels whose times follow one rate, and one ZerosLike no rate can produce:
    the fit is made on the others and says it left one out."""
    pytest.importorskip("scipy", reason="cost fit needs scipy (pip install 'npu-deploy[cost]')")
    caps = []
    for label, scale in (("a", 1.0), ("b", 1.1)):
        ops = [_op("Relu", (n,), 2.0 + scale * 8 * n / 0.8e12 * 1e6, name=f"relu{n}")
               for n in (1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26)]
        ops += [_op("Add", (n,), 2.0 + scale * 8 * n / 0.8e12 * 1e6, name=f"add{n}") for n in (1 << 20, 1 << 24)]
        caps.append((label, ops))
    caps[0][1].append(_op("ZerosLike", (1676480000,), 612.1, name="lazy_zero"))
    prof, res = costcheck.fit(caps, "Ascend910B", name="t")
    assert res.n_excluded == 1 and res.n_ops == 14
    (bad,) = res.excluded["a"]
    assert bad["name"] == "lazy_zero" and "11.0 TB/s" in bad["why"]
    assert "1 implausible measurement left out" in res.verdict()
    assert "1 implausible measurement left out" in prof.calibration["summary"]
