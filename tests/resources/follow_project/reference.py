"""A reference helper a case runs as a process: reads its data file and prints it."""

from pathlib import Path

SCALE = 1.0
value = float((Path(__file__).parent / "data" / "reference.txt").read_text()) * SCALE
print(value)
