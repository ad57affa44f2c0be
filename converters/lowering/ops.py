"""The op table: per SoC and per ONNX op, the facts GE/FE decide formats by (one place for them).

What is here (each fact with the GE/FE file it comes from; ``docs/ge-rules.md`` lists them all):

* :data:`SOCS`: every ``--soc_version`` the toolkit accepts, once; :func:`soc_family` maps a name
  (``Ascend910B3``) to its family (``Ascend910B``), the key of the per-SoC columns below.
* :data:`SOC_TRAITS`: per family, whether MatMul/MatMulV2/BatchMatMul(V2) are ``heavyOp`` in the op info
  (FE's format-mode filter applies to them only then), whether the platform has the fix-pipe
  (``Intrinsic_fix_pipe_l0c2out``: BatchMatMulV2 then offers ND columns), and the C0 a float32 cube op
  stores ("cube high precision", 8 on 910B: 32-byte blocks of float32).
* :data:`CANN_OPS`: the CANN op type ATC's ONNX parser maps an ONNX op to (reference §7), the names a real
  ``.om`` shows.

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

# Elementwise ops by their fusion class: the vector unit runs them on any layout, element by element
# (their attributes name no axis), and ATC fuses them into their producer (``fusion.fused_tensors``).
UNARY_ELEMENTWISE = frozenset({
    "Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "LeakyRelu",
    "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Floor", "Ceil", "Round",
    "Sign", "Gelu", "Mish", "Identity", "Clip", "ThresholdedRelu", "Sin", "Cos",
})
BINARY_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu", "Sum"})
# Format behaviour "follow" (FE's format-agnostic and broadcast ops): they run in their producer's
# format; FRACTAL_NZ when the other operands are (M, N), (1, N) or scalar (the planner's broadcast check).
FORMAT_AGNOSTIC = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Relu", "Sigmoid", "Tanh", "Clip",
    "HardSigmoid", "HardSwish", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "Erf", "Exp", "Log",
    "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Sign", "Softplus", "Softsign", "Mish",
    "ThresholdedRelu", "Sin", "Cos", "Cast", "Where", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf", "Shrink", "Trilu",
})

# ONNX ops the cube unit runs (their NC1HWC0 / FRACTAL_Z / FRACTAL_NZ operands follow :func:`cube_c0`):
# FE's cube list for the C0 refresh (ARefreshCubeC0FusionPass: Conv2D, Conv2DTransposeD, BatchMatMulV2,
# MatMulV2, AvgPool, AvgPoolV2, ...; ONNX AveragePool -> AvgPoolV2, GlobalAveragePool -> AvgPool)
CUBE_C0_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "AveragePool", "GlobalAveragePool"})


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


def cann_op(onnx_op: str) -> str:
    """The CANN op type for an ONNX op (the ONNX name when the parser keeps it)."""
    return CANN_OPS.get(onnx_op, onnx_op)
