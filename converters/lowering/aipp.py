"""AIPP (``atc --insert_op_conf=FILE``): parse, validate, write, and apply it in the built-in lowering.

An AIPP config is a prototxt of one or more ``aipp_op { ... }`` blocks (GE's ``AippOpParams``; facts in
``shared/reference/ascend-rewrites.md`` §2). :func:`parse_config` reads it and checks every field
against :data:`FIELDS` (one registry: type and range per field) and the cross-field constraints
(formats, crop/pad at most once, even offsets and sizes for YUV420SP, crop inside the source image);
an error names the file, the line and the field.

The built-in lowering applies a static config as an ONNX preprocessing subgraph prepended to the model
(:func:`prepend`): the model input becomes the raw uint8 image, NHWC as the camera gives it
(``[N, H, W, 3]`` for RGB888_U8, ``[N, H * 3 / 2, W, 1]`` for YUV420SP_U8 (NV12), ``[N, H, W, 1]`` for
YUV400_U8), and the steps run in the hardware's order: channel swap -> crop -> CSC -> resize ->
normalise -> padding (resize: bilinear with half-pixel centres, a model of the hardware's filter, whose
exact coefficients and rounding are not documented). :func:`reference_feeds` computes
the same in numpy, independently, for the original model: what ``compare`` feeds onnxruntime.

>>> [cfg] = parse_text('aipp_op {\\n aipp_mode: static\\n input_format: RGB888_U8\\n'
...                  ' src_image_size_w: 4\\n src_image_size_h: 2\\n min_chn_0: 1.5\\n}\\n')
>>> cfg.input_format, cfg.src_image_size_w, cfg.min_chn_0
('RGB888_U8', 4, 1.5)
>>> parse_text('aipp_op {\\n input_format: RGB888_U8\\n mean_chn_9: 1\\n}\\n', "a.cfg")
Traceback (most recent call last):
...
npu_deploy.errors.InputError: a.cfg:3: mean_chn_9: unknown AIPP field (known fields: aipp_mode, related_input_rank, ...) (check the spelling against the AIPP reference)
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from npu_deploy import _io
from npu_deploy.errors import InputError, ModelError

INPUT_FORMATS = {"YUV420SP_U8": 1, "XRGB8888_U8": 2, "RGB888_U8": 3, "YUV400_U8": 4, "NC1HWC0DI_FP16": 5,
                 "NC1HWC0DI_S8": 6, "ARGB8888_U8": 7, "YUYV_U8": 8, "YUV422SP_U8": 9, "AYUV444_U8": 10,
                 "RAW10": 11, "RAW12": 12, "RAW16": 13, "RAW24": 14, "RGB16": 15, "RGB20": 16, "RGB24": 17,
                 "RGB8_IR": 18, "RGB16_IR": 19, "RGB24_IR": 20}
BUILTIN_FORMATS = ("RGB888_U8", "YUV420SP_U8", "YUV400_U8")   # what the built-in subgraph implements
MAX_SIZE = 4096
# BT.601 video range YUV -> RGB (values scaled by 256), the documented default
YUV2RGB_601 = {"matrix": [[298, 516, 0], [298, -100, -208], [298, 0, 409]], "input_bias": [16, 128, 128],
               "output_bias": [0, 0, 0]}


@dataclasses.dataclass(frozen=True)
class Field:
    type: type              # int, float, bool, or str (an enum: ``choices``)
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    default: Any = None


FIELDS: dict[str, Field] = {
    "aipp_mode": Field(str, choices=("static", "dynamic"), default="static"),
    "related_input_rank": Field(int, 0, 1024, default=0),
    "related_input_name": Field(str, default=""),
    "input_edge_idx": Field(int, 0, 1024, default=0),
    "max_src_image_size": Field(int, 0, 1 << 31, default=0),
    "support_rotation": Field(bool, default=False),
    "input_format": Field(str, choices=tuple(INPUT_FORMATS), default=None),
    "csc_switch": Field(bool, default=False),
    "rbuv_swap_switch": Field(bool, default=False),
    "ax_swap_switch": Field(bool, default=False),
    "single_line_mode": Field(bool, default=False),
    "src_image_size_w": Field(int, 0, MAX_SIZE, default=0),
    "src_image_size_h": Field(int, 0, MAX_SIZE, default=0),
    "crop": Field(bool, default=False),
    "load_start_pos_w": Field(int, 0, MAX_SIZE - 1, default=0),
    "load_start_pos_h": Field(int, 0, MAX_SIZE - 1, default=0),
    "crop_size_w": Field(int, 0, MAX_SIZE, default=0),
    "crop_size_h": Field(int, 0, MAX_SIZE, default=0),
    "resize": Field(bool, default=False),
    "resize_output_w": Field(int, 0, MAX_SIZE, default=0),
    "resize_output_h": Field(int, 0, MAX_SIZE, default=0),
    "padding": Field(bool, default=False),
    "left_padding_size": Field(int, 0, MAX_SIZE, default=0),
    "right_padding_size": Field(int, 0, MAX_SIZE, default=0),
    "top_padding_size": Field(int, 0, MAX_SIZE, default=0),
    "bottom_padding_size": Field(int, 0, MAX_SIZE, default=0),
    "padding_value": Field(float, -65504.0, 65504.0, default=0.0),   # the docs' name
    "cpadding_value": Field(float, -65504.0, 65504.0, default=None),  # the proto's name
    **{f"mean_chn_{k}": Field(int, 0, 255, default=0) for k in range(4)},
    **{f"min_chn_{k}": Field(float, -65504.0, 65504.0, default=0.0) for k in range(4)},
    **{f"var_reci_chn_{k}": Field(float, -65504.0, 65504.0, default=1.0) for k in range(4)},
    **{f"matrix_r{r}c{c}": Field(int, -32768, 32767, default=None) for r in range(3) for c in range(3)},
    **{f"output_bias_{k}": Field(int, 0, 255, default=None) for k in range(3)},
    **{f"input_bias_{k}": Field(int, 0, 255, default=None) for k in range(3)},
}


@dataclasses.dataclass
class AippConfig:
    """One ``aipp_op`` block, every field resolved to its value (defaults filled in). ``lines`` maps a
    field to the line it was given on (for messages); ``path`` is the file."""

    values: dict
    lines: dict = dataclasses.field(default_factory=dict)
    path: str = "<aipp>"

    def __getattr__(self, name: str) -> Any:
        if name in FIELDS:
            return self.values.get(name, FIELDS[name].default)
        raise AttributeError(name)

    def where(self, name: str) -> str:
        line = self.lines.get(name)
        return f"{self.path}:{line}: {name}" if line else f"{self.path}: {name}"

    def error(self, name: str, what: str, hint: str | None = None) -> InputError:
        return InputError(f"{self.where(name)}: {what}", hint=hint)

    # -------------------------------------------------------------------- derived
    def channels_in(self) -> int:
        return {"YUV400_U8": 1, "YUV420SP_U8": 3}.get(self.input_format, 3)

    def crop_box(self) -> tuple[int, int, int, int]:
        """(x, y, w, h) of the crop in the source image (the whole image without crop)."""
        w, h = self.src_image_size_w, self.src_image_size_h
        if not self.crop:
            return 0, 0, w, h
        return (self.load_start_pos_w, self.load_start_pos_h, self.crop_size_w or w - self.load_start_pos_w,
                self.crop_size_h or h - self.load_start_pos_h)

    def result_size(self) -> tuple[int, int]:
        """(W, H) of what AIPP hands the model: crop, resize, then padding."""
        _, _, w, h = self.crop_box()
        if self.resize:
            w, h = self.resize_output_w, self.resize_output_h
        if self.padding:
            w += self.left_padding_size + self.right_padding_size
            h += self.top_padding_size + self.bottom_padding_size
        return w, h

    def csc(self) -> dict | None:
        if not self.csc_switch:
            return None
        d = YUV2RGB_601
        return {"matrix": [[self.values.get(f"matrix_r{r}c{c}", d["matrix"][r][c]) for c in range(3)] for r in range(3)],
                "input_bias": [self.values.get(f"input_bias_{k}", d["input_bias"][k]) for k in range(3)],
                "output_bias": [self.values.get(f"output_bias_{k}", d["output_bias"][k]) for k in range(3)]}

    def pad_value(self) -> float:
        v = self.values.get("padding_value", self.values.get("cpadding_value"))
        return 0.0 if v is None else float(v)

    def to_manifest(self) -> dict:
        """What the bundle manifest's ``aipp`` key records: every field given, plus the derived raw
        input layout and result size (enough for :func:`reference_feeds`)."""
        w, h = self.result_size()
        return {"fields": dict(self.values), "source": self.path, "raw_layout": "NHWC",
                "result_size": [w, h]}

    def to_text(self) -> str:
        """The config as prototxt (one ``aipp_op`` block)."""
        lines = ["aipp_op {"]
        for name in FIELDS:
            if name in self.values:
                v = self.values[name]
                text = ("true" if v else "false") if isinstance(v, bool) else \
                    (f"{v:.7g}" if isinstance(v, float) else str(v))
                lines.append(f"    {name} : {text}")
        lines.append("}")
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ parsing
_TOKEN = re.compile(r'[ \t\r]*(?:(#[^\n]*)|([A-Za-z_][A-Za-z0-9_]*)|([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)|("[^"\n]*")|(\{|\}|:)|(\n))')
MAX_CONFIG_BYTES = 1 << 20


def parse_config(path: str | os.PathLike) -> list[AippConfig]:
    """Read and validate an AIPP config file (see :func:`parse_text`)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"AIPP config {p} does not exist", hint="give the file passed to ATC's --insert_op_conf")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise InputError(f"{p}: {p.stat().st_size} bytes is not an AIPP config (at most 1 MiB)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{p}: not UTF-8 text (byte {e.start})", hint="an AIPP config is a prototxt text file") from None
    return parse_text(text, str(p))


def _tokens(text: str, path: str):
    line, pos = 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            rest = text[pos:].lstrip(" \t\r")
            if not rest:
                return
            raise InputError(f"{path}:{line}: unexpected text {rest[:20]!r}",
                             hint="AIPP configs are prototxt: aipp_op { field: value ... }")
        pos = m.end()
        comment, word, number, string, punct, newline = m.groups()
        if newline:
            line += 1
        elif comment:
            continue
        else:
            yield line, word or number or string or punct


def parse_text(text: str, path: str = "<aipp>") -> list[AippConfig]:
    """Parse prototxt ``text`` into one :class:`AippConfig` per ``aipp_op`` block, validated."""
    toks = list(_tokens(text, path))
    configs, k = [], 0
    while k < len(toks):
        line, t = toks[k]
        if t != "aipp_op":
            raise InputError(f"{path}:{line}: expected 'aipp_op {{', found {t!r}")
        if k + 1 >= len(toks) or toks[k + 1][1] != "{":
            raise InputError(f"{path}:{line}: 'aipp_op' must be followed by '{{'")
        k += 2
        values, lines = {}, {}
        while True:
            if k >= len(toks):
                raise InputError(f"{path}:{line}: aipp_op block is not closed with '}}'")
            fline, name = toks[k]
            if name == "}":
                k += 1
                break
            if name not in FIELDS:
                if not re.match(r"^[A-Za-z_]", name):
                    raise InputError(f"{path}:{fline}: expected a field name, found {name!r}")
                raise InputError(f"{path}:{fline}: {name}: unknown AIPP field (known fields: "
                                 f"{', '.join(list(FIELDS)[:2])}, ...)",
                                 hint="check the spelling against the AIPP reference")
            if k + 2 >= len(toks) or toks[k + 1][1] != ":":
                raise InputError(f"{path}:{fline}: {name}: expected '{name} : value'")
            raw = toks[k + 2][1]
            if name in values:
                raise InputError(f"{path}:{fline}: {name}: given twice (first on line {lines[name]})")
            values[name] = _value(FIELDS[name], name, raw, f"{path}:{fline}")
            lines[name] = fline
            k += 3
        cfg = AippConfig(values, lines, path)
        validate(cfg)
        configs.append(cfg)
    if not configs:
        raise InputError(f"{path}: no aipp_op block", hint="an AIPP config holds one or more aipp_op { ... } blocks")
    ranks = [c.related_input_rank for c in configs]
    if len(set(ranks)) != len(ranks):
        raise InputError(f"{path}: two aipp_op blocks for input rank {ranks[0]}", hint="one block per model input")
    return configs


def _value(f: Field, name: str, raw: str, where: str) -> Any:
    def bad(what: str) -> InputError:
        return InputError(f"{where}: {name}: {what}")

    if f.type is bool:
        if raw in ("true", "1"):
            return True
        if raw in ("false", "0"):
            return False
        raise bad(f"{raw!r} is not a boolean (true/false)")
    if f.type is str:
        s = raw.strip('"')
        if f.choices and s not in f.choices:
            raise bad(f"{s!r} is not one of {', '.join(f.choices)}")
        return s
    try:
        v: Any = int(raw) if f.type is int else float(raw)
    except ValueError:
        raise bad(f"{raw!r} is not {'an integer' if f.type is int else 'a number'}") from None
    if f.type is float and not np.isfinite(v):
        raise bad(f"{raw} is not finite")
    if (f.lo is not None and v < f.lo) or (f.hi is not None and v > f.hi):
        raise bad(f"{raw} is outside {f.lo:g}..{f.hi:g}")
    return v


def validate(cfg: AippConfig) -> None:
    """The cross-field constraints of the reference (one clear error naming the field and line)."""
    v = cfg.values
    if "input_format" not in v:
        raise cfg.error("input_format", "missing: every aipp_op needs an input_format")
    fmt = cfg.input_format
    if cfg.aipp_mode == "static":
        for name in ("max_src_image_size", "support_rotation"):
            if name in v:
                raise cfg.error(name, "only applies to aipp_mode: dynamic")
    else:
        for name in v:
            if name not in ("aipp_mode", "related_input_rank", "related_input_name", "input_edge_idx",
                            "max_src_image_size", "support_rotation", "input_format"):
                raise cfg.error(name, "a dynamic AIPP config sets only the mode, input, format and "
                                      "max_src_image_size (the rest is given at run time)")
        if not cfg.max_src_image_size:
            raise cfg.error("max_src_image_size", "dynamic AIPP needs max_src_image_size > 0")
    yuv420 = fmt == "YUV420SP_U8"
    for name in ("src_image_size_w", "src_image_size_h"):
        if name in v and v[name] and yuv420 and v[name] % 2:
            raise cfg.error(name, f"{v[name]} must be even for YUV420SP_U8")
        if name in v and v[name] == 0 and cfg.aipp_mode == "static":
            pass  # 0: take the model input's size (ATC's rule)
    crop_fields = ("load_start_pos_w", "load_start_pos_h", "crop_size_w", "crop_size_h")
    for name in crop_fields:
        if name in v and not cfg.crop:
            raise cfg.error(name, "given without crop: true")
    for name in ("resize_output_w", "resize_output_h"):
        if name in v and not cfg.resize:
            raise cfg.error(name, "given without resize: true")
    for name in ("left_padding_size", "right_padding_size", "top_padding_size", "bottom_padding_size",
                 "padding_value", "cpadding_value"):
        if name in v and not cfg.padding:
            raise cfg.error(name, "given without padding: true")
    if "padding_value" in v and "cpadding_value" in v:
        raise cfg.error("cpadding_value", "given together with padding_value (the same field)")
    if cfg.crop:
        for name in crop_fields:
            if yuv420 and v.get(name, 0) % 2:
                raise cfg.error(name, f"{v[name]} must be even for YUV420SP_U8")
        for name in ("crop_size_w", "crop_size_h"):
            if name in v and v[name] < 1:
                raise cfg.error(name, "a crop size is 1..4096")
        for axis in ("w", "h"):
            src = v.get(f"src_image_size_{axis}", 0)
            start, size = v.get(f"load_start_pos_{axis}", 0), v.get(f"crop_size_{axis}", 0)
            if src and start + size > src:
                raise cfg.error(f"crop_size_{axis}", f"load_start_pos_{axis} {start} + crop_size_{axis} {size} "
                                f"exceeds src_image_size_{axis} {src}")
            if src and start >= src:
                raise cfg.error(f"load_start_pos_{axis}", f"{start} is outside the {src}-pixel source image")
    if cfg.resize:
        for name in ("resize_output_w", "resize_output_h"):
            if not v.get(name):
                raise cfg.error(name, "resize: true needs resize_output_w and resize_output_h (1..4096)")
    if cfg.ax_swap_switch and fmt not in ("XRGB8888_U8", "ARGB8888_U8", "AYUV444_U8"):
        raise cfg.error("ax_swap_switch", f"only applies to 4-channel formats (XRGB/ARGB/AYUV), not {fmt}")
    csc_given = [n for n in v if n.startswith(("matrix_", "input_bias_", "output_bias_"))]
    if csc_given and not cfg.csc_switch:
        raise cfg.error(csc_given[0], "colour conversion values given without csc_switch: true")
    if fmt == "YUV400_U8" and cfg.csc_switch:
        raise cfg.error("csc_switch", "YUV400_U8 is one channel: there is no colour conversion")


# ------------------------------------------------------------------------------------------ the built-in path
def check_builtin(cfg: AippConfig, model_shape: Sequence[int], input_name: str) -> None:
    """Refuse what the built-in subgraph does not implement, and a result size unequal to the model's."""
    if cfg.aipp_mode != "static":
        raise cfg.error("aipp_mode", "dynamic AIPP is not implemented by the built-in lowering",
                        hint="use aipp_mode: static, or --backend atc on a CANN host")
    if cfg.input_format not in BUILTIN_FORMATS:
        raise cfg.error("input_format", f"{cfg.input_format} is not implemented by the built-in lowering",
                        hint=f"use one of {', '.join(BUILTIN_FORMATS)}, or --backend atc on a CANN host")
    if cfg.input_format in ("RGB888_U8",) and cfg.csc_switch:
        raise cfg.error("csc_switch", "RGB -> YUV conversion is not implemented by the built-in lowering")
    if len(model_shape) != 4 or any(d < 1 for d in model_shape):
        raise ModelError(f"AIPP input {input_name!r} has shape {list(model_shape)}: AIPP needs a static 4-D NCHW "
                         f"input", hint=f"fix it with --input-shape \"{input_name}:1,3,H,W\"")
    _, c, h, w = model_shape
    out_c = 1 if cfg.input_format == "YUV400_U8" else 3
    if c != out_c:
        raise ModelError(f"{cfg.path}: input_format {cfg.input_format} gives {out_c} channel(s), model input "
                         f"{input_name!r} has {c}")
    if not cfg.src_image_size_w or not cfg.src_image_size_h:
        # ATC's rule: 0 (or absent) means the model input's size
        cfg.values.setdefault("src_image_size_w", w)
        cfg.values.setdefault("src_image_size_h", h)
        if not cfg.values["src_image_size_w"]:
            cfg.values["src_image_size_w"] = w
        if not cfg.values["src_image_size_h"]:
            cfg.values["src_image_size_h"] = h
        validate(cfg)
    rw, rh = cfg.result_size()
    if (rw, rh) != (w, h):
        raise cfg.error("crop_size_w" if cfg.crop else "src_image_size_w",
                        f"AIPP produces {rw}x{rh} (W x H) but the model input {input_name!r} is {w}x{h}",
                        hint="the size after crop and padding must equal the model input's H and W")


def raw_shape(cfg: AippConfig, batch: int = 1) -> tuple[int, ...]:
    """The raw uint8 image the host feeds (NHWC)."""
    w, h = cfg.src_image_size_w, cfg.src_image_size_h
    if cfg.input_format == "YUV420SP_U8":
        return batch, h * 3 // 2, w, 1
    return batch, h, w, cfg.channels_in() if cfg.input_format != "YUV400_U8" else 1


def prepend(model, cfg: AippConfig, input_name: str | None = None):
    """A new ONNX model: ``cfg``'s preprocessing subgraph in front of ``model``'s AIPP input (by
    ``related_input_name``, else ``related_input_rank``), which becomes the raw uint8 NHWC image."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    inits = {t.name for t in g.initializer}
    real = [i for i in g.input if i.name not in inits]
    name = input_name or cfg.related_input_name or None
    if name is None:
        if cfg.related_input_rank >= len(real):
            raise cfg.error("related_input_rank", f"the model has {len(real)} input(s)")
        vi = real[cfg.related_input_rank]
    else:
        found = [i for i in real if i.name == name]
        if not found:
            raise cfg.error("related_input_name", f"{name!r} is not an input of the model")
        vi = found[0]
    shape = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
    check_builtin(cfg, shape, vi.name)
    n, c, h, w = shape
    elem = vi.type.tensor_type.elem_type
    raw = f"{vi.name}"
    x = lambda s: f"aipp/{s}"  # noqa: E731 - a name helper
    nodes, consts = [], []

    def const(tag: str, value) -> str:
        t = numpy_helper.from_array(np.asarray(value), x("const/" + tag))
        consts.append(t)
        return t.name

    def node(op, ins, tag, **kw) -> str:
        nodes.append(helper.make_node(op, ins, [x(tag)], name=x(tag), **kw))
        return x(tag)

    cur = node("Cast", [raw], "float", to=TensorProto.FLOAT)
    sw, sh = cfg.src_image_size_w, cfg.src_image_size_h
    if cfg.input_format == "YUV420SP_U8":
        y = node("Slice", [cur, const("y_s", [0]), const("y_e", [sh]), const("y_a", [1])], "y")
        uv = node("Slice", [cur, const("uv_s", [sh]), const("uv_e", [sh * 3 // 2]), const("uv_a", [1])], "uv")
        uv = node("Reshape", [uv, const("uv_shape", [n, sh // 2, sw // 2, 2])], "uv_pairs")
        # each chroma pair covers 2x2 luma pixels
        uv = node("Resize", [uv, const("uv_roi", np.zeros(0, np.float32)), const("uv_scales", np.array([1, 2, 2, 1], np.float32))], "uv_full",
                  mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        cur = node("Concat", [y, uv], "yuv", axis=3)
    if cfg.rbuv_swap_switch and cfg.input_format != "YUV400_U8":
        order = [0, 2, 1] if cfg.input_format == "YUV420SP_U8" else [2, 1, 0]
        cur = node("Gather", [cur, const("swap", np.array(order, np.int64))], "swap", axis=3)
    if cfg.crop:
        cx, cy, cw, ch = cfg.crop_box()
        cur = node("Slice", [cur, const("crop_s", [cy, cx]), const("crop_e", [cy + ch, cx + cw]),
                             const("crop_a", [1, 2])], "crop")
    csc = cfg.csc()
    if csc is not None:
        m = np.array(csc["matrix"], np.float32)
        shifted = node("Sub", [cur, const("csc_in_bias", np.array(csc["input_bias"], np.float32))], "csc_in")
        mixed = node("MatMul", [shifted, const("csc_matrix", m.T.copy())], "csc_mix")
        scaled = node("Floor", [node("Div", [mixed, const("csc_256", np.float32(256))], "csc_div")], "csc_floor")
        biased = node("Add", [scaled, const("csc_out_bias", np.array(csc["output_bias"], np.float32))], "csc_out")
        cur = node("Clip", [biased, const("csc_lo", np.float32(0)), const("csc_hi", np.float32(255))], "csc")
    k = 1 if cfg.input_format == "YUV400_U8" else 3
    if cfg.resize:
        nchw = node("Transpose", [cur], "resize_nchw", perm=[0, 3, 1, 2])
        resized = node("Resize", [nchw, const("resize_roi", np.zeros(0, np.float32)),
                                  const("resize_scales", np.zeros(0, np.float32)),
                                  const("resize_sizes", np.array([n, k, cfg.resize_output_h, cfg.resize_output_w],
                                                                 np.int64))],
                       "resized", mode="linear", coordinate_transformation_mode="half_pixel")
        cur = node("Transpose", [resized], "resize_nhwc", perm=[0, 2, 3, 1])
    mean = np.array([cfg.values.get(f"mean_chn_{i}", 0) + cfg.values.get(f"min_chn_{i}", 0.0) for i in range(k)],
                    np.float32)
    reci = np.array([cfg.values.get(f"var_reci_chn_{i}", 1.0) for i in range(k)], np.float32)
    cur = node("Mul", [node("Sub", [cur, const("mean", mean)], "centred"), const("reci", reci)], "normalised")
    if cfg.padding:
        pads = [0, cfg.top_padding_size, cfg.left_padding_size, 0, 0, cfg.bottom_padding_size,
                cfg.right_padding_size, 0]
        cur = node("Pad", [cur, const("pads", np.array(pads, np.int64)), const("pad_value", np.float32(cfg.pad_value()))],
                   "padded", mode="constant")
    cur = node("Transpose", [cur], "nchw", perm=[0, 3, 1, 2])
    nodes.append(helper.make_node("Cast", [cur], [x("out")], name=x("out"), to=elem))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for nd in out.graph.node:
        for j, i in enumerate(nd.input):
            if i == vi.name:
                nd.input[j] = x("out")
    for o in out.graph.output:
        if o.name == vi.name:
            raise ModelError(f"AIPP input {vi.name!r} is also a model output")
    del out.graph.value_info[:]
    body = list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(nodes + body)
    out.graph.initializer.extend(consts)
    new_vi = helper.make_tensor_value_info(raw, TensorProto.UINT8, list(raw_shape(cfg, n)))
    for j, i in enumerate(out.graph.input):
        if i.name == vi.name:
            out.graph.input[j].CopyFrom(new_vi)
    ai = [o for o in out.opset_import if o.domain in ("", "ai.onnx")]
    if ai and ai[0].version < 11:
        raise ModelError(f"AIPP in the built-in path needs a model of opset >= 11 (this one: {ai[0].version})",
                         hint="re-export the model with opset 11 or newer")
    return out


# ------------------------------------------------------------------------------------------ reference
def _cfg_of(cfg_or_manifest) -> AippConfig:
    if isinstance(cfg_or_manifest, AippConfig):
        return cfg_or_manifest
    d = cfg_or_manifest.get("aipp", cfg_or_manifest) if isinstance(cfg_or_manifest, Mapping) else None
    if not isinstance(d, Mapping) or "fields" not in d:
        raise InputError("no AIPP record: give an AippConfig or a bundle manifest with an 'aipp' key")
    cfg = AippConfig(dict(d["fields"]), {}, str(d.get("source", "<manifest>")))
    validate(cfg)
    return cfg


def record_of(session) -> dict | None:
    """The AIPP record of an open bundle session (or backend, or manifest dict), None without AIPP:
    what ``compare`` checks before feeding the raw image to the bundle and
    :func:`reference_feeds` to onnxruntime."""
    if isinstance(session, Mapping):
        manifest = session
    else:
        backend = getattr(session, "backend", session)
        manifest = getattr(backend, "manifest", None)
    rec = manifest.get("aipp") if isinstance(manifest, Mapping) else None
    return rec if isinstance(rec, Mapping) else None


def reference_feeds(raw_feeds: Mapping[str, np.ndarray], cfg_or_manifest, input_name: str | None = None
                    ) -> dict[str, np.ndarray]:
    """The feeds for the *original* model equivalent to ``raw_feeds`` for the AIPP model: the raw uint8
    NHWC image through swap -> crop -> CSC -> normalise -> padding, computed in numpy (float32, NCHW).
    ``cfg_or_manifest``: an :class:`AippConfig`, a bundle manifest (its ``aipp`` key) or that record."""
    cfg = _cfg_of(cfg_or_manifest)
    rec = cfg_or_manifest.get("aipp", cfg_or_manifest) if isinstance(cfg_or_manifest, Mapping) else {}
    name = input_name or rec.get("input") or cfg.related_input_name or next(iter(raw_feeds))
    out = dict(raw_feeds)
    img = np.asarray(raw_feeds[name])
    if img.dtype != np.uint8:
        raise InputError(f"AIPP input {name!r} must be the raw uint8 image, got {img.dtype}")
    want = raw_shape(cfg, img.shape[0])
    if tuple(img.shape) != want:
        raise InputError(f"AIPP input {name!r} has shape {list(img.shape)}, the config expects {list(want)} (NHWC)")
    px = img.astype(np.float64)
    h = cfg.src_image_size_h
    if cfg.input_format == "YUV420SP_U8":
        y = px[:, :h, :, 0]
        uv = px[:, h:, :, 0].reshape(img.shape[0], h // 2, cfg.src_image_size_w // 2, 2)
        uv = uv.repeat(2, axis=1).repeat(2, axis=2)
        px = np.concatenate([y[..., None], uv], axis=3)
    if cfg.rbuv_swap_switch and cfg.input_format != "YUV400_U8":
        px = px[..., [0, 2, 1]] if cfg.input_format == "YUV420SP_U8" else px[..., ::-1]
    if cfg.crop:
        cx, cy, cw, ch = cfg.crop_box()
        px = px[:, cy:cy + ch, cx:cx + cw, :]
    csc = cfg.csc()
    if csc is not None:
        m = np.array(csc["matrix"], np.int64)
        centred = px.astype(np.int64) - np.array(csc["input_bias"], np.int64)
        mixed = np.einsum("nhwj,cj->nhwc", centred, m)
        px = np.clip((mixed >> 8) + np.array(csc["output_bias"], np.int64), 0, 255).astype(np.float64)
    if cfg.resize:
        px = _bilinear(px, cfg.resize_output_h, cfg.resize_output_w)
    k = px.shape[-1]
    for i in range(k):
        px[..., i] = (px[..., i] - cfg.values.get(f"mean_chn_{i}", 0) - cfg.values.get(f"min_chn_{i}", 0.0)) \
            * cfg.values.get(f"var_reci_chn_{i}", 1.0)
    if cfg.padding:
        px = np.pad(px, ((0, 0), (cfg.top_padding_size, cfg.bottom_padding_size),
                         (cfg.left_padding_size, cfg.right_padding_size), (0, 0)), constant_values=cfg.pad_value())
    out[name] = np.ascontiguousarray(px.transpose(0, 3, 1, 2)).astype(np.float32)
    return out


def _bilinear(px: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """Bilinear resize of NHWC ``px`` (half-pixel centres, edges clamped): the built-in path's model
    of the AIPP resize (the hardware's exact filter and rounding are not documented)."""
    def axis(n_in: int, n_out: int):
        c = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(c).astype(np.int64)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, c - lo

    y0, y1, fy = axis(px.shape[1], oh)
    x0, x1, fx = axis(px.shape[2], ow)
    top = px[:, y0][:, :, x0] * (1 - fx)[None, None, :, None] + px[:, y0][:, :, x1] * fx[None, None, :, None]
    bot = px[:, y1][:, :, x0] * (1 - fx)[None, None, :, None] + px[:, y1][:, :, x1] * fx[None, None, :, None]
    return top * (1 - fy)[None, :, None, None] + bot * fy[None, :, None, None]


# ------------------------------------------------------------------------------------------ writing
def from_flags(*, input_format: str, size: tuple[int, int], mean: Sequence[float] | None = None,
               std: Sequence[float] | None = None, crop: tuple[int, int, int, int] | None = None,
               src_size: tuple[int, int] | None = None, swap: bool = False, csc: bool | None = None,
               path: str = "<flags>") -> AippConfig:
    """A static config from the values users think in: ``mean``/``std`` per channel in pixel units
    (``out = (px - mean) / std``), the model's ``size`` (W, H), an optional ``crop`` (x, y, w, h) of a
    ``src_size`` (W, H) image. YUV420SP_U8 turns the BT.601 colour conversion on (unless ``csc=False``)."""
    if input_format not in INPUT_FORMATS:
        raise InputError(f"--input-format {input_format!r} is not an AIPP input format",
                         hint=f"use one of {', '.join(BUILTIN_FORMATS)}")
    k = 1 if input_format == "YUV400_U8" else 3
    v: dict[str, Any] = {"aipp_mode": "static", "input_format": input_format}
    w, h = size
    sw, sh = src_size or ((crop[0] + crop[2], crop[1] + crop[3]) if crop else (w, h))
    v["src_image_size_w"], v["src_image_size_h"] = int(sw), int(sh)
    if crop is not None:
        v.update(crop=True, load_start_pos_w=int(crop[0]), load_start_pos_h=int(crop[1]), crop_size_w=int(crop[2]),
                 crop_size_h=int(crop[3]))
    if csc if csc is not None else input_format == "YUV420SP_U8":
        v["csc_switch"] = True
        for r in range(3):
            for c in range(3):
                v[f"matrix_r{r}c{c}"] = YUV2RGB_601["matrix"][r][c]
        for i in range(3):
            v[f"input_bias_{i}"] = YUV2RGB_601["input_bias"][i]
            v[f"output_bias_{i}"] = YUV2RGB_601["output_bias"][i]
    if swap:
        v["rbuv_swap_switch"] = True
    for name, vals in (("--mean", mean), ("--std", std)):
        if vals is not None and len(vals) != k:
            raise InputError(f"{name} has {len(vals)} values; {input_format} has {k} channel(s)")
    for i in range(k):
        if mean is not None:
            v[f"min_chn_{i}"] = float(mean[i])
        if std is not None:
            if not std[i] > 0:
                raise InputError(f"--std value {std[i]} must be > 0")
            v[f"var_reci_chn_{i}"] = float(1.0 / std[i])
    cfg = AippConfig(v, {}, path)
    for name, val in v.items():
        _value(FIELDS[name], name, str(val).lower() if isinstance(val, bool) else repr(val) if isinstance(val, float)
               else str(val), path)
    validate(cfg)
    rw, rh = cfg.result_size()
    if (rw, rh) != (w, h):
        raise InputError(f"--crop gives {rw}x{rh}, --size is {w}x{h}", hint="the crop size must equal --size")
    return cfg


def write_config(path: str | os.PathLike, configs: Sequence[AippConfig]) -> None:
    """Write ``configs`` as one prototxt file (atomically)."""
    with _io.atomic_write(path, "w", encoding="utf-8") as f:
        f.write("# written by npu-deploy aipp\n")
        for c in configs:
            f.write(c.to_text())
