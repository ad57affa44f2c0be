"""The rules, in the order they run: :data:`RULES`, and :func:`select_rules`.
"""

from __future__ import annotations

from typing import Sequence

from npu_deploy.converters.optimize.graph import Rule
from npu_deploy.converters.optimize.rules import (
    cancel_transpose_reshape,
    conv1d_to_conv2d,
    fold_channel_slice,
    fold_transpose_bn,
    gather_to_split,
    merge_casts,
    merge_concats,
    merge_slices,
    narrow_int64,
    reflect_pad,
    remove_empty_slices,
    sink_transpose,
    split_avgpool,
    split_large_kernel_conv,
    split_qkv_matmul,
)
from npu_deploy.errors import InputError

RULES: dict[str, Rule] = {r.name: r for r in (
    fold_channel_slice.RULE,
    reflect_pad.RULE,
    split_large_kernel_conv.RULE,
    conv1d_to_conv2d.RULE,
    narrow_int64.RULE,
    split_avgpool.RULE,
    fold_transpose_bn.RULE,
    merge_casts.RULE,
    merge_slices.RULE,
    merge_concats.RULE,
    gather_to_split.RULE,
    remove_empty_slices.RULE,
    split_qkv_matmul.RULE,
    sink_transpose.RULE,
    cancel_transpose_reshape.RULE,
)}


def select_rules(rules: Sequence[str] | None = None, skip: Sequence[str] | None = None) -> list[Rule]:
    """The rules to run: ``rules`` (names, in registry order) or every default rule, minus ``skip``."""
    for name in list(rules or []) + list(skip or []):
        if name not in RULES:
            raise InputError(f"unknown rule {name!r}", hint=f"known rules: {', '.join(RULES)} (optimize --list)")
    chosen = [r for r in RULES.values() if (r.name in rules if rules else r.default)]
    return [r for r in chosen if r.name not in set(skip or ())]
