"""Base for typed, truthy, serialisable results (``CompareResult``, ``PlanReport``, ``ProfileReport``…).

A result is a dataclass with a schema name and version. ``bool(result)`` means "within thresholds";
``verdict()`` is the one-line summary every judging command ends with; ``to_json``/``load`` round-trip.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, ClassVar

from npu_deploy.errors import InputError


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None if obj != obj else (1e308 if obj > 0 else -1e308)
    return obj


@dataclasses.dataclass
class Result:
    """Base class. Subclasses set ``SCHEMA`` and ``SCHEMA_VERSION`` and implement ``__bool__`` and
    ``verdict``; nested dataclasses override ``from_dict``."""

    SCHEMA: ClassVar[str] = "npu-deploy/result"
    SCHEMA_VERSION: ClassVar[int] = 1

    def __bool__(self) -> bool:  # pragma: no cover - every subclass overrides
        return True

    def verdict(self) -> str:  # pragma: no cover - every subclass overrides
        return "ok"

    def to_dict(self) -> dict:
        d = {"schema": self.SCHEMA, "schema_version": self.SCHEMA_VERSION}
        d.update(_jsonable(self))
        d["ok"] = bool(self)
        d["verdict"] = self.verdict()
        return d

    def to_json(self, path: str | os.PathLike | None = None, indent: int = 2) -> str:
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False, ensure_ascii=False)
        if path is not None:
            from npu_deploy._io import atomic_write

            with atomic_write(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        return text

    @classmethod
    def from_dict(cls, d: dict) -> "Result":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def load(cls, source: str | os.PathLike | dict) -> "Result":
        """Load from a dict, a JSON string or a JSON file written by ``to_json``."""
        if isinstance(source, dict):
            d = source
        else:
            text = str(source)
            if not text.lstrip().startswith("{"):
                try:
                    text = open(source, encoding="utf-8").read()
                except OSError as e:
                    raise InputError(f"cannot read {source}: {e.strerror}") from e
            try:
                d = json.loads(text)
            except json.JSONDecodeError as e:
                raise InputError(f"{source}: not JSON ({e.msg} at line {e.lineno})") from e
        if d.get("schema") != cls.SCHEMA:
            raise InputError(f"not a {cls.SCHEMA} document (schema is {d.get('schema')!r})")
        if d.get("schema_version", 0) > cls.SCHEMA_VERSION:
            raise InputError(f"{cls.SCHEMA} schema version {d.get('schema_version')} is newer than this "
                             f"npu-deploy understands ({cls.SCHEMA_VERSION})", hint="upgrade npu-deploy")
        return cls.from_dict(d)
