"""The float32 C0 8 <-> 16 boundary on cube-high-precision SoCs (Ascend910B / 910_93).

FE stores a float32 cube op's (Conv2D, MatMul, AvgPool) tensors with C0 = 8 and every other op's with
C0 = 16; C0 sits in the format word, and two NC1HWC0 tensors with different C0 also differ in shape, so FE
converts through the origin format NCHW (two TransData) and its merging keeps the pair (docs/ge-rules.md
R7). Expected values come from the real Ascend910B capture (``../shared/data/timings_910B``: the storage
shapes the device wrote) and from the format formulas, not from the planner."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.files.onnx_model import load_model
from npu_deploy.converters.lowering import plan_passes
from npu_deploy.converters.lowering.plan_state import PlanState
from npu_deploy.converters.lowering.planner import plan
from npu_deploy.converters.lowering.support import check_support
from npu_deploy.errors import InternalError, ModelError
from npu_deploy.runtime.check.compare import compare
from npu_deploy.runtime.emulator import EmulatorBackend
from tests.conftest import SHARED_DATA

RNG = np.random.default_rng(7)
KEEP = dict(soc="Ascend910B", precision_mode="must_keep_origin_dtype")
CAPTURE = SHARED_DATA / "timings_910B" / "cnn_level1_rank1_ascend_pt"


def _w(name, shape, scale=0.1):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _bn(name, x, y, c):
    inits = [numpy_helper.from_array(RNG.uniform(0.5, 1.5, c).astype(np.float32), f"{name}_s"),
             numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), f"{name}_b"),
             numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), f"{name}_m"),
             numpy_helper.from_array(RNG.uniform(0.5, 1.5, c).astype(np.float32), f"{name}_v")]
    node = helper.make_node("BatchNormalization", [x, f"{name}_s", f"{name}_b", f"{name}_m", f"{name}_v"], [y],
                            name=name)
    return node, inits


def _loaded(tmp_path, g, name="m"):
    """The graph ``g`` saved as an opset-17 model and loaded as convert loads it."""
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return load_model(path)


def _conv_bn_conv(tmp_path, n=32, c=64, hw=55):
    """Conv (cube, C0 8) -> BatchNormalization (BNInferenceD: NC1HWC0 only, a vector op, C0 16) -> Conv,
    at the shapes of the capture's first conv output (32x64x55x55 float32)."""
    bn, inits = _bn("bn", "c1", "b", c)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             bn,
             helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2", kernel_shape=[1, 1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 16, hw, hw])],
                          [_w("w1", (c, 3, 3, 3)), _w("w2", (16, c, 1, 1))] + inits)
    return _loaded(tmp_path, g, "cbc")


def _storage(td):
    """(src format, src storage shape, dst format, dst storage shape) of a planned TransData, from the
    format formulas: NC1HWC0 is [N, ceil(C / C0), H, W, C0]."""
    n, c, h, w = td.shape
    c0_src = td.c0 if td.src_format == "NC1HWC0" and td.c0 else 16
    c0_dst = td.c0 if td.dst_format == "NC1HWC0" and td.c0 else 16

    def one(fmt, c0):
        return (n, -(-c // c0), h, w, c0) if fmt == "NC1HWC0" else (n, c, h, w)
    return td.src_format, one(td.src_format, c0_src), td.dst_format, one(td.dst_format, c0_dst)


def test_c0_change_is_two_transdata_through_nchw(tmp_path):
    p = plan(_conv_bn_conv(tmp_path), **KEEP)
    rows = sorted(_storage(td) + (td.tensor,) for td in p.transdata)
    assert rows == sorted([
        ("NCHW", (32, 3, 55, 55), "NC1HWC0", (32, 1, 55, 55, 8), "x"),         # input -> conv1 (C0 8)
        ("NC1HWC0", (32, 8, 55, 55, 8), "NCHW", (32, 64, 55, 55), "c1"),       # conv1 -> NCHW (capture row 3)
        ("NCHW", (32, 64, 55, 55), "NC1HWC0", (32, 4, 55, 55, 16), "c1"),      # -> bn, C0 16 (capture row 6)
        ("NC1HWC0", (32, 4, 55, 55, 16), "NCHW", (32, 64, 55, 55), "b"),       # bn -> NCHW
        ("NCHW", (32, 64, 55, 55), "NC1HWC0", (32, 8, 55, 55, 8), "b"),        # -> conv2, C0 8
        ("NC1HWC0", (32, 2, 55, 55, 8), "NCHW", (32, 16, 55, 55), "y"),        # graph output
    ])
    by_name = {td.name: td for td in p.transdata}
    chains = [(by_name[td.after], td) for td in p.transdata if td.after]
    assert len(chains) == 2
    for first, second in chains:
        assert first.after is None and first.tensor == second.tensor and first.dst_format == second.src_format == "NCHW"
        assert set(second.consumers) <= set(first.consumers)
        assert p.transdata.index(first) < p.transdata.index(second)   # the manifest meets a chain in order
        assert second.to_manifest()["after"] == first.name and "after" not in first.to_manifest()
        assert "ge-rules R7" in second.reason and "origin format NCHW" in second.reason
    # bytes moved: the blocked ends with their own C0, the plain end unpadded
    c1 = [td for td in p.transdata if td.tensor == "c1"]
    assert sorted((td.bytes, td.dst_bytes) for td in c1) == sorted([
        (32 * 8 * 55 * 55 * 8 * 4, 32 * 64 * 55 * 55 * 4), (32 * 64 * 55 * 55 * 4, 32 * 4 * 55 * 55 * 16 * 4)])
    assert all(td.est_us and td.est_us > 0 for td in p.transdata)   # each step priced as a TransData
    assert p.node_formats["bn"].input_formats[0] == "NC1HWC0" and p.node_formats["bn"].c0 == 16
    assert p.node_formats["conv1"].c0 == p.node_formats["conv2"].c0 == 8
    assert any("2 float32 C0 change(s)" in n and "R7" in n for n in p.report.notes)
    lines = "\n".join(p.explain())
    assert "NCHW -> NC1HWC0[C0=16] (after " in lines and "NC1HWC0[C0=8] -> NCHW" in lines


@pytest.mark.parametrize("soc,mode", [("Ascend310P3", "must_keep_origin_dtype"), ("Ascend910B", "force_fp16"),
                                      ("Ascend910B", "allow_mix_precision"), ("Ascend910", "must_keep_origin_dtype")])
def test_no_c0_change_elsewhere(tmp_path, soc, mode):
    """No cube high precision (310P3, 910) or float16 compute: one C0, no chain; BN stays between the
    Convs in NC1HWC0 with no TransData around it."""
    p = plan(_conv_bn_conv(tmp_path, n=1, hw=8), soc=soc, precision_mode=mode)
    assert not any(td.after for td in p.transdata) and all(td.c0 is None for td in p.transdata)
    assert {td.tensor for td in p.transdata} == {"x", "y"}
    assert not any("C0 change" in n for n in p.report.notes)


def test_first_step_is_shared_with_plain_readers(tmp_path):
    """conv1's output is read by BN (NC1HWC0, C0 16) and by a graph output (NCHW): one NC1HWC0(8) -> NCHW
    conversion serves both (GE's SameTransdataBreadthFusion), then one NCHW -> NC1HWC0(16)."""
    bn, inits = _bn("bn", "c1", "b", 32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", kernel_shape=[1, 1]), bn]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 32, 8, 8]),
                           helper.make_tensor_value_info("c1", TensorProto.FLOAT, [1, 32, 8, 8])],
                          [_w("w1", (32, 3, 1, 1))] + inits)
    p = plan(_loaded(tmp_path, g), **KEEP)
    c1 = [td for td in p.transdata if td.tensor == "c1"]
    assert [(td.src_format, td.dst_format, td.c0) for td in c1] == [("NC1HWC0", "NCHW", 8), ("NCHW", "NC1HWC0", None)]
    assert sorted(c1[0].consumers) == ["<graph output>", "bn"] and c1[1].consumers == ["bn"]
    assert c1[1].after == c1[0].name


def test_a_tensor_read_by_cube_and_vector_ops_gets_one_conversion_per_c0(tmp_path):
    """The graph input feeds a Conv (C0 8) and a BN (C0 16): two NCHW -> NC1HWC0 conversions, one per C0
    (different formats to GE), each sized with its C0."""
    bn, inits = _bn("bn", "x", "b", 32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", kernel_shape=[1, 1]), bn]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])],
                          [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 32, 8, 8]),
                           helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 16, 8, 8])],
                          [_w("w1", (16, 32, 1, 1))] + inits)
    p = plan(_loaded(tmp_path, g), **KEEP)
    x = sorted(((td.consumers[0], td.c0, td.dst_bytes) for td in p.transdata if td.tensor == "x"), key=str)
    assert x == [("bn", None, 1 * 2 * 8 * 8 * 16 * 4), ("conv", 8, 1 * 4 * 8 * 8 * 8 * 4)]


def _state_and_transdata(loaded):
    """The planner's own stages, up to the TransData list (what ``plan`` runs before verify_plan)."""
    state = PlanState(loaded, check_support(loaded, KEEP["soc"], precision_mode=KEEP["precision_mode"]),
                      precision_mode=KEEP["precision_mode"], keep_dtype=(), enable_small_channel=False,
                      input_format=None, soc=KEEP["soc"])
    plan_passes._assign_dtypes(state)
    plan_passes.run_passes(state, plan_passes.PIPELINE)
    return state, plan_passes.insert_transdata(state, shared=True)


def test_verify_plan_holds_the_c0_of_every_edge(tmp_path):
    state, tds = _state_and_transdata(_conv_bn_conv(tmp_path, n=1, hw=8))
    plan_passes.verify_plan(state, tds)
    second = next(td for td in tds if td.after)
    with pytest.raises(InternalError, match="C0"):   # without the second step BN would read C0 8 as 16
        plan_passes.verify_plan(state, [td for td in tds if td is not second])
    wrong = [td for td in tds]
    wrong[wrong.index(second)] = type(second)(**{**second.__dict__, "after": "trans_TransData_999"})
    with pytest.raises(InternalError, match="follows"):
        plan_passes.verify_plan(state, wrong)


def test_emulator_runs_both_steps_and_matches_onnxruntime(tmp_path):
    import npu_deploy

    loaded = _conv_bn_conv(tmp_path, n=2, c=24, hw=12)
    bundle = tmp_path / "cbc.bundle"
    npu_deploy.convert(str(loaded.path), output=str(bundle), backend="builtin", **{
        "soc": KEEP["soc"], "precision_mode": KEEP["precision_mode"]})
    x = RNG.standard_normal((2, 3, 12, 12)).astype(np.float32)
    res = compare(loaded.path, bundle, inputs={"x": x})
    assert res, res.table()
    with EmulatorBackend(bundle, literal=True) as b:   # literal: every buffer built and unpacked
        (y,) = b.run(None, {"x": x})
        pg, man = b.last_plan_graph, b.manifest
    (ref,) = __import__("onnxruntime").InferenceSession(str(loaded.path)).run(None, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert sorted(pg.transdata) == sorted(t["name"] for t in man["transdata"])
    chain = [t for t in man["transdata"] if t.get("after")]
    assert len(chain) == 2
    for td in chain:   # the second step's buffer holds the reader's C0; the first step's is plain
        c0 = td.get("c0") or 16
        buf = pg.buffers[f"{td['tensor']}__{td['name']}"]
        assert buf.format == "NC1HWC0" and buf.storage == (2, -(-24 // c0), 12, 12, c0)
        first = pg.buffers[f"{td['tensor']}__{td['after']}"]
        assert first.format in ("NCHW", "ND") and first.storage == (2, 24, 12, 12)
    assert pg.stored["c1"].storage == (2, 3, 12, 12, 8)    # conv1 writes C0 = 8: C1 = ceil(24 / 8)
    assert pg.stored["b"].storage == (2, 2, 12, 12, 16)    # BN writes C0 = 16: C1 = ceil(24 / 16)

    # a manifest whose chain names no first step is refused, not run on the stored buffer
    from tests.runtime.test_plan_execution import rewrite

    def unlink(man):
        next(t for t in man["transdata"] if t.get("after"))["after"] = "trans_TransData_999"
    bad = rewrite(bundle, tmp_path / "bad.bundle", unlink)
    with EmulatorBackend(bad) as b, pytest.raises(ModelError, match="follows 'trans_TransData_999'"):
        b.run(None, {"x": x})


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_cnn_on_910b_fp32_matches_onnxruntime_exactly(real_model, tmp_path):
    """PP-OCR cls (Conv -> BN -> HardSwish ... -> MaxPool): every C0 change planned as a chain, the bundle
    run on the emulator equals onnxruntime on float32."""
    import npu_deploy

    model = real_model("ppocr_cls")
    bundle = tmp_path / "cls.bundle"
    shape = {"x": (1, 3, 48, 192)}
    npu_deploy.convert(str(model), output=str(bundle), backend="builtin", input_shapes=shape, **KEEP)
    x = np.random.default_rng(0).standard_normal(shape["x"]).astype(np.float32)
    with EmulatorBackend(bundle) as b:
        (y,) = b.run(None, {"x": x})
        man = b.manifest
    (ref,) = __import__("onnxruntime").InferenceSession(str(model)).run(None, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    chains = [t for t in man["transdata"] if t.get("after")]
    assert chains and all(t["src_format"] == "NCHW" and t["dst_format"] == "NC1HWC0" for t in chains)
    names = {t["name"] for t in man["transdata"]}
    assert all(t["after"] in names for t in chains)


def _alexnet(tmp_path, n=32):
    """The capture's AlexNet-style features: 5 convs (ReLU after each), 3 max pools."""
    inits, nodes = [], []

    def conv(i, x, cin, cout, k, s, p):
        inits.extend([_w(f"w{i}", (cout, cin, k, k), 0.05), _w(f"b{i}", (cout,), 0.05)])
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}",
                                      kernel_shape=[k, k], strides=[s, s], pads=[p] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        return f"r{i}"

    def pool(i, x):
        nodes.append(helper.make_node("MaxPool", [x], [f"p{i}"], name=f"pool{i}", kernel_shape=[3, 3], strides=[2, 2]))
        return f"p{i}"
    x = pool(1, conv(1, "x", 3, 64, 11, 4, 2))
    x = pool(2, conv(2, x, 64, 192, 5, 1, 2))
    x = conv(4, conv(3, x, 192, 384, 3, 1, 1), 384, 256, 3, 1, 1)
    x = pool(3, conv(5, x, 256, 256, 3, 1, 1))
    # the classifier (Flatten + 3 Gemm, ND on 910B: no TransData in the capture either) is left out
    g = helper.make_graph(nodes, "alexnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, 224, 224])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, 256, 6, 6])], inits)
    return _loaded(tmp_path, g, "alexnet")


@pytest.mark.shared_data
def test_alexnet_plan_against_the_real_capture(tmp_path):
    """The capture (torch_npu, op by op, Ascend910B, float32) has 16 activation TransData in the forward
    pass: 10 inserted by FE (``trans_TransData_*``: NCHW <-> NC1HWC0 with C0 = 8 around each Conv2D) and 6
    made by the aclnn max-pool kernel itself (``aclnnMaxPool2dWithMask_TransDataSpecial``: NCHW <->
    NC1HWC0:1 with C0 = 16 around MaxPoolWithArgmaxV1). Weight conversions (FRACTAL_Z) are constants
    ATC folds at compile time. The compiled graph's MaxPool (MaxPoolV3) has no float32 AI Core kernel and
    runs on AI CPU in NCHW, so the plan has the 10 FE rows, row for row, and none of the 6; with the
    pooling on AI Core in float32 (as the capture's kernel runs) it has all 16."""
    from npu_deploy.profiling.ops import read_measured_ops

    (cap,) = read_measured_ops(CAPTURE)
    fwd = cap.ops[:next(i for i, o in enumerate(cap.ops) if o.type == "MatMulV2")]
    rows = [o for o in fwd if o.type == "TransData" and "FRACTAL_Z" not in o.out_formats]
    fe = collections.Counter((o.in_formats[0], tuple(o.in_shapes[0]), o.out_formats[0], tuple(o.out_shapes[0]))
                             for o in rows if o.name.startswith("trans_TransData"))
    pool_rows = [o for o in rows if not o.name.startswith("trans_TransData")]
    assert sum(fe.values()) == 10 and len(pool_rows) == 6
    assert all(16 in (o.in_shapes[0][-1], o.out_shapes[0][-1]) for o in pool_rows)   # C0 16 at the pooling

    p = plan(_alexnet(tmp_path), **KEEP)
    planned = collections.Counter(_storage(td)[:4] for td in p.transdata)
    assert planned == fe
    assert {p.node_formats[f"pool{i}"].engine for i in (1, 2, 3)} == {"AI CPU"}
    assert not any(td.after for td in p.transdata)   # no C0 change: nothing vector-side reads C0 16 here
    # the same shapes measured against estimated, side by side (the cost model's TransData pricing)
    meas = {(o.in_formats[0], tuple(o.in_shapes[0])): o.duration_us for o in rows}
    pairs = [(td.est_us, meas[_storage(td)[:2]]) for td in p.transdata]
    assert all(e > 0 and m > 0 for e, m in pairs)

    # with the pooling on AI Core in float32, as the capture's kernel runs it (MaxPoolV3 kernels are a
    # vector op reading NC1HWC0 with C0 = 16), the plan has all 16 rows: the 6 pooling ones too, with their
    # C0 = 16 storage shapes, 2 of them the second step of a C0 16 -> 8 chain (pool -> conv)
    support = check_support(p_loaded := _alexnet(tmp_path), KEEP["soc"], precision_mode=KEEP["precision_mode"])
    support = dataclasses.replace(support, nodes=[dataclasses.replace(n, engine="AI Core", detail="")
                                                  if n.op_type == "MaxPool" else n for n in support.nodes])
    q = plan(p_loaded, support=support, **KEEP)
    every = collections.Counter((o.in_formats[0], tuple(o.in_shapes[0]), o.out_formats[0], tuple(o.out_shapes[0]))
                                for o in rows)
    assert collections.Counter(_storage(td)[:4] for td in q.transdata) == every and sum(every.values()) == 16
    assert sorted(td.tensor for td in q.transdata if td.after) == ["p1", "p2"]
