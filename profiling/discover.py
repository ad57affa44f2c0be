"""Find the profiler output under one path and choose what to read (msprof.md §1 and §9.1).

Accepted: a ``PROF_*`` folder (CANN ≤ 7.0 ``device_N/summary/`` or newer ``mindstudio_profiler_output/``,
``_slice_N_`` files included), a torch_npu / MindSpore ``*_ascend_pt`` / ``*_ascend_ms`` folder
(``ASCEND_PROFILER_OUTPUT/``), a parent folder holding several of these (devices, ranks), an SQLite export,
or a single CSV / JSON file.

Each *capture* (one ``*_ascend_pt|ms`` folder, else one ``PROF_*`` folder, else one plain folder) is read
from exactly one source, the richest available, in this order: ``kernel_details.csv`` → merged
``mindstudio_profiler_output/op_summary_*.csv`` (all slices) → per-device ``summary/op_summary_*.csv`` →
SQLite export → timeline JSON → ``op_statistic`` (totals only). Other copies of the same data are listed
as found-but-not-used, so two copies are never mixed. An ``op_statistic`` beside a per-task source is
kept as a cross-check.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp()) / "PROF_000001_20230628101435646_FKFLNPEPPRRCFCBA"
>>> (root / "device_0" / "summary").mkdir(parents=True)
>>> _ = (root / "device_0" / "summary" / "op_summary_0_1_20240603052618.csv").write_text("Op Name,Task Duration(us)\\n")
>>> d = discover(root)
>>> [(s.kind, s.paths[0].name) for s in d.used]
[('op_summary_device', 'op_summary_0_1_20240603052618.csv')]
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from npu_deploy.errors import ProfileError
from npu_deploy.profiling.parse import is_sqlite, sniff_csv

_PROF_DIR = re.compile(r"^PROF_\d+_\d+_[0-9a-zA-Z]+")
_FRAMEWORK_DIR = re.compile(r".+_ascend_(pt|ms)$")
_OP_SUMMARY = re.compile(r"^op_summary_(slice_\d+_)?[_\d]*\d\.csv$|^op_summary\.csv$")
_OP_SUMMARY_SLICE = re.compile(r"^op_summary_slice_(\d+)_")
_OP_STATISTIC = re.compile(r"^op_statistic(_[_\d]*\d)?\.csv$")
_MSPROF_JSON = re.compile(r"^msprof_(slice_\d+_)?\d+.*\.json$")
_DB = re.compile(r"^(msprof_\d+|ascend_pytorch_profiler(_\d+)?|ascend_mindspore_profiler(_\d+)?)\.db$")
_TS = re.compile(r"(\d{14})\.csv$")

#: source kinds, richest first
PRIORITY = ("kernel_details", "op_summary", "op_summary_device", "db", "timeline", "op_statistic")
DESCRIPTIONS = {
    "kernel_details": "torch_npu/MindSpore kernel_details.csv",
    "op_summary": "msprof op_summary (mindstudio_profiler_output)",
    "op_summary_device": "msprof op_summary (device_N/summary)",
    "db": "SQLite export (TASK ⨝ COMPUTE_TASK_INFO)",
    "timeline": "timeline JSON (classified by kernel name)",
    "op_statistic": "op_statistic (per-op-type totals only)",
    "csv": "op table CSV",
}
_MAX_FILES = 200_000


@dataclass
class Source:
    """One readable source of one capture: its kind and its files (several for slices / devices)."""

    kind: str
    paths: list[Path]
    capture: Path

    def describe(self) -> str:
        names = ", ".join(p.name for p in self.paths[:4]) + (" …" if len(self.paths) > 4 else "")
        return f"{DESCRIPTIONS.get(self.kind, self.kind)}: {names}"

    @property
    def reader_kind(self) -> str:
        return {"db": "db", "timeline": "trace", "op_statistic": "stats"}.get(self.kind, "csv")


@dataclass
class Capture:
    """One profiling capture (a framework folder, a PROF folder, or a plain folder)."""

    root: Path
    sources: dict[str, Source] = field(default_factory=dict)
    used: Source | None = None
    cross_check: Source | None = None
    unused: list[Source] = field(default_factory=list)


@dataclass
class Discovery:
    """What was found under a path, and what will be used."""

    path: Path
    captures: list[Capture]
    notes: list[str] = field(default_factory=list)

    @property
    def used(self) -> list[Source]:
        return [c.used for c in self.captures if c.used is not None]

    def describe(self) -> list[str]:
        """Human-readable lines: per capture, the source used and the copies left aside."""
        lines = []
        for c in self.captures:
            where = _rel(c.root, self.path)
            if c.used is not None:
                lines.append(f"{where}: using {c.used.describe()}")
            if c.cross_check is not None:
                lines.append(f"{where}: cross-check {c.cross_check.describe()}")
            for s in c.unused:
                lines.append(f"{where}: also found {s.describe()} (not used: same data)")
        return lines + self.notes

    def to_dict(self) -> dict:
        def src(s: Source | None):
            if s is None:
                return None
            return {"kind": s.kind, "files": [str(p) for p in s.paths]}
        return {"path": str(self.path),
                "captures": [{"root": str(c.root), "used": src(c.used), "cross_check": src(c.cross_check),
                              "not_used": [src(s) for s in c.unused]} for c in self.captures],
                "notes": list(self.notes)}


def _rel(p: Path, base: Path) -> str:
    try:
        r = p.relative_to(base)
        return str(r) if str(r) != "." else p.name
    except ValueError:
        return str(p)


def _capture_root(f: Path, top: Path) -> Path:
    """The capture a file belongs to: nearest framework folder, else nearest PROF folder, else its folder."""
    prof = None
    for parent in f.parents:
        if _FRAMEWORK_DIR.match(parent.name):
            return parent
        if prof is None and _PROF_DIR.match(parent.name):
            prof = parent
        if parent == top:
            break
    if prof is not None:
        return prof
    d = f.parent
    if d.name in ("ASCEND_PROFILER_OUTPUT", "mindstudio_profiler_output", "summary", "timeline") and d != top:
        return d.parent
    return d


def _classify(f: Path) -> str | None:
    n = f.name
    parent = f.parent.name
    if n == "kernel_details.csv":
        return "kernel_details"
    if n.startswith("kernel_details") and n.endswith(".csv"):
        return "kernel_details_copy"
    if _OP_SUMMARY.match(n):
        return "op_summary_device" if parent == "summary" else "op_summary"
    if _OP_STATISTIC.match(n):
        return None if parent == "summary" else "op_statistic"
    if _DB.match(n):
        return "db"
    if n == "trace_view.json" or _MSPROF_JSON.match(n):
        return "timeline"
    return None


def _latest_export(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """msprof may leave several exports of the same op_summary (re-runs of the export): keep the latest
    timestamp, with all its slices. Returns (kept, dropped)."""
    by_ts: dict[str, list[Path]] = {}
    for p in paths:
        m = _TS.search(p.name)
        by_ts.setdefault(m.group(1) if m else "", []).append(p)
    if len(by_ts) <= 1:
        return _slice_order(paths), []
    latest = max(by_ts)
    kept = by_ts.pop(latest)
    return _slice_order(kept), sorted(p for ps in by_ts.values() for p in ps)


def _slice_order(paths: list[Path]) -> list[Path]:
    def key(p: Path):
        m = _OP_SUMMARY_SLICE.match(p.name)
        return (p.parent.as_posix(), int(m.group(1)) if m else -1, p.name)
    return sorted(paths, key=key)


def discover(path: str | os.PathLike) -> Discovery:
    """Find profiler output under ``path`` and decide what to read. Raises ``ProfileError`` when there is
    nothing recognisable, naming what was looked for."""
    top = Path(path)
    if not top.exists():
        raise ProfileError("no such file or folder", path=str(top),
                           hint="give a PROF_* or *_ascend_pt folder, or an op_summary/kernel_details file")
    if top.is_file():
        return _discover_file(top)
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in ("data", "sqlite", "FRAMEWORK", "__pycache__"))
        for n in filenames:
            if n.endswith((".csv", ".db", ".json")):
                files.append(Path(dirpath) / n)
        if len(files) > _MAX_FILES:
            raise ProfileError(f"more than {_MAX_FILES} candidate files under this folder", path=str(top),
                               hint="point at one capture or a folder of captures")
    captures: dict[Path, Capture] = {}
    for f in sorted(files):
        kind = _classify(f)
        if kind is None:
            continue
        root = _capture_root(f, top)
        if kind == "kernel_details_copy":
            # a renamed copy (kernel_details_<x>.csv) is a capture of its own, not a second source
            kind, root = "kernel_details", f
        cap = captures.setdefault(root, Capture(root))
        src = cap.sources.get(kind)
        if src is None:
            cap.sources[kind] = Source(kind, [f], root)
        else:
            src.paths.append(f)
    if not captures:
        raise ProfileError(
            "no profiler output found (looked for ASCEND_PROFILER_OUTPUT/kernel_details.csv, "
            "op_summary_*.csv, op_statistic_*.csv, msprof_*.db / ascend_pytorch_profiler*.db, "
            "trace_view.json / msprof_*.json)", path=str(top),
            hint="point at a PROF_* or *_ascend_pt folder, or at one of those files")
    disc = Discovery(top, [])
    for root in sorted(captures):
        cap = captures[root]
        _choose(cap, disc)
        disc.captures.append(cap)
    if not disc.used:
        raise ProfileError("profiler files found but none usable", path=str(top))
    return disc


def _choose(cap: Capture, disc: Discovery) -> None:
    for kind in ("op_summary", "op_summary_device"):
        src = cap.sources.get(kind)
        if src is not None:
            kept, dropped = _latest_export(src.paths) if kind == "op_summary" else (_slice_order(src.paths), [])
            src.paths = kept
            if dropped:
                disc.notes.append(f"{_rel(cap.root, disc.path)}: {len(dropped)} older op_summary export(s) "
                                  f"not used ({', '.join(p.name for p in dropped[:3])})")
    tl = cap.sources.get("timeline")
    if tl is not None:
        # the merged timeline (ASCEND_PROFILER_OUTPUT, mindstudio_profiler_output, PROF_*/timeline) holds
        # the per-device ones again: keep the most merged level only.
        def level(p: Path) -> int:
            if p.parent.name in ("ASCEND_PROFILER_OUTPUT", "mindstudio_profiler_output"):
                return 0
            return 2 if p.parent.parent.name.startswith("device_") else 1
        best = min(level(p) for p in tl.paths)
        dropped = [p for p in tl.paths if level(p) != best]
        tl.paths = [p for p in tl.paths if level(p) == best]
        if dropped:
            cap.unused.append(Source("timeline", dropped, cap.root))
    for kind in PRIORITY:
        src = cap.sources.get(kind)
        if src is None:
            continue
        if cap.used is None:
            cap.used = src
        elif kind == "op_statistic":
            cap.cross_check = src
        else:
            cap.unused.append(src)


def _discover_file(f: Path) -> Discovery:
    if is_sqlite(f):
        kind = "db"
    elif f.suffix.lower() == ".json":
        kind = "timeline"
    else:
        sniff = sniff_csv(f)
        if sniff is None:
            raise ProfileError(
                "not a recognisable profiler table (looked for an op table with 'Op Name'/'Name' and "
                "'Task Duration(us)'/'Duration(us)' columns, or op_statistic with 'OP Type' and "
                "'Total Time(us)')", path=str(f),
                hint="give op_summary_*.csv, kernel_details.csv, op_statistic*.csv, a .db or a timeline .json")
        kind = "op_statistic" if sniff == "stats" else (
            "kernel_details" if f.name == "kernel_details.csv" else "csv")
    src = Source(kind, [f], f.parent)
    return Discovery(f, [Capture(f.parent, {kind: src}, used=src)])
