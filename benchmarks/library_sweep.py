#!/usr/bin/env python3
"""Every bundled model under every engine, at 128k and 1M tokens, for 1 and 8 users, on one H100 and on eight (as
one TP group, and split in 2 and in 8 pipeline stages): each `kvplan estimate` ends in exit 0 (fits) or 1 (does not
fit), or in one of the refusals below, by design, in one line. Standalone (not a timed test; a sample runs in
tests/test_hostile_deployments.py):

    python benchmarks/library_sweep.py                    # 88 models: 7,744 runs, about 400 s on 2 cores
    python benchmarks/library_sweep.py --engines sglang --models gemma

Each run is `kvplan.cli.main` in this interpreter (as the console script runs it), with --json, at most SECONDS
long. The script prints the runs by outcome and engine, each refusal with its count, and every failure: an exit 70
(a bug), an exit 2 that is not a refusal below, a traceback, or a run past SECONDS. It exits 1 if any run failed.

The 8-GPU layouts: engines that split heads take --tp, the largest of 8, 4, 2 and 1 the model's heads allow
(`kvplan.capacity.valid_tp`), the rest of the GPUs replicas; with --pp 2 half that TP; with --pp 8 TP 1. llama.cpp
and transformers split layers only: eight GPUs are 8 stages, or 2 stages of 4 replicas with --pp 2.
"""

import argparse
import contextlib
import io
import os
import signal
import sys
import time
from collections import Counter

ENGINES = ("vllm", "sglang", "llama.cpp", "transformers", "tensorrt-llm", "ideal")
CTXS = ("128k", "1M")
USERS = ("1", "8")
SECONDS = 60
# Refusals by design, each one line with exit 2: a fragment of the line, and why.
REFUSALS = {
    "does not run": "the engine has no model class for the family (SGLang: Jamba, MiniMax; vLLM 0.33: MiniMax-M1)",
    "does not model": "kvplan does not model the engine's pools for it (DeepSeek V4's compressed attention, "
                      "SGLang's attention-free and pipeline-parallel Mamba pools)",
    "keeps no per-sequence cache": "an encoder (BERT): no user holds memory",
    "keep no KV cache of their own": "vLLM cannot start a pipeline stage whose layers keep no KV",
    "no pipeline parallelism": "SGLang's model class builds every layer on every GPU (Gemma 3n, Nemotron-NAS)",
}


def layouts(model, engine: str) -> list[list[str]]:
    from kvplan import engines
    from kvplan.capacity import valid_tp

    if not engines.engine_class(engine).splits_heads:
        return [["--gpu", "h100"], ["--gpu", "8xh100"], ["--gpu", "8xh100", "--pp", "2"]]
    tp = max(t for t in (1, 2, 4, 8) if t in valid_tp(model, 8))
    return [["--gpu", "h100"], ["--gpu", "8xh100", "--tp", str(tp)],
            ["--gpu", "8xh100", "--pp", "2", "--tp", str(max(1, tp // 2))],
            ["--gpu", "8xh100", "--pp", "8", "--tp", "1"]]


def cases(models: list[str], engine_names=ENGINES):
    """Every run: the arguments of `kvplan estimate`."""
    from kvplan.sources import load_model

    for model_id in models:
        model = load_model(model_id)
        for engine in engine_names:
            for layout in layouts(model, engine):
                for ctx in CTXS:
                    for users in USERS:
                        yield ["estimate", "--model", model_id, "--ctx", ctx, "--users", users, "--engine", engine,
                               *layout, "--json"]


def run(args: list[str]) -> tuple[str, str]:
    """(outcome, detail): "ok", "refused" (the refusal's fragment), or "failed" (why)."""
    from kvplan import cli

    def hung(*_):
        raise TimeoutError(f"more than {SECONDS} s")

    argv, previous = sys.argv, signal.signal(signal.SIGALRM, hung)
    sys.argv = ["kvplan", *args]
    out, err = io.StringIO(), io.StringIO()
    signal.alarm(SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    except Exception as error:  # a bug under KVPLAN_DEBUG, or the alarm
        return "failed", f"{type(error).__name__}: {error}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        sys.argv = argv
    line = err.getvalue().strip()
    if code in (0, 1):
        return "ok", ""
    refusal = next((fragment for fragment in REFUSALS if fragment in line), None)
    if code == 2 and refusal and line.count("\n") == 0 and line.startswith("kvplan: error:"):
        return "refused", refusal
    return "failed", f"exit {code}: {line[:300]}"


def main() -> int:
    from kvplan.sources import library

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES), help="a comma list")
    parser.add_argument("--models", default="", help="only the library models whose id contains this")
    options = parser.parse_args()
    os.environ.setdefault("KVPLAN_DEBUG", "1")  # a bug raises, so that its traceback can be found
    models = [e.id for e in library.entries() if options.models.lower() in e.id.lower()]
    outcomes, refusals, failures = Counter(), Counter(), []
    start = time.perf_counter()
    for args in cases(models, options.engines.split(",")):
        outcome, detail = run(args)
        outcomes[outcome, args[args.index("--engine") + 1]] += 1
        if outcome == "refused":
            refusals[detail] += 1
        elif outcome == "failed":
            failures.append((" ".join(args), detail))
    seconds = time.perf_counter() - start
    print(f"{sum(outcomes.values()):,} runs of {len(models)} models in {seconds:,.0f} s")
    for (outcome, engine), count in sorted(outcomes.items()):
        print(f"  {engine:13} {outcome:8} {count:6,}")
    for fragment, count in refusals.most_common():
        print(f"  refused {count:5,}: {fragment!r} ({REFUSALS[fragment]})")
    for args, detail in failures:
        print(f"FAILED kvplan {args}\n    {detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
