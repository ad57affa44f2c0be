"""``npu-deploy cost check`` / ``cost fit``: the cost model against real captures, and calibrating it.

``check`` predicts every measured op of a capture (its type, shapes, dtypes, formats) and compares;
exit 1 when ``--max-error`` is exceeded, 2 for a capture it cannot use (Level0: no shapes).
``fit`` fits a SoC profile JSON to captures; the JSON works wherever ``--soc`` takes a profile.
"""

from __future__ import annotations

import json

import click

from npu_deploy._text import printable
from npu_deploy.cli.options import refuse_overwriting
from npu_deploy.errors import InputError

_CTX = {"help_option_names": ["-h", "--help"]}


@click.group("cost", context_settings=_CTX)
def command():
    """Check the cost model against real profiler captures, or fit a SoC profile to them.

    \b
    Examples:
      npu-deploy cost check rank1_ascend_pt --html cost.html
      npu-deploy cost check PROF_000001_... --soc mysoc.json --max-error 25
      npu-deploy cost fit run1_ascend_pt run2_ascend_pt -o mysoc.json --base Ascend910B
      npu-deploy cost fit run_ascend_pt -o my910b4.json --part Ascend910B4
    """


def _read(paths, cmd: str) -> list:
    from npu_deploy.profiling.ops import read_measured_ops

    caps = []
    for p in paths:
        caps += read_measured_ops(p)
    shaped = [c for c in caps if c.has_shapes]
    if not shaped:
        level = next((c.level for c in caps if c.level), None)
        raise InputError(f"{', '.join(map(str, paths))}: no op shapes in this capture"
                         f"{f' ({level})' if level else ''}; `{cmd}` needs a Level1 or higher capture",
                         hint="profile again with profiler level Level1 (torch_npu _profiler_level) or "
                              "msprof --aic-metrics, which record input/output shapes")
    for c in caps:
        if not c.has_shapes:
            click.echo(f"npu-deploy: warning: {printable(c.label)}: no op shapes (Level0?), not used", err=True)
        for w in c.warnings:
            click.echo(f"npu-deploy: warning: {printable(w)}", err=True)
    return shaped


@command.command("check", context_settings=_CTX)
@click.argument("captures", nargs=-1, required=True, type=click.Path(exists=False))
@click.option("--soc", default=None, metavar="SOC|profile.json",
              help="Cost profile to check (default: the SoC part the capture records, else the 910B part "
                   "its block dims show, else Ascend910B).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write every op, the totals and the FormatTrans shares as JSON (npu-deploy/cost-check v1).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Write a self-contained HTML page with a log-log scatter of predicted vs measured.")
@click.option("--max-error", type=click.FloatRange(0, None), default=None, metavar="PCT",
              help="Exit 1 when the median |error| of the priced ops is above PCT.")
@click.option("--top", type=click.IntRange(1, 1000), default=25, show_default=True, help="Op types shown.")
@click.pass_context
def check_cmd(ctx, captures, soc, json_path, html_path, max_error, top):
    """Predict every measured op of CAPTURE(S) with the cost model and compare with the measurement."""
    from npu_deploy._io import atomic_write
    from npu_deploy.converters.lowering import costcheck

    refuse_overwriting([("--json", json_path), ("--html", html_path)], [("capture", c) for c in captures])
    caps = _read(captures, "cost check")
    soc_of = None
    if soc is None:
        # each capture on the part it ran on: named in the capture, else inferred from its block dims
        choice = {c.label: costcheck.capture_part(c.ops, c.soc) for c in caps}
        soc_of = {k: v.soc for k, v in choice.items()}
        soc = next(iter(soc_of.values()))
        note = "\n".join((f"{k}: " if len(caps) > 1 else "") + f"{v.soc} — {v.why} (--soc to choose)"
                         for k, v in choice.items())
    else:
        note = f"{soc} — given with --soc"
    skipped: dict[str, int] = {}
    for c in caps:
        for k, n in c.skipped.items():
            if k != "communication":
                skipped[k] = skipped.get(k, 0) + n
    report = costcheck.check([o for c in caps for o in c.ops], soc, max_error_pct=max_error, skipped=skipped,
                             captures=[c.label for c in caps], soc_of=soc_of, soc_note=note)
    if json_path:
        report.to_json(json_path)
    if html_path:
        text = costcheck.render_html(report)
        with atomic_write(html_path, "w", encoding="utf-8") as f:
            f.write(text)
    for line in costcheck.render_text(report, top=top).splitlines():
        click.echo(printable(line))
    if json_path:
        click.echo(f"JSON: {json_path}")
    if html_path:
        click.echo(f"HTML: {html_path}")
    ctx.exit(0 if report else 1)


@command.command("fit", context_settings=_CTX)
@click.argument("captures", nargs=-1, required=True, type=click.Path(exists=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), metavar="PROFILE.json",
              help="Write the fitted SoC profile here (usable as --soc PROFILE.json).")
@click.option("--base", default="Ascend910B", show_default=True, metavar="SOC|profile.json",
              help="Profile whose peaks are kept and whose parameters start the fit.")
@click.option("--name", default=None, help="Name of the fitted profile (default: <base>-fitted).")
@click.option("--part", default=None, metavar="SOC",
              help="The 910B part every capture ran on (e.g. Ascend910B4); default: the part each capture "
                   "names, else the one its block dims show.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the fit report (parameters, in-sample and leave-one-capture-out error).")
@click.pass_context
def fit_cmd(ctx, captures, output, base, name, part, json_path):
    """Fit launch overheads, TransData bandwidths, cube/vector efficiencies and AI CPU costs to CAPTURE(S)."""
    from npu_deploy._io import atomic_write
    from npu_deploy.converters.lowering import cost as costmod
    from npu_deploy.converters.lowering import costcheck

    refuse_overwriting([("-o", output), ("--json", json_path)], [("capture", c) for c in captures])
    caps = _read(captures, "cost fit")
    base_profile = costmod.get_soc_profile(base)
    if part is not None:
        costmod.get_soc_profile(part)  # an unknown name is refused here, before the fit
    prof, res = costcheck.fit([(c.label, c.ops) for c in caps], base_profile, name=name,
                              parts={c.label: part for c in caps} if part else None)
    d = costcheck.profile_dict(prof, base_profile.name if base_profile.name in costmod.SOC_PROFILES
                               else "Ascend910B")
    text = json.dumps(d, indent=1, sort_keys=True, allow_nan=False)
    costmod.SocProfile.from_dict(json.loads(text))  # what we write must read back
    with atomic_write(output, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    if json_path:
        res.to_json(json_path)
    click.echo(f"fitted on {', '.join(res.captures)}")
    for label, part in res.parts.items():
        click.echo(printable(f"  {label} priced as {part['soc']}: {part['why']}"))
    click.echo(f"left out of the fit: {res.n_excluded} implausible measurement{'' if res.n_excluded == 1 else 's'}"
               f" (faster than HBM allows beyond L2)")
    for label, rows in res.excluded.items():
        for r in rows[:5]:
            click.echo(printable(f"  {label}: {r['type']} {costcheck._short(r['name'])}: {r['why']}"))
        if len(rows) > 5:
            click.echo(f"  {label}: ... {len(rows) - 5} more (--json has every one)")
    for k, v in res.parameters.items():
        click.echo(f"  {k:<52} {v:.4g}")
    for label, s in (("in sample", res.in_sample), ("leave one capture out", res.leave_one_out)):
        if not s:
            continue
        per = ", ".join(f"{k} {v['median_abs_err_pct']:.0f} %" for k, v in s["per_class"].items())
        click.echo(f"{label}: median op error {s['median_abs_err_pct']:.1f} % ({per}); total "
                   f"{s['total_error_pct']:+.1f} %")
    click.echo(printable(res.verdict()))
    click.echo(f"profile: {output} (use it as --soc {output})")
    ctx.exit(0)
