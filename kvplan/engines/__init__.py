"""Serving engines: how each one sizes the KV cache out of the memory it is given.

Every engine answers the capacity planner (`kvplan.capacity`) the same three questions:
    memory fraction and overhead  -> KV budget = GPU memory x fraction - weights - overhead
                                     (TensorRT-LLM: fraction x (GPU memory - weights - overhead))
    `pool(layers, kv)`            -> the KV pool it builds for one GPU's layers; `pool.bytes_for(users, ctx)`
                                     is the memory it needs to serve `users` sequences of `ctx` tokens,
                                     with its own blocks, padding and rounding.
Rules, defaults and the release each belongs to are in docs/engines.md; the facts come from the engines' own
source (vLLM 0.33.0, SGLang 0.5.23, llama.cpp 0c1e57098b, transformers 5.23.0, TensorRT-LLM docs), each rule
naming its file. Engine behaviour never branches on a model's name: it reads the cache kinds of
`kvplan.model`, and where an engine treats a model family specially it keys on `ModelSpec.architecture` here.

One module per engine, split by concern:
    base.py                 what every engine shares: EngineOptions and their flags, `Engine` and `KVPool` (the
                            questions above), the rows a pool is built from, what an engine answers (Overhead,
                            ServingExtras, LoraSlots, EagleHeadWeights), BlockPool (TensorRT-LLM's and ideal's)
    speculative.py          EAGLE heads' shapes and refusals, shared by vLLM and SGLang
    vllm/                   vLLM: the engine, its layer specs, KV cache groups and block pool, its start-up log,
                            the families with layouts of their own, LoRA slots, EAGLE classes (vllm/engine.py)
    sglang.py               SGLang: token pools, hybrid sliding-window pools, the Mamba pool
    llamacpp.py             llama.cpp: contexts, slots and padding, the compute graph, GGML cache types
    transformers_engine.py  transformers: generate()'s caches and prefill activations, and what torch reserves
    transformers_allocations.py  the tensors a transformers run allocates and frees, in order, from the ModelSpec
    cuda_allocator.py       torch's CUDA caching allocator, simulated: what it reserves for a run's allocations
    tensorrt_llm.py         TensorRT-LLM: KvCacheConfig block pools
    ideal.py                ideal: exactly the tokens each layer holds, no engine
    __init__.py             the registry (`engine_class`, `engine`, `default_engine`) and the names callers use

Adding a release rule: a branch on `version_tuple(self.version)` in that engine's module, citing the release and
the engine's source file, and a line in docs/engines.md. Adding an engine: a module with an `Engine` subclass (its
`name`, `label`, `default_version`, the EngineOptions fields it `reads`) and its KVPool, its module and class named
in ENGINES here; what several engines share goes to base.py (EAGLE heads: speculative.py), never one engine module
importing another.
"""

from functools import cache
from importlib import import_module

from kvplan.engines.base import Engine, EngineOptions, KVPool, Layers, LoraSlots, ServingExtras, cdiv, no_data_parallel
from kvplan.errors import KvplanError

# Each engine by name: its module and class. A module is imported when its engine is first asked for, so a run
# under one engine (a `kvplan table` sweep under vLLM) loads no other's rules.
ENGINES: dict[str, tuple[str, str]] = {
    "vllm": ("vllm.engine", "Vllm"), "sglang": ("sglang", "Sglang"), "llama.cpp": ("llamacpp", "LlamaCpp"),
    "transformers": ("transformers_engine", "Transformers"), "tensorrt-llm": ("tensorrt_llm", "TensorRtLlm"),
    "ideal": ("ideal", "Ideal")}
# Names of engine modules that callers import from kvplan.engines, each loaded with its module on first use.
ENGINE_NAMES = {cls: module for module, cls in ENGINES.values()} | {
    "VllmGroup": "vllm.specs", "VllmPool": "vllm.pool", "approximate_gcd": "vllm.grouping",
    "LLAMA_CPP_DRAFT_MAX": "llamacpp", "LLAMA_CPP_VOCAB_DIFFERENCE": "llamacpp",
    "PrefillActivations": "transformers_engine", "transformers_state": "transformers_engine"}

__all__ = ["ALIASES", "ENGINES", "Engine", "EngineOptions", "KVPool", "Layers", "LoraSlots", "ServingExtras", "cdiv",
           "default_engine", "engine", "engine_class", "no_data_parallel", *ENGINE_NAMES]


def __getattr__(name: str):
    """An engine module's name (ENGINE_NAMES), imported with its module (PEP 562)."""
    if name not in ENGINE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"kvplan.engines.{ENGINE_NAMES[name]}"), name)


ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "trtllm": "tensorrt-llm",
           "trt-llm": "tensorrt-llm", "hf": "transformers"}


def engine_class(name: str) -> type[Engine]:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in ENGINES:
        raise KvplanError(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}")
    return _loaded(key)


@cache
def _loaded(key: str) -> type[Engine]:
    """The engine class, its module imported on first use (a sweep builds an engine per deployment)."""
    module, cls = ENGINES[key]
    return getattr(import_module(f"kvplan.engines.{module}"), cls)


def engine(name: str, options: EngineOptions, gpu_name: str | None = None, gpu_bytes: int | None = None,
           tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1) -> Engine:
    return engine_class(name)(options, gpu_name, gpu_bytes, tp, pp, dp, ep)


def default_engine(gpu_name: str | None) -> tuple[str, str | None]:
    """The engine planned when none is given, and a note where the GPU chose it: llama.cpp on Apple silicon, whose
    GPU it runs on through Metal (`ggml/src/ggml-metal`), where vLLM 0.33.0 has no GPU platform on a Mac (CUDA, ROCm,
    TPU, XPU, and its CPU platform on macOS: `vllm/platforms/__init__.py`); else vLLM."""
    if gpu_name:
        from kvplan.gpus import vendor

        if vendor(gpu_name) == "apple":
            return "llama.cpp", (f"engine: llama.cpp, the default on {gpu_name} (it runs on Metal; vLLM has no GPU "
                                 "platform on a Mac); give --engine for another")
    return "vllm", None
