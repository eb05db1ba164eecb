"""Per-frame authentication: the all-reduce with and without it (run.py), its cost per MiB (cost.cc)."""
