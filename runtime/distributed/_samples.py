"""Samples in (a folder of ``.npy``/``.npz`` files or an iterable), outputs out (one file per sample)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from npu_deploy._io import (atomic_write, clean_parts_once, load_npy, load_npz, make_output_folder,
                            safe_file_stem)
from npu_deploy._text import printable
from npu_deploy.errors import InputError, NpuDeployError

INPUT_SUFFIXES = (".npy", ".npz")


@dataclass
class _Sample:
    index: int
    id: str
    feeds: dict | None = None
    error: str | None = None
    path: Path | None = None    # a sample file not read yet (the actor reads it when it shares the file system)
    dest: Path | None = None    # where its outputs go (output folder given)

    def nbytes(self) -> int:
        if self.feeds is not None:
            return sum(getattr(a, "nbytes", 0) for a in self.feeds.values())
        try:
            return self.path.stat().st_size if self.path is not None else 0
        except OSError:
            return 0


@dataclass
class _Chunk:
    """What one Ray call carries to an actor: the samples, as arrays, as places in the driver's shared
    memory (:class:`_Ring`) or as files the actor reads itself, and, when the actor writes the outputs
    itself, their destinations (it writes each to a temporary file beside its destination and the
    driver renames it there, in input order)."""

    feeds: list[dict] | None = None      # one dict per sample
    slots: list[dict] | None = None      # or {input: (offset, shape, dtype)} in the shared memory `ring`
    ring: str | None = None
    paths: list[str] | None = None       # or the sample files
    dests: list[str] | None = None

    def __len__(self) -> int:
        return len(next(x for x in (self.feeds, self.slots, self.paths) if x is not None))

    def sample(self, i: int, input_names: list[str], ring_buffer=None) -> dict:
        if self.slots is not None:
            feeds = {}
            for name, (offset, shape, dtype) in self.slots[i].items():
                a = np.ndarray(shape, np.dtype(dtype), buffer=ring_buffer, offset=offset)
                a.flags.writeable = False  # the driver's memory: read, never written
                feeds[name] = a
            return feeds
        if self.feeds is not None:
            return self.feeds[i]
        return _feeds_from_file(Path(self.paths[i]), input_names)


def input_files(folder: str | os.PathLike) -> tuple[list[Path], list[str]]:
    """The sample files of ``folder`` (``.npy`` / ``.npz``, in name order) and the names of the other
    entries it holds (left alone, reported as a warning)."""
    d = Path(folder)
    if not d.is_dir():
        raise InputError(f"--input-dir {d} is not a folder", hint="give the folder holding the .npy/.npz samples")
    files, other = [], []
    with os.scandir(d) as it:
        for e in it:
            if e.name.startswith("."):  # our own .part files, editor and OS clutter
                continue
            if e.is_file() and Path(e.name).suffix.lower() in INPUT_SUFFIXES:
                files.append(d / e.name)
            else:
                other.append(e.name)
    files.sort(key=lambda p: p.name)
    return files, sorted(other)


def _feeds_from_file(path: Path, input_names: list[str]) -> dict:
    if path.suffix.lower() == ".npy":
        if len(input_names) != 1:
            raise InputError(f"a .npy holds one array and the model has {len(input_names)} inputs "
                             f"({', '.join(input_names)})", hint="give an .npz with one member per input")
        return {input_names[0]: load_npy(path)}
    arrays = load_npz(path)
    if len(input_names) == 1 and len(arrays) == 1:
        return {input_names[0]: next(iter(arrays.values()))}
    missing = [n for n in input_names if n not in arrays]
    extra = [n for n in arrays if n not in input_names]
    if missing or extra:
        raise InputError(f"members {sorted(arrays)} do not match the model inputs {input_names}",
                         hint="name each .npz member after a model input")
    return arrays


def _feeds_from_item(item: Any, input_names: list[str]) -> dict:
    if isinstance(item, dict):
        return item
    if isinstance(item, np.ndarray):
        if len(input_names) != 1:
            raise InputError(f"an array feeds a one-input model; this one has inputs {', '.join(input_names)}",
                             hint="give a dict {input name: array}")
        return {input_names[0]: item}
    raise InputError(f"a sample is a dict of arrays or an array, not {type(item).__name__}")


def _samples(inputs: Any, input_names: list[str]) -> tuple[Iterator[_Sample], int | None, list[str]]:
    """(samples, how many if known, warnings). The samples of a folder come as paths, read where they
    are run (:func:`_read`); those of an iterable as it is consumed."""
    if isinstance(inputs, (str, os.PathLike)):
        files, other = input_files(inputs)
        if not files:
            raise InputError(f"--input-dir {inputs}: no .npy or .npz files in it",
                             hint="one sample per file: <id>.npy (one input) or <id>.npz (one member per input)")
        warnings = []
        if other:
            shown = ", ".join(printable(n) for n in other[:5])
            what = "entry that is not a .npy/.npz file was" if len(other) == 1 else "entries that are not .npy/.npz files were"
            warnings.append(f"{inputs}: {len(other)} {what} left alone "
                            f"({shown}{', ...' if len(other) > 5 else ''})")
        return (_Sample(i, p.name, path=p) for i, p in enumerate(files)), len(files), warnings

    try:
        total = len(inputs)
    except TypeError:
        total = None

    def gen_items() -> Iterator[_Sample]:
        for i, item in enumerate(inputs):
            sid = f"{i:06d}"
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                sid, item = item
            try:
                yield _Sample(i, sid, feeds=_feeds_from_item(item, input_names))
            except NpuDeployError as e:
                yield _Sample(i, sid, error=str(e))
    return gen_items(), total, []


def _read(s: _Sample, input_names: list[str]) -> None:
    """Read a sample file in this process (for an actor that does not share its file system)."""
    if s.path is not None and s.feeds is None and s.error is None:
        try:
            s.feeds = _feeds_from_file(s.path, input_names)
        except NpuDeployError as e:
            s.error = str(e)


# ------------------------------------------------------------------------------------------ outputs
def write_outputs(f, outs: list[np.ndarray], names: list[str]) -> None:
    """One sample's outputs into an open file: ``.npy`` for one output, else ``.npz`` (member per output)."""
    if len(outs) == 1:
        np.save(f, outs[0], allow_pickle=False)
    else:
        np.savez(f, **{safe_file_stem(n): a for n, a in zip(names, outs)})


class _Writer:
    """One file per sample in ``folder``: ``<id>.npy`` (one output) or ``<id>.npz``; names kept distinct.
    Every sample gets its name in input order whether it fails or not, so that the names do not depend on
    which samples fail."""

    def __init__(self, folder: str | os.PathLike, output_names: list[str]):
        self.folder = make_output_folder(folder)
        # stale parts of earlier runs go now, not at this process's first write: by then a finished part
        # of an actor that died since may be waiting to be put in place
        clean_parts_once(self.folder)
        self.names = output_names
        self._taken: set[str] = set()

    def path_for(self, sample_id: str) -> Path:
        stem = Path(sample_id).stem if Path(sample_id).suffix.lower() in INPUT_SUFFIXES else sample_id
        safe = safe_file_stem(stem)
        cand, k = safe, 1
        while cand.lower() in self._taken:  # "a.npy" and "a.npz" must not land in one file
            k += 1
            cand = f"{safe}_{k}"
        self._taken.add(cand.lower())
        return self.folder / f"{cand}.{'npy' if len(self.names) == 1 else 'npz'}"

    def write(self, path: Path, outs: list[np.ndarray]) -> Path:
        with atomic_write(path, "wb") as f:
            write_outputs(f, outs, self.names)
        return path
