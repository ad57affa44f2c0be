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
        assert Path(res.output).exists()
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


def test_the_builtin_lowering_says_clearly_what_to_do_with_a_range(tmp_path, model, run_cli):
    code, _, err = run_cli("convert", model, "--backend", "builtin", "--input_shape", "x:1~4,3,16,16",
                           "-o", tmp_path / "m.bundle")
    assert code == 2 and "x:1~4,3,16,16" in err and "InferenceSession" in err
    assert not (tmp_path / "m.bundle").exists()
