"""The entry point: version, help on every command, exit codes, one-line errors, --debug tracebacks."""

import subprocess
import sys

import pytest

from npu_deploy.cli.main import COMMANDS


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "npu_deploy.cli.main", *args], capture_output=True,
                          text=True, env=env)


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
