"""``npu-deploy convert``: a thin shell over :func:`npu_deploy.converters.lowering.convert.convert`.

ATC's spellings are accepted as they are, so an ``atc`` command line pasted after ``npu-deploy convert``
runs: ``--model``, ``--framework=5``, ``--output``, ``--soc_version``, ``--input_shape``,
``--input_format``, ``--precision_mode``, ``--dynamic_batch_size``, ``--dynamic_dims``,
``--insert_op_conf``, ``--keep_dtype`` (ATC's file, or our list), ``--enable_small_channel=0|1``; the
options only ATC implements (``--out_nodes``, ``--output_type``, ``--op_select_implmode``, ``--log``)
go to ATC, and the built-in lowering says it ignored them.
"""

from __future__ import annotations

import os

import click

from npu_deploy._text import printable
from npu_deploy.cli.feedback import Stages, early, interactive
from npu_deploy.cli.options import (HabitCommand, flag_from_01, input_shape_option, parse_input_shapes, parse_int_list,
                                    op_info_option, precision_mode_option, refuse_overwriting, soc_option)
from npu_deploy.converters.lowering.options import ALL_INPUT_FORMATS, BACKENDS
from npu_deploy.converters.lowering.plan_record import transfer_text
from npu_deploy.converters.lowering.preflight import needs_preflight
from npu_deploy.errors import InputError, NpuDeployError

# ATC spellings whose value changes meaning here; the others are extra names of our options below
REWRITES = {"--enable_small_channel": flag_from_01("--enable-small-channel", "--enable_small_channel")}
ONNX_FRAMEWORK = ("5", "onnx")
MAX_KEEP_DTYPE_FILE = 1 << 20  # ATC's keep_dtype file: op names, one a line; megabytes of it is not one


def _keep_dtype(text: str | None) -> list[str] | None:
    """``NODE,OpType::X`` (ours) or the path of ATC's file with one entry a line."""
    if not text:
        return None
    if os.path.isfile(text):
        if os.path.getsize(text) > MAX_KEEP_DTYPE_FILE:
            raise InputError(f"--keep_dtype file {text} is larger than 1 MiB; it should list op names, one a line")
        with open(text, encoding="utf-8", errors="replace") as f:
            names = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
        if not names:
            raise InputError(f"--keep_dtype file {text} names no op", hint="one op name or OpType::X a line")
        return names
    return [k.strip() for k in text.split(",") if k.strip()] or None



def _model(positional: str | None, option: str | None) -> str:
    if positional and option and os.path.abspath(positional) != os.path.abspath(option):
        raise InputError(f"two models given: {positional} and --model={option}", hint="give the model once")
    model = positional or option
    if not model:
        raise click.UsageError("missing the model: npu-deploy convert MODEL.onnx (or ATC's --model=MODEL.onnx)")
    return model


def _dims(text: str | None) -> list[tuple[int, ...]] | None:
    if not text:
        return None
    gears = []
    for gear in text.split(";"):
        if gear.strip():
            gears.append(tuple(parse_int_list(gear, option="--dynamic-dims")))
    return gears


@click.command("convert", cls=HabitCommand, rewrites=REWRITES, passthrough="--atc-arg",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", type=click.Path(dir_okay=True, path_type=str), required=False)
@click.option("--model", "model_opt", default=None, metavar="MODEL.onnx", help="The model (ATC's spelling).")
@click.option("--framework", default=None, metavar="5", help="ATC's framework number: 5 (ONNX) is the only one.")
@click.option("-o", "--output", default=None, metavar="OUT",
              help="Output file (default MODEL.bundle, or MODEL.om with ATC). A bundle is written exactly "
                   "to OUT; ATC appends .om when OUT lacks it and may add an _<os>_<arch> suffix.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="atc: CANN's compiler; builtin: npu-deploy's lowering to an offline bundle; "
                   "auto: ATC when found, else builtin.")
@soc_option
@input_shape_option("--input_shape", note="Fixes the model's input shapes; -1 marks a gear dimension, "
                    "LOW~HIGH a shape range (ATC >= 8.5 spelling).")
@click.option("--input-shape-range", "--input_shape_range", "input_shape_range", default=None,
              metavar='"x:[1~4,3,224,224]"', help="Shape ranges, ATC's older spelling (with -1 in --input-shape).")
@click.option("--input-format", "--input_format", "input_format", type=click.Choice(ALL_INPUT_FORMATS), default=None,
              help="Layout the host feeds 4-D (NCHW/NHWC) or 5-D (NCDHW/NDHWC) inputs in; ND for all "
                   "(ATC --input_format). NHWC/NDHWC: built-in backend only (converted on the device); "
                   "ATC takes NCHW, NCDHW or ND for ONNX.")
@click.option("--dynamic-batch", "--dynamic_batch_size", "dynamic_batch", default=None, metavar="1,4,8",
              help="Batch gears (ATC --dynamic_batch_size).")
@click.option("--dynamic-dims", "--dynamic_dims", "dynamic_dims", default=None, metavar='"1,128;4,256"',
              help="Gears for the -1 dims of --input-shape (ATC --dynamic_dims).")
@precision_mode_option("ATC precision mode (default force_fp16). The built-in lowering implements force_fp16, "
                       "allow_fp32_to_fp16, must_keep_origin_dtype and allow_mix_precision; the others are "
                       "ATC's only.")
@click.option("--keep-dtype", "--keep_dtype", "keep_dtype", default=None, metavar="NODE,...|FILE",
              help="Nodes (or OpType::X) kept in float32, comma-separated, or ATC's --keep_dtype file "
                   "(one a line).")
@click.option("--enable-small-channel", is_flag=True,
              help="NC1HWC0_C04 for a first conv with <= 4 channels (ATC: --enable_small_channel=1).")
@op_info_option
@click.option("--out_nodes", "out_nodes", default=None, metavar='"node:0;out2"',
              help="Cut the graph at these outputs (ATC --out_nodes; both backends).")
@click.option("--output_type", "output_type", default=None, metavar='FP16|"node:0:FP16"',
              help="Output dtypes (ATC --output_type; both backends).")
@click.option("--op_select_implmode", "op_select_implmode", default=None, metavar="high_precision",
              help="ATC: kernel implementation choice (passed to ATC).")
@click.option("--log", "atc_log", default=None, metavar="LEVEL",
              help="ATC's log level (debug, info, warning, error, null).")
@click.option("--atc-arg", "atc_args", multiple=True, metavar="--name=value",
              help="Extra argument passed to ATC verbatim (repeatable).")
@click.option("--atc", "atc_path", default=None, metavar="PATH", help="The atc executable to use.")
@click.option("--insert-op-conf", "--insert_op_conf", "insert_op_conf", default=None, metavar="AIPP.cfg",
              type=click.Path(exists=True, dir_okay=False),
              help="AIPP configuration file for ATC (ATC --insert_op_conf).")
@click.option("--timeout", type=float, default=None, metavar="S", help="Give up on ATC after S seconds.")
@click.option("--report", default=None, metavar="FILE.json", help="Write the result and plan report as JSON.")
@click.option("--explain", is_flag=True, help="Print, for every TransData kept, why it had to stay.")
@click.option("--calibration-inputs", "calibration_inputs", default=None, metavar="DATA.npz",
              type=click.Path(dir_okay=False),
              help="Inputs for the float16 preflight (arrays named as the model's inputs; NAME@K for several "
                   "samples). Default: generated as compare generates them.")
@click.option("--no-preflight", is_flag=True,
              help="Skip the float16 preflight (run under float16 precision modes: reports tensors float16 "
                   "cannot hold, and the --keep-dtype list that fixes them).")
@click.option("--quiet", "-q", is_flag=True, help="Print only the verdict line.")
def command(model, model_opt, framework, output, backend, soc, input_shape, input_shape_range, input_format,
            dynamic_batch,
            dynamic_dims, precision_mode, keep_dtype, enable_small_channel, op_info, out_nodes, output_type,
            op_select_implmode, atc_log, atc_args, atc_path, insert_op_conf, timeout, report, explain,
            calibration_inputs, no_preflight, quiet):
    """Lower MODEL.onnx for an Ascend NPU: ATC .om, or the built-in offline bundle.

    ATC's own spellings work too: paste an atc command line after 'npu-deploy convert'.
    """
    early("convert: loading onnx and onnxruntime", quiet)
    from npu_deploy.converters.lowering.atc import LOG_LEVELS
    from npu_deploy.converters.lowering.convert import convert
    from npu_deploy.converters.lowering.cost import accuracy_note

    model = _model(model, model_opt)
    if framework is not None and framework.strip().lower() not in ONNX_FRAMEWORK:
        raise InputError(f"--framework={framework}: npu-deploy converts ONNX models only",
                         hint="use --framework=5 (ONNX) or leave it out; export other models to ONNX first")
    if atc_log is not None and atc_log not in LOG_LEVELS:
        raise InputError(f"--log={atc_log} is not an ATC log level", hint=f"use one of {', '.join(LOG_LEVELS)}")
    keep_file = keep_dtype if keep_dtype and os.path.isfile(keep_dtype) else None
    refuse_overwriting([("-o", output), ("--report", report)], [("input model", model),
                       ("--insert-op-conf file", insert_op_conf), ("--keep-dtype file", keep_file)])
    if calibration_inputs and not no_preflight:  # a bad file is found before anything is written
        from npu_deploy.converters.files.onnx_model import declared_io
        from npu_deploy.runtime.check.preflight import calibration_samples

        calibration_samples(calibration_inputs, [i.name for i in declared_io(model)[0]])
    # ATC-only options reach ATC verbatim; the built-in backend's note names each one it ignored
    atc_only = [f"--op_select_implmode={op_select_implmode}"] if op_select_implmode is not None else []
    with Stages(interactive(quiet), echo_atc=not quiet) as progress:
        result = convert(
            model, output, backend=backend, soc=soc, input_shapes=parse_input_shapes(input_shape),
            input_format=input_format,
            dynamic_batch=parse_int_list(dynamic_batch, option="--dynamic-batch") or None,
            dynamic_dims=_dims(dynamic_dims), precision_mode=precision_mode, keep_dtype=_keep_dtype(keep_dtype),
            enable_small_channel=enable_small_channel, atc_args=tuple(atc_args), atc_flags=tuple(atc_only),
            out_nodes=out_nodes, output_type=output_type, atc_log=atc_log, timeout=timeout, report=report,
            progress=progress, atc=atc_path, insert_op_conf=insert_op_conf,
            shape_ranges=_shape_ranges(input_shape_range), op_info=op_info)
    for note in result.notes:
        click.echo(f"npu-deploy: warning: {note}", err=True)
    if not quiet:
        click.echo(f"backend: {result.backend} ({result.backend_reason})")
        click.echo(f"op support: {result.support['verdict']}")
        if result.support.get("ai_cpu_nodes"):
            names = result.support["ai_cpu_nodes"]
            click.echo(f"  on AI CPU: {', '.join(names[:10])}" + (f" and {len(names) - 10} more" if len(names) > 10 else ""))
        rep = result.plan_report()
        if rep is not None:
            for line in rep.summary_lines():
                click.echo(line)
            if rep.cost is not None:
                click.echo(f"  ({accuracy_note(rep.soc)})")
        if report:
            click.echo(f"report written to {report}")
    if explain:
        rep = result.plan_report()
        if rep is None:
            click.echo("--explain: the TransData plan is ATC's own (see its build log); nothing to explain here")
        else:
            click.echo("TransData kept, and why:")
            for t in rep.transdata:
                click.echo(f"  {t['name']}: {t['tensor']} {transfer_text(t)}: {t['reason']}")
            for d in rep.atc_differences:
                click.echo(printable(f"differs from ATC: {d}"))
    if not no_preflight and needs_preflight(result.precision_mode):
        _preflight(result, calibration_inputs, quiet, input_shape=input_shape, input_format=input_format,
                   dynamic_batch=dynamic_batch, dynamic_dims=dynamic_dims, keep_dtype=keep_dtype, soc=soc,
                   output=output, backend=backend, precision_mode=precision_mode)
    elif calibration_inputs and not no_preflight:
        click.echo(f"npu-deploy: warning: --calibration-inputs: precision mode {result.precision_mode} keeps float32, "
                   f"no float16 preflight to run", err=True)
    click.echo(result.verdict())
    return 0


def _shape_ranges(text: str | None) -> dict[str, tuple] | None:
    """``"x:[1~4,3,224,224]"`` (ATC's ``--input_shape_range``) → ``{"x": ((1, 4), None, None, None)}``."""
    if not text:
        return None
    shapes = parse_input_shapes(text.replace("[", "").replace("]", ""), option="--input-shape-range")
    return {n: tuple(d if isinstance(d, tuple) else None for d in dims) for n, dims in shapes.items()}


def _preflight(result, calibration_inputs, quiet, *, input_shape, input_format, dynamic_batch, dynamic_dims,
               keep_dtype, soc, output, backend, precision_mode) -> None:
    """The float16 preflight after a float16 conversion: findings and the way out on stderr (the
    conversion stands; the bundle/.om is not touched)."""
    from npu_deploy.runtime.check.preflight import preflight

    args = [a for flag, v in (("-o", output), ("--backend", None if backend == "auto" else backend), ("--soc", soc),
                              ("--input-shape", input_shape), ("--input-format", input_format),
                              ("--dynamic-batch", dynamic_batch), ("--dynamic-dims", dynamic_dims),
                              ("--precision-mode", precision_mode)) if v for a in (flag, str(v))]
    kept = _keep_dtype(keep_dtype) or ()
    try:
        rep = preflight(result.model, precision_mode=result.precision_mode, keep_dtype=kept,
                        input_shapes=parse_input_shapes(input_shape) or None,
                        dynamic_batch=parse_int_list(dynamic_batch, option="--dynamic-batch") or None,
                        dynamic_dims=_dims(dynamic_dims), soc=soc, calibration_inputs=calibration_inputs,
                        convert_args=args, input_format=input_format)
    except NpuDeployError as e:  # the conversion stands; the check that could not run says why
        click.echo(printable(f"npu-deploy: warning: float16 preflight not run: {e} (skip it with --no-preflight)"),
                   err=True)
        return
    if rep:
        if not quiet:
            click.echo(rep.verdict())
        return
    if kept:  # the command keeps what was kept already, and the new ones
        rep.keep = list(dict.fromkeys([*kept, *rep.keep]))
        rep.command = rep.command.rsplit(" --keep-dtype ", 1)[0] + " --keep-dtype " + ",".join(rep.keep)
    for line in rep.lines():
        click.echo(printable(f"npu-deploy: warning: {line}" if line == rep.verdict() else line), err=True)
