"""Name -> constructor registries, so that every component can be built from a config string."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from dmlbench.errors import UserInputError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of constructors of one kind of component (losses, miners, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._constructors: dict[str, Callable[..., T]] = {}

    def register(self, name: str, *aliases: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def decorator(constructor: Callable[..., T]) -> Callable[..., T]:
            for key in (name, *aliases):
                if key in self._constructors:
                    raise RuntimeError(f"{self.kind} {key!r} is registered twice")
                self._constructors[key] = constructor
            return constructor

        return decorator

    def __contains__(self, name: object) -> bool:
        return name in self._constructors

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._constructors))

    def names(self) -> list[str]:
        return sorted(self._constructors)

    def get(self, name: str) -> Callable[..., T]:
        if name not in self._constructors:
            close = difflib.get_close_matches(name, self._constructors, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(self.names())}"
            raise UserInputError(f"unknown {self.kind} {name!r}{hint}")
        return self._constructors[name]

    def build(self, name: str, /, **kwargs: Any) -> T:
        """Construct ``name`` with ``kwargs``; unknown keyword arguments are a ``UserInputError``."""
        constructor = self.get(name)
        check_kwargs(constructor, kwargs, f"{self.kind} {name!r}")
        return constructor(**kwargs)


def accepted_parameters(constructor: Callable[..., Any]) -> set[str] | None:
    """Names of keyword arguments ``constructor`` accepts; ``None`` if it takes ``**kwargs``."""
    signature = inspect.signature(constructor)
    names = set()
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            names.add(parameter.name)
    names.discard("self")
    return names


def check_kwargs(constructor: Callable[..., Any], kwargs: dict[str, Any], what: str) -> None:
    accepted = accepted_parameters(constructor)
    if accepted is None:
        return
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise UserInputError(
            f"{what} has no parameter {unknown[0]!r}; it accepts: {', '.join(sorted(accepted)) or 'none'}"
        )
