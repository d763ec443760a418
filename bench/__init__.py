"""agent-bridge benchmarks: ratios against websocketd and the bare pipe, measured in the
same run (docs/benchmarks.md). Run ``python -m bench`` from the repository root."""
