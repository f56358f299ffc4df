"""Modules that hold other modules: Sequential, ModuleList, ModuleDict.

A plain Python list of layers would hide them from ``parameters()``, ``to()`` and
``state_dict()``; these containers register every element as a sub-module (named "0", "1",
... or by key) so the model sees them.
"""

from collections import OrderedDict

from .module import Module


class Sequential(Module):
    """Layers applied one after another: ``Sequential(Linear(2, 8), ReLU(), Linear(8, 2))``.

    Also ``Sequential(OrderedDict(hidden=..., act=...))`` to name the layers. ``net[0]`` is
    the first layer, ``net[1:]`` a Sequential of the rest, ``len(net)`` the count.
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], dict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for i, module in enumerate(modules):
                self.add_module(str(i), module)

    def forward(self, X):
        for module in self._modules.values():
            X = module(X)
        return X

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def __getitem__(self, index):
        items = list(self._modules.items())
        if isinstance(index, slice):
            return Sequential(OrderedDict(items[index]))
        return items[index][1]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(Module):
    """A list of modules, registered as "0", "1", ...: for layers applied in a loop,
    such as a stack of Transformer blocks."""

    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        for module in modules:
            self.append(module)
        return self

    def __getitem__(self, index):
        modules = list(self._modules.values())
        return ModuleList(modules[index]) if isinstance(index, slice) else modules[index]

    def __setitem__(self, index, module):
        self.add_module(list(self._modules)[index], module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleDict(Module):
    """A dictionary of modules, registered under their keys."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def update(self, modules):
        for name, module in dict(modules).items():
            self.add_module(name, module)

    def __getitem__(self, name):
        return self._modules[name]

    def __setitem__(self, name, module):
        self.add_module(name, module)

    def __delitem__(self, name):
        del self._modules[name]

    def __contains__(self, name):
        return name in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()
