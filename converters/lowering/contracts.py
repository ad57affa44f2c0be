"""The one pass framework of the lowering: named steps with contracts that are executed, not prose.

A :class:`Step` names what it ``requires`` (attributes of the context that must be set before it runs),
what it ``ensures`` (attributes it must set) and a ``check`` run after it (its guarantee, as code).
:func:`run_steps` runs steps in order and enforces all three; a broken contract is a bug of ours
(:class:`~npu_deploy.errors.InternalError`, exit 4). Used by ``pipeline.lower`` (load → support → plan →
bundle) and by the planner's graph passes (``planner.PIPELINE``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from npu_deploy.errors import InternalError


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    requires: tuple[str, ...]
    ensures: tuple[str, ...]
    run: Callable[[Any], None]
    check: Callable[[Any], None] | None = None


def run_steps(steps: list[Step], ctx: Any, say: Callable[[str, float | None], None] | None = None) -> Any:
    """Run ``steps`` in order, checking each one's ``requires`` before and ``ensures`` and ``check`` after."""
    for step in steps:
        missing = [k for k in step.requires if getattr(ctx, k, None) is None]
        if missing:
            raise InternalError(f"pipeline: step {step.name!r} needs {', '.join(missing)}, which no earlier "
                                f"step produced")
        if say is not None:
            say(step.name, None)
        step.run(ctx)
        missing = [k for k in step.ensures if getattr(ctx, k, None) is None]
        if missing:
            raise InternalError(f"pipeline: step {step.name!r} did not produce {', '.join(missing)}")
        if step.check is not None:
            step.check(ctx)
    return ctx
