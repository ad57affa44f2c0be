"""``npu-deploy debug``: accuracy debugging after conversion.

* ``debug compare MODEL.onnx DUMPS``: every dumped tensor against onnxruntime, the first divergent node
  and whether error enters there or accumulates (exit 1 when a tensor is beyond tolerance).
* ``debug precision MODEL.onnx``: search a small set of ops to keep in float32 so that the float16 model
  reaches a target; writes ATC's ``--keep_dtype`` file (exit 1 when the target cannot be reached).
"""

from __future__ import annotations

import os
import sys

import click

from npu_deploy._text import printable
from npu_deploy._io import check_dest
from npu_deploy.cli.options import input_shape_option, parse_input_shapes, refuse_overwriting, soc_option_with
from npu_deploy.errors import InputError, Interrupted

_CTX = {"help_option_names": ["-h", "--help"]}


@click.group("debug", context_settings=_CTX)
def command():
    """Accuracy debugging: layer-by-layer compare of device dumps, and the search for ops to keep in float32."""


@command.command("compare", context_settings=_CTX)
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("dumps", type=click.Path())
@click.option("--bundle", type=click.Path(dir_okay=False), default=None,
              help="The bundle the dump was taken from (name mapping; its TransData are device-only rows).")
@click.option("--om", "om", type=click.Path(dir_okay=False), default=None,
              help="The .om the dump was taken from (name mapping through its fusion attributes).")
@click.option("--inputs", "inputs", type=click.Path(dir_okay=False), default=None,
              help="The .npz of the arrays the dumped run was fed (default: an inputs.npz in DUMPS).")
@click.option("--input", "input_files", multiple=True, metavar="NAME=FILE.npy",
              help="One input as .npy (repeatable), instead of --inputs.")
@click.option("--cosine-min", type=float, default=None,
              help="Minimum cosine per tensor (default 0.99 for float16 tensors, 0.9999 for float32).")
@click.option("--atol", type=float, default=None, help="Also check |device - golden| <= atol + rtol*|golden|.")
@click.option("--rtol", type=float, default=None, help="Relative tolerance for that check.")
@click.option("--max-outside", type=float, default=None, metavar="SHARE",
              help="Share of elements allowed outside --atol/--rtol (default 0).")
@click.option("--isolate", type=click.IntRange(min=0), default=8, show_default=True,
              help="Run the first N failing nodes alone to tell where error enters (0: none).")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              help="Rows of the terminal table (worst first).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Write every row as CSV with msaccucmp's column names.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the result as JSON.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Write a self-contained HTML page with a per-layer error chart.")
@click.pass_context
def compare_command(ctx, model, dumps, bundle, om, inputs, input_files, cosine_min, atol, rtol, max_outside, isolate, top,
                    csv_path, json_path, html_path):
    """Compare the dumped tensors in DUMPS (a dump folder or file) with onnxruntime on MODEL.onnx.

    Golden values come from one onnxruntime run with every node output exposed (graph optimisation
    off), fed the inputs the dump was taken with. Exit 0 when every tensor is within tolerance, 1 when
    one is not.

    Example: npu-deploy run model.bundle --input x=x.npy --dump d/ &&
    npu-deploy debug compare model.onnx d/ --bundle model.bundle --input x=x.npy --html report.html
    """
    from npu_deploy.runtime.check.debug_compare import debug_compare

    outs = [("--csv", csv_path), ("--json", json_path), ("--html", html_path)]
    # a dump file's folder holds the inputs.npz and mapping.csv that are read with it
    dump_folder = os.path.dirname(os.path.abspath(dumps)) if os.path.isfile(dumps) else None
    refuse_overwriting(outs, [("model", model), ("dump", dumps), ("dump folder", dump_folder), ("bundle", bundle),
                              ("om", om), ("inputs", inputs),
                              *[("input file", f.partition("=")[2]) for f in input_files]])
    for _, p in outs:
        if p:
            check_dest(p)
    if not os.path.exists(dumps):
        raise InputError(f"dump folder {dumps} does not exist", hint="give the folder run --dump or ACL wrote")
    if input_files:
        if inputs:
            raise InputError("give either --inputs or --input, not both")
        inputs = _npy_inputs(input_files)
    res = debug_compare(model, dumps, inputs=inputs, bundle=bundle, om=om, cosine_min=cosine_min, atol=atol,
                        rtol=rtol, max_outside=max_outside, isolate=isolate)
    click.echo(printable(f"model: {model} (onnxruntime, float32, every node output)"))
    click.echo(printable(f"dumps: {res.dumps} (mapping: {res.mapping}); {len(res.compared())} tensors compared"))
    click.echo(res.table(top))
    for line in res.summary_lines():
        click.echo(line)
    if csv_path:
        res.write_csv(csv_path)
        click.echo(f"csv written: {csv_path}")
    if json_path:
        res.to_json(json_path)
        click.echo(f"json written: {json_path}")
    if html_path:
        res.write_html(html_path)
        click.echo(f"html written: {html_path}")
    click.echo(res.verdict())
    ctx.exit(0 if res else 1)


@command.command("precision", context_settings=_CTX)
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--inputs", "inputs", type=click.Path(dir_okay=False), multiple=True,
              help="An .npz of model inputs: one sample, or several as NAME@0, NAME@1... (repeatable). "
                   "Default: generated samples.")
@click.option("--samples", type=click.IntRange(min=1), default=1, show_default=True,
              help="Generated samples when --inputs is not given.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed for generated samples.")
@input_shape_option()
@click.option("--cosine", type=float, default=None, help="Target: worst output cosine (default 0.999).")
@click.option("--max-abs", type=float, default=None, help="Target instead: largest output absolute error.")
@click.option("--mode", type=click.Choice(["force_fp16", "allow_mix_precision"]), default="force_fp16",
              show_default=True, help="The precision mode the model is converted with.")
@click.option("--by-type", is_flag=True, help="Keep op types (OpType::X entries) rather than single ops.")
@click.option("--backend", type=click.Choice(["emulator", "atc"]), default="emulator", show_default=True,
              help="Where candidates run: the CPU emulator's float16 emulation, or (on a CANN host) ATC + ACL "
                   "on the device. ATC + ACL: verified against stand-ins only.")
@click.option("--atc", "atc_path", default=None, metavar="PATH",
              help="The atc executable for --backend atc (default: found on PATH or $ASCEND_TOOLKIT_HOME).")
@soc_option_with("SoC the candidates are planned for and their latency priced on (a name, or a SoC profile "
                 "JSON from `cost fit`: planned for its base SoC, priced with its figures; default Ascend310P3).")
@click.option("-o", "--output", default=None, metavar="keep_dtype.cfg",
              help="Write the keep list as ATC's --keep_dtype file (also taken by convert --keep-dtype).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the result (with the search trace) as JSON.")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="Evaluations saved here as they run; a re-run resumes from it (default: OUTPUT.checkpoint.json, "
                   "removed when the search completes).")
@click.option("--progress/--no-progress", default=None, help="Progress lines on stderr (default: on a terminal).")
@click.pass_context
def precision_command(ctx, model, inputs, samples, seed, input_shape, cosine, max_abs, mode, by_type, backend,
                      atc_path, soc, output, json_path, checkpoint, progress):
    """Find a small set of ops of MODEL.onnx to keep in float32 so that it reaches the target under --mode.

    The search (bisection over the topologically ordered ops, then a greedy prune) runs on the CPU
    emulator's float16 emulation; with --backend atc each candidate is compiled by ATC (--keep_dtype) and
    run through ACL instead (ATC + ACL: verified against stand-ins only; the latency figures stay the
    cost model's estimates). Exit 0 when the target is reached, 1 when it cannot be, 3 when ATC or the
    device fails.

    Example: npu-deploy debug precision model.onnx --cosine 0.999 -o keep_dtype.cfg &&
    npu-deploy convert model.onnx --keep-dtype keep_dtype.cfg
    """
    from npu_deploy.runtime.check.precision import PrecisionSearch, load_samples

    refuse_overwriting([("-o", output), ("--json", json_path), ("--checkpoint", checkpoint)],
                       [("model", model), *[("inputs", p) for p in inputs]])
    for p in (output, json_path, checkpoint):
        if p:
            check_dest(p)
    explicit_checkpoint = checkpoint is not None
    if checkpoint is None:
        checkpoint = f"{output}.checkpoint.json" if output else \
            f"{os.path.splitext(os.path.basename(model))[0]}.precision-checkpoint.json"
    shapes = parse_input_shapes(input_shape, option="--input-shape")
    show = sys.stderr.isatty() if progress is None else progress
    say = (lambda text: click.echo(printable(text), err=True)) if show else None
    search = PrecisionSearch(model, samples=load_samples(inputs) if inputs else None, n_samples=samples, seed=seed,
                             input_shapes=shapes or None, mode=mode, cosine=cosine, max_abs=max_abs, by_type=by_type,
                             soc=soc, checkpoint=checkpoint, progress=say, backend=backend, atc=atc_path)
    where = "ATC + ACL (verified against stand-ins only)" if backend == "atc" else "emulator"
    click.echo(printable(f"model: {model}; {mode}; {len(search.candidates)} candidate "
                         f"{'op types' if by_type else 'ops'} in float16; {len(search.samples)} sample(s); "
                         f"judged on {where}"))
    try:
        res = search.run()
    except (Interrupted, KeyboardInterrupt):
        res = search.result(complete=False)
        _print_result(res)
        click.echo(printable(f"interrupted: {len(res.trace)} evaluations kept in {checkpoint}; re-run the same "
                             f"command to resume"), err=True)
        raise
    finally:
        search.close()
    _print_result(res)
    if output and not res.keep:
        click.echo(printable(f"no op needs float32: {output} not written (an empty --keep_dtype file is refused)"))
    elif output:
        res.write_cfg(output)
        click.echo(printable(f"keep list written: {output} (convert --keep-dtype {output}; ATC --keep_dtype={output})"))
    if json_path:
        res.to_json(json_path)
        click.echo(f"json written: {json_path}")
    if not explicit_checkpoint and os.path.isfile(checkpoint):
        os.unlink(checkpoint)
    click.echo(res.verdict())
    ctx.exit(0 if res else 1)


def _print_result(res) -> None:
    shown = res.keep[:20]
    click.echo(f"keep in float32 ({len(res.keep)}): " + (printable(", ".join(shown)) if shown else "(none)")
               + (f", ... {len(res.keep) - 20} more" if len(res.keep) > 20 else ""))
    click.echo(f"accuracy: {res.accuracy_text()} (target {res.target_text()}); {res.mode} alone: "
               f"{res.baseline_text()}")
    if res.est_us is not None and res.baseline_est_us:
        click.echo(f"estimated latency (cost model): {res.est_us:.1f} us with the kept ops, "
                   f"{res.baseline_est_us:.1f} us without ({res.latency_cost_pct():+.1f} %; "
                   + printable(res.cost_accuracy) + ")")
    click.echo(f"search: {res.evaluations} evaluations in {res.seconds:.1f} s")
    for n in res.notes:
        click.echo(printable(f"note: {n}"))


def _npy_inputs(items) -> dict:
    from npu_deploy._io import load_npy

    feeds = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input {item!r} is not NAME=FILE.npy", hint="e.g. --input x=x.npy")
        if not os.path.isfile(path):
            raise InputError(f"--input {name}: file {path} does not exist")
        feeds[name] = load_npy(path)
    return feeds
