#!/usr/bin/env python3
"""Extracts the OpenAPI v3 schema of KEDA's ScaledObject from KEDA's CRD, for
tests/validate_crd.py (the same format as deploy/kserve/crd-schemas/).

    deploy/k8s/crd-schemas/extract.py KEDA_CHECKOUT TAG COMMIT

reads KEDA_CHECKOUT/config/crd/bases/keda.sh_scaledobjects.yaml (KEDA's own
file at TAG, commit COMMIT) and writes ScaledObject.json here:
{"source": ..., "apiVersion": ..., "schema": ...}. Only `status`, which a
manifest never sets, is pruned (marked "x-softmax-pruned").
"""

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CRDS = {"ScaledObject": ("keda.sh_scaledobjects.yaml", [["status"]])}


def prune(schema, path):
    node = schema
    for key in path[:-1]:
        node = node["properties"][key]
    pruned = node["properties"][path[-1]]
    node["properties"][path[-1]] = {
        "type": pruned.get("type", "object"),
        "x-softmax-pruned": ".".join(path),
    }


def main(checkout, tag, commit):
    for kind, (file_name, pruned_paths) in CRDS.items():
        crd = yaml.safe_load((Path(checkout) / "config" / "crd" / "bases" / file_name).read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
        schema = version["schema"]["openAPIV3Schema"]
        for path in pruned_paths:
            prune(schema, path)
        out = {
            "source": f"kedacore/keda {tag} ({commit}) config/crd/bases/{file_name}",
            "apiVersion": f"{crd['spec']['group']}/{version['name']}",
            "schema": schema,
        }
        target = HERE / f"{kind}.json"
        target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(f"{target}: {target.stat().st_size} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
