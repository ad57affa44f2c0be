"""The float16 preflight as ``convert`` runs it: realistic inputs, then the check of the plan.

The check itself is :func:`npu_deploy.converters.lowering.preflight.fp16_preflight` (the converters
layer: it runs the original model in float32 and reads the plan's per-node dtypes). It takes its
inputs from the caller because the generator that makes realistic ones — the one ``compare`` uses,
:func:`~npu_deploy.runtime.check.compare.generate_inputs` (synthetic images for image-like inputs,
valid token ids for embedding indices) — lives in the runtime, which the converters may not import.
This module is where the two meet: ``npu-deploy convert`` calls :func:`preflight` after a float16
conversion (unless ``--no-preflight``); API users call it after :func:`npu_deploy.convert` with the
same options.

>>> rep = preflight("model.onnx", precision_mode="force_fp16")        # doctest: +SKIP
>>> print("\\n".join(rep.lines()))                                    # doctest: +SKIP
float16 preflight: 14 of 24 float16 ops leave float16's range; it starts at conv4 (Conv): ...
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.options import CAPABILITIES, ConvertOptions
from npu_deploy.converters.lowering.preflight import PreflightReport, fp16_preflight, needs_preflight  # noqa: F401
from npu_deploy.errors import InputError
from npu_deploy.runtime.check.compare import generate_inputs, index_ranges
from npu_deploy.runtime.check.precision import load_samples


def debug_precision_command(model: str | os.PathLike, precision_mode: str | None,
                            input_shape: str | None = None) -> str:
    """The ``npu-deploy debug precision`` command line to run next for ``model`` under ``precision_mode``.

    >>> debug_precision_command("m.onnx", "force_fp16", "x:1,3,8,8;y:1")
    "npu-deploy debug precision m.onnx --mode force_fp16 --input-shape 'x:1,3,8,8;y:1' -o keep_dtype.cfg"
    """
    mode = "allow_mix_precision" if precision_mode == "allow_mix_precision" else "force_fp16"
    args = ["npu-deploy", "debug", "precision", os.fspath(model), "--mode", mode]
    if input_shape:
        args += ["--input-shape", input_shape]
    return " ".join(shlex.quote(a) for a in args + ["-o", "keep_dtype.cfg"])


def calibration_samples(path: str | os.PathLike, input_names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """The samples of a ``--calibration-inputs`` file, each checked to hold every input."""
    samples = load_samples([path])
    for k, s in enumerate(samples):
        missing = [n for n in input_names if n not in s]
        if missing:
            raise InputError(f"--calibration-inputs {path}: sample {k} has no array for input(s) "
                             f"{', '.join(map(repr, missing))}",
                             hint=f"name the arrays as the model's inputs: {', '.join(input_names)}")
    return samples


def preflight(model: str | os.PathLike, *, precision_mode: str | None = None, keep_dtype: Sequence[str] = (),
              input_shapes: Mapping[str, Sequence[int]] | None = None, dynamic_batch: Sequence[int] | None = None,
              dynamic_dims=None, soc: str | None = None, input_format: str | None = None,
              calibration_inputs: str | os.PathLike | None = None, seed: int = 0,
              convert_args: Sequence[str] = ()) -> PreflightReport:
    """Plan ``model`` as ``convert`` does (built-in planner, the same options), run it once on
    ``calibration_inputs`` (an ``.npz`` of model inputs; ``NAME@K`` arrays make several samples) or on
    the compare input generator's inputs, and report what float16 cannot hold. Never writes anything."""
    mode = precision_mode or "force_fp16"
    # an ATC-only float16 mode (cube_fp16in_fp32out, allow_mix_precision_fp16) is planned as force_fp16
    planned = mode if mode in CAPABILITIES["builtin"].precision_modes else None
    options = ConvertOptions(backend="builtin", soc=soc, input_shapes=input_shapes, dynamic_batch=dynamic_batch,
                             dynamic_dims=dynamic_dims, precision_mode=planned, keep_dtype=tuple(keep_dtype or ()),
                             input_format=input_format)
    ctx = pipeline.lower(Path(model), None, options, until="plan from ONNX")
    loaded = ctx.loaded
    node_dtypes = {name: nf.dtype for name, nf in ctx.plan.node_formats.items() if not nf.folded}
    largest = max(loaded.gears, key=lambda g: sum(int(np.prod(s)) for s in g.values())) if loaded.gears else {}
    if calibration_inputs is not None:
        samples = calibration_samples(calibration_inputs, [i.name for i in loaded.inputs])
    else:
        samples = [generate_inputs(loaded.inputs, seed=seed, shapes=largest or None,
                                   index_ranges=index_ranges(model))]
    return fp16_preflight(model, node_dtypes, samples, precision_mode=mode, convert_args=convert_args)
