"""Mutated profiler files never crash the analyser: the result is a report or a ProfileError, and every
row is either counted or reported as skipped."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.errors import ProfileError
from npu_deploy.profiling.analyze import ProfileReport, analyze_profile
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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_csv())
def test_mutated_op_summary_never_crashes(data):
    _check(data, "op_summary_0_1.csv")


@settings(max_examples=60, deadline=None)
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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timeline())
def test_mutated_timeline_never_crashes(data):
    _check(data, "trace_view.json")
