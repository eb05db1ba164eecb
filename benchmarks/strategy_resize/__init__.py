"""What a membership change costs a strategy-driven job: re-building the strategy and re-tracing the step."""
