"""Reports: pytest-html integration, plots, fleet summaries."""
