"""Write docs/schemas/pricing-v1.json, the published JSON Schema of the pricing document, from the model the
service serves (`gasless.pricing.schemas.PricingDocument`). A test fails when the file is stale."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_FILE = ROOT / "docs" / "schemas" / "pricing-v1.json"


def pricing_schema() -> dict[str, object]:
    from gasless.pricing.schemas import PricingDocument

    schema = PricingDocument.model_json_schema(mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "pricing-v1.json",
        **schema,
    }


def render() -> str:
    return json.dumps(pricing_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA_FILE.write_text(render())
    print(f"wrote {SCHEMA_FILE.relative_to(ROOT)}", file=sys.stderr)
