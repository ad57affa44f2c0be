"""Timelines: raw CANN 6.x ``msprof_*.json`` (Step Trace thread, sync tasks, HCCL planes), device labels,
per-device verdicts, and the streaming reader.

The CANN 6.x fixture is built from the description of a real 2-device MindSpore capture (issue 12): an
``Ascend Hardware`` process whose threads are streams of kernel tasks (Task Type AI_CORE / AI_VECTOR_CORE /
AI_CPU / MIX_AIC) and of sync tasks (EVENT_RECORD_SQE, Notify Wait), plus a thread named
``Step Trace(Model ID:2)`` holding ``Iteration N`` / ``FP_BP Time N`` / ``Iteration Refresh N`` /
``Reduce_N_M`` spans; an ``HCCL`` process with four ``Plane N`` threads of parallel sub-tasks and one
thread of collectives. Every expected number below is summed by hand from the event lists.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from npu_deploy.errors import ProfileError
from npu_deploy.profiling._jsonstream import iter_events
from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.profiling.parse import TraceOpStream

PROF = "PROF_000001_20230628101435646_FKFLNPEPPRRCFCBA"


def _meta(pid, what, name, tid=0):
    key = "labels" if what == "process_labels" else "name"
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": {key: name}}


def _x(pid, tid, name, ts, dur, task_type=None, **args):
    a = dict(args)
    if task_type is not None:
        a["Task Type"] = task_type
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": f"{ts:.3f}", "dur": dur, "args": a}


def cann6_device(dev: int, kernels, *, label: bool, iterations: int = 2) -> list:
    """One device_N/timeline/msprof_*.json. ``kernels``: [(name, task type, µs)] run once per iteration."""
    hw = (4321 << 10) | (3 << 5) | dev      # msprof's pid: hostPid << 10 | layer << 5 | deviceId
    hccl = (4321 << 10) | (4 << 5) | dev
    ev = [_meta(hw, "process_name", "Ascend Hardware"), _meta(hccl, "process_name", "HCCL"),
          _meta(hw, "thread_name", "Stream 5", 5), _meta(hw, "thread_name", "Stream 6", 6),
          _meta(hw, "thread_name", "Step Trace(Model ID:2)", 100)]
    if label:
        ev.append(_meta(hw, "process_labels", f"NPU {dev}"))
    for p in range(4):
        ev.append(_meta(hccl, "thread_name", f"Plane {p}", 200 + p))
    ev.append(_meta(hccl, "thread_name", "Communication", 300))
    t = 1000.0
    for it in range(1, iterations + 1):
        start = t
        ev.append(_x(hw, 100, f"Iteration {it}", start, 500.0))
        ev.append(_x(hw, 100, f"FP_BP Time {it}", start, 400.0))
        for name, tt, us in kernels:
            ev.append(_x(hw, 5, name, t, us, tt, **{"Stream Id": 5, "Task Id": 1}))
            t += us + 1.0
        ev.append(_x(hw, 6, "EVENT_RECORD", t, 3.0, "EVENT_RECORD_SQE"))
        ev.append(_x(hw, 6, "Notify_Wait", t, 40.0, "Notify Wait"))
        ev.append(_x(hw, 100, f"Reduce_{it}_1", t, 30.0))
        # one all-reduce of 30 µs, split over four planes of 25 µs each, running in parallel inside it
        ev.append(_x(hccl, 300, f"hcom_allReduce__{it}_0", t, 30.0))
        for p in range(4):
            ev.append(_x(hccl, 200 + p, "Memcpy" if p % 2 else "Reduce Inline", t + 2.0, 25.0,
                         **{"plane id": p}))
        ev.append(_x(hw, 100, f"Iteration Refresh {it}", t + 40.0, 5.0))
        t = start + 600.0
    return ev


DEV0 = [("Default/MatMul-op1", "AI_CORE", 50.0), ("Default/Conv2D-op2", "MIX_AIC", 20.0),
        ("Default/TransData-op3", "AI_VECTOR_CORE", 12.0), ("Default/ReLU-op4", "AI_VECTOR_CORE", 8.0),
        ("Default/GatherV2-op5", "AI_CPU", 10.0)]                 # 100 µs, TransData 12 %
DEV1 = [("Default/MatMul-op1", "AI_CORE", 190.0), ("Default/TransData-op3", "AI_VECTOR_CORE", 10.0)]  # 200 µs, 5 %


@pytest.fixture
def cann6(tmp_path) -> Path:
    root = tmp_path / PROF
    for dev, kernels, label in ((0, DEV0, True), (1, DEV1, False)):
        d = root / f"device_{dev}" / "timeline"
        d.mkdir(parents=True)
        (d / f"msprof_{dev}_2_1.json").write_text(json.dumps(cann6_device(dev, kernels, label=label)))
    return root


def test_cann6_step_trace_is_not_device_compute(cann6):
    r = analyze_profile(cann6)
    # two iterations: device_0 2 × 100 µs, device_1 2 × 200 µs; step spans, sync tasks and planes left out
    assert r.compute_us == pytest.approx(600.0)
    assert r.compute_ops == 2 * (5 + 2)
    assert r.transdata_us == pytest.approx(44.0) and r.transdata_pct == pytest.approx(44.0 / 6.0)
    assert {t.task_type for t in r.task_types} == {"AI_CORE", "MIX_AIC", "AI_VECTOR_CORE", "AI_CPU"}
    assert not any(o.op_type in ("Iteration", "FP_BP Time", "Reduce") for o in r.op_types)
    assert any("left out non-compute device tasks" in w and "Notify Wait" in w for w in r.warnings)


def test_cann6_communication_counts_each_collective_once(cann6):
    r = analyze_profile(cann6)
    # one 30 µs all-reduce per iteration per device; the 4 × 25 µs plane sub-tasks are inside it
    assert r.communication_us == pytest.approx(2 * 2 * 30.0) and r.communication_ops == 4


def test_cann6_steps_are_shown_as_steps(cann6):
    r = analyze_profile(cann6)
    steps = {(s.device, s.kind): (s.count, s.total_us) for s in r.steps}
    assert steps[("device_0", "Iteration")] == (2, 1000.0)
    assert steps[("device_0", "FP_BP Time")] == (2, 800.0)
    assert steps[("device_1", "Iteration Refresh")] == (2, 10.0)
    assert steps[("device_1", "Reduce")] == (2, 60.0)


def test_cann6_devices_by_device_id_with_one_verdict_each(cann6):
    r = analyze_profile(cann6)
    d = {x.device: x for x in r.devices}
    # device_0 from its "NPU 0" label, device_1 from its folder; never the pid (4424800…)
    assert set(d) == {"device_0", "device_1"}
    assert d["device_0"].share_pct == pytest.approx(12.0) and d["device_0"].flagged
    assert d["device_1"].share_pct == pytest.approx(5.0) and not d["device_1"].flagged
    # pooled 7.3 % would be "ok": one flagged device flags the report
    assert r.formattrans_pct < r.threshold_pct and r.flagged and not r
    assert "1 of 2 above; highest device_0 12.0 %" in r.verdict()


def test_cann6_cli_prints_per_device_verdicts_and_fails_on_flag(cann6, run_cli):
    code, out, err = run_cli("profile", "analyze", cann6, "--fail-on-flag")
    lines = out.splitlines()
    assert code == 1
    assert lines[0].startswith("device_0: FormatTrans 12.0 %") and lines[0].endswith("FLAGGED")
    assert lines[1].startswith("device_1: FormatTrans 5.0 %") and lines[1].endswith(": ok")
    assert lines[2].startswith("Summary: FormatTrans 7.3 %")
    assert lines[-1] == r_verdict(cann6)
    code, _out, _err = run_cli("profile", "analyze", cann6)
    assert code == 0


def r_verdict(path) -> str:
    return analyze_profile(path).verdict()


def test_collectives_in_another_process_than_the_planes_are_still_counted_once(tmp_path):
    # planes under "HCCL", the collective rows under a "Communication" process of the same device
    hw, hccl, comm = 1, 2, 3
    ev = [_meta(hw, "process_name", "Ascend Hardware"), _meta(hccl, "process_name", "HCCL"),
          _meta(comm, "process_name", "Communication"), _meta(hccl, "thread_name", "Plane 0", 10),
          _meta(hccl, "thread_name", "Plane 1", 11),
          *[_meta(p, "process_labels", "NPU 0") for p in (hw, hccl, comm)],
          _x(hw, 5, "MatMul_1", 0.0, 100.0, "MIX_AIV_SOMETHING_NEW"),
          _x(hccl, 10, "Memcpy", 100.0, 50.0), _x(hccl, 11, "Memcpy", 100.0, 50.0),
          _x(comm, 0, "hcom_allGather__1_0", 100.0, 55.0)]
    p = tmp_path / "msprof_0_1.json"
    p.write_text(json.dumps(ev))
    r = analyze_profile(p)
    assert r.communication_us == pytest.approx(55.0) and r.communication_ops == 1
    assert r.compute_us == pytest.approx(100.0)          # a MIX_* task type is a kernel


def test_planes_without_collectives_count_their_union(tmp_path):
    hw, hccl = 1, 2
    ev = [_meta(hw, "process_name", "Ascend Hardware"), _meta(hccl, "process_name", "HCCL"),
          _meta(hccl, "thread_name", "Plane 0", 10), _meta(hccl, "thread_name", "Plane 1", 11),
          _x(hw, 5, "MatMul_1", 0.0, 100.0, "AI_CORE"),
          # [100, 150) ∪ [120, 160) ∪ [200, 210) = 60 + 10 µs
          _x(hccl, 10, "Memcpy", 100.0, 50.0), _x(hccl, 11, "Memcpy", 120.0, 40.0),
          _x(hccl, 10, "Notify_Wait", 200.0, 10.0)]
    p = tmp_path / "msprof_0_1.json"
    p.write_text(json.dumps(ev))
    r = analyze_profile(p)
    assert r.communication_us == pytest.approx(70.0) and r.communication_ops == 2
    assert r.compute_us == pytest.approx(100.0)


def test_events_out_of_time_order_are_sorted_per_stream(tmp_path):
    ev = [_meta(1, "process_name", "Ascend Hardware"),
          _x(1, 5, "MatMul_2", 300.0, 10.0, "AI_CORE"),
          _x(1, 5, "trans_TransData_1", 200.0, 10.0, "AI_VECTOR_CORE"),
          _x(1, 5, "MatMul_1", 100.0, 10.0, "AI_CORE")]
    p = tmp_path / "trace_view.json"
    p.write_text(json.dumps(ev))
    r = analyze_profile(p)
    (k,) = [k for k in r.conversions if k.category == "format"]
    (i,) = k.top
    assert (i.prev_op, i.next_op) == ("MatMul_1", "MatMul_2")


def _shuffled_capture(n: int, seed: int = 3) -> list:
    """A device stream of n kernels (a TransData between MatMuls every 4th) in random file order, plus a
    host thread going back in time."""
    import random

    ev = [_meta(1, "process_name", "Ascend Hardware"), _meta(2, "process_name", "Python")]
    for k in range(n):
        name = "trans_TransData_%d" % k if k % 4 == 2 else "MatMul_%d" % k
        ev.append(_x(1, 5, name, 100.0 + 20.0 * k, 5.0 + k % 7, "AI_VECTOR_CORE" if k % 4 == 2 else "AI_CORE"))
        ev.append(_x(2, 2, "aten::mm", 5000.0 - k, 1.0))
    body = ev[2:]
    random.Random(seed).shuffle(body)
    return ev[:2] + body


def test_host_threads_out_of_time_order_do_not_make_the_device_sorted(tmp_path):
    """A torch_npu timeline's host cpu_op thread goes back in time (the real mstt fixture does); only the
    device's threads are read, so only theirs decide whether the events must be sorted."""
    ev = [_meta(1, "process_name", "Ascend Hardware"), _meta(2, "process_name", "Python"),
          _x(2, 2, "aten::mm", 300.0, 1.0), _x(2, 2, "aten::add", 100.0, 1.0),
          _x(1, 5, "MatMul_1", 100.0, 10.0, "AI_CORE"), _x(1, 5, "MatMul_2", 300.0, 10.0, "AI_CORE")]
    p = tmp_path / "trace_view.json"
    p.write_text(json.dumps(ev))
    assert TraceOpStream(p)._scan(device_only=True)[3] is True
    assert TraceOpStream(p)._scan()[3] is False           # every thread counts where threads are the key
    ev[4], ev[5] = ev[5], ev[4]                            # now the device goes back in time
    p.write_text(json.dumps(ev))
    assert TraceOpStream(p)._scan(device_only=True)[3] is False


@pytest.mark.shared_data
def test_real_torch_npu_timeline_is_read_in_file_order():
    from tests.conftest import PROFILES

    s = TraceOpStream(PROFILES / "mstt_fixtures" / "trace_view.json")
    assert s._scan(device_only=True)[3] is True   # its host threads are out of order, its device is not


def test_a_sort_spilled_to_disk_gives_the_report_of_the_sort_in_memory(tmp_path, monkeypatch):
    from npu_deploy.profiling import parse

    p = tmp_path / "trace_view.json"
    p.write_text(json.dumps(_shuffled_capture(400)))
    whole = analyze_profile(p).to_dict()
    runs = []
    real = parse._external_sort
    monkeypatch.setattr(parse, "_external_sort", lambda recs, run=None: real(recs, run=7) if not runs.append(1) else None)
    spilled = analyze_profile(p).to_dict()
    assert runs, "the timeline was not sorted"
    assert spilled == whole
    (k,) = [k for k in analyze_profile(p).conversions if k.category == "format"]
    assert k.count == 100 and all(i.prev_op.startswith("MatMul") and i.next_op.startswith("MatMul") for i in k.top)


def test_external_sort_against_sorted():
    import random

    from npu_deploy.profiling.parse import _external_sort

    rnd = random.Random(1)
    recs = [(str(rnd.randrange(3)), "5", rnd.random(), i, 1, 5, 2.5, "op", "AI_CORE", 5, "\x00absent")
            for i in range(1000)]
    for run in (1, 7, 999, 1000, 5000):
        assert list(_external_sort(iter(recs), run=run)) == sorted(recs, key=lambda r: r[:4])
    assert list(_external_sort(iter([]), run=3)) == []


def test_huge_duration_integer_is_a_skipped_row_not_a_crash(tmp_path, run_cli):
    # a 400-digit integer `dur`: float() of it overflows
    text = ('[{"ph":"M","name":"process_name","pid":1,"args":{"name":"Ascend Hardware"}},'
            '{"ph":"X","name":"MatMul_1","pid":1,"tid":1,"ts":"1","dur":10,"args":{"Task Type":"AI_CORE"}},'
            '{"ph":"X","name":"Add_1","pid":1,"tid":1,"ts":"20","dur":' + "9" * 400 +
            ',"args":{"Task Type":"AI_CORE"}}]')
    p = tmp_path / "trace_view.json"
    p.write_text(text)
    r = analyze_profile(p)
    assert r.compute_us == pytest.approx(10.0)
    assert any("skipped 1 row" in w and "line 3" in w for w in r.warnings)
    p.write_text(text.replace('"dur":10,', '"dur":' + "9" * 400 + ","))
    code, out, err = run_cli("profile", "analyze", p)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and str(p) in err


@pytest.mark.parametrize("text, what", [
    ('[{"ph":"X"}, ', "ends inside the event list"),
    ('[{"ph":"X"} {"ph":"M"}]', "expected ',' or ']' after event 1"),
    ('{"otherEvents": []}', "no event list"),
    ('[' * 50000 + ']' * 50000, "nested too deeply"),
    ('[{"a": ' + "1" * 5000 + '}]', "event 1"),
])
def test_malformed_timeline_is_one_line_exit_2(tmp_path, run_cli, text, what):
    p = tmp_path / "trace_view.json"
    p.write_text(text)
    with pytest.raises(ProfileError, match=what):
        analyze_profile(p)
    code, out, err = run_cli("profile", "analyze", p)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_stream_reader_matches_json_load_across_chunk_boundaries(tmp_path):
    ev = cann6_device(0, DEV0, label=True, iterations=3)
    ev.append({"ph": "X", "name": "név\u2028\"q\"", "dur": -1.5e-7, "ts": 12345678901234567890, "args": [None, True]})
    p = tmp_path / "t.json"
    for text in (json.dumps(ev), json.dumps({"meta": {"x": [1, "]"]}, "traceEvents": ev, "end": "}"}, indent=2),
                 "\ufeff" + json.dumps(ev, ensure_ascii=False)):       # a BOM, raw multi-byte UTF-8
        p.write_text(text, encoding="utf-8")
        for chunk in (1, 7, 64, 1 << 20):
            assert list(iter_events(str(p), chunk=chunk)) == ev


def test_one_event_larger_than_the_bound_is_refused(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('[{"name": "' + "x" * 5000 + '"}]')
    with pytest.raises(ProfileError, match="larger than 1,000 characters"):
        list(iter_events(str(p), chunk=64, max_element=1000))


def test_stream_reads_in_two_passes_without_holding_the_events(tmp_path, monkeypatch):
    # time-ordered per thread: yielded in file order, so nothing is sorted (no list of every event)
    ev = cann6_device(0, DEV0, label=True, iterations=50)
    p = tmp_path / "msprof_0_1.json"
    p.write_text(json.dumps(ev))
    s = TraceOpStream(p)
    procs, labels, threads, ordered = s._scan()
    assert ordered and threads[((4321 << 10) | (3 << 5), 100)] == "Step Trace(Model ID:2)"
    rows = list(s)
    assert len(rows) == 50 * (5 + 1)    # kernels + one collective per iteration


def test_cann6_steps_and_verdicts_in_text_html_and_json(cann6):
    from npu_deploy.profiling.analyze import ProfileReport
    from npu_deploy.profiling.report import render_html, render_text

    r = analyze_profile(cann6)
    text = render_text(r)
    assert "Steps (step-trace spans, not counted as compute)" in text
    assert any(line.split()[:3] == ["device_0", "FP_BP", "Time"] for line in text.splitlines())
    html = render_html(r)
    assert "<h2>Steps</h2>" in html and "<td>device_0</td><td class='num'>200 µs</td>" in html
    assert "<b>FLAGGED</b>" in html
    back = ProfileReport.load(r.to_json())
    assert back.steps == r.steps and back.devices == r.devices and not back
