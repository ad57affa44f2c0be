"""``npu-deploy run MODEL``: run a bundle (CPU emulator) or ``.om`` (device) and report latency.

ais_bench spellings are accepted as aliases: ``--dymBatch`` (= ``--batch-size``), ``--dymDims``
(= ``--input-shape``), ``--warmup_count`` (= ``--warmup``), ``--outputSize`` (= ``--output-size``).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click
import numpy as np

from npu_deploy._io import atomic_path, atomic_write, check_dest, load_npy, make_output_folder, safe_file_stem
from npu_deploy._text import printable
from npu_deploy.cli.options import parse_input_shapes, parse_int_list, refuse_overwriting
from npu_deploy.errors import InputError

# written beside the outputs when a tensor name is not its file's name: {file name: tensor name}
NAMES_FILE = "output_names.json"


def load_array(path: str | Path, meta=None, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Read one input: ``.npy`` (no pickle) or raw ``.bin`` (dtype and shape from the model input)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"input file {p} does not exist", hint="check the --input path")
    if p.suffix.lower() == ".npy":
        return load_npy(p)
    if meta is None:
        raise InputError(f"{p}: a .bin input needs a model input to take its dtype and shape from",
                         hint="name the input: --input NAME=FILE.bin")
    want = shape if shape is not None else meta.shape
    size = p.stat().st_size
    if any(d < 0 for d in want):
        if size % meta.dtype.itemsize:
            raise InputError(f"{p}: {size} bytes is not a whole number of {meta.dtype.name} values")
        known = math.prod(d for d in want if d >= 0)
        n = size // meta.dtype.itemsize
        if [d for d in want if d < 0] != [-1] or known == 0 or n % known:
            raise InputError(f"{p}: cannot tell the shape of a raw .bin for input {meta.name!r} "
                             f"with dynamic shape {meta.shape}",
                             hint="give --input-shape (--dymDims) or --batch-size, or use .npy files")
        want = tuple(n // known if d < 0 else d for d in want)
    need = math.prod(want) * meta.dtype.itemsize
    if size != need:  # checked before reading: the size must match the model, whatever the file claims
        raise InputError(f"{p}: {size} bytes, but input {meta.name!r} {tuple(want)} {meta.dtype.name} "
                         f"needs {need}", hint="check the file matches the model input (or use .npy)")
    raw = p.read_bytes()
    if len(raw) != need:
        raise InputError(f"{p} changed while it was read ({len(raw)} bytes, not {need})")
    return np.frombuffer(raw, dtype=meta.dtype).reshape(want).copy()


def resolve_shape(meta, shapes: dict, batch: int | None) -> tuple[int, ...]:
    """The concrete shape to generate/read for ``meta``: ``--input-shape``, else ``--batch-size`` on
    axis 0, else the first gear (or the gear with that batch), else the static shape."""
    if meta.name in shapes:
        s = tuple(shapes[meta.name])
        if len(s) != meta.rank:
            raise InputError(f"--input-shape for {meta.name!r} has rank {len(s)}, the model input has "
                             f"rank {meta.rank} {meta.shape}")
        return s
    if batch is not None and meta.rank:
        if meta.shape[0] >= 0 and meta.shape[0] != batch:
            raise InputError(f"--batch-size {batch}: input {meta.name!r} has a static batch of {meta.shape[0]}",
                             hint="reconvert with --dynamic-batch to run other batch sizes")
        rest = meta.shape[1:]
        if any(d < 0 for d in rest):
            gear = next((g for g in meta.gears if g[0] == batch), meta.gears[0] if meta.gears else None)
            if gear is None:
                raise InputError(f"input {meta.name!r} {meta.shape} has dynamic dims besides the batch",
                                 hint="give them with --input-shape NAME:DIMS")
            rest = gear[1:]
        return (batch, *rest)
    if meta.gears:
        return tuple(meta.gears[0])
    if any(d < 0 for d in meta.shape):
        raise InputError(f"input {meta.name!r} has dynamic shape {meta.shape}",
                         hint="give it with --input-shape NAME:DIMS")
    return tuple(meta.shape)


def input_files(inputs: tuple[str, ...]) -> list[str]:
    """The file paths named by ``--input`` values (``NAME=FILE`` or comma-separated files)."""
    paths = []
    for item in inputs:
        for part in (item.split(",") if "=" not in item else [item]):
            part = part.strip()
            if part:
                paths.append(part.partition("=")[2] if "=" in part else part)
    return paths


def build_feeds(metas, inputs: tuple[str, ...], input_dir: str | None, pure_data: str, shapes: dict,
                batch: int | None, seed: int = 0, sources: list | None = None) -> dict[str, np.ndarray]:
    """Feeds from ``--input`` (``NAME=FILE`` or files in input order, comma-separated like ais_bench),
    ``--input-dir`` (``<name>.npy`` / ``<name>.bin``), else generated (``--pure-data`` ``"zero"`` or
    ``"random"``; ``None`` returns only the given ones). ``sources``, when given, collects the files read."""
    sources = [] if sources is None else sources
    by_name = {m.name: m for m in metas}
    feeds: dict[str, np.ndarray] = {}
    positional: list[str] = []
    for item in inputs:
        for part in (item.split(",") if "=" not in item else [item]):
            part = part.strip()
            if not part:
                continue
            name, sep, path = part.partition("=")
            if sep:
                if name not in by_name:
                    raise InputError(f"--input {part}: the model has no input {name!r}",
                                     hint=f"inputs are {', '.join(by_name)}")
                feeds[name] = load_array(path, by_name[name], _shape_or_none(by_name[name], shapes, batch))
                sources.append(path)
            else:
                positional.append(part)
    if positional:
        free = [m for m in metas if m.name not in feeds]
        if len(positional) > len(free):
            raise InputError(f"{len(positional)} input files for {len(free)} model inputs",
                             hint=f"inputs are {', '.join(m.name for m in metas)}")
        for m, path in zip(free, positional):
            feeds[m.name] = load_array(path, m, _shape_or_none(m, shapes, batch))
            sources.append(path)
    if input_dir is not None:
        d = Path(input_dir)
        if not d.is_dir():
            raise InputError(f"--input-dir {d} is not a folder")
        for m in metas:
            if m.name in feeds:
                continue
            safe = safe_file_stem(m.name)
            for cand in (d / f"{safe}.npy", d / f"{safe}.bin"):
                if cand.is_file():
                    feeds[m.name] = load_array(cand, m, _shape_or_none(m, shapes, batch))
                    sources.append(str(cand))
                    break
            else:
                raise InputError(f"--input-dir {d}: no {safe}.npy or {safe}.bin for input {m.name!r}")
    if pure_data is None:  # only what was given
        return feeds
    rng = np.random.default_rng(seed)
    for m in metas:
        if m.name in feeds:
            continue
        shape = resolve_shape(m, shapes, batch)
        if pure_data == "zero":
            feeds[m.name] = np.zeros(shape, m.dtype)
        elif m.dtype.kind == "f":
            feeds[m.name] = rng.random(shape).astype(m.dtype)
        elif m.dtype.kind in "iu":
            feeds[m.name] = rng.integers(0, 2, size=shape).astype(m.dtype)
        elif m.dtype.kind == "b":
            feeds[m.name] = np.asarray(rng.random(shape) < 0.5)  # 0-d: an array, not a numpy scalar
        else:
            raise InputError(f"input {m.name!r}: cannot generate {m.dtype} data", hint="give it with --input")
    return feeds


def _shape_or_none(meta, shapes, batch):
    if meta.name not in shapes and batch is None and any(d < 0 for d in meta.shape):
        return None  # nothing given: a raw .bin's own size tells its one dynamic dim (load_array)
    try:
        return resolve_shape(meta, shapes, batch)
    except InputError:
        return None


def output_paths(out_dir: str, names: list[str], outfmt: str) -> list[Path]:
    """The file each output goes to: ``<safe name>.<outfmt>``, distinct even where names differ only
    in case or in characters a file name cannot hold (see :func:`npu_deploy._io.safe_file_stem`)."""
    d = Path(out_dir)
    paths = []
    taken: set[str] = {Path(NAMES_FILE).stem.lower()}
    for name in names:
        safe = safe_file_stem(name)
        stem, k = safe, 1
        while stem.lower() in taken:  # "a/b" and "a_b" must not land in one file
            k += 1
            stem = f"{safe}_{k}"
        taken.add(stem.lower())
        paths.append(d / f"{stem}.{outfmt}")
    return paths


def save_outputs(out_dir: str, names: list[str], outs: list[np.ndarray], outfmt: str) -> list[Path]:
    """Write one file per output (``.npy`` or raw ``.bin``); when a file name is not the tensor's
    name, also ``output_names.json`` mapping file names to tensor names."""
    d = make_output_folder(out_dir)
    paths = output_paths(out_dir, names, outfmt)
    written = []
    for path, arr in zip(paths, outs):
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                if outfmt == "npy":
                    np.save(f, arr, allow_pickle=False)
                else:
                    f.write(np.ascontiguousarray(arr).tobytes())
        written.append(path)
    renamed = {p.name: n for p, n in zip(paths, names) if p.stem != n}
    if renamed:
        with atomic_write(d / NAMES_FILE, "w", encoding="utf-8") as f:
            json.dump(renamed, f, indent=2, ensure_ascii=False)
            f.write("\n")
        written.append(d / NAMES_FILE)
    return written


@click.command("run", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE",
              help="An input file (.npy, or raw .bin); NAME= may be omitted (files then go to inputs in "
                   "order, comma-separated as in ais_bench). Repeatable.")
@click.option("--input-dir", type=click.Path(file_okay=False), default=None,
              help="Folder with <input name>.npy or .bin files.")
@click.option("--pure-data", type=click.Choice(["zero", "random"]), default="zero", show_default=True,
              help="Data for inputs not given.")
@click.option("--loop", type=int, default=10, show_default=True, help="Measured runs.")
@click.option("--warmup", "--warmup_count", "warmup", type=int, default=1, show_default=True,
              help="Unmeasured runs first (ais_bench: --warmup_count).")
@click.option("--batch-size", "--dymBatch", "batch_size", type=int, default=None,
              help="Batch size to run (picks the batch gear; ais_bench: --dymBatch).")
@click.option("--input-shape", "--dymDims", "input_shape", default=None, metavar="NAME:DIMS;...",
              help="Concrete input shapes, e.g. 'x:1,3,640,640' (ais_bench: --dymDims).")
@click.option("--output-size", "--outputSize", "output_size", default=None, metavar="BYTES,...",
              help="Output buffer sizes for dynamic-shape .om models (ais_bench: --outputSize); "
                   "the emulator sizes outputs itself.")
@click.option("--output", "output_dir", type=click.Path(file_okay=False), default=None,
              help="Write the outputs of the last run here, one file per output.")
@click.option("--outfmt", type=click.Choice(["npy", "bin"], case_sensitive=False), default="npy",
              show_default=True, help="Output file format.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the measured numbers, model, backend, shapes and versions as JSON.")
@click.option("--device", "device_id", type=click.IntRange(min=0), default=0, show_default=True, help="Device id (.om only).")
@click.option("--backend", type=click.Choice(["auto", "emulator", "acl"]), default="auto", show_default=True)
@click.option("--profile", "profile_dir", type=click.Path(file_okay=False), default=None,
              help="Write an msprof-style profile folder here (estimated on the emulator).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed for --pure-data random.")
@click.pass_context
def command(ctx, model, inputs, input_dir, pure_data, loop, warmup, batch_size, input_shape, output_size,
            output_dir, outfmt, json_path, device_id, backend, profile_dir, seed):
    """Run MODEL (an offline bundle or .om) and report latency and throughput.

    Prints latency min/mean/p50/p90/p95/p99 and throughput, and separately the host-to-device,
    compute and device-to-host times. On the CPU emulator these are CPU times, not device times.

    Example: npu-deploy run model.bundle --loop 100 --warmup 5 --json run.json
    """
    from npu_deploy.runtime.bench import benchmark
    from npu_deploy.runtime.session import InferenceSession

    if loop < 1:
        raise InputError(f"--loop {loop}: must be at least 1")
    if warmup < 0:
        raise InputError(f"--warmup {warmup}: must not be negative")
    if batch_size is not None and batch_size < 1:
        raise InputError(f"--batch-size {batch_size}: must be at least 1")
    shapes = parse_input_shapes(input_shape, option="--input-shape")
    sizes = parse_int_list(output_size, option="--output-size")
    given = [("input file", p) for p in input_files(inputs)]
    refuse_overwriting([("--json", json_path)], [("model", model), *given])
    if json_path is not None:  # before the runs, not after minutes of them
        check_dest(Path(json_path))
    outfmt = outfmt.lower()
    with InferenceSession(model, device_id=device_id, backend=backend, profile=profile_dir is not None,
                          profile_dir=profile_dir) as sess:
        metas = sess.get_inputs()
        sources: list[str] = []
        feeds = build_feeds(metas, inputs, input_dir, pure_data, shapes, batch_size, seed, sources)
        names = [m.name for m in sess.get_outputs()]
        if output_dir is not None:  # before the runs: an output file must not be one of the inputs
            planned = output_paths(output_dir, names, outfmt) + [Path(output_dir) / NAMES_FILE]
            refuse_overwriting([("--output file", p) for p in planned] + [("--json", json_path)],
                               [("model", model), *[("input file", p) for p in sources]])
        click.echo(f"model: {model}  backend: {sess.backend_name}")
        for n, a in feeds.items():
            click.echo(printable(f"  input  {n}: {a.dtype.name} {tuple(a.shape)}"))
        if sizes:
            click.echo("  note: --output-size is not needed here and is ignored: outputs are sized from the "
                       "model (static or gear shapes)")
        show_bar = loop >= 50 and sys.stderr.isatty()  # a bar in a log file is only noise
        if show_bar:
            with click.progressbar(length=loop, label="running", file=sys.stderr) as bar:
                res, outs = benchmark(sess, feeds, loop=loop, warmup=warmup, model=str(model),
                                      progress=lambda i: bar.update(1))
        else:
            res, outs = benchmark(sess, feeds, loop=loop, warmup=warmup, model=str(model))
        for n, o in zip(names, outs):
            click.echo(printable(f"  output {n}: {o.dtype.name} {tuple(o.shape)}"))
        if output_dir is not None:
            written = save_outputs(output_dir, names, outs, outfmt)
            click.echo(printable(f"outputs written: {', '.join(str(p) for p in written)}"))
    click.echo(res.table())
    if sess.backend_name == "emulator":
        click.echo("note: emulator times are CPU times of onnxruntime, not NPU device times")
    if profile_dir is not None and sess.profile_path is not None:
        est = " (estimated durations)" if sess.backend_name == "emulator" else ""
        click.echo(f"profile{est}: {sess.profile_path}")
    if json_path is not None:
        res.to_json(json_path)
        click.echo(f"json written: {json_path}")
    click.echo(res.verdict())
    ctx.exit(0)

