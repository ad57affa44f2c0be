"""Render a :class:`~npu_deploy.profiling.analyze.ProfileReport`: terminal text, JSON, self-contained HTML.

JSON schema ``npu-deploy/profile-report``, version 1 (``ProfileReport.to_json``). Top-level keys:

=====================  ===========================================================================
``schema``             ``"npu-deploy/profile-report"``; ``schema_version``: 1
``ok`` / ``verdict``   ``ok`` is false when flagged; ``verdict`` the one-line summary
``path``, ``sources``  what was analysed; ``discovery``: captures with ``used`` / ``cross_check`` /
                       ``not_used`` sources (kind and files; a not-used one also has ``reason``, e.g.
                       "same data as X", and ``same_as``: X's path or null)
``detail``             ``"per-task"`` or ``"totals only"`` (only op_statistic was available)
``threshold_pct``      the flag threshold in % of device compute; ``include_transpose``: bool
``estimated``          true when the profile came from the emulator's cost model
``compute_us``         device compute time (µs; the denominator of every ``*_pct``), ``compute_ops``
``communication_us``   communication time, excluded from compute; ``communication_ops``
``transdata_*``        ``_us``, ``_pct``, ``_ops`` of TransData / TransDataRNN / ReFormat
``transpose_*``        the same for Transpose / TransposeD / ConfusionTransposeD
``formattrans_*``      the flagged total (TransData + Transpose family unless excluded); ``flagged``
``cast_*``             Cast (dtype conversion, never FormatTrans)
``ai_cpu_*``           ``ai_cpu_us``, ``ai_cpu_pct``, ``ai_cpu_ops``: [{op_type, count, total_us,
                       share_pct, dtypes, wide_dtypes}]
``op_types``           [{op_type, category, count, total_us, share_pct, cores}] by time
``task_types``         [{task_type, count, total_us, share_pct}]
``conversions``        [{label, category (format|layout|dtype), op_types, src, dst, count, total_us,
                       mean_us, min_us, max_us, share_pct, shapes: [[shape, count]], top: [instance],
                       in_shape, out_shape}]; ``label`` is ``SRC→DST`` for TransData and Cast, and for
                       a permutation (layout) ``Transpose ND [1024,12,512]→[12,1024,512]`` (its
                       ``in_shape``/``out_shape``), else ``Transpose (ND)``;
                       instance (one op name): {name, op_type, duration_us (mean), count, total_us,
                       max_us, src_format, dst_format, shape, out_shape, dtype, out_dtype, prev_op,
                       next_op, device, stream, file, line} (where: its first run)
``round_trips``        [{label (A→B→A), formats: [A, B], shape, count, saved_us, saved_pct, between,
                       examples: [[first, second]]}]
``suggestions``        [{id, title, detail, evidence}]
``devices``            [{device, compute_us, formattrans_us, share_pct, capture, flagged}] when several
                       captures or devices: one verdict each (``device`` is ``device_0``, or
                       ``<capture>: device_0`` with several captures); one flagged flags the report
``steps``              [{device, kind, count, total_us, mean_us}]: step-trace spans of raw CANN 6.x
                       timelines (``Iteration``, ``FP_BP Time``, ``Iteration Refresh``, ``Reduce``)
``cross_checks``       ``op_statistic_transdata_pct`` (from op_statistic when present),
                       ``msprof_analyze_name_rule_pct`` (kernel name contains cast|transdata|transpose)
``classified_by_name`` rows without an op type, classified by kernel name
``warnings``           skipped rows (file, reason, first line numbers) and other notes
=====================  ===========================================================================

>>> from npu_deploy.profiling.analyze import ProfileReport
>>> print(render_text(ProfileReport(path="p", compute_us=10.0, compute_ops=1)).splitlines()[0])
FormatTrans 0.0 % of device compute (threshold 8 %): ok
"""

from __future__ import annotations

import os
import re

from npu_deploy._display import duration, middle
from npu_deploy._html import esc, gauge, page
from npu_deploy._display import table as text_table
from npu_deploy._io import atomic_write
from npu_deploy._text import printable
from npu_deploy.profiling.analyze import ConversionKind, ProfileReport


def fmt_us(us: float) -> str:
    """``1234.5`` → ``'1.23 ms'``; ``12.345`` → ``'12.3 µs'`` (the one unit rule:
    :func:`npu_deploy._display.duration`)."""
    return duration(None if us is None else float(us) / 1e6)


def kind_label(k: ConversionKind) -> str:
    return k.label


def _clip(text: str | None, n: int) -> str:
    t = "" if text is None else str(text).replace("\n", " ").replace("\r", " ")
    return t if len(t) <= n else t[: n - 1] + "…"


# op names longer than this are shortened in the middle (their distinguishing end kept) unless wide
NAME_WIDTH = 48


def _d(us: float) -> str:
    return duration(us / 1e6)


def _name(text: str | None, wide: bool) -> str:
    t = printable("" if text is None else str(text))
    return t if wide else middle(t, NAME_WIDTH)


def render_text(r: ProfileReport, *, top: int = 10, width: int = 100, wide: bool = False) -> str:
    """The terminal summary: verdict first (with several captures or devices, one verdict each, then the
    summary), then shares, conversion kinds, top instances, round trips, suggestions.

    The tables are aligned; op names are never cut so that two ops look alike: a long name is
    shortened in the middle, keeping its end (``wide=True`` prints every name whole); ``top`` rows each.
    Names come from a stranger's file: control characters in them are escaped, so they cannot drive the
    terminal."""
    lines = []
    if r.devices:
        for d in r.devices:
            lines.append(d.verdict(r.threshold_pct))
        lines.append("Summary: " + r.verdict())
    else:
        lines.append(r.verdict())
    tp_note = ("included in FormatTrans (--no-include-transpose leaves it out)" if r.include_transpose
               else "not included (--include-transpose counts it)")
    lines.append(f"  TransData {r.transdata_pct:.1f} % ({fmt_us(r.transdata_us)}, {r.transdata_ops} ops)")
    lines.append(f"  Transpose family {r.transpose_pct:.1f} % ({fmt_us(r.transpose_us)}, {r.transpose_ops} ops): "
                 f"{tp_note}")
    lines.append(f"  Cast {r.cast_pct:.1f} % ({fmt_us(r.cast_us)}, {r.cast_ops} ops): dtype conversion, "
                 "not FormatTrans")
    lines.append(f"  Device compute {fmt_us(r.compute_us)} in {r.compute_ops} tasks; communication "
                 f"{fmt_us(r.communication_us)} in {r.communication_ops} tasks (excluded); "
                 f"AI CPU {r.ai_cpu_pct:.1f} % ({len(r.ai_cpu_ops)} op types)")
    if r.task_types:
        tt = ", ".join(f"{t.task_type} {t.share_pct:.1f} %" for t in r.task_types[:6])
        lines.append(f"  By task type: {_clip(tt, width + 40)}")
    for s in r.sources:
        lines.append(f"  {_clip(s, 4 * width)}")
    if r.detail != "per-task":
        lines.append("  Only per-op-type totals were available: no conversion kinds, shapes or round trips.")
    for key, val in r.cross_checks.items():
        lines.append(f"  Cross-check: {CROSS_CHECK_LABELS.get(key, key)}: {_cross_check_note(r, key, val)}")
    if r.devices:
        lines.append("")
        lines.append("Captures / devices")
        dw = max([12] + [len(str(d.device)) for d in r.devices])  # capture labels can be long paths
        for d in r.devices:
            lines.append(f"  {str(d.device):<{dw}} compute {fmt_us(d.compute_us):>10}  FormatTrans {d.share_pct:5.1f} %"
                         f"  {'FLAGGED' if d.flagged else 'ok'}")
    if r.steps:
        lines.append("")
        lines.append("Steps (step-trace spans, not counted as compute)")
        for st in r.steps[:4 * top]:
            lines.append(f"  {_clip(st.device, 40):<12} {_clip(st.kind, 20):<18} ×{st.count:<5} "
                         f"total {fmt_us(st.total_us):>10}  mean {fmt_us(st.mean_us):>10}")
    conv = [k for k in r.conversions if k.category in ("format", "layout")]
    casts = [k for k in r.conversions if k.category == "dtype"]
    if conv:
        lines.append("")
        lines.append("Conversion kinds")
        rows = [(_name(kind_label(k), wide), "/".join(k.op_types), k.count, duration(k.total_us / 1e6),
                 duration(k.mean_us / 1e6), f"{k.share_pct:.1f} %",
                 ", ".join(f"[{s}]×{n}" for s, n in k.shapes[:2 if not wide else None]))
                for k in conv[:top]]
        lines.extend("  " + x for x in text_table(["kind", "op", "count", "total", "mean", "share", "shapes"],
                                                   rows, right=(2, 3, 4, 5)).splitlines())
        inst = sorted((i for k in conv for i in k.top), key=lambda i: (-i.total_us, i.name))[:top]
        lines.append("")
        lines.append("Top conversion ops (total over their runs)")
        rows = [(_name(i.name, wide), duration(i.total_us / 1e6), f"×{i.count}", printable(i.conversion or ""),
                 printable(i.shape_label or ""), _name(i.prev_op, wide) or "(start)", _name(i.next_op, wide) or "(end)")
                for i in inst]
        lines.extend("  " + x for x in text_table(["op name", "total", "runs", "conversion", "shape", "after",
                                                    "before"], rows, right=(1, 2)).splitlines())
    if casts:
        lines.append("")
        lines.append("Casts (dtype conversions, not FormatTrans)")
        for k in casts[:5]:
            lines.append(f"  {_clip(kind_label(k), 28):<28} {k.count:>6} {_d(k.total_us):>10} {k.share_pct:>6.1f}%")
    if r.round_trips:
        lines.append("")
        lines.append("Round trips (a conversion undone later on the same shape)")
        for t in r.round_trips[:top]:
            lines.append(f"  {t.label:<32} [{_clip(t.shape, 24)}] ×{t.count}  would save {_d(t.saved_us)} "
                         f"({t.saved_pct:.1f} %)  between: {_clip(', '.join(t.between), 40)}")
    if r.ai_cpu_ops:
        lines.append("")
        lines.append(f"AI CPU ({r.ai_cpu_pct:.1f} % of compute)")
        for a in r.ai_cpu_ops[:top]:
            lines.append(f"  {_clip(a.op_type, 28):<28} {a.count:>6} {_d(a.total_us):>10} "
                         f"{a.share_pct:>6.1f}%  {_clip('/'.join(a.dtypes), 40)}")
    if r.suggestions:
        lines.append("")
        lines.append("Suggestions")
        for s in r.suggestions:
            lines.append(f"  * {s.title}: {s.detail}")
            lines.append(f"    evidence: {s.evidence}")
    return "\n".join(printable(line) for line in lines)


# ---------------------------------------------------------------------------------------------------
# HTML

CROSS_CHECK_LABELS = {
    "op_statistic_transdata_pct": "TransData share by op_statistic",
    "msprof_analyze_name_rule_pct": "msprof-analyze's name rule",
}
_OPTION = re.compile(r"(--[A-Za-z][\w.=-]*)")


_e = esc


_SEPARATOR = re.compile(r"([_/.,:;\-]+)")


def _eb(x) -> str:
    """:func:`_e`, with a line-break opportunity (``<wbr>``) after each run of separators: a long op
    name or shape wraps as ``trans_TransData_`` / ``17`` or ``[256,256,`` / ``3,3]``, never mid-token
    (the CSS forbids breaking inside words)."""
    return "".join(_e(part) + ("<wbr>" if k % 2 else "") for k, part in enumerate(_SEPARATOR.split(
        "" if x is None else str(x))))


def _capture_of_file(r: ProfileReport) -> dict[str, str]:
    """Source file name → capture label (as in ``devices``), for the files only one capture has."""
    seen: dict[str, list[str]] = {}
    root = str(r.path)
    for c in (r.discovery or {}).get("captures", []):
        used = c.get("used") or {}
        label = os.path.relpath(c["root"], root) if c.get("root") and root else str(c.get("root"))
        for f in used.get("files", []):
            seen.setdefault(os.path.basename(f), []).append(label)
    return {f: labels[0] for f, labels in seen.items() if len(labels) == 1}


def _unknown_formats(i) -> bool:
    return not i.is_permutation and i.src_format is None and i.dst_format is None


def _conversion_cell(i) -> str:
    """``NCHW→NC1HWC0``; ``unknown`` (with the reason as a tooltip) where the capture recorded no formats,
    never ``?→?``."""
    if _unknown_formats(i):
        return "<span title='the capture has no Input/Output Formats columns'>formats unknown*</span>"
    return _e(i.conversion.replace("?", "unknown"))


def _shape_cell(i) -> str:
    if not i.shape and not i.out_shape:
        return "<span class='muted' title='the capture has no Input Shapes column'>unknown*</span>"
    return f"<code>{_eb(i.shape_label.replace('[?]', '[unknown]'))}</code>"


def _html_head(r: ProfileReport) -> list[str]:
    return ["<h1>FormatTrans analysis</h1>", f"<div class='muted small'>{_e(r.path)}</div>",
            f"<div class='verdict {'flagged' if r.flagged else 'ok'}'>{_e(r.verdict())}</div>"]


def _html_captures(r: ProfileReport) -> list[str]:
    """Several captures / devices: the flagged ones first, each with its own share, then the table of
    all of them, so the figure that flags the report comes before any pooled one."""
    out: list[str] = []
    for d in sorted(r.flagged_parts(), key=lambda d: -d.share_pct):
        out.append(f"<div class='lead'>Flagged: <b>{_e(d.device)}</b> — FormatTrans {d.share_pct:.1f} % of "
                   f"its own {_e(fmt_us(d.compute_us))} device compute ({_e(fmt_us(d.formattrans_us))}), above "
                   f"the {r.threshold_pct:g} % threshold.</div>")
        out.append(gauge(d.share_pct, r.threshold_pct, f"FormatTrans of {d.device}"))
    out.append(f"<h2 id='captures'>Captures / devices ({len(r.devices)}): one verdict each</h2>"
               "<table><tr><th>capture / device</th><th class='num'>device compute</th>"
               "<th class='num'>FormatTrans</th><th class='num'>share</th><th>verdict</th></tr>")
    for d in sorted(r.devices, key=lambda d: (not d.flagged, -d.share_pct, d.device)):
        out.append(f"<tr{' class=bad' if d.flagged else ''}><td>{_e(d.device)}</td>"
                   f"<td class='num'>{_e(fmt_us(d.compute_us))}</td><td class='num'>{_e(fmt_us(d.formattrans_us))}"
                   f"</td><td class='num'>{d.share_pct:.1f} %</td><td>{'<b>FLAGGED</b>' if d.flagged else 'ok'}</td></tr>")
    out.append("</table>")
    return out


def _cross_check_note(r: ProfileReport, key: str, val: float) -> str:
    """What a cross-check counts and why it differs from the headline share (shown with the headline's
    own precision, so the two figures can be told apart and the headline reads the same everywhere)."""
    head = f"{r.formattrans_pct:.1f} %"
    if key == "msprof_analyze_name_rule_pct":
        extra = [o for o in r.op_types if o.category not in ("format", "layout")
                 and re.search("cast|transdata|transpose", o.op_type, re.I)]
        why = ", ".join(f"{o.op_type} {o.share_pct:.1f} %" for o in extra[:4])
        counted = "TransData" + (" and the Transpose family" if r.include_transpose else "")
        return (f"{val:.2f} %: counts every kernel whose name contains cast, transdata or transpose"
                + (f", so also {why}" if why else "") + f"; the headline ({head}) counts {counted} by op type"
                + (f", not {', '.join(o.op_type for o in extra[:4])}" if extra else "")
                + ("; above the threshold, but the verdict is the headline's" if val > r.threshold_pct >= r.formattrans_pct
                   else ""))
    if key == "op_statistic_transdata_pct":
        return (f"{val:.2f} %: TransData alone, from op_statistic's per-type totals; the headline's TransData "
                f"part is {r.transdata_pct:.1f} %" + (f" (the headline, {head}, also counts the Transpose family)"
                                                      if r.include_transpose else ""))
    return f"{val:.2f} %"


def _html_share(r: ProfileReport) -> list[str]:
    several = bool(r.devices)
    what = f"All {len(r.devices)} captures/devices together (pooled)" if several else "Share of device compute"
    out = [f"<h2>{_e(what)}</h2>"]
    if several and r.flagged and r.formattrans_pct <= r.threshold_pct:
        out.append(f"<p class='small muted'>Pooled, FormatTrans is {r.formattrans_pct:.1f} %, below the "
                   "threshold: the report is flagged by the capture(s) above, not by this figure.</p>")
    out.append(gauge(r.formattrans_pct, r.threshold_pct, "FormatTrans pooled" if several else "FormatTrans"))
    out.append("<table><tr><th>what" + (" (all captures together)" if several else "") + "</th>"
               "<th class='num'>time</th><th class='num'>tasks</th>"
               "<th class='num'>% of compute</th><th>counted as FormatTrans</th></tr>")
    rows = [("TransData (format conversion)", r.transdata_us, r.transdata_ops, r.transdata_pct, "yes"),
            ("Transpose family (layout)", r.transpose_us, r.transpose_ops, r.transpose_pct,
             "yes" if r.include_transpose else "no (--no-include-transpose)"),
            ("Cast (dtype conversion)", r.cast_us, r.cast_ops, r.cast_pct, "no"),
            ("AI CPU", r.ai_cpu_us, sum(a.count for a in r.ai_cpu_ops), r.ai_cpu_pct, "—"),
            ("Device compute (denominator)", r.compute_us, r.compute_ops, 100.0 if r.compute_us else 0.0, "—"),
            ("Communication (excluded)", r.communication_us, r.communication_ops, None, "—")]
    for name, us, n, pct, counted in rows:
        out.append(f"<tr><td>{_e(name)}</td><td class='num'>{_e(fmt_us(us))}</td><td class='num'>{n}</td>"
                   f"<td class='num'>{'' if pct is None else f'{pct:.1f} %'}</td><td>{_e(counted)}</td></tr>")
    out.append("</table>")
    if r.task_types:
        out.append("<p class='small'>By task type: " + " · ".join(
            f"{_e(t.task_type)} {t.share_pct:.1f} % ({_e(fmt_us(t.total_us))})" for t in r.task_types) + "</p>")
    if r.cross_checks:
        out.append("<p class='small'><b>Cross-checks</b> (other ways to count, each says why it differs):</p>"
                   "<ul class='small'>")
        for key, val in r.cross_checks.items():
            out.append(f"<li>{_e(CROSS_CHECK_LABELS.get(key, key))}: {_e(_cross_check_note(r, key, val))}</li>")
        out.append("</ul>")
    return out


def _html_op_types(r: ProfileReport, top: int) -> list[str]:
    out = ["<h2>Device time by op type" + (" (all captures together)" if r.devices else "") + "</h2>",
           "<div class='legend small'><span><i style='background:#d9534f'></i>format conversion</span>"
           "<span><i style='background:#f0ad4e'></i>layout (Transpose)</span>"
           "<span><i style='background:#b39ddb'></i>dtype (Cast)</span>"
           "<span><i style='background:#8aa4c2'></i>other compute</span></div>"]
    shown = list(r.op_types[:top])
    for o in r.op_types[top:]:
        if o.category in ("format", "layout"):
            shown.append(o)  # never hide a conversion op below the cut
    rest = [o for o in r.op_types if o not in shown]
    maxus = max([o.total_us for o in shown] + [sum(o.total_us for o in rest)] + [1e-9])
    out.append("<div class='bars'>")
    for o in shown:
        width = 100.0 * o.total_us / maxus
        label = f"<b>{_e(o.op_type)}</b>" if o.category in ("format", "layout") else _e(o.op_type)
        out.append(f"<div>{label}</div><div><div class='bar {_e(o.category)}' style='width:{width:.2f}%'></div>"
                   f"</div><div class='num small'>{_e(fmt_us(o.total_us))} · {o.share_pct:.1f} %</div>")
    if rest:
        rest_us = sum(o.total_us for o in rest)
        out.append(f"<div class='muted'>{len(rest)} other op types</div><div><div class='bar other' "
                   f"style='width:{100.0 * rest_us / maxus:.2f}%'></div></div><div class='num small'>"
                   f"{_e(fmt_us(rest_us))} · {100.0 * rest_us / r.compute_us if r.compute_us else 0:.1f} %</div>")
    out.append("</div>")
    return out


def _html_conversions(r: ProfileReport, top: int) -> list[str]:
    conv = [k for k in r.conversions if k.category in ("format", "layout")]
    out = ["<h2 id='conversions'>Conversion kinds" + (" (all captures together)" if r.devices else "") + "</h2>"]
    if r.detail != "per-task":
        return out + ["<p class='muted'>Only per-op-type totals (op_statistic) were available: no kinds or shapes.</p>"]
    if not conv:
        return out + ["<p class='muted'>No TransData or Transpose tasks in this profile.</p>"]
    out.append("<table><tr><th>kind</th><th>class</th><th>op types</th><th class='num'>count</th>"
               "<th class='num'>total</th><th class='num'>mean</th><th class='num'>share</th><th>shapes</th></tr>")
    for k in conv:
        shapes = "<br>".join(f"<code>[{_eb(s)}]</code> ×{int(n)}" for s, n in k.shapes[:3]) or \
            "<span class='muted'>unknown*</span>"
        out.append(f"<tr><td><b>{_e(kind_label(k))}</b></td><td>{_e(k.category)}</td><td>{_e(', '.join(k.op_types))}"
                   f"</td><td class='num'>{k.count}</td><td class='num'>{_e(fmt_us(k.total_us))}</td>"
                   f"<td class='num'>{_e(fmt_us(k.mean_us))}</td><td class='num'>{k.share_pct:.1f} %</td>"
                   f"<td>{shapes}</td></tr>")
    out.append("</table>")
    inst = sorted((i for k in conv for i in k.top), key=lambda i: (-i.total_us, i.name))[:top]
    by_file = _capture_of_file(r) if r.devices else {}
    out.append("<h2>Top conversion ops</h2><table><tr><th class='num'>total</th><th class='num'>runs</th>"
               "<th class='num'>mean</th><th>op name</th><th>conversion</th><th>shape</th><th>after</th>"
               "<th>before</th><th>where (first run)</th></tr>")
    for i in inst:
        where = f"{i.file or ''}:{i.line}" if i.line is not None else (i.file or "")
        cap = by_file.get(os.path.basename(i.file or ""))
        dev = f"device {i.device}, " if i.device else ""
        stream = f"stream {i.stream}" if i.stream else ""
        out.append(f"<tr><td class='num'>{_e(fmt_us(i.total_us))}</td><td class='num'>{i.count}</td>"
                   f"<td class='num'>{_e(fmt_us(i.duration_us))}</td><td><code>{_eb(i.name)}</code></td>"
                   f"<td>{_conversion_cell(i)}</td><td>{_shape_cell(i)}</td>"
                   f"<td><code>{_eb(i.prev_op or '(start)')}</code></td><td><code>{_eb(i.next_op or '(end)')}</code></td>"
                   f"<td class='small muted'>{'capture <b>' + _eb(cap) + '</b><br>' if cap else ''}"
                   f"{_e(dev + stream) + '<br>' if dev or stream else ''}{_e(where)}</td></tr>")
    out.append("</table>")
    if any(_unknown_formats(i) or not (i.shape or i.out_shape) for i in inst) or any(not k.shapes for k in conv):
        out.append("<p class='small muted'>* unknown: the capture that holds these ops recorded no Input/Output "
                   "Formats or Shapes columns (a Level0 capture, or a timeline); capture at Level1 or higher "
                   "to see what each TransData converts.</p>")
    return out


def _html_round_trips_and_suggestions(r: ProfileReport, top: int) -> list[str]:
    out = ["<h2 id='round-trips'>Round trips</h2>"]
    if not r.round_trips:
        out.append("<p class='muted'>No conversion is undone later on the same shape.</p>")
    else:
        out.append("<table><tr><th>pattern</th><th>shape</th><th class='num'>count</th><th class='num'>would save</th>"
                   "<th>between</th><th>example</th></tr>")
        for t in r.round_trips[:top]:
            ex = " … ".join(t.examples[0]) if t.examples else ""
            out.append(f"<tr><td><b>{_e(t.label)}</b></td><td><code>{_eb(t.shape)}</code></td><td class='num'>"
                       f"{t.count}</td><td class='num'>{_e(fmt_us(t.saved_us))} ({t.saved_pct:.1f} %)</td>"
                       f"<td>{_e(', '.join(t.between))}</td><td><code>{_eb(ex)}</code></td></tr>")
        out.append("</table>")
    out.append("<h2 id='suggestions'>Suggestions</h2>")
    if not r.suggestions:
        out.append("<p class='muted'>Nothing to change on this evidence.</p>")
    for s in r.suggestions:
        detail = _OPTION.sub(r"<code class='nowrap'>\1</code>", _e(s.detail))
        out.append(f"<div class='sugg'><b>{_e(s.title)}</b>{detail}<div class='ev'>Evidence: {_e(s.evidence)}</div></div>")
    return out


def _html_tail(r: ProfileReport, top: int) -> list[str]:
    """Casts, AI CPU, steps, sources, warnings and the footer."""
    out: list[str] = []
    casts = [k for k in r.conversions if k.category == "dtype"]
    if casts:
        out.append("<h2>Casts (dtype conversions, not counted as FormatTrans)</h2><table><tr><th>dtypes</th>"
                   "<th class='num'>count</th><th class='num'>total</th><th class='num'>share</th></tr>")
        for k in casts[:top]:
            out.append(f"<tr><td>{_e(kind_label(k))}</td><td class='num'>{k.count}</td><td class='num'>"
                       f"{_e(fmt_us(k.total_us))}</td><td class='num'>{k.share_pct:.1f} %</td></tr>")
        out.append("</table>")
    if r.ai_cpu_ops:
        out.append(f"<h2>AI CPU ({r.ai_cpu_pct:.1f} % of compute)</h2><table><tr><th>op type</th><th class='num'>"
                   "count</th><th class='num'>total</th><th class='num'>share</th><th>dtypes</th></tr>")
        for a in r.ai_cpu_ops[:top]:
            out.append(f"<tr><td>{_e(a.op_type)}</td><td class='num'>{a.count}</td><td class='num'>"
                       f"{_e(fmt_us(a.total_us))}</td><td class='num'>{a.share_pct:.1f} %</td>"
                       f"<td>{_e(', '.join(a.dtypes))}</td></tr>")
        out.append("</table>")
    if r.steps:
        out.append("<h2>Steps</h2><p class='small muted'>Step-trace spans of the timeline: markers of the step, "
                   "not kernels, so not in device compute.</p><table><tr><th>device</th><th>span</th>"
                   "<th class='num'>count</th><th class='num'>total</th><th class='num'>mean</th></tr>")
        for st in r.steps:
            out.append(f"<tr><td>{_e(st.device)}</td><td>{_e(st.kind)}</td><td class='num'>{st.count}</td>"
                       f"<td class='num'>{_e(fmt_us(st.total_us))}</td><td class='num'>{_e(fmt_us(st.mean_us))}</td></tr>")
        out.append("</table>")
    out.append("<h2>Sources</h2><ul class='small'>")
    out.extend(f"<li>{_e(s)}</li>" for s in r.sources)
    out.append("</ul>")
    if r.warnings:
        out.append("<h2>Warnings</h2><ul class='small'>")
        out.extend(f"<li>{_e(m)}</li>" for m in r.warnings)
        out.append("</ul>")
    out.append("<p class='muted small'>Shares are of device compute time (every device task except communication). "
               f"Schema {_e(r.SCHEMA)} v{r.SCHEMA_VERSION}. Generated by npu-deploy.</p>")
    return out


def render_html(r: ProfileReport, *, top: int = 15) -> str:
    """One self-contained HTML page (inline CSS, no script, no network); every profile string escaped.

    With several captures / devices the flagged ones lead (each with its own share), then the table of
    all of them; pooled figures say they are pooled. A bar is red only when its own figure is above the
    threshold."""
    body = _html_head(r)
    if r.devices:
        body += _html_captures(r)
    body += _html_share(r) + _html_op_types(r, top) + _html_conversions(r, top)
    body += _html_round_trips_and_suggestions(r, top) + _html_tail(r, top)
    return page(f"npu-deploy profile: {r.verdict()}", "\n".join(body))

def write_html(r: ProfileReport, path: str | os.PathLike) -> None:
    """Write :func:`render_html` atomically."""
    text = render_html(r)
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)
