"""The installed op info of a CANN host: per CANN op, the (dtype, format) columns its AI Core kernel takes.

On a CANN host each SoC has a folder of op-info JSON files (``ge-format-selection.md`` §6,
``onnx-op-support.md`` §2):

* ``<opp>/built-in/op_impl/ai_core/tbe/config/<soc>/aic-<soc>-ops-info.json`` — the legacy TBE ops;
* ``aic-<soc>-ops-info-*.json`` beside it — generated from the AscendC ``OpDef`` classes
  (``hicann/ops-nn:cmake/gen_ops_info.cmake``); the same keys;
* ``<opp>/op_impl/built-in/ai_core/tbe/config/<soc>/`` in the 2022 layout.

``<opp>`` is ``ASCEND_OPP_PATH`` (set by CANN's ``set_env.sh``) or what ``--op-info DIR`` names; ``DIR``
may also be the ``config`` folder or one ``<soc>`` folder. ``<soc>`` is the SoC family in lower case
(``ascend310p``, ``ascend910b``, ``ascend910_93``, ...). These files are Huawei's (proprietary): the
toolkit reads them from the user's install and never ships them; its tests use a stand-in written
from the documented keys.

Keys read, per op (the object keyed by the CANN op type):

* ``input<i>`` / ``output<i>``: ``name``, ``paramType`` (required / optional / dynamic), ``dtype`` and
  ``format`` — comma-separated lists of equal length; column ``j`` is the pair (``dtype[j]``,
  ``format[j]``), one way the kernel can be called;
* ``dynamicFormat.flag`` (also ``op.dynamicFormat``): the columns are chosen at compile time by the
  op's Python ``op_select_format``, so the file's lists do not bound them;
* ``heavyOp.flag``, ``op.pattern`` (formatAgnostic / broadcast / reduce), ``opFile.value``,
  ``dynamicShapeSupport.flag``, ``precision_reduce.flag`` — read and kept (:class:`OpEntry`) for
  reports.

How the planner uses it (:func:`excluded`): a node's CANN op with static columns narrows the formats
the planner may give it — a blocked format its input-0 columns do not list for the node's dtype is not
taken (the node stays in ND, a Conv's NC1HWC0_C04 falls back to NC1HWC0). The ``heavyOp`` flag of
the MatMul family (:func:`heavy`) replaces the built-in per-SoC trait (``ops.SOC_TRAITS``) where the
file has it. Without op info (no
``ASCEND_OPP_PATH``, no ``--op-info``) the planner uses the built-in table alone, and bundles are
byte-identical to before. What the columns do *not* do yet: widen a format the built-in table does not
plan for an op (a new kind of kernel layout needs its planner rule), and choose the engine (AI CPU).

Bad files are an :class:`~npu_deploy.errors.InputError` (exit 2) naming the file and key.

>>> import json, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp()) / "ascend310p"
>>> d.mkdir()
>>> _ = (d / "aic-ascend310p-ops-info.json").write_text(json.dumps({"Relu": {
...     "input0": {"name": "x", "dtype": "float16,float", "format": "ND,ND", "paramType": "required"},
...     "output0": {"name": "y", "dtype": "float16,float", "format": "ND,ND", "paramType": "required"},
...     "opFile": {"value": "relu"}}}))
>>> info = load_op_info(d.parent, "Ascend310P3")
>>> info.entry("Relu").formats_for(0, "float16")
frozenset({'ND'})
>>> excluded(info, "Relu", 4, "float16", "NC1HWC0")
'installed op info: Relu input0 (x) lists ND for float16, not NC1HWC0 (aic-ascend310p-ops-info.json)'
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Mapping

from npu_deploy.converters.lowering import ops
from npu_deploy.errors import InputError

ENV = "ASCEND_OPP_PATH"
# where the per-SoC folders are under an opp root: the current layout first, then the 2022 one
_LAYOUTS = ("built-in/op_impl/ai_core/tbe/config", "op_impl/built-in/ai_core/tbe/config",
            "op_impl/ai_core/tbe/config", "ai_core/tbe/config", "tbe/config", "config", ".")
# op-info dtype spellings of numpy dtype names (``float`` is float32 in op info)
OPINFO_DTYPE = {"float32": "float", "float64": "double", "float16": "float16", "bfloat16": "bfloat16",
                "int8": "int8", "uint8": "uint8", "int16": "int16", "uint16": "uint16", "int32": "int32",
                "uint32": "uint32", "int64": "int64", "uint64": "uint64", "bool": "bool",
                "complex64": "complex64", "complex128": "complex128"}
# formats an op-info column may name that are the planner's plain layouts (row-major, no padding)
PLAIN_FORMATS = frozenset({"ND", "NCHW", "NHWC", "NCDHW", "NDHWC", "NCL", "NC", "HWCN", "CHWN"})
_SLOT = re.compile(r"^(input|output)(\d+)$")


@dataclasses.dataclass(frozen=True)
class TensorColumns:
    """One ``input<i>`` / ``output<i>`` of an op-info entry: its columns (dtype, format) in order."""

    name: str
    param_type: str
    dtypes: tuple[str, ...]
    formats: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class OpEntry:
    """One CANN op's op info (see the module docstring for the keys)."""

    op_type: str
    source: str                                   # the file it was read from
    inputs: Mapping[int, TensorColumns]
    outputs: Mapping[int, TensorColumns]
    dynamic_format: bool = False
    heavy: bool | None = None
    pattern: str | None = None
    op_file: str | None = None
    dynamic_shape: bool | None = None
    precision_reduce: bool | None = None

    def formats_for(self, slot: int, dtype: str) -> frozenset[str] | None:
        """The formats input ``slot`` takes for ``dtype`` (a numpy name or the op-info spelling); None
        when the file does not bound them (``dynamicFormat``, no such input, or the dtype not listed —
        an engine question, not a format one)."""
        t = self.inputs.get(slot)
        if self.dynamic_format or t is None:
            return None
        want = OPINFO_DTYPE.get(str(dtype), str(dtype))
        out = frozenset(f for d, f in zip(t.dtypes, t.formats) if d == want)
        return out or None


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """The op info of one SoC: ``entries`` by CANN op type, read from ``files`` in ``folder``."""

    soc: str
    folder: Path
    files: tuple[Path, ...]
    entries: Mapping[str, OpEntry]

    def entry(self, cann_op: str) -> OpEntry | None:
        return self.entries.get(cann_op)

    def describe(self) -> str:
        return (f"installed op info for {self.soc}: {len(self.entries)} ops from {len(self.files)} file(s) "
                f"in {self.folder}")


def soc_folder(soc: str) -> str:
    """The op-info folder name of a SoC: its family in lower case (``Ascend910B3`` -> ``ascend910b``)."""
    fam = ops.soc_family(soc)
    return (fam or str(soc)).lower()


def find_folder(root: str | os.PathLike, soc: str) -> tuple[Path | None, list[Path]]:
    """The ``<soc>`` folder under ``root`` (see the module docstring for the layouts tried), and the
    config folders seen (to say which SoCs are there when this one is not)."""
    name = soc_folder(soc)
    root = Path(root)
    if _holds(root, f"aic-{name}-ops-info*.json"):
        return root, [root.parent]
    seen = []
    for sub in _LAYOUTS:
        cfg = root / sub
        if not cfg.is_dir():
            continue
        if (cfg / name).is_dir():
            return cfg / name, [cfg]
        if any(_holds(p, "aic-*-ops-info*.json") for p in _subdirs(cfg)):
            seen.append(cfg)
    return None, seen


def _subdirs(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:   # unreadable: nothing found there
        return []


def _holds(folder: Path, pattern: str) -> bool:
    try:
        return folder.is_dir() and any(folder.glob(pattern))
    except OSError:
        return False


def load_op_info(root: str | os.PathLike, soc: str) -> OpInfo | None:
    """Read the op info of ``soc`` under ``root``; None when ``root`` has op info for other SoCs but
    not this one (:func:`resolve` says so in a note). Raises ``InputError`` when ``root`` holds no op
    info at all or a file is bad."""
    folder, seen = find_folder(root, soc)
    if folder is None:
        if seen:
            return None
        raise InputError(f"op info {root}: no aic-<soc>-ops-info.json under it (looked in "
                         f"{', '.join(_LAYOUTS[:2])}, or the folder itself)",
                         hint="give the opp folder of a CANN install (e.g. $ASCEND_HOME/opp) or its "
                              "op_impl/ai_core/tbe/config folder")
    name = soc_folder(soc)
    main = folder / f"aic-{name}-ops-info.json"
    files = sorted(folder.glob(f"aic-{name}-ops-info*.json"), key=lambda p: (p != main, p.name))
    if not files:
        raise InputError(f"op info {folder}: no aic-{name}-ops-info*.json in the {name} folder",
                         hint="check the CANN install (opp/built-in/op_impl/ai_core/tbe/config)")
    entries: dict[str, OpEntry] = {}
    for f in files:
        for op, e in _read_file(f).items():
            entries.setdefault(op, e)   # the main file first; an OpDef file does not override it
    return OpInfo(soc=str(soc), folder=folder, files=tuple(files), entries=entries)


def resolve(op_info_dir: str | os.PathLike | None, soc: str,
            env: Mapping[str, str] | None = None) -> tuple[OpInfo | None, list[str]]:
    """The op info planning uses for ``soc``: ``op_info_dir`` if given, else ``$ASCEND_OPP_PATH``, else
    none (the built-in table). Returns it with the notes a plan shows (which files, or why none)."""
    env = os.environ if env is None else env
    root = op_info_dir if op_info_dir not in (None, "") else env.get(ENV) or None
    if root is None:
        return None, []
    where = "--op-info" if op_info_dir not in (None, "") else f"${ENV}"
    if not Path(root).exists():
        if where == "--op-info":
            raise InputError(f"--op-info {root}: no such folder",
                             hint="give the opp folder of a CANN install, or leave --op-info out")
        return None, [f"${ENV}={root} does not exist: the built-in op table is used"]
    folder, seen = find_folder(root, soc)
    if folder is None and not seen and where != "--op-info":
        return None, [f"${ENV}={root} holds no aic-<soc>-ops-info.json: the built-in op table is used"]
    info = load_op_info(root, soc)
    if info is None:
        there = sorted({p.name for cfg in seen for p in _subdirs(cfg) if _holds(p, "aic-*-ops-info*.json")})
        return None, [f"op info ({where} {root}) has no folder for {soc_folder(soc)} (found: "
                      f"{', '.join(there) or 'none'}): the built-in op table is used for {soc}"]
    return info, [f"{info.describe()} ({where}): its static format columns narrow the planner's choices"]


def cann_candidates(onnx_op: str, rank: int) -> tuple[str, ...]:
    """The CANN op names an ONNX op may appear under in op info: the ``.om`` name, the parser's."""
    names = [ops.cann_op(onnx_op, rank), ops.parser_op(onnx_op), onnx_op]
    return tuple(dict.fromkeys(n for n in names if n))


def excluded(info: OpInfo | None, onnx_op: str, rank: int, dtype: str, fmt: str) -> str | None:
    """Why the installed op info rules out ``fmt`` for an ``onnx_op`` node of input rank ``rank`` and
    device dtype ``dtype`` (None: it does not, or there is no op info / no static column for it)."""
    if info is None:
        return None
    for name in cann_candidates(onnx_op, rank):
        e = info.entry(name)
        if e is None:
            continue
        allowed = e.formats_for(0, dtype)
        if allowed is None:
            return None
        if fmt in allowed or (fmt in PLAIN_FORMATS and allowed & PLAIN_FORMATS):
            return None
        t = e.inputs[0]
        return (f"installed op info: {name} input0 ({t.name}) lists {', '.join(sorted(allowed))} for "
                f"{dtype}, not {fmt} ({Path(e.source).name})")
    return None


def heavy(info: OpInfo | None, onnx_op: str, rank: int = 4) -> bool | None:
    """The installed ``heavyOp`` flag of an ONNX op's CANN op (None: no op info, no entry or no flag:
    the built-in table's ``SOC_TRAITS`` decides)."""
    if info is None:
        return None
    for name in cann_candidates(onnx_op, rank):
        e = info.entry(name)
        if e is not None:
            return e.heavy
    return None


def fallback(info: OpInfo | None, onnx_op: str, rank: int, dtype: str, fmt: str) -> str:
    """The format to take instead of an :func:`excluded` one: NC1HWC0 for NC1HWC0_C04 when listed,
    else the plain layout (ND)."""
    if fmt == "NC1HWC0_C04" and excluded(info, onnx_op, rank, dtype, "NC1HWC0") is None:
        return "NC1HWC0"
    return "ND"


# -- parsing ---------------------------------------------------------------------------------------

def _bad(path: Path, key: str, what: str) -> InputError:
    return InputError(f"op info {path}: {key}: {what}",
                      hint="the file is not in the aic-<soc>-ops-info.json layout; reinstall the CANN "
                           "opp package or leave --op-info / ASCEND_OPP_PATH out to use the built-in table")


def _read_file(path: Path) -> dict[str, OpEntry]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise _bad(path, "(file)", f"cannot be read as UTF-8 text ({e.__class__.__name__})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _bad(path, f"line {e.lineno}", f"not JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise _bad(path, "(top level)", f"an object of ops expected, got {type(data).__name__}")
    return {str(op): _entry(path, str(op), v) for op, v in data.items()}


def _flag(path: Path, key: str, v) -> bool | None:
    if v is None:
        return None
    if isinstance(v, dict):
        v = v.get("flag", v.get("value"))
    s = str(v).strip().lower()
    if s in ("true", "1"):
        return True
    if s in ("false", "0", ""):
        return False
    raise _bad(path, key, f"flag {v!r} is not true/false")


def _list(path: Path, key: str, v) -> tuple[str, ...]:
    if isinstance(v, str):
        return tuple(x.strip() for x in v.split(",") if x.strip())
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return tuple(x.strip() for x in v)
    raise _bad(path, key, f"a comma-separated string expected, got {type(v).__name__}")


def _entry(path: Path, op: str, v) -> OpEntry:
    if not isinstance(v, dict):
        raise _bad(path, op, f"an object expected, got {type(v).__name__}")
    slots: dict[str, dict[int, TensorColumns]] = {"input": {}, "output": {}}
    for key, val in v.items():
        m = _SLOT.match(str(key))
        if not m:
            continue
        k = f"{op}.{key}"
        if not isinstance(val, dict):
            raise _bad(path, k, f"an object expected, got {type(val).__name__}")
        dtypes = _list(path, f"{k}.dtype", val.get("dtype", ""))
        formats = _list(path, f"{k}.format", val.get("format", ""))
        if formats and len(formats) != len(dtypes):
            raise _bad(path, f"{k}.format", f"{len(formats)} formats for {len(dtypes)} dtypes (each column "
                                            f"is one dtype,format pair)")
        if not formats:
            formats = ("ND",) * len(dtypes)
        slots[m.group(1)][int(m.group(2))] = TensorColumns(
            str(val.get("name", key)), str(val.get("paramType", "required")), dtypes, formats)
    opsec = v.get("op") if isinstance(v.get("op"), dict) else {}
    dyn = _flag(path, f"{op}.dynamicFormat", v.get("dynamicFormat", opsec.get("dynamicFormat")))
    of = v.get("opFile")
    return OpEntry(
        op_type=op, source=str(path), inputs=slots["input"], outputs=slots["output"],
        dynamic_format=bool(dyn),
        heavy=_flag(path, f"{op}.heavyOp", v.get("heavyOp")),
        pattern=(str(opsec["pattern"]) if "pattern" in opsec else None),
        op_file=(str(of.get("value")) if isinstance(of, dict) else None if of is None else str(of)),
        dynamic_shape=_flag(path, f"{op}.dynamicShapeSupport", v.get("dynamicShapeSupport")),
        precision_reduce=_flag(path, f"{op}.precision_reduce", v.get("precision_reduce")))
