"""The soak (soak.py) and its parts: traffic.py, abuse.py, watch.py; rapid_reset.py."""
