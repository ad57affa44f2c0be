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

import html
import os
import re

from npu_deploy._display import duration, middle
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
        lines.append(f"  Cross-check: {CROSS_CHECK_LABELS.get(key, key)}: {val:.1f} %")
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

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d232a;margin:24px auto;
max-width:1100px;padding:0 16px;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #dde2e8;
padding-bottom:4px}
.verdict{padding:12px 16px;border-radius:6px;font-weight:600;font-size:16px;margin:12px 0}
.flagged{background:#fdecea;border:1px solid #e0a39b;color:#8a1c10}.ok{background:#e8f5ec;border:1px solid
#9fd0ad;color:#1b5e30}
.muted{color:#5c6670}.small{font-size:12px}
table{border-collapse:collapse;width:100%;margin:6px 0}th,td{text-align:left;padding:4px 8px;
border-bottom:1px solid #eef0f3;vertical-align:top}th{background:#f5f7f9;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#f3f4f6;padding:1px 4px;border-radius:3px;
word-break:normal;overflow-wrap:normal}
.gauge{position:relative;height:26px;background:#eef0f3;border-radius:4px;margin:8px 0 22px;max-width:720px}
.gauge .fill{position:absolute;left:0;top:0;bottom:0;border-radius:4px}
.gauge .thr{position:absolute;top:-4px;bottom:-4px;border-left:2px dashed #1d232a}
.gauge .thrlabel{position:absolute;top:30px;font-size:12px;transform:translateX(-50%);white-space:nowrap}
.gauge .val{position:absolute;top:4px;margin-left:6px;font-size:13px;font-weight:600;white-space:nowrap}
.gauge .scale{position:absolute;right:0;top:30px;font-size:11px;color:#5c6670}
.gauge .zero{position:absolute;left:0;top:30px;font-size:11px;color:#5c6670}
.nowrap{white-space:nowrap}
.bars{display:grid;grid-template-columns:minmax(120px,240px) 1fr 150px;gap:3px 10px;align-items:center}
.bar{height:16px;background:#8aa4c2;border-radius:2px;min-width:1px}
.bar.format{background:#d9534f}.bar.layout{background:#f0ad4e}.bar.dtype{background:#b39ddb}
.bar.other{background:#c5ccd4}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:-1px;border-radius:2px}
.sugg{border-left:4px solid #2f6fb0;background:#f4f8fc;padding:8px 12px;margin:8px 0}
.sugg b{display:block}.ev{color:#44505c;font-size:13px;margin-top:4px}
"""


CROSS_CHECK_LABELS = {
    "op_statistic_transdata_pct": "TransData share by op_statistic",
    "msprof_analyze_name_rule_pct": "msprof-analyze's name rule (kernel name contains cast|transdata|transpose)",
}
_OPTION = re.compile(r"(--[A-Za-z][\w.=-]*)")


def _e(x) -> str:
    return html.escape("" if x is None else str(x), quote=True)


_SEPARATOR = re.compile(r"([_/.,:;\-]+)")


def _eb(x) -> str:
    """:func:`_e`, with a line-break opportunity (``<wbr>``) after each run of separators: a long op
    name or shape wraps as ``trans_TransData_`` / ``17`` or ``[256,256,`` / ``3,3]``, never mid-token
    (the CSS forbids breaking inside words)."""
    return "".join(_e(part) + ("<wbr>" if k % 2 else "") for k, part in enumerate(_SEPARATOR.split(
        "" if x is None else str(x))))


def render_html(r: ProfileReport, *, top: int = 15) -> str:
    """One self-contained HTML page (inline CSS, no script, no network); every profile string escaped."""
    cls = "flagged" if r.flagged else "ok"
    out: list[str] = []
    w = out.append
    w("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>")
    w("<meta name='viewport' content='width=device-width,initial-scale=1'>")
    w(f"<title>npu-deploy profile: {_e(r.verdict())}</title><style>{_CSS}</style></head><body>")
    w("<h1>FormatTrans analysis</h1>")
    w(f"<div class='muted small'>{_e(r.path)}</div>")
    w(f"<div class='verdict {cls}'>{_e(r.verdict())}</div>")
    # share against threshold
    scale = max(r.formattrans_pct, r.threshold_pct) * 1.25 or 10.0
    fill = min(100.0, 100.0 * r.formattrans_pct / scale)
    thr = min(100.0, 100.0 * r.threshold_pct / scale)
    color = "#d9534f" if r.flagged else "#5cb85c"
    w("<h2>Share of device compute</h2>")
    w(f"<div class='gauge' role='img' aria-label='FormatTrans {r.formattrans_pct:.1f} percent, threshold "
      f"{r.threshold_pct:g} percent'><div class='fill' style='width:{fill:.2f}%;background:{color}'></div>"
      f"<div class='thr' style='left:{thr:.2f}%'></div>"
      f"<div class='val' style='left:{fill:.2f}%'>{r.formattrans_pct:.1f} %</div>"
      f"<div class='thrlabel' style='left:{thr:.2f}%'>threshold {r.threshold_pct:g} %</div>"
      f"<div class='scale'>{scale:.3g} %</div><div class='zero'>0</div></div>")
    w("<table><tr><th>what</th><th class='num'>time</th><th class='num'>tasks</th>"
      "<th class='num'>% of compute</th><th>counted as FormatTrans</th></tr>")
    rows = [("TransData (format conversion)", r.transdata_us, r.transdata_ops, r.transdata_pct, "yes"),
            ("Transpose family (layout)", r.transpose_us, r.transpose_ops, r.transpose_pct,
             "yes" if r.include_transpose else "no (--no-include-transpose)"),
            ("Cast (dtype conversion)", r.cast_us, r.cast_ops, r.cast_pct, "no"),
            ("AI CPU", r.ai_cpu_us, sum(a.count for a in r.ai_cpu_ops), r.ai_cpu_pct, "—"),
            ("Device compute (denominator)", r.compute_us, r.compute_ops, 100.0 if r.compute_us else 0.0, "—"),
            ("Communication (excluded)", r.communication_us, r.communication_ops, None, "—")]
    for name, us, n, pct, counted in rows:
        w(f"<tr><td>{_e(name)}</td><td class='num'>{_e(fmt_us(us))}</td><td class='num'>{n}</td>"
          f"<td class='num'>{'' if pct is None else f'{pct:.1f} %'}</td><td>{_e(counted)}</td></tr>")
    w("</table>")
    if r.task_types:
        w("<p class='small'>By task type: " + " · ".join(
            f"{_e(t.task_type)} {t.share_pct:.1f} % ({_e(fmt_us(t.total_us))})" for t in r.task_types) + "</p>")
    # bar chart of time by op type
    w("<h2>Device time by op type</h2>")
    w("<div class='legend small'><span><i style='background:#d9534f'></i>format conversion</span>"
      "<span><i style='background:#f0ad4e'></i>layout (Transpose)</span>"
      "<span><i style='background:#b39ddb'></i>dtype (Cast)</span>"
      "<span><i style='background:#8aa4c2'></i>other compute</span></div>")
    shown = list(r.op_types[:top])
    for o in r.op_types[top:]:
        if o.category in ("format", "layout"):
            shown.append(o)  # never hide a conversion op below the cut
    rest = [o for o in r.op_types if o not in shown]
    maxus = max([o.total_us for o in shown] + [sum(o.total_us for o in rest)] + [1e-9])
    w("<div class='bars'>")
    for o in shown:
        width = 100.0 * o.total_us / maxus
        label = f"<b>{_e(o.op_type)}</b>" if o.category in ("format", "layout") else _e(o.op_type)
        w(f"<div>{label}</div><div><div class='bar {_e(o.category)}' style='width:{width:.2f}%'></div></div>"
          f"<div class='num small'>{_e(fmt_us(o.total_us))} · {o.share_pct:.1f} %</div>")
    if rest:
        rest_us = sum(o.total_us for o in rest)
        w(f"<div class='muted'>{len(rest)} other op types</div><div><div class='bar other' "
          f"style='width:{100.0 * rest_us / maxus:.2f}%'></div></div>"
          f"<div class='num small'>{_e(fmt_us(rest_us))} · {100.0 * rest_us / r.compute_us if r.compute_us else 0:.1f} %</div>")
    w("</div>")
    # conversion kinds
    conv = [k for k in r.conversions if k.category in ("format", "layout")]
    w("<h2 id='conversions'>Conversion kinds</h2>")
    if r.detail != "per-task":
        w("<p class='muted'>Only per-op-type totals (op_statistic) were available: no kinds or shapes.</p>")
    elif not conv:
        w("<p class='muted'>No TransData or Transpose tasks in this profile.</p>")
    else:
        w("<table><tr><th>kind</th><th>class</th><th>op types</th><th class='num'>count</th>"
          "<th class='num'>total</th><th class='num'>mean</th><th class='num'>share</th><th>shapes</th></tr>")
        for k in conv:
            shapes = "<br>".join(f"<code>[{_eb(s)}]</code> ×{int(n)}" for s, n in k.shapes[:3])
            w(f"<tr><td><b>{_e(kind_label(k))}</b></td><td>{_e(k.category)}</td><td>{_e(', '.join(k.op_types))}</td>"
              f"<td class='num'>{k.count}</td><td class='num'>{_e(fmt_us(k.total_us))}</td>"
              f"<td class='num'>{_e(fmt_us(k.mean_us))}</td><td class='num'>{k.share_pct:.1f} %</td>"
              f"<td>{shapes}</td></tr>")
        w("</table>")
        inst = sorted((i for k in conv for i in k.top), key=lambda i: (-i.total_us, i.name))[:top]
        w("<h2>Top conversion ops</h2><table><tr><th class='num'>total</th><th class='num'>runs</th>"
          "<th class='num'>mean</th><th>op name</th><th>conversion</th><th>shape</th><th>after</th><th>before</th>"
          "<th>where (first run)</th></tr>")
        for i in inst:
            where = f"{i.file or ''}:{i.line}" if i.line is not None else (i.file or "")
            dev = f"device {i.device}, " if i.device else ""
            stream = f"stream {i.stream}" if i.stream else ""
            w(f"<tr><td class='num'>{_e(fmt_us(i.total_us))}</td><td class='num'>{i.count}</td>"
              f"<td class='num'>{_e(fmt_us(i.duration_us))}</td><td><code>{_eb(i.name)}</code></td>"
              f"<td>{_e(i.conversion)}</td><td><code>{_eb(i.shape_label)}</code></td>"
              f"<td><code>{_eb(i.prev_op or '(start)')}</code></td><td><code>{_eb(i.next_op or '(end)')}</code></td>"
              f"<td class='small muted'>{_e(dev + stream)}<br>{_e(where)}</td></tr>")
        w("</table>")
    # round trips
    w("<h2 id='round-trips'>Round trips</h2>")
    if not r.round_trips:
        w("<p class='muted'>No conversion is undone later on the same shape.</p>")
    else:
        w("<table><tr><th>pattern</th><th>shape</th><th class='num'>count</th><th class='num'>would save</th>"
          "<th>between</th><th>example</th></tr>")
        for t in r.round_trips[:top]:
            ex = " … ".join(t.examples[0]) if t.examples else ""
            w(f"<tr><td><b>{_e(t.label)}</b></td><td><code>{_eb(t.shape)}</code></td><td class='num'>{t.count}</td>"
              f"<td class='num'>{_e(fmt_us(t.saved_us))} ({t.saved_pct:.1f} %)</td><td>{_e(', '.join(t.between))}</td>"
              f"<td><code>{_eb(ex)}</code></td></tr>")
        w("</table>")
    # suggestions
    w("<h2 id='suggestions'>Suggestions</h2>")
    if not r.suggestions:
        w("<p class='muted'>Nothing to change on this evidence.</p>")
    for s in r.suggestions:
        detail = _OPTION.sub(r"<code class='nowrap'>\1</code>", _e(s.detail))
        w(f"<div class='sugg'><b>{_e(s.title)}</b>{detail}<div class='ev'>Evidence: {_e(s.evidence)}</div></div>")
    casts = [k for k in r.conversions if k.category == "dtype"]
    if casts:
        w("<h2>Casts (dtype conversions, not counted as FormatTrans)</h2><table><tr><th>dtypes</th>"
          "<th class='num'>count</th><th class='num'>total</th><th class='num'>share</th></tr>")
        for k in casts[:top]:
            w(f"<tr><td>{_e(kind_label(k))}</td><td class='num'>{k.count}</td><td class='num'>{_e(fmt_us(k.total_us))}</td>"
              f"<td class='num'>{k.share_pct:.1f} %</td></tr>")
        w("</table>")
    if r.ai_cpu_ops:
        w(f"<h2>AI CPU ({r.ai_cpu_pct:.1f} % of compute)</h2><table><tr><th>op type</th><th class='num'>count</th>"
          "<th class='num'>total</th><th class='num'>share</th><th>dtypes</th></tr>")
        for a in r.ai_cpu_ops[:top]:
            w(f"<tr><td>{_e(a.op_type)}</td><td class='num'>{a.count}</td><td class='num'>{_e(fmt_us(a.total_us))}</td>"
              f"<td class='num'>{a.share_pct:.1f} %</td><td>{_e(', '.join(a.dtypes))}</td></tr>")
        w("</table>")
    if r.devices:
        w("<h2>Captures / devices</h2><table><tr><th>capture / device</th><th class='num'>compute</th>"
          "<th class='num'>FormatTrans</th><th class='num'>share</th><th>verdict</th></tr>")
        for d in r.devices:
            w(f"<tr><td>{_e(d.device)}</td><td class='num'>{_e(fmt_us(d.compute_us))}</td>"
              f"<td class='num'>{_e(fmt_us(d.formattrans_us))}</td><td class='num'>{d.share_pct:.1f} %</td>"
              f"<td>{'<b>FLAGGED</b>' if d.flagged else 'ok'}</td></tr>")
        w("</table>")
    if r.steps:
        w("<h2>Steps</h2><p class='small muted'>Step-trace spans of the timeline: markers of the step, not "
          "kernels, so not in device compute.</p><table><tr><th>device</th><th>span</th>"
          "<th class='num'>count</th><th class='num'>total</th><th class='num'>mean</th></tr>")
        for st in r.steps:
            w(f"<tr><td>{_e(st.device)}</td><td>{_e(st.kind)}</td><td class='num'>{st.count}</td>"
              f"<td class='num'>{_e(fmt_us(st.total_us))}</td><td class='num'>{_e(fmt_us(st.mean_us))}</td></tr>")
        w("</table>")
    w("<h2>Sources</h2><ul class='small'>")
    for s in r.sources:
        w(f"<li>{_e(s)}</li>")
    for key, val in r.cross_checks.items():
        w(f"<li>cross-check: {_e(CROSS_CHECK_LABELS.get(key, key))}: {val:.2f} %</li>")
    w("</ul>")
    if r.warnings:
        w("<h2>Warnings</h2><ul class='small'>")
        for m in r.warnings:
            w(f"<li>{_e(m)}</li>")
        w("</ul>")
    w("<p class='muted small'>Shares are of device compute time (every device task except communication). "
      f"Schema {_e(r.SCHEMA)} v{r.SCHEMA_VERSION}. Generated by npu-deploy.</p>")
    w("</body></html>")
    return "\n".join(out)


def write_html(r: ProfileReport, path: str | os.PathLike) -> None:
    """Write :func:`render_html` atomically."""
    text = render_html(r)
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)
