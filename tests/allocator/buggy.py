"""Known-buggy implementations of the allocator chapter's exercises: each one must be rejected by its checker.

Each bug is a mistake students really make (the issue names four: no coalescing, wrong rounding,
splitting large blocks with a small remainder, ignoring streams; each appears both in its own
exercise and inside the allocator of memory_timeline). ``expect`` words must appear in the failure message
(the likely cause), where the checker has one.

Every source is a complete replacement for its exercise's answer cell. The memory_timeline bugs are the
solution's own answer cell with one change, either a shadowed helper defined above it (the cell is
run after the earlier answers, so the shadow wins) or a one-line edit.
"""

from ptinternals.grading.testing import answer_sources

ASSIGNMENT = "allocator"


def _timeline(*edits: tuple[str, str], prefix: str = "") -> str:
    """The solution's memory_timeline answer cell with ``edits`` (old, new) applied, after ``prefix``."""
    src = answer_sources(ASSIGNMENT)["memory_timeline_code"]
    for old, new in edits:
        assert old in src, f"the 4.9 solution no longer contains {old!r}: update tests/allocator/buggy.py"
        src = src.replace(old, new)
    return prefix + src


BUGGY = {
    "allocator.round_size": {
        "rounds_down": ("""
def round_size(nbytes, divisions=0):
    if nbytes < 0:
        raise ValueError(nbytes)
    return max(512, nbytes // 512 * 512)
""", "round UP"),
        "no_minimum": ("""
def round_size(nbytes, divisions=0):
    if nbytes < 0:
        raise ValueError(nbytes)
    return -(-nbytes // 512) * 512
""", "below 512 B"),
        "always_adds_512": ("""
def round_size(nbytes, divisions=0):
    if nbytes < 0:
        raise ValueError(nbytes)
    return (nbytes // 512 + 1) * 512
""", "already rounded"),
        "next_power_of_two": ("""
def round_size(nbytes, divisions=0):
    if nbytes < 0:
        raise ValueError(nbytes)
    if divisions > 1 and nbytes > 512 * divisions:
        return 1 << (nbytes - 1).bit_length()
    return max(512, -(-nbytes // 512) * 512)
""", "equal steps"),
        "divisions_without_threshold": ("""
def round_size(nbytes, divisions=0):
    if nbytes < 0:
        raise ValueError(nbytes)
    if nbytes < 512:
        return 512
    if divisions > 1:
        if nbytes & (nbytes - 1) == 0:
            return nbytes
        step = (1 << (nbytes.bit_length() - 1)) // divisions
        return -(-nbytes // step) * step
    return -(-nbytes // 512) * 512
""", "512 * divisions"),
        "no_negative_check": ("""
def round_size(nbytes, divisions=0):
    return max(512, -(-nbytes // 512) * 512)
""", "ValueError"),
    },
    "allocator.size_plan": {
        "small_strictly_below_1mib": ("""
def size_plan(nbytes):
    r = round_size(nbytes)
    if r < kSmallSize:
        return r, "small", kSmallBuffer
    if r < kMinLargeAlloc:
        return r, "large", kLargeBuffer
    return r, "large", -(-r // kRoundLarge) * kRoundLarge
""", "AND including 1 MiB"),
        "ten_mib_shares_a_segment": ("""
def size_plan(nbytes):
    r = round_size(nbytes)
    if r <= kSmallSize:
        return r, "small", kSmallBuffer
    if r <= kMinLargeAlloc:
        return r, "large", kLargeBuffer
    return r, "large", -(-r // kRoundLarge) * kRoundLarge
""", "exactly 10 MiB"),
        "large_segment_not_rounded": ("""
def size_plan(nbytes):
    r = round_size(nbytes)
    if r <= kSmallSize:
        return r, "small", kSmallBuffer
    if r < kMinLargeAlloc:
        return r, "large", kLargeBuffer
    return r, "large", r
""", "multiple of 2 MiB"),
        "small_segments_of_1mib": ("""
def size_plan(nbytes):
    r = round_size(nbytes)
    if r <= kSmallSize:
        return r, "small", kSmallSize
    if r < kMinLargeAlloc:
        return r, "large", kLargeBuffer
    return r, "large", -(-r // kRoundLarge) * kRoundLarge
""", "2 MiB segments"),
        "every_large_gets_20mib": ("""
def size_plan(nbytes):
    r = round_size(nbytes)
    if r <= kSmallSize:
        return r, "small", kSmallBuffer
    return r, "large", max(kLargeBuffer, -(-r // kRoundLarge) * kRoundLarge)
""", "own segment"),
    },
    "allocator.find_best_fit": {
        "ignores_stream": ("""
def find_best_fit(free_blocks, size, stream, max_split_size=SIZE_MAX):
    fits = sorted((b[1], b[2], b) for b in free_blocks if b[1] >= size)
    if not fits:
        return None
    best = fits[0][2]
    if size < max_split_size and best[1] >= max_split_size:
        return None
    if size >= max_split_size and best[1] >= size + kLargeBuffer:
        return None
    return best
""", "requesting stream"),
        "first_fit": ("""
def find_best_fit(free_blocks, size, stream, max_split_size=SIZE_MAX):
    for b in free_blocks:
        if b[0] == stream and b[1] >= size:
            if size < max_split_size and b[1] >= max_split_size:
                return None
            if size >= max_split_size and b[1] >= size + kLargeBuffer:
                return None
            return b
    return None
""", "not first fit"),
        "exact_fit_excluded": ("""
def find_best_fit(free_blocks, size, stream, max_split_size=SIZE_MAX):
    fits = sorted((b[1], b[2], b) for b in free_blocks if b[0] == stream and b[1] > size)
    if not fits:
        return None
    best = fits[0][2]
    if size < max_split_size and best[1] >= max_split_size:
        return None
    if size >= max_split_size and best[1] >= size + kLargeBuffer:
        return None
    return best
""", "exactly the requested size"),
        "highest_address_on_ties": ("""
def find_best_fit(free_blocks, size, stream, max_split_size=SIZE_MAX):
    fits = sorted((b[1], -b[2], b) for b in free_blocks if b[0] == stream and b[1] >= size)
    if not fits:
        return None
    best = fits[0][2]
    if size < max_split_size and best[1] >= max_split_size:
        return None
    if size >= max_split_size and best[1] >= size + kLargeBuffer:
        return None
    return best
""", "lowest address"),
        "no_oversize_rules": ("""
def find_best_fit(free_blocks, size, stream, max_split_size=SIZE_MAX):
    fits = sorted((b[1], b[2], b) for b in free_blocks if b[0] == stream and b[1] >= size)
    return fits[0][2] if fits else None
""", "oversize"),
    },
    "allocator.should_split": {
        "large_split_small_remainder": ("""
def should_split(block_size, size, pool, max_split_size=SIZE_MAX):
    remaining = block_size - size
    if pool == "small":
        return remaining >= 512
    return size < max_split_size and remaining >= 512
""", "than 1 MiB"),
        "large_at_least_1mib": ("""
def should_split(block_size, size, pool, max_split_size=SIZE_MAX):
    remaining = block_size - size
    if pool == "small":
        return remaining >= 512
    return size < max_split_size and remaining >= kSmallSize
""", "MORE than 1 MiB"),
        "ignores_max_split_size": ("""
def should_split(block_size, size, pool, max_split_size=SIZE_MAX):
    remaining = block_size - size
    if pool == "small":
        return remaining >= 512
    return remaining > kSmallSize
""", "never split"),
        "small_strictly_more_than_512": ("""
def should_split(block_size, size, pool, max_split_size=SIZE_MAX):
    remaining = block_size - size
    if pool == "small":
        return remaining > 512
    return size < max_split_size and remaining > kSmallSize
""", "at least 512 B"),
    },
    "allocator.merge_free_neighbours": {
        "no_coalescing": ("""
def merge_free_neighbours(blocks, index):
    address, size, state = blocks[index]
    if state == INACTIVE:
        raise ValueError("double free")
    out = list(blocks)
    out[index] = (address, size, INACTIVE)
    return out
""", "no coalescing"),
        "only_merges_next": ("""
def merge_free_neighbours(blocks, index):
    address, size, state = blocks[index]
    if state == INACTIVE:
        raise ValueError("double free")
    last = index
    if index + 1 < len(blocks) and blocks[index + 1][2] == INACTIVE:
        last = index + 1
        size += blocks[last][1]
    return list(blocks[:index]) + [(address, size, INACTIVE)] + list(blocks[last + 1:])
""", "BEFORE"),
        "merged_block_keeps_its_address": ("""
def merge_free_neighbours(blocks, index):
    address, size, state = blocks[index]
    if state == INACTIVE:
        raise ValueError("double free")
    first, last = index, index
    if index > 0 and blocks[index - 1][2] == INACTIVE:
        first = index - 1
        size += blocks[first][1]
    if index + 1 < len(blocks) and blocks[index + 1][2] == INACTIVE:
        last = index + 1
        size += blocks[last][1]
    return list(blocks[:first]) + [(address, size, INACTIVE)] + list(blocks[last + 1:])
""", "previous block's address"),
        "merges_pending_neighbours": ("""
def merge_free_neighbours(blocks, index):
    address, size, state = blocks[index]
    if state == INACTIVE:
        raise ValueError("double free")
    free = (INACTIVE, ACTIVE_PENDING_FREE)
    first, last = index, index
    if index > 0 and blocks[index - 1][2] in free:
        first = index - 1
        address = blocks[first][0]
        size += blocks[first][1]
    if index + 1 < len(blocks) and blocks[index + 1][2] in free:
        last = index + 1
        size += blocks[last][1]
    return list(blocks[:first]) + [(address, size, INACTIVE)] + list(blocks[last + 1:])
""", "only inactive neighbours"),
        "no_double_free_check": ("""
def merge_free_neighbours(blocks, index):
    address, size, state = blocks[index]
    first, last = index, index
    if index > 0 and blocks[index - 1][2] == INACTIVE:
        first = index - 1
        address = blocks[first][0]
        size += blocks[first][1]
    if index + 1 < len(blocks) and blocks[index + 1][2] == INACTIVE:
        last = index + 1
        size += blocks[last][1]
    return list(blocks[:first]) + [(address, size, INACTIVE)] + list(blocks[last + 1:])
""", "double free"),
    },
    "allocator.release_cached_segments": {
        "releases_free_tails": ("""
def release_cached_segments(segments):
    kept, released = [], 0
    for blocks in segments:
        blocks = [(a, s, INACTIVE if st == ACTIVE_PENDING_FREE else st) for a, s, st in blocks]
        released += sum(s for a, s, st in blocks if st == INACTIVE)
        live = [b for b in blocks if b[2] != INACTIVE]
        if live:
            kept.append(live)
    return kept, released
""", "whole segments only"),
        "ignores_pending_frees": ("""
def release_cached_segments(segments):
    kept, released = [], 0
    for blocks in segments:
        if len(blocks) == 1 and blocks[0][2] == INACTIVE:
            released += blocks[0][1]
        else:
            kept.append(list(blocks))
    return kept, released
""", "pending free"),
        "pending_freed_without_merging": ("""
def release_cached_segments(segments):
    kept, released = [], 0
    for blocks in segments:
        blocks = [(a, s, INACTIVE if st == ACTIVE_PENDING_FREE else st) for a, s, st in blocks]
        if len(blocks) == 1:
            released += blocks[0][1]
        else:
            kept.append(blocks)
    return kept, released
""", "merging them"),
        "releases_before_waiting": ("""
def release_cached_segments(segments):
    kept, released = [], 0
    for blocks in segments:
        if len(blocks) == 1 and blocks[0][2] == INACTIVE:
            released += blocks[0][1]
            continue
        blocks = list(blocks)
        i = 0
        while i < len(blocks):
            if blocks[i][2] == ACTIVE_PENDING_FREE:
                blocks = merge_free_neighbours(blocks, i)
                i = 0
            else:
                i += 1
        kept.append(blocks)
    return kept, released
""", "before it looks for whole free segments"),
    },
    "allocator.stat": {
        "reset_peak_to_zero": ("""
class Stat:
    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0
    def increase(self, amount):
        self.current += amount
        self.allocated += amount
        self.peak = max(self.peak, self.current)
    def decrease(self, amount):
        if amount > self.current:
            raise ValueError(amount)
        self.current -= amount
        self.freed += amount
    def reset_peak(self):
        self.peak = 0
    def reset_accumulated(self):
        self.allocated = self.freed = 0
""", "CURRENT value"),
        "decrease_lowers_peak": ("""
class Stat:
    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0
    def increase(self, amount):
        self.current += amount
        self.allocated += amount
        self.peak = max(self.peak, self.current)
    def decrease(self, amount):
        if amount > self.current:
            raise ValueError(amount)
        self.current -= amount
        self.freed += amount
        self.peak = self.current
    def reset_peak(self):
        self.peak = self.current
    def reset_accumulated(self):
        self.allocated = self.freed = 0
""", "never lowers the peak"),
        "decrease_counts_as_allocated": ("""
class Stat:
    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0
    def increase(self, amount):
        self.current += amount
        self.allocated += amount
        self.peak = max(self.peak, self.current)
    def decrease(self, amount):
        if amount > self.current:
            raise ValueError(amount)
        self.current -= amount
        self.allocated -= amount
    def reset_peak(self):
        self.peak = self.current
    def reset_accumulated(self):
        self.allocated = self.freed = 0
""", "adds to freed"),
        "no_underflow_check": ("""
class Stat:
    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0
    def increase(self, amount):
        self.current += amount
        self.allocated += amount
        self.peak = max(self.peak, self.current)
    def decrease(self, amount):
        self.current -= amount
        self.freed += amount
    def reset_peak(self):
        self.peak = self.current
    def reset_accumulated(self):
        self.allocated = self.freed = 0
""", "must raise ValueError"),
        "reset_accumulated_resets_everything": ("""
class Stat:
    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0
    def increase(self, amount):
        self.current += amount
        self.allocated += amount
        self.peak = max(self.peak, self.current)
    def decrease(self, amount):
        if amount > self.current:
            raise ValueError(amount)
        self.current -= amount
        self.freed += amount
    def reset_peak(self):
        self.peak = self.current
    def reset_accumulated(self):
        self.current = self.peak = self.allocated = self.freed = 0
""", "allocated and freed only"),
    },
    "allocator.fix_fragmentation": {
        "unchanged": ("""
def fix_fragmentation(trace):
    return list(trace), ""
""", "unchanged"),
        "empty_cache_before_the_failing_allocation": ("""
def fix_fragmentation(trace):
    last_keep = max(i for i, e in enumerate(trace) if e[0] == "alloc" and e[1].startswith("keep"))
    return list(trace[:last_keep]) + [("empty_cache",)] + list(trace[last_keep:]), ""
""", "changes nothing"),
        "kept_tensors_freed": ("""
def fix_fragmentation(trace):
    fixed = []
    for e in trace:
        fixed.append(e)
        if e[0] == "alloc" and e[1].startswith("keep"):
            fixed.append(("free", e[1]))
    return fixed, ""
""", "alive to the end"),
        "smaller_scratch_buffers": ("""
def fix_fragmentation(trace):
    return [("alloc", e[1], e[2] // 2, e[3]) if e[0] == "alloc" and e[1].startswith("scratch") else e
            for e in trace], ""
""", "at least as big"),
        "kept_tensor_first_within_each_step": ("""
def fix_fragmentation(trace):
    fixed, i = [], 0
    while i < len(trace):
        e = trace[i]
        if e[0] == "alloc" and e[1].startswith("scratch") and trace[i + 1][0] == "alloc":
            fixed += [trace[i + 1], e]
            i += 2
        else:
            fixed.append(e)
            i += 1
    return fixed, ""
""", "segment map"),
        "max_split_size_too_big": ("""
def fix_fragmentation(trace):
    return list(trace), "max_split_size_mb:512"
""", "smallest scratch size"),
    },
    "allocator.memory_timeline": {
        "no_coalescing": (_timeline(prefix='''
def merge_free_neighbours(blocks, index):  # frees without merging with free neighbours
    out = list(blocks)
    out[index] = (blocks[index][0], blocks[index][1], INACTIVE)
    return out

'''), "merged"),
        "wrong_rounding": (_timeline(prefix='''
def round_size(nbytes, divisions=0):  # no rounding to 512 B
    return max(nbytes, 1)

'''), "round_size"),
        "splits_large_blocks_with_a_small_remainder": (_timeline(prefix='''
def should_split(block_size, size, pool, max_split_size=SIZE_MAX):
    return block_size - size >= 512

'''), "should_split"),
        "ignores_streams": (_timeline(
            ("free = [(s.stream, size, address)", "free = [(stream, size, address)"),
            (" and s.stream == stream\n", "\n")), "another stream"),
        "ignores_record_stream": (_timeline(
            ("uses[spot[1]].add(event[2])", "pass")), "another stream"),
        "empty_cache_does_not_wait_for_pending_frees": (_timeline(
            ("process_events(everything=True)", "process_events()")), "pending block"),
        "pending_blocks_freed_at_sync": (_timeline(
            ("                streams.discard(event[1])\n",
             "                streams.discard(event[1])\n            process_events()\n")),
            "changes no statistic"),
    },
}

# Exercises whose solution builds on another exercise's answer: a bug there also sinks these.
DEPENDS_ON = {
    "allocator.size_plan": ("allocator.round_size",),
    "allocator.release_cached_segments": ("allocator.merge_free_neighbours",),
    "allocator.memory_timeline": ("allocator.round_size", "allocator.size_plan", "allocator.find_best_fit", "allocator.should_split",
                             "allocator.merge_free_neighbours", "allocator.release_cached_segments", "allocator.stat"),
}
