"""Tests for ``mt.optim``: SGD and Adam against their update rules written out in NumPy,
state saving and loading, hyper-parameter checks, a "strict" device, and a tiny training run.

The NumPy references below are the textbook formulas, written independently of the code
under test; gradients are set by hand so only the optimiser is being tested.
"""

import inspect
import json
import math

import numpy as np
import pytest
from strict_backend import StrictArray

import minitensor as mt
from minitensor import nn


def make_params(seed=0, shapes=((3, 2), (2,)), dtype=np.float64, device="cpu"):
    rng = np.random.default_rng(seed)
    return [nn.Parameter(mt.tensor(rng.standard_normal(s).astype(dtype), device=device)) for s in shapes]


def gradient_sequence(params, steps, seed=1):
    """steps x [one fixed gradient array per parameter]."""
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(p.shape).astype(p.dtype) for p in params] for _ in range(steps)]


def run(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = mt.tensor(g, device=p.device)
        opt.step()
    return [p.numpy() for p in params]


# -- the update rules, written out -------------------------------------------------------------


def sgd_reference(w, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    """w <- w - lr d;  g' = g + wd w;  b1 = g',  b <- mu b + (1 - dampening) g';
    d = b, or g' + mu b with Nesterov; without momentum d = g'."""
    w, b = w.copy(), None
    for g in grads:
        g = g + weight_decay * w
        if momentum:
            b = g.copy() if b is None else momentum * b + (1 - dampening) * g
            d = g + momentum * b if nesterov else b
        else:
            d = g
        w = w - lr * d
    return w


def adam_reference(w, grads, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """m, v running means of g and g^2; w <- w - lr/(1 - beta1^t) * m / (sqrt(v)/sqrt(1 - beta2^t) + eps)."""
    w, m, v = w.copy(), np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g + weight_decay * w
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g**2
        w = w - lr / (1 - beta1**t) * m / (np.sqrt(v) / np.sqrt(1 - beta2**t) + eps)
    return w


SGD_SETTINGS = [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.8, dampening=0.3),
    dict(lr=0.1, momentum=0.9, nesterov=True),
    dict(lr=0.1, weight_decay=0.01),
    dict(lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True),
]


@pytest.mark.parametrize("settings", SGD_SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_sgd_three_steps_match_the_update_rule(settings, device):
    params = make_params(device=device)
    start = [p.numpy() for p in params]
    grads = gradient_sequence(params, 3)
    got = run(mt.optim.SGD(params, **settings), params, grads)
    for i, w in enumerate(start):
        expected = sgd_reference(w, [step[i] for step in grads], **settings)
        np.testing.assert_allclose(got[i], expected, rtol=1e-12, atol=1e-14)


def test_sgd_momentum_by_hand():
    # w0 = 1, g = 1 every step, lr = 0.1, momentum 0.9:
    # b1 = 1     w1 = 1 - 0.1         = 0.9
    # b2 = 1.9   w2 = 0.9 - 0.19      = 0.71
    # b3 = 2.71  w3 = 0.71 - 0.271    = 0.439
    w = nn.Parameter(mt.tensor([1.0], dtype=mt.float64))
    got = run(mt.optim.SGD([w], lr=0.1, momentum=0.9), [w], [[np.ones(1)]] * 3)
    np.testing.assert_allclose(got[0], [0.439], rtol=1e-12)
    # Nesterov: d = g + 0.9 b -> d1 = 1.9, d2 = 2.71, d3 = 3.439; w3 = 1 - 0.1 * 8.049 = 0.1951
    w = nn.Parameter(mt.tensor([1.0], dtype=mt.float64))
    got = run(mt.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True), [w], [[np.ones(1)]] * 3)
    np.testing.assert_allclose(got[0], [0.1951], rtol=1e-12)


ADAM_SETTINGS = [dict(), dict(lr=0.01, weight_decay=0.1), dict(lr=0.1, betas=(0.5, 0.9), eps=1e-3)]


@pytest.mark.parametrize("settings", ADAM_SETTINGS)
def test_adam_three_steps_match_the_update_rule(settings, device):
    params = make_params(device=device)
    start = [p.numpy() for p in params]
    grads = gradient_sequence(params, 3)
    got = run(mt.optim.Adam(params, **settings), params, grads)
    ref = dict(settings)
    if "betas" in ref:
        ref["beta1"], ref["beta2"] = ref.pop("betas")
    for i, w in enumerate(start):
        expected = adam_reference(w, [step[i] for step in grads], **ref)
        np.testing.assert_allclose(got[i], expected, rtol=1e-12, atol=1e-14)


def test_adam_first_step_moves_each_coordinate_by_lr():
    # Bias correction: m_hat = g and v_hat = g^2 at t = 1, so the step is lr * g / |g|.
    w = nn.Parameter(mt.tensor([1.0, 2.0, -3.0], dtype=mt.float64))
    got = run(mt.optim.Adam([w], lr=0.5, eps=0.0), [w], [[np.array([1e-4, -20.0, 3.0])]])
    np.testing.assert_allclose(got[0], [0.5, 2.5, -3.5], rtol=1e-12)


def test_float32_parameters_stay_float32():
    params = make_params(dtype=np.float32)
    for opt in (mt.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.1), mt.optim.Adam(params, weight_decay=0.1)):
        run(opt, params, gradient_sequence(params, 2))
        assert all(p.dtype == mt.float32 for p in params)
        assert all(a.dtype == np.float32 for s in opt.state.values() for a in s.values() if isinstance(a, np.ndarray))


# -- bookkeeping -------------------------------------------------------------------------------


def test_parameters_without_gradient_are_skipped():
    a, b = make_params()
    before = b.numpy()
    opt = mt.optim.Adam([a, b], lr=0.1)
    a.grad = mt.ones_like(a)
    opt.step()
    np.testing.assert_array_equal(b.numpy(), before)
    assert b not in opt.state and opt.state[a]["step"] == 1


def test_zero_grad():
    net = nn.Linear(3, 2)
    opt = mt.optim.SGD(net.parameters(), lr=0.1)
    net(mt.randn(4, 3)).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.numpy() == 0) for p in net.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    w = nn.Parameter(mt.ones(3))
    w.sum().backward()  # the gradient of a sum may be a read-only broadcast of ones
    mt.optim.SGD([w], lr=0.1).zero_grad(set_to_none=False)
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros(3))


def test_param_groups_take_their_own_settings():
    a, b = make_params()
    opt = mt.optim.SGD([{"params": [a]}, {"params": b, "lr": 1.0}], lr=0.1, momentum=0.5)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 1.0]
    assert opt.param_groups[1]["momentum"] == 0.5 and opt.param_groups[1]["params"][0] is b
    start = [a.numpy(), b.numpy()]
    got = run(opt, [a, b], [[np.ones(a.shape), np.ones(b.shape)]])
    np.testing.assert_allclose(got[0], start[0] - 0.1)
    np.testing.assert_allclose(got[1], start[1] - 1.0)
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    opt.add_param_group({"params": make_params(seed=3)[:1], "lr": 0.01})
    assert opt.param_groups[2]["momentum"] == 0.5
    # The same parameter listed twice is updated once.
    w = nn.Parameter(mt.tensor([0.0], dtype=mt.float64))
    np.testing.assert_allclose(run(mt.optim.SGD([w, w], lr=1.0), [w], [[np.ones(1)]])[0], [-1.0])


def test_bad_parameters_and_hyperparameters_are_refused():
    (p, _) = make_params()
    with pytest.raises(ValueError, match="empty parameter list"):
        mt.optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        mt.optim.SGD([p * 2], lr=0.1)
    with pytest.raises(TypeError, match="Tensors"):
        mt.optim.SGD([np.zeros(3)], lr=0.1)
    bad = [
        (mt.optim.SGD, dict(lr=-0.1), "lr must be >= 0"),
        (mt.optim.SGD, dict(lr=0.1, momentum=-0.5), "momentum"),
        (mt.optim.SGD, dict(lr=0.1, weight_decay=-1), "weight_decay"),
        (mt.optim.SGD, dict(lr=0.1, nesterov=True), "nesterov"),
        (mt.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "nesterov"),
        (mt.optim.Adam, dict(lr=-1e-3), "lr must be >= 0"),
        (mt.optim.Adam, dict(betas=(0.9, 1.0)), "betas"),
        (mt.optim.Adam, dict(betas=(-0.1, 0.999)), "betas"),
        (mt.optim.Adam, dict(eps=-1.0), "eps"),
        (mt.optim.Adam, dict(weight_decay=-0.1), "weight_decay"),
    ]
    for cls, kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            cls([p], **kwargs)
    with pytest.raises(ValueError, match="lr"):
        mt.optim.SGD([{"params": [p], "lr": -1.0}], lr=0.1)


def test_hyperparameters_of_the_wrong_type_are_a_type_error_naming_them():
    # never Python's own "'<' not supported between instances of 'str' and 'int'"
    (p, _) = make_params()
    bad = [
        (mt.optim.SGD, dict(lr="0.1"), r"SGD: lr must be a number, got '0.1' \(str\)"),
        (mt.optim.SGD, dict(lr=None), r"SGD: lr must be a number, got None \(NoneType\)"),
        (mt.optim.SGD, dict(lr=0.1, momentum="0.9"), "SGD: momentum must be a number"),
        (mt.optim.SGD, dict(lr=0.1, dampening=None), "SGD: dampening must be a number"),
        (mt.optim.SGD, dict(lr=0.1, weight_decay=[0.1]), "SGD: weight_decay must be a number"),
        (mt.optim.Adam, dict(lr="1e-3"), "Adam: lr must be a number"),
        (mt.optim.Adam, dict(betas=0.9), r"Adam: betas must be a pair of numbers in \[0, 1\), got 0.9"),
        (mt.optim.Adam, dict(betas=("0.9", 0.999)), "Adam: betas must be a number, got '0.9'"),
        (mt.optim.Adam, dict(eps=None), "Adam: eps must be a number"),
        (mt.optim.AdamW, dict(weight_decay="0.01"), "AdamW: weight_decay must be a number"),
    ]
    for cls, kwargs, message in bad:
        with pytest.raises(TypeError, match=message):
            cls([p], **kwargs)
    with pytest.raises(TypeError, match="SGD: lr must be a number"):
        mt.optim.SGD([{"params": [p], "lr": "0.1"}], lr=0.1)
    with pytest.raises(ValueError, match="SGD: lr must be >= 0, got nan"):
        mt.optim.SGD([p], lr=float("nan"))
    with pytest.raises(ValueError, match=r"Adam: a Tensor lr must hold one floating-point number, got shape \(2,\)"):
        mt.optim.Adam([p], lr=mt.tensor([0.1, 0.2]))
    with pytest.raises(ValueError, match="SGD: lr must be >= 0"):
        mt.optim.SGD([p], lr=mt.tensor(-0.1))
    mt.optim.Adam([p], betas=[0.8, 0.9])  # a list of two, as after a JSON round trip: accepted


TENSOR_LR_OPTIMISERS = {
    "sgd": lambda ps, lr: mt.optim.SGD(ps, lr=lr),
    "sgd_momentum": lambda ps, lr: mt.optim.SGD(ps, lr=lr, momentum=0.9, weight_decay=0.1, nesterov=True),
    "adam": lambda ps, lr: mt.optim.Adam(ps, lr=lr, weight_decay=0.1),
    "adam_unfused": lambda ps, lr: mt.optim.Adam(ps, lr=lr, weight_decay=0.1, fused=False),
    "adamw": lambda ps, lr: mt.optim.AdamW(ps, lr=lr, weight_decay=0.1),
    "adamw_unfused": lambda ps, lr: mt.optim.AdamW(ps, lr=lr, weight_decay=0.1, fused=False),
}


@pytest.mark.parametrize("name", sorted(TENSOR_LR_OPTIMISERS))
def test_a_tensor_lr_steps_as_its_number_and_is_read_at_every_step(name):
    # PyTorch accepts a one-element tensor lr; SGD used to fail at step() ("does not support ufuncs")
    make = TENSOR_LR_OPTIMISERS[name]
    params, expected_params = make_params(), make_params()
    grads = gradient_sequence(params, 4)
    lr = mt.tensor(0.05, dtype=mt.float64)
    opt, expected_opt = make(params, lr), make(expected_params, 0.05)
    run(opt, params, grads[:2])
    run(expected_opt, expected_params, grads[:2])
    with mt.no_grad():
        lr.mul_(0.5)  # changed in place: the next steps use 0.025
    expected_opt.param_groups[0]["lr"] = 0.025
    for a, b in zip(run(opt, params, grads[2:]), run(expected_opt, expected_params, grads[2:])):
        np.testing.assert_array_equal(a, b)
    assert opt.param_groups[0]["lr"] is lr  # kept as given


def test_mixing_parameters_and_groups_is_a_type_error_naming_the_optimiser():
    p, q = make_params()
    for params in ([{"params": [p]}, q], [p, {"params": [q]}]):
        with pytest.raises(TypeError, match="SGD: param groups must be dicts: the list mixes"):
            mt.optim.SGD(params, lr=0.1)
    with pytest.raises(TypeError, match=r"Adam: a parameter group must be a dict \{'params': \[...\], ...\}, got list"):
        mt.optim.Adam([p]).add_param_group([q])
    with pytest.raises(ValueError, match=r"SGD: a parameter group needs a 'params' entry, got one with \['lr'\]"):
        mt.optim.SGD([{"lr": 0.1}], lr=0.1)


def stepped(opt, params, steps=2):
    run(opt, params, gradient_sequence(params, steps))
    return opt


def test_load_state_dict_refuses_another_optimisers_state_and_changes_nothing():
    params = make_params()
    sgd_state = stepped(mt.optim.SGD(params, lr=0.1, momentum=0.9), params).state_dict()
    adam_state = stepped(mt.optim.Adam(params), params).state_dict()

    adam = stepped(mt.optim.Adam(params, lr=0.01), params)
    before = adam.state_dict()
    with pytest.raises(
        ValueError, match=r"Adam.load_state_dict: parameter group 0 of the state has no \['betas', 'eps'\].*SGD's"
    ):
        adam.load_state_dict(sgd_state)
    # the settings made to fit, the per-parameter state still is SGD's (it used to fail at step(): KeyError 'step')
    disguised = json.loads(json.dumps(sgd_state, default=lambda a: a.tolist()))
    for group in disguised["param_groups"]:
        group.update(betas=[0.9, 0.999], eps=1e-8)
    with pytest.raises(
        ValueError,
        match=r"Adam.load_state_dict: the state of parameter 0 has \['momentum_buffer'\], SGD's, "
        r"where this Adam keeps \['exp_avg', 'exp_avg_sq', 'step'\]",
    ):
        adam.load_state_dict(disguised)
    after = adam.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for i in before["state"]:
        for key, value in before["state"][i].items():
            np.testing.assert_array_equal(after["state"][i][key], value)
    stepped(adam, params)  # still works

    sgd = mt.optim.SGD(params, lr=0.1, momentum=0.9)
    with pytest.raises(
        ValueError,
        match=r"SGD.load_state_dict: parameter group 0 of the state has no "
        r"\['dampening', 'momentum', 'nesterov'\].*Adam or AdamW's",
    ):
        sgd.load_state_dict(adam_state)
    mt.optim.AdamW(params).load_state_dict(adam_state)  # Adam and AdamW keep the same state: accepted, as in PyTorch


def set_grad_bypassing_its_checks(p, grad):
    """Give ``p`` a gradient without ``grad``'s setter (which may refuse a wrong one): an optimiser must
    defend itself against a gradient set around it."""
    if isinstance(inspect.getattr_static(type(p), "grad"), property):
        object.__setattr__(p, "_grad", grad)  # the setter's storage
    else:
        object.__setattr__(p, "grad", grad)  # a plain slot
    assert p.grad is grad


@pytest.mark.parametrize("name", sorted(TENSOR_LR_OPTIMISERS))
def test_a_gradient_that_does_not_fit_its_parameter_is_refused_before_any_update(name):
    # the fused Adam kernel used to read past the end of a smaller gradient; SGD failed halfway with
    # NumPy's broadcast error. Now: a clear error, and no parameter or state changed.
    make = TENSOR_LR_OPTIMISERS[name]
    params = make_params(dtype=np.float32)  # shapes (3, 2) and (2,)
    opt = make(params, 0.1)
    run(opt, params, gradient_sequence(params, 1))
    before = [p.numpy().copy() for p in params]
    state_before = {k: (dict(v) if isinstance(v, dict) else v) for k, v in opt.state_dict()["state"].items()}
    optimiser = type(opt).__name__
    for grad, error, message in [
        (mt.tensor(5.0), mt.ShapeError, rf"{optimiser}.step: a parameter of shape \(2,\) has a gradient of shape \(\)"),
        (mt.ones(3), mt.ShapeError, rf"{optimiser}.step: a parameter of shape \(2,\) has a gradient of shape \(3,\)"),
        (
            mt.ones(2, dtype=mt.float64),
            mt.DTypeError,
            rf"{optimiser}.step: .* dtype float32 has a gradient of dtype float64",
        ),
        (np.ones(2, dtype=np.float32), TypeError, rf"{optimiser}.step: .* not a Tensor but a ndarray"),
    ]:
        params[0].grad = mt.ones(3, 2)  # a good one first: not updated either
        set_grad_bypassing_its_checks(params[1], grad)
        with pytest.raises(error, match=message):
            opt.step()
        for p, b in zip(params, before):
            np.testing.assert_array_equal(p.numpy(), b)
        state = opt.state_dict()["state"]
        assert state.keys() == state_before.keys()
        for i in state:
            for key, value in state_before[i].items():
                np.testing.assert_array_equal(state[i][key], value)


def test_a_gradient_on_another_device_is_refused():
    (p,) = make_params(shapes=((2,),), device="strict")
    opt = mt.optim.Adam([p], lr=0.1)
    set_grad_bypassing_its_checks(p, mt.ones(2, dtype=mt.float64))  # on the CPU
    with pytest.raises(
        mt.DeviceError, match=r"Adam.step: a parameter of shape \(2,\) on 'strict' has its gradient on 'cpu'"
    ):
        opt.step()


def test_step_with_closure_returns_the_loss():
    w = nn.Parameter(mt.tensor([3.0], dtype=mt.float64))
    opt = mt.optim.SGD([w], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == 9.0
    np.testing.assert_allclose(w.numpy(), [3.0 - 0.25 * 6.0])


# -- state_dict --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: mt.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
        lambda ps: mt.optim.Adam(ps, lr=0.01, weight_decay=0.01),
    ],
    ids=["sgd", "adam"],
)
def test_state_dict_round_trip_continues_identically(make):
    params = make_params()
    grads = gradient_sequence(params, 6)
    opt = make(params)
    run(opt, params, grads[:3])
    saved = opt.state_dict()
    snapshot = [p.numpy() for p in params]
    assert all(isinstance(v, (np.ndarray, int)) for s in saved["state"].values() for v in s.values())
    expected = run(opt, params, grads[3:])
    assert not np.array_equal(expected[0], snapshot[0])

    # A checkpoint format without pickle: JSON with lists (string keys, lists for tuples).
    def plain(x):
        return x.tolist() if isinstance(x, np.ndarray) else x

    as_json = json.loads(
        json.dumps(
            {
                "state": {k: {n: plain(v) for n, v in s.items()} for k, s in saved["state"].items()},
                "param_groups": saved["param_groups"],
            }
        )
    )
    for state_dict in (saved, as_json):
        fresh = [nn.Parameter(mt.tensor(w)) for w in snapshot]
        other = make(fresh)
        other.load_state_dict(state_dict)
        got = run(other, fresh, grads[3:])
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)
        assert other.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
        if "betas" in other.param_groups[0]:
            assert isinstance(other.param_groups[0]["betas"], tuple)


def test_state_dict_is_a_snapshot():
    params = make_params()
    opt = mt.optim.SGD(params, lr=0.1, momentum=0.9)
    run(opt, params, gradient_sequence(params, 1))
    saved = opt.state_dict()
    buffer = saved["state"][0]["momentum_buffer"].copy()
    run(opt, params, gradient_sequence(params, 1, seed=5))
    np.testing.assert_array_equal(saved["state"][0]["momentum_buffer"], buffer)
    assert saved["param_groups"][0]["params"] == [0, 1]


def test_load_state_dict_refuses_a_mismatch_and_changes_nothing():
    params = make_params()
    opt = mt.optim.Adam(params, lr=0.01)
    run(opt, params, gradient_sequence(params, 2))
    good = opt.state_dict()
    other = mt.optim.Adam(make_params(shapes=((2, 3), (2,))), lr=0.5)
    run(other, other.param_groups[0]["params"], gradient_sequence(other.param_groups[0]["params"], 1))
    before = other.state_dict()
    with pytest.raises(ValueError, match=r"state\[0\]\['exp_avg'\] has shape \(3, 2\).*\(2, 3\)"):
        other.load_state_dict(good)
    after = other.state_dict()
    assert after["param_groups"] == before["param_groups"] and after["param_groups"][0]["lr"] == 0.5
    np.testing.assert_array_equal(after["state"][0]["exp_avg"], before["state"][0]["exp_avg"])
    with pytest.raises(ValueError, match="group 0 has 2 parameter"):
        mt.optim.Adam(make_params()[:1]).load_state_dict(good)
    with pytest.raises(ValueError, match="2 parameter group"):
        mt.optim.Adam(make_params()).load_state_dict({"state": {}, "param_groups": good["param_groups"] * 2})


@pytest.mark.parametrize(
    "wrong, said",
    [
        ({"weight": 0}, r"a dict of 'state' and 'param_groups', got keys \['weight'\]"),  # a model's state_dict
        ([0], "a dict of 'state' and 'param_groups', got list"),
        ({"state": [], "param_groups": []}, "its 'state' a dict, got list"),
        ({"state": {}, "param_groups": [{"lr": 0.1}]}, "its 'param_groups' a list of dicts, each with its 'params'"),
    ],
)
def test_load_state_dict_names_what_is_not_an_optimisers_state(wrong, said):
    opt = mt.optim.Adam(make_params(), lr=0.01)
    with pytest.raises(
        ValueError, match=r"Adam.load_state_dict: expected what an optimiser's state_dict\(\) returns: "
    ):
        opt.load_state_dict(wrong)
    with pytest.raises(ValueError, match=said):
        opt.load_state_dict(wrong)


# -- against PyTorch (optional) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,settings",
    [
        ("SGD", dict(lr=0.1)),
        ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.05)),
        ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
        ("Adam", dict(lr=0.01)),
        ("Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ],
)
def test_matches_torch_optim(name, settings):
    torch = pytest.importorskip("torch")
    params = make_params()
    grads = gradient_sequence(params, 5)
    theirs = [torch.tensor(p.numpy(), requires_grad=True) for p in params]
    torch_opt = getattr(torch.optim, name)(theirs, **settings)
    for step in grads:
        for t, g in zip(theirs, step):
            t.grad = torch.tensor(g)
        torch_opt.step()
    ours = run(getattr(mt.optim, name)(params, **settings), params, grads)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t.detach().numpy(), rtol=1e-10, atol=1e-12)


# -- on the "strict" device (tests/strict_backend.py, registered by conftest.py) ---------------------
# Its arrays refuse NumPy as CuPy's do: optimiser state and updates must stay on the device.


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: mt.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True),
        lambda ps: mt.optim.Adam(ps, lr=0.01, weight_decay=0.1),
    ],
    ids=["sgd", "adam"],
)
def test_model_and_optimiser_on_a_strict_device(make):
    strict_device = "strict"
    mt.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    device_model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    device_model.load_state_dict(cpu_model.state_dict())
    params = list(device_model.parameters())
    device_model.to(strict_device)
    assert all(a is b for a, b in zip(params, device_model.parameters()))  # identity kept
    assert all(p.device == "strict" and isinstance(p.data, StrictArray) for p in params)

    x = np.random.default_rng(2).standard_normal((8, 3))
    y = np.random.default_rng(3).standard_normal((8, 1))
    results = []
    for model, device in ((cpu_model, "cpu"), (device_model, strict_device)):
        opt = make(model.parameters())
        X, Y = mt.tensor(x, device=device), mt.tensor(y, device=device)
        for _ in range(3):
            opt.zero_grad()
            diff = model(X) - Y
            (diff * diff).mean().backward()
            opt.step()
        results.append([p.numpy() for p in model.parameters()])
        if device == strict_device:
            arrays = [v for s in opt.state.values() for v in s.values() if not isinstance(v, int)]
            assert arrays and all(isinstance(v, StrictArray) for v in arrays)  # state lives on the device
            saved = opt.state_dict()
            assert all(isinstance(v, np.ndarray) for v in saved["state"][0].values() if not isinstance(v, int))
            opt.load_state_dict(saved)  # host arrays go back to the device
            assert all(isinstance(v, StrictArray) for v in opt.state[params[0]].values() if not isinstance(v, int))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    device_model.load_state_dict(cpu_model.state_dict())  # CPU tensors into a device model
    assert isinstance(params[0].data, StrictArray)
    # Layers can also be built on the device directly (init draws from the device's generator).
    layers = [
        nn.Linear(3, 2, device=strict_device),
        nn.Embedding(5, 2, padding_idx=0, device=strict_device),
        nn.LayerNorm(2, device=strict_device),
    ]
    assert all(isinstance(p.data, StrictArray) for layer in layers for p in layer.parameters())
    looked_up = layers[1](mt.tensor([[0, 3]], device=strict_device))
    assert looked_up.device == strict_device and np.all(looked_up.numpy()[0, 0] == 0)
    out = layers[2](layers[0](mt.randn(4, 3, device=strict_device)))
    assert out.device == strict_device and out.shape == (4, 2)
    device_model.to("cpu")
    assert params[0].device == "cpu"


# -- end to end --------------------------------------------------------------------------------


def test_a_small_mlp_learns_xor_with_adam():
    mt.manual_seed(0)
    X = mt.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    y = mt.tensor([0, 1, 1, 0])
    net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = mt.optim.Adam(net.parameters(), lr=0.05)
    first = None
    for _ in range(100):
        loss = mt.cross_entropy(net(X), y)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 0.5 and loss.item() < 0.01
    assert net(X).argmax(axis=-1).tolist() == [0, 1, 1, 0]
    assert math.isfinite(loss.item())
