"""The lowering pipeline and its options: one options object, per-backend capabilities, steps whose
contracts are checked (a broken plan record is a bug, exit 4, caught before any bundle is written)."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.options import ALL_PRECISION_MODES, CAPABILITIES, ConvertOptions
from npu_deploy.errors import InputError, InternalError


def _model(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["y"], name="flat")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", 1, [1, 512])], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_precision_modes_come_from_each_backend():
    assert set(CAPABILITIES["builtin"].precision_modes) < set(CAPABILITIES["atc"].precision_modes)
    assert set(ALL_PRECISION_MODES) == set(CAPABILITIES["atc"].precision_modes)
    o = ConvertOptions(backend="atc", precision_mode="force_fp32")  # an ATC mode: accepted
    assert o.for_backend("atc", "requested") == []
    with pytest.raises(InputError, match="built-in lowering does not implement"):
        o.for_backend("builtin", "auto: ATC not found")
    with pytest.raises(InputError, match="unknown precision mode"):
        ConvertOptions(precision_mode="fp8_everywhere")


def test_atc_refuses_nhwc_and_builtin_notes_atc_only_options():
    with pytest.raises(InputError, match="not accepted by ATC"):
        ConvertOptions(input_format="NHWC").for_backend("atc", "requested")
    notes = ConvertOptions(atc_args=("--log=info",), timeout=5).for_backend("builtin", "requested")
    assert notes == ["--atc-arg, --timeout only apply to the ATC backend; the built-in lowering ran and "
                     "ignored them"]


def test_steps_run_in_order_with_their_contracts(tmp_path):
    src = _model(tmp_path)
    seen = []
    ctx = pipeline.lower(src, tmp_path / "m.bundle", ConvertOptions(backend="builtin"),
                         say=lambda stage, fraction: seen.append(stage))
    assert [s for s in seen if s in pipeline.STEPS] == list(pipeline.STEPS)
    assert any(s.startswith("writing weights") for s in seen)  # the bundle step reports its progress
    assert ctx.bundle.exists() and ctx.plan is not None


def test_a_step_without_what_it_requires_is_a_bug(tmp_path):
    ctx = pipeline.Lowering(ConvertOptions(), _model(tmp_path))
    with pytest.raises(InternalError, match="needs loaded, support"):
        pipeline.run_steps([pipeline.STEPS["plan from ONNX"]], ctx)


def test_plan_record_contract_catches_a_missing_transdata(tmp_path):
    ctx = pipeline.lower(_model(tmp_path), None, ConvertOptions(backend="builtin"), until="plan from ONNX")
    p, graph = ctx.plan, ctx.loaded.model.graph
    consts = set(ctx.loaded.constants)
    pipeline.check_plan_record(p, graph, consts)  # the planner's own plan holds
    assert any(t.consumers == ["flat"] for t in p.transdata)  # NC1HWC0 -> NCHW before the Flatten
    broken = copy.copy(p)
    broken.transdata = [t for t in p.transdata if t.consumers != ["flat"]]
    with pytest.raises(InternalError, match="flat reads r in NCHW but it is stored in NC1HWC0"):
        pipeline.check_plan_record(broken, graph, consts)
    wrong = copy.deepcopy(p)
    wrong.node_formats["relu"].input_formats = ["FRACTAL_NZ"]
    with pytest.raises(InternalError, match="relu reads c in FRACTAL_NZ"):
        pipeline.check_plan_record(wrong, graph, consts)
