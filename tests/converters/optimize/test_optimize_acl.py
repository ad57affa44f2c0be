"""``optimize --keep-if-faster --measure atc``: each step the cost model accepts is compiled by ATC and
timed on the device through ACL, against the strict stand-ins (``tests/standins/atc`` and the pyACL
stand-in); no real ATC or NPU runs here, which is why the feature is labelled "verified against
stand-ins only".

The stand-in device has no clock of its own, so the test gives it one: an ``.om`` the stand-in ATC
wrote names its source ONNX model in ``atc_cmdline`` (``--model=...``); the stand-in's ``spec_loader``
hook reads that model's op sequence and attaches a compute that sleeps for the duration the table
:data:`DEVICE_MS` assigns to that graph. ``acl.mdl.execute`` therefore takes that long, which the ACL
backend's compute phase observes. The table is the oracle: it says which rewrite the device finds
faster, independently of the cost model (which estimates both rewrites here as faster).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from npu_deploy.converters import optimize as opt
from npu_deploy.errors import AtcError, DependencyError, InputError
from npu_deploy.runtime import device
from npu_deploy.runtime.device_time import ATC_ACL_LABEL, AtcAclTimer

STANDINS = Path(__file__).resolve().parents[2] / "standins"
ATC = STANDINS / "atc"
RULES = ["merge-casts", "cancel-transpose-reshape"]

#: simulated device compute time (ms) per graph (its op types in order): merge-casts (first row ->
#: second) is faster on the device, cancelling the Transpose pair (second -> third) is slower; the gaps
#: (60 and 36 ms) are wider than what a loaded machine adds to a median of 3 runs
DEVICE_MS = {
    ("Cast", "Transpose", "Transpose", "Relu"): 120.0,
    ("Transpose", "Transpose", "Relu"): 60.0,
    ("Relu",): 96.0,
}


def _model() -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT),
                           helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1]),
                           helper.make_node("Transpose", ["b"], ["c"], perm=[0, 2, 1]),
                           helper.make_node("Relu", ["c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64, 64])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _purge_standins() -> None:
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if name in ("acl", "omfile") or name.startswith("acl.") or (f and str(STANDINS) in f and "." not in name):
            del sys.modules[name]


class Device:
    """What the test's stand-in device does: ``ms(graph) -> milliseconds`` per graph (op types in
    order; default: the :data:`DEVICE_MS` table) and ``loaded``, the graphs loaded, in order."""

    def __init__(self):
        self.loaded: list[tuple[str, ...]] = []
        self.ms = lambda graph: DEVICE_MS[graph]


@pytest.fixture
def standin_device(monkeypatch, tmp_path):
    """The stand-in ATC (its logs under tmp_path) and the stand-in pyACL whose device takes
    ``Device.ms(graph)`` per run. Yields the :class:`Device`."""
    monkeypatch.setenv("ASCEND_PROCESS_LOG_PATH", str(tmp_path / "logs"))
    monkeypatch.delenv("ATC_STANDIN_MODE", raising=False)
    device.shutdown()
    _purge_standins()
    monkeypatch.syspath_prepend(str(STANDINS))
    import acl
    import omfile
    from acl import _omspec

    acl._standin.reset()
    dev = Device()

    def spec_loader(path):
        spec = _omspec.spec_from_om(path)
        md = omfile.ModelDef.FromString(_omspec._model_def_bytes(Path(path).read_bytes()))
        cmd = md.attr["atc_cmdline"].s.decode()     # written by the stand-in ATC: proof ATC made it
        src = re.search(r"--model=(\S+)", cmd).group(1)
        graph = tuple(n.op_type for n in onnx.load(src).graph.node)
        ms = dev.ms(graph)   # a graph the test's device has no time for fails here
        dev.loaded.append(graph)

        def compute(spec, inputs, gear):
            time.sleep(ms / 1e3)
            return [bytes(t.nbytes_of(d)) for t, d in zip(spec.outputs, spec.output_dims(None))]

        return dataclasses.replace(spec, compute=compute)

    monkeypatch.setattr(acl._standin, "spec_loader", spec_loader)
    yield dev
    device.finalize()
    acl._standin.assert_clean(finalized=acl._standin.report()["init_calls"] > 0)  # released, in order
    _purge_standins()


@pytest.mark.slow
def test_device_slower_rewrite_is_rolled_back_and_faster_one_kept(standin_device, tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    res = opt.optimize(src, tmp_path / "o.onnx", rules=RULES, keep_if_faster=True, report=tmp_path / "r.json",
                       device_timer=AtcAclTimer(atc=ATC, runs=3))
    by_rule = {a.rule: a for a in res.applications}
    casts, cancel = by_rule["merge-casts"], by_rule["cancel-transpose-reshape"]
    # the cost model likes both; the device only the first
    assert casts.status == "applied" and casts.after["est_us"] < casts.before["est_us"]
    assert cancel.status == "not faster" and cancel.after["est_us"] < cancel.before["est_us"]
    assert "ATC + ACL" in cancel.reason and "although the cost model estimated" in cancel.reason
    # ATC compiled the original and both rewritten models, each once, and the device ran each
    assert standin_device.loaded == list(DEVICE_MS)
    # the measured times are in the report: sleeps are lower bounds, a loaded machine only adds time;
    # below 3x: the median of the 3 runs, not their sum
    ms = list(DEVICE_MS.values())
    for app, (b, a) in ((casts, (ms[0], ms[1])), (cancel, (ms[1], ms[2]))):
        assert app.device["runs"] == 3
        assert b <= app.device["before_ms"] < 3 * b and a <= app.device["after_ms"] < 3 * a
    out = onnx.load(tmp_path / "o.onnx")
    assert [n.op_type for n in out.graph.node] == ["Transpose", "Transpose", "Relu"]
    x = np.random.default_rng(1).standard_normal((2, 64, 64)).astype(np.float32)
    (y,) = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["schema_version"] == 1   # measured_by and device are additive: a v1 reader ignores them
    assert ATC_ACL_LABEL in d["measured_by"] and "cost model" in d["measured_by"]
    assert d["device"]["before_ms"] >= ms[0] and ms[1] <= d["device"]["after_ms"] < 3 * ms[1]
    assert d["device"]["margin_pct"] == opt.NOISE_MARGIN_PCT
    assert [a["device"] is not None for a in d["applications"]] == [True, True]
    assert "device" in res.verdict() and "stand-in verified only" in res.verdict()
    assert opt.OptimizeResult.load(d).applications[1].device["after_ms"] == pytest.approx(cancel.device["after_ms"])


def test_rewrite_atc_cannot_compile_is_rolled_back_the_others_go_on(standin_device, tmp_path, monkeypatch):
    """The stand-in ATC fails (EZ3003) on its second call only, the model rewritten by merge-casts."""

    class FailingSecond(AtcAclTimer):
        calls = 0

        def __call__(self, *args):
            self.calls += 1
            if self.calls == 2:
                monkeypatch.setenv("ATC_STANDIN_MODE", "fail_EZ3003")
            else:
                monkeypatch.delenv("ATC_STANDIN_MODE", raising=False)
            return super().__call__(*args)

    standin_device.ms = {("Cast", "Transpose", "Transpose", "Relu"): 30.0, ("Cast", "Relu"): 10.0}.__getitem__
    res, out = opt.optimize_model(_model(), rules=RULES, keep_if_faster=True,
                                  device_timer=FailingSecond(atc=ATC, runs=1))
    casts, cancel = [a for a in res.applications if a.status != "not applicable"]
    assert casts.rule == "merge-casts" and casts.status == "rolled back"
    assert "ATC cannot compile the rewritten model" in casts.reason and "EZ3003" in casts.reason
    assert cancel.rule == "cancel-transpose-reshape" and cancel.status == "applied"
    assert [n.op_type for n in out.graph.node] == ["Cast", "Relu"]
    assert standin_device.loaded == [("Cast", "Transpose", "Transpose", "Relu"), ("Cast", "Relu")]


def test_noise_margin_is_two_percent():
    assert opt.NOISE_MARGIN_PCT == 2.0
    assert opt.device_faster(100.0, 97.9)          # 2.1 % faster: kept
    assert not opt.device_faster(100.0, 98.1)      # 1.9 %: within the noise
    assert not opt.device_faster(100.0, 100.0) and not opt.device_faster(100.0, 130.0)


def test_no_accepted_step_no_device_run(standin_device, tmp_path):
    """The device is asked only about steps the cost model accepts: with nothing to rewrite, ATC never
    runs and the result carries no device figures."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64, 64])])
    res, out = opt.optimize_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), rules=RULES,
                                  keep_if_faster=True, device_timer=AtcAclTimer(atc=ATC, runs=1))
    assert standin_device.loaded == [] and res.device is None and res.applied_count() == 0
    assert "device" not in res.verdict()


def test_atc_failing_on_the_original_is_an_environment_error(standin_device, tmp_path, monkeypatch):
    monkeypatch.setenv("ATC_STANDIN_MODE", "fail_EZ3003")
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    with pytest.raises(AtcError, match="--measure atc, timing the model before merge-casts") as e:
        opt.optimize(src, tmp_path / "o.onnx", rules=RULES, keep_if_faster=True, report=tmp_path / "r.json",
                     device_timer=AtcAclTimer(atc=ATC, runs=1))
    assert e.value.exit_code == 3
    assert not (tmp_path / "o.onnx").exists() and not (tmp_path / "r.json").exists()
    assert standin_device.loaded == []


def test_device_timer_needs_keep_if_faster_and_its_tools(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="keep-if-faster"):
        opt.optimize_model(_model(), rules=RULES, device_timer=AtcAclTimer(atc=ATC))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    with pytest.raises(DependencyError, match="ATC"):
        opt.optimize_model(_model(), rules=RULES, keep_if_faster=True, device_timer=AtcAclTimer())
    device.shutdown()
    _purge_standins()  # no pyACL importable: said before any rewrite is tried
    with pytest.raises(DependencyError, match="pyACL"):
        opt.optimize_model(_model(), rules=RULES, keep_if_faster=True, device_timer=AtcAclTimer(atc=ATC))
    with pytest.raises(InputError, match="--runs 0"):
        AtcAclTimer(runs=0)


@pytest.mark.slow
def test_cli_measure_atc_end_to_end(standin_device, run_cli, tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    code, out, err = run_cli("optimize", src, "-o", tmp_path / "o.onnx", "--rules", ",".join(RULES),
                             "--keep-if-faster", "--measure", "atc", "--atc", ATC, "--runs", "2",
                             "--json", tmp_path / "r.json")
    assert code == 0, err
    assert re.search(r"applied\s+merge-casts at \S+: .*device \d+\.\d+ -> \d+\.\d+ ms", out)
    assert "device ms" in out and "not faster" in out
    assert f"measured by: {opt.COST_MODEL}; device time {ATC_ACL_LABEL}" in out
    assert "(ATC + ACL, stand-in verified only)" in out.strip().splitlines()[-1]
    assert standin_device.loaded == list(DEVICE_MS)


def test_cli_refuses_measure_options_that_would_be_ignored(run_cli, tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_model(), src)
    code, _, err = run_cli("optimize", src, "-o", tmp_path / "o.onnx", "--measure", "atc", "--atc", ATC)
    assert code == 2 and "keep-if-faster" in err and not (tmp_path / "o.onnx").exists()
    code, _, err = run_cli("optimize", src, "-o", tmp_path / "o.onnx", "--runs", "3")
    assert code == 2 and "--runs is for --measure atc" in err
    code, out, _ = run_cli("optimize", "--help")
    assert code == 0 and "verified against stand-ins only" in " ".join(out.split())


def _static_outputs(path, shapes, dest):
    """The model with its graph outputs' dims made concrete by shape inference on ``shapes``: the
    stand-in ATC takes an output's dims from its declaration (it infers nothing, real ATC does), so a
    symbolic output dim would reach the .om as -1."""
    m = onnx.load(path)
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    for vi in probe.graph.input:
        if vi.name in shapes:
            for d, v in zip(vi.type.tensor_type.shape.dim, shapes[vi.name]):
                d.Clear()
                d.dim_value = v
    inferred = {o.name: o for o in onnx.shape_inference.infer_shapes(probe, strict_mode=True).graph.output}
    for o in m.graph.output:
        o.type.tensor_type.shape.CopyFrom(inferred[o.name].type.tensor_type.shape)
        assert all(d.HasField("dim_value") for d in o.type.tensor_type.shape.dim), o
    onnx.save(m, dest)
    return dest


@pytest.mark.realmodel
def test_silero_vad_rewrite_the_device_finds_slower_is_not_kept(standin_device, real_model, tmp_path):
    """Silero VAD (three float inputs, a dynamic one given a shape) through the stand-in ATC and ACL.
    The cost model accepts fold-channel-slice (its Slices of a Conv output become Convs); the test's
    device charges 10 ms per Conv, so the extra Conv makes it slower and the model stays as it was."""
    standin_device.ms = lambda graph: 10.0 * graph.count("Conv")
    src = _static_outputs(real_model("silero_vad"), {"input": (1, 576)}, tmp_path / "vad.onnx")
    original = [n.op_type for n in onnx.load(src).graph.node]
    res = opt.optimize(src, tmp_path / "o.onnx", input_shapes={"input": (1, 576)}, keep_if_faster=True,
                       rules=["fold-channel-slice"], device_timer=AtcAclTimer(atc=ATC, runs=2))
    (a,) = [a for a in res.applications if a.rule == "fold-channel-slice" and a.device]
    assert a.status == "not faster" and a.after["est_us"] < a.before["est_us"]
    n = original.count("Conv")
    assert 10.0 * n <= a.device["before_ms"] < 15.0 * n and 10.0 * (n + 1) <= a.device["after_ms"]
    assert [g.count("Conv") for g in standin_device.loaded] == [n, n + 1]
    assert [n.op_type for n in onnx.load(tmp_path / "o.onnx").graph.node] == original
    assert res.device["before_ms"] == res.device["after_ms"] == a.device["before_ms"]
