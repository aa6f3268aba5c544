"""The layers' checks and hooks, one package per layer (gpu/ holds host, env and kernels)."""
