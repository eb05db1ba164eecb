"""What etcd's TLS and authentication cost a ``--config-store`` client (see run.py)."""
