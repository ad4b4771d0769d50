#!/usr/bin/env bash
# GPU smoke run for a fresh NVIDIA machine, unattended:
#   install (make install ENGINE=gpu) -> loopstack serve -> wait for /health ->
#   tool-call validity (loopstack bench serving validity) -> constraint cost (loopstack bench
#   serving constraint-cost) -> agent load sweep (loopstack bench agents: 1, 4, 16 agents)
#   -> the GPU image (deploy/docker/Dockerfile.gpu, as `make image-gpu` builds it) served with
#   Docker and asked for a tool call -> one results folder and a summary: the step table, then
#   the figures each benchmark prints itself (the same tables as on CPU: docs/benchmarks.md).
#
#   deploy/gpu-smoke.sh                          # Qwen/Qwen2.5-7B-Instruct (or $LOOPSTACK_MODEL)
#   deploy/gpu-smoke.sh /models/Qwen2.5-7B-Instruct   # a local HF folder
#   ENGINE=cpu deploy/gpu-smoke.sh               # the same run on a CPU box (the offline model,
#                                                # Dockerfile.cpu): how CI runs it, against a fake
#
# Budget: about 10 minutes on one H200 once the model is on disk (the install and a first
# download are extra). Every step runs under `timeout`; a failed step is reported and the
# run goes on to the next one, and the script exits non-zero if any step failed.
#
# Knobs (environment): ENGINE (gpu; cpu: no GPU needed, LOOPSTACK_DEVICE=cpu), RESULTS
# (folder), PORT (8000), SMOKE_START_TIMEOUT_S (600), SMOKE_VALIDITY_LIMIT (30 corpus
# entries), SMOKE_COST_PROMPTS (16 tool + half as many response_format prompts), SMOKE_AGENTS
# (1,4,16), SMOKE_TASKS_PER_AGENT (2), SMOKE_SKIP_INSTALL=1,
# VENV (.venv), SMOKE_IMAGE (unset: build loopstack:<version>-gpu; NAME:TAG: use that image;
# skip: no image step). The image step needs a Docker daemon with the NVIDIA container
# toolkit; without a daemon it is recorded as skipped. The image downloads the model into
# the Docker volume loopstack-smoke-data (kept for the next run) unless $1 is a local folder.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
ENGINE=${ENGINE:-gpu}
case $ENGINE in
gpu) DEFAULT_MODEL=Qwen/Qwen2.5-7B-Instruct DEVICE=auto ;;
cpu) DEFAULT_MODEL=offline:qwen2.5-coder-0.5b-instruct DEVICE=cpu ;;
*)
    echo "ENGINE must be gpu or cpu, not '$ENGINE'" >&2
    exit 2
    ;;
esac
MODEL=${1:-${LOOPSTACK_MODEL:-$DEFAULT_MODEL}}
PORT=${PORT:-8000}
RESULTS=${RESULTS:-$ROOT/bench/results/gpu-smoke-$(date -u +%Y%m%dT%H%M%SZ)}
START_TIMEOUT_S=${SMOKE_START_TIMEOUT_S:-600}
VALIDITY_LIMIT=${SMOKE_VALIDITY_LIMIT:-30}
COST_PROMPTS=${SMOKE_COST_PROMPTS:-16}
AGENTS=${SMOKE_AGENTS:-1,4,16}
TASKS_PER_AGENT=${SMOKE_TASKS_PER_AGENT:-2}
API_KEY=${LOOPSTACK_API_KEY:-smoke-$RANDOM$RANDOM}
BASE=http://127.0.0.1:$PORT
VENV=${VENV:-$ROOT/.venv}
PY=$VENV/bin/python
mkdir -p "$RESULTS"
STEPS=$RESULTS/steps.tsv
printf 'step\tstatus\tseconds\n' >"$STEPS"
FAILED=0
SERVER_PID=""

log() { printf '[gpu-smoke %s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$RESULTS/smoke.log" >&2; }

CONTAINER=loopstack-gpu-smoke
IMAGE_STARTED=0

cleanup() {
    if ((IMAGE_STARTED)); then
        docker rm -f "$CONTAINER" >/dev/null 2>&1 || true
    fi
    if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        log "stopping loopstack serve (pid $SERVER_PID)"
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# step NAME SECONDS CMD...: run CMD under a hard timeout, log its output, record the outcome.
step() {
    local name=$1 secs=$2
    shift 2
    log "step $name (limit ${secs}s): $*"
    local t0 rc=0
    t0=$(date +%s)
    timeout --kill-after=15 "$secs" "$@" >"$RESULTS/$name.out" 2>&1 || rc=$?
    local dt=$(($(date +%s) - t0))
    if ((rc == 0)); then
        printf '%s\tok\t%d\n' "$name" "$dt" >>"$STEPS"
        log "step $name ok in ${dt}s"
    else
        FAILED=1
        local why="exit $rc"
        ((rc == 124 || rc == 137)) && why="TIMED OUT after ${secs}s"
        printf '%s\tFAILED (%s)\t%d\n' "$name" "$why" "$dt" >>"$STEPS"
        log "step $name FAILED ($why); last lines of $RESULTS/$name.out:"
        tail -n 25 "$RESULTS/$name.out" >&2 || true
    fi
    return 0
}

die() {
    log "FATAL: $*"
    exit 1
}

# ---------------------------------------------------------------- 0. the machine
if [[ $ENGINE == gpu ]]; then
    command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs an NVIDIA GPU (or ENGINE=cpu)"
    timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
        >"$RESULTS/gpu.csv" || die "nvidia-smi failed"
else
    printf 'name, memory.total, driver_version\nno GPU (ENGINE=cpu): %s, %s CPUs, -\n' \
        "$(uname -m)" "$(nproc)" >"$RESULTS/gpu.csv"
fi
log "machine: $(tail -n +2 "$RESULTS/gpu.csv" | paste -sd ';')"
log "engine: $ENGINE; model: $MODEL; results: $RESULTS"

# ---------------------------------------------------------------- 1. install
if [[ ${SMOKE_SKIP_INSTALL:-0} != 1 ]]; then
    step install 1800 make install ENGINE="$ENGINE"
    grep -q $'^install\tok' "$STEPS" || die "install failed (see $RESULTS/install.out)"
fi
[[ -x $PY ]] || die "$PY missing: run without SMOKE_SKIP_INSTALL=1"
timeout 60 "$PY" -m pip list --format=freeze 2>/dev/null | grep -iE '^(vllm|torch|transformers)==' \
    >"$RESULTS/versions.txt" || true

# ---------------------------------------------------------------- 2. serve and wait for health
SERVE_T0=$(date +%s)
log "starting loopstack serve on :$PORT"
LOOPSTACK_MODEL=$MODEL LOOPSTACK_API_KEY=$API_KEY LOOPSTACK_PORT=$PORT LOOPSTACK_DEVICE=$DEVICE \
    LOOPSTACK_ENGINE_START_TIMEOUT_S=$START_TIMEOUT_S \
    setsid "$VENV/bin/loopstack" serve >"$RESULTS/server.log" 2>&1 &
SERVER_PID=$!
healthy=0
deadline=$((SERVE_T0 + START_TIMEOUT_S))
while (($(date +%s) < deadline)); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    if curl -fsS -m 5 "$BASE/health" >/dev/null 2>&1; then
        healthy=1
        break
    fi
    sleep 1
done
START_S=$(($(date +%s) - SERVE_T0))
if ((healthy == 0)); then
    printf 'serve\tFAILED (not healthy)\t%d\n' "$START_S" >>"$STEPS"
    tail -n 40 "$RESULTS/server.log" >&2 || true
    die "loopstack serve did not become healthy in ${START_TIMEOUT_S}s (log: $RESULTS/server.log)"
fi
printf 'serve\tok\t%d\n' "$START_S" >>"$STEPS"
log "healthy after ${START_S}s"
SERVED=$(curl -fsS -m 10 -H "Authorization: Bearer $API_KEY" "$BASE/v1/models" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
log "served model name: $SERVED"

# ---------------------------------------------------------------- 3. benches
# The CLI commands of docs/benchmarks.md, as on CPU; each prints its own table of figures.
LOOPSTACK=$VENV/bin/loopstack
step tool_validity 240 "$LOOPSTACK" bench serving validity --base-url "$BASE/v1" \
    --api-key "$API_KEY" --limit "$VALIDITY_LIMIT" --modes required,named,auto \
    --arms constrained,unconstrained --concurrency 32 --max-tokens 256 --timeout 120 \
    --progress 0 --out "$RESULTS/tool_validity.json"

step constraint_cost 150 "$LOOPSTACK" bench serving constraint-cost --base-url "$BASE/v1" \
    --api-key "$API_KEY" --tool-prompts "$COST_PROMPTS" --rf-prompts $((COST_PROMPTS / 2)) \
    --concurrency 4 --max-tokens 128 --timeout 60 --out "$RESULTS/constraint_cost.json"

step agents 210 env LOOPSTACK_API_KEY="$API_KEY" "$LOOPSTACK" bench agents \
    --base-url "$BASE/v1" --agents "$AGENTS" --tasks-per-agent "$TASKS_PER_AGENT" \
    --out "$RESULTS/agents"

timeout 15 curl -fsS -m 10 "$BASE/metrics" >"$RESULTS/metrics.txt" 2>/dev/null || true
TOTAL_S=$(($(date +%s) - SERVE_T0))
printf 'total_after_install\t-\t%d\n' "$TOTAL_S" >>"$STEPS"

# ---------------------------------------------------------------- 4. the GPU image
# The venv's server lets go of the GPU first; then the image serves the same model on
# 127.0.0.1:$((PORT + 1)) and must answer /health and one forced tool call with valid JSON.
image_smoke() {
    set -euo pipefail
    local image=${SMOKE_IMAGE:-} port=$((PORT + 1)) models=() gpus=(--gpus all)
    [[ $ENGINE == cpu ]] && gpus=()
    if [[ -z $image ]]; then
        image=loopstack:$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')-$ENGINE
        echo "building $image"
        docker build -f "deploy/docker/Dockerfile.$ENGINE" -t "$image" .
    fi
    [[ -d $MODEL ]] && models=(-v "$MODEL:$MODEL:ro")
    docker rm -f "$CONTAINER" >/dev/null 2>&1 || true
    docker run -d --name "$CONTAINER" "${gpus[@]}" --ipc host -p "127.0.0.1:$port:8000" \
        -e LOOPSTACK_MODEL="$MODEL" -e LOOPSTACK_API_KEY="$API_KEY" -e HF_TOKEN \
        -e LOOPSTACK_ENGINE_START_TIMEOUT_S="$START_TIMEOUT_S" \
        -v loopstack-smoke-data:/data "${models[@]}" "$image"
    local deadline=$(($(date +%s) + START_TIMEOUT_S))
    until curl -fsS -m 5 "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
        if [[ $(docker inspect -f '{{.State.Running}}' "$CONTAINER" 2>/dev/null) != true ]] ||
            (($(date +%s) > deadline)); then
            echo "the image did not become healthy"
            docker logs --tail 40 "$CONTAINER" 2>&1 || true
            return 1
        fi
        sleep 2
    done
    echo "healthy; asking for a tool call"
    local served
    served=$(curl -fsS -m 10 -H "Authorization: Bearer $API_KEY" "http://127.0.0.1:$port/v1/models" |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
    curl -fsS -m 300 -H "Authorization: Bearer $API_KEY" -H 'content-type: application/json' \
        "http://127.0.0.1:$port/v1/chat/completions" -d @- <<JSON | "$PY" -c '
import json, sys
call = json.load(sys.stdin)["choices"][0]["message"]["tool_calls"][0]["function"]
args = json.loads(call["arguments"])
assert call["name"] == "get_weather" and isinstance(args.get("city"), str), call
print("tool call ok:", call["name"], args)'
{"model": "$served", "max_tokens": 128, "tool_choice": "required",
 "messages": [{"role": "user", "content": "What is the weather in Lisbon?"}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
   "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}
JSON
    docker rm -f "$CONTAINER" >/dev/null
}

cleanup
SERVER_PID=""
if [[ ${SMOKE_IMAGE:-} == skip ]]; then
    printf 'image\tskipped (SMOKE_IMAGE=skip)\t0\n' >>"$STEPS"
elif ! timeout 30 docker info >/dev/null 2>&1; then
    printf 'image\tskipped (no Docker daemon)\t0\n' >>"$STEPS"
    log "no Docker daemon: the GPU image step is skipped"
else
    IMAGE_STARTED=1
    export ENGINE MODEL PORT PY API_KEY START_TIMEOUT_S CONTAINER
    step image 3600 bash -c "$(declare -f image_smoke); image_smoke"
fi

# ---------------------------------------------------------------- 5. summary
# Exits 1 when a bench ran but got no usable answer (its own exit code can be 0 then).
timeout 60 "$PY" - "$RESULTS" <<'PYEOF' | tee "$RESULTS/summary.txt" || FAILED=1
import json, re, sys
from pathlib import Path

res = Path(sys.argv[1])
problems = []
print(f"\n== gpu-smoke summary: {res}")
print((res / "gpu.csv").read_text().strip().splitlines()[-1])
v = res / "versions.txt"
if v.exists():
    print(" ".join(v.read_text().split()))
print("\nstep                 status                      seconds")
for line in (res / "steps.tsv").read_text().splitlines()[1:]:
    name, status, secs = line.split("\t")
    print(f"{name:<20} {status:<27} {secs}")


def load(name):
    p = res / name
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def printed(name, title):
    """The figures as the benchmark printed them (the same table as on CPU)."""
    out = res / f"{name}.out"
    if out.exists():
        lines = [line for line in out.read_text().splitlines() if line.strip()]
        print(f"\n{title} (as `loopstack bench` printed it):")
        print("  " + "\n  ".join(lines[-40:]))


tv = load("tool_validity.json")
if tv and not any(s.get("answered") for arms in tv.get("summary", {}).values() for s in arms.values()):
    problems.append("tool_validity: no request was answered")
printed("tool_validity", "tool-call validity")
cc = load("constraint_cost.json")
if cc and not any(s.get("ok_pairs") for s in cc.get("summary", {}).values()):
    problems.append("constraint_cost: no successful pair")
printed("constraint_cost", "constraint cost (constrained / unconstrained)")
ag = load("agents/result.json")
if ag and not any(lv.get("summary", {}).get("tasks_done") for lv in ag.get("levels", [])):
    problems.append("agents: no task was done")
agents = res / "agents"
if agents.is_dir():
    files = sorted(p.name for p in agents.iterdir())
    print(f"\nagent sweep: {len(files)} files in {agents}: {', '.join(files[:8])}")
    out = res / "agents.out"
    if out.exists():
        print("  " + "\n  ".join(out.read_text().strip().splitlines()[-12:]))
m = res / "metrics.txt"
if m.exists():
    text = m.read_text()

    def total(name):
        return sum(float(x) for x in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    q, h = total("vllm:prefix_cache_queries_total"), total("vllm:prefix_cache_hits_total")
    if q:
        print(f"\nprefix cache hit rate over the run: {h / q:.3f}")
for p in problems:
    print(f"PROBLEM: {p}")
sys.exit(1 if problems else 0)
PYEOF

if ((FAILED)); then
    log "some steps FAILED: see $STEPS"
    exit 1
fi
log "all steps ok in ${TOTAL_S}s after install; results in $RESULTS"
