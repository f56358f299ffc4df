"""The command line and the demo it runs (the README's first command)."""

import subprocess
import sys

import minitensor as mt
from minitensor import cli, demo


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
