"""Speed beside capacity: the speed model (`serving`, `max_concurrency`) at a deployment `kvplan.capacity` has
planned, and the users it serves within latency targets.

    users served = min(memory fit, speed fit)
    speed fit    = replicas x the most requests one instance holds with every target met (`max_concurrency`)

The memory fit is capacity's `max_concurrent_users` at the planned context; the speed model takes the requests'
prompt and output lengths (isl, osl). A deployment of R replicas (GPUs beyond TP x PP x DP) is R instances, each
holding ceil(C / R) of C requests, and the speed model describes one instance: dp ranks of tp GPUs. It needs the
GPU's peak rates (a catalogue GPU with tensor throughput) and an engine its efficiencies were fitted for, and
describes no pipeline stages (`problem` says which is missing).
"""

from functools import cache
from math import ceil

from pydantic import BaseModel, ConfigDict

from kvplan import capacity, engines, gpus
from kvplan.capacity import Capacity, Plan, PlanRow, UsersAt
from kvplan.capacity.draft import speculation_options
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.model import Hardware, ModelSpec, Parallelism, Workload
from kvplan.speed.bound import tensor_tflops
from kvplan.speed.calibrated import efficiencies, table
from kvplan.speed.serving import Deployment, SpeedEstimate, concurrency_fit
from kvplan.speed.work import Layout


class Targets(BaseModel):
    """Latency targets a user accepts: at most `max_tpot_ms` per output token and `max_ttft_ms` to the first, at
    least `min_tokens_per_s_per_user` output tokens per second."""

    model_config = ConfigDict(frozen=True)

    max_tpot_ms: float | None = None
    max_ttft_ms: float | None = None
    min_tokens_per_s_per_user: float | None = None

    @property
    def given(self) -> bool:
        return any(value is not None for value in self.model_dump().values())

    def label(self) -> str:
        """`TPOT <= 20 ms, TTFT <= 500 ms, >= 30 tokens/s per user`."""
        parts = []
        if self.max_tpot_ms is not None:
            parts.append(f"TPOT <= {self.max_tpot_ms:,g} ms")
        if self.max_ttft_ms is not None:
            parts.append(f"TTFT <= {self.max_ttft_ms:,g} ms")
        if self.min_tokens_per_s_per_user is not None:
            parts.append(f">= {self.min_tokens_per_s_per_user:,g} tokens/s per user")
        return ", ".join(parts)


class StatedError(BaseModel):
    """The estimate's |predicted / measured - 1| on a model or GPU its efficiencies were not fitted on, as a user's
    model is: of the `runs` it was fitted on (`models` models on `gpus` GPUs), each model's, then each GPU's, judged
    under efficiencies refitted without them; each figure the larger of the two. The shipped table's provenance
    records them (`kvplan/data/speed_efficiencies.json`, written by benchmarks/speed_fit.py; docs/accuracy.md)."""

    model_config = ConfigDict(frozen=True)

    runs: int
    models: int
    gpus: int
    tpot_median: float
    tpot_p90: float
    ttft_median: float
    ttft_p90: float


def stated_error() -> StatedError:
    provenance = table()["provenance"]
    held = provenance["held_out"]
    worse = {figure: max(held["models"][figure], held["gpus"][figure])
             for figure in ("tpot_median", "tpot_p90", "ttft_median", "ttft_p90")}
    return StatedError(runs=provenance["rows"], models=held["models"]["groups"], gpus=held["gpus"]["groups"],
                       **worse)


def problem(gpu_name: str | None, engine_name: str, pp: int = 1, platform: str = "gpu") -> str | None:
    """Why the speed model cannot describe this deployment, or None: it needs a catalogue GPU with tensor
    throughput, an engine it is calibrated for, and no pipeline stages."""
    if platform != "gpu":
        return "the speed model describes GPUs, not vLLM's CPU platform (--platform cpu)"
    if gpu_name is None:
        return "the speed model needs a GPU from the catalogue (its bandwidth and FLOP/s): give --gpu"
    try:
        tensor_tflops(gpus.find(gpu_name), "bf16")
    except KvplanError as err:
        return str(err)
    calibrated = table()["engines"]
    engine_name = engines.engine_class(engine_name).name  # an alias (trtllm) as the engine's own name
    if engine_name not in calibrated:
        return f"the speed model is calibrated for {', '.join(calibrated)}, not {engine_name}"
    if pp > 1:
        return "the speed model describes TP, DP and EP layouts, not pipeline stages (--pp)"
    return None


class SpeedFigures(BaseModel):
    """What the command line shows of an estimate (`SpeedEstimate`'s fields of the same names), ms and tokens/s."""

    decode_step_ms_bound: float | None = None
    decode_step_ms: float | None = None
    ttft_ms_bound: float | None = None
    ttft_ms: float | None = None
    tokens_per_s_per_user: float | None = None
    tokens_per_s_per_gpu: float | None = None

    @classmethod
    def of(cls, estimate: SpeedEstimate) -> dict:
        return {name: getattr(estimate, name) for name in cls.model_fields}


class Speed(BaseModel):
    """A planned deployment's speed at `concurrency` requests (`estimate`: one instance's, at ceil(concurrency /
    replicas)), the bound's tokens/s beside the estimate's, the estimate's stated error, and with targets the users
    it serves: `users` = min(`memory_users` at `ctx`, `fit_users`), `bound` what stops it (memory, sequence_limit:
    capacity's `max_concurrent_users_bound`, or speed), `fit_limited_by` what stops the speed fit
    (`SpeedFit.limited_by`)."""

    model_config = ConfigDict(frozen=True)

    ctx: int
    isl: int
    osl: int
    concurrency: int
    replicas: int
    estimate: SpeedEstimate
    tokens_per_s_per_user_bound: float
    tokens_per_s_per_gpu_bound: float
    error: StatedError
    targets: Targets | None = None
    fit_users: int | None = None
    fit_limited_by: str | None = None
    memory_users: int
    users: int
    bound: str

    def fields(self) -> dict:
        """The flat keys `kvplan estimate --json` adds (docs/cli.md); with targets, capacity's max_concurrent_users
        and its bound are `users` and `bound` (`judged`)."""
        e = self.estimate
        out = {"isl": self.isl, "osl": self.osl, "speed_concurrency": self.concurrency, **SpeedFigures.of(e),
               "tokens_per_s_per_user_bound": self.tokens_per_s_per_user_bound,
               "tokens_per_s_per_gpu_bound": self.tokens_per_s_per_gpu_bound, "decode_step_binding": e.binding,
               "speed_efficiencies": e.efficiencies, "speed_flags": e.flags,
               "speed_error": self.error.model_dump()}
        if self.targets is not None:
            out |= self.targets.model_dump() | {
                "speed_fit_users": self.fit_users, "speed_fit_limited_by": self.fit_limited_by,
                "max_concurrent_users_memory": self.memory_users}
        return out


def _parallelism(cap: Capacity | PlanRow) -> Parallelism:
    """The layout a planned deployment runs."""
    return Parallelism(tp=cap.tensor_parallel_size, pp=cap.pipeline_parallel_size, dp=cap.data_parallel_size,
                       ep=cap.expert_parallel_size, replicas=cap.data_parallel_replicas)


class Instance:
    """One instance of a deployment, as the speed model sees it, whatever the concurrency: `at(C)` is the estimate
    for C requests over the deployment's replicas, `fit(targets)` the requests it serves within them."""

    def __init__(self, model: ModelSpec, gpu_name: str | None, engine_name: str, parallel: Parallelism, isl: int,
                 osl: int, kv_dtype: str | None = None, weights_dtype: str | None = None,
                 speculative_method: str | None = None, speculative_tokens: int | None = None):
        why = problem(gpu_name, engine_name, parallel.pp)
        if why:
            raise KvplanError(why)
        gpu = gpus.find(gpu_name)
        layout = Layout(tp=parallel.tp, dp=parallel.dp, ep=parallel.ep)
        # drafting by the checkpoint's MTP layers is modelled; other drafts are flagged
        mtp = engines.engine_class(engine_name).drafted_tokens(speculative_tokens) if speculative_method == "mtp" else 0
        self.deployment = Deployment(model, gpu, engine_name, layout, isl, osl, weights_dtype, kv_dtype, mtp)
        self.efficiencies = efficiencies(self.deployment.engine, gpu)
        self.replicas, self.speculative = parallel.replicas, speculative_method is not None and not mtp

    @classmethod
    def of(cls, model: ModelSpec, cap: Capacity, isl: int, osl: int) -> "Instance":
        """The instance of a deployment `kvplan.capacity` planned, with its speculative decoding."""
        return cls(model, cap.gpu, cap.engine, _parallelism(cap), isl, osl, cap.kv_dtype, cap.weights_dtype_override,
                   cap.speculative_method, cap.speculative_tokens)

    def at(self, concurrency: int) -> SpeedEstimate:
        return self.deployment.estimate(ceil(concurrency / self.replicas), *self.efficiencies, self.speculative)

    def fit(self, targets: Targets) -> tuple[int, str]:
        """(requests served within the targets over all replicas, what stops one instance there)."""
        found = concurrency_fit(self.deployment, *self.efficiencies, **targets.model_dump(),
                                speculative=self.speculative)
        return found.users * self.replicas, found.limited_by


def speed(model: ModelSpec, cap: Capacity, workload: Workload, *, concurrency: int | None = None,
          targets: Targets | None = None) -> Speed:
    """The deployment `cap` plans for `workload` (its requests: isl and osl), at `concurrency` requests (default:
    with targets, the users it serves within them; else what its memory holds), and with targets the users it
    serves: the fewer of its memory fit and its speed fit. At least one request is estimated, even where none
    fits."""
    isl, osl = workload.isl, workload.osl
    instance = Instance.of(model, cap, isl, osl)
    memory, users, bound = cap.max_concurrent_users, cap.max_concurrent_users, cap.max_concurrent_users_bound
    fit_users = limited_by = None
    if targets is not None and targets.given:
        fit_users, limited_by = instance.fit(targets)
        if fit_users < memory:
            users, bound = fit_users, "speed"
    else:
        targets = None
    estimate = instance.at(max(1, concurrency or users))
    bound_ms = estimate.decode_step_ms_bound
    return Speed(ctx=cap.ctx, isl=isl, osl=osl, concurrency=max(1, concurrency or users), replicas=instance.replicas,
                 estimate=estimate, tokens_per_s_per_user_bound=1000 / bound_ms,
                 tokens_per_s_per_gpu_bound=estimate.running * estimate.dp * 1000 / bound_ms / estimate.gpus,
                 error=stated_error(), targets=targets, fit_users=fit_users, fit_limited_by=limited_by,
                 memory_users=memory, users=users, bound=bound)


class SpeedAt(SpeedFigures):
    """One cell of a planning table: the speed at `concurrency` requests (None where no request fits), or why the
    speed model cannot estimate it (`not_estimated`)."""

    concurrency: int | None = None
    not_estimated: str | None = None


def speed_sweep(model: ModelSpec, deployments: list[tuple[str | None, Parallelism]], engine_name: str,
                kv_dtype: str | None, weights_dtype: str | None, cells: list[list[UsersAt]], isl: int, osl: int,
                users: int | None = None) -> list[list[SpeedAt]]:
    """For each GPU set (`deployments`: its catalogue name and layout) x ctx, the speed at `users` requests, or at
    the users memory holds at that ctx (`cells`, a planning table's: `kvplan.capacity.users_sweep`), where memory
    was planned: one instance per GPU set, whatever the contexts."""
    out = []
    for (gpu_name, parallel), row in zip(deployments, cells, strict=True):
        try:
            instance = Instance(model, gpu_name, engine_name, parallel, isl, osl, kv_dtype, weights_dtype)
        except KvplanError as err:
            out.append([SpeedAt(not_estimated=str(err))] * len(row))
            continue
        speeds = []
        for cell in row:
            concurrency = users or cell.max_users
            if cell.not_planned is not None or not concurrency:
                speeds.append(SpeedAt(not_estimated=cell.not_planned))
                continue
            speeds.append(SpeedAt(concurrency=concurrency, **SpeedFigures.of(instance.at(concurrency))))
        out.append(speeds)
    return out


def shortfall(served: Speed, asked: int) -> str:
    """Why a deployment whose memory holds `asked` users serves fewer within the targets."""
    each = "meets" if served.users == 1 else "meet"
    return (f"{served.users:,} user{'' if served.users == 1 else 's'} {each} {served.targets.label()} (limited by "
            f"{served.fit_limited_by}); {asked:,} asked")


def judged(cap: Capacity, served: Speed | None) -> Capacity:
    """The capacity as the targets leave it: the users served are the fewer of memory's and speed's, and a
    deployment whose memory holds the users asked but whose speed does not fails with the reason."""
    if served is None or served.targets is None:
        return cap
    update = {"max_concurrent_users": served.users, "max_concurrent_users_bound": served.bound,
              "fits": served.users >= cap.users}
    if cap.fits and not update["fits"]:
        update |= {"reasons": [shortfall(served, cap.users)],
                   "suggestions": ["kvplan plan with the same targets finds the layouts that meet them"]}
    return cap.model_copy(update=update)


class SpeedPlanRow(SpeedFigures, PlanRow):
    """A layout `kvplan plan` found, with its speed at the users asked (None where the speed model describes no
    pipeline stages), and with targets the users it serves within them: `max_concurrent_users` the fewer of
    `max_concurrent_users_memory` and `speed_fit_users`."""

    speed_flags: list[str] = []
    speed_fit_users: int | None = None
    speed_fit_limited_by: str | None = None
    max_concurrent_users_memory: int | None = None


class SpeedPlan(Plan):
    """`kvplan plan` for requests of isl + osl tokens, its rows with their speed, and the targets they meet."""

    isl: int
    osl: int
    targets: Targets | None
    speed_error: StatedError
    rows: list[SpeedPlanRow]


PIPELINE_LEFT_OUT = "layouts with pipeline stages are not searched: the speed model describes none"


def plan(model: ModelSpec, workload: Workload, hardware: Hardware, targets: Targets | None = None, *,
         engine_name: str = "vllm", options: EngineOptions | None = None, overhead: int | None = None,
         max_gpus: int = 64, draft: ModelSpec | None = None) -> SpeedPlan:
    """`kvplan.capacity.plan` for the workload's requests (isl, osl): with targets a layout serves the users only
    where its speed fit reaches them too, as well as its memory fit; each row with its speed at the users."""
    why = problem(hardware.name, engine_name)
    if why:
        raise KvplanError(why)
    resolved = speculation_options(model, draft, engine_name, options or EngineOptions(), Parallelism())
    targets = targets if targets is not None and targets.given else None

    @cache  # the search's accept hook and the rows ask for the same layouts: each is built and searched once
    def instance(layout: Parallelism, kv: str, weights: str | None) -> Instance:
        return Instance(model, hardware.name, engine_name, layout, workload.isl, workload.osl, kv, weights,
                        resolved.speculative_method, resolved.speculative_tokens)

    @cache
    def fit(layout: Parallelism, kv: str, weights: str | None) -> tuple[int, str]:
        return instance(layout, kv, weights).fit(targets)

    def meets(cap: Capacity) -> bool:
        """Whether the targets hold at the users asked: a layout's speed fit reaches them."""
        if cap.pipeline_parallel_size > 1:
            return False
        return fit(_parallelism(cap), cap.kv_dtype, cap.weights_dtype_override)[0] >= workload.target

    planned = capacity.plan(model, workload, hardware, engine_name=engine_name, options=options, overhead=overhead,
                            max_gpus=max_gpus, draft=draft, accept=meets if targets else None)
    rows = []
    for row in planned.rows:
        fields = row.model_dump() | {"weights_dtype_override": row.weights_dtype_override}
        if row.pipeline_parallel_size == 1:
            deployment = (_parallelism(row), row.kv_dtype, row.weights_dtype_override)
            e = instance(*deployment).at(workload.target)
            fields |= SpeedFigures.of(e) | {"speed_flags": e.flags}
            if targets:
                users, limited_by = fit(*deployment)
                fields |= {"speed_fit_users": users, "speed_fit_limited_by": limited_by,
                           "max_concurrent_users_memory": row.max_concurrent_users,
                           "max_concurrent_users": min(users, row.max_concurrent_users)}
        rows.append(SpeedPlanRow(**fields))
    notes = [*planned.notes, *([PIPELINE_LEFT_OUT] if targets else [])]
    return SpeedPlan(**planned.model_dump(exclude={"rows", "notes"}), rows=rows, notes=notes, isl=workload.isl,
                     osl=workload.osl, targets=targets, speed_error=stated_error())
