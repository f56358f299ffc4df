"""Whether operations record the autograd graph (``no_grad`` / ``enable_grad``).

A single module-level flag, read by every ``Function.apply``: cheaper than a
thread-local, and minitensor runs its graph on one thread.
"""

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_enabled = True


def is_grad_enabled() -> bool:
    """True when new operations are recorded for backward."""
    return _enabled


def set_grad_enabled(mode: bool) -> None:
    """Turn graph recording on (``True``) or off (``False``) from here on, for every operation
    until it is changed again; ``no_grad`` and ``enable_grad`` do it for a block and restore
    the previous mode."""
    global _enabled
    _enabled = bool(mode)


class _GradMode:
    """Context manager *and* decorator that sets the grad mode, then restores it."""

    mode = True

    def __new__(cls, orig_func: Any = None) -> Any:
        # ``@mt.no_grad`` without parentheses, as PyTorch allows: the class gets the function
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)

    def __init__(self, orig_func: Any = None) -> None:
        pass

    def __enter__(self) -> "_GradMode":
        self._prev = _enabled
        set_grad_enabled(self.mode)
        return self

    def __exit__(self, *exc: object) -> None:
        set_grad_enabled(self._prev)  # an exception goes on: returning None never swallows it

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.__class__():
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]  # functools.wraps keeps fn's signature


class no_grad(_GradMode):
    """Operations inside ``with mt.no_grad():`` build no graph (evaluation, optimiser steps).

    In-place updates of tensors that require grad are allowed only here: outside it they
    would silently invalidate values saved for backward.
    """

    mode = False


class enable_grad(_GradMode):
    """Re-enable graph recording inside a ``no_grad`` block."""

    mode = True
