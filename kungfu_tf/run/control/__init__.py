"""The elastic control plane: the versioned cluster and the service that holds it.

:mod:`.job_state` is the one state machine (no gRPC); :mod:`.config_server`
serves it over gRPC (server and client), :mod:`.config_auth` proves both ends
hold the job secret, :mod:`.job_watcher` follows it with long polls.
:mod:`.peer_string`, :mod:`.rpc_errors` and :mod:`.membership_change` say how
peers, failed calls and committed versions are written.

Used by the launcher's supervisors and by the workers' elastic ops
(``kungfu_tf.ops``); imports nothing else of ``kungfu_tf.run``.
"""
