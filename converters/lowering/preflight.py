"""The float16 preflight: before a float16 model is deployed, find the tensors float16 cannot hold.

Under a float16 precision mode (``force_fp16``, ``allow_fp32_to_fp16``, ``allow_mix_precision``…) the
plan stores and computes most float32 tensors in float16, whose largest finite value is 65504. A model
whose activations grow past that (the onnx wheel's ``light_*`` CNNs reach 9e4 by conv4 and 3.7e12 by
fc8) converts without a word and then every output is NaN. :func:`fp16_preflight` runs the original
model once in float32 (onnxruntime, every intermediate tensor exposed) on the inputs it is given and,
for every node the plan runs in float16, reports:

* **overflow** — a float32 input or output whose largest magnitude exceeds :data:`FP16_MAX` (it
  becomes ±inf in float16, and NaN after the next subtraction or multiplication by zero);
* **underflow** — an output whose float16 rounding alone changes it by more than
  :data:`REL_ERROR_BOUND` in relative L2 norm (values below float16's normal range, 6.1e-5, lose
  their digits and flush to 0 below 6e-8).

The first flagged node whose own inputs are all fine is where the trouble **starts**; every flagged
node is in the keep list (:attr:`PreflightReport.keep`), the ``--keep-dtype`` list ``debug precision``
would start from: keeping a node in float32 makes both its computation and its stored output float32,
so a consumer of an overflowing tensor has to be kept too (it would read the tensor in float16).

The inputs are given by the caller (this layer does not generate them: the compare input generator
lives in the runtime, ``runtime.check.preflight`` wires the two together for ``convert``). The
preflight reads, it never changes the plan or the bundle.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from npu_deploy._result import Result
from npu_deploy.converters.files.onnx_model import name_nodes
from npu_deploy.errors import ModelError

#: float16's largest finite value
FP16_MAX = float(np.finfo(np.float16).max)
#: the relative L2 error float16 storage may add to one tensor before it is reported
REL_ERROR_BOUND = 1e-2
#: precision modes under which (some) float32 compute runs in float16
FP16_MODES = ("force_fp16", "allow_fp32_to_fp16", "allow_mix_precision", "allow_mix_precision_fp16",
              "cube_fp16in_fp32out")


def needs_preflight(precision_mode: str | None) -> bool:
    """True when ``precision_mode`` (None: ATC's default, ``force_fp16``) computes in float16.

    >>> needs_preflight(None), needs_preflight("must_keep_origin_dtype")
    (True, False)
    """
    return (precision_mode or "force_fp16") in FP16_MODES


@dataclasses.dataclass
class PreflightReport(Result):
    """What the float16 preflight found. Truthy when nothing was flagged.

    ``flagged``: one entry per flagged node in topological order (``node``, ``op_type``, ``tensor``,
    ``max_abs``, ``rel_error``, ``reason``: ``"overflow"`` / ``"underflow"``, ``starts``: True where the
    trouble starts). ``keep``: the node names to keep in float32. ``command``: the convert command
    line that keeps them."""

    SCHEMA: ClassVar[str] = "npu-deploy/fp16-preflight"
    SCHEMA_VERSION: ClassVar[int] = 1

    model: str
    precision_mode: str
    samples: int
    checked_nodes: int
    flagged: list = dataclasses.field(default_factory=list)
    keep: list = dataclasses.field(default_factory=list)
    command: str = ""
    bound: dict = dataclasses.field(default_factory=lambda: {"fp16_max": FP16_MAX, "rel_error": REL_ERROR_BOUND})

    def __bool__(self) -> bool:
        return not self.flagged

    @property
    def starts(self) -> list[dict]:
        return [f for f in self.flagged if f["starts"]]

    def verdict(self) -> str:
        if not self.flagged:
            return (f"float16 preflight: OK: every tensor of the {self.checked_nodes} float16 ops stays inside "
                    f"float16's range ({self.samples} sample{'s' if self.samples != 1 else ''})")
        s = self.starts[0] if self.starts else self.flagged[0]
        what = (f"reaches {s['max_abs']:.3g} > {FP16_MAX:g}" if s["reason"] == "overflow"
                else f"loses {s['rel_error']:.1%} to float16 rounding (> {REL_ERROR_BOUND:.0%})")
        return (f"float16 preflight: {len(self.flagged)} of {self.checked_nodes} float16 ops leave float16's range; "
                f"it starts at {s['node']} ({s['op_type']}): {s['tensor']} {what}")

    def lines(self, limit: int = 12) -> list[str]:
        """The report as printable lines: the verdict, the flagged tensors, the way out."""
        out = [self.verdict()]
        if not self.flagged:
            return out
        for f in self.flagged[:limit]:
            mark = "starts here: " if f["starts"] else ""
            detail = (f"max |x| {f['max_abs']:.3g}" if f["reason"] == "overflow"
                      else f"relative error {f['rel_error']:.2%} in float16")
            out.append(f"  {mark}{f['node']} ({f['op_type']}): {f['tensor']}: {detail} ({f['reason']})")
        if len(self.flagged) > limit:
            out.append(f"  ... and {len(self.flagged) - limit} more")
        out.append(f"keep them in float32 (--keep-dtype): {','.join(self.keep)}")
        out.append(f"  {self.command}")
        out.append("or search the smallest keep list: "
                   f"npu-deploy debug precision {shlex.quote(self.model)} --mode "
                   f"{self.precision_mode if self.precision_mode == 'allow_mix_precision' else 'force_fp16'}")
        return out


def fp16_preflight(model_path: str | Path, node_dtypes: Mapping[str, str], samples: Sequence[Mapping[str, np.ndarray]],
                   *, precision_mode: str, convert_args: Sequence[str] = (),
                   rel_error_bound: float = REL_ERROR_BOUND) -> PreflightReport:
    """Run ``model_path`` in float32 on ``samples`` and flag what float16 cannot hold.

    ``node_dtypes``: the plan's compute dtype per node name (the manifest's ``node_formats[*].dtype``;
    nodes the loader named ``<op_type>_<index>`` under those names). ``convert_args``: the rest of the
    convert command line, repeated in :attr:`PreflightReport.command`.
    """
    import onnxruntime as ort  # heavy: loaded only when a preflight runs

    src = Path(model_path)
    model = onnx.load(str(src))
    name_nodes(model.graph)
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    values = {vi.name: vi for vi in list(graph.value_info) + list(graph.input) + list(graph.output)}
    outputs_now = {o.name for o in graph.output}
    fp16_nodes = [n for n in graph.node if node_dtypes.get(n.name) == "float16"]
    wanted: list[str] = []
    for n in fp16_nodes:
        for t in list(n.input) + list(n.output):
            if t and t not in inits and t not in wanted:
                wanted.append(t)
    del graph.output[:]
    for t in wanted:
        vi = values.get(t)
        graph.output.append(vi if vi is not None and t in outputs_now else helper.make_empty_tensor_value_info(t))
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception types
        raise ModelError(f"{src}: the float16 preflight cannot run the model in onnxruntime "
                         f"({str(e).splitlines()[0][:200]})", hint="skip it with --no-preflight") from e
    names = [o.name for o in sess.get_outputs()]
    in_names = {i.name for i in sess.get_inputs()}
    peak: dict[str, float] = {}
    err: dict[str, float] = {}
    for feeds in samples:
        arrays = sess.run(names, {k: v for k, v in feeds.items() if k in in_names})
        for t, a in zip(names, arrays):
            a = np.asarray(a)
            if a.dtype != np.float32 or a.size == 0:
                continue
            finite = a[np.isfinite(a)]
            m = float(np.abs(finite).max()) if finite.size else 0.0
            peak[t] = max(peak.get(t, 0.0), m)
            if m <= FP16_MAX:
                norm = float(np.linalg.norm(finite.astype(np.float64)))
                if norm > 0:
                    rounded = finite.astype(np.float16).astype(np.float64)
                    err[t] = max(err.get(t, 0.0), float(np.linalg.norm(rounded - finite)) / norm)
    flagged, bad = [], set()
    for n in fp16_nodes:
        over_in = [t for t in n.input if t in peak and t not in inits and peak[t] > FP16_MAX]
        over_out = [t for t in n.output if t in peak and peak[t] > FP16_MAX]
        under = [t for t in n.output if err.get(t, 0.0) > rel_error_bound]
        if not (over_in or over_out or under):
            continue
        t = (over_out or over_in or under)[0]
        reason = "overflow" if (over_out or over_in) else "underflow"
        starts = not any(i in bad for i in n.input) and not over_in
        flagged.append({"node": n.name, "op_type": n.op_type, "tensor": t, "max_abs": peak.get(t, 0.0),
                        "rel_error": err.get(t), "reason": reason, "starts": starts})
        bad.update(o for o in n.output if o)
    keep = [f["node"] for f in flagged]
    command = ""
    if keep:
        args = ["npu-deploy", "convert", str(src), *convert_args, "--keep-dtype", ",".join(keep)]
        command = " ".join(shlex.quote(a) for a in args)
    return PreflightReport(str(src), precision_mode, len(samples), len(fp16_nodes), flagged, keep, command)
