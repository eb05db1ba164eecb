"""StrategyPolicy under a throttled link: the policy against each candidate strategy held static."""
