"""`profile run`: the emulator path on a real model, and the msprof path against a stand-in msprof.

The stand-in enforces what npu-deploy relies on: options in ``--name=value`` form before the
application, ``--output=DIR`` present, the application given as separate arguments (no shell), and it
writes a ``PROF_*`` folder under ``--output`` as msprof does (reference/msprof.md §1.1).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap

import pytest

from npu_deploy.profiling.run import make_feeds, msprof_command
from tests.profiling.helpers import flagged_rows, write_csv

STANDIN = textwrap.dedent('''\
    #!{python}
    import json, os, shutil, sys
    args = sys.argv[1:]
    opts = []
    while args and args[0].startswith("--"):
        opts.append(args.pop(0))
    app = args
    bad = [o for o in opts if "=" not in o]
    out = [o.split("=", 1)[1] for o in opts if o.startswith("--output=")]
    if bad or not out or not app or not os.path.isfile(app[0]):
        print("msprof: invalid arguments", opts, app, file=sys.stderr)
        sys.exit(1)
    with open({record!r}, "w") as f:
        json.dump({{"opts": opts, "app": app}}, f)
    prof = os.path.join(out[0], "PROF_000001_20250101120000000_STANDIN")
    dst = os.path.join(prof, "mindstudio_profiler_output")
    os.makedirs(dst)
    shutil.copy({fixture!r}, os.path.join(dst, "op_summary_20250101120000.csv"))
''')


@pytest.fixture
def fake_msprof(tmp_path, monkeypatch):
    fixture = write_csv(tmp_path / "fixture" / "op_summary.csv", flagged_rows())
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "msprof_args.json"
    exe = bindir / "msprof"
    exe.write_text(STANDIN.format(python=sys.executable, record=str(record), fixture=str(fixture)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    return record


def test_msprof_command_is_an_argument_list():
    cmd = msprof_command("/usr/local/bin/msprof", "/tmp/out dir", ["python3", "-m", "x", "a b.om"])
    assert cmd[:4] == ["/usr/local/bin/msprof", "--output=/tmp/out dir", "--task-time=l1",
                       "--aic-metrics=PipeUtilization"]
    assert cmd[-1] == "a b.om"


def test_run_under_msprof_standin(run_cli, fake_msprof, tmp_path):
    model = tmp_path / "my model.om"       # a space: only an argument list keeps it one argument
    model.write_bytes(b"IMOD" + bytes(252))
    out = tmp_path / "prof"
    code, stdout, err = run_cli("profile", "run", model, "-o", out, "--loops", "3", "--", "--device", "1")
    assert code == 0, err
    rec = json.loads(fake_msprof.read_text())
    assert rec["opts"][0] == f"--output={out}"
    assert rec["app"][1:5] == ["-m", "npu_deploy.cli.main", "run", str(model)]
    assert rec["app"][-2:] == ["--device", "1"] and "--loop" in rec["app"]
    first = stdout.splitlines()[0]
    assert first == "FormatTrans 17.0 % of device compute (threshold 8 %): FLAGGED"  # measured, not estimated


def test_make_feeds_fills_dynamic_dims():
    import numpy as np

    class M:
        def __init__(self, name, shape, dtype):
            self.name, self.shape, self.dtype = name, shape, np.dtype(dtype)

    feeds = make_feeds([M("x", (-1, 3, -1, -1), "float32"), M("ids", (-1, 128), "int64"), M("m", (2,), "bool")],
                       shapes={"x": (2, 3, 8, 8)}, gears=[{"ids": (4, 128)}])
    assert feeds["x"].shape == (2, 3, 8, 8) and feeds["x"].dtype == np.float32
    assert feeds["ids"].shape == (4, 128) and set(np.unique(feeds["ids"])) <= {0, 1}
    assert feeds["m"].dtype == bool


def _emulator_ready() -> str | None:
    try:
        import npu_deploy.converters.lowering.convert  # noqa: F401
        import npu_deploy.runtime.session  # noqa: F401
    except Exception as e:  # the converter / runtime engineers' modules
        return f"convert or runtime not importable: {e}"
    return None


@pytest.mark.realmodel
def test_run_on_emulator_real_model(run_cli, real_model, tmp_path, monkeypatch):
    why = _emulator_ready()
    if why:
        pytest.xfail(why)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no msprof here
    model = real_model("ppocr_cls")
    out = tmp_path / "prof"
    j = tmp_path / "r.json"
    code, stdout, err = run_cli("profile", "run", model, "--input-shape", "x:1,3,48,192", "-o", out,
                                "--json", j)
    assert code == 0, err
    first = stdout.splitlines()[0]
    assert first.endswith("(estimated by the emulator's cost model)") and first.startswith("FormatTrans ")
    d = json.loads(j.read_text())
    assert d["estimated"] is True and d["compute_ops"] > 50     # 53 Conv and more in this model
    profs = list(out.glob("PROF_*/mindstudio_profiler_output/op_summary_*.csv"))
    assert len(profs) == 1
    assert not [p for p in out.iterdir() if p.name.startswith(".npu-deploy-profile-")]  # temp bundle removed


def test_failed_emulator_profile_leaves_no_empty_folder(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from npu_deploy.errors import ModelError
    from npu_deploy.profiling.run import profile_on_emulator

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "dyn.onnx")
    with pytest.raises(ModelError, match="dynamic dimensions"):
        profile_on_emulator(tmp_path / "dyn.onnx", tmp_path / "new" / "prof")
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()  # a folder the user made stays
    with pytest.raises(ModelError):
        profile_on_emulator(tmp_path / "dyn.onnx", tmp_path / "mine")
    assert (tmp_path / "mine").is_dir()
