"""``npu-deploy optimize MODEL.onnx -o OUT.onnx``: Ascend graph rewrites, verified and measured.

A thin shell over :func:`npu_deploy.converters.optimize.optimize`. Exit 0 when the output was written
and every applied rewrite matched the original's outputs; 2 for bad input (nothing written); 3 when
``--measure atc`` finds no ATC / pyACL or ATC fails on the original model. ``--measure atc`` is
measured with ATC + ACL: verified against stand-ins only.
"""

from __future__ import annotations

import click

from npu_deploy._text import printable
from npu_deploy.cli.options import (apply, input_shape_option, op_info_option, parse_input_shapes, soc_option,
                                    tolerance_options)
from npu_deploy.errors import InputError


def _names(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [t.strip() for t in text.split(",") if t.strip()]


@click.command("optimize", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", type=click.Path(dir_okay=False), required=False)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="The rewritten model (.onnx).")
@click.option("--list", "list_rules", is_flag=True, help="List the rules and exit.")
@click.option("--rules", default=None, metavar="A,B", help="Run only these rules (default: every rule marked on).")
@click.option("--skip", default=None, metavar="C,D", help="Do not run these rules.")
@click.option("--explain", is_flag=True, help="Also show every place a rule matched but did not apply, and why.")
@click.option("--inputs", type=click.Path(dir_okay=False), default=None,
              help="Verification inputs (.npz, one array per model input). Default: generated in realistic ranges.")
@input_shape_option()
@soc_option
@op_info_option
@apply(tolerance_options)
@click.option("--keep-if-faster", is_flag=True,
              help="Keep only rewrites the built-in cost model estimates as faster (and, with --measure atc, "
                   "that the device measures as faster).")
@click.option("--all", "keep_all", is_flag=True,
              help="Keep every verified rewrite, also those the cost model estimates slower (by default "
                   "they are dropped and reported as 'worse').")
@click.option("--measure", type=click.Choice(["cost", "atc"]), default="cost", show_default=True,
              help="What --keep-if-faster trusts: 'cost' the built-in cost model; 'atc' also compiles each "
                   "rewrite the cost model accepts with ATC and times it on the NPU through ACL (median compute "
                   "time, kept only when more than 2 % faster). Measured with ATC + ACL: verified against "
                   "stand-ins only.")
@click.option("--atc", "atc_path", default=None, metavar="PATH",
              help="The atc executable for --measure atc (default: on PATH or under $ASCEND_TOOLKIT_HOME).")
@click.option("--runs", type=click.IntRange(min=1), default=None, metavar="N",
              help="Timed runs per model for --measure atc, after one warm-up (default 20).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the report as JSON.")
def command(model, output, list_rules, rules, skip, explain, inputs, input_shape, soc, op_info, atol, rtol, keep_if_faster,
            keep_all, measure, atc_path, runs, seed, json_path):
    """Rewrite MODEL.onnx so it runs well on Ascend; every rewrite is checked on onnxruntime and measured.

    By default a verified rewrite is kept unless the built-in cost model estimates it slower
    (reported as 'worse'); --all keeps every verified one, --keep-if-faster only the faster ones.

    Example: npu-deploy optimize vad.onnx -o vad.opt.onnx --input-shape input:1,576 --explain

    On a CANN host: npu-deploy optimize vad.onnx -o vad.opt.onnx --keep-if-faster --measure atc --runs 50
    """
    from npu_deploy.converters.optimize import RULES, optimize

    if list_rules:
        for r in RULES.values():
            click.echo(f"{r.name:<26} {'on ' if r.default else 'off'}  {r.summary}")
        return
    if not model:
        raise click.UsageError("missing MODEL.onnx (or --list)")
    if not output:
        raise click.UsageError("missing -o OUT.onnx")
    for v, name in ((atol, "--atol"), (rtol, "--rtol")):
        if v is not None and not (v >= 0 and v != float("inf")):
            raise InputError(f"{name} {v} must be finite and >= 0")
    timer = None
    if measure == "atc":
        from npu_deploy.runtime.device_time import AtcAclTimer

        timer = AtcAclTimer(atc=atc_path, runs=runs)
    elif atc_path is not None or runs is not None:
        raise InputError(f"{'--atc' if atc_path is not None else '--runs'} is for --measure atc",
                         hint="add --keep-if-faster --measure atc, or drop it")
    res = optimize(model, output, rules=_names(rules), skip=_names(skip), inputs=inputs,
                   input_shapes=parse_input_shapes(input_shape), soc=soc, atol=atol, rtol=rtol,
                   keep_if_faster=keep_if_faster, seed=seed, report=json_path, device_timer=timer,
                   keep_all=keep_all, op_info=op_info)
    click.echo(printable(f"optimize {model} -> {output} ({res.soc})"))
    for a in res.applications:
        if a.status == "not applicable" and not explain:
            continue
        line = f"  {a.status:<14} {a.rule} at {a.where}"
        if a.status == "applied" and a.before is not None:  # the first of a step carries its figures
            line += (f": TransData {a.before['transdata']} -> {a.after['transdata']}, AI CPU {a.before['ai_cpu']} -> "
                     f"{a.after['ai_cpu']}")
        if a.device and a.status == "applied":
            line += f", device {a.device['before_ms']:.3f} -> {a.device['after_ms']:.3f} ms"
        if a.reason:
            line += f": {a.reason}"
        click.echo(printable(line))
    click.echo(res.table())
    if timer is None:
        from npu_deploy.converters.lowering.cost import accuracy_note

        click.echo(printable(f"estimates: {accuracy_note(res.soc)}"))
    if timer is not None:
        click.echo(printable(f"measured by: {res.measured_by}"))
    if json_path:
        click.echo(f"json written: {json_path}")
    click.echo(res.verdict())
