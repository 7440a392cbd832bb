"""torch and transformers: build the model on its device, run prefill and decode, measure the cache, the
allocator and the driver. Everything here is imported only by a running profile."""

import gc
import inspect
import os
import re
import resource
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from pydantic import BaseModel

from kvplan.errors import KvplanError
from kvplan.text import brief

INSTALL_HINT = ("pip install '.[profile]' in kvplan's source directory (without an NVIDIA GPU, first the CPU build "
                "of torch: pip install torch --index-url https://download.pytorch.org/whl/cpu)")
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Attributes of a transformers cache layer, by what they hold.
ROLES = {"keys": "kv", "values": "kv", "indexer_keys": "kv", "idx_keys": "kv", "conv_states": "conv",
         "conv1d_state": "conv", "recurrent_states": "recurrent",
         # DeepSeek V4's compressors (`DeepseekV4HCACache`, `DeepseekV4CSACache`): entries, buffered tokens, overlap
         "compressed_kv": "kv", "buffer_kv": "compressor", "buffer_gate": "compressor", "overlap_kv": "compressor",
         "overlap_gate": "compressor"}
INIT_STD = 0.02  # random weights: normal(0, 0.02), as transformers' initializer_range
RANDOM_BLOCK = 1_000_003


def imports():
    """(torch, transformers), or the one-line error saying how to install them."""
    try:
        import torch
        import transformers
    except ImportError as err:
        raise KvplanError(f"kvplan profile needs torch and transformers ({err.name} is missing): "
                          f"{INSTALL_HINT}") from None
    return torch, transformers


def check_device(torch, device: str) -> str:
    """'cpu', 'cuda' or 'cuda:N', with a clear error when torch sees no such GPU."""
    if device == "cpu":
        return device
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isascii() and device[5:].isdigit()):
        raise KvplanError(f"--device is cpu, cuda or cuda:N (N a GPU number), got {brief(device)}")
    if not torch.cuda.is_available():
        build = "this torch is a CPU build" if torch.version.cuda is None else "torch sees no CUDA GPU"
        raise KvplanError(f"--device {device}: {build}; use --device cpu (with --layers to keep the model small)")
    index = int(device.partition(":")[2] or torch.cuda.current_device())
    if index >= torch.cuda.device_count():
        raise KvplanError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s)")
    return f"cuda:{index}"


def is_oom(torch, err: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(err, oom) or (isinstance(err, RuntimeError) and "out of memory" in str(err).lower())


def free(torch, device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------- the model


def make_config(transformers, model_type: str, fields: dict):
    """transformers' own config class for model_type, from the config.json fields (never remote code)."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise KvplanError(f"transformers {transformers.__version__} has no model type {model_type!r}: "
                          "upgrade transformers (pip install -U transformers)")
    try:
        config = CONFIG_MAPPING[model_type](**fields)
    except Exception as err:  # TypeError, ValueError, huggingface_hub's StrictDataclassClassValidationError
        raise KvplanError(f"transformers {transformers.__version__} rejects this {model_type} config: "
                          f"{one_line(err)}") from None
    config.use_cache = True
    return config


def one_line(err: BaseException) -> str:
    """An exception as one line: its type and its message's lines joined (validators nest the cause below)."""
    message = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return f"{type(err).__name__}: {message[:300]}" if message else type(err).__name__


def failed(transformers, what: str, err: BaseException) -> KvplanError:
    """The one-line error for transformers' own code failing on a config it accepted (a model class that does
    not support this combination of fields, a bug in a new architecture)."""
    return KvplanError(f"transformers {transformers.__version__} failed {what}: {one_line(err)}")


def causal_lm_class(transformers, config):
    """transformers' causal-LM class for `config`: the one its auto mapping names for the model type or, for a text
    config nested in a multimodal one whose type has no entry (Emu3's emu3_text_model, Mllama's mllama_text_model),
    the class the mapping names for the family the config class belongs to, if that class takes this config."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type])
    family = type(config).__module__.split(".")[-2]  # transformers.models.<family>.configuration_<family>
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(family, ""), None)
    if model_class is None or getattr(model_class, "config_class", None) is not type(config):
        raise KvplanError(f"transformers {transformers.__version__} has no causal-LM class for model type "
                          f"{config.model_type!r}")
    return model_class


def build(torch, transformers, config, device: str, dtype: str):
    """The causal-LM model of `config`, made on `device` with random weights: parameters are allocated there
    uninitialised (no CPU copy, no init pass), buffers (rotary tables) computed as usual, then every parameter
    filled with normal(0, 0.02) on the device."""
    model_class = causal_lm_class(transformers, config)
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights
    try:
        with torch.device(device), no_init_weights():
            model = model_class._from_config(config, dtype=getattr(torch, TORCH_DTYPES[dtype]))
    except Exception as err:
        if is_oom(torch, err):
            raise
        raise failed(transformers, f"building its {config.model_type} model from this config", err) from None
    model.tie_weights()  # post_init ties inside init_weights, which no_init_weights skips
    model.eval()
    model.requires_grad_(False)
    fill_random(torch, model, device)
    return model


def fill_random(torch, model, device: str) -> None:
    """Random weights, normal(0, 0.02). On a GPU every element is drawn; on the CPU, where drawing billions of
    values takes seconds, a block of RANDOM_BLOCK draws (a prime length, so rows do not repeat) is tiled over each
    tensor. The cache and the memory do not depend on the values."""
    generator = torch.Generator(device=device).manual_seed(0)
    block = None
    with torch.no_grad():
        for param in model.parameters():
            if not param.is_floating_point():
                param.zero_()
            elif device.startswith("cuda") or param.numel() <= RANDOM_BLOCK:
                param.normal_(0.0, INIT_STD, generator=generator)
            else:
                if block is None or block.dtype != param.dtype:
                    block = torch.randn(RANDOM_BLOCK, generator=generator).mul_(INIT_STD).to(param.dtype)
                flat = param.view(-1)
                whole = flat.numel() // RANDOM_BLOCK * RANDOM_BLOCK
                flat[:whole].view(-1, RANDOM_BLOCK).copy_(block.expand(whole // RANDOM_BLOCK, -1))
                flat[whole:].copy_(block[: flat.numel() - whole])


def storage_key(tensor) -> tuple:
    storage = tensor.untyped_storage()
    return (str(tensor.device), storage.data_ptr(), storage.nbytes())


def model_bytes(model) -> tuple[int, int]:
    """(parameter bytes, buffer bytes), shared storage counted once (tied embeddings)."""
    seen: set = set()

    def total(tensors) -> int:
        out = 0
        for tensor in tensors:
            key = storage_key(tensor)
            if key not in seen:
                seen.add(key)
                out += key[2]
        return out

    params = total(model.parameters())
    return params, total(model.buffers())


# ---------------------------------------------------------------------------------------------- the cache


@dataclass
class LayerBytes:
    """One cache layer as measured: storage bytes (what memory it holds), view bytes (what it exposes)."""

    layer: int | None
    layer_class: str
    storage: dict[str, int] = field(default_factory=dict)  # role -> bytes, shared storage counted once
    view: dict[str, int] = field(default_factory=dict)  # role -> numel x element size
    tokens: int | None = None  # sequence length of its keys
    dtypes: set[str] = field(default_factory=set)

    @property
    def kv_storage(self) -> int:
        return sum(v for role, v in self.storage.items() if role != "bookkeeping")

    @property
    def kv_view(self) -> int:
        return sum(v for role, v in self.view.items() if role != "bookkeeping")


def _tensors(obj, role: str, depth: int = 0):
    """(role, tensor) for every tensor reachable from a cache object: attributes, dicts, lists."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield role, obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value, role, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, role, depth + 1)
    elif depth < 3 and hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module)):
        for name, value in vars(obj).items():
            yield from _tensors(value, ROLES.get(name, role if depth else "bookkeeping"), depth + 1)


def module_states(model) -> dict[int, list]:
    """(role, tensor) by decoder layer for the state a model keeps on its layers' modules between calls instead
    of in the cache (transformers' `_is_stateful` models: RecurrentGemma's `conv1d_state` and
    `recurrent_states`): tensors held as plain module attributes (parameters and buffers are kept apart)."""
    import torch

    states: dict[int, list] = {}
    if not getattr(model, "_is_stateful", False):
        return states
    for name, module in model.named_modules():
        match = re.search(r"(?:^|\.)layers\.(\d+)(?:\.|$)", name)
        for attr, value in vars(module).items() if match else ():
            if isinstance(value, torch.Tensor):
                states.setdefault(int(match.group(1)), []).append((ROLES.get(attr, "recurrent"), value))
    return states


class ModelCache:
    """A cache the model makes itself on its first cached forward, as generate() leaves it to (MiniMax, RWKV,
    xLSTM: `_supports_default_dynamic_cache` is false); `argument` is the forward argument and output field that
    carry it."""

    def __init__(self, argument: str):
        self.argument, self.value = argument, None


def cache_object(cache):
    """The cache itself: a ModelCache's value."""
    return cache.value if isinstance(cache, ModelCache) else cache


@dataclass
class _CacheLayer:
    """One layer of a cache object: its tensors by role (`parts`: (role, object holding tensors) pairs); `sliced`
    when they are slices of tensors every layer shares, each counting its own elements; `tokens` the tokens it
    holds where it has no keys to tell them."""

    index: int | None
    name: str
    parts: list
    keys: object = None
    sliced: bool = False
    tokens: int | None = None


def _cache_layers(cache) -> list[_CacheLayer]:
    """The layers of a cache: a Cache's layers, with MiniMax's lightning states (`linear_cache`) beside its
    attention layers; xLSTM's `rnn_state` per layer; RWKV's five state tensors (batch x hidden x layers) sliced
    by layer; XLNet's and Reformer's hidden states (`_legacy_cache_layers`)."""
    import torch

    legacy = _legacy_cache_layers(cache)
    if legacy is not None:
        return legacy
    cache = cache_object(cache)
    if isinstance(cache, list) and all(isinstance(t, torch.Tensor) for t in cache):
        return [_CacheLayer(i, "RWKV state", [("recurrent", [t[..., i] for t in cache])], sliced=True)
                for i in range(cache[0].shape[-1])]
    if isinstance(getattr(cache, "rnn_state", None), dict):
        return [_CacheLayer(i, type(cache).__name__, [("recurrent", state)]) for i, state in cache.rnn_state.items()]
    if not hasattr(cache, "layers"):
        return [_CacheLayer(None, type(cache).__name__, [("bookkeeping", cache)])]
    layers, linear = list(cache.layers), getattr(cache, "linear_cache", [])
    out = []
    for i in range(max(len(layers), len(linear))):
        layer = _CacheLayer(i, "linear_cache", [])
        if i < len(layers):
            layer.name, layer.keys = type(layers[i]).__name__, getattr(layers[i], "keys", None)
            layer.parts.append(("bookkeeping", layers[i]))
        if i < len(linear) and isinstance(linear[i], torch.Tensor):
            layer.parts.append(("recurrent", linear[i]))
        out.append(layer)
    return out


def _legacy_cache_layers(cache) -> list[_CacheLayer] | None:
    """Caches of hidden states, not keys and values: XLNet's Transformer-XL memories (its `mems`: one tensor of
    tokens x batch x d_model per layer) and Reformer's `ReformerDynamicCache` (each layer's hidden states,
    batch x tokens x hidden, and on LSH layers its hash buckets; every step a local layer appends an empty
    placeholder past the layers, which holds no memory). None for any other cache."""
    if isinstance(cache, ModelCache) and cache.argument == "mems" and isinstance(cache.value, (tuple, list)):
        return [_CacheLayer(i, "XLNet mems", [("states", mem)], tokens=int(mem.shape[0]))
                for i, mem in enumerate(cache.value)]
    value = cache_object(cache)
    if type(value).__name__ == "ReformerDynamicCache":
        states, buckets = value.states_cache, value.buckets_cache
        return [_CacheLayer(i, "ReformerDynamicCache", [("states", states[i]), ("buckets", buckets[i])],
                            tokens=int(states[i].shape[1])) for i in range(len(states))]
    return None


def cache_layers(cache, model=None) -> list[LayerBytes]:
    """Every tensor of the cache object, per layer and role, with the state `model` keeps on its modules
    (`module_states`); a storage shared by several tensors (or layers) is counted once, where it is first
    seen."""
    seen: set = set()
    states = module_states(model) if model is not None else {}
    out = []
    for layer in _cache_layers(cache):
        row = LayerBytes(layer=layer.index, layer_class=layer.name)
        tensors = [pair for part_role, part in layer.parts for pair in _tensors(part, part_role)]
        for role, tensor in [*tensors, *states.get(layer.index, [])]:
            size = tensor.numel() * tensor.element_size()
            row.view[role] = row.view.get(role, 0) + size
            key = storage_key(tensor)
            if layer.sliced or key not in seen:
                seen.add(key)
                row.storage[role] = row.storage.get(role, 0) + (size if layer.sliced else key[2])
            if role != "bookkeeping":
                row.dtypes.add(str(tensor.dtype).removeprefix("torch."))
        if layer.keys is not None and hasattr(layer.keys, "dim") and layer.keys.dim() >= 2:
            row.tokens = int(layer.keys.shape[-2])
        elif layer.tokens is not None:
            row.tokens = layer.tokens
        out.append(row)
    return out


# The forward argument (and output field) that carries the cache: past_key_values (cache_params for Mamba, `state`
# for RWKV-style models, `mems` for XLNet, `past_buckets_states` for Reformer), and from transformers 5.24 `cache`,
# which 5.24 keeps the others as deprecated aliases of and some models take alone. (Before 5.24 XLM's `cache` is its
# own legacy dict: not for a Cache object.)
CACHE_ARGUMENTS = ("past_key_values", "cache_params", "state", "mems", "past_buckets_states")
CACHE_ARGUMENT_524 = "cache"


def cache_argument(transformers, model) -> str:
    """The cache argument this model's forward takes, past_key_values when it names none (a model that keeps no
    cache of its own takes it in **kwargs and ignores it)."""
    names = CACHE_ARGUMENTS
    if release(transformers.__version__) >= (5, 24):
        names = (CACHE_ARGUMENT_524, *names)
    arguments = inspect.signature(model.forward).parameters
    return next((name for name in names if name in arguments), "past_key_values")


def release(version: str) -> tuple[int, ...]:
    """The numeric part of a package version: '5.24.0.dev0' -> (5, 24, 0)."""
    numeric = []
    for part in version.split("."):
        if not part.isdigit():
            break
        numeric.append(int(part))
    return tuple(numeric)


def new_cache(transformers, model, static_len: int | None = None):
    """The cache generate() makes for this model (`_prepare_cache_for_generation`): a DynamicCache built from
    the decoder config, or a StaticCache of static_len tokens; for a model that makes its own, a ModelCache to
    be filled by its first forward."""
    from transformers import DynamicCache, StaticCache

    if not model._supports_default_dynamic_cache():
        return ModelCache(cache_argument(transformers, model))
    config = model.config.get_text_config(decoder=True)
    if static_len:
        return StaticCache(config=config, max_cache_len=static_len)
    return DynamicCache(config=config)


# ---------------------------------------------------------------------------------------------- memory


class Snapshot(BaseModel):
    """Memory at one moment: torch's allocator (CUDA), the driver (NVML), or the process (CPU); bytes, None
    where the device has no such figure."""

    phase: str
    allocated: int | None = None
    max_allocated: int | None = None
    reserved: int | None = None
    device_used: int | None = None
    process_used: int | None = None
    rss: int | None = None
    max_rss: int | None = None


class Probe:
    """Memory readings around each phase: torch.cuda stats and NVML on a GPU, resident memory on the CPU."""

    def __init__(self, torch, device: str):
        self.torch, self.device = torch, device
        self.cuda = device.startswith("cuda")
        self.notes: list[str] = []
        self.nvml = self.handle = None
        self.driver = self.gpu_name = None
        self.gpu_total = None
        if self.cuda:
            self.gpu_name = torch.cuda.get_device_name(device)
            self.gpu_total = torch.cuda.get_device_properties(device).total_memory
            self._open_nvml()

    def _open_nvml(self) -> None:
        try:
            import pynvml
        except ImportError:
            self.notes.append(f"nvidia-ml-py is not installed: no driver-side figures ({INSTALL_HINT})")
            return
        try:
            pynvml.nvmlInit()
            self.handle = self._nvml_handle(pynvml)
            driver = pynvml.nvmlSystemGetDriverVersion()
            self.driver = driver.decode() if isinstance(driver, bytes) else driver
            self.gpu_total = pynvml.nvmlDeviceGetMemoryInfo(self.handle).total
            self.nvml = pynvml
        except Exception as err:  # NVML missing from the driver, no permission: figures are optional
            self.notes.append(f"NVML unavailable ({type(err).__name__}): no driver-side figures")
            self.nvml = self.handle = None

    def _nvml_handle(self, pynvml):
        """NVML's handle for torch's device, matched by PCI bus id (CUDA_VISIBLE_DEVICES renumbers devices for
        torch, not for NVML); by index when torch does not give the bus id."""
        props = self.torch.cuda.get_device_properties(self.device)
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
            for width in (8, 4):
                try:
                    return pynvml.nvmlDeviceGetHandleByPciBusId(f"{domain:0{width}x}:{bus:02x}:{device:02x}.0")
                except Exception:
                    continue
        self.notes.append("NVML device matched by index (no PCI bus id from torch)")
        return pynvml.nvmlDeviceGetHandleByIndex(int(self.device.partition(":")[2] or 0))

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.nvml = self.handle = None

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def snapshot(self, phase: str) -> Snapshot:
        snap = Snapshot(phase=phase)
        if self.cuda:
            sync(self.torch, self.device)
            snap.allocated = self.torch.cuda.memory_allocated(self.device)
            snap.max_allocated = self.torch.cuda.max_memory_allocated(self.device)
            snap.reserved = self.torch.cuda.memory_reserved(self.device)
            if self.nvml is not None:
                snap.device_used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used
                snap.process_used = self._process_used()
        else:
            snap.rss = _rss()
            snap.max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return snap

    def _process_used(self) -> int | None:
        try:
            processes = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception:
            return None
        used = [p.usedGpuMemory for p in processes if p.pid == os.getpid() and p.usedGpuMemory is not None]
        if not used and "process_used" not in " ".join(self.notes):
            self.notes.append("NVML does not list this process (PID namespace): process_used is blank; "
                              "device_used still counts it")
        return sum(used) if used else None


def tensor_peak(torch):
    """A context that measures the peak bytes of tensor storage created inside it, op by op, on any device:
    what torch.cuda's max_memory_allocated gives on a GPU, for the CPU. Every storage an aten op returns that
    none of its inputs owns (views and in-place results are not new memory) is counted from its creation until
    it is freed (a weakref finaliser on the storage)."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class TensorPeak(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = self.peak = 0
            self.sizes: dict[int, int] = {}  # storage address -> bytes, for storages alive and counted

        def _freed(self, address: int) -> None:
            self.live -= self.sizes.pop(address)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            owned = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                     if isinstance(t, torch.Tensor)}
            for tensor in tree_leaves(out):
                if not isinstance(tensor, torch.Tensor):
                    continue
                storage = tensor.untyped_storage()
                address, size = storage.data_ptr(), storage.nbytes()
                if size and address not in owned and address not in self.sizes:
                    self.sizes[address] = size
                    self.live += size
                    weakref.finalize(storage, self._freed, address)
            self.peak = max(self.peak, self.live)
            return out

    return TensorPeak()


def available_ram() -> int | None:
    """MemAvailable from /proc/meminfo (Linux): what a process can allocate without swapping; None elsewhere."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rss() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def timed(torch, device: str, out: dict, key: str):
    sync(torch, device)
    start = time.perf_counter()
    yield
    sync(torch, device)
    out[key] = time.perf_counter() - start
