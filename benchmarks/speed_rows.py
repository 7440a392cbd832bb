"""The calibration file's rows (tests/data/speed/calibration.csv: real serving runs of vLLM, SGLang and TensorRT-LLM,
from ai-dynamo/aiconfigurator's silicon measurements) as kvplan's speed model takes them: a library model, a GPU
of the catalogue, an engine, a layout, dtypes and a workload, beside the measured TTFT and TPOT.

How the columns read (aiconfigurator's own conventions, checked against `silicon_concurrency` in
silicon_data_source, the instance's concurrency used here, and against the runs the file holds twice):
    batch_size        the requests one attention-DP rank holds: silicon_concurrency = batch_size x attention_dp_size
    tp_size           the attention TP of a rank; attention_dp_size its ranks; moe_tp_size x moe_ep_size the GPUs
                      the routed experts span, which is tp x dp, but:
      n x n           where tp_size x attention_dp_size = moe_tp_size x moe_ep_size = n^2 (moe_tp = moe_ep = n,
                      or tp = dp = n under vLLM), the instance is n GPUs recorded squared: 69 of the 345 such runs
                      are in the file twice, once so and once as n GPUs, with the same TTFT and TPOT to the last
                      digit (SGLang's "tp 64, moe 8 x 8" DeepSeek-R1 runs are its "tp 8, ep 8" ones; TensorRT-LLM's
                      "attention DP 64, moe 8 x 8" its "attention DP 8, ep 8"; vLLM's "tp 4, DP 4, ep 16" MiniMax
                      runs its "tp 4, ep 4"), and the runs' own ids name tp{n}_ep{n}. Read: the squared field over
                      n GPUs, the experts whole over n (expert parallel).
      blank DP        a row without attention_dp_size (the gap-analysis runs) whose silicon_concurrency is
                      batch_size x tp_size runs attention DP over its tp_size GPUs (TensorRT-LLM
                      enable_attention_dp), batch_size a rank's.
      larger moe      where moe_tp_size x moe_ep_size is larger than tp_size (vLLM's Qwen3-235B gap-analysis
                      runs), the instance is that many GPUs, the rest of them data-parallel attention ranks.
      above 8         a tp_size above 8 (GB200 NVL72 racks: TensorRT-LLM on 12 to 64 GPUs, SGLang on 72) is a wide
                      expert-parallel instance: attention data-parallel on every GPU (TensorRT-LLM
                      enable_attention_dp, SGLang --enable-dp-attention; as attention TP it would not divide
                      DeepSeek's 128 heads), the experts whole over every GPU (as sliced experts DeepSeek's 2,048
                      expert width would not divide over 12, 20, 24, 28, 36, 40, 48, 52 or 72 GPUs).
    precision         the weights: fp8, fp4 (NVFP4 on Blackwell; gpt-oss's own MXFP4 checkpoint), bf16
    model_path        nvidia/DeepSeek-R1-NVFP4 and nvidia/DeepSeek-V3.1-NVFP4 are DeepSeek-R1 and V3 with NVFP4
                      weights (V3.1 has V3's architecture)
The KV dtype is not stated: the engine's default for the checkpoint (bf16 here) unless a caller asks for another.

One run, several rows: the file merges aiconfigurator's database dump (ids ending _cfg<n>) with the per-day result
files it was built from (ids starting with the file's date), so 542 rows repeat a run another row already holds:
the same engine image, GPU, layout (as read above), workload, TTFT and TPOT to the last digit. Read once each (the
first listed), the file is 1,959 runs. Held twice, a run weighs twice in the fit and, where the copies carry
different model names (181 DeepSeek runs on H200 and B200 are `deepseek-ai/DeepSeek-V3` in the dump and
DeepSeek-R1 in the day files, their ids dsr1_), a model left out of the fit is judged on runs fitted on.

Speculative decoding, which no column states: the runs come from SemiAnalysisAI/InferenceX's sweeps (their
day files name that project's images, `nvcr.io#nvidia/...`, and the sweep's commit time as `measured`), each run
on a merge to main of the configurations its perf-changelog.yaml entry lists. Four sweeps ran only MTP
configurations, so every run they measured drafted (`mtp_drafts`):
    2026-01-14  PR 392, dsr1-fp4-b200-trt-mtp, dsr1-fp8-b200-trt-mtp, dsr1-fp8-h200-trt-mtp (TensorRT-LLM
                1.1.0rc2.post2; no other NVIDIA sweep that day)
    2026-02-05  PR 632, dsr1-fp8-b200-trt-mtp (1.2.0rc6.post3, an image only the MTP configurations used)
    2026-02-06  PR 642, dsr1-fp4-b200-trt-mtp (1.2.0rc6.post3)
                TensorRT-LLM's MTP with num_nextn_predict_layers 3, 1 with attention DP (the configurations'
                scripts, benchmarks/dsr1_*_trt_mtp*.sh)
    2026-03-20  PR 898, qwen3.5-fp8-b200-sglang-mtp (SGLang 0.5.9): EAGLE over Qwen3.5's MTP layer,
                --speculative-num-steps 3, --speculative-eagle-topk 1, --speculative-num-draft-tokens 4
The other sweeps either ran no MTP configuration or, DeepSeek-R1 under SGLang 0.5.9 on 2026-03-25 (PR 943's
image update of dsr1-fp8-b200-sglang and dsr1-fp8-b200-sglang-mtp together), both alike on the same layouts: those
runs are read as drafting nothing. A run listed several times drafts if any of its rows names such a sweep.

What a run's release did that today's releases, which the estimate takes, do not: `deepgemm_padding_ms` (vLLM
0.11.1 to 0.12.x padded its DeepGEMM experts on Hopper), added to those runs' decode steps (`release_terms`).
"""

import csv
import math
import re
from dataclasses import dataclass, replace
from math import isqrt
from pathlib import Path

from kvplan import gpus
from kvplan.speed import Deployment
from kvplan.speed.bound import tensor_tflops
from kvplan.speed.calibrated import Terms

CALIBRATION = Path(__file__).resolve().parent.parent / "tests" / "data" / "speed" / "calibration.csv"
ENGINES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt-llm"}
GPUS = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200"}
MODELS = {"nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
          "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-ai/DeepSeek-V3"}
CHECKPOINT_FP8 = ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3", "MiniMaxAI/MiniMax-M2.5",
                  "Qwen/Qwen3-235B-A22B-FP8")
WIDEST_TP = 8  # a larger tp_size is a wide-EP instance: attention DP over tp_size ranks (see above)
CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")
# the sweeps that ran only MTP configurations (the module docstring): (engine, model, day measured)
MTP_SWEEPS = {("tensorrt-llm", "deepseek-ai/DeepSeek-R1", day) for day in ("2026-01-14", "2026-02-05", "2026-02-06")}
MTP_SWEEPS.add(("sglang", "Qwen/Qwen3.5-397B-A17B", "2026-03-20"))
MEASURED = re.compile(r"measured=(\d{4}-\d\d-\d\d)")


@dataclass(frozen=True)
class Row:
    id: str
    engine: str
    version: str
    model: str
    gpu: str
    weights_dtype: str | None  # None: the checkpoint's own
    tp: int
    dp: int
    ep: int
    isl: int
    osl: int
    concurrency: int
    ttft_ms: float
    tpot_ms: float
    source: str
    mtp_drafts: int = 0  # tokens drafted a step by the MTP layers (the module docstring)

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


def weights_dtype(model: str, precision: str) -> str | None:
    if precision == "fp4":
        return None if model == "openai/gpt-oss-120b" else "nvfp4"
    if precision == "fp8":
        return None if model in CHECKPOINT_FP8 else "fp8"
    return None if precision in ("", "bf16") else precision


def layout(raw: dict) -> tuple[int, int, int]:
    """(tp, dp, ep) of a row: the instance's attention TP, its attention-DP ranks and its expert-parallel GPUs, by
    the rules in the module docstring."""
    tp, dp, stated_dp = int(raw["tp_size"]), int(raw["attention_dp_size"] or 1), bool(raw["attention_dp_size"])
    moe_tp, moe_ep = int(raw["moe_tp_size"]), int(raw["moe_ep_size"])
    n = isqrt(tp * dp)
    squared = n > 1 and n * n == tp * dp == moe_tp * moe_ep and (moe_tp == moe_ep or tp == dp)
    if stated_dp and squared:  # n GPUs recorded as n x n: n ranks of attention DP, else TP n, experts over n
        return (1, n, n) if dp == n * n else (n, 1, n)
    stated = CONCURRENCY.search(raw["silicon_data_source"])
    if not stated_dp and tp > 1 and stated and int(stated.group(1)) == int(raw["batch_size"]) * tp:
        return 1, tp, moe_ep  # attention DP over tp_size GPUs, batch_size a rank's
    if moe_tp * moe_ep > tp * dp:
        dp = moe_tp * moe_ep // tp
    if tp > WIDEST_TP:  # wide expert parallelism: attention DP on every GPU, experts whole over all of them
        return 1, tp * dp, tp * dp
    return tp, dp, moe_ep


def mtp_drafts(engine: str, model: str, source: str, dp: int) -> int:
    """Tokens a run's steps drafted by the MTP layers: 3 in the sweeps of MTP configurations (1 for TensorRT-LLM
    with attention DP), else 0 (the module docstring)."""
    measured = MEASURED.search(source)
    if not measured or (engine, model, measured.group(1)) not in MTP_SWEEPS:
        return 0
    return 1 if engine == "tensorrt-llm" and dp > 1 else 3


def read_all(path: Path = CALIBRATION) -> list[Row]:
    """Every row of the file, repeats included."""
    rows = []
    with path.open(newline="", encoding="utf-8") as handle:
        for raw in csv.DictReader(handle):
            model = MODELS.get(raw["model_path"], raw["model_path"])
            tp, dp, ep = layout(raw)
            stated = CONCURRENCY.search(raw["silicon_data_source"])
            rows.append(Row(
                id=raw["id"], engine=ENGINES[raw["backend"]], version=raw["backend_version"], model=model,
                gpu=GPUS[raw["system"]], weights_dtype=weights_dtype(model, raw["precision"]), tp=tp, dp=dp, ep=ep,
                isl=int(raw["isl"]), osl=int(raw["osl"]),
                concurrency=int(stated.group(1)) if stated else int(raw["batch_size"]) * dp,
                ttft_ms=float(raw["silicon_ttft_ms"]), tpot_ms=float(raw["silicon_tpot_ms"]),
                source=raw["silicon_data_source"],
                mtp_drafts=mtp_drafts(ENGINES[raw["backend"]], model, raw["silicon_data_source"], dp)))
    return rows


def run(row: Row) -> tuple:
    """What identifies one measured run: its engine, GPU, layout, workload and measured TTFT and TPOT."""
    return (row.engine, row.gpu, row.tp, row.dp, row.ep, row.isl, row.osl, row.concurrency, row.ttft_ms, row.tpot_ms)


def read_rows(path: Path = CALIBRATION) -> list[Row]:
    """The file's runs, each once: the first row of each, drafting if any of its rows says so (see the module
    docstring)."""
    first, drafts = {}, {}
    for row in read_all(path):
        key = run(row)
        first.setdefault(key, row)
        drafts[key] = max(drafts.get(key, 0), row.mtp_drafts)
    return [replace(row, mtp_drafts=drafts[key]) for key, row in first.items()]


def release_terms(row: Row, deployment: Deployment) -> Terms:
    """The terms of the row's decode step (`Deployment.point`) as the run's release ran it: with the padding
    `deepgemm_padding_ms` counts among its dense GEMMs."""
    point = deployment.point(row.concurrency)
    padding = deepgemm_padding_ms(row, deployment, point.running * row.dp)
    return point.terms._replace(dense_ms=point.terms.dense_ms + padding)


def deepgemm_padding_ms(row: Row, deployment: Deployment, tokens: float) -> float:
    """The FLOPs at peak (ms) a step of `tokens` tokens at the experts spent on padding under vLLM 0.11.1 to 0.12.x,
    where the run's release did what the estimate does not: on Hopper, block-FP8 routed experts below TP 8 ran
    DeepGEMM's contiguous grouped GEMM at every batch size (`quantization/fp8.py` `get_fp8_moe_backend`;
    VLLM_USE_DEEP_GEMM_E8M0 on by default skipped the small-batch fallback to Triton), over a buffer of
    round_up(T k + E_local x 127, 128) rows whose padding rows carried expert id 0 and were all computed
    (`deep_gemm_moe.py`; vLLM 0.13.0 marks them -1 and skips them): each MoE layer multiplies that many rows less
    the T k real ones more, at the dense GEMMs' rate. k experts a token, E_local = E / ep experts on a GPU, its
    experts sliced over tp x dp / ep GPUs. Counted once a decode step (the prompts mixed in share its GEMM), not in
    a prompt's own prefill."""
    if row.engine != "vllm" or not re.fullmatch(r"\d+\.\d+\.\d+", row.version):
        return 0.0
    release = tuple(int(part) for part in row.version.split("."))
    quantization = deployment.model.quantization
    if (not (0, 11, 1) <= release < (0, 13, 0) or gpus.compute_capability(row.gpu) != (9, 0)
            or quantization is None or quantization.method != "fp8" or not deployment.shape.moe_layers
            or row.tp * row.dp >= 8):
        return 0.0
    widths = deployment.model.widths
    routed = tokens * widths.experts_per_token
    rows = math.ceil((routed + widths.experts // row.ep * 127) / 128) * 128 - routed
    flops = (2 * rows * widths.hidden * 3 * widths.expert_intermediate * row.ep / (row.tp * row.dp)
             * deployment.shape.moe_layers)
    return flops / (tensor_tflops(deployment.gpu, "fp8") * 1e12) * 1000
