# Operator and webhook images: a venv built in a builder stage, copied onto a slim base, run as a non-root
# UID. Build with any standard builder from the repository root:
#   docker build --target operator -t <registry>/nodewright/nodewright:<tag> .
#   docker build --target webhook  -t <registry>/nodewright/webhook:<tag> .
# (the last stage, `operator`, is the default). Both run `nodewright`; the Helm chart passes the subcommand
# as args, so one image serves both roles and `webhook` only changes the default command.
# Without a container engine, `make images` builds equivalent OCI image layouts from Debian packages
# (hack/images/build.py, docs/install.md).
FROM python:3.11-slim AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY nodewright ./nodewright
RUN python -m venv /opt/nodewright && /opt/nodewright/bin/pip install --no-cache-dir . \
 && /opt/nodewright/bin/python -X no_debug_ranges -m compileall -q -o 2 /opt/nodewright/lib \
 && /opt/nodewright/bin/nodewright operator --help >/dev/null

FROM python:3.11-slim AS runtime
# PYTHONOPTIMIZE=2 (-OO) and PYTHONNODEBUGRANGES: no docstrings and no traceback column ranges in memory,
# 2.8 MiB of an idle operator (docs/install.md "Images"); the builder compiled the matching .opt-2.pyc
# files, since the runtime writes none.
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONOPTIMIZE=2 PYTHONNODEBUGRANGES=1 \
    PATH=/opt/nodewright/bin:$PATH
COPY --from=builder /opt/nodewright /opt/nodewright
USER 10001:10001
# Exec form so the process is PID 1 and receives SIGTERM; the operator installs its own handler.
ENTRYPOINT ["nodewright"]

FROM runtime AS webhook
CMD ["webhook"]

FROM runtime AS operator
CMD ["operator"]
