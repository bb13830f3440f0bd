"""The corpus: tiny-shakespeare, characters as tokens, a train/val split, and random batches.

nanoGPT's ``data/shakespeare_char/prepare.py`` + ``train.py``'s ``get_batch``:

- the text (1,115,394 characters of Shakespeare's plays; public domain) ships with this package,
  gzip-compressed (434 KB), and its SHA-256 is checked on every load, so a corrupted or swapped
  corpus fails loudly instead of training on the wrong data;
- a *character-level* tokenizer: the vocabulary is the sorted set of characters (65 here), a token
  id is the character's index (``stoi``), decoding maps back (``itos``);
- the first 90% of the token stream trains, the last 10% validates (a contiguous split: the model
  is judged on lines it has never seen, not on shuffled neighbours of training lines);
- a batch is ``batch_size`` random windows of ``block_size + 1`` tokens: inputs ``x = w[:-1]``
  and targets ``y = w[1:]``, both (B, T) int64 (8 bytes per token; at B=64, T=256 that is 128 KiB
  each). Every position is a training example: predict token t+1 from tokens 0..t.

Batches draw from a ``torch.Generator`` that the caller owns, so a resumed run can restore it and
draw exactly the batches the uninterrupted run would have drawn.
"""
from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import torch

CORPUS_PATH = Path(__file__).resolve().parent / "data" / "tinyshakespeare.txt.gz"
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
CORPUS_CHARS = 1_115_394


def load_text(path: str | Path | None = None) -> str:
    """The corpus as a string: the packaged tiny-shakespeare (checked against its SHA-256) or ``path``.

    ``path`` may be a plain UTF-8 text file or a ``.gz`` of one; only the packaged file is checked
    against a known hash.
    """
    if path is not None and not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str, a Path or None, got {type(path).__name__}")
    packaged = path is None or str(path) == ""
    file = CORPUS_PATH if packaged else Path(path)
    if not file.is_file():
        raise ValueError(f"corpus file {str(file)!r} does not exist")
    raw = file.read_bytes()
    if file.suffix == ".gz":
        raw = gzip.decompress(raw)
    if packaged:
        digest = hashlib.sha256(raw).hexdigest()
        if digest != CORPUS_SHA256:
            raise ValueError(f"the packaged corpus {file} is corrupted: sha256 {digest}, "
                             f"expected {CORPUS_SHA256}")
    text = raw.decode("utf-8")
    if len(text) < 2:
        raise ValueError(f"corpus {str(file)!r} has {len(text)} characters; need at least 2")
    return text


class CharTokenizer:
    """Characters as tokens: id = position of the character in the sorted vocabulary."""

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError("text must not be empty: the vocabulary comes from its characters")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.itos = dict(enumerate(self.chars))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise ValueError(f"text has characters outside the vocabulary: {unknown[:10]}")
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < self.vocab_size)]
        if bad:
            raise ValueError(f"token ids must be ints in [0, {self.vocab_size}), got {bad[:5]}")
        return "".join(self.itos[i] for i in ids)

    def state_dict(self) -> dict:
        return {"chars": "".join(self.chars)}

    @classmethod
    def from_state_dict(cls, state: dict) -> "CharTokenizer":
        return cls(state["chars"])


def encode_corpus(text: str, tokenizer: CharTokenizer) -> torch.Tensor:
    """The whole text as a (N,) int64 tensor of token ids (8 bytes per character: 8.9 MB here)."""
    lookup = torch.full((max(map(ord, tokenizer.chars)) + 1,), -1, dtype=torch.int64)
    for c, i in tokenizer.stoi.items():
        lookup[ord(c)] = i
    codes = torch.tensor([ord(c) for c in text], dtype=torch.int64) if text else torch.empty(0, dtype=torch.int64)
    if codes.numel() and (codes.max() >= lookup.numel() or (lookup[codes] < 0).any()):
        raise ValueError("text has characters outside the tokenizer's vocabulary")
    return lookup[codes]


def train_val_split(data: torch.Tensor, train_fraction: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val): the first ``int(train_fraction * N)`` tokens and the rest (views, no copy)."""
    if not isinstance(data, torch.Tensor) or data.dim() != 1:
        raise ValueError(f"data must be a 1-d tensor of token ids, got "
                         f"{tuple(data.shape) if isinstance(data, torch.Tensor) else type(data).__name__}")
    if not isinstance(train_fraction, float) or not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be a float in (0, 1), got {train_fraction!r}")
    n = int(train_fraction * data.numel())
    return data[:n], data[n:]


def get_batch(data: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator | None = None,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows of ``data``: inputs x and next-token targets y, each (B, T) int64."""
    if not isinstance(data, torch.Tensor) or data.dim() != 1:
        raise ValueError("data must be a 1-d tensor of token ids")
    for name, v in (("batch_size", batch_size), ("block_size", block_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if data.numel() < block_size + 1:
        raise ValueError(f"data has {data.numel()} tokens; a window of block_size + 1 = {block_size + 1} "
                         f"does not fit")
    ix = torch.randint(data.numel() - block_size, (batch_size,), generator=generator)   # (B,) starts
    offsets = torch.arange(block_size + 1)                                               # (T + 1,)
    windows = data[ix[:, None] + offsets[None, :]].to(torch.int64)                       # (B, T + 1) gather
    x, y = windows[:, :-1], windows[:, 1:]
    if torch.device(device).type == "cuda":  # pinned + non_blocking: the copy overlaps the GPU's work
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous(), y.contiguous()


def load_corpus(path: str | Path | None = None, train_fraction: float = 0.9):
    """(tokenizer, train, val) for the packaged corpus or ``path``."""
    text = load_text(path)
    tokenizer = CharTokenizer(text)
    train, val = train_val_split(encode_corpus(text, tokenizer), train_fraction)
    return tokenizer, train, val
