"""The planner's passes (first pick, propagation, round-trip cancellation, TransData insertion and the
plan's own check), If/Loop/Scan bodies, precision (node dtypes) and weight pre-packing. Run through the one
pass framework (:mod:`npu_deploy.converters.lowering.contracts`); see
:mod:`npu_deploy.converters.lowering.planner` for the stages in order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Iterable, Sequence

import numpy as np
import onnx
from onnx import helper

from npu_deploy.converters.lowering import opinfo, ops
from npu_deploy.converters.lowering.contracts import Step, run_steps
from npu_deploy.converters.lowering.plan_state import (C04, CUBE_OPS, HOST_LAYOUTS, MIX_PRECISION_FP32_OPS,
                                                       NC1HWC0, ND, NDC1HWC0, NZ, PRIVATE_5HD, NodeFormats,
                                                       PackedWeight, PlanState, TransData, _c0_for, _Node,
                                                       _numel, _same, display_format, is_plain, output_format,
                                                       formats_default_c0, plain_name, view_shape)
from npu_deploy.errors import InternalError
from npu_deploy.converters import formats

# ------------------------------------------------------------------------------------------------
# Passes
# ------------------------------------------------------------------------------------------------

class Pass:
    """A graph pass over a :class:`PlanState`. ``run`` returns True when it changed anything;
    ``requires`` are the state attributes it reads (set before it runs), ``check`` its guarantee,
    executed after it ran (:func:`~npu_deploy.converters.lowering.contracts.run_steps`)."""

    name: ClassVar[str] = "pass"
    requires: ClassVar[tuple[str, ...]] = ("nodes", "shapes")

    def run(self, state: PlanState) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def check(self, state: PlanState) -> None:
        """Every node has a format with a reason, and no node the kernel fixes has moved."""
        for n in state.nodes:
            if not n.fmt or not n.why:
                raise InternalError(f"planner: after {self.name}, node {n.node.name} has no format or no reason")
            if n.fixed and n.first is not None and n.fmt != n.first:
                raise InternalError(f"planner: {self.name} moved {n.node.name}, whose kernel fixes {n.first}, "
                                    f"to {n.fmt}")

    @classmethod
    def step(cls, log: list[tuple[str, bool]] | None = None) -> Step:
        """This pass as a :class:`~npu_deploy.converters.lowering.contracts.Step` (``log`` collects
        ``(name, changed)``)."""
        p = cls()

        def run(state: PlanState) -> None:
            changed = p.run(state)
            if log is not None:
                log.append((cls.name, changed))
        return Step(cls.name, cls.requires, (), run, p.check)


def run_passes(state: PlanState, passes: Sequence[type[Pass]], log: list[tuple[str, bool]] | None = None) -> None:
    """Run planner passes through the one pass framework (their contracts are checked)."""
    run_steps([cls.step(log) for cls in passes], state)


class AssignPreferredFormats(Pass):
    """Every node gets its kernel's preferred format (format-agnostic ones: ND)."""

    name = "assign-preferred-formats"

    def run(self, state: PlanState) -> bool:
        first_conv_done = False
        for n in state.nodes:
            fmt, why, fixed = ND, n.rule.note, False
            kind = n.rule.kind
            data = n.node.input[0] if n.node.input else ""
            r = state.rank(data) if data else 0
            if n.folded:
                why = "constant-folded at compile time"
                fixed = True
            elif kind == "5hd":
                if r == 4 or (r == 3 and n.node.op_type in ops.NC1HWC0_RANK3_OPS):
                    fmt, fixed = NC1HWC0, True
                elif r == 5 and n.node.op_type in ops.CANN_OPS_3D:
                    fmt, why, fixed = NDC1HWC0, n.rule.note.replace("NC1HWC0", "NDC1HWC0"), True
                else:
                    why = f"{n.node.op_type} on a rank-{r} tensor runs in ND"
                if (fmt == NC1HWC0 and n.node.op_type == "Conv" and state.enable_small_channel
                        and not first_conv_done and r == 4 and _feeds_from_input(state, data)):
                    w = state.shapes.get(n.node.input[1], ())
                    if (len(w) == 4 and w[1] <= 4 and w[2] > 1 and w[3] > 1
                            and int(_attr(n.node, "group", 1)) == 1):
                        fmt, n.c0_weight = C04, True
                        why = ("first conv with Cin <= 4, kh and kw > 1, groups = 1 (--enable-small-channel; "
                               "Conv2D op_select_format adds FRACTAL_Z_C04, ge-rules.md R6): NC1HWC0_C04")
                if n.node.op_type == "Conv":
                    first_conv_done = True
            elif kind == "matmul":
                a = state.rank(n.node.input[0])
                b = state.rank(n.node.input[1]) if len(n.node.input) > 1 else 0
                if a >= 2 and b >= 2:
                    fmt, why, fixed = _matmul_pick(state, n)
                else:
                    why = f"{n.node.op_type} with a 1-D operand runs in ND"
            else:
                fixed = kind == "nd"
            if not is_plain(fmt) and (no := opinfo.excluded(state.op_info, n.node.op_type, r, n.dtype, fmt)):
                fmt, why, fixed = opinfo.fallback(state.op_info, n.node.op_type, r, n.dtype, fmt), no, True
                n.c0_weight = n.c0_weight and fmt == C04
            n.fmt, n.why, n.fixed, n.first = fmt, why, fixed, fmt
        return True


def _matmul_pick(state: PlanState, n: _Node) -> tuple[str, str, bool]:
    """A MatMul/Gemm's first pick, as FE makes it per SoC (docs/ge-rules.md R2, R3): where the MatMul
    family is ``heavyOp`` (310, 310P, 310B, 910) the format-mode filter keeps FRACTAL_NZ columns only
    (``KFeFormatModeFilterOp``, default mode NZ); where it is not (910B, 910_93) no seed is planted and the
    default strategy keeps the origin format ND, which BatchMatMulV2 offers on fix-pipe SoCs or when
    m, k, n are multiples of 16 (``batch_matmul_v2.py`` op_select_format)."""
    cann = ops.cann_op(n.node.op_type)
    installed = opinfo.heavy(state.op_info, n.node.op_type)
    src = "FE op info" if installed is None else "installed op info"
    if ops.matmul_is_heavy(state.soc) if installed is None else installed:
        return NZ, (f"{cann} is a heavy op on {ops.soc_family(state.soc) or state.soc} ({src} heavyOp; "
                    f"format mode keeps FRACTAL_NZ): the cube reads 16x16 FRACTAL_NZ fractals"), True
    t = ops.traits(state.soc)
    a, b = state.shapes.get(n.node.input[0], ()), state.shapes.get(n.node.input[1], ())
    aligned = len(a) >= 2 and len(b) >= 2 and all(d > 0 and d % 16 == 0 for d in (a[-2], a[-1], b[-1]))
    if t.fix_pipe or aligned:
        why = "the fix-pipe offers ND columns" if t.fix_pipe else "m, k, n are multiples of 16"
        return ND, (f"{cann} is not a heavy op on {ops.soc_family(state.soc)} ({src}) and {why}: "
                    f"the default strategy keeps the origin format ND"), False
    return NZ, f"{cann} on {state.soc}: FRACTAL_NZ only (no ND column for these sizes)", True


def _feeds_from_input(state: PlanState, t: str) -> bool:
    """``t`` is a graph input, or computed from one by format-agnostic elementwise ops only."""
    seen = 0
    while seen < 16:
        if t in state.graph_inputs:
            return True
        p = state.producer.get(t)
        if p is None:
            return False
        n = state.nodes[p[0]]
        if n.rule.kind not in ("follow", "view"):
            return False
        acts = [i for i in n.node.input if state.is_activation(i)]
        if len(acts) != 1:
            return False
        t = acts[0]
        seen += 1
    return False


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def check_format(state: PlanState, n: _Node, fmt: str) -> str | None:
    """Can flexible node ``n`` run in ``fmt``? None if yes, else the reason why not."""
    if fmt in HOST_LAYOUTS:
        return f"{n.node.op_type} runs in the graph's layout, not the host layout {fmt}"
    if is_plain(fmt):
        return None
    if (no := opinfo.excluded(state.op_info, n.node.op_type, state.rank(n.node.input[0]) if n.node.input else 0,
                              n.dtype, fmt)):
        return no
    if n.fixed:
        return f"{n.node.op_type} {n.node.name} must run in {n.fmt} ({n.why})"
    kind = n.rule.kind
    outs = [o for o in n.node.output if o]
    out_shape = state.shapes.get(outs[0], ()) if outs else ()
    if kind == "follow":
        return _check_broadcast(state, n, fmt, out_shape)
    if kind == "concat":
        return _check_concat(state, n, fmt, out_shape)
    if kind == "reduce":
        return _check_reduce(state, n, fmt)
    if kind == "slice":
        return _check_slice(state, n, fmt)
    if kind == "lastaxis":
        if fmt != NZ:
            return f"{n.node.op_type} takes ND or FRACTAL_NZ, not {fmt}"
        r = len(out_shape)
        axis = int(_attr(n.node, "axis", -1))
        if n.node.op_type == "Softmax" and state.loaded.opset < 13:
            axis = int(_attr(n.node, "axis", 1))
            if axis % max(r, 1) != r - 1:
                return f"{n.node.op_type} at opset < 13 flattens from axis {axis}: not the last axis only"
        if r < 2 or axis % r != r - 1:
            return f"{n.node.op_type} normalises over axis {axis}, not the last axis of a rank-{r} tensor"
        return None
    if kind == "view":
        src = n.node.input[0]
        in_shape = state.shapes.get(src, ())
        if n.node.op_type in ("Identity", "Dropout"):
            return None
        if fmt != NZ:
            return f"{n.node.op_type} regroups axes, which {fmt}'s C1/C0 split does not allow"
        if len(in_shape) < 2 or len(out_shape) < 2:
            return f"{n.node.op_type} output has rank < 2: nothing to keep in FRACTAL_NZ"
        if n.node.op_type == "Transpose":
            perm = list(_attr(n.node, "perm", list(range(len(in_shape)))[::-1]))
            r = len(perm)
            if perm[-2:] != [r - 2, r - 1]:
                pair = head_pair(state, n)
                if pair.kind:
                    return pair.reason
                return (f"Transpose perm {perm} moves the last two axes (the FRACTAL_NZ blocks), and it is "
                        f"not half of an attention head split/merge ({pair.reason})")
            return None
        if tuple(in_shape[-2:]) != tuple(out_shape[-2:]):
            pair = head_pair(state, n) if n.node.op_type == "Reshape" else None
            if pair is not None and pair.kind:
                return pair.reason
            return (f"{n.node.op_type} changes the last two axes {tuple(in_shape[-2:])} -> "
                    f"{tuple(out_shape[-2:])}, which FRACTAL_NZ blocks"
                    + (f", and it is not half of an attention head split/merge ({pair.reason})" if pair else ""))
        return None
    return f"{n.node.op_type} needs ND ({n.rule.note})"


@dataclasses.dataclass(frozen=True)
class HeadPair:
    """What :func:`head_pair` found. ``kind``: ``"split"`` (Reshape [.., S, H*D] -> [.., S, H, D] +
    Transpose to [.., H, S, D]), ``"split-kt"`` (the same Transpose to K^T [.., H, D, S], read by
    MatMul as its second operand), ``"merge"`` (Transpose [.., H, S, D] -> [.., S, H, D] + Reshape to
    [.., S, H*D]), or ``""`` (not such a pair). ``reason``: None when the pair may run in FRACTAL_NZ,
    else why not (or, for ``""``, which part of the pattern is missing)."""

    kind: str
    reason: str | None
    partner: str = ""


def _perm(node: onnx.NodeProto, rank: int) -> list[int]:
    return [int(a) for a in _attr(node, "perm", list(range(rank))[::-1])]


def _split_shapes(a: Sequence[int], b: Sequence[int]) -> tuple[int, int] | None:
    """(H, D) when ``a`` = P + (S, H*D) and ``b`` = P + (S, H, D), else None."""
    a, b = tuple(a), tuple(b)
    if len(b) != len(a) + 1 or len(a) < 2 or a[:-1] != b[:-2] or b[-2] * b[-1] != a[-1] or b[-2] < 1:
        return None
    return b[-2], b[-1]


def _live_consumers(state: PlanState, t: str) -> list[tuple[_Node, int]]:
    return [(state.nodes[k], j) for k, j in state.consumers.get(t, []) if not state.nodes[k].folded]


def _pair_ok(state: PlanState, kind: str, t: str, head_dim: int, partner: _Node) -> HeadPair:
    block = _c0_for(NZ, state.device_dtype(t))
    what = {"split": "attention head split", "split-kt": "attention head split to K^T",
            "merge": "attention head merge"}[kind]
    if head_dim % block:
        return HeadPair(kind, f"{what} with {partner.node.name}: head size {head_dim} is not a multiple of "
                              f"{block}, so FRACTAL_NZ's {block}-column fractals would straddle heads",
                        partner.node.name)
    return HeadPair(kind, None, partner.node.name)


def head_pair(state: PlanState, n: _Node) -> HeadPair:
    """Is ``n`` (a Reshape or Transpose) half of an attention head split or merge that FRACTAL_NZ
    holds as is? With the head size D a multiple of the fractal width, [.., S, H*D] in NZ and its
    split [.., H, S, D] in NZ have the same bytes (CANN fuses the pair as ConfusionTransposeD); K^T
    [.., H, D, S] is read by BatchMatMul as a transposed operand (``adj_x2``). The check looks at
    the pair, never at one node alone: each half alone regroups the fractal axes."""
    op = n.node.op_type
    src = n.node.input[0] if n.node.input else ""
    outs = [o for o in n.node.output if o]
    if not src or not outs:
        return HeadPair("", "no data input or output")
    in_shape, out_shape = tuple(state.shapes.get(src, ())), tuple(state.shapes.get(outs[0], ()))
    p = len(in_shape) - 3  # leading (batch) axes kept in place
    if op == "Reshape":
        hd = _split_shapes(in_shape, out_shape)
        if hd is not None:
            cons = _live_consumers(state, outs[0])
            if not cons or outs[0] in state.graph_outputs:
                return HeadPair("", "its output is not read by a Transpose only")
            kinds = set()
            for c, _ in cons:
                got = head_pair(state, c) if c.node.op_type == "Transpose" else HeadPair("", "")
                if not got.kind.startswith("split") or got.partner != n.node.name:
                    return HeadPair("", f"{c.node.op_type} {c.node.name} after it is not a head transpose")
                if got.reason is not None:
                    return got
                kinds.add(got.kind)
            return _pair_ok(state, sorted(kinds)[0], src, hd[1], cons[0][0])
        hd = _split_shapes(out_shape, in_shape)
        if hd is not None:
            pr = state.producer.get(src)
            prod = state.nodes[pr[0]] if pr else None
            if prod is None or prod.node.op_type != "Transpose":
                return HeadPair("", "it does not follow a head transpose")
            got = head_pair(state, prod)
            if got.kind != "merge":
                return HeadPair("", f"Transpose {prod.node.name} before it is not a head merge")
            return HeadPair("merge", got.reason, prod.node.name)
        return HeadPair("", f"Reshape {in_shape} -> {out_shape} neither splits the last axis into "
                            f"(heads, head size) nor merges them")
    if op != "Transpose" or len(in_shape) < 3:
        return HeadPair("", f"{op} is not a head split/merge transpose")
    perm = _perm(n.node, len(in_shape))
    head = list(range(p))  # P + (S, H, D) or P + (H, S, D): the last three axes move
    pr = state.producer.get(src)
    prod = state.nodes[pr[0]] if pr else None
    if perm in (head + [p + 1, p, p + 2], head + [p + 1, p + 2, p]) and prod is not None \
            and prod.node.op_type == "Reshape" and not prod.folded \
            and _split_shapes(state.shapes.get(prod.node.input[0], ()), in_shape) is not None \
            and all(c.node.op_type == "Transpose" for c, _ in _live_consumers(state, src)):
        kind = "split" if perm[-1] == p + 2 else "split-kt"
        if kind == "split-kt":
            readers = _live_consumers(state, outs[0])
            bad = [c for c, j in readers if c.node.op_type != "MatMul" or j != 1]
            if not readers or bad or outs[0] in state.graph_outputs:
                who = bad[0].node.name if bad else "a graph output"
                return HeadPair(kind, f"K^T split with {prod.node.name}: {who} does not read it as the "
                                      f"second MatMul operand (BatchMatMul adj_x2)", prod.node.name)
        return _pair_ok(state, kind, src, in_shape[-1], prod)
    if perm == head + [p + 1, p, p + 2]:
        cons = _live_consumers(state, outs[0])
        if cons and outs[0] not in state.graph_outputs and all(
                c.node.op_type == "Reshape" and _split_shapes(state.shapes.get(c.node.output[0], ()),
                                                              out_shape) is not None for c, _ in cons):
            return _pair_ok(state, "merge", src, in_shape[-1], cons[0][0])
    return HeadPair("", f"Transpose perm {perm} is not paired with a head Reshape")


def _reduce_axes(state: PlanState, n: _Node, rank: int) -> list[int] | None:
    """The axes a Reduce* node reduces (attribute, or the constant ``axes`` input of newer opsets);
    None when they are not known at compile time."""
    axes = _attr(n.node, "axes")
    if axes is None and len(n.node.input) > 1 and n.node.input[1]:
        if n.node.input[1] not in state.loaded.constants:
            return None
        axes = [int(a) for a in np.asarray(state.loaded.constant_array(n.node.input[1])).reshape(-1)]
    if axes is None or len(axes) == 0:
        return [] if int(_attr(n.node, "noop_with_empty_axes", 0)) else list(range(rank))
    return sorted({int(a) % max(rank, 1) for a in axes})


def _slice_axes(state: PlanState, n: _Node, rank: int) -> list[int] | None:
    """The axes a Slice cuts (attribute before opset 10, else the constant ``axes`` input; all leading
    axes when absent); None when they are not known at compile time."""
    if state.loaded.opset < 10:
        axes = _attr(n.node, "axes")
        count = len(_attr(n.node, "starts", []) or [])
    else:
        axes = None
        starts = n.node.input[1] if len(n.node.input) > 1 else ""
        if not starts or starts not in state.loaded.constants:
            return None
        count = int(np.asarray(state.loaded.constant_array(starts)).size)
        if len(n.node.input) > 3 and n.node.input[3]:
            if n.node.input[3] not in state.loaded.constants:
                return None
            axes = [int(a) for a in np.asarray(state.loaded.constant_array(n.node.input[3])).reshape(-1)]
    if axes is None:
        axes = list(range(count))
    return sorted({int(a) % max(rank, 1) for a in axes})


def _check_slice(state: PlanState, n: _Node, fmt: str) -> str | None:
    r = state.rank(n.node.input[0]) if n.node.input else 0
    axes = _slice_axes(state, n, r)
    if axes is None:
        return "Slice bounds are computed at run time"
    if fmt in (NC1HWC0, NDC1HWC0):
        if r != (5 if fmt == NDC1HWC0 else 4):
            return f"rank-{r} tensors cannot be held in {fmt}"
        if 1 in axes:
            return f"Slice cuts the channel axis, which {fmt} splits into C1 x C0 blocks"
        return None
    if fmt == NZ:
        if r < 2 or not set(axes) <= set(range(r - 2)):
            return f"Slice cuts axes {axes} of a rank-{r} tensor, which include FRACTAL_NZ's blocked last two axes"
        return None
    return f"Slice does not run in {fmt}"


def _check_reduce(state: PlanState, n: _Node, fmt: str) -> str | None:
    r = state.rank(n.node.input[0]) if n.node.input else 0
    if not int(_attr(n.node, "keepdims", 1)):
        return f"{n.node.op_type} with keepdims=0 drops axes, which regroups {fmt}'s blocks"
    axes = _reduce_axes(state, n, r)
    if axes is None:
        return f"{n.node.op_type} axes are computed at run time"
    if fmt in (NC1HWC0, NDC1HWC0):
        spatial = set(range(2, r))
        if r != (5 if fmt == NDC1HWC0 else 4):
            return f"rank-{r} tensors cannot be held in {fmt}"
        if not set(axes) <= spatial:
            return f"{n.node.op_type} reduces axes {axes}, not only the spatial axes {sorted(spatial)} of {fmt}"
        return None
    if fmt == NZ:
        if r < 2 or not set(axes) <= set(range(r - 2)):
            return (f"{n.node.op_type} reduces axes {axes} of a rank-{r} tensor, which include FRACTAL_NZ's "
                    f"blocked last two axes")
        return None
    return f"{n.node.op_type} does not run in {fmt}"


def _check_concat(state: PlanState, n: _Node, fmt: str, out_shape: Sequence[int]) -> str | None:
    # Constant inputs need no runtime conversion: they are packed into the weight blob in the node's
    # format at compile time (_plan_weights), as ATC does.
    r = len(out_shape)
    axis = int(_attr(n.node, "axis", 0)) % max(r, 1)
    ins = [t for t in n.node.input if t]
    if fmt in (NC1HWC0, NDC1HWC0):
        if r != (5 if fmt == NDC1HWC0 else 4):
            return f"rank-{r} tensors cannot be held in {fmt}"
        if axis != 1 or fmt == NC1HWC0:
            # ConcatD runs NC1HWC0 along C whatever the channel counts (ATC: 13 + 3 channels in NC1HWC0)
            return None
        block = _c0_for(fmt, state.device_dtype(ins[0]))
    elif fmt == NZ:
        if r < 2:
            return "rank < 2 cannot be held in FRACTAL_NZ"
        if axis < r - 2:
            return None
        block = 16 if axis == r - 2 else _c0_for(fmt, state.device_dtype(ins[0]))
    else:
        return f"Concat does not run in {fmt}"
    sizes = [state.shapes.get(t, (0,) * r)[axis] for t in ins]
    if all(sz % block == 0 for sz in sizes[:-1]):
        return None
    return (f"Concat joins along axis {axis}, which {fmt} pads to blocks of {block}, "
            f"and input sizes {sizes} are not all multiples of {block}")


def _check_broadcast(state: PlanState, n: _Node, fmt: str, out_shape: Sequence[int]) -> str | None:
    r = len(out_shape)
    if fmt in (NC1HWC0, C04) and r not in (3, 4):
        return f"output rank {r} cannot be held in {fmt}"
    if fmt == NDC1HWC0 and r != 5:
        return f"output rank {r} cannot be held in {fmt}"
    if fmt == NZ and r < 2:
        return "output rank < 2 cannot be held in FRACTAL_NZ"
    for t in n.node.input:
        if not t:
            continue
        s = tuple(state.shapes.get(t, ()))
        if _numel(s) == 1 or s == tuple(out_shape):
            continue
        const = not state.is_activation(t)
        aligned = (1,) * (r - len(s)) + s if len(s) <= r else None
        if aligned is None:
            return f"input {t} has a higher rank than the output"
        if fmt == NZ:
            # NZ holds an operand whose last two axes are the output's (M, N), broadcast only along the
            # outer axes, or a (1, N) row repeated over M (a bias row, an attention mask): the kernel
            # reuses the operand's one row of fractals per 16-row block. An activation operand is
            # converted to NZ by its own (small) TransData, counted like any other.
            if aligned[-2:] == tuple(out_shape[-2:]):
                continue
            if aligned[-2] == 1 and aligned[-1] == out_shape[-1]:
                continue
            what = "a constant" if const else "an activation"
            if aligned[-1] != out_shape[-1]:
                return (f"input {t} {s} ({what}) broadcasts along the last axis of {tuple(out_shape)} "
                        f"(N: {aligned[-1]} -> {out_shape[-1]}), which FRACTAL_NZ blocks into 16-column "
                        f"fractals; NZ takes only (M, N), (1, N) or scalar operands")
            return (f"input {t} {s} ({what}) broadcasts over the last two axes of {tuple(out_shape)} "
                    f"as (M, N) = {tuple(aligned[-2:])}, which FRACTAL_NZ blocks; NZ takes only "
                    f"(M, N), (1, N) or scalar operands")
        if fmt in PRIVATE_5HD:
            c = 1
            if aligned[c] != out_shape[c]:
                return (f"input {t} {s} broadcasts over the channel axis of {tuple(out_shape)}, "
                        f"which {fmt} splits into C1 x C0")
            continue
    return None


class PropagateFormats(Pass):
    """Format-agnostic nodes take the format of a producer when the node's check allows it."""

    name = "propagate-formats"

    def run(self, state: PlanState) -> bool:
        changed = False
        for n in state.nodes:
            if n.fixed or n.folded or n.rule.kind == "nd":
                continue
            cands = []
            for j, t in enumerate(n.node.input):
                if state.is_activation(t) and (n.rule.kind in ("follow", "concat") or j in n.rule.data_slots):
                    f = state.tensor_format(t)
                    if is_plain(f) or f in cands:
                        continue
                    if state.stored_c0(t) != state.read_c0(n.node.name, t, f):
                        # FE's heavy-format propagation does not start from a float32 cube op under cube
                        # high precision: its C0 = 8 output is another format to a C0 = 16 reader (R7)
                        state.explanations[(n.node.name, f)] = (
                            f"its producer writes {t} in {f} with C0 = {state.stored_c0(t)} (a float32 cube "
                            f"op under cube high precision), which {n.node.op_type} reads with C0 = "
                            f"{formats_default_c0(np.float32)}; FE does not propagate from such a cube op")
                        continue
                    cands.append(f)
            for f in cands:
                reason = check_format(state, n, f)
                if reason is None:
                    if n.fmt != f:
                        n.fmt, n.why, changed = f, f"follows its producer ({n.rule.note})", True
                    break
                state.explanations[(n.node.name, f)] = reason
        return changed


@dataclasses.dataclass(frozen=True)
class CancelRule:
    """A cancellation rule. ``pattern(state)`` yields candidate moves ``(nodes, fmt)``: a group of
    flexible nodes and a format to run them in; ``check`` says why the move is not allowed (or None);
    ``rewrite`` makes it. A move is kept only when it removes conversions (or, at the same count,
    bytes moved); the reason a move was refused is kept for ``--explain``."""

    name: str
    description: str
    pattern: Callable[[PlanState], Iterable[tuple[list[_Node], str]]]

    def check(self, state: PlanState, nodes: list[_Node], fmt: str) -> str | None:
        for n in nodes:
            why = check_format(state, n, fmt)
            if why is not None:
                return why
        return None

    def rewrite(self, state: PlanState, nodes: list[_Node], fmt: str) -> None:
        for n in nodes:
            n.fmt = fmt
            n.why = f"moved to {fmt} by rule {self.name} ({n.rule.note})"


def _flexible(n: _Node) -> bool:
    return not (n.fixed or n.folded or n.rule.kind == "nd")


def _touching(nodes: list[_Node]) -> list[str]:
    return list(dict.fromkeys(t for n in nodes for t in [*n.node.input, *n.node.output] if t))


def _boundary_formats(state: PlanState, nodes: list[_Node]) -> list[str]:
    """Formats on the other side of the conversions entering or leaving the group (plus ND)."""
    inside = {n.idx for n in nodes}
    fmt = nodes[0].fmt
    found: list[str] = []
    for n in nodes:
        slots = state.slot_formats(n)
        for j, t in enumerate(n.node.input):
            p = state.producer.get(t)
            if state.is_activation(t) and (p is None or p[0] not in inside) and \
                    not _same(slots[j], state.tensor_format(t)):
                found.append(ND if is_plain(state.tensor_format(t)) else state.tensor_format(t))
        for o in n.node.output:
            for consumer, req in (state.needs(o) if o else []):
                if not _same(req, output_format(fmt)):
                    found.append(ND if is_plain(req) else req)
    cands = [f for f in dict.fromkeys(found) if not _same(f, fmt) and f != C04]
    if not is_plain(fmt) and ND not in cands:
        cands.append(ND)
    return cands


def _single_node_moves(state: PlanState) -> Iterable[tuple[list[_Node], str]]:
    """X→Y→X around one flexible node: a conversion X→Y enters it and Y→X leaves it."""
    for n in state.nodes:
        if not _flexible(n):
            continue
        slots = state.slot_formats(n)
        ins = {state.tensor_format(t) for j, t in enumerate(n.node.input)
               if state.is_activation(t) and not _same(slots[j], state.tensor_format(t))}
        outs = {req for o in n.node.output if o for _, req in state.needs(o)
                if not _same(req, output_format(n.fmt))}
        cands = [f for f in ins if any(_same(f, o) for o in outs)]
        if not is_plain(n.fmt) and outs and all(is_plain(o) for o in outs) and ND not in cands:
            cands.append(ND)
        if any(f in HOST_LAYOUTS for f in ins):
            # host NHWC -> (this node) -> blocked consumer: running the node in the consumer's format
            # turns NHWC->NCHW plus NCHW->X into one direct NHWC->X
            cands += [o for o in dict.fromkeys(outs) if not is_plain(o) and o != C04 and o not in cands]
        for f in cands:
            yield [n], f


def _group_moves(state: PlanState) -> Iterable[tuple[list[_Node], str]]:
    """The same across a connected group of flexible nodes sharing one format (an elementwise chain
    between two conversions): run the whole group in the format on the other side."""
    seen: set[int] = set()
    for n in state.nodes:
        if n.idx in seen or not _flexible(n):
            continue
        group, todo = [], [n]
        seen.add(n.idx)
        while todo:
            m = todo.pop()
            group.append(m)
            near = [state.producer[t][0] for t in m.node.input if t in state.producer]
            near += [k for o in m.node.output if o for k, _ in state.consumers.get(o, [])]
            for k in near:
                other = state.nodes[k]
                if k not in seen and _flexible(other) and other.fmt == n.fmt:
                    seen.add(k)
                    todo.append(other)
        if len(group) < 2:
            continue
        group.sort(key=lambda x: x.idx)
        for f in _boundary_formats(state, group):
            yield group, f


CANCEL_RULES: tuple[CancelRule, ...] = (
    CancelRule("round-trip", "X→Y→X around a flexible node: run the node in X when that removes "
                             "conversions", _single_node_moves),
    CancelRule("group-round-trip", "X→Y ... Y→X around a chain of flexible nodes: run the chain in X "
                                   "when that removes conversions (or bytes)", _group_moves),
)


def _try_move(state: PlanState, rule: CancelRule, nodes: list[_Node], fmt: str, *, keep: bool) -> bool:
    """Apply a move if it lowers (conversions, bytes) on the touched tensors; undo it otherwise (or
    always, when ``keep`` is False). Returns whether it improved."""
    tensors = _touching(nodes)
    before = state.count_conversions(tensors)
    old = [(n.fmt, n.why) for n in nodes]
    rule.rewrite(state, nodes, fmt)
    after = state.count_conversions(tensors)
    better = after < before
    if not (better and keep):
        for n, (f, w) in zip(nodes, old):
            n.fmt, n.why = f, w
    if not better and keep:
        what = nodes[0].node.name if len(nodes) == 1 else f"{nodes[0].node.name} .. {nodes[-1].node.name}"
        for n in nodes:
            state.explanations.setdefault((n.node.name, fmt),
                                          f"moving {what} to {fmt} would not remove a conversion "
                                          f"({before[0]} now, {after[0]} after)")
    return better


class CancelRoundTrips(Pass):
    """Apply :data:`CANCEL_RULES` until no rule removes a conversion."""

    name = "cancel-round-trips"

    def run(self, state: PlanState) -> bool:
        # Each accepted move lowers (conversions, bytes) on the tensors touching the moved nodes, which
        # are the only ones a move can change: the total strictly decreases, so this terminates.
        changed_any = False
        for _ in range(len(state.nodes) + 1):
            changed = False
            for rule in CANCEL_RULES:
                for nodes, fmt in list(rule.pattern(state)):
                    if any(n.fmt == fmt for n in nodes):
                        continue  # an earlier move in this round already changed the group
                    why = rule.check(state, nodes, fmt)
                    if why is not None:
                        culprit = next(n for n in nodes if check_format(state, n, fmt) is not None)
                        for n in nodes:
                            state.explanations.setdefault(
                                (n.node.name, fmt), why if n is culprit else
                                f"it runs in one chain with {culprit.node.op_type} {culprit.node.name}, "
                                f"which cannot: {why}")
                        continue
                    changed |= _try_move(state, rule, nodes, fmt, keep=True)
            changed_any |= changed
            if not changed:
                break
        return changed_any


def insert_transdata(state: PlanState, *, shared: bool = True, naive: bool = False) -> list[TransData]:
    """TransData for the current formats: one per (tensor, target format, C0) when ``shared``, else one
    per consumer edge. ``naive``: every edge converts, each consumer on its own (the naive plan).

    A reader that takes the stored blocked format with another C0 (float32 between a cube op, C0 = 8
    under cube high precision, and a vector op, C0 = 16) gets two: stored format -> its plain origin
    format (NCHW), then -> the blocked format with the reader's C0; the second names the first in
    ``after``. To GE the two are different formats (C0 sits in the format word's high bits) with
    different shapes, so FE inserts through the origin format and does not merge the pair
    (docs/ge-rules.md R7)."""
    out: list[TransData] = []
    pairs: list[TransData] = []
    tensors = list(state.graph_inputs) + [o for n in state.nodes for o in n.node.output if o]
    for t in tensors:
        if not state.is_activation(t):
            continue
        src = state.tensor_format(t)
        have_c0 = state.stored_c0(t)
        groups: dict[tuple, list[str | None]] = {}
        c0_groups: dict[tuple, list[str | None]] = {}
        for consumer, req in state.needs(t):
            want_c0 = state.read_c0(consumer, t, req)
            if not _same(req, src):
                key: tuple = (req, want_c0)
                bucket = groups
            elif not is_plain(src) and src != C04 and want_c0 != have_c0:
                key, bucket = (req, want_c0), c0_groups
            else:
                continue
            if naive or not shared:
                key = key + (len(groups) + len(c0_groups),)
            bucket.setdefault(key, []).append(consumer)
        p = state.producer.get(t)
        prod = state.nodes[p[0]] if p else None
        shape = tuple(state.shapes.get(t, ()))
        rank = len(shape)
        mine: dict[tuple, TransData] = {}
        for key, consumers in groups.items():
            dst, want_c0 = key[0], key[1]
            td = _transdata(state, out, t, prod, consumers, src, dst, have_c0 if is_plain(dst) else want_c0,
                            state.storage_bytes(t, src), state.storage_bytes_c0(t, dst, want_c0))
            td.reason = ("naive plan: every boundary converts, once per consumer" if naive
                         else _reason(state, td, prod, consumers, src, dst))
            out.append(td)
            mine[key] = td
        origin = plain_name(rank) if rank in (4, 5) else ND
        for key, consumers in c0_groups.items():
            dst, want_c0 = key[0], key[1]
            first = None if (naive or not shared) else mine.get((ND, None))
            if first is None:
                first = _transdata(state, out, t, prod, [], src, origin, have_c0, state.storage_bytes(t, src),
                                   state.storage_bytes(t, origin))
                first.reason = ""
                out.append(first)
                if not (naive or not shared):
                    mine[(ND, None)] = first
            first.consumers.extend(c if c is not None else "<graph output>" for c in consumers)
            second = _transdata(state, pairs, t, prod, consumers, origin, dst, want_c0,
                                state.storage_bytes(t, origin), state.storage_bytes_c0(t, dst, want_c0))
            second.prev, second.after = first, first.name
            why = _c0_reason(state, prod, consumers, display_format(src, rank), have_c0, want_c0,
                             display_format(origin, rank))
            second.reason = "naive plan: " + why if naive else why
            if not first.reason:
                first.reason = second.reason
            pairs.append(second)
    # the second step of each pair after every first step (a reader of the list meets a chain in order)
    for td in pairs:
        td.name = f"trans_TransData_{len(out)}"
        out.append(td)
    return out


def _transdata(state: PlanState, out: list, t: str, prod: _Node | None, consumers, src: str, dst: str,
               c0: int | None, nbytes: int, dst_bytes: int) -> TransData:
    rank = len(state.shapes.get(t, ()))
    return TransData(
        name=f"trans_TransData_{len(out)}", tensor=t, producer=prod.node.name if prod else None,
        consumers=[c if c is not None else "<graph output>" for c in consumers],
        src_format=display_format(src, rank), dst_format=display_format(dst, rank),
        shape=tuple(state.shapes.get(t, ())), dtype=state.device_dtype(t).name, bytes=nbytes,
        dst_bytes=dst_bytes, c0=c0)


def _c0_reason(state: PlanState, prod: _Node | None, consumers, fmt: str, have: int | None, want: int | None,
               origin: str) -> str:
    dflt = formats_default_c0(np.float32)
    writer = (f"{ops.cann_op(prod.node.op_type)} {prod.node.name} writes {fmt} with C0 = {have or dflt}"
              if prod is not None else f"{fmt} with C0 = {have or dflt}")
    readers = ", ".join(f"{ops.cann_op(state.by_name[c].node.op_type)} {c}" for c in consumers if c in state.by_name)
    return (f"{writer}; {readers} read{'s' if len(consumers) == 1 else ''} it with C0 = {want or dflt} "
            f"(float32 cube ops store C0 = 8 under cube high precision, other ops C0 = {dflt}): two formats to "
            f"GE with different shapes, so FE converts through the origin format {origin} "
            f"({fmt}(C0 {have or dflt}) -> {origin} -> {fmt}(C0 {want or dflt})) and does not merge the pair "
            f"(ge-rules R7)")


def _reason(state: PlanState, td: TransData, prod: _Node | None, consumers, src: str, dst: str) -> str:
    by_name = state.by_name
    parts = []
    if prod is None:
        parts.append(f"graph input {td.tensor} arrives in the user's format {td.src_format}")
    else:
        parts.append(f"{prod.node.op_type} {prod.node.name} produces {td.src_format} ({prod.why})")
    for c in consumers:
        if c is None:
            parts.append(f"graph output {td.tensor} goes back in the user's format {td.dst_format}")
            continue
        n = by_name[c]
        parts.append(f"{n.node.op_type} {c} needs {td.dst_format} ({n.why})")
        why = state.explanations.get((c, src))
        if why:
            parts.append(f"{c} cannot take {td.src_format}: {why}")
    if prod is not None:
        why = state.explanations.get((prod.node.name, dst))
        if why:
            parts.append(f"{prod.node.name} cannot produce {td.dst_format}: {why}")
    return "; ".join(parts) + " (a TransData where the two ends' formats differ, ge-rules R8)"


def verify_plan(state: PlanState, transdata: list[TransData], node_formats: dict[str, NodeFormats] | None = None,
                weights: Sequence[PackedWeight] = ()) -> None:
    """Check the plan's guarantees; raise ``InternalError`` (a bug) when one does not hold.

    The contract a plan-executing emulator relies on: every tensor is stored in its producer's output
    format (graph inputs: the host format); every consumer slot reads it in exactly that format unless
    one planned TransData on (tensor, consumer) converts it to the slot's format; constants are read in
    their packed format (ND when not packed); graph outputs leave in a plain layout. Checked for every
    slot of every node (``node_formats``, as written to the manifest) when given, else for the
    slots that carry a runtime requirement.
    """
    by_edge: dict[tuple[str, str], list[TransData]] = {}
    by_name = {td.name: td for td in transdata}
    for td in transdata:
        if _same(td.src_format, td.dst_format):
            raise InternalError(f"plan: {td.name} on {td.tensor} converts {td.src_format} to itself")
        if td.after is not None:  # the second step of a chain: reads the first step's result
            prev = by_name.get(td.after)
            if (prev is None or prev.tensor != td.tensor or prev.after is not None
                    or not _same(prev.dst_format, td.src_format) or not set(td.consumers) <= set(prev.consumers)):
                raise InternalError(f"plan: {td.name} on {td.tensor} follows {td.after}, which does not "
                                    f"convert {td.tensor} to {td.src_format} for the same readers")
        elif not _same(td.src_format, display_format(state.tensor_format(td.tensor), state.rank(td.tensor))):
            raise InternalError(f"plan: {td.name} reads {td.tensor} as {td.src_format}, stored as "
                                f"{state.tensor_format(td.tensor)}")
        for c in dict.fromkeys(td.consumers):  # a node reading t at two slots is listed twice
            by_edge.setdefault((td.tensor, c), []).append(td)
    for (t, c), tds in by_edge.items():  # one TransData per edge, or one chain of two
        if len(tds) > 2 or (len(tds) == 2 and tds[1].after != tds[0].name):
            raise InternalError(f"plan: edge {t} -> {c} has more than one TransData")
    for n in state.nodes:
        if n.fmt is None:
            raise InternalError(f"plan: node {n.node.name} has no format")

    def arrives(t: str, consumer: str) -> str:
        tds = by_edge.get((t, consumer))
        return tds[-1].dst_format if tds else display_format(state.tensor_format(t), state.rank(t))

    def arrives_c0(t: str, consumer: str) -> int | None:
        tds = by_edge.get((t, consumer))
        return tds[-1].c0 if tds else state.stored_c0(t)

    for t in list(state.graph_inputs) + [o for n in state.nodes for o in n.node.output if o]:
        if not state.is_activation(t):
            continue
        for consumer, req in state.needs(t):
            got = arrives(t, consumer if consumer is not None else "<graph output>")
            if not _same(got, req):
                raise InternalError(f"plan: edge {t} -> {consumer} gets {got} but needs {req}")
            if not is_plain(req) and req != C04 and consumer is not None:
                have, want = arrives_c0(t, consumer), state.read_c0(consumer, t, req)
                if have != want:
                    raise InternalError(f"plan: edge {t} -> {consumer} arrives in {req} with C0 = {have} but is "
                                        f"read with C0 = {want} (None: the dtype's default)")
    for o in state.graph_outputs:
        if state.is_activation(o) and not is_plain(arrives(o, "<graph output>")):
            raise InternalError(f"plan: graph output {o} leaves in {arrives(o, '<graph output>')}")
    if node_formats is None:
        return
    packed = {w.name: w.format for w in weights}
    for n in state.nodes:
        nf = node_formats.get(n.node.name)
        if nf is None or len(nf.input_formats) != len(n.node.input):
            raise InternalError(f"plan: node {n.node.name} has no slot formats")
        if n.folded:
            continue  # computed at compile time: reads nothing at run time
        for k, o in enumerate(n.node.output):
            if o and state.is_activation(o) and not _same(nf.output_formats[k], state.tensor_format(o)):
                raise InternalError(f"plan: {n.node.name} writes output {k} ({o}) as {nf.output_formats[k]}, "
                                    f"but it is stored as {state.tensor_format(o)}")
        for j, t in enumerate(n.node.input):
            want = nf.input_formats[j]
            if not t:
                continue
            got = arrives(t, n.node.name) if state.is_activation(t) else packed.get(t, ND)
            if want is None or not _same(got, want):
                raise InternalError(f"plan: {n.node.name} reads input {j} ({t}) as {want}, but it arrives "
                                    f"as {got}")
    # "No cancellable pair left" holds by construction: CancelRoundTrips stops only after a full round
    # of every rule found no improving move (tests check it independently on the TransData list).


PIPELINE: tuple[type[Pass], ...] = (AssignPreferredFormats, PropagateFormats, CancelRoundTrips)


# ------------------------------------------------------------------------------------------------
# If / Loop / Scan bodies
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Body:
    """One planned If/Loop/Scan body: ``owner`` node, the attribute holding it, its own state, its
    TransData (optimised and naive). Bodies are planned like graphs of their own: an outer tensor
    they read arrives as it is stored outside (a body op that needs another format has its TransData
    inside the body, consumer = that op), the body's formal inputs arrive in ND, and its outputs
    leave in ND (TransData consumer ``<graph output>`` on a body tensor: back to the owner)."""

    owner: str
    attr: str
    state: "PlanState"
    transdata: list[TransData]
    naive: list[TransData]


class _BodyModel:
    """The part of a ``LoadedModel`` a :class:`PlanState` reads, for one body graph. Shapes and dtypes
    are the model's (body tensors included: ``onnx_model`` sizes them per branch). Constants inside
    bodies are read as they are (ND): the weight blob holds the top-level graph's constants only."""

    def __init__(self, loaded, body: onnx.GraphProto, outer: Sequence[str]):
        import types

        self.model = types.SimpleNamespace(graph=body)
        self.path = loaded.path
        self.shapes = loaded.shapes
        self.dtypes = loaded.dtypes
        self.gears = loaded.gears
        self.opset = loaded.opset
        self.data_dependent = list(getattr(loaded, "data_dependent", ()))
        self.non_tensors = dict(getattr(loaded, "non_tensors", {}))
        self.constants: dict = {}
        self.warnings: list[str] = []
        names = [i.name for i in body.input] + [t for t in outer if t not in {i.name for i in body.input}]
        self.inputs = [types.SimpleNamespace(name=t, shape=tuple(loaded.shapes.get(t, ()))) for t in names]

    def constant_array(self, name: str) -> np.ndarray:
        raise KeyError(name)


def _support_below(support, prefix: str):
    """The op-support entries of one body (``check_graph`` names them ``<owner>/<attr>/<node>``)."""
    import types

    return types.SimpleNamespace(nodes=[dataclasses.replace(s, name=s.name[len(prefix):]) for s in support.nodes
                                        if s.name.startswith(prefix)])


def plan_bodies(state: PlanState, support, prefix: str = "") -> None:
    """Plan every If/Loop/Scan body of ``state``'s nodes (nested ones too) into ``state.bodies``."""
    for n in state.nodes:
        if n.folded:
            continue
        for a in n.node.attribute:
            if a.type != onnx.AttributeProto.GRAPH:
                continue  # GRAPHS attributes belong to no standard op
            body = a.g
            outer = sorted(_body_reads(body))
            outer_const = {t for t in outer if t in state.const}
            sub_prefix = f"{prefix}{n.node.name}/{a.name}/"
            sub = PlanState(_BodyModel(state.loaded, body, [t for t in outer if t not in outer_const]),
                            _support_below(support, sub_prefix), precision_mode=state.precision_mode,
                            keep_dtype=(), enable_small_channel=False, input_format=None,
                            outer_const=outer_const, soc=state.soc, op_info=state.op_info)
            # the boundary: an outer tensor enters the body as it is stored outside (no conversion at
            # the owner); a body op that wants another format gets its TransData inside the body
            for t in outer:
                if t not in outer_const and state.is_activation(t):
                    sub.host_formats[t] = state.tensor_format(t)
            _assign_dtypes(sub)
            run_passes(sub, PIPELINE[:1])
            naive = insert_transdata(sub, naive=True)
            run_passes(sub, PIPELINE[1:])
            transdata = insert_transdata(sub, shared=True)
            verify_plan(sub, transdata, _node_formats(sub, []), [])
            plan_bodies(sub, support, sub_prefix)
            state.bodies.append(Body(n.node.name, a.name, sub, transdata, naive))


def _body_reads(body: onnx.GraphProto) -> set[str]:
    """Outer names one body reads (nested bodies included)."""
    return _graph_reads([body])


def all_bodies(state: PlanState) -> list[Body]:
    """Every planned body below ``state``, depth first."""
    out: list[Body] = []
    for b in state.bodies:
        out.append(b)
        out.extend(all_bodies(b.state))
    return out


# ------------------------------------------------------------------------------------------------
# Precision, weights
# ------------------------------------------------------------------------------------------------

def _assign_dtypes(state: PlanState) -> None:
    mode = state.precision_mode
    for n in state.nodes:
        outs = [o for o in n.node.output if o]
        dt = state.dtypes.get(outs[0], np.dtype(np.float32)) if outs else np.dtype(np.float32)
        ins = [state.dtypes.get(i) for i in n.node.input if i]
        floaty = dt == np.float32 or (n.node.op_type in CUBE_OPS and any(d == np.float32 for d in ins if d))
        if not floaty or n.folded:
            n.dtype = dt.name
            continue
        if mode == "must_keep_origin_dtype" or n.idx in state.keep_dtype:
            n.dtype = "float32"
        elif mode == "force_fp16":
            n.dtype = "float16"
        elif mode == "allow_mix_precision":
            n.dtype = "float32" if n.node.op_type in MIX_PRECISION_FP32_OPS else "float16"
        elif mode == "allow_fp32_to_fp16":
            n.dtype = "float16" if (n.node.op_type in CUBE_OPS or n.fp16_only) else "float32"
        else:  # pragma: no cover - validated by plan()
            raise InternalError(f"precision mode {mode}")


def _operand_constants(state: PlanState) -> Iterable[tuple[_Node, str, tuple]]:
    """Constant operands of elementwise ops and Concat running in a blocked format: converted once at
    compile time into the node's format (a (1, C, 1, 1) scale in NC1HWC0, a bias row in FRACTAL_NZ, a
    Concat constant), never by a runtime TransData. Scalars are read as they are (ND). A constant of
    lower rank is packed with the output's rank (leading 1s, as ONNX broadcasting aligns it)."""
    for n in state.nodes:
        if n.folded or is_plain(n.fmt) or n.rule.kind not in ("follow", "concat"):
            continue
        outs = [o for o in n.node.output if o]
        r = state.rank(outs[0]) if outs else 0
        for t in n.node.input:
            ref = state.loaded.constants.get(t) if t else None
            if ref is None or ref.dtype.kind != "f" or _numel(ref.shape) == 1 or len(ref.shape) > r:
                continue
            aligned = (1,) * (r - len(ref.shape)) + tuple(int(d) for d in ref.shape)
            dt = np.dtype(np.float16) if n.dtype == "float16" and ref.dtype == np.float32 else ref.dtype
            fmt = output_format(n.fmt)
            yield n, t, (fmt, view_shape(fmt, aligned), 1, "ND" if fmt == NZ else None, dt.name)


def _plan_weights(state: PlanState) -> list[PackedWeight]:
    wanted: dict[str, list[tuple[_Node, tuple]]] = {}
    for n in state.nodes:
        ws = n.rule.weight_slot
        if ws is None or n.folded or n.fmt == ND or ws >= len(n.node.input):
            continue
        t = n.node.input[ws]
        if not t or t not in state.loaded.constants:
            continue
        ref = state.loaded.constants[t]
        if ref.dtype.kind != "f":
            continue
        shape = ref.shape
        groups = int(_attr(n.node, "group", 1)) if n.node.op_type in ("Conv", "ConvTranspose") else 1
        if n.node.op_type in ("Conv", "ConvTranspose"):
            if n.fmt == NDC1HWC0 and len(shape) == 5:
                spec = ("FRACTAL_Z_3D", shape, groups, "NCDHW")
            elif n.fmt == C04 and len(shape) == 4:
                spec = ("FRACTAL_Z_C04", shape, 1, "NCHW")
            elif len(shape) == 4:
                spec = ("FRACTAL_Z", shape, groups, "NCHW")
            elif len(shape) == 3:
                spec = ("FRACTAL_Z", (shape[0], shape[1], 1, shape[2]), groups, "NCHW")
            else:
                continue
            if n.node.op_type == "ConvTranspose" and groups != 1:
                continue  # grouped deconvolution weights: kept as given (layout not modelled)
        else:  # MatMul / Gemm B
            if len(shape) == 2:
                spec = ("FRACTAL_Z", shape, 1, "ND")
            elif len(shape) > 2:
                spec = (NZ, shape, 1, "ND")
            else:
                continue
        dt = np.dtype(np.float16) if n.dtype == "float16" and ref.dtype == np.float32 else ref.dtype
        wanted.setdefault(t, []).append((n, spec + (dt.name,)))
    for n, t, spec in _operand_constants(state):
        wanted.setdefault(t, []).append((n, spec))
    out = []
    for t, uses in wanted.items():
        specs = {s for _, s in uses}
        all_uses = [k for k, _ in state.consumers.get(t, [])]
        if len(specs) != 1 or len(all_uses) != len(uses) or t in state.graph_outputs:
            continue  # used in two layouts, or also by another op: keep the plain constant
        fmt, shape, groups, origin, dtname = specs.pop()
        dt = np.dtype(dtname)
        cube = all(n.node.op_type in ops.CUBE_C0_OPS for n, _ in uses)
        c0 = 4 if fmt == "FRACTAL_Z_C04" else (ops.cube_c0(state.soc, dt) if cube else formats.default_c0(dt))
        try:
            nbytes = formats.nbytes(fmt, shape, dt, c0=c0 if fmt != "FRACTAL_Z_C04" else None,
                                    groups=groups, origin=origin)
        except Exception:
            continue  # a shape the format cannot hold: keep it plain
        ref = state.loaded.constants[t]
        out.append(PackedWeight(t, fmt, tuple(shape), tuple(ref.shape), dt.name, ref.dtype.name,
                                None if fmt == "FRACTAL_Z_C04" else c0, groups, origin,
                                [n.node.name for n, _ in uses], int(nbytes)))
    return out


def _node_formats(state: PlanState, weights: list[PackedWeight]) -> dict[str, NodeFormats]:
    """Each node's slot formats, literally: the format the node reads each input in (an activation
    slot with no requirement, e.g. a broadcast scalar, reads the tensor as it is stored; a constant
    reads its packed format, else ND) and the format it writes each output in."""
    packed = {w.name: w for w in weights}
    out: dict[str, NodeFormats] = {}
    for n in state.nodes:
        slots = state.slot_formats(n)
        ins: list[str | None] = []
        for j, t in enumerate(n.node.input):
            if not t:
                ins.append(None)
            elif t in packed:
                ins.append(packed[t].format)
            elif not state.is_activation(t):
                ins.append(plain_name(state.rank(t)))
            else:
                f = slots[j] if slots[j] is not None else state.tensor_format(t)
                ins.append(display_format(f, state.rank(t)))
        outs = [display_format(output_format(n.fmt), state.rank(o)) for o in n.node.output]
        out[n.node.name] = NodeFormats(n.node.op_type, n.engine, ins, outs, n.dtype, state.node_c0(n),
                                       n.folded, n.why)
    return out


def _graph_reads(graphs: Sequence[onnx.GraphProto]) -> set[str]:
    reads: set[str] = set()
    defined: set[str] = set()

    def walk(g: onnx.GraphProto) -> None:
        defined.update(i.name for i in g.input)
        defined.update(t.name for t in g.initializer)
        for sub in g.node:
            reads.update(i for i in sub.input if i)
            defined.update(o for o in sub.output if o)
            for body in _subgraphs(sub):
                walk(body)

    for body in graphs:
        walk(body)
    return reads - defined


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            graphs.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(a.graphs)
    return graphs
