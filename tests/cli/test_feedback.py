"""No long silence on a terminal, nothing extra in a pipe: the real ``npu-deploy`` executable under a
pseudo-terminal and under pipes (cli/feedback.py)."""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_example

EXE = shutil.which("npu-deploy") or str(Path(sys.executable).parent / "npu-deploy")
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _on_a_terminal(argv: list[str], cwd: Path) -> list[tuple[float, bytes]]:
    """Run ``argv`` with stdout and stderr on a pty; return (seconds since start, bytes) chunks."""
    import pty

    t0 = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once, nothing else
        os.chdir(cwd)
        os.execv(argv[0], argv)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:   # the child closed the pty
                    break
                if not data:
                    break
                chunks.append((time.perf_counter() - t0, data))
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    return chunks


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pty")
def test_convert_shows_a_stage_line_before_the_heavy_imports(tmp_path):
    src = write_example(tmp_path / "e.onnx")
    chunks = _on_a_terminal([EXE, "convert", str(src), "-o", str(tmp_path / "e.bundle")], tmp_path)
    text = [ANSI.sub(b"", c).decode("utf-8", "replace") for _, c in chunks]
    first = next(k for k, t in enumerate(text) if t.strip())
    # the first thing on the terminal is the stage line, before any result …
    assert "convert: loading" in text[first], text[first]
    # … shown while the command module (onnx, onnxruntime, the planner) loads, before the pipeline's
    # own stages and the results
    full = "".join(text)
    assert full.index("convert: loading") < full.index("backend:")


def test_pipes_get_no_stage_lines_and_no_control_characters(tmp_path):
    src = write_example(tmp_path / "e.onnx")
    p = subprocess.run([EXE, "convert", str(src), "-o", str(tmp_path / "e.bundle")], capture_output=True,
                       cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    for stream in (p.stdout, p.stderr):
        assert b"\x1b" not in stream and b"\r" not in stream and b"loading" not in stream
    assert p.stdout.decode().splitlines()[0].startswith("backend: builtin")
