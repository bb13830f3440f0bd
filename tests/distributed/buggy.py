"""Known-buggy implementations of the distributed chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make (the issue names four: averaging by the wrong world size,
the wrong chunk order in the ring, hooks that fire before accumulation, a shard that drops the
remainder). The short ones are written out; the long answer cells (classes) are the solution's cell
with one edit, made by :func:`mutate`, which fails loudly if the solution no longer contains the text
it edits. Every source is a complete replacement for that exercise's answer cell.
"""
from ptinternals.grading.testing import answer_sources

_SOLUTION = answer_sources("distributed")


def mutate(grade_id: str, *edits: tuple[str, str]) -> str:
    """The solution's answer cell ``grade_id`` with each ``(old, new)`` edit applied exactly once."""
    src = _SOLUTION[grade_id]
    for old, new in edits:
        assert src.count(old) == 1, f"{grade_id}: the edit target {old!r} occurs {src.count(old)} times"
        src = src.replace(old, new)
    return src


BUGGY = {
    "distributed.chunk_bounds": {
        "drops_remainder": ("""
def chunk_bounds(length, world_size):
    size = length // world_size
    return [(c * size, (c + 1) * size) for c in range(world_size)]
""", "remainder"),
        "remainder_to_last": ("""
def chunk_bounds(length, world_size):
    size = length // world_size
    bounds = [(c * size, (c + 1) * size) for c in range(world_size)]
    bounds[-1] = (bounds[-1][0], length)
    return bounds
""", "FIRST length % N chunks"),
        "ceil_chunks": ("""
def chunk_bounds(length, world_size):
    size = -(-length // world_size)
    return [(min(c * size, length), min((c + 1) * size, length)) for c in range(world_size)]
""", "ceil(length / N)"),
        "uses_tensor_split": ("""
def chunk_bounds(length, world_size):
    sizes = [len(c) for c in torch.arange(length).tensor_split(world_size)]
    out, start = [], 0
    for s in sizes:
        out.append((start, start + s))
        start += s
    return out
""", "plain Python"),
    },
    "distributed.ring_all_reduce": {
        "wrong_chunk_order": (mutate(
            "ring_all_reduce_code", ("exchange((rank - step) % n, inbox)", "exchange((rank + step) % n, inbox)")), "rank"),
        "drops_remainder": (mutate(
            "ring_all_reduce_code", ("bounds = chunk_bounds(flat.numel(), n)",
                           "size = flat.numel() // n\n    bounds = [(c * size, (c + 1) * size) for c in range(n)]")),
            "length % N"),
        "missing_all_gather": (mutate(
            "ring_all_reduce_code", ("for step in range(n - 1):  # all-gather", "for step in range(0):  # all-gather")),
            "all-gather phase"),
        "all_gather_adds": (mutate(
            "ring_all_reduce_code", ("        exchange((rank + 1 - step) % n, flat[s:e])",
                           "        inbox = torch.empty(e - s, dtype=flat.dtype)\n"
                           "        exchange((rank + 1 - step) % n, inbox)\n        flat[s:e] += inbox")), None),
        "uses_all_reduce": ("""
def ring_all_reduce(tensor):
    dist.all_reduce(tensor)
""", "point-to-point"),
        "sends_whole_tensor": ("""
def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.reshape(-1).clone()
    total = flat.clone()
    passing = flat.clone()
    for step in range(n - 1):  # pass every rank's whole tensor around the ring
        inbox = torch.empty_like(passing)
        ops = [dist.P2POp(dist.isend, passing, (rank + 1) % n), dist.P2POp(dist.irecv, inbox, (rank - 1) % n)]
        if passing.numel():
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        total += inbox
        passing = inbox
    tensor.copy_(total.view(tensor.shape))
""", "2 (N-1) chunks"),
    },
    "distributed.naive_ddp": {
        "wrong_world_size": (mutate(
            "naive_ddp_code", ("param.grad.div_(self.world_size)", "param.grad.div_(self.world_size - 1)")),
            "world size"),
        "sums_not_averages": (mutate(
            "naive_ddp_code", ("param.grad.div_(self.world_size)  # the sum over ranks of grad / N is the mean",
                           "pass")), "divide by the world size"),
        "hooks_before_accumulation": (mutate(
            "naive_ddp_code", ("p.register_post_accumulate_grad_hook(self._hook)",
                           "p.register_hook(lambda grad, p=p: self._hook(p))"),
            ("        param.grad.div_(self.world_size)", "        if param.grad is None:\n            return\n"
                                                         "        param.grad.div_(self.world_size)")),
            "register_hook"),
        "no_broadcast": (mutate(
            "naive_ddp_code", ("dist.broadcast(t, src=0)  # every replica starts from rank 0's values", "pass")),
            None),
        "reduce_after_backward": (mutate(
            "naive_ddp_code", ("self._pending.append(dist.all_reduce(param.grad, async_op=True))",
                           "self._pending.append(param)"),
            ("        for work in self._pending:\n            work.wait()",
             "        works = [dist.all_reduce(p.grad, async_op=True) for p in self._pending]\n"
             "        for work in works:\n            work.wait()")), "overlap"),
        "blocking_all_reduce": (mutate(
            "naive_ddp_code", ("self._pending.append(dist.all_reduce(param.grad, async_op=True))",
                           "dist.all_reduce(param.grad)")), "async_op=True"),
    },
    "distributed.assign_buckets": {
        "closes_before_overflow": ("""
def assign_buckets(tensor_bytes, bucket_cap_bytes, first_bucket_cap_bytes):
    buckets, current, size, limit = [], [], 0, first_bucket_cap_bytes
    for i, nbytes in enumerate(tensor_bytes):
        if current and size + nbytes > limit:  # would overflow: close first
            buckets.append(current)
            current, size, limit = [], 0, bucket_cap_bytes
        current.append(i)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets
""", None),
        "strictly_greater": (mutate("assign_buckets_code", ("if size >= limit:", "if size > limit:")), "REACHES"),
        "ignores_first_cap": (mutate("assign_buckets_code", ("limit = first_bucket_cap_bytes\n", "limit = bucket_cap_bytes\n")),
                              "FIRST bucket"),
        "drops_last_bucket": (mutate("assign_buckets_code", ("    if current:\n        buckets.append(current)\n", "")),
                              "partly filled bucket"),
    },
    "distributed.bucketed_ddp": {
        "forward_order_buckets": (mutate(
            "bucketed_ddp_code", ("order = list(range(len(self.params)))[::-1]", "order = list(range(len(self.params)))")),
            "REVERSE"),
        "launch_at_finish": (mutate(
            "bucketed_ddp_code", ("        while self.next_bucket < len(self.buckets) and "
                           "self.buckets[self.next_bucket][\"pending\"] == 0:",
                           "    def _launch_all(self):\n"
                           "        while self.next_bucket < len(self.buckets) and "
                           "self.buckets[self.next_bucket][\"pending\"] == 0:"),
            ("        if self.next_bucket < len(self.buckets):\n            raise",
             "        self._launch_all()\n        if self.next_bucket < len(self.buckets):\n            raise")),
            "overlap"),
        "wrong_world_size": (mutate(
            "bucketed_ddp_code", ('ready["buffer"].div_(self.world_size)', 'ready["buffer"].div_(self.world_size + 1)')),
            "wrong world size"),
        "no_copy_back": (mutate(
            "bucketed_ddp_code", ("p.grad.copy_(bucket[\"buffer\"][offset:offset + p.numel()].view_as(p))", "pass")),
            "never averaged"),
        "one_all_reduce_per_parameter": (mutate(
            "bucketed_ddp_code", ("int(bucket_cap_mb * 2**20), int(first_bucket_cap_mb * 2**20))", "1, 1)")),
            "flat buffer"),
    },
    "distributed.no_sync": {
        "flag_ignored": (mutate(
            "no_sync_code", ("        if self.require_backward_grad_sync:\n"
                           "            super()._on_grad_ready(index, param)",
                           "        super()._on_grad_ready(index, param)"),
            ("        if self.require_backward_grad_sync:\n            super().finish_gradient_synchronization()",
             "        super().finish_gradient_synchronization()")), "no communication"),
        "never_restored": (mutate(
            "no_sync_code", ("        try:\n            yield\n        finally:\n"
                           "            self.require_backward_grad_sync = old",
                           "        yield")), "turn synchronisation back on"),
        "hooks_before_accumulation": ("""
class AccumulatingDDP(BucketedDDP):
    def __init__(self, module, **kwargs):
        super().__init__(module, **kwargs)
        self._incoming = {}
        for i, p in enumerate(self.params):  # bucket the INCOMING gradient (a tensor hook)
            p.register_hook(lambda grad, i=i: self._incoming.__setitem__(i, grad.clone()))

    @contextlib.contextmanager
    def no_sync(self):
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def _on_grad_ready(self, index, param):
        if self.require_backward_grad_sync:
            class _P:
                grad = self._incoming[index]
                def numel(self_):
                    return param.numel()
            super()._on_grad_ready(index, _P())

    def finish_gradient_synchronization(self):
        if self.require_backward_grad_sync:
            super().finish_gradient_synchronization()
""", "register_hook"),
        "finish_not_skipped": (mutate(
            "no_sync_code", ("        if self.require_backward_grad_sync:\n"
                           "            super().finish_gradient_synchronization()",
                           "        super().finish_gradient_synchronization()")), None),
    },
    "distributed.shard_bounds": {
        "drops_remainder": ("""
def shard_bounds(numel, world_size, rank):
    shard = numel // world_size
    return rank * shard, (rank + 1) * shard
""", None),
        "end_not_clamped": ("""
def shard_bounds(numel, world_size, rank):
    shard = -(-numel // world_size)
    return min(rank * shard, numel), (rank + 1) * shard
""", "clamp"),
        "balanced_split": ("""
def shard_bounds(numel, world_size, rank):
    base, extra = divmod(numel, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
""", "ceil(numel / N)"),
        "uses_torch_chunk": ("""
def shard_bounds(numel, world_size, rank):
    sizes = [len(c) for c in torch.arange(numel).chunk(world_size)] if numel else []
    sizes += [0] * (world_size - len(sizes))
    start = sum(sizes[:rank])
    return start, start + sizes[rank]
""", "plain Python"),
    },
    "distributed.sharded_adamw": {
        "drops_remainder": (mutate(
            "sharded_adamw_code", ("self.shard_size = -(-self.numel // self.world_size)  # S = ceil(P / N)",
                           "self.shard_size = self.numel // self.world_size"),
            ("self.start, self.end = shard_bounds(self.numel, self.world_size, self.rank)",
             "self.start, self.end = self.rank * self.shard_size, (self.rank + 1) * self.shard_size"),
            ("flat_grad = torch.zeros(n * s, dtype=dtype)", "flat_grad = torch.zeros(self.numel + n, dtype=dtype)"),
            ("reduce_scatter_flat(grad_shard, flat_grad)", "reduce_scatter_flat(grad_shard, flat_grad[: n * s])"),
            ("flat = torch.empty(n * s, dtype=dtype)", "flat = torch.cat([torch.empty(n * s, dtype=dtype), "
                                                        "torch.cat([p.detach().reshape(-1) for p in self.params])"
                                                        "[n * s:]])"),
            ("all_gather_flat(flat, padded)", "all_gather_flat(flat[: n * s], padded)")),
            "remainder"),
        "wrong_world_size": (mutate("sharded_adamw_code", ("flat_grad /= n\n", "flat_grad /= n - 1 if n > 2 else 1\n")),
                             "wrong world size"),
        "unsharded_state": ("""
class ShardedAdamW:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = list(params)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self):
        for p in self.params:  # DDP-style: every rank steps everything
            dist.all_reduce(p.grad)
            p.grad /= self.world_size
        self.optimizer.step()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
""", None),
        "no_all_gather": (mutate(
            "sharded_adamw_code", ("all_gather_flat(flat, padded)",
                           "flat = torch.cat([p.detach().reshape(-1) for p in self.params]"
                           " + [torch.zeros(n * s - self.numel)])\n"
                           "        flat[self.start:self.end] = self.shard")), "all-gather"),
        "adam_without_bias_correction": ("""
class ShardedAdamW:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = list(params)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.numel = sum(p.numel() for p in self.params)
        self.s = -(-self.numel // self.world_size)
        self.start, self.end = shard_bounds(self.numel, self.world_size, self.rank)
        self.m = torch.zeros(self.end - self.start)
        self.v = torch.zeros(self.end - self.start)

    @torch.no_grad()
    def step(self):
        n, s = self.world_size, self.s
        g = torch.zeros(n * s)
        g[: self.numel] = torch.cat([p.grad.reshape(-1) for p in self.params]) / n
        mine = torch.empty(s)
        reduce_scatter_flat(mine, g)
        mine = mine[: self.end - self.start]
        w = torch.zeros(s)
        w[: self.end - self.start] = torch.cat([p.detach().reshape(-1) for p in self.params])[self.start:self.end]
        w[: self.end - self.start] *= 1 - self.lr * self.wd
        self.m.mul_(self.betas[0]).add_(mine, alpha=1 - self.betas[0])
        self.v.mul_(self.betas[1]).addcmul_(mine, mine, value=1 - self.betas[1])
        w[: self.end - self.start] -= self.lr * self.m / (self.v.sqrt() + self.eps)  # no bias correction
        full = torch.empty(n * s)
        all_gather_flat(full, w)
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
""", "bias"),
    },
    "distributed.fully_sharded": {
        "drops_remainder": (mutate(
            "fully_sharded_code", ("shard_size = -(-offset // n)", "shard_size = offset // n"),
            ("flat = torch.zeros(n * shard_size)  # (N*S,) zero padding past the P real elements",
             "flat = torch.zeros(max(n * shard_size, offset))"),
            ("full = torch.empty(self.world_size * shard.numel(), dtype=shard.dtype)",
             "full = torch.zeros(self.world_size * shard.numel() + self.world_size, dtype=shard.dtype)"),
            ("all_gather_flat(full, shard)", "all_gather_flat(full[: self.world_size * shard.numel()], shard)"),
            ("reduce_scatter_flat(grad_shard, grad_full / owner.world_size)",
             "reduce_scatter_flat(grad_shard, "
             "(grad_full / owner.world_size)[: owner.world_size * grad_shard.numel()])")),
            None),
        "keeps_gathered_parameters": (mutate(
            "fully_sharded_code", ("        shard = self.shards[k].detach()\n",
                           "        if getattr(self, '_cache', None) is None:\n            self._cache = {}\n"
                           "        if k in self._cache:\n            return self._cache[k]\n"
                           "        shard = self.shards[k].detach()\n"),
            ("        all_gather_flat(full, shard)\n        return full",
             "        all_gather_flat(full, shard)\n        self._cache[k] = full\n        return full"),
            ("        for k, layer in enumerate(self.model):\n            x = _Sharded",
             "        self._cache = {}\n        for k, layer in enumerate(self.model):\n            x = _Sharded")),
            "Free each layer"),
        "sums_not_averages": (mutate(
            "fully_sharded_code", ("reduce_scatter_flat(grad_shard, grad_full / owner.world_size)",
                           "reduce_scatter_flat(grad_shard, grad_full.contiguous())")), "divide by the world size"),
        "no_reduce_scatter": (mutate(
            "fully_sharded_code", ("        reduce_scatter_flat(grad_shard, grad_full / owner.world_size)",
                           "        s = grad_shard.numel()\n"
                           "        grad_shard.copy_(grad_full[owner.rank * s:(owner.rank + 1) * s])")),
            "reduce-scatter"),
        "autograd_keeps_full": ("""
class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, owner):
        ctx.owner = owner
        return owner.gather_raw(shard)

    @staticmethod
    def backward(ctx, grad_full):
        grad_shard = torch.empty(grad_full.numel() // ctx.owner.world_size)
        reduce_scatter_flat(grad_shard, grad_full / ctx.owner.world_size)
        return grad_shard, None


class FullyShardedSequential(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.shards = nn.ParameterList()
        self.layouts = []
        n = self.world_size
        for layer in model:
            named = list(layer.named_parameters())
            layout, offset = [], 0
            for name, p in named:
                layout.append((name, p.shape, offset, p.numel()))
                offset += p.numel()
            self.layouts.append(layout)
            if not named:
                self.shards.append(nn.Parameter(torch.empty(0)))
                continue
            s = -(-offset // n)
            flat = torch.zeros(n * s)
            with torch.no_grad():
                flat[:offset] = torch.cat([p.detach().reshape(-1) for _, p in named])
            self.shards.append(nn.Parameter(flat[self.rank * s:(self.rank + 1) * s].clone()))
            for name, _ in named:
                owner, _, attr = name.rpartition(".")
                module = layer.get_submodule(owner)
                del module._parameters[attr]
                setattr(module, attr, None)

    def gather_raw(self, shard):
        full = torch.empty(self.world_size * shard.numel())
        all_gather_flat(full, shard.detach())
        return full

    def run_layer(self, k, full, x):
        layer = self.model[k]
        for name, shape, offset, numel in self.layouts[k]:
            owner, _, attr = name.rpartition(".")
            setattr(layer.get_submodule(owner), attr, full[offset:offset + numel].view(shape))
        try:
            return layer(x)
        finally:
            for name, *_ in self.layouts[k]:
                owner, _, attr = name.rpartition(".")
                setattr(layer.get_submodule(owner), attr, None)

    def forward(self, x):
        for k, layer in enumerate(self.model):
            if self.layouts[k]:  # autograd saves the views of `full` that the layer uses: all stay alive
                x = self.run_layer(k, _Gather.apply(self.shards[k], self), x)
            else:
                x = layer(x)
        return x
""", "do not let autograd save it"),
    },
    "distributed.train_resume": {
        "no_rng_state": (mutate(
            "train_resume_code", ("    torch.set_rng_state(ckpt[\"rng\"][dist.get_rank()])\n", "")), "RNG state"),
        "rank0_rng_everywhere": (mutate(
            "train_resume_code", ("torch.set_rng_state(ckpt[\"rng\"][dist.get_rank()])",
                            "torch.set_rng_state(ckpt[\"rng\"][0])")),
            "RNG state"),
        "no_optimizer_state": (mutate(
            "train_resume_code", ("    optimizer.load_state_dict(ckpt[\"optimizer\"])\n", "")), "optimizer state"),
        "returns_wrong_step": (mutate(
            "train_resume_code", ("    return ckpt[\"step\"]\n", "    return ckpt[\"step\"] - 1\n")),
            "return the step"),
        "writes_elsewhere": (mutate(
            "train_resume_code", ("os.replace(tmp, path)  # atomic", "os.replace(tmp, path + '.ckpt')  # atomic")),
            "save_checkpoint must write"),
    },
}

# Exercises whose answer builds on another exercise's answer: a bug there may fail them too.
DEPENDS_ON = {
    "distributed.ring_all_reduce": ("distributed.chunk_bounds",),  # cuts the tensor with chunk_bounds
    "distributed.bucketed_ddp": ("distributed.assign_buckets",),  # buckets with assign_buckets
    "distributed.no_sync": ("distributed.bucketed_ddp", "distributed.assign_buckets"),  # AccumulatingDDP(BucketedDDP)
    "distributed.sharded_adamw": ("distributed.shard_bounds",),  # shards with shard_bounds
}
