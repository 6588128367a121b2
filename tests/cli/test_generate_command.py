"""`seqserve generate` against a real server: the text, the n-best with scores, per-token log-probabilities with their
alternatives, and the whole response as JSON. The oracle is the same request made through the Python client."""
from __future__ import annotations

import json
import threading

import pytest
from google.protobuf import json_format

from seqserve.cli.main import build_parser, main
from seqserve.client.client import Client, option_flags
from seqserve.v1 import seqserve_pb2 as pb

BEAMS = {"num_beams": 4, "num_return_sequences": 4}
LOGPROBS = {"return_logprobs": True, "top_logprobs": 3}


def _generate(capsys, served, source: str, *flags: str) -> tuple[str, str]:
    assert main(["generate", source, "--server", served.address, *flags]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def _direct(served, source: str, **decoding):
    with Client(served.address, timeout=30) as client:
        return client.generate(source, **decoding)


def test_unary_and_stream_print_the_text(served, heldout, capsys):
    src, tgt = heldout[0]
    out, err = _generate(capsys, served, src)
    assert out == tgt + "\n" and "[eos:" in err
    out, err = _generate(capsys, served, src, "--stream", "--max-new-tokens", "3")
    assert out == tgt[:3] + "\n" and "[length: " in err and "3 generated tokens" in err


def test_errors_name_the_status_and_field(served, capsys):
    assert main(["generate", "x", "--server", served.address, "--temperature", "-1"]) == 1
    assert "error: INVALID_ARGUMENT: options.temperature must be finite and >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("stream", [False, True])
def test_beams_print_the_n_best_with_scores(served, heldout, capsys, stream):
    src = heldout[1][0]
    expected = _direct(served, src, **BEAMS).sequences
    assert len(expected) == 4
    out, _ = _generate(capsys, served, src, "--num-beams", "4", "--num-return-sequences", "4",
                       *(["--stream"] if stream else []))
    lines = out.splitlines()
    for rank, seq in enumerate(expected, 1):
        at = lines.index(f"{rank}. {seq.text}")  # each sequence in rank order, then its scores
        assert lines[at + 1].strip().split(", ")[:3] == [f"score {seq.score:.4f}",
                                                 f"cumulative logprob {seq.cumulative_logprob:.4f}", seq.finish_reason]
    ranks = [line.split(".")[0] for line in lines if line[:1].isdigit()]
    assert ranks == ["1", "2", "3", "4"]


def test_logprobs_print_every_token_with_its_alternatives(served, heldout, capsys):
    src = heldout[2][0]
    (expected,) = _direct(served, src, **LOGPROBS).sequences
    assert expected.logprobs and all(len(t.top_logprobs) == 3 for t in expected.logprobs)
    assert expected.finish_reason == "eos" and len(expected.logprobs) == len(expected.token_ids) + 1  # the end token
    out, _ = _generate(capsys, served, src, "--return-logprobs", "--top-logprobs", "3")
    lines = out.splitlines()
    assert lines[0] == f"1. {expected.text}" and lines[1].startswith(f"   score {expected.score:.4f}, ")
    assert lines[1].endswith(f", {len(expected.token_ids)} tokens + the end token ({len(expected.logprobs)} "
                             "log-probabilities, the last row is the end token's)")
    rows = [line.split() for line in lines[3:]]  # after the column header: id, logprob, then (id, logprob) x 3
    assert len(rows) == len(expected.logprobs)
    for row, token in zip(rows, expected.logprobs, strict=True):
        assert int(row[0]) == token.token_id and float(row[1]) == pytest.approx(token.logprob, abs=1e-4)
        alternatives = [(int(row[i]), float(row[i + 1])) for i in range(2, len(row), 2)]
        assert [i for i, _ in alternatives] == [i for i, _ in token.top_logprobs]
        assert [lp for _, lp in alternatives] == pytest.approx([lp for _, lp in token.top_logprobs], abs=1e-4)


def test_json_is_the_whole_response(served, heldout, capsys):
    src = heldout[3][0]
    out, err = _generate(capsys, served, src, "--json", *option_flags(BEAMS | LOGPROBS))
    printed = json_format.Parse(out, pb.GenerateResponse())  # refuses any field the proto does not have
    assert "seed" in json.loads(out) and err == ""  # the proto's field names; nothing but JSON
    with Client(served.address, timeout=30) as client:
        direct = client.generate_response(src, **BEAMS, **LOGPROBS)
    for response in (printed, direct):  # all but what differs between two calls: timings, the server-chosen seed
        response.ClearField("timings")
        response.ClearField("seed")
    assert printed == direct and len(printed.sequences) == 4 and printed.sequences[0].logprobs


def test_json_stream_is_one_object_per_message(served, heldout, capsys):
    src = heldout[0][0]
    out, _ = _generate(capsys, served, src, "--json", "--stream")
    messages = [json_format.Parse(line, pb.GenerateStreamResponse()) for line in out.splitlines()]
    # one object per line (a busy server may carry several steps' tokens in one message: how many is not fixed)
    assert messages and all(not m.finish_reason for m in messages[:-1])
    assert [t for m in messages for t in m.token_ids] == list(_direct(served, src).token_ids)
    assert "".join(m.text for m in messages) == _direct(served, src).text
    assert messages[-1].finish_reason == pb.FINISH_REASON_EOS and messages[-1].usage.generated_tokens > 0


def test_json_stream_pieces_show_only_what_they_carry_and_the_last_message_the_seed(tiny_bundle, heldout, capsys):
    """Pieces print their text and ids only (no seed "0" or FINISH_REASON_UNSPECIFIED they do not carry); the last
    message prints every field, a real seed of 0 included. The engine is held after the first token so the stream
    has at least two messages on any machine."""
    from grpc_harness import Served, wait_for

    server = Served(tiny_bundle).wait_ready()
    try:
        gate = server.gate()
        gate.close()
        codes: list[int] = []
        chunks: list[str] = []
        call = threading.Thread(target=lambda: codes.append(main(["generate", heldout[0][0], "--server",
                                                                  server.address, "--json", "--stream", "--seed",
                                                                  "0"])))
        call.start()
        gate.wait_held()  # after the step that made the first token

        def first_piece_printed() -> bool:
            chunks.append(capsys.readouterr().out)
            return "\n" in "".join(chunks)

        wait_for(first_piece_printed, what="the first piece printed")
        gate.open()
        call.join(60)
    finally:
        server.stop()
    lines = "".join(chunks + [capsys.readouterr().out]).splitlines()
    assert codes == [0] and len(lines) >= 2
    *pieces, last = [json.loads(line) for line in lines]
    assert all(set(piece) == {"text", "token_ids"} for piece in pieces), pieces
    assert last["seed"] == "0" and last["finish_reason"] == "FINISH_REASON_EOS" and last["usage"]["generated_tokens"]


def test_help_shows_an_input_of_the_default_model():
    parser = build_parser()
    generate = parser._subparsers._group_actions[0].choices["generate"]
    text = generate.format_help()
    assert '"<fr> 1 234"' in text and "b 5 9" not in text
