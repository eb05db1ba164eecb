"""gRPC errors as the launcher prints them.

Example:
    >>> import grpc
    >>> from kungfu_tf.run.control.config_server import ServerNotAuthenticatedError
    >>> rpc_error_text(ServerNotAuthenticatedError("h:1", "/kungfu.ConfigService/GetJobState"))
    'UNAUTHENTICATED: config server at h:1 did not prove it holds the job secret (/kungfu.ConfigService/GetJobState)'
"""

import grpc


def rpc_error_text(error: grpc.RpcError) -> str:
    """``CODE: details`` of a failed call (``str()`` of one is a wall of text)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    return f"{code.name if code is not None else 'ERROR'}: {details}"
