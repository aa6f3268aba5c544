"""The generation layer: the full sampling path, judged by real requests."""
