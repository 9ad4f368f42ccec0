# JupyterLab image for the 2-GPU NCCL path of the course.
#
#   docker build -t token-ddp .
#   docker run --gpus all --ipc=host -p 8888:8888 -e JUPYTER_TOKEN=<secret> token-ddp
#
# Pinned base tag, never `latest`. Its torch (2.8.0, CUDA 12.8) satisfies
# pyproject's `torch>=2.4,<2.14`, so `pip install -e .` below keeps that CUDA
# build and does NOT reinstall torch (pip would otherwise fetch a new wheel).
FROM pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    COURSE_ROOT=/opt/course \
    VENV=/opt/conda

# `make` is needed for `make course` inside the container.
# DL3008 (pin apt package versions) is ignored: the pinned base tag already
# fixes the Ubuntu release, and a pinned Ubuntu revision of `make` would break
# the build as soon as the archive drops that revision.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group --shell /bin/bash course

COPY --chown=10001:10001 . /opt/course
COPY docker/entrypoint.sh /usr/local/bin/course-entrypoint
WORKDIR /opt/course

# The course and its runtime dependencies; torch is already satisfied (above),
# and the assert fails the build if pip ever swapped in a CPU-only torch.
# The stamp tells the Makefile (VENV=/opt/conda) that this environment is
# ready, so `make course` uses it instead of creating a CPU-only .venv.
RUN pip install --no-cache-dir -e . \
    && python -c "import torch; assert torch.version.cuda, 'torch lost its CUDA build'" \
    && touch /opt/conda/.installed \
    && chmod 0755 /usr/local/bin/course-entrypoint \
    && chown -R 10001:10001 /opt/course

# Non-root from here on (uid 10001 is the `course` user created above; a high uid
# cannot clash with a user that the base image may already have at 1000).
USER 10001:10001
WORKDIR /opt/course/notebooks

EXPOSE 8888

# /api answers without a token; python's urllib avoids needing curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8888/api', timeout=4)"]

# JupyterLab on 0.0.0.0:8888 with a token that is never empty: the entrypoint
# refuses JUPYTER_TOKEN="" and generates (and prints) one when it is unset.
ENTRYPOINT ["/usr/local/bin/course-entrypoint"]
CMD ["lab"]
