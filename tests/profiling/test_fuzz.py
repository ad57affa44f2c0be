"""Mutated profiler files never crash the analyser: the result is a report or a ProfileError, and every
row is either counted or reported as skipped."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from npu_deploy.errors import ProfileError
from npu_deploy.profiling.analyze import ProfileReport, analyze_profile
from tests.fuzzing import examples
from tests.profiling.helpers import csv_text, flagged_rows

BASE_TEXT = csv_text(flagged_rows())
BASE_LINES = BASE_TEXT.splitlines()
FIELDS = BASE_LINES[0].split(",")

garbage = st.one_of(st.sampled_from(["N/A", "", "NULL", "nan", "-inf", "1e999", "\t", '"', '""', "\x00",
                                     "12,5", "１２", "0x10", "-0", "9" * 400, "FORMAT_", ":1", ";;;"]),
                    st.text(max_size=20))


@st.composite
def mutated_csv(draw) -> bytes:
    lines = list(BASE_LINES)
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(1, len(lines) - 1))
        cells = lines[i].split(",")
        kind = draw(st.sampled_from(["replace", "drop", "add", "truncate", "dup", "swap_header"]))
        if kind == "replace":
            cells[draw(st.integers(0, len(cells) - 1))] = draw(garbage)
        elif kind == "drop":
            del cells[draw(st.integers(0, len(cells) - 1))]
        elif kind == "add":
            cells.insert(draw(st.integers(0, len(cells))), draw(garbage))
        elif kind == "truncate":
            cut = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:cut]
            continue
        elif kind == "dup":
            lines.insert(i, lines[i])
            continue
        else:
            hdr = lines[0].split(",")
            hdr[draw(st.integers(0, len(hdr) - 1))] = draw(st.sampled_from(FIELDS + ["", "Type", "Name"]))
            lines[0] = ",".join(hdr)
            continue
        lines[i] = ",".join(cells)
    text = draw(st.sampled_from(["\n", "\r\n", "\r"])).join(lines)
    enc = draw(st.sampled_from(["utf-8", "utf-16", "latin-1", "gbk"]))
    data = text.encode(enc, errors="replace")
    if draw(st.booleans()):
        pos = draw(st.integers(0, len(data)))
        data = data[:pos] + draw(st.binary(max_size=16)) + data[pos:]
    return data


def _check(data: bytes, name: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_bytes(data)
        try:
            r = analyze_profile(p)
        except ProfileError:
            return
        assert isinstance(r, ProfileReport)
        assert r.compute_us >= 0 and 0 <= r.formattrans_pct
        r.to_json()  # serialisable, NaN-free


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_csv())
def test_mutated_op_summary_never_crashes(data):
    _check(data, "op_summary_0_1.csv")


@settings(max_examples=examples(60), deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash(data):
    _check(data, "kernel_details.csv")
    _check(data, "trace_view.json")
    _check(b"SQLite format 3\x00" + data, "msprof_0.db")


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                           max_leaves=5)


@st.composite
def timeline(draw):
    events = [{"ph": "M", "name": "process_name", "pid": draw(st.sampled_from([1, [1]])),
               "args": {"name": "Ascend Hardware"}}]
    for _ in range(draw(st.integers(0, 8))):
        ev = {"ph": "X", "name": draw(st.sampled_from(["trans_TransData_1", "MatMul", "hcom_x", ""])),
              "pid": draw(st.sampled_from([1, 2, "1", None, [1], {"a": 1}, 1.5])), "tid": draw(st.sampled_from([0, 1, "s", None, [1]])),
              "ts": draw(st.one_of(st.text(max_size=6), st.floats(), st.integers())),
              "dur": draw(st.one_of(st.floats(), st.integers(), st.text(max_size=4), st.none())),
              "args": draw(st.one_of(json_values, st.just({"Task Type": "AI_CORE"})))}
        if draw(st.booleans()):
            ev[draw(st.text(max_size=4))] = draw(json_values)
        events.append(ev)
    return json.dumps(draw(st.sampled_from([events, {"traceEvents": events}]))).encode()


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timeline())
def test_mutated_timeline_never_crashes(data):
    _check(data, "trace_view.json")


# ---------------------------------------------------------------------------------------------------
# The other readers (issue 12): timelines (streamed), op_statistic, MindSpore tables, SQLite; through the
# CLI too, where the only exit codes are 0 / 2 and no traceback is printed.

def _base_files() -> dict[str, bytes]:
    from tests.profiling.test_db import build_db
    from tests.profiling.test_timeline import DEV0, cann6_device

    with tempfile.TemporaryDirectory() as d:
        db = build_db(Path(d) / "msprof_0.db").read_bytes()
    return {
        "msprof_0_2_1.json": json.dumps(cann6_device(0, DEV0, label=True, iterations=1)).encode(),
        "op_statistic_0_1.csv": b"OP Type,Core Type,Count,Total Time(us),Ratio(%)\nTransData,AI_VECTOR_CORE,3,"
                                b"12.5,12.5\nMatMulV2,AI_CORE,2,87.5,87.5\n",
        "aicore_intermediate_0_type.csv": b"op_type,execution_time,execution_frequency,percent\n"
                                          b"TransData,8.7,12,13\nConv2D,58.3,5,87\n",
        "aicore_intermediate_0_detail.csv": b"full_op_name,execution_time\nDefault/TransData-op1,8.7\n"
                                            b"Default/Conv2D-op2,58.3\n",
        "msprof_0.db": db,
    }


BASE_FILES = _base_files()


@st.composite
def mutated_file(draw) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(BASE_FILES)))
    data = bytearray(BASE_FILES[name])
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "number"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.sampled_from([b"9" * 400, b"1e999", b"-", b"inf", b"NaN", b'"', b"[", b"{",
                                                  b"\xff\xfe", b"\x00", b",", b"]", b"}", b"\\u0000", b"\x1b[2J"]))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 64))]
        elif kind == "truncate":
            del data[pos:]
        else:  # replace a run of digits by a huge or odd number
            data[pos:pos + 1] = draw(st.sampled_from([b"1" * 5000, b"-0", b"1e308", b"4294967295"]))
    return name, bytes(data)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_file())
# the cases of issue 12 that were exit 4, always run
@example(("op_statistic_0_1.csv", BASE_FILES["op_statistic_0_1.csv"].replace(b",3,", b",inf,")))
@example(("msprof_0_2_1.json", BASE_FILES["msprof_0_2_1.json"].replace(b'"dur": 50.0', b'"dur": ' + b"9" * 400, 1)))
@example(("aicore_intermediate_0_type.csv", BASE_FILES["aicore_intermediate_0_type.csv"].replace(b",12,", b",1e999,")))
def test_mutated_profiles_never_crash(case):
    name, data = case
    _check(data, name)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_file())
def test_mutated_profiles_through_the_cli_exit_0_or_2(case):
    import contextlib
    import io

    from npu_deploy.cli.main import main

    name, data = case
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_bytes(data)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["profile", "analyze", str(p)])
    assert code in (0, 1, 2), err.getvalue()
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue()
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) >= 1
        assert err.getvalue().strip().splitlines()[-1].startswith("npu-deploy: error: ")
    assert "\x1b" not in out.getvalue() + err.getvalue()


@settings(max_examples=examples(60), deadline=None)
@given(st.binary(max_size=400), st.integers(1, 64))
def test_stream_reader_on_random_bytes_agrees_with_json(data, chunk):
    from npu_deploy.profiling._jsonstream import iter_events

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        p.write_bytes(data)
        text = data.decode("utf-8", errors="replace")
        try:
            # the reader accepts a BOM, and takes the first traceEvents member of an object
            expected = json.loads(text[1:] if text.startswith("\ufeff") else text,
                                  object_pairs_hook=lambda kv: {k: v for k, v in reversed(kv)})
        except (ValueError, RecursionError):
            expected = None
        try:
            got = list(iter_events(str(p), chunk=chunk))
        except ProfileError:
            got = None
        if isinstance(expected, list):
            assert got == expected
        elif isinstance(expected, dict) and isinstance(expected.get("traceEvents"), list):
            assert got == expected["traceEvents"]
        else:
            assert got is None


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(json_values, max_size=12), st.integers(1, 40), st.booleans())
def test_stream_reader_on_valid_arrays_matches_json_load(events, chunk, wrap):
    from npu_deploy.profiling._jsonstream import iter_events

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        doc = {"a": [1, {"b": "]"}], "traceEvents": events, "z": None} if wrap else events
        p.write_text(json.dumps(doc, allow_nan=False) if _finite(events) else json.dumps(doc))
        assert _same(list(iter_events(str(p), chunk=chunk)), events)


def _finite(x) -> bool:
    return "NaN" not in json.dumps(x) and "Infinity" not in json.dumps(x)


def _same(a, b) -> bool:
    # NaN != NaN: compare through JSON text
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
