#!/usr/bin/env python3
"""Extracts the OpenAPI v3 schemas of the custom resources deploy/k8s/ uses
from their projects' CRDs, for tests/validate_crd.py (the same format as
deploy/kserve/crd-schemas/):

    deploy/k8s/crd-schemas/extract.py SOURCE CHECKOUT TAG COMMIT

SOURCE is one of
  keda                 KEDA's ScaledObject, from CHECKOUT/config/crd/bases/
  prometheus-operator  the Prometheus Operator's PodMonitor, ServiceMonitor and
                       PrometheusRule, from CHECKOUT/example/prometheus-operator-crd/
  gateway-api          the Gateway API's Gateway, GRPCRoute and HTTPRoute (standard
                       channel), from CHECKOUT/config/crd/standard/
  istio                Istio's DestinationRule and VirtualService, from
                       CHECKOUT/manifests/charts/base/files/crd-all.gen.yaml (every
                       Istio CRD in one file: each kind's document is read alone)
read at TAG (commit COMMIT); writes <kind>.json here: {"source": ...,
"apiVersion": ..., "schema": ...}. Only `status`, which a manifest never sets,
is pruned (marked "x-softmax-pruned").

The schemas here: KEDA v2.20.2, Prometheus Operator v0.93.0
(f8fafd475f3d132e239432ae6172de60a6cb6516), Gateway API v1.6.1
(8bb74df00e56ec8f944d48c25e6c1c9c2f6848e3), Istio 1.30.3
(56df41f63e513f834c9a3af33d8aed82d1d961f2).
"""

import importlib.util
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
# source -> (repository, CRD folder, {kind: (CRD file, pruned paths)})
SOURCES = {
    "keda": ("kedacore/keda", "config/crd/bases",
             {"ScaledObject": ("keda.sh_scaledobjects.yaml", [["status"]])}),
    "prometheus-operator": (
        "prometheus-operator/prometheus-operator", "example/prometheus-operator-crd",
        {kind: (f"monitoring.coreos.com_{kind.lower()}s.yaml", [["status"]])
         for kind in ("PodMonitor", "ServiceMonitor", "PrometheusRule")}),
    "gateway-api": (
        "kubernetes-sigs/gateway-api", "config/crd/standard",
        {kind: (f"gateway.networking.k8s.io_{plural}.yaml", [["status"]])
         for kind, plural in (("Gateway", "gateways"), ("GRPCRoute", "grpcroutes"),
                              ("HTTPRoute", "httproutes"))}),
    "istio": ("istio/istio", "manifests/charts/base/files",
              {kind: ("crd-all.gen.yaml", [["status"]])
               for kind in ("DestinationRule", "VirtualService")}),
}

# KServe's extractor does the work: the same reading, pruning and format.
_spec = importlib.util.spec_from_file_location(
    "kserve_crd_extract", HERE.parent.parent / "kserve" / "crd-schemas" / "extract.py")
kserve_extract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kserve_extract)


def main(source, checkout, tag, commit):
    repository, crd_folder, crds = SOURCES[source]
    for kind, entry in crds.items():
        with tempfile.TemporaryDirectory() as alone:
            kserve_extract.extract({kind: entry}, repository, crd_folder,
                                   crd_alone(checkout, crd_folder, entry[0], kind, alone),
                                   tag, commit, HERE)


def crd_alone(checkout, crd_folder, file_name, kind, folder):
    """A checkout in `folder` whose crd_folder/file_name holds only the CRD
    of `kind` (a file of several CRDs, as Istio's, read one kind at a time)."""
    documents = [d for d in yaml.safe_load_all((Path(checkout) / crd_folder / file_name)
                                               .read_text()) if d]
    (crd,) = [d for d in documents if d["spec"]["names"]["kind"] == kind]
    target = Path(folder) / crd_folder / file_name
    target.parent.mkdir(parents=True)
    target.write_text(yaml.safe_dump(crd))
    return folder


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in SOURCES:
        sys.exit(__doc__)
    main(*sys.argv[1:])
