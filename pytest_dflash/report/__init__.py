"""Reports: per-host verdicts and the gate, progress lines, pytest-html extras, plots, the CI job summary."""
