"""The README's Quickstart is executed, so the docs cannot rot.

Command 1 (install + main job) is run here without its `pip install` step — the package under test is
already installed — in a temporary folder, through the real console entry point.
"""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def quickstart_commands() -> list[str]:
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "quickstart_commands.py"), str(REPO / "README.md")],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_quickstart_has_exactly_two_commands():
    cmds = quickstart_commands()
    assert len(cmds) == 2
    assert cmds[0].startswith("pip install ")
    assert "pytest" in cmds[1]


@pytest.mark.slow
def test_quickstart_main_job_runs(tmp_path):
    steps = [shlex.split(s) for s in quickstart_commands()[0].split("&&")]
    assert steps[0][:2] == ["pip", "install"]
    names = [s[0] for s in steps[1:]]
    assert names.count("npu-deploy") >= 3, names
    outputs = []
    for argv in steps[1:]:
        if argv[0] == "python":
            argv = [sys.executable, *[str(REPO / a) if a.endswith(".py") else a for a in argv[1:]]]
        elif argv[0] == "npu-deploy":
            argv = [sys.executable, "-m", "npu_deploy.cli.main", *argv[1:]]
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0, f"{argv}: {proc.stderr[-2000:]}"
        outputs.append(proc.stdout)
    # the main job's three stages each say what they did
    joined = "\n".join(outputs)
    assert "TransData" in joined
    assert "p99" in joined or "P99" in joined
    assert "FormatTrans" in joined
    assert (tmp_path / "example.bundle").is_file()
