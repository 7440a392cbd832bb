"""Speculative decoding and LoRA: the speculative method and draft tokens as the engine resolves them, and what a
draft and adapters add to each GPU of a deployment."""

from dataclasses import dataclass, field

from kvplan import engines
from kvplan.capacity.layout import check_parallel, gpu_layers, weights_on_gpu
from kvplan.dtypes import weight_dtype
from kvplan.engines import Engine, EngineOptions, LoraSlots
from kvplan.errors import KvplanError
from kvplan.memory import weights_from_checkpoint
from kvplan.model import ModelSpec, Parallelism

DRAFTED = ("draft_model", "eagle", "eagle3")  # the methods whose draft is --draft-model


@dataclass
class DraftAndAdapters:
    """What a speculative decoder and LoRA adapters add to each GPU of a deployment: the draft's weights and its
    layers' caches (`draft_layers`, as `gpu_layers` gives them), the LoRA slots."""

    method: str | None = None
    tokens: int | None = None
    draft: ModelSpec | None = None  # the draft model, or the MTP layers as one
    draft_name: str | None = None
    draft_weights_per_gpu: int = 0
    draft_layers: list = field(default_factory=list)
    lora: LoraSlots | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_bytes(self) -> int:
        return self.draft_weights_per_gpu + (self.lora.gpu_bytes if self.lora else 0)


def speculation_options(model: ModelSpec, draft: ModelSpec | None, engine_name: str, options: EngineOptions,
                        parallel: Parallelism) -> EngineOptions:
    """The engine options with the speculative method and its draft tokens K resolved as vLLM's
    `SpeculativeConfig` resolves them: a --draft-model means method draft_model unless eagle or eagle3 is given
    (its EAGLE head); mtp runs the checkpoint's own MTP layers and K defaults to their count (n_predict), which a
    larger K must be a multiple of; the others need K. Under llama.cpp --speculative-tokens stays its own setting
    (recurrent rollback rows)."""
    method, tokens = options.speculative_method, options.speculative_tokens
    engine_class = engines.engine_class(engine_name)
    if model.eagle is not None:
        raise KvplanError(f"{model.name} is an EAGLE draft head ({model.eagle.architecture}), not a model to serve: "
                          "give it as --draft-model with --speculative-method eagle or eagle3")
    if draft is not None and engine_class.draft_models:  # llama-server -md: --speculative-tokens is its own
        return llama_cpp_draft(model, draft, parallel, options)
    if draft is not None:
        if not engine_class.speculative_methods:
            raise KvplanError(f"kvplan does not size {engine_class.label}'s speculative-decoding drafts: "
                              "--draft-model is for --engine vllm, sglang or llama.cpp")
        if method not in (None, *DRAFTED):
            raise KvplanError(f"--draft-model is the draft of --speculative-method draft_model, eagle or eagle3, not "
                              f"{method}")
        method = method or "draft_model"
        if draft.eagle is not None and method == "draft_model":
            raise KvplanError(f"--draft-model {draft.name} is an EAGLE draft head ({draft.eagle.architecture}): give "
                              "--speculative-method eagle or eagle3")
    if not engine_class.speculative_methods:  # llama.cpp's --speculative-tokens is its own; the engine refuses the rest
        return options
    if method is None:
        if tokens is not None:
            raise KvplanError(f"--speculative-tokens: {engine_class.label} speculates with a draft: give --draft-model "
                              "or --speculative-method mtp or ngram")
        return options
    if method in DRAFTED and draft is None:
        raise KvplanError(f"--speculative-method {method} needs --draft-model"
                          + (", the EAGLE head's config" if method != "draft_model" else ""))
    if parallel.pp > 1:
        raise KvplanError("kvplan sizes speculative decoding on one pipeline stage: give --pp 1")
    if method == "mtp":
        from kvplan.sources.hf_config.mtp import MTP_FAMILIES

        if model.mtp is None:
            raise KvplanError(f"--speculative-method mtp: kvplan reads no MTP layers in {model.name} (it reads those "
                              f"of {MTP_FAMILIES} checkpoints that state them)")
        layers = model.mtp.layers
        if tokens is None and engine_name == "vllm":
            tokens = layers  # SpeculativeConfig: "Default to max value defined in draft model config"
        if tokens is not None and tokens > layers and tokens % layers:
            raise KvplanError(f"--speculative-tokens {tokens} must be a multiple of the {layers} MTP layers "
                              "(vLLM: num_speculative_tokens must be divisible by n_predict)")
    if not tokens:
        raise KvplanError(f"--speculative-method {method} needs --speculative-tokens, the draft tokens per step "
                          "(vLLM num_speculative_tokens, SGLang --speculative-num-draft-tokens), at least 1")
    if method == "draft_model" and draft.vocab_size != model.vocab_size:
        sizes = (f"{model.vocab_size:,} and {draft.vocab_size:,}" if draft.vocab_size and model.vocab_size
                 else "one of them unknown")
        raise KvplanError(f"--draft-model {draft.name}: target and draft model should have the same vocabulary size "
                          f"({sizes}), as vLLM's SpeculativeConfig requires")
    return options.model_copy(update={"speculative_method": method, "speculative_tokens": tokens})


def llama_cpp_draft(model: ModelSpec, draft: ModelSpec, parallel: Parallelism,
                    options: EngineOptions) -> EngineOptions:
    """llama-server's -md draft model: one that shares the model's vocabulary (the draft-simple speculator refuses
    vocabularies whose sizes differ by more than 128, `common_speculative_are_compatible`) on one GPU; its
    tokens a step are --spec-draft-n-max (--speculative-tokens, default 3)."""
    if draft.eagle is not None:
        raise KvplanError(f"--draft-model {draft.name} is an EAGLE head: kvplan sizes llama.cpp's draft models (-md), "
                          "not its EAGLE3 drafts")
    if parallel.pp > 1:
        raise KvplanError("kvplan sizes llama.cpp's draft context on one GPU: give --pp 1 (--gpus 1)")
    if not (model.vocab_size and draft.vocab_size):
        raise KvplanError(f"--draft-model {draft.name}: kvplan needs both vocabulary sizes to check that llama.cpp "
                          "takes the draft")
    if abs(model.vocab_size - draft.vocab_size) > engines.LLAMA_CPP_VOCAB_DIFFERENCE:
        raise KvplanError(f"llama.cpp: the target and draft vocabs are not compatible ({model.vocab_size:,} and "
                          f"{draft.vocab_size:,} tokens: they may differ by {engines.LLAMA_CPP_VOCAB_DIFFERENCE} at "
                          "most)")
    return options


def draft_and_adapters(model: ModelSpec, draft: ModelSpec | None, engine: Engine, parallel: Parallelism,
                       weights_dtype_name: str | None) -> DraftAndAdapters:
    """The draft's weights and layers on each GPU, and the LoRA slots.

    The draft shards like the model: vLLM's draft_tensor_parallel_size defaults to the model's TP and takes no
    other value but 1, which its draft-model proposer refuses beside a larger TP ("must be the same",
    v1/spec_decode/draft_model.py), while EAGLE and MTP heads are built on the model's TP group. A draft model
    loads in the model's dtype (`SpeculativeConfig`: dtype=target_model_config.dtype), unquantised unless its own
    checkpoint is; MTP layers follow the model's quantisation, --weights-dtype included ("Align the quantization
    of draft model"). An EAGLE head is built by the engine around its layers, in the model's dtype, parts of it
    whole on every GPU (`Engine.eagle_head`)."""
    extras = DraftAndAdapters(lora=engine.lora_slots(model))
    method, tokens = engine.options.speculative_method, engine.options.speculative_tokens
    if draft is not None and engine.draft_models:
        method, tokens = "draft_model", tokens or engines.LLAMA_CPP_DRAFT_MAX
    if method is None:
        return extras
    extras.method, extras.tokens = method, tokens
    if method == "ngram":
        extras.draft_name = "n-gram lookup (no draft weights or cache)"
        return extras
    if method == "mtp":
        mtp = model.mtp
        runner = model.model_copy(update={
            "name": f"{model.name} MTP", "num_layers": mtp.layers, "params": mtp.params, "checkpoint": None,
            "caches": tuple(c.model_copy(update={"layer": c.layer - model.num_layers}) for c in mtp.caches),
            "mtp": None})
        extras.draft_name = f"{model.name}'s {mtp.layers} MTP layer{'s' if mtp.layers > 1 else ''}"
        draft_dtype = weights_dtype_name
        counted = weights_from_checkpoint(model, weights_dtype_name)
        if counted:
            extras.notes.append("the checkpoint's tensors, counted in the weights, hold the MTP layers")
    else:
        runner, counted = draft, False
        engine.check_caches(draft)
        compute = engine.default_weights_dtype(model) or model.dtype
        # llama.cpp loads the draft's GGUF as it is; vLLM and SGLang a draft in the model's dtype, unless quantised
        keep = engine.draft_models or draft.quantization or draft.dtype == compute
        draft_dtype = None if keep else compute
        extras.draft_name = draft.name
    try:
        check_parallel(runner, parallel.tp, 1)
    except KvplanError as err:
        raise KvplanError(f"the draft {runner.name}: {err}") from None
    extras.draft = runner
    if method in ("eagle", "eagle3"):  # the engine builds the head around its layers, some parts whole on every GPU
        head = engine.eagle_head(model, draft, method)
        extras.draft_weights_per_gpu = weight_dtype(compute).bytes_for(head.elements) + 8 * head.int64
        extras.notes += head.notes
    elif not counted:  # split as the engine splits the model's own groups: norms and routers whole on each GPU
        extras.draft_weights_per_gpu = weights_on_gpu(runner, engine, draft_dtype)[1]
    extras.draft_layers = gpu_layers(engine.cached_layers(runner), [runner.num_layers], parallel.tp)[0]
    return extras
