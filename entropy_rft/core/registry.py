"""The one registry used for everything chosen by name: methods, advantage estimators, tasks, engines, sinks.

A Registry maps names to objects. Registering a name twice raises, and looking up an unknown name raises with
the known names listed, so a typo in a config fails at start-up with the fix in the message. An alias (`alias`) is
another name the literature uses for registered ones (GMPO for geo_mean, DPPO for dppo_tv and dppo_kl): it is never
looked up, only suggested, so a run's settings name each object one way.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


def _squash(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def did_you_mean(
    name: str, known: Iterable[str], cutoff: float = 0.6, aliases: Mapping[str, Sequence[str]] | None = None
) -> str:
    """' (did you mean 'x'?)' naming the registered names an alias stands for (aliases: alias -> names), else the
    closest known name (difflib, and a match ignoring case, '-' and '_'), or '' when none is close: the one
    suggestion rule of registries, options and settings."""
    known = list(known)
    meant = {_squash(a): names for a, names in (aliases or {}).items()}.get(_squash(name))
    if meant:
        return f" (did you mean {' or '.join(repr(m) for m in meant)}?)"
    squash = {_squash(k): k for k in known}
    close = [squash[n] for n in [_squash(name)] if n in squash]
    close = close or difflib.get_close_matches(name, known, n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry(Generic[T]):
    def __init__(self, kind: str, plural: str | None = None) -> None:
        self.kind = kind
        self.plural = plural or kind + ("es" if kind.endswith("s") else "s")  # "policy losses"
        self._items: dict[str, T] = {}
        self._aliases: dict[str, tuple[str, ...]] = {}

    def alias(self, other: str, *names: str) -> None:
        """Suggest `names` (registered) for `other`, the name the literature uses for them (module docstring)."""
        if other in self._items or other in self._aliases:
            raise ValueError(f"{self.kind} {other!r} is already registered or an alias; pick another alias")
        self._aliases[other] = names

    def hint(self, name: str) -> str:
        """' (did you mean ...?)' for an unknown name: the names it is an alias of, else the closest (did_you_mean)."""
        return did_you_mean(name, self._items, aliases=self._aliases)

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
            raise KeyError(f"unknown {self.kind} {name!r}{self.hint(name)}; known {self.plural}: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)
