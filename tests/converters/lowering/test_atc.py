"""ATC driver against the stand-in ``tests/standins/atc``, which enforces ATC's documented contract
(``shared/reference/atc-acl-om.md`` §1). Expected argv strings are written from the reference's
examples, not from the code under test."""

from __future__ import annotations

import json
import os
import stat
import struct
import time
from pathlib import Path

import onnx
import onnx.helper as h
import pytest

from npu_deploy.converters.lowering.atc import (ATC_FLAGS, HINTS, AtcResult, atc_convert, build_atc_argv,
                                       find_atc, parse_atc_errors, require_atc, run_atc)
from npu_deploy.errors import AtcError, DependencyError, InputError
from tests.conftest import TEST_TIMEOUT

STANDIN = Path(__file__).resolve().parents[2] / "standins" / "atc"


@pytest.fixture(autouse=True)
def _clean_standin_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("ATC_STANDIN_"):
            monkeypatch.delenv(k)


def make_model(path: Path, *, opset: int = 17, inputs=(("x", ["n", 3, 8, 8]),)) -> Path:
    nodes, ins, outs = [], [], []
    for i, (name, dims) in enumerate(inputs):
        nodes.append(h.make_node("Relu", [name], [f"y{i}"], name=f"relu_{i}"))
        ins.append(h.make_tensor_value_info(name, 1, dims))
        outs.append(h.make_tensor_value_info(f"y{i}", 1, dims))
    m = h.make_model(h.make_graph(nodes, "g", ins, outs), opset_imports=[h.make_opsetid("", opset)])
    onnx.save(m, path)
    return path


@pytest.fixture
def model(tmp_path) -> Path:
    return make_model(tmp_path / "m.onnx")


def read_header(path) -> tuple[bytes, str]:
    data = Path(path).read_bytes()
    assert len(data) >= 256
    return data[:4], data[84:116].split(b"\0")[0].decode()


# ------------------------------------------------------------------------------------------------
# argv building: every flag in the table

def _argv(**kw):
    base = dict(soc="Ascend310P3", atc="atc", check_files=False, log=None)
    base.update(kw)
    return build_atc_argv("m.onnx", "out/m", **base)


FLAG_CASES = {
    # table key: (build kwargs, expected argument) — values from the reference's ATC examples
    "model": ({}, "--model=m.onnx"),
    "framework": ({}, "--framework=5"),
    "output": ({}, "--output=out/m"),
    "soc": ({}, "--soc_version=Ascend310P3"),
    "input_shapes": ({"input_shapes": {"data": (-1, 3, 416, 416), "img_info": (-1, 4)},
                      "dynamic_batch": [1, 2, 4, 8]},
                     "--input_shape=data:-1,3,416,416;img_info:-1,4"),
    "input_format": ({"input_format": "ncdhw"}, "--input_format=NCDHW"),
    "dynamic_batch": ({"input_shapes": {"data": (-1, 3, 416, 416), "img_info": (-1, 4)},
                       "dynamic_batch": [1, 2, 4, 8]}, "--dynamic_batch_size=1,2,4,8"),
    "dynamic_image_size": ({"input_shapes": {"data": (1, 3, -1, -1)}, "input_format": "NCHW",
                            "dynamic_image_size": [(416, 416), (832, 832), (1248, 1248)]},
                           "--dynamic_image_size=416,416;832,832;1248,1248"),
    "dynamic_dims": ({"input_shapes": {"Placeholder": (-1, -1, -1, 3)},
                      "dynamic_dims": [[1, 200, 200], [2, 200, 200], [1, 224, 224], [2, 224, 224]]},
                     "--dynamic_dims=1,200,200;2,200,200;1,224,224;2,224,224"),
    "precision_mode": ({"precision_mode": "allow_mix_precision"},
                       "--precision_mode=allow_mix_precision"),
    "keep_dtype": ({"keep_dtype": "keep.cfg"}, "--keep_dtype=keep.cfg"),
    "insert_op_conf": ({"insert_op_conf": "aipp.cfg"}, "--insert_op_conf=aipp.cfg"),
    "log": ({"log": "info"}, "--log=info"),
}


def test_flag_cases_cover_the_table():
    assert set(FLAG_CASES) == set(ATC_FLAGS)


@pytest.mark.parametrize("key", sorted(FLAG_CASES))
def test_each_flag_renders_as_documented(key):
    kwargs, expected = FLAG_CASES[key]
    argv = _argv(**kwargs)
    assert argv[0] == "atc"
    assert expected in argv
    assert all(a.startswith("--") and "=" in a for a in argv[1:])
    assert len({a.split("=")[0] for a in argv[1:]}) == len(argv) - 1


def test_dynamic_dims_sets_nd_and_output_drops_om_suffix():
    argv = build_atc_argv("m.onnx", "out/m.om", soc="Ascend310P3", check_files=False,
                          input_shapes={"ids": (1, -1)}, dynamic_dims=[[128], [256]])
    assert "--input_format=ND" in argv and "--output=out/m" in argv
    assert "--log=error" in argv   # default: ATC writes its error log


def test_keep_dtype_list_is_written_to_a_file(tmp_path):
    argv = build_atc_argv("m.onnx", "m", soc="Ascend310P3", check_files=False, workdir=tmp_path,
                          keep_dtype=["/layer1/Softmax", "OpType::LayerNorm"])
    arg = next(a for a in argv if a.startswith("--keep_dtype="))
    path = Path(arg.split("=", 1)[1])
    assert path.parent == tmp_path
    assert path.read_text().splitlines() == ["/layer1/Softmax", "OpType::LayerNorm"]
    with pytest.raises(InputError, match="one line"):
        build_atc_argv("m.onnx", "m", soc="Ascend310P3", check_files=False, workdir=tmp_path,
                       keep_dtype=["a\nb"])


def test_extra_args_pass_through_verbatim():
    extras = ["--out_nodes=a:0;b:0", "--op_debug_level=1", "--fusion_switch_file=my file.cfg"]
    argv = _argv(extra_args=extras)
    assert argv[-3:] == extras


@pytest.mark.parametrize("kwargs, match", [
    ({"dynamic_batch": [1, 2], "dynamic_dims": [[1], [2]], "input_shapes": {"x": (-1, 3)}},
     "only one of"),
    ({"dynamic_batch": [1, 2], "input_shapes": {"x": (1, 3)}}, "-1 as the first dimension"),
    ({"dynamic_batch": [1, 2]}, "-1 as the first dimension"),
    ({"dynamic_batch": [4], "input_shapes": {"x": (-1, 3)}}, "between 2 and 100"),
    ({"dynamic_batch": list(range(1, 102)), "input_shapes": {"x": (-1, 3)}}, "between 2 and 100"),
    ({"dynamic_batch": [1, 0], "input_shapes": {"x": (-1, 3)}}, "positive"),
    ({"dynamic_batch": [1, 2], "input_shapes": {"x": (-1, -1)}}, "beyond the batch"),
    ({"dynamic_dims": [[1], [2]], "input_shapes": {"x": (1, -1)}, "insert_op_conf": "a.cfg"},
     "AIPP"),
    ({"dynamic_dims": [[1], [2]], "input_shapes": {"x": (1, -1)}, "input_format": "NCHW"}, "ND"),
    ({"dynamic_dims": [[1, 2], [2, 3]], "input_shapes": {"x": (1, -1)}}, "one value per -1"),
    ({"dynamic_dims": [[1], [2]], "input_shapes": {"x": (1, 4)}}, "needs -1"),
    ({"dynamic_image_size": [(8, 8), (16, 16)], "input_shapes": {"x": (1, 3, 8, 8)}}, "-1,-1"),
    ({"dynamic_image_size": [(8, 8), (16, 16)], "input_shapes": {"x": (1, 3, -1, -1)},
      "input_format": "ND"}, "NCHW"),
    ({"dynamic_image_size": [(8,), (16,)], "input_shapes": {"x": (1, 3, -1, -1)}}, "pairs"),
    ({"insert_op_conf": "a.cfg", "input_format": "ND"}, "NCHW or NHWC"),
    ({"input_format": "NHWC"}, "not accepted"),
    ({"precision_mode": "fp8_please"}, "not an ATC precision mode"),
    ({"log": "verbose"}, "log level"),
    ({"soc": ""}, "SoC"),
    ({"input_shapes": {"x": (1, -2)}}, "negative"),
    ({"extra_args": ["--soc_version=Ascend910B"]}, "repeats --soc_version"),
    ({"extra_args": ["--log=debug"], "log": "error"}, "repeats --log"),
    ({"extra_args": ["op_debug_level=1"]}, "--name=value"),
    ({"extra_args": ["--op_debug_level", "1"]}, "--name=value"),
    ({"extra_args": ["--precision_mode_v2=fp16"], "precision_mode": "force_fp16"},
     "precision_mode_v2"),
    ({"extra_args": ["--input_shape_range=x:[1~4,3]"], "dynamic_batch": [1, 2],
      "input_shapes": {"x": (-1, 3)}}, "input_shape_range"),
])
def test_documented_exclusions_are_input_errors(kwargs, match):
    with pytest.raises(InputError, match=match) as info:
        _argv(**kwargs)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_missing_files_are_input_errors(tmp_path, model):
    with pytest.raises(InputError, match="does not exist"):
        build_atc_argv(tmp_path / "nope.onnx", tmp_path / "o", soc="Ascend310P3")
    with pytest.raises(InputError, match="output folder"):
        build_atc_argv(model, tmp_path / "no" / "o", soc="Ascend310P3")
    with pytest.raises(InputError, match="AIPP config"):
        build_atc_argv(model, tmp_path / "o", soc="Ascend310P3", insert_op_conf=tmp_path / "a.cfg")
    with pytest.raises(InputError, match="keep_dtype file"):
        build_atc_argv(model, tmp_path / "o", soc="Ascend310P3", keep_dtype=tmp_path / "k.cfg")


# ------------------------------------------------------------------------------------------------
# Running the stand-in

def run(tmp_path, model, *, mode=None, monkeypatch=None, timeout=60, **kw):
    if mode is not None:
        monkeypatch.setenv("ATC_STANDIN_MODE", mode)
    argv = build_atc_argv(model, tmp_path / "out.om", soc=kw.pop("soc", "Ascend310P3"),
                          atc=STANDIN, **kw)
    return run_atc(argv, timeout=timeout, log_dir=tmp_path / "logs")


def test_success_writes_om_and_records_progress(tmp_path, model, monkeypatch):
    monkeypatch.setenv("ATC_STANDIN_MODE", "dots")
    seen, ticks = [], []
    argv = build_atc_argv(model, tmp_path / "out.om", soc="Ascend310P3", atc=STANDIN,
                          input_shapes={"x": (-1, 3, 8, 8)}, dynamic_batch=[1, 2, 4])
    r = run_atc(argv, on_line=lambda line, t: seen.append((line, t)), on_tick=ticks.append,
                log_dir=tmp_path / "logs")
    assert isinstance(r, AtcResult) and r and r.returncode == 0
    assert r.om_path == str(tmp_path / "out.om")
    assert read_header(r.om_path) == (b"IMOD", "out")
    lines = [s for s, _ in seen]
    assert lines[0] == "ATC start working now, please wait for a moment."
    assert "ATC run success, welcome to the next use." in lines
    assert "....." in lines                                   # TBE dots arrive as one line
    times = [t for _, t in seen]
    assert times == sorted(times) and r.elapsed_s >= times[-1]
    assert r.log_path and Path(r.log_path).is_file() and "plog-" in r.log_path
    assert "ATC wrote" in r.verdict()
    assert json.loads(r.to_json())["om_path"] == r.om_path


def test_suffixed_om_is_found_by_glob(tmp_path, model, monkeypatch):
    r = run(tmp_path, model, mode="suffixed", monkeypatch=monkeypatch)
    assert r.om_path.endswith("out_linux_x86_64.om")


def test_warnings_are_collected(tmp_path, model, monkeypatch):
    r = run(tmp_path, model, mode="warn", monkeypatch=monkeypatch)
    assert r.warnings == ["W11001"]


def test_argv_reaches_atc_unchanged_without_a_shell(tmp_path, model, monkeypatch):
    record = tmp_path / "argv.json"
    monkeypatch.setenv("ATC_STANDIN_ARGV", str(record))
    extras = ["--out_nodes=y0:0;y0:0", "--fusion_switch_file=" + str(model), "--op_debug_level=0"]
    argv = build_atc_argv(model, tmp_path / "o", soc="Ascend310P3", atc=STANDIN,
                          input_shapes={"x": (1, 3, 8, 8)}, extra_args=extras)
    run_atc(argv, log_dir=tmp_path / "logs")
    got = json.loads(record.read_text())[1:]
    expected = argv[1:]
    # everything verbatim except --output, which points into a private staging folder next to the
    # destination with the same basename (so the model name in the .om header is unchanged)
    out_i = next(i for i, a in enumerate(expected) if a.startswith("--output="))
    assert got[:out_i] + got[out_i + 1:] == expected[:out_i] + expected[out_i + 1:]
    staged = Path(got[out_i].split("=", 1)[1])
    assert staged.name == "o" and staged.parent.parent == tmp_path
    assert staged.parent.name.startswith(".atc-") and not staged.parent.exists()


@pytest.mark.parametrize("mode", ["fail_EZ3003", "bad_magic", pytest.param("hang", marks=pytest.mark.slow)])
def test_failures_leave_no_output_and_keep_an_existing_om(tmp_path, model, monkeypatch, mode):
    old = tmp_path / "out.om"
    old.write_bytes(b"IMOD previous model")
    with pytest.raises(AtcError):
        run(tmp_path, model, mode=mode, monkeypatch=monkeypatch, timeout=1.5)
    assert old.read_bytes() == b"IMOD previous model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "m.onnx", "out.om"]


@pytest.mark.parametrize("code", ["E19010", "EZ9010", "EZ3002", "EZ3003", "EZ0501", "E40021",
                                  "E19999", "E13023"])
def test_error_blocks_become_structured_errors(tmp_path, model, monkeypatch, code):
    monkeypatch.setenv("ATC_STANDIN_NODE", "/backbone/conv1/Conv")
    monkeypatch.setenv("ATC_STANDIN_OPTYPE", "Conv")
    with pytest.raises(AtcError) as info:
        run(tmp_path, model, mode=f"fail_{code}", monkeypatch=monkeypatch)
    e = info.value
    assert e.exit_code == 3 and e.returncode == 255
    assert e.codes == [code]
    d = e.details[0]
    assert d["code"] == code and d["message"]
    assert d["traceback"] and "build graph failed" in d["traceback"][0]
    if code != "E19999":
        assert d["possible_cause"] and d["solution"]
    assert e.hint.startswith(HINTS[code])
    assert e.log_path and Path(e.log_path).is_file()
    assert code in Path(e.log_path).read_text()
    text = str(e)
    assert "\n" not in text and code in text and str(model) in text
    expected_node = {"E19010": "/backbone/conv1/Conv", "EZ9010": "/backbone/conv1/Conv",
                     "EZ3002": None, "EZ3003": "/backbone/conv1/Conv",
                     "EZ0501": "/backbone/conv1/Conv", "E40021": "/backbone/conv1/Conv",
                     "E19999": None, "E13023": None}[code]
    assert d["node"] == expected_node
    if code not in ("E19999", "E13023"):
        assert d["op_type"] == "Conv" and "op Conv" in text
    if code in ("E19010", "EZ9010"):
        assert d["opset"] == 17 and "opset" in e.hint


def test_old_format_without_pid(tmp_path, model, monkeypatch):
    monkeypatch.setenv("ATC_STANDIN_OLD_FORMAT", "1")
    with pytest.raises(AtcError) as info:
        run(tmp_path, model, mode="fail_EZ3003", monkeypatch=monkeypatch)
    assert info.value.details[0]["node"] == "relu_0" and info.value.details[0]["op_type"] == "Relu"


def test_multiple_blocks_and_no_block(tmp_path, model, monkeypatch):
    with pytest.raises(AtcError) as info:
        run(tmp_path, model, mode="fail_multi", monkeypatch=monkeypatch)
    assert info.value.codes == ["EZ3003", "E19999"] and "(+1 more)" in str(info.value)
    with pytest.raises(AtcError) as info:
        run(tmp_path, model, mode="fail_nocode", monkeypatch=monkeypatch)
    assert info.value.codes == [] and info.value.returncode == 255 and "exit 255" in str(info.value)


def test_standin_checks_reach_the_user_as_parsed_errors(tmp_path, model):
    # an input name that is not in the model: ATC's E10016
    with pytest.raises(AtcError) as info:
        run(tmp_path, model, input_shapes={"image": (1, 3, 8, 8)})
    assert info.value.codes == ["E10016"] and info.value.details[0]["node"] == "image"
    assert "input names" in info.value.hint
    # an ONNX opset newer than the parser: E19010 naming the first node
    new = make_model(tmp_path / "new.onnx", opset=21)
    with pytest.raises(AtcError) as info:
        run(tmp_path, new)
    d = info.value.details[0]
    assert (d["code"], d["node"], d["op_type"], d["opset"]) == ("E19010", "relu_0", "Relu", 21)
    # an unknown SoC name goes through (no closed list here) and ATC rejects it
    with pytest.raises(AtcError) as info:
        run(tmp_path, model, soc="Ascend123")
    assert info.value.codes == ["E10001"]


def test_hand_made_argv_violating_the_contract(tmp_path, model):
    # the stand-in refuses what ATC refuses; run_atc reports it as an AtcError with the code
    base = [str(STANDIN), f"--model={model}", f"--output={tmp_path / 'o'}"]
    with pytest.raises(AtcError) as info:
        run_atc(base + ["--soc_version=Ascend310P3"], log_dir=tmp_path / "l")
    assert info.value.codes == ["E10007"]
    with pytest.raises(AtcError) as info:
        run_atc(base + ["--framework=5"], log_dir=tmp_path / "l")
    assert info.value.codes == ["E10004"]
    with pytest.raises(AtcError) as info:   # an --output with .om (ATC would write x.om.om)
        run_atc([str(STANDIN), f"--model={model}", f"--output={tmp_path / 'o.om'}",
                 "--framework=5", "--soc_version=Ascend310P3"], log_dir=tmp_path / "l")
    assert info.value.codes == ["E10001"] and "without .om" in str(info.value)
    with pytest.raises(AtcError) as info:   # gflags error, exit 1, no code
        run_atc(base + ["--framework", "5"], log_dir=tmp_path / "l")
    assert info.value.returncode == 1 and "not of the form" in str(info.value)


def test_timeout_kills_the_process_group(tmp_path, model, monkeypatch):
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("ATC_STANDIN_PIDFILE", str(pidfile))
    monkeypatch.setenv("ATC_STANDIN_MODE", "hang")
    argv = build_atc_argv(model, tmp_path / "o", soc="Ascend310P3", atc=STANDIN)
    timeout = 1.0
    while True:
        t0 = time.monotonic()
        with pytest.raises(AtcError, match=rf"did not finish within {timeout:g} s") as info:
            run_atc(argv, timeout=timeout, log_dir=tmp_path / "logs")
        assert time.monotonic() - t0 < timeout + TEST_TIMEOUT / 60  # killed at the timeout, not waited for
        assert info.value.exit_code == 3 and "--timeout" in info.value.hint
        # a loaded machine may stop the stand-in before it spawned its child: more time, until it has,
        # so that the process-group kill is exercised whatever the machine's speed
        if pidfile.exists() or timeout > TEST_TIMEOUT:
            break
        timeout *= 4
    assert "ATC start working now" in str(info.value)     # the last line ATC printed
    deadline = time.monotonic() + TEST_TIMEOUT
    pids = [int(p) for p in pidfile.read_text().split()]
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                # a zombie of ours counts as gone
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split()[2] != "Z":
                        alive.append(pid)
            except (ProcessLookupError, FileNotFoundError):
                pass
        if not alive:
            break
        time.sleep(0.1)
    assert not alive, f"still running: {alive}"
    assert not (tmp_path / "o.om").exists()


@pytest.mark.parametrize("mode, match", [("no_om", "wrote no"), ("bad_magic", "IMOD")])
def test_exit_zero_without_a_valid_om_is_an_error(tmp_path, model, monkeypatch, mode, match):
    with pytest.raises(AtcError, match=match) as info:
        run(tmp_path, model, mode=mode, monkeypatch=monkeypatch)
    assert info.value.returncode == 0 and info.value.exit_code == 3


def test_loader_failure_exit_127(tmp_path, model, monkeypatch):
    with pytest.raises(AtcError, match="exit 127") as info:
        run(tmp_path, model, mode="loader_127", monkeypatch=monkeypatch)
    assert "libascend_hal.so" in str(info.value) and "set_env.sh" in info.value.hint


# ------------------------------------------------------------------------------------------------
# Finding ATC

def test_missing_atc(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    assert find_atc() is None
    with pytest.raises(DependencyError, match="not found") as info:
        require_atc()
    assert info.value.exit_code == 3 and "set_env.sh" in info.value.hint
    with pytest.raises(DependencyError):
        atc_convert(tmp_path / "m.onnx", tmp_path / "o", soc="Ascend310P3")
    with pytest.raises(InputError, match="not executable"):
        find_atc(tmp_path / "atc")
    with pytest.raises(DependencyError, match="not found"):
        run_atc([str(tmp_path / "atc"), "--output=x"], log_dir=tmp_path / "l")


def test_find_atc_on_path_and_toolkit_home(tmp_path, monkeypatch):
    home = tmp_path / "toolkit"
    (home / "compiler" / "bin").mkdir(parents=True)
    exe = home / "compiler" / "bin" / "atc"
    exe.write_text(STANDIN.read_text())
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(home))
    assert find_atc() == str(exe)
    monkeypatch.setenv("PATH", str(STANDIN.parent))
    assert find_atc() == str(STANDIN)
    assert find_atc(STANDIN) == str(STANDIN)


# ------------------------------------------------------------------------------------------------
# Parsing the real outputs quoted in the reference (§1.8)

def test_parse_reference_outputs():
    old = """ATC start working now, please wait for a moment.
ATC run failed, Please check the detail log, Try 'atc --help' for more information
EZ3003: No supported Ops kernel and engine are found for [AddDsl], optype [AddDsl].
        Possible Cause: The operator is not supported by the system. Therefore, no hit is found in any operator information library.
        Solution: 1. Check that the OPP component is installed properly. 2. Submit an issue to request for the support of this operator type.
        TraceBack (most recent call last):
        build graph failed, graph id:0, ret:-1[FUNC:BuildModel][FILE:ge_generator.cc][LINE:148
"""
    [b] = parse_atc_errors(old)
    assert b["code"] == "EZ3003" and (b["node"], b["op_type"]) == ("AddDsl", "AddDsl")
    assert b["possible_cause"].startswith("The operator is not supported")
    assert b["solution"].startswith("1. Check that the OPP")
    assert b["traceback"] == ["build graph failed, graph id:0, ret:-1[FUNC:BuildModel]"
                              "[FILE:ge_generator.cc][LINE:148"]
    new = """E10007: [PID: 10490] 2025-03-18-09:02:18.501.341 [--framework] is required. The value must be [0(Caffe) or 1(MindSpore) or 3(TensorFlow) or 5(Onnx)].
E19010: No parser is registered for Op [model1 div node, optype [ai.onnx::23::Div]].
"""
    a, b = parse_atc_errors(new)
    assert a["code"] == "E10007" and a["message"].startswith("[--framework] is required")
    assert (b["node"], b["op_type"], b["opset"]) == ("model1 div node", "Div", 23)
    assert parse_atc_errors("ATC run success, welcome to the next use.") == []


# ------------------------------------------------------------------------------------------------
# Real models through the whole ATC path (stand-in compiler)

@pytest.mark.realmodel
def test_atc_convert_real_cnn_with_keep_dtype(real_model, tmp_path):
    path = real_model("ppocr_cls")
    r = atc_convert(path, tmp_path / "cls.om", soc="Ascend310P3", atc=STANDIN,
                    input_shapes={"x": (-1, 3, 48, 192)}, dynamic_batch=[1, 8],
                    precision_mode="allow_mix_precision", keep_dtype=["OpType::Softmax"],
                    log_dir=tmp_path / "logs")
    assert read_header(r.om_path) == (b"IMOD", "cls")
    keep = next(a for a in r.argv if a.startswith("--keep_dtype=")).split("=", 1)[1]
    assert not os.path.exists(keep)                       # the temp file is cleaned up


@pytest.mark.realmodel
def test_atc_convert_real_transformer_with_dynamic_dims(real_model, tmp_path):
    path = real_model("minilm")
    r = atc_convert(path, tmp_path / "minilm", soc="Ascend910B3", atc=STANDIN,
                    input_shapes={"input_ids": (1, -1), "attention_mask": (1, -1)},
                    dynamic_dims=[[64, 64], [128, 128]], log_dir=tmp_path / "logs")
    assert "--input_format=ND" in r.argv
    data = Path(r.om_path).read_bytes()
    assert data[:4] == b"IMOD"
    length = struct.unpack_from("<I", data, 76)[0]
    assert length == len(data) - 256                      # GE's own size check (§2.1)


def test_console_progress_and_user_log_path(tmp_path, model, monkeypatch):
    import io

    from npu_deploy.converters.lowering.atc import console_progress

    user_logs = tmp_path / "my-logs"
    monkeypatch.setenv("ASCEND_PROCESS_LOG_PATH", str(user_logs))
    buf = io.StringIO()
    on_line, on_tick = console_progress(buf)
    argv = build_atc_argv(model, tmp_path / "o", soc="Ascend310P3", atc=STANDIN)
    r = run_atc(argv, on_line=on_line, on_tick=on_tick)
    assert r.log_path and Path(r.log_path).is_relative_to(user_logs)
    shown = buf.getvalue().splitlines()
    assert shown[0].startswith("atc [") and shown[0].endswith("please wait for a moment.")
    assert shown[-1].endswith("ATC run success, welcome to the next use.")
    monkeypatch.setenv("ATC_STANDIN_MODE", "fail_EZ3003")
    buf.truncate(0)
    with pytest.raises(AtcError):
        run_atc(argv, on_line=on_line, on_tick=on_tick)
    assert any("EZ3003:" in ln for ln in buf.getvalue().splitlines())


def test_scalar_input_and_colon_in_name(tmp_path):
    model = make_model(tmp_path / "c.onnx", inputs=(("input:0", [1, 4]), ("s", [])))
    argv = build_atc_argv(model, tmp_path / "c", soc="Ascend310P3", atc=STANDIN,
                          input_shapes={"input:0": (1, 4), "s": ()})
    assert "--input_shape=input:0:1,4;s:" in argv          # ATC's syntax for a scalar: "name:"
    r = run_atc(argv, log_dir=tmp_path / "logs")
    assert read_header(r.om_path)[0] == b"IMOD"


def test_default_log_folder_kept_only_after_failure(tmp_path, model, monkeypatch):
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.delenv("ASCEND_PROCESS_LOG_PATH", raising=False)
    out = tmp_path / "out"
    out.mkdir()
    argv = build_atc_argv(model, out / "m", soc="Ascend310P3", atc=STANDIN)
    r = run_atc(argv)
    assert r.log_path is None and list(temp.iterdir()) == []
    monkeypatch.setenv("ATC_STANDIN_MODE", "fail_E19999")
    with pytest.raises(AtcError) as info:
        run_atc(argv)
    log = Path(info.value.log_path)
    assert log.is_file() and log.is_relative_to(temp) and "E19999" in log.read_text()
    assert str(log) in info.value.hint
