"""The service layer: a service starts, stays up and serves what its profile says."""
