#!/bin/sh
# The images' one entry point: a role, then that role's arguments.
#
#   triton [serve args]     tritonserver with the project's model repository
#                           (`python -m serving serve --no-gateway`), listening on
#                           $LLM_TRITON_ADDRESS (0.0.0.0) with HTTP, gRPC and metrics on
#                           $LLM_TRITON_HTTP_PORT, $LLM_TRITON_GRPC_PORT, $LLM_TRITON_METRICS_PORT
#                           (8000, 8001, 8002); its log also goes to this output.
#   gateway [args]          the OpenAI / Triton front door (`python -m gateway serve`)
#   probe | drain | prepare-model [args]
#                           `python -m serving <role>`: the readiness probe with an
#                           inference check, the preStop drain, the model preparation
#   anything else           run as given (e.g. `python -m gateway keys create --tier paid`)
#
# Settings come from the environment as everywhere else (LLM__ENGINE__NUM_THREADS=4,
# LLM__GATEWAY__REDIS_URL=..., LLM_MODEL_DIR, LLM_TRITON_ADMIN_KEY), or --settings / --set.
set -eu

role="${1:-triton}"
if [ "$#" -gt 0 ]; then
    shift
fi

case "$role" in
    triton)
        log_file="${LLM_TRITON_LOG_FILE:-${LLM_BUILD_DIR:-/tmp/triton-llm}/tritonserver.log}"
        mkdir -p "$(dirname "$log_file")"
        : > "$log_file"
        # follows the log for as long as this process (python, after exec) lives
        tail --pid="$$" -n +1 -F "$log_file" 2>/dev/null &
        # the orchestrator restarts a tritonserver that dies (and counts it, with
        # its own backoff): serve exits with it instead of restarting it inside
        export LLM__SERVER__RESTART_REPLICAS="${LLM__SERVER__RESTART_REPLICAS:-false}"
        exec python -m serving serve --no-gateway \
            --address "${LLM_TRITON_ADDRESS:-0.0.0.0}" \
            --http-port "${LLM_TRITON_HTTP_PORT:-8000}" \
            --grpc-port "${LLM_TRITON_GRPC_PORT:-8001}" \
            --metrics-port "${LLM_TRITON_METRICS_PORT:-8002}" \
            --log-file "$log_file" "$@"
        ;;
    gateway)
        exec python -m gateway serve "$@"
        ;;
    probe | drain | prepare-model)
        exec python -m serving "$role" "$@"
        ;;
    *)
        exec "$role" "$@"
        ;;
esac
