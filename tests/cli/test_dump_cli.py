"""Operator dump files through the command line: ``run --dump``, ``inspect X.dump``, ``layout convert
--tensor``, and ACL's ``acl.json`` (stand-in tested).

``run --dump`` is checked on a real model (PP-OCR cls from its PyPI wheel) against the emulator's own
recorded buffers, run separately, and its graph output against onnxruntime on the original model."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest

import npu_deploy
from npu_deploy.converters.files import dump
from npu_deploy.converters.files.dump import read_dump_folder
from npu_deploy.runtime.emulator import EmulatorBackend
from tests.converters.files.test_dump import (DT_FLOAT, DT_FLOAT16, F_FRACTAL_NZ, F_ND, dump_bytes, nz_oracle, op_input,
                                        op_output)
from tests.runtime.test_acl import acl  # noqa: F401  (the stand-in acl fixture)
from tests.standins.omfile import build_om, tensor

SHAPE = (1, 3, 48, 192)


# ------------------------------------------------------------------------------------ run --dump
@pytest.fixture(scope="module")
def cls_run(real_model, tmp_path_factory, run_cli_module):
    model = real_model("ppocr_cls")
    tmp = tmp_path_factory.mktemp("dumpcli")
    bundle = tmp / "cls.bundle"
    npu_deploy.convert(str(model), output=str(bundle), backend="builtin", precision_mode="force_fp16",
                       input_shapes={"x": SHAPE})
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    np.save(tmp / "x.npy", x)
    code, out, err = run_cli_module("run", bundle, "--input", f"x={tmp / 'x.npy'}", "--loop", "1", "--warmup", "0",
                                    "--dump", tmp / "dumps", "--output", tmp / "out")
    assert code == 0, err
    return model, bundle, x, tmp, out


@pytest.fixture(scope="module")
def run_cli_module():
    import contextlib
    import io

    from npu_deploy.cli.main import main

    def _run(*args):
        o, e = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
            code = main([str(a) for a in args])
        return code, o.getvalue(), e.getvalue()

    return _run


@pytest.mark.realmodel
@pytest.mark.slow
def test_run_dump_writes_every_executed_op_in_the_acl_layout(cls_run):
    model, bundle, x, tmp, out = cls_run
    folders = dump.find_dump_folders(tmp / "dumps")
    assert len(folders) == 1
    parts = folders[0].relative_to(tmp / "dumps").parts
    assert re.fullmatch(r"\d{14}", parts[0]) and parts[1:] == ("0", "cls", "1", "0")
    assert "dump: " in out and str(folders[0]) in out
    with EmulatorBackend(bundle) as b:
        _, ops = b.run_recorded({"x": x})
    dumps = read_dump_folder(tmp / "dumps")
    files = [p for p in folders[0].iterdir() if p.name != "inputs.npz"]  # the feeds are kept beside them
    assert len(dumps) == len(ops) == len(files)
    assert any(op.op_type == "TransData" for op in ops)
    name = re.compile(r"^(?P<t>[^.]+)\.(?P<n>.+)\.(?P<task>\d+)\.0\.(?P<ts>\d+)$")
    formats_seen, unshaped = set(), set()
    produced = {o: k for n in onnx.load(str(model)).graph.node for k, o in enumerate(n.output) if o}
    checked = 0
    for k, (d, op) in enumerate(zip(dumps, ops)):
        m = name.match(d.path.name)
        assert m and m["t"] == op.op_type and m["n"] == op.name.replace("/", "_") and int(m["task"]) == k + 1
        assert (d.op_type, d.op_name) == (op.op_type, op.name)
        assert len(d.inputs) == len(op.inputs) and len(d.outputs) == len(op.outputs)
        for got, want in zip(d.inputs + d.outputs, op.inputs + op.outputs):
            assert got.format == npu_deploy.converters.formats.get_format(want.stored.format).name
            np.testing.assert_array_equal(got.data, np.asarray(want.data).reshape(got.shape))
            formats_seen.add(got.format)
            if np.size(want.data) != np.prod(want.stored.storage, dtype=np.int64):
                # the emulator recorded no shape for this plain buffer: dumped with its data's shape
                unshaped.add(want.tensor)
                assert got.shape == got.original_shape == np.shape(want.data)
                continue
            assert got.shape == tuple(want.stored.storage) and got.original_shape == tuple(want.stored.shape)
            np.testing.assert_array_equal(got.logical(), want.logical())
        assert [t.original_name for t in d.outputs] == [t.tensor for t in op.outputs]
        for t in d.outputs:
            if t.original_name in produced:
                assert t.original_index == produced[t.original_name]
                checked += 1
    assert "NC1HWC0" in formats_seen  # the device layout is kept, not flattened to host order
    assert checked > len(ops) // 2  # most dumped outputs carry their ONNX tensor name and output index
    assert unshaped <= {"reshape2_0.tmp_0"}  # emulator: Stored.shape () for this Reshape output


@pytest.mark.realmodel
@pytest.mark.slow
def test_dumped_graph_output_agrees_with_onnxruntime(cls_run):
    import onnxruntime as ort

    model, bundle, x, tmp, _ = cls_run
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out_name = sess.get_outputs()[0].name
    (ref,) = sess.run([out_name], {"x": x})
    last = [t for d in read_dump_folder(tmp / "dumps") for t in d.outputs if t.original_name == out_name]
    assert last
    np.testing.assert_allclose(last[-1].logical().astype(np.float32), ref, atol=2e-2)
    saved = np.load(next((tmp / "out").glob("*.npy")))
    np.testing.assert_allclose(last[-1].logical().astype(np.float32), saved.astype(np.float32), atol=1e-3)


@pytest.mark.realmodel
def test_inspect_and_layout_read_a_run_dump(cls_run, run_cli, tmp_path):
    _, _, _, tmp, _ = cls_run
    d = next(d for d in read_dump_folder(tmp / "dumps") if d.outputs and d.outputs[0].format == "NC1HWC0")
    code, out, err = run_cli("inspect", d.path, "--json", tmp_path / "i.json")
    assert code == 0, err
    assert d.op_name in out and "NC1HWC0" in out and "output:0" in out
    rep = json.loads((tmp_path / "i.json").read_text())
    assert rep["kind"] == "dump" and rep["dump"]["op_type"] == d.op_type
    assert rep["outputs"][0]["shape"] == list(d.outputs[0].shape)
    code, out, err = run_cli("layout", "convert", d.path, tmp_path / "y.npy", "--tensor", "output:0")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), d.outputs[0].logical())


# ------------------------------------------------------------------------ hand-built files via CLI
def _nz_dump(tmp_path) -> tuple[Path, np.ndarray]:
    x = np.arange(20 * 35, dtype=np.float16).reshape(20, 35)
    nz = nz_oracle(x)
    y = np.abs(x)
    raw = dump_bytes("blk/abs", [op_input(DT_FLOAT16, F_FRACTAL_NZ, nz.shape, nz.nbytes, original_shape=x.shape)],
                     [op_output(DT_FLOAT16, F_ND, y.shape, y.nbytes, name="abs_out", index=0)],
                     [nz.tobytes(), y.tobytes()])
    p = tmp_path / "Abs.blk_abs.7.1.1700000000000001"
    p.write_bytes(raw)
    return p, x


def test_inspect_lists_op_and_tensors(tmp_path, run_cli):
    p, _ = _nz_dump(tmp_path)
    code, out, err = run_cli("inspect", p)
    assert code == 0, err
    assert "Abs blk/abs" in out and "FRACTAL_NZ" in out and "[3,2,16,16]" in out and "[20,35]" in out
    assert "abs_out:0" in out and out.strip().splitlines()[-1].startswith("operator dump of Abs blk/abs")


def test_layout_convert_picks_the_tensor(tmp_path, run_cli):
    p, x = _nz_dump(tmp_path)
    code, _, err = run_cli("layout", "convert", p, tmp_path / "x.npy", "--tensor", "input:0")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), x)
    code, _, err = run_cli("layout", "convert", p, tmp_path / "x_nz8.npy", "--tensor", "input:0",
                           "--to", "FRACTAL_NZ", "--c0", "8")
    assert code == 0, err
    assert np.load(tmp_path / "x_nz8.npy").shape == (5, 2, 16, 8)
    code, _, err = run_cli("layout", "convert", p, tmp_path / "z.npy")
    assert code == 2 and "--tensor" in err and not (tmp_path / "z.npy").exists()
    code, _, err = run_cli("layout", "convert", p, tmp_path / "z.npy", "--tensor", "output:1")
    assert code == 2 and "no output 1" in err and not (tmp_path / "z.npy").exists()


def _damaged(tmp_path) -> dict[str, tuple[bytes, str]]:
    x = np.zeros((3, 4), np.float32)
    good = dump_bytes("op", [op_input(DT_FLOAT, F_ND, x.shape, x.nbytes)],
                      [op_output(DT_FLOAT, F_ND, x.shape, x.nbytes, name="y")], [x.tobytes(), x.tobytes()])

    def one(tensor):
        return dump_bytes("op", [tensor], [], [b"\0" * 48])

    return {
        "truncated header": (good[:6], "header_len"),
        "header_len too large": (struct.pack("<Q", 1 << 40) + good[8:], "header_len"),
        "sizes over the file": (good[:-10], "size"),
        "unknown dtype": (one(op_input(77, F_ND, (12,), 48)), "input[0].data_type"),
        "unknown format": (one(op_input(DT_FLOAT, 222, (12,), 48)), "input[0].format"),
        "negative dim": (one(op_input(DT_FLOAT, F_ND, (2 ** 64 - 12,), 48)), "input[0].shape"),
        "huge dims": (one(op_input(DT_FLOAT, F_ND, (1 << 30, 1 << 30), 48)), "input[0].size"),
    }


@pytest.mark.parametrize("command", ["inspect", "layout"])
def test_damaged_dumps_are_one_line_exit_2(tmp_path, run_cli, command):
    for case, (raw, field) in _damaged(tmp_path).items():
        p = tmp_path / "Op.op.1.0.1"
        p.write_bytes(raw)
        out_file = tmp_path / "o.npy"
        args = ("inspect", p) if command == "inspect" else ("layout", "convert", p, out_file, "--tensor", "output:0")
        code, out, err = run_cli(*args)
        assert code == 2, (case, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, (case, err)
        assert str(p) in lines[0] and field in lines[0], (case, lines[0])
        assert not out_file.exists()


def test_inspect_json_is_not_written_for_a_damaged_dump(tmp_path, run_cli):
    p = tmp_path / "Op.op.1.0.1"
    p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00short")
    code, _, err = run_cli("inspect", p, "--json", tmp_path / "r.json")
    assert code == 2 and not (tmp_path / "r.json").exists()


# --------------------------------------------------------------------------- ACL: acl.json (stand-in)
def test_acl_dump_passes_acl_json_to_acl_init_standin(acl, tmp_path):
    """Stand-in only: the documented acl.json reaches acl.init, which the stand-in validates."""
    from npu_deploy.runtime.acl import enable_dump

    om = build_om(tmp_path / "m.om", model_name="resnet_dump", inputs=[tensor("x", "float32", [2, 4], "ND")],
                  outputs=[tensor("y", "float32", [2, 4], "ND")])
    cfg = enable_dump(tmp_path / "dumps", om)
    assert acl._core.S.init_config == str(cfg) and acl._standin.violations() == []
    d = json.loads(cfg.read_text())["dump"]
    assert d == {"dump_list": [{"model_name": "resnet_dump"}], "dump_path": str((tmp_path / "dumps").resolve()),
                 "dump_mode": "all", "dump_op_switch": "off"}


def test_standin_refuses_a_bad_acl_json(acl, tmp_path):
    cfg = tmp_path / "acl.json"
    cfg.write_text(json.dumps({"dump": {"dump_list": [{}], "dump_path": "rel/dir", "dump_mode": "most"}}))
    assert acl.init(str(cfg)) == 100000
    assert any("dump_path" in v and "dump_mode" in v for v in acl._standin.violations())


def test_two_dumps_in_one_second_get_their_own_folders(example_onnx, tmp_path, run_cli):
    bundle = tmp_path / "example.bundle"
    npu_deploy.convert(str(example_onnx), output=str(bundle), backend="builtin")
    for _ in range(2):
        code, _, err = run_cli("run", bundle, "--loop", "1", "--warmup", "0", "--dump", tmp_path / "d")
        assert code == 0, err
    folders = dump.find_dump_folders(tmp_path / "d")
    assert len(folders) == 2 and folders[0] != folders[1]
    a, b = (read_dump_folder(f) for f in folders)
    assert len(a) == len(b) > 0 and [d.op_name for d in a] == [d.op_name for d in b]
    with pytest.raises(npu_deploy.errors.InputError, match="already holds dump files"):
        dump.write_dump_folder(folders[0], [])


def test_dump_into_a_file_is_refused(example_onnx, tmp_path, run_cli):
    bundle = tmp_path / "example.bundle"
    npu_deploy.convert(str(example_onnx), output=str(bundle), backend="builtin")
    (tmp_path / "f").write_text("x")
    code, _, err = run_cli("run", bundle, "--loop", "1", "--warmup", "0", "--dump", tmp_path / "f" / "d")
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_run_dump_of_an_onnx_converted_on_the_fly(example_onnx, tmp_path, run_cli):
    code, out, err = run_cli("run", example_onnx, "--backend", "emulator", "--loop", "1", "--warmup", "0",
                             "--dump", tmp_path / "d")
    assert code == 0, err
    (folder,) = dump.find_dump_folders(tmp_path / "d")
    assert folder.parts[-3:] == ("example", "1", "0")
    graph = onnx.load(str(example_onnx)).graph
    dumps = read_dump_folder(folder)
    assert {d.op_name for d in dumps} >= {n.name for n in graph.node if n.op_type == "Conv"}
    code, _, err = run_cli("run", example_onnx, "--backend", "acl", "--dump", tmp_path / "e")
    assert code == 2 and "needs an .om" in err


def test_layout_convert_of_an_nhwc_model_tensor(tmp_path, run_cli):
    from tests.converters.files.test_dump import F_NC1HWC0, nc1hwc0_oracle

    x = np.random.default_rng(1).standard_normal((1, 4, 5, 3)).astype(np.float16)  # NHWC
    phys = nc1hwc0_oracle(x.transpose(0, 3, 1, 2))
    p = tmp_path / "Conv2D.c.1.0.1"
    p.write_bytes(dump_bytes("c", [], [op_output(DT_FLOAT16, F_NC1HWC0, phys.shape, phys.nbytes,
                                                 original_shape=x.shape, name="y", origin_fmt=1)], [phys.tobytes()]))
    code, out, err = run_cli("layout", "convert", p, tmp_path / "y.npy", "--tensor", "output:0")
    assert code == 0 and "NHWC" in out, err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), x)
    code, _, err = run_cli("layout", "convert", p, tmp_path / "y_nchw.npy", "--tensor", "output:0", "--to", "NCHW")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "y_nchw.npy"), x.transpose(0, 3, 1, 2))
    code, _, err = run_cli("layout", "convert", p, tmp_path / "z.npy", "--tensor", "output:0", "--origin", "NCHW")
    assert code == 2 and "--origin" in err and not (tmp_path / "z.npy").exists()


def test_run_dump_on_acl_initialises_with_acl_json_standin(acl, tmp_path, run_cli):
    """Stand-in only: `run X.om --dump DIR` writes DIR/acl.json and ACL is initialised with it."""
    om = build_om(tmp_path / "m.om", model_name="m", inputs=[tensor("x", "float32", [2, 4], "ND")],
                  outputs=[tensor("y", "float32", [2, 4], "ND")])
    acl._standin.set_compute(om, lambda spec, inputs, batch: [inputs["x"]])
    code, out, err = run_cli("run", om, "--loop", "1", "--warmup", "0", "--dump", tmp_path / "d")
    assert code == 0, err
    assert acl._core.S.init_config == str(tmp_path / "d" / "acl.json") and acl._standin.violations() == []
    assert "acl.json" in out
