"""Data for training: vocabularies, generated tasks, parallel corpora, minibatches.

    from minitensor.data import Vocab, build_vocabs, date_task, seq2seq_arrays, Batches

    train, heldout = date_task(20_000)                 # "May 3, 2021" -> "2021-05-03"
    src_vocab, tgt_vocab = build_vocabs(train)
    arrays = seq2seq_arrays(train, src_vocab, tgt_vocab, num_steps=32, tgt_num_steps=11)
    for enc_X, enc_valid_lens, dec_X, dec_valid_lens, Y in Batches(*arrays, batch_size=64):
        ...

Files: ``vocab.py`` (Vocab), ``tasks.py`` (date, reverse, copy, sort, character LM and its
unigram baseline), ``corpus.py`` (tab-separated translation files, D2L's preprocessing),
``batching.py`` (truncate_pad, build_array, teacher-forcing arrays, seeded resumable
minibatches), ``files.py`` (reading a learner's text files, errors that name file and line),
``bpe.py`` (ByteBPE, a byte-level BPE tokenizer), ``texts/`` (the example text, "The Time
Machine": ``EXAMPLE_TEXT``).
"""

from .batching import Batches, batches, build_array, lm_arrays, seq2seq_arrays, truncate_pad
from .bpe import ByteBPE
from .corpus import parse_parallel_lines, preprocess, read_parallel_corpus, tokenize, train_heldout_split
from .files import TextDecodeError, check_file, open_text, read_text
from .tasks import (
    DATE_FORMATS,
    EXAMPLE_TEXT,
    TEXTS,
    all_dates,
    char_lm_corpus,
    copy_task,
    date_pairs,
    date_task,
    format_date,
    max_lengths,
    reverse_task,
    sort_task,
    unigram_baseline,
)
from .vocab import RESERVED_TOKENS, Vocab, build_vocabs

__all__ = [
    "Batches",
    "ByteBPE",
    "DATE_FORMATS",
    "EXAMPLE_TEXT",
    "RESERVED_TOKENS",
    "TEXTS",
    "TextDecodeError",
    "Vocab",
    "all_dates",
    "batches",
    "build_array",
    "build_vocabs",
    "char_lm_corpus",
    "check_file",
    "copy_task",
    "date_pairs",
    "date_task",
    "format_date",
    "lm_arrays",
    "max_lengths",
    "open_text",
    "parse_parallel_lines",
    "preprocess",
    "read_parallel_corpus",
    "read_text",
    "reverse_task",
    "seq2seq_arrays",
    "sort_task",
    "tokenize",
    "train_heldout_split",
    "truncate_pad",
    "unigram_baseline",
]
