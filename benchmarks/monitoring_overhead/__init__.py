"""Training throughput with gradient-noise / gradient-variance monitoring against none."""
