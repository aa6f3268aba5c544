"""Host access: the transport (testinfra with deadlines), the host lock, probes run on the host."""
