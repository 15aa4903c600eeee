"""KServe v2's raw tensor encoding, both ways: numbers little-endian and
packed, BYTES as a 4-byte little-endian length before each element. The gRPC
`raw_input_contents` / `raw_output_contents` and the HTTP binary-data
extension share it.

Decoding is written out here instead of tritonclient's
`deserialize_bytes_tensor`: a caller's bytes are untrusted, and a truncated
length prefix or an element running past the end must be a clean refusal
naming the input, not a struct error."""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.utils import serialize_byte_tensor

_NUMERIC = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_LENGTH_PREFIX = 4


def decode_raw(datatype: str, data: bytes) -> list[Any]:
    """The flat values of one raw tensor as plain Python values (bytes for
    BYTES); ValueError("<what is wrong>") for content that is not `datatype`."""
    if datatype == "BYTES":
        return _decode_bytes(data)
    dtype = _NUMERIC.get(datatype)
    if dtype is None:
        raise ValueError(f"datatype {datatype} has no raw encoding")
    if len(data) % dtype.itemsize:
        raise ValueError(f"raw content of {len(data)} bytes is not a whole number of {datatype} values")
    if datatype == "BOOL":
        octets = np.frombuffer(data, dtype=np.uint8)
        if octets.size and int(octets.max()) > 1:
            raise ValueError("raw BOOL values must be bytes 0 or 1")
    return np.frombuffer(data, dtype=dtype).tolist()


def _decode_bytes(data: bytes) -> list[bytes]:
    out: list[bytes] = []
    position, end = 0, len(data)
    view = memoryview(data)
    while position < end:
        if position + _LENGTH_PREFIX > end:
            raise ValueError("malformed BYTES raw content (a truncated length prefix)")
        length = int.from_bytes(view[position : position + _LENGTH_PREFIX], "little")
        position += _LENGTH_PREFIX
        if position + length > end:
            raise ValueError("malformed BYTES raw content (an element runs past the end)")
        out.append(bytes(view[position : position + length]))
        position += length
    return out


def encode_raw(array: np.ndarray) -> bytes:
    """One output tensor as raw bytes, as Triton sends it."""
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        if array.size == 0:
            return b""
        serialized = serialize_byte_tensor(array)
        return serialized.item() if serialized.ndim == 0 else bytes(serialized.tobytes())
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
