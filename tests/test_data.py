"""minitensor.data: Vocab, the generated tasks, the parallel-corpus reader, batching."""

import calendar
import datetime
import itertools
import json
import pathlib
import re

import numpy as np
import pytest

import minitensor as mt
from minitensor.data import (
    DATE_FORMATS,
    Batches,
    Vocab,
    all_dates,
    batches,
    build_array,
    build_vocabs,
    char_lm_corpus,
    copy_task,
    date_pairs,
    date_task,
    format_date,
    lm_arrays,
    preprocess,
    read_parallel_corpus,
    reverse_task,
    seq2seq_arrays,
    sort_task,
    train_heldout_split,
    truncate_pad,
)

SAMPLE = pathlib.Path(__file__).parent / "data" / "fra_eng_sample.txt"


# -- Vocab ----------------------------------------------------------------------------------------


def test_vocab_reserved_first_then_by_frequency_then_alphabetically():
    vocab = Vocab([["b", "a", "c"], ["c", "b", "d"], ["c"]])
    assert vocab.idx_to_token == ["<pad>", "<bos>", "<eos>", "<unk>", "c", "b", "a", "d"]
    assert (vocab.pad, vocab.bos, vocab.eos, vocab.unk) == (0, 1, 2, 3)
    assert len(vocab) == 8
    assert all(vocab.token_to_idx[t] == i for i, t in enumerate(vocab.idx_to_token))


def test_vocab_order_does_not_depend_on_input_order():
    tokens = list("the quick brown fox jumps over the lazy dog")
    assert Vocab(tokens).idx_to_token == Vocab(tokens[::-1]).idx_to_token


def test_vocab_min_freq_drops_rare_tokens_to_unk():
    vocab = Vocab(list("aaabbc"), min_freq=2)
    assert "a" in vocab and "b" in vocab and "c" not in vocab
    assert vocab["c"] == vocab.unk
    assert Vocab(list("aaabbc"), min_freq=0)["c"] != Vocab(list("aaabbc")).unk


def test_vocab_lookup_of_lists_and_unknown_tokens():
    vocab = Vocab([["g", "o"], ["h", "i"]])
    assert vocab[["g", "o", "?"]] == [vocab["g"], vocab["o"], vocab.unk]
    assert vocab[("h", ["i", "zz"])] == [vocab["h"], [vocab["i"], vocab.unk]]
    assert vocab["<eos>"] == vocab.eos


def test_vocab_to_tokens_accepts_ints_lists_arrays_and_tensors():
    vocab = Vocab(list("hello"))
    idx = vocab[list("hello")]
    assert vocab.to_tokens(idx) == list("hello")
    assert vocab.to_tokens(np.array(idx)) == list("hello")
    assert vocab.to_tokens(mt.tensor(idx)) == list("hello")
    assert vocab.to_tokens(idx[0]) == "h"
    assert vocab.to_tokens([idx[0]]) == ["h"]  # a one-element list stays a list (unlike D2L)
    for wrong in (len(vocab), -1):  # -1 is no token, though a list's index -1 is its last
        with pytest.raises(
            IndexError, match=f"Vocab.to_tokens: index {wrong} is outside the vocabulary of {len(vocab)}"
        ):
            vocab.to_tokens([idx[0], wrong])


def test_vocab_reserved_tokens_are_configurable_and_unk_always_exists():
    vocab = Vocab(list("ab"), reserved_tokens=["<pad>"])
    assert vocab.idx_to_token[:2] == ["<pad>", "<unk>"]
    assert vocab["zzz"] == vocab.unk == 1
    with pytest.raises(KeyError, match="<bos>"):
        vocab.bos
    with pytest.raises(ValueError, match="duplicates"):
        Vocab([], reserved_tokens=["<pad>", "<pad>"])
    # A corpus token equal to a reserved one does not get a second index.
    assert Vocab(["<pad>", "x"]).idx_to_token == ["<pad>", "<bos>", "<eos>", "<unk>", "x"]


def test_vocab_round_trips_through_json():
    vocab = Vocab([list("abracadabra"), list("cab")], min_freq=2)
    again = Vocab.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert again == vocab
    assert again.idx_to_token == vocab.idx_to_token and again.token_to_idx == vocab.token_to_idx
    assert (again.pad, again.bos, again.eos, again.unk) == (vocab.pad, vocab.bos, vocab.eos, vocab.unk)
    assert again[list("abcz")] == vocab[list("abcz")]
    assert Vocab(list("ab")) != Vocab(list("abc"))


def test_vocab_decode_stops_at_eos_and_drops_padding_and_bos():
    vocab = Vocab(list("abc"))
    seq = [vocab.bos, vocab["a"], vocab.pad, vocab["b"], vocab.eos, vocab["c"]]
    assert vocab.decode(seq) == ["a", "b"]
    assert vocab.decode(np.array(seq)) == ["a", "b"]


def test_build_vocabs_one_per_side():
    src, tgt = build_vocabs([(list("ab"), list("xy")), (list("a"), list("z"))])
    assert "a" in src and "x" not in src and "x" in tgt and "a" not in tgt


# -- date normalisation: an independent reader ------------------------------------------------------
# It knows nothing of tasks.py: month names come from the standard library's English calendar
# (the C locale), and the conventions are the documented ones: "/" month first, "." day first,
# "-" and 8 digits year first, two-digit years 50-99 -> 19xx and 00-49 -> 20xx.

MONTH_NUMBER = {}
for _m in range(1, 13):
    MONTH_NUMBER[calendar.month_name[_m].lower()] = _m
    MONTH_NUMBER[calendar.month_abbr[_m].lower()] = _m
WEEKDAY_NUMBER = {calendar.day_name[i].lower(): i for i in range(7)}


def expand_year(text):
    y = int(text)
    if len(text) == 4:
        return y
    assert len(text) == 2, text
    return 1900 + y if y >= 50 else 2000 + y


def read_date(s):
    """-> (datetime.date, kind): what ``s`` means and a label of how it was written.

    The label is coarse (zero padding is not told apart), so counting labels under-counts
    formats: a safe lower bound."""
    if m := re.fullmatch(r"(\d{4})(\d{2})(\d{2})", s):
        return datetime.date(int(m[1]), int(m[2]), int(m[3])), "yyyymmdd"
    if m := re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", s):
        return datetime.date(int(m[1]), int(m[2]), int(m[3])), "iso"
    if m := re.fullmatch(r"(\d{1,2})/(\d{1,2})/(\d{2}|\d{4})", s):
        return datetime.date(expand_year(m[3]), int(m[1]), int(m[2])), f"us/{len(m[3])}"
    if m := re.fullmatch(r"(\d{1,2})\.(\d{1,2})\.(\d{2}|\d{4})", s):
        return datetime.date(expand_year(m[3]), int(m[2]), int(m[1])), f"eu/{len(m[3])}"
    # Words: [Weekday,] and a day, a month name and a year in either order, maybe "3rd of".
    case = "upper" if s.isupper() else "lower" if s.islower() else "title"
    words = s.lower().replace(",", " ").split()
    weekday = WEEKDAY_NUMBER.get(words[0])
    if weekday is not None:
        words = words[1:]
    ordinal = "of" in words
    words = [w for w in words if w != "of"]
    assert len(words) == 3, s
    month_pos = next(i for i, w in enumerate(words) if w in MONTH_NUMBER)
    month_word = words.pop(month_pos)
    day_text, year_text = words
    if ordinal:
        assert re.fullmatch(r"\d{1,2}(st|nd|rd|th)", day_text), s
        day_text = day_text[:-2]
    date = datetime.date(expand_year(year_text), MONTH_NUMBER[month_word], int(day_text))
    if weekday is not None:
        assert date.weekday() == weekday, f"{s!r}: wrong weekday"
    style = "full" if month_word in (calendar.month_name[m].lower() for m in range(1, 13)) else "abbr"
    kind = f"words/{case}/{style}/month@{month_pos}/{len(year_text)}/{'weekday' if weekday is not None else ''}"
    return date, kind + ("/ordinal" if ordinal else "")


def joined(pairs):
    return [("".join(s), "".join(t)) for s, t in pairs]


def test_every_generated_source_means_its_target():
    mt.manual_seed(0)
    train, held = date_task(3000, num_heldout=1000)
    assert len(train) == 3000 and len(held) == 1000
    for src, tgt in joined(train + held):
        date, _ = read_date(src)
        assert date.isoformat() == tgt, (src, tgt)


def test_every_format_reads_back_on_edge_dates():
    edges = [
        datetime.date(*d)
        for d in [
            (1950, 1, 1),
            (1999, 12, 31),
            (2000, 1, 1),
            (2000, 2, 29),
            (2001, 11, 12),
            (2023, 3, 13),
            (2049, 12, 31),
            (1963, 8, 22),
        ]
    ]
    for date in edges:
        for fmt in DATE_FORMATS:
            assert read_date(format_date(date, fmt))[0] == date, (fmt, format_date(date, fmt))


def test_at_least_ten_formats_are_actually_produced():
    mt.manual_seed(1)
    kinds = {read_date(src)[1] for src, _ in joined(date_task(2000, num_heldout=10)[0])}
    assert len(kinds) >= 10, sorted(kinds)
    # and every named format writes the same date differently
    september = datetime.date(2021, 9, 3)  # "May" has no shorter abbreviation; "Sep" has
    assert len({format_date(september, f) for f in DATE_FORMATS}) == len(DATE_FORMATS) >= 10
    date = datetime.date(2021, 5, 3)
    assert format_date(date, "weekday_month_d_yyyy") == "Monday, May 3, 2021"
    assert format_date(date, "ordinal_of_month_yyyy") == "3rd of May 2021"
    assert format_date(date, "lower_d_month_yy") == "3 may 21"


def test_ordinal_suffixes():
    days = {
        1: "1st",
        2: "2nd",
        3: "3rd",
        4: "4th",
        11: "11th",
        12: "12th",
        13: "13th",
        21: "21st",
        22: "22nd",
        23: "23rd",
        31: "31st",
    }
    for day, text in days.items():
        assert format_date(datetime.date(2021, 1, day), "ordinal_of_month_yyyy").startswith(text + " of")


def test_two_digit_years_follow_the_century_rule():
    mt.manual_seed(2)
    two_digit = ["lower_d_month_yy", "m/d/yy", "dd.mm.yy"]
    train, _ = date_task(2000, num_heldout=10, formats=two_digit)
    seen = set()
    for src, tgt in joined(train):
        yy = int(re.findall(r"\d+", src)[-1])
        assert len(re.findall(r"\d+", src)[-1]) == 2
        assert tgt[:2] == ("19" if yy >= 50 else "20") and int(tgt[2:4]) == yy, (src, tgt)
        seen.add(tgt[:2])
    assert seen == {"19", "20"}


def test_dates_cover_1950_to_2049_and_targets_are_iso():
    dates = all_dates()
    assert dates[0] == datetime.date(1950, 1, 1) and dates[-1] == datetime.date(2049, 12, 31)
    assert len(dates) == len(set(dates)) == 36525
    mt.manual_seed(3)
    for _, tgt in joined(date_task(500, 100)[0]):
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", tgt) and "1950" <= tgt[:4] <= "2049"


def test_heldout_dates_are_disjoint_from_training_dates():
    mt.manual_seed(4)
    train, held = date_task(20000)  # default: 1,000 held-out dates
    held_dates = {t for _, t in joined(held)}
    train_dates = {t for _, t in joined(train)}
    assert len(held) == len(held_dates) == 1000
    assert not held_dates & train_dates
    assert len(train_dates) > 10000  # and training really covers the calendar


def test_date_task_is_reproducible_from_the_seed():
    mt.manual_seed(5)
    a = date_task(300, 50)
    mt.manual_seed(5)
    b = date_task(300, 50)
    assert a == b
    assert date_task(300, 50, rng=np.random.default_rng(9)) == date_task(300, 50, rng=np.random.default_rng(9))
    assert date_task(300, 50, rng=np.random.default_rng(9)) != date_task(300, 50, rng=np.random.default_rng(10))


def test_date_pairs_are_character_tokens():
    src, tgt = date_pairs([datetime.date(2021, 5, 3)], rng=np.random.default_rng(0), formats=["month_d_yyyy"])[0]
    assert src == list("May 3, 2021") and tgt == list("2021-05-03")
    with pytest.raises(ValueError, match="unknown date format"):
        format_date(datetime.date(2021, 5, 3), "dd/mm/yyyy")


# -- reverse, copy, sort -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "task, expected",
    [
        (reverse_task, lambda s: s[::-1]),
        (copy_task, lambda s: s),
        (sort_task, sorted),
    ],
)
def test_toy_task_targets(task, expected):
    pairs = task(500, min_len=2, max_len=7, rng=np.random.default_rng(0))
    assert len(pairs) == 500
    assert {len(s) for s, _ in pairs} == set(range(2, 8))
    for src, tgt in pairs:
        assert tgt == expected(src)
        assert set(src) <= set("abcdefghij")
    assert task(50, rng=np.random.default_rng(1)) == task(50, rng=np.random.default_rng(1))
    assert any(s != t for s, t in pairs) or task is copy_task


def test_sort_follows_the_alphabet_order_not_string_order():
    alphabet = [str(i) for i in range(12)]
    for src, tgt in sort_task(100, 5, 9, alphabet=alphabet, rng=np.random.default_rng(2)):
        assert [int(t) for t in tgt] == sorted(int(t) for t in src)


def test_toy_tasks_follow_manual_seed_and_check_lengths():
    mt.manual_seed(7)
    a = reverse_task(20)
    mt.manual_seed(7)
    assert reverse_task(20) == a
    with pytest.raises(ValueError, match="min_len"):
        copy_task(5, min_len=4, max_len=3)


# -- character language model --------------------------------------------------------------------------


def test_char_lm_corpus_from_text_and_from_files(tmp_path):
    text = "To be, or not to be:\nthat is the question.\n"
    corpus, vocab = char_lm_corpus(text=text)
    assert "".join(vocab.to_tokens(corpus)) == text
    path = tmp_path / "play.txt"
    path.write_text(text, encoding="utf-8")
    assert char_lm_corpus(path)[0] == corpus
    assert char_lm_corpus(str(path))[0] == corpus
    assert len(char_lm_corpus(path, max_chars=5)[0]) == 5
    X, Y = lm_arrays(corpus, num_steps=8)
    assert X.shape == Y.shape == (len(text) - 8, 8)
    assert (X[:, 1:] == Y[:, :-1]).all() and list(X[3]) == corpus[3:11] and list(Y[3]) == corpus[4:12]


# -- parallel corpus -------------------------------------------------------------------------------------


def d2l_reference(raw_text):
    """D2L 10.5's _preprocess and _tokenize, transcribed (<eos> left off, and the attribution
    column of the newer Tatoeba files dropped, as read_parallel_corpus does)."""
    text = raw_text.replace("\u202f", " ").replace("\xa0", " ")
    no_space = lambda char, prev_char: char in ",.!?" and prev_char != " "  # noqa: E731
    text = "".join(
        [" " + char if i > 0 and no_space(char, text[i - 1]) else char for i, char in enumerate(text.lower())]
    )
    pairs = []
    for line in text.split("\n"):
        parts = line.split("\t")
        if len(parts) >= 2:
            pairs.append(([t for t in parts[0].split(" ") if t], [t for t in parts[1].split(" ") if t]))
    return pairs


def test_preprocess_follows_d2l_rules():
    assert preprocess("Go.") == "go ."
    assert preprocess("J'ai perdu.") == "j'ai perdu ."
    assert preprocess("Cours\u202f!") == "cours !"  # narrow no-break space -> space, no second one
    assert preprocess("Qui\xa0?") == "qui ?"
    assert preprocess("Deux\xa0mots\u202fici") == "deux mots ici"
    assert preprocess("Wait, what?") == "wait , what ?"
    assert preprocess("No way!!") == "no way ! !"
    assert preprocess("Hello,world!") == "hello ,world !"  # D2L only separates what precedes


def test_sample_corpus_tokens():
    pairs = read_parallel_corpus(SAMPLE)
    assert pairs[0] == (["go", "."], ["va", "!"])  # attribution column ignored
    assert (["run", "!"], ["courez", "!"]) in pairs
    assert (["i'm", "home", "."], ["je", "suis", "chez", "moi", "."]) in pairs  # CRLF line
    assert (["two", "spaces", "here", "."], ["deux", "espaces", "ici", "."]) in pairs
    assert (["wow", "!"], ["ça", "alors", "!"]) in pairs
    assert not any("single" in src for src, _ in pairs)  # a line without a tab is skipped
    assert len(pairs) == 16
    assert pairs == d2l_reference(SAMPLE.read_text(encoding="utf-8"))


def test_max_examples_keeps_the_first_pairs():
    assert read_parallel_corpus(SAMPLE, max_examples=3) == read_parallel_corpus(SAMPLE)[:3]


def test_heldout_split_is_seeded_and_keeps_source_sentences_apart():
    pairs = read_parallel_corpus(SAMPLE)
    for seed in range(20):
        train, held = train_heldout_split(pairs, heldout=4, rng=np.random.default_rng(seed))
        assert len(train) + len(held) == len(pairs) and len(held) >= 4
        assert sorted(map(str, train + held)) == sorted(map(str, pairs))
        assert not {tuple(s) for s, _ in train} & {tuple(s) for s, _ in held}
    a = train_heldout_split(pairs, 0.25, rng=np.random.default_rng(1))
    assert a == train_heldout_split(pairs, 0.25, rng=np.random.default_rng(1))
    assert len(a[1]) >= 4


# -- batching ------------------------------------------------------------------------------------------


def test_truncate_pad():
    assert truncate_pad([1, 2, 3], 5, 0) == [1, 2, 3, 0, 0]
    assert truncate_pad([1, 2, 3], 2, 0) == [1, 2]
    assert truncate_pad([1, 2], 2, 0) == [1, 2]
    assert truncate_pad([1, 2], 0, 0) == []
    with pytest.raises(ValueError, match="truncate_pad: num_steps must be >= 0, got -1"):
        truncate_pad([1, 2, 3], -1, 0)  # line[:-1] would give [1, 2]


def test_build_array_appends_eos_pads_and_counts_valid_positions():
    vocab = Vocab(list("abc"))
    array, valid_lens = build_array([list("ab"), list("abcab"), []], vocab, num_steps=4)
    a, b = vocab["a"], vocab["b"]
    assert array.dtype == np.int64 and valid_lens.dtype == np.int64
    assert array.tolist() == [[a, b, vocab.eos, vocab.pad], [a, b, vocab["c"], a], [vocab.eos, 0, 0, 0]]
    assert valid_lens.tolist() == [3, 4, 1]
    assert (valid_lens == (array != vocab.pad).sum(1)).all()


def test_seq2seq_arrays_for_teacher_forcing():
    pairs = [(["he's", "calm", "."], ["il", "est", "calme", "."]), (["go", "."], ["va", "!"])]
    src, tgt = build_vocabs(pairs)
    enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y = seq2seq_arrays(pairs, src, tgt, num_steps=5, tgt_num_steps=6)
    assert enc_X.shape == (2, 5) and dec_X.shape == Y.shape == (2, 6)
    assert enc_valid_lens.tolist() == [4, 3] and dec_valid_lens.tolist() == [5, 3]
    assert tgt.to_tokens(Y[0]) == ["il", "est", "calme", ".", "<eos>", "<pad>"]
    assert tgt.to_tokens(dec_X[0]) == ["<bos>", "il", "est", "calme", ".", "<eos>"]
    assert tgt.to_tokens(dec_X[1])[:3] == ["<bos>", "va", "!"]
    assert (dec_X[:, 0] == tgt.bos).all() and (dec_X[:, 1:] == Y[:, :-1]).all()
    # the decoder's valid inputs are exactly the non-padding targets
    assert (dec_valid_lens == (Y != tgt.pad).sum(1)).all()


def test_batches_visit_every_example_once_per_epoch(device):
    data = np.arange(23 * 3, dtype=np.int64).reshape(23, 3)
    lens = np.arange(23)
    loader = Batches(data, lens, batch_size=5, device=device, rng=np.random.default_rng(0))
    assert len(loader) == 5
    seen = []
    for X, L in loader:
        assert X.device == device and X.dtype == mt.int64 and X.shape[1] == 3
        assert (X.numpy()[:, 0] // 3 == L.numpy()).all()  # rows stay aligned across arrays
        seen += L.numpy().tolist()
    assert sorted(seen) == list(range(23)) and seen != list(range(23))
    assert [b[0].shape[0] for b in loader] == [5, 5, 5, 5, 3]
    assert len(Batches(data, batch_size=5, drop_last=True)) == 4
    assert [b[0].shape[0] for b in Batches(data, batch_size=5, drop_last=True)] == [5] * 4


def test_batches_order_is_seeded_and_changes_between_epochs():
    data = np.arange(40)
    mt.manual_seed(11)
    a = Batches(data, batch_size=8)
    mt.manual_seed(11)
    b = Batches(data, batch_size=8)
    first_a, first_b = epoch_rows_1d(a), epoch_rows_1d(b)
    assert first_a == first_b
    assert epoch_rows_1d(a) != first_a  # a new epoch, a new order
    mt.manual_seed(12)
    assert epoch_rows_1d(Batches(data, batch_size=8)) != first_a
    assert epoch_rows_1d(Batches(data, batch_size=8, shuffle=False)) == list(range(40))
    assert [t.numpy().tolist() for (t,) in batches(data, batch_size=8, rng=np.random.default_rng(0))] == [
        t.numpy().tolist() for (t,) in batches(data, batch_size=8, rng=np.random.default_rng(0))
    ]


def epoch_rows_1d(loader):
    return [v for (t,) in loader for v in t.numpy().tolist()]


def test_batches_resume_from_a_saved_state():
    data = np.arange(30)
    loader = Batches(data, batch_size=4, rng=np.random.default_rng(3))
    epoch_rows_1d(loader)  # epoch 0
    taken = list(itertools.islice(loader, 3))  # 3 batches into epoch 1
    state = json.loads(json.dumps(loader.state_dict()))
    rest = epoch_rows_1d(loader)
    nxt = epoch_rows_1d(loader)  # epoch 2

    resumed = Batches(data, batch_size=4, rng=np.random.default_rng(99))
    resumed.load_state_dict(state)
    assert epoch_rows_1d(resumed) == rest
    assert epoch_rows_1d(resumed) == nxt
    assert sorted([v for (t,) in taken for v in t.numpy().tolist()] + rest) == list(range(30))


def test_an_epoch_taken_exactly_by_islice_still_rolls_over():
    # islice never asks for the batch after the last, so the generator never finishes.
    loader = Batches(np.arange(12), batch_size=4, rng=np.random.default_rng(0))
    first = [t.numpy().tolist() for (t,) in itertools.islice(loader, 3)]
    second = [t.numpy().tolist() for (t,) in loader]
    assert len(second) == 3 and first != second
    assert loader.state_dict()["epoch"] == 1


def test_batches_draw_epoch_size_examples_with_replacement():
    """epoch_size: an epoch is that many examples drawn at random (nanoGPT's windows that start
    anywhere), seeded per epoch and resumable like a permutation."""
    windows, _ = lm_arrays(np.arange(1000), 8)  # every window of the text: 992 views, no copy
    assert np.shares_memory(windows, windows[5])
    loader = Batches(windows, batch_size=4, epoch_size=10, rng=np.random.default_rng(0))
    assert len(loader) == 3
    first = [t.numpy() for (t,) in loader]
    assert [len(t) for t in first] == [4, 4, 2]
    starts = np.concatenate(first)[:, 0]
    assert (np.concatenate(first) == starts[:, None] + np.arange(8)).all()  # whole windows
    assert (starts % 8 != 0).any()  # windows start anywhere, not at multiples of 8
    second = [t.numpy() for (t,) in loader]
    assert not all(np.array_equal(a, b) for a, b in zip(first, second))  # a new epoch, new draws
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = Batches(windows, batch_size=4, epoch_size=10, rng=np.random.default_rng(7))
    resumed.load_state_dict(state)
    assert [t.numpy().tolist() for (t,) in loader] == [t.numpy().tolist() for (t,) in resumed]
    with pytest.raises(ValueError, match="epoch_size"):
        Batches(windows, batch_size=4, epoch_size=10, shuffle=False)


def test_batches_checks_its_arrays():
    with pytest.raises(ValueError, match="differ in length"):
        Batches(np.zeros(3), np.zeros(4), batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        Batches(np.zeros(3), batch_size=0)


def test_date_task_end_to_end_into_minibatches():
    mt.manual_seed(0)
    train, _ = date_task(64, num_heldout=10)
    src_vocab, tgt_vocab = build_vocabs(train)
    arrays = seq2seq_arrays(train, src_vocab, tgt_vocab, num_steps=30, tgt_num_steps=11)
    for enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y in Batches(*arrays, batch_size=16):
        assert enc_X.shape == (16, 30) and Y.shape == dec_X.shape == (16, 11)
        assert (dec_valid_lens.numpy() == 11).all()  # 10 characters + <eos>
        for row, n in zip(enc_X.numpy(), enc_valid_lens.numpy()):
            assert row[n - 1] == src_vocab.eos and (row[n:] == src_vocab.pad).all()
