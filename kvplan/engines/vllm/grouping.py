"""vLLM's grouping of layer specs into KV-cache groups over one block pool, and the bytes of a block
(`get_kv_cache_groups`, `_get_packed_kv_cache_groups`, `unify_kv_cache_spec_page_size`,
`_get_kv_cache_bytes_per_block`: vllm/v1/core/kv_cache_planning.py and kv_cache_utils.py, vLLM 0.33.0). The specs
come from the engine (`engine.py`, `families.py`); the pool over the groups is `pool.py`'s."""

import math

from kvplan.engines.base import cdiv, pad
from kvplan.engines.vllm.specs import VllmGroup, VllmSpec
from kvplan.errors import KvplanError
from kvplan.model import ModelSpec, distinct_caches


def kv_cache_groups(specs: dict[VllmSpec, int], model: ModelSpec, notes: list[str], packed: bool,
                    version: tuple[int, ...]) -> tuple[list[VllmGroup], int]:
    """The layers' specs in KV-cache groups over one block pool (`get_kv_cache_groups`,
    v1/core/kv_cache_planning.py), and the bytes of one block. One type of spec (UniformTypeKVCacheSpecs): one
    group, a block is one page of every layer. Several, under a block-outermost layout with pages of different
    sizes: `packed_groups`. Otherwise one page size for all (a smaller page that divides the largest gets a
    proportionally larger block size; one that does not keeps its block size in a page padded to the largest, which
    MLA pages cannot be: `unify_kv_cache_spec_page_size`), layers bucketed by spec, buckets cut into groups of
    group_size layers (padding the last)."""
    kinds = {(s.kind, s.window, s.block_size) for s in specs}
    if len(kinds) == 1:
        (kind, window, block), = kinds
        groups = [VllmGroup(kind=kind, groups=1, block_size=block, window=window)]
        return groups, sum(s.page * count for s, count in specs.items())
    if packed and len({s.page for s in specs}) > 1:
        groups, block_bytes = packed_groups(specs, version)
        notes.append(f"{sum(g.groups for g in groups)} KV-cache groups packed block by block (a block-outermost "
                     f"layout): a block holds a page of every layer of the widest group, {block_bytes:,} B")
        return groups, block_bytes
    mla = any(c.kind == "mla" for c in distinct_caches(model.caches))
    max_page = max(s.page for s in specs)
    buckets = []
    for spec, count in specs.items():
        if max_page % spec.page and mla:
            raise KvplanError(f"vLLM cannot give {model.name}'s layers one page size "
                              f"({spec.page} vs {max_page} B)")
        size = spec.block_size
        if spec.kind != "recurrent" and not max_page % spec.page:
            size = spec.block_size * (max_page // spec.page)
        if max_page % spec.page:
            notes.append(f"{spec.kind} pages of {spec.page:,} B padded to {max_page:,} B")
        buckets.append((spec, size, count))
    counts = [count for _, _, count in buckets]
    group_size = min(counts)
    if max(counts) < 1.5 * min(counts):
        group_size = max(counts)
    padding = sum(cdiv(c, group_size) * group_size - c for c in counts)
    if padding:
        notes.append(f"{padding} padding layers: each KV-cache group has {group_size} layers")
    groups = [VllmGroup(kind=s.kind, groups=cdiv(c, group_size), block_size=size, window=s.window)
              for s, size, c in buckets]
    return groups, group_size * max_page


def approximate_gcd(values: list[int], lower_bound: int) -> int:
    """The d in [lower_bound, max(values)] that pads `values` least when each is rounded up to a multiple of d,
    the larger d on a tie (`_approximate_gcd`, v1/core/kv_cache_planning.py)."""
    best, least = lower_bound, None
    for d in range(lower_bound, max(values) + 1):
        padding = sum(-x % d for x in values)
        if least is None or padding <= least:
            best, least = d, padding
    return best


def packed_groups(specs: dict[VllmSpec, int], version: tuple[int, ...]) -> tuple[list[VllmGroup], int]:
    """vLLM's grouping for a block-outermost layout, where a block holds one page of every layer of its group side
    by side, whatever their sizes (`_get_packed_kv_cache_groups`, v1/core/kv_cache_planning.py, vLLM 0.29.0 to
    0.33.0). Layers are bucketed by type; a bucket whose page sizes have equal layer counts is a repeating pattern
    (one layer of each size per repeat), "balanced". The largest balanced bucket that mixes page sizes stays whole;
    its layers per page size are the floor of the repeats per group, r = approximate_gcd(every balanced bucket's
    largest count, that floor); a balanced bucket splits into cdiv(its largest count, r) groups of every
    num_groups-th repeat, any other bucket is one group. State buckets (recurrent states and rings; from 0.30.0 also
    sliding windows when no bucket mixes page sizes) split further, to as many states as fit in the widest group.
    A block costs the widest group's pages, rounded up, from 0.32.0, to the stride alignments
    (`_get_kv_cache_bytes_per_block`).

    Returns the groups, with their kinds, block sizes and windows, and the bytes of one block."""
    buckets: dict[tuple, dict[VllmSpec, int]] = {}
    for spec, count in specs.items():
        bucket = buckets.setdefault(spec.uniform_type, {})
        bucket[spec] = bucket.get(spec, 0) + count
    balanced = {key: len(set(bucket.values())) == 1 for key, bucket in buckets.items()}
    floor = max((max(bucket.values()) for key, bucket in buckets.items() if balanced[key] and len(bucket) > 1),
                default=0)
    repeats = approximate_gcd([max(b.values()) for k, b in buckets.items() if balanced[k]], floor) if floor else None

    def is_state(key: tuple) -> bool:
        return key[0] in ("recurrent", "ring") or (repeats is None and key[0] == "sliding" and version >= (0, 30))

    def splits(key: tuple) -> int:
        return cdiv(max(buckets[key].values()), repeats) if balanced[key] and repeats else 1

    def widest(key: tuple, n: int) -> int:
        return sum(cdiv(count, n) * spec.page for spec, count in buckets[key].items())

    anchor = max(widest(key, sum(buckets[key].values()) if is_state(key) else splits(key)) for key in buckets)
    groups, widths = [], []
    for key, bucket in buckets.items():
        n = splits(key)
        if is_state(key):
            first = next(iter(bucket))
            n = max(n, cdiv(sum(bucket.values()), max(anchor // first.page, 1)))
        if n > 1 and not balanced[key]:
            raise KvplanError("vLLM cannot split a KV-cache bucket whose page sizes have unequal layer counts")
        widths.append(widest(key, n))
        spec = next(iter(bucket))
        groups.append(VllmGroup(kind=spec.kind, groups=n, block_size=spec.block_size, window=spec.window))
    alignment = math.lcm(*(spec.stride_alignment for spec in specs)) if version >= (0, 32) else 1
    return groups, pad(max(widths), alignment)

