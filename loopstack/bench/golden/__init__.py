"""The agent golden task set: deterministic local tools, a checker per task, and a runner that
drives `loopstack agent run --json` as a subprocess (`loopstack bench golden run`)."""
