"""The client bench's figures: per target and client, completion over the runs, the median
turns, tool calls and wall time, and the first-token time cold (the first run of this
invocation) and cached (the median of the later runs, whose first prompt is the first run's).
Written as OUT/result.json (every run, every request) and OUT/results.md (the table)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loopstack.bench.clients.runs import RunRecord
from loopstack.bench.common import fmt_num, print_table

HEADERS = ["target", "client", "done", "turns", "tool calls", "unanswered",
           "first token cold s", "first token cached s", "wall s", "errors",
           "why (last failed run)"]  # fmt: skip


@dataclass
class ClientSummary:
    target: str
    client: str
    runs: int
    done: int
    turns_median: float | None
    tool_calls_median: float | None
    unanswered: int  # over all runs
    first_token_cold_s: float | None
    first_token_cached_s: float | None
    wall_median_s: float | None
    errors: int
    last_failure: str | None

    def row(self) -> list[str]:
        return [
            self.target,
            self.client,
            f"{self.done}/{self.runs}",
            fmt_num(self.turns_median, 1),
            fmt_num(self.tool_calls_median, 1),
            str(self.unanswered),
            fmt_num(self.first_token_cold_s),
            fmt_num(self.first_token_cached_s),
            fmt_num(self.wall_median_s, 1),
            str(self.errors),
            (self.last_failure or "")[:90],
        ]


def _median(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def summarise(records: Sequence[RunRecord]) -> list[ClientSummary]:
    """One summary per (target, client), in the order the runs came."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        groups.setdefault((r.target, r.client), []).append(r)
    out = []
    for (target, client), runs in groups.items():
        runs = sorted(runs, key=lambda r: r.run)
        failed = [r for r in runs if not r.done]
        out.append(
            ClientSummary(
                target=target,
                client=client,
                runs=len(runs),
                done=sum(r.done for r in runs),
                turns_median=_median([r.turns for r in runs]),
                tool_calls_median=_median([r.tool_calls for r in runs]),
                unanswered=sum(r.unanswered for r in runs),
                first_token_cold_s=runs[0].first_token_s if runs[0].run == 1 else None,
                first_token_cached_s=_median([r.first_token_s for r in runs if r.run > 1]),
                wall_median_s=_median([r.wall_s for r in runs]),
                errors=sum(1 for r in runs if r.error),
                last_failure=(failed[-1].why if failed else None),
            )
        )
    return out


def markdown(summaries: Sequence[ClientSummary], meta: dict[str, Any]) -> str:
    lines = [
        "# Client tasks",
        "",
        f"{meta.get('created', '')}: `{meta.get('command', 'loopstack bench clients')}`",
        "",
    ]
    for t in meta.get("targets", []):
        lines.append(f"- {t['name']}: {t['base_url']}, model `{t['model']}`")
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for s in summaries:
        cells = [c.replace("|", "\\|") for c in s.row()]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "done: runs the strict checker passed. turns: model requests the client made (the "
        "proxy's count); tool calls: calls in the model's answers; unanswered: model requests "
        "with no output back (dropped by the client before the first token, or failed), "
        "over all runs. First token: of the run's "
        "first model request, from the request's arrival at the proxy to the first output "
        "event; cold is run 1 of this invocation, cached the median of the later runs. "
        "Medians over the runs.",
        "",
    ]
    return "\n".join(lines)


def write_outputs(out: Path, meta: dict[str, Any], records: Sequence[RunRecord]) -> list[Path]:
    """OUT/result.json and OUT/results.md from the runs so far (written after every run, so
    an interrupted bench keeps what it measured)."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarise(records)
    data = {
        **meta,
        "summary": [asdict(s) for s in summaries],
        "runs": [r.as_dict() for r in records],
    }
    js, md = out / "result.json", out / "results.md"
    js.write_text(json.dumps(data, indent=1, default=str))
    md.write_text(markdown(summaries, meta))
    return [js, md]


def print_summary(summaries: Sequence[ClientSummary]) -> None:
    print_table(HEADERS, [s.row() for s in summaries])


def run_line(r: RunRecord) -> str:
    """One printed line as each run ends."""
    mark = "done" if r.done else "FAILED"
    return (
        f"{r.target} {r.client} run {r.run}: {mark} ({r.why}); turns {r.turns}, tool calls "
        f"{r.tool_calls}, first token {fmt_num(r.first_token_s)} s, wall {r.wall_s:.1f} s"
        + (f"; error {r.error[:160]}" if r.error else "")
    )
