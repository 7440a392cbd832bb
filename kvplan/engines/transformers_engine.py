"""transformers: what `generate()`'s caches (DynamicCache, StaticCache) hold for a batch, recurrent states and DeepSeek
V4's compressors as transformers keeps them, the prefill activations `kvplan profile` measures, and what torch's
CUDA caching allocator reserves for a run (`DeviceRun`: transformers_allocations.py's run replayed by
cuda_allocator.py). (Named so as not to shadow the transformers package.)"""

import functools
import math

from kvplan.dtypes import DType, kv_dtype
from kvplan.engines import cuda_allocator, transformers_allocations
from kvplan.engines.base import (
    COMPRESSED_KINDS,
    WINDOWED,
    Engine,
    GiB,
    KVPool,
    Layers,
    Overhead,
    Row,
    ServingExtras,
    cdiv,
    is_windowed,
    rows,
    version_tuple,
)
from kvplan.errors import KvplanError
from kvplan.gpus import compute_capability
from kvplan.memory import kind_label, weights_bytes
from kvplan.model import (
    TRANSFORMERS_ONLY_KINDS,
    CompressedKV,
    FullAttention,
    LayerCache,
    ModelSpec,
    NoCache,
    SlidingWindow,
    distinct_caches,
    layer_groups,
)


class TransformersPool(KVPool):
    """`past_key_values` of `generate()` for a batch (`cache_utils.py`; measured by `kvplan profile`).

    DynamicCache: full layers hold ctx tokens. A sliding (or chunked) layer exposes its last W - 1 tokens as a
    view into the tensor its last update concatenated, so once decoding has begun it holds min(ctx, W) tokens
    (`bytes_held`), and right after prefill the whole prompt (`bytes_after_prefill`). Capacity must allow the
    larger, for a prompt of up to ctx - 1 tokens (`bytes_for`).
    StaticCache: max_cache_len = ctx preallocated, min(W, ctx) on sliding layers, from the first token.
    Recurrent layers: the state `Transformers.cached_layers` describes (conv of `kernel` inputs, fp32 SSM);
    `prefill_states`, one per row, what each holds right after prefill where that is less. DeepSeek V4's
    compressors: `compressor_bytes`.
    `device`: where kvplan generates the model's allocations, what torch's caching allocator reserves for them
    (`DeviceRun`), which capacity then counts instead of the cache and the activations alone."""

    def __init__(self, table: list[Row], static: bool, activations: "PrefillActivations", notes: list[str],
                 prefill_states: list[int], dtype: DType, device: "DeviceRun | None" = None):
        self.table, self.static, self.activations, self.notes = table, static, activations, notes
        self.prefill_states, self.dtype, self.device = prefill_states, dtype, device

    def peak_bytes(self, users: int, ctx: int, shared_prefix: int = 0, steady: bool = False) -> int:
        """What the allocator reserves for `users` sequences of ctx tokens beyond the weights (`DeviceRun`), where
        kvplan runs the model's allocations; else the cache and the activations."""
        if self.device is None:
            return super().peak_bytes(users, ctx, shared_prefix, steady)
        return self.device.beyond_weights(users, *capacity_run(ctx))

    def users_within(self, budget: int, ctx: int, shared_prefix: int = 0, steady: bool = False) -> int | None:
        """The most users whose run leaves the allocator room on the device: budget + weights is what torch can
        reserve (`DeviceRun.users`)."""
        if self.device is None:
            return None
        return self.device.users(budget + self.device.weights, *capacity_run(ctx))

    def budget_notes(self, budget: int, ctx: int) -> list[str]:
        """Where torch's allocator with expandable segments would fit more users in this budget, says so."""
        if self.device is None or self.device.expandable:
            return []
        limit, run = budget + self.device.weights, capacity_run(ctx)
        now, expandable = self.device.users(limit, *run), self.device.expandable_alike().users(limit, *run)
        if expandable <= now:
            return []
        return [f"with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torch's allocator fits {expandable:,} users "
                f"here, not {now:,}: --expandable-segments plans for it"]

    def gpu_bytes_for(self, users: int, ctx: int) -> int | None:
        """The device memory the process holds for `users` sequences of ctx tokens: what the allocator reserves and
        the CUDA context beside it, as NVML counts the process."""
        if self.device is None:
            return None
        return self.device.process_bytes(users, *capacity_run(ctx))

    def activation_bytes(self, users: int, ctx: int) -> int:
        """generate() prefills the batch's prompts (up to ctx - 1 tokens) in one forward pass."""
        return self.activations.peak(users, max(ctx - 1, 1))

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """The peak for `users` sequences of ctx tokens: after prefilling a prompt of up to ctx - 1 tokens (at
        least one is generated) or at ctx, whichever holds more."""
        if self.static:
            return self.bytes_held(users, ctx)
        return max(self.bytes_held(users, ctx), self.bytes_after_prefill(users, max(ctx - 1, 1), ctx))

    def bytes_held(self, users: int, ctx: int) -> int:
        """What the cache holds for `users` sequences that decoded their way to ctx tokens."""
        return users * sum(r.count * self._row_held(r, ctx) for r in self.table)

    def _row_held(self, r: Row, ctx: int) -> int:
        if r.kind == "compressed":
            return compressor_bytes(r.cache, self.dtype, ctx, prefill=False)
        return r.bytes_per_token * r.tokens(ctx) + r.state_bytes

    def bytes_per_sequence_decode(self, ctx: int) -> int:
        return self.bytes_held(1, ctx)

    def bytes_after_prefill(self, users: int, prompt: int, ctx: int) -> int:
        """What the cache holds right after prefilling `prompt` tokens of a ctx-token generation: a
        DynamicCache keeps the prompt on every attention layer (the sliding ones are cut at the first decode
        step), and a cross-attention layer its encoder's tokens; a StaticCache is already at its full size."""
        if self.static:
            return self.bytes_held(users, ctx)
        return users * sum(r.count * self._row_after_prefill(r, state, prompt, ctx)
                           for r, state in zip(self.table, self.prefill_states, strict=True))

    def _row_after_prefill(self, r: Row, state: int, prompt: int, ctx: int) -> int:
        if r.kind == "compressed":
            return compressor_bytes(r.cache, self.dtype, prompt, prefill=True)
        return r.bytes_per_token * self.prefill_tokens(r, prompt, ctx) + state

    @staticmethod
    def prefill_tokens(row: Row, prompt: int, ctx: int) -> int:
        """Tokens a layer holds right after prefill: a cross-attention layer its encoder's tokens; hidden states
        the whole prompt as the model ran it (XLNet's cut to mem_len and Reformer's cut of its padding are views of
        it; Reformer's buckets only for a prompt it hashed); CPM-Ant's attention the prompt tokens ahead of it too;
        any other layer the whole prompt, windowed ones included (cut at the first decode step)."""
        cache = row.cache
        if cache.kind == "cross":
            return row.tokens(ctx)
        if cache.kind == "states":
            return cache.padded(prompt) if prompt > cache.after else 0
        if cache.kind == "prefixed":
            return cache.tokens_held(prompt)
        return prompt


def capacity_run(ctx: int) -> tuple[int, int]:
    """(prompt, decode steps) of the run a user of ctx tokens is planned for: the prefill of a prompt of ctx - 1
    tokens (at least one is generated), where the allocator reserves its peak. The decode steps after it allocate out
    of what the prefill freed: in the H100 record 32 of them reserved nothing more."""
    return max(ctx - 1, 1), 0


# The process's device memory outside torch's allocator (its CUDA context, cuBLAS and the kernels loaded), by CUDA
# runtime major version: NVML's process memory less torch.cuda.memory_reserved(), measured by `kvplan profile` on an
# H100 80GB HBM3 (driver 580.159.04, torch 2.11.0+cu130) after decode; 543,162,368 B of it before the first
# allocation. Other runtimes: ASSUMED_CONTEXT, not measured.
CUDA_CONTEXT = {13: 721_420_288}
ASSUMED_CONTEXT = GiB // 2
PLANNED_RUNTIME = 13  # the CUDA runtime kvplan plans for: torch 2.11's default wheels (cu130)
# Device memory NVML counts as used with no process on the GPU, which no allocation can have: an H100 80GB HBM3,
# driver 580.159.04, before the first allocation (device used 1,055,719,424 B, the process 543,162,368 B).
DRIVER_RESERVED = 512_557_056


def cuda_context(runtime: int | None) -> int:
    """What a process holds outside torch's allocator under this CUDA runtime (major version)."""
    return CUDA_CONTEXT.get(runtime, ASSUMED_CONTEXT)


class DeviceRun:
    """A model's allocations on one GPU under torch's caching allocator: the weights built, then a batch's prompts
    prefilled and decoded (`transformers_allocations.run`), replayed through the allocator
    (`cuda_allocator.replay`). `weights`: the parameters' bytes; `context`: the process's memory outside the
    allocator. Runs are cached: a planning table asks the same ones for every GPU."""

    def __init__(self, shape: transformers_allocations.Shape, workspace: int, expandable: bool, context: int):
        self.shape, self.workspace, self.expandable, self.context = shape, workspace, expandable, context
        self.weights = shape.parameters()

    def expandable_alike(self) -> "DeviceRun":
        """The same run under an allocator with expandable segments."""
        return DeviceRun(self.shape, self.workspace, True, self.context)

    def phases(self, users: int, prompt: int, steps: int) -> list[cuda_allocator.Phase]:
        """The allocator after the build, after prefill and after decode, with the device's room unbounded."""
        return _phases(self.shape, users, prompt, steps, self.workspace, self.expandable)

    def reserved(self, users: int, prompt: int, steps: int) -> int:
        """torch.cuda.memory_reserved() at the end of the run (its peak: nothing is released)."""
        return self.phases(users, prompt, steps)[-1].reserved

    def live_peaks(self, users: int, prompt: int, steps: int) -> tuple[int, int]:
        """The prefill's and the decode's peak of live tensors above the built model, as torch.cuda's
        max_memory_allocated counts them above memory_allocated after the build: the batch's cache, token ids,
        activations and the BLAS workspace."""
        built, prefill, decode = self.phases(users, prompt, steps)
        return prefill.peak_allocated - built.allocated, decode.peak_allocated - built.allocated

    def process_bytes(self, users: int, prompt: int, steps: int) -> int:
        return self.reserved(users, prompt, steps) + self.context

    def reserve(self, prompt: int, steps: int) -> tuple[int, int, int]:
        """(the build's reserve, what `users` users reserve beyond it, users): the reserve grows with the batch in
        proportion (every large tensor is batch-sized), so one run, of REFERENCE_TOKENS prompt tokens in all, gives
        every batch's (a batch of one under-counts where prompts are short: its tensors share 20 MiB segments)."""
        users = max(1, cdiv(REFERENCE_TOKENS, prompt))
        built, *_, end = self.phases(users, prompt, steps)
        return built.reserved, end.reserved - built.reserved, users

    def users(self, limit: int, prompt: int, steps: int) -> int:
        """The most users the allocator can reserve for within `limit` bytes."""
        built, reserve, users = self.reserve(prompt, steps)
        return max(0, (limit - built) * users // reserve)

    def beyond_weights(self, users: int, prompt: int, steps: int) -> int:
        """What `users` users' runs reserve beyond the weights' own bytes, as `users` counts it."""
        built, reserve, reference = self.reserve(prompt, steps)
        return built - self.weights + cdiv(users * reserve, reference)


# Prompt tokens of the run one user's reserve is measured on (`DeviceRun.users`): Llama-3-8B's per-user reserve at
# 8,191 tokens is the same, within 0.01%, for batches of 1 to 128; at 1,023 tokens batches of 1 to 4 reserve 38% to
# 1% less a user than batches of 8 to 256 do.
REFERENCE_TOKENS = 1 << 16


@functools.lru_cache(maxsize=4096)
def _phases(shape: transformers_allocations.Shape, users: int, prompt: int, steps: int, workspace: int,
            expandable: bool) -> list[cuda_allocator.Phase]:
    run = transformers_allocations.run(shape, users, prompt, steps, workspace)
    return cuda_allocator.replay(run.events, run.ends, expandable=expandable)


FP32 = kv_dtype("fp32")


def compressor_bytes(cache: CompressedKV, dtype: DType, tokens: int, prefill: bool) -> int:
    """What transformers' `DeepseekV4CSACache` / `DeepseekV4HCACache` hold for one compressor of a sequence that
    has seen `tokens` tokens: tokens // m entries; the buffered tokens' kv and gate projections, which
    `store_compression_weights` keeps as a view into the tensor it last made, so right after prefill the whole
    prompt's (`prefill`: its kv_proj output) and once decoding has begun the last step's concatenation of the
    buffer and the new token, (tokens - 1) % m + 1 rows; with overlapping windows, once one has closed, the last
    window's first half (`update_overlap_state`), its gate in fp32: gate + position_bias, a parameter
    `_keep_in_fp32_modules_strict` loads in fp32 (a model made by from_config, as `kvplan profile` makes it,
    keeps it in the model dtype)."""
    buffered = tokens if prefill else (tokens - 1) % cache.ratio + 1
    overlap = cache.overlap_bytes(dtype, FP32) if tokens >= cache.ratio else 0
    return cache.bytes_per_token(dtype) * cache.tokens_held(tokens) + cache.buffer_bytes(dtype, buffered) + overlap


# Recurrent states transformers computes in the model dtype, not fp32: MiniMax's lightning attention sums k^T v in
# the values' dtype (`MiniMaxLightningAttention`), xLSTM's cache is made in the embeddings' dtype (`xLSTMCache`).
MODEL_DTYPE_STATES = frozenset({"lightning", "mlstm"})
# Short convolutions transformers runs, and so caches, in fp32: Inkling's (`InklingShortConvolution`).
FP32_CONVS = frozenset({"inkling_conv"})


def transformers_state(cache: LayerCache) -> LayerCache:
    """A recurrent layer's state as transformers keeps it (`LinearAttentionLayer`): the conv state holds the
    last `conv_kernel` inputs (kvplan's conv_elements count kernel - 1), and the SSM state is stored in the
    dtype its scan returns, fp32 (the reference scans and the mamba_ssm / fla kernels alike), but for the mixers
    of MODEL_DTYPE_STATES; FP32_CONVS keep their conv state in fp32."""
    update: dict = {} if cache.mixer in MODEL_DTYPE_STATES else {"ssm_dtype": "fp32"}
    if cache.mixer in FP32_CONVS:
        update["conv_dtype"] = "fp32"
    if cache.conv_kernel:
        update["conv_elements"] = cache.conv_elements // (cache.conv_kernel - 1) * cache.conv_kernel
    return cache.model_copy(update=update)


class PrefillActivations:
    """The activation peak of one transformers forward pass over a batch of prompts, above the weights and the
    cache: inference mode, SDPA attention (eager where transformers has no SDPA path), logits for the last token
    only, as generate() prefills. Measured on transformers 5.23 by `kvplan profile` (docs/accuracy.md): on the CPU
    through the allocator's own records, on an H100 by torch.cuda. b is the model dtype's bytes, P the prompt, H
    the query heads, h the KV heads, dq, dk, dv the query, key and value head widths.

    Per sequence, the largest of a layer's moments. Per token (a one-layer model holds one hidden-sized tensor
    fewer: its layer input is the embedding output):
        norm     3 x hidden x b (embedding output, layer input, residual) + the norm's fp32 upcast:
                 2 x hidden x 4 (1 x when the model runs in fp32)
        MLP      4 x hidden x b (the same and the normed input) + f x intermediate x b, f = 3 gated (act(gate),
                 up, their product), 4 for gelu_new (its tanh formula runs op by op), else 2 (up, act(up))
        experts  4 x hidden x b + top_k x max(hidden x b + g x expert_intermediate x b, hidden x (2b + 8)):
                 grouped_mm's gathered tokens and gate_up output with its gating (g = 4: gate_up, act, product;
                 gpt-oss 10: a gathered bias and a clamped gate), then the fp32 routing-weighted rows and
                 their reordered copy
        Mamba    4 x hidden x b + 3 x d_inner x d_state x 4 (the reference selective scan's fp32 discretised
                 A, B and B x u, when mamba_ssm is not installed) + d_inner x (6b + 8) (in_proj output,
                 the conv and gate outputs, fp32 dt and skip)
        rotary   3 x hidden x b + the larger of (4 x H x dq + h x (dk + dv)) x b, the query's turn in
                 `apply_rotary_pos_emb` (q, q x cos, rotate_half(q) and its product with sin, the key and value
                 waiting), and (2 x H x dq + 4 x h x dk + h x dv) x b, the key's (the query and its rotated copy
                 alive), less the last attention layer's cache per token, which that layer has not yet made: the
                 figure is the peak above the whole cache
        SDPA     3 x hidden x b + H x dq x b (the rotated query; keys and values are the cache's) + H x (dk + dv) x b
                 where transformers repeats the KV heads (`repeat_kv`: GQA with a mask, or dk != dv, or over
                 256; `use_gqa_in_sdpa`) + the kernel's output H x dv x b and log-sum-exp H x 4
    and per sequence the logits moment (`logits`: the last token's logits, vocab x b, and on the CPU in half
    precision a copy of the output projection), and, for the layers a mask is passed to, P x P x b: torch's SDPA
    turns a boolean mask into an additive one in the query dtype, materialised for each sequence
    (`convert_boolean_attn_mask`, attention.cpp); on CUDA the memory-efficient kernel pads a mask whose rows are
    not a multiple of 8 long (`preprocess_mask`), another P x P x b while both live. Where no fused kernel takes
    the shapes, SDPA's math fallback (`_scaled_dot_product_attention_math`) holds the scores and their softmax,
    each with a boolean of masked pairs, H x (2s + 1) per token pair (s = 4: it upcasts bf16 and fp16), and fp32
    copies of the query, key and value: torch's fused kernels need equal query and key widths and equal heads (or
    enable_gqa), the CPU's also an equal value width (sdp_utils_cpp.cpp), so MLA (dq != dv) falls back on the CPU
    and Falcon's multi-query heads on both.

    Shared by the batch, once per forward: a P x P boolean mask where one is materialised (`sdpa_mask`: a window
    or chunk the prompt reaches, Falcon's always, MASK_ALWAYS), the position tables every layer reads (rotary cos
    and sin, 2 x dk x b per token for each rotary kind: one per layer type for ROPE_PER_LAYER_TYPE; learned
    position embeddings, hidden x b, for LEARNED_POSITIONS) and the int64 cache positions.

    Eager attention (EAGER_ATTENTION: models transformers has no SDPA path for) adds two P x P masks in the model
    dtype per sequence, and its h x P x C probabilities (C = P + sinks columns) outlive attention (the layer
    returns them) into the MLP moment, while attention itself holds s bytes per score (gpt-oss: 3b, scores with
    sinks and max-subtracted; Gemma 2: b + 4 + 4, masked scores, their fp32 copy and its softmax, b + 4 in fp32,
    where the copy is the scores themselves):
        peak = batch x (2 P^2 b + max(P x per token + h P C b, P x 4 x hidden x b + h P C s)) + shared
    Without widths (a YAML spec without them, NAS blocks) a flat 1 GiB."""

    # `_supports_sdpa = False`: architecture -> (sink columns, score tensors in the model dtype, fp32 softmax);
    # DeepSeek V4's eager_attention_forward is gpt-oss's
    EAGER_ATTENTION = {"gpt_oss": (1, 3, False), "gemma2": (0, 1, True), "deepseek_v4": (1, 3, False)}
    GATE_TENSORS = {"gpt_oss": 9}  # expert-intermediate-wide tensors of a routed token's gating, default 4
    PYTHON_GELU = frozenset({"gelu_new"})  # NewGELUActivation
    MODELLED_MIXERS = frozenset({"mamba"})  # others' scans (Gated DeltaNet's chunked fp32 one) are not
    MASK_ALWAYS = frozenset({"falcon"})  # builds its P x P mask even for SDPA (allow_is_causal_skip=False)
    # rotary tables per layer type (`position_embeddings[layer_type]`, Gemma3TextModel.forward and alike)
    ROPE_PER_LAYER_TYPE = frozenset({"gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text",
                                     "olmo3", "modernbert-decoder"})
    LEARNED_POSITIONS = frozenset({"gpt2"})  # wpe(position_ids): a hidden-wide row per prompt token
    # hand SDPA their one KV head as it is (FalconAttention.forward, multi_query), where transformers' own attention
    # repeats it or sets enable_gqa: no fused kernel of torch 2.11 (CUDA) or 2.13 (CPU) takes unequal heads without
    UNREPEATED_KV = frozenset({"falcon"})
    ATTENTION_KINDS = ("full", "sliding", "chunked", "mla")

    def __init__(self, model: ModelSpec, dtype: DType, device: str = "cuda"):
        self.widths, self.bytes = model.widths, dtype.block_bytes / dtype.block_elements
        self.cuda = device.startswith("cuda")
        self.eager = self.EAGER_ATTENTION.get(model.architecture)
        self.heads = model.num_attention_heads
        self.gate_tensors = self.GATE_TENSORS.get(model.architecture, 4)
        self.residuals = 4 if model.num_layers > 1 else 3  # the first layer's input is the embedding output
        # one of each kind of attention layer, with its layers: every figure below is the same for alike layers
        attention_groups = [g for g in layer_groups(model.caches) if g.cache.kind in self.ATTENTION_KINDS]
        attention = [g.cache for g in attention_groups]
        windows = [c.window if c.kind != "chunked" else c.chunk for c in attention if is_windowed(c)]
        self.smallest_window = min(windows, default=None)
        self.mask_always = model.architecture in self.MASK_ALWAYS
        self.unrepeated_kv = model.architecture in self.UNREPEATED_KV
        # the widest attention layer's (KV heads, key width, value width)
        self.kv = max(((c.kv_heads, c.head_dim, c.head_dim_v) if c.kind != "mla" else (self.heads, 0, 0)
                       for c in attention), key=lambda shape: shape[0] * (shape[1] + shape[2]), default=None)
        if self.kv is not None and self.widths is not None and self.widths.query_head_dim:  # MLA
            self.kv = (self.heads, self.widths.query_head_dim, self.widths.value_head_dim)
        # the last attention layer's cache per token: not yet made while that layer rotates its query and key, the
        # moment's figure above the whole cache is that much less
        last = max(attention_groups, key=lambda g: g.layers[-1], default=(None, ()))[0]
        self.last_layer_kv = last.bytes_per_token(dtype) if last is not None and last.kind != "mla" else 0
        self.rotary_kinds = 0 if self.kv is None or model.architecture in self.LEARNED_POSITIONS else \
            len({is_windowed(c) for c in attention}) if model.architecture in self.ROPE_PER_LAYER_TYPE else 1
        self.learned_positions = model.architecture in self.LEARNED_POSITIONS
        self.vocab = model.vocab_size or 0
        mamba = [c for c in distinct_caches(model.caches) if c.kind == "recurrent" and c.mixer == "mamba"
                 and c.conv_kernel]
        # (SSM elements, d_inner) of the widest Mamba mixer: d_inner channels, each conv_kernel - 1 conv inputs
        self.scan = max(((c.ssm_elements, c.conv_elements // (c.conv_kernel - 1)) for c in mamba), default=None)
        self.unmodelled = sorted({c.mixer for c in distinct_caches(model.caches) if c.kind == "recurrent"}
                                 - self.MODELLED_MIXERS)

    def masked(self, prompt: int) -> bool:
        """`sdpa_mask` skips the mask (SDPA's is_causal instead) unless a window or chunk is no longer than the
        prompt (`_ignore_causal_mask_sdpa`), or the model asks for it always."""
        return self.mask_always or (self.smallest_window is not None and prompt >= self.smallest_window)

    def per_token(self) -> int:
        w, b = self.widths, self.bytes
        stream = self.residuals * w.hidden * b
        norm = (self.residuals - 1) * w.hidden * b + (1 if b >= 4 else 2) * w.hidden * 4
        factor = 3 if w.gated_mlp else (4 if w.mlp_activation in self.PYTHON_GELU else 2)
        moments = [norm, stream + factor * w.mlp_intermediate * b]
        if self.scan:
            ssm, channels = self.scan
            moments.append(stream + 3 * ssm * 4 + channels * (6 * b + 8))
        if w.experts_per_token:
            gathered = max(w.hidden * b + self.gate_tensors * w.expert_intermediate * b, w.hidden * (2 * b + 8))
            moments.append(stream + w.experts_per_token * gathered)
        if self.kv is not None and self.rotary_kinds:
            kv_heads, dk, dv = self.kv
            query, keys = self.heads * dk, kv_heads * dk
            rotating = max(4 * query + keys + kv_heads * dv, 2 * query + 4 * keys + kv_heads * dv)
            moments.append((self.residuals - 1) * w.hidden * b + rotating * b - self.last_layer_kv)
        return math.ceil(max(moments))

    def attention(self, prompt: int) -> tuple[int, int]:
        """The SDPA moment: (one sequence's share, per token and, for a mask or the math fallback's scores, per
        token pair; the batch's shared part, the causal mask the math fallback builds once)."""
        if self.kv is None:
            return 0, 0
        b, heads = self.bytes, self.heads
        kv_heads, dk, dv = self.kv
        masked = self.masked(prompt)
        unequal = self.unrepeated_kv and kv_heads < heads  # heads SDPA gets as they are
        repeat = not unequal and kv_heads < heads and (masked or dk != dv or dk > 256)  # `use_gqa_in_sdpa`
        per_token = (self.residuals - 1) * self.widths.hidden * b + heads * dk * b
        per_token += heads * (dk + dv) * b if repeat else 0
        mask = prompt**2 * b if masked else 0  # the additive copy of the boolean mask
        if self.cuda and masked and prompt % 8:
            mask *= 2  # the padded copy beside it
        if not unequal and (dk == dv or self.cuda) and dk % 8 == dv % 8 == 0:  # a fused kernel
            return math.ceil(prompt * (per_token + heads * dv * b + heads * 4) + mask), 0
        s = 4 if b < 4 else b  # the math fallback works in fp32
        upcast = (heads * dk + kv_heads * (dk + dv)) * 4 if b < 4 else 0
        per_token += upcast + heads * dk * s + kv_heads * dk * s  # the fp32 copies, the scaled query and keys
        # the scores and their softmax, each with its boolean row of masked pairs (`_safe_softmax`); without a
        # mask the causal one it builds, in fp32, once for the batch
        scores = heads * (2 * s + 1) * prompt**2
        return math.ceil(prompt * per_token + scores + mask), 0 if masked else prompt**2 * s

    def logits(self, prompt: int) -> int:
        """One sequence's logits moment: the last token's logits over the vocabulary beside the residual stream and
        the final norm's output; on the CPU a half-precision matmul of that one row (oneDNN, torch 2.13) copies the
        whole output projection first, vocab x hidden, once per sequence."""
        b, hidden = self.bytes, self.widths.hidden
        copy = self.vocab * hidden * b if not self.cuda and b < 4 else 0
        return math.ceil(prompt * (self.residuals - 1) * hidden * b + self.vocab * b + copy)

    def decode_step(self, users: int) -> int:
        """A decode step's logits moment above the cache: each sequence's logits beside its hidden rows."""
        if self.widths is None:
            return 0
        return math.ceil(users * (self.vocab + self.residuals * self.widths.hidden) * self.bytes)

    def shared(self, prompt: int) -> int:
        """What the whole batch shares: the boolean mask, the position tables, the cache positions, and the math
        fallback's causal mask."""
        mask = prompt**2 if self.masked(prompt) and self.eager is None else 0  # eager's are its own, below
        if self.learned_positions:
            tables = self.widths.hidden * self.bytes
        else:
            tables = 2 * self.rotary_kinds * self.kv[1] * self.bytes if self.kv is not None else 0
        return math.ceil(mask + prompt * (tables + 8)) + (self.attention(prompt)[1] if self.eager is None else 0)

    def peak(self, users: int, prompt: int) -> int:
        if not users:
            return 0
        if self.widths is None:
            return GiB
        layer = prompt * self.per_token()
        if self.eager is None:
            return users * max(layer, self.attention(prompt)[0], self.logits(prompt)) + self.shared(prompt)
        sinks, score_tensors, fp32_softmax = self.eager
        b = self.bytes
        per_score = score_tensors * b + ((8 if b < 4 else 4) if fp32_softmax else 0)
        scores = self.heads * prompt * (prompt + sinks)
        attention = prompt * self.residuals * self.widths.hidden * b + scores * per_score
        masks = 2 * prompt**2 * b
        return users * math.ceil(masks + max(layer + scores * b, attention, self.logits(prompt))) + self.shared(prompt)

    def notes(self) -> list[str]:
        if self.widths is None:
            return ["prefill activations: a flat 1 GiB (the model spec gives no forward widths)"]
        grows = "eager attention, quadratic in the prompt" if self.eager else \
            f"{self.per_token():,} B per prompt token"
        out = [f"prefill activations grow with batch x prompt ({grows})"]
        if self.scan:
            out.append("Mamba prefill sized for transformers' reference selective scan (mamba_ssm not installed); "
                       "the mamba_ssm kernels need far less")
        if self.unmodelled:
            out.append(f"{', '.join(self.unmodelled)} mixers' own transients are not in the prefill activations")
        return out


class Transformers(Engine):
    """Hugging Face transformers (`cache_utils.py`). From 5.15 DeepSeek's MLA caches the latent; 4.57-5.14
    cached decompressed per-head K and V, which kvplan's model spec does not carry."""

    name = "transformers"
    label = "transformers"
    default_version = "5.23.0"
    paged = False
    splits_heads = False
    downcasts_fp32 = False  # from_pretrained keeps the config's dtype
    reads = frozenset({"version", "memory_fraction", "cache_implementation", "expandable_segments"})
    kv_dtypes = ("fp32", "bf16", "fp16")
    holds_transformers_only_caches = True
    # Families whose forward takes the whole sequence at every cached step (generate() feeds it so): CPM-Ant puts its
    # prompt tokens before input_ids and then drops the positions its cache already holds (`CpmAntModel.forward`;
    # `CpmAntForCausalLM.prepare_inputs_for_generation` keeps every token). `kvplan profile` decodes them so.
    WHOLE_SEQUENCE_DECODE = frozenset({"cpmant"})
    # Families whose convolution state right after prefill is a fresh tensor of the last kernel - 1 inputs:
    # RecurrentGemma keeps its RG-LRU state on its modules (`RecurrentGemmaRecurrentBlock.conv1d_state`); each
    # decode step then keeps a view into the kernel-wide concatenation, which holds all of it.
    PREFILL_CONV_SHORT = frozenset({"recurrent_gemma"})
    WINDOWS_KEPT_WHOLE = frozenset({"gpt_neo"})  # local layers whose cache transformers does not cut to the window
    # Causal-LM classes that keep no cache between tokens: generate() runs the whole sequence again for each one.
    RECOMPUTES = {"openai-gpt": "OpenAIGPTLMHeadModel takes no cache",
                  "xlm": "generate() gives XLMWithLMHeadModel no cache (its forward takes `cache`, not "
                         "past_key_values)"}

    def cached_layers(self, model: ModelSpec) -> tuple[LayerCache, ...]:
        """The caches as transformers stores them. Falcon with new_decoder_architecture broadcasts K/V to every
        query head before caching; it is the only Falcon layout with 1 < kv_heads < num_attention_heads
        (multi_query has 1, plain MHA all). GPT-Neo's local layers keep every token: its config has no
        sliding_window, so DynamicCache makes plain layers, and the model masks the window itself. Recurrent
        states: `transformers_state`. Families in RECOMPUTES keep nothing. DeepSeek V4's sliding_attention
        layers (a K=V window and no compressor) get a plain `DynamicSlidingWindowLayer`, which keeps the row twice,
        as keys and as values; its compressed layers' caches store it once (`DeepseekV4HCACache.update`). XLNet's
        memories of mem_len tokens are a view into the mem_len + 1 its last step concatenated
        (`XLNetModel.cache_mem`), which they keep whole."""

        def stored() -> tuple[LayerCache, ...]:
            if model.architecture in self.RECOMPUTES:
                return tuple(NoCache(layer=c.layer, reason=self.RECOMPUTES[model.architecture]) for c in model.caches)
            if any(c.kind == "mla" for c in model.caches) and version_tuple(self.version) < (5, 15):
                raise KvplanError(f"transformers {self.version} caches DeepSeek-style models' decompressed K/V, "
                                  "which kvplan does not model: use --engine-version 5.15 or later")
            heads = model.num_attention_heads
            broadcast = model.architecture == "falcon"
            compressed = {c.layer for c in model.caches if c.kind == "compressed"}
            out = []
            for c in model.caches:
                if c.kind == "sliding_kv" and c.layer not in compressed:
                    c = SlidingWindow(layer=c.layer, kv_heads=1, head_dim=c.head_dim, head_dim_v=c.head_dim,
                                      window=c.window, split_by_tensor_parallel=False)
                elif broadcast and c.kind in ("full", *WINDOWED) and 1 < c.kv_heads < heads:
                    c = c.model_copy(update={"kv_heads": heads})
                elif c.kind == "sliding" and model.architecture in self.WINDOWS_KEPT_WHOLE:
                    c = FullAttention(**c.model_dump(exclude={"kind", "window"}))
                elif c.kind == "recurrent":
                    c = transformers_state(c)
                elif c.kind == "states" and c.memory:
                    c = c.model_copy(update={"memory": c.memory + 1})
                out.append(c)
            return tuple(out)

        return self.stored_once(model, stored)

    def default_fraction(self) -> float:
        return 1.0

    def overhead(self) -> Overhead:
        """The process's memory outside torch's allocator under the CUDA runtime planned for (CUDA_CONTEXT);
        activations grow with the batch and are the pool's."""
        return Overhead(cuda_context=cuda_context(PLANNED_RUNTIME))

    def serving_extras(self, model: ModelSpec, tower_bytes: int, max_len: int) -> ServingExtras:
        """On an NVIDIA GPU, the device memory the driver keeps for itself (DRIVER_RESERVED), which torch cannot
        reserve."""
        if self.gpu_vendor() not in (None, "nvidia"):
            return ServingExtras()
        return ServingExtras(overhead={"driver_reserved": DRIVER_RESERVED})

    def assumptions(self, uses_fraction: bool = True) -> list[str]:
        context = cuda_context(PLANNED_RUNTIME)
        return [f"CUDA {PLANNED_RUNTIME} (torch 2.11): {context:,} B outside torch's allocator, measured on an H100 "
                "(the process's CUDA context, cuBLAS and kernels)"]

    def device_run(self, model: ModelSpec, kv: DType, layers: int) -> "DeviceRun | str":
        """The model's allocations as torch's caching allocator sees them on this GPU (`DeviceRun`), for a model
        whose transformers forward kvplan replays (`transformers_allocations.not_replayed`) on an NVIDIA or AMD GPU
        (Apple's MPS has its own allocator) with a DynamicCache; otherwise why not, as the end of a sentence."""
        why = ("with a StaticCache" if self.options.cache_implementation == "static" else
               "on Apple GPUs (MPS allocates on its own)" if self.gpu_vendor() == "apple" else
               transformers_allocations.not_replayed(model))
        if why:
            return why
        weights = weights_bytes(model, kv.name)[0]
        shape = transformers_allocations.shape_of(model, kv.block_bytes // kv.block_elements, weights, layers)
        return DeviceRun(shape, self.blas_workspace(), bool(self.options.expandable_segments),
                         cuda_context(PLANNED_RUNTIME))

    def blas_workspace(self) -> int:
        """The BLAS workspace torch allocates at this GPU's first matmul and keeps
        (`transformers_allocations.workspace_bytes`)."""
        return transformers_allocations.workspace_bytes(self.gpu_vendor(),
                                                        compute_capability(self.gpu_name or ""))

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> TransformersPool:
        """The cache is in the dtype the model runs in (no separate KV dtype), conv states included."""
        static = self.options.cache_implementation == "static"
        if static and any(c.kind in COMPRESSED_KINDS for c, _ in layers):
            raise KvplanError(f"transformers' StaticCache cannot hold {model.name}'s compressor state (DeepSeek V4 "
                              "runs on its own dynamic cache layers, modeling_deepseek_v4.py): use "
                              "--cache-implementation dynamic")
        kept = next((c for c in distinct_caches(model.caches) if c.kind in TRANSFORMERS_ONLY_KINDS), None)
        if static and kept is not None:  # XLNet and Reformer make caches of their own; CPM-Ant's prompt overflows
            raise KvplanError(f"--cache-implementation static: a StaticCache of ctx tokens cannot hold "
                              f"{model.architecture}'s cache ({kind_label(kept)}); leave the default (dynamic)")
        table = rows(layers, kv, kv)
        notes = ["StaticCache" if static else "DynamicCache"]
        if model.architecture in self.RECOMPUTES:
            notes[0] = (f"no cache: {self.RECOMPUTES[model.architecture]}, so generate() runs the whole sequence "
                        "again for every token")
        if not static and any(r.kind in (*WINDOWED, *COMPRESSED_KINDS) for r in table):
            notes[0] = ("DynamicCache: sliding layers hold the whole prompt until the first decode step, then "
                        "min(ctx, W) tokens; sized for the peak, a prompt of up to ctx - 1 tokens")
        if any(r.kind == "compressed" for r in table):
            notes.append("DeepSeek V4 compressors also hold the prompt's kv and gate projections until the first "
                         "decode step, then up to m tokens' (CSA overlap gates in fp32, as from_pretrained loads "
                         "position_bias)")
            notes.append("DeepSeek V4's prefill activations are under-counted: its hyper-connection streams and "
                         "wide query and output rows are not modelled (kvplan profile measured 1.45x the figure at "
                         "a 1,022-token prompt)")
        if kept is not None and kept.kind == "states":
            notes[0] = ("the model's own cache of hidden states: the whole prompt as the model ran it until the first "
                        "decode step; sized for the peak, a prompt of up to ctx - 1 tokens")
        activations = PrefillActivations(model, kv)
        short = model.architecture in self.PREFILL_CONV_SHORT
        prefill_states = [r.state_bytes - kv.bytes_for(r.cache.conv_elements // r.cache.conv_kernel)
                          if short and r.kind == "recurrent" and r.cache.conv_kernel else r.state_bytes for r in table]
        device = self.device_run(model, kv, sum(count for _, count in layers))
        notes += activations.notes()
        if isinstance(device, str):
            notes.append(f"torch's caching allocator is not modelled {device}: the peak of live tensors is counted, "
                         "not what the allocator reserves")
            device = None
        else:
            if model.quantization is not None:
                notes.append(f"process GPU memory replays {model.name} built in {kv.name}, as kvplan profile builds "
                             f"it, not as its {model.quantization.weights_dtype} checkpoint: an upper bound where "
                             "transformers keeps the weights quantised")
            if self.options.expandable_segments:
                notes.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        return TransformersPool(table, static, activations, notes, prefill_states, kv, device)
