"""`npu-deploy compare` through the real entry point: exit 0 / 1 / 2, replay with --save/--load-inputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.runtime.bundles import conv_model, io_entry, make_bundle


@pytest.fixture
def files(tmp_path):
    model, _ = conv_model()
    ref = tmp_path / "ref.onnx"
    onnx.save(model, ref)
    good = make_bundle(tmp_path / "good.bundle", model,
                       inputs=[io_entry("x", [1, 3, 6, 6], fmt="NCHW", device_format="NC1HWC0", c0=16)],
                       outputs=[io_entry("y", [1, 8, 6, 6], fmt="NCHW")], packed={"W": ("FRACTAL_Z", {})})
    bad_model, _ = conv_model()
    b = bad_model.graph.initializer[1]
    b.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(b) + 0.01, "B"))
    bad = make_bundle(tmp_path / "bad.bundle", bad_model, inputs=[io_entry("x", [1, 3, 6, 6], fmt="NCHW")],
                      outputs=[io_entry("y", [1, 8, 6, 6], fmt="NCHW")])
    return ref, good, bad


def test_pass_exit_0(run_cli, files, tmp_path):
    ref, good, _ = files
    code, out, err = run_cli("compare", ref, good, "--json", tmp_path / "c.json")
    assert code == 0, err
    for col in ("cosine", "max_abs", "max_rel", "rmse", "outside", "nan/inf"):
        assert col in out
    assert out.strip().splitlines()[-1].startswith("PASS")
    d = json.loads((tmp_path / "c.json").read_text())
    assert d["ok"] is True and d["outputs"][0]["name"] == "y"


def test_fail_exit_1_and_replay(run_cli, files, tmp_path):
    ref, _, bad = files
    npz = tmp_path / "case.npz"
    code, out, err = run_cli("compare", ref, bad, "--seed", "3", "--save-inputs", npz)
    assert code == 1, err
    assert out.strip().splitlines()[-1].startswith("FAIL")
    code2, out2, _ = run_cli("compare", ref, bad, "--load-inputs", npz)
    assert code2 == 1
    # same inputs → same metrics line for y
    line = [ln for ln in out.splitlines() if ln.startswith("y ")]
    line2 = [ln for ln in out2.splitlines() if ln.startswith("y ")]
    assert line == line2
    # a loose tolerance makes it pass
    assert run_cli("compare", ref, bad, "--load-inputs", npz, "--atol", "0.05")[0] == 0
    saved = np.load(npz)
    assert saved["x"].shape == (1, 3, 6, 6)


def test_given_input_file(run_cli, files, tmp_path):
    ref, good, _ = files
    np.save(tmp_path / "x.npy", np.full((1, 3, 6, 6), 0.25, np.float32))
    code, out, err = run_cli("compare", ref, good, "--input", f"x={tmp_path / 'x.npy'}", "--save-inputs",
                             tmp_path / "s.npz")
    assert code == 0, err
    assert np.all(np.load(tmp_path / "s.npz")["x"] == 0.25)


def test_bad_input_exit_2(run_cli, files, tmp_path):
    ref, good, _ = files
    code, _, err = run_cli("compare", ref, good, "--load-inputs", tmp_path / "none.npz")
    assert code == 2 and "does not exist" in err and "Traceback" not in err
    np.savez(tmp_path / "wrong.npz", x=np.zeros((1, 3, 5, 5), np.float32))
    code, _, err = run_cli("compare", ref, good, "--load-inputs", tmp_path / "wrong.npz")
    assert code == 2 and "shape" in err
    code, _, err = run_cli("compare", good, good)
    assert code == 2 and "onnxruntime cannot load" in err


def test_negative_seed_or_device_is_bad_usage_not_a_crash(run_cli, files):
    ref, good, _ = files
    for args in (("--seed", "-1"), ("--device", "-1")):
        code, _, err = run_cli("compare", ref, good, *args)
        assert code == 2 and "internal error" not in err and "Traceback" not in err, err


def test_positional_input_file_is_used(run_cli, files, tmp_path):
    ref, good, _ = files
    np.save(tmp_path / "x.npy", np.full((1, 3, 6, 6), 0.5, np.float32))
    code, _, err = run_cli("compare", ref, good, "--input", tmp_path / "x.npy", "--save-inputs", tmp_path / "s.npz")
    assert code == 0, err
    assert np.all(np.load(tmp_path / "s.npz")["x"] == 0.5)


def test_outputs_never_overwrite_the_models_compared(run_cli, files, tmp_path):
    ref, good, _ = files
    before = (ref.read_bytes(), good.read_bytes())
    for args in (("--save-inputs", ref), ("--json", good), ("--save-inputs", tmp_path / "a"), ):
        extra = ("--json", tmp_path / "a") if args[1] == tmp_path / "a" else ()
        code, _, err = run_cli("compare", ref, good, *args, *extra)
        assert code == 2 and ("overwrite" in err or "replace" in err) and "Traceback" not in err, err
    assert (ref.read_bytes(), good.read_bytes()) == before and not (tmp_path / "a").exists()


def test_an_all_nan_output_fails_with_na_metrics_not_a_perfect_score(run_cli, tmp_path):
    """sqrt(x - 2) on inputs in [0, 1) is NaN everywhere, on onnxruntime and on the emulator alike."""
    from onnx import TensorProto, helper

    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    g = helper.make_graph([helper.make_node("Sub", ["x", "two"], ["d"]), helper.make_node("Sqrt", ["d"], ["y"])],
                          "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [two])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "nan.onnx")
    bundle = make_bundle(tmp_path / "nan.bundle", model, inputs=[io_entry("x", [1, 16])],
                         outputs=[io_entry("y", [1, 16])])
    code, out, err = run_cli("compare", tmp_path / "nan.onnx", bundle, "--json", tmp_path / "c.json")
    assert code == 1, err
    row = next(line for line in out.splitlines() if line.startswith("y "))
    assert "n/a" in row and "1.000000" not in row and "16/0" in row
    assert out.strip().splitlines()[-1].startswith("FAIL") and "no element is finite" in out
    d = json.loads((tmp_path / "c.json").read_text())
    assert d["ok"] is False and d["outputs"][0]["cosine"] is None and d["outputs"][0]["nan_target"] == 16


# ------------------------------------------------------------------ Polygraphy's habits (issue 13)
def test_per_output_tolerances_decide_for_their_output(run_cli, files, tmp_path):
    ref, _, bad = files  # bad: the bias is 0.01 higher, so every element of y is 0.01 off
    code, out, err = run_cli("compare", ref, bad, "--atol", "1e-3", "--rtol", "0")
    assert code == 1, err
    code, out, err = run_cli("compare", ref, bad, "--atol", "1e-3", "--atol", "y:0.0101", "--rtol", "0",
                             "--json", tmp_path / "c.json")
    assert code == 0, err
    assert "(y: atol=0.0101, rtol=0)" in out.strip().splitlines()[-1]
    d = json.loads((tmp_path / "c.json").read_text())
    assert d["outputs"][0]["atol"] == 0.0101 and d["atol"] == 1e-3
    code, out, err = run_cli("compare", ref, bad, "--atol", "nope:1")
    assert code == 2 and "names output(s) 'nope'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("stat,code", [("max", 1), ("mean", 1), ("elemwise", 1)])
def test_check_error_stat_is_accepted_and_judges(run_cli, files, stat, code):
    ref, good, bad = files
    assert run_cli("compare", ref, bad, "--check-error-stat", stat, "--atol", "1e-3", "--rtol", "0")[0] == code
    assert run_cli("compare", ref, good, "--check-error-stat", stat)[0] == 0


def test_atol_given_but_rtol_deciding_is_said(run_cli, files):
    ref, _, bad = files
    code, out, err = run_cli("compare", ref, bad, "--atol", "1e-4", "--rtol", "1e-3", "--max-outside", "1")
    assert code == 0 and "decided" not in err  # rtol was given: nothing to warn about
    code, out, err = run_cli("compare", ref, bad, "--atol", "1e-4", "--max-outside", "1")
    assert "--atol 0.0001 was given, but for" in err and "give --rtol 0" in err


def test_val_range_and_samples_shape_the_generated_inputs(run_cli, files, tmp_path):
    ref, good, _ = files
    code, out, err = run_cli("compare", ref, good, "--val-range", "x:[-3,250]", "--samples", "3",
                             "--save-inputs", tmp_path / "in.npz", "--json", tmp_path / "c.json")
    assert code == 0, err
    x = np.load(tmp_path / "in.npz")["x"]
    assert x.min() >= -3 and x.max() < 250 and x.max() - x.min() > 200  # spans the range
    assert json.loads((tmp_path / "c.json").read_text())["samples"] == 3
    assert "3 samples, judged together" in out
    hist = next(line for line in out.splitlines() if line.startswith("|error| histogram of y"))
    assert sum(int(c.split(": ")[1]) for c in hist.split(": ", 1)[1].split(", ")) == 3 * 8 * 6 * 6
    code, _, err = run_cli("compare", ref, good, "--val-range", "x:[5,1]")
    assert code == 2 and "LO <= HI" in err


def test_several_npz_samples_are_judged_together(run_cli, files, tmp_path):
    ref, good, bad = files
    for k in range(2):
        run_cli("compare", ref, good, "--seed", str(k), "--save-inputs", tmp_path / f"s{k}.npz")
    code, out, err = run_cli("compare", ref, good, "--data-loader-npz", tmp_path / "s0.npz",
                             "--data-loader-npz", tmp_path / "s1.npz")
    assert code == 0 and "2 samples" in out, err
