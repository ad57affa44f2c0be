"""Option groups shared by several commands, defined once and turned into API values.

Helpers here parse the user's strings (``"x:1,3,224,224;y:1,128"``) into Python values and raise
``click.BadParameter`` with a message that names the option.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Callable

import click

from npu_deploy._io import refuse_overwriting, same_file  # noqa: F401  (shared by every command)
from npu_deploy.converters.files.onnx_model import parse_dim
from npu_deploy.errors import InputError
from npu_deploy.converters.lowering import ops
from npu_deploy.converters.lowering.options import ALL_PRECISION_MODES

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
        if "~" in part:  # a shape range, ATC >= 8.5: "1~4"
            dims.append(_range(text, part, option))
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
    count = math.prod(d for d in dims if isinstance(d, int) and d > 0)  # a range counts as dynamic
    if count > MAX_ELEMENTS:
        raise click.BadParameter(f"{text!r}: {count:.3g} elements is too many "
                                 f"(at most 2**62)", param_hint=option)
    return tuple(dims)


def _range(text: str, part: str, option: str) -> tuple[int, int]:
    try:
        return parse_dim(part, where=option)
    except InputError as e:
        raise click.BadParameter(f"{text!r}: {e.message}", param_hint=option) from None


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


SOCS = list(ops.SOCS)


def input_shape_option(*aliases: str, note: str = ""):
    """The one ``--input-shape`` option of every command: its name, value syntax and help (ATC's
    ``--input_shape`` syntax, parsed by :func:`parse_input_shapes`). ``aliases`` add a tool's own
    spelling (ATC ``--input_shape``, ais_bench ``--dymDims``); ``note`` says what it does in this command."""
    text = "Shapes for dynamic inputs (ATC --input_shape syntax), e.g. 'x:1,3,224,224;y:1,128'."
    return click.option("--input-shape", *aliases, "input_shape", default=None, metavar="NAME:DIMS;...",
                        help=f"{text} {note}".strip())


def soc_option_with(note: str = "Target SoC (ATC: --soc_version; default Ascend310P3)."):
    """The one ``--soc`` option (ATC's ``--soc_version`` accepted); ``note``: what it does in this command."""
    return click.option("--soc", "--soc_version", "soc", default=None, metavar="SOC", help=note)


soc_option = soc_option_with()


# --op-info: the installed op info the built-in planner reads (convert, optimize)
op_info_option = click.option(
    "--op-info", "op_info", default=None, metavar="DIR",
    help="A CANN opp folder (or its op_impl/ai_core/tbe/config folder): its aic-<soc>-ops-info.json columns "
         "narrow the formats the built-in planner gives each op. Default: $ASCEND_OPP_PATH when set, else "
         "the built-in op table.")


def precision_mode_option(note: str):
    """The one ``--precision-mode`` option (ATC's ``--precision_mode`` accepted, ATC's mode names)."""
    return click.option("--precision-mode", "--precision_mode", "precision_mode",
                        type=click.Choice(ALL_PRECISION_MODES), default=None, help=note)


tolerance_options = [
    click.option("--atol", type=float, default=None,
                 help="Absolute tolerance, finite and >= 0 (default by precision)."),
    click.option("--rtol", type=float, default=None,
                 help="Relative tolerance, finite and >= 0 (default by precision)."),
]
# (checked by npu_deploy.runtime.check.compare.check_thresholds, the one place that decides what is valid)

# Polygraphy's spelling: a number for every output, or NAME:number for one (repeatable, mixable)
per_output_tolerance_options = [
    click.option("--atol", "atol", multiple=True, metavar="[NAME:]X",
                 help="Absolute tolerance, finite and >= 0 (default by precision); NAME:X for one output "
                      "(repeatable: --atol 1e-4 --atol logits:1e-3)."),
    click.option("--rtol", "rtol", multiple=True, metavar="[NAME:]X",
                 help="Relative tolerance, finite and >= 0 (default by precision); NAME:X for one output."),
]


def parse_tolerances(values: tuple[str, ...], *, option: str) -> float | dict[str, float] | None:
    """``("1e-4",)`` → ``1e-4``; ``("1e-4", "out1:1e-3")`` → ``{"": 1e-4, "out1": 1e-3}``."""
    if not values:
        return None
    per: dict[str, float] = {}
    for v in values:
        for item in str(v).split():
            name, sep, num = item.rpartition(":")
            try:
                x = float(num)
            except ValueError:
                raise click.BadParameter(f"{item!r} is not a number or NAME:NUMBER", param_hint=option)
            per[name if sep else ""] = x
    return per[""] if list(per) == [""] else per


def parse_val_ranges(values: tuple[str, ...], *, option: str = "--val-range") -> dict[str, tuple[float, float]]:
    """Polygraphy's ``--val-range``: ``[0,1]`` for every input, ``x:[0,255]`` for one."""
    out: dict[str, tuple[float, float]] = {}
    for v in values:
        for item in str(v).split():
            head, sep, rng = item.rpartition(":[")
            if sep:
                name, body = head, rng
            elif item.startswith("["):
                name, body = "", item[1:]
            else:
                raise click.BadParameter(f"{item!r} is not [LO,HI] or NAME:[LO,HI]", param_hint=option)
            if not body.endswith("]"):
                raise click.BadParameter(f"{item!r}: the range must end with ']'", param_hint=option)
            parts = body[:-1].split(",")
            try:
                lo, hi = (float(x) for x in parts)
            except ValueError:
                raise click.BadParameter(f"{item!r}: the range is two numbers, [LO,HI]", param_hint=option)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                raise click.BadParameter(f"{item!r}: need finite LO <= HI", param_hint=option)
            out[name] = (lo, hi)
    return out


def apply(options):
    """Decorate a command with a list of click options (an option group)."""
    def deco(f):
        for opt in reversed(options):
            f = opt(f)
        return f
    return deco


# ------------------------------------------------------------------------------------------------
# Other tools' spellings (ATC, ais_bench, Polygraphy): aliases, value rewrites, "did you mean"

@dataclasses.dataclass(frozen=True)
class Rewrite:
    """A foreign spelling whose *value* has to change before click parses it: ``--enable_small_channel=1``
    (ATC's 0/1) becomes our flag ``--enable-small-channel``. ``to(value)`` returns the replacement
    arguments (``value`` is ``None`` for the bare flag); ``values``: the values it takes from the next
    argument when no ``=`` is given (gflags accepts ``--name value`` for its string flags)."""

    spelling: str
    to: Callable[[str | None], list[str]]
    values: tuple[str, ...] = ()
    takes_value: bool = False  # the next argument is always the value (``--model x.om``)


def flag_from_01(option: str, spelling: str) -> Rewrite:
    """ATC's ``--name=0|1`` (or bare ``--name``) → our boolean flag ``option`` (present for 1)."""
    def to(value):
        v = "1" if value is None else value.strip().lower()
        if v in ("1", "true"):
            return [option]
        if v in ("0", "false"):
            return []
        raise click.BadParameter(f"{value!r} is not 0 or 1", param_hint=spelling)

    return Rewrite(spelling, to, values=("0", "1", "true", "false"))


def positional(spelling: str) -> Rewrite:
    """A foreign option that names what is our positional argument: ``--model x.om`` → ``x.om``."""
    return Rewrite(spelling, lambda v: [v], takes_value=True)


def rewrite_args(args: list[str], rewrites: dict[str, Rewrite]) -> list[str]:
    """``args`` with every foreign spelling in ``rewrites`` replaced (arguments after ``--`` untouched)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out.extend(args[i:])
            break
        name, eq, value = a.partition("=")
        rw = rewrites.get(name)
        if rw is None:
            out.append(a)
        elif eq:
            out.extend(rw.to(value))
        elif rw.takes_value:
            if i + 1 >= len(args):
                raise click.BadParameter("needs a value", param_hint=name)
            i += 1
            out.extend(rw.to(args[i]))
        elif i + 1 < len(args) and args[i + 1].lower() in rw.values:
            i += 1
            out.extend(rw.to(args[i]))
        else:
            out.extend(rw.to(None))
        i += 1
    return out


class HabitCommand(click.Command):
    """A command that also speaks other tools' spellings.

    Aliases that keep the value as it is are plain extra option names (``--input-shape`` /
    ``--input_shape``); :class:`Rewrite` entries in ``rewrites`` change the value first. An unknown
    option gets the nearest of ours (dashes and underscores, case ignored) and, for a command that
    drives ATC (``passthrough``), the way to hand it to ATC verbatim.
    """

    def __init__(self, *args, rewrites: dict[str, Rewrite] | None = None, passthrough: str | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.rewrites = dict(rewrites or {})
        self.passthrough = passthrough

    def parse_args(self, ctx, args):
        args = rewrite_args(list(args), self.rewrites)
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            raise click.UsageError(self._unknown(e.option_name), ctx) from None

    def option_names(self) -> list[str]:
        names = [n for p in self.params if isinstance(p, click.Option) for n in (*p.opts, *p.secondary_opts)]
        return [n for n in names if n.startswith("--")] + list(self.rewrites)

    def _unknown(self, option: str) -> str:
        known = self.option_names()
        key = _option_key(option.partition("=")[0])
        snake = "_" in option
        by_key: dict[str, str] = {}
        for n in known:  # of two spellings of one option, offer the one in the user's style
            k = _option_key(n)
            if k not in by_key or ("_" in n) == snake != ("_" in by_key[k]):
                by_key[k] = n
        near = [by_key[k] for k in difflib.get_close_matches(key, list(by_key), n=3, cutoff=0.75)]
        text = f"no such option: {option}"
        if near:
            text += f"; did you mean {' or '.join(near)}?"
        elif self.passthrough and "_" in option and option.startswith("--"):
            text += (f"; if it is an ATC option, pass it to ATC verbatim: "
                     f"{self.passthrough}={option if '=' in option else option + '=VALUE'}")
        return text


def _option_key(name: str) -> str:
    return name.lstrip("-").replace("_", "-").lower()
