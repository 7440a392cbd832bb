"""`kvplan profile`: a real cached decode with transformers, measured and set beside kvplan's prediction.

The profiler is an edge of kvplan: it reads the model through `kvplan.sources` like every other command, builds
the same architecture with transformers' own model classes (random weights, made on the target device), runs
prefill and decode, and measures the cache object, the allocator and the driver. The prediction it checks is the
`transformers` engine's (`kvplan.engines.Transformers`). torch, transformers and pynvml are imported only here,
and only when a profile runs (`kvplan estimate` never pays for them).

    config.py      where the config.json comes from, --layers (the one place that cuts a model), the
                   transformers config (pure Python, no torch)
    runtime.py     torch and transformers: build the model, walk the cache, memory probes, timing
    run.py         the profile: checks the request and runs the parts below in turn
    prediction.py  kvplan's figures for the run (the transformers engine's), torch-free
    session.py     the model built, prefilled and decoded, and measured
    recompute.py   --compare-recompute: cached decode against recomputing the sequence
    max_batch.py   --find-max-batch: the largest batch that fits, beside kvplan's capacity
    verdict.py     each component's error and the verdict
    results.py     what a profile returns (`Profile`), also read back from recorded runs
"""
