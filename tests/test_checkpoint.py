"""Checkpoints (minitensor/train/checkpoint/): exact resume, damaged files, another config,
missing plugins, atomic saves, devices, and no pickle anywhere.

The resume test trains a small TransformerLM with dropout (so the random generators matter),
saves, trains on, then loads the checkpoint into a freshly built model and trains on again:
the two continuations must agree bit for bit. A control shows that leaving out any one piece
(RNG, optimiser, scheduler, data position) breaks the equality, so the test can fail.
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import array_type

import minitensor as mt
from minitensor import hookimpl, nn
from minitensor import plugins as mtp
from minitensor.data import Batches, Vocab, lm_arrays
from minitensor.train import checkpoint as ckpt
from minitensor.train.checkpoint import CheckpointError, get_rng_state, load_checkpoint, save_checkpoint, set_rng_state

V = 11
CORPUS = np.random.default_rng(7).integers(0, V, 80)
TOKENS = [str(i) for i in range(V)]


def make_lm(seed=0, num_hiddens=8, num_blks=2, dropout=0.2, device="cpu", scorer="scaled_dot"):
    mt.manual_seed(seed)
    return nn.TransformerLM(
        V, num_hiddens, 2 * num_hiddens, 2, num_blks, dropout, max_len=32, scorer=scorer, device=device
    )


def make_training(model, d_model=8):
    opt = mt.optim.Adam(model.parameters(), lr=1.0)
    return opt, mt.optim.NoamLR(opt, d_model=d_model, warmup_steps=3)


def forever(loader):
    while True:
        yield from loader


def train_step(model, opt, sched, batches, k=None):
    X, Y = next(batches)
    if k is None:
        k = int(mt.random.host_rng().integers(3, X.shape[1] + 1))  # host randomness matters too
    logits = model(X[:, :k])
    loss = mt.cross_entropy(logits, Y[:, :k])
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()
    return loss.item()


def snapshot(model):
    return {k: v.numpy() for k, v in model.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def saved_run(tmp_path, steps=3):
    """A model trained ``steps`` steps and saved: (model, opt, sched, batches, loader, path)."""
    model = make_lm()
    model.train()
    opt, sched = make_training(model)
    loader = Batches(*lm_arrays(CORPUS, 8), batch_size=4)
    batches = forever(loader)
    for _ in range(steps):
        train_step(model, opt, sched, batches)
    path = save_checkpoint(
        tmp_path / "ckpt",
        model,
        opt,
        sched,
        config={"num_hiddens": 8, "dropout": 0.2},
        vocabs={"tokens": Vocab(TOKENS)},
        extra={"batches": loader.state_dict()},
        step=steps,
        epoch=loader.epoch,
    )
    return model, opt, sched, batches, loader, path


# -- exact resume -------------------------------------------------------------------------------
@pytest.mark.parametrize("leave_out", [None, "rng", "optimizer", "scheduler", "batches"])
def test_resume_continues_bit_for_bit(tmp_path, leave_out):
    model, opt, sched, batches, _, path = saved_run(tmp_path)
    expected = [train_step(model, opt, sched, batches) for _ in range(4)]
    expected_params = snapshot(model)

    fresh = make_lm(seed=123)  # other initial weights, other RNG position
    fresh.train()
    opt2, sched2 = make_training(fresh)
    loader2 = Batches(*lm_arrays(CORPUS, 8), batch_size=4)
    info = load_checkpoint(
        path,
        fresh,
        None if leave_out == "optimizer" else opt2,
        None if leave_out == "scheduler" else sched2,
        restore_rng=leave_out != "rng",
    )
    if leave_out != "batches":
        loader2.load_state_dict(info["extra"]["batches"])
    batches2 = forever(loader2)
    got = [train_step(fresh, opt2, sched2, batches2) for _ in range(4)]

    if leave_out is None:
        assert got == expected  # floats compared exactly
        assert_same(snapshot(fresh), expected_params)
        assert info["step"] == 3 and info["config"] == {"num_hiddens": 8, "dropout": 0.2}
        assert info["vocabs"] == {"tokens": Vocab(TOKENS)}
        assert info["model_class"] == "minitensor.nn.transformer.TransformerLM"
    else:  # the control: without that piece the continuation differs
        assert got != expected


def test_the_format_on_disk(tmp_path):
    *_, path = saved_run(tmp_path, steps=1)
    assert sorted(os.listdir(path)) == ["checkpoint.json", "model.safetensors", "optimizer.safetensors"]
    body = json.loads(Path(path, "checkpoint.json").read_text())
    assert body["format"] == "minitensor-checkpoint" and body["format_version"] == 1
    assert body["minitensor_version"] == mt.__version__
    used = {(p["kind"], p["name"]): p for p in body["plugins"]}
    assert set(used) == {("scorer", "scaled_dot"), ("pooling", "softmax"), ("positional encoding", "sinusoidal")}
    assert all(p["source"] == "built-in" for p in used.values())
    for name, entry in body["files"].items():
        data = Path(path, name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    assert body["optimizer"]["class"] == "minitensor.optim.adam.Adam"
    assert body["optimizer"]["state"]["0"]["step"] == 1
    assert body["optimizer"]["state"]["0"]["exp_avg"] == {"__tensor__": "state.0.exp_avg"}
    assert body["scheduler"]["state"]["last_epoch"] == 1
    assert body["rng"]["host"]["bit_generator"] == "PCG64" and "cpu" in body["rng"]["backends"]
    assert body["vocabs"]["tokens"]["idx_to_token"][:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    # safetensors files: an 8-byte header length, then a JSON header (no pickle opcodes)
    raw = Path(path, "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert header["decoder.embedding.token_embedding.weight"]["shape"] == [V, 8]


# -- damaged checkpoints: a clear error, and nothing changed --------------------------------------
def loaded_target(tmp_path):
    """A fresh model, optimiser, scheduler and RNG state to load into, with their snapshots."""
    model = make_lm(seed=5)
    opt, sched = make_training(model)
    return model, opt, sched, snapshot(model), json.dumps(get_rng_state(), sort_keys=True)


def assert_unchanged(model, opt, sched, params, rng):
    assert_same(snapshot(model), params)
    assert opt.state == {} and sched.last_epoch == 0
    assert json.dumps(get_rng_state(), sort_keys=True) == rng


def rewrite_index(path, edit):
    """Edit checkpoint.json and re-sign it, as a (mis)behaving tool would."""
    body = json.loads(Path(path, "checkpoint.json").read_text())
    edit(body)
    body.pop("content_sha256")
    body["content_sha256"] = ckpt._sha256(ckpt._canonical(body))
    Path(path, "checkpoint.json").write_text(json.dumps(body))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncate model", "model.safetensors is truncated"),
        ("flip model byte", "model.safetensors is corrupted"),
        ("flip optimizer byte", "optimizer.safetensors is corrupted"),
        ("delete model", "model.safetensors is missing"),
        ("delete optimizer", "optimizer.safetensors is missing"),
        ("delete index", "checkpoint.json is missing"),
        ("garble index", "not valid JSON"),
        ("edit index", "content hash does not match"),
        ("not safetensors", "cannot be parsed as safetensors"),
        ("future version", 'field "format_version" is 99: .* reads format version'),
    ],
)
def test_a_damaged_checkpoint_is_refused_and_nothing_changes(tmp_path, damage, message):
    *_, path = saved_run(tmp_path)
    model_file, opt_file, index = (
        Path(path, n) for n in ("model.safetensors", "optimizer.safetensors", "checkpoint.json")
    )
    if damage == "truncate model":
        model_file.write_bytes(model_file.read_bytes()[: model_file.stat().st_size // 2])
    elif damage.startswith("flip"):
        f = model_file if "model" in damage else opt_file
        data = bytearray(f.read_bytes())
        data[len(data) - 7] ^= 0x01
        f.write_bytes(bytes(data))
    elif damage.startswith("delete"):
        {"model": model_file, "optimizer": opt_file, "index": index}[damage.split()[1]].unlink()
    elif damage == "garble index":
        index.write_text(index.read_text()[:-40])
    elif damage == "edit index":
        index.write_text(index.read_text().replace('"step": 3', '"step": 4'))
    elif damage == "not safetensors":
        junk = b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}!!"
        model_file.write_bytes(junk)
        rewrite_index(
            path,
            lambda b: b["files"].update(
                {"model.safetensors": {"sha256": hashlib.sha256(junk).hexdigest(), "bytes": len(junk)}}
            ),
        )
    elif damage == "future version":
        rewrite_index(path, lambda b: b.update(format_version=99))
    target = loaded_target(tmp_path)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path, *target[:3])
    assert_unchanged(*target)


@pytest.mark.parametrize("other", [dict(num_hiddens=16), dict(num_blks=3)])
def test_a_checkpoint_of_another_config_names_keys_and_shapes(tmp_path, other):
    *_, path = saved_run(tmp_path)
    model = make_lm(seed=5, **other)
    opt, sched = make_training(model, d_model=other.get("num_hiddens", 8))
    target = (model, opt, sched, snapshot(model), json.dumps(get_rng_state(), sort_keys=True))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, model, opt, sched)
    text = str(e.value)
    if "num_hiddens" in other:
        assert "'decoder.embedding.token_embedding.weight': checkpoint shape (11, 8), model shape (11, 16)" in text
    else:
        assert "in the model, not in the checkpoint: 'decoder.blks.2." in text
    assert "nothing was changed" in text and '"num_hiddens": 8' in text  # the saved config is shown
    assert_unchanged(*target)


def test_an_optimizer_or_scheduler_of_another_kind_is_refused(tmp_path):
    *_, path = saved_run(tmp_path)
    model = make_lm(seed=5)
    params = snapshot(model)
    sgd = mt.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match="optimizer is a minitensor.optim.adam.Adam, not a .*SGD"):
        load_checkpoint(path, model, sgd)
    opt = mt.optim.Adam(model.parameters(), lr=1.0)
    cosine = mt.optim.WarmupCosineLR(opt, 2, 10)
    with pytest.raises(CheckpointError, match="scheduler is a .*NoamLR"):
        load_checkpoint(path, model, opt, cosine)
    assert_same(snapshot(model), params)
    assert opt.state == {}


# -- plugins --------------------------------------------------------------------------------------
class Cosine(nn.Module):
    """score(q, k) = <q, k> / (|q| |k|)"""

    def __init__(self, query_size, key_size, **options):
        super().__init__()

    def forward(self, queries, keys):
        q = queries / (queries * queries).sum(axis=-1, keepdims=True).sqrt()
        k = keys / (keys * keys).sum(axis=-1, keepdims=True).sqrt()
        return q @ k.swapaxes(-1, -2)


class CosinePlugin:
    @hookimpl
    def minitensor_scorers(self):
        return {"cosine_ckpt": Cosine}


@pytest.mark.parametrize("source", ["minitensor-example-cosine 0.1.0", "registered at run time"])
def test_a_missing_plugin_names_the_plugin_and_its_distribution(tmp_path, source):
    plugin = CosinePlugin()
    name = mtp.register(plugin, name="cosine-ckpt-test")
    try:
        mtp._sources[name] = source  # as if it came from an installed distribution's entry point
        mtp._registries.clear()
        model = make_lm(scorer="cosine_ckpt")
        path = save_checkpoint(tmp_path / "ckpt", model)
        saved = {p["name"]: p for p in json.loads(Path(path, "checkpoint.json").read_text())["plugins"]}
        assert saved["cosine_ckpt"]["source"] == source
        assert saved["cosine_ckpt"]["class"] == f"{__name__}.Cosine"
        load_checkpoint(path)  # installed: fine
    finally:
        mtp.unregister(plugin)
    other = make_lm(seed=5)  # same keys and shapes (the scorer has no parameters)
    params = snapshot(other)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, other)
    if source.startswith("minitensor-example-cosine"):
        assert (
            "scorer 'cosine_ckpt' from minitensor-example-cosine 0.1.0 is not installed: "
            "pip install minitensor-example-cosine"
        ) in str(e.value)
    else:
        assert "scorer 'cosine_ckpt'" in str(e.value) and "registered at run time" in str(e.value)
    assert_same(snapshot(other), params)


# -- atomic saves ---------------------------------------------------------------------------------
def leftovers(path):
    return sorted(e for e in os.listdir(Path(path).parent) if e.startswith(".ckpt."))


@pytest.mark.parametrize("crash_at", ["writing the index", "renaming the new checkpoint in"])
def test_a_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, crash_at):
    model, opt, sched, batches, _, path = saved_run(tmp_path)
    before = snapshot(model)
    train_step(model, opt, sched, batches)  # the model moves on, then saving it fails
    if crash_at == "writing the index":
        real = ckpt.save._write_file

        def write(p, data):
            if p.endswith("checkpoint.json"):
                raise OSError(28, "No space left on device")
            real(p, data)

        monkeypatch.setattr(ckpt.save, "_write_file", write)
    else:
        real = ckpt.save._rename

        def rename(src, dst):
            if os.path.basename(src).startswith(".ckpt.tmp-"):
                raise OSError(5, "Input/output error")
            real(src, dst)

        monkeypatch.setattr(ckpt.save, "_rename", rename)
    with pytest.raises(OSError):
        save_checkpoint(path, model, opt, sched, step=4)
    monkeypatch.undo()
    assert leftovers(path) == []
    fresh = make_lm(seed=9)
    info = load_checkpoint(path, fresh)
    assert info["step"] == 3
    assert_same(snapshot(fresh), before)


def test_a_first_save_that_fails_leaves_no_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt.save, "_write_file", lambda p, data: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "ckpt", make_lm())
    assert os.listdir(tmp_path) == []


def test_a_process_killed_between_the_renames_loses_nothing(tmp_path):
    """The hard case: no exception handler runs. The old checkpoint is read from beside the
    directory, and the next save puts everything right."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import minitensor as mt
        from minitensor.train import checkpoint as ckpt
        from test_checkpoint import make_lm
        path = {str(tmp_path / "ckpt")!r}
        ckpt.save_checkpoint(path, make_lm(seed=1), step=1)
        real = ckpt.save._rename
        def rename(src, dst):
            if os.path.basename(src).startswith(".ckpt.tmp-"):
                os._exit(3)   # killed: the old one is renamed away, the new one not yet in
            real(src, dst)
        ckpt.save._rename = rename
        ckpt.save_checkpoint(path, make_lm(seed=2), step=2)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    path = tmp_path / "ckpt"
    assert not path.exists()
    with pytest.warns(RuntimeWarning, match="a save was interrupted"):
        info = load_checkpoint(path, make_lm(seed=5))
    assert info["step"] == 1 and info["recovered_from"]
    assert_same({k: v.numpy() for k, v in info["state_dict"].items()}, snapshot(make_lm(seed=1)))
    save_checkpoint(path, make_lm(seed=3), step=3)
    assert leftovers(path) == [] and load_checkpoint(path)["step"] == 3


def test_save_refuses_to_replace_a_directory_with_other_files(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "loss.png").write_bytes(b"png")
    with pytest.raises(CheckpointError, match="loss.png"):
        save_checkpoint(tmp_path / "run", make_lm())
    assert os.listdir(tmp_path / "run") == ["loss.png"]


def test_unsavable_values_fail_before_anything_is_written(tmp_path):
    with pytest.raises(CheckpointError, match=r"extra\['when'\]: a object"):
        save_checkpoint(tmp_path / "ckpt", make_lm(), extra={"when": object()})
    assert not (tmp_path / "ckpt").exists()


# -- devices --------------------------------------------------------------------------------------
@pytest.mark.parametrize("src, dst", [("strict", "cpu"), ("cpu", "strict")])
def test_saved_on_one_device_loads_on_another(tmp_path, src, dst):
    model = make_lm(device=src, dropout=0.0)
    opt, sched = make_training(model)
    batches = forever(Batches(*lm_arrays(CORPUS, 8), batch_size=4, device=src))
    for _ in range(2):
        train_step(model, opt, sched, batches)
    path = save_checkpoint(tmp_path / "ckpt", model, opt, sched)
    other = make_lm(seed=4, device=dst, dropout=0.0)
    opt2, sched2 = make_training(other)
    info = load_checkpoint(path, other, opt2, sched2, map_device=dst)
    assert info["saved_device"] == src
    assert_same(snapshot(other), snapshot(model))
    assert all(isinstance(t.data, array_type(dst)) for t in info["state_dict"].values())
    assert all(isinstance(s["exp_avg"], array_type(dst)) for s in opt2.state.values())
    assert all(p.device == dst for p in other.parameters())
    X, Y = next(batches)
    loss = train_step(model, opt, sched, iter([(X, Y)]), k=8)
    loss2 = train_step(other, opt2, sched2, iter([(X.to(dst), Y.to(dst))]), k=8)
    assert loss2 == pytest.approx(loss, rel=1e-6)
    # The CPU runs the fused numba kernels, the strict backend their NumPy twins: float32
    # rounding differs a little, and Adam's m / sqrt(v) magnifies it where gradients are
    # tiny (embedding rows of rare tokens).
    for (k, a), b in zip(snapshot(model).items(), snapshot(other).values()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=k)


# -- RNG helpers and imports ----------------------------------------------------------------------
def test_rng_state_round_trips_through_json_and_bad_states_change_nothing(monkeypatch):
    mt.manual_seed(3)
    state = json.loads(json.dumps(get_rng_state()))
    first = (mt.random.host_rng().random(3), mt.rand(3).numpy())
    set_rng_state(state)
    assert np.array_equal(mt.random.host_rng().random(3), first[0])
    assert np.array_equal(mt.rand(3).numpy(), first[1])
    # a bit generator whose state holds arrays (MT19937's key) survives JSON too
    monkeypatch.setattr(mt.random, "_host", np.random.Generator(np.random.MT19937(5)))
    state = json.loads(json.dumps(get_rng_state()))
    draw = mt.random.host_rng().random(4)
    set_rng_state(state)
    assert np.array_equal(mt.random.host_rng().random(4), draw)
    before = json.dumps(get_rng_state(), sort_keys=True)
    broken = json.loads(before)
    broken["backends"]["cpu"] = {"bit_generator": "NoSuchBitGenerator"}
    with pytest.raises(ValueError, match="NoSuchBitGenerator"):
        set_rng_state(broken)
    assert json.dumps(get_rng_state(), sort_keys=True) == before


def test_importing_minitensor_does_not_import_safetensors():
    code = (
        "import sys, glob, os, minitensor, minitensor.train.checkpoint; "
        "assert 'safetensors' not in sys.modules, 'safetensors imported'; "
        "files = glob.glob(os.path.join(os.path.dirname(minitensor.train.checkpoint.__file__), '*.py')); "
        "assert len(files) > 1, files; "
        "src = ''.join(open(f).read() for f in files); "
        "assert 'import pickle' not in src and 'allow_pickle=True' not in src"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
