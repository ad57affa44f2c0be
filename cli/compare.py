"""``npu-deploy compare REFERENCE.onnx TARGET``: outputs against onnxruntime, with tolerances.

Exit 0 when every output passes, 1 when any fails (2 bad input, 3 environment).

Polygraphy's spellings work: ``--check-error-stat max|mean|median|elemwise``, per-output tolerances
(``--atol 1e-4 --atol out1:1e-3 --rtol 1e-2``), ``--val-range [0,1] x:[0,255]``,
``--data-loader-npz`` (= ``--load-inputs``, repeatable: several samples) and ``--samples N``.
"""

from __future__ import annotations

import click

from npu_deploy._display import plural
from npu_deploy.cli.options import (HabitCommand, apply, input_shape_option, parse_input_shapes, parse_tolerances,
                                    parse_val_ranges, per_output_tolerance_options, refuse_overwriting)
from npu_deploy._text import printable
from npu_deploy.errors import InputError


@click.command("compare", cls=HabitCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("reference", type=click.Path(dir_okay=False))
@click.argument("target", type=click.Path(dir_okay=False))
@apply(per_output_tolerance_options)
@click.option("--check-error-stat", "error_stat", type=click.Choice(["elemwise", "max", "mean", "median"]),
              default=None, help="What is held against atol/rtol (Polygraphy): every element (elemwise, the "
                                 "default), or the max / mean / median error of each output.")
@click.option("--val-range", "val_range", multiple=True, metavar="[NAME:][LO,HI]",
              help="Value range of generated inputs: [0,1] for all, x:[0,255] for one (repeatable).")
@click.option("--samples", type=click.IntRange(min=1), default=1, show_default=True,
              help="Generated input samples (seeds SEED, SEED+1, ...); all are judged together.")
@click.option("--cosine-min", type=float, default=None,
              help="Minimum cosine similarity per output (default 0.999 for float16 models, else unchecked).")
@click.option("--max-outside", type=float, default=None, metavar="SHARE",
              help="Share of elements allowed outside --atol/--rtol (default 0; 0.001 for float16 models).")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE",
              help="An input (.npy, or raw .bin shaped by the model). Repeatable. Others are generated.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed for generated inputs.")
@input_shape_option()
@click.option("--save-inputs", type=click.Path(dir_okay=False), default=None,
              help="Save the inputs used to an .npz, to replay a failing case.")
@click.option("--load-inputs", "--data-loader-npz", "load_inputs", type=click.Path(dir_okay=False), multiple=True,
              help="Use the inputs from an .npz written by --save-inputs; repeat for several samples.")
@click.option("--output", "output_names", multiple=True, metavar="NAME",
              help="Compare only this output (repeatable). Default: all.")
@click.option("--backend", type=click.Choice(["auto", "emulator", "acl"]), default="auto", show_default=True)
@click.option("--device", "device_id", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the metrics and verdict as JSON.")
@click.pass_context
def command(ctx, reference, target, atol, rtol, error_stat, val_range, samples, cosine_min, max_outside, inputs,
            seed, input_shape, save_inputs, load_inputs, output_names, backend, device_id, json_path):
    """Compare TARGET (bundle or .om) with onnxruntime (float32) on REFERENCE.onnx.

    Prints per output: cosine similarity, max absolute and relative error, RMSE, share of elements
    outside --atol/--rtol, NaN/Inf counts. Exit 0 when all pass, 1 when any fails.

    Example: npu-deploy compare model.onnx model.bundle --save-inputs case.npz
    """
    from npu_deploy.cli.run import build_feeds, input_files
    from npu_deploy.runtime.check.compare import check_thresholds, compare, load_inputs as load_npz
    from npu_deploy.runtime.check.preflight import debug_precision_command, needs_preflight
    from npu_deploy.runtime.session import InferenceSession

    if load_inputs and inputs:
        raise InputError("give either --load-inputs or --input, not both")
    # --save-inputs may rewrite the --load-inputs file (same arrays); it may not replace a model
    atol = parse_tolerances(atol, option="--atol")
    rtol = parse_tolerances(rtol, option="--rtol")
    ranges = parse_val_ranges(val_range)
    check_thresholds(cosine_min=cosine_min, max_outside=max_outside)
    if (load_inputs or inputs) and (ranges or samples > 1):
        raise InputError("--val-range and --samples shape generated inputs; the inputs here are given",
                         hint="drop them, or drop --input / --load-inputs")
    refuse_overwriting([("--save-inputs", save_inputs), ("--json", json_path)],
                       [("reference model", reference), ("target model", target),
                        *[("input file", p) for p in input_files(inputs)],
                        *[("--load-inputs file", f) for f in load_inputs or ()]])
    if json_path and load_inputs:
        refuse_overwriting([("--json", json_path)], [("--load-inputs file", f) for f in load_inputs])
    shapes = parse_input_shapes(input_shape, option="--input-shape")
    with InferenceSession(target, device_id=device_id, backend=backend) as sess:
        feeds = None
        if load_inputs:
            feeds = [load_npz(f) for f in load_inputs]
        elif inputs:
            from npu_deploy.runtime.check.compare import generate_inputs, index_ranges

            metas = [m.meta for m in sess.get_inputs()]   # TensorMeta: -1 on dynamic dims, not None
            given = build_feeds(metas, inputs, None, None, shapes, None, seed)
            # inputs not given on the command line are generated from the seed
            feeds = {**generate_inputs([m for m in metas if m.name not in given], seed=seed, shapes=shapes,
                                       index_ranges=index_ranges(reference)), **given}
        res = compare(reference, sess, inputs=feeds, seed=seed, input_shapes=shapes, atol=atol, rtol=rtol,
                      cosine_min=cosine_min, max_outside=max_outside, output_names=list(output_names) or None,
                      save_inputs_to=save_inputs, error_stat=error_stat, val_range=ranges or None,
                      samples=samples)
        precision_mode = sess.precision_mode
    res.target = str(target)
    click.echo(f"reference: {reference} (onnxruntime, float32)")
    click.echo(f"target:    {target} ({res.backend})")
    for n, info in res.inputs.items():
        click.echo(printable(f"  input {n}: {info['dtype']} {tuple(info['shape'])}"))
    if res.samples > 1:
        click.echo(f"  {plural(res.samples, 'sample')}, judged together")
    if save_inputs:
        click.echo(f"inputs saved: {save_inputs}" + (" (the first sample)" if res.samples > 1 else ""))
    click.echo(res.table())
    for line in res.histogram_lines():
        click.echo(printable(line))
    for note in res.notes:
        click.echo(f"npu-deploy: note: {note}", err=True)
    if json_path:
        res.to_json(json_path)
        click.echo(f"json written: {json_path}")
    click.echo(res.verdict())
    if not res and precision_mode and needs_preflight(precision_mode):
        click.echo(f"next: find the ops to keep in float32 ({precision_mode} bundle): "
                   + debug_precision_command(reference, precision_mode, input_shape))
    ctx.exit(0 if res else 1)
