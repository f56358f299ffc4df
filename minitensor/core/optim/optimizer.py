"""The Optimizer base class: parameter groups, per-parameter state, saving and loading.

An optimiser turns gradients into parameter updates. It holds the parameters in
``param_groups`` (lists of parameters sharing hyper-parameters, so that e.g. biases can get
no weight decay) and, per parameter, a ``state`` dict (momentum, running averages). A
subclass writes only ``update(param, grad, state, group)``: the rule for one parameter.

State arrays live on their parameter's device; ``state_dict()`` copies them to host NumPy
arrays and keeps everything else plain numbers, lists and dicts, so a checkpoint can store
it without pickle and load it back on any device.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from ..autograd import writes
from ..creation import zeros_like
from ..dtypes import is_floating
from ..errors import DeviceError, DTypeError, ShapeError
from ..grad_mode import enable_grad, no_grad
from ..tensor import Array, Tensor

#: a parameter group: ``{"params": [...], "lr": 0.1, ...}``, the settings its parameters share
Group = dict[str, Any]
#: what an optimiser takes: a single tensor, or an iterable of tensors (``model.parameters()``) or of
#: parameter groups (dicts)
Params = Tensor | Iterable[Any]


class Optimizer:
    """Base class of the optimisers: holds the parameters in ``param_groups`` and, per parameter, a
    ``state`` dict; a subclass writes only ``update(param, grad, state, group)``, the rule for one
    parameter (D2L 11 / 12, optimisation algorithms).

    ``Optimizer(params, defaults)``: ``params`` is an iterable of parameters (``model.parameters()``),
    a single tensor, or a list of dicts ``{"params": [...], "lr": ..., ...}`` -- parameter groups
    with settings of their own; a setting a group leaves out comes from ``defaults``. Parameters
    must be floating-point leaves, each in one group (listed twice, it is kept once); an empty
    list is a ``ValueError``.

    The training step, as in PyTorch::

        loss.backward(); optimizer.step(); optimizer.zero_grad()

    ``state_dict()`` / ``load_state_dict()`` save and restore the settings and the state (host
    NumPy arrays, no pickle).

    ``lr`` may be a number or, as in PyTorch, a one-element floating-point Tensor: ``step()``
    reads its value then, so changing it in place changes the rate; the update rules only ever
    see a Python float.
    """

    #: the names of a parameter's state entries once it has any (SGD: its momentum buffer);
    #: ``load_state_dict`` refuses a saved state with others, such as another optimiser's.
    #: None (a subclass that does not say): not checked.
    state_keys: ClassVar[frozenset[str] | None] = None

    def __init__(self, params: Params, defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self.state: dict[Tensor, dict[str, Any]] = {}  # Parameter -> dict (tensors hash by identity)
        self.param_groups: list[Group] = []
        params = [params] if isinstance(params, Tensor) else list(params)
        if not params:
            raise ValueError(
                f"{type(self).__name__}: got an empty parameter list (does the model register its "
                "layers as attributes, after super().__init__()?)"
            )
        groups = [isinstance(item, dict) for item in params]
        if any(groups) and not all(groups):
            item = groups.index(False)
            raise TypeError(
                f"{type(self).__name__}: param groups must be dicts: the list mixes parameter groups (dicts) "
                f"and parameters (item {groups.index(True)} is a dict, item {item} a {type(params[item]).__name__}); "
                "give either parameters, or groups {'params': [...], ...} only"
            )
        for group in params if groups[0] else [{"params": params}]:
            self.add_param_group(group)

    def add_param_group(self, group: Group) -> None:
        """Add ``{"params": [...], "lr": ..., ...}``; missing settings come from the defaults."""
        name = type(self).__name__
        if not isinstance(group, dict):
            raise TypeError(
                f"{name}: a parameter group must be a dict {{'params': [...], ...}}, got {type(group).__name__}"
            )
        if "params" not in group:
            raise ValueError(f"{name}: a parameter group needs a 'params' entry, got one with {sorted(group)}")
        group = dict(group)
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        unique, seen = [], set()
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: parameters must be Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(
                    f"{type(self).__name__}: cannot optimise a non-leaf tensor (the result of an operation)"
                )
            if not is_floating(p.dtype):
                raise TypeError(f"{type(self).__name__}: cannot optimise a tensor of dtype {p.dtype}")
            if id(p) not in seen:  # listed twice, it would be updated twice
                seen.add(id(p))
                unique.append(p)
        for other in self.param_groups:
            if any(id(q) in seen for q in other["params"]):
                raise ValueError(f"{type(self).__name__}: a parameter appears in more than one parameter group")
        group["params"] = unique
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self.check_hyperparameters(group)
        self.param_groups.append(group)

    def check_hyperparameters(self, group: Group) -> None:
        """Refuse settings the update rule cannot use (subclasses extend it): ``lr`` a number >= 0
        or a one-element floating-point Tensor holding one, ``weight_decay`` a number >= 0. A
        setting of the wrong type is a ``TypeError``, a value out of range a ``ValueError``."""
        name, lr = type(self).__name__, group["lr"]
        if isinstance(lr, Tensor):
            if lr.numel() != 1 or not is_floating(lr.dtype):
                raise ValueError(
                    f"{name}: a Tensor lr must hold one floating-point number, got shape {lr.shape}, dtype {lr.dtype}"
                )
            value = lr.item()
        else:
            value = self.check_number("lr", lr)
        if not value >= 0:  # NaN too
            raise ValueError(f"{name}: lr must be >= 0, got {value}")
        if "weight_decay" in group and not self.check_number("weight_decay", group["weight_decay"]) >= 0:
            raise ValueError(f"{name}: weight_decay must be >= 0, got {group['weight_decay']}")

    def check_number(self, setting: str, value: Any) -> float:
        """``value`` as a float if it is a real number (int, float, NumPy scalar; not a bool), else a
        ``TypeError`` naming the optimiser and the setting: ``check_hyperparameters``' type check."""
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        raise TypeError(f"{type(self).__name__}: {setting} must be a number, got {value!r} ({type(value).__name__})")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: call before each backward, or they add up across steps."""
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    # A new array rather than zero_(): a gradient may be a read-only broadcast view.
                    p.grad = zeros_like(p.grad)

    @no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Update every parameter that has a gradient. ``closure`` (optional) recomputes and
        returns the loss, as in PyTorch; step returns it."""
        for group in self.param_groups:
            if group["params"] and group["params"][0]._backend.capturing:
                raise DeviceError(
                    f"{type(self).__name__}.step: an optimiser step cannot be captured in a CUDA graph: its "
                    "learning rate and step count go to the kernels by value, and a replay would repeat the "
                    "captured ones; call step() after g.replay(), outside the graph (as minitensor train "
                    "--cuda-graph does)"
                )
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self.check_gradients()
        for group in self.param_groups:
            if isinstance(group["lr"], Tensor):  # read now: an in-place change takes effect
                group = {**group, "lr": group["lr"].item()}
            self.update_group(group)
            for p in group["params"]:
                if p.grad is not None:
                    # a graph made before this step must not run backward on the new values
                    # (a fused kernel writes the arrays directly, past the tensors' add_)
                    writes.note(p)
        return loss

    def check_gradients(self) -> None:
        """Refuse, before any parameter changes, a gradient that is not a Tensor of its parameter's
        shape, dtype and device: a fused kernel trusts them (it would read past the end of a
        smaller gradient), and an update rule would broadcast a wrong shape into the parameter or
        fail halfway through the step. ``grad``'s setter checks too, but ``.grad`` may have been
        set around it. The check compares a shape, a dtype and a device per parameter: it runs
        at every step."""
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if not isinstance(g, Tensor):
                    raise TypeError(
                        f"{type(self).__name__}.step: a parameter of shape {p.shape} has a gradient that is "
                        f"not a Tensor but a {type(g).__name__}"
                    )
                if g.data.shape != p.data.shape:
                    raise ShapeError(
                        f"{type(self).__name__}.step: a parameter of shape {p.shape} has a gradient of shape "
                        f"{g.shape}; nothing was updated"
                    )
                if g.data.dtype != p.data.dtype:
                    raise DTypeError(
                        f"{type(self).__name__}.step: a parameter of shape {p.shape} and dtype {p.dtype} has a "
                        f"gradient of dtype {g.dtype}; nothing was updated"
                    )
                if g._backend is not p._backend:
                    raise DeviceError(
                        f"{type(self).__name__}.step: a parameter of shape {p.shape} on {p.device!r} has its "
                        f"gradient on {g.device!r}; nothing was updated"
                    )

    def update_group(self, group: Group) -> None:
        """Update every parameter of ``group`` that has a gradient: ``update`` for each. A rule
        that can update a whole group at once overrides it (Adam: on a GPU, one kernel launch for
        all of the group's parameters instead of one each)."""
        for p in group["params"]:
            if p.grad is not None:
                self.update(p, p.grad.data, self.state.setdefault(p, {}), group)

    def update(self, param: Tensor, grad: Array, state: dict[str, Any], group: Group) -> None:
        """Update one parameter in place: ``param`` (a Parameter), ``grad`` (its gradient as
        a backend array), ``state`` (this parameter's dict, empty at first), ``group``."""
        raise NotImplementedError(f"{type(self).__name__} must define update(param, grad, state, group)")

    # -- saving and loading -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {name: array or number}}, "param_groups": [{..., "params": [indices]}]}``.

        Parameters are numbered in the order of ``param_groups``; arrays are host NumPy
        copies (a snapshot: training on does not change them).
        """
        index: dict[int, int] = {}  # id(parameter) -> its number
        groups, state = [], {}
        for group in self.param_groups:
            saved = {k: v for k, v in group.items() if k != "params"}
            saved["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(saved)
            for p in group["params"]:
                if self.state.get(p):
                    state[index[id(p)]] = {
                        k: (p._backend.to_numpy(v) if p._backend.is_array(v) else v) for k, v in self.state[p].items()
                    }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` returned, for the same parameters in the same groups.

        Accepts the structure after a JSON round trip too (string indices, lists for tuples).
        Arrays go to each parameter's device and dtype and must have its shape. Everything is
        checked before anything changes.
        """
        name = type(self).__name__
        # The shape of what state_dict() returns, checked first: a model's state_dict, or a file
        # read from elsewhere, would otherwise fail on a bare KeyError deep inside.
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
            got = f"keys {sorted(map(str, state_dict))}" if isinstance(state_dict, dict) else type(state_dict).__name__
            wrong = f"a dict of 'state' and 'param_groups', got {got}"
        elif not isinstance(state_dict["state"], dict):
            wrong = f"its 'state' a dict, got {type(state_dict['state']).__name__}"
        elif not isinstance(state_dict["param_groups"], (list, tuple)) or not all(
            isinstance(g, dict) and isinstance(g.get("params"), (list, tuple)) for g in state_dict["param_groups"]
        ):
            wrong = "its 'param_groups' a list of dicts, each with its 'params'"
        else:
            wrong = ""
        if wrong:
            raise ValueError(f"{name}.load_state_dict: expected what an optimiser's state_dict() returns: {wrong}")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"{name}.load_state_dict: the state has {len(saved_groups)} parameter group(s), "
                f"this optimiser {len(self.param_groups)}"
            )
        by_index: dict[int, Tensor] = {}  # number -> parameter
        for i, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"{name}.load_state_dict: parameter group {i} has {len(saved['params'])} parameter(s) in "
                    f"the state, {len(group['params'])} in this optimiser"
                )
            # Another optimiser's group lacks some of this one's settings (SGD's has no betas, Adam's
            # no momentum): loaded, the rule would find its settings or its state missing at step().
            missing = sorted(set(self.defaults) - set(saved))
            if missing:
                present = sorted(k for k in saved if k != "params")
                raise ValueError(
                    f"{name}.load_state_dict: parameter group {i} of the state has no {missing} that this {name} "
                    f"needs (its settings are {present}{_whose(present, 'defaults')}); is it another "
                    "optimiser's state?"
                )
            by_index.update(zip((int(k) for k in saved["params"]), group["params"]))
        new_state = {}
        for key, values in state_dict["state"].items():
            if int(key) not in by_index:
                raise ValueError(f"{name}.load_state_dict: state for parameter {key}, which no group lists")
            if self.state_keys is not None and values and set(values) != self.state_keys:
                keys = sorted(values)
                raise ValueError(
                    f"{name}.load_state_dict: the state of parameter {key} has {keys}{_whose(keys, 'state_keys')}, "
                    f"where this {name} keeps {sorted(self.state_keys)}; is it another optimiser's state?"
                )
            p = by_index[int(key)]
            where = f"{name}.load_state_dict: state[{key}]"
            new_state[p] = {k: _to_param_device(v, p, f"{where}[{k!r}]") for k, v in values.items()}
        new_groups = []
        for saved, group in zip(saved_groups, self.param_groups):
            settings = {k: tuple(v) if isinstance(self.defaults.get(k), tuple) else v for k, v in saved.items()}
            new_groups.append({**group, **settings, "params": group["params"]})
            self.check_hyperparameters(new_groups[-1])
        for group, new in zip(self.param_groups, new_groups):
            group.update(new)  # the same dict objects: schedules may hold references to them
        self.state = new_state

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in group.items() if k != "params"]
        return "\n".join(lines + [")"])


def _whose(keys: list[str], what: str) -> str:
    """The words ", SGD's" when ``keys`` look like a known optimiser class's, else "": to name in
    an error the optimiser a state came from. ``what="state_keys"``: a parameter's state, the class's
    ``state_keys`` exactly; ``what="defaults"``: a group's settings, all of the class's constructor
    settings among them (a group also holds others, like a schedule's ``initial_lr``)."""
    found, names = set(keys), set()
    for cls in _subclasses(Optimizer):
        if what == "state_keys":
            if cls.state_keys is not None and cls.state_keys == found:
                names.add(cls.__name__)
        else:
            settings = set(inspect.signature(cls.__init__).parameters) - {"self", "params", "fused"}
            if settings and settings <= found:
                names.add(cls.__name__)
    return f", {' or '.join(sorted(names))}'s" if names else ""


def _subclasses(cls: type[Optimizer]) -> list[type[Optimizer]]:
    """Every subclass of ``cls``, at any depth."""
    return [sub for direct in cls.__subclasses__() for sub in [direct, *_subclasses(direct)]]


def _to_param_device(value: Any, p: Tensor, where: str) -> Any:
    """A saved state value back in working form: numbers stay numbers, arrays become arrays
    on ``p``'s device with ``p``'s dtype and shape."""
    if isinstance(value, (int, float)):
        return value
    backend = p._backend
    if isinstance(value, Tensor):
        value = value.numpy()
    data = value.copy() if backend.is_array(value) else backend.array(value)
    if data.ndim == 0:
        return data.item()  # a scalar saved as a 0-d array (e.g. by an array-only format)
    if tuple(data.shape) != p.shape:
        raise ValueError(f"{where} has shape {tuple(data.shape)}, but the parameter has shape {p.shape}")
    return data.astype(p.dtype, copy=False)
