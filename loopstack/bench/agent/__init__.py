"""The agent loop's own cost (`loopstack bench agent overhead`): a scripted model and instant
tools, so what is measured is the host work per step, not the model."""
