"""A run's size is checked against the device's memory before anything is allocated.

``min_num_parameters`` is the floor both checks stand on: the checkpoint loader's (an edited
config must not describe a model larger than its weights) and the training run's (weights,
gradients and Adam's two moments must fit the device). A floor above the real count refuses
a model that fits, so it is compared here with the parameters ``build_model`` makes."""

import math
import os

import pytest
from fake_cupy import fake_cuda_backend
from minitensor.backends import get_backend

from minitensor import backends, cli
from minitensor.train.config import (
    TRAINING_BYTES_PER_PARAMETER,
    ConfigError,
    TrainConfig,
    build_data,
    build_model,
    check_fits_device,
    min_num_parameters,
)

pytest.importorskip("safetensors")


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("the time machine by h g wells, a story of the year 802,701. " * 60)
    return str(path)


def config_of(kind, text_file, **changes):
    if kind == "lm":
        return TrainConfig(model="lm", text=text_file, lm_num_steps=16, **changes)
    return TrainConfig(model=kind, task="reverse", num_train=50, num_heldout=10, **changes)


@pytest.mark.parametrize(
    "kind, changes",
    [
        ("transformer", {}),
        ("transformer", {"num_heads": 4, "num_kv_heads": 2}),  # the cross-attention is grouped too
        ("transformer", {"num_heads": 4, "num_kv_heads": 1, "tie_embeddings": True}),
        ("lm", {}),
        ("lm", {"tie_embeddings": True}),  # one Parameter for the embedding and the output layer
        ("lm", {"num_heads": 4, "num_kv_heads": 2, "ffn_num_hiddens": 96, "num_blks": 3}),
        ("bahdanau", {"num_blks": 2}),
    ],
)
def test_the_floor_is_under_the_parameters_a_model_has_and_close_to_them(kind, changes, text_file):
    config = config_of(kind, text_file, **changes)
    data = build_data(config)
    model = build_model(config, data.src_vocab, data.tgt_vocab)
    distinct = {id(p): math.prod(p.shape) for p in model.parameters()}
    count, floor = sum(distinct.values()), min_num_parameters(config, len(data.src_vocab), len(data.tgt_vocab))
    assert floor <= count
    if kind != "bahdanau":  # the GRU's biases and the additive scorer are left out of its floor
        assert floor >= 0.9 * count


def test_a_grouped_query_encoder_decoder_translates_from_its_checkpoint(tmp_path, capsys):
    """Its floor once counted the cross-attention's keys and values at full width, above the
    saved weights: the checkpoint was refused as not belonging to its own config."""
    out = str(tmp_path / "run")
    args = ["train", "--task", "reverse", "--num-train", "50", "--num-heldout", "10", "--epochs", "1"]
    assert cli.main([*args, "--num-kv-heads", "2", "--out", out, "--no-progress"]) == 0
    capsys.readouterr()
    assert cli.main(["translate", "--checkpoint", out, "abc"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip()


def test_a_model_too_large_for_the_device_is_refused_before_it_is_built(tmp_path, capsys, monkeypatch):
    config = TrainConfig(task="reverse", num_train=50, num_heldout=10, num_hiddens=64)
    data = build_data(config)
    needed = TRAINING_BYTES_PER_PARAMETER * min_num_parameters(config, len(data.src_vocab), len(data.tgt_vocab))
    cpu = type(get_backend("cpu"))
    monkeypatch.setattr(cpu, "memory_size", lambda self: needed)
    check_fits_device(config, len(data.src_vocab), len(data.tgt_vocab))  # exactly enough
    monkeypatch.setattr(cpu, "memory_size", lambda self: needed - 1)
    with pytest.raises(ConfigError) as refused:
        check_fits_device(config, len(data.src_vocab), len(data.tgt_vocab))
    assert refused.value.field == "num_hiddens"
    monkeypatch.setattr(cpu, "memory_size", lambda self: None)  # a system that does not say: no check
    check_fits_device(config, len(data.src_vocab), len(data.tgt_vocab))

    monkeypatch.undo()  # the machine's own memory, whatever it is: 3.6 TiB for each matrix is past it
    out = tmp_path / "run"
    assert cli.main(["train", "--num-hiddens", "1000000", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minitensor train: error: --num-hiddens 1000000, --ffn-num-hiddens 64, --num-blks 2: ")
    assert "an encoder-decoder Transformer of at least" in err and "GiB of device 'cpu'" in err
    assert not out.exists()  # nothing of the run is left


def test_each_backend_says_how_much_memory_its_device_has(monkeypatch):
    cpu = get_backend("cpu").memory_size()
    if hasattr(os, "sysconf"):
        assert cpu == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 0
    monkeypatch.setitem(backends._BACKENDS, "cuda", fake_cuda_backend())
    assert get_backend("cuda").memory_size() == 150_000_000_000  # the stand-in's H200
    config = TrainConfig(task="reverse", num_hiddens=60_000, device="cuda")
    with pytest.raises(ConfigError, match=r"more than the 139\.7 GiB of device 'cuda'"):
        check_fits_device(config, 20, 20)
