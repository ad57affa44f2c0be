"""``npu-deploy debug compare`` / ``debug precision`` through the real entry point."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from npu_deploy.converters.files import dump as dumpfmt
from tests.conftest import TEST_TIMEOUT

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
SQUEEZENET = LIGHT / "light_squeezenet.onnx"


@pytest.fixture(scope="module")
def cls_run(real_model, tmp_path_factory):
    """PP-OCR cls converted with force_fp16 and run with ``run --dump`` (the real entry point)."""
    from npu_deploy.cli.main import main

    d = tmp_path_factory.mktemp("cls")
    src = real_model("ppocr_cls")
    bundle = d / "cls.bundle"
    x = np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32)
    np.save(d / "x.npy", x)
    assert main(["convert", str(src), "-o", str(bundle), "--backend", "builtin", "--precision-mode", "force_fp16",
                 "--input-shape", "x:1,3,48,192"]) == 0
    assert main(["run", str(bundle), "--input", f"x={d / 'x.npy'}", "--dump", str(d / "dumps"), "--loop", "1"]) == 0
    return src, bundle, d


@pytest.mark.realmodel
@pytest.mark.slow
def test_compare_run_dump_passes_and_writes_every_report(cls_run, run_cli, tmp_path):
    src, bundle, d = cls_run
    code, out, err = run_cli("debug", "compare", src, d / "dumps", "--bundle", bundle, "--input", f"x={d / 'x.npy'}",
                             "--csv", tmp_path / "r.csv", "--json", tmp_path / "r.json", "--html", tmp_path / "r.html")
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith("PASS")
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["schema"] == "npu-deploy/debug-compare" and doc["ok"] is True
    n_files = len(dumpfmt.read_dump_folder(d / "dumps"))
    assert len(doc["rows"]) == n_files        # every op of this model has exactly one output
    assert (tmp_path / "r.csv").read_text().startswith("OpType,NPUDump,DataType,Address,GroundTruth")
    assert "<svg" in (tmp_path / "r.html").read_text()


@pytest.mark.realmodel
@pytest.mark.slow
def test_compare_beyond_tolerance_exits_1_naming_the_first_divergent_node(cls_run, run_cli):
    src, bundle, d = cls_run
    code, out, err = run_cli("debug", "compare", src, d / "dumps", "--bundle", bundle, "--input", f"x={d / 'x.npy'}",
                             "--cosine-min", "0.99999")
    assert code == 1, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("FAIL") and "first divergent: node '" in last
    assert any(line.startswith("first divergent:") for line in out.splitlines())


def test_bad_dump_folders_are_one_line_exit_2(run_cli, tmp_path, example_onnx):
    empty = tmp_path / "empty"
    empty.mkdir()
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 3, 64, 64), np.float32))
    cases = []
    cases.append(run_cli("debug", "compare", example_onnx, empty, "--inputs", tmp_path / "in.npz"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "Conv.conv1.1.0.1700000000000000").write_bytes((10**6).to_bytes(8, "little") + b"\x0a\x01")
    cases.append(run_cli("debug", "compare", example_onnx, bad, "--inputs", tmp_path / "in.npz"))
    cases.append(run_cli("debug", "compare", example_onnx, tmp_path / "missing", "--inputs", tmp_path / "in.npz"))
    cases.append(run_cli("debug", "compare", example_onnx, empty))   # no inputs anywhere
    for code, out, err in cases:
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("npu-deploy: error:"), err
        assert "Traceback" not in err
    assert "Conv.conv1.1.0.1700000000000000" in cases[1][2]    # the damaged file is named


@pytest.mark.slow
def test_precision_cfg_is_taken_by_convert_and_passes_compare(run_cli, tmp_path):
    cfg = tmp_path / "keep_dtype.cfg"
    code, out, err = run_cli("debug", "precision", SQUEEZENET, "-o", cfg, "--json", tmp_path / "p.json")
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith("PASS")
    keep = cfg.read_text().splitlines()
    assert keep and not (tmp_path / "keep_dtype.cfg.checkpoint.json").exists()   # removed when complete
    bundle = tmp_path / "sq.bundle"
    code, out, err = run_cli("convert", SQUEEZENET, "-o", bundle, "--backend", "builtin",
                             "--precision-mode", "force_fp16", "--keep-dtype", cfg)
    assert code == 0, err
    code, out, err = run_cli("compare", SQUEEZENET, bundle, "--seed", "4")
    assert code == 0, out + err


# The real CLI, with its fourth evaluation held until the test's Ctrl-C arrives: the signal lands
# mid-search however fast or loaded the machine is (a search that finished first would exit 0, not 130).
# SIGINT is set back to Python's default first, as in a terminal: a test run started in the background
# (nohup, a CI job) ignores it, and the CLI rightly keeps an ignored SIGINT ignored.
_HOLD_FOURTH_EVALUATION = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from npu_deploy.runtime.check import precision
real, calls = precision.PrecisionSearch._run, []
def held(self, keep):
    calls.append(keep)
    if len(calls) == 4:
        time.sleep(3600)  # interrupted by the test's SIGINT
    return real(self, keep)
precision.PrecisionSearch._run = held
from npu_deploy.cli.main import main
main()
"""


@pytest.mark.slow
def test_precision_ctrl_c_prints_what_it_has_and_keeps_the_checkpoint(tmp_path):
    cfg = tmp_path / "keep.cfg"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_FOURTH_EVALUATION, "debug", "precision", str(SQUEEZENET),
                             "-o", str(cfg), "--progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    lines = []
    deadline = time.monotonic() + TEST_TIMEOUT
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("[3]"):
            proc.send_signal(signal.SIGINT)
            break
    try:
        out, rest = proc.communicate(timeout=TEST_TIMEOUT)
    finally:
        if proc.poll() is None:  # a hang: leave no process behind
            proc.kill()
            proc.communicate()
    err = "".join(lines) + rest
    assert proc.returncode == 130, err
    assert "keep in float32" in out                      # what it had when stopped
    assert "re-run the same command to resume" in err
    ck = tmp_path / "keep.cfg.checkpoint.json"
    assert ck.is_file() and len(json.loads(ck.read_text())["evaluations"]) >= 3
    assert not cfg.exists()                               # no half-done keep list
    assert "Traceback" not in err


@pytest.mark.slow
def test_docs_workflow_runs_as_written(run_cli, tmp_path, monkeypatch):
    """docs/debug.md's console block, command by command, through the real entry point."""
    from tests.conftest import REPO, write_example

    text = (REPO / "docs" / "debug.md").read_text(encoding="utf-8")
    block = text.split("```console", 1)[1].split("```", 1)[0]
    commands = [line[2:].split() for line in block.splitlines() if line.startswith("$ ")]
    assert len(commands) >= 5 and all(c[0] == "npu-deploy" for c in commands)
    monkeypatch.chdir(tmp_path)
    write_example(tmp_path / "model.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32))
    for argv in commands:
        code, out, err = run_cli(*argv[1:])
        assert code == 0, (argv, out[-2000:], err)
    assert (tmp_path / "report.html").is_file() and (tmp_path / "keep_dtype.cfg").read_text().strip()


def test_run_dump_keeps_its_inputs_for_debug_compare(run_cli, example_onnx, tmp_path):
    """run --dump saves the feeds of the dumped run (inputs.npz beside the dump files), so that
    debug compare's golden run uses exactly them without being told."""
    bundle = tmp_path / "m.bundle"
    code, _, err = run_cli("convert", example_onnx, "-o", bundle, "--backend", "builtin", "-q")
    assert code == 0, err
    code, out, err = run_cli("run", bundle, "--dump", tmp_path / "d", "--loop", "1")
    assert code == 0, err
    (npz,) = list((tmp_path / "d").rglob("inputs.npz"))
    assert np.load(npz)["x"].shape == (1, 3, 64, 64)
    code, out, err = run_cli("debug", "compare", example_onnx, tmp_path / "d", "--bundle", bundle)
    assert code == 0, (out, err)
    assert "PASS" in out.splitlines()[-1]
