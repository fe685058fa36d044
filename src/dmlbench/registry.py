"""Name -> constructor registries, so that every component can be built from a config string."""

from __future__ import annotations

import difflib
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from dmlbench.errors import UserInputError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of constructors of one kind of component (losses, miners, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._constructors: dict[str, Callable[..., T]] = {}
        self._prefixes: dict[str, Callable[[str], Callable[..., T]]] = {}

    def register(self, name: str, *aliases: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        def decorator(constructor: Callable[..., T]) -> Callable[..., T]:
            for key in (name, *aliases):
                if key in self._constructors:
                    raise UserInputError(f"{self.kind} {key!r} is already registered; choose another name")
                self._constructors[key] = constructor
            return constructor

        return decorator

    def register_prefix(self, prefix: str, resolve: Callable[[str], Callable[..., T]]) -> None:
        """Names ``prefix:REST`` are resolved by ``resolve(REST)`` (a bridge to another library's
        components, e.g. ``pml:MultiSimilarityLoss``); it raises ``UserInputError`` for an unknown REST."""
        self._prefixes[prefix] = resolve

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name.partition(":")[0] in self._prefixes:
            try:
                self.get(name)
            except UserInputError:
                return False
            return True
        return name in self._constructors

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._constructors))

    def names(self) -> list[str]:
        return sorted(self._constructors)

    def items(self) -> list[tuple[str, Callable[..., T]]]:
        """``(name, constructor)`` by name, aliases included."""
        return sorted(self._constructors.items())

    def get(self, name: str) -> Callable[..., T]:
        prefix, separator, rest = name.partition(":")
        if separator and prefix in self._prefixes:
            return self._prefixes[prefix](rest)
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
    """Names of keyword arguments ``constructor`` accepts; ``None`` if it takes ``**kwargs``.

    A class without a constructor of its own that inherits ``torch.nn.Module``'s accepts none: that
    one's ``*args, **kwargs`` only exist to refuse every argument (a plugin loss without ``__init__``)."""
    torch_nn = sys.modules.get("torch.nn")  # loaded wherever a module class exists; never imported for this
    if isinstance(constructor, type) and torch_nn is not None and constructor.__init__ is torch_nn.Module.__init__:
        return set()
    signature = inspect.signature(constructor)
    names = set()
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            names.add(parameter.name)
    names.discard("self")
    return names


def check_kwargs(constructor: Callable[..., Any], kwargs: dict[str, Any], what: str, hint: str = "") -> None:
    """A one-line ``UserInputError`` naming ``what``, every keyword of ``kwargs`` the constructor does
    not accept and those it does, then ``hint`` (the fix, where the caller knows it)."""
    accepted = accepted_parameters(constructor)
    if accepted is None:
        return
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        raise UserInputError(f"{what} has no parameter{'s' if len(unknown) > 1 else ''} {names}; "
                             f"it accepts: {', '.join(sorted(accepted)) or 'none'}{hint}")
