"""AUTO's probe across a slow link: its cost, and whether it picks the fastest topology (run.py)."""
