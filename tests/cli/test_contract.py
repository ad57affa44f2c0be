"""The contract for every input (issue 23), case by case, through the real entry point.

Each case is one of the inputs a hostile or unlucky user gave: an output that would overwrite a file
the command reads (found or named as configuration, not only the files on the command line), a file
that used to end in exit 4 (a traceback), dumps compared against the wrong model, a device or FIFO
given as a model, a layout rank that cannot be. Every refusal is exit 2 with exactly one stderr line
``npu-deploy: error: ...``, no traceback, and every input byte-for-byte as it was.

The crafted bundles are re-assembled here from a real converted bundle with the header layout of
``docs`` (magic, version, six offsets/lengths, three SHA-256, size, then the header's own SHA-256),
so their checksums are valid: only the contents are wrong.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import SHARED_DATA, write_example

_HEADER = struct.Struct("<12sI6Q32s32s32sQ")
PT = SHARED_DATA / "timings_910B" / "cnn_level1_rank1_ascend_pt"
CLUSTER_RANKS = ("cnn_level2_rank0_ascend_pt", "cnn_level2_rank1_ascend_pt")
MSPROF_DB = SHARED_DATA / "profiles" / "msinsight_fixtures" / "msprof_0.db"
TRACE = SHARED_DATA / "profiles" / "mstt_fixtures" / "trace_view.json"


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(code: int, stderr: str, *words: str) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("npu-deploy: error: "), stderr
    assert "Traceback" not in stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


# ------------------------------------------------------------------------------------------ overwrites
@pytest.fixture
def capture(tmp_path) -> Path:
    """A copy of a real torch_npu capture (level 1, rank 1 of a 910B run), with a timeline beside it."""
    dst = tmp_path / "cap_ascend_pt"
    shutil.copytree(PT, dst)
    shutil.copy(TRACE, dst / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
    return dst


@pytest.mark.shared_data
@pytest.mark.parametrize("opt,target", [
    ("--json", "ASCEND_PROFILER_OUTPUT/kernel_details.csv"),
    ("--html", "ASCEND_PROFILER_OUTPUT/op_statistic.csv"),
    ("--html", "ASCEND_PROFILER_OUTPUT/trace_view.json"),
    ("--json", "profiler_info_1.json"),
    ("--json", "ASCEND_PROFILER_OUTPUT/new_report.json"),   # a new file in the capture: read next time
])
def test_profile_outputs_never_land_in_the_capture_being_read(capture, run_cli, opt, target):
    before = _digest(capture)
    code, _, err = run_cli("profile", "analyze", capture, opt, capture / target)
    _refused(code, err, "inside", opt)
    assert _digest(capture) == before


@pytest.mark.shared_data
def test_profile_json_over_the_msprof_db_it_reads(tmp_path, run_cli):
    prof = tmp_path / "PROF_000001"
    prof.mkdir()
    shutil.copy(MSPROF_DB, prof / "msprof_0.db")
    before = _digest(prof)
    code, _, err = run_cli("profile", "analyze", prof, "--json", prof / "msprof_0.db")
    _refused(code, err)
    code, _, err = run_cli("profile", "analyze", prof / "msprof_0.db", "--json", prof / "msprof_0.db")
    _refused(code, err, "itself")
    assert _digest(prof) == before


@pytest.mark.shared_data
def test_cluster_json_into_a_rank_folder(tmp_path, run_cli):
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    for r in CLUSTER_RANKS:
        shutil.copytree(SHARED_DATA / "timings_910B" / r, cluster / r)
    before = _digest(cluster)
    rank = cluster / CLUSTER_RANKS[0] / "ASCEND_PROFILER_OUTPUT"
    for target in (rank / "kernel_details.csv", rank / "cluster.json"):
        code, _, err = run_cli("profile", "analyze", cluster, "--cluster", "--json", target)
        _refused(code, err)
    assert _digest(cluster) == before
    # outside the folder read it works, and writes there
    code, out, err = run_cli("profile", "analyze", cluster, "--cluster", "--json", tmp_path / "c.json")
    assert code in (0, 1), err
    assert json.loads((tmp_path / "c.json").read_text())


@pytest.fixture
def aipp_model(tmp_path):
    m = write_example(tmp_path / "m.onnx")
    cfg = tmp_path / "a.cfg"
    cfg.write_text("aipp_op {\n  aipp_mode : static\n  input_format : RGB888_U8\n  src_image_size_w : 64\n"
                   "  src_image_size_h : 64\n}\n")
    keep = tmp_path / "k.cfg"
    keep.write_text("OpType::Conv\n")
    return m, cfg, keep


@pytest.mark.parametrize("args", [
    ("-o", "{cfg}", "--insert-op-conf", "{cfg}"),
    ("-o", "{w}/m.bundle", "--report", "{cfg}", "--insert-op-conf", "{cfg}"),
    ("-o", "{keep}", "--keep-dtype", "{keep}"),
    ("-o", "{w}/m.bundle", "--report", "{keep}", "--keep-dtype", "{keep}"),
])
def test_convert_never_writes_over_its_config_files(aipp_model, run_cli, args):
    m, cfg, keep = aipp_model
    before = {p: p.read_bytes() for p in (m, cfg, keep)}
    code, _, err = run_cli("convert", m, *[a.format(cfg=cfg, keep=keep, w=m.parent) for a in args])
    _refused(code, err, "itself")
    assert {p: p.read_bytes() for p in (m, cfg, keep)} == before
    assert not (m.parent / "m.bundle").exists()


@pytest.fixture
def dump_dir(tmp_path):
    """A real emulator dump of the README example (``run --dump``), with its inputs.npz."""
    from npu_deploy.cli.main import main

    m = write_example(tmp_path / "m.onnx")
    assert main(["convert", str(m), "-o", str(tmp_path / "m.bundle"), "-q"]) == 0
    x = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    dd = tmp_path / "dd"
    assert main(["run", str(tmp_path / "m.bundle"), "--input", f"x={tmp_path / 'x.npy'}", "--loop", "1",
                 "--dump", str(dd)]) == 0
    return m, dd


def test_debug_compare_never_writes_into_the_dumps(dump_dir, run_cli):
    m, dd = dump_dir
    before = _digest(dd)
    files = [p for p in dd.rglob("*") if p.is_file()]
    inputs = next(p for p in files if p.name == "inputs.npz")
    a_dump = next(p for p in files if p.suffix not in (".npz", ".csv", ".json"))
    for opt, target in (("--csv", inputs), ("--csv", a_dump), ("--json", dd / "mapping.csv"),
                        ("--html", inputs.parent / "report.html")):
        code, _, err = run_cli("debug", "compare", m, dd, opt, target)
        _refused(code, err, "inside")
    # one dump file given: its folder (inputs.npz, mapping.csv, the other dumps) is read with it
    code, _, err = run_cli("debug", "compare", m, a_dump, "--csv", inputs.parent / "inputs.npz")
    _refused(code, err)
    assert _digest(dd) == before


def test_run_and_compare_never_write_over_what_they_read(good_bundle, tmp_path, run_cli):
    m = good_bundle.parent / "m.onnx"
    src = tmp_path / "in"
    src.mkdir()
    np.save(src / "x.npy", np.random.default_rng(3).random((1, 3, 64, 64), dtype=np.float32))
    before = _digest(src)
    # outputs of one run inside the folder its inputs come from: the next run would read them
    code, _, err = run_cli("run", good_bundle, "--input-dir", src, "--loop", "1", "--output", src / "out")
    _refused(code, err, "inside")
    inputs = tmp_path / "feeds.npz"
    np.savez(inputs, x=np.load(src / "x.npy"))
    saved = inputs.read_bytes()
    code, _, err = run_cli("compare", m, good_bundle, "--load-inputs", inputs, "--save-inputs", inputs)
    _refused(code, err, "itself")
    assert _digest(src) == before and inputs.read_bytes() == saved


# ------------------------------------------------------------------------------------------ exit 4 → 2
def _conv_with_lying_initializer(path: Path) -> Path:
    """A Conv whose weight says dims (32,3,3,1) and holds 864 floats: onnx.checker passes it."""
    w = numpy_helper.from_array(np.zeros((32, 3, 3, 3), np.float32), "w")
    del w.dims[:]
    w.dims.extend([32, 3, 3, 1])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 6, 8])
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)  # the case is real: the checker does not see it
    onnx.save(m, path)
    return path


def test_initializer_dims_that_disagree_with_their_data(tmp_path, run_cli):
    m = _conv_with_lying_initializer(tmp_path / "lie.onnx")
    code, _, err = run_cli("convert", m, "-o", tmp_path / "lie.bundle")
    _refused(code, err, "'w'", "32,3,3,1", "288 values", "3456 bytes")
    assert not (tmp_path / "lie.bundle").exists()
    code, out, err = run_cli("inspect", m)
    assert code == 1 and "'w'" in out and "holds" in out, (code, out, err)


@pytest.mark.shared_data
def test_a_sqlite_profile_with_a_damaged_schema(tmp_path, run_cli):
    raw = MSPROF_DB.read_bytes()
    db = tmp_path / "msprof_0.db"
    start = raw.find(b"CREATE TABLE")
    for at in range(start, start + 400):  # the first byte of sqlite_master's text that breaks the stdlib
        data = bytearray(raw)
        data[at] = 0xFF
        db.write_bytes(bytes(data))
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        except UnicodeDecodeError:
            break
        except sqlite3.DatabaseError:
            pass
        finally:
            con.close()
    else:
        pytest.fail("no single byte in sqlite_master gives the stdlib's UnicodeDecodeError")
    code, _, err = run_cli("profile", "analyze", db)
    _refused(code, err, "SQLite")


def _sections(path: Path) -> tuple[bytes, onnx.ModelProto, dict]:
    raw = path.read_bytes()
    (_, _, blob_off, blob_len, graph_off, graph_len, man_off, man_len, *_rest) = _HEADER.unpack_from(raw)
    graph = onnx.ModelProto.FromString(raw[graph_off:graph_off + graph_len])
    return raw[blob_off:blob_off + blob_len], graph, json.loads(raw[man_off:man_off + man_len])


def _assemble(path: Path, blob: bytes, graph: onnx.ModelProto, manifest: dict | bytes) -> Path:
    """A bundle file with valid checksums around whatever sections it is given."""
    g = graph.SerializeToString()
    man = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    blob_off, graph_off = 256, 256 + len(blob)
    man_off = graph_off + len(g)
    head = _HEADER.pack(b"\x89NPUBUNDL\r\n\x1a", 1, blob_off, len(blob), graph_off, len(g), man_off, len(man),
                        hashlib.sha256(blob).digest(), hashlib.sha256(g).digest(), hashlib.sha256(man).digest(),
                        man_off + len(man))
    head += hashlib.sha256(head).digest()
    path.write_bytes(head.ljust(256, b"\0") + blob + g + man)
    return path


def _bad_shape(blob, graph, man):
    man["inputs"][0]["shape"] = [1, 3, 2 ** 40, 2 ** 40]
    return blob, graph, man


def _deep_manifest(blob, graph, man):
    text = json.dumps(man)
    deep = "[" * 100_000 + "]" * 100_000
    return blob, graph, (text[:-1] + ', "extra": ' + deep + "}").encode()


def _bad_elem_type(blob, graph, man):
    vi = graph.graph.value_info.add()
    vi.name = graph.graph.node[0].output[0]
    vi.type.tensor_type.elem_type = 2304
    return blob, graph, man


def _orphan_output(blob, graph, man):
    out = graph.graph.output.add()
    out.CopyFrom(graph.graph.output[0])
    out.name = "nobody_makes_me"
    man["outputs"].append(dict(man["outputs"][0], name="nobody_makes_me"))
    return blob, graph, man


def _object_dtype(blob, graph, man):
    man["inputs"][0]["dtype"] = "object"
    return blob, graph, man


@pytest.fixture(scope="module")
def good_bundle(tmp_path_factory):
    from npu_deploy.cli.main import main

    d = tmp_path_factory.mktemp("good")
    write_example(d / "m.onnx")
    assert main(["convert", str(d / "m.onnx"), "-o", str(d / "m.bundle"), "-q"]) == 0
    return d / "m.bundle"


@pytest.mark.parametrize("craft,words", [
    (_bad_shape, "bytes"), (_deep_manifest, "nests deeper"), (_bad_elem_type, "2304"),
    (_orphan_output, "no producer"), (_object_dtype, "object"),
], ids=["shape_2_40", "nested_100000", "elem_type_2304", "output_without_producer", "dtype_object"])
def test_crafted_bundles_with_valid_checksums(good_bundle, tmp_path, run_cli, craft, words):
    blob, graph, man = _sections(good_bundle)
    bad = _assemble(tmp_path / "bad.bundle", *craft(blob, graph, man))
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 3, 64, 64), np.float32))
    code, out, err = run_cli("run", bad, "--loop", "1", "--output", tmp_path / "out")
    _refused(code, err, words)
    assert not (tmp_path / "out").exists()
    code, out, err = run_cli("inspect", bad)
    if craft is _deep_manifest:  # cannot even be parsed: refused as a damaged file
        _refused(code, err, words)
    else:
        assert code == 1 and words in out, (code, out, err)


def test_the_good_bundle_passes_the_same_checks(good_bundle, run_cli):
    blob, graph, man = _sections(good_bundle)
    code, out, err = run_cli("inspect", good_bundle)
    assert code == 0, out + err


# ------------------------------------------------------------------------------------------ wrong model
def _other_model(path: Path) -> Path:
    """Another model that shares the example's input name and shape: x -> Relu -> Sigmoid."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])
    y = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3, 64, 64])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="other_relu"),
                           helper.make_node("Sigmoid", ["r"], ["z"], name="other_sigmoid")], "other", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def test_debug_compare_of_dumps_against_another_model_is_refused_not_passed(dump_dir, tmp_path, run_cli):
    m, dd = dump_dir
    code, out, err = run_cli("debug", "compare", m, dd)  # the right model: compared
    assert code in (0, 1) and ("PASS" in out or "FAIL" in out), err
    other = _other_model(tmp_path / "other.onnx")
    code, out, err = run_cli("debug", "compare", other, dd)
    _refused(code, err, "dumps and model do not match")
    assert "PASS" not in out


# ------------------------------------------------------------------------------------------ smaller
def test_inspect_refuses_devices_and_fifos(tmp_path, run_cli):
    link = tmp_path / "zero.onnx"
    link.symlink_to("/dev/zero")
    code, _, err = run_cli("inspect", link)
    _refused(code, err, "not a regular file")
    code, _, err = run_cli("convert", link, "-o", tmp_path / "z.bundle")
    _refused(code, err, "not a regular file")
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    code, _, err = run_cli("inspect", fifo)
    _refused(code, err, "not a regular file")


def test_a_non_utf8_file_name_is_read(tmp_path, run_cli):
    src = write_example(tmp_path / "m.onnx")
    odd = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/m\xff.onnx"))
    os.rename(src, odd)
    code, out, err = run_cli("inspect", odd)
    assert code == 0, err
    assert "Conv" in out


def test_a_non_utf8_file_name_converts_and_runs(tmp_path, run_cli):
    """onnx's checker binding takes only UTF-8 names: the checker sees the file through a plain-named
    link, and the manifest keeps the name with the odd byte escaped."""
    import json

    from npu_deploy.converters.files.bundle import read_bundle

    src = write_example(tmp_path / "m.onnx")
    odd = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/m\xff.onnx"))
    os.rename(src, odd)
    code, _, err = run_cli("convert", odd, "-o", tmp_path / "m.bundle", "--backend", "builtin")
    assert code == 0, err
    with read_bundle(tmp_path / "m.bundle") as b:
        assert b.manifest["source_model"]["name"] == "m\\xff.onnx"
        json.dumps(b.manifest).encode("utf-8")
    code, _, err = run_cli("run", tmp_path / "m.bundle", "--loop", "2")
    assert code == 0, err


def test_layout_rank_that_the_format_cannot_hold(run_cli):
    code, _, err = run_cli("layout", "info", "NC1HWC0", "--shape", "1,2")
    _refused(code, err, "rank")


def test_the_next_run_dump_removes_what_a_killed_one_left(dump_dir, tmp_path, run_cli):
    import subprocess
    import sys

    m, dd = dump_dir
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(child.stdout)  # a pid that ran and is gone: as a writer killed with SIGKILL
    killed = dd / "20000101000000" / "0" / "m" / "1" / "0"
    killed.mkdir(parents=True)
    (killed / f".Conv.conv1.2.0.1.{dead}.abcdefgh.part").write_bytes(b"half a dump")
    code, _, err = run_cli("run", m.parent / "m.bundle", "--input", f"x={m.parent / 'x.npy'}", "--loop", "1",
                           "--dump", dd)
    assert code == 0, err
    assert not (dd / "20000101000000").exists()
    assert not list(dd.rglob("*.part"))


# ------------------------------------------------------------------------------------------ fuzz
def _paths(obj, prefix=()):
    """Every (path, value) in a parsed manifest, ``weights`` left out (checked against the blob)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if prefix == () and k in ("weights", "schema", "schema_version"):
                continue
            yield prefix + (k,), v
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield prefix + (i,), v
            yield from _paths(v, prefix + (i,))


_ODD = [None, -1, 0, 2 ** 63, -2 ** 63, 1e308, "", "object", "float64", "NC1HWC0", "x" * 300, [], {},
        [[[[]]]], [2 ** 40, 2 ** 40], {"name": "x"}, True]


@pytest.mark.slow
def test_manifest_and_graph_mutations_never_end_in_a_traceback(good_bundle, tmp_path):
    """Structural mutations with valid checksums (one manifest value replaced, or one graph type / name
    changed): ``run`` and ``inspect`` end in a documented exit code, never 4."""
    import contextlib
    import io
    import random

    from npu_deploy.cli.main import main

    blob, graph, man = _sections(good_bundle)
    paths = list(_paths(man))
    rng = random.Random(23)
    codes = []
    for case in range(60):
        m2 = json.loads(json.dumps(man))
        g2 = onnx.ModelProto.FromString(graph.SerializeToString())
        if case % 3 == 2:  # the graph: an element type, an output name, a node input
            vis = list(g2.graph.input) + list(g2.graph.output) + list(g2.graph.value_info)
            choice = rng.randrange(3)
            if choice == 0 and vis:
                rng.choice(vis).type.tensor_type.elem_type = rng.choice([0, 17, 25, 999, 2304])
            elif choice == 1:
                g2.graph.output[0].name = rng.choice(["", "ghost", g2.graph.input[0].name])
            else:
                node = rng.choice(list(g2.graph.node))
                if node.input:
                    node.input[rng.randrange(len(node.input))] = "ghost"
        else:
            path, _ = rng.choice(paths)
            where = m2
            for k in path[:-1]:
                where = where[k]
            where[path[-1]] = rng.choice(_ODD)
        bad = _assemble(tmp_path / f"f{case}.bundle", blob, g2, m2)
        for argv in (["run", str(bad), "--loop", "1"], ["inspect", str(bad)]):
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                code = main(argv)
            assert code in (0, 1, 2, 3), (case, argv[0], err.getvalue())
            assert "Traceback" not in err.getvalue(), (case, argv[0], err.getvalue())
            codes.append(code)
    assert 2 in codes  # the mutations were seen
