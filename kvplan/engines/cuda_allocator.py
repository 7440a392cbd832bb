"""PyTorch's CUDA caching allocator, simulated: what it reserves from the device (`torch.cuda.memory_reserved`, and
so what the driver counts for the process) for a sequence of tensor allocations and frees.

The rules are those of `c10/cuda/CUDACachingAllocator.cpp` in torch 2.11.0, each at the function named; kvplan
plans for the allocator's defaults (no max_split_size_mb, garbage_collection_threshold or roundup_power2_divisions,
whose rules then never apply), with or without `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.

    round_size           a request is rounded up to a multiple of 512 B (kMinBlockSize)
    get_pool             up to 1 MiB (kSmallSize) the small pool, above it the large pool
    get_free_block       best fit: the pool's smallest cached free block that holds the request, the lowest
                         address among equal sizes (BlockComparatorSize)
    should_split         a block larger than the request is split where what remains is at least 512 B (small
                         pool, and every block with expandable segments) or more than 1 MiB (large pool); else the
                         request takes the whole block
    free_block           a freed block merges with the free blocks beside it in its segment and is cached
    get_allocation_size  no cached block fits: a new segment (cudaMalloc) of 2 MiB (kSmallBuffer) for a small
                         request, 20 MiB (kLargeBuffer) for one under 10 MiB (kMinLargeAlloc), else the request
                         rounded up to 2 MiB (kRoundLarge)
    malloc, alloc_block  where the device has no room for the segment, every cached segment with nothing allocated
                         in it is freed (release_cached_blocks, release_blocks) and the segment tried once more;
                         then out of memory
Expandable segments (try_allocate_expandable_block, find_expandable_block, map_block): each pool has one segment
of reserved addresses that grows by mapping pages, 2 MiB for the small pool and 20 MiB for the large. A request no
cached block holds goes to the lowest address where free and unmapped space together hold it, and the pages it
lacks are mapped; get_free_block passes over a block whose free space runs on into unmapped pages while a smaller
fit exists. Out of memory, the whole free pages of every segment are unmapped (release_blocks, unmap_block) and
the mapping tried again.
"""

from bisect import bisect_left, insort
from typing import NamedTuple

KiB, MiB = 1 << 10, 1 << 20
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = MiB  # kSmallSize: the largest small-pool request
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: a small-pool segment, and an expandable small segment's page
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: requests below it share a kLargeBuffer segment
ROUND_LARGE = 2 * MiB  # kRoundLarge
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: a segment for requests under 10 MiB, an expandable large segment's page
ADDRESS_SPACE = 1 << 47  # an expandable segment's reserved addresses: more than any request asks (torch: 1.125 x the
# GPU's memory); only its size's order against free blocks matters
KEY = 1 << 60  # a free block's key, size x KEY + address: sorted by size, then address (every address is below it)
TOP = 1 << 56  # the addresses segments are given lie below it


class OutOfMemory(Exception):
    """The device had no room for a segment even after the cached ones were released."""


class Block:
    """A run of one segment's addresses: allocated, cached free, or (expandable segments) not mapped."""

    __slots__ = ("address", "size", "small", "allocated", "mapped", "prev", "next")

    def __init__(self, address: int, size: int, small: bool, mapped: bool = True):
        self.address, self.size, self.small, self.mapped = address, size, small, mapped
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None


class Pool:
    """One pool's cached free blocks, by size and address (KEY); with expandable segments its unmapped blocks too."""

    __slots__ = ("small", "page", "keys", "blocks", "unmapped")

    def __init__(self, small: bool):
        self.small = small
        self.page = SMALL_BUFFER if small else LARGE_BUFFER
        self.keys: list[int] = []  # the key of every free mapped block, sorted
        self.blocks: dict[int, Block] = {}
        self.unmapped: list[tuple[int, Block]] = []  # (address, block), sorted

    def add(self, block: Block) -> None:
        key = block.size * KEY + block.address
        insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: Block) -> None:
        key = block.size * KEY + block.address
        del self.keys[bisect_left(self.keys, key)]
        del self.blocks[key]

    def add_unmapped(self, block: Block) -> None:
        insort(self.unmapped, (block.address, block), key=lambda pair: pair[0])

    def remove_unmapped(self, block: Block) -> None:
        index = bisect_left(self.unmapped, block.address, key=lambda pair: pair[0])
        del self.unmapped[index]


def allocation_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocator:
    """One device's allocator. `limit`: the bytes it can reserve before the device has no room for a segment (the
    GPU's memory less what the driver and the process hold outside it), None for no limit. `allocated` and
    `reserved` are torch's memory_allocated and memory_reserved; their peaks run from the last `reset_peaks`."""

    def __init__(self, limit: int | None = None, expandable: bool = False):
        self.limit, self.expandable = limit, expandable
        self.pools = {True: Pool(small=True), False: Pool(small=False)}
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self._lowest = TOP  # the lowest address a segment has: the next one lies below it

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def malloc(self, request: int) -> Block:
        size = MIN_BLOCK if request < MIN_BLOCK else -(-request // MIN_BLOCK) * MIN_BLOCK
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        keys = pool.keys
        index = bisect_left(keys, size * KEY)  # get_free_block: the best fit
        if index == len(keys):
            block = self._new_block(pool, size)
        elif self.expandable:
            block = self._expandable_fit(pool, index)
        else:
            block = pool.blocks.pop(keys.pop(index))
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small or self.expandable else remaining > SMALL_SIZE:
            rest = Block(block.address + size, remaining, small)
            following = block.next
            rest.prev, rest.next = block, following
            if following is not None:
                following.prev = rest
            block.next, block.size = rest, size
            key = remaining * KEY + rest.address
            insort(pool.keys, key)
            pool.blocks[key] = rest
        block.allocated = True
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block

    def free(self, block: Block) -> None:
        pool = self.pools[block.small]
        block.allocated = False
        self.allocated -= block.size
        before, after = block.prev, block.next
        if before is not None and not before.allocated:
            self._merge(pool, block, before)
        if after is not None and not after.allocated:
            self._merge(pool, block, after)
        key = block.size * KEY + block.address
        insort(pool.keys, key)
        pool.blocks[key] = block

    def release_cached(self) -> None:
        """torch.cuda.empty_cache(), and what malloc does before its last try: release_cached_blocks."""
        for small in (False, True):
            pool = self.pools[small]
            for key in list(pool.keys):
                block = pool.blocks[key]
                if self.expandable:
                    self._unmap(pool, block)
                elif block.prev is None and block.next is None:
                    pool.remove(block)
                    self.reserved -= block.size

    # ------------------------------------------------------------------------------------------ internals

    def _expandable_fit(self, pool: Pool, index: int) -> Block:
        """get_free_block with expandable segments: from the best fit (`index`), not a block that runs on into
        unmapped pages while the next fit up does not."""
        keys, blocks = pool.keys, pool.blocks
        while index + 1 < len(keys) and _growable(blocks[keys[index + 1]]) < _growable(blocks[keys[index]]):
            index += 1
        return blocks.pop(keys.pop(index))

    def _new_block(self, pool: Pool, size: int) -> Block:
        """alloc_block, and on failure release_cached_blocks and a second try."""
        block = self._grow(pool, size)
        if block is None:
            self.release_cached()
            block = self._grow(pool, size)
            if block is None:
                raise OutOfMemory(size)
        return block

    def _grow(self, pool: Pool, size: int) -> Block | None:
        if self.expandable:
            return self._expand(pool, size)
        segment = allocation_size(size)
        if not self._room(segment):
            return None
        block = Block(self._below(segment), segment, pool.small)
        self.reserved += segment
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def _below(self, size: int) -> int:
        """The address of a new segment of `size` bytes: below every segment before it (cudaMalloc hands out
        addresses downwards; where equal free blocks tie, best fit takes the lowest, and the H100 record has
        Qwen3-8B at 4,064 tokens reserve 96 MiB less were they rising). Segments never touch: they never merge.
        Page-aligned, as an expandable segment's unmapped blocks are."""
        self._lowest = (self._lowest - size - LARGE_BUFFER) // LARGE_BUFFER * LARGE_BUFFER
        return self._lowest

    def _room(self, size: int) -> bool:
        return self.limit is None or self.reserved + size <= self.limit

    def _merge(self, pool: Pool, block: Block, other: Block | None) -> None:
        """try_merge_blocks: `other`, beside `block` in its segment, joins it if free and mapped alike."""
        if other is None or other.allocated or other.mapped != block.mapped:
            return
        if other.mapped:
            pool.remove(other)
        else:
            pool.remove_unmapped(other)
        if other is block.prev:
            block.address, block.prev = other.address, other.prev
            if other.prev is not None:
                other.prev.next = block
        else:
            block.next = other.next
            if other.next is not None:
                other.next.prev = block
        block.size += other.size

    # ------------------------------------------------------------------------------------ expandable segments

    def _expand(self, pool: Pool, size: int) -> Block | None:
        """try_allocate_expandable_block: map what the lowest place with room lacks; None if the device has no room."""
        candidate = self._expandable_place(pool, size)
        if not candidate.mapped and not self._map(pool, candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            if not self._map(pool, following, min(size - candidate.size, following.size)):
                return None
            candidate = following  # which has taken in the candidate
        pool.remove(candidate)
        return candidate

    def _expandable_place(self, pool: Pool, size: int) -> Block:
        """find_expandable_block: the lowest unmapped block (or the free block before it) from which free and unmapped
        blocks run on for `size`; else a new segment, all unmapped."""
        for _, block in pool.unmapped:
            start = block.prev if block.prev is not None and not block.prev.allocated else block
            room, run = 0, start
            while room < size and run is not None and not run.allocated:
                room, run = room + run.size, run.next
            if room >= size:
                return start
        segment = Block(self._below(ADDRESS_SPACE), ADDRESS_SPACE, pool.small, mapped=False)
        pool.add_unmapped(segment)
        return segment

    def _map(self, pool: Pool, block: Block, size: int) -> bool:
        """map_block: map whole pages from the start of unmapped `block` for `size` bytes, the rest left unmapped."""
        mapped = min(-(-size // pool.page) * pool.page, block.size)
        if not self._room(mapped):
            return False
        pool.remove_unmapped(block)
        if mapped < block.size:
            rest = Block(block.address + mapped, block.size - mapped, pool.small, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, mapped
            pool.add_unmapped(rest)
        block.mapped = True
        self._merge(pool, block, block.prev)
        self._merge(pool, block, block.next)
        pool.add(block)
        self.reserved += mapped
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return True

    def _unmap(self, pool: Pool, block: Block) -> None:
        """unmap_block: return the whole pages inside free `block` to the device; what is left of it at either end
        stays a free mapped block."""
        page = pool.page
        start = -(-block.address // page) * page
        end = (block.address + block.size) // page * page
        if start >= end:
            return
        pool.remove(block)
        if start > block.address:
            before = Block(block.address, start - block.address, pool.small)
            before.prev, before.next = block.prev, block
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            pool.add(before)
        if end < block.address + block.size:
            after = Block(end, block.address + block.size - end, pool.small)
            after.prev, after.next = block, block.next
            if block.next is not None:
                block.next.prev = after
            block.next = after
            pool.add(after)
        block.address, block.size, block.mapped = start, end - start, False
        self.reserved -= end - start
        self._merge(pool, block, block.prev)
        self._merge(pool, block, block.next)
        pool.add_unmapped(block)


def _growable(block: Block) -> int:
    """A free block's size with the unmapped pages after it, which it could grow into."""
    following = block.next
    return block.size + (following.size if following is not None and not following.mapped else 0)


class Phase(NamedTuple):
    """The allocator's figures at the end of a phase of a run: torch.cuda's memory_allocated, max_memory_allocated
    (since the phase began), memory_reserved and its peak."""

    allocated: int
    peak_allocated: int
    reserved: int
    peak_reserved: int


def replay(events: list[int], ends: list[int], limit: int | None = None, expandable: bool = False) -> list[Phase]:
    """The figures at each of `ends` (event counts) of a run of `events`: a size (>= 0) allocates the next slot,
    ~slot frees it. Raises OutOfMemory where the device (`limit`) has no room."""
    allocator = CachingAllocator(limit, expandable)
    malloc, free = allocator.malloc, allocator.free
    blocks: list[Block] = []
    allocate = blocks.append
    phases, start = [], 0
    for end in ends:
        for event in events[start:end]:
            if event >= 0:
                allocate(malloc(event))
            else:
                free(blocks[~event])
        phases.append(Phase(allocator.allocated, allocator.peak_allocated, allocator.reserved,
                            allocator.peak_reserved))
        allocator.reset_peaks()
        start = end
    return phases
