"""llama.cpp: contexts and slots as its front ends (llama-server, the Python bindings) make them, cells padded to 256,
GGML cache types for keys and values, the compute graph's buffer, drafts and LoRA adapters."""

import math
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict

from kvplan.dtypes import DType, kv_dtype
from kvplan.engines.base import (
    WINDOWED,
    Engine,
    EngineOptions,
    GiB,
    KVPool,
    Layers,
    LoraSlots,
    Overhead,
    Row,
    cdiv,
    pad,
    rows,
)
from kvplan.errors import KvplanError
from kvplan.model import LayerCache, ModelSpec, distinct_caches

LLAMA_CPP_DRAFT_MAX = 3  # tokens a draft model drafts a step, --spec-draft-n-max (common/common.h: n_max = 3)
LLAMA_CPP_VOCAB_DIFFERENCE = 128  # the most a draft's vocabulary may differ in size (common/speculative.cpp)
LLAMA_CPP_PAD = 256  # n_ctx, per-slot and SWA cells are padded to 256 (llama-context.cpp, llama-kv-cache-iswa.cpp)
LLAMA_MAX_SEQ = 256  # the most sequences one context holds (src/llama-cparams.h; llama_context refuses more)
# Model types whose llama.cpp graph keeps its sliding (or chunked) window: an iSWA cache (src/models/gemma2.cpp,
# gemma3.cpp, gemma3n.cpp, gemma4.cpp, cohere2.cpp, openai-moe.cpp, llama4.cpp, exaone4.cpp, olmo2.cpp for Olmo 3).
# Every other model gets a full cache on every layer: Mistral and Mixtral run as the plain `llama` graph, Phi-3's
# window is switched off (src/models/phi3.cpp), Qwen2 and Starcoder2 read no window.
LLAMA_CPP_SWA = frozenset({"gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text",
                           "cohere2", "gpt_oss", "llama4", "llama4_text", "exaone4", "olmo3"})
# Architectures whose recurrent state keeps n_rs_seq rows more per sequence, so that a rejected speculative draft
# can be rolled back (`llm_arch_supports_rs_rollback`, src/llama-arch.cpp: QWEN35, QWEN35MOE, NEMOTRON_H,
# NEMOTRON_H_MOE, LFM2, LFM2MOE, ...), by the config's model_type; llama_context clamps n_rs_seq to 0 for the
# others (Jamba, Qwen3-Next, Mamba).
LLAMA_CPP_RS_ROLLBACK = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "nemotron_h",
                                   "lfm2", "lfm2_moe"})
# Head sizes CUDA's flash-attention kernels take (`ggml_cuda_get_best_fattn_kernel`, ggml/src/ggml-cuda/fattn.cu):
# K and V of one of these sizes, or (K, V) with at least 2 query heads per KV head, a multiple of the number given.
CUDA_FLASH_ATTN_HEADS = frozenset({40, 64, 72, 80, 96, 112, 128, 256})
CUDA_FLASH_ATTN_GQA = {(512, 512): 1, (576, 512): 1, (192, 128): 8, (320, 256): 32}
# What Metal's flash attention takes (`ggml_metal_device_supports_op`, GGML_OP_FLASH_ATTN_EXT,
# ggml/src/ggml-metal/ggml-metal-device.m): K heads of these sizes, V no wider than K (equal at 72), K and V of one
# cache type among these (bf16 on every Apple GPU from M1: MTLGPUFamilyApple6 and later).
METAL_FLASH_ATTN_HEADS = frozenset({32, 40, 48, 64, 72, 80, 96, 112, 128, 192, 256, 320, 512, 576})
METAL_FLASH_ATTN_TYPES = frozenset({"fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"})


class LlamaCppFrontend(BaseModel):
    """The llama_context_params a front end sets when the user sets nothing."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    label: str
    n_batch: int
    n_ubatch: int
    flash_attn: Literal["on", "off", "auto"]
    swa_full: bool
    kv_unified: bool
    max_sequences: int
    # n_outputs_max: llama-server's is min(-b, -np x (1 + draft tokens)) (`server_output_limits`,
    # tools/server/server-context.cpp; `common_speculative_get_output_limits`, common/speculative.cpp), so its
    # compute buffer holds logits for that many rows; Llama() leaves it 0, n_batch: every token of a micro-batch
    limits_outputs: bool


LLAMA_CPP_FRONTENDS = {
    # llama-server (common/common.h, tools/server/server.cpp): -b 2048, -ub 512, -fa auto, no --swa-full; with -np
    # auto it runs 4 slots in one unified cache (-kvu), which kvplan keeps for -np N users.
    "server": LlamaCppFrontend(label="llama-server", n_batch=2048, n_ubatch=512, flash_attn="auto", swa_full=False,
                               kv_unified=True, max_sequences=LLAMA_MAX_SEQ, limits_outputs=True),
    # llama-cpp-python's Llama() (llama_cpp/llama.py): n_batch 512, n_ubatch 512, flash_attn=False; the rest the
    # C API's llama_context_default_params (src/llama-context.cpp): swa_full true, kv_unified false, n_seq_max 1.
    "python": LlamaCppFrontend(label="llama-cpp-python Llama()", n_batch=512, n_ubatch=512, flash_attn="off",
                               swa_full=True, kv_unified=False, max_sequences=1, limits_outputs=False),
}


class LlamaCppContext(BaseModel):
    """What llama_context makes of -c users x ctx and -np users (src/llama-context.cpp):
        n_ctx     = PAD(users x ctx, 256); per-slot cache: n_ctx_seq = PAD(n_ctx / users, 256), n_ctx = that x users
        n_batch   = min(users x ctx, -b)            n_ubatch = min(n_batch, -ub)
        streams   = 1 unified, else one per slot, each of n_ctx_seq cells (kv_size)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    n_seq: int
    n_ctx: int
    kv_size: int
    streams: int
    n_batch: int
    n_ubatch: int

    def swa_size(self, window: int) -> int:
        """SWA cells per stream (src/llama-kv-cache-iswa.cpp):
        PAD(min(kv_size, n_swa x (unified ? n_seq_max : 1) + n_ubatch), 256)."""
        unified = self.streams == 1
        return pad(min(self.kv_size, window * (self.n_seq if unified else 1) + self.n_ubatch), LLAMA_CPP_PAD)


class LlamaCppGraph:
    """The compute buffer llama.cpp reserves (`llama_context::sched_reserve`, src/llama-context.cpp): the graph of
    one micro-batch of T = min(n_ctx, n_ubatch) tokens (rounded up to a multiple of n_seq_max), every token an
    output, attending to the whole cache; ggml-alloc keeps each tensor until its last reader and reuses the memory.
    Its peak, in bytes, with E the hidden size, F the MLP's width, V the vocabulary, h the query heads:
        inputs  per cache (the full one, the sliding-window one): a mask of n_kv x T, f16 with flash attention
                (f32 without), and the cell indices its K and V are written to (8 B each; without flash attention
                V is written transposed, T x the V row's elements)
        layer   4 T x the largest of
                  attention: 4 E + h x Dv (MLA: h x (Dk + Dv), its queries absorbed into the latent; and before
                             them the queries' moment, `mla_query_width`; with a gated query projection,
                             `GATED_QUERY`, at least 4 E + 3 h x Dv), and without
                             flash attention the scores, h x n_kv; where --flash-attn auto turned it off after the
                             cache was made untransposed, a transposed copy of V, n_kv x its row (derived: the CPU
                             backend never turns it off)
                  MLP: 3 F + 3 E (gate, up, their product); routed experts: their moment, with R = top_k x F_e
                             (`routed_experts_width`)
                  recurrent: Mamba E + 6 C, with C the channels of its convolution; Gated DeltaNet: its moment
                             beside the states it reads and writes (`delta_net_bytes`)
        output  4 T x (V + 2 E) (the logits and the normed hidden state; 3 E without flash attention), after the
                inputs are freed
    Three graphs hold more (`family_peak`): Gemma 3n's per-layer inputs and AltUp streams, MiniMax-01's lightning
    attention and Kimi Linear's KDA (a recurrent moment of its own, 3 E + 7 h x d + d, h KDA heads of d).
    n_kv is the cells per stream of the layer's cache: a unified cache's scores span all n_ctx cells, a per-slot
    cache's only n_ctx_seq. The terms are what the graph holds live; their coefficients were read off the CPU
    backend's "compute buffer size" log, which kvplan matches within the errors docs/accuracy.md shows. CUDA
    builds the same graph (and keeps the inputs in a host buffer), so its figure is derived, not measured."""

    RECURRENT = {"mamba": (1, 6), "mamba2": (1, 6)}  # mixer -> (x E, x C)
    # graphs whose one query projection holds the queries and their output gate (src/models/qwen3next.cpp,
    # qwen35.cpp, qwen35moe.cpp: Qcur_full, 2 x h x d a token)
    GATED_QUERY = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
    GEMMA3N = frozenset({"gemma3n", "gemma3n_text"})
    GEMMA3N_ALTUP, GEMMA3N_PER_LAYER = 4, 256  # llama_hparams n_altup, n_embd_altup (src/llama-hparams.h)

    def __init__(self, model: ModelSpec, table: list[Row]):
        w = model.widths
        self.hidden = w.hidden
        self.vocab = max(model.params.lm_head, model.params.embedding) // w.hidden
        self.heads = model.num_attention_heads
        self.layers = model.num_layers
        self.gemma3n = model.architecture in self.GEMMA3N
        self.gated_query = model.architecture in self.GATED_QUERY
        # the attention's output, heads x V head (MLA: its v_head_dim), before the output projection
        values = [w.value_head_dim] if w.value_head_dim else [
            head_sizes(c)[1] for c in distinct_caches(model.caches) if head_sizes(c)]
        self.layer = max(3 * w.hidden + 3 * w.mlp_intermediate,
                         self.routed_experts_width(w, self.heads * max(values, default=0)))
        self.lightning = 0  # a lightning-attention layer's state, d x d x h (MiniMax-01)
        self.delta_nets = []  # the Gated DeltaNet layers' caches (`delta_net_bytes`)
        # per attention row: (per-head width of its attention moment, V row elements, sliding?); None: indexer keys
        self.attention = []
        for r in table:
            heads = head_sizes(r.cache)
            if r.kind == "recurrent" and r.cache.mixer == "gated_deltanet" and r.cache.conv_kernel \
                    and r.cache.state_size:
                self.delta_nets.append(r.cache)
            elif r.kind == "recurrent":
                self.layer = max(self.layer, self.recurrent_width(r.cache))
                if r.cache.mixer == "lightning":
                    self.lightning = r.cache.ssm_elements
            elif heads is None:
                self.attention.append(None)
            else:
                width = sum(heads) if r.cache.kind == "mla" else heads[1]
                self.attention.append((width, getattr(r.cache, "kv_heads", 1) * heads[1], r.kind in WINDOWED))
        self.mla_query = self.mla_query_width(model) if any(r.cache.kind == "mla" for r in table) else 0

    def bytes(self, context: LlamaCppContext, flash_attn: bool, cells: list[int], v_copy: int = 0,
              outputs: int | None = None, state_rows: int = 1) -> int:
        """`cells`: the cells per stream of each attention row's cache; `v_copy`: the bytes per element of a
        transposed copy of V each layer makes (0: none); `outputs`: the context's n_outputs_max where it is set
        below the micro-batch (the graph is reserved with min(T, n_outputs_max) outputs); `state_rows`: the
        recurrent state's rows a sequence, 1 + n_rs_seq."""
        tokens = cdiv(min(context.n_ctx, context.n_ubatch), context.n_seq) * context.n_seq
        caches: dict[bool, tuple[int, int]] = {}  # sliding? -> (n_kv, widest V row)
        layer = max([4 * tokens * self.layer] + [self.delta_net_bytes(c, tokens, context.n_seq, state_rows)
                                                 for c in self.delta_nets])
        for row, n_kv in zip(self.attention, cells, strict=True):
            if row is None:
                continue
            width, v_row, sliding = row
            caches[sliding] = (n_kv, max(v_row, caches.get(sliding, (0, 0))[1]))
            attention = max(4 * self.hidden + self.heads * (width + (0 if flash_attn else n_kv)), self.mla_query,
                            4 * self.hidden + 3 * self.heads * width if self.gated_query else 0)
            layer = max(layer, 4 * tokens * attention + n_kv * v_row * v_copy)
        inputs = 3 * tokens * 4 + sum(n_kv * tokens * (2 if flash_attn else 4) + tokens * 8 * (2 if flash_attn else
                                                                                            1 + v_row)
                                      for n_kv, v_row in caches.values())
        output = self.vocab + (2 if flash_attn else 3) * self.hidden
        return max(self.family_peak(tokens, inputs, layer), 4 * min(tokens, outputs or tokens) * output)

    @staticmethod
    def mla_query_width(model: ModelSpec) -> int:
        """f32 values a token the widest MLA layer's moment holds while llama.cpp absorbs its queries into the
        latent (src/models/deepseek2.cpp, kimi-linear.cpp; the blocks read off ggml-alloc's allocation trace), with
        h heads, L the latent, R its RoPE part, N + R the query head (query_head_dim), Dv the value head, Q the
        queries' down-projection (q_lora_rank): q, h (N + R); its nope part absorbed (q_nope_absorbed, h L); its
        RoPE part (q_pe, h R); and the query attention reads (Qcur, h (L + R), the two concatenated). Qcur does
        not fit in the block q frees, so they stack above the residual stream and the layer's input norm:
          first layer   3 E + Q (the embeddings, twice, and the norm; q's down-projection) + all four
          after MoE     4 E + all four
          after a dense MLP  4 E + h Dv: the residual stream sits above the previous layer's attention output
                        and its projection, a block of E + h Dv that takes q's down-projection and q where both
                        fit (Q + h (N + R) <= E + h Dv), and q_pe where what is left holds it.
        With flash attention this moment, not the attention's (Qcur beside its output), is the layer's peak."""
        w, heads = model.widths, model.num_attention_heads
        mla = [c for c in model.caches if c.kind == "mla"]
        latent, rope = mla[0].latent_dim, mla[0].rope_dim
        q, q_pe = heads * (w.query_head_dim or latent + rope), heads * rope
        absorbed, qcur = heads * latent, heads * (latent + rope)
        dense = set(w.dense_layers) if w.experts_per_token else set(range(model.num_layers))
        moments = []
        for kind in {"first" if c.layer == 0 else "dense" if c.layer - 1 in dense else "moe" for c in mla}:
            if kind == "dense":
                block = w.hidden + heads * w.value_head_dim
                q_fits = w.query_rank + q <= block
                left = block - w.query_rank - q if q_fits else block
                moments.append(4 * w.hidden + heads * w.value_head_dim + (0 if q_fits else q) + absorbed + qcur
                               + (0 if q_pe <= left else q_pe))
            else:
                below = 3 * w.hidden + w.query_rank if kind == "first" else 4 * w.hidden
                moments.append(below + q + absorbed + q_pe + qcur)
        return max(moments)

    @staticmethod
    def routed_experts_width(w, attention_output: int) -> int:
        """f32 values a token the routed experts' moment holds (`build_moe_ffn`, src/llama-graph.cpp; the blocks
        read off ggml-alloc's allocation trace), with R = top_k x F_e: 3 E + 3 R (the gate and up projections of the
        k experts a token is routed to, their SwiGLU).
        Where the experts' outputs (`ffn_moe_down`, top_k x E) do not fit in the block the gate and up projections
        freed (top_k x E > 2 R), ggml-alloc places them above the SwiGLU: top_k x E more; and where the projections
        are at least E wide (R >= E) they cannot reuse the block below the residual stream that the attention's
        output (`attention_output`, heads x V head) freed, at least E. Kimi Linear 48B (E 2,304, 8 experts of
        1,024, 32 heads of 128) and Qwen3-30B-A3B (E 2,048, 8 of 768) are such; gpt-oss-120b (4 of 2,880) is not."""
        routed = w.experts_per_token * w.expert_intermediate
        outputs = w.experts_per_token * w.hidden
        if outputs <= 2 * routed:
            return 3 * w.hidden + 3 * routed
        freed = max(w.hidden, attention_output) if routed >= w.hidden else 0
        return 3 * w.hidden + 3 * routed + outputs + freed

    def delta_net_bytes(self, cache, tokens: int, n_seq: int, state_rows: int) -> int:
        """A Gated DeltaNet layer's moment (src/models/delta-net-base.cpp, qwen35.cpp, qwen3next.cpp; the blocks read
        off ggml-alloc's allocation trace), f32, with T tokens of n_seq sequences, C the convolution's channels (Q
        and K, 2 x Hk x Dk, beside V, Hv x Dv), H = Hv, S its state (Hv x Dv x Dk) and 1 + n_rs_seq `state_rows`:
        the input, its norm and the embeddings' row (3 E a token); the projected Q, K and V (C a token), then
        the convolution's input, those with each sequence's last kernel - 1 inputs (C x (T + (kernel - 1) x
        n_seq)), and its output (C a token). The op's result (`ggml_gated_delta_net`, ggml/src/ggml.c) holds
        the output (Hv x Dv a token) and the state after each of the last 1 + n_rs_seq tokens of each sequence
        (n_seq x state_rows x S); where it does not fit in the block the convolution's input freed it lies above
        the convolution's output, beside the states read (n_seq x S), Q and K (C - Hv x Dv a token) and the gate
        and beta (2 H a token), which took the projection's block."""
        hidden, channels, state = self.hidden, cache.conv_elements // (cache.conv_kernel - 1), cache.ssm_elements
        values = state // cache.state_size
        conv_input = channels * (tokens + (cache.conv_kernel - 1) * n_seq)
        result = values * tokens + n_seq * state_rows * state
        moment = 3 * hidden * tokens + 2 * channels * tokens + conv_input
        if result > conv_input:
            gates = 2 * (cache.heads or 0)
            moment = max(moment, n_seq * state + (3 * hidden + channels - values + gates) * tokens + conv_input
                         + channels * tokens + result)
        return 4 * moment

    def recurrent_width(self, cache) -> int:
        """f32 values a token a recurrent layer's moment holds: Mamba E + 6 C (C the channels of its
        convolution); KDA (src/models/kimi-linear.cpp) 3 E + 7 h x d + d before its chunked recurrence: the
        input, its norm and the embeddings' row, Q, K and V out of their convolutions, the gate g1 and f_a's
        output, with h x d = C / 3 and d = its state's d x h x d over h x d."""
        conv = cache.conv_elements // (cache.conv_kernel - 1) if cache.conv_kernel else 0
        if cache.mixer == "kda" and conv:
            inner = conv // 3
            return 3 * self.hidden + 7 * inner + cache.ssm_elements // inner
        hidden, channels = self.RECURRENT.get(cache.mixer, (1, 6))
        return hidden * self.hidden + channels * conv

    def family_peak(self, tokens: int, inputs: int, layer: int) -> int:
        """The peak of the layers' graph, `inputs` + `layer` bytes, with the terms of the graphs that hold more.
        MiniMax-01 (src/models/minimax-01.cpp): its lightning attention's decay inputs, T x T x h f32 beside the
        q and k decays (2 T x h); in a lightning layer the exponentiated decay and the scores (two T x T x h),
        Q, K, V, their product and the old state's product (5 T x h x d), three rows of E (the embeddings, the
        layer's input and the block its norm freed), and the state (d x d x h).
        Gemma 3n (src/models/gemma3n.cpp): per-layer inputs P = T x n_layer x 256 f32 (n_embd_altup) and four
        AltUp streams S = 4 x T x E f32 (n_altup); at the start four copies of P (the rows gathered, scaled, the
        projection and its norm) beside the embeddings twice; at the first AltUp prediction P and two P-sized
        blocks ggml-alloc cannot reuse for the streams' three copies; in every layer P and S beside the generic
        moment. The fragmentation terms were read off ggml-alloc's allocation trace (GGML_ALLOCATOR_DEBUG) and
        hold within 5% with flash attention at hidden sizes 256 to 2,048."""
        if self.lightning and self.heads:
            heads, state = self.heads, self.lightning
            inner = heads * math.isqrt(state // heads)
            inputs += 4 * tokens * heads * (tokens + 2)
            layer = max(layer, 4 * tokens * (3 * self.hidden + 5 * inner + 2 * tokens * heads) + 4 * state)
        if not self.gemma3n:
            return inputs + layer
        per_layer = 4 * tokens * self.layers * self.GEMMA3N_PER_LAYER
        streams = 4 * tokens * self.GEMMA3N_ALTUP * self.hidden
        embeddings = 2 * 4 * tokens * self.hidden
        return inputs + max(layer + per_layer + streams, embeddings + 4 * per_layer,
                            embeddings + 3 * per_layer + 3 * streams)


class LlamaCppPool(KVPool):
    """`llama_kv_cache` (src/llama-kv-cache.cpp): per attention layer a K tensor [n_embd_k_gqa, kv_size, streams]
    and a V tensor alike (none for MLA), rows of ggml_row_size(type, n_embd) bytes; SWA layers hold
    `LlamaCppContext.swa_size` cells, all of kv_size with --swa-full. Recurrent state (src/llama-memory-recurrent.cpp):
    f32, max(1, n_seq_max) x (1 + n_rs_seq) rows per recurrent layer. Beside the cache, the compute buffer
    (`LlamaCppGraph`), which grows with n_ctx."""

    def __init__(self, engine: "LlamaCpp", table: list[Row], state: int, state_rows: int, flash_attn: bool,
                 v_copy: int, graph: LlamaCppGraph | None, notes: list[str], outputs_per_slot: int | None):
        """`outputs_per_slot`: the context's n_outputs_max is min(n_batch, slots x this) (None: n_batch, every
        token of a micro-batch an output)."""
        self.engine, self.state, self.state_rows, self.flash_attn = engine, state, state_rows, flash_attn
        self.v_copy, self.graph, self.notes, self.outputs_per_slot = v_copy, graph, notes, outputs_per_slot
        self.table = [r for r in table if r.kind != "recurrent"]
        self.max_sequences = engine.frontend.max_sequences

    def cells(self, context: LlamaCppContext) -> list[int]:
        """Cells per stream of each attention row."""
        swa_full = self.engine.swa_full
        return [context.swa_size(r.window) if r.kind in WINDOWED and not swa_full else context.kv_size
                for r in self.table]

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        if users == 0:
            return 0
        context = self.engine.context(users, ctx)
        total = users * self.state_rows * self.state
        for r, cells in zip(self.table, self.cells(context), strict=True):
            total += r.count * r.bytes_per_token * cells * context.streams
        return total

    def activation_bytes(self, users: int, ctx: int) -> int:
        """The compute buffer of a context for `users` sequences of ctx tokens (flat 0.5 GiB where the model spec
        gives no widths)."""
        if users == 0:
            return 0
        if self.graph is None:
            return GiB // 2
        context = self.engine.context(users, ctx)
        per_slot = self.outputs_per_slot
        outputs = None if per_slot is None else min(context.n_batch, context.n_seq * per_slot)
        return self.graph.bytes(context, self.flash_attn, self.cells(context), self.v_copy, outputs,
                                self.state_rows)


class LlamaCppDraftedPool(KVPool):
    """llama-server with a draft model (-md): the model's context and the draft's, each with its cache and its
    compute buffer, for the same slots and cells (`LlamaCpp.speculative_pool`)."""

    def __init__(self, model: LlamaCppPool, draft: LlamaCppPool, notes: list[str]):
        self.model, self.draft, self.notes, self.max_sequences = model, draft, notes, model.max_sequences

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        return self.model.bytes_for(users, ctx) + self.draft.bytes_for(users, ctx)

    def activation_bytes(self, users: int, ctx: int) -> int:
        return self.model.activation_bytes(users, ctx) + self.draft.activation_bytes(users, ctx)


class LlamaCpp(Engine):
    """llama.cpp (`src/llama-context.cpp`, `src/llama-kv-cache.cpp`, `src/llama-kv-cache-iswa.cpp`,
    `src/llama-memory-recurrent.cpp`) as vendored in llama-cpp-python 0.3.36, behind llama-server or
    llama-cpp-python's `Llama()` (`--frontend`)."""

    sequence_limit_reason = "n_seq_max must be <= {limit:,}"
    name = "llama.cpp"
    label = "llama.cpp"
    default_version = "0c1e57098b"
    paged = False
    draft_models = True
    splits_heads = False
    activations_label = "compute buffer"
    reads = frozenset({"memory_fraction", "kv_unified", "swa_full", "ubatch_size", "batch_size", "cache_type_k",
                       "cache_type_v", "flash_attn", "speculative_tokens", "frontend", "lora_adapters"})
    kv_dtypes = ("fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")

    def __init__(self, options: EngineOptions, gpu_name: str | None, gpu_bytes: int | None, tp: int, pp: int,
                 dp: int = 1, ep: int = 1):
        super().__init__(options, gpu_name, gpu_bytes, tp, pp, dp, ep)
        self.frontend = LLAMA_CPP_FRONTENDS[options.frontend or "server"]
        self.unified = options.kv_unified if options.kv_unified is not None else self.frontend.kv_unified
        self.swa_full = options.swa_full if options.swa_full is not None else self.frontend.swa_full
        self.n_batch = options.batch_size or self.frontend.n_batch
        self.n_ubatch = options.ubatch_size or self.frontend.n_ubatch
        self.flash_attn = options.flash_attn or self.frontend.flash_attn
        for flag, name in (("--cache-type-k", options.cache_type_k), ("--cache-type-v", options.cache_type_v)):
            if name is not None:
                try:
                    dtype = kv_dtype(name)
                except KvplanError as err:
                    raise KvplanError(f"{flag}: {err}") from None
                self.check_kv_dtype(dtype, flag)

    def weight_shares(self, model: ModelSpec) -> dict[str, Fraction]:
        """As any engine's, but for the token embeddings of a model with an output layer of its own: llama.cpp
        keeps its input layer in host memory (`dev_input` is the CPU in `llama_model::load_tensors`,
        src/llama-model.cpp: little is gained by offloading it). A model that ties them gets a copy on the GPU as
        its output layer (TENSOR_DUPLICATED), so its embeddings count there."""
        shares = super().weight_shares(model)
        if not model.params.tied:
            shares["embedding"] = Fraction(0)
        return shares

    def check_kv_dtype(self, dtype: DType, flag: str = "--kv-dtype") -> None:
        if dtype.name not in self.kv_dtypes:
            raise KvplanError(f"llama.cpp has no {dtype.name} KV cache ({flag}): it offers f32, f16, bf16, q8_0, "
                              "q4_0, q4_1, q5_0, q5_1, iq4_nl")

    def default_kv_dtype(self, model: ModelSpec) -> str:
        return "fp16"  # --cache-type-k/-v default f16, whatever the weights

    def cache_types(self, kv: DType) -> tuple[DType, DType]:
        """(K, V) cache types: --cache-type-k and --cache-type-v, each defaulting to --kv-dtype (else f16)."""
        k, v = self.options.cache_type_k, self.options.cache_type_v
        return (kv_dtype(k) if k else kv), (kv_dtype(v) if v else kv)

    def default_fraction(self) -> float:
        return 1.0

    def on_metal(self) -> bool:
        """Whether the GPU is Apple silicon, which llama.cpp runs on through its Metal backend."""
        return self.gpu_vendor() == "apple"

    def overhead(self) -> Overhead:
        """CUDA context 0.5 GiB; the compute buffer grows with the context and is the pool's (`LlamaCppGraph`). On
        Metal none: there is no CUDA context, and the Metal backend (ggml/src/ggml-metal) allocates nothing of
        its own beside the buffers it is asked for (weights, cache, compute buffer) but a 1-byte buffer that keeps
        its residency sets alive; the budget is already Metal's recommendedMaxWorkingSetSize."""
        return Overhead() if self.on_metal() else Overhead(cuda_context=GiB // 2)

    def context(self, users: int, ctx: int) -> LlamaCppContext:
        requested = users * ctx
        n_ctx = pad(requested, LLAMA_CPP_PAD)
        kv_size = n_ctx if self.unified else pad(n_ctx // users, LLAMA_CPP_PAD)
        n_batch = min(requested, self.n_batch)
        return LlamaCppContext(n_seq=users, n_ctx=n_ctx if self.unified else kv_size * users, kv_size=kv_size,
                               streams=1 if self.unified else users, n_batch=n_batch,
                               n_ubatch=min(n_batch, self.n_ubatch))

    def resolve_flash_attn(self, model: ModelSpec, k: DType, v: DType) -> bool:
        """-fa on/off as given; auto (llama_init_from_model, `llama_context::resolve_fused_ops`): on for a quantised
        V cache, else on where the backend runs flash attention for every layer: Metal's kernels on Apple GPUs
        (`METAL_FLASH_ATTN_HEADS`), else CUDA's (`CUDA_FLASH_ATTN_HEADS`; the CPU backend runs every head size)."""
        if self.flash_attn != "auto":
            return self.flash_attn == "on"
        if v.block_elements > 1:
            return True
        if self.on_metal():
            return k == v and k.name in METAL_FLASH_ATTN_TYPES and all(
                heads[0] in METAL_FLASH_ATTN_HEADS and heads[1] <= heads[0] and (heads[0] != 72 or heads[1] == 72)
                for heads in map(head_sizes, distinct_caches(model.caches)) if heads is not None)
        for c in distinct_caches(model.caches):
            heads = head_sizes(c)
            if heads is None or (heads[0] == heads[1] and heads[0] in CUDA_FLASH_ATTN_HEADS):
                continue
            gqa = model.num_attention_heads // getattr(c, "kv_heads", 1)
            multiple = CUDA_FLASH_ATTN_GQA.get(heads)
            if multiple is None or gqa < 2 or gqa % multiple:
                return False
        return True

    def check_model_kv(self, model: ModelSpec, kv: DType) -> None:
        self.check_cache_types(model, *self.cache_types(kv))

    def check_cache_types(self, model: ModelSpec, k: DType, v: DType) -> None:
        """llama_init_from_model's refusals (src/llama-context.cpp), in its words, for K cache `k` and V cache
        `v`."""
        flash_attn = self.resolve_flash_attn(model, k, v)
        mla = any(c.kind == "mla" for c in distinct_caches(model.caches))
        if mla and k != v:
            raise KvplanError(f"llama.cpp: model does not support different K ({ggml_name(k)}) and V "
                              f"({ggml_name(v)}) cache types: {model.name} caches an MLA latent, K only")
        if v.block_elements > 1 and not flash_attn:
            raise KvplanError(f"llama.cpp: quantized V cache requires flash_attn to be enabled (V cache "
                              f"{ggml_name(v)}, --flash-attn {self.flash_attn}): give --flash-attn on or auto")
        if self.flash_attn == "off":
            self.check_k_rows(model, k)
            return
        for i, (name, dtype) in enumerate((("K", k), ("V", v))):
            for head in sorted({head_sizes(c)[i] for c in distinct_caches(model.caches) if head_sizes(c)}):
                if head % dtype.block_elements:
                    raise KvplanError(f"llama.cpp: {name} cache type {ggml_name(dtype)} with block size "
                                      f"{dtype.block_elements} does not divide n_embd_head_{name.lower()}={head} "
                                      f"({model.name})")

    @staticmethod
    def check_k_rows(model: ModelSpec, k: DType) -> None:
        """With --flash-attn off llama_init_from_model checks no head size, and `llama_kv_cache` makes each
        layer's K tensor [n_embd_k_gqa, kv_size, streams] and a view of it per stream (src/llama-kv-cache.cpp):
        a row that is not whole blocks of the K type (KV heads x head size) gets a stride of whole blocks shorter
        than the row, the view overruns the tensor, and ggml aborts (GGML_ASSERT(data_size + view_offs <=
        ggml_nbytes(view_src)) in ggml_new_tensor_impl, ggml/src/ggml.c). 8 KV heads of 80 (640 elements, 20
        blocks of 32) are made; one of 80 is not. V needs no check: a quantised V cache needs flash attention,
        whose head-size check is stricter."""
        for c in distinct_caches(model.caches):  # the first layer of each kind: the first that fails
            heads = head_sizes(c)
            if heads is None:
                continue
            row = getattr(c, "kv_heads", 1) * heads[0]
            if row % k.block_elements:
                raise KvplanError(f"llama.cpp: K cache type {ggml_name(k)} with block size {k.block_elements} does "
                                  f"not divide the K row of layer {c.layer} ({getattr(c, 'kv_heads', 1)} KV heads x "
                                  f"{heads[0]} = {row:,}): with --flash-attn off llama.cpp aborts making the cache "
                                  f"(GGML_ASSERT in ggml_new_tensor_impl) ({model.name})")

    compressed_attention = "llama.cpp 0c1e57098b keeps it in a cache of its own, src/llama-kv-cache-dsv4.cpp"

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> LlamaCppPool:
        drafts = self.options.speculative_tokens or 0
        return self.context_pool(layers, model, *self.cache_types(kv), drafts, self.outputs_per_slot(drafts))

    def outputs_per_slot(self, drafts: int) -> int | None:
        """The model's context's outputs a slot: llama-server verifies a step's `drafts` and the token before them
        (`common_speculative_get_output_limits`: 1 + the draft tokens), Llama() every token (None)."""
        return 1 + drafts if self.frontend.limits_outputs else None

    def speculative_pool(self, layers: Layers, draft_layers: Layers, draft: ModelSpec | None, model: ModelSpec,
                         kv: DType) -> LlamaCppDraftedPool:
        """llama-server -md: beside the model's context, the draft model gets a context of its own
        (`common_speculative_init_result`, common/speculative.cpp), made from the server's parameters
        (`common_base_params_to_speculative`): the model's n_ctx (llama_n_ctx of its context, so as many cells per
        stream), slots, unified or per-slot cache, --swa-full, batch sizes and flash attention, with the draft's
        own cache types (-ctkd/-ctvd, default f16; kvplan takes the default), n_rs_seq 0 and one output per slot
        (n_outputs_max = -np). So the draft's cache and compute buffer are sized by the rules of any context, on
        the draft's layers. The draft-simple speculator asks the model's context for no rollback rows
        (`need_n_rs_seq`: MTP, EAGLE3 and DFlash drafts only), so its recurrent layers keep one row a sequence."""
        if self.frontend.max_sequences == 1:
            raise KvplanError("llama-cpp-python's Llama() makes no draft context (its draft_model is a prompt-lookup "
                              "proposer): a --draft-model is llama-server's -md, --frontend server")
        f16 = kv_dtype("fp16")
        drafts = self.options.speculative_tokens or LLAMA_CPP_DRAFT_MAX
        target = self.context_pool(layers, model, *self.cache_types(kv), 0, self.outputs_per_slot(drafts))
        drafted = self.context_pool(draft_layers, draft, f16, f16, 0, outputs_per_slot=1)
        notes = [*target.notes, f"draft context for {draft.name}: the model's cells and slots, f16 K and V (-ctkd, "
                                f"-ctvd), flash attention {'on' if drafted.flash_attn else 'off'}, one output a slot"]
        return LlamaCppDraftedPool(target, drafted, notes)

    def context_pool(self, layers: Layers, model: ModelSpec, k: DType, v: DType, rollback_rows: int,
                     outputs_per_slot: int | None) -> LlamaCppPool:
        """The cache and compute buffer of one llama_context on `model`'s `layers`: K cache `k`, V cache `v`,
        n_rs_seq `rollback_rows` where the architecture rolls its recurrent state back, n_outputs_max
        `outputs_per_slot` a slot (`LlamaCppPool`)."""
        self.refuse_compressed_attention(model)
        self.check_cache_types(model, k, v)
        flash_attn = self.resolve_flash_attn(model, k, v)
        # a GGUF's windows are llama.cpp's already: kvplan.sources.gguf_model reads its hparams as llama.cpp does
        from_gguf = model.checkpoint is not None and model.checkpoint.format == "gguf"
        ignores_swa = not from_gguf and model.architecture not in LLAMA_CPP_SWA
        # With flash attention off (-fa off, not auto: the cache is made before auto is resolved) V is stored
        # transposed, each layer's row as wide as the widest layer's (n_embd_v_gqa_max, [TAG_V_CACHE_VARIABLE] in
        # src/llama-kv-cache.cpp).
        v_width = None if self.flash_attn != "off" else max(
            (c.kv_heads * c.head_dim_v for c in distinct_caches(model.caches) if c.kind in ("full", *WINDOWED)),
            default=None)
        table = llama_cpp_rows(layers, k, v, v_width, ignores_swa)
        rollback = model.architecture in LLAMA_CPP_RS_ROLLBACK
        n_rs_seq = rollback_rows if rollback else 0
        notes = [f"{self.frontend.label}: {'unified' if self.unified else 'per-slot'} cache, n_ctx padded to "
                 f"{LLAMA_CPP_PAD}, n_ubatch {self.n_ubatch}, flash attention {'on' if flash_attn else 'off'}"
                 + (" (auto)" if self.flash_attn == "auto" else "")]
        if k != v:
            notes.append(f"K cache {ggml_name(k)}, V cache {ggml_name(v)}")
        if not model.params.tied and model.params.embedding:
            notes.append("token embeddings stay in host memory (llama.cpp keeps the input layer on the CPU): not in "
                         "the weights per GPU")
        if ignores_swa and any(cache.kind in WINDOWED for cache, _ in layers):
            notes.append(f"llama.cpp's {model.architecture} graph keeps no sliding window: every layer's cache is "
                         "full")
        recurrent = [r for r in table if r.kind == "recurrent"]
        if recurrent and rollback_rows:
            notes.append(f"recurrent state: {1 + n_rs_seq} rows per sequence (n_rs_seq {n_rs_seq})" if rollback else
                         f"llama.cpp keeps no rollback states for {model.architecture} (n_rs_seq clamped to 0)")
        graph = LlamaCppGraph(model, table) if model.widths else None
        if graph is None:
            notes.append("compute buffer: a flat 0.5 GiB (the model spec gives no forward widths)")
        # auto resolved off: the untransposed V is copied transposed for each layer's attention (llama-graph.cpp)
        v_copy = v.block_bytes if self.flash_attn == "auto" and not flash_attn else 0
        return LlamaCppPool(self, table, sum(r.count * r.state_bytes for r in recurrent), 1 + n_rs_seq, flash_attn,
                            v_copy, graph, notes, outputs_per_slot)

    def lora_slots(self, model: ModelSpec) -> LoraSlots | None:
        """--lora: every adapter file is loaded whole at start-up, each pair in the buffer of the tensor it changes
        (`llama_adapter_lora_init`, src/llama-adapter.cpp; no slots and nothing preallocated: an adapter of scale 0
        takes its memory too). With every layer on the GPU that is the GPU for all but the token embeddings' pair,
        which stays in host memory with the embeddings (the input layer is kept on the CPU, `dev_input`); split
        over --pp GPUs as the weights are. llama.cpp
        refuses an adapter of another architecture ("model arch and LoRA arch mismatch"), which kvplan checks where
        the model is a GGUF file (its general.architecture)."""
        adapters = self.options.lora_adapters
        if not adapters:
            return None
        gguf_arch = model.architecture if model.checkpoint and model.checkpoint.format == "gguf" else None
        for adapter in adapters:
            if gguf_arch and adapter.architecture != gguf_arch:
                raise KvplanError(f"llama.cpp: model arch and LoRA arch mismatch: {adapter.name} is for "
                                  f"{adapter.architecture or 'no architecture'}, {model.name} is {gguf_arch}")
        return LoraSlots(slots=len(adapters), rank=max(a.rank for a in adapters), dtype="as stored",
                         gpu_bytes=cdiv(sum(a.device_bytes for a in adapters), self.pp),
                         host_bytes=sum(a.host_bytes for a in adapters))

    def assumptions(self, uses_fraction: bool = True) -> list[str]:
        if self.frontend.max_sequences == 1:
            lines = [f"front end {self.frontend.label}: one sequence per instance (n_seq_max 1)"]
        else:
            lines = [f"front end {self.frontend.label}, -np = users, at most {LLAMA_MAX_SEQ} per server "
                     "(LLAMA_MAX_SEQ, src/llama-cparams.h)"]
        if self.options.frontend in (None, "server") and self.options.kv_unified is None:
            lines.append("slots share one unified cache (-kvu; llama-server's default with -np auto, else give -kvu)")
        if self.flash_attn == "auto" and self.on_metal():
            lines.append("--flash-attn auto resolved as Metal does (on where its kernels take the head sizes and "
                         "cache types)")
        elif self.flash_attn == "auto":
            lines.append("--flash-attn auto resolved as CUDA does (on where its kernels take the head size)")
        if self.on_metal():
            lines.append("Metal: no CUDA context, and no memory the Metal backend keeps beside its buffers; what "
                         "macOS keeps outside recommendedMaxWorkingSetSize is not known to kvplan")
        return lines


def head_sizes(cache: LayerCache) -> tuple[int, int] | None:
    """(n_embd_head_k, n_embd_head_v) of an attention layer as llama.cpp sees it (MLA: the latent and its RoPE
    part as K, the latent as V); None for a layer without attention."""
    if cache.kind in ("full", *WINDOWED, "cross"):
        return cache.head_dim, cache.head_dim_v
    if cache.kind == "mla":
        return cache.latent_dim + cache.rope_dim, cache.latent_dim
    return None


def ggml_name(dtype: DType) -> str:
    """The name llama.cpp gives a cache type (f16, not fp16)."""
    return {"fp32": "f32", "fp16": "f16"}.get(dtype.name, dtype.name)


def llama_cpp_rows(layers: Layers, k: DType, v: DType, v_width: int | None, ignores_swa: bool) -> list[Row]:
    """A GPU's caches as llama.cpp stores them: keys in `k`, values in `v`, each value row `v_width` elements wide
    where given; recurrent state, convolution and SSM alike, in f32 whatever the config says (GGML_TYPE_F32 in
    `llama_model::create_memory`)."""
    out = []
    for row in rows(layers, k, kv_dtype("fp32"), sliding_as_full=ignores_swa):
        cache = row.cache
        if cache.kind in ("full", "sliding", "chunked", "cross"):
            per_token = k.bytes_for(cache.kv_heads * cache.head_dim) + v.bytes_for(
                v_width or cache.kv_heads * cache.head_dim_v)
            row = row._replace(bytes_per_token=per_token)
        elif cache.kind == "recurrent":
            row = row._replace(state_bytes=4 * (cache.conv_elements + cache.ssm_elements))
        out.append(row)
    return out
