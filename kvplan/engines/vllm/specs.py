"""vLLM's KV-cache specs, as `vllm/v1/kv_cache_interface.py` (vLLM 0.33.0) declares them: what one layer keeps
(`VllmSpec`, its `get_kv_cache_spec`), a KV-cache group of layers sharing the block pool (`VllmGroup`,
`KVCacheGroupSpec`), and the pages a Mamba-style state takes per request (`StatePages`,
`MambaSpec.max_memory_usage_bytes`). Plain values: the engine builds them (`engine.py`, `families.py`), the
grouping groups them (`grouping.py`), the pool counts their blocks (`pool.py`)."""

from typing import NamedTuple


class VllmGroup(NamedTuple):
    """KV-cache groups of one layer spec: `groups` groups sharing the block pool."""

    kind: str
    groups: int
    block_size: int
    window: int = 0


class VllmSpec(NamedTuple):
    """One layer's KV-cache spec as vLLM builds it (`get_kv_cache_spec`; `vllm/v1/kv_cache_interface.py`): the block
    table it keeps (`kind` and `window`: full, sliding, chunked, recurrent, cross), the tokens one block covers, the
    bytes of one page as vLLM pads it (`page_size_bytes`), and the bytes a block's stride must be a multiple of
    (`block_stride_alignment`; 1: none). Layers of one kind, window and block size are one type to the grouping
    (`UniformTypeKVCacheSpecs.is_uniform_type`); Mamba states also need equal pages and the same TP sharding
    (`tp_replicated`: every GPU holds the whole state). Kinds: full, sliding, chunked, cross, recurrent, and ring (a
    `CircularBufferSpec`: one block a request, whatever its length)."""

    kind: str
    block_size: int
    page: int
    window: int = 0
    stride_alignment: int = 1
    tp_replicated: bool = False

    @property
    def uniform_type(self) -> tuple:
        if self.kind == "recurrent":
            return self.kind, self.page, self.tp_replicated
        return self.kind, self.window, self.block_size


class StatePages(NamedTuple):
    """Pages a Mamba-style layer's group takes per request: `reserved` at start-up and admission
    (`MambaSpec.max_memory_usage_bytes`), `held` in steady decode, where the prefill checkpoint page is free."""

    reserved: int
    held: int

