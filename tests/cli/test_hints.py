"""Hints name what exists where they are printed, and printed figures can be read.

Every ``hint=`` string in the package is walked: each ``--flag`` it names must be an option of an
npu-deploy command (of the command that prints it, for hints in ``cli/<command>.py``), unless the hint
is about ATC's own command line. The two hints a newcomer met with the wrong spelling go through the
real entry points."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest

from npu_deploy.cli.main import cli
from npu_deploy.errors import ModelError

REPO = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("cli", "converters", "runtime", "profiling", "npu_deploy")
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][A-Za-z0-9_-]*)")


def _commands(group: click.Command, path=()) -> dict[tuple, set[str]]:
    out = {path: {o for p in group.params for o in p.opts + p.secondary_opts}}
    if isinstance(group, click.Group):
        ctx = click.Context(group)
        for name in group.list_commands(ctx):   # the lazy group loads each command here
            out.update(_commands(group.get_command(ctx, name), path + (name,)))
    return out


COMMANDS = _commands(cli)
ALL_FLAGS = set().union(*COMMANDS.values()) | {"--help", "--version", "--debug", "--quiet"}


def _text(node: ast.AST) -> str:
    """The literal text of a str / f-string / concatenation (formatted values left out)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) for v in node.values)
    if isinstance(node, ast.BinOp):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.IfExp):
        return _text(node.body) + " " + _text(node.orelse)
    return " "


def _hints() -> list[tuple[Path, int, str]]:
    found = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.keyword) and node.arg == "hint":
                    found.append((path, node.value.lineno, _text(node.value)))
    return found


def _about_atc(text: str) -> bool:
    # "rebuild with atc --input_shape=..." / "ATC --keep_dtype": ATC's own options, not ours
    return bool(re.search(r"\batc\b|\bATC\b|msprof|ais_bench|pip |ray start|start it with", text))


def test_the_walk_finds_the_hints():
    hints = _hints()
    assert len(hints) > 300 and sum(bool(FLAG.search(t)) for _, _, t in hints) > 30


def test_every_flag_named_in_a_hint_exists_where_it_is_printed():
    wrong = []
    for path, line, text in _hints():
        if _about_atc(text):
            continue
        rel = path.relative_to(REPO)
        for flag in FLAG.findall(text):
            if rel.parts[0] == "cli" and rel.stem in {c[0] for c in COMMANDS if c}:
                here = set().union(*(v for k, v in COMMANDS.items() if k[:1] == (rel.stem,)))
                if flag not in here | {"--help", "--debug", "--quiet"} and flag not in ALL_FLAGS:
                    wrong.append(f"{rel}:{line}: {flag} is no option of `{rel.stem}`")
            elif flag not in ALL_FLAGS:
                wrong.append(f"{rel}:{line}: {flag} is no option of any command")
    assert not wrong, "\n".join(wrong)


@pytest.mark.realmodel
def test_profile_run_on_a_dynamic_model_hints_only_its_own_flags(real_model, run_cli, tmp_path):
    code, out, err = run_cli("profile", "run", real_model("minilm"), "-o", tmp_path / "p")
    assert code == 2 and "dynamic dimensions" in err
    named = set(FLAG.findall(err))
    assert "--input-shape" in named and named <= COMMANDS[("profile", "run")], err
    assert "--dynamic-batch" not in err and "Traceback" not in err


@pytest.mark.realmodel
@pytest.mark.slow
def test_inference_session_on_a_dynamic_onnx_opens_and_takes_its_keyword(real_model):
    """A dynamic .onnx needs no CLI flag through the API: the session opens with the symbolic dims (issue
    24), and the keyword the hints name (input_shapes=) fixes them."""
    from npu_deploy import InferenceSession

    with InferenceSession(str(real_model("minilm"))) as s:
        assert all(isinstance(d, str) for d in s.get_inputs()[0].shape)
    with InferenceSession(str(real_model("minilm")), input_shapes={"input_ids": (1, 8), "attention_mask": (1, 8)}) as s:
        assert list(s.get_inputs()[0].shape) == [1, 8]


@pytest.mark.realmodel
def test_convert_prints_each_folded_count_with_what_it_counts(real_model, run_cli, tmp_path):
    import onnx

    src = real_model("ppocr_cls")
    code, out, err = run_cli("convert", src, "-o", tmp_path / "c.bundle", "--backend", "builtin",
                             "--input-shape", "x:1,3,48,192")
    assert code == 0, err
    consts = sum(n.op_type == "Constant" for n in onnx.load(str(src)).graph.node)
    ops = int(re.search(r"and (\d+) ops constant-folded, Constant nodes not counted", out).group(1))
    both = int(re.search(r"(\d+) Constant nodes and constant-folded ops left out", out).group(1))
    assert ops > 0 and both == consts + ops            # the two figures add up, each says what it counts


def test_cosine_shows_the_digits_that_decide():
    from npu_deploy.runtime.check.precision import _cos

    assert _cos(0.99998999, 0.99999) == "0.99998999"   # not "0.999990", which reads as on target
    assert float(_cos(0.99998999, 0.99999)) < 0.99999
    assert _cos(0.9999900001, 0.99999) == "0.9999900001"
    assert _cos(0.5, 0.99) == "0.500000" and _cos(None, 0.99) == "n/a"


# ---------------------------------------------------------------------------------------------- labels
def _conv_model(path: Path) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["y"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=[w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_aipp_bundle_input_is_labelled_nhwc_and_its_aipp_format(run_cli, tmp_path):
    from npu_deploy.converters.lowering import aipp

    cfg = tmp_path / "a.cfg"
    aipp.write_config(cfg, [aipp.from_flags(input_format="RGB888_U8", size=(8, 8), mean=[1, 2, 3])])
    assert run_cli("convert", _conv_model(tmp_path / "m.onnx"), "--backend", "builtin", "--insert-op-conf", cfg,
                   "-o", tmp_path / "m.bundle")[0] == 0
    code, out, err = run_cli("inspect", tmp_path / "m.bundle")
    assert code == 0, err
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["x"])
    assert row[1:5] == ["uint8", "[1,8,8,3]", "NHWC", "RGB888_U8"], row


def test_force_fp16_dump_says_where_the_first_cast_happens(run_cli, tmp_path):
    import numpy as np

    b = tmp_path / "m.bundle"
    assert run_cli("convert", _conv_model(tmp_path / "m.onnx"), "--backend", "builtin", "--precision-mode",
                   "force_fp16", "-o", b)[0] == 0
    np.save(tmp_path / "x.npy", np.ones((1, 3, 8, 8), np.float32))
    assert run_cli("run", b, "--input", f"x={tmp_path / 'x.npy'}", "--dump", tmp_path / "d", "--loop", "1")[0] == 0
    [conv] = [p for p in (tmp_path / "d").rglob("Conv.*") if p.is_file()]
    code, out, err = run_cli("inspect", conv)
    assert code == 0, err
    assert "float32" in out and "casts its input to float16 itself" in out


def test_session_input_shape_is_a_list_as_in_onnxruntime(tmp_path):
    import onnxruntime as ort

    from npu_deploy import InferenceSession

    src = _conv_model(tmp_path / "m.onnx")
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).get_inputs()[0].shape
    with InferenceSession(str(src)) as s:
        got = s.get_inputs()[0].shape
    assert type(got) is type(want) is list and got == want


def test_a_hint_that_names_a_command_names_one_of_its_options():
    """``convert --input-shape``, ``profile run --loops``: the flag belongs to the command named."""
    named = {" ".join(k): v for k, v in COMMANDS.items() if k}
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, named), key=len, reverse=True))
                         + r")((?: --?[A-Za-z][\w-]*(?:[ =]\S+)?)+)")
    wrong, seen = [], 0
    for path, line, text in _hints():
        if _about_atc(text):
            continue
        for cmd, tail in pattern.findall(text):
            for flag in FLAG.findall(tail):
                seen += 1
                if flag not in named[cmd] | {"--help", "--debug"}:
                    wrong.append(f"{path.relative_to(REPO)}:{line}: `{cmd}` has no {flag}")
    assert seen > 0 and not wrong, "\n".join(wrong)
