"""The domain model: a model is a sequence of layer caches, plus its parameter counts and dtypes.

Each cache kind is a small immutable type that knows two things, as vLLM's `kv_cache_interface.py` specs do:
how many bytes one token costs it (`bytes_per_token`) and how many tokens it keeps for a sequence that holds
`ctx` tokens (`tokens_held`). Everything else (per sequence, per batch, per GPU) is arithmetic on those two,
in `kvplan.memory`. A new architecture is a new reader rule in `kvplan.sources`, not a new branch here.

What a model is planned for is here too: the GPU (`Hardware`), the parallel layout (`Parallelism`) and the users
and their context (`Workload`).
"""

from collections.abc import Callable, Hashable
from typing import Annotated, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, PositiveInt, model_validator
from pydantic_core import core_schema

from kvplan.dtypes import GGML_BY_NAME, SAFETENSORS_BITS, DType, kv_dtype


class _AsBuilt:
    """Marks a field holding a part the sources built, and pydantic validated, as its own type (each cache kind, the
    counts, the widths, the optional parts): the model holding it checks the part's type and dumps it as the part
    dumps itself, without building the part's schema into its own. Otherwise ModelSpec's first validation would
    build all thirteen cache kinds' schemas and every optional part's, on each command that reads one config."""

    def __get_pydantic_core_schema__(self, source: type, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.is_instance_schema(source, serialization=core_schema.plain_serializer_function_ser_schema(
            _dump_part, info_arg=True))


def _dump_part(part: BaseModel, info: core_schema.SerializationInfo) -> dict:
    return part.model_dump(mode=info.mode)


AS_BUILT = _AsBuilt()


class _Cache(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    layer: int = Field(ge=0, description="decoder layer index (a layer may have two caches: an encoder-decoder layer's "
                                        "self- and cross-attention, MLA and its indexer, attention beside Mamba)")
    split_by_tensor_parallel: bool = True

    def alike_key(self) -> tuple:
        """Its kind and every field but `layer`: layers with equal keys cache alike, so what one costs, all do
        (plain tuples: a pydantic copy and hash per layer cost a planning-table sweep more than the rest)."""
        key = self.__dict__.copy()
        key["layer"] = type(self)  # the kind in the layer's place
        return tuple(key.values())

    def bytes_per_token(self, dtype: DType, v_dtype: DType | None = None) -> int:
        """Bytes one token costs this layer, keys in `dtype` and values in `v_dtype` (None: `dtype` too; llama.cpp
        takes separate --cache-type-k and --cache-type-v)."""
        return 0

    def tokens_held(self, ctx: int) -> int:
        return 0

    def state_bytes(self, model_dtype: DType) -> int:
        """Bytes kept per sequence whatever its length (recurrent state)."""
        return 0


class _Attention(_Cache):
    """Keys and values for `kv_heads` heads: per token kv_heads x (head_dim + head_dim_v) elements."""

    kv_heads: PositiveInt
    head_dim: PositiveInt
    head_dim_v: PositiveInt

    def bytes_per_token(self, dtype: DType, v_dtype: DType | None = None) -> int:
        # K and V are separate rows (llama.cpp quantises each row in whole blocks).
        values = v_dtype or dtype
        return dtype.bytes_for(self.kv_heads * self.head_dim) + values.bytes_for(self.kv_heads * self.head_dim_v)


class FullAttention(_Attention):
    """Global attention (MHA, GQA, MQA): keeps every token of the sequence."""

    kind: Literal["full"] = "full"

    def tokens_held(self, ctx: int) -> int:
        return ctx


class SlidingWindow(_Attention):
    """Local attention over the last `window` tokens: keeps min(ctx, window) tokens."""

    kind: Literal["sliding"] = "sliding"
    window: PositiveInt

    def tokens_held(self, ctx: int) -> int:
        return min(ctx, self.window)


class ChunkedAttention(_Attention):
    """Chunked local attention (Llama 4): attends within its `chunk`-token chunk, so it needs at most a chunk.

    The figure is the peak, min(ctx, chunk): the cache a sequence needs as its current chunk fills.
    """

    kind: Literal["chunked"] = "chunked"
    chunk: PositiveInt

    def tokens_held(self, ctx: int) -> int:
        return min(ctx, self.chunk)


class MLALatent(_Cache):
    """Multi-head latent attention (DeepSeek V2/V3): one compressed row of kv_lora_rank + qk_rope_head_dim
    elements per token, shared by all heads, so tensor parallelism cannot split it (vLLM `MLAAttentionSpec`).
    With a `window` it is local attention over the last `window` tokens, keeping min(ctx, window) (dots3's
    sliding layers; vLLM `SlidingWindowMLASpec`)."""

    kind: Literal["mla"] = "mla"
    split_by_tensor_parallel: bool = False
    latent_dim: PositiveInt
    rope_dim: int = Field(ge=0)
    window: PositiveInt | None = Field(None, description="sliding window in tokens; None: every token")

    def bytes_per_token(self, dtype: DType, v_dtype: DType | None = None) -> int:
        """The latent is one row of keys (llama.cpp's K cache; it keeps no V for MLA)."""
        return dtype.bytes_for(self.latent_dim + self.rope_dim)

    def tokens_held(self, ctx: int) -> int:
        return min(ctx, self.window) if self.window else ctx


class IndexerKeys(_Cache):
    """A sparse-attention indexer's keys (DeepSeek-V3.2, GLM-5: DeepSeek Sparse Attention; Qwen4-Exp's QSA), cached
    beside the layer's attention: one `head_dim`-wide row per token (`index_head_dim`), kept for every token since
    the indexer scores them all to pick the ones attention reads; one head, so tensor parallelism cannot split it.
    transformers stores it in the model dtype (`DynamicIndexedLayer`); vLLM in fp8 with scales
    (`kvplan.engines.Vllm`)."""

    kind: Literal["indexer"] = "indexer"
    split_by_tensor_parallel: bool = False
    head_dim: PositiveInt
    storage_dtype: str | None = Field(None, description="a dtype the engine stores it in whatever the KV dtype; "
                                                        "None: the KV cache's")
    compress_ratio: PositiveInt | None = Field(None, description="Qwen4-Exp's QSA indexer: the keys it pools into "
                                               "one (indexer_compress_ratio); None for DeepSeek Sparse Attention")
    mrope: bool = Field(False, description="the model's rotary positions have three axes (M-RoPE: mrope_section), "
                                           "which vLLM's QSA key ring keeps beside each key")

    def bytes_per_token(self, dtype: DType, v_dtype: DType | None = None) -> int:
        return (kv_dtype(self.storage_dtype) if self.storage_dtype else dtype).bytes_for(self.head_dim)

    def tokens_held(self, ctx: int) -> int:
        return ctx


class SlidingKV(_Cache):
    """Shared-KV multi-query attention over the last `window` tokens (DeepSeek V4, paper §2.3; transformers
    `DeepseekV4Attention`): one `head_dim`-wide row per token is both key and value for every query head, so
    min(ctx, window) rows are held, and tensor parallelism cannot split the one head (vLLM `max_tp_shards=1`)."""

    kind: Literal["sliding_kv"] = "sliding_kv"
    split_by_tensor_parallel: bool = False
    head_dim: PositiveInt
    window: PositiveInt

    def bytes_per_token(self, dtype: DType, v_dtype: DType | None = None) -> int:
        """One row serves as key and value, so only the key dtype counts."""
        return dtype.bytes_for(self.head_dim)

    def tokens_held(self, ctx: int) -> int:
        return min(ctx, self.window)


class CompressedKV(_Cache):
    """A compressor's cache (DeepSeek V4's Compressed Sparse and Heavily Compressed Attention, paper §2.3.1-2.3.2;
    transformers `DeepseekV4CSACache` / `DeepseekV4HCACache`): every `ratio` tokens are folded into one
    `head_dim`-wide entry that serves as key and value, kept for the whole sequence, so ctx // ratio entries are
    held (`bytes_per_token` and `tokens_held` count entries). `indexer`: the lightning indexer's compressed keys,
    which CSA keeps beside its entries (index_head_dim wide, the same ratio). One head: not split by tensor
    parallelism.

    Until its window fills, the compressor keeps each token's kv and gate projections, `projection_width`
    elements each: 2 x head_dim with `overlap` (CSA: an entry mixes two consecutive windows, so every token
    feeds two entries), head_dim without. With `overlap` it also keeps the last closed window's first half,
    ratio x head_dim kv and gate elements, once a window has closed. `state_bytes` is that state at its largest
    between windows: ratio - 1 buffered tokens and the overlap."""

    kind: Literal["compressed"] = "compressed"
    split_by_tensor_parallel: bool = False
    head_dim: PositiveInt
    ratio: PositiveInt
    overlap: bool
    indexer: bool = False

    @property
    def projection_width(self) -> int:
        """kv (and gate) elements a buffered token keeps."""
        return (2 if self.overlap else 1) * self.head_dim

    def bytes_per_token(self, dtype: DType, v_dtype: DType | None = None) -> int:
        """One row per entry (key and value alike), in the key dtype."""
        return dtype.bytes_for(self.head_dim)

    def tokens_held(self, ctx: int) -> int:
        return ctx // self.ratio

    def buffer_bytes(self, dtype: DType, tokens: int) -> int:
        """The kv and gate projections of `tokens` buffered tokens."""
        return 2 * tokens * dtype.bytes_for(self.projection_width)

    def overlap_bytes(self, dtype: DType, gate_dtype: DType | None = None) -> int:
        """The last closed window's first half, kv and gate (the gate in `gate_dtype` where an engine keeps it
        apart); 0 without overlap."""
        if not self.overlap:
            return 0
        return self.ratio * (dtype.bytes_for(self.head_dim) + (gate_dtype or dtype).bytes_for(self.head_dim))

    def state_bytes(self, model_dtype: DType) -> int:
        return self.buffer_bytes(model_dtype, self.ratio - 1) + self.overlap_bytes(model_dtype)


class SharedKV(_Cache):
    """Attention that reads the keys and values an earlier layer cached (Gemma 3n and Gemma 4
    `num_kv_shared_layers`: the last layers reuse the last unshared layer of their type): it stores nothing of its
    own (transformers `DummyLayer`, vLLM `kv_sharing_target_layer_name`)."""

    kind: Literal["shared"] = "shared"
    source: int = Field(ge=0, description="the layer whose cache it reads")


class RecurrentState(_Cache):
    """Linear attention or SSM (Mamba, Gated DeltaNet): a fixed-size state per sequence, whatever its length.

    conv state: the last kernel - 1 inputs of the short convolution(s), in the model dtype unless set (an engine
    that runs the convolution in fp32 stores it so: `conv_dtype`);
    ssm state: the recurrent matrix, in the model dtype unless the config sets one (vLLM `mamba_ssm_cache_dtype`).
    conv_kernel, when known, is the convolution's width: transformers keeps `conv_kernel` inputs, not kernel - 1
    (`kvplan.engines.Transformers`).
    """

    kind: Literal["recurrent"] = "recurrent"
    mixer: str = Field(description="mamba, mamba2, gated_deltanet, short_conv, lightning, kda, ...")
    conv_elements: int = Field(ge=0)
    ssm_elements: int = Field(ge=0)
    ssm_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    ssm_dtype_stated: bool = Field(True, description="False where ssm_dtype is the family's default (transformers' "
                                   "config class), not the config's own: an engine may default otherwise")
    conv_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    conv_kernel: int | None = Field(None, ge=2, description="convolution width (conv_elements = channels x "
                                    "(conv_kernel - 1))")
    heads: int | None = Field(None, ge=1, description="SSM heads (Mamba-2 heads, Gated DeltaNet value heads): "
                              "tensor parallelism gives each GPU heads / tp of them, so it must divide them")
    groups: int | None = Field(None, ge=1, description="Mamba-2 n_groups: heads share B and C (state_size channels "
                               "each) by group; vLLM replicates them to tp groups when tp does not divide them")
    state_size: int | None = Field(None, ge=1, description="Mamba-2 d_state, the width of B and C per group; Gated "
                                   "DeltaNet's key head size (linear_key_head_dim), the Dk of its Hv x Dv x Dk "
                                   "state, which picks vLLM's prefill kernel on Blackwell")
    token_ids: int = Field(0, ge=0, description="token ids it keeps as int64, 8 bytes each (Qwen4-Exp's n-gram "
                                                "embedding keeps the last ngram_size - 1)")

    def state_bytes(self, model_dtype: DType) -> int:
        ssm_dtype = kv_dtype(self.ssm_dtype) if self.ssm_dtype else model_dtype
        conv_dtype = kv_dtype(self.conv_dtype) if self.conv_dtype else model_dtype
        return conv_dtype.bytes_for(self.conv_elements) + ssm_dtype.bytes_for(self.ssm_elements) + 8 * self.token_ids


class CrossAttention(_Attention):
    """Encoder-decoder cross-attention: keys and values of the encoder output, `encoder_tokens` of them
    (None: as many as the context, for models with no fixed encoder length such as T5)."""

    kind: Literal["cross"] = "cross"
    encoder_tokens: PositiveInt | None = None

    def tokens_held(self, ctx: int) -> int:
        return self.encoder_tokens or ctx


class NoCache(_Cache):
    """A layer that keeps nothing between tokens (attention-free NAS block, MLP-only hybrid layer, encoder)."""

    kind: Literal["none"] = "none"
    reason: str


# ------------------------------------------------------------ caches only transformers keeps (GPT-2-era decoders)


class TokenStates(_Cache):
    """A row of `width` values per token that are not keys and values: a layer's input hidden states (XLNet's
    Transformer-XL memories `mems`, Reformer's `states_cache`), or the hash buckets of Reformer's LSH attention.

    It holds the last `memory` tokens (None: every token), and none while the sequence has at most `after` tokens.
    Values are in the cache dtype unless `element_bytes` fixes their size (Reformer's int64 buckets: 8). A hidden
    state is the whole hidden size, not split by heads, so tensor parallelism cannot split it. A model that pads a
    prompt of more than `pad_above` tokens to a multiple of `pad_multiple` (Reformer, to its chunk lengths) computes
    these rows for the padded prompt (`padded`)."""

    kind: Literal["states"] = "states"
    split_by_tensor_parallel: bool = False
    holds: str = Field(description="what each row is: hidden states, hash buckets")
    width: PositiveInt
    memory: PositiveInt | None = Field(None, description="tokens kept, the latest; None: all of them")
    after: int = Field(0, ge=0, description="kept only once the sequence is longer than this many tokens")
    element_bytes: PositiveInt | None = Field(None, description="bytes per value stored whatever the cache "
                                                                "dtype; None: the cache dtype's")
    pad_multiple: PositiveInt | None = Field(None, description="a longer prompt is padded to a multiple of this")
    pad_above: int = Field(0, ge=0, description="prompts of more tokens than this are padded")

    def bytes_per_token(self, dtype: DType, v_dtype: DType | None = None) -> int:
        """One row per token, in the key dtype (or `element_bytes` a value)."""
        return self.width * self.element_bytes if self.element_bytes else dtype.bytes_for(self.width)

    def tokens_held(self, ctx: int) -> int:
        if ctx <= self.after:
            return 0
        return min(ctx, self.memory) if self.memory else ctx

    def padded(self, prompt: int) -> int:
        """The length the model runs a prompt at."""
        if self.pad_multiple is None or prompt <= self.pad_above:
            return prompt
        return -(-prompt // self.pad_multiple) * self.pad_multiple


class PrefixedAttention(_Attention):
    """Global attention over `prefix` tokens the model puts before every sequence (CPM-Ant's prompt_length learned
    prompt tokens) and the sequence itself: keeps ctx + prefix tokens."""

    kind: Literal["prefixed"] = "prefixed"
    prefix: PositiveInt

    def tokens_held(self, ctx: int) -> int:
        return ctx + self.prefix


TRANSFORMERS_ONLY_KINDS = ("states", "prefixed")  # no serving engine runs a model that caches these


# Any of the kinds above, each validated as its own kind when a source builds it.
LayerCache = Annotated[_Cache, AS_BUILT]
# caches that grow with the tokens held (a compressed cache by entries, one per `ratio` tokens)
KV_KINDS = ("full", "sliding", "chunked", "mla", "indexer", "sliding_kv", "compressed", "cross",
            *TRANSFORMERS_ONLY_KINDS)
EMPTY_KINDS = ("shared", "none")  # layers that store nothing of their own


class LayerGroup(NamedTuple):
    """Layers that cache alike (equal `alike_key`s): the first one's cache and every one's index, ascending."""

    cache: LayerCache
    layers: tuple[int, ...]


T = TypeVar("T")
REMEMBERED_KEPT = 8  # entries a `remembered` memo keeps: the sources most recently asked of


def remembered(memo: dict, source: object, inputs: Hashable, compute: Callable[[], T]) -> T:
    """`compute()`, a function of `source` (immutable: a caches tuple, a frozen ModelSpec) and of `inputs` alone,
    computed once while it is among the last REMEMBERED_KEPT asked of `memo`. A search asks the same of one source for
    every layout it counts; the source is known by its identity (each entry keeps its source alive, so the id is not
    reused), not by its contents, which would cost as much to compare as to compute again. `inputs` must hold
    everything else the result is read from."""
    key = (id(source), inputs)
    kept = memo.get(key)
    if kept is not None and kept[0] is source:
        return kept[1]
    result = compute()
    if len(memo) >= REMEMBERED_KEPT:
        del memo[next(iter(memo))]
    memo[key] = (source, result)
    return result


_GROUPED: dict = {}  # `remembered` groups of layers


def layer_groups(caches: tuple[LayerCache, ...]) -> tuple[LayerGroup, ...]:
    """A model's caches (`ModelSpec.caches`, or an engine's stored form of them) as groups of alike layers, in order
    of each group's first layer; each tuple grouped once (`remembered` by the tuple itself: a ModelSpec's caches and
    an engine's stored form of them are different tuples)."""
    def grouped() -> tuple[LayerGroup, ...]:
        by_key: dict[tuple, tuple[LayerCache, list[int]]] = {}
        for cache in caches:
            key = cache.alike_key()
            if key in by_key:
                by_key[key][1].append(cache.layer)
            else:
                by_key[key] = (cache, [cache.layer])
        return tuple(LayerGroup(cache, tuple(sorted(layers))) for cache, layers in by_key.values())

    return remembered(_GROUPED, caches, None, grouped)


def distinct_caches(caches: tuple[LayerCache, ...]) -> list[LayerCache]:
    """The first cache of each group of alike layers (`layer_groups`), in order: what a question whose answer is
    the same for alike layers (any, all, the largest, the first that fails) need ask of a deep model's caches."""
    return [cache for cache, _ in layer_groups(caches)]


class ParamCounts(BaseModel):
    """Parameter counts by where they sit; quantisation applies to the linear groups (LINEAR_GROUPS). The
    `_replicated` groups are what tensor parallelism cannot split: weights of the hidden state's full width, or
    feeding a latent every head reads, which every TP rank holds whole (REPLICATED_GROUPS)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    embedding: int = Field(ge=0, description="token (and learned position) embeddings")
    lm_head: int = Field(ge=0, description="output projection; 0 when tied to the embedding")
    attention: int = Field(ge=0, description="attention / mixer projection matrices that TP splits by head")
    attention_replicated: int = Field(0, ge=0, description="attention matrices every TP rank holds whole: MLA's "
                                                           "query and KV down-projections, a DSA indexer's wq_b "
                                                           "and wk, DeepSeek V4's compressors")
    mlp: int = Field(ge=0, description="dense MLP and shared-expert matrices")
    experts: int = Field(ge=0, description="routed MoE expert matrices, all experts")
    active_experts: int = Field(ge=0, description="routed expert matrices used per token")
    other: int = Field(ge=0, description="biases, convolutions, sinks and other small tensors TP splits; the "
                                         "norms of encoders, encoder-decoders, XLNet, Reformer and CPM-Ant")
    other_replicated: int = Field(0, ge=0, description="norms, MoE routers (with their correction biases and "
                                                       "shared-expert gates), a DSA indexer's weights_proj: "
                                                       "every TP rank holds them whole, in the float dtype")
    vision: int = Field(0, ge=0, description="a multimodal checkpoint's vision tower and its projector into the "
                                             "decoder")

    @property
    def total(self) -> int:
        """Everything the checkpoint loads, the vision tower included."""
        return (self.embedding + self.lm_head + self.attention + self.attention_replicated + self.mlp
                + self.experts + self.other + self.other_replicated + self.vision)

    @property
    def active(self) -> int:
        """Parameters a text token passes through: the decoder less the routed experts not chosen (no vision
        tower), as model cards count "active" (Llama 4 Scout: 17B)."""
        return self.total - self.vision - self.experts + self.active_experts

    @property
    def tied(self) -> bool:
        return self.lm_head == 0


LINEAR_GROUPS = ("attention", "attention_replicated", "mlp", "experts")
REPLICATED_GROUPS = ("attention_replicated", "other_replicated")
WEIGHT_GROUPS = tuple(g for g in ParamCounts.model_fields if g != "active_experts")  # (a count within experts)


class Quantization(BaseModel):
    """A checkpoint's weight quantisation: which dtype, applied to which parameter groups."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    method: str
    weights_dtype: str
    groups: tuple[str, ...] = LINEAR_GROUPS


class CheckpointTensors(BaseModel):
    """The checkpoint's real tensor inventory, read from its safetensors headers or its GGUF file's header: element
    counts by the dtype each tensor is stored in. Weights are then the bytes the files hold (packed quantised
    tensors included), not a count derived from the config."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    elements: dict[str, int] = Field(description="tensor elements by stored dtype: safetensors dtypes (BF16, F16, "
                                                 "I32, U8, ...), or ggml types (Q4_K, Q6_K, F32, ...) for GGUF")
    tensors: int = Field(ge=0, description="number of tensors")
    files: int = Field(ge=1, description="files read")
    source: str = Field(description="where the headers were read")
    format: Literal["safetensors", "gguf"] = "safetensors"

    @model_validator(mode="after")
    def _known_dtypes(self) -> "CheckpointTensors":
        known = GGML_BY_NAME if self.format == "gguf" else SAFETENSORS_BITS
        for dtype, count in self.elements.items():
            if dtype not in known:
                raise ValueError(f"unknown {self.format} dtype {dtype!r}")
            if count < 0:
                raise ValueError(f"negative element count for {dtype}")
        return self

    @property
    def total(self) -> int:
        """All elements (for packed quantised tensors, fewer than the parameters they hold)."""
        return sum(self.elements.values())


class Widths(BaseModel):
    """The per-token widths a forward pass works in, where layers differ the widest: what a prefill's
    activations are made of. An engine that runs the whole prompt in one pass (transformers) needs memory for
    them in proportion to batch x prompt tokens; see `kvplan.engines.Transformers`."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    hidden: PositiveInt = Field(description="the residual stream (hidden_size)")
    mlp_intermediate: int = Field(0, ge=0, description="the widest dense MLP or shared-expert intermediate; "
                                                       "0 when every layer routes to experts")
    gated_mlp: bool = Field(True, description="gate and up projections (SwiGLU, GeGLU) rather than up alone")
    mlp_activation: str = Field("silu", description="the MLP's activation function (hidden_act)")
    experts_per_token: int = Field(0, ge=0, description="routed experts per token (top-k); 0 without MoE")
    experts: int = Field(0, ge=0, description="routed experts per MoE layer (what expert parallelism divides); 0 "
                                              "without MoE")
    expert_intermediate: int = Field(0, ge=0, description="one routed expert's intermediate size")
    query_head_dim: int = Field(0, ge=0, description="a query (and key) head's width where attention works in "
                                "other widths than it caches: MLA's qk_nope + qk_rope; 0: the cached head_dim")
    value_head_dim: int = Field(0, ge=0, description="the value head's width there: MLA's v_head_dim; 0: the "
                                "cached head_dim_v")
    shared_expert_intermediate: int = Field(0, ge=0, description="the shared experts' intermediate, all of them "
                                            "as one MLP; 0 without")
    dense_layers: tuple[int, ...] = Field((), description="the layers of an MoE model that keep a dense MLP, "
                                          "mlp_intermediate wide")
    query_rank: int = Field(0, ge=0, description="MLA's query down-projection rank (q_lora_rank); 0: q projected "
                                                 "whole")
    expert_groups: int = Field(1, ge=1, description="the groups a router limits a token's experts to (n_group, "
                                                    "group-limited top-k); 1: none")
    query_key_norm: bool = Field(False, description="attention normalises queries and keys (RMSNorm per head or "
                                                 "over all heads: Qwen3's q_norm and k_norm)")
    attention_gate: bool = Field(False, description="attention's output is gated from the hidden state (Qwen3-Next's "
                                                 "sigmoid gate)")
    shared_expert_gate: bool = Field(False, description="the shared expert's output is scaled by a learned sigmoid "
                                                     "gate (Qwen MoE's shared_expert_gate)")


class MultimodalInput(BaseModel):
    """What a multimodal checkpoint takes besides text, as a serving engine's encoder budget sees it: its
    modalities, those its counted vision tower encodes, and the most decoder embedding rows one item becomes at
    the processor's defaults (None where kvplan does not know them)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    modalities: tuple[str, ...] = Field(description="inputs besides text: image, video, audio")
    tower_modalities: tuple[str, ...] = Field(description="the modalities the vision tower in params.vision "
                                                          "encodes")
    tokens_per_item: int | None = Field(None, gt=0, description="embedding rows of the largest item (of "
                                        "`item_modality`), each text hidden_size wide")
    item_modality: str | None = None
    embedding_width: PositiveInt = Field(description="the width of an embedding row: the decoder's hidden size")
    basis: str = Field("", description="how tokens_per_item was counted, for notes")
class MtpLayers(BaseModel):
    """The multi-token-prediction layers a checkpoint ships beside its decoder (DeepSeek-V3
    `num_nextn_predict_layers`, Qwen3.5 `mtp_num_hidden_layers`): not part of the served model's `params` and
    `caches`, they are what a speculative decoder runs as its draft (vLLM `--speculative-config '{"method":
    "mtp"}'`, SGLang `--speculative-algorithm NEXTN`). `params` are their own weights (decoder layers, fusion
    projection and norms); the embeddings and the output head they read are the model's (vLLM and SGLang share
    them), so those groups are 0. `caches` are their layers' caches, numbered after the model's layers."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    layers: PositiveInt
    caches: tuple[LayerCache, ...]
    params: Annotated[ParamCounts, AS_BUILT]


class EagleHead(BaseModel):
    """What an EAGLE draft head's config.json states beyond its Llama decoder layers (the model's `caches` and
    `params` read as a Llama decoder of num_hidden_layers layers): a speculative decoder builds the head from these
    with a fused input projection `fc` and, for EAGLE-3, a draft vocabulary of its own (vLLM's llama_eagle.py and
    llama_eagle3.py, SGLang's alike; `kvplan.engines`). None where the config does not state the field."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    architecture: str = Field(description="the class the config names (LlamaForCausalLMEagle3, LlamaForCausalLM, ...)")
    draft_vocab_size: PositiveInt | None = Field(None, description="rows of an EAGLE-3 head's own lm_head")
    target_hidden_size: PositiveInt | None = Field(None, description="the width of the model hidden states it reads")
    aux_hidden_states: PositiveInt | None = Field(None, description="model hidden states an EAGLE-3 fc fuses "
                                                  "(num_aux_hidden_states, or eagle_config's layer ids)")
    use_aux_hidden_state: bool = Field(True, description="eagle_config.use_aux_hidden_state: False drops fc")
    norm_before_fc: bool = False
    fc_norm: bool = False
    use_aux_norm: bool = Field(False, description="SGLang's older name for fc_norm")
    bias: bool = Field(False, description="the config's `bias` (vLLM reads it as attention bias)")


class LoraAdapter(BaseModel):
    """A LoRA adapter file as llama.cpp loads it (`--lora`, a GGUF of general.type adapter): each changed tensor's A
    and B, in the types the file stores. llama.cpp puts each pair in the buffer of the tensor it changes, so the
    token embeddings' pair stays in host memory with them; norm vectors it skips."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    architecture: str = Field(description="the adapter's general.architecture, which must be the model's")
    rank: PositiveInt = Field(description="the largest rank of its pairs")
    pairs: PositiveInt
    device_bytes: int = Field(ge=0, description="bytes of the pairs beside tensors on the GPU")
    host_bytes: int = Field(ge=0, description="bytes of the token embeddings' pair, in host memory")


class ModelSpec(BaseModel):
    """What kvplan knows of a model: its caches layer by layer, its parameters, dtypes and limits."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    architecture: str = Field(description="the config's model_type")
    num_layers: PositiveInt
    num_attention_heads: int = Field(ge=0, description="query heads of the attention layers; 0 for a model "
                                                       "without attention (Mamba, Mamba-2)")
    caches: tuple[LayerCache, ...]
    params: Annotated[ParamCounts, AS_BUILT]
    dtype: str = Field(description="the checkpoint's float dtype (fp32, bf16, fp16)")
    quantization: Annotated[Quantization, AS_BUILT] | None = None
    kv_dtype: str | None = Field(None, description="KV cache dtype the checkpoint asks for, if any")
    max_context: PositiveInt | None = None
    source: str = ""
    notes: tuple[str, ...] = ()
    widths: Annotated[Widths, AS_BUILT] | None = Field(
        None, description="per-token forward widths, for activation memory; None where the source does not say")
    checkpoint: Annotated[CheckpointTensors, AS_BUILT] | None = Field(
        None, description="the tensor inventory, when kvplan could read it (safetensors of Hub repos and local dirs, "
                          "GGUF files)")
    multimodal: Annotated[MultimodalInput, AS_BUILT] | None = Field(
        None, description="a multimodal checkpoint's non-text inputs")
    vocab_size: PositiveInt | None = Field(None, description="tokens in the vocabulary (a decoder config's "
                                                            "vocab_size), where the source states it")
    mtp: Annotated[MtpLayers, AS_BUILT] | None = Field(
        None, description="the checkpoint's multi-token-prediction layers, where kvplan reads them (a speculative "
                          "decoder's draft)")
    eagle: Annotated[EagleHead, AS_BUILT] | None = Field(
        None, description="an EAGLE draft head's own fields, where the config states it is one: such a model is a "
                          "draft, not a model to serve")


# ------------------------------------------------------------------ what a model is planned for: GPU, layout, users


class Hardware(BaseModel):
    """The GPU: its catalogue name (None for --vram) and the memory it may use; nothing with --kv-budget."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str | None = None
    memory_bytes: int | None = None


class Parallelism(BaseModel):
    """A layout: `replicas` independent copies, each `dp` data-parallel attention ranks of `tp` x `pp` GPUs (tp:
    the attention tensor parallelism of one rank), the routed experts over the dp x tp GPUs of a stage, whole on
    `ep` expert-parallel ranks (1: sliced by TP)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    replicas: int = 1
    from_gpus: bool = Field(False, description="TP or PP taken from --gpus, not given")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.replicas

    @property
    def ranks(self) -> int:
        """The KV pools that serve users on their own: DP ranks x replicas."""
        return self.dp * self.replicas


class Workload(BaseModel):
    """Users each holding ctx tokens (prompt plus output); avg_ctx: their mean length; shared_prefix: the
    tokens of a system prompt every user starts with, cached once by prefix caching; isl and osl: the prompt and
    output tokens of each request, which the speed model times (`kvplan.speed`), at most ctx together (memory is
    planned for what a user may hold, speed for the requests)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    ctx: int
    users: int | None = None
    avg_ctx: int | None = None
    shared_prefix: int = 0
    isl: int | None = None
    osl: int | None = None

    @property
    def target(self) -> int:
        return self.users or 1
