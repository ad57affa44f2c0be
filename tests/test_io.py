"""Atomic outputs, output sets, stale temporaries and size-checked array reading (npu_deploy._io)."""

import errno
import io
import os
import signal
import stat
import subprocess
import sys
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from npu_deploy import _io
from npu_deploy._io import (atomic_path, atomic_write, clean_stale_parts, install_part, load_npy, load_npz, outputs,
                            refuse_overwriting, safe_file_stem, same_file, write_part)
from npu_deploy.errors import EXIT_ENVIRONMENT, InputError, Interrupted, OutputError
from tests.fullfs import full_fs  # noqa: F401  (fixture)
from tests.fuzzing import examples


def _parts(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


# ------------------------------------------------------------------------------------ atomic writes
def test_output_mode_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644


def test_failure_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_temporary_name_carries_the_writer_pid_and_fits_name_max(tmp_path):
    long_name = "m" * 250 + ".json"  # 255 bytes: the longest name a file system takes
    with atomic_path(tmp_path / long_name) as tmp:
        assert tmp.name.startswith(".") and tmp.name.endswith(".part")
        assert f".{os.getpid()}." in tmp.name and len(os.fsencode(tmp.name)) <= 255
        tmp.write_text("{}")
    assert (tmp_path / long_name).read_text() == "{}" and _parts(tmp_path) == []


def test_an_oserror_while_writing_is_one_exit_3_error_with_path_and_reason(tmp_path):
    dest = tmp_path / "r.json"
    with pytest.raises(OutputError) as ei:
        with atomic_write(dest, "w") as f:
            f.write("{")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert ei.value.exit_code == EXIT_ENVIRONMENT == 3
    assert str(dest) in str(ei.value) and "No space left on device" in str(ei.value)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_exit_3_and_leaves_no_temporary(full_fs):
    before = sorted(p.name for p in full_fs.iterdir())
    with pytest.raises(OutputError, match="No space left on device") as ei:
        with atomic_write(full_fs / "big.bin") as f:
            f.write(os.urandom(256 * 1024))
    assert ei.value.exit_code == 3 and str(full_fs / "big.bin") in str(ei.value)
    assert sorted(p.name for p in full_fs.iterdir()) == before


def _part_from_child(dest):
    """write_part in another process (as a Ray actor does): the part carries that process's pid."""
    code = ("import sys; from npu_deploy._io import write_part; "
            "print(write_part(sys.argv[1], lambda f: f.write(b'from the child')))")
    out = subprocess.run([sys.executable, "-c", code, str(dest)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_a_part_written_by_another_process_is_put_in_place_here(tmp_path):
    dest = tmp_path / "s1.npy"
    part = _part_from_child(dest)
    assert not dest.exists() and _parts(tmp_path) == [os.path.basename(part)]
    assert f".{os.getpid()}." not in part  # the writer's pid, not ours
    install_part(part, dest)
    assert dest.read_bytes() == b"from the child" and _parts(tmp_path) == []


def test_install_part_refuses_what_is_not_a_part_for_that_destination(tmp_path):
    (tmp_path / "notes.txt").write_text("the user's file")
    with pytest.raises(OutputError, match="not a temporary file written for"):
        install_part(tmp_path / "notes.txt", tmp_path / "a.npy")
    other = write_part(tmp_path / "b.npy", lambda f: f.write(b"b"))
    with pytest.raises(OutputError, match="not a temporary file written for"):
        install_part(other, tmp_path / "a.npy")  # a part of b.npy never becomes a.npy
    (tmp_path / "sub").mkdir()
    with pytest.raises(OutputError, match="not a temporary file written for"):
        install_part(other, tmp_path / "sub" / "b.npy")  # nor a file of another folder
    assert (tmp_path / "notes.txt").read_text() == "the user's file"
    assert not (tmp_path / "a.npy").exists() and not (tmp_path / "sub" / "b.npy").exists()


def test_a_failed_write_part_leaves_nothing_and_a_failed_run_undoes_installed_parts(tmp_path):
    def boom(f):
        f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError, match="No space left on device"):
        write_part(tmp_path / "x.npy", boom)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "old.npy").write_bytes(b"the user's earlier output")
    with pytest.raises(RuntimeError):
        with outputs():
            install_part(_part_from_child(tmp_path / "new.npy"), tmp_path / "new.npy")
            install_part(_part_from_child(tmp_path / "old.npy"), tmp_path / "old.npy")
            assert (tmp_path / "old.npy").read_bytes() == b"from the child"
            raise RuntimeError("the run fails later")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.npy"]
    assert (tmp_path / "old.npy").read_bytes() == b"the user's earlier output"


def test_write_part_never_cleans_the_folder_so_a_dead_writers_finished_part_can_still_be_installed(tmp_path):
    part = _part_from_child(tmp_path / "a.npy")  # its writer has exited: by the rule, the part is stale
    write_part(tmp_path / "b.npy", lambda f: f.write(b"b"))  # this process's first write into the folder
    assert os.path.exists(part)
    install_part(part, tmp_path / "a.npy")
    assert (tmp_path / "a.npy").read_bytes() == b"from the child"


def test_parts_of_a_dead_writer_process_are_stale(tmp_path):
    part = _part_from_child(tmp_path / "y.npy")  # the child has exited: its part is garbage now
    assert clean_stale_parts(tmp_path) == [tmp_path / os.path.basename(part)]


# ------------------------------------------------------------------------------------- output sets
def test_a_failed_run_removes_what_it_wrote_and_restores_what_it_replaced(tmp_path):
    (tmp_path / "old.json").write_text("the user's earlier report")
    with pytest.raises(OutputError):
        with outputs():
            with atomic_write(tmp_path / "model.bundle") as f:
                f.write(b"bundle")
            with atomic_write(tmp_path / "old.json", "w") as f:
                f.write("new report")
            assert (tmp_path / "old.json").read_text() == "new report"  # readable inside the run
            with atomic_write(tmp_path / "third.json", "w") as f:
                raise OSError(errno.ENOSPC, "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]
    assert (tmp_path / "old.json").read_text() == "the user's earlier report"


def test_a_successful_run_keeps_its_outputs_and_no_backup(tmp_path):
    (tmp_path / "r.json").write_text("old")
    with outputs():
        with atomic_write(tmp_path / "r.json", "w") as f:
            f.write("new")
        with atomic_write(tmp_path / "b.bin") as f:
            f.write(b"b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "r.json"]
    assert (tmp_path / "r.json").read_text() == "new"


def test_nested_output_sets_join_the_outer_one(tmp_path):
    with pytest.raises(RuntimeError):
        with outputs():
            with outputs():  # e.g. convert() called by `profile run`
                with atomic_write(tmp_path / "a.bin") as f:
                    f.write(b"a")
            assert (tmp_path / "a.bin").exists()
            raise RuntimeError("later step failed")
    assert not (tmp_path / "a.bin").exists()


def test_adopted_files_of_an_external_tool_are_removed_on_failure(tmp_path):
    om = tmp_path / "model.om"
    with pytest.raises(RuntimeError):
        with outputs() as out:
            om.write_bytes(b"IMOD")  # as ATC would write it
            out.adopt(om)
            raise RuntimeError("report failed")
    assert not om.exists()


def test_a_signal_during_a_rename_is_delivered_after_it(tmp_path):
    """The handler defers a signal while a file operation must stay whole, then raises it."""
    with pytest.raises(Interrupted) as ei:
        with _io._critical():
            assert _io.defer_signal(signal.SIGTERM)
            (tmp_path / "x").write_text("still done")
    assert ei.value.signum == signal.SIGTERM and ei.value.exit_code == 143
    assert (tmp_path / "x").read_text() == "still done"
    assert not _io.defer_signal(signal.SIGTERM)  # outside a section: the caller raises at once


# ---------------------------------------------------------------------------------- stale parts
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_of_dead_writers_are_removed_and_nothing_else(tmp_path):
    dead = _dead_pid()
    ours_dead = tmp_path / f".model.bundle.{dead}.k2j4_xq9.part"
    ours_live = tmp_path / f".model.bundle.{os.getpid()}.abcdefgh.part"
    legacy_old = tmp_path / ".model.bundle.q1w2e3r4.part"
    legacy_new = tmp_path / ".report.json.zzzzzzzz.part"
    user_files = [tmp_path / ".notes.part", tmp_path / "model.bundle.part",
                  tmp_path / f".x.{dead}.TOOLONGRANDOM.part", tmp_path / "keep.bundle"]
    for p in [ours_dead, ours_live, legacy_old, legacy_new, *user_files]:
        p.write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(legacy_old, (two_hours_ago, two_hours_ago))
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not ours")
    link = tmp_path / f".link.{dead}.abcdefgh.part"
    link.symlink_to(target)  # a symlink is never followed nor removed
    removed = clean_stale_parts(tmp_path)
    assert sorted(p.name for p in removed) == sorted([ours_dead.name, legacy_old.name])
    left = {p.name for p in tmp_path.iterdir()}
    assert {ours_live.name, legacy_new.name, link.name, "elsewhere", *(p.name for p in user_files)} == left


def test_the_next_write_into_a_folder_cleans_it(tmp_path, monkeypatch):
    monkeypatch.setattr(_io, "_cleaned", set())
    stale = tmp_path / f".model.bundle.{_dead_pid()}.abcdefgh.part"
    stale.write_bytes(b"\0" * 1000)
    with atomic_write(tmp_path / "other.json", "w") as f:
        f.write("{}")
    assert not stale.exists() and (tmp_path / "other.json").exists()


# ---------------------------------------------------------------------------------- same file
def test_same_file_sees_through_hard_links_and_symlinks(tmp_path):
    a = tmp_path / "a.npy"
    a.write_bytes(b"x")
    os.link(a, tmp_path / "hard.npy")
    (tmp_path / "soft.npy").symlink_to(a)
    assert same_file(a, tmp_path / "hard.npy") and same_file(a, tmp_path / "soft.npy")
    assert same_file(a, tmp_path / "." / "a.npy")
    assert not same_file(a, tmp_path / "b.npy")
    with pytest.raises(InputError, match="overwrite"):
        refuse_overwriting([("--json", tmp_path / "hard.npy")], [("input", a)])


# ---------------------------------------------------------------------------------- safe reading
def _lying_npy(shape=(10**15,), total=193) -> bytes:
    h = io.BytesIO()
    np.lib.format.write_array_header_1_0(h, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return h.getvalue() + b"\0" * (total - len(h.getvalue()))


def test_a_small_npy_claiming_petabytes_is_refused_before_allocating(tmp_path):
    p = tmp_path / "huge.npy"
    p.write_bytes(_lying_npy())
    assert p.stat().st_size == 193
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="header says"):
            load_npy(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("content, needle", [
    (b"", "empty"),
    (b"\x93NUMPY\x01\x00garbage", "cannot read"),
    (b"hello, not numpy", "cannot read"),
])
def test_bad_npy_is_one_input_error(tmp_path, content, needle):
    p = tmp_path / "x.npy"
    p.write_bytes(content)
    with pytest.raises(InputError, match=needle):
        load_npy(p)


def test_npy_with_objects_or_truncated_is_refused_and_good_ones_read(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="no pickle"):
        load_npy(tmp_path / "obj.npy")
    good = np.asfortranarray(np.arange(24, dtype=np.float16).reshape(2, 3, 4))
    np.save(tmp_path / "good.npy", good)
    back = load_npy(tmp_path / "good.npy")
    assert back.dtype == good.dtype and np.array_equal(back, good)
    raw = (tmp_path / "good.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(raw[:-2])
    with pytest.raises(InputError, match="truncated"):
        load_npy(tmp_path / "cut.npy")


def test_npz_members_are_size_checked_and_must_be_arrays(tmp_path):
    with zipfile.ZipFile(tmp_path / "lie.npz", "w") as z:
        z.writestr("x.npy", _lying_npy())
    with pytest.raises(InputError, match="header says"):
        load_npz(tmp_path / "lie.npz")
    with zipfile.ZipFile(tmp_path / "odd.npz", "w") as z:
        z.writestr("x.npy", b"\0" * 10)
        z.writestr("readme.txt", b"hello")
    with pytest.raises(InputError):
        load_npz(tmp_path / "odd.npz")
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        load_npz(tmp_path / "empty.npz")
    feeds = {"x": np.ones((2, 3), np.float32), "ids": np.arange(4, dtype=np.int64)}
    np.savez_compressed(tmp_path / "ok.npz", **feeds)
    back = load_npz(tmp_path / "ok.npz")
    assert set(back) == set(feeds) and all(np.array_equal(back[k], feeds[k]) for k in feeds)


# ---------------------------------------------------------------------------------- file names
@pytest.mark.parametrize("name", ["n" * 300, "y\x00z", "..", ".", "", "a/b\x1b[2J", "日本語" * 40, "con:0"])
def test_any_tensor_name_gives_a_creatable_distinct_file_name(tmp_path, name):
    stem = safe_file_stem(name)
    path = tmp_path / f"{stem}_99.npy"
    path.write_bytes(b"x")  # creatable: no NUL, no separator, within NAME_MAX, not . or ..
    assert path.parent == tmp_path and not stem.startswith(".")
    assert safe_file_stem(name + "x") != stem or name == ""


# ---------------------------------------------------------------------------------- fuzz


def _mutate(raw: bytes, edits) -> bytes:
    b = bytearray(raw)
    for pos, value, cut in edits:
        if cut and b:
            del b[pos % len(b):]
        elif b:
            b[pos % len(b)] = value
    return bytes(b)


# (position, new byte value, cut the file there instead)
_edits = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255), st.just(False)), max_size=6)
_cuts = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255), st.booleans()), max_size=3)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.one_of(_edits, _cuts))
@example(edits=[(411, 0, False)])  # an .npz member whose name becomes empty: zipfile's is_dir() raised IndexError
@pytest.mark.slow
def test_mutated_npy_and_npz_read_or_refuse_cleanly(tmp_path, edits):
    """Bytes flipped or cut anywhere (header included): an array or one InputError, never another
    exception, never a huge allocation."""
    buf = io.BytesIO()
    np.save(buf, np.arange(60, dtype=np.float32).reshape(3, 4, 5))
    npy = _mutate(buf.getvalue(), edits)
    (tmp_path / "m.npy").write_bytes(npy)
    zbuf = io.BytesIO()
    np.savez_compressed(zbuf, a=np.arange(30, dtype=np.int16), b=np.ones((2, 2)))
    (tmp_path / "m.npz").write_bytes(_mutate(zbuf.getvalue(), edits))
    for load in (load_npy, load_npz):
        path = tmp_path / ("m.npy" if load is load_npy else "m.npz")
        tracemalloc.start()
        try:
            load(path)
        except InputError:
            pass
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 16 << 20


# ------------------------------------------------------------------------------------- issue 23
def test_an_output_inside_a_folder_being_read_is_refused_also_through_a_symlink(tmp_path):
    cap = tmp_path / "capture"
    (cap / "sub").mkdir(parents=True)
    (cap / "sub" / "data.csv").write_text("a,b\n")
    via = tmp_path / "via"
    via.symlink_to(cap / "sub")
    for out in (cap / "sub" / "data.csv", cap / "new.json", via / "data.csv", via / "other.html"):
        with pytest.raises(InputError, match="inside the capture"):
            _io.refuse_overwriting([("--json", out)], [("capture", cap)])
    # beside the folder, or a folder merely named alike, is fine
    _io.refuse_overwriting([("--json", tmp_path / "capture.json")], [("capture", cap)])
    (tmp_path / "capture2").mkdir()
    _io.refuse_overwriting([("--json", tmp_path / "capture2" / "r.json")], [("capture", cap)])
    assert (cap / "sub" / "data.csv").read_text() == "a,b\n"


def test_parts_a_killed_dump_left_in_its_own_time_folder_are_removed_by_the_next(tmp_path):
    dead = _dead_pid()
    old_run = tmp_path / "dd" / "20261202003000" / "0" / "m" / "1" / "0"
    old_run.mkdir(parents=True)
    stale = old_run / f".Conv.conv1.1.1.123.{dead}.abcdefgh.part"
    stale.write_bytes(b"x")
    kept_run = tmp_path / "dd" / "20261202003100" / "0" / "m" / "1" / "0"
    kept_run.mkdir(parents=True)
    (kept_run / "Conv.conv1.1.1.124").write_bytes(b"dump")
    live = kept_run / f".Relu.r.1.1.125.{os.getpid()}.abcdefgh.part"
    live.write_bytes(b"x")
    removed = _io.clean_stale_parts_below(tmp_path / "dd")
    assert removed == [stale]
    assert not (tmp_path / "dd" / "20261202003000").exists()  # only the stale part was in that run's folders
    assert live.exists() and (kept_run / "Conv.conv1.1.1.124").exists()
