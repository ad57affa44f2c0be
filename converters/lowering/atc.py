"""ATC driver: build ATC's command line from one flag table, run it without a shell, read its result.

Written against the documented contract of Huawei's ATC (``shared/reference/atc-acl-om.md`` §1):
gflags ``--name=value`` arguments, ``--framework=5`` for ONNX, ``--output`` without ``.om`` (ATC
appends it and may write ``<output>_<os>_<arch>.om``), exit status 0 with the line
``ATC run success, welcome to the next use.`` on success and 255 with an ErrorManager block
(``E19010: [PID: n] <time> message`` / ``Possible Cause:`` / ``Solution:`` / ``TraceBack``) on
failure, 127 when its shared libraries cannot be loaded. **Verified only against the stand-in
``tests/standins/atc``**, which enforces that contract; no real ATC runs here.

Public API (used by ``convert(backend="atc")`` and ``npu-deploy convert --backend atc``)::

    find_atc(explicit: str | os.PathLike | None = None) -> str | None
        # explicit path (must be an executable file, else InputError), else `atc` on PATH, else
        # $ASCEND_TOOLKIT_HOME/{bin,compiler/bin}/atc, else /usr/local/Ascend/ascend-toolkit/latest/...
    require_atc(explicit=None) -> str                       # DependencyError (exit 3) when not found
    ATC_FLAGS: dict[str, AtcFlag]     # npu-deploy option -> AtcFlag(flag, format(value) -> str, doc)
    PRECISION_MODES, INPUT_FORMATS, LOG_LEVELS: tuple[str, ...]
    build_atc_argv(model, output, *, soc, atc="atc", input_shapes=None, input_format=None,
                   dynamic_batch=None, dynamic_image_size=None, dynamic_dims=None,
                   precision_mode=None, keep_dtype=None, insert_op_conf=None, log="error",
                   extra_args=(), workdir=None) -> list[str]
        # argv[0] is `atc`. input_shapes: {name: (dims…)} with -1 for gear dimensions;
        # dynamic_batch: [1, 2, 4]; dynamic_image_size: [(h, w), …]; dynamic_dims: [[d…], …]
        # (one value per -1 across all inputs, in input order); keep_dtype: op names /
        # "OpType::Relu" entries (written to <workdir>/keep_dtype.cfg) or the path of such a file;
        # extra_args: extra "--name=value" strings passed verbatim (a flag npu-deploy already sets
        # is refused). ATC's documented exclusions are checked here and raise InputError.
    run_atc(argv, *, timeout=None, on_line=None, on_tick=None, env=None, cwd=None,
            log_dir=None) -> AtcResult
        # Popen(argv) with no shell in its own process group; stdout+stderr streamed line by line
        # to on_line(line: str, elapsed_s: float); on_tick(elapsed_s) about once a second while
        # ATC is silent. Timeout -> the process group is terminated (then killed) and AtcError.
        # Exit != 0 -> AtcError(codes, details=[{code, message, possible_cause, solution,
        # traceback, node, op_type, opset}], log_path, returncode) with a hint for common codes.
        # Exit 0 -> <output>*.om must exist and start with b"IMOD", else AtcError.
        # ATC's logs go to log_dir (default: $ASCEND_PROCESS_LOG_PATH if set, else a new temp dir
        # that is kept after a failure and removed after a success) via ASCEND_PROCESS_LOG_PATH.
    atc_convert(model, output, *, soc, atc=None, timeout=None, on_line=None, on_tick=None,
                **build_kwargs) -> AtcResult                # require_atc + build_atc_argv + run_atc
    parse_atc_errors(text: str) -> list[dict]               # the ErrorManager blocks of ATC output
    console_progress(stream=None, *, verbose=False) -> (on_line, on_tick)
        # ready-made callbacks printing "atc [  12.3 s] <line>" for the CLI
    AtcResult (a npu_deploy._result.Result): argv, returncode, elapsed_s, om_path, output (list of
        lines), warnings (W-codes seen), log_path; bool() True; verdict() one line.

>>> argv = build_atc_argv("model.onnx", "out/model.om", soc="Ascend310P3", atc="atc",
...                       input_shapes={"x": (1, 3, 224, 224)}, precision_mode="force_fp16",
...                       check_files=False)
>>> argv
['atc', '--model=model.onnx', '--framework=5', '--output=out/model', '--soc_version=Ascend310P3', \
'--input_shape=x:1,3,224,224', '--precision_mode=force_fp16', '--log=error']
"""

from __future__ import annotations

import atexit
import dataclasses
import glob
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

from npu_deploy._result import Result
from npu_deploy.errors import AtcError, DependencyError, InputError

OM_MAGIC = b"IMOD"

PRECISION_MODES = ("force_fp16", "force_fp32", "cube_fp16in_fp32out", "allow_fp32_to_fp16",
                   "must_keep_origin_dtype", "allow_mix_precision", "allow_mix_precision_fp16",
                   "allow_mix_precision_bf16", "allow_fp32_to_bf16")
# --input_format values ATC accepts for ONNX models (§1.2).
INPUT_FORMATS = ("NCHW", "NCDHW", "ND")
LOG_LEVELS = ("debug", "info", "warning", "error", "null")
MAX_GEARS = 100

_GEAR_OPTIONS = ("dynamic_batch", "dynamic_image_size", "dynamic_dims")


def _shape_text(shapes: Mapping[str, Sequence[int]]) -> str:
    parts = []
    for name, dims in shapes.items():
        parts.append(f"{name}:" + ",".join(str(int(d)) for d in dims))
    return ";".join(parts)


@dataclasses.dataclass(frozen=True)
class AtcFlag:
    """How one npu-deploy option becomes one ATC argument."""

    flag: str
    format: Callable[[Any], str]
    doc: str

    def render(self, value: Any) -> str:
        return f"{self.flag}={self.format(value)}"


ATC_FLAGS: dict[str, AtcFlag] = {
    "model": AtcFlag("--model", os.fspath, "the ONNX file"),
    "framework": AtcFlag("--framework", str, "5 = ONNX (always)"),
    "output": AtcFlag("--output", lambda p: _strip_om(os.fspath(p)),
                      "output path without .om (ATC appends it)"),
    "soc": AtcFlag("--soc_version", str, "target chip, e.g. Ascend310P3"),
    "input_shapes": AtcFlag("--input_shape", _shape_text, '"x:1,3,224,224;y:1,128"; -1 for gears'),
    "input_format": AtcFlag("--input_format", str, "NCHW | NCDHW | ND"),
    "dynamic_batch": AtcFlag("--dynamic_batch_size", lambda v: ",".join(str(int(b)) for b in v),
                             '"1,2,4,8"'),
    "dynamic_image_size": AtcFlag("--dynamic_image_size",
                                  lambda v: ";".join(f"{int(h)},{int(w)}" for h, w in v),
                                  '"224,224;448,448"'),
    "dynamic_dims": AtcFlag("--dynamic_dims",
                            lambda v: ";".join(",".join(str(int(d)) for d in g) for g in v),
                            '"1,128;4,128": one value per -1 across all inputs'),
    "precision_mode": AtcFlag("--precision_mode", str, "force_fp16 (default), allow_mix_precision…"),
    "keep_dtype": AtcFlag("--keep_dtype", os.fspath, "file: one op name or OpType::X per line"),
    "insert_op_conf": AtcFlag("--insert_op_conf", os.fspath, "AIPP config file"),
    "log": AtcFlag("--log", str, "debug | info | warning | error | null"),
}


def _strip_om(path: str) -> str:
    return path[:-3] if path.lower().endswith(".om") else path


# ---------------------------------------------------------------------------------------------
# Finding ATC

def _is_exe(p: str | os.PathLike) -> bool:
    return os.path.isfile(p) and os.access(p, os.X_OK)


def find_atc(explicit: str | os.PathLike | None = None) -> str | None:
    """Path of the ``atc`` executable, or None when there is none.

    >>> find_atc() is None or find_atc().endswith("atc")
    True
    """
    if explicit is not None:
        p = os.fspath(explicit)
        if not _is_exe(p):
            raise InputError(f"ATC executable {p} does not exist or is not executable",
                             hint="give the path of CANN's bin/atc")
        return os.path.abspath(p)
    found = shutil.which("atc")
    if found:
        return found
    roots = [os.environ.get("ASCEND_TOOLKIT_HOME"), "/usr/local/Ascend/ascend-toolkit/latest"]
    for root in filter(None, roots):
        for rel in ("bin/atc", "compiler/bin/atc"):
            cand = os.path.join(root, rel)
            if _is_exe(cand):
                return cand
    return None


def require_atc(explicit: str | os.PathLike | None = None) -> str:
    """Like :func:`find_atc` but raise :class:`DependencyError` (exit 3) when ATC is missing."""
    found = find_atc(explicit)
    if found is None:
        raise DependencyError(
            "ATC (the CANN model compiler) was not found on PATH or under $ASCEND_TOOLKIT_HOME",
            hint="install the CANN toolkit and `source /usr/local/Ascend/ascend-toolkit/set_env.sh`, "
                 "pass --atc PATH, or use the built-in backend (--backend builtin)")
    return found


# ---------------------------------------------------------------------------------------------
# Building the command line

_workdirs: list[str] = []


def _cleanup_workdirs() -> None:
    for d in _workdirs:
        shutil.rmtree(d, ignore_errors=True)


atexit.register(_cleanup_workdirs)


def _new_workdir() -> str:
    d = tempfile.mkdtemp(prefix="npu-deploy-atc-")
    _workdirs.append(d)
    return d


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def _check_gears(name: str, gears: Sequence[Any]) -> None:
    if not 2 <= len(gears) <= MAX_GEARS:
        raise InputError(f"{name}: {len(gears)} gear(s) given; ATC needs between 2 and {MAX_GEARS}",
                         hint="list at least two gears, e.g. 1,4")


def _pos_ints(name: str, values: Iterable[Any]) -> list[int]:
    out = []
    for v in values:
        try:
            iv = int(v)
        except (TypeError, ValueError):
            raise InputError(f"{name}: {v!r} is not an integer") from None
        if iv <= 0:
            raise InputError(f"{name}: gear value {iv} must be positive")
        out.append(iv)
    return out


def build_atc_argv(model: str | os.PathLike, output: str | os.PathLike, *, soc: str,
                   atc: str | os.PathLike = "atc",
                   input_shapes: Mapping[str, Sequence[int]] | None = None,
                   input_format: str | None = None,
                   dynamic_batch: Sequence[int] | None = None,
                   dynamic_image_size: Sequence[Sequence[int]] | None = None,
                   dynamic_dims: Sequence[Sequence[int]] | None = None,
                   precision_mode: str | None = None,
                   keep_dtype: Sequence[str] | str | os.PathLike | None = None,
                   insert_op_conf: str | os.PathLike | None = None,
                   log: str | None = "error",
                   extra_args: Sequence[str] = (),
                   workdir: str | os.PathLike | None = None,
                   check_files: bool = True, shape_ranges: Mapping[str, Sequence[Any]] | None = None) -> list[str]:
    """ATC's argument list for an ONNX model, checked against ATC's documented rules first.

    ``output`` may end in ``.om``; the suffix is dropped because ATC appends it. Set
    ``check_files=False`` to skip the existence checks of input files (for dry runs).

    >>> build_atc_argv("m.onnx", "m", soc="Ascend910B", atc="atc", dynamic_batch=[1, 4],
    ...                input_shapes={"x": (-1, 3, 8, 8)}, log=None, check_files=False)[-2:]
    ['--input_shape=x:-1,3,8,8', '--dynamic_batch_size=1,4']
    """
    shapes = {str(k): tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
    model_s = os.fspath(model)
    out_s = _check_target(model_s, output, soc, shapes, check_files)
    fmt = _check_gear_choice(dynamic_batch, dynamic_image_size, dynamic_dims, input_format)
    if dynamic_batch:
        dynamic_batch = _batch_gears(dynamic_batch, shapes)
    if dynamic_image_size:
        dynamic_image_size = _image_gears(dynamic_image_size, shapes, fmt)
    if dynamic_dims:
        dynamic_dims, fmt = _dims_gears(dynamic_dims, shapes, fmt, insert_op_conf)
    _check_modes(insert_op_conf, fmt, precision_mode, log, check_files)
    keep_file = _keep_dtype_file(keep_dtype, workdir, check_files)

    values: dict[str, Any] = {
        "model": model_s, "framework": 5, "output": out_s, "soc": soc,
        "input_shapes": shapes or None, "input_format": fmt,
        "dynamic_batch": dynamic_batch or None, "dynamic_image_size": dynamic_image_size or None,
        "dynamic_dims": dynamic_dims or None, "precision_mode": precision_mode,
        "keep_dtype": keep_file, "insert_op_conf": insert_op_conf, "log": log,
    }
    argv = [os.fspath(atc)]
    for key, flag in ATC_FLAGS.items():
        if values[key] is not None:
            argv.append(flag.render(values[key]))
    argv += _extra_argv(extra_args, {_flag_name(a) for a in argv[1:]}, precision_mode, values)
    gears_given = [g for g in _GEAR_OPTIONS if values[g]]
    return shape_range_argv(argv, shape_ranges, gears_given)


def _check_target(model_s: str, output: str | os.PathLike, soc: str, shapes: Mapping[str, tuple[int, ...]],
                  check_files: bool) -> str:
    """The SoC, model and output paths and the input shapes checked; the output path without ``.om``."""
    if not soc or not str(soc).strip():
        raise InputError("ATC needs a target SoC", hint="pass --soc, e.g. Ascend310P3")
    out_s = _strip_om(os.fspath(output))
    if not out_s or out_s.endswith(os.sep):
        raise InputError(f"ATC output {os.fspath(output)!r} has no file name",
                         hint="give a path such as out/model.om")
    if check_files:
        if not os.path.isfile(model_s):
            raise InputError(f"model {model_s} does not exist", hint="check the path")
        out_dir = os.path.dirname(out_s) or "."
        if not os.path.isdir(out_dir):
            raise InputError(f"output folder {out_dir} does not exist",
                             hint="create it or choose another --output")
    for name, dims in shapes.items():
        if any(d < -1 for d in dims):
            raise InputError(f"input shape {name}:{dims} has a negative dimension other than -1")
    return out_s


def _check_gear_choice(dynamic_batch, dynamic_image_size, dynamic_dims, input_format: str | None) -> str | None:
    """At most one kind of dynamic gears; the input format upper-cased and checked."""
    gear_values = {"dynamic_batch": dynamic_batch, "dynamic_image_size": dynamic_image_size,
                   "dynamic_dims": dynamic_dims}
    gears_given = [g for g in _GEAR_OPTIONS if gear_values[g]]
    if len(gears_given) > 1:
        raise InputError(f"ATC allows only one of --dynamic_batch_size, --dynamic_image_size, "
                         f"--dynamic_dims (got {', '.join(gears_given)})", hint="choose one")
    fmt = input_format.upper() if input_format else None
    if fmt is not None and fmt not in INPUT_FORMATS:
        raise InputError(f"input format {input_format!r} is not accepted by ATC for ONNX models",
                         hint=f"use one of {', '.join(INPUT_FORMATS)}")
    return fmt


def _batch_gears(dynamic_batch: Sequence[int], shapes: Mapping[str, tuple[int, ...]]) -> list[int]:
    batches = _pos_ints("dynamic batch", dynamic_batch)
    _check_gears("dynamic batch", batches)
    if not shapes or not any(d and d[0] == -1 for d in shapes.values()):
        raise InputError("dynamic batch needs -1 as the first dimension in --input-shape",
                         hint="e.g. --input-shape x:-1,3,224,224 --dynamic-batch 1,2,4,8")
    for name, dims in shapes.items():
        if -1 in dims[1:]:
            raise InputError(f"dynamic batch: input {name} has -1 beyond the batch dimension",
                             hint="only the first dimension can vary with --dynamic-batch")
    return batches


def _image_gears(dynamic_image_size: Sequence[Sequence[int]], shapes: Mapping[str, tuple[int, ...]],
                 fmt: str | None) -> list[tuple[int, ...]]:
    pairs = [tuple(_pos_ints("dynamic image size", g)) for g in dynamic_image_size]
    if any(len(p) != 2 for p in pairs):
        raise InputError("dynamic image size gears must be (height, width) pairs")
    _check_gears("dynamic image size", pairs)
    if fmt not in (None, "NCHW"):
        raise InputError("dynamic image size needs --input-format NCHW (or NHWC)")
    if not shapes or not any(len(d) == 4 and d[2:] == (-1, -1) for d in shapes.values()):
        raise InputError("dynamic image size needs -1,-1 for H and W in --input-shape",
                         hint="e.g. --input-shape x:1,3,-1,-1")
    return pairs


def _dims_gears(dynamic_dims: Sequence[Sequence[int]], shapes: Mapping[str, tuple[int, ...]], fmt: str | None,
                insert_op_conf) -> tuple[list, str]:
    """The dynamic dims gears checked, and the input format they imply (ND)."""
    gears = [_pos_ints("dynamic dims", g) for g in dynamic_dims]
    _check_gears("dynamic dims", gears)
    if insert_op_conf is not None:
        raise InputError("ATC does not support AIPP (--insert_op_conf) with dynamic dims",
                         hint="use dynamic batch or fixed shapes with AIPP")
    if fmt not in (None, "ND"):
        raise InputError("dynamic dims needs --input-format ND",
                         hint="drop --input-format or set it to ND")
    n_dyn = sum(d.count(-1) for d in shapes.values())
    if n_dyn == 0:
        raise InputError("dynamic dims needs -1 dimensions in --input-shape",
                         hint="e.g. --input-shape ids:1,-1 --dynamic-dims 128;256")
    for g in gears:
        if len(g) != n_dyn:
            raise InputError(f"dynamic dims gear {','.join(map(str, g))} has {len(g)} value(s); "
                             f"the input shapes have {n_dyn} -1 dimension(s)",
                             hint="give one value per -1, across all inputs in order")
    return gears, "ND"


def _check_modes(insert_op_conf, fmt: str | None, precision_mode: str | None, log: str | None,
                 check_files: bool) -> None:
    """AIPP's format and file, the precision mode and the log level."""
    if insert_op_conf is not None:
        if fmt not in (None, "NCHW"):
            raise InputError("AIPP (--insert_op_conf) needs --input-format NCHW or NHWC")
        if check_files and not os.path.isfile(insert_op_conf):
            raise InputError(f"AIPP config {os.fspath(insert_op_conf)} does not exist")
    if precision_mode is not None and precision_mode not in PRECISION_MODES:
        raise InputError(f"precision mode {precision_mode!r} is not an ATC precision mode",
                         hint=f"use one of {', '.join(PRECISION_MODES)}")
    if log is not None and log not in LOG_LEVELS:
        raise InputError(f"ATC log level {log!r} is invalid", hint=f"use one of {', '.join(LOG_LEVELS)}")


def _keep_dtype_file(keep_dtype, workdir, check_files: bool) -> str | None:
    """The --keep_dtype file: the one given, or one written into ``workdir`` from op names."""
    if keep_dtype is None:
        return None
    if isinstance(keep_dtype, (str, os.PathLike)):
        keep_file = os.fspath(keep_dtype)
        if check_files and not os.path.isfile(keep_file):
            raise InputError(f"keep_dtype file {keep_file} does not exist")
        return keep_file
    names = [str(n) for n in keep_dtype]
    for n in names:
        if not n.strip() or "\n" in n or "\r" in n:
            raise InputError(f"keep_dtype entry {n!r} must be one op name or OpType::X "
                             f"on one line")
    if not names:
        return None
    wd = os.fspath(workdir) if workdir is not None else _new_workdir()
    keep_file = os.path.join(wd, "keep_dtype.cfg")
    with open(keep_file, "w", encoding="utf-8") as f:
        f.write("\n".join(names) + "\n")
    return keep_file


def _extra_argv(extra_args: Sequence[str], ours: set[str], precision_mode: str | None,
                values: Mapping[str, Any]) -> list[str]:
    """The user's extra ATC flags, checked against the ones npu-deploy sets and ATC's exclusions."""
    out = []
    for extra in extra_args:
        extra = str(extra)
        if not re.fullmatch(r"--[A-Za-z0-9_]+(=.*)?", extra, flags=re.S):
            raise InputError(f"extra ATC argument {extra!r} is not of the form --name=value",
                             hint="pass one ATC flag per --atc-arg, e.g. --atc-arg=--op_debug_level=1")
        name = _flag_name(extra)
        if name in ours:
            raise InputError(f"extra ATC argument {extra!r} repeats {name}, which npu-deploy sets",
                             hint="use the matching npu-deploy option instead")
        if name == "--precision_mode_v2" and precision_mode is not None:
            raise InputError("ATC rejects --precision_mode together with --precision_mode_v2",
                             hint="give only one of them")
        if name in ("--input_shape_range",) and any(values[g] for g in _GEAR_OPTIONS):
            raise InputError("ATC rejects --input_shape_range together with dynamic gears")
        out.append(extra)
    return out


# ---------------------------------------------------------------------------------------------
# Parsing ATC's error output

_CODE_LINE = re.compile(
    r"^\s*(?P<code>E[A-Z0-9]\d{4}|W\d{5}):\s*"
    r"(?:\[PID:\s*\d+\]\s*)?"
    r"(?:\d{4}-\d{2}-\d{2}-\d{2}:\d{2}:\d{2}\.\d{3}\.\d{3}\s*)?"
    r"(?P<msg>.*)$")
_LABELS = (("possible_cause", re.compile(r"^\s*Possible Cause:\s*(.*)$")),
           ("solution", re.compile(r"^\s*Solution:\s*(.*)$")),
           ("traceback", re.compile(r"^\s*TraceBack \(most recent call last\):\s*(.*)$")))

_OP = r"[^\[\],]*?"
_OP_PATTERNS = [
    re.compile(rf"No parser is registered for Op \[(?P<node>{_OP}), optype \[(?P<type>[^\]]*)\]\]"),
    re.compile(rf"No supported Ops kernel and engine are found for \[(?P<node>{_OP})\], "
               rf"optype \[(?P<type>[^\]]*)\]"),
    re.compile(r"Optype \[(?P<type>[^\]]*)\] of Ops kernel \[[^\]]*\] is unsupported"),
    re.compile(rf"IR for Op \[(?P<node>{_OP}), optype \[(?P<type>[^\]]*)\]\],? is not registered"),
    re.compile(r"IR for Op (?P<node>\S+) with optype (?P<type>\S+?) is not registered"),
    re.compile(r"No operator plugin is registered for Op: (?P<node>[^,]+), optype: (?P<type>[^.\s]+)"),
    re.compile(r"Failed to compile Op (?P<node>\S+?)\. oppath is .*? and optype is (?P<type>[^.\s]+)"),
    re.compile(r"No Caffe parser is registered for Op (?P<node>\S+) with Op type (?P<type>[^.\s]+)"),
    re.compile(r"Op name (?P<node>\S+) specified in --"),
    re.compile(r"\bOp \[(?P<node>[^\]]+)\]"),
]

HINTS: dict[str, str] = {
    "E19010": "ATC has no parser for this ONNX op at this opset: re-export the model with a lower "
              "opset (11-18 depending on the CANN version) or register a custom op plugin",
    "EZ9010": "ATC has no parser for this ONNX op at this opset: re-export the model with a lower "
              "opset (11-18 depending on the CANN version) or register a custom op plugin",
    "E13010": "no operator plugin for this op: re-export with a lower opset or add a custom op plugin",
    "EZ3002": "the op's kernel does not support this format/dtype on this SoC: check --soc, keep "
              "the op in fp32 (--keep-dtype) or replace the op",
    "EZ3003": "the op is not supported on this SoC: check --soc, install the ops package that "
              "matches the target, or replace the op",
    "EZ0501": "the op's IR is not registered: check the installed opp package (ASCEND_OPP_PATH)",
    "E10501": "the op's IR is not registered: check the installed opp package (ASCEND_OPP_PATH)",
    "E10016": "an input name given to ATC is not in the model: use the ONNX graph input names "
              "in --input-shape",
    "E10001": "an option value is invalid: check the values passed to ATC",
    "E10002": "--input_shape is malformed: use name:d1,d2;name2:d1,d2",
    "E10003": "an option value is invalid: check the values passed to ATC",
    "E10004": "a required ATC option is empty",
    "E10007": "--framework is missing or invalid (npu-deploy passes 5 for ONNX)",
    "E10010": "--log has an invalid value: use debug, info, warning, error or null",
    "E10054": "a required value is empty or was split at ';' (npu-deploy never uses a shell: check "
              "--atc-arg values)",
    "E40021": "ATC failed to compile an operator: see the ATC log, try --keep-dtype for that op",
    "E40000": "ATC's Python environment is broken: put CANN's Python first on PATH and pip install "
              "decorator attrs absl-py psutil protobuf sympy",
    "EC0010": "ATC's Python environment is missing a module: pip install decorator attrs absl-py "
              "psutil protobuf sympy",
    "E13023": "the model is too large for one .om: reduce the model or use external weights",
    "E19999": "ATC hit an internal error: see the ATC log",
}


def _op_of(message: str) -> tuple[str | None, str | None, int | None]:
    for pat in _OP_PATTERNS:
        m = pat.search(message)
        if m:
            gd = m.groupdict()
            node = (gd.get("node") or "").strip() or None
            op_type = (gd.get("type") or "").strip() or None
            opset = None
            if op_type:
                # ONNX op types appear as "ai.onnx::23::Div"
                parts = op_type.split("::")
                if len(parts) == 3 and parts[1].isdigit():
                    op_type, opset = parts[2], int(parts[1])
            return node, op_type, opset
    return None, None, None


def parse_atc_errors(text: str) -> list[dict[str, Any]]:
    """The ErrorManager blocks in ATC output, in order.

    >>> out = '''ATC run failed, Please check the detail log, Try 'atc --help' for more information
    ... E19010: [PID: 7] 2025-03-18-09:02:18.501.341 No parser is registered for Op [/m/Div, optype [ai.onnx::23::Div]].
    ...         Possible Cause: the op is not supported.
    ...         Solution: lower the opset.
    ...         TraceBack (most recent call last):
    ...         parse failed'''
    >>> [(d["code"], d["node"], d["op_type"], d["opset"], d["solution"]) for d in parse_atc_errors(out)]
    [('E19010', '/m/Div', 'Div', 23, 'lower the opset.')]
    """
    blocks: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    field = "message"
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _CODE_LINE.match(line)
        if m:
            current = {"code": m.group("code"), "message": m.group("msg").strip(),
                       "possible_cause": "", "solution": "", "traceback": []}
            blocks.append(current)
            field = "message"
            continue
        if current is None or not line.strip():
            continue
        for name, pat in _LABELS:
            lm = pat.match(line)
            if lm:
                field = name
                if name == "traceback":
                    if lm.group(1):
                        current["traceback"].append(lm.group(1))
                else:
                    current[name] = lm.group(1).strip()
                break
        else:
            if not raw[:1].isspace():
                current = None  # an unindented line ends the block
                continue
            if field == "traceback":
                current["traceback"].append(line.strip())
            else:
                current[field] = (current[field] + " " + line.strip()).strip()
    for b in blocks:
        b["node"], b["op_type"], b["opset"] = _op_of(b["message"])
    return blocks


# ---------------------------------------------------------------------------------------------
# Running ATC

@dataclasses.dataclass
class AtcResult(Result):
    """A successful ATC run: the ``.om`` written, how long it took, what ATC printed."""

    SCHEMA: ClassVar[str] = "npu-deploy/atc-run"
    SCHEMA_VERSION: ClassVar[int] = 1

    argv: list[str]
    returncode: int
    elapsed_s: float
    om_path: str
    output: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    log_path: str | None = None

    def __bool__(self) -> bool:
        return self.returncode == 0

    def verdict(self) -> str:
        warn = f", {len(self.warnings)} warning(s)" if self.warnings else ""
        return f"ATC wrote {self.om_path} in {self.elapsed_s:.1f} s{warn}"


def _output_of(argv: Sequence[str]) -> str | None:
    for a in argv[1:]:
        if a.startswith("--output="):
            return a.split("=", 1)[1]
    return None


def _model_of(argv: Sequence[str]) -> str:
    for a in argv[1:]:
        if a.startswith("--model="):
            return a.split("=", 1)[1]
    return "the model"


def _find_om(output: str) -> str | None:
    exact = output + ".om"
    if os.path.isfile(exact):
        return exact
    # ATC may write <output>_<os>_<arch>.om (§1.2 --output)
    cands = sorted(p for p in glob.glob(glob.escape(output) + "*.om") if os.path.isfile(p))
    return cands[0] if cands else None


def _find_log(log_dir: str, pid: int) -> str | None:
    hits = sorted(glob.glob(os.path.join(glob.escape(log_dir), "**", f"plog-{pid}_*.log"),
                            recursive=True))
    if hits:
        # the run log always holds ATC's errors; the debug log exists only with --log != null
        run = [h for h in hits if f"{os.sep}run{os.sep}" in h]
        return (run or hits)[0]
    return log_dir if os.path.isdir(log_dir) and any(os.scandir(log_dir)) else None


def _terminate_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _reader(stream, q: "queue.Queue[str | None]") -> None:
    buf = b""
    try:
        while True:
            try:
                chunk = os.read(stream.fileno(), 65536)
            except (OSError, ValueError):  # the pipe was closed under us after a kill
                break
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                q.put(line.decode("utf-8", "replace").rstrip("\r"))
    finally:
        if buf:
            q.put(buf.decode("utf-8", "replace").rstrip("\r"))
        q.put(None)


def run_atc(argv: Sequence[str], *, timeout: float | None = None,
            on_line: Callable[[str, float], None] | None = None,
            on_tick: Callable[[float], None] | None = None,
            env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
            log_dir: str | os.PathLike | None = None) -> AtcResult:
    """Run ATC (``argv`` from :func:`build_atc_argv`) and return its result or raise AtcError.

    ``env`` replaces the inherited environment (``os.environ`` by default).
    ``ASCEND_PROCESS_LOG_PATH`` is pointed at ``log_dir`` (default: the user's own
    ``ASCEND_PROCESS_LOG_PATH``, else a new temp dir, kept after a failure for the user to read
    and removed after a success) so this run's plog can be found and reported as ``log_path``.
    """
    argv = [os.fspath(a) for a in argv]
    if not argv:
        raise InputError("empty ATC command line")
    output = _output_of(argv)
    if output is None:
        raise InputError("ATC command line has no --output=", hint="build it with build_atc_argv")
    # ATC writes into a private folder next to the destination (same basename, so the model name
    # in the .om header is the user's); the .om is moved into place only once it checks out.
    out_dir = os.path.dirname(output) or "."
    try:
        stage = tempfile.mkdtemp(prefix=".atc-", dir=out_dir)
    except OSError as e:
        raise InputError(f"cannot write into {out_dir}: {e.strerror}",
                         hint="choose another output folder") from None
    try:
        staged = os.path.join(stage, os.path.basename(output))
        run_argv = [a if not a.startswith("--output=") else f"--output={staged}" for a in argv]
        return _run_staged(argv, run_argv, output, staged, timeout=timeout, on_line=on_line,
                           on_tick=on_tick, env=env, cwd=cwd, log_dir=log_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _run_staged(argv: list[str], run_argv: list[str], output: str, staged: str, *,
                timeout: float | None, on_line, on_tick, env, cwd, log_dir) -> AtcResult:
    model = _model_of(argv)
    full_env = dict(os.environ if env is None else env)
    own_log_dir = False
    if log_dir is not None:
        log_root = os.fspath(log_dir)
    elif full_env.get("ASCEND_PROCESS_LOG_PATH"):
        log_root = full_env["ASCEND_PROCESS_LOG_PATH"]      # the user chose where logs go
    else:
        log_root = tempfile.mkdtemp(prefix="atc-log-")     # kept on failure: the error points here
        own_log_dir = True
    os.makedirs(log_root, exist_ok=True)
    full_env["ASCEND_PROCESS_LOG_PATH"] = log_root
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(run_argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=full_env, cwd=cwd,
                                start_new_session=True)
    except FileNotFoundError:
        raise DependencyError(f"ATC executable {argv[0]} not found",
                              hint="install CANN and source set_env.sh, or pass --atc PATH") from None
    except PermissionError:
        raise DependencyError(f"ATC executable {argv[0]} is not executable",
                              hint="check the file permissions") from None
    q: "queue.Queue[str | None]" = queue.Queue()
    th = threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True)
    th.start()
    lines: list[str] = []
    exited_at: float | None = None
    deadline = None if timeout is None else t0 + timeout
    try:
        while True:
            wait = 1.0
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            try:
                item = q.get(timeout=wait)
            except queue.Empty:
                item = ""
                if deadline is not None and time.monotonic() >= deadline:
                    _terminate_group(proc)
                    th.join(timeout=2)
                    while True:  # lines ATC wrote before it was stopped
                        try:
                            rest = q.get_nowait()
                        except queue.Empty:
                            break
                        if rest is not None:
                            lines.append(rest)
                    tail = next((ln for ln in reversed(lines) if ln.strip()), "")
                    raise AtcError(
                        f"ATC did not finish within {timeout:g} s converting {model}; stopped it"
                        + (f" (last output: {tail[:120]!r})" if tail else ""),
                        returncode=None, log_path=_find_log(log_root, proc.pid),
                        hint="raise --timeout, or look at the ATC log")
                if proc.poll() is not None:
                    exited_at = exited_at or time.monotonic()
                    if time.monotonic() - exited_at > 2.0:
                        break  # ATC exited; a leftover child still holds the pipe open
                if on_tick is not None:
                    on_tick(time.monotonic() - t0)
                continue
            if item is None:
                break
            lines.append(item)
            if on_line is not None:
                on_line(item, time.monotonic() - t0)
        remaining = None if deadline is None else max(0.1, deadline - time.monotonic())
        try:
            rc = proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            _terminate_group(proc)
            raise AtcError(f"ATC did not finish within {timeout:g} s converting {model}; stopped it",
                           log_path=_find_log(log_root, proc.pid),
                           hint="raise --timeout, or look at the ATC log") from None
    except BaseException:
        if proc.poll() is None:
            _terminate_group(proc)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    elapsed = time.monotonic() - t0
    text = "\n".join(lines)
    blocks = parse_atc_errors(text)
    log_path = _find_log(log_root, proc.pid)
    if rc != 0:
        raise _failure(rc, model, blocks, lines, log_path)
    warnings = sorted({b["code"] for b in blocks if b["code"].startswith("W")})
    om = _find_om(staged)
    if om is None:
        raise AtcError(f"ATC exited 0 but wrote no {output}.om for {model}",
                       returncode=rc, log_path=log_path,
                       hint="check the output folder is writable and see the ATC output")
    final = os.path.join(os.path.dirname(output) or ".", os.path.basename(om))
    with open(om, "rb") as f:
        magic = f.read(4)
    if magic != OM_MAGIC:
        raise AtcError(f"ATC exited 0 but {final} does not start with the .om magic IMOD "
                       f"(found {magic!r}); nothing was written",
                       returncode=rc, log_path=log_path,
                       hint="the file is not an ATC offline model; re-run ATC")
    os.replace(om, final)
    if own_log_dir:  # a temp log folder nobody asked for: drop it once ATC has succeeded
        shutil.rmtree(log_root, ignore_errors=True)
        log_path = None
    return AtcResult(argv=argv, returncode=rc, elapsed_s=elapsed, om_path=final, output=lines,
                     warnings=warnings, log_path=log_path)


def _failure(rc: int, model: str, blocks: list[dict], lines: list[str],
             log_path: str | None) -> AtcError:
    errors = [b for b in blocks if b["code"].startswith("E")]
    codes = list(dict.fromkeys(b["code"] for b in errors))
    details = [{k: b[k] for k in ("code", "message", "possible_cause", "solution", "traceback",
                                  "node", "op_type", "opset")} for b in errors]
    if rc == 127:
        first = next((ln for ln in lines if "error while loading shared libraries" in ln), None)
        return AtcError(f"ATC could not start (exit 127): {first or 'a shared library is missing'}",
                        codes=codes, details=details, log_path=log_path, returncode=rc,
                        hint="source /usr/local/Ascend/ascend-toolkit/set_env.sh so the CANN and "
                             "driver libraries are on LD_LIBRARY_PATH")
    if not errors:
        tail = next((ln for ln in reversed(lines) if ln.strip()), "no output")
        return AtcError(f"ATC failed (exit {rc}) converting {model}: {tail[:200]}", codes=[],
                        details=[], log_path=log_path, returncode=rc,
                        hint="run again with --debug and look at the ATC log"
                             + (f" in {log_path}" if log_path else ""))
    main = errors[0]
    where = ""
    if main["node"] or main["op_type"]:
        bits = []
        if main["node"]:
            bits.append(f"node {main['node']!r}")
        if main["op_type"]:
            bits.append(f"op {main['op_type']}" + (f" (opset {main['opset']})" if main["opset"] else ""))
        where = " at " + ", ".join(bits)
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    msg = f"ATC failed (exit {rc}) converting {model}{where}: {main['code']}: {main['message']}{more}"
    hint = HINTS.get(main["code"])
    if hint is None:
        hint = main["solution"] or "see the ATC log"
    if log_path:
        hint += f"; ATC log: {log_path}"
    return AtcError(msg, codes=codes, details=details, log_path=log_path, returncode=rc, hint=hint)


def console_progress(stream=None, *, verbose: bool = False, every_s: float = 10.0
                     ) -> tuple[Callable[[str, float], None], Callable[[float], None]]:
    """``(on_line, on_tick)`` callbacks for :func:`run_atc` that print ATC's progress with the
    elapsed time to ``stream`` (stderr by default): every line when ``verbose``, else ATC's
    protocol lines and error codes, plus a "still running" line every ``every_s`` seconds.

    >>> import io
    >>> buf = io.StringIO()
    >>> on_line, on_tick = console_progress(buf)
    >>> on_line("ATC run success, welcome to the next use.", 12.34); on_tick(25.0)
    >>> print(buf.getvalue(), end="")
    atc [  12.3 s] ATC run success, welcome to the next use.
    atc [  25.0 s] still running…
    """
    import sys

    out = stream if stream is not None else sys.stderr
    last = [0.0]

    def emit(text: str, elapsed: float) -> None:
        out.write(f"atc [{elapsed:6.1f} s] {text}\n")
        out.flush()
        last[0] = elapsed

    def on_line(line: str, elapsed: float) -> None:
        if verbose or line.startswith("ATC ") or _CODE_LINE.match(line):
            emit(line.strip(), elapsed)

    def on_tick(elapsed: float) -> None:
        if elapsed - last[0] >= every_s:
            emit("still running…", elapsed)

    return on_line, on_tick


def atc_convert(model: str | os.PathLike, output: str | os.PathLike, *, soc: str,
                atc: str | os.PathLike | None = None, timeout: float | None = None,
                on_line: Callable[[str, float], None] | None = None,
                on_tick: Callable[[float], None] | None = None,
                log_dir: str | os.PathLike | None = None, **build_kwargs: Any) -> AtcResult:
    """Find ATC, build the command line, run it: the whole ``convert(backend="atc")`` path.

    ``build_kwargs`` are :func:`build_atc_argv`'s keyword options (``input_shapes``,
    ``precision_mode``, ``extra_args``…). Raises DependencyError when ATC is missing.
    """
    exe = require_atc(atc)
    workdir = _new_workdir()
    try:
        argv = build_atc_argv(model, output, soc=soc, atc=exe, workdir=workdir, **build_kwargs)
        return run_atc(argv, timeout=timeout, on_line=on_line, on_tick=on_tick, log_dir=log_dir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Shape ranges: the spelling depends on the installed ATC

#: since CANN 8.5 ranges go inside ``--input_shape`` (``x:1~4,3,224,224``); ``--input_shape_range``
#: (``x:[1~4,3,224,224]``) is deprecated there, and the only spelling older ATC understands
RANGE_IN_INPUT_SHAPE = (8, 5)


def installed_version(atc: str | os.PathLike) -> tuple[int, ...] | None:
    """The CANN version of an ATC install, from ``compiler/version.info`` (``Version=8.5.0``) beside
    ``compiler/bin/atc`` (the path as given, then with links resolved), else under
    ``$ASCEND_TOOLKIT_HOME``; None when no such file says."""
    exe = Path(os.fspath(atc))
    places = [exe.parent.parent / "version.info", exe.resolve().parent.parent / "version.info"]
    home = os.environ.get("ASCEND_TOOLKIT_HOME")
    if home:
        places.append(Path(home) / "compiler" / "version.info")
    for f in places:
        try:
            text = f.read_text(errors="replace")[:4096]
        except OSError:
            continue
        m = re.search(r"^\s*Version\s*=\s*(\d+)\.(\d+)", text, flags=re.M | re.I)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def shape_range_argv(argv: list[str], shape_ranges: Mapping[str, Sequence[Any]] | None,
                     gears: Sequence[str] = ()) -> list[str]:
    """``argv`` with ``shape_ranges`` (``{input: per-dim (low, high) or None}``) written the way the
    installed ATC (``argv[0]``) expects: ``~`` inside ``--input_shape`` from CANN 8.5 on, else ``-1``
    there plus ``--input_shape_range`` (also when the version cannot be read: every ATC with ranges
    still accepts that spelling).

    >>> shape_range_argv(["/nowhere/atc", "--input_shape=x:4,3,8,8"], {"x": ((1, 4), None, None, None)})
    ['/nowhere/atc', '--input_shape=x:-1,3,8,8', '--input_shape_range=x:[1~4,3,8,8]']
    """
    if not shape_ranges:
        return argv
    if gears:
        raise InputError(f"ATC rejects shape ranges together with dynamic gears ({', '.join(gears)})",
                         hint="give ranges or gears, not both")
    k = next((i for i, a in enumerate(argv) if a.startswith("--input_shape=")), None)
    if k is None:
        raise InputError("shape ranges need the input shapes (--input-shape)")
    shapes: dict[str, list[str]] = {}
    for item in argv[k].partition("=")[2].split(";"):
        name, _, dims = item.rpartition(":")
        shapes[name] = dims.split(",") if dims else []
    ranged: dict[str, list[str]] = {}
    for name, rng in shape_ranges.items():
        if name not in shapes:
            raise InputError(f"shape range for {name!r}, which has no --input-shape entry")
        dims = shapes[name]
        ranged[name] = [f"{r[0]}~{r[1]}" if r else d for d, r in zip(dims, rng)]
        shapes[name] = ["-1" if r else d for d, r in zip(dims, rng)]
    version = installed_version(argv[0])
    out = list(argv)
    if version is not None and version >= RANGE_IN_INPUT_SHAPE:
        shapes.update(ranged)
        out[k] = "--input_shape=" + ";".join(f"{n}:{','.join(d)}" for n, d in shapes.items())
        return out
    out[k] = "--input_shape=" + ";".join(f"{n}:{','.join(d)}" for n, d in shapes.items())
    out.insert(k + 1, "--input_shape_range=" + ";".join(f"{n}:[{','.join(d)}]" for n, d in ranged.items()))
    return out
