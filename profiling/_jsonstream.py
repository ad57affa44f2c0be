"""Read the events of a Chrome-trace timeline one at a time, in bounded memory, whatever the file size.

A timeline is a bare JSON array of events, or an object whose ``traceEvents`` member is that array
(msprof.md §6.1). :func:`iter_events` decodes one element at a time with ``json.JSONDecoder.raw_decode``
over a sliding window of the file, so memory holds one chunk plus the element being decoded, never the
file. An element larger than ``max_element`` characters, a syntax error, a truncated file or nesting too
deep is a :class:`~npu_deploy.errors.ProfileError` naming the file and the element.

>>> import tempfile, os
>>> p = os.path.join(tempfile.mkdtemp(), "trace_view.json")
>>> _ = open(p, "w").write('{"traceEvents": [{"ph": "X", "dur": 1.5}, {"ph": "M"}], "other": 1}')
>>> [e["ph"] for e in iter_events(p)]
['X', 'M']
"""

from __future__ import annotations

import codecs
import json
from typing import Iterator

from npu_deploy.errors import ProfileError

CHUNK_CHARS = 1 << 20            # characters decoded from the file per read
MAX_ELEMENT_CHARS = 64 << 20     # one event (or one other top-level value) larger than this is refused
_WS = " \t\n\r"
_TOKEN_MAX = 400                 # a number or literal cut by the window end is shorter than this
_DECODER = json.JSONDecoder()


class _Window:
    """A sliding window of decoded text over a file: ``buf[pos:]`` is what is not consumed yet."""

    def __init__(self, f, path: str, chunk: int):
        self.f = f
        self.path = path
        self.chunk = chunk
        # a byte that is not UTF-8 becomes U+FFFD (kept visible in names) instead of failing the file
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0        # characters dropped from the front of buf so far

    def more(self, at_least: int | None = None) -> bool:
        """Append at least one chunk (or ``at_least`` characters); False at the end of the file."""
        if self.eof:
            return False
        if self.pos > self.chunk:            # drop what was consumed, keep the window small
            self.consumed += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        want = max(self.chunk, at_least or 0)
        got = chars = 0
        parts = [self.buf]
        while got < want or not chars:   # a read may end inside a UTF-8 sequence: decode at least one char
            data = self.f.read(max(1, want - got))
            if not data:
                parts.append(self.dec.decode(b"", final=True))
                self.eof = True
                break
            text = self.dec.decode(data)
            parts.append(text)
            got += len(data)
            chars += len(text)
        self.buf = "".join(parts)
        return True

    def skip_ws(self) -> str:
        """The next non-blank character ("" at the end of the file), not consumed."""
        while True:
            buf, pos = self.buf, self.pos
            n = len(buf)
            while pos < n and buf[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < n:
                return buf[pos]
            if not self.more():
                return ""

    def offset(self) -> int:
        return self.consumed + self.pos

    def value(self, what: str, max_chars: int):
        """Decode the JSON value starting at ``pos`` and consume it."""
        need = None
        while True:
            try:
                val, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                # incomplete (the window ends inside the value) or invalid: read more, then decide
                # a complaint about a character inside the window is real; at its end, or an
                # unterminated string, the value may just continue past the window
                cut = e.pos >= len(self.buf) - _TOKEN_MAX or e.msg.startswith("Unterminated string")
                if self.eof or not cut:
                    raise ProfileError(f"not a JSON timeline: {e.msg} in {what} "
                                       f"(character {self.consumed + e.pos})", path=self.path,
                                       hint="the file is truncated or is not trace_view.json / msprof_*.json") from None
                val = end = None
            except ValueError as e:       # an integer of more than 4300 digits
                raise ProfileError(f"not a JSON timeline: {str(e)[:80]} in {what}", path=self.path) from None
            except RecursionError:
                raise ProfileError(f"not a JSON timeline: {what} is nested too deeply", path=self.path) from None
            # a value ending near the window end may be a cut number ("-1.5e" decodes as -1.5)
            if end is not None and (end < len(self.buf) - _TOKEN_MAX or self.eof):
                self.pos = end
                return val
            # a number or literal may continue past the window; an error may be a cut value
            size = len(self.buf) - self.pos
            if size >= max_chars:
                raise ProfileError(f"{what} is larger than {max_chars:,} characters", path=self.path,
                                   hint="is this a Chrome-trace timeline?")
            need = max(self.chunk, 2 * size if need is None else 2 * need)
            self.more(min(need, max_chars))


def iter_events(path: str, *, chunk: int = CHUNK_CHARS, max_element: int = MAX_ELEMENT_CHARS) -> Iterator:
    """Yield the elements of the timeline's event array (any JSON value; the caller checks them).

    Raises ProfileError when the file is not a JSON array of events nor an object with a
    ``traceEvents`` array, or is malformed; OSError when it cannot be read."""
    with open(path, "rb") as f:
        w = _Window(f, path, chunk)
        w.more()
        if w.buf.startswith("\ufeff"):      # a BOM
            w.pos = 1
        c = w.skip_ws()
        if c == "[":
            w.pos += 1
            yield from _array(w, max_element)
        elif c == "{":
            w.pos += 1
            yield from _object(w, max_element)
        else:
            raise ProfileError("not a Chrome-trace timeline (no event list)", path=path,
                               hint="give trace_view.json or msprof_*.json")
        if w.skip_ws() != "":
            raise ProfileError(f"not a JSON timeline: extra data after the events (character {w.offset()})",
                               path=path)


def _array(w: _Window, max_element: int) -> Iterator:
    n = 0
    if w.skip_ws() == "]":
        w.pos += 1
        return
    while True:
        n += 1
        if w.skip_ws() == "":
            raise ProfileError(f"not a JSON timeline: the file ends inside the event list (after event "
                               f"{n - 1})", path=w.path, hint="the file is truncated")
        yield w.value(f"event {n}", max_element)
        c = w.skip_ws()
        if c == ",":
            w.pos += 1
        elif c == "]":
            w.pos += 1
            return
        elif c == "":
            raise ProfileError(f"not a JSON timeline: the file ends inside the event list (after event {n})",
                               path=w.path, hint="the file is truncated")
        else:
            raise ProfileError(f"not a JSON timeline: expected ',' or ']' after event {n} "
                               f"(character {w.offset()})", path=w.path)


def _object(w: _Window, max_element: int) -> Iterator:
    found = False
    if w.skip_ws() == "}":
        w.pos += 1
    else:
        while True:
            if w.skip_ws() != '"':
                raise ProfileError(f"not a JSON timeline: expected a member name (character {w.offset()})",
                                   path=w.path)
            key = w.value("a member name", max_element)
            if w.skip_ws() != ":":
                raise ProfileError(f"not a JSON timeline: expected ':' (character {w.offset()})", path=w.path)
            w.pos += 1
            c = w.skip_ws()
            if key == "traceEvents" and c == "[" and not found:
                found = True
                w.pos += 1
                yield from _array(w, max_element)
            else:
                w.value(f"member {str(key)[:40]!r}", max_element)   # other members: decoded and dropped
            c = w.skip_ws()
            if c == ",":
                w.pos += 1
            elif c == "}":
                w.pos += 1
                break
            else:
                raise ProfileError(f"not a JSON timeline: expected ',' or '}}' (character {w.offset()})",
                                   path=w.path)
    if not found:
        raise ProfileError("not a Chrome-trace timeline (no event list)", path=w.path,
                           hint="give trace_view.json or msprof_*.json")
