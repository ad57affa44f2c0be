"""Pack and unpack as ONNX subgraphs, derived from the format registry.

The same pattern interpreter that ``formats.pack`` runs in numpy (pad each left-hand group to its
block product, split, permute, merge) is spelled here as ONNX nodes: ``Pad`` → ``Reshape`` →
``Transpose`` → ``Reshape`` per stage (the last ``Reshape`` left out where the permuted shape already is the storage shape), after the rank expansion and the axis permutation of the
entry's layout; unpack is the exact inverse (``Reshape`` → ``Transpose`` → ``Reshape`` → ``Slice``).
Nothing here knows a format by name: a format the registry can lay out is lowered the same way
(diagonal patterns, C1HWNCoC0's, are refused). The emulator uses it to run a plan's TransData and
device-format tensors inside onnxruntime; ``tests/converters/formats/test_format_graph.py`` checks every
subgraph against ``formats.pack``/``unpack`` byte for byte.

>>> import numpy as np, onnx
>>> nodes, inits = pack_nodes("NC1HWC0", (1, 3, 2, 2), "float32", "x", "y", prefix="p")
>>> [n.op_type for n in nodes]
['Pad', 'Reshape', 'Transpose']
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npu_deploy.converters import formats
from npu_deploy.errors import FormatError

_counter = itertools.count()

# Plain layouts that are the ONNX tensor's own axis order (converting between them moves no byte).
IDENTITY_PLAIN = frozenset({"ND", "NCHW", "NCDHW", "NC", "NCL"})


def norm_format(fmt: Any) -> str:
    f = str(fmt or "ND").upper()
    return f[7:] if f.startswith("FORMAT_") else f


def is_identity(fmt: Any) -> bool:
    """A plain layout in the ONNX tensor's own axis order."""
    return norm_format(fmt) in IDENTITY_PLAIN


def is_plain(fmt: Any) -> bool:
    """The one "plain?" predicate: a row-major layout with no blocking or padding, as the format
    registry says (``Format.is_plain``: ND, NCHW, NHWC, HWCN, NCDHW, NDHWC, NC, CN, NCL...). A name the
    registry does not know is not plain.

    >>> is_plain("NHWC"), is_plain("nchw"), is_plain("NC1HWC0"), is_plain("FRACTAL_Z"), is_plain("NOPE")
    (True, True, False, False, False)
    """
    return _is_plain(norm_format(fmt))


@functools.lru_cache(maxsize=512)
def _is_plain(name: str) -> bool:
    try:
        return bool(formats.get_format(name).is_plain)
    except Exception:  # an unknown format name
        return False


def same_format(a: Any, b: Any, *, nd_matches_plain: bool = False) -> bool:
    """The one "same layout?" predicate: two format names that lay a tensor's bytes out the same way,
    so converting between them moves no byte. Names compare after :func:`norm_format` (case, a
    ``FORMAT_`` prefix, None as ND).

    * Equal names, or both plain layouts in the ONNX tensor's own axis order (:data:`IDENTITY_PLAIN`:
      ND, NCHW, NCDHW, NC, NCL all equal, whatever the rank). A channels-last layout (NHWC) is not the
      same as NCHW or ND: converting costs a transpose. This is the rule of the plan (planner passes,
      the plan record's contract, fusion, the emulator's buffers, ``against``).
    * ``nd_matches_plain``: ND also matches every plain layout (:func:`is_plain`: NHWC, HWCN...). That
      is the host/device boundary of a bundle's inputs and outputs: a side declared ND takes the
      array's bytes as the other side lays them out (the emulator's transfers).

    >>> same_format("NCHW", "ND"), same_format("NHWC", "NCHW"), same_format("FORMAT_NC1HWC0", "nc1hwc0")
    (True, False, True)
    >>> same_format("NHWC", "ND"), same_format("NHWC", "ND", nd_matches_plain=True)
    (False, True)
    """
    a, b = norm_format(a), norm_format(b)
    if a == b or (a in IDENTITY_PLAIN and b in IDENTITY_PLAIN):
        return True
    return nd_matches_plain and ((a == "ND" and is_plain(b)) or (b == "ND" and is_plain(a)))


def axis_perm(src: str, dst: str) -> tuple[int, ...]:
    """The one host/graph axis permutation: axis ``k`` of the data laid out as ``dst`` is axis ``perm[k]``
    of the same data laid out as ``src`` (plain layouts spelled with the same letters), so
    ``array_in_src.transpose(perm)`` is the array in ``dst``.

    >>> axis_perm("NHWC", "NCHW"), axis_perm("NCHW", "NHWC"), axis_perm("NDHWC", "NCDHW")
    ((0, 3, 1, 2), (0, 2, 3, 1), (0, 4, 1, 2, 3))
    """
    if sorted(src) != sorted(dst) or len(set(src)) != len(src):
        raise FormatError(f"{src} and {dst} are not two orders of the same axes")
    return tuple(src.index(a) for a in dst)


class _Builder:
    def __init__(self, prefix: str, opset: int = 17):
        self.prefix = prefix
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0

    def name(self, what: str) -> str:
        self.k += 1
        return f"{self.prefix}/{what}_{self.k}"

    def const(self, values: Sequence[int]) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(values, np.int64).reshape(-1), name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(op_type), **attrs))
        return out

    def reshape(self, x: str, cur: tuple[int, ...], shape: tuple[int, ...]) -> str:
        if tuple(cur) == tuple(shape):
            return x
        return self.op("Reshape", [x, self.const(shape)])

    def pad_end(self, x: str, rank: int, ends: Sequence[int]) -> str:
        pads = [0] * rank + list(ends)
        if self.opset < 11:  # Pad took its pads as an attribute before opset 11
            return self.op("Pad", [x], mode="constant", pads=pads)
        return self.op("Pad", [x, self.const(pads)], mode="constant")

    def slice(self, x: str, axes: Sequence[int], ends: Sequence[int]) -> str:
        starts = [0] * len(axes)
        if self.opset < 10:  # Slice took attributes before opset 10
            return self.op("Slice", [x], starts=starts, ends=list(ends), axes=list(axes))
        return self.op("Slice", [x, self.const(starts), self.const(ends), self.const(axes)])

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        if tuple(perm) == tuple(range(len(perm))):
            return x
        return self.op("Transpose", [x], perm=list(perm))


def format_plan(fmt: Any, shape: Sequence[int], dtype: Any, *, c0: int | None = None, groups: int = 1,
                origin: str | None = None):
    """The format core's resolved plan for one tensor (raises ``FormatError`` like ``pack`` would)."""
    p = formats._plan(fmt, shape, dtype, c0, groups, origin)
    if p.layout.has_diagonal:
        raise FormatError(f"{p.fmt.name}: diagonal layouts cannot be lowered to ONNX")
    return p


def _stage_orders(sp) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(elementary lhs shape, permutation lhs -> rhs, elementary rhs shape) without the batch."""
    st = sp.stage
    nb = len(sp.batch)
    lhs_axes = st.lhs_axes
    elem = tuple(s for sizes in sp.lhs_sizes for s in sizes)
    perm = tuple(nb + lhs_axes.index(a) for a in st.rhs_axes)
    return elem, perm, tuple(elem[p - nb] for p in perm)


def pack_nodes(fmt: Any, shape: Sequence[int], dtype: Any, src: str, dst: str, *, c0: int | None = None,
               groups: int = 1, origin: str | None = None, prefix: str | None = None, opset: int = 17
               ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes (and their int64 shape constants) computing ``dst = pack(src, fmt)`` for a logical
    tensor of ``shape``; zero padding, as ``formats.pack``. ``src`` must already have the storage
    dtype (a Cast, if any, is the caller's)."""
    p = format_plan(fmt, shape, dtype, c0=c0, groups=groups, origin=origin)
    b = _Builder(prefix or f"pack{next(_counter)}", opset)
    cur = tuple(p.shape)
    x = b.reshape(src, cur, p.expanded)
    x = b.transpose(x, p.perm)
    cur = tuple(p.letter_shape)
    for sp in p.stages:
        nb = len(sp.batch)
        padded = tuple(math.prod(s) for s in sp.lhs_sizes)
        if padded != tuple(sp.lengths):
            x = b.pad_end(x, len(cur), [0] * nb + [t - n for t, n in zip(padded, sp.lengths)])
        elem, perm, rhs_elem = _stage_orders(sp)
        x = b.reshape(x, tuple(sp.batch) + padded, tuple(sp.batch) + elem)
        x = b.transpose(x, tuple(range(nb)) + perm)
        x = b.reshape(x, tuple(sp.batch) + rhs_elem, tuple(sp.out_shape))
        cur = tuple(sp.out_shape)
    _finish(b, x, dst)
    return b.nodes, b.inits


def unpack_nodes(fmt: Any, shape: Sequence[int], dtype: Any, src: str, dst: str, *, c0: int | None = None,
               groups: int = 1, origin: str | None = None, prefix: str | None = None, opset: int = 17
               ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing ``dst = unpack(src, fmt, shape)`` (``src`` has the storage shape)."""
    p = format_plan(fmt, shape, dtype, c0=c0, groups=groups, origin=origin)
    b = _Builder(prefix or f"unpack{next(_counter)}", opset)
    x = src
    for sp in reversed(p.stages):
        nb = len(sp.batch)
        padded = tuple(math.prod(s) for s in sp.lhs_sizes)
        elem, perm, rhs_elem = _stage_orders(sp)
        x = b.reshape(x, tuple(sp.out_shape), tuple(sp.batch) + rhs_elem)
        full = tuple(range(nb)) + perm
        inverse = tuple(int(i) for i in np.argsort(full))
        x = b.transpose(x, inverse)
        x = b.reshape(x, tuple(sp.batch) + elem, tuple(sp.batch) + padded)
        if padded != tuple(sp.lengths):
            axes = [nb + i for i, (t, n) in enumerate(zip(padded, sp.lengths)) if t != n]
            ends = [sp.lengths[a - nb] for a in axes]
            x = b.slice(x, axes, ends)
    inverse = tuple(int(i) for i in np.argsort(p.perm))
    x = b.transpose(x, inverse)
    x = b.reshape(x, tuple(p.expanded), tuple(p.shape))
    _finish(b, x, dst)
    return b.nodes, b.inits


def reinterpret_nodes(src: str, src_storage: Sequence[int], dst_storage: Sequence[int], dst: str, *,
                      prefix: str | None = None, opset: int = 17) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Read a buffer of ``src_storage`` elements as one of ``dst_storage``: what a device op does
    when it is handed a buffer in another format than it expects. The bytes are taken in order;
    a shorter buffer is padded with zeros, a longer one cut. (Never right: it makes a wrong plan
    give wrong numbers instead of a crash.)"""
    b = _Builder(prefix or f"reinterpret{next(_counter)}", opset)
    n_src, n_dst = math.prod(src_storage), math.prod(dst_storage)
    x = b.reshape(src, tuple(src_storage), (n_src,))
    if n_dst > n_src:
        x = b.pad_end(x, 1, [n_dst - n_src])
    elif n_dst < n_src:
        x = b.slice(x, [0], [n_dst])
    x = b.reshape(x, (n_dst,), tuple(dst_storage))
    _finish(b, x, dst)
    return b.nodes, b.inits


def _finish(b: _Builder, x: str, dst: str) -> None:
    if b.nodes and b.nodes[-1].output[0] == x:
        b.nodes[-1].output[0] = dst
    else:
        b.op("Identity", [x], dst)
