"""Per-SoC cost model: estimated op times and the FormatTrans (TransData) share of device time.

Everything here is an **estimate** from peak figures and stated assumptions, never a measurement;
every report says so. Use it to rank ops and to see whether layout conversions are likely to matter
(the FormatTrans share is flagged above 8 %), then confirm with a real profile (``npu-deploy profile``).

Model (all constants live in :data:`SOC_PROFILES`, each with its source or marked "assumption"):

* **AI Core, cube ops** (Conv, ConvTranspose, MatMul, Gemm, LSTM/GRU/RNN): roofline with double
  buffering, ``launch_us + max(flops / (peak(dtype) * cube_efficiency),
  bytes / (bandwidth * bw_efficiency))``. When the cube operands sit in ND instead of a fractal format
  (``operand_format="ND"``) the operand reads run at ``nd_load_efficiency`` of the bandwidth (a
  16x16 fractal is one contiguous load; ND forces 16 strided row loads).
* **AI Core, vector ops** (elementwise, norms, pooling, Softmax, Resize, data movement, unknown
  ops): ``launch_us + max(flops / (vector peak * vector_efficiency), bytes / (bandwidth *
  bw_efficiency))`` — bandwidth-bound in practice.
* **Views** (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Shape, Constant…): zero cost, no kernel.
* **AI CPU**: ``aicpu_launch_us + max(flops / aicpu_gflops, bytes / aicpu_bandwidth)`` — all
  assumptions; the AI CPU is a handful of general-purpose ARM cores plus a task hand-off.
* **TransData**: ``launch_us + (src_bytes + dst_bytes) / (bandwidth * transdata_efficiency)``.

Public API (used by the planner, the bundle manifest and the emulator's estimated profile)::

    SocProfile(name, fp16_tflops, int8_tops, fp32_tflops, vector_fp16_tflops, bandwidth_gbps,
               launch_us, cube_efficiency, vector_efficiency, bw_efficiency, transdata_efficiency,
               nd_load_efficiency, aicpu_gflops, aicpu_bandwidth_gbps, aicpu_launch_us,
               sources: dict[str, str])            # field -> source or "assumption: ..."
    SOC_PROFILES: dict[str, SocProfile]             # "Ascend310P3", "Ascend910B", "Ascend910B2"..B4 ...
    SOC_PARTS: dict[str, dict]                      # 910B parts: cube/vector core counts, cube clock
    part_profile(p, part) -> SocProfile             # p's efficiencies with the part's cube/vector peaks
    get_soc_profile(soc: str | SocProfile | os.PathLike) -> SocProfile
        # exact name (a 910B part: "Ascend910B4"), family prefix ("Ascend910B1" -> "Ascend910B",
        # "Ascend310P1" -> "Ascend310P3"),
        # a SocProfile, or a JSON file path (SocProfile.to_dict() layout; missing fields are taken
        # from the profile named in "base", default Ascend310P3). Unknown SoC -> InputError.
    OpWork(flops: float, bytes_in: int, bytes_out: int, unit: "cube" | "vector" | "none")
    op_work(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]],
            dtypes: dict[str, np.dtype]) -> OpWork
        # shapes/dtypes of every named input/output (initializers included); a missing or dynamic
        # shape raises InputError naming the node and tensor. Gather/Slice-like ops count only the
        # bytes they select from their data input; unknown ops are vector work moving their bytes.
    op_time_us(work, soc, dtype="float16", engine="AI Core", operand_format=None) -> float
        # dtype is the compute dtype (float16/bfloat16/float32/int8…); engine "AI Core" | "AI CPU";
        # operand_format None|"NZ"|"ND" (cube ops only). >= launch_us for every kernel, 0 for views.
    transdata_time_us(nbytes, src_format, dst_format, soc, dst_nbytes=None) -> float
        # nbytes: bytes of the source tensor as stored; dst_nbytes defaults to nbytes.
    EstimatedOp(name, op_type, work: OpWork, dtype="float16", engine="AI Core", operand_format=None)
    EstimatedTransData(name, src_format, dst_format, nbytes, dst_nbytes=None)
        # estimate() also accepts the manifest's transdata dicts ({name, src_format, dst_format,
        # bytes, ...}).
    estimate(ops: list[EstimatedOp], transdata=(), soc="Ascend310P3", *, soc_profile=None,
             threshold_pct=8.0) -> CostReport
    model_tensor_types(model, *, input_shapes=None) -> (shapes, dtypes)
        # every tensor's static shape/dtype: onnx shape inference, then one onnxruntime run on
        # placeholder inputs for the tensors inference leaves unknown
    tensor_types(model: onnx.ModelProto) -> tuple[dict[str, tuple], dict[str, np.dtype]]
        # what a shape-inferred model already declares (-1 for unknown dims), no inference
    CostReport (a npu_deploy._result.Result):
        .soc, .profile (dict), .ops: list[OpEstimate(name, op_type, engine, unit, flops, bytes,
        est_us)], .transdata: list[TransDataEstimate(name, src_format, dst_format, nbytes, est_us)],
        .compute_us, .formattrans_us, .total_us, .formattrans_share (0..1), .threshold, .flagged
        .top_ops(n=10), .manifest_summary() -> {"estimated": True, "soc", "total_us",
        "formattrans_share", "est_us": {op name: µs}}
        bool(report) == not flagged; verdict() contains "estimated".

>>> report = estimate([EstimatedOp("conv", "Conv", OpWork(2e9, 1 << 20, 1 << 20, "cube"))],
...                   [EstimatedTransData("x_to_5hd", "NCHW", "NC1HWC0", 401408)], "Ascend310P3")
>>> report.flagged, "estimated" in report.verdict()
(True, True)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import numpy as np

from npu_deploy import _thresholds
from npu_deploy._result import Result
from npu_deploy.converters.files.feeds import InputSpec, generate_inputs
from npu_deploy.errors import InputError, ModelError
from npu_deploy.converters.lowering import support
from npu_deploy.converters.lowering import ops
from npu_deploy.converters.lowering.ops import soc_family

FORMATTRANS_THRESHOLD_PCT = _thresholds.FORMATTRANS_THRESHOLD_PCT

_DESIGN = "design.md (vendor datasheet figure)"


@dataclasses.dataclass(frozen=True)
class SocProfile:
    """Peak figures and efficiency assumptions for one SoC. Rates are peaks; efficiencies in (0, 1].

    >>> p = SocProfile.from_dict({"name": "my310P", "base": "Ascend310P3", "bandwidth_gbps": 100})
    >>> p.bandwidth_gbps, p.fp16_tflops
    (100.0, 70.0)
    """

    name: str
    fp16_tflops: float
    int8_tops: float
    fp32_tflops: float
    vector_fp16_tflops: float
    bandwidth_gbps: float
    launch_us: float
    cube_efficiency: float
    vector_efficiency: float
    bw_efficiency: float
    transdata_efficiency: float
    nd_load_efficiency: float
    aicpu_gflops: float
    aicpu_bandwidth_gbps: float
    aicpu_launch_us: float
    #: kernels that only write (ZerosLike, OnesLike, Fill, MemSet): bytes written at this fraction of
    #: ``bandwidth_gbps`` (assumption: a streaming write, like ``bw_efficiency``)
    fill_efficiency: float = 0.7
    #: the DSA (data-stream accelerator) engine that generates dropout bit masks (DSAGenBitMask): bytes
    #: written per second (assumption; no datasheet figure)
    dsa_bandwidth_gbps: float = 20.0
    #: a cube operand stored transposed (x·Wᵀ with the weight as (N, K)) streams at this fraction of the
    #: bandwidth the other operands get (assumption 1.0, no penalty; fitted where captures show it)
    transposed_read_efficiency: float = 1.0
    #: a cube op's result written through the FixPipe into L2 (write-back cache): bytes per second as a
    #: fraction of ``bandwidth_gbps``; up to 3 (L2 absorbs a result faster than HBM peak, as TransData's
    #: L2-resident operands); assumption 0.7 like ``bw_efficiency`` until a capture shows otherwise
    cube_write_efficiency: float = 0.7
    #: the part's L2 cache in MiB: bytes an op moves within it need not stream from HBM. ``cost check``'s
    #: plausibility floor allows for it (``costcheck.implausible``); None: not known, no floor is checked
    l2_mib: float | None = None
    sources: dict = dataclasses.field(default_factory=dict, compare=False)
    #: kernel launch overhead per msprof engine (AI_CORE, AI_VECTOR_CORE, MIX_AIC, MIX_AIV); others use
    #: ``launch_us``
    launch_us_by_engine: dict = dataclasses.field(default_factory=dict)
    #: TransData efficiency (of ``bandwidth_gbps``) per ``"SRC->DST"`` or ``"SRC->DST/dtype"`` pair; the
    #: most specific key wins, then ``transdata_efficiency``. Values up to 3: operands that a producer has
    #: just written are read from L2 faster than HBM peak (seen on the 910B captures)
    transdata_efficiency_by_pair: dict = dataclasses.field(default_factory=dict)
    #: cube efficiency per compute dtype name (float32, float16, bfloat16, int8); else ``cube_efficiency``
    cube_efficiency_by_dtype: dict = dataclasses.field(default_factory=dict)
    #: where the figures come from: {"calibrated": bool, "captures": [...], "median_op_error_pct": x,
    #: "summary": "..."}; ``accuracy_note`` prints it beside every estimate
    calibration: dict = dataclasses.field(default_factory=dict, compare=False)

    _RATES: ClassVar[tuple[str, ...]] = (
        "fp16_tflops", "int8_tops", "fp32_tflops", "vector_fp16_tflops", "bandwidth_gbps",
        "aicpu_gflops", "aicpu_bandwidth_gbps", "dsa_bandwidth_gbps")
    _FRACTIONS: ClassVar[tuple[str, ...]] = (
        "cube_efficiency", "vector_efficiency", "bw_efficiency", "transdata_efficiency",
        "nd_load_efficiency", "fill_efficiency", "transposed_read_efficiency")
    _TIMES: ClassVar[tuple[str, ...]] = ("launch_us", "aicpu_launch_us")

    def __post_init__(self) -> None:
        for f in self._RATES:
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"SoC profile {self.name!r}: {f} = {v!r} must be a positive number")
        for f in self._FRACTIONS:
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and 0 < v <= 1):
                raise InputError(f"SoC profile {self.name!r}: {f} = {v!r} must be in (0, 1]")
        v = self.cube_write_efficiency
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and 0 < v <= 3):
            raise InputError(f"SoC profile {self.name!r}: cube_write_efficiency = {v!r} must be in (0, 3]")
        v = self.l2_mib
        if v is not None and (isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v)
                                                          and 0 < v <= 65536)):
            raise InputError(f"SoC profile {self.name!r}: l2_mib = {v!r} must be a size in MiB (or null: not known)")
        for f in self._TIMES:
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"SoC profile {self.name!r}: {f} = {v!r} must be >= 0 µs")
        _check_map(self.name, "launch_us_by_engine", self.launch_us_by_engine, 0.0, 200.0,
                   key_ok=lambda k: k in LAUNCH_ENGINES or k == "MemSet" or (k.startswith("TransData:") and "->" in k))
        _check_map(self.name, "transdata_efficiency_by_pair", self.transdata_efficiency_by_pair, 0.0, 3.0,
                   key_ok=lambda k: "->" in k)
        _check_map(self.name, "cube_efficiency_by_dtype", self.cube_efficiency_by_dtype, 0.0, 1.0,
                   key_ok=lambda k: k.rsplit("/", 1)[-1] in ("float32", "float16", "bfloat16", "int8", "hf32")
                   and (k.count("/") == 0 or k.split("/")[0] in ("Conv", "MatMul", "FlashAttention")))
        if not isinstance(self.calibration, dict):
            raise InputError(f"SoC profile {self.name!r}: calibration must be an object")
        for k in self.calibration:
            if k not in _CALIBRATION_KEYS:
                raise InputError(f"SoC profile {self.name!r}: unknown field calibration.{k}",
                                 hint=f"known: {', '.join(_CALIBRATION_KEYS)}")
        err = self.calibration.get("median_op_error_pct")
        if err is not None and not (isinstance(err, (int, float)) and math.isfinite(err) and 0 <= err <= 1000):
            raise InputError(f"SoC profile {self.name!r}: calibration.median_op_error_pct = {err!r} "
                             f"must be a percentage >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SocProfile":
        """Build from a dict; fields left out come from ``d["base"]`` (default ``Ascend310P3``)."""
        d = dict(d)
        base_name = d.pop("base", "Ascend310P3")
        if base_name not in SOC_PROFILES:
            raise InputError(f"SoC profile: unknown base {base_name!r}",
                             hint=f"use one of {', '.join(SOC_PROFILES)}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise InputError(f"SoC profile: unknown field(s) {', '.join(unknown)}",
                             hint=f"known fields: {', '.join(sorted(fields))}")
        base = SOC_PROFILES[base_name].to_dict()
        sources = dict(base["sources"])
        for k in d:
            if k not in ("name", "sources"):
                sources[k] = "user override"
        sources.update(d.pop("sources", None) or {})
        if "calibration" not in d and set(d) - {"name"}:
            # the base's measured accuracy is not this profile's once a figure changed (a fitted profile
            # carries its own calibration record)
            base["calibration"] = {"calibrated": False}
        base.update(d)
        base["sources"] = sources
        for f in cls._RATES + cls._FRACTIONS + cls._TIMES + ("l2_mib",):
            if isinstance(base[f], int) and not isinstance(base[f], bool):
                base[f] = float(base[f])
        return cls(**base)

    def launch_for(self, engine: str | None) -> float:
        """Launch overhead of a kernel on an msprof engine (``AI_CORE``, ``AI_VECTOR_CORE``, ``MIX_AIC``…)."""
        return float(self.launch_us_by_engine.get(engine or "", self.launch_us))

    def transdata_launch(self, src: str, dst: str, engine: str | None = "AI_VECTOR_CORE") -> float:
        """Fixed cost of one TransData of a format pair (its own launch key, else the engine's)."""
        hit = self.launch_us_by_engine.get(f"TransData:{src}->{dst}")
        return float(hit) if hit is not None else self.launch_for(engine)

    def transdata_eff(self, src: str, dst: str, dtype: Any = None) -> float:
        """TransData efficiency for one format pair (and dtype), falling back to the pair, then the default."""
        pair = f"{src}->{dst}"
        if dtype is not None:
            hit = self.transdata_efficiency_by_pair.get(f"{pair}/{_dtype_name(dtype)}")
            if hit is not None:
                return float(hit)
        return float(self.transdata_efficiency_by_pair.get(pair, self.transdata_efficiency))

    def cube_eff(self, dtype: Any, op_class: str | None = None) -> float:
        """Cube efficiency for a dtype, optionally per op class (``"Conv/float32"``, ``"MatMul/bfloat16"``)."""
        name = _dtype_name(dtype)
        if op_class:
            hit = self.cube_efficiency_by_dtype.get(f"{op_class}/{name}")
            if hit is not None:
                return float(hit)
        return float(self.cube_efficiency_by_dtype.get(name, self.cube_efficiency))

    @property
    def calibrated(self) -> bool:
        return bool(self.calibration.get("calibrated"))

    def cube_peak_flops(self, dtype: Any) -> float:
        """Peak cube operations per second for a compute dtype."""
        name = _dtype_name(dtype)
        if name in ("int8", "uint8", "int4"):
            return self.int8_tops * 1e12
        if name in ("float32", "float64"):
            return self.fp32_tflops * 1e12
        return self.fp16_tflops * 1e12

    def vector_peak_flops(self, dtype: Any) -> float:
        """Peak vector operations per second: fp16 rate, half for 4-byte and wider types (assumption:
        the vector unit processes a fixed number of bytes per cycle)."""
        width = max(2, _itemsize(dtype))
        return self.vector_fp16_tflops * 1e12 * 2 / width


_A = "assumption: "
#: the per-key parameter tables of a SocProfile (sources are named "table.key")
_TABLES = ("launch_us_by_engine", "transdata_efficiency_by_pair", "cube_efficiency_by_dtype")
LAUNCH_ENGINES = ("AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV", "DSA_SQE")
_CALIBRATION_KEYS = ("calibrated", "captures", "median_op_error_pct", "summary", "per_type",
                     "leave_one_out_median_pct", "fitted", "parts")


def _check_map(name: str, field: str, d: Any, lo: float, hi: float, *, keys: Sequence[str] | None = None,
               key_ok=None) -> None:
    """A per-key parameter table: known keys, every value a finite number in (lo, hi]."""
    if not isinstance(d, dict):
        raise InputError(f"SoC profile {name!r}: {field} must be an object of numbers")
    for k, v in d.items():
        if (keys is not None and k not in keys) or (key_ok is not None and not key_ok(str(k))):
            raise InputError(f"SoC profile {name!r}: unknown key {field}.{k}",
                             hint=f"known: {', '.join(keys)}" if keys else
                             "keys look like 'NCHW->NC1HWC0' (TransData pairs), 'AI_CORE' or "
                             "'TransData:NCHW->NC1HWC0' (launch)")
        if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and lo < v <= hi) \
                and not (lo == 0.0 and field == "launch_us_by_engine" and v == 0):
            raise InputError(f"SoC profile {name!r}: {field}.{k} = {v!r} is out of range ({lo:g}, {hi:g}]")

SOC_PROFILES: dict[str, SocProfile] = {
    "Ascend310P3": SocProfile(
        name="Ascend310P3",
        fp16_tflops=70.0, int8_tops=140.0, fp32_tflops=17.5, vector_fp16_tflops=1.1,
        bandwidth_gbps=204.8, launch_us=3.0,
        cube_efficiency=0.7, vector_efficiency=0.5, bw_efficiency=0.7, transdata_efficiency=0.5,
        nd_load_efficiency=0.5, aicpu_gflops=20.0, aicpu_bandwidth_gbps=10.0, aicpu_launch_us=30.0,
        sources={
            "fp16_tflops": "Atlas 300I Pro (one Ascend 310P3) datasheet, " + _DESIGN,
            "int8_tops": "Atlas 300I Pro datasheet, " + _DESIGN,
            "fp32_tflops": _A + "1/4 of the FP16 cube rate (fp32 through the cube as split fp16 "
                           "passes); ATC's default force_fp16 avoids it",
            "vector_fp16_tflops": _A + "8 AI Cores x 128 fp16 lanes (256-byte vector) x ~1.08 GHz, "
                                  "the clock implied by 70 TFLOPS with a 16x16x16 cube per core",
            "bandwidth_gbps": "LPDDR4X 204.8 GB/s, " + _DESIGN,
            "launch_us": _A + "'each kernel launch costs a few microseconds' (design.md)",
            "cube_efficiency": _A + "large GEMM/Conv reach ~70 % of cube peak",
            "vector_efficiency": _A + "~50 % of vector peak",
            "bw_efficiency": _A + "streaming kernels reach ~70 % of DDR peak",
            "transdata_efficiency": _A + "layout transposes (strided reads or writes) reach ~50 % "
                                    "of DDR peak",
            "nd_load_efficiency": _A + "ND cube operands load as 32-byte strided rows instead of "
                                  "contiguous 512-byte fractals: ~50 % of DDR peak",
            "aicpu_gflops": _A + "a few ARM cores running scalar/NEON kernels",
            "aicpu_bandwidth_gbps": _A + "AI CPU kernels copy through the control CPU's caches",
            "aicpu_launch_us": _A + "AI CPU task hand-off and completion sync of tens of µs",
            "fill_efficiency": _A + "write-only kernels (ZerosLike, MemSet) stream at ~70 % of peak",
            "dsa_bandwidth_gbps": _A + "the DSA engine's random bit-mask generation, tens of GB/s",
            "transposed_read_efficiency": _A + "no penalty for a transposed cube operand until a capture shows one",
            "cube_write_efficiency": _A + "cube results stream out like other kernels' writes (~70 % of peak)",
            "l2_mib": "not known (no source here gives the 310P3's L2 size): cost check makes no plausibility check",
        }),
    "Ascend910B": SocProfile(
        name="Ascend910B",
        fp16_tflops=300.0, int8_tops=600.0, fp32_tflops=75.0, vector_fp16_tflops=11.0,
        bandwidth_gbps=1600.0, launch_us=3.0,
        cube_efficiency=0.7, vector_efficiency=0.5, bw_efficiency=0.7, transdata_efficiency=0.5,
        nd_load_efficiency=0.5, aicpu_gflops=40.0, aicpu_bandwidth_gbps=20.0, aicpu_launch_us=30.0,
        l2_mib=192.0,
        sources={
            "fp16_tflops": "'on the order of 300 TFLOPS FP16', " + _DESIGN,
            "int8_tops": _A + "2x the FP16 cube rate, as on 310P3",
            "fp32_tflops": _A + "1/4 of the FP16 cube rate",
            "vector_fp16_tflops": _A + "~48 vector cores x 128 fp16 lanes x ~1.8 GHz",
            "bandwidth_gbps": "'1.6 TB/s HBM', " + _DESIGN,
            "launch_us": _A + "'each kernel launch costs a few microseconds' (design.md)",
            "cube_efficiency": _A + "large GEMM/Conv reach ~70 % of cube peak",
            "vector_efficiency": _A + "~50 % of vector peak",
            "bw_efficiency": _A + "streaming kernels reach ~70 % of HBM peak",
            "transdata_efficiency": _A + "layout transposes reach ~50 % of HBM peak",
            "nd_load_efficiency": _A + "ND cube operands load as strided rows: ~50 % of HBM peak",
            "aicpu_gflops": _A + "a few ARM cores running scalar/NEON kernels",
            "aicpu_bandwidth_gbps": _A + "AI CPU kernels copy through the control CPU's caches",
            "aicpu_launch_us": _A + "AI CPU task hand-off and completion sync of tens of µs",
            "fill_efficiency": _A + "write-only kernels (ZerosLike, MemSet) stream at ~70 % of peak",
            "dsa_bandwidth_gbps": _A + "the DSA engine's random bit-mask generation, tens of GB/s",
            "transposed_read_efficiency": _A + "no penalty for a transposed cube operand until a capture shows one",
            "cube_write_efficiency": _A + "cube results stream out like other kernels' writes (~70 % of peak)",
            "l2_mib": _A + "Ascend910B2's L2, 192 MiB (CANN platform_config Ascend910B2.ini [SoCInfo]): the "
                      "family profile's figures describe a 24-core part",
        }),
}



def _load_calibration(name: str) -> dict | None:
    """The fitted parameters of a built-in profile (``data/soc_calibration_<name>.json``, written by
    ``benchmarks/bench_cost.py --write`` from the shared captures), or None."""
    from importlib import resources

    try:
        text = resources.files("npu_deploy.converters.lowering").joinpath(
            f"data/soc_calibration_{name}.json").read_text("utf-8")
    except (FileNotFoundError, OSError):
        return None
    return json.loads(text)


def _calibrated(p: SocProfile, calib: dict | None) -> SocProfile:
    if not calib:
        return p
    fields = {k: v for k, v in calib.items() if k not in ("name", "base", "sources")}
    sources = dict(p.sources)
    sources.update(calib.get("sources") or {})
    return dataclasses.replace(p, **fields, sources=sources)


#: the 910B's datasheet figures and assumptions before the calibration is loaded over them: where
#: ``benchmarks/bench_cost.py`` starts its fit, so a re-fit does not start from the previous one
DATASHEET_910B = SOC_PROFILES["Ascend910B"]
SOC_PROFILES["Ascend910B"] = _calibrated(SOC_PROFILES["Ascend910B"], _load_calibration("Ascend910B"))


def _derived(name: str, peaks: dict, peak_sources: dict, efficiencies_from: str = "Ascend910B") -> SocProfile:
    """A profile from datasheet peaks plus the (fitted) efficiencies and launch costs of another SoC,
    labelled not calibrated: no capture of this SoC exists here."""
    ref = SOC_PROFILES[efficiencies_from]
    keep = {k: getattr(ref, k) for k in ("launch_us", "cube_efficiency", "vector_efficiency", "bw_efficiency",
                                          "transdata_efficiency", "nd_load_efficiency", "aicpu_gflops",
                                          "aicpu_bandwidth_gbps", "aicpu_launch_us", "fill_efficiency",
                                          "dsa_bandwidth_gbps", "transposed_read_efficiency",
                                          "cube_write_efficiency")}
    # the AI CPU copies through the same memory: never faster than a quarter of it (assumption)
    keep["aicpu_bandwidth_gbps"] = min(ref.aicpu_bandwidth_gbps, 0.25 * peaks["bandwidth_gbps"])
    # nor computes faster than a tenth of the AI Cores' vector peak (assumption: a small SoC has small
    # AI CPUs; on a 310 the vector unit at its lowest fitted efficiency still outruns them)
    keep["aicpu_gflops"] = min(ref.aicpu_gflops, 100.0 * peaks["vector_fp16_tflops"])
    ratio = peaks["fp16_tflops"] / ref.fp16_tflops
    peaks = dict(peaks)
    peaks.setdefault("fp32_tflops", ref.fp32_tflops * ratio)
    srcs = {k: f"not calibrated: {efficiencies_from}'s value ({ref.sources.get(k, 'assumption')})" for k in keep}
    for table in _TABLES:
        for k in getattr(ref, table):
            srcs[f"{table}.{k}"] = f"not calibrated: {efficiencies_from}'s value ({ref.sources.get(f'{table}.{k}', 'assumption')})"
    srcs.update(peak_sources)
    srcs.setdefault("fp32_tflops", _A + f"{efficiencies_from}'s fp32 cube rate scaled by the FP16 peak ratio")
    peaks.setdefault("l2_mib", None)
    srcs.setdefault("l2_mib", f"not known (no source here gives the {name}'s L2 size): cost check makes no "
                              f"plausibility check")
    return SocProfile(name=name, **peaks, **keep, sources=srcs,
                      launch_us_by_engine=dict(ref.launch_us_by_engine),
                      transdata_efficiency_by_pair=dict(ref.transdata_efficiency_by_pair),
                      cube_efficiency_by_dtype=dict(ref.cube_efficiency_by_dtype),
                      calibration={"calibrated": False,
                                   "summary": f"datasheet peaks; efficiencies and launch costs of "
                                              f"{efficiencies_from}; no {name} capture"})


SOC_PROFILES["Ascend310"] = _derived("Ascend310", dict(
    fp16_tflops=8.0, int8_tops=16.0, vector_fp16_tflops=0.25, bandwidth_gbps=25.6), {
    "fp16_tflops": "Ascend 310 published figure (8 TFLOPS FP16)",
    "int8_tops": "Ascend 310 published figure (16 TOPS INT8)",
    "vector_fp16_tflops": _A + "2 AI Cores x 128 fp16 lanes x ~1 GHz",
    "bandwidth_gbps": _A + "LPDDR4X, 2 x 64-bit channels at 3200 MT/s (25.6 GB/s)"})
SOC_PROFILES["Ascend310B"] = _derived("Ascend310B", dict(
    fp16_tflops=10.0, int8_tops=20.0, vector_fp16_tflops=0.3, bandwidth_gbps=51.2), {
    "fp16_tflops": _A + "half the INT8 rate",
    "int8_tops": "Atlas 200I A2 (Ascend 310B) published figure, 20 TOPS INT8",
    "vector_fp16_tflops": _A + "the 310P3 vector rate scaled by its AI Core count",
    "bandwidth_gbps": _A + "LPDDR4X 51.2 GB/s"})
SOC_PROFILES["Ascend910"] = _derived("Ascend910", dict(
    fp16_tflops=256.0, int8_tops=512.0, vector_fp16_tflops=8.0, bandwidth_gbps=1200.0), {
    "fp16_tflops": "Ascend 910 published figure (256 TFLOPS FP16)",
    "int8_tops": "Ascend 910 published figure (512 TOPS INT8)",
    "vector_fp16_tflops": _A + "32 AI Cores x 128 fp16 lanes x ~2 GHz",
    "bandwidth_gbps": _A + "4 HBM2 stacks, ~1.2 TB/s"})
SOC_PROFILES["Ascend910_93"] = _derived("Ascend910_93", {
    k: getattr(SOC_PROFILES["Ascend910B"], k) for k in ("fp16_tflops", "int8_tops", "fp32_tflops",
                                                         "vector_fp16_tflops", "bandwidth_gbps")}, {
    "fp16_tflops": _A + "per die the same as Ascend910B (Atlas A3 pairs two such dies; one device here)",
    "int8_tops": _A + "as Ascend910B", "fp32_tflops": _A + "as Ascend910B",
    "vector_fp16_tflops": _A + "as Ascend910B", "bandwidth_gbps": _A + "as Ascend910B, per die"})
#: Core counts per 910B part, from CANN's platform config ("CANN platform_config Ascend910B2.ini /
#: Ascend910B4.ini [SoCInfo]": ai_core_cnt, cube_core_cnt, vector_core_cnt; memory and L2 sizes; the
#: cube clock where the file gives it). ``"Ascend910B"`` is the family profile's own assumption: its
#: 300 TFLOPS and its vector figure (48 vector cores) describe a 24-core part. Ascend910B1's count is
#: in no source here: it keeps the family profile. The HBM rate per part is in none of these files.
SOC_PARTS: dict[str, dict] = {
    "Ascend910B": {"family": "Ascend910B", "cube_cores": 24, "vector_cores": 48, "cube_ghz": None,
                   "source": _A + "the family profile's 300 TFLOPS and 48 vector cores describe a 24-core part"},
    "Ascend910B2": {"family": "Ascend910B", "cube_cores": 24, "vector_cores": 48, "cube_ghz": None,
                    "memory_gib": 64, "l2_mib": 192,
                    "source": "CANN platform_config Ascend910B2.ini [SoCInfo]: ai_core_cnt=24, cube_core_cnt=24, "
                              "vector_core_cnt=48; 64 GiB, L2 192 MiB"},
    "Ascend910B3": {"family": "Ascend910B", "cube_cores": 20, "vector_cores": 40, "cube_ghz": None,
                    "source": "CANN platform_config Ascend910B3.ini [SoCInfo]: 20 AI cores, 40 vector cores"},
    "Ascend910B4": {"family": "Ascend910B", "cube_cores": 20, "vector_cores": 40, "cube_ghz": 1.5,
                    "memory_gib": 32, "l2_mib": 96,
                    "source": "CANN platform_config Ascend910B4.ini [SoCInfo]: ai_core_cnt=20, cube_core_cnt=20, "
                              "vector_core_cnt=40, cube_freq 1500 MHz; 32 GiB, L2 96 MiB"},
}
#: fp16 multiply-adds per cube core per cycle (a 16x16x16 cube), times 2 operations each
_CUBE_FLOPS_PER_CYCLE = 16 * 16 * 16 * 2


def part_profile(p: SocProfile, part: str, *, ref: str | None = None) -> SocProfile:
    """``p`` (a profile of a 910B-class family, e.g. the calibrated ``Ascend910B``) as it would price
    ``part``: cube and vector peaks scaled by the part's core counts over those of ``ref`` (default:
    ``p``'s own name in :data:`SOC_PARTS`), the cube peak from the part's cube clock where CANN gives
    it; every efficiency, launch cost and the HBM rate shared. ``p`` itself when either core count is
    unknown.

    >>> round(part_profile(SOC_PROFILES["Ascend910B"], "Ascend910B4").fp16_tflops, 2)
    245.76
    """
    fact, base = SOC_PARTS.get(part), SOC_PARTS.get(ref or p.name)
    if fact is None or base is None:
        return p
    if part == (ref or p.name):
        return p
    if fact["cube_ghz"]:
        fp16 = fact["cube_cores"] * _CUBE_FLOPS_PER_CYCLE * fact["cube_ghz"] * 1e9 / 1e12
        cube_src = (f"{fact['source']}: {fact['cube_cores']} cores x 16x16x16 x 2 x {fact['cube_ghz']:g} GHz")
    else:
        fp16 = p.fp16_tflops * fact["cube_cores"] / base["cube_cores"]
        cube_src = (f"{fact['source']}; {p.name}'s figure x {fact['cube_cores']}/{base['cube_cores']} cube cores "
                    f"(assumption: same clock)")
    s_cube = fp16 / p.fp16_tflops
    s_vec = fact["vector_cores"] / base["vector_cores"]
    sources = dict(p.sources)
    sources.update({
        "fp16_tflops": cube_src,
        "int8_tops": f"{p.name}'s ratio to fp16 ({p.sources.get('int8_tops', 'assumption')}) at this part's fp16 peak",
        "fp32_tflops": f"{p.name}'s fp32 cube rate ({p.sources.get('fp32_tflops', 'assumption')}) x {s_cube:.4g} "
                       f"(this part's cube peak over {p.name}'s)",
        "vector_fp16_tflops": f"{fact['source']}; {p.name}'s vector figure x {fact['vector_cores']}/"
                              f"{base['vector_cores']} vector cores (assumption: same clock)",
        "bandwidth_gbps": _A + f"{p.name}'s HBM figure ({p.sources.get('bandwidth_gbps', '')}); CANN's "
                          f"platform_config gives no HBM rate per part"})
    if fact.get("l2_mib"):
        l2, sources["l2_mib"] = float(fact["l2_mib"]), fact["source"]
    else:
        l2 = p.l2_mib
        sources["l2_mib"] = _A + f"{p.name}'s L2 figure ({p.sources.get('l2_mib', 'not known')}); no source here " \
                                 f"gives {part}'s"
    calib = dict(p.calibration)
    if calib:
        calib["summary"] = (f"{part}: {p.name}'s efficiencies and launch costs with this part's cube/vector "
                            f"peaks; " + str(calib.get("summary", "")))
    return dataclasses.replace(p, name=part, fp16_tflops=fp16, int8_tops=p.int8_tops * s_cube,
                               fp32_tflops=p.fp32_tflops * s_cube,
                               vector_fp16_tflops=p.vector_fp16_tflops * s_vec, l2_mib=l2, sources=sources,
                               calibration=calib)


def part_family(name: str) -> str:
    """The profile a part's calibration belongs to (``Ascend910B4`` -> ``Ascend910B``), else ``name``."""
    fact = SOC_PARTS.get(name)
    return fact["family"] if fact else name


for _part in ("Ascend910B2", "Ascend910B3", "Ascend910B4"):
    SOC_PROFILES[_part] = part_profile(SOC_PROFILES["Ascend910B"], _part)

SOC_PROFILES["Ascend310P3"] = dataclasses.replace(
    SOC_PROFILES["Ascend310P3"], calibration={"calibrated": False,
                                              "summary": "datasheet peaks and assumed efficiencies; no 310P3 capture"})

# A SoC uses its family's profile (ops.soc_family; assumption: same silicon, other bins or packaging);
# the profiles are named after their family, except Ascend310P's, named after its chip.
_PROFILE_OF_FAMILY = {"Ascend310P": "Ascend310P3"}


def cann_type(op_type: str, opset: int = 17) -> str:
    """The CANN kernel type msprof would name for an ONNX op (Conv -> Conv2D, MatMul -> MatMulV2 …),
    from the ONNX -> CANN registrations of the op-support data; the ONNX name when it has none.

    >>> cann_type("Conv"), cann_type("NoSuchOp")
    ('Conv2D', 'NoSuchOp')
    """
    try:
        found = support._lookup("ai.onnx", int(opset), op_type)
    except Exception:  # the support data is optional for naming: keep the ONNX name
        found = None
    if not found:
        return op_type
    return support._primary(op_type, found[0], found[1]) or op_type


def estimated_profile_soc(path: "str | os.PathLike | None") -> str | None:
    """The SoC an emulator-written (estimated) profile was priced for: its README.txt says
    "... estimate from npu-deploy's cost model for <SoC>". None when not found."""
    import re
    from pathlib import Path

    if path is None:
        return None
    root = Path(path)
    for readme in [*(root.rglob("README.txt") if root.is_dir() else []), root.parent / "README.txt"][:50]:
        try:
            if readme.is_file() and readme.stat().st_size < 65536:
                m = re.search(r"cost model for (\S+)", readme.read_text("utf-8", errors="replace"))
                if m and m.group(1) != "unknown":
                    return m.group(1).rstrip(".,;")
        except OSError:
            continue
    return None


def accuracy_note(soc: "str | SocProfile | os.PathLike | None") -> str:
    """How good the cost model is for ``soc``, to print beside every estimate.

    >>> accuracy_note("Ascend310P3")
    'cost model not calibrated for Ascend310P3: datasheet figures and assumed efficiencies'
    """
    try:
        p = get_soc_profile(soc) if soc is not None else None
    except InputError:
        p = None
    label = soc if isinstance(soc, str) and not soc.lower().endswith(".json") else (
        p.name if p is not None else str(soc))
    if p is None or not p.calibrated:
        return f"cost model not calibrated for {label}: datasheet figures and assumed efficiencies"
    err = p.calibration.get("median_op_error_pct")
    caps = p.calibration.get("captures") or []
    td = (p.calibration.get("per_type") or {}).get("TransData")
    fam = part_family(p.name)
    where = f"{len(caps)} real {fam} captures" if len(caps) > 1 else f"real {fam} captures"
    extra = f", TransData {td:.0f} %" if isinstance(td, (int, float)) else ""
    return (f"cost model: median op error {err:.0f} %{extra} on {where}" if isinstance(err, (int, float))
            else f"cost model calibrated on {where}")


def get_soc_profile(soc: "str | SocProfile | os.PathLike") -> SocProfile:
    """Resolve a SoC name, a :class:`SocProfile` or a JSON file path to a profile.

    >>> get_soc_profile("Ascend910B1").name, get_soc_profile("Ascend910B4").name
    ('Ascend910B', 'Ascend910B4')
    """
    if isinstance(soc, SocProfile):
        return soc
    text = os.fspath(soc)
    if text.lower().endswith(".json") or os.sep in text:
        try:
            with open(text, encoding="utf-8") as f:
                d = json.load(f)
        except OSError as e:
            raise InputError(f"cannot read SoC profile {text}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise InputError(f"SoC profile {text}: not JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(d, dict) or "name" not in d:
            raise InputError(f"SoC profile {text}: expected a JSON object with a 'name'",
                             hint='example: {"name": "my310P", "base": "Ascend310P3", '
                                  '"bandwidth_gbps": 150}')
        try:
            return SocProfile.from_dict(d)
        except TypeError as e:
            raise InputError(f"SoC profile {text}: {e}") from None
    if text in SOC_PROFILES:
        return SOC_PROFILES[text]
    family = soc_family(text)
    if family is not None and _PROFILE_OF_FAMILY.get(family, family) in SOC_PROFILES:
        return SOC_PROFILES[_PROFILE_OF_FAMILY.get(family, family)]
    raise InputError(f"no cost profile for SoC {text!r}",
                     hint=f"known: {', '.join(SOC_PROFILES)}; or pass a SocProfile / JSON file")


def _dtype_name(dtype: Any) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def _itemsize(dtype: Any) -> int:
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 2


# ---------------------------------------------------------------------------------------------
# Work per op

@dataclasses.dataclass(frozen=True)
class OpWork:
    """What one op does: floating/integer operations, bytes read and written, and the unit.

    ``unit`` is ``"cube"`` (matrix unit), ``"vector"`` or ``"none"`` (a view: no kernel).
    """

    flops: float
    bytes_in: int
    bytes_out: int
    unit: str

    @property
    def nbytes(self) -> int:
        return self.bytes_in + self.bytes_out


VIEW_OPS = ops.FREE_OPS   # the op table's cost class "free": no kernel time

# The cost model's per-op columns (operations per element, reduce / data-movement / partial-read
# groups) are the op table's (ops.py)
_ELEMENTWISE = ops.COST_OPS_PER_ELEMENT
_REDUCE = ops.COST_REDUCE_OPS
_MOVE = ops.COST_MOVE_OPS
_PARTIAL_READ = ops.COST_PARTIAL_READ_OPS


def _attr(node, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class _Tensors:
    """Shape/dtype lookup for one node, with errors that name the node and tensor."""

    def __init__(self, node, shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, Any]):
        self.node, self.shapes, self.dtypes = node, shapes, dtypes
        self.label = f"{node.op_type} node {node.name or '<unnamed>'!r}"

    def shape(self, name: str) -> tuple[int, ...]:
        shp = self.shapes.get(name)
        if shp is None:
            raise InputError(f"cost model: {self.label}: no shape for tensor {name!r}",
                             hint="run shape inference with fixed input shapes (--input-shape)")
        shp = tuple(int(d) for d in shp)
        if any(d < 0 for d in shp):
            raise InputError(f"cost model: {self.label}: tensor {name!r} has a dynamic shape {shp}",
                             hint="fix the dynamic dimensions with --input-shape")
        return shp

    def nbytes(self, name: str) -> int:
        dt = self.dtypes.get(name)
        size = _itemsize(dt) if dt is not None else 4
        return _numel(self.shape(name)) * size

    def inputs(self) -> list[str]:
        return [n for n in self.node.input if n]

    def outputs(self) -> list[str]:
        return [n for n in self.node.output if n]


def _conv_flops(t: _Tensors, transpose: bool) -> float:
    node = t.node
    x = t.shape(node.input[0])
    w = t.shape(node.input[1])
    y = t.shape(node.output[0])
    group = int(_attr(node, "group", 1))
    kernel = _numel(w[2:])
    if not transpose:
        # y[n, m, *out] = sum over C/g input channels and the kernel window
        macs = _numel(y) * w[1] * kernel
    else:
        # every input element scatters into M/g output channels over the kernel window
        macs = _numel(x) * w[1] * kernel
    del group  # the weight shape already carries C/g (Conv) or M/g (ConvTranspose)
    bias = _numel(y) if len(node.input) > 2 and node.input[2] else 0
    return 2.0 * macs + bias


def _matmul_flops(t: _Tensors) -> float:
    a = t.shape(t.node.input[0])
    y = t.shape(t.node.output[0])
    k = a[-1] if a else 1
    return 2.0 * _numel(y) * k


def _gemm_flops(t: _Tensors) -> float:
    a = t.shape(t.node.input[0])
    y = t.shape(t.node.output[0])
    k = a[0] if _attr(t.node, "transA", 0) else a[-1]
    extra = _numel(y) if len(t.node.input) > 2 and t.node.input[2] else 0
    return 2.0 * _numel(y) * k + extra


def _rnn_flops(t: _Tensors, gates: int) -> float:
    node = t.node
    x = t.shape(node.input[0])
    w = t.shape(node.input[1])          # [dirs, gates*H, input]
    layout = int(_attr(node, "layout", 0))
    seq, batch = (x[0], x[1]) if layout == 0 else (x[1], x[0])
    dirs, gh, inp = w
    hidden = gh // gates
    gemm = 2.0 * gh * (inp + hidden)
    pointwise = 10.0 * hidden          # gate activations and state update (assumption)
    return dirs * seq * batch * (gemm + pointwise)


def op_work(node, shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, Any]) -> OpWork:
    """Operations and bytes of one ONNX node, and the unit that would run it.

    ``shapes``/``dtypes`` map tensor names (inputs, outputs and initializers) to static shapes and
    numpy dtypes. Unknown op types are estimated as vector work moving their inputs and outputs.

    >>> import onnx.helper as h
    >>> node = h.make_node("MatMul", ["a", "b"], ["y"])
    >>> w = op_work(node, {"a": (128, 384), "b": (384, 384), "y": (128, 384)},
    ...             dict.fromkeys("aby", np.dtype("float16")))
    >>> w.flops == 2 * 128 * 384 * 384, w.unit
    (True, 'cube')
    """
    op = node.op_type
    if op in VIEW_OPS:
        return OpWork(0.0, 0, 0, "none")
    t = _Tensors(node, shapes, dtypes)
    bytes_out = sum(t.nbytes(n) for n in t.outputs())
    if op in _PARTIAL_READ:
        # Only the selected elements of the data input are read (an embedding Gather reads a
        # few rows of a large table), plus the index/parameter inputs.
        bytes_in = bytes_out + sum(t.nbytes(n) for n in t.inputs()[1:])
    else:
        bytes_in = sum(t.nbytes(n) for n in t.inputs())
    out_elems = sum(_numel(t.shape(n)) for n in t.outputs())
    unit = "vector"
    if op == "Conv":
        flops, unit = _conv_flops(t, transpose=False), "cube"
    elif op == "ConvTranspose":
        flops, unit = _conv_flops(t, transpose=True), "cube"
    elif op in ("MatMul", "MatMulInteger", "QLinearMatMul"):
        flops, unit = _matmul_flops(t), "cube"
    elif op == "Gemm":
        flops, unit = _gemm_flops(t), "cube"
    elif op == "LSTM":
        flops, unit = _rnn_flops(t, 4), "cube"
    elif op == "GRU":
        flops, unit = _rnn_flops(t, 3), "cube"
    elif op == "RNN":
        flops, unit = _rnn_flops(t, 1), "cube"
    elif op in ("BatchNormalization", "InstanceNormalization"):
        flops = 2.0 * out_elems
    elif op in ("LayerNormalization", "GroupNormalization", "LpNormalization",
                "MeanVarianceNormalization"):
        flops = 8.0 * out_elems
    elif op in ("Softmax", "LogSoftmax", "Hardmax"):
        flops = 5.0 * out_elems
    elif op in ("MaxPool", "AveragePool", "LpPool"):
        kernel = _attr(node, "kernel_shape", [1])
        flops = float(out_elems * _numel(kernel))
    elif op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool") or op in _REDUCE:
        flops = float(_numel(t.shape(node.input[0])))
    elif op in ("Resize", "Upsample"):
        mode = _attr(node, "mode", b"nearest")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        spatial = max(1, len(t.shape(node.output[0])) - 2)
        per = 1 if mode == "nearest" else (2 ** spatial) * 2 if mode == "linear" else 4 ** spatial * 2
        flops = float(out_elems * per)
    elif op in _ELEMENTWISE:
        flops = _ELEMENTWISE[op] * out_elems
    else:  # data movement and unknown ops: bytes only
        flops = 0.0
    return OpWork(float(flops), int(bytes_in), int(bytes_out), unit)


# ---------------------------------------------------------------------------------------------
# Time per op

ENGINES = ("AI Core", "AI CPU")


def op_time_us(work: OpWork, soc: "str | SocProfile", dtype: Any = "float16",
               engine: str = "AI Core", operand_format: str | None = None) -> float:
    """Estimated device time of one op in µs.

    >>> w = OpWork(2 * 1024**3, 3 * 1024 * 1024 * 2, 1024 * 1024 * 2, "cube")
    >>> round(op_time_us(w, "Ascend310P3"), 1)   # 8 MiB moved: bandwidth-bound on 310P3
    61.5
    >>> round(op_time_us(w, "Ascend910B"), 1)    # compute-bound on 910B
    13.2
    """
    p = get_soc_profile(soc)
    if work.unit == "none":
        return 0.0
    if engine == "AI CPU":
        compute_s = work.flops / (p.aicpu_gflops * 1e9)
        memory_s = work.nbytes / (p.aicpu_bandwidth_gbps * 1e9)
        return p.aicpu_launch_us + 1e6 * max(compute_s, memory_s)
    if engine != "AI Core":
        raise InputError(f"cost model: unknown engine {engine!r}", hint="use 'AI Core' or 'AI CPU'")
    bw = p.bandwidth_gbps * 1e9 * p.bw_efficiency
    if work.unit == "cube":
        compute_s = work.flops / (p.cube_peak_flops(dtype) * p.cube_efficiency)
        if operand_format is not None and operand_format.upper() == "ND":
            memory_s = (work.bytes_in / (p.bandwidth_gbps * 1e9 * p.nd_load_efficiency)
                        + work.bytes_out / bw)
        else:
            memory_s = work.nbytes / bw
    elif work.unit == "vector":
        compute_s = work.flops / (p.vector_peak_flops(dtype) * p.vector_efficiency)
        memory_s = work.nbytes / bw
    else:
        raise InputError(f"cost model: unknown unit {work.unit!r}",
                         hint="use 'cube', 'vector' or 'none'")
    return p.launch_us + 1e6 * max(compute_s, memory_s)


def transdata_time_us(nbytes: int, src_format: str, dst_format: str, soc: "str | SocProfile",
                      dst_nbytes: int | None = None, dtype: Any = None) -> float:
    """Estimated time of one TransData (layout conversion) on AI Core, in µs.

    ``nbytes`` is the stored size of the source, ``dst_nbytes`` of the result (padding to C0 or 16
    can make it larger; default: same as the source). The formats label the conversion; the model
    charges a launch plus reading and writing every byte at the transpose bandwidth.

    >>> round(transdata_time_us(1 * 64 * 56 * 56 * 2, "NCHW", "NC1HWC0", "Ascend310P3"), 1)
    10.8
    """
    p = get_soc_profile(soc)
    if nbytes < 0 or (dst_nbytes is not None and dst_nbytes < 0):
        raise InputError(f"cost model: TransData {src_format}->{dst_format} with negative size")
    moved = nbytes + (nbytes if dst_nbytes is None else dst_nbytes)
    return (p.transdata_launch(src_format, dst_format)
            + 1e6 * moved / (p.bandwidth_gbps * 1e9 * p.transdata_eff(src_format, dst_format, dtype)))


# ---------------------------------------------------------------------------------------------
# Whole-model estimate

@dataclasses.dataclass(frozen=True)
class EstimatedOp:
    """An op to estimate: its work, compute dtype, engine and (for cube ops) operand format."""

    name: str
    op_type: str
    work: OpWork
    dtype: str = "float16"
    engine: str = "AI Core"
    operand_format: str | None = None


@dataclasses.dataclass(frozen=True)
class EstimatedTransData:
    """A planned layout conversion: stored bytes before and (optionally) after."""

    name: str
    src_format: str
    dst_format: str
    nbytes: int
    dst_nbytes: int | None = None


@dataclasses.dataclass
class OpEstimate:
    name: str
    op_type: str
    engine: str
    unit: str
    flops: float
    bytes: int
    est_us: float


@dataclasses.dataclass
class TransDataEstimate:
    name: str
    src_format: str
    dst_format: str
    nbytes: int
    est_us: float


@dataclasses.dataclass
class CostReport(Result):
    """Estimated per-op device times and the FormatTrans share (a model, not a measurement).

    ``bool(report)`` is True when the estimated FormatTrans share is within the threshold.
    """

    SCHEMA: ClassVar[str] = "npu-deploy/cost-estimate"
    SCHEMA_VERSION: ClassVar[int] = 1

    soc: str
    profile: dict
    ops: list[OpEstimate]
    transdata: list[TransDataEstimate]
    compute_us: float
    formattrans_us: float
    total_us: float
    formattrans_share: float  # 0..1 (the JSON field); formattrans_share_pct in percent
    threshold_pct: float = FORMATTRANS_THRESHOLD_PCT
    estimated: bool = True

    @property
    def formattrans_share_pct(self) -> float:
        return 100.0 * self.formattrans_share

    @property
    def flagged(self) -> bool:
        return self.formattrans_share_pct > self.threshold_pct

    def __bool__(self) -> bool:
        return not self.flagged

    def top_ops(self, n: int = 10) -> list[OpEstimate]:
        """The ``n`` ops with the largest estimated time."""
        return sorted(self.ops, key=lambda o: -o.est_us)[:n]

    def manifest_summary(self) -> dict[str, Any]:
        """The bundle manifest's ``cost`` entry."""
        return {"estimated": True, "soc": self.soc, "total_us": self.total_us,
                "formattrans_share": self.formattrans_share,
                "est_us": {o.name: o.est_us for o in self.ops}}

    def verdict(self) -> str:
        state = "flagged" if self.flagged else "ok"
        return (f"estimated on {self.soc} (cost model, not a measurement): "
                f"{self.total_us / 1000:.3f} ms per inference, FormatTrans "
                f"{100 * self.formattrans_share:.1f} % ({len(self.transdata)} TransData, "
                f"threshold {self.threshold_pct:g} %) — {state}")

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["flagged"] = self.flagged
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CostReport":
        return cls(soc=d["soc"], profile=d["profile"],
                   ops=[OpEstimate(**o) for o in d["ops"]],
                   transdata=[TransDataEstimate(**t) for t in d["transdata"]],
                   compute_us=d["compute_us"], formattrans_us=d["formattrans_us"],
                   total_us=d["total_us"], formattrans_share=d["formattrans_share"],
                   threshold_pct=d.get("threshold_pct", 100 * d["threshold"] if "threshold" in d
                                       else FORMATTRANS_THRESHOLD_PCT))


def _as_transdata(t: Any) -> EstimatedTransData:
    if isinstance(t, EstimatedTransData):
        return t
    if isinstance(t, Mapping):
        try:
            nbytes = t["nbytes"] if "nbytes" in t else t["bytes"]
            return EstimatedTransData(str(t.get("name", "")), str(t["src_format"]),
                                      str(t["dst_format"]), int(nbytes), t.get("dst_nbytes"))
        except KeyError as e:
            raise InputError(f"cost model: TransData entry {dict(t)!r} has no {e.args[0]!r}") from None
    raise InputError(f"cost model: cannot read TransData entry {t!r}")


def estimate(ops: Iterable[EstimatedOp], transdata: Iterable[Any] = (), soc: Any = "Ascend310P3",
             *, soc_profile: "SocProfile | str | os.PathLike | None" = None,
             threshold_pct: float = FORMATTRANS_THRESHOLD_PCT) -> CostReport:
    """Estimate every op and TransData and the FormatTrans share of the estimated total.

    ``soc_profile`` (a :class:`SocProfile` or a JSON path) overrides the built-in profile of ``soc``.

    >>> r = estimate([EstimatedOp("relu", "Relu", OpWork(1e6, 2e6, 2e6, "vector"))], [],
    ...              "Ascend910B")
    >>> r.formattrans_share, bool(r)
    (0.0, True)
    """
    p = get_soc_profile(soc_profile if soc_profile is not None else soc)
    op_rows = []
    for o in ops:
        if o.engine not in ENGINES:
            raise InputError(f"cost model: op {o.name!r} has engine {o.engine!r}",
                             hint="use 'AI Core' or 'AI CPU' (unsupported ops cannot be estimated)")
        us = op_time_us(o.work, p, o.dtype, o.engine, o.operand_format)
        op_rows.append(OpEstimate(o.name, o.op_type, o.engine, o.work.unit, o.work.flops,
                                  o.work.nbytes, us))
    td_rows = []
    for t in map(_as_transdata, transdata):
        us = transdata_time_us(t.nbytes, t.src_format, t.dst_format, p, t.dst_nbytes)
        td_rows.append(TransDataEstimate(t.name, t.src_format, t.dst_format, t.nbytes, us))
    compute = sum(r.est_us for r in op_rows)
    trans = sum(r.est_us for r in td_rows)
    total = compute + trans
    share = trans / total if total > 0 else 0.0
    soc_name = soc if isinstance(soc, str) and soc_profile is None else p.name
    return CostReport(soc=str(soc_name), profile=p.to_dict(), ops=op_rows, transdata=td_rows,
                      compute_us=compute, formattrans_us=trans, total_us=total,
                      formattrans_share=share, threshold_pct=threshold_pct)


def tensor_types(model) -> tuple[dict[str, tuple[int, ...]], dict[str, np.dtype]]:
    """Shapes (-1 for unknown dims) and numpy dtypes of every typed tensor of a shape-inferred model."""
    from onnx import helper

    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, np.dtype] = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not tt.HasField("elem_type") or not tt.elem_type:
            continue
        dtypes[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if tt.HasField("shape"):
            shapes[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else -1
                                    for d in tt.shape.dim)
    for init in g.initializer:
        shapes[init.name] = tuple(init.dims)
        dtypes[init.name] = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type))
    for node in g.node:
        if node.op_type == "Constant" and node.output:
            value = _attr(node, "value")
            if value is not None and hasattr(value, "dims"):
                shapes[node.output[0]] = tuple(value.dims)
                dtypes[node.output[0]] = np.dtype(helper.tensor_dtype_to_np_dtype(value.data_type))
    return shapes, dtypes


def _load(model) -> Any:
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(str(model))
    except (OSError, onnx.onnx_cpp2py_export.checker.ValidationError) as e:
        raise ModelError(f"cannot load ONNX model {model}: {e}") from None
    except Exception as e:  # protobuf DecodeError and friends
        raise ModelError(f"{model}: not an ONNX model ({type(e).__name__})",
                         hint="check the file is a .onnx export") from None


def _fix_inputs(model, input_shapes: Mapping[str, Sequence[int]] | None):
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {i.name for i in model.graph.initializer}
    given = dict(input_shapes or {})
    unknown = set(given) - {vi.name for vi in model.graph.input if vi.name not in inits}
    if unknown:
        raise InputError(f"input_shapes names unknown input(s) {', '.join(sorted(unknown))}",
                         hint="use the model's input names")
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        if vi.name in given:
            shape = tuple(given.pop(vi.name))
            if len(shape) != len(dims):
                raise InputError(f"input {vi.name!r}: shape {shape} has rank {len(shape)}, the model "
                                 f"expects rank {len(dims)}")
            for d, v in zip(dims, shape):
                d.Clear()
                d.dim_value = int(v)
        if any(not d.HasField("dim_value") or d.dim_value < 0 for d in dims):
            raise InputError(f"input {vi.name!r} has dynamic dimensions; the cost model needs "
                             f"fixed shapes", hint=f"pass input_shapes={{{vi.name!r}: (...)}}")
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _run_for_shapes(model, missing: set[str], shapes: dict, dtypes: dict) -> None:
    """Fill shapes that static inference could not resolve (data-dependent Reshape targets…) by
    running onnxruntime once on placeholder inputs with the missing tensors exposed as outputs."""
    import onnx
    import onnxruntime as ort

    m = onnx.ModelProto.FromString(model.SerializeToString())
    wanted = [n for node in m.graph.node for n in node.output if n in missing]
    for name in wanted:
        m.graph.output.append(onnx.ValueInfoProto(name=name))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        specs = [InputSpec(i.name, tuple(shapes[i.name]), np.dtype(dtypes[i.name])) for i in sess.get_inputs()]
        # placeholders: floats in [0, 1), everything else 0 (valid as any index)
        feeds = generate_inputs(specs, seed=0, shapes={s.name: s.shape for s in specs},
                                val_range={"": (0, 1), **{s.name: (0, 0) for s in specs if s.dtype.kind != "f"}})
        values = sess.run(wanted, feeds)
    except Exception as e:  # onnxruntime raises its own exception types
        raise ModelError(f"cost model: could not resolve the shapes of {len(wanted)} tensors "
                         f"(first: {wanted[0]!r}) by running the model once: "
                         f"{str(e).splitlines()[0][:200]}",
                         hint="fix the input shapes or simplify the model (onnxsim)") from None
    for name, v in zip(wanted, values):
        v = np.asarray(v)
        shapes[name] = tuple(v.shape)
        dtypes[name] = v.dtype


def _complete_types(m, *, only_kernels: bool) -> tuple[dict, dict]:
    shapes, dtypes = tensor_types(m)
    missing = {n for node in m.graph.node if not (only_kernels and node.op_type in VIEW_OPS)
               for n in list(node.input) + list(node.output)
               if n and (n not in shapes or any(d < 0 for d in shapes[n]) or n not in dtypes)}
    if missing:
        _run_for_shapes(m, missing, shapes, dtypes)
    return shapes, dtypes


def model_tensor_types(model, *, input_shapes: Mapping[str, Sequence[int]] | None = None
                       ) -> tuple[dict[str, tuple[int, ...]], dict[str, np.dtype]]:
    """Static shapes and dtypes of every tensor of an ONNX model (path or ModelProto) once its
    inputs are fixed: onnx shape inference first, then one onnxruntime run for what it leaves open.

    >>> import onnx.helper as h
    >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
    ...                  [h.make_tensor_value_info("x", 1, ["n", 4])],
    ...                  [h.make_tensor_value_info("y", 1, ["n", 4])])
    >>> shapes, dtypes = model_tensor_types(h.make_model(g), input_shapes={"x": (2, 4)})
    >>> shapes["y"], dtypes["y"].name
    ((2, 4), 'float32')
    """
    return _complete_types(_fix_inputs(_load(model), input_shapes), only_kernels=False)
