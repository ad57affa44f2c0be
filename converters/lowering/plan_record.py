"""The plan record: :class:`Plan` (what the bundle manifest is written from), :class:`PlanReport`
(the typed result with ``verdict()``), :class:`TensorPlan` and :class:`Transfer`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from npu_deploy._result import Result
from npu_deploy.converters.lowering.plan_state import (FORMATTRANS_THRESHOLD_PCT, NodeFormats, PackedWeight, TransData,
                                                       formats_default_c0, is_plain)
from npu_deploy._version import __version__

# ------------------------------------------------------------------------------------------------
# The plan and its report
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class PlanReport(Result):
    """What the built-in lowering planned. ``bool()``: estimated FormatTrans share ≤ 8 % (True when no
    cost profile exists for the SoC). All times are **estimates** from the cost model."""

    SCHEMA: ClassVar[str] = "npu-deploy/plan-report"
    SCHEMA_VERSION: ClassVar[int] = 1

    model: str
    soc: str
    precision_mode: str
    nodes: int
    constant_folded: int
    engines: dict
    formats: dict
    transdata_naive_count: int
    transdata_naive_bytes: int
    transdata_count: int
    transdata_bytes: int
    transdata: list
    weights_prepacked: int
    weights_bytes: int
    memory: dict
    cost: dict | None
    notes: list = dataclasses.field(default_factory=list)
    # where this plan is known to differ from what ATC builds, each with how to check it on a real .om
    atc_differences: list = dataclasses.field(default_factory=list)

    def formattrans_share_pct(self) -> float | None:
        """Estimated share of device time spent in TransData, in percent (as ``ProfileReport``'s), or
        None without a cost profile."""
        return None if self.cost is None else 100.0 * float(self.cost["formattrans_share"])

    formattrans_share = formattrans_share_pct  # the same name and unit as ProfileReport.formattrans_share

    def top_conversions(self, n: int = 10) -> list[dict]:
        """The ``n`` planned TransData with the largest estimated time (then bytes)."""
        return sorted(self.transdata, key=lambda t: (-(t.get("est_us") or 0), -t["bytes"]))[:n]

    def __bool__(self) -> bool:
        share = self.formattrans_share_pct()
        return share is None or share <= FORMATTRANS_THRESHOLD_PCT

    def verdict(self) -> str:
        share = self.formattrans_share_pct()
        if share is None:
            est = f"no cost profile for {self.soc}: FormatTrans share not estimated"
        else:
            est = (f"estimated FormatTrans share {share:.1f} % ({'above' if share > FORMATTRANS_THRESHOLD_PCT else 'within'} "
                   f"the {FORMATTRANS_THRESHOLD_PCT:g} % threshold)")
        return (f"{est}; {self.transdata_count} TransData planned (naive {self.transdata_naive_count}), "
                f"{_mb(self.transdata_bytes)} moved; arena {_mb(self.memory.get('arena_bytes', 0))} "
                f"(lower bound {_mb(self.memory.get('lower_bound_bytes', 0))}, "
                f"no reuse {_mb(self.memory.get('no_reuse_bytes', 0))})")

    def summary_lines(self) -> list[str]:
        """The human-readable report ``npu-deploy convert`` prints (estimates labelled)."""
        lines = [f"plan for {self.model} on {self.soc} ({self.precision_mode}): {self.nodes} nodes"
                 + (f", {self.constant_folded} Constant nodes and constant-folded ops left out" if self.constant_folded else ""),
                 "  engines: " + ", ".join(f"{k} {v}" for k, v in self.engines.items()),
                 "  formats: " + ", ".join(f"{k} {v}" for k, v in sorted(self.formats.items())),
                 f"  TransData: naive {self.transdata_naive_count} ({_mb(self.transdata_naive_bytes)}), "
                 f"optimised {self.transdata_count} ({_mb(self.transdata_bytes)})",
                 f"  weights pre-packed: {self.weights_prepacked} ({_mb(self.weights_bytes)})",
                 f"  memory arena: {_mb(self.memory.get('arena_bytes', 0))} (lower bound "
                 f"{_mb(self.memory.get('lower_bound_bytes', 0))}, no reuse "
                 f"{_mb(self.memory.get('no_reuse_bytes', 0))}, {self.memory.get('alignment', 256)}-byte aligned)"]
        if self.cost is not None:
            c = self.cost
            lines.append(f"  estimated device time: {c['total_us']:.1f} µs, of which TransData "
                         f"{c['formattrans_us']:.1f} µs = {100 * c['formattrans_share']:.1f} % (estimate"
                         f"{f'; above {FORMATTRANS_THRESHOLD_PCT:g} %: FLAGGED' if 100 * c['formattrans_share'] > FORMATTRANS_THRESHOLD_PCT else ''})")
        top = self.top_conversions(8)
        if top:
            lines.append("  planned TransData" + (f" (largest {len(top)} of {self.transdata_count}; all in --report)"
                                                 if len(top) < self.transdata_count else "") + ":")
            for t in top:
                shape = "x".join(str(d) for d in t.get("shape") or []) or "scalar"
                where = t.get("producer") or "(input)"
                to = ", ".join(t.get("consumers") or []) or "(output)"
                est = f", est. {t['est_us']:.1f} µs" if t.get("est_us") is not None else ""
                lines.append(f"    {t.get('name')}: {t.get('tensor', '?')} {transfer_text(t)} "
                             f"[{shape}] {_mb(t.get('bytes', 0))}{est}, {where} -> {to}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return lines


def transfer_text(td: dict) -> str:
    """``src -> dst`` of a TransData manifest entry, the blocked end annotated with its C0 when it is
    not the dtype's default or the conversion is the second step of a C0 change (``after``).

    >>> transfer_text({"src_format": "NC1HWC0", "dst_format": "NCHW", "c0": 8, "dtype": "float32"})
    'NC1HWC0[C0=8] -> NCHW'
    >>> transfer_text({"src_format": "NCHW", "dst_format": "NC1HWC0", "dtype": "float32", "after": "trans_TransData_1"})
    'NCHW -> NC1HWC0[C0=16] (after trans_TransData_1)'
    """
    src, dst = str(td.get("src_format")), str(td.get("dst_format"))
    c0 = td.get("c0")
    if c0 is None and td.get("after"):
        try:
            c0 = formats_default_c0(str(td.get("dtype") or "float32"))
        except Exception:  # a dtype name numpy does not know: leave the C0 out
            c0 = None
    if c0 is not None:
        if not is_plain(dst):
            dst = f"{dst}[C0={c0}]"
        elif not is_plain(src):
            src = f"{src}[C0={c0}]"
    return f"{src} -> {dst}" + (f" (after {td['after']})" if td.get("after") else "")


def _mb(n: int) -> str:
    n = int(n or 0)
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"


@dataclasses.dataclass
class TensorPlan:
    """One tensor's decision: its device ``format`` (the reporting name: NCHW/NCDHW for plain 4-/5-D),
    device ``dtype``, logical ``shape`` (the largest gear; -1 for data-dependent dims), the
    ``storage_shape`` its buffer has (C padded to C0, M/N to 16; None when the shape is not static),
    ``c0`` and the buffer's ``nbytes``."""

    format: str
    dtype: str
    shape: tuple[int, ...]
    storage_shape: tuple[int, ...] | None
    c0: int | None
    nbytes: int

    def to_manifest(self) -> dict:
        return {"format": self.format, "dtype": self.dtype, "shape": list(self.shape),
                "storage_shape": None if self.storage_shape is None else list(self.storage_shape),
                "c0": self.c0, "nbytes": self.nbytes}


@dataclasses.dataclass
class Transfer:
    """How one graph input or output crosses the host/device boundary. ``format``/``shape``/``dtype``:
    the host array (channels-last for an NHWC host input); ``device_*``: the device buffer the
    transfer writes or reads; ``graph_format``/``graph_shape``: the layout the ONNX graph declares,
    when the host's differs (NHWC host, NCHW graph)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    format: str
    device_format: str
    device_shape: tuple[int, ...]
    device_dtype: str
    c0: int | None
    nbytes: int
    graph_format: str | None = None
    graph_shape: tuple[int, ...] | None = None

    def to_manifest(self) -> dict:
        d = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "format": self.format,
             "device_format": self.device_format, "device_shape": list(self.device_shape), "c0": self.c0,
             "nbytes": self.nbytes, "device_dtype": self.device_dtype}
        if self.graph_format is not None:
            d.update(graph_format=self.graph_format, graph_shape=list(self.graph_shape or ()))
        return d


@dataclasses.dataclass
class Plan:
    """The result of :func:`plan`: formats, TransData (optimised and naive), packed weights, dtypes,
    memory plan, cost estimate and the :class:`PlanReport`."""

    soc: str
    precision_mode: str
    node_formats: dict[str, NodeFormats]
    tensor_formats: dict[str, str]
    tensor_dtypes: dict[str, str]
    transdata: list[TransData]
    transdata_naive: list[TransData]
    weights: list[PackedWeight]
    memory: Any
    cost: Any
    report: PlanReport
    passes: list[tuple[str, bool]]
    fused: list[str] = dataclasses.field(default_factory=list)  # tensors never stored (converters.lowering.fusion)
    tensors: dict[str, TensorPlan] = dataclasses.field(default_factory=dict)
    inputs: list[Transfer] = dataclasses.field(default_factory=list)
    outputs: list[Transfer] = dataclasses.field(default_factory=list)
    dynamic: dict = dataclasses.field(default_factory=lambda: {"mode": None, "gears": []})
    input_format: str | None = None

    def to_manifest(self, *, support=None, source_model: dict | None = None) -> dict:
        """The bundle manifest: every decision of this plan, as it is (nothing is re-derived)."""
        cost = self.cost.manifest_summary() if self.cost is not None else {
            "estimated": True, "soc": self.soc, "formattrans_share": None, "est_us": {}}
        return {
            "producer": "npu-deploy",
            "producer_version": __version__,
            "soc": self.soc,
            "precision_mode": self.precision_mode,
            "input_format": self.input_format,
            "inputs": [t.to_manifest() for t in self.inputs],
            "outputs": [t.to_manifest() for t in self.outputs],
            "dynamic": self.dynamic,
            "memory": self.memory.summary(),
            "transdata": [t.to_manifest() for t in self.transdata],
            "transdata_naive_count": len(self.transdata_naive),
            "transdata_naive": [t.to_manifest() for t in self.transdata_naive],
            "transdata_naive_bytes": sum(t.bytes for t in self.transdata_naive),
            "node_formats": {k: v.to_manifest() for k, v in self.node_formats.items()},
            "tensor_formats": self.tensor_formats,
            "tensor_dtypes": self.tensor_dtypes,
            "tensors": {k: v.to_manifest() for k, v in self.tensors.items()},
            "fused_tensors": list(self.fused),
            "cost": cost,
            "plan": {"verdict": self.report.verdict(), "passes": [list(x) for x in self.passes]},
            "support": None if support is None else {"verdict": support.verdict(), "counts": support.counts()},
            "source_model": source_model,
        }

    def explain(self) -> list[str]:
        """One line per TransData kept: where it sits and why it had to stay; then one line per known
        difference from ATC's build (``PlanReport.atc_differences``)."""
        return [f"{t.name}: {t.tensor} {transfer_text(t.to_manifest())} ({_mb(t.bytes)}): {t.reason}"
                for t in self.transdata] + [f"differs from ATC: {d}" for d in self.report.atc_differences]
