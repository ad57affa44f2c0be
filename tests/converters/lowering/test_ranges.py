"""Shape ranges (issue 24): ``--input_shape "x:1~4,3,16,16"`` (ATC >= 8.5) and ``-1`` with
``--input_shape_range`` (older ATC), given to ATC the way its installed version expects. ATC is the
stand-in ``tests/standins/atc`` behind a fake toolkit (``compiler/bin/atc`` + ``compiler/version.info``);
the stand-in refuses ``~`` in ``--input_shape`` before 8.5, as that ATC does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npu_deploy.converters.lowering.atc import installed_version, run_atc
from npu_deploy.converters.lowering.convert import convert
from npu_deploy.errors import AtcError, InputError
from tests.runtime.test_session_dynamic import small_cnn

STANDIN = Path(__file__).resolve().parents[2] / "standins" / "atc"


def toolkit(tmp_path: Path, version: str) -> Path:
    home = tmp_path / f"cann-{version}"
    (home / "compiler" / "bin").mkdir(parents=True)
    (home / "compiler" / "version.info").write_text(f"Version={version}\nversion_dir=8.x\n")
    exe = home / "compiler" / "bin" / "atc"
    exe.symlink_to(STANDIN)
    return exe


@pytest.fixture
def model(tmp_path):
    return small_cnn(tmp_path / "dyn.onnx")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)


def _argv(path: Path) -> list[str]:
    return json.loads(path.read_text())


@pytest.mark.parametrize("version, shape_flag, range_flag", [
    ("8.5.0", "--input_shape=x:1~4,3,16,16", None),
    ("7.0.0", "--input_shape=x:-1,3,16,16", "--input_shape_range=x:[1~4,3,16,16]"),
])
def test_atc_gets_the_range_in_its_versions_spelling(tmp_path, model, monkeypatch, version, shape_flag, range_flag):
    exe = toolkit(tmp_path, version)
    assert installed_version(exe) == tuple(int(v) for v in version.split(".")[:2])
    rec = tmp_path / "argv.json"
    monkeypatch.setenv("ATC_STANDIN_ARGV", str(rec))
    for shapes in ({"x": "1~4,3,16,16"}, {"x": [(1, 4), 3, 16, 16]}):
        res = convert(model, tmp_path / "m.om", backend="atc", atc=exe, input_shapes=shapes)
        assert Path(res.output).exists() and res.dynamic["ranges"] == {"x": [[1, 4], 3, 16, 16]}
        argv = _argv(rec)
        assert shape_flag in argv
        assert [a for a in argv if a.startswith("--input_shape_range")] == ([range_flag] if range_flag else [])
        Path(res.output).unlink()
    # the older spelling given by the user: the same ATC line
    res = convert(model, tmp_path / "m.om", backend="atc", atc=exe, input_shapes={"x": (-1, 3, 16, 16)},
                  shape_ranges={"x": ((1, 4), None, None, None)})
    assert shape_flag in _argv(rec)


def test_the_standin_refuses_a_tilde_range_before_8_5(tmp_path, model):
    exe = toolkit(tmp_path, "7.0.0")
    with pytest.raises(AtcError, match="E10002"):
        run_atc([str(exe), f"--model={model}", "--framework=5", f"--output={tmp_path / 'o'}",
                 "--soc_version=Ascend310P3", "--input_shape=x:1~4,3,16,16"], log_dir=tmp_path / "l")


def test_cli_takes_both_spellings(tmp_path, model, run_cli, monkeypatch):
    exe = toolkit(tmp_path, "8.5.0")
    rec = tmp_path / "argv.json"
    monkeypatch.setenv("ATC_STANDIN_ARGV", str(rec))
    code, out, err = run_cli("convert", model, "--backend", "atc", "--atc", exe, "-o", tmp_path / "a.om",
                             "--input_shape", "x:1~4,3,16,16")
    assert code == 0, err
    assert "--input_shape=x:1~4,3,16,16" in _argv(rec)
    code, out, err = run_cli("convert", model, "--backend", "atc", "--atc", exe, "-o", tmp_path / "b.om",
                             "--input_shape", "x:-1,3,16,16", "--input_shape_range", "x:[1~4,3,16,16]")
    assert code == 0, err
    assert "--input_shape=x:1~4,3,16,16" in _argv(rec)


def test_bad_ranges_and_ranges_with_gears_are_exit_2(tmp_path, model, run_cli):
    code, _, err = run_cli("convert", model, "--backend", "builtin", "--input_shape", "x:4~1,3,16,16")
    assert code == 2 and "4~1" in err and "Traceback" not in err
    code, _, err = run_cli("convert", model, "--backend", "builtin", "--input_shape", "x:1~4,3,16,16",
                           "--dynamic-batch", "1,4")
    assert code == 2 and "cannot be combined with gears" in err
    with pytest.raises(InputError, match="ATC rejects shape ranges together with dynamic gears"):
        from npu_deploy.converters.lowering.atc import build_atc_argv

        build_atc_argv(model, tmp_path / "o", soc="Ascend310P3", input_shapes={"x": (-1, 3, 16, 16)},
                       dynamic_batch=[1, 4], shape_ranges={"x": ((1, 4), None, None, None)}, check_files=False)


def test_the_builtin_lowering_plans_a_range_and_the_bundle_runs_any_shape_inside(tmp_path, model, run_cli):
    import numpy as np
    import onnxruntime as ort

    from npu_deploy import InferenceSession

    out = tmp_path / "m.bundle"
    code, stdout, err = run_cli("convert", model, "--backend", "builtin", "--input_shape", "x:1~4,3,16,16",
                                "-o", out, "--no-preflight")
    assert code == 0, err
    assert "at the smallest shape" in stdout and "at the largest" in stdout  # cost at both ends
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    with InferenceSession(out) as s:
        (inp,) = s.get_inputs()
        assert inp.shape[0] == "batch" and inp.nbytes == 4 * 3 * 16 * 16 * 4  # buffers for the largest
        for b in (1, 2, 3, 4):
            x = np.random.default_rng(b).standard_normal((b, 3, 16, 16)).astype(np.float32)
            (y,) = s.run(None, {"x": x})
            np.testing.assert_allclose(y, ref.run(None, {"x": x})[0], rtol=1e-2, atol=1e-2)
        with pytest.raises(InputError, match=r"input 'x'.*outside the range 1~4,3,16,16"):
            s.run(None, {"x": np.zeros((5, 3, 16, 16), np.float32)})
    np.save(tmp_path / "x5.npy", np.zeros((5, 3, 16, 16), np.float32))
    code, _, err = run_cli("run", out, "--input", f"x={tmp_path / 'x5.npy'}")
    assert code == 2 and "input 'x'" in err and "1~4,3,16,16" in err and "Traceback" not in err
    code, stdout, _ = run_cli("inspect", out)
    assert code == 0 and "range: x:1~4,3,16,16" in stdout
    # the older spelling plans the same bundle
    old = tmp_path / "old.bundle"
    code, _, err = run_cli("convert", model, "--backend", "builtin", "--input_shape", "x:-1,3,16,16",
                           "--input_shape_range", "x:[1~4,3,16,16]", "-o", old, "--no-preflight")
    assert code == 0, err
    assert old.read_bytes() == out.read_bytes()


def test_an_unbounded_range_needs_atc(tmp_path, model, run_cli):
    code, _, err = run_cli("convert", model, "--backend", "builtin", "--input_shape", "x:1~-1,3,16,16",
                           "-o", tmp_path / "m.bundle")
    assert code == 2 and "upper bound" in err and not (tmp_path / "m.bundle").exists()


@pytest.mark.realmodel
def test_real_ppocr_cls_with_a_batch_range(real_model, tmp_path):
    import numpy as np
    import onnxruntime as ort

    from npu_deploy import InferenceSession

    path = real_model("ppocr_cls")
    res = convert(path, tmp_path / "cls.bundle", backend="builtin", input_shapes={"x": "1~6,3,48,192"})
    assert res.dynamic["mode"] == "range" and res.dynamic["ranges"] == {"x": [[1, 6], 3, 48, 192]}
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with InferenceSession(res.output) as s:
        for b in (1, 5):
            x = np.random.default_rng(b).random((b, 3, 48, 192), dtype=np.float32)
            (y,) = s.run(None, {"x": x})
            r = ref.run(None, {"x": x})[0]
            np.testing.assert_allclose(y, r, atol=2e-2)
