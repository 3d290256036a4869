"""The device jobs besides recipe and ablate (bench/device.py registers them from here)."""
