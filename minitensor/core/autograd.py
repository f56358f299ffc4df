"""Reverse-mode automatic differentiation: ``Function`` and the backward pass.

Every differentiable operation is a subclass of ``Function`` with two static methods side
by side, as in PyTorch::

    class Mul(Function):
        @staticmethod
        def forward(ctx, a, b):          # backend arrays in, a backend array out
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, grad):         # dL/dout in, (dL/da, dL/db) out
            a, b = ctx.saved
            return grad * b, grad * a

``Mul.apply(x, y)`` unwraps the Tensors, runs ``forward`` on their arrays and wraps the
result in a new Tensor whose ``_ctx`` is the Function object itself: the node of the graph,
holding the inputs and whatever ``forward`` saved. ``forward`` and ``backward`` work on raw
arrays through ``ctx.xp`` (NumPy or CuPy), never on Tensors: the graph is built only by
``apply``, so a backward pass never records a new graph (minitensor has no double backward).

Every tensor an op makes comes out of ``apply``, also where there is no gradient: comparisons,
``argmax``, ``arange`` are Functions declared ``differentiable = False`` (no node, no backward).
So ``apply`` is where a tracer watches a forward pass (``mt.onnx.export`` does): the one hook,
``tracing.py``; no other engine code knows that tracers exist.

``backward(root)`` visits the graph in reverse topological order -- with a heap, no Python
recursion, so a chain of 100,000 operations is fine -- calls each node's
``backward`` and adds up the gradients that reach a tensor along different paths. Gradients
of broadcast inputs are summed back to the input's shape here, once, instead of in every op.
A gradient that is zero but on a slice (``GradAt``, what reading ``x[t]`` passes back) is added
where it belongs, into one array per tensor that backward owns: a loop over the T steps of x
costs T slices in backward, not T arrays of x's size.
Afterwards the graph is freed (the saved arrays and the links to the inputs are dropped) so
memory returns at once; ``retain_graph=True`` keeps it for a second backward.
"""

from __future__ import annotations

import sys
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy

from . import grad_mode, tracing
from .backends import get_backend
from .dtypes import float32, is_floating, is_low_precision
from .errors import DeviceError, DTypeError, GraphError, ShapeError
from .tensor import Array, Tensor, _creation_counter

if TYPE_CHECKING:
    from .backends import Backend

#: what a Function's ``backward`` returns: one gradient per input of ``forward`` (None for an
#: input that gets none), as a tuple, or the gradient itself for a single input
Grads: TypeAlias = Array | tuple[Array | None, ...]

_SHAPE_WORDS = ("broadcast", "shape", "dimension", "mismatch", "align")  # in NumPy's and CuPy's errors of shapes
_new_object = object.__new__  # a Function instance without running __init__ (the per-op path)
_make = Tensor._make  # the per-op path again: one lookup saved on every op


class GradAt:
    """dL/da for an input ``a`` of ``shape`` that the op read at a basic ``index`` only: zero
    everywhere but ``a[index]``, where it is ``values``. What ``x[index]``'s backward returns
    (``ops.indexing.GetItem``) instead of zeros of x's shape with ``values`` written in.

    Why: ``for x_t in X`` (a decoder's loop over its embedded inputs, D2L 11.4) reads X
    T times, and T dense gradients of X's shape, each added to the sum so far, cost T^2 steps
    of memory traffic. backward adds each ``GradAt`` into one array per tensor instead
    (``_add``): T slices in all, as PyTorch's ``unbind`` does. ``index`` must select a view
    (the result has at least one axis), so that the slice can be added to in place.
    """

    __slots__ = ("shape", "index", "values")

    def __init__(self, shape: tuple[int, ...], index: Any, values: Array) -> None:
        self.shape, self.index, self.values = tuple(shape), index, values

    @property
    def dtype(self) -> Any:
        return self.values.dtype

    def dense(self, xp: Any) -> Array:
        """The gradient as an array of ``shape``: zeros, ``values`` at ``index``."""
        out = xp.zeros(self.shape, dtype=self.values.dtype)
        out[self.index] = self.values
        return out


class Function:
    """Base class of differentiable operations; an instance is the ``ctx`` of one call.

    A subclass writes ``forward`` and ``backward`` as static methods, side by side;
    ``Op.apply(x, ...)`` runs ``forward`` on the Tensors' arrays and, when an input requires
    grad and grad mode is on, records the call as the node of the graph that ``backward``
    visits (reverse-mode automatic differentiation, D2L 2.5).
    """

    # Slots for what every node has (faster than a dict on the per-op path); ops may still
    # store anything else on ctx (it lands in __dict__).
    __slots__ = ("xp", "backend", "inputs", "saved", "__dict__")
    xp: Any  # the array module of the inputs' device: numpy or cupy
    backend: Backend
    inputs: Any  # the arguments of apply, a tuple (None once backward() has freed the graph)
    saved: Any  # the arrays given to save_for_backward, a tuple (None once freed)

    if TYPE_CHECKING:
        # An op keeps anything else it needs on ctx too (``ctx.axis = axis``): any name, any value.
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...

    differentiable = True
    """False for an op outside the graph (a comparison, ``argmax``, ``arange``): its output never
    requires grad, it has no ``backward``, and ``apply`` builds no node for it, so its ``forward``
    gets the backend as ``ctx`` (``ctx.xp`` works as in every op; there is nothing to save). It is
    a Function all the same so that every tensor an op makes comes out of ``apply``, where a
    tracer sees it (``tracing``)."""

    reads_inputs = True
    """False for an op whose backward needs no input's values, only shapes (``add``, ``sub``,
    ``neg``, ``sum``, ``mean``, a reshape or a permutation): backward's check of in-place writes
    (``WriteLog``) passes it by, as PyTorch's version counters, which look at saved tensors
    alone, would. ``x = a + buffer; buffer.mul_(0.9); x.backward()`` is then fine, as there."""

    writes_input = False
    """True for the op of ``x[index] = v`` in the graph (``ops.indexing.SetItem``): its output is
    the tensor x itself, rebound, and its first input the value x had before, which ops that used
    x before the write still need their gradients to reach (``backward`` follows the link).
    ``backward`` also tells such a node whether the gradient it gets is backward's alone
    (``ctx.grad_is_own``): then it zeroes the positions written in that array, not in a copy, so
    that T writes in a loop (``outputs[t] = y``) cost T slices in backward, not T copies of x."""

    # -- what forward uses ------------------------------------------------------------
    def save_for_backward(self, *arrays: Array) -> None:
        """Keep arrays that ``backward`` needs (freed after the backward pass)."""
        self.saved = arrays

    @property
    def needs_input_grad(self) -> list[bool]:
        """One bool per input: does that input want a gradient? Lets backward skip work."""
        return [isinstance(x, Tensor) and x.requires_grad for x in self.inputs]

    # -- to be written by each operation ----------------------------------------------
    @staticmethod
    def forward(ctx: Function, *args: Any, **kwargs: Any) -> Array:
        """The op's computation, written by each subclass as a ``@staticmethod``:
        ``forward(ctx, *args, **kwargs)`` gets the arguments of ``apply`` with every Tensor
        replaced by its backend array (other values pass as they are) and returns one backend
        array.

        Work through ``ctx.xp`` (NumPy or CuPy) to stay device-agnostic; keep what ``backward``
        needs with ``ctx.save_for_backward(...)`` or as attributes of ``ctx``. ``apply`` calls it
        and wraps the result in a Tensor.
        """
        raise NotImplementedError

    @staticmethod
    def backward(ctx: Function, grad: Array) -> Grads:
        """The op's chain rule, written by each subclass as a ``@staticmethod``:
        ``backward(ctx, grad)`` gets dL/d(output) as a backend array and returns dL/d(input)
        for each positional input of ``forward``, in order -- a tuple, or one array for a
        single input.

        Return None for an input that gets no gradient (a constant, an index, or one for which
        ``ctx.needs_input_grad`` is False). A gradient may keep the broadcast output's shape: the
        engine sums it back to the input's shape. One that is zero but on a slice of the input
        may be returned as ``GradAt(input_shape, index, values)``: the engine adds it into that
        slice of the input's gradient (``x[index]``'s backward does).
        """
        raise NotImplementedError

    # -- the machinery ----------------------------------------------------------------
    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Tensor:
        """Run the op on Tensors (or Python constants), record it in the graph and report it to the
        installed tracer, if any (``tracing.py``)."""
        # This loop runs for every operation: it is kept to the bare minimum (the per-op
        # cost of a small model is dominated by such Python bookkeeping, not arithmetic).
        first = None
        requires_grad = False
        raw = []
        for a in args:
            if isinstance(a, Tensor):
                if first is None:
                    first = a
                elif a._backend is not first._backend or (
                    a.data.dtype is not first.data.dtype and a.data.dtype != first.data.dtype
                ):
                    _check_compatible(cls, first, a, kwargs.get("autocast") is not None)
                if a.requires_grad:
                    requires_grad = True
                raw.append(a.data)
            else:
                raw.append(a)
        if first is not None:
            backend = first._backend
        elif "device" in kwargs:  # a tensor maker (full, arange): no Tensor in, the device is named
            backend = get_backend(kwargs["device"])
        else:
            raise TypeError(f"{cls.__name__.lower()}: needs at least one Tensor argument")
        ctx: Any  # the node (a Function), or the backend for an op outside the graph
        differentiable = cls.differentiable
        if differentiable:
            ctx = _new_object(cls)
            ctx.xp = backend.xp
            ctx.backend = backend
        else:  # an op outside the graph: no node (see ``differentiable``)
            ctx = backend
        try:
            out = cls.forward(ctx, *raw, **kwargs)
        except MemoryError as e:  # (NumPy's and CuPy's say what they could not allocate; say for which op)
            raise MemoryError(f"{cls.__name__.lower()}: {e}") from None
        except ValueError as e:
            if isinstance(e, ShapeError) or first is None:  # (a maker's error is not about shapes that meet)
                raise
            if not any(word in str(e).lower() for word in _SHAPE_WORDS):  # (NumPy's word on a value: say whose)
                raise ValueError(f"{cls.__name__.lower()}: {e}") from None
            shapes = " and ".join(str(tuple(a.shape)) for a in args if isinstance(a, Tensor))
            raise ShapeError(
                f"{cls.__name__.lower()}: shapes {shapes} do not fit together ({e}); to broadcast, "
                "shapes aligned from the right must be equal or 1 in each axis"
            ) from None
        if requires_grad and differentiable and grad_mode._enabled:
            ctx.inputs = args
            result = _make(out, backend, ctx)
        else:
            result = _make(out, backend, None)
        if tracing.tracer is not None:  # the one hook of a tracer (mt.onnx.export): see tracing.py
            tracing.tracer.function(cls, args, kwargs, result)
        return result

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"


def _check_compatible(cls: type[Function], a: Tensor, b: Tensor, autocast: bool = False) -> None:
    """Raise if two tensor operands of one op cannot combine (devices, float precisions; a product
    inside ``mt.autocast``, called with ``autocast=dtype``, rounds both operands to it itself)."""
    op = cls.__name__.lower()
    if a._backend is not b._backend:
        raise DeviceError(
            f"{op}: tensors on different devices, {a.device!r} and {b.device!r}; move one "
            f"with .to({a.device!r}) or .to({b.device!r})"
        )
    da, db = a.data.dtype, b.data.dtype
    if is_floating(da) and is_floating(db) and cls.differentiable and not autocast:  # (bools drift nowhere)
        # NumPy would silently promote float32 to float64 (slow, and a model's dtype would
        # drift); PyTorch refuses in matmul. Refuse everywhere and say how to fix it.
        raise DTypeError(
            f"{op}: float tensors of different precision, {da} and {db}, do not combine "
            f"silently; convert one with .to(mt.{da}) or .to(mt.{db})"
        )


def sum_to_shape(grad: Array, shape: tuple[int, ...]) -> Array:
    """Undo broadcasting: sum ``grad`` over the axes that broadcasting added or stretched.

    If z = a + b with a of shape (3, 1) and b of shape (4,), z has shape (3, 4); every a[i]
    was used 4 times and every b[j] 3 times, so dL/da sums grad over axis 1 and dL/db over
    axis 0.
    """
    if grad.shape == shape:
        return grad
    if is_low_precision(grad.dtype):  # summed in float32 and rounded once, as Sum does
        return sum_to_shape(grad.astype(float32), shape).astype(grad.dtype)
    lead = grad.ndim - len(shape)
    if lead > 0:
        grad = grad.sum(axis=tuple(range(lead)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad.reshape(shape)


def backward(root: Tensor, grad: Tensor | Array | None = None, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into ``leaf.grad`` for every leaf that requires grad.

    Order: a tensor's gradient is complete once every tensor computed *from* it has passed
    its gradient back. Every tensor carries a creation number ``_seq``, and a tensor is
    always created after its inputs, so processing tensors in decreasing ``_seq`` (a heap
    holding the tensors that have received some gradient so far) is a reverse topological
    order: no recursion, no separate sorting pass.
    """
    grads = {root: _root_gradient(root, grad)}  # dL/dt so far (tensors hash by identity)
    heap = [(-root._seq, root)]
    written: dict[Tensor, Tensor] = {}  # x -> the value x had before ``x[...] = v``, once its node is freed
    owned: set[int] = set()  # ids of the arrays in ``grads`` that backward made: nothing else holds them
    while heap:
        t = heappop(heap)[1]
        g = grads.pop(t)  # complete: every tensor made from t has passed its part back
        if type(g) is GradAt:
            g = g.dense(t._backend.xp)
        else:
            owned.discard(id(g))  # from here on, the node's backward may hand it on as it is
        ctx = t._ctx
        if ctx is None or t._retain_grad:
            unshared = ctx is None and _unshared(g)  # (only a leaf may take g itself; asked before
            _accumulate(t, g, unshared)  # the call, whose arguments would count as holders of g)
            if ctx is None:
                continue
        if ctx.inputs is None:
            raise _freed_graph_error(ctx)
        if writes.latest > t._seq:  # something was changed in place since t was made
            writes.check(ctx, t)
        # The chain rule at this node: dL/d(output) -> dL/d(each input), added to what that
        # input has received along other paths.
        if ctx.writes_input:
            ctx.grad_is_own = _unshared(g)
        input_grads = ctx.backward(ctx, g)
        if type(input_grads) is not tuple:
            input_grads = (input_grads,)
        for p, pg in zip(ctx.inputs, input_grads):
            if pg is None or not isinstance(p, Tensor):
                continue
            if p._seq > t._seq:  # an input newer than its output: written by ``x[...] = v`` since
                p = _value_used(p, t, written)
            if not p.requires_grad:
                continue
            if pg.shape != p.data.shape:
                pg = sum_to_shape(pg, p.data.shape)
            if p in grads:
                grads[p] = _add(grads[p], pg, owned, p._backend.xp)
            else:
                grads[p] = pg
                heappush(heap, (-p._seq, p))
        # Hold no gradient into the next node: a leaf takes one that nothing else holds.
        input_grads = pg = None
        if not retain_graph:
            # Drop the saved arrays and the links to the inputs; the emptied node stays so
            # that a second backward can say what happened instead of doing nothing.
            if ctx.writes_input:
                written[t] = ctx.inputs[0]
            ctx.inputs = ctx.saved = None
            ctx.__dict__.clear()


class WriteLog:
    """Which arrays were changed in place (``x += y``, ``add_``, ``copy_``, ``x[i] = v`` outside the
    graph) and when, so that backward can refuse a gradient computed from values that changed.

    An op's backward reads the arrays its forward saved, and a write into one of them between
    the forward and the backward would change the gradient without a sound (``c = a * x;
    x.mul_(5); c.backward()`` would give 5x the gradient). PyTorch keeps a version counter on
    every tensor for this. Here a write stamps the array that owns the memory (views and
    ``detach()`` share it) with the creation number current at the write (``Tensor._seq``, the
    clock that orders the graph), and backward checks a node's inputs only when some write came
    after the node's output was made: never, in a loop of forward, backward and optimiser step.

    The check looks at every Tensor input of a node whose backward reads its inputs' values
    (``Function.reads_inputs``), not only at what that backward saved (which ops keep in their
    own ways), so it is stricter than PyTorch's where an op saves only some of its inputs: a
    write to one it did not save is refused too.
    """

    CAPACITY = 4096  # arrays remembered; past it, the longest-unwritten are forgotten first

    def __init__(self) -> None:
        self.latest = -1  # the stamp of the last write: backward compares it with a node's
        self.stamps: dict[int, int] = {}  # id of the memory's owner -> stamp of its last write

    def note(self, t: Tensor) -> None:
        """Stamp ``t``'s array (and every array sharing its memory) as written now."""
        self.latest = next(_creation_counter)
        key = id(t._backend.memory_owner(t.data))
        self.stamps.pop(key, None)  # (re-inserted last: the dict's order is the order of writes)
        self.stamps[key] = self.latest
        if len(self.stamps) > self.CAPACITY:
            del self.stamps[next(iter(self.stamps))]
        # An id outlives its array and may be reused, but harmlessly: any node that reads a
        # new array at that id was made after the new array, so after the stamp.

    def check(self, ctx: Function, output: Tensor) -> None:
        """Raise if an input of ``ctx`` was written after ``output`` (ctx's result) was made."""
        if not ctx.reads_inputs:
            return
        for x in ctx.inputs:
            if isinstance(x, Tensor) and self.stamps.get(id(x._backend.memory_owner(x.data)), -1) > output._seq:
                raise GraphError(
                    f"backward: an input of {type(ctx).__name__.lower()} (shape {tuple(x.shape)}, "
                    f"{x.dtype}) was changed in place after {type(ctx).__name__.lower()} used it "
                    "(x += y, add_, copy_, x[i] = v, an optimiser step ...), so its gradient would "
                    "come from the new values. Change a copy instead (x = x + y, y = x.clone()), or "
                    "change it after backward(), as an optimiser does"
                )


writes = WriteLog()


def _value_used(p: Tensor, t: Tensor, written: dict[Tensor, Tensor]) -> Tensor:
    """The value that tensor ``p`` had when ``t`` was made from it. ``x[...] = v`` rebinds x to a
    new node whose first input is x's previous value (and gives x a new creation number), so the
    ops that used x before the write reach that value by walking back, write by write."""
    while p._seq > t._seq:
        ctx = p._ctx
        if ctx is None or not ctx.writes_input:
            raise GraphError(f"backward: an input of {t.grad_fn!r} is newer than its output")  # (never: an engine bug)
        p = ctx.inputs[0] if ctx.inputs is not None else written[p]
    return p


def _add(total: Any, part: Any, owned: set[int], xp: Any) -> Array:
    """total + part: the gradient a tensor has received so far plus one more path's (each an
    array or a ``GradAt``). Added in place into ``total`` when backward made that array
    itself (its id in ``owned``: no node's backward has seen it, nothing else holds it),
    else into a new array that backward then owns; a ``GradAt`` is added to its slice only."""
    if id(total) in owned and type(part) is not GradAt and total.dtype == part.dtype:
        total += part  # the common case first: a third path or more, into backward's own array
        return total
    if type(total) is GradAt and type(part) is not GradAt:
        total, part = part, total  # start from the dense one (a + b is b + a, to the last bit)
    if type(total) is GradAt:
        total = total.dense(xp)
    elif id(total) not in owned or not total.ndim or total.dtype != part.dtype:
        owned.discard(id(total))  # (a dtype that differs: NumPy's promotion, as before, in a new array)
        if type(part) is not GradAt:
            total = total + part
            if total.ndim:  # (a 0-d sum may be a NumPy scalar: nothing to add into)
                owned.add(id(total))
            return total
        total = total.copy()
    if type(part) is GradAt:
        view = total[part.index]  # a view: GradAt's index keeps an axis
        view += part.values
    else:
        total += part
    owned.add(id(total))
    return total


def _freed_graph_error(ctx: Function) -> GraphError:
    return GraphError(
        f"backward through a freed graph: the graph through {type(ctx).__name__} was "
        "freed by an earlier backward(); pass retain_graph=True to the first "
        "backward() to run backward twice, or recompute the forward pass"
    )


def _root_gradient(root: Tensor, grad: Tensor | Array | None) -> Array:
    """dL/d(root) as a backend array: ones for a scalar, else ``grad``, checked."""
    if not root.requires_grad:
        raise GraphError(
            "backward: this tensor does not require grad and has no graph (create the inputs "
            "with requires_grad=True, and do not compute it under mt.no_grad())"
        )
    if grad is None:
        if root.data.size != 1:
            raise GraphError(
                f"backward: the output has shape {tuple(root.shape)}; backward() without a "
                "gradient needs a scalar (one element). Reduce it first (loss.sum(), "
                f"loss.mean()) or pass a gradient of shape {tuple(root.shape)}"
            )
        return root._backend.xp.ones_like(root.data)
    if isinstance(grad, Tensor):
        if grad._backend is not root._backend:
            raise DeviceError(
                f"backward: the gradient is on {grad.device!r} but the output on "
                f"{root.device!r}; move it with .to({root.device!r})"
            )
        grad = grad.data
    else:
        grad = root._backend.array(grad)
    if grad.dtype != root.data.dtype:
        grad = grad.astype(root.data.dtype)
    if grad.shape != root.data.shape:
        raise ShapeError(
            f"backward: gradient of shape {tuple(grad.shape)} for an output of shape "
            f"{tuple(root.shape)}; they must be equal"
        )
    return grad


def _accumulate(t: Tensor, g: Array, unshared: bool) -> None:
    """Add ``g`` to ``t.grad``: into its array, in place, when there is one (as in PyTorch, whoever
    holds ``t.grad`` sees the sum), else as a new ``.grad`` with an array of its own.

    ``.grad`` must be safe to update in place (gradient clipping, weight decay). ``g`` may
    be shared with other tensors (``Add`` hands one gradient to both inputs), be a
    read-only broadcast view (from ``sum``) or the caller's array: then ``.grad`` is a copy.
    But most often ``g`` is a fresh array that nothing else holds (a product's, a
    softmax's), and copying it would cost a pass over memory for nothing: then the leaf
    takes it as it is, as PyTorch does (it too counts the references to decide: backward
    asks ``_unshared`` and passes the answer as ``unshared``).
    """
    if t._grad is not None:
        try:
            t._grad.data += g  # in place, as PyTorch: whoever holds t.grad sees the sum
        except ValueError:  # (a read-only array, such as a broadcast view someone assigned)
            t._grad = Tensor._make(t._grad.data + g, t._backend, None)
    elif unshared and g.dtype == t.data.dtype:
        t._grad = Tensor._make(g, t._backend, None)
    else:
        t._grad = Tensor._make(g.astype(t.data.dtype, copy=True), t._backend, None)


def _unshared(g: Array) -> bool:
    """True if nothing but ``backward``'s variable holds the gradient ``g`` (called from there
    alone: the count of references depends on the calls in between), and no other array shares
    its memory. A leaf takes such a gradient as its ``.grad``; ``x[index] = v``'s backward
    zeroes the written slice in it."""
    return sys.getrefcount(g) == _UNSHARED and _owns_memory(g)


def sole_holder(t: Tensor) -> bool:
    """True if nothing but tensor ``t`` can reach its array: no other tensor shares it, no op
    saved it (or a view of it) for backward, no variable of the caller holds it. Then
    ``x[index] = v`` in the graph may write into x's array (``Tensor.__setitem__``) instead of a
    copy: nobody could see the difference, and a loop of T writes costs T slices, not T copies
    of x (with T of them alive until backward). NumPy decides the same way, by reference
    counts, when it reuses a temporary in ``a + b + c``."""
    return sys.getrefcount(t.data) == _HELD_ONCE and _owns_memory(t.data)


def _owns_memory(g: Array) -> bool:
    """True if ``g`` is a writeable array whose memory nothing else can reach.

    A NumPy array: following ``.base`` -- the array a view was taken from, or, for an array a
    numba kernel allocated, the MemInfo that owns its memory -- every link must be held by the
    one before it alone; a MemInfo also counts the arrays inside numba that share it.

    A device array (CuPy's): one that views no other array, ``base`` None. On a GPU the copy
    is not only a pass over memory but a kernel launch, one per parameter in every step, for
    a step whose time is mostly launches. (CuPy's views always name their base, its arrays are
    always writeable, and the reference count in ``_unshared`` has ruled out a second holder.)
    """
    if type(g) is not numpy.ndarray:
        return getattr(g, "base", g) is None  # an array type without ``base``: assume shared
    if not g.flags.writeable:
        return False
    link: Array = g
    while getattr(link, "base", None) is not None:
        if _base_refcount(link) != _ONLY_VIEWED:
            return False
        link = link.base
    return getattr(link, "refcount", 1) == 1


def _base_refcount(view: Array) -> int:
    base = view.base
    return sys.getrefcount(base)


def _count_references() -> tuple[int, int, int]:
    """What ``sys.getrefcount`` reports in ``_unshared`` for an array that nothing but
    ``backward``'s variable holds, in ``_base_refcount`` for the base of a view that
    nothing but the view holds, and in ``sole_holder`` for an array that only its tensor holds.
    Measured once, along the same calls, because Python versions count their own temporary
    references differently."""

    class Holder:
        __slots__ = ("data",)  # as Tensor's

        def __init__(self, data: Array) -> None:
            self.data = data

    def backward_like() -> tuple[int, int, int]:
        g = numpy.empty(2)
        holder = Holder(numpy.empty(2))
        return unshared_like(g), _base_refcount(numpy.empty(2)[:1]), sole_holder_like(holder)

    def unshared_like(g: Array) -> int:
        return sys.getrefcount(g)

    def sole_holder_like(t: Any) -> int:
        return sys.getrefcount(t.data)

    return backward_like()


_UNSHARED, _ONLY_VIEWED, _HELD_ONCE = _count_references()
