"""GNSBatchSizePolicy against a static small and large batch: time to accuracy."""
