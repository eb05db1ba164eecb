"""Plays an elastic worker for the launcher tests with ConfigClient alone (no TF).

Usage: ``elastic_fake_worker.py MODE [ARG]``; every process first checks its
``KUNGFU_*`` variables with ``read_worker_env`` and prints its role. A
joiner (``KUNGFU_JOINER=1``) always reports READY and waits to be admitted
(or rejected: it then exits 1, as the real one does).

MODE (what the initial members do):
  grow N       rank 0 sets the signature and asks for N workers; every
               member (joiners too) exits 0 once the cluster has N.
  grow-staggered N:S
               as grow, but the joiners warm up at different times: each
               waits S seconds times its position among the joiners (in the
               order they were placed) before it reports READY; with S
               "after-first", each but the first instead waits until the
               first was admitted (cluster v2), however long that took.
  crash R      rank 0 sets the signature, rank R SIGKILLs itself; the others
               (and the replacement) exit 0 once the cluster is whole again
               at version 3 (v2 without R, v3 with its replacement).
  hold-replaced
               rank 0 sets the signature, prints "signature set" and
               sleeps (the test SIGKILLs its launcher; it dies with it);
               the others (and the replacement) exit 0 once the cluster is
               whole again at version 3.
  absent-first DIR
               rank 1 sets the signature (the test starts rank 0's launcher
               only after rank 0 was replaced); the others (and the
               replacement) exit 0 once the cluster is whole again at
               version 3 and DIR/go exists (the job must not end before the
               late launcher has come).
  grow-on-signal DIR:N
               rank 0 sets the signature, prints "signature set", and once
               DIR/go exists asks for N workers, retrying every 0.5 s while
               refused (printing "refused: CODE: details" once per code);
               every member exits 0 once the cluster has N.
  die R@V,...  rank R SIGKILLs itself once the cluster reaches version V;
               the others wait (the launcher is expected to stop them).
  shrink N     rank 0 commits the first N members (PutCluster); a member
               left out prints "detached" and exits 0, the rest exit 0.
  reject N     rank 0 sets the signature "w (2,) float32", asks for one more
               worker, and exits 0 once N joiners (whose signature differs)
               were rejected and no further joiner came for 1 s.
  finish-crash DIR
               rank 0 writes its pid to DIR/pid and exits 0 (it finished);
               rank 1 SIGKILLs itself once rank 0 was reaped by the launcher.
  evict H      rank 0 sets the signature; a member on host H exits 0 when it
               is left out ("detached"); the others exit 0 once the cluster
               has no worker of H and is whole again (a replacement joined).
  finish-apart R:S
               rank R exits 0 at once (it finished); the others wait until
               the job state lists it as finished, then S seconds more (the
               config service must still answer then), and exit 0.
  stuck N      rank 0 sets the signature and asks for one more worker; its
               joiners never report READY (a warm-up that hangs); rank 0
               exits 0 once N joiners came and went and no further joiner
               came for 1 s.
  stuck-deaf N as stuck, but the joiners also ignore SIGTERM (only the
               launcher's SIGKILL, after its grace, stops them).
  lose-grow-shrink N
               (N initial members) every worker, joiners too, waits until a
               member was lost and replaced (v3 with N workers); the first
               member then asks for N+1 and, once v4 has them, commits the
               first N (v5): the one left out prints "detached"; all exit 0.
Every worker also prints whether Ray is imported in it ("ray imported: False").
"""

import os
import signal
import sys
import time
from pathlib import Path

if sys.argv[1:2] == ["stuck-deaf"] and os.environ.get("KUNGFU_JOINER") == "1":
    # Before the slow imports below: the launcher may stop it any time.
    signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))

import grpc

from kungfu_tf.run.control.config_server import ConfigClient, cluster_peers, peer_string
from kungfu_tf.run.worker_env.worker_env import read_worker_env

SIGNATURE = "w (2,) float32"
OTHER_SIGNATURE = "w (3,) float32"
DEADLINE = time.monotonic() + 60

env = read_worker_env(os.environ)
client = ConfigClient(env.config_server, secret=env.secret, job_id=os.environ["KUNGFU_JOB_ID"])
me = env.self_address
mode, arg = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
print(f"{'joiner' if env.joiner else 'member'} {me} v{env.cluster_version} elastic={env.elastic}", flush=True)
print(f"ray imported: {'ray' in sys.modules}", flush=True)


def members(state):
    return cluster_peers(state.cluster)


def wait_until(predicate):
    state = client.get_job_state()
    while not predicate(state):
        if time.monotonic() > DEADLINE:
            print(f"timed out in state {state}", flush=True)
            sys.exit(3)
        state = client.wait_job_state(state.state_version, 1.0)
    return state


def rejected(state):
    return next((j.reason for j in state.joiners if j.state == j.REJECTED and cluster_peers_of(j) == me), None)


def cluster_peers_of(joiner):
    return f"{joiner.peer.host}:{joiner.peer.port}"


def lose_grow_shrink(n):
    wait_until(lambda s: s.cluster.version >= 3 and len(members(s)) >= n)
    state = client.get_job_state()
    if members(state)[0] == me and state.cluster.version == 3:
        client.request_size(n + 1)
    # A worker admitted at v4 may read v5 first (the shrink follows at once).
    state = wait_until(lambda s: s.cluster.version >= 5 or (s.cluster.version == 4 and len(members(s)) == n + 1))
    if members(state)[0] == me and state.cluster.version == 4:
        cluster = client.get_cluster()
        del cluster.workers[n:]
        cluster.version += 1
        client.put_cluster(cluster)
    state = wait_until(lambda s: s.cluster.version >= 5)
    print("detached" if me not in members(state) else f"member of v{state.cluster.version}", flush=True)
    sys.exit(0)


def die():
    print("killing myself", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if env.joiner and mode in ("stuck", "stuck-deaf"):
    print("warming up for ever", flush=True)
    time.sleep(60)
    sys.exit(3)
if env.joiner and mode == "grow-staggered":
    placed = [cluster_peers_of(j) for j in client.get_job_state().joiners]
    stagger = arg.split(":")[1]
    if stagger == "after-first":
        if placed.index(me) > 0:
            wait_until(lambda s: s.cluster.version >= 2)
    else:
        time.sleep(float(stagger) * placed.index(me))
    mode, arg = "grow", arg.split(":")[0]
if env.joiner:
    client.joiner_ready(me, OTHER_SIGNATURE if mode == "reject" else SIGNATURE)
    def admitted_and_left(s):
        # lose-grow-shrink: admitted at v4 and left out of v5 at once, this joiner may read v5 first
        # (admitted joiners leave the joiner list): it was a member, and is detached now.
        return mode == "lose-grow-shrink" and me not in members(s) and all(cluster_peers_of(j) != me for j in s.joiners)

    state = wait_until(lambda s: me in members(s) or rejected(s) or admitted_and_left(s))
    if admitted_and_left(state):
        print("detached", flush=True)
        sys.exit(0)
    if me not in members(state):
        print(f"rejected: {rejected(state)}", flush=True)
        sys.exit(1)
    print(f"admitted at v{state.cluster.version} as rank {members(state).index(me)} of {len(members(state))}", flush=True)
    if mode == "grow":
        wait_until(lambda s: len(members(s)) >= int(arg))
    if mode == "lose-grow-shrink":
        lose_grow_shrink(int(arg))
    sys.exit(0)

if mode == "grow-staggered":
    mode, arg = "grow", arg.split(":")[0]
if mode == "grow":
    if env.rank == 0:
        client.set_signature(SIGNATURE)
        client.request_size(int(arg))
    state = wait_until(lambda s: len(members(s)) >= int(arg))
    print(f"saw {len(members(state))} workers at v{state.cluster.version}", flush=True)
elif mode == "lose-grow-shrink":
    if env.rank == 0:
        client.set_signature(SIGNATURE)
    lose_grow_shrink(int(arg))
elif mode == "crash":
    if env.rank == 0:
        client.set_signature(SIGNATURE)
    if env.rank == int(arg):
        wait_until(lambda s: s.signature)
        die()
    state = wait_until(lambda s: s.cluster.version >= 3 and len(members(s)) == env.size)
    print(f"saw {len(members(state))} workers at v{state.cluster.version}", flush=True)
elif mode == "hold-replaced":
    # Rank 0 holds on until its launcher is SIGKILLed (it dies with it);
    # the others exit 0 once the cluster is whole again at version 3.
    if env.rank == 0:
        client.set_signature(SIGNATURE)
        print("signature set", flush=True)
        time.sleep(60)
        sys.exit(3)
    state = wait_until(lambda s: s.cluster.version >= 3 and len(members(s)) == env.size)
    print(f"saw {len(members(state))} workers at v{state.cluster.version}", flush=True)
elif mode == "absent-first":
    if env.rank == 1:
        client.set_signature(SIGNATURE)
    state = wait_until(lambda s: s.cluster.version >= 3 and len(members(s)) == env.size)
    print(f"saw {len(members(state))} workers at v{state.cluster.version}", flush=True)
    while not os.path.exists(os.path.join(arg, "go")):
        time.sleep(0.1)
elif mode == "grow-on-signal":
    # Rank 0 asks for N workers once DIR/go exists, retrying while the config
    # service refuses (its store without quorum): each new refusal is printed.
    directory, n = arg.split(":")
    if env.rank == 0:
        client.set_signature(SIGNATURE)
        print("signature set", flush=True)
        while not os.path.exists(os.path.join(directory, "go")):
            time.sleep(0.1)
        said = set()
        while True:
            try:
                client.request_size(int(n))
                break
            except grpc.RpcError as e:
                if e.code().name not in said:
                    said.add(e.code().name)
                    print(f"refused: {e.code().name}: {e.details()}", flush=True)
                time.sleep(0.5)
    state = wait_until(lambda s: len(members(s)) >= int(n))
    print(f"saw {len(members(state))} workers at v{state.cluster.version}", flush=True)
elif mode == "die":
    plan = dict(item.split("@") for item in arg.split(","))
    if str(env.rank) in plan:
        wait_until(lambda s: s.cluster.version >= int(plan[str(env.rank)]))
        die()
    time.sleep(600)  # longer than any test waits: only the launcher ends it in time
elif mode == "shrink":
    if env.rank == 0:
        cluster = client.get_cluster()
        del cluster.workers[int(arg) :]
        cluster.version += 1
        client.put_cluster(cluster)
    state = wait_until(lambda s: s.cluster.version >= 2)
    print("detached" if me not in members(state) else f"member of v{state.cluster.version}", flush=True)
elif mode == "reject":
    if env.rank == 0:
        client.set_signature(SIGNATURE)
        client.request_size(env.size + 1)
    seen = set()

    def enough_rejected(state):
        seen.update(cluster_peers_of(j) for j in state.joiners if j.state == j.REJECTED)
        return len(seen) >= int(arg)

    wait_until(enough_rejected)
    state = wait_until(lambda s: not s.joiners)  # rejected joiners leave the list (within the 60 s deadline)
    print(f"saw {len(seen)} rejected joiners; {len(state.joiners)} joiners now", flush=True)
elif mode == "finish-crash":
    pid_file = os.path.join(arg, "pid")
    if env.rank == 0:
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pid_file + ".tmp", pid_file)
        sys.exit(0)
    while not os.path.exists(pid_file) or os.path.exists(f"/proc/{Path(pid_file).read_text()}"):
        if time.monotonic() > DEADLINE:
            sys.exit(3)
        time.sleep(0.02)
    die()
elif mode == "evict":
    if env.rank == 0:
        client.set_signature(SIGNATURE)
    state = wait_until(lambda s: not any(w.host == arg for w in s.cluster.workers))
    if me not in members(state):
        print("detached", flush=True)
        sys.exit(0)
    state = wait_until(lambda s: len(members(s)) == env.size and not any(w.host == arg for w in s.cluster.workers))
    print(f"member of v{state.cluster.version} with {len(members(state))} workers", flush=True)
elif mode == "finish-apart":
    first, pause = arg.split(":")
    if env.rank == int(first):
        sys.exit(0)
    state = wait_until(lambda s: len(s.finished) > 0)
    print(f"saw {', '.join(map(peer_string, state.finished))} finished at v{state.cluster.version}", flush=True)
    time.sleep(float(pause))
    client.get_job_state()
elif mode in ("stuck", "stuck-deaf"):
    if env.rank == 0:
        client.set_signature(SIGNATURE)
        client.request_size(env.size + 1)
    seen = set()

    def enough_came_and_went(state):
        current = {cluster_peers_of(j) for j in state.joiners}
        seen.update(current)
        return len(seen) >= int(arg) and not current

    state = wait_until(enough_came_and_went)
    time.sleep(1)
    state = client.get_job_state()
    print(f"saw {len(seen)} joiners come and go; {len(state.joiners)} joiners now", flush=True)
else:
    sys.exit(f"unknown mode {mode!r}")
