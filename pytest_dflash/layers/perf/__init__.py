"""The perf layer: load runs judged against floors, baselines and peers."""
