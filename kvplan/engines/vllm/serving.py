"""What vLLM serves beside the KV cache, as vLLM 0.33.0 allocates it: a multimodal model's encoder cache and its
tower (v1/worker/gpu/mm/encoder_runner.py, `MultiModalBudget`), the KV offloading buffer, EAGLE heads
(transformers_utils/configs/eagle.py, models/llama_eagle.py, llama_eagle3.py) and LoRA slots (vllm/lora/layers).
The engine's answers to `serving_extras`, `eagle_head` and `lora_slots` are these functions, given the engine for
its options and batch defaults."""

from typing import TYPE_CHECKING

from kvplan.dtypes import kv_dtype
from kvplan.engines.base import FLAG_NAMES, WINDOWED, EagleHeadWeights, GiB, LoraSlots, ServingExtras
from kvplan.engines.speculative import eagle1_fields, eagle_reads, eagle_shape
from kvplan.errors import KvplanError
from kvplan.model import EagleHead, ModelSpec, MultimodalInput

if TYPE_CHECKING:
    from kvplan.engines.vllm.engine import Vllm


def mm_limits(engine: "Vllm", model: ModelSpec) -> dict[str, int]:
    """Items allowed per prompt for each of the model's modalities (`MultiModalConfig.get_limit_per_prompt`): 0
    with --language-model-only, else --limit-mm-per-prompt's count, 999 where it names none."""
    given = dict(engine.options.limit_mm_per_prompt or ())
    mm = model.multimodal
    if mm is None and (given or engine.options.language_model_only):
        raise KvplanError(f"--limit-mm-per-prompt and --language-model-only are for multimodal models: "
                          f"{model.name} takes text only")
    unknown = sorted(set(given) - set(mm.modalities)) if mm and mm.modalities else []
    if unknown:
        raise KvplanError(f"--limit-mm-per-prompt: {model.name} takes no {', '.join(unknown)} (it takes "
                          f"{', '.join(mm.modalities)})")
    if engine.options.language_model_only:
        return dict.fromkeys(mm.modalities, 0)
    return {m: given.get(m, 999) for m in (mm.modalities if mm else ())}


# Model types (the text decoder's) that vLLM runs attending bidirectionally within an image (`is_mm_prefix_lm`:
# MM_PREFIX_LM_MODELS in transformers_utils/model_arch_config_convertor.py, models/gemma3_mm.py): the platform
# then forces disable_chunked_mm_input (platforms/cuda.py and rocm.py `check_and_update_config`), so one item
# must fit in one batch (`compute_mm_encoder_budget` raises otherwise).
MM_PREFIX_LM = frozenset({"gemma3_text"})


def serving_extras(engine: "Vllm", model: ModelSpec, tower_bytes: int, max_len: int) -> ServingExtras:
    """A multimodal model's inputs (vLLM 0.33.0) and the KV offloading buffer.

    Text-only (--language-model-only, or --limit-mm-per-prompt 0 for every modality the tower encodes): the tower
    is not built (`SupportsMultiModal._mark_tower_model`) and the encoder is not profiled.
    Otherwise the start-up profile (`GPUModelRunner.profile_run`, v1/worker/gpu/mm/encoder_runner.py
    `profile_encoder_cache`) encodes a batch of the largest items and keeps their outputs through the decoder's
    dummy forward, so its peak holds, with T the largest item's embedding rows and M max_num_batched_tokens:
        budget = max(M, T)                 (`compute_mm_encoder_budget`: encoder compute budget and encoder cache
                                            size both default to M, `SchedulerConfig`)
        items  = max(1, min(budget // T, max_num_seqs x max(1, min(limit, L // T))))   (`MultiModalBudget`)
        encoder cache = items x T x hidden x dtype bytes     (embedding rows of the decoder's width)
    The encoder's own forward over that batch is not modelled (a note says so)."""
    notes, overhead, dropped = [], {}, 0
    mm = model.multimodal
    limits = mm_limits(engine, model)
    if mm is not None:
        text_only = bool(mm.modalities) and all(limits[m] == 0 for m in mm.modalities)
        if mm.tower_modalities and all(limits[m] == 0 for m in mm.tower_modalities):
            dropped = tower_bytes
            notes.append(f"text-only: vLLM does not load the vision tower ({tower_bytes / GiB:,.2f} GiB)")
        if text_only:
            notes.append("text-only: no encoder cache and no multimodal profile run")
        elif mm.tokens_per_item is None or limits[mm.item_modality] == 0:
            notes.append(f"vLLM's encoder cache and multimodal profile run for {model.architecture} are not "
                         "counted (kvplan does not know its tokens per item); --language-model-only drops them")
        else:
            overhead["mm_encoder_cache"] = encoder_cache(engine, model, mm, limits[mm.item_modality], max_len,
                                                         notes)
    elif model.params.vision:
        notes.append(f"vLLM's encoder cache and multimodal profile run for {model.architecture} are not counted")
    offload = engine.options.kv_offloading_size or 0
    if engine.options.kv_offloading_size == 0 or (engine.options.kv_offloading_backend and not offload):
        raise KvplanError("--kv-offloading-size must be more than 0: vLLM offloads KV only when it is set, and "
                          "--kv-offloading-backend chooses where")
    if offload:
        backend = engine.options.kv_offloading_backend or "native"
        notes.append(f"KV offloading ({backend}): {offload / GiB:,.2f} GiB of host memory holds KV blocks "
                     "for prefix-cache hits; it adds no concurrent users" + (
                         " (LMCache's own server sizes it: kvplan counts what --kv-offloading-size says)"
                         if backend == "lmcache" else ""))
    return ServingExtras(tower_not_loaded=dropped, overhead=overhead, kv_offload_bytes=offload, notes=notes)


def encoder_cache(engine: "Vllm", model: ModelSpec, mm: MultimodalInput, limit: int, max_len: int,
                  notes: list[str]) -> int:
    tokens, batched = mm.tokens_per_item, engine.max_num_batched_tokens()
    if model.architecture in MM_PREFIX_LM and tokens > batched:
        raise KvplanError(f"vLLM: Chunked MM input disabled but max_tokens_per_mm_item ({tokens}) is larger than "
                          f"max_num_batched_tokens ({batched}): give --max-num-batched-tokens >= {tokens}")
    budget = max(batched, tokens)
    per_prompt = max(1, min(limit, max_len // tokens))
    items = max(1, min(budget // tokens, engine.max_num_seqs() * per_prompt))
    dtype = kv_dtype("bf16" if engine.loads_in_bf16(model) else model.dtype)
    size = items * tokens * mm.embedding_width * dtype.bytes_for(1)
    notes.append(f"encoder cache: vLLM's start-up profile encodes {items} {mm.item_modality}s of {tokens:,} "
                 f"embedding rows ({mm.basis}) and holds their {items * tokens:,} rows of "
                 f"{mm.embedding_width:,} ({dtype.name}) through the decoder's profile; the vision encoder's own "
                 "activations are not modelled; --language-model-only drops it")
    return size


def eagle_head(engine: "Vllm", model: ModelSpec, head: ModelSpec, method: str) -> "EagleHeadWeights":
    """vLLM 0.33.0 builds the class `vllm_eagle_class` names (EagleLlamaForCausalLM, llama_eagle.py, for eagle;
    Eagle3LlamaForCausalLM, llama_eagle3.py, for eagle3) in the model's dtype, split like the model (its
    draft_tensor_parallel_size). With h the head's hidden size, on each GPU:
        EAGLE    its layers (`EagleShape.linear_elements`), their norms but layer 0's input norm (2 h a layer
                 - h, no final norm), fc 2 h x h (`ReplicatedLinear`: whole on every GPU)
        EAGLE-3  its layers with layer 0's qkv reading 2 h, 3 norms a layer (hidden_norm too) and a final one,
                 fc A x T x h whole (A = num_aux_hidden_states, default 3; T = target_hidden_size, default
                 h; none without use_aux_hidden_state), an RMSNorm of A x T with norm_before_fc and A of T with
                 fc_norm, its own lm_head of draft_vocab_size rows (default vocab_size), and draft_id_to_target_id,
                 draft_vocab_size int64s whole, where draft_vocab_size is not the model's vocabulary
    The embeddings are the model's (`_maybe_share_embeddings`: shared where the head's checkpoint has none or
    the model's own, which EAGLE training keeps frozen, and the widths match), as is an EAGLE head's lm_head
    (the class has none of its own: `_maybe_share_lm_head`). An EAGLE-3 head's own lm_head is assumed trained
    (distinct from the model's, as its draft vocabulary makes it)."""
    built = vllm_eagle_class(method, head.eagle.architecture if head.eagle else "LlamaForCausalLM")
    if VLLM_EAGLE_CLASSES.get(built) != method:
        kind = VLLM_EAGLE_CLASSES.get(built)
        raise KvplanError(f"vLLM builds the EAGLE head {head.name} ({head.eagle.architecture}) as {built}, "
                          + (f"an {kind} head: give --speculative-method {kind}" if kind else
                             "a class it does not have (EAGLEConfig, registry.py)"))
    e = head.eagle or EagleHead(architecture="LlamaForCausalLM")
    s, tp = eagle_shape(model, head, engine.tp), engine.tp
    h = s.hidden
    if method == "eagle":
        eagle1_fields(head)
        eagle_reads(model, head, h, "hidden_size")
        return EagleHeadWeights(elements=s.linear_elements(tp, False) + 2 * h * s.layers - h + 2 * h * h,
                                notes=["EAGLE head: embeddings and lm_head are the model's"])
    target = e.target_hidden_size or h
    eagle_reads(model, head, target, "target_hidden_size" if e.target_hidden_size else "hidden_size")
    fused = (e.aux_hidden_states or 3) * target if e.use_aux_hidden_state else 0
    draft_vocab = e.draft_vocab_size or s.vocab
    elements = (s.linear_elements(tp, True) + 3 * h * s.layers + h + fused * h
                + fused * (int(e.norm_before_fc) + int(e.fc_norm)) + s.vocab_rows(draft_vocab, tp))
    own_embeddings = h != model.widths.hidden
    if own_embeddings:
        elements += s.vocab_rows(s.vocab, tp)
    mapped = draft_vocab if draft_vocab != model.vocab_size else 0
    return EagleHeadWeights(elements=elements, int64=mapped, notes=[
        f"EAGLE-3 head: its own lm_head of {draft_vocab:,} tokens"
        + (f" and a {mapped:,}-token map to the model's vocabulary" if mapped else "")
        + (", its own embeddings (not the model's width)" if own_embeddings else ", the model's embeddings")])


def lora_slots(engine: "Vllm", model: ModelSpec) -> "LoraSlots | None":
    """`--enable-lora`: max_loras GPU slots, each holding an adapter of up to max_lora_rank (`LoRAConfig`:
    defaults 1 and 16; ranks 1, 8, 16, 32, 64, 128, 256, 320, 512; max_cpu_loras defaults to max_loras and
    may not be fewer), in the model's dtype (lora_dtype auto). Sizes: `vllm_lora_elements`."""
    o = engine.options
    if not o.enable_lora:
        given = [FLAG_NAMES[f] for f in ("max_loras", "max_lora_rank", "max_cpu_loras")
                 if getattr(o, f) is not None]
        if given:
            raise KvplanError(f"{', '.join(given)} {'size' if len(given) > 1 else 'sizes'} vLLM's LoRA slots: "
                              "add --enable-lora")
        return None
    rank, slots = o.max_lora_rank or 16, o.max_loras or 1
    if rank not in VLLM_LORA_RANKS:
        raise KvplanError(f"vLLM: --max-lora-rank {rank} is not one it allows: "
                          f"{', '.join(map(str, VLLM_LORA_RANKS))} (LoRAConfig MaxLoRARanks)")
    host = o.max_cpu_loras if o.max_cpu_loras is not None else slots
    if host < slots:
        raise KvplanError(f"vLLM: --max-cpu-loras ({host}) must be >= --max-loras ({slots})")
    dtype = kv_dtype("bf16" if engine.loads_in_bf16(model) else model.dtype)
    per_gpu = vllm_lora_elements(model, rank, engine.tp)
    return LoraSlots(slots=slots, rank=rank, dtype=dtype.name, gpu_bytes=slots * dtype.bytes_for(per_gpu),
                     host_bytes=host * dtype.bytes_for(vllm_lora_elements(model, rank, 1)))


# vLLM model classes whose LoRA layers kvplan sizes, by config model_type, and whether the class declares
# `embedding_modules` (LlamaForCausalLM and Qwen3ForCausalLM do, so embed_tokens and lm_head get slots too;
# MistralForCausalLM's is empty and Qwen2ForCausalLM has none): model_executor/models/{llama,qwen3,mistral,qwen2}.py.
VLLM_LORA_EMBEDDINGS = {"llama": True, "qwen3": True, "mistral": False, "qwen2": False}
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # config/lora.py MaxLoRARanks
VLLM_LORA_MAX_VOCAB = 258_048  # LogitsProcessorWithLoRA.create_lora_weights refuses a larger vocabulary


def vllm_lora_elements(model: ModelSpec, rank: int, tp: int) -> int:
    """Elements of one LoRA slot on one GPU of a tp-way group (vllm/lora/layers, `create_lora_weights`, not fully
    sharded): an A of rank x input and a B of output x rank per slice of each linear layer, the column-parallel
    ones' outputs and the row-parallel ones' inputs split by TP. With h hidden, q = heads x head_dim, k = KV
    heads per GPU x head_dim (one head at least), I the MLP width:
        qkv_proj      A 3 x r x h           B (q / tp + 2 k) x r        (MergedQKVParallelLinearWithLoRA)
        o_proj        A r x q / tp          B h x r                     (RowParallelLinearWithLoRA)
        gate_up_proj  A 2 x r x h           B 2 x I / tp x r            (MergedColumnParallelLinearWithLoRA)
        down_proj     A r x I / tp          B h x r
    per layer, and where the class declares embedding_modules, embed_tokens (A vocab x r, B h x r,
    VocabParallelEmbeddingWithLoRA) and lm_head (A r x h, B vocab x r, LogitsProcessorWithLoRA), both whole on
    every GPU."""
    if model.architecture not in VLLM_LORA_EMBEDDINGS:
        raise KvplanError(f"kvplan sizes vLLM's LoRA slots for Llama, Mistral, Qwen2 and Qwen3 models, whose layers "
                          f"it has read in vLLM's source: not {model.architecture} ({model.name})")
    w = model.widths
    attention = {(c.kv_heads, c.head_dim) for c in model.caches if c.kind in ("full", *WINDOWED)}
    if w is None or not w.gated_mlp or w.experts_per_token or len(attention) != 1 or model.vocab_size is None:
        raise KvplanError(f"kvplan cannot size vLLM's LoRA slots for {model.name}: it needs one attention shape, a "
                          "gated MLP without experts, and the vocabulary size")
    ((kv_heads, head_dim),) = attention
    h, q, mlp = w.hidden, model.num_attention_heads * head_dim // tp, w.mlp_intermediate // tp
    k = max(1, kv_heads // tp) * head_dim
    layer = rank * (3 * h + q + 2 * k) + rank * (q + h) + rank * (2 * h + 2 * mlp) + rank * (mlp + h)
    total = model.num_layers * layer
    if VLLM_LORA_EMBEDDINGS[model.architecture]:
        if model.vocab_size > VLLM_LORA_MAX_VOCAB:
            raise KvplanError(f"vLLM: when using LoRA, vocab size must be <= {VLLM_LORA_MAX_VOCAB:,} ({model.name} "
                              f"has {model.vocab_size:,})")
        total += 2 * rank * (model.vocab_size + h)
    return total


# vLLM 0.33.0's EAGLEConfig (transformers_utils/configs/eagle.py) names the class it builds from the head's
# architecture: Eagle{arch} for method eagle unless it starts with Eagle, Eagle3{arch} for eagle3 unless it starts or
# ends with Eagle3; registry.py maps these names to the two Llama EAGLE classes.
VLLM_EAGLE_CLASSES = {"EagleLlamaForCausalLM": "eagle", "Eagle3LlamaForCausalLM": "eagle3",
                      "LlamaForCausalLMEagle3": "eagle3"}


def vllm_eagle_class(method: str, architecture: str) -> str:
    if method == "eagle":
        return architecture if architecture.startswith("Eagle") else f"Eagle{architecture}"
    return architecture if architecture.startswith("Eagle3") or architecture.endswith("Eagle3") else \
        f"Eagle3{architecture}"
