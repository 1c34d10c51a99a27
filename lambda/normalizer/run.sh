#!/bin/sh
# The function's handler. The Lambda Web Adapter layer's /opt/bootstrap (AWS_LAMBDA_EXEC_WRAPPER)
# executes "${LAMBDA_TASK_ROOT}/${_HANDLER}" instead of the Python runtime client; this starts the
# web app that the adapter forwards every invocation to (see handler.py).
export PYTHONPATH="${LAMBDA_TASK_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
exec python3 -u "${LAMBDA_TASK_ROOT}/server.py"
