"""Planner on small graphs built for one behaviour each: formats, TransData, cancellation, precision."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters import formats
from npu_deploy.converters.onnx_model import load_model
from npu_deploy.converters.planner import (FORMAT_RULES, MIX_PRECISION_FP32_OPS, PIPELINE, PlanReport,
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
    for n in graph.node:
        nf = p.node_formats[n.name]
        if nf.folded:
            continue
        for j, t in enumerate(n.input):
            if t not in p.tensor_formats:  # constants and empty inputs
                continue
            if nf.input_formats[j] is None:
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
    assert "b1" not in w  # only Conv/MatMul weights are pre-packed
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


def test_pipeline_passes_state_contracts():
    for cls in PIPELINE:
        assert cls.requires and cls.guarantees and cls.name
    # the table is data: every rule kind is one the planner knows
    assert {r.kind for r in FORMAT_RULES.values()} <= {"5hd", "matmul", "follow", "lastaxis", "view", "concat", "nd"}


@pytest.mark.parametrize("channels,stays", [(16, True), (24, False)])
def test_concat_on_channels(tmp_path, channels, stays):
    """Concat along C keeps NC1HWC0 only when every joined C is a multiple of C0 (16)."""
    m = _load(tmp_path, [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
                         helper.make_node("Conv", ["x", "w2"], ["b"], name="c2"),
                         helper.make_node("Concat", ["a", "b"], ["cat"], name="cat", axis=1),
                         helper.make_node("Conv", ["cat", "w3"], ["y"], name="c3")],
              [_vi("x", [1, 4, 6, 6])], [_vi("y", [1, 8, 6, 6])],
              [_w("w1", (channels, 4, 1, 1)), _w("w2", (channels, 4, 1, 1)), _w("w3", (8, 2 * channels, 1, 1))])
    p = _plan(m)
    tensors = {t.tensor for t in p.transdata}
    if stays:
        assert p.node_formats["cat"].input_formats == ["NC1HWC0", "NC1HWC0"] and tensors == {"x", "y"}
    else:
        assert {"a", "b", "cat"} <= tensors
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
