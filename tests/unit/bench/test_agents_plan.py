"""The capacity plan against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from loopstack.bench.load.plan import PlanLevel, compute_plan


def lv(agents: float, lat: list[float], sps: float, tool: float = 0.0) -> PlanLevel:
    return PlanLevel(agents, lat, sps, tool_s_per_step=tool)


# p95 of twenty values 1..20 (scaled) = 19.05 * scale
TWENTY = [float(i) for i in range(1, 21)]
LEVELS = [
    lv(1, [x * 0.1 for x in TWENTY], 0.9, tool=0.5),  # p95 1.905 s
    lv(4, [x * 0.2 for x in TWENTY], 2.4, tool=0.5),  # p95 3.81 s
    lv(16, [x * 0.5 for x in TWENTY], 4.0, tool=0.5),  # p95 9.525 s
]


def test_plan_picks_highest_level_under_slo_and_rounds_up() -> None:
    p = compute_plan(LEVELS, agents_target=50, slo_p95_step_s=5.0)
    assert [x.meets for x in p.points] == [True, True, False]
    assert p.points[1].p95_step_s == pytest.approx(3.81)
    assert p.per_replica == 4
    assert p.replicas == 13  # ceil(50 / 4)
    # rate cross-check at C*=4: mean latency 0.2*10.5 = 2.1 s, + 0.5 s tool -> 2.6 s cycle
    assert p.per_agent_calls_per_s == pytest.approx(1 / 2.6)
    # 50 / 2.6 = 19.23 calls/s over 2.4 calls/s per replica = 8.01 -> 9
    assert p.replicas_by_rate == 9
    assert any("between 4 and 16" in n for n in p.notes)
    assert "4 agents/replica" in p.line() and "need 13 replica" in p.line()


def test_plan_all_levels_meet_is_a_lower_bound() -> None:
    p = compute_plan(LEVELS, agents_target=100, slo_p95_step_s=10.0)
    assert p.per_replica == 16 and p.replicas == 7  # ceil(100/16)
    assert any("lower bound" in n for n in p.notes)


def test_plan_no_level_meets() -> None:
    p = compute_plan(LEVELS, agents_target=10, slo_p95_step_s=1.0)
    assert p.replicas is None and p.per_replica == 0
    assert "no tested level" in p.line()


def test_plan_by_goodput() -> None:
    # within 3.05 s: level 1 all 20 (1.0), level 4: 15 of 20 (0.75), level 16: 6/20 (0.3)
    p = compute_plan(LEVELS, agents_target=8, slo_p95_step_s=3.05, min_goodput=0.75)
    assert [x.goodput for x in p.points] == [1.0, 0.75, 0.3]
    assert p.per_replica == 4 and p.replicas == 2
    p = compute_plan(LEVELS, agents_target=8, slo_p95_step_s=3.05, min_goodput=0.95)
    assert p.per_replica == 1 and p.replicas == 8


def test_failed_steps_count_against_the_slo() -> None:
    lat = [1.0] * 18 + [math.inf] * 2  # 10 % failed -> p95 is infinite
    p = compute_plan([lv(2, lat, 1.0)], agents_target=4, slo_p95_step_s=5.0)
    assert p.points[0].meets is False and p.replicas is None
    p = compute_plan([lv(2, lat, 1.0)], 4, 5.0, min_goodput=0.9)
    assert p.points[0].goodput == 0.9 and p.replicas == 2


def test_cost_per_task_at_the_planned_replicas() -> None:
    levels = [PlanLevel(4, [1.0] * 20, 2.0, tasks_per_s=0.5), PlanLevel(8, [9.0] * 20, 3.0)]
    p = compute_plan(levels, agents_target=10, slo_p95_step_s=5.0, replica_cost_per_hour=3.6)
    # C* = 4 -> R = 3 replicas; one agent finishes 0.5 / 4 tasks/s; 10 agents 1.25 tasks/s
    assert p.replicas == 3
    assert p.replica_s_per_task == pytest.approx(3 / 1.25)  # 2.4 replica-seconds
    assert p.cost_per_1000_tasks == pytest.approx(1000 * 2.4 * 3.6 / 3600)  # 2.40
    assert "2.4 replica-seconds per task" in p.cost_line() and "cost 2.40" in p.cost_line()
    unpriced = compute_plan(levels, agents_target=10, slo_p95_step_s=5.0)
    assert unpriced.cost_per_1000_tasks is None and unpriced.replica_s_per_task is not None
    none = compute_plan(levels, agents_target=10, slo_p95_step_s=0.5, replica_cost_per_hour=1)
    assert none.replica_s_per_task is None and "n/a" in none.cost_line()
