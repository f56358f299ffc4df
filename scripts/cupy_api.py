"""Write tests/cupy_api.json: the names CuPy has, and the parameters each of its functions,
ufunc methods and ``ndarray`` methods takes, read off an installed CuPy.

The tests' CuPy stand-in (tests/fake_cupy.py, tests/strict_backend.py) is NumPy underneath,
and NumPy has names and keywords CuPy lacks (``numpy.errstate``; ``ndarray.max(initial=)``;
``numpy.zeros(like=)``): code written against the stand-in could call one of them and pass
every test, then stop with an AttributeError or a TypeError on the first real GPU. With this
file the stand-in refuses what CuPy would.

Importing CuPy needs no GPU, nor the CUDA libraries for the parts read here, so this runs on
any machine with ``pip install cupy-cuda13x`` (in a throwaway venv: minitensor does not need
it). Signatures come from ``inspect`` where CuPy's functions are Python, else from the first
line of the docstring, which Cython writes as the signature (``_ndarray_base.max(self,
axis=None, out=None, keepdims=False)``). Run it after a CuPy release, and commit the diff:

    python scripts/cupy_api.py            # rewrites tests/cupy_api.json
    python scripts/cupy_api.py --check    # exit 1 if the file differs from this CuPy
"""

from __future__ import annotations
import __future__

import argparse
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "tests" / "cupy_api.json"
#: the submodules minitensor's array code reaches through ``xp`` (``xp.random.*``); ``cupy.cuda`` is
#: the stand-in's own (tests/fake_cupy.py), each of its names written after CuPy's
SUBMODULES = ("random", "linalg", "fft", "lib", "lib.stride_tricks")
#: a signature line in a docstring: ``name(...)`` or ``Class.name(...)``, maybe ``-> type``
_DOC_SIGNATURE = re.compile(r"^[\w.]+\((.*)\)(\s*->.*)?$")


def split_top(text: str) -> list[str]:
    """'a, b=(1, 2), c' -> ['a', 'b=(1, 2)', 'c']: commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def from_doc_line(line: str) -> dict[str, Any] | None:
    """The parameters of a Cython signature line (types before names, ``\\*`` for ``*``)."""
    match = _DOC_SIGNATURE.match(line.strip().replace("\\*", "*"))
    if not match:
        return None
    spec: dict[str, Any] = {"positional": [], "keyword": [], "varargs": False, "varkw": False}
    keyword_only = False
    for part in split_top(match.group(1)):
        name = part.split("=", 1)[0].strip().split()[-1]  # 'int axis=-1' -> 'axis'
        if name == "/":
            continue
        if name == "*":
            keyword_only = True
        elif name.startswith("**"):
            spec["varkw"] = True
        elif name.startswith("*"):
            spec["varargs"], keyword_only = True, True
        elif name != "self":
            spec["keyword" if keyword_only else "positional"].append(name)
    return spec


def from_signature(sig: inspect.Signature) -> dict[str, Any]:
    spec: dict[str, Any] = {"positional": [], "keyword": [], "varargs": False, "varkw": False}
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            spec["varargs"] = True
        elif p.kind is p.VAR_KEYWORD:
            spec["varkw"] = True
        elif p.kind is p.KEYWORD_ONLY:
            spec["keyword"].append(p.name)
        elif p.name != "self":
            spec["positional"].append(p.name)
    return spec


def parameters(obj: Any) -> dict[str, Any] | None:
    """What a call of ``obj`` may pass: {positional: [names], keyword: [names], varargs, varkw};
    None where neither inspect nor the docstring says (the stand-in then checks nothing)."""
    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    from_doc = from_doc_line(doc[0]) if doc else None
    try:
        spec = from_signature(inspect.signature(obj))
    except (TypeError, ValueError):
        return from_doc
    if spec["varargs"] and spec["varkw"] and from_doc:  # a wrapper: its docstring says what it takes
        return from_doc
    return spec


def describe(namespace: Any) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for name in sorted(dir(namespace)):
        if name.startswith("_"):
            continue
        try:
            obj = getattr(namespace, name)
        except Exception:  # a name whose library is missing here (cupy.cuda's cuBLAS): present
            names[name] = None
            continue
        if isinstance(obj, __future__._Feature) or (inspect.ismodule(obj) and not obj.__name__.startswith("cupy")):
            continue  # a module's own imports (``annotations``, ``numpy as np``): not CuPy's API
        if inspect.ismodule(obj) or inspect.isclass(obj) or not callable(obj):
            names[name] = None
        else:
            names[name] = parameters(obj)
    return names


def read_cupy() -> dict[str, Any]:
    import cupy

    api: dict[str, Any] = {"cupy": cupy.__version__, "names": describe(cupy)}
    for sub in SUBMODULES:
        module = cupy
        for part in sub.split("."):
            module = getattr(module, part)
        for name, spec in describe(module).items():
            api["names"][f"{sub}.{name}"] = spec
    api["ndarray"] = {
        name: parameters(getattr(cupy.ndarray, name))
        for name in sorted(dir(cupy.ndarray))
        if not name.startswith("_") and callable(getattr(cupy.ndarray, name))
    }
    api["ndarray_attributes"] = sorted(
        name for name in dir(cupy.ndarray) if not name.startswith("_") and not callable(getattr(cupy.ndarray, name))
    )
    api["ufunc"] = {
        name: parameters(getattr(cupy.add, name)) for name in ("at", "reduce", "accumulate", "outer", "reduceat")
    }
    api["ufunc_call"] = {"unary": parameters(cupy.exp), "binary": parameters(cupy.add)}
    return api


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with tests/cupy_api.json instead of writing it")
    args = parser.parse_args(argv)
    try:
        api = read_cupy()
    except ImportError as e:
        print(f"cupy_api.py: needs CuPy installed (pip install cupy-cuda13x; no GPU needed): {e}", file=sys.stderr)
        return 2
    text = json.dumps(api, indent=1, sort_keys=True) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print(f"{OUT.name}: {'up to date' if same else 'differs from'} CuPy {api['cupy']}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT} (CuPy {api['cupy']}: {len(api['names'])} names, {len(api['ndarray'])} ndarray methods)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
