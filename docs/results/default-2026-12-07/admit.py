"""Claude Code's captured first request, sent as it is (streamed) to the served model: the
answer's status and its first event say whether it was admitted; then the client goes away
(the generation is aborted: only admission is measured here, not the minutes of prefill)."""
import json, sys, time
import httpx

base, path = sys.argv[1], sys.argv[2]
body = json.load(open(path)); body["model"] = "claude-sonnet-4-5"  # as Claude Code names it
h = {"Authorization": "Bearer test-key-123", "anthropic-version": "2023-06-01"}
with httpx.Client(base_url=base, headers=h, timeout=600) as c:
    count = c.post("/v1/messages/count_tokens", json={k: v for k, v in body.items()
                   if k in ("model", "messages", "system", "tools", "tool_choice")})
    print("count_tokens", count.status_code, count.text[:200])
    t0 = time.monotonic()
    with c.stream("POST", "/v1/messages", json=body) as r:
        print("status", r.status_code, "clamped", r.headers.get("x-loopstack-max-tokens-clamped"))
        for line in r.iter_lines():
            if line.startswith("data:"):
                print("first event after %.1f s:" % (time.monotonic() - t0), line[:300])
                break
