#!/usr/bin/env bash
# Container entrypoint: `lab` (the default) starts JupyterLab on 0.0.0.0:8888
# with a non-empty token; any other command runs as given, e.g.
#   docker run --gpus all --ipc=host token-ddp course-lib check-env --backend nccl
set -euo pipefail

if [ "$#" -gt 0 ] && [ "$1" != "lab" ]; then
  exec "$@"
fi
[ "$#" -gt 0 ] && shift

if [ -z "${JUPYTER_TOKEN+set}" ]; then
  JUPYTER_TOKEN="$(python -c 'import secrets; print(secrets.token_hex(24))')"
  echo "JUPYTER_TOKEN was not set; generated one for this container:"
  echo "  http://127.0.0.1:8888/lab?token=${JUPYTER_TOKEN}"
elif [ -z "${JUPYTER_TOKEN}" ]; then
  echo "error: JUPYTER_TOKEN is empty; refusing to start JupyterLab without a token" >&2
  exit 2
fi
export JUPYTER_TOKEN

exec jupyter lab \
  --ip=0.0.0.0 --port=8888 --no-browser \
  --ServerApp.root_dir=/opt/course/notebooks \
  --IdentityProvider.token="${JUPYTER_TOKEN}" \
  "$@"
