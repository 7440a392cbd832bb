"""The calibration file's rows (tests/data/speed/calibration.csv: real serving runs of vLLM, SGLang and TensorRT-LLM,
from ai-dynamo/aiconfigurator's silicon measurements) as kvplan's speed model takes them: a library model, a GPU
of the catalogue, an engine, a layout, dtypes and a workload, beside the measured TTFT and TPOT.

How the columns read (aiconfigurator's own conventions):
    batch_size        the requests one attention-DP rank holds; `silicon_concurrency` in silicon_data_source is the
                      instance's, batch_size x attention_dp_size (the concurrency used here)
    tp_size           the attention TP of a rank; attention_dp_size its ranks (blank: 1); moe_tp_size x
                      moe_ep_size the GPUs the routed experts span, which is tp x dp; where a row's moe product is
                      larger (some vLLM rows of Qwen3-235B), the instance is that many GPUs, the rest of them
                      data-parallel attention ranks. A tp_size above 8, beyond an HGX board (TensorRT-LLM on 12
                      to 72 GB200s, SGLang on 16 and 64 B200s), is a wide expert-parallel instance, whose attention
                      runs data-parallel on every GPU (TensorRT-LLM enable_attention_dp, SGLang
                      --enable-dp-attention): as attention TP it would not divide DeepSeek's 128 heads (tp 12 to
                      72 but 32 and 64), and where it would, every GPU would hold the MLA latent of every
                      request, more than its memory at the rows' concurrency
    precision         the weights: fp8, fp4 (NVFP4 on Blackwell; gpt-oss's own MXFP4 checkpoint), bf16
    model_path        nvidia/DeepSeek-R1-NVFP4 and nvidia/DeepSeek-V3.1-NVFP4 are DeepSeek-R1 and V3 with NVFP4
                      weights (V3.1 has V3's architecture)
The KV dtype is not stated: the engine's default for the checkpoint (bf16 here) unless a caller asks for another.
"""

import csv
import re
from dataclasses import dataclass
from pathlib import Path

CALIBRATION = Path(__file__).resolve().parent.parent / "tests" / "data" / "speed" / "calibration.csv"
ENGINES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt-llm"}
GPUS = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200"}
MODELS = {"nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
          "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-ai/DeepSeek-V3"}
CHECKPOINT_FP8 = ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3", "MiniMaxAI/MiniMax-M2.5",
                  "Qwen/Qwen3-235B-A22B-FP8")
WIDEST_TP = 8  # a larger tp_size is a wide-EP instance: attention DP over tp_size ranks (see above)
CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")


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

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


def weights_dtype(model: str, precision: str) -> str | None:
    if precision == "fp4":
        return None if model == "openai/gpt-oss-120b" else "nvfp4"
    if precision == "fp8":
        return None if model in CHECKPOINT_FP8 else "fp8"
    return None if precision in ("", "bf16") else precision


def read_rows(path: Path = CALIBRATION) -> list[Row]:
    rows = []
    with path.open(newline="", encoding="utf-8") as handle:
        for raw in csv.DictReader(handle):
            model = MODELS.get(raw["model_path"], raw["model_path"])
            tp, dp = int(raw["tp_size"]), int(raw["attention_dp_size"] or 1)
            moe_gpus = int(raw["moe_tp_size"]) * int(raw["moe_ep_size"])
            if moe_gpus > tp * dp:
                dp = moe_gpus // tp
            if tp > WIDEST_TP:
                tp, dp = 1, tp * dp
            stated = CONCURRENCY.search(raw["silicon_data_source"])
            rows.append(Row(
                id=raw["id"], engine=ENGINES[raw["backend"]], version=raw["backend_version"], model=model,
                gpu=GPUS[raw["system"]], weights_dtype=weights_dtype(model, raw["precision"]), tp=tp, dp=dp,
                ep=int(raw["moe_ep_size"]), isl=int(raw["isl"]), osl=int(raw["osl"]),
                concurrency=int(stated.group(1)) if stated else int(raw["batch_size"]) * dp,
                ttft_ms=float(raw["silicon_ttft_ms"]), tpot_ms=float(raw["silicon_tpot_ms"]),
                source=raw["silicon_data_source"]))
    return rows
