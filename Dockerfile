# Operator image: a venv built in a builder stage, copied onto a slim base, run as a non-root UID.
# (The build machines have no Docker engine; this file is reviewed, not built, in CI.)
FROM python:3.11-slim AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY nodewright ./nodewright
RUN python -m venv /opt/nodewright && /opt/nodewright/bin/pip install --no-cache-dir .

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PATH=/opt/nodewright/bin:$PATH
COPY --from=builder /opt/nodewright /opt/nodewright
USER 10001:10001
# Exec form so the process is PID 1 and receives SIGTERM; the operator installs its own handler.
ENTRYPOINT ["nodewright"]
CMD ["operator"]
