"""``minitensor demo``: train a small classifier with the engine and watch it learn.

The data are CS231n's three interleaved spirals, generated on the fly: points of class k lie
on the arm r -> (r sin t, r cos t) with t = 4 (k + r) + noise. No straight line separates
them, so a linear model is stuck near 1/3 accuracy while a two-layer MLP reaches ~99%:
a task small enough for seconds on a CPU, hard enough that learning is visible.
"""

import time

import numpy

import minitensor as mt
from minitensor import nn, optim


def make_spirals(points_per_class=200, num_classes=3, noise=0.2, rng=None):
    """Features (N, 2) float32 and labels (N,) int64 of ``num_classes`` spiral arms."""
    rng = rng if rng is not None else mt.random.host_rng()
    xs, ys = [], []
    for k in range(num_classes):
        r = numpy.linspace(0.0, 1.0, points_per_class)
        t = numpy.linspace(k * 4.0, (k + 1) * 4.0, points_per_class) + rng.standard_normal(points_per_class) * noise
        xs.append(numpy.stack([r * numpy.sin(t), r * numpy.cos(t)], axis=1))
        ys.append(numpy.full(points_per_class, k))
    return numpy.concatenate(xs).astype(numpy.float32), numpy.concatenate(ys).astype(numpy.int64)


def build_model(num_hiddens=64, num_classes=3):
    return nn.Sequential(
        nn.Linear(2, num_hiddens),
        nn.ReLU(),
        nn.Linear(num_hiddens, num_hiddens),
        nn.ReLU(),
        nn.Linear(num_hiddens, num_classes),
    )


def accuracy(model, X, y):
    with mt.no_grad():
        return float((model(X).argmax(axis=-1) == y).numpy().mean())


def train(epochs=30, batch_size=32, lr=1e-2, num_hiddens=64, seed=0, device="cpu", log=print):
    """Train the MLP on spirals with Adam; returns (model, final train accuracy, held-out accuracy)."""
    mt.manual_seed(seed)
    rng = mt.random.host_rng()
    features, labels = make_spirals(rng=rng)
    order = rng.permutation(len(labels))
    split = int(0.8 * len(labels))
    train_idx, test_idx = order[:split], order[split:]
    X_test = mt.tensor(features[test_idx], device=device)
    y_test = mt.tensor(labels[test_idx], device=device)

    model = build_model(num_hiddens).to(device)
    optimizer = optim.Adam(model.parameters(), lr=lr)
    log(
        f"minitensor demo: a {sum(p.numel() for p in model.parameters())}-parameter MLP learns three spirals "
        f"({split} training points, {len(test_idx)} held out), Adam lr={lr}, device={device}"
    )
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        model.train()
        rng.shuffle(train_idx)
        total, count = 0.0, 0
        for i in range(0, split, batch_size):
            idx = train_idx[i : i + batch_size]
            X, y = mt.tensor(features[idx], device=device), mt.tensor(labels[idx], device=device)
            loss = mt.cross_entropy(model(X), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
            count += len(idx)
        if epoch == 1 or epoch % 5 == 0 or epoch == epochs:
            model.eval()
            log(
                f"epoch {epoch:3d}  loss {total / count:.4f}  "
                f"held-out accuracy {accuracy(model, X_test, y_test):6.1%}  "
                f"({time.perf_counter() - start:.1f} s)"
            )
    model.eval()
    X_train = mt.tensor(features[train_idx], device=device)
    y_train = mt.tensor(labels[train_idx], device=device)
    return model, accuracy(model, X_train, y_train), accuracy(model, X_test, y_test)


def main(args):
    _, train_acc, test_acc = train(epochs=args.epochs, lr=args.lr, seed=args.seed, device=args.device)
    print(f"done: training accuracy {train_acc:.1%}, held-out accuracy {test_acc:.1%}")
    return 0
