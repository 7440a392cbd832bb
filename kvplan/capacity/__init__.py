"""Capacity: how many users fit on one GPU or several, computed the way the serving engine allocates memory.

    KV budget per GPU = GPU memory x fraction - weights per GPU - overhead   (engine rules: kvplan.engines)
                        or exactly --kv-budget
    max users at ctx  = replicas x the largest N whose pool.peak_bytes(N, ctx) fits the budget on every stage
    max ctx for N     = the largest ctx whose pool.peak_bytes(N / replicas, ctx) fits it on every stage
peak_bytes is the KV the engine allocates plus activations that grow with the batch, which only transformers has
(it prefills the whole batch in one pass; the others' activations are fixed overhead). The KV is counted two ways,
which differ under vLLM for sliding-window, chunked and cross-attention models and for hybrids whose states take
a prefill checkpoint page:
    at start-up  (pool.bytes_for): what the engine reserves per request, vLLM's start-up check and its logged
                 "Maximum concurrency", and what its admission of a new prompt asks free: each request's window
                 plus all in-flight tokens (a prefill chunk's), a state's checkpoint page;
    steady decode (pool.steady_bytes_for): what the requests hold while decoding without preemption, windows
                 freed as they slide, checkpoint pages freed.
The headline `max_concurrent_users` is the steady-decode figure (0 where the start-up check fails: the engine
refuses to start); `max_users_at_startup` the other.
Tensor parallelism splits KV heads, max(1, kv_heads // tp) per GPU (replicated when tp > kv_heads), and
recurrent state, never the MLA latent; pipeline parallelism splits layers into stages (vLLM's
`get_pp_indices`) and the fullest stage binds (a stage whose layers keep no cache binds nothing); GPUs beyond
tp x pp are data-parallel replicas.
Weights per GPU = (what every TP rank holds whole + the rest / tp) / pp: MLA's down-projections, DSA indexers, norms
and routers are whole on every rank (the `_replicated` parameter groups, `Engine.weight_shares`).
Data-parallel attention (vLLM --data-parallel-size, SGLang --enable-dp-attention --dp) runs dp ranks of attention
TP tp each, every rank with its own users and KV pool, while the routed experts are split over all dp x tp GPUs
of a stage (expert parallelism, --ep, places them whole):
    weights per GPU = sum over parameter groups of the group's bytes x the share the fullest GPU holds
                      (engine rules: `Engine.weight_shares`; attention by the attention TP, experts by dp x tp)
    max users       = dp x the users one rank's pool serves (the replicas above multiply it too)
so for an MLA model, whose latent every TP rank stores whole, dp ranks of TP 1 hold up to dp times the users that
TP dp holds on the same GPUs, less what the attention weights each rank repeats take from every GPU's budget.

The package, split by concern:
    layout.py      parallel layouts: the --gpus/--tp/--pp/--dp/--ep flags, which TP a model allows, each GPU's
                   share of the caches (`gpu_layers`) and of the weights (`weights_on_gpu`)
    draft.py       speculative decoding and LoRA: the draft's weights and layers, the adapters' slots
    deployment.py  one deployment before any search: the engine, the dtypes, the KV budget, each stage's pool
    search.py      the searches over a pool: most users within a budget, longest context for N users
    users.py       the users a deployment serves (`count`, the `Capacity` report) and a planning table's sweep
    plan.py        the layouts and dtypes that serve a target, fewest GPUs first (`kvplan plan`)
    advice.py      why a deployment does not fit and what would make it fit; `capacity`, the whole report
"""

from kvplan.capacity.advice import capacity, layout_label, users_label
from kvplan.capacity.deployment import check_workload, deploy, engine_dtypes
from kvplan.capacity.layout import (
    check_parallel,
    describe_layout,
    gpu_layers,
    parallelism,
    split_for_tp,
    valid_tp,
    weights_on_gpu,
)
from kvplan.capacity.plan import Plan, PlanRow, kv_options, plan
from kvplan.capacity.search import max_ctx, max_users, search_users
from kvplan.capacity.users import Capacity, UsersAt, count, users_sweep
from kvplan.model import Hardware, Parallelism, Workload

__all__ = ["Capacity", "Hardware", "Parallelism", "Plan", "PlanRow", "UsersAt", "Workload", "capacity",
           "check_parallel", "check_workload", "count", "deploy", "describe_layout", "engine_dtypes", "gpu_layers",
           "kv_options", "layout_label", "max_ctx", "max_users", "parallelism", "plan", "search_users",
           "split_for_tp", "users_label", "users_sweep", "valid_tp", "weights_on_gpu"]
