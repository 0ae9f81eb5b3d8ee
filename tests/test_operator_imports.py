"""What the operator process imports to start: a guard on its resident memory (docs/benchmarks.md).

An idle operator's memory is mostly the modules it imported (aiohttp, pydantic, asyncio, OpenSSL, the
OpenTelemetry metrics SDK). These libraries are dependencies of the package, or of code the operator
never runs, and each would add to every operator's memory as soon as one import at module level
reaches it: the OTLP exporters and protobuf (tracing is off unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set,
and then imported on demand), kubernetes_asyncio (`kube.client` replaced it), PyYAML (a kubeconfig only:
in a cluster the service account is read), cryptography, aiohttp's web server and `http.server` (the
endpoints are `observability.endpoints`), prometheus_client (`observability.exposition`).
"""

from __future__ import annotations

import subprocess
import sys

# The modules `nodewright operator` imports before and while it starts (`cli.operator_cmd.run`,
# `_main`, `run_operator`), in that order.
START_PATH = (
    "nodewright.cli.main",
    "nodewright.cli.operator_cmd",
    "nodewright.observability.heap",
    "nodewright.observability.logging",
    "nodewright.controller.manager",
    "nodewright.kube.client",
    "nodewright.observability.endpoints",
    "nodewright.observability.loop_lag",
    "nodewright.observability.metrics",
    "nodewright.observability.server",
    "nodewright.observability.tracing",
    "nodewright.controller.notify",
    "nodewright.controller.operator",
    "nodewright.controller.signing",
)

NOT_AT_START = (
    "opentelemetry.exporter",
    "google.protobuf",
    "kubernetes_asyncio",
    "yaml",
    "cryptography",
    "aiohttp.web",
    "http.server",
    "wsgiref",
    "prometheus_client",
    "requests",
    "urllib3",
    "dateutil",
    "matplotlib",
)
# Not psutil: the OpenTelemetry SDK imports it whenever it is installed (here, for the benchmark's
# sampler; never in the image, see benchmarks/runtime_env.py).


def test_the_operator_start_path_leaves_the_heavy_modules_unimported() -> None:
    probe = (
        "import sys\n"
        "from nodewright.observability.heap import import_http_client\n"
        "import_http_client()\n"
        f"for name in {START_PATH!r}:\n"
        "    __import__(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {NOT_AT_START!r} or "
        f"any(m == n or m.startswith(n + '.') for n in {NOT_AT_START!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
