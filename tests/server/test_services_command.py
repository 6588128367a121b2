"""`python -m seqserve.client.services`: the methods a real server offers, through reflection; a clear status when
there is no reflection to ask."""
from __future__ import annotations

from seqserve.client.services import main
from seqserve.v1 import seqserve_pb2 as pb


def test_lists_every_method_of_every_service(served, capsys):
    assert main([served.address]) == 0
    listed = capsys.readouterr().out.split()
    generation = pb.DESCRIPTOR.services_by_name["Generation"]
    assert {f"{generation.full_name}/{m.name}" for m in generation.methods} <= set(listed)
    assert {"grpc.health.v1.Health/Check", "grpc.health.v1.Health/Watch"} <= set(listed) and listed == sorted(listed)


def test_a_server_without_reflection_gets_a_status_not_a_traceback(make_server, capsys):
    server = make_server(reflection=False)
    assert main([server.address]) == 1
    assert capsys.readouterr().err.startswith("error: UNIMPLEMENTED")
