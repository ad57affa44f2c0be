"""The compiled CSV field extractor (``profiling/_csvscan.c``) against the csv module: the same records,
the same skipped rows with the same reasons and line numbers, the same report; on the real shared CSVs,
on hand-made quirks, and on mutated real files read in blocks of every size."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy import _cbuild
from npu_deploy.errors import ProfileError
from npu_deploy.profiling import parse as P
from tests.conftest import PROFILES, SHARED_DATA, SHARED_DATA_REASON
from tests.fuzzing import examples

REAL_CSVS = sorted(p for p in SHARED_DATA.glob("**/*.csv")
                   if p.name.startswith(("kernel_details", "op_summary"))) if SHARED_DATA.is_dir() else []
ROOT = Path(__file__).resolve().parents[2]


def _have_extractor() -> bool:
    return P._csv_kernel() is not None


needs_extractor = pytest.mark.skipif(_cbuild.find_cc() is None, reason="no C compiler here")


def _read(path: Path, *, kernel: bool) -> tuple:
    """Every record with the line the stream gives for it, the skipped rows, the final line."""
    s = P.CsvOpStream(path)
    if kernel:
        fn = P._csv_kernel()
        assert fn is not None, P.csv_kernel_info()
        it = iter(P.itertools.chain.from_iterable(s._kernel_blocks(fn)))
    else:
        it = s._iter_csv()
    recs = [(r, s.line) for r in it]
    return recs, {k: (v.count, v.lines) for k, v in s.skipped.items()}, s.line, s.indices


def _both(path: Path) -> tuple:
    fast, slow = _read(path, kernel=True), _read(path, kernel=False)
    assert fast == slow
    return fast


# ------------------------------------------------------------------------------ the real files
@needs_extractor
@pytest.mark.shared_data
# in a bare clone: one case skipped with the shared-data reason (not pytest's "empty parameter set")
@pytest.mark.parametrize("path", REAL_CSVS or [pytest.param(None, marks=pytest.mark.skip(reason=SHARED_DATA_REASON))],
                         ids=lambda p: "no-shared-data" if p is None else str(p.relative_to(SHARED_DATA)))
def test_real_csvs_the_same_three_ways(path):
    """Extractor = csv-module fallback = a plain csv.reader of the whole file, cell by cell."""
    recs, skipped, _line, idx = _both(path)
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    full = [r for r in body if len(r) == len(header)]
    assert len(recs) == len(full) and len(recs) > 0
    hdr = P.CsvOpStream(path).header_indices
    for (rec, _), row in zip(recs, full):
        for f in range(len(P.FIELDS)):
            assert rec[idx[f]] == (row[hdr[f]] if hdr[f] < len(header) else "")
    short = sum(1 for r in body if r and len(r) != len(header))
    assert sum(c for c, _ in skipped.values()) == short


@needs_extractor
@pytest.mark.shared_data
def test_the_row_a_field_short_is_named_by_line():
    """msinsight's op_summary has one row a field short (testing.md): same reason, same line both ways."""
    _recs, skipped, _line, _idx = _both(PROFILES / "msinsight_fixtures" / "op_summary_1.csv")
    ((reason, (count, lines)),) = skipped.items()
    assert count == 1 and reason.endswith("header has 32") and lines == [17]


@needs_extractor
@pytest.mark.shared_data
@pytest.mark.slow
@pytest.mark.parametrize("capture", ["profiles/torch_npu_level2_llm_910B",
                                     "timings_910B/cnn_level2_rank0_ascend_pt",
                                     "profiles/mstt_fixtures/kernel_details_2023_pmu.csv"])
def test_same_report_with_the_extractor_forced_off(capture):
    """``NPU_DEPLOY_CSV_KERNEL=0`` (the pure-Python path): byte-identical report JSON."""
    code = ("import sys; from npu_deploy.profiling.analyze import analyze_profile; "
            "from npu_deploy.profiling.parse import csv_kernel_info; "
            "print(csv_kernel_info()['status']); print(analyze_profile(sys.argv[1]).to_json())")
    out = {}
    for knob in ("1", "0"):
        r = subprocess.run([sys.executable, "-c", code, str(SHARED_DATA / capture)], capture_output=True,
                           text=True, cwd=ROOT, env={**os.environ, "NPU_DEPLOY_CSV_KERNEL": knob}, timeout=300)
        assert r.returncode == 0, r.stderr
        status, _, report = r.stdout.partition("\n")
        out[knob] = (status, report)
    assert out["1"][0] == "loaded" and out["0"][0] == "disabled"
    assert out["1"][1] == out["0"][1]
    assert json.loads(out["1"][1])       # a real report, not an empty line


# ------------------------------------------------------------------------------ quirks by hand
QUIRKS = (
    "\ufeffOp Name,OP Type,Task Type,Task Duration(us),Input Shapes,PMU a,PMU b\r\n"   # 1 (BOM, CRLF)
    'a,Cast,AI_CORE,1.5,"""1,2;3""",0.1,0.2\r\n'                                     # 2 quoted, "" escapes
    "\r\n"                                                                          # 3 blank: no row
    'b,MatMul,AI_CORE,2.0,"x\ny",0.3,0.4\n'                                         # 4-5 newline in quotes
    "c,Add,AI_CORE,3.0\n"                                                           # 6 short: skipped
    "d,Add,AI_CORE,4.0,s,1,2,3\n"                                                   # 7 long: skipped
    "e,Add,AI_CORE,5.0,s,1\x00,2\n"                                                 # 8 NUL in a PMU cell
    'f,Add,AI_CORE,6.0,"q"x,1,2\n'                                                  # 9 text after a quote
    "g,Add,AI_CORE,7.0,s,1,2\rh,Add,AI_CORE,8.0,s,1,2\n"                            # 10-11 bare CR
    'i,Add,AI_CORE,9.0,s,1,"2'                                                       # 12 quote open at EOF
)


@needs_extractor
def test_quirks_read_as_the_csv_module_reads_them(tmp_path):
    p = tmp_path / "op_summary_0_1.csv"
    p.write_bytes(QUIRKS.encode("utf-8"))
    recs, skipped, last, idx = _both(p)
    name, dur, shape = idx[P.F_NAME], idx[P.F_DUR], idx[P.F_IN_SHAPE]
    got = [(r[name], r[dur], r[shape], line) for r, line in recs]
    assert got == [("a", "1.5", '"1,2;3"', 2), ("b", "2.0", "x\ny", 5), ("e", "5.0", "s", 8),
                   ("f", "6.0", "qx", 9), ("g", "7.0", "s", 10), ("h", "8.0", "s", 11),
                   ("i", "9.0", "s", 12)]
    assert skipped == {"4 fields, header has 7": (1, [6]), "8 fields, header has 7": (1, [7])}
    assert last == 12
    # the PMU columns are not in the records: name, type, core, duration, shape and the pad cell only
    assert all(len(r) == 6 for r, _ in recs)


@needs_extractor
def test_over_long_field_is_the_csv_module_error(tmp_path, monkeypatch):
    p = tmp_path / "kernel_details.csv"
    p.write_text("Name,Type,Duration(us),Extra\nx,Add,1.0,\n" + "y,Add,2.0," + "9" * 300 + "\nz,Add,3.0,\n")
    old = csv.field_size_limit(200)
    try:
        recs, skipped, _last, idx = _both(p)
    finally:
        csv.field_size_limit(old)
    assert [r[idx[P.F_NAME]] for r, _ in recs] == ["x", "z"]
    ((reason, (count, lines)),) = skipped.items()
    assert reason.startswith("malformed CSV: field larger than field limit") and (count, lines) == (1, [3])


@needs_extractor
@pytest.mark.parametrize("block", [8, 13, 64, 257])
def test_records_across_block_boundaries(tmp_path, monkeypatch, block):
    """Tiny blocks: every record, quoted newline and CRLF is cut somewhere; the output block and the
    row array overflow and grow."""
    monkeypatch.setattr(P, "_CSV_BLOCK", block)
    p = tmp_path / "op_summary_0_1.csv"
    head, _, tail = QUIRKS.rpartition("\n")          # the quote left open at the end stays last
    p.write_bytes(f'{head}\nj,Add,AI_CORE,10.0,"{"long " * 100}",1,2\r\n{tail}'.encode())
    recs, skipped, _last, idx = _both(p)
    assert [r[idx[P.F_NAME]] for r, _ in recs] == list("abefghji")
    assert len(skipped) == 2


def test_keep_column_adds_a_cell(tmp_path):
    p = tmp_path / "kernel_details.csv"
    p.write_text("Name,Type,Block Dim,Duration(us),PMU\nx,Add,24,1.0,7\n")
    s = P.CsvOpStream(p)
    j = s.keep_column(2)
    (rec,) = list(s)
    assert rec[j] == "24" and rec[s.indices[P.F_NAME]] == "x" and rec[s.indices[P.F_DUR]] == "1.0"
    assert "7" not in rec


# ------------------------------------------------------------------------------ no compiler
def test_without_a_compiler_the_csv_module_reads_the_same(tmp_path, monkeypatch):
    p = tmp_path / "op_summary_0_1.csv"
    p.write_bytes(QUIRKS.encode("utf-8"))
    expected = _read(p, kernel=False)
    for k in ("status", "fn"):
        monkeypatch.setitem(P._csvk, k, P._csvk[k])
    P._csvk.update(status="not loaded", fn=None)
    monkeypatch.setattr(_cbuild, "find_cc", lambda: None)
    s = P.CsvOpStream(p)
    recs = [(r, s.line) for r in s]
    assert (recs, {k: (v.count, v.lines) for k, v in s.skipped.items()}, s.line) == expected[:3]
    info = P.csv_kernel_info()
    assert info["status"] == "failed" and "no C compiler" in info["reason"]


@needs_extractor
def test_built_once_into_the_private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NPU_DEPLOY_CACHE", str(tmp_path))
    for k in ("status", "fn", "path", "compile_seconds"):
        monkeypatch.setitem(P._csvk, k, P._csvk[k])
    P._csvk.update(status="not loaded", fn=None)
    info = P.csv_kernel_info()
    assert info["status"] == "loaded" and info["compile_seconds"] is not None
    files = [f.name for f in (tmp_path / "kernels").iterdir()]
    assert files == [os.path.basename(info["path"])] and files[0].startswith("csvscan-")
    assert (tmp_path / "kernels").stat().st_mode & 0o077 == 0
    P._csvk.update(status="not loaded", fn=None)
    assert P.csv_kernel_info()["compile_seconds"] is None      # loaded from the cache


# ------------------------------------------------------------------------------ mutated real files
_PIECES = [b'"', b'""', b",", b"\r", b"\n", b"\r\n", b"\x00", b"\x1f", b"\x1e", b"\xff", b"\xe2\x82",
           b"\xef\xbb\xbf", b"\t", b"N/A", b"9" * 50]


def _base() -> bytes:
    if not SHARED_DATA.is_dir():
        return QUIRKS.encode("utf-8")
    lines = (PROFILES / "mstt_fixtures" / "kernel_details_2023_pmu.csv").read_bytes().splitlines(keepends=True)
    return b"".join(lines[:30])


BASE = _base()


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(BASE)
    for _ in range(draw(st.integers(1, 8))):
        i = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["insert", "replace", "delete"]))
        piece = draw(st.sampled_from(_PIECES))
        if kind == "insert":
            data[i:i] = piece
        elif kind == "replace":
            data[i:i + len(piece)] = piece
        else:
            del data[i:i + draw(st.integers(1, 40))]
    return bytes(data)


@needs_extractor
@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])
@given(data=mutated(), block=st.sampled_from([16, 61, 1 << 20]), limit=st.sampled_from([40, 131072]))
def test_mutated_real_csv_reads_the_same(tmp_path, monkeypatch, data, block, limit):
    monkeypatch.setattr(P, "_CSV_BLOCK", block)
    p = tmp_path / "kernel_details.csv"
    p.write_bytes(data)
    old = csv.field_size_limit(limit)
    try:
        try:
            P.CsvOpStream(p)
        except ProfileError:
            return                      # the header itself is broken: one error, whichever reader
        _both(p)
    finally:
        csv.field_size_limit(old)
