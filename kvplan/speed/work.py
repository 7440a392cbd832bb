"""The work of a serving step on one GPU: the bytes it reads from HBM, the FLOPs it does, the bytes it sends over
the GPU links. Everything here is counted from kvplan's memory model, nothing is fitted.

For a model on a layout (`Layout`: dp data-parallel attention ranks of tp GPUs each, routed experts over all
tp x dp GPUs, whole on ep of them), per GPU of the fullest rank, for a decode step of b requests a rank:

    weights read  = sum over groups of bytes(group) x the GPU's share of it (`kvplan.memory.weights_by_group`, the
                    engine's `weight_shares`, as `kvplan.capacity.weights_on_gpu` places them), but
                    routed experts: only those the step's tokens touch. Each MoE layer routes each of its T tokens
                    (b x dp: every rank's tokens reach the experts) to k of its E experts, so with uniform routing
                    E x (1 - (1 - k/E)^T) experts are touched on average, the same share of those on any GPU,
                    whether EP places them whole or TP slices them (the estimate takes the GPU touched most:
                    `ServingShape.expert_imbalance`);
                    embedding: the looked-up rows only, not counted; a vision tower: not read for text
    KV read       = per request, sum over the GPU's layer caches of bytes per token x tokens held at its context
                    (isl + osl / 2, the middle of its decode), plus each recurrent state twice (read, written back)
                    (`kvplan.capacity.gpu_layers`: KV heads split by TP, an MLA latent whole on every TP rank)
    dense FLOPs   = 2 x params x tokens for every linear layer but the routed experts, on the rank's tokens (lm_head
                    included: a decode token's logits)
    expert FLOPs  = 2 x active routed params x tokens, the group's tokens over its tp x dp GPUs (balanced routing)
    attention     = 2 x query heads per GPU x (qk + v width) x tokens attended, per layer and token; MLA in its
                    absorbed form (qk latent + rope, v latent), as FlashMLA and FlashInfer decode it; a recurrent
                    layer 4 x its state elements per token (a state update and a readout)
    link bytes    = per layer, the attention output's ring all-reduce over the rank's tp GPUs, 2 (tp - 1) / tp x
                    tokens x hidden x 2 bytes (bf16), then the MLP or MoE's exchange: its all-reduce with one rank;
                    with DP ranks and EP an all-to-all, 2 x k x (n - 1) / n x tokens x hidden x 2 bytes (each token
                    to its experts' GPUs and back); with DP ranks and sliced experts an all-gather of the n GPUs'
                    tokens and a reduce-scatter of the outputs

Kernels launched per decode step on each GPU, layer by layer, as vLLM's model files run them under CUDA graphs
(vllm/model_executor/models/, read at 0.32.0; the all-reduces apart: `collectives` counts them). Every GPU of a
layout launches the same ones. Quantisation kernels are not counted (vLLM fuses most into the norms and
activations before FP8 GEMMs), nor what a GPU's MoE backend fuses (Blackwell's TRT-LLM-gen MoE runs routing and
finalize inside its GEMMs).

    attention     6: input norm (fused with the residual add), QKV GEMM, rotary, cache write, attention, o_proj
                  (llama.py); + 1 where q and k are normalised (Qwen3's q_norm and k_norm, compiled into one
                  kernel: qwen3_moe.py), + 1 where the output is gated (Qwen3-Next's sigmoid gate: qwen3_next.py)
    MLA           11: norm, fused q_a/kv_a GEMM, q_a norm, kv_a norm, q_b GEMM, rotary, cache write, the W_UK
                  batched GEMM absorbing the queries, attention, the W_UV batched GEMM, o_proj (deepseek_v2.py,
                  layers/mla.py)
    Gated DeltaNet 9: norm, in_proj_qkvz and in_proj_ba GEMMs, the output's zero fill, the causal conv1d update,
                  the recurrent rule with its gating, the gated norm, out_proj, and a copy of b and a
                  (layers/mamba/gdn/qwen_gdn_linear_attn.py); other recurrent mixers are counted alike
    dense MLP     4: post-attention norm, gate_up GEMM, activation, down GEMM
    MoE           8: post-attention norm, router GEMM, top-k (DeepSeek's group-limited top-k one fused kernel),
                  align (permute), the two grouped GEMMs, activation, the weighted sum (fused_moe/); a shared
                  expert + 3 (gate_up, activation, down), + 3 where a sigmoid gate scales it (the gate's GEMM,
                  sigmoid, multiply: qwen2_moe.py)

With speculative decoding by the checkpoint's MTP layers (`drafts` = d tokens drafted a step, chained), a step
verifies 1 + d tokens of every running request in one forward pass of the model (weights and KV read once, the
FLOPs, expert routing and links of (1 + d) x b tokens) and drafts d tokens before it, each a pass of one MTP layer
at b tokens (the next in turn where a checkpoint has several: vLLM's deepseek_mtp.py takes layer spec_step_idx mod
n; SGLang's deepseek_nextn.py has one): its weights (the experts those b tokens touch), the shared lm_head (a
draft's logits), its kernels (its layer's counts above, + 4: the two input norms, the fusing projection eh_proj
and lm_head). Its KV, one layer's beside the model's, and its all-reduces are not counted.

A prefill of one prompt of P tokens reads every weight once (the experts its tokens touch), does the linear FLOPs of
P tokens (lm_head for the last) and attends, on a layer that holds tokens_held(t) tokens at position t, sum over
t <= P of tokens_held(t) pairs (P (P + 1) / 2 for full attention): attention's quadratic term.
"""

import math
from fractions import Fraction
from functools import cached_property, lru_cache

from pydantic import BaseModel, ConfigDict

from kvplan import engines
from kvplan.capacity import check_parallel, gpu_layers
from kvplan.dtypes import kv_dtype, weight_dtype
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.memory import weights_by_group
from kvplan.model import KV_KINDS, LayerCache, ModelSpec

ACTIVATION_BYTES = 2  # bf16 activations on the links
RECURRENT_FLOPS_PER_ELEMENT = 4  # a state update and a readout, a multiply-add each, per state element
# attention kinds whose query heads read `kv_heads x (head_dim + head_dim_v)` rows; the others are MLA and DeepSeek
# V4's one-row caches (key and value alike)
HEADED = ("full", "sliding", "chunked", "cross", "prefixed")
# kernels a decode step launches per layer, by what the layer does (the module docstring); attention kinds not
# named here launch ATTENTION_KERNELS
ATTENTION_KERNELS = 6
LAYER_KERNELS = {"mla": 11, "recurrent": 9, "none": 0}
MLP_KERNELS = 4
MOE_KERNELS = 8
SHARED_EXPERT_KERNELS = 3
SHARED_EXPERT_GATE_KERNELS = 3
MTP_INPUT_KERNELS = 4  # an MTP pass's two input norms, its fusing projection and lm_head


class Layout(BaseModel):
    """How one serving instance splits the model: `dp` data-parallel attention ranks of `tp` GPUs each; the routed
    experts over all tp x dp GPUs, whole on `ep` expert-parallel ranks (1: each expert sliced over the GPUs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = 1
    dp: int = 1
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


class StepWork(BaseModel):
    """One step's work on one GPU. Bytes and FLOPs are whole numbers; link bytes are what one GPU sends."""

    model_config = ConfigDict(frozen=True)

    weights_bytes: int
    expert_bytes: int
    kv_bytes: int
    dense_flops: int
    expert_flops: int
    attention_flops: int
    link_bytes: int
    collectives: int

    @property
    def hbm_bytes(self) -> int:
        return self.weights_bytes + self.expert_bytes + self.kv_bytes


class ServingShape:
    """What the work of any step derives from, computed once for a model, layout, engine and dtypes: each parameter
    group's bytes and params on one GPU, the GPU's caches, the attention widths, the dtypes the step computes in."""

    def __init__(self, model: ModelSpec, layout: Layout, engine_name: str, weights_dtype: str | None = None,
                 kv_dtype_name: str | None = None, drafts: int = 0):
        check_parallel(model, layout.tp, 1, dp=layout.dp)
        if drafts and model.mtp is None:
            raise KvplanError(f"{model.name} has no MTP layers to draft with")
        self.model, self.layout, self.drafts = model, layout, drafts
        self.engine = _placing_engine(model, engine_name, layout)
        self.kv = kv_dtype(kv_dtype_name or self.engine.default_kv_dtype(model))
        self.engine.check_kv_dtype(self.kv)
        self.keys, self.values = self.engine.cache_types(self.kv)
        self.weights_dtype = weights_dtype or self.engine.default_weights_dtype(model)
        group_bytes, self.weights_label = weights_by_group(model, self.weights_dtype)
        shares = self.engine.weight_shares(model)
        self.bytes_on_gpu = {group: size * shares[group] for group, size in group_bytes.items()}
        counts = model.params.__dict__
        self.params_on_gpu = {group: counts[group] * shares[group] for group in group_bytes}
        self.state_dtype = kv_dtype(model.dtype)
        self.caches = gpu_layers(self.engine.cached_layers(model), [model.num_layers], layout.tp)[0]
        self.query_heads = Fraction(model.num_attention_heads, layout.tp)
        widths = model.widths
        self.hidden = widths.hidden if widths else 0
        self.experts = widths.experts if widths and model.params.experts else 0
        self.top_k = widths.experts_per_token if self.experts else 0

    @property
    def weights_dtype_name(self) -> str:
        """The dtype the linear layers are stored in (fp8, nvfp4, bf16, ...): what their GEMMs run at."""
        if self.weights_dtype:
            return weight_dtype(self.weights_dtype).name
        quantization = self.model.quantization
        return quantization.weights_dtype if quantization else self.model.dtype

    @cached_property
    def dense_weights_bytes(self) -> int:
        """Bytes of every group but the routed experts, the embedding and a vision tower on one GPU."""
        skipped = ("experts", "embedding", "vision")
        return round(sum(size for group, size in self.bytes_on_gpu.items() if group not in skipped))

    @cached_property
    def expert_weights_bytes(self) -> int:
        return round(self.bytes_on_gpu["experts"])

    @cached_property
    def moe_layers(self) -> int:
        """Layers that route to experts: the routed experts' params over one layer's (E experts of gate, up and
        down projections, hidden x expert width each; up and down without a gate)."""
        if not self.experts:
            return 0
        widths = self.model.widths
        per_layer = self.experts * (3 if widths.gated_mlp else 2) * widths.hidden * widths.expert_intermediate
        return round(self.model.params.experts / per_layer) if per_layer else 0

    @cached_property
    def decode_kernels(self) -> int:
        """Kernels one decode step launches on each GPU, summed over the layers (the module docstring's counts),
        with each MTP pass's where the step drafts."""
        model = self.model
        kernels = self._kernels(self.caches, self.moe_layers, model.num_layers)
        if self.drafts:
            one_layer = [(model.mtp.caches[0], 1)]
            kernels += self.drafts * (self._kernels(one_layer, 1 if model.mtp.params.experts else 0, 1)
                                      + MTP_INPUT_KERNELS)
        return kernels

    def _kernels(self, caches, moe_layers: int, layers: int) -> int:
        """Kernels of `layers` decoder layers with these caches, `moe_layers` of them routing to experts."""
        widths = self.model.widths
        attention = ATTENTION_KERNELS
        if widths:
            attention += widths.query_key_norm + widths.attention_gate
        total = sum(count * LAYER_KERNELS.get(cache.kind, attention) for cache, count in caches)
        if not widths:
            return total
        moe = MOE_KERNELS
        if widths.shared_expert_intermediate:
            moe += SHARED_EXPERT_KERNELS + SHARED_EXPERT_GATE_KERNELS * widths.shared_expert_gate
        mlp = MLP_KERNELS if widths.mlp_intermediate else 0
        return total + moe_layers * moe + (layers - moe_layers) * mlp

    @cached_property
    def draft_pass(self) -> tuple[float, float, float, float]:
        """One draft pass on this GPU, through one MTP layer: (bytes of its weights but the routed experts, with the
        shared lm_head's; its routed experts' bytes; params a token passes through, lm_head's with them; active
        routed params per token). Each group is placed as the model's own group is here: its bytes and share per
        param; an MTP layer is 1 / n of n's counts."""
        mtp, counts = self.model.mtp, self.model.params.__dict__
        layer = {group: count / mtp.layers for group, count in mtp.params.__dict__.items()}
        placed = [group for group in self.bytes_on_gpu
                  if counts[group] and group not in ("experts", "embedding", "vision", "lm_head")]
        weights = sum(layer[g] * self.bytes_on_gpu[g] / counts[g] for g in placed) + self.bytes_on_gpu["lm_head"]
        params = sum(layer[g] * self.params_on_gpu[g] / counts[g] for g in placed) + self.params_on_gpu["lm_head"]
        experts = layer["experts"] * self.bytes_on_gpu["experts"] / counts["experts"] if counts["experts"] else 0.0
        return weights, experts, params, layer["active_experts"] / self.layout.gpus

    def expert_imbalance(self, tokens: float) -> float:
        """How many times the mean the experts touched on the GPU that has the most are, where expert parallelism
        places experts whole (sliced experts are touched alike on every GPU): a step waits for that GPU. Each of
        the n = E / ep experts on a GPU is touched with probability q = `touched(tokens)`, so a GPU's count is
        Binomial(n, q), and the most of ep GPUs' is about n q + z(ep) sqrt(n q (1 - q)) (z(m): the expected
        largest of m standard normals), at most n."""
        ep = self.layout.ep
        share = self.touched(tokens)
        if ep == 1 or not self.experts or share <= 0:
            return 1.0
        experts = self.experts / ep
        spread = largest_normal(ep) * math.sqrt((1 - share) / (experts * share))
        return min(1 + spread, 1 / share)

    def touched(self, tokens: float) -> float:
        """The share of a MoE layer's experts `tokens` tokens route to: 1 - (1 - k/E)^T (all of a dense model's)."""
        if not self.experts:
            return 1.0
        return 1.0 - (1.0 - self.top_k / self.experts) ** tokens

    @cached_property
    def token_params(self) -> tuple[float, float, float]:
        """(params one rank token passes through on this GPU but lm_head's, lm_head's, routed experts' active
        params per token of the group on this GPU)."""
        dense = sum(size for group, size in self.params_on_gpu.items()
                    if group not in ("experts", "embedding", "vision", "lm_head"))
        active_share = self.model.params.active_experts / self.layout.gpus
        return float(dense), float(self.params_on_gpu["lm_head"]), float(active_share)

    def kv_bytes(self, ctx: int) -> int:
        """What one sequence at `ctx` tokens makes a decode step read from this GPU's caches."""
        total = 0
        for cache, layers in self.caches:
            if cache.kind in KV_KINDS:
                total += layers * cache.bytes_per_token(self.keys, self.values) * cache.tokens_held(ctx)
            total += layers * 2 * cache.state_bytes(self.state_dtype)
        return total

    def attention_flops(self, ctx: int, prompt: int | None = None) -> int:
        """FLOPs of one decode token's attention at `ctx` on this GPU, or with `prompt` those of a whole prompt's
        causal prefill (`prefill_pairs` query-key pairs a layer)."""
        total = Fraction(0)
        for cache, layers in self.caches:
            width = _pair_width(cache)
            if width:
                attended = cache.tokens_held(ctx) if prompt is None else prefill_pairs(cache, prompt)
                total += layers * 2 * self.query_heads * width * attended
            elif cache.kind == "recurrent":
                total += layers * RECURRENT_FLOPS_PER_ELEMENT * cache.ssm_elements * (prompt or 1)
        return round(total)

    def link_bytes(self, rank_tokens: float, group_tokens: float) -> tuple[int, int]:
        """(bytes one GPU sends, collectives) for a step, per layer: the attention output's all-reduce over the
        rank's tp GPUs, then the MLP or MoE's exchange over the instance's tp x dp GPUs: with one rank its output's
        all-reduce; with DP ranks and expert parallelism an all-to-all, each token's hidden state to the GPUs of
        its k experts and back (DeepEP, TensorRT-LLM's wide-EP alltoall); with DP ranks and sliced experts an
        all-gather of the tokens and a reduce-scatter of the outputs."""
        tp, group, dp = self.layout.tp, self.layout.gpus, self.layout.dp
        row = self.hidden * ACTIVATION_BYTES
        per_layer = 0.0
        collectives = 0
        if tp > 1:
            per_layer += 2 * (tp - 1) / tp * rank_tokens * row
            collectives += 1
        if dp > 1 and self.experts and self.layout.ep > 1:
            per_layer += 2 * self.top_k * (group - 1) / group * rank_tokens * row
            collectives += 2
        elif dp > 1:
            per_layer += 2 * (group - 1) / group * group_tokens * row
            collectives += 2
        elif tp > 1:
            per_layer += 2 * (tp - 1) / tp * rank_tokens * row
            collectives += 1
        return round(per_layer * self.model.num_layers), collectives * self.model.num_layers

    def decode_step(self, running: float, ctx: int) -> StepWork:
        """A decode step of `running` sequences per rank, each at context `ctx`, verifying 1 + `drafts` tokens of
        each and drafting `drafts` (the module docstring)."""
        dense, lm_head, expert_active = self.token_params
        verified = 1 + self.drafts
        group_tokens = running * self.layout.dp
        link, collectives = self.link_bytes(running * verified, group_tokens * verified)
        work = StepWork(weights_bytes=self.dense_weights_bytes,
                        expert_bytes=round(self.expert_weights_bytes * self.touched(group_tokens * verified)),
                        kv_bytes=round(self.kv_bytes(ctx) * running),
                        dense_flops=round(2 * (dense + lm_head) * running * verified),
                        expert_flops=round(2 * expert_active * group_tokens * verified),
                        attention_flops=round(self.attention_flops(ctx) * running * verified),
                        link_bytes=link, collectives=collectives)
        if not self.drafts:
            return work
        draft_bytes, draft_experts, draft_params, draft_active = self.draft_pass
        return work.model_copy(update={
            "weights_bytes": work.weights_bytes + round(self.drafts * draft_bytes),
            "expert_bytes": work.expert_bytes + round(self.drafts * draft_experts * self.touched(group_tokens)),
            "dense_flops": work.dense_flops + round(self.drafts * 2 * draft_params * running),
            "expert_flops": work.expert_flops + round(self.drafts * 2 * draft_active * group_tokens)})

    def prefill(self, prompt: int) -> StepWork:
        """One prompt of `prompt` tokens prefilled alone: every weight read once (the experts its tokens touch),
        its linear FLOPs (lm_head at its last token), attention's quadratic term, its all-reduces."""
        dense, lm_head, expert_active = self.token_params
        link, collectives = self.link_bytes(prompt, prompt)
        return StepWork(weights_bytes=self.dense_weights_bytes,
                        expert_bytes=round(self.expert_weights_bytes * self.touched(prompt)),
                        kv_bytes=0, dense_flops=round(2 * (dense * prompt + lm_head)),
                        expert_flops=round(2 * expert_active * prompt),
                        attention_flops=self.attention_flops(prompt, prompt),
                        link_bytes=link, collectives=collectives)


@lru_cache
def largest_normal(m: int) -> float:
    """The expected largest of m independent standard normals: the integral of x m phi(x) Phi(x)^(m - 1), summed
    over x in [-8, 8] in steps of 1/256 (0.5642 for 2, 1.0294 for 4, 1.4236 for 8)."""
    step = 1 / 256
    total = 0.0
    for i in range(-8 * 256, 8 * 256 + 1):
        x = i * step
        density = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        below = (1 + math.erf(x / math.sqrt(2))) / 2
        total += x * m * density * below ** (m - 1) * step
    return total


def _placing_engine(model: ModelSpec, engine_name: str, layout: Layout) -> engines.Engine:
    """The engine whose rules place the weights and caches on a GPU. The routed experts are split over the
    instance's tp x dp GPUs whatever the split between expert parallelism and slicing, which moves no bytes
    (balanced routing), so the engine places them sliced (ep 1). kvplan's TensorRT-LLM engine plans no attention
    data parallelism (`Engine.data_parallel`): such a layout is placed by vLLM's rules, attention by the rank's TP
    and routed experts over all the GPUs, as TensorRT-LLM's attention DP runs it (`enable_attention_dp`)."""
    name = engine_name
    if layout.dp > 1 and not engines.engine_class(engine_name).data_parallel:
        name = "vllm"
    return engines.engine(name, EngineOptions(), tp=layout.tp, dp=layout.dp)


def _pair_width(cache: LayerCache) -> int:
    """Multiply-adds per query head and attended token: qk width + v width."""
    if cache.kind in HEADED:
        return cache.head_dim + cache.head_dim_v
    if cache.kind == "mla":
        return cache.latent_dim + cache.rope_dim + cache.latent_dim
    if cache.kind in ("sliding_kv", "compressed") and not getattr(cache, "indexer", False):
        return 2 * cache.head_dim
    return 0


def prefill_pairs(cache: LayerCache, prompt: int) -> int:
    """Query-key pairs a causal prefill of `prompt` tokens attends on this cache: sum over t = 1..prompt of
    tokens_held(t) (full: P (P + 1) / 2; a window W: W (W + 1) / 2 + (P - W) W beyond it)."""
    held = cache.tokens_held
    if held(prompt) == prompt:  # every token attends all before it
        return prompt * (prompt + 1) // 2
    window = held(prompt)
    if cache.kind in ("sliding", "sliding_kv", "mla") and held(window) == window:
        return window * (window + 1) // 2 + (prompt - window) * window
    if cache.kind == "chunked":
        chunks, rest = divmod(prompt, cache.chunk)
        return chunks * cache.chunk * (cache.chunk + 1) // 2 + rest * (rest + 1) // 2
    return sum(held(t) for t in range(1, prompt + 1))

