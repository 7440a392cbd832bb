"""Parallel layouts: the layout the flags give, the TP degrees a model allows, and what each GPU of a layout holds
(its share of every layer's cache, `gpu_layers`, and of the weights, `weights_on_gpu`)."""

import math
from bisect import bisect_left
from fractions import Fraction
from typing import NamedTuple

from kvplan import engines
from kvplan.engines import Engine, cdiv
from kvplan.errors import KvplanError
from kvplan.memory import checkpoint_bytes, weights_by_group, weights_from_checkpoint
from kvplan.model import LayerCache, ModelSpec, Parallelism, RecurrentState, distinct_caches, layer_groups

ATTENTION_KINDS = ("full", "sliding", "chunked", "cross", "prefixed")


def check_parallel(model: ModelSpec, tp: int, pp: int, from_gpus: bool = False, dp: int = 1) -> None:
    """TP must divide the attention heads, and split KV heads evenly or replicate them whole (tp a multiple of
    kv_heads); PP cannot exceed the layers. `from_gpus`: the degrees came from --gpus, so the error says so; with
    `dp` data-parallel attention ranks tp is the attention TP of one rank."""
    if tp < 1 or pp < 1:
        raise KvplanError(f"--tp and --pp must be at least 1, got {tp} and {pp}")
    problem = _tp_problem(model, tp)
    flag = f"--gpus {tp * pp} as TP {tp}" if from_gpus else f"--tp {tp}"
    if dp > 1:
        flag, from_gpus = f"attention TP {tp} (with --dp {dp})", False
    if problem:
        hint = "; give --tp with --gpus" if from_gpus else ""
        raise KvplanError(f"{flag} {problem} (valid TP: {', '.join(map(str, valid_tp(model)))}{hint})")
    if pp > model.num_layers:
        flag = f"--gpus {tp * pp} as PP {pp}" if from_gpus else f"--pp {pp}"
        raise KvplanError(f"{flag} exceeds {model.name}'s {model.num_layers} layers")


def _tp_problem(model: ModelSpec, tp: int) -> str | None:
    heads = model.num_attention_heads
    if heads % tp:
        return f"does not divide {model.name}'s {heads} attention heads: each GPU must hold whole heads"
    kinds = distinct_caches(model.caches)  # one of each kind of layer
    split = {c.kv_heads for c in kinds if c.kind in ATTENTION_KINDS and c.split_by_tensor_parallel}
    for kv in sorted(split):
        if (kv >= tp and kv % tp) or (tp > kv and tp % kv):
            return (f"cannot share {model.name}'s {kv} KV heads: TP must divide them, or be a multiple of "
                    "them to replicate them")
    for state in (c for c in kinds if c.kind == "recurrent"):
        problem = _recurrent_tp_problem(state, tp)
        if problem:
            return f"{problem} of {model.name}'s {state.mixer} layers"
    return None


def _recurrent_tp_problem(state: RecurrentState, tp: int) -> str | None:
    """vLLM's mixers split a recurrent state by heads (Mamba-2, Gated DeltaNet: `num_heads % tp == 0`), B and C
    groups only when tp divides them or there is one group to replicate (`mamba_mixer2.py`), and Mamba's
    channels evenly (`divide(intermediate_size, tp)`)."""
    if state.heads:
        if state.heads % tp:
            return f"does not divide the {state.heads} SSM heads"
        if state.groups and state.groups % tp and state.groups != 1:
            return f"does not divide the {state.groups} B/C groups (only a single group is replicated)"
    elif state.conv_kernel and state.conv_elements // (state.conv_kernel - 1) % tp:
        return f"does not divide the {state.conv_elements // (state.conv_kernel - 1):,} channels"
    return None


def valid_tp(model: ModelSpec, limit: int = 64) -> list[int]:
    candidates = range(1, min(limit, model.num_attention_heads or limit) + 1)
    return [tp for tp in candidates if _tp_problem(model, tp) is None]


def split_for_tp(cache: LayerCache, tp: int) -> LayerCache:
    """One GPU's share of a layer's cache: max(1, kv_heads // tp) heads; recurrent state / tp; MLA whole.
    A Mamba-2 state whose B/C groups tp does not divide first gets tp - groups more groups of 2 x state_size
    conv channels, so that every GPU holds the group its heads read (vLLM `extra_groups_for_head_shards`)."""
    if tp == 1 or not cache.split_by_tensor_parallel:
        return cache
    if cache.kind in ATTENTION_KINDS:
        return cache.model_copy(update={"kv_heads": max(1, cache.kv_heads // tp)})
    if cache.kind == "recurrent":
        conv = cache.conv_elements
        if cache.groups and cache.groups % tp and cache.conv_kernel:
            conv += (tp - cache.groups) * 2 * cache.state_size * (cache.conv_kernel - 1)
        return cache.model_copy(update={"conv_elements": conv // tp, "ssm_elements": cache.ssm_elements // tp})
    return cache


def stage_bounds(sizes: list[int]) -> list[tuple[int, int]]:
    """Layer ranges of pipeline stages of these sizes (`Engine.stage_sizes`)."""
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def gpu_layers(caches: tuple[LayerCache, ...], stage_sizes: list[int], tp: int) -> list[engines.Layers]:
    """Per pipeline stage (of `stage_sizes` layers each), the caches one GPU holds, identical ones counted once:
    each group of alike layers (`layer_groups`) counts the layers of its own within the stage's bounds."""
    groups = layer_groups(caches)
    stages = []
    for start, end in stage_bounds(stage_sizes):
        within = []  # (the group's first layer in the stage, its cache, its layers there), in the stage's order
        for cache, layers in groups:
            first = bisect_left(layers, start)
            count = bisect_left(layers, end) - first
            if count:
                within.append((layers[first], cache, count))
        counts: dict[LayerCache, int] = {}
        for _, cache, count in sorted(within, key=lambda group: group[0]):
            key = split_for_tp(cache.model_copy(update={"layer": 0}), tp)
            counts[key] = counts.get(key, 0) + count
        stages.append(list(counts.items()))
    return stages


def parallelism(engine_name: str, gpus: int | None, tp: int | None, pp: int | None, dp: int | None = None,
                ep: int | None = None, expert_parallel: bool = False) -> Parallelism:
    """--gpus, --tp, --pp (and --dp, --ep, --enable-expert-parallel) -> a layout. Without --tp the GPUs form one
    replica: tensor parallel where the engine splits heads, pipeline stages where it splits layers (llama.cpp,
    transformers); GPUs beyond TP x PP are data-parallel replicas. With --dp, --ep or --enable-expert-parallel
    see `data_parallelism`."""
    for flag, value in (("--gpus", gpus), ("--tp", tp), ("--pp", pp), ("--dp", dp), ("--ep", ep)):
        if value is not None and value < 1:
            raise KvplanError(f"{flag} must be at least 1, got {value}")
    if dp is not None or ep is not None or expert_parallel:
        return data_parallelism(engines.engine_class(engine_name), gpus, tp, pp, dp, ep, expert_parallel)
    derived = bool(gpus) and tp is None
    if gpus and tp is None:
        if engines.engine_class(engine_name).splits_heads:
            tp = gpus // (pp or 1) or 1
        elif pp is None:
            pp = gpus
    tp, pp = tp or 1, pp or 1
    gpus = gpus or tp * pp
    if gpus % (tp * pp):
        raise KvplanError(f"--gpus {gpus} is not a multiple of TP x PP = {tp} x {pp}: give --gpus a multiple of "
                          "--tp x --pp")
    return Parallelism(tp=tp, pp=pp, replicas=gpus // (tp * pp), from_gpus=derived)


def data_parallelism(engine: type[Engine], gpus: int | None, tp: int | None, pp: int | None, dp: int | None,
                     ep: int | None, expert_parallel: bool) -> Parallelism:
    """A layout with data-parallel attention or expert parallelism, each flag meaning what it means to the engine.
    vLLM: --tp is one DP rank's TP, so the GPUs are DP x TP x PP. SGLang: --tp is every GPU of a stage and the
    attention TP is tp / dp (--enable-dp-attention), so the GPUs are TP x PP. --gpus, when given, must be that
    count (independent replicas are a layout without --dp). --enable-expert-parallel (SGLang's --enable-ep-moe)
    places the experts on every GPU of a stage, EP = DP x attention TP."""
    if not engine.data_parallel:
        flag = "--dp" if dp is not None else "--ep" if ep is not None else "--enable-expert-parallel"
        raise KvplanError(engines.no_data_parallel(engine.label, flag))
    pp, dp = pp or 1, dp or 1
    if engine.tp_spans_dp:
        stage = tp or (gpus // pp if gpus else dp)
        if stage % dp:
            raise KvplanError(f"--dp {dp} does not divide --tp {stage}: SGLang's --tp counts every GPU of a stage and "
                              f"its attention TP is tp / dp (--tp {dp} --dp {dp} is attention TP 1)")
        attention_tp, count = stage // dp, "TP x PP"
    else:
        if tp is None and gpus and gpus % (dp * pp):
            raise KvplanError(f"--gpus {gpus} is not a multiple of DP x PP = {dp} x {pp}")
        attention_tp = tp or (gpus // (dp * pp) if gpus else 1)
        stage, count = dp * attention_tp, "DP x TP x PP"
    if gpus and gpus != stage * pp:
        raise KvplanError(f"--gpus {gpus} is not {engine.label}'s {count} = {stage * pp}: with --dp, --ep or "
                          "--enable-expert-parallel the GPUs are one data-parallel deployment")
    if expert_parallel and ep not in (None, stage):
        raise KvplanError(f"--enable-expert-parallel spreads the experts over all {stage} GPUs of a stage, but --ep "
                          f"is {ep}: give one of them")
    ep = stage if expert_parallel else ep or 1
    return Parallelism(tp=attention_tp, pp=pp, dp=dp, ep=ep)


class GpuWeights(NamedTuple):
    """The weights on the fullest GPU of a layout (`weights_on_gpu`): their dtype label, their bytes and the routed
    experts' among them; and what those were summed from, the bytes of each of the model's parameter groups
    (`weights_by_group`) and the share of each that the GPU holds (`Engine.weight_shares`)."""

    label: str
    per_gpu: int
    experts: int
    groups: dict[str, int]
    shares: dict[str, Fraction]


def weights_on_gpu(model: ModelSpec, engine: Engine, dtype_name: str | None,
                   tower_not_loaded: int = 0) -> GpuWeights:
    """The weights on the fullest GPU, of which routed experts, in bytes:
        ceil(scale x sum over groups of bytes x the engine's share for the group)
    scale = the checkpoint's exact bytes / the config's where its safetensors headers were read (its tensors are not
    grouped), else 1. With every share 1 / (tp x pp) this is ceil(weights / (tp x pp)). `tower_not_loaded`: the
    vision tower's bytes the engine leaves out (text-only serving), taken from its group."""
    groups, label = weights_by_group(model, dtype_name)
    config = sum(groups.values())
    total = checkpoint_bytes(model.checkpoint) if weights_from_checkpoint(model, dtype_name) else config
    config = config or 1
    groups["vision"] -= min(groups["vision"], tower_not_loaded)
    shares = engine.weight_shares(model)
    # Exact in whole numbers: with the shares over their common denominator the sum is held / common (a Fraction
    # operation per group cost a planning table's sweep more than the rest of a deployment).
    common = math.lcm(*(share.denominator for share in shares.values()))
    held = sum(size * shares[group].numerator * (common // shares[group].denominator)
               for group, size in groups.items())
    experts = shares["experts"]
    return GpuWeights(label, cdiv(total * held, config * common),
                      cdiv(total * groups["experts"] * experts.numerator, config * experts.denominator), groups, shares)


def describe_layout(tp: int, pp: int, dp: int = 1, ep: int = 1, replicas: int = 1) -> str:
    """`TP 8 x PP 2 x 2 replicas`, `DP 8 x TP 1, EP 8`: the degrees that are not 1 (TP always)."""
    parts = [f"DP {dp}"] if dp > 1 else []
    parts.append(f"TP {tp}")
    if pp > 1:
        parts.append(f"PP {pp}")
    if replicas > 1:
        parts.append(f"{replicas} replicas")
    return " x ".join(parts) + (f", EP {ep}" if ep > 1 else "")
