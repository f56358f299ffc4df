"""Shared test setup: the "strict" device and the ``device`` fixture.

Every op test that takes ``device`` runs twice: on "cpu" (NumPy) and on "strict", a backend
whose arrays refuse implicit conversion to NumPy as CuPy's do (``tests/strict_backend.py``).
An op that reaches for ``numpy`` on tensor data passes on "cpu" and fails on "strict".
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import minitensor  # noqa: E402
from strict_backend import StrictArray, StrictBackend  # noqa: E402,F401

DEVICES = ["cpu", "strict"]


def _register_strict():
    backends = sys.modules["minitensor.backends"]
    if "strict" not in backends.available_backends():
        backends.register_backend(StrictBackend())


_register_strict()


@pytest.fixture(autouse=True)
def _strict_registered():
    """Keep "strict" registered even if some test rebuilt the backend registry."""
    _register_strict()


@pytest.fixture(params=DEVICES)
def device(request):
    """The device name an op test runs on: "cpu" and "strict"."""
    return request.param
