"""The one backend interface shared by the CPU emulator and the ACL (device) backend.

A backend owns one loaded model. Its life cycle is ``activate() → run(...)* → deactivate()`` (or a
``with`` block). The base class does the work every backend needs, so that a subclass only moves bytes:

* refuses to run when inactive;
* validates the feeds against the input metadata *before anything touches a device*: unknown or
  missing names, dtype (a cast is made only when it is lossless, e.g. int32→int64, float16→float32;
  anything else is an error naming the dtype to use), rank and static dims;
* for models with gears (dynamic batch / image size / dims), picks the gear that fits the feeds. A
  batch smaller than every fitting gear is padded with zeros up to the next batch gear and the outputs
  are cropped back (see *Gears* below); a shape that fits no gear is an error naming the gears;
* times the three phases host→device, compute, device→host (the subclass reports them with the
  :meth:`Backend._phase` hook) and returns them with :meth:`Backend.run_timed`;
* serialises calls with a lock: a backend may be shared between threads, runs execute one at a time.

Writing a subclass
------------------
Implement these, nothing else is required::

    class MyBackend(Backend):
        name = "mine"

        def _activate(self) -> None: ...        # load the model, allocate buffers; may raise
        def _deactivate(self) -> None: ...      # free everything _activate made; must be idempotent
        def get_inputs(self) -> list[TensorMeta]: ...    # valid once active (may also work before)
        def get_outputs(self) -> list[TensorMeta]: ...
        def _run_validated(self, output_names, feeds, *, gear):
            with self._phase("h2d"):
                ...                  # copy feeds[name] (C-contiguous, exact meta dtype, gear shape)
            with self._phase("compute"):
                ...                  # execute
            with self._phase("d2h"):
                ...                  # copy back; return arrays in the order of output_names
            return outputs

``feeds`` given to ``_run_validated`` are C-contiguous numpy arrays with exactly the dtype of
``TensorMeta.dtype`` and, for gear models, exactly the gear's shape (already padded). ``output_names``
is a non-empty list of known output names. ``gear`` is ``None`` for models without gears, else a
:class:`Gear` (its ``index`` is the position in :meth:`Backend.gears`; ``shapes`` maps every input with
gears to its concrete shape; ``batch`` is the batch size for a batch-gear model, for
``acl.mdl.set_dynamic_batch_size``). Return host arrays in the *host* format of each output
(``TensorMeta.format``): layout conversion from the device format is the backend's job, the user never
packs by hand. Outputs may be larger than the user's batch when padded; the base crops them.

A phase can be entered several times (times add up); a time measured elsewhere (a device event) can be
reported with ``self._report_phase("compute", seconds)`` instead. Time spent in ``_run_validated``
outside the phases is reported as ``overhead``.

Gears
-----
Each input's ``TensorMeta.gears`` lists its concrete shapes, one per model gear, aligned across inputs
(gear *k* of the model is ``{m.name: m.gears[k]}`` over the inputs whose ``gears`` is non-empty). Inputs
with empty ``gears`` are checked against their ``shape`` alone (``-1`` accepts any size). If the gears
differ only in axis 0 of the inputs whose axis 0 is dynamic (a *batch* model) and the feeds' batch is
smaller than the next gear, the feeds are zero-padded along axis 0 to that gear and every output whose
``TensorMeta.shape[0]`` is ``-1`` is cropped back to the real batch. Set ``pad_to_gear = False`` on the
backend to require an exact gear instead.

Example (the emulator backend over an offline bundle)::

    >>> from npu_deploy.runtime.emulator import EmulatorBackend      # doctest: +SKIP
    >>> with EmulatorBackend("model.bundle") as b:                    # doctest: +SKIP
    ...     outs, t = b.run_timed(None, {"x": x})
    ...     print(t.h2d_ms, t.compute_ms, t.d2h_ms)
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any, Iterator, Sequence

import numpy as np

from npu_deploy.errors import InputError, InternalError

# onnxruntime's tensor type names (``NodeArg.type``) -> numpy dtype names: the one table, for the
# session's onnxruntime-style metadata, compare's and debug compare's feeds.
ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
             "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16",
             "tensor(uint16)": "uint16", "tensor(int32)": "int32", "tensor(uint32)": "uint32",
             "tensor(int64)": "int64", "tensor(uint64)": "uint64", "tensor(bool)": "bool"}

PHASES = ("h2d", "compute", "d2h")


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """What a model input or output looks like, on the host and on the device.

    ``shape`` is the logical shape in the host format with ``-1`` for a dynamic dimension; ``dtype``
    the numpy dtype the user feeds or receives; ``format`` the host (user) format name (``"NCHW"``,
    ``"ND"``…); ``device_format``/``device_shape`` how the device holds it (e.g. ``"NC1HWC0"``,
    ``(1, 1, 224, 224, 16)``; for a dynamic model the shape at the largest gear); ``nbytes`` the device
    buffer size in bytes (largest gear); ``gears`` the concrete shapes this input takes, one per model
    gear (empty for static models and for outputs).

    >>> m = TensorMeta("x", (-1, 3, 8, 8), np.dtype("float32"), gears=((1, 3, 8, 8), (4, 3, 8, 8)))
    >>> m.is_dynamic, m.rank
    (True, 4)
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    format: str = "ND"
    device_format: str = "ND"
    device_shape: tuple[int, ...] = ()
    nbytes: int = 0
    gears: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "device_shape", tuple(int(d) for d in self.device_shape))
        object.__setattr__(self, "gears", tuple(tuple(int(d) for d in g) for g in self.gears))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_dynamic(self) -> bool:
        return any(d < 0 for d in self.shape)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (dtype as its name)."""
        d = dataclasses.asdict(self)
        d["dtype"] = self.dtype.name
        d["shape"] = list(self.shape)
        d["device_shape"] = list(self.device_shape)
        d["gears"] = [list(g) for g in self.gears]
        return d


@dataclasses.dataclass(frozen=True)
class Gear:
    """The gear a run uses: ``index`` into :meth:`Backend.gears`, each geared input's ``shapes``, the
    ``batch`` (axis 0 of the geared inputs when they agree, else ``None``) and ``real_batch`` (the
    user's batch before padding; equals ``batch`` when nothing was padded)."""

    index: int
    shapes: dict[str, tuple[int, ...]]
    batch: int | None = None
    real_batch: int | None = None

    @property
    def padded(self) -> bool:
        return self.batch is not None and self.real_batch is not None and self.real_batch != self.batch


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of one run, split into phases. ``total`` covers the whole ``run`` call
    including validation; ``overhead = total - h2d - compute - d2h``."""

    h2d: float
    compute: float
    d2h: float
    total: float

    @property
    def overhead(self) -> float:
        return max(0.0, self.total - self.h2d - self.compute - self.d2h)

    def as_ms(self) -> dict[str, float]:
        return {"h2d_ms": self.h2d * 1e3, "compute_ms": self.compute * 1e3, "d2h_ms": self.d2h * 1e3,
                "overhead_ms": self.overhead * 1e3, "total_ms": self.total * 1e3}


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join("?" if d < 0 else str(d) for d in shape) + ")"


def lossless_cast_allowed(src: np.dtype, dst: np.dtype) -> bool:
    """True when every value of ``src`` is exactly representable in ``dst`` (numpy's "safe" casting,
    restricted to numeric/bool types).

    >>> lossless_cast_allowed(np.dtype("int32"), np.dtype("int64")), lossless_cast_allowed(np.dtype("float64"), np.dtype("float32"))
    (True, False)
    """
    if src == dst:
        return True
    if src.kind not in "biuf" or dst.kind not in "biuf":
        return False
    if src.kind in "iu" and dst.kind == "f":
        # numpy calls int64 -> float64 "safe", but 2**53 + 1 does not survive it: count mantissa bits
        value_bits = src.itemsize * 8 - (1 if src.kind == "i" else 0)
        return value_bits <= np.finfo(dst).nmant + 1
    return bool(np.can_cast(src, dst, casting="safe"))


class Backend:
    """Base class of every runtime backend; see the module docstring for the subclass contract.

    >>> class Echo(Backend):
    ...     name = "echo"
    ...     def get_inputs(self): return [TensorMeta("x", (2,), np.float32)]
    ...     def get_outputs(self): return [TensorMeta("y", (2,), np.float32)]
    ...     def _run_validated(self, output_names, feeds, *, gear):
    ...         with self._phase("compute"):
    ...             return [feeds["x"] * 2]
    >>> with Echo() as b:
    ...     b.run(None, {"x": np.ones(2, np.float16)})[0]
    array([2., 2.], dtype=float32)
    """

    name: str = "base"
    #: pad a smaller batch to the next batch gear (and crop outputs) instead of refusing it
    pad_to_gear: bool = True

    def __init__(self) -> None:
        self._active = False
        self._lock = threading.RLock()
        self._phase_times: dict[str, float] | None = None

    # ----------------------------------------------------------------- life cycle
    @property
    def is_active(self) -> bool:
        return self._active

    def activate(self) -> None:
        """Load and prepare the model. Idempotent. On failure everything made so far is released."""
        with self._lock:
            if self._active:
                return
            try:
                self._activate()
            except BaseException:
                with contextlib.suppress(Exception):
                    self._deactivate()
                raise
            self._active = True

    def deactivate(self) -> None:
        """Release the model and its buffers. Idempotent; safe to call after a failed activate."""
        with self._lock:
            if not self._active:
                return
            self._active = False
            self._deactivate()

    def __enter__(self) -> "Backend":
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()

    # hooks for subclasses
    def _activate(self) -> None:
        """Subclass hook: load the model. Default: nothing to do."""

    def _deactivate(self) -> None:
        """Subclass hook: release what ``_activate`` made. Must be idempotent."""

    # ----------------------------------------------------------------- metadata
    def get_inputs(self) -> list[TensorMeta]:
        raise NotImplementedError

    def get_outputs(self) -> list[TensorMeta]:
        raise NotImplementedError

    def gears(self) -> list[dict[str, tuple[int, ...]]]:
        """The model's gears as ``[{input name: shape}, ...]`` (empty for a model without gears)."""
        geared = [m for m in self.get_inputs() if m.gears]
        if not geared:
            return []
        n = len(geared[0].gears)
        if any(len(m.gears) != n for m in geared):
            raise InternalError(f"{self.name}: inputs disagree on the number of gears "
                                f"({', '.join(f'{m.name}: {len(m.gears)}' for m in geared)})")
        return [{m.name: m.gears[k] for m in geared} for k in range(n)]

    # ----------------------------------------------------------------- running
    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """Run once: ``output_names`` (``None`` = all, in model order) and ``feeds`` (input name →
        array). Returns host arrays in the order asked for."""
        return self.run_timed(output_names, feeds)[0]

    def run_timed(self, output_names: Sequence[str] | None,
                  feeds: Mapping[str, Any]) -> tuple[list[np.ndarray], Timing]:
        """Like :meth:`run`, and also return the :class:`Timing` of this call."""
        t0 = time.perf_counter()
        with self._lock:
            if not self._active:
                raise InputError(f"{self.name} backend: run() called while inactive",
                                 hint="use it in a 'with' block or call activate() first")
            inputs = self.get_inputs()
            outputs = self.get_outputs()
            names = self._check_output_names(output_names, outputs)
            checked = self._check_feeds(feeds, inputs)
            gear, checked = self._pick_gear(checked, inputs)
            self._phase_times = dict.fromkeys(PHASES, 0.0)
            try:
                result = self._run_validated(names, checked, gear=gear)
                times = self._phase_times
            finally:
                self._phase_times = None
            result = list(result)
            if len(result) != len(names):
                raise InternalError(f"{self.name} backend returned {len(result)} outputs for {len(names)} names")
            if gear is not None and gear.padded:
                by_name = {m.name: m for m in outputs}
                result = [r[: gear.real_batch] if by_name[n].shape[:1] == (-1,) and r.ndim and
                          r.shape[0] == gear.batch else r for n, r in zip(names, result)]
        total = time.perf_counter() - t0
        return result, Timing(times["h2d"], times["compute"], times["d2h"], total)

    def _run_validated(self, output_names: list[str], feeds: dict[str, np.ndarray], *,
                       gear: Gear | None) -> list[np.ndarray]:
        raise NotImplementedError

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        """Time a block as phase ``name`` (``"h2d"``, ``"compute"`` or ``"d2h"``) of the current run."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self._report_phase(name, time.perf_counter() - t)

    def _report_phase(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to phase ``name`` of the current run (for times measured on the device)."""
        if name not in PHASES:
            raise InternalError(f"unknown phase {name!r}; use one of {PHASES}")
        if self._phase_times is not None:
            self._phase_times[name] += seconds

    # ----------------------------------------------------------------- validation
    def _check_output_names(self, output_names, outputs: list[TensorMeta]) -> list[str]:
        known = [m.name for m in outputs]
        if output_names is None:
            return known
        if isinstance(output_names, str):
            output_names = [output_names]
        names = list(output_names)
        if not names:
            return known
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InputError(f"unknown output name(s) {', '.join(map(repr, unknown))}",
                             hint=f"the model's outputs are {', '.join(known)}")
        return names

    def _check_feeds(self, feeds: Mapping[str, Any], inputs: list[TensorMeta]) -> dict[str, np.ndarray]:
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict of input name -> array, not {type(feeds).__name__}",
                             hint=f"e.g. {{{inputs[0].name!r}: array}}" if inputs else None)
        known = {m.name for m in inputs}
        unknown = [n for n in feeds if n not in known]
        if unknown:
            raise InputError(f"unknown input name(s) {', '.join(map(repr, unknown))}",
                             hint=f"the model's inputs are {', '.join(m.name for m in inputs)}")
        missing = [m.name for m in inputs if m.name not in feeds]
        if missing:
            raise InputError(f"missing input(s) {', '.join(map(repr, missing))}",
                             hint="feed every model input: "
                                  + ", ".join(f"{m.name} {_fmt_shape(m.shape)} {m.dtype.name}" for m in inputs))
        out: dict[str, np.ndarray] = {}
        for m in inputs:
            value = feeds[m.name]
            arr = value if isinstance(value, np.ndarray) else np.asarray(value)
            if arr.dtype != m.dtype:
                if not lossless_cast_allowed(arr.dtype, m.dtype):
                    raise InputError(f"input {m.name!r}: dtype {arr.dtype.name} cannot be converted to the "
                                     f"model's {m.dtype.name} without loss",
                                     hint=f"pass {m.dtype.name} data, e.g. x.astype(np.{m.dtype.name})")
                arr = arr.astype(m.dtype)
            if arr.ndim != m.rank:
                raise InputError(f"input {m.name!r}: rank {arr.ndim} {_fmt_shape(arr.shape)} but the model "
                                 f"expects rank {m.rank} {_fmt_shape(m.shape)}",
                                 hint="reshape the input to the model's rank")
            for axis, (want, got) in enumerate(zip(m.shape, arr.shape)):
                if want >= 0 and want != got:
                    raise InputError(f"input {m.name!r}: shape {_fmt_shape(arr.shape)} does not match the "
                                     f"model's {_fmt_shape(m.shape)} (axis {axis}: {got} != {want})",
                                     hint=self._shape_hint(m))
            # not np.ascontiguousarray: it turns 0-d arrays into 1-d ones
            out[m.name] = arr if arr.flags.c_contiguous else arr.copy(order="C")
        return out

    def _shape_hint(self, m: TensorMeta) -> str:
        if m.format in ("NHWC", "NDHWC"):
            perm = "0, 2, 3, 1" if m.format == "NHWC" else "0, 2, 3, 4, 1"
            return (f"input {m.name!r} is fed channels-last ({m.format}): transpose a channels-first array "
                    f"with x.transpose({perm})" + (f"; allowed shapes: {', '.join(_fmt_shape(g) for g in m.gears)}"
                                                     if m.gears else ""))
        if m.gears:
            return "allowed shapes: " + ", ".join(_fmt_shape(g) for g in m.gears)
        return "reconvert the model with the shape you need (convert --input-shape)"

    def _pick_gear(self, feeds: dict[str, np.ndarray],
                   inputs: list[TensorMeta]) -> tuple[Gear | None, dict[str, np.ndarray]]:
        gears = self.gears()
        if not gears:
            return None, feeds
        shapes = {n: tuple(a.shape) for n, a in feeds.items()}

        def batch_of(g: dict[str, tuple[int, ...]]) -> int | None:
            firsts = {s[0] for s in g.values() if s}
            return firsts.pop() if len(firsts) == 1 else None

        for k, g in enumerate(gears):
            if all(shapes[n] == s for n, s in g.items()):
                b = batch_of(g)
                return Gear(k, dict(g), b, b), feeds
        if self.pad_to_gear:
            by_name = {m.name: m for m in inputs}
            best: tuple[int, int] | None = None
            for k, g in enumerate(gears):
                b = batch_of(g)
                if b is None:
                    continue
                fits = True
                real = set()
                for n, s in g.items():
                    f = shapes[n]
                    if by_name[n].shape[:1] != (-1,) or f[1:] != s[1:] or f[0] > s[0]:
                        fits = False
                        break
                    real.add(f[0])
                if fits and len(real) == 1 and (best is None or b < best[1]):
                    best = (k, b)
            if best is not None:
                k, b = best
                g = gears[k]
                real_batch = shapes[next(iter(g))][0]
                padded = dict(feeds)
                for n, s in g.items():
                    a = feeds[n]
                    p = np.zeros(s, dtype=a.dtype)
                    p[: a.shape[0]] = a
                    padded[n] = p
                return Gear(k, dict(g), b, real_batch), padded
        listing = " | ".join(", ".join(f"{n}:{','.join(map(str, s))}" for n, s in g.items()) for g in gears)
        given = ", ".join(f"{n}:{','.join(map(str, shapes[n]))}" for n in gears[0])
        raise InputError(f"input shape(s) {given} fit no gear of this model; gears are {listing}",
                         hint="feed one of the gear shapes, or reconvert with the gears you need")


def check_ranges(ranges: Mapping[str, Sequence[Any]], metas: Sequence[TensorMeta], feeds: Mapping[str, Any],
                 what: str) -> None:
    """Refuse a feed whose shape is outside ``ranges`` (``{input: per-dim (low, high) or None}``,
    ``high == -1``: unbounded), naming the input and the range."""
    by_name = {m.name: m for m in metas}
    for name, rng in ranges.items():
        if name not in feeds or name not in by_name:
            continue  # a missing feed is the backend's to report
        shape = np.shape(feeds[name])
        if len(shape) != len(rng):
            continue  # the rank is checked by the backend, with its message
        for axis, r in enumerate(rng):
            if r is not None and not (r[0] <= shape[axis] and (r[1] == -1 or shape[axis] <= r[1])):
                # lazy: onnx_model imports onnx (about 0.8 s), which a backend must not cost every process
                from npu_deploy.converters.files.onnx_model import fmt_range_shape

                shown = fmt_range_shape(by_name[name].shape, rng)
                raise InputError(f"input {name!r}: shape {','.join(map(str, shape))} is outside the range "
                                 f"{shown} {what} (axis {axis}: {shape[axis]} not in {r[0]}~{r[1]})",
                                 hint=f"feed a shape inside {name}:{shown}, or convert for a wider range")
