"""How well the cost model alone ranks the hand builders the strategy benchmark measured."""
