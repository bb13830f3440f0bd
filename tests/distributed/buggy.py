"""Known-buggy implementations of the distributed chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make (the issue names four: averaging by the wrong world size, the
wrong chunk order in the ring, hooks that fire before accumulation, a shard that drops the remainder; issue
16 a fifth: a missing gradient treated as zero, so weight decay moves frozen parameters), written as the
solution plus one edit (``edited(exercise_id, (old, new))``: the bug is the edit a reader sees; two or
three small edits where one cannot express the mistake, said in a comment). Its second element is the
hint the failure must give: words of its "likely cause" line, or None when no likely cause may appear
(the failure message itself says what is wrong, or the checker cannot tell this mistake from its symptom).
"""
from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}


def _e(exercise_id, *edits):
    return edited(exercise_id, *edits)


BUGGY = {
    "distributed.chunk_bounds": {
        "drops_remainder": (_e("distributed.chunk_bounds", ("end = start + base + (1 if c < extra else 0)",
                                                            "end = start + base")), "drop the remainder"),
        "remainder_to_last": (_e("distributed.chunk_bounds", (
            "end = start + base + (1 if c < extra else 0)",
            "end = start + base + (extra if c == world_size - 1 else 0)")), "FIRST length % N chunks"),
        "ceil_chunks": (_e("distributed.chunk_bounds", (  # torch.chunk's rule
            "end = start + base + (1 if c < extra else 0)", "end = min(start + -(-length // world_size), length)")),
                        "ceil(length / N)"),
        "uses_tensor_split": (_e("distributed.chunk_bounds", (
            "end = start + base + (1 if c < extra else 0)",
            "end = start + len(torch.arange(length).tensor_split(world_size)[c])")), None),
        "no_validation": (_e("distributed.chunk_bounds", (
            '    if world_size < 1:\n        raise ValueError(f"world_size must be >= 1, got {world_size}")\n'
            '    if length < 0:\n        raise ValueError(f"length must be >= 0, got {length}")\n', "")),
                          "must raise ValueError"),
    },
    "distributed.ring_all_reduce": {
        "wrong_chunk_order": (_e("distributed.ring_all_reduce", ("exchange((rank - step) % n, inbox)",
                                                                 "exchange((rank + step) % n, inbox)")),
                              "(r - s) mod N"),
        "drops_remainder": (_e("distributed.ring_all_reduce", (
            "bounds = chunk_bounds(flat.numel(), n)",
            "size = flat.numel() // n\n    bounds = [(c * size, (c + 1) * size) for c in range(n)]")), "never reduced"),
        "missing_all_gather": (_e("distributed.ring_all_reduce", ("for step in range(n - 1):  # all-gather",
                                                                  "for step in range(0):  # all-gather")),
                               "all-gather phase"),
        "all_gather_adds": (_e("distributed.ring_all_reduce", (
            "        exchange((rank + 1 - step) % n, flat[s:e])",
            "        inbox = torch.empty(e - s, dtype=flat.dtype)\n"
            "        exchange((rank + 1 - step) % n, inbox)\n        flat[s:e] += inbox")), "overwrite"),
        "uses_all_reduce": (_e("distributed.ring_all_reduce", ("    if tensor.numel() == 0:\n        return\n",
                                                               "    dist.all_reduce(tensor)\n    return\n")), None),
        # one edit that replaces both phases: every step passes a whole tensor around the ring
        "sends_whole_tensor": (_e("distributed.ring_all_reduce", (
            "    for step in range(n - 1):  # reduce-scatter: add the received chunk\n"
            "        s, e = bounds[(rank - step - 1) % n]\n"
            "        inbox = torch.empty(e - s, dtype=flat.dtype)\n"
            "        exchange((rank - step) % n, inbox)\n"
            "        flat[s:e] += inbox\n"
            "    for step in range(n - 1):  # all-gather: overwrite with the finished chunk\n"
            "        s, e = bounds[(rank - step) % n]\n"
            "        exchange((rank + 1 - step) % n, flat[s:e])\n",
            "    passing, total = flat.clone(), flat.clone()\n"
            "    for step in range(n - 1):  # pass every rank's whole tensor around the ring\n"
            "        inbox = torch.empty_like(passing)\n"
            "        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, passing, right),\n"
            "                                        dist.P2POp(dist.irecv, inbox, left)])\n"
            "        for work in works:\n"
            "            work.wait()\n"
            "        total += inbox\n"
            "        passing = inbox\n"
            "    flat.copy_(total)\n")), None),
    },
    "distributed.naive_ddp": {
        "wrong_world_size": (_e("distributed.naive_ddp", ("param.grad.div_(self.world_size)",
                                                          "param.grad.div_(self.world_size - 1)")),
                             "divide by the world size"),  # with 2 ranks N - 1 = 1: the sum
        "sums_not_averages": (_e("distributed.naive_ddp", (
            "        param.grad.div_(self.world_size)  # the sum over ranks of grad / N is the mean\n", "")),
                              "divide by the world size"),
        # two edits: a tensor hook, which fires before accumulation, when p.grad is still None (skipped)
        "hooks_before_accumulation": (_e("distributed.naive_ddp", (
            "p.register_post_accumulate_grad_hook(self._hook)", "p.register_hook(lambda grad, p=p: self._hook(p))"), (
            "        if not self._callback_queued:  # the first hook",
            "        if param.grad is None:\n            return\n        if not self._callback_queued:  # the first hook")),
                                      "register_post_accumulate_grad_hook"),
        "no_broadcast": (_e("distributed.naive_ddp", ("dist.broadcast(t, src=0)  # every replica starts",
                                                      "pass  # every replica starts")), None),
        # two edits: the hook only records; the all-reduces start when backward has ended
        "reduce_after_backward": (_e("distributed.naive_ddp", (
            "self._pending.append(dist.all_reduce(param.grad, async_op=True))", "self._pending.append(param)"), (
            "        for work in self._pending:\n            work.wait()",
            "        for work in [dist.all_reduce(p.grad, async_op=True) for p in self._pending]:\n            work.wait()")),
                                  None),
        "blocking_all_reduce": (_e("distributed.naive_ddp", (
            "self._pending.append(dist.all_reduce(param.grad, async_op=True))", "dist.all_reduce(param.grad)")), None),
        "no_callback": (_e("distributed.naive_ddp", (  # nothing waits for the all-reduces before backward returns
            "            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)\n",
            "")), None),
    },
    "distributed.assign_buckets": {
        "strictly_greater": (_e("distributed.assign_buckets", ("if size >= limit:", "if size > limit:")), "REACHES"),
        "ignores_first_cap": (_e("distributed.assign_buckets", ("limit = first_bucket_cap_bytes\n",
                                                                "limit = bucket_cap_bytes\n")), "FIRST bucket's limit"),
        "first_cap_always": (_e("distributed.assign_buckets", ("            limit = bucket_cap_bytes",
                                                               "            limit = first_bucket_cap_bytes")),
                             "only the FIRST bucket"),
        "drops_last_bucket": (_e("distributed.assign_buckets", ("    if current:\n        buckets.append(current)\n",
                                                                "")), "partly filled bucket"),
        "closes_before_overflow": (_e("distributed.assign_buckets", (
            "        current.append(i)\n        size += nbytes\n        if size >= limit:",
            "        if current and size + nbytes > limit:  # would overflow: close it first\n"
            "            buckets.append(current)\n            current, size = [], 0\n"
            "            limit = bucket_cap_bytes\n"
            "        current.append(i)\n        size += nbytes\n        if False:")), "never closes a bucket early"),
    },
    "distributed.bucketed_ddp": {
        "registration_order_buckets": (_e("distributed.bucketed_ddp", (
            "            sizes = [", "            self.ready_order.sort()  # registration order\n            sizes = [")),
                                       "REVERSE"),
        "never_rebuilt": (_e("distributed.bucketed_ddp", (  # the order of the first backward is never recorded
            "        if not self.rebuilt:\n            self.ready_order.append(index)\n", "")), "never rebuilt"),
        "buckets_from_the_start": (_e("distributed.bucketed_ddp", (
            "self.build_buckets([list(range(len(self.params)))])",
            "self.build_buckets([[len(self.params) - 1 - k for k in b] for b in assign_buckets(\n"
            "            [p.numel() * p.element_size() for p in self.params[::-1]], *self.caps)])")),
                                   "first backward already used"),
        # two edits: the launch loop moves to the end of backward
        "launch_at_finish": (_e("distributed.bucketed_ddp", (
            "        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket][\"pending\"] == 0:",
            "    def _launch_all(self):\n"
            "        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket][\"pending\"] == 0:"), (
            "        self.callback_queued = False\n        if self.next_bucket",
            "        self.callback_queued = False\n        self._launch_all()\n        if self.next_bucket")), None),
        "wrong_world_size": (_e("distributed.bucketed_ddp", ('ready["buffer"].div_(self.world_size)',
                                                             'ready["buffer"].div_(self.world_size + 1)')),
                             "wrong world size"),
        "no_copy_back": (_e("distributed.bucketed_ddp", (
            'p.grad.copy_(bucket["buffer"][offset:offset + p.numel()].view_as(p))', "pass")), "never reached p.grad"),
        "no_callback": (_e("distributed.bucketed_ddp", (
            "            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradient_synchronization)\n",
            "")), "never reached p.grad"),
        "one_all_reduce_per_parameter": (_e("distributed.bucketed_ddp", (
            "self.caps = (int(bucket_cap_mb * 2**20), int(first_bucket_cap_mb * 2**20))", "self.caps = (1, 1)")), None),
    },
    "distributed.no_sync": {
        "flag_ignored": (_e("distributed.no_sync", (
            "        if self.require_backward_grad_sync:  # inside no_sync(): no bucket, no callback, no communication\n"
            "            super()._on_grad_ready(index, param)",
            "        super()._on_grad_ready(index, param)")), None),
        "flag_inverted": (_e("distributed.no_sync", ("        if self.require_backward_grad_sync:  # inside",
                                                     "        if not self.require_backward_grad_sync:  # inside")), None),
        "never_restored": (_e("distributed.no_sync", (
            "        try:\n            yield\n        finally:\n            self.require_backward_grad_sync = old",
            "        yield")), "turn synchronisation back on"),
        # two edits: a tensor hook keeps the INCOMING gradient (this micro-batch's), which is what gets reduced
        "hooks_before_accumulation": (_e("distributed.no_sync", (
            "    @contextlib.contextmanager\n    def no_sync(self):",
            "    def __init__(self, module, **kwargs):\n"
            "        super().__init__(module, **kwargs)\n"
            "        self._incoming = {}\n"
            "        for i, p in enumerate(self.params):\n"
            "            p.register_hook(lambda grad, i=i: self._incoming.__setitem__(i, grad.clone()))\n\n"
            "    @contextlib.contextmanager\n    def no_sync(self):"), (
            "            super()._on_grad_ready(index, param)",
            "            incoming = type(\"Incoming\", (), {\"grad\": self._incoming[index], \"numel\": param.numel})()\n"
            "            super()._on_grad_ready(index, incoming)")), "register_hook"),
    },
    "distributed.shard_bounds": {
        "drops_remainder": (_e("distributed.shard_bounds", ("shard = -(-numel // world_size)  # ceil(numel / world_size)",
                                                            "shard = numel // world_size")), "remainder is dropped"),
        "end_not_clamped": (_e("distributed.shard_bounds", ("min((rank + 1) * shard, numel)", "(rank + 1) * shard")),
                            "clamp"),
        "balanced_split": (_e("distributed.shard_bounds", (  # the ring's chunks, not FSDP's shards
            "    shard = -(-numel // world_size)  # ceil(numel / world_size)\n"
            "    return min(rank * shard, numel), min((rank + 1) * shard, numel)",
            "    base, extra = divmod(numel, world_size)\n"
            "    start = rank * base + min(rank, extra)\n"
            "    return start, start + base + (1 if rank < extra else 0)")), "ceil(numel / N)"),
        "uses_torch_chunk": (_e("distributed.shard_bounds", (
            "    return min(rank * shard, numel), min((rank + 1) * shard, numel)",
            "    sizes = [len(c) for c in torch.arange(numel).chunk(world_size)] if numel else []\n"
            "    sizes += [0] * (world_size - len(sizes))\n"
            "    return sum(sizes[:rank]), sum(sizes[:rank + 1])")), None),
        "no_rank_check": (_e("distributed.shard_bounds", (
            '    if not 0 <= rank < world_size:\n        raise IndexError(f"rank must be in [0, {world_size}), got {rank}")\n',
            "")), "raise IndexError"),
    },
    "distributed.sharded_adamw": {
        # two edits: a missing gradient counted as a zero one, so AdamW's weight decay moves frozen parameters
        "missing_grad_as_zero": (_e("distributed.sharded_adamw", (
            "piece.grad = grad_shard[a - self.start:b - self.start].clone() if used[i] else None",
            "piece.grad = grad_shard[a - self.start:b - self.start].clone()"), (
            "            if used[i]:\n                p.copy_(", "            if True:\n                p.copy_(")),
                                 "weight decay"),
        "skips_by_local_grad": (_e("distributed.sharded_adamw", (
            "        dist.all_reduce(used)  # which parameters have a gradient on SOME rank\n", "")), "ALL ranks"),
        "floor_range": (_e("distributed.sharded_adamw", (  # rank r's range from numel // N: the remainder is nobody's
            "self.start, self.end = shard_bounds(self.numel, self.world_size, self.rank)",
            "self.start, self.end = (self.rank * (self.numel // self.world_size),\n"
            "                                 (self.rank + 1) * (self.numel // self.world_size))")), None),
        "wrong_world_size": (_e("distributed.sharded_adamw", ("flat_grad /= n\n",
                                                              "flat_grad /= n - 1 if n > 2 else 1\n")),
                             "wrong world size"),
        "keeps_full_buffers": (_e("distributed.sharded_adamw", (
            "flat_grad = torch.zeros(n * s, dtype=dtype)", "self.flat_grad = flat_grad = torch.zeros(n * s, dtype=dtype)")),
                               None),
        "no_all_gather": (_e("distributed.sharded_adamw", (
            "all_gather_flat(flat, padded)",
            "flat[: self.numel] = torch.cat([p.detach().reshape(-1) for p in self.params])\n"
            "        flat[self.start:self.end] = self.shard")), "all-gather the updated"),
        "adam_not_adamw": (_e("distributed.sharded_adamw", ("torch.optim.AdamW(pieces", "torch.optim.Adam(pieces")),
                           "L2"),
    },
    "distributed.fully_sharded": {
        "keeps_gathered_parameters": (_e("distributed.fully_sharded", (
            "        return full\n",
            "        self.cache = getattr(self, \"cache\", []) + [full]  # keeps every gathered unit alive\n"
            "        return full\n")), None),
        "sums_not_averages": (_e("distributed.fully_sharded", ("padded[: shape[0]] = grad_full / n",
                                                               "padded[: shape[0]] = grad_full")), "too big"),
        "no_reduce_scatter": (_e("distributed.fully_sharded", (
            "reduce_scatter_flat(mine.view(-1), padded.view(-1))",
            "mine.copy_(padded[self.rank * rows:(self.rank + 1) * rows] * n)  # my rows of my own gradient")),
                              "OWN gradient"),
        # two edits: autograd keeps the gathered parameters from forward to backward instead of gathering again
        "autograd_keeps_full": (_e("distributed.fully_sharded", (
            "        ctx.save_for_backward(x)\n", "        ctx.save_for_backward(x, *full.values())\n"
                                                  "        ctx.names = list(full)\n"), (
            "        (x,) = ctx.saved_tensors\n        owner, k = ctx.owner, ctx.k\n        full = owner.gather(k)  # gather again",
            "        x, *kept = ctx.saved_tensors\n        owner, k = ctx.owner, ctx.k\n"
            "        full = {name: t.detach() for name, t in zip(ctx.names, kept)}")), None),
        "shards_not_registered": (_e("distributed.fully_sharded", (  # FSDP1's habit: the wrapper owns the shards
            "setattr(child.get_submodule(owner), attr, shard)  # FSDP2: the shard IS the parameter",
            "self.register_parameter(f\"shard{len(shard_of)}_{len(self.units)}\", shard)")), None),
        "frozen_trained": (_e("distributed.fully_sharded", (
            "nn.Parameter(p.detach()[lo:hi].clone(), requires_grad=p.requires_grad)",
            "nn.Parameter(p.detach()[lo:hi].clone())")), None),
        "tie_broken": (_e("distributed.fully_sharded", (  # each unit shards a tied parameter on its own
            "        for child in model:\n            unit = []",
            "        for child in model:\n            shard_of, unit = {}, []")), None),
    },
    "distributed.train_resume": {
        "no_rng_state": (_e("distributed.train_resume", ("    torch.set_rng_state(ckpt[\"rng\"][dist.get_rank()])\n", "")),
                         "RNG state"),
        "rank0_rng_everywhere": (_e("distributed.train_resume", ("torch.set_rng_state(ckpt[\"rng\"][dist.get_rank()])",
                                                                 "torch.set_rng_state(ckpt[\"rng\"][0])")), "RNG state"),
        "no_optimizer_state": (_e("distributed.train_resume", ("    optimizer.load_state_dict(ckpt[\"optimizer\"])\n",
                                                               "")), "optimizer state"),
        "returns_wrong_step": (_e("distributed.train_resume", ("    return ckpt[\"step\"]\n",
                                                               "    return ckpt[\"step\"] - 1\n")), None),
        "writes_elsewhere": (_e("distributed.train_resume", ("os.replace(tmp, path)  # atomic",
                                                             "os.replace(tmp, path + '.ckpt')  # atomic")), None),
    },
}

# Exercises whose answer builds on another exercise's answer: a bug there may fail them too.
DEPENDS_ON = {
    "distributed.ring_all_reduce": ("distributed.chunk_bounds",),  # cuts the tensor with chunk_bounds
    "distributed.bucketed_ddp": ("distributed.assign_buckets",),  # buckets with assign_buckets
    "distributed.no_sync": ("distributed.bucketed_ddp", "distributed.assign_buckets"),  # AccumulatingDDP(BucketedDDP)
    "distributed.sharded_adamw": ("distributed.shard_bounds",),  # shards with shard_bounds
}
