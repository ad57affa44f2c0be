"""Compare a converted model's outputs with onnxruntime (float32) on the original ONNX model.

:func:`compare` feeds the same inputs (given, loaded from an ``.npz``, or generated with a seed) to
onnxruntime on the reference ONNX and to an :class:`~npu_deploy.runtime.session.InferenceSession` on the
target (a bundle on the CPU emulator, an ``.om`` on a device), and judges every output:

* cosine similarity (float64; two all-zero tensors count as 1.0),
* max absolute error and max relative error (``|t - r| / |r|`` over elements with ``r != 0``),
* RMSE,
* the share of elements outside ``|t - r| <= atol + rtol * |r|`` (numpy's ``isclose``; NaN matches NaN and
  an infinity matches the same infinity),
* NaN / Inf counts on both sides.

Cosine, errors and RMSE are computed over the elements finite on both sides; when there is none (an
output that is all NaN), they are ``None`` ("n/a" in the table) and the output fails: a broken output
never looks perfect.

An output passes when its shapes agree, the share of elements outside the tolerance is at most
``max_outside``, the target has no NaN/Inf the reference lacks, and (when ``cosine_min`` is set) the
cosine is at least ``cosine_min``. Defaults follow the target's precision mode: ``atol=1e-4,
rtol=1e-3``, nothing outside, when the converter kept the original dtypes; ``atol=rtol=1e-2``,
``cosine_min=0.999`` and at most 0.1 % of elements outside when it ran in float16 (a sigmoid output
of PP-OCR det in fp16 has a handful of elements 0.015 off among 50,000).

>>> import npu_deploy                                                     # doctest: +SKIP
>>> res = npu_deploy.compare("model.onnx", "model.bundle", seed=0)        # doctest: +SKIP
>>> bool(res), res.verdict()                                              # doctest: +SKIP
(True, 'PASS: 1/1 outputs within atol=0.0001, rtol=0.001 (worst cosine 1.000000)')
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import numpy as np

from npu_deploy._io import atomic_path, load_npz
from npu_deploy._result import Result
from npu_deploy._text import printable
from npu_deploy.converters.formats.graph import axis_perm
from npu_deploy.converters.files.feeds import generate_inputs, index_ranges
from npu_deploy.converters.lowering import aipp as aippmod
from npu_deploy.converters.lowering import ops
from npu_deploy.errors import InputError, ModelError
from npu_deploy.runtime.backend import ORT_TYPES, TensorMeta
from npu_deploy.runtime.session import InferenceSession

FP32_TOLERANCE = {"atol": 1e-4, "rtol": 1e-3, "cosine_min": None, "max_outside": 0.0}
FP16_TOLERANCE = {"atol": 1e-2, "rtol": 1e-2, "cosine_min": 0.999, "max_outside": 1e-3}


@dataclasses.dataclass
class OutputComparison:
    """The metrics of one output. ``reason`` says why it failed (empty when it passed)."""

    name: str
    ref_shape: list
    target_shape: list
    ref_dtype: str
    target_dtype: str
    cosine: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    rmse: float | None = None
    outside: int = 0
    outside_share: float = 0.0
    nan_ref: int = 0
    nan_target: int = 0
    inf_ref: int = 0
    inf_target: int = 0
    finite: int = 0  # elements finite on both sides: the cosine, errors and RMSE are over these
    passed: bool = False
    reason: str = ""
    atol: float | None = None        # the tolerances this output was judged with (per-output ones too)
    rtol: float | None = None
    error_stat: str = "elemwise"     # what was held against them (Polygraphy's --check-error-stat)
    mean_abs: float | None = None
    median_abs: float | None = None
    rtol_decides: int = 0            # elements within atol + rtol*|ref| but not within atol alone
    histogram: list = dataclasses.field(default_factory=list)  # [[upper bound of |error|, count], ...]
    samples: int = 1


@dataclasses.dataclass
class CompareResult(Result):
    """The outcome of :func:`compare`: one :class:`OutputComparison` per output, truthy when all pass."""

    SCHEMA = "npu-deploy/compare"
    SCHEMA_VERSION = 1

    reference: str = ""
    target: str = ""
    backend: str = ""
    atol: float = 0.0
    rtol: float = 0.0
    cosine_min: float | None = None
    max_outside: float = 0.0
    seed: int | None = None
    inputs: dict = dataclasses.field(default_factory=dict)
    outputs: list = dataclasses.field(default_factory=list)
    samples: int = 1
    error_stat: str = "elemwise"
    notes: list = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def failures(self) -> list[OutputComparison]:
        return [o for o in self.outputs if not o.passed]

    def worst_cosine(self) -> float | None:
        cs = [o.cosine for o in self.outputs if o.cosine is not None]
        return min(cs) if cs else None

    def verdict(self) -> str:
        stat = "" if self.error_stat == "elemwise" else f"{self.error_stat} error "
        own = [o for o in self.outputs if (o.atol, o.rtol) not in ((None, None), (self.atol, self.rtol))]
        per = (" (" + ", ".join(f"{printable(o.name)}: atol={o.atol:g}, rtol={o.rtol:g}" for o in own) + ")") if own else ""
        tol = f"{stat}atol={self.atol:g}, rtol={self.rtol:g}{per}" + (
            f", cosine>={self.cosine_min:g}" if self.cosine_min is not None else "") + (
            f", <={self.max_outside * 100:g} % outside" if self.max_outside else "")
        wc = self.worst_cosine()
        cos = f" (worst cosine {wc:.6f})" if wc is not None else ""
        n = len(self.outputs)
        if not self.outputs:
            return "FAIL: no outputs compared"
        if self:
            return f"PASS: {n}/{n} outputs within {tol}{cos}"
        bad = self.failures()
        first = bad[0]
        return f"FAIL: {len(bad)}/{n} outputs outside {tol}; '{printable(first.name)}': {first.reason}"

    @classmethod
    def from_dict(cls, d: dict) -> "CompareResult":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        onames = {f.name for f in dataclasses.fields(OutputComparison)}
        kw["outputs"] = [o if isinstance(o, OutputComparison) else
                         OutputComparison(**{k: v for k, v in o.items() if k in onames})
                         for o in kw.get("outputs", [])]
        return cls(**kw)

    def histogram_lines(self) -> list[str]:
        """Per output, how many elements fall in each |error| decade (what a PASS/FAIL rests on)."""
        lines = []
        for o in self.outputs:
            if not o.histogram:
                continue
            cells = []
            for k, (edge, count) in enumerate(o.histogram):
                if k == 0:
                    label = "=0"
                elif math.isinf(edge):
                    label = f">{o.histogram[k - 1][0]:g}"
                else:
                    label = f"<={edge:g}"
                cells.append(f"{label}: {count}")
            lines.append(f"|error| histogram of {o.name}: " + ", ".join(cells))
        return lines

    def table(self) -> str:
        """Per-output metrics as an aligned text table."""
        shapes = ["x".join(map(str, o.target_shape)) or "scalar" for o in self.outputs]
        nw = max([24, *(len(printable(o.name)) for o in self.outputs)])  # whole names: two may share a long prefix
        sw = max([18, *(len(s) for s in shapes)])
        head = (f"{'output':{nw}s} {'shape':>{sw}s} {'cosine':>10s} {'max_abs':>10s} {'max_rel':>10s} "
                f"{'rmse':>10s} {'outside':>9s} {'nan/inf':>9s}  result")
        lines = [head]
        names = [printable(o.name) for o in self.outputs]

        def f(v, spec=".3e"):
            return "n/a" if v is None else format(v, spec)

        for o, name, shape in zip(self.outputs, names, shapes):
            naninf = f"{o.nan_target}/{o.inf_target}"
            lines.append(f"{name:{nw}s} {shape:>{sw}s} {f(o.cosine, '.6f'):>10s} {f(o.max_abs):>10s} "
                         f"{f(o.max_rel):>10s} {f(o.rmse):>10s} {o.outside_share * 100:8.3f}% {naninf:>9s}  "
                         + ("ok" if o.passed else "FAIL " + o.reason))
        return "\n".join(lines)


# ----------------------------------------------------------------------------------------- metrics
def check_thresholds(*, atol: float | None = None, rtol: float | None = None, cosine_min: float | None = None,
                     max_outside: float | None = None) -> None:
    """Refuse (``InputError``, exit 2) thresholds that cannot judge anything: a tolerance that is NaN,
    infinite or negative, a share outside [0, 1], a cosine outside [-1, 1]. NaN fails every test here.

    >>> check_thresholds(atol=float("nan"))
    Traceback (most recent call last):
    ...
    npu_deploy.errors.InputError: atol=nan is not a tolerance: it must be a finite number >= 0 (e.g. --atol 1e-3)
    """
    for name, v in (("atol", atol), ("rtol", rtol)):
        if v is not None and not (math.isfinite(float(v)) and float(v) >= 0):
            raise InputError(f"{name}={v} is not a tolerance: it must be a finite number >= 0",
                             hint=f"e.g. --{name} 1e-3")
    if max_outside is not None and not 0.0 <= float(max_outside) <= 1.0:
        raise InputError(f"max_outside {max_outside} must be a share between 0 and 1",
                         hint="e.g. 0.001 allows 0.1 % of elements outside atol/rtol")
    if cosine_min is not None and not -1.0 <= float(cosine_min) <= 1.0:
        raise InputError(f"cosine_min {cosine_min} is not a cosine (between -1 and 1)",
                         hint="e.g. --cosine-min 0.999")


ERROR_STATS = ("elemwise", "max", "mean", "median")
# upper bounds of the |error| histogram: exact, then decades (the last bin is everything above 1)
HISTOGRAM_EDGES = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, math.inf)


def error_histogram(diff: np.ndarray) -> list[list[float]]:
    """``[[upper bound, count], ...]`` of absolute errors over :data:`HISTOGRAM_EDGES` (first bin: exact).

    >>> error_histogram(np.array([0.0, 0.0, 5e-4, 0.3, 7.0]))
    [[0.0, 2], [1e-06, 0], [1e-05, 0], [0.0001, 0], [0.001, 1], [0.01, 0], [0.1, 0], [1.0, 1], [inf, 1]]
    """
    counts = np.searchsorted(np.asarray(HISTOGRAM_EDGES[1:-1]), diff[diff > 0], side="left")
    per_bin = np.bincount(counts, minlength=len(HISTOGRAM_EDGES) - 1)
    return [[HISTOGRAM_EDGES[0], int(np.count_nonzero(diff == 0))]] + \
        [[HISTOGRAM_EDGES[k + 1], int(c)] for k, c in enumerate(per_bin)]


def compare_arrays(name: str, ref: np.ndarray, target: np.ndarray, *, atol: float, rtol: float,
                   cosine_min: float | None = None, max_outside: float = 0.0,
                   error_stat: str | None = None) -> OutputComparison:
    """Metrics and pass/fail for one output pair.

    ``error_stat`` (Polygraphy's ``--check-error-stat``): ``None`` or ``"elemwise"`` judges every
    element (``|t - r| <= atol + rtol * |r|``, at most ``max_outside`` of them outside); ``"max"``,
    ``"mean"``, ``"median"`` judge that statistic of the absolute and relative errors: the output
    fails when the absolute one exceeds ``atol`` *and* the relative one exceeds ``rtol``.

    >>> c = compare_arrays("y", np.array([1.0, 2.0]), np.array([1.0, 2.1]), atol=0.0, rtol=0.01)
    >>> c.passed, c.outside, round(c.max_abs, 6)
    (False, 1, 0.1)
    """
    ref = np.asarray(ref)
    target = np.asarray(target)
    stat = error_stat or "elemwise"
    if stat not in ERROR_STATS:
        raise InputError(f"error statistic {stat!r} is unknown", hint=f"use one of {', '.join(ERROR_STATS)}")
    oc = OutputComparison(name=name, ref_shape=list(ref.shape), target_shape=list(target.shape),
                          ref_dtype=ref.dtype.name, target_dtype=target.dtype.name, atol=float(atol),
                          rtol=float(rtol), error_stat=stat)
    if ref.shape != target.shape:
        oc.reason = f"shape {tuple(target.shape)} != reference {tuple(ref.shape)}"
        return oc
    if ref.dtype.kind not in "biuf" or target.dtype.kind not in "biuf":
        equal = np.array_equal(ref, target)
        oc.passed = bool(equal)
        oc.outside = 0 if equal else int(np.sum(ref != target))
        oc.outside_share = oc.outside / max(ref.size, 1)
        oc.reason = "" if equal else f"{oc.outside} of {ref.size} elements differ"
        return oc
    r = ref.astype(np.float64, copy=False).ravel()
    t = target.astype(np.float64, copy=False).ravel()
    oc.nan_ref, oc.nan_target = int(np.isnan(r).sum()), int(np.isnan(t).sum())
    oc.inf_ref, oc.inf_target = int(np.isinf(r).sum()), int(np.isinf(t).sum())
    close = np.isclose(t, r, atol=atol, rtol=rtol, equal_nan=True)
    oc.outside = int(close.size - np.count_nonzero(close))
    oc.outside_share = oc.outside / close.size if close.size else 0.0
    finite = np.isfinite(r) & np.isfinite(t)
    oc.finite = int(np.count_nonzero(finite))
    if oc.finite:  # the metrics are over the elements finite on both sides (NaN/Inf are counted apart)
        rf, tf = r[finite], t[finite]
        diff = np.abs(tf - rf)
        oc.max_abs = float(diff.max())
        oc.rmse = float(np.sqrt(np.mean(diff * diff)))
        nz = rf != 0
        rel = diff[nz] / np.abs(rf[nz])
        oc.max_rel = float(rel.max()) if nz.any() else 0.0
        oc.mean_abs, oc.median_abs = float(diff.mean()), float(np.median(diff))
        oc.histogram = error_histogram(diff)
        oc.rtol_decides = int(np.count_nonzero(diff[diff <= atol + rtol * np.abs(rf)] > atol))
        stat_rel = {"max": oc.max_rel, "mean": float(rel.mean()) if rel.size else 0.0,
                    "median": float(np.median(rel)) if rel.size else 0.0}
        stat_abs = {"max": oc.max_abs, "mean": oc.mean_abs, "median": oc.median_abs}
        nr, nt = np.linalg.norm(rf), np.linalg.norm(tf)
        if nr == 0 and nt == 0:
            oc.cosine = 1.0
        elif nr == 0 or nt == 0:
            oc.cosine = 0.0
        else:
            oc.cosine = float(np.dot(rf / nr, tf / nt))
    elif not r.size:  # an empty output: nothing differs
        oc.max_abs = oc.rmse = oc.max_rel = 0.0
        oc.cosine = 1.0
    # else: no element is finite on both sides; every metric is n/a (None), never a perfect-looking 1.0
    reasons = []
    if r.size and not oc.finite:
        reasons.append(f"no element is finite on both sides (target {oc.nan_target} NaN / {oc.inf_target} Inf, "
                       f"reference {oc.nan_ref} / {oc.inf_ref}): metrics n/a")
    if stat != "elemwise":
        if oc.finite and stat_abs[stat] > atol and stat_rel[stat] > rtol:
            reasons.append(f"{stat} abs error {stat_abs[stat]:.3g} > atol {atol:g} and {stat} rel error "
                           f"{stat_rel[stat]:.3g} > rtol {rtol:g}")
    elif oc.outside and oc.outside_share > max_outside:
        worst = f", max abs error {oc.max_abs:.3g}" if oc.max_abs is not None else ""
        reasons.append(f"{oc.outside} of {close.size} elements ({oc.outside_share * 100:.3g} %) outside "
                       f"tolerance{worst}")
    if oc.nan_target > oc.nan_ref or oc.inf_target > oc.inf_ref:
        reasons.append(f"target has {oc.nan_target} NaN / {oc.inf_target} Inf "
                       f"(reference {oc.nan_ref} / {oc.inf_ref})")
    if cosine_min is not None and oc.cosine is not None and oc.cosine < cosine_min:
        reasons.append(f"cosine {oc.cosine:.6f} < {cosine_min:g}")
    oc.passed = not reasons
    oc.reason = "; ".join(reasons)
    return oc


# ----------------------------------------------------------------------------------------- inputs
# generate_inputs, index_ranges: the one feed generator, npu_deploy.converters.files.feeds


def save_inputs(path: str | os.PathLike, feeds: Mapping[str, np.ndarray]) -> None:
    """Write feeds to an ``.npz`` (atomically) so that a failing case can be replayed."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in feeds.items()})


def load_inputs(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read feeds from an ``.npz`` written by :func:`save_inputs` (no pickle, sizes checked first)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"inputs file {p} does not exist", hint="give the .npz written by --save-inputs")
    return load_npz(p)


# ----------------------------------------------------------------------------------------- reference
class OnnxruntimeReference:
    """onnxruntime (CPU, float32) on an ONNX file, with the same ``get_inputs``/``run`` shape as a
    session. Used for the reference side of :func:`compare`."""

    def __init__(self, path: str | os.PathLike):
        import onnxruntime as ort

        p = Path(path)
        if not p.is_file():
            raise InputError(f"reference model {p} does not exist", hint="give the original .onnx file")
        opts = ort.SessionOptions()
        opts.log_severity_level = 4  # failures come back as exceptions, reported in one line
        try:
            self._sess = ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types
            self._sess = _session_with_external_data_inline(p, opts, e)
            if self._sess is None:
                raise ModelError(f"{p}: onnxruntime cannot load it as ONNX ({str(e).splitlines()[0][:200]})",
                                 hint="give the original .onnx model as the reference") from e
        self.path = p
        self.name = "onnxruntime"
        self._inputs = [TensorMeta(i.name, tuple(d if isinstance(d, int) else -1 for d in i.shape),
                                   _ort_dtype(i.type)) for i in self._sess.get_inputs()]
        self._outputs = [TensorMeta(o.name, tuple(d if isinstance(d, int) else -1 for d in (o.shape or [])),
                                    _ort_dtype(o.type)) for o in self._sess.get_outputs()]

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def run(self, output_names, feeds):
        try:
            return self._sess.run(output_names, dict(feeds))
        except Exception as e:
            raise InputError(f"onnxruntime failed on the reference {self.path.name}: "
                             f"{str(e).splitlines()[0][:300]}",
                             hint="check the input shapes and dtypes (--input-shape, --load-inputs)") from e


def _session_with_external_data_inline(p: Path, opts, error: BaseException):
    """onnxruntime's loader cannot read shape tensors (a Reshape target) kept in external data; the
    model is valid ONNX all the same. Retry with the external data read into the model, when it then
    fits in one protobuf (< 2 GiB). None when that does not apply or does not help."""
    if "external" not in str(error).lower():
        return None
    import onnx
    import onnxruntime as ort

    try:
        m = onnx.load(str(p), load_external_data=True)
        if m.ByteSize() >= 2**31 - 1:
            return None
        return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception:  # the original error is the one to report
        return None


def _ort_dtype(t: str) -> np.dtype:
    if t not in ORT_TYPES:
        raise ModelError(f"tensor type {t} is not supported by compare")
    return np.dtype(ORT_TYPES[t])


_CHANNEL_FIRST = {h: axis_perm(h, g) for h, g in (("NHWC", "NCHW"), ("NDHWC", "NCDHW"))}


def _open_target(target: Any, *, backend: str, device_id: int):
    """A session-like object for ``target`` and whether we own it (must close it)."""
    if hasattr(target, "run") and hasattr(target, "get_inputs"):
        return target, False

    return InferenceSession(target, device_id=device_id, backend=backend), True


Tolerance = Union[float, Mapping[str, float], None]  # a number for all outputs, or {output: x, "": others}


def _per_output(value, name: str, default: float) -> float:
    """A tolerance for output ``name``: a number for all, or ``{name: x, "": for the others}``."""
    if value is None:
        return default
    if isinstance(value, Mapping):
        v = value.get(name, value.get(""))
        return default if v is None else float(v)
    return float(value)


def _check_tolerance_map(kind: str, value, outputs: Sequence[str]) -> None:
    if isinstance(value, Mapping):
        unknown = [k for k in value if k and k not in outputs]
        if unknown:
            raise InputError(f"--{kind} names output(s) {', '.join(map(repr, unknown))} the model does not have",
                             hint=f"outputs are {', '.join(outputs)}")
        for v in value.values():
            check_thresholds(**{kind: v})
    else:
        check_thresholds(**{kind: value})


def compare(reference_onnx: str | os.PathLike, target: Any, *,
            inputs: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None, seed: int = 0,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            atol: Tolerance = None, rtol: Tolerance = None, cosine_min: float | None = None,
            max_outside: float | None = None, output_names: Sequence[str] | None = None,
            backend: str = "auto", device_id: int = 0,
            save_inputs_to: str | os.PathLike | None = None, error_stat: str | None = None,
            val_range: Mapping[str, tuple[float, float]] | None = None, samples: int = 1) -> CompareResult:
    """Run onnxruntime on ``reference_onnx`` and the target model on the same inputs; judge every output.

    ``target`` is a bundle or ``.om`` path (opened with ``InferenceSession(target, backend=backend)``)
    or an already-open session/backend. ``inputs``: one feed dict, or a list of them (several
    samples, judged together); by default ``samples`` random feeds from ``seed``, ``seed + 1``, …
    shaped by the target's inputs (``input_shapes`` fixes dynamic dims; ``val_range`` sets value
    ranges; integer inputs indexing an embedding cover its table, see :func:`generate_inputs`).
    Tolerances (``atol``, ``rtol``: a number, or ``{output: x, "": default}``; ``cosine_min``,
    ``max_outside`` = share of elements allowed outside atol/rtol) default by the target's precision
    mode (see the module docstring). ``error_stat``: see :func:`compare_arrays`. ``save_inputs_to``
    writes the inputs used to an ``.npz`` (the first sample).

    >>> res = compare("model.onnx", "model.bundle", atol=1e-3)   # doctest: +SKIP
    >>> print(res.table()); print(res.verdict())                 # doctest: +SKIP
    """
    if error_stat is not None and error_stat not in ERROR_STATS:
        raise InputError(f"error statistic {error_stat!r} is unknown", hint=f"use one of {', '.join(ERROR_STATS)}")
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise InputError(f"samples {samples!r} must be a positive integer", hint="e.g. --samples 4")
    ref = OnnxruntimeReference(reference_onnx)
    sess, owned = _open_target(target, backend=backend, device_id=device_id)
    try:
        precision = getattr(sess, "precision_mode", None) or "must_keep_origin_dtype"
        defaults = FP16_TOLERANCE if precision in ops.FP16_MODES else FP32_TOLERANCE
        user_atol, user_rtol = atol, rtol
        if cosine_min is None:
            cosine_min = defaults["cosine_min"]
        max_outside = defaults["max_outside"] if max_outside is None else float(max_outside)
        check_thresholds(cosine_min=cosine_min, max_outside=max_outside)
        if inputs is None and seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise InputError(f"seed {seed!r} must be a non-negative integer", hint="e.g. --seed 0")
        tmetas = [getattr(m, "meta", m) for m in sess.get_inputs()]  # TensorMeta (-1), not NodeArg (None)
        # a bundle with AIPP takes the raw uint8 image; the ONNX reference gets the normalised tensor
        aipp_rec = aippmod.record_of(sess)
        if aipp_rec is not None and inputs is None:
            val_range = {aipp_rec["input"]: (0, 255), **(val_range or {})}
        unknown_ranges = sorted(k for k in (val_range or {}) if k and k not in {m.name for m in tmetas})
        if unknown_ranges:
            raise InputError(f"--val-range names input(s) {', '.join(map(repr, unknown_ranges))} the model does "
                             f"not have", hint=f"inputs are {', '.join(m.name for m in tmetas)}")
        if inputs is None:
            tables = index_ranges(reference_onnx)
            batches = [generate_inputs(tmetas, seed=seed + k, shapes=input_shapes, val_range=val_range,
                                       index_ranges=tables) for k in range(samples)]
        else:
            batches = [inputs] if isinstance(inputs, Mapping) else list(inputs)
            if not batches:
                raise InputError("no input samples given")
            batches = [{k: np.asarray(v) for k, v in b.items()} for b in batches]
            seed = None
        feeds = batches[0]
        ref_names = {m.name for m in ref.get_inputs()}
        missing = [m.name for m in tmetas if m.name not in ref_names]
        if missing:
            raise InputError(f"target input(s) {', '.join(missing)} are not inputs of the reference "
                             f"{Path(reference_onnx).name}",
                             hint="compare the converted model with the ONNX model it was converted from")
        target_out_names = [m.name for m in sess.get_outputs()]
        names = list(output_names) if output_names else target_out_names
        ref_out_names = {m.name for m in ref.get_outputs()}
        unknown = [n for n in names if n not in ref_out_names]
        if unknown:
            raise InputError(f"output(s) {', '.join(unknown)} are not outputs of the reference",
                             hint=f"the reference's outputs are {', '.join(sorted(ref_out_names))}")
        _check_tolerance_map("atol", atol, names)
        _check_tolerance_map("rtol", rtol, names)
        if save_inputs_to is not None:
            save_inputs(save_inputs_to, feeds)
        host_format = {m.name: getattr(m, "format", None) for m in tmetas}
        refs: list[list[np.ndarray]] = [[] for _ in names]
        tgts: list[list[np.ndarray]] = [[] for _ in names]
        for b in batches:
            ref_feeds = {}
            src = aippmod.reference_feeds(b, aipp_rec) if aipp_rec is not None else b
            for m in ref.get_inputs():
                if m.name in src:
                    a = src[m.name]
                    if aipp_rec is not None and m.name == aipp_rec.get("input"):  # already NCHW float32
                        ref_feeds[m.name] = a
                        continue
                    # A bundle converted with --input-format NHWC takes channel-last host arrays; the ONNX
                    # reference reads channel-first: same values, axes moved.
                    perm = _CHANNEL_FIRST.get(host_format.get(m.name))
                    if perm is not None and a.ndim == len(perm):
                        a = np.ascontiguousarray(a.transpose(perm))
                    ref_feeds[m.name] = a.astype(m.dtype) if a.dtype != m.dtype and \
                        np.can_cast(a.dtype, m.dtype, "safe") else a
            tgt_outs = sess.run(names, b)  # first: the session's feed check gives the clearer message
            ref_outs = ref.run(names, ref_feeds)
            for k, (r, t) in enumerate(zip(ref_outs, tgt_outs)):
                refs[k].append(np.asarray(r))
                tgts[k].append(np.asarray(t))
        comps = []
        for k, n in enumerate(names):
            a_k = _per_output(atol, n, defaults["atol"])
            r_k = _per_output(rtol, n, defaults["rtol"])
            comps.append(_judge(n, refs[k], tgts[k], atol=a_k, rtol=r_k, cosine_min=cosine_min,
                                max_outside=max_outside, error_stat=error_stat))
        res = CompareResult(reference=str(reference_onnx), target=str(getattr(sess, "path", target)),
                            backend=getattr(sess, "backend_name", getattr(sess, "name", "")),
                            atol=_per_output(atol, "", defaults["atol"]), rtol=_per_output(rtol, "", defaults["rtol"]),
                            cosine_min=cosine_min, max_outside=max_outside, seed=seed,
                            inputs={k: {"shape": list(v.shape), "dtype": v.dtype.name} for k, v in feeds.items()},
                            outputs=comps, samples=len(batches), error_stat=error_stat or "elemwise")
        if user_atol is not None and user_rtol is None:
            res.notes.extend(_rtol_decides_notes(comps))
        return res
    finally:
        if owned:
            sess.close()


def _judge(name, refs: list[np.ndarray], tgts: list[np.ndarray], **kw) -> OutputComparison:
    """One output over every sample: shapes checked per sample, metrics over all elements together."""
    for r, t in zip(refs, tgts):
        if r.shape != t.shape:
            return compare_arrays(name, r, t, **kw)
    if len(refs) == 1:
        return compare_arrays(name, refs[0], tgts[0], **kw)
    oc = compare_arrays(name, np.concatenate([r.ravel() for r in refs]), np.concatenate([t.ravel() for t in tgts]),
                        **kw)
    oc.ref_shape, oc.target_shape, oc.samples = list(refs[0].shape), list(tgts[0].shape), len(refs)
    return oc


def _rtol_decides_notes(comps: list[OutputComparison]) -> list[str]:
    notes = []
    for o in comps:
        if o.rtol_decides and o.error_stat == "elemwise":
            notes.append(f"--atol {o.atol:g} was given, but for {o.rtol_decides} element(s) of '{printable(o.name)}' "
                         f"rtol={o.rtol:g} (the default) decided: they differ by more than atol and pass "
                         f"by atol + rtol*|ref|; give --rtol 0 to judge by atol alone")
    return notes
