"""``npu-deploy run MODEL``: run a bundle (CPU emulator) or ``.om`` (device) and report latency.

ais_bench spellings are accepted as aliases, so an ``ais_bench`` command line runs after ``npu-deploy run``:
``--model`` (the MODEL argument), ``--dymBatch``/``--batchsize`` (= ``--batch-size``), ``--dymDims``/
``--dymShape`` (= ``--input-shape``), ``--warmup_count`` (= ``--warmup``), ``--outputSize``
(= ``--output-size``), ``--outfmt NPY|BIN|TXT``, ``--output_dirname``, ``--debug 1`` (= ``--describe``:
print the model description; a bare ``--debug`` keeps npu-deploy's meaning, tracebacks on errors).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
import numpy as np

from npu_deploy._io import (atomic_path, atomic_write, check_dest, clean_stale_parts_below, load_npy,
                            make_output_folder, safe_file_stem)
from npu_deploy._display import dims
from npu_deploy._text import printable
from npu_deploy.cli.feedback import RunProgress, early, end_early, interactive
from npu_deploy.cli.options import (HabitCommand, Rewrite, input_shape_option, parse_input_shapes, parse_int_list,
                                    positional, refuse_overwriting)
from npu_deploy.converters.files.feeds import generate_inputs
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
    free = [m for m in metas if m.name not in feeds]
    at = {m.name: resolve_shape(m, shapes, batch) for m in free}
    if pure_data == "zero":
        return {**feeds, **{m.name: np.zeros(at[m.name], m.dtype) for m in free}}
    # ais_bench's random data: floats uniform in [0, 1), integers 0 or 1, booleans random
    return {**feeds, **generate_inputs(free, seed=seed, shapes=at, val_range={"": (0, 1)})}


def _shape_or_none(meta, shapes, batch):
    if meta.name not in shapes and batch is None and any(d < 0 for d in meta.shape):
        return None  # nothing given: a raw .bin's own size tells its one dynamic dim (load_array)
    try:
        return resolve_shape(meta, shapes, batch)
    except InputError:
        return None


def describe_lines(sess) -> list[str]:
    """The model description ais_bench prints with ``--debug 1``: every input and output with its
    dtype, shape (``?`` unknown), host and device format, size, and the gears."""
    lines = []
    for kind, metas in (("input", sess.get_inputs()), ("output", sess.get_outputs())):
        for m in (a.meta for a in metas):   # TensorMeta: -1 on dynamic dims (NodeArg.shape has None)
            lines.append(f"  {kind} {m.name}: {np.dtype(m.dtype).name} {dims(m.shape)} format {m.format}, device "
                         f"{m.device_format} {dims(m.device_shape) if m.device_shape else '?'}, "
                         f"{m.nbytes} bytes")
    gears = sess.gears()
    if gears:
        lines.append("  gears: " + "; ".join(",".join(f"{k}:{dims(v)}" for k, v in g.items()) for g in gears))
    return lines


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
                elif outfmt == "txt":  # ais_bench's TXT: the values as text, one row per last-axis line
                    a = np.asarray(arr)
                    np.savetxt(f, a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1), fmt="%.9g")
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


def _dump_emulator(sess, feeds: dict, dump_dir: str, model: str, device_id: int) -> None:
    """``--dump`` on the emulator: one recorded run of ``feeds``, every executed op as a dump file in
    the ACL folder layout (iteration 0; the timed runs that follow are not dumped)."""
    import time

    from npu_deploy.converters.files.bundle import read_bundle
    from npu_deploy.converters.files.dump import dump_run_folder, onnx_output_indices, write_dump_folder

    if sess.backend_name != "emulator":  # an .onnx converted on the fly for a device: acl.init came first
        raise InputError(f"--dump: {model} was converted for the device on the fly, too late to switch "
                         f"dumping on at acl.init", hint="convert it to an .om first, then run the .om with --dump")
    with read_bundle(sess.path, verify=False) as b:  # the graph gives each output's index in its ONNX node
        index = onnx_output_indices(b.graph)
    _, ops = sess.backend.run_recorded(feeds)
    clean_stale_parts_below(dump_dir)  # what a killed earlier dump left in its own time folder
    now = time.time()
    for second in range(3600):  # a run within the same second as the last one takes the next second's folder
        folder = dump_run_folder(dump_dir, Path(model).stem, when=now + second, device_id=device_id)
        if not folder.exists():
            break
    written = write_dump_folder(folder, ops, output_index=index)
    # the feeds of the dumped run, where `debug compare` looks for them (its golden run needs them)
    from npu_deploy.runtime.check.compare import save_inputs

    save_inputs(folder / "inputs.npz", feeds)
    click.echo(printable(f"dump: {len(written)} op dump files and their inputs (inputs.npz) in {folder}"))


def _dump_on_acl(model: str, backend: str, dump_dir: str) -> Path | None:
    """``--dump`` for an ``.om`` on the device: write ``acl.json`` and initialise ACL with it (stand-in
    tested only); returns the acl.json. None when the model runs on the emulator."""
    from npu_deploy.runtime.session import sniff_model

    kind = sniff_model(model)
    if kind == "onnx" and backend == "acl":
        raise InputError(f"--dump with --backend acl needs an .om: {model} is an ONNX model",
                         hint="convert it to an .om first (npu-deploy convert), then run the .om with --dump")
    if backend == "emulator" or kind != "om":
        return None
    from npu_deploy.runtime.acl import enable_dump

    return enable_dump(dump_dir, model)


def _ais_debug(value: str | None) -> list[str]:
    # ais_bench's --debug 1 prints the model description; bare --debug is npu-deploy's (tracebacks)
    if value is None or value.strip().lower() in ("0", "false"):
        return []
    if value.strip().lower() in ("1", "true"):
        return ["--describe"]
    raise click.BadParameter(f"{value!r} is not 0 or 1 (ais_bench's --debug)", param_hint="--debug")


# ais_bench spellings whose form differs from ours (the others are extra names of our options)
REWRITES = {"--model": positional("--model"),
            "--debug": Rewrite("--debug", _ais_debug, values=("0", "1", "true", "false"))}


@click.command("run", cls=HabitCommand, rewrites=REWRITES, context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("--batch-size", "--dymBatch", "--batchsize", "batch_size", type=int, default=None,
              help="Batch size to run (picks the batch gear; ais_bench: --dymBatch).")
@input_shape_option("--dymDims", "--dymShape", note="(ais_bench: --dymDims, --dymShape)")
@click.option("--output-size", "--outputSize", "output_size", default=None, metavar="BYTES,...",
              help="Output buffer sizes for dynamic-shape .om models (ais_bench: --outputSize); "
                   "the emulator sizes outputs itself.")
@click.option("--output", "output_dir", type=click.Path(file_okay=False), default=None,
              help="Write the outputs of the last run here, one file per output.")
@click.option("--output_dirname", "output_dirname", default=None, metavar="NAME",
              help="ais_bench: write the outputs into --output/NAME.")
@click.option("--outfmt", type=click.Choice(["npy", "bin", "txt"], case_sensitive=False), default="npy",
              show_default=True, help="Output file format (ais_bench: NPY, BIN, TXT).")
@click.option("--describe", is_flag=True, help="Print the model description first (ais_bench: --debug 1).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the measured numbers, model, backend, shapes and versions as JSON.")
@click.option("--device", "device_id", type=click.IntRange(min=0), default=0, show_default=True, help="Device id (.om only).")
@click.option("--backend", type=click.Choice(["auto", "emulator", "acl"]), default="auto", show_default=True)
@click.option("--profile", "profile_dir", type=click.Path(file_okay=False), default=None,
              help="Write an msprof-style profile folder here (estimated on the emulator).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed for --pure-data random.")
# -- batch over many NPUs on Ray (npu_deploy.distributed) --
@click.option("--npus", type=int, default=None,
              help="Batch mode: run every .npy/.npz sample of --input-dir on N NPUs (one Ray actor each), "
                   "one output file per sample in --output; exit 1 when a sample failed (each is listed with its "
                   "id). Needs Ray: pip install '.[ray]' in the npu-deploy clone.")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="Batch mode on a running Ray cluster (host:port, ray://host:port or auto); "
                   "default: a local cluster declaring --npus NPUs.")
@click.option("--ray-start-timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Batch mode: seconds a local Ray cluster may take to start (default 180; "
                   "NPU_DEPLOY_RAY_START_TIMEOUT). A slower start is exit 3.")
# -- end of batch options --
# -- operator dumps (npu_deploy.converters.files.dump) --
@click.option("--dump", "dump_dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Dump every op's input and output tensors (device format) as ACL operator dump files "
                   "under DIR/{time}/{device}/{model}/1/0/. Emulator: one extra recorded run of the same "
                   "inputs before the timed runs; ACL: switched on through acl.json at acl.init "
                   "(stand-in tested only).")
# -- end of dump options --
@click.pass_context
def command(ctx, model, inputs, input_dir, pure_data, loop, warmup, batch_size, input_shape, output_size,
            output_dir, output_dirname, outfmt, describe, json_path, device_id, backend, profile_dir, seed, npus, ray_address,
            ray_start_timeout, dump_dir):
    """Run MODEL (an offline bundle or .om) and report latency and throughput.

    Prints latency min/mean/p50/p90/p95/p99 and throughput, and separately the host-to-device,
    compute and device-to-host times. On the CPU emulator these are CPU times, not device times.

    Example: npu-deploy run model.bundle --loop 100 --warmup 5 --json run.json
    """
    early("run: starting Ray" if npus is not None or ray_address is not None else "run: loading the model")
    from npu_deploy.runtime.bench import benchmark
    from npu_deploy.runtime.session import InferenceSession

    if dump_dir is not None and (npus is not None or ray_address is not None):
        raise InputError("--dump records one run of one session; it does not go with --npus/--ray-address",
                         hint="dump one sample without --npus")
    if npus is not None or ray_address is not None:
        if inputs:
            raise InputError("--input is for one run; with --npus / --ray-address the samples come from "
                             "--input-dir", hint="put one <id>.npy (or .npz) per sample in a folder")
        _run_batch(ctx, model, input_dir, output_dir, npus, ray_address, backend, json_path, ray_start_timeout)
        return
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
    if output_dirname is not None:
        if output_dir is None:
            raise InputError("--output_dirname names a folder inside --output", hint="give --output DIR too")
        if not output_dirname.strip() or Path(output_dirname).name != output_dirname or output_dirname in (".", ".."):
            raise InputError(f"--output_dirname {output_dirname!r} must be one folder name, not a path")
        output_dir = str(Path(output_dir) / output_dirname)
    dump_acl = _dump_on_acl(model, backend, dump_dir) if dump_dir is not None else None
    with InferenceSession(model, device_id=device_id, backend=backend, profile=profile_dir is not None,
                          profile_dir=profile_dir) as sess:
        metas = [m.meta for m in sess.get_inputs()]   # TensorMeta: -1 on dynamic dims (NodeArg.shape has None)
        sources: list[str] = []
        feeds = build_feeds(metas, inputs, input_dir, pure_data, shapes, batch_size, seed, sources)
        names = [m.name for m in sess.get_outputs()]
        if output_dir is not None:  # before the runs: an output file must not be one of the inputs
            planned = output_paths(output_dir, names, outfmt) + [Path(output_dir) / NAMES_FILE]
            refuse_overwriting([("--output file", p) for p in planned] + [("--json", json_path)],
                               [("model", model), ("--input-dir", input_dir), *[("input file", p) for p in sources]])
        end_early()
        click.echo(f"model: {model}  backend: {sess.backend_name}")
        if sess.conversion:
            click.echo(f"  converted in memory: {sess.conversion}")
        if describe:
            for line in describe_lines(sess):
                click.echo(printable(line))
        for n, a in feeds.items():
            click.echo(printable(f"  input  {n}: {a.dtype.name} {tuple(a.shape)}"))
        if sizes:
            click.echo("  note: --output-size is not needed here and is ignored: outputs are sized from the "
                       "model (static or gear shapes)")
        if dump_dir is not None and dump_acl is None:
            _dump_emulator(sess, feeds, dump_dir, model, device_id)
        # a bar once the runs have lasted ~2 s, on a terminal only (in a log file it is only noise)
        with RunProgress(loop, interactive()) as bar:
            res, outs = benchmark(sess, feeds, loop=loop, warmup=warmup, model=str(model), progress=bar)
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
    if dump_acl is not None:
        click.echo(printable(f"dump (ACL, every run): under {dump_acl.parent} "
                             f"(acl.json {dump_acl} given to acl.init)"))
    if json_path is not None:
        res.to_json(json_path)
        click.echo(f"json written: {json_path}")
    click.echo(res.verdict())
    ctx.exit(0)


def _run_batch(ctx, model, input_dir, output_dir, npus, ray_address, backend, json_path,
               ray_start_timeout=None) -> None:
    """``run MODEL --input-dir DIR --output DIR --npus N [--ray-address ADDR]``: see npu_deploy.distributed."""
    from npu_deploy.runtime.distributed import run_batch

    if input_dir is None:
        raise InputError("--npus / --ray-address run a batch: give the samples with --input-dir DIR",
                         hint="one sample per file: <id>.npy, or <id>.npz with one member per input")
    refuse_overwriting([("--json", json_path), ("--output", output_dir)], [("model", model), ("--input-dir", input_dir)])
    if json_path is not None:
        check_dest(Path(json_path))
    result = run_batch(model, input_dir, npus=npus, address=ray_address, output=output_dir, backend=backend,
                       start_timeout=ray_start_timeout)
    end_early()
    for w in result.warnings:
        click.echo(f"npu-deploy: warning: {printable(w)}", err=True)
    for f in result.failures[:20]:
        click.echo(printable(f"  failed {f.id}: {f.error}"), err=True)
    if len(result.failures) > 20:
        click.echo(f"  ... and {len(result.failures) - 20} more failed samples (all in --json)", err=True)
    click.echo(result.table())
    if output_dir is not None:
        click.echo(printable(f"outputs written: {result.ok} files in {output_dir}"))
    if json_path is not None:
        result.to_json(json_path)
        click.echo(f"json written: {json_path}")
    click.echo(result.verdict())
    ctx.exit(0 if result else 1)
