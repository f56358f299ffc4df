"""Neural-network layers (filled in by nn/module.py and friends)."""
