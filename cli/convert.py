"""``npu-deploy convert``: a thin shell over :func:`npu_deploy.converters.convert.convert`."""

from __future__ import annotations

import click

from npu_deploy._text import printable
from npu_deploy.cli.options import parse_input_shapes, parse_int_list, refuse_overwriting, soc_option
from npu_deploy.converters.options import ALL_INPUT_FORMATS, ALL_PRECISION_MODES, BACKENDS



def _dims(text: str | None) -> list[tuple[int, ...]] | None:
    if not text:
        return None
    gears = []
    for gear in text.split(";"):
        if gear.strip():
            gears.append(tuple(parse_int_list(gear, option="--dynamic-dims")))
    return gears


@click.command("convert", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", type=click.Path(dir_okay=True, path_type=str))
@click.option("-o", "--output", default=None, metavar="OUT",
              help="Output file (default MODEL.bundle, or MODEL.om with ATC). A bundle is written exactly "
                   "to OUT; ATC appends .om when OUT lacks it and may add an _<os>_<arch> suffix.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="atc: CANN's compiler; builtin: npu-deploy's lowering to an offline bundle; "
                   "auto: ATC when found, else builtin.")
@soc_option
@click.option("--input-shape", "input_shape", default=None, metavar='"x:1,3,224,224;y:1,128"',
              help="Fix input shapes (ATC --input_shape); -1 marks a gear dimension.")
@click.option("--input-format", type=click.Choice(ALL_INPUT_FORMATS), default=None,
              help="Layout the host feeds 4-D (NCHW/NHWC) or 5-D (NCDHW/NDHWC) inputs in; ND for all "
                   "(ATC --input_format). NHWC/NDHWC: built-in backend only (converted on the device); "
                   "ATC takes NCHW, NCDHW or ND for ONNX.")
@click.option("--dynamic-batch", default=None, metavar="1,4,8",
              help="Batch gears (ATC --dynamic_batch_size).")
@click.option("--dynamic-dims", default=None, metavar='"1,128;4,256"',
              help="Gears for the -1 dims of --input-shape (ATC --dynamic_dims).")
@click.option("--precision-mode", type=click.Choice(ALL_PRECISION_MODES), default=None,
              help="ATC precision mode (default force_fp16). The built-in lowering implements force_fp16, "
                   "allow_fp32_to_fp16, must_keep_origin_dtype and allow_mix_precision; the others are "
                   "ATC's only.")
@click.option("--keep-dtype", default=None, metavar="NODE,...",
              help="Nodes (or OpType::X) kept in float32 (ATC --keep_dtype).")
@click.option("--enable-small-channel", is_flag=True, help="NC1HWC0_C04 for a first conv with <= 4 channels.")
@click.option("--atc-arg", "atc_args", multiple=True, metavar="--name=value",
              help="Extra argument passed to ATC verbatim (repeatable).")
@click.option("--atc", "atc_path", default=None, metavar="PATH", help="The atc executable to use.")
@click.option("--insert-op-conf", "insert_op_conf", default=None, metavar="AIPP.cfg",
              type=click.Path(exists=True, dir_okay=False),
              help="AIPP configuration file for ATC (ATC --insert_op_conf).")
@click.option("--timeout", type=float, default=None, metavar="S", help="Give up on ATC after S seconds.")
@click.option("--report", default=None, metavar="FILE.json", help="Write the result and plan report as JSON.")
@click.option("--explain", is_flag=True, help="Print, for every TransData kept, why it had to stay.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the verdict line.")
def command(model, output, backend, soc, input_shape, input_format, dynamic_batch, dynamic_dims,
            precision_mode, keep_dtype, enable_small_channel, atc_args, atc_path, insert_op_conf, timeout, report,
            explain, quiet):
    """Lower MODEL.onnx for an Ascend NPU: ATC .om, or the built-in offline bundle."""
    from npu_deploy.converters.convert import convert

    refuse_overwriting([("-o", output), ("--report", report)], [("input model", model)])

    def progress(stage, fraction=None):
        if not quiet and stage.startswith("atc: "):
            click.echo(stage[5:], err=True)

    result = convert(
        model, output, backend=backend, soc=soc, input_shapes=parse_input_shapes(input_shape),
        input_format=input_format, dynamic_batch=parse_int_list(dynamic_batch, option="--dynamic-batch") or None,
        dynamic_dims=_dims(dynamic_dims), precision_mode=precision_mode,
        keep_dtype=[k for k in (keep_dtype or "").split(",") if k.strip()] or None,
        enable_small_channel=enable_small_channel, atc_args=atc_args, timeout=timeout, report=report,
        progress=progress, atc=atc_path, insert_op_conf=insert_op_conf)
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
        if report:
            click.echo(f"report written to {report}")
    if explain:
        rep = result.plan_report()
        if rep is None:
            click.echo("--explain: the TransData plan is ATC's own (see its build log); nothing to explain here")
        else:
            click.echo("TransData kept, and why:")
            for t in rep.transdata:
                click.echo(f"  {t['name']}: {t['tensor']} {t['src_format']} -> {t['dst_format']}: {t['reason']}")
            for d in rep.atc_differences:
                click.echo(printable(f"differs from ATC: {d}"))
    click.echo(result.verdict())
    return 0
