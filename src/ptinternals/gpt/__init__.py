"""The gpt chapter, the capstone: a character-level GPT trained on tiny-shakespeare from the course's parts.

=================  ==============================================================================
``config``         ``GPTConfig``: one flat, typed config; presets ``cpu`` and ``gpu`` (nanoGPT's
                   shakespeare_char); ``apply_overrides`` (``--key=value``, type-checked)
``corpus``         the packaged corpus (sha256-checked), ``CharTokenizer``, 90/10 split, ``get_batch``
``model``          ``GPT`` (nanoGPT's model.py) with the ``kernels`` and ``checkpointing`` switches
``ops``            the kernels chapter's Triton layer norm, softmax and flash attention as custom ops
``reference``      a plain functional forward on a state dict (the tests' and checker's reference)
``loop``           the training loop: lr schedule, evaluation, progress bar, sampling
``train``          the reference train step (AMP, GradScaler, clipping, DDP no_sync), ``train()``,
                   the CLI ``python -m ptinternals.gpt.train``
``checkpoint``     save/resume: model, optimizer, scaler, iteration, every rank's RNG streams
``memory``         the first step's peak allocated/reserved bytes (CUDA stats, or the allocator chapter's model)
``scaffold``       what the capstone notebook's answers may import (config, corpus, loop)
=================  ==============================================================================
"""
import os as _os

import torch as _torch

if not _torch.cuda.is_available():  # before anything imports triton.language (torch.optim.AdamW() does, in
    _os.environ.setdefault("TRITON_INTERPRET", "1")  # torch 2.13): the Triton parts then run interpreted

from .config import PRESETS, GPTConfig, apply_overrides, kernel_parts, make_config, preset
from .corpus import CharTokenizer, get_batch, load_corpus, load_text, train_val_split
from .loop import estimate_loss, fit, generate, lr_at, sample_text
from .model import GPT
from .reference import reference_forward, reference_loss

__all__ = [
    "PRESETS", "GPTConfig", "apply_overrides", "kernel_parts", "make_config", "preset",
    "CharTokenizer", "get_batch", "load_corpus", "load_text", "train_val_split",
    "estimate_loss", "fit", "generate", "lr_at", "sample_text", "GPT", "reference_forward", "reference_loss",
]
