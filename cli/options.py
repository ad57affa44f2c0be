"""Option groups shared by several commands, defined once and turned into API values.

Helpers here parse the user's strings (``"x:1,3,224,224;y:1,128"``) into Python values and raise
``click.BadParameter`` with a message that names the option.
"""

from __future__ import annotations

import click


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
        dims.append(v)
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
    click.option("--atol", type=float, default=None, help="Absolute tolerance (default by precision)."),
    click.option("--rtol", type=float, default=None, help="Relative tolerance (default by precision)."),
]


def apply(options):
    """Decorate a command with a list of click options (an option group)."""
    def deco(f):
        for opt in reversed(options):
            f = opt(f)
        return f
    return deco


def same_file(a, b) -> bool:
    """True when paths ``a`` and ``b`` name the same file (also through links or ``./`` spellings)."""
    import os

    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare the resolved spellings
        return os.path.realpath(a) == os.path.realpath(b)


def refuse_overwriting(outputs, inputs) -> None:
    """Raise ``InputError`` (exit 2) when an output option names one of the command's input files, or
    two output options name one file: the write would destroy data the user still needs.
    ``outputs``/``inputs``: ``(option or role, path or None)`` pairs."""
    from npu_deploy.errors import InputError

    outs = [(o, p) for o, p in outputs if p is not None]
    for opt, path in outs:
        for role, src in inputs:
            if src is not None and same_file(path, src):
                raise InputError(f"{opt} {path} is the {role} itself: writing it would overwrite it",
                                 hint=f"choose another {opt} path")
    for i, (o1, p1) in enumerate(outs):
        for o2, p2 in outs[i + 1:]:
            if same_file(p1, p2):
                raise InputError(f"{o1} and {o2} both name {p1}: one would replace the other",
                                 hint="give each output its own path")
