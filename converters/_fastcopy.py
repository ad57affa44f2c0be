"""Fast execution paths behind :mod:`npu_deploy.converters.formats` (placeholder: always declines)."""

from __future__ import annotations


def pack(x, plan, out) -> bool:
    return False


def unpack(phys, plan, out) -> bool:
    return False
