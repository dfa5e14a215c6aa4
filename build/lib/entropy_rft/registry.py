"""The one registry used for everything chosen by name: methods, advantage estimators, tasks, engines, sinks.

A Registry maps names to objects. Registering a name twice raises, and looking up an unknown name raises with
the known names listed, so a typo in a config fails at start-up with the fix in the message.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


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
            raise KeyError(f"unknown {self.kind} {name!r}; known {self.kind}s: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
