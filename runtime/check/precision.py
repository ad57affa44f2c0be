"""Search for a small set of ops to keep in float32 so that a float16 model reaches an accuracy target.

:func:`precision_search` is what ``npu-deploy debug precision`` runs (Polygraphy's ``debug precision``
is the model). Every candidate is judged on the **emulator's fp16 emulation**, through the same steps
as ``convert`` (the model is loaded and checked once; each candidate is planned with ``keep_dtype`` and
written as a bundle, then run), so the device's rounding points are the plan's: per-op output dtypes
from the precision mode (``force_fp16`` / ``allow_mix_precision``, whose float32 ops stay float32).

1. **Candidates** — the ops the plan runs in float16 under the mode, in topological order (ONNX node
   names, or their op types as ``OpType::X`` with ``by_type``).
2. **Ends** — all candidates kept must reach the target (else the result says it is unreachable, with
   the accuracy of the all-float32 plan); none kept is checked first (nothing to do when it passes).
3. **Bisection** — the shortest prefix of the ordered candidates that reaches the target, then the
   latest start of that window that still does (error usually enters at a few places; the window
   holds them).
4. **Greedy prune** — ops of the window are dropped in chunks (halves, quarters, ... single ops) as
   long as the target stays reached.

The judge: every output of every sample against onnxruntime (float32) on the original model — the
worst cosine at least ``cosine`` (default 0.999), or the largest absolute error at most ``max_abs``;
a NaN/Inf the reference lacks always fails. The result (:class:`PrecisionResult`, schema
``npu-deploy/precision-search``) holds the keep list (write it with :meth:`~PrecisionResult.write_cfg`,
one entry a line, as ATC's ``--keep_dtype`` reads it and ``convert --keep-dtype`` takes it), the
accuracy reached, the estimated latency with and without the kept ops (the cost model's estimate, as
in the plan report) and the search trace.

**Backends.** ``backend="emulator"`` (the default) judges candidates as above. ``backend="atc"`` (CLI
``debug precision --backend atc [--atc PATH]``) is for a CANN host — **ATC + ACL: verified against
stand-ins only** (no real ATC or device has run it): each candidate is compiled by ATC
(:func:`npu_deploy.convert` with ``backend="atc"``, the precision mode and the keep list as ATC's
``--keep_dtype`` file) and run on the device through :class:`npu_deploy.InferenceSession` (the ACL
backend), then judged against the same onnxruntime outputs. The candidates are still the ops the
built-in plan runs in float16, and the latency figures stay the cost model's estimates (nothing is
timed on the device). A model whose nodes lack unique names is given to ATC as a copy carrying the
names the keep list uses (the loader's ``<op_type>_<index>``). With ``by_type``, ATC gets ``OpType::``
entries in Ascend IR types (the support table's names for each ONNX type). An ATC or ACL failure
stops the search with its one-line error (exit 3); the evaluations done so far stay in the checkpoint.

Evaluations are cached by keep set; ``checkpoint`` (a JSON file) stores them after each one, so an
interrupted search (Ctrl-C) keeps what it learnt: re-run with the same checkpoint to resume, and the
best keep list found so far is in :attr:`PrecisionSearch.best`.

>>> res = precision_search("model.onnx", mode="force_fp16", cosine=0.999)    # doctest: +SKIP
>>> res.keep, res.verdict()                                                 # doctest: +SKIP
(['Conv_3', 'Add_7'], 'PASS: 2 of 57 ops kept in float32 reach cosine 0.99942 >= 0.999 ...')
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from npu_deploy._io import atomic_write, load_npz, output_error
from npu_deploy._result import Result
from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.cost import accuracy_note
from npu_deploy.converters.lowering.atc import require_atc
from npu_deploy.converters.files.bundle import write_plan_bundle
from npu_deploy.converters.lowering.convert import convert
from npu_deploy.converters.files.onnx_model import name_nodes
from npu_deploy.converters.lowering.options import ConvertOptions
from npu_deploy.errors import InputError, ModelError
from npu_deploy.runtime import device
from npu_deploy.runtime.check.compare import OnnxruntimeReference, compare_arrays, generate_inputs
from npu_deploy.runtime.emulator import EmulatorBackend
from npu_deploy.runtime.session import InferenceSession

SEARCH_MODES = ("force_fp16", "allow_mix_precision")
#: where candidates run: the CPU emulator's float16 emulation, or ATC + the device (stand-in verified only)
BACKENDS = ("emulator", "atc")
DEFAULT_COSINE = 0.999
_LOW = ("float16", "bfloat16")


@dataclasses.dataclass
class Evaluation:
    """One candidate keep set judged: worst cosine and largest abs error over outputs and samples."""

    kept: int
    cosine: float | None
    max_abs: float | None
    naninf: bool
    passed: bool
    est_us: float | None = None
    seconds: float = 0.0


@dataclasses.dataclass
class PrecisionResult(Result):
    """The outcome of :func:`precision_search`. Truthy when the keep list reaches the target."""

    SCHEMA = "npu-deploy/precision-search"
    SCHEMA_VERSION = 1

    model: str = ""
    mode: str = ""
    backend: str = "emulator"
    by_type: bool = False
    target: dict = dataclasses.field(default_factory=dict)
    samples: int = 0
    candidates: int = 0
    keep: list = dataclasses.field(default_factory=list)
    reached: bool = False
    complete: bool = True
    cosine: float | None = None
    max_abs: float | None = None
    baseline_cosine: float | None = None
    baseline_max_abs: float | None = None
    est_us: float | None = None
    baseline_est_us: float | None = None
    #: how good the cost model behind ``est_us`` is for the SoC (``cost.accuracy_note``, as convert prints)
    cost_accuracy: str = ""
    evaluations: int = 0
    seconds: float = 0.0
    trace: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return self.reached

    def latency_cost_pct(self) -> float | None:
        """Estimated latency added by the kept ops, in percent of the all-float16 plan's estimate."""
        if self.est_us is None or not self.baseline_est_us:
            return None
        return (self.est_us - self.baseline_est_us) / self.baseline_est_us * 100.0

    def target_text(self) -> str:
        if self.target.get("max_abs") is not None:
            return f"max abs error <= {self.target['max_abs']:g}"
        return f"cosine >= {self.target.get('cosine', DEFAULT_COSINE):g}"

    def accuracy_text(self) -> str:
        return f"cosine {_cos(self.cosine, self.target.get('cosine', DEFAULT_COSINE))}, max abs error {_f(self.max_abs)}"

    def verdict(self) -> str:
        cost = self.latency_cost_pct()
        cost_text = f", estimated latency {cost:+.1f} %" if cost is not None else ""
        if cost is not None and self.cost_accuracy:
            cost_text += f" ({self.cost_accuracy})"
        partial = "" if self.complete else " (interrupted: best so far)"
        if not self.reached:
            return (f"FAIL: {self.target_text()} not reached{partial}: {self.accuracy_text()} with "
                    f"{len(self.keep)} of {self.candidates} {'op types' if self.by_type else 'ops'} in float32")
        unit = "op types" if self.by_type else "ops"
        if not self.keep:
            return f"PASS: no op needs float32 ({self.accuracy_text()}, {self.target_text()})"
        return (f"PASS{partial}: {len(self.keep)} of {self.candidates} {unit} kept in float32 reach "
                f"{self.target_text()} ({self.accuracy_text()}; {self.mode} alone: {self.baseline_text()})"
                f"{cost_text}")

    def baseline_text(self) -> str:
        """The accuracy with no op kept, in the target's metric."""
        if self.target.get("max_abs") is not None:
            return f"max abs error {_f(self.baseline_max_abs)}"
        return f"cosine {_cos(self.baseline_cosine, self.target.get('cosine', DEFAULT_COSINE))}"

    def cfg_text(self) -> str:
        """The keep list as ATC's ``--keep_dtype`` file: one op name or ``OpType::X`` a line."""
        return "".join(f"{k}\n" for k in self.keep)

    def write_cfg(self, path: str | os.PathLike) -> None:
        with atomic_write(path, "w", encoding="utf-8") as f:
            f.write(self.cfg_text())


def _f(v, spec=".3e") -> str:
    return "n/a" if v is None else format(v, spec)


def _cos(v, target=None) -> str:
    """A cosine with enough digits to see which side of ``target`` it is on (at least six):
    0.99998999 against 0.99999 prints ``0.99998999``, not ``0.999990``."""
    if v is None:
        return "n/a"
    for d in range(6, 13):
        if target is None or format(v, f".{d}f") != format(target, f".{d}f") or v == target:
            return format(v, f".{d}f")
    return format(v, ".12f")


# ------------------------------------------------------------------------------------------ inputs
def load_samples(paths: Sequence[str | os.PathLike]) -> list[dict[str, np.ndarray]]:
    """Samples from ``.npz`` files: arrays named as the model's inputs make one sample; arrays named
    ``NAME@K`` (``x@0``, ``x@1``, ...) make one sample per ``K`` in one file.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "s.npz")
    >>> np.savez(p, **{"x@0": np.zeros(2), "x@1": np.ones(2)})
    >>> [float(s["x"][0]) for s in load_samples([p])]
    [0.0, 1.0]
    """
    out: list[dict[str, np.ndarray]] = []
    for p in paths:
        if not Path(p).is_file():
            raise InputError(f"inputs file {p} does not exist", hint="give .npz files of model inputs")
        arrays = load_npz(p)
        tagged = {k: v for k, v in arrays.items() if "@" in k and k.rpartition("@")[2].isdigit()}
        if not tagged:
            out.append(arrays)
            continue
        if len(tagged) != len(arrays):
            raise InputError(f"{p}: mixes NAME and NAME@K arrays", hint="name every array NAME@K, or none")
        groups: dict[int, dict[str, np.ndarray]] = {}
        for k, v in tagged.items():
            name, _, idx = k.rpartition("@")
            groups.setdefault(int(idx), {})[name] = v
        out.extend(groups[i] for i in sorted(groups))
    return out


# ------------------------------------------------------------------------------------------ search
class PrecisionSearch:
    """The search's state: the model loaded once, the golden outputs, the evaluation cache.

    ``progress(text)`` is called after each evaluation. ``best`` is the smallest passing keep list
    found so far (None before one passes).
    """

    def __init__(self, model: str | os.PathLike, *, samples: Sequence[Mapping[str, np.ndarray]] | None = None,
                 n_samples: int = 1, seed: int = 0, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 mode: str = "force_fp16", cosine: float | None = None, max_abs: float | None = None,
                 by_type: bool = False, soc: str | None = None, checkpoint: str | os.PathLike | None = None,
                 progress: Callable[[str], None] | None = None, backend: str = "emulator",
                 atc: str | os.PathLike | None = None):
        if backend not in BACKENDS:
            raise InputError(f"backend {backend!r} cannot run the search",
                             hint=f"use one of {', '.join(BACKENDS)}")
        if atc is not None and backend != "atc":
            raise InputError("an ATC path is for the atc backend", hint="add --backend atc, or drop --atc")
        if mode not in SEARCH_MODES:
            raise InputError(f"precision mode {mode!r} cannot be searched", hint=f"use one of {', '.join(SEARCH_MODES)}")
        if cosine is not None and max_abs is not None:
            raise InputError("give either a cosine target or a max-abs bound, not both")
        if cosine is not None and not -1.0 <= float(cosine) <= 1.0:
            raise InputError(f"cosine target {cosine} must be between -1 and 1", hint="e.g. --cosine 0.999")
        if max_abs is not None and not (math.isfinite(float(max_abs)) and float(max_abs) >= 0):
            raise InputError(f"max-abs bound {max_abs} must be a finite number >= 0", hint="e.g. --max-abs 1e-2")
        if n_samples < 1:
            raise InputError(f"samples {n_samples} must be at least 1")
        self.model = Path(model)
        if not self.model.is_file():
            raise InputError(f"model {self.model} does not exist", hint="give the original .onnx model")
        self.mode = mode
        self.backend = backend
        # a missing ATC or pyACL is an environment failure (exit 3) found before any golden run or compile
        self.atc = require_atc(atc) if backend == "atc" else None
        if backend == "atc":
            device.load_acl()
        self.by_type = bool(by_type)
        self.cosine = None if max_abs is not None else (DEFAULT_COSINE if cosine is None else float(cosine))
        self.max_abs = None if max_abs is None else float(max_abs)
        self.progress = progress or (lambda text: None)
        self.options = ConvertOptions(backend="builtin", soc=soc, input_shapes=input_shapes, precision_mode=mode)
        self._work = Path(tempfile.mkdtemp(prefix="npu-deploy-precision-"))
        self._count = 0
        self._atc_src: Path | None = None
        self._unnamed: bool | None = None
        self.trace: list[dict] = []
        self.cache: dict[tuple, Evaluation] = {}
        self.best: list[str] | None = None
        self.best_eval: Evaluation | None = None
        self.notes: list[str] = []
        self.t0 = time.perf_counter()

        base = pipeline.lower(self.model, None, self.options, until="op support")
        self._loaded, self._support = base.loaded, base.support
        plan0 = self._plan(())
        self.nodes = self._candidates(plan0)
        self.baseline_est_us = _est_us(plan0)
        if self.by_type:
            types = list(dict.fromkeys(op for _, op in self.nodes))
            self.candidates = [f"OpType::{t}" for t in types]
            self.cann_types = self._cann_types()
        else:
            self.candidates = [n for n, _ in self.nodes]

        self._ref = OnnxruntimeReference(self.model)
        if samples:
            self.samples = [{k: np.asarray(v) for k, v in s.items()} for s in samples]
        else:
            metas = self._ref.get_inputs()
            self.samples = [generate_inputs(metas, seed=seed + k, shapes=input_shapes) for k in range(n_samples)]
        names = [o.name for o in self._ref.get_outputs()]
        self.output_names = names
        self.golden = [self._ref.run(names, self._ref_feeds(s)) for s in self.samples]

        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self._key = self._identity()
        if self.checkpoint is not None and self.checkpoint.is_file():
            self._resume()

    # -------------------------------------------------------------------------------- pieces
    def _ref_feeds(self, s: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for m in self._ref.get_inputs():
            if m.name not in s:
                raise InputError(f"the inputs give no value for model input {m.name!r}",
                                 hint="name the .npz arrays as the model's inputs")
            a = np.asarray(s[m.name])
            out[m.name] = a.astype(m.dtype) if a.dtype != m.dtype and np.can_cast(a.dtype, m.dtype, "same_kind") else a
        return out

    def _plan(self, keep: Sequence[str]):
        o = dataclasses.replace(self.options, keep_dtype=tuple(keep))
        ctx = pipeline.Lowering(o, self.model, None, True, loaded=self._loaded, support=self._support)
        pipeline.run_steps([pipeline.STEPS["plan from ONNX"]], ctx)
        return ctx.plan

    def _candidates(self, plan) -> list[tuple[str, str]]:
        nf = plan.node_formats
        out = []
        for n in self._loaded.model.graph.node:
            rec = nf.get(n.name)
            if rec is None or getattr(rec, "folded", False):
                continue
            if str(getattr(rec, "dtype", "")) in _LOW:
                out.append((n.name, n.op_type))
        return out

    def _cann_types(self) -> dict[str, str]:
        """ONNX op type -> the Ascend IR type(s) ATC's ``OpType::`` entries name (from the support table)."""
        seen: dict[str, set[str]] = {}
        for n in getattr(self._support, "nodes", []) or []:
            if n.cann_op:
                seen.setdefault(n.op_type, set()).add(str(n.cann_op))
        return {k: "/".join(sorted(v)) for k, v in seen.items()}

    def _identity(self) -> str:
        h = hashlib.sha256()
        with open(self.model, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        for s in self.samples:
            for k in sorted(s):
                h.update(k.encode())
                h.update(np.ascontiguousarray(s[k]).tobytes())
        h.update(json.dumps([self.mode, self.by_type, self.options.soc,
                             {k: list(v) for k, v in (self.options.input_shapes or {}).items()}]).encode())
        if self.options.cost_profile is not None:   # a SoC profile JSON prices est_us: another checkpoint
            h.update(json.dumps(self.options.cost_profile.to_dict(), sort_keys=True, default=str).encode())
        if self.backend != "emulator":   # device results are not the emulator's (emulator keys unchanged)
            h.update(self.backend.encode())
        return h.hexdigest()

    def _resume(self) -> None:
        try:
            d = json.loads(self.checkpoint.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.notes.append(f"checkpoint {self.checkpoint} is unreadable: started afresh")
            return
        if d.get("schema") != "npu-deploy/precision-checkpoint" or d.get("key") != self._key:
            self.notes.append(f"checkpoint {self.checkpoint} is for another model, inputs, mode or backend: started afresh")
            return
        for e in d.get("evaluations") or []:
            try:
                self.cache[tuple(e["keep"])] = Evaluation(**e["result"])
            except (KeyError, TypeError):
                continue
        self.notes.append(f"resumed from {self.checkpoint}: {len(self.cache)} evaluations reused")

    def _save(self) -> None:
        if self.checkpoint is None:
            return
        d = {"schema": "npu-deploy/precision-checkpoint", "schema_version": 1, "key": self._key,
             "model": str(self.model), "mode": self.mode, "backend": self.backend, "best": self.best,
             "evaluations": [{"keep": list(k), "result": dataclasses.asdict(v)} for k, v in self.cache.items()]}
        # a checkpoint must outlive an interrupted run: written beside, renamed, never rolled back
        tmp = self.checkpoint.with_name(f".{self.checkpoint.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(d, allow_nan=False, default=_json_default) + "\n", encoding="utf-8")
            os.replace(tmp, self.checkpoint)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise output_error(self.checkpoint, e) from e

    def evaluate(self, keep: Sequence[str], phase: str) -> Evaluation:
        """Judge one keep set (cached)."""
        key = tuple(sorted(keep))
        hit = self.cache.get(key)
        if hit is None:
            hit = self._run(key)
            self.cache[key] = hit
            self._save()
        self._count += 1
        if hit.passed and (self.best is None or len(key) < len(self.best)):
            self.best, self.best_eval = list(key), hit
        self.trace.append({"step": len(self.trace) + 1, "phase": phase, "kept": len(key),
                           "cosine": hit.cosine, "max_abs": hit.max_abs, "passed": hit.passed,
                           "est_us": hit.est_us})
        self.progress(f"[{len(self.trace)}] {phase}: {len(key)}/{len(self.candidates)} kept -> cosine "
                      f"{_f(hit.cosine, '.6f')}, max abs {_f(hit.max_abs)} ({'pass' if hit.passed else 'fail'}; "
                      f"{time.perf_counter() - self.t0:.0f} s)")
        return hit

    def _run(self, keep: tuple[str, ...]) -> Evaluation:
        t = time.perf_counter()
        plan = self._plan(keep)          # the cost estimate (and the check of the keep names), either backend
        outputs = self._on_device(keep) if self.backend == "atc" else self._on_emulator(plan)
        worst_cos, worst_abs, naninf = 1.0, 0.0, False
        for outs, gold in zip(outputs, self.golden):
            for name, g, o in zip(self.output_names, gold, outs):
                c = compare_arrays(name, g, o, atol=0.0, rtol=0.0)
                if c.nan_target > c.nan_ref or c.inf_target > c.inf_ref or c.cosine is None:
                    naninf = True
                worst_cos = None if worst_cos is None or c.cosine is None else min(worst_cos, c.cosine)
                worst_abs = None if worst_abs is None or c.max_abs is None else max(worst_abs, c.max_abs)
        if self.max_abs is not None:
            passed = not naninf and worst_abs is not None and worst_abs <= self.max_abs
        else:
            passed = not naninf and worst_cos is not None and worst_cos >= self.cosine
        return Evaluation(len(keep), worst_cos, worst_abs, naninf, passed, _est_us(plan),
                          round(time.perf_counter() - t, 3))

    def _on_emulator(self, plan) -> list[list[np.ndarray]]:
        """Every sample's outputs from the candidate's bundle on the emulator."""
        path = self._work / "candidate.bundle"
        write_plan_bundle(path, self._loaded, plan, support=self._support)
        try:
            with EmulatorBackend(path, session_options=_one_thread_options()) as b:
                return [b.run(self.output_names, s) for s in self.samples]
        finally:
            path.unlink(missing_ok=True)

    def _on_device(self, keep: tuple[str, ...]) -> list[list[np.ndarray]]:
        """Every sample's outputs from the candidate compiled by ATC and run through ACL."""
        res = convert(self._atc_model(), self._work / "cand.om", backend="atc", atc=self.atc, soc=self.options.soc,
                      input_shapes=self.options.input_shapes, precision_mode=self.mode,
                      keep_dtype=self._atc_keep(keep) or None)
        om = Path(res.output)
        try:
            with InferenceSession(om, backend="acl") as sess:
                have = [o.name for o in sess.get_outputs()]
                if len(have) != len(self.output_names):
                    raise ModelError(f"{om}: ATC's model has {len(have)} outputs, {self.model} has "
                                     f"{len(self.output_names)}", hint="check the model's outputs (--out_nodes)")
                # ATC may rename outputs; their order is the ONNX graph's
                names = self.output_names if set(self.output_names) <= set(have) else None
                return [sess.run(names, s) for s in self.samples]
        finally:
            om.unlink(missing_ok=True)

    def _has_unnamed_nodes(self) -> bool:
        """Whether some top-level node of the model file has no name or shares one (the loader named it)."""
        if self._unnamed is None:
            names = [n.name for n in onnx.load(self.model, load_external_data=False).graph.node]
            self._unnamed = not all(names) or len(set(names)) != len(names)
        return self._unnamed

    def _atc_model(self) -> Path:
        """The model ATC compiles: the original, or a copy named as the keep list names its nodes."""
        if self._atc_src is not None:
            return self._atc_src
        if not self._has_unnamed_nodes():
            self._atc_src = self.model
            return self._atc_src
        m = onnx.load(self.model, load_external_data=False)
        external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in m.graph.initializer)
        if external:
            m = onnx.load(self.model)
        name_nodes(m.graph)        # the loader's naming, so the names are the plan's
        path = self._work / f"{self.model.stem}.named.onnx"
        onnx.save(m, path, save_as_external_data=external, location=f"{path.name}.data" if external else None)
        self._atc_src = path
        return path

    def _atc_keep(self, keep: Sequence[str]) -> list[str]:
        """The keep list in ATC's terms: node names as they are; ``OpType::`` in Ascend IR types."""
        if not self.by_type:
            return list(keep)
        out: list[str] = []
        for k in keep:
            onnx_type = k[len("OpType::"):]
            for ir in self.cann_types.get(onnx_type, onnx_type).split("/"):
                out.append(f"OpType::{ir}")
        return list(dict.fromkeys(out))

    # -------------------------------------------------------------------------------- search
    def run(self) -> PrecisionResult:
        """Run the search to the end (see the module docstring)."""
        cands = self.candidates
        none = self.evaluate([], "baseline")
        self.baseline = none
        if none.passed:
            return self.result(complete=True)
        full = self.evaluate(cands, "all float32")
        if not full.passed:
            self.notes.append(f"even with all {len(cands)} candidate ops in float32 the target is not reached "
                              f"(cosine {_f(full.cosine, '.6f')}): the loss is not from float16 rounding of op "
                              f"outputs")
            return self.result(complete=True, fallback=(list(cands), full))
        # shortest passing prefix: keeping cands[:hi] passes, cands[:lo] fails
        lo, hi = 0, len(cands)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.evaluate(cands[:mid], "bisect end").passed:
                hi = mid
            else:
                lo = mid
        end = hi
        # latest start: cands[start:end] passes, cands[bad:end] fails
        good, bad = 0, end
        while bad - good > 1:
            mid = (good + bad) // 2
            if self.evaluate(cands[mid:end], "bisect start").passed:
                good = mid
            else:
                bad = mid
        keep = list(cands[good:end])
        keep = self._prune(keep)
        return self.result(complete=True)

    def _prune(self, keep: list[str]) -> list[str]:
        chunk = max(1, len(keep) // 2)
        while True:
            k = 0
            while k < len(keep):
                trial = keep[:k] + keep[k + chunk:]
                if self.evaluate(trial, f"prune by {chunk}").passed:
                    keep = trial
                else:
                    k += chunk
            if chunk == 1:
                return keep
            chunk = max(1, chunk // 2)

    def result(self, *, complete: bool, fallback: tuple[list[str], Evaluation] | None = None) -> PrecisionResult:
        """What the search has: the best passing keep list (or, when none passed, ``fallback``)."""
        base = getattr(self, "baseline", None) or self.cache.get(())
        if self.best is not None:
            keep, ev = self._ordered(self.best), self.best_eval
        elif fallback is not None:
            keep, ev = fallback
        else:
            keep, ev = [], base
        if complete:
            shutil.rmtree(self._work, ignore_errors=True)
        notes = list(self.notes)
        if keep and not self.by_type and self._has_unnamed_nodes():
            notes.append("some nodes of the model have no unique name: the keep list uses npu-deploy's names "
                         "(<op_type>_<index>), which ATC finds only in a model whose nodes carry them"
                         + (" (the search gave ATC such a copy)" if self.backend == "atc" else ""))
        if self.backend == "atc":
            notes.append("judged on ATC + ACL (verified against stand-ins only); the latency figures are the "
                         "cost model's estimates, not device timings")
        if self.by_type and keep:
            names = getattr(self, "cann_types", {})
            differ = [f"{k[len('OpType::'):]} -> {names[k[len('OpType::'):]]}" for k in keep
                      if names.get(k[len("OpType::"):], k[len("OpType::"):]) != k[len("OpType::"):]]
            if differ:
                notes.append("the OpType:: entries are ONNX op types (what convert --keep-dtype takes); ATC's "
                             "--keep_dtype names Ascend IR types: " + ", ".join(differ))
        return PrecisionResult(model=str(self.model), mode=self.mode, backend=self.backend, by_type=self.by_type,
                               target={"cosine": self.cosine, "max_abs": self.max_abs}, samples=len(self.samples),
                               candidates=len(self.candidates), keep=keep,
                               reached=bool(ev is not None and ev.passed), complete=complete,
                               cosine=ev.cosine if ev else None, max_abs=ev.max_abs if ev else None,
                               baseline_cosine=base.cosine if base else None,
                               baseline_max_abs=base.max_abs if base else None,
                               est_us=ev.est_us if ev else None, baseline_est_us=self.baseline_est_us,
                               cost_accuracy=accuracy_note(self.options.cost_profile or self.options.soc),
                               evaluations=len(self.cache), seconds=round(time.perf_counter() - self.t0, 3),
                               trace=list(self.trace), notes=notes)

    def _ordered(self, keep: Sequence[str]) -> list[str]:
        pos = {c: k for k, c in enumerate(self.candidates)}
        return sorted(keep, key=lambda c: pos.get(c, len(pos)))

    def close(self) -> None:
        shutil.rmtree(self._work, ignore_errors=True)


def _one_thread_options():
    """onnxruntime options for judging candidates: one intra-op and one inter-op thread, sequential.

    The search compares errors with a threshold, and the kept-op list it returns sits where the error
    crosses it (on PP-OCR cls at 2e-4 the final list reaches 1.9994e-4): results must not depend on the
    host's core count or on how its load splits work between threads. One thread is also cheaper here,
    the candidates are small (PP-OCR cls: 0.16 s CPU per 5 runs less than the default pool, which spins
    its threads on a loaded machine)."""
    import onnxruntime as ort  # vendor import, loaded by the emulator anyway

    o = ort.SessionOptions()
    o.log_severity_level = 4  # failures come back as exceptions, reported in one line
    o.intra_op_num_threads = 1
    o.inter_op_num_threads = 1
    o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return o


def _est_us(plan) -> float | None:
    try:
        cost = plan.report.to_dict().get("cost") or {}
    except Exception:  # a plan without a cost estimate
        return None
    v = cost.get("total_us")
    return float(v) if v is not None else None


def _json_default(o: Any):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(type(o).__name__)


def precision_search(model: str | os.PathLike, **kw: Any) -> PrecisionResult:
    """Run the whole search (arguments as :class:`PrecisionSearch`); return a :class:`PrecisionResult`."""
    s = PrecisionSearch(model, **kw)
    try:
        return s.run()
    finally:
        s.close()
