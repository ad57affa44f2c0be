"""Find the profiler output under one path and choose what to read (msprof.md §1 and §9.1).

Accepted: a MindSpore 1.x profiler folder (``aicore_intermediate_*``, ``timeline_display_*``), a ``PROF_*`` folder (CANN ≤ 7.0 ``device_N/summary/`` or newer ``mindstudio_profiler_output/``,
``_slice_N_`` files included), a torch_npu / MindSpore ``*_ascend_pt`` / ``*_ascend_ms`` folder
(``ASCEND_PROFILER_OUTPUT/``), a parent folder holding several of these (devices, ranks), an SQLite export,
or a single CSV / JSON file.

Each *capture* (one ``*_ascend_pt|ms`` folder, else one ``PROF_*`` folder, else one plain folder) is read
from exactly one source, the richest available, in this order: ``kernel_details.csv`` → merged
``mindstudio_profiler_output/op_summary_*.csv`` (all slices) → per-device ``summary/op_summary_*.csv`` →
SQLite export → timeline JSON → MindSpore 1.x ``aicore_intermediate_{dev}_type.csv`` (all devices; totals
per op type) → ``op_statistic`` (totals only) → MindSpore 1.x ``aicore_intermediate_{dev}_detail.csv`` →
MindSpore 1.x ``timeline_display_{dev}.json``. The other sources of a capture are listed
as found-but-not-used, with the reason: "same data as X" when their rows were checked to be the same
tasks, "holds other tasks than X" or "overlaps X" when not (never mixed in either case), "X is preferred"
when they are not compared (timelines, op_statistic). An ``op_statistic`` beside a per-task source is
kept as a cross-check.

Two captures can also hold the same data (a ``kernel_details.csv`` beside the ``op_summary`` it was made
from, a capture copied into two folders): the sources chosen are fingerprinted (:func:`fingerprint`: the
first tasks (name, start, duration), then the number of records and the last tasks) and,
when two match, only the richer one is used (more of the canonical columns, then the order above); the
other is listed as "not used: same data as X". A capture read from ``op_statistic`` alone whose
per-op-type counts and totals are those of another capture's task table is that table's summary: not
used, kept as its cross-check. Captures whose rows differ (ranks, devices, runs) are all used.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp()) / "PROF_000001_20230628101435646_FKFLNPEPPRRCFCBA"
>>> (root / "device_0" / "summary").mkdir(parents=True)
>>> _ = (root / "device_0" / "summary" / "op_summary_0_1_20240603052618.csv").write_text("Op Name,Task Duration(us)\\n")
>>> d = discover(root)
>>> [(s.kind, s.paths[0].name) for s in d.used]
[('op_summary_device', 'op_summary_0_1_20240603052618.csv')]
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from npu_deploy.errors import ProfileError
from npu_deploy.profiling import parse as P
from npu_deploy.profiling.parse import is_sqlite, sniff_csv

_PROF_DIR = re.compile(r"^PROF_\d+_\d+_[0-9a-zA-Z]+")
_FRAMEWORK_DIR = re.compile(r".+_ascend_(pt|ms)$")
_OP_SUMMARY = re.compile(r"^op_summary_(slice_\d+_)?[_\d]*\d\.csv$|^op_summary\.csv$")
_OP_SUMMARY_SLICE = re.compile(r"^op_summary_slice_(\d+)_")
_OP_STATISTIC = re.compile(r"^op_statistic(_[_\d]*\d)?\.csv$")
_MSPROF_JSON = re.compile(r"^msprof_(slice_\d+_)?\d+.*\.json$")
_DB = re.compile(r"^(msprof_\d+|ascend_pytorch_profiler(_\d+)?|ascend_mindspore_profiler(_\d+)?)\.db$")
_TS = re.compile(r"(\d{14})\.csv$")
_MS_TYPE = re.compile(r"^aicore_intermediate_\d+_type\.csv$")
_MS_DETAIL = re.compile(r"^aicore_intermediate_\d+_detail\.csv$")
_MS_TIMELINE = re.compile(r"^timeline_display_\d+\.json$")

#: source kinds, richest first
PRIORITY = ("kernel_details", "op_summary", "op_summary_device", "db", "timeline", "ms_aicore_type",
            "op_statistic", "ms_aicore_detail", "ms_timeline")
DESCRIPTIONS = {
    "kernel_details": "torch_npu/MindSpore kernel_details.csv",
    "op_summary": "msprof op_summary (mindstudio_profiler_output)",
    "op_summary_device": "msprof op_summary (device_N/summary)",
    "db": "SQLite export (TASK ⨝ COMPUTE_TASK_INFO)",
    "timeline": "timeline JSON (classified by kernel name)",
    "op_statistic": "op_statistic (per-op-type totals only)",
    "ms_aicore_type": "MindSpore 1.x aicore_intermediate type table (AI Core time per op type)",
    "ms_aicore_detail": "MindSpore 1.x aicore_intermediate detail table (AI Core time per op)",
    "ms_timeline": "MindSpore 1.x timeline_display (classified by kernel name)",
    "csv": "op table CSV",
}
_MAX_FILES = 200_000
#: sources without per-task rows (no fingerprint), and sources never compared row by row with another
_NOT_PER_TASK = frozenset({"op_statistic", "ms_aicore_type", "ms_timeline"})
_NOT_COMPARED = frozenset({"timeline", "op_statistic", "ms_aicore_type", "ms_aicore_detail", "ms_timeline"})


@dataclass
class Source:
    """One readable source of one capture: its kind and its files (several for slices / devices)."""

    kind: str
    paths: list[Path]
    capture: Path
    #: why a source is not used ("same data as X", "X is preferred", …); None for a used source
    reason: str | None = None
    #: the file of the used source this one duplicates, when checked
    same_as: Path | None = None

    def describe(self) -> str:
        names = ", ".join(p.name for p in self.paths[:4]) + (" …" if len(self.paths) > 4 else "")
        return f"{DESCRIPTIONS.get(self.kind, self.kind)}: {names}"

    @property
    def reader_kind(self) -> str:
        return {"db": "db", "timeline": "trace", "op_statistic": "stats", "ms_aicore_type": "ms_type",
                "ms_aicore_detail": "ms_detail", "ms_timeline": "ms_trace"}.get(self.kind, "csv")


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
                lines.append(f"{where}: also found {s.describe()} (not used: {s.reason or 'a richer source is used'})")
        return lines + self.notes

    def to_dict(self) -> dict:
        def src(s: Source | None):
            if s is None:
                return None
            d = {"kind": s.kind, "files": [str(p) for p in s.paths]}
            if s.reason is not None:
                d["reason"] = s.reason
                d["same_as"] = str(s.same_as) if s.same_as is not None else None
            return d
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
    if _MS_TYPE.match(n):
        return "ms_aicore_type"
    if _MS_DETAIL.match(n):
        return "ms_aicore_detail"
    if _MS_TIMELINE.match(n):
        return "ms_timeline"
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
        # raw binary data of a PROF folder (device_N/data, host/data) is not read; MindSpore 1.x's
        # default output folder is also called data (./data/profiler), so only skip it there
        raw = Path(dirpath).name.startswith(("device_", "host")) or _PROF_DIR.match(Path(dirpath).name)
        dirnames[:] = sorted(d for d in dirnames if d not in ("sqlite", "FRAMEWORK", "__pycache__")
                             and not (d == "data" and raw))
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
    _drop_copies(disc)
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
            cap.unused.append(Source("timeline", dropped, cap.root,
                                     reason="per-device timelines, merged in " + tl.paths[0].name))
    for kind in PRIORITY:
        src = cap.sources.get(kind)
        if src is None:
            continue
        if cap.used is None:
            cap.used = src
        elif kind == "op_statistic" and cap.used.kind != "ms_aicore_type":
            cap.cross_check = src
        else:
            cap.unused.append(src)


def _discover_file(f: Path) -> Discovery:
    if is_sqlite(f):
        kind = "db"
    elif _classify(f) in ("ms_aicore_type", "ms_aicore_detail", "ms_timeline"):
        kind = _classify(f)
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


# ---------------------------------------------------------------------------------------------------
# Copies of the same data (fingerprints)

_FP_N = 8                          # tasks compared at the head and at the tail
_FP_LABEL_MAX_BYTES = 64 << 20     # above this, an unused source is compared on its first tasks only
_FP_COMM_CORES = frozenset({"COMMUNICATION", "HCCL", "HCCL_AI_CPU"})


@dataclass
class Fingerprint:
    """What identifies the rows of a source, cheaply: its first compute tasks, and (``full``, only when the
    first tasks match another source's) its number of records and its last compute tasks. Tasks are
    (kernel name, start µs, duration µs); communication is left out of the tasks (the SQLite export lists
    it apart, after the compute tasks) but counted in the records."""

    head: list
    rich: tuple
    rows: int | None = None
    tail: list | None = None


def _task(row, i_name, i_type, i_core, i_dur, i_start):
    """(name, start, duration) of a compute record, None for communication or an unusable duration."""
    try:
        d = float(row[i_dur])
    except (TypeError, ValueError):
        return None
    if not (0.0 <= d < 1e12):
        return None
    name = P.clean(row[i_name])
    op = P.clean(row[i_type]) or ""
    if P.clean(row[i_core]) in _FP_COMM_CORES or (name or "").startswith("hcom_") or op.lower().startswith("hcom_"):
        return None
    try:
        t = float(P.clean(row[i_start]) or "nan")
    except ValueError:
        t = float("nan")
    return name, t, d


def _fp_rows(src: Source):
    """Yield (record, task or None) of every record of ``src``, in file order."""
    for path in src.paths:
        stream = P.open_table(path, src.reader_kind)
        i = stream.indices
        cols = (i[P.F_NAME], i[P.F_TYPE], i[P.F_CORE], i[P.F_DUR], i[P.F_START])
        for row in stream:
            yield row, _task(row, *cols)


def _csv_rows_and_tail(path: Path) -> tuple[int, list]:
    """Records of a CSV op table and its last compute tasks, without parsing it: the records are its
    non-empty lines after the header (msprof and torch_npu write no line breaks inside cells), the tail
    is parsed from the last block of the file."""
    stream = P.CsvOpStream(path)
    i = stream.header_indices                   # the rows below are whole csv rows, not stream records
    cols = (i[P.F_NAME], i[P.F_TYPE], i[P.F_CORE], i[P.F_DUR], i[P.F_START])
    lines = 0
    last = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                break
            lines += chunk.count(b"\n") - chunk.count(b"\n\n") - chunk.count(b"\n\r\n")
            last = chunk
        if last and not last.endswith(b"\n"):
            lines += 1
        size = f.tell()
        block = 1 << 16
        while True:
            f.seek(max(0, size - block))
            data = f.read()
            text = data.decode("utf-8", errors="replace")
            if size > block:
                text = text.split("\n", 1)[-1]          # the first line of the block may be cut
            tail = []
            for row in csv.reader(io.StringIO(text, newline="")):
                if len(row) == stream.ncols:
                    row.append("")
                    t = _task(row, *cols)
                    if t is not None:
                        tail.append(t)
            if len(tail) >= _FP_N or size <= block:
                break
            block *= 4
    return max(0, lines - 1), tail[-_FP_N:]


def _richness(src: Source) -> tuple:
    """More of the canonical columns first, then the discovery order (kernel_details first)."""
    try:
        stream = P.open_table(src.paths[0], src.reader_kind)
    except (ProfileError, OSError):
        return (0, 0, 0, 0, -len(PRIORITY))
    if isinstance(stream, P.DbOpStream):   # the canonical fields its query can fill
        fields = 2 + sum(c in stream.cti_cols for c in (
            "name", "opType", "taskType", "inputFormats", "outputFormats", "inputShapes", "outputShapes",
            "inputDataTypes", "outputDataTypes")) + sum(c in stream.task_cols for c in ("deviceId", "streamId"))
    else:
        fields = len(getattr(stream, "cols", None) or ())
    header = len(getattr(stream, "header", None) or ())
    order = PRIORITY.index(src.kind) if src.kind in PRIORITY else len(PRIORITY)
    return (int(stream.has_formats), int(stream.has_op_type), fields, header, -order)


def fingerprint(src: Source, full: bool = False) -> Fingerprint | None:
    """The fingerprint of a per-task source (None for op_statistic, an unreadable file or no tasks).
    ``full`` adds the number of records and the last tasks: for CSV files from a count of lines and the
    end of the last file, otherwise from a pass over the rows."""
    if src.kind in _NOT_PER_TASK:
        return None
    try:
        it = _fp_rows(src)
        head = []
        for _row, t in it:
            if t is not None:
                head.append(t)
                if len(head) == _FP_N:
                    break
        if not head:
            return None
        fp = Fingerprint(head, _richness(src))
        if full and src.reader_kind == "csv":
            it.close()
            rows = 0
            for path in src.paths:
                n, tail = _csv_rows_and_tail(path)
                rows += n
            fp.rows, fp.tail = rows, tail
        elif full:
            it.close()
            rows = 0
            tail = deque(maxlen=_FP_N)
            for _row, t in _fp_rows(src):
                rows += 1
                if t is not None:
                    tail.append(t)
            fp.rows, fp.tail = rows, list(tail)
        it.close()
        return fp
    except (ProfileError, OSError, ValueError, csv.Error):
        return None


def _same_task(a: tuple, b: tuple) -> bool:
    """Two tasks are the same when the names match and times agree to the precision of the exports
    (CSV files write µs with 3 decimals or fewer, the SQLite export ns)."""
    if a[0] != b[0]:
        return False
    if abs(a[2] - b[2]) > max(0.01, 1e-4 * max(a[2], b[2])):
        return False
    ta, tb = a[1], b[1]
    if ta != ta or tb != tb:
        return ta != ta and tb != tb
    return abs(ta - tb) <= 1.0


def _same_tasks(xs: list, ys: list) -> bool:
    """The same tasks, over the shorter of the two lists (a source with fewer than _FP_N tasks)."""
    return bool(xs) and bool(ys) and all(_same_task(a, b) for a, b in zip(xs, ys))


def same_data(a: Fingerprint, b: Fingerprint) -> bool | None:
    """True: same tasks; None: the same first tasks but not the same rows (an overlapping copy);
    False: different data. Needs full fingerprints for True/None."""
    if not _same_tasks(a.head, b.head):
        return False
    if a.rows is None or b.rows is None:
        return True
    if a.rows == b.rows and len(a.tail) == len(b.tail) and _same_tasks(a.tail, b.tail):
        return True
    return None


def _overlap(a: Fingerprint | None, b: Fingerprint | None) -> str:
    """How two sources with the same first tasks differ (``a`` the one used)."""
    if a is None or b is None or a.rows == b.rows:
        return "the same first tasks, other last tasks"
    return f"the same first tasks, {b.rows} records vs {a.rows}"


def _size(src: Source) -> int:
    total = 0
    for p in src.paths:
        try:
            total += p.stat().st_size
        except OSError:
            pass
    return total


def _drop_copies(disc: Discovery) -> None:
    """Use only one of two sources holding the same data; give every unused source its reason."""
    heads: dict[int, Fingerprint | None] = {}
    fulls: dict[int, Fingerprint | None] = {}

    def fp(src: Source, full: bool) -> Fingerprint | None:
        cache = fulls if full else heads
        key = id(src)
        if key not in cache:
            if full:
                cache[key] = fingerprint(src, full=True)
            else:
                cache[key] = fulls.get(key) or fingerprint(src)
        return cache[key]

    def rel(src: Source) -> str:
        return src.paths[0].name + (f" (+{len(src.paths) - 1} more)" if len(src.paths) > 1 else "")

    # 1. across captures: a source used twice (renamed copy, copied capture) counts once
    caps = [c for c in disc.captures if c.used is not None]
    if len(caps) > 1:
        cand = [c for c in caps if fp(c.used, False) is not None]
        cand.sort(key=lambda c: heads[id(c.used)].rich, reverse=True)
        kept: list[Capture] = []
        for c in cand:
            for k in kept:
                if not _same_tasks(heads[id(c.used)].head, heads[id(k.used)].head):
                    continue
                a, b = fp(k.used, True), fp(c.used, True)
                verdict = same_data(a, b) if (a is not None and b is not None) else True
                if verdict is False:
                    continue
                src = c.used
                if verdict:
                    src.reason = f"same data as {_rel(k.used.paths[0], disc.path)}"
                else:
                    src.reason = (f"overlaps {_rel(k.used.paths[0], disc.path)}: {_overlap(a, b)}; not mixed, "
                                  "analyse it on its own")
                src.same_as = k.used.paths[0]
                c.unused.insert(0, src)
                c.used = None
                break
            else:
                kept.append(c)
    # 1b. an op_statistic read alone (a loose op_statistic*.csv) beside the per-task table it summarises
    caps = [c for c in disc.captures if c.used is not None]
    stats = [c for c in caps if c.used.kind == "op_statistic"]
    tasks = [c for c in caps if c.used.kind != "op_statistic"]
    if stats and tasks:
        task_totals: dict[int, dict | None] = {}
        for c in stats:
            st = _totals(c.used)
            if not st:
                continue
            for k in tasks:
                if id(k) not in task_totals:
                    task_totals[id(k)] = _totals(k.used)
                if _same_totals(st, task_totals[id(k)]):
                    src = c.used
                    src.reason = (f"same data as {_rel(k.used.paths[0], disc.path)} (per-op-type counts and "
                                  "totals match)" + ("; used as its cross-check" if k.cross_check is None else ""))
                    src.same_as = k.used.paths[0]
                    if k.cross_check is None:
                        k.cross_check = src
                    c.unused.insert(0, src)
                    c.used = None
                    break
    # 2. within a capture: say why each other source was left aside
    for c in disc.captures:
        ref = c.used
        if ref is None:
            ref = next((s for s in c.unused if s.same_as is not None), None)
        for s in c.unused:
            if s.reason is not None or ref is None or s is ref:
                continue
            name = rel(ref)
            if s.kind in _NOT_COMPARED or ref.kind in _NOT_COMPARED:
                s.reason = f"{name} is preferred"
                continue
            ha, hb = fp(ref, False), fp(s, False)
            if ha is None or hb is None:
                s.reason = f"{name} is preferred"
            elif not _same_tasks(ha.head, hb.head):
                s.reason = (f"holds other tasks than {name} (first: {hb.head[0][0]}); one source is read "
                            "per capture folder, analyse this one on its own")
            elif _size(ref) + _size(s) > _FP_LABEL_MAX_BYTES:
                s.reason = f"same data as {name} (checked on the first {len(hb.head)} tasks)"
                s.same_as = ref.paths[0]
            else:
                a, b = fp(ref, True), fp(s, True)
                verdict = same_data(a, b) if (a is not None and b is not None) else True
                if verdict:
                    s.reason = f"same data as {name}"
                else:
                    s.reason = f"overlaps {name} ({_overlap(a, b)}); not mixed"
                s.same_as = ref.paths[0]


def _totals(src: Source) -> dict | None:
    """{op type: [count, total µs]} of a source's compute tasks (op_statistic rows summed over core
    types), or None when it cannot be read. A full pass: only done to match a lone op_statistic."""
    out: dict = {}
    try:
        for path in src.paths:
            stream = P.open_table(path, src.reader_kind)
            if stream.kind == "stats":
                for op, core, count, total, _dev in stream:
                    if core in _FP_COMM_CORES or op.lower().startswith("hcom_"):
                        continue
                    t = out.setdefault(op, [0, 0.0])
                    t[0] += count
                    t[1] += total
                continue
            i = stream.indices
            for row in stream:
                try:
                    d = float(row[i[P.F_DUR]])
                except (TypeError, ValueError):
                    continue
                name = P.clean(row[i[P.F_NAME]]) or ""
                op = P.clean(row[i[P.F_TYPE]]) or P.op_type_from_name(name) or "(unknown)"
                if P.clean(row[i[P.F_CORE]]) in _FP_COMM_CORES or name.startswith("hcom_") \
                        or op.lower().startswith("hcom_"):
                    continue
                t = out.setdefault(op, [0, 0.0])
                t[0] += 1
                t[1] += d
    except (ProfileError, OSError, ValueError):
        return None
    return out


def _same_totals(a: dict | None, b: dict | None) -> bool:
    """Per-op-type counts equal and totals equal to the rounding of op_statistic (2–3 decimals a row)."""
    if not a or not b or set(a) != set(b):
        return False
    return all(a[k][0] == b[k][0] and abs(a[k][1] - b[k][1]) <= 1e-6 * abs(a[k][1]) + 0.01 * (a[k][0] + 1)
               for k in a)
