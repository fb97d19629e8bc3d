#!/usr/bin/env python3
"""Extracts the OpenAPI v3 schema of KEDA's ScaledObject from KEDA's CRD, for
tests/validate_crd.py (the same format as deploy/kserve/crd-schemas/).

    deploy/k8s/crd-schemas/extract.py KEDA_CHECKOUT TAG COMMIT

reads KEDA_CHECKOUT/config/crd/bases/keda.sh_scaledobjects.yaml (KEDA's own
file at TAG, commit COMMIT) and writes ScaledObject.json here:
{"source": ..., "apiVersion": ..., "schema": ...}. Only `status`, which a
manifest never sets, is pruned (marked "x-softmax-pruned").
"""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CRDS = {"ScaledObject": ("keda.sh_scaledobjects.yaml", [["status"]])}

# KServe's extractor does the work: the same reading, pruning and format.
_spec = importlib.util.spec_from_file_location(
    "kserve_crd_extract", HERE.parent.parent / "kserve" / "crd-schemas" / "extract.py")
kserve_extract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kserve_extract)


def main(checkout, tag, commit):
    kserve_extract.extract(CRDS, "kedacore/keda", "config/crd/bases", checkout, tag, commit,
                           HERE)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
