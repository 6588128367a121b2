"""TLS on the gRPC port from PEM files, with optional mutual TLS (client certificates signed by a given CA)."""
from __future__ import annotations

from pathlib import Path

import grpc


def server_credentials(cert_file: Path, key_file: Path, client_ca_file: Path | None = None):
    """Credentials for server.add_secure_port; with client_ca_file every client must present a certificate."""
    chain = [(Path(key_file).read_bytes(), Path(cert_file).read_bytes())]
    if client_ca_file is None:
        return grpc.ssl_server_credentials(chain)
    return grpc.ssl_server_credentials(chain, root_certificates=Path(client_ca_file).read_bytes(),
                                       require_client_auth=True)
