"""The speed model: how fast an aggregated serving instance answers, beside how many requests its memory holds.

Two figures for each serving point (model, GPU, engine, layout, dtypes, prompt and output lengths, concurrency):
    a bound    the work of a step on one GPU over the GPU's peak rates: no step can be faster (bound.py)
    an estimate the steady state of continuous batching with efficiencies fitted on real runs of vLLM, SGLang and
               TensorRT-LLM, its error measured and stated (calibrated.py; docs/accuracy.md)
split by concern:
    work.py        bytes, FLOPs and link bytes of a decode step and a prefill, from kvplan's memory model
    bound.py       those at the GPU's peak rates (`kvplan.gpus`): the bound, and what binds
    calibrated.py  the steady-state estimate and its named, overridable efficiencies (kvplan/data)
    serving.py     `serving` and `max_concurrency`, the functions callers use
    targets.py     speed beside capacity: the users a deployment serves within latency targets, `kvplan plan`
                   under them, a planning table's speed cells (the command line's use of the two above)
docs/speed.md gives every formula with its source. Nothing here imports numpy or torch.
"""

from kvplan.speed.calibrated import Efficiencies
from kvplan.speed.serving import Deployment, SpeedEstimate, SpeedFit, max_concurrency, serving
from kvplan.speed.work import Layout

__all__ = ["Deployment", "Efficiencies", "Layout", "SpeedEstimate", "SpeedFit", "max_concurrency", "serving"]
