"""Other tools' habits through the real entry point: ATC spellings on ``convert``, ais_bench's on
``run``, "did you mean" for a typo, and feedback that never reaches a non-terminal.

The oracle for an alias is our own spelling: the same command written both ways must give the same
bundle (or the same ATC command line), and the ATC line must carry what the user typed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npu_deploy.converters.files.bundle import read_bundle
from npu_deploy.converters.lowering.options import ConvertOptions

STANDIN_ATC = Path(__file__).resolve().parents[1] / "standins" / "atc"


def _manifest(path):
    with read_bundle(path) as b:
        m = dict(b.manifest)
    m.pop("source_model", None)
    return m


def _error_line(code, err, expected):
    assert code == expected, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("npu-deploy: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.realmodel
def test_a_pasted_atc_line_builds_the_same_bundle_as_our_spelling(run_cli, real_model, tmp_path):
    src = real_model("ppocr_cls")
    keep = tmp_path / "keep.cfg"  # ATC's --keep_dtype is a file, one op a line
    keep.write_text("OpType::Softmax\n")
    atc_line = ["--model=" + str(src), "--framework=5", f"--output={tmp_path / 'atc_style'}",
                "--input_format=NCHW", "--input_shape=x:1,3,48,192", "--soc_version=Ascend310P3",
                "--precision_mode=allow_fp32_to_fp16", "--enable_small_channel=1", f"--keep_dtype={keep}"]
    code, out, err = run_cli("convert", "--backend=builtin", *atc_line)
    assert code == 0, err
    code, out2, err2 = run_cli("convert", src, "-o", tmp_path / "ours", "--backend", "builtin", "--input-format",
                               "NCHW", "--input-shape", "x:1,3,48,192", "--soc", "Ascend310P3",
                               "--precision-mode", "allow_fp32_to_fp16", "--enable-small-channel",
                               "--keep-dtype", "OpType::Softmax")
    assert code == 0, err2
    a, b = _manifest(tmp_path / "atc_style"), _manifest(tmp_path / "ours")
    assert a == b
    assert a["inputs"][0]["shape"] == [1, 3, 48, 192] and a["precision_mode"] == "allow_fp32_to_fp16"
    # --enable_small_channel=1 reached the planner: the first conv reads the C04 small-channel layout
    assert any("NC1HWC0_C04" in (t["dst_format"], t["src_format"]) for t in a["transdata"])


def test_enable_small_channel_0_is_off_and_a_bad_value_is_refused(run_cli, example_onnx, tmp_path):
    code, _, err = run_cli("convert", example_onnx, "-o", tmp_path / "off", "--backend", "builtin",
                           "--enable_small_channel=0")
    assert code == 0, err
    assert not any("C04" in t["dst_format"] for t in _manifest(tmp_path / "off")["transdata"])
    code, _, err = run_cli("convert", example_onnx, "-o", tmp_path / "x", "--backend", "builtin",
                           "--enable_small_channel=2")
    assert "--enable_small_channel" in _error_line(code, err, 2)
    assert not (tmp_path / "x").exists()


def test_the_atc_backend_receives_the_atc_line_as_typed(run_cli, example_onnx, tmp_path, monkeypatch):
    argv_file = tmp_path / "argv.json"
    monkeypatch.setenv("ATC_STANDIN_ARGV", str(argv_file))
    monkeypatch.setenv("ASCEND_PROCESS_LOG_PATH", str(tmp_path / "logs"))
    monkeypatch.delenv("ATC_STANDIN_MODE", raising=False)
    typed = ["--framework=5", "--input_format=NCHW", "--input_shape=x:1,3,64,64", "--soc_version=Ascend910B",
             "--precision_mode=allow_mix_precision", "--enable_small_channel=1", "--out_nodes=head/Add:0",
             "--output_type=FP16", "--op_select_implmode=high_precision"]
    code, out, err = run_cli("convert", "--atc", STANDIN_ATC, f"--model={example_onnx}",
                             f"--output={tmp_path / 'net'}", *typed)
    assert code == 0, err
    assert (tmp_path / "net.om").is_file() and "(atc, Ascend910B)" in out
    argv = json.loads(argv_file.read_text())
    for flag in typed:
        assert flag in argv, (flag, argv)
    assert f"--model={example_onnx}" in argv


def test_atc_only_options_on_the_builtin_path_are_named_as_ignored(run_cli, example_onnx, tmp_path):
    code, out, err = run_cli("convert", example_onnx, "-o", tmp_path / "b", "--backend", "builtin",
                             "--op_select_implmode=high_precision", "--log=info")
    assert code == 0, err
    assert "--log only applies to the ATC backend; the built-in lowering ran and ignored it" in err
    assert "--op_select_implmode (ATC's kernel implementation choice)" in err


def test_out_nodes_and_output_type_cut_and_cast_in_the_builtin_path(run_cli, example_onnx, tmp_path):
    """ATC's --out_nodes / --output_type are honoured by the built-in lowering too (same outputs as
    ATC would give): the bundle ends at head/Add's output, in float16."""
    import numpy as np
    import onnxruntime as ort

    from npu_deploy.runtime.emulator import EmulatorBackend

    code, out, err = run_cli("convert", example_onnx, "-o", tmp_path / "cut.bundle", "--backend", "builtin",
                             "--out_nodes=head/Add:0", "--output_type=FP16", "--precision_mode=must_keep_origin_dtype")
    assert code == 0, err
    assert "ignored" not in err
    man = _manifest(tmp_path / "cut.bundle")
    assert [(o["name"], o["dtype"]) for o in man["outputs"]] == [("headb", "float16")]
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    with EmulatorBackend(tmp_path / "cut.bundle") as b:
        (y,) = b.run(None, {"x": x})
    import onnx

    m = onnx.load(str(example_onnx))
    m.graph.output.append(onnx.ValueInfoProto(name="headb"))  # the original, with the cut tensor exposed
    (ref,) = ort.InferenceSession(m.SerializeToString()).run(["headb"], {"x": x})
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("args,needle", [
    (["--input_shap=x:1,3,64,64"], "did you mean --input_shape?"),
    (["--input-shap", "x:1,3,64,64"], "did you mean --input-shape?"),
    (["--dynamic_batch=1,2"], "--dynamic_batch_size?"),
    (["--buffer_optimize=off_optimize"], "--atc-arg=--buffer_optimize"),
    (["--framework=3"], "converts ONNX models only"),
    (["--log=loud"], "is not an ATC log level"),
])
def test_unknown_or_wrong_atc_options_get_one_line_and_a_way_forward(run_cli, example_onnx, tmp_path, args,
                                                                        needle):
    code, out, err = run_cli("convert", example_onnx, "-o", tmp_path / "o", *args)
    assert needle in _error_line(code, err, 2)
    assert not (tmp_path / "o").exists()


def test_model_given_twice_or_not_at_all(run_cli, example_onnx, tmp_path):
    other = tmp_path / "other.onnx"
    other.write_bytes(example_onnx.read_bytes())
    code, _, err = run_cli("convert", example_onnx, f"--model={other}")
    assert "two models given" in _error_line(code, err, 2)
    code, _, err = run_cli("convert", "--backend", "builtin")
    assert "missing the model" in _error_line(code, err, 2)


def test_the_keep_dtype_file_must_be_small_and_name_ops(run_cli, example_onnx, tmp_path):
    empty = tmp_path / "empty.cfg"
    empty.write_text("\n# nothing\n")
    code, _, err = run_cli("convert", example_onnx, "-o", tmp_path / "o", f"--keep_dtype={empty}")
    assert "names no op" in _error_line(code, err, 2)


def test_atc_flags_given_by_their_atc_name_are_named_in_the_builtin_note():
    notes = ConvertOptions(atc_flags=("--buffer_optimize=off_optimize", "--op_select_implmode=high_precision")
                           ).for_backend("builtin", "requested")
    assert notes == ["ATC options the built-in lowering has no counterpart for, ignored: --buffer_optimize "
                     "(ATC's buffer optimisation), --op_select_implmode (ATC's kernel implementation choice)"]
    assert ConvertOptions(atc_flags=("--buffer_optimize=off_optimize",)).for_backend("atc", "requested") == []


def test_convert_prints_no_progress_on_a_non_terminal(run_cli, example_onnx, tmp_path):
    code, out, err = run_cli("convert", example_onnx, "-o", tmp_path / "b", "--backend", "builtin")
    assert code == 0 and err == "", err
    assert "writing weights" not in out and "\r" not in out


# ------------------------------------------------------------------------------------------ run / ais_bench
@pytest.fixture
def example_bundle(run_cli, example_onnx, tmp_path):
    out = tmp_path / "example.bundle"
    code, _, err = run_cli("convert", example_onnx, "-o", out, "--backend", "builtin", "-q")
    assert code == 0, err
    return out


def test_an_ais_bench_line_runs_and_writes_the_same_outputs(run_cli, example_bundle, tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = run_cli("run", "--model", example_bundle, "--input", tmp_path / "x.npy", "--output",
                             tmp_path / "res", "--output_dirname", "r1", "--outfmt", "TXT", "--loop", "3",
                             "--warmup_count", "1", "--batchsize", "1", "--device", "0", "--debug", "1")
    assert code == 0, err
    code, _, err = run_cli("run", example_bundle, "--input", tmp_path / "x.npy", "--output", tmp_path / "ref",
                           "--loop", "1")
    assert code == 0, err
    ref = np.load(tmp_path / "ref" / "probs.npy")
    txt = np.loadtxt(tmp_path / "res" / "r1" / "probs.txt").reshape(ref.shape)
    np.testing.assert_allclose(txt, ref, rtol=1e-7)  # %.9g keeps a float32 exactly
    # --debug 1: ais_bench's model description, with the dims and formats
    assert "  input x: float32 [1,3,64,64] format NCHW" in out and "output probs: float32 [1,10]" in out
    # ais_bench's summary words, and max/std in our table
    for word in ("H2D_latency", "NPU_compute_time", "D2H_latency", "percentile(99%)", "1000*batchsize(1)"):
        assert word in out
    head = next(line for line in out.splitlines() if "p99" in line and "mean" in line)
    assert head.split()[-2:] == ["max", "std"]
    assert out.strip().splitlines()[-1].startswith("3 runs on CPU emulator")


def test_one_run_is_singular_and_units_follow_one_rule(run_cli, example_bundle):
    code, out, err = run_cli("run", example_bundle, "--loop", "1")
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("1 run on ") and any(u in last for u in (" µs,", " ms,", " s,")), last


def test_bare_debug_keeps_npu_deploys_meaning_and_bad_ais_values_are_one_line(run_cli, example_bundle, tmp_path):
    code, out, err = run_cli("run", example_bundle, "--loop", "1", "--debug")
    assert code == 0, err
    assert "format NCHW, device" not in out  # no description: the bare flag is ours (tracebacks)
    code, _, err = run_cli("run", example_bundle, "--debug=2")
    assert "--debug" in _error_line(code, err, 2)
    code, _, err = run_cli("run", example_bundle, "--output_dirname", "r1")
    assert "--output" in _error_line(code, err, 2)
    code, _, err = run_cli("run", example_bundle, "--output", tmp_path / "o", "--output_dirname", "../up")
    assert "one folder name" in _error_line(code, err, 2)
    assert not (tmp_path / "up").exists()
    code, _, err = run_cli("run", example_bundle, "--warmup-count", "1")
    assert "did you mean --warmup_count?" in _error_line(code, err, 2) or "did you mean" in err


def test_run_prints_no_progress_on_a_non_terminal(run_cli, example_bundle):
    code, out, err = run_cli("run", example_bundle, "--loop", "60")
    assert code == 0 and err == "", err


# ------------------------------------------------------------------ readable output
def _long_name_profile(tmp_path):
    from tests.profiling.helpers import op, write_csv

    rows = [op("Conv_0", "Conv2D", "AI_CORE", "500.0")]
    for k in (1, 2, 3):  # names alike for 34 characters and more: only their ends differ
        rows.append(op(f"aclnnMaxPool2dWithMaskBackward_TransData_{k}", "TransData", "AI_VECTOR_CORE", f"{40 + k}.0",
                       in_shape="256,256,3,3", in_fmt="NCHW", out_fmt="NC1HWC0", in_dtype="FLOAT16",
                       out_dtype="FLOAT16", out_shape="256,16,3,3,16"))
    return write_csv(tmp_path / "op_summary_0_1.csv", rows)


def test_profile_tables_keep_different_ops_apart_and_aligned(tmp_path):
    from npu_deploy.profiling.analyze import analyze_profile
    from npu_deploy.profiling.report import render_text

    r = analyze_profile(_long_name_profile(tmp_path))
    text = render_text(r)
    top = text[text.index("Top conversion ops"):].splitlines()[3:6]
    names = [line.split()[0] for line in top]
    assert len(set(names)) == 3 and all(n.endswith(f"TransData_{k}") for n, k in zip(names, (3, 2, 1)))
    assert len({line.index(" µs") for line in top}) == 1  # the time column is aligned
    wide = render_text(r, wide=True)
    assert "aclnnMaxPool2dWithMaskBackward_TransData_1" in wide
    assert "43.0 µs" in text  # one unit rule: µs below 1 ms, three significant digits


def test_html_breaks_names_and_shapes_only_after_separators(tmp_path):
    import re

    from npu_deploy.profiling.analyze import analyze_profile
    from npu_deploy.profiling.report import render_html

    doc = render_html(analyze_profile(_long_name_profile(tmp_path)))
    assert "break-all" not in doc and "overflow-wrap:anywhere" not in doc
    assert "aclnnMaxPool2dWithMaskBackward_<wbr>TransData_<wbr>1</code>" in doc
    assert "256,<wbr>256,<wbr>3,<wbr>3" in doc
    for code in re.findall(r"<code>(.*?)</code>", doc):  # every break opportunity follows a separator
        for piece in code.split("<wbr>")[:-1]:
            assert piece[-1] in "_/.,:;-", code


def test_units_follow_one_rule():
    from npu_deploy._display import duration, duration_ms

    assert [duration(x) for x in (4.2e-7, 9.9996e-4, 0.0123, 0.99996, 61.0)] == \
        ["0.420 µs", "1.00 ms", "12.3 ms", "1.00 s", "61.0 s"]
    assert duration_ms(0.25) == "250 µs"
