"""`python -m seqserve.client.services [host:port]`: every method the server offers, read through gRPC reflection
(what `grpcurl list` shows, without grpcurl), one `package.Service/Method` per line.

It accepts the client connection flags (TLS CA, client certificate, token file; token also from SEQSERVE_TOKEN);
exit 1 with the status when the server cannot be reached or serves no reflection (`--no-reflection`).
"""
from __future__ import annotations

import argparse
import sys

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from seqserve.client.channel import Connection, add_connection_arguments, connection_from_args
from seqserve.client.flags import DEFAULT_ADDRESS


def methods(address: str, connection: Connection = Connection()) -> list[str]:
    """`package.Service/Method` for every method of every service the server lists, sorted."""
    with connection.channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = DescriptorPool(database)
        return sorted(f"{name}/{m.name}" for name in database.get_services()
                      for m in pool.FindServiceByName(name).methods)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqserve.client.services", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("address", nargs="?", default=DEFAULT_ADDRESS, help="host:port of the gRPC server "
                                                                            "(default %(default)s)")
    add_connection_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        listed = methods(args.address, connection_from_args(args))
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    print("\n".join(listed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
