"""``npu-deploy profile``: FormatTrans share of a profile (``analyze``), or profile a model and analyse (``run``)."""

from __future__ import annotations

import click

from npu_deploy._text import printable
from npu_deploy.cli.options import apply, input_shape_option, parse_input_shapes, refuse_overwriting, soc_option_with
from npu_deploy.profiling.analyze import FORMATTRANS_THRESHOLD_PCT

_CTX = {"help_option_names": ["-h", "--help"]}

_analysis_options = [
    click.option("--threshold", type=click.FloatRange(0, 100), default=FORMATTRANS_THRESHOLD_PCT, show_default=True,
                 help="Flag when FormatTrans exceeds this % of device compute time."),
    click.option("--include-transpose/--no-include-transpose", default=True, show_default=True,
                 help="Count Transpose, TransposeD and ConfusionTransposeD in the flagged total."),
    click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                 help="Write the full report as JSON (schema npu-deploy/profile-report v1)."),
    click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
                 help="Write a self-contained HTML report."),
    click.option("--fail-on-flag", is_flag=True,
                 help="Exit 1 when the share is above the threshold, overall or in any one capture or device (for CI)."),
    click.option("--top", type=click.IntRange(1, 1000), default=10, show_default=True,
                 help="Rows in the terminal tables."),
    click.option("--wide", is_flag=True, help="Print every op name whole (default: long names are shortened "
                                              "in the middle, keeping their ends)."),
]


@click.group("profile", context_settings=_CTX)
def command():
    """Find format-conversion (FormatTrans) overhead in Ascend profiler output.

    \b
    Examples:
      npu-deploy profile analyze PROF_000001_20230628101435646_FKFLNPEPPRRCFCBA
      npu-deploy profile analyze rank0_ascend_pt --html report.html --fail-on-flag
      npu-deploy profile analyze cluster_dir/ --cluster --html ranks.html   (one *_ascend_pt per rank)
      npu-deploy profile run model.onnx --input-shape x:1,3,224,224
    """


def _finish(ctx: click.Context, report, json_path, html_path, fail_on_flag, top, wide=False) -> None:
    from npu_deploy.profiling.report import render_text, write_html

    for w in report.warnings:
        click.echo(f"npu-deploy: warning: {printable(w)}", err=True)
    if json_path:
        report.to_json(json_path)
    if html_path:
        write_html(report, html_path)
    click.echo(render_text(report, top=top, wide=wide))
    if json_path:
        click.echo(f"JSON report: {json_path}")
    if html_path:
        click.echo(f"HTML report: {html_path}")
    click.echo(printable(report.verdict()))
    ctx.exit(1 if (fail_on_flag and report.flagged) else 0)


@command.command("analyze", context_settings=_CTX)
@click.argument("path", type=click.Path())
@apply(_analysis_options)
@click.option("--cluster", "cluster", is_flag=True, default=False,
              help="The cluster view of a folder of per-rank profiles (*_ascend_pt / *_ascend_ms / PROF_* / "
                   "device_N / rank* folders): one verdict per rank, parsed in parallel, the slowest rank, "
                   "TransData that differs between ranks; a folder that is not a profile is skipped.")
@click.option("--workers", type=click.IntRange(1, 512), default=None,
              help="Cluster view (implies --cluster): ranks parsed in parallel (default: the CPU count).")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="Cluster view (implies --cluster): parse the ranks as Ray tasks on this cluster (host:port, ray://host:port or "
                   "auto; the folder must be at the same path on every node). Needs Ray: pip install '.[ray]' in the npu-deploy clone.")
@click.option("--plan", "plan_bundle", type=click.Path(dir_okay=False), default=None, metavar="MODEL.bundle",
              help="Our bundle of the same model: planned vs measured TransData and the furthest-off estimates.")
@click.pass_context
def analyze(ctx, path, threshold, include_transpose, json_path, html_path, fail_on_flag, top, wide, cluster, workers,
            ray_address, plan_bundle):
    """Analyse what msprof / torch_npu / MindSpore wrote under PATH.

    PATH is a PROF_* folder, a *_ascend_pt / *_ascend_ms folder, a MindSpore 1.x profiler folder
    (aicore_intermediate_*_type.csv), a folder holding several of them, an msprof_*.db /
    ascend_pytorch_profiler*.db export, or one op_summary / kernel_details / op_statistic CSV or
    timeline JSON. Shares are of device compute time (communication excluded).

    With several captures or devices, each gets its own verdict line, then the summary; one above
    the threshold flags the run (and fails it with --fail-on-flag).

    One source is read per capture, the richest; two copies of the same data (a kernel_details.csv and the
    op_summary it was made from, a capture copied twice) are read once, and the output lists every file
    found with the reason it was not used ("same data as X").

    Exit codes: 0 analysed, 1 flagged with --fail-on-flag, 2 nothing usable found.
    """
    from npu_deploy.profiling.analyze import analyze_profile

    refuse_overwriting([("--json", json_path), ("--html", html_path)], [("profile file", path)])
    if cluster or workers is not None or ray_address is not None:
        _analyze_cluster(ctx, path, threshold, include_transpose, json_path, html_path, fail_on_flag, top,
                         workers, ray_address)
        return
    report = analyze_profile(path, threshold=threshold, include_transpose=include_transpose)
    if plan_bundle is not None:
        from npu_deploy.converters.files.bundle import read_bundle
        from npu_deploy.profiling.ops import compare_with_plan, read_measured_ops

        with read_bundle(plan_bundle) as b:
            manifest = b.manifest
        for line in compare_with_plan(read_measured_ops(path), manifest).lines(top):
            click.echo(printable(line))
    _finish(ctx, report, json_path, html_path, fail_on_flag, top, wide)


def _analyze_cluster(ctx, path, threshold, include_transpose, json_path, html_path, fail_on_flag, top, workers,
                     ray_address) -> None:
    """``profile analyze CLUSTER_DIR``: one verdict per rank, then the cluster view."""
    from npu_deploy.errors import ProfileError
    from npu_deploy.profiling.cluster import analyze_cluster, render_cluster_text, write_cluster_html

    rep = analyze_cluster(path, threshold=threshold, include_transpose=include_transpose, workers=workers,
                          address=ray_address)
    for r in rep.skipped():
        click.echo(f"npu-deploy: warning: {printable(r.rank)} skipped: not a profile ({printable(r.error or '')})",
                   err=True)
    if not rep.analysed():
        raise ProfileError(f"none of the {len(rep.ranks)} entries holds a profile", path=str(path),
                           hint="give the folder holding one *_ascend_pt / PROF_* folder per rank")
    if json_path:
        rep.to_json(json_path)
    if html_path:
        write_cluster_html(rep, html_path)
    click.echo(render_cluster_text(rep, top=top))
    if json_path:
        click.echo(f"JSON report: {json_path}")
    if html_path:
        click.echo(f"HTML report: {html_path}")
    click.echo(printable(rep.verdict()))
    ctx.exit(1 if (fail_on_flag and rep.flagged) else 0)


@command.command("run", context_settings=_CTX)
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--output-dir", "-o", type=click.Path(file_okay=False), default="npu-deploy-profile",
              show_default=True, help="Where the profile folder (PROF_*) is written.")
@input_shape_option(note="Needed to convert an ONNX model with dynamic dims; a bundle runs at these shapes, "
                         "else its first gear, other dynamic dims as 1.")
@click.option("--loops", type=click.IntRange(1, 1000), default=1, show_default=True, help="Profiled runs.")
@click.option("--msprof/--emulator", "use_msprof", default=None,
              help="Force msprof (an Ascend host) or the emulator's estimated profile (default: msprof when on PATH).")
@click.option("--timeout", type=float, default=None, help="Seconds to allow msprof.")
@soc_option_with("SoC an ONNX model is converted for (a name, or a SoC profile JSON from `cost fit`, "
                 "whose figures price the emulator's estimate; default Ascend310P3).")
@apply(_analysis_options)
@click.pass_context
def run(ctx, model, run_args, output_dir, input_shape, loops, use_msprof, timeout, soc, threshold,
        include_transpose, json_path, html_path, fail_on_flag, top, wide):
    """Profile MODEL (.onnx, bundle or .om) and analyse the profile.

    With msprof on PATH, MODEL runs as `npu-deploy run MODEL` under msprof; arguments after `--` go to
    that `npu-deploy run`. Elsewhere MODEL runs on the CPU emulator and the profile holds the cost
    model's estimated durations; the verdict line says so.
    """
    from npu_deploy.profiling.run import profile_model

    import shutil

    refuse_overwriting([("--json", json_path), ("--html", html_path)], [("model", model)])
    shapes = parse_input_shapes(input_shape)
    will_msprof = use_msprof if use_msprof is not None else shutil.which("msprof") is not None
    if run_args and not will_msprof:
        click.echo(f"npu-deploy: warning: ignoring {' '.join(run_args)}: arguments after -- go to "
                   "`npu-deploy run` under msprof, and msprof is not used here", err=True)
    report = profile_model(model, output_dir, input_shapes=shapes, loops=loops, run_args=run_args,
                           threshold=threshold, include_transpose=include_transpose, use_msprof=use_msprof,
                           timeout=timeout, soc=soc)
    if report.estimated:
        from npu_deploy.converters.lowering.cost import accuracy_note, estimated_profile_soc

        click.echo(printable(f"npu-deploy: note: estimated profile: "
                             f"{accuracy_note(soc or estimated_profile_soc(report.path))}"), err=True)
    _finish(ctx, report, json_path, html_path, fail_on_flag, top, wide)
