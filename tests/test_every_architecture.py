"""Every causal-LM model type of the installed transformers, each built from its own config class (their defaults
are the published checkpoints' shapes): kvplan's prediction must equal the cache transformers really builds, after
prefill and after decode, and its parameter count the meta-device build's, or the type must be listed below with
the reason it is not checked. See tests/archkit.py for how each model is shrunk and cut.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import archkit  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from kvplan.errors import KvplanError  # noqa: E402

# Decoder fields set before building, where transformers' default config cannot be built or run as it stands but
# every published checkpoint sets the field: model_type -> (fields, why).
EDITS: dict[str, tuple[dict, str]] = {
    # The shrink cuts experts to 4 before these edits, so expert counts and top-k here are shrunk values.
    "deepseek_v2": ({"num_experts_per_tok": 2}, "the router's top-k defaults to None; DeepSeek-V2 and V2-Lite set 6"),
    "dots1": ({"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 2, "first_k_dense_replace": 1},
              "experts, top-k and shared experts default to None; dots.llm1 sets 128, 6, 2 and one dense layer"),
    "hunyuan_v1_moe": ({"head_dim": 128}, "the attention reads head_dim, None by default; Hunyuan-A13B sets 128"),
    "longcat_flash": ({"zero_expert_num": 2, "expert_ffn_hidden_size": 32, "ffn_hidden_size": 64, "moe_topk": 2},
                      "its widths and top-k have names the shrink does not know (LongCat-Flash: 256 zero experts, "
                      "top-12); at full width the model does not fit in memory"),
}
# transformers itself cannot build or run these on the CPU from its own config class (docs/formulas.md lists them):
# model_type -> a fragment of the one-line error kvplan gives; the test fails once transformers can.
TRANSFORMERS_CANNOT: dict[str, str] = {}
# Not yet exact: strict xfails, so a family that becomes exact fails here until it leaves this list.
NOT_YET = {
    # Gemma: layers that reuse an earlier layer's KV, per-layer attention shapes, RG-LRU
    **dict.fromkeys(["gemma3n", "gemma3n_text", "gemma4", "gemma4_assistant", "gemma4_text", "gemma4_unified",
                     "gemma4_unified_assistant", "gemma4_unified_text", "recurrent_gemma"], "gemma"),
    # MLA, DSA indexers, compressed attention, and MoE field dialects
    **dict.fromkeys(["deepseek_v4", "dots3_note", "dots3_note_text", "qwen4_exp", "qwen4_exp_text"], "mla-dsa"),
    # transformers allocates gate_up_proj rows for the zero-compute experts too (`LongcatFlashExperts`), which no
    # checkpoint holds: kvplan counts the checkpoint's (LongCat-Flash 560B), the cache is exact
    "longcat_flash": "mla-dsa",
    # Mamba, Mamba-2 and their hybrids; Gated DeltaNet families
    **dict.fromkeys(["bamba", "falcon_h1", "falcon_mamba", "granitemoehybrid", "mamba", "mamba2",
                     "nemotron_h", "olmo_hybrid", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text",
                     "zamba", "zamba2", "zaya"], "ssm"),
    # short convolutions, lightning attention, RWKV, xLSTM and other recurrent mixers
    **dict.fromkeys(["bailing_hybrid", "blt", "hrm_text", "inkling2_text", "inkling_text", "lfm2", "lfm2_moe",
                     "lfm3", "minimax", "rwkv", "xlstm"], "recurrent"),
    # parameter counts of families read through the Llama-style rules
    **dict.fromkeys(["afmoe", "apertus", "arcee", "aria_text", "bitnet", "cohere2_moe", "cohere_compass_text",
                     "diffllama", "doge", "emu3", "ernie4_5_moe", "exaone4", "exaone_moe", "flex_olmo", "flint",
                     "fuyu", "git", "glm", "glm4", "granite_swa", "granitemoe_swa", "hunyuan_v1_dense",
                     "hyperclovax", "jais2", "jetmoe", "kolibri1", "laguna", "mellum", "ministral", "mllama",
                     "moshi", "nanochat", "nemotron", "olmo", "olmo3", "olmoe", "persimmon", "phi4_multimodal",
                     "phimoe", "seed_oss", "stablelm", "starcoder2"], "llama-style"),
    # GPT-2-era decoders
    **dict.fromkeys(["biogpt", "bloom", "codegen", "cpmant", "ctrl", "dbrx", "falcon", "gpt_neo", "gpt_neox_japanese",
                     "gptj", "mpt", "openai-gpt", "opt", "reformer", "xglm", "xlm", "xlnet"], "legacy"),
    # encoders and encoder-decoders run as causal LMs
    **dict.fromkeys(["bart", "bert", "bert-generation", "big_bird", "bigbird_pegasus", "blenderbot",
                     "blenderbot-small", "camembert", "data2vec-text", "electra", "ernie", "marian", "mbart",
                     "megatron-bert", "modernbert-decoder", "musicgen", "musicgen_melody", "mvp", "pegasus", "plbart",
                     "prophetnet", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "trocr",
                     "whisper", "xlm-roberta", "xlm-roberta-xl", "xmod"], "encoders"),
}


def cases() -> list:
    return list(_cases())


def _cases():
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        if model_type in NOT_YET:
            mark = pytest.mark.xfail(strict=True, reason=f"not yet exact: {NOT_YET[model_type]}")
            yield pytest.param(model_type, marks=mark)
        else:
            yield model_type


@pytest.mark.parametrize("model_type", cases())
def test_cache_and_parameters_equal_transformers(tmp_path, model_type):
    fields, _ = EDITS.get(model_type, ({}, ""))
    data = archkit.shrunk(model_type, **fields)
    if model_type in TRANSFORMERS_CANNOT:
        with pytest.raises(KvplanError, match=TRANSFORMERS_CANNOT[model_type]):
            archkit.check(tmp_path, model_type, data)
        return
    result = archkit.check(tmp_path, model_type, data)
    assert result.exact, result
