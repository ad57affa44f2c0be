"""Layer-by-layer accuracy debugging: device dumps against onnxruntime, tensor by tensor.

:func:`debug_compare` answers "where does the converted model lose accuracy?":

1. **Golden** — onnxruntime (CPU, float32, graph optimisation *off*, so that no ONNX tensor is fused
   away) runs the original model once with every node output exposed (:func:`golden_outputs`), on the
   inputs the dump was taken with (``inputs``: the ``.npz`` that ``run --dump`` / ``compare
   --save-inputs`` wrote).
2. **Mapping** — each dumped output is mapped to the ONNX tensor it holds: through the ``.om``'s
   ``_datadump_original_op_names`` / ``_datadump_origin_name`` / ``_datadump_origin_output_index``
   (``om=``; a fused op compares many-to-one on its last node's tensor), else through the dump's own
   ``OriginalOp`` (name and output index; emulator dumps carry the ONNX tensor name), else the op's
   own name as an ONNX node. TransData and Cast ops that the converter inserted (``bundle=`` lists
   them; in an ``.om`` they have no original node) are **device-only** rows: they hold a tensor in
   another layout or dtype, and are compared against that tensor too.
3. **Metrics** per tensor (device side brought back to its logical layout through the format core):
   cosine, max abs / max rel error, RMSE, mean abs / mean rel error, accumulated relative error,
   relative Euclidean distance, NaN/Inf counts and an **overflow** flag (NaN/Inf the golden tensor
   lacks, or golden values beyond the device dtype's range: 65504 for float16).
4. **Where error starts** — rows are put in topological order (the ONNX producer's position); the
   **first divergent** row and the **first NaN/Inf** row are named. For the first ``isolate`` failing
   rows the node is run *alone* on onnxruntime, fed the values the device had for its inputs (the
   mapped dumps; graph inputs and constants as given), and its output compared with the dumped one:
   when the node alone reproduces the device output, the error was already in its inputs
   (``accumulates``); when it does not, the error **enters** at this node. (Fed the golden inputs
   instead, onnxruntime would only reproduce the golden output, which the row already compares.)

A tensor passes when its cosine is at least ``cosine_min`` (default 0.99 for a float16/bfloat16 device
tensor, the usual msaccucmp mark, and 0.9999 for float32), it has no NaN/Inf the golden tensor lacks,
and, when ``atol``/``rtol`` are given, at most ``max_outside`` of its elements lie outside
``|d - g| <= atol + rtol * |g|``. Integer and boolean tensors must be equal.

Dumps of another model are refused (exit 2, "dumps and model do not match") rather than judged: at
least half of the dumped compute tensors (TransData/Cast and the graph inputs aside) must map to a tensor
of the model, and at least one must (:func:`_check_dumps_match`).

The result (:class:`DebugCompareResult`, schema ``npu-deploy/debug-compare``) renders as a terminal
table (worst first), a CSV with msaccucmp's column names (:meth:`~DebugCompareResult.write_csv`) and a
self-contained HTML page with a per-layer error chart (:meth:`~DebugCompareResult.write_html`).

>>> res = debug_compare("model.onnx", "dumps/", bundle="model.bundle", inputs="in.npz")   # doctest: +SKIP
>>> res.first_divergent["node"], res.verdict()                                            # doctest: +SKIP
('Conv_12', "FAIL: 14/152 tensors beyond tolerance; first divergent: node 'Conv_12' ...")
"""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import onnx
from onnx import helper

from npu_deploy._html import page
from npu_deploy._io import atomic_write, load_npz
from npu_deploy._result import Result
from npu_deploy._text import printable
from npu_deploy.converters.files import dump as dumpfmt
from npu_deploy.converters import formats
from npu_deploy.converters.formats.graph import axis_perm, is_plain
from npu_deploy.converters.files import om as omfile
from npu_deploy.runtime.check.against import _data_edges, _source
from npu_deploy.converters.files.bundle import read_bundle
from npu_deploy.converters.files.onnx_model import name_nodes
from npu_deploy.errors import FormatError, InputError, ModelError
from npu_deploy.runtime.backend import ORT_TYPES
from npu_deploy.runtime.check.compare import check_thresholds

DEVICE_ONLY_TYPES = frozenset({"TransData", "Cast", "TransDataRNN", "TransDataD", "TransposeD"})
LOW_PRECISION_COSINE = 0.99   # msaccucmp's usual "look here" mark for fp16 tensors
FULL_PRECISION_COSINE = 0.9999
_DTYPE_MAX = {"float16": 65504.0, "bfloat16": 3.3895e38}
ISOLATE_DEFAULT = 8

# msaccucmp's result columns (reference/accuracy-debug.md §5); "DataType" appears twice on purpose
MSACCUCMP_COLUMNS = ["OpType", "NPUDump", "DataType", "Address", "GroundTruth", "DataType", "TensorIndex",
                     "Shape", "Overflow", "CosineSimilarity", "MaxAbsError", "AccumulatedRelativeError",
                     "RelativeEuclideanDistance", "KullbackLeiblerDivergence", "StandardDeviation",
                     "MeanAbsoluteError", "RootMeanSquareError", "MaxRelativeError", "MeanRelativeError",
                     "CompareFailReason", "IsNpuOps", "IsOutputNode", "IsPrecisionError"]


# ------------------------------------------------------------------------------------------ results
@dataclasses.dataclass
class TensorRow:
    """One dumped tensor against its golden ONNX tensor.

    ``op``/``op_type``: the device op; ``node``: the ONNX node that produced ``tensor`` (for a fused op,
    the last of ``fused``); ``position``: that node's index in the ONNX graph (-1 for a graph input);
    ``device_only``: an op the converter inserted (TransData/Cast). ``origin`` is ``"enters"`` or
    ``"accumulates"`` for an isolated failing row (see the module docstring), with ``local_cosine`` /
    ``local_max_abs`` the node alone on the device's inputs against the dumped output. ``note``: how the
    dumped tensor was read when its recorded shape was unusable."""

    op: str
    op_type: str
    output_index: int
    node: str | None
    tensor: str | None
    position: int
    device_only: bool = False
    fused: list = dataclasses.field(default_factory=list)
    dump: str = ""
    shape: list = dataclasses.field(default_factory=list)
    dtype: str = ""
    format: str = ""
    golden_dtype: str = ""
    cosine: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    rmse: float | None = None
    mean_abs: float | None = None
    mean_rel: float | None = None
    acc_rel: float | None = None
    rel_euclidean: float | None = None
    kl_divergence: float | None = None
    std_golden: float | None = None
    std_device: float | None = None
    outside_share: float | None = None
    nan: int = 0
    inf: int = 0
    nan_golden: int = 0
    inf_golden: int = 0
    overflow: bool = False
    is_output: bool = False
    compared: bool = True
    passed: bool = True
    reason: str = ""
    origin: str | None = None
    local_cosine: float | None = None
    local_max_abs: float | None = None
    note: str = ""


@dataclasses.dataclass
class DebugCompareResult(Result):
    """The outcome of :func:`debug_compare`: one :class:`TensorRow` per dumped tensor (topological
    order), the first divergent and first NaN/Inf rows (as dicts, or None), truthy when every compared
    tensor is within tolerance."""

    SCHEMA = "npu-deploy/debug-compare"
    SCHEMA_VERSION = 1

    model: str = ""
    dumps: str = ""
    mapping: str = ""
    inputs: dict = dataclasses.field(default_factory=dict)
    cosine_min: float | None = None
    atol: float | None = None
    rtol: float | None = None
    max_outside: float = 0.0
    rows: list = dataclasses.field(default_factory=list)
    first_divergent: dict | None = None
    first_nan_inf: dict | None = None
    unmatched: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    seconds: dict = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(r.compared for r in self.rows) and all(r.passed for r in self.rows)

    def failures(self) -> list[TensorRow]:
        return [r for r in self.rows if not r.passed]

    def compared(self) -> list[TensorRow]:
        return [r for r in self.rows if r.compared]

    def verdict(self) -> str:
        n = len(self.compared())
        if not n:
            return "FAIL: no dumped tensor could be matched to an ONNX tensor"
        bad = self.failures()
        if not bad:
            worst = min((r.cosine for r in self.rows if r.cosine is not None), default=None)
            tail = f" (worst cosine {worst:.6f})" if worst is not None else ""
            return f"PASS: {n}/{n} tensors within tolerance{tail}"
        fd = self.first_divergent or {}
        text = f"FAIL: {len(bad)}/{n} tensors beyond tolerance; first divergent: {_describe(fd)}"
        if fd.get("origin"):
            text += " (error enters here)" if fd["origin"] == "enters" else " (error accumulated from its inputs)"
        if self.first_nan_inf:
            text += f"; first NaN/Inf: {_describe(self.first_nan_inf)}"
        return text

    @classmethod
    def from_dict(cls, d: dict) -> "DebugCompareResult":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        rnames = {f.name for f in dataclasses.fields(TensorRow)}
        kw["rows"] = [r if isinstance(r, TensorRow) else TensorRow(**{k: v for k, v in r.items() if k in rnames})
                      for r in kw.get("rows", [])]
        return cls(**kw)

    # ---------------------------------------------------------------------------- renderings
    def table(self, top: int | None = 20) -> str:
        """The compared tensors as an aligned text table, worst first (``top`` rows; None: all)."""
        rows = sorted(self.compared(), key=_badness, reverse=True)
        shown = rows if top is None else rows[:top]
        cells = [[printable(r.op), printable(r.tensor or ""), f"{r.dtype}/{r.format}", _f(r.cosine, ".6f"),
                  _f(r.max_abs), _f(r.max_rel), _f(r.rmse), f"{r.nan}/{r.inf}", "yes" if r.overflow else "",
                  ("ok" if r.passed else "FAIL") + (f" ({r.origin})" if r.origin else "")]
                 for r in shown]
        head = ["op", "tensor", "dtype/format", "cosine", "max_abs", "max_rel", "rmse", "nan/inf", "overflow",
                "result"]
        widths = [min(48, max([len(h), *(len(c[i]) for c in cells)])) for i, h in enumerate(head)]

        def line(vals):
            out = []
            for i, (v, w) in enumerate(zip(vals, widths)):
                if len(v) > w:  # keep both ends: long ONNX names differ at the end (…/layer.2/attn/MatMul)
                    v = v[: w // 3] + "…" + v[len(v) - (w - w // 3 - 1):]
                out.append(f"{v:<{w}s}" if i in (0, 1, 2, 9) else f"{v:>{w}s}")
            return "  ".join(out).rstrip()

        lines = [line(head)] + [line(c) for c in cells]
        if top is not None and len(rows) > top:
            lines.append(f"... {len(rows) - top} more tensors (all in --csv/--json/--html)")
        return "\n".join(lines)

    def summary_lines(self) -> list[str]:
        """The findings in words: first divergent node, where its error comes from, first NaN/Inf."""
        out = []
        fd = self.first_divergent
        if fd:
            line = f"first divergent: {_describe(fd)} in topological order"
            if fd.get("origin") == "enters":
                line += (f"; the node alone on the device's inputs gives cosine {_f(fd.get('local_cosine'), '.6f')}"
                         f" against its dump: the error enters here")
            elif fd.get("origin") == "accumulates":
                line += (f"; the node alone on the device's inputs reproduces its dump (cosine "
                         f"{_f(fd.get('local_cosine'), '.6f')}): the error accumulated from its inputs")
            out.append(line)
        if self.first_nan_inf:
            out.append(f"first NaN/Inf: {_describe(self.first_nan_inf)}")
        if self.unmatched:
            shown = ", ".join(printable(u) for u in self.unmatched[:5])
            out.append(f"{len(self.unmatched)} dumped tensor(s) match no ONNX tensor: {shown}"
                       + (" ..." if len(self.unmatched) > 5 else ""))
        out.extend(printable(n) for n in self.notes)
        return out

    def csv_text(self) -> str:
        """The rows as CSV with msaccucmp's column names (one row per dumped tensor)."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(MSACCUCMP_COLUMNS)
        for r in self.rows:
            w.writerow([_csv_safe(r.op_type), _csv_safe(r.op), r.dtype, "NaN",
                        _csv_safe(",".join(r.fused) if r.fused else (r.node or r.tensor or "*")), r.golden_dtype or "NaN",
                        _csv_safe(f"{r.op}:output:{r.output_index}"), str(tuple(r.shape)),
                        "YES" if r.overflow else "NO", _c(r.cosine), _c(r.max_abs), _c(r.acc_rel),
                        _c(r.rel_euclidean), _c(r.kl_divergence),
                        f"{_c(r.std_golden)};{_c(r.std_device)}", _c(r.mean_abs), _c(r.rmse), _c(r.max_rel),
                        _c(r.mean_rel), _csv_safe(r.reason), "YES" if r.device_only else "NO",
                        "YES" if r.is_output else "NO", "YES" if not r.passed else "NO"])
        return buf.getvalue()

    def write_csv(self, path: str | os.PathLike) -> None:
        with atomic_write(path, "w", encoding="utf-8", newline="") as f:
            f.write(self.csv_text())

    def html(self) -> str:
        """A self-contained HTML page (no script, no external resource): the findings, a per-layer
        error chart (1 - cosine, log scale, topological order) and the table. Every name is escaped."""
        return _render_html(self)

    def write_html(self, path: str | os.PathLike) -> None:
        with atomic_write(path, "w", encoding="utf-8") as f:
            f.write(self.html())


def _describe(d: Mapping[str, Any]) -> str:
    if not d:
        return "none"
    what = f"op '{printable(d.get('op'))}'" if d.get("device_only") or not d.get("node") \
        else f"node '{printable(d.get('node'))}'"
    extra = " (device-only)" if d.get("device_only") else ""
    return f"{what}{extra}, tensor '{printable(d.get('tensor') or '')}', cosine {_f(d.get('cosine'), '.6f')}"


def _f(v, spec=".3e") -> str:
    return "n/a" if v is None else format(v, spec)


def _c(v) -> str:
    return "NaN" if v is None else repr(float(v))


def _csv_safe(text: str) -> str:
    # a cell a spreadsheet would run as a formula (=, +, -, @) is quoted as text
    text = printable(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def _badness(r: TensorRow) -> tuple:
    return (not r.passed, r.nan + r.inf, -(r.cosine if r.cosine is not None else -2.0), r.max_abs or 0.0)


# ------------------------------------------------------------------------------------------ metrics
KL_MAX_ELEMENTS = 1 << 20   # KL needs two logarithms per element: computed for tensors up to this size


def tensor_metrics(golden: np.ndarray, device: np.ndarray) -> dict:
    """Per-tensor metrics of ``device`` against ``golden`` (same size).

    Errors and the cosine are over the elements finite on both sides (None when there is none); NaN/Inf
    are counted apart. ``mean_rel``/``max_rel`` divide by ``|golden|`` where it is not 0. Float16 and
    float32 tensors are compared in float32 (sums pairwise, dot products SIMD-accumulated: relative
    error ~1e-7),
    others in float64. The cosine is computed as ``1 - (|d|^2 - (|t| - |g|)^2) / (2 |g| |t|)``, exact in
    real arithmetic, so that ``1 - cosine`` keeps its relative precision when it is tiny (1e-9) instead
    of drowning in the rounding of ``g . t``. ``kl_divergence`` is for non-negative tensors (read as
    distributions, as msaccucmp does) of at most ``KL_MAX_ELEMENTS`` elements.

    >>> m = tensor_metrics(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    >>> round(m["max_abs"], 3), round(m["max_rel"], 3), m["nan"]
    (0.5, 0.25, 0)
    """
    r = np.asarray(golden)
    t = np.asarray(device)
    work = np.float32 if r.dtype.name in ("float16", "float32") and t.dtype.name in ("float16", "float32") \
        else np.float64
    r = np.ascontiguousarray(r, dtype=work).ravel()
    t = np.ascontiguousarray(t, dtype=work).ravel()
    m: dict[str, Any] = {k: None for k in ("cosine", "max_abs", "max_rel", "rmse", "mean_abs", "mean_rel",
                                           "acc_rel", "rel_euclidean", "kl_divergence", "std_golden",
                                           "std_device")}
    all_r, all_t = bool(np.isfinite(r).all()), bool(np.isfinite(t).all())
    m["nan"] = 0 if all_t else int(np.isnan(t).sum())
    m["inf"] = 0 if all_t else int(np.isinf(t).sum())
    m["nan_golden"] = 0 if all_r else int(np.isnan(r).sum())
    m["inf_golden"] = 0 if all_r else int(np.isinf(r).sum())
    if not r.size:
        m.update(cosine=1.0, max_abs=0.0, max_rel=0.0, rmse=0.0, mean_abs=0.0, mean_rel=0.0)
        return m
    if not (all_r and all_t):
        both = np.isfinite(r) & np.isfinite(t)
        r, t = r[both], t[both]
    if not r.size:
        return m
    n = r.size
    with np.errstate(over="ignore", invalid="ignore"):
        d = np.subtract(t, r)
        sq, nr2, nt2 = _dot(d, d), _dot(r, r), _dot(t, t)
        if not all(math.isfinite(v) for v in (sq, nr2, nt2)):  # float32 squares overflow: redo wide
            r64, t64 = r.astype(np.float64), t.astype(np.float64)
            d = t64 - r64
            sq, nr2, nt2 = _dot(d, d), _dot(r64, r64), _dot(t64, t64)
        ad = np.abs(d, out=d)
        m["max_abs"] = float(ad.max())
        sum_abs = float(ad.sum())
        m["rmse"] = math.sqrt(sq / n)
        m["mean_abs"] = sum_abs / n
        ar = np.abs(r)
        sr = float(ar.sum())
        count = int(np.count_nonzero(ar))
        # rel = |d| / |g| where g != 0; the zeros of |g| stay 0 in `ar` and add nothing to max or sum
        rel = np.divide(ad, ar, out=ar, where=ar > 0) if count < n else np.divide(ad, ar, out=ar)
        m["max_rel"] = float(rel.max()) if count else 0.0
        m["mean_rel"] = float(rel.sum()) / count if count else 0.0
    m["acc_rel"] = sum_abs / sr if sr > 0 else None
    nr, nt = math.sqrt(nr2), math.sqrt(nt2)
    m["rel_euclidean"] = math.sqrt(sq) / nr if nr > 0 else None
    if nr == 0 and nt == 0:
        m["cosine"] = 1.0
    elif nr == 0 or nt == 0:
        m["cosine"] = 0.0
    else:
        m["cosine"] = max(-1.0, min(1.0, 1.0 - (sq - (nt - nr) ** 2) / (2.0 * nr * nt)))
    mr, mt = float(r.sum()) / n, float(t.sum()) / n
    m["std_golden"] = math.sqrt(max(nr2 / n - mr * mr, 0.0))
    m["std_device"] = math.sqrt(max(nt2 / n - mt * mt, 0.0))
    if 1 < n <= KL_MAX_ELEMENTS and sr > 0 and mt > 0 and r.min() >= 0 and t.min() >= 0:
        p = r.astype(np.float64) / sr
        q = t.astype(np.float64) / (mt * n)
        keep = p > 0
        with np.errstate(divide="ignore"):
            m["kl_divergence"] = float(np.sum(p[keep] * (np.log(p[keep]) - np.log(np.maximum(q[keep], 1e-300)))))
    return m


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    # einsum, not np.dot: no BLAS threads (slow to start on a busy 2-core machine), one pass, no temporary
    return float(np.einsum("i,i->", a, b))


# ------------------------------------------------------------------------------------------ golden
def load_named_model(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    """The ONNX model with every node named as the converter names them (``<OpType>_<index>`` for
    unnamed nodes), so that device op names and golden node names agree."""
    if isinstance(model, onnx.ModelProto):
        m = onnx.ModelProto()
        m.CopyFrom(model)
    else:
        p = Path(model)
        if not p.is_file():
            raise InputError(f"model {p} does not exist", hint="give the original .onnx model")
        try:
            m = onnx.load(str(p))
        except Exception as e:  # protobuf's and onnx's own exception types
            raise ModelError(f"{p}: not an ONNX model ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})",
                             hint="give the original .onnx model the dump was taken from") from None
    name_nodes(m.graph)
    return m


def golden_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run ``model`` once on onnxruntime (CPU, graph optimisation off) with every node output exposed;
    return tensor name -> array for the graph inputs and every node output of the main graph."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    inits = {t.name for t in m.graph.initializer}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have and o not in inits:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                have.add(o)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    try:
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise ModelError(f"onnxruntime cannot load the model with every node output exposed "
                         f"({str(e).splitlines()[0][:200]})", hint="check the model runs in onnxruntime") from None
    names = [o.name for o in sess.get_outputs()]
    want = {i.name for i in sess.get_inputs()}
    missing = sorted(want - set(feeds))
    if missing:
        raise InputError(f"the inputs give no value for model input(s) {', '.join(missing)}",
                         hint="give the .npz the dump was taken with (--inputs)")
    ort_feeds = {}
    for i in sess.get_inputs():
        a = np.asarray(feeds[i.name])
        want_dt = ORT_TYPES.get(i.type)
        if want_dt is not None and a.dtype != want_dt:
            a = a.astype(want_dt)
        ort_feeds[i.name] = a
    try:
        outs = sess.run(names, ort_feeds)
    except Exception as e:
        raise InputError(f"onnxruntime failed to run the model on the given inputs "
                         f"({str(e).splitlines()[0][:200]})", hint="check the inputs' shapes and dtypes") from None
    values = dict(ort_feeds)
    values.update(zip(names, outs))
    return values




# ------------------------------------------------------------------------------------------ device side
@dataclasses.dataclass
class DeviceTensor:
    """A dumped output, before mapping: the op that wrote it and how to get its logical array."""

    op: str
    op_type: str
    index: int
    dtype: str
    format: str
    original_name: str | None
    original_index: int | None
    source: Any          # a DumpTensor or an ExecutedTensor: both have .logical()
    dump: str = ""


def device_tensors(dumps: Any) -> tuple[list[DeviceTensor], str]:
    """The dumped outputs of a dump folder (path), a list of ``DumpFile`` or a list of the emulator's
    ``ExecutedOp``, in execution order; and a label for where they came from."""
    if isinstance(dumps, (str, os.PathLike)):
        p = Path(dumps)
        files = [dumpfmt.read_dump(p)] if p.is_file() else dumpfmt.read_dump_folder(p)
        return _from_dump_files(files), str(p)
    items = list(dumps)
    if items and hasattr(items[0], "dump_time"):
        return _from_dump_files(items), "dump files"
    out = []
    for op in items:
        for k, t in enumerate(op.outputs):
            out.append(DeviceTensor(op.name, op.op_type, k, np.dtype(t.stored.dtype).name, str(t.stored.format),
                                    t.tensor, None, t))
    return out, "emulator run"


def _from_dump_files(files: Iterable[Any]) -> list[DeviceTensor]:
    out = []
    for f in files:
        for k, t in enumerate(f.outputs):
            out.append(DeviceTensor(f.op_name, f.op_type, k, np.dtype(t.dtype).name, str(t.format),
                                    t.original_name, t.original_index, t, dump=f.path.name))
    return out


class _Graph:
    """Name tables of the ONNX model: producers, node positions, graph outputs."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.model = model
        self.nodes = {n.name: n for n in g.node}
        self.position = {n.name: k for k, n in enumerate(g.node)}
        self.producer: dict[str, tuple[str, int]] = {}
        for n in g.node:
            for j, o in enumerate(n.output):
                if o:
                    self.producer[o] = (n.name, j)
        self.inputs = {i.name for i in g.input}
        self.outputs = {o.name for o in g.output}
        self.initializers = {t.name: t for t in g.initializer}

    def tensor_for(self, name: str | None, index: int | None) -> str | None:
        """The ONNX tensor an (original name, output index) pair names: a tensor name (emulator dumps)
        or a node name and its output index (ATC's ``OriginalOp``)."""
        if not name:
            return None
        k = 0 if index is None else int(index)
        prod = self.producer.get(name)
        if prod is not None and (index is None or prod[1] == k or name not in self.nodes):
            return name
        node = self.nodes.get(name)
        if node is not None and 0 <= k < len(node.output) and node.output[k]:
            return node.output[k]
        if name in self.inputs:
            return name
        return None


def _om_index(om_path: str | os.PathLike) -> dict[str, Any]:
    model = omfile.read_om(om_path, keep_ops=True)
    main = model.main
    if main is None or main.ops is None:
        raise InputError(f"{om_path}: no ModelDef with ops to map dump names from",
                         hint="give an unencrypted .om written by ATC")
    return {op.name: op for op in main.ops}


def _bundle_transdata(bundle_path: str | os.PathLike) -> tuple[set[str], str | None]:
    with read_bundle(bundle_path, verify=False) as b:
        man = b.manifest
    names = {str(td.get("name")) for td in man.get("transdata") or [] if td.get("name")}
    return names, man.get("precision_mode")


# ------------------------------------------------------------------------------------------ compare
def debug_compare(model: str | os.PathLike | onnx.ModelProto, dumps: Any, *,
                  inputs: str | os.PathLike | Mapping[str, np.ndarray] | None = None,
                  bundle: str | os.PathLike | None = None, om: str | os.PathLike | None = None,
                  cosine_min: float | None = None, atol: float | None = None, rtol: float | None = None,
                  max_outside: float | None = None, isolate: int = ISOLATE_DEFAULT) -> DebugCompareResult:
    """Compare every dumped tensor with onnxruntime's on the original model (see the module docstring).

    ``dumps``: a dump folder, one dump file, a list of ``DumpFile`` or of the emulator's ``ExecutedOp``
    (``EmulatorBackend.run_recorded``). ``inputs``: the feeds the dump was taken with (an ``.npz`` path
    or a dict; default: ``inputs.npz`` beside or above the dump files). ``bundle`` / ``om``: the
    converted model, for the name mapping. ``isolate``: how many failing rows (first in topological
    order) to re-run alone to tell whether error enters there or accumulates (0: none).
    """
    check_thresholds(atol=atol, rtol=rtol, cosine_min=cosine_min, max_outside=max_outside)
    if isolate < 0:
        raise InputError(f"isolate {isolate} must be >= 0")
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    if bundle is not None and om is not None:
        raise InputError("give either --bundle or --om for the name mapping, not both")
    m = load_named_model(model)
    graph = _Graph(m)
    feeds = _resolve_inputs(inputs, dumps)
    times["load"] = time.perf_counter() - t0

    t = time.perf_counter()
    tensors, label = device_tensors(dumps)
    if not tensors:
        raise InputError(f"{label}: the dump holds no output tensors", hint="dump with dump_mode 'all' or 'output'")
    om_ops = _om_index(om) if om is not None else {}
    td_names: set[str] = set()
    if bundle is not None:
        td_names, _ = _bundle_transdata(bundle)
    times["read_dumps"] = time.perf_counter() - t
    notes: list[str] = []
    mapping = "om" if om is not None else "bundle" if bundle is not None else "dump names"

    # after the dumps: a damaged dump is reported before the (longer) golden run
    t = time.perf_counter()
    golden = golden_outputs(m, feeds)
    times["golden"] = time.perf_counter() - t

    t = time.perf_counter()
    rows: list[TensorRow] = []
    device_values: dict[str, np.ndarray] = {}
    unmatched: list[str] = []
    order = 0
    keyed: list[tuple[tuple, TensorRow]] = []
    def one(dt: DeviceTensor):
        return _map_and_compare(dt, graph, golden, om_ops, td_names, cosine_min, atol, rtol, max_outside)

    # numpy releases the GIL in its loops: two tensors at a time use both cores of a small machine
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        mapped = list(pool.map(one, tensors))
    for dt, (row, value) in zip(tensors, mapped):
        if row is None:
            unmatched.append(f"{dt.op}:output:{dt.index}")
            continue
        if value is not None and row.tensor and (not row.device_only or row.tensor not in device_values):
            device_values[row.tensor] = value
        keyed.append(((row.position, row.device_only, order), row))
        order += 1
    keyed.sort(key=lambda kv: kv[0])
    rows = [r for _, r in keyed]
    times["metrics"] = time.perf_counter() - t
    _check_dumps_match(rows, [dt for dt, (row, _) in zip(tensors, mapped) if row is None], m, label, model)

    t = time.perf_counter()
    if isolate:
        _isolate(m, graph, [r for r in rows if not r.passed and not r.device_only and r.node][:isolate],
                 golden, device_values, feeds, cosine_min, notes)
    times["isolate"] = time.perf_counter() - t

    def as_dict(r: TensorRow | None) -> dict | None:
        return None if r is None else dataclasses.asdict(r)

    first_bad = next((r for r in rows if not r.passed), None)
    first_naninf = next((r for r in rows if r.nan > r.nan_golden or r.inf > r.inf_golden), None)
    if bundle is None and om is None and any(r.op_type in DEVICE_ONLY_TYPES for r in rows):
        notes.append("no --bundle/--om given: TransData/Cast ops were told apart by type and name only")
    return DebugCompareResult(model=str(model) if not isinstance(model, onnx.ModelProto) else "<model>",
                              dumps=label, mapping=mapping,
                              inputs={k: {"shape": list(np.shape(v)), "dtype": np.asarray(v).dtype.name}
                                      for k, v in feeds.items()},
                              cosine_min=cosine_min, atol=atol, rtol=rtol,
                              max_outside=float(max_outside or 0.0), rows=rows,
                              first_divergent=as_dict(first_bad), first_nan_inf=as_dict(first_naninf),
                              unmatched=unmatched, notes=notes, seconds={k: round(v, 4) for k, v in times.items()})


#: the share of the dumped compute tensors (not TransData/Cast, not the graph inputs) that must map to
#: a tensor of the model for the comparison to be of this model at all
MIN_MAPPED_SHARE = 0.5


def _check_dumps_match(rows: list[TensorRow], unmapped: list[DeviceTensor], model: onnx.ModelProto, label: str,
                       name: Any) -> None:
    """Refuse (exit 2) dumps that are not of this model: fewer than :data:`MIN_MAPPED_SHARE` of the dumped
    compute tensors map to one of its tensors, or none beyond the graph inputs (which the dump supplies
    itself, so they always match). Without it, dumps of another model sharing an input name PASS on the
    one tensor compared: the input."""
    graph_inputs = {i.name for i in model.graph.input}
    mapped = [r for r in rows if not r.device_only and r.tensor not in graph_inputs]
    lost = [d for d in unmapped if d.op_type not in DEVICE_ONLY_TYPES]
    total = len(mapped) + len(lost)
    if total == 0:
        return  # only inputs and layout ops were dumped: nothing claims to be a compute op
    if not mapped or len(mapped) < MIN_MAPPED_SHARE * total:
        shown = printable(str(name)) if not isinstance(name, onnx.ModelProto) else "the model"
        raise InputError(f"dumps and model do not match: {len(mapped)} of the {total} dumped compute tensors in "
                         f"{label} map to a tensor of {shown} (at least half must, beyond the inputs)",
                         hint="compare the dumps with the ONNX model they were taken from (the one the bundle "
                              "or .om was converted from)")


def _resolve_inputs(inputs: Any, dumps: Any) -> dict[str, np.ndarray]:
    if isinstance(inputs, Mapping):
        return {k: np.asarray(v) for k, v in inputs.items()}
    if inputs is not None:
        p = Path(inputs)
        if not p.is_file():
            raise InputError(f"inputs file {p} does not exist",
                             hint="give the .npz of the arrays the dumped run was fed")
        return load_npz(p)
    if isinstance(dumps, (str, os.PathLike)):
        root = Path(dumps)
        start = root if root.is_dir() else root.parent
        leaf = dumpfmt.find_dump_folders(start) if start.is_dir() else []
        candidates = [start / "inputs.npz"]
        if len(leaf) == 1:
            d = leaf[0]
            while True:
                candidates.append(d / "inputs.npz")
                if d == start or d.parent == d:
                    break
                d = d.parent
        for c in candidates:
            if c.is_file():
                return load_npz(c)
    raise InputError("no inputs given: the golden run needs the inputs the dump was taken with",
                     hint="pass --inputs IN.npz or --input NAME=FILE.npy with the arrays the dumped run was fed")


def _map_and_compare(dt: DeviceTensor, graph: _Graph, golden: Mapping[str, np.ndarray], om_ops: Mapping[str, Any],
                     td_names: set[str], cosine_min, atol, rtol, max_outside):
    fused: list[str] = []
    name, index = dt.original_name, dt.original_index
    om_op = om_ops.get(dt.op)
    device_only = dt.op in td_names
    if om_op is not None:
        origins = om_op.output_origins
        if dt.index < len(origins) and origins[dt.index] is not None:
            name, index = origins[dt.index].name, origins[dt.index].output_index
        if om_op.original_names == []:
            device_only = True
            if name is None:  # an inserted op holds the tensor on its data input in another layout
                edges = _data_edges(om_op)
                if edges:
                    name, index, _ = _source(om_ops, edges[0])
        elif om_op.original_names:
            fused = list(om_op.original_names)
            if name is None:
                name, index = fused[-1], dt.index
    if not device_only and dt.op_type in DEVICE_ONLY_TYPES and dt.op not in graph.nodes:
        device_only = True
    tensor = graph.tensor_for(name, index)
    if tensor is None:
        tensor = graph.tensor_for(dt.op, dt.index)
    if tensor is None:
        return None, None
    prod = graph.producer.get(tensor)
    node = prod[0] if prod else None
    position = graph.position.get(node, -1) if node else -1
    row = TensorRow(op=dt.op, op_type=dt.op_type, output_index=dt.index, node=node, tensor=tensor,
                    position=position, device_only=device_only, fused=fused, dump=dt.dump, dtype=dt.dtype,
                    format=dt.format, is_output=tensor in graph.outputs)
    ref = golden.get(tensor)
    try:
        value = np.asarray(dt.source.logical())
    except Exception as e:  # a FormatError, or a shape the format cannot hold
        raw = np.asarray(getattr(dt.source, "data", None))
        if ref is not None and is_plain(dt.format) and raw.size == np.size(ref):
            # a plain layout holds the elements in its own axis order: only the recorded shape was wrong
            value = _in_golden_layout(raw, dt.format, np.shape(ref))
            row.note = "dumped logical shape unusable; raw plain data read in the golden shape"
        else:
            row.compared, row.passed = False, False
            row.reason = f"cannot bring the dumped tensor back to its logical layout: {str(e)[:200]}"
            return row, None
    row.shape = list(value.shape)
    if ref is None:
        row.compared = False
        row.reason = "no golden tensor (not a main-graph node output)"
        return row, value
    ref = np.asarray(ref)
    row.golden_dtype = ref.dtype.name
    if value.shape != ref.shape:
        if value.size != ref.size:
            row.passed = False
            row.reason = f"shape {tuple(value.shape)} != golden {tuple(ref.shape)}"
            return row, value
        value = _in_golden_layout(value, dt.format, ref.shape)
    _judge(row, ref, value, cosine_min, atol, rtol, max_outside)
    return row, value


def _in_golden_layout(value: np.ndarray, fmt: str, golden_shape) -> np.ndarray:
    """``value`` (elements in ``fmt``'s axis order) as an array of the golden tensor's shape: a plain
    layout whose axis order differs from the ONNX tensor's (NHWC or HWCN of an NCHW tensor: the
    registry's ``default_origin``) is transposed, anything else reshaped (same order)."""
    golden_shape = tuple(golden_shape)
    try:
        entry = formats.get_format(fmt)
    except FormatError:
        entry = None
    origin = entry.default_origin if entry is not None and entry.plain else None
    if origin and origin != entry.name and len(origin) == len(entry.name) == len(golden_shape):
        stored_shape = tuple(golden_shape[k] for k in axis_perm(origin, entry.name))
        return np.asarray(value).reshape(stored_shape).transpose(axis_perm(entry.name, origin))
    return np.asarray(value).reshape(golden_shape)


def _judge(row: TensorRow, ref: np.ndarray, value: np.ndarray, cosine_min, atol, rtol, max_outside) -> None:
    if ref.dtype.kind not in "fc" and value.dtype.kind not in "fc":
        equal = bool(np.array_equal(ref, value))
        diff = int(np.count_nonzero(ref != value))
        row.cosine = 1.0 if equal else None
        row.max_abs = 0.0 if equal else float(np.max(np.abs(ref.astype(np.float64) - value.astype(np.float64))))
        row.passed = equal
        row.reason = "" if equal else f"{diff} of {ref.size} elements differ"
        return
    mets = tensor_metrics(ref, value)
    for k, v in mets.items():
        setattr(row, k, v)
    limit = _DTYPE_MAX.get(row.dtype)
    gmax = 0.0
    if limit is not None and ref.size:
        if row.nan_golden or row.inf_golden:
            fin = ref[np.isfinite(ref)]
            gmax = float(np.max(np.abs(fin))) if fin.size else 0.0
        else:  # two passes, no temporary
            gmax = max(abs(float(ref.max())), abs(float(ref.min())))
    row.overflow = row.nan > row.nan_golden or row.inf > row.inf_golden or (limit is not None and gmax > limit)
    cmin = cosine_min if cosine_min is not None else (
        LOW_PRECISION_COSINE if row.dtype in _DTYPE_MAX else FULL_PRECISION_COSINE)
    reasons = []
    if row.nan > row.nan_golden or row.inf > row.inf_golden:
        reasons.append(f"{row.nan} NaN / {row.inf} Inf (golden {row.nan_golden} / {row.inf_golden})")
    if row.cosine is None and ref.size:
        reasons.append("no element finite on both sides")
    elif row.cosine is not None and row.cosine < cmin:
        reasons.append(f"cosine {row.cosine:.6f} < {cmin:g}")
    if atol is not None or rtol is not None:
        close = np.isclose(value.astype(np.float64), ref.astype(np.float64), atol=atol or 0.0, rtol=rtol or 0.0,
                           equal_nan=True)
        row.outside_share = float(1.0 - np.count_nonzero(close) / close.size) if close.size else 0.0
        if row.outside_share > (max_outside or 0.0):
            reasons.append(f"{row.outside_share * 100:.3g} % of elements outside atol/rtol")
    if limit is not None and gmax > limit and not reasons:
        reasons.append(f"golden values up to {gmax:.3g} exceed {row.dtype}'s range")
    row.passed = not reasons
    row.reason = "; ".join(reasons)


# ------------------------------------------------------------------------------------------ isolation
def _isolate(model: onnx.ModelProto, graph: _Graph, rows: list[TensorRow], golden: Mapping[str, np.ndarray],
             device_values: Mapping[str, np.ndarray], feeds: Mapping[str, np.ndarray], cosine_min,
             notes: list[str]) -> None:
    """Run each row's node alone (one onnxruntime session for all of them), fed the device's values for
    its inputs (graph inputs and constants as given), and compare with the dumped output."""
    import onnxruntime as ort

    if not rows:
        return
    nodes, g_inputs, g_outputs, ort_feeds, used_inits = [], [], [], {}, set()
    plan: list[tuple[TensorRow, str]] = []
    undecided = 0
    seen_nodes: dict[str, str] = {}
    for k, row in enumerate(rows):
        node = graph.nodes[row.node]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        if row.node in seen_nodes:
            plan.append((row, seen_nodes[row.node].replace("#", str(row.output_index))))
            continue
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = f"__isolated_{k}"
        del new.input[:]
        inits, my_inputs, my_feeds, complete = set(), [], {}, True
        for i in node.input:
            if not i or i in graph.initializers:
                new.input.append(i)
                if i:
                    inits.add(i)
                continue
            g = golden.get(i)
            value = device_values.get(i)
            if value is None:
                prod = graph.producer.get(i)
                constant = prod is not None and graph.nodes[prod[0]].op_type in ("Constant", "ConstantOfShape")
                # graph inputs and constants are what the device read too; any other tensor must come
                # from the dump (inside a fused op it never reached memory): else the node is not judged
                value = feeds.get(i, g if constant else None)
            if value is None or g is None:
                complete = False
                break
            value = np.asarray(value).reshape(np.shape(g)).astype(np.asarray(g).dtype)
            feed = f"__iso{k}__{i}"
            new.input.append(feed)
            my_feeds[feed] = value
            my_inputs.append(helper.make_tensor_value_info(feed, helper.np_dtype_to_tensor_dtype(value.dtype),
                                                           list(value.shape)))
        if not complete:
            undecided += 1
            continue
        used_inits |= inits
        ort_feeds.update(my_feeds)
        g_inputs.extend(my_inputs)
        del new.output[:]
        for j, o in enumerate(node.output):
            out = f"__iso{k}__out{j}" if o else ""
            new.output.append(out)
            if o:
                g_outputs.append(onnx.ValueInfoProto(name=out))
        nodes.append(new)
        seen_nodes[row.node] = f"__iso{k}__out#"
        plan.append((row, f"__iso{k}__out{row.output_index}"))
    if undecided:
        notes.append(f"{undecided} failing node(s) not run alone: an input of theirs is in no dump (fused "
                     f"away or not dumped), so enters/accumulates is not decided for them")
    if not nodes:
        return
    g = helper.make_graph(nodes, "isolated", g_inputs, g_outputs,
                          initializer=[graph.initializers[n] for n in sorted(used_inits)])
    iso = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    iso.functions.extend(model.functions)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    try:
        sess = ort.InferenceSession(iso.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        values = dict(zip(names, sess.run(names, ort_feeds)))
    except Exception as e:
        notes.append(f"could not run the failing nodes alone ({str(e).splitlines()[0][:160]}); "
                     f"enters/accumulates not decided")
        return
    for row, out in plan:
        alone = values.get(out)
        dev = device_values.get(row.tensor) if row.tensor else None
        if alone is None or dev is None:
            continue
        dev = np.asarray(dev).reshape(alone.shape)
        mets = tensor_metrics(alone, dev)
        row.local_cosine, row.local_max_abs = mets["cosine"], mets["max_abs"]
        cmin = cosine_min if cosine_min is not None else (
            LOW_PRECISION_COSINE if row.dtype in _DTYPE_MAX else FULL_PRECISION_COSINE)
        naninf_here = (mets["nan"] + mets["inf"]) > (mets["nan_golden"] + mets["inf_golden"])
        ok = mets["cosine"] is not None and mets["cosine"] >= cmin and not naninf_here
        row.origin = "accumulates" if ok else "enters"


# ------------------------------------------------------------------------------------------ HTML
def _error_chart(res: DebugCompareResult) -> str:
    """1 - cosine per layer (log scale) as inline SVG. Each dot has its layer's name on hover, the axis
    names the layers (every k-th when there are many), and an error of exactly zero sits on its own
    "0" line below the log axis instead of pretending to be the axis floor."""
    e = html.escape
    rows = res.rows
    width, top, plot_h, label_h, left, right = 1060, 20, 220, 118, 52, 64
    zero_y = top + plot_h + 18
    height = zero_y + 12 + label_h + 16
    errs = [None if not r.compared else (1.0 if r.cosine is None else max(1.0 - r.cosine, 0.0)) for r in rows]
    nonzero = [x for x in errs if x]
    lo = min(-3, math.floor(math.log10(min(nonzero)))) if nonzero else -9
    n = max(len(rows), 1)

    def y_of(err: float) -> float:
        return zero_y if err == 0 else top + plot_h - (math.log10(err) - lo) / (0 - lo) * plot_h

    def x_of(k: int) -> float:
        return left + (k + 0.5) / n * (width - left - right)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="100%" role="img" '
           f'aria-label="1 - cosine per layer">']
    step = max(1, (0 - lo) // 4)
    for p in range(lo, 1, step):
        y = y_of(10.0 ** p)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#e3e6ea"/>'
                   f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">1e{p}</text>')
    out.append(f'<line x1="{left}" y1="{zero_y}" x2="{width - right}" y2="{zero_y}" stroke="#9aa3ad" '
               f'stroke-dasharray="1 3"/><text x="{left - 6}" y="{zero_y + 4}" text-anchor="end">0</text>')
    mark = res.cosine_min if res.cosine_min is not None else LOW_PRECISION_COSINE
    if mark < 1.0 and 1.0 - mark >= 10.0 ** lo:
        y = y_of(1.0 - mark)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#c0392b" '
                   f'stroke-dasharray="2 2"/><text x="{width - right - 4}" y="{y - 3:.1f}" text-anchor="end" '
                   f'fill="#c0392b">cosine {mark:g}{"" if res.cosine_min is not None else " (float16)"}</text>')
    fd = res.first_divergent
    if fd:
        k = next((i for i, r in enumerate(rows) if r.op == fd["op"] and r.output_index == fd["output_index"]), None)
        if k is not None:
            x = x_of(k)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{zero_y}" stroke="#c0392b" '
                       f'stroke-dasharray="4 3"/><text x="{x + 4:.1f}" y="{top + 10}" fill="#c0392b">'
                       f'first divergent: {e(printable(fd["op"]))}</text>')
    every = max(1, math.ceil(n / 60))   # about 60 names fit under the axis; the rest are on hover
    for k, r in enumerate(rows):
        x = x_of(k)
        if k % every == 0:
            out.append(f'<text transform="translate({x + 3:.1f},{zero_y + 14}) rotate(60)" font-size="9" '
                       f'fill="#44505c">{e(printable(r.op if len(r.op) <= 20 else r.op[:19] + "…"))}</text>')
        if errs[k] is None:
            continue
        colour = "#c0392b" if not r.passed else "#2e86c1"
        label = (f"#{k} {r.op} ({r.op_type}) → {r.tensor}: cosine {_f(r.cosine, '.6f')}, "
                 f"1 - cosine {_f(errs[k], '.2e') if errs[k] else '0 (exact)'}, max abs {_f(r.max_abs)}")
        fill = "none" if errs[k] == 0 else colour
        out.append(f'<circle cx="{x:.1f}" cy="{y_of(errs[k]):.1f}" r="3" fill="{fill}" stroke="{colour}">'
                   f'<title>{e(printable(label))}</title></circle>')
    out.append(f'<text x="{left}" y="{height - 4}">layers in topological order → (y: 1 - cosine, log scale; '
               f'hollow dots on the 0 line: exactly equal; red: beyond tolerance; hover a dot for its layer)</text>')
    out.append("</svg>")
    return "".join(out)


def _render_html(res: DebugCompareResult) -> str:
    e = html.escape
    rows = res.rows
    head = ["#", "op", "type", "tensor", "dtype/format", "shape", "cosine", "max abs", "max rel", "rmse",
            "mean rel", "NaN/Inf", "overflow", "result"]
    num = {"#", "cosine", "max abs", "max rel", "rmse", "mean rel", "NaN/Inf"}
    body = []
    for k, r in enumerate(rows):
        cls = "bad" if not r.passed else ("na" if not r.compared else "")
        cells = [str(k), r.op, r.op_type + (" (device-only)" if r.device_only else ""), r.tensor or "",
                 f"{r.dtype}/{r.format}", "x".join(map(str, r.shape)), _f(r.cosine, ".6f"), _f(r.max_abs),
                 _f(r.max_rel), _f(r.rmse), _f(r.mean_rel), f"{r.nan}/{r.inf}", "yes" if r.overflow else "",
                 ("ok" if r.passed else "FAIL: " + r.reason) + (f" ({r.origin})" if r.origin else "")]
        body.append(f'<tr class="{cls}">' + "".join(
            f"<td{' class=num' if h in num else ''}>{e(printable(c))}</td>" for h, c in zip(head, cells)) + "</tr>")
    findings = "".join(f"<li>{e(s)}</li>" for s in res.summary_lines())
    name = e(printable(Path(res.model).name))
    return page(f"npu-deploy debug compare: {printable(Path(res.model).name)}",
                f"<h1>debug compare: {name}</h1><div class='muted small'>model: {e(printable(res.model))}<br>"
                f"dumps: {e(printable(res.dumps))}; mapping: {e(res.mapping)}; {len(res.compared())} tensors "
                f"compared</div><div class='verdict {'ok' if res else 'flagged'}'>{e(res.verdict())}</div>"
                f"<ul class='small'>{findings}</ul><h2>Error per layer</h2>{_error_chart(res)}"
                "<h2>Tensors</h2><div style='overflow-x:auto'><table class='small'><thead><tr>"
                + "".join(f"<th{' class=num' if h in num else ''}>{e(h)}</th>" for h in head)
                + "</tr></thead><tbody>" + "".join(body) + "</tbody></table></div>")
