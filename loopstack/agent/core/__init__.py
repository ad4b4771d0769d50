"""The run's state and settings and what they are built from: context, selection, cost."""
