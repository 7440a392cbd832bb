"""Deployments a hostile review found broken: layouts whose pipeline stages keep no KV of their own, SGLang's Mamba
pool at extreme ratios, weight offloading past what vLLM can offload. Expected numbers are recomputed here from the
configs' own fields and the engines' source (cited in each test), never from kvplan's helpers."""

import json
import math
from fractions import Fraction

import pytest
from conftest import SPECS, assert_one_line_error, run_main


def config(filename: str) -> dict:
    data = json.loads((SPECS / filename).read_text(encoding="utf-8"))
    return data.get("text_config", data)


def estimate(monkeypatch, capsys, *args: str) -> tuple[int, dict]:
    """`kvplan estimate ... --json`: the exit status (0 fits, 1 does not) and the answer."""
    code, out, err = run_main(monkeypatch, capsys, "estimate", *args, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


NEMOTRON_SUPER = "nvidia__Llama-3_3-Nemotron-Super-49B-v1.json"
GEMMA_3N = "google__gemma-3n-E2B.json"
GEMMA_4 = "google__gemma-4-E2B-it.json"


def nas_attention_layers(c: dict) -> list[bool]:
    """Which Nemotron-NAS layers have attention (block_configs[i].attention.no_op false)."""
    return [not block["attention"]["no_op"] for block in c["block_configs"]]


def nas_kv_bytes_per_layer(c: dict) -> int:
    """K and V of one attention layer, bf16: heads / n_heads_in_group KV heads of hidden / heads."""
    groups = {b["attention"]["n_heads_in_group"] for b in c["block_configs"] if not b["attention"]["no_op"]}
    assert len(groups) == 1
    heads = c["num_attention_heads"]
    return 2 * (heads // groups.pop()) * (c["hidden_size"] // heads) * 2


# ---------------------------------------------------------------- SGLang: layers that keep no KV of their own


@pytest.mark.parametrize("args", [
    ("--model", "nvidia/Llama-3_3-Nemotron-Super-49B-v1", "--ctx", "8k", "--gpu", "rtx-4090"),
    ("--model", "google/gemma-3n-E2B", "--ctx", "1M", "--gpu", "8xh100", "--users", "8"),
    ("--model", "google/gemma-4-E2B-it", "--ctx", "1M", "--gpu", "h100", "--users", "8"),
    ("--model", "google/gemma-4-E2B-it", "--ctx", "128k", "--gpu", "8xh100", "--pp", "2", "--tp", "1"),
])
def test_sglang_plans_models_with_layers_that_keep_no_kv(monkeypatch, capsys, args):
    """A pipeline stage of only no-op or KV-shared layers got a token pool of a 0-byte cell, and the planner divided
    by it (exit 70), in the user's own layout or in the layouts its suggestions try."""
    estimate(monkeypatch, capsys, *args, "--engine", "sglang")


@pytest.mark.parametrize(("filename", "model_id"), [(NEMOTRON_SUPER, "nvidia/Llama-3_3-Nemotron-Super-49B-v1"),
                                                    (GEMMA_3N, "google/gemma-3n-E2B")])
def test_sglang_token_pool_holds_kv_for_every_layer(monkeypatch, capsys, filename, model_id):
    """SGLang 0.5.23 sizes its token pool by the layers of the stage, not what their attention does
    (`DefaultPoolConfigurator`, model_executor/pool_configurator.py: num_effective_layers = end_layer - start_layer;
    the KV head count of Nemotron-NAS from its attention blocks, `get_total_num_kv_heads`): Nemotron Super's 31
    no-op attention layers and Gemma 3n's 10 KV-shared layers each get a K and V slot."""
    c = config(filename)
    if "block_configs" in c:
        per_layer = nas_kv_bytes_per_layer(c)
        assert sum(nas_attention_layers(c)) == 49
    else:
        per_layer = 2 * c["num_key_value_heads"] * c["head_dim"] * 2
    cell = c["num_hidden_layers"] * per_layer
    assert cell == {NEMOTRON_SUPER: 327_680, GEMMA_3N: 61_440}[filename]
    _, data = estimate(monkeypatch, capsys, "--model", model_id, "--ctx", "8k", "--gpu", "h200", "--engine", "sglang")
    assert data["engine_kv_bytes_per_sequence"] == 8192 * cell


@pytest.mark.parametrize("model_id", ["nvidia/Llama-3_3-Nemotron-Super-49B-v1", "google/gemma-3n-E2B"])
def test_sglang_refuses_pipeline_stages_its_model_class_does_not_build(monkeypatch, capsys, model_id):
    """SGLang 0.5.23's DeciLMForCausalLM (srt/models/nemotron_nas.py) and Gemma 3n (srt/models/gemma3n_causal.py)
    build every layer with make_layers and no pipeline split: --pp is refused, and the layouts a suggestion tries
    have one stage."""
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", model_id, "--ctx", "8k", "--gpu", "8xh100",
                            "--pp", "8", "--tp", "1", "--engine", "sglang")
    assert_one_line_error(code, err, "no pipeline parallelism", "--tp")
    code, data = estimate(monkeypatch, capsys, "--model", model_id, "--ctx", "8k", "--users", "64", "--gpu",
                          "rtx-4090", "--engine", "sglang")
    assert code == 1 and data["suggestions"] and not any("PP" in s for s in data["suggestions"])


def test_sglang_sizes_kv_shared_layers_by_their_type_in_each_stage(monkeypatch, capsys):
    """Gemma 4 E2B at PP 2 (SGLang `get_pp_indices`: 17 and 18 of the 35 layers): the sliding-window pools count
    every layer of each type in the stage, KV-shared ones included (`get_hybrid_layer_ids` from layer_types). The
    second stage binds, with 4 full layers (K and V of global_head_dim) and 14 sliding ones (of head_dim); at
    8,192 tokens a user holds 8,192 full-pool tokens and the sliding pool 0.8 x as many (swa_full_tokens_ratio)."""
    c = config(GEMMA_4)
    types = c["layer_types"][17:]
    full = types.count("full_attention") * 2 * c["num_key_value_heads"] * c["global_head_dim"] * 2
    sliding = types.count("sliding_attention") * 2 * c["num_key_value_heads"] * c["head_dim"] * 2
    assert (full, sliding) == (4 * 2048, 14 * 1024)
    _, data = estimate(monkeypatch, capsys, "--model", "google/gemma-4-E2B-it", "--ctx", "8k", "--gpu", "8xh100",
                       "--pp", "2", "--tp", "1", "--engine", "sglang")
    assert data["engine_kv_bytes_per_sequence"] == 8192 * full + math.ceil(8192 * 0.8) * sliding


def test_sglang_refuses_a_stage_that_still_keeps_no_kv(monkeypatch, capsys, write_json):
    """A text request's Llama 3.2 Vision layers that cross-attend to the image cache nothing (kvplan counts text
    requests); with both of a stage's layers such, SGLang's pool for it has no cell and SGLang sizes it by the
    context length (DefaultPoolConfigurator), which kvplan does not model: one line, not a division by zero. Its
    attention layers of different KV head counts are refused as SGLang refuses Nemotron-NAS's (VGQA)."""
    config = write_json({"model_type": "mllama_text_model", "num_hidden_layers": 4, "hidden_size": 256,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
                         "vocab_size": 1000, "torch_dtype": "bfloat16", "cross_attention_layers": [2, 3]})
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(config), "--ctx", "8k", "--gpu",
                            "2xh100", "--pp", "2", "--tp", "1", "--engine", "sglang")
    assert_one_line_error(code, err, "pipeline stage whose layers keep no KV", "--pp")
    estimate(monkeypatch, capsys, "--model", str(config), "--ctx", "8k", "--gpu", "h100", "--engine", "sglang")
    nas = json.loads((SPECS / NEMOTRON_SUPER).read_text(encoding="utf-8"))
    nas["block_configs"][0]["attention"]["n_heads_in_group"] = 4
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(write_json(nas)), "--ctx", "8k",
                            "--gpu", "h200", "--engine", "sglang")
    assert_one_line_error(code, err, "Variable GQA")


# ---------------------------------------------------------------- other engines: a stage with no KV


def test_vllm_refuses_a_stage_with_no_kv_in_one_line(monkeypatch, capsys):
    """Nemotron Super at PP 8 (10 layers a stage): layers 60-69 are all no-op attention. vLLM's KV cache planning
    asserts every stage's block holds bytes (`_get_kv_cache_bytes_per_block`, v1/core/kv_cache_planning.py)."""
    c = config(NEMOTRON_SUPER)
    assert not any(nas_attention_layers(c)[60:70])
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "nvidia/Llama-3_3-Nemotron-Super-49B-v1",
                            "--ctx", "8k", "--gpu", "8xh100", "--pp", "8", "--tp", "1")
    assert_one_line_error(code, err, "--pp 8", "keep no KV cache")


def test_layout_search_passes_over_layouts_the_engine_refuses(monkeypatch, capsys):
    """Nemotron Super does not fit one RTX 4090; the layouts the suggestion tries include PP ones with a stage of
    no KV, which vLLM cannot start: they are passed over, not the end of the run (it said the model "keeps no
    per-sequence cache")."""
    code, data = estimate(monkeypatch, capsys, "--model", "nvidia/Llama-3_3-Nemotron-Super-49B-v1", "--ctx", "8k",
                          "--gpu", "rtx-4090")
    assert code == 1 and any(s.startswith("needs") for s in data["suggestions"])


def test_sglang_suggestions_pass_over_layouts_whose_default_fraction_is_negative(monkeypatch, capsys):
    """SGLang reserves 3 x cuda_graph_max_bs x dp_size MiB more with DP attention (`_handle_gpu_memory_settings`):
    at 32 DP ranks of an H100 (cuda_graph_max_bs 512) that is 48 GiB plus 24 GiB, past the GPU; the search for
    more GPUs passed such a layout to capacity, whose refusal ended the run."""
    reserved_mib = 512 + 1.5 * 8192 + 2 * 512 + 32 / 8 * 1024 + 512 * 32 * 3 + 512 * 32 * 1.5
    assert reserved_mib > 81_559
    code, data = estimate(monkeypatch, capsys, "--model", "mistralai/Mixtral-8x7B-v0.1", "--ctx", "1M", "--users",
                          "8", "--gpu", "h100", "--engine", "sglang")
    assert code == 1 and data["suggestions"]


def test_plan_still_names_what_the_engine_refuses(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "plan", "--model", "ai21labs/Jamba-v0.1", "--ctx", "8k", "--users",
                            "4", "--gpu", "h100", "--engine", "sglang")
    assert_one_line_error(code, err, "does not run jamba")


@pytest.mark.parametrize("engine", ["ideal", "tensorrt-llm"])
def test_a_stage_with_no_kv_binds_nothing(monkeypatch, capsys, engine):
    """Nemotron Super at PP 8 (vLLM's `get_pp_indices`, 10 layers a stage) under engines that keep every token (1M
    is a whole number of TensorRT-LLM's 32-token blocks): a stage of no-op layers holds users for nothing ("no user
    limit" ended the run); the stages with the most attention layers bind, 10 of them (layers 20-29)."""
    c = config(NEMOTRON_SUPER)
    attention = nas_attention_layers(c)
    fullest = max(sum(attention[i:i + 10]) for i in range(0, 80, 10))
    assert fullest == 10 and not any(attention[60:70])
    _, data = estimate(monkeypatch, capsys, "--model", "nvidia/Llama-3_3-Nemotron-Super-49B-v1", "--ctx", "1M",
                       "--users", "8", "--gpu", "8xh100", "--pp", "8", "--tp", "1", "--engine", engine)
    per_user = fullest * nas_kv_bytes_per_layer(c) * 2**20
    assert data["max_concurrent_users"] == data["kv_budget_bytes"] // per_user


# ---------------------------------------------------------------- SGLang's Mamba pool at extreme ratios


def first_range_that_serves(pool, users: int, ctx: int) -> int:
    """The least budget serving `users`, slot count by slot count (as `bytes_for` once searched, in steps that grew
    with the ratio): the first K whose range of budgets holds max(its start, its fixed bytes + the users' KV)."""
    kv = pool.tokens_needed(users, ctx) * pool.full_cell
    slots = users * pool.slots_per_request
    while True:
        least = max(pool.least_budget_for(slots), pool.fixed_bytes(slots) + kv)
        if pool.slots_in(least) == slots:
            return least
        slots += 1


@pytest.mark.parametrize("drafts", [0, 3])
@pytest.mark.parametrize("ratio", [1000, Fraction(1, 1000)], ids=["1000", "1/1000"])
def test_mamba_budget_search_at_extreme_ratios(ratio, drafts):
    """`bytes_for` bisects over runs of slots; it gives the first range that serves the users, as stepping does
    (`first_range_that_serves`; at moderate ratios both equal a byte-by-byte scan, test_sglang_mamba.py)."""
    from kvplan.engines.sglang import SglangMambaPool

    share = Fraction(ratio) / (1 + Fraction(ratio))
    for slot, cell in ((40, 3), (97, 11)):
        pool = SglangMambaPool(full_cell=cell, slot_bytes=slot, slots_per_request=5, context_len=64, notes=[],
                               draft_tokens=drafts, requests=48 if drafts else None, share=share)
        for users in (1, 2, 7):
            for ctx in (5, 400):
                assert pool.bytes_for(users, ctx) == first_range_that_serves(pool, users, ctx)


def test_mamba_full_memory_ratio_of_a_million_answers_at_once():
    """Stepping slot by slot took 28 s at --mamba-full-memory-ratio 1e4 and grew with the ratio."""
    from conftest import run_cli

    result = run_cli("estimate", "--model", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--ctx", "8k", "--gpu", "8xh100",
                     "--engine", "sglang", "--mamba-full-memory-ratio", "1e6", "--users", "4096", "--json",
                     timeout=60)
    assert result.returncode in (0, 1), result.stderr
    assert json.loads(result.stdout)["engine_kv_bytes_for_users"] > 0


# ---------------------------------------------------------------- vLLM --cpu-offload-gb past what it can offload


@pytest.mark.parametrize(("gpu", "tp"), [("h100", 1), ("2xh100", 2)])
def test_cpu_offload_leaves_embeddings_lm_head_and_final_norm_on_the_gpu(monkeypatch, capsys, gpu, tp):
    """vLLM's UVA offloader wraps the modules `make_layers` builds (model_executor/models/utils.py): embed_tokens,
    lm_head and the final norm stay on the GPU. Llama-3-8B, bf16: 2 x vocab x hidden x 2 B split by TP, plus the
    norm's hidden x 2 B on every GPU; --cpu-offload-gb past the weights left 0 B on the GPU."""
    c = config("meta-llama__Meta-Llama-3-8B.json")
    assert not c["tie_word_embeddings"]
    kept = 2 * c["vocab_size"] * c["hidden_size"] * 2 // tp + c["hidden_size"] * 2
    assert kept == {1: 2_101_354_496, 2: 1_050_681_344}[tp]
    _, data = estimate(monkeypatch, capsys, "--model", "llama-3-8b", "--ctx", "8k", "--gpu", gpu,
                       "--cpu-offload-gb", "1000")
    _, full = estimate(monkeypatch, capsys, "--model", "llama-3-8b", "--ctx", "8k", "--gpu", gpu)
    assert data["weights_bytes_per_gpu"] == kept
    assert data["weights_offloaded_bytes_per_gpu"] == full["weights_bytes_per_gpu"] - kept
    assert data["kv_budget_bytes"] - full["kv_budget_bytes"] == data["weights_offloaded_bytes_per_gpu"]


# ---------------------------------------------------------------- the whole library, every engine, every layout


def test_a_sample_of_the_library_sweep():
    """benchmarks/library_sweep.py runs every bundled model under every engine at 128k and 1M, for 1 and 8 users, on
    one H100 and eight (one TP group, 2 and 8 pipeline stages): 7,744 runs, each exit 0 or 1 or a refusal by design
    (about 400 s). Here each model under one engine, in turn, at one ctx and one user count, in every layout."""
    from conftest import load_script

    from kvplan.sources import library, load_model

    sweep = load_script("benchmarks/library_sweep.py", "library_sweep")
    failures = []
    for i, entry in enumerate(library.entries()):
        engine, ctx, users = sweep.ENGINES[i % 6], sweep.CTXS[i // 6 % 2], sweep.USERS[i // 12 % 2]
        for layout in sweep.layouts(load_model(entry.id), engine):
            args = ["estimate", "--model", entry.id, "--ctx", ctx, "--users", users, "--engine", engine, *layout,
                    "--json"]
            outcome, detail = sweep.run(args)
            if outcome == "failed":
                failures.append(f"kvplan {' '.join(args)}: {detail}")
    assert not failures, "\n".join(failures)
