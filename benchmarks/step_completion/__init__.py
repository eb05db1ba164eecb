"""What a step completed on every rank costs under parameter servers (StrategyPlan._completed_everywhere)."""
