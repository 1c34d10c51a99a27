#!/bin/sh
# The function's handler. The Lambda Web Adapter layer's /opt/bootstrap (AWS_LAMBDA_EXEC_WRAPPER)
# executes "${LAMBDA_TASK_ROOT}/${_HANDLER}" instead of the Python runtime client; this starts the
# web app that the adapter forwards every invocation to (see handler.py).
# The search path of the adapter's own Python zip examples (/opt/python, then the runtime's
# directory), with the asset first, so that its pinned boto3/botocore win over the runtime's.
export PYTHONPATH="${LAMBDA_TASK_ROOT}:/opt/python:${LAMBDA_RUNTIME_DIR}${PYTHONPATH:+:${PYTHONPATH}}"
exec python3 -u "${LAMBDA_TASK_ROOT}/server.py"
