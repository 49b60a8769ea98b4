"""Calls one CSI Identity method on a unix socket with Python's grpcio, the
way a grpcio client does by default, and prints one JSON line: the status
code's name, the details, and the response bytes (hex) on success.

    grpcio_call.py SOCKET METHOD [AUTHORITY]

Without AUTHORITY grpcio picks its own :authority for a unix target (the
socket path, percent-encoded); with it, the channel option
grpc.default_authority is set to AUTHORITY. Used by the native test
`grpc::tests::grpcio_clients_*` (src/grpc/mod.rs).
"""
import json
import sys

import grpc


def main():
    socket, method = sys.argv[1], sys.argv[2]
    options = []
    if len(sys.argv) > 3:
        options.append(("grpc.default_authority", sys.argv[3]))
    with grpc.insecure_channel("unix://" + socket, options=options) as channel:
        call = channel.unary_unary(method)
        try:
            # Both requests used here are empty messages: zero bytes.
            reply = call(b"", timeout=20)
            out = {"code": "OK", "details": "", "reply": reply.hex()}
        except grpc.RpcError as e:
            out = {"code": e.code().name, "details": e.details() or "", "reply": ""}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
