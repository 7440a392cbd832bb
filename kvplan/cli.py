"""The command line: parse flags, call sources and memory, hand the numbers to report. Errors exit 2."""

import json
import os
import sys
from typing import Annotated

import typer

from kvplan.errors import KvplanError
from kvplan.text import LINE, brief, plain, shorten

SETTINGS = dict(
    help="VRAM and capacity planner for LLM inference: KV cache, weights and concurrent users.",
    no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None, add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app = typer.Typer(**SETTINGS)
# Shell completion (--install-completion, --show-completion, and the shell asking through _KVPLAN_COMPLETE) costs
# every run a few milliseconds of imports: it is switched on only for the runs that can use or show it (`main`).
COMPLETION_ARGS = {"--install-completion", "--show-completion", "--help", "-h"}


def _print_version(value: bool) -> None:
    if value:
        from kvplan import __version__

        print(f"kvplan {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                   help="print kvplan's version and exit")] = False) -> None:
    """VRAM and capacity planner for LLM inference: KV cache, weights and concurrent users."""

# --help panels (`Panels`), in this order, as `vllm serve --help` groups its flags
MODEL, WORKLOAD, SPEED = "Model", "Workload", "Speed targets"
HARDWARE, PARALLEL = "GPUs, engine and budget", "Parallelism"
VLLM, VLLM_SGLANG, SGLANG, LLAMACPP = "vLLM", "vLLM and SGLang", "SGLang", "llama.cpp"
TRANSFORMERS, SPECULATIVE = "transformers", "Speculative decoding"
PANELS = ("Arguments", MODEL, WORKLOAD, SPEED, HARDWARE, PARALLEL, SPECULATIVE, VLLM, VLLM_SGLANG, SGLANG, LLAMACPP,
          TRANSFORMERS, "Options")


def _flag(kind, help: str, *names: str, panel: str | None = None):
    return Annotated[kind, typer.Option(*names, help=help, rich_help_panel=panel)]


class Panels(typer.core.TyperCommand):
    """A command whose --help lists its options under headings by what they set (the model, the workload, the
    GPUs, each engine's own flags: `PANELS`). typer draws its help panels only through rich, which kvplan's help
    does not import."""

    def format_options(self, ctx, formatter) -> None:
        panels: dict[str, list] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                panel = "Arguments" if param.param_type_name == "argument" else param.rich_help_panel
                panels.setdefault(panel or "Options", []).append(record)
        for panel in sorted(panels, key=PANELS.index):
            with formatter.section(panel):
                formatter.write_dl(panels[panel])


Model = _flag(str, "library name or alias, config.json, a directory holding one, a YAML spec, a GGUF file, or a "
              "Hugging Face Hub id (org/name; org/name:Q4_K_M for a GGUF in it)", "--model", "-m", panel=MODEL)
GgufFile = _flag(str | None, "the GGUF file of the Hub repo --model names to read (its header alone)", "--gguf-file",
                 panel=MODEL)
Revision = _flag(str | None, "Hub revision: branch, tag or commit (default: main)", panel=MODEL)
Token = _flag(str | None, "Hugging Face token for gated or private repos (default: HF_TOKEN or the stored login)",
              panel=MODEL)
Json = _flag(bool, "print one JSON object (sizes in bytes)", "--json")
Ctx = _flag(str, "tokens each sequence holds: 8192, 8k, 128K, 1M (k = 1,024)", panel=WORKLOAD)
RequestCtx = _flag(str | None, "tokens each sequence holds: 8192, 8k, 128K, 1M (k = 1,024); default --isl + --osl",
                   "--ctx", panel=WORKLOAD)
Isl = _flag(str | None, "prompt tokens per request, like --ctx (with --osl: the speed model's workload)", "--isl",
            panel=WORKLOAD)
Osl = _flag(str | None, "output tokens per request, like --ctx (with --isl)", "--osl", panel=WORKLOAD)
MaxTpot = _flag(float | None, "serve only as many users as keep the time per output token within this many ms "
                "(with --isl, --osl and --gpu)", "--max-tpot", panel=SPEED)
MaxTtft = _flag(float | None, "serve only as many users as keep the time to first token within this many ms",
                "--max-ttft", panel=SPEED)
MinTps = _flag(float | None, "serve only as many users as each get at least this many output tokens/s",
               "--min-tps", panel=SPEED)
KvDtype = _flag(str | None, "KV cache dtype (default: the model's)", panel=MODEL)
WeightsDtype = _flag(str | None, "weights dtype (default: the checkpoint's)", panel=MODEL)


def _console():
    """rich is imported only to print tables, so `--json` runs never pay for it."""
    from kvplan.report import console

    return console()


# Capacity flags, engine flags named as the engines name them; any of them makes `estimate` plan capacity.
Gpu = _flag(str | None, "GPU from the catalogue (`kvplan gpus`): h100, a100-80gb, rtx-4090", panel=HARDWARE)
Vram = _flag(str | None, "memory of a GPU not in the catalogue: 24GiB, 48GB", panel=HARDWARE)
Gpus = _flag(int | None, "GPUs in all; beyond TP x PP they are data-parallel replicas", panel=HARDWARE)
Tp = _flag(int | None, "tensor-parallel degree", "--tp", "--tensor-parallel-size", panel=PARALLEL)
Pp = _flag(int | None, "pipeline-parallel degree", "--pp", "--pipeline-parallel-size", panel=PARALLEL)
Dp = _flag(int | None, "vLLM, SGLang: data-parallel attention ranks sharing the experts (SGLang: with "
           "--enable-dp-attention, attention TP = --tp / --dp)", "--dp", "--data-parallel-size", "--dp-size",
           panel=PARALLEL)
Ep = _flag(int | None, "SGLang, vLLM: expert-parallel size (vLLM's is DP x TP)", "--ep", "--ep-size",
           "--expert-parallel-size", panel=PARALLEL)
ExpertParallel = _flag(bool, "vLLM, SGLang: place the routed experts whole on every GPU of a stage (EP = DP x "
                       "attention TP)", "--enable-expert-parallel", "--enable-ep-moe", panel=PARALLEL)
Engine = _flag(str | None, "vllm (default), sglang, llama.cpp, transformers, tensorrt-llm or ideal", panel=HARDWARE)
EngineVersion = _flag(str | None, "engine release whose defaults apply (vllm, transformers)", panel=HARDWARE)
Fraction = _flag(float | None, "share of GPU memory the engine may use (TensorRT-LLM: of what is free after "
                 "loading)", "--gpu-memory-utilization", "--mem-fraction-static", panel=HARDWARE)
KvBudget = _flag(str | None, "plan for exactly this much KV memory per GPU: 60GiB", panel=HARDWARE)
Overhead = _flag(str | None, "memory per GPU besides weights and KV, replacing the engine's default: 2GiB",
                 panel=HARDWARE)
Users = _flag(int | None, "concurrent users to fit (default: --batch)", panel=WORKLOAD)
AvgCtx = _flag(str | None, "mean tokens per user, for paged engines", panel=WORKLOAD)
SharedPrefix = _flag(str | None, "system-prompt tokens every user shares (prefix caching)", panel=WORKLOAD)
BlockSize = _flag(int | None, "KV block size in tokens (TensorRT-LLM: tokens_per_block)", panel=VLLM)
BatchedTokens = _flag(int | None, "tokens a scheduler step batches (sizes activations and windows)", panel=VLLM)
AsyncScheduling = _flag(bool | None, "async scheduling (default on; off on vLLM's CPU backend)",
                        "--async-scheduling/--no-async-scheduling", panel=VLLM)
Platform = _flag(str | None, "gpu (default) or cpu, vLLM-CPU's rules (async scheduling off, 128-token blocks, fp32 "
                 "SSM states, its defaults; give the KV space as --kv-budget)", "--platform", panel=VLLM)
KvUnified = _flag(bool | None, "unified KV cache (-kvu)", "--kv-unified/--no-kv-unified", panel=LLAMACPP)
SwaFull = _flag(bool | None, "full-size cache for sliding-window layers", "--swa-full/--no-swa-full", panel=LLAMACPP)
CacheImpl = _flag(str | None, "cache class: dynamic (default) or static", panel=TRANSFORMERS)
ExpandableSegments = _flag(bool, "plan for torch's allocator with expandable segments (set in "
                           "PYTORCH_CUDA_ALLOC_CONF)", "--expandable-segments", panel=TRANSFORMERS)
# llama.cpp's own flags (llama-server's names), docs/engines.md
UbatchSize = _flag(int | None, "physical batch (default 512)", "--ubatch-size", "-ub", panel=LLAMACPP)
BatchSize = _flag(int | None, "-b: logical batch (default 2048, llama-cpp-python 512)", "--batch-size",
                  panel=LLAMACPP)
CacheTypeK = _flag(str | None, "K cache type (default --kv-dtype, else f16)", "--cache-type-k", "-ctk",
                   panel=LLAMACPP)
CacheTypeV = _flag(str | None, "V cache type (default --kv-dtype, else f16)", "--cache-type-v", "-ctv",
                   panel=LLAMACPP)
FlashAttn = _flag(str | None, "flash attention: on, off or auto (default auto; llama-cpp-python off)",
                  "--flash-attn", "-fa", panel=LLAMACPP)
SpeculativeTokens = _flag(int | None, "draft tokens per step of speculative decoding (vLLM num_speculative_tokens, "
                          "SGLang --speculative-num-draft-tokens; llama.cpp: recurrent states kept for rollback, or "
                          "with --draft-model --spec-draft-n-max)", "--speculative-tokens", panel=SPECULATIVE)
# Speculative decoding and LoRA (vLLM, SGLang), docs/engines.md
DraftModel = _flag(str | None, "draft model of speculative decoding, read as --model is, or an EAGLE head's config "
                   "(vllm, sglang; llama.cpp -md)", "--draft-model", panel=SPECULATIVE)
SpeculativeMethod = _flag(str | None, "draft_model (with --draft-model), eagle or eagle3 (--draft-model: the EAGLE "
                          "head), mtp (the checkpoint's MTP layers) or ngram (vllm, sglang)", "--speculative-method",
                          panel=SPECULATIVE)
EnableLora = _flag(bool | None, "preallocate LoRA adapter slots", "--enable-lora", panel=VLLM)
MaxLoras = _flag(int | None, "LoRA adapters on each GPU at once (default 1)", "--max-loras", panel=VLLM)
MaxLoraRank = _flag(int | None, "largest LoRA rank (default 16)", "--max-lora-rank", panel=VLLM)
MaxCpuLoras = _flag(int | None, "LoRA adapters cached in host memory (default --max-loras)", "--max-cpu-loras",
                    panel=VLLM)
Lora = Annotated[list[str] | None, typer.Option("--lora", metavar="<file>", help="a LoRA adapter GGUF it loads at "
                                                "start-up (repeat for more)", rich_help_panel=LLAMACPP)]
Frontend = _flag(str | None, "front end: server (llama-server, default) or python (llama-cpp-python Llama())",
                 panel=LLAMACPP)
# vLLM's multimodal and offloading flags (docs/engines.md)
LimitMm = _flag(str | None, "items per prompt, '{\"image\": 0}' or image=0,video=0 (0 for every modality: "
                "text-only)", "--limit-mm-per-prompt", panel=VLLM)
LanguageModelOnly = _flag(bool, "serve a multimodal model as text only (no vision tower, no encoder cache)",
                          "--language-model-only", panel=VLLM)
KvOffloadSize = _flag(str | None, "host memory for offloaded KV, GiB (64) or a size (64GiB)",
                      "--kv-offloading-size", panel=VLLM)
KvOffloadBackend = _flag(str | None, "native (default) or lmcache", "--kv-offloading-backend", panel=VLLM)
CpuOffload = _flag(str | None, "GiB of each GPU's weights kept in host memory (10) or a size",
                   "--cpu-offload-gb", panel=VLLM)
GdnPrefill = _flag(str | None, "Gated DeltaNet prefill kernel, flashinfer, triton or cutedsl (default: "
                   "FlashInfer on Hopper and Blackwell, which adds a state page)", "--gdn-prefill-backend",
                   panel=VLLM)
MambaSsmDtype = _flag(str | None, "dtype of Mamba and Gated DeltaNet SSM states (SGLang's --mamba-ssm-dtype): "
                      "auto, float32, float16 or bfloat16 (default auto: the engine's rule, see docs/engines.md)",
                      "--mamba-ssm-cache-dtype", panel=VLLM_SGLANG)
MaxMambaCache = _flag(int | None, "Mamba state slots, split over the DP ranks, whatever the budget",
                      "--max-mamba-cache-size", panel=SGLANG)
MambaRatio = _flag(float | None, "Mamba pool memory over KV pool memory (default 0.9)",
                   "--mamba-full-memory-ratio", panel=SGLANG)
MaxNumSeqs = _flag(int | None, "requests run at once (vLLM: each DP rank; default 1,024 on GPUs of >= 70 GiB but "
                   "A100s, else 256; SGLang: over the DP ranks, default by its pool, 48 with a draft)",
                   "--max-num-seqs", "--max-running-requests", panel=VLLM_SGLANG)
DisableRadixCache = _flag(bool, "no radix cache: no prefix kept once, and 1 Mamba state slot a running request "
                          "(5 with it)", "--disable-radix-cache", panel=SGLANG)


@app.command(cls=Panels)
def estimate(
    model: Model,
    ctx: RequestCtx = None,
    isl: Isl = None,
    osl: Osl = None,
    revision: Revision = None,
    token: Token = None,
    gguf_file: GgufFile = None,
    batch: Annotated[int | None, typer.Option(help="concurrent sequences (default 1)",
                                              rich_help_panel=WORKLOAD)] = None,
    kv_dtype: KvDtype = None,
    weights_dtype: WeightsDtype = None,
    gpu: Gpu = None, vram: Vram = None, gpus: Gpus = None, tp: Tp = None, pp: Pp = None, dp: Dp = None,
    ep: Ep = None, enable_expert_parallel: ExpertParallel = False,
    engine: Engine = None, engine_version: EngineVersion = None, gpu_memory_utilization: Fraction = None,
    kv_budget: KvBudget = None, overhead: Overhead = None, users: Users = None, avg_ctx: AvgCtx = None,
    shared_prefix: SharedPrefix = None, block_size: BlockSize = None,
    max_num_batched_tokens: BatchedTokens = None, async_scheduling: AsyncScheduling = None,
    platform: Platform = None,
    kv_unified: KvUnified = None, swa_full: SwaFull = None, cache_implementation: CacheImpl = None,
    expandable_segments: ExpandableSegments = False,
    ubatch_size: UbatchSize = None, batch_size: BatchSize = None, cache_type_k: CacheTypeK = None,
    cache_type_v: CacheTypeV = None, flash_attn: FlashAttn = None, speculative_tokens: SpeculativeTokens = None,
    frontend: Frontend = None,
    limit_mm_per_prompt: LimitMm = None, language_model_only: LanguageModelOnly = False,
    kv_offloading_size: KvOffloadSize = None, kv_offloading_backend: KvOffloadBackend = None,
    cpu_offload_gb: CpuOffload = None, draft_model: DraftModel = None, speculative_method: SpeculativeMethod = None,
    enable_lora: EnableLora = None, max_loras: MaxLoras = None, max_lora_rank: MaxLoraRank = None,
    max_cpu_loras: MaxCpuLoras = None, gdn_prefill_backend: GdnPrefill = None,
    mamba_ssm_cache_dtype: MambaSsmDtype = None, lora: Lora = None,
    max_mamba_cache_size: MaxMambaCache = None, mamba_full_memory_ratio: MambaRatio = None,
    max_num_seqs: MaxNumSeqs = None, disable_radix_cache: DisableRadixCache = False,
    max_tpot: MaxTpot = None, max_ttft: MaxTtft = None, min_tps: MinTps = None,
    as_json: Json = False,
) -> None:
    """KV cache per token, per sequence and per batch, and the weights, for one model; with a GPU, engine or
    budget, also how many users fit and whether the target does; with --isl and --osl on a GPU, how fast."""
    flags = dict(locals())
    from kvplan import api

    result = _call(api.estimate, flags, "as_json")
    if as_json:
        print(json.dumps(result.model_dump(), indent=2))
        for warning in result.memory.warnings:
            print(f"warning: {plain(warning)}", file=sys.stderr)
    else:
        from kvplan.report import print_estimate_result

        print_estimate_result(_console(), result)
    if not result.fits:
        raise typer.Exit(DOES_NOT_FIT)


def _call(function, flags: dict, *own: str):
    """`function` (kvplan.api's) called with each flag as the keyword of the same name, but the command's `own`
    (how it prints)."""
    return function(**{name: value for name, value in flags.items() if name not in own})



@app.command(cls=Panels)
def plan(
    model: Model,
    users: Annotated[int, typer.Option(help="concurrent users to serve", rich_help_panel=WORKLOAD)],
    ctx: RequestCtx = None,
    isl: Isl = None,
    osl: Osl = None,
    revision: Revision = None,
    token: Token = None,
    gguf_file: GgufFile = None,
    gpu: Gpu = None, vram: Vram = None, engine: Engine = None, engine_version: EngineVersion = None,
    gpu_memory_utilization: Fraction = None, overhead: Overhead = None, block_size: BlockSize = None,
    max_num_batched_tokens: BatchedTokens = None, async_scheduling: AsyncScheduling = None,
    kv_unified: KvUnified = None, swa_full: SwaFull = None, cache_implementation: CacheImpl = None,
    expandable_segments: ExpandableSegments = False,
    ubatch_size: UbatchSize = None, batch_size: BatchSize = None, flash_attn: FlashAttn = None,
    speculative_tokens: SpeculativeTokens = None, frontend: Frontend = None,
    limit_mm_per_prompt: LimitMm = None, language_model_only: LanguageModelOnly = False,
    kv_offloading_size: KvOffloadSize = None, kv_offloading_backend: KvOffloadBackend = None,
    cpu_offload_gb: CpuOffload = None, draft_model: DraftModel = None,
    speculative_method: SpeculativeMethod = None, enable_lora: EnableLora = None, max_loras: MaxLoras = None,
    max_lora_rank: MaxLoraRank = None, max_cpu_loras: MaxCpuLoras = None, gdn_prefill_backend: GdnPrefill = None,
    mamba_ssm_cache_dtype: MambaSsmDtype = None, lora: Lora = None,
    max_mamba_cache_size: MaxMambaCache = None, mamba_full_memory_ratio: MambaRatio = None,
    max_num_seqs: MaxNumSeqs = None, disable_radix_cache: DisableRadixCache = False,
    max_gpus: Annotated[int, typer.Option(help="largest GPU count to consider", rich_help_panel=HARDWARE)] = 64,
    max_tpot: MaxTpot = None, max_ttft: MaxTtft = None, min_tps: MinTps = None,
    as_json: Json = False,
) -> None:
    """The configurations that serve USERS at CTX on a GPU type: GPU count, TP, KV and weights dtypes,
    ranked by GPUs needed, with the KV memory left over; with --isl and --osl their speed, and with targets only
    those that meet them."""
    flags = dict(locals())
    from kvplan import api

    result = _call(api.plan, flags, "as_json")
    if as_json:
        print(json.dumps(result.model_dump(), indent=2))
    else:
        from kvplan.report import print_plan

        print_plan(_console(), result)
    if not result.rows:
        raise typer.Exit(DOES_NOT_FIT)


@app.command()
def schema(name: Annotated[str, typer.Argument(help="the output: estimate, table or plan")]) -> None:
    """The JSON Schema of a command's --json output (its "schema_version" says which; docs/api.md)."""
    from kvplan import schemas

    sys.stdout.write(schemas.text(name))


@app.command(name="gpus")
def list_gpus(as_json: Json = False) -> None:
    """List the GPU catalogue: memory as the driver reports it, bandwidth, dense BF16 throughput."""
    from kvplan.gpus import catalogue

    if as_json:
        print(json.dumps([g.model_dump() | {"usable_bytes": g.usable_bytes} for g in catalogue()], indent=2))
        return
    from kvplan.report import print_gpus

    print_gpus(_console(), catalogue())


@app.command()
def show(model: Model, revision: Revision = None, token: Token = None, gguf_file: GgufFile = None,
         as_json: Json = False) -> None:
    """The model's normalised layer layout: what each layer caches, and its parameters by group."""
    from kvplan.sources import load_model

    spec = load_model(model, revision, token, gguf_file)
    if as_json:
        params = spec.params.model_dump() | {"total": spec.params.total, "active": spec.params.active}
        print(json.dumps(spec.model_dump(mode="json") | {"params": params}, indent=2))
        return
    from kvplan.report import print_layout

    print_layout(_console(), spec)


@app.command()
def models(
    filter: Annotated[str | None, typer.Argument(help="show only models whose name or alias contains this")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the entries as a JSON list")] = False,
) -> None:
    """List the bundled model library."""
    from kvplan.sources import library

    chosen = sorted((e for e in library.entries()
                     if not filter or any(filter.lower() in n.lower() for n in (e.id, *e.aliases))),
                    key=lambda e: e.id.lower())
    if not chosen:
        raise KvplanError(f"no bundled model matches {brief(filter)} (`kvplan models` lists them all; any Hub id "
                          "works too)")
    if as_json:
        print(json.dumps([e.model_dump() for e in chosen], indent=2))
        return
    from kvplan.report import print_models

    print_models(_console(), chosen)


# `table` and `plot`: several models x contexts x GPUs (kvplan/tables.py, kvplan/plot.py, docs/tables.md).
Models = _flag(str | None, "models: a comma list (library names, Hub ids, config.json, YAML specs), or @FILE "
               "or FILE.txt with one per line (# comments)", "--models", "-m", panel=MODEL)
Filter = _flag(str | None, "add the library models whose id or alias contains this text", "--filter", panel=MODEL)
Ctxs = _flag(str | None, "contexts, a comma list: 4k,8k,32k,128k (k = 1,024); default --isl + --osl", "--ctx",
             panel=WORKLOAD)
SpeedUsers = _flag(int | None, "with --isl and --osl: the users the speed figures are at (default: those memory "
                   "holds in each cell)", "--users", panel=WORKLOAD)
Gpus_ = _flag(str | None, "GPUs from the catalogue, a comma list (h100,l40s,4xh100): adds max users on each GPU "
              "set", panel=HARDWARE)
Vrams = _flag(str | None, "memory of GPUs not in the catalogue, a comma list: 24GiB,48GB", panel=HARDWARE)
TableEngine = _flag(str | None, "engine whose rules and dtypes apply: vllm (default with a GPU; llama.cpp on Apple "
                    "silicon), sglang, llama.cpp, transformers, tensorrt-llm or ideal", panel=HARDWARE)
KeepGoing = _flag(bool, "leave out models that fail (still named on stderr, exit 2) instead of stopping",
                  "--keep-going")
TableFormat = _flag(str | None, "rich, markdown, csv or json (default: from --out's extension, else rich)",
                    "--format", "-f")
TableOut = _flag(str | None, "write the table to this file (replaced whole, never one of the inputs)", "--out",
                 "-o")
Force = _flag(bool, "--out: write through a symbolic link to the file it points to", "--force")
Pivot = _flag(bool, "contexts as columns, one value a cell (--metric)", "--pivot")
Metric = _flag(str | None, "the --pivot value: kv (KV per sequence), total, users (default: users with a GPU, "
               "else kv); with --isl and --osl tpot, ttft, tps-user or tps-gpu (estimated ms, output tokens/s)")
KvDtypes = _flag(str | None, "KV cache dtype (default: the model's, or the engine's)", panel=MODEL)


TABLE_OUTPUT = ("fmt", "out", "pivot", "metric", "force")  # how `table` and `plot` print, not what they compute


@app.command(name="table", cls=Panels)
def table_command(
    ctx: Ctxs = None,
    isl: Isl = None,
    osl: Osl = None,
    models: Models = None,
    filter: Filter = None,
    revision: Revision = None,
    token: Token = None,
    batch: Annotated[int, typer.Option(help="sequences per model in the total column", rich_help_panel=WORKLOAD)] = 1,
    users: SpeedUsers = None,
    gpu: Gpus_ = None, vram: Vrams = None, engine: TableEngine = None, engine_version: EngineVersion = None,
    gpu_memory_utilization: Fraction = None, overhead: Overhead = None,
    kv_dtype: KvDtypes = None, weights_dtype: WeightsDtype = None,
    fmt: TableFormat = None, out: TableOut = None, pivot: Pivot = False, metric: Metric = None,
    keep_going: KeepGoing = False, force: Force = False, tp: Tp = None, pp: Pp = None,
) -> None:
    """A planning table: KV per token and per sequence, weights, total and max users on each GPU, for every
    model x context, as rich, GitHub Markdown, CSV or JSON (docs/tables.md); with --isl and --osl, TPOT, TTFT and
    tokens/s on each GPU too."""
    flags = dict(locals())
    from kvplan import api
    from kvplan import tables as planning

    fmt = planning.parse_format(fmt, out)
    planning.check_view(fmt, pivot, metric)
    planning.check_metric(metric, gpu is not None or vram is not None, isl is not None or osl is not None)
    result = _call(api.table, flags, *TABLE_OUTPUT)
    if fmt == "rich" and out is None and sys.stdout.isatty():
        planning.print_rich(_console(), result.grid, pivot=pivot, metric=metric)
    else:  # a file or a pipe gets the whole width, not 80 columns
        if out is not None:
            _report_written(result.write(out, fmt, pivot=pivot, metric=metric, force=force), result)
            return
        sys.stdout.write(result.render(fmt, pivot=pivot, metric=metric))
    if result.failures:
        raise KvplanError(result.failure_line())


def _report_written(written: str, result) -> None:
    """Where --out went, on stderr; with models left out (--keep-going), in the one error line."""
    if result.failures:
        raise KvplanError(f"{result.failure_line()} ({written} with the others)")
    print(f"kvplan: {written}", file=sys.stderr)


PLOT_CTX = "1k,2k,4k,8k,16k,32k,64k,128k"
PlotKind = _flag(str, "kv: KV cache vs context, with GPU memory lines; users: max users on each GPU vs "
                 "context; with --isl and --osl tpot, ttft, tps-user or tps-gpu: the estimated speed on each GPU")


@app.command(name="plot", cls=Panels)
def plot_command(
    out: Annotated[str, typer.Option("--out", "-o", help="the chart: a .png or .svg file")],
    models: Models = None,
    filter: Filter = None,
    revision: Revision = None,
    token: Token = None,
    ctx: Annotated[str | None, typer.Option(help="contexts, a comma list (k = 1,024; default 1k to 128k, from --isl "
                                            "+ --osl with them)", rich_help_panel=WORKLOAD)] = None,
    isl: Isl = None,
    osl: Osl = None,
    kind: PlotKind = "kv",
    batch: Annotated[int, typer.Option(help="sequences whose KV cache the kv chart shows",
                                       rich_help_panel=WORKLOAD)] = 1,
    users: SpeedUsers = None,
    with_weights: Annotated[bool, typer.Option("--with-weights", help="kv chart: plot weights + KV")] = False,
    gpu: Gpus_ = None, vram: Vrams = None, engine: TableEngine = None, engine_version: EngineVersion = None,
    gpu_memory_utilization: Fraction = None, overhead: Overhead = None,
    kv_dtype: KvDtypes = None, weights_dtype: WeightsDtype = None,
    y_scale: Annotated[str, typer.Option(help="log or linear")] = "log",
    title: Annotated[str | None, typer.Option(help="chart title (default: says what is plotted)")] = None,
    keep_going: KeepGoing = False, force: Force = False, tp: Tp = None, pp: Pp = None,
) -> None:
    """Chart KV memory, max users or the estimated speed against context for several models, as PNG or SVG (needs
    matplotlib: pip install '.[plot]' in kvplan's source directory)."""
    flags = dict(locals())
    from kvplan import api, plot

    plot.output_format(out)
    plot.check_kind(kind, gpu is not None or vram is not None, isl is not None and osl is not None)
    plot.require_matplotlib()
    if ctx is None:  # 1k to 128k, or from a request's length up
        from kvplan import arguments
        from kvplan.tables import parse_ctxs

        shortest = arguments.contexts(None, isl, osl)[0][0] if isl is not None or osl is not None else 0
        flags["ctx"] = ",".join(str(c) for c in dict.fromkeys([shortest, *parse_ctxs(PLOT_CTX)])
                                if c >= shortest and c)
    result = _call(api.table, flags, "out", "kind", "with_weights", "y_scale", "title", "force")
    _, written = plot.draw(result.grid, kind, out, with_weights=with_weights, title=title, y_scale=y_scale,
                           inputs=tuple(result.input_files), force=force)
    _report_written(written, result)


@app.command()
def profile(
    model: Model,
    ctx: Ctx,
    batch: Annotated[int, typer.Option(help="sequences decoded together")] = 1,
    device: Annotated[str, typer.Option(help="cuda, cuda:N or cpu")] = "cuda",
    dtype: Annotated[str | None, typer.Option(help="fp32, bf16 or fp16 (default: the checkpoint's)")] = None,
    layers: Annotated[int | None, typer.Option(help="build only the first L layers (the prediction is cut "
                                               "the same way)")] = None,
    decode_steps: Annotated[int, typer.Option(help="tokens decoded after prefilling ctx - S")] = 32,
    cache_implementation: CacheImpl = None,
    find_max_batch: Annotated[bool, typer.Option("--find-max-batch", help="GPU: search the largest batch "
                                                 "that fits at ctx, beside kvplan's prediction")] = False,
    compare_recompute: Annotated[bool, typer.Option("--compare-recompute", help="time decoding with the cache "
                                                    "vs recomputing the prefix per token")] = False,
    revision: Revision = None,
    token: Token = None,
    as_json: Json = False,
) -> None:
    """Build the model with random weights on the device (transformers' own classes), prefill ctx - S tokens,
    decode S, and measure the cache, the allocator and the driver beside kvplan's transformers prediction.
    Needs `pip install '.[profile]'` in kvplan's source directory."""
    flags = dict(locals())
    import gc

    gc.enable()  # `kvplan.main` runs the planning commands without it; torch's objects do form cycles
    from kvplan import api

    progress = None
    if not as_json:
        from kvplan.report import ProfileProgress

        progress = ProfileProgress()
    result = _call(api.profile, flags | {"progress": progress}, "as_json")
    if as_json:
        print(json.dumps(result.model_dump(), indent=2))
        return
    from kvplan.report import print_profile

    print_profile(_console(), result)


def _app_for(args: list[str]) -> typer.Typer:
    """The app with only the command a run names: typer builds the options of every command it holds before it
    parses, the hundred-odd of the others included (4% of `kvplan estimate`'s instructions). Help, completion and an
    unknown command get the whole app, its command list and its suggestions."""
    commands = {command.name or command.callback.__name__.replace("_", "-"): command
                for command in app.registered_commands}
    if app._add_completion or not args or args[0] not in commands:
        return app
    alone = typer.Typer(**SETTINGS)
    alone.registered_callback = app.registered_callback
    alone.registered_commands = [commands[args[0]]]
    return alone


def _without_debug(command, args: list[str]) -> tuple[bool, list[str]]:
    """(whether --debug was given, the arguments without it). --debug is kvplan's own flag, not the command's: it is
    taken where an option may stand, never as the value of an option that takes one (`--model --debug` names the
    model "--debug", `--out --debug` the file), which the command typer built says."""
    subcommand = getattr(command, "commands", {}).get(args[0]) if args else None
    params = subcommand.params if subcommand is not None else []
    takes_value = {name for param in params if param.param_type_name == "option" and not param.is_flag
                   and not param.count for name in (*param.opts, *param.secondary_opts)}
    kept, given, following = [], False, False
    for index, arg in enumerate(args):
        if following or arg != "--debug":
            kept.append(arg)
        else:
            given = True
        if arg == "--":  # what follows is arguments, --debug among them
            kept += args[index + 1:]
            break
        following = not following and arg in takes_value
    return given, kept


DOES_NOT_FIT = 1  # exit status when the target does not fit: the plan is printed, and scripts can branch on it
BUG_REPORT = ("this is a bug in kvplan, not a problem with your input: please report it with the command you "
              "ran and the traceback that `--debug` (or KVPLAN_DEBUG=1) prints")


def main() -> None:
    """Run the app; any error becomes one line on stderr: exit 2 for bad input, 130 for Ctrl-C, 70 for a bug in
    kvplan (its traceback only under --debug or KVPLAN_DEBUG=1, since it may hold a token or a path)."""
    # kvplan uses no pydantic plugins; skipping their discovery spares every run an entry-point scan.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    args = sys.argv[1:]
    leading = next((i for i, arg in enumerate(args) if arg != "--debug"), len(args))  # before the command's name
    args = args[leading:]
    app._add_completion = not args or bool(COMPLETION_ARGS & set(args)) or "_KVPLAN_COMPLETE" in os.environ
    command = typer.main.get_command(_app_for(args))
    given, args = _without_debug(command, args)
    debug = bool(leading) or given or os.environ.get("KVPLAN_DEBUG", "") not in ("", "0")
    try:
        status = command(args=args or ["--help"], prog_name="kvplan", standalone_mode=False)
        if isinstance(status, int) and status:  # typer.Exit(code) returns it when not standalone
            sys.exit(status)
    except KvplanError as err:
        print(f"kvplan: error: {shorten(plain(err), LINE)}", file=sys.stderr)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except Exception as err:
        if hasattr(err, "format_message"):  # usage errors of typer's click, vendored or not
            print(f"kvplan: error: {shorten(plain(err.format_message()), LINE)}", file=sys.stderr)
            sys.exit(getattr(err, "exit_code", 2))
        if debug:
            raise
        print(f"kvplan: error: {type(err).__name__}: {BUG_REPORT}", file=sys.stderr)
        sys.exit(70)
