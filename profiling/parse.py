"""Streaming readers for profiler tables: op_summary / kernel_details CSV, op_statistic CSV, the msprof /
torch_npu SQLite export, Chrome-trace timelines (trace_view.json, msprof_*.json, read event by event in
bounded memory), and MindSpore 1.x's aicore_intermediate tables and timeline_display.

Every reader yields **raw records** (sequences of cells as the file holds them: strings, or ``None``) and
says in ``stream.indices`` where each field of :data:`FIELDS` sits in a record (a CSV record holds only the
header's columns of :data:`FIELDS`, cut by a compiled extractor that leaves the other columns unparsed,
see :class:`CsvOpStream`; an absent column reads an empty cell). Cleaning (``N/A`` → missing, quotes
around shapes, ``FORMAT_`` prefixes, ``:N`` sub-formats) is done by the helpers below, and only on the rows
that need it.

Rows that cannot be used (a field short or long, a duration or count that is not a finite number, a cell
over the csv module's field limit) are skipped and counted per reason with their first line numbers in
:attr:`TableStream.skipped`; never silently. A file that cannot be used at all is a ``ProfileError`` with
its path (and line where known).

>>> import io, tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "op_summary_0_1.csv")
>>> _ = open(p, "w").write('Op Name,OP Type,Task Type,Task Duration(us)\\nt,TransData,AI_CORE,1.5\\n')
>>> s = open_table(p)
>>> i = s.indices
>>> [(r[i[F_NAME]], r[i[F_TYPE]], r[i[F_DUR]]) for r in s]
[('t', 'TransData', '1.5')]
"""

from __future__ import annotations

import csv
import ctypes
import heapq
import itertools
import json
import operator
import os
import re
import sqlite3
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from npu_deploy.profiling._jsonstream import iter_events

from npu_deploy import _cbuild
from npu_deploy.errors import ProfileError

# ---------------------------------------------------------------------------------------------------
# Canonical fields and the header alias table (msprof.md §3.4 and §9)

FIELDS = ("name", "op_type", "core", "dur", "device", "stream", "in_fmt", "out_fmt", "in_shape",
          "out_shape", "in_dtype", "out_dtype", "start")
(F_NAME, F_TYPE, F_CORE, F_DUR, F_DEVICE, F_STREAM, F_IN_FMT, F_OUT_FMT, F_IN_SHAPE, F_OUT_SHAPE,
 F_IN_DTYPE, F_OUT_DTYPE, F_START) = range(len(FIELDS))

#: canonical field -> accepted header spellings, in order of preference. Matching ignores case and
#: surrounding blanks. ``dur_ns``/``start_ns`` spellings are not used by CSV producers.
ALIASES: dict[str, tuple[str, ...]] = {
    "name": ("Op Name", "Name", "kernel_name", "OP Name"),
    "op_type": ("OP Type", "Type", "Op Type"),
    "core": ("Task Type", "Accelerator Core", "Core Type", "kernel_type"),
    "dur": ("Task Duration(us)", "Duration(us)", "task_time(us)", "Task Duration"),
    "start": ("Task Start Time(us)", "Start Time(us)", "task_start(us)", "Task Start Time"),
    "device": ("Device_id", "Device ID", "Device Id"),
    "stream": ("Stream ID", "Stream Id", "stream_id"),
    "in_fmt": ("Input Formats",),
    "out_fmt": ("Output Formats",),
    "in_shape": ("Input Shapes",),
    "out_shape": ("Output Shapes",),
    "in_dtype": ("Input Data Types",),
    "out_dtype": ("Output Data Types",),
}
#: op_statistic_*.csv / op_statistic.csv columns (msprof.md §4)
STAT_ALIASES: dict[str, tuple[str, ...]] = {
    "op_type": ("OP Type",),
    "core": ("Core Type",),
    "count": ("Count",),
    "total": ("Total Time(us)",),
    "ratio": ("Ratio(%)",),
    "device": ("Device_id",),
}

MISSING = frozenset({"", "N/A", "NA", "NULL", "None", "none", "null", "n/a"})

_PRIVATE_FORMATS = frozenset({
    "NC1HWC0", "NC1HWC0_C04", "FRACTAL_Z", "FRACTAL_Z_C04", "FRACTAL_NZ", "NDC1HWC0", "FRACTAL_Z_3D",
    "FRACTAL_ZN_LSTM", "FRACTAL_ZN_RNN", "ND_RNN_BIAS", "C1HWNCOC0", "C1HWNCoC0", "NHWC1C0",
    "FRACTAL_Z_3D_TRANSPOSE", "FRACTAL_Z_G", "FRACTAL_NZ_C0_16", "FRACTAL_NZ_C0_32", "FRACTAL_NZ_C0_2",
    "FRACTAL_NZ_C0_4", "FRACTAL_NZ_C0_8", "NC1KHKWHWC0", "C1HWC0",
})


# ---------------------------------------------------------------------------------------------------
# Cell cleaning (msprof.md §2)

def clean(value: str | None) -> str | None:
    """Strip blanks (the trailing TAB on timestamps, a stray CR) and map ``N/A``/empty/``NULL`` to None.

    >>> clean("1736413971558972.912\\t"), clean("N/A"), clean(" NULL ")
    ('1736413971558972.912', None, None)
    """
    if value is None:
        return None
    v = value.strip()
    return None if v in MISSING else v


_fmt_cache: dict[str, str] = {}


def _parse_format_fn() -> Callable[[str], str] | None:
    try:
        from npu_deploy.converters.formats import parse_format
    except Exception:  # the format algebra is optional here: fall back to local normalisation
        return None

    def via_registry(text: str) -> str:
        return parse_format(text).format.name

    return via_registry


_registry_format: Callable[[str], str] | None | bool = False


def normalize_format(text: str | None) -> str | None:
    """One tensor's format name without the ``FORMAT_`` prefix and ``:N`` sub-format suffix.

    Uses ``npu_deploy.converters.formats.parse_format`` for formats its registry knows, and plain text
    normalisation for the rest (``NCL``, ``ND_RNN_BIAS`` …).

    >>> normalize_format("FORMAT_ND"), normalize_format("NC1HWC0:1"), normalize_format("N/A")
    ('ND', 'NC1HWC0', None)
    """
    global _registry_format
    v = clean(text)
    if v is None:
        return None
    hit = _fmt_cache.get(v)
    if hit is not None:
        return hit
    local = v.strip('"').strip()
    if local.upper().startswith("FORMAT_"):
        local = local[7:]
    local = local.split(":", 1)[0].strip().upper()
    name = local
    if _registry_format is False:
        _registry_format = _parse_format_fn()
    if _registry_format is not None and local:
        try:
            name = _registry_format(v)  # type: ignore[operator]
        except Exception:  # a name the registry does not know (NCL, FRACTAL_ZN_LSTM…): keep the text
            name = local
    if not name or name in MISSING:
        return None
    if len(_fmt_cache) < 4096:
        _fmt_cache[v] = name
    return name


def split_formats(text: str | None) -> list[str | None]:
    """``"FORMAT_ND;NC1HWC0:1"`` → ``['ND', 'NC1HWC0']`` (one entry per tensor slot)."""
    v = clean(text)
    if v is None:
        return []
    return [normalize_format(t) for t in v.split(";")]


def split_list(text: str | None) -> list[str | None]:
    """``"FLOAT;INT64"`` → ``['FLOAT', 'INT64']``; empty slots are None."""
    v = clean(text)
    if v is None:
        return []
    return [clean(t) for t in v.strip('"').split(";")]


def parse_shapes(text: str | None) -> list[tuple[int, ...] | None]:
    """Shapes as written by msprof, with their literal quotes, ``;`` between tensors and ``,`` between dims.

    Empty slots (scalars or absent optional inputs) are ``()``; a slot that is not a list of integers
    is None.

    >>> parse_shapes('"32,3,224,224;64"'), parse_shapes('"2048;"'), parse_shapes("N/A")
    ([(32, 3, 224, 224), (64,)], [(2048,), ()], [])
    """
    v = clean(text)
    if v is None:
        return []
    v = v.strip().strip('"').strip()
    out: list[tuple[int, ...] | None] = []
    for t in v.split(";"):
        t = t.strip()
        if not t:
            out.append(())
            continue
        try:
            out.append(tuple(int(d) for d in t.split(",") if d.strip()))
        except ValueError:
            out.append(None)
    return out


def is_private_format(name: str | None) -> bool:
    """True for the Ascend private (device) formats: NC1HWC0, FRACTAL_Z, FRACTAL_NZ, …"""
    return bool(name) and (name in _PRIVATE_FORMATS or name.startswith("FRACTAL_"))


# ---------------------------------------------------------------------------------------------------
# Op-type classification by kernel name (Level0, timelines; msprof.md §8.1)

_CANONICAL_TYPES = {t.lower(): t for t in (
    "TransData", "TransDataRNN", "ReFormat", "Transpose", "TransposeD", "ConfusionTransposeD", "Cast",
    "MemSet", "MatMul", "MatMulV2", "MatMulV3", "BatchMatMul", "BatchMatMulV2", "Conv2D", "Add", "Mul",
)}
_TRANS_NODE = re.compile(r"^trans_([A-Za-z][A-Za-z0-9]*?)_\d+")
_HCOM = re.compile(r"^(hcom_[A-Za-z]+_?)")
_TRAILING_NUM = re.compile(r"(-op)?[-_]?\d+$")
_name_cache: dict[str, str | None] = {}


def op_type_from_name(name: str | None) -> str | None:
    """Guess an op type from a kernel name when the profile has none (Level0, timelines).

    GE trans nodes ``trans_TransData_20``; aclnn kernels ``aclnnMatmul_TransData_TransData`` (the last
    ``_`` token is the op type); MindSpore ``"Default/net/Conv2D-op1/Conv2D"`` (after the last ``/``);
    GE node names with a counter ``Cast16``.

    >>> [op_type_from_name(n) for n in ("trans_TransData_20", "aclnnCast_CastAiCore_Cast", "Cast16",
    ...                                 "Conv2DBackpropFilter6_MemSet", "BroadcastTo21")]
    ['TransData', 'Cast', 'Cast', 'MemSet', 'BroadcastTo']
    """
    if not name:
        return None
    hit = _name_cache.get(name, "")
    if hit != "":
        return hit
    n = name.strip().rsplit("/", 1)[-1]
    m = _TRANS_NODE.match(n)
    hcom = _HCOM.match(n)
    if hcom:
        token = hcom.group(1)
    elif m:
        token = m.group(1)
    else:
        token = None
        for t in reversed(n.split("_")):
            t = _TRAILING_NUM.sub("", t)
            if t and not t.isdigit() and t[0].isalpha():
                token = t
                break
    result: str | None
    if token is None:
        result = None
    else:
        result = _CANONICAL_TYPES.get(token.lower(), token)
        if hcom:
            pass
        elif result.lower().startswith("atomic") or result.lower() == "memset":
            result = "MemSet"
    if len(_name_cache) < 100_000:
        _name_cache[name] = result
    return result


# ---------------------------------------------------------------------------------------------------
# Skipped-row bookkeeping

@dataclass
class Skipped:
    """Rows skipped for one reason: how many, and the first few line numbers."""

    reason: str
    count: int = 0
    lines: list[int] = field(default_factory=list)

    def add(self, line: int | None) -> None:
        self.count += 1
        if line is not None and len(self.lines) < 5:
            self.lines.append(line)

    def message(self, path: str) -> str:
        plural = "row" if self.count == 1 else "rows"
        text = f"{path}: skipped {self.count} {plural} ({self.reason})"
        if self.lines:
            more = " …" if self.count > len(self.lines) else ""
            text += f" at line{'s' if len(self.lines) > 1 else ''} {', '.join(map(str, self.lines))}{more}"
        return text


class TableStream:
    """Iterate the raw records of one profiler table; base of the CSV, DB and timeline readers.

    ``kind`` is ``"ops"`` (one row per device task) or ``"stats"`` (op_statistic aggregates).
    ``line`` is the line (CSV) or row number of the record last yielded; ``skipped`` the rows not used.
    """

    kind = "ops"
    time_unit = "us"

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self.skipped: dict[str, Skipped] = {}
        self.notes: list[str] = []
        self.has_op_type = True
        self.has_formats = True
        #: position of each field of FIELDS in a yielded record
        self.indices: tuple[int, ...] = tuple(range(len(FIELDS)))
        #: the device of every record when the table has no device column but its location says it
        self.default_device: str | None = None
        #: step-trace spans seen (timelines): device -> {kind: [count, total µs]}; not rows
        self.steps: dict[str, dict[str, list]] = {}

    @property
    def line(self) -> int | None:  # pragma: no cover - overridden
        return None

    def skip(self, reason: str, line: int | None = None) -> None:
        s = self.skipped.get(reason)
        if s is None:
            s = self.skipped[reason] = Skipped(reason)
        s.add(line)

    def warnings(self) -> list[str]:
        return [s.message(self.path) for s in self.skipped.values()]

    def keep_column(self, column: int) -> int:
        """Position in a record of header column ``column``; readers that cut records to the columns
        they use (CSV) keep it too. Call before iterating."""
        return column

    def __iter__(self) -> Iterator[tuple]:  # pragma: no cover - overridden
        return iter(())


# ---------------------------------------------------------------------------------------------------
# CSV

def _resolve(header: list[str], aliases: dict[str, tuple[str, ...]]) -> dict[str, int]:
    norm = {h.strip().strip("\ufeff").strip('"').lower(): i for i, h in reversed(list(enumerate(header)))}
    out: dict[str, int] = {}
    for key, names in aliases.items():
        for n in names:
            i = norm.get(n.lower())
            if i is not None:
                out[key] = i
                break
    return out


def _open_text(path: str):
    # utf-8-sig drops a BOM; newline="" lets csv handle CRLF and quoted newlines; a wrong encoding
    # becomes U+FFFD instead of an exception.
    return open(path, "r", encoding="utf-8-sig", errors="replace", newline="")


def sniff_csv(path: str | os.PathLike) -> str | None:
    """``"ops"``, ``"stats"`` or None: what kind of profiler table a CSV file holds, from its header."""
    try:
        with _open_text(str(path)) as f:
            header = next(csv.reader(f), None)
    except (OSError, csv.Error):
        return None
    if not header:
        return None
    cols = _resolve(header, ALIASES)
    if "dur" in cols and "name" in cols:
        return "ops"
    stats = _resolve(header, STAT_ALIASES)
    if "op_type" in stats and "total" in stats:
        return "stats"
    return None


class CsvOpStream(TableStream):
    """op_summary_*.csv / kernel_details.csv / task_time_*.csv, streamed.

    A record holds only the columns of :data:`FIELDS` the header has (plus one empty cell standing for
    the absent ones, and any column asked for with :meth:`keep_column`), in header order:
    ``stream.indices`` says where each field is. A wide table (46 columns with the PMU counters) then
    costs a Python string for 13 cells a row, not for all 46. The cells are cut out by the compiled
    extractor (``_csvscan.c``, see :func:`csv_kernel_info`) or, without a C compiler or with
    ``NPU_DEPLOY_CSV_KERNEL=0``, by the ``csv`` module: the two give the same records, skips and line
    numbers (the extractor hands every record it does not call plain to the ``csv`` module).
    """

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self._line: int | None = None
        self._batch: tuple | None = None
        with _open_text(self.path) as f:
            try:
                header = next(csv.reader(f), None)
            except csv.Error as e:
                raise ProfileError(f"unreadable CSV header ({e})", path=self.path, line=1,
                                   hint="is this a profiler CSV file?") from e
        if not header:
            raise ProfileError("empty file, no header row", path=self.path,
                               hint="re-export the profile; the file has no data")
        self.header = header
        self.cols = _resolve(header, ALIASES)
        missing = [k for k in ("name", "dur") if k not in self.cols]
        if missing:
            looked = "; ".join(f"{k}: {'/'.join(ALIASES[k])}" for k in missing)
            raise ProfileError(f"not an op table: no column for {looked}", path=self.path, line=1,
                               hint="give an op_summary_*.csv or kernel_details.csv file")
        self.ncols = len(header)
        self.has_op_type = "op_type" in self.cols
        self.has_formats = "in_fmt" in self.cols and "out_fmt" in self.cols
        #: position of each field of FIELDS in the header (an absent column: ``ncols``), for readers of
        #: whole header-wide rows
        self.header_indices = tuple(self.cols.get(k, self.ncols) for k in FIELDS)
        self._pad = any(k not in self.cols for k in FIELDS)
        self._kept = sorted(set(self.cols.values()))
        self._set_indices()
        if "device" not in self.cols:
            # per-device files (device_N/summary/) carry no Device_id column: take it from the folder
            m = re.search(r"(?:^|/)device_(\d+)(?:/|$)", Path(self.path).parent.parent.as_posix() + "/")
            self.default_device = m.group(1) if m else None
        if "start" in self.cols:
            h = header[self.cols["start"]].strip()
            self.time_unit = "us" if "us" in h else "unknown"

    def _set_indices(self) -> None:
        pos = {c: i for i, c in enumerate(self._kept)}
        self.indices = tuple(pos.get(self.cols[k], len(self._kept)) if k in self.cols else len(self._kept)
                             for k in FIELDS)

    def keep_column(self, column: int) -> int:
        """Keep header column ``column`` in the records too (call before iterating); returns its
        position in a record."""
        if not 0 <= column < self.ncols:
            raise IndexError(f"column {column} outside the header's {self.ncols}")
        if column not in self._kept:
            self._kept = sorted({*self._kept, column})
            self._set_indices()
        return self._kept.index(column)

    @property
    def line(self) -> int | None:
        b = self._batch
        if b is None:
            return self._line
        it, total, k, first, lines = b
        j = (total - it.__length_hint__()) // k - 1   # the record last handed out, from the cells left
        return first + j if lines is None else lines[j]

    def __iter__(self) -> Iterator[tuple]:
        fn = _csv_kernel()
        if fn is None:
            return self._iter_csv()
        # chain pulls the records of each block straight from its zip: no Python frame per record
        return itertools.chain.from_iterable(self._kernel_blocks(fn))

    def _compact(self, row: list) -> tuple:
        return (*(row[c] for c in self._kept), *(("",) if self._pad else ()))

    def _iter_csv(self) -> Iterator[tuple]:
        """The reference reader: the ``csv`` module, every row then cut to the kept columns."""
        ncols = self.ncols
        skip = self.skip
        get = operator.itemgetter(*self._kept)
        pad = ("",) if self._pad else ()
        self._batch = None
        with _open_text(self.path) as f:
            reader = csv.reader(f)
            try:
                next(reader)
            except (StopIteration, csv.Error):
                return
            while True:
                try:
                    for row in reader:
                        if len(row) == ncols:
                            self._line = reader.line_num
                            yield get(row) + pad
                        elif row:
                            skip(f"{len(row)} fields, header has {ncols}", reader.line_num)
                    break
                except csv.Error as e:
                    skip(f"malformed CSV: {str(e)[:60]}", reader.line_num)
            self._line = reader.line_num

    def _kernel_blocks(self, fn) -> Iterator[Iterator[tuple]]:
        """Iterables of records: the compiled extractor's over 1 MiB blocks of bytes, and one record at a
        time from the ``csv`` module wherever it stops (the header, and any record it does not call
        plain)."""
        ncols = self.ncols
        kept = set(self._kept)
        keep_mask = bytes(1 if c in kept else 0 for c in range(ncols))
        pad = 1 if self._pad else 0
        k = len(self._kept) + pad
        max_field = csv.field_size_limit()
        src = _ByteLines(self.path)
        state = (ctypes.c_int64 * 6)()
        out_cap = 2 * _CSV_BLOCK
        out = ctypes.create_string_buffer(out_cap)
        out_view = memoryview(out).cast("B")
        max_rows = max(16, _CSV_BLOCK // 16)
        row_lines = (ctypes.c_int64 * max_rows)()
        self._batch = None
        try:
            first = self._slow_record(src)          # the header
            if first is None or first[1] is not None:
                return
            while True:
                state[0] = src.pos
                state[1] = src.lines
                buf = src.buf
                status = fn(buf, len(buf), int(src.eof), ncols, keep_mask, pad, max_field, out, out_cap,
                            row_lines, max_rows, state)
                src.pos = state[0]
                src.lines = state[1]
                n = state[2]
                if n:
                    cells = str(out_view[:state[3]], "utf-8", "replace").split("\x1f")
                    cells.pop()                         # after the last 0x1F
                    it = iter(cells)
                    self._batch = (it, n * k, k, state[5], None if state[4] else row_lines[:n])
                    yield zip(*[it] * k)
                    self._batch = None
                self._line = src.lines
                if status == 2:
                    if n == 0:                          # one record larger than the output block
                        out_cap *= 2
                        out = ctypes.create_string_buffer(out_cap)
                        out_view = memoryview(out).cast("B")
                elif status == 1 or (src.eof and src.pos < len(src.buf)):
                    rec = self._slow_record(src)
                    if rec is None:
                        return
                    row, err, line = rec
                    self._line = line
                    if err is not None:
                        self.skip(f"malformed CSV: {str(err)[:60]}", line)
                    elif len(row) == ncols:
                        yield (self._compact(row),)
                    elif row:
                        self.skip(f"{len(row)} fields, header has {ncols}", line)
                elif src.eof:
                    return
                else:
                    src.more()
        finally:
            self._batch = None
            self._line = src.lines
            src.close()

    @staticmethod
    def _slow_record(src: _ByteLines) -> tuple[list, csv.Error | None, int] | None:
        """Read one record with the ``csv`` module from the lines at ``src.pos``: (row, error, line of
        its end), or None at the end of the data."""
        lines = src.iter_lines()
        reader = csv.reader(lines)
        try:
            row = next(reader)
            err = None
        except StopIteration:
            return None
        except csv.Error as e:
            row, err = [], e
        finally:
            lines.close()
        return row, err, src.lines


_CSV_BLOCK = 1 << 20
_LINE_END = re.compile(rb"\r\n?|\n")


class _ByteLines:
    """A binary file read in blocks, with a position (``pos`` in ``buf``) and the count of lines before
    it; :meth:`iter_lines` hands the csv module text lines from there, split where a text file opened
    with ``newline=""`` splits them (LF, CRLF, a lone CR) and decoded as such a file decodes them."""

    def __init__(self, path: str):
        self.f = open(path, "rb")  # noqa: SIM115 - closed by close(), in the reader's finally
        self.buf = b""
        self.pos = 0
        self.lines = 0
        self.eof = False
        self.more()
        if self.buf.startswith(b"\xef\xbb\xbf"):     # what utf-8-sig drops
            self.pos = 3

    def more(self) -> None:
        data = self.f.read(_CSV_BLOCK)
        if not data:
            self.eof = True
        self.buf = self.buf[self.pos:] + data
        self.pos = 0

    def iter_lines(self) -> Iterator[str]:
        while True:
            m = _LINE_END.search(self.buf, self.pos)
            while (m is None or (m.end() == len(self.buf) and m.group() == b"\r")) and not self.eof:
                self.more()                             # need the rest of the line (or the LF after a CR)
                m = _LINE_END.search(self.buf, self.pos)
            if m is None:
                if self.pos >= len(self.buf):
                    return
                end = len(self.buf)
            else:
                end = m.end()
            text = self.buf[self.pos:end].decode("utf-8", "replace")
            self.pos = end
            self.lines += 1
            yield text

    def close(self) -> None:
        self.f.close()


_csv_lock = threading.Lock()
#: status: "not loaded" (first use pending), "loaded", "failed" or "disabled"; reason says why
_csvk: dict = {"status": "not loaded", "reason": "", "path": None, "compile_seconds": None, "fn": None}
CSV_KERNEL_ENABLED = os.environ.get("NPU_DEPLOY_CSV_KERNEL", "1").strip().lower() not in ("0", "false", "no")


def _csv_kernel():
    """The ctypes extractor function, or None (disabled or unavailable: the csv module is used). The
    first call compiles or loads it; a failure is remembered once."""
    if not CSV_KERNEL_ENABLED:
        _csvk.update(status="disabled", reason="NPU_DEPLOY_CSV_KERNEL=0", fn=None)
        return None
    if _csvk["status"] == "loaded":
        return _csvk["fn"]
    if _csvk["status"] != "not loaded":
        return None
    with _csv_lock:
        if _csvk["status"] == "not loaded":
            try:
                path, seconds = _cbuild.build(Path(__file__).resolve().with_name("_csvscan.c"), "csvscan",
                                              ["-O3", "-shared", "-fPIC", "-std=c99"])
                fn = ctypes.CDLL(path).npd_csv_scan
                p64 = ctypes.POINTER(ctypes.c_int64)
                fn.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                               ctypes.c_int, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64, p64,
                               ctypes.c_int64, p64]
                fn.restype = ctypes.c_int
                _csvk.update(status="loaded", reason="", path=path, compile_seconds=seconds, fn=fn)
            except Exception as exc:  # noqa: BLE001 - any failure means "use the csv module"
                _csvk.update(status="failed", reason=f"{type(exc).__name__}: {exc}", fn=None)
    return _csvk["fn"]


def csv_kernel_info() -> dict:
    """Whether op-table CSVs are cut by the compiled extractor: status, reason, path, compile seconds."""
    _csv_kernel()
    return {k: v for k, v in _csvk.items() if k != "fn"}


class CsvStatStream(TableStream):
    """op_statistic_*.csv: one row per (OP Type, Core Type) with count and total time."""

    kind = "stats"
    aliases = STAT_ALIASES
    what = "an op_statistic table: no 'OP Type' / 'Total Time(us)' column"
    #: µs per unit of the total column
    scale = 1.0
    #: the core of every row when the table has no core column
    default_core: str | None = None

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self._reader = None
        with _open_text(self.path) as f:
            try:
                header = next(csv.reader(f), None) or []
            except csv.Error as e:     # e.g. a header cell over the csv module's 131,072-character limit
                raise ProfileError(f"unreadable CSV header ({str(e)[:80]})", path=self.path, line=1,
                                   hint="is this an op_statistic file?") from None
        self.header = header
        self.cols = _resolve(header, self.aliases)
        if "op_type" not in self.cols or "total" not in self.cols:
            raise ProfileError(f"not {self.what}", path=self.path, line=1)
        self.ncols = len(header)

    @property
    def line(self) -> int | None:
        return self._reader.line_num if self._reader is not None else None

    def __iter__(self) -> Iterator[tuple]:
        """Yield (op_type, core, count, total_us, device) with numbers parsed; bad rows skipped."""
        c = self.cols
        with _open_text(self.path) as f:
            reader = self._reader = csv.reader(f)
            next(reader, None)
            while True:
                try:
                    for row in reader:
                        if not row:
                            continue
                        if len(row) != self.ncols:
                            self.skip(f"{len(row)} fields, header has {self.ncols}", reader.line_num)
                            continue
                        op = clean(row[c["op_type"]])
                        try:
                            total = float(row[c["total"]])
                            count_f = float(row[c["count"]]) if "count" in c else 0.0
                        except ValueError:
                            self.skip("time or count is not a number", reader.line_num)
                            continue
                        if op is None or not (0.0 <= total < 1e15):
                            self.skip("no op type or time out of range", reader.line_num)
                            continue
                        if not (0.0 <= count_f < 1e15):      # inf, nan, negative
                            self.skip("count out of range", reader.line_num)
                            continue
                        count = int(count_f)
                        core = clean(row[c["core"]]) if "core" in c else self.default_core
                        dev = clean(row[c["device"]]) if "device" in c else self.default_device
                        yield (op, core, count, total * self.scale, dev)
                    break
                except csv.Error as e:
                    self.skip(f"malformed CSV: {str(e)[:60]}", reader.line_num)


# ---------------------------------------------------------------------------------------------------
# MindSpore 1.x profiler output
#
# msprof.md does not document these files; the column names are MindSpore 1.x's as publicly known
# (its profiler's integrator): ``aicore_intermediate_{dev}_type.csv`` = op_type, execution_time (ms),
# execution_frequency (number of ops of that type), percent; ``aicore_intermediate_{dev}_detail.csv`` =
# full_op_name, execution_time (ms)[, execution_frequency]. Both hold AI Core ops only.

MS_TYPE_ALIASES: dict[str, tuple[str, ...]] = {
    "op_type": ("op_type",),
    "total": ("execution_time", "execution_time(ms)", "total_time"),
    "count": ("execution_frequency",),
    "ratio": ("percent", "percent(%)"),
}
MS_DETAIL_ALIASES: dict[str, tuple[str, ...]] = {
    "name": ("full_op_name", "op_name"),
    "dur": ("execution_time", "execution_time(ms)", "avg_execution_time"),
    "count": ("execution_frequency",),
}
_MS_FILE = re.compile(r"^aicore_intermediate_(\d+)_(type|detail)\.csv$")


def _ms_device(path: str) -> str | None:
    m = _MS_FILE.match(Path(path).name)
    return m.group(1) if m else None


class MsTypeStream(CsvStatStream):
    """MindSpore 1.x ``aicore_intermediate_{dev}_type.csv``: AI Core time per op type (ms, read as µs)."""

    aliases = MS_TYPE_ALIASES
    what = "a MindSpore aicore_intermediate type table: no 'op_type' / 'execution_time' column"
    scale = 1000.0
    default_core = "AI_CORE"

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self.default_device = _ms_device(self.path)


class MsDetailStream(TableStream):
    """MindSpore 1.x ``aicore_intermediate_{dev}_detail.csv``: AI Core time per op (full scope name, ms).
    The op type comes from the name (``Default/…/TransData-op12`` → TransData)."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self.has_op_type = False
        self.has_formats = False
        self.default_device = _ms_device(self.path)
        self._line = 0
        with _open_text(self.path) as f:
            try:
                header = next(csv.reader(f), None) or []
            except csv.Error as e:
                raise ProfileError(f"unreadable CSV header ({str(e)[:80]})", path=self.path, line=1) from None
        self.cols = _resolve(header, MS_DETAIL_ALIASES)
        if "name" not in self.cols or "dur" not in self.cols:
            raise ProfileError("not a MindSpore aicore_intermediate detail table: no 'full_op_name' / "
                               "'execution_time' column", path=self.path, line=1)
        self.ncols = len(header)

    @property
    def line(self) -> int | None:
        return self._line

    def __iter__(self) -> Iterator[tuple]:
        i_name, i_dur = self.cols["name"], self.cols["dur"]
        with _open_text(self.path) as f:
            reader = csv.reader(f)
            next(reader, None)
            while True:
                try:
                    for row in reader:
                        self._line = reader.line_num
                        if not row:
                            continue
                        if len(row) != self.ncols:
                            self.skip(f"{len(row)} fields, header has {self.ncols}", reader.line_num)
                            continue
                        try:
                            ms = float(row[i_dur])
                        except ValueError:
                            self.skip("execution time is not a number", reader.line_num)
                            continue
                        if not (0.0 <= ms < 1e9):
                            self.skip("execution time out of range", reader.line_num)
                            continue
                        yield (row[i_name], None, "AI_CORE", repr(ms * 1000.0), self.default_device, None,
                               None, None, None, None, None, None, None)
                    break
                except csv.Error as e:
                    self.skip(f"malformed CSV: {str(e)[:60]}", reader.line_num)


# ---------------------------------------------------------------------------------------------------
# SQLite (msprof.md §7)

SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


class DbOpStream(TableStream):
    """An msprof_*.db / ascend_pytorch_profiler*.db export: TASK ⨝ COMPUTE_TASK_INFO ⨝ STRING_IDS.

    Times are ns in the DB and yielded as µs strings. Communication ops (COMMUNICATION_OP) are yielded
    as rows with core ``COMMUNICATION``.
    """

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self._row = 0
        if not is_sqlite(self.path):
            raise ProfileError("not an SQLite database", path=self.path,
                               hint="give an msprof_*.db or ascend_pytorch_profiler*.db export")
        try:
            con = self._connect()
            try:
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                self.tables = tables
                self.compute_table = self._pick_compute_table(con, tables)
                if "TASK" not in tables or self.compute_table is None or "STRING_IDS" not in tables:
                    raise ProfileError(
                        "no TASK / COMPUTE_TASK_INFO / STRING_IDS tables: not an msprof or torch_npu "
                        "profiler export", path=self.path,
                        hint="export with msprof --type=db or torch_npu export_type=db")
                self.cti_cols = self._columns(con, self.compute_table)
                self.task_cols = self._columns(con, "TASK")
            finally:
                con.close()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
            # a damaged schema: SQLite's error message quotes its bytes, which Python then fails to decode
            raise ProfileError(f"unreadable SQLite database ({_db_reason(e)})", path=self.path,
                               hint="the file is damaged: export the profile again") from None
        self.has_formats = "inputFormats" in self.cti_cols and "outputFormats" in self.cti_cols
        if self.compute_table != "COMPUTE_TASK_INFO":
            self.notes.append(f"{Path(self.path).name}: using table {self.compute_table}")

    def _connect(self) -> sqlite3.Connection:
        uri = Path(os.path.abspath(self.path)).as_uri() + "?mode=ro&immutable=1"
        con = sqlite3.connect(uri, uri=True)
        # text that is not UTF-8 (a table name, a kernel name) is read with U+FFFD, not a failed file
        con.text_factory = lambda b: b.decode("utf-8", errors="replace")
        return con

    @staticmethod
    def _columns(con: sqlite3.Connection, table: str) -> set[str]:
        return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}

    @staticmethod
    def _pick_compute_table(con, tables) -> str | None:
        if "COMPUTE_TASK_INFO" in tables:
            return "COMPUTE_TASK_INFO"
        old = sorted(t for t in tables if re.fullmatch(r"_?COMPUTE_TASK_INFO_old_\d+", t))
        return old[-1] if old else None

    @property
    def line(self) -> int | None:
        return self._row

    def _query(self) -> str:
        c = self.cti_cols

        def s(col: str, alias: str) -> tuple[str, str]:
            if col in c:
                return (f"{alias}.value", f'LEFT JOIN STRING_IDS {alias} ON {alias}.id = c."{col}"')
            return ("NULL", "")

        parts = [s("name", "n"), s("opType", "o"), s("taskType", "tt"), s("inputFormats", "fi"),
                 s("outputFormats", "fo"), s("inputShapes", "si"), s("outputShapes", "so"),
                 s("inputDataTypes", "di"), s("outputDataTypes", "do")]
        sel = ", ".join(p[0] for p in parts)
        joins = " ".join(p[1] for p in parts if p[1])
        dev = "t.deviceId" if "deviceId" in self.task_cols else "NULL"
        stream = "t.streamId" if "streamId" in self.task_cols else "NULL"
        return (f'SELECT {sel}, t.startNs, t.endNs, {dev}, {stream} FROM "{self.compute_table}" c '
                f"JOIN TASK t ON t.globalTaskId = c.globalTaskId {joins} ORDER BY {dev}, t.startNs")

    def __iter__(self) -> Iterator[tuple]:
        try:
            con = self._connect()
        except sqlite3.DatabaseError as e:  # pragma: no cover - checked in __init__
            raise ProfileError(f"unreadable SQLite database ({e})", path=self.path) from e
        try:
            self._row = 0
            try:
                cur = con.execute(self._query())
            except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
                raise ProfileError(f"unexpected DB schema ({e})", path=self.path,
                                   hint="this export's schema is not one npu-deploy knows") from e
            for r in cur:
                self._row += 1
                (name, op, core, fi, fo, si, so, di, do, start, end, dev, stream) = r
                if not isinstance(start, int) or not isinstance(end, int) or end < start:
                    self.skip("start/end time missing or reversed", self._row)
                    continue
                dur = f"{(end - start) / 1000.0:.3f}"
                yield (_s(name), _s(op), _s(core), dur, _s(dev), _s(stream), _s(fi), _s(fo), _s(si),
                       _s(so), _s(di), _s(do), str(start / 1000.0))
            if "COMMUNICATION_OP" in self.tables:
                cols = self._columns(con, "COMMUNICATION_OP")
                if {"opName", "startNs", "endNs"} <= cols:
                    dev = "deviceId" if "deviceId" in cols else "NULL"
                    q = ("SELECT n.value, c.startNs, c.endNs, " + dev + " FROM COMMUNICATION_OP c "
                         "LEFT JOIN STRING_IDS n ON n.id = c.opName")
                    for name, start, end, d in con.execute(q):
                        self._row += 1
                        if not isinstance(start, int) or not isinstance(end, int) or end < start:
                            self.skip("start/end time missing or reversed", self._row)
                            continue
                        yield (_s(name) or "hcom_op", None, "COMMUNICATION", f"{(end - start) / 1000.0:.3f}",
                               _s(d), None, None, None, None, None, None, None, str(start / 1000.0))
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
            raise ProfileError(f"unreadable SQLite database ({_db_reason(e)})", path=self.path,
                               hint="the file is damaged: export the profile again") from None
        finally:
            con.close()


def _db_reason(e: Exception) -> str:
    if isinstance(e, UnicodeDecodeError):
        return "its schema is damaged: SQLite's description of it is not UTF-8"
    return str(e)


def _s(v) -> str | None:
    return None if v is None else str(v)


# ---------------------------------------------------------------------------------------------------
# Chrome-trace timelines (msprof.md §6)

#: hardware task types that are device compute in a timeline (msprof.md §6.2; ``Other`` is what real
#: torch_npu timelines carry on their kernels); others (sync, memcpy, communication tasks) are excluded
TIMELINE_COMPUTE = frozenset({"AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV", "AI_CPU", "DSA_SQE",
                              "KERNEL_AICORE", "KERNEL_AIVEC", "KERNEL_AICPU", "KERNEL_MIX_AIC",
                              "KERNEL_MIX_AIV", "FFTS_PLUS", "Other"})
#: the step-trace spans of raw CANN 6.x timelines, in a thread named like ``Step Trace(Model ID:2)``:
#: markers, not kernels
STEP_SPAN = re.compile(r"^(Iteration Refresh|Iteration|FP_BP Time|Reduce)[ _]?\d+(?:_\d+)*$")
_STEP_THREAD = re.compile(r"^\s*step\s*trace", re.IGNORECASE)
#: the HCCL planes are parallel sub-tasks of one collective (CANN 6.x ``Plane 0`` … ``Plane 3`` threads)
_PLANE_THREAD = re.compile(r"^\s*plane\s*\d+", re.IGNORECASE)
_NPU_LABEL = re.compile(r"^\s*NPU\s*(\d+)\s*$")
_DEVICE_DIR = re.compile(r"(?:^|/)device_(\d+)(?:/|$)")
_MAX_KEYS = 65_536               # processes / threads / (pid, tid) pairs tracked: bounded memory


def step_kind(name: str) -> str | None:
    """``"Iteration 3"`` → ``"Iteration"``, ``"Reduce_1_2"`` → ``"Reduce"``; None for a kernel name.

    >>> [step_kind(n) for n in ("Iteration 3", "FP_BP Time 3", "Iteration Refresh 3", "Reduce_1_2", "Add_3")]
    ['Iteration', 'FP_BP Time', 'Iteration Refresh', 'Reduce', None]
    """
    m = STEP_SPAN.match(name)
    return m.group(1) if m else None


def _key(v) -> int | str | None:
    """A pid/tid usable as a key: an int or a string (JSON numbers like 1.0 as ints); else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 53:
        return int(v)
    if isinstance(v, str):
        return v
    return None


class TraceOpStream(TableStream):
    """trace_view.json / msprof_*.json (device_N/timeline/ included): ``X`` events of the
    ``Ascend Hardware`` process that are kernel tasks, and the collectives of the ``HCCL`` process.

    Read as a stream (:mod:`._jsonstream`) in two passes: the first takes the process and thread names
    and checks that each thread's events are in time order, the second yields the events. Memory stays
    bounded whatever the file size when events are in time order per thread (as msprof and torch_npu
    write them); otherwise the device events are sorted in memory, one small tuple each.

    Left out of compute, and said so in ``notes``: device tasks that are not kernels (sync, memcpy,
    communication tasks, no ``Task Type``), and the step-trace spans (``Iteration N``, ``FP_BP Time N``,
    ``Iteration Refresh N``, ``Reduce_N_M``), which are kept in ``steps`` as {kind: [count, total µs]}
    per device. Communication counts each collective once: the per-plane sub-tasks of the HCCL planes
    run in parallel with their collective and are not added; a timeline with planes only counts the
    union of the plane tasks' intervals. There is no op type in a timeline: classify by name.

    Devices are the device id: from the process label ``NPU n``, else the ``device_N`` folder of the
    file, else the low 5 bits of msprof's pid (``pid = hostPid << 10 | layer << 5 | deviceId``).
    """

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        self.has_op_type = False
        self.has_formats = False
        self._row = 0

    @property
    def line(self) -> int | None:
        return self._row

    def _events(self) -> Iterator[tuple[int, dict]]:
        for i, e in enumerate(iter_events(self.path), 1):
            if isinstance(e, dict):
                yield i, e

    def _scan(self, device_only: bool = False):
        """Pass 1: process and thread names, labels; whether each thread's X events are in time order
        (``device_only``: only the threads of the device's processes, the only ones read after)."""
        procs: dict = {}
        labels: dict = {}
        threads: dict = {}
        last_ts: dict = {}
        unordered: set = set()           # (pid, tid) whose X events go back in time somewhere
        ordered = True                   # False: too many threads to track, sort whatever they are
        for _i, e in self._events():
            ph = e.get("ph")
            if ph == "X":
                if not ordered:
                    continue
                pid, tid, ts = e.get("pid"), e.get("tid"), e.get("ts")
                # the common types directly (this loop sees every event of the file); the rest as below
                k = (pid if type(pid) is int else _key(pid), tid if type(tid) is int else _key(tid))
                try:
                    ts = float(ts) if type(ts) is str else _num(ts)
                except ValueError:
                    continue
                if ts is None or ts != ts:
                    continue
                prev = last_ts.get(k)
                if prev is None:
                    if len(last_ts) >= _MAX_KEYS:
                        ordered = False
                        continue
                    last_ts[k] = ts
                elif ts < prev:
                    unordered.add(k)
                else:
                    last_ts[k] = ts
            elif ph == "M":
                pid = _key(e.get("pid"))
                args = e.get("args")
                if pid is None or not isinstance(args, dict) or len(procs) + len(labels) >= 2 * _MAX_KEYS:
                    continue
                what = e.get("name")
                if what == "process_name" and isinstance(args.get("name"), str):
                    procs[pid] = args["name"]
                elif what == "process_labels" and isinstance(args.get("labels"), str):
                    labels[pid] = args["labels"]
                elif what == "thread_name" and isinstance(args.get("name"), str):
                    tid = _key(e.get("tid"))
                    if tid is not None and len(threads) < _MAX_KEYS:
                        threads[(pid, tid)] = args["name"]
        if ordered and unordered and not device_only:
            ordered = False
        elif ordered and unordered:
            # only the device's processes are read in order (host threads such as torch's cpu_op
            # timelines often go back in time, and are never read): sort only when one of those does
            kept = {p for p, n in procs.items() if n == "Ascend Hardware" or n.upper().startswith(("HCCL", "COMMUNICATION"))}
            ordered = not any(_key(p) in kept for p, _t in unordered)
        return procs, labels, threads, ordered

    def _devices(self, hw: set, labels: dict) -> dict:
        m = _DEVICE_DIR.search(Path(self.path).parent.parent.as_posix() + "/")
        folder = m.group(1) if m else None
        out = {}
        for pid in hw:
            lab = _NPU_LABEL.match(labels.get(pid, ""))
            if lab:
                out[pid] = lab.group(1)
            elif folder is not None:
                out[pid] = folder
            elif isinstance(pid, int) and pid >= 0:
                out[pid] = str(pid & 31)
            else:
                out[pid] = str(pid)
        return out

    def __iter__(self) -> Iterator[tuple]:
        procs, labels, threads, ordered = self._scan(device_only=True)
        hw = {p for p, n in procs.items() if n == "Ascend Hardware"}
        comm = {p for p, n in procs.items() if n.upper().startswith(("HCCL", "COMMUNICATION"))}
        if not hw:
            raise ProfileError("no 'Ascend Hardware' process in the timeline: no device kernels to analyse",
                               path=self.path, hint="use the profile's kernel_details.csv or op_summary")
        device = self._devices(hw, labels)
        comm_dev = self._devices(comm, labels)
        excluded: dict[str, int] = {}
        planes: dict = {}                 # device -> [(ts, dur)] of HCCL plane sub-tasks
        collectives: set = set()          # devices with collective-level events (in any comm process)
        self.steps = {}

        def records():
            for idx, e in self._events():
                if e.get("ph") != "X":
                    continue
                pid = _key(e.get("pid"))
                if pid is None or (pid not in hw and pid not in comm):
                    continue
                ts = _num(e.get("ts"))
                dur = _num(e.get("dur"))
                if ts is None or dur is None:
                    self.skip("ts or dur missing, not a number or not finite", idx)
                    continue
                if not (0.0 <= dur < 1e13) or not (-1e18 < ts < 1e18):
                    self.skip("duration out of range", idx)
                    continue
                yield pid, _key(e.get("tid")), ts, dur, idx, e

        def sorted_records():
            picked = ((str(p), str(t), ts, idx, p, t, dur, *_compact(e)) for p, t, ts, dur, idx, e in records())
            for _sp, _st, ts, idx, p, t, dur, *c in _external_sort(picked):
                yield p, t, ts, dur, idx, _expand(c)

        for pid, tid, ts, dur, idx, e in (records() if ordered else sorted_records()):
            self._row = idx
            name = e.get("name")
            name = str(name) if name is not None else None
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            tname = threads.get((pid, tid), "")
            if pid in comm:
                if _PLANE_THREAD.match(tname):
                    planes.setdefault(comm_dev[pid], []).append((ts, dur))
                    continue
                collectives.add(comm_dev[pid])
                yield (name or "hcom_op", None, "COMMUNICATION", repr(dur), comm_dev[pid], _s(tid), None,
                       None, None, None, None, None, repr(ts))
                continue
            dev = device[pid]
            kind = step_kind(name) if name else None
            if kind is not None or _STEP_THREAD.match(tname):
                s = self.steps.setdefault(dev, {}).setdefault(kind or "step trace", [0, 0.0])
                s[0] += 1
                s[1] += dur
                continue
            tt = args.get("Task Type")
            core = str(tt) if tt is not None else None
            if core is None:
                excluded["no Task Type"] = excluded.get("no Task Type", 0) + 1
                continue
            if core not in TIMELINE_COMPUTE and not core.startswith("MIX_"):
                excluded[core] = excluded.get(core, 0) + 1
                continue
            if name and name.upper().startswith("MEMCPY"):
                excluded["memcpy"] = excluded.get("memcpy", 0) + 1
                continue
            stream = args.get("Stream Id", args.get("Physic Stream Id", tid))
            yield (name, None, core, repr(dur), dev, _s(stream), None, None, None, None, None,
                   None, repr(ts))
        for dev, spans in planes.items():
            if dev in collectives:
                n = len(spans)
                self.notes.append(f"{self.path}: {n} HCCL plane sub-task{'s' if n > 1 else ''} not added to "
                                  "communication (they run inside their collective)")
                continue
            # no collective-level events: the communication time is the union of the plane tasks
            for start, length in _union(spans):
                yield ("hccl (union of plane tasks)", None, "COMMUNICATION", repr(length), dev, None,
                       None, None, None, None, None, None, repr(start))
        if excluded:
            what = ", ".join(f"{n} {k}" for k, n in sorted(excluded.items()))
            self.notes.append(f"{self.path}: left out non-compute device tasks ({what})")
        if self.steps:
            n = sum(c for kinds in self.steps.values() for c, _t in kinds.values())
            self.notes.append(f"{self.path}: {n} step-trace span{'s' if n > 1 else ''} (Iteration, FP_BP Time, "
                              "…) shown as steps, not counted as kernels")


_MS_KERNEL_THREAD = re.compile(r"^\s*(stream\s*#?\s*\d+|ai\s*core\s*op)", re.IGNORECASE)
_MS_AICPU_THREAD = re.compile(r"^\s*ai\s*cpu\s*op", re.IGNORECASE)
_MS_COMM_THREAD = re.compile(r"^\s*(pure\s+)?communication\s*op", re.IGNORECASE)
_MS_STEP_THREAD = re.compile(r"^\s*steps?\s*$", re.IGNORECASE)


class MsTimelineStream(TraceOpStream):
    """MindSpore 1.x ``timeline_display_{dev}.json`` (Chrome trace, µs). Its threads are named for what
    they hold: ``Stream #N`` / ``AI Core Op`` (AI Core kernels), ``AI CPU Op``, ``Communication Op`` /
    ``Pure Communication Op`` (collectives), ``Steps`` (step spans); the rest (``Merged …`` summaries of
    the same time, ``Free Time``, ``Scope Name`` levels, host ops) is not device compute and is left out.
    The thread names are MindSpore 1.x's as publicly known; msprof.md does not document this file."""

    def __iter__(self) -> Iterator[tuple]:
        _procs, _labels, threads, ordered = self._scan()
        m = re.match(r"^timeline_display_(\d+)\.json$", Path(self.path).name)
        dev = m.group(1) if m else None
        roles = {}
        for key, tname in threads.items():
            if _MS_KERNEL_THREAD.match(tname):
                roles[key] = "AI_CORE"
            elif _MS_AICPU_THREAD.match(tname):
                roles[key] = "AI_CPU"
            elif _MS_COMM_THREAD.match(tname):
                roles[key] = "COMMUNICATION"
            elif _MS_STEP_THREAD.match(tname):
                roles[key] = "step"
        if not any(r in ("AI_CORE", "AI_CPU") for r in roles.values()):
            raise ProfileError("no 'Stream #N' / 'AI Core Op' / 'AI CPU Op' thread in this MindSpore timeline: "
                               "no device kernels to analyse", path=self.path,
                               hint="use aicore_intermediate_*_type.csv from the same folder")
        self.steps = {}
        left_out = 0
        rows = []
        for idx, e in self._events():
            if e.get("ph") != "X":
                continue
            role = roles.get((_key(e.get("pid")), _key(e.get("tid"))))
            if role is None:
                left_out += 1
                continue
            ts, dur = _num(e.get("ts")), _num(e.get("dur"))
            if ts is None or dur is None or not (0.0 <= dur < 1e13):
                self.skip("ts or dur missing, not a number or not finite", idx)
                continue
            name = e.get("name")
            name = str(name) if name is not None else None
            if role == "step":
                st = self.steps.setdefault(dev or "-", {}).setdefault("Step", [0, 0.0])
                st[0] += 1
                st[1] += dur
                continue
            rec = (name, None, role, repr(dur), dev, _s(e.get("tid")), None, None, None, None, None, None,
                   repr(ts))
            if ordered:
                self._row = idx
                yield rec
            else:
                rows.append((str(e.get("tid")), ts, idx, rec))
        rows.sort(key=lambda r: r[:3])
        for _t, _ts, idx, rec in rows:
            self._row = idx
            yield rec
        if left_out:
            self.notes.append(f"{self.path}: left out {left_out} events of threads that are not device kernels "
                              "(merged summaries, free time, scopes, host ops)")


def _num(v) -> float | None:
    """A finite float from a JSON number or a numeric string (``ts`` is a decimal string in µs)."""
    try:
        x = float(v.strip()) if isinstance(v, str) else float(v) if isinstance(v, (int, float)) else None
    except (ValueError, OverflowError):   # a 400-digit integer
        return None
    if x is None or x != x or x in (float("inf"), float("-inf")) or isinstance(v, bool):
        return None
    return x


SORT_RUN = 50_000    # records sorted in memory at a time (~20 MB); more are spilled to sorted runs on disk


def _external_sort(records: Iterator[tuple], run: int | None = None) -> Iterator[tuple]:
    """``records`` sorted by their first four fields (unique: the fourth is the event's index), in
    bounded memory: runs of ``run`` records are sorted and written as JSON lines to a temporary folder,
    then merged. A timeline whose device threads go back in time is sorted this way whatever its size."""
    run = run or SORT_RUN
    first: list[tuple] = []
    for r in records:
        first.append(r)
        if len(first) >= run:
            break
    else:  # everything fits in one run: no file
        first.sort(key=lambda r: r[:4])
        yield from first
        return
    with tempfile.TemporaryDirectory(prefix="npu-deploy-sort-") as tmp:
        paths = []

        def spill(chunk: list[tuple]) -> None:
            chunk.sort(key=lambda r: r[:4])
            path = os.path.join(tmp, f"run{len(paths)}.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                for r in chunk:
                    f.write(json.dumps(r, separators=(",", ":")))
                    f.write("\n")
            paths.append(path)

        spill(first)
        first.clear()
        chunk: list[tuple] = []
        for r in records:
            chunk.append(r)
            if len(chunk) >= run:
                spill(chunk)
                chunk = []
        if chunk:
            spill(chunk)
        del chunk
        files = [open(p, encoding="utf-8") for p in paths]
        try:
            for r in heapq.merge(*((json.loads(line) for line in f) for f in files), key=lambda r: r[:4]):
                yield tuple(r)
        finally:
            for f in files:
                f.close()


_KEPT_ARGS = ("Task Type", "Stream Id", "Physic Stream Id")
_ABSENT = "\x00absent"  # an argument the event does not have (JSON-safe, never a real value)


def _compact(e: dict) -> tuple:
    """The part of an event the stream uses, for the sorted path: a flat tuple (name, then the kept
    arguments), small in memory and on disk."""
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    return (e.get("name"), *(args.get(k, _ABSENT) for k in _KEPT_ARGS))


def _expand(c) -> dict:
    """:func:`_compact`'s tuple as the event dict the stream reads."""
    return {"name": c[0], "args": {k: v for k, v in zip(_KEPT_ARGS, c[1:]) if v != _ABSENT}}


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, length in sorted(spans):
        end = start + length
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b - a) for a, b in out]


# ---------------------------------------------------------------------------------------------------

def open_table(path: str | os.PathLike, kind: str | None = None) -> TableStream:
    """Open one profiler file as a stream: CSV op table, op_statistic CSV, SQLite export or timeline.

    ``kind`` is ``"csv"``, ``"stats"``, ``"db"``, ``"trace"``, ``"ms_type"`` / ``"ms_detail"`` (MindSpore 1.x
    aicore_intermediate tables) or None (decide from the name and content).
    """
    p = str(path)
    if kind is None:
        if is_sqlite(p):
            kind = "db"
        elif re.match(r"^timeline_display_\d+\.json$", Path(p).name):
            kind = "ms_trace"
        elif p.lower().endswith(".json"):
            kind = "trace"
        elif _MS_FILE.match(Path(p).name):
            kind = "ms_type" if p.endswith("_type.csv") else "ms_detail"
        else:
            kind = "stats" if sniff_csv(p) == "stats" else "csv"
    if kind == "db":
        return DbOpStream(p)
    if kind == "ms_type":
        return MsTypeStream(p)
    if kind == "ms_detail":
        return MsDetailStream(p)
    if kind == "ms_trace":
        return MsTimelineStream(p)
    if kind == "trace":
        return TraceOpStream(p)
    if kind == "stats":
        return CsvStatStream(p)
    return CsvOpStream(p)
