"""`npu-deploy run` through the real entry point, on hand-built bundles."""

from __future__ import annotations

import csv
import json

import numpy as np
import onnxruntime as ort
import pytest

from tests.runtime.bundles import conv_model, io_entry, make_bundle


@pytest.fixture
def bundle(tmp_path):
    model, _ = conv_model()
    path = make_bundle(tmp_path / "conv.bundle", model,
                       inputs=[io_entry("x", [1, 3, 6, 6], fmt="NCHW", device_format="NC1HWC0", c0=16)],
                       outputs=[io_entry("y", [1, 8, 6, 6], fmt="NCHW")], packed={"W": ("FRACTAL_Z", {})},
                       transdata=[{"name": "trans_TransData_0", "src_format": "NCHW", "dst_format": "NC1HWC0",
                                   "shape": [1, 3, 6, 6], "dtype": "float32", "bytes": 432,
                                   "onnx_nodes": ["conv"], "reason": "input", "est_us": 12.0}],
                       cost={"estimated": True, "est_us": {"conv": 30.0, "relu": 2.0}})
    return path, model


@pytest.fixture
def dyn_bundle(tmp_path):
    model, _ = conv_model(batch="N")
    path = make_bundle(tmp_path / "dyn.bundle", model, inputs=[io_entry("x", [-1, 3, 6, 6], fmt="NCHW")],
                       outputs=[io_entry("y", [-1, 8, 6, 6], fmt="NCHW")],
                       dynamic={"mode": "batch", "gears": [{"x": [1, 3, 6, 6]}, {"x": [4, 3, 6, 6]}]})
    return path, model


def test_run_prints_all_numbers_and_writes_json(run_cli, bundle, tmp_path):
    path, _ = bundle
    code, out, err = run_cli("run", path, "--loop", "5", "--warmup", "1", "--json", tmp_path / "r.json")
    assert code == 0, err
    for word in ("min", "mean", "p50", "p90", "p95", "p99", "host -> device", "compute", "device -> host",
                 "throughput"):
        assert word in out
    assert out.strip().splitlines()[-1].startswith("5 runs on CPU emulator")
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["schema"] == "npu-deploy/run" and d["backend"] == "emulator" and d["loop"] == 5
    assert d["inputs"]["x"]["shape"] == [1, 3, 6, 6] and "onnxruntime" in d["versions"]
    assert {"p50_ms", "p99_ms"} <= set(d["latency"]) and d["h2d"]["count"] == 5


def test_run_inputs_and_outputs(run_cli, bundle, tmp_path):
    path, model = bundle
    x = np.random.default_rng(0).random((1, 3, 6, 6), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = run_cli("run", path, "--input", f"x={tmp_path / 'x.npy'}", "--loop", "1",
                             "--output", tmp_path / "out", "--outfmt", "bin")
    assert code == 0, err
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = np.fromfile(tmp_path / "out" / "y.bin", dtype=np.float32).reshape(ref.shape)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # raw .bin input, positional (ais_bench style), and --input-dir
    x.tofile(tmp_path / "x.bin")
    assert run_cli("run", path, "--input", tmp_path / "x.bin", "--loop", "1")[0] == 0
    d = tmp_path / "dir"
    d.mkdir()
    np.save(d / "x.npy", x)
    code, _, err = run_cli("run", path, "--input-dir", d, "--loop", "1", "--output", tmp_path / "o2")
    assert code == 0, err
    np.testing.assert_allclose(np.load(tmp_path / "o2" / "y.npy"), ref, rtol=1e-5, atol=1e-5)


def test_run_profile_folder(run_cli, bundle, tmp_path):
    path, _ = bundle
    code, out, err = run_cli("run", path, "--loop", "2", "--warmup", "0", "--profile", tmp_path / "prof")
    assert code == 0, err
    (prof,) = (tmp_path / "prof").glob("PROF_*")
    assert str(prof) in out and "estimated" in out
    (summary,) = prof.glob("mindstudio_profiler_output/op_summary_*.csv")
    rows = list(csv.DictReader(open(summary, newline="")))
    assert [r["OP Type"] for r in rows] == ["TransData", "Conv2D", "Relu"] * 2   # CANN types


def test_dynamic_batch_aliases(run_cli, dyn_bundle, tmp_path):
    path, _ = dyn_bundle
    for args in (["--batch-size", "4"], ["--dymBatch", "4"], ["--dymDims", "x:4,3,6,6"]):
        code, out, err = run_cli("run", path, *args, "--loop", "1", "--warmup_count", "0")
        assert code == 0, err
        assert "x: float32 (4, 3, 6, 6)" in out
    code, out, err = run_cli("run", path, "--batch-size", "3", "--loop", "1", "--json", tmp_path / "b3.json")
    assert code == 0, err  # padded to the batch-4 gear, cropped back
    assert json.loads((tmp_path / "b3.json").read_text())["outputs"]["y"]["shape"] == [3, 8, 6, 6]
    code, _, err = run_cli("run", path, "--batch-size", "9", "--loop", "1")
    assert code == 2 and "fit no gear" in err and "x:1,3,6,6 | x:4,3,6,6" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--loop", "0"], "--loop 0"),
    (["--input", "nope=x.npy"], "no input 'nope'"),
    (["--input", "x=missing.npy"], "does not exist"),
    (["--input-shape", "x:1,3"], "rank 2"),
])
def test_run_bad_input_exit_2(run_cli, bundle, args, message):
    path, _ = bundle
    code, _, err = run_cli("run", path, *args)
    assert code == 2 and message in err and "Traceback" not in err


def test_run_wrong_bin_size_and_onnx_model(run_cli, bundle, tmp_path):
    path, model = bundle
    (tmp_path / "short.bin").write_bytes(b"\0" * 12)
    code, _, err = run_cli("run", path, "--input", f"x={tmp_path / 'short.bin'}")
    assert code == 2 and "12 bytes" in err
    import onnx

    onnx.save(model, tmp_path / "m.onnx")
    code, out, err = run_cli("run", tmp_path / "m.onnx", "--loop", "1")  # onnxruntime's habit: run the .onnx
    assert code == 0 and "converted in memory: built-in lowering (bundle, CPU emulator)" in out, err
    code, _, err = run_cli("run", tmp_path / "none.bundle")
    assert code == 2 and "does not exist" in err


def test_run_output_not_left_half_written(run_cli, bundle, tmp_path):
    path, _ = bundle
    (tmp_path / "blocker").write_text("a file where a folder is needed")
    code, _, err = run_cli("run", path, "--loop", "1", "--output", tmp_path / "blocker" / "sub")
    assert code == 2 and "Traceback" not in err


@pytest.mark.parametrize("args", [["--seed", "-1"], ["--pure-data", "random", "--seed", "-5"], ["--device", "-1"]])
def test_run_negative_seed_or_device_is_bad_usage_not_a_crash(run_cli, bundle, args):
    path, _ = bundle
    code, out, err = run_cli("run", path, "--loop", "1", *args)
    assert code == 2 and "internal error" not in err and "Traceback" not in err, err
    assert "latency" not in out


def test_run_unwritable_json_is_refused_before_running(run_cli, bundle, tmp_path):
    path, _ = bundle
    code, out, err = run_cli("run", path, "--loop", "1", "--json", tmp_path / "no" / "such" / "r.json")
    assert code == 2 and "does not exist" in err
    assert "latency" not in out  # refused up front, not after the runs


def test_outputs_whose_names_clash_after_sanitising_get_their_own_files(tmp_path):
    from npu_deploy.cli.run import save_outputs

    a, b = np.zeros(2, np.float32), np.ones(2, np.float32)
    written = save_outputs(str(tmp_path / "out"), ["a/b", "a_b", "a:b"], [a, b, a + 2], "npy")
    assert [p.name for p in written] == ["a_b.npy", "a_b_2.npy", "a_b_3.npy", "output_names.json"]
    assert [float(np.load(p)[0]) for p in written[:3]] == [0.0, 1.0, 2.0]
    # the files whose name is not the tensor's are mapped back to it
    assert json.loads(written[3].read_text()) == {"a_b.npy": "a/b", "a_b_2.npy": "a_b",
                                                  "a_b_3.npy": "a:b"}


def test_raw_bin_of_a_dynamic_batch_model_takes_its_batch_from_the_file_size(run_cli, dyn_bundle, tmp_path):
    path, _ = dyn_bundle
    np.ones((4, 3, 6, 6), np.float32).tofile(tmp_path / "x.bin")
    code, out, err = run_cli("run", path, "--loop", "1", "--input", f"x={tmp_path / 'x.bin'}")
    assert code == 0, err
    assert "input  x: float32 (4, 3, 6, 6)" in out and "(batch 4)" in out


def test_json_never_overwrites_the_model_or_an_input(run_cli, bundle, tmp_path):
    path, _ = bundle
    np.save(tmp_path / "x.npy", np.ones((1, 3, 6, 6), np.float32))
    before = (path.read_bytes(), (tmp_path / "x.npy").read_bytes())
    for target in (path, tmp_path / "x.npy"):
        code, out, err = run_cli("run", path, "--loop", "1", "--input", f"x={tmp_path / 'x.npy'}", "--json", target)
        assert code == 2 and "overwrite" in err and "latency" not in out, err
    assert (path.read_bytes(), (tmp_path / "x.npy").read_bytes()) == before


def test_output_names_that_cannot_be_file_names_get_safe_files_and_a_mapping(run_cli, tmp_path):
    """Names over 255 bytes, with NUL, '..' or escape sequences: every output written, none lost."""
    from onnx import TensorProto, helper

    names = ["n" * 300, "y\x00z", "..", "a/b\x1b[2J"]
    g = helper.make_graph([helper.make_node("Relu", ["x"], [n]) for n in names], "odd",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in names])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = make_bundle(tmp_path / "odd.bundle", model, inputs=[io_entry("x", [1, 4])],
                       outputs=[io_entry(n, [1, 4]) for n in names])
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = run_cli("run", path, "--loop", "1", "--input", f"x={tmp_path / 'x.npy'}",
                             "--output", tmp_path / "out")
    assert code == 0, err
    assert "\x1b" not in out and "\x00" not in out and "a/b\\x1b[2J" in out
    mapping = json.loads((tmp_path / "out" / "output_names.json").read_text())
    assert sorted(mapping.values()) == sorted(names)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(files) == len(names) + 1 and all(not f.startswith(".") for f in files)
    for file_name in mapping:
        np.testing.assert_array_equal(np.load(tmp_path / "out" / file_name), np.maximum(x, 0))


def test_outputs_never_overwrite_an_input_in_the_output_folder(run_cli, bundle, tmp_path):
    path, _ = bundle
    (tmp_path / "out").mkdir()
    x = np.ones((1, 3, 6, 6), np.float32)
    np.save(tmp_path / "out" / "y.npy", x)  # the input sits where output `y` would be written
    code, out, err = run_cli("run", path, "--loop", "1", "--input", f"x={tmp_path / 'out' / 'y.npy'}",
                             "--output", tmp_path / "out")
    assert code == 2 and "overwrite" in err and "latency" not in out, err
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), x)
