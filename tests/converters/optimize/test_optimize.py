"""`optimize` rules, each on a minimal model built here, with oracles written independently of the rule:
the expected graph shape (which ops remain) and the expected numbers (numpy), plus the framework's
promises: a rewrite that changes the numbers is rolled back, the checks pass on the output, the plan
is measured, and bad input writes nothing."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters import optimize as opt
from npu_deploy.errors import InputError, ModelError

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def run(m, feeds):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def ops(m):
    return [n.op_type for n in m.graph.node]


def apply(m, rule, feeds):
    # every verified rewrite kept: these tests check the rewrite, not what the cost model thinks of it
    res, out = opt.optimize_model(m, rules=[rule], feeds=feeds, keep_all=True)
    onnx.checker.check_model(out, full_check=True)
    return res, out


RNG = np.random.default_rng(0)


# ------------------------------------------------------------------------------------------ registry
def test_registry_has_the_reference_rules():
    want = {"conv1d-to-conv2d", "narrow-int64", "split-avgpool", "split-large-kernel-conv", "fold-transpose-bn",
            "merge-casts", "merge-slices", "merge-concats", "gather-to-split", "remove-empty-slices",
            "split-qkv-matmul", "reflect-pad", "cancel-transpose-reshape"}
    assert want <= set(opt.RULES)
    for r in opt.RULES.values():
        assert callable(r.find) and callable(r.check) and callable(r.rewrite) and r.summary


def test_select_rules_and_unknown_rule():
    assert [r.name for r in opt.select_rules(["merge-casts", "reflect-pad"])] == ["reflect-pad", "merge-casts"]
    names = [r.name for r in opt.select_rules(None, ["merge-casts"])]
    assert "merge-casts" not in names and "gather-to-split" not in names  # off by default
    with pytest.raises(InputError, match="unknown rule 'nope'"):
        opt.select_rules(["nope"])


# ------------------------------------------------------------------------------------------ casts
def test_merge_casts_identity_chain_and_siblings():
    x = RNG.standard_normal((2, 5)).astype(np.float16)
    m = model([helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT16),     # identity
               helper.make_node("Cast", ["a"], ["b"], to=F),                      # fp16 -> fp32 -> fp64: exact
               helper.make_node("Cast", ["b"], ["c"], to=TensorProto.DOUBLE),
               helper.make_node("Cast", ["x"], ["d"], to=F),                      # siblings of the first chain?
               helper.make_node("Cast", ["x"], ["e"], to=F),
               helper.make_node("Add", ["d", "e"], ["y2"])],
              [vi("x", [2, 5], TensorProto.FLOAT16)], [vi("c", [2, 5], TensorProto.DOUBLE), vi("y2", [2, 5])])
    res, out = apply(m, "merge-casts", {"x": x})
    c, y2 = run(out, {"x": x})
    np.testing.assert_array_equal(c, x.astype(np.float64))
    np.testing.assert_array_equal(y2, x.astype(np.float32) * 2)
    assert ops(out).count("Cast") == 2 and res.applied_count() >= 3 and res


def test_merge_casts_keeps_a_rounding_chain():
    m = model([helper.make_node("Cast", ["x"], ["a"], to=TensorProto.INT32),
               helper.make_node("Cast", ["a"], ["y"], to=TensorProto.DOUBLE)],
              [vi("x", [4])], [vi("y", [4], TensorProto.DOUBLE)])
    res, out = apply(m, "merge-casts", {"x": np.array([1.5, -2.7, 3.2, 0.4], np.float32)})
    assert ops(out) == ["Cast", "Cast"]
    [a] = [a for a in res.applications if a.rule == "merge-casts"]
    assert a.status == "not applicable" and "rounds or truncates" in a.reason


# ------------------------------------------------------------------------------------------ slices, concats, gathers
def test_merge_slices_on_different_axes():
    x = RNG.standard_normal((4, 6, 5)).astype(np.float32)
    c = lambda v: np.array(v, np.int64)  # noqa: E731
    m = model([helper.make_node("Slice", ["x", "s1", "e1", "a1"], ["t"]),
               helper.make_node("Slice", ["t", "s2", "e2", "a2", "st2"], ["y"])],
              [vi("x", [4, 6, 5])], [vi("y", [2, 3, 5])],
              [("s1", c([1])), ("e1", c([3])), ("a1", c([0])), ("s2", c([5])), ("e2", c([0])), ("a2", c([-2])),
               ("st2", c([-2]))])
    _, out = apply(m, "merge-slices", {"x": x})
    assert ops(out) == ["Slice"]
    np.testing.assert_array_equal(run(out, {"x": x})[0], x[1:3, 5:0:-2])


def test_merge_slices_refuses_same_axis():
    c = lambda v: np.array(v, np.int64)  # noqa: E731
    m = model([helper.make_node("Slice", ["x", "s", "e", "a"], ["t"]), helper.make_node("Slice", ["t", "s", "e", "a"], ["y"])],
              [vi("x", [8])], [vi("y", [4])], [("s", c([1])), ("e", c([6])), ("a", c([0]))])
    res, out = apply(m, "merge-slices", {"x": np.arange(8, dtype=np.float32)})
    assert ops(out) == ["Slice", "Slice"] and "axis 0" in res.applications[0].reason


def test_merge_concats_same_axis():
    a, b, c = (RNG.standard_normal((2, k)).astype(np.float32) for k in (1, 2, 3))
    m = model([helper.make_node("Concat", ["a", "b"], ["ab"], axis=-1),
               helper.make_node("Concat", ["ab", "c"], ["y"], axis=1)],
              [vi("a", [2, 1]), vi("b", [2, 2]), vi("c", [2, 3])], [vi("y", [2, 6])])
    _, out = apply(m, "merge-concats", {"a": a, "b": b, "c": c})
    assert ops(out) == ["Concat"] and list(out.graph.node[0].input) == ["a", "b", "c"]
    np.testing.assert_array_equal(run(out, {"a": a, "b": b, "c": c})[0], np.concatenate([a, b, c], 1))


def test_gather_to_split():
    x = RNG.standard_normal((3, 7, 2)).astype(np.float32)
    m = model([helper.make_node("Gather", ["x", "i0"], ["g0"], axis=1),
               helper.make_node("Gather", ["x", "i1"], ["g1"], axis=1),
               helper.make_node("Gather", ["x", "i2"], ["g2"], axis=-2)],
              [vi("x", [3, 7, 2])], [vi("g0", [3, 2]), vi("g1", [3, 3, 2]), vi("g2", [3, 2, 2])],
              [("i0", np.array(0, np.int64)), ("i1", np.array([1, 2, 3], np.int64)), ("i2", np.array([5, 6], np.int64))])
    _, out = apply(m, "gather-to-split", {"x": x})
    assert "Gather" not in ops(out) and ops(out).count("Split") == 1
    g0, g1, g2 = run(out, {"x": x})
    np.testing.assert_array_equal(g0, x[:, 0])
    np.testing.assert_array_equal(g1, x[:, 1:4])
    np.testing.assert_array_equal(g2, x[:, 5:7])


def test_remove_empty_slices_before_concat():
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    c = lambda v: np.array(v, np.int64)  # noqa: E731
    m = model([helper.make_node("Slice", ["x", "s", "e", "a"], ["empty"]),
               helper.make_node("Concat", ["x", "empty", "x"], ["y"], axis=1)],
              [vi("x", [2, 4])], [vi("y", [2, 8])], [("s", c([3])), ("e", c([3])), ("a", c([1]))])
    _, out = apply(m, "remove-empty-slices", {"x": x})
    assert ops(out) == ["Concat"] and list(out.graph.node[0].input) == ["x", "x"]
    np.testing.assert_array_equal(run(out, {"x": x})[0], np.concatenate([x, x], 1))


# ------------------------------------------------------------------------------------------ pads, pools, convs
def test_reflect_pad_becomes_slices_and_concats():
    x = RNG.standard_normal((1, 3, 5, 6)).astype(np.float32)
    pads = np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64)
    m = model([helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], [vi("x", [1, 3, 5, 6])],
              [vi("y", [1, 3, 8, 10])], [("p", pads)])
    _, out = apply(m, "reflect-pad", {"x": x})
    assert "Pad" not in ops(out)
    want = np.pad(x, ((0, 0), (0, 0), (2, 1), (1, 3)), mode="reflect")
    np.testing.assert_array_equal(run(out, {"x": x})[0], want)


def test_split_avgpool_cascade():
    x = RNG.standard_normal((1, 2, 32, 64)).astype(np.float32)
    m = model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[16, 32], strides=[16, 32])],
              [vi("x", [1, 2, 32, 64])], [vi("y", [1, 2, 2, 2])])
    _, out = apply(m, "split-avgpool", {"x": x})
    pools = [n for n in out.graph.node if n.op_type == "AveragePool"]
    assert len(pools) == 2
    for p in pools:
        k = opt.attr(p, "kernel_shape")
        assert k[0] * k[1] < 255
    want = x.reshape(1, 2, 2, 16, 2, 32).mean(axis=(3, 5))
    np.testing.assert_allclose(run(out, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_split_avgpool_refuses_overlapping_windows():
    m = model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[16, 16], strides=[1, 1])],
              [vi("x", [1, 1, 20, 20])], [vi("y", [1, 1, 5, 5])])
    res, out = apply(m, "split-avgpool", {"x": np.ones((1, 1, 20, 20), np.float32)})
    assert ops(out) == ["AveragePool"] and "overlapping" in res.applications[0].reason


def _conv1d(x, w, b, stride):
    n, cin, length = x.shape
    cout, _, k = w.shape
    lout = (length - k) // stride + 1
    y = np.zeros((n, cout, lout))
    for o in range(lout):
        y[:, :, o] = np.einsum("nck,dck->nd", x[:, :, o * stride:o * stride + k], w)
    return y + b[None, :, None]


def test_split_large_kernel_conv():
    x = RNG.standard_normal((1, 2, 800)).astype(np.float32)
    w = RNG.standard_normal((4, 2, 256)).astype(np.float32) * 0.1
    b = RNG.standard_normal(4).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[256], strides=[128])],
              [vi("x", [1, 2, 800])], [vi("y", [1, 4, 5])], [("w", w), ("b", b)])
    _, out = apply(m, "split-large-kernel-conv", {"x": x})
    ws = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    convs = [n for n in out.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2 and all(ws[c.input[1]].shape[-1] <= opt.LARGE_KERNEL for c in convs)
    np.testing.assert_allclose(run(out, {"x": x})[0], _conv1d(x, w, b, 128), rtol=1e-4, atol=1e-4)


def test_conv1d_region_runs_as_conv2d():
    x = RNG.standard_normal((1, 3, 20)).astype(np.float32)
    w1 = RNG.standard_normal((4, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((2, 4, 1)).astype(np.float32)
    b = np.zeros(4, np.float32)
    m = model([helper.make_node("Conv", ["x", "w1", "b"], ["c1"], kernel_shape=[3], pads=[1, 1]),
               helper.make_node("Relu", ["c1"], ["r"]),
               helper.make_node("Mul", ["r", "half"], ["h"]),
               helper.make_node("Conv", ["h", "w2"], ["y"], kernel_shape=[1])],
              [vi("x", [1, 3, 20])], [vi("y", [1, 2, 20])], [("w1", w1), ("w2", w2), ("b", b),
                                                             ("half", np.float32(0.5))])
    res, out = apply(m, "conv1d-to-conv2d", {"x": x})
    ws = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    assert all(ws[n.input[1]].ndim == 4 for n in out.graph.node if n.op_type == "Conv")
    assert ops(out).count("Unsqueeze") == 1 and ops(out).count("Squeeze") == 1  # one region
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    want = _conv1d(np.maximum(_conv1d(xp, w1, b, 1), 0) * 0.5, w2, np.zeros(2), 1)
    np.testing.assert_allclose(run(out, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    [a] = res.applied()
    assert a.after["transdata"] <= a.before["transdata"]


def test_fold_channel_slice_into_conv_weights():
    x = RNG.standard_normal((1, 2, 10)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3)).astype(np.float32)
    c = lambda v: np.array(v, np.int64)  # noqa: E731
    m = model([helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3]),
               helper.make_node("Slice", ["c", "s0", "e0", "a0"], ["lo"]),
               helper.make_node("Slice", ["c", "s1", "e1", "a1"], ["hi"])],
              [vi("x", [1, 2, 10])], [vi("lo", [1, 2, 8]), vi("hi", [1, 4, 7])],
              [("w", w), ("s0", c([0])), ("e0", c([2])), ("a0", c([1])), ("s1", c([2, 1])), ("e1", c([99, 99])),
               ("a1", c([1, 2]))])
    _, out = apply(m, "fold-channel-slice", {"x": x})
    assert ops(out).count("Conv") == 2
    # the spatial cut moved in front of the Conv: no Slice reads a Conv output any more
    [sl] = [n for n in out.graph.node if n.op_type == "Slice"]
    assert sl.input[0] == "x"
    full = _conv1d(x, w, np.zeros(6), 1)
    lo, hi = run(out, {"x": x})
    np.testing.assert_allclose(lo, full[:, 0:2], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(hi, full[:, 2:, 1:], rtol=1e-4, atol=1e-4)


def test_fold_transpose_bn_to_mul_add():
    x = RNG.standard_normal((2, 5, 4)).astype(np.float32)   # [N, L, C]: BN over C after a transpose
    g, bt, mu, var = (RNG.random(4).astype(np.float32) + 0.5 for _ in range(4))
    m = model([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
               helper.make_node("BatchNormalization", ["t", "g", "b", "m", "v"], ["n"], epsilon=1e-3),
               helper.make_node("Transpose", ["n"], ["y"], perm=[0, 2, 1])],
              [vi("x", [2, 5, 4])], [vi("y", [2, 5, 4])], [("g", g), ("b", bt), ("m", mu), ("v", var)])
    _, out = apply(m, "fold-transpose-bn", {"x": x})
    assert sorted(ops(out)) == ["Add", "Mul"]
    want = (x - mu) / np.sqrt(var + 1e-3) * g + bt
    np.testing.assert_allclose(run(out, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_split_qkv_matmul():
    s, h, heads = 4, 8, 2
    x = RNG.standard_normal((1, s, h)).astype(np.float32)
    w = RNG.standard_normal((h, 3 * h)).astype(np.float32)
    b = RNG.standard_normal(3 * h).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["ab"]),
               helper.make_node("Reshape", ["ab", "shape"], ["r"]),
               helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4])]
              + [helper.make_node("Gather", ["t", f"i{k}"], [f"o{k}"], axis=0) for k in range(3)],
              [vi("x", [1, s, h])], [vi(f"o{k}", [1, heads, s, h // heads]) for k in range(3)],
              [("w", w), ("b", b), ("shape", np.array([1, s, 3, heads, h // heads], np.int64))]
              + [(f"i{k}", np.array(k, np.int64)) for k in range(3)])
    _, out = apply(m, "split-qkv-matmul", {"x": x})
    assert "Gather" not in ops(out) and ops(out).count("MatMul") == 3
    full = (x @ w + b).reshape(1, s, 3, heads, h // heads).transpose(2, 0, 3, 1, 4)
    for k, got in enumerate(run(out, {"x": x})):
        np.testing.assert_allclose(got, full[k], rtol=1e-5, atol=1e-5)


def test_cancel_transposes_and_reshapes():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    m = model([helper.make_node("Transpose", ["x"], ["a"], perm=[1, 2, 0]),
               helper.make_node("Transpose", ["a"], ["b"], perm=[2, 0, 1]),      # cancels: b == x
               helper.make_node("Reshape", ["b", "s1"], ["c"]),
               helper.make_node("Reshape", ["c", "s2"], ["y"])],
              [vi("x", [2, 3, 4])], [vi("y", [4, 6])],
              [("s1", np.array([6, 4], np.int64)), ("s2", np.array([4, 6], np.int64))])
    _, out = apply(m, "cancel-transpose-reshape", {"x": x})
    assert ops(out) == ["Reshape"]
    np.testing.assert_array_equal(run(out, {"x": x})[0], x.reshape(4, 6))


# ------------------------------------------------------------------------------------------ int64
def _int_model(offset: int):
    return model([helper.make_node("Add", ["ids", "off"], ["a"]), helper.make_node("Mul", ["a", "two"], ["b"]),
                  helper.make_node("Gather", ["table", "b"], ["y"])],
                 [vi("ids", [1, 6], TensorProto.INT64)], [vi("y", [1, 6, 3])],
                 [("off", np.array(offset, np.int64)), ("two", np.array(2, np.int64)),
                  ("table", RNG.standard_normal((40, 3)).astype(np.float32))])


def test_narrow_int64_moves_ops_off_the_ai_cpu():
    ids = np.array([[0, 1, 5, 7, 9, 3]], np.int64)
    res, out = apply(_int_model(4), "narrow-int64", {"ids": ids})
    types = {n.output[0]: n for n in out.graph.node}
    for n in out.graph.node:
        if n.op_type in ("Add", "Mul"):
            assert all(numpy_helper.to_array(t).dtype == np.int32 for t in out.graph.initializer if t.name in n.input)
    table = numpy_helper.to_array([t for t in out.graph.initializer if t.name == "table"][0])
    np.testing.assert_array_equal(run(out, {"ids": ids})[0], table[(ids + 4) * 2])
    assert types and res.before["ai_cpu"] > res.after["ai_cpu"]


@pytest.fixture
def big_offset_model():
    return model([helper.make_node("Add", ["ids", "off"], ["y"])], [vi("ids", [3], TensorProto.INT64)],
                 [vi("y", [3], TensorProto.INT64)], [("off", np.array(2**40, np.int64))])


def test_narrow_int64_values_check(big_offset_model):
    res, out = apply(big_offset_model, "narrow-int64", {"ids": np.arange(3, dtype=np.int64)})
    assert ops(out) == ["Add"] and numpy_helper.to_array(out.graph.initializer[0]).dtype == np.int64
    assert "outside int32" in res.applications[0].reason


# ------------------------------------------------------------------------------------------ framework
def test_a_rewrite_that_changes_the_numbers_is_rolled_back(monkeypatch):
    def find(v):
        return [opt.Match(f"bad:{n.name}", (n.name,)) for n in v.model.graph.node if n.op_type == "Relu"]

    def rewrite(v, m):
        n = v.nodes[m.nodes[0]]
        return opt.Change(remove={n.name}, add=[helper.make_node("Sigmoid", list(n.input), list(n.output), name=n.name)])

    bad = opt.Rule("bad", "Relu as Sigmoid (wrong on purpose)", find, lambda v, m: None, rewrite)
    monkeypatch.setitem(opt.RULES, "bad", bad)
    m = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [8])], [vi("y", [8])])
    res, out = opt.optimize_model(m, rules=["bad"], feeds={"x": np.linspace(-2, 2, 8).astype(np.float32)})
    assert ops(out) == ["Relu"]
    [a] = res.applications
    assert a.status == "rolled back" and "changes the numbers" in a.reason and res.applied_count() == 0


def test_optimize_writes_checked_output_and_json(tmp_path):
    src, dst, rep = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    x = np.array([1.5, -2.7], np.float32)
    onnx.save(model([helper.make_node("Cast", ["x"], ["a"], to=F), helper.make_node("Relu", ["a"], ["y"])],
                    [vi("x", [2])], [vi("y", [2])]), src)
    res = opt.optimize(src, dst, report=rep)
    out = onnx.load(dst)
    onnx.checker.check_model(out, full_check=True)
    np.testing.assert_array_equal(run(out, {"x": x})[0], np.maximum(x, 0))
    d = json.loads(rep.read_text())
    assert d["schema"] == "npu-deploy/optimize-result" and d["ok"] is True and d["verdict"] == res.verdict()
    assert opt.OptimizeResult.load(d).applied_count() == res.applied_count() == 1
    assert res.verdict().startswith("1 rewrite, TransData") and res.verdict().endswith("outputs match")


def test_bad_inputs_write_nothing(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not onnx at all")
    with pytest.raises(ModelError, match="not an ONNX model"):
        opt.optimize(junk, tmp_path / "o.onnx")
    ok = tmp_path / "m.onnx"
    onnx.save(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])]), ok)
    with pytest.raises(InputError, match="overwrite"):
        opt.optimize(ok, ok)
    broken = model([helper.make_node("Relu", ["nowhere"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    onnx.save(broken, tmp_path / "b.onnx")
    with pytest.raises(ModelError, match="nothing was rewritten"):
        opt.optimize(tmp_path / "b.onnx", tmp_path / "o.onnx")
    with pytest.raises(InputError, match="dynamic dimensions"):
        onnx.save(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["N", 2])], [vi("y", ["N", 2])]),
                  tmp_path / "d.onnx")
        opt.optimize(tmp_path / "d.onnx", tmp_path / "o.onnx")
    assert not (tmp_path / "o.onnx").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_realistic_feeds_respect_the_embedding_size():
    m = model([helper.make_node("Gather", ["table", "ids"], ["y"])], [vi("ids", [2, 50], TensorProto.INT64),
                                                                      vi("x", [1, 3, 4, 4])], [vi("y", [2, 50, 2])],
              [("table", np.zeros((7, 2), np.float32))])
    f = opt.realistic_feeds(m)
    assert f["ids"].min() >= 0 and f["ids"].max() < 7 and f["ids"].max() > 1
    assert f["x"].min() >= 0 and f["x"].max() <= 1


def test_rewrites_stay_correct_for_other_dynamic_sizes():
    # verified at L = 800, the output must still be right at L = 1000: nothing baked in from the sample
    w = RNG.standard_normal((3, 1, 200)).astype(np.float32) * 0.1
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[200], strides=[50])],
              [vi("x", [1, 1, "L"])], [vi("y", [1, 3, "T"])], [("w", w)])
    _, out = opt.optimize_model(m, rules=["split-large-kernel-conv"], input_shapes={"x": (1, 1, 800)}, keep_all=True)
    assert ops(out).count("Conv") == 2
    x = RNG.standard_normal((1, 1, 1000)).astype(np.float32)
    np.testing.assert_allclose(run(out, {"x": x})[0], _conv1d(x, w, np.zeros(3), 50), rtol=1e-4, atol=1e-4)
    g = model([helper.make_node("Gather", ["x", "i0"], ["a"], axis=0), helper.make_node("Gather", ["x", "i1"], ["b"], axis=0)],
              [vi("x", ["N", 2])], [vi("a", [2]), vi("b", [2])],
              [("i0", np.array(0, np.int64)), ("i1", np.array(1, np.int64))])
    res, out = opt.optimize_model(g, rules=["gather-to-split"], input_shapes={"x": (2, 2)})
    assert ops(out) == ["Gather", "Gather"] and "not static" in res.applications[0].reason


def test_realistic_feeds_give_pixels_to_a_model_that_divides_by_255():
    m = model([helper.make_node("Div", ["img", "k"], ["y"])], [vi("img", [1, 3, 8, 8])], [vi("y", [1, 3, 8, 8])],
              [("k", np.float32(255.0))])
    f = opt.realistic_feeds(m)["img"]
    assert f.max() > 1.5 and f.max() <= 255 and np.array_equal(f, np.floor(f))
    m = model([helper.make_node("Sub", ["img", "mean"], ["y"])], [vi("img", [1, 8, 8, 3])], [vi("y", [1, 8, 8, 3])],
              [("mean", np.array([0.485, 0.456, 0.406], np.float32))])
    f = opt.realistic_feeds(m)["img"]
    assert 0 <= f.min() and f.max() <= 1


def test_a_graph_a_rule_cannot_read_is_reported_not_changed(monkeypatch):
    def find(v):
        raise KeyError("attribute 'perm' of a node the rule did not expect")

    def rewrite(v, m):
        raise ValueError("cannot rewrite this")

    monkeypatch.setitem(opt.RULES, "confused", opt.Rule("confused", "raises in find", find, lambda v, m: None, rewrite))
    monkeypatch.setitem(opt.RULES, "clumsy", opt.Rule(
        "clumsy", "raises in rewrite",
        lambda v: [opt.Match("k", (v.model.graph.node[0].name,))], lambda v, m: None, rewrite))
    m = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [2])], [vi("y", [2])])
    res, out = opt.optimize_model(m, rules=["confused", "clumsy"], feeds={"x": np.ones(2, np.float32)})
    assert ops(out) == ["Relu"] and res.applied_count() == 0 and res
    by = {a.rule: a for a in res.applications}
    assert by["confused"].status == "not applicable" and "could not be matched" in by["confused"].reason
    assert by["clumsy"].status == "rolled back" and "rewrite failed: ValueError" in by["clumsy"].reason
