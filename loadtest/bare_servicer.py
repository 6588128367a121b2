"""The bare servicer: a grpc.aio server on seqserve's own proto that does nothing but answer, the ceiling of any Python
edge on its core (loadtest/server_bench.py runs it pinned as it runs `seqserve serve`).

    python -m seqserve.loadtest.bare_servicer --port PORT --tokens 32

Every Generate answers `--tokens` tokens at once, shaped as seqserve answers them (text, ids, the one sequence, usage,
timings, seed); every GenerateStream sends one message per token, the last one carrying the summary. No engine, no
validation, no metrics: what is left is grpc.aio's own work per call and per message.
"""
from __future__ import annotations

import argparse
import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

FIRST_ID = 4  # the first id past <pad> <s> </s> <unk>: any ordinary token


def pieces(tokens: int) -> list[tuple[int, str]]:
    """The answer's tokens: (id, its text piece), a short word each, as a detokenised stream carries them."""
    return [(FIRST_ID + i, f" w{i}") for i in range(tokens)]


class BareGeneration(pb_grpc.GenerationServicer):
    def __init__(self, tokens: int) -> None:
        self.pieces = pieces(tokens)
        self.text = "".join(text for _, text in self.pieces)
        self.ids = [token for token, _ in self.pieces]

    def _summary(self, request: pb.GenerateRequest) -> dict:
        return {"finish_reason": pb.FINISH_REASON_LENGTH, "seed": request.options.seed,
                "usage": pb.Usage(input_tokens=len(request.input.split()) + 1, generated_tokens=len(self.ids)),
                "timings": pb.Timings(), "sequences": [pb.Sequence(text=self.text, token_ids=self.ids,
                                                                   finish_reason=pb.FINISH_REASON_LENGTH)]}

    async def Generate(self, request: pb.GenerateRequest, context) -> pb.GenerateResponse:
        return pb.GenerateResponse(text=self.text, token_ids=self.ids, **self._summary(request))

    async def GenerateStream(self, request: pb.GenerateRequest, context):
        for token, text in self.pieces[:-1]:
            yield pb.GenerateStreamResponse(text=text, token_ids=[token])
        token, text = self.pieces[-1]
        yield pb.GenerateStreamResponse(text=text, token_ids=[token], **self._summary(request))


async def serve(port: int, tokens: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_GenerationServicer_to_server(BareGeneration(tokens), server)
    checks = health.aio.HealthServicer()  # SERVING: what server_bench waits for, as it does for `seqserve serve`
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqserve.loadtest.bare_servicer", description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    parser.add_argument("--tokens", type=int, default=32, help="tokens every call answers")
    a = parser.parse_args(argv)
    if a.tokens <= 0:
        parser.error("--tokens must be positive")
    try:
        asyncio.run(serve(a.port, a.tokens))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
