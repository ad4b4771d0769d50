"""The GPU fleet plan: replicas of a given GPU and model for N agents at a p95 step SLO,
from the replica model alone - nobody here ran a GPU, and every figure it prints says
"modelled".

    C*  = the largest agent count per replica whose modelled p95 step <= the SLO, with
          the KV of its running sequences within capacity (`loopstack.bench.load.kvcache`)
    R   = ceil(N / C*)
    cost per 1,000 tasks = 1000 x R x tp GPU-seconds / (N x tasks/s an agent at C*)

The binding limit is what stops C* + 1: the KV capacity (running sequences, or the prefix
cache past its cliff: resumed steps re-prefill their whole context), the step time's
bottleneck at saturation (compute or memory bandwidth), or the SLO. The error bars are the
validation's median errors on published runs (`loopstack.bench.load.published`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import typer

from loopstack.bench.load import BenchError
from loopstack.bench.load.kvcache import AgentState, agent_state
from loopstack.bench.load.roofline import (
    Coefficients,
    ReplicaSpec,
    fit_coefficients,
    step_s,
    step_terms,
)
from loopstack.bench.load.workload import AgentWorkload, RequestWorkload

MAX_AGENTS = 100_000
#: without --workload: a generic tool-using agent (6 calls a task, a 300-token first prompt,
#: 150-token answers (p95 300), 400-token tool results, log-normal tool pauses of median
#: 2 s); not the shipped CPU scenario, whose 48-token answers and 0.3 s tools suit a CPU box
DEFAULT_WORKLOAD = AgentWorkload.model_validate({"output_tokens": 150, "output_tokens_p95": 300})


@dataclass
class GpuPlan:
    spec: ReplicaSpec
    coeffs: Coefficients
    workload: AgentWorkload
    agents_target: int
    slo_p95_step_s: float
    per_replica: int
    replicas: int | None
    binding: str
    at_cstar: AgentState | None
    cliff_agents: int | None
    gpu_s_per_task: float | None = None
    cost_per_hour: float | None = None  # per GPU
    cost_per_1000_tasks: float | None = None
    error_bars: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        hw = self.spec.hardware.name
        head = f"GPU plan (MODELLED, not measured: no GPU ran this) for {self.spec.tp} x {hw}"
        out = [
            head,
            f"  replica: {self.spec.describe()}",
            f"  workload: {self.workload.describe()}",
        ]
        out.append(f"  replica model: {self.coeffs.describe()}; fitted on {self.coeffs.fitted_on}")
        if self.replicas is None:
            out.append(f"  plan: not even one agent per replica meets p95 step <= "
                       f"{self.slo_p95_step_s:g} s ({self.binding})")  # fmt: skip
        else:
            out.append(
                f"  plan: {self.per_replica} agents/replica at p95 step <= "
                f"{self.slo_p95_step_s:g} s -> {self.agents_target} agents need "
                f"{self.replicas} replica(s) ({self.replicas * self.spec.tp} GPUs); "
                f"binding limit: {self.binding}"
            )
        s = self.at_cstar
        if s is not None and s.steady is not None:
            terms = step_terms(self.spec, self.coeffs, s.steady.batch)
            out.append(
                f"  at {s.agents} agents: step p50 {s.p50_step_s:.2f} s, p95 {s.p95_step_s:.2f} "
                f"s, TPOT {s.tpot_s * 1e3:.1f} ms ({terms.bound}-bound), "
                f"{s.steady.decode_seqs:.0f} sequences decoding, {s.steps_per_s:.2f} steps/s, "
                f"resumed steps hit the prefix cache {s.hit:.0%} (token hit rate "
                f"{s.token_hit_rate:.0%}), a paused context survives {_secs(s.tau_s)}"
            )
        if self.cliff_agents is not None:
            out.append(
                f"  prefix-cache cliff: past ~{self.cliff_agents} agents a replica resumed steps "
                "stop finding their context cached and re-prefill it"
            )
        if self.gpu_s_per_task is not None:
            line = f"  cost: {self.gpu_s_per_task:.1f} GPU-seconds a task"
            if self.cost_per_1000_tasks is not None:
                line += (
                    f"; 1,000 tasks cost {self.cost_per_1000_tasks:.2f} at "
                    f"{self.cost_per_hour:g} per GPU-hour"
                )
            out.append(line)
        out += [f"  error bars: {e}" for e in self.error_bars]
        out += [f"  note: {n}" for n in self.notes]
        return out


def _secs(x: float) -> str:
    return "for ever" if math.isinf(x) else f"{x:.1f} s"


class _Model:
    def __init__(self, spec: ReplicaSpec, coeffs: Coefficients) -> None:
        self.spec, self.coeffs = spec, coeffs
        self.kv = spec.kv_capacity_tokens()
        if self.kv <= 0:
            raise BenchError(f"the weights do not fit: {spec.describe()}")

    def state(self, wl: AgentWorkload, n: int) -> AgentState:
        c = self.coeffs
        return agent_state(
            wl, n,
            lambda b: step_s(self.spec, c, b),
            lambda prompt: c.request_s + c.request_token_s * prompt,
            self.kv, self.spec.token_budget, self.spec.max_seqs,
        )  # fmt: skip


def meets(s: AgentState, slo: float) -> bool:
    return s.feasible and s.p95_step_s <= slo


def per_replica(model: _Model, wl: AgentWorkload, slo: float) -> tuple[int, dict[int, AgentState]]:
    """C* by doubling then bisection (the p95 step grows with the agents)."""
    seen: dict[int, AgentState] = {}

    def ok(n: int) -> bool:
        if n not in seen:
            seen[n] = model.state(wl, n)
        return meets(seen[n], slo)

    if not ok(1):
        return 0, seen
    lo, hi = 1, 2
    while hi <= MAX_AGENTS and ok(hi):
        lo, hi = hi, hi * 2
    if hi > MAX_AGENTS:
        return lo, seen
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, seen


def binding(model: _Model, wl: AgentWorkload, best: int, seen: dict[int, AgentState]) -> str:
    nxt = seen.get(best + 1) or model.state(wl, best + 1)
    first = seen.get(1) or model.state(wl, 1)
    if nxt.saturated == "KV capacity":
        return "KV capacity (the running sequences' KV does not fit)"
    if nxt.steady is not None and first.hit > 0 and nxt.hit < 0.5 * first.hit:
        return (
            f"KV capacity: the prefix cache stops holding (resumed steps hit {first.hit:.0%} "
            f"at 1 agent, {nxt.hit:.0%} at {best + 1}) and every step re-prefills its context"
        )
    if nxt.saturated:
        return f"saturation ({nxt.saturated})"
    st = nxt.steady
    bound = step_terms(model.spec, model.coeffs, st.batch).bound if st else "step time"
    return f"the SLO (p95 step {nxt.p95_step_s:.2f} s at {best + 1}; step time {bound}-bound)"


def gpu_plan(
    spec: ReplicaSpec,
    wl: AgentWorkload,
    agents: int,
    slo_p95_step_s: float,
    coeffs: Coefficients | None = None,
    cost_per_hour: float | None = None,
    validation: Path | None = None,
) -> GpuPlan:
    coeffs = coeffs or fit_coefficients()
    model = _Model(spec, coeffs)
    best, seen = per_replica(model, wl, slo_p95_step_s)
    grid = sorted(seen.values(), key=lambda s: s.agents)
    plan = GpuPlan(
        spec=spec,
        coeffs=coeffs,
        workload=wl,
        agents_target=agents,
        slo_p95_step_s=slo_p95_step_s,
        per_replica=best,
        replicas=math.ceil(agents / best) if best else None,
        binding=binding(model, wl, best, seen) if best else _why_none(grid),
        at_cstar=seen.get(best),
        cliff_agents=find_cliff(model, wl, max(best * 2, 16)),
    )
    s = plan.at_cstar
    if best and s is not None and plan.replicas:
        per_agent = s.tasks_per_s(wl.steps) / best
        plan.gpu_s_per_task = plan.replicas * spec.tp / (agents * per_agent)
        if cost_per_hour is not None:
            plan.cost_per_hour = cost_per_hour
            plan.cost_per_1000_tasks = 1000 * plan.gpu_s_per_task * cost_per_hour / 3600
    if best >= MAX_AGENTS:
        plan.notes.append(f"the search stopped at {MAX_AGENTS} agents a replica")
    plan.error_bars = error_bars(validation)
    plan.notes.append(
        "replicas are independent, agents spread evenly and kept on one replica (its cache); "
        "KV cache reserve: vLLM's 90 % memory share less the weights and 2 GB a GPU"
    )
    return plan


def _why_none(grid: list[AgentState]) -> str:
    one = grid[0] if grid else None
    if one is None or one.saturated:
        return f"one agent saturates the replica ({one.saturated if one else 'n/a'})"
    return f"one agent's p95 step is {one.p95_step_s:.2f} s"


def curve(model: _Model, wl: AgentWorkload, top: int, points: int = 24) -> list[AgentState]:
    """States at agent counts from 1 to ``top``, spaced geometrically (the cliff plot)."""
    ns = sorted({max(1, round(top ** (i / (points - 1)))) for i in range(points)})
    return [model.state(wl, n) for n in ns]


def find_cliff(model: _Model, wl: AgentWorkload, top: int) -> int | None:
    """The last agent count before resumed steps hit less than half as often as at one
    agent (a geometric scan to ``top``, doubling past it, then bisection); None when the
    replica saturates or runs out of KV for its running sequences first."""
    first = model.state(wl, 1)
    if not first.feasible:
        return None

    def good(n: int) -> bool:
        s = model.state(wl, n)
        return s.feasible and s.hit >= 0.5 * first.hit

    lo, hi = 1, 0
    for s in curve(model, wl, top)[1:]:
        if not (s.feasible and s.hit >= 0.5 * first.hit):
            hi = s.agents
            break
        lo = s.agents
    while not hi:
        if lo * 2 > MAX_AGENTS:
            return None
        if good(lo * 2):
            lo *= 2
        else:
            hi = lo * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if good(mid) else (lo, mid)
    past = model.state(wl, hi)
    return lo if past.feasible else None


def error_bars(validation: Path | None) -> list[str]:
    from loopstack.bench.load.published import DEFAULT_TABLE, summary_lines, validate_table

    path = validation or DEFAULT_TABLE
    if not path.is_file():
        return [f"n/a (no validation table at {path})"]
    return summary_lines(validate_table(path))


def cliff_plot(
    specs: list[ReplicaSpec], wl: AgentWorkload, top: int, out: Path,
    coeffs: Coefficients | None = None, slo_s: float | None = None,
) -> Path:  # fmt: skip
    """Hit rate and p95 step against agents a replica, one line per replica kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    coeffs = coeffs or fit_coefficients()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for spec in specs:
        states = curve(_Model(spec, coeffs), wl, top, points=48)
        ok = [s for s in states if s.feasible]
        held = [s for s in states if s.steady is not None]  # KV-capacity points too
        label = f"{spec.tp}x {spec.hardware.name.replace('NVIDIA ', '')}"
        line = a1.plot([s.agents for s in held], [100 * s.hit for s in held], marker=".",
                       label=label)[0]  # fmt: skip
        a2.plot([s.agents for s in ok], [s.p95_step_s for s in ok], marker=".", label=label,
                color=line.get_color())  # fmt: skip
    if slo_s is not None:
        a2.axhline(slo_s, color="grey", linestyle="--", linewidth=1)
        a2.text(1, slo_s * 1.08, f"SLO p95 step {slo_s:g} s", fontsize=7, color="grey")
    a1.set_ylabel("resumed steps hitting\nthe prefix cache (%)")
    a2.set_ylabel("p95 step (s)")
    a2.set_yscale("log")
    a2.set_xlabel("agents a replica (modelled, not measured)")
    for a in (a1, a2):
        a.set_xscale("log")
        a.grid(True, alpha=0.3)
    a1.legend(fontsize=8)
    a1.set_title(f"KV cliff, {specs[0].arch.name}: {wl.tool_pause} tool pause", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------
# open-loop requests and the command


def request_plan(
    spec: ReplicaSpec, wl: RequestWorkload, slo_s: float, coeffs: Coefficients
) -> list[str]:
    """Replicas for ``wl.rate`` arrivals a second: the largest rate one replica serves with
    the modelled p95 end-to-end request (a session: each turn) within ``slo_s``. A later
    turn finds the session's context cached if the think time is shorter than the cache's
    reach (``tau``, as for agents: `loopstack.bench.load.kvcache`); else it prefills it again."""
    from loopstack.bench.load.replica import Saturated, Steady, Traffic, latency, max_rate, solve
    from loopstack.bench.load.workload import PauseDist

    turns = wl.turns
    prompt = sum(wl.context(t) for t in range(turns)) / turns
    think = PauseDist.of(wl.think) if wl.think else None
    kv = spec.kv_capacity_tokens()

    def uncached(hit: float) -> float:
        first = wl.input_tokens + wl.shared_prefix_tokens * (1.0 if turns == 1 else 0.0)
        later = [hit * wl.input_tokens + (1 - hit) * (wl.context(t) - wl.shared_prefix_tokens)
                 for t in range(1, turns)]  # fmt: skip
        return (first + sum(later)) / turns

    def over(p: float) -> float:
        return coeffs.request_s + coeffs.request_token_s * p

    def state(rate: float) -> tuple[Steady, Traffic, float] | None:
        hit = 1.0
        for _ in range(60):
            tr = Traffic(rate * turns, prompt, uncached(hit), wl.output_tokens)
            st = solve(lambda b: step_s(spec, coeffs, b), tr, spec.token_budget, spec.max_seqs)
            if isinstance(st, Saturated):
                return None
            free = kv - st.running_kv_tokens - wl.shared_prefix_tokens
            if free <= 0:
                return None
            if think is None or turns == 1:
                return st, tr, 1.0
            tau = free / (tr.rate * (tr.uncached + wl.output_tokens))
            new = think.below(tau)
            if abs(new - hit) < 1e-4:
                return st, tr, new
            hit = new
        return None  # no settled hit rate: treat as not served

    def ok(rate: float) -> bool:
        got = state(rate)
        if got is None:
            return False
        st, tr, _ = got
        return latency(st, tr, over, spec.token_budget, 0.95, output=wl.out_p95()).e2e_s <= slo_s

    best = max_rate(ok)
    out = [
        f"GPU plan (MODELLED, not measured: no GPU ran this) for {spec.tp} x {spec.hardware.name}",
        f"  replica: {spec.describe()}",
        f"  workload: {wl.describe()}",
        f"  replica model: {coeffs.describe()}; fitted on {coeffs.fitted_on}",
        f"  one replica: {best:.2f} arrivals/s with p95 request <= {slo_s:g} s",
    ]
    got = state(best) if best > 0 else None
    if got is not None and turns > 1:
        out.append(f"  at that rate later turns find the session cached {got[2]:.0%} of the time")
    if wl.rate and best > 0:
        out.append(f"  plan: {wl.rate:g}/s need {math.ceil(wl.rate / best)} replica(s)")
    return out


def plan_command(
    hardware: str, model: str | None, tp: int, weights: str, kv: str, workload: Path | None,
    agents: int, slo_s: float, cost_per_hour: float | None, plot: Path | None,
) -> list[str]:  # fmt: skip
    from loopstack.bench.load.architecture import load_architecture
    from loopstack.bench.load.hardware import get_hardware
    from loopstack.bench.load.workload import load_workload

    if not model:
        raise BenchError("--hardware needs --model (a Hugging Face id or a model folder)")
    spec = ReplicaSpec(get_hardware(hardware), load_architecture(model), tp, weights, kv)
    wl = load_workload(workload) if workload else DEFAULT_WORKLOAD
    coeffs = fit_coefficients()
    if isinstance(wl, RequestWorkload):
        lines = request_plan(spec, wl, slo_s, coeffs)
    else:
        lines = gpu_plan(spec, wl, agents, slo_s, coeffs, cost_per_hour).lines()
        if plot is not None:
            top = max(64, 4 * (gpu_plan(spec, wl, agents, slo_s, coeffs).per_replica or 16))
            lines.append(f"wrote {cliff_plot([spec], wl, top, plot, coeffs, slo_s)}")
    return lines


def cliff_plot_command(
    cliff_plot_path: Path = typer.Option(..., "--cliff-plot", help="where the PNG goes"),
    model: str = typer.Option("Qwen/Qwen3-8B"),
    hardware: str = typer.Option("h100,h200,l40s", help="replica kinds, comma-separated"),
    top: int = typer.Option(1000, help="agents up to"),
    workload: Path | None = typer.Option(None),
    slo_p95_step_s: float = typer.Option(10.0),
) -> None:
    """``python -m loopstack.bench.load.gpuplan --cliff-plot OUT --model M --hardware h100,h200
    --top N`` [--workload FILE]: the KV-cliff plot (modelled) for several replica kinds."""
    from loopstack.bench.load.architecture import load_architecture
    from loopstack.bench.load.hardware import get_hardware
    from loopstack.bench.load.workload import load_workload

    wl = load_workload(workload) if workload else DEFAULT_WORKLOAD
    if not isinstance(wl, AgentWorkload):
        raise typer.BadParameter("the cliff plot needs an agents workload")
    arch = load_architecture(model)
    specs = [ReplicaSpec(get_hardware(h), arch) for h in hardware.split(",")]
    print(f"wrote {cliff_plot(specs, wl, top, cliff_plot_path, slo_s=slo_p95_step_s)}")


def run() -> None:
    typer.run(cliff_plot_command)


if __name__ == "__main__":
    run()
