"""What several experiments share: process groups (proc), timing and result lines (timing), units, CLI
parsing (cli), CPU load (load), machine metadata (meta), two emulated hosts (hosts), the augmented digits
set and its MLP (digits_augmented, digits_mlp)."""
