"""Decoders as chains: processors that reshape the next-token scores, then one search.

At every step a model gives log-probabilities log P(v | y_<t) over the vocabulary. A
*decoder* is what turns them into the next token (the contract: "Decoders" in
``minitensor/core/hookspecs.py``)::

    scores = log P(. | y_<t)                          (rows, |V|), float64
    scores = processor_n(...processor_1(scores, tokens)...)
    token  = search's choice from the processed scores

A processor only reshapes the scores (``temperature`` divides them, ``top_k`` / ``top_p`` /
``min_p`` set the tokens outside their set to -inf, ``repetition_penalty`` lowers the tokens
already written); a search chooses (``greedy``, ``beam``, ``sample``, ``speculative``). All
are plugins, looked up by name in ``minitensor.plugins.decoders()``; the built-ins are in
``plugins/minitensor_plugins/decoders.py``. ``decoder("top_k,top_p", k=50, p=0.9)`` builds a
chain; ``minitensor.inference.generate(..., decoder=...)`` and ``minitensor generate
--decoder ...`` run one.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy

__all__ = ["Decoder", "Forbid", "apply_processors", "decoder"]

PROCESSOR, SEARCH = "processor", "search"


class Forbid:
    """The processor that keeps tokens that are no text out: their scores become -inf.

    ``generate`` and ``translate`` put one first in every chain, for <pad> and <bos> (a model
    that gives them a little probability must not print them). ``eos`` is never forbidden:
    it is how a sequence ends.
    """

    kind = PROCESSOR

    def __init__(self, ids: Sequence[int] = (), eos: int | None = None) -> None:
        self.ids = sorted(set(int(i) for i in ids) - {eos})

    def __call__(self, scores: numpy.ndarray, tokens: numpy.ndarray) -> numpy.ndarray:
        if not self.ids:
            return scores
        scores = scores.copy()
        scores[:, self.ids] = -numpy.inf
        return scores

    def __repr__(self) -> str:
        return f"Forbid({self.ids})"


def _name(piece: Any) -> str:
    return getattr(piece, "name", None) or type(piece).__name__


def apply_processors(processors: Sequence[Any], scores: numpy.ndarray, tokens: numpy.ndarray | None) -> numpy.ndarray:
    """Run the chain: ``scores`` (rows, |V|) log-probabilities -> the processed scores.

    Each processor gets a copy of what the previous one returned (so one that writes into
    its argument harms no one: the caller still needs the model's own log-probabilities)
    and the tokens (rows, t), read-only. What it returns must be an array of the same shape
    without NaN or +inf, and every row must keep at least one finite score (else no token
    could be chosen): anything else is a ValueError naming the processor.
    """
    if tokens is not None:
        tokens = numpy.array(tokens, dtype=numpy.int64)
        tokens.setflags(write=False)
    names = []
    for processor in processors:
        names.append(_name(processor))
        out = processor(scores.copy(), tokens)
        shape = getattr(out, "shape", None)
        if shape != scores.shape:
            got = f"shape {shape}" if shape is not None else f"a {type(out).__name__}"
            raise ValueError(
                f"decoder processor {names[-1]}: returned {got} for scores of shape {scores.shape}; "
                "a processor returns (rows, vocab_size) scores"
            )
        out = numpy.asarray(out, dtype=numpy.float64)
        if numpy.isnan(out).any() or numpy.isposinf(out).any():
            raise ValueError(
                f"decoder processor {names[-1]}: returned NaN or +inf scores; a score is a real number or -inf"
            )
        scores = out
    dead = numpy.flatnonzero(~numpy.isfinite(scores.max(axis=-1))) if scores.size else numpy.zeros(0, int)
    if len(dead):
        raise ValueError(
            f"decoder: the processors {', '.join(names)} left no possible token in row {int(dead[0])} "
            "(every score -inf)"
        )
    return scores


def _accepted(cls: type[Any]) -> list[str]:
    """The options a piece's constructor names (keyword-usable parameters, ``self`` aside)."""
    try:
        parameters = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


class Decoder:
    """A chain of processors and one search, as ``decoder()`` builds it.

    ``processors``: the processor objects, applied in order; ``search``: the search object;
    ``names``: the registered names, processors first. ``decoder(model, state, start, eos,
    max_len, rng=None, before=())`` runs the search with ``before`` (e.g. a ``Forbid``)
    ahead of the chain: one ``Hypothesis`` per row of ``start``.
    """

    def __init__(self, processors: list[tuple[str, Any]], search: tuple[str, Any]) -> None:
        self.processors = [p for _, p in processors]
        self.search = search[1]
        self.names = [n for n, _ in processors] + [search[0]]
        self._descriptions = [f"{n}{_options_of(p)}" for n, p in processors + [search]]

    def __call__(
        self,
        model: Any,
        state: Any,
        start: numpy.ndarray,
        eos: int | None,
        max_len: int,
        rng: numpy.random.Generator | None = None,
        before: Sequence[Any] = (),
    ) -> list[Any]:
        from ..random import host_rng

        rng = host_rng() if rng is None else rng
        return self.search(model, state, start, eos, max_len, list(before) + self.processors, rng)

    def __repr__(self) -> str:
        return f"Decoder({', '.join(self._descriptions)})"


def _options_of(piece: Any) -> str:
    """``(p=0.9)``: the options a piece was built with, as far as it keeps them as attributes."""
    shown = []
    for option in _accepted(type(piece)):
        value = getattr(piece, option, None)
        if value is not None:
            shown.append(f"{option}={type(value).__name__ if hasattr(value, 'decode_step') else repr(value)}")
    return f"({', '.join(shown)})" if shown else ""


def _split_names(names: str | Sequence[str]) -> list[str]:
    if isinstance(names, str):
        names = names.split(",")
    parts = [str(n).strip() for n in names]
    if not parts or not all(parts):
        raise ValueError(
            f"decoder: expected names separated by commas, e.g. 'top_p' or 'top_k,top_p,sample', got {names!r}"
        )
    return parts


def decoder(names: str | Sequence[str], **options: Any) -> Decoder:
    """Build a decoder: the processors and the (at most one) search named, with their options.

    ``names``: one name (``"top_p"``), several separated by commas (``"temperature,top_k"``)
    or a list; each is looked up in ``minitensor.plugins.decoders()``, so a registered
    plugin is named like a built-in. The processors run in the order given. Without a
    search the chain ends in ``sample`` when it has a processor and is ``greedy`` when it
    has none; two searches are an error, as is a name given twice.

    ``options`` go to the one piece whose constructor names the option (``p=0.9`` to
    ``top_p``); when two pieces take it, write ``name.option`` (``decoder("top_p,min_p",
    **{"top_p.p": 0.9, "min_p.p": 0.05})``, ``--decoder-opt top_p.p=0.9``). An option no
    piece takes is a TypeError naming the pieces and what each takes; a piece's own checks
    (a ValueError for a bad value) come from its constructor.
    """
    from .. import plugins  # on first use: the plugin machinery loads lazily

    parts = _split_names(names)
    twice = sorted({n for n in parts if parts.count(n) > 1})
    if twice:
        raise ValueError(f"decoder {','.join(parts)!r}: {', '.join(twice)} named twice; name each piece once")
    classes = {name: plugins.lookup("decoder", name) for name in parts}
    for name, cls in classes.items():
        if getattr(cls, "kind", None) not in (PROCESSOR, SEARCH):
            raise TypeError(
                f"decoder {name!r} ({cls.__module__}.{cls.__qualname__}): its class attribute kind must be "
                f"'processor' or 'search', got {getattr(cls, 'kind', None)!r}"
            )
    searches = [n for n in parts if classes[n].kind == SEARCH]
    if len(searches) > 1:
        raise ValueError(
            f"decoder {','.join(parts)!r}: two searches ({', '.join(searches)}); a decoder has at most one, "
            "after its processors"
        )
    if not searches:  # the contract's default: sample when something reshaped the scores
        default = "sample" if _has_processor(classes) else "greedy"
        classes[default] = plugins.lookup("decoder", default)
        parts.append(default)
    given: dict[str, dict[str, Any]] = {name: {} for name in parts}
    accepted = {name: _accepted(cls) for name, cls in classes.items()}
    for key, value in options.items():
        name, dot, option = key.rpartition(".")
        if dot:
            if name not in given:
                raise TypeError(f"decoder option {key!r}: {name!r} is not in the decoder {','.join(parts)!r}")
            if option not in accepted[name]:
                raise TypeError(f"decoder option {key!r}: {name} {_takes(accepted[name])}")
            given[name][option] = value
            continue
        takers = [n for n in parts if key in accepted[n]]
        if not takers:
            pieces = "; ".join(f"{n} {_takes(accepted[n])}" for n in parts)
            raise TypeError(f"decoder {','.join(parts)!r}: no piece takes the option {key!r} ({pieces})")
        if len(takers) > 1:
            raise TypeError(
                f"decoder {','.join(parts)!r}: the option {key!r} is taken by {' and '.join(takers)}; "
                f"say which: {' or '.join(f'{n}.{key}=...' for n in takers)}"
            )
        given[takers[0]][key] = value
    built = [(name, classes[name](**given[name])) for name in parts]
    processors = [(n, p) for n, p in built if classes[n].kind == PROCESSOR]
    search = next((n, p) for n, p in built if classes[n].kind == SEARCH)
    return Decoder(processors, search)


def _has_processor(classes: dict[str, type]) -> bool:
    return any(getattr(cls, "kind", None) == PROCESSOR for cls in classes.values())


def _takes(options: list[str]) -> str:
    return f"takes {', '.join(options)}" if options else "takes no options"
