#!/usr/bin/env python3
"""Extracts the OpenAPI v3 schemas of the custom resources deploy/k8s/ uses
from their projects' CRDs, for tests/validate_crd.py (the same format as
deploy/kserve/crd-schemas/):

    deploy/k8s/crd-schemas/extract.py SOURCE CHECKOUT TAG COMMIT

SOURCE is one of
  keda                 KEDA's ScaledObject, from CHECKOUT/config/crd/bases/
  prometheus-operator  the Prometheus Operator's PodMonitor, ServiceMonitor and
                       PrometheusRule, from CHECKOUT/example/prometheus-operator-crd/
read at TAG (commit COMMIT); writes <kind>.json here: {"source": ...,
"apiVersion": ..., "schema": ...}. Only `status`, which a manifest never sets,
is pruned (marked "x-softmax-pruned").

The schemas here: KEDA v2.20.2, Prometheus Operator v0.93.0
(f8fafd475f3d132e239432ae6172de60a6cb6516).
"""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# source -> (repository, CRD folder, {kind: (CRD file, pruned paths)})
SOURCES = {
    "keda": ("kedacore/keda", "config/crd/bases",
             {"ScaledObject": ("keda.sh_scaledobjects.yaml", [["status"]])}),
    "prometheus-operator": (
        "prometheus-operator/prometheus-operator", "example/prometheus-operator-crd",
        {kind: (f"monitoring.coreos.com_{kind.lower()}s.yaml", [["status"]])
         for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule")}),
}

# KServe's extractor does the work: the same reading, pruning and format.
_spec = importlib.util.spec_from_file_location(
    "kserve_crd_extract", HERE.parent.parent / "kserve" / "crd-schemas" / "extract.py")
kserve_extract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kserve_extract)


def main(source, checkout, tag, commit):
    repository, crd_folder, crds = SOURCES[source]
    kserve_extract.extract(crds, repository, crd_folder, checkout, tag, commit, HERE)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in SOURCES:
        sys.exit(__doc__)
    main(*sys.argv[1:])
