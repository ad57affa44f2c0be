"""Device memory plan: every activation gets a 256-byte aligned offset in one arena, with reuse.

A tensor is live from the step that produces it (``first_use``) to the last step that reads it
(``last_use``), both inclusive, in topological step order. Two tensors whose lifetimes intersect must
not share bytes; tensors whose lifetimes are disjoint may. The plan reports the arena size against
two references:

* ``lower_bound_bytes``: the largest sum of aligned sizes of tensors live at one step. No plan can
  use less.
* ``no_reuse_bytes``: the sum of all aligned sizes (every tensor its own slot).

A valid plan always satisfies ``lower_bound_bytes <= arena_bytes <= no_reuse_bytes``.

The lifetimes come from the planner (``planner._memory_plan``: the plan's own node order, stored sizes
and TransData destinations); ``Plan.memory`` is the :class:`MemoryPlan` itself, the bundle manifest holds
its :meth:`MemoryPlan.summary`.

Public API (used by the planner and the bundle manifest)::

    ALIGNMENT: int = 256
    MemTensor(name: str, nbytes: int, first_use: int, last_use: int)
        # steps are ints in topological order; graph inputs may start at -1, outputs may end at
        # len(nodes) (read back after the last step). first_use <= last_use, nbytes >= 0.
    plan_memory(tensors: Sequence[MemTensor], alignment: int = 256) -> MemoryPlan
        # raises InputError on bad tensors (negative size, first_use > last_use, duplicate name,
        # alignment not a positive power of two); the returned plan is already validated.
    MemoryPlan (a npu_deploy._result.Result):
        .tensors: list[MemTensor]   .offsets: dict[str, int]   .alignment: int
        .arena_bytes: int   .lower_bound_bytes: int   .no_reuse_bytes: int
        .slot_bytes(name) -> int                  # aligned size (0 for a zero-byte tensor)
        .validate() -> None                       # InternalError on misalignment / live overlap
        .summary() -> dict                        # {arena_bytes, lower_bound_bytes, no_reuse_bytes,
                                                  #  alignment} for the bundle manifest "memory"
        .to_dict() / .to_json() / MemoryPlan.load(...)
        bool(plan) -> True when the arena is within 1.25x the lower bound; .verdict() one line

Zero-byte tensors get offset 0 and a zero-size slot; they never conflict with anything.

Algorithm: greedy by size (largest aligned size first, ties by longer lifetime, then name), each
tensor placed at the best-fitting gap between the already placed tensors whose lifetimes intersect
its own, else above the highest of them; for graphs up to 4096 tensors whose plan is above the
lower bound, the same pass ordered by lifetime and by size x lifetime is tried too, keeping the
smallest arena. Conflicting tensors are found by bisection in the
short-lived tensors sorted by ``first_use`` plus one vectorised test over the few long-lived ones,
so the cost grows with the number of conflicts, not with all pairs (``benchmarks/bench_memory.py``).

>>> plan = plan_memory([MemTensor("a", 1000, 0, 1), MemTensor("b", 300, 1, 2),
...                     MemTensor("c", 1000, 2, 3)])
>>> plan.offsets["a"] == plan.offsets["c"], plan.arena_bytes, plan.lower_bound_bytes
(True, 1536, 1536)
>>> plan.no_reuse_bytes
2560
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import numbers
from typing import Any, ClassVar, Sequence

import numpy as np

from npu_deploy._result import Result
from npu_deploy.errors import InputError, InternalError

ALIGNMENT = 256

# bool(plan) is True when the arena is within this factor of the lower bound.
GOOD_RATIO = 1.25


@dataclasses.dataclass(frozen=True)
class MemTensor:
    """One activation: ``nbytes`` live from step ``first_use`` to step ``last_use`` (inclusive).

    >>> MemTensor("conv1_out", 802816, 0, 3).nbytes
    802816
    """

    name: str
    nbytes: int
    first_use: int
    last_use: int


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _normalise(tensors: Sequence[MemTensor]) -> list[MemTensor]:
    """Plain Python ints (numpy integers are accepted) so the plan serialises cleanly."""
    out = []
    for t in tensors:
        vals = (t.nbytes, t.first_use, t.last_use)
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in vals):
            raise InputError(f"memory plan: tensor {t.name!r} has non-integer size or steps {vals}",
                             hint="sizes are bytes and steps are node indices (integers)")
        out.append(t if all(type(v) is int for v in vals)
                   else MemTensor(str(t.name), int(t.nbytes), int(t.first_use), int(t.last_use)))
    return out


def _check_inputs(tensors: Sequence[MemTensor], alignment: int) -> None:
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise InputError(f"memory plan: alignment {alignment!r} is not a positive power of two",
                         hint="use the default 256")
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise InputError(f"memory plan: tensor {t.name!r} appears twice",
                             hint="give each activation one entry")
        seen.add(t.name)
        if t.nbytes < 0:
            raise InputError(f"memory plan: tensor {t.name!r} has size {t.nbytes!r}",
                             hint="sizes must be non-negative integers (bytes)")
        if t.first_use > t.last_use:
            raise InputError(f"memory plan: tensor {t.name!r} is live from step {t.first_use} to "
                             f"{t.last_use}", hint="first_use must not be after last_use")


class _ConflictIndex:
    """Placed tensors, queried for those whose lifetime meets [a, b].

    Lifetimes are split at ``span`` (the 95th percentile): short-lived tensors sit in arrays sorted
    by ``first_use`` and any that meets [a, b] starts in [a - span, b], a contiguous slice found by
    bisection; the few long-lived ones are tested all at once with numpy. A query costs about the
    number of tensors live around [a, b], not the number of tensors.
    """

    VECTOR_FROM = 96  # sets larger than this are filtered with numpy instead of a Python loop

    def __init__(self, tensors: Sequence[MemTensor], sizes: list[int]):
        n = len(tensors)
        lives = [t.last_use - t.first_use for t in tensors]
        self.span = sorted(lives)[(95 * (n - 1)) // 100] if n else 0
        short = sorted((i for i in range(n) if lives[i] <= self.span),
                       key=lambda i: tensors[i].first_use)
        long_ = [i for i in range(n) if lives[i] > self.span]
        self.where: dict[int, tuple[bool, int]] = {}
        for p, i in enumerate(short):
            self.where[i] = (True, p)
        for p, i in enumerate(long_):
            self.where[i] = (False, p)
        self.s_first = [tensors[i].first_use for i in short]
        self.s_last = [tensors[i].last_use for i in short]
        self.s_size = [sizes[i] for i in short]
        self.s_off = [-1] * len(short)
        self.s_last_np = np.array(self.s_last, dtype=np.int64)
        self.s_size_np = np.array(self.s_size, dtype=np.int64)
        self.s_off_np = np.full(len(short), -1, dtype=np.int64)
        self.l_first = np.array([tensors[i].first_use for i in long_], dtype=np.int64)
        self.l_last = np.array([tensors[i].last_use for i in long_], dtype=np.int64)
        self.l_size = np.array([sizes[i] for i in long_], dtype=np.int64)
        self.l_off = np.full(len(long_), -1, dtype=np.int64)
        self.l_placed: list[tuple[int, int, int, int]] = []   # (first, last, offset, end)
        self.l_vector = len(long_) > self.VECTOR_FROM

    def place(self, i: int, offset: int) -> None:
        is_short, p = self.where[i]
        if is_short:
            self.s_off[p] = offset
            self.s_off_np[p] = offset
        elif self.l_vector:
            self.l_off[p] = offset
        else:
            self.l_placed.append((int(self.l_first[p]), int(self.l_last[p]), offset,
                                  offset + int(self.l_size[p])))

    def busy(self, a: int, b: int) -> list[tuple[int, int]]:
        """(offset, end) of every placed tensor live at some step in [a, b]."""
        lo = bisect.bisect_left(self.s_first, a - self.span)
        hi = bisect.bisect_right(self.s_first, b)
        out: list[tuple[int, int]] = []
        if hi - lo <= self.VECTOR_FROM:
            s_off, s_last, s_size = self.s_off, self.s_last, self.s_size
            for p in range(lo, hi):
                o = s_off[p]
                if o >= 0 and s_last[p] >= a:
                    out.append((o, o + s_size[p]))
        else:
            off = self.s_off_np[lo:hi]
            sel = np.flatnonzero((off >= 0) & (self.s_last_np[lo:hi] >= a))
            if sel.size:
                o = off[sel]
                out.extend(zip(o.tolist(), (o + self.s_size_np[lo:hi][sel]).tolist()))
        if self.l_vector:
            sel = np.flatnonzero((self.l_off >= 0) & (self.l_first <= b) & (self.l_last >= a))
            if sel.size:
                o = self.l_off[sel]
                out.extend(zip(o.tolist(), (o + self.l_size[sel]).tolist()))
        else:
            out.extend((o, e) for f, la, o, e in self.l_placed if f <= b and la >= a)
        return out


def _place(size: int, busy: list[tuple[int, int]]) -> int:
    """Lowest-waste offset for a slot of ``size`` avoiding the (offset, end) ranges in ``busy``."""
    if not busy:
        return 0
    busy.sort()
    best_off, best_waste = -1, None
    cursor = 0
    for off, end in busy:
        if off > cursor:
            gap = off - cursor
            if gap >= size and (best_waste is None or gap - size < best_waste):
                best_off, best_waste = cursor, gap - size
                if best_waste == 0:
                    break
        if end > cursor:
            cursor = end
    return best_off if best_off >= 0 else cursor


@dataclasses.dataclass
class MemoryPlan(Result):
    """Offsets of every activation in one device arena, with the bounds to judge it by.

    >>> plan = plan_memory([MemTensor("x", 10, 0, 0)])
    >>> plan.offsets, plan.arena_bytes, bool(plan)
    ({'x': 0}, 256, True)
    """

    SCHEMA: ClassVar[str] = "npu-deploy/memory-plan"
    SCHEMA_VERSION: ClassVar[int] = 1

    tensors: list[MemTensor]
    offsets: dict[str, int]
    alignment: int = ALIGNMENT
    arena_bytes: int = 0
    lower_bound_bytes: int = 0
    no_reuse_bytes: int = 0

    def slot_bytes(self, name: str) -> int:
        """Aligned size of the slot given to ``name``."""
        for t in self.tensors:
            if t.name == name:
                return _align(t.nbytes, self.alignment)
        raise KeyError(name)

    def validate(self) -> None:
        """Check every offset is aligned, every slot lies in the arena, and no two tensors live at
        the same step share a byte. Raises :class:`InternalError` (a planner bug) otherwise."""
        al = self.alignment
        if set(self.offsets) != {t.name for t in self.tensors}:
            raise InternalError("memory plan: offsets and tensors name different sets")
        items = []
        for t in self.tensors:
            off = self.offsets[t.name]
            size = _align(t.nbytes, al)
            if off < 0 or off % al:
                raise InternalError(f"memory plan: tensor {t.name!r} at offset {off} is not "
                                    f"{al}-byte aligned")
            if off + size > self.arena_bytes:
                raise InternalError(f"memory plan: tensor {t.name!r} [{off}, {off + size}) lies "
                                    f"outside the arena of {self.arena_bytes} bytes")
            if size:
                items.append((t.first_use, t.last_use, off, off + size, t.name))
        # Sweep over time; the live set is kept sorted by offset and pairwise disjoint, so a new
        # slot overlaps some live slot iff it overlaps its neighbour on either side.
        items.sort()
        live: list[tuple[int, int, str]] = []      # (offset, end, name), sorted
        expiry: list[tuple[int, int, str]] = []    # heap of (last_use, offset, name)
        for first, last, off, end, name in items:
            while expiry and expiry[0][0] < first:
                _, o, n = heapq.heappop(expiry)
                i = bisect.bisect_left(live, (o, -1, ""))
                while live[i][2] != n:
                    i += 1
                del live[i]
            i = bisect.bisect_left(live, (off, end, name))
            for j in (i - 1, i):
                if 0 <= j < len(live):
                    o2, e2, n2 = live[j]
                    if o2 < end and off < e2:
                        raise InternalError(f"memory plan: live tensors {n2!r} [{o2}, {e2}) and "
                                            f"{name!r} [{off}, {end}) overlap")
            live.insert(i, (off, end, name))
            heapq.heappush(expiry, (last, off, name))

    @property
    def reuse_saving(self) -> float:
        """Fraction of ``no_reuse_bytes`` saved by reuse (0.0 when nothing to save)."""
        return 1.0 - self.arena_bytes / self.no_reuse_bytes if self.no_reuse_bytes else 0.0

    @property
    def overhead(self) -> float:
        """``arena_bytes / lower_bound_bytes`` (1.0 is optimal; 1.0 when both are 0)."""
        return self.arena_bytes / self.lower_bound_bytes if self.lower_bound_bytes else 1.0

    def summary(self) -> dict[str, int]:
        """The four numbers the bundle manifest records under ``memory``."""
        return {"arena_bytes": self.arena_bytes, "lower_bound_bytes": self.lower_bound_bytes,
                "no_reuse_bytes": self.no_reuse_bytes, "alignment": self.alignment}

    def __bool__(self) -> bool:
        return self.overhead <= GOOD_RATIO

    def verdict(self) -> str:
        mib = 1 << 20
        return (f"memory plan: arena {self.arena_bytes / mib:.2f} MiB for {len(self.tensors)} tensors, "
                f"{self.overhead:.2f}x the lower bound ({self.lower_bound_bytes / mib:.2f} MiB), "
                f"{100 * self.reuse_saving:.1f}% less than without reuse "
                f"({self.no_reuse_bytes / mib:.2f} MiB)")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MemoryPlan":
        tensors = [MemTensor(**t) for t in d["tensors"]]
        plan = cls(tensors=tensors, offsets={str(k): int(v) for k, v in d["offsets"].items()},
                   alignment=int(d["alignment"]), arena_bytes=int(d["arena_bytes"]),
                   lower_bound_bytes=int(d["lower_bound_bytes"]),
                   no_reuse_bytes=int(d["no_reuse_bytes"]))
        try:
            plan.validate()
        except InternalError as e:
            raise InputError(f"memory plan document is inconsistent: {e}") from None
        return plan


def lower_bound(tensors: Sequence[MemTensor], alignment: int = ALIGNMENT) -> int:
    """Largest sum of aligned sizes of tensors live at the same step.

    >>> lower_bound([MemTensor("a", 1, 0, 1), MemTensor("b", 1, 1, 2), MemTensor("c", 1, 2, 2)])
    512
    """
    events: list[tuple[int, int]] = []
    for t in tensors:
        size = _align(t.nbytes, alignment)
        if size:
            events.append((t.first_use, size))
            events.append((t.last_use + 1, -size))
    events.sort()  # at equal steps, releases (negative) come before allocations
    best = cur = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return best


# Placement orders tried, in this order: the first is always run; the others only when it is not
# already optimal and the graph is small enough (each order is a full greedy pass).
_ORDERS = {
    "size": lambda t, s: (-s, -(t.last_use - t.first_use), t.name),
    "lifetime": lambda t, s: (-(t.last_use - t.first_use), -s, t.name),
    "area": lambda t, s: (-s * (t.last_use - t.first_use + 1), -s, t.name),
}
MULTI_ORDER_LIMIT = 4096


def _greedy(tensors: list[MemTensor], sizes: list[int], order: str) -> tuple[list[int], int]:
    """One greedy pass: tensors in ``order``, each at the best-fitting gap. (offsets, arena)."""
    key = _ORDERS[order]
    index = _ConflictIndex(tensors, sizes)
    offsets = [0] * len(tensors)
    arena = 0
    for i in sorted(range(len(tensors)), key=lambda i: key(tensors[i], sizes[i])):
        t, size = tensors[i], sizes[i]
        if size == 0:
            continue
        off = _place(size, index.busy(t.first_use, t.last_use))
        offsets[i] = off
        index.place(i, off)
        arena = max(arena, off + size)
    return offsets, arena


def plan_memory(tensors: Sequence[MemTensor], alignment: int = ALIGNMENT) -> MemoryPlan:
    """Give every tensor an aligned offset so that tensors live at the same step never overlap.

    Greedy by size first; when that is above the lower bound and there are at most
    ``MULTI_ORDER_LIMIT`` tensors, greedy by lifetime and by size x lifetime are tried too and the
    smallest arena is kept.

    >>> p = plan_memory([MemTensor("in", 600, -1, 0), MemTensor("mid", 600, 0, 1),
    ...                  MemTensor("out", 600, 1, 2)])
    >>> p.offsets["in"] == p.offsets["out"], p.arena_bytes
    (True, 1536)
    """
    tensors = _normalise(tensors)
    _check_inputs(tensors, alignment)
    sizes = [_align(t.nbytes, alignment) for t in tensors]
    bound = lower_bound(tensors, alignment)
    best_offsets, best_arena = _greedy(tensors, sizes, "size")
    if best_arena > bound and len(tensors) <= MULTI_ORDER_LIMIT:
        for order in ("lifetime", "area"):
            offsets, arena = _greedy(tensors, sizes, order)
            if arena < best_arena:
                best_offsets, best_arena = offsets, arena
            if best_arena == bound:
                break
    plan = MemoryPlan(tensors=tensors,
                      offsets={t.name: best_offsets[i] for i, t in enumerate(tensors)},
                      alignment=alignment, arena_bytes=best_arena, lower_bound_bytes=bound,
                      no_reuse_bytes=sum(sizes))
    plan.validate()
    return plan
