"""vLLM's block pool over its KV-cache groups: the blocks a request reserves at admission and holds in steady decode
(`KVCacheManager.allocate_slots` and `remove_skipped_blocks`: vllm/v1/core/kv_cache_manager.py,
single_type_kv_cache_manager.py), what a cached prefix shares (block_pool.py), and the start-up log
(`kv_cache_utils.py`), as of vLLM 0.33.0. The groups and the bytes of a block come from `grouping.py`."""

from pydantic import BaseModel, ConfigDict

from kvplan.engines.base import WINDOWED, KVPool, cdiv
from kvplan.engines.vllm.specs import StatePages, VllmGroup


class VllmLog(BaseModel):
    """The numbers vLLM logs at start-up for max_model_len L (`kv_cache_utils.py`)."""

    model_config = ConfigDict(defer_build=True)

    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    lines: list[str]


class VllmPool(KVPool):
    """vLLM's block pool: every block costs `block_bytes` (group size x page; packed: the widest group's pages),
    whatever group uses it."""

    def __init__(self, groups: list[VllmGroup], block_bytes: int, in_flight: int, encoder_tokens: int | None,
                 batched_tokens: int, log_formula: str, notes: list[str], state_pages: StatePages,
                 max_sequences: int | None, prefix_caching: bool, device: str):
        self.groups, self.block_bytes, self.in_flight = groups, block_bytes, in_flight
        self.prefix_caching, self.device = prefix_caching, device
        self.max_sequences = max_sequences
        self.state_pages, self.decode_state_pages = state_pages
        self.frees_in_decode = any(g.kind in (*WINDOWED, "cross") for g in groups) or (  # `decode_blocks`
            self.decode_state_pages < self.state_pages and any(g.kind == "recurrent" for g in groups))
        self.encoder_tokens, self.batched_tokens = encoder_tokens, batched_tokens
        self.log_formula, self.notes = log_formula, notes
        # Block counts by ctx, summed over the groups once: a search for the users that fit asks at one ctx for
        # many user counts (`kvplan.capacity.max_users`).
        self._per_request: dict[int, int] = {}
        self._held: dict[int, int] = {}

    def blocks(self, group: VllmGroup, max_len: int) -> int:
        """Blocks one request reserves in one group (`max_memory_usage_bytes` / page), which is also what vLLM's
        admission gate asks free for a prompt of max_len tokens (`max_admission_blocks_per_request`, with
        scheduler_reserve_full_isl): full cdiv(L, B); sliding cdiv(min(W - 1 + I, L), B) + 1; chunked
        cdiv(min(C + I, L), B); Mamba `state_pages` (Vllm.state_pages); a ring 1; cross-attention
        cdiv(max_num_encoder_input_tokens, B), which vLLM sets to max_num_batched_tokens (`SchedulerConfig`), at
        least L for an encoder-decoder, whose chunked prefill is off (`EngineArgs`; vLLM refuses a smaller
        --max-num-batched-tokens)."""
        b, window = group.block_size, group.window
        if group.kind == "sliding":
            return cdiv(min(window - 1 + self.in_flight, max_len), b) + 1
        if group.kind == "chunked":
            return cdiv(min(window + self.in_flight, max_len), b)
        if group.kind == "recurrent":
            return self.state_pages
        if group.kind == "ring":
            return 1
        if group.kind == "cross":
            return cdiv(max(self.batched_tokens, max_len), b)
        return cdiv(max_len, b)

    def decode_blocks(self, group: VllmGroup, ctx: int) -> int:
        """Blocks a sequence holds in steady decode, where each step schedules one token a request: before it
        allocates, `remove_skipped_blocks` frees what the window no longer reads (v1/core/kv_cache_manager.py
        `allocate_slots`), so a sliding layer keeps the blocks of its last W tokens, at most cdiv(W, B) + 1 where
        they straddle a block boundary; a chunked layer its current chunk; a cross-attention layer the request's
        encoder tokens (the scheduler allocates cdiv(encoder tokens, B) for them; as many as the context for a
        text encoder); a Mamba-style layer its running state and the last block-aligned one, its prefill
        checkpoint page freed (`MambaManager.remove_skipped_blocks`; `StatePages`). The in-flight tokens a
        sliding layer reserves for are a prefill chunk's: they count where a prompt is admitted (`blocks`), not
        here."""
        b, window = group.block_size, group.window
        if group.kind == "sliding":
            return min(cdiv(window, b) + 1, cdiv(ctx, b))
        if group.kind == "chunked":
            return min(cdiv(window, b), cdiv(ctx, b))
        if group.kind == "cross":
            return cdiv(self.encoder_tokens or ctx, b)
        if group.kind == "recurrent":
            return self.decode_state_pages
        return self.blocks(group, ctx)

    def blocks_per_request(self, max_len: int) -> int:
        if max_len not in self._per_request:
            self._per_request[max_len] = sum(g.groups * self.blocks(g, max_len) for g in self.groups)
        return self._per_request[max_len]

    def blocks_held(self, ctx: int) -> int:
        """Blocks one sequence holds in steady decode (`decode_blocks`, over the groups)."""
        if ctx not in self._held:
            self._held[ctx] = sum(g.groups * self.decode_blocks(g, ctx) for g in self.groups)
        return self._held[ctx]

    def shared_blocks(self, prefix: int) -> int:
        """Blocks a cached prefix saves each further request: its whole blocks in full-attention groups, where
        prefix caching is on."""
        if not prefix or not self.prefix_caching:
            return 0
        return sum(g.groups * (prefix // g.block_size) for g in self.groups if g.kind == "full")

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """(users x blocks per request - (users - 1) x shared prefix blocks + 1 null block) x block bytes."""
        return self._bytes(users, self.blocks_per_request(ctx), shared_prefix)

    def steady_bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """(users x blocks held in steady decode - (users - 1) x shared prefix blocks + 1 null block) x block
        bytes: what `users` requests at ctx hold while they decode, with no request preempted (vLLM preempts a
        running request only when a decode step finds no free block, v1/core/sched/scheduler.py `schedule`)."""
        return self._bytes(users, self.blocks_held(ctx), shared_prefix)

    def _bytes(self, users: int, per_user: int, shared_prefix: int) -> int:
        if users == 0:
            return self.block_bytes
        shared = self.shared_blocks(shared_prefix)
        return (users * per_user - (users - 1) * shared + 1) * self.block_bytes

    def bytes_per_sequence(self, ctx: int) -> int:
        """blocks per request x block bytes (`bytes_for`(1) - `bytes_for`(0), without its calls: a planning table
        asks for every cell)."""
        return self.blocks_per_request(ctx) * self.block_bytes

    def bytes_per_sequence_decode(self, ctx: int) -> int:
        return self.blocks_held(ctx) * self.block_bytes

    def users_within(self, budget: int, ctx: int, shared_prefix: int = 0, steady: bool = False) -> int | None:
        """N users take N x (blocks per user - shared prefix blocks) + shared + 1 null block, linear in N, so the
        most that fit is (budget // block bytes - shared - 1) // (blocks per user - shared), a user's blocks
        reserved at start-up or held in steady decode; None where a user costs no block of its own (the search
        says so)."""
        shared = self.shared_blocks(shared_prefix)
        per_user = self.blocks_held(ctx) if steady else self.blocks_per_request(ctx)
        if per_user <= shared:
            return None
        return max(0, (budget // self.block_bytes - shared - 1) // (per_user - shared))

    def log(self, available: int, max_len: int) -> VllmLog:
        """num_blocks = available // block bytes; concurrency = num_blocks / blocks per request;
        tokens = int(concurrency x L) (0.21.0 on) or num_blocks // groups x block size (before); the device is
        the platform's, GPU or CPU (`_kv_cache_device_name`)."""
        num_blocks = max(available, 0) // self.block_bytes
        concurrency = num_blocks / self.blocks_per_request(max_len)
        if self.log_formula == "concurrency":
            tokens = int(concurrency * max_len)
        else:
            n_groups = sum(g.groups for g in self.groups)
            tokens = num_blocks // n_groups * min(g.block_size for g in self.groups)
        return VllmLog(num_blocks=num_blocks, kv_cache_tokens=tokens, max_concurrency=concurrency, lines=[
            f"{self.device} KV cache size: {tokens:,} tokens",
            f"Maximum concurrency for {max_len:,} tokens per request: {concurrency:.2f}x",
        ])

