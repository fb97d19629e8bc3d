#!/usr/bin/env python3
"""Extracts the OpenAPI v3 schemas of KServe's ServingRuntime and
InferenceService from KServe's CRDs, for tests/validate_crd.py.

    deploy/kserve/crd-schemas/extract.py KSERVE_CHECKOUT TAG COMMIT

reads KSERVE_CHECKOUT/config/crd/full/serving.kserve.io_{servingruntimes,
inferenceservices}.yaml (KServe's own files at TAG, commit COMMIT) and writes
<kind>.json here: {"source": ..., "apiVersion": ..., "schema": ...}.

Subtrees the manifests in deploy/kserve/ do not use are pruned to their bare
type, marked "x-softmax-pruned": the InferenceService CRD is 2 MB of YAML,
nearly all of it one pod and container schema repeated for every framework and
component. A manifest that reaches a pruned subtree fails validation with a
message to extract again with that path kept (remove it from PRUNED).
"""

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent

# kind -> (CRD file, spec paths pruned to their type)
FRAMEWORKS = ["huggingface", "lightgbm", "onnx", "paddle", "pmml", "pytorch", "sklearn",
              "tensorflow", "triton", "xgboost"]
CRDS = {
    "ServingRuntime": ("serving.kserve.io_servingruntimes.yaml",
                       [["spec", "workerSpec"]]),
    "InferenceService": ("serving.kserve.io_inferenceservices.yaml",
                         [["spec", name] for name in ("canary", "explainer", "transformer")] +
                         [["spec", "predictor", name] for name in FRAMEWORKS + ["workerSpec"]] +
                         [["status"]]),
}


def prune(schema, path):
    node = schema
    for key in path[:-1]:
        node = node["properties"][key]
    pruned = node["properties"][path[-1]]
    node["properties"][path[-1]] = {
        "type": pruned.get("type", "object"),
        "x-softmax-pruned": ".".join(path),
    }


def extract(crds, source, crd_folder, checkout, tag, commit, target_folder=HERE):
    """Writes <kind>.json in target_folder for each kind -> (CRD file, pruned
    paths) of `crds`, the CRD read from checkout/crd_folder/ (the `source`
    repository at TAG, commit COMMIT). Shared with deploy/k8s/crd-schemas/."""
    for kind, (file_name, pruned_paths) in crds.items():
        crd = yaml.safe_load((Path(checkout) / crd_folder / file_name).read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
        schema = version["schema"]["openAPIV3Schema"]
        for path in pruned_paths:
            prune(schema, path)
        out = {
            "source": f"{source} {tag} ({commit}) {crd_folder}/{file_name}",
            "apiVersion": f"{crd['spec']['group']}/{version['name']}",
            "schema": schema,
        }
        target = Path(target_folder) / f"{kind}.json"
        target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(f"{target}: {target.stat().st_size} bytes")


def main(checkout, tag, commit):
    extract(CRDS, "kserve/kserve", "config/crd/full", checkout, tag, commit)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
