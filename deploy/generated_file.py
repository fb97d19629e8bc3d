"""The command line of every script that writes a generated file in deploy/
(deploy/envoy/make_tls_config.py, deploy/k8s/make_envoy_config.py,
deploy/k8s/make_prometheus_rule.py): no argument writes the file, --check
exits 1 when the committed file differs from what the script would write."""

import sys


def run(argv, target, render, usage):
    """Writes render()'s text to `target`, or with argv == ["--check"]
    compares them; exits with `usage` on any other argument. Returns the
    exit status."""
    text = render()
    if argv == ["--check"]:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is out of date: run {sys.argv[0]}")
            return 1
        return 0
    if argv:
        sys.exit(usage)
    target.write_text(text)
    print(f"wrote {target}")
    return 0
