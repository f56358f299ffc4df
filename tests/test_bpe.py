"""ByteBPE (minitensor/data/bpe.py): round trips, files, and its merges against the ``tokenizers``
library's BPE trainer (``pip install tokenizers``: the test extra). Without the library the
comparisons skip, except under ``CI=true``, where they must run."""

import json
import os
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitensor.data import EXAMPLE_TEXT
from minitensor.data.bpe import NUM_BYTES, ByteBPE, byte_to_symbol, chunks

TEXT = open(EXAMPLE_TEXT, encoding="utf-8").read()[:20_000]
MIXED = "Naïve café: 日本語 text, emoji 😀😀, tabs\t\tand  spaces, it's 1984's; snake_case __init__ ½ ²\n\n"


@pytest.fixture(scope="module")
def bpe():
    return ByteBPE.train(TEXT + MIXED * 20, vocab_size=400)


def require_tokenizers():
    try:
        import tokenizers
    except ImportError:
        message = "tokenizers is not installed (pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail("under CI=true the comparison with tokenizers must run: " + message)
        pytest.skip(message)
    return tokenizers


def library_merges(text, vocab_size, min_frequency):
    """The merges of tokenizers' BpeTrainer with the settings ByteBPE uses, as pairs of bytes."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[],
    )
    tokenizer.train_from_iterator([text], trainer)
    to_byte = {s: b for b, s in byte_to_symbol().items()}
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    pairs = [m if isinstance(m, list) else m.split(" ") for m in merges]  # newer versions: lists
    return [tuple(bytes(to_byte[c] for c in token) for token in pair) for pair in pairs]


def our_merges(bpe):
    return [(bpe.vocab[a], bpe.vocab[b]) for a, b in bpe.merges]


# -- the algorithm ---------------------------------------------------------------------------------
def test_vocabulary_is_bytes_then_merges(bpe):
    assert len(bpe) == 400 == NUM_BYTES + len(bpe.merges)
    assert bpe.vocab[:NUM_BYTES] == [bytes([b]) for b in range(NUM_BYTES)]
    for i, (a, b) in enumerate(bpe.merges):
        assert a < NUM_BYTES + i and b < NUM_BYTES + i
        assert bpe.vocab[NUM_BYTES + i] == bpe.vocab[a] + bpe.vocab[b]
    assert len(set(bpe.vocab)) == len(bpe.vocab)
    assert bpe.vocab[NUM_BYTES] == b" t"  # the most frequent pair of English text


def test_merges_stay_inside_chunks(bpe):
    for token in bpe.vocab[NUM_BYTES:]:
        assert chunks(token) == [token], token  # no token spans two chunks


def test_first_merge_is_the_most_frequent_pair():
    bpe = ByteBPE.train("abab abab xy", 257, min_frequency=1)
    assert bpe.merges == [(ord("a"), ord("b"))]


def test_min_frequency_stops_training():
    bpe = ByteBPE.train("the cat", 1000, min_frequency=2)
    assert bpe.merges == []  # every pair occurs once
    assert len(ByteBPE.train("the cat", 1000, min_frequency=1)) > NUM_BYTES


def test_encode_compresses_and_uses_the_merges(bpe):
    ids = bpe.encode(TEXT[:2000])
    assert len(ids) < 0.6 * len(TEXT[:2000].encode())
    assert max(ids) < len(bpe)


def test_chunks_concatenate_back():
    for text in (TEXT[:3000], MIXED):
        data = text.encode()
        assert b"".join(chunks(data)) == data
    assert chunks(b" the cat's  hat!!\n") == [b" the", b" cat", b"'s", b" ", b" hat", b"!!", b"\n"]


@given(st.text())
def test_round_trip_text(text):
    bpe = BPE_SMALL
    assert bpe.decode(bpe.encode(text)) == text


@given(st.binary())
def test_round_trip_bytes(data):
    bpe = BPE_SMALL
    assert bpe.decode_bytes(bpe.encode_bytes(data)) == data
    assert b"".join(chunks(data)) == data


BPE_SMALL = ByteBPE.train(TEXT[:5000] + MIXED * 5, 320)


def test_decode_replaces_half_a_character_only_at_the_end(bpe):
    ids = bpe.encode("café")
    data = bpe.decode_bytes(ids)
    assert bpe.decode(bpe.encode_bytes(data[:-1])) == "caf\ufffd"  # "é" is 2 bytes; 1 is left
    with pytest.raises(ValueError, match="token 400 is outside the vocabulary of 400"):
        bpe.decode([1, 400])
    with pytest.raises(ValueError, match=r"token -1 is outside the vocabulary of 400 \(0..399\)"):
        bpe.decode([1, -1])  # not the last token's bytes, as a list's index -1 would give
    with pytest.raises(TypeError, match="ByteBPE.encode: text must be a str, got bytes"):
        bpe.encode(b"caf\xc3\xa9")


# -- files -----------------------------------------------------------------------------------------
def test_save_load_round_trip(bpe, tmp_path):
    path = tmp_path / "tokenizer.json"
    bpe.save(path)
    loaded = ByteBPE.load(path)
    assert loaded.merges == bpe.merges and loaded.vocab == bpe.vocab
    assert loaded.encode(MIXED) == bpe.encode(MIXED)


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda d: d.pop("merges"), '"merges"'),
        (lambda d: d["merges"].__setitem__(3, [1, 2, 3]), r'"merges\[3\]"'),
        (lambda d: d["merges"].__setitem__(0, [256, 1]), r'"merges\[0\]"'),
        (lambda d: d["merges"].__setitem__(5, ["a", 1]), r'"merges\[5\]"'),
        (lambda d: d.__setitem__("vocab_size", 7), '"vocab_size"'),
        (lambda d: d.__setitem__("format", "gpt2"), '"format"'),
        (lambda d: d.__setitem__("version", 99), '"version"'),
    ],
)
def test_corrupt_file_names_the_field(bpe, tmp_path, change, field):
    d = bpe.to_dict()
    change(d)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=f"tokenizer.json: field {field}"):
        ByteBPE.load(path)


def test_file_that_is_not_json(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"merges": [')
    with pytest.raises(ValueError, match="tokenizer.json: not a tokenizer file"):
        ByteBPE.load(path)


# -- against the tokenizers library ----------------------------------------------------------------
def _synthetic(seed):
    """Text made to stress ties and runs: repeated letters and spaces, multi-byte characters."""
    rng = random.Random(seed)
    pieces = ["aaaa", "aaa", "  ", "    ", "\n\n", "ab", "ba", "é", "日本語", "😀", "__", "!!!", "12", " the"]
    pieces += ["'s", "\t"]
    return "".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randint(50, 2000)))


@pytest.mark.parametrize("vocab_size, min_frequency", [(300, 0), (600, 2), (1000, 0)])
def test_same_merges_as_tokenizers_on_english(vocab_size, min_frequency):
    require_tokenizers()
    ours = our_merges(ByteBPE.train(TEXT, vocab_size, min_frequency=min_frequency))
    assert ours == library_merges(TEXT, vocab_size, min_frequency)


@pytest.mark.parametrize("seed", range(10))
def test_same_merges_as_tokenizers_on_synthetic_text(seed):
    """Many ties (equal counts) and runs of one token ("aaaa"): the tie-break and the counts of
    overlapping pairs are where two BPE trainers would part."""
    require_tokenizers()
    text = _synthetic(seed)
    for vocab_size, min_frequency in ((300, 0), (500, 2)):
        ours = our_merges(ByteBPE.train(text, vocab_size, min_frequency=min_frequency))
        assert ours == library_merges(text, vocab_size, min_frequency), (seed, vocab_size)


def test_same_chunks_as_the_byte_level_pre_tokenizer():
    """PATTERN is GPT-2's regex in Python's re: the same chunks, except on the characters the
    module docstring names (non-decimal numbers such as "½", which are left out here)."""
    require_tokenizers()
    from tokenizers import pre_tokenizers

    to_byte = {s: b for b, s in byte_to_symbol().items()}
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for text in (TEXT[:5000], MIXED.replace("½ ²", ""), _synthetic(0)):
        theirs = [bytes(to_byte[c] for c in piece) for piece, _ in pre.pre_tokenize_str(text)]
        assert chunks(text.encode()) == theirs


# -- training a language model on BPE tokens (minitensor train --tokenizer bpe) --------------------
SMALL_RUN = ["--lm-num-steps", "16", "--steps", "6", "--batch-size", "8", "--num-hiddens", "16"]
SMALL_RUN += ["--ffn-num-hiddens", "32", "--num-blks", "1", "--no-progress"]


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    """A few steps of `minitensor train --text FILE --tokenizer bpe --vocab-size 300`."""
    from minitensor import cli

    folder = tmp_path_factory.mktemp("bpe_run")
    text = folder / "text.txt"
    text.write_text(TEXT[:12_000] + MIXED, encoding="utf-8")
    out = str(folder / "lm")
    argv = ["train", "--text", str(text), "--tokenizer", "bpe", "--vocab-size", "300", "--out", out, *SMALL_RUN]
    assert cli.main(argv) == 0
    return out, text


def test_cli_trains_and_saves_the_tokenizer(bpe_run):
    from minitensor.train.config import TrainConfig, build_data
    from minitensor.train.run import load_run_checkpoint

    out, text = bpe_run
    tokenizer = ByteBPE.load(os.path.join(out, "tokenizer.json"))
    assert len(tokenizer) == 300
    # trained on the training part only: the first 90% of the text's characters
    config, info = load_run_checkpoint(os.path.join(out, "best"))
    assert (config.tokenizer, config.vocab_size) == ("bpe", 300)  # the checkpoint records the tokenizer
    full = text.read_text(encoding="utf-8")
    train_text = full[: int(len(full) * 0.9)]
    assert tokenizer.merges == ByteBPE.train(train_text, 300).merges
    assert info["vocabs"]["tgt"].idx_to_token[4:] == tokenizer.token_symbols()
    data = build_data(TrainConfig.from_dict(config.to_dict()), tokenizer=tokenizer)
    assert tokenizer.decode([i - 4 for i in data.heldout]) == full[len(train_text) :]


def test_generate_from_the_bpe_run(bpe_run, capsys):
    from minitensor import cli

    out, _ = bpe_run
    capsys.readouterr()
    assert cli.main(["generate", "--checkpoint", out, "--prompt", "The Time Traveller", "--max-len", "8"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("The Time Traveller")


def test_without_special_tokens_the_vocabulary_is_the_tokenizers(tmp_path, capsys):
    """nanoGPT's recipe (--no-special-tokens, as --preset gpt-char sets it): the model's
    vocabulary is the BPE tokens alone, so nothing like <unk> can be generated, and the run
    loads back for generation."""
    from minitensor import cli
    from minitensor.train.run import load_run_checkpoint

    text = tmp_path / "text.txt"
    text.write_text(TEXT[:12_000], encoding="utf-8")
    out = str(tmp_path / "lm")
    argv = ["train", "--text", str(text), "--tokenizer", "bpe", "--vocab-size", "300", "--no-special-tokens"]
    assert cli.main([*argv, "--out", out, *SMALL_RUN]) == 0
    _, info = load_run_checkpoint(os.path.join(out, "best"))
    assert info["vocabs"]["tgt"].idx_to_token == ByteBPE.load(os.path.join(out, "tokenizer.json")).token_symbols()
    capsys.readouterr()
    assert cli.main(["generate", "--checkpoint", out, "--prompt", "The Time", "--max-len", "8"]) == 0
    assert capsys.readouterr().out.startswith("The Time")


def test_resume_reads_the_saved_tokenizer(bpe_run, capsys):
    from minitensor import cli

    out, _ = bpe_run
    capsys.readouterr()
    assert cli.main(["train", "--out", out, "--resume", "--steps", "8", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "resuming" in captured.out + captured.err
    assert len(ByteBPE.load(os.path.join(out, "tokenizer.json"))) == 300


def test_corrupt_tokenizer_json_is_a_clear_error(bpe_run, tmp_path, capsys):
    import shutil

    from minitensor import cli

    out, _ = bpe_run
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    path = os.path.join(copy, "tokenizer.json")
    d = json.load(open(path))
    d["merges"][2] = [999, 1]
    json.dump(d, open(path, "w"))
    capsys.readouterr()
    assert cli.main(["generate", "--checkpoint", copy, "--prompt", "The"]) == 2
    assert 'tokenizer.json: field "merges[2]" must be a pair of token ids below 258' in capsys.readouterr().err
    ByteBPE.train(MIXED * 3, 300).save(path)  # a tokenizer, but another run's
    assert cli.main(["generate", "--checkpoint", copy, "--prompt", "The"]) == 2
    assert "tokens are not those of the checkpoint's vocabulary" in capsys.readouterr().err
    os.remove(path)
    assert cli.main(["generate", "--checkpoint", copy, "--prompt", "The"]) == 2
    assert "tokenizer.json: missing" in capsys.readouterr().err


def test_vocab_size_needs_the_bpe_tokenizer(tmp_path, capsys):
    from minitensor import cli

    text = tmp_path / "text.txt"
    text.write_text(TEXT[:3000])
    assert cli.main(["train", "--text", str(text), "--vocab-size", "300", "--out", str(tmp_path / "x")]) == 2
    assert "--vocab-size sets the size of a BPE vocabulary: add --tokenizer bpe" in capsys.readouterr().err


def test_loss_per_char_is_loss_per_token_times_tokens_per_char():
    import math

    import minitensor as mt
    from minitensor.train.config import TrainConfig, build_data, build_model, loss_per_char
    from minitensor.train.loop import _arrays, evaluate

    assert loss_per_char(2.0, 300, 1200) == 0.5
    path = os.path.join(os.path.dirname(EXAMPLE_TEXT), "time_machine.txt")
    config = TrainConfig.recipe("lm", text=path, tokenizer="bpe", vocab_size=300, max_examples=20_000)
    config = config.replace(num_hiddens=16, ffn_num_hiddens=32, num_blks=1, lm_num_steps=16)
    mt.manual_seed(0)
    data = build_data(config)
    assert data.heldout_chars == 2000 and len(data.heldout) < data.heldout_chars
    metrics = evaluate(
        build_model(config, data.src_vocab, data.tgt_vocab), data, _arrays(config, data, "heldout"), config
    )
    expected = metrics["loss"] * len(data.heldout) / data.heldout_chars
    assert math.isclose(metrics["loss_per_char"], expected)
    # a character model: one token a character, the two losses are one
    char = TrainConfig.recipe("lm", text=path, max_examples=20_000).replace(num_hiddens=16, lm_num_steps=16)
    data = build_data(char)
    assert data.heldout_chars == len(data.heldout)


def test_explain_page_labels_tokens_with_their_text(bpe_run, tmp_path, capsys):
    """The explain page of a BPE model shows " the" as ␣the, not GPT-2's symbols "Ġthe"."""
    from minitensor import cli

    out, _ = bpe_run
    page = tmp_path / "explain.html"
    argv = ["explain", "The Time Traveller", "--checkpoint", out, "--max-len", "3", "--out", str(page)]
    assert cli.main(argv) == 0
    assert "page: " in capsys.readouterr().out
    html = page.read_text(encoding="utf-8")
    assert '"␣T' in html and "Ġ" not in html  # " T" (or " Time"): a space-led token as text


def test_symbol_text():
    from minitensor.data.bpe import symbol_text

    assert symbol_text("Ġthe") == " the" and symbol_text("Ċ") == "\n" and symbol_text("abc") == "abc"
    first_byte = ByteBPE().token_symbols()["é".encode()[0]]
    assert symbol_text(first_byte) == first_byte  # half a character: no text of its own, its symbol


def test_export_writes_the_tokenizer_beside_the_graph(bpe_run, tmp_path, capsys):
    pytest.importorskip("onnx")
    from minitensor import cli

    out, _ = bpe_run
    folder = tmp_path / "onnx"
    assert cli.main(["export", "--checkpoint", out, "--onnx", str(folder)]) == 0
    assert sorted(os.listdir(folder)) == ["model.onnx", "tokenizer.json", "vocab.json"]
    assert ByteBPE.load(folder / "tokenizer.json").merges == ByteBPE.load(os.path.join(out, "tokenizer.json")).merges
    meta = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert meta["tokens"] == "bpe"
