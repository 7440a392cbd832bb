"""The compute buffer of three llama.cpp graphs with terms of their own (Gemma 3n's per-layer inputs and AltUp
streams, MiniMax-01's lightning attention, Kimi Linear's KDA), of the routed experts' moment at two real
checkpoints' widths (Kimi Linear 48B's and Qwen3-30B-A3B's, whose experts' outputs lie above their SwiGLU), and of
DeepSeek's MLA with its queries absorbed into the latent (two small widths, DeepSeek-V3's and DeepSeek-V2-Lite's),
and of Gated DeltaNet with the states it reads and writes, n_rs_seq rollback rows among them (Qwen3-Next's and
Qwen3.5's small graphs, Qwen3.5-27B's and Qwen3.5-35B-A3B's widths), against what llama.cpp itself logged.

The models are benchmarks/llamacpp_oracle.py's: its GGUF metadata, and the tensors llama.cpp's own loader creates
for it (`llama_model_init_from_user`, saved by `llama_model_save_to_file`, read back by gguf-py; recorded in
tests/data/llamacpp_tensors.json), written here by gguf-py with zero weights. LOGGED holds the "CPU compute buffer
size" llama.cpp logged for each context: llama-cpp-python 0.3.36 (llama.cpp 0c1e57098), CPU backend (avx2,
avx512f, avx512_bf16), 2026-11-28, the same rows as docs/accuracy.md. kvplan reads the GGUF and must be within 5%
of each."""

import json

import pytest
from conftest import ROOT, MiB, load_script
from ggufkit import Q, write_gguf

ORACLE = load_script("benchmarks/llamacpp_oracle.py", "llamacpp_oracle")
Case = ORACLE.Case
TENSORS = json.loads((ROOT / "tests/data/llamacpp_tensors.json").read_text(encoding="utf-8"))

LOGGED = [  # (context, MiB llama.cpp logged)
    (Case("gemma3n", 4096, seqs=2, gguf=True), 53.77),
    (Case("gemma3n", 8192, ubatch=256, gguf=True), 26.76),
    (Case("gemma3n", 4096, ubatch=1024, batch=1024, gguf=True), 100.54),
    (Case("gemma3n", 4096, seqs=2, flash_attn="off", gguf=True), 99.51),
    (Case("gemma3n E 2048", 4096, seqs=2, gguf=True), 98.77),
    (Case("gemma3n E 2048", 8192, ubatch=256, gguf=True), 49.26),
    (Case("kimi-linear", 4096, seqs=2, gguf=True), 13.17),
    (Case("kimi-linear", 4096, seqs=2, flash_attn="off", gguf=True), 83.78),
    (Case("kimi-linear", 8192, ubatch=256, gguf=True), 6.58),
    (Case("kimi-linear", 4096, ubatch=1024, batch=1024, gguf=True), 18.09),
    (Case("kimi-linear 4 x 128", 4096, seqs=2, gguf=True), 18.58),
    (Case("kimi-linear 4 x 128", 8192, ubatch=256, gguf=True), 9.29),
    (Case("minimax-01", 4096, seqs=2, gguf=True), 24.04),
    (Case("minimax-01", 8192, gguf=True), 24.04),
    (Case("minimax-01", 8192, ubatch=256, gguf=True), 9.02),
    (Case("minimax-01", 4096, ubatch=1024, batch=1024, gguf=True), 64.09),
    (Case("minimax-01", 4096, seqs=2, flash_attn="off", gguf=True), 85.02),
    (Case("minimax-01 8 x 128", 4096, seqs=2, gguf=True), 48.04),
    (Case("minimax-01 8 x 128", 8192, ubatch=256, gguf=True), 18.02),
    (Case("Kimi-Linear-48B widths", 4096, seqs=2, gguf=True), 113.51),
    (Case("Kimi-Linear-48B widths", 8192, ubatch=256, gguf=True), 56.75),
    (Case("Kimi-Linear-48B widths", 4096, seqs=2, flash_attn="off", gguf=True), 626.01),
    (Case("Qwen3-30B-A3B widths", 4096, seqs=2, gguf=True), 96.01),
    (Case("Qwen3-30B-A3B widths", 8192, ubatch=256, gguf=True), 48.01),
    (Case("Qwen3-30B-A3B widths", 4096, ubatch=1024, batch=1024, gguf=True), 184.02),
    (Case("deepseek2 MLA", 8192, gguf=True), 34.01),
    (Case("deepseek2 MLA 1024", 8192, gguf=True), 36.01),
    (Case("deepseek2 MLA 1024", 8192, ubatch=256, gguf=True), 18.00),
    (Case("deepseek2 MLA 1024", 4096, ubatch=1024, batch=1024, gguf=True), 64.02),
    (Case("DeepSeek-V3 widths", 8192, gguf=True), 416.01),
    (Case("DeepSeek-V3 widths", 8192, ubatch=256, gguf=True), 208.00),
    (Case("DeepSeek-V3 widths", 4096, seqs=2, flash_attn="off", gguf=True), 2472.01),
    (Case("DeepSeek-V2-Lite widths", 8192, gguf=True), 88.13),
    (Case("qwen3next", 4096, seqs=2, gguf=True), 18.01),
    (Case("qwen35", 4096, seqs=3, rs_seq=5, gguf=True), 24.38),
    (Case("Qwen3.5-27B widths", 4096, seqs=2, gguf=True), 140.02),
    (Case("Qwen3.5-27B widths", 4096, seqs=4, rs_seq=3, gguf=True), 166.96),
    (Case("Qwen3.5-27B widths", 8192, ubatch=256, gguf=True), 70.01),
    (Case("Qwen3.5-35B-A3B widths", 4096, seqs=4, rs_seq=3, gguf=True), 120.39),
]


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory) -> dict:
    out = {}
    for name in dict.fromkeys(case.family for case, _ in LOGGED):
        family = ORACLE.FAMILIES[name]
        tensors = [(tensor, shape, Q.F32 if len(shape) == 1 else Q.F16) for tensor, shape in TENSORS[name]]
        out[name] = write_gguf(tmp_path_factory.mktemp("gguf") / "model.gguf", family.arch, family.metadata,
                               tensors)
    return out


@pytest.mark.parametrize(("case", "logged_mib"), LOGGED, ids=[f"{c.family}: {c.label}" for c, _ in LOGGED])
def test_compute_buffer_within_5_percent_of_llama_cpp(gguf_files, case, logged_mib):
    figure = ORACLE.kvplan_figures(gguf_files[case.family], case)["compute"] / MiB
    assert abs(figure - logged_mib) <= 0.05 * logged_mib, (case.family, case.label, figure, logged_mib)
