"""The built-in lowering as named steps, each with a contract the runner checks.

``convert`` (built-in backend), the ONNX node-suite harness (``runtime.onnx_backend``) and ``profile
run`` all lower a model through :func:`lower` — the same steps, composed the same way:

=========================  ===================  ===========  ===========================================
step                       requires             ensures      checked after it ran
=========================  ===================  ===========  ===========================================
``ONNX from path``         —                    ``loaded``   every graph input and output has a dtype
``op support``             ``loaded``           ``support``  one report entry per node (gate: none
                                                             unsupported, ATC's opset range)
``plan from ONNX``         ``loaded, support``  ``plan``     :func:`check_plan_record`: every edge's
                                                             stored and read formats agree, or a planned
                                                             TransData converts between them
``bundle from plan``       ``loaded, plan``     ``bundle``   the written file reads back (checksums,
                                                             manifest validated, self-contained)
=========================  ===================  ===========  ===========================================

A broken ``ensures`` is a bug of ours (:class:`~npu_deploy.errors.InternalError`, exit 4); bad input
is reported by the step itself (``ModelError``/``InputError``, exit 2).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from npu_deploy.converters.formats.graph import same_format
from npu_deploy.converters.lowering.contracts import Step, run_steps  # noqa: F401  (the one pass framework)
from npu_deploy.converters.lowering.options import ConvertOptions
from npu_deploy.errors import InternalError
from npu_deploy.converters.files.bundle import read_bundle
from npu_deploy.converters.files.bundle import write_plan_bundle
from npu_deploy.converters.files.onnx_model import load_model
from npu_deploy.converters.lowering.planner import plan
from npu_deploy.converters.lowering.support import check_graph, check_support


@dataclasses.dataclass
class Lowering:
    """What the steps read and write."""

    options: ConvertOptions
    source: Path
    output: Path | None = None
    gate: bool = True                 # enforce ATC's op-support rules (the harness measures without)
    say: Callable[[str, float | None], None] | None = None  # progress (stage, fraction)
    loaded: Any = None
    support: Any = None
    plan: Any = None
    bundle: Path | None = None


# ------------------------------------------------------------------------------------------ steps
def _load(ctx: Lowering) -> None:
    o = ctx.options
    ctx.loaded = load_model(ctx.source, input_shapes=o.input_shapes, dynamic_batch=o.dynamic_batch,
                            dynamic_dims=o.dynamic_dims, out_nodes=o.out_nodes, output_type=o.output_type)


def _check_loaded(ctx: Lowering) -> None:
    for t in list(ctx.loaded.inputs) + list(ctx.loaded.outputs):
        if t.dtype is None:
            raise InternalError(f"pipeline: graph tensor {t.name!r} was loaded without a dtype")


def _support(ctx: Lowering) -> None:
    loaded, o = ctx.loaded, ctx.options
    if ctx.gate:
        ctx.support = check_support(loaded, o.soc, precision_mode=o.precision_mode)
        ctx.support.raise_if_unsupported(ctx.source.name)
        return
    opsets = {x.domain: x.version for x in loaded.model.opset_import}
    static = {} if loaded.gears else {**{i.name: i.shape for i in loaded.inputs}, **loaded.shapes}
    ctx.support = check_graph(loaded.model.graph, opsets, o.soc, dtypes=loaded.dtypes, static_shapes=static,
                              precision_mode=o.precision_mode)


def _plan(ctx: Lowering) -> None:
    o = ctx.options
    ctx.plan = plan(ctx.loaded, soc=o.soc, precision_mode=o.precision, keep_dtype=o.keep_dtype,
                    enable_small_channel=o.enable_small_channel, input_format=o.input_format,
                    support=ctx.support, cost_profile=o.cost_profile, op_info=o.op_info)


def _check_plan(ctx: Lowering) -> None:
    check_plan_record(ctx.plan, ctx.loaded.model.graph, set(ctx.loaded.constants))


def _write(ctx: Lowering) -> None:
    out = ctx.output or ctx.source.with_suffix(".bundle")
    write_plan_bundle(out, ctx.loaded, ctx.plan, support=ctx.support, progress=ctx.say)
    ctx.bundle = Path(out)


def _check_bundle(ctx: Lowering) -> None:
    # everything but the weight blob's checksum again: the writer hashed each chunk's very buffer just
    # before writing it (weight_stream.write_chunks), and reading the blob back straight after comes
    # from the page cache, so hashing it again would re-hash the same memory (0.4 s of CPU for a
    # 456 MiB blob). Header, graph and manifest checksums, every section's and weight's bounds and
    # alignment, the manifest's fields and the graph's self-containment are checked.
    with read_bundle(ctx.bundle, verify=False):
        pass


STEPS: dict[str, Step] = {s.name: s for s in (
    Step("ONNX from path", (), ("loaded",), _load, _check_loaded),
    Step("op support", ("loaded",), ("support",), _support),
    Step("plan from ONNX", ("loaded", "support"), ("plan",), _plan, _check_plan),
    Step("bundle from plan", ("loaded", "plan"), ("bundle",), _write, _check_bundle),
)}


def lower(source: str | Path, output: str | Path | None, options: ConvertOptions, *, gate: bool = True,
          say: Callable[[str, float | None], None] | None = None, until: str | None = None) -> Lowering:
    """Lower ``source`` with the built-in backend (every step, or up to and including ``until``)."""
    ctx = Lowering(options, Path(source), Path(output) if output is not None else None, gate, say)
    names = list(STEPS)
    if until is not None:
        names = names[: names.index(until) + 1]
    return run_steps([STEPS[n] for n in names], ctx, say)


def check_plan_record(plan: Any, graph, constants: set[str]) -> None:
    """The plan record's contract, checked on the record itself (what the emulator executes): for
    every edge, the format the producer writes equals the format the reader reads, or one planned
    TransData on that edge converts from the first to the second. Constants are converted at compile
    time and exempt; nodes the plan folded, or has no record for, read what they are given."""
    nf = plan.node_formats
    writes: dict[str, str] = {t.name: t.device_format for t in plan.inputs}
    edges: dict[tuple[str, str], Any] = {}
    for td in plan.transdata:
        for c in td.consumers:
            edges[(td.tensor, c)] = td

    def agree(t: str, reader: str, want: str | None) -> None:
        if t in constants or t not in writes:
            return
        have = writes[t]
        td = edges.get((t, reader))
        first = next((d for d in plan.transdata if d.name == td.after), None) if td is not None and td.after else None
        if first is not None:  # a chain of two (a C0 change through NCHW): the first reads what is stored
            if not same_format(first.src_format, have) or not same_format(first.dst_format, td.src_format):
                raise InternalError(f"plan: TransData {first.name} -> {td.name} on {t} -> {reader} converts "
                                    f"{first.src_format} -> {first.dst_format} -> {td.dst_format}, but {t} is "
                                    f"stored in {have}")
            have = td.src_format
        if td is not None:
            if not (same_format(td.src_format, have) and same_format(td.dst_format, want or "ND")):
                raise InternalError(f"plan: TransData {td.name} on {t} -> {reader} converts {td.src_format} -> "
                                    f"{td.dst_format}, but {t} is stored in {have} and read in {want}")
        elif not same_format(have, want or "ND"):
            raise InternalError(f"plan: {reader} reads {t} in {want} but it is stored in {have}, and no "
                                f"TransData converts it")

    for n in graph.node:  # topological order: every tensor is written before it is read
        rec = nf.get(n.name)
        if rec is None or rec.folded:
            continue
        for j, t in enumerate(n.input):
            if t and j < len(rec.input_formats):
                agree(t, n.name, rec.input_formats[j])
        for k, o in enumerate(n.output):
            if o and k < len(rec.output_formats):
                writes[o] = rec.output_formats[k]
    for t in plan.outputs:
        agree(t.name, "<graph output>", t.device_format)
