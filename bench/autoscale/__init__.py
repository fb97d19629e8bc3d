"""The autoscaling signal ramp (signal_ramp.py)."""
