"""One flat, typed configuration for the capstone GPT, with presets and checked overrides.

nanoGPT keeps its settings as module globals and lets ``configurator.py`` override them from the
command line (``--batch_size=32``), refusing an override whose type differs from the default's.
Here the same idea is a frozen dataclass: every field has a type, ``__post_init__`` checks each
value, and :func:`apply_overrides` parses ``--key=value`` strings with ``ast.literal_eval`` and
type-checks them against the field (an int is accepted where a float is declared, nothing else
converts silently). Flat on purpose: one level, so every knob is one ``--key=value`` away.

Two presets (:data:`PRESETS`):

- ``cpu`` (the defaults): a 2-layer, 128-wide model with a 64-character context that trains to a
  validation loss near 2.0 nats/char in about two minutes on a 2-core laptop CPU, in fp32;
- ``gpu``: nanoGPT's ``config/train_shakespeare_char.py`` exactly (6 layers, 6 heads, 384 wide,
  context 256, batch 64, dropout 0.2, lr 1e-3 decaying to 1e-4 over 5000 iterations, AdamW with
  beta2 0.99, no biases: 10.65 M parameters not counting position embeddings), plus bf16 autocast.

The "course part" switches: ``kernels`` (Triton layer norm / softmax / flash attention as custom
ops, the kernels chapter), ``amp`` (bf16 autocast on a GPU; ignored on the CPU, where bf16 matmuls are
slower than fp32, the amp chapter), ``ddp`` (this course's DistributedDataParallel, the distributed chapter),
``checkpointing`` (activation checkpointing, the autograd chapter), ``memory_report`` (peak allocated and
reserved bytes of a training step, the allocator chapter).
"""
from __future__ import annotations

import ast
import dataclasses
import math
from dataclasses import dataclass, fields

#: The values ``kernels`` may name (comma-separated), besides "none" and "all" (= layernorm,flash).
KERNEL_PARTS = ("layernorm", "softmax", "flash")
AMP_DTYPES = ("bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class GPTConfig:
    # ---- data -------------------------------------------------------------------------------
    data_path: str = ""            # a UTF-8 text file; "" = the packaged tiny-shakespeare (sha256-checked)
    train_fraction: float = 0.9    # first 90% of the characters train, the last 10% validate
    # ---- model (nanoGPT's GPTConfig) --------------------------------------------------------
    vocab_size: int = 0            # 0: set from the corpus (65 characters for tiny-shakespeare)
    block_size: int = 64           # context length T
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128              # C; head size C / n_head
    dropout: float = 0.0
    bias: bool = False             # biases in Linear and LayerNorm (nanoGPT's shakespeare run: False)
    # ---- optimisation -----------------------------------------------------------------------
    batch_size: int = 32           # sequences per micro-batch (per rank)
    grad_accum: int = 1            # micro-batches per optimizer step (per rank)
    max_iters: int = 1000
    learning_rate: float = 3e-3    # peak, after warmup
    min_lr: float = 3e-4           # the cosine ends here (nanoGPT: learning_rate / 10)
    warmup_iters: int = 50
    lr_decay_iters: int = 1000     # cosine from warmup_iters to here, then min_lr
    weight_decay: float = 0.1      # on 2-d weights only (matmuls, embeddings)
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0         # max global grad norm; 0 = off
    # ---- evaluation, logging, sampling -------------------------------------------------------
    eval_interval: int = 200       # evaluate every this many iterations (and at the end)
    eval_iters: int = 20           # batches per split per evaluation
    log_interval: int = 100        # a progress line every this many iterations (when not a terminal)
    progress: bool = True          # print the progress bar / lines
    sample_tokens: int = 300       # characters sampled after training (0 = none)
    temperature: float = 0.8
    top_k: int = 0                 # 0 = sample from the whole distribution
    # ---- course parts ------------------------------------------------------------------------
    kernels: str = "none"          # "none" | "all" | comma-separated from KERNEL_PARTS
    amp: bool = False              # autocast (amp_dtype) on CUDA; fp32 on the CPU
    amp_dtype: str = "bfloat16"    # "float16" also turns the GradScaler on
    ddp: bool = False              # DistributedDataParallel (launch with torchrun)
    backend: str = "auto"          # "auto": nccl with a GPU per rank, else gloo
    checkpointing: bool = False    # recompute each block's activations in backward
    compile: bool = False          # torch.compile the model
    memory_report: bool = True     # measure one training step's peak memory at the start
    # ---- run ---------------------------------------------------------------------------------
    device: str = "auto"           # "auto" | "cpu" | "cuda"
    seed: int = 1337
    out_dir: str = ""              # where ckpt.pt goes at each evaluation ("" = no checkpoints)
    resume: bool = False           # continue from out_dir/ckpt.pt

    def __post_init__(self):
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), f.type)
        positive = ("block_size", "n_layer", "n_head", "n_embd", "batch_size", "grad_accum",
                    "eval_iters", "log_interval")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("vocab_size", "max_iters", "warmup_iters", "lr_decay_iters", "eval_interval",
                     "sample_tokens", "top_k", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0.0 < self.train_fraction < 1.0:
            raise ValueError(f"train_fraction must be in (0, 1), got {self.train_fraction}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for name in ("learning_rate", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.min_lr > self.learning_rate:
            raise ValueError(f"min_lr ({self.min_lr}) must be <= learning_rate ({self.learning_rate})")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.warmup_iters > self.lr_decay_iters:
            raise ValueError(f"warmup_iters ({self.warmup_iters}) must be <= lr_decay_iters "
                             f"({self.lr_decay_iters})")
        kernel_parts(self.kernels)  # raises on an unknown part
        for name, allowed in (("amp_dtype", AMP_DTYPES), ("device", DEVICES), ("backend", BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.resume and not self.out_dir:
            raise ValueError("resume=True needs out_dir (the folder holding ckpt.pt)")

    # ---- derived ------------------------------------------------------------------------------
    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def tokens_per_iter(self, world_size: int = 1) -> int:
        """Tokens one optimizer step consumes: grad_accum * world_size * batch_size * block_size."""
        return self.grad_accum * world_size * self.batch_size * self.block_size

    def replace(self, **changes) -> "GPTConfig":
        """A copy with some fields changed (checked like a new config)."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(f"unknown config key(s) {unknown}; known keys: {sorted(f.name for f in fields(self))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _type_name(annotation) -> str:
    return annotation if isinstance(annotation, str) else annotation.__name__


def _check_type(name: str, value, annotation) -> None:
    """Exact types: bool is not an int here, and an int is not a float (overrides convert it first)."""
    expected = _type_name(annotation)
    ok = {"int": type(value) is int, "float": type(value) is float, "bool": type(value) is bool,
          "str": type(value) is str}[expected]
    if not ok:
        raise TypeError(f"config key {name!r} must be a {expected}, got {type(value).__name__} {value!r}")


def kernel_parts(kernels: str) -> frozenset[str]:
    """The set of Triton parts a ``kernels`` value switches on: "none" -> {}, "all" -> {layernorm, flash}."""
    if not isinstance(kernels, str):
        raise TypeError(f"kernels must be a str, got {type(kernels).__name__}")
    spec = kernels.strip().lower()
    if spec in ("", "none"):
        return frozenset()
    if spec == "all":
        return frozenset({"layernorm", "flash"})
    parts = frozenset(p.strip() for p in spec.split(","))
    unknown = sorted(parts - set(KERNEL_PARTS))
    if unknown:
        raise ValueError(f"kernels: unknown part(s) {unknown}; use 'none', 'all' or a comma-separated "
                         f"subset of {list(KERNEL_PARTS)}")
    if {"softmax", "flash"} <= parts:
        raise ValueError("kernels: 'softmax' and 'flash' are two ways to compute attention; pick one")
    return parts


GPU_PRESET_CHANGES = dict(  # nanoGPT config/train_shakespeare_char.py, plus bf16 autocast
    block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=False,
    batch_size=64, max_iters=5000, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100,
    lr_decay_iters=5000, beta2=0.99, eval_interval=250, eval_iters=200, log_interval=250,
    amp=True, device="cuda", sample_tokens=500,
)

PRESETS: dict[str, GPTConfig] = {
    "cpu": GPTConfig(),
    "gpu": GPTConfig(**GPU_PRESET_CHANGES),
}


def preset(name: str) -> GPTConfig:
    """The named preset ("cpu" or "gpu")."""
    if not isinstance(name, str):
        raise TypeError(f"preset must be a str, got {type(name).__name__}")
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


def parse_value(key: str, text: str, annotation) -> object:
    """The value of ``--key=text`` for a field declared ``annotation`` (nanoGPT's configurator)."""
    expected = _type_name(annotation)
    if expected == "str":
        try:  # allow quoted strings, like nanoGPT, but take anything else verbatim
            value = ast.literal_eval(text)
            return value if isinstance(value, str) else text
        except (ValueError, SyntaxError):
            return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if expected == "bool" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise TypeError(f"--{key}={text}: expected a {expected}, and {text!r} is not a Python literal") from None
    if expected == "float" and type(value) is int:
        value = float(value)
    if type(value).__name__ != expected:
        raise TypeError(f"--{key}={text}: expected a {expected}, got {type(value).__name__} {value!r}")
    return value


def apply_overrides(config: GPTConfig, overrides) -> GPTConfig:
    """``config`` with overrides applied: a list of ``"--key=value"`` strings or a dict ``{key: value}``.

    Unknown keys and values of the wrong type raise (``ValueError`` / ``TypeError``) naming the key.
    """
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    types = {f.name: f.type for f in fields(GPTConfig)}
    changes: dict = {}
    if isinstance(overrides, dict):
        for key, value in overrides.items():
            if key not in types:
                raise ValueError(f"unknown config key {key!r}; known keys: {sorted(types)}")
            if _type_name(types[key]) == "float" and type(value) is int:
                value = float(value)
            changes[key] = value
    elif isinstance(overrides, (list, tuple)):
        for arg in overrides:
            if not isinstance(arg, str) or not arg.startswith("--") or "=" not in arg:
                raise ValueError(f"override {arg!r} must look like --key=value")
            key, text = arg[2:].split("=", 1)
            key = key.replace("-", "_")
            if key not in types:
                raise ValueError(f"unknown config key {key!r} in {arg!r}; known keys: {sorted(types)}")
            changes[key] = parse_value(key, text, types[key])
    else:
        raise TypeError(f"overrides must be a dict or a list of '--key=value' strings, got {type(overrides).__name__}")
    return dataclasses.replace(config, **changes)


def make_config(preset_name: str = "cpu", overrides=None) -> GPTConfig:
    """``apply_overrides(preset(preset_name), overrides)``: what the CLI and the notebook build."""
    return apply_overrides(preset(preset_name), overrides or {})
