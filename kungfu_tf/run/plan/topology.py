"""Names of the collective-communication topologies the runtime accepts."""

from kungfu_tf.run.errors import LaunchError

TOPOLOGIES: tuple[str, ...] = (
    "STAR",
    "RING",
    "BINARY_TREE",
    "BINARY_TREE_STAR",
    "CLIQUE",
    "AUTO",
)
DEFAULT_TOPOLOGY = "AUTO"


def normalize_topology(name: str) -> str:
    """Return ``name`` in the upper-case spelling the runtime expects.

    Raises:
        LaunchError: if ``name`` is not one of :data:`TOPOLOGIES`
            (compared case-insensitively).
    """
    upper = name.strip().upper()
    if upper not in TOPOLOGIES:
        raise LaunchError(
            f"unknown topology {name!r}; choose one of {', '.join(TOPOLOGIES)}"
        )
    return upper
