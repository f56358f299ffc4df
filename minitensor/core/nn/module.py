"""``Module`` and ``Parameter``: how a model keeps track of what it learns.

A model is a tree of Modules. Assigning an attribute registers it, in assignment order:

    self.dense = mt.nn.Linear(4, 8)       # a sub-module   -> _modules
    self.w = mt.nn.Parameter(mt.randn(8)) # a parameter    -> _parameters
    self.register_buffer("mask", m)       # state, not learned (a buffer) -> _buffers

so ``parameters()`` can hand every learnable tensor to an optimiser, ``named_parameters()``
names them by their path ("encoder.dense.weight"), and ``state_dict()`` /
``load_state_dict()`` save and restore a model by those names. ``model(x)`` calls
``model.forward(x)``, with the hooks registered on the module around it (PyTorch's
``register_forward_pre_hook`` and ``register_forward_hook``): how a figure or a probe sees
what a layer computed without changing the layer.
"""

import warnings
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..creation import zeros_like
from ..dtypes import as_dtype, is_dtype_name, is_floating
from ..grad_mode import no_grad
from ..tensor import Tensor, tensor

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class RemovableHandle:
    """What registering a hook returns: ``handle.remove()`` takes the hook off again (as does
    leaving ``with handle:``)."""

    _next_id = 0

    def __init__(self, hooks: dict[int, Any]) -> None:
        self.hooks, self.id = hooks, RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self) -> None:
        self.hooks.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class Parameter(Tensor):
    """A Tensor that is a learnable part of a Module: a float leaf with requires_grad=True.

    ``Parameter(t)`` shares ``t``'s data (as in PyTorch), cut from any graph;
    ``Parameter(data)`` copies lists or arrays like ``mt.tensor`` (Python floats become
    float32). Assigning one to a Module attribute registers it.
    """

    __slots__ = ()

    def __new__(cls, data: Any = None, requires_grad: bool = True) -> "Parameter":
        if data is None:
            data = tensor([], dtype="float32")
        elif not isinstance(data, Tensor):
            data = tensor(data)
        p = cls._make(data.data, data._backend, None)
        if not is_floating(p.dtype):
            raise TypeError(
                f"Parameter: parameters must hold floating-point data to be learned, got {p.dtype}; "
                "convert it first, e.g. Parameter(t.float())"
            )
        p.requires_grad = bool(requires_grad)
        return p

    def __init__(self, data: Any = None, requires_grad: bool = True) -> None:
        pass  # all the work happens in __new__ (Tensor.__init__ would copy the data again)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class UninitializedParameter(Parameter):
    """A Parameter whose shape is not known yet (PyTorch's name): a lazy layer's weight before
    its first input (``nn.LazyLinear``). Its data is an empty array that keeps the dtype and
    device (``.to()`` moves it); ``materialize`` gives it its values, in place, and makes it a
    plain Parameter, so an optimiser that holds it still does. ``load_state_dict`` materialises
    it from the saved value's shape, as PyTorch does."""

    __slots__ = ()

    def materialize(self, data: Any) -> None:
        """Become a Parameter holding ``data`` (an array of this device), this object still."""
        self.data = data
        self.__class__ = Parameter  # type: ignore[assignment]  # (the same slots: a tensor can change class)


class UninitializedBuffer(Tensor):
    """A buffer whose shape is not known yet (PyTorch's name): a lazy layer's running statistics
    before its first input (``nn.LazyBatchNorm1d``). ``UninitializedBuffer(t)`` holds ``t``'s
    empty array, keeping the dtype and device; ``materialize`` and ``load_state_dict`` give it
    its values as they give an ``UninitializedParameter`` its own."""

    __slots__ = ()

    def __new__(cls, like: Tensor) -> "UninitializedBuffer":
        return cls._make(like.data, like._backend, None)

    def __init__(self, like: Tensor) -> None:
        pass  # (Tensor.__init__ would copy the data)

    def materialize(self, data: Any) -> None:
        """Become a plain Tensor holding ``data`` (an array of this device), this object still."""
        self.data = data
        self.__class__ = Tensor  # type: ignore[assignment]


_LAZY = (UninitializedParameter, UninitializedBuffer)  # what a lazy layer holds until its first input


def _warn_if_modules_unseen(owner: "Module", name: str, value: Any) -> None:
    """Warn when a plain list, tuple or dict assigned to a module holds modules that it has not
    registered: ``parameters()``, ``state_dict()`` and ``.to()`` do not look inside such a
    container (in PyTorch neither), so those layers would silently never train nor be saved.
    A list of modules registered elsewhere in ``owner`` (a view of its blocks) is fine."""
    held = [v for v in (value.values() if isinstance(value, dict) else value) if isinstance(v, Module)]
    if not held:
        return
    known = {id(m) for m in owner.modules()}
    unseen = sum(id(m) not in known for m in held)
    if unseen:
        container = "ModuleDict" if isinstance(value, dict) else "ModuleList"
        warnings.warn(
            f"{type(owner).__name__}.{name} is a {type(value).__name__} holding {unseen} module(s) that "
            f"parameters(), state_dict() and .to() do not see, so they would not be trained or saved: "
            f"make it mt.nn.{container}(...), as in PyTorch",
            stacklevel=3,
        )


class Module:
    """Base class of layers and models: subclass it, call ``super().__init__()`` first, assign
    layers and Parameters as attributes, and write ``forward``."""

    def __init__(self) -> None:
        # object.__setattr__: our own __setattr__ needs these dictionaries to exist already.
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())  # id -> hook
        object.__setattr__(self, "_forward_hooks", OrderedDict())  # id -> (hook, with_kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The layer's computation, written by every subclass: ``model(*args, **kwargs)`` calls
        ``forward(*args, **kwargs)`` and returns what it returns. The base class raises
        ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} has no forward(); define forward(self, ...) in the class")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        d = self.__dict__
        if not (d.get("_forward_pre_hooks") or d.get("_forward_hooks")):
            return self.forward(*args, **kwargs)
        for hook in list(d["_forward_pre_hooks"].values()):
            changed = hook(self, args)
            if changed is not None:  # a pre-hook may replace the positional arguments
                args = changed if isinstance(changed, tuple) else (changed,)
        output = self.forward(*args, **kwargs)
        for hook, with_kwargs in list(d["_forward_hooks"].values()):
            changed = hook(self, args, kwargs, output) if with_kwargs else hook(self, args, output)
            if changed is not None:  # a hook may replace the output
                output = changed
        return output

    # -- hooks ----------------------------------------------------------------------------------
    def register_forward_pre_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        """Call ``hook(module, args)`` before every ``forward``, in registration order; what it
        returns, if not None, replaces the positional arguments (a tuple, or one value).
        Returns a ``RemovableHandle``. (PyTorch's semantics.)"""
        return self._add_hook(self._forward_pre_hooks, hook, hook)

    def register_forward_hook(self, hook: Callable[..., Any], *, with_kwargs: bool = False) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after every ``forward`` (``hook(module, args,
        kwargs, output)`` with ``with_kwargs=True``), in registration order; what it returns, if
        not None, replaces the output. Returns a ``RemovableHandle``: ``handle.remove()``.
        (PyTorch's semantics: how ``mt.viz.capture`` reads what each attention layer computed.)"""
        return self._add_hook(self._forward_hooks, hook, (hook, bool(with_kwargs)))

    def _add_hook(self, hooks: dict[int, Any], hook: Callable[..., Any], entry: Any) -> RemovableHandle:
        self._check_initialised("hooks")
        if not callable(hook):
            raise TypeError(f"a hook must be callable, got {type(hook).__name__} (registered on {type(self).__name__})")
        handle = RemovableHandle(hooks)
        hooks[handle.id] = entry
        return handle

    # -- registration ---------------------------------------------------------------------
    def _check_initialised(self, what: str) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign {what} before Module.__init__() has run: call super().__init__() "
                f"first in {type(self).__name__}.__init__"
            )

    def _check_name(self, name: str, kind: str) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"{kind} name must be a non-empty string without '.', got {name!r}")

    def register_parameter(self, name: str, param: "Parameter | None") -> None:
        """Register ``param`` (a Parameter, or None for an absent one such as ``bias=False``)."""
        self._check_initialised("parameters")
        self._check_name(name, "parameter")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"cannot register a {type(param).__name__} as parameter {name!r} of {type(self).__name__}: "
                "wrap it in mt.nn.Parameter(...), or use register_buffer for state that is not learned"
            )
        self._forget(name, self._parameters)
        self._parameters[name] = param

    def add_module(self, name: str, module: "Module | None") -> None:
        """Register a sub-module (or None) under ``name``."""
        self._check_initialised("sub-modules")
        self._check_name(name, "module")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module (sub-module {name!r})")
        self._forget(name, self._modules)
        self._modules[name] = module

    register_module = add_module

    def register_buffer(self, name: str, value: Tensor | None, persistent: bool = True) -> None:
        """Register a tensor that is part of the model's state but not learned (a running
        statistic, a fixed positional-encoding table). It moves with ``to()``; it is saved in
        ``state_dict()`` unless ``persistent=False``."""
        self._check_initialised("buffers")
        self._check_name(name, "buffer")
        if value is not None and not isinstance(value, Tensor):
            raise TypeError(f"buffer {name!r} must be a Tensor or None, got {type(value).__name__}")
        if name not in self._buffers and (name in self.__dict__ or name in self._parameters or name in self._modules):
            raise KeyError(
                f"cannot register buffer {name!r}: {type(self).__name__} already has an attribute of that name"
            )
        self._buffers[name] = value
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def _forget(self, name: str, keep: dict[str, Any]) -> None:
        """Drop ``name`` from every registry but ``keep``, so one name means one thing.
        (Re-registering in the same registry keeps the name's place in the order.)"""
        self.__dict__.pop(name, None)
        for registry in (self._parameters, self._modules, self._buffers):
            if registry is not keep:
                registry.pop(name, None)
        if keep is not self._buffers:
            self._non_persistent.discard(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Parameter):
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            self.add_module(name, value)
        elif "_parameters" in self.__dict__ and name in self._parameters:
            if value is not None:
                raise TypeError(
                    f"cannot assign a {type(value).__name__} to parameter {name!r} of {type(self).__name__} "
                    "(a Parameter or None is expected); to change its values use "
                    f"`with mt.no_grad(): module.{name}.copy_(...)`"
                )
            self._parameters[name] = None
        elif "_modules" in self.__dict__ and name in self._modules:
            if value is not None:
                raise TypeError(
                    f"cannot assign a {type(value).__name__} to sub-module {name!r} (a Module or None is expected)"
                )
            self._modules[name] = None
        elif "_buffers" in self.__dict__ and name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(
                    f"cannot assign a {type(value).__name__} to buffer {name!r} (a Tensor or None is expected)"
                )
            self._buffers[name] = value
        else:
            if type(value) in (list, tuple, dict) and value:
                _warn_if_modules_unseen(self, name, value)
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # Called only when normal lookup fails: registered things live in the dictionaries.
        d = self.__dict__
        for registry in ("_parameters", "_buffers", "_modules"):
            if registry in d and name in d[registry]:
                return d[registry][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for registry in (self._parameters, self._buffers, self._modules):
            if name in registry:
                del registry[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    # -- walking the tree -------------------------------------------------------------------
    def named_modules(self, prefix: str = "", _seen: set[int] | None = None) -> Iterator[tuple[str, "Module"]]:
        """(dotted name, module) for this module and all below it, each module once."""
        _seen = set() if _seen is None else _seen
        if id(self) in _seen:
            return
        _seen.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is not None:
                yield from child.named_modules(prefix + "." + name if prefix else name, _seen)

    def modules(self) -> Iterator["Module"]:
        """Every module of the tree, this one first, each once (a module shared by two parents is
        visited once): ``named_modules()`` without the names."""
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """(name, module) for the direct sub-modules."""
        seen = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator["Module"]:
        """The direct sub-modules, in registration order, each once: ``named_children()`` without the
        names."""
        for _, m in self.named_children():
            yield m

    def _named_members(self, registry: str, prefix: str, recurse: bool) -> Iterator[tuple[str, Any]]:
        # A tensor shared by two modules (tied weights) is listed once, under its first name:
        # an optimiser must not update it twice.
        seen = set()
        walk = self.named_modules(prefix) if recurse else [(prefix, self)]
        for module_prefix, module in walk:
            for name, t in getattr(module, registry).items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    yield (module_prefix + "." + name if module_prefix else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, "Parameter"]]:
        """(dotted name, Parameter) pairs in registration order, e.g. ("0.weight", W)."""
        return self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator["Parameter"]:
        """Every Parameter of this module (and, with recurse, its sub-modules), each once."""
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        """(dotted name, Tensor) for every buffer of this module (and, with ``recurse``, of the modules
        below it), in registration order; a buffer shared by two modules is listed once."""
        return self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        """Every buffer (state that is not learned, see ``register_buffer``) of this module and, with
        ``recurse``, of its sub-modules, each once."""
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def num_parameters(self, trainable_only: bool = False) -> int:
        """How many numbers the model learns (shared parameters counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def apply(self, fn: Callable[["Module"], Any]) -> "Module":
        """Call ``fn(module)`` on every sub-module, then on this one (e.g. custom init)."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # -- modes and gradients ----------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Set training mode here and below (Dropout drops only in training)."""
        if not isinstance(mode, bool):
            raise TypeError(f"train(mode): mode must be True or False, got {mode!r}")
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> "Module":
        """Evaluation mode: ``train(False)``. Gradients still flow; wrap in ``mt.no_grad()`` too."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Freeze (False) or unfreeze every parameter."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients of every parameter (None, or zeros with set_to_none=False)."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                # A new array rather than zero_(): a gradient may be a read-only broadcast view.
                p.grad = zeros_like(p.grad)

    # -- devices and dtypes ----------------------------------------------------------------
    def to(self, target: Any = None, dtype: Any = None, device: Any = None) -> "Module":
        """Move and/or convert parameters and buffers in place: ``model.to("cuda")``,
        ``model.to(mt.float64)`` (or ``"float64"``, as ``x.to`` takes it). Returns the module.

        Only the data inside each Parameter is replaced, never the Parameter object, so an
        optimiser built before the call still holds the model's parameters. A dtype applies
        to floating-point tensors only (integer buffers keep their dtype). Gradients follow;
        an optimiser's state (momentum) does not, so move the model before training starts.
        """
        if target is not None:
            if isinstance(target, str) and not is_dtype_name(target):  # as x.to: "float64" is a dtype
                device = target
            else:
                dtype = target
        wanted = as_dtype(dtype, f"{type(self).__name__}.to")
        if wanted is not None and not is_floating(wanted):
            # (its parameters would hold integers and still require grad: PyTorch refuses too)
            raise TypeError(
                f"{type(self).__name__}.to: a module converts to a floating-point dtype (float16, bfloat16, "
                f"float32, float64), got {wanted}; its integer buffers keep their dtype anyway"
            )

        def convert(t: Tensor) -> None:  # in place: the tensor object stays, its array (and device) change
            new = t.to(dtype=dtype if dtype is not None and is_floating(t.dtype) else None, device=device)
            t.data, t._backend = new.data, new._backend

        with no_grad():
            for t in list(self.parameters()) + list(self.buffers()):
                convert(t)
                if t.grad is not None:
                    convert(t.grad)
        return self

    def float(self) -> "Module":
        """``to(mt.float32)``: every floating-point parameter and buffer converted to float32, in
        place; returns the module."""
        return self.to(dtype="float32")

    def double(self) -> "Module":
        """float64 everywhere (what ``mt.gradcheck`` needs)."""
        return self.to(dtype="float64")

    def half(self) -> "Module":
        """float16 everywhere: half the memory, and about three decimal digits."""
        return self.to(dtype="float16")

    def bfloat16(self) -> "Module":
        """bfloat16 everywhere: half the memory, float32's range, about two decimal digits. To train
        in it, ``mt.autocast`` (float32 weights, bfloat16 products) is the safer way: an update
        smaller than half a bfloat16 step of a weight leaves a bfloat16 weight unchanged."""
        return self.to(dtype="bfloat16")

    def cpu(self) -> "Module":
        """``to("cpu")``: every parameter and buffer (and gradient) moved to host memory, in place;
        returns the module."""
        return self.to(device="cpu")

    def cuda(self) -> "Module":
        """``to("cuda")``: every parameter and buffer (and gradient) moved to the GPU, in place;
        returns the module. A ``DeviceError`` says what is missing where CUDA is not available."""
        return self.to(device="cuda")

    # -- saving and loading -----------------------------------------------------------------
    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> "OrderedDict[str, Tensor]":
        """An OrderedDict from dotted name to tensor: every parameter and persistent buffer.

        The tensors are detached but *share memory* with the model (as in PyTorch): training
        on changes them. Keep a snapshot with ``{k: v.numpy() for k, v in sd.items()}``.
        A parameter shared by two modules appears under both names, so either can load it.
        """
        out = OrderedDict()
        for name, p in self._parameters.items():
            if p is not None:
                out[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent:
                out[prefix + name] = b if keep_vars else b.detach()
        for name, child in self._modules.items():
            if child is not None:
                out.update(child.state_dict(prefix + name + ".", keep_vars))
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy values from ``state_dict`` (name -> Tensor or NumPy array) into this model.

        Values are converted to each parameter's dtype and device and copied *into* the
        existing parameters, so their identity (and an optimiser holding them) is kept.
        Everything is checked before anything is copied: a failed load changes nothing.
        With ``strict=True`` missing and unexpected keys are an error (all listed in one
        message); a shape mismatch is always one. Returns ``(missing_keys, unexpected_keys)``.
        Anything but a mapping (a dict, an ``OrderedDict``, NumPy's ``.npz`` file) is a TypeError.
        """
        if not isinstance(state_dict, Mapping):  # a list's items would read as unexpected keys
            raise TypeError(
                f"load_state_dict: expected a dict-like state_dict (name -> tensor), got {type(state_dict).__name__}"
            )
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        if strict and missing:
            problems.append("missing key(s): " + ", ".join(repr(k) for k in missing))
        if strict and unexpected:
            problems.append("unexpected key(s): " + ", ".join(repr(k) for k in unexpected))
        values = {}
        for name, target in own.items():
            if name not in state_dict:
                continue
            try:
                value = _as_array(state_dict[name], target)
            except (TypeError, ValueError) as e:
                problems.append(f"{name!r}: {e}")
                continue
            fits = tuple(value.shape) == target.shape
            if isinstance(target, _LAZY):  # any length where it has none yet
                fits = value.ndim == target.ndim and all(n in (m, 0) for m, n in zip(value.shape, target.shape))
            if not fits:
                problems.append(
                    f"shape mismatch for {name!r}: the state_dict has shape {tuple(value.shape)}, "
                    f"the model has shape {target.shape}"
                )
            values[name] = value
        if problems:
            raise RuntimeError(
                f"error(s) loading a state_dict into {type(self).__name__}; nothing was changed:\n  "
                + "\n  ".join(problems)
            )
        with no_grad():
            for name, value in values.items():
                target = own[name]
                if isinstance(target, _LAZY):  # a lazy layer's weight or statistic takes the saved shape
                    target.materialize(target._backend.xp.array(value, copy=True))
                else:
                    target.copy_(value)
        return IncompatibleKeys(missing, unexpected)

    # -- printing ---------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's repr (its settings)."""
        return ""

    def __repr__(self) -> str:
        lines = self.extra_repr().split("\n") if self.extra_repr() else []
        for name, child in self._modules.items():
            lines.append(f"({name}): " + repr(child).replace("\n", "\n  "))
        if not lines:
            return type(self).__name__ + "()"
        if len(lines) == 1 and not self._modules:
            return f"{type(self).__name__}({lines[0]})"
        return type(self).__name__ + "(\n  " + "\n  ".join(lines) + "\n)"


def _as_array(value: Any, target: Tensor) -> Any:
    """``value`` as an array on ``target``'s device with ``target``'s dtype."""
    backend = target._backend
    if isinstance(value, Tensor):
        data = value.data if value._backend is backend else backend.array(value.numpy())
    elif backend.is_array(value):
        data = value
    else:
        data = backend.array(value)  # a NumPy array or nested lists, from the host
    if data.dtype.kind not in "fiub" and not is_floating(data.dtype):
        raise TypeError(f"cannot load a value of dtype {data.dtype} (numbers expected)")
    return data.astype(target.dtype, copy=False)
