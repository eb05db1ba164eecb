"""AutoscalingPolicy against static sizes, StragglerPolicy against a slowed worker (CPU quotas, root)."""
