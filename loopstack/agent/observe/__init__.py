"""What a run leaves to read: the JSONL trace, the start line's explanation, exit code, hand-off."""
