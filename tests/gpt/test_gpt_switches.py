"""Each course part, switched on, keeps the training trajectory of the pure-torch run."""
import pytest
import torch

from ptinternals.amp import GradScaler
from ptinternals.distributed import run_ranks

from .gpt_helpers import ddp_rank, fixed_batches, tiny_config, trajectory

BATCHES = fixed_batches(3)


@pytest.fixture(scope="module")
def pure():
    return trajectory(tiny_config(), BATCHES)


def _same(a, b, rtol=1e-5, atol=1e-6):
    losses_a, norms_a, state_a = a
    losses_b, norms_b, state_b = b
    torch.testing.assert_close(torch.tensor(losses_a), torch.tensor(losses_b), rtol=rtol, atol=atol)
    torch.testing.assert_close(torch.tensor(norms_a), torch.tensor(norms_b), rtol=rtol * 10, atol=atol * 10)
    for k in state_a:
        torch.testing.assert_close(state_a[k], state_b[k], rtol=rtol * 10, atol=atol * 10, msg=k)


@pytest.mark.parametrize("kernels", ["layernorm", "softmax", "flash"])
def test_triton_kernels_keep_the_trajectory(pure, kernels):
    batches = BATCHES[:2]  # the Triton interpreter is slow: two steps of a one-layer model
    cfg = tiny_config(n_layer=1)
    _same(trajectory(cfg.replace(kernels=kernels), batches), trajectory(cfg, batches))


def test_checkpointing_keeps_the_trajectory_with_dropout():
    cfg = tiny_config(dropout=0.2)
    _same(trajectory(cfg.replace(checkpointing=True), BATCHES), trajectory(cfg, BATCHES), rtol=0, atol=0)


def test_checkpointing_saves_activation_memory():
    from ptinternals.gpt import GPT

    cfg = tiny_config(n_layer=4, block_size=16, n_embd=16)
    x = torch.randint(0, 11, (4, 16))
    saved = {}
    for flag in (False, True):
        torch.manual_seed(0)
        model = GPT(cfg.replace(checkpointing=flag))
        sizes = []

        def pack(t, sizes=sizes):
            sizes.append(t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x, x)[1].backward()
        saved[flag] = sum(sizes)
    assert saved[True] < 0.5 * saved[False]


def test_gradient_accumulation_equals_one_big_batch(pure):
    _same(trajectory(tiny_config(), BATCHES, split=2), pure)


def test_bf16_autocast_stays_close(pure):
    _same(trajectory(tiny_config(), BATCHES, amp_dtype=torch.bfloat16), pure, rtol=2e-2, atol=2e-3)


def test_fp16_with_the_course_grad_scaler_stays_close(pure):
    scaler = GradScaler("cpu")
    _same(trajectory(tiny_config(), BATCHES, amp_dtype=torch.float16, scaler=scaler), pure, rtol=5e-3, atol=5e-4)
    assert scaler.get_scale() == 2.0**16  # no overflow, no back-off in three steps


def test_ddp_matches_single_process_full_batch(tmp_path):
    batches = fixed_batches(3, batch=8)
    single = trajectory(tiny_config(), batches)
    (losses0, state0, h0, mem0), (losses1, state1, h1, _) = run_ranks(ddp_rank, 2, 3, str(tmp_path),
                                                                     timeout_s=120)
    for k in state0:
        torch.testing.assert_close(state0[k], state1[k], rtol=0, atol=0)  # replicas stay identical
        torch.testing.assert_close(state0[k], single[2][k], rtol=1e-4, atol=1e-6, msg=k)
    mean_losses = [(a + b) / 2 for a, b in zip(losses0, losses1)]
    torch.testing.assert_close(torch.tensor(mean_losses), torch.tensor(single[0]), rtol=1e-5, atol=1e-6)
    # and the whole trainer under DDP (same ranks), with a checkpoint gathered from both ranks
    assert len(h0) == len(h1) == 4 and mem0 and (tmp_path / "ckpt.pt").exists()
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2 and ckpt["iter_num"] == 4
