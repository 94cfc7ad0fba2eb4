"""An OpenFeature program in Python reading Levee flags through openfeature-provider-ofrep.

Used by server/tests/e2e/ofrep.rs: argv[1] is the provider's base URL, OFREP_TOKEN
(optional) a flags token. Each line on stdin is `KEY DEFAULT` (a bool flag and the
caller's default); each answer is one JSON line {value, reason, errorCode}. Runs in the
venv .ci/run makes under target/ofrep-venv.
"""

import json
import os
import sys

from openfeature import api
from openfeature.contrib.provider.ofrep import OFREPProvider


def main() -> None:
    token = os.environ.get("OFREP_TOKEN")
    headers = (lambda: {"Authorization": f"Bearer {token}"}) if token else None
    api.set_provider(OFREPProvider(sys.argv[1], headers_factory=headers))
    client = api.get_client()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        key, fallback = line.split()
        d = client.get_boolean_details(key, fallback == "true")
        code = getattr(d.error_code, "value", d.error_code)
        reason = getattr(d.reason, "value", d.reason)
        print(json.dumps({"value": d.value, "reason": reason, "errorCode": code}), flush=True)


if __name__ == "__main__":
    main()
