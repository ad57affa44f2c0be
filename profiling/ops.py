"""Measured device ops: one :class:`MeasuredOp` per device task of a capture, with its shapes.

Read from every layout ``profile analyze`` reads where shapes exist (kernel_details / op_summary CSV, the
msprof / torch_npu SQLite exports, timelines whose events carry shapes) through the same readers
(:mod:`npu_deploy.profiling.discover` picks the source, :mod:`npu_deploy.profiling.parse` streams it).
The SoC comes from ``NPU_INFO`` (SQLite exports), ``info.json*`` (msprof PROF folders) or
``profiler_info*.json`` (torch_npu) when the capture records it, else None.

Rows that cannot be used are counted, never dropped silently: communication tasks (not device compute),
durations that are not finite or are negative, rows the reader itself skipped.

>>> cap = read_measured_ops("cnn_level1_rank1_ascend_pt")                   # doctest: +SKIP
>>> cap.ops[0].type, cap.ops[0].in_shapes[0], cap.ops[0].duration_us      # doctest: +SKIP
('TransData', (32, 3, 224, 224), 53.841)
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from npu_deploy.errors import ProfileError
from npu_deploy.profiling import parse as P
from npu_deploy.profiling.discover import discover

#: engines as msprof names them (Accelerator Core / Task Type); MIX_* are cube+vector fused kernels
ENGINES = ("AI_CORE", "AI_VECTOR_CORE", "AI_CPU", "MIX_AIC", "MIX_AIV")
_COMM = frozenset({"COMMUNICATION", "HCCL", "HCCL_AI_CPU"})
_ENGINE_ALIASES = {"AI_CORE": "AI_CORE", "AICORE": "AI_CORE", "AI_VECTOR_CORE": "AI_VECTOR_CORE",
                   "AIV": "AI_VECTOR_CORE", "AI_CPU": "AI_CPU", "AICPU": "AI_CPU", "MIX_AIC": "MIX_AIC",
                   "MIX_AIV": "MIX_AIV"}
#: sources that can carry shapes (op_statistic and MindSpore 1.x aggregate tables cannot)
_SHAPED_KINDS = frozenset({"kernel_details", "op_summary", "op_summary_device", "db", "timeline", "csv"})
_BLOCK_DIM = {"block_dim": ("Block Dim", "Block Num", "block_dim")}
_SOC_NAME = re.compile(r"^Ascend\d{3}[A-Za-z0-9_]*$")


@dataclass(frozen=True)
class MeasuredOp:
    """One device task as the profiler measured it (shapes as stored on the device, e.g. NC1HWC0 5-D)."""

    name: str
    type: str
    engine: str                      # AI_CORE / AI_VECTOR_CORE / AI_CPU / MIX_AIC / MIX_AIV / other text
    in_shapes: tuple                 # one tuple of dims per input slot; None for an unreadable slot
    out_shapes: tuple
    in_dtypes: tuple                 # msprof spelling without the DT_ prefix: FLOAT, FLOAT16, BF16, INT64 ...
    out_dtypes: tuple
    in_formats: tuple                # normalised (no FORMAT_ prefix, no :N sub-format)
    out_formats: tuple
    duration_us: float
    block_dim: int | None = None
    soc: str | None = None
    capture: str = ""

    @property
    def has_shapes(self) -> bool:
        return bool(self.in_shapes or self.out_shapes)


@dataclass
class MeasuredCapture:
    """The measured ops of one capture and what was left out (counts per reason)."""

    path: str
    label: str
    soc: str | None
    level: str | None                # profiler level when recorded (Level0 / Level1 / Level2)
    source: str                      # which file kind was read
    ops: list[MeasuredOp] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def has_shapes(self) -> bool:
        return any(o.has_shapes for o in self.ops)


def _dtype(text: str | None) -> str | None:
    if text is None:
        return None
    t = text.strip().upper()
    return t[3:] if t.startswith("DT_") else t


def _engine(core: str | None) -> str:
    c = (core or "").strip().upper()
    return _ENGINE_ALIASES.get(c, c or "UNKNOWN")


def _read_json(path: Path) -> dict | None:
    try:
        if path.stat().st_size > (4 << 20):
            return None
        d = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _find_soc(obj, depth: int = 0) -> str | None:
    """An ``Ascend...`` chip name under a key that names the chip (soc / chip / npu / device)."""
    if depth > 6:
        return None
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = str(k).lower()
            if isinstance(v, str) and any(w in key for w in ("soc", "chip", "npu", "device_type")):
                if _SOC_NAME.match(v.strip()):
                    return v.strip()
            hit = _find_soc(v, depth + 1) if isinstance(v, (dict, list)) else None
            if hit:
                return hit
    elif isinstance(obj, list):
        for v in obj[:64]:
            hit = _find_soc(v, depth + 1)
            if hit:
                return hit
    return None


def _db_soc(path: Path) -> str | None:
    try:
        uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro&immutable=1"
        con = sqlite3.connect(uri, uri=True)
        try:
            names = [r[0] for r in con.execute("SELECT name FROM NPU_INFO LIMIT 64")]
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return None
    names = [str(n) for n in names if n and _SOC_NAME.match(str(n))]
    return names[0] if names else None


def _level_and_soc(root: Path, files: list[Path]) -> tuple[str | None, str | None]:
    level = soc = None
    candidates: list[Path] = []
    for base in {root, *(p.parent for p in files), *(p.parent.parent for p in files)}:
        try:
            candidates += sorted(base.glob("profiler_info*.json")) + sorted(base.glob("info.json*"))
            candidates += sorted(base.glob("device_*/info.json*"))
        except OSError:
            continue
    for c in candidates:
        d = _read_json(c)
        if d is None:
            continue
        if level is None:
            exp = (d.get("config") or {}).get("experimental_config") if isinstance(d.get("config"), dict) else None
            if isinstance(exp, dict) and isinstance(exp.get("_profiler_level"), str):
                level = exp["_profiler_level"]
        if soc is None:
            soc = _find_soc(d)
    for f in files:
        if soc is None and P.is_sqlite(f):
            soc = _db_soc(f)
    return level, soc


def _tuple(xs) -> tuple:
    return tuple(xs)


def read_measured_ops(path: str | os.PathLike) -> list[MeasuredCapture]:
    """Every capture under ``path`` (a folder or one file) as measured ops with shapes, dtypes, formats.

    Raises ``ProfileError`` when nothing readable is there (from discovery) or a file cannot be read.
    """
    disc = discover(path)
    out: list[MeasuredCapture] = []
    for cap in disc.captures:
        src = cap.used
        if src is None:
            continue
        try:
            rel = cap.root.relative_to(disc.path).as_posix() if cap.root != disc.path else cap.root.name
        except ValueError:
            rel = cap.root.name
        level, soc = _level_and_soc(cap.root if cap.root.is_dir() else cap.root.parent, src.paths)
        mc = MeasuredCapture(str(cap.root), rel or cap.root.name, soc, level, src.kind)
        out.append(mc)
        if src.kind not in _SHAPED_KINDS:
            mc.warnings.append(f"{mc.label}: {src.kind} has no per-op shapes")
            continue
        for p in src.paths:
            try:
                stream = P.open_table(p, src.reader_kind)
            except OSError as e:
                raise ProfileError(f"cannot read ({e.strerror})", path=str(p)) from e
            if stream.kind == "stats":
                continue
            _feed(mc, stream)
            mc.warnings += stream.warnings()
    return out


def _feed(mc: MeasuredCapture, stream: P.TableStream) -> None:
    bd_col = None
    header = getattr(stream, "header", None)
    if header is not None:
        bd_col = P._resolve(header, _BLOCK_DIM).get("block_dim")
        if bd_col is not None:
            bd_col = stream.keep_column(bd_col)     # records hold only the columns asked for
    i = stream.indices
    skipped = mc.skipped
    for row in stream:
        core = P.clean(row[i[P.F_CORE]])
        eng = _engine(core)
        name = P.clean(row[i[P.F_NAME]]) or ""
        if eng in _COMM or name.lower().startswith("hcom_"):
            skipped["communication"] = skipped.get("communication", 0) + 1
            continue
        try:
            dur = float(P.clean(row[i[P.F_DUR]]) or "nan")
        except ValueError:
            dur = math.nan
        if not math.isfinite(dur) or dur < 0:
            skipped["non-finite or negative duration"] = skipped.get("non-finite or negative duration", 0) + 1
            continue
        op = P.clean(row[i[P.F_TYPE]]) or P.op_type_from_name(name) or "unknown"
        bd = None
        if bd_col is not None and bd_col < len(row):
            try:
                bd = int(float(P.clean(row[bd_col]) or "x"))
            except ValueError:
                bd = None
        mc.ops.append(MeasuredOp(
            name=name, type=op, engine=eng,
            in_shapes=_tuple(P.parse_shapes(row[i[P.F_IN_SHAPE]])),
            out_shapes=_tuple(P.parse_shapes(row[i[P.F_OUT_SHAPE]])),
            in_dtypes=_tuple(_dtype(t) for t in P.split_list(row[i[P.F_IN_DTYPE]])),
            out_dtypes=_tuple(_dtype(t) for t in P.split_list(row[i[P.F_OUT_DTYPE]])),
            in_formats=_tuple(P.split_formats(row[i[P.F_IN_FMT]])),
            out_formats=_tuple(P.split_formats(row[i[P.F_OUT_FMT]])),
            duration_us=dur, block_dim=bd, soc=mc.soc, capture=mc.label))


# ---------------------------------------------------------------------------------------------------
# A capture against our plan of the same model (`profile analyze CAPTURE --plan model.bundle`)

def _logical(shape: tuple | None, fmt: str | None, other: tuple | None, other_fmt: str | None) -> tuple | None:
    """The plain-layout (NCHW / ND) side of a TransData: its shape is the tensor's logical shape."""
    if fmt in ("NCHW", "ND", "NHWC", "NCDHW") and shape:
        return tuple(shape)
    if other_fmt in ("NCHW", "ND", "NHWC", "NCDHW") and other:
        return tuple(other)
    return None


@dataclass
class PlanMatch:
    src_format: str
    dst_format: str
    shape: tuple
    planned: int
    measured: int
    planned_est_us: float | None      # the plan's estimate for one
    measured_mean_us: float | None


@dataclass
class PlanComparison:
    """Planned vs measured TransData (by formats and logical shape) and the ops whose estimate was
    furthest from the measurement (matched by node name, as ATC keeps the ONNX node names)."""

    soc: str | None
    transdata: list[PlanMatch]
    furthest: list[tuple[str, str, float, float]]   # (name, type, estimated µs, measured mean µs)

    def lines(self, top: int = 10) -> list[str]:
        out = [f"plan vs capture ({self.soc or 'SoC not recorded'}): TransData by formats and shape"]
        out.append(f"  {'conversion':<24}{'shape':<22}{'planned':>8}{'measured':>9}{'est µs':>9}{'meas µs':>9}")
        for m in self.transdata[:top * 2]:
            est = "-" if m.planned_est_us is None else f"{m.planned_est_us:.1f}"
            meas = "-" if m.measured_mean_us is None else f"{m.measured_mean_us:.1f}"
            out.append(f"  {m.src_format + '->' + m.dst_format:<24}{'x'.join(map(str, m.shape)):<22}"
                       f"{m.planned:>8}{m.measured:>9}{est:>9}{meas:>9}")
        planned = sum(m.planned for m in self.transdata)
        measured = sum(m.measured for m in self.transdata)
        both = sum(min(m.planned, m.measured) for m in self.transdata)
        out.append(f"  {planned} planned, {measured} measured, {both} matched")
        if self.furthest:
            out.append("ops whose estimate was furthest from the measurement:")
            for name, typ, est, meas in self.furthest[:top]:
                out.append(f"  {name} ({typ}): estimated {est:.1f} µs, measured {meas:.1f} µs "
                           f"({100 * (est - meas) / meas:+.0f} %)")
        elif self.transdata:
            out.append("no op of the plan has the name of a measured op (the capture is of another graph?)")
        return out


def compare_with_plan(captures: list[MeasuredCapture], manifest: dict) -> PlanComparison:
    """Match a bundle manifest's planned TransData and per-node estimates against measured ops."""
    planned: dict[tuple, list[float | None]] = {}
    for td in manifest.get("transdata") or []:
        key = (str(td.get("src_format")), str(td.get("dst_format")), tuple(td.get("shape") or ()))
        planned.setdefault(key, []).append(td.get("est_us"))
    measured: dict[tuple, list[float]] = {}
    by_name: dict[str, list[MeasuredOp]] = {}
    for c in captures:
        for o in c.ops:
            by_name.setdefault(o.name, []).append(o)
            if o.type not in ("TransData", "TransDataRNN") or not o.in_formats or not o.out_formats:
                continue
            src, dst = o.in_formats[0] or "", o.out_formats[0] or ""
            shp = _logical(o.in_shapes[0] if o.in_shapes else None, src,
                           o.out_shapes[0] if o.out_shapes else None, dst)
            if shp is not None:
                measured.setdefault((src, dst, shp), []).append(o.duration_us)
    rows = []
    for key in sorted(set(planned) | set(measured), key=lambda k: (-len(measured.get(k, [])), k)):
        ests = [e for e in planned.get(key, []) if isinstance(e, (int, float))]
        ms = measured.get(key, [])
        rows.append(PlanMatch(key[0], key[1], key[2], len(planned.get(key, [])), len(ms),
                              sum(ests) / len(ests) if ests else None, sum(ms) / len(ms) if ms else None))
    est = (manifest.get("cost") or {}).get("est_us") or {}
    furthest = []
    for name, e in est.items():
        ops = by_name.get(name)
        if not ops or not isinstance(e, (int, float)) or e <= 0:
            continue
        m = sum(o.duration_us for o in ops) / len(ops)
        if m > 0:
            furthest.append((name, ops[0].type, float(e), m))
    furthest.sort(key=lambda t: -abs(math.log(t[2] / t[3])))
    soc = next((c.soc for c in captures if c.soc), None) or manifest.get("soc")
    return PlanComparison(soc, rows, furthest)
