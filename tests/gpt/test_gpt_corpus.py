"""The packaged corpus, the tokenizer, the split and the batches."""
import gzip

import pytest
import torch

from ptinternals.gpt import corpus
from ptinternals.gpt.corpus import CharTokenizer, get_batch, load_corpus, load_text, train_val_split


@pytest.fixture(scope="module")
def loaded():
    return load_corpus()


def test_packaged_corpus_is_tiny_shakespeare(loaded):
    tokenizer, train, val = loaded
    assert tokenizer.vocab_size == 65 and train.numel() + val.numel() == corpus.CORPUS_CHARS
    assert train.numel() == int(0.9 * corpus.CORPUS_CHARS) and train.dtype == torch.int64
    assert tokenizer.decode(train[:14]) == "First Citizen:"


def test_corrupted_corpus_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "tinyshakespeare.txt.gz"
    bad.write_bytes(gzip.compress(b"To be, or not to be"))
    monkeypatch.setattr(corpus, "CORPUS_PATH", bad)
    with pytest.raises(ValueError, match="corrupted: sha256"):
        load_text()
    with pytest.raises(ValueError, match="does not exist"):
        load_text(tmp_path / "missing.txt")
    (tmp_path / "own.txt").write_text("hello world")
    assert load_text(tmp_path / "own.txt") == "hello world"  # a user's file is not hash-checked


def test_tokenizer_round_trip_and_errors():
    tok = CharTokenizer("hello world")
    assert tok.vocab_size == 8 and tok.decode(tok.encode("low")) == "low"
    assert CharTokenizer.from_state_dict(tok.state_dict()).chars == tok.chars
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.encode("xyz")
    with pytest.raises(ValueError, match="token ids"):
        tok.decode([99])
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer("")


def test_split_is_contiguous_and_shares_storage():
    data = torch.arange(101)
    train, val = train_val_split(data, 0.9)
    assert train.numel() == 90 and val[0] == 90
    assert train.untyped_storage().data_ptr() == data.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="train_fraction"):
        train_val_split(data, 1.5)
    with pytest.raises(ValueError, match="1-d"):
        train_val_split(data.view(1, -1), 0.9)


def test_batches_are_shifted_windows_and_reproducible():
    data = torch.arange(50)
    x, y = get_batch(data, 5, 7, torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (5, 7) and x.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    x2, _ = get_batch(data, 5, 7, torch.Generator().manual_seed(3))
    assert torch.equal(x, x2)
    x1, y1 = get_batch(torch.arange(8), 3, 7)  # the only window that fits
    assert torch.equal(x1[0], torch.arange(7)) and torch.equal(y1[0], torch.arange(1, 8))
    with pytest.raises(ValueError, match="does not fit"):
        get_batch(torch.arange(7), 1, 7)
    with pytest.raises(ValueError, match="batch_size"):
        get_batch(data, 0, 7)
