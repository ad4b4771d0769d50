"""config.json architecture fields of shipped models, each citing its model card."""
