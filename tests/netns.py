"""Two "hosts" for multi-host tests: benchmarks/harness/netns.py's namespaces, cleaned up after the test.

If the namespaces cannot be created for lack of privileges (EPERM/EACCES
from ``ip netns add``), the calling test is skipped with ip's message, but
only when not running as root: root (as CI runs) can create them, so there
the refusal fails the test instead of silently skipping it. Any other failure
fails the test.
"""

from __future__ import annotations

import os

from benchmarks.harness.netns import (
    NamespaceCommandFailed,
    NamespacesUnavailable,
    TwoHosts,
    create_two_hosts,
)

__all__ = ["TwoHosts", "make_two_hosts"]


def make_two_hosts(request, prefix: str, tag: str) -> TwoHosts:
    """``create_two_hosts`` for a pytest test: destroyed afterwards; skipped
    without privileges, except as root (CI), where it fails."""
    import pytest

    try:
        hosts = create_two_hosts(prefix, tag)
    except NamespacesUnavailable as e:
        if os.geteuid() == 0:
            pytest.fail(f"{e} (running as root, as CI does: a skip here would hide the multi-host tests)")
        pytest.skip(str(e))
    except NamespaceCommandFailed as e:
        pytest.fail(str(e))
    request.addfinalizer(hosts.destroy)
    return hosts
