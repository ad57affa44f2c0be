"""Convert options, decided once: one object, validated once, and what each backend can honour.

:class:`ConvertOptions` holds everything ``convert`` is asked to do. Its constructor checks what holds
for every backend (known backend, SoC, precision mode, input format, a positive timeout);
:meth:`ConvertOptions.for_backend` checks it against the chosen backend's row of
:data:`CAPABILITIES` and returns the notes about options that backend ignores. The rows name the facts
where they live: the built-in lowering's precision modes are the planner's
(:data:`~npu_deploy.converters.lowering.planner.PRECISION_MODES`), ATC's are its command line's
(:data:`~npu_deploy.converters.lowering.atc.PRECISION_MODES`).

>>> o = ConvertOptions(precision_mode="force_fp32")
>>> o.for_backend("atc", "requested")
[]
>>> o.for_backend("builtin", "requested")
Traceback (most recent call last):
...
npu_deploy.errors.InputError: precision mode force_fp32 is an ATC mode the built-in lowering does not implement (backend builtin: requested) (use one of force_fp16, allow_fp32_to_fp16, must_keep_origin_dtype, allow_mix_precision, or --backend atc on a CANN host)
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Sequence

from npu_deploy.converters.files.onnx_model import split_ranges
from npu_deploy.converters.lowering import atc as atcmod
from npu_deploy.converters.lowering import cost
from npu_deploy.converters.lowering import planner
from npu_deploy.errors import InputError
from npu_deploy.converters.lowering.support import soc_family

BACKENDS = ("auto", "atc", "builtin")
DEFAULT_SOC = "Ascend310P3"
DEFAULT_PRECISION_MODE = "force_fp16"  # ATC's default


@dataclasses.dataclass(frozen=True)
class BackendCapabilities:
    """What one backend can do with the options (``ignores``: options it accepts and does not use)."""

    name: str
    precision_modes: tuple[str, ...]
    input_formats: tuple[str, ...]
    insert_op_conf: bool
    ignores: tuple[str, ...] = ()


CAPABILITIES: dict[str, BackendCapabilities] = {
    "builtin": BackendCapabilities("builtin", planner.PRECISION_MODES, tuple(planner.INPUT_FORMAT_RANKS),
                                   insert_op_conf=True, ignores=("atc_args", "timeout", "atc", "atc_log")),
    "atc": BackendCapabilities("atc", atcmod.PRECISION_MODES, atcmod.INPUT_FORMATS, insert_op_conf=True),
}
ALL_PRECISION_MODES: tuple[str, ...] = tuple(dict.fromkeys(m for c in CAPABILITIES.values()
                                                           for m in c.precision_modes))
ALL_INPUT_FORMATS: tuple[str, ...] = tuple(dict.fromkeys(f for c in CAPABILITIES.values() for f in c.input_formats))

_CLI = {"atc_args": "--atc-arg", "timeout": "--timeout", "atc": "--atc", "insert_op_conf": "--insert-op-conf",
        "atc_log": "--log"}


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """Everything ``convert`` is asked to do (see :func:`npu_deploy.converters.lowering.convert.convert` for
    each field). ``None`` means "the default"; :attr:`precision` resolves it."""

    backend: str = "auto"
    soc: str = DEFAULT_SOC
    input_shapes: Mapping[str, Sequence[int]] | None = None
    input_format: str | None = None
    dynamic_batch: Sequence[int] | None = None
    dynamic_dims: Any = None
    precision_mode: str | None = None
    keep_dtype: tuple[str, ...] = ()
    enable_small_channel: bool = False
    atc_args: tuple[str, ...] = ()
    atc_flags: tuple[str, ...] = ()   # ATC options given by their ATC spelling, for ATC as they are
    out_nodes: str | None = None      # ATC's --out_nodes: cut the graph there (both backends)
    output_type: str | None = None    # ATC's --output_type: per-output dtypes (both backends)
    atc_log: str | None = None        # ATC's --log level
    timeout: float | None = None
    insert_op_conf: str | None = None
    atc: str | None = None
    #: ``{input: per-dim (low, high) or None}``: ranges given in ``input_shapes`` (``"1~4"``, ATC >= 8.5)
    #: or ATC's older ``--input_shape_range``; ``input_shapes`` then holds the largest shape of each
    shape_ranges: Mapping[str, tuple] | None = None
    #: a SoC profile JSON given as ``soc`` (``npu-deploy cost fit -o my.json``): the estimate uses it,
    #: the planning (and ATC) its ``base`` SoC
    cost_profile: Any = None
    #: the installed op info to plan with (``--op-info DIR``: an opp folder, its ``config`` folder or a
    #: ``<soc>`` folder; None: ``$ASCEND_OPP_PATH`` when set, else the built-in op table; ``opinfo.resolve``)
    op_info: Any = None   # a path, or an opinfo.OpInfo already read (optimize reads it once)

    def __post_init__(self) -> None:
        _split_ranges(self)

        object.__setattr__(self, "soc", self.soc or DEFAULT_SOC)
        if self.cost_profile is None and _is_profile_path(str(self.soc)):
            profile, base = _read_profile(str(self.soc))
            object.__setattr__(self, "cost_profile", profile)
            object.__setattr__(self, "soc", base)
        object.__setattr__(self, "keep_dtype", tuple(self.keep_dtype or ()))
        object.__setattr__(self, "atc_args", tuple(self.atc_args or ()))
        object.__setattr__(self, "atc_flags", tuple(self.atc_flags or ()))
        if self.backend not in BACKENDS:
            raise InputError(f"unknown backend {self.backend!r}", hint=f"use one of: {', '.join(BACKENDS)}")
        if self.precision_mode is not None and self.precision_mode not in ALL_PRECISION_MODES:
            raise InputError(f"unknown precision mode {self.precision_mode!r}",
                             hint=f"use one of: {', '.join(ALL_PRECISION_MODES)}")
        if self.input_format is not None and self.input_format not in ALL_INPUT_FORMATS:
            raise InputError(f"unknown input format {self.input_format!r}",
                             hint=f"use one of: {', '.join(ALL_INPUT_FORMATS)}")
        if self.timeout is not None and not self.timeout > 0:
            raise InputError(f"timeout {self.timeout} must be a positive number of seconds")
        soc_family(self.soc)

    @property
    def precision(self) -> str:
        """The precision mode in force (ATC's default, ``force_fp16``, when none was given)."""
        return self.precision_mode or DEFAULT_PRECISION_MODE

    def for_backend(self, backend: str, reason: str) -> list[str]:
        """Check these options against ``backend``'s capabilities (``reason``: why it was chosen, for
        the message); return one note per given option the backend ignores."""
        caps = CAPABILITIES[backend]
        if self.precision_mode is not None and self.precision_mode not in caps.precision_modes:
            if backend == "builtin":
                raise InputError(f"precision mode {self.precision_mode} is an ATC mode the built-in lowering "
                                 f"does not implement (backend builtin: {reason})",
                                 hint=f"use one of {', '.join(caps.precision_modes)}, or --backend atc on a "
                                      f"CANN host")
            raise InputError(f"precision mode {self.precision_mode} is not an ATC precision mode "
                             f"(backend {backend}: {reason})", hint=f"use one of {', '.join(caps.precision_modes)}")
        if self.input_format is not None and self.input_format not in caps.input_formats:
            raise InputError(f"--input-format {self.input_format} is not accepted by ATC for ONNX models: ATC's "
                             f"rule for ONNX is {', '.join(caps.input_formats)} (NHWC/NDHWC only for TensorFlow "
                             f"models); backend {backend} ({reason})",
                             hint=f"use --backend builtin, where {self.input_format} host inputs are supported "
                                  f"(converted on the device), or feed the model's own layout and drop "
                                  f"--input-format")
        ignored = [k for k in caps.ignores if getattr(self, k)]
        if self.insert_op_conf and not caps.insert_op_conf:
            ignored.append("insert_op_conf")
        notes = []
        if ignored:
            names = ", ".join(_CLI[k] for k in ignored)
            one = len(ignored) == 1
            notes.append(f"{names} only appl{'ies' if one else 'y'} to the ATC backend; the built-in lowering "
                         f"ran and ignored {'it' if one else 'them'}")
        if backend == "atc" and self.op_info is not None:
            notes.append("--op-info applies to the built-in lowering; ATC reads the op info of its own CANN "
                         "install ($ASCEND_OPP_PATH)")
        if self.atc_flags and "atc_args" in caps.ignores:
            named = ", ".join(_atc_flag_note(a) for a in self.atc_flags)
            notes.append(f"ATC options the built-in lowering has no counterpart for, ignored: {named}")
        return notes


# ATC flags the built-in lowering has no counterpart for (passed to ATC verbatim): what each one does
ATC_ONLY_FLAGS: dict[str, str] = {
    "--log": "ATC's log level",
    "--op_select_implmode": "ATC's kernel implementation choice",
    "--optypelist_for_implmode": "ATC's kernel implementation choice",
    "--fusion_switch_file": "ATC's fusion passes",
    "--buffer_optimize": "ATC's buffer optimisation",
}


def _atc_flag_note(arg: str) -> str:
    name = str(arg).partition("=")[0]
    what = ATC_ONLY_FLAGS.get(name)
    return f"{name} ({what})" if what else name


def _split_ranges(o: ConvertOptions) -> None:
    """Move ranges out of ``input_shapes`` into ``shape_ranges``; each ranged dim of ``input_shapes``
    becomes its largest value (its lowest when unbounded), the shape the model is loaded and checked at."""
    shapes, ranges = split_ranges(o.input_shapes)
    ranges = {**ranges, **{n: tuple(r) for n, r in (o.shape_ranges or {}).items()}}
    if not ranges:
        return
    if o.dynamic_batch or o.dynamic_dims:
        raise InputError("shape ranges (LOW~HIGH) cannot be combined with gears (--dynamic-batch / --dynamic-dims)",
                         hint="ATC accepts one of the two; choose ranges or gears")
    shapes = dict(shapes or {})
    for name, rng in ranges.items():
        if name not in shapes:
            raise InputError(f"--input_shape_range names input {name!r}, which --input-shape does not give",
                             hint=f'give its shape too, e.g. --input-shape "{name}:1~4,3,224,224"')
        dims = list(shapes[name])
        if len(rng) != len(dims):
            raise InputError(f"input {name!r}: the range has {len(rng)} dims, the shape {len(dims)}")
        for k, r in enumerate(rng):
            if r is not None:
                dims[k] = r[1] if r[1] != -1 else r[0]
        shapes[name] = tuple(dims)
    object.__setattr__(o, "input_shapes", shapes)
    object.__setattr__(o, "shape_ranges", {n: tuple(r) for n, r in ranges.items()})


def _is_profile_path(soc: str) -> bool:
    return soc.lower().endswith(".json") or os.sep in soc


def _read_profile(path: str):
    """A SoC profile JSON (``cost fit``'s output): the profile, checked field by field, and the SoC it is
    based on (what the planner plans for and ATC compiles for)."""
    profile = cost.get_soc_profile(path)   # unreadable, not JSON, unknown or out-of-range fields: one line
    with open(path, encoding="utf-8") as f:
        base = json.load(f).get("base", DEFAULT_SOC)
    return profile, str(base)
