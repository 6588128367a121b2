"""How clients reach a server: plaintext or TLS (optionally with a client certificate) and a bearer token.

One set of flags for every client (`seqserve generate`, the healthcheck, locust): --tls, --ca-file, --cert-file,
--key-file, --tls-server-name, --token-file; the token may also come from the SEQSERVE_TOKEN environment variable
(never a flag: flags show in the process list).
"""
from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from seqserve.client.flags import flag

TOKEN_ENV = "SEQSERVE_TOKEN"
AUTHORIZATION = "authorization"  # gRPC metadata keys are lower case
BEARER = "Bearer "

CONNECTION_HELP = {
    "tls": "connect with TLS, trusting the system's CA certificates (implied by --ca-file and --cert-file)",
    "ca_file": "PEM CA certificates that signed the server's certificate (TLS)",
    "cert_file": "PEM client certificate, for a server that requires mutual TLS (with --key-file)",
    "key_file": "PEM private key of --cert-file",
    "tls_server_name": "the name the server's certificate must carry, when the address does not (e.g. an IP)",
    "token_file": f"file holding the bearer token (or set {TOKEN_ENV})",
}


@dataclass(frozen=True)
class Connection:
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    tls_server_name: str | None = None
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both --cert-file and --key-file")

    @property
    def secure(self) -> bool:
        return self.tls or self.ca_file is not None or self.cert_file is not None

    def channel(self, address: str, options: list[tuple[str, object]] | None = None) -> grpc.Channel:
        """A blocking channel to address; every call through it carries the token, if any."""
        options = list(options or [])
        if self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        if self.secure:
            channel = grpc.secure_channel(address, self.credentials(), options=options)
        else:
            channel = grpc.insecure_channel(address, options=options)
        return grpc.intercept_channel(channel, BearerToken(self.token)) if self.token else channel

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return grpc.ssl_channel_credentials(root_certificates=read(self.ca_file), private_key=read(self.key_file),
                                            certificate_chain=read(self.cert_file))


def add_connection_arguments(parser, **extra) -> None:
    """The connection flags (extra: keywords every add_argument gets, e.g. locust's include_in_web_ui)."""
    for name, help_text in CONNECTION_HELP.items():
        if name == "tls":
            parser.add_argument(flag(name), action="store_true", help=help_text, **extra)
        else:
            parser.add_argument(flag(name), help=help_text, **extra)


def connection_from_args(args, environ: dict | None = None) -> Connection:
    """The Connection the flags describe; the token from --token-file, else SEQSERVE_TOKEN (blank = none)."""
    environ = os.environ if environ is None else environ

    def path(name: str) -> Path | None:
        value = getattr(args, name, None)
        return Path(value) if value not in (None, "") else None

    token_file = path("token_file")
    token = token_file.read_text().strip() if token_file is not None else environ.get(TOKEN_ENV, "").strip()
    return Connection(tls=bool(getattr(args, "tls", False)), ca_file=path("ca_file"), cert_file=path("cert_file"),
                      key_file=path("key_file"), tls_server_name=getattr(args, "tls_server_name", None) or None,
                      token=token or None)


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")), grpc.ClientCallDetails):
    pass


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call's metadata."""

    def __init__(self, token: str) -> None:
        self._header = (AUTHORIZATION, BEARER + token)

    def _with_token(self, d: grpc.ClientCallDetails) -> _Details:
        metadata = [m for m in (d.metadata or ()) if m[0] != AUTHORIZATION] + [self._header]
        return _Details(d.method, d.timeout, metadata, d.credentials, getattr(d, "wait_for_ready", None),
                        getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)
