"""Field types of the OpenAI request models that carry their refusals in the
type itself, so that the published JSON schema (FastAPI's `/openapi.json`,
generated from these models) says exactly what validation accepts: a refused
parameter is typed as what is accepted (`null`, an empty list, `'none'`...),
and the refusal only words the error.

The numeric bounds without an OpenAI meaning are those of the engine's input
tensors (`client/payload.py`: INT32 token counts, FP32 penalties): a larger
value could not be sent upstream at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BeforeValidator, Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError

from ..core.upstream import PUBLIC_MODELS

INT32_MAX = int(np.iinfo(np.int32).max)
FP32_MAX = float(np.finfo(np.float32).max)
# the smallest normal FP32: a positive value below it reaches the engine as 0
# (or a subnormal), which a bound "> 0" upstream refuses
FP32_TINY = float(np.finfo(np.float32).tiny)
# a validation error of this type is answered 404 (gateway/app.py), as OpenAI
# answers an unknown model, not 400
MODEL_NOT_FOUND = "model_not_found"


def unsupported(name: str, hint: str = "") -> str:
    return f"'{name}' is not supported by this server{hint}"


def refused(message: str | Callable[[Any], str | None]) -> WrapValidator:
    """The accepted type's own validation, with `message` (or what the callable
    says for the refused value; None keeps pydantic's) in place of pydantic's."""

    def wrap(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            worded = message(value) if callable(message) else message
            if worded is None:
                raise
            # not a ValueError: its message would start with "Value error, "
            raise PydanticCustomError("unsupported_value", worded) from None

    return WrapValidator(wrap)


def _tiny(value: Any) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < FP32_TINY:
        return f"Input should be greater than 0 (at least {FP32_TINY:.4g}: the engine holds it as an FP32)"
    return None


# a float > 0 as the engine's FP32 input holds it: at most 1 (a probability), or any FP32
UnitFP32 = Annotated[float, Field(ge=FP32_TINY, le=1), refused(_tiny)]
PositiveFP32 = Annotated[float, Field(ge=FP32_TINY, le=FP32_MAX), refused(_tiny)]


def _json_bool(value: Any) -> Any:
    if value is not None and not isinstance(value, bool):
        raise PydanticCustomError("bool_type", "Input should be a valid boolean")
    return value


# a literal `false` (or null): Literal[False] alone would take 0, since 0 == False
FalseOnly = Annotated[Literal[False] | None, BeforeValidator(_json_bool)]


def _served(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        if not isinstance(value, str):
            raise  # not a name at all: a 400, as for any other wrong type
        shown = value if len(value) <= 64 else value[:64] + "…"
        raise PydanticCustomError(
            MODEL_NOT_FOUND, f"The model '{shown}' does not exist; models are {', '.join(PUBLIC_MODELS)}."
        ) from None


# the served models (gateway/core/upstream.py's PUBLIC_MODELS, the one list): the
# schema's enum; any other name is a 404 `model_not_found`
# type-ignored below: a Literal of a constant tuple: valid for pydantic, not expressible to mypy
ServedModel = Annotated[Literal[PUBLIC_MODELS], WrapValidator(_served)]  # type: ignore[valid-type]
