"""The learner's text files and the example text: a path is a path, a bad byte or an empty
file is one line naming the file, the shipped novel is the one its README describes, and the
unigram baseline is the number its formula gives."""

import collections
import hashlib
import math
import os
import re

import numpy as np
import pytest
from minitensor.ops.loss import cross_entropy

import minitensor as mt
from minitensor.data import (
    EXAMPLE_TEXT,
    TEXTS,
    TextDecodeError,
    char_lm_corpus,
    read_parallel_corpus,
    read_text,
    unigram_baseline,
)

# D2L checks its download of timemachine.txt against this SHA-1 (DATA_HUB["time_machine"]):
# the shipped file is that file, byte for byte.
D2L_TIME_MACHINE_SHA1 = "090b5e7e70c295757f55df93cb0a180b9691891a"


# -- the example text ------------------------------------------------------------------------------


def test_example_text_is_d2ls_time_machine_with_its_readme():
    data = open(EXAMPLE_TEXT, "rb").read()
    assert TEXTS["time_machine"] == EXAMPLE_TEXT and os.path.isabs(EXAMPLE_TEXT)
    assert len(data) <= 200_000
    assert hashlib.sha1(data).hexdigest() == D2L_TIME_MACHINE_SHA1
    text = data.decode("utf-8")
    assert text.isascii() and "\r" not in text and "Gutenberg" not in text
    assert text.startswith("The Time Machine, by H. G. Wells [1898]\n") and text.endswith("in the heart\nof man.\n")
    words = collections.Counter(re.findall(r"[a-z]+", text.lower()))
    assert [w for w, _ in words.most_common(5)] == ["the", "i", "and", "of", "a"]  # English prose
    readme = open(os.path.join(os.path.dirname(EXAMPLE_TEXT), "README.md"), encoding="utf-8").read()
    for fact in (
        "public domain",
        "H. G. Wells",
        "Project Gutenberg eBook #35",
        D2L_TIME_MACHINE_SHA1,
        "header and footer",
        f"{len(data):,} bytes",
    ):
        assert fact in readme


def test_char_lm_corpus_reads_the_example_text():
    corpus, vocab = char_lm_corpus(EXAMPLE_TEXT)
    assert len(corpus) == 178_979 and "".join(vocab.to_tokens(corpus[:16])) == "The Time Machine"
    assert vocab.unk not in corpus
    split = int(len(corpus) * 0.9)  # the numbers unigram_baseline's docstring quotes
    assert len(vocab) == 74 and unigram_baseline(corpus[:split], corpus[split:], len(vocab)) == pytest.approx(
        3.08, abs=0.005
    )


# -- the unigram baseline --------------------------------------------------------------------------


def test_unigram_baseline_by_hand():
    # V = 4; train counts: token 0 twice, token 1 once, tokens 2 and 3 never (3 tokens in all)
    # p(0) = (2 + 1) / (3 + 4) = 3/7, p(2) = (0 + 1) / 7 = 1/7
    # baseline = -(ln 3/7 + ln 1/7) / 2 = ln 7 - (ln 3) / 2
    assert unigram_baseline([0, 0, 1], [0, 2], vocab_size=4) == pytest.approx(math.log(7) - math.log(3) / 2)
    # nothing to count: every token gets 1/V, the loss of a uniform guess
    assert unigram_baseline([], [1, 2, 3], vocab_size=5) == pytest.approx(math.log(5))


def test_unigram_baseline_is_the_loss_of_a_model_that_predicts_the_frequencies():
    """Same units as a model's loss: cross_entropy of logits that are the smoothed log
    frequencies, at every held-out position, is the baseline."""
    rng = np.random.default_rng(0)
    train, heldout = rng.integers(0, 6, 50), rng.integers(0, 6, 20)
    log_p = np.log(np.bincount(train, minlength=8) + 1.0) - np.log(len(train) + 8)
    logits = mt.tensor(np.tile(log_p, (len(heldout), 1)))
    expected = cross_entropy(logits, mt.tensor(heldout)).item()
    assert unigram_baseline(train, heldout, vocab_size=8) == pytest.approx(expected)


def test_unigram_baseline_refuses_what_it_cannot_score():
    with pytest.raises(ValueError, match="held-out set is empty"):
        unigram_baseline([0, 1], [], vocab_size=3)
    with pytest.raises(ValueError, match=r"heldout holds index 3, outside a vocabulary of 3 \(indices 0 to 2\)"):
        unigram_baseline([0, 1], [1, 3], vocab_size=3)
    with pytest.raises(ValueError, match="train holds index -1"):
        unigram_baseline([-1], [1], vocab_size=3)


# -- a path is a path ------------------------------------------------------------------------------


def test_a_path_is_read_as_a_file_and_text_is_given_as_text(tmp_path, monkeypatch):
    path = tmp_path / "play.txt"
    path.write_text("to be or not", encoding="utf-8")
    corpus, vocab = char_lm_corpus(path)
    assert "".join(vocab.to_tokens(corpus)) == "to be or not"
    assert char_lm_corpus(str(path))[0] == corpus
    # text= is the text, even when it happens to name a file
    assert "".join(char_lm_corpus(text=str(path))[1].to_tokens(char_lm_corpus(text=str(path))[0])) == str(path)
    # a missing file is an error naming it, never the path string read as the text
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^missing\.txt: no such text file$"):
        char_lm_corpus("missing.txt")
    with pytest.raises(IsADirectoryError, match=re.escape(f"{tmp_path}: is a folder")):
        char_lm_corpus(tmp_path)
    with pytest.raises(
        TypeError, match=r"give the path of a text file, or the text itself as text=\.\.\. \(got both\)"
    ):
        char_lm_corpus(path, text="abc")
    with pytest.raises(TypeError, match=r"\(got neither\)"):
        char_lm_corpus()
    with pytest.raises(TypeError, match="must be a path"):
        char_lm_corpus(42)


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_a_device_is_not_a_text_file():
    with pytest.raises(ValueError, match="^/dev/null: not a regular file"):
        char_lm_corpus("/dev/null")
    with pytest.raises(ValueError, match="^/dev/null: not a regular file"):
        read_parallel_corpus("/dev/null")


def test_max_chars_must_be_positive(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abcdef", encoding="utf-8")
    assert len(char_lm_corpus(path, max_chars=3)[0]) == len(char_lm_corpus(text="abcdef", max_chars=3)[0]) == 3
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_chars must be a positive integer"):
            char_lm_corpus(path, max_chars=bad)
        with pytest.raises(ValueError, match="max_chars must be a positive integer"):
            char_lm_corpus(text="abcdef", max_chars=bad)


# -- bytes that are not text -----------------------------------------------------------------------


def test_a_byte_that_is_not_utf8_is_one_line_naming_file_line_and_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    # "été" saved as Latin-1 on line 3: 0xe9 is not UTF-8; line 2's "café" is proper UTF-8
    data = b"first line\ncaf\xc3\xa9\tcoffee\n\xe9t\xe9\tsummer\n"
    path.write_bytes(data)
    offset = data.index(b"\xe9t")
    message = (
        f"{path}, line 3: byte 0xe9 at byte offset {offset} is not valid utf-8 "
        "(was the file saved in another encoding? save it again as utf-8)"
    )
    for read in (char_lm_corpus, read_parallel_corpus):
        with pytest.raises(TextDecodeError) as info:
            read(path)
        assert str(info.value) == message
        assert (info.value.path, info.value.line, info.value.offset) == (str(path), 3, offset)
    assert isinstance(info.value, ValueError)
    # the same file read in the encoding it was saved in
    assert read_text(path, encoding="latin-1").splitlines()[2] == "\xe9t\xe9\tsummer"


def test_a_multibyte_character_cut_at_the_end_of_the_file(tmp_path):
    path = tmp_path / "cut.txt"
    path.write_bytes("ab\ncd \u20ac".encode("utf-8")[:-1])  # the euro sign loses its last byte
    with pytest.raises(TextDecodeError, match=r"cut\.txt, line 2: byte 0xe2 at byte offset 6 is not valid utf-8"):
        char_lm_corpus(path)


def test_windows_line_ends_and_byte_order_mark_read_as_plain_text(tmp_path):
    path = tmp_path / "notepad.txt"
    path.write_bytes(b"\xef\xbb\xbfGo.\tVa !\r\nHi.\tSalut.\r\n")
    assert read_text(path) == "Go.\tVa !\nHi.\tSalut.\n"
    assert read_parallel_corpus(path) == [(["go", "."], ["va", "!"]), (["hi", "."], ["salut", "."])]
    corpus, vocab = char_lm_corpus(path)
    assert "\ufeff" not in vocab and "\r" not in vocab


# -- empty and too short ---------------------------------------------------------------------------


def test_empty_and_one_character_files_are_refused_with_the_count(tmp_path):
    empty, one = tmp_path / "empty.txt", tmp_path / "one.txt"
    empty.write_bytes(b"")
    one.write_bytes(b"x")
    with pytest.raises(ValueError, match=re.escape(f"{empty}: 0 characters; a language model needs at least 2")):
        char_lm_corpus(empty)
    with pytest.raises(ValueError, match=re.escape(f"{one}: 1 character; a language model needs at least 2")):
        char_lm_corpus(one)
    with pytest.raises(ValueError, match=re.escape("char_lm_corpus: text= has 0 characters")):
        char_lm_corpus(text="")


def test_a_corpus_without_pairs_is_refused_with_its_line_count(tmp_path):
    empty, prose = tmp_path / "empty.txt", tmp_path / "prose.txt"
    empty.write_bytes(b"")
    prose.write_text("no tabs here\nnor here\njust prose\n", encoding="utf-8")
    with pytest.raises(
        ValueError,
        match=re.escape(f"{empty}: no sentence pairs in its 0 lines; a corpus has one pair a line, source<TAB>target"),
    ):
        read_parallel_corpus(empty)
    with pytest.raises(ValueError, match=re.escape(f"{prose}: no sentence pairs in its 3 lines")):
        read_parallel_corpus(prose)
    with pytest.raises(FileNotFoundError, match="no such corpus file"):
        read_parallel_corpus(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="max_examples must be a positive integer"):
        read_parallel_corpus(prose, max_examples=0)
