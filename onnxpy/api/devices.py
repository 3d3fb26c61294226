"""onnxruntime's execution-provider device API: get_ep_devices, OrtEpDevice, OrtHardwareDevice and
the selection policy of SessionOptions.set_provider_selection_policy.

onnxpy lists one device per provider it can run here: the CPU always, and each CUDA device when
its CUDA provider is available. A session whose options name devices (add_provider_for_devices)
or a policy, and that is given no ``providers``, runs on the provider they select. Memory infos
and sync streams of a device are not supported (onnxpy has no native allocators).
"""

from __future__ import annotations

import enum
from typing import Any

from . import unsupported
from .enums import NamedIntEnum


class OrtHardwareDeviceType(NamedIntEnum):
    CPU = 0
    GPU = 1
    NPU = 2


class OrtExecutionProviderDevicePolicy(NamedIntEnum):
    DEFAULT = 0
    PREFER_CPU = 1
    PREFER_NPU = 2
    PREFER_GPU = 3
    MAX_PERFORMANCE = 4
    MAX_EFFICIENCY = 5
    MIN_OVERALL_POWER = 6


class OrtDeviceVendorId(enum.IntEnum):
    """PCI vendor ids, for OrtDevice.make's vendor_id (a plain IntEnum, as onnxruntime's)."""

    NONE = 0
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


# Policies that ask for the fastest device: the GPU when there is one. The others (power,
# efficiency, an NPU onnxpy does not have) fall back to the CPU, as onnxruntime's do without one.
_GPU_POLICIES = frozenset(
    {OrtExecutionProviderDevicePolicy.PREFER_GPU, OrtExecutionProviderDevicePolicy.MAX_PERFORMANCE}
)

#: PCI vendor ids, as onnxruntime reports them
_CPU_VENDORS = {"GenuineIntel": ("Intel", 0x8086), "AuthenticAMD": ("AMD", 0x1022)}  # AMD's CPUs: 0x1022
_NVIDIA = ("NVIDIA", int(OrtDeviceVendorId.NVIDIA))


class OrtHardwareDevice:
    """A piece of hardware: its type, vendor (name and PCI id), device id and metadata."""

    def __init__(self, type: OrtHardwareDeviceType, vendor: str, vendor_id: int, device_id: int) -> None:  # noqa: A002
        self._type, self._vendor, self._vendor_id, self._device_id = type, vendor, vendor_id, device_id

    @property
    def type(self) -> OrtHardwareDeviceType:
        return self._type

    @property
    def vendor(self) -> str:
        return self._vendor

    @property
    def vendor_id(self) -> int:
        return self._vendor_id

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def metadata(self) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return f"<OrtHardwareDevice {self._type.name} vendor={self._vendor!r} device_id={self._device_id}>"


class OrtEpDevice:
    """A device an execution provider can run on, with the provider options that select it."""

    def __init__(self, ep_name: str, device: OrtHardwareDevice, ep_options: dict[str, str]) -> None:
        self._ep_name, self._device, self._ep_options = ep_name, device, dict(ep_options)

    @property
    def ep_name(self) -> str:
        return self._ep_name

    @property
    def ep_vendor(self) -> str:
        return "onnxpy"  # who implements the provider here (onnxruntime says "Microsoft")

    @property
    def ep_metadata(self) -> dict[str, str]:
        from .. import __version__

        return {"version": __version__}

    @property
    def ep_options(self) -> dict[str, str]:
        return dict(self._ep_options)

    @property
    def device(self) -> OrtHardwareDevice:
        return self._device

    def memory_info(self, memory_type: Any) -> Any:
        unsupported.refuse("OrtEpDevice.memory_info", unsupported.ALLOCATOR)

    def create_sync_stream(self) -> Any:
        unsupported.refuse("OrtEpDevice.create_sync_stream", unsupported.ALLOCATOR)

    def __repr__(self) -> str:
        return f"<OrtEpDevice {self._ep_name} on {self._device!r}>"


def _cpu_vendor() -> tuple[str, int]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return _CPU_VENDORS.get(line.split(":", 1)[1].strip(), ("", 0))
    except OSError:  # not Linux: the vendor is unknown, as the device still is usable
        pass
    return "", 0


def _cuda_count() -> int:
    from ..providers import cuda_available

    if not cuda_available():
        return 0
    import cupy  # noqa: PLC0415 - optional dependency, present when CUDA is available

    return int(cupy.cuda.runtime.getDeviceCount())


def get_ep_devices() -> list[OrtEpDevice]:
    """The devices onnxpy's providers can run on here: each CUDA device (when the CUDA provider
    is available), then the CPU."""
    devices = [
        OrtEpDevice(
            "CUDAExecutionProvider", OrtHardwareDevice(OrtHardwareDeviceType.GPU, *_NVIDIA, 0), {"device_id": str(i)}
        )
        for i in range(_cuda_count())
    ]
    cpu = OrtHardwareDevice(OrtHardwareDeviceType.CPU, *_cpu_vendor(), 0)
    devices.append(OrtEpDevice("CPUExecutionProvider", cpu, {}))
    return devices


def providers_for_devices(devices: list[OrtEpDevice], options: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The (provider, options) that runs on ``devices`` (all of one provider; the first one's
    device is used: an onnxpy session runs on one device)."""
    return devices[0].ep_name, {**devices[0].ep_options, **options}


def providers_for_policy(policy: OrtExecutionProviderDevicePolicy) -> list[str]:
    if policy in _GPU_POLICIES and _cuda_count():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]
