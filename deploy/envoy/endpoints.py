#!/usr/bin/env python3
"""Writes the endpoint files that deploy/envoy/envoy.yaml reads: the replicas
of a softmax-serve fleet, for its gRPC cluster (softmax_grpc) and its HTTP
cluster (softmax_http).

  endpoints.py DIR HOST[:GRPC_PORT[:HTTP_PORT]] ...

DIR is the folder envoy.yaml watches (/etc/envoy/endpoints); each file is
written beside it and renamed into it, the one change Envoy's file watch
sees, so replicas come and go without a restart. No host at all empties
both clusters. Ports default to the server's own (50051 gRPC, 8000 HTTP).
"""

import argparse
import json
import os
import sys
import tempfile
import time

GRPC_CLUSTER = "softmax_grpc"
HTTP_CLUSTER = "softmax_http"
DEFAULT_GRPC_PORT = 50051
DEFAULT_HTTP_PORT = 8000


def parse_replica(text):
    """"host[:grpc_port[:http_port]]" -> (host, grpc_port, http_port)."""
    parts = text.split(":")
    if not parts[0] or len(parts) > 3:
        raise ValueError(f"replica {text!r}: expected HOST[:GRPC_PORT[:HTTP_PORT]]")
    grpc_port = int(parts[1]) if len(parts) > 1 else DEFAULT_GRPC_PORT
    http_port = int(parts[2]) if len(parts) > 2 else DEFAULT_HTTP_PORT
    return parts[0], grpc_port, http_port


def _assignment(cluster, endpoints, version):
    return {
        "version_info": str(version),
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": cluster,
            "endpoints": [{"lb_endpoints": endpoints}],
        }],
    }


def _endpoint(host, port):
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}


def _replace(path, document):
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".endpoints-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, indent=1)
        os.rename(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write(directory, replicas, version=None):
    """Writes DIR/grpc.json and DIR/http.json for `replicas`, a list of
    (host, grpc_port, http_port), by atomic rename."""
    if version is None:
        version = time.time_ns()
    grpc = [_endpoint(host, grpc_port) for host, grpc_port, _ in replicas]
    http = [_endpoint(host, http_port) for host, _, http_port in replicas]
    _replace(os.path.join(directory, "grpc.json"), _assignment(GRPC_CLUSTER, grpc, version))
    _replace(os.path.join(directory, "http.json"), _assignment(HTTP_CLUSTER, http, version))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the folder envoy.yaml watches")
    parser.add_argument("replicas", nargs="*", help="HOST[:GRPC_PORT[:HTTP_PORT]]")
    args = parser.parse_args(argv)
    try:
        replicas = [parse_replica(r) for r in args.replicas]
    except ValueError as error:
        parser.error(str(error))
    write(args.directory, replicas)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
