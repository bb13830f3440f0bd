"""What the capstone notebook's answers may import: configuration, corpus, and the training loop.

Scaffolding, not solutions: the grading sandbox has this module (and ``config``, ``corpus``,
``loop`` and the packaged corpus) but not the reference model, kernels, train step or DDP, which
the student writes. Import it as ``ptinternals.gpt.scaffold``; it never imports ``model``,
``ops``, ``train`` or another chapter's reference.
"""
from .config import PRESETS, GPTConfig, apply_overrides, kernel_parts, make_config, preset
from .corpus import CharTokenizer, encode_corpus, get_batch, load_corpus, load_text, train_val_split
from .loop import (
    ProgressBar,
    autocast_context,
    estimate_loss,
    fit,
    generate,
    lr_at,
    make_optimizer,
    new_history,
    sample_text,
)

__all__ = [
    "PRESETS", "GPTConfig", "apply_overrides", "kernel_parts", "make_config", "preset",
    "CharTokenizer", "encode_corpus", "get_batch", "load_corpus", "load_text", "train_val_split",
    "ProgressBar", "autocast_context", "estimate_loss", "fit", "generate", "lr_at", "make_optimizer",
    "new_history", "sample_text",
]
