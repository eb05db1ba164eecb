"""Idle time of elastic shrink / grow / crash against checkpoint-restart."""
