"""SQLite exports built here from the documented schema (reference/msprof.md §7): interned strings in
STRING_IDS, times in ns, TASK ⨝ COMPUTE_TASK_INFO on globalTaskId, big communication ops apart."""

from __future__ import annotations

import sqlite3

import pytest

from npu_deploy.errors import ProfileError
from npu_deploy.profiling.analyze import analyze_profile
from npu_deploy.profiling.discover import discover


def build_db(path, *, block_col="blockNum", compute_table="COMPUTE_TASK_INFO"):
    con = sqlite3.connect(path)
    strings: dict[str, int] = {}

    def sid(v):
        if v not in strings:
            strings[v] = len(strings) + 1
        return strings[v]

    con.execute("CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("CREATE TABLE TASK (startNs INTEGER, endNs INTEGER, deviceId INTEGER, connectionId INTEGER, "
                "globalTaskId INTEGER PRIMARY KEY, globalPid INTEGER, taskType INTEGER, contextId INTEGER, "
                "streamId INTEGER, taskId INTEGER, modelId INTEGER)")
    con.execute(f'CREATE TABLE "{compute_table}" (name INTEGER, globalTaskId INTEGER PRIMARY KEY, '
                f"{block_col} INTEGER, mixBlockNum INTEGER, taskType INTEGER, opType INTEGER, inputFormats INTEGER, "
                "inputDataTypes INTEGER, inputShapes INTEGER, outputFormats INTEGER, outputDataTypes INTEGER, "
                "outputShapes INTEGER, attrInfo INTEGER)")
    con.execute("CREATE TABLE COMMUNICATION_OP (opName INTEGER, startNs INTEGER, endNs INTEGER, "
                "connectionId INTEGER, groupName INTEGER, opId INTEGER PRIMARY KEY, relay INTEGER, retry INTEGER, "
                "dataType INTEGER, algType INTEGER, count INTEGER, opType INTEGER, deviceId INTEGER)")
    ops = [  # name, op type, core, in fmt, out fmt, in shape, out shape, dur ns
        ("trans_TransData_0", "TransData", "AI_VECTOR_CORE", "NCHW", "NC1HWC0", '"32,3,224,224"',
         '"32,1,224,224,16"', 53_761),
        ("Conv2D_1", "Conv2D", "AI_CORE", "NC1HWC0;FRACTAL_Z", "NC1HWC0", '"32,1,224,224,16;1,4,16,16"',
         '"32,4,112,112,16"', 300_000),
        ("Cast_2", "Cast", "AI_VECTOR_CORE", "FORMAT_ND", "FORMAT_ND", '"32,10"', '"32,10"', 10_000),
        ("Add_3", "Add", "AI_VECTOR_CORE", "NULL", "NULL", '"32,10;32,10"', '"32,10"', 36_239),
    ]
    t = 1_698_220_811_392_354_694
    for gid, (name, typ, core, fi, fo, si, so, dur) in enumerate(ops, start=1):
        con.execute("INSERT INTO TASK VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (t, t + dur, 0, gid, gid, 1, sid("KERNEL_AIVEC"), 0, 2, gid, 4294967295))
        con.execute(f'INSERT INTO "{compute_table}" VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)',
                    (sid(name), gid, 32, 0, sid(core), sid(typ), sid(fi), sid("FLOAT"), sid(si), sid(fo),
                     sid("FLOAT"), sid(so), sid("")))
        t += dur + 1000
    # a task without compute info (an event record) must not count
    con.execute("INSERT INTO TASK VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (t, t + 999_000, 0, 99, 99, 1, sid("EVENT_RECORD"), 0, 2, 99, 4294967295))
    con.execute("INSERT INTO COMMUNICATION_OP (opName, startNs, endNs, opId, deviceId) VALUES (?,?,?,?,?)",
                (sid("hcom_allReduce__1_1"), t, t + 5_000_000, 1, 0))
    con.executemany("INSERT INTO STRING_IDS VALUES (?,?)", [(i, v) for v, i in strings.items()])
    con.commit()
    con.close()
    return path


def test_documented_joins_and_ns(tmp_path):
    db = build_db(tmp_path / "msprof_20250101120000.db")
    r = analyze_profile(db)
    assert r.compute_us == pytest.approx(400.0) and r.compute_ops == 4
    assert r.transdata_us == pytest.approx(53.761) and r.transdata_pct == pytest.approx(53.761 / 4)
    assert r.communication_us == pytest.approx(5000.0)
    (k,) = [c for c in r.conversions if c.category == "format"]
    assert (k.src, k.dst, k.shapes) == ("NCHW", "NC1HWC0", [["32,3,224,224", 1]])
    assert k.top[0].next_op == "Conv2D_1"


def test_old_renamed_compute_table(tmp_path):
    db = build_db(tmp_path / "msprof_0.db", block_col="block_dim", compute_table="_COMPUTE_TASK_INFO_old_20251014")
    r = analyze_profile(db)
    assert r.compute_us == pytest.approx(400.0)
    assert any("_COMPUTE_TASK_INFO_old_20251014" in w for w in r.warnings)


def test_db_found_in_prof_folder(tmp_path):
    root = tmp_path / "PROF_000001_20250101120000000_ABCDEFGH"
    root.mkdir()
    build_db(root / "msprof_20250101120000.db")
    assert [s.kind for s in discover(root).used] == ["db"]


def test_not_a_profiler_db(tmp_path):
    p = tmp_path / "msprof_1.db"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE x (a)")
    con.commit()
    con.close()
    with pytest.raises(ProfileError, match="TASK"):
        analyze_profile(p)


def test_truncated_db(tmp_path):
    good = build_db(tmp_path / "good.db")
    bad = tmp_path / "msprof_2.db"
    bad.write_bytes(good.read_bytes()[:1500])
    with pytest.raises(ProfileError):
        analyze_profile(bad)


def test_db_and_its_csv_export_are_the_same_data(tmp_path):
    # msprof writes the same tasks to msprof_{ts}.db (ns integers) and op_summary_{ts}.csv (µs, 3 decimals):
    # the fingerprint compares them to the precision of the export and reads the csv only
    from tests.profiling.helpers import csv_text, op, td

    root = tmp_path / "PROF_000001_20250101120000000_ABCDEF"
    root.mkdir()
    build_db(root / "msprof_20250101120000.db")
    rows = [td("trans_TransData_0", "NCHW", "NC1HWC0", "32,3,224,224", "32,1,224,224,16", "53.761"),
            op("Conv2D_1", "Conv2D", "AI_CORE", "300.000"), op("Cast_2", "Cast", "AI_VECTOR_CORE", "10.000"),
            op("Add_3", "Add", "AI_VECTOR_CORE", "36.239"),
            # the big communication op, a COMMUNICATION row in op_summary (msprof.md §3.1)
            op("hcom_allReduce__1_1", "N/A", "COMMUNICATION", "5000.000", stream="N/A")]
    out = root / "mindstudio_profiler_output" / "op_summary_20250101120000.csv"
    out.parent.mkdir()
    out.write_text(csv_text(rows, start=1_698_220_811_392_354.694))
    d = discover(root)
    (cap,) = d.captures
    assert cap.used.kind == "op_summary"
    (db,) = cap.unused
    assert db.kind == "db" and db.reason == "same data as op_summary_20250101120000.csv"
    # one task more in the csv: no longer the same data, and still one source read
    out.write_text(csv_text(rows + [op("Add_4", "Add", "AI_VECTOR_CORE", "1.000")],
                            start=1_698_220_811_392_354.694))
    (db,) = discover(root).captures[0].unused
    assert db.reason.startswith("overlaps op_summary_20250101120000.csv")
    r = analyze_profile(root)
    assert r.compute_us == pytest.approx(401.0) and r.communication_us == pytest.approx(5000.0)
