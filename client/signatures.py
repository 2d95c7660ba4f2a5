"""One parameter list for a method that only passes its arguments on (send_and_wait
takes send's): declared once, shown by help() and checked by type checkers."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any
from typing import ParamSpec
from typing import TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def parameters_of(model: Callable[P, Any]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    """Decorate `f(*args, **kwargs)` that calls `model` with them: it gets `model`'s
    parameters (its own return annotation stays)."""

    def decorate(f: Callable[..., R]) -> Callable[P, R]:
        returns = inspect.signature(f).return_annotation
        f.__signature__ = inspect.signature(model).replace(  # type: ignore[attr-defined]
            return_annotation=returns
        )
        return f

    return decorate
