"""Known-buggy implementations of the allocator chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make (the issue names four: no coalescing, wrong rounding,
splitting large blocks with a small remainder, ignoring streams; each appears both in its own exercise
and inside the allocator of memory_timeline), written as the solution plus one edit
(``edited(exercise_id, (old, new))``: the bug is the edit a reader sees; two small edits where one
mistake needs them, said in a comment). Its second element is the hint the failure must give: words of
its "likely cause" line, or None when no likely cause may appear (the checker cannot tell this mistake
from its symptom, so it must not guess).
"""
from ptinternals.grading.testing import edited

TESTS_OF_TESTS = {"hints", "twins", "boundaries"}


def _rs(*edits):
    return edited("allocator.round_size", *edits)


def _sp(*edits):
    return edited("allocator.size_plan", *edits)


def _fit(*edits):
    return edited("allocator.find_best_fit", *edits)


def _split(*edits):
    return edited("allocator.should_split", *edits)


def _merge(*edits):
    return edited("allocator.merge_free_neighbours", *edits)


def _release(*edits):
    return edited("allocator.release_cached_segments", *edits)


def _stat(*edits):
    return edited("allocator.stat", *edits)


def _fix(*edits):
    return edited("allocator.fix_fragmentation", *edits)


def _timeline(*edits):
    return edited("allocator.memory_timeline", *edits)


_PREV_MERGE = ("    if index > 0 and blocks[index - 1][2] == INACTIVE:  # merge with the previous block: start at its address\n"
               "        first = index - 1\n"
               "        address = blocks[first][0]\n"
               "        size += blocks[first][1]\n")
_NEXT_MERGE = ("    if index + 1 < len(blocks) and blocks[index + 1][2] == INACTIVE:  # merge with the next block\n"
               "        last = index + 1\n"
               "        size += blocks[last][1]\n")
_WAIT = ("        i = 0\n"
         "        while i < len(blocks):  # synchronize_and_free_events: every pending block is freed\n"
         "            if blocks[i][2] == ACTIVE_PENDING_FREE:\n"
         "                blocks = merge_free_neighbours(blocks, i)\n"
         "                i = 0\n"
         "            else:\n"
         "                i += 1\n")
_RELEASE = ("        if len(blocks) == 1 and blocks[0][2] == INACTIVE:  # a whole free segment: cudaFree\n"
            "            released += blocks[0][1]\n"
            "        else:\n"
            "            kept.append(blocks)\n")

BUGGY = {
    "allocator.round_size": {
        "rounds_down": (_rs(("return -(-nbytes // kMinBlockSize) * kMinBlockSize",
                             "return nbytes // kMinBlockSize * kMinBlockSize")), "round UP"),
        "no_minimum": (_rs(("    if nbytes < kMinBlockSize:\n        return kMinBlockSize\n", "")), "below 512 B"),
        "always_adds_512": (_rs(("return -(-nbytes // kMinBlockSize) * kMinBlockSize",
                                 "return (nbytes // kMinBlockSize + 1) * kMinBlockSize")), "already rounded"),
        "next_power_of_two": (_rs(("return -(-nbytes // step) * step", "return 1 << (nbytes - 1).bit_length()")),
                              "equal steps"),
        "divisions_without_threshold": (_rs(("if divisions > 1 and nbytes > kMinBlockSize * divisions:",
                                             "if divisions > 1:")), "512 * divisions"),
        "divisions_from_one": (_rs(("if divisions > 1 and", "if divisions >= 1 and")), "divisions 0 and 1"),
        "no_negative_check": (_rs(('    if nbytes < 0:\n        raise ValueError(f"nbytes must be >= 0, got {nbytes}")\n',
                                   "")), "raise ValueError"),
    },
    "allocator.size_plan": {
        "small_strictly_below_1mib": (_sp(("if rounded <= kSmallSize:", "if rounded < kSmallSize:")),
                                      "AND including 1 MiB"),
        "ten_mib_shares_a_segment": (_sp(("if rounded < kMinLargeAlloc:", "if rounded <= kMinLargeAlloc:")),
                                     "exactly 10 MiB"),
        "large_segment_not_rounded": (_sp(('return rounded, "large", -(-rounded // kRoundLarge) * kRoundLarge',
                                           'return rounded, "large", rounded')), "multiple of 2 MiB"),
        "small_segments_of_1mib": (_sp(('return rounded, "small", kSmallBuffer', 'return rounded, "small", kSmallSize')),
                                   "2 MiB segments"),
        # kLargeBuffer (20 MiB) read as the threshold of an own segment, instead of kMinLargeAlloc (10 MiB)
        "own_segment_from_20mib": (_sp(("if rounded < kMinLargeAlloc:", "if rounded < kLargeBuffer:")),
                                   "own segment"),
    },
    "allocator.find_best_fit": {
        "ignores_stream": (_fit(("if b_stream != stream or b_size < size:", "if b_size < size:")), "requesting stream"),
        "first_fit": (_fit(("if best is None or (b_size, b_address) < (best[1], best[2]):", "if best is None:")),
                      "not first fit"),
        "exact_fit_excluded": (_fit(("b_size < size:", "b_size <= size:")), "exactly the requested size"),
        "highest_address_on_ties": (_fit(("(b_size, b_address) < (best[1], best[2])",
                                          "(b_size, -b_address) < (best[1], -best[2])")), "lowest address"),
        "no_oversize_rules": (_fit((
            "    if size < max_split_size and best[1] >= max_split_size:  # oversize blocks serve oversize requests only\n"
            "        return None\n"
            "    if size >= max_split_size and best[1] >= size + kLargeBuffer:  # ... and waste less than 20 MiB\n"
            "        return None\n", "")), "oversize"),
        "sorts_the_callers_list": (_fit(("    best = None\n", "    free_blocks.sort()\n    best = None\n")),
                                   "sort a copy"),
    },
    "allocator.should_split": {
        "large_split_small_remainder": (_split(("remaining > kSmallSize", "remaining >= kMinBlockSize")), "than 1 MiB"),
        "large_at_least_1mib": (_split(("remaining > kSmallSize", "remaining >= kSmallSize")), "MORE than 1 MiB"),
        "ignores_max_split_size": (_split(("return size < max_split_size and remaining > kSmallSize",
                                           "return remaining > kSmallSize")), "never split"),
        "small_strictly_more_than_512": (_split(("remaining >= kMinBlockSize", "remaining > kMinBlockSize")),
                                         "at least 512 B"),
        "no_size_check": (_split(('    if size > block_size:\n'
                                  '        raise ValueError(f"size ({size}) must be <= block_size ({block_size})")\n',
                                  "")), "raise ValueError"),
    },
    "allocator.merge_free_neighbours": {
        "no_coalescing": (_merge((_PREV_MERGE + _NEXT_MERGE, "")), "no coalescing"),
        "only_merges_next": (_merge((_PREV_MERGE, "")), "BEFORE"),
        "merged_block_keeps_its_address": (_merge(("        address = blocks[first][0]\n", "")),
                                           "previous block's address"),
        # Two small edits, one per side: pending-free neighbours taken for free ones.
        "merges_pending_neighbours": (_merge(("blocks[index - 1][2] == INACTIVE",
                                              'blocks[index - 1][2] in (INACTIVE, "active_pending_free")'),
                                             ("blocks[index + 1][2] == INACTIVE",
                                              'blocks[index + 1][2] in (INACTIVE, "active_pending_free")')),
                                      "only inactive neighbours"),
        "no_double_free_check": (_merge(('    if state == INACTIVE:\n'
                                         '        raise ValueError(f"blocks[{index}] is already free (double free)")\n',
                                         "")), "double free"),
        "negative_index_wraps": (_merge(('    if index < 0:  # Python would read blocks[-1] as the last block\n'
                                         '        raise IndexError(f"index {index} is negative")\n', "")),
                                 "IndexError"),
        "modifies_the_callers_list": (_merge((
            "    return list(blocks[:first]) + [(address, size, INACTIVE)] + list(blocks[last + 1:])",
            "    blocks[first:last + 1] = [(address, size, INACTIVE)]\n    return blocks")), "new list"),
    },
    "allocator.release_cached_segments": {
        "releases_free_tails": (_release((_RELEASE,
                                          "        released += sum(b[1] for b in blocks if b[2] == INACTIVE)\n"
                                          "        live = [b for b in blocks if b[2] != INACTIVE]\n"
                                          "        if live:\n"
                                          "            kept.append(live)\n")), "whole segments only"),
        "ignores_pending_frees": (_release((_WAIT, "")), "waits for every pending free"),
        "pending_freed_without_merging": (_release(("blocks = merge_free_neighbours(blocks, i)",
                                                    "blocks[i] = (blocks[i][0], blocks[i][1], INACTIVE)")),
                                          "merges with its free"),
        # Two edits that move one step: whole free segments are looked for before the wait, not after it.
        "releases_before_waiting": (_release(("        blocks = list(blocks)\n",
                                              "        if len(blocks) == 1 and blocks[0][2] == INACTIVE:\n"
                                              "            released += blocks[0][1]\n"
                                              "            continue\n"
                                              "        blocks = list(blocks)\n"),
                                             (_RELEASE, "        kept.append(blocks)\n")),
                                    "wait for the pending frees first"),
    },
    "allocator.stat": {
        "reset_peak_to_zero": (_stat(("self.peak = self.current\n", "self.peak = 0\n")), "CURRENT value"),
        "decrease_lowers_peak": (_stat(("self.freed += amount", "self.freed += amount\n        self.peak = self.current")),
                                 "never lowers the peak"),
        "decrease_counts_as_allocated": (_stat(("self.freed += amount", "self.allocated -= amount")), "adds to freed"),
        "no_underflow_check": (_stat(('        if amount > self.current:\n'
                                      '            raise ValueError(f"cannot decrease by {amount}: current is {self.current}")\n',
                                      "")), "must raise ValueError"),
        "reset_accumulated_resets_everything": (_stat(("    def reset_accumulated(self):\n        ### BEGIN SOLUTION\n",
                                                       "    def reset_accumulated(self):\n        ### BEGIN SOLUTION\n"
                                                       "        self.current = self.peak = 0\n")),
                                                "allocated and freed only"),
        "peak_from_before_the_increase": (_stat(("        self.current += amount\n        self.allocated += amount\n"
                                                 "        self.peak = max(self.peak, self.current)\n",
                                                 "        self.peak = max(self.peak, self.current)\n"
                                                 "        self.current += amount\n        self.allocated += amount\n")),
                                          "peak = max(peak, current)"),
    },
    "allocator.fix_fragmentation": {
        "unchanged": (_fix(('return fixed, ""', 'return list(trace), ""')), "unchanged"),
        # an empty_cache() right before the allocation the OOM message names (the last kept tensor)
        "empty_cache_before_the_failing_allocation": (_fix(('return fixed, ""',
                                                            'return list(trace[:-3]) + [("empty_cache",)] + '
                                                            'list(trace[-3:]), ""')), "changes nothing"),
        "kept_tensors_freed": (_fix(("        fixed.append(event)\n",
                                     "        fixed.append(event)\n"
                                     '        if event[0] == "alloc" and str(event[1]).startswith("keep"):\n'
                                     '            fixed.append(("free", event[1]))\n')), "alive to the end"),
        "smaller_workspace": (_fix(("max(scratch_sizes)", "max(scratch_sizes) // 2")), "at least as big"),
        "max_split_size_too_big": (_fix(('return fixed, ""', 'return list(trace), "max_split_size_mb:512"')),
                                   "smallest scratch size"),
        "scratch_allocations_kept": (_fix(('if event[0] in ("alloc", "free")', 'if event[0] == "free"')),
                                     "live tensors alone do not fit"),
        "expandable_segments": (_fix(('return fixed, ""', 'return list(trace), "expandable_segments:True"')), None),
    },
    "allocator.memory_timeline": {
        "no_coalescing": (_timeline(("segment.blocks = merge_free_neighbours(segment.blocks, i)",
                                     "segment.blocks[i] = (address, segment.blocks[i][1], INACTIVE)")),
                          "merge with its free"),
        "wrong_rounding": (_timeline(("rounded, pool, segment_size = size_plan(nbytes)",
                                      "rounded, pool, segment_size = nbytes, *size_plan(nbytes)[1:]")), "round_size"),
        "splits_large_blocks_with_a_small_remainder": (_timeline(("if should_split(block_size, rounded, pool):",
                                                                  "if block_size - rounded >= kMinBlockSize:")),
                                                       "should_split"),
        "ignores_streams": (_timeline(("free = [(s.stream, size, address)", "free = [(stream, size, address)")),
                            "requesting stream"),
        "ignores_record_stream": (_timeline(("uses[spot[1]].add(event[2])", "pass")), "record_stream"),
        "empty_cache_does_not_wait_for_pending_frees": (_timeline(("process_events(everything=True)",
                                                                   "process_events()")), "pending block"),
        "pending_blocks_freed_at_sync": (_timeline(("                streams.discard(event[1])\n",
                                                    "                streams.discard(event[1])\n"
                                                    "            process_events()\n")),
                                         "changes no statistic"),
    },
}

# Exercises whose solution builds on another exercise's answer: a bug there also sinks these.
DEPENDS_ON = {
    "allocator.size_plan": ("allocator.round_size",),
    "allocator.release_cached_segments": ("allocator.merge_free_neighbours",),
    "allocator.memory_timeline": ("allocator.round_size", "allocator.size_plan", "allocator.find_best_fit",
                                  "allocator.should_split", "allocator.merge_free_neighbours",
                                  "allocator.release_cached_segments", "allocator.stat"),
}
