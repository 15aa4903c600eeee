"""A bounded fuzz of the gateway's gRPC door against the real stack: 250
generated ModelInfer requests, each also sent on a ModelStreamInfer
stream (500 requests), with one thing wrong (an unknown input, a wrong
datatype, a wrong shape or batch, non-UTF-8 bytes, a wrong number of values,
a value out of its input's range or not finite), encoded as
`contents` or as `raw_input_contents`. Each is refused with an error naming
the input (INVALID_ARGUMENT on ModelInfer, `error_message` on the stream),
and none reaches Triton's front: Triton's own request counters
(`nv_inference_request_success` + `_failure`) do not move over the fuzz,
while one good request afterwards does move them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2, service_pb2_grpc

from contract.public_bounds import BOUNDS
from contract.public_tensors import PUBLIC_INPUTS
from gateway.bodies.strict_json import shown
from gateway.triton.inputs import wire_datatype
from gateway.triton.raw import encode_raw
from gateway.triton.wire_proto import CONTENTS_FIELDS
from serving.launcher import TritonServer, free_local_ports
from tests.e2e.test_gateway_openai import Gateway, start_gateway
from tests.e2e.triton_calls import scrape_metrics

pytestmark = pytest.mark.e2e

EXAMPLES = 250  # each sent twice: ModelInfer and ModelStreamInfer
KNOWN = {spec.name: wire_datatype(spec) for spec in PUBLIC_INPUTS}
WORD_LISTS = {spec.name for spec in PUBLIC_INPUTS if spec.dims == (-1,)}
BYTES_INPUTS = sorted(name for name, datatype in KNOWN.items() if datatype == "BYTES")
DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
    "BF16",
    "",
    "STRING",
]
_NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    values: tuple[object, ...]  # bytes for BYTES, numbers otherwise


@dataclass(frozen=True)
class Case:
    model: str
    tensors: tuple[Tensor, ...]
    raw: bool
    culprit: str  # the input the error must name

    def request(self) -> service_pb2.ModelInferRequest:
        request = service_pb2.ModelInferRequest(model_name=self.model, id="fuzz")
        for tensor in self.tensors:
            wire = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
            if self.raw:
                request.raw_input_contents.append(_raw(tensor))
            elif CONTENTS_FIELDS.get(tensor.datatype) is not None:
                getattr(wire.contents, CONTENTS_FIELDS[tensor.datatype]).extend(tensor.values)
        return request


def _raw(tensor: Tensor) -> bytes:
    if tensor.datatype == "BYTES":
        return encode_raw(np.array(list(tensor.values), dtype=np.object_))
    dtype = _NUMPY.get(tensor.datatype, np.uint8)
    return np.array(tensor.values, dtype=dtype).tobytes()


def _values(datatype: str, count: int) -> tuple[object, ...]:
    if datatype == "BYTES":
        return (b"x",) * count
    if datatype == "BOOL":
        return (True,) * count
    return (1,) * count


# values out of each numeric input's range (contract/public_bounds.py) or not finite
OUT_OF_RANGE = {
    **{
        name: [bound.low - 1 if not bound.low_open else bound.low]
        for name, bound in BOUNDS.items()
        if bound.low is not None and KNOWN.get(name) == "INT32"
    },
    **{name: [float("nan"), float("inf"), -float("inf")] for name, datatype in KNOWN.items() if datatype == "FP32"},
    "top_p": [0.0, 1.5, float("nan")],
    "temperature": [-1.0],
    "repetition_penalty": [0.0, -2.0],
    "length_penalty": [1.5, 0.0, -1.0],
    "continuation_ids": [-1],
}
OUT_OF_RANGE.pop("priority", None)  # the tier decides the priority: a caller's is ignored, not refused

GOOD_TEXT = Tensor("text_input", "BYTES", (1, 1), (b"Say hello",))
GOOD_MAX = Tensor("max_tokens", "INT32", (1, 1), (2,))


@st.composite
def cases(draw: st.DrawFn) -> Case:
    kind = draw(st.sampled_from(["unknown", "datatype", "shape", "utf8", "count", "range"]))
    if kind == "unknown":
        name = draw(st.text(st.characters(blacklist_categories=("Cs",)), max_size=80).filter(lambda n: n not in KNOWN))
        datatype = draw(st.sampled_from(DATATYPES))
        bad = Tensor(name, datatype, (1, 1), _values(datatype, 1))
    elif kind == "datatype":
        name = draw(st.sampled_from(sorted(KNOWN)))
        datatype = draw(st.sampled_from([d for d in DATATYPES if d != KNOWN[name]]))
        bad = Tensor(name, datatype, (1, 1), _values(datatype, 1))
    elif kind == "shape":
        name = draw(st.sampled_from(sorted(KNOWN)))
        shape = tuple(draw(st.lists(st.integers(-2, 3), max_size=3)))
        words = name in WORD_LISTS
        fine = (not any(d < 0 for d in shape)) and (
            (words and (len(shape) == 1 or (len(shape) == 2 and shape[0] == 1)))
            or (not words and shape in ((1,), (1, 1)))
        )
        if fine:
            shape = (2, *shape[1:]) if len(shape) == 2 else (1, 1, *shape)  # a batch of 2, or a rank too high
        count = int(np.prod([max(d, 0) for d in shape])) if shape else 1
        bad = Tensor(name, KNOWN[name], shape, _values(KNOWN[name], min(count, 8)))
    elif kind == "utf8":
        name = draw(st.sampled_from(BYTES_INPUTS))
        value = draw(st.binary(min_size=1, max_size=40).filter(_not_utf8))
        bad = Tensor(name, "BYTES", (1, 1), (value,))
    elif kind == "range":
        name = draw(st.sampled_from(sorted(OUT_OF_RANGE)))
        value = draw(st.sampled_from(OUT_OF_RANGE[name]))
        bad = Tensor(name, KNOWN[name], (1, 1), (value,))
    else:
        name = draw(st.sampled_from(sorted(KNOWN)))
        count = draw(st.sampled_from([0, 2, 3]))
        shape = (1, 1) if name not in WORD_LISTS else (1, count + 1)
        bad = Tensor(name, KNOWN[name], shape, _values(KNOWN[name], count))
    good = [t for t in (GOOD_TEXT, GOOD_MAX) if t.name != bad.name]
    position = draw(st.integers(0, len(good)))
    tensors = tuple(good[:position] + [bad] + good[position:])
    return Case(draw(st.sampled_from(["ensemble", "llm_bls"])), tensors, draw(st.booleans()), bad.name)


def _not_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@pytest.fixture(scope="module")
def door(triton_server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    (grpc_port,) = free_local_ports(1)
    gateway = start_gateway(
        triton_server, tmp_path_factory.mktemp("gateway-grpc-fuzz"), f"gateway.public_grpc_port={grpc_port}"
    )
    yield gateway, f"127.0.0.1:{grpc_port}"
    assert gateway.process.stop() == 0


def triton_requests(triton: TritonServer) -> float:
    metrics = scrape_metrics(triton.metrics_url)
    return metrics.get("nv_inference_request_success", 0.0) + metrics.get("nv_inference_request_failure", 0.0)


def test_malformed_grpc_requests_are_refused_naming_the_input_before_triton(door, triton_server):
    gateway, url = door
    metadata = (("authorization", f"Bearer {gateway.key}"),)
    before = triton_requests(triton_server)
    started = time.monotonic()
    seen: dict[str, int] = {}
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=cases())
        def check(case: Case) -> None:
            prefix = f"{shown(case.culprit)}:"
            request = case.request()
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(request, metadata=metadata, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
            assert caught.value.details().startswith(prefix), (prefix, caught.value.details())
            answers = list(stub.ModelStreamInfer(iter([request]), metadata=metadata, timeout=30))
            assert len(answers) == 1 and answers[0].error_message.startswith(prefix), (prefix, answers)
            kind = case.tensors[[t.name for t in case.tensors].index(case.culprit)].datatype
            seen[kind] = seen.get(kind, 0) + 1

        check()
        took = time.monotonic() - started
        assert triton_requests(triton_server) == before, "a refused request reached Triton"
        # the counters do count: one good request moves them
        good = Case("ensemble", (GOOD_TEXT, GOOD_MAX), False, "").request()
        answer = stub.ModelInfer(good, metadata=metadata, timeout=120)
        assert answer.outputs and answer.id == "fuzz"
    assert triton_requests(triton_server) > before
    assert 2 * sum(seen.values()) >= 500, seen  # ModelInfer + the same on a stream, each refused
    print(
        f"\n[gRPC fuzz: {2 * sum(seen.values())} refused requests ({sum(seen.values())} cases, declared datatypes "
        f"{sorted(seen)}) in {took:.1f} s, Triton's request counters unchanged]"
    )
