"""What a request body may be, before any door reads it: the ASGI body guard
(size, media type, nesting: `guard`) and the strict JSON parser the doors
read bodies with (`strict_json`)."""
