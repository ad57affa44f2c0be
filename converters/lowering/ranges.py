"""Shape ranges on the built-in path: plan once for every shape in ``x:1~4,3,224,224``.

ATC builds a truly dynamic model for a range; the built-in lowering plans for it without touching the
planner: the model is planned at the **largest** shape of the range (the memory plan and buffer sizes
are the largest's, as ATC sizes a range model's buffers for its upper bound) and at the **smallest**.
The formats of every node and tensor must agree at the two ends — format choice depends on the
dimensions only through divisibility and size thresholds that, for the dims the ranges cover, the two
ends bracket (see *Limits*) — else the range is refused naming the first tensor whose format differs,
and gears are the way out. The cost is estimated at both ends and reported in the plan's notes.

The bundle records the ranges in ``manifest["dynamic"] = {"mode": "range", "gears": [], "ranges":
{input: [[low, high] | dim, ...]}}`` (``{"x": [[1, 4], 3, 224, 224]}``); its inputs (and the outputs
whose dims change across the range) have ``-1`` there, so the emulator runs any shape, and the session refuses one outside a range, naming
the input and the range (exit 2).

*Limits*: a format that is valid at both ends but not at a shape in between is not detected (no format
rule of the planner depends on a batch or spatial size that way today); data-dependent shapes are sized
at run time as for gears.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from npu_deploy.converters.files.onnx_model import declared_io, fmt_range_shape
from npu_deploy.converters.lowering import opinfo, pipeline
from npu_deploy.errors import InputError


def range_shapes(shapes: Mapping[str, Sequence[int]], ranges: Mapping[str, Sequence[Any]], end: int
                 ) -> dict[str, tuple[int, ...]]:
    """``shapes`` with every ranged dim at its low (``end=0``) or high (``end=1``) bound.

    >>> range_shapes({"x": (4, 3)}, {"x": ((1, 4), None)}, 0)
    {'x': (1, 3)}
    """
    out = {n: tuple(s) for n, s in shapes.items()}
    for name, rng in ranges.items():
        out[name] = tuple(r[end] if r else d for d, r in zip(out[name], rng))
    return out


def describe(shapes: Mapping[str, Sequence[int]], ranges: Mapping[str, Sequence[Any]]) -> str:
    return "; ".join(f"{n}:{fmt_range_shape([-1 if r else d for d, r in zip(shapes[n], rng)], rng)}"
                     for n, rng in ranges.items())


def plan_for_range(ctx: pipeline.Lowering, say: Callable[[str, float | None], None] | None = None) -> None:
    """Plan ``ctx`` (loaded at the largest shape of ``ctx.options.shape_ranges``, op support checked)
    for the whole range: ``ctx.plan`` is the largest's plan, marked dynamic where the range varies."""
    o = ctx.options
    if o.op_info is not None and not isinstance(o.op_info, opinfo.OpInfo):
        # both ends are planned: read the installed op info once for the two
        installed = opinfo.resolve(o.op_info, o.soc)[0]
        if installed is not None:
            o = ctx.options = dataclasses.replace(o, op_info=installed)
    ranges = dict(o.shape_ranges or {})
    shown = describe(o.input_shapes, ranges)
    unbounded = [n for n, rng in ranges.items() if any(r and r[1] == -1 for r in rng)]
    if unbounded:
        raise InputError(f"shape range {shown}: the built-in lowering needs an upper bound to plan memory for",
                         hint="give LOW~HIGH with a HIGH (e.g. 1~8), or use ATC")
    if o.insert_op_conf is not None:
        raise InputError("--insert-op-conf with shape ranges is not implemented by the built-in lowering",
                         hint="fix the input shapes with --input-shape")
    low = range_shapes(o.input_shapes, ranges, 0)
    small = pipeline.lower(ctx.source, None, dataclasses.replace(o, input_shapes=low, shape_ranges=None),
                           gate=ctx.gate, say=say, until="plan from ONNX").plan
    # loaded as a two-gear model (the range's ends): the graph keeps the ranged dims symbolic, every
    # tensor is sized at the largest, and the smallest must infer too (onnx_model.load_model's gears)
    order = [i.name for i in declared_io(ctx.source)[0]]
    slots = [(n, k) for n in order if n in ranges for k, r in enumerate(ranges[n]) if r]
    open_shapes = {n: tuple(-1 if n in ranges and ranges[n][k] else d for k, d in enumerate(s))
                   for n, s in o.input_shapes.items()}
    ends = [[ranges[n][k][e] for n, k in slots] for e in (0, 1)]
    geared = dataclasses.replace(o, input_shapes=open_shapes, shape_ranges=None, dynamic_dims=ends)
    two = pipeline.lower(ctx.source, None, geared, gate=ctx.gate, say=say, until="op support")
    ctx.loaded, ctx.support = two.loaded, two.support
    pipeline.run_steps([pipeline.STEPS["plan from ONNX"]], ctx, say)
    big = ctx.plan
    for name, nf in big.node_formats.items():
        other = small.node_formats.get(name)
        if other is None or (other.input_formats, other.output_formats, other.dtype) != \
                (nf.input_formats, nf.output_formats, nf.dtype):
            have = "not planned" if other is None else f"{other.input_formats} -> {other.output_formats}"
            raise InputError(f"shape range {shown}: node {name} ({nf.op_type}) runs with {have} at the smallest "
                             f"shape and {nf.input_formats} -> {nf.output_formats} at the largest, so one plan "
                             f"cannot serve the whole range", hint="give gears instead (--dynamic-batch / "
                                                                  "--dynamic-dims), each planned on its own")
    for t_big, t_small in zip(list(big.inputs) + list(big.outputs), list(small.inputs) + list(small.outputs)):
        t_big.shape = tuple(a if a == b else -1 for a, b in zip(t_big.shape, t_small.shape))
        if t_big.graph_shape is not None and t_small.graph_shape is not None:
            t_big.graph_shape = tuple(a if a == b else -1 for a, b in zip(t_big.graph_shape, t_small.graph_shape))
    big.report.notes = [n for n in big.report.notes if not n.startswith("sizes and times at the largest of")]
    big.dynamic = {"mode": "range", "gears": [],
                   "ranges": {n: [list(r) if r else d for d, r in zip(o.input_shapes[n], rng)]
                              for n, rng in ranges.items()}}
    if big.cost is not None and small.cost is not None:
        big.report.notes.append(f"shape range {shown}: estimated {small.cost.total_us:.1f} us per inference at "
                                f"the smallest shape, {big.cost.total_us:.1f} us at the largest; memory planned "
                                f"for the largest")
    else:
        big.report.notes.append(f"shape range {shown}: memory planned for the largest shape")
