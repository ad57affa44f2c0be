"""``debug compare``: device dumps against onnxruntime, tensor by tensor (runtime/check/debug_compare.py).

Oracles: the golden side is re-computed here with plain onnxruntime (each tensor requested as an
output of the model, optimisation left at its default) and the cosine with a numpy formula written
here; the per-node check walks the ONNX graph in order by itself. Dumps are the emulator's (written
with the dump writer, or the emulator's own buffers), perturbed in place on disk for the
"corrupted layer" case (the last output's bytes are the file's last bytes: reference §2).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import npu_deploy
from npu_deploy.converters.files import dump as dumpfmt
from npu_deploy.errors import InputError
from npu_deploy.runtime.check.debug_compare import (MSACCUCMP_COLUMNS, DebugCompareResult, debug_compare,
                                              tensor_metrics)
from npu_deploy.runtime.emulator import EmulatorBackend

CLS_SHAPE = (1, 3, 48, 192)


def cosine(a, b) -> float:
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    na, nb = math.sqrt(sum(a * a)), math.sqrt(sum(b * b))
    if na == 0 and nb == 0:
        return 1.0
    return float(sum(a * b) / (na * nb))


def plain_golden(model_path: Path, feeds: dict, tensors: list[str]) -> dict[str, np.ndarray]:
    """Each tensor as a graph output of a copy of the model; onnxruntime with default settings."""
    import onnxruntime as ort

    m = onnx.load(str(model_path))
    for t in tensors:
        m.graph.output.append(onnx.ValueInfoProto(name=t))
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(tensors, s.run(tensors, feeds)))


# ------------------------------------------------------------------------------------------ a tiny model
def small_model(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    s = numpy_helper.from_array(np.array(3.0, np.float32), "s")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "s"], ["m"], name="scale"),
             helper.make_node("Sigmoid", ["m"], ["y"], name="sig")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=[w, s])
    p = tmp_path / "small.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


def test_metrics_against_hand_computed_values():
    g = np.array([1.0, -2.0, 4.0, 0.0])
    d = np.array([1.5, -2.0, 3.0, 0.0])
    m = tensor_metrics(g, d)
    assert m["max_abs"] == pytest.approx(1.0)
    assert m["max_rel"] == pytest.approx(0.5)            # 0.5 / 1
    assert m["mean_rel"] == pytest.approx((0.5 + 0 + 0.25) / 3)
    assert m["rmse"] == pytest.approx(math.sqrt((0.25 + 1.0) / 4))
    assert m["acc_rel"] == pytest.approx(1.5 / 7)
    assert m["cosine"] == pytest.approx(cosine(g, d))
    nan = tensor_metrics(np.array([1.0, 2.0]), np.array([np.nan, np.inf]))
    assert (nan["nan"], nan["inf"], nan["cosine"]) == (1, 1, None)   # never a perfect-looking 1.0


def test_float32_metrics_match_a_float64_oracle_even_when_cosine_is_near_1():
    rng = np.random.default_rng(7)
    g = rng.standard_normal(300_000).astype(np.float32)
    for noise in (1e-2, 1e-4, 1e-6):
        d = (g * (1 + noise * rng.standard_normal(g.size))).astype(np.float16 if noise > 1e-4 else np.float32)
        m = tensor_metrics(g, d)
        g64, d64 = g.astype(np.float64), d.astype(np.float64)
        one_minus = 1 - np.sum(g64 * d64) / np.sqrt(np.sum(g64 * g64) * np.sum(d64 * d64))
        assert 1 - m["cosine"] == pytest.approx(one_minus, rel=1e-3, abs=1e-12)
        assert m["rmse"] == pytest.approx(np.sqrt(np.mean((d64 - g64) ** 2)), rel=1e-5)
        nz = g64 != 0
        assert m["mean_rel"] == pytest.approx(np.mean(np.abs(d64 - g64)[nz] / np.abs(g64[nz])), rel=1e-4)
        assert m["std_device"] == pytest.approx(d64.std(), rel=1e-5)


def _small_recorded(tmp_path):
    """The small model, its force_fp16 bundle, one input and the recorded run of the bundle."""
    src = small_model(tmp_path)
    b = tmp_path / "m.bundle"
    npu_deploy.convert(src, b, backend="builtin", precision_mode="force_fp16")
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    with EmulatorBackend(b) as be:
        _, ops = be.run_recorded({"x": x})
    return src, b, x, ops


def test_small_model_rows_map_every_node_and_transdata_is_device_only(tmp_path):
    src, b, x, ops = _small_recorded(tmp_path)
    res = debug_compare(src, ops, inputs={"x": x}, bundle=b)
    by_tensor = {r.tensor: r for r in res.rows if not r.device_only}
    assert {"c", "y"} <= set(by_tensor)
    assert [r.position for r in res.rows] == sorted(r.position for r in res.rows)   # topological order
    tds = [r for r in res.rows if r.op.startswith("trans_TransData")]
    assert tds and all(r.device_only for r in tds)
    gold = plain_golden(src, {"x": x}, [r.tensor for r in by_tensor.values()])
    for r in by_tensor.values():
        dev = next(t for op in ops for t in op.outputs if op.name == r.op and t.tensor == r.tensor).logical()
        assert r.cosine == pytest.approx(cosine(gold[r.tensor], dev), abs=1e-9)
    assert res and res.verdict().startswith("PASS")


def test_dump_named_like_atc_maps_node_name_and_output_index(tmp_path):
    """ATC writes OriginalOp = (original node name, output index); a TransData has no node."""
    src = small_model(tmp_path)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    gold = plain_golden(src, {"x": x}, ["c", "r", "m", "y"])
    d = tmp_path / "dump"
    d.mkdir()
    def out(arr, fmt, node, k=0):
        return dumpfmt.DumpTensor.from_logical(arr.astype(np.float16), fmt, original_name=node, original_index=k)
    files = [("TransData", "trans_TransData_0", [out(x, "NC1HWC0", None)]),
             ("Conv2D", "conv", [out(gold["c"], "NC1HWC0", "conv")]),
             ("Relu", "relu", [out(gold["r"], "NC1HWC0", "relu")]),
             ("Mul", "scale", [out(gold["m"][..., ::-1], "NC1HWC0", "scale")]),   # a wrong layer: W reversed
             ("Sigmoid", "sig", [out(gold["y"], "ND", "sig")])]
    for k, (typ, name, outs) in enumerate(files):
        dumpfmt.write_dump(d / dumpfmt.dump_file_name(typ, name, k + 1, 0, 1000 + k), op_name=name,
                           inputs=[], outputs=outs)
    res = debug_compare(src, d, inputs={"x": x})
    rows = {r.op: r for r in res.rows}
    assert rows["conv"].tensor == "c" and rows["sig"].tensor == "y"
    # without the .om, a TransData that names no original tensor cannot be placed: listed, not guessed
    assert "trans_TransData_0" not in rows and res.unmatched == ["trans_TransData_0:output:0"]
    assert res.first_divergent["node"] == "scale" and res.first_divergent["tensor"] == "m"
    # the node alone on the device's input r gives r*3, not the dumped (reversed) one: the error enters here
    assert rows["scale"].origin == "enters"
    assert not res


def test_om_mapping_fused_op_compares_many_to_one(tmp_path):
    from tests.standins.omfile import build_om, op, tensor, transdata

    src = small_model(tmp_path)
    om = build_om(tmp_path / "m.om", inputs=[tensor("x", "float16", [1, 3, 8, 8], "NCHW")],
                  outputs=[tensor("y", "float16", [1, 4, 8, 8], "NCHW")],
                  ops=[transdata("trans_TransData_0", "NCHW", "NC1HWC0", [1, 3, 8, 8], original_names=[],
                                 inputs=["x:0"]),
                       op("conv_relu_scale", "Conv2D", original_names=["conv", "relu", "scale"],
                          output_desc=[tensor("out", "float16", [1, 1, 8, 8, 16], "NC1HWC0", origin=("scale", 0))]),
                       op("sig", "Sigmoid", output_desc=[tensor("y", "float16", [1, 4, 8, 8], "NCHW")])])
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    gold = plain_golden(src, {"x": x}, ["m", "y"])
    d = tmp_path / "dump"
    d.mkdir()
    dumpfmt.write_dump(d / dumpfmt.dump_file_name("TransData", "trans_TransData_0", 1, 0, 1), op_name="trans_TransData_0",
                       inputs=[], outputs=[dumpfmt.DumpTensor.from_logical(x.astype(np.float16), "NC1HWC0")])
    dumpfmt.write_dump(d / dumpfmt.dump_file_name("Conv2D", "conv_relu_scale", 2, 0, 2), op_name="conv_relu_scale",
                       inputs=[], outputs=[dumpfmt.DumpTensor.from_logical(gold["m"].astype(np.float16), "NC1HWC0")])
    dumpfmt.write_dump(d / dumpfmt.dump_file_name("Sigmoid", "sig", 3, 0, 3), op_name="sig",
                       inputs=[], outputs=[dumpfmt.DumpTensor.from_logical(gold["y"].astype(np.float16), "ND")])
    res = debug_compare(src, d, inputs={"x": x}, om=om)
    rows = {r.op: r for r in res.rows}
    assert rows["conv_relu_scale"].tensor == "m" and rows["conv_relu_scale"].fused == ["conv", "relu", "scale"]
    # inserted by ATC, no origin attribute: placed through its input edge (the graph input x)
    assert rows["trans_TransData_0"].device_only and rows["trans_TransData_0"].tensor == "x"
    assert rows["sig"].tensor == "y"
    assert res, res.verdict()


def test_renderings_csv_columns_json_round_trip_and_escaped_html(tmp_path):
    src, b, x, ops = _small_recorded(tmp_path)
    res = debug_compare(src, ops, inputs={"x": x}, bundle=b, cosine_min=1.0)
    res.rows[0].op = "<script>alert(1)</script>\x1b[2J"
    import csv
    import io

    rows = list(csv.reader(io.StringIO(res.csv_text())))
    assert rows[0] == MSACCUCMP_COLUMNS and len(rows) == len(res.rows) + 1
    page = res.html()
    assert "<script>" not in page and "&lt;script&gt;" in page and "\x1b" not in page
    assert "<svg" in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    back = DebugCompareResult.load(res.to_json())
    assert [r.tensor for r in back.rows] == [r.tensor for r in res.rows]
    assert back.first_divergent == res.first_divergent and bool(back) == bool(res)


def test_missing_inputs_and_unreadable_dump_are_one_line_input_errors(tmp_path):
    src = small_model(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no inputs given"):
        debug_compare(src, empty)
    with pytest.raises(InputError, match="no dump files"):
        debug_compare(src, empty, inputs={"x": np.zeros((1, 3, 8, 8), np.float32)})


# ------------------------------------------------------------------------------------------ real model
@pytest.fixture(scope="module")
def cls_fp16(real_model, tmp_path_factory):
    src = real_model("ppocr_cls")
    d = tmp_path_factory.mktemp("cls")
    b = d / "cls16.bundle"
    npu_deploy.convert(src, b, backend="builtin", precision_mode="force_fp16", input_shapes={"x": CLS_SHAPE})
    x = np.random.default_rng(0).random(CLS_SHAPE, dtype=np.float32)
    with EmulatorBackend(b) as be:
        _, ops = be.run_recorded({"x": x})
    dumps = d / "dumps"
    dumpfmt.write_dump_folder(dumps, ops)
    np.savez(dumps / "inputs.npz", x=x)
    return src, b, x, ops, dumps


def _independent_first_divergent(src: Path, x, ops, threshold: float) -> tuple[str, str]:
    """Walk the ONNX nodes in graph order; the first whose dumped output's cosine (numpy, here) against
    onnxruntime's tensor is below ``threshold``."""
    from npu_deploy.converters.files.onnx_model import load_model

    graph = load_model(src, input_shapes={"x": CLS_SHAPE}).model.graph   # the converter's node names
    device = {}
    for op in ops:
        if op.op_type == "TransData":
            continue
        for t in op.outputs:
            device.setdefault(t.tensor, (op.name, t))
    wanted = [o for n in graph.node for o in n.output if o in device]
    gold = plain_golden(src, {"x": x}, wanted)
    for n in graph.node:
        for o in n.output:
            if o in device:
                dev = device[o][1].logical()
                g = gold[o]
                if dev.size == g.size and cosine(g, dev.reshape(g.shape)) < threshold:
                    return n.name, o
    raise AssertionError("no node below the threshold")


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_model_first_divergent_agrees_with_independent_walk(cls_fp16):
    src, b, x, ops, dumps = cls_fp16
    threshold = 0.99999      # stricter than fp16 allows everywhere, so that some node diverges
    res = debug_compare(src, dumps, bundle=b, cosine_min=threshold)   # inputs.npz found in the dump folder
    node, tensor = _independent_first_divergent(src, x, ops, threshold)
    assert res.first_divergent is not None
    assert (res.first_divergent["node"], res.first_divergent["tensor"]) == (node, tensor)
    assert res.first_divergent["origin"] in ("enters", "accumulates")
    assert not res
    # at the default marks (0.99 for fp16) the converted model is fine layer by layer
    ok = debug_compare(src, dumps, bundle=b)
    assert ok, ok.verdict()


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_model_perturbed_dump_is_the_first_divergence(cls_fp16, tmp_path):
    import shutil

    src, b, x, ops, dumps = cls_fp16
    d = tmp_path / "dumps"
    shutil.copytree(dumps, d)
    files = dumpfmt.read_dump_folder(d)
    # a layer in the middle: a Conv whose output is float16
    victim = [f for f in files if f.op_type == "Conv" and f.outputs[0].dtype == np.float16][10]
    out = victim.outputs[0]
    raw = bytearray(victim.path.read_bytes())
    n = out.data.size
    tail = np.frombuffer(bytes(raw[len(raw) - 2 * n:]), np.float16).copy()   # the last output's bytes
    assert np.array_equal(tail.reshape(out.data.shape), out.data)
    tail[:: 7] += np.float16(4.0)
    raw[len(raw) - 2 * n:] = tail.tobytes()
    victim.path.write_bytes(bytes(raw))
    res = debug_compare(src, d, bundle=b)
    assert res.first_divergent["op"] == victim.op_name
    assert res.first_divergent["origin"] == "enters"
    # the layers after it were computed from the true value: the corruption stays local
    assert [r.op for r in res.failures()] == [victim.op_name]


def test_first_nan_inf_in_an_overflowing_light_cnn(tmp_path):
    """light_squeezenet's activations reach ~1e31: under force_fp16 they overflow to Inf, then NaN."""
    src = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"
    b = tmp_path / "sq.bundle"
    npu_deploy.convert(src, b, backend="builtin", precision_mode="force_fp16")
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    with EmulatorBackend(b) as be:
        name = be.get_inputs()[0].name
        _, ops = be.run_recorded({name: x})
    res = debug_compare(src, ops, inputs={name: x}, bundle=b)
    # independent: graph order (the converter's node names), first node whose output holds a NaN or an Inf
    from npu_deploy.converters.files.onnx_model import load_model

    graph = load_model(src).model.graph
    bad = {t.tensor for op in ops if op.op_type != "TransData" for t in op.outputs
           if not np.isfinite(t.logical().astype(np.float64)).all()}
    first = next(n.name for n in graph.node if any(o in bad for o in n.output))
    assert res.first_nan_inf is not None and res.first_nan_inf["node"] == first
    assert res.first_nan_inf["overflow"]
    assert "first NaN/Inf" in res.verdict() and not res


def test_channel_last_dump_is_compared_in_the_onnx_axis_order(tmp_path):
    """A dump recorded as NHWC holds the ONNX (NCHW) tensor's elements in NHWC order: compared after a
    transpose, not a reshape (which would scramble it); the same data reshaped would fail."""
    src = small_model(tmp_path)
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    gold = plain_golden(src, {"x": x}, ["c", "r", "m", "y"])
    d = tmp_path / "dump"
    d.mkdir()
    for k, (typ, name, t) in enumerate([("Conv2D", "conv", "c"), ("Relu", "relu", "r"), ("Mul", "scale", "m"),
                                        ("Sigmoid", "sig", "y")]):
        nhwc = np.ascontiguousarray(gold[t].transpose(0, 2, 3, 1))
        outs = [dumpfmt.DumpTensor.from_logical(nhwc, "NHWC", original_name=name, original_index=0)]
        dumpfmt.write_dump(d / dumpfmt.dump_file_name(typ, name, k + 1, 0, 1000 + k), op_name=name,
                           inputs=[], outputs=outs)
    res = debug_compare(src, d, inputs={"x": x})
    rows = {r.op: r for r in res.rows}
    assert {rows[n].tensor for n in ("conv", "relu", "scale", "sig")} == {"c", "r", "m", "y"}
    assert all(rows[n].compared and rows[n].passed for n in ("conv", "relu", "scale", "sig")), res.to_text()
    assert res
    # the oracle that the order matters here: the NHWC bytes read in NCHW order are far off
    scrambled = gold["c"].transpose(0, 2, 3, 1).reshape(gold["c"].shape)
    assert cosine(scrambled, gold["c"]) < 0.9
