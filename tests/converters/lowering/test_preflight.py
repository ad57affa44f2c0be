"""The float16 preflight at convert time (issue 24), through the real entry points.

The onnx 1.23.2 wheel's ``light_*`` CNNs overflow float16 (alexnet: 9e4 by conv4, 3.7e12 by fc8):
converted under ``force_fp16`` every output is NaN. ``convert`` has to say so, name the node where the
overflow starts, and print a keep list with which ``compare`` passes.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from npu_deploy.converters.lowering.preflight import FP16_MAX, fp16_preflight

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
FLAGGED = ["light_bvlc_alexnet", "light_zfnet512", "light_squeezenet", "light_inception_v1", "light_vgg19"]


def _model(name: str) -> Path:
    p = LIGHT / f"{name}.onnx"
    if not p.exists():
        pytest.skip(f"{p} is not in this onnx wheel")
    return p


def _command(err: str) -> list[str]:
    lines = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("npu-deploy convert ")]
    assert len(lines) == 1, err
    return shlex.split(lines[0])[1:]


def _peaks(path: Path, feeds: dict) -> dict[str, float]:
    """float32 peak |x| of every node output, by onnxruntime on the original model (the test's own)."""
    import onnxruntime as ort

    m = onnx.load(str(path))
    outs = [o for n in m.graph.node for o in n.output if o]
    del m.graph.output[:]
    m.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in outs)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ins = {i.name for i in sess.get_inputs()}
    vals = sess.run(outs, {k: v for k, v in feeds.items() if k in ins})
    return {o: float(np.abs(v).max()) for o, v in zip(outs, vals) if v.dtype == np.float32 and v.size}


@pytest.mark.slow
@pytest.mark.parametrize("name", FLAGGED)
def test_light_cnns_are_flagged_at_convert_time_and_the_keep_list_makes_compare_pass(name, tmp_path, run_cli):
    src = _model(name)
    out = tmp_path / "m.bundle"
    code, stdout, err = run_cli("convert", src, "--backend", "builtin", "-o", out)
    assert code == 0 and out.exists(), err  # the conversion stands: the preflight only reports
    head = next(ln for ln in err.splitlines() if "float16 preflight" in ln)
    assert "leave float16's range; it starts at" in head, err
    start = head.split("it starts at ", 1)[1].split(" ", 1)[0]
    graph = onnx.load(str(src), load_external_data=False).graph
    node = next(n for n in graph.node if n.name == start)
    # checked independently: the start node's output is past float16's range, its inputs are not
    from npu_deploy.runtime.check.compare import generate_inputs
    from npu_deploy.runtime.session import InferenceSession

    with InferenceSession(out) as s:
        feeds = generate_inputs(s.get_inputs(), seed=0)
    peaks = _peaks(src, feeds)
    assert peaks[node.output[0]] > FP16_MAX
    assert all(peaks.get(i, 0.0) <= FP16_MAX for i in node.input)
    if name == "light_bvlc_alexnet":  # the finding: 9e4 by conv4
        assert [n.name for n in graph.node if n.op_type == "Conv"].index(start) == 3

    code, stdout, _ = run_cli("compare", src, out)
    assert code == 1 and "npu-deploy debug precision" in stdout and "--mode force_fp16" in stdout

    args = _command(err)
    assert args[:2] == ["convert", str(src)] and "--keep-dtype" in args
    fixed = tmp_path / "fixed.bundle"
    args[args.index("-o") + 1] = str(fixed)
    code, _, err2 = run_cli(*args)
    assert code == 0, err2
    assert "leave float16's range" not in err2  # the fixed plan passes its own preflight
    code, stdout, _ = run_cli("compare", src, fixed)
    assert code == 0, stdout


@pytest.mark.slow
def test_no_preflight_skips_it_and_the_preflight_never_changes_the_bundle(tmp_path, run_cli):
    src = _model("light_squeezenet")
    a, b = tmp_path / "a.bundle", tmp_path / "b.bundle"
    code, _, err = run_cli("convert", src, "--backend", "builtin", "-o", a)
    assert code == 0 and "float16 preflight" in err
    code, _, err = run_cli("convert", src, "--backend", "builtin", "-o", b, "--no-preflight")
    assert code == 0 and "float16 preflight" not in err
    assert a.read_bytes() == b.read_bytes()
    code, out, err = run_cli("convert", src, "--backend", "builtin", "-o", tmp_path / "c.bundle",
                             "--precision-mode", "must_keep_origin_dtype")
    assert code == 0 and "float16 preflight" not in out + err


def _tiny(path: Path, scale: float) -> Path:
    """x[1,4] -> Mul(scale) -> Relu -> Mul(1/scale): overflows float16 inside when scale is large."""
    from onnx import TensorProto, numpy_helper

    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["a"], name="up"), helper.make_node("Relu", ["a"], ["r"], name="relu"),
         helper.make_node("Mul", ["r", "d"], ["y"], name="down")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(scale, np.float32), "s"),
         numpy_helper.from_array(np.array(1 / scale, np.float32), "d")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_calibration_inputs_decide_and_the_report_names_the_start(tmp_path, run_cli):
    src = _tiny(tmp_path / "t.onnx", 1e3)
    small, big = tmp_path / "small.npz", tmp_path / "big.npz"
    np.savez(small, x=np.full((1, 4), 2.0, np.float32))       # 2e3: fine
    np.savez(big, **{"x@0": np.full((1, 4), 2.0, np.float32), "x@1": np.full((1, 4), 100.0, np.float32)})  # 1e5
    code, out, err = run_cli("convert", src, "--backend", "builtin", "-o", tmp_path / "a.bundle",
                             "--calibration-inputs", small)
    assert code == 0 and "float16 preflight: OK" in out and "leave" not in err
    code, out, err = run_cli("convert", src, "--backend", "builtin", "-o", tmp_path / "b.bundle",
                             "--calibration-inputs", big)
    assert code == 0 and "it starts at up (Mul): a reaches 1e+05" in err, err
    assert "--keep-dtype up,relu,down" in err  # down reads the overflowing tensor: kept too
    bad = tmp_path / "bad.npz"
    np.savez(bad, z=np.zeros((1, 4), np.float32))
    code, _, err = run_cli("convert", src, "--backend", "builtin", "-o", tmp_path / "c.bundle",
                           "--calibration-inputs", bad)
    assert code == 2 and "no array for input(s) 'x'" in err and "Traceback" not in err
    assert not (tmp_path / "c.bundle").exists()  # found before anything was written


def test_underflow_past_the_bound_is_reported(tmp_path):
    src = _tiny(tmp_path / "t.onnx", 1e-7)  # 1e-7 * x: below float16's normal range, digits lost
    rep = fp16_preflight(src, {"up": "float16", "relu": "float16", "down": "float16"},
                         [{"x": np.array([[1.0, 2.0, 3.0, 5.0]], np.float32)}], precision_mode="force_fp16")
    assert not rep and rep.flagged[0]["node"] == "up" and rep.flagged[0]["reason"] == "underflow"
    rep = fp16_preflight(src, {"up": "float32", "relu": "float32", "down": "float16"},
                         [{"x": np.array([[1.0, 2.0, 3.0, 5.0]], np.float32)}], precision_mode="force_fp16")
    assert rep and rep.checked_nodes == 1  # the ops kept in float32 are not checked
