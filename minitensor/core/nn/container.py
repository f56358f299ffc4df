"""Modules that hold other modules: Sequential, ModuleList, ModuleDict.

A plain Python list of layers would hide them from ``parameters()``, ``to()`` and
``state_dict()``; these containers register every element as a sub-module (named "0", "1",
... or by key) so the model sees them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any

from .module import Module


def _at(items: list[Any], index: int, container: str) -> Any:
    """``items[index]``, or an IndexError that names the container and its length."""
    try:
        return items[index]
    except IndexError:
        raise IndexError(f"{container}: index {index} is out of range for {len(items)} modules") from None


class Sequential(Module):
    """Layers applied one after another: ``Sequential(Linear(2, 8), ReLU(), Linear(8, 2))``.

    Also ``Sequential(OrderedDict(hidden=..., act=...))`` to name the layers. ``net[0]`` is
    the first layer, ``net[1:]`` a Sequential of the rest, ``len(net)`` the count.
    """

    def __init__(self, *modules: Any) -> None:  # Modules, or one dict of them by name
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], dict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(modules):
                self.add_module(str(i), module)

    def forward(self, X: Any) -> Any:
        """Apply the layers in order, each to the previous one's output: X -> layer_0(X) -> layer_1(...)
        -> ...; returns the last output (the input itself for an empty Sequential)."""
        for module in self._modules.values():
            X = module(X)
        return X

    def append(self, module: Module) -> Sequential:
        """Add ``module`` at the end (named by its position, ``str(len(self))``); returns the
        Sequential."""
        self.add_module(str(len(self)), module)
        return self

    def __getitem__(self, index: int | slice) -> Module:
        items = list(self._modules.items())
        if isinstance(index, slice):
            return Sequential(OrderedDict(items[index]))
        return _at(items, index, "Sequential")[1]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class ModuleList(Module):
    """A list of modules, registered as "0", "1", ...: for layers applied in a loop,
    such as a stack of Transformer blocks."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        self.extend(modules)

    def append(self, module: Module) -> ModuleList:
        """Add ``module`` at the end, registered under its index ("0", "1", ...); returns the list."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        """Append every module of the iterable ``modules``, in order; returns the list."""
        for module in modules:
            self.append(module)
        return self

    def __getitem__(self, index: int | slice) -> Module:
        modules = list(self._modules.values())
        return ModuleList(modules[index]) if isinstance(index, slice) else _at(modules, index, "ModuleList")

    def __setitem__(self, index: int, module: Module) -> None:
        self.add_module(list(self._modules)[index], module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


class ModuleDict(Module):
    """A dictionary of modules, registered under their keys."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        """Add (or replace) the modules of ``modules``, a dict or an iterable of (name, module) pairs,
        each registered under its name."""
        for name, module in dict(modules).items():
            self.add_module(name, module)

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __setitem__(self, name: str, module: Module) -> None:
        self.add_module(name, module)

    def __delitem__(self, name: str) -> None:
        del self._modules[name]

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self) -> KeysView[str]:
        """The names of the modules, in insertion order (as ``dict.keys``)."""
        return self._modules.keys()

    def values(self) -> ValuesView[Module]:
        """The modules, in insertion order (as ``dict.values``)."""
        return self._modules.values()

    def items(self) -> ItemsView[str, Module]:
        """(name, module) pairs, in insertion order (as ``dict.items``)."""
        return self._modules.items()
