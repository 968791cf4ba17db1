"""The container health check of the kvroute image (Docker HEALTHCHECK; stdlib only, the image has no curl).

GET ``$HEALTHCHECK_URL`` (default ``http://127.0.0.1:$KVROUTE_PORT/health``, port 8080): exit 0 on a 200,
1 otherwise, with one line on stderr saying why. The gateway's ``/health`` is liveness (200 while the
process serves); the emulator's containers point ``HEALTHCHECK_URL`` at their own ``/health``.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 3.0


def url() -> str:
    port = os.environ.get("KVROUTE_PORT", "8080")
    return os.environ.get("HEALTHCHECK_URL", f"http://127.0.0.1:{port}/health")


def main() -> int:
    target = url()
    try:
        with urllib.request.urlopen(target, timeout=TIMEOUT_S) as resp:
            if resp.status == 200:
                return 0
            print(f"healthcheck: {target} answered {resp.status}", file=sys.stderr)
    except (urllib.error.URLError, OSError) as e:
        print(f"healthcheck: {target}: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
