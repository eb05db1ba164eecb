"""The job's state in etcd (``kungfu-run --config-store etcd://h1:2379,...``): a JobStore that survives any host.

Keys, under ``/kungfu/<job id>/``, every value sealed with the job secret
(signed_record.py; a value that does not open is ignored and its key named
in a log line, once):

* ``state/<index>``: the job's record (JobStateMachine.to_record), one key
  per write, index counting up. A write is one transaction: "if no key
  under ``state/`` changed since the revision I read, put ``state/<next>``
  and delete the records older than the last few": a compare-and-set on
  the whole state, which a forged or stray key cannot block (the next write
  simply goes above it).
* ``launchers/<host>``: one per running launcher, under that launcher's
  lease (``LAUNCHER_LEASE_SECONDS``, renewed every second). A launcher that
  dies stops renewing: its key, and with it its claim on its host's
  members and joiners, expires.
* ``duties/<name>``: who does a job-wide duty (placing joiners, answering
  for hosts whose launcher is gone): the first launcher to create the key,
  under its lease; when it dies the key expires and another takes it.

Example::

    store = EtcdJobStore(EtcdClient(["127.0.0.1:2379"]), job_id="j", secret="s" * 64)
    record, version = store.load()
    store.compare_and_set(version, {"n": 1})
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kungfu_tf.proto import etcd_rpc_pb2 as pb
from kungfu_tf.run.control.etcd_client import EtcdClient, EtcdError, prefix_end
from kungfu_tf.run.control.job_store import StoreUnavailableError
from kungfu_tf.run.control.signed_record import (
    UnauthenticRecordError,
    open_record,
    seal_record,
)

__all__ = ["LAUNCHER_LEASE_SECONDS", "EtcdJobStore"]

# A dead launcher's claims expire this long after its last renewal; it
# renews every RENEW_SECONDS, so a busy host has several chances meanwhile.
LAUNCHER_LEASE_SECONDS = 5
RENEW_SECONDS = 1.0
# State records kept below the newest (older ones are deleted by the write
# that makes them stale); a reader that finds the newest forged falls back on them.
KEEP_RECORDS = 4
_INDEX_DIGITS = 20


@dataclass(frozen=True)
class _Version:
    revision: int  # the etcd revision the record was read at
    next_index: int  # the key index the next write takes


class EtcdJobStore:
    """One job's keys in etcd (see the module docstring).

    Args:
      client: the etcd cluster.
      job_id, secret: the job's id (the key prefix) and secret (the records' seal).
      log: where a line naming an ignored (unauthentic) record goes.
    """

    def __init__(
        self,
        client: EtcdClient,
        *,
        job_id: str,
        secret: str,
        log: Callable[[str], None] = print,
        lease_seconds: int = LAUNCHER_LEASE_SECONDS,
    ):
        self._etcd = client
        self._job_id = job_id
        self._secret = secret
        self._log = log
        self._lease_seconds = lease_seconds
        self._prefix = f"/kungfu/{job_id}/"
        self._state_prefix = (self._prefix + "state/").encode()
        self._logged: set[tuple[bytes, int]] = set()
        self._closed = threading.Event()
        self._watches: list = []
        self._lease = 0
        self._host = ""
        self._renewer: threading.Thread | None = None
        self._renew_problem = ""
        # State records newer than the one the last load() answered that did
        # not open (all of them when it answered None).
        self.ignored_records = 0
        self._lock = threading.Lock()

    def describe(self) -> str:
        return "etcd://" + ",".join(self._etcd.endpoints)

    # ------------------------------------------------------------- records

    def _open(self, kv: pb.KeyValue) -> dict | None:
        """The record in ``kv``, or None (logged once) if it does not open."""
        key = kv.key.decode(errors="replace")
        try:
            return open_record(self._secret, self._job_id, key, kv.value)
        except UnauthenticRecordError as e:
            if (kv.key, kv.mod_revision) not in self._logged:
                self._logged.add((kv.key, kv.mod_revision))
                self._log(f"ignoring etcd record {key} (revision {kv.mod_revision}): {e}")
            return None

    def _seal(self, key: bytes, data: dict) -> bytes:
        return seal_record(self._secret, self._job_id, key.decode(), data)

    def _state_key(self, index: int) -> bytes:
        return self._state_prefix + str(index).zfill(_INDEX_DIGITS).encode()

    def load(self) -> tuple[dict | None, object]:
        try:
            kvs, revision = self._etcd.range(self._state_prefix, prefix_end(self._state_prefix), descending=True)
        except EtcdError as e:
            raise StoreUnavailableError(str(e)) from None
        next_index = 1
        if kvs:
            try:
                next_index = int(kvs[0].key[len(self._state_prefix) :]) + 1
            except ValueError:
                next_index = len(kvs) + 10**9  # a stray key with no number: write well above
        for ignored, kv in enumerate(kvs):
            record = self._open(kv)
            if record is not None:
                self.ignored_records = ignored
                return record, _Version(revision, next_index)
        self.ignored_records = len(kvs)
        return None, _Version(revision, next_index)

    def compare_and_set(self, version: object, record: dict) -> bool:
        assert isinstance(version, _Version)
        key = self._state_key(version.next_index)
        unchanged = pb.Compare(
            key=self._state_prefix,
            range_end=prefix_end(self._state_prefix),
            target=pb.Compare.MOD,
            result=pb.Compare.LESS,
            mod_revision=version.revision + 1,
        )
        put = pb.RequestOp(request_put=pb.PutRequest(key=key, value=self._seal(key, record)))
        prune = pb.RequestOp(
            request_delete_range=pb.DeleteRangeRequest(
                key=self._state_prefix, range_end=self._state_key(max(version.next_index - KEEP_RECORDS, 0))
            )
        )
        try:
            return self._etcd.txn([unchanged], [put, prune]).succeeded
        except EtcdError as e:
            raise StoreUnavailableError(str(e)) from None

    def changes(self) -> Iterator[None]:
        try:
            _, revision = self._etcd.range(self._state_prefix, prefix_end(self._state_prefix), limit=1)
        except EtcdError:
            revision = 0
        watch = self._etcd.watch(self._state_prefix, prefix_end(self._state_prefix), revision + 1)
        with self._lock:
            self._watches.append(watch)
        if self._closed.is_set():
            watch.cancel()
        for _ in watch:
            yield None

    # ------------------------------------------------------------- leases

    def register_launcher(self, host: str) -> None:
        """Put ``launchers/<host>`` under a lease of this launcher, renewed until :meth:`close`.

        Raises:
            StoreUnavailableError: etcd cannot grant the lease now.
        """
        self._host = host
        try:
            self._grant()
        except EtcdError as e:
            raise StoreUnavailableError(str(e)) from None
        self._renewer = threading.Thread(target=self._renew, name="kungfu-etcd-lease", daemon=True)
        self._renewer.start()

    def _grant(self) -> None:
        lease = self._etcd.grant_lease(self._lease_seconds)
        key = (self._prefix + "launchers/" + self._host).encode()
        self._etcd.put(key, self._seal(key, {"host": self._host}), lease=lease)
        self._lease = lease

    def _renew(self) -> None:
        while not self._closed.wait(RENEW_SECONDS):
            try:
                if self._etcd.keep_alive(self._lease) <= 0:
                    # Expired (etcd unreachable for longer than the TTL): our
                    # claims are gone; register anew (duties are claimed again).
                    self._log(f"the etcd lease of this launcher expired; registering {self._host} again")
                    self._grant()
            except EtcdError as e:
                # The next round retries (the lease outlives several); say why once.
                if not self._renew_problem:
                    self._renew_problem = str(e)
                    self._log(f"cannot renew this launcher's etcd lease (retrying every {RENEW_SECONDS:g} s): {e}")
                continue
            self._renew_problem = ""

    def live_launchers(self) -> set[str]:
        """Hosts whose launcher's lease is alive (records that do not open are ignored).

        Raises:
            StoreUnavailableError: etcd cannot answer now.
        """
        prefix = (self._prefix + "launchers/").encode()
        try:
            kvs, _ = self._etcd.range(prefix, prefix_end(prefix))
        except EtcdError as e:
            raise StoreUnavailableError(str(e)) from None
        hosts = set()
        for kv in kvs:
            record = self._open(kv)
            if record is not None and kv.key == prefix + str(record.get("host", "")).encode():
                hosts.add(record["host"])
        return hosts

    def hold_duty(self, name: str) -> bool:
        """Whether this launcher holds ``duties/<name>`` (claiming it if nobody does).

        Raises:
            StoreUnavailableError: etcd cannot answer now.
        """
        key = (self._prefix + "duties/" + name).encode()
        try:
            if self._etcd.put_if_absent(key, self._seal(key, {"host": self._host, "lease": self._lease}), lease=self._lease):
                return True
            kvs, _ = self._etcd.range(key)
        except EtcdError as e:
            raise StoreUnavailableError(str(e)) from None
        if not kvs:
            return False  # it expired just now: the next call claims it
        record = self._open(kvs[0])
        if record is None:
            # A forged holder: nobody of the job holds it. It expires only if
            # it was put under a lease; delete it so the duty is not blocked.
            try:
                self._etcd.delete(key)
            except EtcdError:
                pass
            return False
        return record.get("lease") == self._lease and kvs[0].lease == self._lease

    def close(self) -> None:
        """Stops renewing (revoking the lease: this launcher's claims end now) and ends every watch."""
        self._closed.set()
        with self._lock:
            watches, self._watches = self._watches, []
        for w in watches:
            w.cancel()
        if self._renewer is not None:
            self._renewer.join()
        if self._lease:
            try:
                self._etcd.revoke_lease(self._lease)
            except EtcdError:
                pass
