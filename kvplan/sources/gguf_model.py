"""A GGUF file's metadata and tensors -> ModelSpec, with the layer caches llama.cpp builds for it.

llama.cpp (0c1e57098b, the release `kvplan.engines.LlamaCpp` follows) reads the hyperparameters in
src/llama-model.cpp `load_hparams` (the keys every architecture shares) and src/models/<arch>.cpp
`load_arch_hparams` (the rest), named as src/llama-arch.cpp names them (`<arch>.attention.head_count_kv`), and
builds the cache in `llama_model::create_memory`:
- attention layers cache K rows of n_head_kv(il) x key_length and V rows of n_head_kv(il) x value_length
  (`llama_kv_cache`); sliding-window layers (`is_swa(il)`) use the `_swa` head sizes and keep n_swa tokens;
  head counts are one value or one per layer; the head sizes default to embedding_length / head_count(0);
- MLA (deepseek2 with `attention.key_length_mla`): one K row of key_length (kv_lora_rank + rope dims) for the
  single KV head, and no V;
- recurrent layers (`llama_memory_recurrent`) keep r = (ssm.conv_kernel - 1) x (ssm.inner_size + 2 x
  ssm.group_count x ssm.state_size) and s = ssm.state_size x ssm.inner_size values in f32 (LFM2's short
  convolutions: r = embedding_length x (shortconv.l_cache - 1), `llama_hparams::n_embd_r/n_embd_s`);
- Gemma 3n and Gemma 4 keep KV on the first n_layer_kv_from_start layers (Gemma 3n: 20, whatever the file says;
  Gemma 4: block_count - attention.shared_kv_layers); the others reuse the cache of one of the last two;
- Kimi Linear's KDA layers and MiniMax-01's lightning-attention layers keep a recurrent state (`n_embd_r`,
  `n_embd_s`), their other layers MLA (Kimi) or plain attention;
- NextN/MTP layers (`nextn_predict_layers`, the last ones) get no cache in the main context.
The forward widths (for the compute buffer) are read from the tensors (`forward_widths`); every width, row and
state is bounded by the values the tensors hold (`check_sizes`).
Only the architectures below are mapped, each from its `load_arch_hparams`; any other is refused in one line.
Parameter counts come from the tensors themselves (`param_counts`), the weights from their bytes.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.model import (
    CheckpointTensors,
    ChunkedAttention,
    FullAttention,
    LoraAdapter,
    MLALatent,
    ModelSpec,
    NoCache,
    ParamCounts,
    Quantization,
    RecurrentState,
    SharedKV,
    SlidingWindow,
    Widths,
)
from kvplan.sources import gguf
from kvplan.text import brief

LLAMA_CPP = "0c1e57098b"
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
U32 = 2**32
# `general.file_type` (`enum llama_ftype`, include/llama.h), named as llama-quantize names the types.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M",
    13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS",
    21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4",
    40: "Q1_0", 41: "Q2_0",
}
FLOAT_FILE_TYPES = {"F32": "fp32", "BF16": "bf16"}  # the rest compute and cache in f16 (llama.cpp's KV default)
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")  # llama_split_path


@dataclass
class HParams:
    """What `load_hparams` and an architecture's `load_arch_hparams` leave in `llama_hparams`, for the cache."""

    arch: str
    n_layer_all: int
    n_nextn: int
    n_embd: int
    n_ctx: int
    n_head: list[int]
    n_head_kv: list[int]
    n_ff: list[int]
    head_k: int
    head_v: int
    head_k_swa: int
    head_v_swa: int
    n_expert: int
    n_expert_used: list[int]
    swa: list[bool] = field(default_factory=list)
    n_swa: int = 0
    chunked: bool = False  # LLAMA_SWA_TYPE_CHUNKED (Llama 4)
    recurrent: list[bool] = field(default_factory=list)
    memory: str = "kv"  # "kv", "recurrent" or "hybrid" (`llm_arch_is_recurrent` / `llm_arch_is_hybrid`)
    mixer: str = ""
    conv_kernel: int = 0
    inner: int = 0
    state: int = 0
    groups: int = 0
    dt_rank: int = 0
    shortconv_cache: int = 0
    kv_lora_rank: int = 0  # MLA: the latent's width, when the file has the MLA head sizes
    mla_key: int = 0  # MLA: a decompressed query and key head's width (key_length_mla)
    mla_value: int = 0  # and a value head's (value_length_mla)
    q_lora_rank: int = 0  # MLA: the query's down-projection rank (attention.q_lora_rank); 0: q projected whole
    expert_groups: int = 1  # the groups the router picks a token's experts from (expert_group_count)
    kv_from_start: int | None = None  # Gemma 3n / 4: layers from this one on reuse an earlier layer's KV
    head_kda: int = 0  # Kimi Linear's KDA head size
    head_la: int = 0  # MiniMax-01's lightning-attention head size
    attention_filter: Callable[[int], bool] | None = None  # hybrids: the layers with a KV cache
    recurrent_filter: Callable[[int], bool] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def n_layer(self) -> int:
        """Layers of the trunk, without the NextN/MTP ones (`llama_hparams::n_layer`)."""
        return self.n_layer_all - self.n_nextn

    def set_swa_pattern(self, n_pattern: int) -> None:
        """`llama_hparams::set_swa_pattern` (dense_first false): every n_pattern-th layer dense, the rest sliding;
        n_pattern 0 makes every layer sliding."""
        self.swa = [il < self.n_layer and (n_pattern == 0 or il % n_pattern < n_pattern - 1)
                    for il in range(self.n_layer_all)]


class Meta:
    """Typed reads of a GGUF's metadata, as `llama_model_loader::get_key` / `get_key_or_arr` / `get_arr` make
    them: a u32 field must be an integer value, an array must be one of integers as long as the layers."""

    def __init__(self, header: gguf.Header, where: str, arch: str = "") -> None:
        self.values, self.where, self.arch = header.metadata, where, arch

    @classmethod
    def of_model(cls, header: gguf.Header, where: str) -> Meta:
        """The metadata of a model's (first) file, whose keys are prefixed with its `general.architecture`."""
        arch = header.metadata.get("general.architecture")
        if arch is None or arch.type != gguf.STRING:
            raise KvplanError(f"{where}: no general.architecture (a string): not a model GGUF")
        return cls(header, where, arch.value)

    def fail(self, key: str, problem: str) -> KvplanError:
        return KvplanError(f"{self.where}: {key} {problem}")

    def key(self, name: str) -> str:
        return name if name.startswith(("general.", "split.")) else f"{self.arch}.{name}"

    def has(self, name: str) -> bool:
        return self.key(name) in self.values

    def uint(self, name: str, default: int | None = None) -> int:
        key = self.key(name)
        value = self.values.get(key)
        if value is None:
            if default is None:
                raise self.fail(key, f"is missing: llama.cpp needs it for {brief(self.arch)} models")
            return default
        if value.element_type is not None or value.type not in gguf.INTEGERS or not 0 <= value.value < U32:
            shown = f"an {value.type_name}" if value.element_type is not None else \
                f"{value.type_name} {brief(value.value)}"
            raise self.fail(key, f"is {shown}, not a whole number below 2^32")
        return value.value

    def positive(self, name: str) -> int:
        """A required width that must be at least 1."""
        value = self.uint(name)
        if not value:
            raise self.fail(self.key(name), f"is 0: a {brief(self.arch)} model needs at least 1")
        return value

    def per_layer(self, name: str, n: int, default: int | list[int]) -> list[int]:
        """One value per layer: the key's array (n long), or its one value repeated, else `default`."""
        key = self.key(name)
        value = self.values.get(key)
        if value is None:
            return list(default) if isinstance(default, list) else [default] * n
        if value.element_type is None:
            return [self.uint(name)] * n
        if value.length != n:
            raise self.fail(key, f"has {value.length:,} values for {n} layers")
        return self.items(key, value)

    def flags(self, name: str) -> list[int] | None:
        """An array of per-layer flags or counts (`get_arr`: bool, u32 or i32 items), at most MAX_LAYERS long."""
        key = self.key(name)
        value = self.values.get(key)
        if value is None or value.element_type is None:
            return None
        if value.length > MAX_LAYERS:
            raise self.fail(key, f"has {value.length:,} values; llama.cpp allows {MAX_LAYERS}")
        return self.items(key, value)

    def items(self, key: str, value: gguf.Value) -> list[int]:
        if value.element_type not in (gguf.BOOL, 4, 5) or value.items is None:
            raise self.fail(key, f"is an {value.type_name}, not of bool, u32 or i32 per layer")
        if any(item < 0 for item in value.items):
            raise self.fail(key, "has a negative value")
        return [int(item) for item in value.items]


def hparams(meta: Meta) -> HParams:
    """`llama_model_base::load_hparams`: the keys every architecture shares."""
    n = meta.uint("block_count")
    if not 1 <= n <= MAX_LAYERS:
        raise meta.fail(meta.key("block_count"), f"is {n:,}; llama.cpp loads 1 to {MAX_LAYERS} layers")
    nextn = meta.uint("nextn_predict_layers", 0)
    if nextn > n:
        raise meta.fail(meta.key("nextn_predict_layers"), f"is {nextn:,}, more than the {n} layers")
    if nextn == n:  # llama.cpp then caches them all (`create_memory`), for the MTP context that drafts with them
        raise meta.fail(meta.key("nextn_predict_layers"), f"is {nextn:,}, every layer: the file is a NextN/MTP "
                        "draft head with no trunk, not a model to serve")
    n_embd = meta.uint("embedding_length")
    n_head = meta.per_layer("attention.head_count", n, 0)
    n_head_kv = meta.per_layer("attention.head_count_kv", n, n_head)
    head_k = head_v = 0
    if n_head[0]:  # "non-transformer models do not have attention heads"
        head_k = meta.uint("attention.key_length", n_embd // n_head[0])
        head_v = meta.uint("attention.value_length", n_embd // n_head[0])
    n_expert = meta.uint("expert_count", 0)
    used = meta.per_layer("expert_used_count", n, 0)
    if max(used) > n_expert:
        raise meta.fail(meta.key("expert_used_count"), f"routes {max(used)} experts of {n_expert}")
    return HParams(
        arch=meta.arch, n_layer_all=n, n_nextn=nextn, n_embd=n_embd, n_ctx=meta.uint("context_length"),
        n_head=n_head, n_head_kv=n_head_kv, n_ff=meta.per_layer("feed_forward_length", n, 0),
        head_k=head_k, head_v=head_v, head_k_swa=meta.uint("attention.key_length_swa", head_k),
        head_v_swa=meta.uint("attention.value_length_swa", head_v), n_expert=n_expert, n_expert_used=used,
        swa=[False] * n, recurrent=[False] * n, q_lora_rank=meta.uint("attention.q_lora_rank", 0),
        expert_groups=meta.uint("expert_group_count", 0) or 1)


# ------------------------------------------------------------------------------- per architecture (load_arch_hparams)


def load_swa_pattern(meta: Meta, hp: HParams, n_pattern: int) -> None:
    """`llama_model_base::load_swa_pattern`: `attention.sliding_window_pattern` as one flag per layer, or as
    n_pattern (every n-th layer dense), else the architecture's default n_pattern."""
    flags = meta.flags("attention.sliding_window_pattern")
    if flags is not None:  # any length up to LLAMA_MAX_LAYERS; the layers it leaves out are dense
        hp.swa = [bool(f) for f in flags + [0] * hp.n_layer_all][:hp.n_layer_all]
        return
    hp.set_swa_pattern(meta.uint("attention.sliding_window_pattern", n_pattern))


def plain(meta: Meta, hp: HParams) -> None:
    """Full attention on every layer (their `load_arch_hparams` read no window)."""


def phi3(meta: Meta, hp: HParams) -> None:
    """llama.cpp runs Phi-3 without its sliding window (`llama_model_phi3`: n_swa = 0, pattern 1)."""
    if meta.uint("attention.sliding_window", 0):
        hp.notes.append("llama.cpp runs phi3 without its sliding window: every layer caches the whole context")


def gemma2(meta: Meta, hp: HParams) -> None:
    """Sliding window (default 4096) on every other layer, from the first (pattern 2)."""
    hp.n_swa = meta.uint("attention.sliding_window", 4096)
    load_swa_pattern(meta, hp, 2)


def gemma3(meta: Meta, hp: HParams) -> None:
    """With a sliding window: 5 sliding layers, then a full one (pattern 6); without one, every layer full."""
    hp.n_swa = meta.uint("attention.sliding_window", 0)
    if hp.n_swa:
        load_swa_pattern(meta, hp, 6)


def sliding(n_pattern: int, required: bool) -> Callable[[Meta, HParams], None]:
    """A window (required, or only when set and non-zero) with a default pattern: gpt-oss 2, Cohere 2 and OLMo 2
    4."""
    def rule(meta: Meta, hp: HParams) -> None:
        hp.n_swa = meta.uint("attention.sliding_window") if required else meta.uint("attention.sliding_window", 0)
        if hp.n_swa:
            load_swa_pattern(meta, hp, n_pattern)
    rule.__doc__ = f"Sliding window ({'required' if required else 'when set'}), default pattern {n_pattern}."
    return rule


def llama4(meta: Meta, hp: HParams) -> None:
    """Chunked attention of 8192 tokens on 3 layers of 4, unless `attention.sliding_window` is 0."""
    if meta.has("attention.sliding_window") and meta.uint("attention.sliding_window") == 0:
        return
    hp.n_swa, hp.chunked = 8192, True
    load_swa_pattern(meta, hp, 4)


def deepseek2(meta: Meta, hp: HParams) -> None:
    """MLA: the latent (kv_lora_rank) plus the rope part cached as one K row, when the file was converted with
    `attention.key_length_mla` and `value_length_mla`; an older file caches each head's K and V."""
    hp.kv_lora_rank = meta.uint("attention.kv_lora_rank")
    hp.mla_key, hp.mla_value = meta.uint("attention.key_length_mla", 0), meta.uint("attention.value_length_mla", 0)
    if hp.mla_key and hp.mla_value:
        return
    hp.kv_lora_rank = 0
    hp.notes.append("converted before llama.cpp cached the MLA latent (no attention.key_length_mla): llama.cpp "
                    "caches every head's K and V, many times the latent")


def ssm(meta: Meta, hp: HParams, mixer: str, groups: bool) -> None:
    """The SSM widths (`load_arch_hparams`: ssm.conv_kernel, inner_size, state_size, time_step_rank and, with
    groups, group_count), each at least 1: a layer of no channels holds no state and computes nothing."""
    hp.mixer = mixer
    hp.conv_kernel, hp.inner, hp.state, hp.dt_rank = (
        meta.positive(f"ssm.{name}") for name in ("conv_kernel", "inner_size", "state_size", "time_step_rank"))
    hp.groups = meta.positive("ssm.group_count") if groups else 0


def mamba(meta: Meta, hp: HParams) -> None:
    """Mamba: a selective-scan state in every layer (`llm_arch_is_recurrent`)."""
    hp.memory = "recurrent"
    ssm(meta, hp, "mamba", groups=False)
    hp.recurrent = [True] * hp.n_layer_all


def mamba2(meta: Meta, hp: HParams) -> None:
    hp.memory = "recurrent"
    ssm(meta, hp, "mamba2", groups=True)
    hp.recurrent = [True] * hp.n_layer_all


def no_kv_heads_recurrent(mixer: str, groups: bool) -> Callable[[Meta, HParams], None]:
    """Jamba, Granite 4 hybrids: a layer with no KV heads (head_count_kv 0) is a Mamba layer."""
    def rule(meta: Meta, hp: HParams) -> None:
        hp.memory = "hybrid"
        ssm(meta, hp, mixer, groups)
        hp.recurrent = [il < hp.n_layer and hp.n_head_kv[il] == 0 for il in range(hp.n_layer_all)]
    rule.__doc__ = f"A layer without KV heads is a {mixer} layer; the others attention."
    return rule


def nemotron_h(meta: Meta, hp: HParams) -> None:
    """Mamba-2 where head_count_kv and feed_forward_length are both 0, attention where only the FFN length is 0,
    and an MLP alone (no cache) elsewhere (the hybrid's filters in `create_memory`)."""
    hp.memory = "hybrid"
    ssm(meta, hp, "mamba2", groups=True)
    hp.recurrent = [il < hp.n_layer and hp.n_head_kv[il] == 0 and hp.n_ff[il] == 0 for il in range(hp.n_layer_all)]
    hp.attention_filter = lambda il: not hp.recurrent[il] and hp.n_ff[il] == 0
    hp.recurrent_filter = lambda il: hp.recurrent[il] and hp.n_ff[il] == 0


def falcon_h1(meta: Meta, hp: HParams) -> None:
    """Attention and a Mamba-2 mixer side by side in every layer."""
    hp.memory = "hybrid"
    ssm(meta, hp, "mamba2", groups=True)
    hp.recurrent = [True] * hp.n_layer_all
    hp.attention_filter = hp.recurrent_filter = lambda il: True


def load_recurrent_layers(meta: Meta, hp: HParams, interval: int) -> None:
    """The recurrent layers: those `attention.recurrent_layers` marks, else all trunk layers but every
    `full_attention_interval`-th (default `interval`)."""
    if meta.has("attention.recurrent_layers"):
        hp.recurrent = [bool(f) for f in meta.per_layer("attention.recurrent_layers", hp.n_layer_all, 0)]
        return
    interval = meta.uint("full_attention_interval", interval)
    if not interval:
        raise meta.fail(meta.key("full_attention_interval"), "is 0")
    hp.recurrent = [il < hp.n_layer and (il + 1) % interval != 0 for il in range(hp.n_layer_all)]


def qwen3next(meta: Meta, hp: HParams) -> None:
    """Gated DeltaNet layers (`attention.recurrent_layers`, else all but every full_attention_interval-th,
    default 4) and attention elsewhere; NextN layers neither."""
    hp.memory = "hybrid"
    ssm(meta, hp, "gated_deltanet", groups=True)
    load_recurrent_layers(meta, hp, 4)
    hp.attention_filter = lambda il: il < hp.n_layer and not hp.recurrent[il]
    hp.recurrent_filter = lambda il: il < hp.n_layer and hp.recurrent[il]


def gemma3n(meta: Meta, hp: HParams) -> None:
    """Sliding window (required), default pattern 5; the first 20 layers have a KV cache and the rest reuse one
    of layers 18 (sliding) and 19 (full), whatever the file's attention.shared_kv_layers says
    (`llama_model_gemma3n::load_arch_hparams`: n_layer_kv_from_start = 20, as in Gemma 3n E2B and E4B)."""
    hp.n_swa = meta.uint("attention.sliding_window")
    load_swa_pattern(meta, hp, 5)
    hp.kv_from_start = 20
    if meta.has("attention.shared_kv_layers") and hp.n_layer_all > 20 \
            and meta.uint("attention.shared_kv_layers") != hp.n_layer_all - 20:
        hp.notes.append(f"llama.cpp caches the first 20 layers of a gemma3n model whatever its "
                        f"attention.shared_kv_layers ({meta.uint('attention.shared_kv_layers')}) says: "
                        f"{hp.n_layer_all - 20} layers reuse layer 18's or 19's KV")


def gemma4(meta: Meta, hp: HParams) -> None:
    """Sliding window (required) on the layers `attention.sliding_window_pattern` (a required array) marks, with
    the `_swa` head sizes (required); the last attention.shared_kv_layers layers reuse a KV cache, sliding ones
    the one of layer n - shared - 2, full ones of n - shared - 1 (`llama_model_gemma4::load_arch_hparams`;
    `create_memory`, which asserts that at least 2 layers keep their own)."""
    hp.n_swa = meta.uint("attention.sliding_window")
    flags = meta.flags("attention.sliding_window_pattern")
    if flags is None:
        raise meta.fail(meta.key("attention.sliding_window_pattern"), "is missing (one flag per layer): llama.cpp "
                        "needs it for gemma4 models")
    hp.swa = [bool(f) for f in flags + [0] * hp.n_layer_all][:hp.n_layer_all]
    hp.head_k_swa = meta.uint("attention.key_length_swa")
    hp.head_v_swa = meta.uint("attention.value_length_swa")
    shared = meta.uint("attention.shared_kv_layers", 0)
    if shared > hp.n_layer_all - 2:
        raise meta.fail(meta.key("attention.shared_kv_layers"), f"is {shared:,} of {hp.n_layer_all} layers: "
                        "llama.cpp needs 2 layers that keep their own KV (it aborts making the cache)")
    hp.kv_from_start = hp.n_layer_all - shared


def kimi_linear(meta: Meta, hp: HParams) -> None:
    """KDA layers where head_count_kv is 0, MLA elsewhere (the latent, kv_lora_rank, and its RoPE part as one K
    row; key_length_mla and value_length_mla are required). A KDA layer keeps r = 3 x (ssm.conv_kernel - 1) x
    head_count x kda.head_dim convolution values and s = kda.head_dim^2 x head_count of state
    (`llama_hparams::n_embd_r/n_embd_s`)."""
    hp.memory, hp.mixer = "hybrid", "kda"
    hp.kv_lora_rank = meta.uint("attention.kv_lora_rank")
    hp.mla_key = meta.positive("attention.key_length_mla")
    hp.mla_value = meta.positive("attention.value_length_mla")
    hp.conv_kernel = meta.positive("ssm.conv_kernel")
    hp.head_kda = meta.positive("kda.head_dim")
    hp.recurrent = [il < hp.n_layer and hp.n_head_kv[il] == 0 for il in range(hp.n_layer_all)]


def minimax01(meta: Meta, hp: HParams) -> None:
    """Lightning (linear) attention on the layers `attention.recurrent_layers` marks, else all but every
    full_attention_interval-th (default 8); softmax attention elsewhere. A lightning layer keeps key_length^2 x
    head_count values of state and no convolution (`llama_model_minimax_01`, `n_embd_s`)."""
    hp.memory, hp.mixer = "hybrid", "lightning"
    hp.head_la = hp.head_k
    load_recurrent_layers(meta, hp, 8)


def lfm2(meta: Meta, hp: HParams) -> None:
    """Short convolutions where head_count_kv is 0, attention elsewhere (sliding when a window is set)."""
    hp.memory, hp.mixer = "hybrid", "short_conv"
    hp.shortconv_cache = meta.positive("shortconv.l_cache")
    hp.recurrent = [il < hp.n_layer and hp.n_head_kv[il] == 0 for il in range(hp.n_layer_all)]
    hp.n_swa = meta.uint("attention.sliding_window", 0)
    if hp.n_swa:
        hp.swa = [il < hp.n_layer and not hp.recurrent[il] for il in range(hp.n_layer_all)]


ARCHITECTURES: dict[str, Callable[[Meta, HParams], None]] = {
    **dict.fromkeys(("llama", "mistral3", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma", "starcoder2",
                     "command-r", "granite", "granitemoe", "glm4", "glm4moe", "smollm3"), plain),
    "phi3": phi3,
    "gemma2": gemma2,
    "gemma3": gemma3,
    "gemma3n": gemma3n,
    "gemma4": gemma4,
    "kimi-linear": kimi_linear,
    "minimax-01": minimax01,
    "gpt-oss": sliding(2, required=True),
    "cohere2": sliding(4, required=True),
    "olmo2": sliding(4, required=False),
    "llama4": llama4,
    "deepseek2": deepseek2,
    "mamba": mamba,
    "mamba2": mamba2,
    "jamba": no_kv_heads_recurrent("mamba", groups=False),
    "granitehybrid": no_kv_heads_recurrent("mamba2", groups=True),
    "nemotron_h": nemotron_h,
    "falcon-h1": falcon_h1,
    **dict.fromkeys(("qwen3next", "qwen35", "qwen35moe"), qwen3next),
    **dict.fromkeys(("lfm2", "lfm2moe"), lfm2),
}


# The Hugging Face model_type of each GGUF architecture, as llama.cpp's convert_hf_to_gguf.py registers the
# transformers classes it converts (`ModelBase.register`), so that a GGUF model meets the same family rules as its
# config.json (ModelSpec.architecture is a model_type); the ones not listed are spelt alike.
MODEL_TYPES = {"gpt-oss": "gpt_oss", "gemma3": "gemma3_text", "gemma3n": "gemma3n_text", "gemma4": "gemma4_text",
               "kimi-linear": "kimi_linear", "minimax-01": "minimax", "llama4": "llama4_text",
               "deepseek2": "deepseek_v2", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe",
               "qwen3next": "qwen3_next", "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text",
               "glm4moe": "glm4_moe", "command-r": "cohere", "granitehybrid": "granitemoehybrid",
               "falcon-h1": "falcon_h1", "lfm2moe": "lfm2_moe"}


# ------------------------------------------------------------------------------------------------ caches


def caches(hp: HParams, where: str) -> list:
    """Each layer's caches, as `create_memory` builds them for the architecture's memory kind."""
    trunk_only = hp.n_nextn > 0 and hp.n_layer > 0

    def attention(il: int) -> bool:
        if hp.memory == "recurrent":
            return False
        if hp.memory == "hybrid":
            return hp.attention_filter(il) if hp.attention_filter else not hp.recurrent[il]
        return not (trunk_only and il >= hp.n_layer)

    def recurrent(il: int) -> bool:
        if hp.memory == "kv":
            return False
        return hp.recurrent_filter(il) if hp.recurrent_filter else hp.recurrent[il]

    out = []
    for il in range(hp.n_layer_all):
        layer = []
        if attention(il) and hp.kv_from_start is not None and il >= hp.kv_from_start:
            layer.append(SharedKV(layer=il, source=hp.kv_from_start - (2 if hp.swa[il] else 1)))
        elif attention(il):
            layer.append(attention_cache(hp, il, where))
        if recurrent(il):
            layer.append(recurrent_state(hp, il))
        if not layer:
            reason = ("NextN/MTP layer: llama.cpp caches it only in a draft context" if il >= hp.n_layer
                      else "MLP-only layer")
            layer.append(NoCache(layer=il, reason=reason))
        out += layer
    return out


def attention_cache(hp: HParams, il: int, where: str):
    heads = hp.n_head_kv[il]
    swa = hp.swa[il]
    head_k, head_v = (hp.head_k_swa, hp.head_v_swa) if swa else (hp.head_k, hp.head_v)
    if not heads or not head_k or not head_v:
        raise KvplanError(f"{where}: layer {il} is an attention layer with {heads} KV heads of {head_k}+{head_v} "
                          "elements: no cache llama.cpp can build")
    if hp.kv_lora_rank:
        width = heads * head_k
        if width < hp.kv_lora_rank:
            raise KvplanError(f"{where}: {hp.arch}.attention.key_length {head_k} is narrower than kv_lora_rank "
                              f"{hp.kv_lora_rank}")
        return MLALatent(layer=il, latent_dim=hp.kv_lora_rank, rope_dim=width - hp.kv_lora_rank)
    shape = {"layer": il, "kv_heads": heads, "head_dim": head_k, "head_dim_v": head_v}
    if not swa:
        return FullAttention(**shape)
    if not hp.n_swa:
        raise KvplanError(f"{where}: layer {il} is a sliding-window layer but {hp.arch}.attention.sliding_window "
                          "is 0")
    return ChunkedAttention(**shape, chunk=hp.n_swa) if hp.chunked else SlidingWindow(**shape, window=hp.n_swa)


def recurrent_state(hp: HParams, il: int) -> RecurrentState:
    """llama.cpp's r and s rows for one sequence, both f32 (`llama_hparams::n_embd_r`, `n_embd_s`)."""
    if hp.mixer == "short_conv":
        return RecurrentState(layer=il, mixer="short_conv", conv_elements=hp.n_embd * (hp.shortconv_cache - 1),
                              ssm_elements=0, conv_dtype="fp32", ssm_dtype="fp32",
                              conv_kernel=hp.shortconv_cache if hp.shortconv_cache > 1 else None)
    if hp.mixer == "kda":
        channels = hp.n_head[0] * hp.head_kda
        return RecurrentState(layer=il, mixer="kda", conv_elements=3 * (hp.conv_kernel - 1) * channels,
                              ssm_elements=hp.head_kda * channels, conv_dtype="fp32", ssm_dtype="fp32",
                              conv_kernel=hp.conv_kernel if hp.conv_kernel > 1 else None)
    if hp.mixer == "lightning":
        return RecurrentState(layer=il, mixer="lightning", conv_elements=0,
                              ssm_elements=hp.head_la * hp.head_la * hp.n_head[0], conv_dtype="fp32",
                              ssm_dtype="fp32")
    conv = max(hp.conv_kernel - 1, 0) * (hp.inner + 2 * hp.groups * hp.state)
    mamba2 = hp.mixer == "mamba2"
    return RecurrentState(layer=il, mixer=hp.mixer, conv_elements=conv, ssm_elements=hp.state * hp.inner,
                          conv_dtype="fp32", ssm_dtype="fp32",
                          conv_kernel=hp.conv_kernel if hp.conv_kernel > 1 else None,
                          heads=hp.dt_rank if hp.mixer != "mamba" and hp.dt_rank else None,
                          groups=hp.groups if mamba2 and hp.groups else None,
                          state_size=hp.state if hp.mixer in ("mamba2", "gated_deltanet") and hp.state else None)


def forward_widths(hp: HParams, tensors: list[gguf.Tensor]) -> Widths:
    """The widths llama.cpp's graph works in, from the tensors it loads (src/llama-arch.cpp names, ggml order):
    n_embd; the widest dense MLP or shared expert, ffn_down(_shexp) [n_ff, n_embd] (its row: a fused gate_up,
    Phi-3's, is twice as wide); the routed experts, ffn_down_exps [n_ff_exp, n_embd, n_expert], of which
    expert_used_count a token; the shared experts' ffn_down_shexp; the layers of an MoE model without routed
    experts, which keep a dense MLP; MLA's q_lora_rank and the router's expert groups from the header. Gated where
    a block has ffn_gate (or a fused gate_up). llama.cpp's GGUF keeps no activation name: Gemma's graphs run
    GELU, Nemotron-H's ReLU squared, the other gated MLPs SiLU. q and k are normalised where a block has
    attn_q_norm; attention's output is gated where it has attn_gate or an attn_q twice attn_output's width (the
    gate stacked with the queries, Qwen3-Next's); the shared expert where it has ffn_gate_inp_shexp."""
    dense = experts = shared = 0
    up_widths, gated, moe_layers, kinds = set(), False, set(), set()
    query_widths, output_widths = set(), set()
    for tensor in tensors:
        base = tensor.name.rpartition(".")[0] if tensor.name.startswith("blk.") else ""
        layer, _, kind = base.partition(".")[2].partition(".")
        kinds.add(kind)
        if kind == "attn_q" and len(tensor.dims) == 2:
            query_widths.add(tensor.dims[1])
        elif kind == "attn_output" and len(tensor.dims) == 2:
            output_widths.add(tensor.dims[0])
        if kind in ("ffn_down", "ffn_down_shexp") and len(tensor.dims) == 2:
            dense = max(dense, tensor.dims[0])
            if kind == "ffn_down_shexp":
                shared = max(shared, tensor.dims[0])
        elif kind == "ffn_down_exps" and len(tensor.dims) == 3:
            experts = max(experts, tensor.dims[0])
            if layer.isdigit():
                moe_layers.add(int(layer))
        elif kind in ("ffn_up", "ffn_up_shexp") and len(tensor.dims) == 2:
            up_widths.add(tensor.dims[1])
        gated = gated or kind.startswith("ffn_gate") and not kind.startswith("ffn_gate_inp")
    gated = gated or bool(dense) and 2 * dense in up_widths
    activation = ("gelu_pytorch_tanh" if hp.arch.startswith("gemma") else "relu2" if hp.arch == "nemotron_h"
                  else "silu" if gated else "gelu")
    return Widths(hidden=hp.n_embd, mlp_intermediate=dense, gated_mlp=gated, mlp_activation=activation,
                  experts_per_token=max(hp.n_expert_used) if experts else 0, experts=hp.n_expert if experts else 0,
                  expert_intermediate=experts, query_head_dim=hp.mla_key if hp.kv_lora_rank else 0,
                  value_head_dim=hp.mla_value if hp.kv_lora_rank else 0, shared_expert_intermediate=shared,
                  dense_layers=tuple(il for il in range(hp.n_layer) if il not in moe_layers) if experts else (),
                  query_rank=hp.q_lora_rank if hp.kv_lora_rank else 0,
                  expert_groups=hp.expert_groups if experts else 1, query_key_norm="attn_q_norm" in kinds,
                  attention_gate="attn_gate" in kinds or any(2 * width in query_widths for width in output_widths),
                  shared_expert_gate="ffn_gate_inp_shexp" in kinds)


def check_sizes(hp: HParams, layers: list, weights: int, where: str) -> None:
    """Every width the header gives, and every cache row and recurrent state made of them, is at most the values
    the file's tensors hold: a model has a weight for each channel it computes (token_embd is n_embd wide, each
    head has its projection) and at least as many weights as a layer's state holds (a Mamba layer's A is its SSM
    state's shape, its conv1d wider than the convolution's state; a Gated DeltaNet's output projection is wider
    than its state). A header that says more describes no file; taken at its word it would plan 10^29 bytes."""
    sizes = {"embedding_length": hp.n_embd, "attention.head_count": max(hp.n_head),
             "feed_forward_length": max(hp.n_ff), "expert_count": hp.n_expert}
    for cache in layers:
        if cache.kind in ("full", "sliding", "chunked"):
            sizes[f"layer {cache.layer}'s K and V row"] = cache.kv_heads * (cache.head_dim + cache.head_dim_v)
        elif cache.kind == "mla":
            sizes[f"layer {cache.layer}'s latent row"] = cache.latent_dim + cache.rope_dim
        elif cache.kind == "recurrent":
            sizes[f"layer {cache.layer}'s recurrent state"] = cache.conv_elements + cache.ssm_elements
    for what, size in sizes.items():
        if size > weights:
            raise KvplanError(f"{where}: {what} is {size:,} values, more than the {weights:,} weights of the file's "
                              "tensors: no model has it (a damaged or hand-made header)")


# ------------------------------------------------------------------------------------------------ parameters


def param_counts(tensors: list[gguf.Tensor], hp: HParams, where: str) -> ParamCounts:
    """Parameters by group, from the tensors' names (llama.cpp's, src/llama-arch.cpp LLM_TENSOR_NAMES) and shapes:
    token_embd the embedding, output the LM head (absent when tied), blk.N.ffn_*_exps the routed experts (of
    which expert_used_count / expert_count are active per token), other blk.N.ffn_* the MLP and shared experts,
    MLA's down-projections attn_q_a and attn_kv_a_mqa `attention_replicated`, the other matrices of a block its
    attention or mixer; norms, routers (ffn_gate_inp*) and their correction biases (exp_probs_b)
    `other_replicated`, and biases, convolutions and other vectors `other` (`kvplan.model.ParamCounts`)."""
    groups: Counter[str] = Counter()
    for tensor in tensors:
        name, n = tensor.name, tensor.elements
        if name in ("token_embd.weight", "position_embd.weight"):
            groups["embedding"] += n
        elif name == "output.weight":
            groups["lm_head"] += n
        elif not name.startswith("blk."):
            groups["other_replicated" if "norm" in name else "other"] += n
        else:
            layer, _, rest = name.removeprefix("blk.").partition(".")
            base, _, suffix = rest.rpartition(".")
            if _held_whole(base, hp):
                groups["other_replicated"] += n
            elif suffix != "weight" or len(tensor.dims) < 2 or "norm" in base \
                    or base.endswith(("conv1d", "shortconv.conv", "ssm_a", "attn_sinks")):
                groups["other"] += n
            elif base.endswith("_exps"):
                il = int(layer) if layer.isdigit() and int(layer) < hp.n_layer_all else -1
                experts = tensor.dims[2] if len(tensor.dims) == 3 else hp.n_expert
                if il < 0 or not experts or not hp.n_expert_used[il]:
                    raise KvplanError(f"{where}: expert tensor {brief(name)} without {hp.arch}.expert_count and "
                                      "expert_used_count for its layer")
                groups["experts"] += n
                groups["active_experts"] += n // experts * hp.n_expert_used[il]
            elif base.startswith("ffn_"):
                groups["mlp"] += n
            elif base in ("attn_q_a", "attn_kv_a_mqa"):
                groups["attention_replicated"] += n
            else:
                groups["attention"] += n
    return ParamCounts(**{g: groups[g] for g in ParamCounts.model_fields if g != "vision"})


def _held_whole(base: str, hp: HParams) -> bool:
    """A block's norms, routers and correction biases, which every TP rank holds whole; not a Mamba or Mamba-2
    mixer's norms, which TP splits with its channels (a Gated DeltaNet's norm is one value head wide: whole)."""
    if base.startswith("ffn_gate_inp") or base.endswith("exp_probs_b"):
        return True
    return "norm" in base and not (base.startswith("ssm_") and hp.mixer in ("mamba", "mamba2"))


# ------------------------------------------------------------------------------------------------ the spec


def file_type(header: gguf.Header, meta: Meta) -> str:
    """The quantisation's name: `general.file_type` as llama-quantize names it (Q4_K_M), else, as llama.cpp
    guesses it, the ggml type most tensors have."""
    value = header.metadata.get("general.file_type")
    if value is not None and value.element_type is None and value.type in gguf.INTEGERS:
        if value.value in FILE_TYPES:
            return FILE_TYPES[value.value]
    counts = Counter(t.dtype.name for t in header.tensors if len(t.dims) > 1) or \
        Counter(t.dtype.name for t in header.tensors)
    return f"mostly {counts.most_common(1)[0][0]}"


def model_from_headers(headers: list[gguf.Header], name: str, source: str, read: str, where: str) -> ModelSpec:
    """The ModelSpec of a GGUF model: the metadata of its first file, the tensors of all its files (a split
    model's parts). `source`: where the model came from; `read`: the headers read, for the checkpoint."""
    meta = Meta.of_model(headers[0], where)
    rule = ARCHITECTURES.get(meta.arch)
    if rule is None:
        raise KvplanError(f"{where}: general.architecture {brief(meta.arch)} is not one kvplan maps to llama.cpp's "
                          f"cache layout (it maps {', '.join(sorted(ARCHITECTURES))})")
    tensors = [t for h in headers for t in h.tensors]
    if not tensors:
        raise KvplanError(f"{where}: the file has no tensors (a vocabulary-only GGUF?): no weights to plan with")
    hp = hparams(meta)
    rule(meta, hp)
    layers = caches(hp, where)
    elements: Counter[str] = Counter()
    for tensor in tensors:
        elements[tensor.dtype.name] += tensor.elements
    check_sizes(hp, layers, sum(elements.values()), where)
    label = file_type(headers[0], meta)
    files = len(headers)
    checkpoint = CheckpointTensors(
        elements=dict(sorted(elements.items(), key=lambda kv: -kv[1])), tensors=len(tensors), files=files,
        format="gguf", source=read)
    attention_heads = [hp.n_head[c.layer] for c in layers if c.kind in ("full", "sliding", "chunked", "mla")]
    notes = [f"the layer caches are llama.cpp's ({LLAMA_CPP}) for GGUF architecture {meta.arch}", *hp.notes]
    if hp.n_nextn:
        notes.append(f"{hp.n_nextn} NextN/MTP layer{'s' * (hp.n_nextn > 1)} loaded, not cached (no draft context)")
    return ModelSpec(
        name=name, architecture=MODEL_TYPES.get(meta.arch, meta.arch), num_layers=hp.n_layer_all,
        num_attention_heads=max(attention_heads or [0]),
        caches=tuple(layers), params=param_counts(tensors, hp, where),
        dtype=FLOAT_FILE_TYPES.get(label, "fp16"), quantization=Quantization(method="gguf", weights_dtype=label),
        kv_dtype="fp16", max_context=hp.n_ctx or None, source=source, notes=tuple(notes), checkpoint=checkpoint,
        widths=forward_widths(hp, tensors))


def split_count(header: gguf.Header, where: str) -> tuple[int, int]:
    """(split.no, split.count) of a file; (0, 1) for a file that is not a part of a split model."""
    meta = Meta(header, where)
    count = meta.uint("split.count", 1)
    no = meta.uint("split.no", 0)
    if count < 1 or no >= count:
        raise KvplanError(f"{where}: split.no {no} of split.count {count}")
    return no, count


def part_names(name: str, no: int, count: int, where: str) -> list[str]:
    """The file names of every part of a split model, from one part's (`llama_split_prefix`/`llama_split_path`:
    <prefix>-00001-of-00003.gguf)."""
    match = SPLIT_NAME.match(name)
    if match is None or int(match["no"]) != no + 1 or int(match["count"]) != count:
        raise KvplanError(f"{where}: part {no + 1} of a model split in {count}, but not named "
                          f"<prefix>-{no + 1:05d}-of-{count:05d}.gguf as llama.cpp finds the parts")
    return [f"{match['prefix']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def check_parts(headers: list[gguf.Header], names: list[str]) -> None:
    """Each part says it is that part, of that many; the first says how many tensors they hold together."""
    for i, (header, name) in enumerate(zip(headers, names, strict=True)):
        if split_count(header, name) != (i, len(names)):
            raise KvplanError(f"{name}: not part {i + 1} of {len(names)} by its split.no and split.count")
    expected = Meta(headers[0], names[0]).uint("split.tensors.count", 0)
    found = sum(len(h.tensors) for h in headers)
    if expected and expected != found:
        raise KvplanError(f"{names[0]}: split.tensors.count is {expected:,} but the parts hold {found:,} tensors")


def read_lora_adapter(path: Path) -> LoraAdapter:
    """A LoRA adapter GGUF as llama.cpp 0c1e57098b loads it (`llama_adapter_lora_init_impl`, src/llama-adapter.cpp),
    refused in its words where it would refuse it: general.type must be adapter and adapter.type lora; tensors
    `<name>.lora_a` and `<name>.lora_b` pair up by the base tensor they change (each needs both), `*_norm.weight`
    ones are skipped, any other is refused. The rank is B's first dimension."""
    header = gguf.read_file(path)
    where = str(path)

    def text(key: str) -> str:
        value = header.metadata.get(key)
        return str(value.value) if value is not None and isinstance(value.value, str) else ""

    if text("general.type") != "adapter":
        raise KvplanError(f"{where}: llama.cpp: expect general.type to be 'adapter', but got: {text('general.type')}")
    if text("adapter.type") != "lora":
        raise KvplanError(f"{where}: llama.cpp: expect adapter.type to be 'lora', but got: {text('adapter.type')}")
    pairs: dict[str, dict[str, gguf.Tensor]] = {}
    for tensor in header.tensors:
        base, _, part = tensor.name.rpartition(".")
        if part in ("lora_a", "lora_b"):
            pairs.setdefault(base, {})[part] = tensor
        elif not tensor.name.endswith("_norm.weight"):
            raise KvplanError(f"{where}: llama.cpp: LoRA tensor {brief(tensor.name)} has unexpected suffix")
    if not pairs:
        raise KvplanError(f"{where}: the adapter has no LoRA tensors (<name>.lora_a and <name>.lora_b)")
    device = host = rank = 0
    for base, pair in pairs.items():
        if len(pair) != 2:
            raise KvplanError(f"{where}: llama.cpp: LoRA tensor pair for {brief(base)} is missing one component")
        a, b = pair["lora_a"], pair["lora_b"]
        # A is [input, rank], B [rank, output] (token_embd's [rank, n_embd]); a dimension a tensor leaves out is 1
        # (ggml_new_tensor), so a B of no dimensions is of rank 1
        embeddings = base.endswith("token_embd.weight")
        b_rank = ggml_ne(b, 0)
        if not embeddings and ggml_ne(a, 1) != b_rank:
            raise KvplanError(f"{where}: llama.cpp: lora_a tensor is not transposed ({brief(base)}: A is "
                              f"{list(a.dims)}, B {list(b.dims)}; A's ne[1] must be B's ne[0])")
        if not b_rank:
            raise KvplanError(f"{where}: LoRA pair {brief(base)} has rank 0 (B is {list(b.dims)}): no adapter")
        rank = max(rank, b_rank)
        if embeddings:  # the input layer stays on the CPU (`dev_input`, src/llama-model.cpp)
            host += a.nbytes + b.nbytes
        else:
            device += a.nbytes + b.nbytes
    arch = text("general.architecture")
    return LoraAdapter(name=path.name, architecture=MODEL_TYPES.get(arch, arch), rank=rank, pairs=len(pairs),
                       device_bytes=device, host_bytes=host)


def ggml_ne(tensor: gguf.Tensor, i: int) -> int:
    """ne[i] of a tensor as ggml makes it: the dimensions a GGUF lists, then 1."""
    return tensor.dims[i] if i < len(tensor.dims) else 1


def load_file(path: Path) -> ModelSpec:
    """A local GGUF file (or the parts of a split one, beside it)."""
    header = gguf.read_file(path)
    no, count = split_count(header, str(path))
    headers, names = [header], [path.name]
    if count > 1:
        names = part_names(path.name, no, count, str(path))
        headers = []
        for part in names:
            if not (path.parent / part).is_file():
                raise KvplanError(f"{path}: part {part} of the split model is not beside it")
            headers.append(header if part == path.name else gguf.read_file(path.parent / part))
        check_parts(headers, [str(path.parent / n) for n in names])
    files = f"{path.parent / names[0]} and its {count - 1} other part{'s' * (count > 2)}" if count > 1 else str(path)
    return model_from_headers(headers, name=names[0], source=f"GGUF file {files}",
                              read=f"GGUF header{'s' * (count > 1)} of {files}", where=str(path))
