"""``npu-deploy layout``: describe and convert tensors between Ascend storage formats.

Thin over :mod:`npu_deploy.converters.formats`: parse options, call the API, print.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np

from npu_deploy._io import atomic_path, load_npy, refuse_overwriting
from npu_deploy.errors import FormatError, InputError

_NPY_MAGIC = b"\x93NUMPY"


def _shape(text: str | None, option: str = "--shape") -> tuple[int, ...] | None:
    if text is None:
        return None
    from npu_deploy.cli.options import parse_shape

    try:
        shape = parse_shape(text, option=option)
    except click.BadParameter as e:
        raise InputError(f"{option}: {e.message}", hint="example: --shape 1,3,224,224") from None
    if any(d < 0 for d in shape):
        raise InputError(f"{option} {text!r}: a layout needs concrete dimensions, not -1/?",
                         hint="give every dimension")
    return shape


def _common(f):
    f = click.option("--origin", default=None, metavar="LAYOUT",
                     help="Layout of the logical shape: NCHW, NHWC, HWCN, NCDHW, NDHWC, DHWCN or ND "
                          "(default: the format's own; NCHW for 4-D formats, ND for FRACTAL_NZ).")(f)
    f = click.option("--groups", type=click.IntRange(1, 65535), default=1, show_default=True,
                     help="Groups of a grouped convolution weight (FRACTAL_Z, FRACTAL_Z_3D).")(f)
    f = click.option("--c0", type=int, default=None,
                     help="Explicit C0 block (default: 32 for 1-byte types, 16 otherwise; fp32 may use 8).")(f)
    return f


@click.group("layout")
def command():
    """Describe and convert tensors between Ascend storage formats (ND, NCHW, NC1HWC0, FRACTAL_Z,
    FRACTAL_NZ, ...).

    \b
    Examples:
      npu-deploy layout info NC1HWC0 --shape 1,3,224,224 --dtype float16
      npu-deploy layout convert x.npy x_5hd.npy --from NCHW --to NC1HWC0
      npu-deploy layout convert dump.bin x.npy --from NC1HWC0 --to NCHW --shape 1,3,224,224 --dtype float16
      npu-deploy layout convert Conv2D.conv1.3.0.1682067845380164 y.npy --tensor output:0
    """


@command.command("info")
@click.argument("format_name", metavar="FORMAT")
@click.option("--shape", "shape_text", default=None, metavar="DIMS",
              help="Logical shape, e.g. 1,3,224,224 (in the --origin layout).")
@click.option("--dtype", "dtype_text", default="float16", show_default=True,
              help="Element type: float16, bfloat16, float32, int8, uint8, int32, ...")
@_common
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def info(format_name, shape_text, dtype_text, c0, groups, origin, as_json):
    """Storage shape, bytes, padding overhead and aclFormat value of a tensor in FORMAT.

    Without --shape, prints what the format is (enum values and pattern).
    """
    from npu_deploy.converters import formats

    if shape_text is None:
        word = formats.parse_format(format_name)
        f = word.format
        data = {"format": f.name, "ge_format": f.ge, "acl_format": f.acl, "packable": f.packable,
                "default_origin": f.default_origin if f.packable else None,
                "fixed_c0": f.c0, "patterns": {k: v.pattern for k, v in f.layouts.items()},
                "sub_format": word.sub_format, "c0_from_word": word.c0}
        if as_json:
            click.echo(json.dumps(data, indent=2))
        else:
            click.echo(f.describe())
            if not f.packable:
                click.echo(f"  cannot be laid out by npu-deploy: {f.note}")
        return
    shape = _shape(shape_text)
    result = formats.layout_info(format_name, shape, dtype_text, c0=c0, groups=groups, origin=origin)
    o = str(result.origin or "ND")
    if o != "ND" and o.isalpha() and len(shape) != len(o):  # padding [1,2] into NCHW would invent two axes
        raise InputError(f"{result.format}: shape {list(shape)} has rank {len(shape)}; origin {o} needs "
                         f"{len(o)} dims", hint=f"give a {len(o)}-D shape in {o} order")
    if as_json:
        click.echo(result.to_json())
        return
    acl = "none (ge-only)" if result.acl_format is None else str(result.acl_format)
    rows = [
        ("format", f"{result.format}  (aclFormat {acl}, ge::Format {result.ge_format})"),
        ("logical", f"{result.logical_shape} {result.dtype} (origin {result.origin})"),
        ("storage", f"{result.storage_shape}" + (f"  C0 = {result.c0}" if result.c0 else "")),
        ("bytes", f"{result.nbytes:,} (logical {result.logical_nbytes:,})"),
        ("padding", f"{100 * result.padding_overhead:+.1f} %"),
        ("format word", f"{result.format_word}"),
        ("pattern", result.pattern),
    ]
    for key, value in rows:
        click.echo(f"{key:<12} {value}")
    click.echo(result.verdict())


def _read_input(path: Path, dtype, shape_for_raw, expected_nbytes) -> np.ndarray:
    """Read IN: a .npy file (never pickled objects) or raw bytes whose size is checked first."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_NPY_MAGIC))
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}", hint="check the path and permissions") from None
    if path.suffix.lower() == ".npy" or head == _NPY_MAGIC:
        if head != _NPY_MAGIC:
            raise InputError(f"{path} is not a .npy file (no NUMPY header)",
                             hint="raw device dumps should be named .bin")
        arr = load_npy(path)
        if not isinstance(arr, np.ndarray):
            raise InputError(f"{path} does not hold a single array")
        if dtype is not None and arr.dtype != dtype:
            raise InputError(f"{path} holds {arr.dtype.name}, but --dtype says {dtype.name}",
                             hint="drop --dtype or give the file's dtype")
        return arr
    if dtype is None or shape_for_raw is None:
        raise InputError(f"{path} is a raw dump: --dtype and --shape are needed to read it",
                         hint="example: --shape 1,3,224,224 --dtype float16")
    size = path.stat().st_size
    if size != expected_nbytes:
        raise InputError(f"{path} is {size:,} bytes, but the {expected_nbytes:,} bytes expected for "
                         f"{list(shape_for_raw)} {dtype.name} do not match",
                         hint="check --shape, --dtype, --c0 and --from")
    try:
        return np.fromfile(path, dtype=dtype, count=expected_nbytes // dtype.itemsize)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e}") from None


def _write_output(path: Path, arr: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        if path.suffix.lower() == ".npy":
            with open(tmp, "wb") as fh:
                np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)
        else:
            with open(tmp, "wb") as fh:
                np.ascontiguousarray(arr).tofile(fh)


@command.command("convert")
@click.argument("in_path", metavar="IN", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("out_path", metavar="OUT", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--from", "src", default=None, metavar="FORMAT", help="Format of IN (e.g. NCHW, NC1HWC0).")
@click.option("--to", "dst", default=None, metavar="FORMAT", help="Format to write to OUT.")
@click.option("--shape", "shape_text", default=None, metavar="DIMS",
              help="Logical shape (needed to unpack a device format and to read a raw .bin).")
@click.option("--dtype", "dtype_text", default=None,
              help="Element type (needed for .bin input; must match a .npy input).")
@_common
@click.option("--from-c0", "src_c0", type=int, default=None,
              help="C0 of a raw .bin input in a device format (default: --c0 or the dtype's default).")
@click.option("--tensor", "tensor", default=None, metavar="input:N|output:N",
              help="IN is an ACL operator dump file: convert this tensor of it (its format, storage shape, "
                   "dtype and logical shape come from the dump; --to defaults to the logical layout).")
def convert(in_path, out_path, src, dst, shape_text, dtype_text, c0, groups, origin, src_c0, tensor):
    """Convert IN (.npy, a raw .bin device dump, or one tensor of an ACL operator dump file) from one
    format to another into OUT.

    OUT ending in .npy holds the array in its storage shape (NC1HWC0 gives a 5-D array), so
    numpy.load returns exactly the bytes a device would hold; any other OUT is written as raw bytes.
    """
    from npu_deploy.converters.files import dump
    from npu_deploy.converters import formats

    refuse_overwriting([("OUT", out_path)], [("input IN", in_path)])
    if tensor is not None or (src is None and in_path.is_file() and dump.looks_like_dump(in_path)):
        _convert_dump(in_path, out_path, tensor, dst, src, shape_text, dtype_text, c0, groups, origin)
        return
    if not src or not dst:
        raise InputError("layout convert needs --from and --to", hint="example: --from NCHW --to NC1HWC0")
    sf, df = formats.get_format(src), formats.get_format(dst)
    for f in (sf, df):
        if not f.packable:
            raise FormatError(f"{f.name} (ge {f.ge}) is known for decoding only; npu-deploy cannot lay it "
                              f"out: {f.note}", hint="use one of the formats `npu-deploy layout info` accepts")
    dtype = formats.normalize_dtype(dtype_text) if dtype_text else None
    shape = _shape(shape_text)
    if origin is None and any(f.plain and f.name != "ND" for f in (sf, df)):
        origin = formats.transdata_origin(sf, df)  # the labelled plain side (NCHW, NHWC, ...) says it
    # else (ND <-> a device format, or device <-> device) the rank picks the layout, as `layout info`
    # does: a 2-D ND matrix goes to FRACTAL_Z's 2-D (K, N) form, not to a conv weight [1, K, N, 1]
    # C0 of IN when it is a flat raw dump (a storage-shaped .npy carries its own C0)
    in_c0 = src_c0 if src_c0 is not None else (c0 if sf.blocked and not df.blocked else None)
    expected = None
    if dtype is not None and shape is not None:
        expected = formats.nbytes(sf, shape, dtype, c0=in_c0, groups=groups, origin=origin)
    arr = _read_input(in_path, dtype, shape, expected)
    if shape is None:
        if sf.blocked:
            raise InputError(f"--shape is needed to unpack {sf.name}: its padding hides the logical shape",
                             hint="give the logical shape, e.g. --shape 1,3,224,224")
        shape = _origin_shape(arr.shape, sf.name, origin)  # a plain IN: its own shape, reordered
    src_c0 = in_c0 if arr.ndim == 1 else src_c0
    try:
        logical = formats.unpack(arr, sf, shape, c0=src_c0, groups=groups, origin=origin)
        out = formats.pack(logical, df, c0=c0 if df.blocked else None, groups=groups, origin=origin)
    except FormatError as e:
        raise FormatError(f"{in_path}: {e.message}", hint=e.hint) from None
    _write_output(out_path, out)
    src_desc = f"raw dump, {arr.nbytes:,} bytes" if arr.ndim == 1 and in_path.suffix.lower() != ".npy" \
        else str(list(arr.shape))
    click.echo(f"{in_path} ({sf.name} {src_desc}) -> {out_path} ({df.name} {list(out.shape)} "
               f"{out.dtype.name}, {out.nbytes:,} bytes)")


def _convert_dump(in_path: Path, out_path: Path, tensor: str | None, dst: str | None, src: str | None,
                  shape_text: str | None, dtype_text: str | None, c0: int | None, groups: int,
                  origin: str | None) -> None:
    """One tensor of an operator dump -> its logical array (default) or ``dst``."""
    from npu_deploy.converters.files import dump
    from npu_deploy.converters import formats

    d = dump.read_dump(in_path)
    if tensor is None:
        have = f"{len(d.inputs)} input(s) and {len(d.outputs)} output(s)"
        raise InputError(f"{in_path} is an ACL operator dump ({have}): say which tensor to convert",
                         hint="add --tensor input:N or --tensor output:N")
    t = dump.pick_tensor(d, tensor)
    # what the dump says wins; a contradicting option is refused rather than silently ignored
    checks = [("--from", src, t.format, lambda v: formats.get_format(v).name),
              ("--dtype", dtype_text, t.dtype.name, lambda v: formats.normalize_dtype(v).name),
              ("--shape", shape_text, list(t.original_shape), lambda v: list(_shape(v)))]
    for option, given, actual, norm in checks:
        if given is not None and norm(given) != actual:
            raise InputError(f"{option} {given} contradicts {in_path} {tensor}: the dump says {actual}",
                             hint=f"drop {option}")
    layout = t.origin  # the logical array's layout (None: the format's default)
    if origin is not None and formats.origin_of(t.format, origin) != (layout or formats.origin_of(t.format)):
        raise InputError(f"--origin {origin} contradicts {in_path} {tensor}: the dump's logical layout is "
                         f"{layout or formats.origin_of(t.format)}", hint="drop --origin")
    try:
        logical = t.logical()
        if dst is None:
            out, df_name = logical, (layout or formats.origin_of(t.format))
        else:
            df = formats.get_format(dst)
            if not df.packable:
                raise FormatError(f"{df.name} (ge {df.ge}) is known for decoding only: {df.note}")
            if df.is_plain and (layout is None or formats.get_format(layout).name == df.name):
                out = logical
            else:
                out = formats.pack(logical, df, c0=c0 if df.blocked else None, groups=groups, origin=layout)
            df_name = df.name
    except FormatError as e:
        raise FormatError(f"{in_path} {tensor}: {e.message}", hint=e.hint) from None
    _write_output(out_path, out)
    click.echo(f"{in_path} ({tensor}: {t.format} {list(t.shape)} {t.dtype.name}) -> {out_path} ({df_name} "
               f"{list(out.shape)} {out.dtype.name}, {out.nbytes:,} bytes)")


def _origin_shape(physical: tuple[int, ...], fmt_name: str, origin: str | None) -> tuple[int, ...]:
    """The logical shape, in ``origin`` order, of a plain tensor stored as ``fmt_name``."""
    if origin is None or origin == fmt_name or len(physical) != len(fmt_name):
        return tuple(physical)
    if len(origin) != len(fmt_name) or sorted(origin) != sorted(fmt_name):
        return tuple(physical)
    dims = dict(zip(fmt_name, physical))
    return tuple(dims[a] for a in origin)
