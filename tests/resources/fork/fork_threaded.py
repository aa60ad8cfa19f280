"""A target that starts a thread when imported: forking after it is unsafe."""

from __future__ import annotations

import threading
import time

threading.Thread(target=time.sleep, args=(600,), daemon=True).start()


def main(argv: list[str]) -> int:
    return 0
