import pytest

from dmlbench.errors import UserInputError
from dmlbench.registry import Registry


def make_registry() -> Registry:
    registry: Registry = Registry("widget")

    @registry.register("square", "box")
    def square(side: float = 1.0) -> float:
        return side * side

    return registry


def test_build_by_name_and_alias() -> None:
    registry = make_registry()
    assert registry.build("square", side=3.0) == 9.0
    assert registry.build("box") == 1.0
    assert registry.names() == ["box", "square"]


def test_unknown_name_suggests_close_match() -> None:
    with pytest.raises(UserInputError, match="unknown widget 'squre'; did you mean 'square'"):
        make_registry().build("squre")


def test_unknown_parameter_is_named() -> None:
    with pytest.raises(UserInputError, match="has no parameter 'sides'"):
        make_registry().build("square", sides=2)


def test_a_name_is_registered_once() -> None:
    registry = make_registry()
    with pytest.raises(UserInputError, match="'square' is already registered; choose another name"):
        registry.register("square")(lambda: 0)
