"""Write docs/openapi.json: the OpenAPI 3.1 document a mainnet host serves at `GET /openapi.json`.

The document is the API's contract and is generated from the code (`gasless.http.openapi`); this committed
copy lets a reader, a client generator or a review see it without running a host. Run this after any change
to a route, a schema, an operation's statuses or codes, or a security scheme, and commit the file with the
change; `tests/http/test_openapi_document.py` fails while the copy differs from what the app serves.

    .venv/bin/python tools/openapi_document.py            # rewrite docs/openapi.json
    .venv/bin/python tools/openapi_document.py --check    # exit 1 when docs/openapi.json is stale

Hosts of every network serve the same document but for one value: the wire transactions' `chainID` is a
`const` of the host's chain (`1` on mainnet, `D` on devnet, `localnet` on localnet). The copy is mainnet's.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "docs" / "openapi.json"
REGENERATE = ".venv/bin/python tools/openapi_document.py"
PROFILE = "mainnet"


def served_document() -> dict[str, Any]:
    """What `GET /openapi.json` answers on a mainnet host. Only the app is built: its lifespan (database,
    network, workers) never runs, so nothing is started and no setting but the profile matters."""
    from fastapi.testclient import TestClient

    from gasless.core.settings import Settings
    from gasless.hosting.app import create_app

    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            profile=PROFILE,
            data_dir=Path(data_dir),
            # Off localnet a host needs a master secret to be built at all; the document does not use it.
            master_secret="openapi-document-" + "0" * 32,
            access_log=False,
        )
        app = create_app(settings)
        # Quiet the test client's own request line, then leave the loggers as they were (a test imports this).
        loggers = [logging.getLogger(name) for name in ("httpx", "httpx2")]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        try:
            answer = TestClient(app).get("/openapi.json")
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)
    answer.raise_for_status()
    document: dict[str, Any] = answer.json()
    return document


def render(document: dict[str, Any]) -> str:
    """The file's text: the served members in the served order, two spaces of indent (a change of the
    contract is a readable diff), UTF-8 as is, one final newline."""
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when the committed copy is stale"
    )
    args = parser.parse_args(argv)
    text = render(served_document())
    current = DOCUMENT.read_text(encoding="utf-8") if DOCUMENT.exists() else ""
    if args.check:
        if current == text:
            print(f"{DOCUMENT.relative_to(ROOT)} is what the app serves")
            return 0
        print(f"{DOCUMENT.relative_to(ROOT)} differs from what the app serves; run: {REGENERATE}")
        return 1
    if current == text:
        print(f"{DOCUMENT.relative_to(ROOT)} already up to date")
        return 0
    DOCUMENT.write_text(text, encoding="utf-8")
    print(f"{DOCUMENT.relative_to(ROOT)} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
