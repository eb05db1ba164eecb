"""Static topology against AdaptiveTopologyPolicy under link contention, two emulated hosts."""
