"""The op table: per SoC and per ONNX op, the facts GE/FE decide formats by (one place for them).

What is here (each fact with the GE/FE file it comes from; ``docs/ge-rules.md`` lists them all):

* :data:`SOCS`: every ``--soc_version`` the toolkit accepts, once; :func:`soc_family` maps a name
  (``Ascend910B3``) to its family (``Ascend910B``), the key of the per-SoC columns below.
* :data:`SOC_TRAITS`: per family, whether MatMul/MatMulV2/BatchMatMul(V2) are ``heavyOp`` in the op info
  (FE's format-mode filter applies to them only then), whether the platform has the fix-pipe
  (``Intrinsic_fix_pipe_l0c2out``: BatchMatMulV2 then offers ND columns), and the C0 a float32 cube op
  stores ("cube high precision", 8 on 910B: 32-byte blocks of float32).
* :data:`CANN_OPS`: the CANN op type ATC's ONNX parser maps an ONNX op to (reference §7), the names a real
  ``.om`` shows; :data:`CANN_OPS_3D` for 5-D operands; :data:`PARSER_PRIMARY` the main op of a parser
  plugin's ``PartitionedCall`` subgraph (what the op-support data names).
* The op classes every layer reads (nothing else in the package lists ONNX op types; the test
  ``tests/converters/lowering/test_op_table.py`` greps for lists elsewhere): :data:`VIEW_OPS`,
  :data:`FREE_OPS` (cost class "free"), :data:`UNARY_ELEMENTWISE` / :data:`BINARY_ELEMENTWISE` /
  :data:`ELEMENTWISE` (fusion and permutation classes), :data:`FORMAT_AGNOSTIC` (the planner's "follow"
  kind), :data:`CUBE_OPS` / :data:`CUBE_C0_OPS`, :data:`MIX_PRECISION_FP32_OPS`.
* :data:`FORMAT_RULES`: the planner's format-kind column, one :class:`FormatRule` per op (which operands
  take NC1HWC0 / FRACTAL_Z / FRACTAL_NZ, or follow their producer; ge-rules R1, R5, R16), read through
  :func:`npu_deploy.converters.lowering.plan_state.rule_for`.
* The cost model's columns: :data:`COST_OPS_PER_ELEMENT` (vector operations per output element, an
  assumption), :data:`COST_REDUCE_OPS`, :data:`COST_MOVE_OPS`, :data:`COST_PARTIAL_READ_OPS`, read by
  :func:`npu_deploy.converters.lowering.cost.op_work`.
* On a CANN host the installed op info (``converters/lowering/opinfo.py``) narrows the planner's per-SoC
  format columns; :func:`npu_deploy.converters.lowering.support.op_row` shows one op's full row (opsets,
  CANN op, engine per dtype, classes).

>>> soc_family("Ascend910B3"), soc_family("Ascend310P3"), soc_family("Ascend310B4")
('Ascend910B', 'Ascend310P', 'Ascend310B')
>>> matmul_is_heavy("Ascend910B1"), matmul_is_heavy("Ascend310P3")
(False, True)
>>> cube_c0("Ascend910B", "float32"), cube_c0("Ascend310P3", "float32"), cube_c0("Ascend910B", "float16")
(8, 16, 16)
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Every SoC ATC's --soc_version takes that the toolkit plans for (atc-acl-om.md §1), family first.
SOCS = ("Ascend310", "Ascend310P1", "Ascend310P3", "Ascend310B1", "Ascend310B4", "Ascend910",
        "Ascend910A", "Ascend910B", "Ascend910B1", "Ascend910B2", "Ascend910B3", "Ascend910B4",
        "Ascend910_9391", "Ascend910_9381", "Ascend910_9372", "Ascend910_9362")

# family prefixes, longest first (Ascend910B before Ascend910, Ascend310P before Ascend310)
FAMILIES = ("Ascend910_93", "Ascend910B", "Ascend910", "Ascend310P", "Ascend310B", "Ascend310")


def soc_family(soc: str) -> str | None:
    """The family of a SoC name (``Ascend910B2`` -> ``Ascend910B``, ``Ascend910_9391`` ->
    ``Ascend910_93``), None for a name of no known family."""
    s = str(soc)
    return next((f for f in FAMILIES if s.startswith(f)), None)


@dataclasses.dataclass(frozen=True)
class SocTraits:
    """What differs per SoC family in FE's format choice (see the module docstring)."""

    heavy_matmul: bool     # MatMul/MatMulV2/BatchMatMul(V2) are heavyOp (FE op info, 8.1.RC1)
    fix_pipe: bool         # Intrinsic_fix_pipe_l0c2out: BatchMatMulV2 offers ND (batch_matmul_v2.py)
    fp32_cube_c0: int      # C0 a float32 cube operand is stored with (cube high precision)


SOC_TRAITS = {
    "Ascend310": SocTraits(heavy_matmul=True, fix_pipe=False, fp32_cube_c0=16),
    "Ascend310P": SocTraits(heavy_matmul=True, fix_pipe=False, fp32_cube_c0=16),
    "Ascend310B": SocTraits(heavy_matmul=True, fix_pipe=True, fp32_cube_c0=16),
    "Ascend910": SocTraits(heavy_matmul=True, fix_pipe=False, fp32_cube_c0=16),
    "Ascend910B": SocTraits(heavy_matmul=False, fix_pipe=True, fp32_cube_c0=8),
    "Ascend910_93": SocTraits(heavy_matmul=False, fix_pipe=True, fp32_cube_c0=8),
}
_DEFAULT_TRAITS = SOC_TRAITS["Ascend310P"]


def traits(soc: str) -> SocTraits:
    """The :class:`SocTraits` of ``soc`` (an unknown family: Ascend310P's, the default SoC's)."""
    return SOC_TRAITS.get(soc_family(soc) or "", _DEFAULT_TRAITS)


def matmul_is_heavy(soc: str) -> bool:
    return traits(soc).heavy_matmul


# Precision modes the built-in planner takes (ATC --precision_mode), and those that compute in float16
# somewhere (float32 inputs are rounded; compare's tolerances are the float16 ones).
PRECISION_MODES = ("force_fp16", "allow_fp32_to_fp16", "must_keep_origin_dtype", "allow_mix_precision")
FP16_MODES = ("force_fp16", "allow_fp32_to_fp16", "allow_mix_precision")

# ONNX ops that only re-view their input's data (no kernel of their own on the device; ATC folds them
# into a neighbouring TransData or drops them).
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
# Cost class "free": no kernel time in the estimate — the views, ops GE answers from shapes or folds at
# compile time (Shape, Size, Constant, ConstantOfShape), inference Dropout, and the Optional wrappers.
FREE_OPS = VIEW_OPS | frozenset({"Shape", "Size", "Constant", "ConstantOfShape", "Dropout", "Optional",
                                 "OptionalGetElement"})

# Elementwise ops by their fusion class: the vector unit runs them on any layout, element by element
# (their attributes name no axis), and ATC fuses them into their producer (``fusion.fused_tensors``).
UNARY_ELEMENTWISE = frozenset({
    "Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "LeakyRelu",
    "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Floor", "Ceil", "Round",
    "Sign", "Gelu", "Mish", "Identity", "Clip", "ThresholdedRelu", "Sin", "Cos",
})
BINARY_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Sum"})
# Every op computing each output element from the elements at the same (broadcast) index of its inputs,
# with no axis attribute: a layout permutation passes through it unchanged (``optimize``'s
# sink-transpose), and a 3-D region of them can be widened to 4-D (conv1d-to-conv2d). The fusion classes
# plus comparisons, logic, Cast, Mod, Where and Mean.
ELEMENTWISE = UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | frozenset({
    "Cast", "Not", "IsNaN", "IsInf", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "And",
    "Or", "Xor", "Mod", "Where", "Mean",
})
# Format behaviour "follow" (FE's format-agnostic and broadcast ops): they run in their producer's
# format; FRACTAL_NZ when the other operands are (M, N), (1, N) or scalar (the planner's broadcast check).
FORMAT_AGNOSTIC = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Relu", "Sigmoid", "Tanh", "Clip",
    "HardSigmoid", "HardSwish", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "Erf", "Exp", "Log",
    "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Sign", "Softplus", "Softsign", "Mish",
    "ThresholdedRelu", "Sin", "Cos", "Cast", "Where", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf", "Shrink", "Trilu",
})

# Per ONNX op that computes on integer data: the input positions that carry data (None: every input);
# the others are shapes, axes or indices. ``optimize``'s narrow-int64 narrows the data inputs to int32.
INT_DATA_INPUTS: dict[str, tuple[int, ...] | None] = {
    "Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1), "Div": (0, 1), "Abs": (0,), "Neg": (0,), "Relu": (0,),
    "Max": None, "Min": None, "Concat": None, "ReduceSum": (0,), "Slice": (0,), "Transpose": (0,),
    "Squeeze": (0,), "Unsqueeze": (0,), "Reshape": (0,), "Gather": (0,), "Expand": (0,), "Tile": (0,),
    "Flatten": (0,), "Identity": (0,), "Where": (1, 2)}

# ONNX ops the cube unit runs (their NC1HWC0 / FRACTAL_Z / FRACTAL_NZ operands follow :func:`cube_c0`):
# FE's cube list for the C0 refresh (RefreshCubeC0FusionPass: Conv2D, Conv2DTransposeD, BatchMatMulV2,
# MatMulV2, AvgPool, AvgPoolV2, ...; ONNX AveragePool -> AvgPoolV2, GlobalAveragePool -> AvgPool)
CUBE_C0_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "AveragePool", "GlobalAveragePool"})
# Cube-unit ops for precision: the 310P cube has no float32 path, so allow_fp32_to_fp16 runs them in
# float16 (the recurrent ops' gate MatMuls too; their storage C0 is not modelled, hence not CUBE_C0_OPS).
CUBE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN"})
# Ops kept in float32 under allow_mix_precision (numerically sensitive: reductions, exponentials,
# normalisations). npu-deploy's list, modelled on the "black list" idea of CANN's mixed precision.
MIX_PRECISION_FP32_OPS = frozenset({
    "Softmax", "LogSoftmax", "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceSumSquare",
    "ReduceL2", "ReduceLogSumExp", "Exp", "Log", "Pow", "Sqrt", "Erf", "InstanceNormalization",
    "GroupNormalization", "BatchNormalization", "Div", "Reciprocal", "CumSum",
})


def cube_c0(soc: str, dtype) -> int:
    """C0 of a cube op's (Conv2D, MatMul) NC1HWC0 / FRACTAL_Z operands: float32 kept in float32 is 8 on
    SoCs with cube high precision (910B, 910_93: captures show Conv inputs ``…×8``, weights FRACTAL_Z
    ``121×4×16×8``), else GE's ``GetCubeSizeByDataType`` (32 for 1-byte types, 16 otherwise)."""
    dt = np.dtype(dtype)
    if dt == np.float32:
        return traits(soc).fp32_cube_c0
    return 32 if dt.itemsize == 1 else 16


# ONNX op -> the CANN op ATC's parser plugin maps it to (ge-format-selection.md §7, onnx-op-support.md;
# the names a real .om shows where that differs from the plugin's first choice).
CANN_OPS = {
    "Conv": "Conv2D", "ConvTranspose": "Conv2DTransposeD", "MatMul": "BatchMatMulV2", "Gemm": "MatMulV2",
    "BatchNormalization": "BNInferenceD", "Resize": "ResizeBilinearV2", "Softmax": "SoftmaxV2",
    "LogSoftmax": "LogSoftmaxV2", "LayerNormalization": "LayerNorm", "Concat": "ConcatD",
    "Gather": "GatherV2", "Slice": "StridedSliceV2", "Pad": "PadV3", "Div": "RealDiv", "Where": "SelectV2",
    "MaxPool": "MaxPoolV3", "AveragePool": "AvgPoolV2", "Transpose": "TransposeD", "ReduceMean": "ReduceMeanD",
    "ReduceSum": "ReduceSumD", "Clip": "ClipByValue", "PRelu": "PRelu", "Relu": "Relu", "Sigmoid": "Sigmoid",
}


# 5-D operands (Conv3d and friends): the parser plugin's 3-D op, which runs in NDC1HWC0
CANN_OPS_3D = {"Conv": "Conv3D", "ConvTranspose": "Conv3DTranspose", "MaxPool": "MaxPool3D",
               "AveragePool": "AvgPool3D"}
# NC1HWC0 ops that also take a 3-D (N, C, L) input in NC1HWC0 (the parser unsqueezes it to N, C, 1, L)
NC1HWC0_RANK3_OPS = frozenset({"Conv", "MaxPool", "AveragePool", "BatchNormalization", "GlobalAveragePool",
                               "GlobalMaxPool"})
# Ops whose output differs run to run: never constant-folded
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})

# The main op of a parser plugin's PartitionedCall subgraph, where it is not found by name (the others
# reshape, cast or scale: :data:`SUBGRAPH_HELPER_OPS`); the op-support data (``support.py``) names these,
# the parser's own spellings (``Conv2DTranspose``, ``Resize``: :data:`CANN_OPS` has what a real .om shows).
PARSER_PRIMARY = {"Gemm": "MatMulV2", "Conv": "Conv2D", "ConvTranspose": "Conv2DTranspose",
                  "MaxPool": "MaxPoolV3", "AveragePool": "AvgPoolV2", "LayerNormalization": "LayerNorm",
                  "Resize": "Resize", "LpPool": "AvgPoolV2", "Split": "SplitV", "Max": "Maximum",
                  "Min": "Minimum", "Clip": "ClipByValue", "MaxUnpool": "ScatterElements", "Mean": "AccumulateNV2"}
# CANN ops in PartitionedCall subgraphs that reshape, cast or scale around the op doing the work.
SUBGRAPH_HELPER_OPS = frozenset({
    "Cast", "Shape", "Squeeze", "Unsqueeze", "ExpandDims", "Muls", "Adds", "Add", "Mul", "Concat", "Split",
    "Slice", "Reshape", "TransposeD", "PadV2", "BroadcastTo", "ZerosLike", "Empty", "Mod", "Sub",
    "StridedSlice", "Div", "Log", "Power", "Abs", "Rsqrt", "Transpose", "Const", "Identity"})
# CANN ops without AI Core op-info that a GE fusion pass rewrites to an AI Core op
# (onnx-op-support.md §5.3). Value: (AI Core op, input positions that must be constant; () = always).
FUSION_TO_AICORE: dict[str, tuple[str, tuple[int, ...]]] = {
    "GlobalAveragePool": ("ReduceMeanD", ()),
    "CommonLSTM": ("DynamicRNN", ()),
    "CommonGRU": ("DynamicGRUV2", ()),
    "HardMax": ("HardMax", ()),
    "NonMaxSuppressionV6": ("NonMaxSuppressionV7", ()),
    "Conv2DTranspose": ("Conv2DTranspose", ()),  # NC1HWC0/FRACTAL_Z kernel listed in 310P op-info (§5.4)
    "TopK": ("TopKD", (1,)),
    "Range": ("RangeD", (0, 1, 2)),
    "Cumsum": ("CumsumD", (1,)),
    "StridedSliceV2": ("StridedSliceV3", (1, 2, 3, 4)),
    "Expand": ("ExpandD", (1,)),
}


def cost_class(onnx_op: str) -> str:
    """The cost class of an ONNX op: ``free`` (:data:`FREE_OPS`: no kernel time), ``cube``
    (:data:`CUBE_OPS`: priced by the cube's MACs), ``elementwise`` (:data:`ELEMENTWISE`: priced per output
    element), else ``kernel`` (reductions, data movement and the rest: ``cost.py`` prices each by its own
    formula).

    >>> [cost_class(o) for o in ("Reshape", "MatMul", "Sigmoid", "Softmax")]
    ['free', 'cube', 'elementwise', 'kernel']
    """
    if onnx_op in FREE_OPS:
        return "free"
    if onnx_op in CUBE_OPS:
        return "cube"
    return "elementwise" if onnx_op in ELEMENTWISE else "kernel"


def fusion_class(onnx_op: str) -> str | None:
    """``unary`` / ``binary`` (fused into their producer, ``fusion.fused_tensors``), else None."""
    if onnx_op in UNARY_ELEMENTWISE:
        return "unary"
    return "binary" if onnx_op in BINARY_ELEMENTWISE else None


def cann_op(onnx_op: str, rank: int | None = None) -> str:
    """The CANN op type for an ONNX op (the ONNX name when the parser keeps it); ``rank`` 5 gives the
    3-D op (``Conv`` -> ``Conv3D``).

    >>> cann_op("Conv"), cann_op("Conv", 5), cann_op("Relu"), cann_op("Einsum")
    ('Conv2D', 'Conv3D', 'Relu', 'Einsum')
    """
    if rank == 5 and onnx_op in CANN_OPS_3D:
        return CANN_OPS_3D[onnx_op]
    return CANN_OPS.get(onnx_op, onnx_op)


def parser_op(onnx_op: str) -> str:
    """The parser plugin's name for the op doing an ONNX op's work (:data:`PARSER_PRIMARY`, else the
    :func:`cann_op` name)."""
    return PARSER_PRIMARY.get(onnx_op, cann_op(onnx_op))


# ------------------------------------------------------------------------------------------------
# The format preference table (the planner's format-kind column): which format each op wants.
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FormatRule:
    """How an op takes its operands.

    ``kind``: ``"5hd"`` (activations in NC1HWC0 — NDC1HWC0 for 5-D — weight slot in FRACTAL_Z),
    ``"matmul"`` (operands and result in FRACTAL_NZ; constant B pre-packed), ``"concat"`` (a producer's
    blocked format: NC1HWC0 along C for any sizes, FRACTAL_NZ unless it joins a blocked axis with
    unaligned sizes; constant inputs packed at compile time), ``"follow"`` (format-
    agnostic: takes its producer's format where broadcasting allows), ``"reduce"`` (ND, or its
    producer's blocked format when the reduced axes leave the blocked ones whole), ``"slice"`` (the same
    rule for the axes a Slice cuts), ``"lastaxis"`` (ND, or
    FRACTAL_NZ when it normalises over the last axis of an NZ input), ``"view"`` (ND, or the input's
    blocked format when the blocked axes are untouched or the view is half of an attention head
    split/merge pair, :func:`head_pair`), ``"nd"`` (ND only).
    """

    kind: str
    data_slots: tuple[int, ...] = (0,)
    weight_slot: int | None = None
    note: str = ""


_5HD_NOTE = "its AI Core kernel reads activations in NC1HWC0 (op info: NC1HWC0 only, ge-rules R16)"
_REDUCE_NOTE = ("{}: in NC1HWC0 (NDC1HWC0) when it reduces spatial axes only, in FRACTAL_NZ when it reduces "
                "outer axes only, keeping dims; other reductions run in ND")
FORMAT_RULES: dict[str, FormatRule] = {
    "Conv": FormatRule("5hd", (0,), 1, "Conv2D/Conv3D: NC1HWC0 (NDC1HWC0) activations, FRACTAL_Z weight "
                                       "(heavy op, ge-rules R1)"),
    "ConvTranspose": FormatRule("5hd", (0,), 1, "Conv2DTransposeD: NC1HWC0 activations, FRACTAL_Z weight "
                                                "(heavy op, ge-rules R1)"),
    "MaxPool": FormatRule("5hd", note="MaxPoolV3: " + _5HD_NOTE),
    "AveragePool": FormatRule("5hd", note="AvgPoolV2: " + _5HD_NOTE),
    "LpPool": FormatRule("5hd", note="AvgPoolV2: " + _5HD_NOTE),
    "GlobalAveragePool": FormatRule("5hd", note="pooling: " + _5HD_NOTE),
    "GlobalMaxPool": FormatRule("5hd", note="pooling: " + _5HD_NOTE),
    "BatchNormalization": FormatRule("5hd", note="BatchNorm: " + _5HD_NOTE),
    "Resize": FormatRule("5hd", note="Resize/ResizeNearestNeighborV2: " + _5HD_NOTE),
    "Upsample": FormatRule("5hd", note="Resize: " + _5HD_NOTE),
    "LRN": FormatRule("5hd", note="LRN: " + _5HD_NOTE),
    "MaxRoiPool": FormatRule("5hd", note="ROIPooling: " + _5HD_NOTE),
    "RoiAlign": FormatRule("5hd", note="ROIAlign: " + _5HD_NOTE),
    "MatMul": FormatRule("matmul", (0, 1), 1, "BatchMatMulV2: the cube reads 16x16 FRACTAL_NZ fractals"),
    "Gemm": FormatRule("matmul", (0, 1), 1, "MatMulV2: the cube reads 16x16 FRACTAL_NZ fractals"),
    "Softmax": FormatRule("lastaxis", note="SoftmaxV2 has a FRACTAL_NZ kernel for axis = last (-1 or "
                                           "rank-1; padding masked); other axes run in ND"),
    "LogSoftmax": FormatRule("lastaxis", note="LogSoftmaxV2 has a FRACTAL_NZ kernel for axis = last (-1 or "
                                              "rank-1); other axes run in ND"),
    "LayerNormalization": FormatRule("lastaxis", note="LayerNorm takes FRACTAL_NZ only over the last axis"),
    "ReduceMean": FormatRule("reduce", note=_REDUCE_NOTE.format("ReduceMeanD")),
    "ReduceSum": FormatRule("reduce", note=_REDUCE_NOTE.format("ReduceSumD")),
    "ReduceMax": FormatRule("reduce", note=_REDUCE_NOTE.format("ReduceMaxD")),
    "ReduceMin": FormatRule("reduce", note=_REDUCE_NOTE.format("ReduceMinD")),
    "Reshape": FormatRule("view", note="Reshape keeps a blocked format only if the blocked axes are unchanged"),
    "Squeeze": FormatRule("view", note="Squeeze keeps a blocked format only if the blocked axes are unchanged"),
    "Unsqueeze": FormatRule("view", note="Unsqueeze keeps a blocked format only if the blocked axes are unchanged"),
    "Flatten": FormatRule("view", note="Flatten keeps a blocked format only if the blocked axes are unchanged"),
    "Transpose": FormatRule("view", note="Transpose keeps FRACTAL_NZ only if it leaves the last two axes alone"),
    "Identity": FormatRule("view", note="Identity keeps any format"),
    "Concat": FormatRule("concat", note="ConcatD keeps its producers' blocked format (NC1HWC0 along C "
                                        "whatever the channel counts; FRACTAL_NZ unless it joins along a "
                                        "blocked axis with sizes not multiples of the block); constant "
                                        "inputs are packed at compile time"),
    "Dropout": FormatRule("view", note="Dropout (inference) keeps any format"),
    "Slice": FormatRule("slice", note="StridedSliceD: in NC1HWC0 (NDC1HWC0) when it slices N and spatial axes "
                                      "only, in FRACTAL_NZ when it slices outer axes only; else ND"),
}
for _op in sorted(FORMAT_AGNOSTIC):
    FORMAT_RULES.setdefault(_op, FormatRule("follow", note="elementwise: runs in its producer's format; in "
                                                  "FRACTAL_NZ when other operands are (M, N), (1, N) or scalar "
                                                  "(format-agnostic / broadcast, ge-rules R5)"))


# ------------------------------------------------------------------------------------------------
# The cost model's columns (read by converters/lowering/cost.py's op_work)
# ------------------------------------------------------------------------------------------------

# Per-output-element operation counts for elementwise ops (transcendentals cost a few vector
# instructions each: assumption).
COST_OPS_PER_ELEMENT: dict[str, float] = {
    **dict.fromkeys(["Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "Max", "Min", "Equal",
                     "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not",
                     "Where", "Cast", "Floor", "Ceil", "Round", "Sign", "Mod", "Clip",
                     "LeakyRelu", "PRelu", "ThresholdedRelu", "BitShift", "IsNaN", "IsInf",
                     "CastLike", "Reciprocal", "Sum", "Mean"], 1.0),
    **dict.fromkeys(["HardSigmoid", "HardSwish", "Selu", "Elu", "Celu", "Shrink"], 3.0),
    **dict.fromkeys(["Sqrt", "Pow"], 4.0),
    **dict.fromkeys(["Exp", "Log", "Sigmoid", "Tanh", "Softplus", "Softsign", "Sin", "Cos",
                     "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"],
                    8.0),
    **dict.fromkeys(["Erf", "Gelu", "Mish"], 12.0),
}

COST_REDUCE_OPS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                             "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax",
                             "ArgMin"})
# data movement: priced by bytes read and written
COST_MOVE_OPS = frozenset({"Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND",
                           "Pad", "Tile", "Expand", "ScatterND", "ScatterElements", "DepthToSpace",
                           "SpaceToDepth", "ReverseSequence", "Compress", "Trilu"})
# ... of which these read only the part of their data input they select
COST_PARTIAL_READ_OPS = frozenset({"Gather", "GatherElements", "GatherND", "Slice", "Compress"})
