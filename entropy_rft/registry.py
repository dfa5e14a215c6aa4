"""The one registry used for everything chosen by name: methods, advantage estimators, tasks, engines, sinks.

A Registry maps names to objects. Registering a name twice raises, and looking up an unknown name raises with
the known names listed, so a typo in a config fails at start-up with the fix in the message.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def did_you_mean(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """' (did you mean 'x'?)' naming the closest known name (difflib, and a match ignoring case, '-' and '_'), or ''
    when none is close: the one suggestion rule of registries, options and settings."""
    known = list(known)
    squash = {k.lower().replace("-", "").replace("_", ""): k for k in known}
    close = [squash[n] for n in [name.lower().replace("-", "").replace("_", "")] if n in squash]
    close = close or difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register obj under name; used bare (`reg.register("x", obj)`) or as a decorator (`@reg.register("x")`)."""

        def add(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
            self._items[name] = item
            return item

        return add if obj is None else add(obj)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            hint = did_you_mean(name, self._items)
            raise KeyError(f"unknown {self.kind} {name!r}{hint}; known {self.kind}s: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
