"""A few of benchmarks/llamacpp_oracle.py's cases against llama.cpp itself, where llama-cpp-python (with `gguf`) is
importable in this interpreter; skipped elsewhere (CI does not build it). Each case writes a tiny GGUF with random
weights, makes a llama.cpp context in a child process and sets the bytes llama.cpp allocates, or its refusal,
beside kvplan's."""

import sys
from pathlib import Path

import pytest
from conftest import load_script

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

ORACLE = load_script("benchmarks/llamacpp_oracle.py", "llamacpp_oracle")
Case = ORACLE.Case
CASES = [
    Case("MQA", 8192, seqs=2, unified=False),
    Case("gemma2", 4096, seqs=4, ubatch=256),
    Case("gpt-oss", 8192, ubatch=1024, batch=1024),
    Case("qwen35", 4096, seqs=2, rs_seq=3),
    Case("jamba", 4096, seqs=2, rs_seq=3, type_k="q8_0", type_v="f16"),
    Case("head 80", 4096, type_k="q8_0", type_v="q8_0",
         refused="K cache type q8_0 with block size 32 does not divide n_embd_head_k=80"),
    Case("deepseek2 MLA", 8192, type_k="q8_0", type_v="f16",
         refused="model does not support different K (q8_0) and V (f16) cache types"),
    Case("dense GQA", 4096, seqs=4, unified=False, flash_attn="off", draft="draft"),
    Case("MQA head 80", 4096, type_k="q8_0", flash_attn="off", refused="GGML_ASSERT"),
    Case("gemma3n", 4096, seqs=2, gguf=True), Case("gemma4", 4096, seqs=2, unified=False, gguf=True),
    Case("kimi-linear", 4096, seqs=2, gguf=True), Case("minimax-01", 8192, gguf=True),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in dict.fromkeys(name for case in CASES for name in (case.family, case.draft) if name):
        directory = tmp_path_factory.mktemp(name.replace(" ", "-"))
        out[name] = ORACLE.build(sys.executable, ORACLE.FAMILIES[name], directory)
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.family}: {case.label}")
def test_kvplan_allocates_as_llama_cpp(built, case):
    path = built[case.family]
    result = ORACLE.run(sys.executable, case, built)
    ours = ORACLE.kvplan_figures(case.source(path), case,
                                 built[case.draft].with_name("config.json") if case.draft else None)
    row = ORACLE.row(ORACLE.FAMILIES[case.family], case, result, ours)
    assert " | yes | " in row, row
