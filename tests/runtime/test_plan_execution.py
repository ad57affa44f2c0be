"""The emulator executes the plan: a wrong plan gives wrong numbers.

Real model (PP-OCR cls, a real PyPI wheel): its bundle matches onnxruntime; the same bundle with one
planned TransData dropped, or one tensor's planned format changed, no longer does — ``compare`` fails.
The oracle is onnxruntime on the original model, independent of the plan."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import npu_deploy
from npu_deploy.converters.files.bundle import WeightEntry, read_bundle, write_bundle
from npu_deploy.runtime.check.compare import compare
from npu_deploy.runtime.emulator import EmulatorBackend
from tests.conftest import TEST_TIMEOUT

SHAPE = {"x": (1, 3, 48, 192)}


def rewrite(src, dst, edit):
    """A copy of bundle ``src`` whose manifest went through ``edit`` (graph and weights as they are)."""
    with read_bundle(src) as b:
        man = copy.deepcopy(b.manifest)
        edit(man)
        entries = [WeightEntry(n, w.format, w.logical_shape, np.array(b.packed(n)), c0=w.c0, groups=w.groups,
                               origin=w.origin, onnx_shape=w.onnx_shape) for n, w in b.weights.items()]
        write_bundle(dst, man, b.graph, entries)
    return dst


@pytest.fixture(scope="module")
def cls_bundle(real_model, tmp_path_factory):
    model = real_model("ppocr_cls")
    out = tmp_path_factory.mktemp("plan") / "cls.bundle"
    npu_deploy.convert(str(model), output=str(out), backend="builtin", precision_mode="must_keep_origin_dtype",
                       input_shapes=SHAPE)
    x = np.random.default_rng(0).standard_normal(SHAPE["x"]).astype(np.float32)
    return model, out, {"x": x}


@pytest.mark.realmodel
@pytest.mark.slow
def test_the_plan_is_what_runs(cls_bundle):
    model, bundle, feeds = cls_bundle
    assert compare(model, bundle, inputs=feeds)
    with EmulatorBackend(bundle) as b:
        b.run(None, feeds)
        pg = b.last_plan_graph
        man = b.manifest
    # every planned TransData ran, no buffer was read in a format it was not stored in
    assert sorted(pg.transdata) == sorted(t["name"] for t in man["transdata"])
    assert pg.reinterpreted == []
    blocked = {t for t, s in pg.stored.items() if s.format == "NC1HWC0"}
    assert blocked and all(pg.stored[t].storage[-1] == 16 for t in blocked)  # C padded to C0
    want = {t for t, f in man["tensor_formats"].items() if f == "NC1HWC0"}
    assert want <= set(pg.stored) and all(pg.stored[t].format == "NC1HWC0" for t in want)


@pytest.mark.realmodel
def test_literal_execution_gives_the_same_bytes(cls_bundle):
    """``literal=True`` builds every tensor's device buffer (C padded to C0) and has every reader
    unpack it; the default hands a same-format reader the value the buffer was made from. Both must
    give the same outputs (unpack(pack(x)) == x); onnxruntime fuses differently around the layout
    nodes (Conv+Add into one kernel or not), so the last bit may differ."""
    _, bundle, feeds = cls_bundle
    with EmulatorBackend(bundle) as fast, EmulatorBackend(bundle, literal=True) as lit:
        (a,), (b,) = fast.run(None, feeds), lit.run(None, feeds)
        n_fast, n_lit = len(fast.last_plan_graph.model.graph.node), len(lit.last_plan_graph.model.graph.node)
        assert lit.last_plan_graph.storage_ops  # elementwise ops ran on the padded storage
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert n_lit > 2 * n_fast


@pytest.mark.realmodel
@pytest.mark.parametrize("literal", [False, True])
def test_dropping_one_transdata_fails_compare(cls_bundle, tmp_path, literal):
    model, bundle, feeds = cls_bundle

    def drop(man):
        tds = [t for t in man["transdata"] if t.get("producer")]  # one on the device, not at the input
        assert tds, "the plan has no device-side TransData to drop"
        man["transdata"].remove(tds[0])

    bad = rewrite(bundle, tmp_path / "no_td.bundle", drop)
    with EmulatorBackend(bad, literal=literal) as b:
        (y,) = b.run(None, feeds)
    res = compare(model, bad, inputs=feeds)
    assert not res, res.table()
    (ref,) = __import__("onnxruntime").InferenceSession(str(model)).run(None, feeds)
    assert not np.allclose(y, ref, atol=1e-3)


@pytest.mark.realmodel
def test_one_wrong_planned_format_fails_compare(cls_bundle, tmp_path):
    model, bundle, feeds = cls_bundle

    def corrupt(man):
        # the first Conv after the stem writes plain NCHW although its consumer reads NC1HWC0
        convs = [k for k, v in man["node_formats"].items() if v["op_type"] == "Conv"]
        nf = man["node_formats"][convs[1]]
        assert nf["output_formats"] == ["NC1HWC0"]
        nf["output_formats"] = ["NCHW"]

    bad = rewrite(bundle, tmp_path / "wrong_fmt.bundle", corrupt)
    res = compare(model, bad, inputs=feeds)
    assert not res, res.table()
    with EmulatorBackend(bad) as b:
        b.run(None, feeds)
        assert b.last_plan_graph.reinterpreted  # the consumer saw NCHW bytes as NC1HWC0


def _mlp_model():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((40, 24)).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "B"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [20, 40])],
                          [helper.make_tensor_value_info("y", 1, [20, 24])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "B")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_fractal_nz_chain_runs_on_the_storage(tmp_path):
    """MatMul → Add(bias) → Relu planned in FRACTAL_NZ: the Add and Relu run on the NZ storage
    (M = 20 padded to 32, N = 24 padded to 32), the bias converted at compile time."""
    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp_model(), path)
    out = tmp_path / "mlp.bundle"
    npu_deploy.convert(str(path), output=str(out), backend="builtin", precision_mode="must_keep_origin_dtype")
    x = np.random.default_rng(5).standard_normal((20, 40)).astype(np.float32)
    assert compare(path, out, inputs={"x": x})
    with EmulatorBackend(out, literal=True) as b:
        (y,) = b.run(None, {"x": x})
        pg = b.last_plan_graph
    (ref,) = __import__("onnxruntime").InferenceSession(str(path)).run(None, {"x": x})
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert pg.stored["a"].format == "FRACTAL_NZ" and pg.stored["a"].storage == (2, 2, 16, 16)
    assert set(pg.storage_ops) >= {"add", "relu"}


def test_original_graph_mode_is_kept_for_benchmarks(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp_model(), path)
    out = tmp_path / "mlp.bundle"
    npu_deploy.convert(str(path), output=str(out), backend="builtin")
    x = np.random.default_rng(6).standard_normal((20, 40)).astype(np.float32)
    with EmulatorBackend(out) as plan, EmulatorBackend(out, execute_plan=False) as orig:
        (a,), (b,) = plan.run(None, {"x": x}), orig.run(None, {"x": x})
        assert orig.last_plan_graph is None
    np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3)  # both round to fp16, at different points


def _light_models():
    from pathlib import Path

    d = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    return sorted(d.glob("light_*.onnx"))


@pytest.mark.parametrize("path", _light_models(), ids=lambda p: p.stem)
@pytest.mark.slow
def test_onnx_wheel_light_cnns_run_through_the_plan(path, tmp_path):
    """The onnx wheel's light_* CNNs (IR 3 graphs with unused initializers among them): converted,
    the plan executed, every planned TransData run, outputs match onnxruntime on the original."""
    out = tmp_path / f"{path.stem}.bundle"
    npu_deploy.convert(str(path), output=str(out), backend="builtin", precision_mode="must_keep_origin_dtype")
    res = compare(path, out)
    assert res, res.table()
    with EmulatorBackend(out) as b:
        b.run(None, {m.name: np.zeros(m.shape, m.dtype) for m in b.get_inputs()})
        assert sorted(b.last_plan_graph.transdata) == sorted(t["name"] for t in b.manifest["transdata"])
        assert b.last_plan_graph.reinterpreted == []


def test_zero_d_initializers_keep_their_rank(tmp_path):
    """Gather(x, scalar index) drops the axis; a 0-d index that became [1] would keep it."""
    g = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=1)], "g",
                          [helper.make_tensor_value_info("x", 1, [1, 5, 4])],
                          [helper.make_tensor_value_info("y", 1, [1, 4])],
                          [numpy_helper.from_array(np.array(2, np.int64), "i")])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    out = tmp_path / "g.bundle"
    npu_deploy.convert(str(path), output=str(out), backend="builtin")
    x = np.random.default_rng(1).standard_normal((1, 5, 4)).astype(np.float32)
    with EmulatorBackend(out) as b:
        (y,) = b.run(None, {"x": x})
    assert y.shape == (1, 4)
    np.testing.assert_array_equal(y, x[:, 2].astype(np.float16).astype(np.float32))


@pytest.mark.slow
def test_layernorm_without_bias_runs(tmp_path):
    """onnxruntime 1.32 could die with SIGSEGV on a LayerNormalization without its optional bias once
    the scale lives in the weight blob: the emulator gives it the zero bias the op defines. Run in a
    child process, so that a crash fails this test instead of ending the test session."""
    import subprocess
    import sys

    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln", axis=-1)], "g",
                          [helper.make_tensor_value_info("x", 1, [2, 8])], [helper.make_tensor_value_info("y", 1, [2, 8])],
                          [numpy_helper.from_array(np.linspace(0.5, 2, 8).astype(np.float32), "s")])
    path = tmp_path / "ln.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    code = ("import sys, npu_deploy; from npu_deploy.runtime.check.compare import compare;"
            f"npu_deploy.convert({str(path)!r}, output={str(tmp_path / 'ln.bundle')!r}, backend='builtin');"
            f"r = compare({str(path)!r}, {str(tmp_path / 'ln.bundle')!r}); print(r.verdict()); sys.exit(0 if r else 1)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TEST_TIMEOUT,
                          cwd=tmp_path)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "PASS" in proc.stdout


@pytest.mark.parametrize("name", [f"test_sequence_model{k}" for k in (1, 2, 3, 4, 5, 6, 7)])
def test_internal_sequences_pass_between_ops(name, tmp_path):
    """onnx's simple tests: tensors in and out, sequences inside (SequenceConstruct/Insert/At...).
    The sequences are passed between ops as they are; the tensors around them follow the plan."""
    import os

    from onnx.backend.test.loader import load_model_tests

    case = next(c for c in load_model_tests(kind="simple") if c.name == name)
    src = tmp_path / "m.onnx"
    onnx.save(onnx.load(os.path.join(case.model_dir, "model.onnx")), src)
    out = tmp_path / "m.bundle"
    npu_deploy.convert(str(src), output=str(out), backend="builtin", precision_mode="must_keep_origin_dtype")
    res = compare(src, out)
    assert res, res.table()


@pytest.mark.realmodel
@pytest.mark.slow
def test_plan_inside_if_bodies_is_executed(real_model, tmp_path):
    """silero-vad 6.2.3 keeps the whole network inside If branches on the sample rate: the TransData
    planned inside the bodies run there, and dropping one of them breaks the numbers."""
    model = real_model("silero_vad_623")
    out = tmp_path / "vad.bundle"
    npu_deploy.convert(str(model), output=str(out), backend="builtin", precision_mode="must_keep_origin_dtype",
                       input_shapes={"input": (1, 512), "state": (2, 1, 128)})
    feeds = {"input": (np.random.default_rng(0).standard_normal((1, 512)) * 0.1).astype(np.float32),
             "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    assert compare(model, out, inputs=feeds)
    with EmulatorBackend(out) as b:
        b.run(None, feeds)
        in_bodies = [t["name"] for t in b.manifest["transdata"] if "_branch_" in "".join(t["consumers"])]
        assert in_bodies and set(in_bodies) <= set(b.last_plan_graph.transdata)

    def drop(man):
        man["transdata"] = [t for t in man["transdata"] if t["name"] != in_bodies[0]]

    bad = rewrite(out, tmp_path / "vad_bad.bundle", drop)
    assert not compare(model, bad, inputs=feeds)


def test_swish_after_conv_is_one_fused_kernel(tmp_path):
    """Conv -> x * sigmoid(x): ATC fuses the three into one kernel; only the Mul's result is stored
    (rounded to float16), the Conv and Sigmoid results stay in the core."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array((0.2 * rng.standard_normal((16, 3, 3, 3))).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Mul", ["c", "s"], ["m"], name="mul"),
             helper.make_node("Conv", ["m", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    w2 = numpy_helper.from_array((0.1 * rng.standard_normal((8, 16, 3, 3))).astype(np.float32), "w2")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", 1, [1, 8, 8, 8])], [w, w2])
    path = tmp_path / "swish.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    out = tmp_path / "swish.bundle"
    npu_deploy.convert(str(path), output=str(out), backend="builtin")
    with EmulatorBackend(out) as b:
        b.run(None, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})
        assert {"c", "s"} <= set(b.manifest["fused_tensors"]) and "m" not in b.manifest["fused_tensors"]
        assert "m" in b.rounded_tensors and not {"c", "s"} & set(b.rounded_tensors)
    assert compare(path, out)
