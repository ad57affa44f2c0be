"""The cost model against the device: price measured ops, compare, and fit a SoC profile to captures.

Input is any sequence of measured-op records with the attributes of
:class:`npu_deploy.profiling.ops.MeasuredOp` (``name, type, engine, in_shapes, out_shapes, in_dtypes,
out_dtypes, in_formats, out_formats, duration_us, capture``); this module does not read files (the
``cost`` CLI reads captures with ``profiling.ops`` and hands the records here).

How a measured op is priced (:func:`features`): shapes are the device's storage shapes (NC1HWC0 5-D,
FRACTAL_Z 4-D), so bytes are what the kernel really moves and cube work includes C0/16 padding.

* ``TransData``: ``launch(engine) + (src + dst bytes) / (bandwidth * transdata_eff(pair, dtype))``.
* Conv2D / Conv2DBackpropInput / Conv2DBackpropFilter: MACs = elements of the activation gradient or
  output (per padded output channel) × elements of the weight; cube roofline at ``cube_eff(dtype)``.
* MatMul family: ``2·M·N·K`` (K found from the operand that carries M), cube roofline; on the memory
  side an operand stored transposed (x·Wᵀ's weight as (N, K); a square one told by ``Linear``'s bias)
  reads at ``transposed_read_efficiency`` of the plain rate, the result is written at
  ``cube_write_efficiency`` of HBM peak (:func:`_matmul_work`).
* FlashAttentionScore / FlashAttentionScoreGrad: the cube FLOPs of QK^T and PV (the grad: five
  products) and the softmax's vector operations, from q/k/v, the softmax statistics and the mask
  (:func:`_attention_work`), at one fitted efficiency of the fused kernel; plus what the row shows per
  score — a full 4-D mask read for every head, a dropout bit mask — streamed before it is applied.
* Vector ops of a known kind (elementwise, reductions, pooling, norms, data movement, optimizer
  updates, TopK as a sort): vector roofline on bytes moved and operations per element; in-place
  optimizer updates also write back their state, the MaxPool grad reads the mask its forward wrote, a
  gather reads the rows it selects (not its whole table) and the embedding grad writes the rows its
  indices select (aclnnEmbeddingDenseBackward zeroes the table with a ZerosLike first).
* Write-only kernels (ZerosLike, OnesLike, Fill, MemSet): bytes written at ``fill_efficiency``; a MemSet
  whose size the capture does not record: a fixed cost. DSA bit-mask generation: bytes at the DSA rate.
  ``AI_CPU`` ops: AI CPU launch + bytes at its bandwidth.
* Anything else, or an op without shapes: **not priced** (``predicted_us`` None, counted with its share).
* A measurement faster than any physical rate moves the op's bytes — what the part's L2 cannot hold,
  at HBM peak x :data:`PLAUSIBLE_RATE_MARGIN` — is **implausible** (:func:`implausible`; the row's
  shapes are not what the kernel wrote): kept, with ``excluded`` saying why and ``predicted_us`` None,
  counted with its share, and left out of the totals, the FormatTrans shares, the errors and the fit.

:func:`fit` fits a few physically bounded parameters (launch per engine, TransData efficiency per
format pair and dtype, cube efficiency per dtype, vector and bandwidth efficiency, AI CPU) by robust
least squares on log time (``scipy.optimize.least_squares``, ``soft_l1`` loss, so outliers weigh less),
started from the base profile and from a few seeded points inside the bounds (the max() of the roofline
gives the loss local minima); the best end point is kept, the same one every run.
"""

from __future__ import annotations

import dataclasses
import html
import math
import statistics
from collections import defaultdict
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from npu_deploy._result import Result
from npu_deploy.converters.lowering import cost as C
from npu_deploy.errors import DependencyError, InputError

_ITEMSIZE = {"FLOAT": 4, "FLOAT32": 4, "FLOAT16": 2, "HALF": 2, "BF16": 2, "BFLOAT16": 2, "INT64": 8,
             "UINT64": 8, "INT32": 4, "UINT32": 4, "INT16": 2, "UINT16": 2, "INT8": 1, "UINT8": 1,
             "BOOL": 1, "DOUBLE": 8, "FLOAT64": 8, "HIFLOAT32": 4, "HF32": 4, "INT4": 1}
_DTYPE_NAME = {"FLOAT": "float32", "FLOAT32": "float32", "FLOAT16": "float16", "HALF": "float16",
               "BF16": "bfloat16", "BFLOAT16": "bfloat16", "INT8": "int8", "UINT8": "int8"}

TRANSDATA_TYPES = frozenset({"TransData", "TransDataRNN"})
CONV_TYPES = frozenset({"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
                        "Conv3DBackpropInput", "Conv3DBackpropFilter", "Conv2DTranspose", "Conv2DV2"})
MATMUL_TYPES = frozenset({"MatMul", "MatMulV2", "MatMulV3", "BatchMatMul", "BatchMatMulV2",
                          "BatchMatMulV3", "GEMM", "MatMulCommon"})
#: ops that only write their output (their input shape is a size, not data read): priced as bytes written
FILL_TYPES = frozenset({"ZerosLike", "OnesLike", "Fill", "MemSet", "Empty"})
_OUTPUT_ONLY = FILL_TYPES | {"Range"}
#: fused attention kernels whose shapes give the two matrix products (QK^T, PV) and the softmax between
ATTENTION_TYPES = frozenset({"FlashAttentionScore", "FlashAttentionScoreGrad"})
#: vector instructions per element for kernels that do more than one or two operations per element,
#: counted from each kernel's formula (an assumption, not fitted): a polynomial sin/cos after range
#: reduction, Adam's two moment updates, bias corrections, sqrt and divide, a norm's backward (two
#: products, a reduction, a scale, the weight gradient), SwiGLU's backward (sigmoid and its derivative)
_OPS_PER_ELEMENT = {"Sin": 16, "Cos": 16, "ApplyAdamWV2": 16, "ApplyAdamW": 16, "RmsNormGrad": 12,
                    "LayerNormGrad": 16, "SwiGluGrad": 12, "NonZero": 2}
#: in-place optimizer updates whose rows record no output: how many of their leading inputs the kernel
#: writes back (AdamW: var, m, v; momentum: var, accum), from the update's formula
_IN_PLACE_WRITES = {"ApplyAdamWV2": 3, "ApplyAdamW": 3, "ApplyMomentum": 2}
_TRANSCENDENTAL = frozenset({"Exp", "Log", "Sigmoid", "Tanh", "Sin", "Cos", "Pows", "Pow", "Sqrt", "Rsqrt",
                             "Erf", "Gelu", "GeLU", "SwiGlu", "SwiGluGrad", "LogSoftmaxV2", "SoftmaxV2",
                             "LogSoftmaxGrad", "SoftmaxGrad", "RotaryPositionEmbedding",
                             "RotaryPositionEmbeddingGrad", "RmsNorm", "RmsNormGrad", "LayerNorm",
                             "LayerNormV3", "LayerNormGrad", "LpNormV2", "ApplyAdamWV2", "ApplyAdamW"})
#: CANN vector kernels priced by the vector roofline (plus the ONNX elementwise/reduce/move names)
VECTOR_TYPES = frozenset(set(C._ELEMENTWISE) | set(C._REDUCE) | set(C._MOVE) | _TRANSCENDENTAL | _OUTPUT_ONLY | {
    "TensorMove", "ForeachAddList", "ForeachMulScalar", "ForeachAddScalar", "ForeachMulList",
    "MaxPoolWithArgmaxV1", "MaxPoolGradWithArgmaxV1", "MaxPool", "MaxPoolV3", "AvgPool", "AvgPoolV2",
    "AdaptiveAvgPool3d", "AdaptiveAvgPool3dGrad", "AdaptiveAvgPool2d", "ReluGrad", "Relu", "DropOutDoMask",
    "NLLLoss", "NLLLossGrad", "RealDiv", "BroadcastTo", "Slice", "StridedSlice", "Tril", "Triu",
    "LogicalNot", "LogicalOr", "LogicalAnd", "GatherV2", "ConcatD", "ConcatV2", "SplitV", "SplitD",
    "Muls", "Adds", "NotEqual", "BiasAdd", "BiasAddGrad", "TransposeD", "Transpose", "AddN", "Square",
    "SquareSumV1", "ReduceMean", "ReduceMax", "ReduceSum", "Greater", "GreaterEqual", "Less", "LessEqual",
    "Equal", "Cast", "Abs", "Neg", "Maximum", "Minimum", "SelectV2", "Select", "MaskedFill",
    "BNTrainingReduce", "BNTrainingUpdate", "BNInfer", "BatchNorm", "ApplyMomentum", "ExpandD", "Tile",
    "TopK", "TopKV2", "TopKD", "Sort", "NonZero", "EmbeddingDenseGradV2"})
#: gathers: they read only the rows their indices select from their data input, not all of it (an
#: embedding GatherV2 reads 4,096 rows of a 151,936-row table): the data input counts as many bytes as
#: the output, as ``cost.op_work`` counts an ONNX Gather, and never more than the input holds (a row
#: selected twice is one row to fetch: gpt3_step_start_rank1 gathers 16,384 rows of a 6,400-row table)
_PARTIAL_READ = frozenset(t for t in C._PARTIAL_READ if t.startswith("Gather")) | {"GatherV2"}
#: kernels that accumulate their first input's rows into the rows of their output that the indices
#: select, the rest of the output zeroed by a separate kernel (aclnnEmbeddingDenseBackward runs a
#: ZerosLike of the table, then EmbeddingDenseGradV2 into it): they write as many rows as they read
_SCATTER_WRITE = frozenset({"EmbeddingDenseGradV2", "EmbeddingDenseGrad"})
#: op classes: colour and table order
CLASSES = ("TransData", "Conv", "MatMul", "Attention", "vector", "fill", "DSA", "AI CPU")


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _nbytes(shapes, dtypes) -> int:
    total = 0
    for k, s in enumerate(shapes):
        if not s:
            continue
        dt = dtypes[k] if k < len(dtypes) else None
        total += _numel(s) * _ITEMSIZE.get((dt or "FLOAT").upper(), 4)
    return total


def _dtype(op) -> str:
    for d in list(op.in_dtypes) + list(op.out_dtypes):
        if d and d.upper() in _DTYPE_NAME:
            return _DTYPE_NAME[d.upper()]
    return "float32"


@dataclasses.dataclass(frozen=True)
class Features:
    """What the cost model needs of one measured op (shape-derived, parameter-free)."""

    cls: str            # one of CLASSES
    engine: str
    flops: float
    nbytes: float
    dtype: str
    pair: str = ""      # TransData "SRC->DST"; "MemSet" for a MemSet without shapes (a fixed cost)
    vflops: float = 0.0  # Attention: the softmax's vector operations beside the cube work
    #: MatMul: bytes of the operands stored transposed (x·Wᵀ's weight as (N, K)), part of ``nbytes``;
    #: Attention: the per-score streams (a full mask, the dropout bit mask), not part of ``nbytes``
    xbytes: float = 0.0
    #: MatMul: bytes of the result (part of ``nbytes``), written through the FixPipe into L2
    obytes: float = 0.0


def _conv_macs(op) -> float | None:
    shapes = list(op.in_shapes) + list(op.out_shapes)
    fmts = list(op.in_formats) + list(op.out_formats)
    w = None
    for s, f in zip(shapes, fmts):
        if f and f.startswith("FRACTAL_Z") and s and len(s) == 4:
            w, cout = s, s[1] * s[2]
            break
    if w is None:
        if len(op.in_shapes) > 1 and op.in_shapes[1] and len(op.in_shapes[1]) == 4 and op.type == "Conv2D":
            w = op.in_shapes[1]
            cout = w[0]
        else:
            return None
    if op.type.endswith(("BackpropInput", "BackpropFilter")):
        act = op.in_shapes[2] if len(op.in_shapes) > 2 else None
    else:
        act = op.out_shapes[0] if op.out_shapes else None
    if not act or not cout:
        return None
    return _numel(act) / cout * _numel(w)


def _matmul_work(op) -> tuple[float, float] | None:
    """(K, bytes of the operands stored transposed) of a MatMul row, or None when its shapes do not say.

    With y = (…, M, N): A is (…, M, K) as stored or (…, K, M) transposed, B is (…, K, N) or (…, N, K)
    transposed. When the shapes cannot tell (a square B, N == K), a 1-D third input of N elements — the
    bias of torch's ``Linear``, whose weight is stored (out, in) = (N, K) and multiplied as x·Wᵀ — says B
    is transposed; without one, the operand is taken as stored."""
    if len(op.in_shapes) < 2 or not op.out_shapes:
        return None
    a, b, y = op.in_shapes[0], op.in_shapes[1], op.out_shapes[0]
    if not a or not b or not y or len(y) < 2:
        return None
    fmt = (op.in_formats[0] if op.in_formats else None) or "ND"
    if fmt == "ND" and len(a) >= 2 and len(b) >= 2:
        m, n = y[-2], y[-1]
        ka = a[-1] if a[-2] == m else a[-2] if a[-1] == m else None
        kb = b[-2] if b[-1] == n else b[-1] if b[-2] == n else None
        if ka or kb:
            k = float(min(ka, kb) if ka and kb else (ka or kb))  # they disagree only for packed layouts
            bias = op.in_shapes[2] if len(op.in_shapes) > 2 else None
            trans_a = a[-2] != m and a[-1] == m
            trans_b = (b[-1] != n and b[-2] == n) or (b[-1] == n == b[-2] and bool(bias)
                                                       and len(bias) == 1 and bias[0] == n)
            sizes = _ITEMSIZE.get((op.in_dtypes[0] if op.in_dtypes else "FLOAT").upper(), 4), \
                _ITEMSIZE.get((op.in_dtypes[1] if len(op.in_dtypes) > 1 else "FLOAT").upper(), 4)
            tb = (trans_a * _numel(a) * sizes[0]) + (trans_b * _numel(b) * sizes[1])
            # shapes whose two K disagree are packed or inconsistent: their orientation is not known
            return k, float(tb) if ka == kb else 0.0
    batch = _numel(y) / max(1, y[-2] * y[-1]) if fmt == "ND" else 1.0
    k2 = _numel(a) * _numel(b) / max(1, _numel(y)) / max(1.0, batch)
    return (math.sqrt(k2), 0.0) if k2 > 0 else None


def _attention_work(op) -> tuple[float, float, float] | None:
    """(cube FLOPs, softmax vector ops, per-score stream bytes) of a FlashAttentionScore(Grad) row, or
    None when its shapes are not the layouts read here.

    Shapes as torch_npu's kernel rows record them (CANN's FlashAttentionScore): q, k, v first, in
    layout SBH / BSH (3-D: the hidden size is heads x head dim) or BNSD / BSND (4-D); the first output
    of the forward (``softmax_max``) is B x N x Sq x 8 (4-D or flattened), which gives B·N·Sq whatever
    the layout; the grad reads it as its 6th input. Then D = numel(q) / (B·N·Sq). Skv is the last dim
    of a 4-D attention mask (B, 1, Sq, Skv); otherwise self-attention (Skv = Sq, Sq the longer of q's
    first two dims for 3-D, dim 2 of BNSD). A 2-D 2048 x 2048 mask is CANN's compressed causal mask
    (sparse modes 2-4): the kernel skips the blocks above the diagonal, about half the work. Forward:
    QK^T and PV, 2 x 2·B·N·Sq·Skv·D; backward: 5 products (QK^T again, dP, dQ, dK, dV), 2.5x the forward.
    Softmax: about 8 vector operations per score (max, subtract, exp, sum, scale; the grad ~2x).

    What else the row shows is priced per score too: a full 4-D mask (…, Sq, Skv) is read for every
    head (its itemsize per score; broadcast over B·N, it is read B·N times) and applied (1 select per
    score); a dropout bit mask (a 1-D uint8 input of one bit per score, ``drop_mask``) is read (1/8 byte
    per score) and applied (select the kept scores, scale them by 1/keep_prob: 2 operations; the grad
    applies it twice, to P and to dP). These streams are the third element: bytes the vector core loads
    tile by tile before it can apply them."""
    ins = list(op.in_shapes)
    if len(ins) < 3 or not ins[0] or len(ins[0]) not in (3, 4):
        return None
    grad = op.type.endswith("Grad")
    smax = (ins[5] if len(ins) > 5 else None) if grad else (op.out_shapes[0] if op.out_shapes else None)
    if not smax or _numel(smax) % 8:
        return None
    bns = _numel(smax) // 8
    q = ins[0]
    d = _numel(q) / bns if bns else 0
    if d < 1:
        return None
    if len(smax) == 4:
        sq = smax[2]
    elif len(q) == 3:
        sq = max(q[0], q[1])
    else:
        sq = q[2]
    skv, causal, mask_item = sq, False, 0
    for k, m in enumerate(ins[3:8], start=3):
        if m and tuple(m) in (tuple(smax), tuple(q)):
            continue                      # the grad's softmax_max or dy input, not a mask
        if m and len(m) == 4 and m[-2] == sq:
            skv = m[-1]
            dt = op.in_dtypes[k] if k < len(op.in_dtypes) else None
            mask_item = _ITEMSIZE.get((dt or "BOOL").upper(), 1)
        elif m and len(m) == 2 and tuple(m) == (2048, 2048):
            causal = True
    full = bns * skv
    dropout = any(s and len(s) == 1 and 8 * _numel(s) >= full and 8 * _numel(s) <= full + 8 * 4096
                  and k < len(op.in_dtypes) and (op.in_dtypes[k] or "").upper() == "UINT8"
                  for k, s in enumerate(ins[3:], start=3))
    scores = full * (0.5 if causal else 1.0)
    fwd = 2 * 2.0 * scores * d
    per_score = 8.0 + (1.0 if mask_item else 0.0) + (2.0 if dropout else 0.0)
    stream = scores * (mask_item + (0.125 if dropout else 0.0))
    return (2.5 * fwd if grad else fwd), (2.0 if grad else 1.0) * per_score * scores, stream


def _largest_elems(op) -> int:
    """Elements processed by a vector kernel: its outputs, or its largest operand for in-place updates
    that record no output (ApplyAdamWV2)."""
    out = sum(_numel(s) for s in op.out_shapes if s)
    return max(out, max((_numel(s) for s in op.in_shapes if s), default=0))


def features(op) -> Features | None:
    """The parameter-free description of a measured op, or None when the model cannot price it."""
    if op.type == "MemSet" and not any(op.out_shapes) and not any(op.in_shapes):
        return Features("fill", op.engine, 0.0, 0.0, "float32", "MemSet")   # size not recorded: a fixed cost
    if not (op.in_shapes or op.out_shapes) or any(s is None for s in list(op.in_shapes) + list(op.out_shapes)):
        return None
    engine = op.engine
    dtype = _dtype(op)
    in_b = _nbytes(op.in_shapes, op.in_dtypes)
    out_b = _nbytes(op.out_shapes, op.out_dtypes)
    t = op.type
    if t in TRANSDATA_TYPES:
        if not op.in_formats or not op.out_formats or not op.in_formats[0] or not op.out_formats[0]:
            return None
        pair = f"{op.in_formats[0]}->{op.out_formats[0]}"
        return Features("TransData", engine, 0.0, float(in_b + out_b), dtype, pair)
    if engine == "AI_CPU":
        return Features("AI CPU", engine, 0.0, float(in_b + out_b), dtype)
    if engine.startswith("DSA"):
        return Features("DSA", engine, 0.0, float(out_b), dtype)
    if t in FILL_TYPES:
        return Features("fill", engine, 0.0, float(out_b), dtype)
    if t in ATTENTION_TYPES:
        w = _attention_work(op)
        if w is None:
            return None
        return Features("Attention", engine, w[0], float(in_b + out_b), dtype, vflops=w[1], xbytes=w[2])
    if t in CONV_TYPES:
        macs = _conv_macs(op)
        return None if macs is None else Features("Conv", engine, 2.0 * macs, float(in_b + out_b), dtype)
    if t in MATMUL_TYPES:
        w = _matmul_work(op)
        if w is None:
            return None
        return Features("MatMul", engine, 2.0 * _numel(op.out_shapes[0]) * w[0], float(in_b + out_b), dtype,
                        xbytes=w[1], obytes=float(out_b))
    if t in VECTOR_TYPES:
        if t in _OUTPUT_ONLY:
            in_b = 0
        if t in _PARTIAL_READ and op.out_shapes and op.out_shapes[0]:
            data = min(_nbytes(op.in_shapes[:1], op.in_dtypes[:1]), _nbytes(op.out_shapes[:1], op.out_dtypes[:1]))
            in_b = data + _nbytes(op.in_shapes[1:], op.in_dtypes[1:])
        if t in _SCATTER_WRITE and op.in_shapes and op.in_shapes[0] and op.out_shapes and op.out_shapes[0]:
            # the rows its indices select: the first input's element count at the output's dtype
            out_b = _numel(op.in_shapes[0]) * _ITEMSIZE.get(((op.out_dtypes[0] if op.out_dtypes else None)
                                                             or "FLOAT").upper(), 4)
        if t in _IN_PLACE_WRITES and not any(op.out_shapes):
            n = _IN_PLACE_WRITES[t]
            out_b = _nbytes(op.in_shapes[:n], op.in_dtypes[:n])        # the state it updates in place
        if t.startswith("MaxPoolGradWithArgmax") and len(op.in_shapes) > 2 and op.in_shapes[2] \
                and len(op.in_shapes[2]) == 6 and op.in_shapes[2][-1] and op.in_shapes[2][3]:
            # the argmax mask the grad reads is the one its forward wrote, (N, C1, kh·kw, blocks, C0)
            # uint16; the row records it as (N, C, kh·kw, kh·kw, blocks, C0), C0·kh·kw times larger —
            # bytes the kernel cannot have read (layer 2 of the CNN capture would need 14 TB/s on its
            # measured MTE2 time)
            s6 = op.in_shapes[2]
            shown = _nbytes([s6], op.in_dtypes[2:3])
            in_b -= shown - shown // (s6[-1] * s6[3])
        elems = _largest_elems(op)
        if t in _PARTIAL_READ and op.out_shapes and op.out_shapes[0]:
            elems = _numel(op.out_shapes[0])              # the rows it selects, not the table's
        elif t in _SCATTER_WRITE and op.in_shapes and op.in_shapes[0]:
            elems = _numel(op.in_shapes[0])               # the rows it accumulates
        per = float(_OPS_PER_ELEMENT.get(t, 8.0 if t in _TRANSCENDENTAL else 1.0))
        if t.startswith("MaxPoolWithArgmax") and len(op.out_shapes) > 1 and op.out_shapes[1] \
                and len(op.out_shapes[1]) == 5:
            # the argmax mask is (N, C1, kh·kw, blocks, 16): every output compares kh·kw inputs and
            # records the winner (compare + select + index per window element)
            elems, per = _numel(op.out_shapes[0]), 3.0 * op.out_shapes[1][2]
        elif (t.startswith("TopK") or t == "Sort") and op.in_shapes and op.in_shapes[0]:
            # a vector sort of each row: ~log2(n) compare-exchange passes over its n elements
            elems = _numel(op.in_shapes[0])
            per = max(1.0, math.log2(max(2, op.in_shapes[0][-1])))
        return Features("vector", engine, per * elems, float(in_b + out_b), dtype)
    return None


def predict(f: Features, p: C.SocProfile) -> float:
    """Predicted device time (µs) of one priced op under profile ``p``."""
    if f.cls == "AI CPU":
        return p.aicpu_launch_us + 1e6 * f.nbytes / (p.aicpu_bandwidth_gbps * 1e9)
    if f.cls == "fill" and f.pair == "MemSet":
        return float(p.launch_us_by_engine.get("MemSet", p.launch_for(f.engine)))
    launch = p.launch_for(f.engine)
    if f.cls == "fill":
        return launch + 1e6 * f.nbytes / (p.bandwidth_gbps * 1e9 * p.fill_efficiency)
    if f.cls == "DSA":
        return launch + 1e6 * f.nbytes / (p.dsa_bandwidth_gbps * 1e9)
    if f.cls == "Attention":
        # cube products and the softmax (float32 on the vector unit) alternate tile by tile; the fused
        # kernel's one efficiency applies to both (the other kernels' vector efficiency is not this one's)
        # the per-score streams (a full mask, dropout bits) are loaded by the vector core before it can
        # apply them, in the softmax's own pipeline: added, not hidden behind the cube work
        bw = p.bandwidth_gbps * 1e9 * p.bw_efficiency
        comp = ((f.flops / p.cube_peak_flops(f.dtype) + f.vflops / p.vector_peak_flops("float32"))
                / p.cube_eff(f.dtype, "FlashAttention")) + f.xbytes / bw
        return launch + 1e6 * max(comp, f.nbytes / bw)
    if f.cls == "TransData":
        src, dst = f.pair.split("->", 1)
        return p.transdata_launch(src, dst, f.engine) + 1e6 * f.nbytes / (p.bandwidth_gbps * 1e9 * p.transdata_eff(src, dst, f.dtype))
    mem = f.nbytes / (p.bandwidth_gbps * 1e9 * p.bw_efficiency)
    if f.cls == "MatMul":
        # an operand stored transposed streams at a fraction of the bandwidth (its rows are not the
        # fractal's rows: the ND-to-fractal load gathers them); the result leaves the cube through the
        # FixPipe into L2 (write-back), at its own rate
        bw = p.bandwidth_gbps * 1e9 * p.bw_efficiency
        mem = ((f.nbytes - f.obytes - f.xbytes) + f.xbytes / p.transposed_read_efficiency) / bw \
            + f.obytes / (p.bandwidth_gbps * 1e9 * p.cube_write_efficiency)
    if f.cls in ("Conv", "MatMul"):
        comp = f.flops / (p.cube_peak_flops(f.dtype) * p.cube_eff(f.dtype, f.cls))
    else:
        comp = f.flops / (p.vector_peak_flops(f.dtype) * p.vector_efficiency)
    return launch + 1e6 * max(comp, mem)


# ---------------------------------------------------------------------------------------------
# measurements no physical rate can produce

#: how far above the HBM peak a measured stream may run before its row is called implausible: the peak
#: is a datasheet figure ("1.6 TB/s HBM"), and no source here gives it per part (each 910B part keeps
#: the family's, an assumption); a stream up to 25 % above it is taken as that uncertainty, not as a
#: row whose shapes are wrong
PLAUSIBLE_RATE_MARGIN = 1.25


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


def hbm_floor_us(f: Features, p: C.SocProfile) -> float | None:
    """The least time (µs) in which ``f``'s bytes can move on ``p``: what its L2 cannot hold streamed at
    HBM peak x :data:`PLAUSIBLE_RATE_MARGIN`. The bytes are the ones the op is priced on (``nbytes``:
    reads + writes as :func:`features` counts them). 0 for an op whose bytes fit L2; None when ``p``'s
    L2 size is not known (no floor)."""
    if p.l2_mib is None:
        return None
    beyond = f.nbytes - p.l2_mib * (1 << 20)
    return 1e6 * beyond / (p.bandwidth_gbps * 1e9 * PLAUSIBLE_RATE_MARGIN) if beyond > 0 else 0.0


def implausible(f: Features, measured_us: float, p: C.SocProfile) -> str | None:
    """Why ``measured_us`` cannot be the time of an op moving ``f``'s bytes on ``p`` (faster than
    :func:`hbm_floor_us`), or None when it can. Such a row's shapes are not what the kernel moved (a
    lazily zeroed or aliased buffer): it is kept and reported, never priced against."""
    floor = hbm_floor_us(f, p)
    if not floor or measured_us >= floor:
        return None
    rate = f.nbytes / max(measured_us, 1e-3) / 1e6
    return (f"measured {measured_us:.0f} µs for {_size(f.nbytes)} = {rate:.1f} TB/s, above what HBM "
            f"({p.bandwidth_gbps / 1e3:.1f} TB/s x {PLAUSIBLE_RATE_MARGIN:g}) allows beyond L2 ({p.l2_mib:g} MiB): "
            f"at least {floor:.0f} µs; the row's shape is not what the kernel wrote")


# ---------------------------------------------------------------------------------------------
# which 910B part a capture ran on

#: msprof engines whose block dim counts cube cores, and those counting vector cores
CUBE_ENGINES = ("AI_CORE", "MIX_AIC")
VECTOR_ENGINES = ("AI_VECTOR_CORE", "MIX_AIV")
#: a block dim above the largest 910B vector core count (48) is a kernel launched in waves (the captures
#: have 256 and 1639): it says nothing about the cores, and is left out of the inference
_MAX_PART_BLOCKS = 48


@dataclasses.dataclass(frozen=True)
class PartChoice:
    """The SoC profile a capture is priced with, and why (named in the capture, inferred, given)."""

    soc: str
    why: str
    inferred: bool = False


def capture_part(ops: Iterable[Any], recorded: str | None = None) -> PartChoice:
    """The 910B part ``ops`` (one capture's measured ops) ran on.

    A specific SoC named by the capture (``recorded``, else the ops' ``soc``: profiler_info*.json,
    NPU_INFO, info.json) is used as named. When it names only the family ``Ascend910B`` or nothing, the
    core count is inferred from the largest block dims per engine (kernels tile over every core they
    may use; block dims beyond 48 are launches in waves and are ignored): a cube-engine block dim above
    20 or a vector one above 40 -> a 24-core part (priced as Ascend910B2, 24/48 cores); at most 20/40
    and reaching 20 or 40 -> a 20-core part (B3/B4, priced as Ascend910B4); else the family profile.
    """
    ops = list(ops)
    if recorded is None:
        recorded = next((o.soc for o in ops if getattr(o, "soc", None)), None)
    if recorded and recorded != "Ascend910B":
        return PartChoice(recorded, f"{recorded} named in the capture")
    said = "the capture names only Ascend910B" if recorded else "the capture names no SoC"
    cube = vec = 0
    for o in ops:
        bd = getattr(o, "block_dim", None)
        if not isinstance(bd, int) or not 0 < bd <= _MAX_PART_BLOCKS:
            continue
        if o.engine in CUBE_ENGINES:
            cube = max(cube, bd)
        elif o.engine in VECTOR_ENGINES:
            vec = max(vec, bd)
    big, small = C.SOC_PARTS["Ascend910B2"], C.SOC_PARTS["Ascend910B4"]
    if cube > small["cube_cores"] or vec > small["vector_cores"]:
        return PartChoice("Ascend910B2", f"24-core 910B part (priced as Ascend910B2, {big['cube_cores']}/"
                          f"{big['vector_cores']} cores) inferred from block dims up to {cube}/{vec} "
                          f"(cube/vector engines; above 20/40); {said}", True)
    if cube == small["cube_cores"] or vec == small["vector_cores"]:
        return PartChoice("Ascend910B4", f"20-core 910B part (B3/B4, priced as Ascend910B4) inferred from "
                          f"block dims <= 20/40 (largest {cube}/{vec}); {said}", True)
    return PartChoice("Ascend910B", f"{said}, and its block dims ({cube}/{vec}) do not tell the part: "
                      f"the Ascend910B family profile")


# ---------------------------------------------------------------------------------------------
# cost check

@dataclasses.dataclass
class CheckedOp:
    name: str
    type: str
    engine: str
    cls: str | None
    measured_us: float
    predicted_us: float | None
    capture: str = ""
    #: why the measurement is left out of every comparison (faster than any physical rate moves the
    #: op's bytes: :func:`implausible`); ``predicted_us`` is then None, the op is kept and counted
    excluded: str | None = None

    @property
    def error_pct(self) -> float | None:
        if self.predicted_us is None or self.measured_us <= 0:
            return None
        return 100.0 * (self.predicted_us - self.measured_us) / self.measured_us


@dataclasses.dataclass
class TypeRow:
    type: str
    cls: str | None
    count: int
    measured_us: float
    predicted_us: float | None
    median_abs_err_pct: float | None
    p90_abs_err_pct: float | None
    worst: list[str]
    #: ops of this type whose measurement is implausible (left out of predicted_us and the errors)
    implausible: int = 0


def _short(name: str, width: int = 40) -> str:
    """A long kernel name shortened in the middle, keeping both ends."""
    return name if len(name) <= width else name[:width // 2 - 1] + "…" + name[-(width // 2):]


def _pctile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclasses.dataclass
class CostCheckReport(Result):
    """Predicted against measured device time per op, per op type and overall."""

    SCHEMA: ClassVar[str] = "npu-deploy/cost-check"
    SCHEMA_VERSION: ClassVar[int] = 1

    soc: str
    calibrated: bool
    captures: list[str]
    ops: list[CheckedOp]
    types: list[TypeRow]
    total: dict
    formattrans: dict
    not_priced: dict
    skipped: dict
    max_error_pct: float | None = None
    median_abs_err_pct: float | None = None
    #: which profile priced which capture and why ("Ascend910B4: 20-core 910B part ... inferred ...")
    soc_note: str = ""
    #: measurements no physical rate can produce, kept in ``ops`` (``excluded`` says why) and left out of
    #: the totals, the FormatTrans shares and the errors: count, measured_us, share_pct, types, worst
    implausible: dict = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.max_error_pct is None or (self.median_abs_err_pct or 0.0) <= self.max_error_pct

    def verdict(self) -> str:
        t = self.total
        err = "n/a" if self.median_abs_err_pct is None else f"{self.median_abs_err_pct:.1f} %"
        line = (f"cost model on {self.soc}{'' if self.calibrated else ' (not calibrated)'}: median op error "
                f"{err}; priced plausible ops measured {t['measured_priced_us']:.1f} µs, predicted "
                f"{t['predicted_us']:.1f} µs ({t['error_pct']:+.1f} %)")
        if self.max_error_pct is not None:
            line += f" — {'ok' if self else 'FAILED'} (--max-error {self.max_error_pct:g} %)"
        return line

    def to_dict(self) -> dict:
        d = super().to_dict()
        for o, od in zip(self.ops, d["ops"]):
            od["error_pct"] = o.error_pct
        return d


def class_of(op) -> str | None:
    f = features(op)
    return None if f is None else f.cls


def check(ops: Iterable[Any], soc: "str | C.SocProfile", *, max_error_pct: float | None = None,
          skipped: dict | None = None, captures: Sequence[str] = (),
          soc_of: "Mapping[str, str | C.SocProfile] | None" = None, soc_note: str = "") -> CostCheckReport:
    """Predict every measured op under ``soc`` and compare (see the module docstring for the pricing).

    ``soc_of`` maps a capture label (the ops' ``capture``) to the profile its ops are priced with (each
    capture on the part it ran on); ops of other captures use ``soc``.
    """
    p = C.get_soc_profile(soc)
    by_cap = {k: C.get_soc_profile(v) for k, v in (soc_of or {}).items()}
    rows: list[CheckedOp] = []
    for op in ops:
        f = features(op)
        q = by_cap.get(getattr(op, "capture", ""), p)
        why = implausible(f, float(op.duration_us), q) if f is not None else None
        pred = predict(f, q) if f is not None and why is None else None
        rows.append(CheckedOp(op.name, op.type, op.engine, f.cls if f else None, float(op.duration_us), pred,
                              getattr(op, "capture", ""), why))
    if not rows:
        raise InputError("cost check: no device ops to compare", hint="give a capture with device compute tasks")
    by_type: dict[str, list[CheckedOp]] = defaultdict(list)
    for r in rows:
        by_type[r.type].append(r)
    types = []
    for t, rs in by_type.items():
        errs = [abs(r.error_pct) for r in rs if r.error_pct is not None]
        priced = [r for r in rs if r.predicted_us is not None]
        worst = sorted((r for r in priced if r.error_pct is not None), key=lambda r: -abs(r.error_pct))[:3]
        types.append(TypeRow(t, rs[0].cls, len(rs), sum(r.measured_us for r in rs),
                             sum(r.predicted_us for r in priced) if priced else None,
                             statistics.median(errs) if errs else None, _pctile(errs, 0.9),
                             [f"{_short(r.name)} ({r.error_pct:+.0f} %)" for r in worst],
                             sum(1 for r in rs if r.excluded)))
    types.sort(key=lambda r: -r.measured_us)
    measured = sum(r.measured_us for r in rows)
    priced = [r for r in rows if r.predicted_us is not None]
    m_priced = sum(r.measured_us for r in priced)
    pred = sum(r.predicted_us for r in priced)
    td_m = sum(r.measured_us for r in priced if r.cls == "TransData")
    td_p = sum(r.predicted_us for r in priced if r.cls == "TransData")
    unpriced = [r for r in rows if r.predicted_us is None and not r.excluded]
    np_types: dict[str, int] = defaultdict(int)
    for r in unpriced:
        np_types[r.type] += 1
    bad = sorted((r for r in rows if r.excluded), key=lambda r: -r.measured_us)
    bad_types: dict[str, int] = defaultdict(int)
    for r in bad:
        bad_types[r.type] += 1
    errs = [abs(r.error_pct) for r in priced if r.error_pct is not None]
    names = list(dict.fromkeys([p.name] if not by_cap else [q.name for q in by_cap.values()]))
    return CostCheckReport(
        soc=" + ".join(names), soc_note=soc_note, calibrated=p.calibrated, captures=list(captures), ops=rows, types=types,
        total={"measured_us": measured, "measured_priced_us": m_priced, "predicted_us": pred,
               "error_pct": 100.0 * (pred - m_priced) / m_priced if m_priced > 0 else 0.0},
        formattrans={"measured_pct": 100.0 * td_m / m_priced if m_priced else 0.0,
                     "predicted_pct": 100.0 * td_p / pred if pred else 0.0},
        not_priced={"count": len(unpriced), "measured_us": sum(r.measured_us for r in unpriced),
                    "share_pct": 100.0 * sum(r.measured_us for r in unpriced) / measured if measured else 0.0,
                    "types": dict(sorted(np_types.items(), key=lambda kv: -kv[1]))},
        skipped=dict(skipped or {}), max_error_pct=max_error_pct,
        median_abs_err_pct=statistics.median(errs) if errs else None,
        implausible={"count": len(bad), "measured_us": sum(r.measured_us for r in bad),
                     "share_pct": 100.0 * sum(r.measured_us for r in bad) / measured if measured else 0.0,
                     "types": dict(sorted(bad_types.items(), key=lambda kv: -kv[1])),
                     "worst": f"{bad[0].type} {_short(bad[0].name)}: {bad[0].excluded}" if bad else None})


def _f(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def render_text(r: CostCheckReport, top: int = 25) -> str:
    lines = [f"cost check: {', '.join(r.captures) or 'capture'} against the {r.soc} "
             f"profile{'s' if ' + ' in r.soc else ''} "
             f"({C.accuracy_note(r.soc.split(' + ')[0])})"]
    lines += [f"SoC: {n}" for n in r.soc_note.splitlines()] + [""]
    head = f"{'op type':<26}{'count':>6}{'measured µs':>13}{'predicted µs':>14}{'median |err|':>14}{'p90':>8}  worst"
    lines += [head, "-" * len(head)]
    for t in r.types[:top]:
        pred = _type_pred(t)
        med = "" if t.median_abs_err_pct is None else f"{t.median_abs_err_pct:.1f} %"
        p90 = "" if t.p90_abs_err_pct is None else f"{t.p90_abs_err_pct:.0f} %"
        lines.append(f"{t.type[:25]:<26}{t.count:>6}{t.measured_us:>13.1f}{pred:>14}{med:>14}{p90:>8}  "
                     f"{'; '.join(_type_worst(t)[:2])}")
    if len(r.types) > top:
        lines.append(f"... {len(r.types) - top} more op types (--json has every op)")
    tot, ft, npd = r.total, r.formattrans, r.not_priced
    lines += ["",
              f"device time, priced plausible ops: measured {tot['measured_priced_us']:.1f} µs, predicted "
              f"{tot['predicted_us']:.1f} µs ({tot['error_pct']:+.1f} %)",
              f"FormatTrans share: measured {ft['measured_pct']:.1f} %, predicted {ft['predicted_pct']:.1f} % "
              f"({ft['predicted_pct'] - ft['measured_pct']:+.1f} points)",
              f"not priced: {npd['count']} ops, {npd['share_pct']:.1f} % of measured device time "
              f"({', '.join(f'{k} x{v}' for k, v in list(npd['types'].items())[:6]) or 'none'})",
              implausible_line(r)]
    for why, n in r.skipped.items():
        lines.append(f"skipped: {n} rows ({why})")
    lines.append(r.verdict())
    return "\n".join(lines)


def _type_pred(t: TypeRow) -> str:
    if t.predicted_us is not None:
        return f"{t.predicted_us:.1f}"
    return "implausible" if t.implausible == t.count else "not priced"


def _type_worst(t: TypeRow) -> list[str]:
    return ([f"{t.implausible} implausible measurement{'s' if t.implausible > 1 else ''} left out"]
            if t.implausible else []) + t.worst


def implausible_line(r: CostCheckReport) -> str:
    """"implausible measurements: N ops, X % of measured device time (the worst one and why)"."""
    b = r.implausible or {"count": 0, "share_pct": 0.0, "worst": None}
    return (f"implausible measurements: {b['count']} ops, {b['share_pct']:.1f} % of measured device time "
            f"({b['worst'] or 'none'})")


_COLOURS = {"TransData": "#d62728", "Conv": "#1f77b4", "MatMul": "#2ca02c", "Attention": "#17becf",
            "vector": "#ff7f0e", "fill": "#bcbd22", "DSA": "#8c564b", "AI CPU": "#9467bd"}


def render_html(r: CostCheckReport) -> str:
    """One self-contained HTML page: the table and a log–log scatter of predicted vs measured (inline SVG)."""
    pts = [o for o in r.ops if o.predicted_us is not None and o.measured_us > 0 and o.predicted_us > 0]
    W, H, M = 760, 560, 60
    vals = [v for o in pts for v in (o.measured_us, o.predicted_us)] or [1.0, 10.0]
    lo = 10 ** math.floor(math.log10(min(vals)))
    hi = 10 ** math.ceil(math.log10(max(vals)))
    if hi <= lo:
        hi = lo * 10
    span = math.log10(hi) - math.log10(lo)

    def x(v):
        return M + (math.log10(v) - math.log10(lo)) / span * (W - 2 * M)

    def y(v):
        return H - M - (math.log10(v) - math.log10(lo)) / span * (H - 2 * M)

    e = html.escape
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">',
           f'<rect x="{M}" y="{M}" width="{W - 2 * M}" height="{H - 2 * M}" fill="#fafafa" stroke="#999"/>']
    d = lo
    while d <= hi * 1.0001:
        svg.append(f'<line x1="{x(d):.1f}" y1="{M}" x2="{x(d):.1f}" y2="{H - M}" stroke="#ddd"/>'
                   f'<line x1="{M}" y1="{y(d):.1f}" x2="{W - M}" y2="{y(d):.1f}" stroke="#ddd"/>'
                   f'<text x="{x(d):.1f}" y="{H - M + 18}" font-size="12" text-anchor="middle">{d:g}</text>'
                   f'<text x="{M - 6}" y="{y(d) + 4:.1f}" font-size="12" text-anchor="end">{d:g}</text>')
        d *= 10
    for f_, dash in ((1.0, ""), (1.25, "4,3"), (0.8, "4,3")):
        svg.append(f'<line x1="{x(lo):.1f}" y1="{y(lo * f_):.1f}" x2="{x(hi / f_ if f_ > 1 else hi):.1f}" '
                   f'y2="{y(hi if f_ > 1 else hi * f_):.1f}" stroke="#555" stroke-dasharray="{dash}"/>')
    for o in pts:
        c = _COLOURS.get(o.cls or "", "#7f7f7f")
        svg.append(f'<circle cx="{x(o.measured_us):.1f}" cy="{y(o.predicted_us):.1f}" r="3.5" fill="{c}" '
                   f'fill-opacity="0.7"><title>{e(o.name)} ({e(o.type)}): measured {o.measured_us:.2f} µs, '
                   f'predicted {o.predicted_us:.2f} µs</title></circle>')
    svg.append(f'<text x="{W / 2}" y="{H - 15}" font-size="14" text-anchor="middle">measured µs (log)</text>'
               f'<text x="18" y="{H / 2}" font-size="14" text-anchor="middle" '
               f'transform="rotate(-90 18 {H / 2})">predicted µs (log)</text>')
    for k, (cls, c) in enumerate(_COLOURS.items()):
        svg.append(f'<circle cx="{M + 15}" cy="{M + 18 + 18 * k}" r="5" fill="{c}"/>'
                   f'<text x="{M + 26}" y="{M + 23 + 18 * k}" font-size="13">{e(cls)}</text>')
    svg.append(f'<text x="{M + 130}" y="{M + 23}" font-size="12" fill="#555">solid: exact; dashed: ±25 %</text>')
    svg.append("</svg>")
    rows = "".join(
        f"<tr><td>{e(t.type)}</td><td>{t.count}</td><td>{t.measured_us:.1f}</td>"
        f"<td>{_type_pred(t)}</td>"
        f"<td>{_f(t.median_abs_err_pct)}</td><td>{_f(t.p90_abs_err_pct, '{:.0f}')}</td>"
        f"<td>{e('; '.join(_type_worst(t)))}</td></tr>" for t in r.types)
    tot, ft = r.total, r.formattrans
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>npu-deploy cost check — {e(r.soc)}</title>
<style>body{{font-family:sans-serif;margin:24px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:first-child,td:last-child{{text-align:left}}</style>
</head><body>
<h1>Cost model against measured device time — {e(r.soc)}</h1>
<p>{e(', '.join(r.captures))}. {e(C.accuracy_note(r.soc.split(' + ')[0]))}.</p>
{''.join(f'<p>SoC: {e(n)}</p>' for n in r.soc_note.splitlines())}
<p>Priced plausible ops: measured {tot['measured_priced_us']:.1f} µs, predicted {tot['predicted_us']:.1f} µs
({tot['error_pct']:+.1f} %). FormatTrans share: measured {ft['measured_pct']:.1f} %, predicted
{ft['predicted_pct']:.1f} %. Not priced: {r.not_priced['count']} ops, {r.not_priced['share_pct']:.1f} % of
measured time.</p>
<p>{e(implausible_line(r))}</p>
{''.join(svg)}
<h2>Per op type</h2>
<table><tr><th>op type</th><th>count</th><th>measured µs</th><th>predicted µs</th><th>median |err| %</th>
<th>p90 %</th><th>worst ops</th></tr>{rows}</table>
<p>{e(r.verdict())}</p>
</body></html>
"""


# ---------------------------------------------------------------------------------------------
# cost fit

#: (parameter, lower, upper): physically plausible ranges (launch: ~1-50 µs per task on any Ascend SoC;
#: efficiencies are fractions of the datasheet peak; TransData up to 2x HBM peak for L2-resident data;
#: the vector unit at least a quarter of its peak: below that, a 310-class AI Core would compute slower
#: than its AI CPU, and the derived profiles take this efficiency)
_SCALAR_BOUNDS = {"fp32_tflops": (5.0, 400.0), "vector_efficiency": (0.25, 1.0), "bw_efficiency": (0.05, 1.0),
                  "aicpu_launch_us": (1.0, 500.0), "aicpu_bandwidth_gbps": (0.05, 200.0),
                  "fill_efficiency": (0.05, 1.0), "dsa_bandwidth_gbps": (0.5, 400.0),
                  "transposed_read_efficiency": (0.1, 1.0), "cube_write_efficiency": (0.05, 3.0)}
_LAUNCH_BOUNDS = (0.3, 50.0)
_TD_BOUNDS = (0.01, 3.0)
_CUBE_BOUNDS = (0.01, 1.0)
MIN_OPS_PER_PARAM = 2
#: an AI CPU op moving fewer bytes is launch-bound (1 MB at its assumed 20 GB/s is 50 µs, its launch's
#: size): ops below this say nothing about the AI CPU's bandwidth, which then keeps its base value
AICPU_BW_MIN_BYTES = 1 << 20
#: multi-start: the base profile plus FIT_STARTS - 1 points drawn (seed FIT_SEED) inside the bounds
FIT_STARTS = 4
FIT_SEED = 19


@dataclasses.dataclass
class FitResult(Result):
    """A fitted profile and how well it reproduces the captures (in sample and leave one capture out)."""

    SCHEMA: ClassVar[str] = "npu-deploy/cost-fit"
    SCHEMA_VERSION: ClassVar[int] = 1

    profile: dict
    parameters: dict
    n_ops: int
    n_keys: int
    in_sample: dict
    leave_one_out: dict
    captures: list[str]
    #: per capture: the part it was priced as and why ({label: {"soc", "why"}})
    parts: dict = dataclasses.field(default_factory=dict)
    #: per capture: the measurements left out of the fit, faster than any physical rate moves their
    #: bytes ({label: [{"name", "type", "measured_us", "why"}]}, see :func:`implausible`)
    excluded: dict = dataclasses.field(default_factory=dict)

    @property
    def n_excluded(self) -> int:
        return sum(len(v) for v in self.excluded.values())

    def verdict(self) -> str:
        loo = self.leave_one_out.get("median_abs_err_pct")
        bad = (f", {self.n_excluded} implausible measurement{'s' if self.n_excluded > 1 else ''} left out"
               if self.n_excluded else "")
        return (f"fitted {len(self.parameters)} parameters on {self.n_ops} ops ({self.n_keys} distinct op/shape "
                f"keys{bad}) from {len(self.captures)} capture(s): in-sample median op error "
                f"{_f(self.in_sample.get('median_abs_err_pct'))} %, leave-one-capture-out "
                f"{_f(loo)} %" + ("" if loo is not None else " (needs two captures)"))


def _param_specs(feats: list[Features], base: C.SocProfile) -> list[tuple[str, str, float, float, float]]:
    """The parameters the data can determine: (table, key, lower, upper, start)."""
    specs = []
    count: dict[tuple, int] = defaultdict(int)
    for f in feats:
        if f.cls == "AI CPU":
            count[("aicpu",)] += 1
            if f.nbytes >= AICPU_BW_MIN_BYTES:
                count[("aicpu_bw",)] += 1
            continue
        if f.pair == "MemSet":
            count[("memset",)] += 1
            continue
        count[("launch", f.engine)] += 1
        if f.cls == "fill":
            count[("fill",)] += 1
        elif f.cls == "DSA":
            count[("dsa",)] += 1
        elif f.cls == "Attention":
            count[("attn", f.dtype)] += 1
        elif f.cls == "TransData":
            count[("td", f"{f.pair}/{f.dtype}")] += 1
            count[("tdlaunch", f.pair)] += 1
        elif f.cls in ("Conv", "MatMul"):
            count[("cube", f.dtype)] += 1
            count[("cubecls", f"{f.cls}/{f.dtype}")] += 1
            if f.xbytes:
                count[("transposed",)] += 1
            if f.cls == "MatMul" and f.obytes:
                count[("cubewrite",)] += 1
        else:
            count[("vector",)] += 1
    for (kind, *rest), n in sorted(count.items()):
        if n < MIN_OPS_PER_PARAM:
            continue
        if kind == "launch" and rest[0] in C.LAUNCH_ENGINES:
            specs.append(("launch_us_by_engine", rest[0], *_LAUNCH_BOUNDS, base.launch_for(rest[0])))
        elif kind == "td":
            src_dst, dt = rest[0].split("/")
            src, dst = src_dst.split("->")
            specs.append(("transdata_efficiency_by_pair", rest[0], *_TD_BOUNDS, base.transdata_eff(src, dst, dt)))
        elif kind == "tdlaunch":
            src, dst = rest[0].split("->")
            specs.append(("launch_us_by_engine", f"TransData:{rest[0]}", *_LAUNCH_BOUNDS,
                          base.transdata_launch(src, dst)))
        elif kind == "cube" and rest[0] == "float32":
            # fp32 through the cube: the datasheet gives no rate, so the rate itself is fitted
            specs.append(("fp32_tflops", "", *_SCALAR_BOUNDS["fp32_tflops"], base.fp32_tflops))
        elif kind == "cubecls" and rest[0] == "MatMul/float32":
            # the fp32 rate is fitted on the convolutions; matrix products get their own efficiency
            specs.append(("cube_efficiency_by_dtype", rest[0], *_CUBE_BOUNDS, base.cube_eff("float32", "MatMul")))
        elif kind == "cube" and rest[0] in ("float16", "bfloat16", "int8"):
            specs.append(("cube_efficiency_by_dtype", rest[0], *_CUBE_BOUNDS, base.cube_eff(rest[0])))
        elif kind == "vector":
            for k in ("vector_efficiency", "bw_efficiency"):
                specs.append((k, "", *_SCALAR_BOUNDS[k], getattr(base, k)))
        elif kind in ("aicpu", "aicpu_bw"):
            k = "aicpu_launch_us" if kind == "aicpu" else "aicpu_bandwidth_gbps"
            specs.append((k, "", *_SCALAR_BOUNDS[k], getattr(base, k)))
        elif kind in ("fill", "dsa"):
            k = "fill_efficiency" if kind == "fill" else "dsa_bandwidth_gbps"
            specs.append((k, "", *_SCALAR_BOUNDS[k], getattr(base, k)))
        elif kind == "transposed":
            specs.append(("transposed_read_efficiency", "", *_SCALAR_BOUNDS["transposed_read_efficiency"],
                          base.transposed_read_efficiency))
        elif kind == "cubewrite":
            specs.append(("cube_write_efficiency", "", *_SCALAR_BOUNDS["cube_write_efficiency"],
                          base.cube_write_efficiency))
        elif kind == "memset":
            specs.append(("launch_us_by_engine", "MemSet", *_LAUNCH_BOUNDS,
                          float(base.launch_us_by_engine.get("MemSet", base.launch_us))))
        elif kind == "attn":
            specs.append(("cube_efficiency_by_dtype", f"FlashAttention/{rest[0]}", *_CUBE_BOUNDS,
                          base.cube_eff(rest[0], "FlashAttention")))
    return specs


def _apply(base: C.SocProfile, specs, values, name: str | None = None) -> C.SocProfile:
    tables = {"launch_us_by_engine": dict(base.launch_us_by_engine),
              "transdata_efficiency_by_pair": dict(base.transdata_efficiency_by_pair),
              "cube_efficiency_by_dtype": dict(base.cube_efficiency_by_dtype)}
    scalars = {}
    for (table, key, *_), v in zip(specs, values):
        if key:
            tables[table][key] = float(v)
        else:
            scalars[table] = float(v)
    return dataclasses.replace(base, name=name or base.name, **tables, **scalars)


def _clip(v, lo, hi):
    return min(max(v, lo * 1.0001), hi * 0.9999)


def _part_ref(base: C.SocProfile) -> str | None:
    """The part whose core counts ``base``'s peaks stand for (None: not a 910B-class profile, no scaling)."""
    return base.name if base.name in C.SOC_PARTS else None


def _priced(feats, parts, p: C.SocProfile, ref: str | None) -> list[float]:
    """Each op priced under ``p`` as its own capture's part (``parts``, one per op) would price it."""
    if ref is None or parts is None:
        return [predict(f, p) for f in feats]
    prof = {q: C.part_profile(p, q, ref=ref) for q in dict.fromkeys(parts)}
    return [predict(f, prof[q]) for f, q in zip(feats, parts)]


def _fit_profile(feats, meas, base, specs, name=None, weights=None, parts=None) -> C.SocProfile:
    import numpy as np

    try:
        from scipy.optimize import least_squares  # heavy optional dependency: imported only by `cost fit`
    except ImportError:
        raise DependencyError("cost fit needs scipy, which is not installed here",
                              hint="pip install 'npu-deploy[cost]' (or pip install scipy)") from None

    lo = np.log([s[2] for s in specs])
    hi = np.log([s[3] for s in specs])
    x0 = np.log([_clip(s[4], s[2], s[3]) for s in specs])
    logm = np.log(np.maximum(meas, 1e-3))
    w = np.ones(len(feats)) if weights is None else np.asarray(weights, dtype=float)
    # the ops repeat (a few hundred distinct op/shape keys among thousands of rows): price each once
    # (per part: one shared set of parameters, each capture priced with its own part's peaks)
    ref = _part_ref(base)
    qs = list(parts) if parts is not None else [None] * len(feats)
    uniq = list(dict.fromkeys(zip(feats, qs)))
    pos = {fq: k for k, fq in enumerate(uniq)}
    idx = np.array([pos[fq] for fq in zip(feats, qs)], dtype=np.intp)
    u_feats, u_parts = [f for f, _ in uniq], [q for _, q in uniq]

    def resid(theta):
        p = _apply(base, specs, np.exp(theta))
        logp = np.log(np.maximum(_priced(u_feats, u_parts if parts is not None else None, p, ref), 1e-3))
        return w * (logp[idx] - logm)

    # the roofline's max() gives the loss several local minima: start from the base profile and from a
    # few seeded points inside the bounds (the same seed every run: the fit is deterministic), keep the best
    rng = np.random.default_rng(FIT_SEED)
    starts = [x0] + [lo + rng.uniform(0.2, 0.8, len(x0)) * (hi - lo) for _ in range(FIT_STARTS - 1)]
    best = None
    for start in starts:
        sol = least_squares(resid, start, bounds=(lo, hi), loss="soft_l1", f_scale=0.4, max_nfev=200)
        if best is None or sol.cost < best.cost - 1e-12:
            best = sol
    return _apply(base, specs, np.exp(best.x), name)


def _summary(feats, meas, p, parts=None, ref=None) -> dict:
    return _summary_from_pred(feats, meas, _priced(feats, parts, p, ref))


def fit(captures: Sequence[tuple[str, Sequence[Any]]], base: "str | C.SocProfile" = "Ascend910B", *,
        name: str | None = None, parts: "Mapping[str, str] | None" = None) -> tuple[C.SocProfile, FitResult]:
    """Fit ``base``'s parameters to the measured ops of ``captures`` (``[(label, ops), ...]``).

    Each capture is priced on the part it ran on (``parts[label]``, else :func:`capture_part`): its
    cube/vector peaks from the part's core counts (:func:`cost.part_profile`), every fitted parameter
    shared by all captures (a base that is no 910B-class profile prices every capture with its own peaks).
    Measurements no physical rate can produce on their part (:func:`implausible`) are left out of the fit
    and listed in the report's ``excluded``. Returns the fitted profile (name ``name`` or
    ``<base>-fitted``, at ``base``'s peaks) and the fit's report, with the in-sample error and, with two
    or more captures, the leave-one-capture-out error.
    """
    b = C.get_soc_profile(base)
    ref = _part_ref(b)
    per_cap = []
    types_of: dict[str, list[str]] = {}
    chosen: dict[str, dict] = {}
    excluded: dict[str, list[dict]] = {}
    for label, ops in captures:
        ops = list(ops)
        pc = PartChoice(parts[label], "given with --part") if parts and label in parts else capture_part(ops)
        # the part's HBM rate and L2 size are no fitted parameters: which rows no physical rate can
        # produce is known before the fit, and those rows are left out of it
        q_prof = C.part_profile(b, pc.soc, ref=ref) if ref is not None else b
        fs, ms, ts = [], [], []
        for op in ops:
            f = features(op)
            if f is not None and op.duration_us > 0:
                why = implausible(f, float(op.duration_us), q_prof)
                if why:
                    excluded.setdefault(label, []).append({"name": op.name, "type": op.type,
                                                           "measured_us": float(op.duration_us), "why": why})
                    continue
                fs.append(f)
                ms.append(float(op.duration_us))
                ts.append(op.type)
        chosen[label] = {"soc": pc.soc, "why": pc.why}
        per_cap.append((label, fs, ms, [pc.soc] * len(fs)))
        types_of[label] = ts
    feats = [f for _, fs, _, _ in per_cap for f in fs]
    meas = [m for _, _, ms, _ in per_cap for m in ms]
    qs = [q for *_, q4 in per_cap for q in q4]
    if len(feats) < 4:
        raise InputError(f"cost fit: only {len(feats)} priced ops with shapes in the capture(s)",
                         hint="give Level1+ captures with device compute ops (TransData, Conv2D, MatMul ...)")
    specs = _param_specs(feats, b)
    keys = {(f.cls, f.pair, f.dtype, round(f.flops), round(f.nbytes)) for f in feats}
    weights = _weights(per_cap)
    fitted = _fit_profile(feats, meas, b, specs, name or f"{b.name}-fitted", weights, parts=qs)
    ins = _summary(feats, meas, fitted, qs, ref)
    loo: dict = {}
    if len(per_cap) >= 2:
        lf: list[Features] = []
        lm: list[float] = []
        lp: list[float] = []
        lt: list[str] = []
        per: dict = {}
        for k, (label, fs, ms, q4) in enumerate(per_cap):
            if not fs:
                continue
            tr_f = [f for j, (_, f2, _, _) in enumerate(per_cap) if j != k for f in f2]
            tr_m = [m for j, (_, _, m2, _) in enumerate(per_cap) if j != k for m in m2]
            tr_q = [q for j, (*_, q2) in enumerate(per_cap) if j != k for q in q2]
            if len(tr_f) < 4:
                continue
            sp = _param_specs(tr_f, b)
            pk = _fit_profile(tr_f, tr_m, b, sp, weights=_weights([c for j, c in enumerate(per_cap) if j != k]),
                              parts=tr_q)
            preds = _priced(fs, q4, pk, ref)
            per[label] = _summary_from_pred(fs, ms, preds)
            per[label]["per_type"] = _per_type(types_of[label], ms, preds)
            lf += fs
            lm += ms
            lp += preds
            lt += types_of[label]
        if lf:
            loo = _summary_from_pred(lf, lm, lp)
            loo["per_capture"] = per
            loo["per_type"] = _per_type(lt, lm, lp)
    sources = dict(fitted.sources)
    for table, key, *_ in specs:
        sources[f"{table}.{key}" if key else table] = (f"fitted (robust least squares on log time) on "
                                                        f"{len(per_cap)} capture(s)")
    n_bad = sum(len(v) for v in excluded.values())
    calib = {"calibrated": True, "captures": [c[0] for c in per_cap],
             "parts": {k: v["soc"] for k, v in chosen.items()},
             "median_op_error_pct": round(loo.get("median_abs_err_pct") or ins["median_abs_err_pct"], 1),
             "summary": (f"fitted on {len(feats)} ops of {len(per_cap)} capture(s)"
                         + (f" ({n_bad} implausible measurement{'s' if n_bad > 1 else ''} left out)" if n_bad else "")
                         + f"; in-sample median op error {ins['median_abs_err_pct']:.1f} %"
                         + (f", leave-one-capture-out {loo['median_abs_err_pct']:.1f} %" if loo else ""))}
    fitted = dataclasses.replace(fitted, sources=sources, calibration=calib)
    params = {(f"{t}.{k}" if k else t): v for (t, k, *_), v in
              zip(specs, [(_get(fitted, t, k)) for t, k, *_ in specs])}
    only = set(qs)
    if ref is not None and len(only) == 1 and next(iter(only)) != ref:
        # every capture ran on one other part: the profile is written at that part's peaks, so that
        # `--soc` with it prices that part's captures as the fit did (the parameters above stay base-level)
        part = next(iter(only))
        fitted = dataclasses.replace(C.part_profile(fitted, part, ref=ref), name=name or f"{part}-fitted")
    return fitted, FitResult(profile=profile_dict(fitted, b.name), parameters=params, n_ops=len(feats),
                             n_keys=len(keys), in_sample=ins, leave_one_out=loo,
                             captures=[c[0] for c in per_cap], parts=chosen, excluded=excluded)


def _per_type(types, meas, preds) -> dict:
    """Per op type: count, measured and predicted µs, median and p90 |error| %."""
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t, m, pr in zip(types, meas, preds):
        by[t].append((m, pr))
    out = {}
    for t, v in sorted(by.items(), key=lambda kv: -sum(m for m, _ in kv[1])):
        errs = [abs(pr - m) / m * 100.0 for m, pr in v]
        out[t] = {"count": len(v), "measured_us": sum(m for m, _ in v), "predicted_us": sum(p for _, p in v),
                  "median_abs_err_pct": statistics.median(errs), "p90_abs_err_pct": _pctile(errs, 0.9)}
    return out


def _weights(per_cap) -> list[float]:
    """Each capture weighs about the same whatever its op count (a 2,000-op LLM step would otherwise
    set every vector parameter): weight 1/sqrt(ops in the capture), scaled to mean 1."""
    w = [1.0 / math.sqrt(len(c[1])) for c in per_cap for _ in c[1]]
    mean = sum(w) / len(w) if w else 1.0
    return [x / mean for x in w]


def _get(p: C.SocProfile, table: str, key: str) -> float:
    return float(getattr(p, table)[key]) if key else float(getattr(p, table))


def _summary_from_pred(feats, meas, preds) -> dict:
    errs_by: dict[str, list[float]] = defaultdict(list)
    tot_m = tot_p = td_m = td_p = 0.0
    for f, m, pr in zip(feats, meas, preds):
        errs_by[f.cls].append(abs(pr - m) / m * 100.0)
        tot_m += m
        tot_p += pr
        if f.cls == "TransData":
            td_m += m
            td_p += pr
    allerr = [e for es in errs_by.values() for e in es]
    return {"median_abs_err_pct": statistics.median(allerr),
            "per_class": {k: {"count": len(v), "median_abs_err_pct": statistics.median(v),
                              "p90_abs_err_pct": _pctile(v, 0.9)} for k, v in errs_by.items()},
            "total_error_pct": 100.0 * (tot_p - tot_m) / tot_m if tot_m else None,
            "formattrans_measured_pct": 100.0 * td_m / tot_m if tot_m else None,
            "formattrans_predicted_pct": 100.0 * td_p / tot_p if tot_p else None}


def profile_dict(p: C.SocProfile, base: str) -> dict:
    """The JSON a ``--soc`` option accepts: the profile's fields plus its ``base``."""
    d = p.to_dict()
    d["base"] = base
    return d
