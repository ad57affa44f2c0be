"""``npu-deploy inspect FILE``: what an ONNX model, offline bundle or ``.om`` file holds.

The kind is detected from the file's content, not its name. Exit 0 when the file reads cleanly, 1 when
an integrity check fails (bundle checksum, missing external data), 2 when it cannot be read at all.
"""

from __future__ import annotations

import click

from npu_deploy.cli.options import (input_shape_option, parse_input_shapes, parse_int_list, precision_mode_option,
                                    refuse_overwriting, soc_option_with)


@click.command("inspect", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Also write the report as JSON (schema npu-deploy/inspect v1).")
@click.option("--ops", is_flag=True, help="List every node/op (with --soc: its CANN op and engine).")
@click.option("--layers", is_flag=True, help="Show the formats on every node/op's inputs and outputs.")
@soc_option_with("ONNX only: check op support and plan layouts for this SoC (ATC --soc_version, "
                 "e.g. Ascend310P3).")
@precision_mode_option("With --soc: ATC precision mode for the plan.")
@input_shape_option(note="With --soc: fixes the dimensions the plan is made for.")
@click.option("--dynamic-batch", default=None, metavar="B1,B2,...", help="With --soc: batch gears.")
@click.option("--no-verify", is_flag=True, help="Skip the bundle weight checksum (large bundles).")
@click.option("--against", "against_onnx", type=click.Path(dir_okay=False), default=None, metavar="MODEL.onnx",
              help="FILE is an .om: diff the TransData ATC placed against the built-in plan of the ONNX model "
                   "it was built from (the .om's SoC and input shapes; --soc when it records none).")
@click.option("--fail-on-diff", is_flag=True, help="With --against: exit 1 when the two differ.")
@click.pass_context
def command(ctx, file, json_path, ops, layers, soc, precision_mode, input_shape, dynamic_batch, no_verify,
            against_onnx, fail_on_diff):
    """Show what FILE holds: inputs/outputs, dtypes, shapes and gears, ops, and where layouts change.

    FILE may be an ONNX model, an npu-deploy offline bundle or an ATC .om (no CANN needed); the kind
    is told by the file's content. Exit 0 when it reads cleanly, 1 when an integrity check fails,
    2 when it cannot be read.
    """
    from npu_deploy.runtime.check.inspect import inspect, render_text

    refuse_overwriting([("--json", json_path)], [("inspected file", file)])
    if fail_on_diff and against_onnx is None:
        raise click.UsageError("--fail-on-diff goes with --against MODEL.onnx")
    if against_onnx is not None:
        from npu_deploy.runtime.check import against

        refuse_overwriting([("--json", json_path)], [("--against model", against_onnx)])
        diff = against.against(file, against_onnx, soc=soc, precision_mode=precision_mode,
                               input_shapes=parse_input_shapes(input_shape) or None)
        if json_path:
            diff.to_json(json_path)
        click.echo(against.render_text(diff, ops=ops))
        ctx.exit(1 if fail_on_diff and not diff else 0)
    report = inspect(file, soc=soc, ops=ops, layers=layers,
                     input_shapes=parse_input_shapes(input_shape) or None,
                     dynamic_batch=parse_int_list(dynamic_batch, option="--dynamic-batch") or None,
                     precision_mode=precision_mode, verify=not no_verify)
    if json_path:
        report.to_json(json_path)
    click.echo(render_text(report, ops=ops, layers=layers))
    ctx.exit(0 if report else 1)
