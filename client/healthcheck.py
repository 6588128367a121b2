"""`python -m seqserve.client.healthcheck [host:port] [--ca-file ...]`: exit 0 when the server reports SERVING.

A container probe needs no grpcurl: this asks the standard grpc.health.v1 service, exactly as load balancers do.
It accepts the client connection flags (TLS CA, client certificate, token file; token also from SEQSERVE_TOKEN).
"""
from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from seqserve.client.channel import Connection, add_connection_arguments, connection_from_args
from seqserve.client.flags import DEFAULT_ADDRESS


def check(address: str, service: str = "", timeout: float = 3.0, connection: Connection = Connection()) -> str:
    """The health status name of `service` ("" = the whole server), or the gRPC error code name."""
    with connection.channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                               timeout=timeout)
        except grpc.RpcError as err:
            return err.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqserve.client.healthcheck", description=__doc__)
    parser.add_argument("address", nargs="?", default=DEFAULT_ADDRESS, help="host:port of the gRPC server")
    parser.add_argument("--service", default="", help='service to ask about ("" = the whole server)')
    parser.add_argument("--timeout", type=float, default=3.0, help="deadline in seconds")
    add_connection_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    status = check(args.address, args.service, args.timeout, connection_from_args(args))
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
