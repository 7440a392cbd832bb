"""An engine's stored form of a model's caches is built once per search (`Engine.stored_once`), remembered by the
model and the engine's class, release and flags. A memo keyed on less would hand one engine's, flag's or model's
caches to the next: each result here is checked against the same asked of a fresh copy of the model, which no memo
has seen, and copies that share the very tuple of caches are stored as their own."""

import json

from conftest import load, run_cli, run_main

from kvplan import engines
from kvplan.engines import EngineOptions

NEMOTRON_H = "nvidia__Nemotron-H-56B-Base-8K.json"  # Mamba-2 and attention; no SSM dtype in its config

# vLLM flags that change how it stores Nemotron-H's states: the SSM dtype (--mamba-ssm-cache-dtype, and the
# family's default by release where the config names none), the CPU platform's fp32 states, a speculative
# method's wider convolution
VLLM_OPTIONS = [EngineOptions(), EngineOptions(mamba_ssm_cache_dtype="float16"),
                EngineOptions(mamba_ssm_cache_dtype="bfloat16"), EngineOptions(version="0.19.1"),
                EngineOptions(platform="cpu"), EngineOptions(speculative_method="mtp", speculative_tokens=2)]


def fresh(model):
    """The model with a new tuple of the same caches: nothing remembered of it."""
    return model.model_copy(update={"caches": tuple(list(model.caches))})


def states(caches) -> set[tuple]:
    return {(c.ssm_dtype, c.conv_dtype, c.conv_elements) for c in caches if c.kind == "recurrent"}


def test_each_engine_and_flag_stores_the_caches_as_it_alone_does():
    model = load(NEMOTRON_H)
    seen = []
    others = [("sglang", EngineOptions(), 1), ("sglang", EngineOptions(mamba_ssm_cache_dtype="float16"), 2),
              ("transformers", EngineOptions(), 1)]
    for name, options, tp in [*(("vllm", o, tp) for o in VLLM_OPTIONS for tp in (1, 2)), *others,
                              ("vllm", EngineOptions(), 4)]:
        stored = engines.engine(name, options, tp=tp).cached_layers(model)
        assert stored == engines.engine(name, options, tp=tp).cached_layers(fresh(model)), (name, options)
        seen.append(states(stored))
    assert len({frozenset(s) for s in seen}) >= 7  # the engines and flags above store the states in as many ways


def test_a_copy_of_another_family_sharing_the_caches_is_stored_as_its_own():
    """vLLM takes Nemotron-H's SSM dtype from its config, fp32 where it names none (from 0.20.0); Jamba's state
    stays in the model's dtype. The copy shares the very tuple of caches."""
    model = load(NEMOTRON_H)
    jamba = model.model_copy(update={"architecture": "jamba"})
    vllm = engines.engine("vllm", EngineOptions())
    conv = (256 * 64 + 2 * 8 * 256) * (4 - 1)  # (d_inner + 2 G N) x (kernel - 1): 256 heads of 64, 8 groups, N 256
    assert states(vllm.cached_layers(model)) == {("fp32", None, conv)}
    assert states(vllm.cached_layers(jamba)) == {(None, None, conv)}  # None: the model's dtype
    assert vllm.cached_layers(jamba) == vllm.cached_layers(fresh(jamba))


def test_a_copy_with_other_heads_sharing_the_caches_is_stored_as_its_own():
    """transformers' Falcon with new_decoder_architecture caches K/V broadcast to every query head: Falcon-40B's 8
    KV heads as its 128, a copy's as its 64."""
    model = load("tiiuae__falcon-40b.json")
    copy = model.model_copy(update={"num_attention_heads": 64})
    transformers = engines.engine("transformers", EngineOptions())
    assert {c.kv_heads for c in model.caches} == {8}
    assert {c.kv_heads for c in transformers.cached_layers(model)} == {128}
    assert {c.kv_heads for c in transformers.cached_layers(copy)} == {64}


def test_two_plans_one_after_another_give_what_each_gives_alone(monkeypatch, capsys):
    plans = [["-m", "nvidia/Nemotron-H-56B-Base-8K", "--mamba-ssm-cache-dtype", "float16"],
             ["-m", "nvidia/Nemotron-H-56B-Base-8K"],
             ["-m", "nvidia/Nemotron-H-56B-Base-8K", "--engine", "sglang"]]
    common = ["--gpu", "h100", "--ctx", "8k", "--users", "16", "--max-gpus", "8", "--json"]
    in_turn = []
    for args in plans:
        code, out, err = run_main(monkeypatch, capsys, "plan", *args, *common)
        assert code == 0, err
        in_turn.append(json.loads(out))
    alone = []
    for args in plans:
        result = run_cli("plan", *args, *common)
        assert result.returncode == 0, result.stderr
        alone.append(json.loads(result.stdout))
    assert in_turn == alone
    assert in_turn[0] != in_turn[1] != in_turn[2]  # the flag and the engine change the plan
