"""A ``DuplexError`` as a gRPC status, from the one error table.

The status code is ``ErrorSpec.grpc_status`` (docs/errors.md, gRPC column).
The rich details (``grpc-status-details-bin``, read with
``grpc_status.rpc_status.from_call``) carry a ``google.rpc.ErrorInfo`` whose
``reason`` is the error code upper-cased (``SESSION_EXPIRED`` vs
``SESSION_NOT_FOUND``: both NOT_FOUND, told apart here) and whose metadata
holds ``code``, ``param``, ``retryable`` and the error's details
(``owner_instance_id`` of a ``wrong_instance``, ``expected_seq`` of a gap);
a ``BadRequest`` naming the field for invalid arguments; a ``RetryInfo`` when
a retry can succeed.
"""

from __future__ import annotations

import json

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from vllm_duplex.domain.errors import DuplexError, InvalidRequest

DOMAIN = "openengine.v1"
DETAILS_KEY = "grpc-status-details-bin"


def _pack(message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def to_status(err: DuplexError) -> tuple[grpc.StatusCode, str, status_pb2.Status]:
    spec = err.spec
    code = grpc.StatusCode[spec.grpc_status]
    metadata = {"code": err.code, "type": spec.type, "retryable": str(spec.retryable).lower()}
    if err.param is not None:
        metadata["param"] = err.param
    for key, value in err.details.items():
        metadata[key] = value if isinstance(value, str) else json.dumps(value)
    details = [_pack(error_details_pb2.ErrorInfo(reason=err.code.upper(), domain=DOMAIN,
                                                 metadata=metadata))]
    if isinstance(err, InvalidRequest) and err.param is not None:
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=err.param, description=err.message)])))
    if spec.retryable:
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1))))
    message = f"{err.code}: {err.message}"
    return code, message, status_pb2.Status(code=code.value[0], message=message, details=details)


async def abort(context: grpc.aio.ServicerContext, err: DuplexError) -> None:
    """End the call with ``err`` (raises, as ``context.abort`` does)."""
    code, message, status = to_status(err)
    await context.abort(code, message, trailing_metadata=((DETAILS_KEY, status.SerializeToString()),))
