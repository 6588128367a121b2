"""`seqserve generate`: one call to a running server, printed as text, as the n-best with scores and per-token
log-probabilities, or as the whole response in protobuf's JSON mapping (`--json`)."""
from __future__ import annotations

import argparse
import json
import math
import sys

import grpc
from google.protobuf import json_format

from seqserve.client.channel import connection_from_args
from seqserve.client.client import Client, Result, Sequence, decoding_from_args


def run(args: argparse.Namespace) -> int:
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ValueError(f"--timeout must be a finite number of seconds > 0, got {args.timeout}")
    decoding = decoding_from_args(args)  # with the languages: every client call takes them as keywords
    decoding |= {"source_language": args.source_language, "target_language": args.target_language}
    with Client(args.server, timeout=args.timeout, connection=connection_from_args(args),
                model=args.model) as client:
        try:
            if args.json:
                _print_json(client, args.input, args.stream, decoding)
                return 0
            result = _print_text(client, args.input, args.stream, decoding)
        except grpc.RpcError as exc:
            print(f"seqserve generate: error: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    print(f"[{result.finish_reason}: {result.input_tokens} input + {result.generated_tokens} generated tokens, "
          f"seed {result.seed}, first token {result.first_token_seconds * 1e3:.1f} ms, "
          f"total {result.total_seconds * 1e3:.1f} ms]", file=sys.stderr)
    return 0


def _print_json(client: Client, text: str, stream: bool, decoding: dict) -> None:
    """The whole response (a stream: one JSON object per message, one per line), field names as in the proto."""
    def dump(message, indent: int | None) -> str:
        fields = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                           always_print_fields_with_no_presence=True)
        return json.dumps(fields, indent=indent, ensure_ascii=False)

    if stream:
        for message in client.stream_responses(text, **decoding):
            if message.finish_reason:  # the last message: every field, a seed of 0 included (it is a real seed)
                print(dump(message, None), flush=True)
            else:  # a piece carries its text and ids only: no seed, finish reason or usage it does not have
                piece = json_format.MessageToDict(message, preserving_proto_field_name=True)
                print(json.dumps({"text": "", "token_ids": []} | piece, ensure_ascii=False), flush=True)
    else:
        print(dump(client.generate_response(text, **decoding), 2))


def _print_text(client: Client, text: str, stream: bool, decoding: dict) -> Result:
    """The text; with scores (beams, return_logprobs) or several sequences, every sequence in detail after it."""
    if stream:
        for piece in client.stream(text, **decoding):
            print(piece.text, end="", flush=True)
            result = piece.result
        print()
    else:
        result = client.generate(text, **decoding)
        if not _detailed(result):
            print(result.text)
    if _detailed(result):
        for rank, seq in enumerate(result.sequences, 1):
            print("\n".join(describe(rank, seq)))
    return result


def _detailed(result: Result) -> bool:
    """Several sequences or log-probabilities were asked for: a model's default beams alone print the text only."""
    return len(result.sequences) > 1 or any(s.logprobs for s in result.sequences)


def describe(rank: int, seq: Sequence) -> list[str]:
    """One sequence of the n-best: its text, its scores, and a line per token with the alternatives at that step.

    Tokens are shown as ids: the tokenizer is part of the server's bundle, not of the client."""
    lines = [f"{rank}. {seq.text}"]
    scores = [] if seq.score is None else [f"score {seq.score:.4f}", f"cumulative logprob {seq.cumulative_logprob:.4f}"]
    tokens = f"{len(seq.token_ids)} tokens"
    if len(seq.logprobs) == len(seq.token_ids) + 1:  # on eos the end token is scored too: the table's last row
        tokens += f" + the end token ({len(seq.logprobs)} log-probabilities, the last row is the end token's)"
    lines.append("   " + ", ".join(scores + [seq.finish_reason, tokens]))
    if seq.logprobs:
        alternatives = len(seq.logprobs[0].top_logprobs)
        lines.append("   token id   logprob" + (f"   top {alternatives} (token id logprob)" if alternatives else ""))
        for t in seq.logprobs:
            top = "   ".join(f"{i} {lp:.4f}" for i, lp in t.top_logprobs)
            lines.append(f"   {t.token_id:>8} {t.logprob:>9.4f}" + (f"   {top}" if top else ""))
    return lines
