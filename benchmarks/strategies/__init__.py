"""Strategy builders x models, one host and two emulated hosts."""
