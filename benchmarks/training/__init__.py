"""Training throughput: ours, MultiWorkerMirroredStrategy, a no-communication ceiling."""
