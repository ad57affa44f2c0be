"""Option groups shared by several commands, defined once and turned into API values.

Helpers here parse the user's strings (``"x:1,3,224,224;y:1,128"``) into Python values and raise
``click.BadParameter`` with a message that names the option.
"""

from __future__ import annotations

import math

import click

from npu_deploy._io import refuse_overwriting, same_file  # noqa: F401  (shared by every command)

# A dimension or an element count beyond this cannot be addressed (int64); larger is a typo or an attack.
MAX_ELEMENTS = 2**62


def parse_shape(text: str, *, option: str = "--shape") -> tuple[int, ...]:
    """``"1,3,224,224"`` → ``(1, 3, 224, 224)``; ``-1`` or ``?`` keep a dimension dynamic (-1)."""
    text = text.strip().strip("[]()")
    if not text:
        return ()
    dims = []
    for part in text.replace("x", ",").split(","):
        part = part.strip()
        if part in ("?", "-1"):
            dims.append(-1)
            continue
        try:
            v = int(part)
        except ValueError:
            raise click.BadParameter(f"{text!r}: {part!r} is not an integer dimension", param_hint=option)
        if v < 0:
            raise click.BadParameter(f"{text!r}: dimension {v} is negative", param_hint=option)
        if v > MAX_ELEMENTS:
            raise click.BadParameter(f"{text!r}: dimension {v} is too large (at most 2**62)", param_hint=option)
        dims.append(v)
    if math.prod(d for d in dims if d > 0) > MAX_ELEMENTS:
        raise click.BadParameter(f"{text!r}: {math.prod(d for d in dims if d > 0):.3g} elements is too many "
                                 f"(at most 2**62)", param_hint=option)
    return tuple(dims)


def parse_input_shapes(text: str | None, *, option: str = "--input-shape") -> dict[str, tuple[int, ...]]:
    """``"x:1,3,224,224;y:1,128"`` → ``{"x": (1,3,224,224), "y": (1,128)}`` (ATC's ``--input_shape`` syntax)."""
    if not text:
        return {}
    shapes: dict[str, tuple[int, ...]] = {}
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise click.BadParameter(f"{item!r} is not NAME:DIMS (example: x:1,3,224,224)", param_hint=option)
        shapes[name] = parse_shape(dims, option=option)
    return shapes


def parse_int_list(text: str | None, *, option: str) -> list[int]:
    """``"1,4,8"`` → ``[1, 4, 8]``."""
    if not text:
        return []
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of integers", param_hint=option)


SOCS = ["Ascend310P3", "Ascend910B", "Ascend310B1", "Ascend310", "Ascend910"]

soc_option = click.option("--soc", "soc", default=None, metavar="SOC",
                          help="Target SoC, as ATC's --soc_version (default Ascend310P3).")


tolerance_options = [
    click.option("--atol", type=float, default=None,
                 help="Absolute tolerance, finite and >= 0 (default by precision)."),
    click.option("--rtol", type=float, default=None,
                 help="Relative tolerance, finite and >= 0 (default by precision)."),
]
# (checked by npu_deploy.runtime.compare.check_thresholds, the one place that decides what is valid)


def apply(options):
    """Decorate a command with a list of click options (an option group)."""
    def deco(f):
        for opt in reversed(options):
            f = opt(f)
        return f
    return deco
