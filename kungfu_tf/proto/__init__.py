"""Generated protobuf/gRPC stubs for proto/*.proto.

The modules in this package (``config_pb2``, ``config_pb2_grpc``, ...) are
generated with grpc_tools.protoc at build time by setup.py (``make install``,
``pip install .`` or ``python setup.py build_ext --inplace``) and are not
committed. Import them as ``from kungfu_tf.proto import config_pb2``.
"""
