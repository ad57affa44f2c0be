"""Profile a model, then analyse the profile: under msprof on an Ascend host, else on the CPU emulator.

On a host with ``msprof`` on PATH the model runs as ``npu-deploy run MODEL`` under msprof (an argument list,
no shell) and the newest ``PROF_*`` folder it writes is analysed. Anywhere else the model runs on the
emulator with ``profile=True``; its profile holds the cost model's *estimated* durations, and the report's
verdict says so.

>>> from npu_deploy.profiling.run import profile_model
>>> report = profile_model("model.onnx", output_dir="prof")      # doctest: +SKIP
>>> report.verdict()                                               # doctest: +SKIP
"FormatTrans 3.1 % of device compute (threshold 8 %): ok (estimated by the emulator's cost model)"
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from npu_deploy.converters.files.feeds import generate_inputs
from npu_deploy.errors import DependencyError, ExternalError, InputError, ModelError
from npu_deploy.profiling.analyze import ProfileReport, analyze_profile
from npu_deploy.runtime.session import InferenceSession


def msprof_command(msprof: str, output_dir: str | os.PathLike, app: Sequence[str],
                   extra: Sequence[str] = ()) -> list[str]:
    """The msprof command line (argument list): task time with op shapes and formats (``l1``), pipe
    utilisation PMU metrics, text export; ``extra`` msprof options go before the application.

    >>> msprof_command("msprof", "out", ["python3", "infer.py"])
    ['msprof', '--output=out', '--task-time=l1', '--aic-metrics=PipeUtilization', 'python3', 'infer.py']
    """
    return [msprof, f"--output={os.fspath(output_dir)}", "--task-time=l1", "--aic-metrics=PipeUtilization",
            *extra, *app]


def _newest_prof(root: Path) -> Path | None:
    found = [p for p in root.rglob("PROF_*") if p.is_dir()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def profile_with_msprof(model: str | os.PathLike, output_dir: str | os.PathLike, *, msprof: str,
                        run_args: Sequence[str] = (), msprof_args: Sequence[str] = (),
                        timeout: float | None = None, threshold: float | None = None,
                        include_transpose: bool | None = None) -> ProfileReport:
    """Run ``npu-deploy run MODEL RUN_ARGS`` under msprof and analyse what it wrote."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    app = [sys.executable, "-m", "npu_deploy.cli.main", "run", os.fspath(model), *run_args]
    cmd = msprof_command(msprof, out, app, msprof_args)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, shell=False)
    except subprocess.TimeoutExpired as e:
        raise ExternalError(f"msprof did not finish within {timeout:g} s", hint="raise --timeout") from e
    except OSError as e:
        raise ExternalError(f"cannot start msprof ({e.strerror})", hint="check the CANN environment") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise ExternalError(f"msprof exited with status {proc.returncode}: {tail[0][:200]}",
                            hint=f"command: {' '.join(cmd)}")
    prof = _newest_prof(out)
    if prof is None:
        raise ExternalError(f"msprof wrote no PROF_* folder under {out}",
                            hint="check msprof's output above and the CANN log")
    return analyze_profile(prof, threshold, include_transpose)


def make_feeds(inputs, shapes: Mapping[str, Sequence[int]] | None = None, gears=None,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Generated inputs for a model's input metadata (``name``, ``shape``, ``dtype``), from the one
    feed generator (:func:`npu_deploy.converters.files.feeds.generate_inputs`): the given shape, else
    the first gear (``gears``: a list of ``{name: shape}``), else dynamic dims as 1. The values do not
    change the estimated profile (it depends on shapes); integers are 0 or 1, safe as token ids,
    masks and indices."""
    first_gear = (gears or [{}])[0] if gears else {}
    given = {**{k: tuple(v) for k, v in first_gear.items()}, **{k: tuple(v) for k, v in (shapes or {}).items()}}
    return generate_inputs(inputs, seed=seed, shapes=given)


def profile_on_emulator(model: str | os.PathLike, output_dir: str | os.PathLike, *,
                        input_shapes: Mapping[str, Sequence[int]] | None = None, loops: int = 1,
                        threshold: float | None = None, include_transpose: bool | None = None,
                        convert_options: Mapping | None = None, soc: str | None = None) -> ProfileReport:
    """Convert (if ONNX), run ``loops`` times on the emulator with a profile, analyse the estimated profile.

    ``soc`` (a SoC name or a SoC profile JSON, as ``convert --soc``) is the SoC the ONNX model is planned
    and priced for; a bundle was planned and priced when it was converted, so it is refused there."""
    model = Path(model)
    if not model.is_file():
        raise InputError(f"{model}: no such model file", hint="give an .onnx model or an offline bundle")
    if soc is not None and not _is_onnx(model):
        raise InputError(f"--soc {soc}: {model} is already converted (its plan and estimate are fixed)",
                         hint="give the .onnx model to profile it for that SoC, or drop --soc")
    if loops < 1:
        raise InputError(f"--loops {loops}: must be at least 1")
    out = Path(output_dir)
    created = _make_dir(out)
    tmpdir = None
    bundle = model
    try:
        if _is_onnx(model):
            from npu_deploy.converters.lowering.convert import convert

            tmpdir = tempfile.mkdtemp(prefix=".npu-deploy-profile-", dir=out)
            bundle = Path(tmpdir) / (model.stem + ".bundle")
            kwargs = {"backend": "builtin", **dict(convert_options or {})}
            if soc is not None:
                kwargs.setdefault("soc", soc)
            if input_shapes and "input_shapes" not in kwargs:
                kwargs["input_shapes"] = {k: tuple(v) for k, v in input_shapes.items()}
            try:
                result = convert(model, output=bundle, **kwargs)
            except ModelError as e:
                _rehint_dynamic(e)
                raise
            bundle = Path(getattr(result, "output", None) or bundle)
        sess = InferenceSession(bundle, backend="emulator", profile=True, profile_dir=out)
        try:
            gears = sess.gears() if hasattr(sess, "gears") else []
            feeds = make_feeds([m.meta for m in sess.get_inputs()], input_shapes, gears)
            for _ in range(loops):
                sess.run(None, feeds)
        finally:
            sess.close()
        prof = sess.profile_path
        if prof is None:
            raise ModelError(f"{model}: the emulator wrote no profile", hint="run at least once")
        return analyze_profile(prof, threshold, include_transpose, estimated=True)
    except BaseException:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
            tmpdir = None
        _remove_if_empty(created)  # a failed run leaves no empty output folder behind
        raise
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _make_dir(path: Path) -> list[Path]:
    """``mkdir -p path``; the folders it created, innermost first."""
    made = []
    p = path
    while not p.exists():
        made.append(p)
        if p.parent == p:
            break
        p = p.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the profile folder {path}: {e.strerror}",
                         hint="choose another --output-dir") from None
    return made


def _remove_if_empty(made: list[Path]) -> None:
    for p in made:
        try:
            p.rmdir()
        except OSError:  # not empty (the profile is kept) or already gone
            return


def _rehint_dynamic(e: ModelError) -> None:
    """``profile run`` fixes shapes with ``--input-shape`` only (no gears): say so, not convert's flags."""
    if getattr(e, "dynamic_input", None):
        name, example = e.dynamic_input
        e.hint = f"fix them with --input-shape \"{name}:{example}\" with each ? replaced by a size"


def _is_onnx(path: Path) -> bool:
    if path.suffix.lower() == ".onnx":
        return True
    try:
        from npu_deploy.converters.files.bundle import is_bundle

        return not is_bundle(path) and path.suffix.lower() != ".om"
    except ImportError:  # pragma: no cover - bundle module is part of the package
        return False


def profile_model(model: str | os.PathLike, output_dir: str | os.PathLike, *,
                  input_shapes: Mapping[str, Sequence[int]] | None = None, loops: int = 1,
                  run_args: Sequence[str] = (), msprof_args: Sequence[str] = (),
                  threshold: float | None = None, include_transpose: bool | None = None,
                  use_msprof: bool | None = None, timeout: float | None = None,
                  soc: str | None = None) -> ProfileReport:
    """Profile ``model`` and analyse the profile. ``use_msprof=None`` picks msprof when it is on PATH.

    ``soc``: a SoC name or a SoC profile JSON (``cost fit``'s output), as ``convert --soc``: the ONNX model
    is converted for it (a profile JSON: for its base SoC, the emulator's estimate priced with its figures)."""
    if soc is not None and Path(model).is_file() and not _is_onnx(Path(model)):
        raise InputError(f"--soc {soc}: {model} is already converted (its plan and estimate are fixed)",
                         hint="give the .onnx model to profile it for that SoC, or drop --soc")
    msprof = shutil.which("msprof")
    if use_msprof is None:
        use_msprof = msprof is not None
    if use_msprof:
        if msprof is None:
            raise DependencyError("msprof is not on PATH",
                                  hint="source CANN's set_env.sh, or profile on the emulator")
        # options of `npu-deploy run` (cli/run.py); the user's RUN_ARGS come last and win
        args = ["--loop", str(loops), "--warmup", "0", "--pure-data", "random"]
        if input_shapes:
            text = ";".join(f"{k}:{','.join(str(d) for d in v)}" for k, v in input_shapes.items())
            args += ["--input-shape", text]
        args += list(run_args)
        model = Path(model)
        tmpdir = None
        try:
            if _is_onnx(model):
                from npu_deploy.converters.lowering.convert import convert

                Path(output_dir).mkdir(parents=True, exist_ok=True)
                tmpdir = tempfile.mkdtemp(prefix=".npu-deploy-profile-", dir=output_dir)
                shapes = {k: tuple(v) for k, v in input_shapes.items()} if input_shapes else None
                try:
                    result = convert(model, output=Path(tmpdir) / model.stem, input_shapes=shapes, soc=soc)
                except ModelError as e:
                    _rehint_dynamic(e)
                    raise
                model = Path(result.output)
                if not model.is_file():
                    raise ModelError(f"{model}: conversion produced no model file")
            return profile_with_msprof(model, output_dir, msprof=msprof, run_args=args,
                                       msprof_args=msprof_args, timeout=timeout, threshold=threshold,
                                       include_transpose=include_transpose)
        finally:
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)
    return profile_on_emulator(model, output_dir, input_shapes=input_shapes, loops=loops,
                               threshold=threshold, include_transpose=include_transpose, soc=soc)
