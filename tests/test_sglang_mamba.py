"""SGLang 0.5.23's Mamba state pool against numbers from outside kvplan: a published SGLang start-up log, and the
state shapes and pool split recomputed here from SGLang's own formulas (configs/mamba_utils.py
Mamba2StateShape.create and KimiLinearStateShape.create; mem_cache/kv_cache_configurator.py _handle_max_mamba_cache
and resolve_max_num_reqs), reading the configs' fields directly, never kvplan's helpers."""

import json
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import GiB, MiB, assert_one_line_error, run_main

from kvplan import engines
from kvplan.capacity import Hardware, Parallelism, Workload, capacity, gpu_layers, max_ctx
from kvplan.dtypes import kv_dtype
from kvplan.engines import EngineOptions
from kvplan.engines.sglang import SglangMambaPool
from kvplan.sources import load_model

SPECS = Path(__file__).parent.parent / "model_specs"


def config(name: str) -> dict:
    raw = json.loads((SPECS / f"{name.replace('/', '__')}.json").read_text())
    return raw.get("text_config", raw)


def sglang_pool(model_id: str, tp: int = 1, kv: str | None = None):
    model = load_model(model_id)
    engine = engines.engine("sglang", EngineOptions(), tp=tp)
    stage = gpu_layers(engine.cached_layers(model), [model.num_layers], tp)[0]
    return engine.pool(stage, model, kv_dtype(kv or engine.default_kv_dtype(model)))


def mamba2_state(tp, intermediate, groups, heads, head_dim, state, kernel, ssm_bytes=4, conv_bytes=2) -> int:
    """Mamba2StateShape.create: groups widened to tp where tp does not divide them; conv (intermediate + 2 G N) / tp
    x (kernel - 1) in bfloat16, SSM heads / tp x head_dim x N in float32."""
    if groups % tp:
        groups = tp
    conv = (intermediate + 2 * groups * state) // tp * (kernel - 1)
    return conv * conv_bytes + heads // tp * head_dim * state * ssm_bytes


# -------------------------------------------------------------------------- published start-up log (SGLang 0.5.21)

# Nemotron-3-Nano-Omni-30B-A3B-Reasoning-NVFP4 (its language model is Nemotron-3-Nano-30B-A3B's), 4 x GB10, TP 4,
# fp8 KV, SGLang 0.5.21 defaults but --max-running-requests 32, mamba_full_memory_ratio 0.9, mamba_ssm_dtype unset:
# https://github.com/vroomfondel/dgxarley (its test log "SGLang Test Log: Nemotron-3 Nano Omni 30B-A3B-Reasoning-NVFP4,
# 4 Nodes, TP=4 EP=1, v0.5.21-sm121", 2026-10-08), case 01:
#   Mamba Cache is allocated. max_mamba_cache_size: 2211, conv_state size: 0.44GB, ssm_state size: 24.84GB
#   KV Cache is allocated. dtype: float8_e4m3fn, #tokens: 19644177, K size: 14.05 GB, V size: 14.05 GB
# and cases 03 and 06 (mamba backend, prefill graphs: no pool change): 2230 slots and 19.82M tokens; 2225 and 19.77M.
# 0.5.21's split is 0.5.23's: the logged slots are what 0.5.23's formula gives for the logged pools (below), and
# 0.5.19's resolve_max_num_reqs already capped requests by "5 state slots per request" (SGLang issue #38846).
NEMOTRON_NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def test_nemotron_nano_state_and_kv_cell_match_the_log():
    c = config(NEMOTRON_NANO)
    mamba_layers = c["hybrid_override_pattern"].count("M")
    attention_layers = c["hybrid_override_pattern"].count("*")
    per_layer = mamba2_state(4, c["mamba_num_heads"] * c["mamba_head_dim"], c["n_groups"], c["mamba_num_heads"],
                             c["mamba_head_dim"], c["ssm_state_size"], c["conv_kernel"])
    pool = sglang_pool(NEMOTRON_NANO, tp=4, kv="fp8")
    assert pool.slot_bytes == mamba_layers * per_layer
    conv = mamba_layers * (64 * 64 + 2 * 8 * 128) // 4 * 3 * 2
    ssm = mamba_layers * 16 * 64 * 128 * 4
    assert conv + ssm == pool.slot_bytes
    assert round(2212 * conv / GiB, 2) == 0.44 and round(2212 * ssm / GiB, 2) == 24.84  # the pool holds K + 1
    # K size: #tokens x 6 layers x max(1, 2 KV heads // 4) x 128 x 1 B (fp8); SGLang allocates #tokens + page_size
    assert pool.full_cell == 2 * attention_layers * 1 * c["head_dim"] * 1
    assert round(19_644_178 * pool.full_cell / 2 / GiB, 2) == 14.05


@pytest.mark.parametrize(("slots", "tokens", "exact"), [(2211, 19_644_177, True), (2230, 19_820_000, False),
                                                        (2225, 19_770_000, False)])
def test_nemotron_nano_split_matches_the_log(slots, tokens, exact):
    """The budget the log's pools add up to, (K + 1) slots and #tokens cells (plus less than a cell SGLang leaves),
    splits 0.9 : 1 back into the logged slots and tokens. Cases 03 and 06 log tokens to 4 digits: a slot either way."""
    pool = sglang_pool(NEMOTRON_NANO, tp=4, kv="fp8")
    budget = (slots + 1) * pool.slot_bytes + tokens * pool.full_cell + pool.full_cell // 2
    split = pool.split(budget)
    assert split.mamba_slots == slots if exact else abs(split.mamba_slots - slots) <= 1
    if exact:
        assert split.kv_tokens == tokens
    # max_running_requests: min(4096, tokens // 2, slots // 5); the log's 32 is its --max-running-requests
    assert split.max_running_requests == slots // 5 == 442 if exact else True


def test_qwen35_requests_capped_by_five_slots():
    """SGLang issue #38846 (0.5.19, Qwen3.5-27B FP8 on an RTX 6000 Ada): "max_running_requests is capped to 9 by the
    mamba state cache (max_mamba_cache_size=47, 5 state slots per request)"."""
    pool = sglang_pool("Qwen/Qwen3.5-27B")
    assert pool.slots_per_request == 5
    budget = 48 * pool.slot_bytes * 19 // 9 + pool.slot_bytes  # 47 slots: floor(B x 9/19 / slot) - 1
    split = pool.split(budget)
    assert split.mamba_slots == 47 and split.max_running_requests == 9


# ------------------------------------------------------------ state shapes, recomputed from SGLang's formulas


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gated_deltanet_state_per_gpu(tp):
    """Qwen3-Next: Mamba2StateShape.create(intermediate = Hv x Dv, groups = Hk, heads = Hv, head_dim = Dv,
    state = Dk) (configs/qwen3_next.py); SSM float32 as its config names no mamba_ssm_dtype."""
    c = config("Qwen/Qwen3-Next-80B-A3B-Thinking")
    layers = c["num_hidden_layers"] - c["num_hidden_layers"] // c["full_attention_interval"]
    hv, dv, hk, dk = (c["linear_num_value_heads"], c["linear_value_head_dim"], c["linear_num_key_heads"],
                      c["linear_key_head_dim"])
    per_layer = mamba2_state(tp, hv * dv, hk, hv, dv, dk, c["linear_conv_kernel_dim"])
    assert sglang_pool("Qwen/Qwen3-Next-80B-A3B-Thinking", tp).slot_bytes == layers * per_layer


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_granite_state_widens_one_group_to_tp(tp):
    """Granite 4.0-H: one B/C group, widened to tp groups of conv channels on every GPU; SSM float32 always
    (configs/granitemoehybrid.py passes no config to mamba2_state_dtype)."""
    c = config("ibm-granite/granite-4.0-h-small")
    layers = c["layer_types"].count("mamba")
    heads, head_dim = c["mamba_n_heads"], c["mamba_d_head"]
    per_layer = mamba2_state(tp, c["mamba_expand"] * c["hidden_size"], c["mamba_n_groups"], heads, head_dim,
                             c["mamba_d_state"], c["mamba_d_conv"])
    assert sglang_pool("ibm-granite/granite-4.0-h-small", tp).slot_bytes == layers * per_layer


def test_falcon_h1_and_lfm2_states():
    c = config("tiiuae/Falcon-H1-0.5B-Instruct")
    falcon = mamba2_state(1, c["mamba_d_ssm"], c["mamba_n_groups"], c["mamba_n_heads"], c["mamba_d_head"],
                          c["mamba_d_state"], c["mamba_d_conv"])
    assert sglang_pool("tiiuae/Falcon-H1-0.5B-Instruct").slot_bytes == c["num_hidden_layers"] * falcon
    # LFM2 (configs/lfm2.py): intermediate = hidden, one group, no SSM state; conv_L_cache is the kernel
    c = config("LiquidAI/LFM2-1.2B")
    short_conv = mamba2_state(2, c["hidden_size"], 1, 2, c["hidden_size"], 0, c["conv_L_cache"])
    pool = sglang_pool("LiquidAI/LFM2-1.2B", tp=2)
    assert pool.slot_bytes == (c["num_hidden_layers"] - len(c["full_attn_idxs"])) * short_conv
    assert pool.slots_per_request == 3  # no_buffer: LFM2 is not on the extra_buffer list


def test_kimi_linear_state():
    """KimiLinearStateShape.create: conv (kernel - 1) x (H D / tp + 2 H D / tp), SSM H / tp x D x D, float32."""
    c = config("moonshotai/Kimi-Linear-48B-A3B-Instruct")["linear_attn_config"]
    h, d, k = c["num_heads"], c["head_dim"], c["short_conv_kernel_size"]
    per_layer = (k - 1) * 3 * h * d // 2 * 2 + h // 2 * d * d * 4
    assert sglang_pool("moonshotai/Kimi-Linear-48B-A3B-Instruct", tp=2).slot_bytes == len(c["kda_layers"]) * per_layer


# ------------------------------------------------------------------------------------------------- capacity


def recomputed_split(budget: int, slot: int, cell: int, slots_per_request: int, context_len: int):
    """_handle_max_mamba_cache with the default mamba_full_memory_ratio 0.9, in SGLang's floats."""
    rest_gb = budget / (1 << 30)
    mamba_budget = rest_gb * 0.9 / (1 + 0.9) * (1 << 30)
    slots = int((mamba_budget - slot) // slot)
    tokens = int((rest_gb - (slots + 1) * slot / (1 << 30)) * (1 << 30)) // cell
    estimated = max(min(int(tokens / context_len * 512), 4096), 2048)
    return slots, tokens, min(estimated, tokens // 2, slots // slots_per_request)


@pytest.mark.parametrize(("ctx", "budget_gib"), [(1000, 20), (8192, 30), (131_072, 60), (262_144, 10)])
def test_users_are_the_least_of_both_pools(ctx, budget_gib):
    model = load_model("Qwen/Qwen3-Next-80B-A3B-Thinking")
    budget = budget_gib * GiB
    cap = capacity(model, Workload(ctx=ctx), engine_name="sglang", kv_budget=budget)
    pool = sglang_pool("Qwen/Qwen3-Next-80B-A3B-Thinking")
    slots, tokens, running = recomputed_split(budget, pool.slot_bytes, pool.full_cell, 5, 262_144)
    assert pool.split(budget) == (slots, tokens, running)
    assert cap.max_concurrent_users == min(tokens // ctx, running)
    assert any("Mamba slots" in note and ("KV tokens" in note) for note in cap.notes)
    # the search over bytes_for agrees with the count from the split, to the user
    from kvplan.capacity import search_users
    assert search_users(pool, budget, ctx) in (cap.max_concurrent_users, cap.max_concurrent_users - 1)


def test_note_names_the_binding_pool():
    model = load_model("Qwen/Qwen3-Next-80B-A3B-Thinking")
    short = capacity(model, Workload(ctx=1000), engine_name="sglang", kv_budget=30 * GiB)
    long = capacity(model, Workload(ctx=262_144), engine_name="sglang", kv_budget=30 * GiB)
    assert any("bound by max_running_requests, set by the Mamba pool" in n for n in short.notes)
    assert any("bound by the KV tokens" in n for n in long.notes)


def test_nemotron_config_dtype_is_not_read():
    """Nemotron-H's config names mamba_ssm_cache_dtype, which SGLang does not read: float32 whatever it says."""
    model = load_model(NEMOTRON_NANO)
    engine = engines.engine("sglang", EngineOptions())
    states = {c.ssm_dtype for c in engine.cached_layers(model) if c.kind == "recurrent"}
    assert states == {"fp32"}


@pytest.mark.parametrize(("model_id", "fragment"), [
    ("ai21labs/Jamba-v0.1", "no model class"),
    ("MiniMaxAI/MiniMax-M1-80k", "no model class"),
    ("state-spaces/mamba2-2.7b", "attention-free"),
])
def test_sglang_refuses_what_it_does_not_run_in_one_line(monkeypatch, capsys, model_id, fragment):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", model_id, "--ctx", "8k", "--gpu", "h100",
                            "--engine", "sglang")
    assert_one_line_error(code, err, fragment, "--engine vllm")


def test_pipeline_parallel_refused_but_layout_search_goes_on():
    model = load_model("Qwen/Qwen3-Next-80B-A3B-Thinking")
    hardware = Hardware(name="H100", memory_bytes=81_559 * MiB)
    with pytest.raises(Exception, match="pipeline parallelism"):
        capacity(model, Workload(ctx=8192), engine_name="sglang", hardware=hardware, parallel=Parallelism(pp=2))
    cap = capacity(model, Workload(ctx=8192, users=64), engine_name="sglang", hardware=hardware)
    assert not cap.fits and any("needs" in s for s in cap.suggestions)


# ------------------------------------------------------------------------------ speculative decoding (SGLang 0.5.23)

QWEN3_NEXT = "Qwen/Qwen3-Next-80B-A3B-Thinking"


def attention_cell(c: dict, tp: int, extra_layers: int = 0) -> int:
    """Bytes per token of the full-attention layers on a GPU (every full_attention_interval-th layer), bf16 K and V."""
    layers = c["num_hidden_layers"] // c["full_attention_interval"] + extra_layers
    return layers * 2 * max(1, c["num_key_value_heads"] // tp) * c["head_dim"] * 2


def gdn_slot(c: dict, tp: int) -> int:
    layers = c["num_hidden_layers"] - c["num_hidden_layers"] // c["full_attention_interval"]
    hv, dv, hk, dk = (c["linear_num_value_heads"], c["linear_value_head_dim"], c["linear_num_key_heads"],
                      c["linear_key_head_dim"])
    return layers * mamba2_state(tp, hv * dv, hk, hv, dv, dk, c["linear_conv_kernel_dim"])


def recomputed_speculative_split(budget: int, slot: int, cell: int, drafts: int, per_request: int = 5,
                                 requests: int = 48):
    """_handle_max_mamba_cache with speculative decoding (reserves_spec_state), in SGLang's floats: K solved jointly
    with the per-draft states of K / ratio requests, then only (min(max_running_requests, K // ratio) + 1) x D slots'
    worth taken from the rest; resolve_max_num_reqs with max_running_requests 48 (speculative_hook.py)."""
    rest_gb = budget / (1 << 30)
    mamba_budget_bytes = rest_gb * 0.9 / (1 + 0.9) * (1 << 30)
    slots = int((mamba_budget_bytes - slot * (1 + drafts)) // (slot * (1 + drafts / per_request)))
    capped = min(max(1, requests), slots // per_request)
    rest_gb -= slot * (capped + 1) * drafts / (1 << 30)
    rest_gb -= (slots + 1) * slot / (1 << 30)
    tokens = int(rest_gb * (1 << 30)) // cell
    return slots, tokens, min(requests, tokens // 2, slots // per_request)


@pytest.mark.parametrize(("model_id", "tp", "drafts", "ctx", "budget_gib"), [
    (QWEN3_NEXT, 4, 4, 32_768, 27), (QWEN3_NEXT, 4, 4, 1000, 27), (QWEN3_NEXT, 1, 2, 8192, 8),
    ("Qwen/Qwen3.5-27B", 1, 4, 65_536, 20), ("Qwen/Qwen3.5-27B", 2, 3, 262_144, 3)])
def test_mtp_split_recomputed(model_id, tp, drafts, ctx, budget_gib):
    """NEXTN on Qwen3-Next and Qwen3.5, path-less as their SGLang docs launch it: the pools are sized by the target's
    config (no num_nextn_predict_layers), so the KV cell is the model's; a request holds ctx + D token slots
    (spec_decode_alloc_len_per_request at top-k 1)."""
    c = config(model_id)
    budget = budget_gib * GiB
    options = EngineOptions(speculative_method="mtp", speculative_tokens=drafts)
    cap = capacity(load_model(model_id), Workload(ctx=ctx), engine_name="sglang", kv_budget=budget,
                   parallel=Parallelism(tp=tp), options=options)
    slots, tokens, running = recomputed_speculative_split(budget, gdn_slot(c, tp), attention_cell(c, tp), drafts)
    assert any(f"{slots:,} Mamba slots" in n and f"{tokens:,} KV tokens" in n
               and f"max_running_requests {running:,} " in n for n in cap.notes)
    held = ctx + drafts
    assert cap.max_concurrent_users == (min(1 + (tokens - held) // held, running) if tokens >= held else 0)
    assert cap.sequence_limit == running  # max_running_requests: 48 unless the split allows fewer
    assert any("MTP layer's own pool" in n for n in cap.notes)


def test_speculation_gives_the_unused_draft_states_back_to_the_kv_pool():
    """K is solved as if every K / 5 requests kept D states, but only 48 + 1 requests' are taken: on an H100's budget
    the KV pool holds more tokens than without speculation, and max_running_requests is 48."""
    model = load_model(QWEN3_NEXT)
    budget = 27 * GiB
    plain = capacity(model, Workload(ctx=32_768), engine_name="sglang", kv_budget=budget, parallel=Parallelism(tp=4))
    spec = capacity(model, Workload(ctx=32_768), engine_name="sglang", kv_budget=budget, parallel=Parallelism(tp=4),
                    options=EngineOptions(speculative_method="mtp", speculative_tokens=4))
    assert spec.max_concurrent_users > plain.max_concurrent_users
    assert any("states of 49 requests" in n for n in spec.notes)


def test_draft_states_sglang_allocates_fit_in_what_it_reserves():
    """memory_pool.py MambaPool under speculation allocates, for R' + 1 requests, intermediate_ssm_state_cache
    (layers, R' + 1, D, SSM state) and the deduplicated conv windows (layers, R' + 1, conv channels, D + kernel - 2)
    (top-k 1 on CUDA): within the (R' + 1) x D slots _handle_max_mamba_cache reserves."""
    c, tp, drafts = config(QWEN3_NEXT), 4, 4
    layers = c["num_hidden_layers"] - c["num_hidden_layers"] // c["full_attention_interval"]
    hv, dv, hk, dk, kernel = (c["linear_num_value_heads"], c["linear_value_head_dim"], c["linear_num_key_heads"],
                              c["linear_key_head_dim"], c["linear_conv_kernel_dim"])
    ssm = hv // tp * dv * dk * 4
    conv_channels = (hv * dv + 2 * hk * dk) // tp
    per_request = layers * (drafts * ssm + conv_channels * (drafts + kernel - 2) * 2)
    assert per_request <= drafts * gdn_slot(c, tp)


def test_standalone_draft_adds_its_layers_to_the_attention_cell():
    """A standalone draft of d layers adds int(cell x d / n) to the cell of the n full-attention layers
    (DefaultPoolConfigurator counts mambaish.full_attention_layer_ids): Qwen3-0.6B's 28 layers beside Qwen3-Next's
    12 attention layers."""
    c, tp, drafts = config(QWEN3_NEXT), 4, 4
    budget = 27 * GiB
    cap = capacity(load_model(QWEN3_NEXT), Workload(ctx=8192), engine_name="sglang", kv_budget=budget,
                   parallel=Parallelism(tp=tp), draft=load_model("Qwen/Qwen3-0.6B"),
                   options=EngineOptions(speculative_tokens=drafts))
    cell = attention_cell(c, tp)
    cell += cell * config("Qwen/Qwen3-0.6B")["num_hidden_layers"] // 12
    slots, tokens, running = recomputed_speculative_split(budget, gdn_slot(c, tp), cell, drafts)
    assert any(f"{slots:,} Mamba slots" in n and f"{tokens:,} KV tokens" in n for n in cap.notes)


def test_a_recurrent_draft_is_refused_in_one_line(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", QWEN3_NEXT, "--draft-model", QWEN3_NEXT,
                            "--speculative-tokens", "4", "--ctx", "8k", "--gpu", "h100", "--tp", "4",
                            "--engine", "sglang")
    assert_one_line_error(code, err, "draft with layers other than full attention", "--engine vllm")


# --------------------------------------------------------------------------------- --mamba-ssm-dtype (SGLang 0.5.23)


@pytest.mark.parametrize(("flag", "ssm_bytes"), [("bfloat16", 2), ("float16", 2), ("float32", 4), ("auto", 4)])
def test_mamba_ssm_dtype_flag_sets_every_family(flag, ssm_bytes):
    """--mamba-ssm-dtype sets SGLANG_MAMBA_SSM_DTYPE (arg_groups/serving_hook.py), read last by mamba2_state_dtype,
    the default cache params' dtype included: Qwen3-Next (which reads its config) and Granite 4.0-H (which passes no
    config) alike; the conv state stays bf16. SGLang's own hint when the Mamba pool caps requests: "halve the state
    size with --mamba-ssm-dtype bfloat16" (kv_cache_configurator.py resolve_max_num_reqs)."""
    options = EngineOptions(mamba_ssm_cache_dtype=flag)
    model = load_model(QWEN3_NEXT)
    engine = engines.engine("sglang", options, tp=4)
    stage = gpu_layers(engine.cached_layers(model), [model.num_layers], 4)[0]
    pool = engine.pool(stage, model, kv_dtype("bf16"))
    c = config(QWEN3_NEXT)
    layers = c["num_hidden_layers"] - c["num_hidden_layers"] // c["full_attention_interval"]
    hv, dv, hk, dk = (c["linear_num_value_heads"], c["linear_value_head_dim"], c["linear_num_key_heads"],
                      c["linear_key_head_dim"])
    assert pool.slot_bytes == layers * mamba2_state(4, hv * dv, hk, hv, dv, dk, c["linear_conv_kernel_dim"],
                                                    ssm_bytes=ssm_bytes)
    g = config("ibm-granite/granite-4.0-h-small")
    granite = load_model("ibm-granite/granite-4.0-h-small")
    engine = engines.engine("sglang", options, tp=2)
    stage = gpu_layers(engine.cached_layers(granite), [granite.num_layers], 2)[0]
    per_layer = mamba2_state(2, g["mamba_expand"] * g["hidden_size"], g["mamba_n_groups"], g["mamba_n_heads"],
                             g["mamba_d_head"], g["mamba_d_state"], g["mamba_d_conv"], ssm_bytes=ssm_bytes)
    assert engine.pool(stage, granite, kv_dtype("bf16")).slot_bytes == g["layer_types"].count("mamba") * per_layer


def test_bfloat16_state_nearly_doubles_the_slots(monkeypatch, capsys):
    args = ("estimate", "--model", QWEN3_NEXT, "--ctx", "32k", "--gpu", "h100", "--tp", "4", "--engine", "sglang",
            "--json")
    code, out, _ = run_main(monkeypatch, capsys, *args)
    assert code == 0
    plain = json.loads(out)
    code, out, _ = run_main(monkeypatch, capsys, *args, "--mamba-ssm-cache-dtype", "bfloat16")
    assert code == 0
    half = json.loads(out)
    slots = [int(n.split(" Mamba slots")[0].rsplit(" ", 1)[1].replace(",", "")) for run in (plain, half)
             for n in run["notes"] if " Mamba slots" in n]
    assert 1.9 * slots[0] < slots[1] < 2 * slots[0] + 2


# ------------------------------------------- --max-mamba-cache-size and --mamba-full-memory-ratio (SGLang 0.5.23)


def recomputed_fixed_split(budget: int, slot: int, cell: int, size: int, dp: int = 1, drafts: int = 0,
                           per_request: int = 5, context_len: int = 262_144):
    """_handle_max_mamba_cache with max_mamba_cache_size given, in SGLang's floats: size // attn_dp_size slots a DP
    rank whatever the budget; speculating, the drafts' states of min(max(1, 48 // dp), K // ratio) + 1 requests;
    the KV pool gets the rest. resolve_max_num_reqs caps requests at K // ratio."""
    slots = size // dp
    rest_gb = budget / (1 << 30)
    requests = max(1, 48 // dp) if drafts else None
    if drafts:
        capped = min(requests, slots // per_request)
        rest_gb -= slot * (capped + 1) * drafts / (1 << 30)
    rest_gb -= (slots + 1) * slot / (1 << 30)
    tokens = int(rest_gb * (1 << 30)) // cell
    if requests is None:
        running = min(max(min(int(tokens / context_len * 512), 4096), 2048), tokens // 2)
    else:
        running = min(requests, tokens // 2)
    return slots, tokens, min(running, slots // per_request)


def recomputed_ratio_split(budget: int, slot: int, cell: int, ratio: float, per_request: int = 5,
                           context_len: int = 262_144):
    """_handle_max_mamba_cache's auto-fit with mamba_full_memory_ratio r: r / (1 + r) of the budget, in floats."""
    rest_gb = budget / (1 << 30)
    mamba_budget = rest_gb * ratio / (1 + ratio) * (1 << 30)
    slots = int((mamba_budget - slot) // slot)
    tokens = int((rest_gb - (slots + 1) * slot / (1 << 30)) * (1 << 30)) // cell
    estimated = max(min(int(tokens / context_len * 512), 4096), 2048)
    return slots, tokens, min(estimated, tokens // 2, slots // per_request)


def flagged_pool(model_id: str, tp: int = 1, dp: int = 1, **flags):
    model = load_model(model_id)
    engine = engines.engine("sglang", EngineOptions(**flags), tp=tp, dp=dp)
    stage = gpu_layers(engine.cached_layers(model), [model.num_layers], tp)[0]
    return engine.pool(stage, model, kv_dtype(engine.default_kv_dtype(model)))


@pytest.mark.parametrize(("size", "ctx", "budget_gib"), [(200, 1000, 27), (200, 32_768, 27), (200, 131_072, 10),
                                                         (1000, 8192, 60), (5, 1000, 3)])
def test_max_mamba_cache_size_fixes_the_slots(size, ctx, budget_gib):
    """The slots are the flag's whatever the budget, the KV pool gets the rest, and max_running_requests is capped
    at size // 5: Qwen3-Next at TP 4."""
    c, tp = config(QWEN3_NEXT), 4
    budget = budget_gib * GiB
    cap = capacity(load_model(QWEN3_NEXT), Workload(ctx=ctx), engine_name="sglang", kv_budget=budget,
                   parallel=Parallelism(tp=tp), options=EngineOptions(max_mamba_cache_size=size))
    slots, tokens, running = recomputed_fixed_split(budget, gdn_slot(c, tp), attention_cell(c, tp), size)
    assert slots == size
    assert any(f"{slots:,} Mamba slots" in n and f"{tokens:,} KV tokens" in n
               and f"max_running_requests {running:,} " in n for n in cap.notes)
    assert cap.max_concurrent_users == min(tokens // ctx, running)
    assert cap.sequence_limit == size // 5
    # the fixed pool plus the users' tokens is what they take of the budget
    assert cap.engine_kv_bytes_for_users == (size + 1) * gdn_slot(c, tp) + cap.users * ctx * attention_cell(c, tp)


def test_max_mamba_cache_size_is_split_over_dp_ranks():
    """max_mamba_cache_size // attn_dp_size slots a DP rank: 40 over 2 ranks is 20 slots and 4 requests each."""
    c, tp, dp = config(QWEN3_NEXT), 2, 2
    budget = 20 * GiB
    pool = flagged_pool(QWEN3_NEXT, tp=tp, dp=dp, max_mamba_cache_size=40)
    assert pool.split(budget) == recomputed_fixed_split(budget, gdn_slot(c, tp), attention_cell(c, tp), 40, dp=dp)
    assert pool.split(budget).mamba_slots == 20 and pool.sequence_limit(budget) == 4


@pytest.mark.parametrize(("model_id", "tp", "drafts", "size", "budget_gib"), [
    ("Qwen/Qwen3.5-27B", 1, 4, 40, 40), (QWEN3_NEXT, 4, 4, 300, 27), (QWEN3_NEXT, 4, 2, 40, 27)])
def test_max_mamba_cache_size_with_speculation(model_id, tp, drafts, size, budget_gib):
    """With a draft the intermediate states of min(48, K // 5) + 1 requests come out of what the KV pool gets."""
    c = config(model_id)
    budget = budget_gib * GiB
    options = EngineOptions(speculative_method="mtp", speculative_tokens=drafts, max_mamba_cache_size=size)
    cap = capacity(load_model(model_id), Workload(ctx=32_768), engine_name="sglang", kv_budget=budget,
                   parallel=Parallelism(tp=tp), options=options)
    slots, tokens, running = recomputed_fixed_split(budget, gdn_slot(c, tp), attention_cell(c, tp), size,
                                                    drafts=drafts)
    assert any(f"{slots:,} Mamba slots" in n and f"{tokens:,} KV tokens" in n
               and f"max_running_requests {running:,} " in n for n in cap.notes)
    assert cap.sequence_limit == min(48, size // 5)
    held = 32_768 + drafts
    assert cap.max_concurrent_users == min(tokens // held, running)


def test_published_forty_slots_with_speculation_run_eight_requests():
    """jpezzulli/sglang-rtxpro6000 issue #5 (a Qwen3.5-family hybrid on an RTX PRO 6000, 96 GB):
    "--max-mamba-cache-size 40, --speculative-num-steps 3, speculation on. SGLang reports max_running_requests=8
    (40 / 5)". Three steps at top-k 1 verify 4 draft tokens; 8 + 1 requests' draft states are reserved."""
    cap = capacity(load_model("Qwen/Qwen3.5-27B"), Workload(ctx=32_768), engine_name="sglang",
                   hardware=Hardware(name="RTX PRO 6000", memory_bytes=97_887 * MiB),
                   options=EngineOptions(speculative_method="mtp", speculative_tokens=4, max_mamba_cache_size=40))
    assert cap.sequence_limit == 8 and cap.max_concurrent_users == 8
    assert any("max_running_requests 8 (40 slots / 5 = 8)" in n for n in cap.notes)
    assert any("states of 9 requests" in n for n in cap.notes)


@pytest.mark.parametrize("ratio", [0.5, 2.0, 0.25])
@pytest.mark.parametrize("budget_gib", [3, 27, 60])
def test_mamba_full_memory_ratio_sets_the_share(ratio, budget_gib):
    c, tp = config(QWEN3_NEXT), 4
    budget = budget_gib * GiB
    pool = flagged_pool(QWEN3_NEXT, tp=tp, mamba_full_memory_ratio=ratio)
    expected = recomputed_ratio_split(budget, gdn_slot(c, tp), attention_cell(c, tp), ratio)
    assert pool.split(budget) == expected
    assert expected != recomputed_ratio_split(budget, gdn_slot(c, tp), attention_cell(c, tp), 0.9)


def test_mamba_full_memory_ratio_through_the_cli(monkeypatch, capsys):
    """Twice the ratio, 2/3 of the budget to the Mamba pool instead of 9/19: about 1.4 times the slots."""
    args = ("estimate", "--model", QWEN3_NEXT, "--ctx", "32k", "--gpu", "h100", "--tp", "4", "--engine", "sglang",
            "--json")
    runs = []
    for extra in ((), ("--mamba-full-memory-ratio", "2")):
        code, out, _ = run_main(monkeypatch, capsys, *args, *extra)
        assert code == 0
        runs.append(json.loads(out))
    slots = [int(n.split(" Mamba slots")[0].rsplit(" ", 1)[1].replace(",", "")) for run in runs
             for n in run["notes"] if " Mamba slots" in n]
    assert abs(slots[1] - (slots[0] + 1) * (2 / 3) / (9 / 19)) <= 2
    assert any("2/3 of the budget (mamba_full_memory_ratio 2.0)" in n for n in runs[1]["notes"])


@pytest.mark.parametrize(("args", "fragments"), [
    (("--engine", "vllm", "--max-mamba-cache-size", "40"), ("--max-mamba-cache-size is not a vLLM setting",)),
    (("--engine", "vllm", "--mamba-full-memory-ratio", "0.5"), ("--mamba-full-memory-ratio is not a vLLM setting",)),
    (("--engine", "llama.cpp", "--max-mamba-cache-size", "40"), ("not a llama.cpp setting",)),
    (("--engine", "sglang", "--max-mamba-cache-size", "0"), ("--max-mamba-cache-size", "between 1")),
    (("--engine", "sglang", "--max-mamba-cache-size", "-5"), ("--max-mamba-cache-size", "between 1")),
    (("--engine", "sglang", "--mamba-full-memory-ratio", "0"), ("--mamba-full-memory-ratio", "above 0")),
    (("--engine", "sglang", "--mamba-full-memory-ratio", "-1"), ("--mamba-full-memory-ratio", "above 0")),
    (("--engine", "sglang", "--mamba-full-memory-ratio", "nan"), ("--mamba-full-memory-ratio", "above 0")),
    (("--engine", "sglang", "--mamba-full-memory-ratio", "inf"), ("--mamba-full-memory-ratio", "above 0")),
    (("--engine", "sglang", "--max-mamba-cache-size", "4"), ("--max-mamba-cache-size 4", "no request")),
])
def test_mamba_flags_refused_in_one_line(monkeypatch, capsys, args, fragments):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", QWEN3_NEXT, "--ctx", "8k", "--gpu", "h100",
                            "--tp", "4", *args)
    assert_one_line_error(code, err, *fragments)


def test_plan_takes_the_mamba_flags(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "plan", "--model", QWEN3_NEXT, "--ctx", "32k", "--users", "16",
                              "--gpu", "h100", "--engine", "sglang", "--max-mamba-cache-size", "40", "--json")
    assert code in (0, 1), err
    assert json.loads(out)


def test_max_running_requests_alone_reserves_no_draft_states():
    """--max-running-requests without a draft caps the requests; no draft token's state is reserved or reported."""
    cap = capacity(load_model("Qwen/Qwen3.5-27B"), Workload(ctx=8192), engine_name="sglang",
                   hardware=Hardware(name="NVIDIA H100 SXM", memory_bytes=81_559 * MiB), parallel=Parallelism(tp=2),
                   options=EngineOptions(max_num_seqs=7))
    assert cap.max_concurrent_users == 7 == cap.sequence_limit  # TP 2: one instance
    assert not any("draft tokens' states" in note for note in cap.notes)


# ------------------------------------------------------------------ the least budget, and what a plan reports


@pytest.mark.parametrize("drafts", [0, 3])
@pytest.mark.parametrize(("slot", "cell", "share"), [(40, 3, Fraction(9, 19)), (97, 11, Fraction(9, 19)),
                                                      (97, 2, Fraction(1, 3))])
def test_bytes_for_is_the_least_budget_that_serves_the_users(slot, cell, share, drafts):
    """bytes_for(N) is the least budget whose split (checked against SGLang's formulas above) serves N users:
    scanning every budget byte by byte on pools of a few bytes finds no smaller one. Adding a slot takes tokens from
    the KV pool, so a budget just past that serves fewer users than one just before: a search over budgets would
    not find the least."""
    for ctx, prefix in ((5, 0), (17, 4), (400, 30)):  # slots bind first, then tokens
        pool = SglangMambaPool(full_cell=cell, slot_bytes=slot, slots_per_request=5, context_len=64, notes=[],
                               draft_tokens=drafts, requests=48 if drafts else None, share=share)
        budget = 0
        for users in range(1, 9):
            while pool.users_within(budget, ctx, prefix) < users:
                budget += 1
            assert pool.bytes_for(users, ctx, prefix) == budget
    # the longest context for 3 users follows the same count, budget by budget, across the dips
    for budget in range(0, 6000, 7):
        longest = max_ctx(pool, budget, 3, 1000)
        assert longest == 0 or pool.users_within(budget, longest) >= 3
        assert longest == 1000 or pool.users_within(budget, longest + 1) < 3


def test_plan_headroom_is_never_negative(monkeypatch, capsys):
    """Each layout `plan` lists serves the users within its budget, so the least budget it needs leaves headroom
    of zero or more (Qwen3.5-27B, 64 users at 32k on H100s: TP 4 with bf16 KV and int4 weights is within about a
    slot of its budget)."""
    code, out, err = run_main(monkeypatch, capsys, "plan", "--model", "Qwen/Qwen3.5-27B", "--ctx", "32k", "--users",
                              "64", "--gpu", "h100", "--engine", "sglang", "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and rows, err
    assert all(row["headroom_bytes"] >= 0 for row in rows)
    assert min(row["headroom_bytes"] for row in rows) < 64 * MiB


def test_fixed_slots_count_in_the_does_not_fit_line(monkeypatch, capsys):
    """With --max-mamba-cache-size the slots take the budget whatever the users; the line says so."""
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", "Qwen/Qwen3.5-27B", "--ctx", "32k", "--gpu",
                            "h100", "--tp", "4", "--engine", "sglang", "--max-mamba-cache-size", "1460", "--users",
                            "10", "--json")
    cap = json.loads(out)
    assert code == 1 and cap["max_concurrent_users"] == 0
    assert cap["engine_kv_bytes_fixed"] == (1460 + 1) * gdn_slot(config("Qwen/Qwen3.5-27B"), 4)
    assert cap["engine_kv_bytes_fixed"] + cap["engine_kv_bytes_per_sequence"] > cap["kv_budget_bytes"]
    assert "GiB its pools hold whatever the users" in cap["reasons"][0]
    # where one sequence alone is over the budget, that is the reason, as for vLLM's null block at 1M tokens
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", "meta-llama/Llama-3.1-8B", "--ctx", "1M",
                            "--gpu", "rtx-4090", "--users", "2", "--json")
    cap = json.loads(out)
    assert code == 1 and cap["engine_kv_bytes_fixed"] == cap["vllm_block_bytes"] > 0
    assert "pools hold" not in cap["reasons"][0]


# ---------------------------------------------------------------------------------------------- --disable-radix-cache


@pytest.mark.parametrize(("ctx", "budget_gib"), [(4096, 27), (32_768, 27), (1000, 8)])
def test_disable_radix_cache_counts_one_slot_a_request(ctx, budget_gib):
    """`_calculate_mamba_ratio` is 1 under --disable-radix-cache (no MambaRadixCache): the share buys the same slots,
    but each running request takes one, so the Mamba pool admits five times the requests (Qwen3-Next, TP 4)."""
    c, tp = config(QWEN3_NEXT), 4
    budget = budget_gib * GiB
    options = EngineOptions(disable_radix_cache=True)
    cap = capacity(load_model(QWEN3_NEXT), Workload(ctx=ctx), engine_name="sglang", kv_budget=budget,
                   parallel=Parallelism(tp=tp), options=options)
    slots, tokens, running = recomputed_split(budget, gdn_slot(c, tp), attention_cell(c, tp), 1, 262_144)
    assert any(f"{slots:,} Mamba slots" in n and f"{tokens:,} KV tokens" in n
               and f"max_running_requests {running:,} " in n for n in cap.notes)
    assert cap.max_concurrent_users == min(tokens // ctx, running)
    with_radix = capacity(load_model(QWEN3_NEXT), Workload(ctx=ctx), engine_name="sglang", kv_budget=budget,
                          parallel=Parallelism(tp=tp))
    assert with_radix.max_concurrent_users == min(tokens // ctx, slots // 5)


@pytest.mark.parametrize(("requests", "dp", "drafts"), [(64, 1, 0), (64, 2, 0), (None, 1, 4), (16, 1, 3)])
def test_disable_radix_cache_with_a_request_limit_fixes_the_slots(requests, dp, drafts):
    """`_handle_max_mamba_cache`: with the radix cache off and max_running_requests set (given, or 48 with a draft),
    the pool holds max(1, R // attn_dp_size) slots whatever the budget, speculating also the drafts' states of
    R + 1 requests; the KV pool gets the rest."""
    c, tp, budget = config(QWEN3_NEXT), 4, 27 * GiB
    options = EngineOptions(disable_radix_cache=True, max_num_seqs=requests,
                            **(dict(speculative_method="mtp", speculative_tokens=drafts) if drafts else {}))
    cap = capacity(load_model(QWEN3_NEXT), Workload(ctx=8192), engine_name="sglang", kv_budget=budget,
                   parallel=Parallelism(tp=tp // dp, dp=dp), options=options)
    per_rank = max(1, (requests or 48) // dp)
    slot, cell = gdn_slot(c, tp // dp), attention_cell(c, tp // dp)
    rest = budget / (1 << 30) - (per_rank + 1) * slot / (1 << 30) - slot * (per_rank + 1) * drafts / (1 << 30)
    tokens = int(rest * (1 << 30)) // cell
    assert any(f"{per_rank:,} Mamba slots" in n and f"{tokens:,} KV tokens" in n
               and f"max_running_requests {min(per_rank, tokens // 2):,} " in n for n in cap.notes)
    assert cap.max_concurrent_users == min(tokens // (8192 + drafts), per_rank) * dp


def test_disable_radix_cache_refusals(monkeypatch, capsys):
    """No radix cache, no prefix kept once; and the flag is SGLang's alone."""
    args = ("estimate", "--model", QWEN3_NEXT, "--ctx", "8k", "--gpu", "h100", "--tp", "4", "--disable-radix-cache")
    code, _, err = run_main(monkeypatch, capsys, *args, "--engine", "sglang", "--shared-prefix", "1k")
    assert_one_line_error(code, err, "--shared-prefix 1,024", "radix cache")
    code, _, err = run_main(monkeypatch, capsys, *args, "--engine", "vllm")
    assert_one_line_error(code, err, "--disable-radix-cache is not a vLLM setting")
