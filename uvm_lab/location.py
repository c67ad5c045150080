"""Where memory can live: the host, or a GPU by id (CUDA 13's ``cudaMemLocation``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from numbers import Integral

from .errors import InvalidLocationError

__all__ = ["HOST_ID", "Location"]

#: The host's processor id, as CUDA's ``cudaCpuDeviceId``.
HOST_ID = -1

_DEVICE_RE = re.compile(r"^(?:gpu|cuda|device)(?::(\d+))?$")


@dataclass(frozen=True, order=True)
class Location:
    """A processor that memory can be resident on: ``id`` is a device ordinal, or ``HOST_ID`` for the host."""

    id: int

    @classmethod
    def host(cls) -> Location:
        return cls(HOST_ID)

    @classmethod
    def device(cls, ordinal: int = 0) -> Location:
        return cls(ordinal)

    @property
    def is_host(self) -> bool:
        return self.id == HOST_ID

    def __str__(self) -> str:
        return "host" if self.is_host else f"gpu:{self.id}"

    @classmethod
    def parse(cls, value: object, *, device_count: int, current_device: int = 0, name: str = "location") -> Location:
        """Turn what a user writes into a Location, or raise :class:`InvalidLocationError`.

        Accepts ``"host"``/``"cpu"``, ``"gpu"``/``"cuda"``/``"device"`` (the current device),
        ``"gpu:1"``, a device ordinal, ``-1`` (``cudaCpuDeviceId``) or a ``Location``.
        """
        valid = f'"host", "gpu", "gpu:N" or a device ordinal 0..{device_count - 1}'
        if isinstance(value, Location):
            loc = value
        elif isinstance(value, str):
            text = value.strip().lower()
            match = _DEVICE_RE.match(text)
            if text in ("host", "cpu"):
                loc = cls.host()
            elif match:
                loc = cls(int(match.group(1)) if match.group(1) is not None else current_device)
            else:
                raise InvalidLocationError(f"{name} must be {valid}, got {value!r}", value=value, expected=valid)
        elif isinstance(value, Integral) and not isinstance(value, bool):
            loc = cls(int(value))
        else:
            raise InvalidLocationError(f"{name} must be {valid}, got {value!r} ({type(value).__name__})",
                                       value=value, expected=valid)
        if not loc.is_host and not 0 <= loc.id < device_count:
            raise InvalidLocationError(
                f"{name} {value!r} names device {loc.id}, but this backend has {device_count} device(s); "
                f"valid: {valid}", value=value, expected=valid)
        return loc
