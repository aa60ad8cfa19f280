"""The stand-in's accelerator: none (DeepSpeed's cpu accelerator, in shape)."""


class _NoAccelerator:
    def is_available(self):
        return False

    def device_count(self):
        return 0


def get_accelerator():
    return _NoAccelerator()
