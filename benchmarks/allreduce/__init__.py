"""All-reduce latency and bandwidth: ours, MultiWorkerMirroredStrategy, Open MPI, a raw transport."""
