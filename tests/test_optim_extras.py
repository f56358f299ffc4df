"""AdamW, the learning-rate schedules and gradient clipping: against their formulas written
out here (never with the code under test), state saving and loading, the "strict" device, and
(optionally) PyTorch's AdamW, LambdaLR and clip_grad_norm_."""

import json
import math

import numpy as np
import pytest
from helpers import array_type

import minitensor as mt
from minitensor import nn, optim


def make_params(device="cpu", seed=0, shapes=((3, 2), (2,))):
    rng = np.random.default_rng(seed)
    return [nn.Parameter(mt.tensor(rng.standard_normal(s), device=device)) for s in shapes]


def gradient_sequence(params, steps, seed=1):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(p.shape) for p in params] for _ in range(steps)]


def run(opt, params, grads):
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = mt.tensor(g, device=p.device)
        opt.step()
    return [p.numpy() for p in params]


# -- AdamW --------------------------------------------------------------------------------------
def adamw_reference(w, grads, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2):
    """w <- w (1 - lr wd); then Adam on the raw gradient:
    m, v running means of g, g^2; w <- w - lr m_hat / (sqrt(v_hat) + eps), hats = bias-corrected."""
    w, m, v = w.copy(), np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        w = w * (1 - lr * weight_decay)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g**2
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
    return w


ADAMW_SETTINGS = [
    dict(),
    dict(lr=0.1, weight_decay=0.1),
    dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.5),
    dict(lr=0.1, weight_decay=0.0),
]


def settings_id(settings):
    return ",".join(f"{k}={v}" for k, v in settings.items()) or "defaults"


@pytest.mark.parametrize("settings", ADAMW_SETTINGS, ids=settings_id)
def test_adamw_three_steps_match_the_update_rule(device, settings):
    params = make_params(device)
    start = [p.numpy() for p in params]
    grads = gradient_sequence(params, 3)
    got = run(optim.AdamW(params, **settings), params, grads)
    ref = dict(settings)
    beta1, beta2 = ref.pop("betas", (0.9, 0.999))
    for i, w in enumerate(got):
        expected = adamw_reference(start[i], [g[i] for g in grads], beta1=beta1, beta2=beta2, **ref)
        np.testing.assert_allclose(w, expected, rtol=1e-10, atol=1e-12)
    assert all(isinstance(p.data, array_type(device)) for p in params)


def test_adamw_decay_is_decoupled_from_adam_l2():
    params = make_params()
    start = [p.numpy() for p in params]
    grads = gradient_sequence(params, 3)
    decoupled = run(optim.AdamW(params, lr=0.1, weight_decay=0.5), params, grads)
    coupled_params = [nn.Parameter(mt.tensor(w)) for w in start]
    coupled = run(optim.Adam(coupled_params, lr=0.1, weight_decay=0.5), coupled_params, grads)
    assert not np.allclose(decoupled[0], coupled[0])  # Adam's L2 goes through m and v: different
    plain_params = [nn.Parameter(mt.tensor(w)) for w in start]
    no_decay = [nn.Parameter(mt.tensor(w)) for w in start]
    np.testing.assert_array_equal(
        run(optim.AdamW(plain_params, lr=0.1, weight_decay=0.0), plain_params, grads)[0],
        run(optim.Adam(no_decay, lr=0.1), no_decay, grads)[0],
    )
    opt = optim.AdamW(make_params())
    assert opt.param_groups[0]["weight_decay"] == 0.01  # PyTorch's default
    run(opt, opt.param_groups[0]["params"], gradient_sequence(opt.param_groups[0]["params"], 1))
    assert opt.param_groups[0]["weight_decay"] == 0.01  # the group keeps its setting


def test_adamw_state_round_trip_resumes_exactly():
    params = make_params()
    start = [p.numpy() for p in params]
    grads = gradient_sequence(params, 3)
    straight = run(optim.AdamW(params, lr=0.1, weight_decay=0.2), params, grads)

    first = [nn.Parameter(mt.tensor(w)) for w in start]
    opt = optim.AdamW(first, lr=0.1, weight_decay=0.2)
    run(opt, first, grads[:2])
    saved = opt.state_dict()  # through JSON, as a checkpoint would store it: arrays as lists
    saved["state"] = {k: {n: np.asarray(v).tolist() for n, v in s.items()} for k, s in saved["state"].items()}
    saved = json.loads(json.dumps(saved))
    resumed_params = [nn.Parameter(mt.tensor(p.numpy())) for p in first]
    resumed = optim.AdamW(resumed_params, lr=0.5)
    resumed.load_state_dict(saved)
    assert resumed.param_groups[0]["lr"] == 0.1 and resumed.param_groups[0]["weight_decay"] == 0.2
    out = run(resumed, resumed_params, grads[2:])
    for a, b in zip(out, straight):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_adamw_matches_pytorch():
    torch = pytest.importorskip("torch")
    params = make_params()
    start = [p.numpy() for p in params]
    grads = gradient_sequence(params, 3)
    got = run(optim.AdamW(params, lr=0.05, betas=(0.8, 0.95), weight_decay=0.3), params, grads)
    theirs = [torch.tensor(w, requires_grad=True) for w in start]
    opt = torch.optim.AdamW(theirs, lr=0.05, betas=(0.8, 0.95), weight_decay=0.3)
    for step_grads in grads:
        for p, g in zip(theirs, step_grads):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
    for ours, ref in zip(got, theirs):
        np.testing.assert_allclose(ours, ref.detach().numpy(), rtol=1e-10, atol=1e-12)


# -- learning-rate schedules ------------------------------------------------------------------------
def noam(t, d_model, warmup, factor=1.0):
    return factor * d_model**-0.5 * min(t**-0.5, t * warmup**-1.5)


def warmup_cosine(t, base, warmup, total, min_lr=0.0):
    if t <= warmup:
        return base * t / warmup
    if t >= total:
        return min_lr
    return min_lr + (base - min_lr) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup))) / 2


def two_groups(lr_a=0.1, lr_b=0.2):
    a, b = make_params()
    return optim.SGD([{"params": [a]}, {"params": [b], "lr": lr_b}], lr=lr_a)


def lrs_over(sched, steps):
    """The learning rate in force for optimiser steps 1 .. steps (the first set at construction)."""
    seen = []
    for _ in range(steps):
        seen.append([g["lr"] for g in sched.optimizer.param_groups])
        assert sched.get_last_lr() == seen[-1]
        sched.step()
    return np.array(seen)


def test_noam_follows_the_transformer_formula():
    sched = optim.NoamLR(two_groups(), d_model=16, warmup_steps=5, factor=2.0)
    assert sched.last_epoch == 0
    seen = lrs_over(sched, 12)
    expected = [noam(t, 16, 5, 2.0) for t in range(1, 13)]
    np.testing.assert_allclose(seen[:, 0], expected, rtol=1e-12)
    np.testing.assert_allclose(seen[:, 1], expected, rtol=1e-12)  # absolute: every group the same
    assert seen[0, 0] > 0  # the first step is not wasted at lr 0
    assert seen[:, 0].argmax() == 4  # the peak is at t = warmup_steps
    np.testing.assert_allclose(seen[4, 0], 2.0 / math.sqrt(16 * 5), rtol=1e-12)


def test_warmup_cosine_follows_its_formula_per_group():
    sched = optim.WarmupCosineLR(two_groups(0.1, 0.2), warmup_steps=4, total_steps=10, min_lr=0.01)
    seen = lrs_over(sched, 14)
    for col, base in enumerate((0.1, 0.2)):
        expected = [warmup_cosine(t, base, 4, 10, 0.01) for t in range(1, 15)]
        np.testing.assert_allclose(seen[:, col], expected, rtol=1e-12)
    np.testing.assert_allclose(seen[3], [0.1, 0.2])  # the peak at t = warmup_steps is each base lr
    np.testing.assert_allclose(seen[9:], 0.01)  # then held at min_lr
    no_warmup = optim.WarmupCosineLR(two_groups(), warmup_steps=0, total_steps=4)
    np.testing.assert_allclose(lrs_over(no_warmup, 5)[:, 0], [warmup_cosine(t, 0.1, 0, 4) for t in range(1, 6)])


def test_lambda_lr_counts_from_zero_as_in_pytorch():
    sched = optim.LambdaLR(two_groups(), [lambda e: 0.5**e, lambda e: e + 1])
    seen = lrs_over(sched, 4)
    np.testing.assert_allclose(seen[:, 0], [0.1 * 0.5**e for e in range(4)])
    np.testing.assert_allclose(seen[:, 1], [0.2 * (e + 1) for e in range(4)])
    with pytest.raises(ValueError, match="2 parameter groups"):
        optim.LambdaLR(two_groups(), [lambda e: 1.0])


def test_a_schedule_names_what_is_not_an_optimiser_a_function_or_a_learning_rate():
    """A rate of NaN or below 0 would have been set, and Adam would have made every weight NaN
    (or stepped uphill); nothing changes when it is refused."""
    with pytest.raises(TypeError, match="StepLR: schedules an optimiser .* got str"):
        optim.StepLR("opt", 2)
    with pytest.raises(TypeError, match="LambdaLR: lr_lambda must be a function of the step .* got 3"):
        optim.LambdaLR(two_groups(), 3)
    for bad, rate in ((float("nan"), "nan"), (-1.0, "-0.1")):  # group 0's base rate is 0.1
        opt = two_groups()
        sched = optim.LambdaLR(opt, lambda e, bad=bad: [1.0, 0.5, bad][e])
        sched.step()
        said = f"LambdaLR: the learning rate of parameter group 0 at step 2 would be {rate};"
        for _ in range(2):  # refused, and again: the step was not taken
            with pytest.raises(ValueError, match=said):
                sched.step()
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.1]) and sched.last_epoch == 1


def test_lambda_lr_matches_pytorch():
    torch = pytest.importorskip("torch")
    fn = lambda e: 1 / (1 + e)  # noqa: E731
    ours = optim.LambdaLR(two_groups(), fn)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    theirs = torch.optim.lr_scheduler.LambdaLR(opt, fn)
    for _ in range(5):
        assert ours.get_last_lr()[0] == pytest.approx(theirs.get_last_lr()[0], rel=1e-12)
        opt.step()
        ours.step()
        theirs.step()


# PyTorch's four schedules: (how to make one from an optimiser, its closed form for a base lr and an epoch)
PYTORCH_SCHEDULES = {
    "StepLR": (dict(step_size=3, gamma=0.5), lambda base, e: base * 0.5 ** (e // 3)),
    "MultiStepLR": (dict(milestones=[6, 2], gamma=0.1), lambda base, e: base * 0.1 ** ((e >= 2) + (e >= 6))),
    "ExponentialLR": (dict(gamma=0.9), lambda base, e: base * 0.9**e),
    "CosineAnnealingLR": (
        dict(T_max=5, eta_min=0.01),
        lambda base, e: 0.01 + (base - 0.01) * (1 + math.cos(math.pi * e / 5)) / 2,
    ),
}


@pytest.mark.parametrize("name", sorted(PYTORCH_SCHEDULES))
def test_pytorchs_schedules_follow_their_closed_forms(name):
    options, form = PYTORCH_SCHEDULES[name]
    sched = getattr(optim, name)(two_groups(0.1, 0.2), **options)
    assert getattr(optim.lr_scheduler, name) is type(sched)
    seen = lrs_over(sched, 16)  # past T_max and every milestone
    for col, base in enumerate((0.1, 0.2)):
        np.testing.assert_allclose(seen[:, col], [form(base, e) for e in range(16)], rtol=1e-12)


@pytest.mark.parametrize("name", sorted(PYTORCH_SCHEDULES))
def test_pytorchs_schedules_match_pytorch(name):
    torch = pytest.importorskip("torch")
    options, _ = PYTORCH_SCHEDULES[name]
    ours = getattr(optim, name)(two_groups(0.1, 0.2), **options)
    p, q = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [p], "lr": 0.1}, {"params": [q], "lr": 0.2}])
    theirs = getattr(torch.optim.lr_scheduler, name)(opt, **options)
    for _ in range(16):
        np.testing.assert_allclose(ours.get_last_lr(), theirs.get_last_lr(), rtol=1e-9, atol=1e-15)
        opt.step()
        ours.step()
        theirs.step()


# Schedules run together on one optimiser (PyTorch's four compose: each multiplies the rate it finds).
CHAINS = {
    "exponential+step": [("ExponentialLR", dict(gamma=0.9)), ("StepLR", dict(step_size=2, gamma=0.5))],
    "cosine+multistep": [
        ("CosineAnnealingLR", dict(T_max=5, eta_min=0.01)),
        ("MultiStepLR", dict(milestones=[3, 7, 7], gamma=0.5)),  # 7 twice: gamma^2 there
    ],
    "step+cosine": [("StepLR", dict(step_size=3, gamma=0.5)), ("CosineAnnealingLR", dict(T_max=4))],
    "cosine+exponential": [("CosineAnnealingLR", dict(T_max=3)), ("ExponentialLR", dict(gamma=0.95))],
}


def schedules_side_by_side(torch, chain, steps, set_lrs=None):
    """Our schedules and PyTorch's, made in ``chain`` order on two-group SGDs and stepped in that order
    after every optimiser step; at step ``k`` of ``set_lrs = (k, lrs)`` the groups' rates are set by hand
    first. Returns ([our group lrs], [PyTorch's]) in force for every optimiser step, and the last step's
    get_last_lr() of every scheduler, ours and PyTorch's."""
    ours_opt = two_groups(0.1, 0.2)
    p, q = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    theirs_opt = torch.optim.SGD([{"params": [p], "lr": 0.1}, {"params": [q], "lr": 0.2}])
    ours = [getattr(optim, name)(ours_opt, **options) for name, options in chain]
    theirs = [getattr(torch.optim.lr_scheduler, name)(theirs_opt, **options) for name, options in chain]
    seen_ours, seen_theirs = [], []
    for k in range(steps):
        if set_lrs is not None and k == set_lrs[0]:
            for opt in (ours_opt, theirs_opt):
                for group, lr in zip(opt.param_groups, set_lrs[1]):
                    group["lr"] = lr
        seen_ours.append([g["lr"] for g in ours_opt.param_groups])
        seen_theirs.append([g["lr"] for g in theirs_opt.param_groups])
        theirs_opt.step()
        for ours_sched, theirs_sched in zip(ours, theirs):
            ours_sched.step()
            theirs_sched.step()
    last = [s.get_last_lr() for s in ours], [s.get_last_lr() for s in theirs]
    return (seen_ours, seen_theirs), last


@pytest.mark.parametrize("name", sorted(PYTORCH_SCHEDULES))
def test_pytorchs_schedules_match_pytorch_over_many_steps(name):
    # 40 steps: eight cosine half-periods (up and down again, through both special cases of its recursion)
    torch = pytest.importorskip("torch")
    (ours, theirs), (last_ours, last_theirs) = schedules_side_by_side(torch, [(name, PYTORCH_SCHEDULES[name][0])], 40)
    np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-17)
    np.testing.assert_allclose(last_ours, last_theirs, rtol=1e-13, atol=1e-17)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_chained_schedules_match_pytorch(chain):
    torch = pytest.importorskip("torch")
    (ours, theirs), (last_ours, last_theirs) = schedules_side_by_side(torch, CHAINS[chain], 40)
    np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-17)
    np.testing.assert_allclose(last_ours, last_theirs, rtol=1e-13, atol=1e-17)  # each one's own last rate


def test_chained_schedules_compose_by_hand():
    # no PyTorch needed: the user's report, ExponentialLR(0.9) then StepLR(2, 0.5), 4 steps
    opt = two_groups(0.1, 0.2)
    first, second = optim.ExponentialLR(opt, gamma=0.9), optim.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(4):
        opt.step()
        first.step()
        second.step()
    for group, base in zip(opt.param_groups, (0.1, 0.2)):
        assert group["lr"] == pytest.approx(base * 0.9**4 * 0.5**2, rel=1e-12)  # 0.0164025, not 0.025
    assert second.get_last_lr() == [g["lr"] for g in opt.param_groups]


@pytest.mark.parametrize(
    "chain",
    [[(name, PYTORCH_SCHEDULES[name][0])] for name in sorted(PYTORCH_SCHEDULES)]
    + [CHAINS["exponential+step"], CHAINS["cosine+multistep"]],
    ids=sorted(PYTORCH_SCHEDULES) + ["exponential+step", "cosine+multistep"],
)
def test_schedules_carry_on_from_a_rate_set_by_hand_as_pytorch(chain):
    torch = pytest.importorskip("torch")
    (ours, theirs), _ = schedules_side_by_side(torch, chain, 30, set_lrs=(7, [0.05, 0.3]))
    assert ours[7] == [0.05, 0.3]
    np.testing.assert_allclose(ours, theirs, rtol=1e-13, atol=1e-17)


@pytest.mark.parametrize("name", sorted(PYTORCH_SCHEDULES))
def test_schedules_keep_a_rate_set_by_hand(name):
    # no PyTorch needed: after a change by hand, the schedule scales the new rate, where a closed form
    # would put the old one back; alone, the rate is then twice what it would have been (the cosine:
    # its distance from eta_min scaled by the ratio of the cosine's values, from step 1 to step 3)
    options, form = PYTORCH_SCHEDULES[name]
    opt = two_groups(0.1, 0.2)
    sched = getattr(optim, name)(opt, **options)
    sched.step()
    opt.param_groups[0]["lr"] *= 2
    sched.step()
    sched.step()
    if name == "CosineAnnealingLR":
        ratio = (1 + math.cos(math.pi * 3 / 5)) / (1 + math.cos(math.pi * 1 / 5))
        expected = 0.01 + (2 * form(0.1, 1) - 0.01) * ratio
    else:
        expected = 2 * form(0.1, 3)
    assert opt.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
    assert opt.param_groups[1]["lr"] == pytest.approx(form(0.2, 3), rel=1e-12)  # the other group: untouched


@pytest.mark.parametrize("name", sorted(PYTORCH_SCHEDULES))
def test_resuming_at_last_epoch_sets_the_closed_form(name):
    # made with last_epoch=e (after the optimiser's state, which holds initial_lr, was loaded), a
    # schedule sets its closed form at e + 1 from base_lrs, whatever the group's rate was
    options, form = PYTORCH_SCHEDULES[name]
    opt = two_groups(0.1, 0.2)
    for group in opt.param_groups:
        group["initial_lr"], group["lr"] = group["lr"], 123.0
    sched = getattr(optim, name)(opt, **options, last_epoch=4)
    assert sched.last_epoch == 5 and sched.base_lrs == [0.1, 0.2]
    np.testing.assert_allclose(sched.get_last_lr(), [form(0.1, 5), form(0.2, 5)], rtol=1e-12)
    np.testing.assert_allclose(sched._get_closed_form_lr(), [form(0.1, 5), form(0.2, 5)], rtol=1e-12)
    for e in range(6, 20):  # then on recursively, along the same curve
        sched.step()
        np.testing.assert_allclose(sched.get_last_lr(), [form(0.1, e), form(0.2, e)], rtol=1e-10)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_chained_schedules_state_round_trip(chain):
    # saved after 6 steps with the optimiser (JSON: plain numbers and lists), loaded into fresh ones in
    # the order they step: the next 12 rates are those of the run that never stopped
    def make():
        opt = two_groups(0.1, 0.2)
        return opt, [getattr(optim, name)(opt, **options) for name, options in CHAINS[chain]]

    def advance(opt, schedules, steps):
        seen = []
        for _ in range(steps):
            seen.append([g["lr"] for g in opt.param_groups])
            for sched in schedules:
                sched.step()
        return seen

    opt, schedules = make()
    advance(opt, schedules, 6)
    saved = json.loads(json.dumps({"opt": opt.state_dict(), "schedules": [s.state_dict() for s in schedules]}))
    resumed_opt, resumed = make()
    resumed_opt.load_state_dict(saved["opt"])
    for sched, state in zip(resumed, saved["schedules"]):
        sched.load_state_dict(state)
    assert [g["lr"] for g in resumed_opt.param_groups] == [g["lr"] for g in opt.param_groups]
    assert advance(resumed_opt, resumed, 12) == advance(opt, schedules, 12)


@pytest.mark.parametrize(
    "make",
    [
        lambda opt: optim.NoamLR(opt, d_model=8, warmup_steps=3),
        lambda opt: optim.WarmupCosineLR(opt, warmup_steps=3, total_steps=9, min_lr=0.001),
        lambda opt: optim.LambdaLR(opt, lambda e: 0.9**e),
        lambda opt: optim.StepLR(opt, step_size=2),
        lambda opt: optim.MultiStepLR(opt, milestones=[2, 5], gamma=0.5),
        lambda opt: optim.ExponentialLR(opt, gamma=0.8),
        lambda opt: optim.CosineAnnealingLR(opt, T_max=6),
    ],
    ids=["noam", "warmup_cosine", "lambda", "step", "multistep", "exponential", "cosine"],
)
def test_schedule_state_round_trip(make):
    sched = make(two_groups())
    for _ in range(4):
        sched.step()
    saved = json.loads(json.dumps(sched.state_dict()))  # plain numbers and lists: no pickle needed
    assert "optimizer" not in saved and "lr_lambdas" not in saved
    resumed = make(two_groups())
    resumed.load_state_dict(saved)
    assert resumed.last_epoch == 4 and resumed.get_last_lr() == sched.get_last_lr()
    assert [g["lr"] for g in resumed.optimizer.param_groups] == sched.get_last_lr()  # applied at once
    for _ in range(3):
        sched.step()
        resumed.step()
        assert resumed.get_last_lr() == sched.get_last_lr()


def test_schedule_errors():
    with pytest.raises(ValueError, match="warmup_steps"):
        optim.NoamLR(two_groups(), d_model=8, warmup_steps=0)
    with pytest.raises(ValueError, match="warmup_steps < total_steps"):
        optim.WarmupCosineLR(two_groups(), warmup_steps=5, total_steps=5)
    with pytest.raises(KeyError, match="initial_lr"):
        optim.NoamLR(two_groups(), d_model=8, warmup_steps=3, last_epoch=5)
    for make, message in [
        (lambda: optim.StepLR(two_groups(), step_size=0), "StepLR: step_size must be an integer >= 1, got 0"),
        (lambda: optim.StepLR(two_groups(), 2, gamma=-1), "StepLR: gamma must be a number > 0, got -1"),
        (lambda: optim.MultiStepLR(two_groups(), [3, 1.5]), "MultiStepLR: a milestone must be an integer >= 1"),
        (lambda: optim.ExponentialLR(two_groups(), gamma="0.9"), "ExponentialLR: gamma must be a number > 0"),
        (lambda: optim.CosineAnnealingLR(two_groups(), T_max=0), "CosineAnnealingLR: T_max must be an integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            make()


# -- gradient clipping ------------------------------------------------------------------------------
def with_grads(device="cpu", scale=1.0, seed=0):
    params = make_params(device, seed=seed, shapes=((3, 2), (4,), (2,)))
    rng = np.random.default_rng(seed + 1)
    for p in params[:2]:  # the last one has no gradient: skipped
        p.grad = mt.tensor(rng.standard_normal(p.shape) * scale, device=device)
    return params


def host_grads(params):
    return [p.grad.numpy() for p in params if p.grad is not None]


def test_clip_grad_norm_scales_to_max_norm_and_returns_the_norm_before(device):
    params = with_grads(device, scale=10.0)
    before = host_grads(params)
    norm_before = math.sqrt(sum((g**2).sum() for g in before))
    total = nn.utils.clip_grad_norm_(params, max_norm=1.5)
    assert isinstance(total, mt.Tensor) and total.shape == () and isinstance(total.data, array_type(device))
    assert float(total) == pytest.approx(norm_before, rel=1e-12)
    after = host_grads(params)
    assert math.sqrt(sum((g**2).sum() for g in after)) == pytest.approx(1.5, rel=1e-6)
    for a, b in zip(after, before):  # same direction
        np.testing.assert_allclose(a, b * 1.5 / (norm_before + 1e-6), rtol=1e-12)
    assert params[2].grad is None
    assert all(isinstance(p.grad.data, array_type(device)) for p in params[:2])


def test_clip_grad_norm_refuses_a_negative_or_nan_max_norm_and_inf_only_measures():
    params = with_grads(scale=10.0)
    before = host_grads(params)
    for bad in (-1.0, float("nan"), "1", True):
        with pytest.raises(ValueError, match="clip_grad_norm_: max_norm must be a number >= 0"):
            nn.utils.clip_grad_norm_(params, bad)
    norm = nn.utils.clip_grad_norm_(params, float("inf"))  # PyTorch's idiom: the norm, no clipping
    assert float(norm) == pytest.approx(math.sqrt(sum((g**2).sum() for g in before)))
    for a, b in zip(host_grads(params), before):
        np.testing.assert_array_equal(a, b)


def test_clip_grad_norm_leaves_small_gradients_alone():
    params = with_grads(scale=0.01)
    before = host_grads(params)
    total = optim.clip_grad_norm_(params, max_norm=1.0)  # also exported from mt.optim
    assert float(total) == pytest.approx(math.sqrt(sum((g**2).sum() for g in before)))
    for a, b in zip(host_grads(params), before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("norm_type", [1.0, 3.0, float("inf")])
def test_clip_grad_norm_other_norms(norm_type):
    params = with_grads(scale=5.0)
    flat = np.concatenate([g.ravel() for g in host_grads(params)])
    expected = np.abs(flat).max() if math.isinf(norm_type) else (np.abs(flat) ** norm_type).sum() ** (1 / norm_type)
    assert float(nn.utils.grad_norm(params, norm_type)) == pytest.approx(expected, rel=1e-12)
    assert float(nn.utils.clip_grad_norm_(params, 0.5, norm_type)) == pytest.approx(expected, rel=1e-12)
    assert float(nn.utils.grad_norm(params, norm_type)) == pytest.approx(0.5, rel=1e-5)


def test_clip_grad_norm_reports_a_non_finite_norm_and_leaves_the_gradients():
    params = with_grads()
    params[0].grad.data[0, 0] = np.inf
    before = host_grads(params)
    total = nn.utils.clip_grad_norm_(params, 1.0)
    assert math.isinf(float(total))
    for a, b in zip(host_grads(params), before):
        np.testing.assert_array_equal(a, b)
    params[0].grad.data[0, 0] = np.nan
    assert math.isnan(float(nn.utils.clip_grad_norm_(params, 1.0)))
    with pytest.raises(RuntimeError, match="nan"):
        nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)


def test_clip_grad_norm_edge_cases():
    no_grads = make_params()
    assert float(nn.utils.clip_grad_norm_(no_grads, 1.0)) == 0.0
    single = with_grads(scale=10.0)[0]
    assert float(nn.utils.clip_grad_norm_(single, 1.0)) > 1.0  # one tensor, not a list
    assert float(nn.utils.grad_norm(single)) == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(ValueError, match="norm_type"):
        nn.utils.clip_grad_norm_(with_grads(), 1.0, norm_type=0)


def test_clip_grad_norm_matches_pytorch():
    torch = pytest.importorskip("torch")
    for norm_type in (2.0, 1.0, float("inf")):
        params = with_grads(scale=3.0)
        theirs = [torch.zeros(p.shape, dtype=torch.float64, requires_grad=True) for p in params[:2]]
        for t, p in zip(theirs, params):
            t.grad = torch.from_numpy(p.grad.numpy())
        total = nn.utils.clip_grad_norm_(params, 2.0, norm_type)
        expected = torch.nn.utils.clip_grad_norm_(theirs, 2.0, norm_type)
        assert float(total) == pytest.approx(float(expected), rel=1e-12)
        for p, t in zip(params, theirs):
            np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-12)
