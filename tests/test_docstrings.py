"""Every public name has a docstring: the API reference (docs/api/, rendered by mkdocstrings
from the docstrings) documents ``__all__`` of ``minitensor``, ``minitensor.nn``,
``minitensor.optim``, ``minitensor.plugins``, ``minitensor.testing`` and ``minitensor.viz``,
so a name there without one would be an empty entry.

What counts as a name's docstring, by kind of object (``getattr(module, name)``):

- a module: its module docstring;
- a class: a docstring of its own (``cls.__dict__["__doc__"]``), not one inherited from a
  base class or ``object``, nor the ``Name(field, ...)`` signature that ``dataclasses`` and
  ``namedtuple`` write in when there is none;
- a function (or any routine): its ``__doc__``;
- anything else -- a dtype such as ``mt.float32``, a constant such as
  ``mt.plugins.DEFAULT_PLUGINS``, the ``hookimpl`` marker: an instance's class docstring
  (``numpy.dtype``'s, ``str``'s, pluggy's) says nothing about *this* value, so it does not
  count. Such a name needs an attribute docstring, the string literal right after its
  assignment (PEP 257's attribute docstring, which mkdocstrings shows), in the module that
  defines it: the test reads the source of every ``minitensor`` module that holds the very
  same object under the name, so ``mt.float32`` is documented in ``dtypes.py`` and
  ``mt.hookimpl`` (loaded lazily) in ``plugins.py``.

"Says something" means at least ``MIN_LENGTH`` characters once stripped: a sentence, not a
placeholder. And every public method of every class listed -- the functions, static and class
methods and properties defined in the class itself (not inherited), whose names do not start
with ``_`` (``forward`` and ``backward`` included) -- has a docstring of the same length.

Importing the six modules happens inside the tests (``minitensor.plugins`` imports pluggy,
which ``import minitensor`` alone must not), and nothing here does ``from minitensor import *``.
"""

import ast
import dataclasses
import importlib
import inspect
import sys
import textwrap

import pytest

MODULES = [
    "minitensor",
    "minitensor.nn",
    "minitensor.optim",
    "minitensor.plugins",
    "minitensor.testing",
    "minitensor.viz",
]
MIN_LENGTH = 20  # characters: "Returns x." is no reference entry


def _says_something(doc):
    return doc is not None and len(inspect.cleandoc(doc)) >= MIN_LENGTH


def _generated_signature(cls, doc):
    """The docstring ``dataclasses`` / ``namedtuple`` make up for a class that has none."""
    first = inspect.cleandoc(doc).strip()
    generated = dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields"))
    return generated and first.startswith(cls.__name__ + "(") and first.endswith(")") and "\n" not in first


def _attribute_docstrings(module):
    """{name: docstring} of a module's attribute docstrings (a string after an assignment)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return {}
    found = {}
    body = ast.parse(source).body
    for statement, following in zip(body, body[1:]):
        if isinstance(statement, ast.Assign):
            targets = statement.targets
        elif isinstance(statement, ast.AnnAssign):
            targets = [statement.target]
        else:
            continue
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = following.value.value
    return found


def _docstring_of_value(module, name, value):
    """The attribute docstring of ``name`` wherever a minitensor module defines this very value."""
    holders = [module] + [
        other
        for other_name, other in sorted(sys.modules.items())
        if other is not None
        and other is not module
        and other_name.split(".")[0] in ("minitensor", "minitensor_plugins")
        and vars(other).get(name, object()) is value
    ]
    for holder in holders:
        doc = _attribute_docstrings(holder).get(name)
        if doc is not None:
            return doc
    return None


def _docstring(module, name, obj):
    """The docstring that documents ``module.name`` under the rules of this file's docstring."""
    if inspect.ismodule(obj):
        return obj.__doc__
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        return None if doc is None or _generated_signature(obj, doc) else doc
    if inspect.isroutine(obj):
        return obj.__doc__
    return _docstring_of_value(module, name, obj)


def _exports():
    rows = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            rows.append((module_name, module, name, getattr(module, name)))
    return rows


def _public_methods(cls):
    """(name, function or property) for the public methods ``cls`` itself defines."""
    for name, attribute in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(attribute, (staticmethod, classmethod)):
            yield name, attribute.__func__
        elif isinstance(attribute, property):
            yield name, attribute
        elif inspect.isfunction(attribute):
            yield name, attribute


@pytest.mark.parametrize("module_name", MODULES)
def test_module_has_all_and_a_docstring(module_name):
    module = importlib.import_module(module_name)
    assert _says_something(module.__doc__), f"{module_name} has no module docstring"
    names = getattr(module, "__all__", None)
    assert names, f"{module_name} has no __all__: the API reference would not know its public names"
    assert len(set(names)) == len(names), f"{module_name}.__all__ lists a name twice"
    missing = [name for name in names if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ lists names the module does not have: {missing}"


def test_minitensor_all_includes_every_op():
    import minitensor as mt

    assert set(mt.ops.__all__) <= set(mt.__all__)
    assert {"hookimpl", "plugins", "testing", "viz"} <= set(mt.__all__)


def test_every_public_name_has_a_docstring():
    undocumented = [
        f"{module_name}.{name} ({type(obj).__name__})"
        for module_name, module, name, obj in _exports()
        if not _says_something(_docstring(module, name, obj))
    ]
    assert not undocumented, (
        f"{len(undocumented)} public name(s) without a docstring of at least {MIN_LENGTH} characters "
        "(a value such as a dtype or a constant needs an attribute docstring after its assignment):\n  "
        + "\n  ".join(undocumented)
    )


def test_every_public_method_has_a_docstring():
    seen, undocumented = set(), []
    for module_name, _, name, obj in _exports():
        if not inspect.isclass(obj) or obj in seen:
            continue
        seen.add(obj)
        for method_name, method in _public_methods(obj):
            if not _says_something(method.__doc__):
                undocumented.append(f"{module_name}.{name}.{method_name}")
    assert not undocumented, (
        f"{len(undocumented)} public method(s) without a docstring of at least {MIN_LENGTH} characters:\n  "
        + "\n  ".join(undocumented)
    )


def test_the_rule_catches_an_undocumented_function_class_and_value():
    """The checks above would fail on a new undocumented name of each kind."""
    module = type(sys)("minitensor_docstring_probe")
    exec(
        textwrap.dedent(
            '''
            def documented():
                """Adds nothing to nothing, and says so at length."""

            def bare():
                pass

            class Bare(Exception):
                pass

            @dataclasses.dataclass
            class Record:
                a: int
                b: int

            LIMIT = 3
            '''
        ),
        {"dataclasses": dataclasses},
        vars(module),
    )
    assert _says_something(_docstring(module, "documented", module.documented))
    assert not _says_something(_docstring(module, "bare", module.bare))
    assert not _says_something(_docstring(module, "Bare", module.Bare))  # Exception's doc is not its own
    assert not _says_something(_docstring(module, "Record", module.Record))  # the generated "Record(a: int, ...)"
    assert not _says_something(_docstring(module, "LIMIT", module.LIMIT))  # int's doc does not count
