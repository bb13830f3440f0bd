"""Known-buggy implementations of the profiling chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake people make when they reason about the host-device boundary (the issue names
them: a rule keyed on op names alone, timing the launch instead of the kernel, the prefetching loop
without ``record_stream``, a trace read without torch's nesting rules, ``.item()`` every step) and
is the solution's answer cell with one edit (``ptinternals.grading.testing.edited``), so it stays a
complete replacement for that cell. ``expect`` words must appear in the failure message: the likely
cause, where the symptom names it.
"""

from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}

# capstone_costs reads its trace with the student's op_times: a bug there can sink it (end-to-end tests).
DEPENDS_ON = {"profiling.capstone_costs": ("profiling.op_times",)}

SR = "profiling.sync_reason"
TG = "profiling.time_gpu"
PS = "profiling.predict_step"
TP = "profiling.train_prefetch"
OT = "profiling.op_times"
GA = "profiling.gpu_activity"
TF = "profiling.train_fast"
CC = "profiling.capstone_costs"

HOST_INDEX_RULE = """        if any(isinstance(i, torch.Tensor) and not is_mask(i) and not on_device(i) for i in indices):
            return "host_index"
"""
MASK_RULE = """        if any(is_mask(i) for i in indices):
            value = a["values"]
            masked_fill = (not a["accumulate"] and isinstance(value, torch.Tensor) and value.numel() == 1
                           and not on_device(value) and len(indices) == 1 and on_device(indices[0]))
            return None if masked_fill else "bool_mask_index"
"""

BUGGY = {
    SR: {
        # output_size=0 is given, and falsy
        "output_size_falsy": (edited(SR, ('a.get("output_size") is None', 'not a.get("output_size")')), "is None"),
        "masked_fill_ignores_accumulate": (edited(SR, ('(not a["accumulate"] and isinstance(value',
                                                       '(isinstance(value')), "accumulate=True"),
        "dim_instead_of_numel": (edited(SR, ("value.numel() == 1", "value.dim() == 0")), "numel()"),
        "no_device_guard": (edited(SR, ('if not on_device(a.get("self")):', 'if a.get("self") is None:')),
                            "only work on the device"),
        "bool_masks_only": (edited(SR, ("t.dtype in (torch.bool, torch.uint8)", "t.dtype == torch.bool")), "uint8"),
        "histc_zero_only": (edited(SR, ('a["min"] == a["max"]', 'a["min"] == 0 and a["max"] == 0')),
                            "whatever the value"),
        # the mask rule checked first: a host long index next to a mask reports the mask
        "mask_rule_before_host_index": (edited(SR, (HOST_INDEX_RULE + MASK_RULE, MASK_RULE + HOST_INDEX_RULE)), "it wins"),
        "nonzero_static_as_nonzero": (edited(SR, ('"nonzero": "nonzero",', '"nonzero": "nonzero", "nonzero_static": "nonzero",')),
                                      "nonzero_static"),
    },
    TG: {
        "unsorted_median": (edited(TG, ("xs = sorted(s.elapsed_time(e) for s, e in pairs)",
                                        "xs = [s.elapsed_time(e) for s, e in pairs]")), "sort"),
        "no_warmup": (edited(TG, ("for _ in range(warmup):", "for _ in range(0):")), "warm up"),
        "host_clock": (edited(TG, (
            """    pairs = []
    for _ in range(reps):
        start, end = device.Event(enable_timing=True), device.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    device.synchronize()
    xs = sorted(s.elapsed_time(e) for s, e in pairs)""",
            """    xs = []
    for _ in range(reps):
        device.synchronize()
        t0 = device.perf_counter()
        fn()
        device.synchronize()
        xs.append((device.perf_counter() - t0) * 1e3)
    xs.sort()""")), "device's clock"),
        "exclusive_quartiles": (edited(TG, ("pos = (len(xs) - 1) * q", "pos = (len(xs) + 1) * q - 1")),
                                "linear interpolation"),
        "elapsed_time_backwards": (edited(TG, ("s.elapsed_time(e) for s, e in pairs", "e.elapsed_time(s) for s, e in pairs")),
                                   "start.elapsed_time(end)"),
        "synchronize_every_run": (edited(TG, ("        pairs.append((start, end))\n",
                                              "        pairs.append((start, end))\n        device.synchronize()\n")),
                                  "keep the queue full"),
    },
    PS: {
        "blocking_ignores_pinned": (edited(PS, ("x = xp if pinned else xg", "x = xp")), "pageable bandwidth"),
        "async_pageable_without_staging": (edited(PS, ("else max(h + xg, xp + c)", "else max(h, xg + c)")),
                                           "stages the bytes"),
        "prefetch_forgets_the_host": (edited(PS, ("else max(host, xp, c)", "else max(xp, c)")), "host's own work"),
        "prefetch_item_serialises_the_copy": (edited(PS, ("max(host + c, xp) if item", "host + max(xp, c) if item")),
                                              "already runs"),
        "blocking_without_overlap": (edited(PS, ("return x + c + h if item else x + max(h, c)", "return x + c + h")),
                                     "overlaps the compute"),
    },
    TP: {
        "no_record_stream": (edited(TP, ("buf.record_stream(device.current_stream)", "pass")), "record_stream"),
        "load_after_launch": (edited(TP, (
            """        if i + 1 < len(batches):
            nxt = load(i + 1)
        device.launch(f"step{i}", compute_us, reads=[buf])""",
            """        device.launch(f"step{i}", compute_us, reads=[buf])
        if i + 1 < len(batches):
            nxt = load(i + 1)""")), "before launching step i"),
        "event_on_the_compute_stream": (edited(TP, ("ready.record(side)", "ready.record(device.current_stream)")),
                                        "on the side stream"),
        "event_before_the_copy": (edited(TP, (
            """        device.copy(batches[i], "h2d", pinned=True, non_blocking=True, stream=side, buffer=buf, name=f"batch{i}")
        ready = device.Event()
        ready.record(side)""",
            """        ready = device.Event()
        ready.record(side)
        device.copy(batches[i], "h2d", pinned=True, non_blocking=True, stream=side, buffer=buf, name=f"batch{i}")""")),
            "after queueing the copy"),
        "synchronize_every_step": (edited(TP, ("        device.free(buf)\n", "        device.free(buf)\n        device.synchronize()\n")),
                                   "never waits"),
        "free_before_launch": (edited(TP, (
            """        device.launch(f"step{i}", compute_us, reads=[buf])
        device.free(buf)""",
            """        device.free(buf)
        device.launch(f"step{i}", compute_us, reads=[buf])""")), "after launching"),
    },
    OT: {
        "child_ending_with_parent_not_nested": (edited(OT, ('e["end"] > stack[-1]["end"]', 'e["end"] >= stack[-1]["end"]')),
                                                "ends exactly when its parent ends"),
        "no_dup_folding": (edited(OT, ('p["name"] == e["name"] and len(p["children"]) == 1', "False")), "folded"),
        # every event inside it, not only its children
        "all_descendants": (edited(OT, ('self_us = e["dur"] - sum(c["dur"] for c in e["children"])',
                                        'self_us = e["dur"] - sum(d["dur"] for d in events if d is not e and d["thread"] == '
                                        'e["thread"] and e["start"] <= d["start"] and d["end"] <= e["end"])')),
                            "direct children"),
        "no_python_frames": (edited(OT, ('cats = set(HOST_CATEGORIES) | {"python_function"}', "cats = set(HOST_CATEGORIES)")),
                             "python_function"),
        "steps_not_grouped": (edited(OT, ('name = "ProfilerStep*" if re.match(r"^ProfilerStep#\\d+$", e["name"]) else e["name"]',
                                          'name = e["name"]')), "ProfilerStep*"),
        "float_microseconds": (edited(OT, (
            """            start, dur = round(float(e["ts"]) * 1000), float(e["dur"])   # integer nanoseconds
            events.append({"name": e["name"], "thread": (e.get("pid"), e.get("tid")), "start": start,
                           "end": start + round(dur * 1000), "dur": dur, "parent": None, "children": []})""",
            """            start, dur = float(e["ts"]), float(e["dur"])
            events.append({"name": e["name"], "thread": (e.get("pid"), e.get("tid")), "start": start,
                           "end": start + dur, "dur": dur, "parent": None, "children": []})""")), "nanoseconds"),
        "sort_by_start_only": (edited(OT, ('for e in sorted(evs, key=lambda ev: (ev["start"], -ev["end"])):',
                                           'for e in sorted(evs, key=lambda ev: ev["start"]):')), "longest first"),
    },
    GA: {
        "gap_at_least_min_gap": (edited(GA, ("if b[0] - a[1] > min_gap_us", "if b[0] - a[1] >= min_gap_us")),
                                 "longer than min_gap_us"),
        "annotations_are_activity": (edited(GA, ('e.get("cat") in DEVICE_CATEGORIES',
                                                 'e.get("cat") in DEVICE_CATEGORIES + ("gpu_user_annotation",)')),
                                     "DEVICE_CATEGORIES"),
        "utilisation_sums_durations": (edited(GA, ("sum(e - s for s, e in merged) / span", "sum(e - s for s, e in spans) / span")),
                                       "union"),
        "ties_by_count": (edited(GA, ("key=lambda kv: (-kv[1][1], kv[0])", "key=lambda kv: (-kv[1][1], -kv[1][0])")),
                          "ties by name"),
        "no_argument_check": (edited(GA, ("    if k < 0 or min_gap_us < 0:\n        raise ValueError(", "    if False:\n        raise ValueError(")),
                              None),
    },
    TF: {
        "prints_the_loss": (edited(TF, ("        losses.append(loss.detach())\n",
                                        '        losses.append(loss.detach())\n        print(f"loss {loss.item():.4f}")\n')),
                            "keep each loss on the device"),
        "pageable_non_blocking": (edited(TF, ("x = x.pin_memory().to(device, non_blocking=True)",
                                              "x = x.to(device, non_blocking=True)")), "pin first"),
        "unlabelled_as_class_zero": (edited(TF, ("F.cross_entropy(model(x), y, ignore_index=-1)",
                                                 "F.cross_entropy(model(x), y.clamp(min=0))")), "ignore_index"),
        "nan_check_every_step": (edited(TF, ("        opt.zero_grad(set_to_none=True)\n",
                                             "        if torch.isnan(loss):\n            raise ValueError('loss is NaN')\n"
                                             "        opt.zero_grad(set_to_none=True)\n")), "keep each loss on the device"),
        "item_per_loss_after_the_loop": (edited(TF, ("values = torch.stack(losses).tolist()",
                                                     "values = [loss.item() for loss in losses]")), "read them all once"),
        "mask_out_unlabelled_rows": (edited(TF, ("loss = F.cross_entropy(model(x), y, ignore_index=-1)",
                                                 "keep = y >= 0\n        loss = F.cross_entropy(model(x[keep]), y[keep])")),
                                     "ignore_index=-1 skips"),
        "no_empty_guard": (edited(TF, ("    if not losses:\n        return []\n", "")), None),
    },
    CC: {
        "no_schedule": (edited(CC, ("schedule=schedule(wait=1, warmup=1, active=2, repeat=1),\n                 ", "")),
                        "without a schedule"),
        "ranked_by_total_time": (edited(CC, ('aten = [(name, s) for name, (_, s, _) in times.items() if name.startswith("aten::")]',
                                             'aten = [(name, t) for name, (_, _, t) in times.items() if name.startswith("aten::")]')),
                                 "self time"),
        "ranges_misnamed": (edited(CC, ('record_function("forward")', 'record_function("fwd")')), "named 'forward'"),
        "no_backward_range": (edited(CC, ('            with record_function("backward"):\n                backward()\n',
                                          "            backward()\n")), "named 'backward'"),
        "not_only_aten_ops": (edited(CC, (' in times.items() if name.startswith("aten::")]', " in times.items()]")),
                              "only ATen ops"),
    },
}
