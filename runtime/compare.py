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
from typing import Any, Mapping, Sequence

import numpy as np

from npu_deploy._io import atomic_path, load_npz
from npu_deploy._result import Result
from npu_deploy._text import printable
from npu_deploy.errors import InputError, ModelError

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

    def __bool__(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    def failures(self) -> list[OutputComparison]:
        return [o for o in self.outputs if not o.passed]

    def worst_cosine(self) -> float | None:
        cs = [o.cosine for o in self.outputs if o.cosine is not None]
        return min(cs) if cs else None

    def verdict(self) -> str:
        tol = f"atol={self.atol:g}, rtol={self.rtol:g}" + (
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


def compare_arrays(name: str, ref: np.ndarray, target: np.ndarray, *, atol: float, rtol: float,
                   cosine_min: float | None = None, max_outside: float = 0.0) -> OutputComparison:
    """Metrics and pass/fail for one output pair.

    >>> c = compare_arrays("y", np.array([1.0, 2.0]), np.array([1.0, 2.1]), atol=0.0, rtol=0.01)
    >>> c.passed, c.outside, round(c.max_abs, 6)
    (False, 1, 0.1)
    """
    ref = np.asarray(ref)
    target = np.asarray(target)
    oc = OutputComparison(name=name, ref_shape=list(ref.shape), target_shape=list(target.shape),
                          ref_dtype=ref.dtype.name, target_dtype=target.dtype.name)
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
        oc.max_rel = float((diff[nz] / np.abs(rf[nz])).max()) if nz.any() else 0.0
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
    if oc.outside and oc.outside_share > max_outside:
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
def generate_inputs(metas: Sequence[Any], *, seed: int = 0,
                    shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """Random inputs for ``metas`` (objects with ``name``, ``shape``, ``dtype``, optional ``gears``).

    Floats are uniform in [0, 1); integers 0 or 1 (safe for ids, masks and type ids alike); booleans
    random. Dynamic dims come from ``shapes``, else the first gear, else 1.

    >>> from npu_deploy.runtime.backend import TensorMeta
    >>> x = generate_inputs([TensorMeta("x", (-1, 3), "float32")], seed=0)["x"]
    >>> x.shape, x.dtype.name
    ((1, 3), 'float32')
    """
    rng = np.random.default_rng(seed)
    out = {}
    for m in metas:
        dtype = np.dtype(m.dtype)
        if shapes and m.name in shapes:
            shape = tuple(int(d) for d in shapes[m.name])
        elif getattr(m, "gears", None):
            shape = tuple(m.gears[0])
        else:
            shape = tuple(d if d >= 0 else 1 for d in m.shape)
        if dtype.kind == "f":
            a = rng.random(shape, dtype=np.float64).astype(dtype)
        elif dtype.kind in "iu":
            a = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype.kind == "b":
            a = rng.random(shape) < 0.5
        else:
            raise InputError(f"input {m.name!r}: cannot generate data of dtype {dtype}",
                             hint="give the input with --input NAME=FILE.npy")
        out[m.name] = np.asarray(a, dtype=dtype)  # a 0-d draw is a numpy scalar; onnxruntime wants arrays
    return out


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

        from npu_deploy.runtime.backend import TensorMeta

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


_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16",
              "tensor(uint16)": "uint16", "tensor(int32)": "int32", "tensor(uint32)": "uint32",
              "tensor(int64)": "int64", "tensor(uint64)": "uint64", "tensor(bool)": "bool"}


def _ort_dtype(t: str) -> np.dtype:
    if t not in _ORT_TYPES:
        raise ModelError(f"tensor type {t} is not supported by compare")
    return np.dtype(_ORT_TYPES[t])


_CHANNEL_FIRST = {"NHWC": (0, 3, 1, 2), "NDHWC": (0, 4, 1, 2, 3)}


def _open_target(target: Any, *, backend: str, device_id: int):
    """A session-like object for ``target`` and whether we own it (must close it)."""
    if hasattr(target, "run") and hasattr(target, "get_inputs"):
        return target, False
    from npu_deploy.runtime.session import InferenceSession

    return InferenceSession(target, device_id=device_id, backend=backend), True


def compare(reference_onnx: str | os.PathLike, target: Any, *,
            inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            atol: float | None = None, rtol: float | None = None, cosine_min: float | None = None,
            max_outside: float | None = None, output_names: Sequence[str] | None = None,
            backend: str = "auto", device_id: int = 0,
            save_inputs_to: str | os.PathLike | None = None) -> CompareResult:
    """Run onnxruntime on ``reference_onnx`` and the target model on the same inputs; judge every output.

    ``target`` is a bundle or ``.om`` path (opened with ``InferenceSession(target, backend=backend)``)
    or an already-open session/backend. ``inputs`` default to random data from ``seed`` shaped by the
    target's inputs (``input_shapes`` fixes dynamic dims). Tolerances (``atol``, ``rtol``,
    ``cosine_min``, ``max_outside`` = share of elements allowed outside atol/rtol) default by the
    target's precision mode (see the module docstring). ``save_inputs_to`` writes the inputs used to an ``.npz``.

    >>> res = compare("model.onnx", "model.bundle", atol=1e-3)   # doctest: +SKIP
    >>> print(res.table()); print(res.verdict())                 # doctest: +SKIP
    """
    ref = OnnxruntimeReference(reference_onnx)
    sess, owned = _open_target(target, backend=backend, device_id=device_id)
    try:
        precision = getattr(sess, "precision_mode", None) or "must_keep_origin_dtype"
        defaults = FP16_TOLERANCE if precision in ("force_fp16", "allow_fp32_to_fp16",
                                                    "allow_mix_precision") else FP32_TOLERANCE
        atol = defaults["atol"] if atol is None else float(atol)
        rtol = defaults["rtol"] if rtol is None else float(rtol)
        if cosine_min is None:
            cosine_min = defaults["cosine_min"]
        max_outside = defaults["max_outside"] if max_outside is None else float(max_outside)
        check_thresholds(atol=atol, rtol=rtol, cosine_min=cosine_min, max_outside=max_outside)
        if inputs is None and seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise InputError(f"seed {seed!r} must be a non-negative integer", hint="e.g. --seed 0")
        tmetas = sess.get_inputs()
        if inputs is None:
            feeds = generate_inputs(tmetas, seed=seed, shapes=input_shapes)
        else:
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
            seed = None
        ref_names = {m.name for m in ref.get_inputs()}
        missing = [m.name for m in tmetas if m.name not in ref_names]
        if missing:
            raise InputError(f"target input(s) {', '.join(missing)} are not inputs of the reference "
                             f"{Path(reference_onnx).name}",
                             hint="compare the converted model with the ONNX model it was converted from")
        if save_inputs_to is not None:
            save_inputs(save_inputs_to, feeds)
        target_out_names = [m.name for m in sess.get_outputs()]
        names = list(output_names) if output_names else target_out_names
        ref_out_names = {m.name for m in ref.get_outputs()}
        unknown = [n for n in names if n not in ref_out_names]
        if unknown:
            raise InputError(f"output(s) {', '.join(unknown)} are not outputs of the reference",
                             hint=f"the reference's outputs are {', '.join(sorted(ref_out_names))}")
        ref_feeds = {}
        host_format = {m.name: getattr(m, "format", None) for m in tmetas}
        for m in ref.get_inputs():
            if m.name in feeds:
                a = feeds[m.name]
                # A bundle converted with --input-format NHWC takes channel-last host arrays; the ONNX
                # reference reads channel-first: same values, axes moved.
                perm = _CHANNEL_FIRST.get(host_format.get(m.name))
                if perm is not None and a.ndim == len(perm):
                    a = np.ascontiguousarray(a.transpose(perm))
                ref_feeds[m.name] = a.astype(m.dtype) if a.dtype != m.dtype and \
                    np.can_cast(a.dtype, m.dtype, "safe") else a
        tgt_outs = sess.run(names, feeds)  # first: the session's feed check gives the clearer message
        ref_outs = ref.run(names, ref_feeds)
        comps = [compare_arrays(n, r, t, atol=atol, rtol=rtol, cosine_min=cosine_min, max_outside=max_outside)
                 for n, r, t in zip(names, ref_outs, tgt_outs)]
        return CompareResult(reference=str(reference_onnx), target=str(getattr(sess, "path", target)),
                             backend=getattr(sess, "backend_name", getattr(sess, "name", "")),
                             atol=atol, rtol=rtol, cosine_min=cosine_min, max_outside=max_outside, seed=seed,
                             inputs={k: {"shape": list(v.shape), "dtype": v.dtype.name} for k, v in feeds.items()},
                             outputs=comps)
    finally:
        if owned:
            sess.close()
