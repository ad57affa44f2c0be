"""An ``onnx.backend.base.Backend`` over convert (built-in lowering) + the CPU emulator, and the harness
that runs the official ONNX node test suite through it.

``NpuDeployBackend.prepare(model)`` converts the model with ``npu_deploy.convert(..., backend="builtin",
precision_mode="must_keep_origin_dtype")`` into a temporary bundle and opens it on the
:class:`~npu_deploy.runtime.emulator.EmulatorBackend`; ``rep.run(inputs)`` feeds the inputs (a list in
graph-input order, or a dict) and returns the outputs. It plugs into ``onnx.backend.test.BackendTest``.

:func:`run_node_suite` drives the node tests itself (``load_model_tests(kind="node")``) in worker processes
and returns one :class:`CaseOutcome` per test, so the pass rate can be put next to plain onnxruntime's
(:class:`OrtBackend`, the same harness over an ``onnxruntime.InferenceSession``).

>>> import onnx.backend.test                                                 # doctest: +SKIP
>>> backend_test = onnx.backend.test.BackendTest(NpuDeployBackend, __name__)  # doctest: +SKIP
>>> outcomes = run_node_suite(NpuDeployBackend, workers=2)                    # doctest: +SKIP
>>> sum(o.passed for o in outcomes) / len(outcomes)                           # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend as OnnxBackend
from onnx.backend.base import BackendRep
from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.convert import convert
from npu_deploy.converters.lowering.options import ConvertOptions
from npu_deploy.runtime.emulator import EmulatorBackend

PRECISION_MODE = "must_keep_origin_dtype"


def _input_names(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _is_static(model: onnx.ModelProto) -> bool:
    inits = {i.name for i in model.graph.initializer}
    for i in model.graph.input:
        if i.name in inits:
            continue
        t = i.type
        if t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
            if any(not d.HasField("dim_value") for d in t.tensor_type.shape.dim):
                return False
    return True


class NpuDeployRep(BackendRep):
    """A prepared model: an active emulator session over the converted bundle.

    A model with dynamic input dims is converted lazily, at the first ``run``, with the feeds' shapes
    as ``input_shapes`` (the built-in lowering, like ATC, needs fixed shapes or gears); each new shape
    signature converts once more.
    """

    def __init__(self, owner: type, model: onnx.ModelProto):
        self._owner = owner
        self._model = model
        self._input_names = _input_names(model)
        self._backends: dict[Any, Any] = {}
        if _is_static(model):
            self._backends[None] = owner._open(model, None)

    def _backend_for(self, feeds: dict[str, Any]) -> Any:
        if None in self._backends:
            return self._backends[None]
        # a sequence/optional feed (a list) has no shape: left out, so conversion refuses the model
        # for what it is (non-tensor inputs) rather than numpy failing on a ragged list here
        shapes = {k: tuple(np.shape(v)) for k, v in feeds.items() if isinstance(v, (np.ndarray, np.generic))}
        key = tuple(sorted(shapes.items()))
        if key not in self._backends:
            self._backends[key] = self._owner._open(self._model, shapes)
        return self._backends[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(self._input_names, inputs))
        return tuple(self._backend_for(feeds).run(None, feeds))

    def close(self) -> None:
        for be in self._backends.values():
            be.deactivate()
        self._backends.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class NpuDeployBackend(OnnxBackend):
    """ONNX backend: built-in conversion (``must_keep_origin_dtype``) then the CPU emulator."""

    precision_mode = PRECISION_MODE

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return True

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def _convert(cls, src: Path, out: Path, input_shapes: dict | None) -> None:
        convert(str(src), output=str(out), backend="builtin", precision_mode=cls.precision_mode,
                input_shapes=input_shapes)

    @classmethod
    def _open(cls, model: onnx.ModelProto, input_shapes: dict | None) -> Any:
        with tempfile.TemporaryDirectory(prefix="npu-deploy-conf-") as d:
            src = Path(d) / "model.onnx"
            onnx.save(model, src)
            out = Path(d) / "model.bundle"
            cls._convert(src, out, input_shapes)
            be = EmulatorBackend(out)
            be.activate()  # the bundle is fully read here; the folder can go
        return be

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> NpuDeployRep:
        return NpuDeployRep(cls, model)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        rep = cls.prepare(model, device, **kwargs)
        try:
            return rep.run(inputs, **kwargs)
        finally:
            rep.close()


class NpuDeployLoweringBackend(NpuDeployBackend):
    """The same pipeline (load → plan → bundle → emulator) without ATC's op-support gate.

    ``npu_deploy.convert`` refuses, as ATC would, models outside ATC's ONNX opset range (8–18) and ops
    without an ATC parser. Most node tests use newer opsets, so this variant measures the lowering and
    the emulator themselves: the support report is still computed (it drives AI Core / AI CPU
    placement) but not enforced.
    """

    soc = "Ascend310P3"

    @classmethod
    def _convert(cls, src: Path, out: Path, input_shapes: dict | None) -> None:

        options = ConvertOptions(backend="builtin", soc=cls.soc, precision_mode=cls.precision_mode,
                                 input_shapes=input_shapes)
        pipeline.lower(src, out, options, gate=False)


class _OrtRep(BackendRep):
    def __init__(self, sess: Any, names: list[str]):
        self._sess = sess
        self._names = names

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(self._names, inputs))
        # numpy scalars (0-d test inputs) are not arrays; onnxruntime's own backend wraps them too
        feeds = {k: np.asarray(v) if isinstance(v, np.generic) else v for k, v in feeds.items()}
        return tuple(self._sess.run(None, feeds))


class OrtBackend(OnnxBackend):
    """Plain onnxruntime (CPU, default options) behind the same interface: the baseline."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> _OrtRep:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return _OrtRep(sess, [i.name for i in sess.get_inputs()])


# ------------------------------------------------------------------------------ suite harness
@dataclasses.dataclass
class CaseOutcome:
    """One node test: ``status`` is ``"pass"``, ``"fail"`` (wrong numbers) or ``"error"`` (raised)."""

    name: str
    status: str
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"


_CASES: list[Any] | None = None


def node_cases() -> list[Any]:
    """The ONNX node test cases (built in memory by the onnx package; cached per process)."""
    global _CASES
    if _CASES is None:
        from onnx.backend.test.loader import load_model_tests

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _CASES = list(load_model_tests(kind="node"))
    return _CASES


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def run_case(backend: type, case: Any) -> CaseOutcome:
    """Run one test case exactly as ``onnx.backend.test.BackendTest`` does."""
    from onnx.backend.test.runner import Runner, _normalize_tensor

    try:
        rep = backend.prepare(case.model, "CPU")
    except Exception as e:
        return CaseOutcome(case.name, "error", "prepare: " + _first_line(e))
    try:
        for inputs, ref_outputs in case.data_sets:
            ins = [_normalize_tensor(x) for x in inputs]
            refs = [_normalize_tensor(x) for x in ref_outputs]
            try:
                outs = rep.run(ins)
            except Exception as e:
                return CaseOutcome(case.name, "error", "run: " + _first_line(e))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    Runner.assert_similar_outputs(refs, outs, rtol=case.rtol, atol=case.atol)
            except AssertionError as e:
                return CaseOutcome(case.name, "fail", _first_line(e))
            except Exception as e:
                return CaseOutcome(case.name, "fail", _first_line(e))
        return CaseOutcome(case.name, "pass")
    finally:
        close = getattr(rep, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                pass


_WORKER_BACKEND: type | None = None


def _worker_init(backend: type) -> None:
    global _WORKER_BACKEND
    _WORKER_BACKEND = backend
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _worker_run(index: int) -> CaseOutcome:
    return run_case(_WORKER_BACKEND, node_cases()[index])


def run_node_suite(backend: type, *, pattern: str | None = None, names: Iterable[str] | None = None,
                   workers: int = 2) -> list[CaseOutcome]:
    """Run the ONNX node tests (optionally only those matching the regex ``pattern`` or in ``names``)
    through ``backend`` in ``workers`` processes (forked, so the cases are loaded once)."""
    cases = node_cases()
    wanted = set(names) if names is not None else None
    rx = re.compile(pattern) if pattern else None
    idx = [i for i, c in enumerate(cases)
           if (wanted is None or c.name in wanted) and (rx is None or rx.search(c.name))]
    if workers <= 1 or len(idx) < 8:
        return [run_case(backend, cases[i]) for i in idx]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers, initializer=_worker_init, initargs=(backend,), maxtasksperchild=200) as pool:
        out = list(pool.imap(_worker_run, idx, chunksize=8))
    return out


def summarise(ours: Sequence[CaseOutcome], baseline: Sequence[CaseOutcome]) -> dict[str, Any]:
    """Pass counts for both, and the cases the baseline passes but ``ours`` does not."""
    base_pass = {o.name for o in baseline if o.passed}
    our_pass = {o.name for o in ours if o.passed}
    regress = sorted(base_pass - our_pass)
    return {"total": len(baseline), "baseline_pass": len(base_pass), "ours_pass": len(our_pass),
            "ours_pass_of_baseline": len(base_pass & our_pass),
            "rate_vs_baseline": len(base_pass & our_pass) / len(base_pass) if base_pass else 0.0,
            "regressions": regress}
