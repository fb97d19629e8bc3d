#!/usr/bin/env python3
"""Validates custom resources against their CRDs' OpenAPI v3 schemas, as
strictly as the API server with field validation "Strict" (kubectl's
default): unknown fields are errors, as are wrong types, missing required
fields and values outside an enum or pattern. (CEL rules, x-kubernetes-
validations, are not evaluated.)

    validate_crd.py SCHEMA_DIR MANIFEST...

SCHEMA_DIR holds <Kind>.json files written by deploy/kserve/crd-schemas/
extract.py. Prints one line per resource, "<Kind>/<name>: passed" or its
errors, and exits 1 when any resource fails or has no schema. Runs with the
deploy venv's Python (jsonschema comes with checkov there).
"""

import json
import sys
from pathlib import Path

import jsonschema
import yaml


def strict(schema):
    """A copy of `schema` in which every object that lists its properties
    rejects others, unless the CRD keeps unknown fields there."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    result = {k: strict(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema and
            not schema.get("x-kubernetes-preserve-unknown-fields")):
        result["additionalProperties"] = False
    return result


def pruned_paths_reached(schema, instance, path=""):
    """The pruned subtrees (see extract.py) that `instance` sets."""
    if "x-softmax-pruned" in schema:
        return [schema["x-softmax-pruned"]]
    found = []
    if isinstance(instance, dict):
        for key, value in instance.items():
            child = schema.get("properties", {}).get(key)
            if child is not None:
                found += pruned_paths_reached(child, value, f"{path}.{key}")
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for value in instance:
            found += pruned_paths_reached(schema["items"], value, path)
    return found


def is_built_in(api_version):
    """Kubernetes' own groups: "v1" (core), "apps/v1", "*.k8s.io/...", ..."""
    group = api_version.rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def metadata_errors(metadata):
    """What the CRD leaves to the API server: a name and string labels."""
    errors = []
    if not isinstance(metadata, dict) or not metadata.get("name"):
        return ["metadata.name: required"]
    for field in ("labels", "annotations"):
        for key, value in (metadata.get(field) or {}).items():
            if not isinstance(value, str):
                errors.append(f"metadata.{field}.{key}: must be a string, got {value!r}")
    return errors


def validate(schemas, resource):
    kind = resource.get("kind")
    name = (resource.get("metadata") or {}).get("name", "?")
    if kind not in schemas:
        return f"{kind}/{name}", [f"no schema for kind {kind} in {sorted(schemas)}"]
    entry = schemas[kind]
    errors = metadata_errors(resource.get("metadata"))
    if resource.get("apiVersion") != entry["apiVersion"]:
        errors.append(f"apiVersion: expected {entry['apiVersion']}, got "
                      f"{resource.get('apiVersion')}")
    schema = strict(entry["schema"])
    # Every object has these, whether or not its CRD lists them (Istio's do
    # not); metadata is checked above.
    for field, kind_of in (("apiVersion", "string"), ("kind", "string"), ("metadata", "object")):
        schema.setdefault("properties", {}).setdefault(field, {"type": kind_of})
    validator = jsonschema.Draft7Validator(schema)
    for error in sorted(validator.iter_errors(resource), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in error.absolute_path) or "(root)"
        errors.append(f"{where}: {error.message}")
    for path in pruned_paths_reached(entry["schema"], resource):
        errors.append(f"{path}: pruned from the vendored schema; run "
                      "deploy/kserve/crd-schemas/extract.py again with it kept")
    return f"{kind}/{name}", errors


def main(schema_dir, *manifests):
    schemas = {p.stem: json.loads(p.read_text()) for p in Path(schema_dir).glob("*.json")}
    failed = False
    for manifest in manifests:
        for resource in yaml.safe_load_all(Path(manifest).read_text()):
            if not resource:
                continue
            # A kind with a schema here is a custom resource, also in a
            # k8s.io group (the Gateway API's gateway.networking.k8s.io).
            if is_built_in(resource.get("apiVersion", "")) and resource.get("kind") not in schemas:
                print(f"{resource.get('kind')}/{resource['metadata']['name']}: skipped "
                      "(a built-in kind: kubernetes-validate checks it)")
                continue
            label, errors = validate(schemas, resource)
            if errors:
                failed = True
                print(f"{label}: FAILED")
                for error in errors:
                    print(f"  {error}")
            else:
                print(f"{label}: passed")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
