"""GPTConfig: presets, type-checked overrides, validation."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ptinternals.gpt import GPT, PRESETS, GPTConfig, apply_overrides, kernel_parts, make_config
from ptinternals.gpt.config import preset


def test_gpu_preset_is_nanogpt_shakespeare_char():
    g = PRESETS["gpu"]
    assert (g.n_layer, g.n_head, g.n_embd, g.block_size, g.batch_size) == (6, 6, 384, 256, 64)
    assert (g.dropout, g.learning_rate, g.min_lr, g.max_iters, g.lr_decay_iters) == (0.2, 1e-3, 1e-4, 5000, 5000)
    assert (g.beta2, g.warmup_iters, g.bias, g.grad_clip, g.weight_decay) == (0.99, 100, False, 1.0, 0.1)
    model = GPT(g.replace(vocab_size=65))
    assert round(model.num_params() / 1e6, 2) == 10.65  # nanoGPT prints "number of parameters: 10.65M"


def test_overrides_from_strings_are_type_checked():
    cfg = apply_overrides(PRESETS["cpu"], ["--max_iters=7", "--learning_rate=1", "--amp=True",
                                           "--kernels=flash", "--out_dir='run 1'", "--device=cpu"])
    assert cfg.max_iters == 7 and cfg.learning_rate == 1.0 and type(cfg.learning_rate) is float
    assert cfg.amp is True and cfg.kernels == "flash" and cfg.out_dir == "run 1"
    with pytest.raises(TypeError, match="max_iters.*expected a int"):
        apply_overrides(PRESETS["cpu"], ["--max_iters=1.5"])
    with pytest.raises(TypeError, match="amp"):
        apply_overrides(PRESETS["cpu"], ["--amp=1"])
    with pytest.raises(ValueError, match="unknown config key 'n_layers'"):
        apply_overrides(PRESETS["cpu"], ["--n_layers=3"])
    with pytest.raises(ValueError, match="--key=value"):
        apply_overrides(PRESETS["cpu"], ["max_iters=3"])
    with pytest.raises(TypeError, match="overrides must be"):
        apply_overrides(PRESETS["cpu"], "--max_iters=3")


def test_overrides_from_a_dict():
    cfg = make_config("gpu", {"max_iters": 10, "dropout": 0})
    assert cfg.max_iters == 10 and cfg.dropout == 0.0 and cfg.n_layer == 6
    with pytest.raises(TypeError, match="'bias' must be a bool"):
        make_config("cpu", {"bias": 1})
    with pytest.raises(ValueError, match="unknown preset"):
        preset("tpu")


@pytest.mark.parametrize("changes, match", [
    (dict(n_embd=10, n_head=3), "divisible"), (dict(n_layer=0), "n_layer must be >= 1"),
    (dict(dropout=1.0), "dropout"), (dict(min_lr=1.0), "min_lr"), (dict(kernels="cuda"), "unknown part"),
    (dict(kernels="softmax,flash"), "pick one"), (dict(amp_dtype="fp8"), "amp_dtype"),
    (dict(resume=True), "out_dir"), (dict(train_fraction=1.0), "train_fraction"),
    (dict(warmup_iters=2000), "warmup_iters"), (dict(temperature=0.0), "temperature"),
])
def test_invalid_values_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**changes)


@given(st.sampled_from(["max_iters", "n_layer", "seed"]), st.integers(0, 10_000))
def test_int_overrides_round_trip(key, value):
    if key == "n_layer" and value == 0:
        return
    assert getattr(apply_overrides(PRESETS["cpu"], [f"--{key}={value}"]), key) == value


def test_kernel_parts():
    assert kernel_parts("none") == frozenset() and kernel_parts("all") == {"layernorm", "flash"}
    assert kernel_parts("layernorm, softmax") == {"layernorm", "softmax"}
    with pytest.raises(TypeError):
        kernel_parts(None)
