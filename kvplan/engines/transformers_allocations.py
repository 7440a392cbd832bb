"""The tensors a transformers generate()-style run allocates and frees on the GPU, in order, from the ModelSpec alone:
what `kvplan profile` runs (kvplan/profiler/run.py) and the transformers engine plans for. The run builds the model
(its parameters in module order), prefills `batch` prompts of `prompt` tokens with logits for the last token only,
and decodes `steps` tokens with the cache, as transformers 5.23 and torch 2.11 on CUDA run them:

    embedding        the batch's embeddings; position ids (arange + past); the rotary table: positions in fp32
                     x inv_freq, concatenated, cos and sin in fp32 times attention_scaling, cast to the model
                     dtype (`LlamaRotaryEmbedding.forward`)
    RMSNorm          the input in fp32, its square, their mean, + eps, rsqrt, the product, cast back, x weight
                     (`LlamaRMSNorm.forward`); per head on q and k where the model norms them (Qwen3)
    attention        q, k, v projections; rotary on q and on k (x cos, -x2, cat, x sin, sum:
                     `apply_rotary_pos_emb`); the cache's torch.cat of its keys and of its values with the new
                     ones, the old freed (`DynamicLayer.update`; a sliding layer keeps a view of the concatenation,
                     `DynamicSlidingWindowLayer.update`); SDPA, then o_proj
    SDPA on CUDA     flash attention where there is no mask (torch's sdp_utils: no mask, head sizes equal and at
                     most 256, fp16/bf16; GQA handled in the kernel, transformers passes enable_gqa): the output
                     and an fp32 logsumexp of batch x heads x queries, with a 16 B seed and an 8 B offset. With a
                     mask (a sliding layer once the sequence reaches its window, `_ignore_causal_mask_sdpa`), the
                     memory-efficient kernel: transformers repeats k and v to every query head (`repeat_kv`),
                     torch makes the boolean mask additive for the batch (`convert_boolean_attn_mask`: logical_not,
                     where), and CUTLASS keeps an fp32 output accumulator for head sizes over 128
    MLP              gate and up projections, act(gate) x up, down (`LlamaMLP.forward`); routed experts as
                     transformers' grouped_mm runs them (`integrations/moe.py`, `grouped_mm_experts_forward`)
    logits           the final norm, lm_head on the last token, argmax
The cuBLAS workspace (32 MiB on Hopper and Blackwell, else 8 MiB + 128 KiB; hipBLAS's on AMD Instinct MI300 and
later 128 MiB: torch's `parseChosenWorkspaceSize`, aten/src/ATen/cuda/CublasHandlePool.cpp) is allocated by the
first matmul and kept.
Python frees a tensor when its last reference goes: a temporary when the expression that made it ends, a rebound
name's old tensor at the rebinding, a function's locals when it returns (in the order they were first bound). The
sequence is checked event for event against real transformers models recorded on the meta device
(tests/allockit.py) and, through `kvplan.engines.cuda_allocator`, against the allocator's figures on an H100.

Events: a size (>= 0) allocates the next slot, ~slot (< 0) frees one."""

from dataclasses import dataclass, replace

from kvplan.model import ModelSpec

MiB = 1 << 20
HOPPER_WORKSPACE = 32 * MiB  # 4096 x 8 x 1024
WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8"
MI300_WORKSPACE = 128 * MiB  # gfx94x, gfx95x
FP32, INT64 = 4, 8
# Families whose decoder layers run as Llama's do (`modeling_llama.py`: RMSNorm, rotary q and k, SDPA, a gated MLP or
# grouped_mm experts), or differ by the rules named below (gpt-oss: EAGER_SINKS, Gemma 3: GEMMA, DeepSeek-V2:
# LATENT), checked event for event against the models themselves (tests/test_transformers_allocations.py).
MODELLED = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gpt_oss", "gemma3",
                      "gemma3_text", "deepseek_v2"})
# The deepest model whose run kvplan generates: deeper than any published, as a config may be (the run's events,
# about a hundred a layer a forward, and their replay grow with the layers).
MAX_LAYERS = 1024
# Families whose attention norms q and k per head (q_norm, k_norm: `Qwen3Attention.forward`).
HEAD_NORMS = frozenset({"qwen3", "qwen3_moe", "gemma3", "gemma3_text"})
# Families whose q, k and v projections have biases (`Qwen2Attention`), and those whose o projection has one too
# (`GptOssAttention`: attention_bias).
ATTENTION_BIAS = frozenset({"qwen2", "gpt_oss"})
OUTPUT_BIAS = frozenset({"gpt_oss"})
# Families whose router softmaxes an fp32 copy of its logits and keeps the top-k weights in fp32, so the routed rows
# are weighted, reordered and summed in fp32 (`MixtralTopKRouter`); their router is built before the experts.
FP32_ROUTER = frozenset({"mixtral"})
# The order a model forward frees its embeddings, position ids and masks as it returns: the order of the locals
# that last hold them, as its code first names them (`LlamaModel.forward`). A dict of mask arguments holds the
# embeddings and, in Qwen2 and Qwen3, the position ids (`Qwen3Model.forward`); gpt-oss and Gemma 3 name their
# masks first (`causal_mask_mapping := attention_mask`: `GptOssModel.forward`, `Gemma3TextModel.forward`), and
# Gemma 3's copy of the mask arguments holds the position ids too.
MODEL_LOCALS = {"qwen2": ("embeddings", "positions", "masks"), "qwen3": ("embeddings", "positions", "masks"),
                "gpt_oss": ("positions", "masks", "embeddings"), "gemma3": ("masks", "embeddings", "positions"),
                "gemma3_text": ("masks", "embeddings", "positions")}
LLAMA_LOCALS = ("positions", "embeddings", "masks")
# gpt-oss (modeling_gpt_oss.py). transformers has no SDPA path for it (`_supports_sdpa = False`), so the default
# attention falls back to eager (`PreTrainedModel.get_correct_attn_implementation`): `eager_attention_forward`
# with k and v repeated, scores in the model dtype, the heads' sinks concatenated as a last column, and the
# probabilities kept by the decoder layer until its MLP returns; eager attention takes an additive mask for every
# layer, full and sliding (`eager_mask`). Its rotary table is half the head wide (`GptOssRotaryEmbedding.forward`),
# applied to each half (`_apply_rotary_emb`); its RMSNorm multiplies the weight in fp32, then casts
# (`GptOssRMSNorm.forward`); its router and experts have biases, the router takes the top-k logits before their
# softmax (`GptOssTopKRouter`) and the experts clamp their SwiGLU (`GptOssExperts._apply_gate`).
EAGER_SINKS = frozenset({"gpt_oss"})
# Families whose published configs scale rope by YaRN, whose inv_freq is built from some twenty tensors of a head's
# width (`_compute_yarn_parameters`, modeling_rope_utils.py).
YARN_ROPE = frozenset({"gpt_oss", "deepseek_v2"})
# Gemma 3 (modeling_gemma3.py): embeddings scaled by sqrt(hidden) (`Gemma3TextScaledWordEmbedding`); RMSNorm as
# x * (1 + weight) in fp32 (`Gemma3RMSNorm`), four a layer: before and after attention and the MLP
# (`Gemma3DecoderLayer`); q, k and v all projected before q and k are normed (`Gemma3Attention.forward`); a rotary
# table for each layer type, full and sliding (`Gemma3RotaryEmbedding`).
GEMMA = frozenset({"gemma3", "gemma3_text"})
# DeepSeek-V2 (modeling_deepseek_v2.py): multi-head latent attention (`DeepseekV2Attention`): q projected whole or
# through a low rank and its norm, k and v from one compressed row (kv_a_proj_with_mqa) whose latent part is normed;
# the cache holds that latent and the rotated rope part, one head each (`DynamicLayer` by way of
# `past_key_values.update`); each forward expands the whole cached latent to every head's keys and values
# (`expand_kv`: kv_b_proj, and the keys assembled in a new tensor), so SDPA gets q and k of qk_nope + qk_rope and v
# of v_head_dim: the memory-efficient kernel. The rotary table is complex (`torch.polar`), applied to fp32 copies
# of q's and k's rope parts (`apply_rotary_emb`). The router copies the hidden rows and its weight to fp32, takes
# the softmax and the greedy top-k, scaled (`DeepseekV2TopkRouter`); the shared experts run as one MLP after the
# routed ones (`DeepseekV2Moe`), and the first_k_dense_replace layers keep a dense MLP; YaRN rope.
LATENT = frozenset({"deepseek_v2"})


def workspace_bytes(vendor: str | None, compute_capability: tuple[int, int] | None) -> int:
    """The BLAS workspace on a GPU of this vendor and (NVIDIA) compute capability; Hopper's where unknown."""
    if vendor == "amd":
        return MI300_WORKSPACE
    major = compute_capability[0] if compute_capability else 9
    return HOPPER_WORKSPACE if major in (9, 10, 12) else WORKSPACE


@dataclass(frozen=True)
class Attention:
    """One decoder layer's attention: heads, KV heads, head sizes, and the window a sliding layer keeps."""

    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int
    window: int | None


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention's widths: the cached latent (kv_lora_rank) and rope parts, the heads' unrotated
    query and key part, their values, and the query's down-projection rank (0: q projected whole)."""

    rank: int
    rope: int
    nope: int
    value: int
    query_rank: int


@dataclass(frozen=True)
class Shape:
    """What a model's run allocates by: widths, the attention of each layer, the parameters in module order."""

    hidden: int
    intermediate: int
    gated: bool
    top_k: int
    experts: int
    expert_intermediate: int
    vocab: int
    tied: bool
    head_norms: bool
    attention_bias: bool
    fp32_router: bool
    model_locals: tuple[str, ...]
    dtype_bytes: int
    layers: tuple[Attention, ...]
    rope_dim: int  # the rotary table's width: the first layer's head size
    extra: int = 0  # each layer's parameters beyond those above (biases, sinks, shared experts), as one tensor
    eager_sinks: bool = False  # the rules of EAGER_SINKS
    output_bias: bool = False
    gemma: bool = False  # the rules of GEMMA
    rotary_tables: int = 1
    yarn: bool = False
    latent: Latent | None = None  # the rules of LATENT, where the layers' attention is latent
    shared_intermediate: int = 0  # the shared experts', as one MLP
    dense_layers: frozenset[int] = frozenset()  # an MoE model's layers with a dense MLP

    def parameters(self) -> int:
        """Bytes of every parameter the build makes and keeps."""
        head = 0 if self.tied else self.vocab * self.hidden * self.dtype_bytes
        return (self.vocab + 1) * self.hidden * self.dtype_bytes + head + sum(
            sum(self.layer_parameters(index, a)) for index, a in enumerate(self.layers))

    def moe_layer(self, index: int) -> bool:
        return bool(self.experts) and index not in self.dense_layers

    def layer_parameters(self, index: int, a: Attention) -> list[int]:
        """A decoder layer's parameters in module order: q, k, v (each with its bias), o (q_norm, k_norm), the MLP
        or the experts and their router (and shared experts), the two norms (`LlamaDecoderLayer.__init__`); MLA's
        projections and norms (`DeepseekV2Attention.__init__`)."""
        b, h = self.dtype_bytes, self.hidden
        out = []
        if self.latent is not None:
            m = self.latent
            query = a.heads * (m.nope + m.rope)
            out += [m.query_rank * h * b, m.query_rank * b, query * m.query_rank * b] if m.query_rank else [
                query * h * b]
            out += [(m.rank + m.rope) * h * b, m.rank * b, a.heads * (m.nope + m.value) * m.rank * b,
                    h * a.heads * m.value * b]
        else:
            for rows in (a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim_v):
                out += [rows * h * b, rows * b] if self.attention_bias else [rows * h * b]
            out.append(h * a.heads * a.head_dim_v * b)
        if self.output_bias:
            out.append(h * b)
        if self.eager_sinks:
            out.append(a.heads * b)  # sinks
        if self.head_norms:
            out += [a.head_dim * b, a.head_dim * b]
        if self.moe_layer(index):
            gate_up = self.experts * (2 if self.gated else 1) * self.expert_intermediate * b
            down = self.experts * h * self.expert_intermediate * b
            if self.eager_sinks:  # each with its bias, the router first
                out += [self.experts * h * b, self.experts * b, gate_up * h, gate_up, down, self.experts * h * b]
            else:
                experts, router = [gate_up * h, down], [self.experts * h * b]
                out += router + experts if self.fp32_router else experts + router
            out += [self.shared_intermediate * h * b] * (3 if self.gated else 2) if self.shared_intermediate else []
        else:
            out += [self.intermediate * h * b] * (3 if self.gated else 2)
        return out + [h * b] * (4 if self.gemma else 2) + ([self.extra] if self.extra else [])


def not_replayed(model: ModelSpec) -> str | None:
    """Why kvplan does not replay `model`'s transformers run, as the end of a sentence ("for models of over 1,024
    layers"), or None where it does: a decoder of a MODELLED architecture, of full and sliding attention layers
    (MLA for LATENT ones) with the widths and vocabulary it states, of at most MAX_LAYERS layers, whose router does
    not pick experts from groups."""
    w, arch = model.widths, model.architecture
    if model.num_layers > MAX_LAYERS:
        return f"for models of over {MAX_LAYERS:,} layers"
    if w is not None and w.expert_groups > 1:
        return f"for {arch} models with a group-limited router"
    kinds = ("mla",) if arch in LATENT else ("full", "sliding")
    if (arch not in MODELLED or w is None or not model.vocab_size or any(c.kind not in kinds for c in model.caches)
            or len(model.caches) != model.num_layers):
        return f"for {arch} models"
    return None


def shape_of(model: ModelSpec, dtype_bytes: int, weights: int, layers: int | None = None) -> Shape:
    """The run's shape for a model kvplan replays (`not_replayed` is None: full and sliding attention layers, or
    MLA, with the widths it states) over its first `layers` layers (a pipeline stage), parameters of `weights`
    bytes in all. Parameters the layout does not name (biases, attention sinks, shared experts) are spread over the
    layers."""
    w = model.widths
    latent = model.architecture in LATENT
    attention = model.caches
    if latent:  # the cache as DynamicLayer holds it: the latent as one head's keys, the rope part as its values
        first = attention[0]
        mla = Latent(first.latent_dim, first.rope_dim, w.query_head_dim - first.rope_dim, w.value_head_dim,
                     w.query_rank)
        stage = tuple(Attention(model.num_attention_heads, 1, c.latent_dim, c.rope_dim, None)
                      for c in attention[:layers])
    else:
        mla = None
        stage = tuple(Attention(model.num_attention_heads, c.kv_heads, c.head_dim, c.head_dim_v,
                                getattr(c, "window", None)) for c in attention[:layers])
    arch = model.architecture
    shape = Shape(hidden=w.hidden, intermediate=w.mlp_intermediate, gated=w.gated_mlp, top_k=w.experts_per_token,
                  experts=w.experts, expert_intermediate=w.expert_intermediate, vocab=model.vocab_size,
                  tied=model.params.lm_head == 0, head_norms=arch in HEAD_NORMS, attention_bias=arch in ATTENTION_BIAS,
                  fp32_router=arch in FP32_ROUTER, model_locals=MODEL_LOCALS.get(arch, LLAMA_LOCALS),
                  dtype_bytes=dtype_bytes, layers=stage,
                  rope_dim=stage[0].head_dim_v if latent else stage[0].head_dim,  # MLA: the cached rope part
                  eager_sinks=arch in EAGER_SINKS, output_bias=arch in OUTPUT_BIAS, gemma=arch in GEMMA,
                  yarn=arch in YARN_ROPE, rotary_tables=len({a.window is None for a in stage}) if arch in GEMMA else 1,
                  latent=mla, shared_intermediate=w.shared_expert_intermediate, dense_layers=frozenset(w.dense_layers))
    named = shape.parameters()
    return replace(shape, extra=(weights - named) // len(stage)) if weights > named else shape


class Trace:
    """The events of a run: `new(size)` allocates and returns the slot, `free(slot, ...)` frees."""

    __slots__ = ("events", "count")

    def __init__(self):
        self.events: list[int] = []
        self.count = 0

    def new(self, size: int) -> int:
        self.events.append(size)
        self.count += 1
        return self.count - 1

    def free(self, *slots: int) -> None:
        self.events.extend(~slot for slot in slots)


@dataclass
class Run:
    """A run's events and where its phases end: after the build, after prefill, after decode."""

    events: list[int]
    ends: list[int]


def run(shape: Shape, batch: int, prompt: int, steps: int, workspace: int) -> Run:
    """`kvplan profile`'s run (kvplan/profiler/run.py): build, `batch` x `prompt` prefilled, `steps` decoded."""
    t = Trace()
    _build(t, shape)
    ends = [len(t.events)]
    t.new(batch * prompt * INT64)  # the prompts' token ids, kept
    forward = _Forward(t, shape, batch, workspace)
    token = forward.step(prompt)
    ends.append(len(t.events))
    for _ in range(steps):
        following = forward.step(1)
        t.free(token)
        token = following
    ends.append(len(t.events))
    return Run(t.events, ends)


def _build(t: Trace, s: Shape) -> None:
    """The parameters in module order: the embedding, each layer's, the final norm, the rotary buffers (inv_freq
    and its copy, made from an arange: `compute_default_rope_parameters`), lm_head; a tied lm_head is made, then
    freed when tied to the embedding (`tie_weights`)."""
    b, half = s.dtype_bytes, s.rope_dim // 2 * FP32
    sizes = [s.vocab * s.hidden * b]
    for index, a in enumerate(s.layers):
        sizes += s.layer_parameters(index, a)
    sizes.append(s.hidden * b)
    for size in sizes:
        t.new(size)
    for _ in range(s.rotary_tables):
        (_yarn_inv_freq if s.yarn else _default_inv_freq)(t, half)
        t.new(half)  # original_inv_freq
    head = t.new(s.vocab * s.hidden * b)
    if s.tied:
        t.free(head)


def _default_inv_freq(t: Trace, half: int) -> None:
    """`compute_default_rope_parameters`: 1 / base ** (arange(0, dim, 2) / dim)."""
    arange = t.new(half)
    scaled = t.new(half)
    t.free(arange)
    power = t.new(half)
    t.free(scaled)
    reciprocal = t.new(half)
    t.new(half)  # inv_freq
    t.free(reciprocal, power)


def _yarn_inv_freq(t: Trace, half: int) -> None:
    """`_compute_yarn_parameters`: the interpolated and extrapolated frequencies blended by a linear ramp."""
    arange = t.new(2 * half)  # int64
    floats = t.new(half)
    t.free(arange)
    scaled = t.new(half)
    t.free(floats)
    power = t.new(half)
    t.free(scaled)
    reciprocal = t.new(half)
    extrapolation = t.new(half)
    t.free(reciprocal)
    factored = t.new(half)
    reciprocal = t.new(half)
    interpolation = t.new(half)
    t.free(reciprocal, factored)
    ramp = t.new(half)
    for _ in range(3):  # - min, / (max - min), clamp
        following = t.new(half)
        t.free(ramp)
        ramp = following
    extrapolation_factor = t.new(half)
    t.free(ramp)
    complement = t.new(half)
    interpolated = t.new(half)
    t.free(complement)
    extrapolated = t.new(half)
    t.new(half)  # inv_freq
    t.free(interpolated, extrapolated, power, extrapolation, interpolation, extrapolation_factor)


class _Forward:
    """One model forward after another on the same cache: the prefill, then each decode step."""

    def __init__(self, t: Trace, s: Shape, batch: int, workspace: int):
        self.t, self.s, self.batch = t, s, batch
        self.workspace = workspace  # allocated by the first matmul, then 0
        self.past = 0
        self.windows = sorted({a.window for a in s.layers if a.window})
        self.cache: list[tuple[int, int] | None] = [None] * len(s.layers)  # each layer's keys' and values' slots

    def matmul(self, size: int) -> int:
        out = self.t.new(size)
        if self.workspace:
            self.t.new(self.workspace)
            self.workspace = 0
        return out

    def step(self, tokens: int) -> int:
        """A forward over `tokens` new tokens of each sequence; the next token's slot."""
        t, s, b = self.t, self.s, self.s.dtype_bytes
        rows = self.batch * tokens
        embeddings = t.new(rows * s.hidden * b)
        if s.gemma:  # x embed_scale
            unscaled, embeddings = embeddings, t.new(rows * s.hidden * b)
            t.free(unscaled)
        arange = t.new(tokens * INT64)
        positions = t.new(tokens * INT64)
        t.free(arange)
        if s.eager_sinks:  # eager attention: every layer kind's mask, the full layers' first
            masks = {window: self.mask(window, tokens) for window in (None, *self.windows)}
        else:
            masks = {window: self.mask(window, tokens) for window in self.windows if self.masked(window, tokens)}
        tables = [self.rotary(tokens) for _ in range(s.rotary_tables)]
        hidden = embeddings
        for index, attention in enumerate(s.layers):
            out = self.layer(index, attention, tokens, masks.get(attention.window))
            if hidden != embeddings:
                t.free(hidden)
            hidden = out
        normed = self.rms_norm(rows, s.hidden)
        if hidden != embeddings:
            t.free(hidden)
        held = {"embeddings": (embeddings,), "positions": (positions,), "masks": tuple(masks.values())}
        t.free(*(slot for name in s.model_locals for slot in held[name]))
        for table in tables:
            t.free(*reversed(table))  # a tuple frees its items last first
        logits = self.matmul(self.batch * s.vocab * b)
        t.free(normed)
        token = t.new(self.batch * INT64)
        t.free(logits)
        self.past += tokens
        return token

    def masked(self, window: int, tokens: int) -> bool:
        """Whether a sliding layer gets a mask, not SDPA's is_causal: once its keys reach the window
        (`_ignore_causal_mask_sdpa`; the keys it attends to, `DynamicSlidingWindowLayer.get_mask_sizes`)."""
        return min(self.past, window - 1) + tokens >= window

    def mask(self, window: int | None, tokens: int) -> int:
        """`sdpa_mask` for a sliding window (or, for eager attention, the full layers: None): a boolean queries x
        keys mask built from index tensors; eager attention's made additive for the batch (`eager_mask`)."""
        t = self.t
        keys = self.past + tokens if window is None else min(self.past, window - 1) + tokens
        batch, head = t.new(self.batch * INT64), t.new(INT64)
        arange = t.new(tokens * INT64)
        queries = t.new(tokens * INT64)
        t.free(arange)
        arange = t.new(keys * INT64)
        kv = t.new(keys * INT64)
        t.free(arange)
        if window is None:
            mask = t.new(tokens * keys)
        else:
            ones = t.new(1)
            shifted = t.new(tokens * INT64)
            after = t.new(tokens * keys)
            t.free(shifted)
            inside = t.new(tokens * keys)
            t.free(after, ones)
            causal = t.new(tokens * keys)
            mask = t.new(tokens * keys)
            t.free(causal, inside)
        t.free(batch, head, queries, kv)
        if not self.s.eager_sinks:
            return mask
        zero = t.new(self.s.dtype_bytes)
        additive = t.new(self.batch * tokens * keys * self.s.dtype_bytes)
        t.free(zero, mask)
        return additive

    def rotary(self, tokens: int) -> tuple[int, ...]:
        """`LlamaRotaryEmbedding.forward`: cos and sin in the model dtype; DeepSeek-V2's
        (`DeepseekV2RotaryEmbedding.forward`): the complex table polar(1, freqs) x attention_scaling."""
        t, d = self.t, self.s.rope_dim
        floats = t.new(tokens * FP32)
        freqs = t.new(tokens * d // 2 * FP32)
        t.free(floats)
        if self.s.latent is not None:
            ones = t.new(tokens * d // 2 * FP32)
            polar = t.new(tokens * d // 2 * 2 * FP32)
            t.free(ones)
            table = t.new(tokens * d // 2 * 2 * FP32)
            t.free(polar, freqs)
            return (table,)
        if self.s.eager_sinks:  # the frequencies are the table, half the head wide
            d //= 2
            table = freqs
        else:
            table = t.new(tokens * d * FP32)
        raw = t.new(tokens * d * FP32)
        cos = t.new(tokens * d * FP32)
        t.free(raw)
        raw = t.new(tokens * d * FP32)
        sin = t.new(tokens * d * FP32)
        t.free(raw)
        cos_b = t.new(tokens * d * self.s.dtype_bytes)
        sin_b = t.new(tokens * d * self.s.dtype_bytes)
        t.free(*dict.fromkeys((freqs, table)), cos, sin)
        return cos_b, sin_b

    def rms_norm(self, rows: int, width: int) -> int:
        """`LlamaRMSNorm.forward` over `rows` rows of `width` (the input is the caller's): the normed tensor's
        slot."""
        t, b = self.t, self.s.dtype_bytes
        if self.s.gemma:
            return self.gemma_norm(rows, width)
        upcast = t.new(rows * width * FP32)
        square = t.new(rows * width * FP32)
        variance = t.new(rows * FP32)
        t.free(square)
        shifted = t.new(rows * FP32)
        root = t.new(rows * FP32)
        t.free(shifted)
        scaled = t.new(rows * width * FP32)
        t.free(root, upcast)
        cast = t.new(rows * width * (FP32 if self.s.eager_sinks else b))  # gpt-oss: weight x fp32, then cast
        out = t.new(rows * width * b)
        t.free(cast, scaled, variance)
        return out

    def gemma_norm(self, rows: int, width: int) -> int:
        """`Gemma3RMSNorm.forward`: x in fp32 x rsqrt(mean(x^2) + eps) x (1 + weight in fp32), cast back."""
        t = self.t
        upcast = t.new(rows * width * FP32)
        square = t.new(rows * width * FP32)
        variance = t.new(rows * FP32)
        t.free(square)
        shifted = t.new(rows * FP32)
        t.free(variance)
        root = t.new(rows * FP32)
        t.free(shifted)
        normed = t.new(rows * width * FP32)
        t.free(root, upcast)
        weight = t.new(width * FP32)
        plus_one = t.new(width * FP32)
        t.free(weight)
        scaled = t.new(rows * width * FP32)
        t.free(plus_one, normed)
        out = t.new(rows * width * self.s.dtype_bytes)
        t.free(scaled)
        return out

    def rope(self, size: int) -> int:
        """`apply_rotary_pos_emb` on one of q, k (`size` bytes): x cos + rotate_half(x) sin; gpt-oss's
        (`_apply_rotary_emb`): cat(x1 cos - x2 sin, x2 cos + x1 sin)."""
        t = self.t
        if self.s.eager_sinks:
            halves = []
            for _ in range(2):
                first, second = t.new(size // 2), t.new(size // 2)
                halves.append(t.new(size // 2))
                t.free(first, second)
            out = t.new(size)
            t.free(*halves)
            return out
        first = t.new(size)
        negated = t.new(size // 2)
        rotated = t.new(size)
        t.free(negated)
        second = t.new(size)
        t.free(rotated)
        out = t.new(size)
        t.free(first, second)
        return out

    def layer(self, index: int, a: Attention, tokens: int, mask: int | None) -> int:
        """`LlamaDecoderLayer.forward` (its input is the caller's): the output's slot."""
        t, s, b = self.t, self.s, self.s.dtype_bytes
        rows = self.batch * tokens
        normed = self.rms_norm(rows, s.hidden)
        if s.latent is not None:
            projected = self.latent_attention(index, a, tokens)
            t.free(normed)
            return self.feed_forward(index, rows, projected)
        q_size = rows * a.heads * a.head_dim * b
        k_size = rows * a.kv_heads * a.head_dim * b
        v_size = rows * a.kv_heads * a.head_dim_v * b
        if s.gemma:  # q, k and v projected, then q and k normed
            q, k, v = self.matmul(q_size), self.matmul(k_size), self.matmul(v_size)
            q_normed = self.rms_norm(rows * a.heads, a.head_dim)
            t.free(q)
            k_normed = self.rms_norm(rows * a.kv_heads, a.head_dim)
            t.free(k)
            q, k = q_normed, k_normed
        else:
            q = self.matmul(q_size)
            if s.head_norms:
                projected, q = q, self.rms_norm(rows * a.heads, a.head_dim)
                t.free(projected)
            k = self.matmul(k_size)
            if s.head_norms:
                projected, k = k, self.rms_norm(rows * a.kv_heads, a.head_dim)
                t.free(projected)
            v = self.matmul(v_size)
        q_rotated = self.rope(q_size)
        k_rotated = self.rope(k_size)
        t.free(q, k)
        self.cache_update(index, a, tokens)
        t.free(k_rotated, v)
        if s.eager_sinks:
            out, probabilities = self.eager_attention(a, tokens, mask)
        else:
            out, probabilities = self.attention(a, tokens, mask), None
        projected = self.matmul(rows * s.hidden * b)
        t.free(out, q_rotated, normed)
        return self.feed_forward(index, rows, projected, probabilities)

    def feed_forward(self, index: int, rows: int, projected: int, probabilities: int | None = None) -> int:
        """The rest of a decoder layer after attention's output projection (`projected`): the residual, the norm,
        the MLP or the experts, the residual (`LlamaDecoderLayer.forward`); eager attention's `probabilities`, held
        until the MLP returns. The layer's output slot."""
        t, s = self.t, self.s
        residual = self.residual_add(rows, projected)
        normed = self.rms_norm(rows, s.hidden)
        mlp, router_scores = self.experts(rows) if s.moe_layer(index) else (self.mlp(rows, s.intermediate), None)
        t.free(normed)
        if probabilities is not None:  # held by `hidden_states, _ = self.self_attn(...)` until the MLP's `_`
            t.free(probabilities)
        out = self.residual_add(rows, mlp, residual)
        if router_scores is not None:  # the MLP's `_`, freed when the layer returns
            t.free(router_scores)
        return out

    def residual_add(self, rows: int, added: int, *residual: int) -> int:
        """The residual stream + `added` (attention's or the MLP's output, freed), normed first in Gemma 3
        (`Gemma3DecoderLayer.forward`); `residual`: the stream's slot, freed, where the caller holds it no longer."""
        t = self.t
        if self.s.gemma:
            normed = self.rms_norm(rows, self.s.hidden)
            t.free(added)
            added = normed
        out = t.new(rows * self.s.hidden * self.s.dtype_bytes)
        t.free(added, *residual)
        return out

    def cache_update(self, index: int, a: Attention, tokens: int) -> None:
        """`DynamicLayer.update`: keys = cat(keys, k), values = cat(values, v), each old tensor freed as its name is
        rebound (nothing to free at the first step: the layer starts from empty tensors)."""
        t, b = self.t, self.s.dtype_bytes
        length = self.keys_attended(a, tokens)
        old = self.cache[index]
        if old is None and a.window:
            t.new(INT64)  # the window as a tensor, moved to the device at the first update
        keys = t.new(self.batch * a.kv_heads * length * a.head_dim * b)
        if old is not None and not a.window:
            t.free(old[0])
        values = t.new(self.batch * a.kv_heads * length * a.head_dim_v * b)
        if old is not None:
            t.free(*old[a.window is None:])  # a sliding layer rebinds both to views after both concatenations
        self.cache[index] = (keys, values)

    def keys_attended(self, a: Attention, tokens: int) -> int:
        """The keys a layer's attention reads at this step: all held (a sliding layer's last window - 1) and the
        new ones."""
        return (self.past if a.window is None else min(self.past, a.window - 1)) + tokens

    def attention(self, a: Attention, tokens: int, mask: int | None) -> int:
        """SDPA on CUDA (`sdpa_attention_forward`, then torch's kernel; see the module docstring); the output's
        slot."""
        t, b = self.t, self.s.dtype_bytes
        out_size = self.batch * tokens * a.heads * a.head_dim_v * b
        if mask is None and a.head_dim == a.head_dim_v <= 256 and b == 2:
            out = t.new(out_size)
            logsumexp = t.new(self.batch * a.heads * tokens * FP32)
            seed = t.new(16)
            offset = t.new(8)
            t.free(offset, seed, logsumexp)
            return out
        keys = self.keys_attended(a, tokens)
        grouped = a.heads > a.kv_heads > 1  # one KV head repeats and packs as views: nothing is copied
        repeated = ()
        if grouped and tokens > 1:  # repeat_kv; a single query is packed by groups instead (`pack_gqa`)
            repeated = (t.new(self.batch * a.heads * keys * a.head_dim * b),
                        t.new(self.batch * a.heads * keys * a.head_dim_v * b))
        additive = ()
        if mask is not None:  # convert_boolean_attn_mask, for the batch; pad_bias to 8 columns
            zero = t.new(b)
            flipped = t.new(self.batch * tokens * keys)
            converted = t.new(self.batch * tokens * keys * b)
            t.free(flipped)
            if keys % 8:
                padded = t.new(self.batch * tokens * (keys + 8 - keys % 8) * b)
                t.free(converted)
                converted = padded
            additive = (converted, zero)
        out = t.new(out_size)
        seed = t.new(8)
        offset = t.new(8)
        t.free(offset, seed)
        if a.head_dim_v > 128 and b != FP32:  # CUTLASS's fp32 accumulator, while the kernel runs
            t.free(t.new(self.batch * tokens * a.heads * a.head_dim_v * FP32))
        t.free(*additive, *repeated)
        if grouped and tokens == 1:  # undoing pack_gqa: the reshape copies
            packed, out = out, t.new(out_size)
            t.free(packed)
        return out

    def latent_attention(self, index: int, a: Attention, tokens: int) -> int:
        """`DeepseekV2Attention.forward` (see LATENT; its input is the caller's): the output projection's slot."""
        t, s, m, b = self.t, self.s, self.s.latent, self.s.dtype_bytes
        rows, query_width = self.batch * tokens, a.heads * (m.nope + m.rope)
        if m.query_rank:  # q_b_proj(q_a_layernorm(q_a_proj(x)))
            down = self.matmul(rows * m.query_rank * b)
            normed = self.rms_norm(rows, m.query_rank)
            t.free(down)
            q = self.matmul(rows * query_width * b)
            t.free(normed)
        else:
            q = self.matmul(rows * query_width * b)
        compressed = self.matmul(rows * (m.rank + m.rope) * b)
        latent = self.rms_norm(rows, m.rank)
        q_float, k_float = t.new(rows * a.heads * m.rope * FP32), t.new(rows * m.rope * FP32)
        rotated = []
        for heads in (a.heads, 1):  # `apply_rotary_emb`: x as complex x the table, back to the model dtype
            product = t.new(rows * heads * m.rope * FP32)
            rotated.append(t.new(rows * heads * m.rope * b))
            t.free(product)
        t.free(q_float, k_float)
        q_rotated, k_rotated = rotated
        self.cache_update(index, a, tokens)
        t.free(latent, k_rotated)
        query = t.new(rows * query_width * b)
        length = self.past + tokens
        expanded = self.matmul(self.batch * length * a.heads * (m.nope + m.value) * b)  # `expand_kv`
        keys = t.new(self.batch * length * query_width * b)
        out = self.attention(Attention(a.heads, a.heads, m.nope + m.rope, m.value, None), tokens, None)
        projected = self.matmul(rows * s.hidden * b)
        t.free(out, q, q_rotated, compressed, query, keys, expanded)
        return projected

    def eager_attention(self, a: Attention, tokens: int, mask: int) -> tuple[int, int]:
        """gpt-oss's `eager_attention_forward`: k and v repeated to every head, q k^T x scaling + mask, the sinks
        concatenated as a last column, the row max subtracted, softmax, x v, transposed contiguous; (the output's
        slot, the probabilities', which the caller frees)."""
        t, b = self.t, self.s.dtype_bytes
        keys = self.keys_attended(a, tokens)
        queries = self.batch * a.heads * tokens
        repeated = ()
        if a.heads > a.kv_heads > 1:  # repeat_kv (one KV head repeats as a view)
            repeated = (t.new(self.batch * a.heads * keys * a.head_dim * b),
                        t.new(self.batch * a.heads * keys * a.head_dim_v * b))
        scores = t.new(queries * keys * b)
        scaled = t.new(queries * keys * b)
        t.free(scores)
        masked = t.new(queries * keys * b)
        t.free(scaled)
        combined = t.new(queries * (keys + 1) * b)
        maximum, argmax = t.new(queries * b), t.new(queries * INT64)
        t.free(argmax)
        shifted = t.new(queries * (keys + 1) * b)
        t.free(maximum, combined)
        probabilities = t.new(queries * (keys + 1) * b)
        t.free(masked)
        out = t.new(queries * a.head_dim_v * b)
        if tokens > 1:  # a single query's transpose is already contiguous
            transposed, out = out, t.new(queries * a.head_dim_v * b)
            t.free(transposed)
        t.free(*repeated, shifted)
        return out, probabilities

    def mlp(self, rows: int, intermediate: int) -> int:
        """`LlamaMLP.forward`: down(act(gate(x)) x up(x)); plain: down(act(up(x)))."""
        t, s, b = self.t, self.s, self.s.dtype_bytes
        wide = rows * intermediate * b
        gate = self.matmul(wide)
        activated = t.new(wide)
        t.free(gate)
        if s.gated:
            up = self.matmul(wide)
            product = t.new(wide)
            t.free(activated, up)
            activated = product
        down = self.matmul(rows * s.hidden * b)
        t.free(activated)
        return down

    def experts(self, rows: int) -> tuple[int, int | None]:
        """A sparse MoE block: the router, then grouped_mm over the tokens sorted by expert, the rows weighted, put
        back in order and summed (`grouped_mm_experts_forward`); (the output's slot, and for gpt-oss the router's
        scores, which its decoder layer keeps until it returns)."""
        t, s, b = self.t, self.s, self.s.dtype_bytes
        picks = rows * s.top_k
        logits, weights, weight_bytes, indices = self.router(rows)
        sorted_ids = t.new(picks * INT64)
        permutation = t.new(picks * INT64)
        quotient = t.new(picks * INT64)
        gathered = t.new(picks * s.hidden * b)
        t.free(quotient)
        sorted_weights = t.new(picks * weight_bytes)
        counted = t.new(picks * 4)
        histogram = t.new(s.experts * FP32)
        offsets = t.new(s.experts * 4)
        wide = picks * s.expert_intermediate * b
        if s.eager_sinks:  # each expert's biases gathered for the picks, added in place
            biases = t.new(wide * (2 if s.gated else 1))
            gate_up = t.new(wide * (2 if s.gated else 1))
            activated = self.clamped_glu(wide)
            t.free(gate_up)
            down_biases = (t.new(picks * s.hidden * b),)
            t.free(biases)
        else:
            gate_up = t.new(wide * (2 if s.gated else 1))
            activated = t.new(wide)
            if s.gated:
                product = t.new(wide)
                t.free(activated)
                activated = product
            t.free(gate_up)
            down_biases = ()
        down = t.new(picks * s.hidden * b)
        t.free(activated)
        row_bytes = max(b, weight_bytes)  # bf16 rows x fp32 weights are fp32
        weighted = t.new(picks * s.hidden * row_bytes)
        inverse = t.new(picks * INT64)
        arange = t.new(picks * INT64)
        t.free(arange)
        restored = t.new(picks * s.hidden * row_bytes)
        t.free(weighted)
        summed = t.new(rows * s.hidden * row_bytes)
        out = summed if row_bytes == b else t.new(rows * s.hidden * b)
        t.free(sorted_ids, permutation, gathered, sorted_weights, counted, histogram, offsets, *down_biases, down,
               restored, inverse, *((summed,) if out != summed else ()))
        if s.shared_intermediate:  # `DeepseekV2Moe`: + shared_experts(x)
            shared = self.mlp(rows, s.shared_intermediate)
            combined = t.new(rows * s.hidden * b)
            t.free(shared, out)
            out = combined
        t.free(logits)
        if s.eager_sinks:
            t.free(indices)
            return out, weights
        t.free(weights, indices)
        return out, None

    def router(self, rows: int) -> tuple[int, int, int, int]:
        """The router's logits, softmax in fp32, top-k renormalised (`Qwen3MoeTopKRouter`: the weights cast back to
        the model dtype; FP32_ROUTER: kept in fp32); gpt-oss's, the softmax of the top-k logits
        (`GptOssTopKRouter`); (logits, weights, the weights' bytes each, indices)."""
        t, s, b = self.t, self.s, self.s.dtype_bytes
        picks = rows * s.top_k
        if s.latent is not None:  # `DeepseekV2TopkRouter`: fp32 copies, softmax, greedy top-k, scaled
            upcast, weight = t.new(rows * s.hidden * FP32), t.new(s.experts * s.hidden * FP32)
            logits = self.matmul(rows * s.experts * FP32)
            t.free(upcast, weight)
            probabilities = t.new(rows * s.experts * FP32)
            top, indices = t.new(picks * FP32), t.new(picks * INT64)
            weights = t.new(picks * FP32)
            t.free(top, probabilities)
            return logits, weights, FP32, indices
        logits = self.matmul(rows * s.experts * b)
        if s.eager_sinks:
            top, indices = t.new(picks * b), t.new(picks * INT64)
            weights = t.new(picks * b)
            t.free(top)
            return logits, weights, b, indices
        if s.fp32_router:
            upcast = t.new(rows * s.experts * FP32)
            probabilities = t.new(rows * s.experts * FP32)
            t.free(upcast)
        else:
            probabilities = t.new(rows * s.experts * FP32)
        top = t.new(picks * FP32)
        indices = t.new(picks * INT64)
        total = t.new(rows * FP32)
        t.free(total)
        if s.fp32_router:
            t.free(probabilities)
            return logits, top, FP32, indices
        weights = t.new(picks * b)
        t.free(top, probabilities)
        return logits, weights, b, indices

    def clamped_glu(self, wide: int) -> int:
        """`GptOssExperts._apply_gate` on the gate_up rows (`wide` bytes a half): (up.clamp + 1) x
        gate.clamp x sigmoid(gate.clamp x alpha)."""
        t = self.t
        gate, up = t.new(wide), t.new(wide)
        scaled = t.new(wide)
        sigmoid = t.new(wide)
        t.free(scaled)
        glu = t.new(wide)
        t.free(sigmoid)
        shifted = t.new(wide)
        out = t.new(wide)
        t.free(shifted, gate, up, glu)
        return out
