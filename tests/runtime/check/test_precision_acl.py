"""``debug precision --backend atc``: the search driving ATC + ACL, against the strict stand-ins only
(``tests/standins/atc`` and the stand-in ``acl``; no real ATC or device runs here).

The stand-in "device" is made meaningful: a wrapper around the stand-in ``atc`` records, for every
compile, the argv and the *content* of the ``--keep_dtype`` file it received, and the sha256 of the
``.om`` the stand-in wrote. When ACL loads an ``.om`` the stand-in decodes it as usual and the test
attaches a compute found through that hash: the model named by ``--model``, converted with the
built-in lowering under the ``--precision_mode`` and the keep list ATC received, run on the emulator
(what the device would output for that candidate). So a keep list lost or changed on the way to
ATC changes what the "device" returns, and a search that did not run on ACL has no executions.

The light CNNs are opset 9, below ATC's ONNX range (11-18: the stand-in refuses them with E19010, as
ATC does), so the tests run light_squeezenet after onnx's own version converter took it to opset 13.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import version_converter

import npu_deploy
from npu_deploy.errors import AclError, AtcError, DependencyError, InputError
from npu_deploy.runtime.check.precision import PrecisionSearch, precision_search
from tests.runtime.test_acl import acl  # noqa: F401  (the stand-in acl fixture)

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
SQUEEZENET = LIGHT / "light_squeezenet.onnx"
STANDIN_ATC = Path(__file__).resolve().parents[2] / "standins" / "atc"

# aclDataType -> numpy (reference atc-acl-om.md §3.3)
ACL_NP = {0: np.float32, 1: np.float16, 2: np.int8, 3: np.int32, 4: np.uint8, 9: np.int64, 12: np.bool_}

# Ascend IR type -> the ONNX type it comes from, for light_squeezenet's ops (reference onnx-op-support.md:
# Conv -> Conv2D for 4-D, Concat -> ConcatD, Softmax -> SoftmaxV2; the others keep their name)
IR_TO_ONNX = {"Conv2D": "Conv", "ConcatD": "Concat", "SoftmaxV2": "Softmax", "Relu": "Relu", "MaxPool": "MaxPool",
              "MaxPoolV3": "MaxPool", "GlobalAveragePool": "GlobalAveragePool", "Dropout": "Dropout",
              "Flatten": "Flatten", "Reshape": "Reshape"}

WRAPPER = """#!{python}
import hashlib, json, subprocess, sys
argv = sys.argv[1:]
keep = None
for a in argv:
    if a.startswith("--keep_dtype="):
        with open(a.split("=", 1)[1], encoding="utf-8") as f:
            keep = f.read()
rc = subprocess.run([sys.executable, {standin!r}] + argv).returncode
om = [a.split("=", 1)[1] + ".om" for a in argv if a.startswith("--output=")]
digest = None
if rc == 0 and om:
    with open(om[0], "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
with open({log!r}, "a", encoding="utf-8") as f:
    f.write(json.dumps({{"argv": argv, "keep_file": keep, "om_sha256": digest, "rc": rc}}) + "\\n")
sys.exit(rc)
"""


def flag(argv, name):
    vals = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    return vals[0] if vals else None


class Device:
    """The ATC wrapper's records and the stand-in device compute built from them."""

    def __init__(self, tmp_path: Path, acl_mod, monkeypatch):
        self.log = tmp_path / "atc-calls.jsonl"
        self.atc = tmp_path / "bin" / "atc"
        self.atc.parent.mkdir()
        self.atc.write_text(WRAPPER.format(python=sys.executable, standin=str(STANDIN_ATC), log=str(self.log)))
        self.atc.chmod(0o755)
        self.work = tmp_path / "device"
        self.work.mkdir()
        self.bundles: dict[tuple, Path] = {}
        self.loaded: list[dict] = []
        monkeypatch.setenv("ASCEND_PROCESS_LOG_PATH", str(tmp_path / "logs"))
        monkeypatch.delenv("ATC_STANDIN_MODE", raising=False)
        self.st = acl_mod._standin
        monkeypatch.setattr(self.st, "spec_loader", self.load)

    def records(self) -> list[dict]:
        if not self.log.is_file():
            return []
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines()]

    def load(self, path: str):
        from acl._omspec import spec_from_om

        spec = spec_from_om(path)
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        recs = [r for r in self.records() if r["om_sha256"] == digest]
        assert recs, f"{path} was not written by the stand-in ATC"
        rec = recs[-1]
        self.loaded.append(rec)
        spec.compute = self.compute_for(rec)
        return spec

    def compute_for(self, rec: dict):
        argv = rec["argv"]
        model, mode = flag(argv, "model"), flag(argv, "precision_mode")
        keep = tuple(rec["keep_file"].splitlines()) if rec["keep_file"] is not None else ()
        # the device keeps the nodes ATC's OpType:: entries (Ascend IR types) come from
        keep = tuple(dict.fromkeys(f"OpType::{IR_TO_ONNX[k[8:]]}" if k.startswith("OpType::") else k for k in keep))
        key = (model, mode, keep)
        if key not in self.bundles:
            out = self.work / f"cand{len(self.bundles)}.bundle"
            npu_deploy.convert(model, out, backend="builtin", precision_mode=mode, keep_dtype=list(keep))
            self.bundles[key] = out
        bundle = self.bundles[key]

        def compute(spec, inputs, gear):
            feeds = {t.name: np.frombuffer(inputs[t.name], ACL_NP[t.dtype]).reshape(t.dims) for t in spec.inputs}
            with npu_deploy.InferenceSession(bundle, backend="emulator") as sess:
                outs = sess.run([t.name for t in spec.outputs], feeds)
            return [np.ascontiguousarray(o, ACL_NP[t.dtype]).tobytes() for t, o in zip(spec.outputs, outs)]

        return compute


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory):
    """light_squeezenet at opset 13: a CNN whose activations overflow float16."""
    m = version_converter.convert_version(onnx.load(SQUEEZENET), 13)
    assert "" in {n.name for n in m.graph.node}     # mostly unnamed nodes, as the original
    path = tmp_path_factory.mktemp("sq13") / "light_squeezenet_op13.onnx"
    onnx.save(m, path)
    return path


@pytest.fixture
def dev(acl, tmp_path, monkeypatch):  # noqa: F811
    return Device(tmp_path, acl, monkeypatch)


@pytest.mark.slow
def test_search_over_atc_and_acl_finds_the_emulator_keep_list(dev, squeezenet):
    emu = precision_search(squeezenet, mode="force_fp16", cosine=0.999)
    s = PrecisionSearch(squeezenet, mode="force_fp16", cosine=0.999, backend="atc", atc=dev.atc)
    try:
        res = s.run()
    finally:
        s.close()
    assert res and res.backend == "atc" and res.keep == emu.keep
    assert res.baseline_cosine is None                # the device's fp16 run overflowed to NaN, as on the emulator
    assert any("verified against stand-ins only" in n for n in res.notes)
    # ATC compiled each candidate once, under force_fp16, with exactly its keep list in the --keep_dtype file
    recs = dev.records()
    assert len(recs) == res.evaluations == len(s.cache)
    assert all(r["rc"] == 0 and flag(r["argv"], "precision_mode") == "force_fp16" for r in recs)
    received = sorted(tuple(r["keep_file"].splitlines()) if r["keep_file"] is not None else () for r in recs)
    assert received == sorted(s.cache)
    assert all(r["keep_file"] != "" for r in recs)   # no empty --keep_dtype file: none given for ()
    # every evaluation ran on the ACL stand-in: one load of the .om ATC just wrote, one execute per sample
    assert [r["om_sha256"] for r in dev.loaded] == [r["om_sha256"] for r in recs]
    assert len(dev.st.executions()) == res.evaluations * res.samples
    assert dev.st.calls().count("acl.mdl.load_from_file") == res.evaluations
    dev.st.assert_clean(finalized=False)              # every model unloaded, every buffer freed
    # the cost estimate is the cost model's, as on the emulator
    assert res.est_us == emu.est_us and res.baseline_est_us == emu.baseline_est_us


def test_atc_failure_stops_the_search_with_its_error(dev, squeezenet, monkeypatch, tmp_path):
    monkeypatch.setenv("ATC_STANDIN_MODE", "fail_EZ3003")
    ck = tmp_path / "ck.json"
    s = PrecisionSearch(squeezenet, backend="atc", atc=dev.atc, checkpoint=ck)
    try:
        with pytest.raises(AtcError, match="EZ3003") as e:
            s.run()
    finally:
        s.close()
    assert e.value.exit_code == 3
    assert not dev.st.executions() and not ck.exists()   # nothing judged, nothing saved as judged


def test_device_failure_is_an_acl_error(dev, squeezenet):
    dev.st.fail("acl.mdl.execute", 507011)
    s = PrecisionSearch(squeezenet, backend="atc", atc=dev.atc)
    try:
        with pytest.raises(AclError) as e:
            s.run()
    finally:
        s.close()
    assert e.value.exit_code == 3


@pytest.mark.slow
def test_keep_lists_reach_atc_by_name_and_by_ir_type(dev, squeezenet):
    s = PrecisionSearch(squeezenet, backend="atc", atc=dev.atc)
    try:
        picked = s.candidates[3:5]
        ev = s.evaluate(picked, "probe")
        (rec,) = dev.records()
        # the nodes are unnamed in the file: ATC got a copy whose nodes carry the names the keep list uses
        given = onnx.load(flag(rec["argv"], "model"), load_external_data=False)
    finally:
        s.close()
    assert ev.kept == 2
    assert rec["keep_file"].splitlines() == sorted(picked)
    assert flag(rec["argv"], "model") != str(squeezenet)
    assert set(picked) <= {n.name for n in given.graph.node}
    assert [n.op_type for n in given.graph.node] == [n.op_type for n in onnx.load(squeezenet).graph.node]
    t = PrecisionSearch(squeezenet, backend="atc", atc=dev.atc, by_type=True)
    try:
        assert "OpType::Conv" in t.candidates
        t.evaluate(["OpType::Conv"], "probe")
    finally:
        t.close()
    # ATC's --keep_dtype names Ascend IR types: a 4-D ONNX Conv is a Conv2D there
    assert dev.records()[-1]["keep_file"].splitlines() == ["OpType::Conv2D"]


def test_an_emulator_checkpoint_is_not_reused_on_the_device(dev, squeezenet, tmp_path):
    ck = tmp_path / "ck.json"
    s = PrecisionSearch(squeezenet, checkpoint=ck)
    s.evaluate([], "baseline")
    s.close()
    d = PrecisionSearch(squeezenet, checkpoint=ck, backend="atc", atc=dev.atc)
    d.close()
    assert not d.cache and any("another model, inputs, mode or backend" in n for n in d.notes)


@pytest.mark.slow
def test_cli_by_type_search_on_atc_writes_the_emulator_list(dev, squeezenet, run_cli, tmp_path):
    emu = precision_search(squeezenet, by_type=True)
    cfg = tmp_path / "keep.cfg"
    code, out, err = run_cli("debug", "precision", squeezenet, "--by-type", "--backend", "atc", "--atc", dev.atc,
                             "-o", cfg, "--json", tmp_path / "r.json")
    assert code == 0, out + err
    assert "judged on ATC + ACL (verified against stand-ins only)" in out
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["backend"] == "atc" and res["keep"] == emu.keep == cfg.read_text().splitlines()
    assert emu.keep and all(k.startswith("OpType::") for k in emu.keep)
    recs = dev.records()
    assert len(recs) == res["evaluations"] == len(dev.st.executions())
    # ATC never saw an ONNX type name that differs from its Ascend IR name
    sent = {line for r in recs if r["keep_file"] for line in r["keep_file"].splitlines()}
    assert sent and "OpType::Conv" not in sent and sent <= {f"OpType::{ir}" for ir in IR_TO_ONNX}


def test_cli_backend_atc_errors_are_one_line_exit_3(dev, squeezenet, run_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("ATC_STANDIN_MODE", "fail_EZ3003")
    code, out, err = run_cli("debug", "precision", squeezenet, "--backend", "atc", "--atc", dev.atc,
                             "-o", tmp_path / "keep.cfg")
    assert code == 3, out + err
    assert "EZ3003" in err and "Traceback" not in err
    assert "verified against stand-ins only" in out
    assert not (tmp_path / "keep.cfg").exists()
    code, out, err = run_cli("debug", "precision", "--help")
    assert code == 0 and "ATC + ACL: verified against stand-ins only" in " ".join(out.split())


def test_missing_atc_and_misplaced_atc_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    if os.path.exists("/usr/local/Ascend/ascend-toolkit/latest/bin/atc"):
        pytest.skip("a CANN toolkit is installed here")
    with pytest.raises(DependencyError, match="ATC"):
        PrecisionSearch(SQUEEZENET, backend="atc")
    with pytest.raises(DependencyError, match="pyACL"):          # ATC found, but no device runtime
        PrecisionSearch(SQUEEZENET, backend="atc", atc=STANDIN_ATC)
    with pytest.raises(InputError, match="atc backend"):
        PrecisionSearch(SQUEEZENET, atc=STANDIN_ATC)
    with pytest.raises(InputError, match="cannot run the search"):
        PrecisionSearch(SQUEEZENET, backend="acl")
