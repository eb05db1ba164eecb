"""The Ray actor that runs one worker of a ``kungfu-run --ray`` job as its subprocess.

The worker itself never imports Ray: the actor (a Ray worker process on the
node that Ray placed it on) picks a free port there, reports where it is,
and then runs the launcher's command with the launcher's environment as a
plain subprocess. The actor holds the subprocess's output until the
launcher fetches it (:meth:`WorkerActor.progress`), so the launcher relays
it like a local worker's. All methods return at once, and all run on the
actor's one execution thread: the thread that forked the subprocess lives
as long as the actor, so the subprocess's parent-death signal fires only
when the actor dies (killed, or its node gone) — then the worker dies too.

This module does not import Ray; :mod:`kungfu_tf.run.providers.ray_provider` makes the
class a Ray actor.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence

from kungfu_tf.run.providers.worker_process import popen_worker

STDOUT, STDERR = 1, 2
# Output held for the launcher beyond which the oldest is dropped (a
# launcher that stopped fetching must not fill the node's memory).
MAX_HELD_BYTES = 8 << 20


class WorkerActor:
    """One worker's subprocess on a Ray node.

    Example (what :class:`~kungfu_tf.run.providers.ray_provider.RayActors` does)::

        actor = ray.remote(WorkerActor).options(...).remote()
        node_id, host, port = ray.get(actor.address.remote())
        ray.get(actor.start.remote(command, env))
        chunks, returncode = ray.get(actor.progress.remote())
    """

    def __init__(self) -> None:
        """Nothing runs until :meth:`start`."""
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._held: list[tuple[int, bytes]] = []
        self._held_bytes = 0
        self._readers: list[threading.Thread] = []

    def address(self) -> tuple[str, str, int]:
        """``(node id, host, port)``: this node as Ray names it, and a port free on it right now.

        Fake nodes of Ray's test clusters share one IP: the port (bound by
        the kernel, so distinct on the machine) and the node id tell them apart.
        """
        import ray  # the actor's process runs Ray anyway; the worker never does

        node_id = ray.get_runtime_context().get_node_id()
        host = ray.util.get_node_ip_address()
        family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        return node_id, host, port

    def start(self, command: Sequence[str], env: Mapping[str, str]) -> int:
        """Run ``command`` with exactly ``env``; its pid.

        Raises:
            OSError: ``command`` cannot be run on this node.
        """
        # Forked from the actor's only execution thread (see the module
        # docstring); the reader threads start after the fork.
        self._proc = popen_worker(command, env)
        for stream, pipe in ((STDOUT, self._proc.stdout), (STDERR, self._proc.stderr)):
            t = threading.Thread(target=self._read, args=(stream, pipe), daemon=True)
            t.start()
            self._readers.append(t)
        return self._proc.pid

    def progress(self) -> tuple[list[tuple[int, bytes]], int | None]:
        """Output lines since the last call (stream, line), and the return code (None while it runs).

        Once the return code is given, the output returned with it is all
        there is (the readers reached EOF, or waited a bounded time for a
        grandchild that holds the pipes).
        """
        assert self._proc is not None
        returncode = self._proc.poll()
        if returncode is not None:
            for t in self._readers:
                t.join(2.0)
        with self._lock:
            chunks, self._held, self._held_bytes = self._held, [], 0
        return chunks, returncode

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group while its leader is unreaped."""
        if self._proc is None or self._proc.poll() is not None:
            return
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill_group(self) -> None:
        """SIGKILL the group even after the leader exited (grandchildren)."""
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _read(self, stream: int, pipe) -> None:
        with pipe:
            for line in iter(pipe.readline, b""):
                with self._lock:
                    self._held.append((stream, line))
                    self._held_bytes += len(line)
                    while self._held_bytes > MAX_HELD_BYTES and len(self._held) > 1:
                        self._held_bytes -= len(self._held.pop(0)[1])
