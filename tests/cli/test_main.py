"""The entry point: version, help on every command, exit codes, one-line errors, --debug tracebacks."""

import subprocess
import sys
import tempfile

import pytest

from npu_deploy.cli.main import COMMANDS
from tests.conftest import TEST_TIMEOUT


def _run(*args, env=None):
    # cwd outside the tree: "python -m" puts the working folder first on sys.path, which would hide an
    # installed (non-editable) package behind the repository's partial npu_deploy/ folder
    return subprocess.run([sys.executable, "-m", "npu_deploy.cli.main", *args], capture_output=True,
                          text=True, env=env, cwd=tempfile.gettempdir())


def test_version(run_cli):
    import npu_deploy

    code, out, _ = run_cli("--version")
    assert code == 0 and npu_deploy.__version__ in out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_on_every_command(run_cli, name):
    code, out, err = run_cli(name, "--help")
    assert code == 0, err
    assert "Usage:" in out


def test_unknown_command_is_usage_error(run_cli):
    code, _, err = run_cli("frobnicate")
    assert code == 2
    assert "No such command" in err


def test_bad_input_is_one_line_without_traceback(tmp_path):
    missing = tmp_path / "nope.onnx"
    proc = _run("inspect", str(missing))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert str(missing.name) in proc.stderr


def test_debug_shows_traceback(tmp_path):
    proc = _run("--debug", "inspect", str(tmp_path / "nope.onnx"))
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr


@pytest.mark.parametrize("args, command", [(["run"], "run"), (["run", "m.bundle", "--loop"], "run"),
                                           (["inspect", "x", "--frobnicate"], "inspect"),
                                           (["layout", "info", "NC1HWC0", "--c0", "x"], "layout info"),
                                           (["frobnicate"], None)])
def test_usage_errors_are_one_line_that_points_at_help(run_cli, args, command):
    code, out, err = run_cli(*args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("npu-deploy: error: "), err
    assert lines[0].endswith(f"(see 'npu-deploy {command} --help')" if command else "(see 'npu-deploy --help')")


def test_help_documents_the_exit_code_of_a_signal(run_cli):
    code, out, _ = run_cli("--help")
    assert code == 0 and "130" in out and "143" in out


def test_escape_sequences_in_error_messages_are_escaped(run_cli, tmp_path):
    bad = tmp_path / "a\x1b[2Jb.onnx"
    code, _, err = run_cli("inspect", bad)
    assert code == 2 and "\x1b" not in err and "\\x1b[2J" in err


@pytest.mark.realmodel
@pytest.mark.slow
def test_sigterm_during_convert_exits_143_and_leaves_no_temporary(real_model, tmp_path):
    """A 59 MB bundle is being written when SIGTERM arrives: the .part file must go, as with Ctrl-C."""
    import os
    import signal
    import time

    model = real_model("minilm")
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "npu_deploy.cli.main", "convert", str(model), "-o",
                             str(out / "m.bundle"), "-q", "--input-shape",
                             "input_ids:1,128;attention_mask:1,128"], stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path,
                            # a job started in the background may inherit SIGTERM ignored: undo that
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    deadline = time.monotonic() + TEST_TIMEOUT
    while not any(p.name.endswith(".part") for p in out.iterdir()):
        if proc.poll() is not None:
            pytest.skip("the bundle was written before the test could see its temporary file")
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=TEST_TIMEOUT)
    assert proc.returncode == 143, err
    assert "SIGTERM" in err and "Traceback" not in err
    assert list(out.iterdir()) == []
