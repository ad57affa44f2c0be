"""A corpus of bad inputs per command, through the real entry point.

Every case must end with a documented exit code (1 check failed, 2 bad usage or input, 3 environment,
e.g. a full disk), exactly one stderr line starting ``npu-deploy: error:``, no traceback, no file left
behind (no output, no ``.part`` temporary), and every input byte-for-byte as it was.

``{d}`` is a folder of test material (shared by the module, never to be modified), ``{w}`` an empty work
folder per case, ``{f}`` a real full file system (a 64 KiB tmpfs, filled; cases needing it are skipped
where it cannot be mounted).
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import write_example
from tests.fullfs import full_fs  # noqa: F401  (fixture)

HUGE = "99999999999999999999999"


def _lying_npy() -> bytes:
    """193 bytes whose header claims 10**15 float32 elements."""
    h = io.BytesIO()
    np.lib.format.write_array_header_1_0(h, {"descr": "<f4", "fortran_order": False, "shape": (10**15,)})
    return h.getvalue() + b"\0" * (193 - len(h.getvalue()))


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    from npu_deploy.cli.main import main

    d = tmp_path_factory.mktemp("material")
    write_example(d / "example.onnx")
    os.link(d / "example.onnx", d / "example_link.onnx")
    assert main(["convert", str(d / "example.onnx"), "-o", str(d / "ex.bundle"), "-q"]) == 0
    os.link(d / "ex.bundle", d / "ex_link.bundle")
    raw = (d / "ex.bundle").read_bytes()
    (d / "trunc.bundle").write_bytes(raw[: len(raw) // 2])
    onnx_raw = (d / "example.onnx").read_bytes()
    (d / "trunc.onnx").write_bytes(onnx_raw[: len(onnx_raw) // 2])
    for name in ("empty.onnx", "empty.bundle", "empty.npy", "empty.npz", "empty.csv"):
        (d / name).write_bytes(b"")
    garbage = np.random.default_rng(0).bytes(3000)
    for name in ("garbage.onnx", "garbage.bundle", "garbage.bin", "garbage.npz", "garbage.csv"):
        (d / name).write_bytes(garbage)
    x = np.random.default_rng(1).random((1, 3, 64, 64), dtype=np.float32)
    np.save(d / "x.npy", x)
    (d / "huge.npy").write_bytes(_lying_npy())
    np.save(d / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(d / "lie.npz", "w") as z:
        z.writestr("x.npy", _lying_npy())
    (d / "outdir").mkdir()
    np.save(d / "outdir" / "probs.npy", x)  # an input that sits where the output `probs` would go
    (d / "kernel_details.csv").write_text(
        "Name,Type,Accelerator Core,Start Time(us),Duration(us),Input Shapes,Input Data Types,Input Formats,"
        "Output Shapes,Output Data Types,Output Formats\n"
        'conv1,Conv2D,AI_CORE,0,10,"1,3,8,8",FLOAT16,NC1HWC0,"1,3,8,8",FLOAT16,NC1HWC0\n'
        'trans_TransData_1,TransData,AI_VECTOR_CORE,10,2,"1,3,8,8",FLOAT16,NCHW,"1,1,8,8,16",FLOAT16,NC1HWC0\n')
    return d


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) with a hash of its content."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


EX = ["--from", "NCHW", "--to", "NC1HWC0"]

# (id, argv with {d} {w} {f}, allowed exit codes)
CASES = [
    # ---- convert
    ("convert-missing", ["convert", "{d}/nope.onnx", "-o", "{w}/o.bundle"], {2}),
    ("convert-empty", ["convert", "{d}/empty.onnx", "-o", "{w}/o.bundle"], {2}),
    ("convert-garbage", ["convert", "{d}/garbage.onnx", "-o", "{w}/o.bundle"], {2}),
    ("convert-truncated", ["convert", "{d}/trunc.onnx", "-o", "{w}/o.bundle"], {2}),
    ("convert-wrong-kind", ["convert", "{d}/x.npy", "-o", "{w}/o.bundle"], {2}),
    ("convert-huge-dims", ["convert", "{d}/example.onnx", "--input-shape", f"x:{HUGE},3,64,64", "-o",
                           "{w}/o.bundle"], {2}),
    ("convert-output-is-input", ["convert", "{d}/example.onnx", "-o", "{d}/example.onnx"], {2}),
    ("convert-output-is-hard-link", ["convert", "{d}/example.onnx", "-o", "{d}/example_link.onnx"], {2}),
    ("convert-report-is-input", ["convert", "{d}/example.onnx", "-o", "{w}/o.bundle", "--report",
                                 "{d}/example.onnx"], {2}),
    ("convert-no-folder", ["convert", "{d}/example.onnx", "-o", "{w}/no/such/o.bundle"], {2}),
    ("convert-bad-option", ["convert", "{d}/example.onnx", "--precision-mode", "nope"], {2}),
    ("convert-output-disk-full", ["convert", "{d}/example.onnx", "-o", "{f}/o.bundle"], {3}),
    ("convert-report-disk-full", ["convert", "{d}/example.onnx", "-o", "{w}/o.bundle", "--report", "{f}/r.json"],
     {3}),
    # ---- run
    ("run-missing", ["run", "{d}/nope.bundle"], {2}),
    ("run-empty", ["run", "{d}/empty.bundle"], {2}),
    ("run-garbage", ["run", "{d}/garbage.bundle"], {2}),
    ("run-truncated", ["run", "{d}/trunc.bundle"], {2}),
    ("run-wrong-kind", ["run", "{d}/huge.npy"], {2}),  # an .onnx runs now (converted in memory)
    ("run-input-missing", ["run", "{d}/ex.bundle", "--input", "x={d}/nope.npy"], {2}),
    ("run-input-empty-npy", ["run", "{d}/ex.bundle", "--input", "x={d}/empty.npy"], {2}),
    ("run-input-huge-npy", ["run", "{d}/ex.bundle", "--input", "x={d}/huge.npy"], {2}),
    ("run-input-pickle", ["run", "{d}/ex.bundle", "--input", "x={d}/obj.npy"], {2}),
    ("run-input-bin-size", ["run", "{d}/ex.bundle", "--input", "x={d}/garbage.bin"], {2}),
    ("run-huge-shape", ["run", "{d}/ex.bundle", "--input-shape", f"x:{HUGE},3,64,64"], {2}),
    ("run-loop-zero", ["run", "{d}/ex.bundle", "--loop", "0"], {2}),
    ("run-json-is-model", ["run", "{d}/ex.bundle", "--loop", "1", "--json", "{d}/ex.bundle"], {2}),
    ("run-json-is-input", ["run", "{d}/ex.bundle", "--input", "x={d}/x.npy", "--json", "{d}/x.npy"], {2}),
    ("run-output-over-input", ["run", "{d}/ex.bundle", "--loop", "1", "--input", "x={d}/outdir/probs.npy",
                               "--output", "{d}/outdir"], {2}),
    ("run-json-disk-full", ["run", "{d}/ex.bundle", "--loop", "1", "--json", "{f}/r.json"], {3}),
    ("run-output-disk-full", ["run", "{d}/ex.bundle", "--loop", "1", "--output", "{f}/out"], {3}),
    ("run-json-fails-after-outputs", ["run", "{d}/ex.bundle", "--loop", "1", "--output", "{w}/out", "--json",
                                      "{f}/r.json"], {3}),
    # ---- compare
    ("compare-atol-nan", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--atol", "nan"], {2}),
    ("compare-atol-inf", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--atol", "inf"], {2}),
    ("compare-atol-negative", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--atol", "-1e-3"], {2}),
    ("compare-rtol-nan", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--rtol", "nan"], {2}),
    ("compare-cosine-nan", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--cosine-min", "nan"], {2}),
    ("compare-max-outside-nan", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--max-outside", "nan"], {2}),
    ("compare-reference-missing", ["compare", "{d}/nope.onnx", "{d}/ex.bundle"], {2}),
    ("compare-reference-garbage", ["compare", "{d}/garbage.onnx", "{d}/ex.bundle"], {2}),
    ("compare-target-truncated", ["compare", "{d}/example.onnx", "{d}/trunc.bundle"], {2}),
    ("compare-load-empty-npz", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--load-inputs", "{d}/empty.npz"],
     {2}),
    ("compare-load-garbage-npz", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--load-inputs",
                                  "{d}/garbage.npz"], {2}),
    ("compare-load-lying-npz", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--load-inputs", "{d}/lie.npz"],
     {2}),
    ("compare-input-huge-npy", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--input", "x={d}/huge.npy"],
     {2}),
    ("compare-save-is-reference", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--save-inputs",
                                   "{d}/example.onnx"], {2}),
    ("compare-json-is-target", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--json", "{d}/ex.bundle"], {2}),
    ("compare-save-disk-full", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--save-inputs", "{f}/in.npz"],
     {3}),
    ("compare-json-fails-after-save", ["compare", "{d}/example.onnx", "{d}/ex.bundle", "--save-inputs",
                                       "{w}/in.npz", "--json", "{f}/c.json"], {3}),
    # ---- inspect
    ("inspect-missing", ["inspect", "{d}/nope.onnx"], {2}),
    ("inspect-empty", ["inspect", "{d}/empty.onnx"], {2}),
    ("inspect-garbage", ["inspect", "{d}/garbage.bundle"], {2}),
    ("inspect-truncated", ["inspect", "{d}/trunc.bundle"], {1, 2}),
    ("inspect-json-is-file", ["inspect", "{d}/ex.bundle", "--json", "{d}/ex.bundle"], {2}),
    ("inspect-json-is-hard-link", ["inspect", "{d}/ex.bundle", "--json", "{d}/ex_link.bundle"], {2}),
    ("inspect-json-disk-full", ["inspect", "{d}/ex.bundle", "--json", "{f}/i.json"], {3}),
    # ---- layout
    ("layout-convert-onto-itself", ["layout", "convert", "{d}/x.npy", "{d}/x.npy", *EX], {2}),
    ("layout-convert-onto-hard-link", ["layout", "convert", "{d}/example.onnx", "{d}/example_link.onnx", *EX],
     {2}),
    ("layout-convert-empty-npy", ["layout", "convert", "{d}/empty.npy", "{w}/o.npy", *EX], {2}),
    ("layout-convert-huge-npy", ["layout", "convert", "{d}/huge.npy", "{w}/o.npy", "--from", "ND", "--to",
                                 "FRACTAL_NZ"], {2}),
    ("layout-convert-pickle", ["layout", "convert", "{d}/obj.npy", "{w}/o.npy", "--from", "ND", "--to",
                               "FRACTAL_NZ"], {2}),
    ("layout-convert-garbage-bin", ["layout", "convert", "{d}/garbage.bin", "{w}/o.npy", "--from", "NC1HWC0",
                                    "--to", "NCHW", "--shape", "1,3,8,8", "--dtype", "float16"], {2}),
    ("layout-convert-huge-shape", ["layout", "convert", "{d}/garbage.bin", "{w}/o.npy", "--from", "NC1HWC0",
                                   "--to", "NCHW", "--shape", f"{HUGE},3,8,8", "--dtype", "float16"], {2}),
    ("layout-info-huge-shape", ["layout", "info", "NC1HWC0", "--shape", f"{HUGE},3,4,5"], {2}),
    ("layout-info-unknown-format", ["layout", "info", "NOPE"], {2}),
    ("layout-convert-no-folder", ["layout", "convert", "{d}/x.npy", "{w}/no/such/o.npy", *EX], {2}),
    ("layout-convert-disk-full", ["layout", "convert", "{d}/x.npy", "{f}/o.npy", *EX], {3}),
    # ---- profile
    ("profile-missing", ["profile", "analyze", "{d}/nope"], {2}),
    ("profile-empty", ["profile", "analyze", "{d}/empty.csv"], {2}),
    ("profile-garbage", ["profile", "analyze", "{d}/garbage.csv"], {2}),
    ("profile-json-is-input", ["profile", "analyze", "{d}/kernel_details.csv", "--json",
                               "{d}/kernel_details.csv"], {2}),
    ("profile-bad-threshold", ["profile", "analyze", "{d}/kernel_details.csv", "--threshold", "200"], {2}),
    ("profile-html-disk-full", ["profile", "analyze", "{d}/kernel_details.csv", "--html", "{f}/r.html"], {3}),
    # ---- usage
    ("usage-missing-argument", ["run"], {2}),
    ("usage-unknown-option", ["inspect", "{d}/ex.bundle", "--frobnicate"], {2}),
    ("usage-unknown-command", ["frobnicate"], {2}),
]


@pytest.mark.parametrize("argv, codes", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(run_cli, material, tmp_path, request, argv, codes):
    work = tmp_path / "work"
    work.mkdir()
    full = None
    if any("{f}" in a for a in argv):
        full = request.getfixturevalue("full_fs")
    subs = {"{d}": str(material), "{w}": str(work), "{f}": str(full)}

    def fill(a):
        for k, v in subs.items():
            a = a.replace(k, v)
        return a

    before = _snapshot(material), (_snapshot(full) if full else None)
    code, out, err = run_cli(*[fill(a) for a in argv])
    lines = err.strip().splitlines()
    assert code in codes, (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(lines) == 1 and lines[0].startswith("npu-deploy: error: "), err
    assert _snapshot(work) == {}, "a failed command left files behind"
    assert (_snapshot(material), (_snapshot(full) if full else None)) == before, "an input was changed"
