"""The command line and the demo it runs (the README's first command)."""

import argparse
import dataclasses
import os
import subprocess
import sys

import minitensor as mt
from minitensor import cli, demo
from minitensor.train.config import TrainConfig, flag_of


def test_python_dash_m_prints_version_and_devices():
    out = subprocess.run([sys.executable, "-m", "minitensor"], capture_output=True, text=True, check=True).stdout
    assert f"minitensor {mt.__version__}" in out
    assert "cpu" in out


def test_demo_learns_the_spirals(capsys):
    assert cli.main(["demo", "--epochs", "20", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "epoch  20" in out
    held_out = float(out.strip().splitlines()[-1].split("held-out accuracy")[1].strip().rstrip("%"))
    assert held_out >= 90.0  # a linear model is stuck near 33%


def test_demo_is_reproducible_with_a_seed():
    logs = []
    for _ in range(2):
        lines = []
        demo.train(epochs=3, seed=7, log=lambda s, lines=lines: lines.append(s.split("(")[0]))
        logs.append(lines)
    assert logs[0] == logs[1]


def test_spirals_are_not_linearly_separable():
    """The demo's premise: the best linear classifier is far from perfect on this data."""
    mt.manual_seed(0)
    X, y = demo.make_spirals()
    model = mt.nn.Linear(2, 3)
    opt = mt.optim.Adam(model.parameters(), lr=0.05)
    Xt, yt = mt.tensor(X), mt.tensor(y)
    for _ in range(300):
        loss = mt.cross_entropy(model(Xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert demo.accuracy(model, Xt, yt) < 0.7


# -- `minitensor train` and TrainConfig cannot drift apart -------------------------------------------
def _train_parser():
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subcommands.choices["train"]


def _a_value_for(action, default):
    """Command-line words for ``action`` that give a value other than the field's default."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return [action.option_strings[0] if default is False else action.option_strings[1]], (default is False)
    if action.choices:
        choice = next(c for c in reversed(action.choices) if c != default)
        return [action.option_strings[0], choice], choice
    if action.type is cli._betas:  # --betas B1,B2: a pair
        return [action.option_strings[0], "0.5,0.75"], [0.5, 0.75]
    value = {int: 3, float: 0.25}.get(action.type, "x")
    assert value != default
    return [action.option_strings[0], str(value)], value


def test_every_train_config_field_has_its_flag_or_is_listed_as_set_otherwise():
    """A field of TrainConfig is set by `minitensor train --its-name` or named in
    cli._NOT_SET_BY_OWN_FLAG: a new field with neither fails here, not silently in use."""
    actions = {a.dest: a for a in _train_parser()._actions}
    option_strings = {s for a in actions.values() for s in a.option_strings}
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(cli._NOT_SET_BY_OWN_FLAG) <= fields  # no stale entries
    assert set(cli._OWN_FLAG_FIELDS) == fields - set(cli._NOT_SET_BY_OWN_FLAG)
    for name in cli._OWN_FLAG_FIELDS:
        assert name in actions, f"TrainConfig.{name} has no `minitensor train` flag and is not in _NOT_SET_BY_OWN_FLAG"
        assert flag_of(name) in actions[name].option_strings  # error messages name the real flag
    for name, how in cli._NOT_SET_BY_OWN_FLAG.items():
        if how is not None:  # set by another flag: the one the error messages name exists
            assert flag_of(name) in option_strings, name
    # and the other way round: every flag of `minitensor train` sets a field, or runs the command
    # (--oversubscribe only lets --workers start more processes: the model and run are the same;
    # --preset NAME sets many fields at once, each of which has its own flag; --lang is the language
    # of the figures' labels, not a setting of the run)
    setting_dests = {flag_of(name).removeprefix("--").replace("-", "_") for name in fields}
    expected = {"help", "plugin", "debug", "resume", "overwrite", "oversubscribe", "preset", "lang"}
    assert set(actions) - setting_dests == expected


def test_each_flag_of_a_field_sets_that_field_and_nothing_else():
    parser, actions = cli.build_parser(), {a.dest: a for a in _train_parser()._actions}
    defaults = TrainConfig()
    assert cli.explicit_settings(parser.parse_args(["train"])) == {}
    for name in cli._OWN_FLAG_FIELDS:
        words, value = _a_value_for(actions[name], getattr(defaults, name))
        given = cli.explicit_settings(parser.parse_args(["train", *words]))
        if name in ("data", "text"):  # made absolute; --text also picks the language model
            value = os.path.abspath(value)
            given.pop("model", None)
        assert given == {name: value}, words


def test_the_flags_set_otherwise_set_their_fields():
    parser = cli.build_parser()
    args = parser.parse_args(
        ["train", "--no-progress", "--out", "somewhere", "--scorer-opt", "a=1", "--pooling-opt", "b=x"]
        + ["--positional-opt", "c=0.5"]
    )
    config = cli.config_from_args(args)
    assert config.progress is False and config.out == "somewhere"
    assert config.scorer_options == {"a": 1} and config.pooling_options == {"b": "x"}
    assert config.positional_options == {"c": 0.5}
    assert config.eval_batch_size == TrainConfig().eval_batch_size  # no flag


def test_train_help_takes_its_defaults_from_the_config():
    """--help shows each default as TrainConfig holds it, and the character LM's where its recipe
    differs: the numbers live in one place (train/config.py), never restated by hand."""
    import re

    from minitensor.train.config import LM_RECIPE, TrainConfig

    parser = cli.build_parser()
    train = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    helps = {a.dest: a.help or "" for a in train._actions}
    for field in dataclasses.fields(TrainConfig):
        default = field.default
        if field.name not in helps or field.name in cli._DERIVED_DEFAULTS or isinstance(default, bool):
            continue
        if default is not None and default is not dataclasses.MISSING:
            assert f"default {default}" in helps[field.name], (field.name, helps[field.name])
        if field.name in LM_RECIPE and LM_RECIPE[field.name] != default:
            assert f"{LM_RECIPE[field.name]} for --text" in helps[field.name], (field.name, helps[field.name])
    assert helps["lr"] == "peak learning rate; default 0.01; 0.005 for --text (the character LM)"
    for dest, text in helps.items():  # no number restated by hand beside the generated one
        assert text.count("default") <= 2 and not re.search(r"\(default \d", text), (dest, text)


def test_the_guide_lists_the_flags_a_resumed_run_may_change():
    """docs/guide.md names the flags --resume lets change: exactly TrainConfig's resumable fields,
    in their order, as `train --help` and the refusal list them (cli._resumable_flags)."""
    import re
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text(encoding="utf-8")
    sentence = " ".join(guide.split("Only `--fused`", 1)[1].split("may change", 1)[0].split())
    listed = ["--fused"] + re.findall(r"`(--[a-z-]+)`", sentence)
    assert listed == [flag_of(name) for name in TrainConfig.resumable_fields()]
    assert f"only {cli._resumable_flags()} may change" in " ".join(
        next(a.help for a in _train_parser()._actions if a.dest == "resume").split()
    )
