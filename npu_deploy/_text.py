"""Text that is safe to print: names from a stranger's file never drive the terminal.

>>> printable("conv\\x1b[2J1")
'conv\\\\x1b[2J1'
"""

from __future__ import annotations


def printable(text: str) -> str:
    """Escape control characters (newlines, ANSI escapes) that a stranger's file may carry in names."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
                   for c in text)
