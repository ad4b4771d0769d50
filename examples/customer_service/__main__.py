"""Run the customer-service agent's sessions against a running server (``make serve``) and
score them with the golden checkers:

    python -m examples.customer_service --lang en        # or zh, or all
    make example-cs CS_LANG=zh

Each session is ``loopstack agent run`` as a user would type it: the shop's MCP server
(``--mcp "shop=python examples/customer_service/server.py" --mcp-env SHOP_STATE_DIR=...``), the
customer's memory seeded first (`examples.customer_service.seed`), ``--approve`` only in the
sessions where a person approved refunds. The report (markdown table, answers, pass/fail and
why) is printed and written under bench/results/.
"""

from __future__ import annotations

import argparse
import os
import sys

from loopstack.bench.golden import run
from loopstack.bench.golden.tasks_service import service_tasks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lang", choices=("en", "zh", "all"), default="en")
    ap.add_argument(
        "--base-url", default=os.environ.get("LOOPSTACK_BASE_URL", "http://127.0.0.1:8000/v1")
    )
    ap.add_argument("--tasks", default="", help="comma-separated task ids (default: all)")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    ids = [t.id for t in service_tasks() if args.lang in ("all", t.lang)]
    if args.tasks:
        ids = [i for i in ids if i in set(args.tasks.split(","))]
    cmd = ["--set", "service", "--tasks", ",".join(ids), "--base-url", args.base_url]
    cmd += ["--concurrency", str(args.concurrency)]
    if args.out:
        cmd += ["--out", args.out]
    return run.main(cmd)


if __name__ == "__main__":
    sys.exit(main())
