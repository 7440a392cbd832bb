"""SGLang: a token pool of page size 1, the separate sliding-window pool of allow-listed hybrids, the Mamba pool of
recurrent hybrids, the requests it runs at once, its EAGLE heads and drafts."""

import math
from fractions import Fraction
from typing import NamedTuple

from kvplan.dtypes import ALIASES as DTYPE_ALIASES
from kvplan.dtypes import DType, kv_dtype
from kvplan.engines.base import (
    FLAG_NAMES,
    WEIGHT_GROUPS,
    WINDOWED,
    EagleHeadWeights,
    Engine,
    GiB,
    KVPool,
    Layers,
    MiB,
    Overhead,
    cdiv,
    is_windowed,
    rows,
)
from kvplan.engines.speculative import eagle1_fields, eagle_reads, eagle_shape
from kvplan.errors import KvplanError
from kvplan.model import EMPTY_KINDS, REPLICATED_GROUPS, LayerCache, ModelSpec, RecurrentState, SharedKV

# Models SGLang gives separate full and sliding-window pools (`is_hybrid_swa_model`), by config model_type.
SGLANG_HYBRID_SWA = frozenset({"llama4", "llama4_text", "gpt_oss", "gemma4", "gemma4_text", "mimo_v2_flash",
                               "step3p5"})
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8
# --mamba-full-memory-ratio's default, the Mamba pool's memory over the KV pool's (`arg_groups/fields/schedule.py`):
# the Mamba pool gets 0.9 / 1.9 of the budget unless --max-mamba-cache-size fixes its slots.
SGLANG_MAMBA_FULL_MEMORY_RATIO = Fraction(9, 10)
SGLANG_MAMBA_SHARE = SGLANG_MAMBA_FULL_MEMORY_RATIO / (1 + SGLANG_MAMBA_FULL_MEMORY_RATIO)
# Mamba slots SGLang 0.5.23 counts per running request, by the model type of the families whose state it keeps in its
# Mamba pool (`configs/hybrid_arch.py` mambaish_config, with attention layers beside): 3
# (MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO, mem_cache/kv_cache_configurator.py) plus, for the architectures that
# support MambaRadixCache's extra_buffer (`arg_groups/overrides.py` _MAMBA_EXTRA_BUFFER_ARCHS), which "auto" picks
# under the default overlap schedule, its 2 ping-pong tracking slots (`mem_cache/allocation_sizing.py`
# get_mamba_tracking_slots); LFM2 runs no_buffer (overlap off), 3.
SGLANG_MAMBA_SLOTS = {"qwen3_next": 5, "qwen3_5_text": 5, "qwen3_5_moe_text": 5, "kimi_linear": 5, "falcon_h1": 5,
                      "granitemoehybrid": 5, "nemotron_h": 5, "lfm2": 3, "lfm2_moe": 3}
# Families whose SGLang config passes itself to `mamba2_state_dtype` (configs/qwen3_next.py, falcon_h1.py), which
# reads the config's mamba_ssm_dtype; the others (granitemoehybrid.py, kimi_linear.py, ...) and configs that name
# none keep the SSM state in float32. Nemotron-H's configs name theirs mamba_ssm_cache_dtype, which SGLang does not
# read (configs/nemotron_h.py): float32.
SGLANG_READS_SSM_DTYPE = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "falcon_h1"})
# Recurrent families SGLang 0.5.23 has no model class for (srt/models/: no jamba.py, bamba.py, zamba*.py,
# minimax_text_01, rwkv, xlstm, recurrent_gemma.py, plamo2.py).
SGLANG_NO_MODEL = frozenset({"jamba", "bamba", "zamba", "zamba2", "minimax", "rwkv", "xlstm", "recurrent_gemma",
                             "plamo2"})
# Attention-free families SGLang runs (models/mamba.py, mamba2.py, falcon_mamba.py) whose pools kvplan does not model.
SGLANG_ATTENTION_FREE = frozenset({"mamba", "mamba2", "falcon_mamba"})
# Model types whose SGLang 0.5.23 model class builds every layer on every rank (`make_layers` without the pipeline
# split, no start_layer / end_layer): no pipeline parallelism.
SGLANG_NO_PIPELINE = {"nemotron-nas": "DeciLMForCausalLM (srt/models/nemotron_nas.py)",
                      "gemma3n": "Gemma3nTextModel (srt/models/gemma3n_causal.py)",
                      "gemma3n_text": "Gemma3nTextModel (srt/models/gemma3n_causal.py)"}
SGLANG_MAX_RUNNING_REQUESTS = (2048, 4096)  # resolve_max_num_reqs' clamp of its estimate
# --max-running-requests under speculative decoding when not given (`arg_groups/speculative_hook.py`
# _handle_eagle_family, _handle_ngram: "Max running requests is reset to 48 for speculative decoding").
SGLANG_SPECULATIVE_MAX_RUNNING_REQUESTS = 48
SGLANG_DEFAULT_CONTEXT = 2048  # get_context_length when the config names none (utils/hf_transformers/common.py)


class SglangPool(KVPool):
    """A token pool (page size 1) of `full_cell` bytes per token; allow-listed hybrids add a sliding-window
    pool holding swa_full_tokens_ratio (0.8) as many tokens, with `swa_cell` bytes per token. The requests it runs
    at once, of the T tokens a budget holds (`resolve_max_num_reqs`, mem_cache/kv_cache_configurator.py):
        max_running_requests = min(clamp(T / context_len x 512, 2048, 4096), T // 2)
    or, given one (`requests`: 48 with a draft), min(requests, T // 2); T counts the full-attention pool's
    tokens."""

    def __init__(self, full_cell: int, swa_cell: int, window: int, notes: list[str], draft_tokens: int = 0,
                 context_len: int = SGLANG_DEFAULT_CONTEXT, requests: int | None = None):
        self.full_cell, self.swa_cell, self.window = full_cell, swa_cell, window
        self.notes, self.draft_tokens, self.context_len, self.requests = notes, draft_tokens, context_len, requests

    def full_tokens(self, budget: int) -> int:
        """The full-attention pool's tokens in `budget`: budget // cell, or beside a sliding-window pool of
        ceil(0.8 x F) tokens the largest F with F x full cell + ceil(0.8 x F) x window cell within it; none where
        the budget is below zero (weights that leave the GPU no room)."""
        budget = max(budget, 0)
        if not self.swa_cell:
            return budget // self.full_cell
        ratio = SGLANG_SWA_FULL_TOKENS_RATIO
        tokens = int(budget // (self.full_cell + ratio * self.swa_cell)) + 1
        while tokens and tokens * self.full_cell + math.ceil(tokens * ratio) * self.swa_cell > budget:
            tokens -= 1
        return tokens

    def sequence_limit(self, budget: int) -> int:
        return self.request_limit(self.full_tokens(budget))

    def request_limit(self, tokens: int) -> int:
        """max_running_requests for a pool of `tokens` tokens."""
        if self.requests is not None:
            return min(self.requests, tokens // 2)
        low, high = SGLANG_MAX_RUNNING_REQUESTS
        return min(max(tokens * 512 // self.context_len, low), high, tokens // 2)

    def users_within(self, budget: int, ctx: int, shared_prefix: int = 0, steady: bool = False) -> int | None:
        """The users whose tokens the full pool holds (at most `sequence_limit` run: capacity applies it)."""
        if self.swa_cell:
            return None
        tokens, held = self.full_tokens(budget), ctx + self.draft_tokens
        if tokens < held:
            return 0
        more = (tokens - held) // (held - shared_prefix) if held > shared_prefix else tokens
        return 1 + more

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """`draft_tokens`: the slots speculative decoding allocates per request for a step's drafts."""
        if users == 0:
            return 0
        full = users * (ctx + self.draft_tokens) - (users - 1) * shared_prefix  # a shared prefix is kept once
        if not self.swa_cell:
            return full * self.full_cell
        ratio = SGLANG_SWA_FULL_TOKENS_RATIO
        full = max(full, math.ceil(users * min(ctx, self.window) / ratio))
        return full * self.full_cell + math.ceil(full * ratio) * self.swa_cell


class SglangSplit(NamedTuple):
    """How SGLang 0.5.23 splits one GPU's budget for a model with a Mamba pool, as its start-up log reports it:
    `Mamba Cache is allocated. max_mamba_cache_size`, `KV Cache is allocated. #tokens`, `max_running_requests`."""

    mamba_slots: int
    kv_tokens: int
    max_running_requests: int


class SglangMambaPool(SglangPool):
    """SGLang 0.5.23's KV pool beside its Mamba state pool (`KVCacheConfigurator._handle_max_mamba_cache` and
    `resolve_max_num_reqs`, mem_cache/kv_cache_configurator.py). Of a budget B, with r = --mamba-full-memory-ratio
    (default 0.9; `share` r / (1 + r)) and s = slots_per_request:
        slots K  = floor(B x r / (1 + r) / slot) - 1          the pool holds K + 1
        tokens T = (B - (K + 1) x slot) // full_cell          (DefaultPoolConfigurator, page size 1)
        max_running_requests = min(clamp(T / context_len x 512, 2048, 4096), T // 2, K // s)
    Under speculative decoding (`draft_tokens` D, speculative_num_draft_tokens; `requests` R, max_running_requests
    48 unless given) the Mamba share also holds each running request's per-draft states (memory_pool.py
    `intermediate_ssm_state_cache` and `intermediate_conv_window_cache`, (layers, R' + 1, D, ...)), reserved as D
    slots a request, jointly solved:
        K  = floor((B x r / (1 + r) - slot x (1 + D)) / (slot x (1 + D / s)))
        R' = min(R, K // s)
        T  = (B - (K + 1) x slot - (R' + 1) x D x slot) // full_cell
        max_running_requests = min(R, T // 2, K // s)
    With --max-mamba-cache-size N (`fixed_slots`: K = N // DP ranks, whatever B; r unused) the same T and
    max_running_requests follow from that K, which also caps the requests any budget serves (`sequence_limit`).
    SGLang works in GiB floats (total_rest_memory); these exact fractions can differ from it by a slot or a token
    where a quotient lands within rounding of a whole number.
    The users that fit are the least of the KV tokens' limit and max_running_requests, counted from the split
    (`users_within`); `bytes_for` is the least budget whose split serves them."""

    def __init__(self, full_cell: int, slot_bytes: int, slots_per_request: int, context_len: int, notes: list[str],
                 draft_tokens: int = 0, requests: int | None = None, share: Fraction = SGLANG_MAMBA_SHARE,
                 fixed_slots: int | None = None):
        super().__init__(full_cell=full_cell, swa_cell=0, window=0, notes=notes, draft_tokens=draft_tokens,
                         context_len=context_len, requests=requests)
        self.slot_bytes, self.slots_per_request = slot_bytes, slots_per_request
        self.share, self.fixed_slots = share, fixed_slots

    def full_tokens(self, budget: int) -> int:
        return self.split(budget).kv_tokens

    def sequence_limit(self, budget: int) -> int:
        return self.split(budget).max_running_requests

    def users_within(self, budget: int, ctx: int, shared_prefix: int = 0, steady: bool = False) -> int:
        """As the token pool counts them, at most max_running_requests (which the split's note explains)."""
        return min(super().users_within(budget, ctx, shared_prefix, steady), self.sequence_limit(budget))

    def draft_slots(self, slots: int) -> int:
        """Slots' worth of draft states reserved beside K slots: (min(R, K // s) + 1) x D, speculating."""
        if not self.draft_tokens:
            return 0
        return (min(self.requests, max(slots, 0) // self.slots_per_request) + 1) * self.draft_tokens

    def slots_in(self, budget: int) -> int:
        """K, the Mamba slots of `budget`'s split (the fixed slots, or the share's, as the class docstring says)."""
        share, slot, drafts = self.share, self.slot_bytes, self.draft_tokens
        if self.fixed_slots is not None:
            return self.fixed_slots
        if not drafts:
            return budget * share.numerator // (share.denominator * slot) - 1
        per_request = self.slots_per_request
        return ((budget * share.numerator - slot * (1 + drafts) * share.denominator) * per_request
                // (share.denominator * slot * (per_request + drafts)))

    def least_budget_for(self, slots: int) -> int:
        """The least budget whose share gives at least `slots` slots: slots_in solved for the budget."""
        share, slot, drafts, per_request = self.share, self.slot_bytes, self.draft_tokens, self.slots_per_request
        if not drafts:
            return cdiv((slots + 1) * share.denominator * slot, share.numerator)
        return cdiv(slots * share.denominator * slot * (per_request + drafts)
                    + slot * (1 + drafts) * share.denominator * per_request, share.numerator * per_request)

    def fixed_bytes(self, slots: int) -> int:
        """What K slots take of the budget before the KV pool: the K + 1 slots and the drafts' states."""
        return (slots + 1 + self.draft_slots(slots)) * self.slot_bytes

    def split(self, budget: int) -> SglangSplit:
        slots = self.slots_in(budget)
        if slots <= 0:
            return SglangSplit(0, 0, 0)
        tokens = max(0, budget - self.fixed_bytes(slots)) // self.full_cell
        return SglangSplit(slots, tokens, min(self.request_limit(tokens), slots // self.slots_per_request))

    def tokens_needed(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """The least KV tokens T of a split that serves `users`: their tokens (a shared prefix once), and T large
        enough that max_running_requests (T // 2, and T / context_len x 512 above 2,048 requests) admits them."""
        tokens = max(users * (ctx + self.draft_tokens) - (users - 1) * shared_prefix, 2 * users)
        if users > SGLANG_MAX_RUNNING_REQUESTS[0] and self.requests is None:
            tokens = max(tokens, cdiv(users * self.context_len, 512))
        return tokens

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """The least budget whose split serves `users` (as `users_within` counts them). The users need K >= s x
        users slots and T >= tokens_needed; the budgets that give K slots form a range, within which T grows with the
        budget, so range K's least budget that serves them is the larger of its start and fixed_bytes(K) + T x cell
        (`least_in_range`), if the range holds it; the first K whose range does gives the answer (both grow with
        K). Along K a range's end gains on fixed_bytes(K) but where a speculating pool reserves one more request's
        draft states, every s slots: so within each run of s slots (of one slot, not speculating) the first K that
        serves is found by stepping, and the run by bisecting over the runs' last slots. (Stepping K by K took
        steps in proportion to --mamba-full-memory-ratio: the share's gain per slot over a slot's price is
        1 / ratio of it.)"""
        fixed = self.fixed_slots
        if users == 0:
            return 0 if fixed is None else self.fixed_bytes(fixed)
        kv = self.tokens_needed(users, ctx, shared_prefix) * self.full_cell
        if fixed is not None:
            return self.fixed_bytes(fixed) + kv
        run = self.slots_per_request if self.draft_tokens else 1
        first = max(1, users * self.slots_per_request)
        last_of_run = first // run * run + run - 1
        for slots in range(first, last_of_run + 1):  # the rest of the first run
            if (least := self.least_in_range(slots, kv)) is not None:
                return least
        low, step = first // run, 1  # runs are numbered by slots // run; run `low` holds none
        while self.least_in_range((low + step) * run + run - 1, kv) is None:
            low, step = low + step, step * 2
        high = low + step
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if self.least_in_range(middle * run + run - 1, kv) is not None else (middle, high)
        return next(least for slots in range(high * run, high * run + run)
                    if (least := self.least_in_range(slots, kv)) is not None)

    def least_in_range(self, slots: int, kv: int) -> int | None:
        """The least budget of those giving `slots` slots whose KV pool holds `kv` bytes, or None where none does."""
        least = max(self.least_budget_for(slots), self.fixed_bytes(slots) + kv)
        return least if self.slots_in(least) == slots else None

    def budget_notes(self, budget: int, ctx: int) -> list[str]:
        split = self.split(budget)
        if not split.mamba_slots:
            return [f"SGLang's Mamba pool: this budget holds no state slot of {self.slot_bytes:,} B"]
        by_slots = split.mamba_slots // self.slots_per_request
        binding = ("the Mamba pool" if by_slots == split.max_running_requests
                   else "the KV pool's tokens" if split.max_running_requests == split.kv_tokens // 2
                   else "SGLang's request limit")
        users = self.users_within(budget, ctx)
        bound = ("the KV tokens" if users < split.max_running_requests
                 else f"max_running_requests, set by {binding}")
        sizing = ("slots fixed, the KV pool gets the rest" if self.fixed_slots is not None
                  else f"{self.share.numerator}/{self.share.denominator} to the Mamba pool")
        notes = [f"SGLang's split of the budget ({sizing}): {split.mamba_slots:,} Mamba slots "
                 f"({(split.mamba_slots + 1) * self.slot_bytes / GiB:,.2f} GiB), {split.kv_tokens:,} KV tokens, "
                 f"max_running_requests {split.max_running_requests:,} ({split.mamba_slots:,} slots / "
                 f"{self.slots_per_request} = {by_slots:,}); users at ctx {ctx:,} are bound by {bound}"]
        if self.draft_tokens:
            verified = min(self.requests, by_slots) + 1
            notes.append(f"SGLang reserves the draft tokens' states of {verified:,} requests ({verified:,} x "
                         f"{self.draft_tokens} draft tokens x {self.slot_bytes:,} B = "
                         f"{verified * self.draft_tokens * self.slot_bytes / GiB:,.2f} GiB) beside its Mamba slots")
        return notes


class Sglang(Engine):
    """SGLang (`server_args.py` `_handle_gpu_memory_settings`, `model_runner.py` profile_max_num_token)."""

    sequence_limit_reason = "max_running_requests {limit:,}"
    name = "sglang"
    label = "SGLang"
    default_version = "0.5.23"
    kv_dtypes = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8")
    fraction_flag = "--mem-fraction-static"
    data_parallel = True
    tp_spans_dp = True

    @property
    def tp_size(self) -> int:
        """SGLang's --tp-size: the GPUs of a stage, attention TP x DP ranks (attention TP = tp_size / dp_size with
        --enable-dp-attention, `dp_attention.py` compute_dp_attention_world_info)."""
        return self.tp * self.dp

    @classmethod
    def splits_into_stages(cls, model: ModelSpec) -> bool:
        """Not a model with a recurrent state (its Mamba pool under PP is not modelled: `mamba_pool` refuses it), nor
        one whose model class has no pipeline split (SGLANG_NO_PIPELINE: `pool` refuses it)."""
        return (model.architecture not in SGLANG_NO_PIPELINE
                and not any(cache.kind == "recurrent" for cache in model.caches))

    def stage_sizes(self, num_layers: int) -> list[int]:
        """num_layers // pp layers a stage, the remainder one apiece to the last stages (SGLang 0.5.23
        `get_pp_indices`, srt/distributed/utils.py, without SGLANG_PP_LAYER_PARTITION)."""
        extra = num_layers % self.pp
        return [num_layers // self.pp + (rank >= self.pp - extra) for rank in range(self.pp)]

    @classmethod
    def ep_size_problem(cls, ep: int, stage: int) -> str | None:
        """--ep-size divides --tp-size: each EP rank's experts are sliced tp_size / ep_size ways (`moe_tp_size`)."""
        return None if stage % ep == 0 else f"--ep {ep} does not divide SGLang's --tp {stage} (MoE TP = tp / ep)"

    @classmethod
    def parallel_problem(cls, model: ModelSpec, tp: int, dp: int, ep: int) -> str | None:
        """Every EP rank holds E / ep_size whole experts (the EP MoE layer asserts num_experts % ep_size == 0)."""
        problem = super().parallel_problem(model, tp, dp, ep)
        if problem is None and ep > 1 and model.widths.experts % ep:
            return (f"--ep {ep} does not divide {model.name}'s {model.widths.experts} routed experts: SGLang gives "
                    "every EP rank as many")
        return problem

    def weight_shares(self, model: ModelSpec) -> dict[str, Fraction]:
        """Attention splits by the attention TP; the dense MLP and shared experts, lm_head and routed experts by all
        tp_size GPUs of a stage (the defaults: --moe-dense-tp-size unset, --moe-a2a-backend none,
        --enable-dp-lm-head off; routed experts E / ep_size a rank, each sliced tp_size / ep_size ways); with DP
        attention the embedding is whole on every GPU (`VocabParallelEmbedding(enable_tp=not
        is_dp_attention_enabled())`). As `models/deepseek_v2.py` builds them: MLA's down-projections
        (fused_qkv_a_proj_with_mqa), the DSA indexer (`layers/attention/dsa/dsa_indexer.py`), norms and routers
        (`MoEGate`) whole on every GPU, `ReplicatedLinear`s."""
        shares = dict.fromkeys(WEIGHT_GROUPS, Fraction(1, self.tp_size * self.pp))
        for group in ("attention", "other", "vision"):
            shares[group] = Fraction(1, self.tp * self.pp)
        shares.update(dict.fromkeys(REPLICATED_GROUPS, Fraction(1, self.pp)))
        if self.dp > 1:
            shares["embedding"] = Fraction(1, self.pp)
        return shares
    reads = frozenset({"memory_fraction", "speculative_tokens", "speculative_method", "enable_lora", "max_loras",
                       "max_lora_rank", "mamba_ssm_cache_dtype", "max_mamba_cache_size", "mamba_full_memory_ratio",
                       "max_num_seqs", "disable_radix_cache"})
    speculative_methods = ("draft_model", "eagle", "eagle3", "mtp", "ngram")

    @classmethod
    def drafted_tokens(cls, speculative_tokens: int | None) -> int:
        """--speculative-num-draft-tokens counts the token a step verifies beside its drafts: a chain (top-k 1)
        drafts one fewer, --speculative-num-steps (server_args.py requires num_draft_tokens = num_steps + 1 at
        top-k 1)."""
        return max(0, (speculative_tokens or 0) - 1)

    def _buckets(self) -> tuple[int, int]:
        """(chunked_prefill_size, cuda_graph_max_bs) by GPU memory in MiB, as SGLang picks them (CUDA)."""
        mib = self.gpu_bytes // MiB
        tp4 = self.tp_size >= 4
        if mib < 20 * 1024:
            return 2048, 8
        if mib < 35 * 1024:
            return 2048, 80 if tp4 else 24
        if mib < 60 * 1024:
            return 4096, 160 if tp4 else 32
        if mib < 160 * 1024:
            return 8192, 512 if tp4 else 256
        return 16384, 512

    def default_fraction(self) -> float:
        """mem_fraction_static = round((gpu - reserved) / gpu, 3), in MiB, with reserved = 512
        + 1.5 x max(chunked_prefill_size, 2048) + 2 x cuda_graph_max_bs + tp_size x pp / 8 x 1024, with DP attention
        + 3 x cuda_graph_max_bs x dp_size (and 1.5 x more when cuda_graph_max_bs > 300), at least 10 GiB on GPUs
        over 60 GiB (`_handle_gpu_memory_settings`)."""
        if self.gpu_bytes is None:
            raise KvplanError("SGLang's default mem_fraction_static depends on the GPU: give --gpu or --vram")
        mib = self.gpu_bytes / MiB
        chunk, graph_bs = self._buckets()
        reserved = 512 + 1.5 * max(chunk, 2048) + 2 * graph_bs + self.tp_size * self.pp / 8 * 1024
        if self.dp > 1:
            reserved += graph_bs * self.dp * 3 + (graph_bs * self.dp * 1.5 if graph_bs > 300 else 0)
        if mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        return round((mib - reserved) / mib, 3)

    def overhead(self) -> Overhead:
        """mem_fraction_static already leaves room for activations and CUDA graphs; what is used before the
        pool is sized (CUDA context, NCCL) counts against it: 0.5 GiB."""
        return Overhead(cuda_context=GiB // 2)

    compressed_attention = "SGLang 0.5.23 keeps it in its own pools, sglang/srt/mem_cache/deepseek_v4_memory_pool.py"

    def cached_layers(self, model: ModelSpec) -> tuple[LayerCache, ...]:
        """Recurrent states as SGLang 0.5.23's Mamba pool keeps them (`configs/mamba_utils.py` mamba2_state_dtype):
        the convolution in bfloat16 (SGLANG_MAMBA_CONV_DTYPE), the SSM state in float32, or the config's
        mamba_ssm_dtype for the families whose config SGLang reads it from (SGLANG_READS_SSM_DTYPE). Shapes as
        kvplan's: conv (d_inner + 2 G N) x (kernel - 1), SSM heads x head_dim x N, split by TP with the B/C groups
        widened to TP where it does not divide them (`Mamba2StateShape.create`; GDN's, LFM2's and Kimi's the same
        sizes, `KimiLinearStateShape.create`). SGLang's --mamba-ssm-dtype (kvplan's --mamba-ssm-cache-dtype; "auto":
        not given) wins over both for every family: it sets SGLANG_MAMBA_SSM_DTYPE (`arg_groups/serving_hook.py`),
        which mamba2_state_dtype reads last, the default cache params' dtype included."""
        reads = model.architecture in SGLANG_READS_SSM_DTYPE
        flag = DTYPE_ALIASES.get(self.options.mamba_ssm_cache_dtype)  # "auto": none

        def stored() -> tuple[LayerCache, ...]:
            slot_of = self.kv_slots(model)

            def as_stored(cache: LayerCache) -> LayerCache:
                if cache.kind in EMPTY_KINDS:
                    return slot_of(cache)
                if not isinstance(cache, RecurrentState):
                    return cache
                ssm = flag or (cache.ssm_dtype if reads and cache.ssm_dtype_stated and cache.ssm_dtype else "fp32")
                return cache.model_copy(update={"conv_dtype": "bf16", "ssm_dtype": ssm})

            return tuple(as_stored(c) for c in model.caches)

        return self.stored_once(model, stored)

    @staticmethod
    def kv_slots(model: ModelSpec):
        """What SGLang 0.5.23's pools hold for a layer that keeps no K and V of its own. They count the layers of a
        stage, not what each layer's attention does: the token pool holds K and V for every one
        (`DefaultPoolConfigurator`, model_executor/pool_configurator.py: num_effective_layers = end_layer -
        start_layer), the sliding-window pools every layer of each type (`get_hybrid_layer_ids`: layer_types). So
        a KV-shared layer (Gemma 3n, Gemma 4: its RadixAttention reads the source layer's slot and saves nothing)
        is sized as the layer whose K and V it reads, the same type; and a Nemotron-NAS layer whose attention is a
        no-op as its attention layers, one size for all (`get_total_num_kv_heads` takes one KV head count and
        refuses variable GQA). Other layers with no cache keep none."""
        sources = {c.layer: c for c in reversed(model.caches) if c.kind not in EMPTY_KINDS}
        attention = {c.model_copy(update={"layer": 0}) for c in model.caches if c.kind == "full"}
        nas = model.architecture == "nemotron-nas"
        if nas and len(attention) > 1:
            raise KvplanError(f"SGLang 0.5.23 refuses {model.name}: its attention layers have different KV head "
                              "counts (\"Variable GQA (VGQA) is not yet supported for nemotron-nas in sglang\", "
                              "configs/model_config.py)")

        def slot(cache: LayerCache) -> LayerCache:
            if isinstance(cache, SharedKV) and cache.source in sources:
                return sources[cache.source].model_copy(update={"layer": cache.layer})
            if nas and attention:
                return next(iter(attention)).model_copy(update={"layer": cache.layer})
            return cache

        return slot

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> SglangPool:
        """Models with a recurrent state get SGLang's Mamba pool beside the KV pool (`SglangMambaPool`), for the
        families SGLang 0.5.23 keeps so (SGLANG_MAMBA_SLOTS); others with a recurrent state are refused in one line:
        those SGLang has no model class for, attention-free ones (their pool of context_len tokens is not modelled)
        and pipeline-parallel splits (SGLang charges every stage the fullest stage's state)."""
        self.refuse_compressed_attention(model)
        if self.pp > 1 and model.architecture in SGLANG_NO_PIPELINE:
            raise KvplanError(f"SGLang 0.5.23 has no pipeline parallelism for {model.name}: its "
                              f"{SGLANG_NO_PIPELINE[model.architecture]} builds every layer on every GPU; use --tp")
        if any(cache.kind == "recurrent" for cache in model.caches):
            return self.mamba_pool(layers, model, kv, self.given_requests())
        hybrid = model.architecture in SGLANG_HYBRID_SWA
        table = rows(layers, kv, kv_dtype(model.dtype), sliding_as_full=not hybrid)
        windowed = [r for r in table if r.kind in WINDOWED]
        notes = []
        if hybrid and windowed:
            notes.append(f"separate sliding-window pool, {SGLANG_SWA_FULL_TOKENS_RATIO} x the full pool's "
                         "tokens")
        elif any(is_windowed(cache) for cache, _ in layers):
            notes.append(f"{model.architecture} is not on SGLang's hybrid-SWA list: every layer sized full")
        if self.stage_keeps_nothing(table, model):
            raise KvplanError(f"kvplan does not model SGLang with a pipeline stage whose layers keep no KV cache "
                              f"({model.name} at --pp {self.pp}): SGLang sizes that stage's token pool by the "
                              "context length, not its memory (DefaultPoolConfigurator); choose another --pp")
        return SglangPool(full_cell=sum(r.count * r.bytes_per_token for r in table if r.kind == "full"),
                          swa_cell=sum(r.count * r.bytes_per_token for r in windowed),
                          window=max((r.window for r in windowed), default=0), notes=notes,
                          context_len=model.max_context or SGLANG_DEFAULT_CONTEXT, requests=self.given_requests())

    def prefix_sharing_problem(self) -> str | None:
        """A prefix is kept once by SGLang's radix cache (`mem_cache/radix_cache.py`), which --disable-radix-cache
        turns off (a ChunkCache then holds each request's tokens alone)."""
        if self.options.disable_radix_cache:
            return "--disable-radix-cache turns off SGLang's radix cache, which keeps a shared prefix once"
        return None

    def given_requests(self, default: int | None = None) -> int | None:
        """max_running_requests a DP worker runs: --max-running-requests over the attention DP ranks, at least 1
        (`resolve_max_num_reqs`), else `default`."""
        given = self.options.max_num_seqs
        return max(1, given // self.dp) if given else default

    def speculative_requests(self) -> int:
        """max_running_requests a DP worker runs beside a draft: the given one, else 48 over the DP ranks."""
        return self.given_requests(max(1, SGLANG_SPECULATIVE_MAX_RUNNING_REQUESTS // self.dp))

    def mamba_pool(self, layers: Layers, model: ModelSpec, kv: DType,
                   requests: int | None = None) -> SglangMambaPool:
        """`requests`: the max_running_requests a DP rank runs where SGLang has one before it sizes the pool (given,
        or 48 with a draft). --disable-radix-cache (`_calculate_mamba_ratio`, mem_cache/kv_cache_configurator.py)
        counts 1 slot a running request, no MambaRadixCache holding more, and with such a request limit
        `_handle_max_mamba_cache` fixes the slots at it, as --max-mamba-cache-size would."""
        arch = model.architecture
        if arch in SGLANG_NO_MODEL:
            raise KvplanError(f"SGLang 0.5.23 does not run {arch} models ({model.name}): it has no model class for "
                              "them (sglang/srt/models/); use --engine vllm")
        if arch in SGLANG_ATTENTION_FREE:
            raise KvplanError(f"kvplan does not model SGLang's pools for attention-free models ({model.name}): with no "
                              "KV cell its token pool holds context_len tokens in all (DefaultPoolConfigurator); use "
                              "--engine vllm")
        if arch not in SGLANG_MAMBA_SLOTS:
            raise KvplanError(f"kvplan does not model SGLang's Mamba state pool for {arch} models ({model.name}); "
                              "it does for Qwen3-Next, Qwen3.5, Nemotron-H, Granite 4.0-H, Falcon-H1, Kimi Linear "
                              "and LFM2: use --engine vllm")
        if self.pp > 1:
            raise KvplanError(f"kvplan does not model SGLang's Mamba state pool under pipeline parallelism "
                              f"({model.name}: every stage is charged the fullest stage's state): use --tp")
        table = rows(layers, kv, kv_dtype(model.dtype))
        full_cell = sum(r.count * r.bytes_per_token for r in table if r.kind == "full")
        slot = sum(r.count * r.state_bytes for r in table if r.kind == "recurrent")
        if not full_cell or any(r.kind not in ("full", "recurrent") for r in table):
            raise KvplanError(f"kvplan does not model SGLang's pools for {model.name}'s layers beside its recurrent "
                              "state (only full attention is): use --engine vllm")
        no_radix = bool(self.options.disable_radix_cache)
        slots = 1 if no_radix else SGLANG_MAMBA_SLOTS[arch]
        given, stated = self.options.max_mamba_cache_size, self.options.mamba_full_memory_ratio
        ratio = SGLANG_MAMBA_FULL_MEMORY_RATIO if stated is None else Fraction(str(stated))
        share = ratio / (1 + ratio)
        if given is not None:
            fixed = given // self.dp
            sizing = f"--max-mamba-cache-size {given}, {fixed:,} slots a DP rank (+1 padding) whatever the budget"
        elif no_radix and requests is not None:
            fixed = requests
            sizing = (f"--disable-radix-cache with max_running_requests {requests:,} a DP rank: as many slots (+1 "
                      "padding) whatever the budget")
        else:
            fixed = None
            sizing = f"{share.numerator}/{share.denominator} of the budget (mamba_full_memory_ratio {float(ratio)})"
        unused = " (--mamba-full-memory-ratio unused)" if fixed is not None and stated is not None else ""
        if fixed is not None and fixed // slots == 0:
            raise KvplanError(f"--max-mamba-cache-size {given}: SGLang refuses to start, {fixed} slots a DP rank "
                              f"serve no request at {slots} slots each (resolve_max_num_reqs)")
        ssm = {r.cache.ssm_dtype for r in table if r.kind == "recurrent" and r.cache.ssm_elements}
        per_request = ("1 slot per running request (--disable-radix-cache: no MambaRadixCache)" if no_radix
                       else f"{slots} slots per running request"
                       + (" (3 + MambaRadixCache's 2 ping-pong buffers)" if slots == 5 else ""))
        notes = [f"SGLang Mamba pool: {sizing}{unused}, {slot:,} B a slot (conv bf16"
                 + (f", SSM {', '.join(sorted(ssm))}" if ssm else "") + f"), {per_request}"]
        return SglangMambaPool(full_cell, slot, slots, model.max_context or SGLANG_DEFAULT_CONTEXT, notes,
                               share=share, fixed_slots=fixed, requests=self.given_requests())

    def speculative_pool(self, layers: Layers, draft_layers: Layers, draft: ModelSpec | None, model: ModelSpec,
                         kv: DType) -> SglangPool:
        """SGLang 0.5.23 sizes one token count for the model's pool and its draft's (`DefaultPoolConfigurator`,
        model_executor/pool_configurator.py): a draft of d layers (MTP: num_nextn_predict_layers; a standalone or
        EAGLE draft: its own layers) adds int(cell x d / n) bytes to the cell of the model's n layers, since it
        "assumes the draft shares the target's per-layer KV size", whatever the draft's own layers hold. A running
        request also holds the slots of a step's drafts (`spec_decode_alloc_len_per_request`: the
        speculative_num_draft_tokens at page size 1 and top-k 1). N-gram decoding has no draft pool. With any
        draft, max_running_requests is 48 unless given (`arg_groups/speculative_hook.py` _handle_eagle_family,
        _handle_ngram), shared by the DP ranks."""
        if any(cache.kind == "recurrent" for cache in model.caches):
            pool = self.mamba_pool(layers, model, kv, self.speculative_requests())
            return self.speculative_mamba_pool(pool, layers, draft_layers, draft, model, kv)
        pool, count = self.pool(layers, model, kv), draft.num_layers if draft else 0
        if draft_layers:
            self.pool(draft_layers, draft, kv)
        if pool.swa_cell or any(c.kind == "indexer" for c, _ in [*layers, *draft_layers]):
            raise KvplanError(f"kvplan does not model SGLang's draft pool beside {model.name}'s sliding-window or "
                              "indexer pools: use --engine vllm")
        cell = pool.full_cell + pool.full_cell * count // model.num_layers
        notes = [*pool.notes, f"draft pool: {count} layer{'s' if count > 1 else ''} sized like the "
                               f"model's, {cell - pool.full_cell:,} B per token"] if count else list(pool.notes)
        requests = self.speculative_requests()
        if not self.options.max_num_seqs:
            notes.append(f"speculative decoding: max_running_requests {requests} (SGLang's default with a draft)")
        return SglangPool(full_cell=cell, swa_cell=0, window=0, notes=notes,
                          draft_tokens=self.options.speculative_tokens or 0, context_len=pool.context_len,
                          requests=requests)

    def speculative_mamba_pool(self, pool: SglangMambaPool, layers: Layers, draft_layers: Layers,
                               draft: ModelSpec | None, model: ModelSpec, kv: DType) -> SglangMambaPool:
        """Speculative decoding beside SGLang 0.5.23's Mamba pool (`SglangMambaPool`: the per-draft states reserved
        in the Mamba share, max_running_requests 48 a DP rank unless given, D = --speculative-tokens, SGLang's
        speculative_num_draft_tokens). The draft's KV cell (`DefaultPoolConfigurator`,
        model_executor/pool_configurator.py): an EAGLE head or a standalone draft of d layers adds int(cell x d / n)
        to the cell of the model's n full-attention layers (`mambaish.full_attention_layer_ids`). NEXTN/MTP on
        Qwen3-Next and Qwen3.5 runs without --speculative-draft-model-path, and a path-less draft is sized by the
        target's config (`_resolve_eagle_aux_hidden_state`, model_runner_components/spec_aux_hidden_state.py),
        which states no num_nextn_predict_layers: nothing is added; the draft worker's one-layer pool of as many
        tokens (`_build_hybrid_linear_kv_pool`: full_attention_layer_ids [0]) comes after the split, from the memory
        mem_fraction_static leaves, and a note gives it. A draft with a recurrent state of its own is refused."""
        method = self.options.speculative_method
        table = rows(layers, kv, kv_dtype(model.dtype))
        drafted = rows(draft_layers, kv, kv_dtype(model.dtype))
        if any(r.kind != "full" for r in drafted):
            raise KvplanError(f"kvplan does not model SGLang's draft pools beside {model.name}'s Mamba pool for a "
                              "draft with layers other than full attention: use --engine vllm")
        notes = list(pool.notes)
        cell = pool.full_cell
        if method == "mtp" and drafted:
            notes.append(f"SGLang sizes the pools by the target's config (no num_nextn_predict_layers): the MTP "
                         f"layer's own pool, {drafted[0].bytes_per_token:,} B per token for as many tokens, is "
                         "allocated after the split, from what mem_fraction_static leaves")
        elif draft is not None and drafted:
            full_layers = sum(r.count for r in table if r.kind == "full")
            cell += pool.full_cell * draft.num_layers // full_layers
            notes.append(f"draft pool: {draft.num_layers} layer{'s' if draft.num_layers > 1 else ''} sized like "
                         f"the model's {full_layers} attention layers, {cell - pool.full_cell:,} B per token")
        requests = self.speculative_requests()
        default = "" if self.options.max_num_seqs else " (SGLang's default with a draft)"
        notes.append(f"speculative decoding: max_running_requests {requests}{default}, "
                     f"{self.options.speculative_tokens} draft tokens' states a request in the Mamba share")
        return SglangMambaPool(cell, pool.slot_bytes, pool.slots_per_request, pool.context_len, notes,
                               draft_tokens=self.options.speculative_tokens, requests=requests, share=pool.share,
                               fixed_slots=pool.fixed_slots)

    def eagle_head(self, model: ModelSpec, head: ModelSpec, method: str) -> EagleHeadWeights:
        """SGLang 0.5.23 builds the class the head's config names (srt/models/llama_eagle.py LlamaForCausalLMEagle
        for EAGLE, llama_eagle3.py LlamaForCausalLMEagle3 for EAGLE3) in the model's dtype, on the model's TP. With
        h the head's hidden size, on each GPU:
            EAGLE    its layers (`EagleShape.linear_elements`), their norms but layer 0's input norm, no final norm,
                     fc 2 h x h with its bias (an nn.Linear: whole on every GPU); embeddings and lm_head the model's
                     (`set_embed_and_head`)
            EAGLE3   its layers with layer 0's qkv reading 2 h, 3 norms a layer and a final one, fc A x T x h whole
                     (A = num_aux_hidden_states, default 3; T = target_hidden_size, default h), an RMSNorm of A x T
                     with norm_before_fc and A of T with fc_norm or use_aux_norm; its own lm_head of
                     draft_vocab_size rows, or the model's where the config states no draft_vocab_size or ties
                     it to the embeddings; the model's embeddings unless target_hidden_size differs from h
                     (`set_embed`); hot_token_id, draft_vocab_size int64s on the GPU, from the checkpoint's d2t map
                     (assumed there when draft_vocab_size is not the model's vocabulary)."""
        kinds = {"LlamaForCausalLMEagle": "eagle", "LlamaForCausalLMEagle3": "eagle3"}
        named = head.eagle.architecture if head.eagle else "LlamaForCausalLM"
        if kinds.get(named) != method:
            raise KvplanError(f"SGLang builds the draft {head.name} as the class its config names, {named}: its Llama "
                              "EAGLE heads are LlamaForCausalLMEagle (--speculative-method eagle) and "
                              "LlamaForCausalLMEagle3 (eagle3)")
        e, s, tp = head.eagle, eagle_shape(model, head, self.tp), self.tp
        h = s.hidden
        if method == "eagle":
            eagle1_fields(head)
            eagle_reads(model, head, h, "hidden_size")
            return EagleHeadWeights(elements=s.linear_elements(tp, False) + 2 * h * s.layers - h + 2 * h * h + h,
                                    notes=["EAGLE head: embeddings and lm_head are the model's"])
        target = e.target_hidden_size or h
        eagle_reads(model, head, target, "target_hidden_size" if e.target_hidden_size else "hidden_size")
        fused = (e.aux_hidden_states or 3) * target
        own_head = e.draft_vocab_size is not None and not s.tied
        own_embeddings = target != h
        elements = (s.linear_elements(tp, True) + 3 * h * s.layers + h + fused * h
                    + fused * (int(e.norm_before_fc) + int(e.fc_norm or e.use_aux_norm))
                    + (s.vocab_rows(e.draft_vocab_size, tp) if own_head else 0)
                    + (s.vocab_rows(s.vocab, tp) if own_embeddings else 0))
        mapped = e.draft_vocab_size if e.draft_vocab_size not in (None, model.vocab_size) else 0
        return EagleHeadWeights(elements=elements, int64=mapped, notes=[
            "EAGLE3 head: "
            + (f"its own lm_head of {e.draft_vocab_size:,} tokens" if own_head else "the model's lm_head")
            + (f", a {mapped:,}-token hot-token map" if mapped else "")
            + (", its own embeddings" if own_embeddings else ", the model's embeddings")])

    def lora_slots(self, model: ModelSpec) -> None:
        """SGLang's LoRA memory pool (lora/mem_pool.py) holds the modules it infers from the adapters of
        --lora-paths, or --lora-target-modules, which kvplan does not read."""
        given = [FLAG_NAMES[f] for f in ("enable_lora", "max_loras", "max_lora_rank") if getattr(self.options, f)]
        if given:
            raise KvplanError(f"kvplan does not size SGLang's LoRA memory pool ({', '.join(given)}): its buffers "
                              "follow the target modules of the adapters in --lora-paths; --engine vllm sizes "
                              "LoRA slots")
        return None
