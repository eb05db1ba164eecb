"""Recovery times of an elastic job whose state is in etcd (``kungfu-run --config-store``)."""
