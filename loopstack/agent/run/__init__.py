"""The loop and the steps it calls: answer, compaction, guard, grounding, memory, plan, team."""
