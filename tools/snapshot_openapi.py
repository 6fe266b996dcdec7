"""Refresh tests/http/openapi_snapshot.json from the document the app serves at /openapi.json.

Run it after a deliberate change of the API contract (an operation, its id, security or statuses, a
schema name, a security scheme), review the printed differences, and commit the file with the change.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from gasless.core.settings import Settings
from gasless.hosting.app import create_app
from gasless.http.openapi import contract_snapshot, snapshot_differences

SNAPSHOT = Path(__file__).resolve().parent.parent / "tests" / "http" / "openapi_snapshot.json"


def current_snapshot() -> dict[str, object]:
    with tempfile.TemporaryDirectory() as data_dir:
        # Building the document starts nothing: the lifespan (database, network) never runs here.
        app = create_app(Settings(profile="localnet", data_dir=Path(data_dir)))
        return contract_snapshot(app.openapi())


def render(snapshot: dict[str, object]) -> str:
    """JSON with one line per operation and per name, so a change is a one-line diff that merges cleanly."""
    lines = ["{"]
    keys = list(snapshot)
    for index, key in enumerate(keys):
        value = snapshot[key]
        comma = "," if index < len(keys) - 1 else ""
        if isinstance(value, dict):
            items = [f"    {json.dumps(name)}: {json.dumps(entry)}" for name, entry in value.items()]
            lines += [f"  {json.dumps(key)}: {{", ",\n".join(items), f"  }}{comma}"]
        elif isinstance(value, list):
            items = [f"    {json.dumps(name)}" for name in value]
            lines += [f"  {json.dumps(key)}: [", ",\n".join(items), f"  ]{comma}"]
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    return "\n".join(lines) + "\n}\n"


def main() -> int:
    snapshot = current_snapshot()
    previous = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}
    changes = snapshot_differences(previous, snapshot)
    text = render(snapshot)
    assert json.loads(text) == snapshot
    SNAPSHOT.write_text(text)
    if changes:
        print(f"{SNAPSHOT} updated:")
        for line in changes:
            print(f"  {line}")
    else:
        print(f"{SNAPSHOT} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
