"""``npu-deploy compare REFERENCE.onnx TARGET``: outputs against onnxruntime, with tolerances.

Exit 0 when every output passes, 1 when any fails (2 bad input, 3 environment).
"""

from __future__ import annotations

import click

from npu_deploy.cli.options import apply, parse_input_shapes, refuse_overwriting, tolerance_options
from npu_deploy._text import printable
from npu_deploy.errors import InputError


@click.command("compare", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("reference", type=click.Path(dir_okay=False))
@click.argument("target", type=click.Path(dir_okay=False))
@apply(tolerance_options)
@click.option("--cosine-min", type=float, default=None,
              help="Minimum cosine similarity per output (default 0.999 for float16 models, else unchecked).")
@click.option("--max-outside", type=float, default=None, metavar="SHARE",
              help="Share of elements allowed outside --atol/--rtol (default 0; 0.001 for float16 models).")
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE",
              help="An input (.npy, or raw .bin shaped by the model). Repeatable. Others are generated.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed for generated inputs.")
@click.option("--input-shape", default=None, metavar="NAME:DIMS;...",
              help="Concrete shapes for dynamic inputs, e.g. 'x:1,3,640,640'.")
@click.option("--save-inputs", type=click.Path(dir_okay=False), default=None,
              help="Save the inputs used to an .npz, to replay a failing case.")
@click.option("--load-inputs", type=click.Path(dir_okay=False), default=None,
              help="Use the inputs from an .npz written by --save-inputs.")
@click.option("--output", "output_names", multiple=True, metavar="NAME",
              help="Compare only this output (repeatable). Default: all.")
@click.option("--backend", type=click.Choice(["auto", "emulator", "acl"]), default="auto", show_default=True)
@click.option("--device", "device_id", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the metrics and verdict as JSON.")
@click.pass_context
def command(ctx, reference, target, atol, rtol, cosine_min, max_outside, inputs, seed, input_shape, save_inputs,
            load_inputs, output_names, backend, device_id, json_path):
    """Compare TARGET (bundle or .om) with onnxruntime (float32) on REFERENCE.onnx.

    Prints per output: cosine similarity, max absolute and relative error, RMSE, share of elements
    outside --atol/--rtol, NaN/Inf counts. Exit 0 when all pass, 1 when any fails.

    Example: npu-deploy compare model.onnx model.bundle --save-inputs case.npz
    """
    from npu_deploy.cli.run import build_feeds, input_files
    from npu_deploy.runtime.compare import check_thresholds, compare, load_inputs as load_npz
    from npu_deploy.runtime.session import InferenceSession

    if load_inputs and inputs:
        raise InputError("give either --load-inputs or --input, not both")
    # --save-inputs may rewrite the --load-inputs file (same arrays); it may not replace a model
    check_thresholds(atol=atol, rtol=rtol, cosine_min=cosine_min, max_outside=max_outside)
    refuse_overwriting([("--save-inputs", save_inputs), ("--json", json_path)],
                       [("reference model", reference), ("target model", target),
                        *[("input file", p) for p in input_files(inputs)]])
    if json_path and load_inputs:
        refuse_overwriting([("--json", json_path)], [("--load-inputs file", load_inputs)])
    shapes = parse_input_shapes(input_shape, option="--input-shape")
    with InferenceSession(target, device_id=device_id, backend=backend) as sess:
        feeds = None
        if load_inputs:
            feeds = load_npz(load_inputs)
        elif inputs:
            from npu_deploy.runtime.compare import generate_inputs

            metas = sess.get_inputs()
            given = build_feeds(metas, inputs, None, None, shapes, None, seed)
            # inputs not given on the command line are generated from the seed
            feeds = {**generate_inputs([m for m in metas if m.name not in given], seed=seed, shapes=shapes),
                     **given}
        res = compare(reference, sess, inputs=feeds, seed=seed, input_shapes=shapes, atol=atol, rtol=rtol,
                      cosine_min=cosine_min, max_outside=max_outside, output_names=list(output_names) or None,
                      save_inputs_to=save_inputs)
    res.target = str(target)
    click.echo(f"reference: {reference} (onnxruntime, float32)")
    click.echo(f"target:    {target} ({res.backend})")
    for n, info in res.inputs.items():
        click.echo(printable(f"  input {n}: {info['dtype']} {tuple(info['shape'])}"))
    if save_inputs:
        click.echo(f"inputs saved: {save_inputs}")
    click.echo(res.table())
    if json_path:
        res.to_json(json_path)
        click.echo(f"json written: {json_path}")
    click.echo(res.verdict())
    ctx.exit(0 if res else 1)
