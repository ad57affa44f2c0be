"""``optimize``: Ascend graph rewrites, each one verified on onnxruntime and measured by the planner.

Before ATC, Ascend users rewrite their ONNX models so the device runs them well (the retired msit
surgeon's knowledge base, ``shared/reference/ascend-rewrites.md``). Each rewrite here is a :class:`Rule`
in one registry, :data:`RULES`: a *pattern* (``find``: the places it could apply), a *check* (the reason
it does not apply there, or ``None``; shown by ``--explain``) and a *rewrite* (the :class:`Change` it
makes). :func:`optimize` applies them one application at a time and, for every application:

All the places one rule matches (on disjoint nodes) are first tried together as one step; when that
step fails a check or is not kept (below), they are retried one at a time, so the
application at fault is the one rolled back. For every step:

1. builds the rewritten model and runs ``onnx.checker`` and strict shape inference on it;
2. runs it on onnxruntime on the same inputs as the original and compares every output with the
   original's within tolerances: a rewrite that changes the numbers is rolled back and reported;
3. plans it with the built-in lowering (``pipeline.lower(..., until="plan from ONNX")``) and records
   planned TransData, AI CPU ops and estimated time before and after. By default a step the cost
   model estimates slower is dropped ("worse"; with no estimate for the SoC: more TransData or AI
   CPU ops); with ``keep_all`` (``optimize --all``) every verified step is kept; with
   ``keep_if_faster`` only a step the cost model estimates faster ("not faster" otherwise);
4. with ``keep_if_faster`` and a ``device_timer`` (``optimize --measure atc``:
   :class:`npu_deploy.runtime.device_time.AtcAclTimer`), a step the cost model accepts is also
   compiled by ATC and timed on the device through ACL, before and after (median compute time of
   N runs after a warm-up; each model compiled and timed once): it is kept only when the device
   time drops by more than :data:`NOISE_MARGIN_PCT` (2 %), else it is "not faster" even though the
   cost model liked it. Both times are in the step's ``device`` record and the result's
   ``measured_by`` says what judged. This path is measured with ATC + ACL: verified against
   stand-ins only (the ATC and pyACL stand-ins of ``tests/standins``; no real Ascend device has run
   it yet).

The package: :mod:`.graph` (the view rules read, :class:`Change`, :class:`Rule`), one module per rule
under :mod:`.rules`, :mod:`.registry` (:data:`RULES`, in the order they run), :mod:`.verify` (inputs,
onnxruntime runs, the ONNX checks, comparison), :mod:`.measure` (the plan's figures, the device timer),
:mod:`.result` and :mod:`.driver` (:func:`optimize_model`, :func:`optimize`). It imports the lowering
(to plan each candidate), the ONNX file helpers and the base modules; never the runtime (the device
timer is injected).

Rewrites keep the model's dynamic dimensions: sizes seen only on the verification inputs are never
baked in (a rule that needs a static size checks the model's own declared shapes, :meth:`View.declared`).

>>> import numpy as np, onnx
>>> from onnx import helper, TensorProto, numpy_helper
>>> g = helper.make_graph(
...     [helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT),
...      helper.make_node("Relu", ["a"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
>>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
>>> res, out = optimize_model(m, rules=["merge-casts"])
>>> [n.op_type for n in out.graph.node], res.applied_count()
(['Relu'], 1)
"""

from __future__ import annotations

from npu_deploy.converters.optimize.driver import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    MAX_APPLICATIONS_PER_RULE,
    optimize,
    optimize_model,
)
from npu_deploy.converters.optimize.graph import Change, Match, Rule, View, apply_change, attr, merge_changes
from npu_deploy.converters.optimize.measure import COST_MODEL, NOISE_MARGIN_PCT, DeviceTimer, Measure, device_faster
from npu_deploy.converters.optimize.registry import RULES, select_rules
from npu_deploy.converters.optimize.result import Application, OptimizeResult
from npu_deploy.converters.optimize.rules.split_avgpool import AVGPOOL_LIMIT
from npu_deploy.converters.optimize.rules.split_large_kernel_conv import LARGE_KERNEL
from npu_deploy.converters.optimize.verify import realistic_feeds

__all__ = ["AVGPOOL_LIMIT", "COST_MODEL", "DEFAULT_ATOL", "DEFAULT_RTOL", "LARGE_KERNEL", "MAX_APPLICATIONS_PER_RULE",
           "NOISE_MARGIN_PCT", "RULES", "Application", "Change", "DeviceTimer", "Match", "Measure", "OptimizeResult",
           "Rule", "View", "apply_change", "attr", "device_faster", "merge_changes", "optimize", "optimize_model",
           "realistic_feeds", "select_rules"]
