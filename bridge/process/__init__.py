"""OS processes: pids, pipes, signals and environments. Knows bytes, never dialects."""
