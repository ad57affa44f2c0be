"""Planner on small graphs built for one behaviour each: formats, TransData, cancellation, precision."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters import formats
from npu_deploy.converters.files.onnx_model import load_model
from npu_deploy.converters.lowering.planner import (FORMAT_RULES, MIX_PRECISION_FP32_OPS, PIPELINE, PlanReport,
                                           plan)
from npu_deploy.errors import InputError

RNG = np.random.default_rng(7)


def _w(name, shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _load(tmp_path, nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)
    return load_model(path)


def _plan(loaded, **kw):
    kw.setdefault("soc", "Ascend310P3")
    kw.setdefault("precision_mode", "force_fp16")
    return plan(loaded, **kw)


def _pairs(p):
    return sorted((t.tensor, t.src_format, t.dst_format) for t in p.transdata)


def _edge_formats_agree(p, graph):
    """Independent check over the plan's public data: after TransData, every activation edge's
    producer format equals the consumer's input format (plain layouts all equal)."""
    plain = {"ND", "NCHW", "NCDHW", "NHWC"}
    same = lambda a, b: a == b or (a in plain and b in plain)  # noqa: E731
    conv = {(t.tensor, c): t.dst_format for t in p.transdata for c in t.consumers}
    packed = {w.name: w.format for w in p.weights}
    for n in graph.node:
        nf = p.node_formats[n.name]
        if nf.folded:
            continue
        for j, t in enumerate(n.input):
            if not t:
                assert nf.input_formats[j] is None
                continue
            if t not in p.tensor_formats:  # a constant: read as packed into the blob, else plain
                assert same(packed.get(t, "ND"), nf.input_formats[j]), (n.name, t, nf.input_formats[j])
                continue
            got = conv.get((t, n.name), p.tensor_formats[t])
            assert same(got, nf.input_formats[j]), (n.name, t, got, nf.input_formats[j])
    for o in graph.output:
        got = conv.get((o.name, "<graph output>"), p.tensor_formats[o.name])
        assert got in plain, (o.name, got)


def test_conv_relu_conv(tmp_path):
    m = _load(tmp_path, [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
                         helper.make_node("Relu", ["a"], ["b"], name="relu"),
                         helper.make_node("Conv", ["b", "w2"], ["y"], name="c2")],
              [_vi("x", [1, 8, 6, 6])], [_vi("y", [1, 4, 4, 4])], [_w("w1", (16, 8, 3, 3)), _w("w2", (4, 16, 3, 3))])
    p = _plan(m)
    assert p.node_formats["relu"].input_formats == ["NC1HWC0"]  # followed its producer
    assert p.node_formats["c1"].input_formats == ["NC1HWC0", "FRACTAL_Z"]
    assert _pairs(p) == [("x", "NCHW", "NC1HWC0"), ("y", "NC1HWC0", "NCHW")]
    # naive: Relu in ND converts out of and back into NC1HWC0
    assert len(p.transdata_naive) == 4 and len(p.transdata) == 2
    assert {w.name: w.format for w in p.weights} == {"w1": "FRACTAL_Z", "w2": "FRACTAL_Z"}
    # bytes moved: source as stored (NCHW float32 input; NC1HWC0 float16 with C padded to 16)
    td = {t.tensor: t for t in p.transdata}
    assert td["x"].bytes == 1 * 8 * 6 * 6 * 4
    assert td["y"].bytes == formats.nbytes("NC1HWC0", (1, 4, 4, 4), np.float16) == 1 * 1 * 4 * 4 * 16 * 2
    _edge_formats_agree(p, m.graph)


def test_classic_matmul_bias_matmul_stays_in_nz(tmp_path):
    """ND<->NZ between two MatMuls whose intermediate can stay in NZ: naive converts, optimised not."""
    m = _load(tmp_path, [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
                         helper.make_node("Add", ["a", "b1"], ["ab"], name="bias"),
                         helper.make_node("Relu", ["ab"], ["r"], name="act"),
                         helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")],
              [_vi("x", [2, 32, 64])], [_vi("y", [2, 32, 48])],
              [_w("w1", (64, 96)), _w("b1", (96,)), _w("w2", (96, 48))])
    p = _plan(m)
    naive = [(t.tensor, t.src_format, t.dst_format) for t in p.transdata_naive]
    assert ("a", "FRACTAL_NZ", "ND") in naive and ("r", "ND", "FRACTAL_NZ") in naive
    assert _pairs(p) == [("x", "ND", "FRACTAL_NZ"), ("y", "FRACTAL_NZ", "ND")]
    assert p.node_formats["bias"].input_formats == ["FRACTAL_NZ", "FRACTAL_NZ"]  # bias row converted offline
    assert p.report.transdata_count < p.report.transdata_naive_count
    w = {w.name: w for w in p.weights}
    assert w["w1"].format == "FRACTAL_Z" and w["w1"].origin == "ND"   # 2-D MatMul weight (§4.5)
    # the bias row the Add reads in NZ is packed at compile time, not left plain behind an NZ slot
    b1 = w["b1"]
    assert (b1.format, b1.logical_shape, b1.onnx_shape, b1.dtype) == ("FRACTAL_NZ", (1, 1, 96), (96,), "float16")
    assert b1.nbytes == 1 * 6 * 1 * 16 * 16 * 2  # [batch 1, N1 = 96/16, M1 = 1, 16, 16] float16
    _edge_formats_agree(p, m.graph)


def test_round_trip_cancelled(tmp_path):
    """MatMul(NZ) + Add(with an ND operand) -> Reshape: propagation puts Add in NZ (ND->NZ in,
    NZ->ND out); the round-trip rule moves Add back to ND, leaving one conversion."""
    m = _load(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                         helper.make_node("Transpose", ["z"], ["t"], name="tr", perm=[0, 2, 1]),
                         helper.make_node("Add", ["a", "t"], ["s"], name="add"),
                         helper.make_node("Reshape", ["s", "shape"], ["y"], name="flat")],
              [_vi("x", [4, 16, 32]), _vi("z", [4, 32, 16])], [_vi("y", [4, 512])],
              [_w("w", (32, 32)), numpy_helper.from_array(np.array([4, 512], np.int64), "shape")])
    p = _plan(m)
    assert dict(p.passes)["cancel-round-trips"] is True
    assert p.node_formats["add"].input_formats[0] in ("ND", "NCHW")
    assert _pairs(p) == [("a", "FRACTAL_NZ", "ND"), ("x", "ND", "FRACTAL_NZ")]
    _edge_formats_agree(p, m.graph)


def test_shared_conversion_and_explain(tmp_path):
    m = _load(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                         helper.make_node("Reshape", ["a", "shape"], ["r"], name="split_heads"),
                         helper.make_node("Transpose", ["a"], ["t"], name="tr", perm=[0, 2, 1]),
                         helper.make_node("Softmax", ["a"], ["s"], name="sm", axis=1)],
              [_vi("x", [2, 16, 32])], [_vi("r", [2, 16, 4, 8]), _vi("t", [2, 32, 16]), _vi("s", [2, 16, 32])],
              [_w("w", (32, 32)), numpy_helper.from_array(np.array([2, 16, 4, 8], np.int64), "shape")])
    p = _plan(m)
    out = [t for t in p.transdata if t.tensor == "a"]
    assert len(out) == 1 and sorted(out[0].consumers) == ["sm", "split_heads", "tr"]
    assert sum(t.tensor == "a" for t in p.transdata_naive) == 3
    text = "\n".join(p.explain())
    assert "changes the last two axes (16, 32) -> (4, 8)" in text
    assert "moves the last two axes" in text
    assert "normalises over axis 1, not the last axis" in text


def test_softmax_over_last_axis_stays_nz(tmp_path):
    m = _load(tmp_path, [helper.make_node("MatMul", ["q", "k"], ["s"], name="qk"),
                         helper.make_node("Softmax", ["s"], ["p"], name="sm", axis=-1),
                         helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")],
              [_vi("q", [2, 4, 16, 8]), _vi("k", [2, 4, 8, 16]), _vi("v", [2, 4, 16, 8])], [_vi("y", [2, 4, 16, 8])])
    p = _plan(m)
    assert p.node_formats["sm"].input_formats == ["FRACTAL_NZ"]
    assert not any(t.tensor in ("s", "p") for t in p.transdata)
    assert {t.tensor for t in p.transdata} == {"q", "k", "v", "y"}


@pytest.mark.parametrize("mode,conv,soft,weight", [
    ("force_fp16", "float16", "float16", "float16"),
    ("must_keep_origin_dtype", "float32", "float32", "float32"),
    ("allow_mix_precision", "float16", "float32", "float16"),
    ("allow_fp32_to_fp16", "float16", "float32", "float16"),
])
def test_precision_modes(tmp_path, mode, conv, soft, weight):
    m = _load(tmp_path, [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                         helper.make_node("Softmax", ["c"], ["y"], name="sm", axis=1)],
              [_vi("x", [1, 3, 4, 4])], [_vi("y", [1, 8, 2, 2])], [_w("w", (8, 3, 3, 3))])
    p = _plan(m, precision_mode=mode)
    assert p.node_formats["conv"].dtype == conv and p.node_formats["sm"].dtype == soft
    assert p.weights[0].dtype == weight
    assert p.tensor_dtypes["c"] == conv and p.tensor_dtypes["x"] == "float32"  # host input stays float32
    assert p.node_formats["conv"].c0 == 16  # C0 = 16 for 2- and 4-byte types
    assert ("Softmax" in MIX_PRECISION_FP32_OPS) is True


def test_keep_dtype(tmp_path):
    m = _load(tmp_path, [helper.make_node("Relu", ["x"], ["a"], name="r1"),
                         helper.make_node("Relu", ["a"], ["y"], name="r2")],
              [_vi("x", [4])], [_vi("y", [4])])
    p = _plan(m, keep_dtype=["r2"])
    assert p.node_formats["r1"].dtype == "float16" and p.node_formats["r2"].dtype == "float32"
    p = _plan(m, keep_dtype=["OpType::Relu"])
    assert p.node_formats["r1"].dtype == "float32"
    with pytest.raises(InputError, match="--keep-dtype names node 'nope'"):
        _plan(m, keep_dtype=["nope"])
    with pytest.raises(InputError, match="unknown precision mode"):
        _plan(m, precision_mode="fp8_please")


def test_small_channel_first_conv(tmp_path):
    m = _load(tmp_path, [helper.make_node("Mul", ["x", "scale"], ["xs"], name="norm"),
                         helper.make_node("Conv", ["xs", "w1"], ["a"], name="c1"),
                         helper.make_node("Conv", ["a", "w2"], ["y"], name="c2")],
              [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 8, 4, 4])],
              [numpy_helper.from_array(np.float32([0.5]), "scale"), _w("w1", (16, 3, 3, 3)), _w("w2", (8, 16, 3, 3))])
    p = _plan(m, enable_small_channel=True)
    w = {w.name: w for w in p.weights}
    assert w["w1"].format == "FRACTAL_Z_C04" and w["w2"].format == "FRACTAL_Z"
    assert p.node_formats["c1"].input_formats[0] == "NC1HWC0_C04"
    assert not [t for t in p.transdata if t.tensor == "a"]  # C04 is read by c1, which writes NC1HWC0
    assert p.node_formats["c1"].output_formats == ["NC1HWC0"]
    p2 = _plan(m)
    assert {w.name: w.format for w in p2.weights}["w1"] == "FRACTAL_Z"


def test_depthwise_and_conv1d_weights(tmp_path):
    m = _load(tmp_path, [helper.make_node("Conv", ["x", "dw"], ["a"], name="dw", group=8, pads=[1, 1, 1, 1]),
                         helper.make_node("Reshape", ["a", "shp"], ["a3"], name="to1d"),
                         helper.make_node("Conv", ["a3", "w1d"], ["y"], name="c1d")],
              [_vi("x", [1, 8, 4, 4])], [_vi("y", [1, 4, 14])],
              [_w("dw", (8, 1, 3, 3)), numpy_helper.from_array(np.array([1, 8, 16], np.int64), "shp"),
               _w("w1d", (4, 8, 3))])
    p = _plan(m)
    w = {w.name: w for w in p.weights}
    assert w["dw"].groups == 8 and w["dw"].format == "FRACTAL_Z"
    assert w["w1d"].logical_shape == (4, 8, 1, 3) and w["w1d"].onnx_shape == (4, 8, 3)
    assert p.node_formats["c1d"].input_formats[0] == "NC1HWC0"


def test_memory_plan_is_valid(tmp_path):
    m = _load(tmp_path, [helper.make_node("Relu", ["x"], ["a"], name="r1"),
                         helper.make_node("Relu", ["a"], ["b"], name="r2"),
                         helper.make_node("Relu", ["b"], ["y"], name="r3")],
              [_vi("x", [1000])], [_vi("y", [1000])])
    p = _plan(m, precision_mode="must_keep_origin_dtype")
    mem = p.memory
    assert all(off % 256 == 0 for off in mem.offsets.values())
    # x (live -1..0) and b (1..2) can share; a chain of 4 KB tensors never needs more than 2 slots live
    assert mem.lower_bound_bytes == 2 * 4096 and mem.arena_bytes == mem.lower_bound_bytes
    assert mem.no_reuse_bytes == 4 * 4096


def test_report_serialises(tmp_path):
    m = _load(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
              [_vi("x", [16, 16])], [_vi("y", [16, 16])], [_w("w", (16, 16))])
    p = _plan(m)
    r = p.report
    back = PlanReport.load(r.to_json())
    assert back.transdata_count == r.transdata_count and back.verdict() == r.verdict()
    assert "estimated" in r.verdict()
    assert bool(r) == (r.cost["formattrans_share"] <= 0.08)
    assert r.top_conversions(1)[0]["est_us"] == max(t["est_us"] for t in r.transdata)


def test_pipeline_passes_state_contracts(tmp_path):
    from npu_deploy.converters.lowering.planner import PlanState, run_passes
    from npu_deploy.converters.lowering.support import check_support
    from npu_deploy.errors import InternalError

    for cls in PIPELINE:
        assert cls.name and cls.requires
    # the contracts are executed: a pass that moves a node its kernel fixes is caught
    loaded = _load(tmp_path, [helper.make_node("Conv", ["x", "w"], ["y"], name="c")],
                   [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 16, 6, 6])], [_w("w", (16, 3, 3, 3))])
    state = PlanState(loaded, check_support(loaded, "Ascend310P3"), precision_mode="force_fp16", keep_dtype=(),
                      enable_small_channel=False, input_format=None)
    run_passes(state, PIPELINE)
    assert state.by_name["c"].fmt == "NC1HWC0"

    class Breaks(PIPELINE[1]):
        name = "breaks"

        def run(self, state):
            state.by_name["c"].fmt = "ND"
            return True
    with pytest.raises(InternalError, match="breaks moved c"):
        run_passes(state, [Breaks])
    # the table is data: every rule kind is one the planner knows
    kinds = {"5hd", "matmul", "follow", "lastaxis", "view", "concat", "reduce", "slice", "nd"}
    assert {r.kind for r in FORMAT_RULES.values()} <= kinds


@pytest.mark.parametrize("ca,cb", [(16, 16), (24, 24), (13, 3)])
def test_concat_on_channels_stays_nc1hwc0_whatever_the_counts(tmp_path, ca, cb):
    """ConcatD runs NC1HWC0 along C for any channel counts (ATC 7.6 on an ENet block: 13 + 3)."""
    m = _load(tmp_path, [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
                         helper.make_node("Conv", ["x", "w2"], ["b"], name="c2"),
                         helper.make_node("Concat", ["a", "b"], ["cat"], name="cat", axis=1),
                         helper.make_node("Conv", ["cat", "w3"], ["y"], name="c3")],
              [_vi("x", [1, 4, 6, 6])], [_vi("y", [1, 8, 6, 6])],
              [_w("w1", (ca, 4, 1, 1)), _w("w2", (cb, 4, 1, 1)), _w("w3", (8, ca + cb, 1, 1))])
    p = _plan(m)
    assert p.node_formats["cat"].input_formats == ["NC1HWC0", "NC1HWC0"]
    assert p.node_formats["cat"].output_formats == ["NC1HWC0"]
    assert _pairs(p) == [("x", "NCHW", "NC1HWC0"), ("y", "NC1HWC0", "NCHW")]
    _edge_formats_agree(p, m.graph)


def test_enet_initial_block_plans_like_atc(tmp_path):
    """ENet's initial block: Conv (13 channels, stride 2) and MaxPool of the input (3 channels) joined
    on C, then BN + PRelu + Conv. ATC 7.6 placed only the input and output TransData."""
    bn = [numpy_helper.from_array(RNG.random(16).astype(np.float32) + 0.5, n) for n in ("g", "bb", "mu", "var")]
    m = _load(tmp_path, [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv", strides=[2, 2],
                                          pads=[1, 1, 1, 1]),
                         helper.make_node("MaxPool", ["x"], ["b"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
                         helper.make_node("Concat", ["a", "b"], ["cat"], name="cat", axis=1),
                         helper.make_node("BatchNormalization", ["cat", "g", "bb", "mu", "var"], ["n"], name="bn"),
                         helper.make_node("PRelu", ["n", "slope"], ["pr"], name="prelu"),
                         helper.make_node("Conv", ["pr", "w2"], ["y"], name="c2")],
              [_vi("x", [1, 3, 16, 16])], [_vi("y", [1, 8, 8, 8])],
              [_w("w1", (13, 3, 3, 3)), *bn, _w("slope", (16, 1, 1)), _w("w2", (8, 16, 1, 1))])
    p = _plan(m)
    assert _pairs(p) == [("x", "NCHW", "NC1HWC0"), ("y", "NC1HWC0", "NCHW")]
    assert p.node_formats["prelu"].input_formats == ["NC1HWC0", "NC1HWC0"]
    w = {w.name: w for w in p.weights}
    # the (16, 1, 1) PRelu slope is packed at compile time as a (1, 16, 1, 1) NC1HWC0 operand
    assert (w["slope"].format, w["slope"].logical_shape, w["slope"].onnx_shape) == ("NC1HWC0", (1, 16, 1, 1),
                                                                                     (16, 1, 1))
    _edge_formats_agree(p, m.graph)


def _nc1hwc0_oracle(x, c0=16):
    """NC1HWC0 by hand: pad C to a multiple of C0, split it, move C0 last (formats.md §4.1)."""
    n, c, h, w = x.shape
    c1 = -(-c // c0)
    pad = np.zeros((n, c1 * c0, h, w), x.dtype)
    pad[:, :c] = x
    return pad.reshape(n, c1, c0, h, w).transpose(0, 1, 3, 4, 2)


def test_constant_inputs_are_packed_at_compile_time(tmp_path):
    """A Concat constant and a (1, C, 1, 1) Mul operand: stored in NC1HWC0 in the weight blob, no
    runtime TransData (the old planner refused the Concat: "a constant input would need its own
    conversion", and read the Mul operand as NC1HWC0 while storing it plain)."""
    from npu_deploy.converters.files.bundle import read_bundle
    from npu_deploy.converters.files.bundle import write_plan_bundle

    const = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    scale = RNG.standard_normal((1, 16, 1, 1)).astype(np.float32)
    m = _load(tmp_path, [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
                         helper.make_node("Concat", ["a", "k"], ["cat"], name="cat", axis=1),
                         helper.make_node("Mul", ["cat", "s"], ["ms"], name="scale"),
                         helper.make_node("Conv", ["ms", "w3"], ["y"], name="c3")],
              [_vi("x", [1, 4, 6, 6])], [_vi("y", [1, 8, 6, 6])],
              [_w("w1", (13, 4, 1, 1)), numpy_helper.from_array(const, "k"), numpy_helper.from_array(scale, "s"),
               _w("w3", (8, 16, 1, 1))])
    p = _plan(m)
    assert _pairs(p) == [("x", "NCHW", "NC1HWC0"), ("y", "NC1HWC0", "NCHW")]
    assert p.node_formats["cat"].input_formats == ["NC1HWC0", "NC1HWC0"]
    assert p.node_formats["scale"].input_formats == ["NC1HWC0", "NC1HWC0"]
    w = {w.name: w for w in p.weights}
    assert w["k"].format == w["s"].format == "NC1HWC0" and w["k"].dtype == "float16"
    path = tmp_path / "m.bundle"
    write_plan_bundle(path, m, p)
    with read_bundle(path) as b:
        for name, arr in (("k", const), ("s", scale)):
            stored = np.asarray(b.packed(name)).reshape(_nc1hwc0_oracle(arr).shape)
            np.testing.assert_array_equal(stored, _nc1hwc0_oracle(arr.astype(np.float16)))
    _edge_formats_agree(p, m.graph)


def test_nz_concat_on_an_unaligned_last_axis_still_converts(tmp_path):
    """FRACTAL_NZ along N with 24-wide halves would straddle 16-column fractals: ND, and said why."""
    m = _load(tmp_path, [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
                         helper.make_node("MatMul", ["x", "w2"], ["b"], name="mm2"),
                         helper.make_node("Concat", ["a", "b"], ["cat"], name="cat", axis=-1),
                         helper.make_node("MatMul", ["cat", "w3"], ["y"], name="mm3")],
              [_vi("x", [32, 32])], [_vi("y", [32, 16])],
              [_w("w1", (32, 24)), _w("w2", (32, 24)), _w("w3", (48, 16))])
    p = _plan(m)
    assert p.node_formats["cat"].input_formats == ["ND", "ND"]
    assert "input sizes [24, 24] are not all multiples of 16" in "\n".join(p.explain())
    _edge_formats_agree(p, m.graph)


# ------------------------------------------------------------------------------------------------
# Property: random op chains keep every planner guarantee
# ------------------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

OPS = ["conv", "relu", "add_prev", "concat_prev", "matmul_rows", "transpose_hw", "softmax_last", "softmax_c",
       "mul_scalar", "sigmoid_mul"]


def _chain(ops, c0_channels):
    """Build a shape-consistent graph on [1, C, 4, 4] from a list of op names."""
    nodes, inits = [], []
    cur, c = "x", c0_channels
    history = [("x", c)]
    for k, op in enumerate(ops):
        out = f"t{k}"
        if op == "conv":
            c2 = [8, 16, 24][k % 3]
            inits.append(_w(f"w{k}", (c2, c, 1, 1)))
            nodes.append(helper.make_node("Conv", [cur, f"w{k}"], [out], name=f"n{k}"))
            c = c2
        elif op == "relu":
            nodes.append(helper.make_node("Relu", [cur], [out], name=f"n{k}"))
        elif op == "add_prev":
            prev = next((t for t, cc in reversed(history[:-1]) if cc == c), cur)
            nodes.append(helper.make_node("Add", [cur, prev], [out], name=f"n{k}"))
        elif op == "concat_prev":
            prev, pc = history[-2] if len(history) > 1 else history[-1]
            nodes.append(helper.make_node("Concat", [cur, prev], [out], name=f"n{k}", axis=1))
            c = c + pc
        elif op == "matmul_rows":
            inits.append(_w(f"m{k}", (4, 4)))
            nodes.append(helper.make_node("MatMul", [cur, f"m{k}"], [out], name=f"n{k}"))
        elif op == "transpose_hw":
            nodes.append(helper.make_node("Transpose", [cur], [out], name=f"n{k}", perm=[0, 1, 3, 2]))
        elif op == "softmax_last":
            nodes.append(helper.make_node("Softmax", [cur], [out], name=f"n{k}", axis=-1))
        elif op == "softmax_c":
            nodes.append(helper.make_node("Softmax", [cur], [out], name=f"n{k}", axis=1))
        elif op == "mul_scalar":
            inits.append(numpy_helper.from_array(np.float32([0.5]), f"s{k}"))
            nodes.append(helper.make_node("Mul", [cur, f"s{k}"], [out], name=f"n{k}"))
        elif op == "sigmoid_mul":
            nodes.append(helper.make_node("Sigmoid", [cur], [out + "s"], name=f"n{k}s"))
            nodes.append(helper.make_node("Mul", [cur, out + "s"], [out], name=f"n{k}"))
        cur = out
        history.append((cur, c))
    return nodes, inits, cur, c


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=9), channels=st.sampled_from([3, 16]),
       mode=st.sampled_from(["force_fp16", "must_keep_origin_dtype"]))
def test_random_chains_keep_the_guarantees(tmp_path, ops, channels, mode):
    nodes, inits, out, c = _chain(ops, channels)
    m = _load(tmp_path, nodes, [_vi("x", [1, channels, 4, 4])], [_vi(out, [1, c, 4, 4])], inits)
    p = _plan(m, precision_mode=mode)  # verify_plan runs inside: raises InternalError on a broken guarantee
    _edge_formats_agree(p, m.graph)
    assert set(p.node_formats) == {n.name for n in m.graph.node}
    assert p.report.transdata_count <= p.report.transdata_naive_count
    for t in p.transdata:
        assert t.src_format != t.dst_format and t.bytes > 0


def test_allow_fp32_to_fp16_casts_fp16_only_kernels(tmp_path):
    # MaxPoolV3's 310P op-info is float16 only: allow_fp32_to_fp16 runs it in float16, Relu stays float32
    m = _load(tmp_path, [helper.make_node("MaxPool", ["x"], ["a"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
                         helper.make_node("Relu", ["a"], ["y"], name="relu")],
              [_vi("x", [1, 4, 8, 8])], [_vi("y", [1, 4, 4, 4])])
    p = _plan(m, precision_mode="allow_fp32_to_fp16")
    assert p.node_formats["pool"].dtype == "float16" and p.node_formats["relu"].dtype == "float32"
    assert p.node_formats["pool"].engine == "AI Core"


def _attention(tmp_path, softmax_axis, mask_shape=(1, 1, 1, 16)):
    """MatMul -> Div -> Add(mask) -> Softmax -> MatMul; the mask is an activation (computed from an
    input, as in BERT-style models), broadcast over heads and query rows."""
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"], name="qk"),
             helper.make_node("Div", ["s", "scale"], ["d"], name="div"),
             helper.make_node("Mul", ["m", "neg"], ["mask"], name="mask_mul"),
             helper.make_node("Add", ["d", "mask"], ["a"], name="add"),
             helper.make_node("Softmax", ["a"], ["p"], name="sm", axis=softmax_axis),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="pv")]
    inits = [numpy_helper.from_array(np.float32([8.0]), "scale"), numpy_helper.from_array(np.float32([-1e4]), "neg")]
    return _load(tmp_path, nodes, [_vi("q", [1, 4, 16, 32]), _vi("k", [1, 4, 32, 16]), _vi("v", [1, 4, 16, 32]),
                                   _vi("m", list(mask_shape))], [_vi("y", [1, 4, 16, 32])], inits)


def test_attention_mask_add_and_softmax_stay_nz(tmp_path):
    m = _attention(tmp_path, -1)
    p = _plan(m)
    assert p.node_formats["add"].input_formats == ["FRACTAL_NZ", "FRACTAL_NZ"]
    assert p.node_formats["sm"].input_formats == ["FRACTAL_NZ"]
    # no NZ -> ND -> NZ round trip around Add + Softmax: only the small mask is converted
    assert not any(t.tensor in ("d", "a", "p") for t in p.transdata)
    mask_td = [t for t in p.transdata if t.tensor == "mask"]
    assert [(t.src_format, t.dst_format) for t in mask_td] == [("NCHW", "FRACTAL_NZ")]
    assert mask_td[0].bytes == 16 * 2  # one float16 row
    assert p.report.transdata_count <= p.report.transdata_naive_count
    _edge_formats_agree(p, m.model.graph)
    assert "FRACTAL_NZ kernel for axis = last" in FORMAT_RULES["Softmax"].note


def test_attention_softmax_over_another_axis_keeps_nd(tmp_path):
    m = _attention(tmp_path, 1)
    p = _plan(m)
    assert p.node_formats["sm"].input_formats == ["NCHW"]
    # Add went back to ND with Softmax: converting the mask as well would not pay
    assert p.node_formats["add"].input_formats[0] == "NCHW"
    assert not any(t.tensor == "mask" for t in p.transdata)
    text = "\n".join(p.explain())
    assert "normalises over axis 1, not the last axis" in text
    assert p.report.transdata_count <= p.report.transdata_naive_count
    _edge_formats_agree(p, m.model.graph)


def test_column_broadcast_operand_keeps_nd_and_says_why(tmp_path):
    # a (M, 1) column broadcasts along the last (N) axis: NZ cannot hold it
    m = _attention(tmp_path, -1, mask_shape=(1, 1, 16, 1))
    p = _plan(m)
    assert p.node_formats["add"].input_formats[0] == "NCHW"
    text = "\n".join(p.explain())
    assert "broadcasts along the last axis" in text and "(M, N), (1, N) or scalar" in text
    _edge_formats_agree(p, m.model.graph)


@pytest.mark.slow
def test_minilm_attention_runs_in_nz(real_model):
    m = load_model(real_model("minilm"), input_shapes={"input_ids": (1, 128), "attention_mask": (1, 128)})
    p = _plan(m)
    # 32 before Add(mask) + Softmax could run in FRACTAL_NZ (NZ->ND->NZ around them in each of 3 layers)
    assert p.report.transdata_count < 32
    assert p.report.transdata_count <= p.report.transdata_naive_count
    for layer in range(3):
        prefix = f"/model/model.0/auto_model/encoder/layer.{layer}/attention/self/"
        assert p.node_formats[prefix + "Softmax"].input_formats == ["FRACTAL_NZ"]
        assert not any(t.producer in (prefix + "Div", prefix + "Softmax") for t in p.transdata)
    _edge_formats_agree(p, m.model.graph)


# ------------------------------------------------------------------------------------------------
# Attention head split/merge, K^T: pairs that FRACTAL_NZ holds as they are
# ------------------------------------------------------------------------------------------------

def _heads(tmp_path, heads, head_dim, seq=32):
    """BERT-style self-attention on [1, S, H*D]: three projections, head split (Reshape + Transpose),
    K^T (Transpose 0,2,3,1), scores, Softmax, context, head merge (Transpose + Reshape), output
    projection."""
    hd = heads * head_dim
    split = numpy_helper.from_array(np.array([1, seq, heads, head_dim], np.int64), "split")
    merge = numpy_helper.from_array(np.array([1, seq, hd], np.int64), "merge")
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
             helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
             helper.make_node("Reshape", ["q", "split"], ["q4"], name="q_split"),
             helper.make_node("Transpose", ["q4"], ["qh"], name="q_heads", perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["k", "split"], ["k4"], name="k_split"),
             helper.make_node("Transpose", ["k4"], ["kt"], name="k_t", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["v", "split"], ["v4"], name="v_split"),
             helper.make_node("Transpose", ["v4"], ["vh"], name="v_heads", perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["qh", "kt"], ["s"], name="scores"),
             helper.make_node("Softmax", ["s"], ["p"], name="sm", axis=-1),
             helper.make_node("MatMul", ["p", "vh"], ["c"], name="ctx"),
             helper.make_node("Transpose", ["c"], ["c4"], name="merge_t", perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["c4", "merge"], ["c3"], name="merge_r"),
             helper.make_node("MatMul", ["c3", "wo"], ["y"], name="out")]
    inits = [_w("wq", (hd, hd)), _w("wk", (hd, hd)), _w("wv", (hd, hd)), _w("wo", (hd, hd)), split, merge]
    return _load(tmp_path, nodes, [_vi("x", [1, seq, hd])], [_vi("y", [1, seq, hd])], inits)


def test_head_split_merge_and_kt_stay_nz_when_head_size_is_a_multiple_of_16(tmp_path):
    m = _heads(tmp_path, heads=4, head_dim=32)
    p = _plan(m)
    # only the graph input and output convert: no NZ -> ND -> NZ around the head reshapes
    assert _pairs(p) == [("x", "ND", "FRACTAL_NZ"), ("y", "FRACTAL_NZ", "ND")]
    for n in ("q_split", "q_heads", "k_split", "k_t", "v_split", "v_heads", "merge_t", "merge_r"):
        assert p.node_formats[n].input_formats[0] == "FRACTAL_NZ" and p.node_formats[n].output_formats == [
            "FRACTAL_NZ"], n
    # the head split is the same bytes in NZ (why ATC fuses it for free), checked with a hand-made oracle
    x = RNG.standard_normal((1, 32, 128)).astype(np.float16)

    def nz(a):  # [..., M, N] -> [..., N1, M1, 16, 16], both padded to 16 (formats.md §4.10)
        *b, mm, nn = a.shape
        pad = np.zeros((*b, -(-mm // 16) * 16, -(-nn // 16) * 16), a.dtype)
        pad[..., :mm, :nn] = a
        r = pad.reshape(*b, pad.shape[-2] // 16, 16, pad.shape[-1] // 16, 16)
        return np.moveaxis(r, -2, -4)

    assert nz(x.reshape(1, 32, 4, 32).transpose(0, 2, 1, 3)).tobytes() == nz(x).tobytes()
    diff = "\n".join(p.report.atc_differences)
    assert "ConfusionTransposeD" in diff and "adj_x2" in diff and "k_split + k_t" in diff
    _edge_formats_agree(p, m.graph)


def test_head_size_not_a_multiple_of_16_converts_and_says_why(tmp_path):
    m = _heads(tmp_path, heads=8, head_dim=15, seq=20)  # PP-OCRv4 rec's attention: 120 = 8 x 15
    p = _plan(m)
    assert p.node_formats["q_heads"].input_formats == ["NCHW"]  # a plain 4-D tensor
    assert len(p.transdata) > 2
    assert "head size 15 is not a multiple of 16" in "\n".join(p.explain())
    _edge_formats_agree(p, m.graph)


def test_a_lone_transpose_of_the_blocked_axes_is_not_a_pair(tmp_path):
    """Transpose(0,2,1,3) of a MatMul result, read by another MatMul, with no head Reshape: it moves
    the NZ axes for real, so it runs in ND (two conversions), and --explain says it is not a pair."""
    m = _load(tmp_path, [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
                         helper.make_node("Transpose", ["a"], ["t"], name="tr", perm=[0, 2, 1, 3]),
                         helper.make_node("MatMul", ["t", "w2"], ["y"], name="mm2")],
              [_vi("x", [1, 4, 32, 32])], [_vi("y", [1, 32, 4, 32])], [_w("w1", (32, 32)), _w("w2", (32, 32))])
    p = _plan(m)
    assert p.node_formats["tr"].input_formats == ["NCHW"]
    assert "not half of an attention head split/merge" in "\n".join(p.explain())
    _edge_formats_agree(p, m.graph)


def test_spatial_reduce_stays_nc1hwc0_channel_reduce_does_not(tmp_path):
    """Squeeze-and-excitation: ReduceMean over H, W (keepdims) runs in NC1HWC0 between convolutions;
    a ReduceMean over C would need C whole, so it runs in ND."""
    def se(axes):
        return _load(tmp_path, [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
                                helper.make_node("ReduceMean", ["a"], ["m"], name="mean", axes=axes, keepdims=1),
                                helper.make_node("Conv", ["m", "w2"], ["s"], name="c2"),
                                helper.make_node("Sigmoid", ["s"], ["g"], name="gate"),
                                helper.make_node("Mul", ["a", "g"], ["y"], name="scale")],
                     [_vi("x", [1, 16, 8, 8])], [_vi("y", [1, 16, 8, 8])],
                     [_w("w1", (16, 16, 1, 1)), _w("w2", (16, 16 if axes != [1] else 1, 1, 1))], opset=17)
    m = se([2, 3])
    p = _plan(m)
    assert p.node_formats["mean"].input_formats == ["NC1HWC0"]
    assert _pairs(p) == [("x", "NCHW", "NC1HWC0"), ("y", "NC1HWC0", "NCHW")]
    _edge_formats_agree(p, m.graph)
    m = se([1])
    p = _plan(m)
    assert p.node_formats["mean"].input_formats == ["NCHW"]
    assert "not only the spatial axes" in "\n".join(p.explain())
    _edge_formats_agree(p, m.graph)


# ------------------------------------------------------------------------------------------------
# If / Loop bodies
# ------------------------------------------------------------------------------------------------

def _if_model(tmp_path):
    """a = Conv(x) at the top (NC1HWC0); If(cond): then Conv -> Relu -> Conv on the outer `a`, else
    Sigmoid(a); the result feeds a top-level Conv."""
    then_g = helper.make_graph([helper.make_node("Conv", ["a", "wt1"], ["t1"], name="t_conv1"),
                                helper.make_node("Relu", ["t1"], ["t2"], name="t_relu"),
                                helper.make_node("Conv", ["t2", "wt2"], ["t_out"], name="t_conv2")], "then", [],
                               [_vi("t_out", [1, 8, 6, 6])], [_w("wt1", (8, 8, 1, 1)), _w("wt2", (8, 8, 1, 1))])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["a"], ["e_out"], name="e_sig")], "else", [],
                               [_vi("e_out", [1, 8, 6, 6])])
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="c0"),
             helper.make_node("If", ["cond"], ["b"], name="branch", then_branch=then_g, else_branch=else_g),
             helper.make_node("Conv", ["b", "w1"], ["y"], name="c1")]
    return _load(tmp_path, nodes, [_vi("x", [1, 4, 6, 6]), _vi("cond", [], TensorProto.BOOL)],
                 [_vi("y", [1, 8, 6, 6])], [_w("w0", (8, 4, 1, 1)), _w("w1", (8, 8, 1, 1))])


def test_if_branches_are_planned_with_plain_boundaries(tmp_path):
    m = _if_model(tmp_path)
    p = _plan(m)
    nf = p.node_formats
    # each branch is planned: its Conv chain runs in NC1HWC0, under the node's own name
    assert nf["t_conv1"].input_formats[0] == "NC1HWC0" and nf["t_relu"].input_formats == ["NC1HWC0"]
    assert nf["e_sig"].op_type == "Sigmoid"
    # the outer tensor `a` (stored NC1HWC0 by c0) enters the bodies as stored: the then branch's Conv
    # reads it with no conversion, the else branch's Sigmoid follows it; only the results go back to ND
    assert not any(t.tensor == "a" for t in p.transdata)
    assert nf["e_sig"].input_formats == ["NC1HWC0"]
    inner = {(t.tensor, t.src_format, t.dst_format, tuple(t.consumers)) for t in p.transdata}
    assert ("t_out", "NC1HWC0", "NCHW", ("<graph output>",)) in inner
    assert ("e_out", "NC1HWC0", "NCHW", ("<graph output>",)) in inner
    assert len({t.name for t in p.transdata}) == len(p.transdata)
    assert p.tensor_formats["t2"] == "NC1HWC0" and p.tensor_formats["a"] == "NC1HWC0"
    assert p.report.nodes == 3 + 3 + 1
    assert any("bodies planned" in n for n in p.report.notes)
    # every body slot reads what arrives: the body's tensors, or (outer / body inputs) plain
    conv = {(t.tensor, c): t.dst_format for t in p.transdata for c in t.consumers}
    for g in (m.graph.node[1].attribute[0].g, m.graph.node[1].attribute[1].g):
        for n in g.node:
            for j, t in enumerate(n.input):
                if t in p.tensor_formats:
                    stored = p.tensor_formats[t]
                else:
                    stored = "ND"  # a body constant, read as it is
                got = conv.get((t, n.name), stored)
                assert got == nf[n.name].input_formats[j] or {got, nf[n.name].input_formats[j]} <= {"ND", "NCHW"}


def test_loop_body_is_planned(tmp_path):
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"], name="l_cond"),
                              helper.make_node("Conv", ["v_in", "wl"], ["c"], name="l_conv"),
                              helper.make_node("Relu", ["c"], ["v_out"], name="l_relu")], "body",
                             [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL),
                              _vi("v_in", [1, 8, 4, 4])],
                             [_vi("cond_out", [], TensorProto.BOOL), _vi("v_out", [1, 8, 4, 4])],
                             [_w("wl", (8, 8, 1, 1))])
    trip = numpy_helper.from_array(np.array(3, np.int64), "trip")
    keep = numpy_helper.from_array(np.array(True), "keep")
    m = _load(tmp_path, [helper.make_node("Loop", ["trip", "keep", "x"], ["y"], name="loop", body=body)],
              [_vi("x", [1, 8, 4, 4])], [_vi("y", [1, 8, 4, 4])], [trip, keep])
    p = _plan(m)
    assert p.node_formats["l_conv"].input_formats[0] == "NC1HWC0"
    assert p.node_formats["l_relu"].output_formats == ["NC1HWC0"]
    pairs = {(t.tensor, t.src_format, t.dst_format) for t in p.transdata}
    assert ("v_in", "NCHW", "NC1HWC0") in pairs and ("v_out", "NC1HWC0", "NCHW") in pairs
    assert p.report.cost is not None and p.report.cost["total_us"] > 0


def test_verify_plan_checks_every_slot_literally(tmp_path):
    """verify_plan is the contract the plan-executing emulator relies on: it must reject a dropped
    TransData, a slot whose recorded format is not what arrives, a constant read in a format it is
    not packed in, and an output recorded in another format than it is stored in."""
    import copy

    from npu_deploy.converters.lowering import planner as P
    from npu_deploy.converters.lowering.support import check_support
    from npu_deploy.errors import InternalError

    scale = numpy_helper.from_array(RNG.standard_normal((1, 8, 1, 1)).astype(np.float32), "s")
    m = _load(tmp_path, [helper.make_node("Conv", ["x", "w"], ["a"], name="c"),
                         helper.make_node("Mul", ["a", "s"], ["b"], name="mul"),
                         helper.make_node("Reshape", ["b", "shape"], ["y"], name="flat")],
              [_vi("x", [1, 4, 4, 4])], [_vi("y", [1, 128])],
              [_w("w", (8, 4, 1, 1)), scale, numpy_helper.from_array(np.array([1, 128], np.int64), "shape")])
    state = P.PlanState(m, check_support(m, "Ascend310P3"), precision_mode="force_fp16", keep_dtype=(),
                        enable_small_channel=False, input_format=None)
    P._assign_dtypes(state)
    for cls in P.PIPELINE:
        cls().run(state)
    td = P.insert_transdata(state)
    weights = P._plan_weights(state)
    nf = P._node_formats(state, weights)
    P.verify_plan(state, td, nf, weights)  # the real plan holds
    assert {w.name for w in weights} == {"w", "s"} and len(td) == 2
    with pytest.raises(InternalError, match="gets NC1HWC0 but needs ND"):
        P.verify_plan(state, [t for t in td if t.tensor != "b"], nf, weights)  # b NC1HWC0 -> ND dropped
    wrong = copy.deepcopy(nf)
    wrong["mul"].input_formats[0] = "ND"
    with pytest.raises(InternalError, match="mul reads input 0"):
        P.verify_plan(state, td, wrong, weights)
    with pytest.raises(InternalError, match=r"mul reads input 1 \(s\) as NC1HWC0, but it arrives as ND"):
        P.verify_plan(state, td, nf, [w for w in weights if w.name != "s"])
    wrong = copy.deepcopy(nf)
    wrong["c"].output_formats[0] = "NCHW"
    with pytest.raises(InternalError, match="c writes output 0"):
        P.verify_plan(state, td, wrong, weights)


@pytest.mark.parametrize("axis,stays", [(2, True), (3, True), (1, False)])
def test_slice_stays_in_nc1hwc0_unless_it_cuts_channels(tmp_path, axis, stays):
    """Conv -> Slice -> Conv: a Slice of H or W keeps NC1HWC0 (StridedSliceD on 5HD); a Slice of C
    needs the plain layout (C is split into C1 x C0). Checked by executing the plan against onnxruntime."""
    import npu_deploy
    from npu_deploy.runtime.check.compare import compare

    rng = np.random.default_rng(2)
    w1 = numpy_helper.from_array(rng.standard_normal((32, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 32 if axis != 1 else 16, 3, 3)).astype(np.float32), "w2")
    cs = [numpy_helper.from_array(np.array(v, np.int64), n) for v, n in
          (([0], "st"), ([16 if axis == 1 else 4], "en"), ([axis], "ax"))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Slice", ["c1", "st", "en", "ax"], ["s"], name="slice"),
             helper.make_node("Conv", ["s", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, w2] + cs)
    path = tmp_path / "s.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    p = plan(load_model(path), soc="Ascend310P3", precision_mode="must_keep_origin_dtype")
    around = [t for t in p.transdata if t.tensor in ("c1", "s")]
    assert (not around) == stays, [(t.tensor, t.src_format, t.dst_format) for t in around]
    assert p.node_formats["slice"].output_formats == (["NC1HWC0"] if stays else ["NCHW"])
    out = tmp_path / "s.bundle"
    npu_deploy.convert(str(path), output=str(out), backend="builtin", precision_mode="must_keep_origin_dtype")
    assert compare(path, out)


# ---------------------------------------------------------------------------------------------------
# per-SoC rules from FE (docs/ge-rules.md): MatMul heavy or not, the fix-pipe's ND columns

def _matmul_chain(tmp_path, m=32, k=64, n=48):
    """x [m, k] -> MatMul W1 [k, k] -> Relu -> MatMul W2 [k, n] -> y: ND at both ends."""
    return _load(tmp_path,
                 [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
                  helper.make_node("Relu", ["a"], ["r"], name="relu"),
                  helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")],
                 [_vi("x", [m, k])], [_vi("y", [m, n])], [_w("w1", (k, k)), _w("w2", (k, n))])


def test_aligned_matmul_chain_nd_on_910b_nz_on_310p3(tmp_path):
    loaded = _matmul_chain(tmp_path)
    p310 = _plan(loaded, soc="Ascend310P3")
    assert _pairs(p310) == [("x", "ND", "FRACTAL_NZ"), ("y", "FRACTAL_NZ", "ND")]
    assert p310.node_formats["mm1"].input_formats[0] == "FRACTAL_NZ"
    assert all("heavy op on Ascend310P" in t.reason for t in p310.transdata), [t.reason for t in p310.transdata]
    for soc in ("Ascend910B", "Ascend910B3", "Ascend910_9391"):
        p = _plan(loaded, soc=soc)
        assert p.transdata == [], soc
        assert p.node_formats["mm1"].input_formats[0] == "ND"
        assert p.tensor_formats["a"] == "ND" and p.tensor_formats["r"] == "ND"
    # 310B has the fix-pipe but its MatMuls are heavy ops: the format mode keeps them in NZ
    assert len(_plan(loaded, soc="Ascend310B4").transdata) == 2


def test_soc_family_and_list():
    from npu_deploy.cli.options import SOCS as CLI_SOCS
    from npu_deploy.converters.lowering import ops

    assert tuple(CLI_SOCS) == ops.SOCS
    assert [ops.soc_family(s) for s in ("Ascend910B4", "Ascend910", "Ascend910_9362", "Ascend310B1", "Ascend310")] \
        == ["Ascend910B", "Ascend910", "Ascend910_93", "Ascend310B", "Ascend310"]
    assert ops.soc_family("Ascend950") is None
    assert all(ops.soc_family(s) in ops.SOC_TRAITS for s in ops.SOCS)


# ---------------------------------------------------------------------------------------------------
# C0 = 8 for float32 cube operands on 910B (cube high precision; real torch_npu captures on Atlas A2)

def _alexnet_conv1(tmp_path, n=32):
    """The first AlexNet conv of the 910B captures: x [32,3,224,224] float32, w [64,3,11,11]."""
    return _load(tmp_path,
                 [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", strides=[4, 4], pads=[2, 2, 2, 2]),
                  helper.make_node("Relu", ["c"], ["r"], name="relu")],
                 [_vi("x", [n, 3, 224, 224])], [_vi("r", [n, 64, 55, 55])], [_w("w", (64, 3, 11, 11))])


def test_fp32_conv_on_910b_stores_c0_8(tmp_path):
    loaded = _alexnet_conv1(tmp_path)
    p = _plan(loaded, soc="Ascend910B", precision_mode="must_keep_origin_dtype")
    td = next(t for t in p.transdata if t.tensor == "x")
    # the capture: TransData NCHW 32x3x224x224 -> NC1HWC0 wrote 32x1x224x224x8 float32
    assert td.dst_bytes == 32 * 1 * 224 * 224 * 8 * 4 == 51_380_224 and td.to_manifest()["c0"] == 8
    w = next(w for w in p.weights if w.name == "w")
    assert (w.format, w.c0, w.nbytes) == ("FRACTAL_Z", 8, 121 * 4 * 16 * 8 * 4)   # capture: 121x4x16x8
    assert p.node_formats["conv"].c0 == 8
    assert p.tensors["c"].storage_shape == (32, 8, 55, 55, 8)
    # FE does not propagate NC1HWC0 from a float32 cube op under cube high precision: the Relu stays in
    # NCHW (as in the capture: Conv2D1 -> TransData NC1HWC0 32x8x55x55x8 -> NCHW -> Relu)
    assert p.node_formats["relu"].input_formats == ["NCHW"]
    out = next(t for t in p.transdata if t.tensor == "c")
    assert (out.src_format, out.dst_format, out.c0, out.bytes) == ("NC1HWC0", "NCHW", 8, 32 * 8 * 55 * 55 * 8 * 4)
    assert "FE does not propagate" in out.reason and "C0 = 8" in out.reason
    # the same model elsewhere, or in float16: C0 = 16
    for soc, mode in (("Ascend310P3", "must_keep_origin_dtype"), ("Ascend910B", "force_fp16")):
        q = _plan(loaded, soc=soc, precision_mode=mode)
        assert q.node_formats["conv"].c0 == 16 and all(w.c0 == 16 for w in q.weights)
        assert "c0" not in next(t for t in q.transdata if t.tensor == "x").to_manifest()


def test_fp32_conv_on_910b_emulator_matches_onnxruntime(tmp_path, run_cli):
    loaded = _alexnet_conv1(tmp_path, n=2)
    bundle = tmp_path / "m.bundle"
    code, _, err = run_cli("convert", loaded.path, "--backend", "builtin", "--soc", "Ascend910B",
                           "--precision-mode", "must_keep_origin_dtype", "-o", bundle)
    assert code == 0, err
    code, out, err = run_cli("compare", loaded.path, bundle)
    assert code == 0 and "PASS" in out, out + err


def test_small_channel_needs_a_spatial_kernel(tmp_path):
    """Conv2D's op_select_format adds FRACTAL_Z_C04 only for kh, kw > 1: a 1x1 first conv stays FRACTAL_Z."""
    m = _load(tmp_path, [helper.make_node("Conv", ["x", "w1"], ["y"], name="c1")],
              [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 16, 8, 8])], [_w("w1", (16, 3, 1, 1))])
    p = _plan(m, enable_small_channel=True)
    assert {w.name: w.format for w in p.weights}["w1"] == "FRACTAL_Z"
    assert p.node_formats["c1"].input_formats[0] == "NC1HWC0"
