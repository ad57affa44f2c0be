"""The one look of npu-deploy's HTML reports: a shared stylesheet and page frame.

``profile analyze --html``, ``profile analyze --cluster --html`` and ``debug compare --html`` all write
one self-contained page (inline CSS and SVG, no script, no network) through :func:`page`, so the three
read alike. Every string that comes from a model or a profile goes through :func:`esc`.

>>> "<style>" in page("t", "<p>x</p>") and esc("<b>") == "&lt;b&gt;"
True
"""

from __future__ import annotations

import html

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#1d232a;margin:24px auto;
max-width:1100px;padding:0 16px;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #dde2e8;
padding-bottom:4px}
.verdict{padding:12px 16px;border-radius:6px;font-weight:600;font-size:16px;margin:12px 0}
.flagged{background:#fdecea;border:1px solid #e0a39b;color:#8a1c10}.ok{background:#e8f5ec;border:1px solid
#9fd0ad;color:#1b5e30}
.lead{padding:10px 14px;border-left:4px solid #d9534f;background:#fff6f5;margin:10px 0}
.muted{color:#5c6670}.small{font-size:12px}
table{border-collapse:collapse;width:100%;margin:6px 0}th,td{text-align:left;padding:4px 8px;
border-bottom:1px solid #eef0f3;vertical-align:top}th{background:#f5f7f9;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.bad td{background:#fdecea}tr.na td{color:#8a939c}
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
svg text{font-size:11px;font-family:system-ui,sans-serif}
.est{display:inline-block;font-size:11px;padding:0 5px;border-radius:3px;background:#fff3cd;color:#7a5b00;
border:1px solid #e6cf86;margin-left:4px}
"""

RED, GREEN = "#d9534f", "#5cb85c"


def esc(x) -> str:
    """HTML-escape any value (``None`` → empty), quotes included."""
    return html.escape("" if x is None else str(x), quote=True)


def page(title: str, body: str) -> str:
    """A complete page: doctype, charset, viewport, the shared stylesheet, ``body`` as given (already
    escaped by the caller)."""
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


def gauge(value_pct: float, threshold_pct: float, label: str) -> str:
    """A share bar with the threshold as a dashed mark. Red only when *this* value is above the
    threshold, so the colour never contradicts the figure beside it."""
    scale = max(value_pct, threshold_pct) * 1.25 or 10.0
    fill = min(100.0, 100.0 * value_pct / scale)
    thr = min(100.0, 100.0 * threshold_pct / scale)
    color = RED if value_pct > threshold_pct else GREEN
    return (f"<div class='gauge' role='img' aria-label='{esc(label)} {value_pct:.1f} percent, threshold "
            f"{threshold_pct:g} percent'><div class='fill' style='width:{fill:.2f}%;background:{color}'></div>"
            f"<div class='thr' style='left:{thr:.2f}%'></div>"
            f"<div class='val' style='left:{fill:.2f}%'>{value_pct:.1f} %</div>"
            f"<div class='thrlabel' style='left:{thr:.2f}%'>threshold {threshold_pct:g} %</div>"
            f"<div class='scale'>{scale:.3g} %</div><div class='zero'>0</div></div>")
