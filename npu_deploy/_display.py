"""How numbers, dims and names read in terminal output: one rule each, used by every printer.

* durations: microseconds (µs) under 1 ms, milliseconds under 1 s, seconds above, always three significant
  digits (:func:`duration`);
* an unknown dimension prints as ``?`` (:func:`dims`);
* a name too long for its column is shortened in the middle, keeping its end (where op names differ:
  ``..._Tr`` three times is no help), and the same name always shortens the same way (:func:`middle`);
* counts agree with their noun (:func:`plural`: "1 run", "2 runs");
* tables are ``rich`` tables rendered to text, aligned, without colour when not on a terminal
  (:func:`table`).

>>> duration(0.000_812), duration(0.0123), duration(2.5)
('812 µs', '12.3 ms', '2.50 s')
>>> dims([-1, 3, None, 224])
'[?,3,?,224]'
>>> middle("aclnnMaxPool2dWithMaskBackward_TransData_17", 24)
'aclnnMaxPoo…TransData_17'
>>> plural(1, "run"), plural(3, "run")
('1 run', '3 runs')
"""

from __future__ import annotations

import io
import math
from typing import Iterable, Sequence

ELLIPSIS = "…"


def _sig3(x: float) -> str:
    if x == 0:
        return "0"
    e = int(math.floor(math.log10(abs(x))))
    if abs(round(x, 2 - e)) >= 10 ** (e + 1):  # 0.9999 rounds to 1.00, one more digit before the point
        e += 1
    return f"{x:.{max(0, 2 - e)}f}"


def duration(seconds: float | None) -> str:
    """``seconds`` as ``812 us`` / ``12.3 ms`` / ``2.50 s`` (three significant digits; ``-`` for None)."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    s = float(seconds)
    if math.isinf(s):
        return "inf"
    a = abs(s)
    # decide the unit on the rounded value, so that 999.96 us prints as 1.00 ms, not 1000 us
    if float(_sig3(a * 1e6)) < 1000:
        return f"{_sig3(s * 1e6)} µs"
    if float(_sig3(a * 1e3)) < 1000:
        return f"{_sig3(s * 1e3)} ms"
    return f"{_sig3(s)} s"


def duration_ms(ms: float | None) -> str:
    """:func:`duration` for a value in milliseconds."""
    return duration(None if ms is None else float(ms) / 1e3)


def dims(shape: Iterable | None) -> str:
    """``[?,3,?,224]``: -1, None and symbolic dims print as ``?``."""
    if shape is None:
        return "?"
    parts = []
    for d in shape:
        parts.append(str(d) if isinstance(d, (int,)) and not isinstance(d, bool) and d >= 0 else "?")
    return "[" + ",".join(parts) + "]"


def middle(name: str, width: int) -> str:
    """``name`` shortened to ``width`` characters by cutting its middle (the end stays whole)."""
    if width < 5 or len(name) <= width:
        return name
    tail = (width - 1) // 2 + (width - 1) % 2
    head = width - 1 - tail
    return name[:head] + ELLIPSIS + name[-tail:]


def plural(n: int, noun: str, plural_form: str | None = None) -> str:
    """``1 run``, ``2 runs`` (``plural_form`` for irregular nouns)."""
    return f"{n} {noun if n == 1 else (plural_form or noun + 's')}"


def table(headers: Sequence[str], rows: Iterable[Sequence], *, right: Sequence[int] = (), title: str | None = None,
          name_width: int | None = None, wrap_names: bool = False, width: int | None = None) -> str:
    """An aligned text table (``rich``), as a string without colour codes.

    ``right``: indexes of right-aligned (numeric) columns. Column 0 holds names: when ``wrap_names``,
    long names wrap (never cut); otherwise, with ``name_width``, they are shortened by :func:`middle`.
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, title=title, show_edge=False, pad_edge=False, title_justify="left")
    for k, h in enumerate(headers):
        if k == 0:
            t.add_column(h, overflow="fold" if wrap_names else "ignore", no_wrap=not wrap_names)
        else:
            t.add_column(h, justify="right" if k in right else "left", no_wrap=True)
    body = []
    for r in rows:
        cells = [str(c) for c in r]
        if cells and name_width and not wrap_names:
            cells[0] = middle(cells[0], name_width)
        body.append(cells)
        t.add_row(*cells)
    # wide enough for every cell: rich would otherwise squeeze columns and cut the names it squeezes
    natural = sum(max([len(h)] + [len(c[k]) for c in body if k < len(c)]) + 4 for k, h in enumerate(headers))
    buf = io.StringIO()
    Console(file=buf, width=width or max(natural + 2, 40), color_system=None, force_terminal=False, no_color=True,
            highlight=False, markup=False, emoji=False, soft_wrap=not wrap_names).print(t)
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").splitlines())
