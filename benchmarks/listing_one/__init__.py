"""KungFu's Listing 1: GNSResizePolicy grows an elastic job 1 -> 4 workers."""
